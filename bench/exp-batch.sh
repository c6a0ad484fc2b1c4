#!/bin/bash
# The batch command's steps on the GPU (bench/NOTES.md changes 152-153), one device call
# each on the synthetic 8B Q4_K_M (made there), the tree built there (Release, sm_90):
#   PART=T: where the batch command's time goes. bench/batch-bench.sh at --parallel 32
#     (PARALLEL), plain, then once more with bench/step_trace.c's CUPTI library loaded
#     (.dev/libstep_trace.so beside the libcupti.so.13 it was linked against, both built or
#     copied on the CPU machine, README "A step's kernel timeline"; the copies and the
#     host's CUDA calls recorded too): bench/step_trace.py's whole-process shares by kernel
#     (--totals, with the copies and host calls inside the gaps between steps) and its
#     report of the most common step (the decode steps at full width). ~4 min.
#   PART=R: change 152, Q6_K's groups in kern_mmq's raw path: test_ops_cuda's matmul_Q6_K
#     and matmul_Q4_K groups (default, and TPI_MMQ_RAW=0: their _noraw ctest entries) and
#     test_ops_fused_cuda; the product
#     bench at 16 and 32 rows with TPI_MMQ_RAW=1 (Q4_K's raw path only: main's) and the
#     default; then batch-bench at --parallel 32 alternating the two (KR rounds, default
#     2), and PART=T's trace of the default. ~6 min.
#   PART=H: change 153, the logits' copy to the host: bench/d2h_bench.cu (built there with
#     nvcc) on cudaHostAlloc'd, huge-page registered and malloc'd memory, then batch-bench
#     at --parallel 32 alternating TPI_PINNED_HOST=1 (cudaHostAlloc, the default) and 0
#     (malloc), KR rounds (default 2). ~4 min. (Run 260 alternated a third form, the
#     logits buffer in huge pages registered, since removed: level on its machine.)
#   PART=K: change 154, the logits left on the device (each row's 64 best there, whole
#     rows copied out only for the samplers that need them): ctest's ops_cuda_elem (row_top
#     against the CPU's), test_model and the batch entries (test_keep: the records with
#     and without, on CUDA); d2h_bench (is this machine's copy slow?); batch-bench at
#     --parallel 32 alternating TPI_LOGITS_KEEP=0 (every row copied whole: main's) and the
#     default, greedy, KR rounds (default 2), then once each at TEMP=0.8 (top-k 40's
#     chain); the two again at --parallel 1 on N_ONE prompts (24); the trace of the
#     default if time is left. ~6 min. (Runs 261-262 also ran row_top's segments path,
#     since removed.)
#   PART=P: `run -p` with its decode steps' logits kept and copied whole, the same text
#     (tiny models and the 8B; greedy, sampled, penalties, no top-k, logprobs), and
#     test_model_gpu. ~4 min.
#   PART=O: PART=K's comparison of the logits kept and copied whole in both orders, KR
#     rounds (default 2) at --parallel 32 and two at --parallel 1; no tests. ~5 min.
#   PART=W: changes 155-161, kern_mmq's raw kernels (Q4_K and Q6_K's groups up to 32 rows)
#     held to 3 blocks an SM and reading x permuted as the launch before rounds it (or, 161,
#     as rmsnorm and silu*mul wrote it: TPI_XP_MEMO), k's slices added by each column's
#     last block where a column's are at most TPI_MMQ_FIXUP KiB (157, 159: default 64, 0
#     never), steps of up to 32 tokens as graphs (158, 160: the default;
#     TPI_GRAPH_TOKENS=8 the earlier one): ctest's elem group, matmul_Q4_K/Q6_K (and
#     _noraw), ops_fused_cuda (test_graph_mmq_stale_cuda and test_xp_memo_cuda too) and
#     test_model_gpu (its wide graphs too) by default, the matmul and fused entries again
#     with TPI_MMQ_FIXUP=0 (FIXUP0=0: not; TESTS_RE: another ctest -R for the first pass); batch-bench at --parallel 32 in BFORMS
#     (TPI_GRAPH_TOKENS=8, then the default), in both orders, KR rounds (default 1; none begun after STOP_AT s,
#     420), and each form's records against the first's; then, while time is left (none
#     begun after PROD_STOP_AT s, 500), the product bench at 16 and 32 rows in FORMS
#     (TPI_MMQ_FIXUP 0 and 64; BPS_TOO=1: the default at TPI_MMQ_BPS 2 and 4 too) and,
#     NCU=1, ncu's warp states of the 32-row Q4_K 4096->12288 kernel before change 155 and
#     now. ~6 min. (Run 265 ran the knobs' first forms, of fd2d7be's and the next
#     commits' tree: TPI_MMQ_WARPS 3 or 8, TPI_MMQ_XP by a launch of its own; run 266 the
#     forms before and after each of changes 155-158, TPI_MMQ_HOLD=7 too; run 267
#     TPI_MMQ_FIXUP 0, 64 and 1024.)
#   env: N_PROMPTS (256), MAX_TOKENS (64), PARALLEL ("32"), TYPE (q4_k_m)
# Logs (and the trace, xz) under $OUT.
# shellcheck source=bench/gpu-lib.sh
. "$(dirname "$0")/gpu-lib.sh"
device_prep
export PATH=/usr/local/cuda/bin:$PATH
t=${TYPE:-q4_k_m}
n=${N_PROMPTS:-256}
m=${MAX_TOKENS:-64}
targets=tpinfer
[ "${PART:-T}" = R ] && targets="tpinfer test_ops_cuda_elem test_ops_fused"
[ "${PART:-T}" = K ] && targets="tpinfer test_ops_cuda_elem test_model test_batch"
[ "${PART:-T}" = P ] && targets="tpinfer test_model_gpu"
[ "${PART:-T}" = W ] && targets="tpinfer test_ops_cuda_elem test_ops_fused test_model_gpu"
# shellcheck disable=SC2086
cmake -S . -B build -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
    >"$OUT/build.log" 2>&1 && cmake --build build -j 16 --target $targets >>"$OUT/build.log" 2>&1 ||
    { tail -20 "$OUT/build.log"; exit 1; }
echo "built $targets at $(git rev-parse --short HEAD) + $(git status --short | wc -l) changed files (${SECONDS}s)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
mk() { [ -s "/tmp/$t.gguf" ] || build/tpinfer mkmodel --preset qwen3-8b --type "$t" -o "/tmp/$t.gguf" -q; }
bb() { # bb LABEL [VAR=VALUE...]: one batch-bench run at --parallel ${PARALLEL:-32}
    local label=$1
    shift
    echo "== $label $*"
    env "$@" EXTRA="--backend cuda" PARALLEL="${PARALLEL:-32}" \
        bash bench/batch-bench.sh "/tmp/$t.gguf" "$n" "$m" | tail -1 | tee -a "$OUT/batch.txt"
}
trace() { # batch-bench under the CUPTI library, then its reports
    if [ ! -s .dev/libstep_trace.so ]; then
        echo "no .dev/libstep_trace.so: no trace"
        return
    fi
    bb traced CUDA_INJECTION64_PATH="$PWD/.dev/libstep_trace.so" STEP_TRACE_OUT="$OUT/trace.tsv" \
        STEP_TRACE_MEMCPY=1 STEP_TRACE_API=1
    python3 bench/step_trace.py "$OUT/trace.tsv" --totals --top 40 | tee "$OUT/totals.txt" |
        grep -v "^ *[0-9]* *[0-9.]* *[0-9.]* *0\.[0-9]%  nvjet"
    echo "== the most common step"
    python3 bench/step_trace.py "$OUT/trace.tsv" --min-kernels 50 >"$OUT/steps.txt"
    head -30 "$OUT/steps.txt" # (a pipe into head would cut the file short)
    xz -T4 -6 "$OUT/trace.tsv"
}
case ${PART:-T} in
T)
    mk || exit 1
    bb plain
    trace
    ;;
R)
    # the ctest entries: matmul_Q6_K and matmul_Q4_K by default and _noraw (TPI_MMQ_RAW=0)
    (cd build && ctest -V -R "ops_cuda_matmul_Q[46]_K|ops_fused_cuda") >"$OUT/tests.log" 2>&1 &
    TP=$!
    mk || exit 1
    wait $TP
    grep -E "worst|tests passed|tests failed|\*\*\*Failed|Test +#" "$OUT/tests.log" | sed -E 's/^[0-9]+: //'

    for raw in 1 3; do
        echo "== product bench, TPI_MMQ_RAW=$raw"
        TPI_MMQ_RAW=$raw TPI_BENCH_TYPES=Q4_K,Q6_K TPI_BENCH_ROWS=16,32 TPI_BENCH_ATTN=none \
            CK_FORK=no build/tests/test_ops_cuda_elem bench 2>&1 | grep -vE "^(Running|100%)" | tail -24
    done
    for r in $(seq "${KR:-2}"); do
        bb "round $r main's (Q4_K raw only)" TPI_MMQ_RAW=1
        bb "round $r Q6_K's groups raw too" TPI_MMQ_RAW=3
    done
    echo "at ${SECONDS}s"
    [ "$SECONDS" -lt 420 ] && trace
    ;;
K)
    (cd build && ctest -R "ops_cuda_elem|^test_model$|test_batch_") >"$OUT/tests.log" 2>&1 &
    TP=$!
    nvcc -O2 -o /tmp/d2h_bench bench/d2h_bench.cu && /tmp/d2h_bench 32 4 1 | tee "$OUT/d2h.txt"
    mk || exit 1
    wait $TP
    grep -E "tests passed|tests failed|\*\*\*Failed|Test +#" "$OUT/tests.log"
    for r in $(seq "${KR:-2}"); do
        bb "round $r every row whole (main's)" TPI_LOGITS_KEEP=0
        bb "round $r kept on the device" TPI_LOGITS_KEEP=1
    done
    bb "top-k 40 chain, every row whole" TPI_LOGITS_KEEP=0 TEMP=0.8
    bb "top-k 40 chain, kept" TPI_LOGITS_KEEP=1 TEMP=0.8
    # one sequence at a time: a row a step, where row_top's latency shows
    n=${N_ONE:-24}
    PARALLEL=1 bb "--parallel 1, every row whole" TPI_LOGITS_KEEP=0
    PARALLEL=1 bb "--parallel 1, kept" TPI_LOGITS_KEEP=1
    n=${N_PROMPTS:-256}
    echo "at ${SECONDS}s"
    [ "$SECONDS" -lt 400 ] && trace
    ;;
O)
    # PART=K's pairs in both orders (run 262 found the later run of a round faster)
    mk || exit 1
    for r in $(seq "${KR:-2}"); do
        bb "round $r whole first" TPI_LOGITS_KEEP=0
        bb "round $r then kept" TPI_LOGITS_KEEP=1
        bb "round $r kept first" TPI_LOGITS_KEEP=1
        bb "round $r then whole" TPI_LOGITS_KEEP=0
    done
    n=${N_ONE:-24}
    PARALLEL=1 bb "--parallel 1, kept first" TPI_LOGITS_KEEP=1
    PARALLEL=1 bb "--parallel 1, then whole" TPI_LOGITS_KEEP=0
    PARALLEL=1 bb "--parallel 1, whole first" TPI_LOGITS_KEEP=0
    PARALLEL=1 bb "--parallel 1, then kept" TPI_LOGITS_KEEP=1
    ;;
P)
    # run -p's decode steps kept on the device: the same text as every row whole
    (cd build && ctest -R "^test_model_gpu$|test_model_gpu_qwen3-tiny-q4_k_m$") >"$OUT/tests.log" 2>&1 &
    TP=$!
    mk || exit 1
    bad=0
    for mdl in tests/data/qwen3-tiny-q4_k_m.gguf tests/data/qwen2-tiny-q4_0.gguf "/tmp/$t.gguf"; do
        for opts in "--temp 0" "--temp 0.8 --seed 5" "--temp 0.7 --top-k 20 --repeat-penalty 1.3 --seed 6" \
            "--temp 1 --top-k 0 --seed 7" "--temp 0 --logprobs 3"; do
            a=$(build/tpinfer run -m "$mdl" -p "the quick brown fox" -n 48 $opts 2>/dev/null | md5sum)
            b=$(TPI_LOGITS_KEEP=0 build/tpinfer run -m "$mdl" -p "the quick brown fox" -n 48 $opts \
                2>/dev/null | md5sum)
            [ "$a" = "$b" ] && r=same || { r=DIFFERENT; bad=1; }
            echo "run -p $(basename "$mdl") $opts: kept and whole $r"
        done
    done
    wait $TP
    grep -E "tests passed|tests failed|\*\*\*Failed|Test +#" "$OUT/tests.log"
    [ $bad = 0 ] || exit 1
    ;;
W)
    # each form's variables, comma-separated
    V=${FORMS:-"TPI_MMQ_FIXUP=0 TPI_MMQ_FIXUP=64"}
    [ "${BPS_TOO:-0}" = 1 ] && V="$V TPI_MMQ_BPS=2 TPI_MMQ_BPS=4" # product bench only
    (cd build && ctest -V -R "${TESTS_RE:-test_ops_cuda_elem$|ops_cuda_matmul_Q[46]_K|ops_fused_cuda|test_model_gpu}" &&
        if [ "${FIXUP0:-1}" = 1 ]; then
            TPI_MMQ_FIXUP=0 ctest -V -R "ops_cuda_matmul_Q[46]_K$|ops_fused_cuda"
        fi) >"$OUT/tests.log" 2>&1 &
    TP=$!
    mk || exit 1
    wait $TP
    grep -E "worst|tests passed|tests failed|\*\*\*Failed" "$OUT/tests.log" | sed -E 's/^[0-9]+: //'
    for r in $(seq "${KR:-1}"); do
        # shellcheck disable=SC2046
        VB=${BFORMS:-"TPI_GRAPH_TOKENS=8 TPI_MMQ_FIXUP=64"}
        for v in $VB $(tr ' ' '\n' <<<"$VB" | tac); do
            [ "$SECONDS" -lt "${STOP_AT:-420}" ] || break
            # shellcheck disable=SC2046
            bb "round $r $v" $(tr , ' ' <<<"$v") KEEP_OUT="/tmp/out-$v"
        done
    done
    # the same records (ids and tokens) in every form
    python3 - ${BFORMS:-TPI_GRAPH_TOKENS=8 TPI_MMQ_FIXUP=64} <<'PY'
import json, os, sys
def toks(v):
    with open(f"/tmp/out-{v}-32.jsonl") as f:
        return sorted((r["id"], tuple(r["tokens"])) for r in map(json.loads, f))
if not os.path.exists(f"/tmp/out-{sys.argv[1]}-32.jsonl"):
    print(f"records: no batch-bench run of {sys.argv[1]}")
    sys.exit(0)
base = toks(sys.argv[1])
for v in sys.argv[2:]:
    if not os.path.exists(f"/tmp/out-{v}-32.jsonl"): continue
    print(f"records {v}: {'the same as' if toks(v) == base else 'DIFFERENT from'} {sys.argv[1]}'s")
PY
    # then the product bench and ncu while time is left (none begun after PROD_STOP_AT s)
    for v in $V; do
        [ "$SECONDS" -lt "${PROD_STOP_AT:-500}" ] || break
        echo "== product bench, $v"
        # shellcheck disable=SC2046
        env $(tr , ' ' <<<"$v") TPI_BENCH_TYPES=Q4_K,Q6_K TPI_BENCH_ROWS=16,32 TPI_BENCH_ATTN=none \
            TPI_BENCH_SHAPES=4096x4096,4096x1024,4096x12288,12288x4096 CK_FORK=no \
            build/tests/test_ops_cuda_elem bench 2>&1 | grep "bench matmul" | sed -E 's/ +\(.*//'
    done
    if [ "${NCU:-0}" = 1 ] && command -v ncu >/dev/null && [ "$SECONDS" -lt "${PROD_STOP_AT:-500}" ]; then
        for v in "TPI_MMQ_HOLD=0,TPI_MMQ_XP=0" TPI_MMQ_XP=1; do
            echo "== ncu Q4_K 4096x12288 32 rows, $v"
            # shellcheck disable=SC2046
            env $(tr , ' ' <<<"$v") TPI_BENCH_TYPES=Q4_K TPI_BENCH_SHAPES=4096x12288 \
                TPI_BENCH_ROWS=32 TPI_BENCH_ATTN=none CK_FORK=no timeout 120 ncu \
                --clock-control none -k regex:mmq_kernel --launch-skip 3 --launch-count 1 \
                --section SpeedOfLight --section WarpStateStats --section Occupancy \
                --section SchedulerStats --section MemoryWorkloadAnalysis \
                build/tests/test_ops_cuda_elem bench >"$OUT/ncu.log" 2>&1
            grep -E "Duration|Registers Per|Achieved Occ|No Eligible|Warp Cycles Per Issued|DRAM Throughput|L2 Cache Throughput" \
                "$OUT/ncu.log" | head -8
        done
    fi
    ;;
H)
    nvcc -O2 -o /tmp/d2h_bench bench/d2h_bench.cu && /tmp/d2h_bench 32 4 1 | tee "$OUT/d2h.txt"
    mk || exit 1
    for r in $(seq "${KR:-2}"); do
        for hp in 1 0; do
            bb "round $r TPI_PINNED_HOST=$hp" TPI_PINNED_HOST=$hp
        done
    done
    ;;
esac
echo "done at ${SECONDS}s"
