/*
 * kern_attn_mma.cu — causal attention over the f16 KV cache on tensor cores
 * (mma.sync m16n8k16: f16 inputs, f32 accumulators), FlashAttention-2 style, for
 * head_dim 64 and 128. kern_attention (kern_attn.cu) stores k/v into the cache first
 * and then calls kern_attention_mma, which returns false for shapes it leaves to the
 * CUDA-core kernels there.
 *
 * Rows. A block owns ROWS query rows; a row is one (token, query head) pair. The
 * hp = 2^k query heads of one GQA group that a block packs (hp: the largest power of
 * two dividing the group, at most 16) sit next to each other: row r is token
 * t0 + r / hp, head h0 + r % hp. Packing the group into M is why a 16-token block of
 * Qwen3-8B (group 4) already fills 64 rows, and a decode token fills 4 of 16 instead
 * of 1: every K/V tile copied to shared memory serves all the rows that read it.
 * The tokens of a block are a run of consecutive batch tokens of one slot (the host
 * cuts the batch into such runs: kern_attn_blocks); each row keeps its own position,
 * so positions need not be consecutive or sorted inside a block.
 *
 * Two shapes of one kernel template (attn_mma_kernel<HD, DEC, NSTAGE, NW>):
 * - prefill (DEC false, batches of >= MMA_MIN_PREFILL tokens): 64 rows, 4 warps x 16
 *   rows; every warp sees all 64 keys of a tile. K/V tiles double buffered (cp.async).
 *   The k/v store is the store kernel's (kern_attn_store) before it.
 * - decode (DEC true, smaller batches, also inside CUDA graphs): 16 rows, shared by the
 *   NW warps (8 by default, or 4); a tile holds 16 * NW keys and warp w takes keys
 *   16w..16w+15 of each, so the block streams the cache NW times faster than one warp
 *   could, NSTAGE - 1 tiles in flight. The warps' partial softmax states are merged
 *   through shared memory at the end in a fixed order. Given qk_norm_rope's parameters
 *   (kern_attention_qk; n_rot % 64 == 0) it normalizes and rotates the block's q rows
 *   and its KV head's batch k itself, bitwise as qk_norm_rope_kernel (mma_qk_row), into
 *   the last K/V stage's shared memory before any tile needs it (one launch less per
 *   layer and step). It also stores the batch's k/v itself (one launch less per layer and step),
 *   and, given an int8 buffer (kern_xq_claim, XQ_BY_ATTN), writes its output rows'
 *   int8 form for the next matmul (out is the x of the wo matmul): blocks of 32 with
 *   kind p's permuted copies, kern_xq.cuh's layout, made by kern_q8_block as the
 *   matmul's own quantization makes them (bitwise), which that matmul then skips.
 *   Shallow calls (g_dec_pre) copy their first tiles before the PDL wait and put the
 *   batch's stored rows into them from registers once they have landed.
 * Per tile and warp: S = Q K^T (Q held as f16 A fragments for the whole run, K as B
 * fragments by ldmatrix), the causal mask per row (only on tiles that reach past the
 * smallest position of the warp's rows, or past the split's end), online softmax in
 * base 2 (log2(e) folded into the Q scale; -inf safe: a row with nothing visible yet
 * keeps m = -inf, l = 0, O = 0), P rounded to f16 straight from the S accumulators into
 * A fragments (the FA2 register reuse), O += P V (V B fragments by ldmatrix.trans).
 *
 * Split-K. When the (query block x KV head) grid cannot fill the GPU (decode, short
 * chunks at depth), the keys of each block are cut into n_split ranges; each range is
 * derived on the device from the block's own largest position (any split count is
 * correct, which CUDA graphs rely on: forward.c). Every split writes its partial
 * (m, l, O). Decode shape: each block then bumps an arrival counter and the last one
 * to arrive merges the splits of its rows (no second launch) and resets the counter;
 * prefill shape (up to 64 rows x n_split partials per block): a merge kernel with a
 * warp per row. Both add in split order (deterministic: no float atomics). A decode
 * launch that the device schedules as thread-block clusters runs the ranges of each
 * block as one or more clusters instead: the partials stay in shared memory and, after
 * a cluster barrier, the blocks merge them together, each taking some 32-value pieces of
 * the rows through distributed shared memory (mma_cluster_merge): no last block merging
 * alone. With several clusters a block (deep ranges, when one cluster's blocks are too
 * few for the GPU and more of them would not all be resident at once) each cluster's
 * merged pieces meet the others' through global memory, the last to arrive adding them.
 *
 * Knobs, read at context init: TPI_ATTN_MMA (0: off, "prefill" / "decode": that shape
 * only), TPI_ATTN_DEC_BPS (decode split-K target, blocks per multiprocessor; 1),
 * TPI_ATTN_DEC_STAGES (3 or 5, 4 warps only), TPI_ATTN_DEC_WARPS (4 or 8),
 * TPI_ATTN_DEC_SPLIT (decode ranges), TPI_ATTN_DEC_CLUSTER (the largest decode cluster: 0
 * off, 2..16), TPI_ATTN_DEC_CLUSTERS (clusters a block: 1..8), TPI_ATTN_DEC_PRE (the depth
 * under which the first tiles are copied before the PDL wait), TPI_ATTN_DEC_PREW (deeper
 * calls copy them right after it: 1; after the prologue: 0), TPI_ATTN_DEC_Q8B,
 * TPI_ATTN_DEC_VERBOSE (the clusters' occupancy table to stderr).
 *
 * Precision: Q and P are rounded to f16 (K and V are f16 in the cache already), sums
 * in f32; against the f32 CPU reference the normalized MSE is ~1e-7 (tests/test_ops_cuda.c
 * derives it).
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cooperative_groups.h>

#include "kern_common.cuh"
#include "kern_xq.cuh"

#define MMA_TILE 64        /* keys per K/V tile */
#define MMA_THREADS 128    /* 4 warps */
#define MMA_MAX_HP 16      /* query heads of a GQA group packed into one block's rows */
#define MMA_MAX_BLOCKS 896 /* query blocks per launch (a kernel parameter array) */
#define MMA_MAX_SPLIT 128  /* key ranges per block (split-K) */
#define MMA_COUNTERS 4096  /* split-K arrival counters: blocks of one launch, at most */
#define MMA_MIN_PREFILL 16 /* batches of at least this many tokens take the prefill shape */
/* decode split-K: key ranges merged inside one thread-block cluster; 8, the portable size
 * (16 only ever placed well at two blocks an SM, and its merge's unrolled code, 1,120
 * instructions against 808, is fetched cold on every call's tail: bench/NOTES.md change 125) */
#define MMA_MAX_CLUSTER 8
/* floats per cluster-merged 32-value piece (several clusters a block): m, l, 2 spare, 32 O */
#define MMA_PIECE 36
#define MMA_MAX_NCL 8 /* decode: clusters one (query block, head block)'s ranges may take */
#define MMA_NCL_TILES 3 /* decode: tiles a block's range must lose to take several clusters */
#define MMA_LOG2E 1.4426950408889634f
/* floats per partial record: m, l, 2 spare, O (16-byte aligned) */
#define MMA_PART(hd) ((hd) + 4)

/* One counter per (query block, head block) of a split launch; each returns to 0 when
 * the last split of its block has arrived, so they are 0 between launches. Module
 * globals are per device; attention runs on the context's one stream, so launches
 * that use them never overlap (two contexts on one device attending concurrently
 * would share them: that does not happen in this engine). */
__device__ unsigned int mma_arrivals[MMA_COUNTERS];

/* Which shapes use the tensor-core kernels (bit 0: prefill, bit 1: decode), from
 * TPI_ATTN_MMA at context init; ops_cuda_set_attn_mma changes it (tests). */
static int g_mma_mode = 3;
/* Decode shape: the split-K grid aims at this many blocks per multiprocessor (measured on
 * the H200: 1 beats 2 and 4 at every depth: fewer, longer ranges cost less to merge),
 * from TPI_ATTN_DEC_BPS at context init (a tuning knob). */
static int g_dec_bps = 1;
/* Decode shape: K/V tiles in flight + 1 (3 or 5), from TPI_ATTN_DEC_STAGES at init. On
 * the H200, with the global split merge, 5 gained nothing for one token (16.7 vs 16.4 us
 * at depth 8192) and 8 % for 4; with 8-block clusters (one block an SM at 5 stages: 174
 * KB) tg128 Q4_K_M +1.5 % at depth 8192 and +3 % at 4096 over 16-block clusters at 3
 * stages (bench/NOTES.md change 47). */
static int g_dec_stages = 5;
/* Decode shape: warps a block, 4 (64-key tiles, g_dec_stages) or 8 (128-key tiles, 3
 * stages: two warps a scheduler on each tile's chain of dependent steps), from
 * TPI_ATTN_DEC_WARPS at init. H200, Q4_K_M tg128, 8 against 4: depth 0 +1.1 %, 2048
 * -1.1 %, 4096 +2.2 %, 8192 +0.7-1.6 %; a 4-token call at 8192 19.1 against 24.1 us
 * (bench/NOTES.md change 49). */
static int g_dec_warps = 8;
/* Decode shape: key ranges per KV head group when > 0 (TPI_ATTN_DEC_SPLIT at init, a
 * tuning knob; still at most one range per tile and MMA_MAX_SPLIT); 0: from g_dec_bps.
 * H200, Qwen3-8B Q4_K_M tg128 at depth 8192: auto (17 ranges for 8 KV heads) 356.3 /
 * 354.0, 8 339.1, 12 354.5, 16 351.4, 24 345.4, 32 345.8, 48 328.2 (bench/NOTES.md). */
static int g_dec_split = 0;
/* Decode shape: the most key ranges of a (query block, head block) merged inside one
 * thread-block cluster through distributed shared memory (TPI_ATTN_DEC_CLUSTER at init:
 * 0 off, 2..MMA_MAX_CLUSTER: 8, the default). A split launch whose range
 * count is at most this (and that the device can schedule as clusters) runs each (query
 * block, head block)'s ranges as one cluster: no partials in global memory, no arrival
 * counter, no last block that merges alone; the split count is capped at it. On the
 * H200 clusters of 10-16 blocks place well only at two blocks an SM (3 stages), where
 * 8 blocks at 5 stages stream faster (bench/NOTES.md changes 45 and 47). */
static int g_dec_cluster = 8;
/* Decode clusters: the most clusters one (query block, head block)'s ranges may take,
 * 1..MMA_MAX_NCL (TPI_ATTN_DEC_CLUSTERS at init). With n > 1 clusters, each merges its own
 * ranges through distributed shared memory into a piece per 32 values of a row, and the n
 * pieces meet through global memory (a counter per piece: the last to arrive adds them
 * all, in cluster order). mma_launch takes the (cluster size, count) that puts the most
 * blocks in one wave of co-resident clusters (ctx->attn_cl_fit). */
static int g_dec_ncl = MMA_MAX_NCL;
/* Decode calls whose largest position is under this copy their first tiles before the
 * PDL wait and put the batch's rows into them from registers (TPI_ATTN_DEC_PRE at init;
 * 0, the default: never; a power of two keeps one recorded graph to one choice). Since
 * the other calls copy right after the wait (g_dec_prew), that order is as fast or faster
 * at every depth measured (0: +0.5 %, 1024: +0.2-0.6 %); at depth 8192, 16 MB asked
 * before the wait delay Q/K/V's end and the prologue's loads more than they gain
 * (bench/NOTES.md changes 90, 93, 114 and 116). */
static int g_dec_pre = 0;
/* Decode calls from g_dec_pre up (with k/v to store: all, by default) copy their first
 * tiles right after the PDL wait, once each warp's q/k row loads are out, instead of after
 * the prologue (TPI_ATTN_DEC_PREW at init: 1, the default, on; 0 off: depth 8192 +2.2 %,
 * depth 2048 +0.9 %; bench/NOTES.md change 114). */
static int g_dec_prew = 1;
/* Decode: the int8 form of an unsplit call's output loads a warp's blocks at once
 * (TPI_ATTN_DEC_Q8B at init; 0: one block a round trip, as before change 94). */
static int g_dec_q8b = 1;

struct mma_args {
    const float *q;     /* (n_tokens, n_head, hd) */
    __half *kc, *vc;    /* this layer's cache: (n_slot, n_ctx, n_kv, hd) */
    const float *k, *v; /* decode shape: the batch's k, v (n_tokens, n_kv, hd) to store;
                         * NULL: stored already */
    const int32_t *seq, *pos;
    float *out;  /* (n_tokens, n_head, hd) */
    float *part; /* (n_tokens, n_head, n_split, hd + 4): m (base 2), l, -, -, O; n_split > 1 */
    int n_tokens, n_slot, n_ctx, n_kv, n_head;
    int group;       /* query heads per KV head */
    int hp_log2;     /* log2 of the heads packed per block */
    int head_chunks; /* group / hp */
    int n_split;
    int cluster;  /* decode shape: 1 when the n_split ranges of a block are n_cl clusters */
    int n_cl;     /* clusters a (query block, head block) takes: 1..MMA_MAX_NCL (above 1,
                   * part holds each cluster's merged 32-value pieces, MMA_PIECE floats) */
    float qscale; /* scale * log2(e) */
    /* decode shape: out's int8 form for the next matmul (NULL: none) in kern_xq.cuh's layout
     * for n_tokens rows of n_head * hd: blocks of 32, their (d, d * sum), and xlay, where the
     * permuted copies lie from xq */
    int8_t *xq;
    float2 *ds;
    gv_xlayout xlay;
    /* decode shape with qk: q and the batch's k are qk_norm_rope's inputs, normalized per
     * head with q_norm / k_norm (NULL: not normalized; eps) and rotated (NEOX, the first
     * n_rot dims, n_rot % 64 == 0, inverse frequencies rope_inv) here (mma_qk_row) */
    const float *q_norm, *k_norm;
    const double *rope_inv;
    double rope_ms; /* cos and sin scale (rope.h mscale) */
    int n_rot;
    float eps;
    bool qk;
    int trigger; /* decode: let the next kernel launch (ctx->wo_prefetch): 1 after the K/V
                    stream, 2 at the start */
    int q8b;     /* decode: the int8 form's loads a warp at once (g_dec_q8b) */
    int pre;     /* decode with k/v to store: the first tiles copied before the PDL wait
                    (1) or right after it (2: once the warp's q/k row loads are out), the
                    batch's rows put into them from registers (g_dec_pre, g_dec_prew) */
    int32_t blk[MMA_MAX_BLOCKS]; /* query blocks: first token << 7 | (tokens - 1) */
};
static_assert(sizeof(mma_args) <= 4096, "kernel parameters must fit 4 KB");

/* A measuring build (-DTPI_ATTN_TRACE=1 in CMAKE_CUDA_FLAGS; off otherwise, and then none
 * of this is compiled): thread 0 of every decode block records %globaltimer at the points
 * below into mma_trace, and kern_attn_trace_dump prints the last call's times when the
 * backend is freed (bench/NOTES.md change 82). */
#ifndef TPI_ATTN_TRACE
#define TPI_ATTN_TRACE 0
#endif
#define MMA_TR_N 15       /* points a block (the enum below) */
#define MMA_TR_BLOCKS 2048 /* blocks recorded (linear block index) */
#define MMA_TR_WINDOW_NS 50000 /* the last call: blocks started this close to the latest */
enum {
    MMA_TR_START,   /* entry */
    MMA_TR_WAITED,  /* the PDL wait returned */
    MMA_TR_PROLOG,  /* q, the batch's k/v and positions loaded, the range known */
    MMA_TR_STORED,  /* the batch's k/v stored and fenced */
    MMA_TR_TILE0,   /* the first tile landed */
    MMA_TR_LOOP,    /* the last tile's products done */
    MMA_TR_WMERGE,  /* the warps' states merged */
    MMA_TR_MERGED,  /* the splits merged (cluster or last block), or skipped */
    MMA_TR_Q8SYNC,  /* the int8 form: the block's barrier passed */
    MMA_TR_Q8VAL,   /* the int8 form: warp 0's first block quantized (its loads landed) */
    MMA_TR_END,     /* the int8 form written; exit */
    MMA_TR_CLSYNC,  /* the cluster merge: its first cluster barrier passed */
    MMA_TR_CLLOAD,  /* the cluster merge: warp 0's peers' partials loaded */
    MMA_TR_CLDONE,  /* the cluster merge: warp 0's pieces written, before the last barrier */
    MMA_TR_TILES,   /* (not a time) the block's tiles */
};
static_assert(MMA_TR_TILES + 1 == MMA_TR_N, "a slot a point");
#if TPI_ATTN_TRACE
__device__ unsigned long long mma_trace[MMA_TR_BLOCKS * MMA_TR_N];
/* Thread 0's slot for point k of this block; NULL in other threads and past the table. */
__device__ __forceinline__ unsigned long long *mma_tr_slot(int k) {
    if (threadIdx.x != 0) return NULL;
    const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    return b < MMA_TR_BLOCKS ? &mma_trace[b * MMA_TR_N + k] : NULL;
}
/* Point k's time now (or, for MMA_TR_TILES, the value v) into the block's slot. */
__device__ __forceinline__ void mma_tr(int k, unsigned long long v = 0) {
    unsigned long long *p = mma_tr_slot(k);
    if (!p) return;
    if (k != MMA_TR_TILES) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));
    *p = v;
}
/* Point k's time, read only once dep is known (the point waits for what made dep). */
__device__ __forceinline__ void mma_tr_dep(int k, int dep) {
    unsigned long long *p = mma_tr_slot(k), v;
    if (!p) return;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v) : "r"(dep));
    *p = v;
}
#define MMA_TR(k) mma_tr(k)
#define MMA_TR_V(k, v) mma_tr(k, v)
#define MMA_TR_DEP(k, d) mma_tr_dep(k, d)
#else
#define MMA_TR(k) ((void)0)
#define MMA_TR_V(k, v) ((void)0)
#define MMA_TR_DEP(k, d) ((void)0)
#endif

/* ---------------------------------------------------------------- kernels */

__device__ __forceinline__ void mma_ldsm4_t(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
/* c(16x8, f32) += a(16x16, f16, row-major) * b(16x8, f16, "col": b[k][n] with k inner). */
__device__ __forceinline__ void mma_16816(float c[4], const uint32_t a[4], uint32_t b0,
                                          uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* lo in the low 16 bits: the element of the lower column index in a fragment register. */
__device__ __forceinline__ uint32_t mma_pack(__half2 h) {
    uint32_t u;
    memcpy(&u, &h, sizeof u);
    return u;
}

/* Decode with a.qk: one head row of the block's qk_norm_rope work, for one warp. Row i
 * of the block's n_q + n_tokens: query row i (i < n_q), else the k of batch token
 * i - n_q for its KV head, taken only when that token is in the block's slot (on). What
 * mma_qk_prep fills needs no kernel's output (positions, the frequency table, the norm
 * weights), so it is made before the PDL wait. */
template <int HD> struct mma_qk_job {
    const float *src; /* the row as the Q/K/V product wrote it */
    float *dst;       /* its normalized, rotated values (shared memory) */
    bool on, norm;
    float w[HD / 32]; /* lane l's norm weights: dims l + 32 j */
    float2 cs[2];     /* (cos, sin) of lane l's pairs j < n_rot / 64: dims l + 32 j */
};
template <int HD>
__device__ __forceinline__ mma_qk_job<HD> mma_qk_prep(const mma_args &a, int i, int n_q, int t0,
                                                      int h0, int kvh, int s, float *qk_s,
                                                      int lane) {
    mma_qk_job<HD> j;
    const float *wn;
    int t;
    if (i < n_q) {
        t = t0 + (i >> a.hp_log2);
        j.src = a.q + ((size_t)t * a.n_head + h0 + (i & ((1 << a.hp_log2) - 1))) * HD;
        j.dst = qk_s + i * HD;
        wn = a.q_norm;
        j.on = true;
    } else {
        t = i - n_q;
        j.src = a.k + ((size_t)t * a.n_kv + kvh) * HD;
        j.dst = qk_s + (16 + t) * HD;
        wn = a.k_norm;
        j.on = a.seq[t] == s;
    }
    j.norm = wn != NULL;
    /* the loads do not wait for `on` (t is a batch token): one round trip */
#pragma unroll
    for (int jj = 0; jj < HD / 32; jj++)
        j.w[jj] = wn ? wn[lane + 32 * jj] : 0.0f;
    const double p = (double)a.pos[t];
    const int jh = a.n_rot / 64;
#pragma unroll
    for (int jj = 0; jj < 2; jj++)
        j.cs[jj] = jj < jh ? kern_rope_cs(p, a.rope_inv[lane + 32 * jj], a.rope_ms) : make_float2(0.0f, 0.0f);
    return j;
}
/* Job j's row into v (lane l: dims l + 32 jj), the loads only (mma_qk_calc uses them). */
template <int HD>
__device__ __forceinline__ void mma_qk_load(const mma_qk_job<HD> &j, int lane,
                                            float (&v)[HD / 32]) {
#pragma unroll
    for (int jj = 0; jj < HD / 32; jj++)
        v[jj] = j.src[lane + 32 * jj];
}
/* qk_norm_rope_kernel's work (kern_elem.cu) on job j's row v (mma_qk_load's), bitwise:
 * lane l holds dims l + 32 jj; the sum of squares in that kernel's order (its HD / 2
 * threads: thread t sums x[t]^2 then x[t + HD/2]^2 with one rounding a term; a butterfly
 * over each warp of threads, then the two warps' sums added), the norm, then pairs (i, i +
 * n_rot / 2) in one lane (n_rot % 64 == 0) rotated with kern_rope_apply. All 32 lanes
 * take part. */
template <int HD>
__device__ __forceinline__ void mma_qk_calc(const mma_qk_job<HD> &j, float (&v)[HD / 32],
                                            int n_rot, float eps, int lane) {
    constexpr int J = HD / 32;
    static_assert(HD == 64 || HD == 128, "qk_norm_rope_kernel's threads: HD / 2");
    if (j.norm) {
        /* thread lane: dims lane, lane + HD/2; thread lane + 32 (HD 128): lane + 32, + 96 */
        float s0 = __fmaf_rn(v[0], v[0], 0.0f), s1 = 0.0f;
        if constexpr (HD == 128) {
            s0 = __fmaf_rn(v[2], v[2], s0);
            s1 = __fmaf_rn(v[3], v[3], __fmaf_rn(v[1], v[1], 0.0f));
        } else {
            s0 = __fmaf_rn(v[1], v[1], s0);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            s0 += __shfl_xor_sync(0xffffffffu, s0, o);
            if constexpr (HD == 128) s1 += __shfl_xor_sync(0xffffffffu, s1, o);
        }
        const float ss = HD == 128 ? s0 + s1 : s0;
        const float scale = kern_rms_scale(ss, HD, eps);
#pragma unroll
        for (int jj = 0; jj < J; jj++)
            v[jj] = __fmul_rn(__fmul_rn(v[jj], scale), j.w[jj]);
    }
    const int jh = n_rot / 64; /* pairs: jj < jh with jj + jh */
#pragma unroll
    for (int jj = 0; jj < J; jj++) {
        const int c = lane + 32 * jj;
        if (jj < jh)
            kern_rope_apply(v[jj], v[jj + jh < J ? jj + jh : 0], j.dst, c, n_rot / 2,
                            j.cs[jj < 2 ? jj : 0]);
        else if (jj >= 2 * jh)
            j.dst[c] = v[jj]; /* past n_rot: normalized only */
    }
}
/* mma_qk_load, then mma_qk_calc: job j's row normalized and rotated into j.dst. */
template <int HD>
__device__ __forceinline__ void mma_qk_row(const mma_qk_job<HD> &j, int n_rot, float eps,
                                           int lane) {
    float v[HD / 32];
    mma_qk_load<HD>(j, lane, v);
    mma_qk_calc<HD>(j, v, n_rot, eps, lane);
}

/* Merge the n_split partial records of rows r < R of a block (row r: token t0 + r / hp,
 * head h0 + r % hp; R <= 16) into out, by the NT threads of one block. When all
 * records fit in sm (sm_floats floats) they are copied in with one round trip; else the
 * (m, l) of every (row, split) pair first (independent loads), one warp per row for the
 * weights 2^(m_s - M) / L, then the O vectors, each thread a 4-float column over a
 * strided set of splits, several loads in flight, the column groups summed in a fixed
 * order. Either way the order of additions is fixed (deterministic). sm: >= 48 KB. */
template <int HD, int NT>
__device__ void mma_merge_rows(const mma_args &a, int t0, int nt, int h0, float *sm,
                               int sm_floats) {
    constexpr int PS = MMA_PART(HD), C4 = HD / 4; /* threads per column set */
    constexpr int NG = NT / C4;                   /* column groups: splits gi, gi + NG, ... */
    const int n_split = a.n_split, hp_log2 = a.hp_log2, hp_mask = (1 << hp_log2) - 1;
    const int n_rows = nt << hp_log2; /* <= 16 */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    auto row_th = [&](int r) {
        return (size_t)(t0 + (r >> hp_log2)) * a.n_head + h0 + (r & hp_mask);
    };
    const int n_rec = n_rows * n_split;
    if (n_rec * (PS + 1) <= sm_floats) {
        /* every record fits in shared memory: one round trip (cp.async from L2), then
         * the weights (a warp per row) and the outputs (a thread per 4 dims of a row) */
        float *rec = sm, *wt = sm + n_rec * PS;
        const uint32_t rec0 = mma_smem_u32(rec);
        for (int i = threadIdx.x; i < n_rec * (PS / 4); i += NT) {
            const int rr = i / (PS / 4), q4 = i - rr * (PS / 4);
            const int r = rr / n_split, sp = rr - r * n_split;
            mma_cp16(rec0 + (uint32_t)(rr * PS + 4 * q4) * 4u,
                     a.part + (row_th(r) * n_split + sp) * PS + 4 * q4, 16);
        }
        mma_commit();
        mma_wait<0>();
        __syncthreads();
        for (int r = warp; r < n_rows; r += NT / 32) {
            const float *rr = rec + (size_t)r * n_split * PS;
            float mx = -INFINITY;
            for (int sp = lane; sp < n_split; sp += 32)
                mx = fmaxf(mx, rr[sp * PS]);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            float lsum = 0.0f;
            for (int sp = lane; sp < n_split; sp += 32) {
                const float ms = rr[sp * PS];
                const float e = ms == -INFINITY ? 0.0f : exp2f(ms - mx);
                wt[r * n_split + sp] = e;
                lsum += e * rr[sp * PS + 1];
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                lsum += __shfl_xor_sync(0xffffffffu, lsum, o);
            const float inv = lsum > 0.0f ? 1.0f / lsum : 0.0f;
            __syncwarp();
            for (int sp = lane; sp < n_split; sp += 32)
                wt[r * n_split + sp] *= inv;
        }
        __syncthreads();
        for (int i = threadIdx.x; i < n_rows * C4; i += NT) {
            const int r = i / C4, d4 = i - r * C4;
            float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            for (int sp = 0; sp < n_split; sp++) {
                const float wv = wt[r * n_split + sp];
                const float4 x =
                    *(const float4 *)(rec + (size_t)(r * n_split + sp) * PS + 4 + 4 * d4);
                o.x = fmaf(x.x, wv, o.x), o.y = fmaf(x.y, wv, o.y);
                o.z = fmaf(x.z, wv, o.z), o.w = fmaf(x.w, wv, o.w);
            }
            *(float4 *)(a.out + row_th(r) * HD + 4 * d4) = o;
        }
        return;
    }
    float *wm = sm;                         /* [16][MMA_MAX_SPLIT]: m, then the weight */
    float *wl = wm + 16 * MMA_MAX_SPLIT;    /* [16][MMA_MAX_SPLIT]: l */
    float *acc_s = wl + 16 * MMA_MAX_SPLIT; /* [NG][16][HD] */
    for (int i = threadIdx.x; i < n_rows * n_split; i += NT) {
        const int r = i / n_split, sp = i - r * n_split;
        const float2 ml = __ldcg((const float2 *)(a.part + (row_th(r) * n_split + sp) * PS));
        wm[r * MMA_MAX_SPLIT + sp] = ml.x;
        wl[r * MMA_MAX_SPLIT + sp] = ml.y;
    }
    __syncthreads();
    for (int r = warp; r < n_rows; r += NT / 32) {
        float *w = wm + r * MMA_MAX_SPLIT;
        float mx = -INFINITY;
        for (int sp = lane; sp < n_split; sp += 32)
            mx = fmaxf(mx, w[sp]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float lsum = 0.0f;
        for (int sp = lane; sp < n_split; sp += 32) {
            const float e = w[sp] == -INFINITY ? 0.0f : exp2f(w[sp] - mx);
            w[sp] = e;
            lsum += e * wl[r * MMA_MAX_SPLIT + sp];
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            lsum += __shfl_xor_sync(0xffffffffu, lsum, o);
        const float inv = lsum > 0.0f ? 1.0f / lsum : 0.0f;
        for (int sp = lane; sp < n_split; sp += 32)
            w[sp] *= inv;
    }
    __syncthreads();
    const int gi = threadIdx.x / C4, c4 = threadIdx.x % C4;
    for (int r = 0; r < n_rows; r++) {
        const float *src = a.part + row_th(r) * n_split * PS + 4 + 4 * c4;
        const float *w = wm + r * MMA_MAX_SPLIT;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int sp0 = gi; sp0 < n_split; sp0 += 8 * NG) {
            float4 v[8]; /* eight splits' loads in flight */
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int sp = sp0 + u * NG;
                v[u] = sp < n_split ? __ldcg((const float4 *)(src + (size_t)sp * PS))
                                    : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int sp = sp0 + u * NG;
                const float wv = sp < n_split ? w[sp] : 0.0f;
                acc.x = fmaf(v[u].x, wv, acc.x);
                acc.y = fmaf(v[u].y, wv, acc.y);
                acc.z = fmaf(v[u].z, wv, acc.z);
                acc.w = fmaf(v[u].w, wv, acc.w);
            }
        }
        *(float4 *)(acc_s + (gi * 16 + r) * HD + 4 * c4) = acc;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n_rows * C4; i += NT) {
        const int r = i / C4, d4 = i - r * C4;
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int g2 = 0; g2 < NG; g2++) {
            const float4 x = *(const float4 *)(acc_s + (g2 * 16 + r) * HD + 4 * d4);
            o.x += x.x, o.y += x.y, o.z += x.z, o.w += x.w;
        }
        *(float4 *)(a.out + row_th(r) * HD + 4 * d4) = o;
    }
}

/* The int8 form of the rows r < nt << hp_log2 of a block (row r: token t0 + r / hp, head
 * h0 + r % hp), which this block has just written to out and made visible to all its
 * threads (__syncthreads), into a.xq / a.ds and the permuted copies: warp w of the NT / 32
 * takes the 32-value blocks w, w + NT / 32, ... of those rows (hd % 32 == 0: a block never straddles two
 * heads), one value per lane, read back from out, so the int8 form is made from exactly
 * the floats the next matmul's own quantization would read. The loop bound is
 * warp-uniform: all 32 lanes take part in kern_q8_block's shuffles. */
template <int HD, int NT>
__device__ __forceinline__ void mma_quantize_rows(const mma_args &a, int t0, int nt, int h0) {
    constexpr int BPR = HD / 32; /* q8 blocks per row */
    static_assert(HD % 32 == 0, "a q8 block lies inside one head");
    const int hp_log2 = a.hp_log2, hp_mask = (1 << hp_log2) - 1;
    const int n_blk = (nt << hp_log2) * BPR;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t ne0 = (int64_t)a.n_head * HD;
    /* a.q8b: a warp loads up to QB of its blocks' values at once, one round trip for
     * them, then quantizes them in turn (bench/NOTES.md change 94) */
    constexpr int QB = 4, NWP = NT / 32;
    const int qb_step = a.q8b ? QB * NWP : NWP, n_at = a.q8b ? QB : 1;
    for (int qb0 = warp; qb0 < n_blk; qb0 += qb_step) {
        float v[QB];
        int64_t ix[QB];
        int tk[QB], at[QB]; /* the value's token (row of out) and index in that row */
#pragma unroll
        for (int k = 0; k < QB; k++) {
            const int qb = qb0 + k * NWP;
            ix[k] = -1;
            if (k < n_at && qb < n_blk) { /* warp-uniform */
                const int r = qb / BPR, j = qb - r * BPR;
                tk[k] = t0 + (r >> hp_log2);
                at[k] = (h0 + (r & hp_mask)) * HD + 32 * j + lane;
                ix[k] = (int64_t)tk[k] * ne0 + at[k]; /* index in the (n_tokens x ne0) output */
                v[k] = a.out[ix[k]];
            }
        }
#pragma unroll
        for (int k = 0; k < QB; k++)
            if (ix[k] >= 0) {
                const int q = kern_q8_block(v[k], ix[k], a.xq, a.ds);
                if (k == 0 && qb0 == warp) MMA_TR_DEP(MMA_TR_Q8VAL, q); /* its loads landed */
                gv_perm_store_at(q, tk[k], at[k], a.xlay, a.xq);
            }
    }
}

/* mma_cluster_merge's rows for a cluster of S <= SMAX blocks: the loops over the splits
 * are unrolled SMAX times, the splits past S predicated off. The merge runs once a call,
 * on its tail, so its instructions come in cold, and a call fetches all SMAX steps:
 * SMAX = S (a literal) gives a copy with no dead steps (bench/NOTES.md changes 124-126).
 * pass: the trace build's second pass (0 otherwise). */
template <int HD, int NT, int SMAX>
__device__ __forceinline__ void mma_cluster_rows(const mma_args &a, int t0, int nt, int h0,
                                                 const float *cpart, int S, int pass) {
    namespace cg = cooperative_groups;
    constexpr int OS = HD + 4, BPR = HD / 32;
    cg::cluster_group cl = cg::this_cluster();
    const int rank = (int)cl.block_rank();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int hp_log2 = a.hp_log2, hp_mask = (1 << hp_log2) - 1;
    const int n_blk = (nt << hp_log2) * BPR;
    const int64_t ne0 = (int64_t)a.n_head * HD;
    const int c = (int)blockIdx.z / S; /* this cluster of the block's n_cl */
    (void)pass;
    for (int qb = rank + S * warp; qb < n_blk; qb += S * (NT / 32)) {
        const int r = qb / BPR, d = 32 * (qb - r * BPR) + lane;
        float mv[SMAX], lv[SMAX], xv[SMAX];
#pragma unroll
        for (int sp = 0; sp < SMAX; sp++)
            if (sp < S) {
                const float *p = cl.map_shared_rank(cpart, (unsigned)sp) + r * OS;
                mv[sp] = p[0];
                lv[sp] = p[1];
                xv[sp] = p[4 + d];
            }
        if (qb == rank) MMA_TR_DEP(pass ? MMA_TR_Q8VAL : MMA_TR_CLLOAD, __float_as_int(xv[0]));
        float mx = -INFINITY;
#pragma unroll
        for (int sp = 0; sp < SMAX; sp++)
            if (sp < S) mx = fmaxf(mx, mv[sp]);
        float lsum = 0.0f;
#pragma unroll
        for (int sp = 0; sp < SMAX; sp++)
            if (sp < S) {
                mv[sp] = mv[sp] == -INFINITY ? 0.0f : exp2f(mv[sp] - mx);
                lsum = fmaf(mv[sp], lv[sp], lsum);
            }
        const int tk = t0 + (r >> hp_log2), at = (h0 + (r & hp_mask)) * HD + d;
        const int64_t th = (int64_t)tk * a.n_head + h0 + (r & hp_mask);
        const int64_t i = (int64_t)tk * ne0 + at; /* index in the (n_tokens x ne0) output */
        float o = 0.0f;
        if (a.n_cl == 1) {
            const float inv = lsum > 0.0f ? 1.0f / lsum : 0.0f;
#pragma unroll
            for (int sp = 0; sp < SMAX; sp++)
                if (sp < S) o = fmaf(xv[sp], mv[sp] * inv, o);
        } else {
            /* this cluster's piece (m, l, unnormalized O) to global memory; the last of the
             * n_cl clusters to arrive at the piece's counter adds them all, 0's first */
#pragma unroll
            for (int sp = 0; sp < SMAX; sp++)
                if (sp < S) o = fmaf(xv[sp], mv[sp], o);
            const int64_t pc = th * BPR + (d >> 5); /* the piece: < MMA_COUNTERS (host) */
            float *rec = a.part + (size_t)(pc * a.n_cl) * MMA_PIECE;
            float *mine = rec + c * MMA_PIECE;
            mine[4 + lane] = o;
            if (lane == 0) mine[0] = mx, mine[1] = lsum;
            kern_fence_gpu(); /* each lane's stores before the count (release) */
            __syncwarp();
            unsigned prev = 0;
            if (lane == 0) {
                prev = atomicAdd(&mma_arrivals[pc], 1u);
                /* all are in: the counter is ready for the next launch */
                if (prev == (unsigned)a.n_cl - 1) mma_arrivals[pc] = 0;
            }
            prev = __shfl_sync(0xffffffffu, prev, 0);
            if (prev != (unsigned)a.n_cl - 1) continue; /* warp-uniform: another finishes it */
            kern_fence_gpu(); /* the other clusters' pieces after the count (acquire) */
            float pm[MMA_MAX_NCL], pl[MMA_MAX_NCL], po[MMA_MAX_NCL];
            float mm = -INFINITY;
#pragma unroll
            for (int k = 0; k < MMA_MAX_NCL; k++)
                if (k < a.n_cl) {
                    const float *rk = rec + k * MMA_PIECE;
                    pm[k] = __ldcg(rk), pl[k] = __ldcg(rk + 1), po[k] = __ldcg(rk + 4 + lane);
                    mm = fmaxf(mm, pm[k]);
                }
            float lt = 0.0f, ot = 0.0f;
#pragma unroll
            for (int k = 0; k < MMA_MAX_NCL; k++)
                if (k < a.n_cl) {
                    const float w = pm[k] == -INFINITY ? 0.0f : exp2f(pm[k] - mm);
                    lt = fmaf(w, pl[k], lt);
                    ot = fmaf(w, po[k], ot);
                }
            o = lt > 0.0f ? ot / lt : 0.0f;
        }
        a.out[i] = o;
        if (a.xq) {
            const int q = kern_q8_block(o, i, a.xq, a.ds);
            gv_perm_store_at(q, tk, at, a.xlay, a.xq);
        }
    }
}

/* Decode shape, split-K inside a cluster (a.cluster): the n_split blocks of a (query
 * block, head block) are one thread-block cluster, block rank sp holding split sp's
 * partial (m, l, -, -, O) of each row r in its shared memory at cpart + r * (HD + 4).
 * After a cluster barrier, warp w of rank k takes the 32-value blocks qb = k + S * w,
 * k + S * (w + NT / 32), ... of the rows (S: the cluster's blocks): lane l reads the
 * (m, l) and O value of its dim from every split in split order (distributed shared
 * memory), merges them as mma_merge_rows does, writes out and, given a.xq, the value's
 * int8 form (kern_q8_block, as mma_quantize_rows). A second barrier keeps every block's
 * shared memory alive until its peers have read it. Every thread of every block of the
 * cluster must call this. */
template <int HD, int NT>
__device__ void mma_cluster_merge(const mma_args &a, int t0, int nt, int h0, const float *cpart) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    static_assert(HD % 32 == 0, "a q8 block lies inside one head");
    cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
    const int S = (int)cl.num_blocks();
    cl.sync(); /* every split's partial is in its block's shared memory */
    MMA_TR(MMA_TR_CLSYNC);
#if TPI_ATTN_TRACE >= 2
    /* -DTPI_ATTN_TRACE=2: with one cluster a head block (no counter), the merge twice over
     * the same code, the second pass timed by the int8 points: is its cost cold code?
     * (bench/NOTES.md change 124; out and the int8 form get the same values twice) */
#pragma unroll 1
    for (int pass = 0; pass < (a.n_cl == 1 ? 2 : 1); pass++) {
        if (pass == 1) MMA_TR(MMA_TR_Q8SYNC);
#else
    {
        constexpr int pass = 0;
        (void)pass;
#endif
        /* clusters of 2, the deep calls' (several a head block), get a copy of their own;
         * a copy for every size lost at depth 1024 (bench/NOTES.md change 126) */
        if (S == 2)
            mma_cluster_rows<HD, NT, 2>(a, t0, nt, h0, cpart, 2, pass);
        else
            mma_cluster_rows<HD, NT, MMA_MAX_CLUSTER>(a, t0, nt, h0, cpart, S, pass);
    } /* the pass (one in every build but TPI_ATTN_TRACE=2's) */
    MMA_TR(MMA_TR_CLDONE);
    /* no block leaves while a peer may still read its partials: a relaxed arrival (no
     * fence: the peers' distributed loads fed the values stored above, so they have
     * landed; this block's out and int8 stores need no ordering against the peers) */
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
#else
    /* no clusters before sm_90: mma_cluster_init never sets a.cluster on such a device */
    (void)a, (void)t0, (void)nt, (void)h0, (void)cpart;
    __trap();
#endif
}

/* grid (ceil(n_rows / 4)), MMA_THREADS threads: the prefill shape's split-K merge, one
 * warp per (token, head) row: weights from the (m, l) of every split, then lane l sums
 * the O values of dims 4l.. (hd 128; hd 64: half warps take alternate splits) over the
 * splits in order, eight loads in flight. */
template <int HD>
__global__ void __launch_bounds__(MMA_THREADS)
    attn_mma_combine_kernel(const float *part, float *out, int n_rows, int n_split) {
    constexpr int PS = MMA_PART(HD), C4 = HD / 4, NH = 32 / C4; /* lanes per column set, sets */
    __shared__ float wgt[MMA_THREADS / 32][MMA_MAX_SPLIT];
    __shared__ float4 half_s[MMA_THREADS / 32][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int th = blockIdx.x * (MMA_THREADS / 32) + warp;
    if (th >= n_rows) return; /* warp-uniform; no block barrier below */
    const float *pp = part + (size_t)th * n_split * PS;
    float *w = wgt[warp];
    float mx = -INFINITY;
    for (int sp = lane; sp < n_split; sp += 32)
        mx = fmaxf(mx, __ldg(pp + (size_t)sp * PS));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float lsum = 0.0f;
    for (int sp = lane; sp < n_split; sp += 32) {
        const float2 ml = __ldg((const float2 *)(pp + (size_t)sp * PS));
        const float e = ml.x == -INFINITY ? 0.0f : exp2f(ml.x - mx);
        w[sp] = e;
        lsum += e * ml.y;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        lsum += __shfl_xor_sync(0xffffffffu, lsum, o);
    __syncwarp();
    const float inv = lsum > 0.0f ? 1.0f / lsum : 0.0f;
    const int hs = lane / C4, c4 = lane % C4;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int sp0 = hs; sp0 < n_split; sp0 += 8 * NH) {
        float4 v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int sp = sp0 + u * NH;
            v[u] = sp < n_split ? __ldg((const float4 *)(pp + (size_t)sp * PS + 4 + 4 * c4))
                                : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int sp = sp0 + u * NH;
            const float wv = sp < n_split ? w[sp] : 0.0f;
            acc.x = fmaf(v[u].x, wv, acc.x);
            acc.y = fmaf(v[u].y, wv, acc.y);
            acc.z = fmaf(v[u].z, wv, acc.z);
            acc.w = fmaf(v[u].w, wv, acc.w);
        }
    }
    if (NH > 1) { /* hd 64: the two half warps' sums, in order */
        half_s[warp][lane] = acc;
        __syncwarp();
        if (hs == 0) {
            const float4 x = half_s[warp][lane + C4];
            acc.x += x.x, acc.y += x.y, acc.z += x.z, acc.w += x.w;
        }
    }
    if (hs == 0)
        *(float4 *)(out + (size_t)th * HD + 4 * c4) =
            make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
}

/* Keys per K/V tile of a kernel of nw warps (the decode shape: 16 a warp). */
__host__ __device__ static constexpr int mma_tile_keys(bool dec, int nw) {
    return dec ? 16 * nw : MMA_TILE;
}

/* Dynamic shared memory of nst stages of K and V tiles of tk keys (head_dim hd). */
static size_t mma_smem_size(int hd, int nst, int tk) {
    return (size_t)nst * 2 * tk * (hd + 8) * sizeof(__half);
}

/* grid (query blocks of this launch, n_kv * head_chunks, n_split), 32 * NW threads (NW
 * warps: 4 for the prefill shape; 4 or 8 for decode, where a tile holds 16 * NW keys).
 * Dynamic shared memory: NSTAGE x [K tile, V tile], each mma_tile_keys x (HD + 8)
 * halves (the 16-byte pad puts the 8 rows an ldmatrix reads in 8 different bank
 * quads); the decode shape reuses it for the warp merge. */
template <int HD, bool DEC, int NSTAGE, int NW>
__global__ void __launch_bounds__(32 * NW, DEC ? 1 : 3)
    attn_mma_kernel(const __grid_constant__ mma_args a) {
    constexpr int KS = HD + 8; /* halves per shared K/V row */
    static_assert(NSTAGE >= 2, "NSTAGE - 1 tiles ahead");
    static_assert(DEC ? NW == 4 || NW == 8 : NW == 4, "decode 4 or 8 warps, prefill 4");
    constexpr int NT = 32 * NW;              /* threads */
    constexpr int TK = mma_tile_keys(DEC, NW); /* keys per tile */
    constexpr int STAGE = 2 * TK * KS;       /* halves per stage: K tile, then V tile */
    constexpr int NJ = DEC ? 1 : 4;          /* 16-key groups a warp takes per tile */
    constexpr int ND = HD / 8;               /* 8-wide dim tiles of O */
    constexpr int NK = HD / 16;              /* 16-wide k steps of Q K^T */
    constexpr int CPR = HD / 8;              /* 16-byte pieces per K/V row */
    constexpr int CP_ITERS = TK * CPR / NT;
    static_assert(TK * CPR % NT == 0, "tile copy must split evenly");
    extern __shared__ float4 mma_smem4[];
    __shared__ int red_s[NW];
    __shared__ int last_s, pbat_s;
    __shared__ int pos_s[64]; /* the block's tokens' positions as seen (-1: none) */
    __shared__ float mrg_m[NW][16], mrg_l[NW][16];

    if (DEC) MMA_TR(MMA_TR_START);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, c = lane & 3; /* fragment row group and column pair */
    const int e = a.blk[blockIdx.x];
    const int t0 = e >> 7, nt = (e & 127) + 1;
    const int hp_log2 = a.hp_log2, hp_mask = (1 << hp_log2) - 1;
    const int kvh = blockIdx.y / a.head_chunks;
    const int h0 = kvh * a.group + (blockIdx.y % a.head_chunks) * (1 << hp_log2);
    /* slots and positions are uploaded before the step (no kernel writes them) */
    const int s = a.seq[t0]; /* every token of the block has this slot (kern_attn_blocks) */
    const bool slot_ok = s >= 0 && s < a.n_slot;

    /* decode with a.qk: the block's query rows, then the k of its KV head for each batch
     * token of its slot, normalized and rotated by the warps (row i by warp i % NW) into
     * the last stage's shared memory, which no tile uses before the tile loop's first
     * barrier: q's rows at qk_s + r * HD, token t's k at qk_s + (16 + t) * HD. A warp's
     * first row's angles and norm weights are made before the PDL wait. */
    const bool qk = DEC && a.qk;
    static_assert(!DEC || (16 + MMA_MIN_PREFILL - 1) * HD * 4 <= STAGE * 2,
                  "qk_norm_rope's rows fit one stage");
    float *const qk_s = (float *)mma_smem4 + (NSTAGE - 1) * (STAGE / 2);
    const int n_qk_q = nt << hp_log2, n_qk = qk ? n_qk_q + a.n_tokens : 0;
    mma_qk_job<HD> qk_first;
    if (warp < n_qk) qk_first = mma_qk_prep<HD>(a, warp, n_qk_q, t0, h0, kvh, s, qk_s, lane);

    /* The block's largest visible position (tokens t0 .. t0+nt-1, nt <= 64 < threads)
     * and, decode, the smallest position of a batch token of its slot: positions are
     * uploaded before the step, so the key range is known before the PDL wait. */
    int pv = -1;
    if ((int)threadIdx.x < nt) {
        const int p = a.pos[t0 + threadIdx.x];
        pv = slot_ok && p >= 0 && p < a.n_ctx ? p : -1;
        pos_s[threadIdx.x] = pv;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        pv = max(pv, __shfl_xor_sync(0xffffffffu, pv, o));
    if (lane == 0) red_s[warp] = pv;
    if (DEC && warp == 0) { /* decode: n_tokens < MMA_MIN_PREFILL <= 32 */
        int pb = INT_MAX;
        if (lane < a.n_tokens && a.seq[lane] == s) {
            const int p = a.pos[lane];
            if (p >= 0 && p < a.n_ctx) pb = p;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            pb = min(pb, __shfl_xor_sync(0xffffffffu, pb, o));
        if (lane == 0) pbat_s = pb;
    }
    __syncthreads();
    int p_max = red_s[0];
#pragma unroll
    for (int w = 1; w < NW; w++)
        p_max = max(p_max, red_s[w]);
    const int p_bat = DEC ? pbat_s : INT_MAX; /* no batch row of the slot below this */

    /* this split's keys [k_begin, k_end): tile-aligned ranges of the block's n_keys */
    const int n_keys = p_max + 1;
    int chunk = (n_keys + a.n_split - 1) / a.n_split;
    chunk = (chunk + TK - 1) / TK * TK;
    const int k_begin = blockIdx.z * chunk;
    const int k_end = min(n_keys, k_begin + chunk);
    const int n_tiles = k_end > k_begin ? (k_end - k_begin + TK - 1) / TK : 0;

    const size_t row = (size_t)a.n_kv * HD; /* halves per (slot, position) */
    const size_t slot_off = (size_t)(slot_ok ? s : 0) * a.n_ctx * row + (size_t)kvh * HD;
    const __half *kb = a.kc + slot_off, *vb = a.vc + slot_off;
    const uint32_t smem0 = mma_smem_u32(mma_smem4);

    /* copy tile `it` of the range into stage `st`; rows past k_end are zero-filled so
     * that P (0 there) times V never meets a stale NaN */
    /* a thread copies piece cp_c of rows cp_j, cp_j + CP_STEP, ... of each tile */
    constexpr int CP_STEP = NT / CPR;
    const int cp_j = threadIdx.x / CPR, cp_c = threadIdx.x % CPR;
    /* this thread's first piece of the range (the decode shape's whole tiles step from
     * it by pointer adds: the general form's 64-bit index arithmetic, predicates and
     * selects were ~130 of a deep call's 433 instructions a warp a tile; bench/NOTES.md
     * change 80: level to +0.3 %, never slower) */
    const size_t first = (size_t)(k_begin + cp_j) * row + 8 * cp_c;
    const __half *kp0 = kb + first, *vp0 = vb + first;
    /* a decode call's whole tiles: each row read once a step (TPI_L2_EF: evict_first);
     * a range's last tile, which may fill with zeros, takes mma_cp16 */
    const uint64_t kv_pol = kern_stream_policy();
    auto issue = [&](int it, int st) {
        const int kt = k_begin + it * TK;
        const int nk = min(TK, k_end - kt);
        const uint32_t ks = smem0 + (uint32_t)(st * STAGE + cp_j * KS + 8 * cp_c) * 2u;
        const uint32_t vs = ks + (uint32_t)(TK * KS) * 2u;
        if (DEC && nk == TK) { /* a whole tile: every row in the range */
            const __half *kp = kp0 + (size_t)(it * TK) * row, *vp = vp0 + (size_t)(it * TK) * row;
#pragma unroll
            for (int k = 0; k < CP_ITERS; k++) {
                const uint32_t off = (uint32_t)(k * CP_STEP * KS) * 2u;
                mma_cp16_once(ks + off, kp, kv_pol);
                mma_cp16_once(vs + off, vp, kv_pol);
                kp += (size_t)CP_STEP * row;
                vp += (size_t)CP_STEP * row;
            }
            mma_commit();
            return;
        }
        const size_t src = (size_t)(kt + cp_j) * row + 8 * cp_c;
#pragma unroll
        for (int k = 0; k < CP_ITERS; k++) {
            const bool in = cp_j + k * CP_STEP < nk;
            const size_t at = in ? src + (size_t)(k * CP_STEP) * row : 0;
            const uint32_t off = (uint32_t)(k * CP_STEP * KS) * 2u;
            mma_cp16(ks + off, kb + at, in ? 16 : 0);
            mma_cp16(vs + off, vb + at, in ? 16 : 0);
        }
        mma_commit();
    };

    /* a.pre (decode calls with the store fused): the first tiles are copied before the
     * store, either before the PDL wait (1: calls under TPI_ATTN_DEC_PRE's depth, while
     * Q/K/V ends; bench/NOTES.md change 93) or right after it, behind the warps' q/k row
     * loads (2: the default for every call, change 114). The rows of earlier steps were
     * written by launches that completed before the kernel ahead of Q/K/V did (it never
     * triggers early); the batch's own rows, which the store below writes after these
     * copies, are put into each tile that holds them once it has landed, from the values
     * the store wrote (so the store needs no fence). */
    const bool pre = DEC && a.pre && a.k;
    int n_pre = 0;
    if (pre && a.pre == 1)
        for (; n_pre < NSTAGE - 1 && n_pre < n_tiles; n_pre++)
            issue(n_pre, n_pre);

    if (DEC && a.trigger == 2) kern_dep_trigger(); /* shallow: wo's prefetch from here on */
    kern_dep_wait(); /* the decode shape is launched with PDL (kern_common.cuh) */
    if (DEC) MMA_TR(MMA_TR_WAITED);
    /* decode shape: the batch's k/v for the store below, loaded first after the wait, so
     * that their round trip to L2 overlaps the q/k rows' of the norm and rope below
     * (bench/NOTES.md change 109). Item u of a thread: token it / (HD/4), dims 4
     * (it % (HD/4)) .. +3 */
    constexpr int ST_ITEMS =
        DEC ? ((MMA_MIN_PREFILL - 1) * (HD / 4) + NT - 1) / NT : 1;
    float4 st_k[ST_ITEMS], st_v[ST_ITEMS];
    int st_s[ST_ITEMS], st_p[ST_ITEMS];
    /* a.pre: the batch rows this thread stored (position, or -1) and their f16 values */
    int pt_p[ST_ITEMS];
    uint2 pt_k[ST_ITEMS], pt_v[ST_ITEMS];
#pragma unroll
    for (int u = 0; u < ST_ITEMS; u++)
        pt_p[u] = -1;
#pragma unroll
    for (int u = 0; u < ST_ITEMS; u++) {
        const int it = threadIdx.x + u * NT, t = it / (HD / 4), d4 = it % (HD / 4);
        st_s[u] = -1;
        st_p[u] = -1;
        if (DEC && a.k && t < a.n_tokens) {
            st_s[u] = a.seq[t];
            st_p[u] = a.pos[t];
            if (!qk) st_k[u] = *(const float4 *)(a.k + ((size_t)t * a.n_kv + kvh) * HD + 4 * d4);
            st_v[u] = *(const float4 *)(a.v + ((size_t)t * a.n_kv + kvh) * HD + 4 * d4);
        }
    }

    if (pre && a.pre == 2) {
        /* the warp's first row's loads ahead of the first tiles' copies, which then
         * stream while the rows are normalized and rotated (bench/NOTES.md change 114) */
        float v0[HD / 32];
        const bool on0 = warp < n_qk && qk_first.on;
        if (on0) mma_qk_load<HD>(qk_first, lane, v0);
        for (; n_pre < NSTAGE - 1 && n_pre < n_tiles; n_pre++)
            issue(n_pre, n_pre);
        if (on0) mma_qk_calc<HD>(qk_first, v0, a.n_rot, a.eps, lane);
        for (int i = warp + NW; i < n_qk; i += NW) { /* warp-uniform */
            const mma_qk_job<HD> jb = mma_qk_prep<HD>(a, i, n_qk_q, t0, h0, kvh, s, qk_s, lane);
            if (jb.on) mma_qk_row<HD>(jb, a.n_rot, a.eps, lane);
        }
    } else {
        for (int i = warp; i < n_qk; i += NW) { /* warp-uniform */
            const mma_qk_job<HD> jb =
                i == warp ? qk_first : mma_qk_prep<HD>(a, i, n_qk_q, t0, h0, kvh, s, qk_s, lane);
            if (jb.on) mma_qk_row<HD>(jb, a.n_rot, a.eps, lane);
        }
    }

    /* this lane's two rows (fragment rows g and g + 8 of the warp's 16): (token, head)
     * index, -1 past the block; the Q loads go out before anything waits on positions */
    int th[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = (DEC ? 0 : 16 * warp) + g + 8 * i;
        const int tl = r >> hp_log2;
        th[i] = tl < nt ? (t0 + tl) * a.n_head + h0 + (r & hp_mask) : -1;
    }
    /* Q as f16 A fragments, scaled by scale * log2(e): for k step kk, registers
     * {row g, k 2c..2c+1}, {row g+8, ...}, {row g, k 2c+8..}, {row g+8, k 2c+8..}; from
     * a.q, or (qk) from qk_s after the barrier below */
    uint32_t qf[NK][4];
    auto load_q = [&]() {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const float *qr = qk ? qk_s + (g + 8 * i) * HD
                                 : a.q + (size_t)(th[i] >= 0 ? th[i] : 0) * HD;
#pragma unroll
            for (int kk = 0; kk < NK; kk++) {
                float2 x0 = make_float2(0.0f, 0.0f), x1 = x0;
                if (th[i] >= 0) {
                    x0 = *(const float2 *)(qr + 16 * kk + 2 * c);
                    x1 = *(const float2 *)(qr + 16 * kk + 8 + 2 * c);
                }
                qf[kk][i] = mma_pack(__floats2half2_rn(x0.x * a.qscale, x0.y * a.qscale));
                qf[kk][2 + i] = mma_pack(__floats2half2_rn(x1.x * a.qscale, x1.y * a.qscale));
            }
        }
    };
    if (!qk) load_q();

    /* the rows' positions (-1: sees nothing, written as zeros) and the warp's range */
    int prow[2];
    int wmax = -1, wmin = INT_MAX;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        prow[i] = -1;
        if (th[i] >= 0) {
            const int tl = ((DEC ? 0 : 16 * warp) + g + 8 * i) >> hp_log2;
            prow[i] = pos_s[tl]; /* read before the wait: no round trip to L2 here */
            wmax = max(wmax, prow[i]);
            wmin = min(wmin, prow[i]);
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        wmax = max(wmax, __shfl_xor_sync(0xffffffffu, wmax, o));
        wmin = min(wmin, __shfl_xor_sync(0xffffffffu, wmin, o));
    }
    __syncthreads();
    if (qk) { /* the rows are in qk_s (the barrier above) */
        load_q();
#pragma unroll
        for (int u = 0; u < ST_ITEMS; u++) {
            const int it = threadIdx.x + u * NT, t = it / (HD / 4), d4 = it % (HD / 4);
            if (t < a.n_tokens) st_k[u] = *(const float4 *)(qk_s + (16 + t) * HD + 4 * d4);
        }
    }
    if (DEC) {
        MMA_TR(MMA_TR_PROLOG);
        MMA_TR_V(MMA_TR_TILES, (unsigned long long)n_tiles);
    }

    if (DEC && a.k) {
        /* The store, fused: this block writes the k/v (its KV head) of every batch token of
         * its slot whose position lies in its key range, then reads them back with the
         * rest. Every valid token is covered by its own block's range; a position written
         * by several blocks (other head chunks or query blocks of the slot) gets the same
         * bytes from each, and no block reads a batch position it has not written itself,
         * so any slot pattern is safe, also when a graph replays other slots. With pre the
         * tiles were asked for before the store: the loop puts these rows into them (pt_*). */
        bool wrote = false;
#pragma unroll
        for (int u = 0; u < ST_ITEMS; u++) {
            const int p = st_p[u];
            if (slot_ok && st_s[u] == s && p >= k_begin && p < k_end) {
                const int d4 = (threadIdx.x + u * NT) % (HD / 4);
                const size_t at = ((size_t)s * a.n_ctx + p) * row + (size_t)kvh * HD + 4 * d4;
                const __half2 k01 = __floats2half2_rn(st_k[u].x, st_k[u].y);
                const __half2 k23 = __floats2half2_rn(st_k[u].z, st_k[u].w);
                const __half2 v01 = __floats2half2_rn(st_v[u].x, st_v[u].y);
                const __half2 v23 = __floats2half2_rn(st_v[u].z, st_v[u].w);
                pt_k[u] = make_uint2(mma_pack(k01), mma_pack(k23));
                pt_v[u] = make_uint2(mma_pack(v01), mma_pack(v23));
                pt_p[u] = p;
                *(uint2 *)(a.kc + at) = pt_k[u];
                *(uint2 *)(a.vc + at) = pt_v[u];
                wrote = true;
            }
        }
        if (wrote && !pre) __threadfence(); /* in L2, where the block's cp.async reads them */
        __syncthreads();
        MMA_TR(MMA_TR_STORED);
    }
    float o[ND][4];
#pragma unroll
    for (int d = 0; d < ND; d++)
        o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; /* l: this lane's columns */

    /* ldmatrix row addresses of this lane: K (non-transposed) gives B fragments of two
     * 8-key n tiles x one 16-dim k step; V (transposed) gives B fragments of one 16-key
     * k step x two 8-dim n tiles */
    const int q8 = lane >> 3, r8 = lane & 7;
    const int kw = DEC ? 16 * warp : 0; /* the warp's first key inside a tile */
    const uint32_t k_lane = (uint32_t)((kw + r8 + 8 * (q8 >> 1)) * KS + 8 * (q8 & 1)) * 2u;
    const uint32_t v_lane = (uint32_t)((kw + r8 + 8 * (q8 & 1)) * KS + 8 * (q8 >> 1)) * 2u;

#pragma unroll
    for (int st = 0; st < NSTAGE - 1; st++) {
        if (st < n_pre) continue; /* copied before the wait */
        if (st < n_tiles)
            issue(st, st);
        else
            mma_commit(); /* empty group: keeps the wait count uniform */
    }
    for (int it = 0; it < n_tiles; it++) {
        mma_wait<NSTAGE - 2>(); /* this thread's copies of tile `it` have landed */
        __syncthreads();        /* everyone's have; and tile it-1's stage is free */
        if (DEC && it == 0) MMA_TR(MMA_TR_TILE0);
        {
            const int nx = it + NSTAGE - 1;
            if (nx < n_tiles)
                issue(nx, nx % NSTAGE);
            else
                mma_commit();
        }
        const int kt = k_begin + it * TK;
        const int nk = min(TK, k_end - kt);
        if (pre && kt + nk > p_bat) { /* block-uniform: the tile holds batch rows */
            __half *const st_h = (__half *)mma_smem4 + (it % NSTAGE) * STAGE;
#pragma unroll
            for (int u = 0; u < ST_ITEMS; u++) {
                const int p = pt_p[u];
                if (p >= kt && p < kt + nk) {
                    const int d4 = (threadIdx.x + u * NT) % (HD / 4);
                    *(uint2 *)(st_h + (p - kt) * KS + 4 * d4) = pt_k[u];
                    *(uint2 *)(st_h + TK * KS + (p - kt) * KS + 4 * d4) = pt_v[u];
                }
            }
            __syncthreads();
        }
        if (kt + kw > wmax || kw >= nk) continue; /* warp-uniform: nothing visible here */
        const uint32_t ks = smem0 + (uint32_t)((it % NSTAGE) * STAGE) * 2u;
        const uint32_t vs = ks + (uint32_t)(TK * KS) * 2u;

        /* S = Q K^T for the warp's 16 x 16*NJ block */
        float sc[2 * NJ][4];
#pragma unroll
        for (int j = 0; j < 2 * NJ; j++)
            sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < NK; kk++)
#pragma unroll
            for (int jp = 0; jp < NJ; jp++) {
                uint32_t b[4];
                mma_ldsm4(b, ks + k_lane + (uint32_t)(16 * jp * KS + 16 * kk) * 2u);
                mma_16816(sc[2 * jp], qf[kk], b[0], b[1]);
                mma_16816(sc[2 * jp + 1], qf[kk], b[2], b[3]);
            }

        /* causal mask (and the range end), only where some key may be hidden */
        if (kw + 16 * NJ > nk || kt + kw + 16 * NJ - 1 > wmin) {
#pragma unroll
            for (int j = 0; j < 2 * NJ; j++)
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const int key = kt + kw + 8 * j + 2 * c + (q & 1);
                    if (key >= k_end || key > prow[q >> 1]) sc[j][q] = -INFINITY;
                }
        }

        /* online softmax, base 2; rows g (q = 0, 1) and g + 8 (q = 2, 3) */
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int j = 0; j < 2 * NJ; j++) {
            mx[0] = fmaxf(mx[0], fmaxf(sc[j][0], sc[j][1]));
            mx[1] = fmaxf(mx[1], fmaxf(sc[j][2], sc[j][3]));
        }
        float mu[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
            mu[i] = mx[i] == -INFINITY ? 0.0f : mx[i]; /* nothing visible yet: no inf - inf */
            const float corr = exp2f(m[i] - mu[i]);    /* 0 while m is -inf */
            m[i] = mx[i];
            l[i] *= corr;
#pragma unroll
            for (int d = 0; d < ND; d++) {
                o[d][2 * i] *= corr;
                o[d][2 * i + 1] *= corr;
            }
        }
        /* P in f16 as A fragments of the P V product (k = keys): for 16-key group jp,
         * {row g, keys 2c..} = S tile 2jp c0c1, {row g+8} = c2c3, then tile 2jp+1. The row
         * sum adds the rounded values, so the weights of a row sum to 1 exactly as used. */
        uint32_t pa[NJ][4];
#pragma unroll
        for (int jp = 0; jp < NJ; jp++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const float *sj = sc[2 * jp + h];
                const __half2 p01 = __floats2half2_rn(exp2f(sj[0] - mu[0]), exp2f(sj[1] - mu[0]));
                const __half2 p23 = __floats2half2_rn(exp2f(sj[2] - mu[1]), exp2f(sj[3] - mu[1]));
                const float2 f01 = __half22float2(p01), f23 = __half22float2(p23);
                l[0] += f01.x + f01.y;
                l[1] += f23.x + f23.y;
                pa[jp][2 * h] = mma_pack(p01);
                pa[jp][2 * h + 1] = mma_pack(p23);
            }

            /* O += P V */
#pragma unroll
        for (int jp = 0; jp < NJ; jp++)
#pragma unroll
            for (int dp = 0; dp < HD / 16; dp++) {
                uint32_t b[4];
                mma_ldsm4_t(b, vs + v_lane + (uint32_t)(16 * jp * KS + 16 * dp) * 2u);
                mma_16816(o[2 * dp], pa[jp], b[0], b[1]);
                mma_16816(o[2 * dp + 1], pa[jp], b[2], b[3]);
            }
    }
    mma_wait<0>(); /* only empty groups can be pending; the smem is reused below */
    if (DEC) MMA_TR(MMA_TR_LOOP);
    if (DEC && a.trigger == 1) kern_dep_trigger(); /* the merges and int8 form are left */
#pragma unroll
    for (int i = 0; i < 2; i++) { /* the row sums over the quad's columns */
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }

    if (!DEC) {
        /* each warp writes its own rows: the result, or this split's partial */
#pragma unroll
        for (int i = 0; i < 2; i++) {
            if (th[i] < 0) continue;
            if (a.n_split == 1) {
                const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
                float *dst = a.out + (size_t)th[i] * HD;
#pragma unroll
                for (int d = 0; d < ND; d++)
                    *(float2 *)(dst + 8 * d + 2 * c) =
                        make_float2(o[d][2 * i] * inv, o[d][2 * i + 1] * inv);
            } else {
                float *pp = a.part + ((size_t)th[i] * a.n_split + blockIdx.z) * MMA_PART(HD);
                if (c == 0) pp[0] = m[i], pp[1] = l[i];
#pragma unroll
                for (int d = 0; d < ND; d++)
                    *(float2 *)(pp + 4 + 8 * d + 2 * c) = make_float2(o[d][2 * i], o[d][2 * i + 1]);
            }
        }
    } else {
        /* merge the NW warps' states of the same 16 rows, warps in order */
        constexpr int OS = HD + 4;      /* f32 per merge row */
        float *mo = (float *)mma_smem4; /* [warp][16][OS] */
        /* a cluster's split partial: [16][OS] after the warps' states */
        float *cpart = a.cluster ? mo + NW * 16 * OS : NULL;
        __syncthreads();                /* every warp is done with the K/V stages */
        /* only the block's real rows (nt tokens x hp heads): a decode step's 4 of 16 */
        const int n_real = nt << a.hp_log2;
        if (g < n_real) {
            if (c == 0) mrg_m[warp][g] = m[0], mrg_l[warp][g] = l[0];
#pragma unroll
            for (int d = 0; d < ND; d++)
                *(float2 *)(mo + (warp * 16 + g) * OS + 8 * d + 2 * c) =
                    make_float2(o[d][0], o[d][1]);
        }
        if (g + 8 < n_real) {
            if (c == 0) mrg_m[warp][g + 8] = m[1], mrg_l[warp][g + 8] = l[1];
#pragma unroll
            for (int d = 0; d < ND; d++)
                *(float2 *)(mo + (warp * 16 + g + 8) * OS + 8 * d + 2 * c) =
                    make_float2(o[d][2], o[d][3]);
        }
        __syncthreads();
        /* NT / 16 threads per row, 2 dims each per step */
        constexpr int TPR = NT / 16;
        const int r = threadIdx.x / TPR, sub = threadIdx.x % TPR;
        const int tl = r >> hp_log2;
        if (tl < nt) {
            const size_t thr = (size_t)(t0 + tl) * a.n_head + h0 + (r & hp_mask);
            float mw = -INFINITY;
#pragma unroll
            for (int w = 0; w < NW; w++)
                mw = fmaxf(mw, mrg_m[w][r]);
            float wt[NW], lt = 0.0f;
#pragma unroll
            for (int w = 0; w < NW; w++) {
                wt[w] = mrg_m[w][r] == -INFINITY ? 0.0f : exp2f(mrg_m[w][r] - mw);
                lt += wt[w] * mrg_l[w][r];
            }
            const float inv = lt > 0.0f ? 1.0f / lt : 0.0f;
            float *pp = cpart ? cpart + r * OS
                        : a.n_split > 1 ? a.part + (thr * a.n_split + blockIdx.z) * MMA_PART(HD)
                                        : NULL;
            if (pp && sub == 0) pp[0] = mw, pp[1] = lt;
            for (int d = 2 * sub; d < HD; d += 2 * TPR) {
                float2 acc = make_float2(0.0f, 0.0f);
#pragma unroll
                for (int w = 0; w < NW; w++) {
                    const float2 x = *(const float2 *)(mo + (w * 16 + r) * OS + d);
                    acc.x = fmaf(x.x, wt[w], acc.x);
                    acc.y = fmaf(x.y, wt[w], acc.y);
                }
                if (pp)
                    *(float2 *)(pp + 4 + d) = acc;
                else
                    *(float2 *)(a.out + thr * HD + d) = make_float2(acc.x * inv, acc.y * inv);
            }
        }
    }
    if (!DEC) return; /* the prefill shape's split-K merges in attn_mma_combine_kernel */
    MMA_TR(MMA_TR_WMERGE);
    if (a.cluster) {
        mma_cluster_merge<HD, NT>(a, t0, nt, h0, (const float *)mma_smem4 + NW * 16 * (HD + 4));
        MMA_TR(MMA_TR_MERGED);
        MMA_TR(MMA_TR_END);
        return;
    }

    if (a.n_split > 1) {
        /* split-K, decode shape: the last block of this (query block, head block) to
         * arrive merges all splits of its <= 16 rows (threadfence reduction: partials
         * visible before the count; read back from L2) */
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) {
            const unsigned gid = blockIdx.y * gridDim.x + blockIdx.x;
            const unsigned prev = atomicAdd(&mma_arrivals[gid], 1u);
            last_s = prev == (unsigned)a.n_split - 1;
            if (last_s) mma_arrivals[gid] = 0; /* every split is in: ready for the next launch */
        }
        __syncthreads();
        if (!last_s) { /* block-uniform (shared) */
            MMA_TR(MMA_TR_END);
            return;
        }
        __threadfence();
        mma_merge_rows<HD, NT>(a, t0, nt, h0, (float *)mma_smem4, NSTAGE * STAGE / 2);
    }
    MMA_TR(MMA_TR_MERGED);
    /* This block has written the final rows of its (tokens, head group) to out (the warp
     * merge above, or the split merge): their int8 form for the next matmul. The barrier
     * makes every thread's out stores visible to the whole block. */
    if (a.xq) {
        __syncthreads();
        MMA_TR(MMA_TR_Q8SYNC);
        mma_quantize_rows<HD, NT>(a, t0, nt, h0);
    }
    MMA_TR(MMA_TR_END);
}

/* ---------------------------------------------------------------- launchers */

extern "C" int kern_attn_blocks(const int32_t *seq, int n_tokens, int per_block, int *t,
                                int32_t *blk, int cap) {
    int n = 0, i = *t;
    while (i < n_tokens && (!blk || n < cap)) {
        int j = i + 1;
        while (j < n_tokens && seq[j] == seq[i] && j - i < per_block)
            j++;
        if (blk) blk[n] = (int32_t)(((uint32_t)i << 7) | (uint32_t)(j - i - 1));
        n++;
        i = j;
    }
    *t = i;
    return n;
}

/* The trace build's times of the last decode call (blocks that started within 50 us of
 * the latest start), per point the blocks' min, median and max in us from the earliest
 * start, on stderr; nothing in other builds. */
void kern_attn_trace_dump(void) {
#if TPI_ATTN_TRACE
    static unsigned long long h[MMA_TR_BLOCKS * MMA_TR_N], col[MMA_TR_BLOCKS];
    if (cudaDeviceSynchronize() != cudaSuccess ||
        cudaMemcpyFromSymbol(h, mma_trace, sizeof h) != cudaSuccess)
        return;
    unsigned long long last = 0, ref = ~0ull;
    for (int b = 0; b < MMA_TR_BLOCKS; b++)
        last = TPI_MAX(last, h[b * MMA_TR_N + MMA_TR_START]);
    int nb = 0;
    for (int b = 0; b < MMA_TR_BLOCKS; b++) {
        const unsigned long long t = h[b * MMA_TR_N + MMA_TR_START];
        if (t && t + MMA_TR_WINDOW_NS >= last) ref = TPI_MIN(ref, t), nb++;
    }
    if (!nb) return;
    static const char *const names[] = {"start", "PDL wait done", "prologue", "k/v stored",
                                        "first tile", "last tile done", "warps merged",
                                        "splits merged", "int8: barrier", "int8: 1st value",
                                        "end", "cluster: synced", "cluster: loaded",
                                        "cluster: written", "tiles (count)"};
    fprintf(stderr, "decode attention trace (last call: %d blocks; us from the first start, "
                    "%llu ns on the global timer: min median max)\n", nb, ref);
    for (int k = 0; k <= MMA_TR_TILES; k++) {
        int n = 0;
        for (int b = 0; b < MMA_TR_BLOCKS; b++) {
            const unsigned long long t0 = h[b * MMA_TR_N + MMA_TR_START], v = h[b * MMA_TR_N + k];
            if (t0 && t0 + MMA_TR_WINDOW_NS >= last && (v || k == MMA_TR_TILES)) col[n++] = v;
        }
        if (!n) continue;
        qsort(col, (size_t)n, sizeof col[0], kern_cmp_u64);
        const double sub = k == MMA_TR_TILES ? 0.0 : (double)ref, div = k == MMA_TR_TILES ? 1.0 : 1e3;
        fprintf(stderr, "  %-16s %9.2f %9.2f %9.2f  (%d)\n", names[k], ((double)col[0] - sub) / div,
                ((double)col[n / 2] - sub) / div, ((double)col[n - 1] - sub) / div, n);
    }
#endif
}

extern "C" int ops_cuda_set_attn_mma(int mode) {
    const int prev = g_mma_mode;
    if (mode >= 0 && mode <= 3) g_mma_mode = mode;
    return prev;
}

template <int HD, bool DEC, int NST, int NW> static size_t mma_smem_bytes() {
    return mma_smem_size(HD, NST, mma_tile_keys(DEC, NW));
}

template <int HD, bool DEC, int NST, int NW> static bool mma_set_smem(struct ops_ctx *ctx) {
    const size_t n = mma_smem_bytes<HD, DEC, NST, NW>();
    if (n > ctx->smem_optin) return true; /* not used on this device (launch checks too) */
    return CUDA_OK(ctx, "cuda init (attention)",
                   cudaFuncSetAttribute(attn_mma_kernel<HD, DEC, NST, NW>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)n));
}

/* The decode kernels' slot in ctx->attn_cluster / attn_cl_fit: head_dim x (4 warps at 3
 * stages, 4 at 5, 8 at 3). */
static int mma_dec_slot(int hd, int nst, int nw) {
    return (hd == 128 ? 3 : 0) + (nw == 8 ? 2 : nst == 5 ? 1 : 0);
}

/* ctx->attn_cluster[slot]: the largest cluster of decode blocks (HD, NST) this device
 * schedules, at most g_dec_cluster (0: no clusters: the knob, a device without cluster
 * launch, or not even 2 blocks), and ctx->attn_cl_fit[slot][c]: how many clusters of c
 * blocks the occupancy query says are resident at once (a GPC holds whole clusters
 * only). Sizes above 8 need the non-portable attribute. With TPI_ATTN_DEC_VERBOSE set the
 * table goes to stderr. Returns false only on a CUDA error of the attribute call. */
template <int HD, int NST, int NW> static bool mma_cluster_init(struct ops_ctx *ctx) {
    const int slot = mma_dec_slot(HD, NST, NW);
    ctx->attn_cluster[slot] = 0;
    memset(ctx->attn_cl_fit[slot], 0, sizeof ctx->attn_cl_fit[slot]);
    const size_t smem = mma_smem_bytes<HD, true, NST, NW>();
    int ok = 0;
    if (g_dec_cluster < 2 || smem > ctx->smem_optin ||
        cudaDeviceGetAttribute(&ok, cudaDevAttrClusterLaunch, ctx->device) != cudaSuccess || !ok) {
        (void)cudaGetLastError();
        return true;
    }
    auto kern = attn_mma_kernel<HD, true, NST, NW>;
    if (g_dec_cluster > 8 &&
        !CUDA_OK(ctx, "cuda init (attention clusters)",
                 cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1)))
        return false;
    for (int c = g_dec_cluster; c >= 2; c--) {
        cudaLaunchConfig_t lc = {};
        lc.gridDim = dim3(1, 1, (unsigned)c);
        lc.blockDim = dim3(32 * NW);
        lc.dynamicSmemBytes = smem;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = 1;
        at[0].val.clusterDim.y = 1;
        at[0].val.clusterDim.z = (unsigned)c;
        lc.attrs = at;
        lc.numAttrs = 1;
        int n = 0;
        if (cudaOccupancyMaxActiveClusters(&n, kern, &lc) == cudaSuccess && n >= 1) {
            if (!ctx->attn_cluster[slot]) ctx->attn_cluster[slot] = c;
            ctx->attn_cl_fit[slot][c] = n;
        }
        (void)cudaGetLastError();
    }
    const char *vb = getenv("TPI_ATTN_DEC_VERBOSE");
    if (vb && *vb) {
        fprintf(stderr, "attention decode hd %d stages %d warps %d: clusters resident by size:",
                HD, NST, NW);
        for (int c = 2; c <= g_dec_cluster; c++)
            fprintf(stderr, " %d:%d", c, ctx->attn_cl_fit[slot][c]);
        fprintf(stderr, "\n");
    }
    return true;
}

bool kern_attention_mma_init(struct ops_ctx *ctx) {
    /* TPI_ATTN_MMA: 0 off, 1 or unset: on, "prefill" / "decode": that shape only */
    const char *v = getenv("TPI_ATTN_MMA");
    if (v && *v) {
        if (strcmp(v, "prefill") == 0)
            g_mma_mode = 1;
        else if (strcmp(v, "decode") == 0)
            g_mma_mode = 2;
        else
            g_mma_mode = strcmp(v, "0") == 0 ? 0 : 3;
    }
    const char *bps = getenv("TPI_ATTN_DEC_BPS");
    if (bps && *bps) g_dec_bps = TPI_MAX(1, TPI_MIN(atoi(bps), 16));
    const char *nst = getenv("TPI_ATTN_DEC_STAGES");
    if (nst && *nst) g_dec_stages = atoi(nst) == 5 ? 5 : 3;
    const char *spl = getenv("TPI_ATTN_DEC_SPLIT");
    if (spl && *spl) g_dec_split = TPI_MAX(0, TPI_MIN(atoi(spl), MMA_MAX_SPLIT));
    const char *nw = getenv("TPI_ATTN_DEC_WARPS");
    if (nw && *nw) g_dec_warps = atoi(nw) == 8 ? 8 : 4;
    const char *ncl = getenv("TPI_ATTN_DEC_CLUSTERS");
    if (ncl && *ncl) g_dec_ncl = TPI_MAX(1, TPI_MIN(atoi(ncl), MMA_MAX_NCL));
    const char *pre = getenv("TPI_ATTN_DEC_PRE");
    if (pre && *pre) g_dec_pre = TPI_MAX(0, atoi(pre));
    const char *prew = getenv("TPI_ATTN_DEC_PREW");
    if (prew && *prew) g_dec_prew = atoi(prew) != 0;
    const char *q8b = getenv("TPI_ATTN_DEC_Q8B");
    if (q8b && *q8b) g_dec_q8b = atoi(q8b) != 0;
    const char *cls = getenv("TPI_ATTN_DEC_CLUSTER");
    if (cls && *cls) {
        const int n = atoi(cls);
        g_dec_cluster = n < 2 ? 0 : TPI_MIN(n, MMA_MAX_CLUSTER);
    }
    return mma_set_smem<64, false, 2, 4>(ctx) && mma_set_smem<64, true, 3, 4>(ctx) &&
           mma_set_smem<64, true, 5, 4>(ctx) && mma_set_smem<64, true, 3, 8>(ctx) &&
           mma_set_smem<128, false, 2, 4>(ctx) && mma_set_smem<128, true, 3, 4>(ctx) &&
           mma_set_smem<128, true, 5, 4>(ctx) && mma_set_smem<128, true, 3, 8>(ctx) &&
           mma_cluster_init<64, 3, 4>(ctx) && mma_cluster_init<64, 5, 4>(ctx) &&
           mma_cluster_init<64, 3, 8>(ctx) && mma_cluster_init<128, 3, 4>(ctx) &&
           mma_cluster_init<128, 5, 4>(ctx) && mma_cluster_init<128, 3, 8>(ctx);
}

/* Decode clusters: n_cl clusters of cs ranges each, the (cs, n_cl) with the most ranges
 * (at most n_split) whose base * n_cl clusters are resident at once, fewer clusters
 * first; several clusters (a counter per 32-value piece of the rows: MMA_COUNTERS, the
 * caller's ncl_max) only where that takes at least MMA_NCL_TILES tiles off each block's
 * range against one cluster (the global merge costs ~2 tiles' time) and each warp of a
 * cluster merges at most one piece (a 4-token block's 64 pieces made a call at depth
 * 8192 26.8 us against one cluster's 19.1: bench/NOTES.md change 49). Nothing resident
 * in one wave: one cluster of n_split, capped at cmax. */
extern "C" int kern_attn_dec_plan(const int *fit, int cmax, int ncl_max, long base, int n_split,
                                  long max_pos, int tk, long blk_pieces, int nw, int *n_cl) {
    auto tiles = [&](long n) { return ((max_pos + n - 1) / n + tk - 1) / tk; };
    int best_cs = 0, best_ncl = 1;
    long one_tiles = tiles(1); /* a block's tiles with the best single cluster */
    cmax = TPI_MIN(cmax, MMA_MAX_CLUSTER);
    ncl_max = TPI_MAX(1, TPI_MIN(ncl_max, MMA_MAX_NCL));
    for (int ncl = 1; ncl <= ncl_max; ncl++)
        for (int cs = 2; cs <= cmax && cs * ncl <= n_split; cs++)
            if (base * ncl <= fit[cs] && cs * ncl > best_cs * best_ncl &&
                (ncl == 1 || (one_tiles - tiles(cs * ncl) >= MMA_NCL_TILES &&
                              blk_pieces <= (long)cs * nw))) {
                best_cs = cs, best_ncl = ncl;
                if (ncl == 1) one_tiles = tiles(cs);
            }
    *n_cl = best_cs ? best_ncl : 1;
    return best_cs ? best_cs * best_ncl : TPI_MIN(n_split, cmax);
}

template <int HD, bool DEC, int NST, int NW>
static void mma_launch(struct ops_ctx *ctx, mma_args *a, const struct ops_batch *b, int tpb,
                       int max_pos) {
    const char *op = "cuda attention (mma)";
    const int n_tokens = b->n_tokens;
    constexpr int TK = mma_tile_keys(DEC, NW);
    const size_t smem = mma_smem_bytes<HD, DEC, NST, NW>();
    if (smem > ctx->smem_optin) { /* checked by the caller; a device with less opts out */
        kern_fail(ctx, TPI_ERR_INVALID, op, __FILE__, __LINE__, "%zu bytes of shared memory", smem);
        return;
    }
    /* split-K: blocks of the plain grid against what the GPU holds at once */
    int t = 0;
    const long n_qblocks = kern_attn_blocks(b->seq_host, n_tokens, tpb, &t, NULL, 0);
    const long base = n_qblocks * a->n_kv * a->head_chunks;
    long per_sm = (long)(ctx->smem_optin + 1024) / (long)(smem + 4096);
    per_sm = TPI_MAX(1L, TPI_MIN(per_sm, 4L));
    if (DEC) per_sm = g_dec_bps;
    const long want = per_sm * ctx->n_sm;
    int n_split = 1;
    /* decode: split whenever the grid is short of a full wave, ranges of >= 1 tile;
     * prefill: only when it is short of one block per multiprocessor, ranges of >= 8
     * tiles (a 64-row partial is 1/8 of the K/V bytes its range reads) */
    const long min_keys = DEC ? TK : 8 * TK;
    /* decode: the cluster size this kernel may take (0: ranges merged through global memory) */
    const int slot = mma_dec_slot(HD, NST, NW);
    const int cmax = DEC ? ctx->attn_cluster[slot] : 0;
    if (base <= MMA_COUNTERS && (DEC ? base < want : base < ctx->n_sm)) {
        long by_grid = DEC && g_dec_split > 0 ? g_dec_split : (want + base - 1) / base;
        if (cmax >= 2) by_grid = TPI_MIN(by_grid, (long)cmax * g_dec_ncl);
        const long by_keys = TPI_MAX(1L, max_pos / min_keys);
        long n = TPI_MIN(TPI_MIN(by_grid, by_keys), (long)MMA_MAX_SPLIT);
        if (n > 1) { /* drop ranges the tile rounding would leave empty */
            long chunk = (max_pos + n - 1) / n;
            chunk = (chunk + TK - 1) / TK * TK;
            n = (max_pos + chunk - 1) / chunk;
        }
        n_split = (int)TPI_MAX(1L, n);
    }
    /* decode clusters: the ranges of a head block as n_cl clusters (kern_attn_dec_plan) */
    a->cluster = 0;
    a->n_cl = 1;
    if (DEC && n_split > 1 && cmax >= 2) {
        const long pieces = (long)n_tokens * a->n_head * (HD / 32);
        /* the most pieces of a block: its largest run of tokens, times hp rows, HD / 32 */
        const long blk_pieces =
            (TPI_MIN((long)tpb, (long)n_tokens - n_qblocks + 1) << a->hp_log2) * (HD / 32);
        n_split = kern_attn_dec_plan(ctx->attn_cl_fit[slot], cmax,
                                     pieces <= MMA_COUNTERS ? g_dec_ncl : 1, base, n_split,
                                     max_pos, TK, blk_pieces, NW, &a->n_cl);
        a->cluster = 1;
    }
    a->n_split = n_split;
    a->part = NULL;
    if (a->n_cl > 1) {
        a->part = (float *)kern_scratch_get(ctx, &ctx->attn,
                                            (size_t)n_tokens * a->n_head * (HD / 32) * a->n_cl *
                                                MMA_PIECE * sizeof(float),
                                            op);
        if (!a->part) return;
    }
    if (n_split > 1 && !a->cluster) {
        a->part = (float *)kern_scratch_get(
            ctx, &ctx->attn, (size_t)n_tokens * a->n_head * n_split * MMA_PART(HD) * sizeof(float),
            op);
        if (!a->part) return;
    }
    /* decode rows of the matrix-vector size: the kernel also writes out's int8 form for the
     * next matmul when the memo takes it from this producer (claimed right before the
     * launch; the block that writes a row's final values quantizes it) */
    const int64_t ne0 = (int64_t)a->n_head * HD;
    a->xq = NULL;
    a->ds = NULL;
    const bool q8 =
        DEC && n_tokens <= 8 && kern_xq_claim(ctx, XQ_BY_ATTN, n_tokens, ne0, &a->xq, &a->ds);
    a->xlay = gv_xlayout_of(n_tokens, ne0);
    if (DEC && (ctx->diag_skip & DIAG_SKIP_ATTN) && q8) { /* measuring only: out not written */
        kern_xq_remember(ctx, a->out, (int64_t)n_tokens * ne0);
        return;
    }
    /* the next v3 launch (wo) asks L2 for its weights while this call still runs: from
     * its start where the K/V stream is short (DRAM is idle through the call), after the
     * stream where it is long (the merges leave DRAM idle, the stream does not); the
     * depth is a power of two, so one recorded graph's positions make one choice; only
     * while the last wo's kernel gains from it (ctx->wo_early, gv_early_gains) */
    a->pre = !DEC || !a->k ? 0 : max_pos < g_dec_pre ? 1 : g_dec_prew ? 2 : 0;
    a->trigger = !DEC || !ctx->pdl || ctx->wo_prefetch <= 0 || !ctx->wo_early ? 0
                 : max_pos >= ctx->wo_prefetch                                ? 1
                                                                              : 2;
    t = 0;
    while (t < n_tokens) {
        const int nb = kern_attn_blocks(b->seq_host, n_tokens, tpb, &t, a->blk, MMA_MAX_BLOCKS);
        const dim3 grid((unsigned)nb, (unsigned)(a->n_kv * a->head_chunks), (unsigned)n_split);
        /* clusters: n_cl per (query block, head block), n_split / n_cl ranges each */
        kern_launch_cl(DEC && ctx->pdl, a->cluster ? (unsigned)(n_split / a->n_cl) : 1u,
                       attn_mma_kernel<HD, DEC, NST, NW>, grid, dim3(32 * NW), smem, ctx->stream,
                       *a);
        if (!LAUNCH_OK(ctx, op)) return;
    }
    if (q8) kern_xq_remember(ctx, a->out, (int64_t)n_tokens * ne0);
    ctx->gemv_prefetch = a->trigger;
    ctx->after_attn = DEC;
    if (!DEC && n_split > 1) {
        const int n_rows = n_tokens * a->n_head;
        attn_mma_combine_kernel<HD><<<(unsigned)((n_rows + 3) / 4), MMA_THREADS, 0, ctx->stream>>>(
            a->part, a->out, n_rows, n_split);
        LAUNCH_OK(ctx, op);
    }
}

bool kern_attention_mma(struct ops_ctx *ctx, const struct ops_kv *kv, __half *kc, __half *vc,
                        const float *q, const float *k, const float *v, float *out,
                        const struct ops_batch *b, int n_head, float scale, int max_pos,
                        const struct kern_qk *qk) {
    const int n_tokens = b->n_tokens, n_kv = kv->n_kv_head, hd = kv->head_dim;
    const bool dec = n_tokens < MMA_MIN_PREFILL;
    if (!(g_mma_mode & (dec ? 2 : 1))) return false;
    if ((hd != 64 && hd != 128) || n_head % n_kv != 0 || n_tokens >= (1 << 24) ||
        (long)n_tokens * n_head > INT_MAX)
        return false;
    /* 16-byte copies: every row offset is a multiple of hd halves, so the bases decide */
    if (((uintptr_t)kc & 15) || ((uintptr_t)vc & 15)) return false;
    /* decode: 8 warps (128-key tiles) at 3 stages, or 4 (64-key tiles) at g_dec_stages */
    const int nw = dec ? g_dec_warps : 4;
    const int nst = !dec ? 2 : nw == 8 ? 3 : g_dec_stages;
    if (mma_smem_size(hd, nst, mma_tile_keys(dec, nw)) > ctx->smem_optin) return false;

    /* the prefill shape reads k/v stored by the store kernel; the decode kernel stores
     * them itself (one launch less per decode step; k, v 16-byte aligned for its loads) */
    const bool fuse = dec && ((uintptr_t)k & 15) == 0 && ((uintptr_t)v & 15) == 0;
    /* qk_norm_rope: inside the decode kernel (each rotated pair in one lane: n_rot % 64 ==
     * 0; the frequency table made), else its own kernel first (bench/NOTES.md change 84) */
    const int n_rot = qk ? qk->rope.n_rot : 0;
    const double *tab = qk && fuse && ctx->qk_attn && n_rot > 0 && n_rot % 64 == 0 && n_rot <= hd
                            ? kern_rope_inv_table(ctx, &qk->rope)
                            : NULL;
    if (qk && !tab)
        kern_qk_norm_rope(ctx, (float *)q, (float *)k, qk->q_norm, qk->k_norm, b, n_head, n_kv, hd,
                          &qk->rope, qk->eps);
    if (!fuse && !kern_attn_store(ctx, kv, kc, vc, k, v, b)) return true;
    mma_args a;
    a.q = q;
    a.kc = kc;
    a.vc = vc;
    a.k = fuse ? k : NULL;
    a.v = fuse ? v : NULL;
    a.n_tokens = n_tokens;
    a.seq = b->seq;
    a.pos = b->pos;
    a.out = out;
    a.part = NULL;
    a.n_slot = kv->n_slot;
    a.n_ctx = kv->n_ctx;
    a.n_kv = n_kv;
    a.n_head = n_head;
    a.group = n_head / n_kv;
    int hp_log2 = 0; /* the largest power of two dividing the group, at most MMA_MAX_HP */
    while ((2 << hp_log2) <= MMA_MAX_HP && a.group % (2 << hp_log2) == 0)
        hp_log2++;
    a.hp_log2 = hp_log2;
    a.head_chunks = a.group >> hp_log2;
    a.n_split = 1;
    a.cluster = 0;
    a.n_cl = 1;
    a.qscale = scale * MMA_LOG2E;
    a.xq = NULL; /* mma_launch claims the int8 output for decode rows */
    a.ds = NULL;
    a.qk = tab != NULL;
    a.trigger = 0;
    a.pre = 0; /* mma_launch decides */
    a.q8b = g_dec_q8b;
    a.q_norm = tab ? qk->q_norm : NULL;
    a.k_norm = tab ? qk->k_norm : NULL;
    a.rope_inv = tab;
    a.rope_ms = tab ? qk->rope.mscale : 1.0;
    a.n_rot = tab ? n_rot : 0;
    a.eps = tab ? qk->eps : 0.0f;
    const int tpb = (dec ? 16 : 64) >> hp_log2; /* tokens per query block */
    if (hd == 64) {
        if (!dec)
            mma_launch<64, false, 2, 4>(ctx, &a, b, tpb, max_pos);
        else if (nw == 8)
            mma_launch<64, true, 3, 8>(ctx, &a, b, tpb, max_pos);
        else if (nst == 3)
            mma_launch<64, true, 3, 4>(ctx, &a, b, tpb, max_pos);
        else
            mma_launch<64, true, 5, 4>(ctx, &a, b, tpb, max_pos);
    } else {
        if (!dec)
            mma_launch<128, false, 2, 4>(ctx, &a, b, tpb, max_pos);
        else if (nw == 8)
            mma_launch<128, true, 3, 8>(ctx, &a, b, tpb, max_pos);
        else if (nst == 3)
            mma_launch<128, true, 3, 4>(ctx, &a, b, tpb, max_pos);
        else
            mma_launch<128, true, 5, 4>(ctx, &a, b, tpb, max_pos);
    }
    return true;
}
