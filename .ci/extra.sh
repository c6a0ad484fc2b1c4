#!/usr/bin/env bash
# CI extras: unit tests again under AddressSanitizer + UBSan (CPU only), and the
# GGUF reader's libFuzzer target for 60 s when clang is present.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-asan -G Ninja -DTPI_CUDA=OFF -DTPI_SANITIZE=ON -DTPI_WERROR=ON \
    -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-asan -j 2 >/dev/null
ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-asan --output-on-failure -j 2 -L unit
if command -v clang >/dev/null; then
    CC=clang cmake -S . -B build-fuzz -G Ninja -DTPI_CUDA=OFF -DTPI_FUZZ=ON -DTPI_TESTS=OFF \
        -DCMAKE_BUILD_TYPE=Debug >/dev/null
    cmake --build build-fuzz -j 2 --target fuzz_gguf >/dev/null
    mkdir -p build-fuzz/corpus
    cp tests/data/*.gguf build-fuzz/corpus/ 2>/dev/null || true
    build-fuzz/fuzz_gguf -max_total_time=60 -max_len=65536 -rss_limit_mb=2048 build-fuzz/corpus
else
    echo "ci: clang not found, fuzz run skipped" >&2
fi
