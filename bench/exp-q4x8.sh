#!/bin/bash
# Change 135's measurement (branch exp/q4x8, bench/NOTES.md) in two device calls, for the
# 64 MiB a call carries (the tree ~25 MB, a stripped `90-real` binary ~15 MB of xz):
#   A (~60 s): .dev holds test_gemv_cuda.xz and test_ops_cuda_elem.xz: the GPU tests of
#      the Q4_0 groups (test_ops_cuda's matmul_Q4_0 also with TPI_Q4_REPACK=0);
#   B (~220 s): .dev holds tpinfer.xz: the 8B Q4_0 by default (x8) against
#      TPI_Q4_REPACK=0 (off: GGUF's blocks, the kernels before the change), bench/ab.sh at
#      depths 0 and 8192 over 5 rounds, then pp512 both ways.
# Binaries built on the CPU machine with -DCMAKE_CUDA_ARCHITECTURES=90-real and stripped.
# BIN_DIR: where the .xz files are (default .dev; e.g. .dev/q4x8-A, carried with
# .dev/device). Logs under $OUT.
PART=${1:?usage: exp-q4x8.sh A|B}
# shellcheck source=bench/gpu-lib.sh
. "$(dirname "$0")/gpu-lib.sh"
device_prep
if [ "$PART" = A ]; then
    unxz test_gemv_cuda && unxz test_ops_cuda_elem || exit 1
    for g in host Q4_0 api; do echo "gemv $g: $(/tmp/test_gemv_cuda $g 2>&1 | tail -1)"; done
    /tmp/test_ops_cuda_elem matmul_Q4_0 2>&1 | tail -2
    TPI_Q4_REPACK=0 /tmp/test_ops_cuda_elem matmul_Q4_0 2>&1 | tail -2
    exit 0
fi
unxz tpinfer || exit 1
/tmp/tpinfer mkmodel --preset qwen3-8b --type q4_0 -o /tmp/q40.gguf -q || exit 1
MODEL=/tmp/q40.gguf DEPTHS="0 8192" ROUNDS=5 GREEDY_LENS="300" OUT="$OUT" \
    bash bench/ab.sh off=/tmp/tpinfer@TPI_Q4_REPACK=0 x8=/tmp/tpinfer 2>&1 | grep -v "^d[0-9]"
/tmp/tpinfer bench -m /tmp/q40.gguf -p 512 -n 0 -r 2 -o md 2>/dev/null | grep pp512
TPI_Q4_REPACK=0 /tmp/tpinfer bench -m /tmp/q40.gguf -p 512 -n 0 -r 2 -o md 2>/dev/null |
    grep pp512 | sed 's/^/off /'
