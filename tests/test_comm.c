/*
 * test_comm.c — the MPI communicator under mpirun (NP 2 and 4): all-reduce sums
 * for every dtype and awkward sizes, all-gather order, send/recv ring, bcast
 * from every root, barrier, exact call/byte counters, the device staging path
 * (through a host-memory stand-in named "cuda"), NCCL refusing cleanly here,
 * and comm_create timing out on a rank that never shows up.
 *
 * Every test is collective: all ranks run the same tests in the same order
 * (Check runs them in this process, CK_FORK=no, since MPI does not survive fork).
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/ops.h"
#include "parallel/comm.h"
#include "parallel/grid.h"
#include "testutil.h"
#include "tpi.h"

static int g_rank, g_size;
static struct ops_ctx *g_cpu;

/* ---- a host-memory backend that calls itself "cuda" ----------------------- */
/* comm_mpi stages "cuda" buffers through host memory with to_host / to_dev /
 * sync; this stand-in lets that path run here, where no GPU is. */
static int fake_calls;
static void fake_to_dev(struct ops_ctx *c, void *d, const void *s, size_t n) {
    (void)c;
    fake_calls++;
    memcpy(d, s, n);
}
static void fake_to_host(struct ops_ctx *c, void *d, const void *s, size_t n) {
    (void)c;
    fake_calls++;
    memcpy(d, s, n);
}
static void fake_sync(struct ops_ctx *c) {
    (void)c;
}
static void *fake_stream(struct ops_ctx *c) {
    (void)c;
    return NULL;
}
static const struct ops fake_cuda = {.name = "cuda",
                                     .to_dev = fake_to_dev,
                                     .to_host = fake_to_host,
                                     .sync = fake_sync,
                                     .stream = fake_stream};
static int fake_ctx_storage;
#define FAKE_CTX ((struct ops_ctx *)&fake_ctx_storage)

static struct comm *make_comm(const struct ops *ops, struct ops_ctx *octx) {
    struct comm *c = NULL;
    struct tpi_error err;
    tpi_err_clear(&err);
    int st = comm_create(&c, COMM_MPI, MPI_COMM_WORLD, ops, octx, 30.0, &err);
    ck_assert_msg(st == TPI_OK, "comm_create: %s", err.msg);
    ck_assert_int_eq(c->rank, g_rank);
    ck_assert_int_eq(c->size, g_size);
    return c;
}

/* Small integers: exact in every dtype, and so are their sums at NP <= 4. */
static double val(int rank, size_t i) {
    return (double)((rank + 1) * (int)(i % 5 + 1)) - 3.0;
}


static const size_t sizes[] = {0, 1, 2, 7, 33, 1000, 4097};
#define N_SIZES (sizeof sizes / sizeof sizes[0])

/* All-reduce every dtype at every size; returns the mismatches seen here. */
static void check_allreduce(struct comm *c) {
    const enum comm_dtype dts[] = {COMM_F32, COMM_BF16, COMM_F16, COMM_I32};
    for (size_t d = 0; d < 4; d++) {
        enum comm_dtype dt = dts[d];
        for (size_t s = 0; s < N_SIZES; s++) {
            size_t n = sizes[s];
            void *buf = calloc(n + 1, 4);
            for (size_t i = 0; i < n; i++)
                comm_item_set(buf, dt, i, val(g_rank, i));
            struct tpi_error err;
            tpi_err_clear(&err);
            int st = comm_allreduce_sum(c, buf, n, dt, &err);
            ck_assert_msg(st == TPI_OK, "allreduce: %s", err.msg);
            size_t bad = 0;
            for (size_t i = 0; i < n; i++) {
                double want = 0;
                for (int r = 0; r < g_size; r++)
                    want += val(r, i);
                double got = comm_item_get(buf, dt, i);
                if (got != want && bad++ < 8)
                    fprintf(stderr, "rank %d allreduce dtype %d n %zu: [%zu] got %g want %g\n",
                            g_rank, (int)dt, n, i, got, want);
            }
            free(buf);
            ck_assert_msg(bad == 0, "allreduce dtype %d n %zu: %zu wrong", (int)dt, n, bad);
        }
    }
}

START_TEST(test_allreduce) {
    struct comm *c = make_comm(&ops_cpu, g_cpu);
    check_allreduce(c);
    comm_free(&c);
    ck_assert_ptr_null(c);
}
END_TEST

/* The same through the staging path for device memory. */
START_TEST(test_allreduce_staged) {
    fake_calls = 0;
    struct comm *c = make_comm(&fake_cuda, FAKE_CTX);
    check_allreduce(c);
    ck_assert_int_gt(fake_calls, 0); /* it really went through to_host / to_dev */
    float send[3], recv[3 * 4];
    for (int i = 0; i < 3; i++)
        send[i] = (float)(10 * g_rank + i);
    struct tpi_error err;
    ck_assert_int_eq(comm_allgather(c, send, recv, 3, COMM_F32, &err), TPI_OK);
    for (int r = 0; r < g_size; r++)
        for (int i = 0; i < 3; i++)
            ck_assert_float_eq(recv[r * 3 + i], (float)(10 * r + i));
    float b[5] = {0};
    if (g_rank == 1)
        for (int i = 0; i < 5; i++)
            b[i] = (float)(i + 100);
    ck_assert_int_eq(comm_bcast(c, b, 5, COMM_F32, 1, &err), TPI_OK);
    for (int i = 0; i < 5; i++)
        ck_assert_float_eq(b[i], (float)(i + 100));
    comm_free(&c);
}
END_TEST

START_TEST(test_allgather) {
    struct comm *c = make_comm(&ops_cpu, g_cpu);
    for (size_t s = 0; s < N_SIZES; s++) {
        size_t n = sizes[s];
        int32_t *send = calloc(n + 1, sizeof *send);
        int32_t *recv = calloc((size_t)g_size * n + 1, sizeof *recv);
        for (size_t i = 0; i < n; i++)
            send[i] = g_rank * 100000 + (int32_t)i;
        struct tpi_error err;
        int st = comm_allgather(c, send, recv, n, COMM_I32, &err);
        ck_assert_msg(st == TPI_OK, "allgather: %s", err.msg);
        /* rank-major: rank r's items at [r*n, (r+1)*n) */
        for (int r = 0; r < g_size; r++)
            for (size_t i = 0; i < n; i++)
                ck_assert_msg(recv[(size_t)r * n + i] == r * 100000 + (int32_t)i,
                              "allgather n %zu: [%d][%zu] got %d want %d", n, r, i,
                              recv[(size_t)r * n + i], r * 100000 + (int)i);
        free(send);
        free(recv);
    }
    /* bf16 too: the items are moved, not summed */
    uint16_t hs[3], hr[3 * 4];
    for (int i = 0; i < 3; i++)
        hs[i] = tpi_f32_to_bf16((float)(g_rank + i));
    struct tpi_error err;
    ck_assert_int_eq(comm_allgather(c, hs, hr, 3, COMM_BF16, &err), TPI_OK);
    for (int r = 0; r < g_size; r++)
        for (int i = 0; i < 3; i++)
            ck_assert_float_eq(tpi_bf16_to_f32(hr[r * 3 + i]), r + i);
    comm_free(&c);
}
END_TEST

START_TEST(test_sendrecv_ring) {
    struct comm *c = make_comm(&ops_cpu, g_cpu);
    int next = (g_rank + 1) % g_size, prev = (g_rank + g_size - 1) % g_size;
    /* Large enough that MPI switches to rendezvous: the even/odd order matters. */
    size_t n = 1 << 18;
    float *out = malloc(n * sizeof *out), *in = malloc(n * sizeof *in);
    for (size_t i = 0; i < n; i++)
        out[i] = (float)(g_rank * 1000 + (int)(i % 997));
    struct tpi_error err;
    int st;
    if (g_rank % 2 == 0) {
        st = comm_send(c, out, n, COMM_F32, next, &err);
        if (!st) st = comm_recv(c, in, n, COMM_F32, prev, &err);
    } else {
        st = comm_recv(c, in, n, COMM_F32, prev, &err);
        if (!st) st = comm_send(c, out, n, COMM_F32, next, &err);
    }
    ck_assert_msg(st == TPI_OK, "sendrecv: %s", err.msg);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        if (in[i] != (float)(prev * 1000 + (int)(i % 997)) && bad++ < 8)
            fprintf(stderr, "rank %d recv [%zu] got %g want %d\n", g_rank, i, in[i],
                    prev * 1000 + (int)(i % 997));
    ck_assert_uint_eq(bad, 0);
    /* bad peers are refused before any MPI call */
    ck_assert_int_eq(comm_send(c, out, 1, COMM_F32, g_size, &err), TPI_ERR_INVALID);
    ck_assert_int_eq(comm_recv(c, in, 1, COMM_F32, g_rank, &err), TPI_ERR_INVALID);
    free(out);
    free(in);
    comm_free(&c);
}
END_TEST

START_TEST(test_bcast_each_root) {
    struct comm *c = make_comm(&ops_cpu, g_cpu);
    for (int root = 0; root < g_size; root++) {
        int32_t buf[17];
        for (int i = 0; i < 17; i++)
            buf[i] = g_rank == root ? root * 50 + i : -1;
        struct tpi_error err;
        ck_assert_int_eq(comm_bcast(c, buf, 17, COMM_I32, root, &err), TPI_OK);
        for (int i = 0; i < 17; i++)
            ck_assert_int_eq(buf[i], root * 50 + i);
    }
    struct tpi_error err;
    int32_t x = 0;
    ck_assert_int_eq(comm_bcast(c, &x, 1, COMM_I32, g_size, &err), TPI_ERR_INVALID);
    comm_free(&c);
}
END_TEST

START_TEST(test_barrier) {
    struct comm *c = make_comm(&ops_cpu, g_cpu);
    struct tpi_error err;
    /* Rank 0 arrives late; nobody may leave the barrier before it enters. */
    double t0 = MPI_Wtime();
    if (g_rank == 0) usleep(200000);
    ck_assert_int_eq(comm_barrier(c, &err), TPI_OK);
    double dt = MPI_Wtime() - t0;
    ck_assert_msg(dt > 0.15, "rank %d left the barrier after %.3f s, before rank 0 came", g_rank,
                  dt);
    comm_free(&c);
}
END_TEST

START_TEST(test_stats) {
    struct comm *c = make_comm(&ops_cpu, g_cpu);
    for (int k = 0; k < COMM_OP_COUNT; k++) {
        ck_assert_uint_eq(c->stats.calls[k], 0);
        ck_assert_uint_eq(c->stats.bytes[k], 0);
    }
    struct tpi_error err;
    float f[100] = {0}, g[100 * 4];
    uint16_t h[50] = {0};
    ck_assert_int_eq(comm_allreduce_sum(c, f, 100, COMM_F32, &err), TPI_OK);
    ck_assert_int_eq(comm_allreduce_sum(c, h, 50, COMM_BF16, &err), TPI_OK);
    ck_assert_int_eq(comm_allreduce_sum(c, f, 0, COMM_F32, &err), TPI_OK);
    ck_assert_int_eq(comm_allgather(c, f, g, 25, COMM_F32, &err), TPI_OK);
    ck_assert_int_eq(comm_bcast(c, f, 10, COMM_I32, 0, &err), TPI_OK);
    ck_assert_int_eq(comm_barrier(c, &err), TPI_OK);
    ck_assert_int_eq(comm_barrier(c, &err), TPI_OK);
    if (g_rank == 0) ck_assert_int_eq(comm_send(c, f, 7, COMM_F32, 1, &err), TPI_OK);
    if (g_rank == 1) ck_assert_int_eq(comm_recv(c, f, 7, COMM_F32, 0, &err), TPI_OK);
    ck_assert_uint_eq(c->stats.calls[COMM_OP_ALLREDUCE], 3);
    ck_assert_uint_eq(c->stats.bytes[COMM_OP_ALLREDUCE], 400 + 100);
    ck_assert_uint_eq(c->stats.calls[COMM_OP_ALLGATHER], 1);
    ck_assert_uint_eq(c->stats.bytes[COMM_OP_ALLGATHER], 100); /* this rank's part */
    ck_assert_uint_eq(c->stats.calls[COMM_OP_BCAST], 1);
    ck_assert_uint_eq(c->stats.bytes[COMM_OP_BCAST], 40);
    ck_assert_uint_eq(c->stats.calls[COMM_OP_BARRIER], 2);
    ck_assert_uint_eq(c->stats.bytes[COMM_OP_BARRIER], 0);
    ck_assert_uint_eq(c->stats.calls[COMM_OP_SEND], g_rank == 0 ? 1 : 0);
    ck_assert_uint_eq(c->stats.bytes[COMM_OP_SEND], g_rank == 0 ? 28 : 0);
    ck_assert_uint_eq(c->stats.calls[COMM_OP_RECV], g_rank == 1 ? 1 : 0);
    ck_assert_uint_eq(c->stats.bytes[COMM_OP_RECV], g_rank == 1 ? 28 : 0);
    comm_free(&c);
}
END_TEST

START_TEST(test_names) {
    ck_assert_uint_eq(comm_dtype_size(COMM_F32), 4);
    ck_assert_uint_eq(comm_dtype_size(COMM_BF16), 2);
    ck_assert_uint_eq(comm_dtype_size(COMM_U8), 1);
    ck_assert_int_eq(comm_kind_from_name("nccl"), COMM_NCCL);
    ck_assert_int_eq(comm_kind_from_name("mpi"), COMM_MPI);
    ck_assert_int_eq(comm_kind_from_name("gloo"), -1);
    ck_assert_str_eq(comm_kind_name(COMM_NCCL), "nccl");
    ck_assert_str_eq(comm_op_name(COMM_OP_ALLGATHER), "allgather");
}
END_TEST

/* NCCL cannot run here: it must say so at once, on every rank. */
START_TEST(test_nccl_refused) {
    const struct ops *backends[] = {&ops_cpu, &fake_cuda};
    struct ops_ctx *ctxs[] = {g_cpu, FAKE_CTX};
    for (int k = 0; k < 2; k++) {
        struct comm *c = NULL;
        struct tpi_error err;
        tpi_err_clear(&err);
        double t0 = MPI_Wtime();
        int st = comm_create(&c, COMM_NCCL, MPI_COMM_WORLD, backends[k], ctxs[k], 10.0, &err);
        double dt = MPI_Wtime() - t0;
        if (g_rank == 0)
            fprintf(stderr, "nccl with %s memory: %s (%.2f s)\n", backends[k]->name, err.msg, dt);
        ck_assert_int_ne(st, TPI_OK);
        ck_assert_ptr_null(c);
        ck_assert_msg(dt < 8.0, "NCCL refusal took %.1f s", dt);
#ifndef TPI_HAVE_NCCL
        ck_assert_int_eq(st, TPI_ERR_UNSUPPORTED);
        ck_assert_msg(strstr(err.msg, "built without CUDA/NCCL"), "message: %s", err.msg);
#else
        if (k == 0)
            ck_assert_msg(strstr(err.msg, "--backend cuda"), "message: %s", err.msg);
        else
            ck_assert_msg(strstr(err.msg, "GPU"), "message: %s", err.msg);
#endif
    }
}
END_TEST

/* The last rank arrives 3 s late; with a 1.5 s timeout the others must fail
 * by ~1.5 s naming it as missing, and the late rank must fail too. */
START_TEST(test_create_timeout) {
    const double timeout_s = 1.5;
    MPI_Comm group;
    MPI_Comm_dup(MPI_COMM_WORLD, &group);
    int late = g_size - 1;
    if (g_rank == late) sleep(3);
    struct comm *c = NULL;
    struct tpi_error err;
    tpi_err_clear(&err);
    double t0 = MPI_Wtime();
    int st = comm_create(&c, COMM_MPI, group, &ops_cpu, g_cpu, timeout_s, &err);
    double dt = MPI_Wtime() - t0;
    fprintf(stderr, "rank %d: status %s after %.2f s: %s\n", g_rank, tpi_status_name(st), dt,
            err.msg);
    ck_assert_int_eq(st, TPI_ERR_TIMEOUT);
    ck_assert_ptr_null(c);
    if (g_rank != late) {
        ck_assert_msg(dt < timeout_s + 1.0, "timed out only after %.2f s", dt);
        char want[64];
        snprintf(want, sizeof want, "missing [%d]", late);
        ck_assert_msg(strstr(err.msg, want), "message lacks '%s': %s", want, err.msg);
        ck_assert_msg(strstr(err.msg, "timed out after 1.5 s"), "message: %s", err.msg);
    } else {
        ck_assert_msg(strstr(err.msg, "given up"), "late rank's message: %s", err.msg);
    }
    /* Resynchronise on another communicator; the abandoned requests on `group`
     * complete as MPI progresses here. */
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Comm_free(&group);
}
END_TEST

/* An MPI communicator over a duplicate of the world (*group) whose operations time out
 * after 1 s. */
static struct comm *comm_one_second(MPI_Comm *group, struct tpi_error *err) {
    MPI_Comm_dup(MPI_COMM_WORLD, group);
    setenv("TPI_COMM_OP_TIMEOUT", "1", 1);
    struct comm *c = NULL;
    tpi_err_clear(err);
    int st = comm_create(&c, COMM_MPI, *group, &ops_cpu, g_cpu, 10.0, err);
    unsetenv("TPI_COMM_OP_TIMEOUT");
    ck_assert_msg(st == TPI_OK, "comm_create: %s", err->msg);
    return c;
}

/* A collective that a peer joins too late: with TPI_COMM_OP_TIMEOUT=1 the ranks
 * that arrived fail after ~1 s with a message that says they waited; the comm then
 * refuses further calls; the late rank's call completes when it arrives (the others'
 * requests are still posted) and every rank can free the comm. */
START_TEST(test_op_timeout) {
    MPI_Comm group;
    struct tpi_error err;
    struct comm *c = comm_one_second(&group, &err);
    int st;
    const int late = g_size - 1;
    float v = 1.0f;
    if (g_rank == late) sleep(3);
    double t0 = MPI_Wtime();
    st = comm_allreduce_sum(c, &v, 1, COMM_F32, &err);
    double dt = MPI_Wtime() - t0;
    fprintf(stderr, "rank %d: allreduce %s after %.2f s: %s\n", g_rank, tpi_status_name(st), dt,
            err.msg);
    if (g_rank != late) {
        ck_assert_int_eq(st, TPI_ERR_TIMEOUT);
        ck_assert_msg(dt > 0.9 && dt < 2.5, "timed out after %.2f s, want ~1 s", dt);
        ck_assert_msg(strstr(err.msg, "allreduce") && strstr(err.msg, "did not complete"),
                      "message: %s", err.msg);
        float w = 1.0f;
        ck_assert_int_eq(comm_allreduce_sum(c, &w, 1, COMM_F32, &err), TPI_ERR_COMM);
        ck_assert_msg(strstr(err.msg, "unusable"), "second call: %s", err.msg);
    } else {
        /* the others' contributions were posted before they gave up */
        ck_assert_msg(st == TPI_OK, "late rank: %s", err.msg);
        ck_assert_msg(v == (float)g_size, "late rank's sum %g, want %d", v, g_size);
    }
    comm_free(&c);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Comm_free(&group);
}
END_TEST

/* A receive whose sender comes 3 s late: the timeout names the peer it waited on. */
START_TEST(test_p2p_timeout) {
    if (g_size < 2) return;
    MPI_Comm group;
    struct tpi_error err;
    struct comm *c = comm_one_second(&group, &err);
    int st;
    float v = 1.0f;
    if (g_rank == 0) {
        st = comm_recv(c, &v, 1, COMM_F32, 1, &err);
        ck_assert_int_eq(st, TPI_ERR_TIMEOUT);
        ck_assert_msg(strstr(err.msg, "recv from group rank 1 on world rank 0"), "message: %s",
                      err.msg);
    } else if (g_rank == 1) {
        sleep(3);
        st = comm_send(c, &v, 1, COMM_F32, 0, &err); // the receive left posted takes it
        ck_assert_msg(st == TPI_OK, "late sender: %s", err.msg);
    }
    comm_free(&c);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Comm_free(&group);
}
END_TEST

/* ---- `tpinfer comm` end to end (run without mpirun: it launches mpirun) ---- */

#ifndef TPI_MPIEXEC
#define TPI_MPIEXEC "mpirun"
#endif

/* Run `cmd` through the shell with stdout and stderr into files; returns the
 * exit status and fills *out / *errtext (caller frees) and *secs. */
static int run_cmd(const char *cmd, char **out, char **errtext, double *secs) {
    char o[] = "/tmp/tpi_comm_out_XXXXXX", e[] = "/tmp/tpi_comm_err_XXXXXX";
    int fo = mkstemp(o), fe = mkstemp(e);
    ck_assert(fo >= 0 && fe >= 0);
    close(fo);
    close(fe);
    char full[2048];
    /* `timeout` turns a hang into a failure instead of a stuck CI job. */
    snprintf(full, sizeof full, "timeout 120 %s >%s 2>%s", cmd, o, e);
    double t0 = tpi_time_s();
    int rc = system(full);
    *secs = tpi_time_s() - t0;
    size_t n;
    *out = tu_read_file(o, &n);
    *errtext = tu_read_file(e, &n);
    unlink(o);
    unlink(e);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

#define MPIRUN TPI_MPIEXEC " --oversubscribe --allow-run-as-root --bind-to none"

START_TEST(test_cli_sweep) {
    char cmd[1024], *out, *errt;
    double secs;
    snprintf(cmd, sizeof cmd, "%s -np 2 %s comm -b 8 -e 1M -n 5 -w 1", MPIRUN, tu_binary());
    int rc = run_cmd(cmd, &out, &errt, &secs);
    ck_assert_msg(rc == 0, "exit %d\nstdout:\n%s\nstderr:\n%s", rc, out, errt);
    int n_pass = 0, n_rows = 0, n_wrong_rows = 0, seen[3] = {0};
    char *save = NULL;
    for (char *line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#') continue;
        if (!strncmp(line, "rank ", 5)) {
            ck_assert_msg(strstr(line, ": PASS"), "sanity line: %s", line);
            n_pass++;
            continue;
        }
        char op[32], type[32];
        unsigned long long size, count;
        double t, alg, bus;
        long long wrong;
        int k = sscanf(line, "%31s %llu %llu %31s %lf %lf %lf %lld", op, &size, &count, type, &t,
                       &alg, &bus, &wrong);
        ck_assert_msg(k == 8, "unparsed line: '%s'", line);
        n_rows++;
        if (wrong != 0) {
            n_wrong_rows++;
            fprintf(stderr, "wrong elements: %s\n", line);
        }
        if (!strcmp(op, "allreduce")) seen[0]++;
        if (!strcmp(op, "allgather")) seen[1]++;
        if (!strcmp(op, "sendrecv")) seen[2]++;
        ck_assert(t >= 0 && alg >= 0 && bus >= 0);
        ck_assert_str_eq(type, "float");
        ck_assert_uint_le(size, 1u << 20);
    }
    ck_assert_int_eq(n_pass, 2);
    /* 8 B .. 1 MiB by factor 2: 18 sizes for each of the three ops */
    ck_assert_int_eq(seen[0], 18);
    ck_assert_int_eq(seen[1], 18);
    ck_assert_int_eq(seen[2], 18);
    ck_assert_int_eq(n_rows, 54);
    ck_assert_int_eq(n_wrong_rows, 0);
    free(out);
    free(errt);
}
END_TEST

START_TEST(test_cli_json) {
    char cmd[1024], *out, *errt;
    double secs;
    snprintf(cmd, sizeof cmd, "%s -np 2 %s comm -b 64 -e 4K -n 2 -w 1 -d bfloat16 --json", MPIRUN,
             tu_binary());
    int rc = run_cmd(cmd, &out, &errt, &secs);
    ck_assert_msg(rc == 0, "exit %d\nstdout:\n%s\nstderr:\n%s", rc, out, errt);
    cJSON *doc = cJSON_Parse(out);
    ck_assert_msg(doc != NULL, "stdout is not one JSON document:\n%s", out);
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(doc, "ok")));
    ck_assert_int_eq(cJSON_GetObjectItem(doc, "world_size")->valueint, 2);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(doc, "sanity")), 2);
    cJSON *rows = cJSON_GetObjectItem(doc, "results");
    ck_assert_int_eq(cJSON_GetArraySize(rows), 7 * 3);
    cJSON *r;
    cJSON_ArrayForEach(r, rows) {
        ck_assert_int_eq(cJSON_GetObjectItem(r, "wrong")->valueint, 0);
        ck_assert_str_eq(cJSON_GetObjectItem(r, "type")->valuestring, "bfloat16");
    }
    cJSON_Delete(doc);
    free(out);
    free(errt);
}
END_TEST

START_TEST(test_cli_single_rank_warns) {
    char cmd[1024], *out, *errt;
    double secs;
    snprintf(cmd, sizeof cmd, "%s comm --check-only", tu_binary());
    int rc = run_cmd(cmd, &out, &errt, &secs);
    ck_assert_msg(rc == 0, "exit %d\nstderr:\n%s", rc, errt);
    ck_assert_msg(strstr(out, "rank 0 host ") && strstr(out, ": PASS"), "stdout: %s", out);
    ck_assert_msg(strstr(errt, "world size is 1: that tests nothing"), "stderr: %s", errt);
    free(out);
    free(errt);
}
END_TEST

/* The start-up limit as the other commands spell it (the README's hang checklist runs
 * comm "with the same options"), and a limit that is not seconds > 0 refused. */
START_TEST(test_cli_timeout_spellings) {
    char cmd[1024], *out, *errt;
    double secs;
    snprintf(cmd, sizeof cmd, "%s comm --check-only --comm-timeout 5", tu_binary());
    int rc = run_cmd(cmd, &out, &errt, &secs);
    ck_assert_msg(rc == 0 && strstr(errt, "timeout 5 s"), "exit %d\nstderr:\n%s", rc, errt);
    free(out);
    free(errt);
    snprintf(cmd, sizeof cmd, "%s comm --check-only --timeout 5x", tu_binary());
    rc = run_cmd(cmd, &out, &errt, &secs);
    ck_assert_msg(rc == 2 && strstr(errt, "--timeout expects seconds >= 0, got '5x'"),
                  "exit %d\nstderr:\n%s", rc, errt);
    free(out);
    free(errt);
}
END_TEST

START_TEST(test_cli_nccl_refused) {
    char cmd[1024], *out, *errt;
    double secs;
    snprintf(cmd, sizeof cmd, "%s -np 2 %s comm --comm nccl -b 8 -e 64 --timeout 5", MPIRUN,
             tu_binary());
    int rc = run_cmd(cmd, &out, &errt, &secs);
    fprintf(stderr, "nccl here: exit %d after %.1f s: %s", rc, secs, errt);
    ck_assert_int_ne(rc, 0);
    ck_assert_int_ne(rc, 124); /* not the hang guard */
    ck_assert_msg(secs < 30, "took %.1f s", secs);
    ck_assert_msg(strstr(errt, "nccl") || strstr(errt, "NCCL"), "stderr: %s", errt);
    ck_assert_msg(out[0] == '\0', "stdout should be empty: %s", out);
    free(out);
    free(errt);
}
END_TEST

/* Ranks given different sweeps: rank 0's one line naming the option, where they paired
 * all-reduces of different sizes (MPI_ERR_TRUNCATE from an aborted schedule). */
START_TEST(test_cli_options_differ) {
    char cmd[1024], *out, *errt;
    double secs;
    snprintf(cmd, sizeof cmd, "%s -np 1 %s comm -e 1M -n 2 : -np 1 %s comm -e 64K -n 2", MPIRUN,
             tu_binary(), tu_binary());
    int rc = run_cmd(cmd, &out, &errt, &secs);
    fprintf(stderr, "other -e on rank 1: exit %d after %.1f s: %s", rc, secs, errt);
    ck_assert_int_ne(rc, 0);
    ck_assert_int_ne(rc, 124);
    ck_assert_msg(strstr(errt, "tpinfer comm: rank 1's --maxbytes is 65536, rank 0's is 1048576"),
                  "stderr: %s", errt);
    ck_assert_msg(out[0] == '\0', "stdout should be empty: %s", out);
    free(out);
    free(errt);
}
END_TEST

static int run_cli_suite(void) {
    Suite *s = suite_create("comm_cli");
    TCase *tc = tcase_create("cli");
    tcase_set_timeout(tc, 200);
    tcase_add_test(tc, test_cli_sweep);
    tcase_add_test(tc, test_cli_json);
    tcase_add_test(tc, test_cli_single_rank_warns);
    tcase_add_test(tc, test_cli_timeout_spellings);
    tcase_add_test(tc, test_cli_nccl_refused);
    tcase_add_test(tc, test_cli_options_differ);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}

int main(int argc, char **argv) {
    /* --cli: the end-to-end tests; this process stays out of MPI, mpirun is a child. */
    if (argc > 1 && !strcmp(argv[1], "--cli")) return run_cli_suite();
    MPI_Init(&argc, &argv);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    setenv("CK_FORK", "no", 1);
    struct ops_config cfg = {.n_threads = 1};
    struct tpi_error err;
    if (ops_cpu.init(&g_cpu, &cfg, &err)) {
        fprintf(stderr, "cpu backend: %s\n", err.msg);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (g_size < 2) {
        fprintf(stderr, "SKIP: test_comm needs mpirun -np 2 or more\n");
        MPI_Finalize();
        return TU_SKIP;
    }
    Suite *s = suite_create("comm");
    TCase *tc = tcase_create("comm");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_names);
    tcase_add_test(tc, test_allreduce);
    tcase_add_test(tc, test_allreduce_staged);
    tcase_add_test(tc, test_allgather);
    tcase_add_test(tc, test_sendrecv_ring);
    tcase_add_test(tc, test_bcast_each_root);
    tcase_add_test(tc, test_barrier);
    tcase_add_test(tc, test_stats);
    tcase_add_test(tc, test_nccl_refused);
    tcase_add_test(tc, test_create_timeout);
    tcase_add_test(tc, test_op_timeout);
    tcase_add_test(tc, test_p2p_timeout);
    suite_add_tcase(s, tc);
    int rc = tu_run_suite(s);
    /* A failure on any rank fails the run on every rank. */
    int worst = rc;
    MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    ops_cpu.free(&g_cpu);
    MPI_Finalize();
    return worst;
}
