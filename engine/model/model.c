/*
 * model.c — build and free a rank's model: open the file, agree on the run
 * identity, read the config, make the shard plan, upload the weights, allocate
 * the KV cache and the activation buffers (sizes first, then one allocation
 * each), and create the TP and PP communicators.
 *
 * Every fallible step ends in model_agree (grid_agree over the world), so a
 * failure on one rank — a missing file, a bad tp — becomes the same one-line
 * error on every rank, never a hang in a later collective.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "kernels/quant.h"
#include "model.h"
#include "sampling.h"
#include "parallel/watchdog.h"

int model_agree(const struct model *m, int status, struct tpi_error *err) {
    if (!m->grid) return status;
    return grid_agree(m->grid, status, err);
}

int model_decider_rank(const struct model *m) {
    if (!m->grid) return 0;
    return grid_rank_of(m->grid, 0, m->grid->pp - 1);
}

bool model_has_logits(const struct model *m) { return m->plan.is_last; }

float *model_logits_alloc(const struct model *m, size_t n_rows) {
    const size_t n_bytes = sizeof(float) * n_rows * (size_t)m->cfg.n_vocab;
    return m->ops->host_alloc ? m->ops->host_alloc(m->octx, n_bytes) : malloc(n_bytes);
}

void model_logits_free(const struct model *m, float *logits) {
    if (!logits) return;
    if (m->ops->host_free)
        m->ops->host_free(m->octx, logits);
    else
        free(logits);
}

static void keep_free(struct model *m) {
    struct model_keep *kp = &m->keep;
    if (m->octx) {
        if (kp->rows) m->ops->dealloc(m->octx, kp->rows);
        if (kp->top_dev) m->ops->dealloc(m->octx, kp->top_dev);
    }
    free(kp->top_host);
    free(kp->ids);
    free(kp->vals);
    free(kp->bad);
    free(kp->slice_k);
    free(kp->merge_at);
    memset(kp, 0, sizeof *kp);
}

int model_keep_init(struct model *m, int n_rows, struct tpi_error *err) {
    const struct model_plan *p = &m->plan;
    keep_free(m);
    if (!p->is_last || n_rows <= 0) return TPI_OK;
    struct model_keep *kp = &m->keep;
    const size_t cap = (size_t)n_rows, tp = (size_t)p->tp;
    kp->k = TPI_MIN(OPS_TOP_MAX, m->cfg.n_vocab);
    kp->cap = n_rows;
    // Only the decider keeps rows: the other ranks' copies of the logits go unread.
    if (m->grid && m->grid->world_rank != model_decider_rank(m)) return TPI_OK;
    const size_t k = (size_t)kp->k, top_bytes = (2 * k + 1) * sizeof(int32_t) * tp * cap;
    const size_t row_bytes = sizeof(float) * tp * cap * (size_t)p->n_vocab_pad;
    kp->rows = m->ops->alloc(m->octx, row_bytes);
    kp->top_dev = m->ops->alloc(m->octx, top_bytes);
    kp->top_host = malloc(top_bytes);
    kp->ids = malloc(sizeof(int32_t) * cap * k);
    kp->vals = malloc(sizeof(float) * cap * k);
    kp->bad = malloc(sizeof(bool) * cap);
    kp->slice_k = malloc(sizeof(int) * tp);
    kp->merge_at = malloc(sizeof(int) * tp);
    if (!kp->rows || !kp->top_dev || !kp->top_host || !kp->ids || !kp->vals || !kp->bad ||
        !kp->slice_k || !kp->merge_at) {
        keep_free(m);
        return tpi_err(err, TPI_ERR_NOMEM, "out of memory for %d rows of logits (%zu bytes)",
                       n_rows, row_bytes);
    }
    return TPI_OK;
}

/* The watchdog's probe: how long this rank's host has been blocked on its device. */
static double model_wait_s(void *arg) {
    const struct model *m = arg;
    return m->ops->wait_s(m->octx);
}

static int bcast(const struct model *m, void *buf, int n, MPI_Datatype dt, int root,
                 struct tpi_error *err) {
    if (!m->grid || m->grid->world_size == 1 || n == 0) return TPI_OK;
    return grid_bcast(m->grid, buf, n, dt, root, err);
}

int model_bcast_i32(const struct model *m, int32_t *buf, int n, int root, struct tpi_error *err) {
    return bcast(m, buf, n, MPI_INT32_T, root, err);
}

int model_bcast_f32(const struct model *m, float *buf, int n, int root, struct tpi_error *err) {
    return bcast(m, buf, n, MPI_FLOAT, root, err);
}

int model_bcast_bytes(const struct model *m, void *buf, int n_bytes, int root,
                      struct tpi_error *err) {
    return bcast(m, buf, n_bytes, MPI_BYTE, root, err);
}

int model_kv_copy(struct model *m, int src_slot, int dst_slot, int n_pos, struct tpi_error *err) {
    const struct ops_kv *kv = &m->kv;
    if (src_slot < 0 || src_slot >= kv->n_slot || dst_slot < 0 || dst_slot >= kv->n_slot ||
        src_slot == dst_slot || n_pos < 0 || n_pos > kv->n_ctx)
        return tpi_err(err, TPI_ERR_INVALID,
                       "kv copy: slot %d -> %d, %d positions (cache: %d slots x %d positions)",
                       src_slot, dst_slot, n_pos, kv->n_slot, kv->n_ctx);
    if (n_pos == 0) return TPI_OK;
    // (n_layer, n_slot, n_ctx, n_kv_head, head_dim) on every backend: a slot's first
    // n_pos positions are one contiguous run per layer, in k and in v.
    const size_t esize = quant_traits(kv->type)->type_size; /* f32, f16: blocks of 1 */
    const size_t row = (size_t)kv->n_kv_head * kv->head_dim * esize;
    const size_t slot_bytes = (size_t)kv->n_ctx * row, n_bytes = (size_t)n_pos * row;
    for (int l = 0; l < kv->n_layer; l++) {
        const size_t layer = (size_t)l * kv->n_slot * slot_bytes;
        const size_t src = layer + (size_t)src_slot * slot_bytes;
        const size_t dst = layer + (size_t)dst_slot * slot_bytes;
        m->ops->copy(m->octx, (uint8_t *)kv->k + dst, (const uint8_t *)kv->k + src, n_bytes);
        m->ops->copy(m->octx, (uint8_t *)kv->v + dst, (const uint8_t *)kv->v + src, n_bytes);
    }
    return TPI_OK; // a failed copy is a deferred backend error: the next forward reports it
}

/* Allocate the activation buffers of one micro-batch. */
static int state_alloc(struct model *m, int n_ubatch, struct tpi_error *err) {
    const struct model_config *c = &m->cfg;
    const struct model_plan *p = &m->plan;
    struct model_state *s = &m->s;
    const size_t nu = (size_t)n_ubatch;
    const size_t q_dim = (size_t)p->n_head_local * c->head_dim;
    const size_t kv_dim = (size_t)p->n_kv_local * c->head_dim;
    s->n_ubatch = n_ubatch;
    struct {
        void **ptr;
        size_t n_bytes;
    } bufs[] = {
        {(void **)&s->x, nu * c->n_embd * sizeof(float)},
        {(void **)&s->h, nu * c->n_embd * sizeof(float)},
        {(void **)&s->q, nu * q_dim * sizeof(float)},
        {(void **)&s->k, nu * kv_dim * sizeof(float)},
        {(void **)&s->v, nu * kv_dim * sizeof(float)},
        {(void **)&s->att, nu * q_dim * sizeof(float)},
        {(void **)&s->o, nu * c->n_embd * sizeof(float)},
        {(void **)&s->g, nu * p->n_ff_local * sizeof(float)},
        {(void **)&s->u, nu * p->n_ff_local * sizeof(float)},
        {(void **)&s->tok, nu * sizeof(int32_t)},
        {(void **)&s->pos, nu * sizeof(int32_t)},
        {(void **)&s->seq, nu * sizeof(int32_t)},
        {(void **)&s->xo, p->is_last ? nu * c->n_embd * sizeof(float) : 0},
        {(void **)&s->logits_local, p->is_last ? nu * p->n_vocab_pad * sizeof(float) : 0},
        {(void **)&s->logits_gather,
         p->is_last && p->tp > 1 ? (size_t)p->tp * nu * p->n_vocab_pad * sizeof(float) : 0},
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        if (!bufs[i].n_bytes) continue;
        *bufs[i].ptr = m->ops->alloc(m->octx, bufs[i].n_bytes);
        if (!*bufs[i].ptr)
            return tpi_err(err, TPI_ERR_NOMEM,
                           "out of backend memory for %zu bytes of activations (--ubatch %d)",
                           bufs[i].n_bytes, n_ubatch);
    }
    if (p->is_last) {
        size_t n = (size_t)p->tp * nu * p->n_vocab_pad;
        s->logits_host = malloc(n * sizeof(float));
        s->rows_host = malloc(nu * sizeof(int32_t));
        if (!s->logits_host || !s->rows_host)
            return tpi_err(err, TPI_ERR_NOMEM, "out of memory for %zu logits", n);
    }
    return TPI_OK;
}

static void state_free(struct model *m) {
    struct model_state *s = &m->s;
    void **ptrs[] = {(void **)&s->x,   (void **)&s->h,   (void **)&s->q,   (void **)&s->k,
                     (void **)&s->v,   (void **)&s->att, (void **)&s->o,   (void **)&s->g,
                     (void **)&s->u,   (void **)&s->tok, (void **)&s->pos, (void **)&s->seq,
                     (void **)&s->xo,  (void **)&s->logits_local, (void **)&s->logits_gather};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) {
        if (*ptrs[i] && m->octx) m->ops->dealloc(m->octx, *ptrs[i]);
        *ptrs[i] = NULL;
    }
    free(s->logits_host);
    s->logits_host = NULL;
    free(s->rows_host);
    s->rows_host = NULL;
}

int model_cpu_threads(int n_threads, const struct tpi_grid *grid) {
    if (n_threads > 0) return n_threads;
    // Ranks on one node share its cores: by default each takes its share, so the CPU
    // backend's threads never outnumber the cores (spinning OpenMP threads on an
    // oversubscribed node slow a run by orders of magnitude).
    const int local = grid && grid->local_size > 1 ? grid->local_size : 1;
    return TPI_MAX(1, tpi_cpu_count() / local);
}

unsigned model_sampling_defaults(const struct gguf_file *f, struct sampler_params *p,
                                 unsigned keep, bool openai, bool warn) {
    // The ranges the command-line options take, except that vLLM takes neither a negative
    // temperature nor a top-p of 0, nor the window.
    unsigned took = 0;
    for (int k = 0; k < n_sampler_fields; k++) {
        const struct sampler_field_desc *d = &sampler_fields[k];
        char key[64];
        float v;
        if (!d->gguf || (keep & d->bit) || (openai && d->bit == SP_REPEAT_LAST_N)) continue;
        snprintf(key, sizeof key, "general.sampling.%s", d->gguf);
        if (!gguf_get_f32(f, key, &v)) continue;
        if (!sampler_field_ok(d, v) || (openai && d->bit == SP_TEMP && v < 0.0f) ||
            (openai && d->bit == SP_TOP_P && v == 0.0f)) {
            if (warn)
                TPI_LOGW("%s: %s %g is not a value the sampler takes; ignored", gguf_path(f), key,
                         (double)v);
            continue;
        }
        sampler_field_set(p, d, v);
        took |= d->bit;
    }
    return took;
}

/* The context a run has: -c, else min(4096, the file's <arch>.context_length, 4096 when
 * absent). The run identity compares it (so -c 4096 on one rank and the default on
 * another are one run when the default is 4096), and model_load sizes the KV cache by it. */
static int32_t run_ctx(const struct model_params *p, const struct gguf_file *f) {
    if (p->n_ctx > 0) return p->n_ctx;
    struct gguf_str arch;
    int64_t v = 4096;
    char key[160];
    if (gguf_get_str(f, "general.architecture", &arch) && arch.len < 128) {
        snprintf(key, sizeof key, "%.*s.context_length", (int)arch.len, arch.data);
        if (!gguf_get_int(f, key, &v) || v < 1) v = 4096;
    }
    return (int32_t)TPI_MIN(4096, v);
}

/* FNV-1a of the run's rope options (0: none given). */
static uint64_t rope_options_hash(const struct model_rope_opts *o) {
    if (!o->scaling && !(o->scale > 0.0f) && o->orig_ctx <= 0) return 0;
    uint64_t h = TPI_FNV_INIT;
    if (o->scaling) h = tpi_fnv1a(h, o->scaling, strlen(o->scaling) + 1);
    h = tpi_fnv1a(h, &o->scale, sizeof o->scale);
    return tpi_fnv1a(h, &o->orig_ctx, sizeof o->orig_ctx);
}

/* Open the model and check the identity of the run across ranks. */
static int open_and_check(struct model *m, const struct model_params *p, struct tpi_error *err) {
    int rc = gguf_open(p->path, &m->gguf, err);
    if ((rc = model_agree(m, rc, err))) return rc;
    if (!m->grid) return TPI_OK;
    struct run_identity id = {
        .model_size = gguf_total_size(m->gguf),
        .metadata_hash = gguf_metadata_hash(m->gguf),
        .data_hash = gguf_data_sample_hash(m->gguf),
        .tp = m->grid->tp,
        .pp = m->grid->pp,
        .backend = strcmp(m->ops->name, "cuda") == 0 ? 1 : 0,
        .comm = (int32_t)p->comm,
        .n_ctx = run_ctx(p, m->gguf),
        .n_slot = p->n_slot,
        .n_ubatch = p->n_ubatch,
        .seed = p->seed,
        .pp_layers_hash = p->pp_layers ? tpi_fnv1a(TPI_FNV_INIT, p->pp_layers,
                                                   sizeof *p->pp_layers * (size_t)p->n_pp_layers)
                                       : 0,
        .rope_hash = rope_options_hash(&p->rope),
    };
    return grid_check_identity(m->grid, &id, err);
}

/* Before anything big is allocated on a GPU: will this rank's weights, KV cache and
 * activations fit in the device's free memory? A clear error naming the sizes and
 * what to change beats an out-of-memory halfway through the upload. */
static int check_fits(struct model *m, int n_ubatch, struct tpi_error *err) {
    size_t free_b = 0, total_b = 0;
    if (ops_device_mem(m->ops, &free_b, &total_b) != 0) return TPI_OK; // host memory
    const struct model_config *c = &m->cfg;
    const struct model_plan *p = &m->plan;
    struct model_weights w;
    int rc = model_weights_count(m->gguf, c, p, &w, err);
    if (rc) return rc;
    const size_t kv_bytes = 2 * sizeof(uint16_t) * (size_t)p->n_layer_stage * (size_t)m->n_slot *
                            (size_t)m->n_ctx * (size_t)p->n_kv_local * (size_t)c->head_dim;
    const size_t q_dim = (size_t)p->n_head_local * c->head_dim;
    const size_t kv_dim = (size_t)p->n_kv_local * c->head_dim;
    size_t per_token = 4 * c->n_embd + 2 * q_dim + 2 * kv_dim + 2 * (size_t)p->n_ff_local;
    if (p->is_last) per_token += (size_t)p->n_vocab_pad * (1 + (p->tp > 1 ? p->tp : 0));
    const size_t act_bytes = sizeof(float) * per_token * (size_t)n_ubatch;
    // Dequantization slab, cuBLAS workspace, graphs and the CUDA context itself.
    const size_t scratch = (size_t)768 << 20;
    const size_t need = w.n_bytes_gpu + kv_bytes + act_bytes + scratch;
    if (need <= free_b) return TPI_OK;
    const double G = 1073741824.0;
    /* Q3_K / IQ4 weights held as Q6_K / Q8_0 under TPI_HOLD=1 (quant_gpu_held_type):
     * their own format is a way out too */
    char own[160] = "";
    if (w.n_bytes_gpu > w.n_bytes)
        snprintf(own, sizeof own,
                 ", or run Q3_K and IQ4 weights in their own format without TPI_HOLD=1 "
                 "(weights %.2f GiB instead of %.2f)",
                 w.n_bytes / G, w.n_bytes_gpu / G);
    return tpi_err(err, TPI_ERR_NOMEM,
                   "this rank needs %.2f GiB on its GPU (weights %.2f, KV cache %.2f for %d "
                   "x %d positions, activations %.2f for --ubatch %d, scratch %.2f) but only "
                   "%.2f of %.2f GiB are free: lower -c/--ctx-size or --parallel, or spread "
                   "the model over more GPUs with --tp/--pp%s",
                   need / G, w.n_bytes_gpu / G, kv_bytes / G, m->n_slot, m->n_ctx, act_bytes / G,
                   n_ubatch, scratch / G, free_b / G, total_b / G, own);
}

/* The layout at start: world rank 0 collects one line from every rank (host,
 * ranks, GPU and its PCI bus id, layers, heads, weight and KV bytes) and prints
 * them in rank order, so a user sees where every shard landed. */
static int rank_banner(const struct model *m, const struct tpi_grid *grid, int device,
                       double load_s, bool print, struct tpi_error *err) {
    const struct model_plan *pl = &m->plan;
    char pci[32], line[256];
    ops_device_pci(m->ops, device, pci, sizeof pci);
    const bool gpu = strcmp(m->ops->name, "cuda") == 0;
    char gpu_idx[16];
    snprintf(gpu_idx, sizeof gpu_idx, gpu ? "%d" : "-", device);
    const size_t held = gpu ? m->w.n_bytes_gpu : m->w.n_bytes; /* the load rate: file bytes */
    snprintf(line, sizeof line,
             "%4d %-14.14s %3d %5d  %-3s %-18.18s %-13s %5d-%-3d %3d-%-3d %9.1f %8.1f %6.1f %7.2f",
             grid ? grid->world_rank : 0, grid ? grid->host : "local", pl->tp_rank, pl->pp_stage,
             gpu_idx, m->ops->device_name(m->octx), pci, pl->layer0,
             pl->layer0 + pl->n_layer_stage - 1, pl->head0, pl->head0 + pl->n_head_local - 1,
             held / 1048576.0, m->kv.n_bytes / 1048576.0, load_s,
             load_s > 0 ? m->w.n_bytes / 1e9 / load_s : 0.0);
    const int n_ranks = grid ? grid->world_size : 1;
    char *all = NULL;
    if (!grid || grid->world_rank == 0) all = calloc((size_t)n_ranks, sizeof line);
    if (grid && grid->world_size > 1) {
        // Nonblocking, with the collectives' limit: a rank that never comes is then the
        // next agreement's error instead of a wait here without end. Heap copies: a
        // timed-out request may still use them (they leak then). (Out of memory for a few
        // hundred bytes here leaves the ranks' collectives unmatched; the next agreement
        // then times out.)
        char *mine = malloc(sizeof line);
        if (!mine || (grid->world_rank == 0 && !all)) {
            free(mine);
            free(all);
            return TPI_OK;
        }
        memcpy(mine, line, sizeof line);
        MPI_Request req;
        int st = MPI_Igather(mine, (int)sizeof line, MPI_CHAR, all, (int)sizeof line, MPI_CHAR, 0,
                             grid->world, &req) == MPI_SUCCESS
                     ? grid_poll(&req, comm_op_timeout_s())
                     : TPI_ERR_COMM;
        if (st == TPI_ERR_TIMEOUT)
            return tpi_err(err, TPI_ERR_TIMEOUT,
                           "world rank %d waited %.0f s for the other ranks' rows of the rank "
                           "table after loading: one is stuck or far behind "
                           "(TPI_COMM_OP_TIMEOUT=S changes the limit)",
                           grid->world_rank, comm_op_timeout_s());
        free(mine);
        if (st != TPI_OK || !print) {
            free(all);
            return TPI_OK;
        }
    } else if (all) {
        memcpy(all, line, sizeof line);
    }
    if (!all) return TPI_OK;
    if (!print) {
        free(all);
        return TPI_OK;
    }
    TPI_LOGI("rank host           tp stage gpu device             pci bus id    layers  heads "
             "   weights MiB  KV MiB load s    GB/s");
    for (int r = 0; r < n_ranks; r++) TPI_LOGI("%s", all + (size_t)r * sizeof line);
    if (m->w.n_expanded_f32 > 0 && (!grid || grid->world_size == 1))
        TPI_LOGI("(%d row-parallel slices held as F32)", m->w.n_expanded_f32);
    free(all);
    return TPI_OK;
}

/* Whether the switch `name` is on in the environment: set, not empty and not "0". */
static bool env_on(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

int model_load(struct model **out, const struct model_params *p, const struct tpi_grid *grid,
               struct tpi_error *err) {
    *out = NULL;
    struct model *m = calloc(1, sizeof *m);
    if (!m) return tpi_err(err, TPI_ERR_NOMEM, "out of memory for the model");
    m->grid = grid;
    const int tp = grid ? grid->tp : 1, pp = grid ? grid->pp : 1;
    const int tp_rank = grid ? grid->tp_rank : 0, pp_stage = grid ? grid->pp_stage : 0;
    const int world_rank = grid ? grid->world_rank : 0;
    double t0 = tpi_time_s();
    int rc = TPI_OK;

    // Backend first: the identity includes it, and a rank without a GPU must fail
    // together with the others.
    m->ops = ops_by_name(p->backend ? p->backend : "cpu", err);
    if (!m->ops) rc = err->status;
    if ((rc = model_agree(m, rc, err))) goto fail;
    if ((rc = open_and_check(m, p, err))) goto fail;

    rc = model_config_from_gguf(&m->cfg, m->gguf, err);
    if ((rc = model_agree(m, rc, err))) goto fail;
    model_config_rope_override(&m->cfg, &p->rope); // the identity compared the options
    rc = model_plan_make(&m->plan, &m->cfg, tp, pp, tp_rank, pp_stage, p->pp_layers,
                         p->n_pp_layers, err);
    if ((rc = model_agree(m, rc, err))) goto fail;

    m->n_ctx = run_ctx(p, m->gguf); // the identity compared the same value
    m->n_slot = p->n_slot > 0 ? p->n_slot : 1;
    int n_ubatch = p->n_ubatch > 0 ? p->n_ubatch : 512;

    struct ops_config oc = {.n_threads = model_cpu_threads(p->n_threads, grid), .device = 0};
    if (grid && strcmp(m->ops->name, "cuda") == 0) {
        int n_dev = 0;
        ops_cuda_available(&n_dev);
        oc.device = n_dev > 0 ? grid->local_rank % n_dev : 0;
    }
    if (p->cuda_device_set) oc.device = p->cuda_device;
    rc = m->ops->init(&m->octx, &oc, err);
    if (!rc) rc = check_fits(m, n_ubatch, err);
    if ((rc = model_agree(m, rc, err))) goto fail;
    m->use_graphs = m->ops->graph_begin && !env_on("TPI_NO_GRAPH");
    // Steps of up to 32 tokens run as graphs, the batch command's 9-32-row decode steps
    // too (bench/NOTES.md changes 158, 160); TPI_GRAPH_TOKENS=N (1..32) narrows that.
    const char *gt = getenv("TPI_GRAPH_TOKENS");
    m->graph_max_tokens = MODEL_GRAPH_MAX_TOKENS;
    if (gt && *gt) {
        char *end = NULL;
        const long v = strtol(gt, &end, 10);
        if (*end || v < 1 || v > MODEL_GRAPH_MAX_TOKENS)
            TPI_LOGW("TPI_GRAPH_TOKENS=%s is not 1..%d: steps of up to %d tokens run as graphs",
                     gt, MODEL_GRAPH_MAX_TOKENS, MODEL_GRAPH_MAX_TOKENS);
        else
            m->graph_max_tokens = (int)v;
    }
    // A comparing knob: TPI_LOGITS_KEEP=0 copies every row of logits to the host whole.
    const char *lk = getenv("TPI_LOGITS_KEEP");
    m->logits_keep = !(lk && strcmp(lk, "0") == 0);
    // A measuring knob: the step without its all-reduces shows their share of it.
    m->tp_skip_allreduce = tp > 1 && env_on("TPI_TP_SKIP_ALLREDUCE");
    if (m->tp_skip_allreduce && world_rank == 0)
        TPI_LOGW("TPI_TP_SKIP_ALLREDUCE is set: the tensor-parallel all-reduces are skipped, so "
                 "outputs are wrong; use it only to time the rest of a step");
    // Another: decode steps without their FFN sub-layers show what the FFN costs in a step.
    m->diag_skip_ffn = env_on("TPI_DIAG_SKIP_FFN");
    if (m->diag_skip_ffn && world_rank == 0)
        TPI_LOGW("TPI_DIAG_SKIP_FFN is set: decode steps skip their FFN sub-layers, so outputs "
                 "are wrong; use it only to time the rest of a step");

    rc = model_weights_load(m, err);
    if (!rc) rc = m->ops->check(m->octx, err);
    if ((rc = model_agree(m, rc, err))) goto fail;

    rc = m->ops->kv_init(m->octx, &m->kv, m->plan.n_layer_stage, m->n_slot, m->n_ctx,
                         m->plan.n_kv_local, m->cfg.head_dim, err);
    if (!rc) rc = state_alloc(m, n_ubatch, err);
    if ((rc = model_agree(m, rc, err))) goto fail;

    // Communicators: creation is collective over each group; every rank calls it
    // whatever happened locally so no group waits forever on a missing member.
    double timeout = p->comm_timeout_s > 0 ? p->comm_timeout_s : 60.0;
    if (tp > 1) {
        rc = comm_create(&m->tp_comm, p->comm, grid->tp_comm, m->ops, m->octx, timeout, err);
        if ((rc = model_agree(m, rc, err))) goto fail;
    }
    if (pp > 1) {
        rc = comm_create(&m->pp_comm, p->comm, grid->pp_comm, m->ops, m->octx, timeout, err);
        if ((rc = model_agree(m, rc, err))) goto fail;
    }

    // Device-side collectives (NCCL, the peer all-reduce) cannot time out on their own:
    // a host blocked on the GPU longer than a collective may take stops the rank.
    const bool device_comm = (m->tp_comm && m->tp_comm->kind == COMM_NCCL) ||
                             (m->pp_comm && m->pp_comm->kind == COMM_NCCL);
    if (device_comm && m->ops->wait_s) {
        rc = tpi_watchdog_start(&m->watchdog, model_wait_s, m, comm_op_timeout_s(), world_rank,
                                NULL, err);
        if ((rc = model_agree(m, rc, err))) goto fail;
    }

    if (!p->quiet) {
        char desc[256];
        model_config_describe(&m->cfg, desc, sizeof desc);
        if (world_rank == 0) TPI_LOGI("model %s: %s", p->path, desc);
    }
    // Every rank gathers the rank table, quiet or not (ranks may differ in -v); rank 0
    // prints it unless quiet.
    if ((rc = rank_banner(m, grid, oc.device, tpi_time_s() - t0, !p->quiet, err))) goto fail;
    *out = m;
    return TPI_OK;
fail:
    model_free(&m);
    return rc;
}

void model_free(struct model **pm) {
    struct model *m = pm ? *pm : NULL;
    if (!m) return;
    // Graphs first: they hold pointers into the buffers below and the NCCL calls they recorded.
    if (m->octx) model_graphs_free(m);
    tpi_watchdog_stop(&m->watchdog);
    comm_free(&m->tp_comm);
    comm_free(&m->pp_comm);
    keep_free(m);
    if (m->octx) {
        state_free(m);
        if (m->kv.k || m->kv.v) m->ops->kv_free(m->octx, &m->kv);
        model_weights_free(m);
        m->ops->free(&m->octx);
    }
    gguf_close(&m->gguf);
    free(m);
    *pm = NULL;
}
