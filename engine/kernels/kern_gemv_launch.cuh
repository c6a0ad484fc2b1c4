/*
 * kern_gemv_launch.cuh — the v3 decode matrix-vector path's host launches as templates
 * (grid shape, kind, segments, kernel choice), included only by the per-type parts
 * (kern_gemv_q8.cu, _q4, _q5, _k, _q6, _k2, _iq4), each of which instantiates them for its
 * own types with GV_PART_TYPE (kern_gemv.cuh says why).
 */
#ifndef KERN_GEMV_LAUNCH_CUH
#define KERN_GEMV_LAUNCH_CUH

#include "kern_gemv.cuh"

/* Warps per row: split rows until the grid has >= wps warps per SM, keeping at least
 * `min_per_lane` items (kind a) or one full batch of units (kind b) per lane. */
static inline int gv_wpr(const struct ops_ctx *ctx, int wps, int64_t ne1, int64_t n_items,
                         int min_per_lane) {
    int wpr = 1;
    while (wpr < GV_WARPS && ne1 * wpr < (int64_t)ctx->n_sm * wps &&
           n_items >= (int64_t)32 * min_per_lane * (2 * wpr))
        wpr *= 2;
    return wpr;
}

/* Whether this launch's kernel gains from being let in before the decode attention ends
 * (its first blocks ask L2 for the weight): the quantized kinds a and p (Q4_K: +0.7-1.2 %,
 * runs 156 and 158), not Q8_0's held one-row kernel (-2 to -3 % when let in early, with
 * the prefetch or without it, run 158) nor Q6_K's, held the same way (not measured), nor
 * the 16-bit kernel (level, run 158). */
template <int T, int NR> static bool gv_early_gains(int kind) {
    return !gv_is_elem(T) && kind != 'b' && !(NR == 1 && (T == KERN_TYPE_Q8_0X8 || gv_is_q6<T>));
}

/* The n weights ws (into ys) as one launch's segments, each with the blocks and warps a
 * row its own launch would have (rpw weight rows a warp, wps warps an SM wanted, rows of
 * n_items items); *blocks: the launch's grid. */
static inline gv_segs gv_segs_of(const struct ops_ctx *ctx, int n,
                                 const struct tpi_weight *const *ws, float *const *ys, int rpw,
                                 int wps, int64_t n_items, unsigned *blocks) {
    gv_segs sg = {};
    sg.n = n;
    int64_t b0 = 0;
    for (int i = 0; i < n; i++) {
        const int64_t groups = (ws[i]->ne1 + rpw - 1) / rpw;
        const int wpr = gv_wpr(ctx, wps, groups, n_items, 2);
        sg.w[i] = (const uint8_t *)ws[i]->data;
        sg.y[i] = ys[i];
        sg.ne1[i] = (int)ws[i]->ne1;
        sg.wpr[i] = wpr;
        sg.b0[i] = (int)b0;
        b0 += (groups * wpr + GV_WARPS - 1) / GV_WARPS;
    }
    *blocks = (unsigned)b0;
    return sg;
}

/* Kind p's x for type T: its permuted copy at its place among prepare's (gv_xlayout_of),
 * and (*xs) that copy's row stride. */
template <int T> static const int8_t *gv_xp_of(const struct kern_gemv_x *gx, int *xs) {
    using Q = gv<T>;
    const gv_xlayout lay = gv_xlayout_of(gx->n_rows, gx->ne0);
    const size_t off = gv_is_k4<T> ? lay.k4_off : gv_q6_items<T> ? lay.q6_off : lay.b32_off;
    *xs = Q::BLK / Q::IPB == 32 ? lay.b32_stride : lay.k4_stride;
    return gx->xp + (off - lay.b32_off);
}

/* One launch for the n weights ws (type T, one row length; n > 1 only for kinds a and p:
 * kern_gemv_v3_run_n checks) into ys. */
template <int T, int NR>
static void gv_run_t(struct ops_ctx *ctx, int n, const struct tpi_weight *const *ws,
                     const struct kern_gemv_x *gx, float *const *ys, bool accumulate,
                     cudaStream_t stream, const gv_cfg &c) {
    const struct tpi_weight *w = ws[0];
    const uint8_t *data = (const uint8_t *)w->data;
    const int ne0 = (int)w->ne0, ne1 = (int)w->ne1, nr = gx->n_rows;
    const bool pdl = c.pdl != 0;
    const int kind = gv_kind_of<T, NR>(gx, c);
    if (ctx->after_attn) { /* this is wo: whether the next decode attention lets it in early */
        ctx->wo_early = gv_early_gains<T, NR>(kind);
        ctx->after_attn = false;
    }
    /* weight rows per warp: 1 for 5..8 x rows (registers), else the knob (auto: 1) */
    const int rpw = NR > 4 ? 1 : c.rpw ? c.rpw : 1;
    auto by_rpw = [&](auto f) {
        if (rpw == 4)
            f(std::integral_constant < int, NR <= 4 ? 4 : 1 > {});
        else if (rpw == 2)
            f(std::integral_constant < int, NR <= 4 ? 2 : 1 > {});
        else
            f(std::integral_constant<int, 1>{});
    };
    auto segs = [&](int wps, int64_t n_items, unsigned *blocks) {
        gv_segs sg = gv_segs_of(ctx, n, ws, ys, rpw, wps, n_items, blocks);
        sg.trigger = ctx->gemv_trigger;
        sg.ypre = c.ypre;
        if (ctx->gemv_prefetch && n == 1) { /* one chunk a multiprocessor's first block */
            const long long total = ws[0]->ne1 * (long long)ws[0]->row_bytes;
            sg.pf_blocks = ctx->n_sm;
            sg.pf_chunk = ((total + ctx->n_sm - 1) / ctx->n_sm + 127) & ~127ll;
        }
        return sg;
    };
    unsigned blocks = 0;
    if constexpr (T == TPI_TYPE_BF16 || T == TPI_TYPE_F16) {
        const gv_segs sg = segs(c.wps ? c.wps : GV_WPS_ELEM, ne0 / 8, &blocks);
        by_rpw([&](auto rw_c) {
            if (n > 1)
                kern_launch(pdl, gv_elem_kernel<T, NR, decltype(rw_c)::value, true>, dim3(blocks),
                            dim3(GV_WARPS * 32), 0, stream, sg, w->row_bytes, ne0, gx->x, nr,
                            accumulate);
            else
                kern_launch(pdl, gv_elem_kernel<T, NR, decltype(rw_c)::value, false>, dim3(blocks),
                            dim3(GV_WARPS * 32), 0, stream, sg, w->row_bytes, ne0, gx->x, nr,
                            accumulate);
        });
    } else if (kind == 'b') {
        float *y = ys[0];
        constexpr int U = gu_batch<T>::U;
        const int wpr = gv_wpr(ctx, c.wps ? c.wps : GV_WPS_QUANT, ne1, ne0 / 16, U * c.batch);
        blocks = (unsigned)(((int64_t)ne1 * wpr + GV_WARPS - 1) / GV_WARPS);
        if (c.batch == 2)
            kern_launch(pdl, gv_unit_kernel<T, NR, 2 * U>, dim3(blocks), dim3(GV_WARPS * 32), 0,
                        stream, data, w->row_bytes, ne0, ne1, gx->xq, gx->ds, y, nr, wpr,
                        accumulate);
        else
            kern_launch(pdl, gv_unit_kernel<T, NR, U>, dim3(blocks), dim3(GV_WARPS * 32), 0, stream,
                        data, w->row_bytes, ne0, ne1, gx->xq, gx->ds, y, nr, wpr, accumulate);
    } else {
        using Q = gv<T>;
        const int64_t n_items = (int64_t)(ne0 / Q::BLK) * Q::IPB;
        const gv_segs sg = segs(c.wps ? c.wps : GV_WPS_QUANT, n_items, &blocks);
        const int kb = ne0 >= GV_KBOUND_MIN_NE0 ? c.kbound : 0;
        if (kind == 'p') {
            int xs = 0;
            const int8_t *xp = gv_xp_of<T>(gx, &xs); /* the type's permuted copy */
            /* wo right after a decode attention that let it in at its start (tg128
             * +0.55 %, depth 1024 +0.9 %; after the K/V stream it cannot sit beside the
             * attention's blocks and lost 1.6 %: runs 167-168, bench/NOTES.md change 97) */
            if (NR == 1 && n == 1 && rpw == 1 && c.ring1 && !sg.trigger &&
                (c.ring1all || ctx->gemv_prefetch == 2) &&
                gv_ring1_launch<T>(ctx, pdl, w, c.ring1, sg.wpr[0], xp, gx->ds, ys[0], accumulate,
                                   stream))
                return;
            by_rpw([&](auto rw_c) {
                kern_launch(pdl,
                            gv_quant_kernel_for<T, NR, true, decltype(rw_c)::value>(kb, c.x8bound),
                            dim3(blocks), dim3(GV_WARPS * 32), 0, stream, sg, w->row_bytes, ne0, xp,
                            xs, gx->ds, nr, accumulate);
            });
        } else {
            by_rpw([&](auto rw_c) {
                kern_launch(pdl,
                            gv_quant_kernel_for<T, NR, false, decltype(rw_c)::value>(kb, c.x8bound),
                            dim3(blocks), dim3(GV_WARPS * 32), 0, stream, sg, w->row_bytes, ne0,
                            gx->xq, ne0, gx->ds, nr, accumulate);
            });
        }
    }
}
template <int T>
void gv_run_type(struct ops_ctx *ctx, int n, const struct tpi_weight *const *ws,
                 const struct kern_gemv_x *gx, float *const *ys, bool accumulate,
                 cudaStream_t stream, const gv_cfg &c) {
    switch (gx->n_rows) {
    case 1:
        gv_run_t<T, 1>(ctx, n, ws, gx, ys, accumulate, stream, c);
        break;
    case 2:
        gv_run_t<T, 2>(ctx, n, ws, gx, ys, accumulate, stream, c);
        break;
    case 3:
    case 4:
        gv_run_t<T, 4>(ctx, n, ws, gx, ys, accumulate, stream, c);
        break;
    default:
        gv_run_t<T, 8>(ctx, n, ws, gx, ys, accumulate, stream, c);
        break;
    }
}

/* gv_mix_launch: the two-type launch with side 0 of 64-value K-quant items (Q4_K or Q5_K,
 * type K). */
template <int K>
void gv_mix_launch(struct ops_ctx *ctx, const gv_cfg &c,
                   const struct tpi_weight *(&sw)[2][OPS_MAX_FUSED], float *(&sy)[2][OPS_MAX_FUSED],
                   const int (&cnt)[2], int ne0, const struct kern_gemv_x *gx, int mix,
                   cudaStream_t stream) {
    const int wps = c.wps ? c.wps : GV_WPS_QUANT;
    gv_side sd[2];
    unsigned nb[2];
    sd[0].sg = gv_segs_of(ctx, cnt[0], sw[0], sy[0], 1, wps,
                          (int64_t)(ne0 / gv<K>::BLK) * gv<K>::IPB, &nb[0]);
    sd[0].x = gv_xp_of<K>(gx, &sd[0].xs);
    sd[1].sg =
        gv_segs_of(ctx, cnt[1], sw[1], sy[1], 1, wps,
                   (int64_t)(ne0 / gv<KERN_TYPE_Q6_KX8>::BLK) * gv<KERN_TYPE_Q6_KX8>::IPB, &nb[1]);
    sd[1].x = gv_xp_of<KERN_TYPE_Q6_KX8>(gx, &sd[1].xs);
    for (int k = 0; k < 2; k++) { /* as its own type's launch: the trigger, y (none here) */
        sd[k].sg.trigger = ctx->gemv_trigger;
        sd[k].sg.ypre = c.ypre;
    }
    sd[0].row_bytes = sw[0][0]->row_bytes;
    sd[1].row_bytes = sw[1][0]->row_bytes;
    const int minb = mix & 0xFF;
    const dim3 grid(nb[0] + nb[1]), block(GV_WARPS * 32);
    if (mix & GV_MIX_Q6_FIRST)
        kern_launch(c.pdl != 0, gv_quant2_kernel_for<KERN_TYPE_Q6_KX8, K>(minb), grid, block, 0,
                    stream, sd[1], sd[0], (int)nb[1], ne0, gx->ds);
    else
        kern_launch(c.pdl != 0, gv_quant2_kernel_for<K, KERN_TYPE_Q6_KX8>(minb), grid, block, 0,
                    stream, sd[0], sd[1], (int)nb[0], ne0, gx->ds);
}

/* Warps a block of gv_glu_quant_kernel<T, PERM, W> for n_blocks blocks: `want` when it
 * is 4, 8, 16 or 32, else the most of those with which every block is resident at once
 * (one wave: all SMs stream from the start to the end, none runs a last partial wave
 * alone), 4 when none is. Occupancy is asked once per kernel (process-wide: one GPU
 * model per process). */
template <int T, bool PERM>
static int gv_glu_warps(const struct ops_ctx *ctx, int n_blocks, int want) {
    if (want == 4 || want == 8 || want == 16 || want == 32) return want;
    static int per_sm[4] = {-1, -1, -1, -1}; /* W = 4, 8, 16, 32 */
    const void *fn[4] = {(const void *)gv_glu_kernel_for<T, PERM, 4>(),
                         (const void *)gv_glu_kernel_for<T, PERM, 8>(),
                         (const void *)gv_glu_kernel_for<T, PERM, 16>(),
                         (const void *)gv_glu_kernel_for<T, PERM, 32>()};
    for (int k = 3; k >= 1; k--) {
        if (per_sm[k] < 0 && cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                                 &per_sm[k], fn[k], 32 << (k + 2), 0) != cudaSuccess) {
            cudaGetLastError();
            per_sm[k] = 0;
        }
        if ((int64_t)per_sm[k] * ctx->n_sm >= n_blocks) return 4 << k;
    }
    return 4;
}
template <int T>
void gv_glu_type(struct ops_ctx *ctx, const struct tpi_weight *wg, const struct tpi_weight *wu,
                 const struct kern_gemv_x *gx, float *g, float *u, int8_t *oq, float2 *ods,
                 int warps, cudaStream_t stream, const gv_cfg &c) {
    const bool pdl = c.pdl != 0;
    const uint8_t *dg = (const uint8_t *)wg->data, *du = (const uint8_t *)wu->data;
    const int ne0 = (int)wg->ne0, n_ff = (int)wg->ne1;
    if constexpr (T == TPI_TYPE_BF16 || T == TPI_TYPE_F16) {
        kern_launch(pdl, gv_glu_elem_kernel<T>, dim3((unsigned)(n_ff / GV_WARPS)),
                    dim3(GV_WARPS * 32), 0, stream, dg, du, wg->row_bytes, ne0, n_ff, gx->x, g, u);
    } else {
        const gv_xlayout olay = gv_xlayout_of(1, n_ff);
        const unsigned blocks = (unsigned)(n_ff / 32);
        auto go = [&](auto perm_c, const int8_t *x, int xs) {
            constexpr bool P = decltype(perm_c)::value;
            /* auto (warps < 0): the ring kernel where it takes the shape */
            if (warps < 0 && gv_glu_ring_launch<T, P>(ctx, pdl, dg, du, wg->row_bytes, ne0, n_ff, x,
                                                      gx->ds, g, u, oq, ods, olay, stream))
                return;
            const int w = gv_glu_warps<T, P>(ctx, (int)blocks, warps);
            auto launch = [&](auto w_c) {
                kern_launch(pdl, gv_glu_kernel_for<T, P, decltype(w_c)::value>(), dim3(blocks),
                            dim3(decltype(w_c)::value * 32), 0, stream, dg, du, wg->row_bytes, ne0,
                            n_ff, x, xs, gx->ds, g, u, oq, ods, olay);
            };
            if (w == 32)
                launch(std::integral_constant<int, 32>{});
            else if (w == 16)
                launch(std::integral_constant<int, 16>{});
            else if (w == 8)
                launch(std::integral_constant<int, 8>{});
            else
                launch(std::integral_constant<int, 4>{});
        };
        if (gv_kind_of<T, 1>(gx, c) == 'p') {
            int xs = 0;
            const int8_t *xp = gv_xp_of<T>(gx, &xs); /* gx: one row of ne0 (glu_ok) */
            go(std::true_type{}, xp, xs);
        } else {
            go(std::false_type{}, gx->xq, ne0);
        }
    }
}

/* The explicit instantiations of type T's launches (and so its kernels): one line a type
 * in the part that holds it. */
#define GV_PART_TYPE(T)                                                                            \
    template void gv_run_type<T>(struct ops_ctx *, int, const struct tpi_weight *const *,          \
                                 const struct kern_gemv_x *, float *const *, bool, cudaStream_t,   \
                                 const gv_cfg &);                                                  \
    template void gv_glu_type<T>(struct ops_ctx *, const struct tpi_weight *,                      \
                                 const struct tpi_weight *, const struct kern_gemv_x *, float *,   \
                                 float *, int8_t *, float2 *, int, cudaStream_t, const gv_cfg &)

#endif /* KERN_GEMV_LAUNCH_CUH */
