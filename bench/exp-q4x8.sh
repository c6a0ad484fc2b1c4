#!/bin/bash
# Change 135's measurement (branch exp/q4x8, bench/NOTES.md), one device call (~250 s):
# the GPU tests of the Q4_0 groups, then the 8B Q4_0 by default (x8) against
# TPI_Q4_REPACK=0 (off: GGUF's blocks, the kernels before the change) in one binary.
# Carried in .dev, built on the CPU machine with -DCMAKE_CUDA_ARCHITECTURES=90-real and
# stripped: tpinfer.xz, test_gemv_cuda.xz, test_ops_cuda_elem.xz. Logs under $OUT.
sh .dev/device/setup.sh > "$OUT/setup.log" 2>&1 || { echo setup failed; tail "$OUT/setup.log"; }
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
for b in tpinfer test_gemv_cuda test_ops_cuda_elem; do
    xz -dc ".dev/$b.xz" > "/tmp/$b" && chmod +x "/tmp/$b" || exit 1
done
export CK_FORK=no CK_DEFAULT_TIMEOUT=900
/tmp/tpinfer mkmodel --preset qwen3-8b --type q4_0 -o /tmp/q40.gguf -q &
MP=$!
for g in host Q4_0 api; do echo "gemv $g: $(/tmp/test_gemv_cuda $g 2>&1 | tail -1)"; done
/tmp/test_ops_cuda_elem matmul_Q4_0 2>&1 | tail -2
TPI_Q4_REPACK=0 /tmp/test_ops_cuda_elem matmul_Q4_0 2>&1 | tail -2
wait $MP
MODEL=/tmp/q40.gguf DEPTHS="0 8192" ROUNDS=5 GREEDY_LENS="300" OUT="$OUT" \
    bash bench/ab.sh off=/tmp/tpinfer@TPI_Q4_REPACK=0 x8=/tmp/tpinfer 2>&1 | grep -v "^d[0-9]"
/tmp/tpinfer bench -m /tmp/q40.gguf -p 512 -n 0 -r 2 -o md 2>/dev/null | grep pp512
TPI_Q4_REPACK=0 /tmp/tpinfer bench -m /tmp/q40.gguf -p 512 -n 0 -r 2 -o md 2>/dev/null |
    grep pp512 | sed 's/^/off /'
