/*
 * kern_xq.cuh — the layout of a decode step's quantized x in the q8 scratch: int8
 * blocks of 32 values, their (d, d * sum) pairs, and kind p's permuted copies
 * (kern_gemv.cu reads them; kern_gemv_v3_prepare, the rmsnorm/silu_mul producers of
 * kern_elem.cu and the decode attention of kern_attn_mma.cu write them); and the order
 * of the bf16 x that kern_mmq's raw kernels read at 9-32 rows (kern_xp_q4k, kern_xp_q6k).
 * Host and device.
 */
#ifndef KERN_XQ_CUH
#define KERN_XQ_CUH

#include <cuda_bf16.h>
#include <stddef.h>
#include <stdint.h>

/* Kind p's permuted copies of x (one per item shape): the physical byte, within a row
 * of the copy, of logical value v. Items are numbered along the row (it); the 32 items
 * of a group g = it / 32 are what a warp's 32 lanes take in one step, and unit k of
 * item it goes to group g's 512-byte slice k at 16 * (it % 32). Rows of a copy are
 * padded to whole groups (GS bytes). */
#define GV_GS_B32 1024 /* items of 32 values (Q8_0, Q4_0, Q5_0): 2 units each */
#define GV_GS_K4 2048  /* items of 64 values (Q4_K/Q5_K chunks, Q6_K halves): 4 units each */
__host__ __device__ __forceinline__ int gv_perm_b32(int v) {
    const int it = v >> 5, k = (v >> 4) & 1;
    return GV_GS_B32 * (it >> 5) + 512 * k + 16 * (it & 31) + (v & 15);
}
__host__ __device__ __forceinline__ int gv_perm_k4(int v) { /* Q4_K, Q5_K: 64 values in order */
    const int it = v >> 6, k = (v >> 4) & 3;
    return GV_GS_K4 * (it >> 5) + 512 * k + 16 * (it & 31) + (v & 15);
}
__host__ __device__ __forceinline__ int gv_perm_q6(int v) { /* Q6_K: see gv<TPI_TYPE_Q6_K> */
    const int blk = v >> 8, w = v & 255, n = w >> 7, k = (w >> 5) & 3, i0 = (w >> 4) & 1;
    const int it = 4 * blk + 2 * n + i0;
    return GV_GS_K4 * (it >> 5) + 512 * k + 16 * (it & 31) + (v & 15);
}
/* Where prepare puts the parts of x in its scratch, from xq (all 256-byte aligned). */
struct gv_xlayout {
    size_t ds_off, b32_off, k4_off, q6_off, n_bytes;
    int b32_stride, k4_stride; /* padded row strides of the copies */
};
__host__ __device__ __forceinline__ gv_xlayout gv_xlayout_of(int n_rows, int64_t ne0) {
    gv_xlayout l;
    const size_t n_vals = (size_t)n_rows * (size_t)ne0;
    l.b32_stride = (int)((ne0 + GV_GS_B32 - 1) / GV_GS_B32 * GV_GS_B32);
    l.k4_stride = (int)((ne0 + GV_GS_K4 - 1) / GV_GS_K4 * GV_GS_K4);
    l.ds_off = (n_vals + 255) / 256 * 256;
    l.b32_off = l.ds_off + (n_vals / 32 * sizeof(float2) + 255) / 256 * 256;
    l.k4_off = l.b32_off + (size_t)n_rows * l.b32_stride;
    l.q6_off = l.k4_off + (size_t)n_rows * l.k4_stride;
    l.n_bytes = l.q6_off + (size_t)n_rows * l.k4_stride;
    return l;
}

/* Value at of row `row` of x, quantized to q, into the three permuted copies. */
__device__ __forceinline__ void gv_perm_store_at(int q, int64_t row, int at, const gv_xlayout &lay,
                                                 int8_t *xq) {
    xq[lay.b32_off + row * lay.b32_stride + gv_perm_b32(at)] = (int8_t)q;
    xq[lay.k4_off + row * lay.k4_stride + gv_perm_k4(at)] = (int8_t)q;
    xq[lay.q6_off + row * lay.k4_stride + gv_perm_q6(at)] = (int8_t)q;
}
/* Value i (row i / ne0) of x, quantized to q, into the three permuted copies. Producers
 * that know the row and column take gv_perm_store_at: the 64-bit division here is a
 * chain of ~30 dependent instructions on their last path. */
__device__ __forceinline__ void gv_perm_store(int q, int64_t i, int64_t ne0, const gv_xlayout &lay,
                                              int8_t *xq) {
    const int64_t row = i / ne0;
    gv_perm_store_at(q, row, (int)(i - row * ne0), lay, xq);
}

/* Where value i of x (rows of whole 256-value blocks, so i may run on across rows)
 * goes in its bf16 form for kern_mmq's raw kernels of a type whose kq<T>::goff has G
 * groups (mmq_permute_x<T>'s order): each 256 values stay in place as a block, and
 * within it the 16 steps of 16 values are laid out as the kernel stages them. Value r of
 * a block is unit u = 8 (r / (32 G)) + (r % 32) / 4's value j = r % 4 of group g = (r /
 * 32) % G (goff); that unit is quad lane u % 4 of step G (u / 4) + g, whose values 0, 1
 * sit at 2 lane + 0, 1 and 2, 3 at 2 lane + 8, 9. G 2: Q4_K (kern_xp_q4k); G 4: Q6_K's
 * 8-block groups (kern_xp_q6k). */
template <int G> __host__ __device__ __forceinline__ int64_t kern_xp_at(int64_t i) {
    const int r = (int)(i & 255);
    const int u = 8 * (r / (32 * G)) + ((r & 31) >> 2), g = (r >> 5) & (G - 1), j = r & 3;
    const int step = G * (u >> 2) + g;
    return (i & ~(int64_t)255) + 16 * step + 2 * (u & 3) + (j & 1) + 8 * (j >> 1);
}
__host__ __device__ __forceinline__ int64_t kern_xp_q4k(int64_t i) { return kern_xp_at<2>(i); }
__host__ __device__ __forceinline__ int64_t kern_xp_q6k(int64_t i) { return kern_xp_at<4>(i); }
/* Value v of x (rounded) into the forms of `forms` (MMQ_RAW_* bits: 1 Q4_K's order at
 * xp, 2 Q6_K's groups' at xp + n_vals). */
__device__ __forceinline__ void kern_xp_store(__nv_bfloat16 *xp, int forms, int64_t n_vals,
                                              int64_t i, float v) {
    const __nv_bfloat16 b = __float2bfloat16_rn(v);
    if (forms & 1) xp[kern_xp_q4k(i)] = b;
    if (forms & 2) xp[n_vals + kern_xp_q6k(i)] = b;
}

#endif /* KERN_XQ_CUH */
