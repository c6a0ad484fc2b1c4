/*
 * test_model.c — the Qwen2/Qwen3 forward pass against llama.cpp's own CPU run of
 * the tiny models (../shared/data/NAME.ref.json) and against llama-perplexity.
 *
 * Usage (one ctest test per model and mode, so ctest -j spreads them):
 *   test_model logits NAME          top-1 / top-10 / last_logits / greedy vs NAME.ref.json
 *   test_model logits_yarn NAME     the same with YaRN given as options, vs
 *                                   NAME.yarn.ref.json (llama.cpp run with YaRN)
 *   test_model logits_yarn_keys NAME  ... with YaRN as rope.scaling.* keys in a copy
 *   test_model ppl NAME PPL_REF     perplexity of ppl-text.txt with -c 128 vs llama.cpp
 *   test_model ppl_cli NAME PPL_REF the same through `tpinfer perplexity`, and its
 *                                   argument errors
 *   test_model unit                 config, plan and sampling checks (no reference data)
 *
 * Tolerances. llama.cpp's reference quantizes activations to 8 bits (Q8_0/Q8_K)
 * before dot products with quantized weights, rounds them to f16/bf16 for F16/BF16
 * weights, and keeps K/V in f16; we keep f32 activations and an f32 cache. Those
 * roundings are relative errors of ~2^-8 (8-bit) or ~2^-9..2^-11 (bf16/f16) per
 * product input that average out over the dot products but accumulate over layers;
 * the logits here are O(10), so the measured gap (printed per model) is a few
 * hundredths to a few tenths. The bounds below are ~2-3x the measured maxima:
 * tight enough that a wrong rope, norm, bias or head split (which moves logits by
 * whole units) fails, loose enough for rounding. Top-1 ids are compared only where
 * the reference's top-1/top-2 gap exceeds 0.1, top-10 sets apart from ids within
 * TIE_TOL of the 10th logit, greedy tokens up to the first step whose reference
 * margin is under 0.1 (README of the data).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "model/generate.h"
#include "model/model.h"
#include "model/perplexity.h"
#include "model/sampling.h"
#include "testutil.h"
#include "text/tokenizer.h"

static const char *g_name;   /* model name, e.g. "qwen3-tiny-bf16" */
/* logits_yarn: the reference is llama.cpp's run with YaRN (NAME.yarn.ref.json, its
 * "rope" object: --rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 256), given to us as
 * the same options (1) or as rope.scaling.* keys in a copy of the model (2); 0: none */
static int g_yarn;
static double g_ppl_ref;     /* llama.cpp's perplexity */

/* Per model: the max |ours - llama.cpp| over last_logits allowed (atol), and the
 * smallest reference margin (top-1 minus top-2 logit) at which top-1 ids and greedy
 * steps must agree (margin). Measured max abs errors (all 5 prompts' last_logits):
 *   qwen2-tiny-f16 0.044, qwen3-tiny-bf16 0.038      (f16/bf16 activation rounding)
 *   qwen3-tiny-q8_0 0.16, qwen2-tiny-q4_0 0.56        (Q8_0: 8-bit, 32-element blocks)
 *   qwen3-tiny-q4_k_m 0.25, qwen3-tiny-q6_k 0.22,
 *   qwen2-tiny-q5_k_m 0.89, qwen3-tiny-q2_k 0.26,
 *   qwen2-tiny-q3_k_m 0.68, qwen2-tiny-iq4_xs 0.86    (Q8_K: 8-bit, 256-element blocks)
 * The ordering is the signature of llama.cpp's activation quantization, not of the
 * weight format: Q5_K weights are finer than Q4_0, yet q5_k_m is further off,
 * because K-quant dot products round activations in 256-element blocks (coarser
 * scales) where Q4_0/Q8_0 use 32. The qwen2 models' logits are ~2x larger (tied,
 * large output projection), hence their larger absolute errors. atol is ~2x the
 * measured maximum. For the quantized models the data README's 0.1 margin is below
 * llama.cpp's own rounding error, so the margin is set to about the measured max
 * error: a top-1 flip needs the two logits to move by that much in opposite
 * directions. */
struct model_tol {
    const char *name;
    double atol, margin;
};
static const struct model_tol tols[] = {
    {"qwen2-tiny-f16", 0.10, 0.1},    {"qwen3-tiny-bf16", 0.10, 0.1},
    {"qwen3-tiny-q8_0", 0.35, 0.2},   {"qwen2-tiny-q4_0", 1.2, 0.6},
    {"qwen3-tiny-q4_k_m", 0.5, 0.3},  {"qwen3-tiny-q6_k", 0.5, 0.3},
    {"qwen3-tiny-q2_k", 0.5, 0.3},    {"qwen2-tiny-q3_k_m", 1.4, 0.7},
    {"qwen2-tiny-iq4_xs", 1.8, 0.9},  {"qwen2-tiny-q5_k_m", 1.8, 0.9},
};
static const struct model_tol *tol_of(const char *name) {
    for (size_t i = 0; i < sizeof tols / sizeof tols[0]; i++)
        if (!strcmp(tols[i].name, name)) return &tols[i];
    return &tols[sizeof tols / sizeof tols[0] - 1]; // unknown model: the loosest
}
static double logit_atol(const char *name) {
    if (getenv("TEST_MODEL_ATOL")) return atof(getenv("TEST_MODEL_ATOL")); // for measuring
    return tol_of(name)->atol;
}
static double margin_min(const char *name) {
    if (getenv("TEST_MODEL_MARGIN")) return atof(getenv("TEST_MODEL_MARGIN")); // for measuring
    return tol_of(name)->margin;
}
/* ids this close to the 10th logit (or within the margin) may swap in/out of the top 10 */
#define TIE_TOL 0.25

static struct model *load_rope(const char *path, int n_ctx, const char *scaling, float scale,
                               int orig_ctx) {
    // One thread: ctest -j2 runs two tests at once on the 2-core CI machine.
    struct model_params p = {.path = path, .backend = "cpu", .n_threads = 1, .n_ctx = n_ctx,
                             .quiet = true, .rope = {scaling, scale, orig_ctx}};
    struct model *m = NULL;
    struct tpi_error err = {0};
    int rc = model_load(&m, &p, NULL, &err);
    ck_assert_msg(rc == TPI_OK, "model_load(%s): %s", path, err.msg);
    return m;
}

static struct model *load(const char *path, int n_ctx) {
    return load_rope(path, n_ctx, NULL, 0.0f, 0);
}

/* One change to a copy of a model: key `drop` left out, and `key` (if not NULL) set to
 * value (type u32, f32, bool or str); tensors past `n_tensors` (-1: all; the first
 * change's counts) left out. */
struct key_edit {
    const char *drop, *key;
    char vt; /* 'u', 'f', 'b' or 's' */
    double num;
    const char *str;
    int64_t n_tensors;
};

static bool edit_names(const struct key_edit *e, int n, const struct gguf_str *key) {
    for (int k = 0; k < n; k++)
        if ((e[k].drop && strlen(e[k].drop) == key->len &&
             !memcmp(key->data, e[k].drop, key->len)) ||
            (e[k].key && strlen(e[k].key) == key->len && !memcmp(key->data, e[k].key, key->len)))
            return true;
    return false;
}

/* A copy of f (in the test's temporary folder) with the n edits e made. */
static const char *edited_copy_n(const struct gguf_file *f, const struct key_edit *e, int n) {
    struct gguf_writer *w = gguf_writer_new(0);
    ck_assert_ptr_nonnull(w);
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const struct gguf_kv *kv = gguf_kv_at(f, i);
        if (!edit_names(e, n, &kv->key)) ck_assert_int_eq(gguf_writer_copy_kv(w, kv), TPI_OK);
    }
    for (int k = 0; k < n; k++) {
        int rc = TPI_OK;
        if (e[k].key && e[k].vt == 'u') rc = gguf_writer_set_u32(w, e[k].key, (uint32_t)e[k].num);
        if (e[k].key && e[k].vt == 'f') rc = gguf_writer_set_f32(w, e[k].key, (float)e[k].num);
        if (e[k].key && e[k].vt == 'b') rc = gguf_writer_set_bool(w, e[k].key, e[k].num != 0);
        if (e[k].key && e[k].vt == 's') rc = gguf_writer_set_str(w, e[k].key, e[k].str);
        ck_assert_int_eq(rc, TPI_OK);
    }
    const int64_t nt = n > 0 && e[0].n_tensors >= 0 ? e[0].n_tensors : gguf_n_tensors(f);
    for (int64_t i = 0; i < nt; i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        ck_assert_int_ge(gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data), 0);
    }
    const char *path = tu_tmp_path("edited.gguf");
    struct tpi_error err = {0};
    ck_assert_msg(gguf_writer_write(w, path, &err) == TPI_OK, "%s", err.msg);
    gguf_writer_free(&w);
    return path;
}

static const char *edited_copy(const struct gguf_file *f, const struct key_edit *e) {
    return edited_copy_n(f, e, 1);
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Our top-10 ids (best first). */
static void top10(const float *x, int n, int32_t *ids) {
    float lp[10];
    sampler_top_logprobs(x, n, 10, ids, lp);
}

START_TEST(test_logits_vs_llamacpp) {
    char file[256];
    snprintf(file, sizeof file, "%s.gguf", g_name);
    const char *gguf = tu_data_or_skip(file);
    snprintf(file, sizeof file, g_yarn ? "%s.yarn.ref.json" : "%s.ref.json", g_name);
    const char *refp = tu_data_or_skip(file);
    ck_assert(gguf && refp);
    cJSON *ref = tu_read_json(refp);
    ck_assert_ptr_nonnull(ref);
    struct model *m = NULL;
    if (g_yarn) {
        // the settings llama.cpp ran with, from the reference itself
        const cJSON *jr = cJSON_GetObjectItem(ref, "rope");
        ck_assert_ptr_nonnull(jr);
        ck_assert_str_eq(cJSON_GetObjectItem(jr, "scaling")->valuestring, "yarn");
        const float scale = 1.0f / (float)cJSON_GetObjectItem(jr, "freq_scale")->valuedouble;
        const int orig = cJSON_GetObjectItem(jr, "yarn_orig_ctx")->valueint;
        if (g_yarn == 1) {
            m = load_rope(gguf, 1024, "yarn", scale, orig);
        } else {
            struct gguf_file *f = NULL;
            struct tpi_error e = {0};
            ck_assert_int_eq(gguf_open(gguf, &f, &e), TPI_OK);
            // YaRN's keys as llama.cpp's converter writes them for a long-context model
            char key[3][96];
            struct gguf_str a;
            ck_assert(gguf_get_str(f, "general.architecture", &a) && a.len < 16);
            snprintf(key[0], sizeof key[0], "%.*s.rope.scaling.type", (int)a.len, a.data);
            snprintf(key[1], sizeof key[1], "%.*s.rope.scaling.factor", (int)a.len, a.data);
            snprintf(key[2], sizeof key[2], "%.*s.rope.scaling.original_context_length",
                     (int)a.len, a.data);
            const struct key_edit edits[3] = {{NULL, key[0], 's', 0, "yarn", -1},
                                              {NULL, key[1], 'f', scale, NULL, -1},
                                              {NULL, key[2], 'u', orig, NULL, -1}};
            tu_tmpdir_make("test_model");
            const char *copy = edited_copy_n(f, edits, 3);
            gguf_close(&f);
            m = load(copy, 1024);
        }
        ck_assert_int_eq(m->cfg.rope_scaling, MODEL_ROPE_YARN);
        ck_assert_int_eq(m->cfg.rope_n_ctx_orig, orig);
    } else {
        m = load(gguf, 256);
    }
    const int n_vocab = m->cfg.n_vocab;
    ck_assert_int_eq(n_vocab, cJSON_GetObjectItem(ref, "n_vocab")->valueint);
    struct tpi_error err = {0};

    double max_abs = 0, max_rel = 0, sum_sq = 0, sum_ref_sq = 0;
    int n_top1 = 0, n_top1_checked = 0, n_greedy_checked = 0, n_top10_bad = 0;
    const cJSON *prompts = cJSON_GetObjectItem(ref, "prompts");
    const cJSON *pr;
    cJSON_ArrayForEach(pr, prompts) {
        const cJSON *jt = cJSON_GetObjectItem(pr, "tokens");
        const int n = cJSON_GetArraySize(jt);
        int32_t *tok = malloc(sizeof(int32_t) * n), *pos = malloc(sizeof(int32_t) * n);
        int32_t *seq = calloc(n, sizeof(int32_t)), *rows = malloc(sizeof(int32_t) * n);
        float *logits = malloc(sizeof(float) * (size_t)n * n_vocab);
        for (int i = 0; i < n; i++) {
            tok[i] = cJSON_GetArrayItem(jt, i)->valueint;
            pos[i] = rows[i] = i;
        }
        int rc = model_forward(m, tok, pos, seq, n, rows, n, logits, &err);
        ck_assert_msg(rc == TPI_OK, "forward: %s", err.msg);

        // Top-1 where the reference is decisive; top-10 sets apart from near-ties.
        const cJSON *jtop = cJSON_GetObjectItem(pr, "top10");
        for (int i = 0; i < n; i++) {
            const cJSON *row = cJSON_GetArrayItem(jtop, i);
            int ref1 = cJSON_GetArrayItem(cJSON_GetArrayItem(row, 0), 0)->valueint;
            double g = cJSON_GetArrayItem(cJSON_GetArrayItem(row, 0), 1)->valuedouble -
                       cJSON_GetArrayItem(cJSON_GetArrayItem(row, 1), 1)->valuedouble;
            const float *x = logits + (size_t)i * n_vocab;
            if (g > margin_min(g_name)) {
                n_top1_checked++;
                int got = argmax(x, n_vocab);
                if (got == ref1) n_top1++;
                else
                    fprintf(stderr, "%s: prompt pos %d: top-1 %d, llama.cpp %d (gap %.3f)\n",
                            g_name, i, got, ref1, g);
            }
            int32_t ours[10];
            top10(x, n_vocab, ours);
            float tenth = x[ours[9]];
            for (int a = 0; a < 10; a++) {
                int id = cJSON_GetArrayItem(cJSON_GetArrayItem(row, a), 0)->valueint;
                bool in = false;
                for (int b = 0; b < 10; b++) in |= ours[b] == id;
                if (!in && fabsf(x[id] - tenth) > fmax(TIE_TOL, margin_min(g_name))) {
                    n_top10_bad++;
                    fprintf(stderr, "%s: pos %d: llama.cpp top-10 id %d (ours %.3f) not in our "
                            "top-10 (10th %.3f)\n", g_name, i, id, x[id], tenth);
                }
            }
        }

        // last_logits: all logits at the last position.
        const cJSON *jl = cJSON_GetObjectItem(pr, "last_logits");
        const float *x = logits + (size_t)(n - 1) * n_vocab;
        float *want = malloc(sizeof(float) * n_vocab);
        for (int v = 0; v < n_vocab; v++) want[v] = (float)cJSON_GetArrayItem(jl, v)->valuedouble;
        for (int v = 0; v < n_vocab; v++) {
            double d = fabs((double)x[v] - want[v]);
            max_abs = fmax(max_abs, d);
            max_rel = fmax(max_rel, d / fmax(fabs(want[v]), 1.0));
            sum_sq += d * d;
            sum_ref_sq += (double)want[v] * want[v];
        }
        ck_assert_uint_eq(tu_compare(g_name, x, want, n_vocab, logit_atol(g_name), 0.0), 0);

        // Greedy continuation up to the first low-margin step.
        const cJSON *jg = cJSON_GetObjectItem(pr, "greedy");
        const cJSON *jm = cJSON_GetObjectItem(pr, "greedy_margins");
        int next = argmax(x, n_vocab);
        for (int j = 0; j < cJSON_GetArraySize(jg); j++) {
            if (cJSON_GetArrayItem(jm, j)->valuedouble < margin_min(g_name)) break;
            int want_id = cJSON_GetArrayItem(jg, j)->valueint;
            ck_assert_msg(next == want_id, "%s: greedy step %d: got %d, llama.cpp %d (margin %.3f)",
                          g_name, j, next, want_id, cJSON_GetArrayItem(jm, j)->valuedouble);
            n_greedy_checked++;
            int32_t p1 = n + j, s1 = 0, r1 = 0, t1 = next;
            rc = model_forward(m, &t1, &p1, &s1, 1, &r1, 1, logits, &err);
            ck_assert_msg(rc == TPI_OK, "forward: %s", err.msg);
            next = argmax(logits, n_vocab);
        }
        free(want);
        free(tok);
        free(pos);
        free(seq);
        free(rows);
        free(logits);
    }
    fprintf(stderr,
            "%s: last_logits max abs err %.4f, max rel err %.4f (|ref| >= 1), nmse %.2e; top-1 "
            "%d/%d; greedy steps checked %d\n",
            g_name, max_abs, max_rel, sum_sq / sum_ref_sq, n_top1, n_top1_checked,
            n_greedy_checked);
    ck_assert_int_eq(n_top1, n_top1_checked);
    ck_assert_int_eq(n_top10_bad, 0);
    model_free(&m);
    cJSON_Delete(ref);
}
END_TEST

START_TEST(test_perplexity_vs_llamacpp) {
    char file[256];
    snprintf(file, sizeof file, "%s.gguf", g_name);
    const char *gguf = tu_data_or_skip(file);
    const char *textp = tu_data_or_skip("ppl-text.txt");
    ck_assert(gguf && textp);
    struct model *m = load(gguf, 128);
    struct tokenizer *tok = NULL;
    struct tpi_error err = {0};
    ck_assert_msg(tok_load(m->gguf, &tok, &err) == TPI_OK, "tok_load: %s", err.msg);
    size_t n_text;
    char *text = tu_read_file(textp, &n_text);
    if (n_text > 0 && text[n_text - 1] == '\n') n_text--; // as llama-perplexity reads -f
    int32_t *ids;
    int n_ids;
    ck_assert_msg(tok_encode(tok, text, n_text, false, &ids, &n_ids, &err) == TPI_OK, "%s",
                  err.msg);
    struct ppl_result r;
    double t0 = tpi_time_s();
    int rc = model_perplexity(m, ids, n_ids, 128, 0, tok_add_bos(tok) ? tok_bos(tok) : -1, NULL, NULL,
                              &r, &err);
    ck_assert_msg(rc == TPI_OK, "perplexity: %s", err.msg);
    double d = fabs(log(r.ppl) - log(g_ppl_ref));
    fprintf(stderr, "%s: %d tokens, %d windows, PPL = %.4f +/- %.4f, llama.cpp %.2f, |d ln PPL| = "
            "%.5f (%.1f s)\n", g_name, n_ids, r.n_windows, r.ppl, r.ppl_err, g_ppl_ref, d,
            tpi_time_s() - t0);
    ck_assert_int_eq(r.n_windows, 95);
    ck_assert_msg(d < 0.01, "|ln PPL - ln PPL_ref| = %.5f", d);
    free(ids);
    free(text);
    tok_free(&tok);
    model_free(&m);
}
END_TEST

/* The token count `tpinfer perplexity` reports on stderr for a text file (-c 64). */
static int ppl_tokens(const char *gguf, const char *path) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' perplexity -m '%s' -f '%s' -c 64 -t 2 2>&1 >/dev/null",
             tu_binary(), gguf, path);
    int st = 0;
    char *out = tu_run_capture(cmd, &st);
    const char *at = strstr(out, " tokens, ");
    ck_assert_msg(st == 0 && at, "perplexity on %s: exit %d: %s", path, st, out);
    while (at > out && at[-1] >= '0' && at[-1] <= '9') at--;
    const int n = atoi(at);
    free(out);
    return n;
}

/* `tpinfer perplexity` end to end: stdout is llama-perplexity's two lines, the running
 * estimate "[1]x,[2]y,..." and "Final estimate: PPL = x +/- y", within the library test's
 * bound of llama.cpp's value; --chunks N scores the first N windows; a window under 4
 * tokens (-c 0 too, as llama.cpp refuses it), --chunks 0 and a missing text file stop
 * with a non-zero exit, one line that names the problem, and nothing on stdout. The text
 * is read as llama-perplexity reads it: one final newline dropped, special tokens
 * written in it are text, and each byte that is not UTF-8 is U+FFFD. */
START_TEST(test_perplexity_cli) {
    char file[256];
    snprintf(file, sizeof file, "%s.gguf", g_name);
    const char *gguf = tu_data_path(file), *textp = tu_data_path("ppl-text.txt");
    ck_assert(gguf && textp);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' perplexity -m '%s' -f '%s' -c 128 -t 2 2>/dev/null",
             tu_binary(), gguf, textp);
    int st = 0;
    char *out = tu_run_capture(cmd, &st);
    fprintf(stderr, "perplexity: exit %d, stdout: %s", st, out);
    ck_assert_int_eq(st, 0);
    double ppl = 0, ppl_err = 0;
    ck_assert_msg(!strncmp(out, "[1]", 3), "no running estimate first: %s", out);
    const char *fin = strstr(out, "\nFinal estimate: PPL = ");
    ck_assert_msg(fin, "no final line: %s", out);
    ck_assert_int_eq(sscanf(fin + 1, "Final estimate: PPL = %lf +/- %lf", &ppl, &ppl_err), 2);
    ck_assert_msg(strchr(fin + 1, '\n') == out + strlen(out) - 1, "more after the final line: %s",
                  out);
    const double d = fabs(log(ppl) - log(g_ppl_ref));
    ck_assert_msg(d < 0.01 && ppl_err > 0, "PPL %.4f +/- %.4f against llama.cpp %.2f", ppl,
                  ppl_err, g_ppl_ref);
    // the running line ends with the final value: "[N]x," for each of the N windows
    int n_win = 0;
    double last = 0;
    for (const char *q = out; q < fin && *q == '['; n_win++) {
        int w = 0, used = 0;
        ck_assert_int_eq(sscanf(q, "[%d]%lf,%n", &w, &last, &used), 2);
        ck_assert_int_eq(w, n_win + 1);
        q += used;
    }
    ck_assert_int_ge(n_win, 2);
    char want[64], got[64];
    snprintf(want, sizeof want, "%.4f", ppl);
    snprintf(got, sizeof got, "%.4f", last);
    ck_assert_str_eq(got, want);
    free(out);

    // --chunks 1 scores the first window alone: the running line's first value (-b, as
    // llama-perplexity's command lines give it, changes nothing)
    snprintf(cmd, sizeof cmd,
             "'%s' perplexity -m '%s' -f '%s' -c 128 --chunks 1 -b 64 -t 2 2>/dev/null",
             tu_binary(), gguf, textp);
    out = tu_run_capture(cmd, &st);
    ck_assert_int_eq(st, 0);
    double first = 0, one = 0;
    fin = strstr(out, "\nFinal estimate: PPL = ");
    ck_assert_msg(fin && sscanf(out, "[1]%lf,\n", &first) == 1 &&
                      sscanf(fin + 1, "Final estimate: PPL = %lf", &one) == 1,
                  "--chunks 1: %s", out);
    ck_assert_msg(fin == strchr(out, '\n'), "--chunks 1 ran more windows: %s", out);
    ck_assert_double_eq_tol(first, one, 1e-4 * one);
    free(out);

    const char *bad[4][2] = {{"-c 2", "at least 4"},
                             {"-c 0", "at least 4"},
                             {"-c 128 --chunks 0", "--chunks expects"},
                             {"-c 128 -f /nonexistent/text.txt", "/nonexistent/text.txt"}};
    for (int i = 0; i < 4; i++) {
        snprintf(cmd, sizeof cmd, "'%s' perplexity -m '%s' -f '%s' %s 2>&1 >/dev/null",
                 tu_binary(), gguf, textp, bad[i][0]);
        out = tu_run_capture(cmd, &st);
        fprintf(stderr, "perplexity %s: exit %d: %s", bad[i][0], st, out);
        ck_assert_int_ne(st, 0);
        ck_assert_msg(strstr(out, bad[i][1]), "unclear error for %s: %s", bad[i][0], out);
        free(out);
        snprintf(cmd, sizeof cmd, "'%s' perplexity -m '%s' -f '%s' %s 2>/dev/null", tu_binary(),
                 gguf, textp, bad[i][0]);
        out = tu_run_capture(cmd, &st);
        ck_assert_msg(st != 0 && out[0] == '\0', "%s: stdout '%s'", bad[i][0], out);
        free(out);
    }

    tu_tmpdir_make("test_model");
    char body[600 * 13 + 2];
    for (int i = 0; i < 600; i++) memcpy(body + 13 * i, "<|endoftext|>", 13);
    body[600 * 13] = '\0';
    const char *t1 = tu_tmp_path("eot.txt"), *t2 = tu_tmp_path("eot-nl.txt");
    FILE *f = fopen(t1, "w");
    fputs(body, f);
    fclose(f);
    f = fopen(t2, "w");
    fprintf(f, "%s\n", body);
    fclose(f);
    const int n1 = ppl_tokens(gguf, t1), n2 = ppl_tokens(gguf, t2);
    ck_assert_msg(n1 > 600, "<|endoftext|> read as a special token: %d tokens", n1);
    ck_assert_int_eq(n2, n1);

    // Bytes that are not UTF-8 (Latin-1's "caf\xe9", a cut "\xe2\x80") read as one U+FFFD
    // each, as llama.cpp reads them: the same tokens as the text with U+FFFD written in.
    size_t n_text = 0;
    char *text = tu_read_file(textp, &n_text);
    const char *t3 = tu_tmp_path("latin1.txt"), *t4 = tu_tmp_path("fffd.txt");
    f = fopen(t3, "w");
    fprintf(f, "caf\xe9 \xe2\x80 %s", text);
    fclose(f);
    f = fopen(t4, "w");
    fprintf(f, "caf\xef\xbf\xbd \xef\xbf\xbd\xef\xbf\xbd %s", text);
    fclose(f);
    free(text);
    char *outs[2];
    const char *paths[2] = {t3, t4};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "'%s' perplexity -m '%s' -f '%s' -c 128 --chunks 2 -t 2 2>&1",
                 tu_binary(), gguf, paths[i]);
        outs[i] = tu_run_capture(cmd, &st);
        ck_assert_msg(st == 0, "%s: exit %d: %s", paths[i], st, outs[i]);
    }
    ck_assert_msg(strstr(outs[0], "3 bytes are not UTF-8"), "no warning: %s", outs[0]);
    const char *f0 = strstr(outs[0], "Final estimate"), *f1 = strstr(outs[1], "Final estimate");
    ck_assert_msg(f0 && f1 && strcspn(f0, "\n") == strcspn(f1, "\n") &&
                      !strncmp(f0, f1, strcspn(f0, "\n")),
                  "Latin-1 %s, U+FFFD %s", f0, f1);
    free(outs[0]);
    free(outs[1]);
    tu_tmpdir_remove();
}
END_TEST

/* ---- unit checks without reference data ---- */

static struct model_config tiny_cfg(int n_head, int n_kv, int n_layer) {
    struct model_config c = {.n_layer = n_layer, .n_embd = 512, .n_ff = 1024, .n_head = n_head,
                             .n_head_kv = n_kv, .head_dim = 64, .head_dim_v = 64, .n_rot = 64,
                             .n_vocab = 2049};
    return c;
}

START_TEST(test_plan) {
    struct model_plan p;
    struct tpi_error err = {0};
    struct model_config c = tiny_cfg(8, 4, 4);
    // tp = 2: heads and KV heads split.
    ck_assert_int_eq(model_plan_make(&p, &c, 2, 1, 1, 0, NULL, 0, &err), TPI_OK);
    ck_assert_int_eq(p.head0, 4);
    ck_assert_int_eq(p.n_head_local, 4);
    ck_assert_int_eq(p.kv_head0, 2);
    ck_assert_int_eq(p.n_kv_local, 2);
    ck_assert(!p.kv_replicated);
    // tp = 8 > 4 KV heads: ranks 2k, 2k+1 share KV head k.
    for (int r = 0; r < 8; r++) {
        ck_assert_int_eq(model_plan_make(&p, &c, 8, 1, r, 0, NULL, 0, &err), TPI_OK);
        ck_assert_int_eq(p.n_kv_local, 1);
        ck_assert_int_eq(p.kv_head0, r / 2);
        ck_assert(p.kv_replicated);
        // query head r reads KV head r / (8 / 4): the same one.
        ck_assert_int_eq(p.head0 / (c.n_head / c.n_head_kv), p.kv_head0);
    }
    // tp = 3: clear error naming heads and suggesting pp.
    ck_assert_int_eq(model_plan_make(&p, &c, 3, 1, 0, 0, NULL, 0, &err), TPI_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "8 attention heads"));
    ck_assert_ptr_nonnull(strstr(err.msg, "--pp"));
    // 12 heads / 4 KV at tp = 6: heads split, KV neither split nor replicable.
    struct model_config c2 = tiny_cfg(12, 4, 4);
    ck_assert_int_eq(model_plan_make(&p, &c2, 6, 1, 0, 0, NULL, 0, &err), TPI_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "KV heads"));
    // pp > layers.
    ck_assert_int_eq(model_plan_make(&p, &c, 1, 5, 0, 0, NULL, 0, &err), TPI_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "4 layers"));
    // Balanced layers 4 over 3 stages: 2, 1, 1.
    int l0[3], n[3];
    for (int s = 0; s < 3; s++) {
        ck_assert_int_eq(model_plan_make(&p, &c, 1, 3, 0, s, NULL, 0, &err), TPI_OK);
        l0[s] = p.layer0;
        n[s] = p.n_layer_stage;
    }
    ck_assert_int_eq(l0[0], 0);
    ck_assert_int_eq(n[0], 2);
    ck_assert_int_eq(l0[1], 2);
    ck_assert_int_eq(l0[2], 3);
    ck_assert_int_eq(n[2], 1);
    int layers[2] = {3, 1};
    ck_assert_int_eq(model_plan_make(&p, &c, 1, 2, 0, 1, layers, 2, &err), TPI_OK);
    ck_assert_int_eq(p.layer0, 3);
    int bad[2] = {2, 1};
    ck_assert_int_eq(model_plan_make(&p, &c, 1, 2, 0, 1, bad, 2, &err), TPI_ERR_INVALID);
    // Uneven vocab (2049 over 4): ranges tile [0, 2049).
    int next = 0;
    for (int r = 0; r < 4; r++) {
        int v0, nv;
        model_vocab_range(2049, 4, r, &v0, &nv);
        ck_assert_int_eq(v0, next);
        ck_assert(nv == 512 || nv == 513);
        next = v0 + nv;
    }
    ck_assert_int_eq(next, 2049);
}
END_TEST

START_TEST(test_sampling) {
    struct sampler s;
    struct sampler_params p;
    struct tpi_error err = {0};
    float logits[6] = {1.0f, 3.0f, -2.0f, 2.5f, 0.0f, 2.9f};
    sampler_params_default(&p);
    p.temp = 0;
    ck_assert_int_eq(sampler_init(&s, &p, 6, &err), TPI_OK);
    ck_assert_int_eq(sampler_sample(&s, logits), 1);
    sampler_free(&s);
    // Greedy on long rows is the first of the largest, as a plain scan from entry 0 with
    // > finds it: ties (the max at several places, in and past the 16-wide part), NaNs
    // (never chosen; a NaN at 0 gives 0), -0 against +0, all -inf, odd lengths.
    {
        enum { NL = 1003 };
        static float row[NL];
        ck_assert_int_eq(sampler_init(&s, &p, NL, &err), TPI_OK);
        struct tu_rng r;
        tu_rng_seed(&r, 77);
        for (int c = 0; c < 8; c++) {
            for (int i = 0; i < NL; i++) row[i] = floorf(tu_uniform(&r, -25.0f, 25.0f));
            if (c == 1) row[700] = row[17] = row[1001] = 30.0f;
            if (c == 2) row[5] = NAN, row[900] = 40.0f, row[901] = NAN;
            if (c == 3) row[0] = NAN;
            if (c == 4)
                for (int i = 0; i < NL; i++) row[i] = i % 2 ? -0.0f : 0.0f;
            if (c == 5)
                for (int i = 0; i < NL; i++) row[i] = -INFINITY;
            if (c == 6) row[1002] = 99.0f;
            int want = 0;
            for (int i = 1; i < NL; i++)
                if (row[i] > row[want]) want = i;
            ck_assert_int_eq(sampler_sample(&s, row), want);
        }
        sampler_free(&s);
    }
    // Banned ids are never drawn, greedy or at any temperature, with or without the
    // penalties; cleared, a sampler draws as one that never had a ban (the same history
    // and the same number of draws before).
    {
        const int32_t ban[2] = {1, 5}; // the best and the third best of logits[]
        struct sampler_params q;
        sampler_params_default(&q);
        q.temp = 0;
        ck_assert_int_eq(sampler_init(&s, &q, 6, &err), TPI_OK);
        sampler_ban(&s, ban, 2);
        ck_assert_int_eq(sampler_sample(&s, logits), 3);
        sampler_ban(&s, NULL, 0);
        ck_assert_int_eq(sampler_sample(&s, logits), 1);
        sampler_free(&s);
        for (int pen = 0; pen < 2; pen++) {
            sampler_params_default(&q);
            q.temp = 5.0f, q.top_k = 0, q.top_p = 1.0f, q.min_p = 0.0f, q.seed = 11;
            if (pen) q.repeat_penalty = 1.3f, q.presence_penalty = 0.5f;
            struct sampler a, b;
            ck_assert_int_eq(sampler_init(&a, &q, 6, &err), TPI_OK);
            ck_assert_int_eq(sampler_init(&b, &q, 6, &err), TPI_OK);
            int seen[6] = {0};
            for (int i = 0; i < 400; i++) {
                sampler_ban(&a, ban, 2);
                const int32_t id = sampler_sample(&a, logits);
                ck_assert_msg(id != 1 && id != 5, "draw %d took banned id %d", i, (int)id);
                seen[id]++;
                (void)sampler_sample(&b, logits); // one draw of the stream, as a's
                sampler_accept_output(&a, id);
                sampler_accept_output(&b, id);
            }
            ck_assert(seen[0] && seen[2] && seen[3] && seen[4]); // the others all come up
            sampler_ban(&a, NULL, 0); // cleared: a draws as b, which never had a ban
            for (int i = 0; i < 50; i++) {
                const int32_t x = sampler_sample(&a, logits), y = sampler_sample(&b, logits);
                ck_assert_int_eq(x, y);
                seen[x] += 1000;
                sampler_accept_output(&a, x);
                sampler_accept_output(&b, y);
            }
            ck_assert_int_ge(seen[1], 1000); // the best id is back
            sampler_free(&a);
            sampler_free(&b);
        }
    }
    // Logit bias, before the penalties: -100 on the best id moves greedy to the next,
    // +30 on the worst makes it the choice; an id out of range or listed twice is refused.
    {
        struct sampler_params q;
        sampler_params_default(&q);
        q.temp = 0;
        ck_assert_int_eq(sampler_init(&s, &q, 6, &err), TPI_OK);
        const int32_t ids[2] = {1, 2};
        const float down_up[2] = {-100.0f, 30.0f}, down[1] = {-100.0f};
        ck_assert_int_eq(sampler_set_bias(&s, ids, down, 1, &err), TPI_OK);
        ck_assert_int_eq(sampler_sample(&s, logits), 5);
        ck_assert_int_eq(sampler_set_bias(&s, ids, down_up, 2, &err), TPI_OK);
        ck_assert_int_eq(sampler_sample(&s, logits), 2);
        ck_assert_int_eq(sampler_set_bias(&s, NULL, NULL, 0, &err), TPI_OK);
        ck_assert_int_eq(sampler_sample(&s, logits), 1);
        const int32_t bad[2] = {3, 6}, twice[2] = {4, 4};
        ck_assert_int_eq(sampler_set_bias(&s, bad, down_up, 2, &err), TPI_ERR_INVALID);
        ck_assert_int_eq(sampler_set_bias(&s, twice, down_up, 2, &err), TPI_ERR_INVALID);
        ck_assert_msg(strstr(err.msg, "id 4 twice"), "%s", err.msg);
        // With the repetition penalty 2 on id 2 as well, the bias comes first, as in
        // llama.cpp: (-2 + 7.5) / 2 = 2.75 stays below id 1's 3.0 (the penalty first would
        // give -4 + 7.5 = 3.5, and id 2); +8.5 gives (6.5) / 2 = 3.25 and id 2.
        sampler_free(&s);
        q.repeat_penalty = 2.0f;
        ck_assert_int_eq(sampler_init(&s, &q, 6, &err), TPI_OK);
        sampler_accept(&s, 2);
        const float b75[1] = {7.5f}, b85[1] = {8.5f};
        ck_assert_int_eq(sampler_set_bias(&s, ids + 1, b75, 1, &err), TPI_OK);
        ck_assert_int_eq(sampler_sample(&s, logits), 1);
        ck_assert_int_eq(sampler_set_bias(&s, ids + 1, b85, 1, &err), TPI_OK);
        ck_assert_int_eq(sampler_sample(&s, logits), 2);
        sampler_free(&s);
    }
    // Non-finite parameters are refused with the field named.
    {
        struct sampler_params q = p;
        q.temp = NAN;
        ck_assert_int_eq(sampler_init(&s, &q, 6, &err), TPI_ERR_INVALID);
        ck_assert_msg(strstr(err.msg, "temperature nan"), "%s", err.msg);
        q = p;
        q.top_p = INFINITY;
        ck_assert_int_eq(sampler_init(&s, &q, 6, &err), TPI_ERR_INVALID);
        ck_assert_msg(strstr(err.msg, "top-p inf"), "%s", err.msg);
        q = p;
        q.frequency_penalty = -INFINITY;
        ck_assert_int_eq(sampler_init(&s, &q, 6, &err), TPI_ERR_INVALID);
        ck_assert_msg(strstr(err.msg, "frequency penalty -inf"), "%s", err.msg);
    }
    // Repetition penalty 2 on token 1 (3.0 -> 1.5): greedy picks 5 (2.9).
    p.repeat_penalty = 2.0f;
    ck_assert_int_eq(sampler_init(&s, &p, 6, &err), TPI_OK);
    sampler_accept(&s, 1);
    ck_assert_int_eq(sampler_sample(&s, logits), 5);
    // Negative logits are multiplied: token 2 (-2 -> -4) stays last.
    sampler_free(&s);
    // top-k 1 at any temperature is greedy.
    sampler_params_default(&p);
    p.top_k = 1;
    p.temp = 5.0f;
    ck_assert_int_eq(sampler_init(&s, &p, 6, &err), TPI_OK);
    for (int i = 0; i < 20; i++) ck_assert_int_eq(sampler_sample(&s, logits), 1);
    sampler_free(&s);
    // Same seed, same draws; the draws follow the softmax (temp 1, no filters).
    p = (struct sampler_params){.temp = 1.0f, .top_p = 1.0f, .repeat_penalty = 1.0f, .seed = 42};
    struct sampler s2;
    ck_assert_int_eq(sampler_init(&s, &p, 6, &err), TPI_OK);
    ck_assert_int_eq(sampler_init(&s2, &p, 6, &err), TPI_OK);
    int counts[6] = {0};
    const int N = 20000;
    for (int i = 0; i < N; i++) {
        int a = sampler_sample(&s, logits);
        ck_assert_int_eq(a, sampler_sample(&s2, logits));
        counts[a]++;
    }
    double z = 0;
    for (int i = 0; i < 6; i++) z += exp(logits[i]);
    for (int i = 0; i < 6; i++) {
        double want = exp(logits[i]) / z * N;
        ck_assert_msg(fabs(counts[i] - want) < 5 * sqrt(want) + 5, "token %d: %d draws, want %.0f",
                      i, counts[i], want);
    }
    sampler_free(&s);
    sampler_free(&s2);
    // min-p 0.5: only tokens with p >= 0.5 p_max (logit >= 3 - ln 2): ids 1, 3, 5.
    p = (struct sampler_params){.temp = 1.0f, .top_p = 1.0f, .min_p = 0.5f, .repeat_penalty = 1.0f,
                                .seed = 7};
    ck_assert_int_eq(sampler_init(&s, &p, 6, &err), TPI_OK);
    for (int i = 0; i < 500; i++) {
        int a = sampler_sample(&s, logits);
        ck_assert(a == 1 || a == 3 || a == 5);
    }
    sampler_free(&s);
    // top-p 0.5: p(1) = 0.37, p(5) = 0.33: keeps {1, 5}.
    p = (struct sampler_params){.temp = 1.0f, .top_p = 0.5f, .repeat_penalty = 1.0f, .seed = 9};
    ck_assert_int_eq(sampler_init(&s, &p, 6, &err), TPI_OK);
    for (int i = 0; i < 500; i++) {
        int a = sampler_sample(&s, logits);
        ck_assert(a == 1 || a == 5);
    }
    sampler_free(&s);
    // vLLM's frequency and presence penalties (temp_first) count generated tokens only
    // (prompt tokens are accepted with sampler_accept and do not count), with no window:
    // greedy, token 1 (3.0) against 5 (2.9).
    p = (struct sampler_params){.temp = 0.0f, .top_p = 1.0f, .repeat_penalty = 1.0f,
                                .frequency_penalty = 0.3f, .temp_first = true};
    ck_assert_int_eq(sampler_init(&s, &p, 6, &err), TPI_OK);
    for (int i = 0; i < 5; i++) sampler_accept(&s, 1);
    ck_assert_int_eq(sampler_sample(&s, logits), 1); // prompt only: no penalty
    sampler_accept_output(&s, 1);
    ck_assert_int_eq(sampler_sample(&s, logits), 5); // 3.0 - 0.3 < 2.9
    sampler_free(&s);
    p.frequency_penalty = 0.05f; // 3.0 - 0.05 n: below 2.9 from the third time
    ck_assert_int_eq(sampler_init(&s, &p, 6, &err), TPI_OK);
    sampler_accept_output(&s, 1);
    ck_assert_int_eq(sampler_sample(&s, logits), 1);
    sampler_accept_output(&s, 1);
    ck_assert_int_eq(sampler_sample(&s, logits), 1); // 2.9 = 2.9: the lower id wins the tie
    sampler_accept_output(&s, 1);
    ck_assert_int_eq(sampler_sample(&s, logits), 5);
    sampler_free(&s);
    p.frequency_penalty = 0.0f;
    p.presence_penalty = 0.2f; // once, however often: 3.0 - 0.2 < 2.9
    ck_assert_int_eq(sampler_init(&s, &p, 6, &err), TPI_OK);
    sampler_accept_output(&s, 3);
    ck_assert_int_eq(sampler_sample(&s, logits), 1);
    sampler_accept_output(&s, 1);
    ck_assert_int_eq(sampler_sample(&s, logits), 5);
    sampler_accept_output(&s, 5); // 5 too: 2.9 - 0.2 = 2.7 < 2.8 = 1's
    ck_assert_int_eq(sampler_sample(&s, logits), 1);
    sampler_free(&s);
    p.presence_penalty = -1.0f; // negative: encourages the tokens already generated
    ck_assert_int_eq(sampler_init(&s, &p, 6, &err), TPI_OK);
    sampler_accept_output(&s, 0);
    ck_assert_int_eq(sampler_sample(&s, logits), 1); // 1.0 + 1.0 < 3.0
    sampler_accept_output(&s, 4);
    sampler_free(&s);
    // llama.cpp's (llama_sampler_penalties): one count over the last repeat_last_n
    // tokens, prompt included; the window forgets; repeat_last_n 0 turns all three off.
    p = (struct sampler_params){.temp = 0.0f, .top_p = 1.0f, .repeat_penalty = 1.0f,
                                .repeat_last_n = 3, .frequency_penalty = 0.05f};
    ck_assert_int_eq(sampler_init(&s, &p, 6, &err), TPI_OK);
    sampler_accept(&s, 1); // a prompt token counts: 3.0 - 0.05 > 2.9
    ck_assert_int_eq(sampler_sample(&s, logits), 1);
    sampler_accept(&s, 1); // twice: 2.9 = 2.9, the lower id
    ck_assert_int_eq(sampler_sample(&s, logits), 1);
    sampler_accept_output(&s, 1); // three times: 2.85 < 2.9
    ck_assert_int_eq(sampler_sample(&s, logits), 5);
    ck_assert_int_eq(sampler_sample(&s, logits), 5); // a draw leaves the counts as they were
    sampler_accept_output(&s, 5); // the first 1 leaves the window of 3: two 1s, one 5
    ck_assert_int_eq(sampler_sample(&s, logits), 1); // 2.9 against 2.85
    sampler_accept(&s, 0);
    sampler_accept(&s, 0); // the window is 5, 0, 0: 1 is not counted
    ck_assert_int_eq(sampler_sample(&s, logits), 1);
    sampler_free(&s);
    p.frequency_penalty = 0.0f;
    p.presence_penalty = 0.2f; // prompt tokens count: 3.0 - 0.2 < 2.9
    ck_assert_int_eq(sampler_init(&s, &p, 6, &err), TPI_OK);
    sampler_accept(&s, 1);
    ck_assert_int_eq(sampler_sample(&s, logits), 5);
    sampler_free(&s);
    p.repeat_last_n = 0; // no window: no penalty at all, as llama.cpp's penalty_last_n 0
    ck_assert_int_eq(sampler_init(&s, &p, 6, &err), TPI_OK);
    sampler_accept(&s, 1);
    sampler_accept_output(&s, 1);
    ck_assert_int_eq(sampler_sample(&s, logits), 1);
    sampler_free(&s);

    // Logprobs: best first, normalised.
    int32_t ids[3];
    float lp[3];
    ck_assert_int_eq(sampler_top_logprobs(logits, 6, 3, ids, lp), 3);
    ck_assert_int_eq(ids[0], 1);
    ck_assert_int_eq(ids[1], 5);
    ck_assert_int_eq(ids[2], 3);
    ck_assert_double_eq_tol(lp[0], 3.0 - log(z), 1e-5);
    ck_assert_double_eq_tol(sampler_logprob_of(logits, 6, 2), -2.0 - log(z), 1e-5);
    // Both at once: the same numbers, bit for bit, from one pass.
    int32_t ids2[6];
    float lp2[6];
    for (int32_t id = 0; id < 6; id++) {
        float chosen = sampler_logprobs(logits, 6, id, 3, ids2, lp2);
        ck_assert_float_eq(chosen, sampler_logprob_of(logits, 6, id));
        for (int j = 0; j < 3; j++) {
            ck_assert_int_eq(ids2[j], ids[j]);
            ck_assert_float_eq(lp2[j], lp[j]);
        }
    }
    ck_assert_float_eq(sampler_logprobs(logits, 6, 4, 0, ids2, lp2), sampler_logprob_of(logits, 6, 4));
    ck_assert_int_eq(sampler_top_logprobs(logits, 6, 9, ids2, lp2), 6); // k clipped
    ck_assert_int_eq(ids2[5], 2);
}
END_TEST

/* The sampler as first written: penalty, a full sort, top-k, top-p, min-p, draw. */
static int cand_cmp_ref(const void *a, const void *b) {
    const struct sampler_cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static int32_t sample_ref(struct sampler *s, const float *logits, const int32_t *hist, int n_hist,
                          const int32_t *gen, int n_gen) {
    const int V = s->n_vocab;
    struct sampler_cand *c = malloc(sizeof *c * (size_t)V);
    for (int i = 0; i < V; i++) c[i] = (struct sampler_cand){i, logits[i]};
    if (s->p.repeat_penalty != 1.0f) {
        uint8_t *seen = calloc((size_t)V, 1);
        for (int i = 0; i < n_hist; i++) {
            if (seen[hist[i]]) continue;
            seen[hist[i]] = 1;
            float *l = &c[hist[i]].logit;
            *l = *l <= 0.0f ? *l * s->p.repeat_penalty : *l / s->p.repeat_penalty;
        }
        free(seen);
    }
    if (s->p.frequency_penalty != 0.0f || s->p.presence_penalty != 0.0f) {
        uint32_t *cnt = calloc((size_t)V, sizeof *cnt);
        for (int i = 0; i < n_gen; i++) cnt[gen[i]]++;
        for (int i = 0; i < V; i++)
            if (cnt[i] > 0) {
                c[i].logit = c[i].logit - s->p.frequency_penalty * (float)cnt[i];
                c[i].logit = c[i].logit - s->p.presence_penalty;
            }
        free(cnt);
    }
    int32_t out;
    if (s->p.temp <= 0.0f) {
        int best = 0;
        for (int i = 1; i < V; i++)
            if (c[i].logit > c[best].logit) best = i;
        out = c[best].id;
        free(c);
        return out;
    }
    qsort(c, (size_t)V, sizeof *c, cand_cmp_ref);
    int n = V;
    if (s->p.top_k > 0 && s->p.top_k < n) n = s->p.top_k;
    if (s->p.top_p < 1.0f) {
        double sum = 0.0, cum = 0.0;
        for (int i = 0; i < n; i++) sum += exp((double)c[i].logit - c[0].logit);
        for (int i = 0; i < n; i++) {
            cum += exp((double)c[i].logit - c[0].logit) / sum;
            if (cum >= s->p.top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (s->p.min_p > 0.0f) {
        float thr = c[0].logit + logf(s->p.min_p);
        int keep = 1;
        while (keep < n && c[keep].logit >= thr) keep++;
        n = keep;
    }
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += exp(((double)c[i].logit - c[0].logit) / s->p.temp);
    double u = sampler_uniform(s) * sum, cum = 0.0;
    out = c[n - 1].id;
    for (int i = 0; i < n; i++) {
        cum += exp(((double)c[i].logit - c[0].logit) / s->p.temp);
        if (u < cum) {
            out = c[i].id;
            break;
        }
    }
    free(c);
    return out;
}

/* The sampler sorts only as far as its filters look (a heap for top-k, a growing
 * sorted prefix otherwise): every draw must equal the full-sort sampler's, over a
 * large vocabulary with many tied logits, for every mix of filters. */
START_TEST(test_sampling_partial_sort) {
    const int V = 6000;
    float *logits = malloc(sizeof(float) * V);
    uint64_t rng = 12345;
    const int top_ks[] = {0, 1, 40, 1000, V - 1, V, V + 5};
    const float top_ps[] = {1.0f, 0.95f, 0.5f, 0.999f};
    const float min_ps[] = {0.0f, 0.05f, 0.3f};
    const float temps[] = {0.0f, 0.7f, 1.5f};
    const float penalties[] = {1.0f, 1.3f};
    const float occurrence[][2] = {{0.0f, 0.0f}, {0.6f, 0.3f}}; // presence, frequency
    const float scales[] = {0.5f, 4.0f}; // flat (long top-p prefixes) and peaked logits
    int n_cases = 0, n_draws = 0;
    for (size_t a = 0; a < sizeof top_ks / sizeof *top_ks; a++)
        for (size_t b = 0; b < sizeof top_ps / sizeof *top_ps; b++)
            for (size_t m = 0; m < sizeof min_ps / sizeof *min_ps; m++)
                for (size_t t = 0; t < sizeof temps / sizeof *temps; t++)
                    for (size_t r = 0; r < 2 * sizeof penalties / sizeof *penalties; r++) {
                        const float scale = scales[n_cases % 2];
                        const float *occ = occurrence[r / 2];
                        struct sampler_params p = {.temp = temps[t], .top_k = top_ks[a],
                                                   .top_p = top_ps[b], .min_p = min_ps[m],
                                                   .repeat_penalty = penalties[r % 2],
                                                   .repeat_last_n = 8,
                                                   .presence_penalty = occ[0],
                                                   .frequency_penalty = occ[1],
                                                   .seed = 1000 + (uint64_t)n_cases};
                        struct sampler s, ref;
                        struct tpi_error err = {0};
                        ck_assert_int_eq(sampler_init(&s, &p, V, &err), TPI_OK);
                        ck_assert_int_eq(sampler_init(&ref, &p, V, &err), TPI_OK);
                        int32_t hist[8], gen[6];
                        int n_hist = 0, n_gen = 0;
                        for (int step = 0; step < 6; step++) {
                            for (int i = 0; i < V; i++) { // quarter steps: many exact ties
                                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                                int q = (int)((rng >> 33) % 64) - 40;
                                logits[i] = scale * 0.25f * (float)q;
                            }
                            int32_t got = sampler_sample(&s, logits);
                            int32_t want = sample_ref(&ref, logits, hist, n_hist, gen, n_gen);
                            ck_assert_msg(got == want,
                                          "top_k %d top_p %g min_p %g temp %g penalty %g "
                                          "presence %g frequency %g scale %g step %d: %d, "
                                          "full sort %d",
                                          p.top_k, (double)p.top_p, (double)p.min_p,
                                          (double)p.temp, (double)p.repeat_penalty,
                                          (double)p.presence_penalty,
                                          (double)p.frequency_penalty, (double)scale, step, got,
                                          want);
                            sampler_accept_output(&s, got);
                            if (n_hist < 8) hist[n_hist++] = got;
                            gen[n_gen++] = got;
                            n_draws++;
                        }
                        sampler_free(&s);
                        sampler_free(&ref);
                        n_cases++;
                    }
    ck_assert_int_eq(n_draws, 6 * n_cases);
    free(logits);
}
END_TEST

/* A row's n best (logit first, then the lower id: ops->row_top's order), by a full sort. */
static const float *g_row;
static int cmp_row_best(const void *a, const void *b) {
    const int x = *(const int *)a, y = *(const int *)b;
    if (g_row[x] != g_row[y]) return g_row[x] > g_row[y] ? -1 : 1;
    return (x > y) - (x < y);
}
static void row_best(const float *row, int V, int n, int32_t *ids, float *vals) {
    int *order = malloc(sizeof(int) * (size_t)V);
    for (int i = 0; i < V; i++) order[i] = i;
    g_row = row;
    qsort(order, (size_t)V, sizeof(int), cmp_row_best);
    for (int j = 0; j < n; j++) ids[j] = order[j], vals[j] = row[order[j]];
    free(order);
}

/* sampler_sample_top against sampler_sample on the whole row: for every mix of filters,
 * penalties (lowering and raising logits), bans and a bias, over rows with many exact
 * ties, either the same id with the same draws (the two samplers' PRNGs stay in step) or
 * -1 where the list cannot decide; and it decides the cases it is for (greedy and top-k
 * without a bias or raising penalties, the penalized ones but when a penalty pulls the
 * k-th best down to the list's last value). */
START_TEST(test_sampling_top) {
    enum { V = 3000, N = 64 };
    float *row = malloc(sizeof(float) * V);
    int32_t ids[N];
    float vals[N];
    uint64_t rng = 777;
    const int top_ks[] = {0, 1, 20, 40, 64, 65};
    const float temps[] = {0.0f, 0.7f};
    const float penalties[] = {1.0f, 1.3f, 0.8f};
    const float occurrence[][2] = {{0.0f, 0.0f}, {0.6f, 0.3f}, {-0.5f, 0.0f}};
    int n_cases = 0, n_top = 0, n_whole = 0, n_must = 0;
    for (size_t a = 0; a < sizeof top_ks / sizeof *top_ks; a++)
        for (size_t t = 0; t < sizeof temps / sizeof *temps; t++)
            for (size_t r = 0; r < sizeof penalties / sizeof *penalties; r++)
                for (size_t o = 0; o < sizeof occurrence / sizeof *occurrence; o++)
                    for (int tf = 0; tf < 2; tf++)
                        for (int extra = 0; extra < 3; extra++) { // none, a ban, a bias
                            struct sampler_params p = {.temp = temps[t], .top_k = top_ks[a],
                                                       .top_p = 0.9f, .min_p = 0.02f,
                                                       .repeat_penalty = penalties[r],
                                                       .repeat_last_n = 16,
                                                       .presence_penalty = occurrence[o][0],
                                                       .frequency_penalty = occurrence[o][1],
                                                       .seed = 50 + (uint64_t)n_cases,
                                                       .temp_first = tf};
                            struct sampler s, ref;
                            struct tpi_error err = {0};
                            ck_assert_int_eq(sampler_init(&s, &p, V, &err), TPI_OK);
                            ck_assert_int_eq(sampler_init(&ref, &p, V, &err), TPI_OK);
                            const int32_t bias_id = 7;
                            const float bias = 3.0f;
                            if (extra == 2) {
                                ck_assert_int_eq(
                                    sampler_set_bias(&s, &bias_id, &bias, 1, &err), 0);
                                ck_assert_int_eq(
                                    sampler_set_bias(&ref, &bias_id, &bias, 1, &err), 0);
                            }
                            int32_t ban[2];
                            for (int step = 0; step < 8; step++) {
                                for (int i = 0; i < V; i++) { // half steps: many exact ties
                                    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                                    row[i] = 0.5f * (float)((int)((rng >> 33) % 40) - 20);
                                }
                                row_best(row, V, N, ids, vals);
                                // history: the prompt's tokens are the row's best, so the
                                // penalties hit the candidates
                                if (step == 0)
                                    for (int j = 0; j < 6; j++) {
                                        sampler_accept(&s, ids[j]);
                                        sampler_accept(&ref, ids[j]);
                                    }
                                int n_ban = 0;
                                if (extra == 1) ban[n_ban++] = ids[0], ban[n_ban++] = ids[3];
                                sampler_ban(&s, ban, n_ban);
                                sampler_ban(&ref, ban, n_ban);
                                const int32_t want = sampler_sample(&ref, row);
                                int32_t got = sampler_sample_top(&s, ids, vals, N);
                                const bool raises = extra == 2 || penalties[r] < 1.0f ||
                                                    occurrence[o][0] < 0.0f;
                                const int k = temps[t] <= 0.0f ? 1 : top_ks[a];
                                if (!raises && k > 0 && k <= N && penalties[r] == 1.0f &&
                                    occurrence[o][0] == 0.0f && extra == 0) {
                                    ck_assert_msg(got >= 0, "case %d step %d not decided",
                                                  n_cases, step);
                                    n_must++;
                                }
                                if (got < 0) {
                                    ck_assert_msg(raises || k == 0 || k > N ||
                                                      penalties[r] != 1.0f ||
                                                      occurrence[o][0] != 0.0f || extra == 1,
                                                  "case %d step %d: -1 without a cause",
                                                  n_cases, step);
                                    n_whole++;
                                    got = sampler_sample(&s, row);
                                } else {
                                    n_top++;
                                }
                                ck_assert_msg(got == want,
                                              "top_k %d temp %g penalty %g presence %g "
                                              "temp_first %d extra %d step %d: %d, whole row %d",
                                              p.top_k, (double)p.temp, (double)p.repeat_penalty,
                                              (double)p.presence_penalty, tf, extra, step, got,
                                              want);
                                ck_assert(raises || k == 0 || k > N || got >= 0 ||
                                          penalties[r] != 1.0f || occurrence[o][0] != 0.0f ||
                                          extra == 1);
                                sampler_accept_output(&s, got);
                                sampler_accept_output(&ref, got);
                            }
                            // the same draws on both: the next uniform agrees
                            ck_assert(sampler_uniform(&s) == sampler_uniform(&ref));
                            sampler_free(&s);
                            sampler_free(&ref);
                            n_cases++;
                        }
    ck_assert_int_gt(n_must, 100);
    ck_assert_int_gt(n_top, n_must); // penalized and banned rows decided too
    ck_assert_int_gt(n_whole, 100);
    // A penalty that pulls the best down to the list's last value: the k-th best ties
    // ids outside the list (4 at ids 4..199), so the list does not decide.
    {
        enum { W = 200 };
        float r2[W];
        for (int i = 0; i < W; i++) r2[i] = i < 3 ? 10.0f - (float)i : 4.0f; // 10 9 8 4 4..
        struct sampler_params p = {.temp = 0.0f, .repeat_penalty = 2.5f, .repeat_last_n = 4,
                                   .top_p = 1.0f};
        struct sampler s;
        struct tpi_error err = {0};
        ck_assert_int_eq(sampler_init(&s, &p, W, &err), TPI_OK);
        row_best(r2, W, 4, ids, vals); // 10 9 8 4 (id 3)
        ck_assert_int_eq(sampler_sample_top(&s, ids, vals, 4), 0);
        sampler_accept(&s, 0), sampler_accept(&s, 1), sampler_accept(&s, 2); // 4, 3.6, 3.2
        ck_assert_int_eq(sampler_sample_top(&s, ids, vals, 4), -1);
        ck_assert_int_eq(sampler_sample(&s, r2), 0); // 4, the first of the ties
        sampler_free(&s);
    }
    free(row);
}
END_TEST

/* gen_find_stop_listed against vLLM's check_stop_strings (Python's str.find from
 * 1 - new_chars - len(stop) for each stop string in list order), the expected offsets
 * and indices worked out with that code: the first listed string wins over an earlier
 * match of a later one, a match may straddle the old end, and one that ended in the old
 * text (before min_tokens) is not found again. */
START_TEST(test_stop_strings) {
    static const struct {
        const char *text;
        size_t before;
        const char *stop[3];
        long at;
        int which;
    } cases[] = {
        {"hello world", 6, {"or", "wo", NULL}, 7, 0}, // the earliest would be "wo" at 6
        {"abcdef", 3, {"cde", NULL}, 2, 0},           // straddles the old end
        {"xyzab", 3, {"xy", NULL}, -1, 0},            // wholly in the old text
        {"abcd", 2, {"ab", NULL}, -1, 0},             // ends at the old end: old
        {"ab", 0, {"b", "a", NULL}, 1, 0},            // list order, not position
        {"ab", 0, {"abc", "b", NULL}, 1, 1},          // longer than the text: skipped
        {"aaaa", 3, {"aa", NULL}, 2, 0},              // the first occurrence past from
        {"a\u00e9b", 1, {"\u00e9", NULL}, 1, 0},      // two bytes of one character
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int n_stop = 0;
        while (n_stop < 3 && cases[i].stop[n_stop])
            n_stop++;
        int which = -1;
        const long at = gen_find_stop_listed(cases[i].text, strlen(cases[i].text), cases[i].before,
                                             cases[i].stop, n_stop, &which);
        ck_assert_msg(at == cases[i].at, "case %zu: at %ld, want %ld", i, at, cases[i].at);
        if (at >= 0) ck_assert_msg(which == cases[i].which, "case %zu: which %d", i, which);
    }
    // gen_find_stop (tpinfer run's search) takes the earliest match instead.
    const char *both[] = {"or", "wo"};
    int which = -1;
    ck_assert_int_eq(gen_find_stop("hello world", 11, 0, both, 2, &which), 6);
    ck_assert_int_eq(which, 1);
}
END_TEST

START_TEST(test_config_errors) {
    // qwen3-tiny: config read from metadata, every tensor checked.
    const char *path = tu_data_path("qwen3-tiny-q4_k_m.gguf");
    if (!path) return; // data missing: nothing to check here (main prints SKIP for data tests)
    struct gguf_file *f = NULL;
    struct tpi_error err = {0};
    ck_assert_int_eq(gguf_open(path, &f, &err), TPI_OK);
    struct model_config c;
    ck_assert_msg(model_config_from_gguf(&c, f, &err) == TPI_OK, "%s", err.msg);
    ck_assert_int_eq(c.arch, MODEL_ARCH_QWEN3);
    ck_assert_int_eq(c.n_layer, 4);
    ck_assert_int_eq(c.n_embd, 512);
    ck_assert_int_eq(c.n_head, 8);
    ck_assert_int_eq(c.n_head_kv, 4);
    ck_assert_int_eq(c.head_dim, 64);
    ck_assert_int_eq(c.n_ff, 1024);
    ck_assert_int_eq(c.n_vocab, 2048);
    ck_assert(!c.tied_output);
    ck_assert(c.has_qk_norm);
    ck_assert_double_eq_tol(c.rope_base, 1e6, 1);
    gguf_close(&f);
    // A vocabulary-only GGUF: no tensors, so the config names the missing one.
    const char *vocab = tu_data_path("qwen3-vocab.gguf");
    if (vocab) {
        ck_assert_int_eq(gguf_open(vocab, &f, &err), TPI_OK);
        int rc = model_config_from_gguf(&c, f, &err);
        ck_assert_int_ne(rc, TPI_OK);
        fprintf(stderr, "expected error: %s\n", err.msg);
        gguf_close(&f);
    }
}
END_TEST

/* The tiny qwen3 model opened, and a temporary folder for its edited copies; NULL when
 * the model is in neither data folder. */
static struct gguf_file *tiny_for_edits(void) {
    const char *src = tu_data_path("qwen3-tiny-q4_k_m.gguf");
    if (!src) return NULL;
    tu_tmpdir_make("test_model");
    struct gguf_file *f = NULL;
    struct tpi_error err = {0};
    ck_assert_msg(gguf_open(src, &f, &err) == TPI_OK, "%s", err.msg);
    return f;
}

/* What a model file's metadata must hold beyond what the reader checks: each bad value
 * is an error naming the file and the key, not a model that runs and computes NaN or a
 * cut-short stack (a rope base of 0, an epsilon of NaN, block_count as a bool or too
 * small, a head size past what the backends compute, keys of the wrong type, a
 * tokenizer with another count of tokens than the embedding has rows). */
START_TEST(test_config_values) {
    struct gguf_file *f = tiny_for_edits();
    if (!f) return;
    struct tpi_error err = {0};
    static const struct {
        struct key_edit e;
        const char *want;
    } cases[] = {
        {{NULL, "qwen3.rope.freq_base", 'f', 0.0, NULL, -1}, "'qwen3.rope.freq_base' = 0 is out"},
        {{NULL, "qwen3.rope.freq_base", 'f', -5.0, NULL, -1}, "freq_base' = -5 is out"},
        {{NULL, "qwen3.rope.freq_base", 'f', NAN, NULL, -1}, "freq_base' = nan is out"},
        {{NULL, "qwen3.attention.layer_norm_rms_epsilon", 'f', -1.0, NULL, -1},
         "layer_norm_rms_epsilon' = -1 is out"},
        {{NULL, "qwen3.attention.layer_norm_rms_epsilon", 'f', INFINITY, NULL, -1},
         "layer_norm_rms_epsilon' = inf is out"},
        {{NULL, "qwen3.rope.freq_base", 'b', 1, NULL, -1}, "freq_base' is not a number"},
        {{NULL, "qwen3.block_count", 'b', 1, NULL, -1}, "'qwen3.block_count' is a bool"},
        {{NULL, "qwen3.block_count", 'u', 2, NULL, -1}, "tensor 'blk.2...' is past qwen3.block_count 2"},
        {{NULL, "general.architecture", 'u', 3, NULL, -1},
         "'general.architecture' has type u32, expected a string"},
        {{NULL, "qwen3.rope.scaling.type", 'u', 2, NULL, -1},
         "'qwen3.rope.scaling.type' has type u32, expected a string"},
        {{NULL, "qwen3.rope.scaling.factor", 's', 0, "4", -1},
         "'qwen3.rope.scaling.factor' is not a number"},
        {{NULL, "qwen3.rope.scaling.type", 's', 0, "longrope", -1},
         "rope scaling 'longrope' (qwen3.rope.scaling.type) is not supported"},
        {{NULL, "qwen3.rope.scaling.factor", 'f', -2.0, NULL, -1},
         "'qwen3.rope.scaling.factor' = -2 is out of range"},
        {{NULL, "qwen3.rope.scaling.original_context_length", 'b', 1, NULL, -1},
         "'qwen3.rope.scaling.original_context_length' is a bool"},
        {{NULL, "qwen3.rope.scaling.attn_factor", 'f', 0.0, NULL, -1},
         "'qwen3.rope.scaling.attn_factor' = 0 is out of range"},
        {{NULL, "qwen3.rope.scaling.attn_factor", 'f', 2000.0, NULL, -1},
         "'qwen3.rope.scaling.attn_factor' = 2000 is out of range (at most 1000)"},
        {{NULL, "qwen3.attention.key_length", 'u', 2048, NULL, -1},
         "head size of 2048 (attention.key_length) is above the 1024"},
        {{"qwen3.attention.key_length", "qwen3.attention.head_count", 'u', 1024, NULL, -1},
         "'qwen3.attention.key_length' is missing and embedding_length 512 is not a multiple"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *path = edited_copy(f, &cases[i].e);
        struct gguf_file *g = NULL;
        ck_assert_int_eq(gguf_open(path, &g, &err), TPI_OK);
        struct model_config c;
        const int rc = model_config_from_gguf(&c, g, &err);
        gguf_close(&g);
        ck_assert_msg(rc != TPI_OK, "case %zu: accepted", i);
        ck_assert_msg(strstr(err.msg, path) && strstr(err.msg, cases[i].want) &&
                          !strchr(err.msg, '\n'),
                      "case %zu: '%s' lacks '%s'", i, err.msg, cases[i].want);
    }
    // The tokenizer against the embedding: 2048 tokens, and a copy whose embedding lost
    // its rows (the config check finds the shapes fine as long as output agrees, so the
    // tokenizer is what must refuse it).
    const struct gguf_tensor *emb = gguf_find_tensor(f, "token_embd.weight");
    ck_assert_int_eq(emb->ne[1], 2048);
    struct gguf_writer *w = gguf_writer_new(0);
    for (int64_t i = 0; i < gguf_n_kv(f); i++)
        ck_assert_int_eq(gguf_writer_copy_kv(w, gguf_kv_at(f, i)), TPI_OK);
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
        if (!strcmp(t->name, "token_embd.weight") || !strcmp(t->name, "output.weight"))
            ne[1] = 2000;
        ck_assert_int_ge(gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, ne, t->data), 0);
    }
    const char *path = tu_tmp_path("rows.gguf");
    ck_assert_int_eq(gguf_writer_write(w, path, &err), TPI_OK);
    gguf_writer_free(&w);
    struct gguf_file *g = NULL;
    ck_assert_int_eq(gguf_open(path, &g, &err), TPI_OK);
    struct model_config c;
    ck_assert_msg(model_config_from_gguf(&c, g, &err) == TPI_OK, "%s", err.msg);
    struct tokenizer *tok = NULL;
    ck_assert_int_ne(tok_load(g, &tok, &err), TPI_OK);
    ck_assert_msg(strstr(err.msg, "tokenizer.ggml.tokens has 2048 entries and token_embd.weight "
                                  "2000 rows"),
                  "%s", err.msg);
    gguf_close(&g);
    ck_assert_int_eq(tok_load(f, &tok, &err), TPI_OK); // the model itself is fine
    tok_free(&tok);
    // A plan with more ranks than output rows.
    ck_assert_int_eq(model_config_from_gguf(&c, f, &err), TPI_OK);
    c.n_vocab = 3;
    struct model_plan plan;
    ck_assert_int_ne(model_plan_make(&plan, &c, 4, 1, 0, 0, NULL, 0, &err), TPI_OK);
    ck_assert_msg(strstr(err.msg, "--tp 4 exceeds the model's vocabulary of 3"), "%s", err.msg);
    gguf_close(&f);
    tu_tmpdir_remove();
}
END_TEST

/* The rope scaling a file's keys (and a run's options) give, as llama.cpp reads them: a
 * factor without a type is linear, rope.scale_linear is the older factor key, type none
 * never scales the angles but keeps attn_factor, original_context_length 0 or absent is
 * the context_length, and the options override the keys one by one. */
START_TEST(test_config_rope) {
    struct gguf_file *f = tiny_for_edits();
    if (!f) return;
    struct tpi_error err = {0};
    static const struct {
        struct key_edit e[3];
        int n;
        enum model_rope_scaling kind;
        float freq_scale, ext_factor, attn_factor;
        int n_ctx_orig; /* in the struct ops_rope (0: no YaRN) */
        bool scaled;
    } cases[] = {
        {{{0}}, 0, MODEL_ROPE_LINEAR, 1.0f, 0.0f, 1.0f, 0, false},
        {{{NULL, "qwen3.rope.scaling.factor", 'f', 2.0, NULL, -1}}, 1, MODEL_ROPE_LINEAR, 0.5f,
         0.0f, 1.0f, 0, true},
        {{{NULL, "qwen3.rope.scale_linear", 'f', 4.0, NULL, -1}}, 1, MODEL_ROPE_LINEAR, 0.25f,
         0.0f, 1.0f, 0, true},
        {{{NULL, "qwen3.rope.scaling.factor", 'f', 0.0, NULL, -1}}, 1, MODEL_ROPE_LINEAR, 1.0f,
         0.0f, 1.0f, 0, false},
        {{{NULL, "qwen3.rope.scaling.type", 's', 0, "none", -1},
          {NULL, "qwen3.rope.scaling.factor", 'f', 4.0, NULL, -1},
          {NULL, "qwen3.rope.scaling.attn_factor", 'f', 2.0, NULL, -1}},
         3, MODEL_ROPE_NONE, 1.0f, 0.0f, 2.0f, 0, true},
        {{{NULL, "qwen3.rope.scaling.type", 's', 0, "yarn", -1},
          {NULL, "qwen3.rope.scaling.factor", 'f', 4.0, NULL, -1},
          {NULL, "qwen3.rope.scaling.original_context_length", 'u', 0, NULL, -1}},
         3, MODEL_ROPE_YARN, 0.25f, 1.0f, 1.0f, 4096, true},
        {{{NULL, "qwen3.rope.scaling.type", 's', 0, "yarn", -1},
          {NULL, "qwen3.rope.scaling.factor", 'f', 8.0, NULL, -1},
          {NULL, "qwen3.rope.scaling.original_context_length", 'u', 512, NULL, -1}},
         3, MODEL_ROPE_YARN, 0.125f, 1.0f, 1.0f, 512, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *path = edited_copy_n(f, cases[i].e, cases[i].n);
        struct gguf_file *g = NULL;
        ck_assert_int_eq(gguf_open(path, &g, &err), TPI_OK);
        struct model_config c;
        ck_assert_msg(model_config_from_gguf(&c, g, &err) == TPI_OK, "case %zu: %s", i, err.msg);
        gguf_close(&g);
        const struct ops_rope r = model_rope(&c);
        ck_assert_msg(c.rope_scaling == cases[i].kind && r.freq_scale == cases[i].freq_scale &&
                          r.ext_factor == cases[i].ext_factor &&
                          r.attn_factor == cases[i].attn_factor &&
                          (cases[i].n_ctx_orig == 0 || r.n_ctx_orig == cases[i].n_ctx_orig) &&
                          model_rope_scaled(&c) == cases[i].scaled && r.n_rot == c.n_rot &&
                          r.freq_base == c.rope_base,
                      "case %zu: kind %d, freq_scale %g, ext %g, attn %g, orig %d, scaled %d", i,
                      c.rope_scaling, (double)r.freq_scale, (double)r.ext_factor,
                      (double)r.attn_factor, r.n_ctx_orig, model_rope_scaled(&c));
        if (i == 5) { // options on top of a YaRN file, one by one
            struct model_config o = c;
            model_config_rope_override(&o, &(struct model_rope_opts){.scale = 2.0f});
            ck_assert(o.rope_scaling == MODEL_ROPE_YARN && o.rope_freq_scale == 0.5f &&
                      o.rope_n_ctx_orig == 4096);
            o = c;
            model_config_rope_override(&o, &(struct model_rope_opts){.orig_ctx = 100});
            ck_assert(o.rope_freq_scale == 0.25f && o.rope_n_ctx_orig == 100);
            o = c;
            model_config_rope_override(&o, &(struct model_rope_opts){.scaling = "none"});
            const struct ops_rope n = model_rope(&o);
            ck_assert(n.freq_scale == 1.0f && n.ext_factor == 0.0f && !model_rope_scaled(&o));
            o = c;
            model_config_rope_override(&o, &(struct model_rope_opts){.scaling = "linear"});
            const struct ops_rope l = model_rope(&o);
            ck_assert(l.freq_scale == 0.25f && l.ext_factor == 0.0f);
        }
    }
    gguf_close(&f);
}
END_TEST

/* model_kv_copy on the CPU backend: the next token after a copied prefix gives
 * bit for bit the logits of the slot that computed the prefix, a slot holding
 * another sequence does not, and bad slots or lengths are refused. */
START_TEST(test_kv_copy) {
    const char *path = tu_data_path("qwen3-tiny-q4_k_m.gguf");
    if (!path) return; // data missing: main prints SKIP for data tests
    struct model_params p = {.path = path, .backend = "cpu", .n_threads = 1, .n_ctx = 64,
                             .n_slot = 3, .quiet = true};
    struct model *m = NULL;
    struct tpi_error err = {0};
    ck_assert_msg(model_load(&m, &p, NULL, &err) == TPI_OK, "%s", err.msg);
    const int n_vocab = m->cfg.n_vocab, L = 12;
    int32_t tok[12], pos[12], seq[12], other[12];
    for (int i = 0; i < L; i++) {
        tok[i] = (i * 37 + 11) % n_vocab;
        other[i] = (i * 53 + 5) % n_vocab;
        pos[i] = i;
    }
    float *l0 = malloc(sizeof(float) * n_vocab), *l1 = malloc(sizeof(float) * n_vocab);
    float *l2 = malloc(sizeof(float) * n_vocab);
    const int32_t last = L - 2;
    for (int i = 0; i < L - 1; i++) seq[i] = 0;
    ck_assert_int_eq(model_forward(m, tok, pos, seq, L - 1, &last, 1, l0, &err), TPI_OK);
    for (int i = 0; i < L - 1; i++) seq[i] = 2;
    ck_assert_int_eq(model_forward(m, other, pos, seq, L - 1, &last, 1, l2, &err), TPI_OK);
    ck_assert_int_eq(model_kv_copy(m, 0, 1, L - 1, &err), TPI_OK);
    ck_assert_int_eq(model_kv_copy(m, 1, 1, 4, &err), TPI_ERR_INVALID);
    ck_assert_int_eq(model_kv_copy(m, 0, 3, 4, &err), TPI_ERR_INVALID);
    ck_assert_int_eq(model_kv_copy(m, 0, 1, 65, &err), TPI_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "kv copy"));
    const int32_t t = tok[L - 1], ps = L - 1, r = 0, s0 = 0, s1 = 1, s2 = 2;
    ck_assert_int_eq(model_forward(m, &t, &ps, &s0, 1, &r, 1, l0, &err), TPI_OK);
    ck_assert_int_eq(model_forward(m, &t, &ps, &s1, 1, &r, 1, l1, &err), TPI_OK);
    ck_assert_int_eq(model_forward(m, &t, &ps, &s2, 1, &r, 1, l2, &err), TPI_OK);
    ck_assert_mem_eq(l1, l0, sizeof(float) * n_vocab);
    ck_assert_int_ne(memcmp(l2, l0, sizeof(float) * n_vocab), 0);
    free(l0);
    free(l1);
    free(l2);
    model_free(&m);
}
END_TEST

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "unit";
    Suite *s = suite_create("model");
    TCase *tc = tcase_create("model");
    tcase_set_timeout(tc, 300);
    char file[256];
    const bool ppl_mode = !strcmp(mode, "ppl") || !strcmp(mode, "ppl_cli");
    if ((!strcmp(mode, "logits") || ppl_mode) && argc > 2) {
        snprintf(file, sizeof file, "%s.gguf", argv[2]);
        if (!tu_data_or_skip(file)) return TU_SKIP;
        snprintf(file, sizeof file, "%s.ref.json", argv[2]);
        if (!strcmp(mode, "logits") && !tu_data_or_skip(file)) return TU_SKIP;
        if (ppl_mode && !tu_data_or_skip("ppl-text.txt")) return TU_SKIP;
    }
    if (!strncmp(mode, "logits_yarn", 11) && argc > 2) {
        snprintf(file, sizeof file, "%s.yarn.ref.json", argv[2]);
        if (!tu_data_or_skip(file)) return TU_SKIP;
        g_name = argv[2];
        g_yarn = !strcmp(mode, "logits_yarn_keys") ? 2 : 1;
        tcase_add_test(tc, test_logits_vs_llamacpp);
    } else if (!strcmp(mode, "logits") && argc > 2) {
        g_name = argv[2];
        tcase_add_test(tc, test_logits_vs_llamacpp);
    } else if (!strcmp(mode, "ppl") && argc > 3) {
        g_name = argv[2];
        g_ppl_ref = atof(argv[3]);
        tcase_add_test(tc, test_perplexity_vs_llamacpp);
    } else if (!strcmp(mode, "ppl_cli") && argc > 3) {
        g_name = argv[2];
        g_ppl_ref = atof(argv[3]);
        tcase_add_test(tc, test_perplexity_cli);
    } else {
        tcase_add_test(tc, test_plan);
        tcase_add_test(tc, test_sampling);
        tcase_add_test(tc, test_sampling_partial_sort);
        tcase_add_test(tc, test_sampling_top);
        tcase_add_test(tc, test_stop_strings);
        tcase_add_test(tc, test_config_errors);
        tcase_add_test(tc, test_config_values);
        tcase_add_test(tc, test_config_rope);
        tcase_add_test(tc, test_kv_copy);
    }
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
