/*
 * kern_attn.cu — causal attention over the f16 KV cache, for prefill and decode.
 *
 * 1. store: k, v of the batch's tokens go into the cache at (seq[t], pos[t]).
 * 2. flash-style kernel: one block per (token, KV head[, head chunk], split). The
 *    query heads that share a KV head (GQA) sit in the same block and share each
 *    tile of TK keys/values loaded into shared memory; every warp owns up to
 *    HEADS_PER_WARP of those heads and keeps an online softmax (running max m,
 *    running sum l, unnormalized accumulator acc) in registers.
 * 3. split-K: when (tokens x KV heads) blocks cannot fill the GPU and the context is
 *    long (decode), the key range of each token is split over n_split blocks that
 *    write partial (m, l, acc); a combine kernel merges them:
 *    M = max m_s, out = sum acc_s e^(m_s-M) / sum l_s e^(m_s-M).
 * Correct for any depth and batch mix. Head dims 64 and 128 on a 16-byte aligned
 * cache normally take the tensor-core kernels of kern_attn_mma.cu instead (prefill and
 * decode; TPI_ATTN_MMA=0 turns them off); the kernels here serve every other shape.
 */
#include <math.h>

#include "kern_common.cuh"

#define ATTN_WARPS 4
#define HEADS_PER_WARP 4
#define ATTN_MAX_HEADS (ATTN_WARPS * HEADS_PER_WARP) /* query heads per block */
#define ATTN_MAX_HEAD_DIM 256
#define ATTN_DIM_SLOTS (ATTN_MAX_HEAD_DIM / 32) /* head_dim values per lane */
#define ATTN_MAX_SPLIT 128
#define ATTN_SMEM_OPTIN (112 * 1024)

/* ---------------------------------------------------------------- kernels */

/* grid (n_tokens); copy token t's k and v rows (n_kv * hd floats) into the cache as f16. */
__global__ void attn_store_kernel(__half *kc, __half *vc, const float *k, const float *v,
                                  const int32_t *seq, const int32_t *pos, int n_slot, int n_ctx,
                                  int row) {
    const int t = blockIdx.x;
    const int s = seq[t], p = pos[t];
    if (s < 0 || s >= n_slot || p < 0 || p >= n_ctx) return;
    const size_t dst = ((size_t)s * n_ctx + p) * row;
    for (int i = threadIdx.x; i < row; i += blockDim.x) {
        kc[dst + i] = __float2half_rn(k[(size_t)t * row + i]);
        vc[dst + i] = __float2half_rn(v[(size_t)t * row + i]);
    }
}

struct attn_args {
    const float *q;        /* (n_tokens, n_head, hd) */
    const __half *kc, *vc; /* this layer's cache: (n_slot, n_ctx, n_kv, hd) */
    const int32_t *seq, *pos;
    float *out;  /* (n_tokens, n_head, hd), when n_split == 1 */
    float *part; /* (n_tokens, n_head, n_split, hd + 2): m, l, acc */
    int n_slot, n_ctx, n_kv, n_head, hd;
    int group; /* query heads per KV head */
    int heads_per_block, head_chunks, n_split, tile;
    float scale;
};

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float warp_sum_a(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* grid (n_tokens, n_kv * head_chunks, n_split), ATTN_WARPS warps. Dynamic shared memory:
 * q (heads_per_block x hd f32, pre-scaled), K tile (tile x (hd+2) f16: the +2 pad puts
 * consecutive keys in different banks), V tile (tile x hd f16), p (per warp, tile f32). */
__global__ void __launch_bounds__(ATTN_WARPS * 32) attn_kernel(const attn_args a) {
    extern __shared__ float4 smem4[];
    float *q_s = (float *)smem4;
    const int hd = a.hd, ks = hd + 2, tile = a.tile;
    __half *k_s = (__half *)(q_s + a.heads_per_block * hd);
    __half *v_s = k_s + tile * ks;
    float *p_s = (float *)(v_s + tile * hd);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *p_w = p_s + warp * tile;

    const int t = blockIdx.x, kvh = blockIdx.y / a.head_chunks;
    const int h0 = kvh * a.group + (blockIdx.y % a.head_chunks) * a.heads_per_block;
    const int split = blockIdx.z;
    const int s = a.seq[t], p = a.pos[t];
    const bool valid = s >= 0 && s < a.n_slot && p >= 0 && p < a.n_ctx;

    /* this split's key range [k_begin, k_end), tile-aligned so splits never overlap */
    const int n_keys = valid ? p + 1 : 0;
    int chunk = (n_keys + a.n_split - 1) / a.n_split;
    chunk = (chunk + tile - 1) / tile * tile;
    const int k_begin = split * chunk;
    const int k_end = min(n_keys, k_begin + chunk);

    for (int i = threadIdx.x; i < a.heads_per_block * hd; i += blockDim.x)
        q_s[i] = a.q[((size_t)t * a.n_head + h0) * hd + i] * a.scale;

    float m[HEADS_PER_WARP], l[HEADS_PER_WARP], acc[HEADS_PER_WARP][ATTN_DIM_SLOTS];
#pragma unroll
    for (int i = 0; i < HEADS_PER_WARP; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int dd = 0; dd < ATTN_DIM_SLOTS; dd++)
            acc[i][dd] = 0.0f;
    }

    const size_t row = (size_t)a.n_kv * hd; /* halves per (slot, position) */
    const __half *kbase = a.kc + (size_t)(valid ? s : 0) * a.n_ctx * row + (size_t)kvh * hd;
    const __half *vbase = a.vc + (size_t)(valid ? s : 0) * a.n_ctx * row + (size_t)kvh * hd;
    const int half_hd = hd / 2;

    for (int kt = k_begin; kt < k_end; kt += tile) {
        const int nk = min(tile, k_end - kt);
        __syncthreads(); /* the previous tile is no longer read (and q_s is written) */
        for (int i = threadIdx.x; i < nk * half_hd; i += blockDim.x) {
            const int j = i / half_hd, d2 = i % half_hd;
            const size_t src = (size_t)(kt + j) * row;
            ((__half2 *)(k_s + j * ks))[d2] = ((const __half2 *)(kbase + src))[d2];
            ((__half2 *)(v_s + j * hd))[d2] = ((const __half2 *)(vbase + src))[d2];
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < HEADS_PER_WARP; i++) {
            const int hh = warp + ATTN_WARPS * i;
            if (hh >= a.heads_per_block) break; /* uniform per warp */
            const float *qh = q_s + hh * hd;
            /* scores of keys lane, lane+32, ... of the tile (tile <= 64: two per lane) */
            float sc[2];
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int j = lane + 32 * c;
                sc[c] = -INFINITY;
                if (j < nk) {
                    const __half2 *kj = (const __half2 *)(k_s + j * ks);
                    float dot = 0.0f;
                    for (int d2 = 0; d2 < half_hd; d2++) {
                        const float2 kf = __half22float2(kj[d2]);
                        dot += qh[2 * d2] * kf.x + qh[2 * d2 + 1] * kf.y;
                    }
                    sc[c] = dot;
                }
            }
            const float m_new = fmaxf(m[i], warp_max(fmaxf(sc[0], sc[1])));
            const float corr = expf(m[i] - m_new); /* 0 on the first tile (m = -inf) */
            float psum = 0.0f;
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int j = lane + 32 * c;
                const float pj = j < nk ? expf(sc[c] - m_new) : 0.0f;
                if (j < tile) p_w[j] = pj;
                psum += pj;
            }
            l[i] = l[i] * corr + warp_sum_a(psum);
            m[i] = m_new;
            __syncwarp();
#pragma unroll
            for (int dd = 0; dd < ATTN_DIM_SLOTS; dd++) {
                const int d = lane + 32 * dd;
                if (d < hd) {
                    float o = acc[i][dd] * corr;
                    for (int j = 0; j < nk; j++)
                        o += p_w[j] * __half2float(v_s[j * hd + d]);
                    acc[i][dd] = o;
                }
            }
            __syncwarp(); /* p_w is rewritten by the next head */
        }
    }

#pragma unroll
    for (int i = 0; i < HEADS_PER_WARP; i++) {
        const int hh = warp + ATTN_WARPS * i;
        if (hh >= a.heads_per_block) break;
        const size_t th = (size_t)t * a.n_head + h0 + hh;
        if (a.n_split == 1) {
            const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
#pragma unroll
            for (int dd = 0; dd < ATTN_DIM_SLOTS; dd++) {
                const int d = lane + 32 * dd;
                if (d < hd) a.out[th * hd + d] = acc[i][dd] * inv;
            }
        } else {
            float *pp = a.part + (th * a.n_split + split) * (size_t)(hd + 2);
            if (lane == 0) {
                pp[0] = m[i];
                pp[1] = l[i];
            }
#pragma unroll
            for (int dd = 0; dd < ATTN_DIM_SLOTS; dd++) {
                const int d = lane + 32 * dd;
                if (d < hd) pp[2 + d] = acc[i][dd];
            }
        }
    }
}

/* ------------------------------------------------ tiled kernel (head_dim % 8 == 0)
 *
 * The fast path. A block takes tpb consecutive tokens of one slot (prefill) times the
 * heads_per_block query heads of one KV head: up to ATTN_MAX_HEADS (token, head)
 * pairs share every K/V tile, so the cache is read n_tokens / tpb times instead of
 * n_tokens times. Tiles are copied with 16-byte cp.async, one tile ahead (double
 * buffered). K rows are padded to hd + 8 halves: 16-byte aligned, and the 8 lanes of
 * a quarter warp reading 16 bytes of 8 consecutive keys hit 32 different banks. A lane
 * scores one key (q . k over 16-byte K reads, q broadcast from shared memory); for
 * P.V a lane owns 4 consecutive dims (8-byte V reads). Keys past a token's position
 * are masked, so tokens of one block may sit at different depths. */
#define AT_KPAD 8

__device__ __forceinline__ void at_cp16(void *smem, const void *gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void at_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void at_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* grid (n_tokens / tpb, n_kv * head_chunks, n_split), ATTN_WARPS warps. Dynamic shared
 * memory: q (pairs x hd f32, pre-scaled), 2 x [K tile (tile x (hd+8) f16), V tile
 * (tile x hd f16)], p (per warp, tile f32). */
__global__ void __launch_bounds__(ATTN_WARPS * 32) attn_tiled_kernel(const attn_args a, int tpb) {
    extern __shared__ float4 smem4[];
    const int hd = a.hd, ks = hd + AT_KPAD, tile = a.tile, hpb = a.heads_per_block;
    const int n_pairs = tpb * hpb;
    float *q_s = (float *)smem4;
    __half *kv_s = (__half *)(q_s + n_pairs * hd);
    const int stage_halves = tile * ks + tile * hd;
    float *p_s = (float *)(kv_s + 2 * stage_halves);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *p_w = p_s + warp * tile;

    const int t0 = blockIdx.x * tpb, kvh = blockIdx.y / a.head_chunks;
    const int h0 = kvh * a.group + (blockIdx.y % a.head_chunks) * hpb;
    const int split = blockIdx.z;
    const int s = a.seq[t0]; /* the launcher checked: the block's tokens share the slot */
    int p_max = -1;
    for (int i = 0; i < tpb; i++)
        p_max = max(p_max, a.pos[t0 + i]);
    const bool valid = s >= 0 && s < a.n_slot && p_max >= 0 && p_max < a.n_ctx;

    const int n_keys = valid ? p_max + 1 : 0;
    int chunk = (n_keys + a.n_split - 1) / a.n_split;
    chunk = (chunk + tile - 1) / tile * tile;
    const int k_begin = split * chunk;
    const int k_end = min(n_keys, k_begin + chunk);

    for (int i = threadIdx.x; i < n_pairs * hd; i += blockDim.x) {
        const int pr = i / hd, d = i % hd;
        const int t = t0 + pr / hpb, h = h0 + pr % hpb;
        q_s[i] = a.q[((size_t)t * a.n_head + h) * hd + d] * a.scale;
    }
    /* each warp's pairs: warp, warp + ATTN_WARPS, ... (at most HEADS_PER_WARP) */
    int my_pos[HEADS_PER_WARP];
#pragma unroll
    for (int i = 0; i < HEADS_PER_WARP; i++) {
        const int pr = warp + ATTN_WARPS * i;
        const int pp = pr < n_pairs ? a.pos[t0 + pr / hpb] : -1;
        my_pos[i] = (pp >= 0 && pp < a.n_ctx) ? pp : -1; /* -1: every key masked */
    }

    float m[HEADS_PER_WARP], l[HEADS_PER_WARP], acc[HEADS_PER_WARP][ATTN_MAX_HEAD_DIM / 128][4];
#pragma unroll
    for (int i = 0; i < HEADS_PER_WARP; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int dd = 0; dd < ATTN_MAX_HEAD_DIM / 128; dd++)
#pragma unroll
            for (int c = 0; c < 4; c++)
                acc[i][dd][c] = 0.0f;
    }

    const size_t row = (size_t)a.n_kv * hd; /* halves per (slot, position) */
    const __half *kbase = a.kc + (size_t)(valid ? s : 0) * a.n_ctx * row + (size_t)kvh * hd;
    const __half *vbase = a.vc + (size_t)(valid ? s : 0) * a.n_ctx * row + (size_t)kvh * hd;
    const int hd8 = hd / 8, hd4 = hd / 4;

    auto issue = [&](int kt, int stage) {
        __half *k_s = kv_s + stage * stage_halves, *v_s = k_s + tile * ks;
        const int nk = min(tile, k_end - kt);
        for (int i = threadIdx.x; i < nk * hd8; i += blockDim.x) {
            const int j = i / hd8, c = i % hd8;
            const size_t src = (size_t)(kt + j) * row + 8 * c;
            at_cp16(k_s + j * ks + 8 * c, kbase + src);
            at_cp16(v_s + j * hd + 8 * c, vbase + src);
        }
        at_commit();
    };

    int stage = 0;
    if (k_begin < k_end) issue(k_begin, 0);
    for (int kt = k_begin; kt < k_end; kt += tile, stage ^= 1) {
        const int nk = min(tile, k_end - kt);
        if (kt + tile < k_end) {
            /* the other stage was last read before the previous iteration's end barrier */
            issue(kt + tile, stage ^ 1);
            at_wait<1>();
        } else {
            at_wait<0>();
        }
        __syncthreads(); /* this tile (and q_s) visible to every warp */
        const __half *k_s = kv_s + stage * stage_halves, *v_s = k_s + tile * ks;
#pragma unroll
        for (int i = 0; i < HEADS_PER_WARP; i++) {
            const int pr = warp + ATTN_WARPS * i;
            if (pr >= n_pairs) break; /* uniform per warp */
            const float *qh = q_s + pr * hd;
            const int lim = my_pos[i] - kt; /* keys j <= lim are visible */
            float sc[2];
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int j = lane + 32 * c;
                sc[c] = -INFINITY;
                if (j < nk && j <= lim) {
                    const uint4 *kj = (const uint4 *)(k_s + j * ks);
                    float dot = 0.0f;
                    for (int c8 = 0; c8 < hd8; c8++) {
                        const uint4 kw = kj[c8];
                        const float4 qa = *(const float4 *)(qh + 8 * c8);
                        const float4 qb = *(const float4 *)(qh + 8 * c8 + 4);
                        const float2 k0 = __half22float2(*(const __half2 *)&kw.x);
                        const float2 k1 = __half22float2(*(const __half2 *)&kw.y);
                        const float2 k2 = __half22float2(*(const __half2 *)&kw.z);
                        const float2 k3 = __half22float2(*(const __half2 *)&kw.w);
                        dot = fmaf(qa.x, k0.x, dot);
                        dot = fmaf(qa.y, k0.y, dot);
                        dot = fmaf(qa.z, k1.x, dot);
                        dot = fmaf(qa.w, k1.y, dot);
                        dot = fmaf(qb.x, k2.x, dot);
                        dot = fmaf(qb.y, k2.y, dot);
                        dot = fmaf(qb.z, k3.x, dot);
                        dot = fmaf(qb.w, k3.y, dot);
                    }
                    sc[c] = dot;
                }
            }
            const float m_new = fmaxf(m[i], warp_max(fmaxf(sc[0], sc[1])));
            /* all keys so far masked: keep everything at zero (no inf - inf) */
            const float m_use = m_new == -INFINITY ? 0.0f : m_new;
            const float corr = expf(m[i] - m_use);
            float psum = 0.0f;
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int j = lane + 32 * c;
                const float pj = expf(sc[c] - m_use); /* 0 for masked keys */
                if (j < tile) p_w[j] = pj;
                psum += pj;
            }
            l[i] = l[i] * corr + warp_sum_a(psum);
            m[i] = m_new;
            __syncwarp();
            const int n_vis = min(nk, lim + 1); /* p is 0 past it */
#pragma unroll
            for (int dd = 0; dd < ATTN_MAX_HEAD_DIM / 128; dd++) {
                const int d4 = lane + 32 * dd;
                if (d4 < hd4) {
                    float o0 = acc[i][dd][0] * corr, o1 = acc[i][dd][1] * corr;
                    float o2 = acc[i][dd][2] * corr, o3 = acc[i][dd][3] * corr;
                    for (int j = 0; j < n_vis; j++) {
                        const float pj = p_w[j];
                        const uint2 vw = *(const uint2 *)(v_s + j * hd + 4 * d4);
                        const float2 v0 = __half22float2(*(const __half2 *)&vw.x);
                        const float2 v1 = __half22float2(*(const __half2 *)&vw.y);
                        o0 = fmaf(pj, v0.x, o0);
                        o1 = fmaf(pj, v0.y, o1);
                        o2 = fmaf(pj, v1.x, o2);
                        o3 = fmaf(pj, v1.y, o3);
                    }
                    acc[i][dd][0] = o0, acc[i][dd][1] = o1, acc[i][dd][2] = o2, acc[i][dd][3] = o3;
                }
            }
            __syncwarp(); /* p_w is rewritten by the next pair */
        }
        __syncthreads(); /* every warp is done with this stage before it is refilled */
    }

#pragma unroll
    for (int i = 0; i < HEADS_PER_WARP; i++) {
        const int pr = warp + ATTN_WARPS * i;
        if (pr >= n_pairs) break;
        const size_t th = (size_t)(t0 + pr / hpb) * a.n_head + h0 + pr % hpb;
        if (a.n_split == 1) {
            const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
#pragma unroll
            for (int dd = 0; dd < ATTN_MAX_HEAD_DIM / 128; dd++) {
                const int d4 = lane + 32 * dd;
                if (d4 < hd4) {
                    const float4 o = make_float4(acc[i][dd][0] * inv, acc[i][dd][1] * inv,
                                                 acc[i][dd][2] * inv, acc[i][dd][3] * inv);
                    *(float4 *)(a.out + th * hd + 4 * d4) = o;
                }
            }
        } else {
            float *pp = a.part + (th * a.n_split + split) * (size_t)(hd + 2);
            if (lane == 0) {
                pp[0] = m[i];
                pp[1] = l[i];
            }
#pragma unroll
            for (int dd = 0; dd < ATTN_MAX_HEAD_DIM / 128; dd++) {
                const int d4 = lane + 32 * dd;
                if (d4 < hd4)
#pragma unroll
                    for (int c = 0; c < 4; c++)
                        pp[2 + 4 * d4 + c] = acc[i][dd][c];
            }
        }
    }
}

/* grid (n_tokens * n_head); merge the n_split partial results of one (token, head). */
__global__ void attn_combine_kernel(const float *part, float *out, int n_split, int hd) {
    __shared__ float wgt[ATTN_MAX_SPLIT];
    __shared__ float inv_s;
    const size_t th = blockIdx.x;
    const float *pp = part + th * n_split * (size_t)(hd + 2);
    if (threadIdx.x < 32) {
        /* weights e^(m_s - M) once per split (a warp), then every dim uses them */
        float mx = -INFINITY;
        for (int s = threadIdx.x; s < n_split; s += 32)
            mx = fmaxf(mx, pp[s * (hd + 2)]);
        mx = warp_max(mx);
        float l = 0.0f;
        for (int s = threadIdx.x; s < n_split; s += 32) {
            const float ms = pp[s * (hd + 2)];
            const float wv = ms > -INFINITY ? expf(ms - mx) : 0.0f;
            wgt[s] = wv;
            l += pp[s * (hd + 2) + 1] * wv;
        }
        l = warp_sum_a(l);
        if (threadIdx.x == 0) inv_s = l > 0.0f ? 1.0f / l : 0.0f;
    }
    __syncthreads();
    const float inv = inv_s;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < n_split; s++)
            o = fmaf(pp[s * (hd + 2) + 2 + d], wgt[s], o);
        out[th * hd + d] = o * inv;
    }
}

/* ---------------------------------------------------------------- launchers */

bool kern_attn_store(struct ops_ctx *ctx, const struct ops_kv *kv, __half *kc, __half *vc,
                     const float *k, const float *v, const struct ops_batch *b) {
    const int row = kv->n_kv_head * kv->head_dim;
    attn_store_kernel<<<b->n_tokens, 128, 0, ctx->stream>>>(kc, vc, k, v, b->seq, b->pos,
                                                            kv->n_slot, kv->n_ctx, row);
    return LAUNCH_OK(ctx, "cuda attention (store)");
}

static size_t attn_tiled_smem_bytes(int n_pairs, int hd, int tile) {
    return (size_t)n_pairs * hd * sizeof(float) +
           2 * ((size_t)tile * (hd + AT_KPAD) + (size_t)tile * hd) * sizeof(__half) +
           (size_t)ATTN_WARPS * tile * sizeof(float);
}

static size_t attn_smem_bytes(int heads_per_block, int hd, int tile) {
    return (size_t)heads_per_block * hd * sizeof(float) + (size_t)tile * (hd + 2) * sizeof(__half) +
           (size_t)tile * hd * sizeof(__half) + (size_t)ATTN_WARPS * tile * sizeof(float);
}

bool kern_attention_init(struct ops_ctx *ctx) {
    size_t want = ATTN_SMEM_OPTIN;
    if (want > ctx->smem_optin) want = ctx->smem_optin;
    return kern_attention_mma_init(ctx) &&
           CUDA_OK(ctx, "cuda init (attention)",
                   cudaFuncSetAttribute(attn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)want)) &&
           CUDA_OK(ctx, "cuda init (attention)",
                   cudaFuncSetAttribute(attn_tiled_kernel,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)want));
}

/* kern_attention, with qk_norm_rope first when qk is given (kern_attention_qk). */
static void attention_run(struct ops_ctx *ctx, struct ops_kv *kv, int layer, const float *q,
                          const float *k, const float *v, float *out, const struct ops_batch *b,
                          int n_head, float scale, const struct kern_qk *qk) {
    const char *op = "cuda attention";
    const int n_tokens = b->n_tokens, n_kv = kv->n_kv_head, hd = kv->head_dim;
    if (n_tokens <= 0) return;
    if (kv->type != TPI_TYPE_F16 || layer < 0 || layer >= kv->n_layer || n_head <= 0 ||
        n_head % n_kv != 0 || hd % 2 != 0 || hd > ATTN_MAX_HEAD_DIM) {
        kern_fail(ctx, TPI_ERR_INVALID, op, __FILE__, __LINE__,
                  "layer %d of %d, n_head %d, n_kv_head %d, head_dim %d (even, <= %d), cache "
                  "type %s (F16 expected)",
                  layer, kv->n_layer, n_head, n_kv, hd, ATTN_MAX_HEAD_DIM,
                  quant_type_name(kv->type));
        return;
    }
    /* bad tokens are reported here (the kernels skip them and write zeros) */
    int max_pos = 0;
    for (int t = 0; t < n_tokens; t++) {
        const int s = b->seq_host[t], p = b->pos_host[t];
        if (s < 0 || s >= kv->n_slot || p < 0 || p >= kv->n_ctx)
            kern_fail(ctx, TPI_ERR_INVALID, op, __FILE__, __LINE__,
                      "token %d at slot %d position %d is outside the cache (%d slots x %d "
                      "positions)",
                      t, s, p, kv->n_slot, kv->n_ctx);
        else if (p + 1 > max_pos)
            max_pos = p + 1;
    }

    const int row = n_kv * hd;
    const size_t layer_elems = (size_t)kv->n_slot * kv->n_ctx * row;
    __half *kc = (__half *)kv->k + (size_t)layer * layer_elems;
    __half *vc = (__half *)kv->v + (size_t)layer * layer_elems;
    /* the tensor-core path stores k/v itself (in its decode kernel, or with kern_attn_store) */
    if (kern_attention_mma(ctx, kv, kc, vc, q, k, v, out, b, n_head, scale, max_pos, qk)) return;
    if (qk)
        kern_qk_norm_rope(ctx, (float *)q, (float *)k, qk->q_norm, qk->k_norm, b, n_head, n_kv,
                          hd, &qk->rope, qk->eps);
    if (!kern_attn_store(ctx, kv, kc, vc, k, v, b)) return;

    attn_args a;
    a.q = q;
    a.kc = kc;
    a.vc = vc;
    a.seq = b->seq;
    a.pos = b->pos;
    a.out = out;
    a.part = NULL;
    a.n_slot = kv->n_slot;
    a.n_ctx = kv->n_ctx;
    a.n_kv = n_kv;
    a.n_head = n_head;
    a.hd = hd;
    a.group = n_head / n_kv;
    a.heads_per_block = a.group;
    while (a.heads_per_block > ATTN_MAX_HEADS || a.group % a.heads_per_block != 0)
        a.heads_per_block--; /* largest divisor of the group that fits a block */
    a.head_chunks = a.group / a.heads_per_block;
    a.tile = hd <= 128 ? 64 : 32;
    a.scale = scale;

    /* the tiled kernel: tokens per block (a divisor of n_tokens whose blocks each hold
     * one slot's tokens), as many as fit ATTN_MAX_HEADS pairs while the grid stays full */
    const bool tiled = hd % 8 == 0 && ((uintptr_t)kv->k & 15) == 0 && ((uintptr_t)kv->v & 15) == 0;
    int tpb = 1;
    if (tiled) {
        for (int cand = ATTN_MAX_HEADS / a.heads_per_block; cand > 1; cand--) {
            if (n_tokens % cand != 0 ||
                (long)(n_tokens / cand) * n_kv * a.head_chunks < 2L * ctx->n_sm)
                continue;
            bool same = true;
            for (int t = 0; t < n_tokens && same; t++)
                same = b->seq_host[t] == b->seq_host[t - t % cand];
            if (same) {
                tpb = cand;
                break;
            }
        }
    }
    /* split the keys when the plain grid would leave most multiprocessors idle */
    const long base_blocks = (long)(n_tokens / tpb) * n_kv * a.head_chunks;
    int n_split = 1;
    const long want_blocks = tiled ? 4L * ctx->n_sm : 2L * ctx->n_sm;
    const int min_keys = tiled ? 2 * a.tile : 256; /* keys per split, at least */
    if (base_blocks < want_blocks && max_pos > 2 * min_keys) {
        const long by_grid = (want_blocks + base_blocks - 1) / base_blocks;
        const long by_keys = (max_pos + min_keys - 1) / min_keys;
        n_split = (int)TPI_MIN(TPI_MIN(by_grid, by_keys), (long)ATTN_MAX_SPLIT);
        if (n_split < 1) n_split = 1;
    }
    a.n_split = n_split;
    if (n_split > 1) {
        a.part = (float *)kern_scratch_get(
            ctx, &ctx->attn, (size_t)n_tokens * n_head * n_split * (hd + 2) * sizeof(float), op);
        if (!a.part) return;
    }
    if (tiled) {
        const size_t smem = attn_tiled_smem_bytes(tpb * a.heads_per_block, hd, a.tile);
        dim3 grid((unsigned)(n_tokens / tpb), (unsigned)(n_kv * a.head_chunks), (unsigned)n_split);
        attn_tiled_kernel<<<grid, ATTN_WARPS * 32, smem, ctx->stream>>>(a, tpb);
    } else {
        const size_t smem = attn_smem_bytes(a.heads_per_block, hd, a.tile);
        dim3 grid((unsigned)n_tokens, (unsigned)(n_kv * a.head_chunks), (unsigned)n_split);
        attn_kernel<<<grid, ATTN_WARPS * 32, smem, ctx->stream>>>(a);
    }
    if (!LAUNCH_OK(ctx, op)) return;
    if (n_split > 1) {
        const int threads = hd >= 128 ? 128 : 64;
        attn_combine_kernel<<<(unsigned)(n_tokens * n_head), threads, 0, ctx->stream>>>(
            a.part, out, n_split, hd);
        LAUNCH_OK(ctx, op);
    }
}

void kern_attention(struct ops_ctx *ctx, struct ops_kv *kv, int layer, const float *q,
                    const float *k, const float *v, float *out, const struct ops_batch *b,
                    int n_head, float scale) {
    attention_run(ctx, kv, layer, q, k, v, out, b, n_head, scale, NULL);
}

void kern_attention_qk(struct ops_ctx *ctx, struct ops_kv *kv, int layer, float *q, float *k,
                       const float *v, float *out, const struct ops_batch *b, int n_head,
                       float scale, const struct kern_qk *qk) {
    attention_run(ctx, kv, layer, q, k, v, out, b, n_head, scale, qk);
}
