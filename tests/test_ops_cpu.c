/*
 * test_ops_cpu.c — the CPU reference backend (ops_cpu.c) against plain
 * double-precision implementations on seeded random data of awkward sizes,
 * bitwise batching/thread independence, mixed-batch attention, the error paths,
 * and a matmul GFLOP/s printout (not asserted).
 *
 * Tolerances (f32 kernel vs double reference): elementwise ops atol 1e-5 +
 * rtol 1e-4; rope atol 1e-6 + rtol 1e-5 (the angle is computed in double);
 * matmul atol 4e-6 * max_j sum_k |w_jk x_k| (f32 rounding of a sum grows with
 * the sum of magnitudes, not with the result) + rtol 1e-4.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"
#include "kernels/quant.h"
#include "testutil.h"

static const struct ops *O = &ops_cpu;

static struct ops_ctx *mk_ctx(int n_threads) {
    struct ops_config cfg = {.n_threads = n_threads, .device = 0};
    struct ops_ctx *ctx = NULL;
    struct tpi_error err;
    tpi_err_clear(&err);
    ck_assert_msg(O->init(&ctx, &cfg, &err) == TPI_OK, "init: %s", err.msg);
    return ctx;
}

static void expect_ok(struct ops_ctx *ctx) {
    struct tpi_error err;
    tpi_err_clear(&err);
    ck_assert_msg(O->check(ctx, &err) == TPI_OK, "deferred error: %s", err.msg);
}

static float *rnd(struct tu_rng *r, size_t n, float lo, float hi) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    tu_fill_uniform(r, x, n, lo, hi);
    return x;
}

/* ---- context and memory ---- */

START_TEST(test_context_memory) {
    struct ops_ctx *ctx = mk_ctx(0);
    char want[64];
    int n = tpi_cpu_count();
    snprintf(want, sizeof want, "CPU, %d thread%s", n, n == 1 ? "" : "s");
    ck_assert_str_eq(O->device_name(ctx), want);
    ck_assert_ptr_null(O->stream(ctx));
    unsigned char *p = O->alloc(ctx, 1000), *q = O->alloc(ctx, 1000);
    ck_assert_ptr_nonnull(p);
    ck_assert_uint_eq((uintptr_t)p % 64, 0);
    for (int i = 0; i < 1000; i++)
        ck_assert_uint_eq(p[i], 0);
    unsigned char host[1000], back[1000];
    for (int i = 0; i < 1000; i++)
        host[i] = (unsigned char)(i * 7);
    O->to_dev(ctx, p, host, sizeof host);
    O->copy(ctx, q, p, sizeof host);
    O->sync(ctx);
    O->to_host(ctx, back, q, sizeof back);
    ck_assert_mem_eq(back, host, sizeof host);
    O->dealloc(ctx, p);
    O->dealloc(ctx, q);
    expect_ok(ctx);
    O->free(&ctx);
    ck_assert_ptr_null(ctx);
}
END_TEST

/* ---- elementwise ops ---- */

static const int64_t k_cols[] = {1, 7, 33, 257, 512};

START_TEST(test_rmsnorm) {
    struct tu_rng r;
    tu_rng_seed(&r, 11);
    struct ops_ctx *ctx = mk_ctx(2);
    for (size_t ci = 0; ci < sizeof k_cols / sizeof k_cols[0]; ci++) {
        const int64_t n_cols = k_cols[ci], n_rows = 5;
        const size_t n = (size_t)(n_rows * n_cols);
        float *x = rnd(&r, n, -2, 2), *w = rnd(&r, (size_t)n_cols, 0.5f, 1.5f);
        float *y = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
        x[0] = 1e-3f; /* a tiny row start; eps matters for n_cols 1 */
        const float eps = 1e-6f;
        for (int64_t i = 0; i < n_rows; i++) {
            double ss = 0;
            for (int64_t c = 0; c < n_cols; c++)
                ss += (double)x[i * n_cols + c] * x[i * n_cols + c];
            double s = 1.0 / sqrt(ss / n_cols + eps);
            for (int64_t c = 0; c < n_cols; c++)
                want[i * n_cols + c] = (float)(x[i * n_cols + c] * s * w[c]);
        }
        O->rmsnorm(ctx, x, w, y, n_rows, n_cols, eps);
        ck_assert_uint_eq(tu_compare("rmsnorm", y, want, n, 1e-5, 1e-4), 0);
        O->rmsnorm(ctx, x, w, x, n_rows, n_cols, eps); /* in place: same bits */
        ck_assert_mem_eq(x, y, n * sizeof(float));
        free(x), free(w), free(y), free(want);
    }
    expect_ok(ctx);
    O->free(&ctx);
}
END_TEST

START_TEST(test_bias_silu_add_get_rows) {
    struct tu_rng r;
    tu_rng_seed(&r, 12);
    struct ops_ctx *ctx = mk_ctx(2);
    for (size_t ci = 0; ci < sizeof k_cols / sizeof k_cols[0]; ci++) {
        const int64_t n_cols = k_cols[ci], n_rows = 3;
        const size_t n = (size_t)(n_rows * n_cols);
        float *y = rnd(&r, n, -3, 3), *b = rnd(&r, (size_t)n_cols, -1, 1);
        float *want = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++)
            want[i] = (float)((double)y[i] + b[i % (size_t)n_cols]);
        O->add_bias(ctx, y, b, n_rows, n_cols);
        ck_assert_uint_eq(tu_compare("add_bias", y, want, n, 1e-5, 1e-4), 0);

        float *g = rnd(&r, n, -12, 12), *u = rnd(&r, n, -2, 2), *out = malloc(n * sizeof(float));
        g[0] = -100.0f; /* exp(100) overflows f32: silu must still be ~0 */
        if (n > 1) g[1] = 100.0f;
        for (size_t i = 0; i < n; i++)
            want[i] = (float)((double)g[i] / (1.0 + exp(-(double)g[i])) * u[i]);
        O->silu_mul(ctx, g, u, out, (int64_t)n);
        ck_assert_uint_eq(tu_compare("silu_mul", out, want, n, 1e-5, 1e-4), 0);
        float *g2 = malloc(n * sizeof(float)), *u2 = malloc(n * sizeof(float));
        memcpy(g2, g, n * sizeof(float));
        memcpy(u2, u, n * sizeof(float));
        O->silu_mul(ctx, g2, u, g2, (int64_t)n); /* y == g */
        O->silu_mul(ctx, g, u2, u2, (int64_t)n); /* y == u */
        ck_assert_mem_eq(g2, out, n * sizeof(float));
        ck_assert_mem_eq(u2, out, n * sizeof(float));

        float *x = rnd(&r, n, -1, 1);
        for (size_t i = 0; i < n; i++)
            want[i] = (float)((double)x[i] + out[i]);
        O->add(ctx, x, out, (int64_t)n);
        ck_assert_uint_eq(tu_compare("add", x, want, n, 1e-5, 1e-4), 0);

        const int32_t idx[4] = {2, 0, 2, 1};
        float *rows = malloc(4 * (size_t)n_cols * sizeof(float));
        O->get_rows(ctx, x, idx, 4, n_cols, rows);
        for (int i = 0; i < 4; i++)
            ck_assert_mem_eq(rows + i * n_cols, x + idx[i] * n_cols,
                             (size_t)n_cols * sizeof(float));
        free(y), free(b), free(want), free(g), free(u), free(out), free(g2), free(u2), free(x);
        free(rows);
    }
    expect_ok(ctx);
    O->free(&ctx);
}
END_TEST

/* ---- weights: every supported type ---- */

static const int k_types[] = {TPI_TYPE_F32,  TPI_TYPE_F16,  TPI_TYPE_BF16, TPI_TYPE_Q8_0,
                              TPI_TYPE_Q4_0, TPI_TYPE_Q4_1, TPI_TYPE_Q5_0, TPI_TYPE_Q5_1,
                              TPI_TYPE_Q2_K, TPI_TYPE_Q3_K, TPI_TYPE_Q4_K, TPI_TYPE_Q5_K,
                              TPI_TYPE_Q6_K, TPI_TYPE_IQ4_NL, TPI_TYPE_IQ4_XS};
#define N_TYPES (int)(sizeof k_types / sizeof k_types[0])

/* A random (ne1 x ne0) weight of `type` in host memory (quantized with the
 * traits' from_f32) and its dequantized f32 values (*deq, via to_f32). */
static void *make_weight(struct tu_rng *r, int type, int64_t ne0, int64_t ne1, float **deq) {
    const struct quant_traits *tr = quant_traits(type);
    ck_assert_ptr_nonnull(tr);
    ck_assert_ptr_nonnull(tr->from_f32);
    const size_t n = (size_t)(ne0 * ne1);
    float *src = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        src[i] = 0.5f * tu_normal(r);
    size_t row_bytes = quant_row_size(type, ne0);
    ck_assert_uint_gt(row_bytes, 0);
    void *data = malloc(row_bytes * (size_t)ne1);
    tr->from_f32(src, data, (int64_t)n);
    *deq = malloc(n * sizeof(float));
    tr->to_f32(data, *deq, (int64_t)n);
    free(src);
    return data;
}

/* row_top against a full sort of each row (value first, then the lower column; -0 and
 * +0 equal): rows of many exact ties, all zeros of both signs, k from 1 to OPS_TOP_MAX
 * and k = n_cols, a row stride past the columns, the ids offset by id0; the non-finite
 * flag for a NaN and an infinity only; k out of range is an error. */
static const float *g_top_row;
static int cmp_top(const void *a, const void *b) {
    const int x = *(const int *)a, y = *(const int *)b;
    const float u = g_top_row[x], v = g_top_row[y];
    if (u != v) return u > v ? -1 : 1;
    return (x > y) - (x < y);
}

START_TEST(test_row_top) {
    struct tu_rng r;
    tu_rng_seed(&r, 31);
    struct ops_ctx *ctx = mk_ctx(2);
    const int shapes[][2] = {{5000, 64}, {5000, 1}, {5000, 20}, {64, 64}, {70, 40}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int n_cols = shapes[si][0], k = shapes[si][1], n_rows = 6, ld = n_cols + 3;
        float *x = malloc(sizeof(float) * (size_t)n_rows * ld);
        for (int i = 0; i < n_rows; i++)
            for (int c = 0; c < ld; c++) {
                float v = floorf(tu_uniform(&r, -30.0f, 30.0f)) * 0.5f; // ties
                if (i == 1) v = c % 3 ? 0.0f : -0.0f;                   // all zeros
                if (i == 2) v = -v - 100.0f;                            // all negative
                x[(size_t)i * ld + c] = c < n_cols ? v : 1e30f; // past the columns: unread
            }
        x[3 * (size_t)ld + n_cols / 2] = NAN;
        x[4 * (size_t)ld + n_cols - 1] = -INFINITY;
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)n_rows * k), bad[6];
        float *vals = malloc(sizeof(float) * (size_t)n_rows * k);
        O->row_top(ctx, x, n_rows, ld, n_cols, 1000, k, ids, vals, bad);
        expect_ok(ctx);
        int *order = malloc(sizeof(int) * (size_t)n_cols);
        for (int i = 0; i < n_rows; i++) {
            ck_assert_int_eq(bad[i], i == 3 || i == 4);
            if (bad[i]) continue;
            for (int c = 0; c < n_cols; c++) order[c] = c;
            g_top_row = x + (size_t)i * ld;
            qsort(order, (size_t)n_cols, sizeof(int), cmp_top);
            for (int j = 0; j < k; j++) {
                ck_assert_msg(ids[(size_t)i * k + j] == 1000 + order[j],
                              "%d cols k %d row %d: place %d is id %d, not %d", n_cols, k, i, j,
                              ids[(size_t)i * k + j], 1000 + order[j]);
                const float v = vals[(size_t)i * k + j], want = g_top_row[order[j]];
                ck_assert(memcmp(&v, &want, sizeof v) == 0); // the value's own bits
            }
        }
        free(order), free(x), free(ids), free(vals);
    }
    // k past the row or past OPS_TOP_MAX: an error, nothing written
    float row[8] = {0};
    int32_t id[8], flag = 7;
    float val[8];
    O->row_top(ctx, row, 1, 8, 8, 0, 9, id, val, &flag);
    struct tpi_error err = {0};
    ck_assert_int_eq(O->check(ctx, &err), TPI_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "row_top"));
    ck_assert_int_eq(flag, 7);
    O->free(&ctx);
}
END_TEST

START_TEST(test_embed) {
    struct tu_rng r;
    tu_rng_seed(&r, 13);
    struct ops_ctx *ctx = mk_ctx(2);
    for (int ti = 0; ti < N_TYPES; ti++) {
        const int type = k_types[ti];
        const int64_t ne0 = quant_traits(type)->blck_size == 1 ? 33 : 256, ne1 = 6;
        float *deq;
        void *host = make_weight(&r, type, ne0, ne1, &deq);
        struct tpi_weight w;
        struct tpi_error err;
        ck_assert_msg(O->weight_upload(ctx, &w, type, ne0, ne1, host, &err) == TPI_OK, "%s",
                      err.msg);
        free(host); /* host data need not outlive the upload */
        const int32_t ids[5] = {5, 0, 3, 3, 1};
        float *out = malloc(5 * (size_t)ne0 * sizeof(float));
        O->embed(ctx, &w, ids, 5, out);
        for (int t = 0; t < 5; t++)
            ck_assert_msg(memcmp(out + t * ne0, deq + ids[t] * ne0, (size_t)ne0 * sizeof(float)) ==
                              0,
                          "embed %s token %d", quant_type_name(type), t);
        expect_ok(ctx);
        const int32_t bad[2] = {1, 6};
        O->embed(ctx, &w, bad, 2, out);
        ck_assert_int_eq(O->check(ctx, &err), TPI_ERR_INVALID);
        ck_assert_ptr_nonnull(strstr(err.msg, "id 6"));
        O->weight_free(ctx, &w);
        ck_assert_ptr_null(w.data);
        free(out), free(deq);
    }
    O->free(&ctx);
}
END_TEST

/* y = x W^T in double from the dequantized weights; *mag = max_j sum_k |w x|. */
static void matmul_ref(const float *deq, const float *x, float *y, int64_t ne0, int64_t ne1,
                       int64_t n_rows, double *mag) {
    *mag = 0;
    for (int64_t i = 0; i < n_rows; i++)
        for (int64_t j = 0; j < ne1; j++) {
            double s = 0, a = 0;
            for (int64_t k = 0; k < ne0; k++) {
                s += (double)deq[j * ne0 + k] * x[i * ne0 + k];
                a += fabs((double)deq[j * ne0 + k] * x[i * ne0 + k]);
            }
            y[i * ne1 + j] = (float)s;
            if (a > *mag) *mag = a;
        }
}

START_TEST(test_matmul_types) {
    struct tu_rng r;
    tu_rng_seed(&r, 14);
    struct ops_ctx *ctx = mk_ctx(2);
    for (int ti = 0; ti < N_TYPES; ti++) {
        const int type = k_types[ti], bs = quant_traits(type)->blck_size;
        const int64_t ne0s_1[] = {1, 7, 33, 257}, ne0s_32[] = {32, 96, 288},
                      ne0s_256[] = {256, 512};
        const int64_t *ne0s = bs == 1 ? ne0s_1 : bs == 32 ? ne0s_32 : ne0s_256;
        const int n_ne0 = bs == 1 ? 4 : bs == 32 ? 3 : 2;
        for (int a = 0; a < n_ne0; a++) {
            const int64_t ne0 = ne0s[a], ne1s[] = {1, 6, 37}, n_rows_s[] = {1, 3, 17};
            for (int b = 0; b < 3; b++) {
                const int64_t ne1 = ne1s[b], n_rows = n_rows_s[b];
                float *deq;
                void *host = make_weight(&r, type, ne0, ne1, &deq);
                struct tpi_weight w;
                struct tpi_error err;
                ck_assert_msg(O->weight_upload(ctx, &w, type, ne0, ne1, host, &err) == TPI_OK, "%s",
                              err.msg);
                ck_assert_uint_eq(w.row_bytes, quant_row_size(type, ne0));
                float *x = rnd(&r, (size_t)(n_rows * ne0), -1, 1);
                float *y = malloc((size_t)(n_rows * ne1) * sizeof(float));
                float *want = malloc((size_t)(n_rows * ne1) * sizeof(float));
                double mag;
                matmul_ref(deq, x, want, ne0, ne1, n_rows, &mag);
                O->matmul(ctx, &w, x, y, n_rows);
                expect_ok(ctx);
                char label[96];
                snprintf(label, sizeof label, "matmul %s ne0 %lld ne1 %lld rows %lld",
                         quant_type_name(type), (long long)ne0, (long long)ne1, (long long)n_rows);
                ck_assert_uint_eq(
                    tu_compare(label, y, want, (size_t)(n_rows * ne1), 4e-6 * mag, 1e-4), 0);
                O->weight_free(ctx, &w);
                free(host), free(deq), free(x), free(y), free(want);
            }
        }
    }
    O->free(&ctx);
}
END_TEST

/* Rows one at a time, in uneven chunks, all together; 1 and 2 threads: same bits. */
START_TEST(test_matmul_batching_bitwise) {
    struct tu_rng r;
    tu_rng_seed(&r, 15);
    struct ops_ctx *c1 = mk_ctx(1), *c2 = mk_ctx(2);
    const int types[] = {TPI_TYPE_Q4_K, TPI_TYPE_F32, TPI_TYPE_Q8_0};
    const int64_t ne0s[] = {512, 257, 96};
    for (int ti = 0; ti < 3; ti++) {
        const int64_t ne0 = ne0s[ti], ne1 = 45, n_rows = 11;
        float *deq;
        void *host = make_weight(&r, types[ti], ne0, ne1, &deq);
        struct tpi_weight w;
        struct tpi_error err;
        ck_assert_int_eq(O->weight_upload(c2, &w, types[ti], ne0, ne1, host, &err), TPI_OK);
        float *x = rnd(&r, (size_t)(n_rows * ne0), -1, 1);
        const size_t n_out = (size_t)(n_rows * ne1);
        float *all2 = malloc(n_out * sizeof(float)), *all1 = malloc(n_out * sizeof(float));
        float *one = malloc(n_out * sizeof(float)), *chunk = malloc(n_out * sizeof(float));
        O->matmul(c2, &w, x, all2, n_rows);
        O->matmul(c1, &w, x, all1, n_rows);
        for (int64_t i = 0; i < n_rows; i++)
            O->matmul(c1, &w, x + i * ne0, one + i * ne1, 1);
        for (int64_t i = 0; i < n_rows; i += 4) /* chunks of 4, 4, 3 */
            O->matmul(c2, &w, x + i * ne0, chunk + i * ne1, TPI_MIN(4, n_rows - i));
        ck_assert_msg(memcmp(all2, all1, n_out * sizeof(float)) == 0, "%s: 2 vs 1 threads",
                      quant_type_name(types[ti]));
        ck_assert_msg(memcmp(all2, one, n_out * sizeof(float)) == 0, "%s: batched vs one row",
                      quant_type_name(types[ti]));
        ck_assert_msg(memcmp(all2, chunk, n_out * sizeof(float)) == 0, "%s: batched vs chunks",
                      quant_type_name(types[ti]));
        O->weight_free(c2, &w);
        free(host), free(deq), free(x), free(all2), free(all1), free(one), free(chunk);
    }
    expect_ok(c1);
    expect_ok(c2);
    O->free(&c1);
    O->free(&c2);
}
END_TEST

/* ---- rope ---- */

/* want = x(n_tok, n_head, hd) with NEOX pairs (i, i + half) of each head turned by pos[t] *
 * inv[i], cos and sin times ms, all in double: the rope tests' reference. */
static void rope_want(const float *x, float *want, const int32_t *pos, int n_tok, int n_head,
                      int hd, int half, const double *inv, double ms) {
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < n_head; h++) {
            const float *xh = x + ((size_t)t * n_head + h) * hd;
            float *wh = want + ((size_t)t * n_head + h) * hd;
            for (int d = 0; d < hd; d++)
                wh[d] = xh[d];
            for (int i = 0; i < half; i++) {
                const double th = pos[t] * inv[i], cs = cos(th) * ms, sn = sin(th) * ms;
                wh[i] = (float)(xh[i] * cs - xh[i + half] * sn);
                wh[i + half] = (float)(xh[i] * sn + xh[i + half] * cs);
            }
        }
}

START_TEST(test_rope_neox) {
    struct tu_rng r;
    tu_rng_seed(&r, 16);
    struct ops_ctx *ctx = mk_ctx(2);
    const int32_t pos[5] = {7, 8, 100, 4095, 30000}, seq[5] = {0};
    struct ops_batch b = {
        .n_tokens = 5, .pos = pos, .seq = seq, .pos_host = pos, .seq_host = seq, .max_pos = 30001};
    const struct {
        int head_dim, n_rot;
        float base;
    } cases[] = {{64, 64, 1e6f}, {80, 32, 10000.0f}, {2, 2, 10000.0f}, {128, 128, 1e6f}};
    const int n_head = 3;
    for (int c = 0; c < 4; c++) {
        const int hd = cases[c].head_dim, n_rot = cases[c].n_rot, half = n_rot / 2;
        const size_t n = (size_t)5 * n_head * hd;
        float *x = rnd(&r, n, -1, 1), *want = malloc(n * sizeof(float));
        double inv[64];
        for (int i = 0; i < half; i++)
            inv[i] = pow((double)cases[c].base, -2.0 * i / n_rot);
        rope_want(x, want, pos, 5, n_head, hd, half, inv, 1.0);
        const struct ops_rope rope = ops_rope_plain(n_rot, cases[c].base);
        O->rope_neox(ctx, x, &b, n_head, hd, &rope);
        ck_assert_uint_eq(tu_compare("rope_neox", x, want, n, 1e-6, 1e-5), 0);
        free(x), free(want);
    }
    expect_ok(ctx);
    O->free(&ctx);
}
END_TEST

/* Scaled rope against the formula as Hugging Face transformers arranges it
 * (modeling_rope_utils: _compute_yarn_parameters, _compute_linear_scaling_rope_parameters):
 * inv_freq from find_correction_range and a linear ramp mask over the pairs, blended
 * between 1 / (factor * base^(2i/dim)) and 1 / base^(2i/dim), cos and sin times
 * attention_factor = 0.1 ln(factor) + 1 (get_mscale: 1 for a factor up to 1); linear
 * scaling divides every inv_freq by the factor; llama.cpp's attn_factor multiplies both. rope.h computes the same in llama.cpp's arrangement (ggml's rope_yarn). */
START_TEST(test_rope_scaled) {
    struct tu_rng r;
    tu_rng_seed(&r, 17);
    struct ops_ctx *ctx = mk_ctx(2);
    const int32_t pos[6] = {0, 7, 300, 4095, 30000, 131071}, seq[6] = {0};
    struct ops_batch b = {.n_tokens = 6, .pos = pos, .seq = seq, .pos_host = pos,
                          .seq_host = seq, .max_pos = 131072};
    const struct {
        int head_dim, n_rot;
        float base, factor;
        int orig;     /* YaRN's original context; 0: linear */
        float attn;   /* rope.scaling.attn_factor: cos and sin times it, before YaRN's own */
    } cases[] = {{128, 128, 1e6f, 4.0f, 32768, 1.0f}, /* Qwen3's long-context setting */
                 {64, 64, 1e6f, 4.0f, 256, 1.0f},     /* the ramp over pairs 0..9 */
                 {80, 32, 1e4f, 8.0f, 2048, 1.0f},    /* fewer rotated dims than the head */
                 {64, 64, 1e6f, 0.5f, 256, 1.0f},     /* a factor under 1: no magnitude term */
                 {64, 64, 1e4f, 2.0f, 0, 1.0f},       /* linear */
                 {64, 64, 1e4f, 2.0f, 0, 2.0f}};      /* linear with an attn_factor */
    const int n_head = 2;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int hd = cases[c].head_dim, dim = cases[c].n_rot, half = dim / 2;
        const double base = cases[c].base, factor = cases[c].factor;
        const bool yarn = cases[c].orig > 0;
        double inv_freq[64], attention_factor = cases[c].attn;
        if (yarn) {
            const double two_pi = 2.0 * 3.14159265358979323846;
            double low = floor(dim * log(cases[c].orig / (32.0 * two_pi)) / (2.0 * log(base)));
            double high = ceil(dim * log(cases[c].orig / (1.0 * two_pi)) / (2.0 * log(base)));
            low = fmax(low, 0.0);
            high = fmin(high, dim - 1);
            if (low == high) high += 0.001;
            for (int i = 0; i < half; i++) {
                const double ramp = fmin(fmax((i - low) / (high - low), 0.0), 1.0);
                const double extrapolation_factor = 1.0 - ramp;
                const double pos_freq = pow(base, 2.0 * i / dim);
                inv_freq[i] = 1.0 / (factor * pos_freq) * (1.0 - extrapolation_factor) +
                              1.0 / pos_freq * extrapolation_factor;
            }
            attention_factor *= factor > 1.0 ? 0.1 * log(factor) + 1.0 : 1.0; /* get_mscale */
        } else {
            for (int i = 0; i < half; i++)
                inv_freq[i] = 1.0 / pow(base, 2.0 * i / dim) / factor;
        }
        const size_t n = (size_t)6 * n_head * hd;
        float *x = rnd(&r, n, -1, 1), *want = malloc(n * sizeof(float));
        rope_want(x, want, pos, 6, n_head, hd, half, inv_freq, attention_factor);
        struct ops_rope rope = ops_rope_plain(dim, cases[c].base);
        rope.freq_scale = 1.0f / cases[c].factor;
        if (yarn) rope.ext_factor = 1.0f, rope.n_ctx_orig = cases[c].orig;
        rope.attn_factor = cases[c].attn;
        O->rope_neox(ctx, x, &b, n_head, hd, &rope);
        char label[64];
        snprintf(label, sizeof label, "rope %s x%g, case %zu", yarn ? "yarn" : "linear", factor, c);
        /* both in double until the rotated values: the f32 rounding of cos, sin and x
         * bounds the difference */
        ck_assert_uint_eq(tu_compare(label, x, want, n, 1e-6, 1e-5), 0);
        free(x), free(want);
    }
    expect_ok(ctx);
    O->free(&ctx);
}
END_TEST

/* ---- attention ---- */

/* A double-precision model of one layer of the cache: K/V per (slot, pos, kv head). */
struct ref_cache {
    int n_slot, n_ctx, n_kv, hd;
    float *k, *v;
};

static void ref_attention(struct ref_cache *rc, const float *q, const float *k, const float *v,
                          float *out, const int32_t *seq, const int32_t *pos, int n_tokens,
                          int n_head, float scale) {
    const size_t row = (size_t)rc->n_kv * rc->hd;
    for (int t = 0; t < n_tokens; t++) {
        memcpy(rc->k + ((size_t)seq[t] * rc->n_ctx + pos[t]) * row, k + t * row,
               row * sizeof(float));
        memcpy(rc->v + ((size_t)seq[t] * rc->n_ctx + pos[t]) * row, v + t * row,
               row * sizeof(float));
    }
    double *s = malloc((size_t)rc->n_ctx * sizeof(double));
    for (int t = 0; t < n_tokens; t++)
        for (int h = 0; h < n_head; h++) {
            const int kvh = h / (n_head / rc->n_kv);
            const float *qh = q + ((size_t)t * n_head + h) * rc->hd;
            const float *ks = rc->k + (size_t)seq[t] * rc->n_ctx * row + (size_t)kvh * rc->hd;
            const float *vs = rc->v + (size_t)seq[t] * rc->n_ctx * row + (size_t)kvh * rc->hd;
            double m = -INFINITY, sum = 0;
            for (int j = 0; j <= pos[t]; j++) {
                double d = 0;
                for (int e = 0; e < rc->hd; e++)
                    d += (double)qh[e] * ks[j * row + e];
                s[j] = d * scale;
                m = fmax(m, s[j]);
            }
            for (int j = 0; j <= pos[t]; j++)
                sum += (s[j] = exp(s[j] - m));
            for (int e = 0; e < rc->hd; e++) {
                double o = 0;
                for (int j = 0; j <= pos[t]; j++)
                    o += s[j] * vs[j * row + e];
                out[((size_t)t * n_head + h) * rc->hd + e] = (float)(o / sum);
            }
        }
    free(s);
}

/* One batch through the backend: returns out (n_tokens, n_head, hd), caller frees. */
static float *run_attention(struct ops_ctx *ctx, struct ops_kv *kv, int layer, const float *q,
                            const float *k, const float *v, const int32_t *seq, const int32_t *pos,
                            int n_tokens, int n_head, float scale) {
    int max_pos = 0;
    for (int t = 0; t < n_tokens; t++)
        max_pos = TPI_MAX(max_pos, pos[t] + 1);
    struct ops_batch b = {.n_tokens = n_tokens,
                          .pos = pos,
                          .seq = seq,
                          .pos_host = pos,
                          .seq_host = seq,
                          .max_pos = max_pos};
    float *out = malloc((size_t)n_tokens * n_head * kv->head_dim * sizeof(float));
    O->attention(ctx, kv, layer, q, k, v, out, &b, n_head, scale);
    expect_ok(ctx);
    return out;
}

START_TEST(test_attention) {
    const struct { int n_head, n_kv, hd; } cfgs[] = {{8, 4, 16}, {8, 1, 7}, {4, 4, 64}, {8, 4, 3}};
    struct tu_rng r;
    tu_rng_seed(&r, 17);
    struct ops_ctx *c1 = mk_ctx(1), *c2 = mk_ctx(2);
    for (int ci = 0; ci < 4; ci++) {
        const int n_head = cfgs[ci].n_head, n_kv = cfgs[ci].n_kv, hd = cfgs[ci].hd;
        const int n_slot = 3, n_ctx = 40, layer = 1;
        const float scale = 1.0f / sqrtf((float)hd);
        struct ops_kv kv_a, kv_b; /* a: mixed batches, 2 threads; b: per sequence, 1 thread */
        struct tpi_error err;
        ck_assert_int_eq(O->kv_init(c2, &kv_a, 2, n_slot, n_ctx, n_kv, hd, &err), TPI_OK);
        ck_assert_int_eq(O->kv_init(c1, &kv_b, 2, n_slot, n_ctx, n_kv, hd, &err), TPI_OK);
        ck_assert_int_eq(kv_a.type, TPI_TYPE_F32);
        ck_assert_uint_eq(kv_a.n_bytes, (size_t)2 * 2 * n_slot * n_ctx * n_kv * hd * sizeof(float));
        struct ref_cache rc = {n_slot, n_ctx, n_kv, hd, NULL, NULL};
        rc.k = calloc((size_t)n_slot * n_ctx * n_kv * hd, sizeof(float));
        rc.v = calloc((size_t)n_slot * n_ctx * n_kv * hd, sizeof(float));

        /* steps: prefill slot 0 (0..9) and slot 2 (0..4); continue slot 0 at 10..16
         * (positions not starting at 0); then a mixed batch: slot 1 prefill, slot 0
         * two more tokens, slot 2 decode, interleaved. */
        int32_t s1[15], p1[15];
        for (int i = 0; i < 10; i++)
            s1[i] = 0, p1[i] = i;
        for (int i = 0; i < 5; i++)
            s1[10 + i] = 2, p1[10 + i] = i;
        int32_t s2[7], p2[7];
        for (int i = 0; i < 7; i++)
            s2[i] = 0, p2[i] = 10 + i;
        const int32_t s3[6] = {1, 0, 2, 1, 0, 1}, p3[6] = {0, 17, 5, 1, 18, 2};
        const int32_t *steps_s[3] = {s1, s2, s3}, *steps_p[3] = {p1, p2, p3};
        const int steps_n[3] = {15, 7, 6};
        for (int st = 0; st < 3; st++) {
            const int nt = steps_n[st];
            const size_t nq = (size_t)nt * n_head * hd, nk = (size_t)nt * n_kv * hd;
            float *q = rnd(&r, nq, -2, 2), *k = rnd(&r, nk, -2, 2), *v = rnd(&r, nk, -1, 1);
            float *want = malloc(nq * sizeof(float));
            ref_attention(&rc, q, k, v, want, steps_s[st], steps_p[st], nt, n_head, scale);
            float *got = run_attention(c2, &kv_a, layer, q, k, v, steps_s[st], steps_p[st], nt,
                                       n_head, scale);
            char label[64];
            snprintf(label, sizeof label, "attention %d/%d hd %d step %d", n_head, n_kv, hd, st);
            ck_assert_uint_eq(tu_compare(label, got, want, nq, 1e-5, 1e-4), 0);
            /* the same tokens, one sequence per batch (in slot order), 1 thread: same bits */
            for (int slot = 0; slot < n_slot; slot++) {
                int idx[16], m = 0;
                for (int t = 0; t < nt; t++)
                    if (steps_s[st][t] == slot) idx[m++] = t;
                if (!m) continue;
                float *qs = malloc((size_t)m * n_head * hd * sizeof(float));
                float *ks = malloc((size_t)m * n_kv * hd * sizeof(float));
                float *vs = malloc((size_t)m * n_kv * hd * sizeof(float));
                int32_t ss[16], ps[16];
                for (int i = 0; i < m; i++) {
                    const int t = idx[i];
                    memcpy(qs + (size_t)i * n_head * hd, q + (size_t)t * n_head * hd,
                           (size_t)n_head * hd * sizeof(float));
                    memcpy(ks + (size_t)i * n_kv * hd, k + (size_t)t * n_kv * hd,
                           (size_t)n_kv * hd * sizeof(float));
                    memcpy(vs + (size_t)i * n_kv * hd, v + (size_t)t * n_kv * hd,
                           (size_t)n_kv * hd * sizeof(float));
                    ss[i] = steps_s[st][t], ps[i] = steps_p[st][t];
                }
                float *sep = run_attention(c1, &kv_b, layer, qs, ks, vs, ss, ps, m, n_head, scale);
                for (int i = 0; i < m; i++)
                    ck_assert_msg(memcmp(sep + (size_t)i * n_head * hd,
                                         got + (size_t)idx[i] * n_head * hd,
                                         (size_t)n_head * hd * sizeof(float)) == 0,
                                  "%s: token %d mixed vs separate differ", label, idx[i]);
                free(qs), free(ks), free(vs), free(sep);
            }
            free(q), free(k), free(v), free(want), free(got);
        }
        /* layer 0 was never written: attention on layer 1 must not touch it */
        const size_t layer_elems = (size_t)n_slot * n_ctx * n_kv * hd;
        for (size_t i = 0; i < layer_elems; i++)
            ck_assert_float_eq(((float *)kv_a.k)[i], 0.0f);
        ck_assert_mem_eq(kv_a.k, kv_b.k, kv_a.n_bytes / 2);
        ck_assert_mem_eq(kv_a.v, kv_b.v, kv_a.n_bytes / 2);
        O->kv_free(c2, &kv_a);
        O->kv_free(c1, &kv_b);
        ck_assert_ptr_null(kv_a.k);
        free(rc.k), free(rc.v);
    }
    O->free(&c1);
    O->free(&c2);
}
END_TEST

/* ---- errors ---- */

START_TEST(test_errors) {
    struct ops_ctx *ctx = mk_ctx(2);
    struct tpi_weight w;
    struct tpi_error err;
    unsigned char buf[4096] = {0};
    tpi_err_clear(&err);
    ck_assert_int_eq(O->weight_upload(ctx, &w, 16, 256, 2, buf, &err), TPI_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(err.msg, "IQ2_XXS") != NULL, "message: %s", err.msg);
    ck_assert_ptr_null(w.data);
    ck_assert_int_eq(O->weight_upload(ctx, &w, 99, 256, 2, buf, &err), TPI_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(err.msg, "type99") != NULL, "message: %s", err.msg);
    ck_assert_int_eq(O->weight_upload(ctx, &w, TPI_TYPE_Q4_K, 100, 2, buf, &err), TPI_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "Q4_K") && strstr(err.msg, "256"), "message: %s", err.msg);

    struct ops_kv kv;
    ck_assert_int_eq(O->kv_init(ctx, &kv, 1, 1, 0, 1, 8, &err), TPI_ERR_INVALID);
    ck_assert_int_eq(O->kv_init(ctx, &kv, 1, 2, 4, 2, 8, &err), TPI_OK);
    float q[4 * 8] = {0}, k[2 * 8] = {0}, out[4 * 8];
    const int32_t pos[1] = {4}, seq[1] = {1};
    struct ops_batch b = {1, pos, seq, pos, seq, 5};
    O->attention(ctx, &kv, 0, q, k, k, out, &b, 4, 1.0f);
    ck_assert_int_eq(O->check(ctx, &err), TPI_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "position 4") != NULL, "message: %s", err.msg);
    ck_assert_int_eq(O->check(ctx, &err), TPI_OK);        /* reported once, then cleared */
    O->attention(ctx, &kv, 0, q, k, k, out, &b, 3, 1.0f); /* 3 heads over 2 kv heads */
    ck_assert_int_eq(O->check(ctx, &err), TPI_ERR_INVALID);
    O->kv_free(ctx, &kv);

    ck_assert_ptr_eq(ops_by_name("cpu", &err), &ops_cpu);
    ck_assert_ptr_nonnull(ops_by_name("auto", &err));
    tpi_err_clear(&err);
    ck_assert_ptr_null(ops_by_name("tpu", &err));
    ck_assert_int_eq(err.status, TPI_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "'tpu'") != NULL, "message: %s", err.msg);
    int n_dev = -1;
    if (!ops_cuda_get()) {
        ck_assert(!ops_cuda_available(&n_dev));
        ck_assert_int_eq(n_dev, 0);
        ck_assert_ptr_eq(ops_by_name("auto", &err), &ops_cpu);
        ck_assert_ptr_null(ops_by_name("cuda", &err));
        ck_assert_int_eq(err.status, TPI_ERR_UNSUPPORTED);
    } else if (!ops_cuda_available(&n_dev)) {
        ck_assert_ptr_eq(ops_by_name("auto", &err), &ops_cpu);
        ck_assert_ptr_null(ops_by_name("cuda", &err));
    }
    O->free(&ctx);
}
END_TEST

/* ---- benchmark (printed, not asserted) ---- */

static double bench_gflops(struct ops_ctx *ctx, const struct tpi_weight *w, const float *x,
                           float *y, int64_t n_rows) {
    /* no separate warm-up: sanitizer builds run this ~100x slower */
    int reps = 0;
    double t0 = tpi_time_s(), t;
    do {
        O->matmul(ctx, w, x, y, n_rows);
        reps++;
        t = tpi_time_s() - t0;
    } while (t < 0.25);
    return 2.0 * (double)w->ne0 * (double)w->ne1 * (double)n_rows * reps / t * 1e-9;
}

START_TEST(test_bench_matmul) {
    struct tu_rng r;
    tu_rng_seed(&r, 18);
    struct ops_ctx *c1 = mk_ctx(1), *call = mk_ctx(0);
    const int types[] = {TPI_TYPE_Q4_K, TPI_TYPE_Q8_0, TPI_TYPE_F32};
    for (int ti = 0; ti < 3; ti++) {
        const int64_t ne0 = 512, ne1 = 1024, n_rows = 128;
        float *deq;
        void *host = make_weight(&r, types[ti], ne0, ne1, &deq);
        struct tpi_weight w;
        struct tpi_error err;
        ck_assert_int_eq(O->weight_upload(call, &w, types[ti], ne0, ne1, host, &err), TPI_OK);
        float *x = rnd(&r, (size_t)(n_rows * ne0), -1, 1), *y = malloc((size_t)(n_rows * ne1) * 4);
        fprintf(stderr,
                "bench matmul %s %lldx%lld, 128 rows: %.2f GFLOP/s (1 thread), %.2f GFLOP/s (%s); "
                "1 row: %.2f GFLOP/s (%s)\n",
                quant_type_name(types[ti]), (long long)ne0, (long long)ne1,
                bench_gflops(c1, &w, x, y, n_rows), bench_gflops(call, &w, x, y, n_rows),
                O->device_name(call), bench_gflops(call, &w, x, y, 1), O->device_name(call));
        O->weight_free(call, &w);
        free(host), free(deq), free(x), free(y);
    }
    O->free(&c1);
    O->free(&call);
}
END_TEST

int main(void) {
    Suite *s = suite_create("ops_cpu");
    TCase *tc = tcase_create("ops_cpu");
    tcase_add_test(tc, test_context_memory);
    tcase_add_test(tc, test_rmsnorm);
    tcase_add_test(tc, test_bias_silu_add_get_rows);
    tcase_add_test(tc, test_row_top);
    tcase_add_test(tc, test_embed);
    tcase_add_test(tc, test_matmul_types);
    tcase_add_test(tc, test_matmul_batching_bitwise);
    tcase_add_test(tc, test_rope_neox);
    tcase_add_test(tc, test_rope_scaled);
    tcase_add_test(tc, test_attention);
    tcase_add_test(tc, test_errors);
    suite_add_tcase(s, tc);
    TCase *tb = tcase_create("bench");
    tcase_set_timeout(tb, 120); /* generous for sanitizer builds; ~1 s in Release */
    tcase_add_test(tb, test_bench_matmul);
    suite_add_tcase(s, tb);
    return tu_run_suite(s);
}
