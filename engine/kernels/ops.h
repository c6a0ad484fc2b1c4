/*
 * ops.h — the backend op table. One `struct ops` of function pointers with the
 * same C signatures for the CPU reference (ops_cpu.c) and CUDA (ops_cuda.cu).
 *
 * Conventions
 * - Activations are f32, row-major: a (n_rows, n_cols) matrix is n_rows rows of
 *   n_cols contiguous floats. Every activation pointer is *backend memory*
 *   (host memory for CPU, device memory for CUDA), obtained from ops->alloc.
 * - Weights keep their GGUF type: `struct tpi_weight` holds ne1 rows of ne0
 *   elements (ne0 = input features, contiguous), row r at data + r*row_bytes.
 * - Compute ops are stream-ordered and return nothing; a backend records the
 *   first failure and reports it through ops->check (CUDA launch errors).
 * - A row's result never depends on how many rows are computed together, so
 *   batching never changes CPU output.
 */
#ifndef OPS_H
#define OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../tpi.h"

/* A weight matrix in backend memory, in its GGUF type. */
struct tpi_weight {
    int type;         /* ggml type id (quant.h) */
    int64_t ne0;      /* input features: elements per row */
    int64_t ne1;      /* output features: rows */
    size_t row_bytes; /* quant_row_size(type, ne0) */
    void *data;       /* backend memory, ne1 * row_bytes bytes */
    void *aux;        /* backend-private form (e.g. a repacked copy); NULL if none */
    int layout;       /* backend-private arrangement of data's bytes; 0: the GGUF blocks as
                       * they are (the CUDA backend's is in kern_common.cuh) */
};

/* The tokens of one forward step. Several sequences may be mixed: token t is
 * at position pos[t] of KV slot seq[t]. Device arrays are backend memory; the
 * host copies are the same values, for backends that plan on the host. */
struct ops_batch {
    int n_tokens;
    const int32_t *pos;      /* backend memory, n_tokens */
    const int32_t *seq;      /* backend memory, n_tokens */
    const int32_t *pos_host; /* host memory, n_tokens */
    const int32_t *seq_host; /* host memory, n_tokens */
    int max_pos;             /* 1 + the largest pos in the batch */
};

/* A rotary embedding (NEOX pairs (i, i + n_rot/2) of each head), with llama.cpp's rope
 * scaling: pair i of a token at position pos turns by pos * inv_i, where e_i =
 * freq_base^(-2i/n_rot) and inv_i = e_i * freq_scale (linear interpolation) blended back
 * towards e_i by YaRN's ramp over the pairs (ext_factor 1: the pairs that turn more than
 * beta_fast times over n_ctx_orig positions keep e_i, those under beta_slow take
 * e_i * freq_scale), and cos and sin are scaled by attn_factor (times 1 + 0.1 ln(1 /
 * freq_scale) when ext_factor != 0 and freq_scale < 1). freq_scale 1, ext_factor 0
 * and attn_factor 1 is plain rope. */
struct ops_rope {
    int n_rot;          /* rotated dims per head (even) */
    float freq_base;    /* rope.freq_base */
    float freq_scale;   /* 1 / the scaling factor (1: none) */
    float ext_factor;   /* YaRN's extrapolation mix (1 with YaRN, 0 without) */
    float attn_factor;  /* cos and sin scale before YaRN's own (1) */
    float beta_fast;    /* YaRN's correction range, in turns over n_ctx_orig (32 and 1) */
    float beta_slow;
    int n_ctx_orig;     /* YaRN: the context the model was trained at */
};

/* Plain rope over n_rot dims with base freq_base (no scaling). */
static inline struct ops_rope ops_rope_plain(int n_rot, float freq_base) {
    struct ops_rope r = {n_rot, freq_base, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f, 0};
    return r;
}

/* The KV cache of this rank: its layers, its KV heads, n_slot sequences of up
 * to n_ctx positions. Layout of k and v: (n_layer, n_slot, n_ctx, n_kv_head, head_dim)
 * of elements of `type` (F32 on the CPU reference, F16 on CUDA). */
struct ops_kv {
    int n_layer, n_slot, n_ctx, n_kv_head, head_dim;
    int type;
    void *k, *v; /* backend memory */
    size_t n_bytes; /* of k and v together */
};

/* Options for a backend context. */
struct ops_config {
    int n_threads; /* CPU: threads to use (0: all cores available) */
    int device;    /* CUDA: device index */
};

/* Most weights one matmul_n call takes. */
#define OPS_MAX_FUSED 4

/* The tail of one decode layer for one token and, optionally, the head of the next
 * (ops->layer_tail). All pointers are backend memory; att, x, g, q, k, v are f32. */
struct ops_layer_tail {
    const float *att; /* (q_dim) attention output */
    float *x;         /* (n_embd) residual stream, updated */
    float *g;         /* (n_ff) scratch: silu(gate) * up */
    const struct tpi_weight *wo, *w_gate, *w_up, *w_down;
    const float *ffn_norm;
    /* the next layer's norm and Q/K/V (wq NULL: none, the step's last layer) */
    const float *attn_norm;
    const struct tpi_weight *wq, *wk, *wv;
    float *q, *k, *v;
    float eps;
};

#define OPS_TOP_MAX 64 /* row_top's largest k */

#ifdef __CUDACC__
#define OPS_HOST_DEVICE __host__ __device__
#else
#define OPS_HOST_DEVICE
#endif

/* row_top's order as one integer, larger first, for every backend: the value (-0 as +0,
 * its bits made monotone) in the high word, then the lower column (its complement). */
static inline OPS_HOST_DEVICE uint64_t ops_top_key(float v, uint32_t col) {
    if (v == 0.0f) v = 0.0f;
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((uint64_t)b << 32) | (uint32_t)~col;
}

struct ops_ctx; /* backend state: thread count, stream, cuBLAS handle, scratch */

struct ops {
    const char *name; /* "cpu" or "cuda" */

    /* Create a context (*ctx owned by the caller, free with ops->free). */
    int (*init)(struct ops_ctx **ctx, const struct ops_config *cfg, struct tpi_error *err);
    void (*free)(struct ops_ctx **ctx);
    /* First deferred error since the last call (TPI_OK if none); fills err. */
    int (*check)(struct ops_ctx *ctx, struct tpi_error *err);
    /* Short description of the device ("CPU, 2 threads", "NVIDIA H200"). */
    const char *(*device_name)(struct ops_ctx *ctx);
    /* The stream compute is ordered on (cudaStream_t for CUDA, NULL on CPU). */
    void *(*stream)(struct ops_ctx *ctx);

    /* ---- memory ---- */
    /* Backend memory of n_bytes (zeroed), NULL on failure. */
    void *(*alloc)(struct ops_ctx *ctx, size_t n_bytes);
    void (*dealloc)(struct ops_ctx *ctx, void *p);
    /* Host -> backend copy; `src` must stay valid until ops->sync. */
    void (*to_dev)(struct ops_ctx *ctx, void *dst, const void *src, size_t n_bytes);
    /* Backend -> host copy; returns when the data is on the host. */
    void (*to_host)(struct ops_ctx *ctx, void *dst, const void *src, size_t n_bytes);
    /* Backend -> backend copy, stream-ordered. */
    void (*copy)(struct ops_ctx *ctx, void *dst, const void *src, size_t n_bytes);
    /* Wait until every queued op is done. */
    void (*sync)(struct ops_ctx *ctx);

    /* ---- weights and cache ---- */
    /* Put a (ne1 x ne0) weight of `type` held at host_data into backend memory
     * as *w. host_data need not outlive the call. Errors: unsupported type, OOM. */
    int (*weight_upload)(struct ops_ctx *ctx, struct tpi_weight *w, int type, int64_t ne0,
                         int64_t ne1, const void *host_data, struct tpi_error *err);
    void (*weight_free)(struct ops_ctx *ctx, struct tpi_weight *w);
    /* Allocate a zeroed KV cache with the given shape (kv->type chosen by the backend). */
    int (*kv_init)(struct ops_ctx *ctx, struct ops_kv *kv, int n_layer, int n_slot, int n_ctx,
                   int n_kv_head, int head_dim, struct tpi_error *err);
    void (*kv_free)(struct ops_ctx *ctx, struct ops_kv *kv);

    /* ---- compute ---- */
    /* out(n_tokens, w->ne0) = rows ids[] of w, dequantized. ids: backend memory. */
    void (*embed)(struct ops_ctx *ctx, const struct tpi_weight *w, const int32_t *ids,
                  int n_tokens, float *out);
    /* y(n_rows, n_cols) = x / sqrt(mean(x^2) + eps) * w; w has n_cols f32. y may be x. */
    void (*rmsnorm)(struct ops_ctx *ctx, const float *x, const float *w, float *y,
                    int64_t n_rows, int64_t n_cols, float eps);
    /* y(n_rows, w->ne1) = x(n_rows, w->ne0) * W^T. */
    void (*matmul)(struct ops_ctx *ctx, const struct tpi_weight *w, const float *x, float *y,
                   int64_t n_rows);
    /* y(n_rows, n_cols) += b(n_cols), in place. */
    void (*add_bias)(struct ops_ctx *ctx, float *y, const float *b, int64_t n_rows,
                     int64_t n_cols);
    /* In place NEOX rotary embedding of x(n_tokens, n_head, head_dim): for each head the
     * first rope->n_rot dims rotate in pairs (i, i + n_rot/2) as struct ops_rope says
     * (plain rope: by angle pos * base^(-2i/n_rot)). */
    void (*rope_neox)(struct ops_ctx *ctx, float *x, const struct ops_batch *b, int n_head,
                      int head_dim, const struct ops_rope *rope);
    /* Store k, v (n_tokens, kv->n_kv_head, head_dim) into layer `layer` of the cache at
     * (seq[t], pos[t]), then out(n_tokens, n_head, head_dim) = causal softmax(q k^T * scale) v
     * where token t sees positions 0..pos[t] of its slot, and query head h uses KV
     * head h / (n_head / n_kv_head) (GQA). */
    void (*attention)(struct ops_ctx *ctx, struct ops_kv *kv, int layer, const float *q,
                      const float *k, const float *v, float *out, const struct ops_batch *b,
                      int n_head, float scale);
    /* y(n) = silu(g) * u, elementwise. y may be g or u. */
    void (*silu_mul)(struct ops_ctx *ctx, const float *g, const float *u, float *y, int64_t n);
    /* x(n) += y(n). */
    void (*add)(struct ops_ctx *ctx, float *x, const float *y, int64_t n);
    /* dst(n_idx, n_cols) = rows idx[] of src(*, n_cols); idx is host memory. */
    void (*get_rows)(struct ops_ctx *ctx, const float *src, const int32_t *idx_host, int n_idx,
                     int64_t n_cols, float *dst);

    /* ---- fused forms (the same results as the plain ops they replace, up to the
     * summation order a backend documents; fewer launches on a GPU) ---- */
    /* ys[i](n_rows, ws[i]->ne1) = x(n_rows, ne0) * ws[i]^T for i < n_w (<= OPS_MAX_FUSED):
     * several weights reading one x (Q/K/V, gate/up). Equal to n_w matmul calls. */
    void (*matmul_n)(struct ops_ctx *ctx, int n_w, const struct tpi_weight *const *ws,
                     const float *x, float *const *ys, int64_t n_rows);
    /* y(n_rows, w->ne1) += x(n_rows, w->ne0) * W^T (a residual add folded into the matmul).
     * Equal to matmul into a temporary, then add. */
    void (*matmul_add)(struct ops_ctx *ctx, const struct tpi_weight *w, const float *x, float *y,
                       int64_t n_rows);
    /* In place on q(n_tokens, n_head, head_dim) and k(n_tokens, n_kv_head, head_dim): when
     * q_norm/k_norm are given (head_dim f32 each), rmsnorm over each head's head_dim values
     * with that weight (eps), then rope_neox on both. Equal to rmsnorm on each + rope_neox
     * on each. */
    void (*qk_norm_rope)(struct ops_ctx *ctx, float *q, float *k, const float *q_norm,
                         const float *k_norm, const struct ops_batch *b, int n_head,
                         int n_kv_head, int head_dim, const struct ops_rope *rope, float eps);
    /* qk_norm_rope(q, k, q_norm, k_norm, b, n_head, kv->n_kv_head, kv->head_dim, rope,
     * eps), then attention(kv, layer, q, k, v, out, b, n_head, scale). Equal to
     * the two ops, except that q and k are undefined afterwards (a backend may normalize
     * and rotate them on the way into the attention instead of in place). */
    void (*qk_norm_rope_attention)(struct ops_ctx *ctx, struct ops_kv *kv, int layer, float *q,
                                   float *k, const float *v, const float *q_norm,
                                   const float *k_norm, const struct ops_rope *rope,
                                   float eps, float *out, const struct ops_batch *b, int n_head,
                                   float scale);
    /* g(n_rows, wg->ne1) = silu(x * Wg^T) * (x * Wu^T) and u = x * Wu^T (wu: wg's shape):
     * the FFN's gate, up and activation. Equal to matmul_n of (wg, wu) into (g, u), then
     * silu_mul(g, u, g). g, u and x must not overlap. */
    void (*matmul_silu_mul)(struct ops_ctx *ctx, const struct tpi_weight *wg,
                            const struct tpi_weight *wu, const float *x, float *g, float *u,
                            int64_t n_rows);

    /* ---- graphs (optional: NULL on backends without them, e.g. the CPU) ----
     * A recorded sequence of compute ops replayed with one launch. Ops queued between
     * graph_begin and graph_end are recorded, not run; replay reads whatever the
     * recorded device buffers hold at launch time, so per-step values (token ids,
     * positions, slots) must be copied into device memory before graph_launch, and the
     * host arguments of the recorded ops (n_tokens, ops_batch host arrays, get_rows
     * indices) are frozen at their recorded values. */
    /* Wait for queued work, then start recording the stream's ops. Errors: capture failed. */
    int (*graph_begin)(struct ops_ctx *ctx, struct tpi_error *err);
    /* Stop recording; *graph receives the replayable graph (free with graph_free). When an
     * op failed while recording, *graph is NULL, the failure is returned and the
     * context's deferred error is cleared (nothing ran). */
    int (*graph_end)(struct ops_ctx *ctx, void **graph, struct tpi_error *err);
    /* Queue one replay of graph. *launched is false (status TPI_OK) when the graph is
     * stale: a scratch buffer it uses was reallocated since recording; free it and
     * record again. */
    int (*graph_launch)(struct ops_ctx *ctx, void *graph, bool *launched, struct tpi_error *err);
    /* Free a graph from graph_end (NULL is fine); waits for its replays to finish. */
    void (*graph_free)(struct ops_ctx *ctx, void *graph);

    /* Seconds the host has now been blocked in sync / to_host waiting for this context's
     * queued work (0 when not waiting); safe to ask from another thread (the watchdog).
     * NULL: the backend never waits that way (CPU). */
    double (*wait_s)(struct ops_ctx *ctx);

    /* ---- host memory for results (optional: NULL means plain malloc/free) ---- */
    /* n_bytes of host memory that to_host copies into at the device's full speed (pinned
     * on CUDA where it can be; else plain); NULL when out of memory. Free with host_free
     * on the same context. */
    void *(*host_alloc)(struct ops_ctx *ctx, size_t n_bytes);
    void (*host_free)(struct ops_ctx *ctx, void *p);

    /* ---- a decode layer's tail in one launch (optional: NULL on backends without it) ----
     * x += att * Wo^T; h = rmsnorm(x) * ffn_norm; g = silu(h * Wg^T) * (h * Wu^T);
     * x += g * Wd^T; and when t->wq is given, h = rmsnorm(x) * attn_norm and q, k, v =
     * h * Wq^T, Wk^T, Wv^T. Equal to the plain ops in that order up to the summation
     * order and, on CUDA, the int8 x the decode products read. Returns false, with
     * nothing queued, when the backend does not cover these weights (the caller then runs
     * the plain ops); true when queued. */
    bool (*layer_tail)(struct ops_ctx *ctx, const struct ops_layer_tail *t);

    /* ---- a row's best values, for a sampler that needs no more of it ---- */
    /* For each row i < n_rows of x (backend memory, row i at x + i * ld, n_cols values,
     * k <= n_cols): its k largest values, best first, ties in column order (-0 equal to
     * +0), as ids[i * k + j] = id0 + column and vals[i * k + j] = the value's own bits;
     * bad[i] = 1 when the row holds a NaN or an infinity (ids and vals then unspecified),
     * else 0. ids, vals, bad are backend memory; 1 <= k <= OPS_TOP_MAX. The same results
     * on every backend (a selection, no arithmetic). */
    void (*row_top)(struct ops_ctx *ctx, const float *x, int n_rows, int64_t ld, int n_cols,
                    int id0, int k, int32_t *ids, float *vals, int32_t *bad);
};

/* The CPU reference backend (always built). */
extern const struct ops ops_cpu;

/* The CUDA backend when built with CUDA (NULL otherwise), and whether a GPU is
 * usable right now (false without a driver or device; never aborts). */
const struct ops *ops_cuda_get(void);
bool ops_cuda_available(int *n_devices);
/* CUDA builds only: the decode matrix-vector path of a CUDA context (2: f32 x, the
 * v2 path; 3: x quantized to int8 blocks, dp4a, the default), which TPI_GEMV sets at init; returns
 * the previous path, or -1 for a path other than 2 or 3 (nothing changed). */
int ops_cuda_set_gemv(struct ops_ctx *ctx, int path);
/* CUDA builds only: block-quantized products of 9..max_rows rows take the fused kernel
 * (kern_mmq.cu; at most 64, 0: the dequantize + cuBLAS path), which TPI_MMQ sets at init
 * (default 32); returns the previous limit, or -1 for a negative one (nothing changed). */
int ops_cuda_set_mmq(struct ops_ctx *ctx, int max_rows);
/* CUDA builds only: which attention shapes take the tensor-core kernels, for this process
 * (bit 0: prefill, batches of >= 16 tokens; bit 1: decode); TPI_ATTN_MMA sets it at
 * context init. Returns the previous mode; a mode outside 0..3 changes nothing. */
int ops_cuda_set_attn_mma(int mode);
/* CUDA builds only: how a context runs matmul_silu_mul for one decode row (0: matmul_n then
 * silu_mul; 4, 8, 16, 32: one launch with that many warps a block for quantized weights;
 * -1: one launch, Q4_K rows of 4096 values through the shared-memory ring kernel and the
 * warps chosen per kernel for the rest), which TPI_GLU sets at init. Returns the
 * previous mode, or -2 for an unknown one (nothing changed). */
int ops_cuda_set_glu(struct ops_ctx *ctx, int mode);
/* CUDA builds only (tests): whether the context's x-quantization memo holds the int8 form
 * of the n_vals f32 values at x, so that the next decode matmul of x skips quantizing it. */
bool ops_cuda_xq_memo_holds(struct ops_ctx *ctx, const float *x, int64_t n_vals);
/* CUDA builds only (tests): the forms of x rounded to bf16 in kern_mmq's staging orders
 * (bit 1: Q4_K's, 2: Q6_K's 8-block groups'), written by the op that produced the n_vals
 * values at x, that the next 9..32-row product of x of that type reads instead of rounding
 * x itself; 0: none. */
int ops_cuda_xp_memo_forms(struct ops_ctx *ctx, const float *x, int64_t n_vals);

#ifdef __CUDACC__
/* The CUDA backend's graph entries (kern_graph.cu), declared here so ops_cuda.cu's
 * table can name them; callers use ops->graph_* instead. */
int kern_graph_begin(struct ops_ctx *ctx, struct tpi_error *err);
int kern_graph_end(struct ops_ctx *ctx, void **graph, struct tpi_error *err);
int kern_graph_launch(struct ops_ctx *ctx, void *graph, bool *launched, struct tpi_error *err);
void kern_graph_free(struct ops_ctx *ctx, void *graph);
#endif

/* PCI bus id of `device` ("0000:1A:00.0") for the CUDA backend, "-" for the CPU
 * backend, "?" when the runtime cannot say. */
void ops_device_pci(const struct ops *ops, int device, char *buf, size_t n);

/* Free and total memory of the current device of a backend with its own memory
 * (CUDA, after ops->init); -1 when the backend shares host memory (CPU). */
int ops_device_mem(const struct ops *ops, size_t *free_bytes, size_t *total_bytes);

/* Backend by name: "cpu", "cuda", or "auto" (cuda when built with it and a GPU is
 * visible, else cpu). NULL with err set when the name is unknown or unavailable. */
const struct ops *ops_by_name(const char *name, struct tpi_error *err);

#endif /* OPS_H */
