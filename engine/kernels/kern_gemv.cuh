/*
 * kern_gemv.cuh — the v3 decode matrix-vector path's device code, shared by
 * kern_gemv.cu and its per-type parts: the kernels and row functions of every kind,
 * the knobs' struct (gv_cfg), the covered types (gv_dispatch) and the per-type launch
 * entries' declarations (gv_run_type, gv_glu_type, gv_mix_launch).
 *
 * kern_gemv.cu holds the public entries, the knobs, x's quantization and the host
 * emulation, and calls a type's launches through gv_dispatch; each part
 * (kern_gemv_q8.cu, _q4, _q5, _k, _q6, _k2, _iq4) instantiates the launches, and so the
 * kernels, of its own types (kern_gemv_launch.cuh), so the build compiles the parts at once. A
 * covered type no part instantiates fails at link time. Nothing here is instantiated
 * by including it.
 */
#ifndef KERN_GEMV_CUH
#define KERN_GEMV_CUH

#include "kern_common.cuh"
#include "kern_quant.cuh"
#include "kern_xq.cuh"

#define GV_WARPS 4     /* warps per block */
#define GV_LOG_WARPS 2 /* log2(GV_WARPS) */
static_assert(GV_WARPS == 1 << GV_LOG_WARPS, "GV_LOG_WARPS is log2(GV_WARPS)");
#define GV_UNROLL 4 /* kind a: items per lane loaded before the first is used */

#include "kern_gemv_dot.cuh" /* helpers and gv<T>: the per-type dot products */

/* Kind p's permuted copies of x and where prepare puts them: kern_xq.cuh. */

/* BF16/F16 weights, f32 x: an item is 8 values (16 bytes), a "block" of one item. */
template <int TYPE>
__host__ __device__ __forceinline__ void gv_elem_unpack(const int4 v, float (&f)[8]) {
    const uint32_t u[4] = {(uint32_t)v.x, (uint32_t)v.y, (uint32_t)v.z, (uint32_t)v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if constexpr (TYPE == TPI_TYPE_BF16) {
            const uint32_t lo = u[i] << 16, hi = u[i] & 0xFFFF0000u;
#ifdef __CUDA_ARCH__
            f[2 * i] = __uint_as_float(lo);
            f[2 * i + 1] = __uint_as_float(hi);
#else
            memcpy(&f[2 * i], &lo, 4);
            memcpy(&f[2 * i + 1], &hi, 4);
#endif
        } else {
            f[2 * i] = gv_h2f((uint16_t)(u[i] & 0xFFFFu));
            f[2 * i + 1] = gv_h2f((uint16_t)(u[i] >> 16));
        }
    }
}

template <int TYPE> struct gv_elem {
    /* acc[r] += 8 weights . x row r at value 8*i (xs: x row stride) */
    template <int NR>
    static __host__ __device__ __forceinline__ void dot(const int4 wv, const float *x, int xs,
                                                        int nr, float (&acc)[NR]) {
        float f[8];
        gv_elem_unpack<TYPE>(wv, f);
#pragma unroll
        for (int r = 0; r < NR; r++)
            if (r == 0 || r < nr) {
                const float4 a = gv_ldf4(x + (size_t)r * xs), b = gv_ldf4(x + (size_t)r * xs + 4);
                float s = acc[r];
                s = fmaf(f[0], a.x, s);
                s = fmaf(f[1], a.y, s);
                s = fmaf(f[2], a.z, s);
                s = fmaf(f[3], a.w, s);
                s = fmaf(f[4], b.x, s);
                s = fmaf(f[5], b.y, s);
                s = fmaf(f[6], b.z, s);
                s = fmaf(f[7], b.w, s);
                acc[r] = s;
            }
    }
};

/* ------------------------------------------------ kind b: per-unit dot products
 *
 * A *unit* is 16 consecutive values of a row: x unit u is the 16 int8 at 16u, and a
 * warp's lanes take consecutive units, so each x load instruction of a warp reads 512
 * contiguous bytes (4 L1 wavefronts) where kind a's items spread one instruction over
 * 1-2 KB (8-16 wavefronts): x traffic through L1, not DRAM, bounded kind a (its time
 * grows almost linearly with the number of x rows). Units of one weight block read
 * neighbouring bytes too (lanes sharing bytes in one instruction cost nothing extra).
 *
 * gu<T>: BLK values, BYTES bytes, UPB = BLK/16 units per block; raw: the registers one
 * unit's weight loads land in; load(raw, b: the block, u: unit in block) issues them;
 * dot<NR>(raw, u, x: int8 x at the unit (row 0), ds: the (d, d*sum) pair of the x
 * block holding the unit (row 0), xs: x row stride in values, nr, keep, acc).
 * Row r's x is at x + r*xs and ds + r*(xs/32). Loads and dots are split so that a
 * batch of units has all its loads in flight before the first dot. */

/* 16 bytes at a 2-byte aligned address, as two aligned 16-byte loads (a 32-byte
 * window) and the offset; gv_win_get shifts them out (~15 ALU ops instead of five
 * scattered 4-byte loads). Reads up to 30 bytes past p: weight_upload pads weights. */
struct gv_win {
    int4 a, b;
    int off; /* p & 15 (even) */
};
__host__ __device__ __forceinline__ void gv_win_load(gv_win &w, const uint8_t *p) {
    const uint8_t *q = (const uint8_t *)((uintptr_t)p & ~(uintptr_t)15);
    w.a = gv_ld128(q);
    w.b = gv_ld128(q + 16);
    w.off = (int)((uintptr_t)p & 15);
}
__host__ __device__ __forceinline__ void gv_win_get(const gv_win &w, uint32_t (&o)[4]) {
    const uint32_t t[8] = {(uint32_t)w.a.x, (uint32_t)w.a.y, (uint32_t)w.a.z, (uint32_t)w.a.w,
                           (uint32_t)w.b.x, (uint32_t)w.b.y, (uint32_t)w.b.z, (uint32_t)w.b.w};
    const int wo = w.off >> 2, sh = (w.off & 3) * 8;
    uint32_t s[6], u[5]; /* t shifted down by wo words: by 2, then by 1 (selects, no indexing) */
#pragma unroll
    for (int i = 0; i < 6; i++)
        s[i] = (wo & 2) ? t[i + 2] : t[i];
#pragma unroll
    for (int i = 0; i < 5; i++)
        u[i] = (wo & 1) ? s[i + 1] : s[i];
#pragma unroll
    for (int i = 0; i < 4; i++)
        o[i] = gv_funnel(u[i], u[i + 1], sh);
}

/* The 16 int8 products of one unit: the 4 words q against the 16 x bytes at x. Kind b
 * issues its first weight loads before the PDL wait; its x and (d, d*sum) loads are
 * plain loads of pointers that are not __restrict__ (gv_ldx), which the compiler keeps
 * after the wait's memory clobber. Through __ldg they were not: the SASS of the 2-row
 * Q8_0 kernel had an x load above the wait (bench/NOTES.md change 26). */
__host__ __device__ __forceinline__ int gu_dp16(const uint32_t (&q)[4], const int8_t *x) {
    return gv_dp4a_x4(q, gv_ldx128(x), 0);
}

/* acc[r] += scale * dx_r * (the 4 words q . x row r's unit) for the first nr rows; MIN
 * (a unit of a type with a block minimum): plus mn * (dx_r * sum of x row r's block), mn
 * the minimum on the block's first unit, else 0 */
template <int NR, bool MIN = false>
__host__ __device__ __forceinline__ void gu_dot16(const uint32_t (&q)[4], float scale,
                                                  const int8_t *x, const float2 *ds, int xs, int nr,
                                                  float (&acc)[NR], float mn = 0.0f) {
#pragma unroll
    for (int r = 0; r < NR; r++)
        if (r == 0 || r < nr) {
            const int s = gu_dp16(q, x + (size_t)r * xs);
            if (MIN) {
                const float2 f = gv_ldx<float2>(ds + (size_t)r * (xs / GV_QK));
                acc[r] += fmaf(scale * f.x, (float)s, mn * f.y);
            } else {
                acc[r] += scale * gv_ldx<float2>(ds + (size_t)r * (xs / GV_QK)).x * (float)s;
            }
        }
}

template <int TYPE> struct gu;

/* Q8_0: unit u = the 16 int8 at b+2+16u; f16 d at b. */
template <> struct gu<TPI_TYPE_Q8_0> {
    static constexpr int BLK = 32, BYTES = 34, UPB = 2;
    struct raw {
        gv_win q;
        uint32_t d;
    };
    static __host__ __device__ __forceinline__ void load(raw &w, const uint8_t *b, int u) {
        gv_win_load(w.q, b + 2 + 16 * u);
        w.d = gv_ld16(b);
    }
    template <int NR>
    static __host__ __device__ __forceinline__ void dot(const raw &w, int, const int8_t *x,
                                                        const float2 *ds, int xs, int nr,
                                                        float keep, float (&acc)[NR]) {
        uint32_t q[4];
        gv_win_get(w.q, q);
        gu_dot16<NR>(q, gv_h2f((uint16_t)w.d) * keep, x, ds, xs, nr, acc);
    }
};

/* Q8_0 in groups of 8 blocks: unit u = the 16 int8 at b+16u (aligned); f16 d of block
 * u/2 at b+256+2(u/2). */
template <> struct gu<KERN_TYPE_Q8_0X8> {
    static constexpr int BLK = 256, BYTES = KERN_Q8_0X8_BYTES, UPB = 16;
    using raw = gu<TPI_TYPE_Q8_0>::raw;
    static __host__ __device__ __forceinline__ void load(raw &w, const uint8_t *b, int u) {
        gv_win_load(w.q, b + 16 * u);
        w.d = gv_ld16(b + 256 + 2 * (u >> 1));
    }
    template <int NR>
    static __host__ __device__ __forceinline__ void dot(const raw &w, int u, const int8_t *x,
                                                        const float2 *ds, int xs, int nr,
                                                        float keep, float (&acc)[NR]) {
        gu<TPI_TYPE_Q8_0>::dot<NR>(w, u, x, ds, xs, nr, keep, acc);
    }
};

/* Q4_0: f16 d, 16 bytes at b+2; unit u = nibble u (low: values 0..15) of all 16, q - 8. */
template <> struct gu<TPI_TYPE_Q4_0> {
    static constexpr int BLK = 32, BYTES = 18, UPB = 2;
    struct raw {
        gv_win q;
        uint32_t d;
    };
    static __host__ __device__ __forceinline__ void load(raw &w, const uint8_t *b, int) {
        gv_win_load(w.q, b + 2);
        w.d = gv_ld16(b);
    }
    template <int NR>
    static __host__ __device__ __forceinline__ void dot(const raw &w, int u, const int8_t *x,
                                                        const float2 *ds, int xs, int nr,
                                                        float keep, float (&acc)[NR]) {
        uint32_t q[4];
        gv_win_get(w.q, q);
#pragma unroll
        for (int i = 0; i < 4; i++)
            q[i] = gv_vsub4((q[i] >> (4 * u)) & 0x0F0F0F0Fu, 0x08080808u);
        gu_dot16<NR>(q, gv_h2f((uint16_t)w.d) * keep, x, ds, xs, nr, acc);
    }
};

/* IQ4_NL: Q4_0's units (unit u = nibble u of the 16 index bytes at b+2), d * level. */
template <> struct gu<TPI_TYPE_IQ4_NL> {
    static constexpr int BLK = 32, BYTES = 18, UPB = 2;
    using raw = gu<TPI_TYPE_Q4_0>::raw;
    static __host__ __device__ __forceinline__ void load(raw &w, const uint8_t *b, int u) {
        gu<TPI_TYPE_Q4_0>::load(w, b, u);
    }
    template <int NR>
    static __host__ __device__ __forceinline__ void dot(const raw &w, int u, const int8_t *x,
                                                        const float2 *ds, int xs, int nr,
                                                        float keep, float (&acc)[NR]) {
        uint32_t q[4];
        gv_win_get(w.q, q);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t lo, hi;
            kq_iq4_levels8(q[i], lo, hi);
            q[i] = u ? hi : lo;
        }
        gu_dot16<NR>(q, gv_h2f((uint16_t)w.d) * keep, x, ds, xs, nr, acc);
    }
};

/* IQ4_XS (8-byte aligned blocks): unit u = nibble u & 1 of sub-block u >> 1's 16 index
 * bytes at b+8+16(u >> 1), at d * (ls - 32) (gv<TPI_TYPE_IQ4_XS> says where ls sits). */
template <> struct gu<TPI_TYPE_IQ4_XS> {
    static constexpr int BLK = 256, BYTES = 136, UPB = 16;
    struct raw {
        uint32_t q[4], dh, sl;
    };
    static __host__ __device__ __forceinline__ void load(raw &w, const uint8_t *b, int u) {
#pragma unroll
        for (int i = 0; i < 4; i++)
            w.q[i] = gv_ld32(b + 8 + 16 * (u >> 1) + 4 * i);
        w.dh = gv_ld32(b);
        w.sl = gv_ld32(b + 4);
    }
    template <int NR>
    static __host__ __device__ __forceinline__ void dot(const raw &w, int u, const int8_t *x,
                                                        const float2 *ds, int xs, int nr,
                                                        float keep, float (&acc)[NR]) {
        const int c = u >> 1;
        const int ls = (int)(((w.sl >> (4 * c)) & 0xFu) | (((w.dh >> (16 + 2 * c)) & 3u) << 4));
        uint32_t q[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t lo, hi;
            kq_iq4_levels8(w.q[i], lo, hi);
            q[i] = (u & 1) ? hi : lo;
        }
        gu_dot16<NR>(q, gv_h2f((uint16_t)(w.dh & 0xFFFFu)) * (float)(ls - 32) * keep, x, ds, xs, nr,
                     acc);
    }
};

/* Q4_0 in groups of 8 blocks: unit u = nibble u & 1 of block u >> 1's 16 quant bytes at
 * b+16(u >> 1) (one aligned load); its f16 d at b+128+2(u >> 1). */
template <> struct gu<KERN_TYPE_Q4_0X8> {
    static constexpr int BLK = 256, BYTES = KERN_Q4_0X8_BYTES, UPB = 16;
    struct raw {
        int4 q;
        uint32_t d;
    };
    static __host__ __device__ __forceinline__ void load(raw &w, const uint8_t *b, int u) {
        w.q = gv_ld128(b + 16 * (u >> 1));
        w.d = gv_ld16(b + 128 + 2 * (u >> 1));
    }
    template <int NR>
    static __host__ __device__ __forceinline__ void dot(const raw &w, int u, const int8_t *x,
                                                        const float2 *ds, int xs, int nr,
                                                        float keep, float (&acc)[NR]) {
        const uint32_t qw[4] = {(uint32_t)w.q.x, (uint32_t)w.q.y, (uint32_t)w.q.z, (uint32_t)w.q.w};
        uint32_t q[4];
#pragma unroll
        for (int i = 0; i < 4; i++)
            q[i] = gv_vsub4((qw[i] >> (4 * (u & 1))) & 0x0F0F0F0Fu, 0x08080808u);
        gu_dot16<NR>(q, gv_h2f((uint16_t)w.d) * keep, x, ds, xs, nr, acc);
    }
};

/* Q5_0: f16 d, qh (32 bits) at b+2, 16 bytes at b+6 as Q4_0; bit j of qh is the fifth
 * bit of value j; q - 16. */
template <> struct gu<TPI_TYPE_Q5_0> {
    static constexpr int BLK = 32, BYTES = 22, UPB = 2;
    struct raw {
        gv_win q;
        uint32_t d, h0, h1; /* h0, h1: the 16-bit halves of qh */
    };
    static __host__ __device__ __forceinline__ void load(raw &w, const uint8_t *b, int) {
        gv_win_load(w.q, b + 6);
        w.d = gv_ld16(b);
        w.h0 = gv_ld16(b + 2);
        w.h1 = gv_ld16(b + 4);
    }
    template <int NR>
    static __host__ __device__ __forceinline__ void dot(const raw &w, int u, const int8_t *x,
                                                        const float2 *ds, int xs, int nr,
                                                        float keep, float (&acc)[NR]) {
        uint32_t q[4];
        gv_win_get(w.q, q);
        const uint32_t qh = u ? w.h1 : w.h0; /* fifth bits of this unit's 16 values */
#pragma unroll
        for (int i = 0; i < 4; i++)
            q[i] = gv_vsub4(((q[i] >> (4 * u)) & 0x0F0F0F0Fu) | gv_spread4((qh >> (4 * i)) & 0xFu),
                            0x10101010u);
        gu_dot16<NR>(q, gv_h2f((uint16_t)w.d) * keep, x, ds, xs, nr, acc);
    }
};

/* Q4_1 (QH false) and Q5_1 (QH true): f16 d and m at b, for Q5_1 qh (32 bits, bit j the
 * fifth bit of value j) at b+4, then 16 bytes; unit u = nibble u of all 16 (values 0..15
 * or 0..31), value = d*q + m (m added with unit 0, for the block's 32 values). */
template <bool QH> struct gu_min_block {
    static constexpr int BLK = 32, BYTES = QH ? 24 : 20, UPB = 2;
    struct raw {
        gv_win q;
        uint32_t dm, qh;
    };
    static __host__ __device__ __forceinline__ void load(raw &w, const uint8_t *b, int) {
        gv_win_load(w.q, b + (QH ? 8 : 4));
        w.dm = gv_ld32(b);
        w.qh = QH ? gv_ld32(b + 4) : 0u;
    }
    template <int NR>
    static __host__ __device__ __forceinline__ void dot(const raw &w, int u, const int8_t *x,
                                                        const float2 *ds, int xs, int nr,
                                                        float keep, float (&acc)[NR]) {
        uint32_t q[4];
        gv_win_get(w.q, q);
        const uint32_t qh = w.qh >> (16 * u); /* fifth bits of this unit's 16 values */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            q[i] = (q[i] >> (4 * u)) & 0x0F0F0F0Fu;
            if (QH) q[i] |= gv_spread4((qh >> (4 * i)) & 0xFu);
        }
        const float mn = u ? 0.0f : gv_h2f((uint16_t)(w.dm >> 16)) * keep;
        gu_dot16<NR, true>(q, gv_h2f((uint16_t)(w.dm & 0xFFFFu)) * keep, x, ds, xs, nr, acc, mn);
    }
};
template <> struct gu<TPI_TYPE_Q4_1> : gu_min_block<false> {};
template <> struct gu<TPI_TYPE_Q5_1> : gu_min_block<true> {};

/* Q4_K (16-byte aligned blocks): unit u = half h = u & 1 of sub-block j = u >> 1: the
 * 16 bytes at b+16+32(j/2)+16h, low nibbles for even j, high for odd; the 16-byte
 * header (d, dmin, 12 bytes of 6-bit scales/mins) is one load, shared in-instruction by
 * the block's 16 lanes. value = d*sc_j*q - dmin*m_j: the unit adds d*sc_j*dx*sum(q*xq),
 * and the h = 0 unit of a sub-block also -dmin*m_j*(dx*sum xq) for the whole 32 values. */
template <> struct gu<TPI_TYPE_Q4_K> {
    static constexpr int BLK = 256, BYTES = 144, UPB = 16;
    struct raw {
        int4 q, hd;
    };
    static __host__ __device__ __forceinline__ void load(raw &w, const uint8_t *b, int u) {
        w.q = gv_ld128(b + 16 + 32 * (u >> 2) + 16 * (u & 1));
        w.hd = gv_ld128(b);
    }
    template <int NR>
    static __host__ __device__ __forceinline__ void dot(const raw &w, int u, const int8_t *x,
                                                        const float2 *ds, int xs, int nr,
                                                        float keep, float (&acc)[NR]) {
        const int sh = 4 * ((u >> 1) & 1);
        const uint32_t qw[4] = {(uint32_t)w.q.x, (uint32_t)w.q.y, (uint32_t)w.q.z, (uint32_t)w.q.w};
        uint32_t q[4];
#pragma unroll
        for (int i = 0; i < 4; i++)
            q[i] = (qw[i] >> sh) & 0x0F0F0F0Fu;
        dot_q<NR>(w, q, u, x, ds, xs, nr, keep, acc);
    }
    /* unit u's sums for its 16 values q (bytes, unsigned) with the header w.hd's scales */
    template <int NR>
    static __host__ __device__ __forceinline__ void
    dot_q(const raw &w, const uint32_t (&q)[4], int u, const int8_t *x, const float2 *ds, int xs,
          int nr, float keep, float (&acc)[NR]) {
        const int j = u >> 1, bs = 8 * (j & 3);
        const uint32_t dm = (uint32_t)w.hd.x;
        const float d = gv_h2f((uint16_t)(dm & 0xFFFFu)) * keep;
        const float dmin = gv_h2f((uint16_t)(dm >> 16)) * keep;
        /* byte j & 3 of s0 = b[4..7], s1 = b[8..11], s2 = b[12..15]: sc_j = s0_j & 63,
         * m_j = s1_j & 63 for j < 4, else sc_j = (s2_j & 15) | (s0_j >> 6) << 4,
         * m_j = (s2_j >> 4) | (s1_j >> 6) << 4 */
        const uint32_t a = ((uint32_t)w.hd.y >> bs) & 0xFFu, bb = ((uint32_t)w.hd.z >> bs) & 0xFFu;
        const uint32_t e = ((uint32_t)w.hd.w >> bs) & 0xFFu;
        const uint32_t sc = j < 4 ? (a & 63u) : ((e & 0xFu) | ((a >> 6) << 4));
        const uint32_t mn = j < 4 ? (bb & 63u) : ((e >> 4) | ((bb >> 6) << 4));
        const float dsc = d * (float)sc, dm_j = (u & 1) ? 0.0f : dmin * (float)mn;
#pragma unroll
        for (int r = 0; r < NR; r++)
            if (r == 0 || r < nr) {
                const int s = gu_dp16(q, x + (size_t)r * xs);
                const float2 f = gv_ldx<float2>(ds + (size_t)r * (xs / GV_QK));
                acc[r] += fmaf(dsc * f.x, (float)s, -dm_j * f.y);
            }
    }
};

/* Q5_K (16-byte aligned blocks): Q4_K's units with the quants at b+48 and the fifth bits
 * of unit u (half h = u & 1 of sub-block j = u >> 1) bit j of the 16 qh bytes at
 * b+16+16h; values 0..31, the sums Q4_K's. */
template <> struct gu<TPI_TYPE_Q5_K> {
    static constexpr int BLK = 256, BYTES = 176, UPB = 16;
    struct raw {
        int4 q, h, hd;
    };
    static __host__ __device__ __forceinline__ void load(raw &w, const uint8_t *b, int u) {
        w.q = gv_ld128(b + 48 + 32 * (u >> 2) + 16 * (u & 1));
        w.h = gv_ld128(b + 16 + 16 * (u & 1));
        w.hd = gv_ld128(b);
    }
    template <int NR>
    static __host__ __device__ __forceinline__ void dot(const raw &w, int u, const int8_t *x,
                                                        const float2 *ds, int xs, int nr,
                                                        float keep, float (&acc)[NR]) {
        const int j = u >> 1;
        const uint32_t qw[4] = {(uint32_t)w.q.x, (uint32_t)w.q.y, (uint32_t)w.q.z, (uint32_t)w.q.w};
        const uint32_t hw[4] = {(uint32_t)w.h.x, (uint32_t)w.h.y, (uint32_t)w.h.z, (uint32_t)w.h.w};
        uint32_t q[4];
#pragma unroll
        for (int i = 0; i < 4; i++)
            q[i] = ((qw[i] >> (4 * (j & 1))) & 0x0F0F0F0Fu) | (((hw[i] >> j) << 4) & 0x10101010u);
        const gu<TPI_TYPE_Q4_K>::raw k4 = {w.q, w.hd};
        gu<TPI_TYPE_Q4_K>::dot_q<NR>(k4, q, u, x, ds, xs, nr, keep, acc);
    }
};

/* Q6_K: ql[128] at 0, qh[64] at 128, int8 scales[16] at 192, f16 d at 208 (2-byte
 * aligned blocks). Unit u = values 16u..16u+15 = 128n + 32k + l0.. with n = u >> 3,
 * k = (u >> 1) & 3, l0 = 16 (u & 1): low (k < 2) or high nibbles of the 16 ql bytes at
 * 64n + 32(k & 1) + l0, bits 2k..2k+1 of the 16 qh bytes at 128 + 32n + l0, q - 32,
 * times d * scales[u]. */
template <> struct gu<TPI_TYPE_Q6_K> {
    static constexpr int BLK = 256, BYTES = 210, UPB = 16;
    struct raw {
        gv_win ql, qh;
        uint32_t sd; /* scales[u] (bits 0..7) and d (bits 16..31) */
    };
    static __host__ __device__ __forceinline__ void load(raw &w, const uint8_t *b, int u) {
        const int n = u >> 3, k = (u >> 1) & 3, l0 = 16 * (u & 1);
        gv_win_load(w.ql, b + 64 * n + 32 * (k & 1) + l0);
        gv_win_load(w.qh, b + 128 + 32 * n + l0);
        /* scales[u] sits in the 16-bit word at 192 + (u & ~1) */
        w.sd = (gv_ld16(b + 192 + (u & ~1)) >> (8 * (u & 1))) & 0xFFu;
        w.sd |= gv_ld16(b + 208) << 16;
    }
    template <int NR>
    static __host__ __device__ __forceinline__ void dot(const raw &w, int u, const int8_t *x,
                                                        const float2 *ds, int xs, int nr,
                                                        float keep, float (&acc)[NR]) {
        uint32_t l[4], h[4];
        gv_win_get(w.ql, l);
        gv_win_get(w.qh, h);
        unit<NR>(l, h, (u >> 1) & 3, w.sd, x, ds, xs, nr, keep, acc);
    }
    /* unit k (of 4) of 16 ql bytes l and 16 qh bytes h; sd: scale (bits 0..7) and d */
    template <int NR>
    static __host__ __device__ __forceinline__ void
    unit(const uint32_t (&l)[4], const uint32_t (&h)[4], int k, uint32_t sd, const int8_t *x,
         const float2 *ds, int xs, int nr, float keep, float (&acc)[NR]) {
        uint32_t q[4];
        const int shl = 4 * (k >> 1), shh = 2 * k;
#pragma unroll
        for (int i = 0; i < 4; i++)
            q[i] = gv_vsub4(((l[i] >> shl) & 0x0F0F0F0Fu) | (((h[i] >> shh) & 0x03030303u) << 4),
                            0x20202020u);
        const float scale = gv_h2f((uint16_t)(sd >> 16)) * keep * (float)(int8_t)(sd & 0xFFu);
        gu_dot16<NR>(q, scale, x, ds, xs, nr, acc);
    }
};

/* Q3_K (110-byte blocks): unit u = values 16u.. = 128n + 32k + l0.. as Q6_K's (n = u >> 3,
 * k = (u >> 1) & 3, l0 = 16 (u & 1)): bit pair k of the 16 qs bytes at 32 + 32n + l0, bit
 * 4n + k of the 16 hmask bytes at l0 (clear: -4), times d * scale u (kq_q3_k_scale). */
template <> struct gu<TPI_TYPE_Q3_K> {
    static constexpr int BLK = 256, BYTES = 110, UPB = 16;
    struct raw {
        gv_win qs, hm;
        uint32_t sd; /* scale u less 32 (bits 0..7, signed) and d (bits 16..31) */
    };
    static __host__ __device__ __forceinline__ void load(raw &w, const uint8_t *b, int u) {
        const int n = u >> 3, l0 = 16 * (u & 1);
        gv_win_load(w.qs, b + 32 + 32 * n + l0);
        gv_win_load(w.hm, b + l0);
        w.sd = sd_of(b + 96, b + 108, u);
    }
    template <int NR>
    static __host__ __device__ __forceinline__ void dot(const raw &w, int u, const int8_t *x,
                                                        const float2 *ds, int xs, int nr,
                                                        float keep, float (&acc)[NR]) {
        uint32_t l[4], h[4];
        gv_win_get(w.qs, l);
        gv_win_get(w.hm, h);
        unit<NR>(l, h, u, w.sd, x, ds, xs, nr, keep, acc);
    }
    /* Unit u (0..15) of a block from its 16 qs bytes l, 16 hmask bytes h and sd (as raw's):
     * shared with the 8-block groups. */
    template <int NR>
    static __host__ __device__ __forceinline__ void unit(const uint32_t (&l)[4], const uint32_t (&h)[4],
                                                         int u, uint32_t sd, const int8_t *x,
                                                         const float2 *ds, int xs, int nr,
                                                         float keep, float (&acc)[NR]) {
        uint32_t q[4];
        const int k = (u >> 1) & 3, hb = 4 * (u >> 3) + k;
#pragma unroll
        for (int i = 0; i < 4; i++)
            q[i] = gv_vsub4(((l[i] >> (2 * k)) & 0x03030303u) | (((h[i] >> hb) & 0x01010101u) << 2),
                            0x04040404u);
        const float scale = gv_h2f((uint16_t)(sd >> 16)) * keep * (float)(int8_t)(sd & 0xFFu);
        gu_dot16<NR>(q, scale, x, ds, xs, nr, acc);
    }
    /* raw's sd of unit u from its block's 12 scale bytes at s and d at dp */
    static __host__ __device__ __forceinline__ uint32_t sd_of(const uint8_t *s, const uint8_t *dp,
                                                              int u) {
        /* the scale's low nibble in byte u & 7, its top bits in byte 8 + (u & 3) */
        const uint32_t lo = gv_ld16(s + (u & 6)) >> (8 * (u & 1));
        const uint32_t hi = gv_ld16(s + 8 + (u & 2)) >> (8 * (u & 1));
        const int sc =
            (int)(((lo >> (4 * (u >> 3))) & 0xFu) | (((hi >> (2 * (u >> 2))) & 3u) << 4));
        return (uint32_t)((sc - 32) & 0xFF) | (gv_ld16(dp) << 16);
    }
};

/* Q3_K in groups of 8 blocks (KERN_LAYOUT_Q3_KX8): unit u = Q3_K's unit uu = u % 16 of
 * block c = u / 16: its qs and hmask bytes are 16-byte loads at 64c + 32n + l0 and 512 +
 * 32c + l0 (n = uu / 8, l0 = 16 (uu & 1)), its scale from the block's 12 bytes at 768 +
 * 12c, d at 864 + 2c. */
template <> struct gu<KERN_TYPE_Q3_KX8> {
    static constexpr int BLK = 2048, BYTES = KERN_Q3_KX8_BYTES, UPB = 128;
    struct raw {
        uint32_t l[4], h[4]; /* the unit's qs and hmask bytes */
        uint32_t sd;         /* as gu<TPI_TYPE_Q3_K>'s */
    };
    static __host__ __device__ __forceinline__ void load(raw &w, const uint8_t *b, int u) {
        const int c = u >> 4, uu = u & 15, l0 = 16 * (uu & 1);
        gv_words(gv_ld128(b + 64 * c + 32 * (uu >> 3) + l0), w.l);
        gv_words(gv_ld128(b + 512 + 32 * c + l0), w.h);
        w.sd = gu<TPI_TYPE_Q3_K>::sd_of(b + 768 + 12 * c, b + 864 + 2 * c, uu);
    }
    template <int NR>
    static __host__ __device__ __forceinline__ void dot(const raw &w, int u, const int8_t *x,
                                                        const float2 *ds, int xs, int nr,
                                                        float keep, float (&acc)[NR]) {
        gu<TPI_TYPE_Q3_K>::unit<NR>(w.l, w.h, u & 15, w.sd, x, ds, xs, nr, keep, acc);
    }
};

/* Q2_K (84-byte blocks, 4-byte aligned): unit u as Q3_K's, its levels bit pair k of the 16
 * qs bytes at 16 + 32n + l0, scale byte u (4-bit scale, 4-bit min); the minimum applies
 * to the unit's own 16 x values (their sum by a dp4a with ones). */
template <> struct gu<TPI_TYPE_Q2_K> {
    static constexpr int BLK = 256, BYTES = 84, UPB = 16;
    struct raw {
        uint32_t q[4], sc, dd;
    };
    static __host__ __device__ __forceinline__ void load(raw &w, const uint8_t *b, int u) {
        const int n = u >> 3, l0 = 16 * (u & 1);
#pragma unroll
        for (int i = 0; i < 4; i++)
            w.q[i] = gv_ld32(b + 16 + 32 * n + l0 + 4 * i);
        w.sc = (gv_ld16(b + (u & ~1)) >> (8 * (u & 1))) & 0xFFu;
        w.dd = gv_ld32(b + 80);
    }
    template <int NR>
    static __host__ __device__ __forceinline__ void dot(const raw &w, int u, const int8_t *x,
                                                        const float2 *ds, int xs, int nr,
                                                        float keep, float (&acc)[NR]) {
        const int k = (u >> 1) & 3;
        uint32_t q[4];
#pragma unroll
        for (int i = 0; i < 4; i++)
            q[i] = (w.q[i] >> (2 * k)) & 0x03030303u;
        const float dl = gv_h2f((uint16_t)(w.dd & 0xFFFFu)) * keep * (float)(w.sc & 0xFu);
        const float ml = gv_h2f((uint16_t)(w.dd >> 16)) * keep * (float)(w.sc >> 4);
        const uint32_t ones[4] = {0x01010101u, 0x01010101u, 0x01010101u, 0x01010101u};
#pragma unroll
        for (int r = 0; r < NR; r++)
            if (r == 0 || r < nr) {
                const int4 xv = gv_ldx128(x + (size_t)r * xs);
                const int s = gv_dp4a_x4(q, xv, 0), sx = gv_dp4a_x4(ones, xv, 0);
                const float dx = gv_ldx<float2>(ds + (size_t)r * (xs / GV_QK)).x;
                acc[r] += dx * fmaf(dl, (float)s, -ml * (float)sx);
            }
    }
};

/* Q6_K in groups of 8 blocks (KERN_LAYOUT_Q6_KX8): unit u = Q6_K's unit uu = u % 16 of
 * block c = u / 16, in item l = 4c + 2n + (uu & 1) (n = uu / 8): ql's 16 bytes are the
 * item's A piece (k = (uu >> 1) & 3 even) or C piece (odd), qh's its H piece, the scale
 * byte k of its scales word; all aligned loads. */
template <> struct gu<KERN_TYPE_Q6_KX8> {
    static constexpr int BLK = 2048, BYTES = KERN_Q6_KX8_BYTES, UPB = 128;
    struct raw {
        int4 ql, qh;
        uint32_t sd; /* scale (bits 0..7) and d (bits 16..31) */
    };
    static __host__ __device__ __forceinline__ void load(raw &w, const uint8_t *b, int u) {
        const int c = u >> 4, uu = u & 15, k = (uu >> 1) & 3;
        const int l = 4 * c + 2 * (uu >> 3) + (uu & 1);
        w.ql = gv_ld128(b + 512 * (k & 1) + 16 * l);
        w.qh = gv_ld128(b + 1024 + 16 * l);
        w.sd = (gv_ld32(b + 1536 + 4 * l) >> (8 * k)) & 0xFFu;
        w.sd |= gv_ld16(b + 1664 + 2 * c) << 16;
    }
    template <int NR>
    static __host__ __device__ __forceinline__ void dot(const raw &w, int u, const int8_t *x,
                                                        const float2 *ds, int xs, int nr,
                                                        float keep, float (&acc)[NR]) {
        uint32_t l[4], h[4];
        gv_words(w.ql, l);
        gv_words(w.qh, h);
        gu<TPI_TYPE_Q6_K>::unit<NR>(l, h, ((u & 15) >> 1) & 3, w.sd, x, ds, xs, nr, keep, acc);
    }
};

/* Programmatic dependent launch: wait for the previous kernel's results (a no-op when
 * this kernel was launched without the attribute). Everything before it may only read
 * memory no earlier kernel writes (the weights). */
__device__ __forceinline__ void gv_grid_dep_wait() {
    kern_dep_wait();
}

/* Sum v over the 32 lanes with a fixed xor tree. */
__device__ __forceinline__ float gv_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* kind b: units per lane in one batch (all loads of a batch go out before its first
 * dot), by the registers a unit's loads take (8-20), times the `batch` knob (1, 2) */
template <int TYPE> struct gu_batch {
    static constexpr int U =
        TYPE == TPI_TYPE_Q6_K || TYPE == KERN_TYPE_Q6_KX8 || TYPE == TPI_TYPE_Q5_K ||
                TYPE == TPI_TYPE_Q3_K || TYPE == KERN_TYPE_Q3_KX8
            ? 2
            : 4;
};

/* One warp's share of a row for kind b: units part*32 + lane, stepping 32*wpr, in
 * batches of U. Units past the row end redo the batch's first unit with weight 0 (adds
 * exact zeros) instead of branching. The first batch's weight loads go out before the
 * wait for the previous kernel (PDL). __host__ __device__: the host emulation runs it
 * per lane (then `wait` is a no-op). */
template <int TYPE, int NR, int U, typename Wait>
__host__ __device__ __forceinline__ void gu_row(const uint8_t *wr, int n_units, int first, int step,
                                                const int8_t *xq, const float2 *ds, int ne0, int nr,
                                                float (&acc)[NR], Wait wait) {
    using Q = gu<TYPE>;
    for (int it = first; it < n_units; it += U * step) {
        typename Q::raw w[U];
#pragma unroll
        for (int v = 0; v < U; v++) {
            const int i = it + v * step, ii = v == 0 || i < n_units ? i : it;
            Q::load(w[v], wr + (size_t)(ii / Q::UPB) * Q::BYTES, ii % Q::UPB);
        }
        if (it == first) wait();
#pragma unroll
        for (int v = 0; v < U; v++) {
            const int i = it + v * step;
            const bool ok = v == 0 || i < n_units;
            const int ii = ok ? i : it;
            Q::template dot<NR>(w[v], ii % Q::UPB, xq + 16 * (size_t)ii, ds + ii / 2, ne0, nr,
                                ok ? 1.0f : 0.0f, acc);
        }
    }
}

/* ---------------------------------------------------------------- kernels */
/* 4-byte async copy global -> shared (cp.async; a plain load and store before sm_80) */
__device__ __forceinline__ void gv_cp4(float *dst, const float *src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "cp.async.ca.shared.global [%0], [%1], 4;" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
        "l"(src)
        : "memory");
#else
    *dst = *src;
#endif
}
/* A block's y values for gv_y_pre, one a warp. */
__device__ __forceinline__ float *gv_ys(void) {
    __shared__ float ys[GV_WARPS];
    return ys;
}
/* Whether gv_y_pre copies y: the quantized one-row, one-sum kernels (NR = RW = 1) that
 * accumulate, with the ypre knob on. */
template <int NR, int RW> __device__ __forceinline__ bool gv_y_pre_on(bool accumulate, bool on) {
    return NR * RW == 1 && on && accumulate;
}
/* The value of y that gv_store adds to (accumulate), copied by the lane that stores it
 * into shared memory (gv_ys, cp.async: no register waits for it) right after the PDL
 * wait: the launch's last step is then not an L2 round trip behind its last dot (on:
 * the ypre knob; bench/NOTES.md change 95). A register instead made the held Q6_K
 * kernel (64 registers) spill it, waiting for the load before its first weight loads.
 * Where gv_y_pre_on, gv_store is then called with pre and reads it from there. */
template <int NR, int RW>
__device__ __forceinline__ void gv_y_pre(const float *__restrict__ y, int ne1, int row0, int part,
                                         bool accumulate, bool on) {
    if (gv_y_pre_on<NR, RW>(accumulate, on) && part == 0 && (threadIdx.x & 31) == 0 && row0 < ne1)
        gv_cp4(gv_ys() + (threadIdx.x >> 5), y + row0);
}

/* Sum acc over the warp, then over the wpr warps of one row group (shared memory),
 * and store (or add to) rows row0..row0+RW-1 (those < ne1) of y for the first nr x
 * rows. Lane rw writes weight row rw's outputs; with pre (gv_y_pre's copy made), the
 * value added to is the copy's. */
template <int NR, int RW>
__device__ __forceinline__ void gv_store(float (&acc)[RW][NR], float *__restrict__ y, int ne1,
                                         int nr, int row0, int part, int wpr, bool accumulate,
                                         bool pre = false) {
    __shared__ float red[GV_WARPS][RW][NR];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int rw = 0; rw < RW; rw++)
#pragma unroll
        for (int r = 0; r < NR; r++)
            acc[rw][r] = gv_warp_sum(acc[rw][r]);
    if (wpr > 1) {
        if (lane == 0)
#pragma unroll
            for (int rw = 0; rw < RW; rw++)
#pragma unroll
                for (int r = 0; r < NR; r++)
                    red[warp][rw][r] = acc[rw][r];
        __syncthreads();
        if (part != 0) return;
#pragma unroll
        for (int rw = 0; rw < RW; rw++)
#pragma unroll
            for (int r = 0; r < NR; r++) {
                float s = 0.0f;
                for (int k = 0; k < wpr; k++) /* fixed order: results do not depend on timing */
                    s += red[warp + k][rw][r];
                acc[rw][r] = s;
            }
    }
#pragma unroll
    for (int rw = 0; rw < RW; rw++)
        if (lane == rw && row0 + rw < ne1)
#pragma unroll
            for (int r = 0; r < NR; r++)
                if (r < nr) {
                    float *o = y + (size_t)r * ne1 + row0 + rw;
                    float yo = 0.0f;
                    if (pre) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
                        asm volatile("cp.async.wait_all;" ::: "memory");
#endif
                        yo = gv_ys()[warp];
                    } else if (accumulate) {
                        yo = *o;
                    }
                    *o = accumulate ? yo + acc[rw][r] : acc[rw][r];
                }
}

/* The RW weight rows a warp takes from row0 on: rows past ne1 repeat the last row (read,
 * summed, never stored), so the loads need no branch. */
template <int RW>
__device__ __forceinline__ void gv_rows_of(const uint8_t *w, size_t row_bytes, int row0, int ne1,
                                           const uint8_t *(&wr)[RW]) {
#pragma unroll
    for (int rw = 0; rw < RW; rw++)
        wr[rw] = w + (size_t)gv_imin(row0 + rw, ne1 - 1) * row_bytes;
}

/* Kinds a and p: one warp's share of RW weight rows (wr[]), items first, first + step,
 * ... Batches of U items, straight-line so all their loads can be issued before the
 * first dot; items past the row end redo the batch's first item with weight 0 (adds
 * exact zeros) instead of branching. An item's x is read once for the RW rows (the
 * dots' loads of the same x are one load after common-subexpression elimination), so
 * x traffic per weight byte falls by RW. Rows of <= 2 items per lane (4096 values of
 * Q4_K/Q6_K) take batches of 2, so half the work is not thrown away; decode rows of
 * exactly 6 (below) one batch of 6. x: plain int8 x
 * (kind a) or the type's permuted copy (kind p, xs its padded row stride). A batch's
 * weights are loaded into registers (Q::load) before its first dot. __host__
 * __device__: the host emulation runs it per lane (RW 1: one row's sums do not depend
 * on RW). */
template <int TYPE, int NR, bool PERM, int RW>
__host__ __device__ __forceinline__ void
gv_item_rows(const uint8_t *const (&wr)[RW], int n_items, int first, int step, const int8_t *x,
             int xs, const float2 *ds, int ne0, int nr, float (&acc)[RW][NR]) {
    using Q = gv<TYPE>;
    constexpr int GS = Q::BLK / Q::IPB == 32 ? GV_GS_B32 : GV_GS_K4; /* values an item */
    auto rows = [&](auto u_c) {
        constexpr int U = decltype(u_c)::value;
        for (int it = first; it < n_items; it += U * step) {
            typename Q::raw w[U][RW];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int i0 = it + u * step, i = u == 0 || i0 < n_items ? i0 : it;
#pragma unroll
                for (int rw = 0; rw < RW; rw++)
                    Q::load(w[u][rw], wr[rw] + (size_t)(i / Q::IPB) * Q::BYTES, i % Q::IPB);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int i0 = it + u * step;
                const bool ok = u == 0 || i0 < n_items;
                const int i = ok ? i0 : it, blk = i / Q::IPB;
                const int8_t *xi =
                    PERM ? x + (size_t)GS * (i >> 5) + 16 * (i & 31) : x + (size_t)blk * Q::BLK;
#pragma unroll
                for (int rw = 0; rw < RW; rw++)
                    Q::template dot<NR, PERM>(w[u][rw], i % Q::IPB, xi, xs,
                                              ds + (size_t)blk * (Q::BLK / GV_QK), ne0 / GV_QK, nr,
                                              ok ? 1.0f : 0.0f, acc[rw]);
            }
        }
    };
    /* kind p's one x row and weight row a warp of Q4_K, Q5_K and Q6_K's groups: rows of 6
     * items a lane (K 12288, the down products) in one batch of 6 instead of 4, then 2
     * with 2 redone at weight 0 (test_gemv_cuda bench, us: Q4_K 12288 x 4096 10.53 ->
     * 9.47, Q6_K groups 13.69 -> 13.23; tg128 Q4_K_M +1.5 %; bench/NOTES.md change 74;
     * Q5_K with its rings, change 137: Q5_K_M +6.2 %) */
    constexpr bool ONE6 =
        NR == 1 && RW == 1 && PERM &&
        (TYPE == TPI_TYPE_Q4_K || TYPE == TPI_TYPE_Q5_K || TYPE == KERN_TYPE_Q6_KX8);
    if (n_items <= 2 * step)
        rows(std::integral_constant<int, 2>{});
    else if (ONE6 && n_items == 6 * step)
        rows(std::integral_constant < int, ONE6 ? 6 : GV_UNROLL > {});
    else
        rows(std::integral_constant<int, GV_UNROLL>{});
}

/* The weights of one launch (kern_gemv_v3_run_n): up to OPS_MAX_FUSED weights that share
 * x, type and row length. Weight s owns blocks b0[s] .. b0[s + 1] - 1 of the grid, laid
 * out as a launch of that weight alone would lay them out (its own wpr), so each output
 * is computed (and summed, in the same order) exactly as by that launch. */
struct gv_segs {
    const uint8_t *w[OPS_MAX_FUSED];
    float *y[OPS_MAX_FUSED];
    int ne1[OPS_MAX_FUSED], wpr[OPS_MAX_FUSED], b0[OPS_MAX_FUSED];
    int n;
    int trigger;        /* kern_dep_trigger at the start (ctx->gemv_trigger; kinds a and p) */
    int pf_blocks;      /* blocks < pf_blocks ask L2 for weight 0's bytes [b pf_chunk, ..) */
    long long pf_chunk; /* before the wait (ctx->gemv_prefetch); 0: none */
    int ypre;           /* accumulate's y loaded after the wait (gv_y_pre; the ypre knob) */
};
/* Blocks < sg.pf_blocks ask L2 for their chunk of weight 0 (row_bytes a row;
 * cp.async.bulk.prefetch.L2, a warp a quarter of the chunk). The weights are no kernel's
 * output: called before the PDL wait, while the previous kernel (the attention, past its
 * K/V stream or from its start) still runs. */
__device__ __forceinline__ void gv_l2_prefetch(const gv_segs &sg, size_t row_bytes) {
    if (sg.pf_chunk && (int)blockIdx.x < sg.pf_blocks && (threadIdx.x & 31) == 0) {
        const long long total = (long long)sg.ne1[0] * (long long)row_bytes;
        const long long q = (sg.pf_chunk / GV_WARPS + 15) & ~15ll;
        const long long at = (long long)blockIdx.x * sg.pf_chunk + (threadIdx.x >> 5) * q;
        const long long n = at < total ? (total - at < q ? total - at : q) : 0;
        if (n >= 16) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(sg.w[0] + at),
                         "r"((unsigned)(n & ~15ll))
                         : "memory");
#endif
        }
    }
}
/* The one-row products' block geometry in fewer instructions after the PDL wait, a mode
 * of two bits: GV_GEOM_SHIFT, rows and part from wpr (a power of two <= GV_WARPS, gv_wpr)
 * by shifts and a mask, not two integer divisions; GV_GEOM_ONE, a launch of one weight's
 * fields read without the segment lookup. Measured per kernel (bench/NOTES.md change
 * 130, runs 219-221): both pay in Q6_K's and Q8_0's 8-block groups (lm_head's 37,984
 * blocks walk the path in ~36 waves: 130 -> 122 us); Q4_K's one-row kernel gains with the
 * shifts (tg128 Q4_K_M +0.8-1.0 %) and loses with ONE (56 -> 48 registers, its loads
 * scheduled otherwise: -0.6 % at depth 8192); the other types' one-row kernels take the
 * shifts too (change 131, run 223: Q4_0 +1.3 %; BF16's own kernel +0.2 %). Kernels of
 * more rows and the two-type Q/K/V launch (level with the shifts, run 223) keep the
 * divisions. */
#define GV_GEOM_SHIFT 1
#define GV_GEOM_ONE 2
template <int TYPE, int NR, int RW> constexpr int gv_geom() {
    if (TYPE == KERN_TYPE_Q6_KX8) return GV_GEOM_SHIFT | GV_GEOM_ONE;
    if (NR == 1 && RW == 1 && TYPE == KERN_TYPE_Q8_0X8) return GV_GEOM_SHIFT | GV_GEOM_ONE;
    if (NR == 1 && RW == 1) return GV_GEOM_SHIFT;
    return 0;
}
/* The first of the RW rows warp `warp` of block blk takes, and which of the row's wpr
 * warps it is. */
template <int RW, bool GEOM = false>
__device__ __forceinline__ int gv_row0(int blk, int warp, int wpr) {
    if constexpr (GEOM) {
        const int lw = __ffs(wpr) - 1;
        return ((blk << (GV_LOG_WARPS - lw)) + (warp >> lw)) * RW;
    }
    return (blk * (GV_WARPS / wpr) + warp / wpr) * RW;
}
template <bool GEOM = false> __device__ __forceinline__ int gv_part(int warp, int wpr) {
    if constexpr (GEOM) return warp & (wpr - 1);
    return warp % wpr;
}
/* This block's weight: its data, output, rows, warps per row and block index in it. */
struct gv_seg {
    const uint8_t *w;
    float *y;
    int ne1, wpr, blk;
};
template <bool MULTI = true, bool GEOM = false>
__device__ __forceinline__ gv_seg gv_seg_of(const gv_segs &sg, int base = 0) {
    const int b = (int)blockIdx.x - base; /* base: the blocks of a launch's other type first */
    if (!MULTI) return {sg.w[0], sg.y[0], sg.ne1[0], sg.wpr[0], b};
    /* GEOM (gv_geom's GV_GEOM_ONE), one weight (the downs, wo, lm_head): its fields read
     * directly, not through the lookup's dependent indexed constant loads after the wait */
    if (GEOM && sg.n == 1) return {sg.w[0], sg.y[0], sg.ne1[0], sg.wpr[0], b};
    int i = 0;
#pragma unroll
    for (int k = 1; k < OPS_MAX_FUSED; k++)
        if (k < sg.n && b >= sg.b0[k]) i = k; /* constant indices: no local copy */
    gv_seg r = {sg.w[0], sg.y[0], sg.ne1[0], sg.wpr[0], b};
#pragma unroll
    for (int k = 1; k < OPS_MAX_FUSED; k++)
        if (i == k) r = {sg.w[k], sg.y[k], sg.ne1[k], sg.wpr[k], b - sg.b0[k]};
    return r;
}

/* Kinds a and p, quantized weights: warp (group, part) takes items part*32 + lane,
 * stepping 32*wpr, of the RW rows from group*RW on of its block's weight (gv_seg_of;
 * base: blocks of the launch before sg's first; G: gv_geom's mode, which the two-type
 * launch's sides do not take, as measured). */
template <int TYPE, int NR, bool PERM, int RW, int G = gv_geom<TYPE, NR, RW>()>
__device__ __forceinline__ void
gv_quant_body(const gv_segs &sg, size_t row_bytes, int ne0, const int8_t *__restrict__ x, int xs,
              const float2 *__restrict__ ds, int nr, bool accumulate, int base = 0) {
    using Q = gv<TYPE>;
    if (sg.trigger) kern_dep_trigger();
    gv_l2_prefetch(sg, row_bytes);
    const gv_seg me = gv_seg_of<true, (G & GV_GEOM_ONE) != 0>(sg, base);
    const uint8_t *__restrict__ w = me.w;
    const int ne1 = me.ne1, wpr = me.wpr;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    constexpr bool SH = (G & GV_GEOM_SHIFT) != 0;
    const int row0 = gv_row0<RW, SH>(me.blk, warp, wpr), part = gv_part<SH>(warp, wpr);
    float acc[RW][NR];
#pragma unroll
    for (int rw = 0; rw < RW; rw++)
#pragma unroll
        for (int r = 0; r < NR; r++)
            acc[rw][r] = 0.0f;
    /* The wait comes first: x is read with plain loads (so that the RW rows share them),
     * which the compiler may move up to, but not above, the branch that guards them. */
    gv_grid_dep_wait();
    gv_y_pre<NR, RW>(me.y, ne1, row0, part, accumulate, sg.ypre);
    if (row0 < ne1) {
        const uint8_t *wr[RW];
        gv_rows_of<RW>(w, row_bytes, row0, ne1, wr);
        gv_item_rows<TYPE, NR, PERM, RW>(wr, (ne0 / Q::BLK) * Q::IPB, part * 32 + lane, 32 * wpr, x,
                                         xs, ds, ne0, nr, acc);
    }
    /* pre from the parameters again (constant bank: no register across the items) */
    gv_store<NR, RW>(acc, me.y, ne1, nr, row0, part, wpr, accumulate,
                     gv_y_pre_on<NR, RW>(accumulate, sg.ypre));
}

template <int TYPE, int NR, bool PERM, int RW>
__global__ void __launch_bounds__(GV_WARPS * 32)
    gv_quant_kernel(const gv_segs sg, size_t row_bytes, int ne0, const int8_t *__restrict__ x,
                    int xs, const float2 *__restrict__ ds, int nr, bool accumulate) {
    gv_quant_body<TYPE, NR, PERM, RW>(sg, row_bytes, ne0, x, xs, ds, nr, accumulate);
}
/* The same held to MINB blocks a multiprocessor: Q8_0's 8-block groups with one x row
 * (GV_X8_MIN_BLOCKS for 2-4 weight rows a warp, the x8bound knob for one), Q6_K's groups
 * with one x row and weight row (4 on long rows, else x8bound), Q4_K's and GGUF Q6_K's
 * long rows (kbound). Unbounded, ptxas gives the Q8_0 kernel 48 registers; at 4
 * blocks it takes 96 and keeps more of a batch's 16-byte loads ahead of its dots; held
 * to 32 (16 blocks) it interleaves them. tg128 Q8_0 on one H200 (two runs each,
 * bench/NOTES.md change 22): 312.7 at 32, 336.7 / 336.2 at 48, 351.6 / 351.2 at 96,
 * against 329.7 / 329.7 for the GGUF blocks' kernel (32 registers; 329.3 / 332.0 at
 * 110). At 8 blocks (64 registers) a 4096-row product is one wave of 1056 blocks instead
 * of 1.94 waves: 364.5 / 366.6 against 360.1 / 361.9 at 4 (change 32), so 8 is the
 * one-row default. A second argument to __launch_bounds__ for the other kernels, even 1,
 * makes ptxas take far more registers (Q4_K 40 -> 154: tg128 Q4_K_M 406 -> 337), so
 * they keep the one-argument form. */
#define GV_X8_MIN_BLOCKS 4
#define GV_X8_BOUND_DEFAULT 8
template <int TYPE, int NR, bool PERM, int RW, int MINB>
__global__ void __launch_bounds__(GV_WARPS * 32, MINB)
    gv_quant_kernel_held(const gv_segs sg, size_t row_bytes, int ne0, const int8_t *__restrict__ x,
                         int xs, const float2 *__restrict__ ds, int nr, bool accumulate) {
    gv_quant_body<TYPE, NR, PERM, RW>(sg, row_bytes, ne0, x, xs, ds, nr, accumulate);
}
/* The kind a/p kernel a launch of type TYPE with NR x rows takes; kbound (the kbound
 * knob: 0, 6, 8 or 10, default 0) holds Q4_K's and Q6_K's one-row kernels to that many
 * blocks a multiprocessor (ptxas then takes 80, 64 and 48 registers, 40 unbounded) for
 * rows of at least GV_KBOUND_MIN_NE0 values (the down products; Q6_K's groups: 4 blocks
 * whenever kbound is not 0, else x8bound's 8). On every shape it
 * lost (run 34: lm_head Q6_K 160 -> 215 us at 8); on the 12288-value rows it gained with
 * batches of 4 items (Q6_K 21.1 -> 18.5 us at 10, Q4_K 11.6 -> 10.5; tg128 Q4_K_M +1.2 %,
 * run 35; bench/NOTES.md change 30), and loses since those rows take one batch of 6
 * (change 74; run 136: tg128 Q4_K_M 465.4 at 10, 472.3 at 0). */
#define GV_KBOUND_MIN_NE0 8192
template <int TYPE, int NR, bool PERM, int RW> auto gv_quant_kernel_for(int kbound, int x8bound) {
    if constexpr (TYPE == KERN_TYPE_Q8_0X8 && NR == 1) {
        if constexpr (RW == 1) { /* the x8bound knob (GV_X8_BOUND_DEFAULT by default) */
            if (x8bound == 5) return gv_quant_kernel_held<TYPE, NR, PERM, RW, 5>;
            if (x8bound == 6) return gv_quant_kernel_held<TYPE, NR, PERM, RW, 6>;
            if (x8bound == 8) return gv_quant_kernel_held<TYPE, NR, PERM, RW, 8>;
        }
        return gv_quant_kernel_held<TYPE, NR, PERM, RW, GV_X8_MIN_BLOCKS>;
    }
    if constexpr (TYPE == KERN_TYPE_Q6_KX8 && NR == 1 && RW == 1) {
        /* Q6_K's groups (52 registers unbounded): long rows (kbound given, the down
         * products) held to 4 blocks (128 registers; run 44: 12288x4096 13.71 us against
         * 14.33 at 8), other shapes by the x8bound knob (lm_head 130.0 us at 8, 139.3 at 4) */
        if (kbound != 0) return gv_quant_kernel_held<TYPE, NR, PERM, RW, 4>;
        if (x8bound == 4) return gv_quant_kernel_held<TYPE, NR, PERM, RW, 4>;
        if (x8bound == 5) return gv_quant_kernel_held<TYPE, NR, PERM, RW, 5>;
        if (x8bound == 6) return gv_quant_kernel_held<TYPE, NR, PERM, RW, 6>;
        return gv_quant_kernel_held<TYPE, NR, PERM, RW, 8>;
    }
    if constexpr ((TYPE == TPI_TYPE_Q4_K || TYPE == TPI_TYPE_Q6_K) && NR == 1 && RW == 1) {
        if (kbound == 6) return gv_quant_kernel_held<TYPE, NR, PERM, RW, 6>;
        if (kbound == 8) return gv_quant_kernel_held<TYPE, NR, PERM, RW, 8>;
        if (kbound == 10) return gv_quant_kernel_held<TYPE, NR, PERM, RW, 10>;
    }
    return gv_quant_kernel<TYPE, NR, PERM, RW>;
}

/* ------------------------------------------------ two types in one launch (kind p)
 * Q/K/V of a Q4_K_M layer that gives V more bits: Q and K are Q4_K, V Q6_K (its 8-block
 * groups), which as a weight of another type ran as a parallel branch of its own (a
 * side stream forked and joined in the step's graph). One launch takes both: blocks
 * [0, nb0) are side 0's weights, the rest side 1's, each block computing exactly what
 * it computes in its own type's launch (gv_quant_body: same items, order and sums), so
 * outputs are bitwise those of kern_gemv_v3_run_n per type. Decode rows (one x row,
 * one weight row a warp) only. */
struct gv_side {
    gv_segs sg;
    size_t row_bytes;
    const int8_t *x; /* the type's permuted copy (kind p) */
    int xs;
};
template <int T0, int T1>
__device__ __forceinline__ void gv_quant2_body(const gv_side &s0, const gv_side &s1, int nb0,
                                               int ne0, const float2 *__restrict__ ds) {
    if ((int)blockIdx.x < nb0)
        gv_quant_body<T0, 1, true, 1, 0>(s0.sg, s0.row_bytes, ne0, s0.x, s0.xs, ds, 1, false);
    else
        gv_quant_body<T1, 1, true, 1, 0>(s1.sg, s1.row_bytes, ne0, s1.x, s1.xs, ds, 1, false, nb0);
}
template <int T0, int T1>
__global__ void __launch_bounds__(GV_WARPS * 32)
    gv_quant2_kernel(const gv_side s0, const gv_side s1, int nb0, int ne0,
                     const float2 *__restrict__ ds) {
    gv_quant2_body<T0, T1>(s0, s1, nb0, ne0, ds);
}
template <int T0, int T1, int MINB>
__global__ void __launch_bounds__(GV_WARPS * 32, MINB)
    gv_quant2_kernel_held(const gv_side s0, const gv_side s1, int nb0, int ne0,
                          const float2 *__restrict__ ds) {
    gv_quant2_body<T0, T1>(s0, s1, nb0, ne0, ds);
}
/* The two-type kernel held to minb blocks a multiprocessor (8, 10, 12; else unbounded). */
template <int T0, int T1> static auto gv_quant2_kernel_for(int minb) {
    if (minb == 8) return gv_quant2_kernel_held<T0, T1, 8>;
    if (minb == 10) return gv_quant2_kernel_held<T0, T1, 10>;
    if (minb == 12) return gv_quant2_kernel_held<T0, T1, 12>;
    return gv_quant2_kernel<T0, T1>;
}

/* BF16/F16 weights, kind a: one warp's share of RW weight rows (wb[]), items of 8 values
 * (16 bytes) first, first + step, ... in batches of GV_UNROLL whose loads go out before
 * the first dot; each item's x is read once for the RW rows. Items past the row end are
 * zero weights against the batch's first x (exact zeros). */
template <int TYPE, int NR, int RW>
__device__ __forceinline__ void gv_elem_rows(const uint8_t *const (&wb)[RW], int n_items, int first,
                                             int step, const float *x, int ne0, int nr,
                                             float (&acc)[RW][NR]) {
    for (int it = first; it < n_items; it += GV_UNROLL * step) {
        int4 wv[GV_UNROLL][RW];
#pragma unroll
        for (int u = 0; u < GV_UNROLL; u++) {
            const int i = it + u * step;
#pragma unroll
            for (int rw = 0; rw < RW; rw++)
                wv[u][rw] = u == 0 || i < n_items ? gv_ldw16((const int4 *)wb[rw] + i)
                                                  : make_int4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < GV_UNROLL; u++) {
            const int i = it + u * step;
#pragma unroll
            for (int rw = 0; rw < RW; rw++)
                gv_elem<TYPE>::template dot<NR>(
                    wv[u][rw], x + 8 * (size_t)(u == 0 || i < n_items ? i : it), ne0, nr, acc[rw]);
        }
    }
}

/* kind a, BF16/F16 weights: warp (group, part) takes the RW rows from group*RW on
 * (gv_elem_rows). MULTI: several weights (gv_segs) in this launch. The segment lookup
 * cost the one-weight kernel 6 registers (38: 13 blocks a multiprocessor instead of 16,
 * a second partial wave for the 4096-row products) and BF16 tg128 ~7 %, even when held
 * to 32 registers (spills); a launch of one weight therefore reads its one segment's
 * fields directly (MULTI false: the same instructions as before the segments). SH: the
 * rows and part by shifts (gv_geom's GV_GEOM_SHIFT), for the one-row, one-weight launch
 * (change 131, run 223: BF16 tg128 +0.2 %). */
template <int TYPE, int NR, int RW, bool MULTI, bool SH = NR == 1 && RW == 1 && !MULTI>
__global__ void __launch_bounds__(GV_WARPS * 32)
    gv_elem_kernel(const gv_segs sg, size_t row_bytes, int ne0, const float *__restrict__ x, int nr,
                   bool accumulate) {
    const gv_seg me = gv_seg_of<MULTI>(sg);
    const uint8_t *__restrict__ w = me.w;
    const int ne1 = me.ne1, wpr = me.wpr;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row0 = gv_row0<RW, SH>(me.blk, warp, wpr), part = gv_part<SH>(warp, wpr);
    float acc[RW][NR];
#pragma unroll
    for (int rw = 0; rw < RW; rw++)
#pragma unroll
        for (int r = 0; r < NR; r++)
            acc[rw][r] = 0.0f;
    gv_grid_dep_wait(); /* first: x is read with plain loads (see gv_quant_kernel) */
    if (row0 < ne1) {
        const uint8_t *wb[RW];
        gv_rows_of<RW>(w, row_bytes, row0, ne1, wb);
        gv_elem_rows<TYPE, NR, RW>(wb, ne0 / 8, part * 32 + lane, 32 * wpr, x, ne0, nr, acc);
    }
    gv_store<NR, RW>(acc, me.y, ne1, nr, row0, part, wpr, accumulate);
}

/* ------------------------------------------- gate/up with silu*mul (one decode row)
 * The FFN's gate and up products and silu(gate) * up in one launch with no block waiting
 * for another: a warp takes gate row j and up row j together (the RW = 2 form of the
 * kernels above, x read once for both), so it holds both sums of output j; a block owns
 * 32 consecutive outputs, the values of one int8 block of the down matmul's x, and
 * quantizes them itself (kern_q8_block, the permuted copies of kern_xq.cuh) after a
 * barrier of its own. Each sum is the one-weight kernel's with one warp a row (same
 * items, same order, same shuffle tree), and silu*mul is silu_mul's arithmetic
 * (kern_silu_mul1), so g, u and g's int8 form are bitwise those of matmul_n + silu_mul
 * wherever that launch gives a row one warp. */

/* A gate/up block's output stage: after a barrier, its first warp writes the silu*mul
 * values sv of the block's 32 outputs into g and, unless oq is NULL, their int8 block
 * for the down matmul (kern_q8_block, the permuted copies). */
__device__ __forceinline__ void gv_glu_block_out(const float *sv, float *g, int8_t *oq, float2 *ods,
                                                 const gv_xlayout &olay, int n_ff) {
    __syncthreads();
    if ((threadIdx.x >> 5) == 0) {
        const int lane = threadIdx.x & 31, j = (int)blockIdx.x * 32 + lane;
        const float v = sv[lane];
        g[j] = v;
        if (oq) gv_perm_store_at(kern_q8_block(v, j, oq, ods), 0, j, olay, oq); /* one row */
    }
}

/* Quantized weights: block b owns outputs 32b..32b+31; its W warps take 32 / W of them
 * each, one after another. oq NULL: no int8 form. */
template <int TYPE, bool PERM, int W>
__device__ __forceinline__ void
gv_glu_quant_body(const uint8_t *__restrict__ wg, const uint8_t *__restrict__ wu, size_t row_bytes,
                  int ne0, int n_ff, const int8_t *x, int xs, const float2 *ds, float *g, float *u,
                  int8_t *oq, float2 *ods, const gv_xlayout &olay) {
    using Q = gv<TYPE>;
    constexpr int PER = 32 / W; /* outputs a warp */
    __shared__ float sv[32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n_items = (ne0 / Q::BLK) * Q::IPB;
    gv_grid_dep_wait(); /* first: x is read with plain loads (see gv_quant_kernel) */
#pragma unroll 1
    for (int k = 0; k < PER; k++) {
        const int o = warp * PER + k, j = (int)blockIdx.x * 32 + o;
        const uint8_t *wr[2] = {wg + (size_t)j * row_bytes, wu + (size_t)j * row_bytes};
        float acc[2][1] = {{0.0f}, {0.0f}};
        gv_item_rows<TYPE, 1, PERM, 2>(wr, n_items, lane, 32, x, xs, ds, ne0, 1, acc);
        const float gs = gv_warp_sum(acc[0][0]), us = gv_warp_sum(acc[1][0]);
        if (lane == 0) {
            u[j] = us;
            sv[o] = kern_silu_mul1(gs, us);
        }
    }
    gv_glu_block_out(sv, g, oq, ods, olay, n_ff);
}
template <int TYPE, bool PERM, int W>
__global__ void __launch_bounds__(W * 32)
    gv_glu_quant_kernel(const uint8_t *__restrict__ wg, const uint8_t *__restrict__ wu,
                        size_t row_bytes, int ne0, int n_ff, const int8_t *x, int xs,
                        const float2 *ds, float *g, float *u, int8_t *oq, float2 *ods,
                        gv_xlayout olay) {
    gv_glu_quant_body<TYPE, PERM, W>(wg, wu, row_bytes, ne0, n_ff, x, xs, ds, g, u, oq, ods, olay);
}
/* Q8_0's 8-block groups with 8 warps a block, held to 3 blocks a multiprocessor (up to 85
 * registers; 384 blocks of the 8B model's FFN still fit one wave): unbounded, ptxas
 * gives the kernel 62 registers, fewer than a batch's 8 weight items (72) and their x
 * need to be in flight at once (gv_quant_kernel_held: the same effect for one row). */
#define GV_GLU_X8_MIN_BLOCKS 3
template <int TYPE, bool PERM, int W, int MINB>
__global__ void __launch_bounds__(W * 32, MINB)
    gv_glu_quant_kernel_held(const uint8_t *__restrict__ wg, const uint8_t *__restrict__ wu,
                             size_t row_bytes, int ne0, int n_ff, const int8_t *x, int xs,
                             const float2 *ds, float *g, float *u, int8_t *oq, float2 *ods,
                             gv_xlayout olay) {
    gv_glu_quant_body<TYPE, PERM, W>(wg, wu, row_bytes, ne0, n_ff, x, xs, ds, g, u, oq, ods, olay);
}
/* The gate/up kernel of type TYPE with W warps a block. (Q4_K's held to 4-6 blocks of 4
 * warps, 85-128 registers, measured no faster than 8 warps at 80 unbounded: run 34.)
 * Q3_K's groups as Q8_0's (97 registers unbounded: 4 warps a block would be the most that
 * keep the 8B's 384 blocks resident; bench/NOTES.md change 151). */
template <int TYPE, bool PERM, int W> constexpr auto gv_glu_kernel_for() {
    if constexpr ((TYPE == KERN_TYPE_Q8_0X8 || TYPE == KERN_TYPE_Q3_KX8) && W == 8)
        return gv_glu_quant_kernel_held<TYPE, PERM, W, GV_GLU_X8_MIN_BLOCKS>;
    else
        return gv_glu_quant_kernel<TYPE, PERM, W>;
}

/* Gate/up with rows of 4096 values streamed through shared memory: Q4_K, by default
 * wherever the shape allows (bench/NOTES.md change 70: tg128 Q4_K_M +2.7 % at depth 0
 * and 8192 on the H200; Q8_0's groups the same way were level with their own kernel,
 * change 72, so they keep it). The kernel above loads a row pair's items into registers
 * and dots them before the next pair's loads go out, so a warp has one pair in flight
 * only part of the time; bench/gemv_chain.cu measured that shape at 19.5 us for the
 * 56.6 MB of a Qwen3-8B FFN's Q4_K gate and up where bare reads of the same bytes take
 * 13.6. Here each warp's PER = 32 / W row pairs go through a ring of S pair slots in
 * shared memory, filled with 16-byte cp.async S - 1 pairs ahead of the pair being dotted
 * (the first ones before the PDL wait: weights), and the lane's items of x (and their
 * (d, d*sum) pairs) stay in registers for all its pairs. The items, their order, the
 * sums and the output stage are the kernel above's (gv_ring_item runs what gv<T>::dot
 * runs), so g, u and g's int8 form are bitwise the same. */
#define GV_RING_NE0 4096 /* the one row length */
#ifndef TPI_GV_Q40RING
#define TPI_GV_Q40RING 1 /* 0: grouped Q4_0 takes neither ring kernel (measuring change 142) */
#endif
/* One item of type T from a row in shared memory against x units held in registers
 * (a type the ring kernel takes specializes it). */
template <int T> struct gv_ring_item;
template <> struct gv_ring_item<TPI_TYPE_Q4_K> { /* 64 values: 4 units, 2 pairs */
    using Q = gv<TPI_TYPE_Q4_K>;
    static constexpr int UNITS = 4;
    using dsv = float4;
    static __device__ __forceinline__ dsv load_ds(const float2 *ds, int blk, int c) {
        return gv_ldf4((const float *)(ds + (size_t)blk * (Q::BLK / GV_QK) + 2 * c));
    }
    static __device__ __forceinline__ float dot(const uint8_t *row, int blk, int c,
                                                const int4 (&xv)[UNITS], const dsv f) {
        const uint8_t *b = row + blk * Q::BYTES;
        Q::raw w;
        w.qa = *(const int4 *)(b + 16 + 32 * c);
        w.qb = *(const int4 *)(b + 16 + 32 * c + 16);
        w.hd = *(const int4 *)b;
        return Q::row_dot<Q::HI>(Q::unpack<Q::HI>(w, c, 1.0f), xv[0], xv[1], xv[2], xv[3], f);
    }
};
/* Q5_K: Q4_K's item with its fifth bits (gv<Q5_K>::unpack), the same x units and sums. */
template <> struct gv_ring_item<TPI_TYPE_Q5_K> : gv_ring_item<TPI_TYPE_Q4_K> {
    using Q = gv<TPI_TYPE_Q5_K>;
    static __device__ __forceinline__ float dot(const uint8_t *row, int blk, int c,
                                                const int4 (&xv)[UNITS], const dsv f) {
        const uint8_t *b = row + blk * Q::BYTES;
        Q::raw w;
        w.qa = *(const int4 *)(b + 48 + 32 * c);
        w.qb = *(const int4 *)(b + 48 + 32 * c + 16);
        w.ha = *(const int4 *)(b + 16);
        w.hb = *(const int4 *)(b + 32);
        w.hd = *(const int4 *)b;
        return gv<TPI_TYPE_Q4_K>::row_dot(Q::unpack(w, c, 1.0f), xv[0], xv[1], xv[2], xv[3], f);
    }
};
/* Q4_0 in groups of 8 blocks (KERN_LAYOUT_Q4_0X8): an item is a block, 32 values (2 x
 * units) and one x scale; the sum and its scaling are gv<Q4_0>::dot's for one row. */
template <> struct gv_ring_item<KERN_TYPE_Q4_0X8> {
    using Q = gv<KERN_TYPE_Q4_0X8>;
    static constexpr int UNITS = 2;
    using dsv = float; /* the block's dx */
    static __device__ __forceinline__ dsv load_ds(const float2 *ds, int blk, int c) {
        return gv_ldf2(ds + (size_t)blk * (Q::BLK / GV_QK) + c).x;
    }
    static __device__ __forceinline__ float dot(const uint8_t *row, int blk, int c,
                                                const int4 (&xv)[UNITS], const dsv f) {
        const uint8_t *b = row + blk * Q::BYTES;
        const int4 a = *(const int4 *)(b + 16 * c);
        const uint32_t w[4] = {(uint32_t)a.x, (uint32_t)a.y, (uint32_t)a.z, (uint32_t)a.w};
        uint32_t lo[4], hi[4];
        gv_q4_0_bytes(w, lo, hi);
        const int s = gv_dp4a_x4(hi, xv[1], gv_dp4a_x4(lo, xv[0], 0));
        const float d = gv_h2f(*(const uint16_t *)(b + 128 + 2 * c));
        return d * f * (float)s;
    }
};
/* A ring kernel's lane's NI items of x (kind a's plain x, or kind p's permuted copy) and
 * their (d, d*sum) pairs, into registers for all its rows (loaded after the PDL wait). */
template <int T, bool PERM, int NI>
__device__ __forceinline__ void gv_ring_x(const int8_t *x, const float2 *ds, int lane,
                                          int4 (&xv)[NI][gv_ring_item<T>::UNITS],
                                          typename gv_ring_item<T>::dsv (&xf)[NI]) {
    using Q = gv<T>;
    using It = gv_ring_item<T>;
    constexpr int GS = Q::BLK / Q::IPB == 32 ? GV_GS_B32 : GV_GS_K4;
#pragma unroll
    for (int v = 0; v < NI; v++) {
        const int i = lane + 32 * v, blk = i / Q::IPB, c = i % Q::IPB;
        const int vals = Q::BLK / Q::IPB; /* values an item */
        const int8_t *xi =
            PERM ? x + (size_t)GS * (i >> 5) + 16 * (i & 31) : x + (size_t)blk * Q::BLK;
#pragma unroll
        for (int k = 0; k < It::UNITS; k++)
            xv[v][k] = gv_ldx128(gv_xunit<PERM>(xi, vals * c + 16 * k, k));
        xf[v] = It::load_ds(ds, blk, c);
    }
}

template <int T, bool PERM, int W, int S>
__global__ void __launch_bounds__(W * 32)
    gv_glu_ring_kernel(const uint8_t *__restrict__ wg, const uint8_t *__restrict__ wu,
                       size_t row_bytes, int n_ff, const int8_t *x, const float2 *ds, float *g,
                       float *u, int8_t *oq, float2 *ods, gv_xlayout olay) {
    using Q = gv<T>;
    using It = gv_ring_item<T>;
    constexpr int PER = 32 / W, RB = GV_RING_NE0 / Q::BLK * Q::BYTES, PIECES = RB / 16;
    constexpr int NI = GV_RING_NE0 / Q::BLK * Q::IPB / 32; /* items a lane */
    static_assert(RB % 16 == 0, "rows of whole 16-byte pieces");
    extern __shared__ __align__(16) uint8_t gv_ring[];
    __shared__ float sv[32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int j0 = (int)blockIdx.x * 32 + warp * PER; /* the warp's first output */
    uint8_t *ring = gv_ring + (size_t)warp * S * 2 * RB;
    const uint32_t ring_s = mma_smem_u32(ring);
    const uint64_t pol = kern_stream_policy();
    /* pair k (gate row j0 + k, then up row j0 + k) into slot st; one commit group each */
    auto issue = [&](int k, int st) {
        if (k < PER) {
            const uint8_t *src_g = wg + (size_t)(j0 + k) * row_bytes;
            const uint8_t *src_u = wu + (size_t)(j0 + k) * row_bytes;
            const uint32_t dst = ring_s + (uint32_t)(st * 2 * RB);
#pragma unroll
            for (int i = 0; i < (PIECES + 31) / 32; i++) {
                const int pc = lane + 32 * i;
                if (pc < PIECES) {
                    mma_cp16_once(dst + 16u * (uint32_t)pc, src_g + 16 * pc, pol);
                    mma_cp16_once(dst + (uint32_t)RB + 16u * (uint32_t)pc, src_u + 16 * pc, pol);
                }
            }
        }
        mma_commit();
    };
#pragma unroll
    for (int k = 0; k < S - 1; k++)
        issue(k, k);
    gv_grid_dep_wait(); /* x is the previous kernel's output */
    int4 xv[NI][It::UNITS];
    typename It::dsv xf[NI];
    gv_ring_x<T, PERM, NI>(x, ds, lane, xv, xf);
#pragma unroll 1
    for (int k = 0; k < PER; k++) {
        mma_wait<S - 2>(); /* this lane's copies of pair k have landed */
        __syncwarp();      /* and every lane's */
        const uint8_t *slot = ring + (size_t)(k % S) * 2 * RB;
        float acc[2] = {0.0f, 0.0f};
#pragma unroll
        for (int v = 0; v < NI; v++) {
            const int i = lane + 32 * v, blk = i / Q::IPB, c = i % Q::IPB;
#pragma unroll
            for (int rw = 0; rw < 2; rw++)
                acc[rw] += It::dot(slot + rw * RB, blk, c, xv[v], xf[v]);
        }
        const float gs = gv_warp_sum(acc[0]), us = gv_warp_sum(acc[1]);
        if (lane == 0) {
            u[j0 + k] = us;
            sv[warp * PER + k] = kern_silu_mul1(gs, us);
        }
        __syncwarp(); /* every lane is done with slot k % S before it is refilled */
        issue(k + S - 1, (k + S - 1) % S);
    }
    gv_glu_block_out(sv, g, oq, ods, olay, n_ff);
}
/* The ring kernel's shape: 4 warps a block, 3 pair slots (55 KB a block, 4 an SM: the
 * n_ff / 32 blocks of an 8B model's FFN are one wave on the H200). Run 127 measured 2
 * and 4 slots 0.5-1 % slower; run 129, 2 warps no faster. */
#define GV_RING_WARPS 4
#define GV_RING_STAGES 3
/* Let kernel K use smem bytes of dynamic shared memory (asked once a kernel and size;
 * one device a process); false if refused. */
template <auto K> static bool gv_smem_optin(size_t smem) {
    static size_t allowed = 0;
    if (smem <= allowed) return true;
    if (cudaFuncSetAttribute(K, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
        cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    allowed = smem;
    return true;
}
/* Launch the ring kernel for one gate/up pair if it takes it (Q4_K, Q5_K or grouped Q4_0
 * rows of GV_RING_NE0 values, 16-byte aligned, its shared memory allowed); false: nothing
 * launched. */
template <int T, bool PERM>
static bool gv_glu_ring_launch(struct ops_ctx *ctx, bool pdl, const uint8_t *dg, const uint8_t *du,
                               size_t row_bytes, int ne0, int n_ff, const int8_t *x,
                               const float2 *ds, float *g, float *u, int8_t *oq, float2 *ods,
                               const gv_xlayout &olay, cudaStream_t stream) {
    if constexpr (T != TPI_TYPE_Q4_K && T != TPI_TYPE_Q5_K &&
                  (T != KERN_TYPE_Q4_0X8 || !TPI_GV_Q40RING)) {
        return false;
    } else {
        using Q = gv<T>;
        constexpr int W = GV_RING_WARPS, S = GV_RING_STAGES;
        const size_t smem = (size_t)W * S * 2 * row_bytes;
        if (ne0 != GV_RING_NE0 || row_bytes != (size_t)GV_RING_NE0 / Q::BLK * Q::BYTES ||
            (((uintptr_t)dg | (uintptr_t)du) & 15) || smem > (size_t)ctx->smem_optin)
            return false;
        constexpr auto kern = gv_glu_ring_kernel<T, PERM, W, S>;
        if (!gv_smem_optin<kern>(smem)) return false;
        kern_launch(pdl, kern, dim3((unsigned)(n_ff / 32)), dim3(W * 32), smem, stream, dg, du,
                    row_bytes, n_ff, x, ds, g, u, oq, ods, olay);
        return true;
    }
}

/* ------------------------------------- one weight's rows, all copied before the wait
 * A product of one Q4_K weight of rows of GV_RING_NE0 values and one x row (wo's shape)
 * held to a few blocks an SM: warp g of the grid takes the contiguous rows
 * [ne1 * g / n_w, ne1 * (g + 1) / n_w) (at most S) and copies all of them into its S
 * row slots of shared memory before the PDL wait (weights: no kernel's output), so when
 * the kernel ahead lets it in at its start (a shallow decode attention: ctx->wo_prefetch,
 * ctx->gemv_prefetch == 2) its whole weight stream overlaps that kernel; after the wait
 * it loads x (kind p's permuted copy, in registers), dots its rows from shared memory and
 * stores. The items, their order and the sums are the one-row kind p kernel's
 * (gv_ring_item runs what gv<T>::dot runs; y's value added last, copied into shared
 * memory at the wait as gv_y_pre does): y bitwise the same. P: that kernel's warps a row
 * (gv_wpr: 2 for Q4_0's 128 items on fewer than n_sm x 16 rows of 4096 values); each lane
 * then sums part v % P's items apart, and the P warp sums are added in gv_store's order.
 * bench/NOTES.md change 97 (`TPI_GEMV_RING1`), change 142 (Q4_0). */
#define GV_RING1_WARPS 4
template <int T, int S, int P>
__global__ void __launch_bounds__(GV_RING1_WARPS * 32)
    gv_ring1_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int ne1, const int8_t *x,
                    const float2 *ds, float *y, bool accumulate) {
    using Q = gv<T>;
    using It = gv_ring_item<T>;
    constexpr int W = GV_RING1_WARPS, RB = GV_RING_NE0 / Q::BLK * Q::BYTES, PIECES = RB / 16;
    constexpr int NI = GV_RING_NE0 / Q::BLK * Q::IPB / 32; /* items a lane */
    static_assert(RB % 16 == 0 && S <= 32, "rows of whole 16-byte pieces, a y value a lane");
    static_assert(NI % P == 0, "whole parts");
    extern __shared__ __align__(16) uint8_t gv_ring[];
    __shared__ float ys[W][S];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long long gw = (long long)blockIdx.x * W + warp, n_w = (long long)gridDim.x * W;
    const int r0 = (int)(ne1 * gw / n_w), nr = (int)(ne1 * (gw + 1) / n_w) - r0; /* <= S */
    uint8_t *ring = gv_ring + (size_t)warp * S * RB;
    const uint32_t ring_s = mma_smem_u32(ring);
#pragma unroll
    for (int k = 0; k < S; k++)
        if (k < nr) {
            const uint8_t *src = w + (size_t)(r0 + k) * row_bytes;
#pragma unroll
            for (int i = 0; i < (PIECES + 31) / 32; i++) {
                const int pc = lane + 32 * i;
                if (pc < PIECES)
                    mma_cp16_once(ring_s + (uint32_t)(k * RB + 16 * pc), src + 16 * pc,
                                  kern_stream_policy());
            }
        }
    mma_commit();
    gv_grid_dep_wait(); /* x (and y) are the kernels' outputs */
    if (accumulate && lane < nr) gv_cp4(&ys[warp][lane], y + r0 + lane);
    mma_commit();
    int4 xv[NI][It::UNITS];
    typename It::dsv xf[NI];
    gv_ring_x<T, true, NI>(x, ds, lane, xv, xf);
    mma_wait<0>(); /* this lane's copies (rows and y) have landed */
    __syncwarp();  /* and every lane's */
#pragma unroll 1
    for (int k = 0; k < nr; k++) {
        const uint8_t *slot = ring + (size_t)k * RB;
        float part[P];
#pragma unroll
        for (int p = 0; p < P; p++)
            part[p] = 0.0f;
#pragma unroll
        for (int v = 0; v < NI; v++) {
            const int i = lane + 32 * v;
            part[v % P] += It::dot(slot, i / Q::IPB, i % Q::IPB, xv[v], xf[v]);
        }
        float acc = gv_warp_sum(part[0]);
        if (P > 1) { /* gv_store's sum of the parts: from 0, in part order */
            acc = 0.0f;
#pragma unroll
            for (int p = 0; p < P; p++)
                acc += gv_warp_sum(part[p]);
        }
        if (lane == 0) y[r0 + k] = accumulate ? ys[warp][k] + acc : acc;
    }
}

/* Launch gv_ring1_kernel for one weight w (n_sm * per_sm blocks) if it takes the shape
 * (Q4_K, Q5_K or grouped Q4_0 rows of GV_RING_NE0 values, 16-byte aligned, at most 8 rows
 * a warp, the shared memory allowed); false: nothing launched. x: kind p's permuted copy
 * of the type's items (gv_xp_of). wpr: the warps a row the one-row kind p launch of w
 * gives it (gv_segs_of; 1 or 2), whose split of the items and order of sums the kernel
 * keeps. */
template <int T>
static bool gv_ring1_launch(struct ops_ctx *ctx, bool pdl, const struct tpi_weight *w, int per_sm,
                            int wpr, const int8_t *x, const float2 *ds, float *y,
                            bool accumulate, cudaStream_t stream) {
    if constexpr (T != TPI_TYPE_Q4_K && T != TPI_TYPE_Q5_K &&
                  (T != KERN_TYPE_Q4_0X8 || !TPI_GV_Q40RING)) {
        return false;
    } else {
        using Q = gv<T>;
        const int ne1 = (int)w->ne1, blocks = ctx->n_sm * per_sm;
        const int rows = (ne1 + blocks * GV_RING1_WARPS - 1) / (blocks * GV_RING1_WARPS);
        if (w->ne0 != GV_RING_NE0 || w->row_bytes != (size_t)GV_RING_NE0 / Q::BLK * Q::BYTES ||
            ((uintptr_t)w->data & 15) || rows > 8 || blocks <= 0 ||
            (wpr != 1 && (wpr != 2 || T != KERN_TYPE_Q4_0X8)))
            return false;
        auto go_p = [&](auto s_c, auto p_c) {
            constexpr int S = decltype(s_c)::value;
            const size_t smem = (size_t)GV_RING1_WARPS * S * w->row_bytes;
            constexpr auto kern = gv_ring1_kernel<T, S, decltype(p_c)::value>;
            if (smem > (size_t)ctx->smem_optin || !gv_smem_optin<kern>(smem)) return false;
            kern_launch(pdl, kern, dim3((unsigned)blocks), dim3(GV_RING1_WARPS * 32), smem, stream,
                        (const uint8_t *)w->data, w->row_bytes, ne1, x, ds, y, accumulate);
            return true;
        };
        auto go = [&](auto s_c) {
            if constexpr (T == KERN_TYPE_Q4_0X8)
                if (wpr == 2) return go_p(s_c, std::integral_constant<int, 2>{});
            return go_p(s_c, std::integral_constant<int, 1>{});
        };
        return rows <= 2   ? go(std::integral_constant<int, 2>{})
               : rows <= 4 ? go(std::integral_constant<int, 4>{})
                           : go(std::integral_constant<int, 8>{});
    }
}

/* BF16/F16 weights (the down matmul reads f32 x: nothing to quantize): warp w of block b
 * takes output GV_WARPS * b + w. */
template <int TYPE>
__global__ void __launch_bounds__(GV_WARPS * 32)
    gv_glu_elem_kernel(const uint8_t *__restrict__ wg, const uint8_t *__restrict__ wu,
                       size_t row_bytes, int ne0, int n_ff, const float *__restrict__ x, float *g,
                       float *u) {
    const int lane = threadIdx.x & 31, j = (int)blockIdx.x * GV_WARPS + (threadIdx.x >> 5);
    float acc[2][1] = {{0.0f}, {0.0f}};
    gv_grid_dep_wait();
    if (j >= n_ff) return; /* whole warps */
    const uint8_t *wb[2] = {wg + (size_t)j * row_bytes, wu + (size_t)j * row_bytes};
    gv_elem_rows<TYPE, 1, 2>(wb, ne0 / 8, lane, 32, x, ne0, 1, acc);
    const float gs = gv_warp_sum(acc[0][0]), us = gv_warp_sum(acc[1][0]);
    if (lane == 0) {
        u[j] = us;
        g[j] = kern_silu_mul1(gs, us);
    }
}

/* kind b, quantized weights: warp (row, part) takes units part*32 + lane, stepping
 * 32*wpr (gu_row). */
template <int TYPE, int NR, int U>
__global__ void __launch_bounds__(GV_WARPS * 32)
    gv_unit_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int ne0, int ne1,
                   const int8_t *xq, const float2 *ds, float *__restrict__ y, int nr, int wpr,
                   bool accumulate) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * (GV_WARPS / wpr) + warp / wpr, part = warp % wpr;
    float acc[1][NR];
#pragma unroll
    for (int r = 0; r < NR; r++)
        acc[0][r] = 0.0f;
    if (row < ne1)
        gu_row<TYPE, NR, U>(w + (size_t)row * row_bytes, ne0 / 16, part * 32 + lane, 32 * wpr, xq,
                            ds, ne0, nr, acc[0], [] { gv_grid_dep_wait(); });
    gv_grid_dep_wait(); /* (again, for lanes that had no unit: y is read and written below) */
    gv_store<NR, 1>(acc, y, ne1, nr, row, part, wpr, accumulate);
}

/* ---------------------------------------------------------------- knobs
 *
 * Read once from the environment (process-wide: they choose among kernels that compute
 * the same products; no per-rank state); kern_gemv_configure overrides them (tests,
 * benches).
 *   TPI_GEMV_KIND  auto | a | b | p
 *                          quantized weights: kind a (items), b (16-value units,
 *                          contiguous x) or p (kind a's items reading the permuted copies
 *                          of x: contiguous x at kind a's instruction count). auto (the
 *                          default) is what the H200 measured fastest: kind b for
 *                          Q4_K/Q6_K with 5..8 rows (1.2-1.9x kind a there), kind p
 *                          otherwise (end to end, 1 row: Q4_K_M tg128 +10 %, Q8_0 +2 %
 *                          over kind a; bench/NOTES.md change 6). Kind p needs the
 *                          permuted copies that only
 *                          kern_gemv_v3_prepare writes (gx->xp); without them it runs as
 *                          kind a. BF16/F16 always take the kind-a kernel.
 *   TPI_GEMV_BATCH 1 | 2   kind b: units per lane whose loads go out together, times
 *                          4 (Q6_K: 2) (default 1)
 *   TPI_GEMV_PDL   0 | 1   programmatic dependent launch of the x quantization and the
 *                          matrix-vector kernels: they start while the previous kernel
 *                          drains and issue their first weight loads before waiting for
 *                          it (default 1).
 *   TPI_GEMV_WPS   auto | 8..64
 *                          warps per SM the grid aims for: rows are split among 2-4 warps
 *                          (wpr) until the grid has this many. auto: 32 for BF16/F16, 16
 *                          for the quantized types (measured end to end on the H200, tg128:
 *                          BF16 +2 % at 32; Q4_K_M -2 %, Q8_0 -1 % at 32, worse at 64).
 *   TPI_GEMV_RPW   auto | 1 | 2 | 4
 *                          weight rows per warp (kinds a and p, BF16/F16; 1-4 x rows): a
 *                          lane's x is loaded once and dotted with that many rows, so L1
 *                          traffic for x per weight byte falls by the factor, and the
 *                          grid by it. auto: 1. A first measurement (H200, 1 x row, graph
 *                          replays, us, rpw 1 -> 2: 12288->4096 Q4_K 11.24 -> 10.53, Q6_K
 *                          20.57 -> 19.30, Q8_0 18.70 -> 17.49) made 2 the auto for rows of
 *                          >= 8192 values; a later one on another H200 went the other way
 *                          (11.19 -> 11.50, 19.20 -> 22.04, 15.82 -> 17.43), and so did
 *                          tg128 end to end (Q4_K_M +2.5 %, Q8_0 +1.5 % at rpw 1;
 *                          bench/NOTES.md change 16). 4096->1024 is worse at 2 for every
 *                          type (half the warps), BF16 no better anywhere.
 *   TPI_GEMV_YPRE  0 | 1   the quantized one-row kernels' y += (wo, down) with y copied into
 *                          shared memory right after the wait instead of loaded after the
 *                          last dot (default 1: tg128 Q4_K_M +0.2-0.6 %, Q8_0 +1 %, depth
 *                          8192 +0.6-0.9 %; bench/NOTES.md change 95).
 *   TPI_GEMV_RING1 0..3    wo (one Q4_K weight, rows of 4096, one x row) right after a
 *                          decode attention that let it in at its start: gv_ring1_kernel,
 *                          that many blocks an SM, every row copied before the wait (default
 *                          2: tg128 Q4_K_M +0.55 %, depth 1024 +0.9 %; 0: the kind p kernel;
 *                          bench/NOTES.md change 97). TPI_GEMV_RING1ALL=1 takes it wherever
 *                          the shape allows (tests; in a plain chain it is slower). */
struct gv_cfg {
    int kind;            /* 'a', 'b', 'p', or 0: auto */
    int batch, pdl, wps; /* wps 0: auto */
    int rpw;             /* 1, 2, 4, or 0: auto */
    int kbound;          /* Q4_K/Q6_K one-row kernels of long rows held to 6, 8 or 10 blocks
                          * an SM; 0 none (default) */
    int x8bound;         /* the one-row kernels of Q8_0's and Q6_K's 8-block groups held to 4,
                          * 5, 6 or 8 (default) blocks an SM */
    int ypre;            /* accumulate's y loaded right after the wait (gv_y_pre; default 1) */
    int ring1;           /* Q4_K one-weight rows of 4096 right after a decode attention that
                          * let them in at its start: gv_ring1_kernel, that many blocks an SM
                          * (1-3, default 2); 0: the kind p kernel */
    int ring1all;        /* 1: gv_ring1_kernel wherever it takes the shape (tests, measuring) */
};
#define GV_WPS_ELEM 32  /* auto warps per SM, BF16/F16 */
#define GV_WPS_QUANT 16 /* auto warps per SM, quantized types */

/* ---------------------------------------------------------------- launchers */

/* The types this path covers; f is called with the type as a constant (kq_dispatch's
 * cases, filtered). */
template <int T>
constexpr bool gv_type_covered =
    T == TPI_TYPE_Q8_0 || T == KERN_TYPE_Q8_0X8 || T == TPI_TYPE_Q4_0 || T == KERN_TYPE_Q4_0X8 ||
    T == TPI_TYPE_Q5_0 || T == TPI_TYPE_Q4_1 || T == TPI_TYPE_Q5_1 || T == TPI_TYPE_Q4_K ||
    T == TPI_TYPE_Q5_K || T == TPI_TYPE_Q6_K || T == KERN_TYPE_Q6_KX8 || T == TPI_TYPE_Q3_K ||
    T == KERN_TYPE_Q3_KX8 || T == TPI_TYPE_Q2_K || T == TPI_TYPE_IQ4_NL || T == TPI_TYPE_IQ4_XS || T == TPI_TYPE_BF16 ||
    T == TPI_TYPE_F16;
/* Q6_K's layouts share its item numbering, so its permuted x copy (gv_perm_q6); Q4_K's
 * and Q5_K's items are 64 values in order (gv_perm_k4) */
template <int T> constexpr bool gv_is_q6 = T == TPI_TYPE_Q6_K || T == KERN_TYPE_Q6_KX8;
/* The types whose items are numbered as Q6_K's (kind p reads its permuted copy of x):
 * Q6_K's layouts and the 2-bit K-quants Q3_K (both layouts) and Q2_K */
template <int T>
constexpr bool gv_q6_items =
    gv_is_q6<T> || T == TPI_TYPE_Q3_K || T == KERN_TYPE_Q3_KX8 || T == TPI_TYPE_Q2_K;
template <int T> constexpr bool gv_is_k4 = T == TPI_TYPE_Q4_K || T == TPI_TYPE_Q5_K;
template <typename F> static bool gv_dispatch(int type, F &&f) {
    bool taken = false;
    kq_dispatch(type, [&](auto type_c, auto) {
        if constexpr (gv_type_covered<decltype(type_c)::value>) {
            f(type_c);
            taken = true;
        }
    });
    return taken;
}

static inline bool gv_is_elem(int type) {
    return type == TPI_TYPE_BF16 || type == TPI_TYPE_F16;
}

/* The kind weights of type T take for NR x rows (auto: kind b for the K-quants with 5..8
 * rows, kind p otherwise, see the knobs; kind p needs prepare's permuted copies, which an
 * x quantized elsewhere may lack). BF16/F16 always take the kind-a kernel. */
template <int T, int NR> static int gv_kind_of(const struct kern_gemv_x *gx, const gv_cfg &c) {
    if (gv_is_elem(T)) return 'a';
    const bool kq = T == TPI_TYPE_Q4_K || gv_is_q6<T>;
    int kind = c.kind ? c.kind : kq && NR == 8 ? 'b' : 'p';
    if (kind == 'p' && !gx->xp) kind = 'a';
    return kind;
}

/* ---------------------------------------------------------------- per-type entries
 * Defined in kern_gemv_launch.cuh, instantiated by the part that holds the type. */

/* One launch for the n weights ws (type T, one row length, prepared x gx; n > 1 only for
 * kinds a and p: kern_gemv_v3_run_n checks) into ys, with NR rounded up to 1, 2, 4 or 8
 * rows for gx->n_rows (the guards skip the unused rows). */
template <int T>
void gv_run_type(struct ops_ctx *ctx, int n, const struct tpi_weight *const *ws,
                 const struct kern_gemv_x *gx, float *const *ys, bool accumulate,
                 cudaStream_t stream, const gv_cfg &c);

/* The fused gate/up launch for type T (kern_gemv_v3_run_glu, after its checks). */
template <int T>
void gv_glu_type(struct ops_ctx *ctx, const struct tpi_weight *wg, const struct tpi_weight *wu,
                 const struct kern_gemv_x *gx, float *g, float *u, int8_t *oq, float2 *ods,
                 int warps, cudaStream_t stream, const gv_cfg &c);

/* The two-type launch: side 0 the weights of 64-value K-quant K (Q4_K or Q5_K), side 1
 * Q6_K's groups (kern_gemv_v3_run_mix, after its checks). */
template <int K>
void gv_mix_launch(struct ops_ctx *ctx, const gv_cfg &c,
                   const struct tpi_weight *(&sw)[2][OPS_MAX_FUSED], float *(&sy)[2][OPS_MAX_FUSED],
                   const int (&cnt)[2], int ne0, const struct kern_gemv_x *gx, int mix,
                   cudaStream_t stream);

#endif /* KERN_GEMV_CUH */
