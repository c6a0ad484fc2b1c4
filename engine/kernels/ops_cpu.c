/*
 * ops_cpu.c — the CPU reference backend of the op table (ops.h): f32
 * activations in host memory, weights kept in their GGUF type and dequantized
 * a row at a time through quant.h, OpenMP threads.
 *
 * Determinism: every output element is computed by one thread with a fixed
 * order of additions (the dot product below has 8 independent partial sums
 * combined in a fixed tree), so a row's result does not depend on how many rows
 * are computed together nor on the thread count. Batching never changes output.
 * That relies on no FMA contraction: CMake builds ISO C11 (-std=c11), where gcc
 * defaults to -ffp-contract=off, and we never use -ffast-math.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "quant.h"
#include "rope.h"

struct ops_ctx {
    int n_threads;
    char name[64];
    struct tpi_error err; /* first deferred error since the last check (status 0: none) */
};

/* Remember the first failure of a compute op; ops->check reports it. Called only
 * outside parallel regions. */
static void cpu_fail(struct ops_ctx *ctx, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void cpu_fail(struct ops_ctx *ctx, int status, const char *fmt, ...) {
    if (ctx->err.status != TPI_OK) return;
    ctx->err.status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->err.msg, sizeof ctx->err.msg, fmt, ap);
    va_end(ap);
}

/* 64-byte aligned (a cache line, and enough for any vector load), zeroed. */
static void *alloc64(size_t n_bytes) {
    size_t n = (n_bytes + 63) & ~(size_t)63;
    if (n < n_bytes) return NULL; /* overflow */
    if (n == 0) n = 64;
    void *p = aligned_alloc(64, n);
    if (p) memset(p, 0, n);
    return p;
}

/* ---- context ---- */

static int cpu_init(struct ops_ctx **out, const struct ops_config *cfg, struct tpi_error *err) {
    *out = NULL;
    int n_threads = cfg ? cfg->n_threads : 0;
    if (n_threads < 0)
        return tpi_err(err, TPI_ERR_INVALID, "cpu backend: n_threads %d < 0", n_threads);
    if (n_threads == 0) n_threads = tpi_cpu_count();
    struct ops_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return tpi_err(err, TPI_ERR_NOMEM, "cpu backend: out of memory for the context");
    ctx->n_threads = n_threads;
    snprintf(ctx->name, sizeof ctx->name, "CPU, %d thread%s", n_threads, n_threads == 1 ? "" : "s");
    *out = ctx;
    return TPI_OK;
}

static void cpu_free(struct ops_ctx **ctx) {
    if (!ctx) return;
    free(*ctx);
    *ctx = NULL;
}

static int cpu_check(struct ops_ctx *ctx, struct tpi_error *err) {
    int status = ctx->err.status;
    if (status != TPI_OK && err) *err = ctx->err;
    tpi_err_clear(&ctx->err);
    return status;
}

static const char *cpu_device_name(struct ops_ctx *ctx) {
    return ctx->name;
}

static void *cpu_stream(struct ops_ctx *ctx) {
    (void)ctx;
    return NULL;
}

/* ---- memory: backend memory is host memory ---- */

static void *cpu_alloc(struct ops_ctx *ctx, size_t n_bytes) {
    (void)ctx;
    return alloc64(n_bytes);
}

static void cpu_dealloc(struct ops_ctx *ctx, void *p) {
    (void)ctx;
    free(p);
}

static void cpu_memcpy(struct ops_ctx *ctx, void *dst, const void *src, size_t n_bytes) {
    (void)ctx;
    if (n_bytes) memcpy(dst, src, n_bytes);
}

static void cpu_sync(struct ops_ctx *ctx) {
    (void)ctx; /* every op has finished when it returns */
}

/* ---- weights and cache ---- */

static int cpu_weight_upload(struct ops_ctx *ctx, struct tpi_weight *w, int type, int64_t ne0,
                             int64_t ne1, const void *host_data, struct tpi_error *err) {
    (void)ctx;
    memset(w, 0, sizeof *w);
    const struct quant_traits *tr = quant_traits(type);
    if (!tr || !tr->supported || !tr->to_f32)
        return tpi_err(err, TPI_ERR_UNSUPPORTED,
                       "cpu weight_upload: tensor type %s (id %d) is not supported "
                       "(supported: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K Q4_K Q5_K "
                       "Q6_K IQ4_NL IQ4_XS)",
                       quant_type_name(type), type);
    if (ne0 <= 0 || ne1 <= 0 || ne0 % tr->blck_size != 0)
        return tpi_err(err, TPI_ERR_INVALID,
                       "cpu weight_upload: shape %lld x %lld of type %s: ne0 must be a positive "
                       "multiple of the block size %d",
                       (long long)ne0, (long long)ne1, tr->name, tr->blck_size);
    size_t row_bytes = quant_row_size(type, ne0);
    if (row_bytes == 0 || (size_t)ne1 > SIZE_MAX / row_bytes)
        return tpi_err(err, TPI_ERR_INVALID,
                       "cpu weight_upload: %s tensor %lld x %lld is too large", tr->name,
                       (long long)ne0, (long long)ne1);
    size_t n_bytes = row_bytes * (size_t)ne1;
    void *data = alloc64(n_bytes);
    if (!data)
        return tpi_err(err, TPI_ERR_NOMEM,
                       "cpu weight_upload: out of memory for %zu bytes (%s %lld x %lld)", n_bytes,
                       tr->name, (long long)ne0, (long long)ne1);
    memcpy(data, host_data, n_bytes);
    w->type = type;
    w->ne0 = ne0;
    w->ne1 = ne1;
    w->row_bytes = row_bytes;
    w->data = data;
    w->aux = NULL;
    return TPI_OK;
}

static void cpu_weight_free(struct ops_ctx *ctx, struct tpi_weight *w) {
    (void)ctx;
    if (!w) return;
    free(w->data);
    memset(w, 0, sizeof *w);
}

static int cpu_kv_init(struct ops_ctx *ctx, struct ops_kv *kv, int n_layer, int n_slot, int n_ctx,
                       int n_kv_head, int head_dim, struct tpi_error *err) {
    (void)ctx;
    memset(kv, 0, sizeof *kv);
    if (n_layer <= 0 || n_slot <= 0 || n_ctx <= 0 || n_kv_head <= 0 || head_dim <= 0)
        return tpi_err(
            err, TPI_ERR_INVALID,
            "cpu kv_init: bad shape n_layer %d n_slot %d n_ctx %d n_kv_head %d head_dim %d",
            n_layer, n_slot, n_ctx, n_kv_head, head_dim);
    /* size_t products of positive ints: overflow only past 2^64 on 64-bit hosts */
    size_t n_elems =
        (size_t)n_layer * (size_t)n_slot * (size_t)n_ctx * (size_t)n_kv_head * (size_t)head_dim;
    size_t n_bytes = n_elems * sizeof(float);
    kv->k = alloc64(n_bytes);
    kv->v = alloc64(n_bytes);
    if (!kv->k || !kv->v) {
        free(kv->k);
        free(kv->v);
        kv->k = kv->v = NULL;
        return tpi_err(err, TPI_ERR_NOMEM,
                       "cpu kv_init: out of memory for 2 x %zu bytes of KV cache", n_bytes);
    }
    kv->n_layer = n_layer;
    kv->n_slot = n_slot;
    kv->n_ctx = n_ctx;
    kv->n_kv_head = n_kv_head;
    kv->head_dim = head_dim;
    kv->type = TPI_TYPE_F32;
    kv->n_bytes = 2 * n_bytes;
    return TPI_OK;
}

static void cpu_kv_free(struct ops_ctx *ctx, struct ops_kv *kv) {
    (void)ctx;
    if (!kv) return;
    free(kv->k);
    free(kv->v);
    memset(kv, 0, sizeof *kv);
}

/* ---- dot products ---- */

/* sum a[k]*b[k] with 8 independent partial sums: gcc -O2 turns the inner loop
 * into two 4-wide SSE multiply-adds (or one 8-wide AVX one), without reordering
 * what we wrote, so the result is the same on every path. Partial sums combine
 * as ((p0+p4)+(p1+p5)) + ((p2+p6)+(p3+p7)), then the n % 8 tail in order. */
static inline __attribute__((always_inline)) float
dot_f32(const float *restrict a, const float *restrict b, int64_t n) {
    float p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        for (int l = 0; l < 8; l++)
            p[l] += a[k + l] * b[k + l];
    float s = ((p[0] + p[4]) + (p[1] + p[5])) + ((p[2] + p[6]) + (p[3] + p[7]));
    for (; k < n; k++)
        s += a[k] * b[k];
    return s;
}

/* Four dot products of one x row with four W rows at once: the same arithmetic,
 * in the same order, per output as dot_f32 (so results are bitwise equal), but
 * each x load is shared by four rows, which nearly doubles throughput. */
static inline __attribute__((always_inline)) void
dot4_f32(const float *restrict w0, const float *restrict w1, const float *restrict w2,
         const float *restrict w3, const float *restrict x, int64_t n, float out[4]) {
    float p0[8] = {0}, p1[8] = {0}, p2[8] = {0}, p3[8] = {0};
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        for (int l = 0; l < 8; l++)
            p0[l] += w0[k + l] * x[k + l];
        for (int l = 0; l < 8; l++)
            p1[l] += w1[k + l] * x[k + l];
        for (int l = 0; l < 8; l++)
            p2[l] += w2[k + l] * x[k + l];
        for (int l = 0; l < 8; l++)
            p3[l] += w3[k + l] * x[k + l];
    }
    float s0 = ((p0[0] + p0[4]) + (p0[1] + p0[5])) + ((p0[2] + p0[6]) + (p0[3] + p0[7]));
    float s1 = ((p1[0] + p1[4]) + (p1[1] + p1[5])) + ((p1[2] + p1[6]) + (p1[3] + p1[7]));
    float s2 = ((p2[0] + p2[4]) + (p2[1] + p2[5])) + ((p2[2] + p2[6]) + (p2[3] + p2[7]));
    float s3 = ((p3[0] + p3[4]) + (p3[1] + p3[5])) + ((p3[2] + p3[6]) + (p3[3] + p3[7]));
    for (; k < n; k++) {
        s0 += w0[k] * x[k];
        s1 += w1[k] * x[k];
        s2 += w2[k] * x[k];
        s3 += w3[k] * x[k];
    }
    out[0] = s0;
    out[1] = s1;
    out[2] = s2;
    out[3] = s3;
}

/* ---- compute ---- */

static void cpu_embed(struct ops_ctx *ctx, const struct tpi_weight *w, const int32_t *ids,
                      int n_tokens, float *out) {
    const struct quant_traits *tr = quant_traits(w->type);
    if (!tr || !tr->to_f32) {
        cpu_fail(ctx, TPI_ERR_UNSUPPORTED, "cpu embed: weight type %s is not supported",
                 quant_type_name(w->type));
        return;
    }
    /* Check ids first (serially) so a bad id is reported, and its row zeroed. */
    for (int t = 0; t < n_tokens; t++) {
        if (ids[t] < 0 || ids[t] >= w->ne1) {
            cpu_fail(ctx, TPI_ERR_INVALID, "cpu embed: token %d has id %d outside [0, %lld)", t,
                     ids[t], (long long)w->ne1);
        }
    }
    const int64_t ne0 = w->ne0;
#pragma omp parallel for num_threads(ctx->n_threads) schedule(static)
    for (int t = 0; t < n_tokens; t++) {
        float *dst = out + (int64_t)t * ne0;
        if (ids[t] < 0 || ids[t] >= w->ne1) {
            memset(dst, 0, (size_t)ne0 * sizeof(float));
            continue;
        }
        tr->to_f32((const char *)w->data + (size_t)ids[t] * w->row_bytes, dst, ne0);
    }
}

static void cpu_rmsnorm(struct ops_ctx *ctx, const float *x, const float *w, float *y,
                        int64_t n_rows, int64_t n_cols, float eps) {
#pragma omp parallel for num_threads(ctx->n_threads) schedule(static)
    for (int64_t r = 0; r < n_rows; r++) {
        const float *xr = x + r * n_cols;
        float *yr = y + r * n_cols;
        /* double sum of squares: exact enough that the f32 rounding of the scale dominates */
        double ss = 0.0;
        for (int64_t c = 0; c < n_cols; c++)
            ss += (double)xr[c] * (double)xr[c];
        const float scale = (float)(1.0 / sqrt(ss / (double)n_cols + (double)eps));
        for (int64_t c = 0; c < n_cols; c++)
            yr[c] = (xr[c] * scale) * w[c];
    }
}

/* W rows dequantized per block: 16 KiB of f32 (half of a typical L1d), so the
 * block and the current x row stay in L1 while every x row streams past. At
 * least 4 rows so dot4_f32 applies; at most 32. */
static int64_t matmul_block_rows(int64_t ne0) {
    int64_t jb = 16384 / (ne0 * (int64_t)sizeof(float));
    jb = jb < 4 ? 4 : jb > 32 ? 32 : jb;
    return jb & ~(int64_t)3;
}

/* 8 f32 lanes as one value; where AVX is off, GCC computes it as two 4-lane halves (the
 * same arithmetic a lane). */
typedef float f32x8 __attribute__((vector_size(32)));

/* dot_f32's combination of its 8 partial sums, for lanes held in a vector. */
#define HSUM8(v) ((((v)[0] + (v)[4]) + ((v)[1] + (v)[5])) + (((v)[2] + (v)[6]) + ((v)[3] + (v)[7])))

/* Eight dot products, of two x rows with four W rows (w[0..3]): each output the
 * arithmetic of dot_f32 in the same order, so bitwise equal to it. A W load serves both
 * x rows and an x load four W rows (6 loads per 8 lane products, against dot4_f32's 5 per
 * 4), and eight independent sums keep both adders busy. */
static inline __attribute__((always_inline)) void
dot2x4_f32(const float *const *w, const float *restrict x0, const float *restrict x1,
           int64_t n, float y0[4], float y1[4]) {
    f32x8 a00 = {0}, a01 = {0}, a02 = {0}, a03 = {0}, a10 = {0}, a11 = {0}, a12 = {0},
          a13 = {0};
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        f32x8 xa, xb, w0, w1, w2, w3;
        memcpy(&xa, x0 + k, sizeof xa);
        memcpy(&xb, x1 + k, sizeof xb);
        memcpy(&w0, w[0] + k, sizeof w0);
        memcpy(&w1, w[1] + k, sizeof w1);
        memcpy(&w2, w[2] + k, sizeof w2);
        memcpy(&w3, w[3] + k, sizeof w3);
        a00 += w0 * xa;
        a01 += w1 * xa;
        a02 += w2 * xa;
        a03 += w3 * xa;
        a10 += w0 * xb;
        a11 += w1 * xb;
        a12 += w2 * xb;
        a13 += w3 * xb;
    }
    float s[8] = {HSUM8(a00), HSUM8(a01), HSUM8(a02), HSUM8(a03),
                  HSUM8(a10), HSUM8(a11), HSUM8(a12), HSUM8(a13)};
    for (; k < n; k++)
        for (int j = 0; j < 4; j++) {
            s[j] += w[j][k] * x0[k];
            s[4 + j] += w[j][k] * x1[k];
        }
    memcpy(y0, s, 4 * sizeof(float));
    memcpy(y1, s + 4, 4 * sizeof(float));
}

/* y[i * ldy + jj] = W row jj . x row i, for nj W rows (each ne0 long) and n_rows x rows:
 * x rows two at a time with four W rows (dot2x4_f32), the rest by dot4_f32 and dot_f32,
 * every output the same bits whichever computes it. */
TPI_CPU_CLONES static void block_dots(const float *const *wrow, int64_t nj, const float *x,
                                      int64_t n_rows, int64_t ne0, float *y, int64_t ldy) {
    int64_t i = 0;
    for (; i + 2 <= n_rows; i += 2) {
        const float *xi = x + i * ne0;
        float *yi = y + i * ldy;
        int64_t jj = 0;
        for (; jj + 4 <= nj; jj += 4)
            dot2x4_f32(wrow + jj, xi, xi + ne0, ne0, yi + jj, yi + ldy + jj);
        for (; jj < nj; jj++) {
            yi[jj] = dot_f32(wrow[jj], xi, ne0);
            yi[ldy + jj] = dot_f32(wrow[jj], xi + ne0, ne0);
        }
    }
    for (; i < n_rows; i++) {
        const float *xi = x + i * ne0;
        float *yi = y + i * ldy;
        int64_t jj = 0;
        for (; jj + 4 <= nj; jj += 4)
            dot4_f32(wrow[jj], wrow[jj + 1], wrow[jj + 2], wrow[jj + 3], xi, ne0, yi + jj);
        for (; jj < nj; jj++)
            yi[jj] = dot_f32(wrow[jj], xi, ne0);
    }
}

static void cpu_matmul(struct ops_ctx *ctx, const struct tpi_weight *w, const float *x, float *y,
                       int64_t n_rows) {
    const struct quant_traits *tr = quant_traits(w->type);
    if (!tr || !tr->to_f32) {
        cpu_fail(ctx, TPI_ERR_UNSUPPORTED, "cpu matmul: weight type %s is not supported",
                 quant_type_name(w->type));
        return;
    }
    const int64_t ne0 = w->ne0, ne1 = w->ne1;
    if (n_rows <= 0 || ne1 <= 0) return;
    const bool is_f32 = w->type == TPI_TYPE_F32; /* used in place, no copy */
    const int64_t jb = matmul_block_rows(ne0);
    const int64_t n_blocks = (ne1 + jb - 1) / jb;
    const int n_threads = (int)TPI_MIN((int64_t)ctx->n_threads, n_blocks);
    /* One scratch block per thread, allocated here so a failure is reported, not hidden. */
    float *scratch = NULL;
    if (!is_f32) {
        scratch = alloc64((size_t)n_threads * (size_t)(jb * ne0) * sizeof(float));
        if (!scratch) {
            cpu_fail(ctx, TPI_ERR_NOMEM, "cpu matmul: out of memory for the dequantize buffer");
            return;
        }
    }
#pragma omp parallel num_threads(n_threads)
    {
        float *wbuf = is_f32 ? NULL : scratch + (size_t)omp_get_thread_num() * (size_t)(jb * ne0);
        const float *wrow[32];
#pragma omp for schedule(static)
        for (int64_t blk = 0; blk < n_blocks; blk++) {
            const int64_t j0 = blk * jb;
            const int64_t nj = TPI_MIN(jb, ne1 - j0);
            const char *src = (const char *)w->data + (size_t)j0 * w->row_bytes;
            if (is_f32) {
                for (int64_t jj = 0; jj < nj; jj++)
                    wrow[jj] = (const float *)src + jj * ne0;
            } else {
                /* consecutive rows are contiguous: dequantize the block in one call */
                tr->to_f32(src, wbuf, nj * ne0);
                for (int64_t jj = 0; jj < nj; jj++)
                    wrow[jj] = wbuf + jj * ne0;
            }
            block_dots(wrow, nj, x, n_rows, ne0, y + j0, ne1);
        }
    }
    free(scratch);
}

static void cpu_add_bias(struct ops_ctx *ctx, float *y, const float *b, int64_t n_rows,
                         int64_t n_cols) {
#pragma omp parallel for num_threads(ctx->n_threads) schedule(static)
    for (int64_t r = 0; r < n_rows; r++)
        for (int64_t c = 0; c < n_cols; c++)
            y[r * n_cols + c] += b[c];
}

/* Rotated pairs per head we support: head_dim up to 1024, far past any Qwen model. */
#define ROPE_MAX_PAIRS 512

static void cpu_rope_neox(struct ops_ctx *ctx, float *x, const struct ops_batch *b, int n_head,
                          int head_dim, const struct ops_rope *rope) {
    const int n_rot = rope->n_rot;
    if (n_rot <= 0 || n_rot > head_dim || n_rot % 2 != 0) {
        cpu_fail(ctx, TPI_ERR_INVALID,
                 "cpu rope_neox: n_rot %d must be even and in (0, head_dim %d]", n_rot, head_dim);
        return;
    }
    const int half = n_rot / 2;
    if (half > ROPE_MAX_PAIRS) {
        cpu_fail(ctx, TPI_ERR_UNSUPPORTED, "cpu rope_neox: n_rot %d exceeds %d", n_rot,
                 2 * ROPE_MAX_PAIRS);
        return;
    }
    /* Each pair's angle per position in double (rope.h), cos and sin of the angle in
     * double scaled by mscale, only the rotated values rounded to f32. llama.cpp's
     * recurrence theta *= powf(base, -2/n_rot) in float accumulates rounding per pair
     * (measured: up to 3e-4 rad off at pos 4096 and 1e-3 at pos 30000, base 1e6); the
     * reference should carry no error of its own. */
    const struct rope_pairs rp = rope_pairs_of(rope);
    double inv[ROPE_MAX_PAIRS];
    for (int i = 0; i < half; i++)
        inv[i] = rope_pair_inv(&rp, i);
#pragma omp parallel num_threads(ctx->n_threads)
    {
        double cs[2 * ROPE_MAX_PAIRS]; /* this token's cos, sin per pair */
#pragma omp for schedule(static)
        for (int t = 0; t < b->n_tokens; t++) {
            const double pos = (double)b->pos[t];
            for (int i = 0; i < half; i++) {
                const double theta = pos * inv[i];
                cs[2 * i] = cos(theta) * rp.mscale;
                cs[2 * i + 1] = sin(theta) * rp.mscale;
            }
            for (int h = 0; h < n_head; h++) {
                float *xh = x + ((int64_t)t * n_head + h) * head_dim;
                for (int i = 0; i < half; i++) {
                    const float c = (float)cs[2 * i], s = (float)cs[2 * i + 1];
                    const float x0 = xh[i], x1 = xh[i + half];
                    xh[i] = x0 * c - x1 * s;
                    xh[i + half] = x0 * s + x1 * c;
                }
            }
        }
    }
}

static void cpu_attention(struct ops_ctx *ctx, struct ops_kv *kv, int layer, const float *q,
                          const float *k, const float *v, float *out, const struct ops_batch *b,
                          int n_head, float scale) {
    const int n_tokens = b->n_tokens, n_kv = kv->n_kv_head, hd = kv->head_dim;
    if (layer < 0 || layer >= kv->n_layer || n_head <= 0 || n_head % n_kv != 0) {
        cpu_fail(ctx, TPI_ERR_INVALID,
                 "cpu attention: layer %d of %d, n_head %d not a multiple of n_kv_head %d", layer,
                 kv->n_layer, n_head, n_kv);
        return;
    }
    const int group = n_head / n_kv;
    const size_t row = (size_t)n_kv * hd; /* floats per (slot, position) */
    const size_t slot_stride = (size_t)kv->n_ctx * row;
    float *kc = (float *)kv->k + (size_t)layer * kv->n_slot * slot_stride;
    float *vc = (float *)kv->v + (size_t)layer * kv->n_slot * slot_stride;

    /* 1. store every token's k and v first, so tokens of one slot in this batch see
     *    each other (causally); a token with a bad slot or position is skipped. */
    int max_pos = 0;
    for (int t = 0; t < n_tokens; t++) {
        const int s = b->seq[t], p = b->pos[t];
        if (s < 0 || s >= kv->n_slot || p < 0 || p >= kv->n_ctx) {
            cpu_fail(ctx, TPI_ERR_INVALID,
                     "cpu attention: token %d at slot %d position %d is outside the cache "
                     "(%d slots x %d positions)",
                     t, s, p, kv->n_slot, kv->n_ctx);
            continue;
        }
        memcpy(kc + s * slot_stride + p * row, k + t * row, row * sizeof(float));
        memcpy(vc + s * slot_stride + p * row, v + t * row, row * sizeof(float));
        if (p + 1 > max_pos) max_pos = p + 1;
    }
    float *scores = alloc64((size_t)ctx->n_threads * (size_t)(max_pos + hd) * sizeof(float));
    if (!scores) {
        cpu_fail(ctx, TPI_ERR_NOMEM, "cpu attention: out of memory for %d scores", max_pos);
        return;
    }

    /* 2. one (token, head) per work item; dynamic because causal rows differ in length.
     *    Each item is computed by one thread in a fixed order, so the schedule does not
     *    change results. */
    const int n_items = n_tokens * n_head;
#pragma omp parallel num_threads(ctx->n_threads)
    {
        float *sc = scores + (size_t)omp_get_thread_num() * (size_t)(max_pos + hd);
        float *acc = sc + max_pos; /* hd floats */
#pragma omp for schedule(dynamic, 4)
        for (int it = 0; it < n_items; it++) {
            const int t = it / n_head, h = it % n_head, kvh = h / group;
            const int s = b->seq[t], p = b->pos[t];
            float *o = out + ((size_t)t * n_head + h) * hd;
            if (s < 0 || s >= kv->n_slot || p < 0 || p >= kv->n_ctx) {
                memset(o, 0, (size_t)hd * sizeof(float));
                continue;
            }
            const float *qh = q + ((size_t)t * n_head + h) * hd;
            const float *ks = kc + s * slot_stride + (size_t)kvh * hd;
            const float *vs = vc + s * slot_stride + (size_t)kvh * hd;
            /* scores, minus their max so exp never overflows (stable softmax) */
            float m = -INFINITY;
            for (int j = 0; j <= p; j++) {
                sc[j] = dot_f32(qh, ks + j * row, hd) * scale;
                if (sc[j] > m) m = sc[j];
            }
            double sum = 0.0;
            for (int j = 0; j <= p; j++) {
                sc[j] = expf(sc[j] - m);
                sum += sc[j];
            }
            for (int d = 0; d < hd; d++)
                acc[d] = 0.0f;
            for (int j = 0; j <= p; j++) {
                const float wj = sc[j];
                const float *vj = vs + j * row;
                for (int d = 0; d < hd; d++)
                    acc[d] += wj * vj[d];
            }
            const float inv = (float)(1.0 / sum);
            for (int d = 0; d < hd; d++)
                o[d] = acc[d] * inv;
        }
    }
    free(scores);
}

static void cpu_silu_mul(struct ops_ctx *ctx, const float *g, const float *u, float *y, int64_t n) {
#pragma omp parallel for num_threads(ctx->n_threads) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float gi = g[i];
        /* for gi << 0, expf(-gi) = inf and gi/inf = -0: the right limit */
        y[i] = gi / (1.0f + expf(-gi)) * u[i];
    }
}

static void cpu_add(struct ops_ctx *ctx, float *x, const float *y, int64_t n) {
#pragma omp parallel for num_threads(ctx->n_threads) schedule(static)
    for (int64_t i = 0; i < n; i++)
        x[i] += y[i];
}

static void cpu_get_rows(struct ops_ctx *ctx, const float *src, const int32_t *idx_host, int n_idx,
                         int64_t n_cols, float *dst) {
    for (int r = 0; r < n_idx; r++) {
        if (idx_host[r] < 0) {
            cpu_fail(ctx, TPI_ERR_INVALID, "cpu get_rows: index %d is %d (< 0)", r, idx_host[r]);
            memset(dst + (int64_t)r * n_cols, 0, (size_t)n_cols * sizeof(float));
            continue;
        }
        memcpy(dst + (int64_t)r * n_cols, src + (int64_t)idx_host[r] * n_cols,
               (size_t)n_cols * sizeof(float));
    }
}

static int cmp_key_desc(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x < y) - (x > y);
}

/* One pass a row keeping a min-heap of the k best keys (the root the worst), then a
 * sort of those k. */
static void cpu_row_top(struct ops_ctx *ctx, const float *x, int n_rows, int64_t ld, int n_cols,
                        int id0, int k, int32_t *ids, float *vals, int32_t *bad) {
    if (k < 1 || k > OPS_TOP_MAX || k > n_cols) {
        cpu_fail(ctx, TPI_ERR_INVALID, "cpu row_top: k %d of %d columns (1..%d)", k, n_cols,
                 OPS_TOP_MAX);
        return;
    }
#pragma omp parallel for num_threads(ctx->n_threads) schedule(static) if (n_rows > 1)
    for (int i = 0; i < n_rows; i++) {
        const float *row = x + (int64_t)i * ld;
        uint64_t h[OPS_TOP_MAX];
        int32_t nonfinite = 0;
        for (int c = 0; c < n_cols; c++) {
            nonfinite |= !isfinite(row[c]);
            const uint64_t key = ops_top_key(row[c], (uint32_t)c);
            int j;
            if (c < k) { // sift up
                for (j = c; j > 0 && h[(j - 1) / 2] > key; j = (j - 1) / 2) h[j] = h[(j - 1) / 2];
                h[j] = key;
                continue;
            }
            if (key <= h[0]) continue;
            for (j = 0;;) { // replace the root, sift down
                int w = 2 * j + 1;
                if (w >= k) break;
                if (w + 1 < k && h[w + 1] < h[w]) w++;
                if (h[w] >= key) break;
                h[j] = h[w];
                j = w;
            }
            h[j] = key;
        }
        qsort(h, (size_t)k, sizeof h[0], cmp_key_desc);
        for (int j = 0; j < k; j++) {
            const int col = (int)(uint32_t)~(uint32_t)h[j];
            ids[(int64_t)i * k + j] = id0 + col;
            vals[(int64_t)i * k + j] = row[col];
        }
        bad[i] = nonfinite;
    }
}

/* The fused forms are the plain ops in sequence, so the CPU reference of a fused call
 * is bitwise the reference of the calls it replaces. */
static void cpu_matmul_n(struct ops_ctx *ctx, int n_w, const struct tpi_weight *const *ws,
                         const float *x, float *const *ys, int64_t n_rows) {
    if (n_w < 0 || n_w > OPS_MAX_FUSED) {
        cpu_fail(ctx, TPI_ERR_INVALID, "cpu matmul_n: %d weights (at most %d)", n_w,
                 OPS_MAX_FUSED);
        return;
    }
    for (int i = 0; i < n_w; i++)
        cpu_matmul(ctx, ws[i], x, ys[i], n_rows);
}

static void cpu_matmul_add(struct ops_ctx *ctx, const struct tpi_weight *w, const float *x,
                           float *y, int64_t n_rows) {
    if (n_rows <= 0 || w->ne1 <= 0) return;
    const size_t n = (size_t)n_rows * (size_t)w->ne1;
    float *t = alloc64(n * sizeof(float));
    if (!t) {
        cpu_fail(ctx, TPI_ERR_NOMEM, "cpu matmul_add: out of memory for %zu outputs", n);
        return;
    }
    cpu_matmul(ctx, w, x, t, n_rows);
    cpu_add(ctx, y, t, (int64_t)n);
    free(t);
}

static void cpu_matmul_silu_mul(struct ops_ctx *ctx, const struct tpi_weight *wg,
                                const struct tpi_weight *wu, const float *x, float *g, float *u,
                                int64_t n_rows) {
    const struct tpi_weight *ws[2] = {wg, wu};
    float *ys[2] = {g, u};
    cpu_matmul_n(ctx, 2, ws, x, ys, n_rows);
    cpu_silu_mul(ctx, g, u, g, n_rows * wg->ne1);
}

static void cpu_qk_norm_rope(struct ops_ctx *ctx, float *q, float *k, const float *q_norm,
                             const float *k_norm, const struct ops_batch *b, int n_head,
                             int n_kv_head, int head_dim, const struct ops_rope *rope, float eps) {
    const int64_t n = b->n_tokens;
    if (q_norm) cpu_rmsnorm(ctx, q, q_norm, q, n * n_head, head_dim, eps);
    if (k_norm) cpu_rmsnorm(ctx, k, k_norm, k, n * n_kv_head, head_dim, eps);
    cpu_rope_neox(ctx, q, b, n_head, head_dim, rope);
    cpu_rope_neox(ctx, k, b, n_kv_head, head_dim, rope);
}

static void cpu_qk_norm_rope_attention(struct ops_ctx *ctx, struct ops_kv *kv, int layer, float *q,
                                       float *k, const float *v, const float *q_norm,
                                       const float *k_norm, const struct ops_rope *rope,
                                       float eps, float *out, const struct ops_batch *b,
                                       int n_head, float scale) {
    cpu_qk_norm_rope(ctx, q, k, q_norm, k_norm, b, n_head, kv->n_kv_head, kv->head_dim, rope,
                     eps);
    cpu_attention(ctx, kv, layer, q, k, v, out, b, n_head, scale);
}

const struct ops ops_cpu = {
    .name = "cpu",
    .init = cpu_init,
    .free = cpu_free,
    .check = cpu_check,
    .device_name = cpu_device_name,
    .stream = cpu_stream,
    .alloc = cpu_alloc,
    .dealloc = cpu_dealloc,
    .to_dev = cpu_memcpy,
    .to_host = cpu_memcpy,
    .copy = cpu_memcpy,
    .sync = cpu_sync,
    .weight_upload = cpu_weight_upload,
    .weight_free = cpu_weight_free,
    .kv_init = cpu_kv_init,
    .kv_free = cpu_kv_free,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .add_bias = cpu_add_bias,
    .rope_neox = cpu_rope_neox,
    .attention = cpu_attention,
    .silu_mul = cpu_silu_mul,
    .add = cpu_add,
    .get_rows = cpu_get_rows,
    .matmul_n = cpu_matmul_n,
    .matmul_add = cpu_matmul_add,
    .qk_norm_rope = cpu_qk_norm_rope,
    .qk_norm_rope_attention = cpu_qk_norm_rope_attention,
    .matmul_silu_mul = cpu_matmul_silu_mul,
    .row_top = cpu_row_top,
};
