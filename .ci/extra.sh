#!/usr/bin/env bash
# CI extras: the single-process unit tests again under AddressSanitizer + UBSan (CPU
# build), and the GGUF reader's libFuzzer target when clang is present: once over the
# inputs in tests/fuzz/regress/, then 60 s of new inputs.
set -euo pipefail
cd "$(dirname "$0")/.."
here=$(pwd)
cmake -S . -B build-asan -G Ninja -DTPI_CUDA=OFF -DTPI_SANITIZE=ON -DTPI_WERROR=ON \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-asan -j 2 >/dev/null
# Multi-rank tests stay out: they repeat the same code under mpirun, many times slower.
# Tests that start MPI run without the leak check: Open MPI's plugins leak at exit from
# code LeakSanitizer cannot name (unloaded modules), so no suppression can match them.
export UBSAN_OPTIONS=print_stacktrace=1
ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$here/.ci/lsan.supp \
    ctest --test-dir build-asan --output-on-failure -j 2 -L unit \
    -R '^(test_core|test_gguf|test_gguf_broken|test_quant|test_mkmodel|test_tokenizer|test_tokenizer_cli|test_ops_cpu|test_model|test_model_logits_qwen2-tiny-q4_0|test_model_logits_qwen3-tiny-q4_k_m)$'
ASAN_OPTIONS=detect_leaks=0 \
    ctest --test-dir build-asan --output-on-failure -j 2 -L unit -R '^(test_batch|test_grid)$'
if command -v clang >/dev/null; then
    CC=clang cmake -S . -B build-fuzz -G Ninja -DTPI_CUDA=OFF -DTPI_FUZZ=ON -DTPI_TESTS=OFF \
        -DCMAKE_BUILD_TYPE=Debug >/dev/null
    cmake --build build-fuzz -j 2 --target fuzz_gguf >/dev/null
    # Inputs that once failed run first, each once; then 60 s of new inputs. A report
    # is printed whole (the last lines alone are the statistics, not the finding).
    build-fuzz/fuzz_gguf tests/fuzz/regress/* >build-fuzz/regress.log 2>&1 ||
        { cat build-fuzz/regress.log; exit 1; }
    mkdir -p build-fuzz/corpus
    cp tests/data/qwen2-tiny-q4_0.gguf build-fuzz/corpus/ 2>/dev/null || true
    if ! build-fuzz/fuzz_gguf -max_total_time=60 -max_len=65536 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix=build-fuzz/ build-fuzz/corpus >build-fuzz/fuzz.log 2>&1; then
        grep -v '^#[0-9]' build-fuzz/fuzz.log | tail -60
        exit 1
    fi
    tail -5 build-fuzz/fuzz.log
else
    echo "ci: clang not found, fuzz run skipped" >&2
fi
