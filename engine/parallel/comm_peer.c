/*
 * comm_peer.c — set-up and tear-down of the one-shot peer all-reduce that the NCCL
 * communicator uses for small f32 sums when its ranks share one node (the kernel:
 * engine/kernels/kern_peer_ar.cu). Built with TPI_HAVE_NCCL only.
 *
 * Each rank allocates one device region (two staging slots, flags, counter), and the
 * group swaps cudaIpc handles over MPI and maps every peer's region. Whether the path
 * is used is agreed by the whole group, so either every rank takes it or none does:
 * it is off when the ranks are on several hosts, when TPI_PEER_AR=0, or when a rank
 * cannot map a peer's memory (no P2P between its GPUs); NCCL then does every sum.
 * Every rank posts the same MPI calls whatever fails locally, each waited for with
 * the communicator's timeout.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_impl.h"

#ifdef TPI_HAVE_NCCL

#include <cuda_runtime.h>

#include "kernels/kern_peer_ar.h"

/* Floats per staging slot (32 MiB): a 512-token prefill micro-batch at n_embd up to
 * 16384. Two slots per rank. */
#define PEER_AR_CAP_FLOATS (8 * 1024 * 1024)

struct peer_msg {
    int ok;
    cudaIpcMemHandle_t handle;
};

/* MPI_Iallgather of one peer_msg per rank, waited for with the timeout. */
static int swap_msgs(struct comm *c, const struct peer_msg *mine, struct peer_msg *all) {
    MPI_Request req;
    int rc = MPI_Iallgather(mine, (int)sizeof *mine, MPI_BYTE, all, (int)sizeof *mine, MPI_BYTE,
                            c->mpi, &req);
    return rc == MPI_SUCCESS ? comm_poll_request(&req, c->timeout_s) : TPI_ERR_COMM;
}

/* The group's minimum of ok, or 0 when the agreement itself fails. The buffers are
 * on the heap and leaked when the request is abandoned (timeout), since MPI may still
 * write them. */
static int agree_ok(struct comm *c, int ok) {
    int *v = malloc(2 * sizeof *v);
    if (!v) return 0;
    v[0] = ok;
    v[1] = 0;
    MPI_Request req;
    if (MPI_Iallreduce(&v[0], &v[1], 1, MPI_INT, MPI_MIN, c->mpi, &req) != MPI_SUCCESS) {
        free(v);
        return 0;
    }
    const int st = comm_poll_request(&req, c->timeout_s);
    const int all = st == TPI_OK ? v[1] : 0;
    if (st != TPI_ERR_TIMEOUT) free(v);
    return all;
}

static void unmap(struct peer_ar *p) {
    for (int r = 0; r < p->size; r++) {
        if (!p->stage[r]) continue;
        if (r == p->rank)
            cudaFree(p->stage[r]);
        else
            cudaIpcCloseMemHandle(p->stage[r]);
        p->stage[r] = NULL;
    }
}

struct peer_ar *comm_peer_ar_create(struct comm *c, bool one_host, char *why, size_t n_why) {
    snprintf(why, n_why, "on");
    const char *env = getenv("TPI_PEER_AR");
    int ok = !(env && !strcmp(env, "0"));
    if (!ok) snprintf(why, n_why, "off (TPI_PEER_AR=0)");
    if (ok && (!one_host || c->size < 2 || c->size > PEER_AR_MAX_RANKS)) {
        snprintf(why, n_why, "off (%s)", one_host ? "group size" : "ranks on several hosts");
        ok = 0;
    }
    struct peer_ar *p = calloc(1, sizeof *p);
    // all[size] is this rank's message: on the heap with the others (see agree_ok)
    struct peer_msg *all = calloc((size_t)c->size + 1, sizeof *all);
    struct peer_msg dummy, *mine = all ? &all[c->size] : &dummy;
    memset(&dummy, 0, sizeof dummy);
    if (!p || !all) ok = 0;
    void *base = NULL;
    if (ok) {
        p->rank = c->rank;
        p->size = c->size;
        p->cap = PEER_AR_CAP_FLOATS;
        p->timeout_ns = c->timeout_s > 0 ? (uint64_t)(c->timeout_s * 1e9) : 0;
        const size_t bytes = peer_ar_region_bytes(p->cap);
        cudaError_t e = cudaMalloc(&base, bytes);
        if (e == cudaSuccess) e = cudaMemset(base, 0, bytes);
        if (e == cudaSuccess) e = cudaDeviceSynchronize();
        if (e == cudaSuccess) e = cudaIpcGetMemHandle(&mine->handle, base);
        if (e != cudaSuccess) {
            snprintf(why, n_why, "off (rank %d: %s)", c->rank, cudaGetErrorString(e));
            ok = 0;
        }
    }
    mine->ok = ok;
    // Every rank swaps and agrees, whatever happened above.
    int st = all ? swap_msgs(c, mine, all) : TPI_ERR_NOMEM;
    if (st == TPI_OK)
        for (int r = 0; r < c->size; r++)
            if (!all[r].ok) {
                if (ok) snprintf(why, n_why, "off (rank %d cannot take part)", r);
                ok = 0;
            }
    if (st != TPI_OK) ok = 0;
    if (ok) {
        p->stage[p->rank] = base;
        for (int r = 0; r < c->size && ok; r++) {
            if (r == p->rank) continue;
            void *peer = NULL;
            cudaError_t e =
                cudaIpcOpenMemHandle(&peer, all[r].handle, cudaIpcMemLazyEnablePeerAccess);
            if (e != cudaSuccess) {
                snprintf(why, n_why, "off (rank %d cannot map rank %d's memory: %s)", c->rank, r,
                         cudaGetErrorString(e));
                ok = 0;
                break;
            }
            p->stage[r] = peer;
        }
    }
    ok = agree_ok(c, ok) && ok;
    if (st != TPI_ERR_TIMEOUT) free(all); // else MPI may still write it
    if (!ok) {
        if (p && p->stage[c->rank]) {
            unmap(p);
        } else if (base) {
            cudaFree(base);
        }
        if (!strcmp(why, "on")) snprintf(why, n_why, "off (a peer could not map the memory)");
        free(p);
        return NULL;
    }
    for (int r = 0; r < p->size; r++) {
        float *stage;
        uint32_t *flags, *counter;
        peer_ar_region_parts(p->stage[r], p->cap, &stage, &flags, &counter);
        p->flags[r] = flags;
        if (r == p->rank) p->counter = counter;
    }
    snprintf(why, n_why, "on (%d ranks, sums up to %zu KiB)", p->size,
             p->cap / (size_t)(p->size - 1) * sizeof(float) / 1024);
    return p;
}

void comm_peer_ar_free(struct comm *c, struct peer_ar *p) {
    if (!p) return;
    // Peers may still read this rank's slot when its own last kernel has ended: wait
    // for every rank before unmapping, and leak the region if one never comes.
    cudaDeviceSynchronize();
    MPI_Request req;
    int st = MPI_Ibarrier(c->mpi, &req) == MPI_SUCCESS ? comm_poll_request(&req, c->timeout_s)
                                                        : TPI_ERR_COMM;
    if (st == TPI_OK) unmap(p);
    free(p);
}

#endif /* TPI_HAVE_NCCL */
