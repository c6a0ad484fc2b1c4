/*
 * kern_layer.cu — the tail of a decode layer for one token as one persistent launch
 * (ops->layer_tail): the attention's output projection with its residual add, the FFN
 * norm, gate/up with silu*mul, down with its residual add, and, when the next layer's
 * weights are given, that layer's norm and Q/K/V products.
 *
 * Why: as separate launches every product starts with a fill and ends with a drain in
 * which DRAM idles (~3 us each, seven a layer: bench/NOTES.md, "The next GPU run").
 * Here one block a multiprocessor stays resident through all the phases; a producer
 * warp streams the block's weight rows of every phase, in order, into a ring of
 * shared-memory slots with bulk copies (cp.async.bulk, completion counted on an
 * mbarrier per slot), and that stream does not stop at the grid-wide barriers between
 * the phases: while the consumer warps wait for the other blocks' outputs, the ring
 * fills with the next phase's rows. Only activations are synchronized.
 *
 * Work: block b of G owns a contiguous range of each phase's rows, balanced by weight
 * bytes over the phase's weights laid end to end (Q, K, V; gate and up as pairs of
 * rows); a phase whose outputs are the next phase's input (wo, gate/up, down before
 * Q/K/V) is split in whole units of KL_UNIT = 32 rows instead, so that each int8 block
 * of that input has one writing block. The range is cut into chunks of at most one slot
 * (40 KB, KL_ROWS_MAX rows) that go to the slots in turn. Consumer warp w of NC computes
 * the block's rows j of a phase with (j + rot) % NC == w (rot carries the phases before,
 * so no warp takes every phase's spare row; each warp steps to its own rows of a chunk
 * directly): a whole row a warp, lane l taking the row's items l, l + 32, ... with
 * kern_gemv_dot.cuh's per-type loads (here from shared memory) and dot products, summed
 * over the lanes by a fixed xor tree, written by lane 0. Every output has one writer and
 * the sums a fixed order: results do not depend on timing, and the residual adds need no
 * atomics.
 *
 * A phase's input is in int8 blocks of 32 (the rounding of kern_q8_block) in shared
 * memory, in the permuted copies of kern_xq.cuh (one per weight type the phase has), in
 * which a warp's 32 lanes read one 512-byte run per x load: in the plain layout their
 * pieces sit 64 bytes apart and 16 lanes share a bank. Phase 0's input (the attention
 * output) is copied from the int8 form the attention wrote when the x-quantization memo
 * holds it (kern_matmul.cu), else quantized by every block. Each later phase's input is
 * quantized once, by the blocks that wrote it, after their last row of the phase before
 * (kl_quant_out: the norm's weight applied first, into global copies laid out as in
 * shared memory, with each block's sum of squares); after the barrier every block copies
 * it from L2 and takes the norm's scale from the blocks' sums in one fixed order
 * (kl_load_x), applied to each row's sum: q does not depend on a positive scale, and
 * every term of a sum is linear in the pairs. Activations written inside the launch are
 * read through L2 (ld.global.cg): L1 is not coherent between multiprocessors.
 *
 * The barriers wait for all G blocks, so all must be resident at once: G is at most the
 * multiprocessor count times what the occupancy query allows (a block takes more than
 * half of a multiprocessor's shared memory: one each), and a warp that has waited ~10 s
 * at a barrier or for a ring slot traps, which the next check reports as a launch
 * failure, instead of hanging. The kernel is launched with PDL like the other decode
 * kernels: the producer starts on the weights (no kernel writes them) before the wait,
 * the consumers after it.
 *
 * Covered: one token; every weight Q4_K (rows of whole 256 values) or Q6_K regrouped
 * (KERN_TYPE_Q6_KX8); gate and up of one type and shape. Anything else returns false
 * and the caller runs the plain ops.
 *
 * Opt-in (TPI_LAYER_TAIL=1): on the H200 it is still slower than the separate launches
 * it replaces (tg128 Q4_K_M ~395 against ~447 t/s; bench/NOTES.md changes 50-55 have the
 * breakdowns). TPI_LAYER_TRACE=1 (3, 4: only the launches with as many phases) prints,
 * at exit, the last launch's per-block times (barrier arrival and leaving, input ready,
 * first chunk, last dot, the producer's first and last copy of each phase): a boundary
 * is ~5 us, a chain of round trips through L2 (the stores before the barrier's fence,
 * the arrival, the poll that sees the last one, the input's copy), each ~1-1.5 us while
 * DRAM is saturated; DRAM then idles ~4 us once the ring (4 x 40 KB a block) has landed.
 * Boundaries without the barrier (flagged words, change 55) were no faster: the latency
 * is L2's under the stream, not the barrier's. TPI_LAYER_WARPS (8, 16, 20),
 * TPI_LAYER_SLOT_KB, TPI_LAYER_NS (the ring's slots at most) and TPI_LAYER_DIAG (the
 * KL_DIAG_* parts left out, wrong outputs; or earlier forms of three parts) are the
 * knobs that measured it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern_common.cuh"
#include "kern_gemv_dot.cuh"

#define KL_NC_DEFAULT 16 /* consumer warps a block (TPI_LAYER_WARPS: 8, 16 or 20) */
#define KL_NC_MAX 20
#define KL_SLOT_DEFAULT 40960 /* bytes of one ring slot (TPI_LAYER_SLOT_KB: 8..64) */
#define KL_NS_MIN 2           /* fewer slots than this: not covered */
#define KL_NS_MAX 16
#define KL_ROWS_MAX 16 /* rows of one chunk at most */
#define KL_MAX_SEG 3   /* weights of one phase */
#define KL_MAX_PH 4
#define KL_TIMEOUT_NS 10000000000ull /* a barrier wait this long traps */
#define KL_UNIT 32           /* rows of a phase whose outputs its writers quantize: whole
                              * int8 blocks of the next phase's input a block */
#define KL_NE0_MAX 65536     /* inputs quantized by their writers: values at most */
#define KL_G_MAX 1024        /* blocks at most (the norm's partial sums) */
#define KL_STAGE_MAX 256     /* a block's staged outputs of a phase, at most */
#define KL_NW 2              /* phases whose outputs are normed as the next one's input */
/* One phase's input as its writers quantized it (layer_gx, phases 1..3): the permuted
 * copies (two at most), the (d, d*sum) pairs, each block's sum of squares. */
#define KL_GX_DS (2 * KL_NE0_MAX)
#define KL_GX_SS (KL_GX_DS + KL_NE0_MAX / GV_QK * 8)
#define KL_GX_PHASE (KL_GX_SS + KL_G_MAX * 4)

enum { KL_OUT_STORE, KL_OUT_ADD, KL_OUT_GLU };

/* One weight of a phase: its rows (and up's, for the GLU pair), output and chunking. */
struct kl_seg {
    const uint8_t *w;  /* device rows */
    const uint8_t *w2; /* KL_OUT_GLU: up's rows (w is gate's), else NULL */
    float *y;          /* output: rows floats */
    int type;          /* kern_wtype: TPI_TYPE_Q4_K or KERN_TYPE_Q6_KX8 */
    int rows, row_bytes, chunk_rows;
};
struct kl_phase {
    kl_seg seg[KL_MAX_SEG];
    int n_seg;
    int ne0;           /* input values */
    const float *src;  /* input (device, f32) */
    const float *norm; /* rmsnorm weight for src, or NULL: src as it is */
    int out;           /* KL_OUT_*: y = dot, y += dot, y = silu(gate) * up */
    int xk4, xq6;      /* where x's permuted copies for Q4_K and Q6_K start in the x
                        * buffer (kern_xq.cuh's gv_perm_k4 / gv_perm_q6), -1: not needed */
    int xbytes;        /* the bytes of those copies */
    long long bytes;   /* the phase's weight bytes (a pair's both rows) */
    int unit;          /* 1: the outputs are the next phase's input, which the block
                        * quantizes from its own rows: rows split in KL_UNIT-row units */
    /* the input as the previous phase's blocks quantized it (NULL: phase 0, quantized
     * here by every block): copies laid out as in the x buffer, pairs without the norm's
     * scale, and each block's sum of squares of src when norm */
    int8_t *gx;
    float2 *gds;
    float *gss;
};
struct kl_args {
    kl_phase ph[KL_MAX_PH];
    int n_ph;
    int ns;        /* ring slots */
    int nr;        /* full barriers a slot, used round after round (kl_kernel) */
    int slot;      /* bytes a slot (a multiple of 128) */
    int xmax;      /* largest ne0 of the phases (its (d, d*sum) pairs) */
    int xbytes;    /* the x buffer: the largest sum of a phase's permuted copies */
    float eps;
    unsigned *bar; /* grid barrier: its arrivals word (device, zeroed once) */
    int diag;      /* KL_DIAG_*: parts left out to measure the rest (wrong outputs) */
    unsigned long long *trace; /* TPI_LAYER_TRACE: KL_TR_N times a block (NULL: none) */
};
/* TPI_LAYER_TRACE's times (globaltimer, ns), a row of KL_TR_N a block, the last launch's:
 * the consumers' start and PDL wait, then per phase ph its barrier's arrival and
 * leaving, its input ready, warp 0's first chunk, warp 0's last dot; the producer's
 * first and last copy of each phase. */
#define KL_TR_N 32
#define KL_TR_START 0
#define KL_TR_WAITED 1
#define KL_TR_PH(ph, k) (2 + 5 * (ph) + (k)) /* k: 0 arrive 1 leave 2 input 3 first 4 dots */
#define KL_TR_PROD(ph, k) (22 + 2 * (ph) + (k)) /* k: 0 first copy 1 last copy */
#define KL_TR_END 30
/* TPI_LAYER_DIAG, a measuring knob (a sum of these; outputs are wrong): */
#define KL_DIAG_NO_DOT 1  /* consumers take each slot and release it without its dots */
#define KL_DIAG_NO_COPY 2 /* the producer marks slots full without copying (stale rows) */
#define KL_DIAG_NO_SYNC 4 /* no grid barriers between the phases */
#define KL_DIAG_NO_PREP 8 /* no quantization of the phases' inputs, no copies of it */
#define KL_DIAG_NO_RING 16 /* no producer, no slot waits */
#define KL_DIAG_SPIN 32    /* slot waits poll with test_wait instead of try_wait */
#define KL_DIAG_PREP_NOLOAD 64   /* the inputs' quantization without their loads */
#define KL_DIAG_PREP_NONORM 128  /* ... without the norm's sum of squares */
#define KL_DIAG_PREP_NOSTORE 256 /* ... without the permuted copies' stores */
/* and three that keep the outputs right, each an earlier form of a part: */
#define KL_DIAG_SC_FENCE 512 /* the grid barriers' fences sequentially consistent */
#define KL_DIAG_NO_MEMO 1024 /* phase 0's input quantized by every block, memo or not */
#define KL_DIAG_NO_NWS 2048  /* the norm weights read from global where they are applied */

/* ---------------------------------------------------------------- device helpers */

__device__ __forceinline__ unsigned kl_saddr(const void *p) {
    return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void kl_mbar_init(uint64_t *b, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(kl_saddr(b)), "r"(count)
                 : "memory");
}
/* One arrival that also expects tx bytes of bulk copies on b. */
__device__ __forceinline__ void kl_mbar_expect(uint64_t *b, unsigned tx) {
    asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }" ::"r"(
                     kl_saddr(b)),
                 "r"(tx)
                 : "memory");
}
__device__ __forceinline__ void kl_mbar_arrive(uint64_t *b) {
    asm volatile("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0]; }" ::"r"(kl_saddr(b))
                 : "memory");
}
/* n arrivals at once on b. */
__device__ __forceinline__ void kl_mbar_arrive_n(uint64_t *b, unsigned n) {
    asm volatile("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0], %1; }" ::"r"(
                     kl_saddr(b)),
                 "r"(n)
                 : "memory");
}
__device__ __forceinline__ uint64_t kl_now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
/* Wait until the phase of b with this parity has completed (trap after KL_TIMEOUT_NS). */
__device__ __forceinline__ void kl_mbar_wait(uint64_t *b, unsigned parity, bool spin = false) {
    unsigned done, n = 0;
    uint64_t t0 = 0;
    for (;;) {
        if (spin)
            asm volatile("{ .reg .pred p; mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2; "
                         "selp.u32 %0, 1, 0, p; }"
                         : "=r"(done)
                         : "r"(kl_saddr(b)), "r"(parity)
                         : "memory");
        else
            asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; "
                         "selp.u32 %0, 1, 0, p; }"
                         : "=r"(done)
                         : "r"(kl_saddr(b)), "r"(parity)
                         : "memory");
        if (done) return;
        if ((++n & 63) == 0) { /* the clock now and then: a failed try_wait has waited already */
            const uint64_t t = kl_now_ns();
            if (!t0) t0 = t;
            else if (t - t0 > KL_TIMEOUT_NS) __trap();
        }
    }
}
/* n bytes (n % 16 == 0, both addresses 16-byte aligned) from global src to shared dst,
 * counted on b's tx when they have landed. */
__device__ __forceinline__ void kl_bulk(void *dst, const void *src, unsigned n, uint64_t *b) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], "
                 "%2, [%3];" ::"r"(kl_saddr(dst)),
                 "l"(src), "r"(n), "r"(kl_saddr(b))
                 : "memory");
}
/* The NC consumer warps only (named barrier 1; the producer warp never joins it). */
template <int NC> __device__ __forceinline__ void kl_consumers_sync() {
    asm volatile("bar.sync 1, %0;" ::"n"(NC * 32) : "memory");
}
/* All G blocks' consumers meet: what any of them stored before is visible to all after
 * (a fence on each side of the counter, as a cooperative grid sync does): one atomic
 * add a block on bar[0] and a poll of it, no reset (sc: __threadfence's sequentially
 * consistent fences, TPI_LAYER_DIAG's KL_DIAG_SC_FENCE; tr: arrival and leaving times). */
template <int NC>
__device__ __forceinline__ void kl_grid_sync(unsigned *bar, unsigned G, bool sc,
                                             unsigned long long *tr) {
    kl_consumers_sync<NC>();
    if (threadIdx.x == 0) {
        if (tr) tr[0] = kl_now_ns();
        /* one add a block: block 0 adds 2^31 - (G - 1), the others 1, so the word's top
         * bit flips when the last one arrives and its low bits return to 0 */
        const unsigned inc = blockIdx.x == 0 ? 0x80000000u - (G - 1) : 1u;
        if (sc) __threadfence();
        else kern_fence_gpu();
        const unsigned old = atomicAdd(bar, inc);
        volatile unsigned *v = bar;
        unsigned n = 0;
        uint64_t t0 = 0;
        while (((old ^ *v) & 0x80000000u) == 0)
            if ((++n & 255) == 0) { /* the clock now and then, off the poll's path */
                const uint64_t t = kl_now_ns();
                if (!t0) t0 = t;
                else if (t - t0 > KL_TIMEOUT_NS) __trap(); /* a block never came */
            }
        if (sc) __threadfence();
        else kern_fence_gpu();
        if (tr) tr[1] = kl_now_ns();
    }
    kl_consumers_sync<NC>();
}

__device__ __forceinline__ float kl_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Block b of G's rows [r0, r1) of a segment of rows rows of rb bytes each (a GLU pair's
 * two rows counted together) that starts c bytes into its phase's total bytes: the rows
 * whose first byte, with the phase's segments laid end to end, falls in the block's share
 * [total * b / G, total * (b + 1) / G). Host and device (kern_layer_rows, for the test). */
__host__ __device__ __forceinline__ void kl_range(long long total, long long c, long long rb,
                                                  int rows, int b, int G, int &r0, int &r1) {
    const long long lo = total * b / G, hi = total * (b + 1) / G;
    auto first_at = [&](long long at) {
        const long long d = at - c;
        const long long r = d <= 0 ? 0 : (d + rb - 1) / rb;
        return (int)(r < rows ? r : rows);
    };
    r0 = first_at(lo);
    r1 = first_at(hi);
}
/* kl_range for segment s of phase p. */
__device__ __forceinline__ void kl_rows_of(const kl_phase &p, int s, int b, int G, int &r0,
                                           int &r1) {
    long long c = 0;
    for (int i = 0; i < s; i++)
        c += (long long)p.seg[i].rows * p.seg[i].row_bytes * (p.seg[i].w2 ? 2 : 1);
    const long long rb = (long long)p.seg[s].row_bytes * (p.seg[s].w2 ? 2 : 1);
    if (p.unit) { /* one segment of whole units (the host checks) */
        kl_range(p.bytes, 0, rb * KL_UNIT, p.seg[s].rows / KL_UNIT, b, G, r0, r1);
        r0 *= KL_UNIT;
        r1 *= KL_UNIT;
    } else {
        kl_range(p.bytes, c, rb, p.seg[s].rows, b, G, r0, r1);
    }
}

/* gv<T>'s register form of item it of the block at b, from shared memory. */
template <int T> struct kl_lds;
template <> struct kl_lds<TPI_TYPE_Q4_K> {
    static __device__ __forceinline__ void load(gv<TPI_TYPE_Q4_K>::raw &w, const uint8_t *b,
                                                int c) {
        w.qa = *(const int4 *)(b + 16 + 32 * c);
        w.qb = *(const int4 *)(b + 32 + 32 * c);
        w.hd = *(const int4 *)b;
    }
};
template <> struct kl_lds<KERN_TYPE_Q6_KX8> {
    static __device__ __forceinline__ void load(gv<KERN_TYPE_Q6_KX8>::raw &w, const uint8_t *b,
                                                int l) {
        w.A = *(const int4 *)(b + 16 * l);
        w.C = *(const int4 *)(b + 512 + 16 * l);
        w.H = *(const int4 *)(b + 1024 + 16 * l);
        w.S = *(const uint32_t *)(b + 1536 + 4 * l);
        w.d = *(const uint16_t *)(b + 1664 + 2 * (l >> 2));
    }
};

/* This lane's part of the dots of RW weight rows (shared memory) with x: items lane,
 * lane + 32, ... of each row (all RW rows' weights loaded before the dots; the x loads
 * the rows share are one after common-subexpression elimination). xp: the type's
 * permuted copy of x, where the 32 lanes' 16-byte pieces of one x unit are contiguous
 * (kind p of kern_gemv.cu: no bank conflicts; the plain layout puts them 64 bytes apart,
 * 16 lanes a bank); ds: the (d, d*sum) pairs in the plain layout. */
template <int T, int RW>
__device__ __forceinline__ void kl_rows_t(const uint8_t *const (&row)[RW], int ne0,
                                          const int8_t *xp, const float2 *ds, int lane,
                                          float (&acc)[RW]) {
    using Q = gv<T>;
    const int n_items = ne0 / Q::BLK * Q::IPB;
#pragma unroll 2
    for (int it = lane; it < n_items; it += 32) {
        const int blk = it / Q::IPB, c = it % Q::IPB;
        typename Q::raw w[RW];
#pragma unroll
        for (int r = 0; r < RW; r++)
            kl_lds<T>::load(w[r], row[r] + (size_t)blk * Q::BYTES, c);
        const int8_t *xi = xp + (size_t)GV_GS_K4 * (it >> 5) + 16 * (it & 31);
#pragma unroll
        for (int r = 0; r < RW; r++) {
            float a[1] = {acc[r]};
            /* the dots' short forms: Q6_K's SUMX (x's sums instead of the 32 offsets), Q4_K's
             * HI16 (the high nibbles in place); the same sums */
            Q::template dot<1, true, true>(w[r], c, xi, 0, ds + (size_t)blk * (Q::BLK / GV_QK), 0,
                                           1, 1.0f, a);
            acc[r] = a[0];
        }
    }
#pragma unroll
    for (int r = 0; r < RW; r++)
        acc[r] = kl_warp_sum(acc[r]);
}
template <int RW>
__device__ __forceinline__ void kl_rows(int type, const uint8_t *const (&row)[RW], int ne0,
                                        const int8_t *xbuf, const kl_phase &p, const float2 *ds,
                                        int lane, float (&acc)[RW]) {
#pragma unroll
    for (int r = 0; r < RW; r++)
        acc[r] = 0.0f;
    if (type == TPI_TYPE_Q4_K)
        kl_rows_t<TPI_TYPE_Q4_K, RW>(row, ne0, xbuf + p.xk4, ds, lane, acc);
    else
        kl_rows_t<KERN_TYPE_Q6_KX8, RW>(row, ne0, xbuf + p.xq6, ds, lane, acc);
}

/* The consumers quantize the phase's input (normed first when p.norm) into the permuted
 * copies its weights' types read, and its pairs into ds. Warp w takes x's 32-value blocks
 * w, w + NC, ..., KL_XB at a time with all their loads issued before the first is used:
 * the input comes from L2 (another block wrote it), and a round trip for each block in
 * turn cost ~40 us a layer (bench/NOTES.md change 50). */
#define KL_XB 8
template <int NC>
__device__ __forceinline__ void kl_prepare_x(const kl_phase &p, float eps, int8_t *xbuf,
                                             float2 *ds, float *red, int diag) {
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int ne0 = p.ne0, nblk = ne0 / GV_QK;
    float scale = 1.0f;
    if (p.norm && !(diag & KL_DIAG_PREP_NONORM)) {
        const float4 *s4 = (const float4 *)p.src;
        float ss = 0.0f;
        for (int i0 = tid; i0 < ne0 / 4; i0 += KL_XB * NC * 32) {
            float4 v[KL_XB];
#pragma unroll
            for (int u = 0; u < KL_XB; u++) {
                const int i = i0 + u * NC * 32;
                v[u] = i < ne0 / 4 ? __ldcg(s4 + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int u = 0; u < KL_XB; u++)
                ss += v[u].x * v[u].x + v[u].y * v[u].y + v[u].z * v[u].z + v[u].w * v[u].w;
        }
        ss = kl_warp_sum(ss);
        if (lane == 0) red[warp] = ss;
        kl_consumers_sync<NC>();
        float t = 0.0f;
        for (int w = 0; w < NC; w++) /* fixed order: every block gets the same scale */
            t += red[w];
        scale = kern_rms_scale(t, ne0, eps);
    }
    for (int b0 = warp; b0 < nblk; b0 += KL_XB * NC) {
        float v[KL_XB], g[KL_XB];
#pragma unroll
        for (int u = 0; u < KL_XB; u++) {
            const int blk = b0 + u * NC, i = blk * GV_QK + lane;
            const bool ld = blk < nblk && !(diag & KL_DIAG_PREP_NOLOAD);
            v[u] = ld ? __ldcg(p.src + i) : 0.5f;
            g[u] = ld && p.norm ? __ldg(p.norm + i) : 1.0f;
        }
#pragma unroll
        for (int u = 0; u < KL_XB; u++) {
            const int blk = b0 + u * NC, i = blk * GV_QK + lane;
            if (blk >= nblk) break; /* warp-uniform */
            const float x = p.norm ? __fmul_rn(__fmul_rn(v[u], scale), g[u]) : v[u];
            const int q = kern_q8_pairs(x, i, ds);
            if (diag & KL_DIAG_PREP_NOSTORE) continue;
            if (p.xk4 >= 0) xbuf[p.xk4 + gv_perm_k4(i)] = (int8_t)q;
            if (p.xq6 >= 0) xbuf[p.xq6 + gv_perm_q6(i)] = (int8_t)q;
        }
    }
    kl_consumers_sync<NC>();
}

/* Phases 1..3: the input as the previous phase's blocks quantized it (kl_quant_out),
 * copied from L2 into this block's x buffer and pairs; *scl gets the norm's scale, which
 * the dots apply to their sums (every term of a row's sum is linear in the pairs), or 1.
 * The partial sums of squares are added in one fixed order, so every block gets the same
 * scale. */
template <int NC>
__device__ __forceinline__ void kl_load_x(const kl_phase &p, float eps, int G, int8_t *xbuf,
                                          float2 *ds, float *scl) {
    const int tid = threadIdx.x;
    const int4 *gx = (const int4 *)p.gx;
    int4 *xs = (int4 *)xbuf;
    for (int i = tid; i < p.xbytes / 16; i += NC * 32)
        xs[i] = __ldcg(gx + i);
    for (int i = tid; i < p.ne0 / GV_QK; i += NC * 32)
        ds[i] = __ldcg(p.gds + i);
    if (tid < 32) {
        float t = 0.0f;
        if (p.norm) {
            for (int i = tid; i < G; i += 32)
                t += __ldcg(p.gss + i);
            t = kl_warp_sum(t);
        }
        if (tid == 0)
            *scl = p.norm ? kern_rms_scale(t, p.ne0, eps) : 1.0f;
    }
    kl_consumers_sync<NC>();
}

/* After the block's last row of phase p (nx the next phase): its staged outputs y[r0..r1)
 * quantized as nx's input, into nx's global copies and pairs: warp w takes the units
 * w, w + NC, ...; the norm's weight is applied before and its scale after (kl_load_x),
 * as q does not depend on a positive scale (nw: its values for the rows, staged at the
 * kernel's start). The block's sum of squares of y goes to nx.gss[b] (0 without rows),
 * its order fixed. */
template <int NC>
__device__ __forceinline__ void kl_quant_out(const kl_phase &nx, const float *stage,
                                             const float *nw, int r0, int r1, int b, float *red) {
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    kl_consumers_sync<NC>(); /* every warp's outputs staged */
    float ss = 0.0f;
    for (int u = warp; u < (r1 - r0) / KL_UNIT; u += NC) {
        const int i = r0 + KL_UNIT * u + lane;
        const float v = stage[KL_UNIT * u + lane];
        ss = fmaf(v, v, ss);
        const float x =
            nx.norm ? __fmul_rn(v, nw ? nw[KL_UNIT * u + lane] : __ldg(nx.norm + i)) : v;
        float2 pair;
        const int q = kern_q8_quant(x, &pair);
        if (nx.xk4 >= 0) nx.gx[nx.xk4 + gv_perm_k4(i)] = (int8_t)q;
        if (nx.xq6 >= 0) nx.gx[nx.xq6 + gv_perm_q6(i)] = (int8_t)q;
        if (lane == 0) nx.gds[i / GV_QK] = pair;
    }
    if (nx.norm) {
        ss = kl_warp_sum(ss);
        if (lane == 0) red[warp] = ss;
        kl_consumers_sync<NC>();
        if (tid == 0) {
            float t = 0.0f;
            for (int w = 0; w < NC; w++)
                t += red[w];
            nx.gss[b] = t;
        }
    }
}

/* ---------------------------------------------------------------- the kernel */

template <int NC> __global__ void __launch_bounds__(32 * (NC + 1), 1) kl_kernel(const kl_args a) {
    extern __shared__ __align__(128) uint8_t kl_smem[];
    const int ns = a.ns, SLOT = a.slot;
    uint8_t *slots = kl_smem;
    int8_t *xs = (int8_t *)(kl_smem + (size_t)ns * SLOT);
    float2 *ds = (float2 *)(xs + a.xbytes);
    float *stage = (float *)(ds + a.xmax / GV_QK); /* the block's outputs of a unit phase */
    float *red = stage + KL_STAGE_MAX;
    float *scl = red + KL_NC_MAX; /* the phase's norm scale (kl_load_x) */
    float *nws = scl + 1;         /* the norm weights kl_quant_out applies, KL_NW phases */
    /* Slot s's round u is full when full[nr * s + u % nr] completes its phase u / nr, and
     * free again when empty[s] completes its phase u. Only the warps with rows in a chunk
     * (its users: min(n, NC)) wait for it and arrive; the producer arrives for the
     * others. A warp is a user at least once in any NC chunks in a row (each chunk has a
     * row, dealt to the warps in turn), so when it waits for round u of a slot, round
     * u - nr of that slot has completed as long as (nr - 1) * ns >= NC (the host's nr):
     * a parity wait cannot take an older phase for the one it asks for. */
    uint64_t *full = (uint64_t *)(((uintptr_t)(nws + KL_NW * KL_STAGE_MAX) + 7) & ~(uintptr_t)7);
    uint64_t *empty = full + ns * a.nr;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int G = (int)gridDim.x, b = (int)blockIdx.x;

    if (threadIdx.x == 0) {
        for (int s = 0; s < ns * a.nr; s++)
            kl_mbar_init(&full[s], 1); /* the producer's expect_tx arrival */
        for (int s = 0; s < ns; s++)
            kl_mbar_init(&empty[s], NC); /* the users, and the producer for the others */
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        if (a.trace) /* this launch's points only (a block without rows in a phase skips some) */
            for (int k = 0; k < KL_TR_N; k++)
                a.trace[(size_t)KL_TR_N * blockIdx.x + k] = 0;
    }
    __syncthreads();

    const bool spin = a.diag & KL_DIAG_SPIN, ring = !(a.diag & KL_DIAG_NO_RING);
    const bool prep = !(a.diag & KL_DIAG_NO_PREP);
    unsigned long long *tr = a.trace ? a.trace + (size_t)KL_TR_N * b : NULL;
    if (warp == NC) { /* the producer: every phase's chunks, in order */
        if (lane != 0 || !ring) return;
        int slot = 0, use = 0, ur = 0; /* chunk k's slot k % ns, round k / ns, round % nr */
        for (int ph = 0; ph < a.n_ph; ph++) {
            const kl_phase &p = a.ph[ph];
            for (int s = 0; s < p.n_seg; s++) {
                const kl_seg &sg = p.seg[s];
                int r0, r1;
                kl_rows_of(p, s, b, G, r0, r1);
                for (int r = r0; r < r1; r += sg.chunk_rows) {
                    const int n = min(sg.chunk_rows, r1 - r);
                    if (use > 0) kl_mbar_wait(&empty[slot], (use - 1) & 1, spin);
                    if (tr && ph < 4) {
                        if (s == 0 && r == r0) tr[KL_TR_PROD(ph, 0)] = kl_now_ns();
                        tr[KL_TR_PROD(ph, 1)] = kl_now_ns();
                    }
                    const unsigned nb = (unsigned)n * (unsigned)sg.row_bytes;
                    uint8_t *dst = slots + (size_t)slot * SLOT;
                    uint64_t *f = &full[a.nr * slot + ur];
                    if (a.diag & KL_DIAG_NO_COPY) {
                        kl_mbar_arrive(f);
                    } else {
                        kl_mbar_expect(f, sg.w2 ? 2 * nb : nb);
                        kl_bulk(dst, sg.w + (size_t)r * sg.row_bytes, nb, f);
                        if (sg.w2) kl_bulk(dst + nb, sg.w2 + (size_t)r * sg.row_bytes, nb, f);
                    }
                    if (n < NC) kl_mbar_arrive_n(&empty[slot], NC - n); /* the non-users */
                    if (++slot == ns) {
                        slot = 0, use++;
                        if (++ur == a.nr) ur = 0;
                    }
                }
            }
        }
        return;
    }

    /* the consumers: first the norm weights of the rows they will quantize (no kernel
     * writes them, so before the wait), as the phases use them */
    const bool t0 = tr && threadIdx.x == 0; /* the thread that writes the trace */
    if (t0) tr[KL_TR_START] = kl_now_ns();
    const bool nwsd = !(a.diag & KL_DIAG_NO_NWS);
    for (int ph = 0, k = 0; ph + 1 < a.n_ph && k < KL_NW && nwsd; ph++)
        if (a.ph[ph].unit && a.ph[ph + 1].norm && prep) {
            int r0, r1;
            kl_rows_of(a.ph[ph], 0, b, G, r0, r1);
            for (int i = threadIdx.x; i < r1 - r0; i += NC * 32)
                nws[KL_STAGE_MAX * k + i] = __ldg(a.ph[ph + 1].norm + r0 + i);
            k++;
        }
    kern_dep_wait(); /* the first phase's input is the previous kernel's output */
    if (t0) tr[KL_TR_WAITED] = kl_now_ns();
    int nwk = 0; /* the next phase to take its norm weights from nws */
    int slot = 0, ur = 0; /* as the producer's, and up the parity of its round / nr */
    unsigned up = 0;
    int base = 0; /* the warp that takes the chunk's row 0 (carried over the phases, so
                   * no warp takes every phase's spare row) */
    for (int ph = 0; ph < a.n_ph; ph++) {
        const kl_phase &p = a.ph[ph];
        unsigned long long *trp = tr && ph < 4 ? tr + KL_TR_PH(ph, 0) : NULL;
        if (ph > 0 && !(a.diag & KL_DIAG_NO_SYNC))
            kl_grid_sync<NC>(a.bar, (unsigned)G, a.diag & KL_DIAG_SC_FENCE, trp);
        float sc = 1.0f; /* the norm's scale of an input its writers quantized */
        if (prep && p.gx && !(ph == 0 && (a.diag & KL_DIAG_NO_MEMO))) {
            kl_load_x<NC>(p, a.eps, G, xs, ds, scl);
            sc = *scl;
        } else if (prep) {
            kl_prepare_x<NC>(p, a.eps, xs, ds, red, a.diag);
        }
        if (t0 && trp) trp[2] = kl_now_ns();
        int r0 = 0, r1 = 0;
        for (int s = 0; s < p.n_seg; s++) {
            const kl_seg &sg = p.seg[s];
            kl_rows_of(p, s, b, G, r0, r1);
            for (int r = r0; r < r1; r += sg.chunk_rows) {
                const int n = min(sg.chunk_rows, r1 - r);
                const uint8_t *src = slots + (size_t)slot * SLOT;
                int i = warp - base; /* this warp's rows of the chunk: i, i + NC, ... */
                if (i < 0) i += NC;
                const bool user = ring && i < n;
                if (user) kl_mbar_wait(&full[a.nr * slot + ur], up, spin);
                if (t0 && trp && r == r0 && s == 0) trp[3] = kl_now_ns();
                for (; user && i < n && !(a.diag & KL_DIAG_NO_DOT); i += NC) {
                    const uint8_t *row = src + (size_t)i * sg.row_bytes;
                    float *y = sg.y + r + i;
                    float out;
                    if (p.out == KL_OUT_GLU) { /* gate row i, up row i after the n gates */
                        const uint8_t *rows[2] = {row, row + (size_t)n * sg.row_bytes};
                        float gu[2];
                        kl_rows<2>(sg.type, rows, p.ne0, xs, p, ds, lane, gu);
                        out = kern_silu_mul1(gu[0] * sc, gu[1] * sc);
                    } else {
                        /* the residual's old value asked for before the dot, not after */
                        const float y0 = p.out == KL_OUT_ADD && lane == 0 ? __ldcg(y) : 0.0f;
                        const uint8_t *rows[1] = {row};
                        float v[1];
                        kl_rows<1>(sg.type, rows, p.ne0, xs, p, ds, lane, v);
                        out = y0 + v[0] * sc;
                    }
                    if (lane == 0) {
                        __stcg(y, out);
                        if (p.unit) stage[r + i - r0] = out;
                    }
                }
                if (user) {
                    __syncwarp();
                    if (lane == 0) kl_mbar_arrive(&empty[slot]);
                }
                base += n;
                while (base >= NC)
                    base -= NC;
                if (++slot == ns) {
                    slot = 0;
                    if (++ur == a.nr) ur = 0, up ^= 1;
                }
            }
        }
        if (t0 && trp) trp[4] = kl_now_ns();
        if (p.unit && prep) {
            const bool nw = a.ph[ph + 1].norm != NULL;
            kl_quant_out<NC>(a.ph[ph + 1], stage, nwsd ? nws + KL_STAGE_MAX * nwk : NULL, r0,
                             r1, b, red);
            nwk += nw;
        }
    }
    if (t0) tr[KL_TR_END] = kl_now_ns();
}

/* ---------------------------------------------------------------- host side */

/* kl's type id of w, or -1 when the kernel does not cover it. */
static int kl_type_of(const struct tpi_weight *w) {
    if (!w || !w->data) return -1;
    const int t = kern_wtype(w);
    if (t == TPI_TYPE_Q4_K && w->ne0 % 256 == 0 && w->row_bytes % 16 == 0) return t;
    if (t == KERN_TYPE_Q6_KX8 && w->ne0 % 2048 == 0 && w->row_bytes % 16 == 0) return t;
    return -1;
}

/* Add weight w (and w2, gate's up) to phase p as its next segment; false when not covered. */
static bool kl_add_seg(kl_phase &p, const struct tpi_weight *w, const struct tpi_weight *w2,
                       float *y, int64_t ne0, int slot) {
    const int t = kl_type_of(w);
    if (t < 0 || p.n_seg >= KL_MAX_SEG || w->ne0 != ne0 || w->ne1 > (1 << 24) || !y) return false;
    if (w2 && (kl_type_of(w2) != t || w2->ne0 != w->ne0 || w2->ne1 != w->ne1)) return false;
    const int pair = w2 ? 2 : 1;
    int cr = (int)(slot / ((int64_t)w->row_bytes * pair));
    if (cr < 1) return false;
    if (cr > KL_ROWS_MAX) cr = KL_ROWS_MAX;
    kl_seg &s = p.seg[p.n_seg++];
    s.w = (const uint8_t *)w->data;
    s.w2 = w2 ? (const uint8_t *)w2->data : NULL;
    s.y = y;
    s.type = t;
    s.rows = (int)w->ne1;
    s.row_bytes = (int)w->row_bytes;
    s.chunk_rows = cr;
    p.bytes += (long long)w->ne1 * (long long)w->row_bytes * pair;
    return true;
}

static void kl_phase_in(kl_phase &p, const float *src, const float *norm, int64_t ne0, int out) {
    memset(&p, 0, sizeof p);
    p.src = src;
    p.norm = norm;
    p.ne0 = (int)ne0;
    p.out = out;
    p.xk4 = p.xq6 = -1;
}

/* Place the phase's permuted copies of x (each ne0 rounded up to whole groups) in the x
 * buffer; returns the bytes they take. */
static int kl_place_copies(kl_phase &p) {
    const int pad = (p.ne0 + GV_GS_K4 - 1) / GV_GS_K4 * GV_GS_K4;
    bool k4 = false, q6 = false;
    for (int i = 0; i < p.n_seg; i++)
        (p.seg[i].type == TPI_TYPE_Q4_K ? k4 : q6) = true;
    int at = 0;
    if (k4) p.xk4 = at, at += pad;
    if (q6) p.xq6 = at, at += pad;
    return at;
}

/* Full barriers a slot for ns slots and nc consumer warps: (nr - 1) * ns >= nc (kl_kernel). */
static int kl_full_rounds(int ns, int nc) {
    return nc / ns + 2;
}
/* Dynamic shared memory of a launch with ns slots, an x buffer of xbytes (a multiple of
 * 16) and inputs of up to xmax values, for nc consumer warps. */
static size_t kl_smem_bytes(int ns, int slot, int xbytes, int xmax, int nc) {
    return (size_t)ns * slot + (size_t)xbytes + (size_t)xmax / GV_QK * 8 +
           ((1 + KL_NW) * KL_STAGE_MAX + KL_NC_MAX + 1) * 4 + 8 +
           (size_t)ns * (kl_full_rounds(ns, nc) + 1) * 8;
}

/* The kernel of nc consumer warps. */
static void (*kl_kernel_for(int nc))(const kl_args) {
    return nc == 8 ? kl_kernel<8> : nc == 20 ? kl_kernel<20> : kl_kernel<16>;
}

extern "C" int kern_layer_rows(int n_seg, const int *rows, const long long *seg_bytes,
                               int unit, int b, int G, int *r0, int *r1) {
    if (n_seg < 1 || n_seg > KL_MAX_SEG || G < 1 || b < 0 || b >= G) return -1;
    long long total = 0;
    for (int i = 0; i < n_seg; i++) {
        if (rows[i] < 0 || seg_bytes[i] < 1) return -1;
        total += (long long)rows[i] * seg_bytes[i];
    }
    if (unit) { /* as kl_rows_of splits a phase whose writers quantize their outputs */
        if (n_seg != 1 || rows[0] % KL_UNIT) return -1;
        kl_range(total, 0, seg_bytes[0] * KL_UNIT, rows[0] / KL_UNIT, b, G, r0[0], r1[0]);
        r0[0] *= KL_UNIT;
        r1[0] *= KL_UNIT;
        return 0;
    }
    long long c = 0;
    for (int s = 0; s < n_seg; s++) {
        kl_range(total, c, seg_bytes[s], rows[s], b, G, r0[s], r1[s]);
        c += (long long)rows[s] * seg_bytes[s];
    }
    return 0;
}

bool kern_layer_init(struct ops_ctx *ctx) {
    /* opt-in: measured slower than the separate launches so far (bench/NOTES.md change 50) */
    const char *e = getenv("TPI_LAYER_TAIL");
    ctx->layer_tail = e && strcmp(e, "1") == 0;
    ctx->layer_warps = KL_NC_DEFAULT;
    const char *w = getenv("TPI_LAYER_WARPS");
    if (w && *w) {
        if (strcmp(w, "8") == 0 || strcmp(w, "16") == 0 || strcmp(w, "20") == 0)
            ctx->layer_warps = atoi(w);
        else
            TPI_LOGW("TPI_LAYER_WARPS=%s is not 8, 16 or 20: ignored", w);
    }
    const char *dg = getenv("TPI_LAYER_DIAG");
    ctx->layer_diag = dg && *dg ? atoi(dg) & 4095 : 0;
    if (ctx->layer_diag & 511)
        TPI_LOGW("TPI_LAYER_DIAG=%d: the layer tail leaves parts out; outputs are wrong (for "
                 "measuring)", ctx->layer_diag);
    ctx->layer_slot = KL_SLOT_DEFAULT;
    const char *sl = getenv("TPI_LAYER_SLOT_KB");
    if (sl && *sl) {
        const int kb = atoi(sl);
        if (kb >= 8 && kb <= 64)
            ctx->layer_slot = kb * 1024;
        else
            TPI_LOGW("TPI_LAYER_SLOT_KB=%s is not 8..64: ignored", sl);
    }
    if (!CUDA_OK(ctx, "cuda init", cudaMalloc(&ctx->layer_bar, 2 * sizeof(unsigned))) ||
        !CUDA_OK(ctx, "cuda init", cudaMemset(ctx->layer_bar, 0, 2 * sizeof(unsigned)))) {
        ctx->layer_bar = NULL;
        return false;
    }
    /* the quantized inputs of phases 1..3 (~0.45 MB), only when the tail is on */
    if (ctx->layer_tail &&
        !CUDA_OK(ctx, "cuda init", cudaMalloc(&ctx->layer_gx, 3 * (size_t)KL_GX_PHASE))) {
        ctx->layer_gx = NULL;
        return false;
    }
    const char *nm = getenv("TPI_LAYER_NS");
    ctx->layer_ns_max = KL_NS_MAX;
    if (nm && *nm) {
        const int n = atoi(nm);
        if (n >= KL_NS_MIN && n <= KL_NS_MAX)
            ctx->layer_ns_max = n;
        else
            TPI_LOGW("TPI_LAYER_NS=%s is not %d..%d: ignored", nm, KL_NS_MIN, KL_NS_MAX);
    }
    const char *tv = getenv("TPI_LAYER_TRACE");
    ctx->layer_trace = NULL;
    ctx->layer_trace_nph = tv && *tv ? atoi(tv) : 0; /* 3 or 4: only launches of as many phases */
    if (ctx->layer_tail && tv && *tv && strcmp(tv, "0") != 0) {
        const size_t nb = (size_t)KL_G_MAX * KL_TR_N * sizeof(unsigned long long);
        if (!CUDA_OK(ctx, "cuda init", cudaMalloc(&ctx->layer_trace, nb)) ||
            !CUDA_OK(ctx, "cuda init", cudaMemset(ctx->layer_trace, 0, nb))) {
            ctx->layer_trace = NULL;
            return false;
        }
    }
    if (cudaFuncSetAttribute(kl_kernel_for(ctx->layer_warps),
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)ctx->smem_optin) != cudaSuccess) {
        cudaGetLastError(); /* a device without the opt-in: the tail stays off */
        ctx->layer_tail = false;
    }
    return true;
}

/* TPI_LAYER_TRACE: the last launch's times on stderr, per trace point the blocks' min,
 * median and max in us from the earliest PDL wait's end. */
static void kl_trace_dump(struct ops_ctx *ctx) {
    const int G = ctx->layer_blocks;
    if (G <= 0 || G > KL_G_MAX) return;
    unsigned long long *h = (unsigned long long *)malloc((size_t)G * KL_TR_N * 8);
    unsigned long long *col = (unsigned long long *)malloc((size_t)G * 8);
    if (!h || !col || cudaDeviceSynchronize() != cudaSuccess ||
        cudaMemcpy(h, ctx->layer_trace, (size_t)G * KL_TR_N * 8, cudaMemcpyDeviceToHost) !=
            cudaSuccess) {
        free(h), free(col);
        return;
    }
    unsigned long long ref = ~0ull;
    for (int b = 0; b < G; b++)
        if (h[KL_TR_N * b + KL_TR_WAITED] && h[KL_TR_N * b + KL_TR_WAITED] < ref)
            ref = h[KL_TR_N * b + KL_TR_WAITED];
    static const char *const pk[5] = {"barrier arrive", "barrier leave", "input ready",
                                      "first chunk", "last dot"};
    fprintf(stderr, "layer tail trace (%d blocks, %zu bytes of shared memory each, us from "
                    "the first PDL wait's end: min median max)\n", G, ctx->layer_smem);
    for (int k = 0; k < KL_TR_N; k++) {
        int n = 0;
        for (int b = 0; b < G; b++)
            if (h[KL_TR_N * b + k]) col[n++] = h[KL_TR_N * b + k];
        if (!n) continue;
        qsort(col, (size_t)n, 8, kern_cmp_u64);
        char name[64];
        if (k == KL_TR_START) snprintf(name, sizeof name, "start");
        else if (k == KL_TR_WAITED) snprintf(name, sizeof name, "PDL wait done");
        else if (k == KL_TR_END) snprintf(name, sizeof name, "end");
        else if (k >= KL_TR_PROD(0, 0)) snprintf(name, sizeof name, "phase %d producer %s",
                                                 (k - KL_TR_PROD(0, 0)) / 2,
                                                 (k - KL_TR_PROD(0, 0)) % 2 ? "last" : "first");
        else snprintf(name, sizeof name, "phase %d %s", (k - 2) / 5, pk[(k - 2) % 5]);
        fprintf(stderr, "  %-28s %9.2f %9.2f %9.2f  (%d)\n", name, ((double)col[0] - ref) / 1e3,
                ((double)col[n / 2] - ref) / 1e3, ((double)col[n - 1] - ref) / 1e3, n);
    }
    free(h), free(col);
}

void kern_layer_free(struct ops_ctx *ctx) {
    if (ctx->layer_trace) kl_trace_dump(ctx), cudaFree(ctx->layer_trace);
    ctx->layer_trace = NULL;
    if (ctx->layer_bar) cudaFree(ctx->layer_bar);
    if (ctx->layer_gx) cudaFree(ctx->layer_gx);
    ctx->layer_bar = NULL;
    ctx->layer_gx = NULL;
}

bool kern_layer_tail(struct ops_ctx *ctx, const struct ops_layer_tail *t) {
    if (!ctx->layer_tail || !ctx->layer_bar || !ctx->layer_gx || !t || !t->att || !t->x || !t->g)
        return false;
    const int64_t n_embd = t->wo ? t->wo->ne1 : 0, n_ff = t->w_gate ? t->w_gate->ne1 : 0;
    const int slot = ctx->layer_slot, nc = ctx->layer_warps;
    kl_args a;
    memset(&a, 0, sizeof a);
    if (!t->wo || !t->ffn_norm || !t->w_down || n_embd % GV_QK || n_ff % GV_QK) return false;
    kl_phase_in(a.ph[0], t->att, NULL, t->wo->ne0, KL_OUT_ADD);
    if (!kl_add_seg(a.ph[0], t->wo, NULL, t->x, t->wo->ne0, slot)) return false;
    kl_phase_in(a.ph[1], t->x, t->ffn_norm, n_embd, KL_OUT_GLU);
    if (!kl_add_seg(a.ph[1], t->w_gate, t->w_up, t->g, n_embd, slot)) return false;
    kl_phase_in(a.ph[2], t->g, NULL, n_ff, KL_OUT_ADD);
    if (!kl_add_seg(a.ph[2], t->w_down, NULL, t->x, n_ff, slot) || t->w_down->ne1 != n_embd)
        return false;
    a.n_ph = 3;
    if (t->wq) {
        kl_phase &p = a.ph[3];
        kl_phase_in(p, t->x, t->attn_norm, n_embd, KL_OUT_STORE);
        if (!t->attn_norm || !kl_add_seg(p, t->wq, NULL, t->q, n_embd, slot) ||
            !kl_add_seg(p, t->wk, NULL, t->k, n_embd, slot) ||
            !kl_add_seg(p, t->wv, NULL, t->v, n_embd, slot))
            return false;
        a.n_ph = 4;
    }
    int xmax = 0, xbytes = 0;
    for (int i = 0; i < a.n_ph; i++) {
        if (a.ph[i].ne0 % GV_QK || a.ph[i].ne0 % 4) return false;
        xmax = a.ph[i].ne0 > xmax ? a.ph[i].ne0 : xmax;
        const int nb = kl_place_copies(a.ph[i]);
        a.ph[i].xbytes = nb;
        xbytes = nb > xbytes ? nb : xbytes;
    }
    int ns = ctx->layer_ns_max;
    while (ns >= KL_NS_MIN && kl_smem_bytes(ns, slot, xbytes, xmax, nc) > ctx->smem_optin)
        ns--;
    if (ns < KL_NS_MIN) return false;
    const size_t smem = kl_smem_bytes(ns, slot, xbytes, xmax, nc);
    void (*kernel)(const kl_args) = kl_kernel_for(nc);
    /* blocks that fit at once (the barriers need every block resident): asked once a shape */
    if (ctx->layer_smem != smem) {
        int per_sm = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 32 * (nc + 1), smem) !=
            cudaSuccess) {
            cudaGetLastError();
            per_sm = 0;
        }
        ctx->layer_smem = smem;
        ctx->layer_blocks = per_sm > 0 ? ctx->n_sm : 0; /* one a multiprocessor, no more */
    }
    const int G = ctx->layer_blocks;
    if (G <= 0 || G > KL_G_MAX) return false;
    /* phases 1.. read their input as the blocks of the phase before quantized it: that
     * phase's rows go in whole units, staged in shared memory */
    int n_nw = 0; /* phases whose outputs are normed for the next (staged weights) */
    for (int i = 1; i < a.n_ph; i++) {
        kl_phase &w = a.ph[i - 1], &p = a.ph[i];
        if (w.n_seg != 1 || w.seg[0].rows % KL_UNIT || p.ne0 > KL_NE0_MAX ||
            p.xbytes > 2 * KL_NE0_MAX || w.seg[0].rows != p.ne0)
            return false;
        const int units = w.seg[0].rows / KL_UNIT; /* a block's share: one unit over at most */
        if ((long long)KL_UNIT * ((units + G - 1) / G + 1) > KL_STAGE_MAX) return false;
        if (p.norm && ++n_nw > KL_NW) return false;
        w.unit = 1;
        p.gx = ctx->layer_gx + (size_t)(i - 1) * KL_GX_PHASE;
        p.gds = (float2 *)(p.gx + KL_GX_DS);
        p.gss = (float *)(p.gx + KL_GX_SS);
    }
    /* phase 0's input: the attention's int8 form when the memo holds it (its permuted
     * copy of the one type wo has, kern_xq.cuh's layout), else quantized by every block */
    const kl_phase &p0 = a.ph[0];
    if (ctx->xq_memo.valid && ctx->xq_memo.x == t->att && ctx->xq_memo.n_vals == p0.ne0 &&
        ctx->xq_memo.ne0 == p0.ne0 && p0.n_seg == 1 && ctx->xq_memo.xq && ctx->xq_memo.ds) {
        const gv_xlayout lay = gv_xlayout_of(1, p0.ne0);
        a.ph[0].gx = (int8_t *)ctx->xq_memo.xq + (p0.xk4 >= 0 ? lay.k4_off : lay.q6_off); /* read */
        a.ph[0].gds = (float2 *)ctx->xq_memo.ds;
    }
    a.ns = ns;
    a.nr = kl_full_rounds(ns, nc);
    a.slot = slot;
    a.xmax = xmax;
    a.xbytes = xbytes;
    a.eps = t->eps;
    a.bar = ctx->layer_bar;
    a.diag = ctx->layer_diag;
    a.trace = ctx->layer_trace_nph < 3 || ctx->layer_trace_nph == a.n_ph ? ctx->layer_trace : NULL;
    kern_xq_forget(ctx);
    kern_launch(ctx->pdl, kernel, dim3(ctx->layer_blocks), dim3(32 * (nc + 1)), smem,
                ctx->stream, a);
    return LAUNCH_OK(ctx, "layer_tail");
}
