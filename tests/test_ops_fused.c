/*
 * test_ops_fused.c — the fused ops of the op table (matmul_n, matmul_add,
 * matmul_silu_mul, qk_norm_rope, qk_norm_rope_attention) against the plain ops they
 * replace, on both backends.
 *
 * - CPU: a fused op is the plain ops in sequence, so it must equal them bitwise.
 * - CUDA: matmul_n reuses one int8 (v3) or bf16 (GEMM) x for every weight and runs
 *   weights on parallel streams or (decode: the smaller weights of weight 0's type) in
 *   weight 0's launch, or (9-32 rows, block types: kern_mmq) weights of one type in one
 *   launch, each split as it would be alone; the kernels and their summation order are
 *   the plain ones, so it must equal separate matmul calls bitwise. matmul_add folds the add
 *   into the matmul's store (v3: y + s per output, the add kernel's operation) or into
 *   cuBLAS (beta = 1: the library may pick another algorithm, so NMSE < 1e-10 against
 *   matmul + add there), on every decode path (v2, v3) and the GEMM path.
 *   The x-quantization memo (rmsnorm / silu_mul writing the next matmul's int8 x) is
 *   bitwise the same as quantizing in the matmul (test_xq_memo_cuda), and so is the
 *   decode attention's int8 output read by the wo matmul (test_xq_memo_attn_cuda).
 *   matmul_silu_mul (one decode row: one launch, gate row j and up row j in one warp,
 *   silu*mul and the int8 form of 32 outputs in one block) against matmul_n + silu_mul:
 *   g and u bitwise where matmul_n gives each row one warp (the model's FFN shapes),
 *   within 1e-5 (NMSE 1e-10) where it splits rows among warps; g's int8 form bitwise what
 *   a matmul of g makes itself; every block size; replays of a recorded graph.
 *   qk_norm_rope against CUDA rmsnorm + rope_neox: the same f32 arithmetic, elementwise
 *   within 1e-6; against the CPU reference within 1e-5 (rope's angle in double on both).
 *   qk_norm_rope_attention (the decode attention normalizing and rotating q and k
 *   itself) against qk_norm_rope + attention: outputs and stored k bitwise, q left as it
 *   was exactly where the kernel does it; against the CPU within the attention's bounds.
 *   layer_tail (one persistent launch for wo through down and the next layer's Q/K/V)
 *   against the plain CUDA ops (NMSE < 1e-7: another summation order) and the CPU
 *   reference (NMSE < 1e-3), bitwise equal to itself on relaunch and graph replay, and
 *   declining (false, nothing written) weights it does not cover.
 *   A graph of a kern_mmq product goes stale once a plain product of more rows regrows
 *   kern_mmq's scratch, and recorded again gives the plain values bitwise.
 * `test_ops_fused cpu` (label unit) runs the CPU cases; `test_ops_fused cuda` (label
 * gpu) the CUDA ones, and exits 77 without a usable GPU.
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
#ifdef TPI_HAVE_CUDA
#include "kernels/kern_gemv_hooks.h" /* kern_gemv_configure: the v3 kernel kinds */
#endif

static const struct ops *C = &ops_cpu;

/* One backend and its context under test. */
struct be {
    const struct ops *o;
    struct ops_ctx *ctx;
};

static void *bdup(struct be b, const void *h, size_t n_bytes) {
    void *p = b.o->alloc(b.ctx, n_bytes);
    ck_assert_ptr_nonnull(p);
    b.o->to_dev(b.ctx, p, h, n_bytes);
    b.o->sync(b.ctx);
    return p;
}

static void bget(struct be b, void *h, const void *d, size_t n_bytes) {
    b.o->sync(b.ctx);
    b.o->to_host(b.ctx, h, d, n_bytes);
}

static void assert_ok(struct be b, const char *what) {
    struct tpi_error err;
    tpi_err_clear(&err);
    b.o->sync(b.ctx);
    int st = b.o->check(b.ctx, &err);
    if (st != TPI_OK) fprintf(stderr, "%s (%s): %s\n", what, b.o->name, err.msg);
    ck_assert_int_eq(st, TPI_OK);
}

static float *rand_vec(struct tu_rng *r, size_t n, float lo, float hi) {
    float *x = malloc(n * sizeof(float));
    ck_assert_ptr_nonnull(x);
    tu_fill_uniform(r, x, n, lo, hi);
    return x;
}

/* Random (ne1 x ne0) weight of `type` uploaded to b. */
static void make_weight(struct be b, struct tu_rng *r, int type, int64_t ne0, int64_t ne1,
                        struct tpi_weight *w) {
    const struct quant_traits *tr = quant_traits(type);
    ck_assert_ptr_nonnull(tr);
    const size_t n = (size_t)(ne0 * ne1);
    float *f = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        f[i] = tu_normal(r) * (i % 7 == 0 ? 2.0f : 0.5f);
    void *q = malloc(quant_row_size(type, ne0) * (size_t)ne1);
    tr->from_f32(f, q, (int64_t)n);
    struct tpi_error err;
    tpi_err_clear(&err);
    ck_assert_msg(b.o->weight_upload(b.ctx, w, type, ne0, ne1, q, &err) == TPI_OK,
                  "%s weight_upload: %s", b.o->name, err.msg);
    free(f), free(q);
}

static size_t n_diff(const float *a, const float *b, size_t n) {
    size_t d = 0;
    for (size_t i = 0; i < n; i++)
        d += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return d;
}

/* matmul_n of n_w weights (types[i], ne1s[i]) against n_w matmul calls, and matmul_add of
 * weight 0 against matmul + add, for n_rows rows; bitwise unless `gemm_beta` (see top). */
static void check_fused_matmul(struct be b, const int *types, const int64_t *ne1s, int n_w,
                               int64_t ne0, int64_t n_rows, uint64_t seed) {
    struct tu_rng r;
    tu_rng_seed(&r, seed);
    struct tpi_weight w[OPS_MAX_FUSED];
    const struct tpi_weight *wp[OPS_MAX_FUSED];
    float *yf[OPS_MAX_FUSED], *yp[OPS_MAX_FUSED];
    const size_t nx = (size_t)(n_rows * ne0);
    float *xh = rand_vec(&r, nx, -2, 2);
    float *x = bdup(b, xh, nx * 4);
    for (int i = 0; i < n_w; i++) {
        make_weight(b, &r, types[i], ne0, ne1s[i], &w[i]);
        wp[i] = &w[i];
        yf[i] = b.o->alloc(b.ctx, (size_t)(n_rows * ne1s[i]) * 4);
        yp[i] = b.o->alloc(b.ctx, (size_t)(n_rows * ne1s[i]) * 4);
    }
    b.o->matmul_n(b.ctx, n_w, wp, x, yf, n_rows);
    for (int i = 0; i < n_w; i++)
        b.o->matmul(b.ctx, &w[i], x, yp[i], n_rows);
    char label[160];
    for (int i = 0; i < n_w; i++) {
        const size_t ny = (size_t)(n_rows * ne1s[i]);
        float *got = malloc(ny * 4), *want = malloc(ny * 4);
        bget(b, got, yf[i], ny * 4);
        bget(b, want, yp[i], ny * 4);
        snprintf(label, sizeof label, "%s matmul_n weight %d of %d (%s %lldx%lld) rows %lld",
                 b.o->name, i, n_w, quant_type_name(types[i]), (long long)ne1s[i],
                 (long long)ne0, (long long)n_rows);
        const size_t d = n_diff(got, want, ny);
        ck_assert_msg(d == 0, "%s: %zu of %zu outputs differ from matmul", label, d, ny);
        free(got), free(want);
    }
    /* matmul_add: y0 + x W0^T against matmul into t, then add */
    const size_t ny = (size_t)(n_rows * ne1s[0]);
    float *y0 = rand_vec(&r, ny, -1, 1);
    float *ya = bdup(b, y0, ny * 4), *yb = bdup(b, y0, ny * 4), *t = b.o->alloc(b.ctx, ny * 4);
    b.o->matmul_add(b.ctx, &w[0], x, ya, n_rows);
    b.o->matmul(b.ctx, &w[0], x, t, n_rows);
    b.o->add(b.ctx, yb, t, (int64_t)ny);
    float *got = malloc(ny * 4), *want = malloc(ny * 4);
    bget(b, got, ya, ny * 4);
    bget(b, want, yb, ny * 4);
    snprintf(label, sizeof label, "%s matmul_add (%s %lldx%lld) rows %lld", b.o->name,
             quant_type_name(types[0]), (long long)ne1s[0], (long long)ne0, (long long)n_rows);
    const bool gemm_beta = b.o != C && n_rows > 8; /* cuBLAS with beta = 1 */
    if (gemm_beta) {
        const double e = tu_nmse(got, want, ny);
        ck_assert_msg(e < 1e-10, "%s: nmse %.3g against matmul + add", label, e);
    } else {
        const size_t d = n_diff(got, want, ny);
        ck_assert_msg(d == 0, "%s: %zu of %zu outputs differ from matmul + add", label, d, ny);
    }
    assert_ok(b, label);
    free(got), free(want), free(y0), free(xh);
    b.o->dealloc(b.ctx, ya), b.o->dealloc(b.ctx, yb), b.o->dealloc(b.ctx, t);
    b.o->dealloc(b.ctx, x);
    for (int i = 0; i < n_w; i++) {
        b.o->weight_free(b.ctx, &w[i]);
        b.o->dealloc(b.ctx, yf[i]), b.o->dealloc(b.ctx, yp[i]);
    }
}

/* The weight mixes of the models: Q/K/V of Q4_K_M (Q4_K, Q4_K, Q6_K), all-BF16, all-Q8_0,
 * two K-quants that take separate launches (Q5_K beside Q4_K), F32, and gate/up pairs. */
static void fused_matmul_cases(struct be b) {
    static const struct {
        int n_w;
        int types[3];
        int64_t ne1[3];
    } mixes[] = {
        {3, {TPI_TYPE_Q4_K, TPI_TYPE_Q4_K, TPI_TYPE_Q6_K}, {64, 32, 32}},
        {3, {TPI_TYPE_BF16, TPI_TYPE_BF16, TPI_TYPE_BF16}, {64, 16, 16}},
        {3, {TPI_TYPE_Q8_0, TPI_TYPE_Q8_0, TPI_TYPE_Q8_0}, {48, 24, 24}},
        {2, {TPI_TYPE_Q5_K, TPI_TYPE_Q4_K}, {40, 40}},
        {2, {TPI_TYPE_F32, TPI_TYPE_F16}, {33, 17}},
        {2, {TPI_TYPE_Q4_0, TPI_TYPE_Q4_0}, {96, 96}},
        {1, {TPI_TYPE_Q6_K}, {77}},
    };
    const int64_t rows[] = {1, 3, 8, 17, 37}; /* 17: kern_mmq's launches of several weights */
    for (size_t m = 0; m < sizeof mixes / sizeof mixes[0]; m++)
        for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++)
            check_fused_matmul(b, mixes[m].types, mixes[m].ne1, mixes[m].n_w, 512, rows[k],
                               100 + 10 * m + k);
    /* Q/K-like rows of 4096 on CUDA: in one kern_mmq launch the two weights split their
     * 16 chunks differently (8 and 16 y blocks), each as it would alone */
    if (b.o != C) {
        static const int qk[2] = {TPI_TYPE_Q4_K, TPI_TYPE_Q4_K};
        static const int64_t qk_ne1[2] = {4096, 1024};
        check_fused_matmul(b, qk, qk_ne1, 2, 4096, 17, 190);
    }
}

#ifdef TPI_HAVE_CUDA
/* Graph recording on b, checked: start recording; stop and return the graph; replay one. */
static void graph_start(struct be b) {
    struct tpi_error err;
    tpi_err_clear(&err);
    ck_assert_msg(b.o->graph_begin(b.ctx, &err) == TPI_OK, "graph_begin: %s", err.msg);
}
static void *graph_stop(struct be b) {
    struct tpi_error err;
    tpi_err_clear(&err);
    void *graph = NULL;
    ck_assert_msg(b.o->graph_end(b.ctx, &graph, &err) == TPI_OK && graph, "graph_end: %s", err.msg);
    return graph;
}
static void graph_replay(struct be b, void *graph) {
    struct tpi_error err;
    tpi_err_clear(&err);
    bool launched = false;
    ck_assert_msg(b.o->graph_launch(b.ctx, graph, &launched, &err) == TPI_OK, "graph_launch: %s",
                  err.msg);
    ck_assert_msg(launched, "the graph was stale");
}

/* After an op that wrote act (nr x n) and its int8 form (the memo): matmuls of act that
 * read that form (Q8_0; Q4_K and Q6_K when n % 256 == 0: each reads its own permuted
 * copy) must equal, bitwise, the same matmuls quantizing act themselves (the memo broken
 * by an add of zeros, which leaves act as it is). */
static void check_int8_form(struct be b, struct tu_rng *r, float *act, int64_t nr, int64_t n,
                            const char *label) {
    static const int next[] = {TPI_TYPE_Q8_0, TPI_TYPE_Q4_K, TPI_TYPE_Q6_K};
    const size_t na = (size_t)(nr * n), nz = (size_t)nr * 40;
    struct tpi_weight w2[3];
    float *z[3][2];
    int n2 = 0;
    ck_assert_msg(ops_cuda_xq_memo_holds(b.ctx, act, (int64_t)na),
                  "%s: the memo does not hold the output", label);
    for (int k = 0; k < 3; k++)
        if (next[k] == TPI_TYPE_Q8_0 || n % 256 == 0) make_weight(b, r, next[k], n, 40, &w2[n2++]);
    float *zero = b.o->alloc(b.ctx, na * 4);
    float *zh = calloc(na, 4);
    b.o->to_dev(b.ctx, zero, zh, na * 4);
    free(zh);
    for (int v = 0; v < 2; v++) { /* v 0: the int8 form from the op; v 1: quantized now */
        if (v) b.o->add(b.ctx, act, zero, (int64_t)na);
        for (int k = 0; k < n2; k++) {
            float *zd = b.o->alloc(b.ctx, nz * 4);
            b.o->matmul(b.ctx, &w2[k], act, zd, nr);
            z[k][v] = malloc(nz * 4);
            bget(b, z[k][v], zd, nz * 4);
            b.o->dealloc(b.ctx, zd);
        }
    }
    for (int k = 0; k < n2; k++) {
        const size_t d = n_diff(z[k][0], z[k][1], nz);
        ck_assert_msg(d == 0, "%s: %s matmul of the output: %zu values differ from quantizing it",
                      label, quant_type_name(w2[k].type), d);
        free(z[k][0]), free(z[k][1]);
        b.o->weight_free(b.ctx, &w2[k]);
    }
    b.o->dealloc(b.ctx, zero);
}
#endif

/* matmul_silu_mul of a gate/up pair of `type` (n_ff x ne0) on nr rows against matmul_n then
 * silu_mul on the same backend: g and u bitwise when `exact` (the CPU; CUDA where matmul_n
 * gives each row one warp), else g and u within NMSE 1e-10. On CUDA, for each block size
 * of `modes` (ops_cuda_set_glu; -1 auto, the ring kernel where it applies): the same
 * check, then, when `memo`, g's int8 form (check_int8_form), and `replays` replays of the
 * op recorded in a graph, each with something else in g first, giving g again. */
static void check_silu_mul(struct be b, int type, int64_t ne0, int64_t n_ff, int64_t nr, bool exact,
                           bool memo, int replays, uint64_t seed) {
    struct tu_rng r;
    tu_rng_seed(&r, seed);
    const size_t nx = (size_t)(nr * ne0), ny = (size_t)(nr * n_ff);
    struct tpi_weight w[2];
    make_weight(b, &r, type, ne0, n_ff, &w[0]);
    make_weight(b, &r, type, ne0, n_ff, &w[1]);
    const struct tpi_weight *wp[2] = {&w[0], &w[1]};
    float *xh = rand_vec(&r, nx, -2, 2);
    float *x = bdup(b, xh, nx * 4);
    float *g = b.o->alloc(b.ctx, ny * 4), *u = b.o->alloc(b.ctx, ny * 4);
    float *gr = malloc(ny * 4), *ur = malloc(ny * 4), *gf = malloc(ny * 4), *uf = malloc(ny * 4);
    {
        float *ys[2] = {g, u};
        b.o->matmul_n(b.ctx, 2, wp, x, ys, nr);
        b.o->silu_mul(b.ctx, g, u, g, (int64_t)ny);
        bget(b, gr, g, ny * 4);
        bget(b, ur, u, ny * 4);
    }
#ifdef TPI_HAVE_CUDA
    static const int cuda_modes[] = {-1, 4, 8, 16, 32};
    const int n_modes = b.o == C ? 1 : 5;
#else
    const int n_modes = 1;
#endif
    for (int mi = 0; mi < n_modes; mi++) {
#ifdef TPI_HAVE_CUDA
        const int was = b.o == C ? 0 : ops_cuda_set_glu(b.ctx, cuda_modes[mi]);
        const int mode = b.o == C ? 0 : cuda_modes[mi];
#else
        const int mode = 0;
#endif
        char label[160];
        snprintf(label, sizeof label, "%s matmul_silu_mul (%s %lldx%lld) rows %lld, mode %d",
                 b.o->name, quant_type_name(type), (long long)n_ff, (long long)ne0, (long long)nr,
                 mode);
        b.o->to_dev(b.ctx, g, ur, ny * 4); /* something else in g and u first */
        b.o->to_dev(b.ctx, u, gr, ny * 4);
        b.o->matmul_silu_mul(b.ctx, &w[0], &w[1], x, g, u, nr);
        bget(b, gf, g, ny * 4);
        bget(b, uf, u, ny * 4);
        if (exact) {
            size_t d = n_diff(gf, gr, ny);
            ck_assert_msg(d == 0, "%s: %zu of %zu g differ from matmul_n + silu_mul", label, d, ny);
            d = n_diff(uf, ur, ny);
            ck_assert_msg(d == 0, "%s: %zu of %zu u differ from matmul_n", label, d, ny);
        } else {
            const double eg = tu_nmse(gf, gr, ny), eu = tu_nmse(uf, ur, ny);
            ck_assert_msg(eg < 1e-10 && eu < 1e-10, "%s: NMSE g %.3g u %.3g (limit 1e-10)", label,
                          eg, eu);
        }
#ifdef TPI_HAVE_CUDA
        if (b.o != C) {
            if (memo) check_int8_form(b, &r, g, nr, n_ff, label);
            if (replays > 0) {
                graph_start(b);
                b.o->matmul_silu_mul(b.ctx, &w[0], &w[1], x, g, u, nr);
                void *graph = graph_stop(b);
                for (int k = 0; k < replays; k++) {
                    b.o->to_dev(b.ctx, g, ur, ny * 4);
                    graph_replay(b, graph);
                    float *got = malloc(ny * 4);
                    bget(b, got, g, ny * 4);
                    const size_t d = n_diff(got, gf, ny);
                    ck_assert_msg(d == 0, "%s: replay %d: %zu of %zu g differ", label, k, d, ny);
                    free(got);
                }
                b.o->graph_free(b.ctx, graph);
            }
            ops_cuda_set_glu(b.ctx, was);
        }
#else
        (void)memo, (void)replays;
#endif
        assert_ok(b, label);
    }
    b.o->dealloc(b.ctx, g), b.o->dealloc(b.ctx, u);
    free(gr), free(ur), free(gf), free(uf);
    b.o->weight_free(b.ctx, &w[0]), b.o->weight_free(b.ctx, &w[1]);
    b.o->dealloc(b.ctx, x);
    free(xh);
}

/* The quantized types of the v3 path and BF16: for one row the model's FFN (`big`: 4096 ->
 * 12288 for Q4_K, Q5_K, Q4_0 (the ring kernel's shape) and Q8_0, 2048 -> 6144 for the
 * others (Q6_K and Q3_K then in the device's 8-block groups), with graph replays; the CPU takes 512 -> 1536): bitwise; then 1024 -> 2048 on 1
 * and 3 rows and 256 -> 96 (3 blocks of outputs) on 1 row, where matmul_n splits rows among
 * warps: within NMSE 1e-10 on CUDA. The int8 form is checked wherever the down matmul
 * reads it (quantized types). */
static void silu_mul_cases(struct be b, bool big) {
    static const int types[] = {TPI_TYPE_Q4_K, TPI_TYPE_Q6_K, TPI_TYPE_Q8_0, TPI_TYPE_Q4_0,
                                TPI_TYPE_Q5_0, TPI_TYPE_BF16, TPI_TYPE_Q5_K, TPI_TYPE_Q3_K};
    const bool cpu = b.o == C;
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const bool v3q = types[t] != TPI_TYPE_BF16;
        const bool k_quant = types[t] == TPI_TYPE_Q4_K || types[t] == TPI_TYPE_Q6_K ||
                             types[t] == TPI_TYPE_Q5_K || types[t] == TPI_TYPE_Q3_K;
        const bool model = types[t] == TPI_TYPE_Q4_K || types[t] == TPI_TYPE_Q5_K ||
                           types[t] == TPI_TYPE_Q8_0 || types[t] == TPI_TYPE_Q4_0;
        const int64_t ne0 = !big ? 512 : model ? 4096 : 2048;
        check_silu_mul(b, types[t], ne0, 3 * ne0, 1, true, v3q && !cpu, cpu ? 0 : 3, 700 + 10 * t);
        for (int64_t nr = 1; nr <= 3; nr += 2)
            check_silu_mul(b, types[t], 1024, 2048, nr, cpu, v3q && !cpu, 0, 800 + 10 * t + nr);
        if (!k_quant) check_silu_mul(b, types[t], 256, 96, 1, cpu, v3q && !cpu, 0, 900 + 10 * t);
    }
}

START_TEST(test_fused_matmul_cpu) {
    struct be b = {C, NULL};
    struct ops_config cfg = {2, 0};
    struct tpi_error err;
    tpi_err_clear(&err);
    ck_assert_int_eq(C->init(&b.ctx, &cfg, &err), TPI_OK);
    fused_matmul_cases(b);
    silu_mul_cases(b, false);
    C->free(&b.ctx);
}
END_TEST

/* qk_norm_rope on b against rmsnorm + rope_neox on the same backend (within tol) and
 * against the CPU's fused op (within 1e-5). */
/* YaRN as Qwen's long-context GGUFs set it, scaled down: x4 from 256 trained positions,
 * so the ramp between extrapolated and interpolated pairs lies inside a 64-dim head. */
static struct ops_rope yarn_rope(int n_rot) {
    struct ops_rope r = ops_rope_plain(n_rot, 1e6f);
    r.freq_scale = 0.25f;
    r.ext_factor = 1.0f;
    r.n_ctx_orig = 256;
    return r;
}

static void check_qk_norm_rope(struct be b, struct ops_ctx *cctx, int n_tok, int n_head, int n_kv,
                               int hd, struct ops_rope rope, bool norm, double tol,
                               uint64_t seed) {
    const int n_rot = rope.n_rot;
    struct tu_rng r;
    tu_rng_seed(&r, seed);
    const size_t nq = (size_t)n_tok * n_head * hd, nk = (size_t)n_tok * n_kv * hd;
    float *qh = rand_vec(&r, nq, -3, 3), *kh = rand_vec(&r, nk, -3, 3);
    float *qwh = rand_vec(&r, (size_t)hd, 0.5f, 1.5f), *kwh = rand_vec(&r, (size_t)hd, 0.5f, 1.5f);
    int32_t pos[64], seq[64];
    for (int t = 0; t < n_tok; t++)
        pos[t] = (int32_t)tu_uniform(&r, 0.0f, 5999.0f), seq[t] = 0;
    struct be cb = {C, cctx};
    struct be bs[2] = {b, cb};
    float *res[2][2]; /* [backend][fused, plain] q results; k results after */
    float *resk[2][2];
    for (int bi = 0; bi < 2; bi++) {
        struct be x = bs[bi];
        int32_t *dpos = bdup(x, pos, sizeof(int32_t) * (size_t)n_tok);
        int32_t *dseq = bdup(x, seq, sizeof(int32_t) * (size_t)n_tok);
        const struct ops_batch bt = {.n_tokens = n_tok, .pos = dpos, .seq = dseq,
                                     .pos_host = pos, .seq_host = seq, .max_pos = 6000};
        float *qw = bdup(x, qwh, (size_t)hd * 4), *kw = bdup(x, kwh, (size_t)hd * 4);
        for (int v = 0; v < 2; v++) {
            float *q = bdup(x, qh, nq * 4), *k = bdup(x, kh, nk * 4);
            if (v == 0) {
                x.o->qk_norm_rope(x.ctx, q, k, norm ? qw : NULL, norm ? kw : NULL, &bt, n_head,
                                  n_kv, hd, &rope, 1e-6f);
            } else {
                if (norm) {
                    x.o->rmsnorm(x.ctx, q, qw, q, (int64_t)n_tok * n_head, hd, 1e-6f);
                    x.o->rmsnorm(x.ctx, k, kw, k, (int64_t)n_tok * n_kv, hd, 1e-6f);
                }
                x.o->rope_neox(x.ctx, q, &bt, n_head, hd, &rope);
                x.o->rope_neox(x.ctx, k, &bt, n_kv, hd, &rope);
            }
            res[bi][v] = malloc(nq * 4), resk[bi][v] = malloc(nk * 4);
            bget(x, res[bi][v], q, nq * 4);
            bget(x, resk[bi][v], k, nk * 4);
            x.o->dealloc(x.ctx, q), x.o->dealloc(x.ctx, k);
        }
        assert_ok(x, "qk_norm_rope");
        x.o->dealloc(x.ctx, qw), x.o->dealloc(x.ctx, kw);
        x.o->dealloc(x.ctx, dpos), x.o->dealloc(x.ctx, dseq);
    }
    char label[128];
    snprintf(label, sizeof label, "%s qk_norm_rope %d tok %d/%d heads hd %d rot %d%s norm %d",
             b.o->name, n_tok, n_head, n_kv, hd, n_rot, rope.ext_factor != 0 ? " yarn" : "",
             norm);
    /* fused vs plain on the backend under test, then vs the CPU's fused op */
    ck_assert_msg(tu_compare(label, res[0][0], res[0][1], nq, tol, tol) == 0, "%s: q", label);
    ck_assert_msg(tu_compare(label, resk[0][0], resk[0][1], nk, tol, tol) == 0, "%s: k", label);
    ck_assert_msg(tu_compare(label, res[0][0], res[1][0], nq, 1e-5, 1e-5) == 0, "%s: q vs cpu",
                  label);
    ck_assert_msg(tu_compare(label, resk[0][0], resk[1][0], nk, 1e-5, 1e-5) == 0, "%s: k vs cpu",
                  label);
    /* the CPU's fused op is its plain ops: bitwise */
    ck_assert_msg(n_diff(res[1][0], res[1][1], nq) == 0 && n_diff(resk[1][0], resk[1][1], nk) == 0,
                  "%s: cpu fused differs from cpu plain", label);
    for (int bi = 0; bi < 2; bi++)
        for (int v = 0; v < 2; v++)
            free(res[bi][v]), free(resk[bi][v]);
    free(qh), free(kh), free(qwh), free(kwh);
}

static void qk_cases(struct be b, struct ops_ctx *cctx, double tol) {
    check_qk_norm_rope(b, cctx, 1, 32, 8, 128, ops_rope_plain(128, 1e6f), true, tol, 1);
    check_qk_norm_rope(b, cctx, 5, 14, 2, 64, ops_rope_plain(64, 1e6f), false, tol, 2);
    check_qk_norm_rope(b, cctx, 3, 4, 4, 96, ops_rope_plain(64, 1e6f), true, tol, 3);
    check_qk_norm_rope(b, cctx, 37, 8, 2, 128, ops_rope_plain(128, 1e6f), true, tol, 4);
    check_qk_norm_rope(b, cctx, 2, 3, 1, 256, ops_rope_plain(32, 1e6f), false, tol, 5);
    check_qk_norm_rope(b, cctx, 1, 32, 8, 128, yarn_rope(128), true, tol, 6);
    check_qk_norm_rope(b, cctx, 9, 8, 2, 64, yarn_rope(64), false, tol, 7);
}

/* qk_norm_rope_attention on b (q and k then undefined) against qk_norm_rope + attention
 * on b: outputs and the stored k rows bitwise (the CUDA decode kernel normalizes and
 * rotates q and k itself, in qk_norm_rope_kernel's arithmetic and order), and on b the CPU
 * (cpu, its own cache with the same history) within the attention tests' bounds. `fused`:
 * b takes the in-kernel form for this shape (the CUDA tensor-core decode shape, n_rot %
 * 64 == 0), which leaves q and k as they were; otherwise they are rotated in place. */
#define QKA_SLOTS 2
#define QKA_CTX 4096
static void check_qk_attention(struct be b, struct be cpu, int n_head, int n_kv, int hd,
                               struct ops_rope rope, bool norm, bool cuda, uint64_t seed) {
    const int n_rot = rope.n_rot;
    static const struct { int n_tok, depth, two_slots; } batches[] = {
        {1, 40, 0}, {1, 3000, 0}, {2, 2500, 1}, {5, 700, 0}, {12, 1500, 0}, {20, 60, 0}};
    struct tu_rng r;
    tu_rng_seed(&r, seed);
    struct be bs[2] = {b, cpu};
    struct ops_kv kv[2];
    struct tpi_error err;
    tpi_err_clear(&err);
    const size_t row = (size_t)n_kv * hd, n_cache = (size_t)QKA_SLOTS * QKA_CTX * row;
    uint16_t *h16 = malloc(n_cache * 2);
    float *h32 = malloc(n_cache * 4);
    ck_assert(h16 && h32);
    for (int bi = 0; bi < 2; bi++)
        ck_assert_msg(bs[bi].o->kv_init(bs[bi].ctx, &kv[bi], 1, QKA_SLOTS, QKA_CTX, n_kv, hd,
                                        &err) == TPI_OK,
                      "kv_init: %s", err.msg);
    /* history: the same f16-representable keys and values everywhere, in each cache's
     * type (CUDA's f16, the CPU's f32) */
    for (int kvi = 0; kvi < 2; kvi++) {
        for (size_t i = 0; i < n_cache; i++) {
            h16[i] = tpi_f32_to_f16(tu_normal(&r));
            h32[i] = tpi_f16_to_f32(h16[i]);
        }
        for (int bi = 0; bi < 2; bi++) {
            const bool f16 = kv[bi].type == TPI_TYPE_F16;
            bs[bi].o->to_dev(bs[bi].ctx, kvi ? kv[bi].v : kv[bi].k, f16 ? (void *)h16 : h32,
                             n_cache * (f16 ? 2 : 4));
            bs[bi].o->sync(bs[bi].ctx);
        }
    }
    free(h16), free(h32);
    const size_t esz = kv[0].type == TPI_TYPE_F16 ? 2 : 4; /* b's cache element */
    enum { MAX_TOK = 20 };
    const size_t nq = (size_t)MAX_TOK * n_head * hd, nk = (size_t)MAX_TOK * row;
    float *qh = rand_vec(&r, nq, -3, 3), *kh = rand_vec(&r, nk, -3, 3), *vh = rand_vec(&r, nk, -2, 2);
    float *qwh = rand_vec(&r, (size_t)hd, 0.5f, 1.5f), *kwh = rand_vec(&r, (size_t)hd, 0.5f, 1.5f);
    const float scale = 1.0f / sqrtf((float)hd);
    float *o_got = malloc(nq * 4), *o_cpu = malloc(nq * 4), *o_ref = malloc(nq * 4);
    float *q_back = malloc(nq * 4);
    char *k_got = malloc(nk * 4), *k_ref = malloc(nk * 4);
    for (size_t bti = 0; bti < sizeof batches / sizeof batches[0]; bti++) {
        const int n_tok = batches[bti].n_tok;
        int32_t pos[MAX_TOK], seq[MAX_TOK];
        int max_pos = 0;
        for (int t = 0; t < n_tok; t++) {
            seq[t] = batches[bti].two_slots ? t % 2 : 0;
            pos[t] = batches[bti].depth + (batches[bti].two_slots ? -9 * t : t);
            max_pos = pos[t] + 1 > max_pos ? pos[t] + 1 : max_pos;
        }
        const size_t nqt = (size_t)n_tok * n_head * hd, nkt = (size_t)n_tok * row;
        char label[200];
        snprintf(label, sizeof label, "%s qk_norm_rope_attention %d/%d heads hd %d rot %d%s norm "
                 "%d, %d tokens at %d", b.o->name, n_head, n_kv, hd, n_rot,
                 rope.ext_factor != 0 ? " yarn" : "", norm, n_tok,
                 batches[bti].depth);
        for (int run = 0; run < 3; run++) { /* b fused, b plain, the CPU fused */
            const struct be x = run < 2 ? b : cpu;
            struct ops_kv *kvx = &kv[run < 2 ? 0 : 1];
            int32_t *dpos = bdup(x, pos, (size_t)n_tok * 4), *dseq = bdup(x, seq, (size_t)n_tok * 4);
            const struct ops_batch bt = {n_tok, dpos, dseq, pos, seq, max_pos};
            float *q = bdup(x, qh, nqt * 4), *k = bdup(x, kh, nkt * 4), *v = bdup(x, vh, nkt * 4);
            float *qw = bdup(x, qwh, (size_t)hd * 4), *kw = bdup(x, kwh, (size_t)hd * 4);
            float *out = x.o->alloc(x.ctx, nqt * 4);
            if (run == 1) {
                x.o->qk_norm_rope(x.ctx, q, k, norm ? qw : NULL, norm ? kw : NULL, &bt, n_head,
                                  n_kv, hd, &rope, 1e-6f);
                x.o->attention(x.ctx, kvx, 0, q, k, v, out, &bt, n_head, scale);
            } else {
                x.o->qk_norm_rope_attention(x.ctx, kvx, 0, q, k, v, norm ? qw : NULL,
                                            norm ? kw : NULL, &rope, 1e-6f, out, &bt,
                                            n_head, scale);
            }
            bget(x, run == 0 ? o_got : run == 1 ? o_ref : o_cpu, out, nqt * 4);
            if (run == 0) bget(x, q_back, q, nqt * 4);
            for (int t = 0; run < 2 && t < n_tok; t++) /* the stored k rows */
                bget(x, (run == 0 ? k_got : k_ref) + (size_t)t * row * esz,
                     (const char *)kvx->k + ((size_t)seq[t] * QKA_CTX + pos[t]) * row * esz,
                     row * esz);
            assert_ok(x, label);
            x.o->dealloc(x.ctx, q), x.o->dealloc(x.ctx, k), x.o->dealloc(x.ctx, v);
            x.o->dealloc(x.ctx, qw), x.o->dealloc(x.ctx, kw), x.o->dealloc(x.ctx, out);
            x.o->dealloc(x.ctx, dpos), x.o->dealloc(x.ctx, dseq);
        }
        const bool fused = cuda && (hd == 64 || hd == 128) && n_rot % 64 == 0 && n_tok < 16;
        ck_assert_msg((n_diff(q_back, qh, nqt) == 0) == fused, "%s: q was %s", label,
                      fused ? "rotated in place (not the in-kernel form)" : "left as it was");
        const size_t d_o = n_diff(o_got, o_ref, nqt);
        ck_assert_msg(d_o == 0, "%s: %zu outputs differ from qk_norm_rope + attention", label, d_o);
        ck_assert_msg(memcmp(k_got, k_ref, nkt * esz) == 0, "%s: the stored k rows differ", label);
        if (cuda)
            ck_assert_msg(tu_compare(label, o_got, o_cpu, nqt, 5e-3, 2e-2) == 0, "%s: vs cpu",
                          label);
        else
            ck_assert_msg(n_diff(o_got, o_cpu, nqt) == 0, "%s: cpu differs from itself", label);
    }
    for (int bi = 0; bi < 2; bi++)
        bs[bi].o->kv_free(bs[bi].ctx, &kv[bi]);
    free(qh), free(kh), free(vh), free(qwh), free(kwh);
    free(o_got), free(o_cpu), free(o_ref), free(q_back), free(k_got), free(k_ref);
}

/* Shapes: Qwen3-8B's (32/8 heads of 128, norm), 64-dim heads without norm (Qwen2's form),
 * a partial rotation (64 of 128 dims), and hd 96 (no tensor-core kernel: plain path). */
static void qk_attention_cases(struct be b, struct be cpu, bool cuda) {
    check_qk_attention(b, cpu, 32, 8, 128, ops_rope_plain(128, 1e6f), true, cuda, 11);
    check_qk_attention(b, cpu, 16, 2, 64, ops_rope_plain(64, 1e6f), false, cuda, 12);
    check_qk_attention(b, cpu, 8, 2, 128, ops_rope_plain(64, 1e6f), true, cuda, 13);
    check_qk_attention(b, cpu, 8, 4, 96, ops_rope_plain(64, 1e6f), true, cuda, 14);
    check_qk_attention(b, cpu, 32, 8, 128, yarn_rope(128), true, cuda, 15);
    check_qk_attention(b, cpu, 16, 2, 64, yarn_rope(64), false, cuda, 16);
}

START_TEST(test_qk_norm_rope_cpu) {
    struct ops_config cfg = {2, 0};
    struct tpi_error err;
    struct ops_ctx *a = NULL, *c2 = NULL;
    tpi_err_clear(&err);
    ck_assert_int_eq(C->init(&a, &cfg, &err), TPI_OK);
    ck_assert_int_eq(C->init(&c2, &cfg, &err), TPI_OK);
    qk_cases((struct be){C, a}, c2, 0.0);
    qk_attention_cases((struct be){C, a}, (struct be){C, c2}, false);
    C->free(&a), C->free(&c2);
}
END_TEST

#ifdef TPI_HAVE_CUDA
static struct ops_ctx *gctx, *cctx_g;

START_TEST(test_fused_matmul_cuda) {
    const struct be b = {ops_cuda_get(), gctx};
    for (int path = 2; path <= 3; path++) {
        ops_cuda_set_gemv(gctx, path);
        fprintf(stderr, "decode path v%d\n", path);
        fused_matmul_cases(b);
    }
    ops_cuda_set_gemv(gctx, 3);
}
END_TEST

/* The x-quantization memo: rmsnorm and silu_mul write the int8 form of their output
 * (CUDA, decode sizes), which the next matmul uses instead of quantizing again. Results
 * must be bitwise those of the same ops with the memo broken by an op in between (an
 * add of zeros), for every weight type, 1..8 rows, and in-place rmsnorm. */
START_TEST(test_xq_memo_cuda) {
    const struct be b = {ops_cuda_get(), gctx};
    static const int types[] = {TPI_TYPE_Q4_K, TPI_TYPE_Q6_K, TPI_TYPE_Q8_0, TPI_TYPE_Q4_0,
                                TPI_TYPE_BF16, TPI_TYPE_Q5_K};
    const int64_t ne0 = 1024, ne1 = 96;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (int64_t nr = 1; nr <= 8; nr += 3) {
            struct tu_rng r;
            tu_rng_seed(&r, 700 + ti * 10 + (uint64_t)nr);
            const size_t nx = (size_t)(nr * ne0), ny = (size_t)(nr * ne1);
            struct tpi_weight w;
            make_weight(b, &r, types[ti], ne0, ne1, &w);
            float *xh = rand_vec(&r, nx, -2, 2), *uh = rand_vec(&r, nx, -2, 2);
            float *nw = rand_vec(&r, (size_t)ne0, 0.5f, 1.5f);
            float *x = bdup(b, xh, nx * 4), *u = bdup(b, uh, nx * 4), *gw = bdup(b, nw, ne0 * 4);
            float *h = b.o->alloc(b.ctx, nx * 4), *zero = b.o->alloc(b.ctx, nx * 4);
            float *y[2], *res[2][3];
            for (int v = 0; v < 2; v++) { /* v 0: memo used; v 1: broken by an add of zeros */
                y[v] = b.o->alloc(b.ctx, ny * 4);
                b.o->rmsnorm(b.ctx, x, gw, h, nr, ne0, 1e-6f);
                if (v) b.o->add(b.ctx, h, zero, (int64_t)nx);
                b.o->matmul(b.ctx, &w, h, y[v], nr);
                res[v][0] = malloc(ny * 4);
                bget(b, res[v][0], y[v], ny * 4);
                b.o->silu_mul(b.ctx, h, u, h, (int64_t)nx);
                if (v) b.o->add(b.ctx, h, zero, (int64_t)nx);
                b.o->matmul_add(b.ctx, &w, h, y[v], nr);
                res[v][1] = malloc(ny * 4);
                bget(b, res[v][1], y[v], ny * 4);
                float *hx = bdup(b, xh, nx * 4); /* in place rmsnorm */
                b.o->rmsnorm(b.ctx, hx, gw, hx, nr, ne0, 1e-6f);
                if (v) b.o->add(b.ctx, hx, zero, (int64_t)nx);
                b.o->matmul(b.ctx, &w, hx, y[v], nr);
                res[v][2] = malloc(ny * 4);
                bget(b, res[v][2], y[v], ny * 4);
                b.o->dealloc(b.ctx, hx);
            }
            for (int k = 0; k < 3; k++) {
                const size_t d = n_diff(res[0][k], res[1][k], ny);
                ck_assert_msg(d == 0, "memo %s rows %lld step %d: %zu of %zu outputs differ",
                              quant_type_name(types[ti]), (long long)nr, k, d, ny);
                free(res[0][k]), free(res[1][k]);
            }
            assert_ok(b, "xq memo");
            b.o->weight_free(b.ctx, &w);
            b.o->dealloc(b.ctx, x), b.o->dealloc(b.ctx, u), b.o->dealloc(b.ctx, gw);
            b.o->dealloc(b.ctx, h), b.o->dealloc(b.ctx, zero);
            b.o->dealloc(b.ctx, y[0]), b.o->dealloc(b.ctx, y[1]);
            free(xh), free(uh), free(nw);
        }
}
END_TEST

/* One decode step's attention + wo product for test_xq_memo_attn_cuda: attention of the
 * batch bt into out, then y (starting at y0) += out W^T; ref: the attention without the
 * int8 output (v2 path while it is queued, so kern_xq_claim refuses) and the memo broken
 * by an add of zeros, so the matmul quantizes out itself. The q8 scratch first holds an
 * unrelated x's blocks (a matmul of px), so a block the attention leaves unwritten is
 * wrong. Returns the product and out (malloc'ed, n_tok * ne1 and n_tok * ne0 floats);
 * checks that the memo holds out after the attention exactly when `want_memo`. */
struct attn_step {
    struct ops_kv *kv;
    const float *q, *k, *v, *px, *zero, *y0;
    float *out;
    const struct ops_batch *bt;
    int n_head;
    int64_t ne0;
    const struct tpi_weight *w; /* NULL: attention only */
};

static void attn_step_run(struct be b, const struct attn_step *st, bool ref, bool want_memo,
                          const char *label, float **y_out, float **o_out) {
    const int n_tok = st->bt->n_tokens;
    const int64_t nx = (int64_t)n_tok * st->ne0;
    const int64_t ny = st->w ? (int64_t)n_tok * st->w->ne1 : 0;
    float *y = NULL, *yp = NULL;
    if (st->w) {
        y = bdup(b, st->y0, (size_t)ny * 4);
        yp = b.o->alloc(b.ctx, (size_t)ny * 4);
        b.o->matmul(b.ctx, st->w, st->px, yp, n_tok);
    }
    const int gemv0 = ref ? ops_cuda_set_gemv(b.ctx, 2) : 0;
    b.o->attention(b.ctx, st->kv, 0, st->q, st->k, st->v, st->out, st->bt, st->n_head,
                   1.0f / sqrtf((float)(st->ne0 / st->n_head)));
    if (ref) ops_cuda_set_gemv(b.ctx, gemv0);
    const bool held = ops_cuda_xq_memo_holds(b.ctx, st->out, nx);
    ck_assert_msg(held == (want_memo && !ref), "%s%s: the memo %s the attention output", label,
                  ref ? " (reference)" : "", held ? "holds" : "does not hold");
    if (ref) {
        b.o->add(b.ctx, st->out, st->zero, nx);
        ck_assert(!ops_cuda_xq_memo_holds(b.ctx, st->out, nx));
    }
    if (st->w) b.o->matmul_add(b.ctx, st->w, st->out, y, n_tok);
    *o_out = malloc((size_t)nx * 4);
    bget(b, *o_out, st->out, (size_t)nx * 4);
    *y_out = NULL;
    if (st->w) {
        *y_out = malloc((size_t)ny * 4);
        bget(b, *y_out, y, (size_t)ny * 4);
        b.o->dealloc(b.ctx, y), b.o->dealloc(b.ctx, yp);
    }
    assert_ok(b, label);
}

/* The decode attention as a memo producer (XQ_BY_ATTN): the tensor-core decode kernel
 * writes its output's int8 form (blocks, scales, kind p's permuted copies), which the wo
 * matmul then reads instead of quantizing. GQA shapes 8/2 heads of 128 and 16/2 of 64;
 * 1 token, 2 tokens in two slots, 5 consecutive tokens of one slot (several query blocks,
 * the last one part full); a depth whose keys the kernel splits (the last block to arrive
 * merges and quantizes) and one it does not; Q4_K, Q8_0 and Q6_K weights; v3 kernel kinds
 * a, b and p (each reads another form of x). Both the attention output and the product
 * must be bitwise those of the reference (attn_step_run), and the memo must hold the
 * output after the attention. 12 tokens (decode shape, more rows than the matrix-vector
 * path takes) and the CUDA-core attention must leave the memo empty. */
START_TEST(test_xq_memo_attn_cuda) {
    const struct be b = {ops_cuda_get(), gctx};
    static const struct { int n_head, n_kv, hd; } shapes[] = {{8, 2, 128}, {16, 2, 64}};
    static const int types[] = {TPI_TYPE_Q4_K, TPI_TYPE_Q8_0, TPI_TYPE_Q6_K};
    static const char *const kinds[] = {"kind=a", "kind=b", "kind=p"};
    static const int depths[] = {40, 3000}; /* keys in one range; split over many */
    static const int n_toks[] = {1, 2, 5, 12};
    enum { N_SLOT = 2, N_CTX = 4096, MAX_TOK = 12 };
    const int64_t ne1 = 192;
    const int mode0 = ops_cuda_set_attn_mma(3), gemv0 = ops_cuda_set_gemv(gctx, 3);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int n_head = shapes[si].n_head, n_kv = shapes[si].n_kv, hd = shapes[si].hd;
        const int64_t ne0 = (int64_t)n_head * hd;
        struct tu_rng r;
        tu_rng_seed(&r, 900 + si);
        struct ops_kv kv;
        struct tpi_error err;
        tpi_err_clear(&err);
        ck_assert_msg(b.o->kv_init(b.ctx, &kv, 1, N_SLOT, N_CTX, n_kv, hd, &err) == TPI_OK,
                      "kv_init: %s", err.msg);
        /* history: random f16 keys and values at every position of both slots */
        const size_t n_cache = (size_t)N_SLOT * N_CTX * n_kv * hd;
        uint16_t *h16 = malloc(n_cache * 2);
        ck_assert_ptr_nonnull(h16);
        for (int kvi = 0; kvi < 2; kvi++) {
            for (size_t i = 0; i < n_cache; i++)
                h16[i] = tpi_f32_to_f16(tu_normal(&r));
            b.o->to_dev(b.ctx, kvi ? kv.v : kv.k, h16, n_cache * 2);
            b.o->sync(b.ctx);
        }
        free(h16);
        const size_t nq = (size_t)MAX_TOK * ne0, nkv = (size_t)MAX_TOK * n_kv * hd;
        float *qh = rand_vec(&r, nq, -2, 2), *kh = rand_vec(&r, nkv, -2, 2);
        float *vh = rand_vec(&r, nkv, -2, 2), *pxh = rand_vec(&r, nq, -2, 2);
        float *q = bdup(b, qh, nq * 4), *k = bdup(b, kh, nkv * 4), *v = bdup(b, vh, nkv * 4);
        float *px = bdup(b, pxh, nq * 4);
        float *out = b.o->alloc(b.ctx, nq * 4), *zero = b.o->alloc(b.ctx, nq * 4);
        for (size_t di = 0; di < sizeof depths / sizeof depths[0]; di++)
            for (size_t ni = 0; ni < sizeof n_toks / sizeof n_toks[0]; ni++) {
                const int n_tok = n_toks[ni], depth = depths[di];
                int32_t pos[MAX_TOK], seq[MAX_TOK];
                int max_pos = 0;
                for (int t = 0; t < n_tok; t++) {
                    seq[t] = n_tok == 2 ? t : 0; /* 2 tokens: one in each slot */
                    pos[t] = n_tok == 2 ? depth - 7 * t : depth + t;
                    max_pos = pos[t] + 1 > max_pos ? pos[t] + 1 : max_pos;
                }
                int32_t *dpos = bdup(b, pos, (size_t)n_tok * 4);
                int32_t *dseq = bdup(b, seq, (size_t)n_tok * 4);
                const struct ops_batch bt = {n_tok, dpos, dseq, pos, seq, max_pos};
                struct attn_step st = {&kv, q, k, v, px, zero, NULL, out, &bt, n_head, ne0, NULL};
                char label[200];
                const bool memo = n_tok <= 8;
                float *yr[2], *orr[2];
                /* the CUDA-core kernels never write the int8 output */
                snprintf(label, sizeof label, "attn memo %d/%d hd %d, %d tokens at %d, cores",
                         n_head, n_kv, hd, n_tok, depth);
                ops_cuda_set_attn_mma(0);
                attn_step_run(b, &st, false, false, label, &yr[0], &orr[0]);
                ops_cuda_set_attn_mma(3);
                free(orr[0]);
                if (!memo) { /* 12 tokens: the mma decode shape, no int8 output */
                    snprintf(label, sizeof label, "attn memo %d/%d hd %d, %d tokens at %d", n_head,
                             n_kv, hd, n_tok, depth);
                    attn_step_run(b, &st, false, false, label, &yr[0], &orr[0]);
                    attn_step_run(b, &st, true, false, label, &yr[1], &orr[1]);
                    ck_assert_msg(n_diff(orr[0], orr[1], (size_t)n_tok * ne0) == 0,
                                  "%s: outputs differ", label);
                    free(orr[0]), free(orr[1]);
                }
                for (size_t ti = 0; memo && ti < sizeof types / sizeof types[0]; ti++) {
                    struct tpi_weight w;
                    make_weight(b, &r, types[ti], ne0, ne1, &w);
                    float *y0 = rand_vec(&r, (size_t)(n_tok * ne1), -1, 1);
                    st.w = &w;
                    st.y0 = y0;
                    for (size_t ki = 0; ki < sizeof kinds / sizeof kinds[0]; ki++) {
                        ck_assert_int_eq(kern_gemv_configure(kinds[ki]), 0);
                        snprintf(label, sizeof label,
                                 "attn memo %d/%d hd %d, %d tokens at %d, %s %s", n_head, n_kv, hd,
                                 n_tok, depth, quant_type_name(types[ti]), kinds[ki]);
                        for (int ref = 0; ref < 2; ref++)
                            attn_step_run(b, &st, ref, true, label, &yr[ref], &orr[ref]);
                        const size_t d_o = n_diff(orr[0], orr[1], (size_t)n_tok * ne0);
                        const size_t d_y = n_diff(yr[0], yr[1], (size_t)(n_tok * ne1));
                        ck_assert_msg(d_o == 0, "%s: %zu attention outputs differ", label, d_o);
                        ck_assert_msg(d_y == 0, "%s: %zu of %lld products differ", label, d_y,
                                      (long long)(n_tok * ne1));
                        for (int ref = 0; ref < 2; ref++)
                            free(yr[ref]), free(orr[ref]);
                    }
                    st.w = NULL;
                    b.o->weight_free(b.ctx, &w);
                    free(y0);
                }
                b.o->dealloc(b.ctx, dpos), b.o->dealloc(b.ctx, dseq);
            }
        kern_gemv_configure(NULL);
        b.o->kv_free(b.ctx, &kv);
        b.o->dealloc(b.ctx, q), b.o->dealloc(b.ctx, k), b.o->dealloc(b.ctx, v);
        b.o->dealloc(b.ctx, px), b.o->dealloc(b.ctx, out), b.o->dealloc(b.ctx, zero);
        free(qh), free(kh), free(vh), free(pxh);
    }
    ops_cuda_set_attn_mma(mode0);
    ops_cuda_set_gemv(gctx, gemv0);
}
END_TEST

START_TEST(test_qk_norm_rope_cuda) {
    qk_cases((struct be){ops_cuda_get(), gctx}, cctx_g, 1e-6);
}
END_TEST

START_TEST(test_qk_attention_cuda) {
    const int mode0 = ops_cuda_set_attn_mma(3);
    qk_attention_cases((struct be){ops_cuda_get(), gctx}, (struct be){C, cctx_g}, true);
    ops_cuda_set_attn_mma(mode0);
}
END_TEST

/* matmul_silu_mul on every case of silu_mul_cases, each block size, graph replays. */
START_TEST(test_silu_mul_cuda) {
    silu_mul_cases((struct be){ops_cuda_get(), gctx}, true);
}
END_TEST

/* ---- layer_tail: the persistent decode-layer launch against the plain ops ---- */

/* The shapes and weight types of one layer_tail case. types: wq, wk, wv, wo, gate/up, down. */
struct tail_case {
    int64_t n_embd, q_dim, kv_dim, n_ff;
    int types[6];
    bool next; /* with the next layer's norm and Q/K/V */
};

/* The weights and inputs of one case on one backend. */
struct tail_io {
    struct tpi_weight w[7]; /* wq wk wv wo gate up down */
    float *att, *x, *g, *u, *h, *q, *k, *v, *ffn_norm, *attn_norm;
};

static void tail_setup(struct be b, const struct tail_case *tc, uint64_t seed,
                       struct tail_io *io, const float *att, const float *x0, const float *fn,
                       const float *an) {
    struct tu_rng r;
    tu_rng_seed(&r, seed);
    const int64_t ne0[7] = {tc->n_embd, tc->n_embd, tc->n_embd, tc->q_dim,
                            tc->n_embd, tc->n_embd, tc->n_ff};
    const int64_t ne1[7] = {tc->q_dim, tc->kv_dim, tc->kv_dim, tc->n_embd,
                            tc->n_ff,  tc->n_ff,   tc->n_embd};
    const int ty[7] = {tc->types[0], tc->types[1], tc->types[2], tc->types[3],
                       tc->types[4], tc->types[4], tc->types[5]};
    for (int i = 0; i < 7; i++) /* the same seed on both backends: the same weights */
        make_weight(b, &r, ty[i], ne0[i], ne1[i], &io->w[i]);
    io->att = bdup(b, att, (size_t)tc->q_dim * 4);
    io->x = bdup(b, x0, (size_t)tc->n_embd * 4);
    io->ffn_norm = bdup(b, fn, (size_t)tc->n_embd * 4);
    io->attn_norm = bdup(b, an, (size_t)tc->n_embd * 4);
    io->g = b.o->alloc(b.ctx, (size_t)tc->n_ff * 4);
    io->u = b.o->alloc(b.ctx, (size_t)tc->n_ff * 4);
    io->h = b.o->alloc(b.ctx, (size_t)tc->n_embd * 4);
    io->q = b.o->alloc(b.ctx, (size_t)tc->q_dim * 4);
    io->k = b.o->alloc(b.ctx, (size_t)tc->kv_dim * 4);
    io->v = b.o->alloc(b.ctx, (size_t)tc->kv_dim * 4);
}

static void tail_free(struct be b, struct tail_io *io) {
    for (int i = 0; i < 7; i++)
        b.o->weight_free(b.ctx, &io->w[i]);
    float *bufs[] = {io->att, io->x, io->g, io->u, io->h, io->q, io->k, io->v, io->ffn_norm,
                     io->attn_norm};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        b.o->dealloc(b.ctx, bufs[i]);
}

static struct ops_layer_tail tail_args(struct tail_io *io, bool next) {
    return (struct ops_layer_tail){.att = io->att, .x = io->x, .g = io->g, .wo = &io->w[3],
                                   .w_gate = &io->w[4], .w_up = &io->w[5], .w_down = &io->w[6],
                                   .ffn_norm = io->ffn_norm, .attn_norm = next ? io->attn_norm : NULL,
                                   .wq = next ? &io->w[0] : NULL, .wk = next ? &io->w[1] : NULL,
                                   .wv = next ? &io->w[2] : NULL, .q = io->q, .k = io->k,
                                   .v = io->v, .eps = 1e-6f};
}

/* The plain ops layer_tail stands for, in its order. */
static void tail_plain(struct be b, const struct tail_case *tc, struct tail_io *io) {
    b.o->matmul_add(b.ctx, &io->w[3], io->att, io->x, 1);
    b.o->rmsnorm(b.ctx, io->x, io->ffn_norm, io->h, 1, tc->n_embd, 1e-6f);
    b.o->matmul_silu_mul(b.ctx, &io->w[4], &io->w[5], io->h, io->g, io->u, 1);
    b.o->matmul_add(b.ctx, &io->w[6], io->g, io->x, 1);
    if (tc->next) {
        b.o->rmsnorm(b.ctx, io->x, io->attn_norm, io->h, 1, tc->n_embd, 1e-6f);
        const struct tpi_weight *ws[3] = {&io->w[0], &io->w[1], &io->w[2]};
        float *ys[3] = {io->q, io->k, io->v};
        b.o->matmul_n(b.ctx, 3, ws, io->h, ys, 1);
    }
}

/* The outputs of a case: x - x0, g, q, k, v, laid end to end (n_out floats). */
static float *tail_outputs(struct be b, const struct tail_case *tc, struct tail_io *io,
                           const float *x0, size_t *n_out) {
    const size_t ne = (size_t)tc->n_embd, nf = (size_t)tc->n_ff, nq = (size_t)tc->q_dim,
                 nk = (size_t)tc->kv_dim;
    const size_t n = ne + nf + (tc->next ? nq + 2 * nk : 0);
    float *o = malloc(n * 4);
    bget(b, o, io->x, ne * 4);
    for (size_t i = 0; i < ne; i++)
        o[i] -= x0[i];
    bget(b, o + ne, io->g, nf * 4);
    if (tc->next) {
        bget(b, o + ne + nf, io->q, nq * 4);
        bget(b, o + ne + nf + nq, io->k, nk * 4);
        bget(b, o + ne + nf + nq + nk, io->v, nk * 4);
    }
    *n_out = n;
    return o;
}

/* One case: layer_tail on the GPU against the plain GPU ops (the same int8 products, summed
 * in another order, and h's sum of squares in another order: NMSE < 1e-7 on each output
 * part) and against the CPU reference (f32 x: NMSE < 1e-3, the int8 x of two chained
 * products); a second launch and two replays of a recorded graph bitwise equal to the
 * first launch (the barriers reset themselves; the sums do not depend on timing); the
 * first phase fed from the x-quantization memo bitwise equal to it fed in the launch. */
static void check_layer_tail(const struct tail_case *tc, uint64_t seed) {
    struct be g = {ops_cuda_get(), gctx}, c = {C, cctx_g};
    struct tu_rng r;
    tu_rng_seed(&r, seed);
    float *att = rand_vec(&r, (size_t)tc->q_dim, -1, 1);
    float *x0 = rand_vec(&r, (size_t)tc->n_embd, -2, 2);
    float *fn = rand_vec(&r, (size_t)tc->n_embd, 0.5f, 1.5f);
    float *an = rand_vec(&r, (size_t)tc->n_embd, 0.5f, 1.5f);
    struct tail_io gf, gp, cp;
    tail_setup(g, tc, seed + 1, &gf, att, x0, fn, an);
    tail_setup(g, tc, seed + 1, &gp, att, x0, fn, an);
    tail_setup(c, tc, seed + 1, &cp, att, x0, fn, an);
    char label[200];
    snprintf(label, sizeof label, "layer_tail %lld/%lld/%lld/%lld %s %s %s %s %s %s%s",
             (long long)tc->n_embd, (long long)tc->q_dim, (long long)tc->kv_dim,
             (long long)tc->n_ff, quant_type_name(tc->types[0]), quant_type_name(tc->types[1]),
             quant_type_name(tc->types[2]), quant_type_name(tc->types[3]),
             quant_type_name(tc->types[4]), quant_type_name(tc->types[5]),
             tc->next ? " +next" : "");
    const struct ops_layer_tail t = tail_args(&gf, tc->next);
    ck_assert_msg(g.o->layer_tail(g.ctx, &t), "%s: not covered", label);
    assert_ok(g, label);
    tail_plain(g, tc, &gp);
    assert_ok(g, label);
    tail_plain(c, tc, &cp);
    size_t n = 0;
    float *got = tail_outputs(g, tc, &gf, x0, &n);
    float *want = tail_outputs(g, tc, &gp, x0, &n);
    float *ref = tail_outputs(c, tc, &cp, x0, &n);
    const size_t part[5] = {(size_t)tc->n_embd, (size_t)tc->n_ff, (size_t)tc->q_dim,
                            (size_t)tc->kv_dim, (size_t)tc->kv_dim};
    static const char *const names[5] = {"x", "g", "q", "k", "v"};
    size_t at = 0;
    for (int i = 0; i < (tc->next ? 5 : 2); i++) {
        const double eg = tu_nmse(got + at, want + at, part[i]);
        const double ec = tu_nmse(got + at, ref + at, part[i]);
        ck_assert_msg(eg < 1e-7, "%s: %s nmse %.3g against the plain CUDA ops", label, names[i],
                      eg);
        ck_assert_msg(ec < 1e-3, "%s: %s nmse %.3g against the CPU reference", label, names[i],
                      ec);
        at += part[i];
    }
    /* again, directly and as a graph's replays: bitwise the first launch */
    for (int rep = 0; rep < 3; rep++) {
        g.o->to_dev(g.ctx, gf.x, x0, (size_t)tc->n_embd * 4);
        g.o->sync(g.ctx);
        void *graph = NULL;
        if (rep == 0) {
            ck_assert(g.o->layer_tail(g.ctx, &t));
        } else {
            graph_start(g);
            ck_assert(g.o->layer_tail(g.ctx, &t));
            graph = graph_stop(g);
            graph_replay(g, graph);
        }
        assert_ok(g, label);
        size_t n2 = 0;
        float *again = tail_outputs(g, tc, &gf, x0, &n2);
        ck_assert_msg(n_diff(again, got, n) == 0, "%s: launch %d differs from the first", label,
                      rep + 2);
        free(again);
        if (graph) g.o->graph_free(g.ctx, graph);
    }
    /* the first phase's input from the int8 form another kernel wrote (the memo; here
     * rmsnorm's, as the attention's is in a step): bitwise what the launch's own
     * quantization of the same values gives */
    float *ones = rand_vec(&r, (size_t)tc->q_dim, 1, 1);
    float *src = bdup(g, att, (size_t)tc->q_dim * 4), *w1 = bdup(g, ones, (size_t)tc->q_dim * 4);
    float *outs[2];
    for (int memo = 1; memo >= 0; memo--) {
        g.o->to_dev(g.ctx, gf.x, x0, (size_t)tc->n_embd * 4);
        g.o->rmsnorm(g.ctx, src, w1, memo ? gf.att : gf.g, 1, tc->q_dim, 1e-6f);
        if (!memo) g.o->copy(g.ctx, gf.att, gf.g, (size_t)tc->q_dim * 4); /* forgets it */
        ck_assert_msg(ops_cuda_xq_memo_holds(g.ctx, gf.att, tc->q_dim) == (memo == 1),
                      "%s: the memo %s att", label, memo ? "does not hold" : "holds");
        ck_assert(g.o->layer_tail(g.ctx, &t));
        assert_ok(g, label);
        size_t n2 = 0;
        outs[memo] = tail_outputs(g, tc, &gf, x0, &n2);
    }
    ck_assert_msg(n_diff(outs[0], outs[1], n) == 0, "%s: phase 0 from the memo differs", label);
    free(outs[0]), free(outs[1]), free(ones);
    g.o->dealloc(g.ctx, src), g.o->dealloc(g.ctx, w1);
    free(got), free(want), free(ref);
    tail_free(g, &gf), tail_free(g, &gp), tail_free(c, &cp);
    free(att), free(x0), free(fn), free(an);
}

/* Q4_K_M's mixes (V and down Q6_K in some layers, Q4_K in the others) on a small shape and
 * on Qwen3-8B's (the ring sized for 12288 inputs), without and with the next layer; then
 * weights the kernel does not cover: false, and nothing written. */
START_TEST(test_layer_tail_cuda) {
    const int K4 = TPI_TYPE_Q4_K, K6 = TPI_TYPE_Q6_K;
    const struct tail_case cases[] = {
        {2048, 2048, 512, 4096, {K4, K4, K6, K4, K4, K6}, true},
        {2048, 2048, 512, 4096, {K4, K4, K4, K4, K4, K4}, true},
        {2048, 2048, 512, 4096, {K4, K4, K6, K4, K4, K6}, false},
        {2048, 4096, 1024, 6144, {K6, K6, K6, K6, K6, K6}, true},
        {4096, 4096, 1024, 12288, {K4, K4, K6, K4, K4, K6}, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_layer_tail(&cases[i], 900 + 7 * i);

    struct be g = {ops_cuda_get(), gctx};
    const struct tail_case bf = {512, 512, 128, 1024, {K4, K4, K4, TPI_TYPE_BF16, K4, K4}, true};
    struct tu_rng r;
    tu_rng_seed(&r, 77);
    float *att = rand_vec(&r, 512, -1, 1), *x0 = rand_vec(&r, 512, -1, 1);
    float *fn = rand_vec(&r, 512, 0.5f, 1.5f);
    struct tail_io io;
    tail_setup(g, &bf, 78, &io, att, x0, fn, fn);
    const struct ops_layer_tail t = tail_args(&io, true);
    ck_assert_msg(!g.o->layer_tail(g.ctx, &t), "layer_tail took a BF16 wo");
    float *x = malloc(512 * 4);
    bget(g, x, io.x, 512 * 4);
    ck_assert_msg(n_diff(x, x0, 512) == 0, "layer_tail wrote x while declining");
    assert_ok(g, "layer_tail (declined)");
    free(x), free(att), free(x0), free(fn);
    tail_free(g, &io);
}
END_TEST

/* A graph recorded with a kern_mmq product (9-32 rows: its k's slices and x's permuted
 * form in scratch) must refuse to replay once a plain product of more rows has regrown
 * that scratch (every buffer counts: kern_scratch_all), and, recorded again, give the
 * plain product's values bitwise. Before any plain run, recording the product must fail
 * (its scratch would be allocated inside the recording) and leave the context working.
 * Its own context: the shared one's scratch is sized by the tests before. */
START_TEST(test_graph_mmq_stale_cuda) {
    const struct ops *G = ops_cuda_get();
    struct ops_config cfg = {2, 0};
    struct tpi_error err;
    tpi_err_clear(&err);
    struct ops_ctx *ctx = NULL;
    ck_assert_msg(G->init(&ctx, &cfg, &err) == TPI_OK, "init: %s", err.msg);
    const struct be b = {G, ctx};
    struct tu_rng r;
    tu_rng_seed(&r, 1700);
    const int64_t ne0 = 1024, ne1 = 256, small = 12, big = 32;
    const size_t ny = (size_t)(small * ne1);
    struct tpi_weight w;
    make_weight(b, &r, TPI_TYPE_Q4_K, ne0, ne1, &w);
    float *xh = rand_vec(&r, (size_t)(big * ne0), -2, 2);
    float *x = bdup(b, xh, (size_t)(big * ne0) * 4);
    float *y = G->alloc(ctx, (size_t)(big * ne1) * 4), *junk = rand_vec(&r, ny, -2, 2);
    float *ref = malloc(ny * 4), *got = malloc(ny * 4);
    graph_start(b);
    G->matmul(ctx, &w, x, y, small);
    void *none = NULL;
    ck_assert_msg(G->graph_end(ctx, &none, &err) != TPI_OK && !none &&
                      strstr(err.msg, "while a graph is recorded"),
                  "recording a product whose scratch is not there yet: %s", err.msg);
    tpi_err_clear(&err);
    G->matmul(ctx, &w, x, y, small); /* plainly: the scratch sized for 12 rows */
    bget(b, ref, y, ny * 4);
    graph_start(b);
    G->matmul(ctx, &w, x, y, small);
    void *graph = graph_stop(b);
    graph_replay(b, graph);
    G->matmul(ctx, &w, x, y, big); /* more rows: kern_mmq's scratch regrown */
    bool launched = true;
    ck_assert_msg(G->graph_launch(ctx, graph, &launched, &err) == TPI_OK, "graph_launch: %s",
                  err.msg);
    ck_assert_msg(!launched, "the graph replayed after kern_mmq's scratch was regrown");
    G->graph_free(ctx, graph);
    graph_start(b);
    G->matmul(ctx, &w, x, y, small);
    graph = graph_stop(b);
    G->to_dev(ctx, y, junk, ny * 4); /* something else in y first */
    graph_replay(b, graph);
    bget(b, got, y, ny * 4);
    const size_t d = n_diff(got, ref, ny);
    ck_assert_msg(d == 0, "the graph recorded again: %zu of %zu outputs differ", d, ny);
    assert_ok(b, "graph after kern_mmq's scratch regrew");
    G->graph_free(ctx, graph);
    G->weight_free(ctx, &w);
    G->dealloc(ctx, x), G->dealloc(ctx, y);
    free(xh), free(junk), free(ref), free(got);
    G->free(&ctx);
}
END_TEST

/* Whether the bf16 form's producers are on and kern_mmq's Q4_K raw kernels read x
 * permuted at 9..32 rows: the defaults, which none of the knobs that change them
 * overrides here. */
static bool xp_memo_expected(void) {
    static const char *knobs[] = {"TPI_XP_MEMO", "TPI_MMQ_XP", "TPI_MMQ_RAW", "TPI_MMQ"};
    for (size_t i = 0; i < sizeof knobs / sizeof knobs[0]; i++)
        if (getenv(knobs[i])) return false;
    return true;
}

/* The bf16 forms' memo (bench/NOTES.md change 161): rmsnorm and the batch silu*mul (the
 * second half of matmul_silu_mul above 8 rows) write their output rounded to bf16 in
 * kern_mmq's staging orders (Q4_K's, Q6_K's 8-block groups'), which the 9..32-row raw
 * product after them reads instead of rounding x itself. On a fresh context, for 9, 17
 * and 32 rows: no form is written before a raw product has read one; then each product
 * (Q4_K and Q6_K after rmsnorm, Q4_K after rmsnorm in place, Q4_K and Q6_K after
 * silu*mul, and Q4_K after rmsnorm with a Q6_K product of another x in between, whose
 * own permute writes over the forms' buffer) must equal, bitwise, the same product
 * rounding x itself (the memo broken by an add of zeros), and the memo must hold both
 * forms of each producer's output; the norm and its products recorded in a graph and
 * replayed on new x must give the plain values of the new x. */
START_TEST(test_xp_memo_cuda) {
    const struct ops *G = ops_cuda_get();
    struct ops_config cfg = {2, 0};
    struct tpi_error err;
    tpi_err_clear(&err);
    const bool want = xp_memo_expected();
    const int64_t ne0 = 2048, n_ff = 2048, ne1 = 96; /* Q6_K's groups: rows of 2048 */
    static const int64_t rows[] = {9, 17, 32};
    enum { N_STEP = 6 };
    static const char *step[N_STEP] = {"rmsnorm, Q4_K",   "rmsnorm, Q6_K",   "rmsnorm in place",
                                       "silu*mul, Q4_K", "silu*mul, Q6_K", "Q6_K between"};
    for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++) {
        const int64_t nr = rows[ri];
        struct ops_ctx *ctx = NULL;
        ck_assert_msg(G->init(&ctx, &cfg, &err) == TPI_OK, "init: %s", err.msg);
        const struct be b = {G, ctx};
        struct tu_rng r;
        tu_rng_seed(&r, 1800 + (uint64_t)nr);
        const size_t nx = (size_t)(nr * ne0), nf = (size_t)(nr * n_ff), ny = (size_t)(nr * ne1);
        struct tpi_weight wq, w6, wg, wu, wd, wd6;
        make_weight(b, &r, TPI_TYPE_Q4_K, ne0, ne1, &wq);
        make_weight(b, &r, TPI_TYPE_Q6_K, ne0, ne1, &w6);
        make_weight(b, &r, TPI_TYPE_Q4_K, ne0, n_ff, &wg);
        make_weight(b, &r, TPI_TYPE_Q4_K, ne0, n_ff, &wu);
        make_weight(b, &r, TPI_TYPE_Q4_K, n_ff, ne1, &wd);
        make_weight(b, &r, TPI_TYPE_Q6_K, n_ff, ne1, &wd6);
        float *xh = rand_vec(&r, nx, -2, 2), *x2h = rand_vec(&r, nx, -2, 2);
        float *nw = rand_vec(&r, (size_t)ne0, 0.5f, 1.5f);
        float *x = bdup(b, xh, nx * 4), *px = bdup(b, x2h, nx * 4), *gw = bdup(b, nw, ne0 * 4);
        float *h = G->alloc(ctx, nx * 4), *zero = G->alloc(ctx, TPI_MAX(nx, nf) * 4);
        float *g = G->alloc(ctx, nf * 4), *u = G->alloc(ctx, nf * 4);
        float *y = G->alloc(ctx, ny * 4), *y6 = G->alloc(ctx, ny * 4);
        float *res[2][N_STEP];
        G->rmsnorm(ctx, x, gw, h, nr, ne0, 1e-6f);
        ck_assert_msg(ops_cuda_xp_memo_forms(ctx, h, (int64_t)nx) == 0,
                      "%lld rows: a form written before any product read one", (long long)nr);
        G->matmul(ctx, &wq, h, y, nr); /* the first raw products: the forms have readers */
        G->matmul(ctx, &w6, h, y, nr);
        for (int v = 0; v < 2; v++) { /* v 0: the memo's forms; v 1: x rounded by the product */
            for (int k = 0; k < N_STEP; k++) {
                float *in = h;
                int64_t n_in = (int64_t)nx;
                const struct tpi_weight *w = k == 1 ? &w6 : &wq;
                float *hx = NULL;
                if (k == 2) {
                    hx = bdup(b, xh, nx * 4);
                    G->rmsnorm(ctx, hx, gw, hx, nr, ne0, 1e-6f);
                    in = hx;
                } else if (k == 3 || k == 4) {
                    G->rmsnorm(ctx, x, gw, h, nr, ne0, 1e-6f);
                    G->matmul_silu_mul(ctx, &wg, &wu, h, g, u, nr);
                    in = g, n_in = (int64_t)nf, w = k == 3 ? &wd : &wd6;
                } else {
                    G->rmsnorm(ctx, x, gw, h, nr, ne0, 1e-6f);
                }
                if (v == 0 && want)
                    ck_assert_msg(ops_cuda_xp_memo_forms(ctx, in, n_in) == 3,
                                  "%lld rows, %s: the memo holds forms %d of the output, not 3",
                                  (long long)nr, step[k], ops_cuda_xp_memo_forms(ctx, in, n_in));
                if (v) {
                    G->add(ctx, in, zero, n_in);
                    ck_assert(ops_cuda_xp_memo_forms(ctx, in, n_in) == 0);
                }
                if (k == 5) G->matmul(ctx, &w6, px, y6, nr);
                G->matmul(ctx, w, in, y, nr);
                res[v][k] = malloc(ny * 4);
                bget(b, res[v][k], y, ny * 4);
                if (hx) G->dealloc(ctx, hx);
            }
        }
        for (int k = 0; k < N_STEP; k++) {
            const size_t d = n_diff(res[0][k], res[1][k], ny);
            ck_assert_msg(d == 0, "%lld rows, %s: %zu of %zu outputs differ from the product "
                          "rounding x itself", (long long)nr, step[k], d, ny);
            free(res[0][k]), free(res[1][k]);
        }
        /* recorded: the norm writes the forms inside the graph, the products read them */
        float *ref = malloc(2 * ny * 4), *got = malloc(2 * ny * 4);
        for (int rec = 0; rec < 2; rec++) { /* plainly first: the scratch is there */
            if (rec) graph_start(b);
            G->rmsnorm(ctx, x, gw, h, nr, ne0, 1e-6f);
            G->matmul(ctx, &wq, h, y, nr);
            G->matmul(ctx, &w6, h, y6, nr);
        }
        void *graph = graph_stop(b);
        G->to_dev(ctx, x, x2h, nx * 4); /* new x */
        graph_replay(b, graph);
        bget(b, got, y, ny * 4);
        bget(b, got + ny, y6, ny * 4);
        G->rmsnorm(ctx, x, gw, h, nr, ne0, 1e-6f);
        G->add(ctx, h, zero, (int64_t)nx);
        G->matmul(ctx, &wq, h, y, nr);
        bget(b, ref, y, ny * 4);
        G->add(ctx, h, zero, (int64_t)nx);
        G->matmul(ctx, &w6, h, y6, nr);
        bget(b, ref + ny, y6, ny * 4);
        const size_t d = n_diff(got, ref, 2 * ny);
        ck_assert_msg(d == 0, "%lld rows, replayed on new x: %zu of %zu outputs differ",
                      (long long)nr, d, 2 * ny);
        assert_ok(b, "xp memo");
        G->graph_free(ctx, graph);
        struct tpi_weight *ws[6] = {&wq, &w6, &wg, &wu, &wd, &wd6};
        for (int i = 0; i < 6; i++)
            G->weight_free(ctx, ws[i]);
        float *bufs[9] = {x, px, gw, h, zero, g, u, y, y6};
        for (int i = 0; i < 9; i++)
            G->dealloc(ctx, bufs[i]);
        free(xh), free(x2h), free(nw), free(ref), free(got);
        G->free(&ctx);
    }
}
END_TEST

static int run_cuda(void) {
    const struct ops *G = ops_cuda_get();
    int n_devices = 0;
    if (!G || !ops_cuda_available(&n_devices)) {
        fprintf(stderr, "SKIP: no usable GPU\n");
        return TU_SKIP;
    }
    setenv("CK_FORK", "no", 1); /* a CUDA context does not survive fork */
    setenv("TPI_XQ_MEMO", "1", 1); /* the memo producers (the default: all) under test */
    setenv("TPI_LAYER_TAIL", "1", 1); /* the persistent layer tail (opt-in) under test */
    struct ops_config cfg = {2, 0};
    struct tpi_error err;
    tpi_err_clear(&err);
    if (G->init(&gctx, &cfg, &err) != TPI_OK || C->init(&cctx_g, &cfg, &err) != TPI_OK) {
        fprintf(stderr, "init failed: %s\n", err.msg);
        return 1;
    }
    Suite *s = suite_create("ops_fused_cuda");
    TCase *tc = tcase_create("cuda");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_fused_matmul_cuda);
    tcase_add_test(tc, test_qk_norm_rope_cuda);
    tcase_add_test(tc, test_qk_attention_cuda);
    tcase_add_test(tc, test_xq_memo_cuda);
    tcase_add_test(tc, test_xq_memo_attn_cuda);
    tcase_add_test(tc, test_silu_mul_cuda);
    tcase_add_test(tc, test_layer_tail_cuda);
    tcase_add_test(tc, test_graph_mmq_stale_cuda);
    tcase_add_test(tc, test_xp_memo_cuda);
    suite_add_tcase(s, tc);
    const int rc = tu_run_suite(s);
    C->free(&cctx_g);
    G->free(&gctx);
    return rc;
}
#endif

int main(int argc, char **argv) {
    const char *group = argc > 1 ? argv[1] : "cpu";
    if (strcmp(group, "cuda") == 0) {
#ifdef TPI_HAVE_CUDA
        return run_cuda();
#else
        fprintf(stderr, "SKIP: built without CUDA\n");
        return TU_SKIP;
#endif
    }
    if (strcmp(group, "cpu") != 0) {
        fprintf(stderr, "unknown group '%s' (cpu or cuda)\n", group);
        return 2;
    }
    Suite *s = suite_create("ops_fused");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_fused_matmul_cpu);
    tcase_add_test(tc, test_qk_norm_rope_cpu);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
