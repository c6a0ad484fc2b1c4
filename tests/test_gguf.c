/*
 * test_gguf.c — the GGUF reader against files written by llama.cpp's `gguf`
 * package and llama-quantize (metadata as ../shared/data/README.md states,
 * tensor table and dequantized values as NAME.tensors.json records), writer →
 * reader round trips of every value type and tensor bytes, the streaming
 * writer, and a 3-part split set.
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "kernels/quant.h"
#include "testutil.h"

/* ---- helpers ------------------------------------------------------------------- */


static struct gguf_file *open_ok(const char *path) {
    struct gguf_file *f = NULL;
    struct tpi_error err;
    tpi_err_clear(&err);
    int st = gguf_open(path, &f, &err);
    if (st) fprintf(stderr, "gguf_open(%s): %s\n", path, err.msg);
    ck_assert_int_eq(st, TPI_OK);
    ck_assert_ptr_nonnull(f);
    return f;
}

static int64_t get_int(const struct gguf_file *f, const char *key) {
    int64_t v = -12345;
    if (!gguf_get_int(f, key, &v)) ck_abort_msg("%s: integer key '%s' missing", gguf_path(f), key);
    return v;
}

static bool str_is(struct gguf_str s, const char *want) {
    return s.len == strlen(want) && !memcmp(s.data, want, s.len);
}

/* ---- reference files ---------------------------------------------------------------- */

struct model_ref {
    const char *name, *arch;
    int n_layer;
};

static const struct model_ref g_models[] = {
    {"qwen2-tiny-f16", "qwen2", 2},    {"qwen2-tiny-q4_0", "qwen2", 2},
    {"qwen2-tiny-q5_k_m", "qwen2", 2}, {"qwen3-tiny-bf16", "qwen3", 4},
    {"qwen3-tiny-q4_k_m", "qwen3", 4}, {"qwen3-tiny-q6_k", "qwen3", 4},
    {"qwen3-tiny-q8_0", "qwen3", 4},   {"qwen3-tiny-q2_k", "qwen3", 4},
    {"qwen2-tiny-q3_k_m", "qwen2", 2}, {"qwen2-tiny-iq4_xs", "qwen2", 2},
};
#define N_MODELS ((int)(sizeof g_models / sizeof g_models[0]))

/* Hyperparameters and tokenizer facts from ../shared/data/README.md. */
static void check_model_metadata(const struct gguf_file *f, const struct model_ref *m) {
    char key[128];
    struct gguf_str s;
    ck_assert(gguf_get_str(f, "general.architecture", &s));
    ck_assert_msg(str_is(s, m->arch), "%s: arch '%.*s'", m->name, (int)s.len, s.data);
#define ARCH_KEY(k) (snprintf(key, sizeof key, "%s." k, m->arch), key)
    ck_assert_int_eq(get_int(f, ARCH_KEY("block_count")), m->n_layer);
    ck_assert_int_eq(get_int(f, ARCH_KEY("embedding_length")), 512);
    ck_assert_int_eq(get_int(f, ARCH_KEY("attention.head_count")), 8);
    ck_assert_int_eq(get_int(f, ARCH_KEY("attention.head_count_kv")), 4);
    ck_assert_int_eq(get_int(f, ARCH_KEY("feed_forward_length")), 1024);
    ck_assert_int_eq(get_int(f, ARCH_KEY("context_length")), 4096);
    float freq = 0, eps = 0;
    ck_assert(gguf_get_f32(f, ARCH_KEY("rope.freq_base"), &freq));
    ck_assert_float_eq(freq, 1e6f);
    ck_assert(gguf_get_f32(f, ARCH_KEY("attention.layer_norm_rms_epsilon"), &eps));
    ck_assert_float_eq(eps, 1e-6f);
#undef ARCH_KEY
    const struct gguf_kv *tokens = gguf_find_kv(f, "tokenizer.ggml.tokens");
    ck_assert_ptr_nonnull(tokens);
    ck_assert_int_eq(tokens->arr_type, GGUF_VT_STRING);
    ck_assert_uint_eq(tokens->arr_n, 2048);
    ck_assert_int_eq(get_int(f, "tokenizer.ggml.eos_token_id"), 2047);
    ck_assert_int_eq(get_int(f, "tokenizer.ggml.bos_token_id"), 2045);
    ck_assert_int_eq(get_int(f, "tokenizer.ggml.padding_token_id"), 2045);
    ck_assert(gguf_get_str(f, "tokenizer.ggml.pre", &s) && str_is(s, "qwen2"));
    struct gguf_str *strs;
    uint64_t n;
    ck_assert_int_eq(gguf_arr_strings(tokens, &strs, &n, NULL), TPI_OK);
    ck_assert_uint_eq(n, 2048);
    ck_assert(str_is(strs[2047], "<|im_end|>"));
    ck_assert(str_is(strs[2045], "<|endoftext|>"));
    free(strs);
    ck_assert_uint_eq(gguf_version(f), 3);
    ck_assert_uint_eq(gguf_alignment(f), 32);
}

/* Tolerances against the `gguf` package's float32 dequantization:
 *  - first 16 values: |got - want| <= 1e-6 + 1e-5 |want| (same arithmetic, at
 *    most a rounding-order difference of an ulp or two);
 *  - sum of squares: relative 1e-5;
 *  - sum: 1e-6 * sqrt(n * sumsq), i.e. a relative 1e-6 per element bounded by
 *    Cauchy-Schwarz (sum |x| <= sqrt(n sumsq)), since the sum itself may cancel
 *    to near zero.
 * Both sides accumulate in float64. */
/* Worst errors over a model's tensors, printed once per model. */
struct value_errs {
    double first16_abs, sum_over_tol, sumsq_rel;
};

static void check_tensor_values(const char *model, const struct gguf_tensor *t, const cJSON *jt,
                                struct value_errs *worst) {
    int64_t ne0 = t->ne[0], n_rows = t->ne[1] * t->ne[2] * t->ne[3];
    const int64_t chunk_rows = 64;
    float *buf = malloc((size_t)(ne0 * chunk_rows) * sizeof *buf);
    ck_assert_ptr_nonnull(buf);
    double sum = 0, sumsq = 0;
    float first16[16];
    int n_first = 0;
    size_t row_bytes = quant_row_size(t->type, ne0);
    for (int64_t r0 = 0; r0 < n_rows; r0 += chunk_rows) {
        int64_t nr = TPI_MIN(chunk_rows, n_rows - r0);
        struct tpi_error err;
        tpi_err_clear(&err);
        /* Pass the chunk's base so row0 = 0 works for any dequantizer. */
        int st =
            quant_dequant_rows(t->type, t->data + (size_t)r0 * row_bytes, ne0, 0, nr, buf, &err);
        if (st) ck_abort_msg("%s: %s: %s", model, t->name, err.msg);
        for (int64_t i = 0; i < nr * ne0; i++) {
            sum += buf[i];
            sumsq += (double)buf[i] * buf[i];
            if (n_first < 16) first16[n_first++] = buf[i];
        }
    }
    free(buf);
    const cJSON *jf = cJSON_GetObjectItem(jt, "first16");
    int n_want = cJSON_GetArraySize(jf);
    ck_assert_int_eq(n_want, TPI_MIN(16, (int)(ne0 * n_rows)));
    float want[16];
    for (int i = 0; i < n_want; i++)
        want[i] = (float)cJSON_GetArrayItem(jf, i)->valuedouble;
    bool ok = true;
    for (int i = 0; i < n_want; i++) {
        if (fabsf(first16[i] - want[i]) > 1e-6f + 1e-5f * fabsf(want[i])) ok = false;
        worst->first16_abs = fmax(worst->first16_abs, fabsf(first16[i] - want[i]));
    }
    if (!ok) { /* tu_compare prints the mismatches (index, got, want) */
        char label[256];
        snprintf(label, sizeof label, "%s %s first16", model, t->name);
        ck_assert_uint_eq(tu_compare(label, first16, want, (size_t)n_want, 1e-6, 1e-5), 0);
    }
    double want_sum = cJSON_GetObjectItem(jt, "sum")->valuedouble;
    double want_sumsq = cJSON_GetObjectItem(jt, "sumsq")->valuedouble;
    double n_elems = (double)(ne0 * n_rows);
    double tol_sum = 1e-6 * sqrt(n_elems * want_sumsq) + 1e-9;
    worst->sum_over_tol = fmax(worst->sum_over_tol, fabs(sum - want_sum) / tol_sum);
    worst->sumsq_rel = fmax(worst->sumsq_rel, fabs(sumsq - want_sumsq) / (want_sumsq + 1e-300));
    ck_assert_msg(fabs(sum - want_sum) <= tol_sum, "%s %s: sum got %.9g want %.9g (tol %.3g)",
                  model, t->name, sum, want_sum, tol_sum);
    ck_assert_msg(fabs(sumsq - want_sumsq) <= 1e-5 * want_sumsq + 1e-12,
                  "%s %s: sumsq got %.9g want %.9g", model, t->name, sumsq, want_sumsq);
}

/* The tensor table equals NAME.tensors.json, and every tensor dequantizes to it. */
START_TEST(test_reference_models) {
    int n_found = 0;
    for (int m = 0; m < N_MODELS; m++) {
        char name[128], jname[128];
        snprintf(name, sizeof name, "%s.gguf", g_models[m].name);
        snprintf(jname, sizeof jname, "%s.tensors.json", g_models[m].name);
        const char *path = tu_data_path(name);
        const char *jpath = tu_data_path(jname);
        if (!path || !jpath) {
            fprintf(stderr, "SKIP: %s not found in ../shared/data or tests/data\n", name);
            continue;
        }
        n_found++;
        struct gguf_file *f = open_ok(path);
        check_model_metadata(f, &g_models[m]);
        cJSON *j = tu_read_json(jpath);
        ck_assert_ptr_nonnull(j);
        const cJSON *jts = cJSON_GetObjectItem(j, "tensors");
        struct value_errs worst = {0, 0, 0};
        ck_assert_int_eq(cJSON_GetArraySize(jts), gguf_n_tensors(f));
        for (int i = 0; i < cJSON_GetArraySize(jts); i++) {
            const cJSON *jt = cJSON_GetArrayItem(jts, i);
            const char *tname = cJSON_GetObjectItem(jt, "name")->valuestring;
            const struct gguf_tensor *t = gguf_find_tensor(f, tname);
            ck_assert_msg(t != NULL, "%s: tensor '%s' not found", name, tname);
            ck_assert_ptr_eq(t, gguf_tensor_at(f, i)); /* same order as the file */
            ck_assert_str_eq(quant_type_name(t->type),
                             cJSON_GetObjectItem(jt, "type")->valuestring);
            const cJSON *shape = cJSON_GetObjectItem(jt, "shape");
            ck_assert_int_eq(cJSON_GetArraySize(shape), t->n_dims);
            for (int d = 0; d < t->n_dims; d++)
                ck_assert_int_eq(t->ne[d], (int64_t)cJSON_GetArrayItem(shape, d)->valuedouble);
            ck_assert_uint_eq(t->offset, (uint64_t)cJSON_GetObjectItem(jt, "offset")->valuedouble);
            ck_assert_uint_eq(t->n_bytes,
                              (uint64_t)cJSON_GetObjectItem(jt, "n_bytes")->valuedouble);
            check_tensor_values(name, t, jt, &worst);
        }
        fprintf(stderr,
                "%s: %d tensors match; worst first16 abs err %.3g, sum err %.3g of tol, "
                "sumsq rel err %.3g\n",
                name, cJSON_GetArraySize(jts), worst.first16_abs, worst.sum_over_tol,
                worst.sumsq_rel);
        cJSON_Delete(j);
        gguf_close(&f);
        ck_assert_ptr_null(f);
    }
    if (n_found == 0) fprintf(stderr, "SKIP: no reference model found\n");
}
END_TEST

START_TEST(test_qwen3_vocab) {
    const char *path = tu_data_or_skip("qwen3-vocab.gguf");
    if (!path) return;
    struct gguf_file *f = open_ok(path);
    ck_assert_int_eq(gguf_n_tensors(f), 0);
    const struct gguf_kv *tokens = gguf_find_kv(f, "tokenizer.ggml.tokens");
    const struct gguf_kv *merges = gguf_find_kv(f, "tokenizer.ggml.merges");
    ck_assert_ptr_nonnull(tokens);
    ck_assert_ptr_nonnull(merges);
    ck_assert_uint_eq(tokens->arr_n, 151936);
    ck_assert_uint_eq(merges->arr_n, 151387);
    ck_assert_int_eq(get_int(f, "tokenizer.ggml.eos_token_id"), 151645);
    ck_assert_int_eq(get_int(f, "tokenizer.ggml.bos_token_id"), 151643);
    struct gguf_str s;
    ck_assert(gguf_get_str(f, "tokenizer.ggml.pre", &s) && str_is(s, "qwen2"));
    struct gguf_str *strs;
    uint64_t n;
    ck_assert_int_eq(gguf_arr_strings(tokens, &strs, &n, NULL), TPI_OK);
    ck_assert_uint_eq(n, 151936);
    ck_assert(str_is(strs[151645], "<|im_end|>"));
    ck_assert(str_is(strs[151643], "<|endoftext|>"));
    free(strs);
    const struct gguf_kv *types = gguf_find_kv(f, "tokenizer.ggml.token_type");
    int64_t tt;
    ck_assert(gguf_arr_int(types, 151935, &tt));
    ck_assert(!gguf_arr_int(types, 151936, &tt)); /* out of range */
    /* The hash is deterministic and covers the metadata. */
    struct gguf_file *g = open_ok(path);
    ck_assert_uint_eq(gguf_metadata_hash(f), gguf_metadata_hash(g));
    gguf_close(&g);
    gguf_close(&f);
}
END_TEST

/* ---- round trips ---------------------------------------------------------------------- */

struct rt_tensor {
    const char *name;
    int type, n_dims;
    int64_t ne[4];
};

static const struct rt_tensor g_rt_tensors[] = {
    {"a.f32", TPI_TYPE_F32, 2, {5, 3, 1, 1}},      {"b.q8_0", TPI_TYPE_Q8_0, 2, {64, 3, 1, 1}},
    {"c.f16", TPI_TYPE_F16, 1, {33, 1, 1, 1}},     {"d.bf16", TPI_TYPE_BF16, 3, {16, 2, 2, 1}},
    {"e.q4_k", TPI_TYPE_Q4_K, 2, {256, 2, 1, 1}},  {"f.q6_k", TPI_TYPE_Q6_K, 4, {256, 1, 2, 1}},
    {"g.iq2_xxs.unsupported", 16, 1, {256, 1, 1, 1}},
};
#define N_RT ((int)(sizeof g_rt_tensors / sizeof g_rt_tensors[0]))

static uint8_t *random_bytes(uint64_t n, uint64_t seed) {
    struct tu_rng r;
    tu_rng_seed(&r, seed);
    uint8_t *p = malloc(n ? n : 1);
    for (uint64_t i = 0; i < n; i++)
        p[i] = (uint8_t)((uint32_t)tu_uniform(&r, 0, 65536) & 255);
    return p;
}

static uint64_t rt_n_bytes(const struct rt_tensor *t) {
    return quant_row_size(t->type, t->ne[0]) * (uint64_t)(t->ne[1] * t->ne[2] * t->ne[3]);
}

/* A kv built by hand, to reach the types that have no setter through copy_kv. */
static void copy_scalar(struct gguf_writer *w, const char *key, enum gguf_vtype type, const void *v,
                        uint64_t n_bytes) {
    struct gguf_kv kv = {.key = {strlen(key), key}, .type = type, .data = v, .n_bytes = n_bytes};
    ck_assert_int_eq(gguf_writer_copy_kv(w, &kv), TPI_OK);
}

static const char *g_strs[] = {"alpha", "", "with\0nul", "ünïcödé"};
static const uint64_t g_str_lens[] = {5, 0, 8, sizeof "ünïcödé" - 1};

/* Every value type, arrays of every scalar type, arrays of strings (with an empty
 * string and an embedded NUL), and an array of arrays. */
static void add_all_kvs(struct gguf_writer *w) {
    ck_assert_int_eq(gguf_writer_set_str(w, "general.architecture", "qwen3"), TPI_OK);
    ck_assert_int_eq(gguf_writer_set_u32(w, "t.u32", 4000000000u), TPI_OK);
    ck_assert_int_eq(gguf_writer_set_i32(w, "t.i32", -7), TPI_OK);
    ck_assert_int_eq(gguf_writer_set_u64(w, "t.u64", 1ull << 40), TPI_OK);
    ck_assert_int_eq(gguf_writer_set_u64(w, "t.u64big", UINT64_MAX), TPI_OK);
    ck_assert_int_eq(gguf_writer_set_f32(w, "t.f32", 1e-6f), TPI_OK);
    ck_assert_int_eq(gguf_writer_set_bool(w, "t.bool", true), TPI_OK);
    ck_assert_int_eq(gguf_writer_set_str(w, "t.str", "hello"), TPI_OK);
    ck_assert_int_eq(gguf_writer_set_str(w, "t.empty", ""), TPI_OK);
    uint8_t u8 = 200;
    int8_t i8 = -100;
    uint16_t u16 = 60000;
    int16_t i16 = -30000;
    int64_t i64 = -(1ll << 50);
    double f64 = 3.141592653589793;
    copy_scalar(w, "t.u8", GGUF_VT_U8, &u8, 1);
    copy_scalar(w, "t.i8", GGUF_VT_I8, &i8, 1);
    copy_scalar(w, "t.u16", GGUF_VT_U16, &u16, 2);
    copy_scalar(w, "t.i16", GGUF_VT_I16, &i16, 2);
    copy_scalar(w, "t.i64", GGUF_VT_I64, &i64, 8);
    copy_scalar(w, "t.f64", GGUF_VT_F64, &f64, 8);
    /* Arrays of each scalar type, values 0, -1 (or max), 2. */
    static const uint8_t a_u8[] = {0, 255, 2};
    static const int8_t a_i8[] = {0, -1, 2};
    static const uint16_t a_u16[] = {0, 65535, 2};
    static const int16_t a_i16[] = {0, -1, 2};
    static const uint32_t a_u32[] = {0, 4294967295u, 2};
    static const int32_t a_i32[] = {0, -1, 2};
    static const float a_f32[] = {0, -1.5f, 2};
    static const uint8_t a_bool[] = {0, 1, 1};
    static const uint64_t a_u64[] = {0, 1ull << 60, 2};
    static const int64_t a_i64[] = {0, -1, 2};
    static const double a_f64[] = {0, -1.25, 2};
    const void *arrs[] = {a_u8,   a_i8, a_u16, a_i16, a_u32, a_i32, a_f32,
                          a_bool, NULL, NULL,  a_u64, a_i64, a_f64};
    for (int vt = 0; vt < GGUF_VT_COUNT; vt++) {
        if (!arrs[vt]) continue;
        char key[64];
        snprintf(key, sizeof key, "arr.%s", gguf_vtype_name(vt));
        ck_assert_int_eq(gguf_writer_set_arr(w, key, (enum gguf_vtype)vt, arrs[vt], 3), TPI_OK);
    }
    ck_assert_int_eq(gguf_writer_set_arr(w, "arr.empty", GGUF_VT_U32, NULL, 0), TPI_OK);
    ck_assert_int_eq(gguf_writer_set_arr_str(w, "arr.strs", g_strs, g_str_lens, 4), TPI_OK);
    const char *plain[] = {"x", "yy"};
    ck_assert_int_eq(gguf_writer_set_arr_str(w, "arr.plain", plain, NULL, 2), TPI_OK);
    /* Array of 2 arrays of u16: [[1,2],[3]]. */
    uint8_t nested[2 * 12 + 3 * 2], *p = nested;
    uint32_t it = GGUF_VT_U16;
    uint64_t n2 = 2, n1 = 1;
    uint16_t v[3] = {1, 2, 3};
    memcpy(p, &it, 4), memcpy(p + 4, &n2, 8), memcpy(p + 12, v, 4), p += 16;
    memcpy(p, &it, 4), memcpy(p + 4, &n1, 8), memcpy(p + 12, v + 2, 2);
    struct gguf_kv kv = {.key = {10, "arr.nested"},
                         .type = GGUF_VT_ARRAY,
                         .arr_type = GGUF_VT_ARRAY,
                         .arr_n = 2,
                         .data = nested,
                         .n_bytes = sizeof nested};
    ck_assert_int_eq(gguf_writer_copy_kv(w, &kv), TPI_OK);
}

static void check_all_kvs(const struct gguf_file *f) {
    int64_t i;
    float x;
    bool b;
    struct gguf_str s;
    ck_assert_int_eq(get_int(f, "t.u32"), 4000000000ll);
    ck_assert_int_eq(get_int(f, "t.i32"), -7);
    ck_assert_int_eq(get_int(f, "t.u64"), 1ll << 40);
    ck_assert(!gguf_get_int(f, "t.u64big", &i)); /* does not fit int64 */
    ck_assert(gguf_get_f32(f, "t.f32", &x) && x == 1e-6f);
    ck_assert(gguf_get_f32(f, "t.i32", &x) && x == -7.0f); /* integers convert */
    ck_assert(gguf_get_bool(f, "t.bool", &b) && b);
    ck_assert(gguf_get_int(f, "t.bool", &i) && i == 1);
    ck_assert(!gguf_get_bool(f, "t.u32", &b));
    ck_assert(gguf_get_str(f, "t.str", &s) && str_is(s, "hello"));
    ck_assert(gguf_get_str(f, "t.empty", &s) && s.len == 0);
    ck_assert(!gguf_get_str(f, "t.u32", &s));
    ck_assert(!gguf_get_int(f, "t.str", &i));
    ck_assert(!gguf_get_int(f, "no.such.key", &i));
    ck_assert_ptr_null(gguf_find_kv(f, "no.such.key"));
    ck_assert_int_eq(get_int(f, "t.u8"), 200);
    ck_assert_int_eq(get_int(f, "t.i8"), -100);
    ck_assert_int_eq(get_int(f, "t.u16"), 60000);
    ck_assert_int_eq(get_int(f, "t.i16"), -30000);
    ck_assert_int_eq(get_int(f, "t.i64"), -(1ll << 50));
    ck_assert(gguf_get_f32(f, "t.f64", &x) && x == (float)3.141592653589793);
    ck_assert_int_eq(gguf_find_kv(f, "t.f64")->type, GGUF_VT_F64);
    static const double want1[GGUF_VT_COUNT] = {
        255, -1, 65535, -1, 4294967295.0, -1, -1.5, 1, 0, 0, 1152921504606846976.0, -1, -1.25};
    for (int vt = 0; vt < GGUF_VT_COUNT; vt++) {
        if (vt == GGUF_VT_STRING || vt == GGUF_VT_ARRAY) continue;
        char key[64];
        snprintf(key, sizeof key, "arr.%s", gguf_vtype_name(vt));
        const struct gguf_kv *kv = gguf_find_kv(f, key);
        ck_assert_msg(kv != NULL, "%s missing", key);
        ck_assert_int_eq(kv->type, GGUF_VT_ARRAY);
        ck_assert_int_eq(kv->arr_type, vt);
        ck_assert_uint_eq(kv->arr_n, 3);
        double d;
        ck_assert(gguf_arr_f64(kv, 1, &d));
        ck_assert_msg(d == want1[vt], "%s[1] = %.17g, want %.17g", key, d, want1[vt]);
        double want2 = vt == GGUF_VT_BOOL ? 1 : 2;
        ck_assert(gguf_arr_f64(kv, 2, &d) && d == want2);
        ck_assert(!gguf_arr_f64(kv, 3, &d));
        bool is_int = vt != GGUF_VT_F32 && vt != GGUF_VT_F64;
        ck_assert(gguf_arr_int(kv, 2, &i) == is_int);
        if (is_int) ck_assert_int_eq(i, (int64_t)want2);
    }
    ck_assert_uint_eq(gguf_find_kv(f, "arr.empty")->arr_n, 0);
    struct gguf_str *strs;
    uint64_t n;
    ck_assert_int_eq(gguf_arr_strings(gguf_find_kv(f, "arr.strs"), &strs, &n, NULL), TPI_OK);
    ck_assert_uint_eq(n, 4);
    for (int k = 0; k < 4; k++) {
        ck_assert_uint_eq(strs[k].len, g_str_lens[k]);
        ck_assert(!memcmp(strs[k].data, g_strs[k], g_str_lens[k]));
    }
    free(strs);
    ck_assert_int_eq(gguf_arr_strings(gguf_find_kv(f, "arr.plain"), &strs, &n, NULL), TPI_OK);
    ck_assert(n == 2 && str_is(strs[0], "x") && str_is(strs[1], "yy"));
    free(strs);
    struct tpi_error err;
    ck_assert_int_ne(gguf_arr_strings(gguf_find_kv(f, "arr.u8"), &strs, &n, &err), TPI_OK);
    const struct gguf_kv *nested = gguf_find_kv(f, "arr.nested");
    ck_assert(nested && nested->arr_type == GGUF_VT_ARRAY && nested->arr_n == 2);
    ck_assert(!gguf_arr_int(nested, 0, &i)); /* not a scalar array */
}

static void check_rt_tensors(const struct gguf_file *f, uint64_t alignment, uint64_t seed0) {
    ck_assert_int_eq(gguf_n_tensors(f), N_RT);
    for (int k = 0; k < N_RT; k++) {
        const struct rt_tensor *rt = &g_rt_tensors[k];
        const struct gguf_tensor *t = gguf_find_tensor(f, rt->name);
        ck_assert_ptr_nonnull(t);
        ck_assert_ptr_eq(t, gguf_tensor_at(f, k));
        ck_assert_int_eq(t->type, rt->type);
        ck_assert_int_eq(t->n_dims, rt->n_dims);
        for (int d = 0; d < 4; d++)
            ck_assert_int_eq(t->ne[d], rt->ne[d]);
        ck_assert_uint_eq(t->n_bytes, rt_n_bytes(rt));
        ck_assert_uint_eq(t->offset % alignment, 0);
        uint8_t *want = random_bytes(t->n_bytes, seed0 + (uint64_t)k);
        ck_assert_msg(!memcmp(t->data, want, t->n_bytes), "tensor %s data differs", rt->name);
        free(want);
    }
    ck_assert_ptr_null(gguf_find_tensor(f, "no.such.tensor"));
    ck_assert_ptr_null(gguf_tensor_at(f, N_RT));
    ck_assert_ptr_null(gguf_tensor_at(f, -1));
}

START_TEST(test_round_trip) {
    tu_tmpdir_make("test_gguf");
    const uint32_t alignment = 64; /* not the default: general.alignment is written */
    struct gguf_writer *w = gguf_writer_new(alignment);
    ck_assert_ptr_nonnull(w);
    add_all_kvs(w);
    uint8_t *data[N_RT];
    for (int k = 0; k < N_RT; k++) {
        const struct rt_tensor *rt = &g_rt_tensors[k];
        data[k] = random_bytes(rt_n_bytes(rt), 100 + (uint64_t)k);
        ck_assert_int_eq(gguf_writer_add_tensor(w, rt->name, rt->type, rt->n_dims, rt->ne, data[k]),
                         k);
    }
    /* The writer refuses duplicates and bad shapes. */
    int64_t ne33[1] = {33}, ne32[1] = {32};
    ck_assert_int_eq(gguf_writer_set_u32(w, "t.u32", 1), TPI_ERR_INVALID);
    ck_assert_int_eq(gguf_writer_add_tensor(w, "a.f32", TPI_TYPE_F32, 1, ne32, data[0]), -1);
    ck_assert_int_eq(gguf_writer_add_tensor(w, "bad", TPI_TYPE_Q8_0, 1, ne33, data[0]), -1);
    ck_assert_int_eq(gguf_writer_add_tensor(w, "bad", 99, 1, ne32, data[0]), -1);
    ck_assert_int_eq(gguf_writer_add_tensor(w, "bad", TPI_TYPE_F32, 5, ne32, data[0]), -1);
    struct tpi_error err;
    tpi_err_clear(&err);
    const char *p1 = tu_tmp_path("rt1.gguf");
    ck_assert_int_eq(gguf_writer_write(w, p1, &err), TPI_OK);
    for (int k = 0; k < N_RT; k++)
        ck_assert_uint_eq(gguf_writer_tensor_offset(w, k) % alignment, 0);
    struct gguf_file *f = open_ok(p1);
    ck_assert_uint_eq(gguf_version(f), 3);
    ck_assert_uint_eq(gguf_alignment(f), alignment);
    ck_assert_int_eq(gguf_n_parts(f), 1);
    ck_assert_str_eq(gguf_path(f), p1);
    for (int k = 0; k < N_RT; k++)
        ck_assert_uint_eq(gguf_tensor_at(f, k)->offset, gguf_writer_tensor_offset(w, k));
    check_all_kvs(f);
    check_rt_tensors(f, alignment, 100);
    /* The last tensor's data ends inside the file. */
    const struct gguf_tensor *last = gguf_tensor_at(f, N_RT - 1);
    ck_assert_uint_le(last->offset + last->n_bytes, gguf_total_size(f));
    ck_assert_uint_eq(gguf_total_size(f) % alignment, 0);

    /* Copy every kv of the file into a new writer: identical metadata bytes. */
    struct gguf_writer *w2 = gguf_writer_new(alignment);
    for (int64_t i = 0; i < gguf_n_kv(f); i++)
        ck_assert_int_eq(gguf_writer_copy_kv(w2, gguf_kv_at(f, i)), TPI_OK);
    for (int k = 0; k < N_RT; k++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, k);
        ck_assert_int_ge(gguf_writer_add_tensor(w2, t->name, t->type, t->n_dims, t->ne, t->data),
                         0);
    }
    const char *p2 = tu_tmp_path("rt2.gguf");
    ck_assert_int_eq(gguf_writer_write(w2, p2, &err), TPI_OK);
    struct gguf_file *g = open_ok(p2);
    ck_assert_int_eq(gguf_n_kv(g), gguf_n_kv(f));
    ck_assert_uint_eq(gguf_metadata_hash(g), gguf_metadata_hash(f));
    check_all_kvs(g);
    check_rt_tensors(g, alignment, 100);
    size_t n1, n2;
    char *b1 = tu_read_file(p1, &n1), *b2 = tu_read_file(p2, &n2);
    ck_assert(n1 == n2 && !memcmp(b1, b2, n1)); /* byte-identical files */
    free(b1);
    free(b2);
    gguf_close(&g);
    gguf_writer_free(&w2);

    /* A different value changes the metadata hash. */
    struct gguf_writer *w3 = gguf_writer_new(0);
    ck_assert_int_eq(gguf_writer_set_str(w3, "general.architecture", "qwen2"), TPI_OK);
    const char *p3 = tu_tmp_path("rt3.gguf");
    ck_assert_int_eq(gguf_writer_write(w3, p3, &err), TPI_OK);
    g = open_ok(p3);
    ck_assert_uint_ne(gguf_metadata_hash(g), gguf_metadata_hash(f));
    ck_assert_uint_eq(gguf_alignment(g), 32);
    ck_assert_ptr_null(gguf_find_kv(g, "general.alignment"));
    gguf_close(&g);
    gguf_writer_free(&w3);

    gguf_close(&f);
    gguf_writer_free(&w);
    ck_assert_ptr_null(w);
    for (int k = 0; k < N_RT; k++)
        free(data[k]);
    tu_tmpdir_remove();
}
END_TEST

/* Streaming: header first, then threads pwrite their tensors into place. */
struct stream_job {
    int fd, first, step;
    const struct gguf_writer *w;
};

static void *stream_worker(void *arg) {
    struct stream_job *j = arg;
    for (int k = j->first; k < N_RT; k += j->step) {
        uint64_t n = rt_n_bytes(&g_rt_tensors[k]);
        uint8_t *d = random_bytes(n, 500 + (uint64_t)k);
        ssize_t wr = pwrite(j->fd, d, n, (off_t)gguf_writer_tensor_offset(j->w, k));
        free(d);
        if (wr != (ssize_t)n) return (void *)1;
    }
    return NULL;
}

START_TEST(test_streaming_writer) {
    tu_tmpdir_make("test_gguf");
    struct gguf_writer *w = gguf_writer_new(0);
    ck_assert_int_eq(gguf_writer_set_str(w, "general.architecture", "qwen3"), TPI_OK);
    for (int k = 0; k < N_RT; k++) {
        const struct rt_tensor *rt = &g_rt_tensors[k];
        ck_assert_int_eq(gguf_writer_add_tensor(w, rt->name, rt->type, rt->n_dims, rt->ne, NULL),
                         k);
    }
    struct tpi_error err;
    tpi_err_clear(&err);
    /* gguf_writer_write needs every tensor's data. */
    ck_assert_int_eq(gguf_writer_write(w, tu_tmp_path("x.gguf"), &err), TPI_ERR_INVALID);
    const char *path = tu_tmp_path("stream.gguf");
    int fd = -1;
    ck_assert_int_eq(gguf_writer_write_header(w, path, &fd, &err), TPI_OK);
    ck_assert_int_ge(fd, 0);
    pthread_t th[3];
    struct stream_job jobs[3];
    for (int i = 0; i < 3; i++) {
        jobs[i] = (struct stream_job){fd, i, 3, w};
        ck_assert_int_eq(pthread_create(&th[i], NULL, stream_worker, &jobs[i]), 0);
    }
    for (int i = 0; i < 3; i++) {
        void *ret;
        pthread_join(th[i], &ret);
        ck_assert_ptr_null(ret);
    }
    close(fd);
    struct gguf_file *f = open_ok(path);
    check_rt_tensors(f, 32, 500);
    gguf_close(&f);
    gguf_writer_free(&w);
    tu_tmpdir_remove();
}
END_TEST

/* ---- split sets ------------------------------------------------------------------------ */

static void set_u16(struct gguf_writer *w, const char *key, uint16_t v) {
    copy_scalar(w, key, GGUF_VT_U16, &v, 2);
}

/* Write NAME-0000k-of-00003.gguf with tensors spread over the parts, the way
 * llama.cpp's gguf-split does it (split.no 0-based, u16; split.tensors.count i32). */
static void write_split_set(const char *prefix, int n_parts, int per_part, uint8_t ***data_out) {
    uint8_t **data = calloc((size_t)(n_parts * per_part), sizeof *data);
    for (int p = 0; p < n_parts; p++) {
        struct gguf_writer *w = gguf_writer_new(0);
        if (p == 0) {
            ck_assert_int_eq(gguf_writer_set_str(w, "general.architecture", "qwen3"), TPI_OK);
            ck_assert_int_eq(gguf_writer_set_u32(w, "qwen3.block_count", 4), TPI_OK);
        }
        set_u16(w, "split.no", (uint16_t)p);
        set_u16(w, "split.count", (uint16_t)n_parts);
        ck_assert_int_eq(gguf_writer_set_i32(w, "split.tensors.count", n_parts * per_part), TPI_OK);
        for (int k = 0; k < per_part; k++) {
            int idx = p * per_part + k;
            char name[64];
            snprintf(name, sizeof name, "blk.%d.weight", idx);
            int64_t ne[2] = {32 * (1 + idx % 3), 2 + idx};
            int type = idx % 2 ? TPI_TYPE_Q8_0 : TPI_TYPE_F16;
            uint64_t n = quant_row_size(type, ne[0]) * (uint64_t)ne[1];
            data[idx] = random_bytes(n, 900 + (uint64_t)idx);
            ck_assert_int_ge(gguf_writer_add_tensor(w, name, type, 2, ne, data[idx]), 0);
        }
        char path[600];
        snprintf(path, sizeof path, "%s-%05d-of-%05d.gguf", prefix, p + 1, n_parts);
        struct tpi_error err;
        ck_assert_int_eq(gguf_writer_write(w, path, &err), TPI_OK);
        gguf_writer_free(&w);
    }
    *data_out = data;
}

START_TEST(test_split_set) {
    tu_tmpdir_make("test_gguf");
    const int n_parts = 3, per_part = 4;
    uint8_t **data;
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%s/model", tu_tmpdir());
    write_split_set(prefix, n_parts, per_part, &data);
    struct gguf_file *f = open_ok(tu_tmp_path("model-00001-of-00003.gguf"));
    ck_assert_int_eq(gguf_n_parts(f), n_parts);
    ck_assert_int_eq(gguf_n_tensors(f), n_parts * per_part);
    ck_assert_int_eq(get_int(f, "qwen3.block_count"), 4);
    ck_assert_int_eq(get_int(f, "split.count"), 3);
    uint64_t total = 0;
    for (int p = 0; p < n_parts; p++) {
        char name[64];
        snprintf(name, sizeof name, "model-%05d-of-%05d.gguf", p + 1, n_parts);
        size_t n;
        char *b = tu_read_file(tu_tmp_path(name), &n);
        total += n;
        free(b);
    }
    ck_assert_uint_eq(gguf_total_size(f), total);
    for (int idx = n_parts * per_part - 1; idx >= 0; idx--) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.weight", idx);
        const struct gguf_tensor *t = gguf_find_tensor(f, name);
        ck_assert_msg(t != NULL, "%s not found", name);
        ck_assert_int_eq(t->part, idx / per_part);
        ck_assert_int_eq(t->ne[1], 2 + idx);
        ck_assert_msg(!memcmp(t->data, data[idx], t->n_bytes), "%s data differs", name);
    }
    gguf_close(&f);
    /* Opening a later part is an error that points at the first. */
    struct tpi_error err;
    ck_assert_int_ne(gguf_open(tu_tmp_path("model-00002-of-00003.gguf"), &f, &err), TPI_OK);
    ck_assert_ptr_null(f);
    ck_assert_ptr_nonnull(strstr(err.msg, "open the first part"));
    for (int i = 0; i < n_parts * per_part; i++)
        free(data[i]);
    free(data);
    tu_tmpdir_remove();
}
END_TEST

int main(void) {
    Suite *s = suite_create("gguf");
    TCase *tc = tcase_create("gguf");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_reference_models);
    tcase_add_test(tc, test_qwen3_vocab);
    tcase_add_test(tc, test_round_trip);
    tcase_add_test(tc, test_streaming_writer);
    tcase_add_test(tc, test_split_set);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
