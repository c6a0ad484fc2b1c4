/*
 * kern_gemv.cu — the v3 decode matrix-vector path (TPI_GEMV=v3, or
 * ops_cuda_set_gemv): y(n_rows, ne1) = x(n_rows, ne0) * W^T for n_rows <= 8.
 *
 * Quantized weights (Q4_0, Q5_0, Q8_0, Q4_K, Q6_K): x is first quantized to int8
 * in blocks of 32 values with an f32 scale d and d * (sum of the block's int8
 * values), in one small kernel per call. Then a warp takes one output feature
 * (weight row), or a quarter/half of one when ne1 is small; each lane takes whole
 * *items* (a weight block, or a quarter of a K-quant block: 32 to 64 values), loads
 * the item's quant bytes with a few wide loads, several items in flight, and dots
 * them with the int8 x through __dp4a (4 byte products per instruction, exact
 * integer sums); block scales are applied once per item, then a shuffle reduction.
 * Why: the v2 kernels convert every weight to f32 and read x as f32 (4 bytes of x
 * traffic per weight value, 8 per byte of Q4 weight), which bound them at 0.5-1.9
 * TB/s; here x traffic is 1 byte per value and the dot is on the integer pipe.
 * Cost: x is rounded to 8 bits per 32-value block (relative error ~2^-8 per value,
 * normalized squared error of y ~1e-5), the level llama.cpp's mmvq runs at.
 *
 * BF16/F16 weights keep f32 x (exact as the v2 kernels): the same one-warp-per-row
 * skeleton with 16-byte weight loads, 4 items in flight per lane and enough warps
 * per row to fill the machine on every Qwen3-8B shape.
 *
 * Types and shapes this path does not cover return false from kern_gemv_v3 and the
 * caller takes the v2 kernels.
 */
#include <string.h>

#include "kern_common.cuh"
#include "kern_quant.cuh"

#define GV_WARPS 4  /* warps per block */
#define GV_QK 32    /* x values per int8 block */
#define GV_UNROLL 4 /* items per lane loaded before the first is used */

/* ---------------------------------------------------------------- helpers
 * __host__ __device__ so the per-type dot products can be checked on the host. */

__host__ __device__ __forceinline__ uint32_t gv_ld32(const uint8_t *p) {
#ifdef __CUDA_ARCH__
    return __ldg((const unsigned int *)p);
#else
    return *(const uint32_t *)p;
#endif
}
__host__ __device__ __forceinline__ int4 gv_ld128(const void *p) {
#ifdef __CUDA_ARCH__
    return __ldg((const int4 *)p);
#else
    return *(const int4 *)p;
#endif
}
__host__ __device__ __forceinline__ float2 gv_ldf2(const float2 *p) {
#ifdef __CUDA_ARCH__
    return __ldg(p);
#else
    return *p;
#endif
}
__host__ __device__ __forceinline__ float gv_f16(const uint8_t *p) {
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half(__ldg((const unsigned short *)p)));
#else
    uint16_t h;
    memcpy(&h, p, 2);
    __half_raw r;
    r.x = h;
    return __half2float(__half(r));
#endif
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
/* per-byte a - b, wrapping (the results fit in a signed byte) */
__host__ __device__ __forceinline__ uint32_t gv_vsub4(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
    return __vsub4(a, b);
#else
    uint32_t r = 0;
    for (int i = 0; i < 4; i++)
        r |= (uint32_t)(uint8_t)((a >> (8 * i)) - (b >> (8 * i))) << (8 * i);
    return r;
#endif
}
__host__ __device__ __forceinline__ uint32_t gv_funnel(uint32_t lo, uint32_t hi, int sh) {
#ifdef __CUDA_ARCH__
    return __funnelshift_r(lo, hi, sh);
#else
    return sh ? (lo >> sh) | (hi << (32 - sh)) : lo;
#endif
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
 * gv<T>: BLK values and BYTES bytes per weight block, IPB items per block, and
 * dot<NR>(b: the block, it: the item, xq: int8 x at the block's first value (row 0),
 * ds: that block's first (d, d*sum) pair (row 0), xs: x row stride in values, nr,
 * acc). Row r's x is at xq + r*xs and ds + r*(xs/32). */
template <int TYPE> struct gv;

/* Q8_0: an item is a block: f16 d, 32 int8 at b+2 (2-byte aligned). */
template <> struct gv<TPI_TYPE_Q8_0> {
    static constexpr int BLK = 32, BYTES = 34, IPB = 1;
    template <int NR>
    static __host__ __device__ __forceinline__ void dot(const uint8_t *b, int, const int8_t *xq,
                                                        const float2 *ds, int xs, int nr,
                                                        float keep, float (&acc)[NR]) {
        const float d = gv_f16(b) * keep;
        uint32_t q[8];
        gv_ld_a2<8>(b + 2, q);
#pragma unroll
        for (int r = 0; r < NR; r++)
            if (r == 0 || r < nr) {
                const int4 x0 = gv_ld128(xq + (size_t)r * xs), x1 = gv_ld128(xq + (size_t)r * xs + 16);
                int s = gv_dp4a(q[0], x0.x, 0);
                s = gv_dp4a(q[1], x0.y, s);
                s = gv_dp4a(q[2], x0.z, s);
                s = gv_dp4a(q[3], x0.w, s);
                s = gv_dp4a(q[4], x1.x, s);
                s = gv_dp4a(q[5], x1.y, s);
                s = gv_dp4a(q[6], x1.z, s);
                s = gv_dp4a(q[7], x1.w, s);
                acc[r] += d * gv_ldf2(ds + (size_t)r * (xs / GV_QK)).x * (float)s;
            }
    }
};

/* Q4_0: an item is a block: f16 d, 16 bytes; byte j = value j (low nibble), j+16
 * (high), q - 8. */
template <> struct gv<TPI_TYPE_Q4_0> {
    static constexpr int BLK = 32, BYTES = 18, IPB = 1;
    template <int NR>
    static __host__ __device__ __forceinline__ void dot(const uint8_t *b, int, const int8_t *xq,
                                                        const float2 *ds, int xs, int nr,
                                                        float keep, float (&acc)[NR]) {
        const float d = gv_f16(b) * keep;
        uint32_t w[4], lo[4], hi[4];
        gv_ld_a2<4>(b + 2, w);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            lo[i] = gv_vsub4(w[i] & 0x0F0F0F0Fu, 0x08080808u);
            hi[i] = gv_vsub4((w[i] >> 4) & 0x0F0F0F0Fu, 0x08080808u);
        }
#pragma unroll
        for (int r = 0; r < NR; r++)
            if (r == 0 || r < nr) {
                const int4 x0 = gv_ld128(xq + (size_t)r * xs), x1 = gv_ld128(xq + (size_t)r * xs + 16);
                int s = gv_dp4a(lo[0], x0.x, 0);
                s = gv_dp4a(lo[1], x0.y, s);
                s = gv_dp4a(lo[2], x0.z, s);
                s = gv_dp4a(lo[3], x0.w, s);
                s = gv_dp4a(hi[0], x1.x, s);
                s = gv_dp4a(hi[1], x1.y, s);
                s = gv_dp4a(hi[2], x1.z, s);
                s = gv_dp4a(hi[3], x1.w, s);
                acc[r] += d * gv_ldf2(ds + (size_t)r * (xs / GV_QK)).x * (float)s;
            }
    }
};

/* Q5_0: an item is a block: f16 d, 32 bits qh (bit j: fifth bit of value j), 16
 * bytes as Q4_0; q - 16. qh and the quants are the 5 words at b+2. */
template <> struct gv<TPI_TYPE_Q5_0> {
    static constexpr int BLK = 32, BYTES = 22, IPB = 1;
    template <int NR>
    static __host__ __device__ __forceinline__ void dot(const uint8_t *b, int, const int8_t *xq,
                                                        const float2 *ds, int xs, int nr,
                                                        float keep, float (&acc)[NR]) {
        const float d = gv_f16(b) * keep;
        uint32_t w[5], lo[4], hi[4];
        gv_ld_a2<5>(b + 2, w);
        const uint32_t qh = w[0];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t q = w[1 + i];
            lo[i] = gv_vsub4((q & 0x0F0F0F0Fu) | gv_spread4((qh >> (4 * i)) & 0xFu), 0x10101010u);
            hi[i] = gv_vsub4(((q >> 4) & 0x0F0F0F0Fu) | gv_spread4((qh >> (16 + 4 * i)) & 0xFu),
                             0x10101010u);
        }
#pragma unroll
        for (int r = 0; r < NR; r++)
            if (r == 0 || r < nr) {
                const int4 x0 = gv_ld128(xq + (size_t)r * xs), x1 = gv_ld128(xq + (size_t)r * xs + 16);
                int s = gv_dp4a(lo[0], x0.x, 0);
                s = gv_dp4a(lo[1], x0.y, s);
                s = gv_dp4a(lo[2], x0.z, s);
                s = gv_dp4a(lo[3], x0.w, s);
                s = gv_dp4a(hi[0], x1.x, s);
                s = gv_dp4a(hi[1], x1.y, s);
                s = gv_dp4a(hi[2], x1.z, s);
                s = gv_dp4a(hi[3], x1.w, s);
                acc[r] += d * gv_ldf2(ds + (size_t)r * (xs / GV_QK)).x * (float)s;
            }
    }
};

/* Q4_K: an item is one 64-value chunk c of a block (16-byte aligned blocks): its 32
 * quant bytes at b+16+32c (low nibbles: sub-block 2c = values 64c..64c+31, high:
 * sub-block 2c+1), the 6-bit scales/mins of both sub-blocks from the 12 bytes at b+4;
 * value = d*sc*q - dmin*m, so a sub-block contributes d*sc*dx*sum(q*xq) - dmin*m*(dx*sum xq). */
template <> struct gv<TPI_TYPE_Q4_K> {
    static constexpr int BLK = 256, BYTES = 144, IPB = 4;
    /* byte j of w */
    static __host__ __device__ __forceinline__ int byte_of(uint32_t w, int j) {
        return (int)((w >> (8 * j)) & 0xFFu);
    }
    template <int NR>
    static __host__ __device__ __forceinline__ void dot(const uint8_t *b, int c, const int8_t *xq,
                                                        const float2 *ds, int xs, int nr,
                                                        float keep, float (&acc)[NR]) {
        const int4 qa = gv_ld128(b + 16 + 32 * c), qb = gv_ld128(b + 16 + 32 * c + 16);
        const uint32_t dm = gv_ld32(b);
        const uint32_t s0 = gv_ld32(b + 4), s1 = gv_ld32(b + 8), s2 = gv_ld32(b + 12);
        __half_raw hr;
        hr.x = (unsigned short)(dm & 0xFFFFu);
        const float d = __half2float(__half(hr)) * keep;
        hr.x = (unsigned short)(dm >> 16);
        const float dmin = __half2float(__half(hr)) * keep;
        /* sub-blocks j = 2c, 2c+1: j < 4 for c < 2 */
        int sc[2], mn[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int j = 2 * c + h, j4 = j & 3;
            const int a = byte_of(s0, j4), bb = byte_of(s1, j4), e = byte_of(s2, j4);
            sc[h] = j < 4 ? (a & 63) : ((e & 0xF) | ((a >> 6) << 4));
            mn[h] = j < 4 ? (bb & 63) : ((e >> 4) | ((bb >> 6) << 4));
        }
        const float d0 = d * (float)sc[0], d1 = d * (float)sc[1];
        const float m0 = dmin * (float)mn[0], m1 = dmin * (float)mn[1];
        const uint32_t w[8] = {(uint32_t)qa.x, (uint32_t)qa.y, (uint32_t)qa.z, (uint32_t)qa.w,
                               (uint32_t)qb.x, (uint32_t)qb.y, (uint32_t)qb.z, (uint32_t)qb.w};
        uint32_t lo[8], hi[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            lo[i] = w[i] & 0x0F0F0F0Fu;
            hi[i] = (w[i] >> 4) & 0x0F0F0F0Fu;
        }
        const int8_t *xc = xq + 64 * c;
        const float2 *dc = ds + 2 * c;
#pragma unroll
        for (int r = 0; r < NR; r++)
            if (r == 0 || r < nr) {
                const int8_t *xr = xc + (size_t)r * xs;
                const int4 a0 = gv_ld128(xr), a1 = gv_ld128(xr + 16);
                const int4 b0 = gv_ld128(xr + 32), b1 = gv_ld128(xr + 48);
                int sl = gv_dp4a(lo[0], a0.x, 0);
                sl = gv_dp4a(lo[1], a0.y, sl);
                sl = gv_dp4a(lo[2], a0.z, sl);
                sl = gv_dp4a(lo[3], a0.w, sl);
                sl = gv_dp4a(lo[4], a1.x, sl);
                sl = gv_dp4a(lo[5], a1.y, sl);
                sl = gv_dp4a(lo[6], a1.z, sl);
                sl = gv_dp4a(lo[7], a1.w, sl);
                int sh = gv_dp4a(hi[0], b0.x, 0);
                sh = gv_dp4a(hi[1], b0.y, sh);
                sh = gv_dp4a(hi[2], b0.z, sh);
                sh = gv_dp4a(hi[3], b0.w, sh);
                sh = gv_dp4a(hi[4], b1.x, sh);
                sh = gv_dp4a(hi[5], b1.y, sh);
                sh = gv_dp4a(hi[6], b1.z, sh);
                sh = gv_dp4a(hi[7], b1.w, sh);
                const float2 xl = gv_ldf2(dc + (size_t)r * (xs / GV_QK));
                const float2 xh = gv_ldf2(dc + (size_t)r * (xs / GV_QK) + 1);
                float t = d0 * xl.x * (float)sl;
                t = fmaf(d1 * xh.x, (float)sh, t);
                t = fmaf(-m0, xl.y, t);
                t = fmaf(-m1, xh.y, t);
                acc[r] += t;
            }
    }
};

/* Q6_K: an item is (half n, l0 in {0, 16}): 16 bytes of ql at 64n+l0 (A) and at
 * 64n+32+l0 (C), 16 of qh at 128+32n+l0 (H); they give values 128n+32k+l0..+15 for
 * k = 0..3 (A low, C low, A high, C high nibbles with 2-bit pairs k of H), q - 32,
 * times d * scales[8n + l0/16 + 2k]. 210-byte blocks: 2-byte aligned loads. */
template <> struct gv<TPI_TYPE_Q6_K> {
    static constexpr int BLK = 256, BYTES = 210, IPB = 4;
    template <int NR>
    static __host__ __device__ __forceinline__ void dot(const uint8_t *b, int it, const int8_t *xq,
                                                        const float2 *ds, int xs, int nr,
                                                        float keep, float (&acc)[NR]) {
        const int n = it >> 1, l0 = (it & 1) * 16;
        uint32_t A[4], C[4], H[4];
        gv_ld_a2<4>(b + 64 * n + l0, A);
        gv_ld_a2<4>(b + 64 * n + 32 + l0, C);
        gv_ld_a2<4>(b + 128 + 32 * n + l0, H);
        /* the 4 int8 scales sc[8n + l0/16 + 2k] (k = 0..3) sit at even offsets of 8 bytes */
        uint32_t S[2];
        gv_ld_a2<2>(b + 192 + 8 * n, S);
        const float d = gv_f16(b + 208) * keep;
        const int is = l0 / 16;
        float sk[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int idx = is + 2 * k; /* 0..7 */
            sk[k] = d * (float)(int8_t)((S[idx >> 2] >> (8 * (idx & 3))) & 0xFFu);
        }
        uint32_t q[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            q[0][i] = gv_vsub4((A[i] & 0x0F0F0F0Fu) | ((H[i] & 0x03030303u) << 4), 0x20202020u);
            q[1][i] = gv_vsub4((C[i] & 0x0F0F0F0Fu) | ((H[i] & 0x0C0C0C0Cu) << 2), 0x20202020u);
            q[2][i] = gv_vsub4(((A[i] >> 4) & 0x0F0F0F0Fu) | (H[i] & 0x30303030u), 0x20202020u);
            q[3][i] = gv_vsub4(((C[i] >> 4) & 0x0F0F0F0Fu) | ((H[i] & 0xC0C0C0C0u) >> 2),
                               0x20202020u);
        }
#pragma unroll
        for (int r = 0; r < NR; r++)
            if (r == 0 || r < nr) {
                const int8_t *xr = xq + (size_t)r * xs + 128 * n + l0;
                const float2 *dr = ds + (size_t)r * (xs / GV_QK) + 4 * n;
                float t = 0.0f;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const int4 xv = gv_ld128(xr + 32 * k);
                    int s = gv_dp4a(q[k][0], xv.x, 0);
                    s = gv_dp4a(q[k][1], xv.y, s);
                    s = gv_dp4a(q[k][2], xv.z, s);
                    s = gv_dp4a(q[k][3], xv.w, s);
                    t = fmaf(sk[k] * gv_ldf2(dr + k).x, (float)s, t);
                }
                acc[r] += t;
            }
    }
};

/* ---------------------------------------------------------------- kernels */

/* x (n_vals values, rows of ne0 % 32 == 0) to int8 blocks of 32: a warp per block,
 * a lane per value. d = amax / 127, q = round(x / d), ds = (d, d * sum q). */
__global__ void gv_quantize_x_kernel(const float *__restrict__ x, int8_t *__restrict__ xq,
                                     float2 *__restrict__ ds, int64_t n_vals) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_vals) return; /* n_vals % 32 == 0: whole warps leave together */
    const float v = x[i];
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = amax / 127.0f;
    int q = amax > 0.0f ? __float2int_rn(v * (127.0f / amax)) : 0;
    q = max(-127, min(127, q));
    int s = q;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, o);
    xq[i] = (int8_t)q;
    if ((threadIdx.x & 31) == 0) ds[i / GV_QK] = make_float2(d, d * (float)s);
}

/* Sum acc over the warp, then over the wpr warps of one row (shared memory), and
 * store row `row` of y for the first nr x rows. */
template <int NR>
__device__ __forceinline__ void gv_store(float (&acc)[NR], float *__restrict__ y, int ne1, int nr,
                                         int row, int part, int wpr) {
    __shared__ float red[GV_WARPS][NR];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < NR; r++) {
        float v = acc[r];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            v += __shfl_xor_sync(0xffffffffu, v, o);
        acc[r] = v;
    }
    if (wpr == 1) {
        if (lane == 0 && row < ne1)
#pragma unroll
            for (int r = 0; r < NR; r++)
                if (r < nr) y[(size_t)r * ne1 + row] = acc[r];
        return;
    }
    if (lane == 0)
#pragma unroll
        for (int r = 0; r < NR; r++)
            red[warp][r] = acc[r];
    __syncthreads();
    if (part == 0 && lane == 0 && row < ne1)
#pragma unroll
        for (int r = 0; r < NR; r++)
            if (r < nr) {
                float s = 0.0f;
                for (int k = 0; k < wpr; k++) /* fixed order: results do not depend on timing */
                    s += red[warp + k][r];
                y[(size_t)r * ne1 + row] = s;
            }
}

/* Quantized weights: warp (row, part) takes items part*32 + lane, stepping 32*wpr. */
template <int TYPE, int NR>
__global__ void __launch_bounds__(GV_WARPS * 32)
    gv_quant_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int ne0, int ne1,
                    const int8_t *__restrict__ xq, const float2 *__restrict__ ds,
                    float *__restrict__ y, int nr, int wpr) {
    using Q = gv<TYPE>;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * (GV_WARPS / wpr) + warp / wpr, part = warp % wpr;
    const int n_items = (ne0 / Q::BLK) * Q::IPB, step = 32 * wpr;
    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; r++)
        acc[r] = 0.0f;
    if (row < ne1) {
        const uint8_t *wr = w + (size_t)row * row_bytes;
        auto item = [&](int i, float keep) {
            const int blk = i / Q::IPB;
            Q::template dot<NR>(wr + (size_t)blk * Q::BYTES, i % Q::IPB, xq + (size_t)blk * Q::BLK,
                                ds + (size_t)blk * (Q::BLK / GV_QK), ne0, nr, keep, acc);
        };
        /* batches of U items, straight-line so all their loads can be issued before
         * the first dot; items past the row end redo the batch's first item with weight
         * 0 (adds exact zeros) instead of branching. Rows of <= 2 items per lane (4096
         * values of Q4_K/Q6_K) take batches of 2, so half the work is not thrown away. */
        auto rows = [&](auto u_c) {
            constexpr int U = decltype(u_c)::value;
            for (int it = part * 32 + lane; it < n_items; it += U * step) {
#pragma unroll
                for (int u = 0; u < U; u++) {
                    const int i = it + u * step;
                    const bool ok = u == 0 || i < n_items;
                    item(ok ? i : it, ok ? 1.0f : 0.0f);
                }
            }
        };
        if (n_items <= 2 * step)
            rows(std::integral_constant<int, 2>{});
        else
            rows(std::integral_constant<int, GV_UNROLL>{});
    }
    gv_store<NR>(acc, y, ne1, nr, row, part, wpr);
}

/* BF16/F16 weights, f32 x: an item is 8 values (16 bytes); x as two float4 per row. */
template <int TYPE>
__device__ __forceinline__ void gv_elem_unpack(const int4 v, float (&f)[8]) {
    const uint32_t u[4] = {(uint32_t)v.x, (uint32_t)v.y, (uint32_t)v.z, (uint32_t)v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if constexpr (TYPE == TPI_TYPE_BF16) {
            f[2 * i] = __uint_as_float(u[i] << 16);
            f[2 * i + 1] = __uint_as_float(u[i] & 0xFFFF0000u);
        } else {
            __half2_raw hr;
            hr.x = (unsigned short)(u[i] & 0xFFFFu);
            hr.y = (unsigned short)(u[i] >> 16);
            const float2 p = __half22float2(__half2(hr));
            f[2 * i] = p.x;
            f[2 * i + 1] = p.y;
        }
    }
}

template <int TYPE, int NR>
__global__ void __launch_bounds__(GV_WARPS * 32)
    gv_elem_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int ne0, int ne1,
                   const float *__restrict__ x, float *__restrict__ y, int nr, int wpr) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * (GV_WARPS / wpr) + warp / wpr, part = warp % wpr;
    const int n_items = ne0 / 8, step = 32 * wpr;
    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; r++)
        acc[r] = 0.0f;
    if (row < ne1) {
        const int4 *wr = (const int4 *)(w + (size_t)row * row_bytes);
        auto item = [&](const int4 wv, int i) {
            float f[8];
            gv_elem_unpack<TYPE>(wv, f);
#pragma unroll
            for (int r = 0; r < NR; r++)
                if (r == 0 || r < nr) {
                    const float4 *xp = (const float4 *)(x + (size_t)r * ne0 + 8 * (size_t)i);
                    const float4 a = __ldg(xp), b = __ldg(xp + 1);
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
        };
        for (int it = part * 32 + lane; it < n_items; it += GV_UNROLL * step) {
            int4 wv[GV_UNROLL];
#pragma unroll
            for (int u = 0; u < GV_UNROLL; u++) {
                const int i = it + u * step;
                /* past the row end: zero weights against the batch's first x (exact zeros) */
                wv[u] = u == 0 || i < n_items ? __ldg(wr + i) : make_int4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < GV_UNROLL; u++) {
                const int i = it + u * step;
                item(wv[u], u == 0 || i < n_items ? i : it);
            }
        }
    }
    gv_store<NR>(acc, y, ne1, nr, row, part, wpr);
}

/* ---------------------------------------------------------------- launchers */

/* Warps per row: split rows until the grid has >= 16 warps per SM, keeping at
 * least two items per lane. */
static int gv_wpr(const struct ops_ctx *ctx, int64_t ne1, int64_t n_items) {
    int wpr = 1;
    while (wpr < GV_WARPS && ne1 * wpr < (int64_t)ctx->n_sm * 16 && n_items >= 64 * (2 * wpr))
        wpr *= 2;
    return wpr;
}

template <int NR>
static bool gv_launch(struct ops_ctx *ctx, const struct tpi_weight *w, const float *x, float *y,
                      int n_rows) {
    const uint8_t *data = (const uint8_t *)w->data;
    const int ne0 = (int)w->ne0, ne1 = (int)w->ne1;
    const bool a16 = ((uintptr_t)data & 15) == 0 && (w->row_bytes & 15) == 0;
    bool done = false;
    kq_dispatch(w->type, [&](auto type_c, auto) {
        constexpr int T = decltype(type_c)::value;
        if constexpr (T == TPI_TYPE_BF16 || T == TPI_TYPE_F16) {
            if (!a16 || ne0 % 8 != 0 || ((uintptr_t)x & 15) != 0) return;
            const int wpr = gv_wpr(ctx, ne1, ne0 / 8);
            const unsigned blocks = (unsigned)(((int64_t)ne1 * wpr + GV_WARPS - 1) / GV_WARPS);
            gv_elem_kernel<T, NR><<<blocks, GV_WARPS * 32, 0, ctx->stream>>>(
                data, w->row_bytes, ne0, ne1, x, y, n_rows, wpr);
            done = true;
        } else if constexpr (T == TPI_TYPE_Q8_0 || T == TPI_TYPE_Q4_0 || T == TPI_TYPE_Q5_0 ||
                             T == TPI_TYPE_Q4_K || T == TPI_TYPE_Q6_K) {
            using Q = gv<T>;
            if (ne0 % Q::BLK != 0) return;
            if (T == TPI_TYPE_Q4_K && !a16) return; /* 16-byte loads of whole chunks */
            if (((uintptr_t)data & 3) != 0) return;  /* gv_ld_a2 rounds down to 4 bytes */
            /* int8 x and its (d, d*sum) pairs, 256-byte aligned parts of one scratch */
            const size_t n_vals = (size_t)n_rows * (size_t)ne0;
            const size_t q_bytes = (n_vals + 255) / 256 * 256;
            uint8_t *s = (uint8_t *)kern_scratch_get(
                ctx, &ctx->q8, q_bytes + n_vals / GV_QK * sizeof(float2), "cuda matmul (v3)");
            if (!s) {
                done = true; /* failure recorded; nothing more to launch */
                return;
            }
            int8_t *xq = (int8_t *)s;
            float2 *ds = (float2 *)(s + q_bytes);
            gv_quantize_x_kernel<<<(unsigned)((n_vals + 127) / 128), 128, 0, ctx->stream>>>(
                x, xq, ds, (int64_t)n_vals);
            const int64_t n_items = (int64_t)(ne0 / Q::BLK) * Q::IPB;
            const int wpr = gv_wpr(ctx, ne1, n_items);
            const unsigned blocks = (unsigned)(((int64_t)ne1 * wpr + GV_WARPS - 1) / GV_WARPS);
            gv_quant_kernel<T, NR><<<blocks, GV_WARPS * 32, 0, ctx->stream>>>(
                data, w->row_bytes, ne0, ne1, xq, ds, y, n_rows, wpr);
            done = true;
        }
    });
    return done;
}

bool kern_gemv_v3(struct ops_ctx *ctx, const struct tpi_weight *w, const float *x, float *y,
                  int n_rows) {
    if (n_rows == 1) return gv_launch<1>(ctx, w, x, y, 1);
    if (n_rows == 2) return gv_launch<2>(ctx, w, x, y, 2);
    if (n_rows <= 4) return gv_launch<4>(ctx, w, x, y, n_rows);
    return gv_launch<8>(ctx, w, x, y, n_rows);
}
