/*
 * test_quant.c — the tensor-type traits table (engine/kernels/quant.c).
 *
 * 1. Hand-built blocks of every type, laid out byte by byte from ggml's format
 *    definitions, dequantize to the values the definition gives (plus a few
 *    values worked out by hand as literals); every f16/bf16 pattern, and random
 *    bytes as 32-value, Q6_K, Q2_K, Q3_K, IQ4_NL and IQ4_XS blocks, bitwise against the
 *    definitions one value at a time, and the forms the CUDA backend holds them in
 *    (quant_convert_held) against them.
 * 2. quantize -> dequantize round trips on random data stay within per-type
 *    bounds (stated at each check).
 * 3. quant_extract_cols equals slicing the dequantized matrix; misaligned or
 *    out-of-range ranges are errors; unknown and unsupported ids.
 * 4. Tensors of the reference GGUF files (written by llama.cpp's tools) match
 *    the first values, sums and sums of squares in NAME.tensors.json, reading
 *    the bytes at the offsets the JSON gives (no GGUF reader needed).
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/quant.h"
#include "testutil.h"
#include "tpi.h"

/* f16 bit patterns used below */
#define H_1_0 0x3C00  /* 1.0 */
#define H_0_5 0x3800  /* 0.5 */
#define H_0_25 0x3400 /* 0.25 */
#define H_2_0 0x4000  /* 2.0 */
#define H_M1_0 0xBC00 /* -1.0 */

static void put_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void dequant_one(int type, const void *blk, float *out, int n) {
    const struct quant_traits *t = quant_traits(type);
    ck_assert_ptr_nonnull(t);
    ck_assert(t->supported);
    t->to_f32(blk, out, n);
}

static void expect_values(const char *label, const float *got, const float *want, int n) {
    ck_assert_msg(tu_compare(label, got, want, (size_t)n, 0.0, 0.0) == 0, "%s: values differ",
                  label);
}

/* ---- 1. hand-built blocks ------------------------------------------------ */

START_TEST(test_block_q8_0) {
    uint8_t b[34];
    put_u16(b, H_0_5);
    for (int j = 0; j < 32; j++)
        b[2 + j] = (uint8_t)(int8_t)(j - 16);
    float got[32], want[32];
    for (int j = 0; j < 32; j++)
        want[j] = 0.5f * (float)(j - 16);
    dequant_one(TPI_TYPE_Q8_0, b, got, 32);
    expect_values("Q8_0", got, want, 32);
    ck_assert_float_eq(got[0], -8.0f);
    ck_assert_float_eq(got[31], 7.5f);
}
END_TEST

START_TEST(test_block_q4_0) {
    /* element j<16: low nibble of qs[j]; j>=16: high nibble of qs[j-16]; x = d*(q-8) */
    uint8_t b[18];
    put_u16(b, H_2_0);
    for (int j = 0; j < 16; j++)
        b[2 + j] = (uint8_t)(j | ((15 - j) << 4));
    float got[32], want[32];
    for (int j = 0; j < 16; j++) {
        want[j] = 2.0f * (float)(j - 8);
        want[j + 16] = 2.0f * (float)((15 - j) - 8);
    }
    dequant_one(TPI_TYPE_Q4_0, b, got, 32);
    expect_values("Q4_0", got, want, 32);
    ck_assert_float_eq(got[0], -16.0f); /* q=0 */
    ck_assert_float_eq(got[16], 14.0f); /* q=15 */
}
END_TEST

START_TEST(test_block_q4_1) {
    uint8_t b[20];
    put_u16(b, H_0_25);
    put_u16(b + 2, H_M1_0);
    for (int j = 0; j < 16; j++)
        b[4 + j] = (uint8_t)(j | (((j + 1) & 15) << 4));
    float got[32], want[32];
    for (int j = 0; j < 16; j++) {
        want[j] = 0.25f * (float)j - 1.0f;
        want[j + 16] = 0.25f * (float)((j + 1) & 15) - 1.0f;
    }
    dequant_one(TPI_TYPE_Q4_1, b, got, 32);
    expect_values("Q4_1", got, want, 32);
    ck_assert_float_eq(got[15], 2.75f);
}
END_TEST

/* Q5_0 / Q5_1: qh is a little-endian u32 whose bit e is the 5th bit of element e. */
static void build_q5(uint8_t *qh, uint8_t *qs, uint32_t bits) {
    qh[0] = (uint8_t)bits;
    qh[1] = (uint8_t)(bits >> 8);
    qh[2] = (uint8_t)(bits >> 16);
    qh[3] = (uint8_t)(bits >> 24);
    for (int j = 0; j < 16; j++)
        qs[j] = (uint8_t)(j | ((15 - j) << 4));
}
static int q5_level(uint32_t bits, int e) {
    int lo = e < 16 ? e : 15 - (e - 16);
    return lo | (int)((bits >> e) & 1u) << 4;
}

START_TEST(test_block_q5_0) {
    const uint32_t bits = 0xA5C3F00Fu;
    uint8_t b[22];
    put_u16(b, H_1_0);
    build_q5(b + 2, b + 6, bits);
    float got[32], want[32];
    for (int e = 0; e < 32; e++)
        want[e] = (float)(q5_level(bits, e) - 16);
    dequant_one(TPI_TYPE_Q5_0, b, got, 32);
    expect_values("Q5_0", got, want, 32);
    /* by hand: e=0: low 0, bit0=1 -> 16-16 = 0; e=31: low 0, bit31=1 -> 0; e=4: 4 | 0 -> -12 */
    ck_assert_float_eq(got[0], 0.0f);
    ck_assert_float_eq(got[4], -12.0f);
    ck_assert_float_eq(got[31], 0.0f);
}
END_TEST

START_TEST(test_block_q5_1) {
    const uint32_t bits = 0x0F0F3C3Cu;
    uint8_t b[24];
    put_u16(b, H_0_5);
    put_u16(b + 2, H_M1_0);
    build_q5(b + 4, b + 8, bits);
    float got[32], want[32];
    for (int e = 0; e < 32; e++)
        want[e] = 0.5f * (float)q5_level(bits, e) - 1.0f;
    dequant_one(TPI_TYPE_Q5_1, b, got, 32);
    expect_values("Q5_1", got, want, 32);
    ck_assert_float_eq(got[2], 8.0f); /* low 2, bit2 = 1 -> 18*0.5-1 */
}
END_TEST

/* The 12-byte 6-bit scale/min packing of Q4_K/Q5_K, from its definition. */
static void pack_k_scales(uint8_t *q, const int *sc, const int *m) {
    for (int j = 0; j < 4; j++) {
        q[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        q[j + 4] = (uint8_t)(m[j] | ((m[j + 4] >> 4) << 6));
        q[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
    }
}
static const int k_sc[8] = {1, 2, 3, 63, 17, 33, 48, 5};
static const int k_m[8] = {0, 1, 62, 3, 20, 40, 7, 63};

/* 4-bit level of element e of a Q4_K/Q5_K block: 64-element group g uses 32
 * bytes, low nibbles for its first 32 elements, high nibbles for the rest. */
static int k_nibble(const uint8_t *qs, int e) {
    int g = e / 64, w = e % 64;
    uint8_t byte = qs[32 * g + (w % 32)];
    return w < 32 ? (byte & 15) : (byte >> 4);
}

START_TEST(test_block_q4_k) {
    uint8_t b[144];
    put_u16(b, H_1_0);     /* d */
    put_u16(b + 2, H_0_5); /* dmin */
    pack_k_scales(b + 4, k_sc, k_m);
    for (int i = 0; i < 128; i++)
        b[16 + i] = (uint8_t)(i * 37 + 11);
    float got[256], want[256];
    for (int e = 0; e < 256; e++)
        want[e] =
            1.0f * (float)k_sc[e / 32] * (float)k_nibble(b + 16, e) - 0.5f * (float)k_m[e / 32];
    dequant_one(TPI_TYPE_Q4_K, b, got, 256);
    expect_values("Q4_K", got, want, 256);
    /* by hand: e=0: byte 11 -> nibble 11, sc 1, m 0 -> 11.
     * e=255: byte 127 = (127*37+11)&255 = 102 = 0x66 -> high nibble 6, sc 5, m 63 -> 30 - 31.5 */
    ck_assert_float_eq(got[0], 11.0f);
    ck_assert_float_eq(got[255], -1.5f);
    /* e=160: group 2, w=32 -> byte 64 = (64*37+11)&255 = 75 = 0x4B, high nibble 4; sub-block 5: sc
     * 33, m 40 */
    ck_assert_float_eq(got[160], 33.0f * 4.0f - 20.0f);
}
END_TEST

START_TEST(test_block_q5_k) {
    uint8_t b[176];
    put_u16(b, H_0_25);
    put_u16(b + 2, H_1_0);
    pack_k_scales(b + 4, k_sc, k_m);
    uint8_t *qh = b + 16, *qs = b + 48;
    for (int i = 0; i < 32; i++)
        qh[i] = (uint8_t)(i * 73 + 5);
    for (int i = 0; i < 128; i++)
        qs[i] = (uint8_t)(i * 29 + 3);
    float got[256], want[256];
    for (int e = 0; e < 256; e++) {
        int g = e / 64, w = e % 64;
        int hi = (qh[w % 32] >> (2 * g + (w >= 32))) & 1;
        int q = k_nibble(qs, e) | hi << 4;
        want[e] = 0.25f * (float)k_sc[e / 32] * (float)q - 1.0f * (float)k_m[e / 32];
    }
    dequant_one(TPI_TYPE_Q5_K, b, got, 256);
    expect_values("Q5_K", got, want, 256);
    /* by hand: e=0: qs[0]=3 low nibble 3, qh[0]=5 bit0=1 -> q=19; sc 1, m 0 -> 0.25*19 */
    ck_assert_float_eq(got[0], 4.75f);
}
END_TEST

START_TEST(test_block_q6_k) {
    uint8_t b[210];
    uint8_t *ql = b, *qh = b + 128;
    int8_t *sc = (int8_t *)(b + 192);
    for (int i = 0; i < 128; i++)
        ql[i] = (uint8_t)(i * 3);
    for (int i = 0; i < 64; i++)
        qh[i] = (uint8_t)(i * 5);
    const int scales[16] = {-128, 127, 1, -1, 2, 64, -64, 3, 100, -100, 7, 0, 9, 10, -11, 12};
    for (int s = 0; s < 16; s++)
        sc[s] = (int8_t)scales[s];
    put_u16(b + 208, H_0_25); /* d is last */
    float got[256], want[256];
    for (int e = 0; e < 256; e++) {
        /* per 128: quarter k of 32 elements; ql byte l (k=0,2) or l+32 (k=1,3),
         * low nibble for k<2, high for k>=2; qh byte l holds 2 bits per quarter */
        int h = e / 128, w = e % 128, l = w % 32, k = w / 32;
        uint8_t lb = ql[64 * h + l + (k & 1) * 32];
        int lo = k < 2 ? (lb & 15) : (lb >> 4);
        int hi = (qh[32 * h + l] >> (2 * k)) & 3;
        want[e] = 0.25f * (float)scales[e / 16] * (float)((lo | hi << 4) - 32);
    }
    dequant_one(TPI_TYPE_Q6_K, b, got, 256);
    expect_values("Q6_K", got, want, 256);
    /* by hand: e=0: ql 0, qh 0 -> q=-32, scale -128 -> 0.25*-128*-32 = 1024 */
    ck_assert_float_eq(got[0], 1024.0f);
}
END_TEST

START_TEST(test_block_float_types) {
    uint16_t h[4] = {0x3C00, 0xC000, 0x7BFF, 0x0001};
    float got[4], want[4] = {1.0f, -2.0f, 65504.0f, 5.9604645e-8f};
    dequant_one(TPI_TYPE_F16, h, got, 4);
    expect_values("F16", got, want, 4);
    uint16_t bf[3] = {0x3F80, 0xC0A0, 0x4049};
    float bwant[3] = {1.0f, -5.0f, 3.140625f};
    dequant_one(TPI_TYPE_BF16, bf, got, 3);
    expect_values("BF16", got, bwant, 3);
    float f[2] = {1.5f, -0.25f};
    dequant_one(TPI_TYPE_F32, f, got, 2);
    expect_values("F32", got, f, 2);
}
END_TEST

/* Every f16 and bf16 bit pattern (NaNs with their payloads, subnormals, -0) gives the
 * bits of tpi_f16_to_f32 / tpi_bf16_to_f32: the tensor loops have forms of their own
 * that vectorize. */
START_TEST(test_float_types_all_patterns) {
    uint16_t *h = malloc(sizeof *h * 65536);
    float *got = malloc(sizeof *got * 65536);
    ck_assert(h && got);
    for (int i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    dequant_one(TPI_TYPE_F16, h, got, 65536);
    for (int i = 0; i < 65536; i++) {
        const float want = tpi_f16_to_f32(h[i]);
        ck_assert_msg(!memcmp(&got[i], &want, 4), "F16 0x%04x: got %a, want %a", i,
                      (double)got[i], (double)want);
    }
    dequant_one(TPI_TYPE_BF16, h, got, 65536);
    for (int i = 0; i < 65536; i++) {
        const float want = tpi_bf16_to_f32(h[i]);
        ck_assert_msg(!memcmp(&got[i], &want, 4), "BF16 0x%04x: got %a, want %a", i,
                      (double)got[i], (double)want);
    }
    free(h);
    free(got);
}
END_TEST

/* Random bytes as Q4_0, Q4_1, Q5_0 and Q5_1 blocks (scales any finite f16, subnormal
 * and negative ones too) give bitwise the values of the format's definition computed
 * one at a time: the loops of quant.c take 8 values at a time where the CPU has AVX2. */
START_TEST(test_nibble_blocks_random) {
    const int types[] = {TPI_TYPE_Q4_0, TPI_TYPE_Q4_1, TPI_TYPE_Q5_0, TPI_TYPE_Q5_1};
    enum { NB = 1000 };
    struct tu_rng r;
    tu_rng_seed(&r, 2026);
    for (int t = 0; t < 4; t++) {
        const int type = types[t];
        const struct quant_traits *tr = quant_traits(type);
        const size_t bb = tr->type_size;
        const bool five = type == TPI_TYPE_Q5_0 || type == TPI_TYPE_Q5_1;
        const bool affine = type == TPI_TYPE_Q4_1 || type == TPI_TYPE_Q5_1;
        uint8_t *q = malloc(bb * NB);
        float *got = malloc(sizeof *got * 32 * NB);
        ck_assert(q && got);
        for (size_t i = 0; i < bb * NB; i++)
            q[i] = (uint8_t)((int)tu_uniform(&r, 0.0f, 256.0f) & 255);
        for (int b = 0; b < NB; b++) /* scales (and mins): finite f16s */
            for (int k = 0; k < (affine ? 2 : 1); k++)
                if ((q[bb * b + 2 * k + 1] & 0x7C) == 0x7C) q[bb * b + 2 * k + 1] ^= 0x40;
        /* every block count from 1 to 9, then all */
        for (int nb = 1; nb <= NB; nb = nb < 9 ? nb + 1 : NB) {
            tr->to_f32(q, got, 32 * nb);
            for (int b = 0; b < nb; b++) {
                const uint8_t *blk = q + bb * b;
                const float d = tpi_f16_to_f32((uint16_t)(blk[0] | blk[1] << 8));
                const float m = affine ? tpi_f16_to_f32((uint16_t)(blk[2] | blk[3] << 8)) : 0;
                const uint8_t *qh = blk + (affine ? 4 : 2), *qs = qh + (five ? 4 : 0);
                const uint32_t bits = five ? (uint32_t)qh[0] | (uint32_t)qh[1] << 8 |
                                                 (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24
                                           : 0;
                for (int e = 0; e < 32; e++) {
                    const int lv = (e < 16 ? qs[e] & 15 : qs[e - 16] >> 4) |
                                   (int)((bits >> e) & 1u) << 4;
                    const float want = affine ? d * (float)lv + m
                                              : d * (float)(lv - (five ? 16 : 8));
                    const float g = got[32 * b + e];
                    ck_assert_msg(!memcmp(&g, &want, 4), "%s block %d of %d, value %d: %a, want %a",
                                  tr->name, b, nb, e, (double)g, (double)want);
                }
            }
            if (nb == NB) break;
        }
        free(q);
        free(got);
    }
}
END_TEST

/* Random bytes as Q6_K blocks (finite scales), bitwise against the definition one
 * value at a time, as above: x = (d * sc) * (q - 32), q's low 4 bits from ql and its
 * top 2 from qh. */
START_TEST(test_q6_k_blocks_random) {
    enum { NB = 300, BB = 210 };
    struct tu_rng r;
    tu_rng_seed(&r, 2027);
    uint8_t *q = malloc(BB * NB);
    float *got = malloc(sizeof *got * 256 * NB);
    ck_assert(q && got);
    for (size_t i = 0; i < (size_t)BB * NB; i++)
        q[i] = (uint8_t)((int)tu_uniform(&r, 0.0f, 256.0f) & 255);
    for (int b = 0; b < NB; b++) /* d, the last two bytes: a finite f16 */
        if ((q[BB * b + 209] & 0x7C) == 0x7C) q[BB * b + 209] ^= 0x40;
    for (int nb = 1; nb <= NB; nb = nb < 3 ? nb + 1 : NB) {
        quant_traits(TPI_TYPE_Q6_K)->to_f32(q, got, 256 * nb);
        for (int b = 0; b < nb; b++) {
            const uint8_t *ql = q + BB * b, *qh = ql + 128;
            const int8_t *sc = (const int8_t *)(ql + 192);
            const float d = tpi_f16_to_f32((uint16_t)(ql[208] | ql[209] << 8));
            for (int e = 0; e < 256; e++) {
                const int h = e / 128, row = e % 128 / 32, l = e % 32;
                const uint8_t lo = ql[64 * h + l + (row & 1) * 32];
                const int top = (qh[32 * h + l] >> (2 * row)) & 3;
                const int v = (row < 2 ? lo & 15 : lo >> 4) | top << 4;
                const float want = d * (float)sc[8 * h + l / 16 + 2 * row] * (float)(v - 32);
                const float g = got[256 * b + e];
                ck_assert_msg(!memcmp(&g, &want, 4), "Q6_K block %d of %d, value %d: %a, want %a",
                              b, nb, e, (double)g, (double)want);
            }
        }
        if (nb == NB) break;
    }
    free(q);
    free(got);
}
END_TEST

/* Q2_K and Q3_K as ggml's dequantize_row_q2_K / _q3_K loop over a block: per 128
 * elements (32 bytes of qs), four shifts of 2 bits, each two sub-blocks of 16
 * (bytes l and l + 16). Q3_K's hmask bit m (one per shift, across both halves) set
 * means the level as is, clear means minus 4; its 6-bit scales unpack as ggml's
 * kmask shuffle of the 12 bytes read as little-endian words. */
static void ref_q2_k(const uint8_t *b, float *y) {
    const uint8_t *sc = b, *q = b + 16;
    const float d = tpi_f16_to_f32((uint16_t)(b[80] | b[81] << 8));
    const float dmin = tpi_f16_to_f32((uint16_t)(b[82] | b[83] << 8));
    int is = 0;
    for (int n = 0; n < 256; n += 128, q += 32)
        for (int shift = 0; shift < 8; shift += 2)
            for (int half = 0; half < 2; half++, is++) {
                const float dl = d * (float)(sc[is] & 0xF), ml = dmin * (float)(sc[is] >> 4);
                for (int l = 0; l < 16; l++)
                    *y++ = dl * (float)((q[l + 16 * half] >> shift) & 3) - ml;
            }
}
static void ref_q3_k(const uint8_t *b, float *y) {
    const uint8_t *hm = b, *q = b + 32;
    uint32_t aux[4];
    memcpy(aux, b + 96, 12);
    const uint32_t k1 = 0x03030303u, k2 = 0x0f0f0f0fu, tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & k2) | (((tmp >> 4) & k1) << 4);
    aux[3] = ((aux[1] >> 4) & k2) | (((tmp >> 6) & k1) << 4);
    aux[0] = (aux[0] & k2) | (((tmp >> 0) & k1) << 4);
    aux[1] = (aux[1] & k2) | (((tmp >> 2) & k1) << 4);
    const int8_t *scales = (const int8_t *)aux; /* little-endian host, as ggml assumes */
    const float d = tpi_f16_to_f32((uint16_t)(b[108] | b[109] << 8));
    int is = 0;
    uint8_t m = 1;
    for (int n = 0; n < 256; n += 128, q += 32)
        for (int shift = 0; shift < 8; shift += 2, m = (uint8_t)(m << 1))
            for (int half = 0; half < 2; half++, is++) {
                const float dl = d * (float)(scales[is] - 32);
                for (int l = 0; l < 16; l++) {
                    const int k = l + 16 * half;
                    *y++ = dl * (float)(((q[k] >> shift) & 3) - ((hm[k] & m) ? 0 : 4));
                }
            }
}

START_TEST(test_block_q2_k) {
    uint8_t b[84];
    for (int i = 0; i < 16; i++) b[i] = (uint8_t)(i * 37 + 11); /* scale | min << 4 */
    for (int i = 0; i < 64; i++) b[16 + i] = (uint8_t)(i * 59 + 7);
    put_u16(b + 80, H_0_5);
    put_u16(b + 82, H_0_25);
    float got[256], want[256];
    ref_q2_k(b, want);
    dequant_one(TPI_TYPE_Q2_K, b, got, 256);
    expect_values("Q2_K", got, want, 256);
    /* by hand: e=0: scales[0]=11 -> scale 11, min 0; qs[0]=7 -> bits 3: 0.5*11*3 = 16.5.
     * e=16: scales[1]=48 -> scale 0, min 3: -0.25*3 = -0.75.
     * e=32: scales[2]=85 -> scale 5, min 5; qs[0]=7 >> 2 -> 1: 2.5 - 1.25 = 1.25 */
    ck_assert_float_eq(got[0], 16.5f);
    ck_assert_float_eq(got[16], -0.75f);
    ck_assert_float_eq(got[32], 1.25f);
}
END_TEST

START_TEST(test_block_q3_k) {
    uint8_t b[110] = {0};
    /* scales (6-bit, stored + 32) chosen across the range, packed by the format's text:
     * low nibbles in bytes 0-7 (s < 8 low, s >= 8 high nibble of byte s-8), top 2 bits in
     * bytes 8-11 (bits 2(s/4) of byte 8 + s%4) */
    const int scales[16] = {-32, 31, 1, -1, 2, 16, -16, 3, 10, -10, 7, 0, 9, 5, -11, 12};
    for (int s = 0; s < 16; s++) {
        const int v = scales[s] + 32;
        b[96 + (s < 8 ? s : s - 8)] |= (uint8_t)((v & 15) << (s < 8 ? 0 : 4));
        b[96 + 8 + s % 4] |= (uint8_t)((v >> 4) << (2 * (s / 4)));
    }
    for (int i = 0; i < 32; i++) b[i] = (uint8_t)(i * 83 + 1); /* hmask */
    for (int i = 0; i < 64; i++) b[32 + i] = (uint8_t)(i * 45 + 9);
    put_u16(b + 108, H_0_25);
    float got[256], want[256];
    ref_q3_k(b, want);
    for (int e = 0; e < 256; e++) { /* the same values from the format's text */
        const int n = e / 128, w = e % 128, shift = 2 * (w / 32), l = w % 32;
        const int lo = (b[32 + 32 * n + l] >> shift) & 3, hi = (b[l] >> (e / 32)) & 1;
        const float v = 0.25f * (float)scales[e / 16] * (float)(lo - (hi ? 0 : 4));
        ck_assert_msg(!memcmp(&v, &want[e], 4), "Q3_K reference value %d: %a, want %a", e,
                      (double)want[e], (double)v);
    }
    dequant_one(TPI_TYPE_Q3_K, b, got, 256);
    expect_values("Q3_K", got, want, 256);
    /* by hand: e=0: hmask[0]=1 bit0 set, qs[0]=9 -> 1: 0.25*-32*1 = -8 */
    ck_assert_float_eq(got[0], -8.0f);
}
END_TEST

/* Random bytes as Q2_K and Q3_K blocks (finite d), bitwise against ggml's loops;
 * Q3_K's blocks rewritten as Q6_K (quant_convert_held) dequantize to the same bits. */
START_TEST(test_k2_blocks_random) {
    enum { NB = 300 };
    struct tu_rng r;
    tu_rng_seed(&r, 2041);
    const int types[2] = {TPI_TYPE_Q2_K, TPI_TYPE_Q3_K};
    for (int k = 0; k < 2; k++) {
        const int type = types[k];
        const size_t bb = quant_traits(type)->type_size;
        uint8_t *q = malloc(bb * NB);
        uint8_t *q6 = malloc(210 * NB);
        float *got = malloc(sizeof *got * 256 * NB), *six = malloc(sizeof *six * 256 * NB);
        ck_assert(q && q6 && got && six);
        for (size_t i = 0; i < bb * NB; i++) q[i] = (uint8_t)((int)tu_uniform(&r, 0.0f, 256.0f) & 255);
        for (int b = 0; b < NB; b++) /* the f16 scales (the last 4 or 2 bytes): finite */
            for (size_t o = type == TPI_TYPE_Q2_K ? 81 : 109; o < bb; o += 2)
                if ((q[bb * b + o] & 0x7C) == 0x7C) q[bb * b + o] ^= 0x40;
        quant_traits(type)->to_f32(q, got, 256 * NB);
        for (int b = 0; b < NB; b++) {
            float want[256];
            (type == TPI_TYPE_Q2_K ? ref_q2_k : ref_q3_k)(q + bb * b, want);
            for (int e = 0; e < 256; e++)
                ck_assert_msg(!memcmp(&got[256 * b + e], &want[e], 4),
                              "%s block %d, value %d: %a, want %a", quant_type_name(type), b, e,
                              (double)got[256 * b + e], (double)want[e]);
        }
        if (type == TPI_TYPE_Q3_K) {
            int64_t bad = 0;
            ck_assert_int_eq(quant_convert_held(type, q, q6, 256 * NB, &bad), TPI_OK);
            quant_traits(TPI_TYPE_Q6_K)->to_f32(q6, six, 256 * NB);
            for (int e = 0; e < 256 * NB; e++)
                ck_assert_msg(!memcmp(&six[e], &got[e], 4), "Q3_K as Q6_K, value %d: %a, want %a",
                              e, (double)six[e], (double)got[e]);
        }
        free(q);
        free(q6);
        free(got);
        free(six);
    }
}
END_TEST

/* IQ4_NL and IQ4_XS as ggml's dequantize_row_iq4_nl / _iq4_xs: indices into its 16-entry
 * table, low nibbles the first 16 values of each 32 and high nibbles the next 16; IQ4_XS's
 * 6-bit scale of sub-block ib has its low 4 bits in nibble ib%2 of scales_l[ib/2] and its
 * top 2 in bits 2ib of scales_h, minus 32. */
static const int8_t kv_iq4[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                  1,    13,   25,  38,  53,  69,  89,  113};
static void ref_iq4_nl(const uint8_t *b, float *y) {
    const float d = tpi_f16_to_f32((uint16_t)(b[0] | b[1] << 8));
    for (int j = 0; j < 16; j++) {
        y[j] = d * kv_iq4[b[2 + j] & 0xf];
        y[j + 16] = d * kv_iq4[b[2 + j] >> 4];
    }
}
static void ref_iq4_xs(const uint8_t *b, float *y) {
    const float d = tpi_f16_to_f32((uint16_t)(b[0] | b[1] << 8));
    const uint16_t scales_h = (uint16_t)(b[2] | b[3] << 8);
    const uint8_t *scales_l = b + 4, *qs = b + 8;
    for (int ib = 0; ib < 8; ib++, y += 32, qs += 16) {
        const int ls = ((scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) | (((scales_h >> 2 * ib) & 3) << 4);
        const float dl = d * (ls - 32);
        for (int j = 0; j < 16; j++) {
            y[j] = dl * kv_iq4[qs[j] & 0xf];
            y[j + 16] = dl * kv_iq4[qs[j] >> 4];
        }
    }
}

START_TEST(test_block_iq4) {
    uint8_t nl[18], xs[136];
    put_u16(nl, H_0_5);
    for (int i = 0; i < 16; i++) nl[2 + i] = (uint8_t)(i * 23 + 4);
    float got[256], want[256];
    ref_iq4_nl(nl, want);
    dequant_one(TPI_TYPE_IQ4_NL, nl, got, 32);
    expect_values("IQ4_NL", got, want, 32);
    /* by hand: qs[0]=4: low 4 -> -49, high 0 -> -127: 0.5*-49 = -24.5, 0.5*-127 = -63.5 */
    ck_assert_float_eq(got[0], -24.5f);
    ck_assert_float_eq(got[16], -63.5f);
    put_u16(xs, H_0_25);
    const int ls[8] = {0, 63, 32, 31, 33, 1, 40, 17}; /* stored values (scale + 32) */
    uint16_t sh = 0;
    for (int ib = 0; ib < 8; ib++) sh |= (uint16_t)((ls[ib] >> 4) << (2 * ib));
    put_u16(xs + 2, sh);
    for (int i = 0; i < 4; i++) xs[4 + i] = (uint8_t)((ls[2 * i] & 15) | (ls[2 * i + 1] & 15) << 4);
    for (int i = 0; i < 128; i++) xs[8 + i] = (uint8_t)(i * 37 + 1);
    ref_iq4_xs(xs, want);
    for (int e = 0; e < 256; e++) { /* the same values from the format's text */
        const uint8_t q = xs[8 + 16 * (e / 32) + e % 16];
        const float v = (0.25f * (float)(ls[e / 32] - 32)) * kv_iq4[e % 32 < 16 ? q & 15 : q >> 4];
        ck_assert_msg(!memcmp(&v, &want[e], 4), "IQ4_XS reference value %d", e);
    }
    dequant_one(TPI_TYPE_IQ4_XS, xs, got, 256);
    expect_values("IQ4_XS", got, want, 256);
    /* by hand: e=0: ls 0 -> scale -32; qs[0]=1, low nibble 1 -> -104: 0.25 * -32 * -104 */
    ck_assert_float_eq(got[0], 832.0f);
}
END_TEST

/* Random bytes as IQ4_NL and IQ4_XS blocks (finite d), bitwise against ggml's loops; and
 * the forms the CUDA backend holds (quant_convert_held): IQ4_NL's Q8_0 bitwise, IQ4_XS's
 * Q8_0 within 2^-11 of each value (its sub-block scales rounded to f16), Q3_K's Q6_K
 * bitwise (as above); Q2_K is held as itself. */
START_TEST(test_iq4_blocks_random) {
    enum { NB = 200 };
    struct tu_rng r;
    tu_rng_seed(&r, 2053);
    const int types[3] = {TPI_TYPE_IQ4_NL, TPI_TYPE_IQ4_XS, TPI_TYPE_Q3_K};
    for (int k = 0; k < 3; k++) {
        const int type = types[k], held = quant_held_form(type);
        const struct quant_traits *t = quant_traits(type);
        const size_t bb = t->type_size;
        const int64_t n = (int64_t)t->blck_size * NB;
        uint8_t *q = malloc(bb * NB), *h = malloc(quant_row_size(held, n));
        float *got = malloc(sizeof *got * n), *hv = malloc(sizeof *hv * n);
        ck_assert(q && h && got && hv);
        for (size_t i = 0; i < bb * NB; i++) q[i] = (uint8_t)((int)tu_uniform(&r, 0.0f, 256.0f) & 255);
        for (int b = 0; b < NB; b++) { /* the f16 scales: below 2 (exponent <= 14), any sign */
            const size_t o = type == TPI_TYPE_Q3_K ? 108 : 0;
            q[bb * b + o + 1] = (uint8_t)(q[bb * b + o + 1] & 0xBB);
        }
        t->to_f32(q, got, n);
        if (type == TPI_TYPE_IQ4_NL || type == TPI_TYPE_IQ4_XS)
            for (int b = 0; b < NB; b++) {
                float want[256];
                (type == TPI_TYPE_IQ4_NL ? ref_iq4_nl : ref_iq4_xs)(q + bb * b, want);
                for (int e = 0; e < t->blck_size; e++)
                    ck_assert_msg(!memcmp(&got[t->blck_size * b + e], &want[e], 4),
                                  "%s block %d, value %d: %a, want %a", t->name, b, e,
                                  (double)got[t->blck_size * b + e], (double)want[e]);
            }
        int64_t bad = 0;
        ck_assert_int_eq(quant_convert_held(type, q, h, n, &bad), TPI_OK);
        ck_assert_int_eq(bad, -1);
        quant_traits(held)->to_f32(h, hv, n);
        const bool exact = quant_held_is_exact(type);
        for (int64_t e = 0; e < n; e++) {
            if (exact)
                ck_assert_msg(!memcmp(&hv[e], &got[e], 4), "%s as %s, value %lld: %a, want %a",
                              t->name, quant_type_name(held), (long long)e, (double)hv[e],
                              (double)got[e]);
            else
                /* 2^-11 relative; below f16's normal range 2^-25 absolute, times IQ4's 127 */
                ck_assert_msg(fabsf(hv[e] - got[e]) <= 0x1p-11f * fabsf(got[e]) + 0x1p-18f,
                              "%s as %s, value %lld: %g, want %g", t->name, quant_type_name(held),
                              (long long)e, (double)hv[e], (double)got[e]);
        }
        free(q), free(h), free(got), free(hv);
    }
    /* beyond f16: an IQ4_XS sub-block scale of 2^15 * -32 (d = 2^15, stored scale 0 in
     * sub-block 1) is named by its first value */
    uint8_t b4[136] = {0}, o4[8 * 34];
    put_u16(b4, 0x7800); /* d = 2^15 */
    put_u16(b4 + 2, 2);  /* top bits: sub-block 0's 2 (stored 32: scale 0), the others' 0 */
    int64_t bad = -1;
    ck_assert_int_eq(quant_convert_held(TPI_TYPE_IQ4_XS, b4, o4, 256, &bad), TPI_ERR_UNSUPPORTED);
    ck_assert_int_eq(bad, 32);
    ck_assert_int_eq(quant_convert_held(TPI_TYPE_IQ4_XS, b4, o4, 100, &bad), TPI_ERR_INVALID);
    /* held as themselves even under TPI_HOLD=1: Q2_K (its own kernels are the faster) and
     * the other types; and without TPI_HOLD=1 every type */
    ck_assert_int_eq(quant_held_form(TPI_TYPE_Q2_K), TPI_TYPE_Q2_K);
    ck_assert_int_eq(quant_held_form(TPI_TYPE_Q4_K), TPI_TYPE_Q4_K);
    if (!getenv("TPI_HOLD") || strcmp(getenv("TPI_HOLD"), "1") != 0)
        for (int k = 0; k < 3; k++)
            ck_assert_int_eq(quant_gpu_held_type(types[k]), types[k]);
}
END_TEST

/* ---- 2. round trips ------------------------------------------------------- */

static const int all_types[] = {TPI_TYPE_F32,  TPI_TYPE_F16,  TPI_TYPE_BF16, TPI_TYPE_Q8_0,
                                TPI_TYPE_Q4_0, TPI_TYPE_Q4_1, TPI_TYPE_Q5_0, TPI_TYPE_Q5_1,
                                TPI_TYPE_Q2_K, TPI_TYPE_Q3_K, TPI_TYPE_Q4_K, TPI_TYPE_Q5_K,
                                TPI_TYPE_Q6_K, TPI_TYPE_IQ4_NL, TPI_TYPE_IQ4_XS};
#define Q2K_NMSE 0.15 /* measured 0.109 (2 bits, 4 levels a sub-block of 16) */
#define Q3K_NMSE 0.035 /* measured 0.024 */
#define IQ4_NMSE 1e-2 /* measured 0.0064, as the other 4-bit types */
#define N_TYPES (int)(sizeof all_types / sizeof all_types[0])

/* NMSE bounds for normal data; the reference quantizers measure about 4-bit
 * 6-7e-3, 5-bit 1.5-1.8e-3, Q6_K 3.5e-4, Q8_0 3e-5, BF16 3e-6, F16 4e-8; Q2_K and Q3_K
 * at most 0.109 and 0.024 (below). */
static double nmse_bound(int type) {
    switch (type) {
    case TPI_TYPE_Q2_K:
        return Q2K_NMSE;
    case TPI_TYPE_Q3_K:
        return Q3K_NMSE;
    case TPI_TYPE_IQ4_NL:
    case TPI_TYPE_IQ4_XS:
        return IQ4_NMSE;
    case TPI_TYPE_Q4_0:
    case TPI_TYPE_Q4_1:
    case TPI_TYPE_Q4_K:
        return 1e-2;
    case TPI_TYPE_Q5_0:
    case TPI_TYPE_Q5_1:
    case TPI_TYPE_Q5_K:
        return 4e-3;
    case TPI_TYPE_Q6_K:
        return 2e-3;
    case TPI_TYPE_Q8_0:
        return 1e-4;
    case TPI_TYPE_BF16:
        return 1e-5;
    case TPI_TYPE_F16:
        return 1e-7;
    default:
        return 0.0;
    }
}

static double round_trip(int type, const float *x, float *y, int64_t n) {
    const struct quant_traits *t = quant_traits(type);
    void *q = malloc(quant_row_size(type, n));
    ck_assert_ptr_nonnull(q);
    t->from_f32(x, q, n);
    t->to_f32(q, y, n);
    free(q);
    return tu_nmse(y, x, (size_t)n);
}

START_TEST(test_round_trip) {
    const int64_t n = 256 * 64;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    struct tu_rng r;
    /* three distributions: N(0,1), N(0, 0.02) (weight-sized), and N(0.5, 0.1)
     * (all positive: exercises the min/offset of Q4_1/Q5_1/K-quants) */
    const float mean[3] = {0.0f, 0.0f, 0.5f}, sd[3] = {1.0f, 0.02f, 0.1f};
    for (int dist = 0; dist < 3; dist++) {
        tu_rng_seed(&r, 1234 + dist);
        for (int64_t i = 0; i < n; i++)
            x[i] = mean[dist] + sd[dist] * tu_normal(&r);
        for (int k = 0; k < N_TYPES; k++) {
            int type = all_types[k];
            double e = round_trip(type, x, y, n);
            fprintf(stderr, "round trip %-5s dist %d: nmse %.3g (bound %.3g)\n",
                    quant_type_name(type), dist, e, nmse_bound(type));
            ck_assert_msg(e <= nmse_bound(type), "%s dist %d: nmse %g > %g", quant_type_name(type),
                          dist, e, nmse_bound(type));
            if (type == TPI_TYPE_F16 || type == TPI_TYPE_BF16) {
                /* round to nearest: relative error <= 2^-11 (f16) / 2^-8 (bf16) per element */
                double rel = type == TPI_TYPE_F16 ? ldexp(1, -11) : ldexp(1, -8);
                ck_assert_msg(tu_compare(quant_type_name(type), y, x, (size_t)n, 1e-7, rel) == 0,
                              "%s elementwise", quant_type_name(type));
            }
            if (type == TPI_TYPE_F32) ck_assert(memcmp(x, y, n * sizeof *x) == 0);
        }
        /* Q8_0: per block, |err| <= d/2 from rounding plus 127*|d - f16(d)| <= 127*d*2^-11 */
        void *q = malloc(quant_row_size(TPI_TYPE_Q8_0, n));
        quant_traits(TPI_TYPE_Q8_0)->from_f32(x, q, n);
        quant_traits(TPI_TYPE_Q8_0)->to_f32(q, y, n);
        for (int64_t blk = 0; blk < n / 32; blk++) {
            float amax = 0;
            for (int j = 0; j < 32; j++)
                amax = fmaxf(amax, fabsf(x[blk * 32 + j]));
            double d = amax / 127.0, bound = d * (0.5 + 127.0 * ldexp(1, -11)) + 1e-12;
            for (int j = 0; j < 32; j++) {
                double err = fabs(y[blk * 32 + j] - x[blk * 32 + j]);
                if (err > bound)
                    ck_abort_msg("Q8_0 block %lld elem %d: err %g > %g", (long long)blk, j, err,
                                 bound);
            }
        }
        free(q);
    }
    /* all-zero data stays zero (no 0/0 in the scale computations) */
    memset(x, 0, n * sizeof *x);
    for (int k = 0; k < N_TYPES; k++) {
        round_trip(all_types[k], x, y, n);
        for (int64_t i = 0; i < n; i++)
            if (y[i] != 0.0f)
                ck_abort_msg("%s zero data -> %g at %lld", quant_type_name(all_types[k]), y[i],
                             (long long)i);
    }
    free(x);
    free(y);
}
END_TEST

/* ---- 3. extract_cols, sizes, names, unknown ids ---------------------------- */

START_TEST(test_extract_cols) {
    const int64_t ne0 = 1024, ne1 = 5;
    float *x = malloc(ne0 * ne1 * sizeof *x), *full = malloc(ne0 * ne1 * sizeof *full);
    float *part = malloc(ne0 * ne1 * sizeof *part);
    struct tu_rng r;
    tu_rng_seed(&r, 7);
    for (int64_t i = 0; i < ne0 * ne1; i++)
        x[i] = tu_normal(&r);
    struct tpi_error err;
    for (int k = 0; k < N_TYPES; k++) {
        int type = all_types[k];
        const struct quant_traits *t = quant_traits(type);
        size_t row = quant_row_size(type, ne0);
        uint8_t *q = malloc(row * ne1), *sub = malloc(row * ne1);
        for (int64_t i = 0; i < ne1; i++)
            t->from_f32(x + i * ne0, q + i * row, ne0);
        ck_assert_int_eq(quant_dequant_rows(type, q, ne0, 0, ne1, full, &err), TPI_OK);
        /* rows [2, 4) alone equal those rows of the whole */
        ck_assert_int_eq(quant_dequant_rows(type, q, ne0, 2, 2, part, &err), TPI_OK);
        ck_assert(memcmp(part, full + 2 * ne0, 2 * ne0 * sizeof *part) == 0);
        int64_t bs = t->blck_size < 32 ? 32 : t->blck_size; /* test ranges of whole blocks */
        const int64_t ranges[3][2] = {{0, 256}, {256, 512}, {768, 256}};
        for (int c = 0; c < 3; c++) {
            int64_t col0 = ranges[c][0], n_cols = ranges[c][1];
            ck_assert_int_eq(quant_extract_cols(type, q, ne0, ne1, col0, n_cols, sub, &err),
                             TPI_OK);
            ck_assert_int_eq(quant_dequant_rows(type, sub, n_cols, 0, ne1, part, &err), TPI_OK);
            for (int64_t i = 0; i < ne1; i++)
                ck_assert_msg(
                    memcmp(part + i * n_cols, full + i * ne0 + col0, n_cols * sizeof(float)) == 0,
                    "%s: cols [%lld,+%lld) row %lld differ", t->name, (long long)col0,
                    (long long)n_cols, (long long)i);
        }
        if (t->blck_size > 1) {
            /* half a block off the edge: an error, not a silent wrong slice */
            int64_t half = t->blck_size / 2;
            ck_assert_int_eq(quant_extract_cols(type, q, ne0, ne1, half, bs, sub, &err),
                             TPI_ERR_INVALID);
            ck_assert_msg(strstr(err.msg, "block") != NULL, "message: %s", err.msg);
            ck_assert_int_eq(quant_extract_cols(type, q, ne0, ne1, 0, bs + half, sub, &err),
                             TPI_ERR_INVALID);
        }
        ck_assert_int_eq(quant_extract_cols(type, q, ne0, ne1, ne0 - bs, 2 * bs, sub, &err),
                         TPI_ERR_INVALID);
        ck_assert_int_eq(quant_extract_cols(type, q, ne0, ne1, -bs, bs, sub, &err),
                         TPI_ERR_INVALID);
        free(q);
        free(sub);
    }
    free(x);
    free(full);
    free(part);
}
END_TEST

START_TEST(test_sizes_and_names) {
    ck_assert_uint_eq(quant_row_size(TPI_TYPE_Q4_K, 512), 288);
    ck_assert_uint_eq(quant_row_size(TPI_TYPE_Q6_K, 256), 210);
    ck_assert_uint_eq(quant_row_size(TPI_TYPE_Q5_K, 256), 176);
    ck_assert_uint_eq(quant_row_size(TPI_TYPE_Q2_K, 512), 168);
    ck_assert_uint_eq(quant_row_size(TPI_TYPE_Q3_K, 256), 110);
    ck_assert_uint_eq(quant_row_size(TPI_TYPE_IQ4_NL, 64), 36);
    ck_assert_uint_eq(quant_row_size(TPI_TYPE_IQ4_XS, 256), 136);
    ck_assert_uint_eq(quant_row_size(TPI_TYPE_Q8_0, 64), 68);
    ck_assert_uint_eq(quant_row_size(TPI_TYPE_Q4_0, 32), 18);
    ck_assert_uint_eq(quant_row_size(TPI_TYPE_Q4_1, 32), 20);
    ck_assert_uint_eq(quant_row_size(TPI_TYPE_Q5_0, 32), 22);
    ck_assert_uint_eq(quant_row_size(TPI_TYPE_Q5_1, 32), 24);
    ck_assert_uint_eq(quant_row_size(TPI_TYPE_BF16, 3), 6);
    ck_assert_uint_eq(quant_row_size(TPI_TYPE_F32, 3), 12);
    ck_assert_uint_eq(quant_row_size(TPI_TYPE_Q4_K, 100), 0); /* not a multiple of 256 */
    ck_assert_uint_eq(quant_row_size(99, 256), 0);
    ck_assert_int_eq(quant_type_from_name("q4_k"), TPI_TYPE_Q4_K);
    ck_assert_int_eq(quant_type_from_name("Q6_K"), TPI_TYPE_Q6_K);
    ck_assert_int_eq(quant_type_from_name("bf16"), TPI_TYPE_BF16);
    ck_assert_int_eq(quant_type_from_name("Q3_K"), TPI_TYPE_Q3_K);
    ck_assert_int_eq(quant_type_from_name("q2_k"), TPI_TYPE_Q2_K);
    ck_assert_int_eq(quant_type_from_name("q4_k_m"), -1);
    ck_assert_int_eq(quant_type_from_name("q4"), -1);
    ck_assert_int_eq(quant_type_from_name(""), -1);
    ck_assert_int_eq(quant_type_from_name(NULL), -1);
    for (int k = 0; k < N_TYPES; k++) {
        const struct quant_traits *t = quant_traits(all_types[k]);
        ck_assert(t && t->supported && t->to_f32 && t->from_f32);
        ck_assert_int_eq(quant_type_from_name(t->name), all_types[k]);
        ck_assert_str_eq(quant_type_name(all_types[k]), t->name);
    }
}
END_TEST

START_TEST(test_unknown_and_unsupported) {
    const int unknown[] = {-1, -12, INT_MIN, INT_MAX, 4, 5, 31, 32, 33, 36, 37, 38, 40, 1000};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        ck_assert_msg(quant_traits(unknown[i]) == NULL, "id %d should be unknown", unknown[i]);
        ck_assert_uint_eq(quant_row_size(unknown[i], 256), 0);
    }
    ck_assert_str_eq(quant_type_name(999), "type999");
    ck_assert_str_eq(quant_type_name(-3), "type-3");
    struct tpi_error err;
    float out[256];
    uint8_t blk[512] = {0};
    ck_assert_int_eq(quant_dequant_rows(999, blk, 256, 0, 1, out, &err), TPI_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(err.msg, "999") != NULL, "message: %s", err.msg);
    /* named but not computable: the message names the type */
    const struct quant_traits *iq2 = quant_traits(16);
    ck_assert_ptr_nonnull(iq2);
    ck_assert(!iq2->supported);
    ck_assert_str_eq(iq2->name, "IQ2_XXS");
    ck_assert_uint_eq(quant_row_size(16, 256), 66);
    ck_assert_int_eq(quant_dequant_rows(16, blk, 256, 0, 1, out, &err), TPI_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(err.msg, "IQ2_XXS") != NULL, "message: %s", err.msg);
    ck_assert_str_eq(quant_type_name(15), "Q8_K");
    ck_assert_str_eq(quant_type_name(20), "IQ4_NL");
    ck_assert_str_eq(quant_type_name(21), "IQ3_S");
    ck_assert_int_eq(quant_dequant_rows(TPI_TYPE_Q4_K, blk, 100, 0, 1, out, &err), TPI_ERR_INVALID);
}
END_TEST

/* ---- 4. reference files ---------------------------------------------------- */

/* Check every tensor of `name`.tensors.json (first16 exactly up to float
 * rounding; sum and sumsq to 1e-6 relative: the reference sums in float64). */
static int check_reference_file(const char *model) {
    char jname[256];
    snprintf(jname, sizeof jname, "%s.tensors.json", model);
    const char *jpath = tu_data_path(jname);
    if (!jpath) return 0;
    char jcopy[1024];
    snprintf(jcopy, sizeof jcopy, "%s", jpath);
    char gname[256];
    snprintf(gname, sizeof gname, "%s.gguf", model);
    const char *gpath = tu_data_path(gname);
    if (!gpath) return 0;
    size_t file_n = 0;
    uint8_t *file = (uint8_t *)tu_read_file(gpath, &file_n);
    ck_assert_ptr_nonnull(file);
    cJSON *root = tu_read_json(jcopy);
    ck_assert_ptr_nonnull(root);
    const cJSON *t;
    int n_checked = 0;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(root, "tensors")) {
        const char *tname = cJSON_GetObjectItem(t, "name")->valuestring;
        int type = quant_type_from_name(cJSON_GetObjectItem(t, "type")->valuestring);
        ck_assert_msg(type >= 0 && quant_traits(type)->supported, "%s: type %s", tname,
                      cJSON_GetObjectItem(t, "type")->valuestring);
        const cJSON *shape = cJSON_GetObjectItem(t, "shape");
        int64_t ne0 = (int64_t)cJSON_GetArrayItem(shape, 0)->valuedouble, rows = 1;
        for (int i = 1; i < cJSON_GetArraySize(shape); i++)
            rows *= (int64_t)cJSON_GetArrayItem(shape, i)->valuedouble;
        uint64_t off = (uint64_t)cJSON_GetObjectItem(t, "offset")->valuedouble;
        uint64_t nb = (uint64_t)cJSON_GetObjectItem(t, "n_bytes")->valuedouble;
        ck_assert_uint_eq(quant_row_size(type, ne0) * rows, nb);
        ck_assert(off + nb <= file_n);
        float *y = malloc((size_t)(ne0 * rows) * sizeof *y);
        struct tpi_error err;
        ck_assert_int_eq(quant_dequant_rows(type, file + off, ne0, 0, rows, y, &err), TPI_OK);
        float want[16];
        const cJSON *first = cJSON_GetObjectItem(t, "first16");
        int n_first = cJSON_GetArraySize(first);
        for (int i = 0; i < n_first; i++)
            want[i] = (float)cJSON_GetArrayItem(first, i)->valuedouble;
        char label[256];
        snprintf(label, sizeof label, "%s %s first16", model, tname);
        ck_assert_msg(tu_compare(label, y, want, (size_t)n_first, 1e-6, 1e-5) == 0, "%s", label);
        double sum = 0, sumsq = 0;
        for (int64_t i = 0; i < ne0 * rows; i++) {
            sum += y[i];
            sumsq += (double)y[i] * y[i];
        }
        double want_sum = cJSON_GetObjectItem(t, "sum")->valuedouble;
        double want_sq = cJSON_GetObjectItem(t, "sumsq")->valuedouble;
        ck_assert_msg(fabs(sumsq - want_sq) <= 1e-6 * want_sq + 1e-9, "%s: sumsq %.10g want %.10g",
                      label, sumsq, want_sq);
        ck_assert_msg(fabs(sum - want_sum) <= 1e-6 * sqrt(want_sq * (double)(ne0 * rows)) + 1e-9,
                      "%s: sum %.10g want %.10g", label, sum, want_sum);
        free(y);
        n_checked++;
    }
    cJSON_Delete(root);
    free(file);
    fprintf(stderr, "%s: %d tensors match the reference\n", model, n_checked);
    return n_checked;
}

START_TEST(test_reference_files) {
    const char *models[] = {"qwen3-tiny-q4_k_m", "qwen2-tiny-q5_k_m", "qwen2-tiny-q4_0",
                            "qwen3-tiny-q8_0",   "qwen3-tiny-q6_k",   "qwen3-tiny-bf16",
                            "qwen2-tiny-f16",    "qwen3-tiny-q2_k",   "qwen2-tiny-q3_k_m",
                            "qwen2-tiny-iq4_xs"};
    int total = 0;
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
        total += check_reference_file(models[i]);
    if (total == 0) fprintf(stderr, "SKIP: no reference models found\n");
}
END_TEST

int main(void) {
    Suite *s = suite_create("quant");
    TCase *tc = tcase_create("blocks");
    tcase_add_test(tc, test_block_q8_0);
    tcase_add_test(tc, test_block_q4_0);
    tcase_add_test(tc, test_block_q4_1);
    tcase_add_test(tc, test_block_q5_0);
    tcase_add_test(tc, test_block_q5_1);
    tcase_add_test(tc, test_block_q4_k);
    tcase_add_test(tc, test_block_q5_k);
    tcase_add_test(tc, test_block_q6_k);
    tcase_add_test(tc, test_block_float_types);
    tcase_add_test(tc, test_float_types_all_patterns);
    tcase_add_test(tc, test_nibble_blocks_random);
    tcase_add_test(tc, test_q6_k_blocks_random);
    tcase_add_test(tc, test_block_q2_k);
    tcase_add_test(tc, test_block_q3_k);
    tcase_add_test(tc, test_k2_blocks_random);
    tcase_add_test(tc, test_block_iq4);
    tcase_add_test(tc, test_iq4_blocks_random);
    suite_add_tcase(s, tc);
    TCase *tr = tcase_create("round_trip");
    tcase_add_test(tr, test_round_trip);
    tcase_add_test(tr, test_extract_cols);
    tcase_add_test(tr, test_sizes_and_names);
    tcase_add_test(tr, test_unknown_and_unsupported);
    tcase_add_test(tr, test_reference_files);
    tcase_set_timeout(tr, 120);
    suite_add_tcase(s, tr);
    return tu_run_suite(s);
}
