/*
 * bench_report.c — see bench_report.h. The formats follow llama-bench so that
 * tables and scripts written for it read ours: the same markdown columns and
 * widths (plus tp, pp, comm, GB/s), CSV with a bare header and every value
 * double-quoted, JSON as one array of objects, JSONL one object per line, and
 * the same field names for the shared fields.
 */
#include "bench_report.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void bench_mean_sd(const double *x, int n, double *mean, double *sd) {
    double s = 0;
    for (int i = 0; i < n; i++) s += x[i];
    const double m = n > 0 ? s / n : 0;
    // Two passes: the one-pass sum-of-squares form loses digits when the spread
    // is small against the mean, which is the usual case for timings.
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (x[i] - m) * (x[i] - m);
    *mean = m;
    *sd = n > 1 ? sqrt(ss / (n - 1)) : 0;
}

void bench_samples_ts(const struct bench_result *r, double *ts) {
    const double n_tokens = (double)r->n_prompt + r->n_gen;
    for (int i = 0; i < r->n_samples; i++)
        ts[i] = r->samples_ns[i] > 0 ? 1e9 * n_tokens / (double)r->samples_ns[i] : 0;
}

const char *bench_ftype_name(int64_t ftype) {
    // llama.cpp's llama_model_ftype_name, for the file types GGUF Qwen models come in.
    switch (ftype) {
    case 0: return "all F32";
    case 1: return "F16";
    case 2: return "Q4_0";
    case 3: return "Q4_1";
    case 7: return "Q8_0";
    case 8: return "Q5_0";
    case 9: return "Q5_1";
    case 10: return "Q2_K - Medium";
    case 11: return "Q3_K - Small";
    case 12: return "Q3_K - Medium";
    case 13: return "Q3_K - Large";
    case 14: return "Q4_K - Small";
    case 15: return "Q4_K - Medium";
    case 16: return "Q5_K - Small";
    case 17: return "Q5_K - Medium";
    case 18: return "Q6_K";
    case 25: return "IQ4_NL - 4.5 bpw";
    case 30: return "IQ4_XS - 4.25 bpw";
    case 32: return "BF16";
    default: return "?";
    }
}

/* llama.cpp's size class ("8B", "0.6B"; "?B": unknown), chosen as its model loader
 * chooses it (load_arch_hparams of qwen2 and qwen3): by layer count, then width. */
const char *bench_size_class(const char *arch, int n_layer, int n_embd, int n_head) {
    if (!strcmp(arch, "qwen2")) switch (n_layer) {
        case 24: return n_embd == 1024 ? "0.5B" : "1B";
        case 28: return n_embd == 1536 ? "1.5B" : "7B";
        case 32: return "7B";
        case 36: return "3B";
        case 40: return n_head == 20 ? "4B" : "13B";
        case 48: return "14B";
        case 64: return "32B";
        case 80: return "70B";
        }
    if (!strcmp(arch, "qwen3")) switch (n_layer) {
        case 28: return n_embd == 1024 ? "0.6B" : "1.7B";
        case 36: return n_embd == 2560 ? "4B" : "8B";
        case 40: return "14B";
        case 64: return "32B";
        }
    return "?B";
}

void bench_model_type(char *buf, size_t n, const char *arch, int n_layer, int n_embd, int n_head,
                      int64_t ftype) {
    snprintf(buf, n, "%s %s %s", arch, bench_size_class(arch, n_layer, n_embd, n_head),
             bench_ftype_name(ftype));
}

void bench_test_name(char *buf, size_t n, int n_prompt, int n_gen, int n_depth) {
    if (n_prompt > 0 && n_gen == 0) snprintf(buf, n, "pp%d", n_prompt);
    else if (n_gen > 0 && n_prompt == 0) snprintf(buf, n, "tg%d", n_gen);
    else snprintf(buf, n, "pp%d+tg%d", n_prompt, n_gen);
    if (n_depth > 0) {
        size_t len = strlen(buf);
        snprintf(buf + len, n - len, " @ d%d", n_depth);
    }
}

/* ---- markdown ------------------------------------------------------------- */

/* Column name and width; negative widths are left-aligned (strings), as llama-bench. */
struct md_col {
    const char *name;
    int width;
};
static const struct md_col md_cols[] = {
    {"model", -30}, {"size", 10}, {"params", 10}, {"backend", -7}, {"tp", 3}, {"pp", 3},
    {"comm", -5},   {"test", 15}, {"t/s", 20},    {"GB/s", 9},     {"% roof", 6},
};
#define MD_N_COLS (sizeof md_cols / sizeof md_cols[0])

/* The optional columns (after "backend"), in llama-bench's order and widths. */
static const struct md_col md_extra[] = {{"threads", 7}, {"n_batch", 7}, {"n_ubatch", 8}};
#define MD_EXTRA_AFTER 4 /* model, size, params, backend */

static void md_col_heads(FILE *f, const struct md_col *c, size_t n, bool rule) {
    for (size_t i = 0; i < n; i++) {
        if (!rule) {
            fprintf(f, " %*s |", c[i].width, c[i].name);
            continue;
        }
        fputc(' ', f);
        for (int k = 0; k < abs(c[i].width) - 1; k++) fputc('-', f);
        fprintf(f, "%s |", c[i].width > 0 ? ":" : "-");
    }
}

static void md_header(FILE *f, bool roofline, unsigned extra) {
    const size_t n = roofline ? MD_N_COLS : MD_N_COLS - 1;
    for (int rule = 0; rule < 2; rule++) {
        fprintf(f, "|");
        md_col_heads(f, md_cols, MD_EXTRA_AFTER, rule);
        for (size_t i = 0; i < 3; i++)
            if (extra & (1u << i)) md_col_heads(f, &md_extra[i], 1, rule);
        md_col_heads(f, md_cols + MD_EXTRA_AFTER, n - MD_EXTRA_AFTER, rule);
        fprintf(f, "\n");
    }
}

/* The backend as llama-bench spells it ("CPU", "CUDA"): the markdown column and
 * the backends field. */
static const char *backend_name(const char *b) {
    return !b ? "" : !strcmp(b, "cpu") ? "CPU" : !strcmp(b, "cuda") ? "CUDA" : b;
}

static void md_row(FILE *f, const struct bench_result *r, unsigned extra) {
    char size[32], params[32], test[64], ts_buf[64], gbps[32], roof[32];
    if (r->model_size < 1024ull * 1024 * 1024)
        snprintf(size, sizeof size, "%.2f MiB", (double)r->model_size / 1024.0 / 1024.0);
    else
        snprintf(size, sizeof size, "%.2f GiB", (double)r->model_size / 1024.0 / 1024.0 / 1024.0);
    if (r->model_n_params < 1000ull * 1000 * 1000)
        snprintf(params, sizeof params, "%.2f M", (double)r->model_n_params / 1e6);
    else
        snprintf(params, sizeof params, "%.2f B", (double)r->model_n_params / 1e9);
    bench_test_name(test, sizeof test, r->n_prompt, r->n_gen, r->n_depth);
    double ts[r->n_samples > 0 ? r->n_samples : 1], mean, sd;
    bench_samples_ts(r, ts);
    bench_mean_sd(ts, r->n_samples, &mean, &sd);
    snprintf(ts_buf, sizeof ts_buf, "%.2f ± %.2f", mean, sd);
    snprintf(gbps, sizeof gbps, "%s", "-");
    snprintf(roof, sizeof roof, "%s", "-");
    if (r->has_gbps) {
        snprintf(gbps, sizeof gbps, "%.2f", r->read_gbps);
        if (r->roofline_gbps > 0)
            snprintf(roof, sizeof roof, "%.1f",
                     100.0 * r->read_gbps / (r->roofline_gbps * r->roofline_devices));
    }
    // "±" is two bytes of UTF-8 but one column: widen by one as llama-bench does.
    fprintf(f, "| %-30s | %10s | %10s | %-7s |", r->model_type, size, params,
            backend_name(r->backend));
    const int extra_v[3] = {r->n_threads, r->n_batch, r->n_ubatch};
    for (int i = 0; i < 3; i++)
        if (extra & (1u << i)) fprintf(f, " %*d |", md_extra[i].width, extra_v[i]);
    fprintf(f, " %3d | %3d | %-5s | %15s | %21s | %9s |", r->tp, r->pp, r->comm, test, ts_buf,
            gbps);
    if (r->roofline_gbps > 0) fprintf(f, " %6s |", roof);
    fprintf(f, "\n");
}

/* ---- csv / json ----------------------------------------------------------- */

/* One field of the machine-readable formats. */
enum fkind { F_STR, F_INT, F_BOOL, F_FLOAT, F_ARR_U64, F_ARR_F64 };
struct field {
    const char *name;
    enum fkind kind;
    const char *s;
    double v;
    const void *arr;
    int n_arr;
};

#define N_FIELDS_MAX 96

/* The fields of r in output order. ts holds n_samples t/s values. */
static int collect_fields(const struct bench_result *r, const double *ts, struct field *fl) {
    int n = 0;
    double mean_ts, sd_ts, mean_ns, sd_ns;
    double ns[r->n_samples > 0 ? r->n_samples : 1];
    for (int i = 0; i < r->n_samples; i++) ns[i] = (double)r->samples_ns[i];
    bench_mean_sd(ts, r->n_samples, &mean_ts, &sd_ts);
    bench_mean_sd(ns, r->n_samples, &mean_ns, &sd_ns);
#define S(nm, val) fl[n++] = (struct field){.name = nm, .kind = F_STR, .s = (val) ? (val) : ""}
#define I(nm, val) fl[n++] = (struct field){.name = nm, .kind = F_INT, .v = (double)(val)}
#define D(nm, val) fl[n++] = (struct field){.name = nm, .kind = F_FLOAT, .v = (val)}
#define B(nm, val) fl[n++] = (struct field){.name = nm, .kind = F_BOOL, .v = (val) ? 1 : 0}
    // llama-bench's fields in its order (test::get_fields), then ours: its own tools
    // (compare-llama-bench.py) read these rows. The settings it has and tpinfer has not
    // are written as what tpinfer does: f16 K/V, every layer on the GPU (-ngl 99) with
    // CUDA, a tensor-parallel split as llama.cpp's "row", the weights mmap'ed, flash
    // attention on CUDA (the CPU's attention computes the whole score row), no polling.
    const bool cuda = r->backend && !strcmp(r->backend, "cuda");
    S("build_commit", r->build_commit);
    I("build_number", r->build_number);
    S("cpu_info", r->cpu_info);
    S("gpu_info", r->gpu_info);
    S("backends", backend_name(r->backend));
    S("model_filename", r->model_filename);
    S("model_type", r->model_type);
    I("model_size", r->model_size);
    I("model_n_params", r->model_n_params);
    I("n_batch", r->n_batch);
    I("n_ubatch", r->n_ubatch);
    I("n_threads", r->n_threads);
    S("cpu_mask", "0x0");
    B("cpu_strict", false);
    I("poll", 0);
    S("type_k", "f16");
    S("type_v", "f16");
    I("n_gpu_layers", cuda ? 99 : 0);
    I("n_cpu_moe", 0);
    S("split_mode", r->tp > 1 ? "row" : "layer");
    I("main_gpu", 0);
    B("no_kv_offload", false);
    B("flash_attn", cuda);
    S("devices", "auto");
    S("tensor_split", "0.00");
    S("tensor_buft_overrides", "none");
    B("use_mmap", true);
    B("use_direct_io", false);
    B("embeddings", false);
    I("no_op_offload", 0);
    B("no_host", false);
    I("fit_target", 0);
    I("fit_min_ctx", 0);
    I("n_prompt", r->n_prompt);
    I("n_gen", r->n_gen);
    I("n_depth", r->n_depth);
    S("test_time", r->test_time);
    // llama-bench truncates the nanosecond statistics to integers.
    I("avg_ns", (uint64_t)mean_ns);
    I("stddev_ns", (uint64_t)sd_ns);
    D("avg_ts", mean_ts);
    D("stddev_ts", sd_ts);
    I("tp", r->tp);
    I("pp", r->pp);
    S("comm", r->comm);
    fl[n++] = (struct field){.name = "samples_ns", .kind = F_ARR_U64, .arr = r->samples_ns,
                             .n_arr = r->n_samples};
    fl[n++] = (struct field){.name = "samples_ts", .kind = F_ARR_F64, .arr = ts,
                             .n_arr = r->n_samples};
    const struct bench_comm_counts *c = &r->comm_per_rep;
    I("comm_allreduce_calls", c->allreduce_calls);
    I("comm_allreduce_bytes", c->allreduce_bytes);
    I("comm_allgather_calls", c->allgather_calls);
    I("comm_allgather_bytes", c->allgather_bytes);
    I("comm_sendrecv_calls", c->sendrecv_calls);
    I("comm_sendrecv_bytes", c->sendrecv_bytes);
    I("comm_bcast_calls", c->bcast_calls);
    I("comm_bcast_bytes", c->bcast_bytes);
    // Bandwidth: 0 for tests that are not pure generation (pp, pp+tg).
    D("tg_weight_bytes", r->has_gbps ? r->weight_bytes_per_token : 0);
    D("tg_weight_gbps", r->has_gbps ? r->gbps_sum : 0);
    fl[n++] = (struct field){.name = "tg_weight_gbps_rank", .kind = F_ARR_F64,
                             .arr = r->gbps_rank, .n_arr = r->has_gbps ? r->n_ranks : 0};
    D("tg_kv_bytes", r->has_gbps ? r->kv_bytes_per_token : 0);
    D("tg_read_gbps", r->has_gbps ? r->read_gbps : 0);
    D("roofline_gbps", r->roofline_gbps);
    D("tg_roofline_frac", r->has_gbps && r->roofline_gbps > 0
                              ? r->read_gbps / (r->roofline_gbps * r->roofline_devices)
                              : 0);
#undef S
#undef I
#undef D
#undef B
    return n;
}

/* The header's field names come from a dummy result, so header and rows cannot drift. */
static void csv_header(FILE *f) {
    struct bench_result r = {0};
    struct field fl[N_FIELDS_MAX];
    int n = collect_fields(&r, NULL, fl);
    for (int i = 0; i < n; i++) fprintf(f, "%s%s", i ? "," : "", fl[i].name);
    fprintf(f, "\n");
}

/* A value quoted as llama-bench does: in double quotes, inner quotes doubled. */
static void csv_quoted(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

static void csv_row(FILE *f, const struct bench_result *r, const double *ts) {
    struct field fl[N_FIELDS_MAX];
    int n = collect_fields(r, ts, fl);
    for (int i = 0; i < n; i++) {
        if (i) fputc(',', f);
        char buf[64];
        switch (fl[i].kind) {
        case F_STR: csv_quoted(f, fl[i].s); break;
        case F_INT:
        case F_BOOL: // llama-bench writes a bool as 0 / 1 in CSV
            snprintf(buf, sizeof buf, "%.0f", fl[i].v);
            csv_quoted(f, buf);
            break;
        case F_FLOAT:
            snprintf(buf, sizeof buf, "%f", fl[i].v); // std::to_string's format
            csv_quoted(f, buf);
            break;
        case F_ARR_U64:
        case F_ARR_F64: {
            // Arrays: the values separated by ';' inside one quoted field.
            fputc('"', f);
            for (int k = 0; k < fl[i].n_arr; k++) {
                if (fl[i].kind == F_ARR_U64)
                    fprintf(f, "%s%llu", k ? ";" : "",
                            (unsigned long long)((const uint64_t *)fl[i].arr)[k]);
                else
                    fprintf(f, "%s%f", k ? ";" : "", ((const double *)fl[i].arr)[k]);
            }
            fputc('"', f);
            break;
        }
        }
    }
    fputc('\n', f);
}

static cJSON *json_object(const struct bench_result *r, const double *ts) {
    struct field fl[N_FIELDS_MAX];
    int n = collect_fields(r, ts, fl);
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    for (int i = 0; i < n; i++) {
        switch (fl[i].kind) {
        case F_STR: cJSON_AddStringToObject(o, fl[i].name, fl[i].s); break;
        case F_BOOL: cJSON_AddBoolToObject(o, fl[i].name, fl[i].v != 0); break;
        case F_INT:
        case F_FLOAT: cJSON_AddNumberToObject(o, fl[i].name, fl[i].v); break;
        case F_ARR_U64:
        case F_ARR_F64: {
            cJSON *a = cJSON_AddArrayToObject(o, fl[i].name);
            for (int k = 0; a && k < fl[i].n_arr; k++) {
                double v = fl[i].kind == F_ARR_U64 ? (double)((const uint64_t *)fl[i].arr)[k]
                                                   : ((const double *)fl[i].arr)[k];
                cJSON_AddItemToArray(a, cJSON_CreateNumber(v));
            }
            break;
        }
        }
    }
    return o;
}

/* ---- the printers --------------------------------------------------------- */

void bench_print_header(FILE *f, enum bench_format fmt, bool roofline, unsigned md_cols) {
    switch (fmt) {
    case BENCH_MD: md_header(f, roofline, md_cols); break;
    case BENCH_CSV: csv_header(f); break;
    case BENCH_JSON: fprintf(f, "[\n"); break;
    case BENCH_JSONL: break;
    }
    fflush(f);
}

void bench_print_result(FILE *f, enum bench_format fmt, const struct bench_result *r, bool first,
                        unsigned md_cols) {
    double ts[r->n_samples > 0 ? r->n_samples : 1];
    bench_samples_ts(r, ts);
    if (fmt == BENCH_MD) {
        md_row(f, r, md_cols);
    } else if (fmt == BENCH_CSV) {
        csv_row(f, r, ts);
    } else {
        cJSON *o = json_object(r, ts);
        char *text = o ? (fmt == BENCH_JSON ? cJSON_Print(o) : cJSON_PrintUnformatted(o)) : NULL;
        if (fmt == BENCH_JSON) fprintf(f, "%s%s", first ? "" : ",\n", text ? text : "{}");
        else fprintf(f, "%s\n", text ? text : "{}");
        free(text);
        cJSON_Delete(o);
    }
    fflush(f);
}

void bench_print_footer(FILE *f, enum bench_format fmt, const char *build_commit,
                        long build_number) {
    if (fmt == BENCH_MD) fprintf(f, "\nbuild: %s (%ld)\n", build_commit, build_number);
    else if (fmt == BENCH_JSON) fprintf(f, "\n]\n");
    fflush(f);
}
