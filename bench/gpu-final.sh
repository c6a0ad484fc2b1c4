#!/usr/bin/env bash
# bench/gpu-final.sh — the one device call that verifies and measures both decode
# matrix-vector paths (TPI_GEMV=v2, f32 x, and v3, int8 x + dp4a, the default) on
# the H200, run from the repo root there:
#     sh .dev/device/setup.sh && bash bench/gpu-final.sh        (carry .dev)
# Steps, each bounded by the time left (the whole run stays under BUDGET_S, 8 min):
#   1. configure + build $BUILD (Release, sm_90): tpinfer and the GPU test binaries
#   2. synthetic Qwen3-8B models (bf16, q8_0, q4_k_m) written in the background
#   3. ctest -L gpu with TPI_GEMV=v2, then with TPI_GEMV=v3 (op tests run both paths
#      inside anyway; the model tests run the path the variable names)
#   4. tpinfer bench -p 512 -n 128 -r 3 on the three models, v2 then v3
#   5. the kernel microbench (test_ops_cuda_elem bench), v2 then v3
#   6. if under DEPTH_CUTOFF_S: the better path at depth 8192 (-r 2)
#   7. summary: each GPU test's result per path, pp512/tg128 per model and path
# Output: at most 8 files in $OUT (summary.txt first; see bench/NOTES.md, "gpu-final").
# GPU_FINAL_DRYRUN=1: the tiny preset, depth 256, no GPU needed (checks the plumbing).
set -u
set -o pipefail

T0=$SECONDS
OUT=${OUT:-$PWD/gpu-final-out}
mkdir -p "$OUT"
DRY=${GPU_FINAL_DRYRUN:-0}
BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-16}
BUILD_TYPE=${BUILD_TYPE-Release}
BUDGET_S=${BUDGET_S:-480}
DEPTH_CUTOFF_S=${DEPTH_CUTOFF_S:-330}
MODELS_DIR=${MODELS_DIR:-/tmp/tpi-models}
if [ "$DRY" = 1 ]; then
    PRESET=tiny
    DEPTH=256
    MK_THREADS=2
else
    PRESET=qwen3-8b
    DEPTH=8192
    MK_THREADS=8 # the GPU tests' CPU references run beside it
fi
TYPES="bf16 q8_0 q4_k_m"
SUM="$OUT/summary.txt"
: >"$SUM"

elapsed() { echo $((SECONDS - T0)); }
left() { echo $((BUDGET_S - (SECONDS - T0))); }
note() { echo "[gpu-final +$(elapsed)s] $*" | tee -a "$SUM"; }
# bounded NAME LIMIT_S LOG CMD...: run CMD under timeout (LIMIT_S capped by the time
# left minus a 15 s margin), output appended to LOG; prints and returns its status.
bounded() {
    local name=$1 limit=$2 log=$3
    shift 3
    local l
    l=$(left)
    l=$((l - 15))
    [ "$limit" -gt "$l" ] && limit=$l
    if [ "$limit" -lt 5 ]; then
        note "$name: SKIPPED (no time left)"
        return 124
    fi
    echo "=== $name (limit ${limit}s): $*" >>"$log"
    local t=$SECONDS
    timeout "$limit" "$@" >>"$log" 2>&1
    local rc=$?
    note "$name: rc=$rc in $((SECONDS - t)) s$([ $rc = 124 ] && echo ' (TIMED OUT)')"
    return $rc
}

{
    echo "gpu-final: $(date -u +%FT%TZ) dry-run=$DRY build=$BUILD"
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,temperature.gpu,power.draw \
        --format=csv 2>&1 || echo "(no nvidia-smi)"
    echo "nproc $(nproc)  disk /tmp: $(df -h /tmp | tail -1)"
} | tee -a "$SUM"

# The model tests look for their tiny models in ../shared/data, then tests/data (3 of
# the 7 are there). Where ../shared does not travel, tiny models copied into the carried
# .dev/data (qwen3-tiny-{bf16,q6_k,q8_0}, qwen2-tiny-f16: *.gguf + *.ref.json) serve.
if [ ! -e ../shared/data ] && ls .dev/data/*.gguf >/dev/null 2>&1; then
    mkdir -p ../shared 2>/dev/null && ln -s "$PWD/.dev/data" ../shared/data &&
        note "test data: ../shared/data -> .dev/data ($(ls .dev/data/*.gguf | wc -l) models)"
fi

# ---- 1. build ----
BLOG="$OUT/build.log"
: >"$BLOG"
bounded configure 120 "$BLOG" cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE="$BUILD_TYPE" \
    -DCMAKE_CUDA_ARCHITECTURES=90 || { tail -30 "$BLOG"; exit 1; }
# only what the steps below run (ctest -L gpu: the two GPU test binaries)
bounded build 240 "$BLOG" ninja -C "$BUILD" -j "$JOBS" tpinfer test_ops_cuda_elem test_model_gpu
build_rc=$?
if [ $build_rc -ne 0 ]; then
    grep -E "error|FAILED" "$BLOG" | head -40 | tee -a "$SUM"
    exit 1
fi
TPINFER="$BUILD/tpinfer"
OPS_TEST="$BUILD/tests/test_ops_cuda_elem"

# ---- 2. models, in the background (CPU and disk only) ----
MLOG="$OUT/mkmodel.log"
: >"$MLOG"
mkdir -p "$MODELS_DIR"
(
    for t in $TYPES; do
        f="$MODELS_DIR/$PRESET-$t.gguf"
        if [ -s "$f" ]; then
            echo "$f: exists" >>"$MLOG"
            continue
        fi
        s=$SECONDS
        "$TPINFER" mkmodel --preset "$PRESET" --type "$t" -t "$MK_THREADS" -q -o "$f" >>"$MLOG" 2>&1
        echo "$f: rc=$? in $((SECONDS - s)) s, $(du -h "$f" 2>/dev/null | cut -f1)" >>"$MLOG"
    done
    echo "mkmodel done" >>"$MLOG"
) </dev/null >>"$MLOG" 2>&1 &
MK_PID=$!

# ---- 3. GPU tests, both paths ----
for p in v2 v3; do
    # -j 2 and passive OpenMP waits: the CPU reference ops of the tests use every core,
    # and mkmodel runs beside them
    TPI_GEMV=$p OMP_WAIT_POLICY=passive bounded "ctest-$p" 150 "$OUT/ctest-$p.log" \
        ctest --test-dir "$BUILD" -L gpu -j 2 -V --timeout 140
done

# ---- 4. end-to-end bench, both paths ----
# wait for the models while the time left allows benching them (a model still being
# written is skipped: mkmodel renames FILE.tmp to FILE when done)
while kill -0 $MK_PID 2>/dev/null && [ "$(left)" -gt 200 ]; do sleep 2; done
note "models: $(grep -c 'rc=0\|exists' "$MLOG") of 3 ready"
models=""
for t in $TYPES; do
    f="$MODELS_DIR/$PRESET-$t.gguf"
    [ -s "$f" ] && models="${models:+$models,}$f"
done
BENCH="$OUT/bench.log"
: >"$BENCH"
if [ -n "$models" ]; then
    for p in v2 v3; do
        TPI_GEMV=$p bounded "bench-$p" 110 "$BENCH" "$TPINFER" bench -m "$models" -p 512 -n 128 \
            -r 3 -o md --roofline-gbps 4000
    done
else
    note "bench: no models"
fi

# ---- 5. kernel microbench, both paths ----
for p in v2 v3; do
    TPI_GEMV=$p bounded "microbench-$p" 60 "$OUT/microbench.log" "$OPS_TEST" bench
done

# ---- 6. depth runs for the better path, if time allows ----
tg_of() { # tg_of PATH MODEL_TYPE_REGEX: tg128 t/s of the first matching row of that path's table
    awk -v sec="=== bench-$1 " -v re="$2" '
        index($0, "=== ") == 1 { on = index($0, sec) == 1; next }
        on && $0 ~ re && $0 ~ /\| *tg128 *\|/ { n = split($0, c, "|"); for (i = 1; i <= n; i++)
            if (c[i] ~ /tg128/) { split(c[i + 1], v, " "); print v[1]; exit } }' "$BENCH"
}
best=v2
sum2=0
sum3=0
for re in BF16 Q8_0 Q4_K; do
    a=$(tg_of v2 "$re")
    b=$(tg_of v3 "$re")
    [ -n "$a" ] && [ -n "$b" ] && sum2=$(awk -v s="$sum2" -v x="$a" 'BEGIN{print s + x}') &&
        sum3=$(awk -v s="$sum3" -v x="$b" 'BEGIN{print s + x}')
done
awk -v a="$sum2" -v b="$sum3" 'BEGIN{exit !(b > a)}' && best=v3
if [ -n "$models" ] && [ "$(elapsed)" -lt "$DEPTH_CUTOFF_S" ]; then
    TPI_GEMV=$best bounded "bench-depth-$best" 120 "$BENCH" "$TPINFER" bench -m "$models" -p 512 \
        -n 128 -d "$DEPTH" -r 2 -o md --roofline-gbps 4000
else
    note "depth runs: skipped (elapsed $(elapsed) s, cutoff $DEPTH_CUTOFF_S s)"
fi

# ---- 6b. batch prompt files on the GPU: --parallel 1 vs 32, if time allows ----
q4=$(ls "$MODELS_DIR"/*q4_k_m*.gguf 2>/dev/null | head -1)
if [ -n "$q4" ] && [ "$(left)" -gt 120 ]; then
    TPI_GEMV=$best DRIVER="$TPINFER" EXTRA="--backend cuda" bounded "batch-bench-$best" 90 \
        "$BENCH" bash bench/batch-bench.sh "$q4" 64 32
else
    note "batch bench: skipped (no q4_k_m model or no time)"
fi

# a model still being written when time ran out: stop it (this script's own child)
if kill -0 $MK_PID 2>/dev/null; then
    pkill -P $MK_PID 2>/dev/null
    kill $MK_PID 2>/dev/null
    note "mkmodel: stopped (not done in time)"
fi

# ---- 7. summary ----
{
    echo
    echo "== GPU tests (ctest -L gpu) per path"
    for p in v2 v3; do
        f="$OUT/ctest-$p.log"
        [ -f "$f" ] || continue
        echo "-- TPI_GEMV=$p: $(grep -E 'tests passed|tests failed' "$f" | tail -1)"
        grep -E "Test +#[0-9]+: " "$f" | sed -E 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: //; s/ \.+/ /' |
            awk '{printf "   %s\n", $0}'
    done
    echo
    echo "== matmul error figures (op tests run both paths in each ctest run: worst nmse per type)"
    grep -h "worst nmse" "$OUT"/ctest-v2.log 2>/dev/null | sed -E 's/^[0-9]+: //' | sort -u |
        sed 's/^/   /'
    echo
    echo "== model tests, CUDA vs CPU logits per path (bounds: / range <= 0.02, nmse <= 1e-3)"
    for p in v2 v3; do
        grep -h "cuda vs cpu:" "$OUT/ctest-$p.log" 2>/dev/null | sed -E 's/^[0-9]+: //' |
            sed -E 's/; graph launches.*//' | sed "s/^/   $p /"
    done
    echo
    echo "== tpinfer bench (t/s), tg128 / pp512 per model and path"
    for p in v2 v3; do
        awk -v sec="=== bench-$p " -v p="$p" '
            index($0, "=== ") == 1 { on = index($0, sec) == 1; next }
            on && /\| *(pp512|tg128) *\|/ { n = split($0, c, "|"); for (i = 3; i < n; i++)
                if (c[i] ~ /^ *(pp512|tg128) *$/) { printf "   %s %-26s %6s %s\n", p, c[2], c[i], c[i + 1]; break } }' "$BENCH"
    done
    grep -A40 "=== bench-depth" "$BENCH" | grep -E "^\|.*@ d" | sed "s/^/   depth: /"
    grep -A6 "=== batch-bench" "$BENCH" | grep -E "^(parallel|1 |32 )" | sed "s/^/   batch: /"
    echo "   (sum of tg128 over the 3 models: v2 $sum2, v3 $sum3 -> better: $best)"
    echo
    echo "== microbench (TB/s of weight bytes, 1 row) per path"
    awk '/decode matrix-vector path/ { p = $NF == "(TPI_GEMV)" ? $(NF - 1) : $NF }
         /^bench matmul/ && / rows   1:/ { printf "   %s %s\n", p, $0 }' "$OUT/microbench.log" 2>/dev/null
    echo
    echo "total: $(elapsed) s"
} >>"$SUM"
cat "$SUM"
ls -la "$OUT"
