/*
 * kern_mmq.cu — y(n_rows, ne1) = x(n_rows, ne0) * W^T (or y +=) for block-quantized W and
 * 9-64 rows of x (by default up to 32): the steps of a batch that decode many sequences
 * at once.
 *
 * The prefill path (kern_matmul.cu) dequantizes W to bf16 in global memory and lets cuBLAS
 * multiply: for every step it writes and reads back twice W's bytes in bf16 (16 GB for an
 * 8B model against 4.7 GB of Q4_K_M), whatever the row count. Here each weight byte is
 * read once, decoded to bf16 in registers and multiplied on the tensor cores (mma.sync
 * m16n8k16, bf16 in, f32 accumulators): x and W rounded to bf16 as on the cuBLAS path, so
 * the two agree to the same bound against the f32 reference (test_ops_cuda).
 *
 * Layout of the work. A warp owns MMQ_NT n-tiles of 8 output features; lane l holds the
 * B fragment of feature l / 4 of each tile. The k order inside a 16-value step is ours to
 * choose, as long as x's A fragments follow it: quad lane q = l % 4 decodes unit
 * 4 i + q of its rows (kq<T>::unit, 4 consecutive values per group), and group gi of
 * that unit is its part of step i * G + gi (fragment k slots 2q, 2q+1 and 2q+8, 2q+9).
 * The block's 4 warps share x: each chunk of 16 steps is staged in shared memory in that
 * order (bf16, rows padded so ldmatrix reads the 8 rows of a matrix from 8 bank groups),
 * and read as A fragments with ldmatrix. MT m-tiles of 16 rows (n_rows <= 16 MT).
 * Each chunk's 128 rows' bytes are copied into shared memory with 16-byte cp.async one
 * chunk ahead (two buffers), x's chunk likewise, and the unit decoders read from there
 * (decoding from global memory, their scattered 1-4 byte reads ran L1 out of wavefronts:
 * bench/NOTES.md change 61). A chunk is whole blocks of a row for every type but the
 * 8-block groups of Q6_K and Q3_K (KERN_TYPE_Q6_KX8, KERN_TYPE_Q3_KX8), whose chunk is
 * gathered from pieces of the group (mmq_src).
 * Q4_K up to 32 rows takes the raw path (ctx->mmq_raw, TPI_MMQ_RAW): no bf16 weights at
 * all; each nibble goes to the tensor cores as bf16 128 + q (one byte permute for 4), a
 * sub-block's sums start from zero, a fifth n-tile of ones sums x, and the scales are
 * applied to the sums: y += d sc S - (128 d sc + dmin m) X. W is then exact (x bf16).
 * Q6_K's 8-block groups take it too, a 16-value step at a time (their scales are per 16
 * values): the 6-bit q as bf16 128 + q, each step's sums started from -160 X, so
 * y += d sc (S - 160 X) (bench/NOTES.md change 152).
 * The raw kernels read x permuted into their staging order by the launch that rounds it
 * to bf16 (mmq_permute_x: 16-byte copies where the plain x takes 4-byte ones, each
 * warp's sectors all used), or as the op that produced x wrote it already in that
 * order (rmsnorm, the batch silu*mul: kern_xp_claim, change 161), and are held to 3
 * blocks an SM (168 registers, their outer loop rolled; unbounded they took 220-254: 2
 * an SM); bench/NOTES.md change 155.
 * Long rows over few features split k over the grid's y blocks: partial sums in a
 * scratch buffer, which the last block of each column to finish adds in a fixed order
 * where a column's slices are few (TPI_MMQ_FIXUP KiB, default 64; changes 157, 159),
 * else a launch of its own, mmq_reduce, in the same order (results do not depend on
 * timing).
 * One launch may hold up to 4 weights of one type and row length that share x
 * (kern_mmq_n: Q/K/V, gate/up), each split as it would be alone (bitwise the same).
 * H200 (run 120), against the dequantize + cuBLAS path: Q4_K 4096->12288 31 / 43 us at
 * 16 / 32 rows (cuBLAS ~90), Q6_K 55 / 78 (~82); at 64 rows Q6_K lost to cuBLAS (152
 * against 81, run 116), so ctx->mmq_rows stops at 32 by default.
 */
#include <string.h>

#include "kern_common.cuh"
#include "kern_quant.cuh"
#include "kern_xq.cuh"

#define MMQ_WARPS 4
#define MMQ_NT 4                           /* n-tiles (8 features) a warp */
#define MMQ_FEATS (MMQ_WARPS * MMQ_NT * 8) /* 128 features a block */
#define MMQ_STEPS 16                       /* 16-value steps a staged chunk: 256 values */
#define MMQ_LD (MMQ_STEPS * 16 + 8)        /* bf16 a staged row: 528 bytes */
#define MMQ_MAX_SPLIT 16

/* The weights of one launch: one type and row length; weight i owns the feature blocks
 * [bx0[i], bx0[i+1]) of the grid and columns [f0[i], f0[i+1]) of the partial sums, and
 * splits its rows' steps over split[i] y blocks of spb[i] steps (what a launch of it
 * alone would do, so its outputs are bitwise the same: test_ops_fused). */
struct mmq_ws {
    const uint8_t *w[MMQ_MAX_W];
    float *y[MMQ_MAX_W];
    int ne1[MMQ_MAX_W];
    int bx0[MMQ_MAX_W + 1];
    int f0[MMQ_MAX_W + 1];
    int split[MMQ_MAX_W], spb[MMQ_MAX_W];
    int *cnt; /* k split: a counter a column of blocks (zero between launches), whose last
               * block to finish adds the slices; NULL: mmq_reduce adds them */
    int n, cols; /* cols = f0[n] (read with constant indices only: the kernels index no
                  * parameter array at run time, which would copy it to local memory) */
};

/* c(16x8, f32) += a(16x16, bf16, row-major) * b(16x8, bf16, b[k][n] with k inner). */
__device__ __forceinline__ void mmq_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* d(16x8, f32) = a * b, the accumulators starting from zero. */
__device__ __forceinline__ void mmq_mma0(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}

/* d = a * b + c (c, d separate: c a start other than zero). */
__device__ __forceinline__ void mmq_mma_c(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1,
                                          const float c[4]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]),
                   "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

/* The raw paths' B fragments from 4 quants q < 128, a byte each of m: bf16 128 + q (exact:
 * 0x4300 | q), values k, k+1 in b0 and k+2, k+3 in b1. */
__device__ __forceinline__ void mmq_raw_b(uint32_t m, uint32_t &b0, uint32_t &b1) {
    b0 = __byte_perm(m, 0x43434343u, 0x4140);
    b1 = __byte_perm(m, 0x43434343u, 0x4342);
}
/* Q4_K's raw B fragments: the 4 quants of a unit's word (gi 0: low nibbles, 1: high). */
__device__ __forceinline__ void mmq_q4_raw(uint32_t w, int gi, uint32_t &b0, uint32_t &b1) {
    mmq_raw_b((gi ? w >> 4 : w) & 0x0F0F0F0Fu, b0, b1);
}
#define MMQ_BF16_ONES 0x3F803F80u /* two bf16 1.0: a B fragment that sums x's rows */

/* Q6_K's raw B fragments: run gi (0..3) of an item's words at one byte offset, the 4 q (0..63)
 * of ql's nibbles (a: runs 0 and 2, c: runs 1 and 3) and qh's 2-bit pairs (h)
 * (kq_q6_values' values, less its scale and offset). */
__device__ __forceinline__ void mmq_q6_raw(uint32_t a, uint32_t c, uint32_t h, int gi, uint32_t &b0,
                                           uint32_t &b1) {
    const uint32_t lo = gi & 1 ? c : a;
    const uint32_t nib = (gi & 2 ? lo >> 4 : lo) & 0x0F0F0F0Fu;
    const uint32_t hi = (gi == 0 ? h << 4 : gi == 1 ? h << 2 : gi == 2 ? h : h >> 2) & 0x30303030u;
    mmq_raw_b(nib | hi, b0, b1);
}

/* lo in the low 16 bits (the lower k slot of the pair). */
__device__ __forceinline__ uint32_t mmq_pack(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &h, sizeof u);
    return u;
}

/* The row offset of the 4 values quad lane q gives to step s of a row of type T (on the
 * host for the types whose kq<T>::goff is, kern_mmq_order). */
template <int T> __host__ __device__ __forceinline__ int mmq_k(int s, int q) {
    using Q = kq<T>;
    const int unit = 4 * (s / Q::G) + q;
    return unit / Q::UPB * Q::BLK + Q::goff(unit % Q::UPB, s % Q::G);
}

/* Types the kernel takes: a 256-value chunk is whole blocks (one byte range of a row), or
 * a Q6_K or Q3_K 8-block group's chunk, gathered from its pieces (mmq_src). */
template <int T> __host__ __device__ constexpr bool mmq_takes() {
    return T == KERN_TYPE_Q6_KX8 || T == KERN_TYPE_Q3_KX8 || kq<T>::BLK <= MMQ_STEPS * 16;
}
/* Bytes of one row's 256 values (a chunk) of type T as staged: Q6_KX8's are its ql low
 * and high runs and qh run of the chunk (64 bytes each), its 16 scale bytes and the
 * group's 8 d (16 bytes); Q3_KX8's its block's 64 qs and 32 hmask bytes, then the group's
 * 96 scale bytes and 8 d (16-byte pieces all). */
template <int T> __host__ __device__ constexpr int mmq_chunk_bytes() {
    if constexpr (T == KERN_TYPE_Q6_KX8)
        return 224;
    else if constexpr (T == KERN_TYPE_Q3_KX8)
        return 208;
    else
        return MMQ_STEPS * 16 / kq<T>::BLK * kq<T>::BYTES;
}
/* Where in a row byte o of chunk ch's staged bytes comes from. */
template <int T> __device__ __forceinline__ size_t mmq_src(int ch, int o) {
    if constexpr (T == KERN_TYPE_Q6_KX8) {
        const size_t g = (size_t)(ch >> 3) * KERN_Q6_KX8_BYTES;
        const int c = ch & 7;
        return g + (o < 192   ? (o >> 6) * 512 + 64 * c + (o & 63)
                    : o < 208 ? 1536 + 16 * c + (o - 192)
                              : 1664 + (o - 208));
    } else if constexpr (T == KERN_TYPE_Q3_KX8) {
        const size_t g = (size_t)(ch >> 3) * KERN_Q3_KX8_BYTES;
        const int c = ch & 7;
        return g + (o < 64 ? 64 * c + o : o < 96 ? 512 + 32 * c + (o - 64) : 768 + (o - 96));
    } else {
        return (size_t)ch * mmq_chunk_bytes<T>() + o;
    }
}
/* Unit u (0..15) of a staged Q6_KX8 chunk, chunk c (0..7) of its group: kq<KERN_TYPE_Q6_KX8>
 * unit 16 c + u read from the gathered pieces. */
__device__ __forceinline__ void mmq_q6x8_unit(const uint8_t *b, int c, int u, float (&v)[16]) {
    const int n = (u >> 3) & 1, l0 = (u & 7) * 4;
    kq_q6x8_item(b, b + 64, b + 128, b + 192, b + 208 + 2 * c, 2 * n + (l0 >> 4), l0 & 15, v);
}
/* Unit u (0..15) of a staged Q3_KX8 chunk, chunk c (0..7) of its group: kq<KERN_TYPE_Q3_KX8>
 * unit 16 c + u read from the gathered pieces. */
__device__ __forceinline__ void mmq_q3x8_unit(const uint8_t *b, int c, int u, float (&v)[16]) {
    const int l0 = (u & 7) * 4;
    kq_q3_k_values(kq_u32_a4(b + 32 * (u >> 3) + l0), kq_u32_a4(b + 64 + l0), b + 96 + 12 * c,
                   kq_f16(b + 192 + 2 * c), u, v);
}
/* One buffer of mmq_kernel<T, MT>'s shared memory: x's chunk, then the block's rows'
 * chunk; the kernel has two (the next chunk is copied while this one is multiplied). */
template <int T, int MT> __host__ __device__ constexpr size_t mmq_buf() {
    return (size_t)MT * 16 * MMQ_LD * 2 + (size_t)MMQ_FEATS * mmq_chunk_bytes<T>();
}
/* The raw paths' scale table, after the two buffers: per warp, its 32 features' (d sc,
 * 128 d sc + dmin m) of two of a chunk's 8 Q4_K sub-blocks at a time, or d sc of four of
 * a Q6_K chunk's 16 runs of 16 values (2 KB: with 8 KB, 32 rows' blocks fit 2 an SM
 * instead of 3, run 119) */
#define MMQ_RAW_TAB (MMQ_WARPS * 2 * 32 * 8)
template <int T, int MT, bool RAW> __host__ __device__ constexpr size_t mmq_smem() {
    return 2 * mmq_buf<T, MT>() + (RAW ? MMQ_RAW_TAB : 0);
}

/* Block (x, y): features [MMQ_FEATS (x - bx0[i]), +MMQ_FEATS) of the weight i whose blocks
 * hold x, steps [y spb[i], (y+1) spb[i]) of the row (none: y >= split[i]). split[i] 1:
 * y_i = acc + beta y_i; else part[y][row][f0[i] + feature] = acc, and the column's last
 * block to finish (a.cnt) writes y_i = beta y_i + the slices in slice order (or, a.cnt
 * NULL, mmq_reduce does). MINB: the blocks an SM its registers are held to; XP: x is in
 * the staging order already (mmq_permute_x).
 * Each chunk: the block's rows' bytes copied into shared memory (the unit decoders'
 * small scattered reads then hit shared memory, not L1) and x's chunk staged, both with
 * cp.async one chunk ahead of the one being decoded and multiplied. */
template <int T, int MT, bool UNR, bool RAW, int MINB, bool XP>
__global__ void __launch_bounds__(MMQ_WARPS * 32, MINB)
    mmq_kernel(const mmq_ws a, size_t row_bytes, int ne0, const __nv_bfloat16 *__restrict__ x,
               int n_rows, float beta, float *__restrict__ part) {
    using Q = kq<T>;
    /* this block's weight (constant indices: no copy of the parameters to local memory) */
    const uint8_t *__restrict__ w = a.w[0];
    float *__restrict__ y = a.y[0];
    int ne1 = a.ne1[0], bx0 = 0, pf0 = 0, split = a.split[0], spb = a.spb[0];
#pragma unroll
    for (int i = 1; i < MMQ_MAX_W; i++)
        if (i < a.n && (int)blockIdx.x >= a.bx0[i])
            w = a.w[i], y = a.y[i], ne1 = a.ne1[i], bx0 = a.bx0[i], pf0 = a.f0[i],
            split = a.split[i], spb = a.spb[i];
    if ((int)blockIdx.y >= split) return; /* whole blocks, before any barrier */
    if (split == 1) part = nullptr;
    const int n_part_cols = a.cols;
    constexpr int CB = mmq_chunk_bytes<T>();
    /* the raw paths' outer loop over a chunk's 4 parts: unrolled, except in the kernels
     * held to 3 blocks an SM, where unrolled they spill (and unbounded take 226-254
     * registers: 2 blocks an SM) */
    constexpr int OUTER = MINB > 1 ? 1 : 4;
    extern __shared__ __align__(16) uint8_t mmq_sm[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, q = lane & 3;
    const int n_steps = ne0 / 16;
    const int s0 = blockIdx.y * spb, s1 = min(n_steps, s0 + spb);
    const int fb = ((int)blockIdx.x - bx0) * MMQ_FEATS, f0 = fb + warp * (MMQ_NT * 8);
    const int n_ch = (s1 - s0 + MMQ_STEPS - 1) / MMQ_STEPS; /* this block's chunks */
    float acc[MT][MMQ_NT][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int t = 0; t < MMQ_NT; t++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[m][t][e] = 0.0f;
    /* buffer b: x's staged rows (MT * 16 of MMQ_LD bf16), then the weight rows (CB bytes) */
    auto xs_of = [&](int b) {
        return (__nv_bfloat16(*)[MMQ_LD])(mmq_sm + (size_t)b * mmq_buf<T, MT>());
    };
    auto ws_of = [&](int b) {
        return mmq_sm + (size_t)b * mmq_buf<T, MT>() + (size_t)MT * 16 * MMQ_LD * 2;
    };
    /* chunk k: steps [c0, c0 + ns), the bytes of its rows that exist, its index in a row */
    auto chunk = [&](int k, int &c0, int &ns, int &nbytes, int &ch) {
        c0 = s0 + k * MMQ_STEPS;
        ns = min(MMQ_STEPS, s1 - c0);
        /* a short last chunk is whole blocks (ns * 16 % BLK == 0; the groups' never short) */
        nbytes = ns == MMQ_STEPS ? CB : ns * 16 / Q::BLK * Q::BYTES;
        ch = c0 / MMQ_STEPS;
    };
    /* x's chunk k into buffer b with 4-byte cp.async (values k..k+3 of a quad lane are 8
     * aligned bytes): values k, k+1 at slots 2q, 2q+1, k+2, k+3 at slots 2q+8, 2q+9; or,
     * XP, from x laid out in that order already (mmq_permute_x): 16-byte pieces */
    auto stage_x = [&](int c0, int ns, int b) {
        __nv_bfloat16(*xs)[MMQ_LD] = xs_of(b);
        if constexpr (XP) {
            for (int it = threadIdx.x; it < MT * 16 * MMQ_STEPS * 2; it += MMQ_WARPS * 32) {
                const int pc = it & (2 * MMQ_STEPS - 1), r = it / (2 * MMQ_STEPS);
                const bool ok = r < n_rows && pc < 2 * ns;
                const __nv_bfloat16 *src = ok ? x + (size_t)r * ne0 + 16 * c0 + 8 * pc : x;
                mma_cp16(mma_smem_u32(&xs[r][8 * pc]), src, ok ? 16 : 0);
            }
        } else {
            for (int it = threadIdx.x; it < MT * 16 * MMQ_STEPS * 4; it += MMQ_WARPS * 32) {
                const int iq = it & 3, s = (it >> 2) & (MMQ_STEPS - 1), r = it >> 6;
                const bool ok = r < n_rows && s < ns;
                const __nv_bfloat16 *src = ok ? x + (size_t)r * ne0 + mmq_k<T>(c0 + s, iq) : x;
                const uint32_t d = mma_smem_u32(&xs[r][16 * s + 2 * iq]);
                mma_cp4(d, src, ok ? 4 : 0);
                mma_cp4(d + 16, src + 2, ok ? 4 : 0);
            }
        }
        mma_commit();
    };
    /* rows of 16-byte aligned chunks are copied asynchronously in 16-byte pieces a chunk
     * ahead; other rows synchronously in 2-byte pieces (x asynchronously either way) */
    const bool wide = CB % 16 == 0 && row_bytes % 16 == 0 && ((uintptr_t)w & 15) == 0;
    auto stage_async = [&](int k, int b) {
        int c0, ns, nbytes, ch;
        chunk(k, c0, ns, nbytes, ch);
        uint8_t *ws = ws_of(b);
        constexpr int PR = CB / 16; /* pieces a row */
        for (int p = threadIdx.x; p < MMQ_FEATS * PR; p += MMQ_WARPS * 32) {
            const int r = p / PR, o = (p % PR) * 16;
            const bool ok = o < nbytes && fb + r < ne1;
            const uint8_t *src = ok ? w + (size_t)(fb + r) * row_bytes + mmq_src<T>(ch, o) : w;
            mma_cp16(mma_smem_u32(ws + r * CB + o), src, ok ? 16 : 0);
        }
        stage_x(c0, ns, b); /* commits the chunk's copies as one group */
    };
    auto stage_sync = [&](int k) {
        int c0, ns, nbytes, ch;
        chunk(k, c0, ns, nbytes, ch);
        uint8_t *ws = ws_of(0);
        for (int p = threadIdx.x; p < MMQ_FEATS * (CB / 2); p += MMQ_WARPS * 32) {
            const int r = p / (CB / 2), o = (p % (CB / 2)) * 2;
            uint16_t v = 0;
            if (o < nbytes && fb + r < ne1)
                v = *(const uint16_t *)(w + (size_t)(fb + r) * row_bytes + mmq_src<T>(ch, o));
            *(uint16_t *)(ws + r * CB + o) = v;
        }
        stage_x(c0, ns, 0);
        mma_wait<0>();
    };
    /* the chunk in buffer b multiplied: one unit of each tile's row per G steps (units
     * counted from the chunk's start); a whole chunk fully unrolled up to 2 m-tiles, so
     * the units of one block share their scale loads */
    auto compute = [&](int k, int b) {
        int c0, ns, nbytes, ch;
        chunk(k, c0, ns, nbytes, ch);
        const uint8_t *ws = ws_of(b);
        /* ldmatrix row address of this lane: row l % 16, k half l / 16 */
        const uint32_t a_base = mma_smem_u32(&xs_of(b)[lane & 15][(lane >> 4) * 8]);
        if constexpr (RAW && T == KERN_TYPE_Q6_KX8) {
            /* Q6_K's groups, one block a chunk: the quants go to the tensor cores as bf16
             * 128 + q; step s (16 values) of a feature is run s of its block, scale d sc[s],
             * so its sums are d sc[s] (S - 160 X) with S = sum x (128 + q) and X = sum x
             * (a B fragment of ones): the mma starts from -160 X and one fma a value scales
             * it. Step s = 4 i + gi reads item i's words at byte 4 q of the A, C and H runs
             * (kq_q6x8_item's l = i, j = 4 q) and scale byte s. */
            float *tab = (float *)(mmq_sm + 2 * mmq_buf<T, MT>()) + warp * 128;
            const uint8_t *mine = ws + (warp * (MMQ_NT * 8) + lane) * CB; /* lane's feature */
            const float d = kq_f16(mine + 208 + 2 * (ch & 7));
#pragma unroll OUTER
            for (int i = 0; i < 4; i++) {
                __syncwarp(); /* the last table is read */
                const uint32_t sw = *(const uint32_t *)(mine + 192 + 4 * i);
#pragma unroll
                for (int gi = 0; gi < 4; gi++)
                    tab[gi * 32 + lane] = d * (float)(int8_t)(sw >> (8 * gi));
                __syncwarp();
                uint32_t wa[MMQ_NT], wc[MMQ_NT], wh[MMQ_NT];
#pragma unroll
                for (int t = 0; t < MMQ_NT; t++) {
                    const uint8_t *row = ws + (warp * (MMQ_NT * 8) + 8 * t + g) * CB + 16 * i + 4 * q;
                    wa[t] = *(const uint32_t *)row;
                    wc[t] = *(const uint32_t *)(row + 64);
                    wh[t] = *(const uint32_t *)(row + 128);
                }
#pragma unroll
                for (int gi = 0; gi < 4; gi++) {
                    uint32_t bw[MMQ_NT][2];
#pragma unroll
                    for (int t = 0; t < MMQ_NT; t++)
                        mmq_q6_raw(wa[t], wc[t], wh[t], gi, bw[t][0], bw[t][1]);
#pragma unroll
                    for (int m = 0; m < MT; m++) {
                        uint32_t a[4];
                        mma_ldsm4(a, a_base + (uint32_t)((m * 16 * MMQ_LD + 16 * (4 * i + gi)) * 2));
                        float X[4], C[4];
                        mmq_mma0(X, a, MMQ_BF16_ONES, MMQ_BF16_ONES);
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            C[e] = -160.0f * X[e];
#pragma unroll
                        for (int t = 0; t < MMQ_NT; t++) {
                            float S[4];
                            mmq_mma_c(S, a, bw[t][0], bw[t][1], C);
                            /* accumulator e: feature 2 q + (e & 1) of tile t */
                            const float2 sv = *(const float2 *)&tab[gi * 32 + 8 * t + 2 * q];
#pragma unroll
                            for (int e = 0; e < 4; e++)
                                acc[m][t][e] = fmaf((e & 1) ? sv.y : sv.x, S[e], acc[m][t][e]);
                        }
                    }
                }
            }
            return;
        } else if constexpr (RAW) {
            /* Q4_K, one block a chunk: the quants go to the tensor cores as bf16 128 + q and
             * the scales are applied to each sub-block's sums: for sub-block j of feature f,
             * sum x w = d sc S - (128 d sc + dmin m) X with S = sum x (128 + q) and X = sum x
             * (a B fragment of ones), both from mma; w is exact, x bf16 as elsewhere */
            float2 *tab = (float2 *)(mmq_sm + 2 * mmq_buf<T, MT>()) + warp * 64;
            const uint8_t *mine = ws + (warp * (MMQ_NT * 8) + lane) * CB; /* lane's feature */
            const float d = kq_f16(mine), dmin = kq_f16(mine + 2);
#pragma unroll OUTER
            for (int c = 0; c < 4; c++) {
                __syncwarp(); /* the last table is read */
#pragma unroll
                for (int gi = 0; gi < 2; gi++) {
                    int sc, mn;
                    kq_scale_min_k4(2 * c + gi, mine + 4, &sc, &mn);
                    const float dsc = d * (float)sc;
                    tab[gi * 32 + lane] = make_float2(dsc, fmaf(128.0f, dsc, dmin * (float)mn));
                }
                __syncwarp();
#pragma unroll
                for (int gi = 0; gi < 2; gi++) {
                    float S[MT][MMQ_NT][4], X[MT][4];
#pragma unroll
                    for (int ii = 0; ii < 2; ii++) {
                        /* step 2 i + gi of unit 4 i + q, i = 2 c + ii: word 16 ii + 4 q of the
                         * 32 quant bytes of sub-blocks 2c, 2c+1 */
                        const int st = 2 * (2 * c + ii) + gi;
                        uint32_t bw[MMQ_NT][2];
#pragma unroll
                        for (int t = 0; t < MMQ_NT; t++) {
                            const uint8_t *row = ws + (warp * (MMQ_NT * 8) + 8 * t + g) * CB;
                            mmq_q4_raw(*(const uint32_t *)(row + 16 + 32 * c + 16 * ii + 4 * q), gi,
                                       bw[t][0], bw[t][1]);
                        }
#pragma unroll
                        for (int m = 0; m < MT; m++) {
                            uint32_t a[4];
                            mma_ldsm4(a, a_base + (uint32_t)((m * 16 * MMQ_LD + 16 * st) * 2));
                            if (ii == 0) {
#pragma unroll
                                for (int t = 0; t < MMQ_NT; t++)
                                    mmq_mma0(S[m][t], a, bw[t][0], bw[t][1]);
                                mmq_mma0(X[m], a, MMQ_BF16_ONES, MMQ_BF16_ONES);
                            } else {
#pragma unroll
                                for (int t = 0; t < MMQ_NT; t++)
                                    mmq_mma(S[m][t], a, bw[t][0], bw[t][1]);
                                mmq_mma(X[m], a, MMQ_BF16_ONES, MMQ_BF16_ONES);
                            }
                        }
                    }
                    /* sub-block 2 c + gi; accumulator e: feature 2 q + (e & 1) of tile t */
#pragma unroll
                    for (int t = 0; t < MMQ_NT; t++) {
                        const float4 sv = *(const float4 *)&tab[gi * 32 + 8 * t + 2 * q];
#pragma unroll
                        for (int m = 0; m < MT; m++)
#pragma unroll
                            for (int e = 0; e < 4; e++) {
                                const float dsc = (e & 1) ? sv.z : sv.x, dmp = (e & 1) ? sv.w : sv.y;
                                acc[m][t][e] = fmaf(-dmp, X[m][e], fmaf(dsc, S[m][t][e], acc[m][t][e]));
                            }
                    }
                }
            }
            return;
        }
        auto units = [&](int s) {
            const int unit = 4 * (s / Q::G) + q;
            const int blk = unit / Q::UPB, u = unit % Q::UPB;
            uint32_t bf[MMQ_NT][Q::G][2];
#pragma unroll
            for (int t = 0; t < MMQ_NT; t++) {
                float v[4 * Q::G];
                int off[Q::G];
                const uint8_t *row = ws + (warp * (MMQ_NT * 8) + 8 * t + g) * CB;
                if constexpr (T == KERN_TYPE_Q6_KX8)
                    mmq_q6x8_unit(row, ch & 7, unit, v);
                else if constexpr (T == KERN_TYPE_Q3_KX8)
                    mmq_q3x8_unit(row, ch & 7, unit, v);
                else
                    Q::unit(row + blk * Q::BYTES, u, v, off);
#pragma unroll
                for (int gi = 0; gi < Q::G; gi++) {
                    bf[t][gi][0] = mmq_pack(v[4 * gi], v[4 * gi + 1]);
                    bf[t][gi][1] = mmq_pack(v[4 * gi + 2], v[4 * gi + 3]);
                }
            }
#pragma unroll
            for (int gi = 0; gi < Q::G; gi++)
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    uint32_t a[4];
                    mma_ldsm4(a, a_base + (uint32_t)((m * 16 * MMQ_LD + 16 * (s + gi)) * 2));
#pragma unroll
                    for (int t = 0; t < MMQ_NT; t++)
                        mmq_mma(acc[m][t], a, bf[t][gi][0], bf[t][gi][1]);
                }
        };
        if (UNR && ns == MMQ_STEPS) {
#pragma unroll
            for (int s = 0; s < MMQ_STEPS; s += Q::G)
                units(s);
        } else {
            for (int s = 0; s < ns; s += Q::G)
                units(s);
        }
    };

    if (wide) {
        if (n_ch > 0) stage_async(0, 0);
        for (int k = 0; k < n_ch; k++) {
            if (k + 1 < n_ch) { /* buffer k+1 & 1 was last read in step k - 1 (barrier below) */
                stage_async(k + 1, (k + 1) & 1);
                mma_wait<1>();
            } else {
                mma_wait<0>();
            }
            __syncthreads(); /* chunk k's copies from every thread have landed */
            compute(k, k & 1);
            __syncthreads(); /* chunk k's buffer is read before step k + 1 refills it */
        }
    } else {
        for (int k = 0; k < n_ch; k++) {
            stage_sync(k);
            __syncthreads();
            compute(k, 0);
            __syncthreads();
        }
    }
    /* c0, c1: row g, features 2q, 2q+1 of the tile; c2, c3: row g + 8 */
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int t = 0; t < MMQ_NT; t++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = m * 16 + g + (e >> 1) * 8, f = f0 + 8 * t + 2 * q + (e & 1);
                if (r >= n_rows || f >= ne1) continue;
                if (part) {
                    part[((size_t)blockIdx.y * n_rows + r) * n_part_cols + pf0 + f] = acc[m][t][e];
                } else {
                    const size_t at = (size_t)r * ne1 + f;
                    y[at] = beta != 0.0f ? y[at] + acc[m][t][e] : acc[m][t][e];
                }
            }
    if (!part || !a.cnt) return;
    /* the column's last block: every block's slice written (each thread's stores fenced
     * before the count), the sums in mmq_reduce's order, the counter zeroed for the next
     * launch */
    __threadfence();
    __syncthreads();
    int done = 0;
    if (threadIdx.x == 0) {
        done = atomicAdd(&a.cnt[blockIdx.x], 1) == split - 1;
        if (done) a.cnt[blockIdx.x] = 0;
    }
    if (!__syncthreads_or(done)) return;
    __threadfence();
    /* each thread's two items' slices loaded 4 at a time before any of them is added
     * (loads in flight together: the sums' latency is this block's tail), added in slice
     * order */
    const int nf = min(MMQ_FEATS, ne1 - fb);
    const size_t slice = (size_t)n_rows * n_part_cols;
    if (((nf | ne1 | n_part_cols | pf0) & 3) == 0 && ((uintptr_t)y & 15) == 0) {
        const int nv = nf / 4, n_items = n_rows * nv; /* 4 features an item */
        for (int i0 = threadIdx.x; i0 < n_items; i0 += 2 * MMQ_WARPS * 32) {
            const int i1 = i0 + MMQ_WARPS * 32, two = i1 < n_items;
            const float *p0f = part + pf0 + fb;
            const float4 *pp[2] = {
                (const float4 *)(p0f + (size_t)(i0 / nv) * n_part_cols + 4 * (i0 % nv)),
                (const float4 *)(p0f + (size_t)(i1 / nv) * n_part_cols + 4 * (i1 % nv))};
            float4 *at[2] = {(float4 *)(y + (size_t)(i0 / nv) * ne1 + fb + 4 * (i0 % nv)),
                             (float4 *)(y + (size_t)(i1 / nv) * ne1 + fb + 4 * (i1 % nv))};
            float4 s[2];
#pragma unroll
            for (int j = 0; j < 2; j++)
                s[j] = beta != 0.0f && (j == 0 || two) ? *at[j] : make_float4(0.f, 0.f, 0.f, 0.f);
            for (int p0 = 0; p0 < split; p0 += 4) {
                float4 v[2][4];
#pragma unroll
                for (int j = 0; j < 2; j++)
#pragma unroll
                    for (int p = 0; p < 4; p++)
                        if (p0 + p < split && (j == 0 || two))
                            v[j][p] = __ldcg(pp[j] + (p0 + p) * (slice / 4));
#pragma unroll
                for (int j = 0; j < 2; j++)
#pragma unroll
                    for (int p = 0; p < 4; p++)
                        if (p0 + p < split) {
                            s[j].x += v[j][p].x;
                            s[j].y += v[j][p].y;
                            s[j].z += v[j][p].z;
                            s[j].w += v[j][p].w;
                        }
            }
            *at[0] = s[0];
            if (two) *at[1] = s[1];
        }
        return;
    }
    for (int i = threadIdx.x; i < n_rows * nf; i += MMQ_WARPS * 32) {
        const int r = i / nf, f = fb + i % nf;
        const size_t at = (size_t)r * ne1 + f;
        const float *pp = part + (size_t)r * n_part_cols + pf0 + f;
        float s = beta != 0.0f ? y[at] : 0.0f;
        for (int p0 = 0; p0 < split; p0 += 4) {
            float v[4];
#pragma unroll
            for (int p = 0; p < 4; p++)
                if (p0 + p < split) v[p] = __ldcg(pp + (p0 + p) * slice);
#pragma unroll
            for (int p = 0; p < 4; p++)
                if (p0 + p < split) s += v[p];
        }
        y[at] = s;
    }
}

/* y_i = beta y_i + the sum over the split[i] slices of part (n_rows x cols values each,
 * weight i's columns at f0[i]), in slice order, for the weights with split[i] > 1. */
__global__ void mmq_reduce(const mmq_ws a, const float *__restrict__ part, int n_rows,
                           float beta) {
    const int cols = a.cols;
    const size_t n = (size_t)n_rows * cols;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const int r = (int)(i / cols), c = (int)(i % cols);
        float *y = a.y[0];
        int ne1 = a.ne1[0], f0 = 0, n_part = a.split[0];
#pragma unroll
        for (int k = 1; k < MMQ_MAX_W; k++)
            if (k < a.n && c >= a.f0[k])
                y = a.y[k], ne1 = a.ne1[k], f0 = a.f0[k], n_part = a.split[k];
        if (n_part == 1) continue; /* written by mmq_kernel */
        float *at = y + (size_t)r * ne1 + (c - f0);
        float s = beta != 0.0f ? *at : 0.0f;
        for (int p = 0; p < n_part; p++)
            s += part[(size_t)p * n + i];
        *at = s;
    }
}

/* xp = x (n_rows rows of ne0 f32, 16-byte aligned) rounded to bf16 (as kern_f32_to_bf16
 * rounds) with each 16-value step's values in the order mmq_kernel<T> stages them
 * (stage_x): step S of a row at xp[16 S ..], quad lane q's values mmq_k<T>(S, q) + 0, 1
 * at slots 2q, 2q+1 and + 2, 3 at 2q+8, 2q+9. */
template <int T>
__global__ void mmq_permute_x(const float *__restrict__ x, __nv_bfloat16 *__restrict__ xp,
                              int ne0, int n_rows) {
    const int per_row = ne0 / 4; /* (step, quad lane) items a row */
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n_rows * per_row;
         i += gridDim.x * blockDim.x) {
        const int r = i / per_row, j = i % per_row, S = j >> 2, q = j & 3;
        const float4 v = *(const float4 *)(x + (size_t)r * ne0 + mmq_k<T>(S, q));
        const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y);
        const __nv_bfloat162 hi = __floats2bfloat162_rn(v.z, v.w);
        __nv_bfloat16 *dst = xp + (size_t)r * ne0 + 16 * S + 2 * q;
        *(__nv_bfloat162 *)dst = lo;
        *(__nv_bfloat162 *)(dst + 8) = hi;
    }
}

/* One launch of mmq_kernel (and mmq_reduce where k is split) for kern_mmq_n's weights:
 * x read permuted (mmq_permute_x, made here) where the kernel takes that, else as *x16
 * (made here from x where NULL). MINB: the blocks an SM its registers are held to. */
template <int T, int MT, int MINB>
static void mmq_launch(struct ops_ctx *ctx, int n_w, const struct tpi_weight *const *ws,
                       const float *x, const __nv_bfloat16 **x16, float *const *ys, int n_rows,
                       float beta, const char *op) {
    const int ne0 = (int)ws[0]->ne0;
    const int n_steps = ne0 / 16, n_chunks = (n_steps + MMQ_STEPS - 1) / MMQ_STEPS;
    mmq_ws a;
    memset(&a, 0, sizeof a);
    a.n = n_w;
    for (int i = 0; i < n_w; i++) {
        a.w[i] = (const uint8_t *)ws[i]->data;
        a.y[i] = ys[i];
        a.ne1[i] = (int)ws[i]->ne1;
        a.bx0[i + 1] = a.bx0[i] + (a.ne1[i] + MMQ_FEATS - 1) / MMQ_FEATS;
        a.f0[i + 1] = a.f0[i] + a.ne1[i];
    }
    a.cols = a.f0[n_w];
    const int bx = a.bx0[n_w];
    /* Q4_K's and Q6_K's groups' raw paths up to 32 rows (TPI_MMQ_RAW, default both) */
    constexpr bool RAW_OK = (T == TPI_TYPE_Q4_K || T == KERN_TYPE_Q6_KX8) &&
                            MT <= 2; /* 3-4 m-tiles: 200-255 registers */
    const bool raw =
        RAW_OK && (ctx->mmq_raw & (T == TPI_TYPE_Q4_K ? MMQ_RAW_Q4_K : MMQ_RAW_Q6_KX8)) != 0;
    const size_t smem = raw ? mmq_smem<T, MT, RAW_OK>() : mmq_smem<T, MT, false>();
    static bool smem_set[3] = {false, false, false}; /* the opt-in, once a kernel */
    /* a chunk's units unrolled up to 32 rows; with 3-4 m-tiles the unrolled kernel's
     * registers (Q4_K: 224) leave 2 blocks an SM and the loop is faster (run 115) */
    constexpr bool UNR = MT <= 2;
    /* the raw kernels read x permuted (TPI_MMQ_XP, default on) */
    const bool xp = RAW_OK && raw && ctx->mmq_xp && ((uintptr_t)x & 15) == 0;
    auto kern = xp    ? mmq_kernel<T, MT, UNR, RAW_OK, MINB, RAW_OK>
                : raw ? mmq_kernel<T, MT, UNR, RAW_OK, MINB, false>
                      : mmq_kernel<T, MT, UNR, false, MINB, false>;
    if (!smem_set[raw + xp]) {
        if (!CUDA_OK(
                ctx, op,
                cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)))
            return;
        smem_set[raw + xp] = true;
    }
    int bps = ctx->mmq_bps;
    if (bps <= 0) { /* the blocks a multiprocessor holds (queried once a kernel) */
        static int resident[3] = {0, 0, 0};
        if (!resident[raw + xp]) {
            int nb = 0;
            if (!CUDA_OK(ctx, op,
                         cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, kern, MMQ_WARPS * 32,
                                                                       smem)))
                return;
            resident[raw + xp] = TPI_MAX(1, nb);
        }
        bps = resident[raw + xp];
    }
    /* each weight's k split over y blocks until its own blocks alone are about
     * ctx->mmq_bps (3) a multiprocessor (0: the resident slots once), each >= one chunk */
    int split = 1;
    for (int i = 0; i < n_w; i++) {
        const int bxi = a.bx0[i + 1] - a.bx0[i];
        int si = (bps * ctx->n_sm + bxi - 1) / bxi;
        si = TPI_MAX(1, TPI_MIN(TPI_MIN(si, n_chunks), MMQ_MAX_SPLIT));
        const int cpb = (n_chunks + si - 1) / si;
        a.split[i] = (n_chunks + cpb - 1) / cpb;
        a.spb[i] = cpb * MMQ_STEPS;
        split = TPI_MAX(split, a.split[i]);
    }
    float *part = NULL;
    if (split > 1) {
        part = (float *)kern_scratch_get(
            ctx, &ctx->mmq_part, (size_t)split * n_rows * a.f0[n_w] * sizeof(float), op);
        if (!part) return;
        /* the slices added by each column's last block where they are few enough that
         * one block adds them soon (TPI_MMQ_FIXUP KiB a column) */
        if ((size_t)split * n_rows * MMQ_FEATS * sizeof(float) <= (size_t)ctx->mmq_fixup * 1024) {
            struct kern_scratch *c = &ctx->mmq_cnt;
            const size_t had = c->n_bytes;
            a.cnt = (int *)kern_scratch_get(ctx, c, (size_t)bx * sizeof(int), op);
            if (!a.cnt) return;
            if (c->n_bytes != had && /* a new buffer: its counters zeroed */
                !CUDA_OK(ctx, op, cudaMemsetAsync(a.cnt, 0, c->n_bytes, ctx->stream)))
                return;
        }
    }
    const __nv_bfloat16 *xk = *x16;
    /* the producer of x (rmsnorm, silu*mul) may have written it in this order already
     * (kern_xp_claim), which it does once a product here has read it so */
    const int form = T == TPI_TYPE_Q4_K ? MMQ_RAW_Q4_K : MMQ_RAW_Q6_KX8;
    const __nv_bfloat16 *held = NULL;
    if (xp) {
        ctx->xp_seen |= form;
        held = kern_xp_held(ctx, x, (int64_t)n_rows * ne0, form);
    }
    if (held) {
        xk = held;
    } else if (xp || !xk) {
        struct kern_scratch *sc = xp ? &ctx->mmq_xp_buf : &ctx->x16;
        __nv_bfloat16 *t = (__nv_bfloat16 *)kern_scratch_get(
            ctx, sc, (size_t)n_rows * ne0 * sizeof(__nv_bfloat16), op);
        if (!t) return;
        if constexpr (RAW_OK) {
            if (xp) {
                ctx->xp_memo.forms = 0; /* its buffer is written over */
                const int items = n_rows * ne0 / 4;
                mmq_permute_x<T><<<(unsigned)TPI_MIN((items + 255) / 256, ctx->n_sm * 8), 256,
                                   0, ctx->stream>>>(x, t, ne0, n_rows);
                if (!LAUNCH_OK(ctx, op)) return;
            }
        }
        if (!xp) {
            kern_f32_to_bf16(ctx, x, t, (int64_t)n_rows * ne0);
            *x16 = t;
        }
        xk = t;
    }
    kern<<<dim3((unsigned)bx, (unsigned)split), MMQ_WARPS * 32, smem, ctx->stream>>>(
        a, ws[0]->row_bytes, ne0, xk, n_rows, beta, part);
    if (!LAUNCH_OK(ctx, op) || split == 1 || a.cnt) return;
    const size_t n = (size_t)n_rows * a.f0[n_w];
    const unsigned nb = (unsigned)TPI_MIN((n + 255) / 256, (size_t)ctx->n_sm * 8);
    mmq_reduce<<<nb, 256, 0, ctx->stream>>>(a, part, n_rows, beta);
    LAUNCH_OK(ctx, op);
}

bool kern_mmq_n(struct ops_ctx *ctx, int n_w, const struct tpi_weight *const *ws, const float *x,
                const __nv_bfloat16 **x16, float *const *ys, int64_t n_rows, float beta) {
    const char *op = "cuda matmul (mmq)";
    if (n_w < 1 || n_w > MMQ_MAX_W || n_rows < 1 || n_rows > ctx->mmq_rows ||
        n_rows > MMQ_MAX_ROWS || ws[0]->ne0 > INT32_MAX)
        return false;
    const int type = kern_wtype(ws[0]);
    int64_t cols = 0;
    for (int i = 0; i < n_w; i++) {
        if (kern_wtype(ws[i]) != type || ws[i]->ne0 != ws[0]->ne0 ||
            ws[i]->row_bytes != ws[0]->row_bytes)
            return false;
        cols += ws[i]->ne1;
    }
    if (cols > INT32_MAX) return false;
    const int nr = (int)n_rows;
    bool done = false;
    kq_dispatch(type, [&](auto type_c, auto block_c) {
        constexpr int T = decltype(type_c)::value;
        if constexpr (decltype(block_c)::value) {
            /* rows of whole blocks (a unit's 4 values are then aligned) */
            if constexpr (mmq_takes<T>()) {
                if (ws[0]->ne0 % kq<T>::BLK != 0) return;
                /* the raw paths' types up to 32 rows held to 3 blocks an SM (168
                 * registers; unbounded, 2 an SM: TPI_MMQ_HOLD's bit clear; 16 rows held
                 * to 4 were slower, bench/NOTES.md change 156) */
                constexpr bool K = T == TPI_TYPE_Q4_K || T == KERN_TYPE_Q6_KX8;
                const bool hold =
                    K && (ctx->mmq_hold & (T == TPI_TYPE_Q4_K ? MMQ_RAW_Q4_K : MMQ_RAW_Q6_KX8));
                if (nr <= 16 && hold)
                    mmq_launch<T, 1, K ? 3 : 1>(ctx, n_w, ws, x, x16, ys, nr, beta, op);
                else if (nr <= 16)
                    mmq_launch<T, 1, 1>(ctx, n_w, ws, x, x16, ys, nr, beta, op);
                else if (nr <= 32 && hold)
                    mmq_launch<T, 2, K ? 3 : 1>(ctx, n_w, ws, x, x16, ys, nr, beta, op);
                else if (nr <= 32)
                    mmq_launch<T, 2, 1>(ctx, n_w, ws, x, x16, ys, nr, beta, op);
                else if (nr <= 48)
                    mmq_launch<T, 3, 1>(ctx, n_w, ws, x, x16, ys, nr, beta, op);
                else
                    mmq_launch<T, 4, 1>(ctx, n_w, ws, x, x16, ys, nr, beta, op);
                done = true;
            }
        }
    });
    return done;
}

/* Host side, for the tests (C linkage): form 1 (Q4_K) or 2 (Q6_K's groups): with k >= 0,
 * the place kern_xp_q4k / kern_xp_q6k give value k of x (the producers' stores); with k <
 * 0, the row offset mmq_k gives quad lane q of step s (the order the raw kernels stage x
 * in, and mmq_permute_x writes), plus value j (0..3) of the lane's four; -1 for another
 * form. */
extern "C" long long kern_mmq_order(int form, long long k, int s, int q, int j) {
    if (form != MMQ_RAW_Q4_K && form != MMQ_RAW_Q6_KX8) return -1;
    if (k >= 0) return form == MMQ_RAW_Q4_K ? kern_xp_q4k(k) : kern_xp_q6k(k);
    return (form == MMQ_RAW_Q4_K ? mmq_k<TPI_TYPE_Q4_K>(s, q) : mmq_k<KERN_TYPE_Q6_KX8>(s, q)) + j;
}

bool kern_mmq(struct ops_ctx *ctx, const struct tpi_weight *w, const float *x,
              const __nv_bfloat16 **x16, float *y, int64_t n_rows, float beta) {
    return kern_mmq_n(ctx, 1, &w, x, x16, &y, n_rows, beta);
}
