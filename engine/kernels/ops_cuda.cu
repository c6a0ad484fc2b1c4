/*
 * ops_cuda.cu — the CUDA backend of the op table (ops.h): the context (device,
 * one compute stream, cuBLAS handle, scratch), device memory, weight upload in
 * the GGUF type through pinned staging, the f16 KV cache, and the table that
 * routes compute ops to the kern_* launchers.
 *
 * Errors: compute ops are stream-ordered and return nothing, so the first CUDA or
 * cuBLAS failure is recorded in the context (op, call, file:line) and handed out
 * by ops->check. Only the CUDA runtime API is called (no driver API), so a
 * binary linked with this file starts on machines without a GPU or driver and
 * ops_cuda_available() simply says false.
 */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern_common.cuh"

/* Pinned staging for weight uploads: two halves, one filled while the other copies. */
#define STAGING_BYTES ((size_t)64 << 20)

/* ---- errors ---- */

void kern_fail(struct ops_ctx *ctx, int status, const char *op, const char *file, int line,
               const char *fmt, ...) {
    if (ctx->err.status != TPI_OK) return;
    char what[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    const char *base = strrchr(file, '/');
    tpi_err(&ctx->err, status, "%s: %s (%s:%d)", op, what, base ? base + 1 : file, line);
}

bool kern_cuda_ok(struct ops_ctx *ctx, cudaError_t e, const char *op, const char *expr,
                  const char *file, int line) {
    if (e == cudaSuccess) return true;
    kern_fail(ctx, e == cudaErrorMemoryAllocation ? TPI_ERR_NOMEM : TPI_ERR_CUDA, op, file, line,
              "%s failed: %s (%s)", expr, cudaGetErrorString(e), cudaGetErrorName(e));
    return false;
}

bool kern_cublas_ok(struct ops_ctx *ctx, cublasStatus_t s, const char *op, const char *expr,
                    const char *file, int line) {
    if (s == CUBLAS_STATUS_SUCCESS) return true;
    kern_fail(ctx, s == CUBLAS_STATUS_ALLOC_FAILED ? TPI_ERR_NOMEM : TPI_ERR_CUDA, op, file, line,
              "%s failed: %s", expr, cublasGetStatusString(s));
    return false;
}

void *kern_scratch_get(struct ops_ctx *ctx, struct kern_scratch *s, size_t n_bytes,
                       const char *op) {
    if (n_bytes <= s->n_bytes) return s->p;
    /* not while a graph is being recorded: the old buffer cannot be waited for (and the
     * recording may hold it), and a new one's first contents (kern_mmq zeroes its
     * counters) would be queued into the recording only. The recording fails, its step
     * runs plainly, which grows the buffer, and the shape is recorded again later. */
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(ctx->stream, &cap) == cudaSuccess &&
        cap != cudaStreamCaptureStatusNone) {
        kern_fail(ctx, TPI_ERR_CUDA, op, __FILE__, __LINE__,
                  "a scratch buffer must grow (to %zu bytes) while a graph is recorded",
                  n_bytes);
        return NULL;
    }
    /* the old buffer may still be in use by queued work: let it finish first */
    if (s->p) {
        CUDA_OK(ctx, op, cudaStreamSynchronize(ctx->stream));
        CUDA_OK(ctx, op, cudaFree(s->p));
    }
    s->p = NULL;
    s->n_bytes = 0;
    const size_t want = n_bytes + n_bytes / 4; /* headroom, so growth is rare */
    if (!CUDA_OK(ctx, op, cudaMalloc(&s->p, want))) {
        s->p = NULL;
        return NULL;
    }
    s->n_bytes = want;
    return s->p;
}

bool kern_type_supported(int type) {
    switch (type) {
    case TPI_TYPE_F32:
    case TPI_TYPE_F16:
    case TPI_TYPE_BF16:
    case TPI_TYPE_Q4_0:
    case TPI_TYPE_Q4_1:
    case TPI_TYPE_Q5_0:
    case TPI_TYPE_Q5_1:
    case TPI_TYPE_Q8_0:
    case TPI_TYPE_Q2_K:
    case TPI_TYPE_Q3_K:
    case TPI_TYPE_Q4_K:
    case TPI_TYPE_Q5_K:
    case TPI_TYPE_Q6_K:
    case TPI_TYPE_IQ4_NL:
    case TPI_TYPE_IQ4_XS:
        return true;
    default:
        return false;
    }
}

/* ---- context ---- */

static void cuda_free(struct ops_ctx **pctx) {
    if (!pctx || !*pctx) return;
    struct ops_ctx *ctx = *pctx;
    cudaSetDevice(ctx->device);
    if (ctx->stream) cudaStreamSynchronize(ctx->stream);
    struct kern_scratch *bufs[KERN_N_SCRATCH];
    kern_scratch_all(ctx, bufs);
    for (int i = 0; i < KERN_N_SCRATCH; i++)
        if (bufs[i]->p) cudaFree(bufs[i]->p);
    if (ctx->pinned) cudaFreeHost(ctx->pinned);
    for (int i = 0; i < 2; i++)
        if (ctx->staged[i]) cudaEventDestroy(ctx->staged[i]);
    for (int i = 0; i < OPS_MAX_FUSED - 1; i++) {
        if (ctx->cublas_side[i]) cublasDestroy(ctx->cublas_side[i]);
        if (ctx->side[i]) cudaStreamDestroy(ctx->side[i]);
        if (ctx->ev_join[i]) cudaEventDestroy(ctx->ev_join[i]);
    }
    if (ctx->ev_fork) cudaEventDestroy(ctx->ev_fork);
    if (ctx->rope_inv) cudaFree(ctx->rope_inv);
    kern_attn_trace_dump();
    kern_layer_free(ctx);
    if (ctx->cublas) cublasDestroy(ctx->cublas);
    if (ctx->stream) cudaStreamDestroy(ctx->stream);
    free(ctx);
    *pctx = NULL;
}

/* The decode matrix-vector path from TPI_GEMV ("v2"/"2", "v3"/"3"); v2 when unset or
 * unknown (with a warning), so a typo never changes results silently. */
/* Decode matrix-vector path: v3 (int8 x + dp4a for quantized weights, 16-byte rows for
 * BF16/F16; 1.5-2x the tg speed of v2 on the H200, bench/RESULTS.md) unless TPI_GEMV=v2
 * asks for f32 x everywhere. */
static int gemv_from_env(void) {
    const char *v = getenv("TPI_GEMV");
    if (!v || !*v) return 3;
    if (strcmp(v, "v2") == 0 || strcmp(v, "2") == 0) return 2;
    if (strcmp(v, "v3") != 0 && strcmp(v, "3") != 0)
        tpi_log(TPI_LOG_WARN, "TPI_GEMV=%s is neither v2 nor v3: using v3", v);
    return 3;
}

int ops_cuda_set_gemv(struct ops_ctx *ctx, int path) {
    if (!ctx || (path != 2 && path != 3)) return -1;
    const int old = ctx->gemv;
    ctx->gemv = path;
    return old;
}

int ops_cuda_set_mmq(struct ops_ctx *ctx, int max_rows) {
    if (!ctx || max_rows < 0) return -1;
    const int old = ctx->mmq_rows;
    ctx->mmq_rows = TPI_MIN(max_rows, MMQ_MAX_ROWS);
    return old;
}

int ops_cuda_set_glu(struct ops_ctx *ctx, int mode) {
    if (!ctx || !(mode == -1 || mode == 0 || mode == 4 || mode == 8 || mode == 16 || mode == 32))
        return -2;
    const int old = ctx->glu;
    ctx->glu = mode;
    return old;
}

/* The bits a comma-separated list of names (names[i] -> bits[i], n of them) sets; -1 when
 * an item is none of the names. */
static int bits_from_list(const char *v, const char *const *names, const int *bits, int n) {
    int r = 0;
    for (const char *p = v;;) {
        const size_t len = strcspn(p, ",");
        int i = 0;
        while (i < n && !(strlen(names[i]) == len && strncmp(p, names[i], len) == 0))
            i++;
        if (i == n) return -1;
        r |= bits[i];
        if (!p[len]) return r;
        p += len + 1;
    }
}

/* The memo producers (XQ_BY_*) TPI_XQ_MEMO names: unset, empty or "1" all three, "0"
 * none, else a comma-separated list of "norm", "silu", "attn" ("norm,silu": the default
 * before the attention produced); -1 when it is none of these. */
static int xq_produce_from(const char *v) {
    static const char *const names[] = {"norm", "silu", "attn"};
    static const int bits[] = {XQ_BY_NORM, XQ_BY_SILU, XQ_BY_ATTN};
    if (!v || !*v || strcmp(v, "1") == 0) return XQ_BY_NORM | XQ_BY_SILU | XQ_BY_ATTN;
    if (strcmp(v, "0") == 0) return 0;
    return bits_from_list(v, names, bits, 3);
}

/* TPI_DIAG_SKIP: a comma-separated list of norm, rope, attn -> DIAG_SKIP_* bits; -1 for
 * anything else. */
static int diag_skip_from(const char *v) {
    static const char *const names[] = {"norm", "rope", "attn"};
    static const int bits[] = {DIAG_SKIP_NORM, DIAG_SKIP_ROPE, DIAG_SKIP_ATTN};
    return bits_from_list(v, names, bits, 3);
}

/* Environment variable `name` as a count 0..max, or def when unset (and, with a warning,
 * when it is not such a count). */
static long env_count(const char *name, long def, long max) {
    const char *v = getenv(name);
    if (!v || !*v) return def;
    char *end;
    const long n = strtol(v, &end, 10);
    if (*end || n < 0 || n > max) {
        if (max == LONG_MAX)
            TPI_LOGW("%s=%s is not a count: using %ld", name, v, def);
        else
            TPI_LOGW("%s=%s is not a count 0..%ld: using %ld", name, v, max, def);
        return def;
    }
    return n;
}

static int cuda_init(struct ops_ctx **out, const struct ops_config *cfg, struct tpi_error *err) {
    *out = NULL;
    const int device = cfg ? cfg->device : 0;
    int n_devices = 0;
    cudaError_t e = cudaGetDeviceCount(&n_devices);
    if (e != cudaSuccess || n_devices <= 0) {
        cudaGetLastError(); /* clear it: the runtime keeps the last error per thread */
        return tpi_err(err, TPI_ERR_CUDA, "cuda init: no usable GPU (%s)",
                       e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    }
    if (device < 0 || device >= n_devices)
        return tpi_err(err, TPI_ERR_INVALID, "cuda init: device %d requested, %d visible", device,
                       n_devices);
    struct ops_ctx *ctx = (struct ops_ctx *)calloc(1, sizeof *ctx);
    if (!ctx) return tpi_err(err, TPI_ERR_NOMEM, "cuda init: out of memory for the context");
    ctx->device = device;
    cudaDeviceProp prop;
    cublasStatus_t cs = CUBLAS_STATUS_SUCCESS;
    if (!CUDA_OK(ctx, "cuda init", cudaSetDevice(device)) ||
        !CUDA_OK(ctx, "cuda init", cudaGetDeviceProperties(&prop, device)) ||
        !CUDA_OK(ctx, "cuda init",
                 cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking)) ||
        !CUBLAS_OK(ctx, "cuda init", cs = cublasCreate(&ctx->cublas)) ||
        !CUBLAS_OK(ctx, "cuda init", cublasSetStream(ctx->cublas, ctx->stream)) ||
        !CUDA_OK(ctx, "cuda init",
                 cudaEventCreateWithFlags(&ctx->staged[0], cudaEventDisableTiming)) ||
        !CUDA_OK(ctx, "cuda init",
                 cudaEventCreateWithFlags(&ctx->staged[1], cudaEventDisableTiming))) {
        if (cs != CUBLAS_STATUS_SUCCESS) ctx->cublas = NULL;
        *err = ctx->err;
        cuda_free(&ctx);
        return err->status;
    }
    /* side streams for matmul_n's parallel branches (TPI_NO_FORK=1: all on one stream) */
    const char *nf = getenv("TPI_NO_FORK");
    if (!(nf && *nf && strcmp(nf, "0") != 0)) {
        bool ok = CUDA_OK(ctx, "cuda init",
                          cudaEventCreateWithFlags(&ctx->ev_fork, cudaEventDisableTiming));
        for (int i = 0; ok && i < OPS_MAX_FUSED - 1; i++)
            ok = CUDA_OK(ctx, "cuda init",
                         cudaStreamCreateWithFlags(&ctx->side[i], cudaStreamNonBlocking)) &&
                 CUDA_OK(ctx, "cuda init",
                         cudaEventCreateWithFlags(&ctx->ev_join[i], cudaEventDisableTiming)) &&
                 CUBLAS_OK(ctx, "cuda init", cublasCreate(&ctx->cublas_side[i])) &&
                 CUBLAS_OK(ctx, "cuda init", cublasSetStream(ctx->cublas_side[i], ctx->side[i]));
        if (!ok) {
            *err = ctx->err;
            cuda_free(&ctx);
            return err->status;
        }
    }
    ctx->gemv = gemv_from_env();
    /* Block-quantized products of 9..32 rows (a batch's decode steps) in kern_mmq: each
     * weight byte read once, against the bf16 slab the prefill path writes and reads
     * back. H200 (run 120): Q4_K 4096->12288 at 16 / 32 rows 31 / 43 us against ~90
     * via cuBLAS; at 64 rows level for Q4_K and 152 against 81 us for Q6_K (run 116), so
     * the default stops at 32. TPI_MMQ=N: up to N rows (at most 64; 0: never). */
    ctx->mmq_rows =
        (int)TPI_MIN(env_count("TPI_MMQ", MMQ_DEFAULT_ROWS, LONG_MAX), (long)MMQ_MAX_ROWS);
    /* TPI_MMQ_BPS=N (a measuring knob): kern_mmq splits k until about N blocks a
     * multiprocessor (1..16, default 3; 0: as many as one holds, which run 120 measured
     * slower end to end: batch-bench --parallel 32 2547 against 2672 generated tok/s) */
    ctx->mmq_bps = (int)env_count("TPI_MMQ_BPS", 3, 16);
    /* TPI_MMQ_RAW=0: kern_mmq decodes Q4_K and Q6_K's groups to bf16 weights as the other
     * types (the raw paths send the quants to the tensor cores and apply the scales to the
     * sums); 1: Q4_K's raw path only, 2: Q6_K's only; default both */
    ctx->mmq_raw = (int)env_count("TPI_MMQ_RAW", MMQ_RAW_Q4_K | MMQ_RAW_Q6_KX8,
                                  MMQ_RAW_Q4_K | MMQ_RAW_Q6_KX8);
    /* kern_mmq's raw kernels (Q4_K and Q6_K's groups up to 32 rows) held to 3 blocks an SM
     * (168 registers; unbounded they take 220-254: 2 an SM) and reading x permuted into
     * their staging order by the launch that rounds it to bf16 (16-byte pieces staged
     * instead of 4-byte ones); TPI_MMQ_HOLD (bits as TPI_MMQ_RAW's: 1 Q4_K, 2 Q6_K's
     * groups, default both) and TPI_MMQ_XP=0 leave them out (bench/NOTES.md change 155) */
    ctx->mmq_hold = (int)env_count("TPI_MMQ_HOLD", MMQ_RAW_Q4_K | MMQ_RAW_Q6_KX8,
                                   MMQ_RAW_Q4_K | MMQ_RAW_Q6_KX8);
    ctx->mmq_xp = (int)env_count("TPI_MMQ_XP", 1, 1);
    /* rmsnorm and the batch silu*mul write their output's bf16 form in those orders too,
     * for the 9..32-row raw products after them (one launch fewer each); TPI_XP_MEMO (bits
     * as TPI_MMQ_RAW's: 1 Q4_K's order, 2 Q6_K's groups', default both; 0: neither;
     * bench/NOTES.md change 161) */
    ctx->xp_produce = (int)env_count("TPI_XP_MEMO", MMQ_RAW_Q4_K | MMQ_RAW_Q6_KX8,
                                     MMQ_RAW_Q4_K | MMQ_RAW_Q6_KX8);
    /* kern_mmq's k split: the slices added by each column's last block to finish, in the
     * order mmq_reduce adds them (the same sums), where a column's slices are at most
     * TPI_MMQ_FIXUP KiB (default 64: one block's tail; 0: always by mmq_reduce, a launch of
     * its own; bench/NOTES.md changes 157 and 159) */
    ctx->mmq_fixup = (int)env_count("TPI_MMQ_FIXUP", 64, 1 << 20);
    const char *hp = getenv("TPI_PINNED_HOST");
    ctx->host_pinned = !(hp && strcmp(hp, "0") == 0);
    const char *ds = getenv("TPI_DIAG_SKIP");
    if (ds && *ds) {
        ctx->diag_skip = diag_skip_from(ds);
        if (ctx->diag_skip < 0) {
            TPI_LOGW("TPI_DIAG_SKIP=%s is not a list of norm, rope, attn: ignored", ds);
            ctx->diag_skip = 0;
        } else {
            TPI_LOGW("TPI_DIAG_SKIP=%s: decode steps leave those kernels out; outputs are wrong "
                     "(for measuring what they cost)",
                     ds);
        }
    }
    /* Producers of the next matmul's int8 x (bench/NOTES.md, changes 12 and 14): rmsnorm,
     * silu*mul and the decode attention by default (TPI_XQ_MEMO=1). Once rmsnorm ran over
     * many blocks (its split kernel), norm and silu pay: tg128 Q4_K_M 330.7 -> 352.1, Q8_0
     * 283.3 -> 294.0 (H200). Our other decode kernels are launched with PDL too (TPI_PDL=0:
     * not): measured no gain before the gate/up launch, and with it (run 23) tg128 Q8_0
     * 355.9 -> 364.2, Q4_K_M 399.9 -> 419.4 (bench/NOTES.md change 24). */
    const char *xm = getenv("TPI_XQ_MEMO");
    ctx->xq_produce = xq_produce_from(xm);
    if (ctx->xq_produce < 0) {
        TPI_LOGW("TPI_XQ_MEMO=%s is not 0, 1 or a list of silu, norm, attn: ignored", xm);
        ctx->xq_produce = XQ_BY_NORM | XQ_BY_SILU | XQ_BY_ATTN;
    }
    /* Decode rows' rmsnorm split over many blocks (kern_elem.cu, rmsnorm_split_kernel). */
    const char *rs = getenv("TPI_RMS_SPLIT");
    ctx->rms_split = !(rs && strcmp(rs, "0") == 0);
    /* matmul_n's decode weights that join weight 0's launch (kern_gemv_v3_run_n) instead of
     * running as parallel branches on side streams, among those of weight 0's type and row
     * length. TPI_GEMV_MERGE: 1 (default) auto: for quantized weights all of them for
     * rows of <= 4096 bytes, else those with at most half weight 0's rows (K and V with
     * Q; gate and up stay two branches), all for BF16/F16 (kern_matmul.cu,
     * GEMV_MERGE_ROW_BYTES); 2 all; 3 those with at most half its rows; 0 none. H200
     * tg128 (bench/NOTES.md change 16), none / half the rows / all: Q4_K_M 352 / 364 /
     * 379, Q8_0 294 / 299 / 293. */
    const char *gm = getenv("TPI_GEMV_MERGE");
    ctx->gemv_merge = 1;
    if (gm && *gm) {
        if (gm[1] == 0 && gm[0] >= '0' && gm[0] <= '3')
            ctx->gemv_merge = gm[0] - '0';
        else
            TPI_LOGW("TPI_GEMV_MERGE=%s is not 0, 1, 2 or 3: ignored", gm);
    }
    /* matmul_n's decode weights of Q4_K (or Q5_K) and Q6_K (Q/K/V of a Q4_K_M or Q5_K_M
     * layer whose V has more bits) in one launch instead of Q6_K's as a parallel branch
     * (kern_gemv_v3_run_mix), which lets the attention in at its start as the one-type
     * launch does: the branch's join held the attention's blocks back to its end.
     * TPI_GEMV_MIX: 0 off; 1
     * (unbounded), 8, 10 or 12 (blocks a multiprocessor the kernel is held to), with an
     * 'r' after it: Q6_K's blocks first. Default 8r: tg128 Q4_K_M +2.0 %, depth 8192
     * +1.1 % against off; 8 +0.5 %, 12r -6 % (run 186, bench/NOTES.md change 106). */
    const char *gx = getenv("TPI_GEMV_MIX");
    ctx->gemv_mix = 8 | GV_MIX_Q6_FIRST;
    if (gx && *gx) {
        char *end = NULL;
        const long v = strtol(gx, &end, 10);
        const bool rev = end && *end == 'r';
        if (end == gx || (*end && !(rev && end[1] == 0)) ||
            !(v == 0 || v == 1 || v == 8 || v == 10 || v == 12))
            TPI_LOGW("TPI_GEMV_MIX=%s is not 0, 1, 8, 10 or 12 (with an optional r): ignored", gx);
        else
            ctx->gemv_mix = (int)v | (v && rev ? GV_MIX_Q6_FIRST : 0);
    }
    const char *pd = getenv("TPI_PDL");
    ctx->pdl = !(pd && strcmp(pd, "0") == 0);
    /* The FFN's gate, up and silu*mul as one decode launch (kern_gemv.cu): TPI_GLU=0 off
     * (matmul_n, then silu_mul), 4/8/16/32 warps a block for quantized weights, anything
     * else auto: Q4_K rows of 4096 values streamed through shared memory (the ring
     * kernel), other shapes the most warps that keep the launch in one wave. */
    const char *gl = getenv("TPI_GLU");
    ctx->glu = -1;
    if (gl && *gl) {
        static const char *const known[] = {"0", "4", "8", "16", "32"};
        bool ok = strcmp(gl, "auto") == 0;
        for (int i = 0; i < 5 && !ok; i++)
            if (strcmp(gl, known[i]) == 0) ok = true, ctx->glu = atoi(gl);
        if (!ok) TPI_LOGW("TPI_GLU=%s is not 0, 4, 8, 16, 32 or auto: ignored", gl);
    }
    /* matmul_n's joined decode launch (Q/K/V) lets the next kernel launch at its start
     * (TPI_QKV_TRIGGER=0: not; bench/NOTES.md change 85) */
    const char *qt = getenv("TPI_QKV_TRIGGER");
    ctx->qkv_trigger = !(qt && strcmp(qt, "0") == 0);
    /* wo's weights asked of L2 during the decode attention: from its start under this
     * depth, after its K/V stream from it up (TPI_WO_PREFETCH=0: never; change 86) */
    const char *wp = getenv("TPI_WO_PREFETCH");
    ctx->wo_prefetch = wp ? atoi(wp) : 2048;
    ctx->wo_early = true;
    /* qk_norm_rope inside the tensor-core decode attention (kern_attn_mma.cu; TPI_QK_ATTN=0:
     * its own kernel first, bench/NOTES.md change 84) */
    const char *qa = getenv("TPI_QK_ATTN");
    ctx->qk_attn = !(qa && strcmp(qa, "0") == 0);
    const char *qr = getenv("TPI_Q8_REPACK");
    ctx->q8_repack = !(qr && strcmp(qr, "0") == 0);
    const char *q6r = getenv("TPI_Q6_REPACK");
    ctx->q6_repack = !(q6r && strcmp(q6r, "0") == 0);
    const char *q3r = getenv("TPI_Q3_REPACK");
    ctx->q3_repack = !(q3r && strcmp(q3r, "0") == 0);
    const char *q4r = getenv("TPI_Q4_REPACK");
    ctx->q4_repack = !(q4r && strcmp(q4r, "0") == 0);
    ctx->n_sm = prop.multiProcessorCount;
    ctx->smem_optin = prop.sharedMemPerBlockOptin;
    snprintf(ctx->name, sizeof ctx->name, "%s", prop.name);
    if (!kern_attention_init(ctx) || !kern_layer_init(ctx)) {
        *err = ctx->err;
        cuda_free(&ctx);
        return err->status;
    }
    *out = ctx;
    return TPI_OK;
}

static int cuda_check(struct ops_ctx *ctx, struct tpi_error *err) {
    /* a launch error not yet seen by any launcher (and cleared here) */
    CUDA_OK(ctx, "cuda (pending)", cudaGetLastError());
    const int status = ctx->err.status;
    if (status != TPI_OK && err) *err = ctx->err;
    tpi_err_clear(&ctx->err);
    return status;
}

static const char *cuda_device_name(struct ops_ctx *ctx) {
    return ctx->name;
}

static void *cuda_stream(struct ops_ctx *ctx) {
    return (void *)ctx->stream;
}

/* ---- memory ---- */

static void *cuda_alloc(struct ops_ctx *ctx, size_t n_bytes) {
    kern_xq_forget(ctx);
    void *p = NULL;
    if (n_bytes == 0) n_bytes = 1;
    if (!CUDA_OK(ctx, "cuda alloc", cudaMalloc(&p, n_bytes))) return NULL;
    /* zeroed, as the contract says; on the stream so later ops see it done */
    if (!CUDA_OK(ctx, "cuda alloc", cudaMemsetAsync(p, 0, n_bytes, ctx->stream)) ||
        !CUDA_OK(ctx, "cuda alloc", cudaStreamSynchronize(ctx->stream))) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cuda_dealloc(struct ops_ctx *ctx, void *p) {
    kern_xq_forget(ctx);
    if (p) CUDA_OK(ctx, "cuda dealloc", cudaFree(p));
}

/* From pageable memory, cudaMemcpyAsync returns once the bytes are staged, so src may
 * be reused at once; from pinned memory the caller keeps src valid until sync (ops.h). */
static void cuda_to_dev(struct ops_ctx *ctx, void *dst, const void *src, size_t n_bytes) {
    kern_xq_forget(ctx);
    if (n_bytes)
        CUDA_OK(ctx, "cuda to_dev",
                cudaMemcpyAsync(dst, src, n_bytes, cudaMemcpyHostToDevice, ctx->stream));
}

/* Mark the host as blocked on the stream from now (visible to ops->wait_s), and not. */
static void wait_begin(struct ops_ctx *ctx) {
    __atomic_store_n(&ctx->wait_since_ns, (uint64_t)(tpi_time_s() * 1e9) | 1u, __ATOMIC_RELAXED);
}
static void wait_end(struct ops_ctx *ctx) {
    __atomic_store_n(&ctx->wait_since_ns, (uint64_t)0, __ATOMIC_RELAXED);
}

static double cuda_wait_s(struct ops_ctx *ctx) {
    const uint64_t t = __atomic_load_n(&ctx->wait_since_ns, __ATOMIC_RELAXED);
    return t ? tpi_time_s() - (double)t * 1e-9 : 0.0;
}

static void cuda_to_host(struct ops_ctx *ctx, void *dst, const void *src, size_t n_bytes) {
    if (!n_bytes) return;
    // into pageable memory the copy itself waits for the queued work: watch it too
    wait_begin(ctx);
    if (CUDA_OK(ctx, "cuda to_host",
                cudaMemcpyAsync(dst, src, n_bytes, cudaMemcpyDeviceToHost, ctx->stream)))
        CUDA_OK(ctx, "cuda to_host", cudaStreamSynchronize(ctx->stream));
    wait_end(ctx);
}

/* Pinned host memory (TPI_PINNED_HOST=0: malloc, for comparison): a copy of the logits
 * into it is one DMA, where a copy into pageable memory goes through the driver's
 * staging buffers. Where pinning fails (a large perplexity window), plain malloc. */
static void *cuda_host_alloc(struct ops_ctx *ctx, size_t n_bytes) {
    void *p = NULL;
    if (ctx->host_pinned && cudaHostAlloc(&p, n_bytes, cudaHostAllocDefault) == cudaSuccess)
        return p;
    cudaGetLastError(); /* a refused pinning is not a failure of queued work */
    return malloc(n_bytes);
}

static void cuda_host_free(struct ops_ctx *ctx, void *p) {
    (void)ctx;
    if (!p) return;
    unsigned int flags = 0;
    if (cudaHostGetFlags(&flags, p) == cudaSuccess) {
        cudaFreeHost(p);
    } else {
        cudaGetLastError(); /* not pinned: from the malloc fallback */
        free(p);
    }
}

static void cuda_copy(struct ops_ctx *ctx, void *dst, const void *src, size_t n_bytes) {
    kern_xq_forget(ctx);
    if (n_bytes)
        CUDA_OK(ctx, "cuda copy",
                cudaMemcpyAsync(dst, src, n_bytes, cudaMemcpyDeviceToDevice, ctx->stream));
}

static void cuda_sync(struct ops_ctx *ctx) {
    wait_begin(ctx);
    CUDA_OK(ctx, "cuda sync", cudaStreamSynchronize(ctx->stream));
    wait_end(ctx);
}

/* ---- weights and cache ---- */

/* Copy n_bytes from host to device through the pinned staging halves: the CPU fills one
 * half while the DMA engine drains the other. Returns false with ctx->err set. */
static bool upload_staged(struct ops_ctx *ctx, void *dst, const void *src, size_t n_bytes) {
    const char *op = "cuda weight_upload";
    if (!ctx->pinned) {
        if (!CUDA_OK(ctx, op, cudaHostAlloc(&ctx->pinned, STAGING_BYTES, cudaHostAllocDefault))) {
            ctx->pinned = NULL;
            return false;
        }
        ctx->pinned_bytes = STAGING_BYTES;
    }
    const size_t half = ctx->pinned_bytes / 2;
    int which = 0;
    for (size_t off = 0; off < n_bytes; off += half, which ^= 1) {
        const size_t n = TPI_MIN(half, n_bytes - off);
        uint8_t *stage = (uint8_t *)ctx->pinned + (size_t)which * half;
        /* wait until this half's previous copy has left it */
        if (!CUDA_OK(ctx, op, cudaEventSynchronize(ctx->staged[which]))) return false;
        memcpy(stage, (const uint8_t *)src + off, n);
        if (!CUDA_OK(ctx, op,
                     cudaMemcpyAsync((uint8_t *)dst + off, stage, n, cudaMemcpyHostToDevice,
                                     ctx->stream)) ||
            !CUDA_OK(ctx, op, cudaEventRecord(ctx->staged[which], ctx->stream)))
            return false;
    }
    /* host_data need not outlive the call, and the halves are reused next time */
    return CUDA_OK(ctx, op, cudaStreamSynchronize(ctx->stream));
}

static int cuda_weight_upload(struct ops_ctx *ctx, struct tpi_weight *w, int type, int64_t ne0,
                              int64_t ne1, const void *host_data, struct tpi_error *err);

/* The types held in another type under TPI_HOLD=1, at 1.9-2x the memory, whose decode ran
 * faster on the H200 before change 149 and runs slower on an H100 (quant_gpu_held_type,
 * converted by quant_convert_held; bench/NOTES.md changes 148-149): Q3_K as Q6_K and
 * IQ4_NL as Q8_0 with the same values, IQ4_XS as Q8_0 with its sub-block scales rounded to
 * f16 (a relative change of at most 2^-11, against the format's own error of percents).
 * Said once a type and context. */
static int upload_converted(struct ops_ctx *ctx, struct tpi_weight *w, int type, int64_t ne0,
                            int64_t ne1, const void *host_data, struct tpi_error *err) {
    const struct quant_traits *tr = quant_traits(type);
    const int held = quant_gpu_held_type(type);
    if (ne0 <= 0 || ne1 <= 0 || ne0 % tr->blck_size != 0)
        return tpi_err(err, TPI_ERR_INVALID,
                       "cuda weight_upload: shape %lld x %lld of type %s: ne0 must be a positive "
                       "multiple of the block size %d",
                       (long long)ne0, (long long)ne1, tr->name, tr->blck_size);
    const size_t row_bytes = quant_row_size(held, ne0), src_row = quant_row_size(type, ne0);
    if ((size_t)ne1 > SIZE_MAX / 2 / row_bytes)
        return tpi_err(err, TPI_ERR_INVALID, "cuda weight_upload: %s tensor %lld x %lld is too large",
                       tr->name, (long long)ne0, (long long)ne1);
    void *buf = malloc(row_bytes * (size_t)ne1);
    if (!buf)
        return tpi_err(err, TPI_ERR_NOMEM, "cuda weight_upload: out of host memory converting %s",
                       tr->name);
    int rc = TPI_OK;
    for (int64_t r = 0; r < ne1 && rc == TPI_OK; r++) {
        int64_t bad = -1;
        if (quant_convert_held(type, (const uint8_t *)host_data + (size_t)r * src_row,
                               (uint8_t *)buf + (size_t)r * row_bytes, ne0, &bad) != TPI_OK)
            rc = tpi_err(err, TPI_ERR_UNSUPPORTED,
                         "cuda weight_upload: %s row %lld, column %lld: a value (or scale) outside "
                         "the F16 range that %s runs in on CUDA",
                         tr->name, (long long)r, (long long)bad, tr->name);
    }
    if (rc == TPI_OK) rc = cuda_weight_upload(ctx, w, held, ne0, ne1, buf, err);
    free(buf);
    const unsigned bit = 1u << (type & 31);
    if (rc == TPI_OK && !(ctx->said_held & bit)) {
        ctx->said_held |= bit;
        const double ratio = (double)row_bytes / (double)src_row;
        tpi_log(TPI_LOG_INFO,
                "CUDA: %s weights run as %s (TPI_HOLD=1: %s, %.1fx their bytes)",
                tr->name, quant_type_name(held),
                quant_held_is_exact(type) ? "the same values" : "scales rounded to f16", ratio);
    }
    return rc;
}

static int cuda_weight_upload(struct ops_ctx *ctx, struct tpi_weight *w, int type, int64_t ne0,
                              int64_t ne1, const void *host_data, struct tpi_error *err) {
    memset(w, 0, sizeof *w);
    if (quant_gpu_held_type(type) != type)
        return upload_converted(ctx, w, type, ne0, ne1, host_data, err);
    const struct quant_traits *tr = quant_traits(type);
    if (!tr || !tr->supported || !kern_type_supported(type))
        return tpi_err(err, TPI_ERR_UNSUPPORTED,
                       "cuda weight_upload: tensor type %s (id %d) is not supported "
                       "(supported: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K Q4_K Q5_K "
                       "Q6_K IQ4_NL IQ4_XS)",
                       quant_type_name(type), type);
    if (ne0 <= 0 || ne1 <= 0 || ne0 % tr->blck_size != 0)
        return tpi_err(err, TPI_ERR_INVALID,
                       "cuda weight_upload: shape %lld x %lld of type %s: ne0 must be a positive "
                       "multiple of the block size %d",
                       (long long)ne0, (long long)ne1, tr->name, tr->blck_size);
    const size_t row_bytes = quant_row_size(type, ne0);
    if (row_bytes == 0 || (size_t)ne1 > SIZE_MAX / row_bytes)
        return tpi_err(err, TPI_ERR_INVALID,
                       "cuda weight_upload: %s tensor %lld x %lld is too large", tr->name,
                       (long long)ne0, (long long)ne1);
    const size_t n_bytes = row_bytes * (size_t)ne1;
    struct tpi_error saved = ctx->err; /* report this call's failure through err, not check */
    tpi_err_clear(&ctx->err);
    void *data = NULL;
    int status = TPI_OK;
    /* KERN_WEIGHT_PAD spare bytes (zeroed): the matrix-vector kernels copy rows in
     * 16-byte pieces rounded out from the row's bytes, which may reach past the end */
    if (!CUDA_OK(ctx, "cuda weight_upload", cudaMalloc(&data, n_bytes + KERN_WEIGHT_PAD))) {
        data = NULL;
    } else if (!CUDA_OK(
                   ctx, "cuda weight_upload",
                   cudaMemsetAsync((uint8_t *)data + n_bytes, 0, KERN_WEIGHT_PAD, ctx->stream)) ||
               !upload_staged(ctx, data, host_data, n_bytes)) {
        cudaFree(data);
        data = NULL;
    }
    /* Q8_0 and Q4_0 rows of whole 256 values and Q6_K and Q3_K rows of whole 2048:
     * regrouped in place (KERN_LAYOUT_Q8_0X8, _Q4_0X8, _Q6_KX8, _Q3_KX8) */
    const bool x8 = type == TPI_TYPE_Q8_0 && ctx->q8_repack && ne0 % 256 == 0;
    const bool q4x8 = type == TPI_TYPE_Q4_0 && ctx->q4_repack && ne0 % 256 == 0;
    const bool q6x8 = type == TPI_TYPE_Q6_K && ctx->q6_repack && ne0 % 2048 == 0;
    const bool q3x8 = type == TPI_TYPE_Q3_K && ctx->q3_repack && ne0 % 2048 == 0;
    if (data && (x8 || q4x8 || q6x8 || q3x8)) {
        if (x8)
            kern_q8_0_x8_repack(ctx, (uint8_t *)data, (int64_t)(n_bytes / KERN_Q8_0X8_BYTES));
        else if (q4x8)
            kern_q4_0_x8_repack(ctx, (uint8_t *)data, (int64_t)(n_bytes / KERN_Q4_0X8_BYTES));
        else if (q6x8)
            kern_q6_k_x8_repack(ctx, (uint8_t *)data, (int64_t)(n_bytes / KERN_Q6_KX8_BYTES));
        else
            kern_q3_k_x8_repack(ctx, (uint8_t *)data, (int64_t)(n_bytes / KERN_Q3_KX8_BYTES));
        if (ctx->err.status != TPI_OK ||
            !CUDA_OK(ctx, "cuda weight_upload", cudaStreamSynchronize(ctx->stream))) {
            cudaFree(data);
            data = NULL;
        }
    }
    if (!data) {
        status = tpi_err(err, ctx->err.status, "%s (%s %lld x %lld, %zu bytes)", ctx->err.msg,
                         tr->name, (long long)ne0, (long long)ne1, n_bytes);
    }
    ctx->err = saved;
    if (status != TPI_OK) return status;
    w->type = type;
    w->ne0 = ne0;
    w->ne1 = ne1;
    w->row_bytes = row_bytes;
    w->data = data;
    w->aux = NULL;
    w->layout = x8     ? KERN_LAYOUT_Q8_0X8
                : q4x8 ? KERN_LAYOUT_Q4_0X8
                : q6x8 ? KERN_LAYOUT_Q6_KX8
                : q3x8 ? KERN_LAYOUT_Q3_KX8
                       : 0;
    return TPI_OK;
}

static void cuda_weight_free(struct ops_ctx *ctx, struct tpi_weight *w) {
    if (!w) return;
    if (w->data) CUDA_OK(ctx, "cuda weight_free", cudaFree(w->data));
    if (w->aux) CUDA_OK(ctx, "cuda weight_free", cudaFree(w->aux));
    memset(w, 0, sizeof *w);
}

static int cuda_kv_init(struct ops_ctx *ctx, struct ops_kv *kv, int n_layer, int n_slot, int n_ctx,
                        int n_kv_head, int head_dim, struct tpi_error *err) {
    memset(kv, 0, sizeof *kv);
    if (n_layer <= 0 || n_slot <= 0 || n_ctx <= 0 || n_kv_head <= 0 || head_dim <= 0)
        return tpi_err(
            err, TPI_ERR_INVALID,
            "cuda kv_init: bad shape n_layer %d n_slot %d n_ctx %d n_kv_head %d head_dim %d",
            n_layer, n_slot, n_ctx, n_kv_head, head_dim);
    const size_t n_elems =
        (size_t)n_layer * (size_t)n_slot * (size_t)n_ctx * (size_t)n_kv_head * (size_t)head_dim;
    const size_t n_bytes = n_elems * sizeof(__half);
    /* one allocation for k and v: the cache is usually the largest buffer after weights */
    void *base = NULL;
    cudaError_t e = cudaMalloc(&base, 2 * n_bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return tpi_err(err, e == cudaErrorMemoryAllocation ? TPI_ERR_NOMEM : TPI_ERR_CUDA,
                       "cuda kv_init: cudaMalloc of 2 x %zu bytes of KV cache failed: %s", n_bytes,
                       cudaGetErrorString(e));
    }
    e = cudaMemsetAsync(base, 0, 2 * n_bytes, ctx->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(ctx->stream);
    if (e != cudaSuccess) {
        cudaFree(base);
        return tpi_err(err, TPI_ERR_CUDA, "cuda kv_init: zeroing the cache failed: %s",
                       cudaGetErrorString(e));
    }
    kv->n_layer = n_layer;
    kv->n_slot = n_slot;
    kv->n_ctx = n_ctx;
    kv->n_kv_head = n_kv_head;
    kv->head_dim = head_dim;
    kv->type = TPI_TYPE_F16;
    kv->k = base;
    kv->v = (uint8_t *)base + n_bytes;
    kv->n_bytes = 2 * n_bytes;
    return TPI_OK;
}

static void cuda_kv_free(struct ops_ctx *ctx, struct ops_kv *kv) {
    if (!kv) return;
    if (kv->k) CUDA_OK(ctx, "cuda kv_free", cudaFree(kv->k)); /* v shares the allocation */
    memset(kv, 0, sizeof *kv);
}

/* ---- the table: compute ops go to the kern_* launchers ----
 * The ops that neither read nor keep the x-quantization memo (kern_matmul.cu) forget it
 * first: after them the q8 scratch may no longer describe the remembered x. */

static void op_embed(struct ops_ctx *ctx, const struct tpi_weight *w, const int32_t *ids,
                     int n_tokens, float *out) {
    kern_xq_forget(ctx);
    kern_embed(ctx, w, ids, n_tokens, out);
}
static void op_add_bias(struct ops_ctx *ctx, float *y, const float *b, int64_t n_rows,
                        int64_t n_cols) {
    kern_xq_forget(ctx);
    kern_add_bias(ctx, y, b, n_rows, n_cols);
}
static void op_rope_neox(struct ops_ctx *ctx, float *x, const struct ops_batch *b, int n_head,
                         int head_dim, const struct ops_rope *rope) {
    kern_xq_forget(ctx);
    const struct rope_pairs rp = rope_pairs_of(rope);
    kern_rope_neox(ctx, x, b, n_head, head_dim, &rp);
}
static void op_attention(struct ops_ctx *ctx, struct ops_kv *kv, int layer, const float *q,
                         const float *k, const float *v, float *out, const struct ops_batch *b,
                         int n_head, float scale) {
    kern_xq_forget(ctx);
    kern_attention(ctx, kv, layer, q, k, v, out, b, n_head, scale);
}
static void op_add(struct ops_ctx *ctx, float *x, const float *y, int64_t n) {
    kern_xq_forget(ctx);
    kern_add(ctx, x, y, n);
}
static void op_get_rows(struct ops_ctx *ctx, const float *src, const int32_t *idx_host, int n_idx,
                        int64_t n_cols, float *dst) {
    kern_xq_forget(ctx);
    kern_get_rows(ctx, src, idx_host, n_idx, n_cols, dst);
}
static void op_qk_norm_rope(struct ops_ctx *ctx, float *q, float *k, const float *q_norm,
                            const float *k_norm, const struct ops_batch *b, int n_head,
                            int n_kv_head, int head_dim, const struct ops_rope *rope, float eps) {
    kern_xq_forget(ctx);
    const struct rope_pairs rp = rope_pairs_of(rope);
    kern_qk_norm_rope(ctx, q, k, q_norm, k_norm, b, n_head, n_kv_head, head_dim, &rp, eps);
}
static void op_qk_norm_rope_attention(struct ops_ctx *ctx, struct ops_kv *kv, int layer, float *q,
                                      float *k, const float *v, const float *q_norm,
                                      const float *k_norm, const struct ops_rope *rope,
                                      float eps, float *out, const struct ops_batch *b,
                                      int n_head, float scale) {
    kern_xq_forget(ctx);
    const struct kern_qk qk = {q_norm, k_norm, rope_pairs_of(rope), eps};
    kern_attention_qk(ctx, kv, layer, q, k, v, out, b, n_head, scale, &qk);
}
static int op_graph_begin(struct ops_ctx *ctx, struct tpi_error *err) {
    kern_xq_forget(ctx);
    return kern_graph_begin(ctx, err);
}
static int op_graph_end(struct ops_ctx *ctx, void **graph, struct tpi_error *err) {
    kern_xq_forget(ctx);
    return kern_graph_end(ctx, graph, err);
}
static int op_graph_launch(struct ops_ctx *ctx, void *graph, bool *launched,
                           struct tpi_error *err) {
    kern_xq_forget(ctx);
    return kern_graph_launch(ctx, graph, launched, err);
}

static const struct ops ops_cuda_table = {
    /* .name = */ "cuda",
    /* .init = */ cuda_init,
    /* .free = */ cuda_free,
    /* .check = */ cuda_check,
    /* .device_name = */ cuda_device_name,
    /* .stream = */ cuda_stream,
    /* .alloc = */ cuda_alloc,
    /* .dealloc = */ cuda_dealloc,
    /* .to_dev = */ cuda_to_dev,
    /* .to_host = */ cuda_to_host,
    /* .copy = */ cuda_copy,
    /* .sync = */ cuda_sync,
    /* .weight_upload = */ cuda_weight_upload,
    /* .weight_free = */ cuda_weight_free,
    /* .kv_init = */ cuda_kv_init,
    /* .kv_free = */ cuda_kv_free,
    /* .embed = */ op_embed,
    /* .rmsnorm = */ kern_rmsnorm,
    /* .matmul = */ kern_matmul,
    /* .add_bias = */ op_add_bias,
    /* .rope_neox = */ op_rope_neox,
    /* .attention = */ op_attention,
    /* .silu_mul = */ kern_silu_mul,
    /* .add = */ op_add,
    /* .get_rows = */ op_get_rows,
    /* .matmul_n = */ kern_matmul_n,
    /* .matmul_add = */ kern_matmul_add,
    /* .qk_norm_rope = */ op_qk_norm_rope,
    /* .qk_norm_rope_attention = */ op_qk_norm_rope_attention,
    /* .matmul_silu_mul = */ kern_matmul_silu_mul,
    /* .graph_begin = */ op_graph_begin, /* kern_graph.cu */
    /* .graph_end = */ op_graph_end,
    /* .graph_launch = */ op_graph_launch,
    /* .graph_free = */ kern_graph_free,
    /* .wait_s = */ cuda_wait_s,
    /* .host_alloc = */ cuda_host_alloc,
    /* .host_free = */ cuda_host_free,
    /* .layer_tail = */ kern_layer_tail,
    /* .row_top = */ kern_row_top,
};

extern "C" const struct ops *ops_cuda_get(void) {
    return &ops_cuda_table;
}

extern "C" bool ops_cuda_available(int *n_devices) {
    int n = 0;
    /* without a driver this returns an error (cudaErrorInsufficientDriver / NoDevice) */
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        n = 0;
    }
    if (n_devices) *n_devices = n;
    return n > 0;
}
