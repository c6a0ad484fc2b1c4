/*
 * perplexity.c — see perplexity.h. The scoring loop follows llama.cpp's
 * perplexity() (tools/perplexity): the same windows, the same BOS rule, the same
 * scored positions and the same error estimate, so the numbers are comparable.
 */
#include "perplexity.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sampling.h"

int model_perplexity(struct model *m, const int32_t *tokens, int n_tokens, int n_ctx,
                     int max_windows, int32_t bos, ppl_progress_fn progress, void *user,
                     struct ppl_result *out, struct tpi_error *err) {
    memset(out, 0, sizeof *out);
    if (n_ctx < 4 || n_ctx > m->n_ctx)
        return tpi_err(err, TPI_ERR_INVALID,
                       "perplexity window of %d tokens: must be at least 4 and at most the "
                       "model context of %d (-c)",
                       n_ctx, m->n_ctx);
    if (n_tokens < 2 * n_ctx)
        return tpi_err(err, TPI_ERR_INVALID,
                       "the text tokenizes to only %d tokens; perplexity with a context of %d "
                       "needs at least %d",
                       n_tokens, n_ctx, 2 * n_ctx);
    const int n_vocab = m->cfg.n_vocab;
    const int n_windows = max_windows > 0 && max_windows < n_tokens / n_ctx ? max_windows
                                                                              : n_tokens / n_ctx;
    const int first = n_ctx / 2;
    const int n_score = n_ctx - 1 - first; // positions first .. n_ctx-2
    const int decider = model_decider_rank(m);
    const int world_rank = m->grid ? m->grid->world_rank : 0;
    int rc = TPI_OK;

    int32_t *win = malloc(sizeof(int32_t) * (size_t)n_ctx);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n_ctx);
    int32_t *seq = calloc((size_t)n_ctx, sizeof(int32_t));
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)n_score);
    float *logits = model_has_logits(m) ? model_logits_alloc(m, (size_t)n_score) : NULL;
    if (!win || !pos || !seq || !rows || (model_has_logits(m) && !logits))
        rc = tpi_err(err, TPI_ERR_NOMEM, "out of memory for a perplexity window of %d", n_ctx);
    if ((rc = model_agree(m, rc, err))) goto done;
    for (int i = 0; i < n_ctx; i++) pos[i] = i;
    for (int i = 0; i < n_score; i++) rows[i] = first + i;

    double nll = 0.0, nll2 = 0.0; // sums over scored tokens (valid on every rank)
    int count = 0;
    for (int w = 0; w < n_windows; w++) {
        memcpy(win, tokens + (size_t)w * n_ctx, sizeof(int32_t) * (size_t)n_ctx);
        if (bos >= 0) win[0] = bos;
        // Positions restart at 0 in slot 0: the new window overwrites the cache in order,
        // so attention never sees the previous window.
        if ((rc = model_forward(m, win, pos, seq, n_ctx, rows, n_score, logits, err))) goto done;
        double sums[2] = {0.0, 0.0};
        if (world_rank == decider) {
            for (int i = 0; i < n_score; i++) {
                // The original token is the target even where BOS replaced it (as llama.cpp).
                int32_t target = tokens[(size_t)w * n_ctx + first + 1 + i];
                double lp = sampler_logprob_of(logits + (size_t)i * n_vocab, n_vocab, target);
                sums[0] += -lp;
                sums[1] += lp * lp;
            }
        }
        if ((rc = model_bcast_bytes(m, sums, (int)sizeof sums, decider, err))) goto done;
        nll += sums[0];
        nll2 += sums[1];
        count += n_score;
        if (progress && world_rank == 0) progress(w, n_windows, exp(nll / count), user);
    }
    out->n_windows = n_windows;
    out->n_scored = count;
    out->nll = nll / count;
    out->ppl = exp(out->nll);
    double var = nll2 / count - out->nll * out->nll;
    out->ppl_err = var > 0 ? sqrt(var / (count - 1)) * out->ppl : 0.0;
done:
    free(win);
    free(pos);
    free(seq);
    free(rows);
    model_logits_free(m, logits);
    return rc;
}
