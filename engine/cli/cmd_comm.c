/*
 * cmd_comm.c — `tpinfer comm`: is the communicator wired right, and how fast is it?
 *
 * 1. Sanity check: an all-reduce of ones must give the world size on every
 *    rank; rank 0 prints "rank R host H: PASS|FAIL" for each rank.
 * 2. Sweep (unless --check-only), in the manner of nccl-tests: all-reduce,
 *    all-gather and a send/recv ring over sizes -b..-e by factor -f, with time,
 *    algbw = size / time and busbw = algbw * factor (all-reduce 2(n-1)/n,
 *    all-gather (n-1)/n, send/recv 1), so busbw compares with link bandwidth
 *    whatever the rank count. #wrong is a separate verification call per size
 *    with known data (the timed loop uses zeros so repeated sums stay finite).
 * Sizes follow nccl-tests: all-reduce and send/recv move `size` bytes per rank;
 * all-gather's size is the gathered output (each rank contributes size / n).
 *
 * stdout: the results (sanity lines and the table, or one JSON document with
 * --json), world rank 0 only. Banners and errors go to stderr.
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kernels/ops.h"
#include "parallel/comm.h"
#include "parallel/grid.h"
#include "tpi.h"

struct comm_opts {
    int kind;            /* enum comm_kind */
    const char *backend; /* NULL: cpu for mpi, cuda for nccl */
    size_t min_bytes, max_bytes;
    int factor, iters, warmup;
    double timeout_s;
    int check_only, json;
    enum comm_dtype dt;
};

static void usage(FILE *out) {
    fprintf(out, "usage: tpinfer comm [options]      (run under mpirun -np N)\n"
                 "  --comm mpi|nccl      communicator (default mpi)\n"
                 "  --backend cpu|cuda   buffer memory (default cpu for mpi, cuda for nccl)\n"
                 "  -b, --minbytes N     smallest size (default 8; K, M, G suffixes)\n"
                 "  -e, --maxbytes N     largest size (default 256M)\n"
                 "  -f, --stepfactor N   size multiplier (default 2)\n"
                 "  -n, --iters N        timed iterations per size (default 20)\n"
                 "  -w, --warmup N       untimed iterations per size (default 5)\n"
                 "  -d, --datatype T     float|half|bfloat16|int32 (default float)\n"
                 "  --timeout S          seconds to wait for all ranks at start-up (default 60;\n"
                 "                       0: no limit; --comm-timeout S is the same)\n"
                 "  --check-only         only the all-reduce sanity check\n"
                 "  --json               one JSON document on stdout\n");
}

/* "256M" -> 268435456; 0 on a malformed value. */
static size_t parse_size(const char *s) {
    char *end = NULL;
    double v = strtod(s, &end);
    if (end == s || v < 0) return 0;
    double mul = 1;
    switch (toupper((unsigned char)*end)) {
    case 'K':
        mul = 1024.0;
        end++;
        break;
    case 'M':
        mul = 1024.0 * 1024;
        end++;
        break;
    case 'G':
        mul = 1024.0 * 1024 * 1024;
        end++;
        break;
    default:
        break;
    }
    if (*end == 'B' || *end == 'b') end++;
    if (*end) return 0;
    return (size_t)(v * mul);
}

static const char *dtype_name(enum comm_dtype dt) {
    static const char *names[] = {"float", "half", "bfloat16", "int32", "uint8"};
    return dt < COMM_DTYPE_COUNT ? names[dt] : "?";
}

static int parse_args(int argc, char **argv, struct comm_opts *o) {
    *o = (struct comm_opts){.kind = COMM_MPI,
                            .min_bytes = 8,
                            .max_bytes = 256u << 20,
                            .factor = 2,
                            .iters = 20,
                            .warmup = 5,
                            .timeout_s = 60.0,
                            .dt = COMM_F32};
    enum { O_COMM = 256, O_BACKEND, O_TIMEOUT, O_CHECK, O_JSON };
    static const struct option longs[] = {{"comm", required_argument, 0, O_COMM},
                                          {"backend", required_argument, 0, O_BACKEND},
                                          {"minbytes", required_argument, 0, 'b'},
                                          {"maxbytes", required_argument, 0, 'e'},
                                          {"stepfactor", required_argument, 0, 'f'},
                                          {"iters", required_argument, 0, 'n'},
                                          {"warmup", required_argument, 0, 'w'},
                                          {"datatype", required_argument, 0, 'd'},
                                          {"timeout", required_argument, 0, O_TIMEOUT},
                                          {"comm-timeout", required_argument, 0, O_TIMEOUT},
                                          {"check-only", no_argument, 0, O_CHECK},
                                          {"json", no_argument, 0, O_JSON},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    optind = 1;
    int ch;
    while ((ch = getopt_long(argc, argv, "b:e:f:n:w:d:h", longs, NULL)) != -1) {
        switch (ch) {
        case O_COMM:
            o->kind = comm_kind_from_name(optarg);
            if (o->kind < 0) {
                fprintf(stderr, "tpinfer comm: --comm '%s': expected mpi or nccl\n", optarg);
                return 2;
            }
            break;
        case O_BACKEND:
            o->backend = optarg;
            break;
        case 'b':
            o->min_bytes = parse_size(optarg);
            break;
        case 'e':
            o->max_bytes = parse_size(optarg);
            break;
        case 'f':
            o->factor = atoi(optarg);
            break;
        case 'n':
            o->iters = atoi(optarg);
            break;
        case 'w':
            o->warmup = atoi(optarg);
            break;
        case 'd':
            if (!strcmp(optarg, "float") || !strcmp(optarg, "f32"))
                o->dt = COMM_F32;
            else if (!strcmp(optarg, "half") || !strcmp(optarg, "f16"))
                o->dt = COMM_F16;
            else if (!strcmp(optarg, "bfloat16") || !strcmp(optarg, "bf16"))
                o->dt = COMM_BF16;
            else if (!strcmp(optarg, "int32") || !strcmp(optarg, "i32"))
                o->dt = COMM_I32;
            else {
                fprintf(stderr, "tpinfer comm: -d '%s': expected float, half, bfloat16 or int32\n",
                        optarg);
                return 2;
            }
            break;
        case O_TIMEOUT: {
            // Seconds >= 0 (0: no limit at start-up).
            char *end = NULL;
            errno = 0;
            const double t = strtod(optarg, &end);
            if (errno || end == optarg || *end || !(t >= 0) || !isfinite(t)) {
                fprintf(stderr, "tpinfer comm: --timeout expects seconds >= 0, got '%s'\n",
                        optarg);
                return 2;
            }
            o->timeout_s = t;
            break;
        }
        case O_CHECK:
            o->check_only = 1;
            break;
        case O_JSON:
            o->json = 1;
            break;
        case 'h':
            usage(stdout);
            return -1;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "tpinfer comm: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (o->min_bytes == 0 || o->max_bytes < o->min_bytes || o->factor < 2 || o->iters < 1 ||
        o->warmup < 0) {
        fprintf(stderr, "tpinfer comm: need 0 < -b <= -e, -f >= 2, -n >= 1, -w >= 0\n");
        return 2;
    }
    if (!o->backend) o->backend = o->kind == COMM_NCCL ? "cuda" : "cpu";
    return 0;
}

/* ---- test data ------------------------------------------------------------ */

/* Values small integers so every dtype holds them and their sums exactly. */
static double reduce_val(int rank, size_t i) {
    return 1.0 + (double)((rank + i) % 4);
}
static double gather_val(int rank, size_t i) {
    return (double)((rank * 7 + i) % 61) - 30.0;
}


/* Everything one rank needs to run a measurement. */
struct bench {
    struct tpi_grid *g;
    struct comm *c;
    const struct ops *ops;
    struct ops_ctx *octx;
    const struct comm_opts *o;
    void *d_a, *d_b; /* backend buffers of max_bytes (+ slack) */
    void *h;         /* host scratch of max_bytes */
    size_t cap;      /* bytes of each buffer */
};

static void upload(struct bench *b, void *dst, size_t n_bytes) {
    b->ops->to_dev(b->octx, dst, b->h, n_bytes);
    b->ops->sync(b->octx);
}

/* One result row. */
struct row {
    const char *op;
    size_t size, count;
    double time_us, algbw, busbw;
    long long wrong;
};

enum sweep_op { SW_ALLREDUCE, SW_ALLGATHER, SW_SENDRECV };

/* One iteration of op at `count` items per rank (data in b->d_a / d_b). */
static int run_once(struct bench *b, enum sweep_op op, size_t count, struct tpi_error *err) {
    struct comm *c = b->c;
    enum comm_dtype dt = b->o->dt;
    if (op == SW_ALLREDUCE) return comm_allreduce_sum(c, b->d_a, count, dt, err);
    if (op == SW_ALLGATHER) return comm_allgather(c, b->d_a, b->d_b, count, dt, err);
    /* Ring: send to r+1, receive from r-1. Even ranks send first and odd ranks
     * receive first, so blocking (rendezvous) sends cannot all wait at once. */
    int n = c->size, r = c->rank, next = (r + 1) % n, prev = (r + n - 1) % n, st;
    if (r % 2 == 0) {
        st = comm_send(c, b->d_a, count, dt, next, err);
        if (!st) st = comm_recv(c, b->d_b, count, dt, prev, err);
    } else {
        st = comm_recv(c, b->d_b, count, dt, prev, err);
        if (!st) st = comm_send(c, b->d_a, count, dt, next, err);
    }
    return st;
}

/* Fill known data, run op once, count elements that differ from the expected. */
static int verify(struct bench *b, enum sweep_op op, size_t count, long long *wrong,
                  struct tpi_error *err) {
    enum comm_dtype dt = b->o->dt;
    size_t isz = comm_dtype_size(dt);
    int n = b->c->size, r = b->c->rank;
    for (size_t i = 0; i < count; i++)
        comm_item_set(b->h, dt, i, op == SW_ALLREDUCE ? reduce_val(r, i) : gather_val(r, i));
    upload(b, b->d_a, count * isz);
    int st = run_once(b, op, count, err);
    if (st) return st;
    long long bad = 0;
    if (op == SW_ALLREDUCE) {
        b->ops->to_host(b->octx, b->h, b->d_a, count * isz);
        for (size_t i = 0; i < count; i++) {
            double want = 0;
            for (int k = 0; k < n; k++)
                want += reduce_val(k, i);
            bad += comm_item_get(b->h, dt, i) != want;
        }
    } else if (op == SW_ALLGATHER) {
        b->ops->to_host(b->octx, b->h, b->d_b, (size_t)n * count * isz);
        for (int k = 0; k < n; k++)
            for (size_t i = 0; i < count; i++)
                bad += comm_item_get(b->h, dt, (size_t)k * count + i) != gather_val(k, i);
    } else {
        b->ops->to_host(b->octx, b->h, b->d_b, count * isz);
        int prev = (r + n - 1) % n;
        for (size_t i = 0; i < count; i++)
            bad += comm_item_get(b->h, dt, i) != gather_val(prev, i);
    }
    *wrong = bad;
    return TPI_OK;
}

/* Time and verify op at `size` bytes; results valid on world rank 0. */
static int measure(struct bench *b, enum sweep_op op, size_t size, struct row *out,
                   struct tpi_error *err) {
    size_t isz = comm_dtype_size(b->o->dt);
    int n = b->c->size;
    size_t count = size / isz; /* per rank */
    if (op == SW_ALLGATHER) count = size / isz / (size_t)n;
    if (count == 0) count = 1;
    size_t total = op == SW_ALLGATHER ? count * (size_t)n : count;
    /* Zeros for the timed loop: the in-place sum repeated would overflow. */
    memset(b->h, 0, total * isz);
    upload(b, b->d_a, count * isz);
    int st = TPI_OK;
    for (int i = 0; i < b->o->warmup && !st; i++)
        st = run_once(b, op, count, err);
    if (!st) st = comm_barrier(b->c, err);
    double t0 = tpi_time_s();
    for (int i = 0; i < b->o->iters && !st; i++)
        st = run_once(b, op, count, err);
    b->ops->sync(b->octx);
    double t = (tpi_time_s() - t0) / b->o->iters;
    if (st) return st;
    long long wrong = 0;
    st = verify(b, op, count, &wrong, err);
    if (st) return st;
    /* The slowest rank sets the time, as nccl-tests reports it. */
    double t_max = 0;
    long long wrong_sum = 0;
    MPI_Request req[2];
    MPI_Ireduce(&t, &t_max, 1, MPI_DOUBLE, MPI_MAX, 0, b->g->world, &req[0]);
    grid_wait_or_abort(b->g, &req[0], "comm", "the reduction of the ranks' times");
    MPI_Ireduce(&wrong, &wrong_sum, 1, MPI_LONG_LONG, MPI_SUM, 0, b->g->world, &req[1]);
    grid_wait_or_abort(b->g, &req[1], "comm", "the reduction of the wrong elements");
    static const char *names[] = {"allreduce", "allgather", "sendrecv"};
    out->op = names[op];
    out->size = total * isz;
    out->count = total;
    out->time_us = t_max * 1e6;
    out->algbw = t_max > 0 ? (double)out->size / t_max / 1e9 : 0;
    double factor = op == SW_ALLREDUCE   ? 2.0 * (n - 1) / n
                    : op == SW_ALLGATHER ? (double)(n - 1) / n
                                         : 1.0;
    out->busbw = out->algbw * factor;
    out->wrong = wrong_sum;
    return TPI_OK;
}

/* Sanity check: the all-reduce of ones equals the world size here? */
static int sanity(struct bench *b, int *pass, struct tpi_error *err) {
    size_t count = 1024, isz = comm_dtype_size(COMM_F32);
    float *h = b->h;
    for (size_t i = 0; i < count; i++)
        h[i] = 1.0f;
    upload(b, b->d_a, count * isz);
    int st = comm_allreduce_sum(b->c, b->d_a, count, COMM_F32, err);
    if (st) return st;
    b->ops->to_host(b->octx, h, b->d_a, count * isz);
    *pass = 1;
    for (size_t i = 0; i < count; i++)
        if (h[i] != (float)b->c->size) *pass = 0;
    return TPI_OK;
}

/* Print an error on this rank and take the whole job down: used when ranks
 * may be stuck in a collective this rank will never join. */
static int die_all(const struct tpi_error *e) {
    TPI_LOGE("tpinfer comm: %s", e->msg);
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
}

int cmd_comm(int argc, char **argv) {
    struct comm_opts o;
    int prc = parse_args(argc, argv, &o);
    if (prc < 0) return 0;
    if (prc) return prc;

    struct tpi_error err;
    tpi_err_clear(&err);
    grid_set_wait(o.timeout_s);
    if (grid_mpi_init(&argc, &argv, &err)) {
        fprintf(stderr, "tpinfer comm: %s\n", err.msg);
        return 1;
    }
    int world_size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    struct tpi_grid g;
    int st = grid_init(&g, world_size, 1, &err);
    if (st) {
        fprintf(stderr, "tpinfer comm: %s\n", err.msg);
        grid_mpi_finalize();
        return 1;
    }
    int root = g.world_rank == 0;
    tpi_log_set(TPI_LOG_INFO, world_size > 1 ? g.world_rank : -1);

    /* Every rank runs rank 0's sweep: other sizes or counts on one rank would pair
     * collectives of different lengths (MPI_ERR_TRUNCATE) or wait for ever. */
    const char *be = o.backend ? o.backend : "";
    const struct grid_same same[] = {
        {"--comm", (uint64_t)o.kind, 0},
        {"--backend", tpi_fnv1a(TPI_FNV_INIT, be, strlen(be)), 1},
        {"--minbytes", (uint64_t)o.min_bytes, 0},
        {"--maxbytes", (uint64_t)o.max_bytes, 0},
        {"--stepfactor", (uint64_t)o.factor, 0},
        {"--iters", (uint64_t)o.iters, 0},
        {"--warmup", (uint64_t)o.warmup, 0},
        {"--datatype", (uint64_t)o.dt, 0},
        {"--check-only", (uint64_t)o.check_only, 0},
    };
    st = grid_check_same(&g, same, (int)(sizeof same / sizeof same[0]), &err);
    if (st == TPI_ERR_TIMEOUT) return die_all(&err);
    if (st) {
        if (root || st != TPI_ERR_INVALID) fprintf(stderr, "tpinfer comm: %s\n", err.msg);
        grid_free(&g);
        grid_mpi_finalize();
        return 1;
    }

    /* Backend and its context: a local step, then agreed so all stop together. */
    struct ops_ctx *octx = NULL;
    const struct ops *ops = ops_by_name(o.backend, &err);
    if (!ops) {
        st = err.status ? err.status : TPI_ERR_INVALID;
        if (o.kind == COMM_NCCL) tpi_err_wrap(&err, "--comm nccl needs --backend cuda");
    } else {
        /* GPU = local rank. More ranks than GPUs share them round-robin: fine for
         * --comm mpi (with a warning), refused with a clear message by NCCL. */
        struct ops_config cfg = {.n_threads = 1, .device = g.local_rank};
        int n_dev = 0;
        if (!strcmp(ops->name, "cuda") && ops_cuda_available(&n_dev) && n_dev > 0) {
            cfg.device = g.local_rank % n_dev;
            if (g.local_size > n_dev && g.local_rank == 0 && o.kind == COMM_MPI)
                TPI_LOGW("%d ranks on host %s share %d GPU%s", g.local_size, g.host, n_dev,
                         n_dev == 1 ? "" : "s");
        }
        st = ops->init(&octx, &cfg, &err);
    }
    if (!st && o.kind == COMM_NCCL && strcmp(ops->name, "cuda") != 0)
        st = tpi_err(&err, TPI_ERR_INVALID,
                     "--comm nccl needs --backend cuda (device buffers); "
                     "use --comm mpi for the cpu backend");
    st = grid_agree(&g, st, &err);
    struct comm *c = NULL;
    if (!st) {
        if (root)
            TPI_LOGI("# tpinfer comm: %s over %s memory (%s), %d rank%s, %s, timeout %.0f s",
                     comm_kind_name(o.kind), ops->name, ops->device_name(octx), world_size,
                     world_size == 1 ? "" : "s", dtype_name(o.dt), o.timeout_s);
        st = comm_create(&c, o.kind, g.world, ops, octx, o.timeout_s, &err);
        /* A timed-out rank cannot agree with a rank that never came: stop the job. */
        if (st == TPI_ERR_TIMEOUT) return die_all(&err);
    }
    if (st) {
        if (root) fprintf(stderr, "tpinfer comm: %s\n", err.msg);
        if (octx) ops->free(&octx);
        grid_free(&g);
        grid_mpi_finalize();
        return 1;
    }

    struct bench b = {.g = &g, .c = c, .ops = ops, .octx = octx, .o = &o};
    /* Slack: all-gather rounds a tiny per-rank count up to one item per rank. */
    b.cap = (o.check_only ? 4096 : o.max_bytes) + (size_t)world_size * 16 + 4096;
    b.d_a = ops->alloc(octx, b.cap);
    b.d_b = ops->alloc(octx, b.cap);
    b.h = malloc(b.cap);
    st = (b.d_a && b.d_b && b.h) ? TPI_OK
                                 : tpi_err(&err, TPI_ERR_NOMEM,
                                           "cannot allocate 3 buffers of %zu "
                                           "bytes on world rank %d",
                                           b.cap, g.world_rank);
    st = grid_agree(&g, st, &err);

    cJSON *doc = NULL, *jrows = NULL;
    if (root && o.json) {
        doc = cJSON_CreateObject();
        cJSON_AddStringToObject(doc, "comm", comm_kind_name(o.kind));
        cJSON_AddStringToObject(doc, "backend", ops->name);
        cJSON_AddNumberToObject(doc, "world_size", world_size);
        cJSON_AddStringToObject(doc, "type", dtype_name(o.dt));
    }
    int all_pass = 1;
    long long wrong_total = 0;

    /* 1. sanity check */
    int pass = 0;
    if (!st) st = sanity(&b, &pass, &err);
    if (st) return die_all(&err);
    struct card {
        int pass;
        char host[256];
    } mine = {.pass = pass}, *cards = root ? calloc((size_t)world_size, sizeof *cards) : NULL;
    snprintf(mine.host, sizeof mine.host, "%s", g.host);
    MPI_Request greq;
    MPI_Igather(&mine, (int)sizeof mine, MPI_BYTE, cards, (int)sizeof mine, MPI_BYTE, 0, g.world,
                &greq);
    grid_wait_or_abort(&g, &greq, "comm", "the gather of the ranks' sanity results");
    if (root) {
        cJSON *js = o.json ? cJSON_AddArrayToObject(doc, "sanity") : NULL;
        for (int r = 0; r < world_size; r++) {
            all_pass &= cards[r].pass;
            if (js) {
                cJSON *e = cJSON_CreateObject();
                cJSON_AddNumberToObject(e, "rank", r);
                cJSON_AddStringToObject(e, "host", cards[r].host);
                cJSON_AddBoolToObject(e, "pass", cards[r].pass);
                cJSON_AddItemToArray(js, e);
            } else {
                printf("rank %d host %s: %s\n", r, cards[r].host, cards[r].pass ? "PASS" : "FAIL");
            }
        }
        if (world_size == 1)
            TPI_LOGW("world size is 1: that tests nothing; launch under mpirun -np N "
                     "(e.g. mpirun -np 2 tpinfer comm)");
        if (!all_pass)
            TPI_LOGE("sanity check FAILED: the all-reduce of ones is not %d everywhere",
                     world_size);
        free(cards);
    }

    /* 2. the sweep */
    if (!o.check_only) {
        if (root && o.json) jrows = cJSON_AddArrayToObject(doc, "results");
        if (root && !o.json)
            printf("#%11s %12s %12s %8s %11s %12s %12s %8s\n", "op", "size(B)", "count", "type",
                   "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
        for (int op = SW_ALLREDUCE; op <= SW_SENDRECV; op++) {
            if (op == SW_SENDRECV && world_size == 1) {
                if (root) TPI_LOGW("sendrecv needs 2 or more ranks: skipped");
                continue;
            }
            for (size_t size = o.min_bytes; size <= o.max_bytes; size *= (size_t)o.factor) {
                struct row row;
                st = measure(&b, (enum sweep_op)op, size, &row, &err);
                if (st) return die_all(&err);
                if (!root) continue;
                wrong_total += row.wrong;
                if (o.json) {
                    cJSON *e = cJSON_CreateObject();
                    cJSON_AddStringToObject(e, "op", row.op);
                    cJSON_AddNumberToObject(e, "size", (double)row.size);
                    cJSON_AddNumberToObject(e, "count", (double)row.count);
                    cJSON_AddStringToObject(e, "type", dtype_name(o.dt));
                    cJSON_AddNumberToObject(e, "time_us", row.time_us);
                    cJSON_AddNumberToObject(e, "algbw_gbs", row.algbw);
                    cJSON_AddNumberToObject(e, "busbw_gbs", row.busbw);
                    cJSON_AddNumberToObject(e, "wrong", (double)row.wrong);
                    cJSON_AddItemToArray(jrows, e);
                } else {
                    printf(" %11s %12zu %12zu %8s %11.2f %12.3f %12.3f %8lld\n", row.op, row.size,
                           row.count, dtype_name(o.dt), row.time_us, row.algbw, row.busbw,
                           row.wrong);
                    fflush(stdout);
                }
            }
        }
    }

    int ok = all_pass && wrong_total == 0;
    if (root) {
        if (o.json) {
            cJSON_AddBoolToObject(doc, "ok", ok);
            cJSON *js = cJSON_AddObjectToObject(doc, "stats_rank0");
            for (int k = 0; k < COMM_OP_COUNT; k++) {
                cJSON *e = cJSON_AddObjectToObject(js, comm_op_name((enum comm_op)k));
                cJSON_AddNumberToObject(e, "calls", (double)c->stats.calls[k]);
                cJSON_AddNumberToObject(e, "bytes", (double)c->stats.bytes[k]);
            }
            char *text = cJSON_Print(doc);
            if (text) printf("%s\n", text);
            free(text);
            cJSON_Delete(doc);
        } else {
            TPI_LOGI("# %s: sanity %s, %lld wrong elements", ok ? "OK" : "FAILED",
                     all_pass ? "PASS" : "FAIL", wrong_total);
        }
    }
    /* Everyone returns the same code. */
    MPI_Request oreq;
    MPI_Ibcast(&ok, 1, MPI_INT, 0, g.world, &oreq);
    grid_wait_or_abort(&g, &oreq, "comm", "the broadcast of the verdict");
    free(b.h);
    ops->dealloc(octx, b.d_a);
    ops->dealloc(octx, b.d_b);
    comm_free(&c);
    ops->free(&octx);
    grid_free(&g);
    grid_mpi_finalize();
    return ok ? 0 : 1;
}
