/*
 * test_tokenizer.c — the BPE tokenizer against Hugging Face `tokenizers`:
 * every case of tokenizer-cases.jsonl (Qwen3 vocab, qwen3-vocab.gguf) and
 * mini2048-cases.jsonl (the tiny models' vocab) must encode to exactly the
 * reference ids and decode back to NFC(text); streaming decode must give the
 * same bytes without ever emitting half a character; ChatML rendering; error
 * paths. Built a second time with TOK_TEST_CLI to run `tpinfer tokenize`.
 *
 * The Qwen3 vocabulary (151,936 tokens, 151,387 merges) is loaded once in
 * main(); Check forks each test from there, so the children share it.
 */
#define _GNU_SOURCE /* getline, popen, mkdtemp */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <utf8proc.h>

#include "gguf.h"
#include "testutil.h"
#include "text/json_py.h"
#include "text/tokenizer.h"

static struct tokenizer *g_qwen3; /* qwen3-vocab.gguf */

/* ---- helpers ----------------------------------------------------------------- */

static struct tokenizer *load_vocab(const char *path) {
    struct gguf_file *f = NULL;
    struct tpi_error err = {0};
    struct tokenizer *t = NULL;
    if (gguf_open(path, &f, &err) != TPI_OK) {
        fprintf(stderr, "gguf_open: %s\n", err.msg);
        return NULL;
    }
    if (tok_load(f, &t, &err) != TPI_OK) fprintf(stderr, "tok_load: %s\n", err.msg);
    gguf_close(&f);
    return t;
}

static void print_ids(const char *label, const int32_t *ids, int n) {
    fprintf(stderr, "    %s (%d):", label, n);
    for (int i = 0; i < n && i < 40; i++)
        fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, n > 40 ? " ...\n" : "\n");
}

static bool valid_utf8(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k =
            utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0 || cp < 0) return false;
        i += (size_t)k;
    }
    return true;
}

/* Run every {"text", "ids"} line of `cases` through `t`: encode must equal ids,
 * decode(ids) must equal NFC(text). Returns the number of failing lines and
 * prints the first few. */
static int run_cases(const struct tokenizer *t, const char *cases, int *n_lines) {
    FILE *fp = fopen(cases, "r");
    ck_assert_msg(fp != NULL, "cannot open %s", cases);
    char *line = NULL;
    size_t cap = 0;
    int n_fail = 0, lineno = 0;
    while (getline(&line, &cap, fp) > 0) {
        lineno++;
        cJSON *j = cJSON_Parse(line);
        ck_assert_msg(j != NULL, "%s:%d: bad JSON", cases, lineno);
        const cJSON *jt = cJSON_GetObjectItemCaseSensitive(j, "text");
        const cJSON *ji = cJSON_GetObjectItemCaseSensitive(j, "ids");
        ck_assert(cJSON_IsString(jt) && cJSON_IsArray(ji));
        int n_want = cJSON_GetArraySize(ji);
        int32_t *want = malloc(sizeof *want * (size_t)(n_want + 1));
        for (int i = 0; i < n_want; i++)
            want[i] = (int32_t)cJSON_GetArrayItem(ji, i)->valueint;
        const char *text = jt->valuestring;
        size_t len = strlen(text);

        int32_t *got = NULL;
        int n_got = 0;
        struct tpi_error err = {0};
        int rc = tok_encode(t, text, len, true, &got, &n_got, &err);
        bool ok = rc == TPI_OK && n_got == n_want &&
                  (n_got == 0 || memcmp(got, want, sizeof *got * (size_t)n_got) == 0);

        /* decode(ids) == NFC(text) */
        char *dec = NULL;
        size_t n_dec = 0;
        utf8proc_uint8_t *nfc = NULL;
        utf8proc_ssize_t n_nfc =
            len ? utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len, &nfc,
                               UTF8PROC_STABLE | UTF8PROC_COMPOSE)
                : 0;
        int drc = tok_decode(t, want, n_want, &dec, &n_dec, &err);
        bool dec_ok = drc == TPI_OK && n_nfc >= 0 && n_dec == (size_t)n_nfc &&
                      (n_dec == 0 || memcmp(dec, nfc, n_dec) == 0);

        if (!ok || !dec_ok) {
            if (++n_fail <= 5) {
                fprintf(stderr, "  %s:%d: %s text=%.200s\n", cases, lineno,
                        !ok ? "encode mismatch" : "decode != NFC(text)", text);
                if (rc != TPI_OK) fprintf(stderr, "    error: %s\n", err.msg);
                if (!ok) {
                    print_ids("got ", got, n_got);
                    print_ids("want", want, n_want);
                } else {
                    fprintf(stderr, "    decoded: %.*s\n", (int)TPI_MIN(n_dec, 200), dec);
                }
            }
        }
        free(nfc);
        free(dec);
        free(got);
        free(want);
        cJSON_Delete(j);
    }
    free(line);
    fclose(fp);
    *n_lines = lineno;
    return n_fail;
}

/* ---- reference cases ------------------------------------------------------------ */

START_TEST(test_qwen3_cases) {
    const char *cases = tu_data_or_skip("tokenizer-cases.jsonl");
    if (!cases) return;
    int n_lines = 0;
    double t0 = tpi_time_s();
    int n_fail = run_cases(g_qwen3, cases, &n_lines);
    fprintf(stderr, "qwen3 vocab: %d/%d cases match HF (%.2f s)\n", n_lines - n_fail, n_lines,
            tpi_time_s() - t0);
    ck_assert_int_gt(n_lines, 400);
    ck_assert_msg(n_fail == 0, "%d of %d tokenizer cases differ from HF", n_fail, n_lines);
}
END_TEST

START_TEST(test_mini2048_cases) {
    const char *cases = tu_data_or_skip("mini2048-cases.jsonl");
    const char *model = tu_data_or_skip("qwen3-tiny-q4_k_m.gguf");
    if (!cases || !model) return;
    struct tokenizer *t = load_vocab(model);
    ck_assert(t != NULL);
    ck_assert_int_eq(tok_n_vocab(t), 2048);
    ck_assert_int_eq(tok_eos(t), 2047);
    ck_assert_int_eq(tok_id_of(t, "<|im_start|>"), 2046);
    int n_lines = 0;
    int n_fail = run_cases(t, cases, &n_lines);
    fprintf(stderr, "mini2048 vocab: %d/%d cases match HF\n", n_lines - n_fail, n_lines);
    tok_free(&t);
    ck_assert_ptr_null(t);
    ck_assert_int_gt(n_lines, 300);
    ck_assert_msg(n_fail == 0, "%d of %d mini2048 cases differ from HF", n_fail, n_lines);
}
END_TEST

/* ---- vocabulary queries ------------------------------------------------------------ */

START_TEST(test_vocab_queries) {
    const struct tokenizer *t = g_qwen3;
    ck_assert_int_eq(tok_n_vocab(t), 151936);
    ck_assert_int_eq(tok_eos(t), 151645);
    ck_assert_int_eq(tok_bos(t), 151643);
    ck_assert_int_eq(tok_pad(t), 151643);
    ck_assert(!tok_add_bos(t));
    ck_assert_int_eq(tok_id_of(t, "<|im_start|>"), 151644);
    ck_assert_int_eq(tok_id_of(t, "<think>"), 151667);
    ck_assert_int_eq(tok_id_of(t, "Ġworld"), 1879);
    ck_assert_int_eq(tok_id_of(t, "no such token here"), -1);
    ck_assert(tok_is_eog(t, 151645));
    ck_assert(tok_is_eog(t, 151643));
    ck_assert(!tok_is_eog(t, 151644));
    ck_assert(!tok_is_eog(t, 1879));
    ck_assert(!tok_is_eog(t, -1));
    // llama.cpp's set on Qwen's vocabulary: <|im_end|> (EOS), <|endoftext|> and the FIM
    // tokens <|fim_pad|>, <|repo_name|>, <|file_sep|> (its llama-vocab.cpp EOG list);
    // not <|fim_prefix|>, <|fim_middle|>, <|fim_suffix|>, <|im_start|>.
    ck_assert_int_eq(tok_id_of(t, "<|fim_pad|>"), 151662);
    ck_assert_int_eq(tok_id_of(t, "<|file_sep|>"), 151664);
    int32_t eog[TOK_MAX_EOG];
    ck_assert_int_eq(tok_eog_ids(t, eog), 5);
    static const int32_t want_eog[5] = {151645, 151643, 151662, 151663, 151664};
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(eog[i], want_eog[i]);
        ck_assert(tok_is_eog(t, want_eog[i]));
    }
    for (int32_t id = 151659; id <= 151661; id++) ck_assert(!tok_is_eog(t, id));
    ck_assert_int_eq(tok_type_of(t, 151644), TOK_TYPE_CONTROL);
    ck_assert_int_eq(tok_type_of(t, 151667), TOK_TYPE_USER_DEFINED);
    ck_assert_int_eq(tok_type_of(t, 151936), -1);
    struct tok_str p = tok_piece(t, 1879);
    ck_assert_int_eq(p.len, strlen("Ġworld"));
    ck_assert_str_eq(p.data, "Ġworld");
    struct tok_str b = tok_token_bytes(t, 1879);
    ck_assert_int_eq(b.len, 6);
    ck_assert(memcmp(b.data, " world", 6) == 0);
    ck_assert_ptr_null(tok_piece(t, -3).data);
    ck_assert_ptr_nonnull(tok_chat_template(t));
}
END_TEST

START_TEST(test_parse_special_off) {
    const struct tokenizer *t = g_qwen3;
    int32_t *ids = NULL;
    int n = 0;
    struct tpi_error err = {0};
    /* CONTROL tokens stay text without parse_special ... */
    const char *s = "<|im_start|>user";
    ck_assert_int_eq(tok_encode(t, s, strlen(s), false, &ids, &n, &err), TPI_OK);
    ck_assert_int_gt(n, 2);
    for (int i = 0; i < n; i++)
        ck_assert_int_lt(ids[i], 151643);
    free(ids);
    ck_assert_int_eq(tok_encode(t, s, strlen(s), true, &ids, &n, &err), TPI_OK);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(ids[0], 151644);
    ck_assert_int_eq(ids[1], 872);
    free(ids);
    /* ... USER_DEFINED ones (<think>) are split either way, as in HF/llama.cpp */
    s = "<think>";
    ck_assert_int_eq(tok_encode(t, s, strlen(s), false, &ids, &n, &err), TPI_OK);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(ids[0], 151667);
    free(ids);
    /* empty input gives an empty, non-NULL list */
    ck_assert_int_eq(tok_encode(t, "", 0, true, &ids, &n, &err), TPI_OK);
    ck_assert_int_eq(n, 0);
    ck_assert_ptr_nonnull(ids);
    free(ids);
}
END_TEST

START_TEST(test_invalid_utf8) {
    int32_t *ids = NULL;
    int n = 0;
    struct tpi_error err = {0};
    const char bad[] = "ok \xff\xfe here";
    ck_assert_int_eq(tok_encode(g_qwen3, bad, sizeof bad - 1, true, &ids, &n, &err),
                     TPI_ERR_INVALID);
    ck_assert_ptr_null(ids);
    ck_assert_msg(strstr(err.msg, "byte 3") != NULL, "message: %s", err.msg);
    int32_t out_of_range[2] = {5, 151936};
    char *dec = NULL;
    size_t n_dec = 0;
    ck_assert_int_eq(tok_decode(g_qwen3, out_of_range, 2, &dec, &n_dec, &err), TPI_ERR_INVALID);
    ck_assert_ptr_null(dec);
    ck_assert_msg(strstr(err.msg, "index 1") != NULL, "message: %s", err.msg);
}
END_TEST

/* Whitespace edge cases outside the reference file, ids from Hugging Face
 * tokenizers 0.23.3 (Python) on the same tokenizer.json. U+180E is not
 * White_Space for HF, though PCRE2's \s matches it. */
START_TEST(test_whitespace_edges) {
    static const struct {
        const char *text;
        int n;
        int32_t ids[12];
    } cases[] = {
        {"x \xe1\xa0\x8e've *v", 8, {87, 86089, 254, 236, 6, 586, 353, 85}},
        {"a\xc2\x85\xc2\x85 b\xe2\x80\xa8\xe2\x80\xa8\n",
         11,
         {64, 126, 227, 126, 227, 293, 378, 101, 378, 101, 198}},
        {"\xe1\xa0\x8e\xe1\xa0\x8e<\n", 5, {123970, 236, 123970, 236, 30558}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int32_t *ids = NULL;
        int n = 0;
        struct tpi_error err = {0};
        ck_assert_int_eq(
            tok_encode(g_qwen3, cases[k].text, strlen(cases[k].text), true, &ids, &n, &err),
            TPI_OK);
        bool same = n == cases[k].n && memcmp(ids, cases[k].ids, sizeof *ids * (size_t)n) == 0;
        if (!same) {
            print_ids("got ", ids, n);
            print_ids("want", cases[k].ids, cases[k].n);
        }
        ck_assert_msg(same, "whitespace case %zu differs from HF", k);
        free(ids);
    }
}
END_TEST

/* A megabyte of one letter is one pre-token: the heap merge must keep it fast. */
START_TEST(test_long_word) {
    size_t n = 1 << 20;
    char *s = malloc(n);
    memset(s, 'a', n);
    int32_t *ids = NULL;
    int n_ids = 0;
    struct tpi_error err = {0};
    double t0 = tpi_time_s();
    ck_assert_int_eq(tok_encode(g_qwen3, s, n, true, &ids, &n_ids, &err), TPI_OK);
    double dt = tpi_time_s() - t0;
    char *dec = NULL;
    size_t n_dec = 0;
    ck_assert_int_eq(tok_decode(g_qwen3, ids, n_ids, &dec, &n_dec, &err), TPI_OK);
    ck_assert_int_eq(n_dec, n);
    ck_assert(memcmp(dec, s, n) == 0);
    fprintf(stderr, "1 MiB of 'a': %d tokens in %.3f s\n", n_ids, dt);
    ck_assert_int_lt(n_ids, (int)(n / 4));
    ck_assert(dt < 10.0);
    free(dec);
    free(ids);
    free(s);
}
END_TEST

/* ---- streaming decode --------------------------------------------------------------- */

/* Stream `ids` one at a time; the concatenation must equal tok_decode's bytes
 * and every chunk must be valid UTF-8 on its own. Returns how many tokens ended
 * inside a character (held back), so callers can see the case was exercised. */
static int check_stream(const struct tokenizer *t, const int32_t *ids, int n) {
    struct tpi_error err = {0};
    char *want = NULL;
    size_t n_want = 0;
    ck_assert_int_eq(tok_decode(t, ids, n, &want, &n_want, &err), TPI_OK);
    struct tok_stream *s = tok_stream_new(t, true);
    ck_assert_ptr_nonnull(s);
    char *got = malloc(n_want * 3 + 16);
    size_t n_got = 0;
    int n_held = 0;
    for (int i = 0; i < n; i++) {
        const char *chunk;
        size_t n_chunk;
        ck_assert_int_eq(tok_stream_push(s, ids[i], &chunk, &n_chunk, &err), TPI_OK);
        ck_assert_msg(valid_utf8(chunk, n_chunk),
                      "token %d (id %d): chunk of %zu bytes is not "
                      "complete UTF-8",
                      i, ids[i], n_chunk);
        struct tok_str tb = tok_token_bytes(t, ids[i]);
        if (!valid_utf8(tb.data, tb.len)) n_held++;
        memcpy(got + n_got, chunk, n_chunk);
        n_got += n_chunk;
    }
    const char *tail;
    size_t n_tail;
    tok_stream_flush(s, &tail, &n_tail);
    ck_assert_int_eq(n_tail, 0);
    ck_assert_msg(n_got == n_want && memcmp(got, want, n_got) == 0,
                  "streamed %zu bytes, decode gives %zu", n_got, n_want);
    tok_stream_free(&s);
    ck_assert_ptr_null(s);
    free(got);
    free(want);
    return n_held;
}

START_TEST(test_stream_decode) {
    const char *texts[] = {
        "👩‍👩‍👧‍👦 family, 🇯🇵 flag, 🤖🦀 done",
        "日本語のテキストと中文文本，还有한국어。",
        "Ünïcödé ﬁ ligature and e\xcc\x81 decomposed",
        "emoji at the end 😀",
    };
    int n_held = 0;
    for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++) {
        int32_t *ids = NULL;
        int n = 0;
        struct tpi_error err = {0};
        ck_assert_int_eq(tok_encode(g_qwen3, texts[k], strlen(texts[k]), true, &ids, &n, &err),
                         TPI_OK);
        n_held += check_stream(g_qwen3, ids, n);
        free(ids);
    }
    /* the test means something only if some tokens split characters */
    ck_assert_int_gt(n_held, 0);

    /* a lone lead byte at the end comes out of flush as U+FFFD */
    struct tok_stream *s = tok_stream_new(g_qwen3, false);
    int32_t lead = tok_id_of(g_qwen3, "ð"); /* byte 0xf0 */
    ck_assert_int_ge(lead, 0);
    const char *chunk;
    size_t n_chunk;
    struct tpi_error err = {0};
    ck_assert_int_eq(tok_stream_push(s, lead, &chunk, &n_chunk, &err), TPI_OK);
    ck_assert_int_eq(n_chunk, 0);
    /* a CONTROL token renders nothing with render_control = false */
    ck_assert_int_eq(tok_stream_push(s, 151645, &chunk, &n_chunk, &err), TPI_OK);
    ck_assert_int_eq(n_chunk, 0);
    tok_stream_flush(s, &chunk, &n_chunk);
    ck_assert_int_eq(n_chunk, 3);
    ck_assert(memcmp(chunk, "\xef\xbf\xbd", 3) == 0);
    /* a lead byte followed by ASCII: U+FFFD then the ASCII, nothing held */
    ck_assert_int_eq(tok_stream_push(s, lead, &chunk, &n_chunk, &err), TPI_OK);
    ck_assert_int_eq(tok_stream_push(s, tok_id_of(g_qwen3, "a"), &chunk, &n_chunk, &err), TPI_OK);
    ck_assert_int_eq(n_chunk, 4);
    ck_assert(memcmp(chunk,
                     "\xef\xbf\xbd"
                     "a",
                     4) == 0);
    tok_stream_free(&s);
}
END_TEST

/* The id whose bytes are exactly b[0..n) (-1: none). */
static int32_t id_of_bytes(const struct tokenizer *t, const char *b, size_t n) {
    for (int32_t id = 0; id < tok_n_vocab(t); id++) {
        struct tok_str s = tok_token_bytes(t, id);
        if (s.len == n && !memcmp(s.data, b, n)) return id;
    }
    return -1;
}

/* Pushes ids[0..n) and flushes; the bytes that came out, NUL-terminated, in out. */
static size_t stream_all(const int32_t *ids, int n, char *out) {
    struct tok_stream *s = tok_stream_new(g_qwen3, false);
    const char *chunk;
    size_t n_chunk, o = 0;
    struct tpi_error err = {0};
    for (int i = 0; i < n; i++) {
        ck_assert_int_eq(tok_stream_push(s, ids[i], &chunk, &n_chunk, &err), TPI_OK);
        memcpy(out + o, chunk, n_chunk), o += n_chunk;
    }
    tok_stream_flush(s, &chunk, &n_chunk);
    memcpy(out + o, chunk, n_chunk), o += n_chunk;
    out[o] = '\0';
    tok_stream_free(&s);
    return o;
}

/* A broken character is one U+FFFD for each maximal subpart of it (Unicode's practice,
 * which Python's errors="replace", Rust's from_utf8_lossy and Hugging Face's decode
 * follow): a cut-off 3-byte lead and its continuation are one, a lead byte with a
 * continuation its table forbids (E0 80, ED A0: an overlong form, a surrogate) two. */
START_TEST(test_stream_replacement) {
    const int32_t e2_80 = id_of_bytes(g_qwen3, "\xe2\x80", 2), e0 = id_of_bytes(g_qwen3, "\xe0", 1),
                  ed = id_of_bytes(g_qwen3, "\xed", 1), x80 = id_of_bytes(g_qwen3, "\x80", 1),
                  xa0 = id_of_bytes(g_qwen3, "\xa0", 1), a = tok_id_of(g_qwen3, "a"),
                  x94 = id_of_bytes(g_qwen3, "\x94", 1);
    ck_assert(e2_80 >= 0 && e0 >= 0 && ed >= 0 && x80 >= 0 && xa0 >= 0 && a >= 0 && x94 >= 0);
    static const char R[] = "\xef\xbf\xbd";
    char out[64], want[64];
    const int32_t cut3[] = {e2_80, e2_80, e2_80}; /* HF: decode gives three U+FFFD */
    ck_assert_int_eq(stream_all(cut3, 3, out), 9);
    snprintf(want, sizeof want, "%s%s%s", R, R, R);
    ck_assert_str_eq(out, want);
    const int32_t whole[] = {e2_80, x94, a}; /* E2 80 94, an em dash, then "a" */
    ck_assert_int_eq(stream_all(whole, 3, out), 4);
    ck_assert_str_eq(out, "\xe2\x80\x94" "a");
    const int32_t cut_a[] = {e2_80, a};
    ck_assert_int_eq(stream_all(cut_a, 2, out), 4);
    snprintf(want, sizeof want, "%sa", R);
    ck_assert_str_eq(out, want);
    const int32_t overlong[] = {e0, x80, a}, surrogate[] = {ed, xa0, x80};
    ck_assert_int_eq(stream_all(overlong, 3, out), 7);
    snprintf(want, sizeof want, "%s%sa", R, R);
    ck_assert_str_eq(out, want);
    ck_assert_int_eq(stream_all(surrogate, 3, out), 9);
    snprintf(want, sizeof want, "%s%s%s", R, R, R);
    ck_assert_str_eq(out, want);
}
END_TEST

/* Every reference case streams back to its own decode. */
START_TEST(test_stream_all_cases) {
    const char *cases = tu_data_or_skip("tokenizer-cases.jsonl");
    if (!cases) return;
    size_t n_text = 0;
    char *all = tu_read_file(cases, &n_text);
    ck_assert_ptr_nonnull(all);
    int n_held = 0, n_cases = 0;
    for (char *line = strtok(all, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *ji = cJSON_GetObjectItemCaseSensitive(j, "ids");
        int n = cJSON_GetArraySize(ji);
        int32_t *ids = malloc(sizeof *ids * (size_t)(n + 1));
        for (int i = 0; i < n; i++)
            ids[i] = (int32_t)cJSON_GetArrayItem(ji, i)->valueint;
        n_held += check_stream(g_qwen3, ids, n);
        n_cases++;
        free(ids);
        cJSON_Delete(j);
    }
    free(all);
    fprintf(stderr, "stream: %d cases, %d tokens ended inside a character\n", n_cases, n_held);
    ck_assert_int_gt(n_held, 0);
}
END_TEST

/* ---- chat ------------------------------------------------------------------------- */

START_TEST(test_chatml) {
    struct tok_message msgs[2] = {{.role = "system", .content = "You are a helpful assistant."},
                                  {.role = "user", .content = "hi"}};
    char *out = NULL;
    size_t n = 0;
    struct tpi_error err = {0};
    ck_assert_int_eq(tok_apply_chat(g_qwen3, msgs, 2, NULL, &out, &n, &err), TPI_OK);
    const char *want = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                       "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
    ck_assert_str_eq(out, want);
    ck_assert_int_eq(n, strlen(want));
    /* and it encodes to the HF ids of that text (tokenizer-cases.jsonl line 34) */
    const int32_t want_ids[] = {151644, 8948,   198,    2610,   525,    264, 10950,
                                17847,  13,     151645, 198,    151644, 872, 198,
                                6023,   151645, 198,    151644, 77091,  198};
    int32_t *ids = NULL;
    int n_ids = 0;
    ck_assert_int_eq(tok_encode(g_qwen3, out, n, true, &ids, &n_ids, &err), TPI_OK);
    ck_assert_int_eq(n_ids, (int)(sizeof want_ids / sizeof want_ids[0]));
    for (int i = 0; i < n_ids; i++)
        ck_assert_int_eq(ids[i], want_ids[i]);
    free(ids);
    free(out);

    const struct tok_chat_opts no_prompt = {.add_generation_prompt = false, .enable_thinking = -1};
    ck_assert_int_eq(tok_apply_chat(g_qwen3, msgs, 2, &no_prompt, &out, &n, &err), TPI_OK);
    ck_assert_str_eq(out, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                          "<|im_start|>user\nhi<|im_end|>\n");
    free(out);
}
END_TEST

/* A tiny byte-level vocabulary built from arrays: the 256 byte tokens, "ab",
 * and a given template / pre-tokenizer. */
static int tiny_vocab(const char *pre, const char *tmpl, bool drop_byte, struct tokenizer **t,
                      struct tpi_error *err) {
    static char strs[260][8];
    struct tok_str toks[260];
    int32_t types[260];
    int n = 0;
    for (int b = 0; b < 256; b++) {
        /* the same byte-to-unicode table the tokenizer uses, written out here */
        int ok = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        int cp = b;
        if (!ok) {
            int k = 0;
            for (int c = 0; c < b; c++)
                k += !((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255));
            cp = 256 + k;
        }
        if (drop_byte && b == 'q') continue;
        size_t len = (size_t)utf8proc_encode_char(cp, (utf8proc_uint8_t *)strs[n]);
        toks[n] = (struct tok_str){strs[n], len};
        types[n++] = TOK_TYPE_NORMAL;
    }
    toks[n] = (struct tok_str){"ab", 2};
    types[n++] = TOK_TYPE_NORMAL;
    toks[n] = (struct tok_str){"<|im_start|>", 12};
    types[n++] = TOK_TYPE_CONTROL;
    toks[n] = (struct tok_str){"<|im_end|>", 10};
    types[n++] = TOK_TYPE_CONTROL;
    struct tok_str merges[1] = {{"a b", 3}};
    struct tok_vocab_spec spec = {.tokens = toks,
                                  .n_tokens = n,
                                  .types = types,
                                  .merges = merges,
                                  .n_merges = 1,
                                  .pre = pre,
                                  .bos_id = -1,
                                  .eos_id = n - 1,
                                  .pad_id = -1,
                                  .chat_template = tmpl,
                                  .chat_template_len = tmpl ? strlen(tmpl) : 0,
                                  .source = "tiny"};
    return tok_init_from_arrays(&spec, t, err);
}

START_TEST(test_from_arrays_and_errors) {
    struct tokenizer *t = NULL;
    struct tpi_error err = {0};
    ck_assert_int_eq(tiny_vocab("qwen2", NULL, false, &t, &err), TPI_OK);
    int32_t *ids = NULL;
    int n = 0;
    ck_assert_int_eq(tok_encode(t, "abc <|im_end|>", 14, true, &ids, &n, &err), TPI_OK);
    ck_assert_int_eq(n, 4); /* "ab" "c" " " "<|im_end|>" */
    ck_assert_int_eq(ids[0], 256);
    ck_assert_int_eq(ids[1], 'c');
    ck_assert_int_eq(ids[2], ' ');
    ck_assert_int_eq(ids[3], 258);
    free(ids);
    /* no template but ChatML tokens: ChatML */
    struct tok_message m = {.role = "user", .content = "x"};
    char *out = NULL;
    ck_assert_int_eq(tok_apply_chat(t, &m, 1, NULL, &out, NULL, &err), TPI_OK);
    ck_assert_str_eq(out, "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n");
    free(out);
    tok_free(&t);

    /* a template that is not ChatML is refused */
    ck_assert_int_eq(
        tiny_vocab(NULL, "{% for m in messages %}[INST] {{ m.content }}", false, &t, &err), TPI_OK);
    ck_assert_int_eq(tok_apply_chat(t, &m, 1, NULL, &out, NULL, &err), TPI_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(err.msg, "ChatML") != NULL, "message: %s", err.msg);
    tok_free(&t);

    ck_assert_int_eq(tiny_vocab("llama3", NULL, false, &t, &err), TPI_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(err.msg, "llama3") != NULL, "message: %s", err.msg);
    ck_assert_ptr_null(t);
    ck_assert_int_eq(tiny_vocab("qwen2", NULL, true, &t, &err), TPI_ERR_FORMAT);
    ck_assert_msg(strstr(err.msg, "0x71") != NULL, "message: %s", err.msg);
    ck_assert_ptr_null(t);
}
END_TEST

/* Every conversation of tests/chat/cases.jsonl, rendered by jinja2 from the real Qwen3,
 * Qwen2.5 and plain ChatML templates (tests/chat/make-cases.py), renders to the same
 * bytes here; the Qwen3 template there is the one qwen3-vocab.gguf carries. */
START_TEST(test_chat_templates) {
    enum { NT = 7 };
    const char *names[NT] = {"qwen3",        "qwen2.5",    "chatml",   "thinking-prompt",
                             "always-think", "drop-think", "same-line"};
    char *tmpl[NT];
    struct tokenizer *tok[NT];
    struct tpi_error err = {0};
    for (int k = 0; k < NT; k++) {
        char path[512];
        size_t n;
        snprintf(path, sizeof path, "%s/tests/chat/%s.jinja", tu_source_dir(), names[k]);
        tmpl[k] = tu_read_file(path, &n);
        ck_assert_msg(tmpl[k] != NULL, "cannot read %s", path);
        ck_assert_int_eq(tiny_vocab("qwen2", tmpl[k], false, &tok[k], &err), TPI_OK);
    }
    ck_assert_str_eq(tmpl[0], tok_chat_template(g_qwen3));

    char path[512];
    size_t n_text;
    snprintf(path, sizeof path, "%s/tests/chat/cases.jsonl", tu_source_dir());
    char *all = tu_read_file(path, &n_text);
    ck_assert_msg(all != NULL, "cannot read %s", path);
    int n_cases = 0, n_think = 0, n_refused = 0, n_tools = 0, n_no_tools = 0;
    for (char *line = all, *next; *line; line = next) {
        next = strchr(line, '\n');
        *next++ = '\0';
        // tools from the line's text (their numbers as written), tool calls from the tree
        char *tools[4] = {0};
        int n_t = 0;
        const char *tb, *te, *ib[4], *ie[4];
        if (json_member(line, next - 1, "tools", &tb, &te) && *tb == '[') {
            n_t = json_items(tb, te, ib, ie, 4);
            ck_assert_int_le(n_t, 4);
            for (int i = 0; i < n_t; i++) {
                tools[i] = tok_tool_json(ib[i], ie[i], &err);
                ck_assert_msg(tools[i] != NULL, "%s", err.msg);
            }
        }
        struct tok_tool_call calls[16][2];
        cJSON *c = cJSON_Parse(line);
        ck_assert_ptr_nonnull(c);
        const char *name = cJSON_GetObjectItem(c, "template")->valuestring;
        int k = 0;
        while (k < NT && strcmp(names[k], name))
            k++;
        ck_assert_int_lt(k, NT);
        const cJSON *msgs = cJSON_GetObjectItem(c, "messages");
        struct tok_message m[16];
        int n_m = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, msgs) {
            ck_assert_int_lt(n_m, 16);
            const cJSON *rc = cJSON_GetObjectItem(it, "reasoning_content");
            const cJSON *tc = cJSON_GetObjectItem(it, "tool_calls"), *call;
            int n_c = 0;
            cJSON_ArrayForEach(call, tc) {
                ck_assert_int_lt(n_c, 2);
                const cJSON *fn = cJSON_GetObjectItem(call, "function");
                ck_assert_int_eq(
                    tok_tool_call_init(&calls[n_m][n_c++],
                                       cJSON_GetObjectItem(fn, "name")->valuestring,
                                       cJSON_GetObjectItem(fn, "arguments")->valuestring, &err),
                    TPI_OK);
            }
            m[n_m] =
                (struct tok_message){.role = cJSON_GetObjectItem(it, "role")->valuestring,
                                     .content = cJSON_GetObjectItem(it, "content")->valuestring,
                                     .reasoning_content = rc ? rc->valuestring : NULL,
                                     .tool_calls = calls[n_m],
                                     .n_tool_calls = n_c};
            n_m++;
        }
        const cJSON *et = cJSON_GetObjectItem(c, "enable_thinking");
        const struct tok_chat_opts opts = {
            .add_generation_prompt = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt")),
            .enable_thinking = cJSON_IsBool(et) ? cJSON_IsTrue(et) : -1,
            .continue_final = cJSON_IsTrue(cJSON_GetObjectItem(c, "continue_final_message")),
            .tools = (const char *const *)tools,
            .n_tools = n_t};
        char *out = NULL;
        size_t n = 0;
        const cJSON *text = cJSON_GetObjectItem(c, "text");
        const bool tool_case = cJSON_HasObjectItem(c, "tools"); // TOOL_CONVERSATIONS
        n_tools += tool_case && !cJSON_IsNull(text);
        if (tool_case && cJSON_IsNull(text)) { // a template without tools: refused
            ck_assert_int_eq(tok_apply_chat(tok[k], m, n_m, &opts, &out, &n, &err),
                             TPI_ERR_UNSUPPORTED);
            ck_assert_msg(strstr(err.msg, "tool"), "%s", err.msg);
            n_no_tools++;
        } else if (cJSON_IsNull(text)) { // transformers refuses to continue it: so do we
            ck_assert_int_eq(tok_apply_chat(tok[k], m, n_m, &opts, &out, &n, &err),
                             TPI_ERR_INVALID);
            ck_assert_msg(strstr(err.msg, "cannot be continued"), "%s", err.msg);
            n_refused++;
        } else {
            ck_assert_msg(tok_apply_chat(tok[k], m, n_m, &opts, &out, &n, &err) == TPI_OK, "%s",
                          err.msg);
            const char *want = text->valuestring;
            ck_assert_msg(!strcmp(out, want),
                          "%s, %s, prompt %d, enable_thinking %d:\n--- got\n%s\n"
                          "--- want\n%s\n---",
                          name, cJSON_GetObjectItem(c, "case")->valuestring,
                          opts.add_generation_prompt, opts.enable_thinking, out, want);
            ck_assert_int_eq(n, strlen(want));
            n_think += strstr(want, "<think>\n\n</think>") != NULL;
            free(out);
        }
        for (int i = 0; i < n_m; i++)
            for (int j = 0; j < m[i].n_tool_calls; j++)
                tok_tool_call_free(&calls[i][j]);
        for (int i = 0; i < n_t; i++)
            free(tools[i]);
        cJSON_Delete(c);
        n_cases++;
    }
    fprintf(stderr,
            "chat: %d conversations rendered as jinja2 renders them (%d with an empty "
            "<think> block, %d not continuable, %d with tools or tool calls and %d more "
            "refused by templates without them)\n",
            n_cases, n_think, n_refused, n_tools, n_no_tools);
    ck_assert_int_ge(n_cases, 500);
    ck_assert_int_ge(n_tools, 24);
    ck_assert_int_ge(n_no_tools, 60);
    ck_assert_int_gt(n_think, 0);
    ck_assert_int_ge(n_refused, 1);
    free(all);

    /* Roles those templates do not render are refused (plain ChatML renders any). */
    struct tok_message dev[2] = {{.role = "developer", .content = "Be brief."},
                                 {.role = "user", .content = "Hi"}};
    char *out = NULL;
    for (int k = 0; k < 3; k++) {
        int rc = tok_apply_chat(tok[k], dev, 2, NULL, &out, NULL, &err);
        if (k == 2) {
            ck_assert_int_eq(rc, TPI_OK);
            ck_assert_str_eq(out, "<|im_start|>developer\nBe brief.<|im_end|>\n<|im_start|>user\n"
                                  "Hi<|im_end|>\n<|im_start|>assistant\n");
            free(out);
        } else {
            ck_assert_int_eq(rc, TPI_ERR_UNSUPPORTED);
            ck_assert_msg(strstr(err.msg, "message 0") && strstr(err.msg, "'developer'"), "%s",
                          err.msg);
        }
    }
    for (int k = 0; k < NT; k++) {
        tok_free(&tok[k]);
        free(tmpl[k]);
    }
    /* A generation prompt that is more than literals and enable_thinking tests is refused,
     * naming it; a template without one writes none, as Jinja does. */
    static const char loop[] = "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + "
                               "m.content + '<|im_end|>\\n' }}{% endfor %}";
    static const char *const tails[4] = {
        "{% if add_generation_prompt %}{{ '<|im_start|>' + 'assistant\\n' }}{% endif %}",
        "{% if add_generation_prompt %}{% if messages|length > 1 %}{{ 'x' }}{% endif %}{% endif %}",
        "{% if add_generation_prompt and true %}{{ '<|im_start|>assistant\\n' }}{% endif %}", ""};
    for (int k = 0; k < 4; k++) {
        char t[1024];
        snprintf(t, sizeof t, "%s%s", loop, tails[k]);
        struct tokenizer *tt = NULL;
        ck_assert_int_eq(tiny_vocab("qwen2", t, false, &tt, &err), TPI_OK);
        const int rc = tok_apply_chat(tt, dev + 1, 1, NULL, &out, NULL, &err);
        if (k < 3) {
            ck_assert_int_eq(rc, TPI_ERR_UNSUPPORTED);
            ck_assert_msg(strstr(err.msg, "generation prompt"), "%s", err.msg);
        } else {
            ck_assert_int_eq(rc, TPI_OK);
            ck_assert_str_eq(out, "<|im_start|>user\nHi<|im_end|>\n");
            free(out);
        }
        tok_free(&tt);
    }
}
END_TEST

/* JSON printed as Python's json.dumps(json.loads(text), ensure_ascii=False) prints it (the
 * expected strings are Python 3's), what is refused, and the tool helpers on top. */
START_TEST(test_json_py) {
    static const char *const cases[][2] = {
        {"1E400", "Infinity"},
        {"-1e400", "-Infinity"},
        {"-0", "0"},
        {"-0.0", "-0.0"},
        {"1.0E2", "100.0"},
        {"1e16", "1e+16"},
        {"1e15", "1000000000000000.0"},
        {"0.0001", "0.0001"},
        {"0.00001", "1e-05"},
        {"5e-324", "5e-324"},
        {"0.1", "0.1"},
        {"123456789012345678901234567890", "123456789012345678901234567890"},
        {"1.7976931348623157e308", "1.7976931348623157e+308"},
        {"2.2250738585072014e-308", "2.2250738585072014e-308"},
        {"0.30000000000000004", "0.30000000000000004"},
        {"9007199254740993.0", "9007199254740992.0"},
        {"[1,2.50,{\"a\" :\"x\\u00e9\\ud83d\\ude00\\n\\u0001\\/\"}]",
         "[1, 2.5, {\"a\": \"x\xc3\xa9\xf0\x9f\x98\x80\\n\\u0001/\"}]"},
        {"{\"b\":1,\"a\":[true,false,null],\"c\":{}}",
         "{\"b\": 1, \"a\": [true, false, null], \"c\": {}}"},
        {" [ ]\t", "[]"},
        {"\"tab\\tcr\\rbs\\bff\\f\\u007f\\u2028 \\\"q\\\" \\\\\"",
         "\"tab\\tcr\\rbs\\bff\\f\x7f\xe2\x80\xa8 \\\"q\\\" \\\\\""},
        {"\"\xe4\xb8\x96\xe7\x95\x8c\"", "\"\xe4\xb8\x96\xe7\x95\x8c\""},
        {"[NaN,Infinity, -Infinity,-1]", "[NaN, Infinity, -Infinity, -1]"},
        // a repeated key as Python's dict keeps it: its first place, its last value
        {"{\"a\":1,\"b\":[{\"c\":1,\"c\":{}}],\"a\":2}", "{\"a\": 2, \"b\": [{\"c\": {}}]}"},
        {"{\"\":1,\"x\":2,\"\":3}", "{\"\": 3, \"x\": 2}"},
        {"{ }", "{}"},
        {"[{},{\"a\":{}}]", "[{}, {\"a\": {}}]"},
        {"{\"\\u0061\":1,\"a\":2}", "{\"a\": 2}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *why = NULL, *in = cases[i][0];
        char *out = json_py_dumps(in, in + strlen(in), &why);
        ck_assert_msg(out && !strcmp(out, cases[i][1]), "%s: got %s, want %s", in, out ? out : why,
                      cases[i][1]);
        free(out);
    }
    static const char *const bad[][2] = {
        {"\"\\u0000\"", "NUL"},
        {"\"\\ud800\"", "surrogate"},
        {"\"\\udc00x\"", "surrogate"},
        {"[1,]", "valid"},
        {"01", "valid"},
        {"1.", "valid"},
        {".5", "valid"},
        {"tru", "valid"},
        {"\"\x01\"", "valid"},
        {"{\"a\" 1}", "valid"},
        {"[1] 2", "valid"},
        {"", "valid"},
        {"\"\\x\"", "valid"},
        {"-NaN", "valid"},
        {"nan", "valid"},
        {"Infinit", "valid"},
        {"-Inf", "valid"},
        {"[NaNa]", "valid"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *why = NULL, *in = bad[i][0];
        char *out = json_py_dumps(in, in + strlen(in), &why);
        ck_assert_msg(!out && why && strstr(why, bad[i][1]), "%s: %s", in, out ? out : why);
    }
    char deep[1200];
    memset(deep, '[', 600);
    memset(deep + 600, ']', 600);
    const char *why = NULL;
    ck_assert_ptr_null(json_py_dumps(deep, deep + sizeof deep, &why));
    ck_assert_str_eq(why, "nesting deeper than 512");

    // members and items: escaped names compared decoded, a repeated name's last value
    const char obj[] = "{\"a\": 1, \"\\u0074ools\": [10, {\"x\": 2}], \"a\": \"last\"}";
    const char *vb, *ve, *ib[2], *ie[2];
    ck_assert(json_member(obj, obj + strlen(obj), "tools", &vb, &ve));
    ck_assert_int_eq(json_items(vb, ve, ib, ie, 1), 2);
    ck_assert_int_eq((int)(ie[0] - ib[0]), 2);
    ck_assert_int_eq(json_items(vb, ve, ib, ie, 2), 2);
    ck_assert_int_eq((int)(ie[1] - ib[1]), 8);
    ck_assert_int_eq(json_items(vb, vb + 1, ib, ie, 2), -1);
    ck_assert_int_eq(json_items("[ ]", "[ ]" + 3, NULL, NULL, 0), 0);
    ck_assert_int_eq(json_items("{}", "{}" + 2, NULL, NULL, 0), -1);
    ck_assert(json_member(obj, obj + strlen(obj), "a", &vb, &ve));
    ck_assert(json_is_string(vb, ve));
    ck_assert(!json_member(obj, obj + strlen(obj), "b", &vb, &ve));

    // a tool as vLLM's model dump; what is refused, and why
    struct tpi_error err = {0};
    const char tool[] = "{\"function\": {\"parameters\": {\"t\": 1.50}, \"name\": \"f\\u00e9\", "
                        "\"strict\": false}}";
    char *t = tok_tool_json(tool, tool + strlen(tool), &err);
    ck_assert_msg(t != NULL, "%s", err.msg);
    ck_assert_str_eq(t, "{\"type\": \"function\", \"function\": {\"name\": \"f\xc3\xa9\", "
                        "\"description\": null, \"parameters\": {\"t\": 1.5}}}");
    free(t);
    const char twice[] = "{\"function\": {\"name\": \"f\", \"parameters\": {\"a\": 1, \"a\": 2}}}";
    t = tok_tool_json(twice, twice + strlen(twice), &err);
    ck_assert_msg(t != NULL, "%s", err.msg);
    ck_assert_str_eq(t, "{\"type\": \"function\", \"function\": {\"name\": \"f\", "
                        "\"description\": null, \"parameters\": {\"a\": 2}}}");
    free(t);
    static const char *const bad_tools[][3] = {
        {"[]", "3", "not a JSON object"},
        {"{\"type\": \"function\"}", "3", "no \"function\" object"},
        {"{\"type\": \"code\", \"function\": {\"name\": \"f\"}}", "5", "must be \"function\""},
        {"{\"function\": {\"name\": \"f\"}, \"extra\": 1}", "5", "\"extra\" is not supported"},
        {"{\"function\": {\"name\": \"f\", \"strict\": true}}", "5", "\"strict\""},
        {"{\"function\": {\"name\": \"f\", \"examples\": []}}", "5", "\"examples\""},
        {"{\"function\": {\"name\": 3}}", "3", "no \"name\" string"},
        {"{\"function\": {\"name\": \"f\", \"description\": 1}}", "3", "\"description\""},
        {"{\"function\": {\"name\": \"f\", \"parameters\": []}}", "3", "\"parameters\""},
    };
    for (size_t i = 0; i < sizeof bad_tools / sizeof bad_tools[0]; i++) {
        const char *in = bad_tools[i][0];
        ck_assert_ptr_null(tok_tool_json(in, in + strlen(in), &err));
        ck_assert_int_eq(err.status, atoi(bad_tools[i][1]));
        ck_assert_msg(strstr(err.msg, bad_tools[i][2]), "%s: %s", in, err.msg);
    }
    struct tok_tool_call call;
    ck_assert_int_eq(tok_tool_call_init(&call, "f", "{\"a\": [1.0, \"\\u00e9\"]}", &err), TPI_OK);
    ck_assert_str_eq(call.arguments, "{\"a\": [1.0, \"\xc3\xa9\"]}");
    ck_assert_ptr_null(call.arguments_str);
    tok_tool_call_free(&call);
    ck_assert_int_eq(tok_tool_call_init(&call, "f", " \"now\" ", &err), TPI_OK);
    ck_assert_str_eq(call.arguments, "\"now\"");
    ck_assert_str_eq(call.arguments_str, "now");
    tok_tool_call_free(&call);
    ck_assert_int_eq(tok_tool_call_init(&call, "f", "{city: 1}", &err), TPI_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "\"arguments\" are not JSON"), "%s", err.msg);

    // generated text's tool calls, as vLLM's hermes parser takes them
    struct tok_tool_call *calls = NULL;
    size_t content = 99;
    const char gen[] = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                       "{\"city\": \"Paris\", \"days\": 2.50}}\n</tool_call>\n<tool_call>\n"
                       "{\"arguments\": {}, \"name\": \"clock\", \"name\": \"time\"}\n";
    ck_assert_int_eq(tok_parse_tool_calls(gen, &calls, &content), 2);
    ck_assert_int_eq((int)content, 13);
    ck_assert_str_eq(calls[0].name, "get_weather");
    ck_assert_str_eq(calls[0].arguments, "{\"city\": \"Paris\", \"days\": 2.5}");
    ck_assert_str_eq(calls[1].name, "time"); // the last of a repeated key, as json.loads
    ck_assert_str_eq(calls[1].arguments, "{}");
    for (int k = 0; k < 2; k++)
        tok_tool_call_free(&calls[k]);
    free(calls);
    static const char *const not_calls[] = {
        "no calls here",
        "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",            // no arguments
        "<tool_call>{\"name\": 1, \"arguments\": {}}</tool_call>", // name not a string
        "<tool_call>[\"f\", {}]</tool_call>",                      // not an object
        "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>"
        "<tool_call>{\"name\": \"g\", \"arguments\": {}</tool_call>", // a second one broken
    };
    for (size_t i = 0; i < sizeof not_calls / sizeof not_calls[0]; i++) {
        ck_assert_int_eq(tok_parse_tool_calls(not_calls[i], &calls, &content), 0);
        ck_assert_ptr_null(calls);
    }
    ck_assert_int_eq(
        tok_parse_tool_calls("<tool_call>{\"name\": \"f\", \"arguments\": 7}", &calls, &content),
        1);
    ck_assert_int_eq((int)content, 0);
    ck_assert_str_eq(calls[0].arguments, "7");
    tok_tool_call_free(&calls[0]);
    free(calls);
    // as json.loads reads the arguments and json.dumps writes them: a repeated key's last
    // value; NaN and Infinity taken and written back
    static const char *const py_args[][2] = {
        {"{\"a\": 1, \"a\": 2}", "{\"a\": 2}"},
        {"{\"x\": NaN, \"y\": -Infinity}", "{\"x\": NaN, \"y\": -Infinity}"},
    };
    for (size_t i = 0; i < sizeof py_args / sizeof py_args[0]; i++) {
        char text[128];
        snprintf(text, sizeof text, "<tool_call>{\"name\": \"f\", \"arguments\": %s}</tool_call>",
                 py_args[i][0]);
        ck_assert_int_eq(tok_parse_tool_calls(text, &calls, &content), 1);
        ck_assert_str_eq(calls[0].arguments, py_args[i][1]);
        tok_tool_call_free(&calls[0]);
        free(calls);
    }
}
END_TEST

/* ---- CLI -------------------------------------------------------------------------- */

START_TEST(test_cli_tokenize) {
    const char *vocab = tu_data_path("qwen3-vocab.gguf");
    char dir[] = "/tmp/tpi_tok_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char in_path[256], cmd[2048];
    snprintf(in_path, sizeof in_path, "%s/in.jsonl", dir);
    FILE *f = fopen(in_path, "w");
    fputs("{\"text\": \"Hello world\"}\n"
          "{\"text\": broken\n"
          "{\"text\": \"<|im_start|>user\\nhi<|im_end|>\"}\n"
          "{\"nottext\": 1}\n",
          f);
    fclose(f);

    int status = 0;
    snprintf(cmd, sizeof cmd, "'%s' tokenize -m '%s' --jsonl '%s'", tu_binary(), vocab, in_path);
    char *out = tu_run_capture(cmd, &status);
    const char *want = "{\"ids\":[9707,1879]}\n"
                       "{\"error\":\"line 2: not valid JSON\"}\n"
                       "{\"ids\":[151644,872,198,6023,151645]}\n"
                       "{\"error\":\"line 4: no \\\"text\\\" string\"}\n";
    ck_assert_msg(strcmp(out, want) == 0, "got:\n%s\nwant:\n%s", out, want);
    ck_assert_int_eq(status, 1);
    free(out);

    snprintf(cmd, sizeof cmd, "'%s' tokenize -m '%s' --text 'Hello world'", tu_binary(), vocab);
    out = tu_run_capture(cmd, &status);
    ck_assert_str_eq(out, "[9707,1879]\n");
    ck_assert_int_eq(status, 0);
    free(out);

    snprintf(cmd, sizeof cmd, "'%s' tokenize -m '%s' --no-special --text '<|im_end|>'", tu_binary(),
             vocab);
    out = tu_run_capture(cmd, &status);
    ck_assert_int_eq(status, 0);
    ck_assert_msg(strstr(out, "151645") == NULL, "got %s", out);
    free(out);

    // llama-tokenize's forms: escapes processed unless --no-escape (198 is "\n"), -f and
    // --stdin, its --ids and --show-count, and its default "id -> 'piece'" view.
    static const char *forms[][2] = {
        {"-p 'a\\nb'", "[64,198,65]\n"},
        {"-p 'a\\nb' --no-escape", "[64,1699,65]\n"},
        {"--stdin --ids --show-count < '%s/hw.txt'", "[9707, 1879]\nTotal number of tokens: 2\n"},
        {"-f '%s/hw.txt' --pieces", "  9707 -> 'Hello'\n  1879 -> ' world'\n"},
    };
    char hw[300];
    snprintf(hw, sizeof hw, "%s/hw.txt", dir);
    f = fopen(hw, "w");
    fputs("Hello world", f);
    fclose(f);
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        char opts[600];
        snprintf(opts, sizeof opts, forms[i][0], dir);
        snprintf(cmd, sizeof cmd, "'%s' tokenize -m '%s' %s", tu_binary(), vocab, opts);
        out = tu_run_capture(cmd, &status);
        ck_assert_msg(status == 0 && !strcmp(out, forms[i][1]), "%s: exit %d, got '%s' want '%s'",
                      opts, status, out, forms[i][1]);
        free(out);
    }
    unlink(hw);
    // a \u0000 in a --jsonl text is that line's error (the text would end there); two
    // inputs at once are a usage error
    snprintf(cmd, sizeof cmd, "printf '{\"text\": \"a\\\\u0000b\"}\\n' | '%s' tokenize -m '%s' "
             "--jsonl - 2>/dev/null", tu_binary(), vocab);
    out = tu_run_capture(cmd, &status);
    ck_assert_msg(status == 1 && strstr(out, "line 1: the text holds \\\\u0000"), "NUL: %s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' tokenize -m '%s' -p a --stdin 2>/dev/null", tu_binary(), vocab);
    out = tu_run_capture(cmd, &status);
    ck_assert_int_eq(status, 2);
    free(out);

    snprintf(cmd, sizeof cmd, "'%s' tokenize -m '%s/nope.gguf' --text x 2>/dev/null", tu_binary(),
             dir);
    out = tu_run_capture(cmd, &status);
    ck_assert_int_eq(status, 1);
    ck_assert_str_eq(out, "");
    free(out);

    unlink(in_path);
    rmdir(dir);
}
END_TEST

int main(void) {
    Suite *s = suite_create("tokenizer");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
#ifdef TOK_TEST_CLI
    if (!tu_data_or_skip("qwen3-vocab.gguf")) return TU_SKIP;
    if (access(tu_binary(), X_OK) != 0) {
        fprintf(stderr, "SKIP: %s not built\n", tu_binary());
        return TU_SKIP;
    }
    tcase_add_test(tc, test_cli_tokenize);
    /* the library tests run in the other build of this file */
    const TTest *lib_tests[] = {test_qwen3_cases,
                                test_mini2048_cases,
                                test_vocab_queries,
                                test_parse_special_off,
                                test_invalid_utf8,
                                test_long_word,
                                test_whitespace_edges,
                                test_stream_decode,
                                test_stream_replacement,
                                test_stream_all_cases,
                                test_chatml,
                                test_from_arrays_and_errors,
                                test_chat_templates,
                                test_json_py};
    (void)lib_tests;
#else
    (void)test_cli_tokenize;
    const char *vocab = tu_data_or_skip("qwen3-vocab.gguf");
    if (!vocab) return TU_SKIP;
    double t0 = tpi_time_s();
    g_qwen3 = load_vocab(vocab);
    if (!g_qwen3) return 1;
    fprintf(stderr, "loaded %s in %.3f s\n", vocab, tpi_time_s() - t0);
    tcase_add_test(tc, test_qwen3_cases);
    tcase_add_test(tc, test_mini2048_cases);
    tcase_add_test(tc, test_vocab_queries);
    tcase_add_test(tc, test_parse_special_off);
    tcase_add_test(tc, test_invalid_utf8);
    tcase_add_test(tc, test_long_word);
    tcase_add_test(tc, test_whitespace_edges);
    tcase_add_test(tc, test_stream_decode);
    tcase_add_test(tc, test_stream_replacement);
    tcase_add_test(tc, test_stream_all_cases);
    tcase_add_test(tc, test_chatml);
    tcase_add_test(tc, test_from_arrays_and_errors);
    tcase_add_test(tc, test_chat_templates);
    tcase_add_test(tc, test_json_py);
#endif
    suite_add_tcase(s, tc);
    int rc = tu_run_suite(s);
    tok_free(&g_qwen3);
    return rc;
}
