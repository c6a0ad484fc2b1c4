#!/usr/bin/env bash
# bench/gpu-multi.sh — one device call on a machine of several GPUs (nvidia-h200-x2 or
# larger): checks and measures tensor and pipeline parallelism over NCCL, run from the
# repo root there:
#     sh .dev/device/setup.sh && bash bench/gpu-multi.sh          (carry .dev)
# Steps (STEPS, default "test comm bench8"), each bounded by the time left:
#   build    Release sm_90 build of tpinfer and the GPU tests into $BUILD (always)
#   models   synthetic models written into $MODELS_DIR in the background (always; the
#            32B one only when bench32 is a step); kept there for a next call
#   test     ctest -L gpu: the CUDA ops and tiny models on GPU 0, and test_parallel_gpu_np2
#            (tp 2 and pp 2 over NCCL against one rank, on two GPUs)
#   comm     tpinfer comm: all-reduce bus bandwidth over NP ranks, NCCL and MPI
#   bench8   Qwen3-8B shapes (TYPES8): tp 1, tp NP, pp NP over NCCL and MPI, tp NP with
#            TPI_PEER_AR=0 (NCCL's own all-reduce) and with TPI_TP_SKIP_ALLREDUCE=1 (the
#            step without its all-reduces), depth 8192
#   batch    a 256-prompt file at --parallel 32: tp 1 against tp NP (bench/batch-bench.sh)
#   bench32  Qwen3-32B shape in BF16: tp 1, tp NP (and without all-reduces), pp NP
# Output in $OUT: summary.txt, topo.txt and logs.tgz. Keep NCCL_NVLS_ENABLE=0.
set -u
set -o pipefail

T0=$SECONDS
OUT=${OUT:-$PWD/gpu-multi-out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-32}
BUDGET_S=${BUDGET_S:-560}
MODELS_DIR=${MODELS_DIR:-$BUILD/models}
NP=${NP:-2}
TYPES8=${TYPES8:-"q4_k_m bf16"}
STEPS=${STEPS:-"test comm bench8"}
REPS=${REPS:-3}
MPI_RUNS=${MPI_RUNS:-1}   # 0: no --comm mpi benches
NCCL_ONLY=${NCCL_ONLY:-1} # 0: no TPI_PEER_AR=0 benches
SUM="$OUT/summary.txt"
: >"$SUM"
export NCCL_NVLS_ENABLE=0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/gpu-lib.sh
. "$here/gpu-lib.sh"

{
    echo "gpu-multi: $(date -u +%FT%TZ) commit ${TPI_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)} NP=$NP steps: $STEPS"
    nvidia-smi --query-gpu=index,name,memory.total,pci.bus_id --format=csv 2>&1 || echo "(no nvidia-smi)"
} | tee -a "$SUM"
nvidia-smi topo -m >"$OUT/topo.txt" 2>&1
nvidia-smi nvlink -s >>"$OUT/topo.txt" 2>&1
link_test_data

# ---- build ----
BLOG="$OUT/build.log"
bounded configure 120 "$BLOG" cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES=90 || { tail -30 "$BLOG"; exit 1; }
if ! bounded build 300 "$BLOG" ninja -C "$BUILD" -j "$JOBS" tpinfer test_ops_cuda_elem \
    test_model_gpu test_ops_fused test_parallel_np2 test_comm_gpu; then
    grep -E "error|FAILED" "$BLOG" | head -40 | tee -a "$SUM"
    exit 1
fi
TPINFER="$PWD/$BUILD/tpinfer"
export TPINFER
LOCAL=(launch/tpinfer-local --bind-to none)

# ---- models, in the background ----
MLOG="$OUT/mkmodel.log"
mkdir -p "$MODELS_DIR"
want="qwen3-8b:q4_k_m qwen3-8b:bf16"
has_step bench32 && want="$want qwen3-32b:bf16"
(
    for pt in $want; do
        f="$MODELS_DIR/${pt%%:*}-${pt#*:}.gguf"
        [ -s "$f" ] && continue
        s=$SECONDS
        "$TPINFER" mkmodel --preset "${pt%%:*}" --type "${pt#*:}" -t 16 -q -o "$f.part" &&
            mv "$f.part" "$f"
        echo "$f: rc=$? in $((SECONDS - s)) s" >>"$MLOG"
    done
    echo "mkmodel done" >>"$MLOG"
) </dev/null >>"$MLOG" 2>&1 &
MK_PID=$!
model_of() { echo "$MODELS_DIR/$1.gguf"; }
wait_model() { # wait_model NAME: until the file exists (or the model writer ends)
    while [ ! -s "$(model_of "$1")" ] && kill -0 $MK_PID 2>/dev/null && [ "$(left)" -gt 60 ]; do
        sleep 2
    done
    [ -s "$(model_of "$1")" ]
}

# ---- test ----
if has_step test; then
    OMP_WAIT_POLICY=passive bounded ctest 200 "$OUT/ctest.log" \
        ctest --test-dir "$BUILD" -L gpu -E test_gemv_cuda -j 4 -V --timeout 190
    # the same multi-rank checks with NCCL alone (no peer all-reduce), and with the MPI
    # communicator staging through the host
    OMP_WAIT_POLICY=passive TPI_TEST_BACKEND=cuda TPI_TEST_COMM=nccl TPI_PEER_AR=0 bounded \
        test-parallel-nccl-only 120 "$OUT/ctest.log" mpirun -np "$NP" --bind-to none \
        "$BUILD/tests/test_parallel_np2" "${NP}x1" qwen3-tiny-bf16 qwen3-tiny-q4_k_m
    OMP_WAIT_POLICY=passive TPI_TEST_BACKEND=cuda TPI_TEST_COMM=mpi bounded test-parallel-mpi 120 \
        "$OUT/ctest.log" mpirun -np "$NP" --bind-to none "$BUILD/tests/test_parallel_np2" \
        "${NP}x1,1x${NP}" qwen3-tiny-bf16 qwen3-tiny-q4_k_m
fi

# ---- comm ----
if has_step comm; then
    # small sums take the peer all-reduce (kern_peer_ar.cu), large ones NCCL; odd sizes
    # (3, 9, 27, ... floats) take its scalar path; every size is checked (#wrong)
    bounded comm-nccl 60 "$OUT/comm.log" "${LOCAL[@]}" --tp "$NP" -- comm --comm nccl -b 1K -e 256M
    bounded comm-nccl-odd 60 "$OUT/comm.log" "${LOCAL[@]}" --tp "$NP" -- comm --comm nccl -b 12 \
        -e 1M -f 3
    TPI_PEER_AR=0 bounded comm-nccl-only 60 "$OUT/comm.log" "${LOCAL[@]}" --tp "$NP" -- comm \
        --comm nccl -b 1K -e 1M
    bounded comm-mpi 60 "$OUT/comm.log" "${LOCAL[@]}" --tp "$NP" -- comm --comm mpi --backend cuda \
        -b 1K -e 16M
fi

BENCH="$OUT/bench.log"
BARGS=(-p 512 -n 128 -r "$REPS" -o md --roofline-gbps 4000)
# bench_grid NAME MODEL TP PP [ENV=V ...] [-- extra bench args]
bench_grid() {
    local name=$1 model=$2 tp=$3 pp=$4
    shift 4
    local envs=() extra=()
    while (($#)) && [ "$1" != "--" ]; do envs+=("$1"); shift; done
    (($#)) && shift
    extra=("$@")
    if [ "$tp" = 1 ] && [ "$pp" = 1 ]; then
        bounded "$name" 120 "$BENCH" env "${envs[@]}" "$TPINFER" bench -m "$model" "${BARGS[@]}" \
            "${extra[@]}"
    else
        bounded "$name" 150 "$BENCH" env "${envs[@]}" "${LOCAL[@]}" --tp "$tp" --pp "$pp" -- bench \
            -m "$model" "${BARGS[@]}" "${extra[@]}"
    fi
}

# ---- bench8 ----
if has_step bench8; then
    for t in $TYPES8; do
        name=qwen3-8b-$t
        wait_model "$name" || { note "$name: no model"; continue; }
        f=$(model_of "$name")
        bench_grid "8b-$t-tp1" "$f" 1 1
        bench_grid "8b-$t-tp$NP-nccl" "$f" "$NP" 1
        [ "$NCCL_ONLY" = 1 ] && bench_grid "8b-$t-tp$NP-nccl-only" "$f" "$NP" 1 TPI_PEER_AR=0
        bench_grid "8b-$t-tp$NP-noAR" "$f" "$NP" 1 TPI_TP_SKIP_ALLREDUCE=1
        bench_grid "8b-$t-pp$NP-nccl" "$f" 1 "$NP"
        if [ "$MPI_RUNS" = 1 ]; then
            bench_grid "8b-$t-tp$NP-mpi" "$f" "$NP" 1 -- --comm mpi -r 2
            bench_grid "8b-$t-pp$NP-mpi" "$f" 1 "$NP" -- --comm mpi -r 2
        fi
    done
    f=$(model_of qwen3-8b-q4_k_m)
    if [ -s "$f" ]; then
        bench_grid "8b-q4_k_m-tp1-d8192" "$f" 1 1 -- -d 8192 -r 2
        bench_grid "8b-q4_k_m-tp$NP-d8192" "$f" "$NP" 1 -- -d 8192 -r 2
    fi
fi

# ---- batch ----
if has_step batch && wait_model qwen3-8b-q4_k_m; then
    f=$(model_of qwen3-8b-q4_k_m)
    PARALLEL=32 DRIVER="$TPINFER" EXTRA="--backend cuda" bounded batch-tp1 120 "$OUT/batch.log" \
        bash bench/batch-bench.sh "$f" 256 64
    PARALLEL=32 DRIVER="$TPINFER" EXTRA="--backend cuda --tp $NP" \
        LAUNCH="mpirun -np $NP --bind-to none" bounded "batch-tp$NP" 120 "$OUT/batch.log" \
        bash bench/batch-bench.sh "$f" 256 64
fi

# ---- bench32 ----
if has_step bench32 && wait_model qwen3-32b-bf16; then
    f=$(model_of qwen3-32b-bf16)
    BARGS=(-p 512 -n 128 -r 2 -o md --roofline-gbps 4000)
    bench_grid "32b-bf16-tp1" "$f" 1 1
    bench_grid "32b-bf16-tp$NP-nccl" "$f" "$NP" 1
    bench_grid "32b-bf16-tp$NP-noAR" "$f" "$NP" 1 TPI_TP_SKIP_ALLREDUCE=1
    [ "$NCCL_ONLY" = 1 ] && bench_grid "32b-bf16-tp$NP-nccl-only" "$f" "$NP" 1 TPI_PEER_AR=0
    bench_grid "32b-bf16-pp$NP-nccl" "$f" 1 "$NP"
fi

if kill -0 $MK_PID 2>/dev/null; then
    note "mkmodel: still writing (left running for a next call)"
fi

# ---- summary ----
{
    echo
    echo "== GPU tests"
    ctest_summary "$OUT/ctest.log" \
        "tp=[0-9]+ pp=[0-9]+.*(logits|margin|range)|FAIL|SKIP|peer all-reduce|failure|^=== "
    echo
    echo "== comm (size, busbw)"
    grep -E "^=== |PASS|FAIL|peer all-reduce|^ +(allreduce|allgather|sendrecv) " "$OUT/comm.log" \
        2>/dev/null | awk '$1 != "allgather" && $1 != "sendrecv"' | head -120
    echo
    echo "== bench rows (=== names the run)"
    grep -E "^=== |\| *(pp512|tg128)|error|peer all-reduce" "$BENCH" 2>/dev/null | sed -E 's/ \(limit.*//'
    echo
    echo "== batch"
    grep -E "^model |^[0-9]+ " "$OUT/batch.log" 2>/dev/null | sed 's/^/   /'
    echo
    cat "$MLOG" 2>/dev/null
    echo "total: $(elapsed) s"
} >>"$SUM"
cat "$SUM"
pack_logs
