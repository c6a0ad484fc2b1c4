/*
 * comm.c — the communicator front end: comm_create (arrival check with a
 * timeout, then the chosen implementation, then an agreement so every rank of
 * the group returns the same status), argument checks and per-call statistics
 * in the comm_* wrappers, dispatch through c->vt, and the small helpers shared
 * by comm_mpi.c, comm_nccl.c and grid.c (comm_impl.h).
 */
#define _GNU_SOURCE
#include "comm.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm_impl.h"

/* Tag of the zero-byte "I have arrived" messages of comm_create. It is above the
 * tags the MPI implementation uses on its private duplicate, and the caller's
 * communicator never sees user traffic from us otherwise. */
#define TAG_ARRIVE 0x7a11

static const size_t dtype_sizes[COMM_DTYPE_COUNT] = {4, 2, 2, 4, 1};

size_t comm_dtype_size(enum comm_dtype dt) {
    return (dt >= 0 && dt < COMM_DTYPE_COUNT) ? dtype_sizes[dt] : 0;
}

const char *comm_kind_name(enum comm_kind k) {
    switch (k) {
    case COMM_MPI:
        return "mpi";
    case COMM_NCCL:
        return "nccl";
    }
    return "unknown";
}

int comm_kind_from_name(const char *name) {
    if (!name) return -1;
    if (!strcmp(name, "mpi")) return COMM_MPI;
    if (!strcmp(name, "nccl")) return COMM_NCCL;
    return -1;
}

const char *comm_op_name(enum comm_op op) {
    static const char *names[COMM_OP_COUNT] = {"allreduce", "allgather", "send",
                                               "recv",      "bcast",     "barrier"};
    return (op >= 0 && op < COMM_OP_COUNT) ? names[op] : "unknown";
}

/* ---- helpers shared inside engine/parallel ------------------------------- */

bool comm_on_device(const struct comm *c) {
    return c->ops && c->ops->name && strcmp(c->ops->name, "cuda") == 0;
}

const char *comm_mpi_errstr(int code, char *buf, size_t n) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "MPI error %d", code);
    snprintf(buf, n, "%s", s);
    return buf;
}

const char *comm_host_name(char *buf, size_t n) {
    if (gethostname(buf, n) != 0) snprintf(buf, n, "unknown-host");
    buf[n - 1] = '\0';
    return buf;
}

double comm_op_timeout_s(void) {
    const char *ot = getenv("TPI_COMM_OP_TIMEOUT");
    return ot && *ot ? atof(ot) : 600.0;
}

int comm_poll_request(MPI_Request *req, double timeout_s) {
    double t0 = tpi_time_s();
    /* Sleep between tests, growing from 20 us to 1 ms: ranks are often
     * oversubscribed (CI runs 4 ranks on 2 cores), and a spinning waiter would
     * steal the core the late rank needs to arrive. Open MPI progresses
     * nonblocking collectives inside MPI_Test, so the test itself drives them. */
    long sleep_ns = 20000;
    for (;;) {
        int done = 0;
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return TPI_ERR_COMM;
        if (done) return TPI_OK;
        if (timeout_s > 0 && tpi_time_s() - t0 > timeout_s) return TPI_ERR_TIMEOUT;
        struct timespec ts = {0, sleep_ns};
        nanosleep(&ts, NULL);
        if (sleep_ns < 1000000) sleep_ns *= 2;
    }
}

/* World rank of rank `r` of `group` (r itself if translation fails). */
static int world_rank_of(MPI_Comm group, int r) {
    MPI_Group g, w;
    int out = r;
    if (MPI_Comm_group(group, &g) != MPI_SUCCESS) return r;
    if (MPI_Comm_group(MPI_COMM_WORLD, &w) == MPI_SUCCESS) {
        if (MPI_Group_translate_ranks(g, 1, &r, w, &out) != MPI_SUCCESS || out == MPI_UNDEFINED)
            out = r;
        MPI_Group_free(&w);
    }
    MPI_Group_free(&g);
    return out;
}

/* The message one rank sends everyone in comm_agree. */
struct agree_msg {
    int status;
    int world_rank;
    char host[256];
    char msg[sizeof(((struct tpi_error *)0)->msg)];
};

int comm_agree(MPI_Comm group, int status, double timeout_s, struct tpi_error *err) {
    int rank = 0, rc;
    char es[MPI_MAX_ERROR_STRING];
    MPI_Comm_rank(group, &rank);
    /* Heap buffers: a rank that times out returns while its request may still
     * complete later (when a late peer arrives), so they must outlive this call
     * and then leak (a few bytes, only on the error path). */
    int *keys = malloc(2 * sizeof *keys);
    if (!keys) return tpi_err(err, TPI_ERR_NOMEM, "comm_agree: out of memory");
    /* Key: lower wins. A real failure sorts before a timeout (the timeout is
     * usually its consequence), then the lowest rank. */
    const int timeout_flag = 1 << 24;
    keys[0] = status == TPI_OK ? INT_MAX : ((status == TPI_ERR_TIMEOUT ? timeout_flag : 0) | rank);
    keys[1] = INT_MAX;
    MPI_Request req;
    rc = MPI_Iallreduce(&keys[0], &keys[1], 1, MPI_INT, MPI_MIN, group, &req);
    if (rc != MPI_SUCCESS) {
        free(keys);
        if (status != TPI_OK) return status; /* keep our own, more telling message */
        return tpi_err(err, TPI_ERR_COMM,
                       "MPI_Iallreduce (status agreement) failed on world rank "
                       "%d: %s",
                       world_rank_of(group, rank), comm_mpi_errstr(rc, es, sizeof es));
    }
    /* A rank that already timed out has waited long enough: it leaves its
     * verdict posted (a late peer picks it up) and returns at once. */
    if (status == TPI_ERR_TIMEOUT) return status;
    int pst = comm_poll_request(&req, timeout_s);
    if (pst != TPI_OK) {
        if (pst != TPI_ERR_TIMEOUT) free(keys);
        if (status != TPI_OK) return status;
        if (pst == TPI_ERR_TIMEOUT)
            return tpi_err(err, TPI_ERR_TIMEOUT,
                           "timed out after %.1f s waiting for the other ranks to report their "
                           "status (world rank %d): the ranks that report this arrived, the "
                           "others are stuck, dead or far behind (launch/README.md: when a run "
                           "hangs)",
                           timeout_s, world_rank_of(group, rank));
        return tpi_err(err, TPI_ERR_COMM, "status agreement failed on world rank %d",
                       world_rank_of(group, rank));
    }
    int key = keys[1];
    free(keys);
    if (key == INT_MAX) return TPI_OK;
    int winner = key & (timeout_flag - 1);
    if (key & timeout_flag) {
        /* Timed-out ranks do not stay for a broadcast, so none is posted (every
         * rank sees the same key and makes the same choice); each keeps its own
         * message or says who gave up. */
        if (status != TPI_OK) return status;
        return tpi_err(err, TPI_ERR_TIMEOUT,
                       "world rank %d timed out waiting for the group (see its message; the "
                       "missing rank arrived too late)",
                       world_rank_of(group, winner));
    }
    struct agree_msg *m = calloc(1, sizeof *m);
    if (!m) return tpi_err(err, TPI_ERR_NOMEM, "comm_agree: out of memory");
    if (rank == winner) {
        m->status = status;
        m->world_rank = world_rank_of(group, rank);
        comm_host_name(m->host, sizeof m->host);
        snprintf(m->msg, sizeof m->msg, "%s", err ? err->msg : "(no message)");
    }
    rc = MPI_Ibcast(m, (int)sizeof *m, MPI_BYTE, winner, group, &req);
    pst = rc == MPI_SUCCESS ? comm_poll_request(&req, timeout_s) : TPI_ERR_COMM;
    if (pst != TPI_OK) {
        if (pst != TPI_ERR_TIMEOUT) free(m);
        if (status != TPI_OK) return status;
        return tpi_err(err, TPI_ERR_COMM, "world rank %d failed, and its message did not arrive",
                       world_rank_of(group, winner));
    }
    m->host[sizeof m->host - 1] = '\0';
    m->msg[sizeof m->msg - 1] = '\0';
    int st = m->status != TPI_OK ? m->status : TPI_ERR_COMM;
    tpi_err(err, st, "rank %d (host %s): %s", m->world_rank, m->host, m->msg);
    free(m);
    return st;
}

/* List world ranks of group members with flag[i] == want as "0,2,5". */
static void rank_list(MPI_Comm group, const char *flag, int n, char want, char *buf, size_t cap) {
    size_t off = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && off + 16 < cap; i++)
        if (flag[i] == want)
            off += (size_t)snprintf(buf + off, cap - off, "%s%d", off ? "," : "",
                                    world_rank_of(group, i));
}

/* Every rank of `group` sends a zero-byte message to every other and waits for
 * all of theirs, up to timeout_s. Point-to-point (not MPI_Ibarrier) so a timed
 * out rank can say who arrived; zero bytes so the abandoned receives need no
 * buffer and can be freed. Then an agreement: a late rank learns that the
 * others gave up on it and fails too, instead of proceeding alone. */
static int wait_arrival(MPI_Comm group, int rank, int size, double timeout_s,
                        struct tpi_error *err) {
    if (size <= 1) return TPI_OK;
    int n_peer = size - 1, rc = MPI_SUCCESS;
    MPI_Request *reqs = calloc((size_t)(2 * n_peer), sizeof *reqs);
    int *idx = calloc((size_t)n_peer, sizeof *idx);
    char *arrived = calloc((size_t)size, 1);
    char es[MPI_MAX_ERROR_STRING];
    if (!reqs || !idx || !arrived) {
        free(reqs);
        free(idx);
        free(arrived);
        return tpi_err(err, TPI_ERR_NOMEM, "comm_create: out of memory");
    }
    arrived[rank] = 1;
    for (int i = 0, k = 0; i < size && rc == MPI_SUCCESS; i++) {
        if (i == rank) continue;
        rc = MPI_Irecv(NULL, 0, MPI_BYTE, i, TAG_ARRIVE, group, &reqs[k]);
        if (rc == MPI_SUCCESS)
            rc = MPI_Isend(NULL, 0, MPI_BYTE, i, TAG_ARRIVE, group, &reqs[n_peer + k]);
        k++;
    }
    int status = TPI_OK, n_arrived = 1;
    if (rc != MPI_SUCCESS) {
        status = tpi_err(err, TPI_ERR_COMM,
                         "comm_create: posting arrival messages failed on world "
                         "rank %d: %s",
                         world_rank_of(group, rank), comm_mpi_errstr(rc, es, sizeof es));
    }
    double t0 = tpi_time_s();
    long sleep_ns = 20000;
    while (status == TPI_OK && n_arrived < size) {
        int n_done = 0;
        rc = MPI_Testsome(n_peer, reqs, &n_done, idx, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) {
            status = tpi_err(err, TPI_ERR_COMM,
                             "comm_create: MPI_Testsome failed on world rank %d: "
                             "%s",
                             world_rank_of(group, rank), comm_mpi_errstr(rc, es, sizeof es));
            break;
        }
        for (int j = 0; j < n_done && n_done != MPI_UNDEFINED; j++) {
            int peer = idx[j] < rank ? idx[j] : idx[j] + 1;
            arrived[peer] = 1;
            n_arrived++;
        }
        if (n_arrived == size) break;
        if (timeout_s > 0 && tpi_time_s() - t0 > timeout_s) {
            char have[512], miss[512];
            rank_list(group, arrived, size, 1, have, sizeof have);
            rank_list(group, arrived, size, 0, miss, sizeof miss);
            status = tpi_err(err, TPI_ERR_TIMEOUT,
                             "timed out after %.1f s waiting for ranks: arrived [%s], missing [%s] "
                             "(world ranks; seen from world rank %d)",
                             timeout_s, have, miss, world_rank_of(group, rank));
            break;
        }
        struct timespec ts = {0, sleep_ns};
        nanosleep(&ts, NULL);
        if (sleep_ns < 1000000) sleep_ns *= 2;
    }
    /* Zero-byte requests own no buffer, so freeing pending ones is safe; a late
     * peer's message then matches a freed receive and is dropped. */
    for (int k = 0; k < 2 * n_peer; k++)
        if (reqs[k] != MPI_REQUEST_NULL) MPI_Request_free(&reqs[k]);
    free(reqs);
    free(idx);
    free(arrived);
    /* The agreement gives a late rank the others' verdict. Its own timeout keeps
     * it from waiting forever when the others have already left. */
    int agreed = comm_agree(group, status, timeout_s, err);
    if (agreed == TPI_ERR_TIMEOUT && status == TPI_OK) {
        /* We arrived, but after the others had given up on us. */
        char host[256];
        return tpi_err(err, TPI_ERR_TIMEOUT,
                       "world rank %d (host %s) arrived after the other ranks had given up "
                       "waiting for it (their timeout: %.1f s)",
                       world_rank_of(group, rank), comm_host_name(host, sizeof host), timeout_s);
    }
    return agreed;
}

int comm_create(struct comm **out, enum comm_kind kind, MPI_Comm group, const struct ops *ops,
                struct ops_ctx *octx, double timeout_s, struct tpi_error *err) {
    if (!out) return tpi_err(err, TPI_ERR_INVALID, "comm_create: out is NULL");
    *out = NULL;
    if (kind != COMM_MPI && kind != COMM_NCCL)
        return tpi_err(err, TPI_ERR_INVALID, "comm_create: unknown communicator kind %d",
                       (int)kind);
    if (group == MPI_COMM_NULL)
        return tpi_err(err, TPI_ERR_INVALID, "comm_create: group is MPI_COMM_NULL");
#ifndef TPI_HAVE_NCCL
    /* Decided identically on every rank (same binary), so no agreement needed. */
    if (kind == COMM_NCCL)
        return tpi_err(err, TPI_ERR_UNSUPPORTED,
                       "--comm nccl: built without CUDA/NCCL; use --comm mpi");
#endif
    struct comm *c = calloc(1, sizeof *c);
    if (!c) return tpi_err(err, TPI_ERR_NOMEM, "comm_create: out of memory");
    c->kind = kind;
    c->mpi = group;
    c->ops = ops;
    c->octx = octx;
    c->timeout_s = timeout_s;
    MPI_Comm_rank(group, &c->rank);
    MPI_Comm_size(group, &c->size);
    MPI_Comm_rank(MPI_COMM_WORLD, &c->world_rank);
    /* Errors must come back as codes, not abort the job. */
    MPI_Comm_set_errhandler(group, MPI_ERRORS_RETURN);

    int st = wait_arrival(group, c->rank, c->size, timeout_s, err);
    if (st != TPI_OK) {
        free(c);
        return st;
    }
    struct tpi_error local;
    tpi_err_clear(&local);
    st = kind == COMM_MPI ? comm_mpi_init(c, &local) : comm_nccl_init(c, &local);
    /* Everyone arrived, so this cannot hang for long; it makes one rank's
     * failure (a missing GPU, a bad bus id) every rank's error. */
    st = comm_agree(group, st, timeout_s, &local);
    if (st != TPI_OK) {
        if (c->vt && c->impl) c->vt->destroy(c);
        free(c);
        if (err) *err = local;
        return st;
    }
    *out = c;
    return TPI_OK;
}

void comm_free(struct comm **c) {
    if (!c || !*c) return;
    if ((*c)->vt && (*c)->vt->destroy) (*c)->vt->destroy(*c);
    free(*c);
    *c = NULL;
}

/* ---- wrappers: check, count, dispatch ------------------------------------- */

static int check_common(const struct comm *c, enum comm_dtype dt, const char *what,
                        struct tpi_error *err) {
    if (!c || !c->vt) return tpi_err(err, TPI_ERR_INVALID, "%s: communicator is NULL", what);
    if (dt < 0 || dt >= COMM_DTYPE_COUNT)
        return tpi_err(err, TPI_ERR_INVALID, "%s: bad dtype %d on rank %d", what, (int)dt,
                       c->world_rank);
    return TPI_OK;
}

static void count(struct comm *c, enum comm_op op, size_t n_bytes) {
    c->stats.calls[op]++;
    c->stats.bytes[op] += n_bytes;
}

int comm_allreduce_sum(struct comm *c, void *buf, size_t count_, enum comm_dtype dt,
                       struct tpi_error *err) {
    int st = check_common(c, dt, "allreduce", err);
    if (st) return st;
    count(c, COMM_OP_ALLREDUCE, count_ * comm_dtype_size(dt));
    /* Zero items is a no-op on every rank alike, so skipping it stays collective. */
    if (count_ == 0) return TPI_OK;
    return c->vt->allreduce_sum(c, buf, count_, dt, err);
}

int comm_allreduce_add(struct comm *c, float *src, float *dst, size_t count_,
                       struct tpi_error *err) {
    int st = check_common(c, COMM_F32, "allreduce", err);
    if (st) return st;
    count(c, COMM_OP_ALLREDUCE, count_ * sizeof(float));
    if (count_ == 0) return TPI_OK;
    if (c->vt->allreduce_add) return c->vt->allreduce_add(c, src, dst, count_, err);
    if (!c->ops || !c->ops->add)
        return tpi_err(err, TPI_ERR_INVALID, "allreduce_add: no backend add on rank %d",
                       c->world_rank);
    if ((st = c->vt->allreduce_sum(c, src, count_, COMM_F32, err))) return st;
    c->ops->add(c->octx, dst, src, (int64_t)count_);
    return TPI_OK;
}

int comm_allreduce_add_norm(struct comm *c, float *src, float *dst, int n_rows, int n_cols,
                            const float *w, float eps, float *h, bool *normed,
                            struct tpi_error *err) {
    *normed = false;
    const size_t n = (size_t)n_rows * (size_t)n_cols;
    if (!c || !c->vt || !c->vt->allreduce_add_norm || n == 0)
        return comm_allreduce_add(c, src, dst, n, err);
    count(c, COMM_OP_ALLREDUCE, n * sizeof(float));
    return c->vt->allreduce_add_norm(c, src, dst, n_rows, n_cols, w, eps, h, normed, err);
}

int comm_allgather(struct comm *c, const void *send, void *recv, size_t count_, enum comm_dtype dt,
                   struct tpi_error *err) {
    int st = check_common(c, dt, "allgather", err);
    if (st) return st;
    count(c, COMM_OP_ALLGATHER, count_ * comm_dtype_size(dt));
    if (count_ == 0) return TPI_OK;
    return c->vt->allgather(c, send, recv, count_, dt, err);
}

static int check_peer(const struct comm *c, int peer, const char *what, struct tpi_error *err) {
    if (peer < 0 || peer >= c->size || peer == c->rank)
        return tpi_err(err, TPI_ERR_INVALID, "%s: bad peer %d on group rank %d (group size %d)",
                       what, peer, c->rank, c->size);
    return TPI_OK;
}

int comm_send(struct comm *c, const void *buf, size_t count_, enum comm_dtype dt, int peer,
              struct tpi_error *err) {
    int st = check_common(c, dt, "send", err);
    if (!st) st = check_peer(c, peer, "send", err);
    if (st) return st;
    count(c, COMM_OP_SEND, count_ * comm_dtype_size(dt));
    if (count_ == 0) return TPI_OK;
    return c->vt->send(c, buf, count_, dt, peer, err);
}

int comm_recv(struct comm *c, void *buf, size_t count_, enum comm_dtype dt, int peer,
              struct tpi_error *err) {
    int st = check_common(c, dt, "recv", err);
    if (!st) st = check_peer(c, peer, "recv", err);
    if (st) return st;
    count(c, COMM_OP_RECV, count_ * comm_dtype_size(dt));
    if (count_ == 0) return TPI_OK;
    return c->vt->recv(c, buf, count_, dt, peer, err);
}

int comm_bcast(struct comm *c, void *buf, size_t count_, enum comm_dtype dt, int root,
               struct tpi_error *err) {
    int st = check_common(c, dt, "bcast", err);
    if (st) return st;
    if (root < 0 || root >= c->size)
        return tpi_err(err, TPI_ERR_INVALID, "bcast: bad root %d (group size %d)", root, c->size);
    count(c, COMM_OP_BCAST, count_ * comm_dtype_size(dt));
    if (count_ == 0) return TPI_OK;
    return c->vt->bcast(c, buf, count_, dt, root, err);
}

int comm_barrier(struct comm *c, struct tpi_error *err) {
    if (!c || !c->vt) return tpi_err(err, TPI_ERR_INVALID, "barrier: communicator is NULL");
    count(c, COMM_OP_BARRIER, 0);
    return c->vt->barrier(c, err);
}

void comm_item_set(void *buf, enum comm_dtype dt, size_t i, double v) {
    switch (dt) {
    case COMM_F32: ((float *)buf)[i] = (float)v; break;
    case COMM_F16: ((uint16_t *)buf)[i] = tpi_f32_to_f16((float)v); break;
    case COMM_BF16: ((uint16_t *)buf)[i] = tpi_f32_to_bf16((float)v); break;
    case COMM_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    default: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    }
}

double comm_item_get(const void *buf, enum comm_dtype dt, size_t i) {
    switch (dt) {
    case COMM_F32: return ((const float *)buf)[i];
    case COMM_F16: return tpi_f16_to_f32(((const uint16_t *)buf)[i]);
    case COMM_BF16: return tpi_bf16_to_f32(((const uint16_t *)buf)[i]);
    case COMM_I32: return ((const int32_t *)buf)[i];
    default: return ((const uint8_t *)buf)[i];
    }
}
