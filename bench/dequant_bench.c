/*
 * dequant_bench.c — host speed of each block type's dequantization (quant.h's
 * to_f32), the CPU backend's inner loop: cpu_matmul turns a few weight rows at a
 * time into f32 and dots them, so a decode step on the CPU runs at the speed of
 * this loop wherever it is slower than the memory. Each type's source is 256 MiB
 * of quantized bytes (out of any cache, as a model's weights are in decode),
 * quantized from a fixed random sequence of values, dequantized 4096 values at a
 * time into one small buffer (as cpu_matmul's per-thread scratch). Prints source
 * bytes per second, time per value and an FNV hash of every value produced, so a
 * change of a to_f32 loop shows both its speed and whether it gives the same bits.
 * `--mib N` sets the source size (e.g. 8 to time the loops from cache).
 *
 *   build/bench_dequant [--type NAME] [--reps R] [--mib N]
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/quant.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const char *only = NULL;
    int reps = 3, mib = 256;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--type") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--mib") && i + 1 < argc) mib = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_dequant [--type NAME] [--reps R] [--mib N]\n");
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    if (mib < 1) mib = 1;
    const int64_t chunk = 4096;
    const int64_t n = (int64_t)1 << 20; /* values quantized at a time, repeated to fill */
    const int64_t n_src = 2 * n;
    float *src = malloc(sizeof *src * (size_t)n_src);
    float *buf = malloc(sizeof *buf * (size_t)chunk);
    if (!src || !buf) return 1;
    uint64_t st = 12345;
    for (int64_t i = 0; i < n_src; i++) { /* uniform in [-1, 1) with a few larger values */
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        src[i] = (float)((double)(st >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        if ((st >> 60) == 0) src[i] *= 8.0f;
    }
    printf("| type | source MiB | GB/s of source | ns / value | fnv of the values |\n");
    printf("| --- | ---: | ---: | ---: | --- |\n");
    for (int t = 0; t < TPI_TYPE_COUNT; t++) {
        const struct quant_traits *tr = quant_traits(t);
        if (!tr || !tr->supported || !tr->to_f32 || !tr->from_f32) continue;
        if (only && quant_type_from_name(only) != t) continue;
        const size_t part = quant_row_size(t, n), n_parts = ((size_t)mib << 20) / part + 1;
        const size_t bytes = part * n_parts;
        const int64_t n_vals = n * (int64_t)n_parts;
        uint8_t *q = malloc(bytes);
        if (!q) return 1;
        for (size_t k = 0; k < n_parts; k++) /* the values, shifted a little each part */
            tr->from_f32(src + (k * 4099) % (size_t)(n_src - n), q + k * part, n);
        const size_t chunk_bytes = quant_row_size(t, chunk);
        uint64_t h = TPI_FNV_INIT; /* an untimed pass hashes the values */
        for (int64_t c = 0; c < n_vals / chunk; c++) {
            tr->to_f32(q + (size_t)c * chunk_bytes, buf, chunk);
            h = tpi_fnv1a(h, buf, sizeof *buf * (size_t)chunk);
        }
        double best = 1e30;
        for (int r = 0; r < reps; r++) {
            const double t0 = now_s();
            for (int64_t c = 0; c < n_vals / chunk; c++)
                tr->to_f32(q + (size_t)c * chunk_bytes, buf, chunk);
            const double dt = now_s() - t0;
            best = dt < best ? dt : best;
        }
        printf("| %s | %.1f | %.2f | %.3f | %016llx |\n", tr->name, (double)bytes / 1048576.0,
               (double)bytes / best * 1e-9, best / (double)n_vals * 1e9, (unsigned long long)h);
        free(q);
    }
    free(src);
    free(buf);
    return 0;
}
