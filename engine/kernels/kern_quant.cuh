/*
 * kern_quant.cuh — device-side decoding of the GGUF weight types (block
 * layouts as ggml's, see quant.h), shared by the embed, dequantize and
 * matrix-vector kernels.
 *
 * Block types are read in *units*: a unit is the few bytes one thread decodes
 * at once (4 bytes of quants plus the block's scales), yielding G groups of 4
 * consecutive values at offsets off[g] inside the block. Units of one block sit
 * side by side, so the 32 lanes of a warp reading units u..u+31 read one
 * contiguous stretch of the row: each weight byte is read from memory once.
 *
 * Alignment: a block starts at an even byte (rows are whole blocks, blocks are an
 * even number of bytes), but 18-, 22-, 34- and 210-byte blocks leave 4-byte fields
 * only 2-byte aligned; those are read as two 16-bit halves.
 */
#ifndef KERN_QUANT_CUH
#define KERN_QUANT_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

#include "kern_common.cuh"

__device__ __forceinline__ float kq_f16(const uint8_t *p) {
    return __half2float(__ushort_as_half(*(const uint16_t *)p));
}
__device__ __forceinline__ uint32_t kq_u32_a2(const uint8_t *p) {
    const uint16_t *h = (const uint16_t *)p;
    return (uint32_t)h[0] | ((uint32_t)h[1] << 16);
}
__device__ __forceinline__ uint32_t kq_u32_a4(const uint8_t *p) {
    return *(const uint32_t *)p;
}

/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K block's 12 bytes. */
__device__ __forceinline__ void kq_scale_min_k4(int j, const uint8_t *s, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

template <int TYPE> struct kq;

/* The 8 values of Q4_0 quant word q (byte i: value i's low nibble, value 4 + i's high),
 * (q - 8) * d, into v. */
__device__ __forceinline__ void kq_q4_0_word(uint32_t q, float d, float (&v)[8]) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int x = (q >> (8 * i)) & 0xFF;
        v[i] = (float)((x & 0xF) - 8) * d;
        v[4 + i] = (float)((x >> 4) - 8) * d;
    }
}

/* Q4_0: f16 d, 16 bytes; byte j holds elements j (low nibble) and j+16 (high), q-8. */
template <> struct kq<TPI_TYPE_Q4_0> {
    static constexpr int BLK = 32, BYTES = 18, UPB = 4, G = 2;
    /* offset in the block of group g (0..G-1) of unit u */
    static __device__ __forceinline__ int goff(int u, int g) {
        return 16 * g + 4 * u;
    }
    static __device__ __forceinline__ void unit(const uint8_t *b, int u, float (&v)[8],
                                                int (&off)[2]) {
        const float d = kq_f16(b);
        const uint32_t q = kq_u32_a2(b + 2 + 4 * u);
        kq_q4_0_word(q, d, v);
        off[0] = goff(u, 0);
        off[1] = goff(u, 1);
    }
};

/* Q4_0 in groups of 8 blocks (KERN_LAYOUT_Q4_0X8): 8 x 16 quant bytes, then 8 f16 scales.
 * Unit u = Q4_0's unit u & 3 of block u >> 2 (4-byte aligned). */
template <> struct kq<KERN_TYPE_Q4_0X8> {
    static constexpr int BLK = 256, BYTES = KERN_Q4_0X8_BYTES, UPB = 32, G = 2;
    /* offset in the block of group g (0..G-1) of unit u */
    static __device__ __forceinline__ int goff(int u, int g) {
        return 32 * (u >> 2) + 16 * g + 4 * (u & 3);
    }
    static __device__ __forceinline__ void unit(const uint8_t *b, int u, float (&v)[8],
                                                int (&off)[2]) {
        const int k = u >> 2;
        const float d = kq_f16(b + 128 + 2 * k);
        const uint32_t q = kq_u32_a4(b + 16 * k + 4 * (u & 3));
        kq_q4_0_word(q, d, v);
        off[0] = goff(u, 0);
        off[1] = goff(u, 1);
    }
};

/* Q4_1: f16 d, f16 m, 16 bytes; value q*d + m. 20-byte blocks: 4-byte aligned. */
template <> struct kq<TPI_TYPE_Q4_1> {
    static constexpr int BLK = 32, BYTES = 20, UPB = 4, G = 2;
    /* offset in the block of group g (0..G-1) of unit u */
    static __device__ __forceinline__ int goff(int u, int g) {
        return 16 * g + 4 * u;
    }
    static __device__ __forceinline__ void unit(const uint8_t *b, int u, float (&v)[8],
                                                int (&off)[2]) {
        const float d = kq_f16(b), m = kq_f16(b + 2);
        const uint32_t q = kq_u32_a4(b + 4 + 4 * u);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int x = (q >> (8 * i)) & 0xFF;
            v[i] = (float)(x & 0xF) * d + m;
            v[4 + i] = (float)(x >> 4) * d + m;
        }
        off[0] = goff(u, 0);
        off[1] = goff(u, 1);
    }
};

/* Q5_0: f16 d, 32 high bits qh, 16 bytes; element j's fifth bit is qh bit j, q-16. */
template <> struct kq<TPI_TYPE_Q5_0> {
    static constexpr int BLK = 32, BYTES = 22, UPB = 4, G = 2;
    /* offset in the block of group g (0..G-1) of unit u */
    static __device__ __forceinline__ int goff(int u, int g) {
        return 16 * g + 4 * u;
    }
    static __device__ __forceinline__ void unit(const uint8_t *b, int u, float (&v)[8],
                                                int (&off)[2]) {
        const float d = kq_f16(b);
        const uint32_t qh = kq_u32_a2(b + 2);
        const uint32_t q = kq_u32_a2(b + 6 + 4 * u);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int j = 4 * u + i;
            const int x = (q >> (8 * i)) & 0xFF;
            const int h0 = ((qh >> j) & 1) << 4, h1 = ((qh >> (j + 16)) & 1) << 4;
            v[i] = (float)(((x & 0xF) | h0) - 16) * d;
            v[4 + i] = (float)(((x >> 4) | h1) - 16) * d;
        }
        off[0] = goff(u, 0);
        off[1] = goff(u, 1);
    }
};

/* Q5_1: f16 d, f16 m, qh, 16 bytes; value q*d + m. 24-byte blocks: 4-byte aligned. */
template <> struct kq<TPI_TYPE_Q5_1> {
    static constexpr int BLK = 32, BYTES = 24, UPB = 4, G = 2;
    /* offset in the block of group g (0..G-1) of unit u */
    static __device__ __forceinline__ int goff(int u, int g) {
        return 16 * g + 4 * u;
    }
    static __device__ __forceinline__ void unit(const uint8_t *b, int u, float (&v)[8],
                                                int (&off)[2]) {
        const float d = kq_f16(b), m = kq_f16(b + 2);
        const uint32_t qh = kq_u32_a4(b + 4);
        const uint32_t q = kq_u32_a4(b + 8 + 4 * u);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int j = 4 * u + i;
            const int x = (q >> (8 * i)) & 0xFF;
            const int h0 = ((qh >> j) & 1) << 4, h1 = ((qh >> (j + 16)) & 1) << 4;
            v[i] = (float)((x & 0xF) | h0) * d + m;
            v[4 + i] = (float)((x >> 4) | h1) * d + m;
        }
        off[0] = goff(u, 0);
        off[1] = goff(u, 1);
    }
};

/* Q8_0: f16 d, 32 int8. */
template <> struct kq<TPI_TYPE_Q8_0> {
    static constexpr int BLK = 32, BYTES = 34, UPB = 8, G = 1;
    /* offset in the block of group g (0..G-1) of unit u */
    static __device__ __forceinline__ int goff(int u, int g) {
        return (void)g, 4 * u;
    }
    static __device__ __forceinline__ void unit(const uint8_t *b, int u, float (&v)[4],
                                                int (&off)[1]) {
        const float d = kq_f16(b);
        const uint32_t q = kq_u32_a2(b + 2 + 4 * u);
#pragma unroll
        for (int i = 0; i < 4; i++)
            v[i] = (float)(int8_t)((q >> (8 * i)) & 0xFF) * d;
        off[0] = goff(u, 0);
    }
};

/* Q8_0 in groups of 8 blocks (KERN_LAYOUT_Q8_0X8): 256 int8, then 8 f16 scales. A unit is
 * 4 quants (4-byte aligned); the scale of values 32j..32j+31 is at b + 256 + 2j. */
template <> struct kq<KERN_TYPE_Q8_0X8> {
    static constexpr int BLK = 256, BYTES = KERN_Q8_0X8_BYTES, UPB = 64, G = 1;
    /* offset in the block of group g (0..G-1) of unit u */
    static __device__ __forceinline__ int goff(int u, int g) {
        return (void)g, 4 * u;
    }
    static __device__ __forceinline__ void unit(const uint8_t *b, int u, float (&v)[4],
                                                int (&off)[1]) {
        const float d = kq_f16(b + 256 + 2 * (u >> 3));
        const uint32_t q = kq_u32_a4(b + 4 * u);
#pragma unroll
        for (int i = 0; i < 4; i++)
            v[i] = (float)(int8_t)((q >> (8 * i)) & 0xFF) * d;
        off[0] = goff(u, 0);
    }
};

/* Q4_K: f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes. Each 64-value chunk c
 * uses 32 bytes: low nibbles are values 64c+l (sub-block 2c), high nibbles 64c+32+l
 * (sub-block 2c+1); value = d*sc*q - dmin*m. 144-byte blocks: 16-byte aligned. */
template <> struct kq<TPI_TYPE_Q4_K> {
    static constexpr int BLK = 256, BYTES = 144, UPB = 32, G = 2;
    /* offset in the block of group g (0..G-1) of unit u (host too: kern_mmq_order) */
    static __host__ __device__ __forceinline__ int goff(int u, int g) {
        return 64 * (u >> 3) + 32 * g + (u & 7) * 4;
    }
    /* chunk c's scales and mins: d0, mm0 of sub-block 2c, d1, mm1 of 2c+1 (Q5_K's too) */
    static __device__ __forceinline__ void scales(const uint8_t *b, int c, float &d0, float &mm0,
                                                  float &d1, float &mm1) {
        const float d = kq_f16(b), dmin = kq_f16(b + 2);
        int sc0, m0, sc1, m1;
        kq_scale_min_k4(2 * c, b + 4, &sc0, &m0);
        kq_scale_min_k4(2 * c + 1, b + 4, &sc1, &m1);
        d0 = d * (float)sc0, mm0 = dmin * (float)m0;
        d1 = d * (float)sc1, mm1 = dmin * (float)m1;
    }
    static __device__ __forceinline__ void unit(const uint8_t *b, int u, float (&v)[8],
                                                int (&off)[2]) {
        const int c = u >> 3, l0 = (u & 7) * 4;
        float d0, mm0, d1, mm1;
        scales(b, c, d0, mm0, d1, mm1);
        const uint32_t q = kq_u32_a4(b + 16 + 32 * c + l0);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int x = (q >> (8 * i)) & 0xFF;
            v[i] = d0 * (float)(x & 0xF) - mm0;
            v[4 + i] = d1 * (float)(x >> 4) - mm1;
        }
        off[0] = goff(u, 0);
        off[1] = goff(u, 1);
    }
};

/* Q5_K: as Q4_K plus 32 bytes qh: qh[l] bit 2c is the fifth bit of value 64c+l, bit
 * 2c+1 that of 64c+32+l. 176-byte blocks: 16-byte aligned. */
template <> struct kq<TPI_TYPE_Q5_K> : kq<TPI_TYPE_Q4_K> {
    static constexpr int BYTES = 176;
    static __device__ __forceinline__ void unit(const uint8_t *b, int u, float (&v)[8],
                                                int (&off)[2]) {
        const int c = u >> 3, l0 = (u & 7) * 4;
        float d0, mm0, d1, mm1;
        scales(b, c, d0, mm0, d1, mm1);
        const uint32_t h = kq_u32_a4(b + 16 + l0);
        const uint32_t q = kq_u32_a4(b + 48 + 32 * c + l0);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int x = (q >> (8 * i)) & 0xFF;
            const int hb = (h >> (8 * i)) & 0xFF;
            v[i] = d0 * (float)((x & 0xF) + (((hb >> (2 * c)) & 1) << 4)) - mm0;
            v[4 + i] = d1 * (float)((x >> 4) + (((hb >> (2 * c + 1)) & 1) << 4)) - mm1;
        }
        off[0] = goff(u, 0);
        off[1] = goff(u, 1);
    }
};

/* The 16 values of one Q6_K unit from its words: a (4 ql bytes: low nibbles values 0-3,
 * high nibbles 8-11), c (the ql bytes 32 on: 4-7, 12-15) and h (their 2-bit high parts,
 * pairs k = 0..3 for the four runs), q - 32 times the runs' scales s0..s3. Shared by the
 * GGUF blocks and their 8-block groups (kq<KERN_TYPE_Q6_KX8>). */
__device__ __forceinline__ void kq_q6_values(uint32_t a, uint32_t c, uint32_t h, float s0, float s1,
                                             float s2, float s3, float (&v)[16]) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int xa = (a >> (8 * i)) & 0xFF, xc = (c >> (8 * i)) & 0xFF;
        const int hh = (h >> (8 * i)) & 0xFF;
        v[i] = s0 * (float)(((xa & 0xF) | ((hh & 3) << 4)) - 32);
        v[4 + i] = s1 * (float)(((xc & 0xF) | (((hh >> 2) & 3) << 4)) - 32);
        v[8 + i] = s2 * (float)(((xa >> 4) | (((hh >> 4) & 3) << 4)) - 32);
        v[12 + i] = s3 * (float)(((xc >> 4) | (((hh >> 6) & 3) << 4)) - 32);
    }
}
/* Q6_K: 128 bytes ql, 64 bytes qh, 16 int8 scales, f16 d. Each 128-value half n uses
 * ql[64n..], qh[32n..], scales[8n..]: byte l gives values l, l+32, l+64, l+96 of the half
 * (low/high nibbles of ql[l], ql[l+32], 2-bit pairs of qh[l]), q-32, times d*scale[l/16 + 2i]. */
template <> struct kq<TPI_TYPE_Q6_K> {
    static constexpr int BLK = 256, BYTES = 210, UPB = 16, G = 4;
    /* offset in the block of group g (0..G-1) of unit u */
    static __device__ __forceinline__ int goff(int u, int g) {
        return 128 * (u >> 3) + 32 * g + (u & 7) * 4;
    }
    static __device__ __forceinline__ void unit(const uint8_t *b, int u, float (&v)[16],
                                                int (&off)[4]) {
        const float d = kq_f16(b + 208);
        const int n = u >> 3, l0 = (u & 7) * 4;
        const uint8_t *ql = b + 64 * n, *qh = b + 128 + 32 * n;
        const int8_t *sc = (const int8_t *)(b + 192 + 8 * n);
        const int is = l0 / 16;
        const uint32_t a = kq_u32_a2(ql + l0), c = kq_u32_a2(ql + 32 + l0), h = kq_u32_a2(qh + l0);
        const float s0 = d * (float)sc[is], s1 = d * (float)sc[is + 2];
        const float s2 = d * (float)sc[is + 4], s3 = d * (float)sc[is + 6];
        kq_q6_values(a, c, h, s0, s1, s2, s3, v);
        off[0] = goff(u, 0);
        off[1] = goff(u, 1);
        off[2] = goff(u, 2);
        off[3] = goff(u, 3);
    }
};

/* Q3_K's 6-bit scale j (0..15), less its offset 32: low 4 bits in nibble j / 8 of byte
 * j % 8 of its 12 scale bytes s, top 2 bits at bit 2 (j / 4) of byte 8 + j % 4. */
__host__ __device__ __forceinline__ int kq_q3_k_scale(const uint8_t *s, int j) {
    const int lo = (s[j & 7] >> (4 * (j >> 3))) & 0xF;
    const int hi = (s[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
    return (lo | (hi << 4)) - 32;
}

/* The 16 values of Q3_K unit u (0..15) of a block: q its qs word (bytes 32n + l0 .. +4 of
 * qs, l0 = 4 (u % 8)), h its hmask word (bytes l0 .. +4), sc the block's 12 scale bytes,
 * d its scale. Shared by the GGUF blocks, their 8-block groups and kern_mmq's chunks. */
__device__ __forceinline__ void kq_q3_k_values(uint32_t q, uint32_t h, const uint8_t *sc, float d,
                                               int u, float (&v)[16]) {
    const int n = u >> 3, l0 = (u & 7) * 4;
#pragma unroll
    for (int g = 0; g < 4; g++) {
        const float dl = d * (float)kq_q3_k_scale(sc, 8 * n + 2 * g + (l0 >> 4));
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int lv = (q >> (8 * i + 2 * g)) & 3, hb = (h >> (8 * i + 4 * n + g)) & 1;
            v[4 * g + i] = dl * (float)(lv - (hb ? 0 : 4));
        }
    }
}

/* Q3_K: 32 bytes hmask, 64 bytes qs, 12 bytes of packed 6-bit scales, f16 d (110 bytes).
 * Q6_K's geometry: each 128-value half n uses qs[32n..]: byte l gives values l, l+32,
 * l+64, l+96 of the half (bit pairs 0..3), whose third bit is bit 4n + k of hmask[l];
 * q - 4 (the bit clear: minus 4) times d * scale[8n + 2k + l/16]. Units as Q6_K's. */
template <> struct kq<TPI_TYPE_Q3_K> {
    static constexpr int BLK = 256, BYTES = 110, UPB = 16, G = 4;
    /* offset in the block of group g (0..G-1) of unit u */
    static __device__ __forceinline__ int goff(int u, int g) {
        return 128 * (u >> 3) + 32 * g + (u & 7) * 4;
    }
    static __device__ __forceinline__ void unit(const uint8_t *b, int u, float (&v)[16],
                                                int (&off)[4]) {
        const int n = u >> 3, l0 = (u & 7) * 4;
        kq_q3_k_values(kq_u32_a2(b + 32 + 32 * n + l0), kq_u32_a2(b + l0), b + 96, kq_f16(b + 108),
                       u, v);
#pragma unroll
        for (int g = 0; g < 4; g++)
            off[g] = goff(u, g);
    }
};

/* Q3_K in groups of 8 blocks (KERN_LAYOUT_Q3_KX8, kern_common.cuh): unit u = Q3_K's unit
 * uu = u % 16 of block c = u / 16: its qs word at 64c + 32n + l0, hmask word at 512 + 32c
 * + l0, the block's scales at 768 + 12c and d at 864 + 2c (all 4-byte aligned). */
template <> struct kq<KERN_TYPE_Q3_KX8> {
    static constexpr int BLK = 2048, BYTES = KERN_Q3_KX8_BYTES, UPB = 128, G = 4;
    /* offset in the block of group g (0..G-1) of unit u */
    static __device__ __forceinline__ int goff(int u, int g) {
        return 256 * (u >> 4) + kq<TPI_TYPE_Q3_K>::goff(u & 15, g);
    }
    static __device__ __forceinline__ void unit(const uint8_t *b, int u, float (&v)[16],
                                                int (&off)[4]) {
        const int c = u >> 4, uu = u & 15, n = uu >> 3, l0 = (uu & 7) * 4;
        kq_q3_k_values(kq_u32_a4(b + 64 * c + 32 * n + l0), kq_u32_a4(b + 512 + 32 * c + l0),
                       b + 768 + 12 * c, kq_f16(b + 864 + 2 * c), uu, v);
#pragma unroll
        for (int g = 0; g < 4; g++)
            off[g] = goff(u, g);
    }
};

/* Q2_K: 16 bytes of scales (4-bit scale, 4-bit min above it), 64 bytes qs as Q3_K's, f16
 * d and dmin (84 bytes): value = d * (sc & 15) * q - dmin * (sc >> 4), q the bit pair, sc
 * = scales[8n + 2k + l/16]. Units as Q6_K's (84-byte blocks: 4-byte aligned). */
template <> struct kq<TPI_TYPE_Q2_K> {
    static constexpr int BLK = 256, BYTES = 84, UPB = 16, G = 4;
    /* offset in the block of group g (0..G-1) of unit u */
    static __device__ __forceinline__ int goff(int u, int g) {
        return 128 * (u >> 3) + 32 * g + (u & 7) * 4;
    }
    static __device__ __forceinline__ void unit(const uint8_t *b, int u, float (&v)[16],
                                                int (&off)[4]) {
        const float d = kq_f16(b + 80), dmin = kq_f16(b + 82);
        const int n = u >> 3, l0 = (u & 7) * 4;
        const uint32_t q = kq_u32_a4(b + 16 + 32 * n + l0);
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const int sc = b[8 * n + 2 * g + (l0 >> 4)];
            const float dl = d * (float)(sc & 0xF), ml = dmin * (float)(sc >> 4);
#pragma unroll
            for (int i = 0; i < 4; i++)
                v[4 * g + i] = dl * (float)((q >> (8 * i + 2 * g)) & 3) - ml;
            off[g] = goff(u, g);
        }
    }
};

/* __byte_perm (the host emulates): byte i of the result is byte ((s >> 4i) & 7) of the
 * 8 bytes b:a (selector bit 3, sign replication, never used here). */
__host__ __device__ __forceinline__ uint32_t kq_prmt(uint32_t a, uint32_t b, uint32_t s) {
#ifdef __CUDA_ARCH__
    return __byte_perm(a, b, s);
#else
    const uint64_t ab = (uint64_t)a | ((uint64_t)b << 32);
    uint32_t r = 0;
    for (int i = 0; i < 4; i++)
        r |= (uint32_t)((ab >> (8 * ((s >> (4 * i)) & 7))) & 0xFFu) << (8 * i);
    return r;
#endif
}

/* IQ4's 16 levels (ggml's kvalues_iq4nl: -127 -104 -83 -65 -49 -35 -22 -10 1 13 25 38 53
 * 69 89 113) as int8, four to a little-endian word. */
#define KQ_IQ4_W0 0xBFAD9881u
#define KQ_IQ4_W1 0xF6EADDCFu
#define KQ_IQ4_W2 0x26190D01u
#define KQ_IQ4_W3 0x71594535u

/* The IQ4 levels of the 8 indices (0..15) in the nibbles of q, as int8 four to a word:
 * byte i of lo is the level of byte i's low nibble, of hi its high nibble's. Two byte
 * permutes a half-word look up the indices' low 3 bits (selector nibble k: index k) in the
 * table's low and high 8 levels, a third takes each index's from the half its bit 3
 * names (selector nibble k: k, plus 4 where bit 3 is set), and two more de-interleave the
 * low and high nibbles' levels (13 instructions for 8 values). */
__host__ __device__ __forceinline__ void kq_iq4_levels8(uint32_t q, uint32_t &lo, uint32_t &hi) {
    const uint32_t s = q & 0x77777777u, s1 = s >> 16;
    const uint32_t pick = ((q >> 1) & 0x44444444u) | 0x32103210u;
    const uint32_t c0 =
        kq_prmt(kq_prmt(KQ_IQ4_W0, KQ_IQ4_W1, s), kq_prmt(KQ_IQ4_W2, KQ_IQ4_W3, s), pick);
    const uint32_t c1 = kq_prmt(kq_prmt(KQ_IQ4_W0, KQ_IQ4_W1, s1),
                                kq_prmt(KQ_IQ4_W2, KQ_IQ4_W3, s1), pick >> 16);
    lo = kq_prmt(c0, c1, 0x6420u);
    hi = kq_prmt(c0, c1, 0x7531u);
}

/* The 8 values of IQ4 quant word q at scale d (byte i: value i's index in the low nibble,
 * value 4 + i's in the high), d * level, into v: as the CPU's (the same product). */
__device__ __forceinline__ void kq_iq4_word(uint32_t q, float d, float (&v)[8]) {
    uint32_t lo, hi;
    kq_iq4_levels8(q, lo, hi);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        v[i] = d * (float)(int8_t)((lo >> (8 * i)) & 0xFFu);
        v[4 + i] = d * (float)(int8_t)((hi >> (8 * i)) & 0xFFu);
    }
}

/* IQ4_NL: f16 d, 16 bytes of table indices laid out as Q4_0's quants (byte j: value j low,
 * j+16 high), d * level. Units as Q4_0's. */
template <> struct kq<TPI_TYPE_IQ4_NL> {
    static constexpr int BLK = 32, BYTES = 18, UPB = 4, G = 2;
    /* offset in the block of group g (0..G-1) of unit u */
    static __device__ __forceinline__ int goff(int u, int g) {
        return 16 * g + 4 * u;
    }
    static __device__ __forceinline__ void unit(const uint8_t *b, int u, float (&v)[8],
                                                int (&off)[2]) {
        kq_iq4_word(kq_u32_a2(b + 2 + 4 * u), kq_f16(b), v);
        off[0] = goff(u, 0);
        off[1] = goff(u, 1);
    }
};

/* IQ4_XS: f16 d, 16 bits of the scales' top 2 bits (sub-block ib at bit 2ib), 4 bytes of
 * their low 4 bits (nibble ib % 2 of byte ib / 2), then 8 sub-blocks of 32 as IQ4_NL's 16
 * bytes (136 bytes: 8-byte aligned); sub-block ib's values d * (ls - 32) * level. Unit u:
 * bytes 4(u & 3) of sub-block u >> 2. */
template <> struct kq<TPI_TYPE_IQ4_XS> {
    static constexpr int BLK = 256, BYTES = 136, UPB = 32, G = 2;
    /* offset in the block of group g (0..G-1) of unit u */
    static __device__ __forceinline__ int goff(int u, int g) {
        return 32 * (u >> 2) + 16 * g + 4 * (u & 3);
    }
    static __device__ __forceinline__ void unit(const uint8_t *b, int u, float (&v)[8],
                                                int (&off)[2]) {
        const int ib = u >> 2;
        const int sh = *(const uint16_t *)(b + 2);
        const int ls = ((b[4 + (ib >> 1)] >> (4 * (ib & 1))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4);
        kq_iq4_word(kq_u32_a4(b + 8 + 16 * ib + 4 * (u & 3)), kq_f16(b) * (float)(ls - 32), v);
        off[0] = goff(u, 0);
        off[1] = goff(u, 1);
    }
};

/* The 16 values of item l's words at byte j (0, 4, 8, 12) of a Q6_K 8-block group's
 * pieces: A, C and H runs (16 bytes an item), the scales words (4 bytes an item) and the
 * item's block's f16 d. Shared by kq<KERN_TYPE_Q6_KX8> and kern_mmq's gathered chunks. */
__device__ __forceinline__ void kq_q6x8_item(const uint8_t *A, const uint8_t *C, const uint8_t *H,
                                             const uint8_t *S, const uint8_t *D, int l, int j,
                                             float (&v)[16]) {
    const float d = kq_f16(D);
    const uint32_t a = kq_u32_a4(A + 16 * l + j), cc = kq_u32_a4(C + 16 * l + j);
    const uint32_t h = kq_u32_a4(H + 16 * l + j), sw = kq_u32_a4(S + 4 * l);
    const float s0 = d * (float)(int8_t)(sw & 0xFF), s1 = d * (float)(int8_t)((sw >> 8) & 0xFF);
    const float s2 = d * (float)(int8_t)((sw >> 16) & 0xFF), s3 = d * (float)(int8_t)(sw >> 24);
    kq_q6_values(a, cc, h, s0, s1, s2, s3, v);
}

/* Q6_K in groups of 8 blocks (KERN_LAYOUT_Q6_KX8, kern_common.cuh): unit u = Q6_K's unit
 * uu = u % 16 of block c = u / 16, its item it = 2n + l0/16 at l = 4c + it: the words at
 * byte l0 % 16 of the item's A, C and H pieces, its scales word, block c's d. */
template <> struct kq<KERN_TYPE_Q6_KX8> {
    static constexpr int BLK = 2048, BYTES = KERN_Q6_KX8_BYTES, UPB = 128, G = 4;
    /* offset in the block of group g (0..G-1) of unit u (host too: kern_mmq_order) */
    static __host__ __device__ __forceinline__ int goff(int u, int g) {
        return 256 * (u >> 4) + 128 * ((u >> 3) & 1) + (u & 7) * 4 + 32 * g;
    }
    static __device__ __forceinline__ void unit(const uint8_t *b, int u, float (&v)[16],
                                                int (&off)[4]) {
        const int c = u >> 4, n = (u >> 3) & 1, l0 = (u & 7) * 4;
        const int l = 4 * c + 2 * n + (l0 >> 4), j = l0 & 15;
        kq_q6x8_item(b, b + 512, b + 1024, b + 1536, b + 1664 + 2 * c, l, j, v);
        off[0] = goff(u, 0);
        off[1] = goff(u, 1);
        off[2] = goff(u, 2);
        off[3] = goff(u, 3);
    }
};

/* Element types: value j of a row. */
template <int TYPE> struct kf;
template <> struct kf<TPI_TYPE_F32> {
    static __device__ __forceinline__ float load(const uint8_t *row, int64_t j) {
        return ((const float *)row)[j];
    }
};
template <> struct kf<TPI_TYPE_F16> {
    static __device__ __forceinline__ float load(const uint8_t *row, int64_t j) {
        return __half2float(((const __half *)row)[j]);
    }
};
template <> struct kf<TPI_TYPE_BF16> {
    static __device__ __forceinline__ float load(const uint8_t *row, int64_t j) {
        return __bfloat162float(((const __nv_bfloat16 *)row)[j]);
    }
};

/* Call f(std::integral_constant<int, TYPE>, std::bool_constant<IS_BLOCK>) for a run-time
 * type id (a weight's is kern_wtype(w)): the one place the CUDA side switches on the
 * weight type (the callee picks kq<> or kf<> with if constexpr). Returns false for types
 * without kernels. */
template <typename F> bool kq_dispatch(int type, F &&f) {
#define KQ_CASE(T, B)                                                                              \
    case T:                                                                                        \
        f(std::integral_constant<int, T>{}, std::bool_constant<B>{});                              \
        return true;
    switch (type) {
        KQ_CASE(TPI_TYPE_F32, false)
        KQ_CASE(TPI_TYPE_F16, false)
        KQ_CASE(TPI_TYPE_BF16, false)
        KQ_CASE(TPI_TYPE_Q4_0, true)
        KQ_CASE(KERN_TYPE_Q4_0X8, true)
        KQ_CASE(TPI_TYPE_Q4_1, true)
        KQ_CASE(TPI_TYPE_Q5_0, true)
        KQ_CASE(TPI_TYPE_Q5_1, true)
        KQ_CASE(TPI_TYPE_Q8_0, true)
        KQ_CASE(KERN_TYPE_Q8_0X8, true)
        KQ_CASE(TPI_TYPE_Q4_K, true)
        KQ_CASE(TPI_TYPE_Q5_K, true)
        KQ_CASE(TPI_TYPE_Q6_K, true)
        KQ_CASE(KERN_TYPE_Q6_KX8, true)
        KQ_CASE(TPI_TYPE_Q3_K, true)
        KQ_CASE(KERN_TYPE_Q3_KX8, true)
        KQ_CASE(TPI_TYPE_Q2_K, true)
        KQ_CASE(TPI_TYPE_IQ4_NL, true)
        KQ_CASE(TPI_TYPE_IQ4_XS, true)
    default:
        return false;
    }
#undef KQ_CASE
}

#endif /* KERN_QUANT_CUH */
