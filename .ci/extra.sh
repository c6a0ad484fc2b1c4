#!/usr/bin/env bash
# CI extras: the single-process unit tests again under AddressSanitizer + UBSan (CPU
# build), one TP/PP pass on 2 and 4 ranks under them, and when clang is present the
# libFuzzer targets (tests/fuzz/): each once over the inputs in tests/fuzz/regress/ that
# failed it before, then 45 s of new inputs.
set -euo pipefail
cd "$(dirname "$0")/.."
here=$(pwd)
cmake -S . -B build-asan -G Ninja -DTPI_CUDA=OFF -DTPI_SANITIZE=ON -DTPI_WERROR=ON \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-asan -j 2 >/dev/null
# The multi-rank ctest tests stay out (the same code under mpirun, many times slower);
# one short pass of them follows below.
# Tests that start MPI run without the leak check: Open MPI's plugins leak at exit from
# code LeakSanitizer cannot name (unloaded modules), so no suppression can match them.
export UBSAN_OPTIONS=print_stacktrace=1
ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$here/.ci/lsan.supp \
    ctest --test-dir build-asan --output-on-failure -j 2 -L unit \
    -R '^(test_core|test_gguf|test_gguf_broken|test_quant|test_mkmodel|test_tokenizer|test_tokenizer_cli|test_ops_cpu|test_model|test_model_logits_qwen2-tiny-q4_0|test_model_logits_qwen3-tiny-q4_k_m)$'
ASAN_OPTIONS=detect_leaks=0 \
    ctest --test-dir build-asan --output-on-failure -j 2 -L unit -R '^(test_batch|test_grid)$'
# The sharded paths (slices, off-edge F32 expansion, vocab-parallel lm_head, stage send/recv)
# run only on several ranks: one short TP/PP pass of them under the sanitizers (~30 s), on
# two models that tests/data holds too.
ASAN_OPTIONS=detect_leaks=0 OMPI_MCA_mpi_yield_when_idle=1 OMP_WAIT_POLICY=passive \
    mpiexec --oversubscribe --bind-to none -np 2 build-asan/tests/test_parallel_np2 2x1,1x2 \
    qwen3-tiny-q4_k_m qwen2-tiny-q4_0
ASAN_OPTIONS=detect_leaks=0 OMPI_MCA_mpi_yield_when_idle=1 OMP_WAIT_POLICY=passive \
    mpiexec --oversubscribe --bind-to none -np 4 build-asan/tests/test_parallel_np2 2x2 \
    qwen3-tiny-q4_k_m
if command -v clang >/dev/null; then
    CC=clang cmake -S . -B build-fuzz -G Ninja -DTPI_CUDA=OFF -DTPI_FUZZ=ON -DTPI_TESTS=OFF \
        -DCMAKE_BUILD_TYPE=Debug >/dev/null
    cmake --build build-fuzz -j 2 --target fuzz_gguf fuzz_model fuzz_requests >/dev/null
    # Each target: the inputs that once failed it, each once; then 45 s of new inputs
    # from its seeds. A report is printed whole (its last lines are only statistics).
    for t in fuzz_gguf fuzz_model fuzz_requests; do
        if compgen -G "tests/fuzz/regress/$t-*" >/dev/null; then
            build-fuzz/$t tests/fuzz/regress/$t-* >build-fuzz/$t-regress.log 2>&1 ||
                { cat build-fuzz/$t-regress.log; exit 1; }
        fi
        mkdir -p build-fuzz/$t-corpus
        case $t in
            fuzz_requests) cp tests/fuzz/seeds/requests/* build-fuzz/$t-corpus/ ;;
            *) cp tests/fuzz/seeds/*.gguf build-fuzz/$t-corpus/ ;;
        esac
        if ! build-fuzz/$t -max_total_time=45 -max_len=65536 -rss_limit_mb=2048 \
            -print_final_stats=1 -artifact_prefix=build-fuzz/$t- build-fuzz/$t-corpus \
            >build-fuzz/$t.log 2>&1; then
            grep -v '^#[0-9]' build-fuzz/$t.log | tail -60
            exit 1
        fi
        echo "$t: $(grep -m1 '^Done' build-fuzz/$t.log)"
    done
else
    echo "ci: clang not found, fuzz runs skipped" >&2
fi
