/*
 * comm_mpi.c — the MPI communicator. Host buffers (CPU backend) go to MPI
 * directly; device buffers (the "cuda" backend) are staged through a host
 * buffer: wait for the stream, copy down, MPI, copy up, wait again, so each call
 * returns with the data in place, as comm.h promises.
 *
 * MPI has no 16-bit float types, so f16/bf16 sums use our own MPI_Op over
 * MPI_UINT16_T that widens to f32, adds and rounds back (round to nearest even).
 * Every call works on a private duplicate of the group, so its messages can
 * never match the caller's own traffic on the same communicator.
 *
 * No call waits forever: each is posted nonblocking and polled against an operation
 * timeout (TPI_COMM_OP_TIMEOUT seconds, default 600, 0 = none), so a peer that died or
 * hangs becomes an error on the ranks that did arrive — each prints that it waited,
 * which tells the user who is missing — instead of a silent hang.
 */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm.h"
#include "comm_impl.h"

#ifdef TPI_HAVE_CUDA
#include <cuda_runtime.h>
#endif

/* Point-to-point tag; one tag suffices because MPI keeps order per (peer, tag)
 * and the comm API is one call at a time. */
#define TAG_P2P 17

/* The most items one MPI call moves: counts are int in MPI. */
#define CHUNK_ITEMS ((size_t)1 << 30)

struct mpi_impl {
    MPI_Comm comm;          /* private dup of c->mpi */
    MPI_Op op_f16, op_bf16; /* f32-accumulating sums */
    bool device;            /* buffers are device memory: stage through `stage` */
    unsigned char *stage;   /* host staging buffer, grown as needed */
    size_t stage_bytes;
    bool stage_pinned; /* registered with cudaHostRegister */
    double op_timeout_s;  /* per call; <= 0 waits forever */
    MPI_Request pending;  /* a call that timed out, still posted; the comm is unusable */
    const char *pending_call;
};

/* ---- f16 / bf16 sums ------------------------------------------------------ */

static void sum_f16(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        b[i] = tpi_f32_to_f16(tpi_f16_to_f32(a[i]) + tpi_f16_to_f32(b[i]));
}

static void sum_bf16(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        b[i] = tpi_f32_to_bf16(tpi_bf16_to_f32(a[i]) + tpi_bf16_to_f32(b[i]));
}

static MPI_Datatype mpi_type(enum comm_dtype dt) {
    switch (dt) {
    case COMM_F32:
        return MPI_FLOAT;
    case COMM_F16:
    case COMM_BF16:
        return MPI_UINT16_T;
    case COMM_I32:
        return MPI_INT32_T;
    case COMM_U8:
        return MPI_UINT8_T;
    default:
        return MPI_DATATYPE_NULL;
    }
}

static MPI_Op sum_op(const struct mpi_impl *m, enum comm_dtype dt) {
    if (dt == COMM_F16) return m->op_f16;
    if (dt == COMM_BF16) return m->op_bf16;
    return MPI_SUM;
}

static int mpi_fail(const struct comm *c, int rc, const char *call, struct tpi_error *err) {
    char es[MPI_MAX_ERROR_STRING];
    return tpi_err(err, TPI_ERR_COMM, "%s failed on world rank %d (group rank %d of %d): %s", call,
                   c->world_rank, c->rank, c->size, comm_mpi_errstr(rc, es, sizeof es));
}

/* ---- waiting with a timeout -------------------------------------------------- */

/* Wait for req: MPI_Test in a spin for the first 200 us (a collective of a decode step
 * is usually that quick), then with sleeps of up to 200 us so an oversubscribed node's
 * late rank gets the core. On timeout the request stays posted in m->pending. */
static int wait_op(struct comm *c, struct mpi_impl *m, MPI_Request *req, MPI_Status *st,
                   const char *call, int peer, struct tpi_error *err) {
    const double t0 = tpi_time_s();
    long sleep_ns = 0;
    for (;;) {
        int done = 0;
        int rc = MPI_Test(req, &done, st ? st : MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_fail(c, rc, call, err);
        if (done) return TPI_OK;
        const double dt = tpi_time_s() - t0;
        if (m->op_timeout_s > 0 && dt > m->op_timeout_s) {
            m->pending = *req;
            m->pending_call = call;
            char host[256], with[64] = "";
            if (peer >= 0) // a send or receive: the one peer it waits on
                snprintf(with, sizeof with, " %s group rank %d", strcmp(call, "send") ? "from" : "to",
                         peer);
            return tpi_err(err, TPI_ERR_TIMEOUT,
                           "%s%s on world rank %d (group rank %d of %d, host %s) did not complete "
                           "in %.1f s: a peer rank is stuck, dead or far behind. The ranks that "
                           "report this arrived; the others did not. (TPI_COMM_OP_TIMEOUT=S "
                           "changes the limit; launch/README.md: when a run hangs)",
                           call, with, c->world_rank, c->rank, c->size,
                           comm_host_name(host, sizeof host), dt);
        }
        if (dt > 200e-6) {
            sleep_ns = sleep_ns ? TPI_MIN(sleep_ns * 2, 200000L) : 10000L;
            struct timespec ts = {0, sleep_ns};
            nanosleep(&ts, NULL);
        }
    }
}

/* A comm whose call timed out holds that call's request: refuse further calls. */
static int check_pending(const struct comm *c, const struct mpi_impl *m, struct tpi_error *err) {
    if (m->pending == MPI_REQUEST_NULL) return TPI_OK;
    return tpi_err(err, TPI_ERR_COMM,
                   "communicator of world rank %d is unusable: an earlier %s timed out",
                   c->world_rank, m->pending_call);
}

/* ---- staging -------------------------------------------------------------- */

/* Host staging buffer of at least n_bytes, or NULL. */
static unsigned char *stage_get(struct mpi_impl *m, size_t n_bytes) {
    if (m->stage_bytes >= n_bytes) return m->stage;
#ifdef TPI_HAVE_CUDA
    if (m->stage_pinned) cudaHostUnregister(m->stage);
    m->stage_pinned = false;
#endif
    free(m->stage);
    /* Grow by 1.5x so a sweep of rising sizes does not reallocate every call. */
    size_t want = n_bytes + n_bytes / 2;
    m->stage = malloc(want);
    m->stage_bytes = m->stage ? want : 0;
#ifdef TPI_HAVE_CUDA
    /* Pinned memory lets the copies run at full PCIe speed; plain memory still
     * works if registration is refused (e.g. a locked-memory limit). */
    if (m->stage && cudaHostRegister(m->stage, want, cudaHostRegisterDefault) == cudaSuccess)
        m->stage_pinned = true;
    else
        (void)cudaGetLastError();
#endif
    return m->stage;
}

static int stage_fail(const struct comm *c, size_t n_bytes, struct tpi_error *err) {
    return tpi_err(err, TPI_ERR_NOMEM,
                   "MPI comm: cannot allocate %zu bytes of host staging "
                   "memory on world rank %d",
                   n_bytes, c->world_rank);
}

/* Wait for queued work on the buffers' stream (host backends may be NULL). */
static void wait_stream(const struct comm *c) {
    if (c->ops && c->octx && c->ops->sync) c->ops->sync(c->octx);
}

/* ---- host-memory operations (chunked to int counts) ----------------------- */

static int host_allreduce(struct comm *c, struct mpi_impl *m, void *buf, size_t count,
                          enum comm_dtype dt, struct tpi_error *err) {
    size_t isz = comm_dtype_size(dt);
    for (size_t off = 0; off < count; off += CHUNK_ITEMS) {
        int n = (int)TPI_MIN(CHUNK_ITEMS, count - off);
        MPI_Request req;
        int rc = MPI_Iallreduce(MPI_IN_PLACE, (unsigned char *)buf + off * isz, n, mpi_type(dt),
                                sum_op(m, dt), m->comm, &req);
        if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "MPI_Iallreduce", err);
        if ((rc = wait_op(c, m, &req, NULL, "allreduce", -1, err))) return rc;
    }
    return TPI_OK;
}

static int host_bcast(struct comm *c, struct mpi_impl *m, void *buf, size_t count,
                      enum comm_dtype dt, int root, struct tpi_error *err) {
    size_t isz = comm_dtype_size(dt);
    for (size_t off = 0; off < count; off += CHUNK_ITEMS) {
        int n = (int)TPI_MIN(CHUNK_ITEMS, count - off);
        MPI_Request req;
        int rc = MPI_Ibcast((unsigned char *)buf + off * isz, n, mpi_type(dt), root, m->comm, &req);
        if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "MPI_Ibcast", err);
        if ((rc = wait_op(c, m, &req, NULL, "bcast", -1, err))) return rc;
    }
    return TPI_OK;
}

static int host_send(struct comm *c, struct mpi_impl *m, const void *buf, size_t count,
                     enum comm_dtype dt, int peer, struct tpi_error *err) {
    size_t isz = comm_dtype_size(dt);
    for (size_t off = 0; off < count; off += CHUNK_ITEMS) {
        int n = (int)TPI_MIN(CHUNK_ITEMS, count - off);
        MPI_Request req;
        int rc = MPI_Isend((const unsigned char *)buf + off * isz, n, mpi_type(dt), peer, TAG_P2P,
                           m->comm, &req);
        if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "MPI_Isend", err);
        if ((rc = wait_op(c, m, &req, NULL, "send", peer, err))) return rc;
    }
    return TPI_OK;
}

static int host_recv(struct comm *c, struct mpi_impl *m, void *buf, size_t count,
                     enum comm_dtype dt, int peer, struct tpi_error *err) {
    size_t isz = comm_dtype_size(dt);
    for (size_t off = 0; off < count; off += CHUNK_ITEMS) {
        int n = (int)TPI_MIN(CHUNK_ITEMS, count - off);
        MPI_Status stt;
        MPI_Request req;
        int rc = MPI_Irecv((unsigned char *)buf + off * isz, n, mpi_type(dt), peer, TAG_P2P,
                           m->comm, &req);
        if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "MPI_Irecv", err);
        if ((rc = wait_op(c, m, &req, &stt, "recv", peer, err))) return rc;
        int got = 0;
        MPI_Get_count(&stt, mpi_type(dt), &got);
        if (got != n)
            return tpi_err(err, TPI_ERR_COMM,
                           "recv on world rank %d: expected %d items from "
                           "group rank %d, got %d",
                           c->world_rank, n, peer, got);
    }
    return TPI_OK;
}

static int host_allgather(struct comm *c, struct mpi_impl *m, const void *send, void *recv,
                          size_t count, enum comm_dtype dt, struct tpi_error *err) {
    MPI_Request req;
    int rc = MPI_Iallgather(send, (int)count, mpi_type(dt), recv, (int)count, mpi_type(dt),
                            m->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "MPI_Iallgather", err);
    return wait_op(c, m, &req, NULL, "allgather", -1, err);
}

/* ---- the vtable ----------------------------------------------------------- */

static int mpi_allreduce(struct comm *c, void *buf, size_t count, enum comm_dtype dt,
                         struct tpi_error *err) {
    struct mpi_impl *m = c->impl;
    if (m->pending != MPI_REQUEST_NULL) return check_pending(c, m, err);
    size_t n_bytes = count * comm_dtype_size(dt);
    wait_stream(c);
    if (!m->device) return host_allreduce(c, m, buf, count, dt, err);
    unsigned char *h = stage_get(m, n_bytes);
    if (!h) return stage_fail(c, n_bytes, err);
    c->ops->to_host(c->octx, h, buf, n_bytes);
    int st = host_allreduce(c, m, h, count, dt, err);
    if (st) return st;
    c->ops->to_dev(c->octx, buf, h, n_bytes);
    wait_stream(c); /* to_dev reads h until sync, and the caller expects the data */
    return TPI_OK;
}

static int mpi_allgather(struct comm *c, const void *send, void *recv, size_t count,
                         enum comm_dtype dt, struct tpi_error *err) {
    struct mpi_impl *m = c->impl;
    if (m->pending != MPI_REQUEST_NULL) return check_pending(c, m, err);
    size_t n_bytes = count * comm_dtype_size(dt);
    if (count > (size_t)INT_MAX)
        return tpi_err(err, TPI_ERR_UNSUPPORTED,
                       "allgather of %zu items per rank on world rank "
                       "%d: the MPI communicator handles at most %d",
                       count, c->world_rank, INT_MAX);
    wait_stream(c);
    if (!m->device) return host_allgather(c, m, send, recv, count, dt, err);
    /* Layout of the staging buffer: [size * n_bytes of result][n_bytes of ours]. */
    size_t n_total = (size_t)c->size * n_bytes;
    unsigned char *h = stage_get(m, n_total + n_bytes);
    if (!h) return stage_fail(c, n_total + n_bytes, err);
    c->ops->to_host(c->octx, h + n_total, send, n_bytes);
    int rc = host_allgather(c, m, h + n_total, h, count, dt, err);
    if (rc) return rc;
    c->ops->to_dev(c->octx, recv, h, n_total);
    wait_stream(c);
    return TPI_OK;
}

static int mpi_send(struct comm *c, const void *buf, size_t count, enum comm_dtype dt, int peer,
                    struct tpi_error *err) {
    struct mpi_impl *m = c->impl;
    if (m->pending != MPI_REQUEST_NULL) return check_pending(c, m, err);
    size_t n_bytes = count * comm_dtype_size(dt);
    wait_stream(c);
    if (!m->device) return host_send(c, m, buf, count, dt, peer, err);
    unsigned char *h = stage_get(m, n_bytes);
    if (!h) return stage_fail(c, n_bytes, err);
    c->ops->to_host(c->octx, h, buf, n_bytes);
    return host_send(c, m, h, count, dt, peer, err);
}

static int mpi_recv(struct comm *c, void *buf, size_t count, enum comm_dtype dt, int peer,
                    struct tpi_error *err) {
    struct mpi_impl *m = c->impl;
    if (m->pending != MPI_REQUEST_NULL) return check_pending(c, m, err);
    size_t n_bytes = count * comm_dtype_size(dt);
    /* The stream may still read buf (the previous step): wait before overwriting. */
    wait_stream(c);
    if (!m->device) return host_recv(c, m, buf, count, dt, peer, err);
    unsigned char *h = stage_get(m, n_bytes);
    if (!h) return stage_fail(c, n_bytes, err);
    int st = host_recv(c, m, h, count, dt, peer, err);
    if (st) return st;
    c->ops->to_dev(c->octx, buf, h, n_bytes);
    wait_stream(c);
    return TPI_OK;
}

static int mpi_bcast(struct comm *c, void *buf, size_t count, enum comm_dtype dt, int root,
                     struct tpi_error *err) {
    struct mpi_impl *m = c->impl;
    if (m->pending != MPI_REQUEST_NULL) return check_pending(c, m, err);
    size_t n_bytes = count * comm_dtype_size(dt);
    wait_stream(c);
    if (!m->device) return host_bcast(c, m, buf, count, dt, root, err);
    unsigned char *h = stage_get(m, n_bytes);
    if (!h) return stage_fail(c, n_bytes, err);
    if (c->rank == root) c->ops->to_host(c->octx, h, buf, n_bytes);
    int st = host_bcast(c, m, h, count, dt, root, err);
    if (st) return st;
    if (c->rank != root) {
        c->ops->to_dev(c->octx, buf, h, n_bytes);
        wait_stream(c);
    }
    return TPI_OK;
}

static int mpi_barrier(struct comm *c, struct tpi_error *err) {
    struct mpi_impl *m = c->impl;
    int rc = check_pending(c, m, err);
    if (rc) return rc;
    wait_stream(c);
    MPI_Request req;
    rc = MPI_Ibarrier(m->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "MPI_Ibarrier", err);
    return wait_op(c, m, &req, NULL, "barrier", -1, err);
}

static void mpi_destroy(struct comm *c) {
    struct mpi_impl *m = c->impl;
    if (!m) return;
    // A call that timed out may still complete if the late peer arrives: wait for it
    // once more, bounded. If it never does, its buffers and communicator are leaked:
    // freeing them under a posted request is erroneous, and the process is going down.
    if (m->pending != MPI_REQUEST_NULL && comm_poll_request(&m->pending, m->op_timeout_s) != TPI_OK)
        return;
    if (m->op_f16 != MPI_OP_NULL) MPI_Op_free(&m->op_f16);
    if (m->op_bf16 != MPI_OP_NULL) MPI_Op_free(&m->op_bf16);
    if (m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
#ifdef TPI_HAVE_CUDA
    if (m->stage_pinned) cudaHostUnregister(m->stage);
#endif
    free(m->stage);
    free(m);
    c->impl = NULL;
}

static const struct comm_vtable mpi_vtable = {
    .allreduce_sum = mpi_allreduce,
    .allgather = mpi_allgather,
    .send = mpi_send,
    .recv = mpi_recv,
    .bcast = mpi_bcast,
    .barrier = mpi_barrier,
    .destroy = mpi_destroy,
};

int comm_mpi_init(struct comm *c, struct tpi_error *err) {
    struct mpi_impl *m = calloc(1, sizeof *m);
    if (!m)
        return tpi_err(err, TPI_ERR_NOMEM, "MPI comm: out of memory on world rank %d",
                       c->world_rank);
    m->comm = MPI_COMM_NULL;
    m->op_f16 = m->op_bf16 = MPI_OP_NULL;
    m->pending = MPI_REQUEST_NULL;
    m->op_timeout_s = comm_op_timeout_s();
    m->device = comm_on_device(c);
    if (m->device && (!c->octx || !c->ops->to_host || !c->ops->to_dev || !c->ops->sync)) {
        free(m);
        return tpi_err(err, TPI_ERR_INVALID,
                       "MPI comm over cuda memory needs a backend context "
                       "(world rank %d)",
                       c->world_rank);
    }
    /* Collective (every rank has arrived); the other steps are local. */
    int rc = MPI_Comm_dup(c->mpi, &m->comm);
    if (rc != MPI_SUCCESS) {
        free(m);
        return mpi_fail(c, rc, "MPI_Comm_dup", err);
    }
    MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    /* commute = 1: addition is commutative, so MPI may reorder operands. */
    rc = MPI_Op_create(sum_f16, 1, &m->op_f16);
    if (rc == MPI_SUCCESS) rc = MPI_Op_create(sum_bf16, 1, &m->op_bf16);
    c->vt = &mpi_vtable;
    c->impl = m;
    if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "MPI_Op_create", err);
    return TPI_OK;
}
