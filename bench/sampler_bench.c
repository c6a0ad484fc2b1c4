/*
 * sampler_bench.c — host time of one sampler_sample call over a Qwen-sized
 * vocabulary (151,936 logits), per filter mix, and of the logprobs a request
 * may ask for beside it. The batch command samples every sequence of a step on
 * one rank, so this time adds to each decode step once per sequence in flight.
 * Logits are random normal (sd given by --sd, default 3: a flat distribution,
 * the worst case for top-p) with a fixed seed.
 *
 *   build/bench_sampler [--vocab N] [--sd S] [--reps R]
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/sampling.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Standard normal from a 64-bit LCG (Box-Muller). */
static double normal(uint64_t *st) {
    double u[2];
    for (int k = 0; k < 2; k++) {
        *st = *st * 6364136223846793005ull + 1442695040888963407ull;
        u[k] = ((double)(*st >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    }
    return sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

int main(int argc, char **argv) {
    int n_vocab = 151936, reps = 50;
    double sd = 3.0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--vocab")) n_vocab = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--sd")) sd = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_sampler [--vocab N] [--sd S] [--reps R]\n");
            return 2;
        }
    }
    if (n_vocab < 2 || reps < 1) return 2;
    float *logits = malloc(sizeof(float) * (size_t)n_vocab);
    if (!logits) return 1;
    uint64_t st = 1;
    for (int i = 0; i < n_vocab; i++) logits[i] = (float)(sd * normal(&st));

    static const struct {
        const char *name;
        float temp, top_p, min_p, penalty, presence, frequency;
        int top_k;
    } mixes[] = {
        {"greedy", 0.0f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0},
        {"default: temp 0.8, top-k 40, top-p 0.95, min-p 0.05", 0.8f, 0.95f, 0.05f, 1.0f, 0.0f,
         0.0f, 40},
        {"default + repeat penalty 1.1", 0.8f, 0.95f, 0.05f, 1.1f, 0.0f, 0.0f, 40},
        {"default + presence 0.5, frequency 0.5", 0.8f, 0.95f, 0.05f, 1.0f, 0.5f, 0.5f, 40},
        {"top-k off, top-p 0.95", 1.0f, 0.95f, 0.0f, 1.0f, 0.0f, 0.0f, 0},
        {"top-k off, top-p 0.9, min-p 0.05", 0.7f, 0.9f, 0.05f, 1.0f, 0.0f, 0.0f, 0},
        {"temperature only (top-k 0, top-p 1, min-p 0)", 1.0f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0},
    };
    printf("| filters | ms per sampled token |\n|---|---:|\n");
    for (size_t m = 0; m < sizeof mixes / sizeof mixes[0]; m++) {
        struct sampler_params p = {.temp = mixes[m].temp, .top_k = mixes[m].top_k,
                                   .top_p = mixes[m].top_p, .min_p = mixes[m].min_p,
                                   .repeat_penalty = mixes[m].penalty, .repeat_last_n = 64,
                                   .presence_penalty = mixes[m].presence,
                                   .frequency_penalty = mixes[m].frequency, .seed = 5};
        struct sampler s;
        struct tpi_error err = {0};
        if (sampler_init(&s, &p, n_vocab, &err) != TPI_OK) {
            fprintf(stderr, "bench_sampler: %s\n", err.msg);
            return 1;
        }
        for (int i = 0; i < 64; i++) sampler_accept_output(&s, (i * 7919) % n_vocab);
        volatile int32_t sink = sampler_sample(&s, logits); // warm-up
        const double t0 = now_s();
        for (int r = 0; r < reps; r++) sink = sampler_sample(&s, logits);
        (void)sink;
        printf("| %s | %.3f |\n", mixes[m].name, (now_s() - t0) / reps * 1e3);
        sampler_free(&s);
    }
    // --logprobs K: the chosen token's logprob and the top K, per sampled token.
    for (int k = 1; k <= 20; k *= 4) {
        int32_t ids[20];
        float lps[20];
        volatile float sink = 0.0f;
        const double t0 = now_s();
        for (int r = 0; r < reps; r++) sink = sampler_logprobs(logits, n_vocab, r, k, ids, lps);
        (void)sink;
        printf("| logprobs, top %d | %.3f |\n", k, (now_s() - t0) / reps * 1e3);
    }
    free(logits);
    return 0;
}
