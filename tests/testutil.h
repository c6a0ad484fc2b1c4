/*
 * testutil.h — shared helpers for the Check tests: where test data lives,
 * skipping cleanly, reading JSON references, seeded random data, and array
 * comparison that prints the first mismatches (index, got, want).
 */
#ifndef TESTUTIL_H
#define TESTUTIL_H

#include <check.h>
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Exit code ctest reads as "skipped" (SKIP_RETURN_CODE). */
#define TU_SKIP 77

/* Path of test data file `name`: ../shared/data/NAME when present, else
 * tests/data/NAME; NULL when in neither (static buffer, one per call). */
const char *tu_data_path(const char *name);

/* Like tu_data_path but prints "SKIP: <name> not found in ../shared/data or
 * tests/data" to stderr when missing. */
const char *tu_data_or_skip(const char *name);

/* The tpinfer binary and the source dir, as built. */
const char *tu_binary(void);
const char *tu_source_dir(void);

/* A fresh private directory /tmp/PREFIX_XXXXXX for this test (one at a time per
 * process), its path, a path inside it (static buffer, 4 in rotation), and its removal
 * with everything in it. Failures are Check assertion failures. */
void tu_tmpdir_make(const char *prefix);
const char *tu_tmpdir(void);
const char *tu_tmp_path(const char *name);
void tu_tmpdir_remove(void);

/* Run `cmd` through the shell; its stdout as a malloc'd NUL-terminated string (caller
 * frees), its exit code in *status (128 + the signal when one ended it). */
char *tu_run_capture(const char *cmd, int *status);

/* Read a whole file (NUL-terminated, *n_out bytes); NULL on error. Caller frees. */
char *tu_read_file(const char *path, size_t *n_out);
/* Parse a JSON file; NULL on error. Caller frees with cJSON_Delete. */
cJSON *tu_read_json(const char *path);

/* Deterministic random numbers (xorshift64*): uniform in [lo, hi), and normal. */
struct tu_rng {
    uint64_t s;
};
void tu_rng_seed(struct tu_rng *r, uint64_t seed);
float tu_uniform(struct tu_rng *r, float lo, float hi);
float tu_normal(struct tu_rng *r);
void tu_fill_uniform(struct tu_rng *r, float *x, size_t n, float lo, float hi);

/* Compare got with want elementwise with |got-want| <= atol + rtol*|want|; prints
 * up to 8 mismatches and the max abs/rel error under `label`; returns the number
 * of mismatches. */
size_t tu_compare(const char *label, const float *got, const float *want, size_t n, double atol,
                  double rtol);
/* Normalized mean squared error sum((got-want)^2) / sum(want^2). */
double tu_nmse(const float *got, const float *want, size_t n);

/* For collective tests under mpirun: when cond is false, print "[rank R] FAIL file:line:
 * message" and count it in `bad` instead of leaving the test (a rank that left would
 * strand its peers in the next collective); the ranks agree on the counts at the end. */
#define TU_CHECK_RANK(bad, rank, cond, ...)                                           \
    do {                                                                              \
        if (!(cond)) {                                                                \
            (bad)++;                                                                  \
            fprintf(stderr, "[rank %d] FAIL %s:%d: ", (rank), __FILE__, __LINE__);    \
            fprintf(stderr, __VA_ARGS__);                                             \
            fprintf(stderr, "\n");                                                    \
        }                                                                             \
    } while (0)

/* Run a Check suite (CK_NORMAL output); returns the process exit code. */
int tu_run_suite(Suite *s);
/* Run a suite of MPI tests in this process (no fork: MPI does not survive one), output
 * on rank 0 only; returns the number of failed tests on this rank. */
int tu_run_suite_rank(Suite *s, int rank);

#endif /* TESTUTIL_H */
