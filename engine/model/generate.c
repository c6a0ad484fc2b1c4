/*
 * generate.c — see generate.h. Every rank runs the same loop; only the decider
 * (tp_rank 0 of the last stage) samples, then broadcasts the token and its
 * logprobs over the world. Text, stop strings and the finish reason are then
 * derived from the broadcast ids on every rank by the same deterministic code,
 * so all ranks agree on when to stop without another message, and world rank
 * 0 (which may sit on stage 0, far from the logits) has everything it prints.
 */
#include "generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"

void gen_result_free(struct gen_result *r) {
    free(r->tokens);
    free(r->text);
    free(r->lp_ids);
    free(r->lp_vals);
    free(r->lp_chosen);
    free(r->plp_ids);
    free(r->plp_vals);
    memset(r, 0, sizeof *r);
}

/* Growable byte buffer for the completion text. */
static int text_append(struct gen_result *r, size_t *cap, const char *b, size_t n) {
    if (r->n_text + n + 1 > *cap) {
        size_t nc = (*cap ? *cap * 2 : 256);
        while (nc < r->n_text + n + 1) nc *= 2;
        char *p = realloc(r->text, nc);
        if (!p) return TPI_ERR_NOMEM;
        r->text = p;
        *cap = nc;
    }
    memcpy(r->text + r->n_text, b, n);
    r->n_text += n;
    r->text[r->n_text] = '\0';
    return TPI_OK;
}

long gen_find_stop(const char *text, size_t n, size_t from, const char *const *stop,
                   int n_stop, int *which) {
    long best = -1;
    for (int s = 0; s < n_stop; s++) {
        size_t len = strlen(stop[s]);
        if (len == 0) continue;
        for (size_t i = from; i + len <= n; i++) {
            if (best >= 0 && (long)i >= best) break;
            if (!memcmp(text + i, stop[s], len)) {
                best = (long)i;
                if (which) *which = s;
                break;
            }
        }
    }
    return best;
}

long gen_find_stop_listed(const char *text, size_t n, size_t before, const char *const *stop,
                          int n_stop, int *which) {
    for (int s = 0; s < n_stop; s++) {
        const size_t len = strlen(stop[s]);
        if (len == 0 || len > n) continue;
        for (size_t i = before + 1 > len ? before + 1 - len : 0; i + len <= n; i++)
            if (!memcmp(text + i, stop[s], len)) {
                if (which) *which = s;
                return (long)i;
            }
    }
    return -1;
}

/* Length of the longest suffix of text[from..n) that is a proper prefix of a stop
 * string: text that may still turn into a stop string, held back from the stream. */
static size_t stop_holdback(const char *text, size_t n, size_t from, const char *const *stop,
                            int n_stop) {
    size_t hold = 0;
    for (int s = 0; s < n_stop; s++) {
        size_t len = strlen(stop[s]);
        if (len == 0) continue;
        for (size_t k = TPI_MIN(len - 1, n - from); k > hold; k--)
            if (!memcmp(text + n - k, stop[s], k)) {
                hold = k;
                break;
            }
    }
    return hold;
}

int generate_one(struct model *m, const struct tokenizer *tok, const int32_t *prompt,
                 int n_prompt, const struct gen_params *gp, gen_text_fn on_text, void *user,
                 struct gen_result *res, struct tpi_error *err) {
    memset(res, 0, sizeof *res);
    const int n_vocab = m->cfg.n_vocab;
    const int world_rank = m->grid ? m->grid->world_rank : 0;
    const int decider = model_decider_rank(m);
    const bool is_decider = world_rank == decider;
    const bool has_logits = model_has_logits(m);
    // No more alternatives than the vocabulary holds (llama.cpp caps them so too).
    const int K = TPI_MIN(gp->n_logprobs, m->cfg.n_vocab);
    const int PK = TPI_MIN(gp->n_prompt_logprobs, m->cfg.n_vocab);
    if (n_prompt <= 0) return tpi_err(err, TPI_ERR_INVALID, "the prompt is empty");
    if (gp->n_predict < 0 || K < 0 || PK < 0)
        return tpi_err(err, TPI_ERR_INVALID, "bad generation parameters (-n %d)", gp->n_predict);
    if (n_prompt + gp->n_predict > m->n_ctx)
        return tpi_err(err, TPI_ERR_INVALID,
                       "prompt of %d tokens + %d to generate exceeds the context of %d positions "
                       "(raise -c/--ctx-size or lower -n)",
                       n_prompt, gp->n_predict, m->n_ctx);

    int rc = TPI_OK;
    struct sampler smp = {0};
    int32_t eog[TOK_MAX_EOG]; // decider, --ignore-eos: the ids never sampled
    struct tok_stream *ts = NULL;
    float *logits = NULL;
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n_prompt);
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)n_prompt);
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)n_prompt);
    int32_t *msg_i = malloc(sizeof(int32_t) * (size_t)(1 + K));
    float *msg_f = malloc(sizeof(float) * (size_t)(K + 1)); // top-K, then the chosen's
    res->tokens = malloc(sizeof(int32_t) * (size_t)(gp->n_predict + 1));
    const int n_out_prefill = PK > 0 ? n_prompt : 1;
    if (has_logits) logits = model_logits_alloc(m, (size_t)n_out_prefill);
    if (K > 0) {
        res->lp_ids = malloc(sizeof(int32_t) * (size_t)(gp->n_predict + 1) * K);
        res->lp_vals = malloc(sizeof(float) * (size_t)(gp->n_predict + 1) * K);
        res->lp_chosen = malloc(sizeof(float) * (size_t)(gp->n_predict + 1));
    }
    if (PK > 0) {
        res->plp_ids = malloc(sizeof(int32_t) * (size_t)n_prompt * PK);
        res->plp_vals = malloc(sizeof(float) * (size_t)n_prompt * PK);
    }
    if (!pos || !seq || !rows || !msg_i || !msg_f || !res->tokens || (has_logits && !logits) ||
        (K > 0 && (!res->lp_ids || !res->lp_vals || !res->lp_chosen)) || (PK > 0 && (!res->plp_ids || !res->plp_vals)))
        rc = tpi_err(err, TPI_ERR_NOMEM, "out of memory for a prompt of %d tokens", n_prompt);
    if (!rc && is_decider) {
        struct sampler_params sp = gp->sp;
        if (sp.repeat_last_n < 0) sp.repeat_last_n = m->n_ctx; // -1: the whole context
        rc = sampler_init(&smp, &sp, n_vocab, err);
        for (int i = 0; !rc && i < n_prompt; i++) sampler_accept(&smp, prompt[i]);
        if (!rc) rc = sampler_set_bias(&smp, gp->bias_ids, gp->bias_vals, gp->n_bias, err);
        if (!rc && gp->ignore_eos && tok) sampler_ban(&smp, eog, tok_eog_ids(tok, eog));
    }
    if (!rc && tok && !(ts = tok_stream_new(tok, false)))
        rc = tpi_err(err, TPI_ERR_NOMEM, "out of memory for the text stream");
    // Decode steps leave their logits row on the device and the decider reads its best
    // candidates (model_forward_keep), the whole row only when its sampler needs it;
    // with logprobs every row is read whole (TPI_LOGITS_KEEP=0: always, the old path).
    const bool keep = K == 0 && m->logits_keep;
    if (!rc && keep) rc = model_keep_init(m, 1, err);
    // Local failures so far (OOM) must not leave other ranks inside model_forward.
    if ((rc = model_agree(m, rc, err))) goto done;
    res->lp_k = K;
    res->plp_k = PK;
    res->n_prompt = n_prompt;

    // ---- prefill ----
    double t0 = tpi_time_s();
    for (int i = 0; i < n_prompt; i++) {
        pos[i] = i;
        seq[i] = gp->slot;
        rows[i] = PK > 0 ? i : n_prompt - 1;
    }
    rc = model_forward(m, prompt, pos, seq, n_prompt, rows, n_out_prefill, logits, err);
    if (rc) goto done;
    if (PK > 0) {
        if (is_decider)
            for (int i = 0; i < n_prompt; i++)
                sampler_top_logprobs(logits + (size_t)i * n_vocab, n_vocab, PK,
                                     res->plp_ids + (size_t)i * PK, res->plp_vals + (size_t)i * PK);
        if ((rc = model_bcast_i32(m, res->plp_ids, n_prompt * PK, decider, err)) ||
            (rc = model_bcast_f32(m, res->plp_vals, n_prompt * PK, decider, err)))
            goto done;
    }
    res->t_prompt_s = tpi_time_s() - t0;
    t0 = tpi_time_s();

    // ---- decode ----
    const float *row = logits ? logits + (size_t)(n_out_prefill - 1) * n_vocab : NULL;
    size_t cap = 0, n_emitted = 0;
    if (text_append(res, &cap, "", 0)) goto nomem;
    res->finish_reason = "length";
    bool stopped = false, kept = false; // kept: the row is on the device (m->keep)
    int drc = TPI_OK;                   // the decider's failure to read its row
    for (int j = 0; j < gp->n_predict; j++) {
        if (is_decider) {
            int32_t id = kept && !m->keep.bad[0] ? sampler_sample_top(&smp, m->keep.ids,
                                                                     m->keep.vals, m->keep.k)
                                                 : -1;
            const int zero = 0;
            if (id < 0 && kept) drc = model_keep_fetch(m, &zero, 1, logits, err);
            if (id < 0 && !drc) {
                id = sampler_sample(&smp, row);
                if (!isfinite(row[id])) id = -1; // not numbers: every rank stops
            }
            if (id >= 0) sampler_accept_output(&smp, id);
            if (K > 0 && id >= 0) // (K > 0: every row whole)
                msg_f[K] = sampler_logprobs(row, n_vocab, id, K, msg_i + 1, msg_f);
            msg_i[0] = drc ? -2 : id;
        }
        if ((rc = model_bcast_i32(m, msg_i, 1 + K, decider, err)) ||
            (K > 0 && (rc = model_bcast_f32(m, msg_f, K + 1, decider, err))))
            goto done;
        const int32_t id = msg_i[0];
        if (id == -2) { // the decider says what failed; the others that it did
            rc = drc ? drc
                     : tpi_err(err, TPI_ERR_COMM,
                               "world rank %d could not read its logits for token %d", decider,
                               j + 1);
            goto done;
        }
        if (id < 0) {
            rc = tpi_err(err, TPI_ERR_INVALID,
                         "the logits of generated token %d are not finite numbers (NaN or inf, "
                         "on world rank %d): the model's weights or the computation are broken",
                         j + 1, decider);
            goto done;
        }
        if (tok && tok_is_eog(tok, id)) {
            res->finish_reason = "stop";
            break;
        }
        res->tokens[res->n_tokens] = id;
        if (K > 0) {
            memcpy(res->lp_ids + (size_t)res->n_tokens * K, msg_i + 1, sizeof(int32_t) * K);
            memcpy(res->lp_vals + (size_t)res->n_tokens * K, msg_f, sizeof(float) * K);
            res->lp_chosen[res->n_tokens] = msg_f[K];
        }
        res->n_tokens++;

        if (ts) {
            const char *b;
            size_t nb;
            if ((rc = tok_stream_push(ts, id, &b, &nb, err))) goto done;
            if (text_append(res, &cap, b, nb)) goto nomem;
            long at =
                gen_find_stop(res->text, res->n_text, n_emitted, gp->stop, gp->n_stop, NULL);
            if (at >= 0) {
                res->n_text = (size_t)at;
                res->text[at] = '\0';
                res->finish_reason = "stop";
                stopped = true;
                break;
            }
        }
        if (res->n_tokens == gp->n_predict) break;
        if (ts) { // stream what can no longer become part of a stop string
            size_t end = res->n_text -
                         stop_holdback(res->text, res->n_text, n_emitted, gp->stop, gp->n_stop);
            if (on_text && world_rank == 0 && end > n_emitted)
                on_text(res->text + n_emitted, end - n_emitted, user);
            n_emitted = end;
        }

        // Feed the chosen token at the next position; only its logits are wanted.
        int32_t p1 = n_prompt + j, s1 = gp->slot, r1 = 0;
        rc = keep ? model_forward_keep(m, &id, &p1, &s1, 1, &r1, 1, err)
                  : model_forward(m, &id, &p1, &s1, 1, &r1, 1, logits, err);
        if (rc) goto done;
        row = logits;
        kept = keep;
    }
    if (ts && !stopped) { // the end: release held-back bytes of an incomplete character
        const char *b;
        size_t nb;
        tok_stream_flush(ts, &b, &nb);
        if (text_append(res, &cap, b, nb)) goto nomem;
    }
    if (on_text && world_rank == 0 && res->n_text > n_emitted)
        on_text(res->text + n_emitted, res->n_text - n_emitted, user);
    res->t_gen_s = tpi_time_s() - t0;
    goto done;
nomem:
    rc = tpi_err(err, TPI_ERR_NOMEM, "out of memory for the completion text");
done:
    if (is_decider) sampler_free(&smp);
    tok_stream_free(&ts);
    model_logits_free(m, logits);
    free(pos);
    free(seq);
    free(rows);
    free(msg_i);
    free(msg_f);
    if (rc) gen_result_free(res);
    return rc;
}
