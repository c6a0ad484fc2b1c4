/*
 * cmd_run.c — `tpinfer run`: generate a completion of one prompt (-p TEXT or
 * --prompt-ids) on every rank of the grid; world rank 0 streams the text to
 * stdout, or prints one JSON line with --json. The batch prompt-file mode (-f)
 * plugs in beside run_single(): the options, model and tokenizer are shared.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_common.h"
#include "cmd_batch.h"
#include "model/generate.h"
#include "sched/requests.h"
#include "text/tokenizer.h"

#define MAX_STOP 16
#define MAX_BIAS 256 /* --logit-bias options */

struct run_opts {
    struct cli_common c;
    char *prompt;           /* -p (argv's, unescaped in place) */
    const char *prompt_ids; /* --prompt-ids */
    const char *system;     /* --system */
    bool chat, json;
    int enable_thinking;    /* --chat-template-kwargs (-1: unset) */
    const char *chat_kwargs;
    struct gen_params gp;
    unsigned sp_set; /* the sampling options given (enum sampler_field) */
    char *stop_arg[MAX_STOP]; /* --stop (argv's, unescaped in place) */
    const char *stop[MAX_STOP];
    bool no_escape;         /* --no-escape: -p and --stop as given */
    int32_t bias_ids[MAX_BIAS];
    float bias_vals[MAX_BIAS];
};

static void usage(FILE *f) {
    fprintf(f,
            "usage: tpinfer run -m FILE (-p TEXT | --prompt-ids 1,2,3) [options]\n"
            "  -p, --prompt TEXT      prompt (special tokens such as <|im_start|> are parsed;\n"
            "                         \\n \\t \\\\ ... escapes processed, as llama.cpp does)\n"
            "  --no-escape            take -p and --stop as given (no escapes)\n"
            "  --prompt-ids LIST      prompt as comma-separated token ids\n"
            "  --chat                 wrap the prompt as a user message in the chat template\n"
            "  --system TEXT          system message for --chat\n"
            "  --chat-template-kwargs JSON   for --chat, e.g. '{\"enable_thinking\": false}'\n"
            "  -n, --n-predict N      most tokens to generate (128; -1: as many as the\n"
            "                         context holds)\n"
            "  --stop TEXT            stop before this text (repeatable)\n"
            "  --logprobs K           top-K logprobs of each generated token (with --json,\n"
            "                         and each token's own as \"token_logprobs\")\n"
            "  --prompt-logprobs K    top-K logprobs after each prompt token\n"
            "  --logit-bias ID+B|ID-B add B to token ID's logit (repeatable: the same ID's\n"
            "                         add up; ID-inf: never)\n"
            "  --ignore-eos           never sample the end of generation: run to -n\n"
            "  --json                 one JSON line on stdout instead of streamed text\n");
    cli_sampling_usage(f);
    cli_common_usage(f, true);
    fprintf(f, "\nusage: tpinfer run -m FILE -f PROMPTS [-o RESULTS] [options]\n"
               "A file of requests through the continuous-batching engine. Its own options\n"
               "follow; the sampling options (--temp ... --repeat-last-n) and the model and\n"
               "parallel ones above apply as well, the sampling ones as defaults for requests\n"
               "that do not set their own. --stop, --logit-bias, --ignore-eos and --system are\n"
               "a request line's fields instead (\"stop\", \"logit_bias\", ...):\n");
    cmd_run_batch_options(f);
}

static int parse_count(const char *opt, const char *s, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || end == s || v < 0 || v > (1 << 24)) {
        fprintf(stderr, "tpinfer run: %s expects a count >= 0, got '%s'\n", opt, s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* --logit-bias ID+B / ID-B (llama.cpp's form): B finite, or inf after '-' (never sampled);
 * an ID given again adds B to its bias, as llama.cpp's list of entries does. 0, or -1
 * after printing why. */
static int parse_bias(struct run_opts *o, const char *s) {
    char *end;
    errno = 0;
    const long id = strtol(s, &end, 10);
    const char sign = end != s ? *end : 0;
    const char *num = end + (sign ? 1 : 0);
    float b = 0;
    bool ok = !errno && (sign == '+' || sign == '-') && id >= 0 && id <= INT32_MAX && *num;
    if (ok) {
        b = strtof(num, &end);
        ok = !*end && end != num && *num != '+' && *num != '-' &&
             (isfinite(b) || (isinf(b) && sign == '-'));
        if (sign == '-') b = -b;
    }
    if (!ok) {
        fprintf(stderr,
                "tpinfer run: --logit-bias expects ID+BIAS or ID-BIAS (e.g. 15043+1.5, "
                "151645-inf), got '%s'\n",
                s);
        return -1;
    }
    for (int i = 0; i < o->gp.n_bias; i++)
        if (o->bias_ids[i] == id) { // llama.cpp applies each entry: a token given again adds
            o->bias_vals[i] += b;
            return 0;
        }
    if (o->gp.n_bias == MAX_BIAS) {
        fprintf(stderr, "tpinfer run: at most %d tokens with --logit-bias\n", MAX_BIAS);
        return -1;
    }
    o->bias_ids[o->gp.n_bias] = (int32_t)id;
    o->bias_vals[o->gp.n_bias++] = b;
    return 0;
}

/* 0 on success, 2 on a usage error (printed), -1 for --help. */
static int parse_args(struct run_opts *o, int argc, char **argv) {
    cli_common_init(&o->c);
    sampler_params_default(&o->gp.sp);
    o->gp.n_predict = 128;
    o->enable_thinking = -1;
    o->gp.stop = o->stop;
    o->gp.bias_ids = o->bias_ids;
    o->gp.bias_vals = o->bias_vals;
    for (int i = 1; i < argc; i++) {
        int r = cli_common_parse(&o->c, argc, argv, &i, "run");
        if (!r) r = cli_sampling_parse(&o->gp.sp, &o->sp_set, argc, argv, &i, "run");
        if (r < 0) return 2;
        if (r > 0) continue;
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return -1;
        if (!strcmp(a, "--chat")) {
            o->chat = true;
            continue;
        }
        if (!strcmp(a, "--json")) {
            o->json = true;
            continue;
        }
        if (!strcmp(a, "--no-escape") || !strcmp(a, "-e") || !strcmp(a, "--escape")) {
            o->no_escape = !strcmp(a, "--no-escape");
            continue;
        }
        if (!strcmp(a, "--ignore-eos")) {
            o->gp.ignore_eos = true;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "tpinfer run: unknown option or missing value: %s\n", a);
            return 2;
        }
        char *v = argv[++i];
        int bad = 0;
        if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) o->prompt = v;
        else if (!strcmp(a, "--prompt-ids")) o->prompt_ids = v;
        else if (!strcmp(a, "--system")) o->system = v;
        else if (!strcmp(a, "--chat-template-kwargs")) {
            struct tpi_error e;
            o->chat_kwargs = v;
            if (req_parse_chat_kwargs(v, &o->enable_thinking, &e)) {
                fprintf(stderr, "tpinfer run: --chat-template-kwargs: %s, got '%s'\n", e.msg, v);
                return 2;
            }
        }
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            if (!strcmp(v, "-1")) o->gp.n_predict = -1; // llama.cpp's: as many as fit
            else bad = parse_count(a, v, &o->gp.n_predict);
        }
        else if (!strcmp(a, "--logprobs")) bad = parse_count(a, v, &o->gp.n_logprobs);
        else if (!strcmp(a, "--prompt-logprobs")) bad = parse_count(a, v, &o->gp.n_prompt_logprobs);
        else if (!strcmp(a, "--logit-bias"))
            bad = parse_bias(o, v);
        else if (!strcmp(a, "--stop")) {
            if (o->gp.n_stop == MAX_STOP) {
                fprintf(stderr, "tpinfer run: at most %d --stop strings\n", MAX_STOP);
                return 2;
            }
            o->stop_arg[o->gp.n_stop] = v;
            o->stop[o->gp.n_stop++] = v;
        } else {
            fprintf(stderr, "tpinfer run: unknown option %s (tpinfer run --help)\n", a);
            return 2;
        }
        if (bad) return 2;
    }
    if (!o->no_escape) { // llama.cpp's default --escape
        if (o->prompt) cli_unescape(o->prompt);
        for (int k = 0; k < o->gp.n_stop; k++) cli_unescape(o->stop_arg[k]);
    }
    if (!!o->prompt + !!o->prompt_ids != 1) {
        fprintf(stderr, "tpinfer run: give exactly one of -p TEXT or --prompt-ids LIST\n");
        return 2;
    }
    if ((o->system || o->chat_kwargs) && !o->chat) {
        fprintf(stderr, "tpinfer run: %s applies to --chat only: add --chat\n",
                o->system ? "--system" : "--chat-template-kwargs");
        return 2;
    }
    if (o->chat && !o->prompt) {
        fprintf(stderr, "tpinfer run: --chat needs a text prompt (-p)\n");
        return 2;
    }
    if (!o->c.model) {
        fprintf(stderr, "tpinfer run: no model given (-m FILE)\n");
        return 2;
    }
    return 0;
}

/* The prompt's token ids: --prompt-ids as given; text tokenized as llama.cpp does
 * (special tokens parsed, BOS only when the vocabulary adds it), after the chat
 * template with --chat. */
static int prompt_tokens(const struct run_opts *o, const struct tokenizer *tok, int32_t **ids,
                         int *n, struct tpi_error *err) {
    if (o->prompt_ids) {
        if (cli_parse_ids(o->prompt_ids, ids, n))
            return tpi_err(err, TPI_ERR_INVALID, "--prompt-ids: expected ids like 1,2,3, got '%s'",
                           o->prompt_ids);
        for (int i = 0; i < *n; i++)
            if ((*ids)[i] >= tok_n_vocab(tok))
                return tpi_err(err, TPI_ERR_INVALID, "--prompt-ids: id %d is outside the vocabulary of %d",
                               (*ids)[i], tok_n_vocab(tok));
        return TPI_OK;
    }
    if (!o->chat) return tok_encode(tok, o->prompt, strlen(o->prompt), true, ids, n, err);
    struct tok_message msgs[2];
    int n_msgs = 0;
    if (o->system) msgs[n_msgs++] = (struct tok_message){.role = "system", .content = o->system};
    msgs[n_msgs++] = (struct tok_message){.role = "user", .content = o->prompt};
    const struct tok_chat_opts opts = {.add_generation_prompt = true,
                                       .enable_thinking = o->enable_thinking};
    char *text;
    size_t n_text;
    int rc = tok_apply_chat(tok, msgs, n_msgs, &opts, &text, &n_text, err);
    if (rc) return rc;
    rc = tok_encode(tok, text, n_text, true, ids, n, err);
    free(text);
    return rc;
}

static void stream_text(const char *bytes, size_t n, void *user) {
    (void)user;
    fwrite(bytes, 1, n, stdout);
    fflush(stdout);
}

static cJSON *ids_json(const int32_t *ids, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    return a;
}

/* [[[id, logprob], ...K], ...rows] */
static cJSON *logprobs_json(const int32_t *ids, const float *vals, int n_rows, int k) {
    cJSON *a = cJSON_CreateArray();
    for (int r = 0; r < n_rows; r++) {
        cJSON *row = cJSON_CreateArray();
        for (int j = 0; j < k; j++) {
            cJSON *pair = cJSON_CreateArray();
            cJSON_AddItemToArray(pair, cJSON_CreateNumber(ids[(size_t)r * k + j]));
            cJSON_AddItemToArray(pair, cJSON_CreateNumber(vals[(size_t)r * k + j]));
            cJSON_AddItemToArray(row, pair);
        }
        cJSON_AddItemToArray(a, row);
    }
    return a;
}

static void print_json(const struct gen_result *g, const int32_t *prompt, int n_prompt) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "text", tpi_json_text(g->text, g->n_text));
    cJSON_AddItemToObject(o, "tokens", ids_json(g->tokens, g->n_tokens));
    cJSON_AddItemToObject(o, "prompt_tokens", ids_json(prompt, n_prompt));
    cJSON_AddStringToObject(o, "finish_reason", g->finish_reason);
    if (g->lp_k > 0) {
        cJSON_AddItemToObject(o, "logprobs", logprobs_json(g->lp_ids, g->lp_vals, g->n_tokens, g->lp_k));
        // Each generated token's own, in or out of its top K (OpenAI's token_logprobs).
        cJSON *tl = cJSON_CreateArray();
        for (int j = 0; j < g->n_tokens; j++)
            cJSON_AddItemToArray(tl, cJSON_CreateNumber(g->lp_chosen[j]));
        cJSON_AddItemToObject(o, "token_logprobs", tl);
    }
    if (g->plp_k > 0)
        cJSON_AddItemToObject(o, "prompt_logprobs",
                              logprobs_json(g->plp_ids, g->plp_vals, g->n_prompt, g->plp_k));
    char *s = cJSON_PrintUnformatted(o);
    if (s) printf("%s\n", s);
    fflush(stdout);
    free(s);
    cJSON_Delete(o);
}

/* Rank 0's request must be every rank's: each rank tokenizes its own command line and
 * runs the same steps, so a different prompt, -n, --stop or --logprobs on one rank
 * would compute garbage or wait for a step that never comes. */
static int check_same_request(struct cli_run *r, const struct run_opts *o, const int32_t *ids,
                              int n_ids, struct tpi_error *err) {
    const struct gen_params *gp = &o->gp;
    uint64_t h_stop = TPI_FNV_INIT, h_bias = TPI_FNV_INIT, h_samp = TPI_FNV_INIT;
    for (int i = 0; i < gp->n_stop; i++) // the terminating NUL keeps "ab","c" from "a","bc"
        h_stop = tpi_fnv1a(h_stop, gp->stop[i], strlen(gp->stop[i]) + 1);
    h_bias = tpi_fnv1a(h_bias, gp->bias_ids, sizeof *gp->bias_ids * (size_t)gp->n_bias);
    h_bias = tpi_fnv1a(h_bias, gp->bias_vals, sizeof *gp->bias_vals * (size_t)gp->n_bias);
    const struct sampler_params *sp = &gp->sp;
    const float fs[] = {sp->temp, sp->top_p, sp->min_p, sp->repeat_penalty,
                        sp->presence_penalty, sp->frequency_penalty};
    const int32_t is[] = {sp->top_k, sp->repeat_last_n};
    h_samp = tpi_fnv1a(tpi_fnv1a(h_samp, fs, sizeof fs), is, sizeof is);
    const struct grid_same vals[] = {
        {"prompt length in tokens", (uint64_t)n_ids, 0},
        {"prompt (its tokens after -p/--prompt-ids, --chat, --system)",
         tpi_fnv1a(TPI_FNV_INIT, ids, sizeof *ids * (size_t)n_ids), 1},
        {"-n", (uint64_t)gp->n_predict, 0},
        {"--logprobs", (uint64_t)gp->n_logprobs, 0},
        {"--prompt-logprobs", (uint64_t)gp->n_prompt_logprobs, 0},
        {"--stop strings", h_stop ^ (uint64_t)gp->n_stop, 1},
        {"--logit-bias", h_bias ^ (uint64_t)gp->n_bias, 1},
        {"--ignore-eos", (uint64_t)gp->ignore_eos, 0},
        {"sampling options (--temp, --top-k, --top-p, --min-p, the penalties)", h_samp, 1},
    };
    return grid_check_same(&r->grid, vals, (int)(sizeof vals / sizeof vals[0]), err);
}

/* One prompt: tokenize, check it fits, generate, print on rank 0. */
static int run_single(struct cli_run *r, struct run_opts *o) {
    struct tpi_error err = {0};
    int32_t *ids = NULL;
    int n_ids = 0;
    cli_sampling_from_model(&o->gp.sp, o->sp_set, r->model, cli_rank(r) == 0, "run");
    // Tokenization is deterministic, so every rank fails (or not) alike.
    int rc = prompt_tokens(o, r->tok, &ids, &n_ids, &err);
    if (!rc && o->gp.n_predict < 0) o->gp.n_predict = TPI_MAX(0, r->model->n_ctx - n_ids);
    if (!rc && n_ids + o->gp.n_predict > r->model->n_ctx)
        rc = tpi_err(&err, TPI_ERR_INVALID,
                     "prompt of %d tokens + %d to generate exceeds the context of %d positions "
                     "(raise -c/--ctx-size or lower -n)",
                     n_ids, o->gp.n_predict, r->model->n_ctx);
    if ((rc = grid_agree(&r->grid, rc, &err))) {
        free(ids);
        return cli_fail_all(r, "run", &err);
    }
    if ((rc = check_same_request(r, o, ids, n_ids, &err))) {
        free(ids);
        return rc == TPI_ERR_INVALID ? cli_fail_all(r, "run", &err) : cli_fail_rank(r, "run", &err);
    }
    struct gen_result g;
    rc = generate_one(r->model, r->tok, ids, n_ids, &o->gp, o->json ? NULL : stream_text, NULL, &g,
                      &err);
    if (rc) {
        free(ids);
        return cli_fail_rank(r, "run", &err);
    }
    if (cli_rank(r) == 0) {
        if (o->json) print_json(&g, ids, n_ids);
        else {
            printf("\n");
            fflush(stdout);
        }
        TPI_LOGI("prompt %d tokens in %.3f s (%.1f t/s), generated %d tokens in %.3f s (%.1f t/s), "
                 "finish: %s, seed %llu",
                 n_ids, g.t_prompt_s, g.t_prompt_s > 0 ? n_ids / g.t_prompt_s : 0.0, g.n_tokens,
                 g.t_gen_s, g.t_gen_s > 0 ? g.n_tokens / g.t_gen_s : 0.0, g.finish_reason,
                 (unsigned long long)o->c.seed);
    }
    gen_result_free(&g);
    free(ids);
    return cli_finish(r, 0);
}

int cmd_run(int argc, char **argv) {
    // A prompt file means the batch engine (continuous batching, result records):
    // it owns its own options (--parallel, -o, --resume, ...).
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-f") || !strcmp(argv[i], "--file")) return cmd_run_batch(argc, argv);
    struct run_opts o;
    memset(&o, 0, sizeof o);
    int rc = parse_args(&o, argc, argv);
    if (rc < 0) {
        usage(stdout);
        return 0;
    }
    if (rc) return 2;
    struct cli_run r;
    if (cli_start(&r, &o.c, &argc, &argv, "run")) return 1;
    o.gp.sp.seed = o.c.seed;
    return run_single(&r, &o);
}
