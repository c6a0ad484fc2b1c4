/*
 * kern_gemv_q5.cu — the v3 decode matrix-vector path's launches and kernels for
 * the 5-bit 32-value blocks: Q5_0, Q5_1: one part of kern_gemv.cu's types, compiled on its own
 * (kern_gemv.cuh says how the parts divide the path).
 */
#include "kern_gemv_launch.cuh"

GV_PART_TYPE(TPI_TYPE_Q5_0);
GV_PART_TYPE(TPI_TYPE_Q5_1);
