/*
 * test_comm_gpu.c — the NCCL communicator on GPUs, one per rank (mpirun -np 2+ on a
 * node with as many GPUs; skipped otherwise): the tensor-parallel updates against
 * sums computed on the host from every rank's inputs.
 *   - comm_allreduce_add (dst += the group's sum of src) for sizes from 1 float to
 *     above the peer all-reduce's slot, odd and even: exact where the peer kernel
 *     runs (it sums in rank order, as the host does), within 1e-5 relative under NCCL;
 *   - comm_allreduce_add_norm for decode and prefill shapes, odd widths and rows past
 *     the fused form's limit: x exact, h against the host's rmsnorm, and `normed`
 *     set exactly when the fused form should run;
 *   - 300 rounds of mixed sizes (peer small, peer large, NCCL) checked each round: the
 *     staging slots and call counter across kernel kinds;
 *   - three all-reduces captured in a CUDA graph and replayed 20 times with new inputs.
 * With TPI_PEER_AR=0 the same checks run through NCCL alone (never `normed`).
 * Collective throughout: failures are counted and agreed at the end, so no rank waits
 * in a collective another rank left.
 */
#define _GNU_SOURCE
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"
#include "parallel/comm.h"
#include "testutil.h"
#include "tpi.h"

static int g_rank, g_size, g_bad;
static bool g_peer;            /* the peer all-reduce is expected (TPI_PEER_AR != 0) */
static const struct ops *g_ops;
static struct ops_ctx *g_ctx;
static struct comm *g_comm;

#define PEER_SLOT_FLOATS (8u << 20) /* comm_peer.c's PEER_AR_CAP_FLOATS */

#define CHECK(cond, ...) TU_CHECK_RANK(g_bad, g_rank, cond, __VA_ARGS__)

/* Rank r's input for case `salt` (r = -1: the replicated residual). */
static void fill(float *x, size_t n, int r, int salt) {
    struct tu_rng rng;
    tu_rng_seed(&rng, 7919u * (uint64_t)salt + 31u * (uint64_t)(r + 1));
    tu_fill_uniform(&rng, x, n, -1.0f, 1.0f);
}

/* The sum in the peer kernel's order: ((s0 + s1) + s2 ...), then dst + that. */
static void host_add(float *want, size_t n, int salt) {
    float *s = malloc(sizeof(float) * n), *acc = calloc(n, sizeof(float));
    fill(want, n, -1, salt);
    for (int r = 0; r < g_size; r++) {
        fill(s, n, r, salt);
        for (size_t i = 0; i < n; i++) acc[i] = r == 0 ? s[i] : acc[i] + s[i];
    }
    for (size_t i = 0; i < n; i++) want[i] = want[i] + acc[i];
    free(s);
    free(acc);
}

static bool peer_takes(size_t n) { return g_peer && n * (size_t)(g_size - 1) <= PEER_SLOT_FLOATS; }

/* Max |got - want| / (|want| + 1). */
static double worst_rel(const float *got, const float *want, size_t n) {
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - want[i]) / (fabs(want[i]) + 1.0);
        if (!(d <= w)) w = isnan(d) ? INFINITY : d;
    }
    return w;
}

struct dev_bufs {
    float *src, *dst, *w, *h;
    size_t n;
};

static void bufs_alloc(struct dev_bufs *b, size_t n, size_t n_cols) {
    b->n = n;
    b->src = g_ops->alloc(g_ctx, sizeof(float) * n);
    b->dst = g_ops->alloc(g_ctx, sizeof(float) * n);
    b->h = g_ops->alloc(g_ctx, sizeof(float) * n);
    b->w = g_ops->alloc(g_ctx, sizeof(float) * (n_cols ? n_cols : 1));
}

static void bufs_free(struct dev_bufs *b) {
    g_ops->dealloc(g_ctx, b->src);
    g_ops->dealloc(g_ctx, b->dst);
    g_ops->dealloc(g_ctx, b->h);
    g_ops->dealloc(g_ctx, b->w);
}

/* Upload this rank's src and the residual for case salt into b. */
static void upload(struct dev_bufs *b, size_t n, int salt, float *tmp) {
    fill(tmp, n, g_rank, salt);
    g_ops->to_dev(g_ctx, b->src, tmp, sizeof(float) * n);
    g_ops->sync(g_ctx);
    fill(tmp, n, -1, salt);
    g_ops->to_dev(g_ctx, b->dst, tmp, sizeof(float) * n);
    g_ops->sync(g_ctx);
}

/* One comm_allreduce_add of n floats, checked. */
static void check_add(struct dev_bufs *b, size_t n, int salt) {
    float *got = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n);
    upload(b, n, salt, got);
    struct tpi_error err = {0};
    int rc = comm_allreduce_add(g_comm, b->src, b->dst, n, &err);
    CHECK(rc == TPI_OK, "allreduce_add(%zu): %s", n, err.msg);
    g_ops->to_host(g_ctx, got, b->dst, sizeof(float) * n);
    rc = g_ops->check(g_ctx, &err);
    CHECK(rc == TPI_OK, "after allreduce_add(%zu): %s", n, err.msg);
    host_add(want, n, salt);
    const double w = worst_rel(got, want, n);
    if (peer_takes(n))
        CHECK(w == 0, "allreduce_add(%zu) over peer memory: off by %.3g (want exact)", n, w);
    else
        CHECK(w <= 1e-5, "allreduce_add(%zu) through NCCL: off by %.3g", n, w);
    free(got);
    free(want);
}

/* One comm_allreduce_add_norm of rows x cols, checked. */
static void check_add_norm(struct dev_bufs *b, int rows, int cols, int salt) {
    const size_t n = (size_t)rows * cols;
    float *got = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n);
    float *w = malloc(sizeof(float) * cols), *h = malloc(sizeof(float) * n);
    upload(b, n, salt, got);
    fill(w, (size_t)cols, -2, salt);
    g_ops->to_dev(g_ctx, b->w, w, sizeof(float) * cols);
    for (size_t i = 0; i < n; i++) h[i] = 1234.5f; // sentinel: untouched unless normed
    g_ops->to_dev(g_ctx, b->h, h, sizeof(float) * n);
    g_ops->sync(g_ctx);
    struct tpi_error err = {0};
    bool normed = true;
    const float eps = 1e-6f;
    int rc = comm_allreduce_add_norm(g_comm, b->src, b->dst, rows, cols, b->w, eps, b->h, &normed,
                                     &err);
    CHECK(rc == TPI_OK, "allreduce_add_norm(%d x %d): %s", rows, cols, err.msg);
    g_ops->to_host(g_ctx, got, b->dst, sizeof(float) * n);
    g_ops->to_host(g_ctx, h, b->h, sizeof(float) * n);
    rc = g_ops->check(g_ctx, &err);
    CHECK(rc == TPI_OK, "after allreduce_add_norm(%d x %d): %s", rows, cols, err.msg);
    const bool fits = rows <= 128 && cols % 4 == 0 && cols <= 8192 && peer_takes(n);
    CHECK(normed == fits, "allreduce_add_norm(%d x %d): normed %d, expected %d", rows, cols,
          normed, fits);
    host_add(want, n, salt);
    const double wx = worst_rel(got, want, n);
    CHECK(wx <= (peer_takes(n) ? 0.0 : 1e-5), "allreduce_add_norm(%d x %d): x off by %.3g", rows,
          cols, wx);
    double wh = 0;
    if (normed) {
        for (int r = 0; r < rows; r++) {
            const float *x = want + (size_t)r * cols;
            double ss = 0;
            for (int c = 0; c < cols; c++) ss += (double)x[c] * x[c];
            const float scale = (float)(1.0 / sqrt(ss / cols + eps));
            for (int c = 0; c < cols; c++) {
                const double e = x[c] * scale * w[c], g = h[(size_t)r * cols + c];
                const double d = fabs(g - e) / (fabs(e) + 1e-3);
                if (!(d <= wh)) wh = isnan(d) ? INFINITY : d;
            }
        }
        CHECK(wh <= 1e-5, "allreduce_add_norm(%d x %d): h off by %.3g", rows, cols, wh);
    } else {
        for (size_t i = 0; i < n; i++)
            if (h[i] != 1234.5f) {
                CHECK(0, "allreduce_add_norm(%d x %d): not normed, yet h[%zu] written", rows,
                      cols, i);
                break;
            }
    }
    if (g_rank == 0)
        fprintf(stderr, "add_norm %4d x %5d: normed %d, x off %.2g, h off %.2g\n", rows, cols,
                normed, wx, wh);
    free(got);
    free(want);
    free(w);
    free(h);
}

START_TEST(test_add_sizes) {
    const size_t sizes[] = {1, 3, 4, 5, 1000, 4096, 4097, 5120 * 3, 131072, 1u << 21,
                            PEER_SLOT_FLOATS / (size_t)(g_size - 1),
                            PEER_SLOT_FLOATS / (size_t)(g_size - 1) + 4};
    struct dev_bufs b;
    const size_t n_max = sizes[sizeof sizes / sizeof sizes[0] - 1];
    bufs_alloc(&b, n_max, 0);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        check_add(&b, sizes[i], 100 + (int)i);
        if (g_rank == 0) fprintf(stderr, "add %9zu floats: checked\n", sizes[i]);
    }
    bufs_free(&b);
}
END_TEST

START_TEST(test_add_norm_shapes) {
    const int shapes[][2] = {{1, 4096}, {1, 5120}, {2, 8192}, {7, 4096}, {32, 4096},
                             {128, 5120}, {129, 4096}, {1, 8196}, {3, 10}, {512, 4096}};
    struct dev_bufs b;
    bufs_alloc(&b, (size_t)512 * 8196, 8196);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        check_add_norm(&b, shapes[i][0], shapes[i][1], 200 + (int)i);
    bufs_free(&b);
}
END_TEST

START_TEST(test_mixed_rounds) {
    // peer small, peer fused, peer large, NCCL: 300 rounds, every result checked
    struct dev_bufs b;
    const size_t big = PEER_SLOT_FLOATS / (size_t)(g_size - 1) + 1024;
    bufs_alloc(&b, big, 4096);
    const int bad0 = g_bad;
    for (int round = 0; round < 300 && g_bad == bad0; round++) {
        check_add(&b, 4096, 1000 + round);
        if (round % 3 == 0) check_add_norm(&b, 2, 4096, 2000 + round);
        if (round % 50 == 0) check_add(&b, 1u << 20, 3000 + round);
        if (round % 100 == 0) check_add(&b, big, 4000 + round);
    }
    bufs_free(&b);
}
END_TEST

START_TEST(test_graph_replay) {
    struct tpi_error err = {0};
    if (!g_ops->graph_begin) return;
    const size_t n1 = 4096, n2 = 3 * 5120, n3 = 1u << 20;
    struct dev_bufs b1, b2, b3;
    bufs_alloc(&b1, n1, 0);
    bufs_alloc(&b2, n2, 0);
    bufs_alloc(&b3, n3, 0);
    int rc = g_ops->graph_begin(g_ctx, &err);
    CHECK(rc == TPI_OK, "graph_begin: %s", err.msg);
    if (rc == TPI_OK) {
        rc = comm_allreduce_add(g_comm, b1.src, b1.dst, n1, &err);
        if (!rc) rc = comm_allreduce_add(g_comm, b2.src, b2.dst, n2, &err);
        if (!rc) rc = comm_allreduce_add(g_comm, b3.src, b3.dst, n3, &err);
        CHECK(rc == TPI_OK, "recording: %s", err.msg);
        void *graph = NULL;
        rc = g_ops->graph_end(g_ctx, &graph, &err);
        CHECK(rc == TPI_OK && graph, "graph_end: %s", err.msg);
        float *tmp = malloc(sizeof(float) * n3), *want = malloc(sizeof(float) * n3);
        for (int it = 0; graph && it < 20; it++) {
            const int salt = 5000 + 10 * it;
            upload(&b1, n1, salt, tmp);
            upload(&b2, n2, salt + 1, tmp);
            upload(&b3, n3, salt + 2, tmp);
            bool launched = false;
            rc = g_ops->graph_launch(g_ctx, graph, &launched, &err);
            CHECK(rc == TPI_OK && launched, "graph_launch %d: %s", it, err.msg);
            const struct dev_bufs *bs[3] = {&b1, &b2, &b3};
            for (int k = 0; k < 3; k++) {
                g_ops->to_host(g_ctx, tmp, bs[k]->dst, sizeof(float) * bs[k]->n);
                host_add(want, bs[k]->n, salt + k);
                const double w = worst_rel(tmp, want, bs[k]->n);
                CHECK(w <= (peer_takes(bs[k]->n) ? 0.0 : 1e-5),
                      "graph replay %d, all-reduce %d (%zu floats): off by %.3g", it, k,
                      bs[k]->n, w);
            }
        }
        g_ops->graph_free(g_ctx, graph);
        free(tmp);
        free(want);
    }
    bufs_free(&b1);
    bufs_free(&b2);
    bufs_free(&b3);
}
END_TEST

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    setenv("CK_FORK", "no", 1);
    int n_dev = 0;
    g_ops = ops_cuda_get();
    const bool usable = g_ops && ops_cuda_available(&n_dev);
    MPI_Comm node;
    int local = 0, local_size = 1;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local);
    MPI_Comm_size(node, &local_size);
    MPI_Comm_free(&node);
    if (g_size < 2 || !usable || n_dev < local_size) {
        if (g_rank == 0)
            fprintf(stderr, "SKIP: test_comm_gpu needs mpirun -np 2+ and a GPU per rank "
                            "(%d ranks on this node, %d GPUs)\n", local_size, n_dev);
        MPI_Finalize();
        return TU_SKIP;
    }
    const char *pa = getenv("TPI_PEER_AR");
    g_peer = !(pa && !strcmp(pa, "0"));
    tpi_log_set(TPI_LOG_INFO, g_rank);
    struct ops_config cfg = {.device = local};
    struct tpi_error err = {0};
    int rc = g_ops->init(&g_ctx, &cfg, &err);
    if (!rc) rc = comm_create(&g_comm, COMM_NCCL, MPI_COMM_WORLD, g_ops, g_ctx, 60.0, &err);
    int worst = rc;
    MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (worst) {
        fprintf(stderr, "[rank %d] set-up failed: %s\n", g_rank, rc ? err.msg : "on another rank");
        MPI_Finalize();
        return 1;
    }
    Suite *s = suite_create("comm_gpu");
    TCase *tc = tcase_create("comm_gpu");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_add_sizes);
    tcase_add_test(tc, test_add_norm_shapes);
    tcase_add_test(tc, test_mixed_rounds);
    tcase_add_test(tc, test_graph_replay);
    suite_add_tcase(s, tc);
    int mine = g_bad + tu_run_suite_rank(s, g_rank), bad = 0;
    MPI_Allreduce(&mine, &bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0) fprintf(stderr, "test_comm_gpu: %d failure(s) over %d ranks\n", bad, g_size);
    comm_free(&g_comm);
    g_ops->free(&g_ctx);
    MPI_Finalize();
    return bad ? 1 : 0;
}
