/*
 * kern_graph.cu — CUDA graphs for the op table (ops.h graph_*): record the ops
 * queued on the context's stream with stream capture, instantiate them once,
 * and replay the whole sequence with one cudaGraphLaunch. A decode step of a
 * small model is dozens of short kernels whose launch cost exceeds their run
 * time; one graph launch removes that cost.
 *
 * A recorded graph holds the device pointers its kernels were launched with,
 * among them the context's scratch buffers (split-K attention partials, bf16
 * copies for the GEMM path). Those buffers only grow, and growing frees the old
 * one, so each graph remembers every scratch pointer (kern_scratch_all) at recording and
 * refuses to launch (launched = false) once any of them has changed: the caller
 * records again instead of replaying into freed memory.
 */
#include <stdlib.h>
#include <string.h>

#include "kern_common.cuh"

/* The entries are declared in ops.h (C linkage, CUDA builds only) for ops_cuda.cu's table. */

struct kern_graph {
    cudaGraphExec_t exec;
    void *scratch[KERN_N_SCRATCH]; /* ctx scratch pointers when recorded */
};

static void scratch_now(struct ops_ctx *ctx, void **out) {
    struct kern_scratch *all[KERN_N_SCRATCH];
    kern_scratch_all(ctx, all);
    for (int i = 0; i < KERN_N_SCRATCH; i++)
        out[i] = all[i]->p;
}

int kern_graph_begin(struct ops_ctx *ctx, struct tpi_error *err) {
    const char *op = "cuda graph_begin";
    /* Queued work done first: the recording starts from an idle stream, and a failure
     * of earlier work is not taken for the recording's. */
    if (!CUDA_OK(ctx, op, cudaSetDevice(ctx->device)) ||
        !CUDA_OK(ctx, op, cudaStreamSynchronize(ctx->stream)) ||
        /* relaxed: host calls that are not stream work (occupancy queries) stay allowed
         * while recording; scratch does not grow then (kern_scratch_get fails it) */
        !CUDA_OK(ctx, op, cudaStreamBeginCapture(ctx->stream, cudaStreamCaptureModeRelaxed))) {
        const int status = ctx->err.status;
        if (err) *err = ctx->err;
        tpi_err_clear(&ctx->err);
        return status;
    }
    return TPI_OK;
}

int kern_graph_end(struct ops_ctx *ctx, void **out, struct tpi_error *err) {
    const char *op = "cuda graph_end";
    *out = NULL;
    cudaGraph_t graph = NULL;
    const cudaError_t e_end = cudaStreamEndCapture(ctx->stream, &graph);
    /* errors recorded while capturing (an op that synchronized, a bad launch) come
     * first: they explain an invalidated capture better than EndCapture's code */
    CUDA_OK(ctx, op, e_end);
    cudaGetLastError(); /* nothing ran: a launch error from the capture is not pending work */
    cudaGraphExec_t exec = NULL;
    if (ctx->err.status == TPI_OK && graph &&
        CUDA_OK(ctx, op, cudaGraphInstantiateWithFlags(&exec, graph, 0))) {
        struct kern_graph *g = (struct kern_graph *)calloc(1, sizeof *g);
        if (!g) {
            cudaGraphExecDestroy(exec);
            kern_fail(ctx, TPI_ERR_NOMEM, op, __FILE__, __LINE__, "out of host memory");
        } else {
            g->exec = exec;
            scratch_now(ctx, g->scratch);
            *out = g;
        }
    }
    if (graph) cudaGraphDestroy(graph);
    const int status = ctx->err.status;
    if (status != TPI_OK && err) *err = ctx->err;
    tpi_err_clear(&ctx->err);
    return status;
}

int kern_graph_launch(struct ops_ctx *ctx, void *graph, bool *launched, struct tpi_error *err) {
    const char *op = "cuda graph_launch";
    struct kern_graph *g = (struct kern_graph *)graph;
    *launched = false;
    if (!g) return tpi_err(err, TPI_ERR_INVALID, "%s: no graph", op);
    void *now[KERN_N_SCRATCH];
    scratch_now(ctx, now);
    if (memcmp(now, g->scratch, sizeof now) != 0) return TPI_OK; /* stale: record again */
    if (!CUDA_OK(ctx, op, cudaGraphLaunch(g->exec, ctx->stream))) {
        const int status = ctx->err.status;
        if (err) *err = ctx->err;
        tpi_err_clear(&ctx->err);
        return status;
    }
    *launched = true;
    return TPI_OK;
}

void kern_graph_free(struct ops_ctx *ctx, void *graph) {
    struct kern_graph *g = (struct kern_graph *)graph;
    if (!g) return;
    /* a replay may still be queued: destroying is safe then (CUDA defers the release),
     * but wait anyway so the graph's buffers can be freed right after */
    if (ctx) CUDA_OK(ctx, "cuda graph_free", cudaStreamSynchronize(ctx->stream));
    if (g->exec) cudaGraphExecDestroy(g->exec);
    free(g);
}
