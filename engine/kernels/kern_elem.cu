/*
 * kern_elem.cu — the CUDA backend's small ops: embed and dequantize (any weight
 * type), rmsnorm, bias, NEOX rope, silu*mul, add, get_rows, f32 -> bf16.
 * Kernels first, then their launchers; every launcher runs on ctx->stream and
 * ends with a launch check.
 */
#include <math.h>
#include <string.h>

#include "kern_common.cuh"
#include "kern_quant.cuh"
#include "kern_xq.cuh"

/* Grid size for a grid-stride loop over n items: enough blocks to fill the GPU,
 * never more than the items need. */
static unsigned grid_for(const struct ops_ctx *ctx, int64_t n, int threads) {
    int64_t blocks = (n + threads - 1) / threads;
    const int64_t cap = (int64_t)ctx->n_sm * 32;
    if (blocks > cap) blocks = cap;
    return (unsigned)(blocks < 1 ? 1 : blocks);
}

__device__ __forceinline__ void kstore(float *p, float v) {
    *p = v;
}
__device__ __forceinline__ void kstore(__nv_bfloat16 *p, float v) {
    *p = __float2bfloat16_rn(v);
}

/* ---------------------------------------------------------------- kernels */

/* dst row r (ne0 values) = source row (ids ? ids[r] : row0 + r) of a block-type weight;
 * one thread per unit. A row id outside [0, ne1) gives a zero row. */
template <int TYPE, typename OUT>
__global__ void dequant_block_kernel(const uint8_t *data, size_t row_bytes, int64_t ne0,
                                     int64_t ne1, const int32_t *ids, int64_t row0, int64_t n_rows,
                                     OUT *dst) {
    using Q = kq<TYPE>;
    const int64_t units_per_row = ne0 / Q::BLK * Q::UPB;
    const int64_t n_units = n_rows * units_per_row;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n_units;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / units_per_row, u = i % units_per_row;
        const int64_t src_row = ids ? (int64_t)ids[r] : row0 + r;
        const int64_t blk = u / Q::UPB;
        OUT *out = dst + r * ne0 + blk * Q::BLK;
        float v[Q::G * 4];
        int off[Q::G];
        /* a bad id still decodes a real block (row 0) for the offsets, then writes zeros */
        const bool ok = src_row >= 0 && src_row < ne1;
        Q::unit(data + (ok ? src_row : 0) * row_bytes + blk * Q::BYTES, (int)(u % Q::UPB), v, off);
        if (!ok) {
#pragma unroll
            for (int g = 0; g < Q::G * 4; g++)
                v[g] = 0.0f;
        }
#pragma unroll
        for (int g = 0; g < Q::G; g++)
#pragma unroll
            for (int k = 0; k < 4; k++)
                kstore(out + off[g] + k, v[g * 4 + k]);
    }
}

/* The same for element types: one thread per value. */
template <int TYPE, typename OUT>
__global__ void dequant_elem_kernel(const uint8_t *data, size_t row_bytes, int64_t ne0, int64_t ne1,
                                    const int32_t *ids, int64_t row0, int64_t n_rows, OUT *dst) {
    const int64_t n = n_rows * ne0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / ne0, j = i % ne0;
        const int64_t src_row = ids ? (int64_t)ids[r] : row0 + r;
        const float v =
            (src_row < 0 || src_row >= ne1) ? 0.0f : kf<TYPE>::load(data + src_row * row_bytes, j);
        kstore(dst + i, v);
    }
}

/* The prefill dequantize: rows [row0, row0+n_rows) of a block-type weight to bf16.
 * The output of whole quant blocks is one contiguous stretch, so a thread block
 * decodes DQ_TILE values (whole quant blocks, flattened over rows) into shared memory
 * and writes them out with 16-byte stores; the quant bytes are read coalesced, once. */
#define DQ_TILE 4096
template <int TYPE>
__global__ void __launch_bounds__(256)
    dequant_bf16_tile_kernel(const uint8_t *data, size_t row_bytes, int64_t nb_row, int64_t row0,
                             int64_t n_blocks, __nv_bfloat16 *dst) {
    using Q = kq<TYPE>;
    constexpr int TB = DQ_TILE / Q::BLK; /* quant blocks per tile */
    __shared__ uint4 tile4[DQ_TILE / 8];
    __nv_bfloat16 *tile = (__nv_bfloat16 *)tile4;
    for (int64_t gb0 = (int64_t)blockIdx.x * TB; gb0 < n_blocks; gb0 += (int64_t)gridDim.x * TB) {
        const int nbk = (int)min((int64_t)TB, n_blocks - gb0);
        for (int i = threadIdx.x; i < nbk * Q::UPB; i += blockDim.x) {
            const int lb = i / Q::UPB, u = i % Q::UPB;
            const int64_t gb = gb0 + lb, r = gb / nb_row, blk = gb % nb_row;
            float v[Q::G * 4];
            int off[Q::G];
            Q::unit(data + (row0 + r) * row_bytes + blk * Q::BYTES, u, v, off);
#pragma unroll
            for (int g = 0; g < Q::G; g++) {
                __nv_bfloat162 *o = (__nv_bfloat162 *)(tile + lb * Q::BLK + off[g]);
                o[0] = __floats2bfloat162_rn(v[4 * g], v[4 * g + 1]);
                o[1] = __floats2bfloat162_rn(v[4 * g + 2], v[4 * g + 3]);
            }
        }
        __syncthreads();
        uint4 *out = (uint4 *)(dst + gb0 * Q::BLK);
        for (int i = threadIdx.x; i < nbk * Q::BLK / 8; i += blockDim.x)
            out[i] = tile4[i];
        __syncthreads(); /* the tile is rewritten next */
    }
}

/* F16 -> bf16, 8 values per thread with 16-byte loads and stores (n % 8 == 0). */
__global__ void f16_to_bf16_vec_kernel(const uint4 *src, uint4 *dst, int64_t n8) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8;
         i += (int64_t)gridDim.x * blockDim.x) {
        uint4 a = src[i];
        uint32_t *w = (uint32_t *)&a;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float2 f = __half22float2(*(const __half2 *)&w[k]);
            const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
            w[k] = *(const uint32_t *)&b;
        }
        dst[i] = a;
    }
}

/* f32 -> bf16, 4 values per thread (n % 4 == 0, 16-byte aligned input). */
__global__ void f32_to_bf16_vec_kernel(const float4 *x, uint2 *y, int64_t n4) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float4 v = x[i];
        const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
        uint2 o;
        o.x = *(const uint32_t *)&a;
        o.y = *(const uint32_t *)&b;
        y[i] = o;
    }
}

__global__ void f32_to_bf16_kernel(const float *x, __nv_bfloat16 *y, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16_rn(x[i]);
}

/* Sum over the block of a value >= +0 or NaN (blockDim.x a multiple of 32, at most 1024),
 * called once a kernel; every thread gets it. The warps' sums are added in a butterfly
 * (lane i with i ^ 16, ^ 8, ... ^ 1, lanes past the warps holding 0). With 2 or 4 warps
 * (the norms' blocks) every thread adds them from shared memory in the butterfly's pairs,
 * (p0 + p2) + (p1 + p3): the same bits without the second shuffle tree on the norm's last
 * path (x + 0 is x for the values allowed here; bench/NOTES.md change 128). */
__device__ float block_sum(float v) {
    __shared__ float4 part4[8];
    float *const part = (float *)part4;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (n_warps == 4) {
        const float4 p = part4[0];
        return (p.x + p.z) + (p.y + p.w);
    }
    if (n_warps == 2) return part[0] + part[1];
    v = lane < n_warps ? part[lane] : 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}



__global__ void add_bias_kernel(float *y, const float *b, int64_t n_rows, int64_t n_cols) {
    const int64_t n = n_rows * n_cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] += b[i % n_cols];
}

/* grid (n_tokens, n_head); thread i rotates pair (i, i + n_rot/2). The angle is taken
 * in double, like the CPU reference, because pos * theta reaches thousands of radians
 * where a float angle is off by ~1e-4. Products are not fused (as on the CPU). */
__global__ void rope_neox_kernel(float *x, const int32_t *pos, int n_head, int head_dim,
                                 const rope_pairs rp) {
    const int t = blockIdx.x, h = blockIdx.y, half = rp.n_rot / 2;
    float *xh = x + ((int64_t)t * n_head + h) * head_dim;
    const double p = (double)pos[t];
    for (int i = threadIdx.x; i < half; i += blockDim.x)
        kern_rope_pair(xh[i], xh[i + half], xh, i, p, rp);
}

/* grid (n_tokens, n_head + n_kv): block y < n_head is query head y of token x, the rest
 * key heads. The head's values go through shared memory: per-head rmsnorm when its
 * weight is given (the arithmetic of rmsnorm_kernel), then the NEOX rotation of
 * rope_neox_kernel, written back in place. The head's loads go out first (up to
 * QKR_VPT per thread at once, their norm weights before the wait for the previous
 * kernel), and thread i's first angle, a long chain of double operations, is computed
 * while they are in flight. */
#define QKR_VPT 4
template <bool TAB>
__global__ void qk_norm_rope_kernel(float *q, float *k, const float *q_norm, const float *k_norm,
                                    const int32_t *pos, int n_head, int n_kv, int head_dim,
                                    const rope_pairs rp, float eps, const double *inv_tab) {
    extern __shared__ float xs[];
    const int n_rot = rp.n_rot;
    const int t = blockIdx.x, hh = blockIdx.y, half = n_rot / 2, i0 = threadIdx.x;
    const bool is_q = hh < n_head;
    const float *w = is_q ? q_norm : k_norm;
    /* the norm weights of this thread's first QKR_VPT values: no kernel's output, so
     * loaded before the wait, and not one more round trip after the block sum */
    float wv[QKR_VPT];
#pragma unroll
    for (int j = 0; j < QKR_VPT; j++) {
        const int c = threadIdx.x + j * blockDim.x;
        wv[j] = w && c < head_dim ? w[c] : 0.0f;
    }
    /* the first pair's inverse frequency: from the table (TAB: no pow call, behind which
     * the compiler holds the head's loads), else computed below */
    const double inv0 = TAB && i0 < half ? inv_tab[i0] : 0.0;
    kern_dep_wait();
    float *xh = is_q ? q + ((int64_t)t * n_head + hh) * head_dim
                     : k + ((int64_t)t * n_kv + (hh - n_head)) * head_dim;
    float ss = 0.0f;
    float2 cs0 = make_float2(0.0f, 0.0f);
    const double p = (double)pos[t];
    for (int c0 = threadIdx.x; c0 < head_dim; c0 += QKR_VPT * blockDim.x) {
        float v[QKR_VPT];
#pragma unroll
        for (int j = 0; j < QKR_VPT; j++) {
            const int c = c0 + j * blockDim.x;
            v[j] = c < head_dim ? xh[c] : 0.0f;
        }
        if (c0 == threadIdx.x && i0 < half)
            cs0 = kern_rope_cs(p, TAB ? inv0 : rope_pair_inv(&rp, i0), rp.mscale);
#pragma unroll
        for (int j = 0; j < QKR_VPT; j++) {
            const int c = c0 + j * blockDim.x;
            if (c < head_dim) xs[c] = v[j];
            ss = __fmaf_rn(v[j], v[j], ss); /* one rounding a term: mma_qk_row's order */
        }
    }
    if (w) { /* uniform per block */
        ss = block_sum(ss); /* also orders the xs writes before the reads below */
        const float scale = kern_rms_scale(ss, head_dim, eps);
#pragma unroll
        for (int j = 0; j < QKR_VPT; j++) {
            const int c = threadIdx.x + j * blockDim.x;
            if (c < head_dim) xs[c] = __fmul_rn(__fmul_rn(xs[c], scale), wv[j]);
        }
        for (int c = threadIdx.x + QKR_VPT * blockDim.x; c < head_dim; c += blockDim.x)
            xs[c] = __fmul_rn(__fmul_rn(xs[c], scale), w[c]);
    }
    __syncthreads();
    for (int i = i0; i < half; i += blockDim.x)
        kern_rope_apply(xs[i], xs[i + half], xh, i, half,
                        i == i0 ? cs0
                                : kern_rope_cs(p, TAB ? inv_tab[i] : rope_pair_inv(&rp, i),
                                               rp.mscale));
    for (int c = n_rot + threadIdx.x; c < head_dim; c += blockDim.x)
        xh[c] = xs[c]; /* dims past n_rot: normalized only */
}

/* ---- producers that also quantize their output for the v3 matrix-vector path ----
 * A decode step's rmsnorm and silu*mul outputs are the x of the next matmul; writing
 * their int8 blocks here saves that matmul's quantization launch (kern_matmul.cu keeps
 * the memo that says so). kern_q8_block keeps it bitwise equal to gv_quantize_x_kernel's. */

/* One block per row. Thread t holds values c = c0 + j * blockDim + t (j < RMS_VPT) in
 * registers, so all of a row's loads are in flight at once: a loop with one load per
 * step waits one memory round trip per step (11 us for a 4096-value row on the H200,
 * 5.9 us this way, by ncu). Rows longer than RMS_VPT * blockDim go in chunks, reread
 * for the output; a thread only rereads values it has not yet written, so y == x is
 * safe.
 * xq non-NULL: also y's int8 blocks (n_cols % 32 == 0, blockDim % 32 == 0: the lanes
 * of a warp hold 32 consecutive values for each j). xp non-NULL: also y rounded to bf16
 * in kern_mmq's orders of `forms` (kern_xp_store; n_rows * n_cols % 256 == 0). */
#define RMS_VPT 8
__global__ void rmsnorm_kernel(const float *x, const float *w, float *y, int64_t n_cols,
                               float eps, int8_t *xq, float2 *ds, gv_xlayout lay,
                               __nv_bfloat16 *xp, int forms) {
    kern_dep_wait(); /* launched with PDL on the decode path */
    const float *xr = x + blockIdx.x * n_cols;
    float *yr = y + blockIdx.x * n_cols;
    const int64_t chunk = (int64_t)blockDim.x * RMS_VPT;
    float v[RMS_VPT];
    float ss = 0.0f;
    for (int64_t c0 = threadIdx.x; c0 < n_cols; c0 += chunk) {
#pragma unroll
        for (int j = 0; j < RMS_VPT; j++) {
            const int64_t c = c0 + (int64_t)j * blockDim.x;
            v[j] = c < n_cols ? xr[c] : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < RMS_VPT; j++)
            ss += v[j] * v[j];
    }
    ss = block_sum(ss);
    const float scale = kern_rms_scale(ss, (int)n_cols, eps);
    const bool held = n_cols <= chunk; /* v[] still holds this thread's values */
    for (int64_t c0 = threadIdx.x; c0 < n_cols; c0 += chunk) {
        if (!held) {
#pragma unroll
            for (int j = 0; j < RMS_VPT; j++) {
                const int64_t c = c0 + (int64_t)j * blockDim.x;
                v[j] = c < n_cols ? xr[c] : 0.0f;
            }
        }
#pragma unroll
        for (int j = 0; j < RMS_VPT; j++) {
            const int64_t c = c0 + (int64_t)j * blockDim.x;
            if (c >= n_cols) continue; /* warp-uniform when xq is given */
            const float o = __fmul_rn(__fmul_rn(v[j], scale), w[c]);
            yr[c] = o;
            if (xp) kern_xp_store(xp, forms, gridDim.x * n_cols, blockIdx.x * n_cols + c, o);
            if (xq) {
                const int64_t i = blockIdx.x * n_cols + c;
                gv_perm_store_at(kern_q8_block(o, i, xq, ds), blockIdx.x, (int)c, lay, xq);
            }
        }
    }
}

/* Decode rows (kern_rmsnorm picks it for n_rows <= 8): grid (n_rows, n_cols /
 * RMS_SPLIT_T) blocks of RMS_SPLIT_T threads, thread t of block s writing column
 * s * RMS_SPLIT_T + t. Every block sums the squares of its whole row itself (float4
 * loads, all in flight, from L2: the previous kernel has just written the row), in the
 * same order, so all get the same scale. A row is spread over n_cols / 128 SMs instead
 * of one, and with xq each warp quantizes the 32-value block it wrote (kern_q8_block):
 * the quantization costs one shuffle tree per warp instead of a block walking the whole
 * row (bench/NOTES.md change 14). y must not overlap x (another block may still read
 * what this one writes); n_cols % RMS_SPLIT_T == 0. */
#define RMS_SPLIT_T 128
__global__ void __launch_bounds__(RMS_SPLIT_T)
    rmsnorm_split_kernel(const float *x, const float *w, float *y, int n_cols, float eps,
                         int8_t *xq, float2 *ds, gv_xlayout lay) {
    const int64_t row = blockIdx.x;
    const int c = blockIdx.y * RMS_SPLIT_T + threadIdx.x;
    const float wc = w[c]; /* weights are no kernel's output: loaded before the wait */
    kern_dep_wait();
    const float4 *xr4 = (const float4 *)(x + row * n_cols);
    const int n4 = n_cols / 4;
    const int64_t at = row * n_cols + c;
    const float xc = x[at]; /* with the row's loads, not one round trip after its sum */
    float ss = 0.0f;
    int i = threadIdx.x;
    for (; i + 7 * RMS_SPLIT_T < n4; i += 8 * RMS_SPLIT_T) {
        float4 v[8];
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[j] = xr4[i + j * RMS_SPLIT_T];
#pragma unroll
        for (int j = 0; j < 8; j++)
            ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
    }
    for (; i < n4; i += RMS_SPLIT_T) {
        const float4 v = xr4[i];
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    ss = block_sum(ss);
    const float scale = kern_rms_scale(ss, n_cols, eps);
    const float o = __fmul_rn(__fmul_rn(xc, scale), wc);
    y[at] = o;
    if (xq) gv_perm_store_at(kern_q8_block(o, at, xq, ds), row, c, lay, xq);
}

/* xq non-NULL: also y's int8 blocks (n % 32 == 0). xp non-NULL: also y rounded to bf16 in
 * kern_mmq's orders of `forms` (kern_xp_store; n % 256 == 0). */
__global__ void silu_mul_kernel(const float *g, const float *u, float *y, int64_t n, int8_t *xq,
                                float2 *ds, gv_xlayout lay, __nv_bfloat16 *xp, int forms) {
    kern_dep_wait();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float v = kern_silu_mul1(g[i], u[i]);
        y[i] = v;
        if (xp) kern_xp_store(xp, forms, n, i, v);
        if (xq) gv_perm_store_at(kern_q8_block(v, i, xq, ds), 0, (int)i, lay, xq); /* one row */
    }
}

__global__ void add_kernel(float *x, const float *y, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] += y[i];
}

/* Row indices travel as a kernel argument (copied at launch), so the host array may
 * be reused as soon as the launcher returns. */
#define GET_ROWS_PER_LAUNCH 960
struct get_rows_idx {
    int32_t v[GET_ROWS_PER_LAUNCH];
};

/* grid (n_idx); a negative index gives a zero row. */
__global__ void get_rows_kernel(const float *src, const get_rows_idx idx, int64_t n_cols,
                                float *dst) {
    const int r = blockIdx.x;
    const int32_t s = idx.v[r];
    for (int64_t c = threadIdx.x; c < n_cols; c += blockDim.x)
        dst[r * n_cols + c] = s < 0 ? 0.0f : src[(int64_t)s * n_cols + c];
}

/* ---------------------------------------------------------------- launchers */

template <typename OUT>
static void dequant_launch(struct ops_ctx *ctx, const char *op, const struct tpi_weight *w,
                           const int32_t *ids, int64_t row0, int64_t n_rows, OUT *dst) {
    if (n_rows <= 0) return;
    const int threads = 256;
    const uint8_t *data = (const uint8_t *)w->data;
    bool known = kq_dispatch(kern_wtype(w), [&](auto type_c, auto block_c) {
        constexpr int T = decltype(type_c)::value;
        if constexpr (decltype(block_c)::value) {
            const int64_t n_units = n_rows * (w->ne0 / kq<T>::BLK * kq<T>::UPB);
            dequant_block_kernel<T, OUT>
                <<<grid_for(ctx, n_units, threads), threads, 0, ctx->stream>>>(
                    data, w->row_bytes, w->ne0, w->ne1, ids, row0, n_rows, dst);
        } else {
            dequant_elem_kernel<T, OUT>
                <<<grid_for(ctx, n_rows * w->ne0, threads), threads, 0, ctx->stream>>>(
                    data, w->row_bytes, w->ne0, w->ne1, ids, row0, n_rows, dst);
        }
    });
    if (!known) {
        kern_fail(ctx, TPI_ERR_UNSUPPORTED, op, __FILE__, __LINE__,
                  "weight type %s has no CUDA kernel", quant_type_name(w->type));
        return;
    }
    LAUNCH_OK(ctx, op);
}

/* One thread per group of 8 Q8_0 or Q4_0 blocks (BYTES: 272 or 144, 16-byte aligned): the
 * group read as BYTES / 16 16-byte words, regrouped (kern_x8_regroup) and written back. */
template <int BYTES> __global__ void x8_repack_kernel(uint8_t *data, int64_t n_groups) {
    constexpr int V = BYTES / 16;
    for (int64_t g = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; g < n_groups;
         g += (int64_t)gridDim.x * blockDim.x) {
        uint4 *p = (uint4 *)(data + g * BYTES);
        uint32_t in[4 * V], out[4 * V];
#pragma unroll
        for (int i = 0; i < V; i++) {
            const uint4 v = p[i];
            in[4 * i] = v.x, in[4 * i + 1] = v.y, in[4 * i + 2] = v.z, in[4 * i + 3] = v.w;
        }
        kern_x8_regroup<BYTES>(in, out);
#pragma unroll
        for (int i = 0; i < V; i++)
            p[i] = make_uint4(out[4 * i], out[4 * i + 1], out[4 * i + 2], out[4 * i + 3]);
    }
}

/* Whether the repack kernels may take the weight data at `data` (16-byte aligned: they
 * move it 16 bytes at a time); records the failure under `op` when not. */
static bool repack_aligned(struct ops_ctx *ctx, const uint8_t *data, const char *op) {
    if (((uintptr_t)data & 15) == 0) return true;
    kern_fail(ctx, TPI_ERR_INVALID, op, __FILE__, __LINE__,
              "weight data at %p is not 16-byte aligned", (const void *)data);
    return false;
}

/* Regroup n_groups groups of BYTES at data in place (x8_repack_kernel); op names a failure. */
template <int BYTES>
static void x8_repack(struct ops_ctx *ctx, uint8_t *data, int64_t n_groups, const char *op) {
    if (n_groups <= 0 || !repack_aligned(ctx, data, op)) return;
    x8_repack_kernel<BYTES><<<grid_for(ctx, n_groups, 128), 128, 0, ctx->stream>>>(data, n_groups);
    LAUNCH_OK(ctx, op);
}

void kern_q8_0_x8_repack(struct ops_ctx *ctx, uint8_t *data, int64_t n_groups) {
    x8_repack<KERN_Q8_0X8_BYTES>(ctx, data, n_groups, "cuda q8_0 repack");
}

void kern_q4_0_x8_repack(struct ops_ctx *ctx, uint8_t *data, int64_t n_groups) {
    x8_repack<KERN_Q4_0X8_BYTES>(ctx, data, n_groups, "cuda q4_0 repack");
}

/* A warp per group of BYTES (8 GGUF blocks, 16-byte aligned): the group copied to shared
 * memory, then every byte of its regrouped form gathered from there (SRC::at(o): the
 * group's byte that byte o takes, kern_q6_k_x8_src / kern_q3_k_x8_src) and written back
 * 16 bytes at a time. */
#define GX8_WARPS 4
struct q6x8_src {
    static __device__ __forceinline__ int at(int o) { return kern_q6_k_x8_src(o); }
};
struct q3x8_src {
    static __device__ __forceinline__ int at(int o) { return kern_q3_k_x8_src(o); }
};
template <int BYTES, typename SRC>
__global__ void __launch_bounds__(GX8_WARPS * 32) gx8_repack_kernel(uint8_t *data, int64_t n_groups) {
    constexpr int PIECES = BYTES / 16;
    __shared__ uint4 grp4[GX8_WARPS][PIECES];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const uint8_t *grp = (const uint8_t *)grp4[warp];
    for (int64_t g = blockIdx.x * (int64_t)GX8_WARPS + warp; g < n_groups;
         g += (int64_t)gridDim.x * GX8_WARPS) {
        uint4 *p = (uint4 *)(data + g * BYTES);
        for (int i = lane; i < PIECES; i += 32)
            grp4[warp][i] = p[i];
        __syncwarp();
        for (int i = lane; i < PIECES; i += 32) {
            uint32_t w[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                uint32_t v = 0;
#pragma unroll
                for (int b = 0; b < 4; b++)
                    v |= (uint32_t)grp[SRC::at(16 * i + 4 * k + b)] << (8 * b);
                w[k] = v;
            }
            p[i] = make_uint4(w[0], w[1], w[2], w[3]);
        }
        __syncwarp(); /* the group's copy is refilled next */
    }
}

/* Regroup n_groups groups of BYTES at data in place (gx8_repack_kernel); op names a failure. */
template <int BYTES, typename SRC>
static void gx8_repack(struct ops_ctx *ctx, uint8_t *data, int64_t n_groups, const char *op) {
    static_assert(BYTES % 16 == 0, "groups move in 16-byte pieces");
    if (n_groups <= 0 || !repack_aligned(ctx, data, op)) return;
    const int64_t blocks = (n_groups + GX8_WARPS - 1) / GX8_WARPS;
    gx8_repack_kernel<BYTES, SRC>
        <<<grid_for(ctx, blocks * GX8_WARPS * 32, GX8_WARPS * 32), GX8_WARPS * 32, 0, ctx->stream>>>(
            data, n_groups);
    LAUNCH_OK(ctx, op);
}

void kern_q6_k_x8_repack(struct ops_ctx *ctx, uint8_t *data, int64_t n_groups) {
    gx8_repack<KERN_Q6_KX8_BYTES, q6x8_src>(ctx, data, n_groups, "cuda q6_k repack");
}

void kern_q3_k_x8_repack(struct ops_ctx *ctx, uint8_t *data, int64_t n_groups) {
    gx8_repack<KERN_Q3_KX8_BYTES, q3x8_src>(ctx, data, n_groups, "cuda q3_k repack");
}

void kern_embed(struct ops_ctx *ctx, const struct tpi_weight *w, const int32_t *ids, int n_tokens,
                float *out) {
    dequant_launch<float>(ctx, "cuda embed", w, ids, 0, n_tokens, out);
}

void kern_dequant_bf16(struct ops_ctx *ctx, const struct tpi_weight *w, int64_t row0,
                       int64_t n_rows, __nv_bfloat16 *dst) {
    const char *op = "cuda matmul (dequantize)";
    if (n_rows <= 0) return;
    const bool dst_ok = ((uintptr_t)dst & 15) == 0;
    if (dst_ok && w->type == TPI_TYPE_F16 && (n_rows * w->ne0) % 8 == 0 &&
        ((uintptr_t)w->data & 15) == 0 && (row0 * w->ne0) % 8 == 0) {
        const int64_t n8 = n_rows * w->ne0 / 8;
        f16_to_bf16_vec_kernel<<<grid_for(ctx, n8, 256), 256, 0, ctx->stream>>>(
            (const uint4 *)((const uint8_t *)w->data + row0 * w->row_bytes), (uint4 *)dst, n8);
        LAUNCH_OK(ctx, op);
        return;
    }
    bool done = false;
    if (dst_ok)
        kq_dispatch(kern_wtype(w), [&](auto type_c, auto block_c) {
            constexpr int T = decltype(type_c)::value;
            if constexpr (decltype(block_c)::value) {
                const int64_t nb_row = w->ne0 / kq<T>::BLK, n_blocks = n_rows * nb_row;
                const int64_t tiles = (n_blocks + DQ_TILE / kq<T>::BLK - 1) / (DQ_TILE / kq<T>::BLK);
                const int64_t cap = (int64_t)ctx->n_sm * 8;
                dequant_bf16_tile_kernel<T><<<(unsigned)(tiles < cap ? tiles : cap), 256, 0,
                                              ctx->stream>>>((const uint8_t *)w->data,
                                                             w->row_bytes, nb_row, row0, n_blocks,
                                                             dst);
                done = true;
            }
        });
    if (done) {
        LAUNCH_OK(ctx, op);
        return;
    }
    dequant_launch<__nv_bfloat16>(ctx, op, w, NULL, row0, n_rows, dst);
}

void kern_f32_to_bf16(struct ops_ctx *ctx, const float *x, __nv_bfloat16 *y, int64_t n) {
    if (n <= 0) return;
    if (n % 4 == 0 && ((uintptr_t)x & 15) == 0 && ((uintptr_t)y & 7) == 0) {
        f32_to_bf16_vec_kernel<<<grid_for(ctx, n / 4, 256), 256, 0, ctx->stream>>>(
            (const float4 *)x, (uint2 *)y, n / 4);
        LAUNCH_OK(ctx, "cuda matmul (x to bf16)");
        return;
    }
    f32_to_bf16_kernel<<<grid_for(ctx, n, 256), 256, 0, ctx->stream>>>(x, y, n);
    LAUNCH_OK(ctx, "cuda matmul (x to bf16)");
}

void kern_rmsnorm(struct ops_ctx *ctx, const float *x, const float *w, float *y, int64_t n_rows,
                  int64_t n_cols, float eps) {
    kern_xq_forget(ctx);
    if (n_rows <= 0 || n_cols <= 0) return;
    if (n_rows > INT32_MAX) {
        kern_fail(ctx, TPI_ERR_INVALID, "cuda rmsnorm", __FILE__, __LINE__, "%lld rows",
                  (long long)n_rows);
        return;
    }
    // enough threads to hold the row in registers (RMS_VPT each), whole warps, <= 1024
    const int64_t want = (n_cols + RMS_VPT - 1) / RMS_VPT;
    const int threads = (int)TPI_MIN((int64_t)1024, TPI_MAX((int64_t)32, (want + 31) / 32 * 32));
    int8_t *xq = NULL;
    float2 *ds = NULL;
    const bool q8 = n_rows <= 8 && kern_xq_claim(ctx, XQ_BY_NORM, n_rows, n_cols, &xq, &ds);
    int forms = 0;
    __nv_bfloat16 *xp = q8 ? NULL : kern_xp_claim(ctx, n_rows, n_rows * n_cols, &forms);
    if ((ctx->diag_skip & DIAG_SKIP_NORM) && q8) { /* measuring only: y is not written */
        kern_xq_remember(ctx, y, n_rows * n_cols);
        return;
    }
    const gv_xlayout lay = gv_xlayout_of((int)TPI_MIN(n_rows, (int64_t)8), n_cols);
    const bool apart = y + n_rows * n_cols <= x || x + n_rows * n_cols <= y;
    if (ctx->rms_split && n_rows <= 8 && n_cols % RMS_SPLIT_T == 0 && n_cols <= 65536 && apart)
        kern_launch(ctx->pdl, rmsnorm_split_kernel,
                    dim3((unsigned)n_rows, (unsigned)(n_cols / RMS_SPLIT_T)), dim3(RMS_SPLIT_T), 0,
                    ctx->stream, x, w, y, (int)n_cols, eps, xq, ds, lay);
    else
        kern_launch(ctx->pdl, rmsnorm_kernel, dim3((unsigned)n_rows), dim3(threads), 0, ctx->stream,
                    x, w, y, n_cols, eps, xq, ds, lay, xp, forms);
    if (!LAUNCH_OK(ctx, "cuda rmsnorm")) return;
    if (q8) kern_xq_remember(ctx, y, n_rows * n_cols);
    if (xp) kern_xp_remember(ctx, y, n_rows * n_cols, forms);
}

void kern_add_bias(struct ops_ctx *ctx, float *y, const float *b, int64_t n_rows, int64_t n_cols) {
    if (n_rows <= 0 || n_cols <= 0) return;
    add_bias_kernel<<<grid_for(ctx, n_rows * n_cols, 256), 256, 0, ctx->stream>>>(y, b, n_rows,
                                                                                  n_cols);
    LAUNCH_OK(ctx, "cuda add_bias");
}

void kern_rope_neox(struct ops_ctx *ctx, float *x, const struct ops_batch *b, int n_head,
                    int head_dim, const struct rope_pairs *rp) {
    const int n_rot = rp->n_rot;
    if (n_rot <= 0 || n_rot > head_dim || n_rot % 2 != 0) {
        kern_fail(ctx, TPI_ERR_INVALID, "cuda rope_neox", __FILE__, __LINE__,
                  "n_rot %d must be even and in (0, head_dim %d]", n_rot, head_dim);
        return;
    }
    if (b->n_tokens <= 0 || n_head <= 0) return;
    const int half = n_rot / 2;
    const int threads = half >= 128 ? 128 : ((half + 31) / 32) * 32;
    dim3 grid((unsigned)b->n_tokens, (unsigned)n_head);
    rope_neox_kernel<<<grid, threads, 0, ctx->stream>>>(x, b->pos, n_head, head_dim, *rp);
    LAUNCH_OK(ctx, "cuda rope_neox");
}

/* rope_pair_inv(rp, i) for i < n_rot / 2 in device memory (the table ctx keeps for one
 * rope), made on the host with the kernels' formula (rope.h); NULL while a graph is
 * being recorded and the table is not made yet (the kernel then computes them), or on
 * failure (recorded). */
const double *kern_rope_inv_table(struct ops_ctx *ctx, const struct rope_pairs *rp) {
    const int n_rot = rp->n_rot;
    if (ctx->rope_inv && ctx->rope_inv_n > 0 && rope_pairs_equal(&ctx->rope_inv_of, rp))
        return ctx->rope_inv;
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(ctx->stream, &cap) != cudaSuccess ||
        cap != cudaStreamCaptureStatusNone)
        return NULL;
    const char *op = "cuda qk_norm_rope (inverse frequencies)";
    /* head_dim <= 4096: at most 2048 pairs; made once, remade only for another n_rot/base */
    if (!ctx->rope_inv &&
        !CUDA_OK(ctx, op, cudaMalloc((void **)&ctx->rope_inv, 2048 * sizeof(double))))
        return NULL;
    double tab[2048];
    for (int i = 0; i < n_rot / 2; i++)
        tab[i] = rope_pair_inv(rp, i);
    /* On ctx->stream, after the queued work that may still read the old table, and waited
     * for (tab is on this stack). Not cudaMemcpy: it runs on the legacy stream, which
     * does not order against our non-blocking one, and from pageable memory it may return
     * before the bytes land, so the next kernel could read a half-written table (the
     * model GPU tests saw a first prefill rotated wrongly). */
    if (!CUDA_OK(ctx, op,
                 cudaMemcpyAsync(ctx->rope_inv, tab, sizeof(double) * (size_t)(n_rot / 2),
                                 cudaMemcpyHostToDevice, ctx->stream)) ||
        !CUDA_OK(ctx, op, cudaStreamSynchronize(ctx->stream)))
        return NULL;
    ctx->rope_inv_of = *rp;
    ctx->rope_inv_n = n_rot / 2;
    return ctx->rope_inv;
}

void kern_qk_norm_rope(struct ops_ctx *ctx, float *q, float *k, const float *q_norm,
                       const float *k_norm, const struct ops_batch *b, int n_head, int n_kv_head,
                       int head_dim, const struct rope_pairs *rp, float eps) {
    const char *op = "cuda qk_norm_rope";
    const int n_rot = rp->n_rot;
    if (n_rot <= 0 || n_rot > head_dim || n_rot % 2 != 0 || head_dim > 4096) {
        kern_fail(ctx, TPI_ERR_INVALID, op, __FILE__, __LINE__,
                  "n_rot %d must be even and in (0, head_dim %d], head_dim <= 4096", n_rot,
                  head_dim);
        return;
    }
    if (b->n_tokens <= 0 || n_head + n_kv_head <= 0) return;
    if ((ctx->diag_skip & DIAG_SKIP_ROPE) && b->n_tokens <= 8) return; /* measuring only */
    int threads = ((TPI_MAX(n_rot / 2, head_dim / 2) + 31) / 32) * 32;
    threads = TPI_MIN(TPI_MAX(threads, 32), 256);
    dim3 grid((unsigned)b->n_tokens, (unsigned)(n_head + n_kv_head));
    const double *tab = kern_rope_inv_table(ctx, rp);
    kern_launch(ctx->pdl, tab ? qk_norm_rope_kernel<true> : qk_norm_rope_kernel<false>, grid,
                dim3(threads), (size_t)head_dim * sizeof(float), ctx->stream, q, k, q_norm, k_norm,
                (const int32_t *)b->pos, n_head, n_kv_head, head_dim, *rp, eps, tab);
    LAUNCH_OK(ctx, op);
}

void kern_silu_mul_rows(struct ops_ctx *ctx, const float *g, const float *u, float *y,
                        int64_t n_rows, int64_t n) {
    kern_xq_forget(ctx);
    if (n <= 0) return;
    int8_t *xq = NULL;
    float2 *ds = NULL;
    const bool q8 = kern_xq_claim(ctx, XQ_BY_SILU, 1, n, &xq, &ds);
    int forms = 0;
    __nv_bfloat16 *xp = q8 ? NULL : kern_xp_claim(ctx, n_rows, n, &forms);
    const gv_xlayout lay = gv_xlayout_of(1, n);
    kern_launch(ctx->pdl, silu_mul_kernel, dim3(grid_for(ctx, n, 256)), dim3(256), 0, ctx->stream,
                g, u, y, n, xq, ds, lay, xp, forms);
    if (!LAUNCH_OK(ctx, "cuda silu_mul")) return;
    if (q8) kern_xq_remember(ctx, y, n);
    if (xp) kern_xp_remember(ctx, y, n, forms);
}

void kern_silu_mul(struct ops_ctx *ctx, const float *g, const float *u, float *y, int64_t n) {
    kern_silu_mul_rows(ctx, g, u, y, 0, n);
}

void kern_add(struct ops_ctx *ctx, float *x, const float *y, int64_t n) {
    if (n <= 0) return;
    add_kernel<<<grid_for(ctx, n, 256), 256, 0, ctx->stream>>>(x, y, n);
    LAUNCH_OK(ctx, "cuda add");
}

void kern_get_rows(struct ops_ctx *ctx, const float *src, const int32_t *idx_host, int n_idx,
                   int64_t n_cols, float *dst) {
    for (int r0 = 0; r0 < n_idx; r0 += GET_ROWS_PER_LAUNCH) {
        const int n = TPI_MIN(GET_ROWS_PER_LAUNCH, n_idx - r0);
        get_rows_idx idx;
        for (int r = 0; r < n; r++) {
            idx.v[r] = idx_host[r0 + r];
            if (idx.v[r] < 0)
                kern_fail(ctx, TPI_ERR_INVALID, "cuda get_rows", __FILE__, __LINE__,
                          "index %d is %d (< 0)", r0 + r, idx.v[r]);
        }
        const int threads = n_cols >= 256 ? 256 : 64;
        get_rows_kernel<<<(unsigned)n, threads, 0, ctx->stream>>>(src, idx, n_cols,
                                                                  dst + (int64_t)r0 * n_cols);
        if (!LAUNCH_OK(ctx, "cuda get_rows")) return;
    }
}
