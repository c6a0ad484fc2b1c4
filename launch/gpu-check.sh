#!/bin/bash
# launch/gpu-check.sh — the GPU machine's check, run from the repo root there
# (device tool: `bash launch/gpu-check.sh`, carry .dev). Installs the missing
# build dependencies, builds build-gpu for sm_90, runs the GPU tests (label gpu)
# and the CPU unit tests, then a short benchmark when `tpinfer bench` works.
# Logs go to $OUT (or ./gpu-out); GPU_CHECK_UNIT=0 skips the CPU unit tests.
# A step that fails is reported and the script goes on; the exit status is that
# of the GPU tests (or else of the first failing step).
set -u
set -o pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-gpu}
JOBS=$(nproc)
status=0
step() { # step NAME CMD...: run CMD, log its output to $OUT/NAME.log, remember a failure
    local name=$1
    shift
    echo "=== $name: $*" | tee -a "$OUT/summary.txt"
    local t0=$SECONDS
    "$@" 2>&1 | tee "$OUT/$name.log"
    local rc=$?
    echo "=== $name: rc=$rc in $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
    [ $rc -ne 0 ] && [ $status -eq 0 ] && status=$rc
    return $rc
}

{ nvidia-smi; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv; } \
    >"$OUT/nvidia-smi.txt" 2>&1
head -20 "$OUT/nvidia-smi.txt"
[ -f .dev/device/setup.sh ] && step setup sh .dev/device/setup.sh
# GPU_CHECK_PREBUILT=1: use $BUILD/tests/test_ops_cuda_elem as carried (built on the
# CPU machine with the same CUDA 13): only the op tests (all groups) and the kernel
# bench run, which saves the device time of a build there.
if [ "${GPU_CHECK_PREBUILT:-0}" = 1 ]; then
    ops_test="$BUILD/tests/test_ops_cuda_elem"
    step ops-cuda-figures "$ops_test" all
    gpu_rc=$?
    grep -E "worst nmse|attention .*nmse" "$OUT/ops-cuda-figures.log" | head -60
    step ops-cuda-bench timeout "${GPU_CHECK_BENCH_S:-240}" "$ops_test" bench
    grep -E "^bench" "$OUT/ops-cuda-bench.log"
    cat "$OUT/summary.txt"
    exit $gpu_rc
fi
step configure cmake -S . -B "$BUILD" -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCMAKE_BUILD_TYPE=Release || exit $status
# -k 0: build whatever compiles, so one broken file does not hide every other test
step build cmake --build "$BUILD" -j "$JOBS" -- -k 0
gpu_rc=0
step gpu-tests ctest --test-dir "$BUILD" -L gpu --output-on-failure --timeout 300 || gpu_rc=$?
# the same tests with their error figures (ctest shows output only on failure), and
# rough kernel speeds
ops_test="$BUILD/tests/test_ops_cuda_elem"
if [ -x "$ops_test" ]; then
    step ops-cuda-figures "$ops_test" all
    grep -E "worst nmse|attention .*nmse|^bench" "$OUT/ops-cuda-figures.log" | head -60
    step ops-cuda-bench timeout "${GPU_CHECK_BENCH_S:-240}" "$ops_test" bench
fi
[ "${GPU_CHECK_UNIT:-1}" = 1 ] && step unit-tests ctest --test-dir "$BUILD" -L unit -j 16 --output-on-failure --timeout 300
if [ -x "$BUILD/tpinfer" ]; then
    model=""
    for m in .dev/models/*.gguf tests/data/qwen3-tiny-q4_k_m.gguf; do
        [ -f "$m" ] && model=$m && break
    done
    if [ -n "$model" ] && "$BUILD/tpinfer" bench --help >/dev/null 2>&1; then
        step bench timeout 120 "$BUILD/tpinfer" bench -m "$model" -p 512 -n 128 -r 3 --backend cuda
    else
        echo "bench: skipped (no model or tpinfer bench not available)" | tee -a "$OUT/summary.txt"
    fi
fi
cat "$OUT/summary.txt"
[ $gpu_rc -ne 0 ] && exit $gpu_rc
exit $status
