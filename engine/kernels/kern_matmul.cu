/*
 * kern_matmul.cu — y(n_rows, ne1) = x(n_rows, ne0) * W^T for every weight type.
 *
 * Decode (n_rows <= MATVEC_MAX_ROWS): matrix-vector kernels, a warp per output
 * feature; the warp's lanes decode consecutive units of the weight row (each
 * byte read once, in registers) and dot them with up to 8 x rows at once, then a
 * shuffle reduction. Memory-bound by design: the weight is read exactly once.
 *
 * Prefill (more rows): W is dequantized to bf16 in slabs of rows, x converted to
 * bf16, and cuBLAS multiplies with f32 accumulation (tensor cores). F32 weights
 * use an f32 SGEMM and BF16 weights are used as stored. The bf16 roundings of x and
 * W give a normalized squared error around 1e-5 against the f32 reference.
 *
 * cuBLAS is column-major: the row-major (ne1 x ne0) W is a column-major (ne0 x ne1)
 * matrix with lda = ne0, so y^T (ne1 x n_rows, ldc = ne1) = op_T(W) * x^T.
 */
#include "kern_common.cuh"
#include "kern_quant.cuh"

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

/* ---------------------------------------------------------------- launchers */

template <int NR>
static void matvec_launch(struct ops_ctx *ctx, const struct tpi_weight *w, const float *x, float *y,
                          int n_rows) {
    const unsigned blocks = (unsigned)((w->ne1 + MATVEC_WARPS - 1) / MATVEC_WARPS);
    const uint8_t *data = (const uint8_t *)w->data;
    kq_dispatch(w->type, [&](auto type_c, auto block_c) {
        constexpr int T = decltype(type_c)::value;
        if constexpr (decltype(block_c)::value)
            matvec_block_kernel<T, NR><<<blocks, MATVEC_WARPS * 32, 0, ctx->stream>>>(
                data, w->row_bytes, w->ne0, w->ne1, x, y, n_rows);
        else
            matvec_elem_kernel<T, NR><<<blocks, MATVEC_WARPS * 32, 0, ctx->stream>>>(
                data, w->row_bytes, w->ne0, w->ne1, x, y, n_rows);
    });
}

static void gemm_launch(struct ops_ctx *ctx, const struct tpi_weight *w, const float *x, float *y,
                        int64_t n_rows) {
    const char *op = "cuda matmul";
    const float one = 1.0f, zero = 0.0f;
    const int k = (int)w->ne0, n = (int)n_rows, ldc = (int)w->ne1;
    if (w->type == TPI_TYPE_F32) {
        /* plain f32 SGEMM: F32 weights are small (and tests use them as the exact case) */
        CUBLAS_OK(ctx, op,
                  cublasGemmEx(ctx->cublas, CUBLAS_OP_T, CUBLAS_OP_N, ldc, n, k, &one, w->data,
                               CUDA_R_32F, k, x, CUDA_R_32F, k, &zero, y, CUDA_R_32F, ldc,
                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return;
    }
    __nv_bfloat16 *x16 = (__nv_bfloat16 *)kern_scratch_get(
        ctx, &ctx->x16, (size_t)n_rows * (size_t)w->ne0 * sizeof(__nv_bfloat16), op);
    if (!x16) return;
    kern_f32_to_bf16(ctx, x, x16, n_rows * w->ne0);
    if (w->type == TPI_TYPE_BF16) {
        CUBLAS_OK(ctx, op,
                  cublasGemmEx(ctx->cublas, CUBLAS_OP_T, CUBLAS_OP_N, ldc, n, k, &one, w->data,
                               CUDA_R_16BF, k, x16, CUDA_R_16BF, k, &zero, y, CUDA_R_32F, ldc,
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
                       cublasGemmEx(ctx->cublas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, w16,
                                    CUDA_R_16BF, k, x16, CUDA_R_16BF, k, &zero, y + r0, CUDA_R_32F,
                                    ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)))
            return;
    }
}

void kern_matmul(struct ops_ctx *ctx, const struct tpi_weight *w, const float *x, float *y,
                 int64_t n_rows) {
    if (n_rows <= 0 || w->ne1 <= 0) return;
    if (!kern_type_supported(w->type)) {
        kern_fail(ctx, TPI_ERR_UNSUPPORTED, "cuda matmul", __FILE__, __LINE__,
                  "weight type %s has no CUDA kernel", quant_type_name(w->type));
        return;
    }
    if (w->ne0 > INT32_MAX || w->ne1 > INT32_MAX || n_rows > INT32_MAX) {
        kern_fail(ctx, TPI_ERR_INVALID, "cuda matmul", __FILE__, __LINE__,
                  "shape %lld x %lld with %lld rows exceeds 32-bit sizes", (long long)w->ne0,
                  (long long)w->ne1, (long long)n_rows);
        return;
    }
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
    gemm_launch(ctx, w, x, y, n_rows);
}
