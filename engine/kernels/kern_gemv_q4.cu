/*
 * kern_gemv_q4.cu — the v3 decode matrix-vector path's launches and kernels for
 * the 4-bit 32-value blocks: Q4_0 (GGUF blocks and the 8-block groups), Q4_1: one part of
 * kern_gemv.cu's types, compiled on its own (kern_gemv.cuh says how the parts divide the path).
 */
#include "kern_gemv_launch.cuh"

GV_PART_TYPE(TPI_TYPE_Q4_0);
GV_PART_TYPE(KERN_TYPE_Q4_0X8);
GV_PART_TYPE(TPI_TYPE_Q4_1);
