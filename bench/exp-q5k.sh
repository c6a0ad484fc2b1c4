#!/bin/bash
# Change 137's measurement (branch exp/q5k-rings, bench/NOTES.md) in two device calls, for
# the 64 MiB a call carries (the tree ~25 MB, a stripped `90-real` binary ~15 MB of xz):
#   A (~90 s): .dev holds test_gemv_cuda.xz and test_ops_fused.xz built from the branch:
#      the Q5_K group (ring1 among its settings, the six-item batch on rows of 12288) and
#      the api group, then test_ops_fused's cuda group (Q5_K's gate/up at 4096 -> 12288:
#      the ring kernel, bitwise against matmul_n + silu_mul, and its int8 form);
#   B (~300 s): .dev holds tpinfer.xz (the branch) and tpinfer-main.xz (main at the
#      branch's base): the 8B Q5_K_M, bench/ab.sh at depths 0 and 8192 over 5 rounds,
#      main against the branch and against the branch without the wo ring
#      (TPI_GEMV_RING1=0), then pp512 of both.
# Binaries built on the CPU machine with -DCMAKE_CUDA_ARCHITECTURES=90-real and stripped.
# BIN_DIR: where the .xz files are (default .dev; e.g. .dev/q4x8-A, carried with
# .dev/device). Logs under $OUT.
PART=${1:?usage: exp-q5k.sh A|B}
# shellcheck source=bench/gpu-lib.sh
. "$(dirname "$0")/gpu-lib.sh"
device_prep
if [ "$PART" = A ]; then
    unxz test_gemv_cuda && unxz test_ops_fused || exit 1
    for g in host Q5_K api; do echo "gemv $g: $(/tmp/test_gemv_cuda $g 2>&1 | tail -1)"; done
    /tmp/test_ops_fused cuda > "$OUT/fused.log" 2>&1; echo "fused cuda rc=$?: $(tail -1 "$OUT/fused.log")"
    exit 0
fi
unxz tpinfer && unxz tpinfer-main || exit 1
/tmp/tpinfer mkmodel --preset qwen3-8b --type q5_k_m -o /tmp/q5km.gguf -q || exit 1
MODEL=/tmp/q5km.gguf DEPTHS="0 8192" ROUNDS=5 GREEDY_LENS="300" OUT="$OUT" \
    bash bench/ab.sh main=/tmp/tpinfer-main rings=/tmp/tpinfer \
    noring1=/tmp/tpinfer@TPI_GEMV_RING1=0 2>&1 | grep -v "^d[0-9]"
for b in tpinfer-main tpinfer; do
    /tmp/$b bench -m /tmp/q5km.gguf -p 512 -n 0 -r 2 -o md 2>/dev/null | grep pp512 | sed "s/^/$b /"
done
