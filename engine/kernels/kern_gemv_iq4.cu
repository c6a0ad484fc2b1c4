/*
 * kern_gemv_iq4.cu — the v3 decode matrix-vector path's launches and kernels for IQ4_NL
 * and IQ4_XS (Q4_0's item layout with a 16-level table; 32-value items): one part of
 * kern_gemv.cu's types, compiled on its own (kern_gemv.cuh says how the parts divide the
 * path).
 */
#include "kern_gemv_launch.cuh"

GV_PART_TYPE(TPI_TYPE_IQ4_NL);
GV_PART_TYPE(TPI_TYPE_IQ4_XS);
