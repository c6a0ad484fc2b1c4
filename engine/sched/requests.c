/*
 * requests.c — see requests.h. Parsing is strict about types (a numeric
 * "prompt" is an error, not a prompt "42") so a typo in a big file shows up as
 * an error record for that line instead of a silently wrong completion.
 */
#include "sched/requests.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/json_py.h"
#include "text/tokenizer.h"

#define REQ_MAX_STOP 16     /* stop strings per request */
#define REQ_MAX_STOP_IDS 64 /* stop_token_ids per request */
#define REQ_MAX_BIAS 1024   /* logit_bias entries per request */

/* Record why line r cannot run: "line N: <msg>". Returns -1 for chaining. */
static int req_fail(struct batch_req *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int req_fail(struct batch_req *r, const char *fmt, ...) {
    if (r->error) return -1; // keep the first reason
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    // a record is UTF-8: a quoted piece of the line cut inside a character (%.32s) or
    // the cut at the buffer's end becomes U+FFFD
    size_t n_fix = 0;
    char *fixed = tpi_utf8_fix(msg, strlen(msg), &n_fix);
    if (!fixed) return -1;
    size_t n = n_fix + 32;
    r->error = malloc(n);
    if (r->error) snprintf(r->error, n, "line %ld: %s", r->line, fixed);
    free(fixed);
    return -1;
}

/* An integer-valued JSON number into *out within [lo, hi]; absent or null keeps *out. */
static int get_int(struct batch_req *r, const cJSON *o, const char *key, long long lo,
                   long long hi, long long *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) ||
        v->valuedouble < (double)lo || v->valuedouble > (double)hi)
        return req_fail(r, "\"%s\" must be an integer in [%lld, %lld]", key, lo, hi);
    *out = (long long)v->valuedouble;
    return 0;
}

static int get_float(struct batch_req *r, const cJSON *o, const char *key, double lo, double hi,
                     float *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi))
        return req_fail(r, "\"%s\" must be a number in [%g, %g]", key, lo, hi);
    *out = (float)v->valuedouble;
    return 0;
}

/* "stop": a string or a list of strings. */
static int get_stop(struct batch_req *r, const cJSON *o) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "stop");
    if (!v || cJSON_IsNull(v)) return 0;
    const cJSON *one[1] = {v};
    int n = cJSON_IsString(v) ? 1 : cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
    if (n < 0 || n > REQ_MAX_STOP)
        return req_fail(r, "\"stop\" must be a string or a list of at most %d strings",
                        REQ_MAX_STOP);
    r->stop = calloc((size_t)n + 1, sizeof *r->stop);
    if (!r->stop) return req_fail(r, "out of memory");
    const cJSON *it = cJSON_IsString(v) ? one[0] : v->child;
    for (int i = 0; i < n; i++, it = it->next) {
        if (!cJSON_IsString(it)) return req_fail(r, "\"stop\" entry %d is not a string", i);
        if (!it->valuestring[0]) // vLLM: "stop cannot contain an empty string."
            return req_fail(r, "\"stop\" entry %d is an empty string", i);
        if (!(r->stop[r->n_stop] = tpi_strdup(it->valuestring)))
            return req_fail(r, "out of memory");
        r->n_stop++;
    }
    return 0;
}

/* OpenAI fields that would change the result but are not implemented: present with
 * anything but their neutral value, the line is refused rather than run without them. */
static int refuse_unsupported(struct batch_req *r, const cJSON *o) {
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(o, "echo")) && !cJSON_IsNull(v) && !cJSON_IsFalse(v)) {
        if (r->fmt != REQ_OAI_COMPLETION || !cJSON_IsTrue(v))
            return req_fail(r, "\"echo\" must be true or false, and only /v1/completions "
                               "takes it");
        r->echo = true;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(o, "suffix")) && !cJSON_IsNull(v) &&
        !(cJSON_IsString(v) && v->valuestring[0] == '\0'))
        return req_fail(r, "\"suffix\" is not supported");
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(o, "n");
    if ((v = cJSON_GetObjectItemCaseSensitive(o, "best_of")) && !cJSON_IsNull(v) &&
        !(cJSON_IsNumber(v) && v->valuedouble == (cJSON_IsNumber(n) ? n->valuedouble : 1.0)))
        return req_fail(r, "\"best_of\" is not supported (only equal to \"n\")");
    // OpenAI's and vLLM's other fields that would change the prompt or the output:
    // refused unless absent, null or neutral.
    enum neutral { NULL_ONLY, EMPTY_LIST, IS_FALSE, IS_TRUE, NONE_OR_AUTO, TEXT_FORMAT };
    static const struct {
        const char *key;
        enum neutral ok;
        const char *what;
    } fields[] = {
        {"tools", EMPTY_LIST, "tool definitions are taken by /v1/chat/completions lines"},
        {"functions", EMPTY_LIST, "tool definitions"},
        {"tool_choice", NONE_OR_AUTO, "tool calls are made by /v1/chat/completions lines"},
        {"function_call", NONE_OR_AUTO, "tool calls"},
        {"response_format", TEXT_FORMAT, "structured output"},
        {"guided_json", NULL_ONLY, "structured output"},
        {"guided_regex", NULL_ONLY, "structured output"},
        {"guided_choice", NULL_ONLY, "structured output"},
        {"guided_grammar", NULL_ONLY, "structured output"},
        {"structured_outputs", NULL_ONLY, "structured output"},
        {"chat_template", NULL_ONLY, "a chat template of the request's own"},
        {"prompt_logprobs", NULL_ONLY, "prompt logprobs (use /v1/completions with echo)"},
        {"use_beam_search", IS_FALSE, "beam search"},
        {"allowed_token_ids", EMPTY_LIST, "restricted vocabularies"},
        {"bad_words", EMPTY_LIST, "banned words"},
        {"logits_processors", EMPTY_LIST, "logits processors"},
        {"skip_special_tokens", IS_TRUE, "special tokens in the text"},
    };
    for (size_t k = 0; k < sizeof fields / sizeof fields[0]; k++) {
        if (!(v = cJSON_GetObjectItemCaseSensitive(o, fields[k].key)) || cJSON_IsNull(v)) continue;
        if (r->fmt == REQ_OAI_CHAT &&
            (!strcmp(fields[k].key, "tools") || !strcmp(fields[k].key, "tool_choice")))
            continue; // get_tools'
        bool neutral = false;
        switch (fields[k].ok) {
        case NULL_ONLY:
            break;
        case EMPTY_LIST:
            neutral = cJSON_IsArray(v) && !v->child;
            break;
        case IS_FALSE:
            neutral = cJSON_IsFalse(v);
            break;
        case IS_TRUE:
            neutral = cJSON_IsTrue(v);
            break;
        case NONE_OR_AUTO:
            neutral = cJSON_IsString(v) &&
                      (!strcmp(v->valuestring, "none") || !strcmp(v->valuestring, "auto"));
            break;
        case TEXT_FORMAT: {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(v, "type");
            neutral = cJSON_IsObject(v) && cJSON_IsString(t) && !strcmp(t->valuestring, "text");
            break;
        }
        }
        if (!neutral)
            return req_fail(r, "\"%s\" is not supported (%s)", fields[k].key, fields[k].what);
    }
    return 0;
}

/* The sampling fields every format shares (OpenAI's names; top_k/min_p as vLLM). */
static int get_sampling(struct batch_req *r, const cJSON *o) {
    if (refuse_unsupported(r, o)) return -1;
    long long v;
    v = r->max_tokens;
    // 0 with echo is vLLM's prompt scoring without generation: one token is generated,
    // as vLLM does, and left out of the record.
    const long long lo = r->echo ? 0 : 1;
    for (int k = 0; k < 2; k++) {
        const char *key = k ? "max_completion_tokens" : "max_tokens";
        const cJSON *mt = cJSON_GetObjectItemCaseSensitive(o, key);
        if (r->oai && mt && cJSON_IsNull(mt)) { // vLLM: null is the rest of the context
            v = r->max_tokens = INT32_MAX;
            r->max_tokens_fit = false;
            continue;
        }
        if (get_int(r, o, key, lo, 1LL << 30, &v)) return -1;
        if (mt) r->max_tokens_fit = r->oai;
    }
    r->echo_only = r->echo && v == 0;
    r->max_tokens = r->echo_only ? 1 : (int)v;
    if (get_float(r, o, "temperature", 0.0, 100.0, &r->sp.temp)) return -1;
    if (get_float(r, o, "top_p", 0.0, 1.0, &r->sp.top_p)) return -1;
    if (r->oai && r->sp.top_p <= 0.0f && cJSON_GetObjectItemCaseSensitive(o, "top_p"))
        return req_fail(r, "\"top_p\" must be in (0, 1]"); // vLLM's; llama.cpp's 0 is greedy
    if (get_float(r, o, "min_p", 0.0, 1.0, &r->sp.min_p)) return -1;
    if (get_float(r, o, "repetition_penalty", 1e-3, 100.0, &r->sp.repeat_penalty)) return -1;
    if (get_float(r, o, "presence_penalty", -2.0, 2.0, &r->sp.presence_penalty)) return -1;
    if (get_float(r, o, "frequency_penalty", -2.0, 2.0, &r->sp.frequency_penalty)) return -1;
    v = r->sp.top_k;
    if (get_int(r, o, "top_k", -1, 1LL << 30, &v)) return -1;
    r->sp.top_k = (int)v;
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "seed");
    if (s && !cJSON_IsNull(s)) {
        // Seeds may exceed 2^53; the double is what JSON gave us, so use it as is. A
        // 64-bit seed's range: 2^64 - 1 reads as 2^64, which stands for it.
        const double d = cJSON_IsNumber(s) ? s->valuedouble : NAN;
        if (!(d == floor(d) && d >= -0x1p63 && d <= 0x1p64))
            return req_fail(r, "\"seed\" must be an integer in [-2^63, 2^64)");
        // -1 is no seed, as vLLM and llama-server read it: the run's, as when absent.
        if (d != -1)
            r->sp.seed = d < 0 ? (uint64_t)(int64_t)d : d < 0x1p64 ? (uint64_t)d : UINT64_MAX;
    }
    v = r->n_choices;
    if (get_int(r, o, "n", 1, REQ_MAX_CHOICES, &v)) return -1;
    r->n_choices = (int)v;
    if (r->oai && r->n_choices > 1 && r->sp.temp <= 0.0f) // vLLM's _verify_greedy_sampling
        return req_fail(r, "\"n\" must be 1 when sampling greedily (temperature 0): the "
                           "completions would all be the same");
    return get_stop(r, o);
}

/* chat_template_kwargs (an object; absent or null: nothing): its "enable_thinking", true
 * or false, into *enable_thinking. The Qwen templates read no other key, so the others
 * change nothing, as in Jinja. Returns NULL, or why the value is refused. */
static const char *chat_kwargs(const cJSON *kw, int *enable_thinking) {
    if (!kw || cJSON_IsNull(kw)) return NULL;
    if (!cJSON_IsObject(kw)) return "\"chat_template_kwargs\" must be an object";
    const cJSON *et = cJSON_GetObjectItemCaseSensitive(kw, "enable_thinking");
    if (!et || cJSON_IsNull(et)) return NULL;
    if (!cJSON_IsBool(et))
        return "\"chat_template_kwargs\": \"enable_thinking\" must be true or false";
    *enable_thinking = cJSON_IsTrue(et);
    return NULL;
}

int req_parse_chat_kwargs(const char *json, int *enable_thinking, struct tpi_error *err) {
    cJSON *j = cJSON_Parse(json);
    const char *why = j ? chat_kwargs(j, enable_thinking) : "not valid JSON";
    if (!why && !cJSON_IsObject(j)) why = "not a JSON object";
    cJSON_Delete(j);
    return why ? tpi_err(err, TPI_ERR_INVALID, "%s", why) : TPI_OK;
}

/* How a line's chat is rendered: the run's defaults, then the line's
 * "chat_template_kwargs", "add_generation_prompt" and "continue_final_message" (vLLM's
 * fields). */
static int get_chat_opts(struct batch_req *r, const cJSON *o, const struct req_defaults *d,
                         struct tok_chat_opts *opts) {
    *opts = (struct tok_chat_opts){.add_generation_prompt = true};
    opts->enable_thinking = d->enable_thinking;
    const char *why = chat_kwargs(cJSON_GetObjectItemCaseSensitive(o, "chat_template_kwargs"),
                                  &opts->enable_thinking);
    if (why) return req_fail(r, "%s", why);
    const char *names[2] = {"add_generation_prompt", "continue_final_message"};
    bool *to[2] = {&opts->add_generation_prompt, &opts->continue_final};
    opts->continue_final = false;
    for (int k = 0; k < 2; k++) {
        const cJSON *g = cJSON_GetObjectItemCaseSensitive(o, names[k]);
        if (!g || cJSON_IsNull(g)) continue;
        if (!cJSON_IsBool(g)) return req_fail(r, "\"%s\" must be true or false", names[k]);
        *to[k] = cJSON_IsTrue(g);
    }
    if (opts->continue_final && opts->add_generation_prompt) // vLLM refuses it too
        return req_fail(r, "\"continue_final_message\" needs \"add_generation_prompt\": false");
    return 0;
}

/* OpenAI's "logit_bias", and vLLM's ends of a sequence: "stop_token_ids" (ids that end
 * it as the end-of-generation tokens do), "ignore_eos" (those tokens are ordinary ones),
 * "include_stop_str_in_output" and "min_tokens" (no end before that many tokens, at
 * most max_tokens). */
static int get_ends(struct batch_req *r, const cJSON *o, const struct req_defaults *d) {
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(o, "stop_token_ids");
    if (ids && !cJSON_IsNull(ids)) {
        const int n = cJSON_IsArray(ids) ? cJSON_GetArraySize(ids) : -1;
        if (n < 0 || n > REQ_MAX_STOP_IDS)
            return req_fail(r, "\"stop_token_ids\" must be a list of at most %d token ids",
                            REQ_MAX_STOP_IDS);
        if (!(r->stop_ids = malloc(sizeof(int32_t) * (size_t)(n + 1))))
            return req_fail(r, "out of memory");
        const cJSON *it;
        cJSON_ArrayForEach(it, ids) {
            if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) ||
                it->valuedouble < 0 || it->valuedouble >= d->n_vocab)
                return req_fail(r, "\"stop_token_ids\" entry %d is not an id in [0, %d)",
                                r->n_stop_ids, d->n_vocab);
            r->stop_ids[r->n_stop_ids++] = (int32_t)it->valuedouble;
        }
    }
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(o, "logit_bias");
    if (lb && !cJSON_IsNull(lb)) { // OpenAI's {"token id": bias}, clamped to [-100, 100] (vLLM)
        const int n = cJSON_IsObject(lb) ? cJSON_GetArraySize(lb) : -1;
        if (n < 0 || n > REQ_MAX_BIAS)
            return req_fail(r, "\"logit_bias\" must be an object of at most %d token ids",
                            REQ_MAX_BIAS);
        r->bias_ids = malloc(sizeof(int32_t) * (size_t)(n + 1));
        r->bias_vals = malloc(sizeof(float) * (size_t)(n + 1));
        if (!r->bias_ids || !r->bias_vals) return req_fail(r, "out of memory");
        const cJSON *it;
        cJSON_ArrayForEach(it, lb) {
            char *end;
            errno = 0;
            const long id = strtol(it->string, &end, 10);
            if (errno || end == it->string || *end || id < 0 || id >= d->n_vocab)
                return req_fail(r, "\"logit_bias\" key \"%.32s\" is not a token id in [0, %d)",
                                it->string, d->n_vocab);
            if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble))
                return req_fail(r, "\"logit_bias\" of %ld must be a number", id);
            for (int i = 0; i < r->n_bias; i++)
                if (r->bias_ids[i] == id)
                    return req_fail(r, "\"logit_bias\" lists %ld twice", id);
            r->bias_ids[r->n_bias] = (int32_t)id;
            r->bias_vals[r->n_bias++] = (float)TPI_MAX(-100.0, TPI_MIN(100.0, it->valuedouble));
        }
    }
    const char *flags[2] = {"ignore_eos", "include_stop_str_in_output"};
    bool *to[2] = {&r->ignore_eos, &r->keep_stop_string};
    for (int k = 0; k < 2; k++) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, flags[k]);
        if (!f || cJSON_IsNull(f)) continue;
        if (!cJSON_IsBool(f)) return req_fail(r, "\"%s\" must be true or false", flags[k]);
        *to[k] = cJSON_IsTrue(f);
    }
    long long v = 0;
    if (get_int(r, o, "min_tokens", 0, 1LL << 30, &v)) return -1;
    if (v > r->max_tokens)
        return req_fail(r, "\"min_tokens\" %lld is more than \"max_tokens\" %d", v, r->max_tokens);
    r->min_tokens = (int)v;
    return 0;
}

/* Encode the n bytes of text; with chat (opts not NULL) it is wrapped as one user message
 * first (a NUL in it is then refused: the template takes C strings). */
static int encode_text(struct batch_req *r, const struct tokenizer *tok, const char *text,
                       size_t n, const struct tok_chat_opts *chat) {
    struct tpi_error e = {0};
    char *rendered = NULL;
    if (chat && memchr(text, 0, n))
        return req_fail(r, "the text holds a NUL byte, which a chat prompt cannot take");
    if (chat) {
        struct tok_message msg = {.role = "user", .content = text};
        if (tok_apply_chat(tok, &msg, 1, chat, &rendered, NULL, &e))
            return req_fail(r, "%s", e.msg);
        text = rendered;
        n = strlen(rendered);
    }
    int rc = tok_encode(tok, text, n, true, &r->prompt, &r->n_prompt, &e);
    free(rendered);
    if (rc) return req_fail(r, "%s", e.msg);
    return 0;
}

/* An OpenAI chat body's "tools" (from its text [bb, be), where their numbers stand as
 * written), "tool_choice" and "parallel_tool_calls" into r and *tools (n_tools; the
 * caller frees them). Returns 0, or -1 with the line failed. */
static int get_tools(struct batch_req *r, const char *bb, const char *be, const cJSON *body,
                     char ***tools, int *n_tools) {
    *tools = NULL;
    *n_tools = 0;
    const char *tb, *te;
    const cJSON *tj = cJSON_GetObjectItemCaseSensitive(body, "tools");
    const bool raw = bb && json_member(bb, be, "tools", &tb, &te);
    if (tj && !cJSON_IsNull(tj) && !raw) // cJSON reads more than RFC 8259's JSON
        return req_fail(r, "\"tools\": the line is not strict JSON, so its numbers cannot be "
                           "passed on as written");
    if (raw && !json_is_null(tb, te)) {
        const int n = json_items(tb, te, NULL, NULL, 0);
        if (n < 0) return req_fail(r, "\"tools\" must be a list");
        const char **ib = malloc(2 * sizeof *ib * (size_t)(n > 0 ? n : 1)), **ie = ib + n;
        if (!ib || (n > 0 && !(*tools = calloc((size_t)n, sizeof **tools)))) {
            free(ib);
            return req_fail(r, "out of memory");
        }
        json_items(tb, te, ib, ie, n);
        for (int i = 0; i < n; i++) {
            struct tpi_error e = {0};
            if (!((*tools)[i] = tok_tool_json(ib[i], ie[i], &e))) {
                free(ib);
                return req_fail(r, "tools[%d]: %s", i, e.msg);
            }
            *n_tools = i + 1;
        }
        free(ib);
    }
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(body, "tool_choice");
    const char *choice = !tc || cJSON_IsNull(tc) ? "auto"
                         : cJSON_IsString(tc)    ? tc->valuestring
                                                 : "";
    if (strcmp(choice, "auto") && strcmp(choice, "none"))
        return req_fail(r, "\"tool_choice\" must be \"auto\" or \"none\" (\"required\" and named "
                           "functions need constrained decoding, which tpinfer does not do)");
    r->tools = *n_tools == 0             ? REQ_TOOLS_NONE
               : !strcmp(choice, "auto") ? REQ_TOOLS_AUTO
                                         : REQ_TOOLS_PROMPT;
    const cJSON *par = cJSON_GetObjectItemCaseSensitive(body, "parallel_tool_calls");
    if (par && !cJSON_IsNull(par) && !cJSON_IsBool(par))
        return req_fail(r, "\"parallel_tool_calls\" must be true or false");
    r->one_tool_call = cJSON_IsFalse(par);
    return 0;
}

/* A message's "tool_calls" ([{"id", "type": "function", "function": {"name",
 * "arguments"}}]) into *calls (*n_calls; freed by the caller). */
static int get_tool_calls(struct batch_req *r, int i, const cJSON *it, const char *role,
                          struct tok_tool_call **calls, int *n_calls) {
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(it, "tool_calls");
    if (!tc || cJSON_IsNull(tc) || (cJSON_IsArray(tc) && !tc->child)) return 0;
    if (!cJSON_IsArray(tc)) return req_fail(r, "message %d: \"tool_calls\" must be a list", i);
    if (strcmp(role, "assistant"))
        return req_fail(r, "message %d: only assistant messages carry \"tool_calls\"", i);
    const int n = cJSON_GetArraySize(tc);
    if (!(*calls = calloc((size_t)n, sizeof **calls))) return req_fail(r, "out of memory");
    const cJSON *c = tc->child;
    for (int k = 0; k < n; k++, c = c->next) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(c, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        if (type && !cJSON_IsNull(type) &&
            !(cJSON_IsString(type) && !strcmp(type->valuestring, "function")))
            return req_fail(r, "message %d: tool call %d: \"type\" must be \"function\"", i, k);
        if (!cJSON_IsString(name) || !cJSON_IsString(args))
            return req_fail(r,
                            "message %d: tool call %d has no \"function\" with \"name\" and "
                            "\"arguments\" strings",
                            i, k);
        struct tpi_error e = {0};
        if (tok_tool_call_init(&(*calls)[k], name->valuestring, args->valuestring, &e))
            return req_fail(r, "message %d: tool call %d: %s", i, k, e.msg);
        *n_calls = k + 1;
    }
    return 0;
}

/* "messages": [{"role", "content": string | [{"type": "text", "text"}...],
 * "reasoning_content", "tool_calls"}]. */
static int encode_messages(struct batch_req *r, const struct tokenizer *tok, const cJSON *msgs,
                           const struct tok_chat_opts *opts) {
    if (!cJSON_IsArray(msgs)) return req_fail(r, "\"messages\" must be a list");
    int n = cJSON_GetArraySize(msgs);
    struct tok_message *m = calloc((size_t)n + 1, sizeof *m);
    char **owned = calloc((size_t)n + 1, sizeof *owned);
    int rc = 0;
    if (!m || !owned) rc = req_fail(r, "out of memory");
    const cJSON *it = msgs->child;
    for (int i = 0; !rc && i < n; i++, it = it->next) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (!cJSON_IsObject(it) || !cJSON_IsString(role)) {
            rc = req_fail(r, "message %d has no \"role\" string", i);
            break;
        }
        m[i].role = role->valuestring;
        const cJSON *rc_ = cJSON_GetObjectItemCaseSensitive(it, "reasoning_content");
        if (cJSON_IsString(rc_)) {
            m[i].reasoning_content = rc_->valuestring;
        } else if (rc_ && !cJSON_IsNull(rc_)) {
            rc = req_fail(r, "message %d: \"reasoning_content\" must be a string", i);
            break;
        }
        struct tok_tool_call *calls = NULL;
        int n_calls = 0;
        rc = get_tool_calls(r, i, it, role->valuestring, &calls, &n_calls);
        m[i].tool_calls = calls;
        m[i].n_tool_calls = n_calls;
        if (calls && !n_calls) { // none made: nothing to keep
            free(calls);
            m[i].tool_calls = NULL;
        }
        if (rc) break;
        if (cJSON_IsString(content)) {
            m[i].content = content->valuestring;
        } else if (cJSON_IsArray(content)) { // text parts, joined by "\n" (as vLLM joins them)
            size_t len = 1;
            const cJSON *p;
            cJSON_ArrayForEach(p, content) {
                const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "text");
                if (!cJSON_IsString(t)) {
                    rc = req_fail(r, "message %d: only text content parts are supported", i);
                    break;
                }
                len += strlen(t->valuestring) + 1;
            }
            if (rc) break;
            if (!(owned[i] = malloc(len))) {
                rc = req_fail(r, "out of memory");
                break;
            }
            size_t at = 0;
            cJSON_ArrayForEach(p, content) {
                const char *t = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
                const size_t nt = strlen(t);
                if (p != content->child) owned[i][at++] = '\n';
                memcpy(owned[i] + at, t, nt);
                at += nt;
            }
            owned[i][at] = '\0';
            m[i].content = owned[i];
        } else if (content && !cJSON_IsNull(content)) {
            rc = req_fail(r, "message %d: \"content\" must be a string or a list of parts", i);
        } else {
            m[i].content = "";
        }
    }
    char *text = NULL;
    struct tpi_error e = {0};
    if (!rc && n == 0) rc = req_fail(r, "\"messages\" is empty");
    if (!rc && tok_apply_chat(tok, m, n, opts, &text, NULL, &e)) rc = req_fail(r, "%s", e.msg);
    if (!rc && tok_encode(tok, text, strlen(text), true, &r->prompt, &r->n_prompt, &e))
        rc = req_fail(r, "%s", e.msg);
    free(text);
    for (int i = 0; owned && i < n; i++) free(owned[i]);
    for (int i = 0; m && i < n; i++) {
        struct tok_tool_call *calls = (struct tok_tool_call *)m[i].tool_calls;
        for (int k = 0; k < m[i].n_tool_calls; k++)
            tok_tool_call_free(&calls[k]);
        free(calls);
    }
    free(owned);
    free(m);
    return rc;
}

/* "prompt": text (a user turn when chat is not NULL), or a list of token ids. */
static int encode_prompt(struct batch_req *r, const struct tokenizer *tok, const cJSON *p,
                         const struct req_defaults *d, const struct tok_chat_opts *chat) {
    if (cJSON_IsString(p))
        return encode_text(r, tok, p->valuestring, strlen(p->valuestring), chat);
    if (!cJSON_IsArray(p))
        return req_fail(r, "\"prompt\" must be a string or a list of token ids");
    int n = cJSON_GetArraySize(p);
    if (n == 1 && (cJSON_IsString(p->child) || cJSON_IsArray(p->child)))
        return encode_prompt(r, tok, p->child, d, chat); // a list of one prompt is that prompt
    if (n > 0 && (cJSON_IsString(p->child) || cJSON_IsArray(p->child)))
        return req_fail(r, "\"prompt\" lists %d prompts; give one per line", n);
    r->prompt = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    if (!r->prompt) return req_fail(r, "out of memory");
    const cJSON *it;
    int i = 0;
    cJSON_ArrayForEach(it, p) {
        if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) ||
            it->valuedouble < 0 || it->valuedouble >= d->n_vocab)
            return req_fail(r, "\"prompt\" token %d is not an id in [0, %d)", i, d->n_vocab);
        r->prompt[i++] = (int32_t)it->valuedouble;
    }
    r->n_prompt = n;
    return 0;
}

static char *line_id(long line) {
    char b[32];
    snprintf(b, sizeof b, "%ld", line);
    return tpi_strdup(b);
}

/* vLLM's "truncate_prompt_tokens" (keep the prompt's last k tokens; -1: as many as the
 * context holds) and "return_tokens_as_token_ids". Returns 0, or -1 with the line failed. */
static int get_vllm_extras(struct batch_req *r, const cJSON *o) {
    long long t = 1LL << 31;
    if (get_int(r, o, "truncate_prompt_tokens", -1, 1LL << 30, &t)) return -1;
    if (t == 0) return req_fail(r, "\"truncate_prompt_tokens\" must be -1 or at least 1");
    r->truncate_to = t > 0 && t < (1LL << 31) ? (int)t : 0; // -1: whole; the context's check
                                                             // then applies, as in vLLM
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, "return_tokens_as_token_ids");
    if (f && !cJSON_IsNull(f)) {
        if (!cJSON_IsBool(f)) return req_fail(r, "\"return_tokens_as_token_ids\" must be true or false");
        r->ids_as_tokens = cJSON_IsTrue(f);
    }
    return 0;
}

char *req_id_text(const char *b, const char *e) {
    while (b < e && (*b == ' ' || *b == '\t' || *b == '\n' || *b == '\r')) b++;
    while (e > b && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r')) e--;
    cJSON *v = tpi_json_parse(b, (size_t)(e - b));
    char *t = NULL;
    if (cJSON_IsString(v)) t = cJSON_PrintUnformatted(v);
    else if (cJSON_IsNumber(v) && (t = malloc((size_t)(e - b) + 1))) {
        memcpy(t, b, (size_t)(e - b));
        t[e - b] = '\0';
    }
    cJSON_Delete(v);
    return t;
}

/* Parse one JSON line into r (r->line, defaults already set). */
static void parse_json_line(struct batch_req *r, const char *text, size_t len,
                            const struct tokenizer *tok, const struct req_defaults *d) {
    cJSON *j = tpi_json_parse(text, len);
    if (!j || !cJSON_IsObject(j)) {
        req_fail(r, j ? "not a JSON object" : "not valid JSON");
        cJSON_Delete(j);
        return;
    }
    const cJSON *cid = cJSON_GetObjectItemCaseSensitive(j, "custom_id");
    const cJSON *body = cJSON_GetObjectItemCaseSensitive(j, "body");
    r->oai = cid || body || cJSON_GetObjectItemCaseSensitive(j, "url");
    const char *id_key = r->oai ? "custom_id" : "id";
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(j, id_key);
    if (id && !cJSON_IsNull(id)) {
        const char *t0 = len >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3) ? text + 3 : text;
        const char *vb = NULL, *ve = NULL;
        if (!(cJSON_IsString(id) || cJSON_IsNumber(id))) req_fail(r, "the id must be a string or a number");
        else if (json_member(t0, text + len, id_key, &vb, &ve) &&
                 tpi_utf8_bad(vb, (size_t)(ve - vb)) == (size_t)(ve - vb))
            r->id_json = req_id_text(vb, ve);
    }
    const size_t bad = tpi_utf8_bad(text, len);
    if (bad < len) { // RFC 8259: JSON text is UTF-8 (Python's json.loads refuses it too)
        req_fail(r, "byte %zu (0x%02x) is not UTF-8: a JSON line must be UTF-8 text", bad + 1,
                 (unsigned char)text[bad]);
        cJSON_Delete(j);
        return;
    }
    if (json_text_holds_nul(text, len)) {
        req_fail(r, "a string holds \\u0000 (a NUL character), which tpinfer cannot take");
        cJSON_Delete(j);
        return;
    }
    if (!r->oai) {
        r->fmt = REQ_OURS;
        r->n_logprobs = d->n_logprobs;
        long long k = r->n_logprobs;
        struct tok_chat_opts chat;
        if (!get_sampling(r, j) && !get_ends(r, j, d) &&
            !get_int(r, j, "logprobs", 0, REQ_MAX_LOGPROBS, &k) && !get_chat_opts(r, j, d, &chat)) {
            r->n_logprobs = r->n_top_out = (int)k;
            r->want_logprobs = k > 0;
            const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prompt");
            const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "messages");
            if (p && m) req_fail(r, "give \"prompt\" or \"messages\", not both");
            else if (m)
                encode_messages(r, tok, m, &chat);
            else if (p)
                encode_prompt(r, tok, p, d, d->chat ? &chat : NULL);
            else req_fail(r, "no \"prompt\" or \"messages\"");
        }
        cJSON_Delete(j);
        return;
    }
    // OpenAI batch line.
    const cJSON *url = cJSON_GetObjectItemCaseSensitive(j, "url");
    const cJSON *method = cJSON_GetObjectItemCaseSensitive(j, "method");
    r->fmt = REQ_OAI_CHAT;
    if (cJSON_IsString(url) && !strcmp(url->valuestring, "/v1/completions"))
        r->fmt = REQ_OAI_COMPLETION;
    if (cid && !cJSON_IsString(cid)) req_fail(r, "\"custom_id\" must be a string");
    else if (!cJSON_IsString(url) || (strcmp(url->valuestring, "/v1/chat/completions") &&
                                      strcmp(url->valuestring, "/v1/completions")))
        req_fail(r, "\"url\" must be \"/v1/chat/completions\" or \"/v1/completions\"");
    else if (method && !(cJSON_IsString(method) && !strcmp(method->valuestring, "POST")))
        req_fail(r, "\"method\" must be \"POST\"");
    else if (!cJSON_IsObject(body))
        req_fail(r, "\"body\" must be an object");
    if (r->error) {
        cJSON_Delete(j);
        return;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(body, "model");
    if (cJSON_IsString(model)) r->model_name = tpi_strdup(model->valuestring);
    // vLLM's semantics for its own format: a completion without max_tokens stops at 16
    // (OpenAI's and vLLM's default) unless the run gives -n; the filters measure the
    // tempered distribution; the repetition penalty covers the prompt and the output.
    if (r->fmt == REQ_OAI_COMPLETION && d->max_tokens <= 0) {
        r->max_tokens = 16;
        r->max_tokens_fit = true;
    }
    // A line that sets no sampling field samples as vLLM would (temperature 1, no
    // filter), unless the run's own options say otherwise.
    const uint64_t seed = r->sp.seed;
    r->sp = d->sp_openai;
    r->sp.seed = seed;
    r->sp.temp_first = true;
    if (get_sampling(r, body) || get_ends(r, body, d) || get_vllm_extras(r, body)) {
        cJSON_Delete(j);
        return;
    }
    if (r->sp.repeat_penalty != 1.0f) r->sp.repeat_last_n = d->n_ctx;
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(body, "logprobs");
    long long k = 0;
    if (r->fmt == REQ_OAI_CHAT) { // logprobs: bool, top_logprobs: int
        if (lp && !cJSON_IsNull(lp) && !cJSON_IsBool(lp))
            req_fail(r, "\"logprobs\" must be true or false for chat completions");
        else if (!get_int(r, body, "top_logprobs", 0, REQ_MAX_LOGPROBS, &k))
            r->want_logprobs = cJSON_IsTrue(lp);
        if (!r->error && k > 0 && !r->want_logprobs) // vLLM's check_logprobs
            req_fail(r, "\"top_logprobs\" needs \"logprobs\": true");
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(body, "messages");
        struct tok_chat_opts chat;
        char **tools = NULL;
        int n_tools = 0;
        const char *bb = NULL, *be = NULL;
        const char *t0 = len >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3) ? text + 3 : text;
        json_member(t0, text + len, "body", &bb, &be); // the tools' text, as cJSON's BOM-less
        if (!r->error && !get_chat_opts(r, body, d, &chat) &&
            !get_tools(r, bb, be, body, &tools, &n_tools)) {
            chat.tools = (const char *const *)tools;
            chat.n_tools = n_tools;
            if (!m) req_fail(r, "chat completion body has no \"messages\"");
            else
                encode_messages(r, tok, m, &chat);
        }
        for (int i = 0; i < n_tools; i++)
            free(tools[i]);
        free(tools);
    } else { // logprobs: int (top alternatives; 0 still gives the chosen token's)
        if (!get_int(r, body, "logprobs", 0, REQ_MAX_LOGPROBS, &k))
            r->want_logprobs = lp && cJSON_IsNumber(lp);
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(body, "prompt");
        if (!r->error) {
            if (!p) req_fail(r, "completion body has no \"prompt\"");
            else encode_prompt(r, tok, p, d, false);
        }
    }
    if (!r->error && r->truncate_to > 0 && r->n_prompt > r->truncate_to) { // the last ones
        memmove(r->prompt, r->prompt + (r->n_prompt - r->truncate_to),
                sizeof *r->prompt * (size_t)r->truncate_to);
        r->n_prompt = r->truncate_to;
    }
    r->n_top_out = (int)k;
    // The engine computes the chosen token's logprob alongside the top-K, so ask for
    // at least one alternative whenever logprobs are wanted.
    r->n_logprobs = r->want_logprobs ? TPI_MAX(1, (int)k) : 0;
    cJSON_Delete(j);
}

/* Whole input into memory: stdin cannot be rewound, and the file is small next to
 * the model. */
static char *read_all(const char *path, size_t *n_out, struct tpi_error *err) {
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) {
        tpi_err(err, TPI_ERR_IO, "cannot open the prompt file %s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = tpi_read_stream(f, n_out);
    const int e = errno;
    if (f != stdin) fclose(f);
    if (!buf && e == ENOMEM)
        tpi_err(err, TPI_ERR_NOMEM, "out of memory reading %s", path);
    else if (!buf)
        tpi_err(err, TPI_ERR_IO, "error reading the prompt file %s: %s", path, strerror(e));
    return buf;
}

static bool is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return false;
    return true;
}

int batch_input_load(const char *path, const struct tokenizer *tok, const struct req_defaults *d,
                     struct batch_input *in, struct tpi_error *err) {
    memset(in, 0, sizeof *in);
    size_t n_bytes = 0;
    char *data = read_all(path, &n_bytes, err);
    if (!data) return err->status;
    if (n_bytes >= 3 && !memcmp(data, "\xEF\xBB\xBF", 3)) { // a UTF-8 byte order mark
        memmove(data, data + 3, n_bytes - 3 + 1); // (editors on Windows write one)
        n_bytes -= 3;
    }

    // Count lines to size the array once; decide plain text vs JSONL.
    size_t n_lines = 0;
    bool seen = false;
    for (size_t i = 0; i < n_bytes;) {
        size_t e = i;
        while (e < n_bytes && data[e] != '\n') e++;
        if (!is_blank(data + i, e - i)) {
            n_lines++;
            if (!seen) {
                size_t k = i;
                while (k < e && (data[k] == ' ' || data[k] == '\t')) k++;
                in->plain = data[k] != '{';
                seen = true;
            }
        }
        i = e + 1;
    }
    in->reqs = calloc(n_lines + 1, sizeof *in->reqs);
    if (!in->reqs) {
        free(data);
        return tpi_err(err, TPI_ERR_NOMEM, "out of memory for %zu requests", n_lines);
    }

    long line = 0;
    for (size_t i = 0; i < n_bytes;) {
        size_t e = i;
        while (e < n_bytes && data[e] != '\n') e++;
        line++;
        size_t len = e - i;
        if (len > 0 && data[i + len - 1] == '\r') len--;
        if (!is_blank(data + i, len)) {
            struct batch_req *r = &in->reqs[in->n_reqs++];
            r->line = line;
            r->fmt = in->plain ? REQ_PLAIN : REQ_OURS;
            r->max_tokens = d->max_tokens > 0 ? d->max_tokens : d->n_ctx;
            r->sp = d->sp;
            r->sp.seed = d->seed + (uint64_t)line;
            r->n_choices = 1;
            if (in->plain) {
                char save = data[i + len];
                data[i + len] = '\0';
                const struct tok_chat_opts chat = {.add_generation_prompt = true,
                                                   .enable_thinking = d->enable_thinking};
                encode_text(r, tok, data + i, len, d->chat ? &chat : NULL);
                data[i + len] = save;
                r->n_logprobs = r->n_top_out = d->n_logprobs;
                r->want_logprobs = d->n_logprobs > 0;
            } else {
                parse_json_line(r, data + i, len, tok, d);
            }
            if (!r->id_json) r->id_json = line_id(line);
            if (!r->id_json) {
                free(data);
                return tpi_err(err, TPI_ERR_NOMEM, "out of memory at line %ld", line);
            }
            if (!r->error && r->n_prompt == 0) req_fail(r, "the prompt is empty");
            if (!r->error && r->n_prompt >= d->n_ctx)
                req_fail(r, "the prompt has %d tokens and the context %d positions: no room "
                            "to generate (raise -c/--ctx-size)", r->n_prompt, d->n_ctx);
            if (!r->error && r->max_tokens_fit && (long long)r->n_prompt + r->max_tokens > d->n_ctx)
                req_fail(r, "the prompt's %d tokens and \"max_tokens\" %d need %lld positions, "
                            "the context has %d (lower max_tokens or raise -c/--ctx-size)",
                         r->n_prompt, r->max_tokens, (long long)r->n_prompt + r->max_tokens,
                         d->n_ctx);
            if (r->error) { // the engine never sees it: drop what parsing built
                free(r->prompt);
                r->prompt = NULL;
                r->n_prompt = 0;
            }
        }
        i = e + 1;
    }
    free(data);
    return TPI_OK;
}

uint64_t req_choice_seed(uint64_t seed, int c) {
    if (c == 0) return seed;
    // splitmix64 of (seed, c): a full-avalanche mix, so seed + 1 and choice 1 differ.
    uint64_t z = seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)c);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void batch_input_free(struct batch_input *in) {
    for (int i = 0; in->reqs && i < in->n_reqs; i++) {
        struct batch_req *r = &in->reqs[i];
        free(r->id_json);
        free(r->model_name);
        free(r->prompt);
        for (int s = 0; s < r->n_stop; s++) free(r->stop[s]);
        free(r->stop);
        free(r->stop_ids);
        free(r->bias_ids);
        free(r->bias_vals);
        free(r->error);
    }
    free(in->reqs);
    memset(in, 0, sizeof *in);
}
