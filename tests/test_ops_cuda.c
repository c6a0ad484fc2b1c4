/*
 * test_ops_cuda.c — every CUDA op against the CPU reference op (ops_cpu) on
 * random data of awkward sizes, through the two op tables only.
 *
 * One executable, one group per run: `test_ops_cuda GROUP` with GROUP one of
 * elem, embed, matmul_<TYPE> (F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K Q3_K Q2_K
 * IQ4_NL IQ4_XS),
 * attn_prefill, attn_decode; no argument runs them all; `bench` (not a ctest test)
 * prints rough kernel speeds. Without a usable GPU it
 * prints SKIP and exits 77, except for group `host`: the attention launchers' host-side
 * planning (query blocks, the decode split's clusters) and the layer tail's split of rows
 * among its blocks, which need no GPU.
 *
 * Error bounds (normalized MSE = sum (got-want)^2 / sum want^2), by path:
 * - elementwise, norm, rope, embed, get_rows: same f32 arithmetic, elementwise
 *   atol/rtol ~1e-5 (rope's angle is taken in double on both sides).
 * - matmul n_rows <= 8 (matrix-vector kernels, exact dequantized weights, f32
 *   sums in another order): NMSE < 1e-9. Both decode paths run (ops_cuda_set_gemv):
 *   v2, and v3, which for every block type rounds x to int8 per 32-value
 *   block: there each output within sum_j |w_ij| d_j / 2 (d_j: x's int8 step) of the
 *   f32 reference, and NMSE < 1e-4 over >= 256 outputs (see check_v3).
 * - matmul n_rows > 8, F32 weights (f32 SGEMM): NMSE < 1e-9; other types (x and W
 *   rounded to bf16, f32 accumulation): NMSE < 5e-5 (about 2 x (2^-9)^2 / 3 expected).
 *   Block types run both paths (ops_cuda_set_mmq): the fused kernel (kern_mmq.cu, set
 *   to take up to 64 rows here; by default it takes up to 32; Q4_K and Q6_K's groups up
 *   to 32 rows take their raw paths, W exact and x bf16, unless TPI_MMQ_RAW=0: the _noraw
 *   entries) and the dequantize + cuBLAS path.
 * - attention (f16 K/V cache on CUDA, f32 on the CPU; history pre-rounded to f16 on
 *   both, the batch's own k/v rounded by the CUDA store only; the tensor-core path also
 *   rounds q and the softmax weights to f16, derived at the attention tests): NMSE < 1e-5.
 * CUDA runs in this process (no fork: a CUDA context does not survive fork).
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"
#include "kernels/quant.h"
#include "testutil.h"
#include "tpi.h"

static const struct ops *G; /* the CUDA backend */
static const struct ops *C = &ops_cpu;
static struct ops_ctx *gctx, *cctx;

/* ---- helpers: copies between the host and each backend ---- */

static void *bdup(const struct ops *o, struct ops_ctx *ctx, const void *h, size_t n_bytes) {
    void *p = o->alloc(ctx, n_bytes);
    ck_assert_ptr_nonnull(p);
    o->to_dev(ctx, p, h, n_bytes);
    o->sync(ctx);
    return p;
}

static void bget(const struct ops *o, struct ops_ctx *ctx, void *h, const void *d, size_t n_bytes) {
    o->sync(ctx);
    o->to_host(ctx, h, d, n_bytes);
}

static void assert_ok(const struct ops *o, struct ops_ctx *ctx, const char *what) {
    struct tpi_error err;
    tpi_err_clear(&err);
    o->sync(ctx);
    int st = o->check(ctx, &err);
    if (st != TPI_OK) fprintf(stderr, "%s (%s): %s\n", what, o->name, err.msg);
    ck_assert_int_eq(st, TPI_OK);
}

static float *rand_vec(struct tu_rng *r, size_t n, float lo, float hi) {
    float *x = malloc(n * sizeof(float));
    ck_assert_ptr_nonnull(x);
    tu_fill_uniform(r, x, n, lo, hi);
    return x;
}

static double rms(const float *x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return n ? sqrt(s / (double)n) : 0.0;
}

/* Compare and assert: elementwise atol/rtol, and optionally an NMSE bound (< 0: none). */
static void expect_close(const char *label, const float *got, const float *want, size_t n,
                         double atol, double rtol, double nmse_max) {
    size_t bad = tu_compare(label, got, want, n, atol, rtol);
    if (nmse_max >= 0) {
        double e = tu_nmse(got, want, n);
        fprintf(stderr, "%s: nmse=%.3g (bound %.1g)\n", label, e, nmse_max);
        ck_assert_msg(e < nmse_max, "%s: nmse %.3g >= %.3g", label, e, nmse_max);
    }
    ck_assert_msg(bad == 0, "%s: %zu mismatches", label, bad);
}

/* ---- elementwise, norm, rope, get_rows ---- */

START_TEST(test_rmsnorm) {
    struct tu_rng r;
    tu_rng_seed(&r, 1);
    const int64_t rows[] = {1, 3, 37}, cols[] = {1, 33, 896, 4097, 5120};
    /* decode rows (<= 8) of 896 and 5120 take the split kernel, in place the one-block one */
    for (size_t a = 0; a < 3; a++)
        for (size_t b = 0; b < 5; b++) {
            const int64_t nr = rows[a], nc = cols[b];
            const size_t n = (size_t)(nr * nc);
            float *x = rand_vec(&r, n, -3, 3), *w = rand_vec(&r, (size_t)nc, 0.5f, 1.5f);
            float *want = malloc(n * 4), *got = malloc(n * 4);
            float *cx = bdup(C, cctx, x, n * 4), *cw = bdup(C, cctx, w, (size_t)nc * 4);
            float *gx = bdup(G, gctx, x, n * 4), *gw = bdup(G, gctx, w, (size_t)nc * 4);
            float *gy = G->alloc(gctx, n * 4), *cy = C->alloc(cctx, n * 4);
            C->rmsnorm(cctx, cx, cw, cy, nr, nc, 1e-6f);
            G->rmsnorm(gctx, gx, gw, gy, nr, nc, 1e-6f);
            bget(C, cctx, want, cy, n * 4);
            bget(G, gctx, got, gy, n * 4);
            char label[64];
            snprintf(label, sizeof label, "rmsnorm %lldx%lld", (long long)nr, (long long)nc);
            expect_close(label, got, want, n, 1e-5, 1e-5, -1);
            /* in place (y == x) */
            G->rmsnorm(gctx, gx, gw, gx, nr, nc, 1e-6f);
            bget(G, gctx, got, gx, n * 4);
            expect_close("rmsnorm in place", got, want, n, 1e-5, 1e-5, -1);
            assert_ok(G, gctx, "rmsnorm");
            C->dealloc(cctx, cx), C->dealloc(cctx, cw), C->dealloc(cctx, cy);
            G->dealloc(gctx, gx), G->dealloc(gctx, gw), G->dealloc(gctx, gy);
            free(x), free(w), free(want), free(got);
        }
}
END_TEST

START_TEST(test_bias_add_silu) {
    struct tu_rng r;
    tu_rng_seed(&r, 2);
    const int64_t nr = 37, nc = 1001, n = nr * nc;
    float *y = rand_vec(&r, (size_t)n, -2, 2), *b = rand_vec(&r, (size_t)nc, -1, 1);
    float *g = rand_vec(&r, (size_t)n, -20, 20), *want = malloc((size_t)n * 4),
          *got = malloc((size_t)n * 4);
    float *cy = bdup(C, cctx, y, (size_t)n * 4), *cb = bdup(C, cctx, b, (size_t)nc * 4);
    float *gy = bdup(G, gctx, y, (size_t)n * 4), *gb = bdup(G, gctx, b, (size_t)nc * 4);
    float *cg = bdup(C, cctx, g, (size_t)n * 4), *gg = bdup(G, gctx, g, (size_t)n * 4);

    C->add_bias(cctx, cy, cb, nr, nc);
    G->add_bias(gctx, gy, gb, nr, nc);
    bget(C, cctx, want, cy, (size_t)n * 4);
    bget(G, gctx, got, gy, (size_t)n * 4);
    expect_close("add_bias 37x1001", got, want, (size_t)n, 0, 0, -1);

    C->add(cctx, cy, cg, n);
    G->add(gctx, gy, gg, n);
    bget(C, cctx, want, cy, (size_t)n * 4);
    bget(G, gctx, got, gy, (size_t)n * 4);
    expect_close("add 37037", got, want, (size_t)n, 0, 0, -1);

    /* silu_mul with y aliasing g */
    C->silu_mul(cctx, cg, cy, cg, n);
    G->silu_mul(gctx, gg, gy, gg, n);
    bget(C, cctx, want, cg, (size_t)n * 4);
    bget(G, gctx, got, gg, (size_t)n * 4);
    expect_close("silu_mul 37037", got, want, (size_t)n, 1e-6, 1e-5, -1);
    assert_ok(G, gctx, "bias/add/silu");
    C->dealloc(cctx, cy), C->dealloc(cctx, cb), C->dealloc(cctx, cg);
    G->dealloc(gctx, gy), G->dealloc(gctx, gb), G->dealloc(gctx, gg);
    free(y), free(b), free(g), free(want), free(got);
}
END_TEST

START_TEST(test_rope) {
    struct tu_rng r;
    tu_rng_seed(&r, 3);
    const int n_tokens = 37, n_head = 3;
    /* head_dim, n_rot, YaRN (x4 from 256 positions: the ramp inside the head) */
    const int dims[][3] = {{128, 128, 0}, {128, 64, 0}, {64, 64, 0}, {80, 80, 0}, {128, 128, 1},
                           {64, 64, 1}};
    for (size_t c = 0; c < sizeof dims / sizeof dims[0]; c++) {
        const int hd = dims[c][0], n_rot = dims[c][1];
        struct ops_rope rope = ops_rope_plain(n_rot, 1000000.0f);
        if (dims[c][2]) rope.freq_scale = 0.25f, rope.ext_factor = 1.0f, rope.n_ctx_orig = 256;
        const size_t n = (size_t)n_tokens * n_head * hd;
        int32_t pos[37], seq[37];
        for (int t = 0; t < n_tokens; t++) {
            pos[t] = t < 5 ? t : (int32_t)tu_uniform(&r, 0, 8000);
            seq[t] = 0;
        }
        float *x = rand_vec(&r, n, -2, 2), *want = malloc(n * 4), *got = malloc(n * 4);
        float *cx = bdup(C, cctx, x, n * 4), *gx = bdup(G, gctx, x, n * 4);
        int32_t *gpos = bdup(G, gctx, pos, sizeof pos), *gseq = bdup(G, gctx, seq, sizeof seq);
        struct ops_batch cb = {n_tokens, pos, seq, pos, seq, 8001};
        struct ops_batch gb = {n_tokens, gpos, gseq, pos, seq, 8001};
        C->rope_neox(cctx, cx, &cb, n_head, hd, &rope);
        G->rope_neox(gctx, gx, &gb, n_head, hd, &rope);
        bget(C, cctx, want, cx, n * 4);
        bget(G, gctx, got, gx, n * 4);
        char label[64];
        snprintf(label, sizeof label, "rope hd %d n_rot %d%s", hd, n_rot, dims[c][2] ? " yarn" : "");
        expect_close(label, got, want, n, 1e-5, 1e-5, -1);
        assert_ok(G, gctx, "rope");
        C->dealloc(cctx, cx), G->dealloc(gctx, gx), G->dealloc(gctx, gpos), G->dealloc(gctx, gseq);
        free(x), free(want), free(got);
    }
}
END_TEST

/* host_alloc's memory (pinned on CUDA) as the target of to_host and the source of
 * to_dev: the bytes arrive intact, at an odd size the size of Qwen3's logits and more. */
START_TEST(test_host_alloc) {
    ck_assert_ptr_nonnull(G->host_alloc);
    ck_assert_ptr_nonnull(G->host_free);
    const size_t n = 151936 + 37; /* floats */
    float *want = malloc(n * sizeof(float));
    ck_assert_ptr_nonnull(want);
    for (size_t i = 0; i < n; i++)
        want[i] = (float)i * 0.25f - 1000.0f;
    float *d = bdup(G, gctx, want, n * sizeof(float));
    float *h = G->host_alloc(gctx, n * sizeof(float));
    ck_assert_ptr_nonnull(h);
    memset(h, 0xff, n * sizeof(float));
    bget(G, gctx, h, d, n * sizeof(float));
    ck_assert_int_eq(memcmp(h, want, n * sizeof(float)), 0);
    /* back the other way from the pinned buffer, into a second device buffer */
    for (size_t i = 0; i < n; i++)
        h[i] = -want[i];
    float *d2 = G->alloc(gctx, n * sizeof(float));
    ck_assert_ptr_nonnull(d2);
    G->to_dev(gctx, d2, h, n * sizeof(float));
    G->sync(gctx);
    bget(G, gctx, want, d2, n * sizeof(float));
    ck_assert_int_eq(memcmp(want, h, n * sizeof(float)), 0);
    assert_ok(G, gctx, "host_alloc");
    G->host_free(gctx, h);
    G->host_free(gctx, NULL);
    G->dealloc(gctx, d);
    G->dealloc(gctx, d2);
    free(want);
}
END_TEST

START_TEST(test_get_rows) {
    struct tu_rng r;
    tu_rng_seed(&r, 4);
    const int64_t n_src = 50, nc = 333;
    const int32_t idx[] = {49, 0, 7, 7, 13};
    const int n_idx = 5;
    float *src = rand_vec(&r, (size_t)(n_src * nc), -1, 1);
    float *want = malloc((size_t)(n_idx * nc) * 4), *got = malloc((size_t)(n_idx * nc) * 4);
    float *cs = bdup(C, cctx, src, (size_t)(n_src * nc) * 4),
          *gs = bdup(G, gctx, src, (size_t)(n_src * nc) * 4);
    float *cd = C->alloc(cctx, (size_t)(n_idx * nc) * 4),
          *gd = G->alloc(gctx, (size_t)(n_idx * nc) * 4);
    C->get_rows(cctx, cs, idx, n_idx, nc, cd);
    G->get_rows(gctx, gs, idx, n_idx, nc, gd);
    bget(C, cctx, want, cd, (size_t)(n_idx * nc) * 4);
    bget(G, gctx, got, gd, (size_t)(n_idx * nc) * 4);
    expect_close("get_rows", got, want, (size_t)(n_idx * nc), 0, 0, -1);
    assert_ok(G, gctx, "get_rows");
    C->dealloc(cctx, cs), C->dealloc(cctx, cd), G->dealloc(gctx, gs), G->dealloc(gctx, gd);
    free(src), free(want), free(got);
}
END_TEST

/* row_top: the CUDA selection is the CPU's, bitwise (ids, the values' bits, the flags):
 * its filtered candidates, and a row of zeros whose ties at the threshold overflow them,
 * on rows of a vocabulary's width, wider ones, a last filter chunk of one column, k =
 * n_cols, rows narrower than the threshold's groups (empty groups: every column a
 * candidate), many exact ties, zeros of both signs, the best values spread or in one
 * place, NaN and infinity. */
START_TEST(test_row_top) {
    struct tu_rng r;
    tu_rng_seed(&r, 9);
    const int shapes[][3] = {{151936, 64, 37}, {600000, 64, 2}, {4097, 1, 5}, {4096, 64, 5},
                             {70, 40, 5},      {64, 64, 5},     {5000, 20, 5}, {40, 7, 5}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int *shape = shapes[si];
        const int n_cols = shape[0], k = shape[1], n_rows = shape[2];
        const int64_t ld = n_cols + 5;
        const size_t n = (size_t)n_rows * ld;
        float *x = malloc(sizeof(float) * n);
        for (int i = 0; i < n_rows; i++)
            for (int64_t c = 0; c < ld; c++) {
                float v = floorf(tu_uniform(&r, -40.0f, 40.0f)) * 0.25f;
                if (i % 5 == 1) v = c % 2 ? 0.0f : -0.0f;
                if (i % 5 == 2 && c > n_cols / 3 && c < n_cols / 3 + 100) v += 50.0f; // one place
                x[(size_t)i * ld + c] = v;
            }
        if (n_rows > 3) x[3 * (size_t)ld + 1] = NAN;
        if (n_rows > 4) x[4 * (size_t)ld + n_cols - 1] = INFINITY;
        const size_t nk = (size_t)n_rows * k;
        int32_t *ci = malloc(4 * nk), *gi = malloc(4 * nk), *cb = malloc(4 * n_rows),
                *gb = malloc(4 * n_rows);
        float *cv = malloc(4 * nk), *gv = malloc(4 * nk);
        float *cx = bdup(C, cctx, x, 4 * n), *gx = bdup(G, gctx, x, 4 * n);
        int32_t *gid = G->alloc(gctx, 4 * nk), *gbd = G->alloc(gctx, 4 * n_rows);
        float *gvd = G->alloc(gctx, 4 * nk);
        C->row_top(cctx, cx, n_rows, ld, n_cols, 7, k, ci, cv, cb);
        G->row_top(gctx, gx, n_rows, ld, n_cols, 7, k, gid, gvd, gbd);
        bget(G, gctx, gi, gid, 4 * nk);
        bget(G, gctx, gv, gvd, 4 * nk);
        bget(G, gctx, gb, gbd, 4 * n_rows);
        assert_ok(G, gctx, "row_top");
        for (int i = 0; i < n_rows; i++) {
            ck_assert_int_eq(gb[i], cb[i]);
            ck_assert_int_eq(cb[i], (i == 3 || i == 4));
            if (cb[i]) continue;
            for (int j = 0; j < k; j++) {
                const size_t o = (size_t)i * k + j;
                ck_assert_msg(gi[o] == ci[o] && memcmp(&gv[o], &cv[o], 4) == 0,
                              "row_top %d cols k %d: row %d place %d: id %d value %g, cpu %d %g",
                              n_cols, k, i, j, gi[o],
                              (double)gv[o], ci[o], (double)cv[o]);
            }
        }
        C->dealloc(cctx, cx), G->dealloc(gctx, gx), G->dealloc(gctx, gid);
        G->dealloc(gctx, gvd), G->dealloc(gctx, gbd);
        free(x), free(ci), free(gi), free(cb), free(gb), free(cv), free(gv);
    }
}
END_TEST

/* ---- weights: embed and matmul per type ---- */

static const int TYPES[] = {TPI_TYPE_F32,  TPI_TYPE_F16,  TPI_TYPE_BF16, TPI_TYPE_Q8_0,
                            TPI_TYPE_Q4_0, TPI_TYPE_Q4_1, TPI_TYPE_Q5_0, TPI_TYPE_Q5_1,
                            TPI_TYPE_Q4_K, TPI_TYPE_Q5_K, TPI_TYPE_Q6_K, TPI_TYPE_Q3_K,
                            TPI_TYPE_Q2_K, TPI_TYPE_IQ4_NL, TPI_TYPE_IQ4_XS};
#define N_TYPES ((int)(sizeof TYPES / sizeof TYPES[0]))

/* Under TPI_HOLD=1 the device holds Q3_K as Q6_K and IQ4_NL as Q8_0 (the same values) and
 * IQ4_XS as Q8_0 with f16 sub-block scales (ops_cuda.cu's upload_converted; else each as
 * it is): IQ4_XS's values there are the CPU's changed by up to 2^-11 of themselves. So an embedded
 * value may differ by 2^-11 of itself, and a matrix-vector output by ~2^-11/sqrt(3) of
 * the outputs' rms (2.8e-4; 4e-3 is ~14 sigma). The nmse of a few outputs can be far above
 * the ~8e-8 of many (one output that cancels to near 0: H100, ne1 1, 3.1e-6), so its bound
 * is 1e-4, the int8-x path's; both stay far below what a wrong block layout gives (~1). */
static double conv_rtol(int type) {
    return quant_gpu_held_type(type) == type || quant_held_is_exact(type) ? 0.0 : 0x1p-11;
}

/* Random (ne1 x ne0) weight of `type` (normal values, a few rows scaled up so block
 * scales differ), uploaded to both backends. Returns the host bytes (caller frees). */
static void *make_weight(struct tu_rng *r, int type, int64_t ne0, int64_t ne1,
                         struct tpi_weight *cw, struct tpi_weight *gw) {
    const struct quant_traits *tr = quant_traits(type);
    ck_assert_ptr_nonnull(tr);
    const size_t n = (size_t)(ne0 * ne1);
    float *f = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        f[i] = tu_normal(r) * (i % 7 == 0 ? 2.0f : 0.5f);
    size_t row_bytes = quant_row_size(type, ne0);
    ck_assert_uint_gt(row_bytes, 0);
    void *q = malloc(row_bytes * (size_t)ne1);
    tr->from_f32(f, q, (int64_t)n);
    free(f);
    struct tpi_error err;
    tpi_err_clear(&err);
    int st = C->weight_upload(cctx, cw, type, ne0, ne1, q, &err);
    ck_assert_msg(st == TPI_OK, "cpu weight_upload: %s", err.msg);
    st = G->weight_upload(gctx, gw, type, ne0, ne1, q, &err);
    ck_assert_msg(st == TPI_OK, "cuda weight_upload: %s", err.msg);
    return q;
}

START_TEST(test_embed) {
    struct tu_rng r;
    tu_rng_seed(&r, 5);
    const int32_t ids[] = {0, 49, 3, 3, 17, 48};
    const int n_tok = 6;
    /* three widths: 768 (whole 256-value groups) is one Q8_0 and Q4_0 are regrouped for
     * on the device (weight_upload; kern_common.cuh), 4096 (whole 2048) one Q6_K and Q3_K
     * are too, three blocks one no type is */
    for (int k = 0; k < 3 * N_TYPES; k++) {
        const int type = TYPES[k / 3];
        const int blk = quant_traits(type)->blck_size;
        const int64_t ne0 = k % 3 == 1 ? 768 : k % 3 == 2 ? 4096 : blk == 1 ? 97 : blk * 3;
        const int64_t ne1 = 50;
        struct tpi_weight cw, gw;
        void *q = make_weight(&r, type, ne0, ne1, &cw, &gw);
        int32_t *gids = bdup(G, gctx, ids, sizeof ids);
        const size_t n = (size_t)(n_tok * ne0);
        float *cy = C->alloc(cctx, n * 4), *gy = G->alloc(gctx, n * 4);
        float *want = malloc(n * 4), *got = malloc(n * 4);
        C->embed(cctx, &cw, ids, n_tok, cy);
        G->embed(gctx, &gw, gids, n_tok, gy);
        bget(C, cctx, want, cy, n * 4);
        bget(G, gctx, got, gy, n * 4);
        char label[64];
        snprintf(label, sizeof label, "embed %s ne0 %lld", quant_type_name(type), (long long)ne0);
        expect_close(label, got, want, n, 1e-6, 1e-6 + conv_rtol(type), -1);
        assert_ok(G, gctx, label);
        C->weight_free(cctx, &cw), G->weight_free(gctx, &gw);
        C->dealloc(cctx, cy), G->dealloc(gctx, gy), G->dealloc(gctx, gids);
        free(q), free(want), free(got);
    }
}
END_TEST

/* Types the v3 matrix-vector path runs with x quantized to int8 (kern_gemv.cu). */
static bool v3_quantizes_x(int type) {
    return type == TPI_TYPE_Q8_0 || type == TPI_TYPE_Q4_0 || type == TPI_TYPE_Q5_0 ||
           type == TPI_TYPE_Q4_1 || type == TPI_TYPE_Q5_1 || type == TPI_TYPE_Q4_K ||
           type == TPI_TYPE_Q5_K || type == TPI_TYPE_Q6_K || type == TPI_TYPE_Q3_K ||
           type == TPI_TYPE_Q2_K || type == TPI_TYPE_IQ4_NL || type == TPI_TYPE_IQ4_XS;
}

/* The v3 path against the f32 reference: x rounded to int8 per 32-value block (step
 * d = amax/127) moves each x value by at most d/2 (plus a float rounding), so output
 * i may differ by at most sum_j |w_ij| d_j / 2 — a rigorous per-output bound that a
 * wrong decode breaks — plus the exact path's atol. NMSE on large outputs: < 1e-4,
 * llama.cpp's mmvq level (measured ~1e-5 on these random data). Returns the NMSE. */
static double check_v3(const char *label, const float *got, const float *want, const float *wd,
                       const float *x, int64_t ne0, int64_t ne1, int64_t nr, double atol) {
    const size_t ny = (size_t)(nr * ne1);
    const int64_t nb = ne0 / 32;
    /* per x block: its step / 2; per weight row and block: sum |w| */
    double *half_step = malloc((size_t)(nr * nb) * sizeof(double));
    double *wsum = malloc((size_t)(ne1 * nb) * sizeof(double));
    for (int64_t k = 0; k < nr * nb; k++) {
        double amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fmax(amax, fabs(x[k * 32 + j]));
        half_step[k] = amax / 127.0 * (0.5 + 1e-3);
    }
    for (int64_t k = 0; k < ne1 * nb; k++) {
        double sum = 0;
        for (int j = 0; j < 32; j++)
            sum += fabs(wd[k * 32 + j]);
        wsum[k] = sum;
    }
    size_t bad = 0;
    for (int64_t r = 0; r < nr; r++)
        for (int64_t i = 0; i < ne1; i++) {
            double bound = 0;
            for (int64_t b = 0; b < nb; b++)
                bound += wsum[i * nb + b] * half_step[r * nb + b];
            const size_t k = (size_t)(r * ne1 + i);
            const double err = fabs((double)got[k] - want[k]);
            if (!(err <= bound + atol)) {
                if (bad < 5)
                    fprintf(stderr, "%s: [%zu] got %.9g want %.9g (|err| %.3g > bound %.3g)\n",
                            label, k, got[k], want[k], err, bound + atol);
                bad++;
            }
        }
    free(half_step), free(wsum);
    const double e = tu_nmse(got, want, ny);
    fprintf(stderr, "%s: nmse=%.3g (v3, int8 x; bound 1e-4 from 256 outputs)\n", label, e);
    ck_assert_msg(bad == 0, "%s: %zu outputs outside the int8-x bound", label, bad);
    if (ny >= 256) ck_assert_msg(e < 1e-4, "%s: nmse %.3g >= 1e-4", label, e);
    return e;
}

START_TEST(test_matmul) { /* _i: index into TYPES */
    const int type = TYPES[_i];
    struct tu_rng r;
    tu_rng_seed(&r, 100 + (uint64_t)_i);
    const int blk = quant_traits(type)->blck_size;
    /* the 4th ne0 gives the staged matrix-vector kernel many stages per row (split over
     * several warps for small ne1, one warp for ne1 4500); 97 and 1 take its fallback */
    int64_t ne0s[4];
    if (blk == 1)
        ne0s[0] = 1, ne0s[1] = 97, ne0s[2] = 1000, ne0s[3] = 2048;
    else
        ne0s[0] = blk, ne0s[1] = 3 * blk, ne0s[2] = blk == 32 ? 1056 : 2304,
        ne0s[3] = blk == 32 ? 4096 : 8192;
    const int64_t ne1s[] = {1, 37, 301, 4500};
    const int64_t nrows[] = {1, 2, 3, 5, 8, 9, 17, 37, 64};
    double worst_mv = 0, worst_v3 = 0, worst_gemm = 0;
    /* both decode paths on the same context: v2 (f32 x) and v3 (int8 x for the types in
     * v3_quantizes_x, f32 x otherwise); the env default is restored at the end */
    const int path0 = ops_cuda_set_gemv(gctx, 2);
    const int mmq0 = ops_cuda_set_mmq(gctx, 64); /* the env's limit (TPI_MMQ), restored below */
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++) {
            const int64_t ne0 = ne0s[a], ne1 = ne1s[b];
            if (b == 3 && a < 2) continue; /* the wide case only with long rows */
            struct tpi_weight cw, gw;
            void *q = make_weight(&r, type, ne0, ne1, &cw, &gw);
            /* Q8_0 and Q4_0 rows of whole 256-value groups and Q6_K and Q3_K rows of whole
             * 2048 take the device's regrouped layouts (unless TPI_Q8_REPACK=0,
             * TPI_Q4_REPACK=0, TPI_Q6_REPACK=0 / TPI_Q3_REPACK=0), the others GGUF's: both
             * run here (Q6_K, Q3_K: ne0 8192) */
            const char *rp = getenv("TPI_Q8_REPACK"), *rp6 = getenv("TPI_Q6_REPACK");
            const char *rp4 = getenv("TPI_Q4_REPACK"), *rp3 = getenv("TPI_Q3_REPACK");
            if (type == TPI_TYPE_Q8_0 && !(rp && strcmp(rp, "0") == 0))
                ck_assert_int_eq(gw.layout != 0, ne0 % 256 == 0);
            if (type == TPI_TYPE_Q4_0 && !(rp4 && strcmp(rp4, "0") == 0))
                ck_assert_int_eq(gw.layout != 0, ne0 % 256 == 0);
            if (type == TPI_TYPE_Q6_K && !(rp6 && strcmp(rp6, "0") == 0))
                ck_assert_int_eq(gw.layout != 0, ne0 % 2048 == 0);
            if (type == TPI_TYPE_Q3_K && !(rp3 && strcmp(rp3, "0") == 0) &&
                quant_gpu_held_type(type) == type)
                ck_assert_int_eq(gw.layout != 0, ne0 % 2048 == 0);
            float *wd = NULL; /* dequantized on the host, for the v3 bound */
            if (v3_quantizes_x(type)) {
                wd = malloc((size_t)(ne0 * ne1) * sizeof(float));
                quant_traits(type)->to_f32(q, wd, ne0 * ne1);
            }
            for (int c = 0; c < 9; c++) {
                const int64_t nr = nrows[c];
                const size_t nx = (size_t)(nr * ne0), ny = (size_t)(nr * ne1);
                float *x = rand_vec(&r, nx, -1, 1);
                float *cx = bdup(C, cctx, x, nx * 4), *gx = bdup(G, gctx, x, nx * 4);
                float *cy = C->alloc(cctx, ny * 4), *gy = G->alloc(gctx, ny * 4);
                float *want = malloc(ny * 4), *got = malloc(ny * 4);
                C->matmul(cctx, &cw, cx, cy, nr);
                bget(C, cctx, want, cy, ny * 4);
                const bool gemm = nr > 8, exact = !gemm || type == TPI_TYPE_F32;
                const double scale = rms(want, ny) + 1e-30;
                /* decode rows: path 2 and 3 are the matrix-vector paths v2 and v3; more
                 * rows of a block type: 2 the fused kernel (kern_mmq), 3 cuBLAS */
                for (int path = 2; path <= (gemm && blk == 1 ? 2 : 3); path++) {
                    if (gemm)
                        ops_cuda_set_mmq(gctx, path == 2 ? 64 : 0);
                    else
                        ops_cuda_set_gemv(gctx, path);
                    G->matmul(gctx, &gw, gx, gy, nr);
                    bget(G, gctx, got, gy, ny * 4);
                    char label[112];
                    snprintf(label, sizeof label, "matmul %s ne0 %lld ne1 %lld rows %lld%s",
                             quant_type_name(type), (long long)ne0, (long long)ne1, (long long)nr,
                             gemm ? (blk == 1 ? "" : path == 2 ? " mmq" : " cublas")
                             : path == 3 ? " v3"
                                         : " v2");
                    if (path == 3 && v3_quantizes_x(type)) {
                        const double e = check_v3(label, got, want, wd, x, ne0, ne1, nr,
                                                  (conv_rtol(type) > 0 ? 4e-3 : 1e-4) * scale);
                        worst_v3 = e > worst_v3 ? e : worst_v3;
                    } else {
                        const double e = tu_nmse(got, want, ny);
                        if (gemm)
                            worst_gemm = e > worst_gemm ? e : worst_gemm;
                        else
                            worst_mv = e > worst_mv ? e : worst_mv;
                        /* more rows: x and W rounded to bf16 (two roundings of up to
                         * 2^-9 each), so an output of one or a few products is off by up
                         * to ~0.4 % of itself (ne0 1, rows 64: 0.31 % at 9.6x the rms):
                         * 1 % of each value on top of 3 % of the rms */
                        const bool conv = conv_rtol(type) > 0; /* IQ4_XS: above */
                        expect_close(label, got, want, ny,
                                     (exact ? (conv ? 4e-3 : 1e-4) : 3e-2) * scale,
                                     exact ? 0 : 1e-2, exact ? (conv ? 1e-4 : 1e-9) : 5e-5);
                    }
                    assert_ok(G, gctx, label);
                }
                C->dealloc(cctx, cx), C->dealloc(cctx, cy), G->dealloc(gctx, gx),
                    G->dealloc(gctx, gy);
                free(x), free(want), free(got);
            }
            C->weight_free(cctx, &cw), G->weight_free(gctx, &gw);
            free(q), free(wd);
        }
    ops_cuda_set_gemv(gctx, path0);
    ops_cuda_set_mmq(gctx, mmq0);
    fprintf(stderr, "matmul %s: worst nmse matvec %.3g (v2, and v3 with f32 x), v3 int8 x %.3g, "
            "gemm %.3g\n",
            quant_type_name(type), worst_mv, worst_v3, worst_gemm);
}
END_TEST

/* ---- attention ----
 *
 * Every batch runs on both CUDA paths against one CPU result: the tensor-core kernels
 * (kern_attn_mma.cu; "mma": prefill shape for >= 16 tokens, decode shape below) and the
 * CUDA-core kernels (kern_attn.cu; "cores"), which still serve other head dims.
 *
 * Error bound of the mma path. Q (times scale * log2 e) and P are rounded to f16 there,
 * K and V are f16 in the cache on both paths (the history is pre-rounded on both
 * sides; only the batch's own k/v are rounded by the CUDA store). One rounding moves a
 * value by a relative e with |e| <= u = 2^-11, E[e^2] ~ u^2/3 = 7.9e-8. For q, k, v
 * ~ N(0,1) and scale 1/sqrt(hd), a score moves by ds with E[ds^2] = sigma_s^2 u^2/3
 * (sigma_s: the score's spread, 1 here, q_gain with q ~ N(0, q_gain^2)); output
 * o = sum_i w_i v_i then moves by sum_i w_i (ds_i - mean ds) v_i, whose mean square
 * relative to E[o^2] = sum w_i^2 is ~ E[ds^2]. P's rounding gives sum_i w_i e_i v_i: the
 * same ~u^2/3. So q, k (batch keys), p and v (batch values) each add ~8e-8 x sigma_s^2
 * (q, k) or ~8e-8 (p, v): expected NMSE <= ~3e-7 at sigma_s = 1, up to ~3e-6 at q_gain 4
 * (the peaky case below; less in fact: a dominant key's own ds cancels against the
 * mean), against the bound 1e-5 that the CUDA-core path has always had (its own
 * expected NMSE, from k/v rounding only, is ~1e-7). Measured on the H200: worst mma
 * NMSE 2.5e-7 (prefill), 7.4e-8 (decode); cores 8e-8 and 4.2e-8. f16 subnormal P (weights
 * below 2^-14 of the running row maximum) lose at most 2^-25 each: < 3e-4 of the row's
 * weight over 8192 keys in the worst case, nothing on random data. The elementwise
 * bound (atol 5e-3, rtol 2e-2) is the one the CUDA-core path had, with the same margin.
 */

/* kern_attn_mma.cu (C linkage; this test is built with CUDA only). */
int kern_attn_blocks(const int32_t *seq, int n_tokens, int per_block, int *t, int32_t *blk,
                     int cap);
int kern_attn_dec_plan(const int *fit, int cmax, int ncl_max, long base, int n_split,
                       long max_pos, int tk, long blk_pieces, int nw, int *n_cl);

/* kern_layer.cu (C linkage): the layer tail's split of a phase's rows among its blocks. */
int kern_layer_rows(int n_seg, const int *rows, const long long *seg_bytes, int unit, int b,
                    int G, int *r0, int *r1);

/* kern_mmq.cu (C linkage): the raw kernels' staging order and the producers' stores. */
long long kern_mmq_order(int form, long long k, int s, int q, int j);

#define ATTN_MAX_SLOTS 8

/* One attention batch: the cache shape, the history already in each slot (positions
 * 0..depth[s]-1) and the tokens (slot, position) of the batch. */
struct attn_batch {
    const char *name;
    int n_head, n_kv, hd;
    int n_slot, n_ctx;
    int depth[ATTN_MAX_SLOTS];
    int n_tokens;
    const int32_t *seq, *pos;
    float q_gain; /* q ~ N(0, q_gain^2); 0 means 1 */
};

/* The batch on the CPU, then on CUDA with each path (mma, then CUDA cores), each
 * against the CPU result with the bounds above. */
static void run_attn_batch(const struct attn_batch *ab, struct tu_rng *r) {
    const int n_layer = 2, layer = 1; /* the second layer, so the layer offset is used */
    struct ops_kv ckv, gkv;
    struct tpi_error err;
    tpi_err_clear(&err);
    ck_assert_int_le(ab->n_slot, ATTN_MAX_SLOTS);
    ck_assert_int_eq(C->kv_init(cctx, &ckv, n_layer, ab->n_slot, ab->n_ctx, ab->n_kv, ab->hd, &err),
                     TPI_OK);
    ck_assert_msg(G->kv_init(gctx, &gkv, n_layer, ab->n_slot, ab->n_ctx, ab->n_kv, ab->hd, &err) ==
                      TPI_OK,
                  "cuda kv_init: %s", err.msg);
    ck_assert_int_eq(gkv.type, TPI_TYPE_F16);
    const size_t row = (size_t)ab->n_kv * ab->hd;
    const size_t n_cache = (size_t)n_layer * ab->n_slot * ab->n_ctx * row;

    /* history: identical f16-representable values in both caches */
    float *hk = calloc(n_cache, 4), *hv = calloc(n_cache, 4);
    uint16_t *hk16 = calloc(n_cache, 2), *hv16 = calloc(n_cache, 2);
    ck_assert(hk && hv && hk16 && hv16);
    for (int s = 0; s < ab->n_slot; s++)
        for (int p = 0; p < ab->depth[s]; p++)
            for (size_t i = 0; i < row; i++) {
                const size_t at = (((size_t)layer * ab->n_slot + s) * ab->n_ctx + p) * row + i;
                hk16[at] = tpi_f32_to_f16(tu_normal(r));
                hv16[at] = tpi_f32_to_f16(tu_normal(r));
                hk[at] = tpi_f16_to_f32(hk16[at]);
                hv[at] = tpi_f16_to_f32(hv16[at]);
            }
    C->to_dev(cctx, ckv.k, hk, n_cache * 4);
    C->to_dev(cctx, ckv.v, hv, n_cache * 4);
    G->to_dev(gctx, gkv.k, hk16, n_cache * 2);
    G->to_dev(gctx, gkv.v, hv16, n_cache * 2);
    G->sync(gctx);

    const int n_tokens = ab->n_tokens;
    int max_pos = 0;
    for (int t = 0; t < n_tokens; t++)
        if (ab->pos[t] + 1 > max_pos) max_pos = ab->pos[t] + 1;
    const size_t nq = (size_t)n_tokens * ab->n_head * ab->hd, nkv = (size_t)n_tokens * row;
    const float q_gain = ab->q_gain > 0 ? ab->q_gain : 1.0f;
    float *q = malloc(nq * 4), *k = malloc(nkv * 4), *v = malloc(nkv * 4);
    for (size_t i = 0; i < nq; i++)
        q[i] = q_gain * tu_normal(r);
    for (size_t i = 0; i < nkv; i++)
        k[i] = tu_normal(r), v[i] = tu_normal(r);

    float *cq = bdup(C, cctx, q, nq * 4), *ck = bdup(C, cctx, k, nkv * 4),
          *cv = bdup(C, cctx, v, nkv * 4);
    float *gq = bdup(G, gctx, q, nq * 4), *gk = bdup(G, gctx, k, nkv * 4),
          *gv = bdup(G, gctx, v, nkv * 4);
    int32_t *gpos = bdup(G, gctx, ab->pos, (size_t)n_tokens * 4),
            *gseq = bdup(G, gctx, ab->seq, (size_t)n_tokens * 4);
    float *co = C->alloc(cctx, nq * 4), *go = G->alloc(gctx, nq * 4);
    struct ops_batch cb = {n_tokens, ab->pos, ab->seq, ab->pos, ab->seq, max_pos};
    struct ops_batch gb = {n_tokens, gpos, gseq, ab->pos, ab->seq, max_pos};
    const float scale = 1.0f / sqrtf((float)ab->hd);
    C->attention(cctx, &ckv, layer, cq, ck, cv, co, &cb, ab->n_head, scale);
    float *want = malloc(nq * 4), *got = malloc(nq * 4);
    bget(C, cctx, want, co, nq * 4);
    assert_ok(C, cctx, ab->name);

    const int mode0 = ops_cuda_set_attn_mma(3);
    for (int path = 0; path < 2; path++) {
        ops_cuda_set_attn_mma(path == 0 ? 3 : 0);
        /* NaN everywhere first: an output the kernels forget to write fails the test */
        uint32_t *nan = malloc(nq * 4);
        for (size_t i = 0; i < nq; i++)
            nan[i] = 0x7fc00000u;
        G->to_dev(gctx, go, nan, nq * 4);
        G->sync(gctx);
        free(nan);
        G->attention(gctx, &gkv, layer, gq, gk, gv, go, &gb, ab->n_head, scale);
        bget(G, gctx, got, go, nq * 4);
        assert_ok(G, gctx, ab->name);
        char label[200];
        snprintf(label, sizeof label,
                 "attention %s [%s] (heads %d/%d, hd %d, %d tokens, max_pos %d%s)", ab->name,
                 path == 0 ? "mma" : "cores", ab->n_head, ab->n_kv, ab->hd, n_tokens, max_pos,
                 q_gain != 1.0f ? ", peaky" : "");
        expect_close(label, got, want, nq, 5e-3, 2e-2, 1e-5);
    }
    ops_cuda_set_attn_mma(mode0);

    C->kv_free(cctx, &ckv), G->kv_free(gctx, &gkv);
    C->dealloc(cctx, cq), C->dealloc(cctx, ck), C->dealloc(cctx, cv), C->dealloc(cctx, co);
    G->dealloc(gctx, gq), G->dealloc(gctx, gk), G->dealloc(gctx, gv), G->dealloc(gctx, go);
    G->dealloc(gctx, gpos), G->dealloc(gctx, gseq);
    free(hk), free(hv), free(hk16), free(hv16), free(q), free(k), free(v);
    free(want), free(got);
    assert_ok(G, gctx, "attention cleanup");
}

/* A batch built from runs: run i is n[i] tokens of slot slot[i] at positions
 * depth[slot] + off[i] + 0, 1, ... (shuffled when shuffle[i]). */
struct attn_runs {
    const char *name;
    int n_head, n_kv, hd, n_slot, n_ctx;
    int depth[ATTN_MAX_SLOTS];
    int n_runs;
    int slot[8], n[8], off[8], shuffle[8];
    float q_gain;
};

static void run_attn_runs(const struct attn_runs *ar, struct tu_rng *r) {
    int n_tokens = 0;
    for (int i = 0; i < ar->n_runs; i++)
        n_tokens += ar->n[i];
    int32_t *seq = malloc((size_t)n_tokens * 4), *pos = malloc((size_t)n_tokens * 4);
    int t = 0;
    for (int i = 0; i < ar->n_runs; i++) {
        const int t0 = t;
        for (int j = 0; j < ar->n[i]; j++, t++) {
            seq[t] = ar->slot[i];
            pos[t] = ar->depth[ar->slot[i]] + ar->off[i] + j;
        }
        if (ar->shuffle[i])
            for (int j = ar->n[i] - 1; j > 0; j--) { /* Fisher-Yates */
                const int o = (int)tu_uniform(r, 0, (float)j + 1 - 1e-3f);
                const int32_t x = pos[t0 + j];
                pos[t0 + j] = pos[t0 + o], pos[t0 + o] = x;
            }
    }
    struct attn_batch ab = {ar->name, ar->n_head, ar->n_kv, ar->hd, ar->n_slot, ar->n_ctx,
                            {0},      n_tokens,   seq,      pos,    ar->q_gain};
    memcpy(ab.depth, ar->depth, sizeof ab.depth);
    run_attn_batch(&ab, r);
    free(seq), free(pos);
}

struct attn_case {
    const char *name;
    int n_head, n_kv, hd;
    int n_slot, n_ctx;
    int depth[3]; /* history already in each slot (positions 0..depth-1) */
    int n_new[3]; /* new tokens per slot, at positions depth.. */
};

/* The slots' new tokens interleaved round-robin (runs of one token when slots mix). */
static void run_attn(const struct attn_case *ac, struct tu_rng *r) {
    int n_tokens = 0;
    for (int s = 0; s < ac->n_slot; s++)
        n_tokens += ac->n_new[s];
    int32_t *pos = malloc((size_t)n_tokens * 4), *seq = malloc((size_t)n_tokens * 4);
    int next[3] = {0, 0, 0}, t = 0;
    while (t < n_tokens)
        for (int s = 0; s < ac->n_slot && t < n_tokens; s++)
            if (next[s] < ac->n_new[s]) {
                seq[t] = s;
                pos[t] = ac->depth[s] + next[s]++;
                t++;
            }
    struct attn_batch ab = {ac->name, ac->n_head, ac->n_kv, ac->hd, ac->n_slot, ac->n_ctx,
                            {0},      n_tokens,   seq,      pos,    0.0f};
    for (int s = 0; s < ac->n_slot; s++)
        ab.depth[s] = ac->depth[s];
    run_attn_batch(&ab, r);
    free(pos), free(seq);
}

/* Host check of the mma path's block list (kern_attn_blocks) on random slot patterns:
 * blocks cover the tokens in order, each holds 1..per_block tokens of one slot, a block
 * ends only at a slot change, at per_block tokens or at the end, and a capacity-limited
 * walk gives the same list. */
static void check_attn_blocks(struct tu_rng *r) {
    enum { N = 300 };
    int32_t seq[N], blk[N], blk2[N];
    for (int trial = 0; trial < 200; trial++) {
        const int n = 1 + (int)tu_uniform(r, 0, N - 1e-3f);
        const int per = trial % 3 == 0 ? 64 : trial % 3 == 1 ? 16 : 1 + trial % 7;
        int cur = 0;
        for (int i = 0; i < n; i++) { /* runs of random length, slots may repeat */
            if (tu_uniform(r, 0, 1) < 0.1f) cur = (int)tu_uniform(r, 0, 5 - 1e-3f);
            seq[i] = cur;
        }
        int t = 0;
        const int nb = kern_attn_blocks(seq, n, per, &t, blk, N);
        ck_assert_int_eq(t, n);
        int t_cnt = 0;
        ck_assert_int_eq(kern_attn_blocks(seq, n, per, &t_cnt, NULL, 0), nb);
        int next = 0;
        for (int b = 0; b < nb; b++) {
            const int t0 = blk[b] >> 7, nt = (blk[b] & 127) + 1;
            ck_assert_int_eq(t0, next);
            ck_assert(nt >= 1 && nt <= per && t0 + nt <= n);
            for (int i = t0; i < t0 + nt; i++)
                ck_assert_int_eq(seq[i], seq[t0]);
            const int end = t0 + nt;
            ck_assert(end == n || nt == per || seq[end] != seq[t0]);
            next = end;
        }
        ck_assert_int_eq(next, n);
        /* in pieces of at most 3 blocks (the launcher's loop over launches) */
        int t2 = 0, nb2 = 0;
        while (t2 < n) {
            const int got = kern_attn_blocks(seq, n, per, &t2, blk2 + nb2, 3);
            ck_assert(got >= 1 && got <= 3);
            nb2 += got;
        }
        ck_assert_int_eq(nb2, nb);
        ck_assert_int_eq(memcmp(blk, blk2, (size_t)nb * 4), 0);
    }
}

/* Host check of the decode split's cluster plan (kern_attn_dec_plan) against the H200's
 * occupancy tables (TPI_ATTN_DEC_VERBOSE=1, bench/RESULTS.md run 74): the choices that
 * runs 73-77 measured, then invariants on random inputs: the ranges a multiple of the
 * clusters, every cluster resident at once when a plan was found, no more than asked. */
START_TEST(test_attn_plan) {
    /* clusters of c blocks resident at once: one block an SM (hd128 at 5 stages of 4
     * warps, or 8 warps at 3), and two (4 warps at 3 stages) */
    const int one[17] = {0, 0, 66, 39, 30, 22, 17, 15, 15};
    const int two[17] = {0, 0, 132, 79, 62, 47, 39, 32, 30};
    /* Qwen3-8B one token: 8 KV-head blocks of 4 rows (16 pieces); 8 warps: 128-key tiles */
    const struct {
        const char *what;
        const int *fit;
        int cmax, ncl_max;
        long base;
        int n_split;
        long max_pos;
        int tk;
        long blk_pieces;
        int nw, want, want_ncl;
    } cases[] = {
        {"8192: 8 clusters of 2 (4 tiles a block against 8)", one, 8, 8, 8, 16, 8192, 128, 16,
         8, 16, 8},
        {"8192, one cluster allowed", one, 8, 1, 8, 16, 8192, 128, 16, 8, 8, 1},
        {"4096: 4 tiles against 2 is not worth the merge", one, 8, 8, 8, 16, 4096, 128, 16, 8,
         8, 1},
        {"2048", one, 8, 8, 8, 16, 2048, 128, 16, 8, 8, 1},
        {"4 tokens: 64 pieces, more than a 2-block cluster's 16 warps", one, 8, 8, 8, 16, 8192,
         128, 64, 8, 8, 1},
        {"4 warps, 5 stages: 2 clusters of 6 (16 of 8 never fit)", one, 8, 8, 8, 16, 8192, 64,
         16, 4, 12, 2},
        {"4 warps, 2048: 4 tiles against 3", one, 8, 8, 8, 16, 2048, 64, 16, 4, 8, 1},
        {"4 warps, 3 stages (two blocks an SM): 2 clusters of 8", two, 8, 8, 8, 16, 8192, 64, 16,
         4, 16, 2},
        {"8 slots: only clusters of 2 are all resident", one, 8, 8, 64, 3, 8192, 128, 16, 8, 2,
         1},
        {"nothing resident: the wanted ranges", one, 8, 8, 200, 3, 8192, 128, 16, 8, 3, 1},
        {"nothing resident: capped at cmax", one, 8, 8, 200, 12, 8192, 128, 16, 8, 8, 1},
        {"the cluster-size knob at 4", one, 4, 8, 8, 16, 8192, 128, 16, 8, 16, 8},
        {"nothing resident, cmax past the kernel's largest cluster: 8", one, 16, 8, 200, 12,
         8192, 128, 16, 8, 8, 1},
    };
    int ncl = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int got = kern_attn_dec_plan(cases[i].fit, cases[i].cmax, cases[i].ncl_max,
                                           cases[i].base, cases[i].n_split, cases[i].max_pos,
                                           cases[i].tk, cases[i].blk_pieces, cases[i].nw, &ncl);
        ck_assert_msg(got == cases[i].want && ncl == cases[i].want_ncl,
                      "%s: %d ranges as %d clusters, want %d as %d", cases[i].what, got, ncl,
                      cases[i].want, cases[i].want_ncl);
    }

    struct tu_rng r;
    tu_rng_seed(&r, 11);
    for (int trial = 0; trial < 5000; trial++) {
        int fit[17] = {0};
        const int per_sm = 1 + trial % 2;
        for (int c = 2; c <= 16; c++) /* whole clusters of a GPC of 16-18 SMs, 7-8 GPCs */
            fit[c] = (int)tu_uniform(&r, 7, 8.999f) * ((16 + trial % 3) * per_sm / c);
        /* the launcher's cmax is at most the largest cluster the kernel merges (8) */
        const int cmax = 2 + (int)tu_uniform(&r, 0, 6.999f);
        const int ncl_max = 1 + (int)tu_uniform(&r, 0, 7.999f);
        const long base = 1 + (long)tu_uniform(&r, 0, 150);
        const int n_split = 2 + (int)tu_uniform(&r, 0, 30);
        const long max_pos = 1 + (long)tu_uniform(&r, 0, 40000);
        const int nw = trial % 3 ? 8 : 4;
        const long blk_pieces = 4 * (1 + (long)tu_uniform(&r, 0, 15.999f));
        const int n = kern_attn_dec_plan(fit, cmax, ncl_max, base, n_split, max_pos, 16 * nw,
                                         blk_pieces, nw, &ncl);
        ck_assert(ncl >= 1 && ncl <= ncl_max);
        ck_assert(n >= 2 && n % ncl == 0);
        const int cs = n / ncl;
        ck_assert(cs >= 2 && cs <= cmax);
        if (ncl > 1) {
            ck_assert(n <= n_split);
            ck_assert(base * ncl <= fit[cs]); /* every cluster resident at once */
            ck_assert(blk_pieces <= (long)cs * nw);
        } else if (base <= fit[cs]) {
            ck_assert(n <= n_split);
        } else { /* the fallback: nothing fit */
            ck_assert_int_eq(n, n_split < cmax ? n_split : cmax);
        }
    }
}
END_TEST

START_TEST(test_attn_blocks) {
    struct tu_rng r;
    tu_rng_seed(&r, 7);
    check_attn_blocks(&r);
}
END_TEST

START_TEST(test_attn_prefill) {
    struct tu_rng r;
    tu_rng_seed(&r, 7);
    const struct attn_case cases[] = {
        {"prefill 37", 8, 4, 128, 1, 64, {0}, {37}},
        {"prefill 300", 8, 1, 64, 1, 320, {0}, {300}},
        {"prefill mha hd80", 4, 4, 80, 1, 64, {0}, {41}},
        {"prefill gqa12", 24, 2, 64, 1, 64, {0}, {19}},
        {"prefill gqa32 chunks", 32, 1, 128, 1, 64, {0}, {23}},
        {"prefill hd256", 8, 2, 256, 1, 128, {0}, {70}},
        {"chunked prefill, mixed slots", 8, 4, 128, 2, 1100, {1000, 0}, {37, 20}},
        {"chunked prefill 8/1", 8, 1, 128, 3, 2100, {2000, 5, 0}, {9, 33, 1}},
        /* long enough that the tiled kernel puts several tokens in a block (4 and 2) */
        {"prefill 544 gqa4 (4 tokens per block)", 8, 2, 128, 1, 1100, {300}, {544}},
        {"prefill 1056 hd64 8/1 (2 tokens per block)", 8, 1, 64, 1, 1100, {0}, {1056}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_attn(&cases[i], &r);

    /* prefill of 16..512 tokens at offsets 0, 100 and 4000 (chunked prefill at depth),
     * cycling over head dims 64/128 and GQA groups 1, 2, 4, 8 (and 7, 32: packing
     * falls back to 1 head per row group, or two head chunks) */
    const int shapes[][3] = {{8, 8, 64},   {8, 4, 128}, {16, 4, 128}, {32, 4, 64},
                             {32, 8, 128}, {14, 2, 64}, {32, 1, 128}, {16, 8, 64}};
    const int lens[] = {16, 17, 63, 64, 65, 100, 255, 512};
    const int offs[] = {0, 100, 4000};
    int k = 0;
    for (int o = 0; o < 3; o++)
        for (int li = 0; li < 8; li++, k++) {
            const int *sh = shapes[k % 8];
            char name[64];
            snprintf(name, sizeof name, "prefill %d at %d", lens[li], offs[o]);
            const struct attn_runs ar = {
                name, sh[0],      sh[1], sh[2], 1,   offs[o] + lens[li] + 8, {offs[o]}, 1,
                {0},  {lens[li]}, {0},   {0},   0.0f};
            run_attn_runs(&ar, &r);
        }

    /* continuous batching: runs of several lengths and single decode tokens of other
     * slots in one batch; slot 1 appears in two separate runs, slot 0's run has
     * shuffled positions (a block's positions need not be sorted) */
    /* clang-format off */
    const struct attn_runs mixed[] = {
        {"mixed slots 32/8 hd128", 32, 8, 128, 5, 4200, {300, 4000, 0, 50, 2000}, 7,
         {0, 1, 2, 3, 4, 1, 2}, {100, 1, 37, 1, 70, 1, 1}, {0, 0, 0, 0, 0, 1, 37},
         {1, 0, 0, 0, 0, 0, 0}, 0.0f},
        {"mixed slots 8/8 hd64", 8, 8, 64, 4, 3000, {0, 2900, 17, 1000}, 6,
         {2, 1, 0, 3, 1, 0}, {20, 1, 130, 1, 1, 1}, {0, 0, 0, 0, 1, 130},
         {0, 0, 1, 0, 0, 0}, 0.0f},
        {"mixed slots gqa8 hd64", 32, 4, 64, 3, 600, {500, 0, 64}, 4, {1, 0, 2, 1},
         {64, 1, 16, 33}, {0, 0, 0, 64}, {0, 0, 1, 1}, 0.0f},
        /* peaky softmax (score spread ~4): the -inf / rescaling paths under large ranges */
        {"peaky prefill 64 at 500", 16, 4, 128, 1, 600, {500}, 1, {0}, {64}, {0}, {0}, 4.0f},
        {"peaky prefill 200 at 3000 hd64", 8, 2, 64, 1, 3300, {3000}, 1, {0}, {200}, {0}, {0},
         4.0f},
    };
    /* clang-format on */
    for (size_t i = 0; i < sizeof mixed / sizeof mixed[0]; i++)
        run_attn_runs(&mixed[i], &r);
}
END_TEST

START_TEST(test_attn_decode) {
    struct tu_rng r;
    tu_rng_seed(&r, 8);
    const int depths[] = {1, 100, 1000, 4095};
    for (int g = 0; g < 2; g++) {
        const int n_kv = g == 0 ? 4 : 1;
        for (int d = 0; d < 4; d++) {
            struct attn_case ac = {"decode 1 token", 8, n_kv, 128, 1, 4100, {depths[d]}, {1}};
            run_attn(&ac, &r);
        }
        /* a decode batch: three slots at different depths, one token each */
        struct attn_case batch = {"decode batch of 3", 8,        n_kv, 128, 3, 4100,
                                  {4000, 1, 777},      {1, 1, 1}};
        run_attn(&batch, &r);
    }
    struct attn_case small_hd = {"decode hd64 gqa7", 14, 2, 64, 1, 3000, {2999}, {1}};
    run_attn(&small_hd, &r);

    /* one token at depths around the tile edges (64 and 128 keys) and deep (split-K over
     * many ranges): Qwen3-8B's 32/8 hd128, and 16/2 hd64 (group 8) */
    const int deep[] = {0, 1, 63, 64, 65, 127, 128, 129, 4096, 8192};
    for (int i = 0; i < (int)(sizeof deep / sizeof deep[0]); i++)
        for (int s = 0; s < 2; s++) {
            char name[64];
            snprintf(name, sizeof name, "decode at depth %d", deep[i]);
            const struct attn_runs ar = {name,        s ? 16 : 32, s ? 2 : 8, s ? 64 : 128, 1,
                                         deep[i] + 8, {deep[i]},   1,         {0},          {1},
                                         {0},         {0},         0.0f};
            run_attn_runs(&ar, &r);
        }
    /* decode batches: 8 slots at mixed depths (group 1, 2 and 4); 4 draft tokens of one
     * slot plus 3 single tokens; 15 tokens (the largest batch of the decode shape) */
    /* clang-format off */
    const struct attn_runs batches[] = {
        {"decode 8 slots gqa4", 8, 2, 128, 8, 8200, {1, 63, 64, 65, 500, 4096, 8192, 2000}, 8,
         {0, 1, 2, 3, 4, 5, 6, 7}, {1, 1, 1, 1, 1, 1, 1, 1}, {0}, {0}, 0.0f},
        {"decode 8 slots mha hd64", 8, 8, 64, 8, 4200, {4100, 0, 1, 2, 3, 64, 65, 1000}, 8,
         {7, 6, 5, 4, 3, 2, 1, 0}, {1, 1, 1, 1, 1, 1, 1, 1}, {0}, {0}, 0.0f},
        {"decode 8 slots gqa2", 8, 4, 128, 8, 4200, {7, 300, 4100, 9, 64, 1, 3000, 129}, 8,
         {0, 1, 2, 3, 4, 5, 6, 7}, {1, 1, 1, 1, 1, 1, 1, 1}, {0}, {0}, 0.0f},
        {"draft 4 + 3 singles", 32, 8, 128, 4, 4200, {4096, 10, 2000, 64}, 4, {0, 1, 2, 3},
         {4, 1, 1, 1}, {0}, {0, 0, 0, 0}, 0.0f},
        {"decode shape, 15 tokens", 8, 2, 64, 3, 2200, {2000, 100, 5}, 3, {0, 1, 2},
         {7, 5, 3}, {0}, {1, 0, 0}, 0.0f},
    };
    /* clang-format on */
    for (size_t i = 0; i < sizeof batches / sizeof batches[0]; i++)
        run_attn_runs(&batches[i], &r);
}
END_TEST

/* ---- bench (not a ctest test): speeds of the main kernels ---- */

/* Median seconds per call over 7 batches of `reps` calls (after a warm-up call). */
static double time_op(int reps, void (*fn)(void *), void *arg) {
    fn(arg); /* warm-up (also grows scratch buffers) */
    G->sync(gctx);
    double t[7];
    for (int k = 0; k < 7; k++) {
        const double t0 = tpi_time_s();
        for (int i = 0; i < reps; i++)
            fn(arg);
        G->sync(gctx);
        t[k] = (tpi_time_s() - t0) / reps;
    }
    for (int a = 0; a < 7; a++) /* sort: 7 values */
        for (int b = a + 1; b < 7; b++)
            if (t[b] < t[a]) {
                const double x = t[a];
                t[a] = t[b], t[b] = x;
            }
    return t[3];
}

/* Several copies of one weight, used in turn, so that the timed reads are not served
 * by the 50 MB L2. */
/* Whether the comma-separated list holds item exactly. */
static bool list_has(const char *list, const char *item) {
    const size_t n = strlen(item);
    for (const char *p = list; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (strncmp(p, item, n) == 0 && (p[n] == ',' || p[n] == '\0')) return true;
    return false;
}

#define BENCH_MAX_COPIES 64
struct mm_arg {
    struct tpi_weight w[BENCH_MAX_COPIES];
    int n_copies, next;
    float *x, *y;
    int64_t n_rows;
};
static void mm_fn(void *p) {
    struct mm_arg *a = p;
    G->matmul(gctx, &a->w[a->next], a->x, a->y, a->n_rows);
    a->next = (a->next + 1) % a->n_copies;
}

/* Attention calls rotate over the cache's layers (134 MB in all), so that the timed K/V
 * reads come from HBM, not from the 50 MB L2. */
struct at_arg {
    struct ops_kv *kv;
    float *q, *k, *v, *o;
    struct ops_batch *b;
    int n_head, layer;
};
static void at_fn(void *p) {
    struct at_arg *a = p;
    G->attention(gctx, a->kv, a->layer, a->q, a->k, a->v, a->o, a->b, a->n_head, 0.088f);
    a->layer = (a->layer + 1) % a->kv->n_layer;
}
/* One replay of a recorded graph (a decode attention call). */
struct gr_arg {
    void *graph;
};
static void gr_fn(void *p) {
    struct gr_arg *a = p;
    struct tpi_error err;
    bool launched = false;
    ck_assert_int_eq(G->graph_launch(gctx, a->graph, &launched, &err), TPI_OK);
    ck_assert(launched);
}

#define BENCH_ROOF_TBS 4.03 /* read-only streaming on the H200, shared/device/README.md */

START_TEST(test_bench) {
    struct tu_rng r;
    tu_rng_seed(&r, 9);
    /* Qwen3-8B's matrices: ne0 -> ne1 */
    const int64_t shapes[][2] = {{4096, 4096}, {4096, 1024}, {4096, 12288}, {12288, 4096},
                                 {4096, 151936}};
    const int n_shapes = (int)(sizeof shapes / sizeof shapes[0]);
    const int types[] = {TPI_TYPE_Q4_K, TPI_TYPE_Q6_K, TPI_TYPE_Q8_0, TPI_TYPE_Q5_0,
                         TPI_TYPE_Q4_0, TPI_TYPE_BF16, TPI_TYPE_F16};
    const char *only = getenv("TPI_BENCH_TYPES"); /* e.g. "Q4_K,BF16" */
    /* e.g. "4096x12288" and "16,32": only those shapes / row counts (an ncu run's one kernel) */
    const char *only_shapes = getenv("TPI_BENCH_SHAPES"), *only_rows = getenv("TPI_BENCH_ROWS");
    const int path = ops_cuda_set_gemv(gctx, 2); /* the env's path (TPI_GEMV), kept */
    ops_cuda_set_gemv(gctx, path);
    fprintf(stderr, "bench: decode matrix-vector path v%d (TPI_GEMV)\n", path);
    const int64_t max_ne0 = 12288, max_ne1 = 151936, max_rows = 512;
    float *x = rand_vec(&r, (size_t)(max_rows * max_ne0), -1, 1);
    float *gx = bdup(G, gctx, x, (size_t)(max_rows * max_ne0) * 4),
          *gy = G->alloc(gctx, (size_t)(max_rows * max_ne1) * 4);
    ck_assert_ptr_nonnull(gy);
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        const struct quant_traits *tr = quant_traits(types[i]);
        if (only && !strstr(only, tr->name)) continue;
        for (int sh = 0; sh < n_shapes; sh++) {
            const int64_t ne0 = shapes[sh][0], ne1 = shapes[sh][1];
            char shape_name[48];
            snprintf(shape_name, sizeof shape_name, "%lldx%lld", (long long)ne0, (long long)ne1);
            if (only_shapes && !list_has(only_shapes, shape_name)) continue;
            const size_t row_bytes = quant_row_size(types[i], ne0);
            const size_t n_bytes = row_bytes * (size_t)ne1;
            uint8_t *q = malloc(n_bytes);
            float *f = rand_vec(&r, (size_t)ne0, -1, 1);
            tr->from_f32(f, q, ne0); /* one row quantized, repeated: speed does not depend on values */
            for (int64_t j = 1; j < ne1; j++)
                memcpy(q + j * row_bytes, q, row_bytes);
            static struct mm_arg a;
            memset(&a, 0, sizeof a);
            struct tpi_error err;
            ck_assert_int_eq(G->weight_upload(gctx, &a.w[0], types[i], ne0, ne1, q, &err), TPI_OK);
            /* copies up to ~400 MB in all (device copies, padded like weight_upload's) */
            a.n_copies = (int)(400e6 / (double)n_bytes) + 1;
            if (a.n_copies > BENCH_MAX_COPIES) a.n_copies = BENCH_MAX_COPIES;
            for (int c = 1; c < a.n_copies; c++) {
                a.w[c] = a.w[0];
                a.w[c].data = G->alloc(gctx, n_bytes + 256);
                ck_assert_ptr_nonnull(a.w[c].data);
                G->copy(gctx, a.w[c].data, a.w[0].data, n_bytes);
            }
            a.x = gx, a.y = gy;
            const int64_t rows[] = {1, 2, 4, 8, 16, 32, 64, 512};
            for (int k = 0; k < 8; k++) {
                char rows_name[24];
                snprintf(rows_name, sizeof rows_name, "%lld", (long long)rows[k]);
                if (only_rows && !list_has(only_rows, rows_name)) continue;
                a.n_rows = rows[k];
                const double t = time_op(rows[k] > 8 ? 5 : 20, mm_fn, &a);
                const double tbs = (double)n_bytes / t / 1e12;
                fprintf(stderr,
                        "bench matmul %-5s %6lld->%-6lld rows %3lld: %9.1f us  %6.2f TB/s "
                        "(%3.0f%% of %.2f)  %6.1f TFLOP/s\n",
                        tr->name, (long long)ne0, (long long)ne1, (long long)rows[k], t * 1e6,
                        tbs, 100.0 * tbs / BENCH_ROOF_TBS, BENCH_ROOF_TBS,
                        2.0 * (double)ne0 * (double)ne1 * (double)rows[k] / t / 1e12);
            }
            for (int c = 1; c < a.n_copies; c++)
                G->dealloc(gctx, a.w[c].data);
            G->weight_free(gctx, &a.w[0]);
            free(q), free(f);
        }
    }
    G->dealloc(gctx, gx), G->dealloc(gctx, gy);
    free(x);
    assert_ok(G, gctx, "bench matmul");
    /* attention: 32 query heads / 8 KV heads, head_dim 128, on both paths (mma: the
     * tensor-core kernels, cores: the CUDA-core ones), 4 layers of 8192 positions. Decode
     * lines also replay one call per layer from a CUDA graph, as the engine runs decode
     * steps (no host launch cost; the time printed is per call). */
    struct ops_kv kv;
    struct tpi_error err;
    const int n_layer_at = 4;
    ck_assert_int_eq(G->kv_init(gctx, &kv, n_layer_at, 1, 8192, 8, 128, &err), TPI_OK);
    const int n_max = 512;
    float *h = rand_vec(&r, (size_t)n_max * 32 * 128, -1, 1);
    float *gq = bdup(G, gctx, h, (size_t)n_max * 32 * 128 * 4),
          *go = G->alloc(gctx, (size_t)n_max * 32 * 128 * 4);
    int32_t pos[512], seq[512];
    const int mode0 = ops_cuda_set_attn_mma(3);
    fprintf(stderr, "bench: attention mma mode %d (TPI_ATTN_MMA; bit 0 prefill, bit 1 decode)\n",
            mode0);
    /* {tokens, depth}: the last token sits at position depth - 1 */
    const int lines[][2] = {{512, 512}, {512, 4096}, {512, 8000}, {64, 8000}, {16, 8000}, {1, 64},
                            {1, 512},   {1, 2048},   {1, 4096},   {1, 8192},  {4, 8192}};
    /* TPI_BENCH_ATTN: "prefill" or "decode" keeps those lines only; TPI_BENCH_ATTN_DEPTH:
     * that depth only; TPI_BENCH_ATTN_REPS: calls per timed batch (1 under a profiler) */
    const char *only_at = getenv("TPI_BENCH_ATTN"), *reps_at = getenv("TPI_BENCH_ATTN_REPS");
    const char *depth_at = getenv("TPI_BENCH_ATTN_DEPTH");
    const int reps_fix = reps_at ? atoi(reps_at) : 0;
    for (size_t li = 0; li < sizeof lines / sizeof lines[0]; li++)
        for (int path = 0; path < 2; path++) {
            ops_cuda_set_attn_mma(path == 0 ? 3 : 0);
            const int n_tok = lines[li][0], depth = lines[li][1], p0 = depth - n_tok;
            if (only_at && strcmp(only_at, n_tok > 8 ? "prefill" : "decode") != 0) continue;
            if (depth_at && atoi(depth_at) != depth) continue;
            for (int t = 0; t < n_tok; t++)
                pos[t] = p0 + t, seq[t] = 0;
            int32_t *gpos = bdup(G, gctx, pos, (size_t)n_tok * 4),
                    *gseq = bdup(G, gctx, seq, (size_t)n_tok * 4);
            struct ops_batch b = {n_tok, gpos, gseq, pos, seq, depth};
            struct at_arg aa = {&kv, gq, gq, gq, go, &b, 32, 0};
            /* causal QK^T and PV: 2 x 2 x hd flops per (query head, visible key) */
            double vis = 0;
            for (int tt = 0; tt < n_tok; tt++)
                vis += p0 + tt + 1;
            const double kv_bytes = (double)depth * 8 * 128 * 2 * 2;
            for (int graph = 0; graph < (n_tok <= 8 && G->graph_begin ? 2 : 1); graph++) {
                double t;
                if (!graph) {
                    t = time_op(reps_fix > 0 ? reps_fix : n_tok > 64 ? 3 : 20, at_fn, &aa);
                } else {
                    /* one graph holds a call per layer (as a decode step does) */
                    struct gr_arg ga = {NULL};
                    at_fn(&aa); /* scratch grown before recording */
                    ck_assert_int_eq(G->graph_begin(gctx, &err), TPI_OK);
                    for (int l = 0; l < n_layer_at; l++)
                        at_fn(&aa);
                    ck_assert_int_eq(G->graph_end(gctx, &ga.graph, &err), TPI_OK);
                    ck_assert_ptr_nonnull(ga.graph);
                    t = time_op(reps_fix > 0 ? reps_fix : 20, gr_fn, &ga) / n_layer_at;
                    G->graph_free(gctx, ga.graph);
                }
                fprintf(stderr,
                        "bench attention 32/8 hd128 %s %3d tokens at depth %4d [%-5s%s]: %9.1f us  "
                        "KV read %6.2f TB/s (%3.0f%%)  %6.1f TFLOP/s\n",
                        n_tok > 8 ? "prefill" : "decode ", n_tok, depth,
                        path == 0 ? "mma" : "cores", graph ? " graph" : "", t * 1e6,
                        kv_bytes / t / 1e12, 100.0 * kv_bytes / t / 1e12 / BENCH_ROOF_TBS,
                        vis * 32 * 4 * 128 / t / 1e12);
            }
            G->dealloc(gctx, gpos), G->dealloc(gctx, gseq);
        }
    ops_cuda_set_attn_mma(mode0);
    G->kv_free(gctx, &kv);
    G->dealloc(gctx, gq), G->dealloc(gctx, go);
    free(h);
    assert_ok(G, gctx, "bench");
}
END_TEST

/* The layer tail's row split (kern_layer_rows) on Qwen3-8B's phases (wo; gate/up pairs;
 * down in Q4_K and Q6_K; Q/K/V with V in Q6_K), odd shapes and random ones, for 1, 7 and
 * 132 blocks: each weight's rows are cut into contiguous ranges, block after block, that
 * cover every row once, and no block's bytes exceed its share by more than one row; split
 * in 32-row units (a phase whose blocks quantize their own outputs), the ranges start on
 * whole units and exceed the share by at most one unit. */
START_TEST(test_layer_rows) {
    struct {
        int n;
        int rows[3];
        long long rb[3];
    } cases[16] = {
        {1, {4096}, {2304}},                     /* wo, Q4_K 4096 */
        {1, {12288}, {4608}},                    /* gate/up pairs */
        {1, {4096}, {6912}},                     /* down, Q4_K 12288 */
        {1, {4096}, {10080}},                    /* down, Q6_K 12288 */
        {3, {4096, 1024, 1024}, {2304, 2304, 3360}}, /* Q, K, V (Q6_K) */
        {3, {5, 0, 3}, {144, 144, 1680}},        /* fewer rows than blocks, an empty one */
        {2, {1, 1}, {16, 1 << 20}},
    };
    int n_cases = 7;
    struct tu_rng r;
    tu_rng_seed(&r, 4242);
    for (; n_cases < 16; n_cases++) {
        cases[n_cases].n = 1 + (int)tu_uniform(&r, 0.0f, 2.999f);
        for (int s = 0; s < cases[n_cases].n; s++) {
            cases[n_cases].rows[s] = (int)tu_uniform(&r, 0.0f, 3000.0f);
            cases[n_cases].rb[s] = 16 * (1 + (long long)tu_uniform(&r, 0.0f, 700.0f));
        }
    }
    const int grids[] = {1, 7, 132};
    for (int c = 0; c < n_cases; c++)
        for (int unit = 0; unit < 2; unit++) {
            if (unit && (cases[c].n != 1 || cases[c].rows[0] % 32)) continue;
            const int U = unit ? 32 : 1; /* whole units of 32 rows: one writer a q8 block */
            for (size_t gi = 0; gi < sizeof grids / sizeof grids[0]; gi++) {
                const int G = grids[gi], n = cases[c].n;
                long long total = 0, max_rb = 0;
                for (int s = 0; s < n; s++) {
                    total += cases[c].rows[s] * cases[c].rb[s];
                    if (cases[c].rb[s] > max_rb) max_rb = cases[c].rb[s];
                }
                int next[3] = {0, 0, 0};
                for (int b = 0; b < G; b++) {
                    int r0[3], r1[3];
                    ck_assert_int_eq(
                        kern_layer_rows(n, cases[c].rows, cases[c].rb, unit, b, G, r0, r1), 0);
                    long long bytes = 0;
                    for (int s = 0; s < n; s++) {
                        ck_assert_msg(r0[s] == next[s] && r1[s] >= r0[s] && r0[s] % U == 0 &&
                                          (r1[s] % U == 0 || r1[s] == cases[c].rows[s]),
                                      "case %d unit %d, %d blocks: block %d segment %d rows "
                                      "[%d, %d) after %d", c, U, G, b, s, r0[s], r1[s], next[s]);
                        next[s] = r1[s];
                        bytes += (long long)(r1[s] - r0[s]) * cases[c].rb[s];
                    }
                    ck_assert_msg(bytes <= total / G + U * max_rb,
                                  "case %d unit %d, %d blocks: block %d takes %lld bytes of %lld",
                                  c, U, G, b, bytes, total);
                }
                for (int s = 0; s < n; s++)
                    ck_assert_msg(next[s] == cases[c].rows[s], "case %d unit %d, %d blocks: "
                                  "segment %d ends at row %d of %d", c, U, G, s, next[s],
                                  cases[c].rows[s]);
            }
        }
    int r0[3], r1[3];
    const int rows1[1] = {4};
    const long long rb1[1] = {16};
    ck_assert_int_eq(kern_layer_rows(1, rows1, rb1, 0, 3, 3, r0, r1), -1); /* b outside the grid */
    ck_assert_int_eq(kern_layer_rows(4, rows1, rb1, 0, 0, 1, r0, r1), -1);
    ck_assert_int_eq(kern_layer_rows(1, rows1, rb1, 1, 0, 1, r0, r1), -1); /* 4 rows: no unit */
}
END_TEST

/* The bf16 forms' layout (bench/NOTES.md change 161), for Q4_K's order (form 1) and Q6_K's
 * 8-block groups' (form 2), on rows of 2048 values: the place kern_xp_q4k / kern_xp_q6k
 * give each value (where rmsnorm and silu*mul store it) is a permutation that keeps each
 * 256-value block and repeats row after row, and it is where the raw kernels read it:
 * value j of quad lane q's four at step s (mmq_k, the order mmq_permute_x writes) at 16 s
 * + 2 q + j for j < 2, 16 s + 2 q + 8 + j - 2 after. */
START_TEST(test_xp_order) {
    enum { NE0 = 2048, ROWS = 2 };
    static unsigned char seen[NE0 * ROWS];
    for (int form = 1; form <= 2; form++) {
        memset(seen, 0, sizeof seen);
        for (long long k = 0; k < NE0 * ROWS; k++) {
            const long long d = kern_mmq_order(form, k, 0, 0, 0);
            ck_assert_msg(d >= 0 && d < NE0 * ROWS && d / 256 == k / 256 && !seen[d],
                          "form %d: value %lld stored at %lld", form, k, d);
            seen[d] = 1;
        }
        for (int st = 0; st < NE0 / 16; st++)
            for (int q = 0; q < 4; q++)
                for (int j = 0; j < 4; j++) {
                    const long long k = kern_mmq_order(form, -1, st, q, j);
                    const long long want = 16 * st + 2 * q + (j & 1) + 8 * (j >> 1);
                    ck_assert_msg(k >= 0 && k < NE0 && kern_mmq_order(form, k, 0, 0, 0) == want,
                                  "form %d: step %d lane %d value %d is x[%lld], stored at "
                                  "%lld, read at %lld", form, st, q, j, k,
                                  kern_mmq_order(form, k, 0, 0, 0), want);
                }
    }
    ck_assert_int_eq(kern_mmq_order(3, 0, 0, 0, 0), -1);
}
END_TEST

/* ---- main: pick the group ---- */

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "host") == 0) { /* no GPU needed */
        Suite *s = suite_create("ops_cuda_host");
        TCase *tc = tcase_create("host");
        tcase_set_timeout(tc, 60); /* Check's 4 s default: a cold first run of this 25 MB
                                      binary on a loaded machine once took longer */
        tcase_add_test(tc, test_attn_blocks);
        tcase_add_test(tc, test_attn_plan);
        tcase_add_test(tc, test_layer_rows);
        tcase_add_test(tc, test_xp_order);
        suite_add_tcase(s, tc);
        return tu_run_suite(s);
    }
    int n_devices = 0;
    G = ops_cuda_get();
    if (!G || !ops_cuda_available(&n_devices)) {
        fprintf(stderr, "SKIP: no usable GPU (CUDA backend %s)\n", G ? "built" : "not built");
        return TU_SKIP;
    }
    /* CUDA state does not survive Check's fork: run the tests in this process */
    setenv("CK_FORK", "no", 1);
    struct ops_config cfg = {0, 0};
    struct tpi_error err;
    tpi_err_clear(&err);
    if (G->init(&gctx, &cfg, &err) != TPI_OK) {
        fprintf(stderr, "cuda init failed: %s\n", err.msg);
        return 1;
    }
    if (C->init(&cctx, &cfg, &err) != TPI_OK) {
        fprintf(stderr, "cpu init failed: %s\n", err.msg);
        return 1;
    }
    fprintf(stderr, "devices: %s | %s\n", G->device_name(gctx), C->device_name(cctx));
    const char *group = argc > 1 ? argv[1] : "all";
    const bool all = strcmp(group, "all") == 0;
    Suite *s = suite_create("ops_cuda");
    TCase *tc = tcase_create(group);
    tcase_set_timeout(tc, 600);
    int n_added = 0;
    if (all || strcmp(group, "elem") == 0) {
        tcase_add_test(tc, test_rmsnorm);
        tcase_add_test(tc, test_bias_add_silu);
        tcase_add_test(tc, test_rope);
        tcase_add_test(tc, test_get_rows);
        tcase_add_test(tc, test_row_top);
        tcase_add_test(tc, test_host_alloc);
        n_added++;
    }
    if (all || strcmp(group, "embed") == 0) tcase_add_test(tc, test_embed), n_added++;
    for (int i = 0; i < N_TYPES; i++) {
        char name[32];
        snprintf(name, sizeof name, "matmul_%s", quant_type_name(TYPES[i]));
        if (all || strcmp(group, name) == 0)
            tcase_add_loop_test(tc, test_matmul, i, i + 1), n_added++;
    }
    if (all || strcmp(group, "attn_prefill") == 0) tcase_add_test(tc, test_attn_prefill), n_added++;
    if (all || strcmp(group, "attn_decode") == 0) tcase_add_test(tc, test_attn_decode), n_added++;
    if (strcmp(group, "bench") == 0) tcase_add_test(tc, test_bench), n_added++; /* not in "all" */
    if (!n_added) {
        fprintf(stderr, "unknown group '%s'\n", group);
        return 2;
    }
    suite_add_tcase(s, tc);
    int rc = tu_run_suite(s);
    C->free(&cctx);
    G->free(&gctx);
    return rc;
}
