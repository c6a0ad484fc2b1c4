/*
 * kern_gemv.cu — the v3 decode matrix-vector path (TPI_GEMV=v3, or
 * ops_cuda_set_gemv): y(n_rows, ne1) = x(n_rows, ne0) * W^T (or y +=) for n_rows <= 8.
 *
 * Quantized weights (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K to Q6_K, IQ4_NL, IQ4_XS): x is first
 * quantized to int8 in blocks of 32 values with an f32 scale d and d * (sum of the block's int8
 * values) (kern_gemv_v3_prepare: one small kernel, shareable by several weights). The weight bytes
 * are dotted with the int8 x through __dp4a (4 byte products per instruction, exact integer sums),
 * block scales applied per 16-64 values, and a warp shuffle sums a row. Cost: x is rounded to 8
 * bits per 32-value block (relative error ~2^-8 per value, normalized squared error of y ~1e-5),
 * llama.cpp's mmvq level. BF16/F16 weights keep f32 x (exact as the v2 kernels), 8 values per item.
 *
 * A warp (or 2-4 warps of a block, for few rows) takes one weight row; every lane
 * loads a batch of its pieces of the row before the first dot. Three ways to cut a row
 * among lanes and read x, chosen by the `kind` knob (knobs below):
 * - kind a: *items* (a weight block, or a quarter of a K-quant block, 32-64 values);
 *   lane l takes item l, so x, which every lane reads for its own values, is read in
 *   16-byte pieces spread over 1-2 KB per load instruction (8-16 L1 wavefronts each).
 *   Measured on the H200 (graph replays, 2026-11-29): the time grows almost linearly
 *   with the number of x rows, so L1 traffic for x, not DRAM, is the limit (Q4_K
 *   4096->12288: 2.07 TB/s with 1 row, 0.45 with 8; Q8_0 up to 4.5 at 1 row);
 * - kind b: *units* of 16 values; lane l takes unit l, so an x load instruction reads
 *   512 contiguous bytes; but per-unit scale decoding costs more instructions: 1.2-1.9x
 *   kind a with 8 rows for Q4_K/Q6_K, 0.7-1.0x with 1 row;
 * - kind p: kind a's items and instructions, but x read from a permuted copy (prepare
 *   writes one per item shape) in which the 32 lanes' pieces are contiguous: the x
 *   wavefronts of kind a divided by 2-4 at kind a's instruction count; the default
 *   except for Q4_K/Q6_K with 5-8 x rows, which take kind b (the kind knob below).
 * Two launches copy their rows into shared memory with cp.async instead of loading them
 * into registers: Q4_K, Q5_K and grouped Q4_0 gate/up (gv_glu_ring_kernel, a ring of
 * row pairs) and such a wo right after a decode attention that lets it in at its start
 * (gv_ring1_kernel, every row copied before the wait); their sums are kind p's.
 * All compute the same products (the same int8 x, exact integer dp4a sums); only the
 * float grouping and summation order differ between kinds, and each is fixed (never
 * timing-dependent): each output is written by one lane after a fixed shuffle tree and
 * a fixed-order sum over a row's warps, so `accumulate` (y +=) is race-free and results
 * are deterministic.
 *
 * Types and shapes this path does not cover return false and the caller takes the v2
 * kernels (kern_matmul.cu).
 *
 * Files: this one holds the public entries, the knobs, x's quantization and the host
 * emulation; kern_gemv.cuh the kernels; kern_gemv_launch.cuh the launches, instantiated
 * per weight type by seven parts (kern_gemv_q8.cu, _q4, _q5, _k, _q6, _k2, _iq4) that the
 * build compiles at once (one file took ~165 s on two cores; the longest part takes ~60 s).
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern_common.cuh"
#include "kern_gemv.cuh"
#include "kern_quant.cuh"
#include "kern_xq.cuh"

/* x (n_vals values, rows of ne0 % 32 == 0) to int8 blocks of 32: a warp per block,
 * a lane per value. d = amax / 127, q = round(x / d), ds = (d, d * sum q). q also goes
 * to kind p's three permuted copies (gv_xlayout_of: at fixed offsets after xq; a few
 * KB each, for every weight type that may read this x). */
__global__ void gv_quantize_x_kernel(const float *__restrict__ x, int8_t *__restrict__ xq,
                                     float2 *__restrict__ ds, int64_t n_vals, int ne0,
                                     gv_xlayout lay) {
    gv_grid_dep_wait(); /* x is the previous kernel's output */
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_vals) return; /* n_vals % 32 == 0: whole warps leave together */
    const int q = kern_q8_block(x[i], i, xq, ds);
    gv_perm_store(q, i, ne0, lay, xq);
}

static const gv_cfg GV_DEFAULT = {0, 1, 1, 0, 0, 0, GV_X8_BOUND_DEFAULT, 1, 2, 0};

/* Apply "key=value" pairs separated by ',' or ' ' to *c; false on an unknown key or a
 * bad value (c is then partly updated). */
static bool gv_cfg_parse(gv_cfg *c, const char *spec) {
    while (*spec) {
        while (*spec == ',' || *spec == ' ')
            spec++;
        if (!*spec) break;
        char key[16];
        int n = 0;
        while (*spec && *spec != '=' && *spec != ',' && *spec != ' ' && n < 15)
            key[n++] = (char)tolower((unsigned char)*spec++);
        key[n] = 0;
        if (*spec != '=') return false;
        const char *v = ++spec;
        while (*spec && *spec != ',' && *spec != ' ')
            spec++;
        if (strcmp(key, "kind") == 0) {
            const char k = (char)tolower((unsigned char)*v);
            if (spec - v == 4 && strncmp(v, "auto", 4) == 0)
                c->kind = 0;
            else if ((k == 'a' || k == 'b' || k == 'p') && spec - v == 1)
                c->kind = k;
            else
                return false;
        } else if (strcmp(key, "batch") == 0) {
            if ((*v != '1' && *v != '2') || spec - v != 1) return false;
            c->batch = *v - '0';
        } else if (strcmp(key, "wps") == 0) {
            char *end;
            const long n = strtol(v, &end, 10);
            if (spec - v == 4 && strncmp(v, "auto", 4) == 0)
                c->wps = 0;
            else if (end == spec && spec > v && n >= 8 && n <= 64)
                c->wps = (int)n;
            else
                return false;
        } else if (strcmp(key, "rpw") == 0) {
            if (spec - v == 4 && strncmp(v, "auto", 4) == 0)
                c->rpw = 0;
            else if ((*v == '1' || *v == '2' || *v == '4') && spec - v == 1)
                c->rpw = *v - '0';
            else
                return false;
        } else if (strcmp(key, "kbound") == 0 || strcmp(key, "x8bound") == 0) {
            const bool k = key[0] == 'k';
            char *end;
            const long n = strtol(v, &end, 10);
            if (end != spec || spec == v ||
                (k ? n != 0 && n != 6 && n != 8 && n != 10 : n != 4 && n != 5 && n != 6 && n != 8))
                return false;
            *(k ? &c->kbound : &c->x8bound) = (int)n;
        } else if (strcmp(key, "ring1") == 0) {
            if (*v < '0' || *v > '3' || spec - v != 1) return false;
            c->ring1 = *v - '0';
        } else if (strcmp(key, "pdl") == 0 || strcmp(key, "ypre") == 0 ||
                   strcmp(key, "ring1all") == 0) {
            if ((*v != '0' && *v != '1') || spec - v != 1) return false;
            *(key[0] == 'p' ? &c->pdl : key[0] == 'y' ? &c->ypre : &c->ring1all) = *v == '1';
        } else {
            return false;
        }
    }
    return true;
}

static gv_cfg gv_cfg_from_env(void) {
    gv_cfg c = GV_DEFAULT;
    static const char *const keys[][2] = {
        {"kind", "TPI_GEMV_KIND"},       {"batch", "TPI_GEMV_BATCH"},
        {"pdl", "TPI_GEMV_PDL"},         {"wps", "TPI_GEMV_WPS"},
        {"rpw", "TPI_GEMV_RPW"},         {"kbound", "TPI_GEMV_KBOUND"},
        {"x8bound", "TPI_GEMV_X8BOUND"}, {"ypre", "TPI_GEMV_YPRE"},
        {"ring1", "TPI_GEMV_RING1"},     {"ring1all", "TPI_GEMV_RING1ALL"}};
    for (const auto &k : keys) {
        const char *v = getenv(k[1]);
        if (!v || !*v) continue;
        char spec[64];
        snprintf(spec, sizeof spec, "%s=%s", k[0], v);
        gv_cfg t = c;
        if (gv_cfg_parse(&t, spec))
            c = t;
        else
            tpi_log(TPI_LOG_WARN, "%s=%s is not a valid setting: ignored", k[1], v);
    }
    return c;
}

static gv_cfg &gv_config(void) {
    static gv_cfg c = gv_cfg_from_env(); /* thread-safe one-time initialization */
    return c;
}

int kern_gemv_configure(const char *spec) {
    gv_cfg c = gv_cfg_from_env();
    if (spec && !gv_cfg_parse(&c, spec)) return -1;
    gv_config() = c;
    return 0;
}

void kern_gemv_describe(char *buf, size_t n) {
    const gv_cfg &c = gv_config();
    char wps[8] = "auto", rpw[8] = "auto", kind[8] = "auto";
    if (c.wps) snprintf(wps, sizeof wps, "%d", c.wps);
    if (c.rpw) snprintf(rpw, sizeof rpw, "%d", c.rpw);
    if (c.kind) snprintf(kind, sizeof kind, "%c", c.kind);
    snprintf(buf, n,
             "kind=%s,batch=%d,pdl=%d,wps=%s,rpw=%s,kbound=%d,x8bound=%d,ypre=%d,ring1=%d,"
             "ring1all=%d",
             kind, c.batch, c.pdl, wps, rpw, c.kbound, c.x8bound, c.ypre, c.ring1, c.ring1all);
}

/* Whether the v3 path covers w for n_rows rows (shape and weight alignment; x's
 * alignment is checked where it matters). */
static bool gv_covers(const struct tpi_weight *w, int n_rows) {
    if (n_rows < 1 || n_rows > 8 || w->ne0 <= 0 || w->ne1 <= 0) return false;
    if (w->ne0 > INT32_MAX || w->ne1 > INT32_MAX) return false;
    const uintptr_t data = (uintptr_t)w->data;
    const bool a16 = (data & 15) == 0 && (w->row_bytes & 15) == 0;
    bool ok = false;
    gv_dispatch(kern_wtype(w), [&](auto type_c) {
        constexpr int T = decltype(type_c)::value;
        if constexpr (T == TPI_TYPE_BF16 || T == TPI_TYPE_F16) {
            ok = a16 && w->ne0 % 8 == 0;
        } else {
            if (w->ne0 % gv<T>::BLK != 0) return;
            /* 16-byte loads in the blocks */
            if ((T == TPI_TYPE_Q4_K || T == TPI_TYPE_Q5_K || T == KERN_TYPE_Q8_0X8 ||
                 T == KERN_TYPE_Q4_0X8 || T == KERN_TYPE_Q6_KX8 || T == KERN_TYPE_Q3_KX8) &&
                !a16)
                return;
            /* gv_ld_a2 rounds down to 4 bytes, gv_win_load to 16 */
            ok = (data & 15) == 0;
        }
    });
    return ok;
}

bool kern_gemv_v3_prepare(struct ops_ctx *ctx, const float *x, int n_rows, int64_t ne0,
                          cudaStream_t stream, struct kern_gemv_x *gx) {
    if (n_rows < 1 || n_rows > 8 || ne0 <= 0 || ne0 % GV_QK != 0 || ne0 > INT32_MAX) return false;
    /* int8 x, its (d, d*sum) pairs and kind p's permuted copies: 256-byte aligned parts
     * of one scratch (gv_xlayout_of) */
    const size_t n_vals = (size_t)n_rows * (size_t)ne0;
    const gv_xlayout lay = gv_xlayout_of(n_rows, ne0);
    uint8_t *s = (uint8_t *)kern_scratch_get(ctx, &ctx->q8, lay.n_bytes, "cuda matmul (v3)");
    if (!s) return false; /* failure recorded */
    *gx = (struct kern_gemv_x){x,
                               (const int8_t *)s,
                               (const float2 *)(s + lay.ds_off),
                               n_rows,
                               ne0,
                               (const int8_t *)(s + lay.b32_off)};
    kern_launch(gv_config().pdl != 0, gv_quantize_x_kernel, dim3((unsigned)((n_vals + 127) / 128)),
                dim3(128), 0, stream, x, (int8_t *)s, (float2 *)(s + lay.ds_off), (int64_t)n_vals,
                (int)ne0, lay);
    return LAUNCH_OK(ctx, "cuda matmul (v3 x quantization)");
}

/* Whether the prepared x gx suits w (coverage, row length, the form of x it reads). */
static bool gv_x_suits(const struct tpi_weight *w, const struct kern_gemv_x *gx) {
    if (!gv_covers(w, gx->n_rows) || gx->ne0 != w->ne0) return false;
    if (!gv_is_elem(w->type)) return gx->xq && gx->ds;
    return gx->x && ((uintptr_t)gx->x & 15) == 0; /* float4 loads of x rows (ne0 % 8 == 0) */
}

/* The launch for ws's type (its part's gv_run_type). */
static void gv_run(struct ops_ctx *ctx, int n, const struct tpi_weight *const *ws,
                   const struct kern_gemv_x *gx, float *const *ys, bool accumulate,
                   cudaStream_t stream, const gv_cfg &c) {
    gv_dispatch(kern_wtype(ws[0]), [&](auto type_c) {
        gv_run_type<decltype(type_c)::value>(ctx, n, ws, gx, ys, accumulate, stream, c);
    });
}
bool kern_gemv_v3_run(struct ops_ctx *ctx, const struct tpi_weight *w, const struct kern_gemv_x *gx,
                      float *y, bool accumulate, cudaStream_t stream) {
    if (!gv_x_suits(w, gx)) { /* w runs elsewhere: the prefetch and wo's verdict lapse */
        ctx->gemv_prefetch = ctx->after_attn = false;
        return false;
    }
    gv_run(ctx, 1, &w, gx, &y, accumulate, stream, gv_config());
    ctx->gemv_prefetch = false; /* taken (or not wanted) by this launch's segments */
    LAUNCH_OK(ctx, "cuda matmul (v3)");
    return true;
}

bool kern_gemv_v3_run_n(struct ops_ctx *ctx, int n, const struct tpi_weight *const *ws,
                        const struct kern_gemv_x *gx, float *const *ys, cudaStream_t stream) {
    if (n < 1 || n > OPS_MAX_FUSED) return false;
    for (int i = 0; i < n; i++)
        if (!gv_x_suits(ws[i], gx) || kern_wtype(ws[i]) != kern_wtype(ws[0]) ||
            ws[i]->row_bytes != ws[0]->row_bytes)
            return false;
    const gv_cfg c = gv_config();
    bool unit = false; /* kind b: one weight a launch */
    gv_dispatch(kern_wtype(ws[0]), [&](auto type_c) {
        constexpr int T = decltype(type_c)::value;
        unit = gx->n_rows > 4 ? gv_kind_of<T, 8>(gx, c) == 'b' : gv_kind_of<T, 1>(gx, c) == 'b';
    });
    if (n > 1 && unit) return false;
    gv_run(ctx, n, ws, gx, ys, false, stream, c);
    ctx->gemv_prefetch = false;
    LAUNCH_OK(ctx, "cuda matmul (v3)");
    return true;
}

bool kern_gemv_v3_run_mix(struct ops_ctx *ctx, int n, const struct tpi_weight *const *ws,
                          const struct kern_gemv_x *gx, float *const *ys, int mix,
                          cudaStream_t stream) {
    if (mix <= 0 || n < 2 || n > OPS_MAX_FUSED || gx->n_rows != 1 || !gx->xp) return false;
    const gv_cfg c = gv_config();
    if ((c.kind && c.kind != 'p') || c.rpw > 1) return false;
    /* side 0: the weights of one 64-value K-quant (Q4_K, or Q5_K: Q/K/V of a Q5_K_M layer
     * whose V has more bits), side 1: Q6_K's groups */
    const struct tpi_weight *sw[2][OPS_MAX_FUSED];
    float *sy[2][OPS_MAX_FUSED];
    int cnt[2] = {0, 0}, k0 = -1;
    for (int i = 0; i < n; i++) {
        const int t = kern_wtype(ws[i]);
        if ((t == TPI_TYPE_Q4_K || t == TPI_TYPE_Q5_K) && k0 < 0) k0 = t;
        const int side = t == k0 ? 0 : t == KERN_TYPE_Q6_KX8 ? 1 : -1;
        if (side < 0 || !gv_x_suits(ws[i], gx) || ws[i]->ne0 != ws[0]->ne0) return false;
        if (cnt[side] && ws[i]->row_bytes != sw[side][0]->row_bytes) return false;
        sw[side][cnt[side]] = ws[i];
        sy[side][cnt[side]++] = ys[i];
    }
    if (!cnt[0] || !cnt[1]) return false;
    const int ne0 = (int)ws[0]->ne0;
    if (k0 == TPI_TYPE_Q4_K)
        gv_mix_launch<TPI_TYPE_Q4_K>(ctx, c, sw, sy, cnt, ne0, gx, mix, stream);
    else
        gv_mix_launch<TPI_TYPE_Q5_K>(ctx, c, sw, sy, cnt, ne0, gx, mix, stream);
    LAUNCH_OK(ctx, "cuda matmul (v3, two types)");
    return true;
}

bool kern_gemv_v3_glu_ok(const struct tpi_weight *wg, const struct tpi_weight *wu,
                         const struct kern_gemv_x *gx) {
    if (gx->n_rows != 1 || kern_wtype(wg) != kern_wtype(wu) || wg->row_bytes != wu->row_bytes ||
        wg->ne0 != wu->ne0 || wg->ne1 != wu->ne1 || !gv_x_suits(wg, gx) || !gv_x_suits(wu, gx))
        return false;
    bool ok = false;
    const gv_cfg c = gv_config();
    gv_dispatch(kern_wtype(wg), [&](auto type_c) {
        constexpr int T = decltype(type_c)::value;
        ok = gv_is_elem(T) ? wg->ne1 % GV_WARPS == 0
                           : wg->ne1 % 32 == 0 && gv_kind_of<T, 1>(gx, c) != 'b';
    });
    return ok;
}

bool kern_gemv_v3_run_glu(struct ops_ctx *ctx, const struct tpi_weight *wg,
                          const struct tpi_weight *wu, const struct kern_gemv_x *gx, float *g,
                          float *u, int8_t *oq, float2 *ods, int warps, cudaStream_t stream) {
    if (!kern_gemv_v3_glu_ok(wg, wu, gx)) return false;
    const gv_cfg c = gv_config();
    gv_dispatch(kern_wtype(wg), [&](auto type_c) {
        gv_glu_type<decltype(type_c)::value>(ctx, wg, wu, gx, g, u, oq, ods, warps, stream, c);
    });
    LAUNCH_OK(ctx, "cuda matmul_silu_mul (v3)");
    return true;
}

bool kern_gemv_v3(struct ops_ctx *ctx, const struct tpi_weight *w, const float *x, float *y,
                  int n_rows) {
    if (!gv_covers(w, n_rows)) return false;
    struct kern_gemv_x gx = {x, NULL, NULL, n_rows, w->ne0, NULL};
    if (!gv_is_elem(w->type)) {
        if (!kern_gemv_v3_prepare(ctx, x, n_rows, w->ne0, ctx->stream, &gx))
            return true; /* ne0 % 32 == 0 here: a failure was recorded; nothing more to launch */
    } else if (((uintptr_t)x & 15) != 0) {
        return false;
    }
    return kern_gemv_v3_run(ctx, w, &gx, y, false, ctx->stream);
}

/* ------------------------------------------------------- test and bench hooks */

void *kern_gemv_test_prepare(struct ops_ctx *ctx, const float *x, int n_rows, int64_t ne0,
                             void *stream) {
    struct kern_gemv_x *gx = (struct kern_gemv_x *)calloc(1, sizeof *gx);
    if (!gx) return NULL;
    if (!kern_gemv_v3_prepare(ctx, x, n_rows, ne0, stream ? (cudaStream_t)stream : ctx->stream,
                              gx)) {
        free(gx);
        return NULL;
    }
    return gx;
}

int kern_gemv_test_run(struct ops_ctx *ctx, const struct tpi_weight *w, const void *gx, float *y,
                       int accumulate, void *stream) {
    return kern_gemv_v3_run(ctx, w, (const struct kern_gemv_x *)gx, y, accumulate != 0,
                            stream ? (cudaStream_t)stream : ctx->stream)
               ? 1
               : 0;
}

int kern_gemv_test_run_n(struct ops_ctx *ctx, int n, const struct tpi_weight *const *ws,
                         const void *gx, float *const *ys, void *stream) {
    return kern_gemv_v3_run_n(ctx, n, ws, (const struct kern_gemv_x *)gx, ys,
                              stream ? (cudaStream_t)stream : ctx->stream)
               ? 1
               : 0;
}

int kern_gemv_test_run_mix(struct ops_ctx *ctx, int n, const struct tpi_weight *const *ws,
                           const void *gx, float *const *ys, int mix, void *stream) {
    return kern_gemv_v3_run_mix(ctx, n, ws, (const struct kern_gemv_x *)gx, ys, mix,
                                stream ? (cudaStream_t)stream : ctx->stream)
               ? 1
               : 0;
}

int kern_gemv_host_regroup(int type, void *w, size_t n_bytes) {
    /* Q6_K and Q3_K: a byte map (kern_q6_k_x8_src, kern_q3_k_x8_src), a group at a time */
    auto gather = [&](auto bytes_c, int (*src)(int), int as) {
        constexpr int BYTES = decltype(bytes_c)::value;
        if (n_bytes % BYTES != 0) return -1;
        for (size_t g = 0; g < n_bytes / BYTES; g++) {
            uint8_t *p = (uint8_t *)w + g * BYTES, in[BYTES];
            memcpy(in, p, sizeof in);
            for (int o = 0; o < BYTES; o++)
                p[o] = in[src(o)];
        }
        return as;
    };
    if (type == TPI_TYPE_Q6_K)
        return gather(std::integral_constant<int, KERN_Q6_KX8_BYTES>{},
                      [](int o) { return kern_q6_k_x8_src(o); }, KERN_TYPE_Q6_KX8);
    if (type == TPI_TYPE_Q3_K)
        return gather(std::integral_constant<int, KERN_Q3_KX8_BYTES>{},
                      [](int o) { return kern_q3_k_x8_src(o); }, KERN_TYPE_Q3_KX8);
    /* Q4_0 and Q8_0: kern_x8_regroup, a group of BYTES at a time */
    auto regroup = [&](auto bytes_c, int as) {
        constexpr int BYTES = decltype(bytes_c)::value;
        if (n_bytes % BYTES != 0) return -1;
        for (size_t g = 0; g < n_bytes / BYTES; g++) {
            uint8_t *p = (uint8_t *)w + g * BYTES;
            uint32_t in[BYTES / 4], out[BYTES / 4];
            memcpy(in, p, sizeof in);
            kern_x8_regroup<BYTES>(in, out);
            memcpy(p, out, sizeof out);
        }
        return as;
    };
    if (type == TPI_TYPE_Q4_0)
        return regroup(std::integral_constant<int, KERN_Q4_0X8_BYTES>{}, KERN_TYPE_Q4_0X8);
    if (type == TPI_TYPE_Q8_0)
        return regroup(std::integral_constant<int, KERN_Q8_0X8_BYTES>{}, KERN_TYPE_Q8_0X8);
    return -1;
}

void kern_gemv_host_quantize(const float *x, int64_t n_vals, int8_t *xq, float *ds) {
    for (int64_t b = 0; b < n_vals / GV_QK; b++) {
        const float *v = x + b * GV_QK;
        float amax = 0.0f;
        for (int j = 0; j < GV_QK; j++)
            amax = fmaxf(amax, fabsf(v[j]));
        const float d = amax / 127.0f;
        int s = 0;
        for (int j = 0; j < GV_QK; j++) {
            /* __float2int_rn: round half to even, as rintf in the default mode */
            int q = amax > 0.0f ? (int)rintf(v[j] * (127.0f / amax)) : 0;
            q = q < -127 ? -127 : q > 127 ? 127 : q;
            xq[b * GV_QK + j] = (int8_t)q;
            s += q;
        }
        ds[2 * b] = d;
        ds[2 * b + 1] = d * (float)s;
    }
}

/* A kernel of kind a, b or p run on the host: per row, per warp part and lane through
 * the kernel's own row function (the same items or units, order and batches, and for one
 * x row kinds a and p the device's one-row form; kind p reads permuted copies made with
 * the device's gv_perm_*), then the same xor tree and, for wpr > 1, the same fixed-order
 * sum over the parts. */
template <int T>
static void gv_emulate_t(const uint8_t *w, size_t row_bytes, int ne0, int ne1, const int8_t *xq,
                         const float2 *ds, int nr, float *y, int kind, int wpr) {
    using Q = gv<T>;
    /* kind p: this type's permuted copy of x */
    const int xs = Q::BLK / Q::IPB == 32 ? (ne0 + GV_GS_B32 - 1) / GV_GS_B32 * GV_GS_B32
                                         : (ne0 + GV_GS_K4 - 1) / GV_GS_K4 * GV_GS_K4;
    int8_t *xp = (int8_t *)calloc((size_t)nr * xs, 1);
    for (int r = 0; r < nr; r++)
        for (int v = 0; v < ne0; v++) {
            const int at = gv_is_k4<T>   ? gv_perm_k4(v)
                           : gv_q6_items<T> ? gv_perm_q6(v)
                                         : gv_perm_b32(v);
            xp[(size_t)r * xs + at] = xq[(size_t)r * ne0 + v];
        }
    for (int row = 0; row < ne1; row++) {
        const uint8_t *wr = w + (size_t)row * row_bytes;
        float part_sum[GV_WARPS][8];
        for (int part = 0; part < wpr; part++) {
            float v[8][32];
            for (int lane = 0; lane < 32; lane++) {
                float acc[1][8] = {{0, 0, 0, 0, 0, 0, 0, 0}};
                const uint8_t *const wr1[1] = {wr};
                const int first = part * 32 + lane, step = 32 * wpr;
                if (kind == 'b') {
                    gu_row<T, 8, gu_batch<T>::U>(wr, ne0 / 16, first, step, xq, ds, ne0, nr, acc[0],
                                                 [] {});
                } else if (nr == 1) { /* the device's one-row instantiation */
                    float a1[1][1] = {{0.0f}};
                    if (kind == 'p')
                        gv_item_rows<T, 1, true, 1>(wr1, ne0 / Q::BLK * Q::IPB, first, step, xp, xs,
                                                    ds, ne0, nr, a1);
                    else
                        gv_item_rows<T, 1, false, 1>(wr1, ne0 / Q::BLK * Q::IPB, first, step, xq,
                                                     ne0, ds, ne0, nr, a1);
                    acc[0][0] = a1[0][0];
                } else if (kind == 'p')
                    gv_item_rows<T, 8, true, 1>(wr1, ne0 / Q::BLK * Q::IPB, first, step, xp, xs, ds,
                                                ne0, nr, acc);
                else
                    gv_item_rows<T, 8, false, 1>(wr1, ne0 / Q::BLK * Q::IPB, first, step, xq, ne0,
                                                 ds, ne0, nr, acc);
                for (int r = 0; r < 8; r++)
                    v[r][lane] = acc[0][r];
            }
            for (int r = 0; r < 8; r++) {
                for (int o = 16; o > 0; o >>= 1) {
                    float t[32];
                    for (int l = 0; l < 32; l++)
                        t[l] = v[r][l] + v[r][l ^ o];
                    memcpy(v[r], t, sizeof t);
                }
                part_sum[part][r] = v[r][0];
            }
        }
        for (int r = 0; r < nr; r++) {
            float s = part_sum[0][r];
            if (wpr > 1) {
                s = 0.0f;
                for (int k = 0; k < wpr; k++)
                    s += part_sum[k][r];
            }
            y[(size_t)r * ne1 + row] = s;
        }
    }
    free(xp);
}

int kern_gemv_host_emulate(int type, const void *w, size_t row_bytes, int64_t ne0, int64_t ne1,
                           const int8_t *xq, const float *ds, int n_rows, float *y, int kind,
                           int wpr) {
    if (n_rows < 1 || n_rows > 8 || (wpr != 1 && wpr != 2 && wpr != 4)) return -1;
    if (kind != 'a' && kind != 'b' && kind != 'p') return -1;
    bool ok = false;
    gv_dispatch(type, [&](auto type_c) {
        constexpr int T = decltype(type_c)::value;
        if constexpr (T != TPI_TYPE_BF16 && T != TPI_TYPE_F16) {
            if (ne0 % gv<T>::BLK != 0) return;
            gv_emulate_t<T>((const uint8_t *)w, row_bytes, (int)ne0, (int)ne1, xq,
                            (const float2 *)ds, n_rows, y, kind, wpr);
            ok = true;
        }
    });
    return ok ? 0 : -1;
}
