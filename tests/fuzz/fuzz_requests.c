/*
 * fuzz_requests.c — libFuzzer target for the batch command's files: each input is
 * read as a prompt file (ours, OpenAI batch lines or plain text) with the seed
 * model's tokenizer, then as an output file for --resume, and every request gets a
 * record written (error records, and result records whose text is the prompt's
 * tokens decoded, so odd bytes reach the JSON writer). Checked beyond "no crash":
 * a request either carries an error that names its line or a prompt that fits the
 * context with ids inside the vocabulary and 1..REQ_MAX_CHOICES choices, the id is
 * one JSON string or number, what records quote from the line (id, "model", the error)
 * is UTF-8, and resume marks no more than there are.
 * The first input byte picks the options (--chat, --logprobs, ordered output, the
 * context: 4096 tokens where its bit 6 is set, e.g. '@', else 64). A chat line
 * whose tools the model may call gets a first choice of two tool calls (the record's
 * tool_calls), its others the prompt's text through the same parser.
 * Build: CC=clang cmake -DTPI_FUZZ=ON (see the end of CMakeLists.txt).
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz_memfile.h"
#include "gguf.h"
#include "sched/output.h"
#include "sched/requests.h"
#include "text/tokenizer.h"

#ifndef TPI_FUZZ_SEED_MODEL
#error "TPI_FUZZ_SEED_MODEL: the GGUF whose tokenizer reads the prompts (CMakeLists.txt)"
#endif

static struct tokenizer *g_tok;

/* The tokenizer of the seed model, loaded once. */
static void load_tokenizer(void) {
    struct gguf_file *f = NULL;
    struct tpi_error err = {0};
    if (gguf_open(TPI_FUZZ_SEED_MODEL, &f, &err) != TPI_OK ||
        tok_load(f, &g_tok, &err) != TPI_OK) {
        fprintf(stderr, "fuzz_requests: %s\n", err.msg);
        abort();
    }
    gguf_close(&f);
}

static void check_requests(const struct batch_input *in, const struct req_defaults *d) {
    for (int i = 0; i < in->n_reqs; i++) {
        const struct batch_req *r = &in->reqs[i];
        if (r->line < 1) abort();
        // what a record quotes from the line is UTF-8, and the id is one JSON value
        if (r->id_json) {
            cJSON *v = cJSON_Parse(r->id_json);
            const bool ok = cJSON_IsString(v) || cJSON_IsNumber(v);
            cJSON_Delete(v);
            if (!ok || tpi_utf8_bad(r->id_json, strlen(r->id_json)) != strlen(r->id_json)) abort();
        }
        if (r->error && tpi_utf8_bad(r->error, strlen(r->error)) != strlen(r->error)) abort();
        if (r->model_name && tpi_utf8_bad(r->model_name, strlen(r->model_name)) !=
                                 strlen(r->model_name))
            abort();
        if (r->error) {
            char want[32];
            snprintf(want, sizeof want, "line %ld", r->line);
            if (strncmp(r->error, want, strlen(want)) != 0) abort(); /* must name its line */
            continue;
        }
        if (r->n_prompt < 1 || r->n_prompt >= d->n_ctx || !r->id_json) abort();
        if (r->n_choices < 1 || r->n_choices > REQ_MAX_CHOICES) abort();
        for (int k = 0; k < r->n_prompt; k++)
            if (r->prompt[k] < 0 || r->prompt[k] >= d->n_vocab) abort();
        for (int k = 0; k < r->n_stop; k++)
            if (!r->stop[k]) abort();
        if (r->n_logprobs < 0 || r->n_top_out < 0 || (r->want_logprobs && r->n_logprobs < 1))
            abort();
    }
}

/* Write every request's record to /dev/null: errors first, then a result for each
 * runnable request, its "generated" tokens being its prompt. */
static void write_records(struct batch_input *in, bool ordered) {
    struct batch_out out;
    memset(&out, 0, sizeof out);
    struct tpi_error err = {0};
    if (batch_out_open(&out, "/dev/null", false, ordered, false, in, g_tok, "seed", &err) !=
        TPI_OK)
        abort();
    if (batch_out_errors(&out, &err) != TPI_OK) abort();
    for (int i = 0; i < in->n_reqs; i++) {
        const struct batch_req *r = &in->reqs[i];
        if (r->error || r->done) continue;
        char *text = NULL;
        size_t n_text = 0;
        if (tok_decode(g_tok, r->prompt, r->n_prompt, &text, &n_text, &err) != TPI_OK) abort();
        int k = r->want_logprobs ? r->n_logprobs : 0;
        int32_t *ids = calloc((size_t)r->n_prompt * (k ? k : 1), sizeof *ids);
        float *vals = calloc((size_t)r->n_prompt * (k ? k : 1), sizeof *vals);
        float *chosen = calloc((size_t)r->n_prompt, sizeof *chosen);
        if (!ids || !vals || !chosen) abort();
        for (int t = 0; t < r->n_prompt; t++) {
            chosen[t] = -0.5f * (float)t;
            for (int j = 0; j < k; j++) {
                ids[t * k + j] = (r->prompt[t] + j) % tok_n_vocab(g_tok);
                vals[t * k + j] = -(float)j;
            }
        }
        // A line whose tools the model may call: the first choice "generates" two calls
        // after a line of text (the record's tool_calls), the others the prompt, whose
        // tools block has the format's own <tool_call> example (the text kept whole).
        static const char calls[] = "Hi.\n<tool_call>\n{\"name\": \"f\", \"arguments\": "
                                    "{\"x\": 1.50, \"y\": [\"\\u00e9\"]}}\n</tool_call>\n"
                                    "<tool_call>{\"name\": \"g\", \"arguments\": \"s\"}";
        // Choices finish out of order: the last first.
        for (int c = r->n_choices - 1; c >= 0; c--) {
            const bool call = r->tools == REQ_TOOLS_AUTO && c == 0;
            struct sched_result res = {.tokens = r->prompt,
                                       .n_tokens = r->n_prompt - c % 2,
                                       .text = call ? calls : text,
                                       .n_text = call ? sizeof calls - 1 : n_text,
                                       .finish_reason = (i + c) % 2 ? "stop" : "length",
                                       .n_prompt = r->n_prompt,
                                       .lp_k = k,
                                       .lp_ids = ids,
                                       .lp_vals = vals,
                                       .lp_chosen = chosen,
                                       .t_first_s = 0.25,
                                       .t_decode_s = 1.0};
            if (batch_out_result(&out, i, c, &res, &err) != TPI_OK) abort();
        }
        free(text);
        free(ids);
        free(vals);
        free(chosen);
    }
    if (batch_out_close(&out, &err) != TPI_OK) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int in_fd = -1, out_fd = -1;
    if (!g_tok) load_tokenizer();
    if (size < 1) return 0;
    const uint8_t flags = data[0];
    data++;
    size--;
    struct req_defaults d;
    memset(&d, 0, sizeof d);
    d.max_tokens = 16;
    sampler_params_default(&d.sp);
    d.seed = 7;
    d.n_logprobs = flags & 1 ? 3 : 0;
    d.chat = flags & 2;
    d.enable_thinking = flags & 8 ? flags & 1 : -1; // the seeds' digits '8' and '9'

    d.n_ctx = flags & 64 ? 4096 : 64; // '@' and letters: room for tools blocks
    d.n_vocab = tok_n_vocab(g_tok);
    char in_path[64], out_path[64];
    fuzz_memfile(&in_fd, in_path, "fuzz-prompts.jsonl", data, size);
    struct batch_input in;
    memset(&in, 0, sizeof in);
    struct tpi_error err = {0};
    int rc = batch_input_load(in_path, g_tok, &d, &in, &err);
    if (rc != TPI_OK) {
        if (err.msg[0] == '\0') abort();
        return 0;
    }
    check_requests(&in, &d);
    /* The same bytes as last run's output: resume must not mark more than exist. */
    fuzz_memfile(&out_fd, out_path, "fuzz-out.jsonl", data, size);
    int n_done = 0;
    tpi_err_clear(&err);
    rc = batch_resume_scan(out_path, &in, &n_done, &err);
    if (rc != TPI_OK && err.msg[0] == '\0') abort();
    if (n_done < 0 || n_done > in.n_reqs) abort();
    write_records(&in, flags & 4);
    batch_input_free(&in);
    return 0;
}
