/*
 * test_bench.c — `tpinfer bench` end to end, through the binary under mpirun
 * (CPU backend, MPI communicator, the tiny Q4_K_M model):
 * - tp 2 in every output format: JSON and JSONL parsed with cJSON, CSV parsed
 *   (bare header, quoted values), markdown's header and one row per test; the
 *   fields, n_prompt/n_gen/n_depth, -r samples, avg_ts = mean(samples_ts),
 *   stddev_ts = their sample stddev (n-1), t/s = tokens / seconds per sample, and
 *   the all-reduce count of a 4-layer model (2 per layer per forward);
 * - pp 2 (send/recv traffic, no all-reduce), a depth test, -pg;
 * - errors: --tp 2 on one rank, a missing model: exit 1 with one clear line.
 * Plus the formatting helpers on their own (size classes, file-type names).
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../engine/cli/bench_report.h"
#include "testutil.h"

#ifndef TPI_MPIEXEC
#define TPI_MPIEXEC "mpirun"
#endif

#define MODEL "qwen3-tiny-q4_k_m.gguf"
#define N_LAYER 4 /* ../shared/data/README.md */
#define REPS 3

static char g_stderr_path[256];

/* Run `tpinfer bench ARGS` under mpirun -np np (np 0: without mpirun); returns stdout
 * (caller frees) and the exit code in *code; stderr goes to g_stderr_path. */
static char *run_bench(int np, const char *args, int *code) {
    char cmd[4096];
    snprintf(g_stderr_path, sizeof g_stderr_path, "/tmp/test_bench_%d.err", (int)getpid());
    // yield_when_idle and passive OpenMP waits: ranks share 2 cores in CI.
    const char *env = "OMPI_MCA_mpi_yield_when_idle=1 OMP_WAIT_POLICY=passive";
    if (np > 0)
        snprintf(cmd, sizeof cmd,
                 "env %s timeout 120 %s --oversubscribe --allow-run-as-root --bind-to none -np %d "
                 "%s bench %s 2>%s",
                 env, TPI_MPIEXEC, np, tu_binary(), args, g_stderr_path);
    else
        snprintf(cmd, sizeof cmd, "env %s timeout 120 %s bench %s 2>%s", env, tu_binary(), args,
                 g_stderr_path);
    FILE *p = popen(cmd, "r");
    ck_assert_msg(p != NULL, "popen(%s) failed", cmd);
    size_t cap = 1 << 16, n = 0;
    char *out = malloc(cap);
    ck_assert_ptr_nonnull(out);
    size_t k;
    while ((k = fread(out + n, 1, cap - n - 1, p)) > 0) {
        n += k;
        if (cap - n < 1024) {
            out = realloc(out, cap *= 2);
            ck_assert_ptr_nonnull(out);
        }
    }
    out[n] = 0;
    int st = pclose(p);
    *code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return out;
}

static char *read_stderr(void) {
    size_t n = 0;
    char *s = tu_read_file(g_stderr_path, &n);
    return s ? s : strdup("");
}

/* Skips the test (return) when the model is missing. */
#define MODEL_OR_SKIP(path)                                                                    \
    const char *path = tu_data_path(MODEL);                                                    \
    if (!path) {                                                                               \
        fprintf(stderr, "SKIP: %s not found in ../shared/data or tests/data\n", MODEL);        \
        return;                                                                                \
    }

/* ---- checking one result, whatever the format it came in --------------------- */

/* A result as name -> value strings and parsed arrays. */
struct row {
    cJSON *obj; /* JSON: the object; CSV: built from the fields */
};

static double num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    ck_assert_msg(cJSON_IsNumber(v), "field %s missing or not a number", key);
    return v->valuedouble;
}

static const char *str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    ck_assert_msg(cJSON_IsString(v), "field %s missing or not a string", key);
    return v->valuestring;
}

static int arr(const cJSON *o, const char *key, double *out, int cap) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);
    ck_assert_msg(cJSON_IsArray(a), "field %s missing or not an array", key);
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) {
        ck_assert_msg(cJSON_IsNumber(e), "%s[%d] is not a number", key, n);
        if (n < cap) out[n] = e->valuedouble;
        n++;
    }
    return n;
}

static void expect_close(const char *what, double got, double want, double rtol) {
    ck_assert_msg(fabs(got - want) <= 1e-9 + rtol * fabs(want), "%s: got %.9g, want %.9g", what,
                  got, want);
}

/* What a result must say, given its test. */
struct want {
    int n_prompt, n_gen, n_depth, tp, pp;
};

static void check_result(const cJSON *o, const struct want *w, double ts_rtol) {
    ck_assert_str_eq(str(o, "backends"), "CPU");
    ck_assert_str_eq(str(o, "comm"), "mpi");
    ck_assert_msg(strstr(str(o, "model_filename"), MODEL) != NULL, "model_filename %s",
                  str(o, "model_filename"));
    ck_assert_str_eq(str(o, "model_type"), "qwen3 ?B Q4_K - Medium");
    ck_assert_msg(strlen(str(o, "build_commit")) > 0, "empty build_commit");
    ck_assert_msg(num(o, "build_number") >= 0, "build_number %g", num(o, "build_number"));
    ck_assert_str_eq(str(o, "gpu_info"), ""); // the CPU backend, as llama-bench's
    // llama-bench's settings, as what tpinfer does (compare-llama-bench.py needs them)
    ck_assert_str_eq(str(o, "type_k"), "f16");
    ck_assert_str_eq(str(o, "type_v"), "f16");
    ck_assert_str_eq(str(o, "split_mode"), w->tp > 1 ? "row" : "layer");
    ck_assert_int_eq((int)num(o, "n_gpu_layers"), 0);
    ck_assert_str_eq(str(o, "cpu_mask"), "0x0");
    const char *tt = str(o, "test_time");
    ck_assert_msg(strlen(tt) == 20 && tt[4] == '-' && tt[10] == 'T' && tt[19] == 'Z',
                  "test_time '%s' is not ISO 8601 UTC", tt);
    ck_assert_msg(num(o, "model_size") > 1e6 && num(o, "model_n_params") > 1e6,
                  "model size %g / params %g", num(o, "model_size"), num(o, "model_n_params"));
    ck_assert_int_eq((int)num(o, "n_prompt"), w->n_prompt);
    ck_assert_int_eq((int)num(o, "n_gen"), w->n_gen);
    ck_assert_int_eq((int)num(o, "n_depth"), w->n_depth);
    ck_assert_int_eq((int)num(o, "tp"), w->tp);
    ck_assert_int_eq((int)num(o, "pp"), w->pp);
    ck_assert_int_eq((int)num(o, "n_threads"), 1);
    ck_assert_int_eq((int)num(o, "n_batch"), 2048);
    ck_assert_msg(num(o, "n_ubatch") >= 1, "n_ubatch %g", num(o, "n_ubatch"));

    double ns[16], ts[16], mean, sd;
    ck_assert_int_eq(arr(o, "samples_ns", ns, 16), REPS);
    ck_assert_int_eq(arr(o, "samples_ts", ts, 16), REPS);
    for (int i = 0; i < REPS; i++) {
        ck_assert_msg(ns[i] > 0, "samples_ns[%d] = %g", i, ns[i]);
        expect_close("samples_ts = tokens / seconds", ts[i],
                     1e9 * (w->n_prompt + w->n_gen) / ns[i], ts_rtol);
    }
    bench_mean_sd(ts, REPS, &mean, &sd);
    expect_close("avg_ts = mean(samples_ts)", num(o, "avg_ts"), mean, ts_rtol);
    expect_close("stddev_ts = sample stddev (n-1) of samples_ts", num(o, "stddev_ts"), sd,
                 ts_rtol + 1e-6 * mean / (sd > 0 ? sd : 1));
    bench_mean_sd(ns, REPS, &mean, &sd);
    ck_assert_msg(fabs(num(o, "avg_ns") - mean) <= 1.0, "avg_ns %g, mean of samples %g",
                  num(o, "avg_ns"), mean);
    ck_assert_msg(fabs(num(o, "stddev_ns") - sd) <= 1.0, "stddev_ns %g, want %g",
                  num(o, "stddev_ns"), sd);

    // Communicator traffic per repetition: 2 all-reduces per layer per forward under tp.
    const int n_forward = (w->n_prompt > 0 ? 1 : 0) + w->n_gen;
    if (w->tp == 2) {
        ck_assert_int_eq((long)num(o, "comm_allreduce_calls"), 2L * N_LAYER * n_forward);
        ck_assert_msg(num(o, "comm_allreduce_bytes") > 0, "no all-reduce bytes");
        ck_assert_int_eq((long)num(o, "comm_allgather_calls"), n_forward); // logits
    } else {
        ck_assert_int_eq((long)num(o, "comm_allreduce_calls"), 0);
    }
    if (w->pp == 2)
        ck_assert_msg(num(o, "comm_sendrecv_calls") > 0 && num(o, "comm_sendrecv_bytes") > 0,
                      "pp 2 without send/recv traffic");

    // Weight-read bandwidth: generation tests only, per rank and summed.
    double g[8];
    const int n_g = arr(o, "tg_weight_gbps_rank", g, 8);
    if (w->n_prompt == 0 && w->n_gen > 0) {
        ck_assert_int_eq(n_g, w->tp * w->pp);
        double s = 0;
        for (int i = 0; i < n_g; i++) {
            ck_assert_msg(g[i] > 0, "tg_weight_gbps_rank[%d] = %g", i, g[i]);
            s += g[i];
        }
        // CSV prints floats as "%f" (six decimals), so allow that rounding on top.
        const double gs = num(o, "tg_weight_gbps");
        ck_assert_msg(fabs(gs - s) <= 1e-6 * n_g + 1e-5 * fabs(s),
                      "tg_weight_gbps = sum over ranks: got %.9g, want %.9g", gs, s);
        // One token reads about the whole model once (the embedding table only a row).
        const double wb = num(o, "tg_weight_bytes"), size = num(o, "model_size");
        ck_assert_msg(wb > 0.5 * size && wb < 1.2 * size, "tg_weight_bytes %g vs model %g", wb,
                      size);
        // KV read per token, averaged over the test: token i attends depth + i + 1
        // positions, each K and V of every layer's KV heads (4 layers x 4 heads x 64,
        // f32 on the CPU); the GB/s column and roofline fraction count it with the weights.
        const double kv = num(o, "tg_kv_bytes");
        expect_close("tg_kv_bytes", kv,
                     (w->n_depth + (w->n_gen + 1) / 2.0) * N_LAYER * 4 * 64 * 2 * sizeof(float),
                     1e-6);
        expect_close("tg_read_gbps = tg_weight_gbps * (weights + KV) / weights",
                     num(o, "tg_read_gbps"), gs * (wb + kv) / wb, 1e-4);
    } else {
        ck_assert_int_eq(n_g, 0);
        ck_assert_msg(num(o, "tg_weight_gbps") == 0, "GB/s on a non-tg test");
        ck_assert_msg(num(o, "tg_kv_bytes") == 0 && num(o, "tg_read_gbps") == 0,
                      "KV bytes on a non-tg test");
    }
}

/* ---- JSON / JSONL --------------------------------------------------------------- */

static const char *BASE_ARGS = "-p 32 -n 8 -r 3 -t 1";

/* `tpinfer bench ARGS -o json` on np ranks must print one JSON array of two results,
 * checked against w[0] and w[1]. */
static void json_two_results(int np, const char *args, const struct want w[2]) {
    int code;
    char *out = run_bench(np, args, &code);
    char *err = read_stderr();
    ck_assert_msg(code == 0, "exit %d, stderr:\n%s", code, err);
    cJSON *doc = cJSON_Parse(out);
    ck_assert_msg(cJSON_IsArray(doc), "stdout is not one JSON array:\n%s", out);
    ck_assert_int_eq(cJSON_GetArraySize(doc), 2);
    for (int i = 0; i < 2; i++) check_result(cJSON_GetArrayItem(doc, i), &w[i], 1e-9);
    cJSON_Delete(doc);
    free(out);
    free(err);
}

START_TEST(test_json_tp2) {
    MODEL_OR_SKIP(path);
    char args[1024];
    snprintf(args, sizeof args, "-m %s %s --tp 2 -o json", path, BASE_ARGS);
    const struct want w[2] = {{32, 0, 0, 2, 1}, {0, 8, 0, 2, 1}};
    json_two_results(2, args, w);
}
END_TEST

/* Generation at depth: the KV bytes grow with the positions attended. */
START_TEST(test_json_depth) {
    MODEL_OR_SKIP(path);
    char args[1024];
    snprintf(args, sizeof args, "-m %s -p 0 -n 4 -d 0,24 -r 3 -t 1 -o json", path);
    const struct want w[2] = {{0, 4, 0, 1, 1}, {0, 4, 24, 1, 1}};
    json_two_results(1, args, w);
}
END_TEST

START_TEST(test_jsonl_pp2) {
    MODEL_OR_SKIP(path);
    char args[1024];
    snprintf(args, sizeof args, "-m %s %s --pp 2 -o jsonl", path, BASE_ARGS);
    int code;
    char *out = run_bench(2, args, &code);
    char *err = read_stderr();
    ck_assert_msg(code == 0, "exit %d, stderr:\n%s", code, err);
    struct want w[2] = {{32, 0, 0, 1, 2}, {0, 8, 0, 1, 2}};
    int n = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n"), n++) {
        cJSON *o = cJSON_Parse(line);
        ck_assert_msg(cJSON_IsObject(o), "line %d is not a JSON object: %s", n + 1, line);
        ck_assert_int_lt(n, 2);
        check_result(o, &w[n], 1e-9);
        cJSON_Delete(o);
    }
    ck_assert_int_eq(n, 2);
    free(out);
    free(err);
}
END_TEST

/* ---- CSV ------------------------------------------------------------------------ */

/* Split one CSV line (RFC 4180 quoting) into fields, in place. Returns the count. */
static int csv_split(char *line, char **fields, int cap) {
    int n = 0;
    char *p = line;
    for (;;) {
        char *start = p, *w = p;
        if (*p == '"') {
            p++;
            for (;;) {
                ck_assert_msg(*p, "unterminated quoted field in '%s'", line);
                if (*p == '"' && p[1] == '"') {
                    *w++ = '"';
                    p += 2;
                } else if (*p == '"') {
                    p++;
                    break;
                } else {
                    *w++ = *p++;
                }
            }
            ck_assert_msg(*p == ',' || *p == 0, "text after a closing quote in '%s'", line);
        } else {
            while (*p && *p != ',') *w++ = *p++;
        }
        const char sep = *p;
        *w = 0;
        if (n < cap) fields[n] = start;
        n++;
        if (!sep) break;
        p++;
    }
    return n;
}

/* A CSV row as the JSON object the checks read: numbers where they parse, arrays
 * from the ';'-separated sample fields. */
static cJSON *csv_row_to_json(char **hdr, char **val, int n) {
    cJSON *o = cJSON_CreateObject();
    for (int i = 0; i < n; i++) {
        const char *h = hdr[i], *v = val[i];
        if (!strcmp(h, "samples_ns") || !strcmp(h, "samples_ts") ||
            !strcmp(h, "tg_weight_gbps_rank")) {
            cJSON *a = cJSON_AddArrayToObject(o, h);
            char buf[1024];
            snprintf(buf, sizeof buf, "%s", v);
            for (char *t = strtok(buf, ";"); t; t = strtok(NULL, ";"))
                cJSON_AddItemToArray(a, cJSON_CreateNumber(strtod(t, NULL)));
            continue;
        }
        char *end;
        double d = strtod(v, &end);
        // llama-bench's text fields that may look like numbers ("0x0", "0.00")
        bool is_num = *v && !*end && strcmp(h, "build_commit") && strcmp(h, "cpu_mask") &&
                      strcmp(h, "tensor_split");
        if (is_num) cJSON_AddNumberToObject(o, h, d);
        else cJSON_AddStringToObject(o, h, v);
    }
    return o;
}

START_TEST(test_csv_tp2) {
    MODEL_OR_SKIP(path);
    char args[1024];
    snprintf(args, sizeof args, "-m %s %s --tp 2 -o csv", path, BASE_ARGS);
    int code;
    char *out = run_bench(2, args, &code);
    char *err = read_stderr();
    ck_assert_msg(code == 0, "exit %d, stderr:\n%s", code, err);
    char *lines[8];
    int n_lines = 0;
    for (char *l = strtok(out, "\n"); l && n_lines < 8; l = strtok(NULL, "\n")) lines[n_lines++] = l;
    ck_assert_msg(n_lines == 3, "want a header and 2 rows, got %d lines", n_lines);
    ck_assert_msg(lines[0][0] != '"', "the header is bare, as llama-bench's");
    char *hdr[96], *val[96];
    const int n_hdr = csv_split(lines[0], hdr, 96);
    ck_assert_int_le(n_hdr, 96);
    // llama-bench's fields first, in its order (test::get_fields), then ours
    static const char *llama[] = {
        "build_commit", "build_number", "cpu_info", "gpu_info", "backends", "model_filename",
        "model_type", "model_size", "model_n_params", "n_batch", "n_ubatch", "n_threads",
        "cpu_mask", "cpu_strict", "poll", "type_k", "type_v", "n_gpu_layers", "n_cpu_moe",
        "split_mode", "main_gpu", "no_kv_offload", "flash_attn", "devices", "tensor_split",
        "tensor_buft_overrides", "use_mmap", "use_direct_io", "embeddings", "no_op_offload",
        "no_host", "fit_target", "fit_min_ctx", "n_prompt", "n_gen", "n_depth", "test_time",
        "avg_ns", "stddev_ns", "avg_ts", "stddev_ts"};
    for (size_t k = 0; k < sizeof llama / sizeof llama[0]; k++)
        ck_assert_msg((int)k < n_hdr && !strcmp(hdr[k], llama[k]), "CSV column %zu is %s, not %s",
                      k, (int)k < n_hdr ? hdr[k] : "(none)", llama[k]);
    const char *need[] = {"build_commit", "build_number", "model_filename", "model_type", "model_size",
                          "model_n_params", "n_batch", "n_ubatch", "n_threads", "n_prompt",
                          "n_gen", "n_depth", "test_time", "avg_ns", "stddev_ns", "avg_ts",
                          "stddev_ts", "samples_ns", "samples_ts", "tp", "pp", "comm", "backends",
                          "gpu_info", "comm_allreduce_calls", "comm_allreduce_bytes",
                          "comm_sendrecv_bytes", "tg_weight_gbps"};
    for (size_t k = 0; k < sizeof need / sizeof need[0]; k++) {
        int found = 0;
        for (int i = 0; i < n_hdr; i++) found |= !strcmp(hdr[i], need[k]);
        ck_assert_msg(found, "CSV header lacks %s", need[k]);
    }
    struct want w[2] = {{32, 0, 0, 2, 1}, {0, 8, 0, 2, 1}};
    for (int r = 0; r < 2; r++) {
        ck_assert_msg(lines[1 + r][0] == '"', "row %d: values are quoted", r);
        const int n_val = csv_split(lines[1 + r], val, 96);
        ck_assert_int_eq(n_val, n_hdr);
        cJSON *o = csv_row_to_json(hdr, val, n_val);
        // CSV prints t/s with 6 decimals (std::to_string, as llama-bench).
        check_result(o, &w[r], 1e-5);
        cJSON_Delete(o);
    }
    free(out);
    free(err);
}
END_TEST

/* ---- markdown ------------------------------------------------------------------- */

START_TEST(test_md_tp2_depth) {
    MODEL_OR_SKIP(path);
    char args[1024];
    snprintf(args, sizeof args, "-m %s -p 16 -n 4 -d 0,24 -pg 8,2 -r 2 -t 1 --tp 2", path);
    int code;
    char *out = run_bench(2, args, &code);
    char *err = read_stderr();
    ck_assert_msg(code == 0, "exit %d, stderr:\n%s", code, err);
    ck_assert_msg(strncmp(out, "| model ", 8) == 0, "markdown must open with the header:\n%s", out);
    // The header's cells, trimmed, in order.
    const char *cols[] = {"model", "size", "params", "backend", "threads", "tp", "pp", "comm",
                          "test", "t/s", "GB/s"};
    const size_t n_cols = sizeof cols / sizeof cols[0];
    char hdr[1024];
    snprintf(hdr, sizeof hdr, "%.*s", (int)strcspn(out, "\n"), out);
    size_t n_cells = 0;
    char *save_h = NULL;
    for (char *c = strtok_r(hdr, "|", &save_h); c; c = strtok_r(NULL, "|", &save_h)) {
        while (*c == ' ') c++;
        size_t len = strlen(c);
        while (len > 0 && c[len - 1] == ' ') c[--len] = 0;
        ck_assert_msg(n_cells < n_cols && !strcmp(c, cols[n_cells]), "header cell %zu is '%s'",
                      n_cells, c);
        n_cells++;
    }
    ck_assert_int_eq(n_cells, n_cols);
    // One row per test: 3 tests (pp16, tg4, pp8+tg2) at 2 depths.
    const char *tests[] = {"pp16 |", "tg4 |", "pp8+tg2 |", "pp16 @ d24 |", "tg4 @ d24 |",
                           "pp8+tg2 @ d24 |"};
    int n_rows = 0;
    char *save = NULL;
    int line_no = 0;
    for (char *l = strtok_r(out, "\n", &save); l; l = strtok_r(NULL, "\n", &save), line_no++) {
        if (line_no < 2 || l[0] != '|') continue;
        ck_assert_msg(strstr(l, "qwen3 ?B Q4_K - Medium") && strstr(l, " CPU ") &&
                          strstr(l, " ± "),
                      "malformed row: %s", l);
        ck_assert_msg(strstr(l, tests[n_rows < 6 ? n_rows : 5]) != NULL, "row %d is not %s: %s",
                      n_rows, tests[n_rows < 6 ? n_rows : 5], l);
        n_rows++;
    }
    ck_assert_int_eq(n_rows, 6);
    free(out);
    free(err);
}
END_TEST

/* Swept batch sizes get their columns, so the rows say which is which; the footer names
 * the build as llama-bench's does ("build: COMMIT (NUMBER)"). */
START_TEST(test_md_sweep) {
    MODEL_OR_SKIP(path);
    char args[1024];
    snprintf(args, sizeof args, "-m %s -p 8 -n 0 -b 4,8 -ub 4 -r 1 -t 1 --no-warmup", path);
    int code;
    char *out = run_bench(0, args, &code);
    ck_assert_msg(code == 0, "exit %d", code);
    ck_assert_msg(strstr(out, "| backend | threads | n_batch | n_ubatch |  tp |"), "header:\n%s",
                  out);
    ck_assert_msg(strstr(out, "| CPU     |       1 |       4 |        4 |   1 |") &&
                      strstr(out, "| CPU     |       1 |       8 |        4 |   1 |"),
                  "rows:\n%s", out);
    char commit[64];
    long number = -1;
    const char *foot = strstr(out, "\nbuild: ");
    ck_assert_msg(foot && sscanf(foot, "\nbuild: %63s (%ld)", commit, &number) == 2 && number >= 0,
                  "footer:\n%s", out);
    free(out);
}
END_TEST

/* ---- errors --------------------------------------------------------------------- */

START_TEST(test_error_tp_world) {
    MODEL_OR_SKIP(path);
    char args[1024];
    snprintf(args, sizeof args, "-m %s -p 8 -n 2 -r 1 -t 1 --tp 2", path);
    int code;
    char *out = run_bench(0, args, &code);
    char *err = read_stderr();
    ck_assert_int_eq(code, 1);
    ck_assert_msg(strstr(err, "needs 2 ranks") != NULL, "unclear message:\n%s", err);
    ck_assert_msg(out[0] == 0, "stdout should be empty on an error:\n%s", out);
    free(out);
    free(err);
}
END_TEST

START_TEST(test_error_missing_model) {
    int code;
    char *out = run_bench(2, "-m /nonexistent/model.gguf -p 8 -n 2 -r 1 -t 1 --tp 2", &code);
    char *err = read_stderr();
    // Every rank exits 1 (mpirun reports the first non-zero code), no hang (timeout: 124).
    ck_assert_msg(code == 1, "exit %d, stderr:\n%s", code, err);
    ck_assert_msg(strstr(err, "/nonexistent/model.gguf") != NULL, "message lacks the path:\n%s",
                  err);
    ck_assert_msg(out[0] == 0, "stdout should be empty on an error:\n%s", out);
    free(out);
    free(err);
}
END_TEST

/* llama-bench's ranges: -p 4-16*2 is 4, 8, 16; -n 1-7+3,9 is 1, 4, 7, 9 (one tg row
 * each); a range that does not end or runs backwards is a usage error. */
START_TEST(test_ranges) {
    MODEL_OR_SKIP(path);
    char args[1024];
    snprintf(args, sizeof args, "-m %s -p 4-16*2 -n 1-7+3,9 -r 1 -t 1 -o jsonl", path);
    int code;
    char *out = run_bench(0, args, &code);
    ck_assert_int_eq(code, 0);
    static const int want[][2] = {{4, 0}, {8, 0}, {16, 0}, {0, 1}, {0, 4}, {0, 7}, {0, 9}};
    int n = 0;
    for (char *l = strtok(out, "\n"); l; l = strtok(NULL, "\n"), n++) {
        cJSON *o = cJSON_Parse(l);
        ck_assert_int_lt(n, 7);
        ck_assert_int_eq((int)num(o, "n_prompt"), want[n][0]);
        ck_assert_int_eq((int)num(o, "n_gen"), want[n][1]);
        cJSON_Delete(o);
    }
    ck_assert_int_eq(n, 7);
    free(out);
    static const char *bad[] = {"4-8*1", "8-4", "4-8+0", "0-8*2", "4-"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, "-m %s -p %s -n 0", path, bad[i]);
        out = run_bench(0, args, &code);
        char *err = read_stderr();
        ck_assert_msg(code == 2 && strstr(err, "ranges FIRST-LAST"), "-p %s: exit %d: %s", bad[i],
                      code, err);
        free(out);
        free(err);
    }
    // -r is one count (a list ran its first value only).
    snprintf(args, sizeof args, "-m %s -p 4 -n 0 -r 1,3", path);
    out = run_bench(0, args, &code);
    char *err = read_stderr();
    ck_assert_msg(code == 2 && strstr(err, "-r takes one count, got '1,3'"), "-r 1,3: exit %d: %s",
                  code, err);
    free(out);
    free(err);
}
END_TEST

/* A model that cannot be loaded is skipped, as llama-bench skips it: the next one runs
 * and the exit status is 1. Without -t, a rank's row reports the threads it ran with
 * (its share of the node's cores under mpirun, which the load table names too). */
START_TEST(test_skip_missing_and_threads) {
    MODEL_OR_SKIP(path);
    char args[1024];
    snprintf(args, sizeof args, "-m /nonexistent/model.gguf,%s -p 8 -n 0 -r 1 --tp 2 -o jsonl",
             path);
    int code;
    char *out = run_bench(2, args, &code);
    char *err = read_stderr();
    ck_assert_msg(code == 1, "exit %d, stderr:\n%s", code, err);
    ck_assert_msg(strstr(err, "/nonexistent/model.gguf"), "no error for the missing model:\n%s",
                  err);
    cJSON *row = cJSON_Parse(out);
    ck_assert_msg(row && strstr(str(row, "model_filename"), MODEL), "no row of the next model:\n%s",
                  out);
    char want[64];
    snprintf(want, sizeof want, "CPU, %d thread", (int)num(row, "n_threads"));
    ck_assert_msg(strstr(err, want), "the row's n_threads is not the load's (%s):\n%s", want, err);
    cJSON_Delete(row);
    free(out);
    free(err);
}
END_TEST

/* Every test of a long sweep runs: 64 prompt sizes x 9 batch sizes are 576 tests, one
 * JSONL row each (a fixed table of 512 once cut the rest without a word). */
START_TEST(test_many_tests) {
    MODEL_OR_SKIP(model);
    char args[1024];
    int o = snprintf(args, sizeof args, "-m %s -n 0 -b 1,2,3,4,5,6,7,8,9 -r 1 -t 1 --no-warmup "
                                        "-o jsonl -p 1", model);
    for (int i = 1; i < 64; i++) o += snprintf(args + o, sizeof args - (size_t)o, ",1");
    int code;
    char *out = run_bench(0, args, &code);
    int rows = 0;
    for (const char *p = out; (p = strchr(p, '\n')); p++) rows++;
    ck_assert_msg(code == 0 && rows == 576, "exit %d, %d rows", code, rows);
    free(out);
}
END_TEST

/* ---- the formatting helpers ----------------------------------------------------- */

START_TEST(test_names) {
    ck_assert_str_eq(bench_ftype_name(15), "Q4_K - Medium");
    ck_assert_str_eq(bench_ftype_name(17), "Q5_K - Medium");
    ck_assert_str_eq(bench_ftype_name(18), "Q6_K");
    ck_assert_str_eq(bench_ftype_name(30), "IQ4_XS - 4.25 bpw"); /* llama_model_ftype_name */
    ck_assert_str_eq(bench_ftype_name(7), "Q8_0");
    ck_assert_str_eq(bench_ftype_name(32), "BF16");
    ck_assert_str_eq(bench_ftype_name(1), "F16");
    ck_assert_str_eq(bench_ftype_name(2), "Q4_0");
    ck_assert_str_eq(bench_ftype_name(0), "all F32");
    ck_assert_str_eq(bench_ftype_name(-1), "?");
    // llama.cpp's names (load_arch_hparams): Qwen3-8B, -0.6B, -4B, -32B; Qwen2.5-0.5B (896
    // wide: "1B" there), -1.5B, -7B, -72B ("70B").
    ck_assert_str_eq(bench_size_class("qwen3", 36, 4096, 32), "8B");
    ck_assert_str_eq(bench_size_class("qwen3", 28, 1024, 16), "0.6B");
    ck_assert_str_eq(bench_size_class("qwen3", 36, 2560, 32), "4B");
    ck_assert_str_eq(bench_size_class("qwen3", 64, 5120, 64), "32B");
    ck_assert_str_eq(bench_size_class("qwen2", 24, 896, 14), "1B");
    ck_assert_str_eq(bench_size_class("qwen2", 28, 1536, 12), "1.5B");
    ck_assert_str_eq(bench_size_class("qwen2", 28, 3584, 28), "7B");
    ck_assert_str_eq(bench_size_class("qwen2", 80, 8192, 64), "70B");
    ck_assert_str_eq(bench_size_class("qwen3", 4, 512, 8), "?B");
    char buf[128];
    bench_model_type(buf, sizeof buf, "qwen3", 36, 4096, 32, 15);
    ck_assert_str_eq(buf, "qwen3 8B Q4_K - Medium");
    bench_model_type(buf, sizeof buf, "qwen3", 4, 512, 8, 32);
    ck_assert_str_eq(buf, "qwen3 ?B BF16");
    bench_test_name(buf, sizeof buf, 512, 0, 0);
    ck_assert_str_eq(buf, "pp512");
    bench_test_name(buf, sizeof buf, 0, 128, 0);
    ck_assert_str_eq(buf, "tg128");
    bench_test_name(buf, sizeof buf, 512, 0, 8192);
    ck_assert_str_eq(buf, "pp512 @ d8192");
    bench_test_name(buf, sizeof buf, 512, 128, 0);
    ck_assert_str_eq(buf, "pp512+tg128");
    const double x[4] = {1, 2, 3, 4};
    double m, sd;
    bench_mean_sd(x, 4, &m, &sd);
    expect_close("mean", m, 2.5, 1e-12);
    expect_close("sample sd", sd, sqrt(5.0 / 3.0), 1e-12);
    bench_mean_sd(x, 1, &m, &sd);
    ck_assert_msg(sd == 0, "sd of one sample is 0");
}
END_TEST

int main(void) {
    // Without the model only the helpers could run: report the whole test as skipped.
    if (!tu_data_or_skip(MODEL)) return TU_SKIP;
    Suite *s = suite_create("bench");
    TCase *tc = tcase_create("bench");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_names);
    tcase_add_test(tc, test_error_tp_world);
    tcase_add_test(tc, test_error_missing_model);
    tcase_add_test(tc, test_skip_missing_and_threads);
    tcase_add_test(tc, test_ranges);
    tcase_add_test(tc, test_many_tests);
    tcase_add_test(tc, test_json_tp2);
    tcase_add_test(tc, test_json_depth);
    tcase_add_test(tc, test_jsonl_pp2);
    tcase_add_test(tc, test_csv_tp2);
    tcase_add_test(tc, test_md_tp2_depth);
    tcase_add_test(tc, test_md_sweep);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
