/*
 * chain_common.cuh — what bench/stream_chain.cu and bench/gemv_chain.cu share: the CUDA
 * error check (CK, naming the program CHAIN_PROG, which the includer defines), the PDL
 * wait, a launch configuration with PDL, and the median time of a graph's replays. Header-only: each program still builds
 * with one nvcc command.
 */
#ifndef CHAIN_COMMON_CUH
#define CHAIN_COMMON_CUH

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                             \
    do {                                                                                  \
        cudaError_t e_ = (x);                                                             \
        if (e_ != cudaSuccess) {                                                          \
            fprintf(stderr, "%s: %s: %s (line %d)\n", CHAIN_PROG, #x, cudaGetErrorString(e_), \
                    __LINE__);                                                            \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

/* Wait for the previous launch's results (PDL; a no-op without the attribute). */
__device__ __forceinline__ void dep_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

/* A launch configuration on stream st, with the PDL attribute (in *at) when pdl. */
static cudaLaunchConfig_t chain_cfg(cudaStream_t st, bool pdl, cudaLaunchAttribute *at) {
    cudaLaunchConfig_t cfg = {};
    at->id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at->val.programmaticStreamSerializationAllowed = 1;
    cfg.stream = st;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 1 : 0;
    return cfg;
}

/* Microseconds one replay of graph g takes on stream st: the median of reps (at most 64)
 * replays after two untimed ones. */
static float median_us(cudaGraphExec_t g, cudaStream_t st, int reps) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    float t[64];
    if (reps > 64) reps = 64;
    for (int r = 0; r < reps + 2; r++) {
        CK(cudaEventRecord(a, st));
        CK(cudaGraphLaunch(g, st));
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (r >= 2) t[r - 2] = ms * 1000.0f;
    }
    for (int i = 1; i < reps; i++) /* insertion sort: reps is small */
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            const float x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return t[reps / 2];
}

#endif /* CHAIN_COMMON_CUH */
