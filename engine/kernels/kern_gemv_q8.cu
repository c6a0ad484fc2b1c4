/*
 * kern_gemv_q8.cu — the v3 decode matrix-vector path's launches and kernels for
 * the 8- and 16-bit weights: Q8_0 (GGUF blocks and the 8-block groups), BF16, F16: one part of
 * kern_gemv.cu's types, compiled on its own (kern_gemv.cuh says how the parts divide the path).
 */
#include "kern_gemv_launch.cuh"

GV_PART_TYPE(TPI_TYPE_Q8_0);
GV_PART_TYPE(KERN_TYPE_Q8_0X8);
GV_PART_TYPE(TPI_TYPE_BF16);
GV_PART_TYPE(TPI_TYPE_F16);
