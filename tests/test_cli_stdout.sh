#!/usr/bin/env bash
# tests/test_cli_stdout.sh SRC TPINFER — every command's results on stdout: to a file,
# exit 0 with output; to a full disk (/dev/full), exit 1 and one line
# "tpinfer CMD: cannot write the output (stdout)..." on stderr, not a silent exit 0.
# Exit 0 pass, 1 fail, 77 skip (no writable /dev/full here).
set -u
src=$1
tp=$2
[ -w /dev/full ] || { echo "test_cli_stdout: no writable /dev/full: skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
n_fail=0
fail() {
    echo "test_cli_stdout: $*" >&2
    n_fail=$((n_fail + 1))
}
"$tp" mkmodel --preset tiny --type q8_0 -o "$tmp/m.gguf" -q || { echo "mkmodel failed" >&2; exit 1; }
printf 'The quick brown fox jumps over the lazy dog. %.0s' $(seq 40) >"$tmp/text.txt"
m=$tmp/m.gguf
check() { # check NAME ARGS...: the command's output to a file, then to /dev/full
    local name=$1 label=${1:-tpinfer}
    shift
    "$tp" "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    [ "$rc" = 0 ] && [ -s "$tmp/out" ] || { fail "$label: to a file: exit $rc, $(wc -c <"$tmp/out") bytes"; return; }
    "$tp" "$@" >/dev/full 2>"$tmp/err"
    rc=$?
    local want="tpinfer${name:+ $name}: cannot write the output (stdout)"
    [ "$rc" = 1 ] || fail "$label: to /dev/full: exit $rc, want 1"
    [ "$(grep -c "^$want" "$tmp/err")" = 1 ] || fail "$label: no line '$want': $(cat "$tmp/err")"
}
check "" --version
check "" --help
check run run -m "$m" --backend cpu -p "Hello" -n 4 --temp 0
check run run -m "$m" --backend cpu -p "Hello" -n 4 --temp 0 --json
check info info "$m"
check info info --json "$m"
check tokenize tokenize -m "$m" --text "hello world"
check bench bench -m "$m" --backend cpu -p 8 -n 4 -r 1
check perplexity perplexity -m "$m" --backend cpu -f "$tmp/text.txt" -c 32
[ "$n_fail" = 0 ] || exit 1
echo "test_cli_stdout: every command's output checked"
