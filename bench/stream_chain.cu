/*
 * stream_chain.cu — how fast a chain of dependent read-only launches can stream on one
 * GPU: the ceiling that separate kernel launches put on a decode step's products.
 *
 * A chain is N launches in one CUDA graph, each reading its own S bytes (consecutive
 * slices of a pool far larger than L2, so nothing is an L2 hit) and writing one word a
 * block. Printed per (S, grid, mode): microseconds a launch and the bytes' rate, next to
 * one launch that reads all N * S bytes (the asymptote). Modes:
 *   plain  no programmatic dependent launch (PDL): each launch starts after the last ends;
 *   pdl    PDL, each kernel waits (griddepcontrol.wait) before its loads, as the decode
 *          kernels do;
 *   early  PDL, each kernel lets the next launch at once (launch_dependents) and issues its
 *          loads before its wait (only its one-word store follows the wait): the stream of
 *          a launch overlaps the previous launch's tail as far as the hardware allows.
 * Grids: "wave" is one resident wave (8 blocks of 256 threads an SM, grid-stride, 4
 * 16-byte loads in flight a thread); "tiles" is one block of 128 threads a 16 KB tile
 * (as a product's blocks own rows), several waves for large S.
 *
 * Build and run (not part of the CMake build; bench/NOTES.md change 68):
 *   nvcc -O3 -arch=sm_90 -o stream_chain bench/stream_chain.cu && ./stream_chain
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CHAIN_PROG "stream_chain"
#include "chain_common.cuh"

enum { MODE_PLAIN, MODE_PDL, MODE_EARLY };

__device__ __forceinline__ void dep_launch() { asm volatile("griddepcontrol.launch_dependents;"); }

__device__ __forceinline__ uint32_t fold(int4 v) {
    return (uint32_t)v.x ^ (uint32_t)v.y ^ (uint32_t)v.z ^ (uint32_t)v.w;
}

/* Reduce the thread's words to one a block and store it (after the wait in every mode). */
__device__ __forceinline__ void finish(uint32_t acc, uint32_t *out, int mode) {
    __shared__ uint32_t red[32];
    for (int o = 16; o > 0; o >>= 1)
        acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (mode == MODE_EARLY) dep_wait();
    if (threadIdx.x == 0) {
        uint32_t r = 0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++)
            r ^= red[w];
        out[blockIdx.x] = r;
    }
}

/* One resident wave, grid-stride, 4 loads in flight a thread. */
__global__ void __launch_bounds__(256) k_wave(const int4 *__restrict__ p, size_t n16,
                                              uint32_t *out, int mode) {
    if (mode == MODE_EARLY) dep_launch();
    if (mode == MODE_PDL) dep_wait();
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    uint32_t acc = 0;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        const int4 a = __ldg(p + i), b = __ldg(p + i + stride), c = __ldg(p + i + 2 * stride),
                   d = __ldg(p + i + 3 * stride);
        acc ^= fold(a) ^ fold(b) ^ fold(c) ^ fold(d);
    }
    for (; i < n16; i += stride)
        acc ^= fold(__ldg(p + i));
    finish(acc, out, mode);
}

/* One block of 128 threads a 16 KB tile: 8 loads of 16 bytes a thread, all in flight. */
__global__ void __launch_bounds__(128) k_tiles(const int4 *__restrict__ p, size_t n16,
                                               uint32_t *out, int mode) {
    if (mode == MODE_EARLY) dep_launch();
    if (mode == MODE_PDL) dep_wait();
    const size_t base = (size_t)blockIdx.x * 1024;
    int4 v[8];
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const size_t i = base + threadIdx.x + 128 * k;
        v[k] = i < n16 ? __ldg(p + i) : make_int4(0, 0, 0, 0);
    }
    uint32_t acc = 0;
#pragma unroll
    for (int k = 0; k < 8; k++)
        acc ^= fold(v[k]);
    finish(acc, out, mode);
}

static void launch(int tiles, const int4 *p, size_t n16, uint32_t *out, int mode, int n_sm,
                   cudaStream_t st) {
    cudaLaunchAttribute at;
    cudaLaunchConfig_t cfg = chain_cfg(st, mode != MODE_PLAIN, &at);
    if (tiles) {
        cfg.gridDim = dim3((unsigned)((n16 + 1023) / 1024));
        cfg.blockDim = dim3(128);
        CK(cudaLaunchKernelEx(&cfg, k_tiles, p, n16, out, mode));
    } else {
        cfg.gridDim = dim3((unsigned)(n_sm * 8));
        cfg.blockDim = dim3(256);
        CK(cudaLaunchKernelEx(&cfg, k_wave, p, n16, out, mode));
    }
}


int main(int argc, char **argv) {
    const int n_chain = argc > 1 ? atoi(argv[1]) : 36;
    const int reps = 15;
    int n_sm;
    CK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp pr;
    CK(cudaGetDeviceProperties(&pr, 0));
    /* the products of a Qwen3-8B Q4_K_M layer: wo / K,V pair, Q,K,V, one FFN matrix, down
     * (Q6_K), gate+up; then larger */
    const double mb[] = {4.7, 9.4, 14.2, 28.3, 41.3, 56.6, 113.0};
    const int n_mb = (int)(sizeof mb / sizeof mb[0]);
    const size_t pool_bytes = (size_t)(113.0 * 1e6 * n_chain) + (1u << 20);
    int4 *pool;
    uint32_t *out;
    CK(cudaMalloc(&pool, pool_bytes));
    CK(cudaMemset(pool, 1, pool_bytes));
    CK(cudaMalloc(&out, 1u << 24));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    printf("stream_chain: %s, %d SMs, L2 %d MB, chains of %d launches, median of %d replays\n",
           pr.name, n_sm, pr.l2CacheSize >> 20, n_chain, reps);
    printf("| MB a launch | grid | mode | us a launch | TB/s | one launch of all: TB/s |\n");
    printf("|---:|---|---|---:|---:|---:|\n");
    const char *mode_name[] = {"plain", "pdl", "early"};
    for (int m = 0; m < n_mb; m++) {
        const size_t bytes = ((size_t)(mb[m] * 1e6) + 255) & ~(size_t)255;
        const size_t n16 = bytes / 16;
        for (int tiles = 0; tiles < 2; tiles++) {
            /* the asymptote: one launch over the whole chain's bytes */
            cudaGraph_t g1;
            cudaGraphExec_t e1;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
            launch(tiles, pool, n16 * n_chain, out, MODE_PLAIN, n_sm, st);
            CK(cudaStreamEndCapture(st, &g1));
            CK(cudaGraphInstantiate(&e1, g1, 0));
            const float t1 = median_us(e1, st, reps);
            const double bw1 = (double)bytes * n_chain / (t1 * 1e-6) / 1e12;
            for (int mode = 0; mode < 3; mode++) {
                cudaGraph_t g;
                cudaGraphExec_t e;
                CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
                for (int c = 0; c < n_chain; c++)
                    launch(tiles, pool + (size_t)c * n16, n16, out, mode, n_sm, st);
                CK(cudaStreamEndCapture(st, &g));
                CK(cudaGraphInstantiate(&e, g, 0));
                const float t = median_us(e, st, reps) / n_chain;
                printf("| %.1f | %s | %s | %.2f | %.2f | %.2f |\n", mb[m],
                       tiles ? "tiles" : "wave", mode_name[mode], t,
                       (double)bytes / (t * 1e-6) / 1e12, bw1);
                CK(cudaGraphExecDestroy(e));
                CK(cudaGraphDestroy(g));
            }
            CK(cudaGraphExecDestroy(e1));
            CK(cudaGraphDestroy(g1));
        }
    }
    CK(cudaStreamSynchronize(st));
    CK(cudaGetLastError());
    return 0;
}
