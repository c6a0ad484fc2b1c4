#!/usr/bin/env bash
# bench/gpu-session.sh — one device call that verifies and measures the CUDA backend on
# an H200, run from the repo root there:
#     sh .dev/device/setup.sh && bash bench/gpu-session.sh        (carry .dev)
# Steps, each bounded by the time left (the whole run stays under BUDGET_S):
#   1. configure + build $BUILD (Release, sm_90): tpinfer and the GPU test binaries;
#      PREBUILT=1 skips it and runs the binaries carried in $BUILD (built elsewhere the
#      same way: bench/README.md; the device's build takes ~150-200 s of its time)
#   2. synthetic Qwen3-8B models (bf16, q8_0, q4_k_m) written in the background
#   3. ctest -L gpu (every CUDA op and fused op against the CPU, the tiny models end to end;
#      the two-GPU tests are bench/gpu-multi.sh's; CTEST_SEL replaces the selection),
#      and the model tests again under VTEST_ENV when given
#   4. tpinfer bench -p 512 -n 128 -r 3 on each model in a process of its own (the default
#      paths)
#   5. depth 8192 (-d 8192 -p 512 -n 128 -r 2) on DEPTH_TYPES, while time allows
#   6. knob variants (VARIANTS: "name ENV=V ..." per line): tg128 + pp512 (VARIANT_ARGS) of
#      one model each;
#      a name starting with "alt" runs a second tpinfer built with ALT_CUDA_FLAGS,
#      TYPE=t among the assignments benches that model instead, D=n adds -d n
#   6b. profile: ncu's kernel durations over PROFILE_N decode steps of PROFILE_TYPES,
#      summed per kernel by bench/ncu-steps.py (profile.txt; ~70 s a step)
#   7. kernel microbenches, not in the defaults (test_gemv_cuda bench, test_ops_cuda_elem
#      bench; STEPS="... micro"; TPI_BENCH_* narrow the first); with BASE_SRC (another
#      source tree, e.g. `git archive` of an earlier commit) its test_gemv_cuda is built
#      beside step 1 and its gemv bench runs too, for a before/after on one machine
#   7b. ncu sections of single matrix-vector kernels (STEPS="... ncu-gemv", NCU_GEMV)
#   7c. ncu of one decode attention call at depth (STEPS="... ncu-attn", NCU_ATTN_*)
#   8. batch prompt files (bench/batch-bench.sh, BATCH_MODEL, --parallel 32, greedy and
#      temperature 0.8: the host sampler's share of a step shows as the difference)
#   9. summary.txt: test results, bench rows, variant rows, microbench lines
# Output: summary.txt, profile.txt and logs.tgz (every log) in $OUT.
set -u
set -o pipefail

T0=$SECONDS
OUT=${OUT:-$PWD/gpu-session-out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-16}
BUDGET_S=${BUDGET_S:-550}
MODELS_DIR=${MODELS_DIR:-/tmp/tpi-models}
PRESET=${PRESET:-qwen3-8b}
TYPES=${TYPES:-"bf16 q8_0 q4_k_m"}
STEPS=${STEPS:-"test bench depth variants profile batch"}
DEPTH_TYPES=${DEPTH_TYPES:-"q4_k_m q8_0 bf16"}
VARIANT_MODEL=${VARIANT_MODEL:-q4_k_m} # one or more types, space-separated
VARIANT_ARGS=${VARIANT_ARGS:-"-p 512 -n 128"} # the tests each variant runs (e.g. "-d 8192 -p 0 -n 128")
# one variant per line: a name, then environment assignments
VARIANTS=${VARIANTS:-"default
memo-silu TPI_XQ_MEMO=silu
memo TPI_XQ_MEMO=1
wps32 TPI_GEMV_WPS=32"}
BATCH_MODEL=${BATCH_MODEL:-q4_k_m}
PROFILE_TYPES=${PROFILE_TYPES:-q4_k_m}
PROFILE_N=${PROFILE_N:-1}
SUM="$OUT/summary.txt"
: >"$SUM"

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/gpu-lib.sh
. "$here/gpu-lib.sh"

{
    echo "gpu-session: $(date -u +%FT%TZ) commit ${TPI_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)} steps: $STEPS"
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1 ||
        echo "(no nvidia-smi)"
} | tee -a "$SUM"

link_test_data

# ---- 1. build (PREBUILT=1: the binaries under $BUILD came with the call instead) ----
BLOG="$OUT/build.log"
: >"$BLOG"
if [ "${PREBUILT:-0}" = 1 ]; then
    [ -x "$BUILD/tpinfer" ] || { echo "PREBUILT=1 but no $BUILD/tpinfer" | tee -a "$SUM"; exit 1; }
    echo "prebuilt: $(ls "$BUILD"/tpinfer "$BUILD"/tests/* 2>/dev/null | tr '\n' ' ')" | tee -a "$SUM"
else
    bounded configure 120 "$BLOG" cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CUDA_ARCHITECTURES=90 || { tail -30 "$BLOG"; exit 1; }
    targets="tpinfer test_ops_cuda_elem test_model_gpu test_ops_fused"
    [ -f tests/test_gemv_cuda.c ] && targets="$targets test_gemv_cuda"
    # shellcheck disable=SC2086
    if ! bounded build 300 "$BLOG" ninja -C "$BUILD" -j "$JOBS" $targets; then
        grep -E "error|FAILED" "$BLOG" | head -40 | tee -a "$SUM"
        exit 1
    fi
fi
TPINFER="$BUILD/tpinfer"

# the baseline's matrix-vector microbench binary, in the background (BASE_SRC)
BASE_SRC=${BASE_SRC:-}
BASE_PID=
if [ -n "$BASE_SRC" ] && [ -d "$BASE_SRC" ]; then
    (
        cmake -S "$BASE_SRC" -B build-base -G Ninja -DCMAKE_BUILD_TYPE=Release \
            -DCMAKE_CUDA_ARCHITECTURES=90 >"$OUT/build-base.log" 2>&1 &&
            ninja -C build-base -j "$JOBS" test_gemv_cuda >>"$OUT/build-base.log" 2>&1
    ) </dev/null &
    BASE_PID=$!
fi

# a second tpinfer built with other CUDA flags (ALT_CUDA_FLAGS, e.g. "-DGV_WLOAD=1"), in
# the background: variant lines whose name starts with "alt" run it
ALT_CUDA_FLAGS=${ALT_CUDA_FLAGS:-}
ALT_PID=
if [ -n "$ALT_CUDA_FLAGS" ]; then
    (
        cmake -S . -B "$BUILD-alt" -G Ninja -DCMAKE_BUILD_TYPE=Release \
            -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_FLAGS="$ALT_CUDA_FLAGS" \
            >"$OUT/build-alt.log" 2>&1 &&
            ninja -C "$BUILD-alt" -j "$JOBS" tpinfer >>"$OUT/build-alt.log" 2>&1
    ) </dev/null &
    ALT_PID=$!
fi

# ---- 2. models, in the background ----
MLOG="$OUT/mkmodel.log"
done_types=""
: >"$MLOG"
mkdir -p "$MODELS_DIR"
(
    for t in $VARIANT_MODEL $TYPES; do
        case " $done_types " in *" $t "*) continue ;; esac
        done_types="$done_types $t"
        f="$MODELS_DIR/$PRESET-$t.gguf"
        [ -s "$f" ] && continue
        s=$SECONDS
        "$TPINFER" mkmodel --preset "$PRESET" --type "$t" -t 8 -q -o "$f" >>"$MLOG" 2>&1
        echo "$f: rc=$? in $((SECONDS - s)) s" >>"$MLOG"
    done
    echo "mkmodel done" >>"$MLOG"
) </dev/null >>"$MLOG" 2>&1 &
MK_PID=$!

# ---- 3. GPU tests ----
if has_step test; then
    # shellcheck disable=SC2086
    OMP_WAIT_POLICY=passive bounded ctest 200 "$OUT/ctest.log" \
        ctest --test-dir "$BUILD" ${CTEST_SEL:--L gpu -E test_parallel_gpu_np2|test_comm_gpu} -j 4 \
        -V --timeout 190
fi

# GPU model tests again under other settings (VTEST_ENV: "ENV=V ...", empty: skipped)
VTEST_ENV=${VTEST_ENV:-}
if has_step test && [ -n "$VTEST_ENV" ]; then
    # shellcheck disable=SC2086
    OMP_WAIT_POLICY=passive bounded "ctest-variant" 120 "$OUT/ctest.log" env $VTEST_ENV \
        ctest --test-dir "$BUILD" -R "test_model_gpu|test_ops_fused" -j 4 -V --timeout 110
fi

# wait for the models while a bench could still run after them (WAIT_LEFT_S seconds left)
wait_models() {
    while kill -0 $MK_PID 2>/dev/null && [ "$(left)" -gt "${WAIT_LEFT_S:-60}" ]; do sleep 2; done
}
model_of() { echo "$MODELS_DIR/$PRESET-$1.gguf"; }
BENCH="$OUT/bench.log"
: >"$BENCH"

# ---- 4. bench, default paths ----
if has_step bench; then
    wait_models
    # one process a model: a model benched after another in one process decodes a few
    # per cent slower (bench/NOTES.md, run 22), and a user's `tpinfer bench -m` runs one
    for t in $TYPES; do
        f=$(model_of "$t")
        [ -s "$f" ] || continue
        bounded "bench-$t" 70 "$BENCH" "$TPINFER" bench -m "$f" -p 512 -n 128 -r 3 -o md \
            --roofline-gbps 4000 || break
    done
fi

# ---- 5. depth ----
if has_step depth; then
    for t in $DEPTH_TYPES; do
        f=$(model_of "$t")
        [ -s "$f" ] || continue
        bounded "depth-$t" 90 "$BENCH" "$TPINFER" bench -m "$f" -p 512 -n 128 -d 8192 -r 2 -o md \
            --roofline-gbps 4000 || break
    done
fi

# ---- 6. variants ----
if has_step variants; then
    wait_models
    vmodels=""
    for t in $VARIANT_MODEL; do
        f=$(model_of "$t")
        [ -s "$f" ] && vmodels="${vmodels:+$vmodels,}$f"
    done
    while IFS= read -r line; do
        [ -n "$line" ] && [ -n "$vmodels" ] || continue
        name=${line%% *}
        envs=""
        [ "$name" != "$line" ] && envs=${line#* }
        # TYPE=t among the assignments: that model instead of VARIANT_MODEL's
        vm=$vmodels
        case " $envs " in *" TYPE="*)
            vt=${envs##*TYPE=}
            vt=${vt%% *}
            envs=$(echo " $envs " | sed "s/ TYPE=$vt / /")
            vm=$(model_of "$vt")
            ;;
        esac
        # D=n among the assignments: at depth n (-d n) as well
        vargs=$VARIANT_ARGS
        case " $envs " in *" D="*)
            vd=${envs##*D=}
            vd=${vd%% *}
            envs=$(echo " $envs " | sed "s/ D=$vd / /")
            vargs="$vargs -d $vd"
            ;;
        esac
        bin=$TPINFER
        case $name in alt*)
            [ -n "$ALT_PID" ] && wait "$ALT_PID"
            ALT_PID=
            bin="$BUILD-alt/tpinfer"
            [ -x "$bin" ] || { echo "no $bin (build-alt.log)" | tee -a "$SUM"; continue; }
            ;;
        esac
        # shellcheck disable=SC2086
        bounded "variant-$name" 60 "$BENCH" env $envs "$bin" bench -m "$vm" $vargs \
            -r 2 -o md --roofline-gbps 4000
    done <<<"$VARIANTS"
fi

# ---- 6b. profile: each decode kernel's own duration (ncu runs them one at a time, ~0.1 s
# a kernel: keep PROFILE_N small), per PROFILE_VARIANTS line ("name ENV=V ...") ----
PROFILE_VARIANTS=${PROFILE_VARIANTS:-default}
if has_step profile && command -v ncu >/dev/null; then
    wait_models
    for t in $PROFILE_TYPES; do
        f=$(model_of "$t")
        [ -s "$f" ] || continue
        while IFS= read -r line; do
            [ -n "$line" ] || continue
            name=${line%% *}
            envs=""
            [ "$name" != "$line" ] && envs=${line#* }
            # shellcheck disable=SC2086
            bounded "profile-$t-$name" 150 "$OUT/profile.log" env $envs ncu --clock-control none \
                --cache-control none --print-units base --csv --metrics gpu__time_duration.sum \
                --log-file "$OUT/ncu-$t-$name.csv" "$TPINFER" bench -m "$f" -p 0 \
                -n "$PROFILE_N" -r 1 --no-warmup -o md
            echo "== $t $line" >>"$OUT/profile.txt"
            python3 bench/ncu-steps.py "$OUT/ncu-$t-$name.csv" "$PROFILE_N" >>"$OUT/profile.txt" 2>&1
        done <<<"$PROFILE_VARIANTS"
    done
fi

# ---- 7. microbenches ----
if has_step micro; then
    [ -x "$BUILD/tests/test_gemv_cuda" ] &&
        bounded micro-gemv 90 "$OUT/micro.log" "$BUILD/tests/test_gemv_cuda" bench
    if [ -n "$BASE_PID" ]; then
        while kill -0 "$BASE_PID" 2>/dev/null && [ "$(left)" -gt 120 ]; do sleep 2; done
        [ -x build-base/tests/test_gemv_cuda ] &&
            bounded micro-gemv-base 90 "$OUT/micro-base.log" build-base/tests/test_gemv_cuda bench
    fi
    [ "${MICRO_OPS:-1}" = 1 ] &&
        bounded micro-ops 60 "$OUT/micro.log" "$BUILD/tests/test_ops_cuda_elem" bench
fi

# ---- 7b. ncu sections of single matrix-vector kernels (NCU_GEMV: "TYPE SHAPE CFG" per
# line; the microbench's first graph launch of that kernel, after the warm-up) ----
NCU_GEMV=${NCU_GEMV:-"Q4_K 4096x12288 kind=p
Q6_K 12288x4096 kind=p"}
# NCU_GEMV_FULL=1: every section and the per-SASS-line source counters instead
# (ncu-gemv-N.ncu-rep and ncu-gemv-N-sass.csv per line)
if has_step ncu-gemv && command -v ncu >/dev/null && [ -x "$BUILD/tests/test_gemv_cuda" ]; then
    n=0
    while read -r ty shape cfg; do
        [ -n "$cfg" ] || continue
        n=$((n + 1))
        echo "== ncu $ty $shape $cfg" >>"$OUT/ncu-gemv.log"
        if [ "${NCU_GEMV_FULL:-0}" = 1 ]; then
            sel=(--set full --import-source yes -f -o "$OUT/ncu-gemv-$n")
        else
            sel=(--section SpeedOfLight --section MemoryWorkloadAnalysis
                --section WarpStateStats --section Occupancy --section LaunchStats
                --section SchedulerStats --section InstructionStats)
        fi
        TPI_BENCH_TYPES=$ty TPI_BENCH_SHAPES=$shape TPI_BENCH_ROWS=1 TPI_BENCH_CFGS=$cfg \
            bounded "ncu-gemv-$ty-$shape-$cfg" 90 "$OUT/ncu-gemv.log" ncu --clock-control none \
            -k regex:"gv_(quant|elem|unit|glu_quant)_kernel" --launch-skip 2 --launch-count 1 \
            "${sel[@]}" "$BUILD/tests/test_gemv_cuda" bench
        if [ "${NCU_GEMV_FULL:-0}" = 1 ] && [ -s "$OUT/ncu-gemv-$n.ncu-rep" ]; then
            ncu -i "$OUT/ncu-gemv-$n.ncu-rep" --page details >>"$OUT/ncu-gemv.log" 2>&1
            ncu -i "$OUT/ncu-gemv-$n.ncu-rep" --page source --csv --print-source sass \
                >"$OUT/ncu-gemv-$n-sass.csv" 2>&1
        fi
    done <<<"$NCU_GEMV"
fi

# ---- 7c. ncu of the decode attention (STEPS="... ncu-attn"): the microbench's first
# tensor-core decode call of one token at NCU_ATTN_DEPTH (default 8192), every section,
# then the report's details and its per-SASS-line source counters (ncu-attn.log) ----
if has_step ncu-attn && command -v ncu >/dev/null && [ -x "$BUILD/tests/test_ops_cuda_elem" ]; then
    for st in ${NCU_ATTN_STAGES:-3}; do
        rep="$OUT/ncu-attn-s$st"
        TPI_ATTN_DEC_STAGES=$st TPI_BENCH_TYPES=NONE TPI_BENCH_ATTN=decode \
            TPI_BENCH_ATTN_DEPTH=${NCU_ATTN_DEPTH:-8192} TPI_BENCH_ATTN_REPS=1 \
            bounded "ncu-attn-s$st" 120 "$OUT/ncu-attn.log" ncu --clock-control none \
            -k regex:"attn_mma_kernel" --launch-skip 1 --launch-count 1 --set full \
            --import-source yes -f -o "$rep" "$BUILD/tests/test_ops_cuda_elem" bench
        echo "== ncu attention, stages $st" >>"$OUT/ncu-attn.log"
        ncu -i "$rep.ncu-rep" --page details >>"$OUT/ncu-attn.log" 2>&1
        ncu -i "$rep.ncu-rep" --page source --csv --print-source sass \
            >"$OUT/ncu-attn-s$st-sass.csv" 2>&1
    done
fi

# ---- 8. batch prompt files ----
if has_step batch && [ -s "$(model_of "$BATCH_MODEL")" ]; then
    for temp in 0 0.8; do
        TEMP=$temp PARALLEL=32 DRIVER="$TPINFER" EXTRA="--backend cuda" bounded "batch-temp$temp" 60 \
            "$OUT/batch.log" bash bench/batch-bench.sh "$(model_of "$BATCH_MODEL")" 64 32
    done
fi

if kill -0 $MK_PID 2>/dev/null; then
    pkill -P $MK_PID 2>/dev/null
    kill $MK_PID 2>/dev/null
    note "mkmodel: stopped (not done in time)"
fi

# ---- 9. summary ----
{
    echo
    echo "== GPU tests (default, then VTEST_ENV=$VTEST_ENV):"
    ctest_summary "$OUT/ctest.log" "worst nmse|cuda vs cpu:|Failure|failed:|Assertion"
    echo
    echo "== bench rows (=== names the run)"
    grep -E "^=== |\| *(pp512|tg128)" "$BENCH" 2>/dev/null | sed -E 's/ \(limit.*//' |
        awk -F'|' '/^===/ { print; next } { printf "   %s |%s |%s |%s\n", $2, $(NF-4), $(NF-3), $(NF-2) }'
    echo
    echo "== batch (bench/batch-bench.sh)"
    grep -E "^model |^[0-9]+ " "$OUT/batch.log" 2>/dev/null | sed 's/^/   /'
    echo
    echo "== profile (ncu kernel time per decode step; profile.txt has the rest)"
    grep -A12 "^== " "$OUT/profile.txt" 2>/dev/null | head -40
    echo
    echo "== microbench"
    grep -E "^(gemv_)?bench " "$OUT/micro.log" 2>/dev/null | sed -E 's/^gemv_bench //' | head -150
    grep -E "^gemv_bench " "$OUT/micro-base.log" 2>/dev/null | sed -E 's/^gemv_bench /base /' |
        head -150
    echo
    echo "== ncu sections of single kernels (ncu-gemv.log has all)"
    grep -E "^== ncu|  (Duration|DRAM Throughput|Memory Throughput|L1/TEX Cache Throughput|L2 Cache Throughput|Compute \(SM\) Throughput|Registers Per Thread|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued Instruction|Grid Size|Waves Per SM|L1/TEX Hit Rate|Mem Busy|Max Bandwidth|Mem Pipes Busy) " \
        "$OUT/ncu-gemv.log" 2>/dev/null | head -120
    echo
    echo "total: $(elapsed) s"
} >>"$SUM"
cat "$SUM"

pack_logs
