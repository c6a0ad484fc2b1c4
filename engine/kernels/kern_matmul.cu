/*
 * kern_matmul.cu — y(n_rows, ne1) = x(n_rows, ne0) * W^T for every weight type.
 *
 * Decode (n_rows <= MATVEC_MAX_ROWS): matrix-vector kernels, a warp per output
 * feature; the warp's lanes decode consecutive units of the weight row (each
 * byte read once, in registers) and dot them with up to 8 x rows at once, then a
 * shuffle reduction. Memory-bound by design: the weight is read exactly once.
 * These are path v2; with ctx->gemv == 3 (TPI_GEMV=v3) kern_gemv.cu's int8-x
 * kernels take the types and shapes they cover first.
 *
 * Prefill (more rows): W is dequantized to bf16 in slabs of rows, x converted to
 * bf16, and cuBLAS multiplies with f32 accumulation (tensor cores); block-quantized W
 * with up to ctx->mmq_rows rows goes to kern_mmq.cu instead (W decoded in registers;
 * matmul_n hands it the weights of one type that share x as one launch;
 * the same roundings, each weight byte read once). F32 weights
 * use an f32 SGEMM and BF16 weights are used as stored. The bf16 roundings of x and
 * W give a normalized squared error around 1e-5 against the f32 reference.
 *
 * cuBLAS is column-major: the row-major (ne1 x ne0) W is a column-major (ne0 x ne1)
 * matrix with lda = ne0, so y^T (ne1 x n_rows, ldc = ne1) = op_T(W) * x^T.
 */
#include "kern_common.cuh"
#include "kern_quant.cuh"
#include "kern_xq.cuh"

#define MATVEC_MAX_ROWS 8
#define MATVEC_WARPS 4 /* warps (output features) per block */
/* Largest bf16 weight slab dequantized at once: 64 Mi values = 128 MiB. */
#define GEMM_SLAB_ELEMS ((int64_t)64 << 20)

/* ---------------------------------------------------------------- kernels */

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Warp w of the grid computes output feature w for all n_rows (<= NR) x rows. */
template <int TYPE, int NR>
__global__ void __launch_bounds__(MATVEC_WARPS * 32)
    matvec_block_kernel(const uint8_t *w, size_t row_bytes, int64_t ne0, int64_t ne1,
                        const float *__restrict__ x, float *__restrict__ y, int n_rows) {
    using Q = kq<TYPE>;
    const int64_t feat = (int64_t)blockIdx.x * MATVEC_WARPS + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (feat >= ne1) return;
    const uint8_t *row = w + feat * row_bytes;
    const int units_per_row = (int)(ne0 / Q::BLK) * Q::UPB;
    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; r++)
        acc[r] = 0.0f;
    for (int u = lane; u < units_per_row; u += 32) {
        const int blk = u / Q::UPB;
        float v[Q::G * 4];
        int off[Q::G];
        Q::unit(row + (int64_t)blk * Q::BYTES, u % Q::UPB, v, off);
        const float *xb = x + (int64_t)blk * Q::BLK;
#pragma unroll
        for (int r = 0; r < NR; r++) {
            if (r < n_rows) {
                const float *xr = xb + r * ne0;
#pragma unroll
                for (int g = 0; g < Q::G; g++)
#pragma unroll
                    for (int k = 0; k < 4; k++)
                        acc[r] += v[g * 4 + k] * __ldg(xr + off[g] + k);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < NR; r++) {
        const float s = warp_sum(acc[r]);
        if (lane == 0 && r < n_rows) y[r * ne1 + feat] = s;
    }
}

/* The same for element types (any ne0): lanes take consecutive elements. */
template <int TYPE, int NR>
__global__ void __launch_bounds__(MATVEC_WARPS * 32)
    matvec_elem_kernel(const uint8_t *w, size_t row_bytes, int64_t ne0, int64_t ne1,
                       const float *__restrict__ x, float *__restrict__ y, int n_rows) {
    const int64_t feat = (int64_t)blockIdx.x * MATVEC_WARPS + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (feat >= ne1) return;
    const uint8_t *row = w + feat * row_bytes;
    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; r++)
        acc[r] = 0.0f;
    for (int64_t j = lane; j < ne0; j += 32) {
        const float wv = kf<TYPE>::load(row, j);
#pragma unroll
        for (int r = 0; r < NR; r++)
            if (r < n_rows) acc[r] += wv * __ldg(x + r * ne0 + j);
    }
#pragma unroll
    for (int r = 0; r < NR; r++) {
        const float s = warp_sum(acc[r]);
        if (lane == 0 && r < n_rows) y[r * ne1 + feat] = s;
    }
}

/* ------------------------------------------------ staged matrix-vector kernels
 *
 * The fast decode path. A warp owns 4 consecutive output features (weight rows) and
 * walks their rows in *stages* of 32 units per feature (a unit: 16 to 64 values of one
 * block). Each stage's raw bytes (one window per row, rounded out to 16 bytes, which
 * weight_upload's padding keeps inside the allocation) are copied into shared memory
 * with 16-byte cp.async, one stage ahead, so every weight byte is read once with wide
 * loads and several kilobytes are in flight per warp. Lane (fi, ul) = (lane / 8,
 * lane % 8) decodes units ul, ul+8, ul+16, ul+24 of feature fi: the four lanes with
 * the same ul read the same x addresses in the same instruction, so x traffic is a
 * quarter of the naive one. x is read as float4 (needs x 16-byte aligned, ne0 % 4 == 0).
 * Small ne1 splits each row's stages over wpf warps (summed in shared memory).
 *
 * Integers become floats without I2F (a slow unit): a small unsigned q placed in the
 * top mantissa bits of 2^E gives the float 2^E + q exactly, and fmaf(d, 2^E + q, -k)
 * with k = (2^E + offset) * d gives d * (q - offset) with one rounding of k: relative
 * errors ~2^-20, far inside the matvec bound. */

#define MV_WARPS 4    /* warps per block */
#define MV_FEATS 4    /* features per warp */
#define MV_UNITS 32   /* units per feature per stage */

__device__ __forceinline__ void mv_cp16(void *smem, const void *gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void mv_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void mv_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* logical shift left by sh (negative: right); sh is a constant after unrolling */
__device__ __forceinline__ uint32_t mv_sh(uint32_t w, int sh) {
    return sh >= 0 ? w << sh : w >> -sh;
}
/* The float 2^E + q for the NB-bit field of w at bit pos (q < 2^E, NB <= E). */
__device__ __forceinline__ float mv_mag(uint32_t w, int pos, int nb, int e) {
    const uint32_t mask = ((1u << nb) - 1u) << (23 - e);
    return __uint_as_float(((uint32_t)(127 + e) << 23) | (mv_sh(w, 23 - e - pos) & mask));
}

/* n 32-bit words from a 2-byte aligned shared-memory address (reads one word past). */
template <int N> __device__ __forceinline__ void mv_ld_a2(const uint8_t *p, uint32_t (&w)[N]) {
    const uintptr_t a = (uintptr_t)p;
    const uint32_t *q = (const uint32_t *)(a & ~(uintptr_t)3);
    const int sh = (int)(a & 3) * 8;
    uint32_t t[N + 1];
#pragma unroll
    for (int i = 0; i <= N; i++)
        t[i] = q[i];
#pragma unroll
    for (int i = 0; i < N; i++)
        w[i] = __funnelshift_r(t[i], t[i + 1], sh);
}
template <int N> __device__ __forceinline__ void mv_ld_a4(const uint8_t *p, uint32_t (&w)[N]) {
    const uint32_t *q = (const uint32_t *)p;
#pragma unroll
    for (int i = 0; i < N; i++)
        w[i] = q[i];
}

/* acc[r] += (a, b, c, d) . x_r[0..3] for the first nr rows; x rows are ne0 apart. */
template <int NR>
__device__ __forceinline__ void mv_fma4(float (&acc)[NR], const float *xp, int ne0, int nr,
                                        float a, float b, float c, float d) {
#pragma unroll
    for (int r = 0; r < NR; r++)
        if (r == 0 || r < nr) {
            const float4 xv = __ldg((const float4 *)(xp + (size_t)r * ne0));
            float s = acc[r];
            s = fmaf(a, xv.x, s);
            s = fmaf(b, xv.y, s);
            s = fmaf(c, xv.z, s);
            s = fmaf(d, xv.w, s);
            acc[r] = s;
        }
}

/* Sub-block j's 6-bit scale and min of a Q4_K/Q5_K block, without branches on j. */
__device__ __forceinline__ void mv_scale_min_k4(int j, const uint8_t *s, float *sc, float *m) {
    const int j4 = j & 3;
    const int a = s[j4], b = s[j4 + 4], e = s[j4 + 8];
    const bool lo = j < 4;
    *sc = (float)(lo ? (a & 63) : ((e & 0xF) | ((a >> 6) << 4)));
    *m = (float)(lo ? (b & 63) : ((e >> 4) | ((b >> 6) << 4)));
}

/* mvq<T>: BLK values and BYTES bytes per block, UPB units per block, and
 * dot<NR>(block, unit, x at the block's first value, ne0, nr, acc). */
template <int TYPE> struct mvq;

/* Types without a hand-written unit: the shared decoder (4 quant bytes per unit). */
template <int TYPE> struct mvq_generic {
    using Q = kq<TYPE>;
    static constexpr int BLK = Q::BLK, BYTES = Q::BYTES, UPB = Q::UPB;
    template <int NR>
    static __device__ __forceinline__ void dot(const uint8_t *b, int u, const float *xb, int ne0,
                                               int nr, float (&acc)[NR]) {
        float v[Q::G * 4];
        int off[Q::G];
        Q::unit(b, u, v, off);
#pragma unroll
        for (int g = 0; g < Q::G; g++)
            mv_fma4<NR>(acc, xb + off[g], ne0, nr, v[4 * g], v[4 * g + 1], v[4 * g + 2],
                        v[4 * g + 3]);
    }
};
template <> struct mvq<TPI_TYPE_Q4_1> : mvq_generic<TPI_TYPE_Q4_1> {};
template <> struct mvq<TPI_TYPE_Q5_1> : mvq_generic<TPI_TYPE_Q5_1> {};
template <> struct mvq<TPI_TYPE_Q5_K> : mvq_generic<TPI_TYPE_Q5_K> {};
template <> struct mvq<TPI_TYPE_Q3_K> : mvq_generic<TPI_TYPE_Q3_K> {};
template <> struct mvq<KERN_TYPE_Q3_KX8> : mvq_generic<KERN_TYPE_Q3_KX8> {};
template <> struct mvq<TPI_TYPE_Q2_K> : mvq_generic<TPI_TYPE_Q2_K> {};
template <> struct mvq<TPI_TYPE_IQ4_NL> : mvq_generic<TPI_TYPE_IQ4_NL> {};
template <> struct mvq<TPI_TYPE_IQ4_XS> : mvq_generic<TPI_TYPE_IQ4_XS> {};
/* Q6_K's 8-block groups: more units a block than a stage holds, so never staged
 * (matvec_launch); the generic decoder serves the per-row kernel */
template <> struct mvq<KERN_TYPE_Q6_KX8> : mvq_generic<KERN_TYPE_Q6_KX8> {};

/* Q4_0: a unit is a whole block (16 quant bytes, 32 values). */
template <> struct mvq<TPI_TYPE_Q4_0> {
    static constexpr int BLK = 32, BYTES = 18, UPB = 1;
    template <int NR>
    static __device__ __forceinline__ void dot(const uint8_t *b, int, const float *xb, int ne0,
                                               int nr, float (&acc)[NR]) {
        uint32_t w[4];
        mv_ld_a2<4>(b + 2, w);
        block<NR>(w, kq_f16(b), xb, ne0, nr, acc);
    }
    /* one block: its 16 quant bytes w, scale d, x at xb */
    template <int NR>
    static __device__ __forceinline__ void block(const uint32_t (&w)[4], float d, const float *xb,
                                                 int ne0, int nr, float (&acc)[NR]) {
        const float k = 24.0f * d; /* (16 + q) d - 24 d = (q - 8) d */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float lo[4], hi[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                lo[j] = fmaf(d, mv_mag(w[i], 8 * j, 4, 4), -k);
                hi[j] = fmaf(d, mv_mag(w[i], 8 * j + 4, 4, 4), -k);
            }
            mv_fma4<NR>(acc, xb + 4 * i, ne0, nr, lo[0], lo[1], lo[2], lo[3]);
            mv_fma4<NR>(acc, xb + 16 + 4 * i, ne0, nr, hi[0], hi[1], hi[2], hi[3]);
        }
    }
};

/* Q4_0 in groups of 8 blocks (KERN_LAYOUT_Q4_0X8): unit u = block u, its 16 quant bytes at
 * b + 16u, its scale at b + 128 + 2u. */
template <> struct mvq<KERN_TYPE_Q4_0X8> {
    static constexpr int BLK = 256, BYTES = KERN_Q4_0X8_BYTES, UPB = 8;
    template <int NR>
    static __device__ __forceinline__ void dot(const uint8_t *b, int u, const float *xb, int ne0,
                                               int nr, float (&acc)[NR]) {
        uint32_t w[4];
#pragma unroll
        for (int i = 0; i < 4; i++)
            w[i] = kq_u32_a4(b + 16 * u + 4 * i);
        mvq<TPI_TYPE_Q4_0>::block<NR>(w, kq_f16(b + 128 + 2 * u), xb + 32 * u, ne0, nr, acc);
    }
};

/* Q5_0: a unit is a whole block; the fifth bit of value j is qh bit j. */
template <> struct mvq<TPI_TYPE_Q5_0> {
    static constexpr int BLK = 32, BYTES = 22, UPB = 1;
    template <int NR>
    static __device__ __forceinline__ void dot(const uint8_t *b, int, const float *xb, int ne0,
                                               int nr, float (&acc)[NR]) {
        const float d = kq_f16(b), k = 48.0f * d; /* (32 + q) d - 48 d = (q - 16) d */
        uint32_t h[1], w[4];
        mv_ld_a2<1>(b + 2, h);
        mv_ld_a2<4>(b + 6, w);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float lo[4], hi[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int e = 4 * i + j; /* element index of the low nibble */
                const uint32_t hl = mv_sh(h[0], 22 - e) & 0x00400000u;
                const uint32_t hh = mv_sh(h[0], 22 - (e + 16)) & 0x00400000u;
                lo[j] = fmaf(d, __uint_as_float(__float_as_uint(mv_mag(w[i], 8 * j, 4, 5)) | hl),
                             -k);
                hi[j] = fmaf(
                    d, __uint_as_float(__float_as_uint(mv_mag(w[i], 8 * j + 4, 4, 5)) | hh), -k);
            }
            mv_fma4<NR>(acc, xb + 4 * i, ne0, nr, lo[0], lo[1], lo[2], lo[3]);
            mv_fma4<NR>(acc, xb + 16 + 4 * i, ne0, nr, hi[0], hi[1], hi[2], hi[3]);
        }
    }
};

/* 16 int8 weights (w) with scale d against the 16 x values at x16 of each x row: q + 128
 * is taken as unsigned, (256 + q + 128) d - 384 d = q d. */
template <int NR>
__device__ __forceinline__ void mv_q8_unit(const uint32_t (&w)[4], float d, const float *x16,
                                           int ne0, int nr, float (&acc)[NR]) {
    const float k = 384.0f * d;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint32_t ww = w[i] ^ 0x80808080u;
        float v[4];
#pragma unroll
        for (int j = 0; j < 4; j++)
            v[j] = fmaf(d, mv_mag(ww, 8 * j, 8, 8), -k);
        mv_fma4<NR>(acc, x16 + 4 * i, ne0, nr, v[0], v[1], v[2], v[3]);
    }
}

/* Q8_0: a unit is half a block (16 int8 values). */
template <> struct mvq<TPI_TYPE_Q8_0> {
    static constexpr int BLK = 32, BYTES = 34, UPB = 2;
    template <int NR>
    static __device__ __forceinline__ void dot(const uint8_t *b, int u, const float *xb, int ne0,
                                               int nr, float (&acc)[NR]) {
        const float d = kq_f16(b);
        uint32_t w[4];
        mv_ld_a2<4>(b + 2 + 16 * u, w);
        mv_q8_unit<NR>(w, d, xb + 16 * u, ne0, nr, acc);
    }
};

/* Q8_0 in groups of 8 blocks (KERN_LAYOUT_Q8_0X8): unit u = the 16 int8 at b + 16u, the
 * scale of block u/2 at b + 256 + u/2 * 2. */
template <> struct mvq<KERN_TYPE_Q8_0X8> {
    static constexpr int BLK = 256, BYTES = KERN_Q8_0X8_BYTES, UPB = 16;
    template <int NR>
    static __device__ __forceinline__ void dot(const uint8_t *b, int u, const float *xb, int ne0,
                                               int nr, float (&acc)[NR]) {
        const float d = kq_f16(b + 256 + 2 * (u >> 1));
        uint32_t w[4];
#pragma unroll
        for (int i = 0; i < 4; i++)
            w[i] = kq_u32_a4(b + 16 * u + 4 * i);
        mv_q8_unit<NR>(w, d, xb + 16 * u, ne0, nr, acc);
    }
};

/* Q4_K: a unit is 16 quant bytes (16 low nibbles of sub-block 2c, 16 high of 2c+1). */
template <> struct mvq<TPI_TYPE_Q4_K> {
    static constexpr int BLK = 256, BYTES = 144, UPB = 8;
    template <int NR>
    static __device__ __forceinline__ void dot(const uint8_t *b, int u, const float *xb, int ne0,
                                               int nr, float (&acc)[NR]) {
        const float d = kq_f16(b), dmin = kq_f16(b + 2);
        const int c = u >> 1, l0 = (u & 1) * 16;
        float sc0, m0, sc1, m1;
        mv_scale_min_k4(2 * c, b + 4, &sc0, &m0);
        mv_scale_min_k4(2 * c + 1, b + 4, &sc1, &m1);
        const float d0 = d * sc0, d1 = d * sc1;
        const float k0 = fmaf(16.0f, d0, dmin * m0), k1 = fmaf(16.0f, d1, dmin * m1);
        uint32_t w[4];
        mv_ld_a4<4>(b + 16 + 32 * c + l0, w);
        const float *xl = xb + 64 * c + l0, *xh = xl + 32;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float lo[4], hi[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                lo[j] = fmaf(d0, mv_mag(w[i], 8 * j, 4, 4), -k0);
                hi[j] = fmaf(d1, mv_mag(w[i], 8 * j + 4, 4, 4), -k1);
            }
            mv_fma4<NR>(acc, xl + 4 * i, ne0, nr, lo[0], lo[1], lo[2], lo[3]);
            mv_fma4<NR>(acc, xh + 4 * i, ne0, nr, hi[0], hi[1], hi[2], hi[3]);
        }
    }
};

/* Q6_K: a unit is 8 positions l of one 128-value half n: values l, l+32, l+64, l+96. */
template <> struct mvq<TPI_TYPE_Q6_K> {
    static constexpr int BLK = 256, BYTES = 210, UPB = 8;
    template <int NR>
    static __device__ __forceinline__ void dot(const uint8_t *b, int u, const float *xb, int ne0,
                                               int nr, float (&acc)[NR]) {
        const int n = u >> 2, l0 = (u & 3) * 8;
        const uint8_t *ql = b + 64 * n, *qh = b + 128 + 32 * n;
        const int8_t *sc = (const int8_t *)(b + 192 + 8 * n);
        const float d = kq_f16(b + 208);
        const int is = l0 / 16;
        float s[4], k[4];
#pragma unroll
        for (int g = 0; g < 4; g++) {
            s[g] = d * (float)sc[is + 2 * g];
            k[g] = 96.0f * s[g]; /* (64 + q) s - 96 s = (q - 32) s */
        }
        uint32_t A[2], C[2], H[2];
        mv_ld_a2<2>(ql + l0, A);
        mv_ld_a2<2>(ql + 32 + l0, C);
        mv_ld_a2<2>(qh + l0, H);
        const float *xp = xb + 128 * n + l0;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            uint32_t q[4];
            q[0] = (A[i] & 0x0F0F0F0Fu) | ((H[i] & 0x03030303u) << 4);
            q[1] = (C[i] & 0x0F0F0F0Fu) | ((H[i] & 0x0C0C0C0Cu) << 2);
            q[2] = ((A[i] >> 4) & 0x0F0F0F0Fu) | (H[i] & 0x30303030u);
            q[3] = ((C[i] >> 4) & 0x0F0F0F0Fu) | ((H[i] & 0xC0C0C0C0u) >> 2);
#pragma unroll
            for (int g = 0; g < 4; g++) {
                float v[4];
#pragma unroll
                for (int j = 0; j < 4; j++)
                    v[j] = fmaf(s[g], mv_mag(q[g], 8 * j, 6, 6), -k[g]);
                mv_fma4<NR>(acc, xp + 32 * g + 4 * i, ne0, nr, v[0], v[1], v[2], v[3]);
            }
        }
    }
};

/* Element types: a "block" is one unit of 16 bytes (8 halves or 4 floats). */
template <> struct mvq<TPI_TYPE_F16> {
    static constexpr int BLK = 8, BYTES = 16, UPB = 1;
    template <int NR>
    static __device__ __forceinline__ void dot(const uint8_t *b, int, const float *xb, int ne0,
                                               int nr, float (&acc)[NR]) {
        const uint4 w = *(const uint4 *)b;
        const float2 a = __half22float2(*(const __half2 *)&w.x), c = __half22float2(*(const __half2 *)&w.y);
        const float2 e = __half22float2(*(const __half2 *)&w.z), f = __half22float2(*(const __half2 *)&w.w);
        mv_fma4<NR>(acc, xb, ne0, nr, a.x, a.y, c.x, c.y);
        mv_fma4<NR>(acc, xb + 4, ne0, nr, e.x, e.y, f.x, f.y);
    }
};
template <> struct mvq<TPI_TYPE_BF16> {
    static constexpr int BLK = 8, BYTES = 16, UPB = 1;
    static __device__ __forceinline__ float lo(uint32_t v) { return __uint_as_float(v << 16); }
    static __device__ __forceinline__ float hi(uint32_t v) { return __uint_as_float(v & 0xFFFF0000u); }
    template <int NR>
    static __device__ __forceinline__ void dot(const uint8_t *b, int, const float *xb, int ne0,
                                               int nr, float (&acc)[NR]) {
        const uint4 w = *(const uint4 *)b;
        mv_fma4<NR>(acc, xb, ne0, nr, lo(w.x), hi(w.x), lo(w.y), hi(w.y));
        mv_fma4<NR>(acc, xb + 4, ne0, nr, lo(w.z), hi(w.z), lo(w.w), hi(w.w));
    }
};
template <> struct mvq<TPI_TYPE_F32> {
    static constexpr int BLK = 4, BYTES = 16, UPB = 1;
    template <int NR>
    static __device__ __forceinline__ void dot(const uint8_t *b, int, const float *xb, int ne0,
                                               int nr, float (&acc)[NR]) {
        const float4 w = *(const float4 *)b;
        mv_fma4<NR>(acc, xb, ne0, nr, w.x, w.y, w.z, w.w);
    }
};

/* Shared-memory bytes of one feature's stage: the window may start up to 14 bytes
 * before the stage and end 15 after it; mv_ld_a2 reads one word past the end. */
template <int TYPE> struct mv_shape {
    /* blocks per feature per stage (0: a block has more units than a stage: not staged) */
    static constexpr int SB = MV_UNITS / mvq<TYPE>::UPB;
    static constexpr int FB = (SB * mvq<TYPE>::BYTES + 30 + 4 + 15) / 16 * 16;
    static constexpr size_t SMEM = (size_t)MV_WARPS * 2 * MV_FEATS * FB;
};

template <int TYPE, int NR>
__global__ void __launch_bounds__(MV_WARPS * 32)
    mv_staged_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int ne0, int ne1,
                     const float *__restrict__ x, float *__restrict__ y, int nr, int wpf) {
    using Q = mvq<TYPE>;
    constexpr int SB = mv_shape<TYPE>::SB, FB = mv_shape<TYPE>::FB, PIECES = FB / 16;
    extern __shared__ uint4 mv_smem[];
    __shared__ float red[MV_WARPS][MV_FEATS][NR];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int grp = blockIdx.x * (MV_WARPS / wpf) + warp / wpf, wi = warp % wpf;
    const int f0 = grp * MV_FEATS;
    const int fi = lane >> 3, ul = lane & 7;
    const int nb = ne0 / Q::BLK, n_stage = (nb + SB - 1) / SB;
    uint8_t *buf = (uint8_t *)mv_smem + (size_t)warp * 2 * MV_FEATS * FB;
    const bool active = f0 < ne1;
    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; r++)
        acc[r] = 0.0f;

    if (active) {
        /* issue the copies of stage s into dst (one commit group) */
        auto issue = [&](int s, uint8_t *dst) {
            const int nbk = min(SB, nb - s * SB);
            for (int i = lane; i < MV_FEATS * PIECES; i += 32) {
                const int f = i / PIECES, p = i % PIECES;
                const int64_t row = min(f0 + f, ne1 - 1);
                const uintptr_t g0 = (uintptr_t)(w + row * row_bytes + (size_t)s * SB * Q::BYTES);
                const uintptr_t a = (g0 & ~(uintptr_t)15) + 16 * (uintptr_t)p;
                if (a < g0 + (uintptr_t)nbk * Q::BYTES) mv_cp16(dst + f * FB + 16 * p, (const void *)a);
            }
            mv_commit();
        };
        const int64_t my_row = min(f0 + fi, ne1 - 1);
        int k = 0;
        if (wi < n_stage) issue(wi, buf);
        for (int s = wi; s < n_stage; s += wpf, k ^= 1) {
            if (s + wpf < n_stage) {
                issue(s + wpf, buf + (k ^ 1) * MV_FEATS * FB);
                mv_wait<1>();
            } else {
                mv_wait<0>();
            }
            __syncwarp();
            const uintptr_t g0 = (uintptr_t)(w + my_row * row_bytes + (size_t)s * SB * Q::BYTES);
            const uint8_t *sb = buf + k * MV_FEATS * FB + fi * FB + (g0 & 15);
            const int n_units = min(SB, nb - s * SB) * Q::UPB;
            const float *xs = x + (size_t)s * SB * Q::BLK;
#pragma unroll
            for (int j = 0; j < MV_UNITS / 8; j++) {
                const int u = ul + 8 * j;
                if (u < n_units) {
                    const int blk = u / Q::UPB;
                    Q::template dot<NR>(sb + blk * Q::BYTES, u % Q::UPB, xs + blk * Q::BLK, ne0,
                                        nr, acc);
                }
            }
            __syncwarp(); /* the buffer is refilled two stages later */
        }
    }
#pragma unroll
    for (int r = 0; r < NR; r++) {
        float v = acc[r];
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        v += __shfl_xor_sync(0xffffffffu, v, 2);
        v += __shfl_xor_sync(0xffffffffu, v, 4);
        acc[r] = v;
    }
    const int feat = f0 + fi;
    if (wpf == 1) {
        if (active && ul == 0 && feat < ne1)
#pragma unroll
            for (int r = 0; r < NR; r++)
                if (r < nr) y[(size_t)r * ne1 + feat] = acc[r];
        return;
    }
    if (ul == 0)
#pragma unroll
        for (int r = 0; r < NR; r++)
            red[warp][fi][r] = acc[r];
    __syncthreads();
    if (wi == 0 && ul == 0 && active && feat < ne1)
#pragma unroll
        for (int r = 0; r < NR; r++)
            if (r < nr) {
                float s = 0.0f;
                for (int w2 = 0; w2 < wpf; w2++)
                    s += red[warp + w2][fi][r];
                y[(size_t)r * ne1 + feat] = s;
            }
}

/* ---------------------------------------------------------------- launchers */

/* Warps per feature group: split the rows' stages until the grid has enough warps. */
static int mv_wpf(const struct ops_ctx *ctx, int64_t ne1, int n_stage) {
    const int64_t groups = (ne1 + MV_FEATS - 1) / MV_FEATS;
    int wpf = 1;
    while (wpf < MV_WARPS && groups * wpf < (int64_t)ctx->n_sm * 8 && 2 * wpf <= n_stage)
        wpf *= 2;
    return wpf;
}

template <int NR>
static void matvec_launch(struct ops_ctx *ctx, const struct tpi_weight *w, const float *x, float *y,
                          int n_rows) {
    const unsigned blocks = (unsigned)((w->ne1 + MATVEC_WARPS - 1) / MATVEC_WARPS);
    const uint8_t *data = (const uint8_t *)w->data;
    /* the staged kernels need float4 x rows and whole 16-byte element units */
    const bool x_ok = ((uintptr_t)x & 15) == 0 && w->ne0 % 4 == 0;
    kq_dispatch(kern_wtype(w), [&](auto type_c, auto block_c) {
        constexpr int T = decltype(type_c)::value;
        if constexpr (mv_shape<T>::SB > 0) {
            if (x_ok && w->ne0 % mvq<T>::BLK == 0) {
                using S = mv_shape<T>;
                const int n_stage = (int)((w->ne0 / mvq<T>::BLK + S::SB - 1) / S::SB);
                const int wpf = mv_wpf(ctx, w->ne1, n_stage);
                const int64_t groups = (w->ne1 + MV_FEATS - 1) / MV_FEATS;
                const int64_t gpb = MV_WARPS / wpf;
                mv_staged_kernel<T, NR><<<(unsigned)((groups + gpb - 1) / gpb), MV_WARPS * 32,
                                          S::SMEM, ctx->stream>>>(
                    data, w->row_bytes, (int)w->ne0, (int)w->ne1, x, y, n_rows, wpf);
                return;
            }
        }
        if constexpr (decltype(block_c)::value)
            matvec_block_kernel<T, NR><<<blocks, MATVEC_WARPS * 32, 0, ctx->stream>>>(
                data, w->row_bytes, w->ne0, w->ne1, x, y, n_rows);
        else
            matvec_elem_kernel<T, NR><<<blocks, MATVEC_WARPS * 32, 0, ctx->stream>>>(
                data, w->row_bytes, w->ne0, w->ne1, x, y, n_rows);
    });
}

/* x16: x already in bf16 (shared by several weights), or NULL: converted here. beta 1
 * adds the product to y (matmul_add), 0 overwrites it. */
static void gemm_launch_h(struct ops_ctx *ctx, cublasHandle_t h, const struct tpi_weight *w,
                          const float *x, const __nv_bfloat16 *x16_in, float *y, int64_t n_rows,
                          float beta) {
    const char *op = "cuda matmul";
    const float one = 1.0f;
    const int k = (int)w->ne0, n = (int)n_rows, ldc = (int)w->ne1;
    if (w->type == TPI_TYPE_F32) {
        /* plain f32 SGEMM: F32 weights are small (and tests use them as the exact case) */
        CUBLAS_OK(ctx, op,
                  cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, ldc, n, k, &one, w->data,
                               CUDA_R_32F, k, x, CUDA_R_32F, k, &beta, y, CUDA_R_32F, ldc,
                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return;
    }
    const __nv_bfloat16 *x16 = x16_in;
    if (h == ctx->cublas && kern_mmq(ctx, w, x, &x16, y, n_rows, beta)) return;
    if (!x16) {
        __nv_bfloat16 *t = (__nv_bfloat16 *)kern_scratch_get(
            ctx, &ctx->x16, (size_t)n_rows * (size_t)w->ne0 * sizeof(__nv_bfloat16), op);
        if (!t) return;
        kern_f32_to_bf16(ctx, x, t, n_rows * w->ne0);
        x16 = t;
    }
    if (w->type == TPI_TYPE_BF16) {
        CUBLAS_OK(ctx, op,
                  cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, ldc, n, k, &one, w->data,
                               CUDA_R_16BF, k, x16, CUDA_R_16BF, k, &beta, y, CUDA_R_32F, ldc,
                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return;
    }
    int64_t slab = GEMM_SLAB_ELEMS / w->ne0;
    if (slab < 1) slab = 1;
    if (slab > w->ne1) slab = w->ne1;
    __nv_bfloat16 *w16 = (__nv_bfloat16 *)kern_scratch_get(
        ctx, &ctx->w16, (size_t)slab * (size_t)w->ne0 * sizeof(__nv_bfloat16), op);
    if (!w16) return;
    for (int64_t r0 = 0; r0 < w->ne1; r0 += slab) {
        const int m = (int)TPI_MIN(slab, w->ne1 - r0);
        kern_dequant_bf16(ctx, w, r0, m, w16);
        if (!CUBLAS_OK(ctx, op,
                       cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, w16,
                                    CUDA_R_16BF, k, x16, CUDA_R_16BF, k, &beta, y + r0, CUDA_R_32F,
                                    ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)))
            return;
    }
}

/* Whether w can be multiplied here (type with kernels, 32-bit sizes); records why not. */
/* gemm_launch_h on the main stream's handle. */
static void gemm_launch(struct ops_ctx *ctx, const struct tpi_weight *w, const float *x,
                        const __nv_bfloat16 *x16_in, float *y, int64_t n_rows, float beta) {
    gemm_launch_h(ctx, ctx->cublas, w, x, x16_in, y, n_rows, beta);
}

static bool matmul_ok(struct ops_ctx *ctx, const struct tpi_weight *w, int64_t n_rows,
                      const char *op) {
    if (!kern_type_supported(w->type)) {
        kern_fail(ctx, TPI_ERR_UNSUPPORTED, op, __FILE__, __LINE__,
                  "weight type %s has no CUDA kernel", quant_type_name(w->type));
        return false;
    }
    if (w->ne0 > INT32_MAX || w->ne1 > INT32_MAX || n_rows > INT32_MAX) {
        kern_fail(ctx, TPI_ERR_INVALID, op, __FILE__, __LINE__,
                  "shape %lld x %lld with %lld rows exceeds 32-bit sizes", (long long)w->ne0,
                  (long long)w->ne1, (long long)n_rows);
        return false;
    }
    return true;
}

static bool gemv_x_for(struct ops_ctx *ctx, const struct tpi_weight *const *ws, int n_w,
                       const float *x, int n_rows, struct kern_gemv_x *gx);
static void xq_written(struct ops_ctx *ctx, const float *y, int64_t n_vals);

void kern_matmul(struct ops_ctx *ctx, const struct tpi_weight *w, const float *x, float *y,
                 int64_t n_rows) {
    if (n_rows <= 0 || w->ne1 <= 0) return;
    if (!matmul_ok(ctx, w, n_rows, "cuda matmul")) return;
    if (n_rows <= MATVEC_MAX_ROWS && ctx->gemv == 3) {
        struct kern_gemv_x gx;
        if (gemv_x_for(ctx, &w, 1, x, (int)n_rows, &gx) &&
            kern_gemv_v3_run(ctx, w, &gx, y, false, ctx->stream)) {
            LAUNCH_OK(ctx, "cuda matmul (matvec v3)");
            xq_written(ctx, y, n_rows * w->ne1);
            return;
        }
    }
    xq_written(ctx, y, n_rows * w->ne1); /* the paths below write y */
    if (n_rows <= MATVEC_MAX_ROWS) {
        /* NR rounds up to 1, 2, 4, 8: the guards skip the unused rows */
        if (n_rows == 1)
            matvec_launch<1>(ctx, w, x, y, 1);
        else if (n_rows == 2)
            matvec_launch<2>(ctx, w, x, y, 2);
        else if (n_rows <= 4)
            matvec_launch<4>(ctx, w, x, y, (int)n_rows);
        else
            matvec_launch<8>(ctx, w, x, y, (int)n_rows);
        LAUNCH_OK(ctx, "cuda matmul (matvec)");
        return;
    }
    gemm_launch(ctx, w, x, NULL, y, n_rows, 0.0f);
}

/* ---------------------------------------------------------------- fused forms */

static bool is_elem16(int type) {
    return type == TPI_TYPE_BF16 || type == TPI_TYPE_F16;
}

/* ---- the x-quantization memo ----
 * Decode steps quantize each matmul's x to int8 blocks (kern_gemv.cu). The memo records
 * which f32 activation the q8 scratch holds in that form, so the weights sharing an x
 * (Q/K/V, gate/up), and an x whose producer wrote its int8 form itself (rmsnorm,
 * silu_mul, the decode attention of kern_attn_mma.cu), skip the quantization launch. It
 * is host state consulted while ops are queued, so a recorded graph replays the same
 * decisions. Any op other than the matmuls forgets it on entry (ops_cuda.cu's table
 * wraps them), and a matmul whose output overlaps the remembered x forgets it after
 * queueing. */
#define XQ_MAX_VALS ((int64_t)1 << 18) /* decode sizes only: 8 rows of 32768 */

void kern_xq_forget(struct ops_ctx *ctx) {
    ctx->xq_memo.valid = false;
    ctx->xp_memo.forms = 0;
    ctx->gemv_prefetch = false; /* only the launch right after the attention takes it */
    ctx->after_attn = false;
}

bool kern_xq_claim(struct ops_ctx *ctx, int by, int64_t n_rows, int64_t ne0, int8_t **xq,
                   float2 **ds) {
    return kern_xq_claim_in(ctx, &ctx->q8, by, n_rows, ne0, xq, ds);
}

bool kern_xq_claim_in(struct ops_ctx *ctx, struct kern_scratch *sc, int by, int64_t n_rows,
                      int64_t ne0, int8_t **xq, float2 **ds) {
    ctx->xq_memo.valid = false;
    const int64_t n_vals = n_rows * ne0;
    /* only the matrix-vector path (up to MATVEC_MAX_ROWS rows) reads the int8 form */
    if (!(ctx->xq_produce & by) || !ctx->xq_quant_seen || ctx->gemv != 3 || n_rows < 1 ||
        n_rows > MATVEC_MAX_ROWS || ne0 <= 0 || ne0 % 32 != 0 || n_vals > XQ_MAX_VALS)
        return false;
    /* kern_gemv_v3_prepare's layout (kern_xq.cuh), permuted copies included */
    const gv_xlayout lay = gv_xlayout_of((int)n_rows, ne0);
    uint8_t *s = (uint8_t *)kern_scratch_get(ctx, sc, lay.n_bytes, "cuda x quantization");
    if (!s) return false;
    *xq = (int8_t *)s;
    *ds = (float2 *)(s + lay.ds_off);
    ctx->xq_memo.xq = *xq;
    ctx->xq_memo.ds = *ds;
    ctx->xq_memo.xp = (const int8_t *)(s + lay.b32_off);
    ctx->xq_memo.ne0 = ne0;
    return true;
}

void kern_xq_remember(struct ops_ctx *ctx, const float *x, int64_t n_vals) {
    ctx->xq_memo.x = x;
    ctx->xq_memo.n_vals = n_vals;
    ctx->xq_memo.valid = true;
}

__nv_bfloat16 *kern_xp_claim(struct ops_ctx *ctx, int64_t n_rows, int64_t n_vals, int *forms) {
    ctx->xp_memo.forms = 0;
    *forms = ctx->xp_produce & ctx->xp_seen;
    /* only kern_mmq's raw kernels read them, at 9..32 rows */
    if (!*forms || n_rows <= MATVEC_MAX_ROWS || n_rows > 32 || n_rows > ctx->mmq_rows ||
        n_vals <= 0 || n_vals % 256 != 0)
        return NULL;
    const size_t n = (size_t)n_vals * ((*forms & MMQ_RAW_Q6_KX8) ? 2 : 1);
    return (__nv_bfloat16 *)kern_scratch_get(ctx, &ctx->mmq_xp_buf, n * sizeof(__nv_bfloat16),
                                             "cuda x to bf16 (mmq order)");
}

void kern_xp_remember(struct ops_ctx *ctx, const float *x, int64_t n_vals, int forms) {
    ctx->xp_memo.x = x;
    ctx->xp_memo.n_vals = n_vals;
    ctx->xp_memo.xp = ctx->mmq_xp_buf.p;
    ctx->xp_memo.forms = forms;
}

const __nv_bfloat16 *kern_xp_held(struct ops_ctx *ctx, const float *x, int64_t n_vals, int form) {
    if (!(ctx->xp_memo.forms & form) || ctx->xp_memo.x != x || ctx->xp_memo.n_vals != n_vals ||
        ctx->xp_memo.xp != ctx->mmq_xp_buf.p)
        return NULL;
    const __nv_bfloat16 *p = (const __nv_bfloat16 *)ctx->mmq_xp_buf.p;
    return form == MMQ_RAW_Q6_KX8 ? p + n_vals : p;
}

/* ops.h (tests): the forms (MMQ_RAW_* bits) of x (n_vals values) in kern_mmq's staging
 * orders held for the next 9..32-row raw product of x. */
extern "C" int ops_cuda_xp_memo_forms(struct ops_ctx *ctx, const float *x, int64_t n_vals) {
    if (!ctx) return 0;
    return (kern_xp_held(ctx, x, n_vals, MMQ_RAW_Q4_K) ? MMQ_RAW_Q4_K : 0) |
           (kern_xp_held(ctx, x, n_vals, MMQ_RAW_Q6_KX8) ? MMQ_RAW_Q6_KX8 : 0);
}

/* ops.h (tests): whether the next matmul of x (n_vals values) finds its int8 form here. */
extern "C" bool ops_cuda_xq_memo_holds(struct ops_ctx *ctx, const float *x, int64_t n_vals) {
    return ctx && ctx->xq_memo.valid && ctx->xq_memo.x == x && ctx->xq_memo.n_vals == n_vals;
}

/* After queueing a write of y(n_vals): the memo no longer describes an overwritten x. */
static void xq_written(struct ops_ctx *ctx, const float *y, int64_t n_vals) {
    const float *mx = ctx->xq_memo.x;
    if (ctx->xq_memo.valid && y < mx + ctx->xq_memo.n_vals && mx < y + n_vals)
        ctx->xq_memo.valid = false;
    const float *px = ctx->xp_memo.x;
    if (ctx->xp_memo.forms && y < px + ctx->xp_memo.n_vals && px < y + n_vals)
        ctx->xp_memo.forms = 0;
}

/* x for the v3 path of these weights: BF16/F16 weights read the f32 x directly; for
 * quantized ones the memo's int8 form when it holds this x, else x quantized now (and
 * remembered). */
static bool gemv_x_for(struct ops_ctx *ctx, const struct tpi_weight *const *ws, int n_w,
                       const float *x, int n_rows, struct kern_gemv_x *gx) {
    bool all_elem = true;
    for (int i = 0; i < n_w; i++)
        all_elem = all_elem && is_elem16(ws[i]->type);
    const int64_t ne0 = ws[0]->ne0, n_vals = (int64_t)n_rows * ne0;
    if (all_elem) {
        *gx = (struct kern_gemv_x){x, NULL, NULL, n_rows, ne0};
        return true;
    }
    const bool hit = ctx->xq_memo.valid && ctx->xq_memo.x == x && ctx->xq_memo.n_vals == n_vals;
    if (hit && n_rows >= 1 && n_rows <= MATVEC_MAX_ROWS && ne0 % 32 == 0) {
        /* the permuted copies serve only rows of the length they were laid out for */
        *gx = (struct kern_gemv_x){x, ctx->xq_memo.xq, ctx->xq_memo.ds, n_rows, ne0,
                                   ctx->xq_memo.ne0 == ne0 ? ctx->xq_memo.xp : NULL};
        return true;
    }
    ctx->xq_memo.valid = false;
    ctx->xq_quant_seen = true; /* from now on, producers' int8 x has a reader */
    if (!kern_gemv_v3_prepare(ctx, x, n_rows, ne0, ctx->stream, gx)) return false;
    ctx->xq_memo.xq = gx->xq;
    ctx->xq_memo.ds = gx->ds;
    ctx->xq_memo.xp = gx->xp;
    ctx->xq_memo.ne0 = ne0;
    kern_xq_remember(ctx, x, n_vals);
    return true;
}

/* matmul_n, TPI_GEMV_MERGE auto: quantized weights of rows up to this many bytes all
 * share one decode launch (Q4_K's 4096-value rows, 2304 bytes: tg128 Q4_K_M +4 %; Q8_0's
 * 4352 were 2-3 % slower that way; bench/NOTES.md change 16), and so do BF16/F16
 * weights of any row length: their several-weight kernel needs 38 registers where the
 * one-weight kernel has 32, which made it the slower form while their weights went
 * through L1 (tg128 208-210 as branches), and the faster one since they do not (change
 * 29: 224.3 as branches, 225.8 in one launch). */
#define GEMV_MERGE_ROW_BYTES 4096

void kern_matmul_n(struct ops_ctx *ctx, int n_w, const struct tpi_weight *const *ws, const float *x,
                   float *const *ys, int64_t n_rows) {
    const char *op = "cuda matmul_n";
    if (n_w < 0 || n_w > OPS_MAX_FUSED) {
        kern_fail(ctx, TPI_ERR_INVALID, op, __FILE__, __LINE__, "%d weights (at most %d)", n_w,
                  OPS_MAX_FUSED);
        return;
    }
    if (n_rows <= 0 || n_w == 0) return;
    for (int i = 0; i < n_w; i++) {
        if (!matmul_ok(ctx, ws[i], n_rows, op)) return;
        if (ws[i]->ne0 != ws[0]->ne0) {
            kern_fail(ctx, TPI_ERR_INVALID, op, __FILE__, __LINE__,
                      "weight %d has %lld inputs, weight 0 %lld", i, (long long)ws[i]->ne0,
                      (long long)ws[0]->ne0);
            return;
        }
    }
    bool done[OPS_MAX_FUSED] = {false};
    struct kern_gemv_x gx;
    if (n_rows <= MATVEC_MAX_ROWS && ctx->gemv == 3 && gemv_x_for(ctx, ws, n_w, x, (int)n_rows, &gx)) {
        /* one x for all. Weight 0 and the weights that join its launch (gemv_merge, of its
         * type and row length) in one launch on the main stream; each other weight on the
         * main stream (if still free) or a side stream that forks from it and joins it
         * again (recorded into graphs as parallel branches). A small weight costs less as
         * part of a big launch than as a launch of its own; weights of similar size
         * overlap well as branches, except short rows (a warp's work is little more than
         * its launch and one round trip), which measured faster in one launch too */
        bool main_busy = false;
        const bool fork = n_w > 1 && ctx->side[0];
        if (fork && !CUDA_OK(ctx, op, cudaEventRecord(ctx->ev_fork, ctx->stream))) return;
        /* Q4_K's and Q6_K's weights together (Q/K/V where V has more bits), one launch that
         * lets the next kernel in at its start as the one-type launch below does (a Q6_K
         * branch's join held the attention back to the branch's end: bench/NOTES.md
         * change 106) */
        ctx->gemv_trigger = ctx->qkv_trigger;
        const bool mixed = n_w > 1 && ctx->gemv_merge && ctx->gemv_mix && n_rows == 1 &&
                           kern_gemv_v3_run_mix(ctx, n_w, ws, &gx, ys, ctx->gemv_mix, ctx->stream);
        ctx->gemv_trigger = false;
        if (mixed) {
            if (!LAUNCH_OK(ctx, op)) return;
            for (int k = 0; k < n_w; k++)
                done[k] = true;
            main_busy = true;
        }
        if (n_w > 1 && ctx->gemv_merge && !main_busy) {
            const struct tpi_weight *mw[OPS_MAX_FUSED];
            float *my[OPS_MAX_FUSED];
            int idx[OPS_MAX_FUSED], n_m = 0;
            const bool all = ctx->gemv_merge == 2 ||
                             (ctx->gemv_merge == 1 && (ws[0]->row_bytes <= GEMV_MERGE_ROW_BYTES ||
                                                       is_elem16(ws[0]->type)));
            for (int i = 0; i < n_w; i++)
                if (i == 0 || (kern_wtype(ws[i]) == kern_wtype(ws[0]) && ws[i]->row_bytes == ws[0]->row_bytes &&
                               (all || 2 * ws[i]->ne1 <= ws[0]->ne1)))
                    mw[n_m] = ws[i], my[n_m] = ys[i], idx[n_m++] = i;
            /* the next kernel (the attention, or rope) may launch at this one's start:
             * its work before the wait overlaps this launch (bench/NOTES.md change 85) */
            ctx->gemv_trigger = ctx->qkv_trigger;
            const bool ran = n_m > 1 && kern_gemv_v3_run_n(ctx, n_m, mw, &gx, my, ctx->stream);
            ctx->gemv_trigger = false;
            if (ran) {
                if (!LAUNCH_OK(ctx, op)) return;
                for (int k = 0; k < n_m; k++)
                    done[idx[k]] = true;
                main_busy = true;
            }
        }
        int n_side = 0;
        for (int i = 0; i < n_w; i++) {
            if (done[i]) continue;
            cudaStream_t st = ctx->stream;
            if (main_busy && fork) {
                st = ctx->side[n_side++];
                if (!CUDA_OK(ctx, op, cudaStreamWaitEvent(st, ctx->ev_fork, 0))) return;
            }
            main_busy = true;
            done[i] = kern_gemv_v3_run(ctx, ws[i], &gx, ys[i], false, st);
            if (!LAUNCH_OK(ctx, op)) return;
            if (st != ctx->stream &&
                (!CUDA_OK(ctx, op, cudaEventRecord(ctx->ev_join[n_side - 1], st)) ||
                 !CUDA_OK(ctx, op, cudaStreamWaitEvent(ctx->stream, ctx->ev_join[n_side - 1], 0))))
                return;
        }
    } else if (n_rows > MATVEC_MAX_ROWS) {
        /* prefill: x rounded to bf16 once for every weight that reads it so (kern_mmq makes
         * it on the first need; its raw kernels read their own permuted form instead).
         * Block-quantized weights of one type and row length (Q/K/V, gate/up) in one
         * kern_mmq launch when it takes this row count */
        const __nv_bfloat16 *x16 = NULL;
        for (int i = 0; i < n_w; i++) {
            if (done[i] || ws[i]->type == TPI_TYPE_F32 || ws[i]->type == TPI_TYPE_BF16) continue;
            const struct tpi_weight *gw[OPS_MAX_FUSED];
            float *gy[OPS_MAX_FUSED];
            int idx[OPS_MAX_FUSED], n = 0;
            for (int j = i; j < n_w && n < MMQ_MAX_W; j++)
                if (!done[j] && kern_wtype(ws[j]) == kern_wtype(ws[i]) &&
                    ws[j]->row_bytes == ws[i]->row_bytes)
                    gw[n] = ws[j], gy[n] = ys[j], idx[n++] = j;
            if (kern_mmq_n(ctx, n, gw, x, &x16, gy, n_rows, 0.0f)) {
                if (!LAUNCH_OK(ctx, op)) return;
                for (int k = 0; k < n; k++)
                    done[idx[k]] = true;
            }
        }
        bool any16 = false;
        for (int i = 0; i < n_w; i++)
            any16 = any16 || (!done[i] && ws[i]->type != TPI_TYPE_F32);
        if (any16 && !x16) {
            __nv_bfloat16 *t = (__nv_bfloat16 *)kern_scratch_get(
                ctx, &ctx->x16, (size_t)n_rows * (size_t)ws[0]->ne0 * sizeof(__nv_bfloat16), op);
            if (!t) return;
            kern_f32_to_bf16(ctx, x, t, n_rows * ws[0]->ne0);
            x16 = t;
        }
        /* BF16 weights are used as stored (no shared slab): weights 1.. run on the side
         * streams with their own cuBLAS handles (the small K/V products overlap Q's) */
        bool all_bf16 = true;
        for (int i = 0; i < n_w; i++)
            all_bf16 = all_bf16 && ws[i]->type == TPI_TYPE_BF16;
        const bool fork = all_bf16 && n_w > 1 && ctx->side[0];
        if (fork && !CUDA_OK(ctx, op, cudaEventRecord(ctx->ev_fork, ctx->stream))) return;
        for (int i = 0; i < n_w; i++) {
            if (done[i]) continue;
            const bool side = fork && i > 0;
            if (side && !CUDA_OK(ctx, op, cudaStreamWaitEvent(ctx->side[i - 1], ctx->ev_fork, 0)))
                return;
            gemm_launch_h(ctx, side ? ctx->cublas_side[i - 1] : ctx->cublas, ws[i], x,
                          ws[i]->type == TPI_TYPE_F32 ? NULL : x16, ys[i], n_rows, 0.0f);
            if (side && (!CUDA_OK(ctx, op, cudaEventRecord(ctx->ev_join[i - 1], ctx->side[i - 1])) ||
                         !CUDA_OK(ctx, op, cudaStreamWaitEvent(ctx->stream, ctx->ev_join[i - 1], 0))))
                return;
            done[i] = true;
        }
    }
    for (int i = 0; i < n_w; i++) {
        xq_written(ctx, ys[i], n_rows * ws[i]->ne1);
        if (!done[i]) kern_matmul(ctx, ws[i], x, ys[i], n_rows); /* no fused path took it */
    }
}

void kern_matmul_add(struct ops_ctx *ctx, const struct tpi_weight *w, const float *x, float *y,
                     int64_t n_rows) {
    const char *op = "cuda matmul_add";
    if (n_rows <= 0 || w->ne1 <= 0) return;
    if (!matmul_ok(ctx, w, n_rows, op)) return;
    xq_written(ctx, y, n_rows * w->ne1); /* y changes; x's memo (if any) stays */
    if (n_rows > MATVEC_MAX_ROWS) { /* cuBLAS adds: beta = 1 */
        gemm_launch(ctx, w, x, NULL, y, n_rows, 1.0f);
        return;
    }
    struct kern_gemv_x gx;
    if (ctx->gemv == 3 && gemv_x_for(ctx, &w, 1, x, (int)n_rows, &gx) &&
        kern_gemv_v3_run(ctx, w, &gx, y, true, ctx->stream)) {
        LAUNCH_OK(ctx, op);
        return;
    }
    /* the v2 kernels write y: into a temporary, then add */
    const size_t n = (size_t)n_rows * (size_t)w->ne1;
    float *t = (float *)kern_scratch_get(ctx, &ctx->acc, n * sizeof(float), op);
    if (!t) return;
    kern_matmul(ctx, w, x, t, n_rows);
    kern_add(ctx, y, t, (int64_t)n);
}

/* One decode row of a gate/up pair the v3 path takes (kern_gemv_v3_glu_ok) runs as one
 * launch (kern_gemv_v3_run_glu), which also writes g's int8 form for the down matmul
 * (into q8_out: the launch reads x's form from q8) when the memo's silu producer is on.
 * Anything else, or TPI_GLU=0: matmul_n, then silu_mul. */
void kern_matmul_silu_mul(struct ops_ctx *ctx, const struct tpi_weight *wg,
                          const struct tpi_weight *wu, const float *x, float *g, float *u,
                          int64_t n_rows) {
    const char *op = "cuda matmul_silu_mul";
    const int64_t n_ff = wg->ne1, n_vals = n_rows * n_ff, nx = n_rows * wg->ne0;
    const bool apart = (g + n_vals <= u || u + n_vals <= g) && (g + n_vals <= x || x + nx <= g) &&
                       (u + n_vals <= x || x + nx <= u);
    const struct tpi_weight *ws[2] = {wg, wu};
    float *ys[2] = {g, u};
    struct kern_gemv_x gx;
    if (ctx->glu && ctx->gemv == 3 && n_rows == 1 && apart && wu->ne1 == n_ff &&
        matmul_ok(ctx, wg, n_rows, op) && matmul_ok(ctx, wu, n_rows, op) &&
        gemv_x_for(ctx, ws, 2, x, 1, &gx) && kern_gemv_v3_glu_ok(wg, wu, &gx)) {
        int8_t *oq = NULL;
        float2 *ods = NULL;
        const bool q8 = !is_elem16(wg->type) &&
                        kern_xq_claim_in(ctx, &ctx->q8_out, XQ_BY_SILU, 1, n_ff, &oq, &ods);
        ctx->xq_memo.valid = false; /* g and u are written; x's form is in q8 still */
        if (kern_gemv_v3_run_glu(ctx, wg, wu, &gx, g, u, oq, ods, ctx->glu, ctx->stream)) {
            if (q8 && LAUNCH_OK(ctx, op)) kern_xq_remember(ctx, g, n_ff);
            return;
        }
    }
    kern_matmul_n(ctx, 2, ws, x, ys, n_rows);
    kern_silu_mul_rows(ctx, g, u, g, n_rows, n_vals);
}
