/*
 * kern_peer_ar.h — the one-shot all-reduce over peer memory (kern_peer_ar.cu), with C
 * linkage for the NCCL communicator (engine/parallel/comm_nccl.c). CUDA builds only.
 *
 * The ranks of one node share one device region each (cudaIpc handles, mapped into
 * every rank): two staging slots of `cap` floats, a flag per (block, rank) and this
 * rank's call counter. One kernel per all-reduce: each block copies its slice of the
 * input into this rank's staging slot, raises its flag on every peer, waits for every
 * peer's flag, and sums the slice over the ranks in rank order, so every rank gets
 * the same bits. Small messages (a decode step's few tokens) finish in a few
 * microseconds, a fraction of a ring all-reduce's latency; a prefill's megabytes take
 * one read of each peer's slice over NVLink. Beyond the staging size (and where the
 * peers' reads would add up to more than it: many ranks), NCCL does the sum.
 * All state lives in device memory, so the kernel may be captured into a CUDA graph.
 */
#ifndef KERN_PEER_AR_H
#define KERN_PEER_AR_H

#include <stddef.h>
#include <stdint.h>

#define PEER_AR_MAX_RANKS 8
#define PEER_AR_MAX_BLOCKS 128

struct peer_ar {
    int rank, size;                        /* within the group */
    float *stage[PEER_AR_MAX_RANKS];       /* each rank's two slots of cap floats, mapped here */
    uint32_t *flags[PEER_AR_MAX_RANKS];    /* each rank's PEER_AR_MAX_BLOCKS x MAX_RANKS flags */
    uint32_t *counter;                     /* this rank's {calls done, blocks done} */
    size_t cap;                            /* floats per slot */
    uint64_t timeout_ns;                   /* a peer silent this long stops the kernel; 0: never */
};

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of the shared device region for slots of cap floats. */
size_t peer_ar_region_bytes(size_t cap);
/* Where the parts of a region at base lie. */
void peer_ar_region_parts(void *base, size_t cap, float **stage, uint32_t **flags,
                          uint32_t **counter);
/* Queue dst = sum over the ranks of src (accumulate: dst += that sum) for count <= cap
 * floats on stream; every rank of the group must queue the same calls. 0, or the
 * cudaError_t of the launch. */
int peer_ar_launch(const struct peer_ar *p, const float *src, float *dst, size_t count,
                   int accumulate, void *stream);

/* Whether peer_ar_norm_launch takes n_rows rows of n_cols (decode-sized steps). */
int peer_ar_norm_fits(const struct peer_ar *p, int n_rows, int n_cols);
/* Queue x += the group's sum of src (n_rows x n_cols), then h = rmsnorm(x) * w with eps,
 * one block per row; 16-byte aligned pointers. 0, or a cudaError_t. */
int peer_ar_norm_launch(const struct peer_ar *p, const float *src, float *x, int n_rows,
                        int n_cols, const float *w, float eps, float *h, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* KERN_PEER_AR_H */
