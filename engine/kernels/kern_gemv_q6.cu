/*
 * kern_gemv_q6.cu — the v3 decode matrix-vector path's launches and kernels for
 * Q6_K (GGUF blocks and the 8-block groups): one part of kern_gemv.cu's types, compiled on its own
 * (kern_gemv.cuh says how the parts divide the path).
 */
#include "kern_gemv_launch.cuh"

GV_PART_TYPE(TPI_TYPE_Q6_K);
GV_PART_TYPE(KERN_TYPE_Q6_KX8);
