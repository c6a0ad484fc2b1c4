/*
 * testutil.c — implementation of the shared test helpers (see testutil.h).
 */
#define _DEFAULT_SOURCE /* mkdtemp */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

const char *tu_data_path(const char *name) {
    static char bufs[8][4096];
    static int next;
    char *buf = bufs[next++ & 7];
    snprintf(buf, 4096, "%s/%s", TPI_SHARED_DATA, name);
    if (access(buf, R_OK) == 0) return buf;
    snprintf(buf, 4096, "%s/%s", TPI_LOCAL_DATA, name);
    if (access(buf, R_OK) == 0) return buf;
    return NULL;
}

const char *tu_data_or_skip(const char *name) {
    const char *p = tu_data_path(name);
    if (!p) fprintf(stderr, "SKIP: %s not found in ../shared/data or tests/data\n", name);
    return p;
}

const char *tu_binary(void) { return TPI_BINARY; }
const char *tu_source_dir(void) { return TPI_SOURCE_DIR; }

static char g_tmpdir[256];

void tu_tmpdir_make(const char *prefix) {
    snprintf(g_tmpdir, sizeof g_tmpdir, "/tmp/%s_XXXXXX", prefix);
    ck_assert_ptr_nonnull(mkdtemp(g_tmpdir));
}

const char *tu_tmpdir(void) { return g_tmpdir; }

const char *tu_tmp_path(const char *name) {
    static char buf[4][512];
    static int next;
    char *p = buf[next++ & 3];
    snprintf(p, 512, "%s/%s", g_tmpdir, name);
    return p;
}

void tu_tmpdir_remove(void) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmpdir);
    ck_assert_int_eq(system(cmd), 0);
}

char *tu_run_capture(const char *cmd, int *status) {
    FILE *p = popen(cmd, "r");
    ck_assert_msg(p != NULL, "popen(%s) failed", cmd);
    size_t cap = 4096, n = 0, k;
    char *buf = malloc(cap);
    ck_assert_ptr_nonnull(buf);
    while ((k = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += k;
        if (cap - n < 2) {
            buf = realloc(buf, cap *= 2);
            ck_assert_ptr_nonnull(buf);
        }
    }
    buf[n] = '\0';
    const int st = pclose(p);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    return buf;
}

char *tu_read_file(const char *path, size_t *n_out) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    buf[n] = '\0';
    if (n_out) *n_out = (size_t)n;
    return buf;
}

cJSON *tu_read_json(const char *path) {
    char *text = tu_read_file(path, NULL);
    if (!text) return NULL;
    cJSON *j = cJSON_Parse(text);
    free(text);
    return j;
}

void tu_rng_seed(struct tu_rng *r, uint64_t seed) { r->s = seed * 0x9E3779B97F4A7C15ULL + 1; }

static uint64_t tu_next(struct tu_rng *r) {
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1DULL;
}

float tu_uniform(struct tu_rng *r, float lo, float hi) {
    double u = (double)(tu_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(lo + (hi - lo) * u);
}

float tu_normal(struct tu_rng *r) {
    double u1 = ((double)(tu_next(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    double u2 = (double)(tu_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void tu_fill_uniform(struct tu_rng *r, float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = tu_uniform(r, lo, hi);
}

size_t tu_compare(const char *label, const float *got, const float *want, size_t n, double atol,
                  double rtol) {
    size_t bad = 0;
    double max_abs = 0, max_rel = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        double rel = d / (fabs((double)want[i]) + 1e-30);
        if (d > max_abs) max_abs = d;
        if (rel > max_rel && fabs((double)want[i]) > atol) max_rel = rel;
        if (!(d <= atol + rtol * fabs((double)want[i]))) { /* also catches NaN */
            if (bad < 8)
                fprintf(stderr, "%s: mismatch at %zu: got %.7g want %.7g (|d| %.3g)\n", label, i,
                        (double)got[i], (double)want[i], d);
            bad++;
        }
    }
    fprintf(stderr, "%s: n=%zu max_abs_err=%.3g max_rel_err=%.3g mismatches=%zu\n", label, n,
            max_abs, max_rel, bad);
    return bad;
}

double tu_nmse(const float *got, const float *want, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - (double)want[i];
        num += d * d;
        den += (double)want[i] * (double)want[i];
    }
    return den > 0 ? num / den : num;
}

int tu_run_suite(Suite *s) {
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

int tu_run_suite_rank(Suite *s, int rank) {
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, rank == 0 ? CK_NORMAL : CK_SILENT);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed;
}
