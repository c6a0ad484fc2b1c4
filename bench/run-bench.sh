#!/usr/bin/env bash
# bench/run-bench.sh — the standard benchmark set, run from the repo root:
#   1. build build/tpinfer if it is missing (or use $TPINFER),
#   2. write the synthetic models with `tpinfer mkmodel --preset PRESET --type T`
#      into $MODELS_DIR (skipped when a file is already there),
#   3. `tpinfer bench -m ALL -p 512 -n 128 -r REPS -o md` (pp512, tg128), then the
#      same at depth: `-d 8192` (pp512 @ d8192, tg128 @ d8192),
#   4. write each table, its stderr, and a header (commit, command, device, date)
#      to $OUT (default bench/out/<date>), and print the tables.
# GPU by default when nvidia-smi sees one; CPU otherwise (tiny preset, shallow depth).
# Every setting is an environment variable (defaults in brackets):
#   TPINFER   binary [build/tpinfer]          PRESET  mkmodel preset [qwen3-8b | cpu: tiny]
#   TYPES     file types ["bf16 q8_0 q4_k_m"] MODELS  explicit model files (skips mkmodel)
#   MODELS_DIR where models go [bench/models] REPS    repetitions [5]
#   P, N      prompt / generated tokens [512, 128]
#   DEPTH     depth of the second run [8192 | cpu: 1024]; 0 skips it
#   TP, PP    tensor / pipeline parallel [1, 1]: >1 runs under launch/tpinfer-local
#   BACKEND   cpu | cuda | auto [auto]        COMM    mpi | nccl [tpinfer's default]
#   THREADS   CPU threads per rank [tpinfer's default: all cores]
#   FORMAT    md | csv | json | jsonl [md]    ROOFLINE per-GPU GB/s [4000 on GPU: H200]
#   EXTRA     more `tpinfer bench` options, e.g. "--pp-layers 18,18"
# Example: TYPES="q4_k_m" REPS=3 TP=2 bench/run-bench.sh
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
cd "$root"

gpu=""
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
fi
if [ -n "$gpu" ]; then
    PRESET=${PRESET:-qwen3-8b}
    DEPTH=${DEPTH:-8192}
    ROOFLINE=${ROOFLINE:-4000}
    device="$gpu x $(nvidia-smi -L | wc -l)"
else
    PRESET=${PRESET:-tiny}
    DEPTH=${DEPTH:-1024}
    ROOFLINE=${ROOFLINE:-}
    device="CPU, $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'))"
fi
TPINFER=${TPINFER:-build/tpinfer}
TYPES=${TYPES:-bf16 q8_0 q4_k_m}
MODELS_DIR=${MODELS_DIR:-bench/models}
REPS=${REPS:-5}
P=${P:-512}
N=${N:-128}
TP=${TP:-1}
PP=${PP:-1}
BACKEND=${BACKEND:-auto}
COMM=${COMM:-}
THREADS=${THREADS:-}
FORMAT=${FORMAT:-md}
EXTRA=${EXTRA:-}
OUT=${OUT:-bench/out/$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$OUT" "$MODELS_DIR"

log() { echo "run-bench: $*" >&2; }

# 1. the binary
if [ ! -x "$TPINFER" ]; then
    log "building $TPINFER"
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >"$OUT/build.log" 2>&1
    cmake --build build --target tpinfer >>"$OUT/build.log" 2>&1
    TPINFER=build/tpinfer
fi

TPINFER=$(cd "$(dirname "$TPINFER")" && pwd)/$(basename "$TPINFER") # launch/ needs it absolute

# 2. the models
models=()
if [ -n "${MODELS:-}" ]; then
    read -r -a models <<<"$MODELS"
else
    for t in $TYPES; do
        m="$MODELS_DIR/$PRESET-$t.gguf"
        if [ ! -f "$m" ]; then
            log "writing $m (tpinfer mkmodel --preset $PRESET --type $t)"
            "$TPINFER" mkmodel --preset "$PRESET" --type "$t" -o "$m" -q 2>>"$OUT/mkmodel.log"
        fi
        models+=("$m")
    done
fi
list=$(IFS=,; echo "${models[*]}")

# 3. the runs
common=(-m "$list" -p "$P" -n "$N" -r "$REPS" -o "$FORMAT" --backend "$BACKEND")
[ -n "$COMM" ] && common+=(--comm "$COMM")
[ -n "$THREADS" ] && common+=(-t "$THREADS")
[ -n "$ROOFLINE" ] && common+=(--roofline-gbps "$ROOFLINE")
# shellcheck disable=SC2206
[ -n "$EXTRA" ] && common+=($EXTRA)
launcher=("$TPINFER")
if [ $((TP * PP)) -gt 1 ]; then
    launcher=(env TPINFER="$TPINFER" "$root/launch/tpinfer-local" --tp "$TP" --pp "$PP" --)
    [ -z "$gpu" ] && launcher=(env TPINFER="$TPINFER" "$root/launch/tpinfer-local" --oversubscribe
                               --tp "$TP" --pp "$PP" --)
else
    common+=(--tp 1 --pp 1)
fi
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain --untracked-files=no 2>/dev/null | head -1)
[ -n "$dirty" ] && commit="$commit (+ uncommitted changes)"

status=0
run() { # run NAME [extra bench options]
    local name=$1
    shift
    local cmd=("${launcher[@]}" bench "${common[@]}" "$@")
    {
        echo "<!-- commit: $commit | device: $device | date: $(date -u +%Y-%m-%dT%H:%M:%SZ) -->"
        echo "<!-- command: ${cmd[*]} -->"
    } >"$OUT/$name.header"
    log "$name: ${cmd[*]}"
    if "${cmd[@]}" >"$OUT/$name.$FORMAT" 2>"$OUT/$name.log"; then
        cat "$OUT/$name.header" "$OUT/$name.$FORMAT"
    else
        local rc=$?
        log "$name failed (exit $rc): see $OUT/$name.log"
        tail -5 "$OUT/$name.log" >&2
        status=$rc
    fi
}
run bench-d0
[ "$DEPTH" -gt 0 ] && run "bench-d$DEPTH" -d "$DEPTH"
log "logs and tables in $OUT; record them in bench/RESULTS.md (see bench/README.md)"
exit $status
