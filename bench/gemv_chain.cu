/*
 * gemv_chain.cu — a Q4_K one-row matrix-vector product in chains of dependent launches,
 * two ways, against bare reads of the same bytes (bench/stream_chain.cu's "tiles" form):
 *   regs  a warp a weight row, each lane loading its two 64-value items (the quant bytes
 *         and the block header, 16-byte loads into registers) before dotting them with
 *         the int8 x: the load-then-dot shape of kern_gemv.cu's one-row kernels;
 *   ring  a warp a contiguous range of rows, streamed through a ring of RING_STAGES rows
 *         in shared memory with cp.async (RING_STAGES - 1 rows in flight while one is
 *         dotted), x and its (d, d*sum) pairs held in registers across rows (K 4096);
 *   ring_sx  the same with x and its pairs staged in shared memory (any K);
 *   ring_ks  rows cut into parts of 4096 values, a warp a part (x's part in registers),
 *         the parts' sums added in shared memory (K 4096 * n; sums in another order);
 *   ring_e1, ring_e2, ring_e3  ring (ring_sx at K 12288) held to 1, 2 or 3 blocks an SM
 *         and letting the next launch in at its start (launch_dependents first), so the
 *         next launch's blocks are resident beside it and copy their first rows while it
 *         still runs (change 96: a chain whose weight stream does not stop at a launch);
 *   regs8, regs16, nodot, nox, xperm, tie, tiep, pre, early  regs with 8 or 16 warps a
 *         block, without its dots, without x's loads, with x permuted as kind p reads it,
 *         with every load ahead of the first dot (tie; tiep with x permuted), its row
 *         copied into shared memory first (smem1; smem1p before the wait), with its
 *         weight loads before the PDL wait, and that with the next launch let in at once
 *         (change 73: what separates a product from bare reads); bare_st: bare reads that
 *         store a word a warp.
 * Shapes: K 4096 (Q, K/V, wo, gate/up: 1024-24576 output rows) and K 12288 (down).
 * Both compute y[r] = sum over 32-value blocks of d*sc*dx*sum(q*xq) - dmin*m*(dx*sum xq),
 * the same items in the same order, so their outputs are bitwise equal; a host reference
 * checks a few rows of each. Each launch of a chain reads its own copy of the weights
 * (a pool far larger than L2); PDL as the decode kernels use it (wait first).
 *
 * Build and run (not part of the CMake build; bench/NOTES.md change 69):
 *   nvcc -O3 -arch=sm_90 -o gemv_chain bench/gemv_chain.cu && ./gemv_chain
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHAIN_PROG "gemv_chain"
#include "chain_common.cuh"


#define QK_BYTES 144 /* a Q4_K block: d, dmin (f16), 12 bytes of scales, 128 of quants */
#define K_MAX 12288
#define ROW_BYTES_OF(KK) ((KK) / 256 * QK_BYTES)
#ifndef RING_STAGES
#define RING_STAGES 4
#endif
#ifndef RING_WARPS
#define RING_WARPS 4
#endif


__device__ __forceinline__ int dp4a_x4(const uint32_t *w, const int4 x, int c) {
    c = __dp4a((int)w[0], x.x, c);
    c = __dp4a((int)w[1], x.y, c);
    c = __dp4a((int)w[2], x.z, c);
    return __dp4a((int)w[3], x.w, c);
}

/* One item c (0..3) of a block: 32 quant bytes qa, qb, the block header hd; x's 64
 * values as four int4, the two sub-blocks' (dx, dx*sum) as a float4. */
__device__ __forceinline__ float item_dot(const int4 qa, const int4 qb, const int4 hd, int c,
                                          const int4 x0, const int4 x1, const int4 x2,
                                          const int4 x3, const float4 f) {
    const uint32_t dm = (uint32_t)hd.x;
    const float d = __half2float(__ushort_as_half((unsigned short)(dm & 0xFFFFu)));
    const float dmin = __half2float(__ushort_as_half((unsigned short)(dm >> 16)));
    const int sh = 16 * (c & 1);
    const uint32_t a = ((uint32_t)hd.y >> sh) & 0xFFFFu, bb = ((uint32_t)hd.z >> sh) & 0xFFFFu;
    const uint32_t e = ((uint32_t)hd.w >> sh) & 0xFFFFu;
    const uint32_t scp = c < 2 ? (a & 0x3F3Fu) : ((e & 0x0F0Fu) | ((a >> 2) & 0x3030u));
    const uint32_t mnp = c < 2 ? (bb & 0x3F3Fu) : (((e >> 4) & 0x0F0Fu) | ((bb >> 2) & 0x3030u));
    const float d0 = d * (float)(scp & 0xFFu), d1 = d * (float)(scp >> 8);
    const float m0 = dmin * (float)(mnp & 0xFFu), m1 = dmin * (float)(mnp >> 8);
    const uint32_t w[8] = {(uint32_t)qa.x, (uint32_t)qa.y, (uint32_t)qa.z, (uint32_t)qa.w,
                           (uint32_t)qb.x, (uint32_t)qb.y, (uint32_t)qb.z, (uint32_t)qb.w};
    uint32_t lo[8], hi[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        lo[i] = w[i] & 0x0F0F0F0Fu;
        hi[i] = (w[i] >> 4) & 0x0F0F0F0Fu;
    }
    const int sl = dp4a_x4(lo + 4, x1, dp4a_x4(lo, x0, 0));
    const int sh2 = dp4a_x4(hi + 4, x3, dp4a_x4(hi, x2, 0));
    float t = d0 * f.x * (float)sl;
    t = fmaf(d1 * f.z, (float)sh2, t);
    t = fmaf(-m0, f.y, t);
    return fmaf(-m1, f.w, t);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* regs: block of BW warps, warp w takes row BW*blockIdx.x + w; a lane's KK/2048 items.
 * MODE (what separates a product from bare reads, change 73):
 *   R_DOT    the product (load every item, then dot, warp sum, store a row);
 *   R_NODOT  the same loads and row stores, the dots replaced by an xor of the words;
 *   R_PRE    the product with its weight loads issued before the PDL wait (volatile asm
 *            loads stay above it; the previous launch does not trigger early);
 *   R_EARLY  R_PRE, and the next launch let in at once (launch_dependents first);
 *   R_NOX    the dots against x made from the lane's number (no x or pair loads; other
 *            outputs, timing only);
 *   R_XPERM  the dots against x in a permuted copy (kern_gemv.cu's kind p): x's load k of
 *            the warp's items u reads 512 contiguous bytes at xq + 512 * (4u + k). */
enum { R_DOT, R_NODOT, R_PRE, R_EARLY, R_NOX, R_XPERM };
__device__ __forceinline__ int4 ld_v4(const void *p) {
    int4 v;
    asm volatile("ld.global.v4.s32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
template <int KK, int BW, int MODE, bool TIE = false>
__global__ void __launch_bounds__(32 * BW) k_regs(const uint8_t *__restrict__ W, const int8_t *xq,
                                                  const float2 *ds, float *y, int n_rows) {
    constexpr int ROW_BYTES = ROW_BYTES_OF(KK), NI = KK / 2048;
    constexpr bool PRE = MODE == R_PRE || MODE == R_EARLY;
    if constexpr (MODE == R_EARLY) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if constexpr (!PRE) dep_wait();
    const int lane = threadIdx.x & 31, row = blockIdx.x * BW + (threadIdx.x >> 5);
    int4 qa[NI], qb[NI], hd[NI];
    if (row < n_rows) {
        const uint8_t *wr = W + (size_t)row * ROW_BYTES;
#pragma unroll
        for (int u = 0; u < NI; u++) {
            const int it = lane + 32 * u, blk = it >> 2, c = it & 3;
            const uint8_t *b = wr + blk * QK_BYTES;
            if constexpr (PRE) {
                qa[u] = ld_v4(b + 16 + 32 * c);
                qb[u] = ld_v4(b + 16 + 32 * c + 16);
                hd[u] = ld_v4(b);
            } else {
                qa[u] = __ldg((const int4 *)(b + 16 + 32 * c));
                qb[u] = __ldg((const int4 *)(b + 16 + 32 * c + 16));
                hd[u] = __ldg((const int4 *)b);
            }
        }
    }
    if constexpr (PRE) dep_wait();
    if (row >= n_rows) return;
    if constexpr (TIE) {
        /* ptxas issues item u's loads after item u-1's dots (fewer registers): one round
         * trip an item. Item 0's first word made to depend on every load (z is 0 at run
         * time; the compiler cannot know) puts all of them before the first dot. */
        const uint32_t z = (uint32_t)n_rows >> 31;
#pragma unroll
        for (int u = 1; u < NI; u++)
            qa[0].x ^= (int)(((uint32_t)qa[u].x ^ (uint32_t)qb[u].x ^ (uint32_t)hd[u].x) & z);
        qa[0].x ^= (int)(((uint32_t)qb[0].x ^ (uint32_t)hd[0].x) & z);
    }
    float acc = 0.0f;
    if constexpr (MODE == R_NODOT) {
        uint32_t h = 0;
#pragma unroll
        for (int u = 0; u < NI; u++)
            h ^= (uint32_t)(qa[u].x ^ qa[u].y ^ qa[u].z ^ qa[u].w ^ qb[u].x ^ qb[u].y ^ qb[u].z ^
                            qb[u].w ^ hd[u].x ^ hd[u].y ^ hd[u].z ^ hd[u].w);
        acc = (float)(h & 0xFFFFu);
    } else {
#pragma unroll
        for (int u = 0; u < NI; u++) {
            const int it = lane + 32 * u;
            if constexpr (MODE == R_NOX) {
                const int v = (int)(0x01010101u * (uint32_t)(it & 63)) ^ n_rows;
                const float4 f = make_float4(0.01f, 0.5f, 0.02f, 0.25f);
                const int4 xv = make_int4(v, v ^ 0x5A5A5A5A, v + 3, v ^ 0x0F0F0F0F);
                acc += item_dot(qa[u], qb[u], hd[u], it & 3, xv, xv, xv, xv, f);
            } else if constexpr (MODE == R_XPERM) {
                const int4 *xp = (const int4 *)(xq + 512 * 4 * u + 16 * lane);
                const float4 f = *(const float4 *)(ds + 2 * it);
                acc += item_dot(qa[u], qb[u], hd[u], it & 3, xp[0], xp[32], xp[64], xp[96], f);
            } else {
                const int4 *xp = (const int4 *)(xq + 64 * it);
                const float4 f = *(const float4 *)(ds + 2 * it);
                acc += item_dot(qa[u], qb[u], hd[u], it & 3, xp[0], xp[1], xp[2], xp[3], f);
            }
        }
    }
    acc = warp_sum(acc);
    if (lane == 0) y[row] = acc;
}

__device__ __forceinline__ void cp16(uint32_t s, const void *g) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(g));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
/* A warp's copy of N bytes (whole 16-byte pieces) from src to shared memory at dst:
 * lane l takes pieces l, l + 32, ... */
template <int N> __device__ __forceinline__ void warp_cp(uint32_t dst, const uint8_t *src, int lane) {
#pragma unroll
    for (int k = 0; k < (N / 16 + 31) / 32; k++) {
        const int pc = lane + 32 * k;
        if (pc < N / 16) cp16(dst + 16 * pc, src + 16 * pc);
    }
}

/* ring: every warp of the grid takes a contiguous range of rows (balanced to one row).
 * XREG: x in registers (KK 4096: two items a lane); else x and its pairs staged in
 * shared memory after the rings, read per row. */
template <int KK, bool XREG, bool EARLY = false>
__global__ void __launch_bounds__(32 * RING_WARPS) k_ring(const uint8_t *__restrict__ W,
                                                          const int8_t *xq, const float2 *ds,
                                                          float *y, int n_rows) {
    constexpr int ROW_BYTES = ROW_BYTES_OF(KK), NI = KK / 2048;
    static_assert(!XREG || NI == 2, "x in registers: two items a lane");
    extern __shared__ __align__(16) uint8_t smem[];
    int8_t *xs = (int8_t *)(smem + (size_t)RING_WARPS * RING_STAGES * ROW_BYTES);
    float2 *dss = (float2 *)(xs + KK);
    if constexpr (EARLY) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gw = blockIdx.x * RING_WARPS + warp, n_w = gridDim.x * RING_WARPS;
    const int r0 = (int)((long)n_rows * gw / n_w), r1 = (int)((long)n_rows * (gw + 1) / n_w);
    uint8_t *ring = smem + (size_t)warp * RING_STAGES * ROW_BYTES;
    const uint32_t ring_s = (uint32_t)__cvta_generic_to_shared(ring);
    /* copy row r into stage st */
    auto issue = [&](int r, int st) {
        if (r < r1)
            warp_cp<ROW_BYTES>(ring_s + (uint32_t)(st * ROW_BYTES), W + (size_t)r * ROW_BYTES, lane);
        cp_commit();
    };
    /* the weights are not written by any kernel: their copies start before the wait */
#pragma unroll
    for (int s = 0; s < RING_STAGES - 1; s++)
        issue(r0 + s, s);
    dep_wait();
    int4 xv[XREG ? 2 : 1][4];
    float4 fv[XREG ? 2 : 1];
    if constexpr (XREG) {
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int it = lane + 32 * u;
            const int4 *xp = (const int4 *)(xq + 64 * it);
#pragma unroll
            for (int k = 0; k < 4; k++)
                xv[u][k] = xp[k];
            fv[u] = *(const float4 *)(ds + 2 * it);
        }
    } else {
        for (int i = threadIdx.x; i < KK / 16; i += blockDim.x)
            ((int4 *)xs)[i] = ((const int4 *)xq)[i];
        for (int i = threadIdx.x; i < KK / 32; i += blockDim.x)
            dss[i] = ds[i];
        __syncthreads();
    }
    for (int r = r0; r < r1; r++) {
        const int i = r - r0;
        cp_wait<RING_STAGES - 2>();
        __syncwarp();
        const uint8_t *row = ring + (i % RING_STAGES) * ROW_BYTES;
        float acc = 0.0f;
#pragma unroll
        for (int u = 0; u < NI; u++) {
            const int it = lane + 32 * u, blk = it >> 2, c = it & 3;
            const uint8_t *b = row + blk * QK_BYTES;
            const int4 qa = *(const int4 *)(b + 16 + 32 * c);
            const int4 qb = *(const int4 *)(b + 16 + 32 * c + 16);
            const int4 hd = *(const int4 *)b;
            if constexpr (XREG) {
                acc += item_dot(qa, qb, hd, c, xv[u][0], xv[u][1], xv[u][2], xv[u][3], fv[u]);
            } else {
                const int4 *xp = (const int4 *)(xs + 64 * it);
                acc += item_dot(qa, qb, hd, c, xp[0], xp[1], xp[2], xp[3],
                                *(const float4 *)(dss + 2 * it));
            }
        }
        acc = warp_sum(acc);
        if (lane == 0) y[r] = acc;
        __syncwarp(); /* every lane is done with stage i % S before it is refilled */
        issue(r + RING_STAGES - 1, (i + RING_STAGES - 1) % RING_STAGES);
    }
    cp_wait<0>();
}

/* smem1: a warp a row, as regs, but the row copied whole into the warp's own shared
 * memory with cp.async (no registers held while its bytes are in flight: one DRAM round
 * trip a row whatever ptxas does), then dotted from there against x as kind p's
 * permuted copy (xperm's loads). PRE: the copy issued before the PDL wait. */
template <int KK, bool PRE>
__global__ void __launch_bounds__(128) k_smem1(const uint8_t *__restrict__ W, const int8_t *xq,
                                               const float2 *ds, float *y, int n_rows) {
    constexpr int ROW_BYTES = ROW_BYTES_OF(KK), NI = KK / 2048;
    extern __shared__ __align__(16) uint8_t smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, row = blockIdx.x * 4 + warp;
    uint8_t *mine = smem + (size_t)warp * ROW_BYTES;
    if constexpr (!PRE) dep_wait();
    if (row < n_rows)
        warp_cp<ROW_BYTES>((uint32_t)__cvta_generic_to_shared(mine), W + (size_t)row * ROW_BYTES,
                           lane);
    cp_commit();
    if constexpr (PRE) dep_wait();
    cp_wait<0>();
    __syncwarp();
    if (row >= n_rows) return;
    float acc = 0.0f;
#pragma unroll
    for (int u = 0; u < NI; u++) {
        const int it = lane + 32 * u, blk = it >> 2, c = it & 3;
        const uint8_t *b = mine + blk * QK_BYTES;
        const int4 *xp = (const int4 *)(xq + 512 * 4 * u + 16 * lane);
        const float4 f = *(const float4 *)(ds + 2 * it);
        acc += item_dot(*(const int4 *)(b + 16 + 32 * c), *(const int4 *)(b + 16 + 32 * c + 16),
                        *(const int4 *)b, c, xp[0], xp[32], xp[64], xp[96], f);
    }
    acc = warp_sum(acc);
    if (lane == 0) y[row] = acc;
}

/* ring_ks: rows of KK = 4096 * NP values cut into NP parts of 4096; a block is KS_GROUPS
 * groups of NP warps, warp p of a group streams part p of the group's rows through its
 * own ring with part p of x in registers, and the NP partial sums of a row meet in
 * shared memory (added in part order after the last row: deterministic). */
#define KS_GROUPS 4
#define KS_MAXR 16 /* rows a group at most (checked at launch) */
template <int KK>
__global__ void __launch_bounds__(32 * KS_GROUPS * (KK / 4096))
    k_ring_ks(const uint8_t *__restrict__ W, const int8_t *xq, const float2 *ds, float *y,
              int n_rows) {
    constexpr int NP = KK / 4096, PB = ROW_BYTES_OF(4096), ROW_BYTES = ROW_BYTES_OF(KK);
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ float part[KS_GROUPS][KS_MAXR][NP];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int grp = warp / NP, p = warp % NP;
    const int gi = blockIdx.x * KS_GROUPS + grp, n_g = gridDim.x * KS_GROUPS;
    const int r0 = (int)((long)n_rows * gi / n_g), r1 = (int)((long)n_rows * (gi + 1) / n_g);
    uint8_t *ring = smem + (size_t)warp * RING_STAGES * PB;
    const uint32_t ring_s = (uint32_t)__cvta_generic_to_shared(ring);
    auto issue = [&](int r, int st) { /* part p of row r into stage st */
        if (r < r1)
            warp_cp<PB>(ring_s + (uint32_t)(st * PB), W + (size_t)r * ROW_BYTES + (size_t)p * PB,
                        lane);
        cp_commit();
    };
#pragma unroll
    for (int st = 0; st < RING_STAGES - 1; st++)
        issue(r0 + st, st);
    dep_wait();
    int4 xv[2][4];
    float4 fv[2];
#pragma unroll
    for (int u = 0; u < 2; u++) {
        const int it = p * 64 + lane + 32 * u; /* item of the whole row */
        const int4 *xp = (const int4 *)(xq + 64 * it);
#pragma unroll
        for (int k = 0; k < 4; k++)
            xv[u][k] = xp[k];
        fv[u] = *(const float4 *)(ds + 2 * it);
    }
    for (int r = r0; r < r1; r++) {
        const int i = r - r0;
        cp_wait<RING_STAGES - 2>();
        __syncwarp();
        const uint8_t *row = ring + (i % RING_STAGES) * PB;
        float acc = 0.0f;
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int it = lane + 32 * u, blk = it >> 2, c = it & 3;
            const uint8_t *b = row + blk * QK_BYTES;
            acc += item_dot(*(const int4 *)(b + 16 + 32 * c), *(const int4 *)(b + 16 + 32 * c + 16),
                            *(const int4 *)b, c, xv[u][0], xv[u][1], xv[u][2], xv[u][3], fv[u]);
        }
        acc = warp_sum(acc);
        if (lane == 0) part[grp][i][p] = acc;
        __syncwarp();
        issue(r + RING_STAGES - 1, (i + RING_STAGES - 1) % RING_STAGES);
    }
    cp_wait<0>();
    __syncthreads();
    if (p == 0)
        for (int i = lane; i < r1 - r0; i += 32) {
            float v = part[grp][i][0];
#pragma unroll
            for (int q = 1; q < NP; q++)
                v += part[grp][i][q];
            y[r0 + i] = v;
        }
}

/* bare reads: one block of 128 threads a 16 KB tile (stream_chain.cu's tiles form);
 * ST: every block stores its xor (one word), as a product stores its outputs. */
template <bool ST>
__global__ void __launch_bounds__(128) k_bare(const int4 *__restrict__ p, size_t n16,
                                              uint32_t *out) {
    dep_wait();
    const size_t base = (size_t)blockIdx.x * 1024;
    uint32_t acc = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const size_t i = base + threadIdx.x + 128 * k;
        if (i < n16) {
            const int4 v = __ldg(p + i);
            acc ^= (uint32_t)v.x ^ (uint32_t)v.y ^ (uint32_t)v.z ^ (uint32_t)v.w;
        }
    }
    if (ST) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
        if ((threadIdx.x & 31) == 0) out[4 * blockIdx.x + (threadIdx.x >> 5)] = acc;
    } else if (acc == 0x9E3779B9u) {
        out[blockIdx.x] = acc;
    }
}

enum { K_REGS, K_RING, K_RING_SX, K_BARE, K_RING_KS, K_BARE_ST, K_REGS8, K_REGS16, K_NODOT, K_PRE,
       K_EARLY, K_NOX, K_XPERM, K_TIE, K_TIEP, K_SMEM1, K_SMEM1P, K_RING_E1, K_RING_E2, K_RING_E3 };
static int8_t *g_xperm; /* x in R_XPERM's order (made once in main) */

template <int KK, bool XREG> static size_t ring_smem() {
    return (size_t)RING_WARPS * RING_STAGES * ROW_BYTES_OF(KK) + (XREG ? 0 : KK + KK / 32 * 8);
}
/* Blocks of k_ring<KK, XREG> resident at once on the whole GPU (attributes set once). */
template <int KK, bool XREG> static int ring_blocks(int n_sm) {
    static int n = 0;
    if (!n) {
        CK(cudaFuncSetAttribute(k_ring<KK, XREG>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)ring_smem<KK, XREG>()));
        int per_sm = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_ring<KK, XREG>,
                                                         32 * RING_WARPS, ring_smem<KK, XREG>()));
        n = n_sm * per_sm;
        printf("ring K %d x %s: %d blocks an SM, %zu KB each\n", KK, XREG ? "registers" : "shared",
               per_sm, ring_smem<KK, XREG>() >> 10);
    }
    return n;
}
/* Blocks of the early ring (k_ring<KK, XREG, true>) for at most b an SM. */
template <int KK, bool XREG> static int ring_e_blocks(int n_sm, int b) {
    static int per_sm = 0;
    if (!per_sm) {
        CK(cudaFuncSetAttribute(k_ring<KK, XREG, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)ring_smem<KK, XREG>()));
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_ring<KK, XREG, true>,
                                                         32 * RING_WARPS, ring_smem<KK, XREG>()));
        printf("ring_e K %d: at most %d blocks an SM, %zu KB each\n", KK, per_sm,
               ring_smem<KK, XREG>() >> 10);
    }
    return n_sm * (b < per_sm ? b : per_sm);
}
static int g_n_sm;
static int g_smem_optin; /* the most dynamic shared memory a block may ask for */

/* Whether kind's blocks fit an SM's shared memory at this K and RING_STAGES (a kind that
 * does not is skipped: "-" in the table, not checked). */
template <int KK> static bool kind_fits(int kind) {
    size_t smem = 0;
    if (kind == K_RING)
        smem = KK == 4096 ? ring_smem<4096, true>() : ring_smem<KK, false>();
    else if (kind == K_RING_SX)
        smem = ring_smem<KK, false>();
    else if (kind == K_RING_E1 || kind == K_RING_E2 || kind == K_RING_E3)
        smem = ring_smem<KK, KK == 4096>();
    else if (kind == K_RING_KS)
        smem = (size_t)KS_GROUPS * (KK / 4096) * RING_STAGES * ROW_BYTES_OF(4096);
    else if (kind == K_SMEM1 || kind == K_SMEM1P)
        smem = 4 * (size_t)ROW_BYTES_OF(KK);
    return smem <= (size_t)g_smem_optin;
}

template <int KK>
static void launch(int kind, const uint8_t *W, const int8_t *xq, const float2 *ds, float *y,
                   int n_rows, cudaStream_t st) {
    constexpr int ROW_BYTES = ROW_BYTES_OF(KK);
    cudaLaunchAttribute at;
    cudaLaunchConfig_t cfg = chain_cfg(st, true, &at);
    if (kind == K_REGS || kind == K_NODOT || kind == K_PRE || kind == K_EARLY || kind == K_NOX ||
        kind == K_XPERM || kind == K_TIE || kind == K_TIEP) {
        cfg.gridDim = dim3((unsigned)((n_rows + 3) / 4));
        cfg.blockDim = dim3(128);
        auto k = kind == K_REGS    ? k_regs<KK, 4, R_DOT>
                 : kind == K_NODOT ? k_regs<KK, 4, R_NODOT>
                 : kind == K_PRE   ? k_regs<KK, 4, R_PRE>
                 : kind == K_EARLY ? k_regs<KK, 4, R_EARLY>
                 : kind == K_NOX   ? k_regs<KK, 4, R_NOX>
                 : kind == K_XPERM ? k_regs<KK, 4, R_XPERM>
                 : kind == K_TIE   ? k_regs<KK, 4, R_DOT, true>
                                   : k_regs<KK, 4, R_XPERM, true>;
        CK(cudaLaunchKernelEx(&cfg, k, W, kind == K_XPERM || kind == K_TIEP ? g_xperm : xq, ds, y,
                              n_rows));
    } else if (kind == K_SMEM1 || kind == K_SMEM1P) {
        cfg.gridDim = dim3((unsigned)((n_rows + 3) / 4));
        cfg.blockDim = dim3(128);
        cfg.dynamicSmemBytes = 4 * (size_t)ROW_BYTES;
        CK(cudaLaunchKernelEx(&cfg, kind == K_SMEM1 ? k_smem1<KK, false> : k_smem1<KK, true>, W,
                              (const int8_t *)g_xperm, ds, y, n_rows));
    } else if (kind == K_REGS8 || kind == K_REGS16) {
        const int bw = kind == K_REGS8 ? 8 : 16;
        cfg.gridDim = dim3((unsigned)((n_rows + bw - 1) / bw));
        cfg.blockDim = dim3(32 * bw);
        CK(cudaLaunchKernelEx(&cfg, bw == 8 ? k_regs<KK, 8, R_DOT> : k_regs<KK, 16, R_DOT>, W, xq,
                              ds, y, n_rows));
    } else if (kind == K_RING || kind == K_RING_SX) {
        cfg.blockDim = dim3(32 * RING_WARPS);
        if (kind == K_RING && KK == 4096) {
            cfg.gridDim = dim3((unsigned)ring_blocks<4096, true>(g_n_sm));
            cfg.dynamicSmemBytes = ring_smem<4096, true>();
            CK(cudaLaunchKernelEx(&cfg, k_ring<4096, true>, W, xq, ds, y, n_rows));
        } else {
            cfg.gridDim = dim3((unsigned)ring_blocks<KK, false>(g_n_sm));
            cfg.dynamicSmemBytes = ring_smem<KK, false>();
            CK(cudaLaunchKernelEx(&cfg, k_ring<KK, false>, W, xq, ds, y, n_rows));
        }
    } else if (kind == K_RING_E1 || kind == K_RING_E2 || kind == K_RING_E3) {
        constexpr bool XR = KK == 4096;
        const int b = kind == K_RING_E1 ? 1 : kind == K_RING_E2 ? 2 : 3;
        cfg.blockDim = dim3(32 * RING_WARPS);
        cfg.gridDim = dim3((unsigned)ring_e_blocks<KK, XR>(g_n_sm, b));
        cfg.dynamicSmemBytes = ring_smem<KK, XR>();
        CK(cudaLaunchKernelEx(&cfg, k_ring<KK, XR, true>, W, xq, ds, y, n_rows));
    } else if (kind == K_RING_KS) {
        constexpr int NP = KK / 4096;
        const size_t smem = (size_t)KS_GROUPS * NP * RING_STAGES * ROW_BYTES_OF(4096);
        static int blocks = 0;
        if (!blocks) {
            CK(cudaFuncSetAttribute(k_ring_ks<KK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)smem));
            int per_sm = 0;
            CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_ring_ks<KK>,
                                                             32 * KS_GROUPS * NP, smem));
            blocks = g_n_sm * per_sm;
            while ((n_rows + blocks * KS_GROUPS - 1) / (blocks * KS_GROUPS) > KS_MAXR)
                blocks *= 2; /* more groups than resident: still at most KS_MAXR rows each */
            printf("ring_ks K %d: %d blocks an SM of %d warps, %zu KB each\n", KK, per_sm,
                   KS_GROUPS * NP, smem >> 10);
        }
        cfg.gridDim = dim3((unsigned)blocks);
        cfg.blockDim = dim3(32 * KS_GROUPS * NP);
        cfg.dynamicSmemBytes = smem;
        CK(cudaLaunchKernelEx(&cfg, k_ring_ks<KK>, W, xq, ds, y, n_rows));
    } else {
        const size_t n16 = (size_t)n_rows * ROW_BYTES / 16;
        cfg.gridDim = dim3((unsigned)((n16 + 1023) / 1024));
        cfg.blockDim = dim3(128);
        CK(cudaLaunchKernelEx(&cfg, kind == K_BARE_ST ? k_bare<true> : k_bare<false>,
                              (const int4 *)W, n16, (uint32_t *)y));
    }
}


/* Host reference of a row of kk values: the same formula in double. */
static double ref_row(const uint8_t *w, const int8_t *xq, const float2 *ds, int kk) {
    double acc = 0.0;
    for (int blk = 0; blk < kk / 256; blk++) {
        const uint8_t *b = w + blk * QK_BYTES;
        uint16_t dh, mh;
        memcpy(&dh, b, 2);
        memcpy(&mh, b + 2, 2);
        const double d = __half2float(*(__half *)&dh), dmin = __half2float(*(__half *)&mh);
        const uint8_t *s = b + 4;
        for (int j = 0; j < 8; j++) {
            int sc, m;
            if (j < 4) {
                sc = s[j] & 63;
                m = s[j + 4] & 63;
            } else {
                sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
                m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
            }
            const int c = j / 2, hi = j & 1;
            long isum = 0;
            for (int v = 0; v < 32; v++) {
                const int q = hi ? b[16 + 32 * c + v] >> 4 : b[16 + 32 * c + v] & 15;
                isum += (long)q * xq[blk * 256 + 32 * j + v];
            }
            const float2 f = ds[blk * 8 + j];
            acc += d * sc * f.x * (double)isum - dmin * m * f.y;
        }
    }
    return acc;
}

struct ctx {
    const uint8_t *hw; /* host copy of one matrix */
    const int8_t *hx;
    const float2 *hds;
    uint8_t *W;
    int8_t *xq;
    float2 *ds;
    float *y;
    size_t mat; /* bytes between the chain's copies */
    int n_chain, reps;
    cudaStream_t st;
    int failed;
};

/* Every kernel's outputs of n_rows x KK against regs' (bitwise; ring_ks adds in another
 * order) and the host's. */
static const int k_checked[] = {K_REGS,  K_RING,  K_RING_SX, K_REGS8,   K_REGS16,  K_PRE,
                                K_EARLY, K_XPERM, K_TIE,     K_TIEP,    K_SMEM1,   K_SMEM1P,
                                K_RING_E1, K_RING_E2, K_RING_E3, K_RING_KS};
#define N_CHECKED (int)(sizeof k_checked / sizeof k_checked[0])
template <int KK> static void check(ctx &c, int n_rows) {
    constexpr int RB = ROW_BYTES_OF(KK);
    float *h[N_CHECKED];
    for (int k = 0; k < N_CHECKED; k++) {
        h[k] = (float *)malloc((size_t)n_rows * sizeof(float));
        if (!kind_fits<KK>(k_checked[k])) { /* skipped: its outputs are taken as regs' */
            CK(cudaStreamSynchronize(c.st));
            memcpy(h[k], h[0], (size_t)n_rows * sizeof(float));
            continue;
        }
        CK(cudaMemsetAsync(c.y, 0, (size_t)n_rows * sizeof(float), c.st));
        launch<KK>(k_checked[k], c.W, c.xq, c.ds, c.y, n_rows, c.st);
        CK(cudaMemcpyAsync(h[k], c.y, (size_t)n_rows * sizeof(float), cudaMemcpyDeviceToHost,
                           c.st));
    }
    CK(cudaStreamSynchronize(c.st));
    int n_diff = 0;
    for (int k = 1; k < N_CHECKED - 1; k++)
        for (int r = 0; r < n_rows; r++)
            n_diff += memcmp(&h[0][r], &h[k][r], 4) != 0;
    double max_err = 0.0, max_ref = 0.0;
    for (int r = 0; r < n_rows; r += 97) {
        const double ref = ref_row(c.hw + (size_t)r * RB, c.hx, c.hds, KK);
        max_err = fmax(max_err, fabs(h[0][r] - ref));
        max_err = fmax(max_err, fabs(h[N_CHECKED - 1][r] - ref));
        max_ref = fmax(max_ref, fabs(ref));
    }
    const double rel = max_err / fmax(max_ref, 1e-30);
    const bool ok = n_diff == 0 && rel < 1e-4;
    printf("check K %d, %d rows: %d outputs of the other kernels differ from regs'; worst error "
           "(regs, ring_ks) vs host / largest output %.2e -> %s\n", KK, n_rows, n_diff, rel,
           ok ? "ok" : "FAILED");
    c.failed |= !ok;
    for (int k = 0; k < N_CHECKED; k++)
        free(h[k]);
}

/* One table row: us a launch in chains of c.n_chain for each kind of k_timed. */
static const int k_timed[] = {K_BARE,  K_BARE_ST, K_REGS, K_NODOT, K_NOX,   K_XPERM, K_TIE,
                              K_TIEP,  K_SMEM1,   K_SMEM1P, K_PRE,  K_EARLY, K_RING,  K_RING_KS,
                              K_RING_E1, K_RING_E2, K_RING_E3};
#define N_TIMED (int)(sizeof k_timed / sizeof k_timed[0])
template <int KK> static void row(ctx &c, int n_rows) {
    const size_t bytes = (size_t)n_rows * ROW_BYTES_OF(KK);
    float us[N_TIMED];
    for (int k = 0; k < N_TIMED; k++) {
        if ((k_timed[k] == K_RING && KK != 4096) || !kind_fits<KK>(k_timed[k])) {
            us[k] = 0.0f;
            continue;
        }
        cudaGraph_t g;
        cudaGraphExec_t e;
        CK(cudaStreamBeginCapture(c.st, cudaStreamCaptureModeGlobal));
        for (int i = 0; i < c.n_chain; i++)
            launch<KK>(k_timed[k], c.W + (size_t)i * c.mat, c.xq, c.ds, c.y + (size_t)i * 32768,
                       n_rows, c.st);
        CK(cudaStreamEndCapture(c.st, &g));
        CK(cudaGraphInstantiate(&e, g, 0));
        us[k] = median_us(e, c.st, c.reps) / c.n_chain;
        CK(cudaGraphExecDestroy(e));
        CK(cudaGraphDestroy(g));
    }
    printf("| %d | %d | %.1f |", KK, n_rows, bytes / 1e6);
    for (int k = 0; k < N_TIMED; k++)
        printf(" %.2f |", us[k]);
    printf(" %.2f |\n", bytes / (us[0] * 1e-6) / 1e12);
}

int main(int argc, char **argv) {
    ctx c = {};
    c.n_chain = argc > 1 ? atoi(argv[1]) : 36;
    c.reps = 15;
    CK(cudaDeviceGetAttribute(&g_n_sm, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaDeviceGetAttribute(&g_smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    c.mat = (size_t)24576 * ROW_BYTES_OF(4096); /* the largest shape: 56.6 MB */

    /* one random matrix, copied n_chain times; f16 d, dmin kept small and positive */
    uint8_t *hw = (uint8_t *)malloc(c.mat);
    srand(7);
    for (size_t i = 0; i < c.mat; i++)
        hw[i] = (uint8_t)(rand() >> 7);
    for (size_t b = 0; b < c.mat / QK_BYTES; b++) {
        const __half d = __float2half(0.0005f + 0.0001f * (float)(b % 13));
        const __half m = __float2half(0.0003f + 0.0001f * (float)(b % 7));
        memcpy(hw + b * QK_BYTES, &d, 2);
        memcpy(hw + b * QK_BYTES + 2, &m, 2);
    }
    static int8_t hx[K_MAX];
    static float2 hds[K_MAX / 32];
    for (int i = 0; i < K_MAX; i++)
        hx[i] = (int8_t)((rand() % 255) - 127);
    for (int j = 0; j < K_MAX / 32; j++) {
        long sum = 0;
        for (int v = 0; v < 32; v++)
            sum += hx[32 * j + v];
        const float dx = 0.01f + 0.001f * (float)(j % 11);
        hds[j] = make_float2(dx, dx * (float)sum);
    }
    c.hw = hw;
    c.hx = hx;
    c.hds = hds;
    CK(cudaMalloc(&c.W, c.mat * c.n_chain));
    for (int i = 0; i < c.n_chain; i++)
        CK(cudaMemcpy(c.W + (size_t)i * c.mat, hw, c.mat, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&c.xq, K_MAX));
    CK(cudaMalloc(&c.ds, sizeof hds));
    CK(cudaMalloc(&c.y, (size_t)32768 * c.n_chain * sizeof(float)));
    CK(cudaMemcpy(c.xq, hx, K_MAX, cudaMemcpyHostToDevice));
    {
        static int8_t hp[K_MAX]; /* item it = lane + 32u: its piece k at 512 * (4u + k) + 16 lane */
        for (int it = 0; it < K_MAX / 64; it++)
            for (int k = 0; k < 4; k++)
                memcpy(hp + 512 * (4 * (it / 32) + k) + 16 * (it % 32), hx + 64 * it + 16 * k, 16);
        CK(cudaMalloc(&g_xperm, K_MAX));
        CK(cudaMemcpy(g_xperm, hp, K_MAX, cudaMemcpyHostToDevice));
    }
    CK(cudaMemcpy(c.ds, hds, sizeof hds, cudaMemcpyHostToDevice));
    CK(cudaStreamCreateWithFlags(&c.st, cudaStreamNonBlocking));
    printf("gemv_chain: %d SMs, ring: %d warps a block, %d stages; chains of %d launches\n",
           g_n_sm, RING_WARPS, RING_STAGES, c.n_chain);
    check<4096>(c, 24576);
    check<12288>(c, 8192);

    printf("| K | rows | MB a launch | bare | bare_st | regs | nodot | nox | xperm | tie | tiep | smem1 "
           "| smem1p | pre | early | ring | ring_ks | ring_e1 | ring_e2 | ring_e3 | bare TB/s |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:"
           "|---:|---:|---:|\n");
    const int rows4k[] = {1024, 4096, 6144, 24576};
    for (int i = 0; i < 4; i++)
        row<4096>(c, rows4k[i]);
    row<12288>(c, 4096);
    CK(cudaGetLastError());
    return c.failed;
}
