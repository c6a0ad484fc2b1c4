/*
 * test_grid.c — the rank grid and the agreement helpers, at 1, 2 and 4 ranks:
 * every tp x pp layout that fits the world (tp_rank = rank % tp, pp_stage =
 * rank / tp, and the members of the TP and PP communicators), the error when
 * tp * pp != world, grid_agree spreading one rank's failure,
 * grid_check_identity and grid_check_same naming the field that differs, and
 * grid_bcast giving up on a late root after TPI_COMM_OP_TIMEOUT.
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "parallel/grid.h"
#include "testutil.h"
#include "tpi.h"

static int g_rank, g_size;

/* World ranks of the members of `comm`, in its rank order (caller frees). */
static int *members(MPI_Comm comm, int *n) {
    MPI_Comm_size(comm, n);
    int *m = calloc((size_t)*n, sizeof *m);
    MPI_Allgather(&g_rank, 1, MPI_INT, m, 1, MPI_INT, comm);
    return m;
}

START_TEST(test_layouts) {
    static const int layouts[][2] = {{1, 1}, {2, 1}, {1, 2}, {2, 2}, {4, 1}, {1, 4}};
    int n_tested = 0;
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) {
        int tp = layouts[k][0], pp = layouts[k][1];
        if (tp * pp != g_size) continue;
        n_tested++;
        struct tpi_grid g;
        struct tpi_error err;
        tpi_err_clear(&err);
        int st = grid_init(&g, tp, pp, &err);
        ck_assert_msg(st == TPI_OK, "grid_init(%d, %d): %s", tp, pp, err.msg);
        ck_assert_int_eq(g.world_size, g_size);
        ck_assert_int_eq(g.world_rank, g_rank);
        ck_assert_int_eq(g.tp, tp);
        ck_assert_int_eq(g.pp, pp);
        ck_assert_int_eq(g.tp_rank, g_rank % tp);
        ck_assert_int_eq(g.pp_stage, g_rank / tp);
        ck_assert_int_eq(grid_rank_of(&g, g.tp_rank, g.pp_stage), g_rank);
        /* one node here: the node communicator is the world */
        ck_assert_int_eq(g.local_rank, g_rank);
        ck_assert_int_eq(g.local_size, g_size);
        ck_assert_str_ne(g.host, "");

        int n, r;
        int *m = members(g.tp_comm, &n);
        MPI_Comm_rank(g.tp_comm, &r);
        ck_assert_int_eq(n, tp);
        ck_assert_int_eq(r, g.tp_rank);
        for (int j = 0; j < tp; j++)
            ck_assert_msg(m[j] == grid_rank_of(&g, j, g.pp_stage),
                          "tp=%d pp=%d: tp_comm member %d is world rank %d, want %d", tp, pp, j,
                          m[j], grid_rank_of(&g, j, g.pp_stage));
        free(m);
        m = members(g.pp_comm, &n);
        MPI_Comm_rank(g.pp_comm, &r);
        ck_assert_int_eq(n, pp);
        ck_assert_int_eq(r, g.pp_stage);
        for (int j = 0; j < pp; j++)
            ck_assert_msg(m[j] == grid_rank_of(&g, g.tp_rank, j),
                          "tp=%d pp=%d: pp_comm member %d is world rank %d, want %d", tp, pp, j,
                          m[j], grid_rank_of(&g, g.tp_rank, j));
        free(m);
        m = members(g.world, &n);
        ck_assert_int_eq(n, g_size);
        for (int j = 0; j < n; j++)
            ck_assert_int_eq(m[j], j);
        free(m);
        grid_free(&g);
        ck_assert(g.world == MPI_COMM_NULL && g.tp_comm == MPI_COMM_NULL);
    }
    ck_assert_int_gt(n_tested, 0);
}
END_TEST

START_TEST(test_bad_shape) {
    struct tpi_grid g;
    struct tpi_error err;
    char want[128];
    /* one rank too many */
    int st = grid_init(&g, g_size + 1, 1, &err);
    ck_assert_int_eq(st, TPI_ERR_INVALID);
    snprintf(want, sizeof want, "--tp %d --pp 1 needs %d ranks", g_size + 1, g_size + 1);
    ck_assert_msg(strstr(err.msg, want), "message lacks '%s': %s", want, err.msg);
    snprintf(want, sizeof want, "launched with %d", g_size);
    ck_assert_msg(strstr(err.msg, want), "message lacks '%s': %s", want, err.msg);
    snprintf(want, sizeof want, "mpirun -np %d", g_size + 1);
    ck_assert_msg(strstr(err.msg, want), "message lacks '%s': %s", want, err.msg);
    if (g_size == 1) /* launched without mpirun: the exact words users see */
        ck_assert_str_eq(err.msg, "--tp 2 --pp 1 needs 2 ranks, launched with 1: run under "
                                  "mpirun -np 2");
    /* pp that does not divide */
    st = grid_init(&g, 1, 3 * g_size, &err);
    ck_assert_int_eq(st, TPI_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "needs"), "message: %s", err.msg);
    ck_assert_int_eq(grid_init(&g, 0, 1, &err), TPI_ERR_INVALID);
    ck_assert_int_eq(grid_init(&g, 1, -1, &err), TPI_ERR_INVALID);
}
END_TEST

START_TEST(test_agree) {
    struct tpi_grid g;
    struct tpi_error err;
    ck_assert_int_eq(grid_init(&g, g_size, 1, &err), TPI_OK);
    /* all fine */
    tpi_err_clear(&err);
    ck_assert_int_eq(grid_agree(&g, TPI_OK, &err), TPI_OK);
    /* the last rank fails: everyone gets its status and words */
    int bad = g_size - 1;
    tpi_err_clear(&err);
    int st =
        bad == g_rank ? tpi_err(&err, TPI_ERR_IO, "cannot open part %d of the model", bad) : TPI_OK;
    st = grid_agree(&g, st, &err);
    ck_assert_int_eq(st, TPI_ERR_IO);
    char want[512];
    snprintf(want, sizeof want, "rank %d (host %s): cannot open part %d of the model", bad, g.host,
             bad);
    ck_assert_str_eq(err.msg, want);
    /* two ranks fail: the lowest one's message wins, on every rank */
    if (g_size >= 2) {
        st = g_rank >= 1 ? tpi_err(&err, TPI_ERR_FORMAT, "bad tensor on rank %d", g_rank) : TPI_OK;
        st = grid_agree(&g, st, &err);
        ck_assert_int_eq(st, TPI_ERR_FORMAT);
        snprintf(want, sizeof want, "rank 1 (host %s): bad tensor on rank 1", g.host);
        ck_assert_str_eq(err.msg, want);
    }
    grid_free(&g);
}
END_TEST

START_TEST(test_identity) {
    struct tpi_grid g;
    struct tpi_error err;
    ck_assert_int_eq(grid_init(&g, g_size, 1, &err), TPI_OK);
    struct run_identity id = {.model_size = 123456789,
                              .metadata_hash = 0xfeedULL,
                              .tp = g_size,
                              .pp = 1,
                              .backend = 0,
                              .comm = 0,
                              .n_ctx = 4096,
                              .seed = 42};
    tpi_err_clear(&err);
    ck_assert_int_eq(grid_check_identity(&g, &id, &err), TPI_OK);
    if (g_size >= 2) {
        /* rank 1 has a different model file */
        struct run_identity mine = id;
        if (g_rank == 1) mine.model_size = 123456000;
        int st = grid_check_identity(&g, &mine, &err);
        ck_assert_int_eq(st, TPI_ERR_INVALID);
        ck_assert_msg(strstr(err.msg, "model_size"), "message: %s", err.msg);
        ck_assert_msg(strstr(err.msg, "rank 1 has 123456000, rank 0 has 123456789"), "message: %s",
                      err.msg);
        /* the last rank has another seed and n_ctx: the first field in order is named */
        mine = id;
        if (g_rank == g_size - 1) {
            mine.seed = 7;
            mine.n_ctx = 512;
        }
        st = grid_check_identity(&g, &mine, &err);
        ck_assert_int_eq(st, TPI_ERR_INVALID);
        ck_assert_msg(strstr(err.msg, "n_ctx"), "message: %s", err.msg);
    }
    if (g_size >= 2) { /* the options a mismatch of which once ran wrongly or hung */
        struct run_identity mine = id;
        if (g_rank == 1) mine.pp_layers_hash = 0x1234;
        int st = grid_check_identity(&g, &mine, &err);
        ck_assert_int_eq(st, TPI_ERR_INVALID);
        ck_assert_msg(strstr(err.msg, "--pp-layers differs"), "message: %s", err.msg);
        mine = id;
        if (g_rank == 1) mine.n_ubatch = 2;
        st = grid_check_identity(&g, &mine, &err);
        ck_assert_msg(st == TPI_ERR_INVALID && strstr(err.msg, "n_ubatch"), "message: %s", err.msg);
        mine = id;
        if (g_rank == 1) mine.n_slot = 8;
        st = grid_check_identity(&g, &mine, &err);
        ck_assert_msg(st == TPI_ERR_INVALID && strstr(err.msg, "--parallel differs"), "message: %s",
                      err.msg);
    }
    grid_free(&g);
}
END_TEST

START_TEST(test_check_same) {
    struct tpi_grid g;
    struct tpi_error err;
    ck_assert_int_eq(grid_init(&g, g_size, 1, &err), TPI_OK);
    struct grid_same v[] = {{"-n", 8, 0}, {"prompt", 0xabcdef, 1}};
    tpi_err_clear(&err);
    ck_assert_int_eq(grid_check_same(&g, v, 2, &err), TPI_OK);
    if (g_size >= 2) {
        if (g_rank >= 1) v[0].value = 5; // every rank but 0: the first named, the rest counted
        int st = grid_check_same(&g, v, 2, &err);
        ck_assert_int_eq(st, TPI_ERR_INVALID);
        char want[128];
        snprintf(want, sizeof want, "rank 1's -n is 5, rank 0's is 8%s", g_size > 2 ? " (and" : ":");
        ck_assert_msg(strstr(err.msg, want), "message: %s", err.msg);
        v[0].value = 8;
        if (g_rank == g_size - 1) v[1].value = 1;
        st = grid_check_same(&g, v, 2, &err);
        ck_assert_int_eq(st, TPI_ERR_INVALID);
        snprintf(want, sizeof want, "rank %d's prompt does not match rank 0's", g_size - 1);
        ck_assert_msg(strstr(err.msg, want), "message: %s", err.msg);
    }
    grid_free(&g);
}
END_TEST

/* A root that comes late: the other ranks' grid_bcast gives up after the timeout with
 * TPI_ERR_TIMEOUT naming the root, then the root's broadcast completes their posted
 * ones (so the ranks stay in step for the tests after this one). */
START_TEST(test_bcast_timeout) {
    struct tpi_grid g;
    struct tpi_error err;
    ck_assert_int_eq(grid_init(&g, g_size, 1, &err), TPI_OK);
    static int buf[4];
    for (int i = 0; i < 4; i++) buf[i] = g_rank == 0 ? 10 + i : -1;
    tpi_err_clear(&err);
    ck_assert_int_eq(grid_bcast(&g, buf, 4, MPI_INT, 0, &err), TPI_OK);
    for (int i = 0; i < 4; i++) ck_assert_int_eq(buf[i], 10 + i);
    if (g_size >= 2) {
        setenv("TPI_COMM_OP_TIMEOUT", "0.5", 1);
        static int late[4];
        for (int i = 0; i < 4; i++) late[i] = g_rank == 0 ? 20 + i : -1;
        if (g_rank == 0) {
            usleep(1500 * 1000); // past the others' timeout
            ck_assert_int_eq(grid_bcast(&g, late, 4, MPI_INT, 0, &err), TPI_OK);
        } else {
            const double t0 = tpi_time_s();
            int st = grid_bcast(&g, late, 4, MPI_INT, 0, &err);
            const double dt = tpi_time_s() - t0;
            ck_assert_int_eq(st, TPI_ERR_TIMEOUT);
            ck_assert_msg(dt >= 0.45 && dt < 1.4, "gave up after %.2f s", dt);
            char want[128];
            snprintf(want, sizeof want, "a broadcast from world rank 0 did not complete on world "
                     "rank %d in 0.5 s", g_rank);
            ck_assert_msg(strstr(err.msg, want), "message: %s", err.msg);
        }
        unsetenv("TPI_COMM_OP_TIMEOUT");
        // The given-up broadcasts stay posted and end once progressed (any MPI call does).
        volatile int *lv = late;
        const double t0 = tpi_time_s();
        while (lv[3] != 23 && tpi_time_s() - t0 < 10) {
            int flag;
            MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, g.world, &flag, MPI_STATUS_IGNORE);
            usleep(1000);
        }
        for (int i = 0; i < 4; i++) ck_assert_int_eq(lv[i], 20 + i);
        MPI_Barrier(g.world);
    }
    grid_free(&g);
}
END_TEST

int main(int argc, char **argv) {
    struct tpi_error err;
    if (grid_mpi_init(&argc, &argv, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    if (grid_mpi_init(&argc, &argv, &err) != TPI_OK) { /* must be safe to call twice */
        fprintf(stderr, "second grid_mpi_init: %s\n", err.msg);
        return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    setenv("CK_FORK", "no", 1);
    Suite *s = suite_create("grid");
    TCase *tc = tcase_create("grid");
    tcase_add_test(tc, test_layouts);
    tcase_add_test(tc, test_bad_shape);
    tcase_add_test(tc, test_agree);
    tcase_add_test(tc, test_identity);
    tcase_add_test(tc, test_check_same);
    tcase_add_test(tc, test_bcast_timeout);
    suite_add_tcase(s, tc);
    int rc = tu_run_suite(s);
    int worst = rc;
    MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    grid_mpi_finalize();
    return worst;
}
