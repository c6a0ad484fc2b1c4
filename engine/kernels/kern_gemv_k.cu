/*
 * kern_gemv_k.cu — the v3 decode matrix-vector path's launches and kernels for
 * the 64-value-item K-quants, Q4_K and Q5_K, and their two-type launches beside Q6_K's
 * groups (gv_mix_launch): one part of kern_gemv.cu's types, compiled on its own
 * (kern_gemv.cuh says how the parts divide the path).
 */
#include "kern_gemv_launch.cuh"

GV_PART_TYPE(TPI_TYPE_Q4_K);
GV_PART_TYPE(TPI_TYPE_Q5_K);

#define GV_MIX_INSTANCE(K)                                                                         \
    template void gv_mix_launch<K>(struct ops_ctx *, const gv_cfg &,                               \
                                   const struct tpi_weight *(&)[2][OPS_MAX_FUSED],                 \
                                   float *(&)[2][OPS_MAX_FUSED], const int(&)[2], int,             \
                                   const struct kern_gemv_x *, int, cudaStream_t)
GV_MIX_INSTANCE(TPI_TYPE_Q4_K);
GV_MIX_INSTANCE(TPI_TYPE_Q5_K);
