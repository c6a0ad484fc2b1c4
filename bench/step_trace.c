/*
 * step_trace.c — a CUPTI injection library that records every kernel's start and end
 * (device timestamps, ns) of a whole process, for the step timeline of a decode run
 * with PDL and CUDA graphs as they really overlap (ncu serializes kernels; this does
 * not). The driver loads it when CUDA_INJECTION64_PATH names it; it calls
 * InitializeInjection, which turns on CUPTI's concurrent-kernel activity records. At
 * exit the records go to STEP_TRACE_OUT (default step_trace.tsv) as lines of
 * "start<TAB>end<TAB>grid blocks<TAB>block threads<TAB>graph node id<TAB>name", in the
 * order CUPTI delivered them; bench/step_trace.py sorts and reads them. With
 * STEP_TRACE_MEMCPY=1 the copies between host and device are recorded too, as lines
 * whose grid is the byte count, block 0 and name "memcpy_HtoD" (DtoH, DtoD, ...): for
 * the time between steps, which kernels alone leave unexplained (step_trace.py
 * --totals lists them with the kernels). STEP_TRACE_API=1 records the host's CUDA
 * runtime calls as well (host start and end on CUPTI's clock, grid -1, name "api_" and
 * the call's: cudaStreamSynchronize, cudaLaunchKernelExC, ...), so --totals can say
 * what the host was in while no kernel ran.
 *
 * Not part of the engine and not built by CMake: it needs CUPTI's headers and library
 * of the driver's CUDA version (the toolkit's extras/CUPTI, or the nvidia-cuda-cupti
 * wheel's nvidia/cu13), and KREC, the newest CUpti_ActivityKernelN typedef of that
 * cupti_activity.h (CUpti_ActivityKernel10 in CUPTI 13.0); bench/README.md has the
 * commands ("A step's kernel timeline").
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <cupti_activity.h> /* the activity API; cupti.h would pull in every callback header */
#include <cupti_callbacks.h> /* cuptiGetCallbackName: a runtime call's name */

#ifndef KREC
#error "KREC must name the CUpti_ActivityKernelN record of this CUPTI"
#endif

#define BUF_BYTES (8u << 20)

static FILE *g_out;

/* CUPTI's call for an empty buffer: 8 MB, 8-byte aligned. */
static void CUPTIAPI buf_requested(uint8_t **buf, size_t *size, size_t *max_records) {
    *buf = aligned_alloc(8, BUF_BYTES);
    *size = *buf ? BUF_BYTES : 0;
    *max_records = 0;
}

/* CUPTI's call with a full buffer: its kernel records as TSV lines, then the buffer freed. */
static void CUPTIAPI buf_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size,
                                   size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *rec = NULL;
    while (g_out && cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            static const char *const kinds[] = {"?", "HtoD", "DtoH", "HtoA", "AtoH",
                                                "AtoA", "AtoD", "DtoA", "DtoD", "HtoH", "PtoP"};
            const CUpti_ActivityMemcpy6 *c = (const CUpti_ActivityMemcpy6 *)rec;
            fprintf(g_out, "%llu\t%llu\t%llu\t0\t%u\tmemcpy_%s\n", (unsigned long long)c->start,
                    (unsigned long long)c->end, (unsigned long long)c->bytes,
                    (unsigned)c->graphNodeId, c->copyKind <= 10 ? kinds[c->copyKind] : "?");
            continue;
        }
        if (rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
            const CUpti_ActivityAPI *a = (const CUpti_ActivityAPI *)rec;
            const char *name = NULL;
            if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name) != CUPTI_SUCCESS)
                name = NULL;
            fprintf(g_out, "%llu\t%llu\t-1\t0\t0\tapi_%s\n", (unsigned long long)a->start,
                    (unsigned long long)a->end, name ? name : "?");
            continue;
        }
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
            rec->kind != CUPTI_ACTIVITY_KIND_KERNEL)
            continue;
        const KREC *k = (const KREC *)rec;
        fprintf(g_out, "%llu\t%llu\t%lld\t%d\t%u\t%s\n", (unsigned long long)k->start,
                (unsigned long long)k->end, (long long)k->gridX * k->gridY * k->gridZ,
                k->blockX * k->blockY * k->blockZ, (unsigned)k->graphNodeId,
                k->name ? k->name : "?");
    }
    free(buf);
}

/* At exit: every pending record delivered and the file closed. */
static void flush_all(void) {
    cuptiActivityFlushAll(1);
    if (g_out) fclose(g_out), g_out = NULL;
}

/* Called by the CUDA driver when CUDA_INJECTION64_PATH names this library; 1 on success. */
int InitializeInjection(void) {
    const char *path = getenv("STEP_TRACE_OUT");
    g_out = fopen(path && *path ? path : "step_trace.tsv", "w");
    if (!g_out) {
        fprintf(stderr, "step_trace: cannot open %s\n", path && *path ? path : "step_trace.tsv");
        return 0;
    }
    if (cuptiActivityRegisterCallbacks(buf_requested, buf_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "step_trace: CUPTI refused the kernel activity records\n");
        return 0;
    }
    const char *mc = getenv("STEP_TRACE_MEMCPY");
    if (mc && *mc == '1' && cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS)
        fprintf(stderr, "step_trace: CUPTI refused the memcpy activity records\n");
    const char *api = getenv("STEP_TRACE_API");
    if (api && *api == '1' && cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME) != CUPTI_SUCCESS)
        fprintf(stderr, "step_trace: CUPTI refused the runtime API records\n");
    atexit(flush_all);
    return 1;
}
