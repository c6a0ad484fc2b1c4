#!/usr/bin/env bash
# tests/test_ab.sh SRC TPINFER — bench/ab.sh on the CPU with a tiny synthetic model:
# two runs of one binary give the same greedy bytes, every bench line, and per-depth
# means that are the means of those lines; a build whose tokens differ is reported and
# makes the exit status 1; a bad argument exits 2 with a message.
set -u
src=$1
tp=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
    echo "test_ab: $*" >&2
    [ -f "$tmp/out" ] && sed 's/^/  | /' "$tmp/out" >&2
    exit 1
}
"$tp" mkmodel --preset tiny --type q8_0 -o "$tmp/m.gguf" -q || fail "mkmodel failed"
export MODEL=$tmp/m.gguf DEPTHS="32 0" ROUNDS=2 N=8 REPS=1 GREEDY_LENS=24 GREEDY_N=4
export BACKEND=cpu OUT=$tmp OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive

bash "$src/bench/ab.sh" a="$tp" "b=$tp@TPI_AB_TEST=1" >"$tmp/out" 2>&1 || fail "same binary: rc $?"
grep -q "^greedy 24 b: the same bytes as a" "$tmp/ab.txt" || fail "no greedy line"
n=$(grep -cE '^d(32|0) [ab] [0-9.]+ ± [0-9.]+ \|' "$tmp/ab.txt")
[ "$n" = 8 ] || fail "$n bench lines, want 8 (2 builds x 2 depths x 2 rounds)"
for d in 32 0; do
    want=$(awk -v d="d$d" '$1 == d && $2 == "a" { s += $3; n++ } END { printf "%.2f", s / n }' \
        "$tmp/ab.txt")
    grep -qE "^d$d:  a $want  b [0-9.]+ \([+-][0-9.]+ %\)" "$tmp/ab.txt" ||
        fail "depth $d: no means line with a's mean $want"
done

# a build whose run prints one more byte: its greedy bytes differ from the first's
# shellcheck disable=SC2016  # the wrapper's own expansions
printf '#!/bin/sh\n"%s" "$@"; rc=$?; [ "$1" = run ] && echo x; exit $rc\n' "$tp" >"$tmp/other"
chmod +x "$tmp/other"
DEPTHS=0 ROUNDS=1 bash "$src/bench/ab.sh" a="$tp" b="$tmp/other" >"$tmp/out" 2>&1
rc=$?
[ $rc = 1 ] || fail "differing build: rc $rc, want 1"
grep -q "^greedy 24 b: DIFFERENT from a" "$tmp/ab.txt" || fail "no DIFFERENT line"

bash "$src/bench/ab.sh" a=/nonexistent >"$tmp/out" 2>&1
rc=$?
[ $rc = 2 ] || fail "missing binary: rc $rc, want 2"
grep -q "ab.sh: a: '/nonexistent' is not an executable file" "$tmp/out" || fail "no message"
echo "test_ab: ok"
