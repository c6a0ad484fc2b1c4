/*
 * fuzz_model.c — libFuzzer target for what reads a GGUF past the reader: the
 * model config and its tensor checks, the tp/pp plans and weight counts, the
 * tokenizer and its chat template, and, when the file is small, a CPU load and a
 * three-token forward pass. Each input is a GGUF written to an in-memory file
 * (memfd) and opened by path like any model. Every refusal must come with a
 * message: an empty one aborts, like a crash. Seeds are tiny qwen2/qwen3 models
 * in tests/fuzz/seeds/ (tpinfer mkmodel, see README there). Build: CC=clang cmake
 * -DTPI_FUZZ=ON (see the end of CMakeLists.txt).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz_memfile.h"
#include "gguf.h"
#include "model/model.h"
#include "text/tokenizer.h"

static volatile uint64_t g_sink;

/* A refusal without a message is a bug of its own. */
static void check_refusal(int rc, const struct tpi_error *err) {
    if (rc != TPI_OK && err->msg[0] == '\0') abort();
}

static void tokenizer_pass(const struct gguf_file *f) {
    struct tokenizer *tok = NULL;
    struct tpi_error err = {0};
    int rc = tok_load(f, &tok, &err);
    check_refusal(rc, &err);
    if (rc != TPI_OK) return;
    static const char text[] = "<|im_start|>user\nHello, world! 123 \xc3\xa9t\xc3\xa9<|im_end|>";
    int32_t *ids = NULL;
    int n_ids = 0;
    tpi_err_clear(&err);
    rc = tok_encode(tok, text, sizeof text - 1, true, &ids, &n_ids, &err);
    check_refusal(rc, &err);
    if (rc == TPI_OK) {
        char *out = NULL;
        size_t n_out = 0;
        tpi_err_clear(&err);
        rc = tok_decode(tok, ids, n_ids, &out, &n_out, &err);
        check_refusal(rc, &err);
        g_sink += n_out;
        free(out);
    }
    free(ids);
    /* The chat template comes from the file: render with and without a system turn, and
     * a conversation with reasoning and tool turns with thinking off. */
    static const struct tok_message msgs[6] = {
        {.role = "system", .content = "Be brief."},
        {.role = "user", .content = "Hi"},
        {.role = "assistant", .content = "<think>\nhm</think>\n\nCalling."},
        {.role = "tool", .content = "{}"},
        {.role = "tool", .content = "<tool_response>"},
        {.role = "assistant", .content = "Done", .reasoning_content = "\nthought\n"}};
    static const int n_msgs[3] = {2, 1, 6};
    for (int k = 0; k < 3; k++) {
        char *chat = NULL;
        size_t n_chat = 0;
        tpi_err_clear(&err);
        const struct tok_chat_opts opts = {.add_generation_prompt = k != 1,
                                           .enable_thinking = k - 1};
        rc = tok_apply_chat(tok, msgs + (k == 1), n_msgs[k], &opts, &chat, &n_chat, &err);
        check_refusal(rc, &err);
        if (rc == TPI_OK && strlen(chat) != n_chat) abort();
        free(chat);
    }
    for (int32_t id = -1; id <= tok_n_vocab(tok); id++)
        g_sink += tok_piece(tok, id).len + tok_token_bytes(tok, id).len +
                  (uint64_t)tok_is_eog(tok, id);
    tok_free(&tok);
}

/* Plans and weight counts for every rank of a few grids; returns rank 0's bytes
 * under tp = pp = 1 (0 when that plan is refused). */
static size_t plan_pass(const struct gguf_file *f, const struct model_config *cfg) {
    static const int grids[][2] = {{1, 1}, {2, 1}, {1, 2}, {2, 2}, {4, 1}};
    size_t n_bytes_1 = 0;
    for (size_t g = 0; g < sizeof grids / sizeof grids[0]; g++)
        for (int tr = 0; tr < grids[g][0]; tr++)
            for (int ps = 0; ps < grids[g][1]; ps++) {
                struct model_plan plan;
                struct tpi_error err = {0};
                int rc = model_plan_make(&plan, cfg, grids[g][0], grids[g][1], tr, ps, NULL, 0,
                                         &err);
                check_refusal(rc, &err);
                if (rc != TPI_OK) continue;
                struct model_weights w;
                memset(&w, 0, sizeof w);
                tpi_err_clear(&err);
                rc = model_weights_count(f, cfg, &plan, &w, &err);
                check_refusal(rc, &err);
                if (rc == TPI_OK && g == 0) n_bytes_1 = w.n_bytes;
            }
    return n_bytes_1;
}

/* Load on the CPU backend and run three tokens; errors are fine, crashes are not. */
static void forward_pass(const char *path, int n_vocab) {
    struct model_params p = {.path = path, .backend = "cpu", .n_threads = 1, .n_ctx = 8,
                             .n_ubatch = 4, .quiet = true};
    struct model *m = NULL;
    struct tpi_error err = {0};
    int rc = model_load(&m, &p, NULL, &err);
    check_refusal(rc, &err);
    if (rc != TPI_OK) return;
    int32_t tok[3] = {0, n_vocab - 1, n_vocab / 2}, pos[3] = {0, 1, 2}, seq[3] = {0, 0, 0};
    int32_t rows[2] = {1, 2};
    float *logits = malloc(sizeof(float) * 2 * (size_t)n_vocab);
    if (!logits) abort();
    tpi_err_clear(&err);
    rc = model_forward(m, tok, pos, seq, 3, rows, 2, logits, &err);
    check_refusal(rc, &err);
    free(logits);
    model_free(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int fd = -1;
    static char path[64];
    fuzz_memfile(&fd, path, "fuzz-model.gguf", data, size);
    struct gguf_file *f = NULL;
    struct tpi_error err = {0};
    int rc = gguf_open(path, &f, &err);
    check_refusal(rc, &err);
    if (rc != TPI_OK) return 0;
    tokenizer_pass(f);
    struct model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    tpi_err_clear(&err);
    rc = model_config_from_gguf(&cfg, f, &err);
    check_refusal(rc, &err);
    size_t n_bytes = 0;
    if (rc == TPI_OK) {
        char line[256];
        model_config_describe(&cfg, line, sizeof line);
        g_sink += strlen(line);
        n_bytes = plan_pass(f, &cfg);
    }
    gguf_close(&f);
    /* The forward pass only for models that are small in every buffer it allocates. */
    if (n_bytes > 0 && n_bytes < (4u << 20) && cfg.n_layer <= 4 && cfg.n_embd <= 1024 &&
        cfg.n_ff <= 4096 && cfg.n_vocab <= 65536 && cfg.n_head <= 64)
        forward_pass(path, cfg.n_vocab);
    return 0;
}
