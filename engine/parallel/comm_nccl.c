/*
 * comm_nccl.c — the NCCL communicator (built only with TPI_HAVE_NCCL; otherwise
 * comm_create refuses COMM_NCCL with TPI_ERR_UNSUPPORTED).
 *
 * NCCL_NVLS_ENABLE defaults to 0 (set in this process when the user left it unset).
 *
 * Bootstrap over the group's MPI communicator, and never hang silently:
 *   1. every rank gathers (host, GPU PCI bus id): two ranks on one GPU would make
 *      NCCL fail with "invalid usage" deep inside init, so we say it first;
 *   2. group rank 0 makes the unique id and broadcasts it with MPI_Ibcast polled
 *      against the timeout;
 *   3. non-blocking ncclCommInitRankConfig, polled with ncclCommGetAsyncError;
 *      on error or timeout ncclCommAbort and a message with rank, host, GPU and
 *      the usual fixes (NCCL_SOCKET_IFNAME, NCCL_DEBUG=INFO).
 * Every rank posts the same MPI calls in the same order whatever fails locally
 * (a failed rank contributes an error flag instead of skipping), so a local
 * failure cannot leave the others stuck in a collective.
 *
 * Collectives are enqueued on the backend's stream and return without waiting
 * (stream-ordered, as comm.h says); enqueue errors become TPI_ERR_COMM.
 *
 * When the group shares one host, f32 sums that fit the peer all-reduce's slots go to
 * it instead of NCCL (comm_peer.c sets it up, kern_peer_ar.cu runs it): one kernel
 * that also adds into the residual (allreduce_add) and, for decode-sized steps,
 * applies the next rmsnorm (allreduce_add_norm). Larger sums, all-gathers, send/recv
 * and broadcasts stay with NCCL.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "comm_impl.h"

#ifndef TPI_HAVE_NCCL

int comm_nccl_init(struct comm *c, struct tpi_error *err) {
    (void)c;
    return tpi_err(err, TPI_ERR_UNSUPPORTED,
                   "--comm nccl: built without CUDA/NCCL; use --comm mpi");
}

#else /* TPI_HAVE_NCCL */

#include <cuda_runtime.h>
#include <nccl.h>
#include <time.h>

#include "kernels/kern_peer_ar.h"

#define NCCL_HINTS                                                                                 \
    "check that every node can reach the others on the interface NCCL picks (set "                 \
    "NCCL_SOCKET_IFNAME=<iface>, e.g. the one in `ip addr` that carries the nodes' "               \
    "addresses) and rerun with NCCL_DEBUG=INFO for NCCL's own log"

struct nccl_impl {
    ncclComm_t comm;
    int device;      /* CUDA device this rank uses */
    char bus_id[32]; /* its PCI bus id, for messages */
    char host[256];
    int32_t *barrier; /* one int of device memory for barrier() */
    bool one_host;    /* every rank of the group on this host */
    struct peer_ar *peer; /* small f32 sums over peer memory, or NULL (comm_peer.c) */
};

static ncclDataType_t nccl_type(enum comm_dtype dt) {
    switch (dt) {
    case COMM_F32:
        return ncclFloat32;
    case COMM_F16:
        return ncclFloat16;
    case COMM_BF16:
        return ncclBfloat16;
    case COMM_I32:
        return ncclInt32;
    case COMM_U8:
        return ncclUint8;
    default:
        return ncclFloat32;
    }
}

static void *stream_of(const struct comm *c) {
    return c->ops && c->ops->stream ? c->ops->stream(c->octx) : NULL;
}

static void sleep_backoff(long *ns) {
    struct timespec ts = {0, *ns};
    nanosleep(&ts, NULL);
    if (*ns < 1000000) *ns *= 2;
}

/* After an enqueue: ncclInProgress means the (non-blocking) communicator is still
 * queueing the call; wait for it so the next call sees a ready communicator.
 * Anything else but success is an error naming the call, rank and GPU. */
static int nccl_check(struct comm *c, ncclResult_t r, const char *call, struct tpi_error *err) {
    struct nccl_impl *n = c->impl;
    double t0 = tpi_time_s();
    long ns = 10000;
    // An enqueue is usually done within microseconds: poll without sleeping for the
    // first millisecond (a nanosleep costs ~60 us of timer slack), then back off.
    while (r == ncclSuccess || r == ncclInProgress) {
        ncclResult_t a = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(n->comm, &a);
        if (q != ncclSuccess) {
            r = q;
            break;
        }
        if (a == ncclSuccess) return TPI_OK;
        if (a != ncclInProgress) {
            r = a;
            break;
        }
        const double dt = tpi_time_s() - t0;
        if (c->timeout_s > 0 && dt > c->timeout_s)
            return tpi_err(err, TPI_ERR_TIMEOUT,
                           "%s on world rank %d (host %s, GPU %d %s): still "
                           "in progress after %.1f s",
                           call, c->world_rank, n->host, n->device, n->bus_id, c->timeout_s);
        if (dt > 1e-3) sleep_backoff(&ns);
    }
    const char *last = ncclGetLastError(n->comm);
    return tpi_err(err, TPI_ERR_COMM, "%s failed on world rank %d (host %s, GPU %d %s): %s%s%s",
                   call, c->world_rank, n->host, n->device, n->bus_id, ncclGetErrorString(r),
                   last && *last ? ": " : "", last ? last : "");
}

/* Whether a sum of count items of dt goes over peer memory rather than NCCL (the same
 * answer on every rank): f32 sums whose reads of the peers' slots (size - 1 copies)
 * stay within one slot's size. */
static bool peer_takes(const struct nccl_impl *n, size_t count, enum comm_dtype dt) {
    return n->peer && dt == COMM_F32 && count * (size_t)(n->peer->size - 1) <= n->peer->cap;
}

static int peer_launch(struct comm *c, const float *src, float *dst, size_t count, int accumulate,
                       struct tpi_error *err) {
    struct nccl_impl *n = c->impl;
    int e = peer_ar_launch(n->peer, src, dst, count, accumulate, stream_of(c));
    if (e)
        return tpi_err(err, TPI_ERR_CUDA, "peer all-reduce of %zu floats on world rank %d (GPU %d "
                       "%s): %s", count, c->world_rank, n->device, n->bus_id,
                       cudaGetErrorString((cudaError_t)e));
    return TPI_OK;
}

static int nccl_allreduce_add(struct comm *c, float *src, float *dst, size_t count,
                              struct tpi_error *err) {
    struct nccl_impl *n = c->impl;
    if (peer_takes(n, count, COMM_F32)) return peer_launch(c, src, dst, count, 1, err);
    ncclResult_t r =
        ncclAllReduce(src, src, count, ncclFloat32, ncclSum, n->comm, (cudaStream_t)stream_of(c));
    int st = nccl_check(c, r, "ncclAllReduce", err);
    if (st) return st;
    c->ops->add(c->octx, dst, src, (int64_t)count);
    return TPI_OK;
}

static int nccl_allreduce_add_norm(struct comm *c, float *src, float *dst, int n_rows,
                                   int n_cols, const float *w, float eps, float *h, bool *normed,
                                   struct tpi_error *err) {
    struct nccl_impl *n = c->impl;
    const size_t count = (size_t)n_rows * (size_t)n_cols;
    *normed = n->peer && peer_ar_norm_fits(n->peer, n_rows, n_cols) &&
              ((uintptr_t)src | (uintptr_t)dst | (uintptr_t)w | (uintptr_t)h) % 16 == 0;
    if (!*normed) return nccl_allreduce_add(c, src, dst, count, err);
    int e = peer_ar_norm_launch(n->peer, src, dst, n_rows, n_cols, w, eps, h, stream_of(c));
    if (e)
        return tpi_err(err, TPI_ERR_CUDA, "peer all-reduce + norm of %d x %d on world rank %d "
                       "(GPU %d %s): %s", n_rows, n_cols, c->world_rank, n->device, n->bus_id,
                       cudaGetErrorString((cudaError_t)e));
    return TPI_OK;
}

static int nccl_allreduce(struct comm *c, void *buf, size_t count, enum comm_dtype dt,
                          struct tpi_error *err) {
    struct nccl_impl *n = c->impl;
    if (peer_takes(n, count, dt)) return peer_launch(c, buf, buf, count, 0, err);
    ncclResult_t r =
        ncclAllReduce(buf, buf, count, nccl_type(dt), ncclSum, n->comm, (cudaStream_t)stream_of(c));
    return nccl_check(c, r, "ncclAllReduce", err);
}

static int nccl_allgather(struct comm *c, const void *send, void *recv, size_t count,
                          enum comm_dtype dt, struct tpi_error *err) {
    struct nccl_impl *n = c->impl;
    ncclResult_t r =
        ncclAllGather(send, recv, count, nccl_type(dt), n->comm, (cudaStream_t)stream_of(c));
    return nccl_check(c, r, "ncclAllGather", err);
}

static int nccl_send(struct comm *c, const void *buf, size_t count, enum comm_dtype dt, int peer,
                     struct tpi_error *err) {
    struct nccl_impl *n = c->impl;
    ncclResult_t r = ncclSend(buf, count, nccl_type(dt), peer, n->comm, (cudaStream_t)stream_of(c));
    return nccl_check(c, r, "ncclSend", err);
}

static int nccl_recv(struct comm *c, void *buf, size_t count, enum comm_dtype dt, int peer,
                     struct tpi_error *err) {
    struct nccl_impl *n = c->impl;
    ncclResult_t r = ncclRecv(buf, count, nccl_type(dt), peer, n->comm, (cudaStream_t)stream_of(c));
    return nccl_check(c, r, "ncclRecv", err);
}

static int nccl_bcast(struct comm *c, void *buf, size_t count, enum comm_dtype dt, int root,
                      struct tpi_error *err) {
    struct nccl_impl *n = c->impl;
    ncclResult_t r =
        ncclBroadcast(buf, buf, count, nccl_type(dt), root, n->comm, (cudaStream_t)stream_of(c));
    return nccl_check(c, r, "ncclBroadcast", err);
}

/* NCCL has no barrier: a one-int all-reduce, then wait for the stream, so no
 * rank returns before every rank has reached this point. */
static int nccl_barrier(struct comm *c, struct tpi_error *err) {
    struct nccl_impl *n = c->impl;
    ncclResult_t r = ncclAllReduce(n->barrier, n->barrier, 1, ncclInt32, ncclSum, n->comm,
                                   (cudaStream_t)stream_of(c));
    int st = nccl_check(c, r, "ncclAllReduce (barrier)", err);
    if (st) return st;
    if (c->ops->sync) c->ops->sync(c->octx);
    return TPI_OK;
}

/* Release n (finalize or abort its communicator, free the barrier int). */
static void impl_free(struct comm *c, struct nccl_impl *n) {
    if (!n) return;
    comm_peer_ar_free(c, n->peer);
    n->peer = NULL;
    if (n->comm) {
        /* Finalize flushes outstanding work; if it does not finish in time (a peer
         * died), abort rather than hang in destroy. */
        ncclResult_t r = ncclCommFinalize(n->comm), a = ncclInProgress;
        double t0 = tpi_time_s();
        long ns = 10000;
        while (r == ncclSuccess || r == ncclInProgress) {
            if (ncclCommGetAsyncError(n->comm, &a) != ncclSuccess || a != ncclInProgress) break;
            if (c->timeout_s > 0 && tpi_time_s() - t0 > c->timeout_s) break;
            sleep_backoff(&ns);
        }
        if (a == ncclSuccess)
            ncclCommDestroy(n->comm);
        else
            ncclCommAbort(n->comm);
    }
    if (n->barrier && c->ops && c->ops->dealloc) c->ops->dealloc(c->octx, n->barrier);
    free(n);
}

static void nccl_destroy(struct comm *c) {
    impl_free(c, c->impl);
    c->impl = NULL;
}

static const struct comm_vtable nccl_vtable = {
    .allreduce_sum = nccl_allreduce,
    .allreduce_add = nccl_allreduce_add,
    .allreduce_add_norm = nccl_allreduce_add_norm,
    .allgather = nccl_allgather,
    .send = nccl_send,
    .recv = nccl_recv,
    .bcast = nccl_bcast,
    .barrier = nccl_barrier,
    .destroy = nccl_destroy,
};

/* What each rank tells the group before init. */
struct gpu_card {
    int ok; /* this rank found its GPU */
    int world_rank;
    char host[256];
    char bus_id[32];
};

/* Step 1: every rank's (host, bus id); fails on every rank alike when a rank has
 * no usable GPU or two ranks share one. */
static int check_gpus(struct comm *c, struct nccl_impl *n, struct tpi_error *local,
                      struct tpi_error *err) {
    struct gpu_card mine;
    memset(&mine, 0, sizeof mine);
    mine.ok = local->status == TPI_OK;
    mine.world_rank = c->world_rank;
    snprintf(mine.host, sizeof mine.host, "%s", n->host);
    snprintf(mine.bus_id, sizeof mine.bus_id, "%s", n->bus_id);
    struct gpu_card *all = calloc((size_t)c->size, sizeof *all);
    if (!all) return tpi_err(err, TPI_ERR_NOMEM, "NCCL init: out of memory");
    int rc =
        MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, c->mpi);
    if (rc != MPI_SUCCESS) {
        free(all);
        char es[MPI_MAX_ERROR_STRING];
        return tpi_err(err, TPI_ERR_COMM,
                       "NCCL init: MPI_Allgather of GPU ids failed on world rank "
                       "%d: %s",
                       c->world_rank, comm_mpi_errstr(rc, es, sizeof es));
    }
    int st = TPI_OK;
    n->one_host = true;
    for (int i = 0; i < c->size; i++)
        if (strcmp(all[i].host, mine.host)) n->one_host = false;
    if (!mine.ok) {
        st = tpi_err(err, local->status, "%s", local->msg);
    } else {
        for (int i = 0; i < c->size && st == TPI_OK; i++) {
            if (!all[i].ok) {
                st = tpi_err(err, TPI_ERR_CUDA,
                             "NCCL init: world rank %d (host %s) has no usable "
                             "GPU",
                             all[i].world_rank, all[i].host);
                break;
            }
            for (int j = i + 1; j < c->size; j++) {
                if (all[j].ok && !strcmp(all[i].host, all[j].host) &&
                    !strcmp(all[i].bus_id, all[j].bus_id)) {
                    st = tpi_err(err, TPI_ERR_INVALID,
                                 "ranks %d and %d share GPU %s on host %s: NCCL needs one GPU per "
                                 "rank; launch at most one rank per GPU, or use --comm mpi",
                                 all[i].world_rank, all[j].world_rank, all[i].bus_id, all[i].host);
                    break;
                }
            }
        }
    }
    free(all);
    return st;
}

/* The unique id with a status, so rank 0's failure reaches everyone. */
struct id_msg {
    int status;
    ncclUniqueId id;
};

int comm_nccl_init(struct comm *c, struct tpi_error *err) {
    if (!comm_on_device(c) || !c->octx)
        return tpi_err(err, TPI_ERR_INVALID,
                       "--comm nccl needs device buffers: use --backend cuda "
                       "(or --comm mpi with the cpu backend)");
    /* NVLink SHARP (NVLS) multicast needs fabric-manager support that shared GPU nodes
     * often lack; NCCL then fails or hangs at init. Off unless the user chose (before
     * NCCL first reads its environment). */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    struct nccl_impl *n = calloc(1, sizeof *n);
    if (!n) return tpi_err(err, TPI_ERR_NOMEM, "NCCL init: out of memory");
    comm_host_name(n->host, sizeof n->host);
    n->device = -1;
    snprintf(n->bus_id, sizeof n->bus_id, "?");

    /* Local facts first; a failure here is carried into the collective steps. */
    struct tpi_error local;
    tpi_err_clear(&local);
    cudaError_t ce = cudaGetDevice(&n->device);
    if (ce == cudaSuccess) ce = cudaDeviceGetPCIBusId(n->bus_id, (int)sizeof n->bus_id, n->device);
    if (ce != cudaSuccess)
        tpi_err(&local, TPI_ERR_CUDA, "NCCL init on world rank %d (host %s): no usable GPU: %s",
                c->world_rank, n->host, cudaGetErrorString(ce));
    if (ce == cudaSuccess) {
        n->barrier = c->ops->alloc(c->octx, sizeof *n->barrier);
        if (!n->barrier)
            tpi_err(&local, TPI_ERR_NOMEM,
                    "NCCL init on world rank %d: cannot allocate device "
                    "memory",
                    c->world_rank);
    }
    int st = check_gpus(c, n, &local, err);

    /* Step 2: the unique id, from group rank 0, on a heap buffer so an abandoned
     * Ibcast (timeout) never writes into a dead stack frame. */
    struct id_msg *idm = calloc(1, sizeof *idm);
    if (!idm) {
        /* Local and unrecoverable; the others time out in the broadcast below. */
        impl_free(c, n);
        return tpi_err(err, TPI_ERR_NOMEM, "NCCL init: out of memory");
    }
    if (c->rank == 0) {
        idm->status = st;
        if (st == TPI_OK) {
            ncclResult_t r = ncclGetUniqueId(&idm->id);
            if (r != ncclSuccess) {
                idm->status = st =
                    tpi_err(err, TPI_ERR_COMM,
                            "ncclGetUniqueId failed on world rank "
                            "%d (host %s): %s; %s",
                            c->world_rank, n->host, ncclGetErrorString(r), NCCL_HINTS);
            }
        }
    }
    MPI_Request req;
    int rc = MPI_Ibcast(idm, (int)sizeof *idm, MPI_BYTE, 0, c->mpi, &req);
    int pst = rc == MPI_SUCCESS ? comm_poll_request(&req, c->timeout_s) : TPI_ERR_COMM;
    if (pst != TPI_OK) {
        if (pst != TPI_ERR_TIMEOUT) free(idm);
        if (st == TPI_OK) {
            if (pst == TPI_ERR_TIMEOUT)
                st = tpi_err(err, pst,
                             "NCCL init on world rank %d (host %s): the unique id from "
                             "group rank 0 did not arrive within %.1f s",
                             c->world_rank, n->host, c->timeout_s);
            else
                st = tpi_err(err, pst,
                             "NCCL init on world rank %d (host %s): MPI_Ibcast of the "
                             "unique id failed",
                             c->world_rank, n->host);
        }
        impl_free(c, n);
        return st;
    }
    if (st == TPI_OK && idm->status != TPI_OK)
        st = tpi_err(err, idm->status, "NCCL init: group rank 0 could not create the unique id");
    ncclUniqueId id = idm->id;
    free(idm);
    if (st != TPI_OK) {
        impl_free(c, n);
        return st;
    }

    /* Step 3: non-blocking init, polled. */
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&n->comm, c->size, id, c->rank, &cfg);
    double t0 = tpi_time_s();
    long ns = 20000;
    ncclResult_t a = r;
    while (r == ncclSuccess || r == ncclInProgress) {
        if (ncclCommGetAsyncError(n->comm, &a) != ncclSuccess) break;
        if (a != ncclInProgress) break;
        if (c->timeout_s > 0 && tpi_time_s() - t0 > c->timeout_s) break;
        sleep_backoff(&ns);
    }
    if ((r == ncclSuccess || r == ncclInProgress) && a == ncclSuccess) {
        c->vt = &nccl_vtable;
        c->impl = n;
        char why[160];
        n->peer = comm_peer_ar_create(c, n->one_host, why, sizeof why);
        if (c->rank == 0) TPI_LOGI("NCCL group of %d: peer all-reduce %s", c->size, why);
        return TPI_OK;
    }
    char detail[512] = "";
    if (n->comm) snprintf(detail, sizeof detail, "%s", ncclGetLastError(n->comm));
    if (a == ncclInProgress)
        st = tpi_err(err, TPI_ERR_TIMEOUT,
                     "NCCL init timed out after %.1f s on world rank %d (group rank %d of %d, "
                     "host %s, GPU %d %s); %s",
                     c->timeout_s, c->world_rank, c->rank, c->size, n->host, n->device, n->bus_id,
                     NCCL_HINTS);
    else
        st = tpi_err(err, TPI_ERR_COMM,
                     "NCCL init failed on world rank %d (group rank %d of %d, host %s, GPU %d "
                     "%s): %s%s%s; %s",
                     c->world_rank, c->rank, c->size, n->host, n->device, n->bus_id,
                     ncclGetErrorString(r != ncclSuccess && r != ncclInProgress ? r : a),
                     detail[0] ? ": " : "", detail, NCCL_HINTS);
    /* A half-initialised communicator cannot be finalized: abort it. */
    if (n->comm) ncclCommAbort(n->comm);
    n->comm = NULL;
    impl_free(c, n);
    return st;
}

#endif /* TPI_HAVE_NCCL */
