/*
 * forward.c — the forward pass of one rank, written to show the parallelism:
 * the layer loop runs over this stage's layers only, the activations arrive
 * from the previous stage at the top (recv) and leave for the next at the
 * bottom (send), and the two tensor-parallel all-reduces of each layer sit in
 * the layer body where Megatron puts them — after the row-parallel attention
 * output projection and after the row-parallel FFN down projection.
 *
 * Pipeline micro-batches: a batch is cut into micro-batches that every stage
 * processes in the same order with blocking send/recv, so stage s computes
 * micro-batch i while stage s+1 computes micro-batch i-1 (GPipe-style
 * fill-drain for one forward). A row's result does not depend on how rows
 * are grouped (ops.h), so the cut never changes the logits.
 *
 * Decode steps as graphs: a step of a few tokens is dozens of short kernels per layer,
 * whose launch cost dominates on a GPU (steps of up to m->graph_max_tokens: 32, the
 * batch command's decode steps included; TPI_GRAPH_TOKENS narrows it). When the
 * backend records graphs (ops->graph_*) and the step has no host-side work inside the
 * layer loop (pp 1, no communicator or NCCL's stream-ordered all-reduces; MPI stages
 * through the host and cannot be recorded), the embedding and the layer loop are
 * recorded once per step shape and replayed with one launch. Per-step values travel in
 * device buffers written before the launch (token ids, positions, slots); what the ops
 * decide on the host is frozen at recording, so the shape key holds all of it: n_tokens,
 * which neighbouring tokens share a slot (attention groups them), and the power of two
 * below max_pos (attention splits long key ranges; the kernels compute each split's
 * range from the device positions, so any split count is correct and the bucket only
 * keeps it near the best one). A shape is recorded the second time it is seen, after one
 * plain run has grown the scratch buffers it needs; a failed recording falls back to the
 * plain run.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

/* Logits of the wanted rows of one micro-batch: output norm on those rows only,
 * this rank's vocab slice of lm_head, then an all-gather over the TP group and the
 * full vocabulary reassembled on the host. */
static int forward_logits(struct model *m, int n_sel, float *logits, int i_out, bool keep,
                          struct tpi_error *err) {
    const struct ops *ops = m->ops;
    struct ops_ctx *octx = m->octx;
    const struct model_config *c = &m->cfg;
    const struct model_plan *p = &m->plan;
    struct model_state *s = &m->s;
    const int n_embd = c->n_embd, n_vocab = c->n_vocab;

    // The wanted rows are the micro-batch's first n_sel (a decode step's one row): the
    // norm reads them where they are, no gathering copy (on the GPU that copy and the
    // in-place norm it forced were ~15 us of a ~2 ms step; bench/NOTES.md change 113).
    bool first_rows = true;
    for (int i = 0; i < n_sel && first_rows; i++) first_rows = s->rows_host[i] == i;
    if (first_rows) {
        ops->rmsnorm(octx, s->x, m->w.output_norm, s->xo, n_sel, n_embd, c->rms_eps);
    } else {
        ops->get_rows(octx, s->x, s->rows_host, n_sel, n_embd, s->xo);
        ops->rmsnorm(octx, s->xo, m->w.output_norm, s->xo, n_sel, n_embd, c->rms_eps);
    }
    struct model_keep *kp = &m->keep;
    if (keep && !m->tp_comm) { // the product straight into the kept rows
        ops->matmul(octx, &m->w.output, s->xo, kp->rows + (size_t)i_out * n_vocab, n_sel);
        return TPI_OK;
    }
    ops->matmul(octx, &m->w.output, s->xo, s->logits_local, n_sel); // (n_sel, n_vocab_local)
    if (!m->tp_comm) {
        ops->to_host(octx, logits, s->logits_local, sizeof(float) * (size_t)n_sel * n_vocab);
        return TPI_OK;
    }
    // Vocab ranges may be uneven: every rank sends n_vocab_pad floats per row (its real
    // rows first, padding after) so the all-gather has one count; the host copy then
    // picks each rank's real columns.
    const size_t n_send = (size_t)n_sel * p->n_vocab_pad;
    int rc = comm_allgather(m->tp_comm, s->logits_local, s->logits_gather, n_send, COMM_F32, err);
    if (rc) return rc;
    if (keep) { // each rank's slice of the rows to its block of the kept rows (the decider's)
        if (!kp->rows) return TPI_OK; // not the decider
        for (int r = 0; r < p->tp; r++) {
            int v0, nv;
            model_vocab_range(n_vocab, p->tp, r, &v0, &nv);
            ops->copy(octx, kp->rows + (size_t)r * kp->cap * p->n_vocab_pad + (size_t)i_out * nv,
                      s->logits_gather + (size_t)r * n_send, sizeof(float) * (size_t)n_sel * nv);
        }
        return TPI_OK;
    }
    ops->to_host(octx, s->logits_host, s->logits_gather, sizeof(float) * n_send * p->tp);
    for (int r = 0; r < p->tp; r++) {
        int v0, nv;
        model_vocab_range(n_vocab, p->tp, r, &v0, &nv);
        const float *block = s->logits_host + (size_t)r * n_send;
        for (int i = 0; i < n_sel; i++)
            memcpy(logits + (size_t)i * n_vocab + v0, block + (size_t)i * nv,
                   sizeof(float) * (size_t)nv);
    }
    return TPI_OK;
}

/* x += in * W^T for a row-parallel W (attention output, FFN down), then h =
 * rmsnorm(x) * norm when norm is given: with TP, this rank's partial sum is
 * all-reduced over the group before the residual add (on one node one kernel over
 * peer memory does the sum, the add and, for decode-sized steps, the norm:
 * comm_nccl.c); alone, the residual is folded into the matmul. */
static int row_parallel_add(struct model *m, const struct tpi_weight *w, const float *in, int n,
                            const float *norm, struct tpi_error *err) {
    struct model_state *s = &m->s;
    const int n_embd = m->cfg.n_embd;
    const int64_t n_x = (int64_t)n * n_embd;
    bool normed = false;
    if (!m->tp_comm) {
        m->ops->matmul_add(m->octx, w, in, s->x, n);
    } else {
        m->ops->matmul(m->octx, w, in, s->o, n);
        if (m->tp_skip_allreduce) {
            m->ops->add(m->octx, s->x, s->o, n_x);
        } else if (norm) {
            int rc = comm_allreduce_add_norm(m->tp_comm, s->o, s->x, n, n_embd, norm,
                                             m->cfg.rms_eps, s->h, &normed, err);
            if (rc) return rc;
        } else {
            int rc = comm_allreduce_add(m->tp_comm, s->o, s->x, (size_t)n_x, err);
            if (rc) return rc;
        }
    }
    if (norm && !normed) m->ops->rmsnorm(m->octx, s->x, norm, s->h, n, n_embd, m->cfg.rms_eps);
    return TPI_OK;
}

/* The embedding (stage 0: token ids already in s->tok) and this stage's layers for
 * the n tokens of b; s->x holds the stage's input otherwise. Everything it queues is
 * stream-ordered device work (plus NCCL all-reduces), so it may be recorded. */
static int forward_layers(struct model *m, int n, const struct ops_batch *bp,
                          struct tpi_error *err) {
    const struct ops *ops = m->ops;
    struct ops_ctx *octx = m->octx;
    const struct model_config *c = &m->cfg;
    const struct model_plan *p = &m->plan;
    struct model_state *s = &m->s;
    const int n_embd = c->n_embd, hd = c->head_dim;
    const int n_head = p->n_head_local, n_kv = p->n_kv_local;
    const int64_t q_dim = (int64_t)n_head * hd, kv_dim = (int64_t)n_kv * hd;
    const float eps = c->rms_eps, scale = 1.0f / sqrtf((float)hd);
    const struct ops_rope rope = model_rope(c);
    const struct ops_batch b = *bp;
    int rc;

    if (p->is_first) ops->embed(octx, &m->w.token_embd, s->tok, n, s->x);
    ops->rmsnorm(octx, s->x, m->w.layers[0].attn_norm, s->h, n, n_embd, eps);

    // A one-token step without a TP group may run each layer's tail (wo through down,
    // and the next layer's norm and Q/K/V) as one backend launch (ops->layer_tail);
    // qkv_ready: that launch already wrote this layer's q, k and v.
    const bool tail_ok = ops->layer_tail && n == 1 && !m->tp_comm;
    bool qkv_ready = false;

    // h holds each sub-layer's normed input: the first here, the others from the
    // row-parallel update before them.
    for (int il = 0; il < p->n_layer_stage; il++) {
        const struct model_layer *L = &m->w.layers[il];
        const struct model_layer *N = il + 1 < p->n_layer_stage ? &m->w.layers[il + 1] : NULL;
        const float *next_norm = N ? N->attn_norm : NULL;

        // ---- attention: column-parallel Q/K/V by heads, row-parallel output ----
        const struct tpi_weight *wqkv[3] = {&L->wq, &L->wk, &L->wv};
        float *yqkv[3] = {s->q, s->k, s->v};
        if (!qkv_ready) ops->matmul_n(octx, 3, wqkv, s->h, yqkv, n);
        qkv_ready = false;
        if (L->bq) { // qwen2
            ops->add_bias(octx, s->q, L->bq, n, q_dim);
            ops->add_bias(octx, s->k, L->bk, n, kv_dim);
            ops->add_bias(octx, s->v, L->bv, n, kv_dim);
        }
        // qwen3: rmsnorm over each head's head_dim values (q_norm/k_norm), then RoPE, then
        // attention (q and k are not read again: the backend may do the first on the way in)
        ops->qk_norm_rope_attention(octx, &m->kv, il, s->q, s->k, s->v, L->q_norm, L->k_norm,
                                    &rope, eps, s->att, &b, n_head, scale);
        if (tail_ok && !L->bq && (!N || !N->bq)) {
            const struct ops_layer_tail t = {
                .att = s->att, .x = s->x, .g = s->g, .wo = &L->wo, .w_gate = &L->w_gate,
                .w_up = &L->w_up, .w_down = &L->w_down, .ffn_norm = L->ffn_norm,
                .attn_norm = next_norm, .wq = N ? &N->wq : NULL, .wk = N ? &N->wk : NULL,
                .wv = N ? &N->wv : NULL, .q = s->q, .k = s->k, .v = s->v, .eps = eps};
            if (ops->layer_tail(octx, &t)) {
                qkv_ready = N != NULL;
                continue;
            }
        }
        // partial sums over this rank's heads, summed over the TP group
        if ((rc = row_parallel_add(m, &L->wo, s->att, n, L->ffn_norm, err))) return rc;

        // ---- FFN: column-parallel gate/up, row-parallel down ----
        // (TPI_DIAG_SKIP_FFN, timing only: decode steps, up to 8 tokens, leave it out; h
        // keeps the FFN's input, and its int8 form, as the next layer's)
        if (m->diag_skip_ffn && n <= 8) continue;
        ops->matmul_silu_mul(octx, &L->w_gate, &L->w_up, s->h, s->g, s->u, n);
        // partial sums over this rank's columns, summed over the TP group
        if ((rc = row_parallel_add(m, &L->w_down, s->g, n, next_norm, err))) return rc;
    }
    return TPI_OK;
}

/* ---- decode-step graphs ---- */

#define GRAPH_MAX_SHAPES 64 /* recorded shapes kept (least recently used evicted) */
#define GRAPH_MAX_FAILS 2   /* recordings tried per shape before it stays plain */

struct graph_entry {
    int n_tokens;
    uint32_t seq_same; /* bit t-1: token t is in the slot of token t-1 */
    int pos_log2;      /* floor(log2(max_pos)) */
    int n_seen, n_fail;
    uint64_t last_use;
    void *graph; /* ops graph, or NULL: not recorded (yet) */
};

struct model_graphs {
    int n;
    uint64_t clock;
    bool warned;
    struct graph_entry e[GRAPH_MAX_SHAPES];
};

void model_graphs_free(struct model *m) {
    if (!m || !m->graphs) return;
    for (int i = 0; i < m->graphs->n; i++)
        if (m->graphs->e[i].graph) m->ops->graph_free(m->octx, m->graphs->e[i].graph);
    free(m->graphs);
    m->graphs = NULL;
}

/* Whether this step may run as a graph: nothing host-synchronous inside the layers. */
static bool graph_eligible(const struct model *m, int n) {
    return m->use_graphs && m->ops->graph_begin && n <= m->graph_max_tokens &&
           n <= MODEL_GRAPH_MAX_TOKENS && m->plan.pp == 1 &&
           !m->pp_comm && (!m->tp_comm || m->tp_comm->kind == COMM_NCCL);
}

/* The entry for this step's shape (created, evicting the least recently used one when
 * full); NULL without host memory. */
static struct graph_entry *graph_lookup(struct model *m, const struct ops_batch *b) {
    if (!m->graphs && !(m->graphs = calloc(1, sizeof *m->graphs))) return NULL;
    struct model_graphs *g = m->graphs;
    uint32_t same = 0;
    for (int t = 1; t < b->n_tokens; t++)
        if (b->seq_host[t] == b->seq_host[t - 1]) same |= 1u << (t - 1);
    int lg = 0;
    while ((2 << lg) <= b->max_pos) lg++;
    struct graph_entry *e = NULL;
    for (int i = 0; i < g->n && !e; i++)
        if (g->e[i].n_tokens == b->n_tokens && g->e[i].seq_same == same && g->e[i].pos_log2 == lg)
            e = &g->e[i];
    if (!e) {
        if (g->n < GRAPH_MAX_SHAPES) {
            e = &g->e[g->n++];
        } else {
            e = &g->e[0];
            for (int i = 1; i < g->n; i++)
                if (g->e[i].last_use < e->last_use) e = &g->e[i];
            if (e->graph) m->ops->graph_free(m->octx, e->graph);
        }
        *e = (struct graph_entry){.n_tokens = b->n_tokens, .seq_same = same, .pos_log2 = lg};
    }
    e->last_use = ++g->clock;
    return e;
}

/* Record the layers for b into e->graph. A recording that fails (an op that must wait
 * for the device, a launch error) leaves e->graph NULL and returns TPI_OK: nothing ran,
 * and the caller runs the step plainly; only failures from before it are returned. */
static int graph_record(struct model *m, struct graph_entry *e, int n, const struct ops_batch *b,
                        struct tpi_error *err) {
    const struct ops *ops = m->ops;
    int rc = ops->check(m->octx, err); // a failure of earlier work is real, not ours
    if (rc) return rc;
    struct tpi_error gerr = {0};
    void *graph = NULL;
    rc = ops->graph_begin(m->octx, &gerr);
    if (!rc) {
        const int rc_body = forward_layers(m, n, b, &gerr);
        struct tpi_error eerr = {0};
        const int rc_end = ops->graph_end(m->octx, &graph, &eerr);
        if (!rc_body && rc_end) gerr = eerr;
        rc = rc_body ? rc_body : rc_end;
    }
    if (rc || !graph) {
        if (graph) ops->graph_free(m->octx, graph);
        e->n_fail++;
        if (!m->graphs->warned) {
            TPI_LOGW("recording a %d-token decode step as a graph failed, running it without "
                     "one: %s",
                     n, gerr.msg);
            m->graphs->warned = true;
        }
        return TPI_OK;
    }
    e->graph = graph;
    m->n_graph_records++;
    return TPI_OK;
}

/* The layers of a small step as one graph launch when its shape has a graph (recorded
 * on its second sighting), else plainly. */
static int forward_layers_graph(struct model *m, int n, const struct ops_batch *b,
                                struct tpi_error *err) {
    const struct ops *ops = m->ops;
    struct graph_entry *e = graph_lookup(m, b);
    if (!e) return forward_layers(m, n, b, err);
    e->n_seen++;
    // Two tries: a stale graph (scratch regrown by a plain step) is recorded again.
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!e->graph) {
            if (e->n_seen < 2 || e->n_fail >= GRAPH_MAX_FAILS) break;
            int rc = graph_record(m, e, n, b, err);
            if (rc) return rc;
            if (!e->graph) break;
        }
        bool launched = false;
        int rc = ops->graph_launch(m->octx, e->graph, &launched, err);
        if (rc) return rc;
        if (launched) {
            m->n_graph_launches++;
            return TPI_OK;
        }
        ops->graph_free(m->octx, e->graph);
        e->graph = NULL;
    }
    return forward_layers(m, n, b, err);
}

/* One micro-batch of n tokens through this stage. */
static int forward_ubatch(struct model *m, const int32_t *tokens, const int32_t *pos,
                          const int32_t *seq, int n, int n_sel, float *logits, int i_out,
                          bool keep, struct tpi_error *err) {
    const struct ops *ops = m->ops;
    struct ops_ctx *octx = m->octx;
    const struct model_plan *p = &m->plan;
    struct model_state *s = &m->s;
    struct comm *pp_comm = m->pp_comm;
    const int n_embd = m->cfg.n_embd;
    int rc;

    int max_pos = 0;
    for (int t = 0; t < n; t++) max_pos = TPI_MAX(max_pos, pos[t] + 1);
    ops->to_dev(octx, s->pos, pos, sizeof(int32_t) * (size_t)n);
    ops->to_dev(octx, s->seq, seq, sizeof(int32_t) * (size_t)n);
    const struct ops_batch b = {.n_tokens = n, .pos = s->pos, .seq = s->seq,
                                .pos_host = pos, .seq_host = seq, .max_pos = max_pos};

    // x: embeddings on stage 0 (in forward_layers), the previous stage's output elsewhere.
    if (p->is_first) {
        ops->to_dev(octx, s->tok, tokens, sizeof(int32_t) * (size_t)n);
    } else if ((rc = comm_recv(pp_comm, s->x, (size_t)n * n_embd, COMM_F32, p->pp_stage - 1, err))) {
        return rc;
    }

    rc = graph_eligible(m, n) ? forward_layers_graph(m, n, &b, err) : forward_layers(m, n, &b, err);
    if (rc) return rc;

    if (!p->is_last) {
        if ((rc = comm_send(pp_comm, s->x, (size_t)n * n_embd, COMM_F32, p->pp_stage + 1, err)))
            return rc;
    } else if (n_sel > 0 && (rc = forward_logits(m, n_sel, logits, i_out, keep, err))) {
        return rc;
    }
    return ops->check(octx, err);
}

/* model_forward, or with keep model_forward_keep's first part: the logits to m->keep's
 * rows instead of the host. */
static int forward_run(struct model *m, const int32_t *tokens, const int32_t *pos,
                       const int32_t *seq, int n_tokens, const int32_t *out_idx, int n_out,
                       float *logits, bool keep, struct tpi_error *err) {
    const struct model_plan *p = &m->plan;
    const int n_vocab = m->cfg.n_vocab;
    double t0 = tpi_time_s();
    // Arguments are the same on every rank, so these checks fail on all ranks alike.
    if (n_tokens <= 0 || n_out < 0 || n_out > n_tokens)
        return tpi_err(err, TPI_ERR_INVALID, "model_forward: %d tokens, %d outputs", n_tokens,
                       n_out);
    for (int t = 0; t < n_tokens; t++) {
        if (pos[t] < 0 || pos[t] >= m->n_ctx)
            return tpi_err(err, TPI_ERR_INVALID,
                           "token %d is at position %d, outside the context of %d positions "
                           "(raise -c/--ctx-size)",
                           t, pos[t], m->n_ctx);
        if (seq[t] < 0 || seq[t] >= m->n_slot)
            return tpi_err(err, TPI_ERR_INVALID, "token %d is in sequence %d of %d", t, seq[t],
                           m->n_slot);
        if (p->is_first && (tokens[t] < 0 || tokens[t] >= n_vocab))
            return tpi_err(err, TPI_ERR_INVALID, "token %d has id %d, outside the vocabulary of %d",
                           t, tokens[t], n_vocab);
    }
    for (int i = 0; i < n_out; i++)
        if (out_idx[i] < 0 || out_idx[i] >= n_tokens || (i > 0 && out_idx[i] <= out_idx[i - 1]))
            return tpi_err(err, TPI_ERR_INVALID,
                           "model_forward: output row %d (= %d) not ascending in [0, %d)", i,
                           out_idx[i], n_tokens);
    if (p->is_last && n_out > 0 && !logits && !keep)
        return tpi_err(err, TPI_ERR_INVALID, "model_forward: no logits buffer");
    if (keep && p->is_last && n_out > m->keep.cap)
        return tpi_err(err, TPI_ERR_INVALID, "model_forward_keep: %d output rows, room for %d",
                       n_out, m->keep.cap);

    // Micro-batch size: at most n_ubatch; with pp stages, about n_tokens / pp so every
    // stage has work while the pipeline is full.
    int ub = m->s.n_ubatch;
    if (p->pp > 1) ub = TPI_MIN(ub, (n_tokens + p->pp - 1) / p->pp);
    int i_out = 0;
    for (int t0b = 0; t0b < n_tokens; t0b += ub) {
        const int n = TPI_MIN(ub, n_tokens - t0b);
        int n_sel = 0;
        while (i_out + n_sel < n_out && out_idx[i_out + n_sel] < t0b + n) {
            if (p->is_last) m->s.rows_host[n_sel] = out_idx[i_out + n_sel] - t0b;
            n_sel++;
        }
        float *dst = p->is_last && n_sel > 0 && !keep ? logits + (size_t)i_out * n_vocab : NULL;
        int rc = forward_ubatch(m, tokens ? tokens + t0b : NULL, pos + t0b, seq + t0b, n, n_sel,
                                dst, i_out, keep, err);
        if (rc) return rc;
        i_out += n_sel;
    }
    m->t_forward_s += tpi_time_s() - t0;
    return TPI_OK;
}

int model_forward(struct model *m, const int32_t *tokens, const int32_t *pos,
                  const int32_t *seq, int n_tokens, const int32_t *out_idx, int n_out,
                  float *logits, struct tpi_error *err) {
    return forward_run(m, tokens, pos, seq, n_tokens, out_idx, n_out, logits, false, err);
}

/* The best of row i, merged from the ranks' sorted lists of their vocabulary slices
 * (value first, then the lower id: ops->row_top's order; one rank: its list). */
static void keep_merge(struct model_keep *kp, int tp, int i, const int32_t *ids_dev,
                       const float *vals_dev) {
    const int *k_r = kp->slice_k;
    int *at = kp->merge_at;
    for (int r = 0; r < tp; r++) at[r] = 0;
    for (int j = 0; j < kp->k; j++) {
        int best = -1;
        for (int r = 0; r < tp; r++) {
            if (at[r] >= k_r[r]) continue;
            const size_t o = ((size_t)r * kp->cap + i) * kp->k + at[r];
            if (best < 0) {
                best = r;
                continue;
            }
            const size_t ob = ((size_t)best * kp->cap + i) * kp->k + at[best];
            if (vals_dev[o] > vals_dev[ob] ||
                (vals_dev[o] == vals_dev[ob] && ids_dev[o] < ids_dev[ob]))
                best = r;
        }
        const size_t ob = ((size_t)best * kp->cap + i) * kp->k + at[best]++;
        kp->ids[(size_t)i * kp->k + j] = ids_dev[ob];
        kp->vals[(size_t)i * kp->k + j] = vals_dev[ob];
    }
}

int model_forward_keep(struct model *m, const int32_t *tokens, const int32_t *pos,
                       const int32_t *seq, int n_tokens, const int32_t *out_idx, int n_out,
                       struct tpi_error *err) {
    const struct model_plan *p = &m->plan;
    struct model_keep *kp = &m->keep;
    if (p->is_last && kp->cap == 0)
        return tpi_err(err, TPI_ERR_INVALID, "model_forward_keep: model_keep_init not called");
    int rc = forward_run(m, tokens, pos, seq, n_tokens, out_idx, n_out, NULL, true, err);
    if (rc) return rc;
    kp->n_rows = p->is_last ? n_out : 0;
    if (!kp->rows || n_out == 0) return TPI_OK; // only the decider keeps rows
    // Each rank slice's best k, then the host merges the slices' lists.
    const double t0 = tpi_time_s();
    const struct ops *ops = m->ops;
    const int n_vocab = m->cfg.n_vocab, tp = p->tp, k = kp->k;
    int32_t *ids_dev = kp->top_dev;
    float *vals_dev = (float *)(ids_dev + (size_t)tp * kp->cap * k);
    int32_t *bad_dev = (int32_t *)(vals_dev + (size_t)tp * kp->cap * k);
    int *k_r = kp->slice_k;
    for (int r = 0; r < tp; r++) {
        int v0, nv;
        model_vocab_range(n_vocab, tp, r, &v0, &nv);
        k_r[r] = TPI_MIN(k, nv);
        const size_t o = (size_t)r * kp->cap;
        ops->row_top(m->octx, kp->rows + o * p->n_vocab_pad, n_out, nv, nv, v0, k_r[r],
                     ids_dev + o * k, vals_dev + o * k, bad_dev + o);
    }
    const size_t n_bytes = ((size_t)2 * k + 1) * sizeof(int32_t) * tp * kp->cap;
    ops->to_host(m->octx, kp->top_host, kp->top_dev, n_bytes);
    if ((rc = ops->check(m->octx, err))) return rc;
    const int32_t *ids_h = kp->top_host;
    const float *vals_h = (const float *)(ids_h + (size_t)tp * kp->cap * k);
    const int32_t *bad_h = (const int32_t *)(vals_h + (size_t)tp * kp->cap * k);
    for (int i = 0; i < n_out; i++) {
        bool bad = false;
        for (int r = 0; r < tp; r++) bad |= bad_h[(size_t)r * kp->cap + i] != 0;
        kp->bad[i] = bad;
        keep_merge(kp, tp, i, ids_h, vals_h);
    }
    m->t_forward_s += tpi_time_s() - t0;
    return TPI_OK;
}

int model_keep_fetch(struct model *m, const int *rows, int n, float *logits,
                     struct tpi_error *err) {
    const struct model_plan *p = &m->plan;
    struct model_keep *kp = &m->keep;
    struct model_state *s = &m->s;
    const int n_vocab = m->cfg.n_vocab, tp = p->tp;
    for (int a = 0; a < n;) {
        if (rows[a] < 0 || rows[a] >= kp->n_rows || (a > 0 && rows[a] <= rows[a - 1]))
            return tpi_err(err, TPI_ERR_INVALID, "model_keep_fetch: row %d (= %d) of %d", a,
                           rows[a], kp->n_rows);
        int b = a + 1; // a run of consecutive rows, at most a staging buffer's worth
        while (b < n && rows[b] == rows[b - 1] + 1 && b - a < s->n_ubatch) b++;
        const size_t first = (size_t)rows[a], run = (size_t)(b - a);
        if (tp == 1) {
            m->ops->to_host(m->octx, logits + first * n_vocab, kp->rows + first * n_vocab,
                            sizeof(float) * run * n_vocab);
        } else {
            for (int r = 0; r < tp; r++) {
                int v0, nv;
                model_vocab_range(n_vocab, tp, r, &v0, &nv);
                m->ops->to_host(m->octx, s->logits_host,
                                kp->rows + (size_t)r * kp->cap * p->n_vocab_pad + first * nv,
                                sizeof(float) * run * nv);
                for (size_t i = 0; i < run; i++)
                    memcpy(logits + (first + i) * n_vocab + v0, s->logits_host + i * nv,
                           sizeof(float) * (size_t)nv);
            }
        }
        a = b;
    }
    return m->ops->check(m->octx, err);
}
