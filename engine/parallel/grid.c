/*
 * grid.c — MPI bootstrap, the tp x pp rank grid and the agreement helpers.
 *
 * Layout: world rank = pp_stage * tp + tp_rank, so a TP group is a run of
 * consecutive ranks (one node under by-slot placement) and a PP chain links
 * ranks tp apart. Every communicator we make returns errors instead of
 * aborting, so library code can turn an MPI failure into a message.
 */
#define _GNU_SOURCE
#include "grid.h"

#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm_impl.h"

/* Whether grid_mpi_init called MPI_Init_thread (and so owns MPI_Finalize).
 * Process-wide by nature: MPI itself is initialised once per process. */
static int g_we_initialised = 0;

/* How long start-up and the end of a run wait for every rank (grid_set_wait). */
static double g_wait_s = 60.0;

/* MPI_Init and the barrier before MPI_Finalize wait at least this long whatever the
 * option says: a slow launch or a rank 0 still closing its files is not a fault. */
#define GRID_WAIT_FLOOR_S 60.0

static double wait_floor(void) { return g_wait_s > GRID_WAIT_FLOOR_S ? g_wait_s : GRID_WAIT_FLOOR_S; }

void grid_set_wait(double seconds) {
    if (seconds > 0 && isfinite(seconds)) g_wait_s = seconds;
}

double grid_wait(void) { return g_wait_s; }

int grid_poll(MPI_Request *req, double timeout_s) { return comm_poll_request(req, timeout_s); }

void grid_wait_or_abort(const struct tpi_grid *g, MPI_Request *req, const char *cmd,
                        const char *what) {
    const int st = comm_poll_request(req, comm_op_timeout_s());
    if (st == TPI_OK) return;
    if (st == TPI_ERR_TIMEOUT)
        fprintf(stderr,
                "tpinfer %s: error on rank %d: %s did not complete in %.0f s: a peer rank is "
                "stuck, dead or far behind (TPI_COMM_OP_TIMEOUT=S changes the limit)\n",
                cmd, g->world_rank, what, comm_op_timeout_s());
    else
        fprintf(stderr, "tpinfer %s: error on rank %d: %s failed\n", cmd, g->world_rank, what);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* What a rank says when MPI_Init outlives the wait (made before the alarm is set). */
static char g_init_msg[256];

static void on_init_alarm(int sig) {
    (void)sig;
    ssize_t k = write(2, g_init_msg, strlen(g_init_msg)); // async-signal-safe
    (void)k;
    _exit(1);
}

int grid_mpi_init(int *argc, char ***argv, struct tpi_error *err) {
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (finalized) return tpi_err(err, TPI_ERR_COMM, "MPI was already finalized");
    if (!inited) {
        /* MPI_Init waits for every rank of the job to start it, without a limit: a rank
         * stopped before it would keep the others there. Under a launcher, an alarm ends
         * a rank still inside it after the wait, and mpirun then ends the job. */
        const char *launched = getenv("OMPI_COMM_WORLD_SIZE");
        const bool guard = launched && atoi(launched) > 1;
        struct sigaction sa, old;
        if (guard) {
            const char *r = getenv("OMPI_COMM_WORLD_RANK");
            const double w = wait_floor() < 1e6 ? wait_floor() : 1e6; // alarm's unsigned
            snprintf(g_init_msg, sizeof g_init_msg,
                     "[rank %s] tpinfer: MPI_Init did not complete within %.0f s: a rank of "
                     "the job did not start it (stopped, or not launched); ending\n",
                     r ? r : "?", w);
            memset(&sa, 0, sizeof sa);
            sa.sa_handler = on_init_alarm;
            sigemptyset(&sa.sa_mask);
            sigaction(SIGALRM, &sa, &old);
            alarm((unsigned)ceil(w));
        }
        /* FUNNELED: OpenMP threads compute, only the main thread calls MPI. */
        int provided = 0;
        int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
        if (guard) {
            alarm(0);
            sigaction(SIGALRM, &old, NULL);
        }
        if (rc != MPI_SUCCESS) return tpi_err(err, TPI_ERR_COMM, "MPI_Init_thread failed (%d)", rc);
        g_we_initialised = 1;
        if (provided < MPI_THREAD_FUNNELED)
            TPI_LOGW("MPI provides thread level %d, below FUNNELED; continuing", provided);
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    return TPI_OK;
}

void grid_mpi_finalize(void) {
    int finalized = 0, size = 1, rank = 0;
    MPI_Finalized(&finalized);
    if (!g_we_initialised || finalized) return;
    g_we_initialised = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (size > 1) {
        // MPI_Finalize waits for every rank and has no limit: a peer stuck in a call of
        // its own, or waiting in a collective this rank left after an error, would keep
        // this one (and the job) there forever. Meet at a barrier with a limit first.
        MPI_Request req;
        const int st = MPI_Ibarrier(MPI_COMM_WORLD, &req) == MPI_SUCCESS
                           ? comm_poll_request(&req, wait_floor())
                           : TPI_ERR_COMM;
        if (st != TPI_OK) {
            fprintf(stderr,
                    "[rank %d] tpinfer: the other ranks did not reach the end of the run "
                    "within %.0f s (a rank is stuck, or stopped after an error of its own): "
                    "ending the job\n",
                    rank, wait_floor());
            fflush(stderr);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    MPI_Finalize();
}

static int mpi_err(struct tpi_error *err, int rc, const char *call, int rank) {
    char es[MPI_MAX_ERROR_STRING];
    return tpi_err(err, TPI_ERR_COMM, "%s failed on world rank %d: %s", call, rank,
                   comm_mpi_errstr(rc, es, sizeof es));
}

int grid_init(struct tpi_grid *g, int tp, int pp, struct tpi_error *err) {
    if (!g) return tpi_err(err, TPI_ERR_INVALID, "grid_init: grid is NULL");
    memset(g, 0, sizeof *g);
    g->world = g->tp_comm = g->pp_comm = g->node = MPI_COMM_NULL;
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited)
        return tpi_err(err, TPI_ERR_INVALID,
                       "grid_init: MPI is not initialised "
                       "(call grid_mpi_init first)");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_size(MPI_COMM_WORLD, &g->world_size);
    MPI_Comm_rank(MPI_COMM_WORLD, &g->world_rank);
    comm_host_name(g->host, sizeof g->host);
    /* The option parsers refuse tp or pp < 1 on the rank given it; after the comparison
     * below every rank sees the same numbers, so every rank fails alike. */
    if (tp < 1 || pp < 1)
        return tpi_err(err, TPI_ERR_INVALID, "--tp %d --pp %d: both must be at least 1", tp, pp);
    /* Ranks given different --tp/--pp would split the world differently and wait in
     * MPI_Comm_split for each other forever: compare them first, with a limit. */
    if (g->world_size > 1) {
        int *v = malloc(8 * sizeof *v); /* outlives a timed-out request: leaks then */
        if (!v) return tpi_err(err, TPI_ERR_NOMEM, "grid_init: out of memory");
        v[0] = tp, v[1] = pp, v[2] = -tp, v[3] = -pp;
        MPI_Request req;
        int rc = MPI_Iallreduce(v, v + 4, 4, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &req);
        if (rc != MPI_SUCCESS) {
            free(v);
            return mpi_err(err, rc, "MPI_Iallreduce (--tp/--pp)", g->world_rank);
        }
        const int st = comm_poll_request(&req, g_wait_s);
        if (st == TPI_ERR_TIMEOUT)
            return tpi_err(err, TPI_ERR_TIMEOUT,
                           "world rank %d waited %.0f s at start-up for the other ranks: one "
                           "is stuck or was not started (--comm-timeout S changes the limit)",
                           g->world_rank, g_wait_s);
        if (st != TPI_OK) {
            free(v);
            return tpi_err(err, TPI_ERR_COMM, "MPI_Iallreduce (--tp/--pp) failed on world rank %d",
                           g->world_rank);
        }
        const int tp_hi = v[4], pp_hi = v[5], tp_lo = -v[6], pp_lo = -v[7];
        free(v);
        if (tp_lo != tp_hi || pp_lo != pp_hi)
            return tpi_err(err, TPI_ERR_INVALID,
                           "the ranks were given different --tp/--pp (--tp from %d to %d, --pp "
                           "from %d to %d): give every rank the same",
                           tp_lo, tp_hi, pp_lo, pp_hi);
    }
    if ((int64_t)tp * pp != g->world_size) {
        if (g->world_size == 1)
            return tpi_err(err, TPI_ERR_INVALID,
                           "--tp %d --pp %d needs %d ranks, launched with 1: "
                           "run under mpirun -np %d",
                           tp, pp, tp * pp, tp * pp);
        return tpi_err(err, TPI_ERR_INVALID,
                       "--tp %d --pp %d needs %d ranks (tp * pp), launched "
                       "with %d: run under mpirun -np %d, or change --tp/--pp so tp * pp = %d",
                       tp, pp, tp * pp, g->world_size, tp * pp, g->world_size);
    }
    g->tp = tp;
    g->pp = pp;
    g->tp_rank = g->world_rank % tp;
    g->pp_stage = g->world_rank / tp;

    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &g->world);
    if (rc != MPI_SUCCESS) return mpi_err(err, rc, "MPI_Comm_dup", g->world_rank);
    MPI_Comm_set_errhandler(g->world, MPI_ERRORS_RETURN);
    /* TP group: same stage, ordered by tp_rank. PP chain: same tp_rank, by stage. */
    rc = MPI_Comm_split(g->world, g->pp_stage, g->tp_rank, &g->tp_comm);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_split(g->world, g->tp_rank, g->pp_stage, &g->pp_comm);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_split_type(g->world, MPI_COMM_TYPE_SHARED, g->world_rank, MPI_INFO_NULL,
                                 &g->node);
    if (rc != MPI_SUCCESS) {
        mpi_err(err, rc, "MPI_Comm_split", g->world_rank);
        grid_free(g);
        return TPI_ERR_COMM;
    }
    MPI_Comm_set_errhandler(g->tp_comm, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(g->pp_comm, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(g->node, MPI_ERRORS_RETURN);
    MPI_Comm_rank(g->node, &g->local_rank);
    MPI_Comm_size(g->node, &g->local_size);
    return TPI_OK;
}

void grid_free(struct tpi_grid *g) {
    if (!g) return;
    MPI_Comm *cs[] = {&g->node, &g->pp_comm, &g->tp_comm, &g->world};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        if (*cs[i] != MPI_COMM_NULL) MPI_Comm_free(cs[i]);
}

int grid_rank_of(const struct tpi_grid *g, int tp_rank, int pp_stage) {
    return pp_stage * g->tp + tp_rank;
}

int grid_agree(const struct tpi_grid *g, int status, struct tpi_error *err) {
    /* Every rank calls this at the same step; one that never comes (stuck, dead) is
     * reported after TPI_COMM_OP_TIMEOUT, as any other collective is. */
    MPI_Comm w = g->world != MPI_COMM_NULL ? g->world : MPI_COMM_WORLD;
    return comm_agree(w, status, comm_op_timeout_s(), err);
}

int grid_bcast(const struct tpi_grid *g, void *buf, int n, MPI_Datatype dt, int root,
               struct tpi_error *err) {
    MPI_Request req;
    int rc = MPI_Ibcast(buf, n, dt, root, g->world, &req);
    if (rc == MPI_SUCCESS) rc = comm_poll_request(&req, comm_op_timeout_s());
    else rc = TPI_ERR_COMM;
    if (rc == TPI_ERR_TIMEOUT)
        return tpi_err(err, TPI_ERR_TIMEOUT,
                       "a broadcast from world rank %d did not complete on world rank %d in "
                       "%.1f s: a peer rank is stuck, dead or far behind (TPI_COMM_OP_TIMEOUT=S "
                       "changes the limit; launch/README.md: when a run hangs)",
                       root, g->world_rank, comm_op_timeout_s());
    if (rc != TPI_OK)
        return tpi_err(err, TPI_ERR_COMM, "world rank %d: MPI_Bcast of %d items from rank %d "
                       "failed", g->world_rank, n, root);
    return TPI_OK;
}

/* One field of run_identity: name, how to describe it, and where it is. */
struct id_field {
    const char *field, *what;
    size_t offset;
    int is64;
};

#define F64(f, w)                                                                                  \
    { #f, w, offsetof(struct run_identity, f), 1 }
#define F32(f, w)                                                                                  \
    { #f, w, offsetof(struct run_identity, f), 0 }
static const struct id_field id_fields[] = {
    F64(model_size, "model file differs (model_size, total bytes)"),
    F64(metadata_hash, "model metadata differs (metadata_hash)"),
    F64(data_hash, "model weights differ (data_hash: tensor infos and a sample of each "
                   "tensor's data)"),
    F32(tp, "--tp differs (tp)"),
    F32(pp, "--pp differs (pp)"),
    F32(backend, "--backend differs (backend, 0 cpu 1 cuda)"),
    F32(comm, "--comm differs (comm, 0 mpi 1 nccl)"),
    F32(n_ctx, "context size differs (n_ctx)"),
    F32(n_slot, "--parallel differs (n_slot, sequences in the KV cache)"),
    F32(n_ubatch, "the micro-batch differs (n_ubatch, --ubatch or the longest prompt)"),
    F64(seed, "--seed differs (seed)"),
    F64(pp_layers_hash, "--pp-layers differs (pp_layers_hash)"),
    F64(rope_hash, "--rope-scaling, --rope-scale or --yarn-orig-ctx differs (rope_hash)"),
};

static uint64_t id_get(const struct run_identity *id, const struct id_field *f) {
    const unsigned char *p = (const unsigned char *)id + f->offset;
    if (f->is64) {
        uint64_t v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    int32_t v;
    memcpy(&v, p, sizeof v);
    return (uint64_t)(int64_t)v;
}

static void id_fmt(const struct id_field *f, uint64_t v, char *buf, size_t n) {
    if (!f->is64 || !strcmp(f->field, "seed"))
        snprintf(buf, n, "%" PRId64, (int64_t)v);
    else if (!strcmp(f->field, "metadata_hash") || !strcmp(f->field, "data_hash") ||
             !strcmp(f->field, "pp_layers_hash") || !strcmp(f->field, "rope_hash"))
        snprintf(buf, n, "%016" PRIx64, v);
    else
        snprintf(buf, n, "%" PRIu64, v);
}

int grid_check_identity(const struct tpi_grid *g, const struct run_identity *id,
                        struct tpi_error *err) {
    int n = g->world_size;
    /* n * sizeof (~90 bytes): if even that fails the process is lost anyway. */
    struct run_identity *all = calloc((size_t)n, sizeof *all);
    if (!all)
        return tpi_err(err, TPI_ERR_NOMEM, "grid_check_identity: out of memory on world rank %d",
                       g->world_rank);
    /* On the heap: a request that timed out may still read it (it leaks then). */
    struct run_identity *mine = malloc(sizeof *mine);
    if (!mine) {
        free(all);
        return tpi_err(err, TPI_ERR_NOMEM, "grid_check_identity: out of memory on world rank %d",
                       g->world_rank);
    }
    *mine = *id;
    MPI_Request req;
    int rc = MPI_Iallgather(mine, (int)sizeof *mine, MPI_BYTE, all, (int)sizeof *mine, MPI_BYTE,
                            g->world, &req);
    // Start-up (the files are open, nothing loaded yet): the --comm-timeout limit.
    const int pst = rc == MPI_SUCCESS ? comm_poll_request(&req, g_wait_s) : TPI_OK;
    if (pst == TPI_ERR_TIMEOUT) // the request may still use both buffers: leave them
        return tpi_err(err, TPI_ERR_TIMEOUT,
                       "world rank %d waited %.0f s at start-up for the other ranks' run "
                       "identity: one is stuck (--comm-timeout S changes the limit)",
                       g->world_rank, g_wait_s);
    int st = TPI_OK;
    if (rc != MPI_SUCCESS) {
        st = mpi_err(err, rc, "MPI_Iallgather (run identity)", g->world_rank);
    } else if (pst != TPI_OK) {
        st = tpi_err(err, TPI_ERR_COMM, "MPI_Iallgather (run identity) failed on world rank %d",
                     g->world_rank);
    } else {
        /* Every rank compares the same gathered table, so all reach the same verdict. */
        for (size_t f = 0; f < sizeof id_fields / sizeof id_fields[0] && st == TPI_OK; f++) {
            const struct id_field *fd = &id_fields[f];
            uint64_t ref = id_get(&all[0], fd);
            char list[256] = "", vbuf[64], rbuf[64];
            size_t off = 0;
            int first = -1, n_diff = 0;
            for (int r = 1; r < n; r++) {
                if (id_get(&all[r], fd) == ref) continue;
                if (first < 0) first = r;
                n_diff++;
                if (off + 16 < sizeof list)
                    off +=
                        (size_t)snprintf(list + off, sizeof list - off, "%s%d", off ? "," : "", r);
            }
            if (first < 0) continue;
            id_fmt(fd, id_get(&all[first], fd), vbuf, sizeof vbuf);
            id_fmt(fd, ref, rbuf, sizeof rbuf);
            st = tpi_err(err, TPI_ERR_INVALID, "%s: rank %d has %s, rank 0 has %s%s%s%s", fd->what,
                         first, vbuf, rbuf, n_diff > 1 ? " (ranks differing: " : "",
                         n_diff > 1 ? list : "", n_diff > 1 ? ")" : "");
        }
    }
    free(all);
    free(mine);
    /* Memory or MPI failure is local; make it everyone's. A mismatch is already
     * seen by all, but agreeing is cheap and keeps one code path. */
    if (st != TPI_OK && st != TPI_ERR_INVALID) return grid_agree(g, st, err);
    return st;
}

int grid_check_same(const struct tpi_grid *g, const struct grid_same *vals,
                    int n, struct tpi_error *err) {
    if (g->world_size <= 1 || n <= 0) return TPI_OK;
    const int nr = g->world_size;
    uint64_t *mine = malloc(sizeof *mine * (size_t)n);
    uint64_t *all = calloc((size_t)nr * (size_t)n, sizeof *all);
    int st = TPI_OK;
    if (!mine || !all) {
        st = tpi_err(err, TPI_ERR_NOMEM, "out of memory comparing the ranks' options on world "
                     "rank %d", g->world_rank);
    } else {
        for (int i = 0; i < n; i++) mine[i] = vals[i].value;
        MPI_Request req;
        int rc = MPI_Iallgather(mine, n, MPI_UINT64_T, all, n, MPI_UINT64_T, g->world, &req);
        rc = rc == MPI_SUCCESS ? comm_poll_request(&req, comm_op_timeout_s()) : TPI_ERR_COMM;
        if (rc == TPI_ERR_TIMEOUT) {
            /* The request stays posted and may still use both buffers: they leak. */
            return tpi_err(err, TPI_ERR_TIMEOUT,
                           "the ranks' options were not all gathered on world rank %d in "
                           "%.1f s: a peer rank is stuck, dead or far behind",
                           g->world_rank, comm_op_timeout_s());
        }
        if (rc != TPI_OK)
            st = tpi_err(err, TPI_ERR_COMM, "MPI_Allgather of the ranks' options failed on world "
                         "rank %d", g->world_rank);
    }
    /* Every rank reads the same gathered table, so all reach the same verdict. */
    for (int i = 0; st == TPI_OK && i < n; i++) {
        const uint64_t ref = all[i];
        int first = -1, n_diff = 0;
        for (int r = 1; r < nr; r++)
            if (all[(size_t)r * n + i] != ref) {
                if (first < 0) first = r;
                n_diff++;
            }
        if (first < 0) continue;
        char others[48] = "";
        if (n_diff > 1) snprintf(others, sizeof others, " (and %d more rank%s)", n_diff - 1,
                                 n_diff > 2 ? "s" : "");
        if (vals[i].hashed)
            st = tpi_err(err, TPI_ERR_INVALID, "rank %d's %s does not match rank 0's%s: every rank "
                         "must be given the same options and inputs", first,
                         vals[i].what, others);
        else
            st = tpi_err(err, TPI_ERR_INVALID, "rank %d's %s is %" PRId64 ", rank 0's is %" PRId64
                         "%s: every rank must be given the same options and inputs", first, vals[i].what, (int64_t)all[(size_t)first * n + i], (int64_t)ref,
                         others);
    }
    free(mine);
    free(all);
    if (st != TPI_OK && st != TPI_ERR_INVALID) return grid_agree(g, st, err);
    return st;
}
