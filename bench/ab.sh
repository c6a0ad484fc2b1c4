#!/usr/bin/env bash
# bench/ab.sh — an alternating comparison of tpinfer builds (or knob settings) on one
# machine, run from the repo root:
#     bash bench/ab.sh base=/tmp/base cand=build/tpinfer 'c0=build/tpinfer@TPI_X=0'
# Each argument is NAME=BINARY, optionally followed by @VAR=VALUE settings for that
# build's processes. The first build is the reference:
#   1. greedy tokens: `tpinfer run` after a prompt of each GREEDY_LENS token count, every
#      build's bytes compared with the first's (a kernel change must not move a token);
#   2. ROUNDS rounds over DEPTHS: `tpinfer bench -p 0 -n N -d D -r REPS`, one process a
#      line, the builds in turn, so drift of the machine lands on all of them alike;
#   3. per depth and build the mean t/s, and its difference from the first build's.
# Settings (environment, defaults in brackets):
#   MODEL    the GGUF file [made once by the first build: mkmodel --preset PRESET --type
#            TYPE into MODEL_DIR]          PRESET [qwen3-8b]  TYPE [q4_k_m]  MODEL_DIR [/tmp]
#   DEPTHS   ["8192 1024 4096 0"]  ROUNDS [2]  N [128]  REPS [2]  ROOFLINE GB/s [4000]
#   GREEDY_LENS ["8200 1100"] (0 or "" skips step 1)  GREEDY_N [48]  BACKEND [cuda]
#   OUT      where ab.txt goes [. ; the lines are printed too]
# Exit status: 1 when a build's greedy bytes differ from the first's or a bench line
# fails, else 0. bench/NOTES.md records how the project reads such tables: a change is
# kept when it is no slower at any depth across the pairs, not on one line.
set -u
set -o pipefail

usage() {
    sed -n '2,20p' "$0" >&2
    exit 2
}
[ $# -ge 1 ] || usage

declare -a NAMES BINS ENVS
for spec in "$@"; do
    case "$spec" in
    *=*) ;;
    *) echo "ab.sh: '$spec': want NAME=BINARY[@VAR=VALUE...]" >&2; exit 2 ;;
    esac
    name=${spec%%=*}
    rest=${spec#*=}
    bin=${rest%%@*}
    envs=""
    [ "$bin" != "$rest" ] && envs=$(printf '%s' "${rest#*@}" | tr '@' ' ')
    [ -x "$bin" ] || { echo "ab.sh: $name: '$bin' is not an executable file" >&2; exit 2; }
    NAMES+=("$name")
    BINS+=("$bin")
    ENVS+=("$envs")
done

DEPTHS=${DEPTHS:-"8192 1024 4096 0"}
ROUNDS=${ROUNDS:-2}
N=${N:-128}
REPS=${REPS:-2}
ROOFLINE=${ROOFLINE:-4000}
GREEDY_LENS=${GREEDY_LENS-"8200 1100"}
GREEDY_N=${GREEDY_N:-48}
BACKEND=${BACKEND:-cuda}
OUT=${OUT:-.}
mkdir -p "$OUT"
LOG="$OUT/ab.txt"
: >"$LOG"
say() { echo "$*" | tee -a "$LOG"; }
status=0

# run_build I ARGS...: build I's binary with its settings
run_build() {
    local i=$1
    shift
    # shellcheck disable=SC2086  # the settings are words VAR=VALUE
    env ${ENVS[$i]} "${BINS[$i]}" "$@"
}

if [ -z "${MODEL:-}" ]; then
    MODEL="${MODEL_DIR:-/tmp}/ab-${PRESET:-qwen3-8b}-${TYPE:-q4_k_m}.gguf"
    if [ ! -s "$MODEL" ]; then
        say "making $MODEL"
        run_build 0 mkmodel --preset "${PRESET:-qwen3-8b}" --type "${TYPE:-q4_k_m}" \
            -o "$MODEL" -q || { echo "ab.sh: mkmodel failed" >&2; exit 1; }
    fi
fi
say "model $MODEL; builds: ${NAMES[*]}; depths $DEPTHS x $ROUNDS rounds; tg$N, -r $REPS"

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
for len in $GREEDY_LENS; do
    [ "$len" -gt 0 ] || continue
    ids=$(seq -s, 1000 $((1000 + len - 1)))
    for i in "${!NAMES[@]}"; do
        run_build "$i" run -m "$MODEL" --prompt-ids "$ids" -c $((len + GREEDY_N + 64)) \
            -n "$GREEDY_N" --temp 0 --backend "$BACKEND" >"$TMP/g$len.$i" 2>"$TMP/g$len.$i.err" ||
            { say "greedy $len ${NAMES[$i]}: run failed: $(tail -1 "$TMP/g$len.$i.err")"; status=1; }
        if [ "$i" -gt 0 ]; then
            if cmp -s "$TMP/g$len.0" "$TMP/g$len.$i"; then
                say "greedy $len ${NAMES[$i]}: the same bytes as ${NAMES[0]} ($(wc -c <"$TMP/g$len.0"))"
            else
                say "greedy $len ${NAMES[$i]}: DIFFERENT from ${NAMES[0]}"
                status=1
            fi
        fi
    done
done

for ((r = 1; r <= ROUNDS; r++)); do
    for d in $DEPTHS; do
        for i in "${!NAMES[@]}"; do
            line=$(run_build "$i" bench -m "$MODEL" -p 0 -n "$N" -d "$d" -r "$REPS" -o md \
                --roofline-gbps "$ROOFLINE" --backend "$BACKEND" 2>"$TMP/b.err" | grep "tg$N")
            if [ -z "$line" ]; then
                say "d$d ${NAMES[$i]} failed: $(tail -1 "$TMP/b.err")"
                status=1
                continue
            fi
            # the last columns: ... | test | t/s | GB/s | % roof | (counted from the end:
            # the markdown's optional columns, threads on the CPU, come before them)
            tps=$(echo "$line" | awk -F'|' '{print $(NF-3)}' | xargs)
            roof=$(echo "$line" | awk -F'|' '{print $(NF-1)}' | xargs)
            say "d$d ${NAMES[$i]} $tps | $roof"
            echo "$d $i ${tps%% *}" >>"$TMP/all"
        done
    done
done

[ -s "$TMP/all" ] && {
    say "means (t/s, and against ${NAMES[0]}):"
    awk -v names="${NAMES[*]}" '
        BEGIN { nb = split(names, nm, " ") }
        { s[$1 " " $2] += $3; c[$1 " " $2]++; if (!($1 in seen)) { seen[$1] = 1; ord[++nd] = $1 } }
        END {
            for (k = 1; k <= nd; k++) {
                d = ord[k]; line = "d" d ":"
                b = c[d " 0"] ? s[d " 0"] / c[d " 0"] : 0
                for (i = 0; i < nb; i++) {
                    key = d " " i
                    if (!c[key]) continue
                    m = s[key] / c[key]
                    line = line sprintf("  %s %.2f", nm[i + 1], m)
                    if (i > 0 && b > 0) line = line sprintf(" (%+.1f %%)", 100 * (m / b - 1))
                }
                print line
            }
        }' "$TMP/all" | tee -a "$LOG"
}
exit $status
