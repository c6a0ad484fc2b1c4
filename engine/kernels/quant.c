/*
 * quant.c — the tensor-type traits table: ggml's block layouts, dequantization
 * to f32 and reference quantization from f32 for every type tpinfer computes.
 *
 * Layouts follow ggml (ggml-common.h) byte for byte so that a GGUF's data is
 * used as is. Dequantization is exact (the same arithmetic as ggml's reference
 * dequantizers, in f32). Quantization is a simple, fast reference: one pass of
 * min/max or abs-max scaling per (sub-)block rather than llama.cpp's iterative
 * error search, which is what `tpinfer mkmodel` needs to write billions of
 * random weights quickly; the blocks it produces are valid ggml blocks.
 */
#include "quant.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- block layouts (sizes checked below) ---------------------------------- */

#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define K_SCALE_SIZE 12
#define QK4_NL 32

struct block_q4_0 {
    uint16_t d;            /* f16 scale */
    uint8_t qs[QK4_0 / 2]; /* element j: low nibble of qs[j] (j<16), high nibble of qs[j-16] */
};
struct block_q4_1 {
    uint16_t d, m; /* f16 scale and minimum: x = q*d + m */
    uint8_t qs[QK4_1 / 2];
};
struct block_q5_0 {
    uint16_t d;
    uint8_t qh[4]; /* bit j = 5th bit of element j (little-endian u32) */
    uint8_t qs[QK5_0 / 2];
};
struct block_q5_1 {
    uint16_t d, m;
    uint8_t qh[4];
    uint8_t qs[QK5_1 / 2];
};
struct block_q8_0 {
    uint16_t d;
    int8_t qs[QK8_0];
};
struct block_q2_k {
    uint8_t scales[QK_K / 16]; /* 16 x (4-bit scale | 4-bit min << 4) */
    uint8_t qs[QK_K / 4];      /* 2-bit levels; layout as in q2_k_to_f32 */
    uint16_t d, dmin;          /* f16 super-block scales of the scales and mins */
};
struct block_q3_k {
    uint8_t hmask[QK_K / 8];      /* bit (e / 32) of byte (e % 32): level bit 2 of element e */
    uint8_t qs[QK_K / 4];         /* low 2 bits, laid out as Q2_K's */
    uint8_t scales[K_SCALE_SIZE]; /* 16 x 6-bit scales (offset 32), packed */
    uint16_t d;
};
struct block_iq4_nl {
    uint16_t d;
    uint8_t qs[QK4_NL / 2]; /* table indices: element j low nibble of qs[j], j+16 high */
};
struct block_iq4_xs {
    uint16_t d;
    uint16_t scales_h;        /* top 2 bits of the 6-bit scale of sub-block b: bits 2b, 2b+1 */
    uint8_t scales_l[QK_K / 64]; /* low 4 bits: nibble b%2 of byte b/2 */
    uint8_t qs[QK_K / 2];     /* per sub-block of 32, as IQ4_NL's 16 bytes */
};
struct block_q4_k {
    uint16_t d, dmin;             /* super-block scales of the 6-bit scales and mins */
    uint8_t scales[K_SCALE_SIZE]; /* 8 x (6-bit scale, 6-bit min), packed */
    uint8_t qs[QK_K / 2];
};
struct block_q5_k {
    uint16_t d, dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
};
struct block_q6_k {
    uint8_t ql[QK_K / 2];     /* low 4 bits */
    uint8_t qh[QK_K / 4];     /* high 2 bits */
    int8_t scales[QK_K / 16]; /* 16 sub-blocks of 16 */
    uint16_t d;               /* f16 super-block scale, last in ggml's layout */
};

_Static_assert(sizeof(struct block_q4_0) == 18, "block_q4_0 layout");
_Static_assert(sizeof(struct block_q4_1) == 20, "block_q4_1 layout");
_Static_assert(sizeof(struct block_q5_0) == 22, "block_q5_0 layout");
_Static_assert(sizeof(struct block_q5_1) == 24, "block_q5_1 layout");
_Static_assert(sizeof(struct block_q8_0) == 34, "block_q8_0 layout");
_Static_assert(sizeof(struct block_q2_k) == 84, "block_q2_K layout");
_Static_assert(sizeof(struct block_q3_k) == 110, "block_q3_K layout");
_Static_assert(sizeof(struct block_iq4_nl) == 18, "block_iq4_nl layout");
_Static_assert(sizeof(struct block_iq4_xs) == 136, "block_iq4_xs layout");
_Static_assert(sizeof(struct block_q4_k) == 144, "block_q4_K layout");
_Static_assert(sizeof(struct block_q5_k) == 176, "block_q5_K layout");
_Static_assert(sizeof(struct block_q6_k) == 210, "block_q6_K layout");

static void q6_k_pack(const uint8_t *L, struct block_q6_k *b);

static inline float f16(uint16_t h) {
    return tpi_f16_to_f32(h);
}

/* f16 -> f32 without branches, so that loops of it vectorize (F16 tensors; the
 * baseline bodies' block scales take f16, whose loops vectorized worse with this
 * inlined): bitwise tpi_f16_to_f32's value for every input (test_quant checks all
 * 65536). Exponent 0 is man * 2^-24, exact in f32; 31 keeps the payload of a NaN. */
static inline float f16_lanes(uint16_t h) {
    const uint32_t em = h & 0x7fffu, sign = (uint32_t)(h & 0x8000u) << 16;
    const float sub = (float)em * 0x1p-24f;
    uint32_t sub_bits;
    memcpy(&sub_bits, &sub, 4);
    const uint32_t normal = (em << 13) + ((uint32_t)(127 - 15) << 23);
    const uint32_t special = (em << 13) | 0x7f800000u;
    const uint32_t is_special = 0u - (uint32_t)(em >= 0x7c00u);
    const uint32_t is_sub = 0u - (uint32_t)(em < 0x0400u);
    const uint32_t bits = sign | (special & is_special) | (sub_bits & is_sub) |
                          (normal & ~(is_special | is_sub)); /* masks, not branches */
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline int clampi(int v, int lo, int hi) {
    return v < lo ? lo : v > hi ? hi : v;
}

/* Round to nearest (ties to even under the default FP mode): one instruction. */
static inline int rnd(float x) {
    return (int)lrintf(x);
}

/* The value of largest magnitude, with its sign (ggml scales symmetric blocks so
 * that this value lands on the fuller negative end of the integer range). */
static inline float signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > amax) {
            amax = a;
            max = x[i];
        }
    }
    return max;
}

/* Symmetric sub-block scales: sub[s] maps sub-block s's value of largest magnitude (of
 * n_sub sub-blocks of len values) to `level` (negative: the fuller end of a signed range).
 * Returns the scale of largest magnitude, with its sign. */
static float signed_sub_scales(const float *x, int n_sub, int len, float level, float *sub) {
    float max_scale = 0.0f;
    for (int s = 0; s < n_sub; s++) {
        sub[s] = signed_absmax(x + len * s, len) / level;
        if (fabsf(sub[s]) > fabsf(max_scale)) max_scale = sub[s];
    }
    return max_scale;
}

static inline void minmax(const float *x, int n, float *mn, float *mx) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    *mn = lo;
    *mx = hi;
}

/* ---- F32 / F16 / BF16 ----------------------------------------------------- */

static void f32_to_f32(const void *src, float *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * 4);
}
static void f32_from_f32(const float *src, void *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * 4);
}

TPI_CPU_CLONES static void f16_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = f16_lanes(s[i]);
}
static void f16_from_f32(const float *src, void *dst, int64_t n) {
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++)
        d[i] = tpi_f32_to_f16(src[i]);
}
TPI_CPU_CLONES static void bf16_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++) { /* tpi_bf16_to_f32, here so that the loop vectorizes */
        const uint32_t bits = (uint32_t)s[i] << 16;
        memcpy(&dst[i], &bits, 4);
    }
}
static void bf16_from_f32(const float *src, void *dst, int64_t n) {
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++)
        d[i] = tpi_f32_to_bf16(src[i]);
}

/* ---- Q8_0: x = d * q ------------------------------------------------------ */

TPI_CPU_CLONES static void q8_0_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    const struct block_q8_0 *b = src;
    for (int64_t i = 0; i < n / QK8_0; i++, dst += QK8_0) {
        float d = f16(b[i].d);
        for (int j = 0; j < QK8_0; j++)
            dst[j] = d * (float)b[i].qs[j];
    }
}
static void q8_0_from_f32(const float *src, void *dst, int64_t n) {
    struct block_q8_0 *b = dst;
    for (int64_t i = 0; i < n / QK8_0; i++, src += QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++)
            amax = fmaxf(amax, fabsf(src[j]));
        float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        b[i].d = tpi_f32_to_f16(d);
        for (int j = 0; j < QK8_0; j++)
            b[i].qs[j] = (int8_t)clampi(rnd(src[j] * id), -127, 127);
    }
}

#ifndef TPI_CPU_AVX2
#define AVX2_FIRST(fn) ((void)0)
#endif

/* ---- 32-value nibble blocks (Q4_0, Q4_1, Q5_0, Q5_1): the AVX2 form -----------
 * ggml's order: value j < 16 is the low nibble of byte j, value j + 16 its high
 * nibble; Q5's fifth bit of value j is bit j of qh. The baseline bodies below loop
 * over values; GCC's AVX2 code for those loops is 3-7x slower than this form
 * (bench/dequant_bench.c): eight values at a time taken out of 32-bit words in
 * 32-bit lanes, each lane shifting its word by its own count (GCC's vector
 * extensions: vpsrlvd), then converted and scaled as one vector. Without AVX2
 * those shifts are emulated (4x slower than the loops), hence the two bodies. The
 * values, and so the floats, are the same either way. */
#ifdef TPI_CPU_AVX2
/* The first statement of a baseline body that has an AVX2 form: that form, where the
 * CPU has AVX2. */
#define AVX2_FIRST(fn)                                                                         \
    do {                                                                                       \
        if (tpi_cpu_avx2()) {                                                                  \
            fn##_avx2(src, dst, n);                                                            \
            return;                                                                            \
        }                                                                                      \
    } while (0)

typedef uint32_t u32x8 __attribute__((vector_size(32)));
typedef int32_t i32x8 __attribute__((vector_size(32)));
typedef float f32x8 __attribute__((vector_size(32)));

/* Values 8g..8g+7 (g < 4) of a block whose quant bytes are the words w[4] and whose
 * fifth bits are qh (0 for Q4), into *q: lane l is byte 8g + l's nibble (low for
 * g < 2). (Vectors pass by pointer: by value they would change the ABI between the
 * clones.) */
static inline void nibbles8(const uint32_t w[4], uint32_t qh, int g, i32x8 *q) {
    const u32x8 byte_shift = {0, 8, 16, 24, 0, 8, 16, 24};
    const u32x8 lane = {0, 1, 2, 3, 4, 5, 6, 7};
    const uint32_t lo = w[2 * (g & 1)], hi = w[2 * (g & 1) + 1];
    const u32x8 words = {lo, lo, lo, lo, hi, hi, hi, hi};
    const u32x8 nib = (words >> (byte_shift + 4u * (uint32_t)(g >> 1))) & 0xFu;
    const u32x8 fifth = ((qh >> (lane + 8u * (uint32_t)g)) & 1u) << 4;
    *q = (i32x8)(nib | fifth);
}

/* dst[j] = d * (float)(q_j - off) over a block's 32 values (Q4_0, Q5_0). */
static inline void nibbles32_sym(const uint8_t *qs, uint32_t qh, int off, float d, float *dst) {
    uint32_t w[4];
    memcpy(w, qs, 16); /* little-endian: byte k is bits 8(k % 4).. of w[k / 4] */
    for (int g = 0; g < 4; g++) {
        i32x8 q;
        nibbles8(w, qh, g, &q);
        const f32x8 f = __builtin_convertvector(q - off, f32x8) * d;
        memcpy(dst + 8 * g, &f, sizeof f);
    }
}

/* dst[j] = d * (float)q_j + m over a block's 32 values (Q4_1, Q5_1). */
static inline void nibbles32_affine(const uint8_t *qs, uint32_t qh, float d, float m, float *dst) {
    uint32_t w[4];
    memcpy(w, qs, 16);
    for (int g = 0; g < 4; g++) {
        i32x8 q;
        nibbles8(w, qh, g, &q);
        const f32x8 f = __builtin_convertvector(q, f32x8) * d + m;
        memcpy(dst + 8 * g, &f, sizeof f);
    }
}
#endif

/* ---- Q4_0: x = d * (q - 8) ------------------------------------------------ */

#ifdef TPI_CPU_AVX2
TPI_CPU_AVX2 static void q4_0_to_f32_avx2(const void *restrict src, float *restrict dst,
                                          int64_t n) {
    const struct block_q4_0 *b = src;
    for (int64_t i = 0; i < n / QK4_0; i++, dst += QK4_0) {
        const float d = f16_lanes(b[i].d);
        nibbles32_sym(b[i].qs, 0, 8, d, dst);
    }
}
#endif
static void q4_0_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    AVX2_FIRST(q4_0_to_f32);
    const struct block_q4_0 *b = src;
    for (int64_t i = 0; i < n / QK4_0; i++, dst += QK4_0) {
        float d = f16(b[i].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            dst[j] = d * (float)((b[i].qs[j] & 0x0F) - 8);
            dst[j + QK4_0 / 2] = d * (float)((b[i].qs[j] >> 4) - 8);
        }
    }
}
static void q4_0_from_f32(const float *src, void *dst, int64_t n) {
    struct block_q4_0 *b = dst;
    for (int64_t i = 0; i < n / QK4_0; i++, src += QK4_0) {
        float d = signed_absmax(src, QK4_0) / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = tpi_f32_to_f16(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            int q0 = clampi(rnd(src[j] * id) + 8, 0, 15);
            int q1 = clampi(rnd(src[j + QK4_0 / 2] * id) + 8, 0, 15);
            b[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

/* ---- Q4_1: x = d * q + m -------------------------------------------------- */

#ifdef TPI_CPU_AVX2
TPI_CPU_AVX2 static void q4_1_to_f32_avx2(const void *restrict src, float *restrict dst,
                                          int64_t n) {
    const struct block_q4_1 *b = src;
    for (int64_t i = 0; i < n / QK4_1; i++, dst += QK4_1) {
        const float d = f16_lanes(b[i].d), m = f16_lanes(b[i].m);
        nibbles32_affine(b[i].qs, 0, d, m, dst);
    }
}
#endif
static void q4_1_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    AVX2_FIRST(q4_1_to_f32);
    const struct block_q4_1 *b = src;
    for (int64_t i = 0; i < n / QK4_1; i++, dst += QK4_1) {
        float d = f16(b[i].d), m = f16(b[i].m);
        for (int j = 0; j < QK4_1 / 2; j++) {
            dst[j] = d * (float)(b[i].qs[j] & 0x0F) + m;
            dst[j + QK4_1 / 2] = d * (float)(b[i].qs[j] >> 4) + m;
        }
    }
}
static void q4_1_from_f32(const float *src, void *dst, int64_t n) {
    struct block_q4_1 *b = dst;
    for (int64_t i = 0; i < n / QK4_1; i++, src += QK4_1) {
        float mn, mx;
        minmax(src, QK4_1, &mn, &mx);
        float d = (mx - mn) / 15.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        b[i].d = tpi_f32_to_f16(d);
        b[i].m = tpi_f32_to_f16(mn);
        for (int j = 0; j < QK4_1 / 2; j++) {
            int q0 = clampi(rnd((src[j] - mn) * id), 0, 15);
            int q1 = clampi(rnd((src[j + QK4_1 / 2] - mn) * id), 0, 15);
            b[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

/* ---- Q5_0: x = d * (q - 16), 5th bits in qh ------------------------------- */

static inline uint32_t load_u32le(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline void store_u32le(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

#ifdef TPI_CPU_AVX2
TPI_CPU_AVX2 static void q5_0_to_f32_avx2(const void *restrict src, float *restrict dst,
                                          int64_t n) {
    const struct block_q5_0 *b = src;
    for (int64_t i = 0; i < n / QK5_0; i++, dst += QK5_0) {
        const float d = f16_lanes(b[i].d);
        nibbles32_sym(b[i].qs, load_u32le(b[i].qh), 16, d, dst);
    }
}
#endif
static void q5_0_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    AVX2_FIRST(q5_0_to_f32);
    const struct block_q5_0 *b = src;
    for (int64_t i = 0; i < n / QK5_0; i++, dst += QK5_0) {
        float d = f16(b[i].d);
        uint32_t qh = load_u32le(b[i].qh);
        int8_t hb[QK5_0]; // the fifth bits as 0 or 16, unpacked first: the loop below vectorizes
        for (int j = 0; j < QK5_0; j++) hb[j] = (int8_t)(((qh >> j) & 1u) << 4);
        for (int j = 0; j < QK5_0 / 2; j++) {
            dst[j] = d * (float)(((b[i].qs[j] & 0x0F) | hb[j]) - 16);
            dst[j + QK5_0 / 2] = d * (float)(((b[i].qs[j] >> 4) | hb[j + QK5_0 / 2]) - 16);
        }
    }
}
static void q5_0_from_f32(const float *src, void *dst, int64_t n) {
    struct block_q5_0 *b = dst;
    for (int64_t i = 0; i < n / QK5_0; i++, src += QK5_0) {
        float d = signed_absmax(src, QK5_0) / -16.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = tpi_f32_to_f16(d);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_0 / 2; j++) {
            int q0 = clampi(rnd(src[j] * id) + 16, 0, 31);
            int q1 = clampi(rnd(src[j + QK5_0 / 2] * id) + 16, 0, 31);
            b[i].qs[j] = (uint8_t)((q0 & 0x0F) | ((q1 & 0x0F) << 4));
            qh |= (uint32_t)(q0 >> 4) << j | (uint32_t)(q1 >> 4) << (j + 16);
        }
        store_u32le(b[i].qh, qh);
    }
}

/* ---- Q5_1: x = d * q + m -------------------------------------------------- */

#ifdef TPI_CPU_AVX2
TPI_CPU_AVX2 static void q5_1_to_f32_avx2(const void *restrict src, float *restrict dst,
                                          int64_t n) {
    const struct block_q5_1 *b = src;
    for (int64_t i = 0; i < n / QK5_1; i++, dst += QK5_1) {
        const float d = f16_lanes(b[i].d), m = f16_lanes(b[i].m);
        nibbles32_affine(b[i].qs, load_u32le(b[i].qh), d, m, dst);
    }
}
#endif
static void q5_1_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    AVX2_FIRST(q5_1_to_f32);
    const struct block_q5_1 *b = src;
    for (int64_t i = 0; i < n / QK5_1; i++, dst += QK5_1) {
        float d = f16(b[i].d), m = f16(b[i].m);
        uint32_t qh = load_u32le(b[i].qh);
        for (int j = 0; j < QK5_1 / 2; j++) {
            int h0 = (int)((qh >> j) & 1u) << 4, h1 = (int)((qh >> (j + 16)) & 1u) << 4;
            dst[j] = d * (float)((b[i].qs[j] & 0x0F) | h0) + m;
            dst[j + QK5_1 / 2] = d * (float)((b[i].qs[j] >> 4) | h1) + m;
        }
    }
}
static void q5_1_from_f32(const float *src, void *dst, int64_t n) {
    struct block_q5_1 *b = dst;
    for (int64_t i = 0; i < n / QK5_1; i++, src += QK5_1) {
        float mn, mx;
        minmax(src, QK5_1, &mn, &mx);
        float d = (mx - mn) / 31.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        b[i].d = tpi_f32_to_f16(d);
        b[i].m = tpi_f32_to_f16(mn);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_1 / 2; j++) {
            int q0 = clampi(rnd((src[j] - mn) * id), 0, 31);
            int q1 = clampi(rnd((src[j + QK5_1 / 2] - mn) * id), 0, 31);
            b[i].qs[j] = (uint8_t)((q0 & 0x0F) | ((q1 & 0x0F) << 4));
            qh |= (uint32_t)(q0 >> 4) << j | (uint32_t)(q1 >> 4) << (j + 16);
        }
        store_u32le(b[i].qh, qh);
    }
}

/* ---- K-quant 6-bit scale/min packing (Q4_K, Q5_K) -------------------------
 * 12 bytes hold 8 (scale, min) pairs of 6 bits: pairs 0-3 use the low 6 bits
 * of bytes 0-3 (scales) and 4-7 (mins); pairs 4-7 keep their low 4 bits in the
 * nibbles of bytes 8-11 and their top 2 bits in the spare top bits of bytes 0-7. */

static inline void get_scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

static void pack_scale_min_k4(const int *ls, const int *lm, uint8_t *q) {
    memset(q, 0, K_SCALE_SIZE);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            q[j] = (uint8_t)ls[j];
            q[j + 4] = (uint8_t)lm[j];
        } else {
            q[j + 4] = (uint8_t)((ls[j] & 0x0F) | ((lm[j] & 0x0F) << 4));
            q[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            q[j] |= (uint8_t)((lm[j] >> 4) << 6);
        }
    }
}

/* Shared K-quant scale search for 8 sub-blocks of 32 with `nmax` levels:
 * per sub-block x ≈ scale*q - min (min >= 0, so ranges that lie above zero are
 * extended down to zero, as ggml does), then scales and mins quantized to 6 bits
 * against the super-block d/dmin. Fills L[256] with levels in [0, nmax]. */
static void quantize_k_subblocks(const float *x, int nmax, uint16_t *d_out, uint16_t *dmin_out,
                                 uint8_t *scales, uint8_t *L) {
    float sub_scale[8], sub_min[8], max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 8; j++) {
        float mn, mx;
        minmax(x + 32 * j, 32, &mn, &mx);
        if (mn > 0.0f) mn = 0.0f;
        sub_scale[j] = (mx - mn) / (float)nmax;
        sub_min[j] = -mn;
        max_scale = fmaxf(max_scale, sub_scale[j]);
        max_min = fmaxf(max_min, sub_min[j]);
    }
    float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
    float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
    int ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        ls[j] = clampi(rnd(inv_scale * sub_scale[j]), 0, 63);
        lm[j] = clampi(rnd(inv_min * sub_min[j]), 0, 63);
    }
    pack_scale_min_k4(ls, lm, scales);
    *d_out = tpi_f32_to_f16(max_scale / 63.0f);
    *dmin_out = tpi_f32_to_f16(max_min / 63.0f);
    /* Quantize against the scales as stored (f16 d times 6-bit factors), so
     * that the rounding of the scales does not bias the values. */
    float d = f16(*d_out), dmin = f16(*dmin_out);
    for (int j = 0; j < 8; j++) {
        float dl = d * (float)ls[j], ml = dmin * (float)lm[j];
        float idl = dl > 0.0f ? 1.0f / dl : 0.0f;
        for (int l = 0; l < 32; l++)
            L[32 * j + l] = (uint8_t)clampi(rnd((x[32 * j + l] + ml) * idl), 0, nmax);
    }
}

/* ---- Q4_K: x = d*sc*q - dmin*m per sub-block of 32 ------------------------ */

TPI_CPU_CLONES static void q4_k_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    const struct block_q4_k *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        float d = f16(b[i].d), dmin = f16(b[i].dmin);
        const uint8_t *q = b[i].qs;
        /* Each 64 elements share 32 bytes: low nibbles first, then high nibbles. */
        for (int j = 0; j < QK_K / 64; j++, q += 32) {
            int sc, m;
            get_scale_min_k4(2 * j, b[i].scales, &sc, &m);
            float d1 = d * (float)sc, m1 = dmin * (float)m;
            get_scale_min_k4(2 * j + 1, b[i].scales, &sc, &m);
            float d2 = d * (float)sc, m2 = dmin * (float)m;
            for (int l = 0; l < 32; l++)
                *dst++ = d1 * (float)(q[l] & 0x0F) - m1;
            for (int l = 0; l < 32; l++)
                *dst++ = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}
static void q4_k_from_f32(const float *src, void *dst, int64_t n) {
    struct block_q4_k *b = dst;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
        quantize_k_subblocks(src, 15, &b[i].d, &b[i].dmin, b[i].scales, L);
        for (int j = 0; j < QK_K / 64; j++)
            for (int l = 0; l < 32; l++)
                b[i].qs[32 * j + l] = (uint8_t)(L[64 * j + l] | (L[64 * j + 32 + l] << 4));
    }
}

/* ---- Q5_K: as Q4_K with a 5th bit per element in qh ----------------------- */

TPI_CPU_CLONES static void q5_k_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    const struct block_q5_k *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        float d = f16(b[i].d), dmin = f16(b[i].dmin);
        const uint8_t *ql = b[i].qs, *qh = b[i].qh;
        /* 64-element group j takes bits 2j (first 32) and 2j+1 (next 32) of qh[l]. */
        for (int j = 0; j < QK_K / 64; j++, ql += 32) {
            int sc, m;
            get_scale_min_k4(2 * j, b[i].scales, &sc, &m);
            float d1 = d * (float)sc, m1 = dmin * (float)m;
            get_scale_min_k4(2 * j + 1, b[i].scales, &sc, &m);
            float d2 = d * (float)sc, m2 = dmin * (float)m;
            uint8_t u1 = (uint8_t)(1u << (2 * j)), u2 = (uint8_t)(2u << (2 * j));
            for (int l = 0; l < 32; l++)
                *dst++ = d1 * (float)((ql[l] & 0x0F) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++)
                *dst++ = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        }
    }
}
static void q5_k_from_f32(const float *src, void *dst, int64_t n) {
    struct block_q5_k *b = dst;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
        quantize_k_subblocks(src, 31, &b[i].d, &b[i].dmin, b[i].scales, L);
        memset(b[i].qh, 0, sizeof b[i].qh);
        for (int j = 0; j < QK_K / 64; j++) {
            for (int l = 0; l < 32; l++) {
                int q1 = L[64 * j + l], q2 = L[64 * j + 32 + l];
                b[i].qs[32 * j + l] = (uint8_t)((q1 & 0x0F) | ((q2 & 0x0F) << 4));
                b[i].qh[l] |= (uint8_t)(((q1 >> 4) << (2 * j)) | ((q2 >> 4) << (2 * j + 1)));
            }
        }
    }
}

/* ---- Q2_K and Q3_K: 16 sub-blocks of 16, 2-bit levels in ggml's order -----
 * Per 128 elements, 32 bytes of qs: byte l holds the low 2 bits of elements l,
 * l+32, l+64 and l+96 (bits 0-1, 2-3, 4-5, 6-7). Sub-block s covers elements
 * 16s..16s+15. */

/* Level bits of element e (0..255) of a Q2_K/Q3_K block's qs. */
static inline int k2_bits(const uint8_t *qs, int e) {
    return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
}

static void k2_pack(const uint8_t *L, uint8_t *qs) {
    memset(qs, 0, QK_K / 4);
    for (int e = 0; e < QK_K; e++)
        qs[32 * (e / 128) + e % 32] |= (uint8_t)((L[e] & 3) << (2 * ((e % 128) / 32)));
}

/* Q2_K: x = d * (sc & 15) * q - dmin * (sc >> 4), q in 0..3. */
TPI_CPU_CLONES static void q2_k_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    const struct block_q2_k *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = f16(b[i].d), dmin = f16(b[i].dmin);
        /* sub-block s = 8h + 2j + k: bytes 32h + 16k.. of qs, shifted by 2j (k2_bits's
         * order, in loops of 16 bytes at one shift that the compiler vectorizes) */
        for (int s = 0; s < QK_K / 16; s++, dst += 16) {
            const uint8_t *q = b[i].qs + 32 * (s / 8) + 16 * (s % 2);
            const int shift = 2 * ((s % 8) / 2);
            const float dl = d * (float)(b[i].scales[s] & 0x0F);
            const float ml = dmin * (float)(b[i].scales[s] >> 4);
            for (int l = 0; l < 16; l++) dst[l] = dl * (float)((q[l] >> shift) & 3) - ml;
        }
    }
}
static void q2_k_from_f32(const float *src, void *dst, int64_t n) {
    struct block_q2_k *b = dst;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
        /* as quantize_k_subblocks, with 16 sub-blocks of 16 and 4-bit scales and mins */
        float sub_scale[16], sub_min[16], max_scale = 0.0f, max_min = 0.0f;
        for (int s = 0; s < 16; s++) {
            float mn, mx;
            minmax(src + 16 * s, 16, &mn, &mx);
            if (mn > 0.0f) mn = 0.0f;
            sub_scale[s] = (mx - mn) / 3.0f;
            sub_min[s] = -mn;
            max_scale = fmaxf(max_scale, sub_scale[s]);
            max_min = fmaxf(max_min, sub_min[s]);
        }
        b[i].d = tpi_f32_to_f16(max_scale / 15.0f);
        b[i].dmin = tpi_f32_to_f16(max_min / 15.0f);
        const float d = f16(b[i].d), dmin = f16(b[i].dmin);
        const float inv_scale = d > 0.0f ? 1.0f / d : 0.0f, inv_min = dmin > 0.0f ? 1.0f / dmin : 0.0f;
        for (int s = 0; s < 16; s++) {
            const int ls = clampi(rnd(inv_scale * sub_scale[s]), 0, 15);
            const int lm = clampi(rnd(inv_min * sub_min[s]), 0, 15);
            b[i].scales[s] = (uint8_t)(ls | (lm << 4));
            const float dl = d * (float)ls, ml = dmin * (float)lm;
            const float idl = dl > 0.0f ? 1.0f / dl : 0.0f;
            for (int l = 0; l < 16; l++)
                L[16 * s + l] = (uint8_t)clampi(rnd((src[16 * s + l] + ml) * idl), 0, 3);
        }
        k2_pack(L, b[i].qs);
    }
}

/* Q3_K's 6-bit scale s (0..15): low 4 bits in the nibbles of bytes 0-7 (s < 8: low
 * nibble of byte s; else high nibble of byte s-8), top 2 bits in bytes 8-11 (bits
 * 2(s/4) of byte 8 + s%4). Stored with an offset of 32. */
static inline int q3_k_scale(const uint8_t *sc, int s) {
    const int lo = s < 8 ? sc[s] & 0x0F : sc[s - 8] >> 4;
    const int hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

/* Q3_K: x = d * scale * q, q in -4..3 (the low 2 bits, minus 4 where hmask's bit is clear). */
TPI_CPU_CLONES static void q3_k_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    const struct block_q3_k *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = f16(b[i].d);
        for (int s = 0; s < QK_K / 16; s++, dst += 16) { /* as q2_k_to_f32, plus hmask's bit */
            const int k = 16 * (s % 2), shift = 2 * ((s % 8) / 2), bit = s / 2;
            const uint8_t *q = b[i].qs + 32 * (s / 8) + k, *hm = b[i].hmask + k;
            const float dl = d * (float)q3_k_scale(b[i].scales, s);
            for (int l = 0; l < 16; l++)
                dst[l] = dl * (float)(((q[l] >> shift) & 3) - (((hm[l] >> bit) & 1) ? 0 : 4));
        }
    }
}
static void q3_k_from_f32(const float *src, void *dst, int64_t n) {
    struct block_q3_k *b = dst;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
        /* as Q6_K: each sub-block's extreme value maps to -4, the signed scales to 6 bits
         * with the extreme scale at -32 */
        float sub_scale[16];
        const float max_scale = signed_sub_scales(src, 16, 16, -4.0f, sub_scale);
        const float iscale = max_scale != 0.0f ? -32.0f / max_scale : 0.0f;
        b[i].d = tpi_f32_to_f16(iscale != 0.0f ? 1.0f / iscale : 0.0f);
        const float d = f16(b[i].d);
        memset(b[i].scales, 0, sizeof b[i].scales);
        memset(b[i].hmask, 0, sizeof b[i].hmask);
        for (int s = 0; s < 16; s++) {
            const int sc = clampi(rnd(iscale * sub_scale[s]), -32, 31);
            const int v = sc + 32;
            if (s < 8)
                b[i].scales[s] |= (uint8_t)(v & 0x0F);
            else
                b[i].scales[s - 8] |= (uint8_t)((v & 0x0F) << 4);
            b[i].scales[8 + s % 4] |= (uint8_t)((v >> 4) << (2 * (s / 4)));
            const float dl = d * (float)sc, idl = dl != 0.0f ? 1.0f / dl : 0.0f;
            for (int l = 0; l < 16; l++) {
                const int e = 16 * s + l, q = clampi(rnd(src[e] * idl), -4, 3) + 4;
                if (q > 3) b[i].hmask[e % 32] |= (uint8_t)(1u << (e / 32));
                L[e] = (uint8_t)(q & 3);
            }
        }
        k2_pack(L, b[i].qs);
    }
}

/* ---- Q6_K: x = d * scale[s] * (q - 32), 16 sub-blocks of 16 ---------------
 * Per 128 elements: 64 bytes of ql (low nibbles of elements l and l+64 in
 * byte l, of l+32 and l+96 in byte l+32) and 32 bytes of qh (2 bits each of
 * elements l, l+32, l+64, l+96 in byte l). */

#ifdef TPI_CPU_AVX2
/* Bytes 8g..8g+7 of p as the lanes of *v (32-bit lanes, each its word shifted by
 * its own count, as nibbles8). */
static inline void bytes8(const uint8_t *p, int g, u32x8 *v) {
    const u32x8 byte_shift = {0, 8, 16, 24, 0, 8, 16, 24};
    uint32_t w[2];
    memcpy(w, p + 8 * g, 8);
    const u32x8 words = {w[0], w[0], w[0], w[0], w[1], w[1], w[1], w[1]};
    *v = (words >> byte_shift) & 0xFFu;
}

/* The baseline body's values, 8 of each of its four rows at a time (the same q and
 * the same products; 0.22 -> 0.16 ns a value, bench/dequant_bench.c). */
TPI_CPU_AVX2 static void q6_k_to_f32_avx2(const void *restrict src, float *restrict dst,
                                          int64_t n) {
    const struct block_q6_k *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = f16_lanes(b[i].d);
        const uint8_t *ql = b[i].ql, *qh = b[i].qh;
        const int8_t *sc = b[i].scales;
        for (int h = 0; h < QK_K / 128; h++, ql += 64, qh += 32, sc += 8, dst += 128) {
            for (int g = 0; g < 4; g++) { /* values l = 8g..8g+7 of each row of 32 */
                const int s = g / 2;
                const float d1 = d * (float)sc[s], d2 = d * (float)sc[s + 2];
                const float d3 = d * (float)sc[s + 4], d4 = d * (float)sc[s + 6];
                u32x8 lo, hi, top;
                bytes8(ql, g, &lo);
                bytes8(ql + 32, g, &hi);
                bytes8(qh, g, &top);
                const i32x8 q1 = (i32x8)((lo & 0x0Fu) | ((top & 3u) << 4)) - 32;
                const i32x8 q2 = (i32x8)((hi & 0x0Fu) | (((top >> 2) & 3u) << 4)) - 32;
                const i32x8 q3 = (i32x8)((lo >> 4) | (((top >> 4) & 3u) << 4)) - 32;
                const i32x8 q4 = (i32x8)((hi >> 4) | (((top >> 6) & 3u) << 4)) - 32;
                const f32x8 f1 = __builtin_convertvector(q1, f32x8) * d1;
                const f32x8 f2 = __builtin_convertvector(q2, f32x8) * d2;
                const f32x8 f3 = __builtin_convertvector(q3, f32x8) * d3;
                const f32x8 f4 = __builtin_convertvector(q4, f32x8) * d4;
                memcpy(dst + 8 * g, &f1, sizeof f1);
                memcpy(dst + 32 + 8 * g, &f2, sizeof f2);
                memcpy(dst + 64 + 8 * g, &f3, sizeof f3);
                memcpy(dst + 96 + 8 * g, &f4, sizeof f4);
            }
        }
    }
}
#endif
TPI_CPU_CLONES static void q6_k_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    AVX2_FIRST(q6_k_to_f32);
    const struct block_q6_k *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        float d = f16(b[i].d);
        const uint8_t *ql = b[i].ql, *qh = b[i].qh;
        const int8_t *sc = b[i].scales;
        for (int h = 0; h < QK_K / 128; h++, ql += 64, qh += 32, sc += 8, dst += 128) {
            for (int s = 0; s < 2; s++) { // 16 values per scale: a loop the compiler vectorizes
                const float d1 = d * (float)sc[s], d2 = d * (float)sc[s + 2];
                const float d3 = d * (float)sc[s + 4], d4 = d * (float)sc[s + 6];
                for (int l = 16 * s; l < 16 * s + 16; l++) {
                    int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
                    int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
                    int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                    int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                    dst[l] = d1 * (float)q1;
                    dst[l + 32] = d2 * (float)q2;
                    dst[l + 64] = d3 * (float)q3;
                    dst[l + 96] = d4 * (float)q4;
                }
            }
        }
    }
}
static void q6_k_from_f32(const float *src, void *dst, int64_t n) {
    struct block_q6_k *b = dst;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
        /* Sub-block scales map each sub-block's extreme value to -32; then the
         * (signed) scales are quantized to int8 with the extreme scale at -128. */
        float sub_scale[16];
        const float max_scale = signed_sub_scales(src, 16, 16, -32.0f, sub_scale);
        float iscale = max_scale != 0.0f ? -128.0f / max_scale : 0.0f;
        b[i].d = tpi_f32_to_f16(iscale != 0.0f ? 1.0f / iscale : 0.0f);
        float d = f16(b[i].d);
        for (int s = 0; s < 16; s++) {
            int sc = clampi(rnd(iscale * sub_scale[s]), -128, 127);
            b[i].scales[s] = (int8_t)sc;
            float dl = d * (float)sc, idl = dl != 0.0f ? 1.0f / dl : 0.0f;
            for (int l = 0; l < 16; l++)
                L[16 * s + l] = (uint8_t)(clampi(rnd(src[16 * s + l] * idl), -32, 31) + 32);
        }
        q6_k_pack(L, &b[i]);
    }
}

/* ---- IQ4_NL and IQ4_XS: 4-bit indices into ggml's non-linear table -------
 * x = d * kvalues[q] (IQ4_NL, blocks of 32) or (d * (ls - 32)) * kvalues[q] with a
 * 6-bit ls per sub-block of 32 (IQ4_XS, super-blocks of 256). */

static const int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                         1,    13,   25,  38,  53,  69,  89,  113};

static inline int iq4_xs_scale(const struct block_iq4_xs *b, int ib) {
    return ((b->scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((b->scales_h >> (2 * ib)) & 3) << 4);
}

/* The 32 table levels of one IQ4 block (IQ4_NL) or sub-block (IQ4_XS): element j from the
 * low nibble of qs[j], element j + 16 from the high one. */
static inline void iq4_levels(const uint8_t *qs, int8_t *lv) {
    for (int j = 0; j < 16; j++) {
        lv[j] = kvalues_iq4nl[qs[j] & 0xF];
        lv[j + 16] = kvalues_iq4nl[qs[j] >> 4];
    }
}

/* The 32 values of one IQ4 (sub-)block, scale * table level: the table times the scale
 * made once (the same product per value), then looked up. */
static inline void iq4_values(const uint8_t *qs, float scale, float *dst) {
    float v[16];
    for (int k = 0; k < 16; k++) v[k] = scale * (float)kvalues_iq4nl[k];
    for (int j = 0; j < 16; j++) {
        dst[j] = v[qs[j] & 0xF];
        dst[j + 16] = v[qs[j] >> 4];
    }
}

/* 32 values x ≈ d * kvalues[L]: the index of the nearest table value to each x / d. */
static void iq4_nearest(const float *x, float d, uint8_t *qs) {
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t L[32];
    for (int j = 0; j < 32; j++) {
        const float v = x[j] * id;
        int best = 0;
        for (int k = 1; k < 16; k++)
            if (fabsf(v - (float)kvalues_iq4nl[k]) < fabsf(v - (float)kvalues_iq4nl[best])) best = k;
        L[j] = (uint8_t)best;
    }
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
}

TPI_CPU_CLONES static void iq4_nl_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    const struct block_iq4_nl *b = src;
    for (int64_t i = 0; i < n / QK4_NL; i++, dst += QK4_NL) iq4_values(b[i].qs, f16(b[i].d), dst);
}
static void iq4_nl_from_f32(const float *src, void *dst, int64_t n) {
    struct block_iq4_nl *b = dst;
    for (int64_t i = 0; i < n / QK4_NL; i++, src += QK4_NL) {
        /* the extreme value lands on the table's -127 */
        b[i].d = tpi_f32_to_f16(signed_absmax(src, QK4_NL) / -127.0f);
        iq4_nearest(src, f16(b[i].d), b[i].qs);
    }
}

TPI_CPU_CLONES static void iq4_xs_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    const struct block_iq4_xs *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = f16(b[i].d);
        for (int ib = 0; ib < QK_K / 32; ib++, dst += 32)
            iq4_values(b[i].qs + 16 * ib, d * (float)(iq4_xs_scale(&b[i], ib) - 32), dst);
    }
}
static void iq4_xs_from_f32(const float *src, void *dst, int64_t n) {
    struct block_iq4_xs *b = dst;
    for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
        /* sub-block scales mapping each extreme to -127, then 6-bit (offset 32) against d
         * with the largest scale at -32 */
        float sub[8];
        const float max_scale = signed_sub_scales(src, 8, 32, -127.0f, sub);
        b[i].d = tpi_f32_to_f16(max_scale / -32.0f);
        const float d = f16(b[i].d), id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].scales_h = 0;
        memset(b[i].scales_l, 0, sizeof b[i].scales_l);
        for (int ib = 0; ib < 8; ib++) {
            const int ls = clampi(rnd(sub[ib] * id), -32, 31) + 32;
            b[i].scales_l[ib / 2] |= (uint8_t)((ls & 0xF) << (4 * (ib % 2)));
            b[i].scales_h |= (uint16_t)((ls >> 4) << (2 * ib));
            iq4_nearest(src + 32 * ib, d * (float)(ls - 32), b[i].qs + 16 * ib);
        }
    }
}

/* ---- Q3_K as Q6_K, exactly ------------------------------------------------
 * Q6_K stores x = d * scale[s] * (q - 32) with int8 scales over the same 16
 * sub-blocks of 16 and q - 32 in -32..31, so a Q3_K block (x = d * scale * q,
 * scale in -32..31, q in -4..3) is the Q6_K block with the same d, its scales
 * and q + 32: the same products of the same floats. */

static void q6_k_pack(const uint8_t *L, struct block_q6_k *b) {
    uint8_t *ql = b->ql, *qh = b->qh;
    for (int h = 0; h < QK_K / 128; h++, ql += 64, qh += 32) {
        const uint8_t *Lh = L + 128 * h;
        for (int l = 0; l < 32; l++) {
            int q1 = Lh[l], q2 = Lh[l + 32], q3 = Lh[l + 64], q4 = Lh[l + 96];
            ql[l] = (uint8_t)((q1 & 0x0F) | ((q3 & 0x0F) << 4));
            ql[l + 32] = (uint8_t)((q2 & 0x0F) | ((q4 & 0x0F) << 4));
            qh[l] = (uint8_t)((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
        }
    }
}

static void q3_k_as_q6_k(const void *src, void *dst, int64_t n_blocks) {
    const struct block_q3_k *a = src;
    struct block_q6_k *b = dst;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n_blocks; i++) {
        for (int s = 0; s < QK_K / 16; s++) b[i].scales[s] = (int8_t)q3_k_scale(a[i].scales, s);
        for (int e = 0; e < QK_K; e++)
            L[e] = (uint8_t)(k2_bits(a[i].qs, e) + ((a[i].hmask[e % 32] >> (e / 32)) & 1 ? 32 : 28));
        q6_k_pack(L, &b[i]);
        b[i].d = a[i].d;
    }
}

int quant_gpu_held_type(int type) {
    static int hold = -1; /* TPI_HOLD, read once (every caller reads the same value) */
    if (hold < 0) {
        const char *e = getenv("TPI_HOLD");
        hold = e && strcmp(e, "1") == 0;
    }
    return hold ? quant_held_form(type) : type;
}

int quant_held_form(int type) {
    switch (type) {
    case TPI_TYPE_Q3_K:
        return TPI_TYPE_Q6_K;
    case TPI_TYPE_IQ4_NL:
    case TPI_TYPE_IQ4_XS:
        return TPI_TYPE_Q8_0;
    default:
        return type;
    }
}

bool quant_held_is_exact(int type) {
    return type != TPI_TYPE_IQ4_XS;
}

int quant_convert_held(int type, const void *src, void *dst, int64_t n_elems, int64_t *bad) {
    const struct quant_traits *t = quant_traits(type);
    *bad = -1;
    if (!t || !t->supported || n_elems <= 0 || n_elems % t->blck_size != 0) return TPI_ERR_INVALID;
    switch (type) {
    case TPI_TYPE_Q3_K:
        q3_k_as_q6_k(src, dst, n_elems / QK_K);
        return TPI_OK;
    case TPI_TYPE_IQ4_NL: { /* the same d, the table's values as the int8 levels */
        const struct block_iq4_nl *a = src;
        struct block_q8_0 *b = dst;
        for (int64_t i = 0; i < n_elems / QK4_NL; i++) {
            b[i].d = a[i].d;
            iq4_levels(a[i].qs, b[i].qs);
        }
        return TPI_OK;
    }
    case TPI_TYPE_IQ4_XS: { /* a Q8_0 block a sub-block: d * (ls - 32) rounded to f16 */
        const struct block_iq4_xs *a = src;
        struct block_q8_0 *b = dst;
        for (int64_t i = 0; i < n_elems / QK_K; i++) {
            const float d = f16(a[i].d);
            for (int ib = 0; ib < 8; ib++) {
                struct block_q8_0 *o = &b[8 * i + ib];
                const float dl = d * (float)(iq4_xs_scale(&a[i], ib) - 32);
                if (!(fabsf(dl) <= 65504.0f)) {
                    *bad = i * QK_K + 32 * ib;
                    return TPI_ERR_UNSUPPORTED;
                }
                o->d = tpi_f32_to_f16(dl);
                iq4_levels(a[i].qs + 16 * ib, o->qs);
            }
        }
        return TPI_OK;
    }
    default:
        memcpy(dst, src, quant_row_size(type, n_elems));
        return TPI_OK;
    }
}

/* ---- the table ------------------------------------------------------------ */

#define SUPPORTED(nm, blck, bytes, base)                                                           \
    { nm, blck, bytes, true, base##_to_f32, base##_from_f32 }
#define NAMED(nm, blck, bytes)                                                                     \
    { nm, blck, bytes, false, NULL, NULL }

/* Indexed by ggml type id. Ids ggml retired (4, 5, 31-33, 36-38) stay empty
 * (name NULL) and read as unknown. Unsupported types keep their real block
 * geometry so a reader can still size and skip their data. */
static const struct quant_traits traits_table[TPI_TYPE_COUNT] = {
    [TPI_TYPE_F32] = SUPPORTED("F32", 1, 4, f32),
    [TPI_TYPE_F16] = SUPPORTED("F16", 1, 2, f16),
    [TPI_TYPE_Q4_0] = SUPPORTED("Q4_0", QK4_0, sizeof(struct block_q4_0), q4_0),
    [TPI_TYPE_Q4_1] = SUPPORTED("Q4_1", QK4_1, sizeof(struct block_q4_1), q4_1),
    [TPI_TYPE_Q5_0] = SUPPORTED("Q5_0", QK5_0, sizeof(struct block_q5_0), q5_0),
    [TPI_TYPE_Q5_1] = SUPPORTED("Q5_1", QK5_1, sizeof(struct block_q5_1), q5_1),
    [TPI_TYPE_Q8_0] = SUPPORTED("Q8_0", QK8_0, sizeof(struct block_q8_0), q8_0),
    [9] = NAMED("Q8_1", 32, 36),
    [TPI_TYPE_Q2_K] = SUPPORTED("Q2_K", QK_K, sizeof(struct block_q2_k), q2_k),
    [TPI_TYPE_Q3_K] = SUPPORTED("Q3_K", QK_K, sizeof(struct block_q3_k), q3_k),
    [TPI_TYPE_Q4_K] = SUPPORTED("Q4_K", QK_K, sizeof(struct block_q4_k), q4_k),
    [TPI_TYPE_Q5_K] = SUPPORTED("Q5_K", QK_K, sizeof(struct block_q5_k), q5_k),
    [TPI_TYPE_Q6_K] = SUPPORTED("Q6_K", QK_K, sizeof(struct block_q6_k), q6_k),
    [15] = NAMED("Q8_K", QK_K, 292),
    [16] = NAMED("IQ2_XXS", QK_K, 66),
    [17] = NAMED("IQ2_XS", QK_K, 74),
    [18] = NAMED("IQ3_XXS", QK_K, 98),
    [19] = NAMED("IQ1_S", QK_K, 50),
    [TPI_TYPE_IQ4_NL] = SUPPORTED("IQ4_NL", QK4_NL, sizeof(struct block_iq4_nl), iq4_nl),
    [21] = NAMED("IQ3_S", QK_K, 110),
    [22] = NAMED("IQ2_S", QK_K, 82),
    [TPI_TYPE_IQ4_XS] = SUPPORTED("IQ4_XS", QK_K, sizeof(struct block_iq4_xs), iq4_xs),
    [24] = NAMED("I8", 1, 1),
    [25] = NAMED("I16", 1, 2),
    [26] = NAMED("I32", 1, 4),
    [27] = NAMED("I64", 1, 8),
    [28] = NAMED("F64", 1, 8),
    [29] = NAMED("IQ1_M", QK_K, 56),
    [TPI_TYPE_BF16] = SUPPORTED("BF16", 1, 2, bf16),
    [34] = NAMED("TQ1_0", QK_K, 54),
    [35] = NAMED("TQ2_0", QK_K, 66),
    [39] = NAMED("MXFP4", 32, 17),
};

const struct quant_traits *quant_traits(int type) {
    if (type < 0 || type >= TPI_TYPE_COUNT || traits_table[type].name == NULL) return NULL;
    return &traits_table[type];
}

const char *quant_type_name(int type) {
    const struct quant_traits *t = quant_traits(type);
    if (t) return t->name;
    /* A few rotating thread-local buffers, so that two unknown names can appear
     * in one printf and threads do not overwrite each other. */
    static _Thread_local char bufs[4][24];
    static _Thread_local int next;
    char *buf = bufs[next++ & 3];
    snprintf(buf, sizeof bufs[0], "type%d", type);
    return buf;
}

int quant_type_from_name(const char *name) {
    if (!name) return -1;
    for (int i = 0; i < TPI_TYPE_COUNT; i++) {
        const char *nm = traits_table[i].name;
        if (!nm) continue;
        size_t k = 0;
        while (nm[k] && name[k] && toupper((unsigned char)name[k]) == (unsigned char)nm[k])
            k++;
        if (nm[k] == '\0' && name[k] == '\0') return i;
    }
    return -1;
}

size_t quant_row_size(int type, int64_t n_elems) {
    const struct quant_traits *t = quant_traits(type);
    if (!t || n_elems < 0 || n_elems % t->blck_size != 0) return 0;
    return (size_t)(n_elems / t->blck_size) * t->type_size;
}

int quant_dequant_rows(int type, const void *data, int64_t ne0, int64_t row0, int64_t n_rows,
                       float *dst, struct tpi_error *err) {
    const struct quant_traits *t = quant_traits(type);
    if (!t) return tpi_err(err, TPI_ERR_UNSUPPORTED, "dequantize: unknown tensor type id %d", type);
    if (!t->supported || !t->to_f32)
        return tpi_err(err, TPI_ERR_UNSUPPORTED, "dequantize: type %s is not supported", t->name);
    if (ne0 <= 0 || ne0 % t->blck_size != 0 || row0 < 0 || n_rows < 0)
        return tpi_err(err, TPI_ERR_INVALID,
                       "dequantize %s: bad shape (ne0 %lld, block %d, rows [%lld, +%lld))", t->name,
                       (long long)ne0, t->blck_size, (long long)row0, (long long)n_rows);
    size_t row_bytes = quant_row_size(type, ne0);
    const uint8_t *src = (const uint8_t *)data + (size_t)row0 * row_bytes;
    for (int64_t r = 0; r < n_rows; r++)
        t->to_f32(src + (size_t)r * row_bytes, dst + r * ne0, ne0);
    return TPI_OK;
}

int quant_extract_cols(int type, const void *data, int64_t ne0, int64_t ne1, int64_t col0,
                       int64_t n_cols, void *dst, struct tpi_error *err) {
    const struct quant_traits *t = quant_traits(type);
    if (!t)
        return tpi_err(err, TPI_ERR_UNSUPPORTED, "extract columns: unknown tensor type id %d",
                       type);
    int64_t bs = t->blck_size;
    if (ne0 <= 0 || ne1 < 0 || ne0 % bs != 0)
        return tpi_err(err, TPI_ERR_INVALID,
                       "extract columns %s: bad shape %lld x %lld (block %lld)", t->name,
                       (long long)ne0, (long long)ne1, (long long)bs);
    if (col0 < 0 || n_cols <= 0 || col0 + n_cols > ne0)
        return tpi_err(err, TPI_ERR_INVALID,
                       "extract columns %s: range [%lld, %lld) outside a row of %lld", t->name,
                       (long long)col0, (long long)(col0 + n_cols), (long long)ne0);
    if (col0 % bs != 0 || n_cols % bs != 0)
        return tpi_err(err, TPI_ERR_INVALID,
                       "extract columns %s: range [%lld, %lld) is not on %lld-element block edges",
                       t->name, (long long)col0, (long long)(col0 + n_cols), (long long)bs);
    size_t row_bytes = quant_row_size(type, ne0);
    size_t off = (size_t)(col0 / bs) * t->type_size, n_bytes = (size_t)(n_cols / bs) * t->type_size;
    const uint8_t *src = data;
    uint8_t *out = dst;
    for (int64_t r = 0; r < ne1; r++)
        memcpy(out + (size_t)r * n_bytes, src + (size_t)r * row_bytes + off, n_bytes);
    return TPI_OK;
}
