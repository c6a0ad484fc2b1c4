/*
 * kern_gemv_k2.cu — the v3 decode matrix-vector path's launches and kernels for the
 * 2-bit K-quants, Q3_K (GGUF blocks and 8-block groups) and Q2_K (Q6_K's item geometry
 * and permuted x): one part of kern_gemv.cu's types, compiled on its own (kern_gemv.cuh
 * says how the parts divide the path).
 */
#include "kern_gemv_launch.cuh"

GV_PART_TYPE(TPI_TYPE_Q3_K);
GV_PART_TYPE(KERN_TYPE_Q3_KX8);
GV_PART_TYPE(TPI_TYPE_Q2_K);
