/*
 * weights.c — upload this rank's slices of the model into backend memory.
 *
 * The GGUF reader hands out zero-copy views into a read-only mmap, so a rank
 * reads (pages in) only the byte ranges it uploads:
 * - column-parallel weights (Q/K/V by heads, gate/up, lm_head by vocab rows) are
 *   a contiguous range of rows: one pointer into the mapping, uploaded as is;
 * - row-parallel weights (attn_output, ffn_down) are a column range of every row:
 *   quant_extract_cols copies the whole blocks of that range, same type. When the
 *   range does not fall on the type's block edges (a 256-element K-quant block
 *   split at tp = 4 on a 512-wide attn_output) the slice is expanded to F32 —
 *   dequantize each row, keep the columns — which is exact; re-quantizing the
 *   slice would change the weights, so we never do that;
 * - norms and biases are dequantized to f32 arrays (they are tiny).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "kernels/quant.h"
#include "model.h"

/* Load state shared by the helpers: where to count bytes, the first F32 expansion. */
struct loader {
    struct model *m;
    bool dry; /* count bytes only (tpinfer info's shard plan): no backend, no copies */
    char first_expanded[96];
    int first_expanded_type;
    int64_t first_col0, first_n_cols;
};

static const struct gguf_tensor *need(struct model *m, const char *name, struct tpi_error *err) {
    const struct gguf_tensor *t = gguf_find_tensor(m->gguf, name);
    if (!t) tpi_err(err, TPI_ERR_FORMAT, "%s: tensor '%s' is missing", gguf_path(m->gguf), name);
    return t;
}

/* Count n_rows rows of n_cols values of `type` into the rank's totals: their bytes, and
 * their bytes as the CUDA backend holds them (quant_gpu_held_type). */
static void count_bytes(struct model *m, int type, int64_t n_cols, int64_t n_rows,
                        bool replicated) {
    const size_t n = quant_row_size(type, n_cols) * (size_t)n_rows;
    m->w.n_bytes += n;
    m->w.n_bytes_gpu += quant_row_size(quant_gpu_held_type(type), n_cols) * (size_t)n_rows;
    if (replicated) m->w.n_bytes_replicated += n;
}

/* Rows [row0, row0 + n_rows) of t, uploaded in t's type: one contiguous byte range. */
static int upload_rows(struct loader *L, struct tpi_weight *w, const struct gguf_tensor *t,
                       int64_t row0, int64_t n_rows, bool replicated, struct tpi_error *err) {
    struct model *m = L->m;
    size_t row_bytes = quant_row_size(t->type, t->ne[0]);
    const uint8_t *src = t->data + (size_t)row0 * row_bytes;
    int rc = L->dry ? TPI_OK : m->ops->weight_upload(m->octx, w, t->type, t->ne[0], n_rows, src, err);
    if (rc) return tpi_err_wrap(err, "tensor '%s' rows [%lld, %lld)", t->name, (long long)row0,
                                (long long)(row0 + n_rows));
    count_bytes(m, t->type, t->ne[0], n_rows, replicated);
    return TPI_OK;
}

/* Columns [col0, col0 + n_cols) of every row of t (row-parallel slice). */
static int upload_cols(struct loader *L, struct tpi_weight *w, const struct gguf_tensor *t,
                       int64_t col0, int64_t n_cols, struct tpi_error *err) {
    struct model *m = L->m;
    const int64_t ne0 = t->ne[0], ne1 = t->ne[1];
    if (col0 == 0 && n_cols == ne0) return upload_rows(L, w, t, 0, ne1, false, err);
    const struct quant_traits *tr = quant_traits(t->type);
    int rc;
    if (col0 % tr->blck_size == 0 && n_cols % tr->blck_size == 0) {
        size_t n_bytes = quant_row_size(t->type, n_cols) * (size_t)ne1;
        if (L->dry) {
            count_bytes(m, t->type, n_cols, ne1, false);
            return TPI_OK;
        }
        void *buf = malloc(n_bytes);
        if (!buf) return tpi_err(err, TPI_ERR_NOMEM, "tensor '%s': out of memory for %zu bytes",
                                 t->name, n_bytes);
        rc = quant_extract_cols(t->type, t->data, ne0, ne1, col0, n_cols, buf, err);
        if (!rc) rc = m->ops->weight_upload(m->octx, w, t->type, n_cols, ne1, buf, err);
        free(buf);
        if (rc) return tpi_err_wrap(err, "tensor '%s' columns [%lld, %lld)", t->name,
                                    (long long)col0, (long long)(col0 + n_cols));
        count_bytes(m, t->type, n_cols, ne1, false);
        return TPI_OK;
    }
    // Off the block edge: expand to F32 (exact), row by row to bound the scratch.
    size_t n_bytes = sizeof(float) * (size_t)n_cols * (size_t)ne1;
    if (L->dry) {
        m->w.n_expanded_f32++;
        count_bytes(m, TPI_TYPE_F32, n_cols, ne1, false);
        return TPI_OK;
    }
    float *buf = malloc(n_bytes);
    float *row = malloc(sizeof(float) * (size_t)ne0);
    if (!buf || !row) {
        free(buf);
        free(row);
        return tpi_err(err, TPI_ERR_NOMEM, "tensor '%s': out of memory for %zu bytes", t->name,
                       n_bytes);
    }
    rc = TPI_OK;
    for (int64_t r = 0; r < ne1 && !rc; r++) {
        rc = quant_dequant_rows(t->type, t->data, ne0, r, 1, row, err);
        memcpy(buf + r * n_cols, row + col0, sizeof(float) * (size_t)n_cols);
    }
    free(row);
    if (!rc) rc = m->ops->weight_upload(m->octx, w, TPI_TYPE_F32, n_cols, ne1, buf, err);
    free(buf);
    if (rc) return tpi_err_wrap(err, "tensor '%s' columns [%lld, %lld) as F32", t->name,
                                (long long)col0, (long long)(col0 + n_cols));
    if (m->w.n_expanded_f32++ == 0) {
        snprintf(L->first_expanded, sizeof L->first_expanded, "%s", t->name);
        L->first_expanded_type = t->type;
        L->first_col0 = col0;
        L->first_n_cols = n_cols;
    }
    count_bytes(m, TPI_TYPE_F32, n_cols, ne1, false);
    return TPI_OK;
}

/* Elements [off, off + n) of a 1-D tensor as an f32 array in backend memory. */
static int upload_vec(struct loader *L, float **dst, const struct gguf_tensor *t, int64_t off,
                      int64_t n, bool replicated, struct tpi_error *err) {
    struct model *m = L->m;
    if (L->dry) {
        count_bytes(m, TPI_TYPE_F32, n, 1, replicated);
        return TPI_OK;
    }
    float *tmp = malloc(sizeof(float) * (size_t)t->ne[0]);
    if (!tmp) return tpi_err(err, TPI_ERR_NOMEM, "tensor '%s': out of memory", t->name);
    int rc = quant_dequant_rows(t->type, t->data, t->ne[0], 0, 1, tmp, err);
    if (rc) {
        free(tmp);
        return tpi_err_wrap(err, "tensor '%s'", t->name);
    }
    size_t n_bytes = sizeof(float) * (size_t)n;
    *dst = m->ops->alloc(m->octx, n_bytes);
    if (!*dst) {
        free(tmp);
        return tpi_err(err, TPI_ERR_NOMEM, "tensor '%s': backend out of memory for %zu bytes",
                       t->name, n_bytes);
    }
    m->ops->to_dev(m->octx, *dst, tmp + off, n_bytes);
    m->ops->sync(m->octx); // to_dev may read tmp until the stream drains
    free(tmp);
    count_bytes(m, TPI_TYPE_F32, n, 1, replicated);
    return TPI_OK;
}

static int load_layer(struct loader *L, int il, struct model_layer *ly, struct tpi_error *err) {
    struct model *m = L->m;
    const struct model_config *c = &m->cfg;
    const struct model_plan *p = &m->plan;
    const int l = p->layer0 + il; // global layer index
    const int64_t hd = c->head_dim;
    const int64_t q0 = p->head0 * hd, nq = p->n_head_local * hd;
    const int64_t k0 = p->kv_head0 * hd, nk = p->n_kv_local * hd;
    const struct gguf_tensor *t;
    char name[96];
    int rc;
#define T(suffix) (snprintf(name, sizeof name, "blk.%d." suffix, l), t = need(m, name, err))
    if (!T("attn_norm.weight") || (rc = upload_vec(L, &ly->attn_norm, t, 0, c->n_embd, true, err)))
        return err->status;
    if (!T("attn_q.weight") || (rc = upload_rows(L, &ly->wq, t, q0, nq, false, err))) return err->status;
    if (!T("attn_k.weight") || (rc = upload_rows(L, &ly->wk, t, k0, nk, false, err))) return err->status;
    if (!T("attn_v.weight") || (rc = upload_rows(L, &ly->wv, t, k0, nk, false, err))) return err->status;
    if (c->has_qkv_bias) {
        if (!T("attn_q.bias") || (rc = upload_vec(L, &ly->bq, t, q0, nq, false, err))) return err->status;
        if (!T("attn_k.bias") || (rc = upload_vec(L, &ly->bk, t, k0, nk, false, err))) return err->status;
        if (!T("attn_v.bias") || (rc = upload_vec(L, &ly->bv, t, k0, nk, false, err))) return err->status;
    }
    if (c->has_qk_norm) {
        if (!T("attn_q_norm.weight") || (rc = upload_vec(L, &ly->q_norm, t, 0, hd, true, err)))
            return err->status;
        if (!T("attn_k_norm.weight") || (rc = upload_vec(L, &ly->k_norm, t, 0, hd, true, err)))
            return err->status;
    }
    if (!T("attn_output.weight") || (rc = upload_cols(L, &ly->wo, t, q0, nq, err))) return err->status;
    if (!T("ffn_norm.weight") || (rc = upload_vec(L, &ly->ffn_norm, t, 0, c->n_embd, true, err)))
        return err->status;
    const int64_t f0 = p->ff0, nf = p->n_ff_local;
    if (!T("ffn_gate.weight") || (rc = upload_rows(L, &ly->w_gate, t, f0, nf, false, err))) return err->status;
    if (!T("ffn_up.weight") || (rc = upload_rows(L, &ly->w_up, t, f0, nf, false, err))) return err->status;
    if (!T("ffn_down.weight") || (rc = upload_cols(L, &ly->w_down, t, f0, nf, err))) return err->status;
#undef T
    return TPI_OK;
}

/* Every tensor slice this rank holds, uploaded (or only counted when L->dry). */
static int load_all(struct loader *L, struct tpi_error *err);

int model_weights_load(struct model *m, struct tpi_error *err) {
    struct loader L = {.m = m};
    return load_all(&L, err);
}

int model_weights_count(const struct gguf_file *f, const struct model_config *cfg,
                        const struct model_plan *plan, struct model_weights *out,
                        struct tpi_error *err) {
    struct model m;
    memset(&m, 0, sizeof m);
    m.gguf = (struct gguf_file *)f; // read only: the dry loader never writes through it
    m.cfg = *cfg;
    m.plan = *plan;
    struct loader L = {.m = &m, .dry = true};
    int rc = load_all(&L, err);
    free(m.w.layers);
    m.w.layers = NULL;
    *out = m.w;
    return rc;
}

static int load_all(struct loader *L, struct tpi_error *err) {
    struct model *m = L->m;
    const struct model_plan *p = &m->plan;
    int rc;
    m->w.layers = calloc((size_t)p->n_layer_stage, sizeof *m->w.layers);
    if (!m->w.layers) return tpi_err(err, TPI_ERR_NOMEM, "out of memory for layer table");

    const struct gguf_tensor *emb = need(m, "token_embd.weight", err);
    if (!emb) return err->status;
    // token_embd is replicated on stage 0 (not vocab-parallel): an embedding lookup
    // is a gather, not a matmul, so splitting it would only add an all-reduce of the
    // full activations per micro-batch to save memory the lm_head split already saves.
    if (p->is_first &&
        (rc = upload_rows(L, &m->w.token_embd, emb, 0, emb->ne[1], true, err)))
        return rc;
    for (int il = 0; il < p->n_layer_stage; il++)
        if ((rc = load_layer(L, il, &m->w.layers[il], err))) return rc;
    if (p->is_last) {
        const struct gguf_tensor *t = need(m, "output_norm.weight", err);
        if (!t || (rc = upload_vec(L, &m->w.output_norm, t, 0, m->cfg.n_embd, true, err)))
            return err->status;
        const struct gguf_tensor *out = m->cfg.tied_output ? emb : need(m, "output.weight", err);
        if (!out) return err->status;
        if (m->cfg.tied_output && p->tp == 1 && p->is_first) {
            m->w.output = m->w.token_embd; // tied and unsplit: one copy serves both
            m->w.output_is_embd = true;
        } else if ((rc = upload_rows(L, &m->w.output, out, p->vocab0, p->n_vocab_local, false,
                                     err))) {
            return rc;
        }
    }
    if (m->w.n_expanded_f32 > 0 && p->tp_rank == 0 && !L->dry) // one line per stage
        TPI_LOGW("%d row-parallel slice(s) expanded to F32 because tp=%d splits them off the "
                 "%s block edge (first: %s, columns [%lld, %lld)); exact, but more memory",
                 m->w.n_expanded_f32, p->tp, quant_type_name(L->first_expanded_type),
                 L->first_expanded, (long long)L->first_col0,
                 (long long)(L->first_col0 + L->first_n_cols));
    return TPI_OK;
}

static void free_vec(struct model *m, float **p) {
    if (*p) m->ops->dealloc(m->octx, *p);
    *p = NULL;
}

void model_weights_free(struct model *m) {
    if (!m->ops || !m->octx) return;
    if (m->w.layers) {
        for (int il = 0; il < m->plan.n_layer_stage; il++) {
            struct model_layer *ly = &m->w.layers[il];
            free_vec(m, &ly->attn_norm);
            free_vec(m, &ly->ffn_norm);
            free_vec(m, &ly->bq);
            free_vec(m, &ly->bk);
            free_vec(m, &ly->bv);
            free_vec(m, &ly->q_norm);
            free_vec(m, &ly->k_norm);
            struct tpi_weight *ws[] = {&ly->wq, &ly->wk, &ly->wv, &ly->wo,
                                       &ly->w_gate, &ly->w_up, &ly->w_down};
            for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
                if (ws[i]->data) m->ops->weight_free(m->octx, ws[i]);
        }
        free(m->w.layers);
        m->w.layers = NULL;
    }
    free_vec(m, &m->w.output_norm);
    if (m->w.output.data && !m->w.output_is_embd) m->ops->weight_free(m->octx, &m->w.output);
    if (m->w.token_embd.data) m->ops->weight_free(m->octx, &m->w.token_embd);
    memset(&m->w.output, 0, sizeof m->w.output);
}
