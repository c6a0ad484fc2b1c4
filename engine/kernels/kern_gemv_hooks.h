/*
 * kern_gemv_hooks.h — the test and bench entry points of the v3 decode matrix-vector
 * path (kern_gemv.cu), with C linkage, for tests/test_gemv_cuda.c (C) and
 * kern_common.cuh (CUDA C++) alike. CUDA builds only.
 */
#ifndef KERN_GEMV_HOOKS_H
#define KERN_GEMV_HOOKS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"

/* kern_gemv_configure: apply "kind=auto|a|b|p,batch=1|2,pdl=0|1,wps=auto|8..64,
 * rpw=auto|1|2|4,kbound=0|6|8|10,x8bound=4|5|6|8,ypre=0|1,ring1=0..3,ring1all=0|1" over the
 * TPI_GEMV_KIND / _BATCH / _PDL / _WPS / _RPW / _KBOUND / _X8BOUND / _YPRE / _RING1 /
 * _RING1ALL settings (NULL: those alone); -1 on a bad spec.
 * Process-wide; not to be called while other threads queue kernels.
 * kern_gemv_describe: the settings in that form.
 * kern_gemv_test_prepare: kern_gemv_v3_prepare into a malloc'ed kern_gemv_x (free() it),
 * NULL when false; stream NULL: ctx->stream.
 * kern_gemv_test_run: kern_gemv_v3_run, 1 when queued.
 * kern_gemv_test_run_n: kern_gemv_v3_run_n (n weights in one launch), 1 when queued.
 * kern_gemv_test_run_mix: kern_gemv_v3_run_mix (Q4_K or Q5_K weights and Q6_K's in one
 * launch, mix as TPI_GEMV_MIX's value), 1 when queued.
 * kern_gemv_host_quantize: x's int8 blocks exactly as the device makes them (ds: d,
 * d*sum pairs).
 * kern_gemv_host_emulate: the kernel of kind 'a', 'b' or 'p' for a quantized type run on
 * the host with wpr (1, 2, 4) warps per row; -1 when not covered.
 * kern_gemv_host_regroup: w (n_bytes of `type` rows: Q8_0 and Q4_0 of whole 256 values,
 * Q6_K and Q3_K of whole 2048) rearranged in place as the CUDA backend keeps them;
 * returns the type id kern_gemv_host_emulate takes for that layout, -1 for other types or
 * when n_bytes is not whole 8-block groups. */
int kern_gemv_configure(const char *spec);
void kern_gemv_describe(char *buf, size_t n);
void *kern_gemv_test_prepare(struct ops_ctx *ctx, const float *x, int n_rows, int64_t ne0,
                             void *stream);
int kern_gemv_test_run(struct ops_ctx *ctx, const struct tpi_weight *w, const void *gx, float *y,
                       int accumulate, void *stream);
int kern_gemv_test_run_n(struct ops_ctx *ctx, int n, const struct tpi_weight *const *ws,
                         const void *gx, float *const *ys, void *stream);
int kern_gemv_test_run_mix(struct ops_ctx *ctx, int n, const struct tpi_weight *const *ws,
                           const void *gx, float *const *ys, int mix, void *stream);
void kern_gemv_host_quantize(const float *x, int64_t n_vals, int8_t *xq, float *ds);
int kern_gemv_host_emulate(int type, const void *w, size_t row_bytes, int64_t ne0, int64_t ne1,
                           const int8_t *xq, const float *ds, int n_rows, float *y, int kind,
                           int wpr);
int kern_gemv_host_regroup(int type, void *w, size_t n_bytes);

#endif /* KERN_GEMV_HOOKS_H */
