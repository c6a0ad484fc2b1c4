/*
 * kern_gemv_dot.cuh — the per-type dot products of the int8 decode path: how a weight
 * block of each quantized type (Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
 * IQ4_NL, IQ4_XS and the
 * device layouts KERN_TYPE_Q8_0X8, KERN_TYPE_Q4_0X8, KERN_TYPE_Q6_KX8) is loaded into
 * registers and dotted with int8 x in blocks of 32 and their (d, d*sum) pairs
 * (kern_xq.cuh). The matrix-vector kernels of kern_gemv.cuh and the fused decode-layer
 * kernel of kern_layer.cu share them, so both compute each item's products alike. Host
 * and device (the host emulation runs them).
 */
#ifndef KERN_GEMV_DOT_CUH
#define KERN_GEMV_DOT_CUH

#include <string.h>

#include "kern_common.cuh"
#include "kern_quant.cuh"
#include "kern_xq.cuh"

#define GV_QK 32 /* x values per int8 block */

/* ---------------------------------------------------------------- helpers
 * __host__ __device__ so the per-type dot products can be run (emulated) on the host. */

/* A T at p through the read-only cache (host: an unaligned-safe copy): weights, read once
 * a step, so with TPI_L2_EF evict_first in L2 (kern_common.cuh). */
template <typename T> __host__ __device__ __forceinline__ T gv_ldg(const void *p) {
#ifdef __CUDA_ARCH__
#if TPI_L2_EF && __CUDA_ARCH__ >= 800
    /* read once a step: evict_first in L2 (kern_stream_policy) */
    const uint64_t pol = kern_stream_policy();
    int4 v = make_int4(0, 0, 0, 0);
    if constexpr (sizeof(T) == 16) {
        asm("ld.global.nc.L2::cache_hint.v4.s32 {%0, %1, %2, %3}, [%4], %5;"
            : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
            : "l"(p), "l"(pol));
    } else if constexpr (sizeof(T) == 8) {
        asm("ld.global.nc.L2::cache_hint.v2.u32 {%0, %1}, [%2], %3;"
            : "=r"(v.x), "=r"(v.y)
            : "l"(p), "l"(pol));
    } else if constexpr (sizeof(T) == 4) {
        asm("ld.global.nc.L2::cache_hint.u32 %0, [%1], %2;" : "=r"(v.x) : "l"(p), "l"(pol));
    } else if constexpr (sizeof(T) == 2) {
        unsigned short h;
        asm("ld.global.nc.L2::cache_hint.u16 %0, [%1], %2;" : "=h"(h) : "l"(p), "l"(pol));
        v.x = h;
    }
    if constexpr (sizeof(T) == 16 || sizeof(T) == 8 || sizeof(T) == 4 || sizeof(T) == 2) {
        T t; /* the loaded bytes, little-endian: a 2- to 8-byte T is v's low bytes */
        memcpy(&t, &v, sizeof t);
        return t;
    }
#endif
    return __ldg((const T *)p);
#else
    T v;
    memcpy(&v, p, sizeof v);
    return v;
#endif
}
/* A T of x or of its (d, d*sum) pairs: a plain load, which the compiler may merge with
 * another load of the same address, as it may not merge two __ldg: the dots of several
 * weight rows against one x then read x once (gv_item_rows). The kernels' x pointers
 * are not __restrict__: a load of memory declared read-only may be hoisted above the
 * PDL wait (an asm with a memory clobber), and x is the previous kernel's output. */
template <typename T> __host__ __device__ __forceinline__ T gv_ldx(const void *p) {
#ifdef __CUDA_ARCH__
    return *(const T *)p;
#else
    T v;
    memcpy(&v, p, sizeof v);
    return v;
#endif
}
__host__ __device__ __forceinline__ uint32_t gv_ld32(const uint8_t *p) {
    return gv_ldg<unsigned int>(p);
}
/* 8 bytes at p (8-byte aligned) */
__host__ __device__ __forceinline__ uint2 gv_ld64(const uint8_t *p) {
    return gv_ldg<uint2>(p);
}
__host__ __device__ __forceinline__ int4 gv_ld128(const void *p) {
    return gv_ldg<int4>(p);
}
/* v's four words, in memory order, as w (the decoders' view of a 16-byte load) */
__host__ __device__ __forceinline__ void gv_words(const int4 &v, uint32_t (&w)[4]) {
    w[0] = (uint32_t)v.x, w[1] = (uint32_t)v.y, w[2] = (uint32_t)v.z, w[3] = (uint32_t)v.w;
}
/* Build option of the BF16/F16 weight loads (gv_ldw16, below). */
#ifndef GV_WLOAD
#define GV_WLOAD 1
#endif
/* 16 bytes of weights through the read-only path, without allocating in L1 when NA
 * (device code; the host reads them as gv_ld128 does). */
template <bool NA> __host__ __device__ __forceinline__ int4 gv_ld128_na(const void *p) {
#ifdef __CUDA_ARCH__
    if constexpr (NA) {
        int4 v;
#if TPI_L2_EF && __CUDA_ARCH__ >= 800
        asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.s32 {%0, %1, %2, %3}, [%4], %5;"
            : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
            : "l"(p), "l"(kern_stream_policy()));
#else
        asm("ld.global.nc.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];"
            : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
            : "l"(p));
#endif
        return v;
    }
#endif
    return gv_ld128(p);
}
/* 16 bytes of BF16/F16 weights: read once, so kept out of L1, where they would evict the
 * f32 x every warp reads whole (GV_WLOAD 1, the default: no allocation; 0: __ldg, which
 * allocates). tg128 BF16 on the H200, one build each: 221.2 with __ldg, 224.2 without
 * allocating (bench/NOTES.md change 28). The quantized kernels keep __ldg: without
 * allocating, Q8_0 lost 3 % and Q4_K_M 7 % (their scales and the neighbouring words of a
 * block share lines with the 16-byte loads). */
__host__ __device__ __forceinline__ int4 gv_ldw16(const void *p) {
    return gv_ld128_na<GV_WLOAD == 1>(p);
}
__host__ __device__ __forceinline__ int4 gv_ldx128(const void *p) {
    return gv_ldx<int4>(p);
}
__host__ __device__ __forceinline__ float2 gv_ldf2(const float2 *p) {
    return gv_ldx<float2>(p);
}
__host__ __device__ __forceinline__ float4 gv_ldf4(const float *p) {
    return gv_ldx<float4>(p);
}
__host__ __device__ __forceinline__ float gv_h2f(uint16_t h) {
    __half_raw r;
    r.x = h;
    return __half2float(__half(r));
}
__host__ __device__ __forceinline__ uint32_t gv_ld16(const uint8_t *p) {
    return gv_ldg<unsigned short>(p);
}
__host__ __device__ __forceinline__ int gv_dp4a(uint32_t a, int b, int c) {
#ifdef __CUDA_ARCH__
    return __dp4a((int)a, b, c);
#else
    for (int i = 0; i < 4; i++)
        c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)((uint32_t)b >> (8 * i));
    return c;
#endif
}
/* dp4a of unsigned bytes a with signed bytes b (PTX's mixed form; the host emulates). */
__host__ __device__ __forceinline__ int gv_dp4a_us(uint32_t a, int b, int c) {
#ifdef __CUDA_ARCH__
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
#else
    for (int i = 0; i < 4; i++)
        c += (int)(uint8_t)(a >> (8 * i)) * (int)(int8_t)((uint32_t)b >> (8 * i));
    return c;
#endif
}
/* c plus the 16 byte products of the words w[0..3] with x's 16 bytes, one dp4a chain in
 * order (US: w's bytes unsigned, gv_dp4a_us). */
template <bool US = false>
__host__ __device__ __forceinline__ int gv_dp4a_x4(const uint32_t *w, const int4 x, int c) {
    c = US ? gv_dp4a_us(w[0], x.x, c) : gv_dp4a(w[0], x.x, c);
    c = US ? gv_dp4a_us(w[1], x.y, c) : gv_dp4a(w[1], x.y, c);
    c = US ? gv_dp4a_us(w[2], x.z, c) : gv_dp4a(w[2], x.z, c);
    return US ? gv_dp4a_us(w[3], x.w, c) : gv_dp4a(w[3], x.w, c);
}
/* Per-byte a - b for a's bytes below 0x80 + b's (every use: 4- to 6-bit quant values less
 * their offset), wrapping into signed bytes. TPI_GV_SUB (the default): a + (0x80 - b) per
 * byte, which cannot carry out of a byte, then bit 7 flipped to take the 0x80 back off:
 * three instructions where __vsub4, which handles any bytes, takes four. */
#ifndef TPI_GV_SUB
#define TPI_GV_SUB 1
#endif
__host__ __device__ __forceinline__ uint32_t gv_vsub4(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__) && !TPI_GV_SUB
    return __vsub4(a, b);
#else
    return (a + (0x80808080u - b)) ^ 0x80808080u;
#endif
}
__host__ __device__ __forceinline__ uint32_t gv_funnel(uint32_t lo, uint32_t hi, int sh) {
#ifdef __CUDA_ARCH__
    return __funnelshift_r(lo, hi, sh);
#else
    return sh ? (lo >> sh) | (hi << (32 - sh)) : lo;
#endif
}
__host__ __device__ __forceinline__ int gv_imin(int a, int b) {
    return a < b ? a : b;
}

/* N 32-bit words from a 2-byte aligned address: N+1 aligned loads (reads up to 3
 * bytes past the end; weight_upload pads every weight). */
template <int N>
__host__ __device__ __forceinline__ void gv_ld_a2(const uint8_t *p, uint32_t (&w)[N]) {
    const uintptr_t a = (uintptr_t)p;
    const uint8_t *q = (const uint8_t *)(a & ~(uintptr_t)3);
    const int sh = (int)(a & 3) * 8;
    uint32_t t[N + 1];
#pragma unroll
    for (int i = 0; i <= N; i++)
        t[i] = gv_ld32(q + 4 * i);
#pragma unroll
    for (int i = 0; i < N; i++)
        w[i] = gv_funnel(t[i], t[i + 1], sh);
}

/* Bits 0..3 of h to bit 4 of bytes 0..3. */
__host__ __device__ __forceinline__ uint32_t gv_spread4(uint32_t h) {
    return ((h & 1u) << 4) | ((h & 2u) << 11) | ((h & 4u) << 18) | ((h & 8u) << 25);
}

/* ------------------------------------------------------ per-type dot products
 *
 * gv<T> (kinds a and p): BLK values and BYTES bytes per weight block, IPB items per
 * block, and dot<NR, PERM>(b: the block, it: the item in the block, x, xs, ds, dss, nr,
 * keep, acc). An item reads its x in 16-value *units* k = 0..NU-1. Kind a (PERM false):
 * x is int8 x at the block's first value (row 0) and unit k of item `it` sits at the
 * type's offset xoff(it, k) from it. Kind p (PERM true): x is the item's unit 0 in the
 * type's permuted copy of x (gv_perm_* below) and unit k sits at x + 512k, so the 32
 * lanes of a warp read 512 contiguous bytes per x load. xs: x row stride in values
 * (ne0, or the permuted copy's padded stride); ds: the block's first (d, d*sum) pair
 * (row 0, always the plain layout), dss = ne0/32 its row stride. */
template <int TYPE> struct gv;

template <bool PERM>
__host__ __device__ __forceinline__ const int8_t *gv_xunit(const int8_t *x, int lin_off, int k) {
    return PERM ? x + 512 * k : x + lin_off;
}

/* The rows of a 32-value block: acc[r] += d * dx_r * sum(w . x_r) for the block's 32
 * int8 weights as 8 words (a: values 0..15, b: 16..31) against x row r's block; MIN (the
 * types with a block minimum m, value = d*q + m): plus m * (dx_r * sum x_r), from the
 * block's (d, d*sum) pair. */
template <int NR, bool PERM, bool MIN = false>
__host__ __device__ __forceinline__ void gv_dot32(const uint32_t *a, const uint32_t *b, float d,
                                                  const int8_t *x, int xs, const float2 *ds,
                                                  int dss, int nr, float (&acc)[NR],
                                                  float m = 0.0f) {
#pragma unroll
    for (int r = 0; r < NR; r++)
        if (r == 0 || r < nr) {
            const int8_t *xr = x + (size_t)r * xs;
            const int4 x0 = gv_ldx128(gv_xunit<PERM>(xr, 0, 0));
            const int4 x1 = gv_ldx128(gv_xunit<PERM>(xr, 16, 1));
            const int s = gv_dp4a_x4(b, x1, gv_dp4a_x4(a, x0, 0));
            if (MIN) {
                const float2 f = gv_ldf2(ds + (size_t)r * dss);
                acc[r] += fmaf(d * f.x, (float)s, m * f.y);
            } else {
                acc[r] += d * gv_ldf2(ds + (size_t)r * dss).x * (float)s;
            }
        }
}

/* Q8_0: an item is a block: f16 d, 32 int8 at b+2 (2-byte aligned). */
template <> struct gv<TPI_TYPE_Q8_0> {
    static constexpr int BLK = 32, BYTES = 34, IPB = 1;
    struct raw {
        uint32_t q[8], d;
    };
    static __host__ __device__ __forceinline__ void load(raw &w, const uint8_t *b, int) {
        w.d = gv_ld16(b);
        gv_ld_a2<8>(b + 2, w.q);
    }
    template <int NR, bool PERM>
    static __host__ __device__ __forceinline__ void dot(const raw &w, int, const int8_t *x, int xs,
                                                        const float2 *ds, int dss, int nr,
                                                        float keep, float (&acc)[NR]) {
        const float d = gv_h2f((uint16_t)w.d) * keep;
        gv_dot32<NR, PERM>(w.q, w.q + 4, d, x, xs, ds, dss, nr, acc);
    }
};

/* Q8_0 in groups of 8 blocks (KERN_LAYOUT_Q8_0X8): an item is block c of the group, its
 * 32 int8 two 16-byte loads at b+32c, its f16 d at b+256+2c; the dot is Q8_0's. */
template <> struct gv<KERN_TYPE_Q8_0X8> {
    static constexpr int BLK = 256, BYTES = KERN_Q8_0X8_BYTES, IPB = 8;
    using raw = gv<TPI_TYPE_Q8_0>::raw;
    static __host__ __device__ __forceinline__ void load(raw &w, const uint8_t *b, int c) {
        /* __ldg: without allocating in L1 these lost 3 % (the 16-byte loads alone, run 30)
         * and 5 % (the scale too, run 34; bench/NOTES.md changes 28 and 30) */
        const int4 a = gv_ld128(b + 32 * c), e = gv_ld128(b + 32 * c + 16);
        w.q[0] = (uint32_t)a.x, w.q[1] = (uint32_t)a.y, w.q[2] = (uint32_t)a.z;
        w.q[3] = (uint32_t)a.w, w.q[4] = (uint32_t)e.x, w.q[5] = (uint32_t)e.y;
        w.q[6] = (uint32_t)e.z, w.q[7] = (uint32_t)e.w;
        w.d = gv_ld16(b + 256 + 2 * c);
    }
    /* x, ds: the group's first (kind a; item c's are 32c values and c pairs on) or the
     * item's own (kind p: x from gv_item_rows, ds as kind a) */
    template <int NR, bool PERM>
    static __host__ __device__ __forceinline__ void dot(const raw &w, int c, const int8_t *x, int xs,
                                                        const float2 *ds, int dss, int nr,
                                                        float keep, float (&acc)[NR]) {
        const float d = gv_h2f((uint16_t)w.d) * keep;
        gv_dot32<NR, PERM>(w.q, w.q + 4, d, PERM ? x : x + 32 * c, xs, ds + c, dss, nr, acc);
    }
};

/* Q4_0's 16 quant bytes as 4 words w (byte j: value j's low nibble, value j + 16's high)
 * to the signed bytes q - 8: values 0..15 in lo, 16..31 in hi. */
__host__ __device__ __forceinline__ void gv_q4_0_bytes(const uint32_t *w, uint32_t (&lo)[4],
                                                       uint32_t (&hi)[4]) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        lo[i] = w[i] & 0x0F0F0F0Fu;
        hi[i] = (w[i] >> 4) & 0x0F0F0F0Fu;
        lo[i] = gv_vsub4(lo[i], 0x08080808u);
        hi[i] = gv_vsub4(hi[i], 0x08080808u);
    }
}

/* Q4_0: an item is a block: f16 d, 16 bytes; byte j = value j (low nibble), j+16
 * (high), q - 8. */
template <> struct gv<TPI_TYPE_Q4_0> {
    static constexpr int BLK = 32, BYTES = 18, IPB = 1;
    struct raw {
        uint32_t q[4], d;
    };
    static __host__ __device__ __forceinline__ void load(raw &w, const uint8_t *b, int) {
        w.d = gv_ld16(b);
        gv_ld_a2<4>(b + 2, w.q);
    }
    template <int NR, bool PERM>
    static __host__ __device__ __forceinline__ void dot(const raw &wr, int, const int8_t *x, int xs,
                                                        const float2 *ds, int dss, int nr,
                                                        float keep, float (&acc)[NR]) {
        const float d = gv_h2f((uint16_t)wr.d) * keep;
        uint32_t lo[4], hi[4];
        gv_q4_0_bytes(wr.q, lo, hi);
        gv_dot32<NR, PERM>(lo, hi, d, x, xs, ds, dss, nr, acc);
    }
};

/* Q4_0 in groups of 8 blocks (KERN_LAYOUT_Q4_0X8): an item is block c of the group, its
 * 16 quant bytes one 16-byte load at b+16c, its f16 d at b+128+2c; the dot is Q4_0's. */
template <> struct gv<KERN_TYPE_Q4_0X8> {
    static constexpr int BLK = 256, BYTES = KERN_Q4_0X8_BYTES, IPB = 8;
    using raw = gv<TPI_TYPE_Q4_0>::raw;
    static __host__ __device__ __forceinline__ void load(raw &w, const uint8_t *b, int c) {
        const int4 a = gv_ld128(b + 16 * c);
        w.q[0] = (uint32_t)a.x, w.q[1] = (uint32_t)a.y, w.q[2] = (uint32_t)a.z;
        w.q[3] = (uint32_t)a.w;
        w.d = gv_ld16(b + 128 + 2 * c);
    }
    /* x, ds: the group's first (kind a; item c's are 32c values and c pairs on) or the
     * item's own (kind p: x from gv_item_rows, ds as kind a) */
    template <int NR, bool PERM>
    static __host__ __device__ __forceinline__ void dot(const raw &w, int c, const int8_t *x, int xs,
                                                        const float2 *ds, int dss, int nr,
                                                        float keep, float (&acc)[NR]) {
        gv<TPI_TYPE_Q4_0>::dot<NR, PERM>(w, c, PERM ? x : x + 32 * c, xs, ds + c, dss, nr, keep,
                                         acc);
    }
};

/* The int8 levels of IQ4 quant words q (byte j: index of value j in the low nibble, of
 * value 16 + j in the high) into lo (values 0..15) and hi (16..31). */
__host__ __device__ __forceinline__ void gv_iq4_bytes(const uint32_t (&q)[4], uint32_t (&lo)[4],
                                                      uint32_t (&hi)[4]) {
#pragma unroll
    for (int i = 0; i < 4; i++)
        kq_iq4_levels8(q[i], lo[i], hi[i]);
}

/* IQ4_NL: an item is a block as Q4_0's (f16 d, 16 bytes of indices at b+2), its values d *
 * level (kq_iq4_levels8). */
template <> struct gv<TPI_TYPE_IQ4_NL> {
    static constexpr int BLK = 32, BYTES = 18, IPB = 1;
    using raw = gv<TPI_TYPE_Q4_0>::raw;
    static __host__ __device__ __forceinline__ void load(raw &w, const uint8_t *b, int it) {
        gv<TPI_TYPE_Q4_0>::load(w, b, it);
    }
    template <int NR, bool PERM>
    static __host__ __device__ __forceinline__ void dot(const raw &wr, int, const int8_t *x, int xs,
                                                        const float2 *ds, int dss, int nr,
                                                        float keep, float (&acc)[NR]) {
        uint32_t lo[4], hi[4];
        gv_iq4_bytes(wr.q, lo, hi);
        gv_dot32<NR, PERM>(lo, hi, gv_h2f((uint16_t)wr.d) * keep, x, xs, ds, dss, nr, acc);
    }
};

/* IQ4_XS (136-byte blocks, 8-byte aligned): an item is sub-block c (32 values): its 16
 * index bytes at b+8+16c, its scale ls from the nibble at bit 4c of the word at b+4 and
 * bits 2c of the 16 at b+2; values d * (ls - 32) * level. Read in three 8-byte loads. */
template <> struct gv<TPI_TYPE_IQ4_XS> {
    static constexpr int BLK = 256, BYTES = 136, IPB = 8;
    struct raw {
        uint32_t q[4], dh, sl; /* dh: d (bits 0..15) and the scales' top bits */
    };
    static __host__ __device__ __forceinline__ void load(raw &w, const uint8_t *b, int c) {
        const uint2 q01 = gv_ld64(b + 8 + 16 * c), q23 = gv_ld64(b + 16 + 16 * c), h = gv_ld64(b);
        w.q[0] = q01.x, w.q[1] = q01.y, w.q[2] = q23.x, w.q[3] = q23.y;
        w.dh = h.x;
        w.sl = h.y;
    }
    /* x, ds: the block's first (kind a; item c's are 32c values and c pairs on) or the
     * item's own (kind p: x from gv_item_rows, ds as kind a) */
    template <int NR, bool PERM>
    static __host__ __device__ __forceinline__ void dot(const raw &wr, int c, const int8_t *x,
                                                        int xs, const float2 *ds, int dss, int nr,
                                                        float keep, float (&acc)[NR]) {
        const int ls = (int)(((wr.sl >> (4 * c)) & 0xFu) | (((wr.dh >> (16 + 2 * c)) & 3u) << 4));
        const float dl = gv_h2f((uint16_t)(wr.dh & 0xFFFFu)) * (float)(ls - 32) * keep;
        uint32_t lo[4], hi[4];
        gv_iq4_bytes(wr.q, lo, hi);
        gv_dot32<NR, PERM>(lo, hi, dl, PERM ? x : x + 32 * c, xs, ds + c, dss, nr, acc);
    }
};

/* Q5_0: an item is a block: f16 d, 32 bits qh (bit j: fifth bit of value j), 16
 * bytes as Q4_0; q - 16. qh and the quants are the 5 words at b+2. */
template <> struct gv<TPI_TYPE_Q5_0> {
    static constexpr int BLK = 32, BYTES = 22, IPB = 1;
    struct raw {
        uint32_t q[5], d;
    };
    static __host__ __device__ __forceinline__ void load(raw &w, const uint8_t *b, int) {
        w.d = gv_ld16(b);
        gv_ld_a2<5>(b + 2, w.q);
    }
    template <int NR, bool PERM>
    static __host__ __device__ __forceinline__ void dot(const raw &wr, int, const int8_t *x, int xs,
                                                        const float2 *ds, int dss, int nr,
                                                        float keep, float (&acc)[NR]) {
        const float d = gv_h2f((uint16_t)wr.d) * keep;
        const uint32_t *w = wr.q;
        uint32_t lo[4], hi[4];
        const uint32_t qh = w[0];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t q = w[1 + i];
            lo[i] = gv_vsub4((q & 0x0F0F0F0Fu) | gv_spread4((qh >> (4 * i)) & 0xFu), 0x10101010u);
            hi[i] = gv_vsub4(((q >> 4) & 0x0F0F0F0Fu) | gv_spread4((qh >> (16 + 4 * i)) & 0xFu),
                             0x10101010u);
        }
        gv_dot32<NR, PERM>(lo, hi, d, x, xs, ds, dss, nr, acc);
    }
};

/* Q4_1 (QH false) and Q5_1 (QH true): an item is a block: f16 d and f16 m at b, for Q5_1
 * qh (32 bits, bit j the fifth bit of value j) at b+4, then 16 bytes as Q4_0's (values
 * 0..15 or 0..31, no offset); value = d*q + m. 20- and 24-byte blocks: 4-byte aligned
 * loads. */
template <bool QH> struct gv_min_block {
    static constexpr int BLK = 32, BYTES = QH ? 24 : 20, IPB = 1, NW = QH ? 5 : 4;
    struct raw {
        uint32_t q[NW], dm; /* q[0]: qh (Q5_1) */
    };
    static __host__ __device__ __forceinline__ void load(raw &w, const uint8_t *b, int) {
        w.dm = gv_ld32(b);
#pragma unroll
        for (int i = 0; i < NW; i++)
            w.q[i] = gv_ld32(b + 4 + 4 * i);
    }
    template <int NR, bool PERM>
    static __host__ __device__ __forceinline__ void dot(const raw &wr, int, const int8_t *x, int xs,
                                                        const float2 *ds, int dss, int nr,
                                                        float keep, float (&acc)[NR]) {
        const float d = gv_h2f((uint16_t)(wr.dm & 0xFFFFu)) * keep;
        const float m = gv_h2f((uint16_t)(wr.dm >> 16)) * keep;
        const uint32_t qh = wr.q[0];
        uint32_t lo[4], hi[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t q = wr.q[NW - 4 + i];
            if (QH) {
                lo[i] = (q & 0x0F0F0F0Fu) | gv_spread4((qh >> (4 * i)) & 0xFu);
                hi[i] = ((q >> 4) & 0x0F0F0F0Fu) | gv_spread4((qh >> (16 + 4 * i)) & 0xFu);
            } else {
                lo[i] = q & 0x0F0F0F0Fu;
                hi[i] = (q >> 4) & 0x0F0F0F0Fu;
            }
        }
        gv_dot32<NR, PERM, true>(lo, hi, d, x, xs, ds, dss, nr, acc, m);
    }
};
template <> struct gv<TPI_TYPE_Q4_1> : gv_min_block<false> {};
template <> struct gv<TPI_TYPE_Q5_1> : gv_min_block<true> {};

/* Q4_K: an item is one 64-value chunk c of a block (16-byte aligned blocks): its 32
 * quant bytes at b+16+32c (low nibbles: sub-block 2c = values 64c..64c+31, high:
 * sub-block 2c+1), the 6-bit scales/mins of both sub-blocks from the 12 bytes at b+4
 * (the block's 16-byte header is one load); value = d*sc*q - dmin*m, so a sub-block
 * contributes d*sc*dx*sum(q*xq) - dmin*m*(dx*sum xq). The two sub-blocks' (d, d*sum)
 * pairs are one 16-byte load. */

/* Q4_K. HI16 (the layer tail; the matrix-vector kernels with TPI_GV_Q4K): the high nibbles
 * dotted in place, as 16 times their values (unsigned bytes against signed x), the sum
 * scaled back by 1/16: the same floats (an integer times a power of two), one shift a
 * word fewer. */
#ifndef TPI_GV_Q4K
#define TPI_GV_Q4K 1 /* 0: the matrix-vector kernels without HI16 and the byte permutes */
#endif
/* Bytes of the 8-byte {b, a} (a's bytes 0-3, b's 4-7) that sel's four nibbles (0-7) name,
 * as one word (PTX prmt's default mode). */
__host__ __device__ __forceinline__ uint32_t gv_prmt(uint32_t a, uint32_t b, uint32_t sel) {
#ifdef __CUDA_ARCH__
    return __byte_perm(a, b, sel);
#else
    const uint64_t ab = (uint64_t)b << 32 | a;
    uint32_t r = 0;
    for (int i = 0; i < 4; i++)
        r |= (uint32_t)(ab >> (8 * ((sel >> (4 * i)) & 7)) & 0xFFu) << (8 * i);
    return r;
#endif
}
template <> struct gv<TPI_TYPE_Q4_K> {
    static constexpr bool HI = TPI_GV_Q4K != 0; /* the matrix-vector kernels' HI16 */
    static constexpr int BLK = 256, BYTES = 144, IPB = 4;
    struct raw {
        int4 qa, qb, hd;
    };
    static __host__ __device__ __forceinline__ void load(raw &w, const uint8_t *b, int c) {
        w.qa = gv_ld128(b + 16 + 32 * c);
        w.qb = gv_ld128(b + 16 + 32 * c + 16);
        w.hd = gv_ld128(b);
    }
    /* An item's scales and nibbles, decoded once for all the x rows it meets. */
    struct prep {
        float d0, d1, m0, m1;
        uint32_t lo[8], hi[8];
    };
    template <bool HI16 = false>
    static __host__ __device__ __forceinline__ prep unpack(const raw &wr, int c, float keep) {
        const int4 qa = wr.qa, qb = wr.qb;
        prep p = scales(wr.hd, c, keep);
        const uint32_t w[8] = {(uint32_t)qa.x, (uint32_t)qa.y, (uint32_t)qa.z, (uint32_t)qa.w,
                               (uint32_t)qb.x, (uint32_t)qb.y, (uint32_t)qb.z, (uint32_t)qb.w};
#pragma unroll
        for (int i = 0; i < 8; i++) {
            p.lo[i] = w[i] & 0x0F0F0F0Fu;
            p.hi[i] = HI16 ? w[i] & 0xF0F0F0F0u : (w[i] >> 4) & 0x0F0F0F0Fu;
        }
        return p;
    }
    /* Chunk c's two sub-blocks' d*sc and dmin*m (times keep) from the block's 16-byte
     * header hd (Q4_K's and Q5_K's are the same); lo and hi left unset. */
    static __host__ __device__ __forceinline__ prep scales(const int4 hd, int c, float keep) {
        const uint32_t dm = (uint32_t)hd.x;
        const float d = gv_h2f((uint16_t)(dm & 0xFFFFu)) * keep;
        const float dmin = gv_h2f((uint16_t)(dm >> 16)) * keep;
        /* sub-blocks j = 2c, 2c+1 (j < 4 for c < 2): bytes j & 3 (two adjacent bytes,
         * 16 bits at 16*(c&1)) of the scale words s0 = b[4..7], s1 = b[8..11], s2 = b[12..15];
         * sc_j = s0_j & 63, m_j = s1_j & 63 for j < 4, else sc_j = (s2_j & 15) | (s0_j >> 6) << 4,
         * m_j = (s2_j >> 4) | (s1_j >> 6) << 4 (both sub-blocks at once, one per byte) */
#if TPI_GV_Q4K
        /* the same fields by byte permutes whose selectors, shift and mask depend on c only
         * (one lane's items share c: hoisted out of its loop); s2's word zero for c < 2 */
        const uint32_t sel = c & 1 ? 0x4432u : 0x4410u, hi2 = c >= 2;
        const uint32_t a = gv_prmt((uint32_t)hd.y, 0, sel), bb = gv_prmt((uint32_t)hd.z, 0, sel);
        const uint32_t e = gv_prmt((uint32_t)hd.w, 0, hi2 ? sel : 0x4444u);
        const uint32_t s2 = hi2 ? 2 : 0, ms = hi2 ? 0x3030u : 0x3F3Fu;
        const uint32_t scp = (e & 0x0F0Fu) | ((a >> s2) & ms);
        const uint32_t mnp = ((e >> 4) & 0x0F0Fu) | ((bb >> s2) & ms);
#else
        const int sh = 16 * (c & 1);
        const uint32_t a = ((uint32_t)hd.y >> sh) & 0xFFFFu, bb = ((uint32_t)hd.z >> sh) & 0xFFFFu;
        const uint32_t e = ((uint32_t)hd.w >> sh) & 0xFFFFu;
        const uint32_t scp = c < 2 ? (a & 0x3F3Fu) : ((e & 0x0F0Fu) | ((a >> 2) & 0x3030u));
        const uint32_t mnp =
            c < 2 ? (bb & 0x3F3Fu) : (((e >> 4) & 0x0F0Fu) | ((bb >> 2) & 0x3030u));
#endif
        prep p;
        p.d0 = d * (float)(scp & 0xFFu);
        p.d1 = d * (float)(scp >> 8);
        p.m0 = dmin * (float)(mnp & 0xFFu);
        p.m1 = dmin * (float)(mnp >> 8);
        return p;
    }
    /* The item's sum against one x row: its 64 values as units a0, a1 (sub-block 2c) and
     * b0, b1 (2c+1), f = the two sub-blocks' (dx, dx*sum) pairs. */
    template <bool HI16 = false>
    static __host__ __device__ __forceinline__ float row_dot(const prep &p, const int4 a0,
                                                             const int4 a1, const int4 b0,
                                                             const int4 b1, const float4 f) {
        const int sl = gv_dp4a_x4(p.lo + 4, a1, gv_dp4a_x4(p.lo, a0, 0));
        /* HI16: the high nibbles are unsigned bytes (16 times their value) */
        const int sh2 = gv_dp4a_x4<HI16>(p.hi + 4, b1, gv_dp4a_x4<HI16>(p.hi, b0, 0));
        float t = p.d0 * f.x * (float)sl;
        t = fmaf(p.d1 * f.z, HI16 ? (float)sh2 * 0.0625f : (float)sh2, t);
        t = fmaf(-p.m0, f.y, t);
        return fmaf(-p.m1, f.w, t);
    }
    template <int NR, bool PERM, bool HI16 = HI>
    static __host__ __device__ __forceinline__ void dot(const raw &wr, int c, const int8_t *x,
                                                        int xs, const float2 *ds, int dss, int nr,
                                                        float keep, float (&acc)[NR]) {
        rows<NR, PERM, HI16>(unpack<HI16>(wr, c, keep), c, x, xs, ds, dss, nr, acc);
    }
    /* Chunk c's sums against the x rows, from its scales and nibbles p (Q5_K's too). */
    template <int NR, bool PERM, bool HI16 = false>
    static __host__ __device__ __forceinline__ void rows(const prep &p, int c, const int8_t *x,
                                                         int xs, const float2 *ds, int dss,
                                                         int nr, float (&acc)[NR]) {
#pragma unroll
        for (int r = 0; r < NR; r++)
            if (r == 0 || r < nr) {
                const int8_t *xr = x + (size_t)r * xs;
                const int4 a0 = gv_ldx128(gv_xunit<PERM>(xr, 64 * c, 0));
                const int4 a1 = gv_ldx128(gv_xunit<PERM>(xr, 64 * c + 16, 1));
                const int4 b0 = gv_ldx128(gv_xunit<PERM>(xr, 64 * c + 32, 2));
                const int4 b1 = gv_ldx128(gv_xunit<PERM>(xr, 64 * c + 48, 3));
                /* (dx, dx*sum) of sub-blocks 2c and 2c+1: 16-byte aligned (2c even) */
                const float4 f = gv_ldf4((const float *)(ds + (size_t)r * dss + 2 * c));
                acc[r] += row_dot<HI16>(p, a0, a1, b0, b1, f);
            }
    }
};

/* Q5_K: Q4_K's block with 32 bytes qh at b+16 and the quants at b+48 (176 bytes, 16-byte
 * aligned blocks): an item is one 64-value chunk c as Q4_K's, its fifth bits bit 2c (low
 * nibbles, values 64c+l) and bit 2c+1 (high, 64c+32+l) of qh[l], l = 0..31 (two 16-byte
 * loads the block's four items share in-instruction, as they share the header). Values
 * 0..31 as unsigned bytes: the dot is Q4_K's. */
template <> struct gv<TPI_TYPE_Q5_K> {
    static constexpr int BLK = 256, BYTES = 176, IPB = 4;
    struct raw {
        int4 qa, qb, ha, hb, hd;
    };
    static __host__ __device__ __forceinline__ void load(raw &w, const uint8_t *b, int c) {
        w.qa = gv_ld128(b + 48 + 32 * c);
        w.qb = gv_ld128(b + 48 + 32 * c + 16);
        w.ha = gv_ld128(b + 16);
        w.hb = gv_ld128(b + 32);
        w.hd = gv_ld128(b);
    }
    using prep = gv<TPI_TYPE_Q4_K>::prep;
    static __host__ __device__ __forceinline__ prep unpack(const raw &wr, int c, float keep) {
        prep p = gv<TPI_TYPE_Q4_K>::scales(wr.hd, c, keep);
        const int4 qa = wr.qa, qb = wr.qb, ha = wr.ha, hb = wr.hb;
        const uint32_t w[8] = {(uint32_t)qa.x, (uint32_t)qa.y, (uint32_t)qa.z, (uint32_t)qa.w,
                               (uint32_t)qb.x, (uint32_t)qb.y, (uint32_t)qb.z, (uint32_t)qb.w};
        const uint32_t h[8] = {(uint32_t)ha.x, (uint32_t)ha.y, (uint32_t)ha.z, (uint32_t)ha.w,
                               (uint32_t)hb.x, (uint32_t)hb.y, (uint32_t)hb.z, (uint32_t)hb.w};
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t hs = h[i] >> (2 * c); /* bit 0 of each byte: low, bit 1: high */
            p.lo[i] = (w[i] & 0x0F0F0F0Fu) | ((hs << 4) & 0x10101010u);
            p.hi[i] = ((w[i] >> 4) & 0x0F0F0F0Fu) | ((hs << 3) & 0x10101010u);
        }
        return p;
    }
    template <int NR, bool PERM>
    static __host__ __device__ __forceinline__ void dot(const raw &wr, int c, const int8_t *x,
                                                        int xs, const float2 *ds, int dss, int nr,
                                                        float keep, float (&acc)[NR]) {
        gv<TPI_TYPE_Q4_K>::rows<NR, PERM>(unpack(wr, c, keep), c, x, xs, ds, dss, nr, acc);
    }
};

/* One Q6_K item's dot. An item is (half n, l0 in {0, 16}): 16 bytes of ql at 64n+l0 (A)
 * and at 64n+32+l0 (C), 16 of qh at 128+32n+l0 (H); they give values 128n+32k+l0..+15 for
 * k = 0..3 (A low, C low, A high, C high nibbles with 2-bit pairs k of H), q - 32, times
 * sk[k] = d * scales[8n + l0/16 + 2k] (times keep). x, ds at the item's block (kind a) as
 * gv's dot takes them; the four x blocks' (d, d*sum) pairs 4n..4n+3 are two 16-byte
 * loads. SUMX: the 6-bit values dotted as they are (0..63: the same as signed bytes) and
 * 32 times x's sum (a dp4a with ones) taken off: the same integer sums with fewer
 * instructions than the per-byte subtraction, which sm_90 has no single instruction for
 * (3 a word); where x is shared by several rows its sum is taken once. */
/* The rows' sums of one item in Q6_K's geometry (half n, l0 in {0, 16}; Q6_K, Q3_K and
 * Q2_K): the words q[k] hold the item's levels for values 128n + 32k + l0..+15 (k = 0..3),
 * times sk[k] and x's block scale. MODE GV_K16_SUMX32 (GV_K16_SUMX4): the levels carry an
 * offset of 32 (4), taken off as 32 (4) times the 16 x values' sum (a dp4a with ones), so
 * the words need no per-byte subtraction (3 instructions a word); GV_K16_MIN (Q2_K): less
 * mk[k] times that sum (a minimum every 16 values, finer than x's 32-value (d, d*sum)
 * pairs). x, ds at the item's block (kind a) or the item's permuted x (kind p). */
enum { GV_K16_PLAIN, GV_K16_SUMX32, GV_K16_SUMX4, GV_K16_MIN };
template <int NR, bool PERM, int MODE>
__host__ __device__ __forceinline__ void gv_k16_rows(const uint32_t (&q)[4][4], const float (&sk)[4],
                                                     const float (&mk)[4], int n, int l0,
                                                     const int8_t *x, int xs, const float2 *ds,
                                                     int dss, int nr, float (&acc)[NR]) {
#pragma unroll
    for (int r = 0; r < NR; r++)
        if (r == 0 || r < nr) {
            const int8_t *xr = x + (size_t)r * xs;
            const float *dr = (const float *)(ds + (size_t)r * dss + 4 * n);
            const float4 f01 = gv_ldf4(dr), f23 = gv_ldf4(dr + 4);
            const float dx[4] = {f01.x, f01.z, f23.x, f23.z};
            float t = 0.0f;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int4 xv = gv_ldx128(gv_xunit<PERM>(xr, 128 * n + l0 + 32 * k, k));
                int s = gv_dp4a_x4(q[k], xv, 0);
                if (MODE != GV_K16_PLAIN) {
                    const uint32_t ones[4] = {0x01010101u, 0x01010101u, 0x01010101u,
                                              0x01010101u};
                    const int sx = gv_dp4a_x4(ones, xv, 0);
                    if (MODE != GV_K16_MIN) {
                        s -= (MODE == GV_K16_SUMX32 ? 32 : 4) * sx;
                    } else {
                        t = fmaf(dx[k], fmaf(sk[k], (float)s, -mk[k] * (float)sx), t);
                        continue;
                    }
                }
                t = fmaf(sk[k] * dx[k], (float)s, t);
            }
            acc[r] += t;
        }
}

#ifndef TPI_GV_Q6S
#define TPI_GV_Q6S 1 /* 0: the per-byte subtraction in the matrix-vector kernels too */
#endif
template <bool SUMX> __host__ __device__ __forceinline__ uint32_t gv_q6_ofs(uint32_t v) {
    return SUMX ? v : gv_vsub4(v, 0x20202020u); /* four 6-bit values, less 32 unless SUMX */
}
template <int NR, bool PERM, bool SUMX = false>
__host__ __device__ __forceinline__ void gv_q6_item(const uint32_t (&A)[4], const uint32_t (&C)[4],
                                                    const uint32_t (&H)[4], const float (&sk)[4],
                                                    int n, int l0, const int8_t *x, int xs,
                                                    const float2 *ds, int dss, int nr,
                                                    float (&acc)[NR]) {
    uint32_t q[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        q[0][i] = gv_q6_ofs<SUMX>((A[i] & 0x0F0F0F0Fu) | ((H[i] & 0x03030303u) << 4));
        q[1][i] = gv_q6_ofs<SUMX>((C[i] & 0x0F0F0F0Fu) | ((H[i] & 0x0C0C0C0Cu) << 2));
        q[2][i] = gv_q6_ofs<SUMX>(((A[i] >> 4) & 0x0F0F0F0Fu) | (H[i] & 0x30303030u));
        q[3][i] = gv_q6_ofs<SUMX>(((C[i] >> 4) & 0x0F0F0F0Fu) | ((H[i] & 0xC0C0C0C0u) >> 2));
    }
    gv_k16_rows<NR, PERM, SUMX ? GV_K16_SUMX32 : GV_K16_PLAIN>(q, sk, sk, n, l0, x, xs, ds, dss, nr,
                                                              acc);
}

/* Q6_K: an item is a quarter block (it = 2n + l0/16: half n, lanes l0..l0+15), read with
 * 2-byte-aligned loads (gv_ld_a2) */
template <> struct gv<TPI_TYPE_Q6_K> {
    static constexpr int BLK = 256, BYTES = 210, IPB = 4;
    struct raw {
        uint32_t A[4], C[4], H[4], S[2], d;
    };
    static __host__ __device__ __forceinline__ void load(raw &w, const uint8_t *b, int it) {
        const int n = it >> 1, l0 = (it & 1) * 16;
        gv_ld_a2<4>(b + 64 * n + l0, w.A);
        gv_ld_a2<4>(b + 64 * n + 32 + l0, w.C);
        gv_ld_a2<4>(b + 128 + 32 * n + l0, w.H);
        /* the 4 int8 scales sc[8n + l0/16 + 2k] (k = 0..3) sit at even offsets of 8 bytes */
        gv_ld_a2<2>(b + 192 + 8 * n, w.S);
        w.d = gv_ld16(b + 208);
    }
    template <int NR, bool PERM>
    static __host__ __device__ __forceinline__ void dot(const raw &wr, int it, const int8_t *x,
                                                        int xs, const float2 *ds, int dss, int nr,
                                                        float keep, float (&acc)[NR]) {
        const int n = it >> 1, l0 = (it & 1) * 16;
        const float d = gv_h2f((uint16_t)wr.d) * keep;
        float sk[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int idx = l0 / 16 + 2 * k; /* 0..7 */
            sk[k] = d * (float)(int8_t)((wr.S[idx >> 2] >> (8 * (idx & 3))) & 0xFFu);
        }
        gv_q6_item<NR, PERM>(wr.A, wr.C, wr.H, sk, n, l0, x, xs, ds, dss, nr, acc);
    }
};

/* Byte i of the words w (little-endian). */
template <int N> __host__ __device__ __forceinline__ int gv_byte(const uint32_t (&w)[N], int i) {
    return (int)((w[i >> 2] >> (8 * (i & 3))) & 0xFFu);
}

/* Q3_K's item it (0..3) of a block from its words: Q the 16 qs bytes, H the 16 hmask
 * bytes, S the 12 scale bytes, d the f16 scale (gv<TPI_TYPE_Q3_K>'s comment). Shared by
 * the GGUF blocks and their 8-block groups. */
template <int NR, bool PERM>
__host__ __device__ __forceinline__ void gv_q3_item(const uint32_t (&Q)[4], const uint32_t (&H)[4],
                                                    const uint32_t (&S)[3], uint32_t dw, int it,
                                                    const int8_t *x, int xs, const float2 *ds,
                                                    int dss, int nr, float keep,
                                                    float (&acc)[NR]) {
    constexpr int MODE = NR == 1 ? GV_K16_SUMX4 : GV_K16_PLAIN;
    const int n = it >> 1, l0 = (it & 1) * 16;
    const float d = gv_h2f((uint16_t)dw) * keep;
    float sk[4];
    uint32_t q[4][4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int j = 8 * n + 2 * k + (l0 >> 4);
        const int lo = (gv_byte(S, j & 7) >> (4 * (j >> 3))) & 0xF;
        const int hi = (gv_byte(S, 8 + (j & 3)) >> (2 * (j >> 2))) & 3;
        sk[k] = d * (float)((lo | (hi << 4)) - 32);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t v =
                ((Q[i] >> (2 * k)) & 0x03030303u) | (((H[i] >> (4 * n + k)) & 0x01010101u) << 2);
            q[k][i] = MODE == GV_K16_SUMX4 ? v : gv_vsub4(v, 0x04040404u);
        }
    }
    gv_k16_rows<NR, PERM, MODE>(q, sk, sk, n, l0, x, xs, ds, dss, nr, acc);
}

/* Q3_K (110-byte blocks: hmask, qs, 12 scale bytes, f16 d): an item is a quarter block as
 * Q6_K's: 16 qs bytes at 32 + 32n + l0 (bit pairs k), 16 hmask bytes at l0 (bit 4n + k:
 * the level's third bit, clear meaning -4), the 6-bit scales 8n + 2k + l0/16 (kq_q3_k_scale's
 * packing), all read with 2-byte-aligned loads. With one x row the levels are dotted as
 * 0..7 and 4 times x's sum taken off (GV_K16_SUMX4: 16 fewer instructions an item); with
 * more the sum would be taken for each row, and the words are made signed once instead. */
template <> struct gv<TPI_TYPE_Q3_K> {
    static constexpr int BLK = 256, BYTES = 110, IPB = 4;
    struct raw {
        uint32_t Q[4], H[4], S[3], d;
    };
    static __host__ __device__ __forceinline__ void load(raw &w, const uint8_t *b, int it) {
        const int n = it >> 1, l0 = (it & 1) * 16;
        gv_ld_a2<4>(b + 32 + 32 * n + l0, w.Q);
        gv_ld_a2<4>(b + l0, w.H);
        gv_ld_a2<3>(b + 96, w.S);
        w.d = gv_ld16(b + 108);
    }
    template <int NR, bool PERM>
    static __host__ __device__ __forceinline__ void dot(const raw &wr, int it, const int8_t *x,
                                                        int xs, const float2 *ds, int dss, int nr,
                                                        float keep, float (&acc)[NR]) {
        gv_q3_item<NR, PERM>(wr.Q, wr.H, wr.S, wr.d, it, x, xs, ds, dss, nr, keep, acc);
    }
};

/* Q3_K in groups of 8 blocks (KERN_LAYOUT_Q3_KX8): item l = 4c + it of the group is Q3_K's
 * item it of block c; its qs piece a 16-byte load at 16l, its hmask piece one at 512 + 32c
 * + 16 (it & 1), block c's scales three words at 768 + 12c and its d at 864 + 2c. The dot
 * is Q3_K's (the same items in the same order: bitwise the GGUF blocks' results). */
template <> struct gv<KERN_TYPE_Q3_KX8> {
    static constexpr int BLK = 2048, BYTES = KERN_Q3_KX8_BYTES, IPB = 32;
    using raw = gv<TPI_TYPE_Q3_K>::raw; /* the same words, from aligned loads */
    static __host__ __device__ __forceinline__ void load(raw &w, const uint8_t *b, int l) {
        const int c = l >> 2;
        gv_words(gv_ld128(b + 16 * l), w.Q);
        gv_words(gv_ld128(b + 512 + 32 * c + 16 * (l & 1)), w.H);
#pragma unroll
        for (int i = 0; i < 3; i++)
            w.S[i] = gv_ld32(b + 768 + 12 * c + 4 * i);
        w.d = gv_ld16(b + 864 + 2 * c);
    }
    template <int NR, bool PERM>
    static __host__ __device__ __forceinline__ void dot(const raw &wr, int l, const int8_t *x,
                                                        int xs, const float2 *ds, int dss, int nr,
                                                        float keep, float (&acc)[NR]) {
        const int c = l >> 2;
        gv_q3_item<NR, PERM>(wr.Q, wr.H, wr.S, wr.d, l & 3, PERM ? x : x + 256 * c, xs, ds + 8 * c,
                             dss, nr, keep, acc);
    }
};

/* Q2_K (84-byte blocks, 4-byte aligned: 16 scale bytes, qs as Q3_K's, f16 d and dmin): an
 * item as Q3_K's, its scale bytes 8n + l0/16 + 2k (4-bit scale, 4-bit min). */
template <> struct gv<TPI_TYPE_Q2_K> {
    static constexpr int BLK = 256, BYTES = 84, IPB = 4;
    struct raw {
        uint32_t Q[4], S[2], dd;
    };
    static __host__ __device__ __forceinline__ void load(raw &w, const uint8_t *b, int it) {
        const int n = it >> 1, l0 = (it & 1) * 16;
#pragma unroll
        for (int i = 0; i < 4; i++)
            w.Q[i] = gv_ld32(b + 16 + 32 * n + l0 + 4 * i);
        w.S[0] = gv_ld32(b + 8 * n);
        w.S[1] = gv_ld32(b + 8 * n + 4);
        w.dd = gv_ld32(b + 80);
    }
    template <int NR, bool PERM>
    static __host__ __device__ __forceinline__ void dot(const raw &wr, int it, const int8_t *x,
                                                        int xs, const float2 *ds, int dss, int nr,
                                                        float keep, float (&acc)[NR]) {
        const int n = it >> 1, l0 = (it & 1) * 16;
        const float d = gv_h2f((uint16_t)(wr.dd & 0xFFFFu)) * keep;
        const float dmin = gv_h2f((uint16_t)(wr.dd >> 16)) * keep;
        float sk[4], mk[4];
        uint32_t q[4][4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int sc = gv_byte(wr.S, (l0 >> 4) + 2 * k);
            sk[k] = d * (float)(sc & 0xF);
            mk[k] = dmin * (float)(sc >> 4);
#pragma unroll
            for (int i = 0; i < 4; i++)
                q[k][i] = (wr.Q[i] >> (2 * k)) & 0x03030303u;
        }
        gv_k16_rows<NR, PERM, GV_K16_MIN>(q, sk, mk, n, l0, x, xs, ds, dss, nr, acc);
    }
};

/* Q6_K in groups of 8 blocks (KERN_LAYOUT_Q6_KX8): item l = 4c + it of the group is Q6_K's
 * item it of block c; its A, C and H pieces are 16-byte loads at 16l, 512 + 16l and
 * 1024 + 16l, its 4 scales one word at 1536 + 4l, block c's d at 1664 + 2c. The dot is
 * Q6_K's (the same items in the same order: bitwise the GGUF blocks' results). */
template <> struct gv<KERN_TYPE_Q6_KX8> {
    static constexpr int BLK = 2048, BYTES = KERN_Q6_KX8_BYTES, IPB = 32;
    struct raw {
        int4 A, C, H;
        uint32_t S, d;
    };
    static __host__ __device__ __forceinline__ void load(raw &w, const uint8_t *b, int l) {
        w.A = gv_ld128(b + 16 * l);
        w.C = gv_ld128(b + 512 + 16 * l);
        w.H = gv_ld128(b + 1024 + 16 * l);
        w.S = gv_ld32(b + 1536 + 4 * l);
        w.d = gv_ld16(b + 1664 + 2 * (l >> 2));
    }
    /* x, ds: the group's first (kind a; block c's are 256c values and 8c pairs on) or the
     * item's own x (kind p, from gv_item_rows). TPI_GV_Q6S 1: SUMX in the matrix-vector
     * kernels too (the layer tail takes it always; the same bits). */
    template <int NR, bool PERM, bool SUMX = TPI_GV_Q6S != 0>
    static __host__ __device__ __forceinline__ void dot(const raw &wr, int l, const int8_t *x,
                                                        int xs, const float2 *ds, int dss, int nr,
                                                        float keep, float (&acc)[NR]) {
        const int c = l >> 2, it = l & 3, n = it >> 1, l0 = (it & 1) * 16;
        const float d = gv_h2f((uint16_t)wr.d) * keep;
        float sk[4];
#pragma unroll
        for (int k = 0; k < 4; k++)
            sk[k] = d * (float)(int8_t)((wr.S >> (8 * k)) & 0xFFu);
        uint32_t A[4], C[4], H[4];
        gv_words(wr.A, A);
        gv_words(wr.C, C);
        gv_words(wr.H, H);
        gv_q6_item<NR, PERM, SUMX>(A, C, H, sk, n, l0, PERM ? x : x + 256 * c, xs, ds + 8 * c,
                                   dss, nr, acc);
    }
};

#endif /* KERN_GEMV_DOT_CUH */
