/*
 * perplexity.h — perplexity of a token stream exactly as llama.cpp's
 * `llama-perplexity` computes it: non-overlapping windows of n_ctx tokens
 * (n_windows = n_tokens / n_ctx, the tail dropped), the KV cache restarted per
 * window, BOS written over each window's first token when the vocabulary adds
 * BOS, and only the second half of each window scored (the first n_ctx/2
 * positions are context): positions first..n_ctx-2 predict tokens first+1..n_ctx-1.
 */
#ifndef PERPLEXITY_H
#define PERPLEXITY_H

#include <stdbool.h>
#include <stdint.h>

#include "model.h"

struct ppl_result {
    int n_windows;
    int n_scored;     /* tokens scored: n_windows * (n_ctx - 1 - n_ctx/2) */
    double nll;       /* mean negative log-likelihood */
    double ppl;       /* exp(nll) */
    double ppl_err;   /* llama.cpp's +/-: ppl * sqrt(var(nll) / (n_scored - 1)) */
};

/* Called on world rank 0 after each window with the running estimate. */
typedef void (*ppl_progress_fn)(int window, int n_windows, double ppl_so_far, void *user);

/* Perplexity of tokens[0..n_tokens) with windows of n_ctx tokens, the first max_windows
 * of them when that is > 0 (llama.cpp's --chunks), else all (collective over the grid;
 * every rank passes the same tokens). bos < 0 means no BOS substitution. The result is
 * valid on every rank. Errors: fewer than 2 * n_ctx tokens (as llama.cpp, whatever
 * max_windows), n_ctx over the model's context, forward failures. */
int model_perplexity(struct model *m, const int32_t *tokens, int n_tokens, int n_ctx,
                     int max_windows, int32_t bos, ppl_progress_fn progress, void *user,
                     struct ppl_result *out, struct tpi_error *err);

#endif /* PERPLEXITY_H */
