/*
 * kern_peer_ar.cu — the one-shot all-reduce over peer memory (see kern_peer_ar.h).
 *
 * One call, block b of every rank:
 *   1. epoch = calls done + 1 (read from this rank's counter; the last block to finish
 *      stores it, so every block of a call reads the same value); slot = epoch & 1;
 *   2. copy its slice of src into this rank's staging slot;
 *   3. raise flag (b, rank) = epoch on every peer (a system-scope release after the
 *      block's copies), then wait until every peer has raised (b, peer) on this rank;
 *   4. dst = sum over ranks 0..size-1 of the peers' staging slices (read from their
 *      memory over NVLink/PCIe, uncached), plus dst's own value when accumulating.
 * The decode form (peer_ar_norm_kernel: one block per row) does the same and then the
 * next rmsnorm of the updated row, which saves that norm's launch.
 * Why two slots suffice: a rank starts call e+2 only after its call e+1 saw every
 * peer's e+1 flags, which peers raise only once their call e has ended (stream order),
 * so nobody still reads the slot that e+2 overwrites. Flags only grow; comparisons are
 * wrap-safe. A peer silent for timeout_ns makes the kernel print which rank it waited
 * for and trap, so the process stops with a CUDA error instead of hanging.
 */
#include <cstdio>
#include <cuda_runtime.h>

#include "kern_common.cuh" /* kern_rms_scale */
#include "kern_peer_ar.h"

namespace {

constexpr int PAR_THREADS = 256;
constexpr int PAR_PER_BLOCK = 1024; // floats a block takes before more blocks are used

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t *p) {
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void st_release_sys(uint32_t *p, uint32_t v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint64_t global_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* The call number of this launch (every block reads the same: see publish_epoch). */
__device__ __forceinline__ uint32_t read_epoch(const peer_ar &p) {
    __shared__ uint32_t s_epoch;
    if (threadIdx.x == 0) s_epoch = *(volatile uint32_t *)p.counter + 1;
    __syncthreads();
    return s_epoch;
}

/* After the block's staging writes: thread r < size raises this block's flag on rank r
 * and waits for rank r's flag here; the whole block continues once all have arrived. */
__device__ __forceinline__ void exchange_flags(const peer_ar &p, int b, uint32_t epoch) {
    __syncthreads();
    const int tid = threadIdx.x;
    if (tid < p.size && tid != p.rank) {
        __threadfence_system();
        st_release_sys(p.flags[tid] + b * PEER_AR_MAX_RANKS + p.rank, epoch);
        const uint32_t *f = p.flags[p.rank] + b * PEER_AR_MAX_RANKS + tid;
        const uint64_t t0 = p.timeout_ns ? global_ns() : 0;
        while ((int32_t)(ld_acquire_sys(f) - epoch) < 0) {
            if (p.timeout_ns && global_ns() - t0 > p.timeout_ns) {
                printf("tpinfer: peer all-reduce on group rank %d: rank %d did not arrive within "
                       "%.1f s (call %u, block %d); stopping\n",
                       p.rank, tid, (double)p.timeout_ns * 1e-9, epoch, b);
                __trap();
            }
        }
    }
    __syncthreads();
}

/* The last block of the launch to finish stores the epoch, so the next launch (stream
 * order) reads it and no block of this one can read it early. */
__device__ __forceinline__ void publish_epoch(const peer_ar &p, uint32_t epoch) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(p.counter + 1, 1u) == gridDim.x - 1) {
            p.counter[1] = 0;
            *(volatile uint32_t *)p.counter = epoch;
        }
    }
}

__global__ void __launch_bounds__(PAR_THREADS)
    peer_ar_kernel(const peer_ar p, const float *src, float *dst, int n, int per, int accumulate,
                   int vec) {
    const int b = blockIdx.x, tid = threadIdx.x;
    const uint32_t epoch = read_epoch(p);
    const size_t slot = (size_t)(epoch & 1u) * p.cap;
    const int i0 = b * per, i1 = min(n, i0 + per);
    float *mine = p.stage[p.rank] + slot;

    // 2. this rank's slice into its staging slot
    if (vec) {
        for (int i = i0 + 4 * tid; i < i1; i += 4 * PAR_THREADS)
            *(float4 *)(mine + i) = *(const float4 *)(src + i);
    } else {
        for (int i = i0 + tid; i < i1; i += PAR_THREADS) mine[i] = src[i];
    }

    // 3. flags
    exchange_flags(p, b, epoch);

    // 4. the sum over ranks in rank order: the same bits on every rank
    if (vec) {
        for (int i = i0 + 4 * tid; i < i1; i += 4 * PAR_THREADS) {
            float4 acc = __ldcv((const float4 *)(p.stage[0] + slot + i));
            for (int r = 1; r < p.size; r++) {
                const float4 v = __ldcv((const float4 *)(p.stage[r] + slot + i));
                acc.x += v.x;
                acc.y += v.y;
                acc.z += v.z;
                acc.w += v.w;
            }
            if (accumulate) {
                const float4 d = *(const float4 *)(dst + i);
                acc.x = d.x + acc.x;
                acc.y = d.y + acc.y;
                acc.z = d.z + acc.z;
                acc.w = d.w + acc.w;
            }
            *(float4 *)(dst + i) = acc;
        }
    } else {
        for (int i = i0 + tid; i < i1; i += PAR_THREADS) {
            float acc = __ldcv(p.stage[0] + slot + i);
            for (int r = 1; r < p.size; r++) acc += __ldcv(p.stage[r] + slot + i);
            dst[i] = accumulate ? dst[i] + acc : acc;
        }
    }

    // 1'. the last block to finish publishes the epoch for the next call
    publish_epoch(p, epoch);
}

/* The decode form, one block per row: x_row += the group's sum of src_row, then
 * h_row = x_row / sqrt(mean(x_row^2) + eps) * w (the next rmsnorm), so the norm needs
 * no launch of its own. n_cols % 4 == 0, 16-byte aligned rows. */
constexpr int PAN_THREADS = 512;
constexpr int PAN_VPT = 4; // float4 per thread held in registers: n_cols <= 8192

__global__ void __launch_bounds__(PAN_THREADS)
    peer_ar_norm_kernel(const peer_ar p, const float *src, float *x, int n_cols, const float *w,
                        float eps, float *h) {
    const int b = blockIdx.x, tid = threadIdx.x;
    const uint32_t epoch = read_epoch(p);
    const size_t slot = (size_t)(epoch & 1u) * p.cap;
    const size_t row = (size_t)b * n_cols;
    const int n4 = n_cols / 4;
    float *mine = p.stage[p.rank] + slot + row;
    const float4 *s4 = (const float4 *)(src + row);
#pragma unroll
    for (int k = 0; k < PAN_VPT; k++) {
        const int j = tid + k * PAN_THREADS;
        if (j < n4) ((float4 *)mine)[j] = s4[j];
    }
    exchange_flags(p, b, epoch);

    float4 v[PAN_VPT];
    float ss = 0.0f;
    float4 *x4 = (float4 *)(x + row);
#pragma unroll
    for (int k = 0; k < PAN_VPT; k++) {
        const int j = tid + k * PAN_THREADS;
        if (j >= n4) continue;
        float4 acc = __ldcv((const float4 *)(p.stage[0] + slot + row) + j);
        for (int r = 1; r < p.size; r++) {
            const float4 t = __ldcv((const float4 *)(p.stage[r] + slot + row) + j);
            acc.x += t.x;
            acc.y += t.y;
            acc.z += t.z;
            acc.w += t.w;
        }
        const float4 d = x4[j];
        acc.x = d.x + acc.x;
        acc.y = d.y + acc.y;
        acc.z = d.z + acc.z;
        acc.w = d.w + acc.w;
        x4[j] = acc;
        v[k] = acc;
        ss += acc.x * acc.x + acc.y * acc.y + acc.z * acc.z + acc.w * acc.w;
    }
    // block sum of squares: warps, then the first warp
    __shared__ float s_part[PAN_THREADS / 32];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((tid & 31) == 0) s_part[tid >> 5] = ss;
    __syncthreads();
    if (tid < 32) {
        float t = tid < PAN_THREADS / 32 ? s_part[tid] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
        if (tid == 0) s_part[0] = t;
    }
    __syncthreads();
    // as every GPU norm computes it (kern_elem.cu's rmsnorm_kernel among them)
    const float scale = kern_rms_scale(s_part[0], n_cols, eps);
    const float4 *w4 = (const float4 *)w;
    float4 *h4 = (float4 *)(h + row);
#pragma unroll
    for (int k = 0; k < PAN_VPT; k++) {
        const int j = tid + k * PAN_THREADS;
        if (j >= n4) continue;
        const float4 g = w4[j];
        h4[j] = make_float4(__fmul_rn(__fmul_rn(v[k].x, scale), g.x),
                            __fmul_rn(__fmul_rn(v[k].y, scale), g.y),
                            __fmul_rn(__fmul_rn(v[k].z, scale), g.z),
                            __fmul_rn(__fmul_rn(v[k].w, scale), g.w));
    }
    publish_epoch(p, epoch);
}

size_t flags_bytes() { return sizeof(uint32_t) * PEER_AR_MAX_BLOCKS * PEER_AR_MAX_RANKS; }

} // namespace

extern "C" size_t peer_ar_region_bytes(size_t cap) {
    return 2 * cap * sizeof(float) + flags_bytes() + 2 * sizeof(uint32_t);
}

extern "C" void peer_ar_region_parts(void *base, size_t cap, float **stage, uint32_t **flags,
                                     uint32_t **counter) {
    char *p = (char *)base;
    *stage = (float *)p;
    p += 2 * cap * sizeof(float);
    *flags = (uint32_t *)p;
    p += flags_bytes();
    *counter = (uint32_t *)p;
}

extern "C" int peer_ar_launch(const struct peer_ar *p, const float *src, float *dst, size_t count,
                              int accumulate, void *stream) {
    if (count == 0) return 0;
    if (count > p->cap) return (int)cudaErrorInvalidValue;
    const int n = (int)count;
    int nb = (n + PAR_PER_BLOCK - 1) / PAR_PER_BLOCK;
    if (nb > PEER_AR_MAX_BLOCKS) nb = PEER_AR_MAX_BLOCKS;
    int per = (n + nb - 1) / nb;
    per = (per + 3) & ~3;               // slices start on 16-byte boundaries
    nb = (n + per - 1) / per;           // (rounding may leave the last block empty)
    const int vec = (n % 4 == 0) && ((uintptr_t)src % 16 == 0) && ((uintptr_t)dst % 16 == 0) &&
                    (p->cap % 4 == 0);
    peer_ar_kernel<<<nb, PAR_THREADS, 0, (cudaStream_t)stream>>>(*p, src, dst, n, per, accumulate,
                                                                  vec);
    return (int)cudaGetLastError();
}

extern "C" int peer_ar_norm_fits(const struct peer_ar *p, int n_rows, int n_cols) {
    return n_rows >= 1 && n_rows <= PEER_AR_MAX_BLOCKS && n_cols % 4 == 0 &&
           n_cols <= 4 * PAN_VPT * PAN_THREADS &&
           (size_t)n_rows * (size_t)n_cols * (size_t)(p->size - 1) <= p->cap;
}

extern "C" int peer_ar_norm_launch(const struct peer_ar *p, const float *src, float *x, int n_rows,
                                   int n_cols, const float *w, float eps, float *h, void *stream) {
    if (!peer_ar_norm_fits(p, n_rows, n_cols) || ((uintptr_t)src | (uintptr_t)x | (uintptr_t)w |
                                                  (uintptr_t)h) % 16 != 0)
        return (int)cudaErrorInvalidValue;
    peer_ar_norm_kernel<<<n_rows, PAN_THREADS, 0, (cudaStream_t)stream>>>(*p, src, x, n_cols, w,
                                                                          eps, h);
    return (int)cudaGetLastError();
}
