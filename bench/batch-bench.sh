#!/usr/bin/env bash
# batch-bench.sh — throughput of the batch prompt-file command: the same mixed-length
# prompt file at --parallel 1 and --parallel 32, generated tokens/s for both.
#
#   bench/batch-bench.sh [MODEL.gguf] [N_PROMPTS] [MAX_TOKENS]
#   env: DRIVER (default build/tpinfer),
#        TEMP (sampling temperature, default 0: greedy; 0.8 runs the default top-k chain),
#        EXTRA (more options, e.g. "--backend cuda" or "--tp 2" under LAUNCH),
#        LAUNCH (e.g. "mpirun -np 2"), PARALLEL (default "1 32"),
#        KEEP_OUT (a path prefix: each run's records kept as PREFIX-PARALLEL.jsonl)
# Defaults are CI-sized: the tiny test model, 64 prompts, 16 tokens each. The full
# form is 256 prompts: bench/batch-bench.sh model.gguf 256 128
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
model=${1:-$here/tests/data/qwen3-tiny-q4_k_m.gguf}
n=${2:-64}
max_tokens=${3:-16}
driver=${DRIVER:-$here/build/tpinfer}
parallel=${PARALLEL:-"1 32"}
temp=${TEMP:-0}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Mixed lengths: 4 to ~400 words, deterministic.
words=(the quick brown fox jumps over a lazy dog while rain falls on green hills)
for ((i = 0; i < n; i++)); do
  len=$(( 4 + (i * 37) % 97 ))
  (( i % 8 == 0 )) && len=$(( len * 4 ))
  p=""
  for ((w = 0; w < len; w++)); do p+="${words[$(( (i * 3 + w * 5) % 15 ))]} "; done
  printf '{"id": "b%d", "prompt": "%s"}\n' "$i" "$p"
done > "$tmp/prompts.jsonl"

echo "model $(basename "$model"), $n prompts, -n $max_tokens, --temp $temp ${EXTRA:-}"
printf '%-10s %10s %12s %12s %10s %14s %10s %10s %14s\n' parallel wall_s gen_tok/s total_tok/s \
  requests steps/decode forward_s sample_s graphs/recorded
for p in $parallel; do
  ${LAUNCH:-} "$driver" run -m "$model" -f "$tmp/prompts.jsonl" -o "$tmp/out-$p.jsonl" \
    -n "$max_tokens" --temp "$temp" --parallel "$p" ${EXTRA:-} 2> "$tmp/err-$p.txt"
  line=$(grep '^batch summary' "$tmp/err-$p.txt")
  wall=$(sed -E 's/.*wall ([0-9.]+) s.*/\1/' <<< "$line")
  gen=$(sed -E 's/.* ([0-9.]+) generated tok\/s.*/\1/' <<< "$line")
  tot=$(sed -E 's/.* ([0-9.]+) total tok\/s.*/\1/' <<< "$line")
  steps=$(sed -E 's/.*, ([0-9]+) steps \(([0-9]+) decode only\).*/\1\/\2/' <<< "$line")
  fwd=$(sed -E 's/.*forward ([0-9.]+) s.*/\1/' <<< "$line")
  smp=$(sed -E 's/.*sampling ([0-9.]+) s.*/\1/' <<< "$line")
  gr=$(sed -nE 's/.*, ([0-9]+) steps as graph launches \(([0-9]+) recorded\).*/\1\/\2/p' <<< "$line")
  if [ -n "${KEEP_OUT:-}" ]; then cp "$tmp/out-$p.jsonl" "$KEEP_OUT-$p.jsonl"; fi
  printf '%-10s %10s %12s %12s %10s %14s %10s %10s %14s\n' "$p" "$wall" "$gen" "$tot" \
    "$(wc -l < "$tmp/out-$p.jsonl")" "$steps" "$fwd" "$smp" "${gr:--}"
done
