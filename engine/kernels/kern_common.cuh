/*
 * kern_common.cuh — what the CUDA backend's files share: the context (device,
 * stream, cuBLAS handle, scratch buffers, first deferred error), the check
 * macros that record a failure into the context instead of exiting, and the
 * host launchers (kern_*) each .cu file provides.
 *
 * Only the CUDA runtime API and cuBLAS are used, never the driver API, so the
 * binaries load and report "no GPU" on machines without libcuda.
 */
#ifndef KERN_COMMON_CUH
#define KERN_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "kernels/ops.h"
#include "kernels/quant.h"
#include "kernels/rope.h"
}

/* A device buffer that only grows; reused by ops that need temporary space. */
struct kern_scratch {
    void *p;
    size_t n_bytes;
};

struct ops_ctx {
    int device;
    uint64_t wait_since_ns;   /* host blocked on `stream` since (tpi_time_s in ns), 0: not
                                 waiting; written by the host thread, read by the watchdog */
    int n_sm;                 /* multiprocessors, to size split-K grids */
    int attn_cluster[6];      /* decode attention: the largest thread-block cluster of each
                                 kernel (head_dim 64/128 x 3 shapes) the device schedules,
                                 0: none (kern_attn_mma.cu) */
    int attn_cl_fit[6][17];   /* ... and how many clusters of each size 0..16 of it fit on
                                 the device at once (0: that size does not schedule) */
    size_t smem_optin;        /* largest dynamic shared memory a block may opt into */
    cudaStream_t stream;      /* every op is ordered on this one stream */
    cublasHandle_t cublas;    /* bound to `stream` */
    char name[256];           /* "NVIDIA H200" */
    struct tpi_error err;     /* first deferred error since the last check (status 0: none) */
    struct kern_scratch w16;  /* bf16 dequantized weight slab for the GEMM path */
    struct kern_scratch x16;  /* bf16 activations for the GEMM path */
    struct kern_scratch attn; /* split-K partial results of attention */
    struct kern_scratch idx;  /* get_rows indices copied to the device */
    struct kern_scratch q8;   /* int8 x blocks and their scales for the v3 matrix-vector path */
    struct kern_scratch q8_out; /* the same for the gate/up launch's output, written while
                                   that launch still reads x's form in q8 */
    struct kern_scratch acc;  /* matmul_add's product on the paths that cannot add in place */
    struct kern_scratch mmq_part; /* kern_mmq's partial sums of split rows */
    struct kern_scratch mmq_cnt;  /* kern_mmq's counters of finished blocks (zero between) */
    struct kern_scratch mmq_xp_buf; /* kern_mmq's x in its staging order (TPI_MMQ_XP) */
    struct kern_scratch top;      /* kern_row_top's group maxima and candidates */
    int mmq_rows; /* block-quantized products of 9..mmq_rows rows in kern_mmq (TPI_MMQ) */
    int mmq_bps;  /* kern_mmq's k split aims at this many blocks a multiprocessor (3; 0:
                   * all that are resident at once) */
    int mmq_raw; /* kern_mmq's raw paths (TPI_MMQ_RAW): MMQ_RAW_Q4_K | MMQ_RAW_Q6_KX8 */
    int mmq_hold; /* kern_mmq's raw kernels held to 3 blocks an SM (TPI_MMQ_HOLD: MMQ_RAW_*
                   * bits) */
    int mmq_xp;   /* kern_mmq's raw kernels read x permuted into their order (TPI_MMQ_XP) */
    int mmq_fixup; /* KiB of a column's k slices kern_mmq's last block adds (TPI_MMQ_FIXUP) */
    /* matmul_n runs its weights 1.. on these (forked from and joined to `stream`);
     * side[0] NULL: everything on `stream` */
    cudaStream_t side[OPS_MAX_FUSED - 1];
    cudaEvent_t ev_fork, ev_join[OPS_MAX_FUSED - 1];
    cublasHandle_t cublas_side[OPS_MAX_FUSED - 1]; /* bound to side[i]: own workspace */
    /* the int8 form of one f32 activation already in `q8` (kern_matmul.cu): written by
     * the op that produced x (rmsnorm, silu_mul, decode attention) or by the last
     * matmul's quantization; valid until any other op runs or something writes over x */
    struct {
        const float *x;
        int64_t n_vals;
        const int8_t *xq;
        const float2 *ds;
        const int8_t *xp; /* kind p's permuted copies, or NULL */
        int64_t ne0;      /* the row length xp was laid out for */
        bool valid;
    } xq_memo;
    /* x rounded to bf16 in the orders kern_mmq's raw kernels stage it (kern_xq.cuh:
     * Q4_K's at mmq_xp_buf, Q6_K's groups' n_vals values on), written by the op that
     * produced x (rmsnorm, the batch silu*mul); kept and forgotten as xq_memo is */
    struct {
        const float *x;
        int64_t n_vals;
        const void *xp; /* mmq_xp_buf's buffer when it was written */
        int forms;      /* MMQ_RAW_* bits: the orders written; 0: nothing held */
    } xp_memo;
    int xp_produce; /* MMQ_RAW_* bits: the forms producers write at 9..32 rows (TPI_XP_MEMO) */
    int xp_seen;    /* MMQ_RAW_* bits: the raw kernels that have read x permuted */
    int xq_produce;    /* XQ_BY_*: producers that write the next matmul's int8 x */
    bool rms_split;    /* decode rows' rmsnorm over n_cols / 128 blocks (TPI_RMS_SPLIT) */
    int gemv_merge;    /* matmul_n: which weights join weight 0's decode launch (TPI_GEMV_MERGE:
                        * 0 none, 1 auto, 2 all of its type, 3 those with <= half its rows) */
    int gemv_mix;      /* matmul_n: one decode launch for Q4_K's and Q6_K's weights together
                        * (TPI_GEMV_MIX: 0 off; else kern_gemv_v3_run_mix's mix) */
    bool xq_quant_seen; /* a quantized weight's matmul has run: int8 x has a reader */
    bool pdl; /* our decode-path kernels launched with PDL (default; TPI_PDL=0: not) */
    bool q8_repack; /* Q8_0 weights uploaded as KERN_LAYOUT_Q8_0X8 (TPI_Q8_REPACK; default on) */
    bool q6_repack; /* Q6_K weights uploaded as KERN_LAYOUT_Q6_KX8 (TPI_Q6_REPACK; default on) */
    bool q3_repack; /* Q3_K weights uploaded as KERN_LAYOUT_Q3_KX8 (TPI_Q3_REPACK; default on) */
    unsigned said_held; /* types (bit id % 32) whose held form upload_converted has said */
    bool q4_repack; /* Q4_0 weights uploaded as KERN_LAYOUT_Q4_0X8 (TPI_Q4_REPACK; default on) */
    int glu;        /* matmul_silu_mul in one decode launch (TPI_GLU): 0 off, 4/8/16/32 warps a
                       block, -1 auto (the default) */
    bool qkv_trigger; /* matmul_n's joined decode launch (Q/K/V) lets the next kernel launch
                         at its start (TPI_QKV_TRIGGER; default on) */
    bool gemv_trigger; /* set around that launch: the v3 kernels call kern_dep_trigger */
    int wo_prefetch; /* the decode attention triggers and the next v3 launch (wo) asks L2
                        for its weights before its wait: at the attention's start when its
                        largest position is under this, after its K/V stream from it up
                        (TPI_WO_PREFETCH; default 2048, 0: never; bench/NOTES.md change 86),
                        where wo's kernel gains from it (wo_early) */
    int gemv_prefetch;  /* armed by such an attention (its trigger: 1 after its K/V stream, 2
                           at its start), taken by the next v3 launch */
    bool after_attn;    /* a decode attention was the last op: the next v3 launch (wo) says
                           in wo_early whether its kernel gains from being let in early */
    bool wo_early;      /* so the decode attention triggers (true until a wo says no) */
    bool qk_attn;   /* qk_norm_rope_attention's norm and rope inside the tensor-core decode
                       attention (TPI_QK_ATTN; default on) */
    double *rope_inv;      /* device: qk_norm_rope's inverse frequencies (kern_elem.cu) */
    struct rope_pairs rope_inv_of; /* ... for this rope (valid while rope_inv_n > 0) */
    int rope_inv_n;
    int gemv;                 /* decode matrix-vector path: 2 (f32 x, staged) or 3 (int8 x, dp4a) */
    void *pinned;             /* host staging for weight uploads (pinned) */
    size_t pinned_bytes;
    cudaEvent_t staged[2]; /* one per half of `pinned`: that half's copy is done */
    bool host_pinned; /* host_alloc tries pinned memory (default; TPI_PINNED_HOST=0: malloc) */
    int diag_skip;    /* DIAG_SKIP_*: decode kernels left out (TPI_DIAG_SKIP; wrong outputs) */
    bool layer_tail;      /* layer_tail as one persistent launch (TPI_LAYER_TAIL=1; default off) */
    int layer_warps;      /* ... its consumer warps a block (TPI_LAYER_WARPS) */
    int layer_slot;       /* ... the bytes of its ring slots (TPI_LAYER_SLOT_KB) */
    int layer_diag;       /* ... parts left out to measure the rest (TPI_LAYER_DIAG) */
    int layer_ns_max;     /* ... its ring's slots at most (TPI_LAYER_NS) */
    int layer_trace_nph;  /* ... only launches of this many phases traced (TPI_LAYER_TRACE=3, 4) */
    unsigned long long *layer_trace; /* device: its last launch's times (TPI_LAYER_TRACE=1) */
    unsigned *layer_bar;  /* device: its grid barrier (the arrivals word) */
    int8_t *layer_gx;     /* device: the phases' int8 inputs as their writers quantized them */
    size_t layer_smem;    /* the launch shape last asked of the occupancy query ... */
    int layer_blocks;     /* ... and the blocks it runs with (0: does not fit) */
};

/* A measuring knob, TPI_DIAG_SKIP (a list of norm, rope, attn): decode steps (<= 8 rows)
 * leave those kernels out, so that a bench shows what they cost inside a real step. The
 * outputs are wrong; the int8 form the next matmul would have read from the norm or the
 * attention is taken as written (stale scratch), so no quantization launch stands in. */
#define DIAG_SKIP_NORM 1
#define DIAG_SKIP_ROPE 2
#define DIAG_SKIP_ATTN 4

/* Record the first failure of an op ("op: what (file:line)"); later ones are dropped
 * because they are usually consequences of the first. */
void kern_fail(struct ops_ctx *ctx, int status, const char *op, const char *file, int line,
               const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* true when e is cudaSuccess; otherwise records it (CHECK_GEN shape) and returns false. */
bool kern_cuda_ok(struct ops_ctx *ctx, cudaError_t e, const char *op, const char *expr,
                  const char *file, int line);
bool kern_cublas_ok(struct ops_ctx *ctx, cublasStatus_t s, const char *op, const char *expr,
                    const char *file, int line);

#define CUDA_OK(ctx, op, expr) kern_cuda_ok((ctx), (expr), (op), #expr, __FILE__, __LINE__)
#define CUBLAS_OK(ctx, op, expr) kern_cublas_ok((ctx), (expr), (op), #expr, __FILE__, __LINE__)
/* After a launch: a bad configuration shows up here, a fault only at the next sync. */
#define LAUNCH_OK(ctx, op)                                                                         \
    kern_cuda_ok((ctx), cudaGetLastError(), (op), "launch", __FILE__, __LINE__)

/* A device buffer of at least n_bytes from `s` (grown, never shrunk); NULL on OOM, or
 * when it must grow while a graph is recorded, with the failure recorded under `op`.
 * Growing frees the old buffer, which waits for the device, so callers size it once
 * early where they can. */
void *kern_scratch_get(struct ops_ctx *ctx, struct kern_scratch *s, size_t n_bytes, const char *op);

#define KERN_N_SCRATCH 11
/* Every scratch buffer of ctx, in a fixed order: what ops_free frees and what a recorded
 * graph checks for regrowth (a buffer left out here would be replayed after being freed). */
static inline void kern_scratch_all(struct ops_ctx *ctx, struct kern_scratch *out[KERN_N_SCRATCH]) {
    struct kern_scratch *all[KERN_N_SCRATCH] = {
        &ctx->w16, &ctx->x16, &ctx->attn, &ctx->idx, &ctx->q8, &ctx->q8_out,
        &ctx->acc, &ctx->mmq_part, &ctx->mmq_cnt, &ctx->mmq_xp_buf, &ctx->top};
    for (int i = 0; i < KERN_N_SCRATCH; i++)
        out[i] = all[i];
}

/* ---- tensor-core fragments (kern_attn_mma.cu, kern_mmq.cu) ---- */
/* The shared-memory address of p (a pointer into shared memory). */
__device__ __forceinline__ uint32_t mma_smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
/* Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i. */
__device__ __forceinline__ void mma_ldsm4(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* 16-byte async copy global -> shared; n_src 0 fills the 16 bytes with zeros. */
__device__ __forceinline__ void mma_cp16(uint32_t dst, const void *src, int n_src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n_src)
                 : "memory");
}
__device__ __forceinline__ void mma_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void mma_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
/* Build option: data read once a step (decode weights, the decode attention's K/V) asked
 * of L2 with eviction priority evict_first (1, the default), so the lines the step reads
 * again (kernel code, activations, their int8 forms) stay in L2; 0: no hint. H200, tg128
 * Q4_K_M +4.9 %, Q8_0 +5.3 %, depth 8192 +2.4 % (bench/NOTES.md change 107). */
#ifndef TPI_L2_EF
#define TPI_L2_EF 1
#endif
/* The L2 policy of streamed data (TPI_L2_EF; 0 when off, and then unused). */
__device__ __forceinline__ uint64_t kern_stream_policy() {
    uint64_t pol = 0;
#if TPI_L2_EF && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
#endif
    return pol;
}
/* A whole 16-byte mma_cp16 of data read once (a step's weights, the decode attention's
 * K/V), with pol (kern_stream_policy) as its L2 hint where TPI_L2_EF is on. No zero fill:
 * copies that may fill with zeros take mma_cp16 (the hinted form with a zero source size
 * is not trusted to fill: bench/NOTES.md change 112). */
__device__ __forceinline__ void mma_cp16_once(uint32_t dst, const void *src, uint64_t pol) {
#if TPI_L2_EF && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(dst),
                 "l"(src), "l"(pol)
                 : "memory");
#else
    (void)pol;
    mma_cp16(dst, src, 16);
#endif
}
/* 4-byte async copy global -> shared (through L1); n_src 0 fills the 4 bytes with zeros. */
__device__ __forceinline__ void mma_cp4(uint32_t dst, const void *src, int n_src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n_src)
                 : "memory");
}

/* ---- programmatic dependent launch (PDL, sm_90) ----
 * A kernel launched with kern_launch(pdl = true) may be launched while the kernel before
 * it on the stream drains (its blocks have exited; only matmul_n's joined decode launch
 * triggers earlier, kern_dep_trigger, so the attention after it starts its own pre-wait
 * work while Q/K/V still runs, and the decode attention where wo's kernel gains from it,
 * so wo's launch asks L2 for its weights while the attention still runs); it
 * must call kern_dep_wait, which returns when the previous kernel has completed and its
 * writes are visible, before it touches memory another kernel writes or reads. Every
 * kernel launched with pdl calls kern_dep_wait before it can finish, so completion stays
 * transitive along the stream. In a kernel launched without pdl the wait is a no-op.
 * (Triggering the next kernel at the start of each decode kernel was tried: no clear
 * gain, and test_xq_memo_cuda then saw a kind-b GEMV read stale x; bench/NOTES.md
 * change 15.) */
__device__ __forceinline__ void kern_dep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
/* Let the next kernel on the stream launch now (griddepcontrol.launch_dependents): its
 * blocks may start, and run up to their kern_dep_wait, while this kernel still runs. Only
 * where the next kernel reads nothing of this one's, and writes nothing, before its wait:
 * every kernel here touches only weights, tables and the step's uploaded positions there. */
__device__ __forceinline__ void kern_dep_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
/* Release/acquire at GPU scope, for message passing through a counter in global memory
 * (__threadfence is sequentially consistent: MEMBAR.SC.GPU, slower, and no counter here
 * needs more than release and acquire). */
__device__ __forceinline__ void kern_fence_gpu() {
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
}
/* The int8 block of 32 x values held by the 32 lanes of a warp (lane j has value i, the
 * j-th of its block): d = amax / 127, q = round(v / d) clamped to +-127; returns q and
 * sets *pair = (d, d * sum q) on every lane. On sm_80 and up the two warp reductions are
 * single redux.sync instructions instead of five-shuffle trees (on every int8 producer's
 * last path; bench/NOTES.md change 119): the maximum of |v| as the bits of non-negative
 * floats, which order as unsigned integers do, NaNs left out as fmaxf leaves them (a
 * block of NaNs only: NaN), and the integer sum, exact in any order: the same values. */
__device__ __forceinline__ int kern_q8_quant(float v, float2 *pair) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const bool nan = isnan(v);
    const unsigned bits = nan ? 0u : __float_as_uint(fabsf(v));
    float amax = __uint_as_float(__reduce_max_sync(0xffffffffu, bits));
    if (__all_sync(0xffffffffu, nan)) amax = __int_as_float(0x7fffffff);
#else
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
#endif
    const float d = amax / 127.0f;
    int q = amax > 0.0f ? __float2int_rn(v * (127.0f / amax)) : 0;
    q = max(-127, min(127, q));
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const int sum = __reduce_add_sync(0xffffffffu, q);
#else
    int sum = q;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
#endif
    *pair = make_float2(d, d * (float)sum);
    return q;
}
/* kern_q8_quant of value i; writes xq[i] and, from lane 0, ds[i / 32]; returns q. Every
 * x quantization of the v3 path goes through this (the layer tail through kern_q8_pairs),
 * so the forms made in different kernels are bitwise equal. */
__device__ __forceinline__ int kern_q8_block(float v, int64_t i, int8_t *xq, float2 *ds) {
    float2 pair;
    const int q = kern_q8_quant(v, &pair);
    xq[i] = (int8_t)q;
    if ((threadIdx.x & 31) == 0) ds[i / 32] = pair;
    return q;
}
/* kern_q8_block without the plain xq store (the caller places q, e.g. in permuted copies). */
__device__ __forceinline__ int kern_q8_pairs(float v, int64_t i, float2 *ds) {
    float2 pair;
    const int q = kern_q8_quant(v, &pair);
    if ((threadIdx.x & 31) == 0) ds[i / 32] = pair;
    return q;
}

/* A norm's scale 1 / sqrt(ss / n + eps), as every GPU norm computes it (so the fused forms
 * stay bitwise the plain kernels): rsqrtf in float, within 2 ulp of the CPU reference's
 * double formula; the double square root and division it replaces were a chain of ~20
 * FP64 operations on each norm's critical path (tg128 Q4_K_M +0.7 %, bench/NOTES.md
 * change 99). */
__device__ __forceinline__ float kern_rms_scale(float ss, int n, float eps) {
    /* n a power of two (Qwen3's 4096 and 128): ss * 2^-k is the quotient's exact value, so
     * its rounding is the division's, without the division's ~10-instruction chain and
     * slow-path branch (bench/NOTES.md change 128) */
    const float m = n > 0 && (n & (n - 1)) == 0 ? ss * __int_as_float((127 - (__ffs(n) - 1)) << 23)
                                                : ss / (float)n;
    return rsqrtf(m + eps);
}

/* silu(g) * u as every kernel computes it (silu_mul, the gate/up launch of kern_gemv.cu),
 * so their outputs are bitwise equal. */
__device__ __forceinline__ float kern_silu_mul1(float g, float u) {
    return __fmul_rn(g / (1.0f + expf(-g)), u);
}

/* cos and sin of the angle pos * inv in double (thousands of radians where a float angle
 * is off by ~1e-4), times ms (rope.h's mscale; 1 leaves them as they are), rounded to
 * float. */
__device__ __forceinline__ float2 kern_rope_cs(double pos, double inv, double ms) {
    double sd, cd;
    sincos(pos * inv, &sd, &cd);
    return make_float2((float)(cd * ms), (float)(sd * ms));
}

/* NEOX rotation of pair (x0, x1) = (x[i], x[i + half]) by cs = (cos, sin) into y[i],
 * y[i + half], products not fused (as on the CPU). */
__device__ __forceinline__ void kern_rope_apply(float x0, float x1, float *y, int i, int half,
                                                float2 cs) {
    y[i] = __fsub_rn(__fmul_rn(x0, cs.x), __fmul_rn(x1, cs.y));
    y[i + half] = __fadd_rn(__fmul_rn(x0, cs.y), __fmul_rn(x1, cs.x));
}

/* NEOX rotation of pair (x[i], x[i + n_rot/2]) at position pos (the two above). */
__device__ __forceinline__ void kern_rope_pair(float x0, float x1, float *y, int i,
                                               double pos, const rope_pairs &rp) {
    kern_rope_apply(x0, x1, y, i, rp.n_rot / 2,
                    kern_rope_cs(pos, rope_pair_inv(&rp, i), rp.mscale));
}

/* kernel<<<grid, block, smem, stream>>>(args...), with the PDL attribute when pdl and,
 * when cluster_z > 1, as thread-block clusters of (1, 1, cluster_z) blocks. */
template <typename... KArgs, typename... Args>
static inline void kern_launch_cl(bool pdl, unsigned cluster_z, void (*kernel)(KArgs...),
                                  dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                  Args... args) {
    if (!pdl && cluster_z <= 1) {
        kernel<<<grid, block, smem, stream>>>(args...);
        return;
    }
    cudaLaunchConfig_t lc = {};
    lc.gridDim = grid;
    lc.blockDim = block;
    lc.dynamicSmemBytes = smem;
    lc.stream = stream;
    cudaLaunchAttribute at[2];
    unsigned n = 0;
    if (pdl) {
        at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster_z > 1) {
        at[n].id = cudaLaunchAttributeClusterDimension;
        at[n].val.clusterDim.x = 1;
        at[n].val.clusterDim.y = 1;
        at[n++].val.clusterDim.z = cluster_z;
    }
    lc.attrs = at;
    lc.numAttrs = n;
    cudaLaunchKernelEx(&lc, kernel, ((KArgs)args)...);
}

/* kernel<<<grid, block, smem, stream>>>(args...), with the PDL attribute when pdl. */
template <typename... KArgs, typename... Args>
static inline void kern_launch(bool pdl, void (*kernel)(KArgs...), dim3 grid, dim3 block,
                               size_t smem, cudaStream_t stream, Args... args) {
    kern_launch_cl(pdl, 1, kernel, grid, block, smem, stream, args...);
}

/* Spare bytes after every weight's data (weight_upload): kernels may read whole
 * 16-byte pieces that start inside the data. */
#define KERN_WEIGHT_PAD 64

/* Whether the CUDA kernels handle weight type `type`. */
bool kern_type_supported(int type);

/* Q8_0 weights with rows of whole 256 values are kept on the device in groups of 8
 * blocks: the 8 x 32 int8 quants (256 bytes, 16-byte aligned), then the 8 f16 scales (16
 * bytes); 272 bytes a group, as 8 GGUF blocks take, so rows and row_bytes stay as they
 * are. A warp's lanes then read their quants with 16-byte loads (GGUF's 34-byte blocks
 * leave them 2-byte aligned: ten loads a block, and about nine L1 wavefronts for each
 * warp-wide one). weight_upload repacks in place (tpi_weight.layout says so); the
 * kernels see the arrangement as a type of its own, KERN_TYPE_Q8_0X8, which only
 * kern_wtype gives out. TPI_Q8_REPACK=0 keeps the GGUF blocks. */
#define KERN_LAYOUT_Q8_0X8 1
#define KERN_TYPE_Q8_0X8 1008 /* no ggml type id: the kernels' name for that layout */
#define KERN_Q8_0X8_BYTES 272

/* Q4_0 weights with rows of whole 256 values are kept in groups of 8 blocks as Q8_0's
 * are: block k's 16 quant bytes at 16k (128 bytes, 16-byte aligned), then the 8 f16
 * scales (16 bytes); 144 bytes a group, as 8 GGUF blocks take. GGUF's 18-byte blocks leave
 * the quants 2-byte aligned (five loads and four funnel shifts a block); here a block is
 * one 16-byte load and a halfword. The kernels see KERN_TYPE_Q4_0X8 (kern_wtype);
 * TPI_Q4_REPACK=0 keeps the GGUF blocks. */
#define KERN_LAYOUT_Q4_0X8 3
#define KERN_TYPE_Q4_0X8 1002 /* no ggml type id: the kernels' name for that layout */
#define KERN_Q4_0X8_BYTES 144

/* One group of 8 GGUF blocks whose first halfword is the f16 scale and the rest quants
 * (Q8_0: 17 halfwords a block, Q4_0: 9; BYTES = 8 blocks = 16 x the halfwords a block) in
 * the grouped layout (KERN_LAYOUT_Q8_0X8, KERN_LAYOUT_Q4_0X8): in, out the group's bytes
 * as little-endian words. Block k's quants go to bytes (BYTES - 16) / 8 * k.., its scale
 * after all the quants, to BYTES - 16 + 2k. The repack kernels and the host emulation's
 * test share it. */
template <int BYTES>
__host__ __device__ __forceinline__ void kern_x8_regroup(const uint32_t (&in)[BYTES / 4],
                                                         uint32_t (&out)[BYTES / 4]) {
    constexpr int HW = BYTES / 16, QW = (HW - 1) / 2; /* halfwords, quant words a block */
    /* halfword h of the group (constant indices once unrolled) */
    auto half_at = [&](int h) -> uint32_t { return (in[h >> 1] >> (16 * (h & 1))) & 0xFFFFu; };
#pragma unroll
    for (int k = 0; k < 8; k++)
#pragma unroll
        for (int j = 0; j < QW; j++) /* quants: output word QW k + j = halfwords 2j+1, 2j+2 */
            out[QW * k + j] = half_at(HW * k + 1 + 2 * j) | (half_at(HW * k + 2 + 2 * j) << 16);
#pragma unroll
    for (int k = 0; k < 4; k++) /* scales of blocks 2k, 2k+1 */
        out[8 * QW + k] = half_at(HW * (2 * k)) | (half_at(HW * (2 * k + 1)) << 16);
}

/* Q6_K weights with rows of whole 2048 values are kept on the device in groups of 8
 * blocks too (1680 bytes, as 8 GGUF blocks take): GGUF's 210-byte blocks leave a block's
 * quants 2-byte aligned, so a lane read an item (64 values: 16 bytes each of ql's low
 * and high halves and of qh, 4 scales, d) with 19 loads. In a group, item l = 4c + it
 * (block c, item it = 2n + l0/16 of Q6_K's decoders: half n, lanes l0..l0+15) has
 *   bytes 16l ..        ql[64n + l0 .. +16] of block c       (its "A" piece)
 *   bytes 512 + 16l ..  ql[64n + 32 + l0 .. +16]             ("C")
 *   bytes 1024 + 16l .. qh[32n + l0 .. +16]                  ("H")
 *   bytes 1536 + 4l ..  scales[8n + l0/16 + 2k], k = 0..3    (one word)
 * and block c's f16 d is at 1664 + 2c: an item is three 16-byte loads, a word and a
 * halfword, and a warp's 32 lanes (one group) read 512 contiguous bytes per 16-byte load.
 * Rows and row_bytes stay as they are; weight_upload repacks in place; the kernels see
 * KERN_TYPE_Q6_KX8 (kern_wtype). TPI_Q6_REPACK=0 keeps the GGUF blocks. */
#define KERN_LAYOUT_Q6_KX8 2
#define KERN_TYPE_Q6_KX8 1014 /* no ggml type id: the kernels' name for that layout */
#define KERN_Q6_KX8_BYTES 1680

/* The byte of a group of 8 GGUF Q6_K blocks that byte o of its KERN_LAYOUT_Q6_KX8 form
 * holds (the repack kernel and the host emulation's test share it). */
__host__ __device__ __forceinline__ int kern_q6_k_x8_src(int o) {
    if (o >= 1664) return 210 * ((o - 1664) >> 1) + 208 + (o & 1); /* d */
    if (o >= 1536) {                                                /* scales */
        const int l = (o - 1536) >> 2, k = o & 3, c = l >> 2, it = l & 3;
        return 210 * c + 192 + 8 * (it >> 1) + (it & 1) + 2 * k;
    }
    const int part = o >> 9, l = (o & 511) >> 4, j = o & 15, c = l >> 2, it = l & 3;
    const int n = it >> 1, l0 = 16 * (it & 1);
    return 210 * c + (part == 2 ? 128 + 32 * n : 64 * n + 32 * part) + l0 + j;
}

/* Q3_K weights with rows of whole 2048 values are kept in groups of 8 blocks as well (880
 * bytes, as 8 GGUF blocks take): GGUF's 110-byte blocks leave a block's pieces 2-byte
 * aligned (an item of 64 values took 15 four-byte loads and 11 funnel shifts). A group
 * holds its blocks' fields one after another, block c's
 *   bytes 64c ..        qs[0 .. 64]      (item l = 4c + it's 16 bytes at 16l: 16-aligned)
 *   bytes 512 + 32c ..  hmask[0 .. 32]   (item it's at 512 + 32c + 16 (it & 1))
 *   bytes 768 + 12c ..  scales[0 .. 12]  (4-aligned)
 *   bytes 864 + 2c ..   d
 * so an item is two 16-byte loads, three words and a halfword, and a warp's qs loads read
 * 512 contiguous bytes. The bytes are GGUF's, moved: every decoder reads the same values
 * (the results are the GGUF blocks' bits). TPI_Q3_REPACK=0 keeps the GGUF blocks. */
#define KERN_LAYOUT_Q3_KX8 4
#define KERN_TYPE_Q3_KX8 1011 /* no ggml type id: the kernels' name for that layout */
#define KERN_Q3_KX8_BYTES 880

/* The byte of a group of 8 GGUF Q3_K blocks that byte o of its KERN_LAYOUT_Q3_KX8 form
 * holds (the repack kernel and the host emulation's test share it). */
__host__ __device__ __forceinline__ int kern_q3_k_x8_src(int o) {
    if (o >= 864) return 110 * ((o - 864) >> 1) + 108 + (o & 1);  /* d */
    if (o >= 768) return 110 * ((o - 768) / 12) + 96 + (o - 768) % 12; /* scales */
    if (o >= 512) return 110 * ((o - 512) >> 5) + (o & 31);           /* hmask */
    return 110 * (o >> 6) + 32 + (o & 63);                            /* qs */
}

/* qsort's order of unsigned 64-bit values (the trace dumps' times). */
static inline int kern_cmp_u64(const void *x, const void *y) {
    const unsigned long long a = *(const unsigned long long *)x, b = *(const unsigned long long *)y;
    return a < b ? -1 : a > b;
}
/* The type id the kernels dispatch on: w's type, or the id of its device layout. */
static inline int kern_wtype(const struct tpi_weight *w) {
    if (w->type == TPI_TYPE_Q8_0 && w->layout == KERN_LAYOUT_Q8_0X8) return KERN_TYPE_Q8_0X8;
    if (w->type == TPI_TYPE_Q4_0 && w->layout == KERN_LAYOUT_Q4_0X8) return KERN_TYPE_Q4_0X8;
    if (w->type == TPI_TYPE_Q6_K && w->layout == KERN_LAYOUT_Q6_KX8) return KERN_TYPE_Q6_KX8;
    if (w->type == TPI_TYPE_Q3_K && w->layout == KERN_LAYOUT_Q3_KX8) return KERN_TYPE_Q3_KX8;
    return w->type;
}

/* ---- launchers (kern_elem.cu) ---- */
/* n_groups groups of 8 GGUF Q8_0 blocks at data (16-byte aligned) rearranged in place as
 * KERN_LAYOUT_Q8_0X8 (stream-ordered; failures recorded in ctx) */
void kern_q8_0_x8_repack(struct ops_ctx *ctx, uint8_t *data, int64_t n_groups);
/* n_groups groups of 8 GGUF Q4_0 blocks at data (16-byte aligned) rearranged in place as
 * KERN_LAYOUT_Q4_0X8 (stream-ordered; failures recorded in ctx) */
void kern_q4_0_x8_repack(struct ops_ctx *ctx, uint8_t *data, int64_t n_groups);
/* n_groups groups of 8 GGUF Q6_K blocks at data (16-byte aligned) rearranged in place as
 * KERN_LAYOUT_Q6_KX8 (stream-ordered; failures recorded in ctx) */
void kern_q6_k_x8_repack(struct ops_ctx *ctx, uint8_t *data, int64_t n_groups);
/* n_groups groups of 8 GGUF Q3_K blocks at data (16-byte aligned) rearranged in place as
 * KERN_LAYOUT_Q3_KX8 (stream-ordered; failures recorded in ctx) */
void kern_q3_k_x8_repack(struct ops_ctx *ctx, uint8_t *data, int64_t n_groups);
/* rows ids[0..n_tokens) (device memory) of the embedding w dequantized to f32 at out. */
void kern_embed(struct ops_ctx *ctx, const struct tpi_weight *w, const int32_t *ids, int n_tokens,
                float *out);
/* rows [row0, row0+n_rows) of w dequantized to bf16, n_rows * ne0 values at dst */
void kern_dequant_bf16(struct ops_ctx *ctx, const struct tpi_weight *w, int64_t row0,
                       int64_t n_rows, __nv_bfloat16 *dst);
/* y[i] = bf16(x[i]) for i < n, rounded to nearest even. */
void kern_f32_to_bf16(struct ops_ctx *ctx, const float *x, __nv_bfloat16 *y, int64_t n);
/* kern_mmq's row limit: n_rows <= 16 MT for MT m-tiles of 16 rows, MT <= 4; by default
 * it takes up to 32 (TPI_MMQ). */
#define MMQ_MAX_ROWS 64
#define MMQ_DEFAULT_ROWS 32
#define MMQ_RAW_Q4_K 1   /* ctx->mmq_raw: Q4_K's raw path (TPI_MMQ_RAW=1: this one only) */
#define MMQ_RAW_Q6_KX8 2 /* Q6_K's groups' (TPI_MMQ_RAW=2: this one only; 0: neither) */
#define MMQ_MAX_W 4 /* weights one kern_mmq_n launch multiplies by the same x */
/* y (n_rows, ne1) = bf16(x) (n_rows, ne0) * W^T, plus beta * y (beta 0 or 1), queued on
 * ctx->stream with W decoded in registers (kern_mmq.cu); false (nothing queued) unless W
 * is a block type it takes with rows of whole blocks and 1 <= n_rows <= min(ctx->mmq_rows,
 * MMQ_MAX_ROWS). *x16 is x rounded to bf16 (ctx->x16's), or NULL: made there if the
 * kernel reads it (the raw kernels read their own permuted form). Launch failures are
 * recorded in ctx. */
bool kern_mmq(struct ops_ctx *ctx, const struct tpi_weight *w, const float *x,
              const __nv_bfloat16 **x16, float *y, int64_t n_rows, float beta);
/* kern_mmq for n_w (1..4) weights of one type and row length that multiply the same x,
 * in one launch (ys[i] = beta ys[i] + x ws[i]^T); false (nothing queued) where kern_mmq
 * would say no for one of them, or when they differ in type or row length. */
bool kern_mmq_n(struct ops_ctx *ctx, int n_w, const struct tpi_weight *const *ws, const float *x,
                const __nv_bfloat16 **x16, float *const *ys, int64_t n_rows, float beta);
/* Each of n_rows rows of x normalized by its rms (eps added to the mean square), times w,
 * into y (ops.h rmsnorm); up to 8 rows may also leave their int8 form for the next matmul. */
void kern_rmsnorm(struct ops_ctx *ctx, const float *x, const float *w, float *y, int64_t n_rows,
                  int64_t n_cols, float eps);
/* y[r][c] += b[c] for n_rows rows of n_cols. */
void kern_add_bias(struct ops_ctx *ctx, float *y, const float *b, int64_t n_rows, int64_t n_cols);
/* NEOX rope in place on the first n_rot dims of each of n_head heads of every token of b,
 * at the token's position (ops.h rope_neox); a bad n_rot is recorded in ctx. */
void kern_rope_neox(struct ops_ctx *ctx, float *x, const struct ops_batch *b, int n_head,
                    int head_dim, const struct rope_pairs *rp);
/* qk_norm_rope's table of inverse frequencies (rope_pair_inv) for rp on the device (made
 * on first use; NULL when it cannot be made now: while a graph is being recorded). */
const double *kern_rope_inv_table(struct ops_ctx *ctx, const struct rope_pairs *rp);
/* In place per-head rmsnorm (weights may be NULL: none) and NEOX rope of q and k (ops.h). */
void kern_qk_norm_rope(struct ops_ctx *ctx, float *q, float *k, const float *q_norm,
                       const float *k_norm, const struct ops_batch *b, int n_head, int n_kv_head,
                       int head_dim, const struct rope_pairs *rp, float eps);
/* y[i] = silu(g[i]) * u[i] for i < n; may leave y's int8 form for the next matmul. */
void kern_silu_mul(struct ops_ctx *ctx, const float *g, const float *u, float *y, int64_t n);
/* kern_silu_mul of n_rows rows (0: not known), which may also leave y's bf16 forms for a
 * 9..32-row raw kern_mmq product (kern_xp_claim). */
void kern_silu_mul_rows(struct ops_ctx *ctx, const float *g, const float *u, float *y,
                        int64_t n_rows, int64_t n);
/* x[i] += y[i] for i < n. */
void kern_add(struct ops_ctx *ctx, float *x, const float *y, int64_t n);
/* dst's row r = src's row idx_host[r] (host memory) for r < n_idx, rows of n_cols floats;
 * a negative index is recorded in ctx and its row written as zeros. */
void kern_get_rows(struct ops_ctx *ctx, const float *src, const int32_t *idx_host, int n_idx,
                   int64_t n_cols, float *dst);
/* ops->row_top (kern_top.cu). */
void kern_row_top(struct ops_ctx *ctx, const float *x, int n_rows, int64_t ld, int n_cols, int id0,
                  int k, int32_t *ids, float *vals, int32_t *bad);

/* ---- launchers (kern_matmul.cu) ---- */
/* Producers that may write the next matmul's int8 x (ops_ctx.xq_produce, TPI_XQ_MEMO). */
#define XQ_BY_NORM 1 /* rmsnorm */
#define XQ_BY_SILU 2 /* silu*mul */
#define XQ_BY_ATTN 4 /* attention (the tensor-core decode kernel, kern_attn_mma.cu) */
/* The x-quantization memo (see xq_memo): forget it (every op but the matmuls calls this
 * first); claim q8 scratch for the int8 form (blocks, scales and kind p's permuted
 * copies, kern_xq.cuh's layout for n_rows rows of ne0) of an output about to be written
 * by producer `by` (XQ_BY_*) (false: that producer off, no quantized weight seen yet, not
 * on the v3 path, not a decode size, or no memory); remember that x (n_vals values) now
 * has its int8 form in the claimed scratch. */
void kern_xq_forget(struct ops_ctx *ctx);
bool kern_xq_claim(struct ops_ctx *ctx, int by, int64_t n_rows, int64_t ne0, int8_t **xq,
                   float2 **ds);
/* kern_xq_claim in another scratch than q8 (a producer that reads q8 while it writes). */
bool kern_xq_claim_in(struct ops_ctx *ctx, struct kern_scratch *s, int by, int64_t n_rows,
                      int64_t ne0, int8_t **xq, float2 **ds);
void kern_xq_remember(struct ops_ctx *ctx, const float *x, int64_t n_vals);
/* The bf16 forms' memo (xp_memo): mmq_xp_buf claimed for the forms (*forms, MMQ_RAW_*
 * bits; kern_xp_store) of an output of n_vals values (n_rows rows) a producer is about to
 * write, or NULL (producers off, no raw kernel has read x permuted yet, not a 9..32-row
 * step, n_vals not whole 256-value blocks, or no memory); then remember that x has them
 * there; and the form of x (n_vals values) in `form`'s order held there, or NULL. */
__nv_bfloat16 *kern_xp_claim(struct ops_ctx *ctx, int64_t n_rows, int64_t n_vals, int *forms);
void kern_xp_remember(struct ops_ctx *ctx, const float *x, int64_t n_vals, int forms);
const __nv_bfloat16 *kern_xp_held(struct ops_ctx *ctx, const float *x, int64_t n_vals, int form);
/* y (n_rows, ne1) = x (n_rows, ne0) * W^T, by the decode products up to MATVEC_MAX_ROWS
 * rows and the batch products above (ops.h matmul); failures recorded in ctx. */
void kern_matmul(struct ops_ctx *ctx, const struct tpi_weight *w, const float *x, float *y,
                 int64_t n_rows);
/* ops.h matmul_n: several weights reading one x (x quantized / converted once). */
void kern_matmul_n(struct ops_ctx *ctx, int n_w, const struct tpi_weight *const *ws, const float *x,
                   float *const *ys, int64_t n_rows);

/* ---- the persistent decode-layer tail (kern_layer.cu) ---- */
/* Its barrier memory and shared-memory opt-in, at context init; false (recorded) on failure. */
bool kern_layer_init(struct ops_ctx *ctx);
/* Frees what kern_layer_init made (printing the trace first if TPI_LAYER_TRACE kept one). */
void kern_layer_free(struct ops_ctx *ctx);
/* Block b of G's rows [r0[s], r1[s]) of each of a phase's n_seg weights (rows[s] rows of
 * seg_bytes[s] bytes), as the layer-tail kernel splits them (unit: one weight whose
 * outputs the blocks quantize, in whole 32-row units); -1 on bad arguments. Host side,
 * for the tests. */
extern "C" int kern_layer_rows(int n_seg, const int *rows, const long long *seg_bytes, int unit,
                               int b, int G, int *r0, int *r1);
/* ops->layer_tail: true when launched; false (nothing queued) when not covered. */
bool kern_layer_tail(struct ops_ctx *ctx, const struct ops_layer_tail *t);
/* ops.h matmul_silu_mul: the FFN's gate, up and silu*mul (one launch for a decode row). */
void kern_matmul_silu_mul(struct ops_ctx *ctx, const struct tpi_weight *wg,
                          const struct tpi_weight *wu, const float *x, float *g, float *u,
                          int64_t n_rows);
/* ops.h matmul_add: y += x W^T. */
void kern_matmul_add(struct ops_ctx *ctx, const struct tpi_weight *w, const float *x, float *y,
                     int64_t n_rows);

/* ---- launchers (kern_gemv.cu) ---- */
/* The v3 matrix-vector path for n_rows (1..8) rows on ctx->stream (prepare + run);
 * false (nothing queued) when it does not cover w's type, shape or alignment: the
 * caller uses the v2 kernels. */
bool kern_gemv_v3(struct ops_ctx *ctx, const struct tpi_weight *w, const float *x, float *y,
                  int n_rows);
/* x (n_rows x ne0 f32) quantized for the v3 path. */
struct kern_gemv_x {
    const float *x;     /* the f32 x it was made from */
    const int8_t *xq;   /* int8 blocks of 32, or NULL when no quantized type needs it */
    const float2 *ds;   /* (d, d*sum) per block */
    int n_rows;
    int64_t ne0;
    const int8_t *xp;   /* kind p's permuted copies of xq (prepare writes them), or NULL:
                         * kind p then runs as kind a */
};
/* Queue the quantization of x on `stream` into ctx's q8 scratch and describe it in *gx;
 * false (nothing queued) when ne0 % 32 != 0, n_rows is not 1..8, or scratch allocation
 * failed (failure recorded). The scratch stays valid until the next kern_gemv_v3_prepare
 * or kern_gemv_v3 call. */
bool kern_gemv_v3_prepare(struct ops_ctx *ctx, const float *x, int n_rows, int64_t ne0,
                          cudaStream_t stream, struct kern_gemv_x *gx);
/* y (n_rows x ne1) = x W^T, or y += x W^T when accumulate, on `stream`, using the prepared
 * x (gx->x is the f32 x for BF16/F16 weights; gx->xq for quantized ones). false (nothing
 * queued) when the v3 path does not cover w's type/shape/alignment. Several calls on
 * different streams may read one prepared x at once; each output is written by one
 * thread after a fixed-order sum (race-free y +=, deterministic results). */
bool kern_gemv_v3_run(struct ops_ctx *ctx, const struct tpi_weight *w, const struct kern_gemv_x *gx,
                      float *y, bool accumulate, cudaStream_t stream);
/* ys[i] = x ws[i]^T for the n (<= OPS_MAX_FUSED) weights in one launch on `stream`, each
 * output computed exactly as kern_gemv_v3_run computes it; false (nothing queued) unless
 * all n share a type and row length the v3 path covers, and (n > 1) take kinds a/p/BF16. */
bool kern_gemv_v3_run_n(struct ops_ctx *ctx, int n, const struct tpi_weight *const *ws,
                        const struct kern_gemv_x *gx, float *const *ys, cudaStream_t stream);
/* mix for kern_gemv_v3_run_mix: the low byte bounds its kernel to that many blocks a
 * multiprocessor (8, 10, 12; 1: unbounded); GV_MIX_Q6_FIRST puts Q6_K's blocks first. */
#define GV_MIX_Q6_FIRST 0x100
/* ys[i] = x ws[i]^T for one decode row and n (2..OPS_MAX_FUSED) weights of one of Q4_K
 * and Q5_K and of Q6_K's groups (both present, one row length each), in one launch on
 * `stream`, each output bitwise as kern_gemv_v3_run_n computes it; false (nothing
 * queued) for anything else, or mix <= 0. */
bool kern_gemv_v3_run_mix(struct ops_ctx *ctx, int n, const struct tpi_weight *const *ws,
                          const struct kern_gemv_x *gx, float *const *ys, int mix,
                          cudaStream_t stream);
/* Whether kern_gemv_v3_run_glu takes this gate/up pair with x prepared as gx: one row,
 * one type, shape and row size, a form of x both read, n_ff a multiple of 32 (quantized;
 * 4 for BF16/F16), and not kind b. */
bool kern_gemv_v3_glu_ok(const struct tpi_weight *wg, const struct tpi_weight *wu,
                         const struct kern_gemv_x *gx);
/* g = silu(x Wg^T) * (x Wu^T) and u = x Wu^T for one row in one launch on `stream`, and
 * (quantized weights, oq non-NULL) g's int8 form in kern_xq.cuh's layout for one row of
 * n_ff at oq / ods, bitwise what silu_mul would write; warps: warps a block for quantized
 * weights (4, 8, 16, 32; anything else: the most that keep the grid in one wave). false
 * (nothing queued) when kern_gemv_v3_glu_ok says no. g, u and x must not overlap, and oq
 * must not be the scratch gx reads. */
bool kern_gemv_v3_run_glu(struct ops_ctx *ctx, const struct tpi_weight *wg,
                          const struct tpi_weight *wu, const struct kern_gemv_x *gx, float *g,
                          float *u, int8_t *oq, float2 *ods, int warps, cudaStream_t stream);
/* Test and bench hooks with C linkage: kern_gemv_hooks.h. */
extern "C" {
#include "kernels/kern_gemv_hooks.h"
}

/* ---- launchers (kern_attn.cu) ---- */
void kern_attention(struct ops_ctx *ctx, struct ops_kv *kv, int layer, const float *q,
                    const float *k, const float *v, float *out, const struct ops_batch *b,
                    int n_head, float scale);
/* qk_norm_rope's parameters, for an attention that runs it first (ops.h
 * qk_norm_rope_attention). */
struct kern_qk {
    const float *q_norm, *k_norm; /* NULL: no norm */
    struct rope_pairs rope;
    float eps;
};
/* kern_qk_norm_rope of q, k with qk's parameters, then kern_attention: the tensor-core
 * decode kernel does the first inside itself where it can (q and k are then left as they
 * were; TPI_QK_ATTN=0: never), every other shape queues kern_qk_norm_rope first. */
void kern_attention_qk(struct ops_ctx *ctx, struct ops_kv *kv, int layer, float *q, float *k,
                       const float *v, float *out, const struct ops_batch *b, int n_head,
                       float scale, const struct kern_qk *qk);
/* One-time setup of the attention kernels (shared-memory opt-in); false on error. */
bool kern_attention_init(struct ops_ctx *ctx);
/* The tensor-core path (kern_attn_mma.cu), called by kern_attention before anything is
 * queued: queues the store of k, v into this layer's cache (kc, vc) and the attention of b
 * into out (for <= 8 decode rows also out's int8 form for the next matmul, when
 * kern_xq_claim grants it to XQ_BY_ATTN), and returns true; false (nothing queued) for
 * shapes it leaves to the CUDA-core kernels (head_dim other than 64 or 128, unaligned
 * cache) or when TPI_ATTN_MMA turns that shape off. max_pos: 1 + the largest valid
 * position of b (sizes split-K). qk non-NULL (q, k then writable): qk_norm_rope of q and
 * k comes first, inside the decode kernel where kern_attention_qk says, else queued here
 * (kern_qk_norm_rope) before the rest; when it returns false nothing of it is queued. */
bool kern_attention_mma(struct ops_ctx *ctx, const struct ops_kv *kv, __half *kc, __half *vc,
                        const float *q, const float *k, const float *v, float *out,
                        const struct ops_batch *b, int n_head, float scale, int max_pos,
                        const struct kern_qk *qk);
/* Queue the store of the batch's k, v (n_tokens, n_kv_head, head_dim) into this layer's
 * cache at (seq[t], pos[t]) (tokens outside the cache are skipped); false on a launch error. */
bool kern_attn_store(struct ops_ctx *ctx, const struct ops_kv *kv, __half *kc, __half *vc,
                     const float *k, const float *v, const struct ops_batch *b);
/* Its setup (TPI_ATTN_MMA, shared-memory opt-in); false on error. */
bool kern_attention_mma_init(struct ops_ctx *ctx);
/* A -DTPI_ATTN_TRACE=1 build: the last decode call's per-block times on stderr; else nothing. */
void kern_attn_trace_dump(void);
/* Query blocks of the mma path from token *t on: runs of consecutive tokens with one slot
 * cut into pieces of at most per_block tokens, each written to blk as
 * first_token << 7 | (n - 1) (blk NULL: only counted), at most cap of them; advances *t
 * past the tokens covered and returns the count. */
extern "C" int kern_attn_blocks(const int32_t *seq, int n_tokens, int per_block, int *t,
                                int32_t *blk, int cap);
/* The decode split's cluster plan (kern_attn_mma.cu): fit[c] clusters of c blocks
 * resident at once (c = 0..16), cmax the largest cluster (taken as at most 8, the most the
 * kernel merges), ncl_max the most clusters a head block may take, base head blocks in the
 * launch, n_split > 1 ranges wanted over max_pos keys, tk keys a tile, blk_pieces the most
 * 32-value pieces of one block's rows, nw warps a block. Returns the ranges to launch and
 * sets *n_cl (>= 1, dividing them): the head block's ranges run as *n_cl clusters. */
extern "C" int kern_attn_dec_plan(const int *fit, int cmax, int ncl_max, long base, int n_split,
                                  long max_pos, int tk, long blk_pieces, int nw, int *n_cl);
/* ops_cuda_set_attn_mma (kern_attn_mma.cu): declared in ops.h. */

#endif /* KERN_COMMON_CUH */
