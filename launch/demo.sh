#!/usr/bin/env bash
# demo.sh — the default job: make a small synthetic Qwen3 model once, then show it.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
bin=build/tpinfer
mkdir -p build/demo
model=build/demo/qwen3-demo-q8_0.gguf
if [ ! -f "$model" ]; then
    echo "demo: writing $model" >&2
    $bin mkmodel -o "$model" --arch qwen3 --type q8_0 --layers 4 --embd 256 --heads 4 \
        --kv-heads 2 --head-dim 64 --ff 512 --seed 1
fi
$bin info "$model"
