/*
 * test_mkmodel.c — the synthetic model writer (loaders/synth.c) and
 * `tpinfer mkmodel`.
 *
 * - The tensor plan (names, order, shapes, per-tensor types) equals what
 *   llama.cpp wrote for the reference tiny models (NAME.tensors.json).
 * - Written files open with the GGUF reader and carry the expected metadata,
 *   tensors and sane weight statistics, for qwen2/qwen3 and every file type.
 * - Same seed: byte-identical files with 1 and 2 threads.
 * - Vocabularies: built in (GPT-2 byte order, merges, ChatML specials, padding),
 *   copied from qwen3-vocab.gguf, and read from the real Qwen3 tokenizer.json.
 * - Errors: bad shapes, unknown types, row lengths, unwritable output, CLI.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gguf.h"
#include "kernels/quant.h"
#include "synth.h"
#include "testutil.h"

static char tmp_dir[256];

static const char *tmp_file(const char *name) {
    static char buf[4][512];
    static int k;
    char *b = buf[k++ & 3];
    snprintf(b, sizeof buf[0], "%s/%s", tmp_dir, name);
    return b;
}

/* A small model every test can write in well under a second. */
static void small_config(struct synth_config *c, const char *arch, int ftype) {
    synth_config_init(c);
    snprintf(c->arch, sizeof c->arch, "%s", arch);
    c->n_layer = 2;
    c->n_embd = 256;
    c->n_head = 4;
    c->n_head_kv = 2;
    c->head_dim = 64;
    c->n_ff = 512;
    c->n_vocab = 600;
    c->ftype = ftype;
    c->tied = !strcmp(arch, "qwen2");
    c->n_threads = 2;
    c->seed = 7;
}

static int64_t kv_int(const struct gguf_file *f, const char *key) {
    int64_t v = -12345;
    ck_assert_msg(gguf_get_int(f, key, &v), "key %s missing or not an integer", key);
    return v;
}

static void expect_kv_str(const struct gguf_file *f, const char *key, const char *want) {
    struct gguf_str s;
    ck_assert_msg(gguf_get_str(f, key, &s), "key %s missing", key);
    ck_assert_msg(s.len == strlen(want) && !memcmp(s.data, want, s.len), "%s = '%.*s', want '%s'",
                  key, (int)s.len, s.data, want);
}

/* ---- plan vs the llama.cpp-made reference models --------------------------- */

struct ref_model {
    const char *name, *arch;
    int n_layer, ftype;
    bool tied, llama_order; /* llama-quantize output (its order) or convert output (any order) */
};

static const struct ref_model ref_models[] = {
    {"qwen3-tiny-q4_k_m", "qwen3", 4, SYNTH_FT_Q4_K_M, false, true},
    {"qwen2-tiny-q5_k_m", "qwen2", 2, SYNTH_FT_Q5_K_M, true, true},
    {"qwen2-tiny-q4_0", "qwen2", 2, SYNTH_FT_Q4_0, true, true},
    {"qwen3-tiny-q8_0", "qwen3", 4, SYNTH_FT_Q8_0, false, true},
    {"qwen3-tiny-q6_k", "qwen3", 4, SYNTH_FT_Q6_K, false, true},
    {"qwen3-tiny-bf16", "qwen3", 4, SYNTH_FT_BF16, false, false},
    {"qwen2-tiny-f16", "qwen2", 2, SYNTH_FT_F16, true, false},
    {"qwen3-tiny-q2_k", "qwen3", 4, SYNTH_FT_Q2_K, false, true},
    {"qwen2-tiny-q3_k_m", "qwen2", 2, SYNTH_FT_Q3_K_M, true, true},
    {"qwen2-tiny-iq4_xs", "qwen2", 2, SYNTH_FT_IQ4_XS, true, true},
};

START_TEST(test_plan_matches_reference) {
    int n_models = 0;
    for (size_t m = 0; m < sizeof ref_models / sizeof ref_models[0]; m++) {
        const struct ref_model *rm = &ref_models[m];
        char jname[128];
        snprintf(jname, sizeof jname, "%s.tensors.json", rm->name);
        const char *path = tu_data_path(jname);
        if (!path) continue;
        cJSON *root = tu_read_json(path);
        ck_assert_ptr_nonnull(root);
        struct synth_config c;
        synth_config_init(&c); /* the tiny preset is the reference models' shape */
        snprintf(c.arch, sizeof c.arch, "%s", rm->arch);
        c.n_layer = rm->n_layer;
        c.ftype = rm->ftype;
        c.tied = rm->tied;
        struct synth_tensor *ts;
        int n;
        struct tpi_error err;
        ck_assert_int_eq(synth_plan(&c, 2048, &ts, &n, &err), TPI_OK);
        const cJSON *tensors = cJSON_GetObjectItem(root, "tensors");
        ck_assert_int_eq(n, cJSON_GetArraySize(tensors));
        for (int i = 0; i < n; i++) {
            const cJSON *t = cJSON_GetArrayItem(tensors, i);
            const char *want_name = cJSON_GetObjectItem(t, "name")->valuestring;
            int j = i;
            if (!rm->llama_order)
                for (j = 0; j < n && strcmp(ts[j].name, want_name); j++) {
                }
            ck_assert_msg(j < n && !strcmp(ts[j].name, want_name),
                          "%s: tensor %d is '%s', want '%s'", rm->name, i,
                          j < n ? ts[j].name : "(none)", want_name);
            const char *want_type = cJSON_GetObjectItem(t, "type")->valuestring;
            ck_assert_msg(!strcmp(quant_type_name(ts[j].type), want_type), "%s: %s is %s, want %s",
                          rm->name, want_name, quant_type_name(ts[j].type), want_type);
            const cJSON *shape = cJSON_GetObjectItem(t, "shape");
            ck_assert_int_eq(ts[j].n_dims, cJSON_GetArraySize(shape));
            for (int d = 0; d < ts[j].n_dims; d++)
                ck_assert_int_eq(ts[j].ne[d], (int64_t)cJSON_GetArrayItem(shape, d)->valuedouble);
        }
        free(ts);
        cJSON_Delete(root);
        n_models++;
    }
    fprintf(stderr, "plan matches %d reference models\n", n_models);
    ck_assert_int_ge(n_models, 3); /* the three in tests/data at least */
}
END_TEST

/* Row length fall-backs as llama-quantize does them. */
START_TEST(test_plan_fallbacks) {
    struct synth_config c;
    small_config(&c, "qwen3", SYNTH_FT_Q4_K_M);
    c.n_layer = 8;
    c.n_ff = 1056; /* ffn_down rows of 1056: not a multiple of 256, but of 32 */
    struct synth_tensor *ts;
    int n;
    struct tpi_error err;
    ck_assert_int_eq(synth_plan(&c, 600, &ts, &n, &err), TPI_OK);
    for (int i = 0; i < n; i++) {
        if (ts[i].kind != SYNTH_FFN_DOWN) continue;
        /* use_more_bits layers (0, 7 and 1+3k+2... for 8 layers: 0, 3, 6, 7) get Q6_K -> Q8_0;
         * others Q4_K -> Q5_0 */
        int L = ts[i].layer;
        bool more = L < 1 || L >= 7 || (L - 1) % 3 == 2;
        ck_assert_msg(ts[i].type == (more ? TPI_TYPE_Q8_0 : TPI_TYPE_Q5_0), "layer %d ffn_down %s",
                      L, quant_type_name(ts[i].type));
    }
    free(ts);
    c.n_ff = 1000; /* not even a multiple of 32: llama.cpp stores F16 */
    ck_assert_int_eq(synth_plan(&c, 600, &ts, &n, &err), TPI_OK);
    for (int i = 0; i < n; i++)
        if (ts[i].kind == SYNTH_FFN_DOWN)
            ck_assert_int_eq(ts[i].type, TPI_TYPE_F16);
        else if (ts[i].kind == SYNTH_FFN_UP)
            ck_assert_int_eq(ts[i].type, TPI_TYPE_Q4_K);
    free(ts);
    /* a 32-element type with such rows is refused, naming the tensor */
    c.ftype = SYNTH_FT_Q4_0;
    ck_assert_int_eq(synth_plan(&c, 600, &ts, &n, &err), TPI_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "ffn_down") && strstr(err.msg, "Q4_0"), "message: %s", err.msg);
    /* tied output with Q8_0 stays Q8_0; embd 288 (not /256) puts the output on Q8_0 */
    small_config(&c, "qwen2", SYNTH_FT_Q5_K_M);
    c.n_embd = 288;
    c.n_head = 4;
    c.head_dim = 72;
    ck_assert_int_eq(synth_plan(&c, 600, &ts, &n, &err), TPI_OK);
    for (int i = 0; i < n; i++)
        if (ts[i].kind == SYNTH_TOKEN_EMBD)
            ck_assert_int_eq(ts[i].type, TPI_TYPE_Q8_0);
        else if (ts[i].kind == SYNTH_ATTN_Q)
            ck_assert_int_eq(ts[i].type, TPI_TYPE_Q5_1);
    free(ts);
    /* --pure: one type everywhere */
    small_config(&c, "qwen3", SYNTH_FT_Q4_K_M);
    c.pure = true;
    ck_assert_int_eq(synth_plan(&c, 600, &ts, &n, &err), TPI_OK);
    for (int i = 0; i < n; i++)
        ck_assert_int_eq(ts[i].type, ts[i].n_dims == 2 ? TPI_TYPE_Q4_K : TPI_TYPE_F32);
    free(ts);
}
END_TEST

/* The Q2_K, Q3_K and IQ4 mixes on a Qwen3-8B-like plan (36 layers, 32 / 8 heads: n_gqa 4),
 * as llama-quantize's llama_tensor_get_type (llama.cpp 4df29be, src/llama-quant.cpp)
 * chooses them; the tiny reference models check the n_gqa 2 side. */
START_TEST(test_plan_k2_k3_mixes) {
    static const struct {
        int ftype;
        int attn_v0, attn_v5, ffn_down1, ffn_down5, attn_output, attn_q;
    } cases[] = {
        {SYNTH_FT_Q2_K, TPI_TYPE_Q4_K, TPI_TYPE_Q4_K, TPI_TYPE_Q3_K, TPI_TYPE_Q3_K, TPI_TYPE_Q3_K,
         TPI_TYPE_Q2_K},
        {SYNTH_FT_Q3_K_S, TPI_TYPE_Q3_K, TPI_TYPE_Q3_K, TPI_TYPE_Q3_K, TPI_TYPE_Q3_K,
         TPI_TYPE_Q3_K, TPI_TYPE_Q3_K},
        /* Q3_K_M: attn_v of the first two layers Q5_K, ffn_down of the first n/16 (2) */
        {SYNTH_FT_Q3_K_M, TPI_TYPE_Q5_K, TPI_TYPE_Q4_K, TPI_TYPE_Q5_K, TPI_TYPE_Q4_K,
         TPI_TYPE_Q4_K, TPI_TYPE_Q3_K},
        {SYNTH_FT_Q3_K_L, TPI_TYPE_Q5_K, TPI_TYPE_Q5_K, TPI_TYPE_Q5_K, TPI_TYPE_Q5_K,
         TPI_TYPE_Q5_K, TPI_TYPE_Q3_K},
        /* IQ4_XS / IQ4_NL: attn_v Q5_K at n_gqa >= 4, ffn_down of the first n/8 (4) Q5_K */
        {SYNTH_FT_IQ4_XS, TPI_TYPE_Q5_K, TPI_TYPE_Q5_K, TPI_TYPE_Q5_K, TPI_TYPE_IQ4_XS,
         TPI_TYPE_IQ4_XS, TPI_TYPE_IQ4_XS},
        {SYNTH_FT_IQ4_NL, TPI_TYPE_Q5_K, TPI_TYPE_Q5_K, TPI_TYPE_Q5_K, TPI_TYPE_IQ4_NL,
         TPI_TYPE_IQ4_NL, TPI_TYPE_IQ4_NL},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        struct synth_config c;
        small_config(&c, "qwen3", cases[k].ftype);
        c.n_layer = 36;
        c.n_head = 8;
        c.n_head_kv = 2;
        c.head_dim = 32;
        struct synth_tensor *ts;
        int n;
        struct tpi_error err;
        ck_assert_int_eq(synth_plan(&c, 600, &ts, &n, &err), TPI_OK);
        for (int i = 0; i < n; i++) {
            const struct synth_tensor *t = &ts[i];
            int want = -1;
            if (t->kind == SYNTH_ATTN_V && (t->layer == 0 || t->layer == 5))
                want = t->layer == 0 ? cases[k].attn_v0 : cases[k].attn_v5;
            else if (t->kind == SYNTH_FFN_DOWN && (t->layer == 1 || t->layer == 5))
                want = t->layer == 1 ? cases[k].ffn_down1 : cases[k].ffn_down5;
            else if (t->kind == SYNTH_ATTN_OUTPUT)
                want = cases[k].attn_output;
            else if (t->kind == SYNTH_ATTN_Q || t->kind == SYNTH_FFN_UP ||
                     t->kind == SYNTH_TOKEN_EMBD)
                want = cases[k].attn_q;
            else if (t->kind == SYNTH_OUTPUT)
                want = TPI_TYPE_Q6_K;
            if (want >= 0)
                ck_assert_msg(t->type == want, "%s: %s is %s, want %s",
                              synth_ftype_name(cases[k].ftype), t->name, quant_type_name(t->type),
                              quant_type_name(want));
        }
        free(ts);
    }
    /* an 80-layer qwen2 is llama.cpp's 70B: attn_v's Q3_K/Q4_K become Q5_K */
    struct synth_config c;
    small_config(&c, "qwen2", SYNTH_FT_Q2_K);
    c.n_layer = 80;
    struct synth_tensor *ts;
    int n;
    struct tpi_error err;
    ck_assert_int_eq(synth_plan(&c, 600, &ts, &n, &err), TPI_OK);
    for (int i = 0; i < n; i++)
        if (ts[i].kind == SYNTH_ATTN_V) ck_assert_int_eq(ts[i].type, TPI_TYPE_Q5_K);
    free(ts);
    /* rows off the 256 edge: Q4_0, as llama.cpp 4df29be falls back for Q2_K and Q3_K */
    small_config(&c, "qwen3", SYNTH_FT_Q3_K_S);
    c.n_ff = 1056;
    ck_assert_int_eq(synth_plan(&c, 600, &ts, &n, &err), TPI_OK);
    for (int i = 0; i < n; i++)
        if (ts[i].kind == SYNTH_FFN_DOWN) ck_assert_int_eq(ts[i].type, TPI_TYPE_Q4_0);
    free(ts);
    small_config(&c, "qwen3", SYNTH_FT_IQ4_XS); /* IQ4_XS off the 256 edge: IQ4_NL */
    c.n_ff = 1056;
    ck_assert_int_eq(synth_plan(&c, 600, &ts, &n, &err), TPI_OK);
    for (int i = 0; i < n; i++)
        if (ts[i].kind == SYNTH_FFN_DOWN) ck_assert_int_eq(ts[i].type, TPI_TYPE_IQ4_NL);
    free(ts);
    ck_assert_int_eq(synth_ftype_from_name("q3_k"), SYNTH_FT_Q3_K_M);
    ck_assert_int_eq(synth_ftype_from_name("Q2_K"), SYNTH_FT_Q2_K);
    ck_assert_int_eq(synth_ftype_from_name("q3_k_l"), SYNTH_FT_Q3_K_L);
}
END_TEST

/* ---- written files ------------------------------------------------------- */

/* Open `path`, check metadata and tensors against config and plan, and the
 * statistics of every tensor's dequantized values. */
static void check_written(const char *path, const struct synth_config *c, int64_t n_vocab) {
    struct gguf_file *f = NULL;
    struct tpi_error err;
    ck_assert_msg(gguf_open(path, &f, &err) == TPI_OK, "open %s: %s", path, err.msg);
    const char *a = c->arch;
    char key[128];
#define K(s) (snprintf(key, sizeof key, "%s.%s", a, s), key)
    expect_kv_str(f, "general.architecture", a);
    ck_assert_int_eq(kv_int(f, K("block_count")), c->n_layer);
    ck_assert_int_eq(kv_int(f, K("embedding_length")), c->n_embd);
    ck_assert_int_eq(kv_int(f, K("feed_forward_length")), c->n_ff);
    ck_assert_int_eq(kv_int(f, K("context_length")), c->n_ctx);
    ck_assert_int_eq(kv_int(f, K("attention.head_count")), c->n_head);
    ck_assert_int_eq(kv_int(f, K("attention.head_count_kv")), c->n_head_kv);
    ck_assert_int_eq(kv_int(f, K("attention.key_length")), c->head_dim);
    ck_assert_int_eq(kv_int(f, K("attention.value_length")), c->head_dim);
    float fv;
    ck_assert(gguf_get_f32(f, K("rope.freq_base"), &fv) && fv == c->rope_freq_base);
    ck_assert(gguf_get_f32(f, K("attention.layer_norm_rms_epsilon"), &fv) && fv == c->rms_eps);
#undef K
    ck_assert_int_eq(kv_int(f, "general.file_type"), c->ftype);
    bool quantized =
        c->ftype != SYNTH_FT_F32 && c->ftype != SYNTH_FT_F16 && c->ftype != SYNTH_FT_BF16;
    if (quantized)
        ck_assert_int_eq(kv_int(f, "general.quantization_version"), 2);
    else
        ck_assert_ptr_null(gguf_find_kv(f, "general.quantization_version"));
    expect_kv_str(f, "tokenizer.ggml.model", "gpt2");
    expect_kv_str(f, "tokenizer.ggml.pre", "qwen2");
    const struct gguf_kv *toks = gguf_find_kv(f, "tokenizer.ggml.tokens");
    ck_assert_ptr_nonnull(toks);
    ck_assert_int_eq((int64_t)toks->arr_n, n_vocab);
    ck_assert_int_eq((int64_t)gguf_find_kv(f, "tokenizer.ggml.token_type")->arr_n, n_vocab);
    ck_assert_ptr_nonnull(gguf_find_kv(f, "tokenizer.ggml.merges"));
    bool add_bos = true;
    ck_assert(gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &add_bos) && !add_bos);
    ck_assert_ptr_nonnull(gguf_find_kv(f, "tokenizer.chat_template"));
    int64_t eos = kv_int(f, "tokenizer.ggml.eos_token_id");
    ck_assert(eos >= 0 && eos < n_vocab);
    kv_int(f, "tokenizer.ggml.padding_token_id");
    kv_int(f, "tokenizer.ggml.bos_token_id");

    struct synth_tensor *ts;
    int n;
    ck_assert_int_eq(synth_plan(c, n_vocab, &ts, &n, &err), TPI_OK);
    ck_assert_int_eq(gguf_n_tensors(f), n);
    for (int i = 0; i < n; i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        ck_assert_str_eq(t->name, ts[i].name);
        ck_assert_int_eq(t->type, ts[i].type);
        ck_assert_int_eq(t->n_dims, ts[i].n_dims);
        ck_assert_int_eq(t->ne[0], ts[i].ne[0]);
        ck_assert_int_eq(t->ne[1], ts[i].ne[1]);
        /* dequantized statistics: finite, mean/std of the intended distribution */
        int64_t n_el = t->ne[0] * t->ne[1];
        float *y = malloc((size_t)n_el * sizeof *y);
        ck_assert_int_eq(quant_dequant_rows(t->type, t->data, t->ne[0], 0, t->ne[1], y, &err),
                         TPI_OK);
        double s = 0, s2 = 0;
        int64_t n_bad = 0, first_bad = -1;
        for (int64_t k = 0; k < n_el; k++) {
            if (!isfinite(y[k]) && n_bad++ == 0) first_bad = k;
            s += y[k];
            s2 += (double)y[k] * y[k];
        }
        /* one assertion per tensor: Check reports every passing assertion to its parent */
        ck_assert_msg(n_bad == 0, "%s: %lld values not finite, first at %lld", t->name,
                      (long long)n_bad, (long long)first_bad);
        double mean = s / (double)n_el, sd = sqrt(s2 / (double)n_el - mean * mean);
        double want_mean = 0, want_sd;
        bool is_norm = strstr(t->name, "norm") != NULL;
        if (is_norm) {
            want_mean = 1.0;
            want_sd = 0.02;
        } else if (strstr(t->name, ".bias")) {
            want_sd = 0.02;
        } else if (!strcmp(t->name, "token_embd.weight")) {
            want_sd = 0.03;
        } else {
            want_sd = 1.0 / sqrt((double)t->ne[0]);
        }
        /* sampling error of the sd (>= 64 values: ~9%) plus quantization noise */
        double tol = n_el < 1000 ? 0.3 : 0.1;
        ck_assert_msg(fabs(mean - want_mean) <= 4 * want_sd / sqrt((double)n_el) + 0.02 * want_sd,
                      "%s: mean %g, want %g", t->name, mean, want_mean);
        ck_assert_msg(fabs(sd - want_sd) <= tol * want_sd, "%s: sd %g, want %g", t->name, sd,
                      want_sd);
        free(y);
    }
    free(ts);
    gguf_close(&f);
}

START_TEST(test_write_every_type) {
    static const struct {
        const char *arch;
        int ftype;
    } cases[] = {
        {"qwen3", SYNTH_FT_Q4_K_M}, {"qwen2", SYNTH_FT_Q5_K_M}, {"qwen3", SYNTH_FT_BF16},
        {"qwen2", SYNTH_FT_F16},    {"qwen3", SYNTH_FT_F32},    {"qwen3", SYNTH_FT_Q8_0},
        {"qwen2", SYNTH_FT_Q4_0},   {"qwen3", SYNTH_FT_Q4_1},   {"qwen2", SYNTH_FT_Q5_0},
        {"qwen3", SYNTH_FT_Q5_1},   {"qwen3", SYNTH_FT_Q6_K},   {"qwen2", SYNTH_FT_Q4_K_S},
        {"qwen3", SYNTH_FT_Q5_K_S}, {"qwen3", SYNTH_FT_Q2_K},   {"qwen2", SYNTH_FT_Q3_K_S},
        {"qwen3", SYNTH_FT_Q3_K_M}, {"qwen2", SYNTH_FT_Q3_K_L}, {"qwen3", SYNTH_FT_IQ4_XS},
        {"qwen2", SYNTH_FT_IQ4_NL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct synth_config c;
        small_config(&c, cases[i].arch, cases[i].ftype);
        snprintf(c.name, sizeof c.name, "test-%s", synth_ftype_name(c.ftype));
        const char *path = tmp_file("m.gguf");
        struct synth_stats st;
        struct tpi_error err;
        ck_assert_msg(synth_write(&c, path, &st, &err) == TPI_OK, "%s %s: %s", c.arch,
                      synth_ftype_name(c.ftype), err.msg);
        ck_assert_int_eq(st.n_vocab, 600);
        ck_assert_int_eq(st.n_merges, 128);
        check_written(path, &c, 600);
        struct gguf_file *f;
        ck_assert_int_eq(gguf_open(path, &f, &err), TPI_OK);
        expect_kv_str(f, "general.name", c.name);
        ck_assert_uint_eq(gguf_total_size(f), st.n_bytes);
        gguf_close(&f);
        ck_assert_int_ne(access(tmp_file("m.gguf.tmp"), F_OK), 0); /* no leftover */
        unlink(path);
    }
}
END_TEST

static unsigned char *read_all(const char *path, size_t *n) {
    char *p = tu_read_file(path, n);
    ck_assert_ptr_nonnull(p);
    return (unsigned char *)p;
}

START_TEST(test_threads_identical) {
    struct synth_config c;
    small_config(&c, "qwen3", SYNTH_FT_Q4_K_M);
    c.n_layer = 3;
    c.n_ff = 768; /* a shape where the 4 MiB chunks do not line up with tensors */
    struct tpi_error err;
    const char *p1 = tmp_file("t1.gguf"), *p2 = tmp_file("t2.gguf"), *p3 = tmp_file("t3.gguf");
    c.n_threads = 1;
    ck_assert_int_eq(synth_write(&c, p1, NULL, &err), TPI_OK);
    c.n_threads = 2;
    ck_assert_int_eq(synth_write(&c, p2, NULL, &err), TPI_OK);
    c.seed = 8;
    ck_assert_int_eq(synth_write(&c, p3, NULL, &err), TPI_OK);
    size_t n1, n2, n3;
    unsigned char *a = read_all(p1, &n1), *b = read_all(p2, &n2), *d = read_all(p3, &n3);
    ck_assert_uint_eq(n1, n2);
    ck_assert_msg(memcmp(a, b, n1) == 0, "1 and 2 threads give different files");
    ck_assert_uint_eq(n1, n3);
    ck_assert_msg(memcmp(a, d, n1) != 0, "seeds 7 and 8 give the same file");
    free(a);
    free(b);
    free(d);
    unlink(p1);
    unlink(p2);
    unlink(p3);
}
END_TEST

/* ---- vocabularies ---------------------------------------------------------- */

START_TEST(test_builtin_vocab) {
    struct synth_config c;
    small_config(&c, "qwen3", SYNTH_FT_Q8_0);
    c.n_layer = 1;
    c.n_merges = 50;
    c.n_vocab = 0; /* exactly the vocabulary */
    const char *path = tmp_file("v.gguf");
    struct synth_stats st;
    struct tpi_error err;
    ck_assert_int_eq(synth_write(&c, path, &st, &err), TPI_OK);
    ck_assert_int_eq(st.n_vocab, 256 + 50 + 3);
    struct gguf_file *f;
    ck_assert_int_eq(gguf_open(path, &f, &err), TPI_OK);
    struct gguf_str *tok;
    uint64_t n_tok;
    ck_assert_int_eq(gguf_arr_strings(gguf_find_kv(f, "tokenizer.ggml.tokens"), &tok, &n_tok, &err),
                     TPI_OK);
    ck_assert_uint_eq(n_tok, 309);
    /* byte tokens in GPT-2 byte-to-unicode order: '!' first, 'Ā' (byte 0) at 188, 'Ġ' (space) at
     * 220 */
    ck_assert(tok[0].len == 1 && tok[0].data[0] == '!');
    ck_assert(tok[188].len == 2 && !memcmp(tok[188].data, "\xC4\x80", 2));
    ck_assert(tok[220].len == 2 && !memcmp(tok[220].data, "\xC4\xA0", 2));
    ck_assert(tok[306].len == 13 && !memcmp(tok[306].data, "<|endoftext|>", 13));
    ck_assert(tok[308].len == 10 && !memcmp(tok[308].data, "<|im_end|>", 10));
    /* the first merge of the sample text is a space-led pair; every merge joins two tokens */
    const struct gguf_kv *merges = gguf_find_kv(f, "tokenizer.ggml.merges");
    ck_assert_uint_eq(merges->arr_n, 50);
    struct gguf_str *mg;
    uint64_t n_mg;
    ck_assert_int_eq(gguf_arr_strings(merges, &mg, &n_mg, &err), TPI_OK);
    for (uint64_t i = 0; i < n_mg; i++) {
        /* merge i made token 256+i: "a b" with a+b == that token */
        const struct gguf_str *t = &tok[256 + i];
        ck_assert_uint_eq(mg[i].len, t->len + 1);
        const char *sp = memchr(mg[i].data, ' ', mg[i].len);
        ck_assert_ptr_nonnull(sp);
        size_t la = (size_t)(sp - mg[i].data);
        ck_assert(!memcmp(mg[i].data, t->data, la) && !memcmp(sp + 1, t->data + la, t->len - la));
    }
    free(mg);
    int64_t ty;
    const struct gguf_kv *types = gguf_find_kv(f, "tokenizer.ggml.token_type");
    ck_assert(gguf_arr_int(types, 0, &ty) && ty == 1);
    ck_assert(gguf_arr_int(types, 307, &ty) && ty == 3);
    ck_assert_int_eq(kv_int(f, "tokenizer.ggml.eos_token_id"), 308);
    ck_assert_int_eq(kv_int(f, "tokenizer.ggml.padding_token_id"), 306);
    ck_assert_int_eq(kv_int(f, "tokenizer.ggml.bos_token_id"), 306);
    free(tok);
    /* same byte order as the real Qwen3 vocabulary */
    const char *qv = tu_data_path("qwen3-vocab.gguf");
    if (qv) {
        struct gguf_file *q;
        ck_assert_int_eq(gguf_open(qv, &q, &err), TPI_OK);
        struct gguf_str *qt;
        uint64_t n_qt;
        ck_assert_int_eq(
            gguf_arr_strings(gguf_find_kv(q, "tokenizer.ggml.tokens"), &qt, &n_qt, &err), TPI_OK);
        struct gguf_str *mt;
        uint64_t n_mt;
        ck_assert_int_eq(
            gguf_arr_strings(gguf_find_kv(f, "tokenizer.ggml.tokens"), &mt, &n_mt, &err), TPI_OK);
        for (int i = 0; i < 256; i++)
            ck_assert_msg(mt[i].len == qt[i].len && !memcmp(mt[i].data, qt[i].data, mt[i].len),
                          "byte token %d differs from Qwen3's", i);
        free(qt);
        free(mt);
        gguf_close(&q);
    }
    gguf_close(&f);
    /* padding: --vocab larger pads with [PADn] UNUSED tokens */
    c.n_vocab = 320;
    ck_assert_int_eq(synth_write(&c, path, &st, &err), TPI_OK);
    ck_assert_int_eq(gguf_open(path, &f, &err), TPI_OK);
    ck_assert_int_eq(gguf_find_tensor(f, "token_embd.weight")->ne[1], 320);
    ck_assert_int_eq(gguf_arr_strings(gguf_find_kv(f, "tokenizer.ggml.tokens"), &tok, &n_tok, &err),
                     TPI_OK);
    ck_assert(tok[319].len == 8 && !memcmp(tok[319].data, "[PAD319]", 8));
    ck_assert(gguf_arr_int(gguf_find_kv(f, "tokenizer.ggml.token_type"), 319, &ty) && ty == 5);
    free(tok);
    gguf_close(&f);
    /* smaller than the vocabulary: an error */
    c.n_vocab = 300;
    ck_assert_int_eq(synth_write(&c, path, &st, &err), TPI_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "--vocab 300"), "message: %s", err.msg);
    unlink(path);
}
END_TEST

/* Every tokenizer.* kv of `src` is in `dst` with identical bytes. */
static void expect_tokenizer_copied(const struct gguf_file *src, const struct gguf_file *dst,
                                    bool chat_template) {
    int n = 0;
    for (int64_t i = 0; i < gguf_n_kv(src); i++) {
        const struct gguf_kv *kv = gguf_kv_at(src, i);
        if (kv->key.len < 10 || memcmp(kv->key.data, "tokenizer.", 10)) continue;
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.data);
        if (!chat_template && !strcmp(key, "tokenizer.chat_template")) continue;
        const struct gguf_kv *d = gguf_find_kv(dst, key);
        ck_assert_msg(d != NULL, "%s missing", key);
        ck_assert_msg(d->type == kv->type && d->n_bytes == kv->n_bytes &&
                          !memcmp(d->data, kv->data, kv->n_bytes),
                      "%s differs", key);
        n++;
    }
    ck_assert_int_ge(n, 9);
}

START_TEST(test_vocab_from_gguf) {
    const char *qv = tu_data_path("qwen3-vocab.gguf");
    if (!qv) {
        fprintf(stderr, "SKIP: qwen3-vocab.gguf not found\n");
        return;
    }
    struct synth_config c;
    small_config(&c, "qwen3", SYNTH_FT_Q8_0);
    c.n_layer = 1;
    c.n_embd = 64;
    c.n_head = 2;
    c.n_head_kv = 1;
    c.head_dim = 32;
    c.n_ff = 64;
    c.n_vocab = 0;
    snprintf(c.vocab_from, sizeof c.vocab_from, "%s", qv);
    const char *path = tmp_file("qv.gguf");
    struct synth_stats st;
    struct tpi_error err;
    ck_assert_msg(synth_write(&c, path, &st, &err) == TPI_OK, "%s", err.msg);
    ck_assert_int_eq(st.n_vocab, 151936);
    struct gguf_file *src, *dst;
    ck_assert_int_eq(gguf_open(qv, &src, &err), TPI_OK);
    ck_assert_int_eq(gguf_open(path, &dst, &err), TPI_OK);
    expect_tokenizer_copied(src, dst, true);
    ck_assert_int_eq(gguf_find_tensor(dst, "token_embd.weight")->ne[1], 151936);
    ck_assert_ptr_null(
        gguf_find_kv(dst, "qwen3.vocab_size")); /* only tokenizer.* keys are copied */
    gguf_close(&src);
    gguf_close(&dst);
    /* a copied vocabulary cannot be resized */
    c.n_vocab = 1000;
    ck_assert_int_eq(synth_write(&c, path, &st, &err), TPI_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "151936"), "message: %s", err.msg);
    unlink(path);
}
END_TEST

START_TEST(test_vocab_from_tokenizer_json) {
    const char *tj = tu_data_path("qwen3-tokenizer/tokenizer.json");
    const char *qv0 = tu_data_path("qwen3-vocab.gguf");
    if (!tj || !qv0) {
        fprintf(stderr, "SKIP: qwen3-tokenizer/tokenizer.json or qwen3-vocab.gguf not found\n");
        return;
    }
    char qv[1024];
    snprintf(qv, sizeof qv, "%s", qv0);
    struct synth_config c;
    small_config(&c, "qwen3", SYNTH_FT_Q8_0);
    c.n_layer = 1;
    c.n_embd = 64;
    c.n_head = 2;
    c.n_head_kv = 1;
    c.head_dim = 32;
    c.n_ff = 64;
    c.n_vocab = 151936; /* padded as the real models are */
    snprintf(c.vocab_from, sizeof c.vocab_from, "%s", tj);
    const char *path = tmp_file("tj.gguf");
    struct synth_stats st;
    struct tpi_error err;
    ck_assert_msg(synth_write(&c, path, &st, &err) == TPI_OK, "%s", err.msg);
    struct gguf_file *src, *dst;
    ck_assert_int_eq(gguf_open(qv, &src, &err), TPI_OK);
    ck_assert_int_eq(gguf_open(path, &dst, &err), TPI_OK);
    /* the reference vocabulary was made from this tokenizer.json by llama.cpp's
     * gguf package: tokens, types, merges, special ids and template agree */
    expect_tokenizer_copied(src, dst, true);
    gguf_close(&src);
    gguf_close(&dst);
    unlink(path);
}
END_TEST

/* --chat-template FILE: the file's text becomes tokenizer.chat_template, for the built-in
 * vocabulary and in place of a copied vocabulary's own (its other keys copied as ever). */
START_TEST(test_chat_template_file) {
    char tmpl_path[1024];
    snprintf(tmpl_path, sizeof tmpl_path, "%s/tests/chat/qwen3.jinja", tu_source_dir());
    size_t n_tmpl = 0;
    char *want = tu_read_file(tmpl_path, &n_tmpl);
    ck_assert_ptr_nonnull(want);
    const char *qv = tu_data_path("qwen3-vocab.gguf");
    for (int copied = 0; copied < 1 + (qv != NULL); copied++) {
        struct synth_config c;
        small_config(&c, "qwen3", SYNTH_FT_Q8_0);
        if (copied) {
            c.n_vocab = 0;
            snprintf(c.vocab_from, sizeof c.vocab_from, "%s", qv);
            // the Qwen3 vocabulary carries that template already: give another one
            snprintf(tmpl_path, sizeof tmpl_path, "%s/tests/chat/qwen2.5.jinja", tu_source_dir());
            free(want);
            want = tu_read_file(tmpl_path, &n_tmpl);
            ck_assert_ptr_nonnull(want);
        }
        snprintf(c.chat_template_from, sizeof c.chat_template_from, "%s", tmpl_path);
        const char *path = tmp_file("tmpl.gguf");
        struct synth_stats st;
        struct tpi_error err;
        ck_assert_msg(synth_write(&c, path, &st, &err) == TPI_OK, "%s", err.msg);
        struct gguf_file *dst;
        ck_assert_int_eq(gguf_open(path, &dst, &err), TPI_OK);
        struct gguf_str got;
        ck_assert(gguf_get_str(dst, "tokenizer.chat_template", &got));
        ck_assert_msg(got.len == n_tmpl && !memcmp(got.data, want, n_tmpl),
                      "template of %zu bytes, want the %zu of %s", (size_t)got.len, n_tmpl,
                      tmpl_path);
        if (copied) {
            struct gguf_file *src;
            ck_assert_int_eq(gguf_open(qv, &src, &err), TPI_OK);
            expect_tokenizer_copied(src, dst, false);
            gguf_close(&src);
        }
        gguf_close(&dst);
        unlink(path);
    }
    free(want);
    // A file that is missing or empty is refused, naming it.
    struct synth_config c;
    small_config(&c, "qwen3", SYNTH_FT_Q8_0);
    const char *bad[2] = {"/nonexistent-dir/t.jinja", "/dev/null"};
    for (int k = 0; k < 2; k++) {
        snprintf(c.chat_template_from, sizeof c.chat_template_from, "%s", bad[k]);
        struct synth_stats st;
        struct tpi_error err;
        ck_assert_int_ne(synth_write(&c, tmp_file("bad.gguf"), &st, &err), TPI_OK);
        ck_assert_msg(strstr(err.msg, "--chat-template") && strstr(err.msg, bad[k]), "%s",
                      err.msg);
    }
}
END_TEST

/* ---- errors ---------------------------------------------------------------- */

START_TEST(test_config_errors) {
    struct synth_config c;
    struct tpi_error err;
    small_config(&c, "qwen3", SYNTH_FT_Q8_0);
    c.n_head_kv = 3;
    ck_assert_int_eq(synth_check_config(&c, &err), TPI_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "--kv-heads 3"), "message: %s", err.msg);
    small_config(&c, "qwen3", SYNTH_FT_Q8_0);
    c.head_dim = 0;
    c.n_head = 3; /* 256 / 3 */
    c.n_head_kv = 1;
    ck_assert_int_eq(synth_check_config(&c, &err), TPI_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "--heads 3"), "message: %s", err.msg);
    small_config(&c, "qwen3", SYNTH_FT_Q8_0);
    c.head_dim = 63;
    ck_assert_int_eq(synth_check_config(&c, &err), TPI_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "even"), "message: %s", err.msg);
    small_config(&c, "llama", SYNTH_FT_Q8_0);
    ck_assert_int_eq(synth_check_config(&c, &err), TPI_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "llama"), "message: %s", err.msg);
    small_config(&c, "qwen3", 12345);
    ck_assert_int_eq(synth_check_config(&c, &err), TPI_ERR_INVALID);
    small_config(&c, "qwen3", SYNTH_FT_Q8_0);
    c.n_layer = 0;
    ck_assert_int_eq(synth_check_config(&c, &err), TPI_ERR_INVALID);
    ck_assert_int_eq(synth_ftype_from_name("iq3_s"), -1);
    ck_assert_int_eq(synth_ftype_from_name("Q4_K"), SYNTH_FT_Q4_K_M);
    ck_assert_int_eq(synth_ftype_from_name("q5_k"), SYNTH_FT_Q5_K_M);
    ck_assert_int_eq(synth_ftype_from_name("bf16"), SYNTH_FT_BF16);
    ck_assert_str_eq(synth_ftype_name(SYNTH_FT_Q4_K_M), "Q4_K_M");
    ck_assert_int_eq(synth_apply_preset(&c, "qwen3-9b", &err), TPI_ERR_INVALID);
    ck_assert_int_eq(synth_apply_preset(&c, "qwen3-8b", &err), TPI_OK);
    ck_assert(c.n_layer == 36 && c.n_embd == 4096 && c.n_head == 32 && c.n_head_kv == 8 &&
              c.head_dim == 128 && c.n_ff == 12288 && c.n_vocab == 151936 && !c.tied);
    ck_assert_int_eq(synth_apply_preset(&c, "qwen3-0.6b", &err), TPI_OK);
    ck_assert(c.n_layer == 28 && c.n_embd == 1024 && c.n_head == 16 && c.n_ff == 3072 && c.tied);
    ck_assert_int_eq(synth_apply_preset(&c, "qwen3-32b", &err), TPI_OK);
    ck_assert(c.n_layer == 64 && c.n_embd == 5120 && c.n_head == 64 && c.n_ff == 25600 && !c.tied);
    /* unwritable output: an I/O error naming the path, no file left behind */
    small_config(&c, "qwen3", SYNTH_FT_Q8_0);
    ck_assert_int_eq(synth_write(&c, "/nonexistent-dir/x.gguf", NULL, &err), TPI_ERR_IO);
    ck_assert_msg(strstr(err.msg, "/nonexistent-dir/x.gguf"), "message: %s", err.msg);
    /* an output that is no regular file (a pipe, a directory): refused and left as it was,
     * not replaced by the finished file's rename */
    const char *fifo = tmp_file("pipe.gguf"), *dir = tmp_file("dir.gguf");
    ck_assert_int_eq(mkfifo(fifo, 0644), 0);
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    const char *odd[2] = {fifo, dir};
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(synth_write(&c, odd[i], NULL, &err), TPI_ERR_INVALID);
        ck_assert_msg(strstr(err.msg, odd[i]) && strstr(err.msg, "not a regular file"),
                      "message: %s", err.msg);
        struct stat sb;
        ck_assert_int_eq(lstat(odd[i], &sb), 0);
        ck_assert(i == 0 ? S_ISFIFO(sb.st_mode) : S_ISDIR(sb.st_mode));
    }
    /* a link to a file: the file gets the model, the link stays */
    const char *target = tmp_file("target.gguf"), *link = tmp_file("link.gguf");
    FILE *tf = fopen(target, "w");
    ck_assert_ptr_nonnull(tf);
    fclose(tf);
    ck_assert_int_eq(symlink(target, link), 0);
    ck_assert_int_eq(synth_write(&c, link, NULL, &err), TPI_OK);
    struct stat lsb, tsb;
    ck_assert_int_eq(lstat(link, &lsb), 0);
    ck_assert(S_ISLNK(lsb.st_mode));
    ck_assert_int_eq(stat(target, &tsb), 0);
    ck_assert(S_ISREG(tsb.st_mode) && tsb.st_size > 1000);
    /* a missing vocabulary file */
    snprintf(c.vocab_from, sizeof c.vocab_from, "%s", "/nonexistent-dir/tokenizer.json");
    ck_assert_int_eq(synth_write(&c, tmp_file("x.gguf"), NULL, &err), TPI_ERR_IO);
    ck_assert_msg(strstr(err.msg, "tokenizer.json"), "message: %s", err.msg);
}
END_TEST

/* Run the binary with arguments; returns its exit code, stderr in errbuf. */
static int run_cli(char *errbuf, size_t errbuf_n, const char *args) {
    char cmd[2048];
    const char *errpath = tmp_file("cli.err");
    snprintf(cmd, sizeof cmd, "%s mkmodel %s 2>%s", tu_binary(), args, errpath);
    int rc = system(cmd);
    size_t n = 0;
    char *e = tu_read_file(errpath, &n);
    snprintf(errbuf, errbuf_n, "%s", e ? e : "");
    free(e);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

START_TEST(test_cli) {
    if (access(tu_binary(), X_OK) != 0) {
        fprintf(stderr, "SKIP: %s not built\n", tu_binary());
        return;
    }
    char e[4096], args[1024], out[512];
    snprintf(out, sizeof out, "%s", tmp_file("cli.gguf"));
    snprintf(
        args, sizeof args,
        "-o %s --preset tiny --layers 1 --arch qwen2 --tied --type q4_k_m -t 2 --seed 3 --name cli",
        out);
    ck_assert_msg(run_cli(e, sizeof e, args) == 0, "stderr: %s", e);
    ck_assert_msg(strstr(e, "wrote"), "stderr: %s", e);
    struct gguf_file *f;
    struct tpi_error err;
    ck_assert_int_eq(gguf_open(out, &f, &err), TPI_OK);
    expect_kv_str(f, "general.architecture", "qwen2");
    expect_kv_str(f, "general.name", "cli");
    ck_assert_int_eq(kv_int(f, "qwen2.block_count"), 1);
    ck_assert_ptr_null(gguf_find_tensor(f, "output.weight"));
    ck_assert_int_eq(gguf_find_tensor(f, "token_embd.weight")->type, TPI_TYPE_Q6_K);
    ck_assert_ptr_nonnull(gguf_find_tensor(f, "blk.0.attn_q.bias"));
    gguf_close(&f);
    unlink(out);
    snprintf(args, sizeof args, "-o %s --type iq2_xxs", out);
    ck_assert_int_eq(run_cli(e, sizeof e, args), 2);
    ck_assert_msg(strstr(e, "iq2_xxs"), "stderr: %s", e);
    snprintf(args, sizeof args, "-o %s --heads 6 --kv-heads 4", out);
    ck_assert_int_eq(run_cli(e, sizeof e, args), 2);
    ck_assert_msg(strstr(e, "--kv-heads 4"), "stderr: %s", e);
    snprintf(args, sizeof args, "-o %s --layers x", out);
    ck_assert_int_eq(run_cli(e, sizeof e, args), 2);
    ck_assert_int_eq(run_cli(e, sizeof e, "--layers 2"), 2); /* no -o */
    ck_assert_int_eq(run_cli(e, sizeof e, "-o /nonexistent-dir/m.gguf -q"), 1);
    ck_assert_msg(strstr(e, "/nonexistent-dir/m.gguf"), "stderr: %s", e);
    ck_assert_int_ne(access(out, F_OK), 0);
}
END_TEST

int main(void) {
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/test_mkmodel.XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    Suite *s = suite_create("mkmodel");
    TCase *tc = tcase_create("mkmodel");
    tcase_add_test(tc, test_plan_matches_reference);
    tcase_add_test(tc, test_plan_fallbacks);
    tcase_add_test(tc, test_plan_k2_k3_mixes);
    tcase_add_test(tc, test_write_every_type);
    tcase_add_test(tc, test_threads_identical);
    tcase_add_test(tc, test_builtin_vocab);
    tcase_add_test(tc, test_vocab_from_gguf);
    tcase_add_test(tc, test_vocab_from_tokenizer_json);
    tcase_add_test(tc, test_chat_template_file);
    tcase_add_test(tc, test_config_errors);
    tcase_add_test(tc, test_cli);
    tcase_set_timeout(tc, 120);
    suite_add_tcase(s, tc);
    int rc = tu_run_suite(s);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp_dir);
    return rc;
}
