/*
 * attn_stream.cu — how fast the decode attention's K/V tiles can stream into shared memory
 * at depth: the copy alone, in the deep call's shape, by two copy mechanisms.
 *
 * The deep decode call (kern_attn_mma.cu, Qwen3-8B at depth 8192) is 128 blocks, one a
 * multiprocessor: 8 KV heads x 16 key ranges of 512 positions, each block streaming its
 * head's K and V rows (256 bytes each, at a 2 KB stride: the cache is (position, KV
 * head, dim) f16) through NSTAGE shared-memory stages of TK keys. It moves 33.5 MB a
 * layer in ~12.6 us of streaming (~2.7 TB/s, bench/NOTES.md changes 49 and 67) where
 * bare reads of the same bytes in a chain of launches take ~9 (stream_chain). This
 * program times the stream with nothing else in the block: a chain of 36 launches (one
 * layer's cache each, 1.2 GB in all, so nothing is an L2 hit) in one CUDA graph with
 * PDL, us a launch, for
 *   cp    the engine's copy: 16-byte cp.async pieces, every thread a share of each tile,
 *         cp.async.wait_group + __syncthreads before a tile is read;
 *   bulk  one cp.async.bulk a 256-byte row, issued by warp 0, completion counted on an
 *         mbarrier a stage (the tensor memory accelerator's path);
 *   ldg   no shared memory: every thread loads 16-byte pieces of the block's rows into
 *         registers, 8 in flight (what the same 128 blocks pull with plain loads);
 * each with TK keys a tile and NSTAGE stages, and a consumer that reads the whole tile
 * from shared memory (16 bytes a thread a row pair) and then spins DELAY clock cycles (0,
 * or about one tile's mma work). Every block's xor of what it read is checked against the
 * ldg kind's (the same bytes).
 *
 * Build and run (not part of the CMake build; bench/NOTES.md change 77):
 *   nvcc -O3 -arch=sm_90 -o attn_stream bench/attn_stream.cu && ./attn_stream [REPS [DELAY...]]
 * (ATTN_STREAM_KINDS="cp TK128 x3,bulk TK64 x6" runs those kinds and ldg only.)
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHAIN_PROG "attn_stream"
#include "chain_common.cuh"

#define HD 128                 /* dims a head */
#define NKV 8                  /* KV heads */
#define NCTX 8192              /* positions */
#define RANGE 512              /* positions a block */
#define NRANGE (NCTX / RANGE)  /* key ranges a head */
#define NT 256                 /* threads a block (8 warps) */
#define ROWB (HD * 2)          /* bytes of one K or V row of one head */
#define SROW (ROWB + 16)       /* shared bytes a row (the engine's 16-byte pad) */
#define LAYER_HALVES ((size_t)NCTX * NKV * HD)
#define N_LAYERS 36

enum { K_CP, K_BULK, K_LDG };

__device__ __forceinline__ uint32_t saddr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void cp16(uint32_t s, const void *g) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(g));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void mbar_init(uint32_t b, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(b), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect(uint32_t b, unsigned tx) {
    asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }" ::"r"(b),
                 "r"(tx)
                 : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t b, unsigned parity) {
    unsigned done;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; "
                     "selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(b), "r"(parity)
                     : "memory");
    } while (!done);
}
__device__ __forceinline__ void bulk(uint32_t dst, const void *src, unsigned n, uint32_t b) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], "
                 "%2, [%3];" ::"r"(dst),
                 "l"(src), "r"(n), "r"(b)
                 : "memory");
}
__device__ __forceinline__ void spin(int cycles) {
    if (cycles <= 0) return;
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

/* The block's xor of a tile in shared memory: thread t reads 16 bytes of K row and V row
 * t / 16 + 16 i at piece t % 16 (every byte of the tile once). */
template <int TK> __device__ __forceinline__ uint32_t eat(const uint8_t *st) {
    uint32_t h = 0;
#pragma unroll
    for (int i = 0; i < TK / 16; i++) {
        const int r = threadIdx.x / 16 + 16 * i, pc = threadIdx.x % 16;
        const int4 k = *(const int4 *)(st + r * SROW + 16 * pc);
        const int4 v = *(const int4 *)(st + (TK + r) * SROW + 16 * pc);
        h ^= (uint32_t)(k.x ^ k.y ^ k.z ^ k.w ^ v.x ^ v.y ^ v.z ^ v.w);
    }
    return h;
}

/* Block (head, range) of layer `layer`'s cache: its RANGE positions' K and V rows. */
template <int KIND, int TK, int NSTAGE>
__global__ void __launch_bounds__(NT, 1) k_attn(const __half *kc, const __half *vc, int layer,
                                                int delay, uint32_t *out) {
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ __align__(8) uint64_t bar[NSTAGE];
    __shared__ uint32_t red[NT / 32];
    const int head = blockIdx.x % NKV, range = blockIdx.x / NKV;
    const size_t base = (size_t)layer * LAYER_HALVES + (size_t)range * RANGE * NKV * HD +
                        (size_t)head * HD; /* halves: position p at base + p * NKV * HD */
    const uint8_t *kb = (const uint8_t *)(kc + base), *vb = (const uint8_t *)(vc + base);
    constexpr size_t PSTRIDE = (size_t)NKV * HD * 2; /* bytes between positions */
    constexpr int NTILE = RANGE / TK;
    constexpr int STAGE = 2 * TK * SROW;
    uint32_t h = 0;
    dep_wait();
    if constexpr (KIND == K_LDG) {
        /* 16-byte pieces p = t, t + NT, ... of the range's 2 * RANGE rows, 8 in flight */
        constexpr int NP = 2 * RANGE * (ROWB / 16), PER = NP / NT;
#pragma unroll 1
        for (int i = 0; i < PER; i += 8) {
            int4 v[8];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int pc = threadIdx.x + NT * (i + u), row = pc / 16, c = pc % 16;
                const uint8_t *src = (row < RANGE ? kb + (size_t)row * PSTRIDE
                                                  : vb + (size_t)(row - RANGE) * PSTRIDE) +
                                     16 * c;
                v[u] = __ldg((const int4 *)src);
            }
#pragma unroll
            for (int u = 0; u < 8; u++)
                h ^= (uint32_t)(v[u].x ^ v[u].y ^ v[u].z ^ v[u].w);
        }
    } else {
        const uint32_t s0 = saddr(smem);
        if constexpr (KIND == K_BULK) {
            if (threadIdx.x == 0)
                for (int s = 0; s < NSTAGE; s++)
                    mbar_init(saddr(&bar[s]), 1);
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
            __syncthreads();
        }
        auto issue = [&](int it, int st) {
            const uint32_t ks = s0 + (uint32_t)(st * STAGE), vs = ks + (uint32_t)(TK * SROW);
            const int p0 = it * TK;
            if constexpr (KIND == K_CP) {
                const int j = threadIdx.x / 16, c = threadIdx.x % 16;
#pragma unroll
                for (int k = 0; k < TK / 16; k++) {
                    const int r = j + 16 * k;
                    cp16(ks + r * SROW + 16 * c, kb + (size_t)(p0 + r) * PSTRIDE + 16 * c);
                    cp16(vs + r * SROW + 16 * c, vb + (size_t)(p0 + r) * PSTRIDE + 16 * c);
                }
                cp_commit();
            } else {
                if (threadIdx.x < 32) {
                    const uint32_t b = saddr(&bar[st]);
                    if (threadIdx.x == 0) mbar_expect(b, 2u * TK * ROWB);
                    __syncwarp();
                    for (int r = threadIdx.x; r < TK; r += 32) {
                        bulk(ks + r * SROW, kb + (size_t)(p0 + r) * PSTRIDE, ROWB, b);
                        bulk(vs + r * SROW, vb + (size_t)(p0 + r) * PSTRIDE, ROWB, b);
                    }
                }
            }
        };
#pragma unroll
        for (int s = 0; s < NSTAGE - 1; s++) {
            if (s < NTILE)
                issue(s, s);
            else if (KIND == K_CP)
                cp_commit();
        }
        for (int it = 0; it < NTILE; it++) {
            const int st = it % NSTAGE;
            if constexpr (KIND == K_CP) {
                cp_wait<NSTAGE - 2>();
                __syncthreads();
            } else {
                mbar_wait(saddr(&bar[st]), (unsigned)((it / NSTAGE) & 1));
                __syncthreads(); /* tile it-1's stage is free for the next issue */
            }
            const int nx = it + NSTAGE - 1;
            if (nx < NTILE)
                issue(nx, nx % NSTAGE);
            else if (KIND == K_CP)
                cp_commit();
            h ^= eat<TK>(smem + st * STAGE);
            spin(delay);
        }
    }
    for (int o = 16; o > 0; o >>= 1)
        h ^= __shfl_xor_sync(0xffffffffu, h, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = h;
    __syncthreads();
    if (threadIdx.x == 0) {
        uint32_t r = 0;
        for (int w = 0; w < NT / 32; w++)
            r ^= red[w];
        out[(size_t)layer * NKV * NRANGE + blockIdx.x] = r;
    }
}

struct kind_cfg {
    const char *name;
    void (*fn)(const __half *, const __half *, int, int, uint32_t *);
    size_t smem;
};
#define KC(kind, tk, ns, label)                                                               \
    kind_cfg {                                                                                \
        label, k_attn<kind, tk, ns>, kind == K_LDG ? 0 : (size_t)(ns) * 2 * (tk) * SROW       \
    }

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 20;
    const size_t n_halves = (size_t)N_LAYERS * LAYER_HALVES;
    __half *kc, *vc;
    uint32_t *out, *want;
    CK(cudaMalloc(&kc, n_halves * 2));
    CK(cudaMalloc(&vc, n_halves * 2));
    const size_t n_out = (size_t)N_LAYERS * NKV * NRANGE;
    CK(cudaMalloc(&out, n_out * 4));
    CK(cudaMalloc(&want, n_out * 4));
    {
        /* any bytes that differ by position: a counter pattern */
        uint32_t *h = (uint32_t *)malloc(1 << 24);
        for (size_t i = 0; i < (1u << 22); i++)
            h[i] = (uint32_t)(i * 2654435761u);
        for (size_t off = 0; off < n_halves * 2; off += 1 << 24) {
            const size_t n = n_halves * 2 - off < (1u << 24) ? n_halves * 2 - off : 1u << 24;
            CK(cudaMemcpy((uint8_t *)kc + off, h, n, cudaMemcpyHostToDevice));
            for (size_t i = 0; i < (1u << 22); i++)
                h[i] ^= 0x9E3779B9u;
            CK(cudaMemcpy((uint8_t *)vc + off, h, n, cudaMemcpyHostToDevice));
        }
        free(h);
    }
    const kind_cfg cfgs[] = {
        KC(K_LDG, 64, 2, "ldg"),
        KC(K_CP, 128, 3, "cp TK128 x3"),   KC(K_CP, 64, 3, "cp TK64 x3"),
        KC(K_CP, 64, 6, "cp TK64 x6"),     KC(K_CP, 32, 12, "cp TK32 x12"),
        KC(K_BULK, 128, 3, "bulk TK128 x3"), KC(K_BULK, 64, 3, "bulk TK64 x3"),
        KC(K_BULK, 64, 6, "bulk TK64 x6"), KC(K_BULK, 32, 12, "bulk TK32 x12"),
    };
    /* the consumer's spin a tile: argv[2..] (cycles), else 0 and 400 */
    int delays[8] = {0, 400}, n_delays = 2;
    if (argc > 2) {
        n_delays = 0;
        for (int i = 2; i < argc && n_delays < 8; i++)
            delays[n_delays++] = atoi(argv[i]);
    }
    const char *only = getenv("ATTN_STREAM_KINDS"); /* e.g. "ldg,cp TK128 x3": those only */
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const double mb = 2.0 * RANGE * ROWB * NKV * NRANGE / 1e6;
    printf("| kind | delay (cycles a tile) | us a launch | TB/s | checked |\n|---|---:|---:|---:|---|\n");
    for (const kind_cfg &c : cfgs)
        for (int di = 0; di < n_delays; di++) {
            const int d = delays[di];
            if (only && c.fn != cfgs[0].fn && !strstr(only, c.name)) continue;
            if (c.smem) CK(cudaFuncSetAttribute(c.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)c.smem));
            cudaGraph_t g;
            cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
            for (int l = 0; l < N_LAYERS; l++) {
                cudaLaunchAttribute at;
                cudaLaunchConfig_t cfg = chain_cfg(st, true, &at);
                cfg.gridDim = dim3(NKV * NRANGE);
                cfg.blockDim = dim3(NT);
                cfg.dynamicSmemBytes = c.smem;
                CK(cudaLaunchKernelEx(&cfg, c.fn, (const __half *)kc, (const __half *)vc, l, d, out));
            }
            CK(cudaStreamEndCapture(st, &g));
            CK(cudaGraphInstantiate(&ge, g, 0));
            CK(cudaMemsetAsync(out, 0, n_out * 4, st));
            const float us = median_us(ge, st, reps) / N_LAYERS;
            CK(cudaStreamSynchronize(st));
            const char *chk = "reference";
            if (c.fn == cfgs[0].fn)
                CK(cudaMemcpy(want, out, n_out * 4, cudaMemcpyDeviceToDevice));
            else {
                uint32_t *a = (uint32_t *)malloc(n_out * 4), *b = (uint32_t *)malloc(n_out * 4);
                CK(cudaMemcpy(a, out, n_out * 4, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(b, want, n_out * 4, cudaMemcpyDeviceToHost));
                size_t bad = 0;
                for (size_t i = 0; i < n_out; i++)
                    bad += a[i] != b[i];
                chk = bad ? "DIFFERS" : "same xor";
                free(a), free(b);
            }
            printf("| %s | %d | %.2f | %.2f | %s |\n", c.name, d, us, mb / us, chk);
            CK(cudaGraphExecDestroy(ge));
            CK(cudaGraphDestroy(g));
        }
    return 0;
}
