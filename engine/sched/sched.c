/*
 * sched.c — see sched.h. One step = admit (rank 0 decides, broadcasts), batch,
 * one model_forward, sample on the decider (broadcast), apply on every rank.
 *
 * Why rank 0 serializes requests instead of every rank reading the file: only
 * rank 0 parses and tokenizes the input (stdin works, ranks on other nodes need
 * no copy of the file), and the admission message doubles as the per-step
 * broadcast that carries the stop flag, so a signal seen on rank 0 stops every
 * rank after the same step.
 */
#include "sched.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/generate.h"
#include "text/tokenizer.h"

/* One sequence in flight: its KV slot is its index in the slot array. */
struct slot {
    bool active;
    int64_t tag;
    uint64_t order;          /* admission number: older prompts prefill first */
    int32_t *prompt;         /* (n_prompt) owned */
    int n_prompt, n_fed;     /* prompt tokens, prompt tokens already in the KV cache */
    int n_past;              /* positions of the slot filled */
    bool has_next;           /* a sampled token waits to be fed (decode phase) */
    bool wait_prefix;        /* this step: an older sequence is prefilling our prefix */
    bool score;              /* the prompt tokens' logprobs are wanted (never shared) */
    int32_t *plp_ids;        /* score: (n_prompt, K) */
    float *plp_vals;         /* score: (n_prompt, K) */
    float *plp_chosen;       /* score: (n_prompt) */
    int32_t next_tok;
    int max_gen, K;
    char **stop;             /* (n_stop) owned */
    int n_stop;
    int32_t *stop_ids;       /* (n_stop_ids) owned */
    int n_stop_ids;
    bool ignore_eos, keep_stop_string, render_control;
    int min_tokens;
    int32_t *ban;            /* decider, min_tokens > 0: the ids that would end it (n_ban) */
    int n_ban;
    int stop_which;          /* the stop string that ended it (-1: none) */
    int32_t stop_id;         /* the stop id that ended it (-1: none) */
    struct sampler smp;      /* decider only */
    bool smp_init;
    struct tok_stream *ts;
    int32_t *tokens;         /* (max_gen) */
    int n_tokens;
    char *text;
    size_t n_text, cap_text;
    int32_t *lp_ids;         /* (max_gen, K) */
    float *lp_vals;          /* (max_gen, K) */
    float *lp_chosen;        /* (max_gen) */
    double t_admit, t_first;
};

static void slot_clear(struct slot *s) {
    free(s->prompt);
    for (int i = 0; i < s->n_stop; i++) free(s->stop[i]);
    free(s->stop);
    free(s->stop_ids);
    free(s->ban);
    if (s->smp_init) sampler_free(&s->smp);
    tok_stream_free(&s->ts);
    free(s->tokens);
    free(s->text);
    free(s->lp_ids);
    free(s->lp_vals);
    free(s->lp_chosen);
    free(s->plp_ids);
    free(s->plp_vals);
    free(s->plp_chosen);
    memset(s, 0, sizeof *s);
}

/* What a KV slot holds, kept across the sequences that use it: the token at each
 * position [0, len) fed so far. A new prompt that begins with them reuses them. */
struct slot_kv {
    int32_t *tok; /* (n_ctx) */
    int len;
};

/* Length of the common prefix of a[0..n) and b[0..n). */
static int common_prefix(const int32_t *a, const int32_t *b, int n) {
    int k = 0;
    while (k < n && a[k] == b[k]) k++;
    return k;
}

/* ---- the admission message: a flat byte buffer ------------------------------ */

struct buf {
    uint8_t *p;
    size_t n, cap, off; /* off: read cursor */
    bool bad;           /* write: OOM; read: ran past the end */
};

static void put(struct buf *b, const void *src, size_t n) {
    if (b->bad || n == 0) return; // an empty list may come as NULL
    if (b->n + n > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 4096;
        while (nc < b->n + n) nc *= 2;
        uint8_t *q = realloc(b->p, nc);
        if (!q) {
            b->bad = true;
            return;
        }
        b->p = q;
        b->cap = nc;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void get(struct buf *b, void *dst, size_t n) {
    if (n == 0) return;
    if (b->bad || b->off + n > b->n) {
        b->bad = true;
        memset(dst, 0, n);
        return;
    }
    memcpy(dst, b->p + b->off, n);
    b->off += n;
}

static void put_i32(struct buf *b, int32_t v) { put(b, &v, sizeof v); }
static int32_t get_i32(struct buf *b) {
    int32_t v;
    get(b, &v, sizeof v);
    return v;
}

/* Serialize a request for slot `slot_idx`. Floats and the seed travel as raw
 * bytes: every rank is the same build on the same kind of machine. */
static void put_request(struct buf *b, int slot_idx, const struct sched_request *rq) {
    put_i32(b, slot_idx);
    put(b, &rq->tag, sizeof rq->tag);
    put_i32(b, rq->n_prompt);
    put_i32(b, rq->max_tokens);
    put_i32(b, rq->n_logprobs);
    put_i32(b, rq->score_prompt && rq->n_logprobs > 0);
    put(b, &rq->sp, sizeof rq->sp);
    put_i32(b, rq->n_stop);
    for (int i = 0; i < rq->n_stop; i++) {
        int32_t len = (int32_t)strlen(rq->stop[i]);
        put_i32(b, len);
        put(b, rq->stop[i], (size_t)len);
    }
    put_i32(b, (rq->ignore_eos ? 1 : 0) | (rq->keep_stop_string ? 2 : 0) |
                   (rq->render_control ? 4 : 0));
    put_i32(b, rq->min_tokens);
    put_i32(b, rq->n_stop_ids);
    put(b, rq->stop_ids, sizeof(int32_t) * (size_t)rq->n_stop_ids);
    put_i32(b, rq->n_bias);
    put(b, rq->bias_ids, sizeof(int32_t) * (size_t)rq->n_bias);
    put(b, rq->bias_vals, sizeof(float) * (size_t)rq->n_bias);
    put(b, rq->prompt, sizeof(int32_t) * (size_t)rq->n_prompt);
}

/* Install the next serialized request into its slot (every rank). */
static int get_request(struct buf *b, struct slot *slots, struct slot_kv *kvs, int n_parallel,
                       struct model *m, const struct tokenizer *tok, bool is_decider,
                       uint64_t order, bool share, struct sched_stats *st,
                       struct tpi_error *err) {
    int idx = get_i32(b);
    if (b->bad || idx < 0 || idx >= n_parallel || slots[idx].active)
        return tpi_err(err, TPI_ERR_COMM, "batch scheduler: bad admission message (slot %d)", idx);
    struct slot *s = &slots[idx];
    memset(s, 0, sizeof *s);
    s->stop_which = s->stop_id = -1;
    get(b, &s->tag, sizeof s->tag);
    s->n_prompt = get_i32(b);
    int max_tokens = get_i32(b);
    s->K = get_i32(b);
    const bool score = get_i32(b) != 0;
    struct sampler_params sp;
    get(b, &sp, sizeof sp);
    s->n_stop = get_i32(b);
    if (b->bad || s->n_stop < 0 || s->n_stop > 1 << 16 || s->n_prompt < 1 || s->K < 0)
        return tpi_err(err, TPI_ERR_COMM, "batch scheduler: bad admission message (request %lld)",
                       (long long)s->tag);
    s->active = true; // from here slot_clear frees whatever was allocated
    s->order = order;
    s->stop = calloc((size_t)s->n_stop + 1, sizeof *s->stop);
    if (!s->stop) return tpi_err(err, TPI_ERR_NOMEM, "batch scheduler: out of memory");
    for (int i = 0; i < s->n_stop; i++) {
        int32_t len = get_i32(b);
        if (b->bad || len < 0 || (size_t)len > b->n - b->off)
            return tpi_err(err, TPI_ERR_COMM, "batch scheduler: bad stop string in message");
        if (!(s->stop[i] = malloc((size_t)len + 1)))
            return tpi_err(err, TPI_ERR_NOMEM, "batch scheduler: out of memory");
        get(b, s->stop[i], (size_t)len);
        s->stop[i][len] = '\0';
    }
    const int32_t flags = get_i32(b);
    s->ignore_eos = flags & 1;
    s->keep_stop_string = flags & 2;
    s->render_control = flags & 4;
    s->min_tokens = get_i32(b);
    s->n_stop_ids = get_i32(b);
    if (b->bad || s->min_tokens < 0 || s->n_stop_ids < 0 ||
        (size_t)s->n_stop_ids > (b->n - b->off) / sizeof(int32_t))
        return tpi_err(err, TPI_ERR_COMM, "batch scheduler: bad stop ids in message");
    if (!(s->stop_ids = malloc(sizeof(int32_t) * (size_t)(s->n_stop_ids + 1))))
        return tpi_err(err, TPI_ERR_NOMEM, "batch scheduler: out of memory");
    get(b, s->stop_ids, sizeof(int32_t) * (size_t)s->n_stop_ids);
    const int n_bias = get_i32(b);
    if (b->bad || n_bias < 0 ||
        (size_t)n_bias > (b->n - b->off) / (sizeof(int32_t) + sizeof(float)))
        return tpi_err(err, TPI_ERR_COMM, "batch scheduler: bad logit bias in message");
    // Only the decider samples; the others skip the bias.
    const size_t bias_at = b->off;
    b->off += (sizeof(int32_t) + sizeof(float)) * (size_t)n_bias;
    if ((size_t)s->n_prompt > (b->n - b->off) / sizeof(int32_t))
        return tpi_err(err, TPI_ERR_COMM, "batch scheduler: truncated prompt in message");
    if (s->n_prompt >= m->n_ctx)
        return tpi_err(err, TPI_ERR_INVALID,
                       "request %lld: prompt of %d tokens does not fit the context of %d",
                       (long long)s->tag, s->n_prompt, m->n_ctx);
    // Generated token j is fed back at position n_prompt + j and the last one never
    // is, so n_ctx - n_prompt + 1 would fit; n_ctx - n_prompt is the simpler rule.
    s->max_gen = TPI_MIN(max_tokens, m->n_ctx - s->n_prompt);
    if (s->max_gen < 1) s->max_gen = 1;
    s->K = TPI_MIN(s->K, m->cfg.n_vocab); // the vocabulary holds no more alternatives
    const size_t ng = (size_t)s->max_gen, K = (size_t)s->K;
    s->prompt = malloc(sizeof(int32_t) * (size_t)s->n_prompt);
    s->tokens = malloc(sizeof(int32_t) * ng);
    s->text = malloc(256);
    s->cap_text = 256;
    s->ts = tok_stream_new(tok, s->render_control);
    if (K > 0) {
        s->lp_ids = malloc(sizeof(int32_t) * ng * K);
        s->lp_vals = malloc(sizeof(float) * ng * K);
        s->lp_chosen = malloc(sizeof(float) * ng);
    }
    s->score = score && K > 0;
    if (s->score) {
        const size_t np = (size_t)s->n_prompt;
        s->plp_ids = calloc(np * K, sizeof(int32_t));
        s->plp_vals = calloc(np * K, sizeof(float));
        s->plp_chosen = calloc(np, sizeof(float));
        if (!s->plp_ids || !s->plp_vals || !s->plp_chosen)
            return tpi_err(err, TPI_ERR_NOMEM, "batch scheduler: out of memory for request %lld",
                           (long long)s->tag);
    }
    if (!s->prompt || !s->tokens || !s->text || !s->ts ||
        (K > 0 && (!s->lp_ids || !s->lp_vals || !s->lp_chosen)))
        return tpi_err(err, TPI_ERR_NOMEM, "batch scheduler: out of memory for request %lld",
                       (long long)s->tag);
    s->text[0] = '\0';
    get(b, s->prompt, sizeof(int32_t) * (size_t)s->n_prompt);
    if (is_decider) {
        int rc = sampler_init(&s->smp, &sp, m->cfg.n_vocab, err);
        if (rc) return rc;
        s->smp_init = true;
        // The repetition penalty looks at the prompt too, as llama.cpp's does.
        for (int i = 0; i < s->n_prompt; i++) sampler_accept(&s->smp, s->prompt[i]);
        if (n_bias > 0) {
            int32_t *ids = malloc(sizeof(int32_t) * (size_t)n_bias);
            float *vals = malloc(sizeof(float) * (size_t)n_bias);
            if (ids && vals) {
                memcpy(ids, b->p + bias_at, sizeof(int32_t) * (size_t)n_bias);
                memcpy(vals, b->p + bias_at + sizeof(int32_t) * (size_t)n_bias,
                       sizeof(float) * (size_t)n_bias);
                rc = sampler_set_bias(&s->smp, ids, vals, n_bias, err);
            } else {
                rc = tpi_err(err, TPI_ERR_NOMEM, "batch scheduler: out of memory");
            }
            free(ids);
            free(vals);
            if (rc) return rc;
        }
        if (s->min_tokens > 0) { // what may not be sampled before min_tokens: the ends
            if (!(s->ban = malloc(sizeof(int32_t) * (size_t)(s->n_stop_ids + TOK_MAX_EOG))))
                return tpi_err(err, TPI_ERR_NOMEM, "batch scheduler: out of memory");
            s->n_ban = s->ignore_eos ? 0 : tok_eog_ids(tok, s->ban);
            memcpy(s->ban + s->n_ban, s->stop_ids, sizeof(int32_t) * (size_t)s->n_stop_ids);
            s->n_ban += s->n_stop_ids;
        }
    }
    // The slot's cache may still hold a prefix of this prompt (an earlier sequence
    // of the slot began alike): keep it, never the last token (its logits are needed).
    struct slot_kv *kv = &kvs[idx];
    const int reuse = common_prefix(s->prompt, kv->tok, TPI_MIN(kv->len, s->n_prompt - 1));
    if (share && !s->score && reuse >= SCHED_SHARE_MIN) {
        s->n_fed = s->n_past = reuse;
        st->n_prompt_shared += reuse;
    }
    kv->len = s->n_past;
    s->t_admit = tpi_time_s();
    return TPI_OK;
}

/* ---- applying a sampled token ------------------------------------------------ */

static int text_append(struct slot *s, const char *bytes, size_t n) {
    if (s->n_text + n + 1 > s->cap_text) {
        size_t nc = s->cap_text * 2;
        while (nc < s->n_text + n + 1) nc *= 2;
        char *q = realloc(s->text, nc);
        if (!q) return TPI_ERR_NOMEM;
        s->text = q;
        s->cap_text = nc;
    }
    memcpy(s->text + s->n_text, bytes, n);
    s->n_text += n;
    s->text[s->n_text] = '\0';
    return TPI_OK;
}

enum finish { FIN_NONE = 0, FIN_EOG, FIN_STOP_STRING, FIN_LENGTH, FIN_ERROR };

/* After text[before..n_text) was appended: whether a stop string ends in it, and if so
 * the text cut there (after it with keep_stop_string), s->stop_which naming it. vLLM's
 * detokenizer looks once more than min_tokens tokens exist (the text of the first
 * min_tokens only as the start of one that straddles), and takes the first listed string
 * that ends in the new text (it may straddle the old end), not the earliest of them. */
static bool cut_at_stop(struct slot *s, size_t before) {
    if (s->n_stop == 0 || s->n_text == before || s->n_tokens <= s->min_tokens) return false;
    long at = gen_find_stop_listed(s->text, s->n_text, before, (const char *const *)s->stop,
                                   s->n_stop, &s->stop_which);
    if (at < 0) return false;
    if (s->keep_stop_string) at += (long)strlen(s->stop[s->stop_which]);
    s->n_text = (size_t)at;
    s->text[at] = '\0';
    return true;
}

/* Append token id (with its logprobs) to slot s; returns how the sequence ends, or
 * FIN_NONE while it goes on. Deterministic, so every rank agrees. */
static enum finish apply_token(struct slot *s, const struct tokenizer *tok, int32_t id,
                               const int32_t *lp_ids, const float *lp_vals, float lp_chosen,
                               int *rc, struct tpi_error *err) {
    if (!s->ignore_eos && tok_is_eog(tok, id)) return FIN_EOG;
    for (int i = 0; i < s->n_stop_ids; i++)
        if (id == s->stop_ids[i]) {
            s->stop_id = id;
            return FIN_EOG;
        }
    const int j = s->n_tokens++;
    s->tokens[j] = id;
    if (s->K > 0) {
        memcpy(s->lp_ids + (size_t)j * s->K, lp_ids, sizeof(int32_t) * (size_t)s->K);
        memcpy(s->lp_vals + (size_t)j * s->K, lp_vals, sizeof(float) * (size_t)s->K);
        s->lp_chosen[j] = lp_chosen;
    }
    const char *bytes;
    size_t nb;
    if ((*rc = tok_stream_push(s->ts, id, &bytes, &nb, err))) return FIN_ERROR;
    const size_t before = s->n_text;
    if (text_append(s, bytes, nb)) {
        *rc = tpi_err(err, TPI_ERR_NOMEM, "batch scheduler: out of memory for text");
        return FIN_ERROR;
    }
    if (cut_at_stop(s, before)) return FIN_STOP_STRING;
    if (s->n_tokens >= s->max_gen) return FIN_LENGTH;
    return FIN_NONE;
}

/* ---- prefix sharing -------------------------------------------------------------- */

/* For each sequence still prefilling (in admission order, order_idx[0..n_active)):
 * copy the longest prefix of its prompt that another slot's cache holds (a sequence
 * in flight, or what a finished one left in a free slot), and mark it to wait while
 * an older sequence is still prefilling a longer common prefix. Every rank runs this
 * on the same state, so the copies match. */
static int share_prefixes(struct model *m, struct slot *slots, struct slot_kv *kvs, int n_slots,
                          const int *order_idx, int n_active, struct sched_stats *st,
                          struct tpi_error *err) {
    for (int a = 0; a < n_active; a++) {
        const int si = order_idx[a];
        struct slot *s = &slots[si];
        s->wait_prefix = false;
        const int want = s->n_prompt - 1; // the last prompt token runs here: its logits
        if (s->n_fed >= want || s->score) continue; // a scored prompt computes every row
        int best = -1, best_avail = s->n_fed, pending = 0;
        for (int d = 0; d < n_slots; d++) {
            if (d == si) continue;
            const int avail = common_prefix(s->prompt, kvs[d].tok, TPI_MIN(want, kvs[d].len));
            if (avail > best_avail) best = d, best_avail = avail;
        }
        for (int b = 0; b < a; b++) { // older sequences still prefilling: wait for them
            const struct slot *d = &slots[order_idx[b]];
            if (d->n_fed >= d->n_prompt) continue;
            const int cp = common_prefix(s->prompt, d->prompt, TPI_MIN(want, d->n_prompt));
            if (d->n_fed < cp) pending = TPI_MAX(pending, cp);
        }
        if (best >= 0 && best_avail >= SCHED_SHARE_MIN) { // best_avail > n_fed: any gain
            int rc = model_kv_copy(m, best, si, best_avail, err);
            if (rc) return rc;
            memcpy(kvs[si].tok, kvs[best].tok, sizeof(int32_t) * (size_t)best_avail);
            kvs[si].len = best_avail;
            st->n_prompt_shared += best_avail - s->n_fed;
            s->n_fed = s->n_past = best_avail;
        }
        s->wait_prefix = pending - s->n_fed >= SCHED_SHARE_MIN;
    }
    return TPI_OK;
}

/* ---- the loop ------------------------------------------------------------------ */

int sched_run(struct model *m, const struct tokenizer *tok, const struct sched_params *sp,
              const struct sched_callbacks *cb, struct sched_stats *stats,
              struct tpi_error *err) {
    struct sched_stats st_local;
    struct sched_stats *st = stats ? stats : &st_local;
    memset(st, 0, sizeof *st);
    st->t_start_s = tpi_time_s();
    const int world_rank = m->grid ? m->grid->world_rank : 0;
    const int decider = model_decider_rank(m);
    const bool is_decider = world_rank == decider, is_root = world_rank == 0;
    const bool has_logits = model_has_logits(m);
    const int n_vocab = m->cfg.n_vocab;
    const int NP = sp->n_parallel, UB = sp->n_ubatch;
    if (NP < 1 || NP > m->n_slot || UB < 1)
        return tpi_err(err, TPI_ERR_INVALID,
                       "batch scheduler: --parallel %d (model has %d slots), --ubatch %d", NP,
                       m->n_slot, UB);

    // The logits kept on the backend or not (below): world rank 0's setting holds on every
    // rank, as a step's agreement depends on it.
    int32_t keep_i = m->logits_keep;
    int rc = model_bcast_i32(m, &keep_i, 1, 0, err);
    if (rc) return rc;
    const bool keep = keep_i != 0;

    const size_t cap = (size_t)NP + (size_t)UB; // decode tokens + a prefill budget
    struct slot *slots = calloc((size_t)NP, sizeof *slots);
    struct slot_kv *kvs = calloc((size_t)NP, sizeof *kvs);
    bool *taken = calloc((size_t)NP, sizeof *taken);
    const bool share = !sp->no_prefix_share;
    int32_t *b_tok = malloc(sizeof(int32_t) * cap), *b_pos = malloc(sizeof(int32_t) * cap);
    int32_t *b_seq = malloc(sizeof(int32_t) * cap), *b_out = malloc(sizeof(int32_t) * cap);
    // Rows with logits per step: one sample row per sequence, plus scored prompt rows.
    int *out_slot = malloc(sizeof(int) * (size_t)(NP + SCHED_SCORE_ROWS));
    int *out_score = malloc(sizeof(int) * (size_t)(NP + SCHED_SCORE_ROWS));
    int *order_idx = malloc(sizeof(int) * (size_t)NP);
    // Where each logits row's ids and floats go in the sampling message.
    size_t *row_oi = malloc(sizeof(size_t) * (size_t)(NP + SCHED_SCORE_ROWS));
    size_t *row_of = malloc(sizeof(size_t) * (size_t)(NP + SCHED_SCORE_ROWS));
    float *logits =
        has_logits ? model_logits_alloc(m, (size_t)(NP + SCHED_SCORE_ROWS)) : NULL;
    // The logits stay on the backend: a row whose sampler needs only its best candidates
    // (greedy, top-k) is sampled from those, the others' whole rows are copied out
    // (TPI_LOGITS_KEEP=0: every row copied out, as before; for comparisons).
    int32_t *row_id = malloc(sizeof(int32_t) * (size_t)(NP + SCHED_SCORE_ROWS));
    int *full_rows = malloc(sizeof(int) * (size_t)(NP + SCHED_SCORE_ROWS));
    int32_t *msg_i = NULL;
    float *msg_f = NULL;
    size_t cap_msg = 0;
    struct buf adm = {0};
    for (int i = 0; kvs && i < NP; i++)
        if (!(kvs[i].tok = malloc(sizeof(int32_t) * (size_t)m->n_ctx))) rc = TPI_ERR_NOMEM;
    if (rc || !slots || !kvs || !taken || !b_tok || !b_pos || !b_seq || !b_out || !out_slot ||
        !out_score || !order_idx || !row_oi || !row_of || (has_logits && !logits) || !row_id ||
        !full_rows)
        rc = tpi_err(err, TPI_ERR_NOMEM, "batch scheduler: out of memory for %d sequences", NP);
    if (!rc && keep) rc = model_keep_init(m, NP + SCHED_SCORE_ROWS, err);
    if ((rc = model_agree(m, rc, err))) goto done;

    uint64_t n_admitted = 0;
    bool source_empty = false;
    for (;;) {
        // ---- 1. admission + stop flag, decided on rank 0 ----
        int32_t hdr[3] = {0, 0, 0}; // stop, n_admitted, n_bytes
        adm.n = adm.off = 0;
        adm.bad = false;
        if (is_root) {
            hdr[0] = cb->stop ? cb->stop(cb->user) : 0;
            int n_free = 0;
            for (int i = 0; i < NP; i++) n_free += !(taken[i] = slots[i].active);
            for (; !hdr[0] && !source_empty && n_free > 0; n_free--) {
                struct sched_request rq;
                memset(&rq, 0, sizeof rq);
                if (!cb->next(cb->user, &rq)) {
                    source_empty = true;
                    break;
                }
                // The free slot whose cache begins most like this prompt (the first
                // free one when none does, or without sharing).
                int at = -1, at_len = -1;
                for (int i = 0; i < NP; i++) {
                    if (taken[i]) continue;
                    const int l = share ? common_prefix(rq.prompt, kvs[i].tok,
                                                        TPI_MIN(kvs[i].len, rq.n_prompt - 1))
                                        : 0;
                    if (l > at_len) at = i, at_len = l;
                }
                taken[at] = true;
                put_request(&adm, at, &rq);
                hdr[1]++;
            }
            if (adm.bad) rc = tpi_err(err, TPI_ERR_NOMEM, "batch scheduler: out of memory");
            hdr[2] = (int32_t)adm.n;
        }
        if ((rc = model_agree(m, rc, err))) goto done;
        if ((rc = model_bcast_i32(m, hdr, 3, 0, err))) goto done;
        if (hdr[0] == SCHED_STOP_FAILED) {
            rc = tpi_err(err, TPI_ERR_IO, "the run failed on world rank 0 (said there)");
            break;
        }
        if (hdr[0]) {
            rc = tpi_err(err, TPI_ERR_INTERRUPTED, "batch run stopped by a signal");
            break;
        }
        if (hdr[2] > 0) {
            if (!is_root) {
                if (adm.cap < (size_t)hdr[2]) {
                    uint8_t *q = realloc(adm.p, (size_t)hdr[2]);
                    if (!q) rc = tpi_err(err, TPI_ERR_NOMEM, "batch scheduler: out of memory");
                    else adm.p = q, adm.cap = (size_t)hdr[2];
                }
                adm.n = (size_t)hdr[2];
            }
            if ((rc = model_agree(m, rc, err))) goto done;
            if ((rc = model_bcast_bytes(m, adm.p, hdr[2], 0, err))) goto done;
        }
        for (int a = 0; !rc && a < hdr[1]; a++)
            rc = get_request(&adm, slots, kvs, NP, m, tok, is_decider, n_admitted++, share, st,
                             err);
        if ((rc = model_agree(m, rc, err))) goto done;

        // ---- 2. the batch: decode tokens first, then prefill chunks, oldest first ----
        int n_active = 0;
        for (int i = 0; i < NP; i++)
            if (slots[i].active) order_idx[n_active++] = i;
        st->n_active = n_active;
        if (n_active == 0) break; // rank 0 admitted nothing into empty slots: all done
        for (int a = 1; a < n_active; a++) { // insertion sort by admission order
            int v = order_idx[a], b = a;
            while (b > 0 && slots[order_idx[b - 1]].order > slots[v].order) {
                order_idx[b] = order_idx[b - 1];
                b--;
            }
            order_idx[b] = v;
        }
        // Fails only on arguments, which every rank computes alike: no agree needed.
        if (share && (rc = share_prefixes(m, slots, kvs, NP, order_idx, n_active, st, err)))
            goto done;
        int n = 0, n_out = 0;
        for (int a = 0; a < n_active; a++) {
            struct slot *s = &slots[order_idx[a]];
            if (!s->has_next) continue;
            b_tok[n] = s->next_tok;
            b_pos[n] = s->n_past++;
            b_seq[n] = order_idx[a];
            kvs[order_idx[a]].tok[b_pos[n]] = b_tok[n];
            kvs[order_idx[a]].len = s->n_past;
            out_slot[n_out] = order_idx[a];
            out_score[n_out] = -1;
            b_out[n_out++] = n++;
            s->has_next = false;
        }
        const int n_dec = n; // decode rows; prompt chunks follow
        int budget = TPI_MAX(UB - n, 1); // a prefill never starves completely
        int score_left = SCHED_SCORE_ROWS; // scored prompt rows this step
        for (int a = 0; a < n_active && budget > 0; a++) {
            struct slot *s = &slots[order_idx[a]];
            if (s->n_fed >= s->n_prompt || s->wait_prefix) continue;
            int chunk = TPI_MIN(budget, s->n_prompt - s->n_fed);
            // A scored prompt has every row but its last (which samples) scored: feed
            // no more than this step's scored rows can take.
            if (s->score && s->n_prompt - s->n_fed - 1 > score_left) {
                chunk = TPI_MIN(chunk, score_left);
                if (chunk == 0) continue;
            }
            for (int t = 0; t < chunk; t++) {
                const int p = s->n_fed + t;
                b_tok[n] = s->prompt[p];
                b_pos[n] = s->n_past++;
                b_seq[n++] = order_idx[a];
                kvs[order_idx[a]].tok[s->n_past - 1] = s->prompt[p];
                if (s->score && p + 1 < s->n_prompt) {
                    out_slot[n_out] = order_idx[a];
                    out_score[n_out] = p + 1; // these logits score prompt token p + 1
                    b_out[n_out++] = n - 1;
                    score_left--;
                }
            }
            kvs[order_idx[a]].len = s->n_past;
            s->n_fed += chunk;
            budget -= chunk;
            st->n_prompt_tokens += chunk;
            if (s->n_fed == s->n_prompt) { // the last prompt token's logits choose token 0
                out_slot[n_out] = order_idx[a];
                out_score[n_out] = -1;
                b_out[n_out++] = n - 1;
            }
        }

        // ---- 3. one forward for everyone ----
        const double t_fwd = tpi_time_s();
        rc = keep ? model_forward_keep(m, b_tok, b_pos, b_seq, n, b_out, n_out, err)
                  : model_forward(m, b_tok, b_pos, b_seq, n, b_out, n_out, logits, err);
        if (rc) goto done;
        st->t_forward_s += tpi_time_s() - t_fwd;
        st->n_steps++;
        st->n_decode_steps += n == n_dec;
        if (n_out == 0) continue; // prefill chunks only: nothing to sample yet

        // ---- 4. the decider samples; ids (and logprobs) go to every rank ----
        const double t_smp = tpi_time_s();
        size_t n_i = 0, n_f = 0;
        for (int r = 0; r < n_out; r++) { // sample row: id + K ids; scored row: K ids
            int K = slots[out_slot[r]].K;
            row_oi[r] = n_i;
            row_of[r] = n_f;
            n_i += (out_score[r] < 0) + (size_t)K;
            n_f += K > 0 ? 1 + (size_t)K : 0;
        }
        const size_t n_msg = TPI_MAX(n_i, n_f); // both buffers hold either count
        if (n_msg > cap_msg) {
            int32_t *qi = realloc(msg_i, sizeof(int32_t) * n_msg);
            if (qi) msg_i = qi;
            float *qf = realloc(msg_f, sizeof(float) * n_msg);
            if (qf) msg_f = qf;
            if (!qi || !qf) rc = tpi_err(err, TPI_ERR_NOMEM, "batch scheduler: out of memory");
            else cap_msg = n_msg;
        }
        if ((rc = model_agree(m, rc, err))) goto done;
        if (is_decider && keep) { // rows the candidates decide; the others' logits copied out
            const struct model_keep *kp = &m->keep;
            int n_full = 0;
            for (int r = 0; r < n_out; r++) {
                struct slot *s = &slots[out_slot[r]];
                row_id[r] = -1;
                if (out_score[r] < 0 && s->K == 0 && !kp->bad[r]) {
                    sampler_ban(&s->smp, s->ban, s->n_tokens < s->min_tokens ? s->n_ban : 0);
                    row_id[r] = sampler_sample_top(&s->smp, kp->ids + (size_t)r * kp->k,
                                                   kp->vals + (size_t)r * kp->k, kp->k);
                }
                if (row_id[r] < 0) full_rows[n_full++] = r;
            }
            st->n_rows_whole += n_full;
            if (n_full > 0) rc = model_keep_fetch(m, full_rows, n_full, logits, err);
        }
        if (is_decider && !keep) st->n_rows_whole += n_out;
        if (keep && (rc = model_agree(m, rc, err))) goto done;
        if (is_decider) {
            // Rows are independent (a sequence's sampler, its RNG included, is used by its
            // one sample row; the logprobs are pure), so threads take them in any order
            // and the message is the same.
#pragma omp parallel for schedule(dynamic, 1) if (n_out > 1)
            for (int r = 0; r < n_out; r++) {
                struct slot *s = &slots[out_slot[r]];
                const float *row = logits + (size_t)r * n_vocab;
                size_t oi = row_oi[r], of = row_of[r];
                if (out_score[r] >= 0) { // the prompt token's logprob, then the top K
                    msg_f[of] = sampler_logprobs(row, n_vocab, s->prompt[out_score[r]], s->K,
                                                 msg_i + oi, msg_f + of + 1);
                    continue;
                }
                if (keep && row_id[r] >= 0) { // sampled from the row's candidates (K is 0)
                    sampler_accept_output(&s->smp, row_id[r]);
                    msg_i[oi] = row_id[r];
                    continue;
                }
                const bool early = s->n_tokens < s->min_tokens;
                sampler_ban(&s->smp, s->ban, early ? s->n_ban : 0);
                int32_t id = sampler_sample(&s->smp, row);
                sampler_accept_output(&s->smp, id);
                // Logits that are not numbers (broken weights, an overflow) would sample
                // id 0 for ever: -1 tells every rank to stop the run.
                msg_i[oi++] = isfinite(row[id]) ? id : -1;
                if (s->K > 0) // the chosen token's logprob, then the top K
                    msg_f[of] = sampler_logprobs(row, n_vocab, id, s->K, msg_i + oi,
                                                 msg_f + of + 1);
            }
        }
        if ((rc = model_bcast_i32(m, msg_i, (int)n_i, decider, err))) goto done;
        if (n_f > 0 && (rc = model_bcast_f32(m, msg_f, (int)n_f, decider, err))) goto done;
        st->t_sample_s += tpi_time_s() - t_smp;

        // ---- 5. every rank applies the same ids ----
        const double now = tpi_time_s();
        size_t oi = 0, of = 0;
        for (int r = 0; r < n_out; r++) {
            const int si = out_slot[r];
            struct slot *s = &slots[si];
            if (out_score[r] >= 0) { // a scored prompt row: keep its logprobs
                const size_t at = (size_t)out_score[r];
                memcpy(s->plp_ids + at * s->K, msg_i + oi, sizeof(int32_t) * (size_t)s->K);
                memcpy(s->plp_vals + at * s->K, msg_f + of + 1, sizeof(float) * (size_t)s->K);
                s->plp_chosen[at] = msg_f[of];
                oi += (size_t)s->K;
                of += 1 + (size_t)s->K;
                continue;
            }
            const int32_t id = msg_i[oi++];
            if (id < 0) {
                rc = tpi_err(err, TPI_ERR_INVALID,
                             "the logits of a sequence's generated token %d are not finite "
                             "numbers (NaN or inf, on world rank %d): the model's weights or the "
                             "computation are broken",
                             s->n_tokens + 1, decider);
                break;
            }
            const int32_t *lpi = s->K > 0 ? msg_i + oi : NULL;
            const float *lpv = s->K > 0 ? msg_f + of + 1 : NULL;
            const float lpc = s->K > 0 ? msg_f[of] : 0.0f;
            oi += (size_t)s->K;
            of += s->K > 0 ? 1 + (size_t)s->K : 0;
            if (s->n_tokens == 0) s->t_first = now;
            st->n_gen_tokens++;
            int arc = TPI_OK;
            enum finish fin = apply_token(s, tok, id, lpi, lpv, lpc, &arc, err);
            if (arc) {
                rc = arc;
                break;
            }
            if (fin == FIN_NONE) {
                s->has_next = true;
                s->next_tok = id;
                continue;
            }
            if (fin != FIN_STOP_STRING) {
                // Not cut at a stop string: release a held-back partial character.
                const char *bytes;
                size_t nb;
                tok_stream_flush(s->ts, &bytes, &nb);
                const size_t before = s->n_text;
                if (nb > 0 && text_append(s, bytes, nb)) {
                    rc = tpi_err(err, TPI_ERR_NOMEM, "batch scheduler: out of memory for text");
                    break;
                }
                // the released U+FFFD may complete a stop string: the text never holds one
                if (cut_at_stop(s, before)) fin = FIN_STOP_STRING;
            }
            if (is_root && cb->done) {
                struct sched_result res = {
                    .tokens = s->tokens,
                    .n_tokens = s->n_tokens,
                    .text = s->text,
                    .n_text = s->n_text,
                    .finish_reason = fin == FIN_LENGTH ? "length" : "stop",
                    .stop_string = fin == FIN_STOP_STRING ? s->stop[s->stop_which] : NULL,
                    .stop_id = fin == FIN_EOG ? s->stop_id : -1,
                    .n_prompt = s->n_prompt,
                    .lp_k = s->K,
                    .lp_ids = s->lp_ids,
                    .lp_vals = s->lp_vals,
                    .lp_chosen = s->lp_chosen,
                    .plp_ids = s->plp_ids,
                    .plp_vals = s->plp_vals,
                    .plp_chosen = s->plp_chosen,
                    .t_first_s = s->t_first - s->t_admit,
                    .t_decode_s = now - s->t_first,
                };
                cb->done(cb->user, s->tag, &res);
            }
            st->n_done++;
            slot_clear(s);
        }
        if ((rc = model_agree(m, rc, err))) goto done;
        st->t_now_s = tpi_time_s();
        if (cb->step) cb->step(cb->user, st);
    }

done:
    st->n_active = 0;
    for (int i = 0; slots && i < NP; i++)
        if (slots[i].active) {
            st->n_active++;
            slot_clear(&slots[i]);
        }
    st->t_now_s = tpi_time_s();
    free(slots);
    for (int i = 0; kvs && i < NP; i++) free(kvs[i].tok);
    free(kvs);
    free(taken);
    free(b_tok);
    free(b_pos);
    free(b_seq);
    free(b_out);
    free(out_slot);
    free(out_score);
    free(order_idx);
    free(row_oi);
    free(row_of);
    model_logits_free(m, logits);
    free(row_id);
    free(full_rows);
    free(msg_i);
    free(msg_f);
    free(adm.p);
    return rc;
}
