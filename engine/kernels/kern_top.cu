/*
 * kern_top.cu — ops->row_top on CUDA: each row's k best values, so a sampler that needs
 * only those (greedy, top-k) reads a few hundred bytes of a row instead of the whole
 * vocabulary's logits.
 *
 * Every value becomes a 64-bit key (ops_top_key, the CPU's too), larger first: the float's
 * bits made monotone (-0 as +0) in the high word, the column's complement in the low word,
 * so the keys of a row are distinct and their order is the op's (value, then lower column). The selection is an
 * 8-bit radix select in one block (a histogram of the keys that share the prefix chosen
 * so far, the digit whose count reaches k, until the group at the boundary fits exactly;
 * the warp's lanes with one digit add to its bin once, by __match_any_sync), then a sort
 * of the k by rank; the ids and the values read back from the row (their own bits) are
 * written with the row's non-finite flag.
 * Three launches bound the k-th best first: the largest key of each of 64 column groups,
 * whose smallest T has at least 64 keys at or above it; the keys >= T appended to the
 * row's candidates (typically a few hundred); one block a row selects from those (or,
 * where more than TOP_CAND tie at T, from the whole row). (An earlier path selected each
 * 4096-value segment's k best, then over their picks: ~58 us a step whatever the rows on
 * an H100 against this one's ~36, bench/NOTES.md 154b.)
 * A selection, no arithmetic: bitwise the CPU backend's results.
 */
#include <math.h>

#include "kern_common.cuh"

#define TOP_THREADS 256
#define TOP_GROUPS 64      /* column groups whose maxima bound T */
#define TOP_CHUNK 4096     /* columns a filter block scans */
#define TOP_CAND 4096      /* candidates a row keeps (32 KB of shared memory to select) */

/* The k largest of the keys key(0..n) (distinct, k <= n: an array in shared memory, or
 * computed from a row in global memory) to out[0..k) in no order. Every thread of the
 * block calls it; hist is 256 words of shared memory. */
template <class Key>
__device__ void top_select(Key key, int n, int k, uint64_t *out, unsigned *hist) {
    __shared__ uint64_t s_prefix, s_mask;
    __shared__ int s_need, s_done, s_count;
    const int tid = threadIdx.x, lane = tid & 31;
    if (tid == 0) {
        s_prefix = 0;
        s_mask = 0;
        s_need = k;
        s_done = n == k;
        s_count = 0;
    }
    __syncthreads();
    for (int shift = 56; shift >= 0 && !s_done; shift -= 8) {
        const uint64_t prefix = s_prefix, mask = s_mask;
        for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        for (int base = 0; base < n; base += blockDim.x) { // uniform: whole warps match
            const int i = base + tid;
            const uint64_t ki = i < n ? key(i) : 0;
            const bool in = i < n && (ki & mask) == prefix;
            const unsigned d = in ? (unsigned)(ki >> shift) & 255u : 256u;
            const unsigned peers = __match_any_sync(0xffffffffu, d);
            if (in && (__ffs(peers) - 1) == lane) atomicAdd(&hist[d], (unsigned)__popc(peers));
        }
        __syncthreads();
        if (tid < 32) { // lane l holds digits 255 - 8l down to 248 - 8l
            unsigned sum = 0;
            for (int j = 0; j < 8; j++) sum += hist[255 - 8 * lane - j];
            unsigned incl = sum;
            for (int o = 1; o < 32; o <<= 1) {
                const unsigned t = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += t;
            }
            const unsigned need = (unsigned)s_need;
            unsigned before = incl - sum;
            if (before < need && need <= incl) { // exactly one lane
                for (int j = 0; j < 8; j++) {
                    const unsigned d = 255u - 8u * (unsigned)lane - (unsigned)j, c = hist[d];
                    if (need <= before + c) {
                        s_prefix = prefix | ((uint64_t)d << shift);
                        s_mask = mask | ((uint64_t)255u << shift);
                        s_need = (int)(need - before);
                        s_done = c == need - before;
                        break;
                    }
                    before += c;
                }
            }
        }
        __syncthreads();
    }
    const uint64_t prefix = s_prefix, mask = s_mask;
    for (int i = tid; i < n; i += blockDim.x) {
        const uint64_t ki = key(i);
        if ((ki & mask) >= prefix) out[atomicAdd(&s_count, 1)] = ki;
    }
    __syncthreads();
}

/* best[0..k) (distinct keys, shared memory) sorted by rank into ids (+ id0) and vals (the
 * row's own values). */
__device__ void top_write(const uint64_t *best, int k, const float *xr, int id0, int32_t *ids,
                          float *vals) {
    if (threadIdx.x < k) {
        const uint64_t key = best[threadIdx.x];
        int rank = 0;
        for (int j = 0; j < k; j++) rank += best[j] > key;
        const int col = (int)~(uint32_t)key;
        ids[rank] = id0 + col;
        vals[rank] = xr[col];
    }
}

/* Launch A: block (group, row) -> the largest key of group g's columns (TOP_GROUPS equal
 * runs) and whether it holds a non-finite value; the row's count of candidates zeroed.
 * The smallest of the groups' maxima, T, has at least min(TOP_GROUPS, n_cols) >= k keys
 * at or above it, one a group; a group past a narrow row's end is empty, its maximum 0
 * (below every key), so there T is 0 and every column a candidate. */
__global__ void __launch_bounds__(TOP_THREADS)
top_gmax_kernel(const float *__restrict__ x, int64_t ld, int n_cols, uint64_t *__restrict__ gmax,
                int *__restrict__ gbad, int *__restrict__ count) {
    __shared__ uint64_t wmax[TOP_THREADS / 32];
    const int row = blockIdx.y, g = blockIdx.x, len = (n_cols + TOP_GROUPS - 1) / TOP_GROUPS;
    const int c0 = g * len, c1 = min(n_cols, c0 + len);
    const float *xr = x + row * ld;
    uint64_t best = 0;
    int nonfinite = 0;
    for (int c = c0 + threadIdx.x; c < c1; c += blockDim.x) {
        const float v = xr[c];
        nonfinite |= !isfinite(v);
        const uint64_t key = ops_top_key(v, (uint32_t)c);
        best = key > best ? key : best;
    }
    for (int o = 16; o > 0; o >>= 1) {
        const uint64_t t = __shfl_xor_sync(0xffffffffu, best, o);
        best = t > best ? t : best;
    }
    if ((threadIdx.x & 31) == 0) wmax[threadIdx.x >> 5] = best;
    nonfinite = __syncthreads_or(nonfinite);
    if (threadIdx.x == 0) {
        for (int w = 1; w < TOP_THREADS / 32; w++) best = wmax[w] > best ? wmax[w] : best;
        gmax[row * TOP_GROUPS + g] = best;
        gbad[row * TOP_GROUPS + g] = nonfinite;
        if (g == 0) count[row] = 0;
    }
}

/* Launch B: block (chunk, row) -> the keys of its TOP_CHUNK columns at or above T appended
 * to the row's candidates (a warp's at once; in no order; past TOP_CAND only counted). */
__global__ void __launch_bounds__(TOP_THREADS)
top_filter_kernel(const float *__restrict__ x, int64_t ld, int n_cols,
                  const uint64_t *__restrict__ gmax, uint64_t *__restrict__ cand,
                  int *__restrict__ count) {
    __shared__ uint64_t s_t;
    const int row = blockIdx.y, lane = threadIdx.x & 31;
    if (threadIdx.x < 32) {
        uint64_t t = gmax[row * TOP_GROUPS + lane];
        const uint64_t t2 = gmax[row * TOP_GROUPS + 32 + lane];
        t = t2 < t ? t2 : t;
        for (int o = 16; o > 0; o >>= 1) {
            const uint64_t u = __shfl_xor_sync(0xffffffffu, t, o);
            t = u < t ? u : t;
        }
        if (lane == 0) s_t = t;
    }
    __syncthreads();
    const uint64_t t = s_t;
    const float *xr = x + row * ld;
    uint64_t *cr = cand + (int64_t)row * TOP_CAND;
    const int c0 = blockIdx.x * TOP_CHUNK, c1 = min(n_cols, c0 + TOP_CHUNK);
    for (int base = c0; base < c1; base += blockDim.x) { // uniform: whole warps vote
        const int c = base + threadIdx.x;
        const uint64_t key = c < c1 ? ops_top_key(xr[c], (uint32_t)c) : 0;
        const bool in = c < c1 && key >= t;
        const unsigned vote = __ballot_sync(0xffffffffu, in);
        if (!vote) continue;
        int at = 0;
        if (lane == 0) at = atomicAdd(&count[row], __popc(vote));
        at = __shfl_sync(0xffffffffu, at, 0) + __popc(vote & ((1u << lane) - 1u));
        if (in && at < TOP_CAND) cr[at] = key;
    }
}

/* Launch C: block row -> the k best of its candidates, or, where more than TOP_CAND tie at
 * the threshold, of the whole row (keys made from x as the select reads them); sorted,
 * written, and the row's non-finite flag from the groups'. */
__global__ void __launch_bounds__(TOP_THREADS)
top_final_kernel(const float *__restrict__ x, int64_t ld, int n_cols, int k, int id0,
                 const uint64_t *__restrict__ cand, const int *__restrict__ count,
                 const int *__restrict__ gbad, int32_t *__restrict__ ids,
                 float *__restrict__ vals, int32_t *__restrict__ bad) {
    __shared__ uint64_t keys[TOP_CAND];
    __shared__ unsigned hist[256];
    __shared__ uint64_t best[OPS_TOP_MAX];
    const int row = blockIdx.x, n = count[row];
    const float *xr = x + row * ld;
    int nonfinite = threadIdx.x < TOP_GROUPS ? gbad[row * TOP_GROUPS + threadIdx.x] : 0;
    nonfinite = __syncthreads_or(nonfinite);
    if (n <= TOP_CAND) {
        const uint64_t *cr = cand + (int64_t)row * TOP_CAND;
        for (int i = threadIdx.x; i < n; i += blockDim.x) keys[i] = cr[i];
        __syncthreads();
        top_select([&](int i) { return keys[i]; }, n, k, best, hist);
    } else {
        top_select([&](int i) { return ops_top_key(xr[i], (uint32_t)i); }, n_cols, k, best, hist);
    }
    top_write(best, k, xr, id0, ids + (int64_t)row * k, vals + (int64_t)row * k);
    if (threadIdx.x == 0) bad[row] = nonfinite;
}

void kern_row_top(struct ops_ctx *ctx, const float *x, int n_rows, int64_t ld, int n_cols, int id0,
                  int k, int32_t *ids, float *vals, int32_t *bad) {
    if (k < 1 || k > OPS_TOP_MAX || k > n_cols) {
        kern_fail(ctx, TPI_ERR_INVALID, "cuda row_top", __FILE__, __LINE__,
                  "k %d of %d columns (1..%d)", k, n_cols, OPS_TOP_MAX);
        return;
    }
    if (n_rows <= 0) return;
    struct kern_scratch *s = &ctx->top;
    const size_t g_bytes = (size_t)n_rows * TOP_GROUPS * (sizeof(uint64_t) + sizeof(int));
    const size_t c_bytes = (size_t)n_rows * TOP_CAND * sizeof(uint64_t);
    char *p = (char *)kern_scratch_get(ctx, s, c_bytes + g_bytes + sizeof(int) * n_rows,
                                       "cuda row_top");
    if (!p) return;
    uint64_t *cand = (uint64_t *)p, *gmax = (uint64_t *)(p + c_bytes);
    int *gbad = (int *)(gmax + (size_t)n_rows * TOP_GROUPS);
    int *count = gbad + (size_t)n_rows * TOP_GROUPS;
    top_gmax_kernel<<<dim3(TOP_GROUPS, (unsigned)n_rows), TOP_THREADS, 0, ctx->stream>>>(
        x, ld, n_cols, gmax, gbad, count);
    if (!LAUNCH_OK(ctx, "cuda row_top")) return;
    const unsigned n_chunk = (unsigned)((n_cols + TOP_CHUNK - 1) / TOP_CHUNK);
    top_filter_kernel<<<dim3(n_chunk, (unsigned)n_rows), TOP_THREADS, 0, ctx->stream>>>(
        x, ld, n_cols, gmax, cand, count);
    if (!LAUNCH_OK(ctx, "cuda row_top")) return;
    top_final_kernel<<<(unsigned)n_rows, TOP_THREADS, 0, ctx->stream>>>(
        x, ld, n_cols, k, id0, cand, count, gbad, ids, vals, bad);
    LAUNCH_OK(ctx, "cuda row_top");
}
