/*
 * requests.h — the input of a batch run: a file (or stdin) of requests, one a
 * line, parsed and tokenized on rank 0 before the run starts.
 *
 * Line formats, mixed freely in one JSONL file:
 *   ours:    {"id", "prompt": "text" | [ids]} or {"id", "messages": [...]}, with
 *            optional max_tokens, temperature, top_p, top_k, min_p, seed, stop
 *            (string or list), logprobs (int K), n (completions to sample);
 *   OpenAI:  {"custom_id", "method": "POST", "url": "/v1/chat/completions" |
 *            "/v1/completions", "body": {...}} (the batch format vLLM's run-batch
 *            reads);
 * presence_penalty and frequency_penalty too, and "echo" on /v1/completions; chats
 * take "chat_template_kwargs" ({"enable_thinking": bool}), "add_generation_prompt" and
 * "continue_final_message", and their messages "reasoning_content"; OpenAI's and vLLM's fields that change
 * results but are not implemented (echo elsewhere, suffix, best_of other than n, tools
 * and tool calls, response_format and guided decoding, ...) refuse the line unless they
 * hold their neutral value; logit_bias and vLLM's stop_token_ids, ignore_eos,
 * include_stop_str_in_output and min_tokens are taken;
 * and plain text (one prompt per line) when the first non-blank line does not
 * start with '{'. Blank lines are skipped but still counted: `line` numbers
 * are 1-based lines of the file. A line that cannot run keeps its error
 * message ("line N: ...") and the others go on.
 */
#ifndef SCHED_REQUESTS_H
#define SCHED_REQUESTS_H

#include <stdbool.h>
#include <stdint.h>

#include "model/sampling.h"
#include "tpi.h"

struct tokenizer;

enum req_format {
    REQ_OURS = 0,           /* our JSON shape (also: malformed lines) */
    REQ_PLAIN = 1,          /* a plain-text line; records are ours */
    REQ_OAI_CHAT = 2,       /* OpenAI batch, /v1/chat/completions */
    REQ_OAI_COMPLETION = 3, /* OpenAI batch, /v1/completions */
};

/* Run-wide defaults for what a line leaves out (the command-line options). */
struct req_defaults {
    int max_tokens;            /* -n; <= 0: until the context is full */
    struct sampler_params sp;  /* --temp, --top-k, --top-p, --min-p, --repeat-penalty */
    struct sampler_params sp_openai; /* the same for OpenAI lines: vLLM's defaults, with
                                        the sampling options the run gives */
    uint64_t seed;             /* --seed: a request without one uses seed + line */
    int n_logprobs;            /* --logprobs K for every request of ours (0: none) */
    bool chat;                 /* --chat: plain lines and "prompt" strings become user turns */
    int enable_thinking;       /* --chat-template-kwargs' enable_thinking (-1: unset) for
                                  the chats of lines that do not set their own */
    int n_ctx, n_vocab;        /* prompts must satisfy 1 <= n < n_ctx, ids < n_vocab */
};

/* Completions one request may ask for ("n"); a request's sequences are tagged
 * idx * REQ_MAX_CHOICES + choice. */
#define REQ_MAX_CHOICES 64

/* Most top-logprob alternatives a line may ask for (OpenAI's limit for top_logprobs). */
#define REQ_MAX_LOGPROBS 20

/* What an OpenAI chat line's tools do (vLLM's with its hermes tool parser, the one for
 * the Qwen family's <tool_call> blocks). */
enum req_tools {
    REQ_TOOLS_NONE = 0,   /* no tools */
    REQ_TOOLS_PROMPT = 1, /* "tool_choice": "none": the tools are in the prompt, the
                             output is text */
    REQ_TOOLS_AUTO = 2    /* "auto" (the default with tools): <tool_call> blocks in the
                             output become the message's tool_calls */
};

struct batch_req {
    long line;             /* 1-based line of the input */
    enum req_format fmt;
    bool oai;              /* an OpenAI-format line (records take vLLM's shape) */
    char *id_json;         /* "id" (ours) or "custom_id" (OpenAI) as req_id_text makes
                              it; the line number when absent */
    char *model_name;      /* OpenAI body "model" (NULL: absent) */
    int32_t *prompt;       /* (n_prompt) token ids */
    int n_prompt;
    int max_tokens;
    int n_choices;         /* completions to sample ("n", 1..REQ_MAX_CHOICES); choice c
                              samples with req_choice_seed(sp.seed, c) */
    struct sampler_params sp;
    int n_logprobs;        /* K the engine computes (>= 1 whenever want_logprobs) */
    bool want_logprobs;    /* the record carries logprobs */
    bool echo;             /* /v1/completions "echo": the text (and, with logprobs, the
                              logprobs) begin with the prompt's */
    bool echo_only;        /* echo with "max_tokens": 0 (vLLM's): one token is generated
                              and left out of the record, which holds the prompt alone */
    bool max_tokens_fit;   /* max_tokens is the line's own or its format's default, so
                              prompt + max_tokens past the context is the line's error
                              (vLLM's), not cut to fit as the run's -n is */
    bool ids_as_tokens;    /* vLLM's "return_tokens_as_token_ids": logprobs name tokens
                              "token_id:N" */
    int truncate_to;       /* vLLM's "truncate_prompt_tokens": the prompt's last k tokens
                              (0: whole) */
    int n_top_out;         /* top alternatives a record lists per token */
    char **stop;           /* (n_stop) NUL-terminated */
    int n_stop;
    int32_t *stop_ids;     /* (n_stop_ids) "stop_token_ids": end the sequence as EOG does */
    int n_stop_ids;
    bool ignore_eos;       /* "ignore_eos": EOG ids are ordinary tokens */
    bool keep_stop_string; /* "include_stop_str_in_output": the text keeps the stop string */
    int min_tokens;        /* "min_tokens": no end before this many (<= max_tokens) */
    int32_t *bias_ids;     /* (n_bias) "logit_bias": ids, each once, */
    float *bias_vals;      /* and their biases, clamped to [-100, 100] as vLLM clamps them */
    int n_bias;
    enum req_tools tools;  /* a chat line's "tools" and "tool_choice" */
    bool one_tool_call;    /* "parallel_tool_calls": false: only the first call is kept */
    char *error;           /* NULL, or why this line cannot run ("line N: ...") */
    bool done;             /* already in the output file (--resume) */
};

struct batch_input {
    struct batch_req *reqs; /* (n_reqs) in input order */
    int n_reqs;
    bool plain;             /* the file was read as plain text */
};

/* Read every request of `path` ("-" for stdin), parse it with the defaults and
 * tokenize it with `tok`. Per-line problems go into that request's `error`;
 * the return status is for the file itself (cannot open / read: TPI_ERR_IO
 * naming the path; OOM). Free with batch_input_free. */
int batch_input_load(const char *path, const struct tokenizer *tok, const struct req_defaults *d,
                     struct batch_input *in, struct tpi_error *err);

/* A request id as records carry it, from its JSON text [b, e): a string as cJSON prints
 * it, a number as the text spells it (so 12345678901234567890 and 0.30000000000000004 come
 * back unrounded); malloc'd, NULL for another value or when memory runs out. */
char *req_id_text(const char *b, const char *e);

/* Parse chat_template_kwargs given as JSON text (--chat-template-kwargs): an object whose
 * "enable_thinking", true or false, goes to *enable_thinking (left alone when absent);
 * other keys are ignored, as the Qwen templates read none. TPI_ERR_INVALID saying why. */
int req_parse_chat_kwargs(const char *json, int *enable_thinking, struct tpi_error *err);

/* The sampling seed of choice c of a request whose seed is `seed`: the seed itself
 * for choice 0 (so n = 1 samples as before), a hash of both for the others, so the
 * choices of one request and the requests of neighbouring lines stay apart. */
uint64_t req_choice_seed(uint64_t seed, int c);

/* Free what batch_input_load allocated; leaves *in zeroed. */
void batch_input_free(struct batch_input *in);

#endif /* SCHED_REQUESTS_H */
