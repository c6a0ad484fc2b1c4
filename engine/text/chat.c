/*
 * chat.c — chat rendering for tok_apply_chat (tokenizer.h).
 *
 * We do not run Jinja: the Qwen family's templates are ChatML with a few additions, so
 * the template is inspected for which additions it makes (a default system message,
 * tool responses as user turns, Qwen3's and QwQ's <think> handling) and those are
 * rendered in C, as the template renders them; only the generation-prompt block, where
 * the templates differ most, is run as Jinja would (string literals, tests of
 * enable_thinking, whitespace rules). tests/chat/cases.jsonl holds jinja2's renderings
 * of real and test templates to compare with. Anything else is refused
 * with a clear error rather than rendered in a format the model was not trained on.
 */
#include <ctype.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "text/json_py.h"
#include "text/tokenizer.h"

static const char IM_START[] = "<|im_start|>";
static const char IM_END[] = "<|im_end|>";

/* The default system prompt a ChatML template adds when the conversation has none
 * (Qwen2.5's: "You are Qwen, created by Alibaba Cloud. ..."): the literal in a
 * `'<|im_start|>system\n...<|im_end|>\n'` Jinja string, as opposed to the one that
 * concatenates messages[0]['content']. Returns a malloc'd copy (Jinja's "\n" escapes
 * turned into newlines), or NULL when the template has none (Qwen3, plain ChatML). */
static char *default_system(const char *tmpl) {
    static const char open[] = "'<|im_start|>system\\n";
    static const char close[] = "<|im_end|>\\n'";
    for (const char *p = tmpl ? strstr(tmpl, open) : NULL; p; p = strstr(p + 1, open)) {
        const char *b = p + strlen(open), *e = strstr(b, close);
        if (!e || e == b || memchr(b, '\'', (size_t)(e - b))) continue; // '+ messages...'
        char *out = malloc((size_t)(e - b) + 1);
        if (!out) return NULL;
        size_t o = 0;
        for (const char *q = b; q < e; q++) {
            if (q[0] == '\\' && q + 1 < e && q[1] == 'n') {
                out[o++] = '\n';
                q++;
            } else {
                out[o++] = *q;
            }
        }
        out[o] = '\0';
        return out;
    }
    return NULL;
}

static void jput(struct json_buf *b, const char *s) {
    json_buf_put(b, s, strlen(s));
}

void tok_tool_call_free(struct tok_tool_call *c) {
    if (!c) return;
    free(c->name);
    free(c->arguments);
    free(c->arguments_str);
    memset(c, 0, sizeof *c);
}

int tok_tool_call_init(struct tok_tool_call *c, const char *name, const char *arguments,
                       struct tpi_error *err) {
    memset(c, 0, sizeof *c);
    const char *ab = arguments ? arguments : "", *ae = ab + strlen(ab);
    const char *why = NULL;
    c->name = tpi_strdup(name ? name : "");
    c->arguments = json_py_dumps(ab, ae, &why);
    const bool str = c->arguments && c->arguments[0] == '"'; // printed: a string's quote
    if (str) c->arguments_str = json_string_value(ab, ae);
    if (c->name && c->arguments && (!str || c->arguments_str)) return TPI_OK;
    tok_tool_call_free(c);
    if (why && strcmp(why, "out of memory"))
        return tpi_err(err, TPI_ERR_INVALID,
                       "the tool call's \"arguments\" are not JSON tpinfer "
                       "can pass on (%s)",
                       why);
    return tpi_err(err, TPI_ERR_NOMEM, "out of memory for a tool call");
}

/* A tool function's optional member `key` of [fb, fe) as vLLM's model dump has it, into o:
 * its value as Python prints it (a string, or with `object` a JSON object), or null when
 * absent or null. False (err set) when it is of another kind or cannot be printed. */
static bool put_optional(struct json_buf *o, const char *fb, const char *fe, const char *key,
                         bool object, struct tpi_error *err) {
    const char *vb, *ve, *why = NULL;
    if (!json_member(fb, fe, key, &vb, &ve) || json_is_null(vb, ve)) {
        jput(o, "null");
        return true;
    }
    if ((object ? json_is_object(vb, ve) : json_is_string(vb, ve)) && json_py_put(o, vb, ve, &why))
        return true;
    tpi_err(err, TPI_ERR_INVALID, "a tool function's \"%s\" %s%s%s", key,
            object ? "are not a JSON object" : "is not a string", why ? ": " : "", why ? why : "");
    return false;
}

char *tok_tool_json(const char *b, const char *e, struct tpi_error *err) {
    static const char *const tool_keys[] = {"type", "function", NULL};
    static const char *const fn_keys[] = {"name", "description", "parameters", "strict", NULL};
    const char *vb, *ve, *fb, *fe;
    char *other = NULL;
    if (!json_is_object(b, e)) {
        tpi_err(err, TPI_ERR_INVALID, "a tool is not a JSON object");
        return NULL;
    }
    if ((other = json_other_member(b, e, tool_keys))) {
        tpi_err(err, TPI_ERR_UNSUPPORTED, "a tool's field \"%.40s\" is not supported", other);
        free(other);
        return NULL;
    }
    if (json_member(b, e, "type", &vb, &ve) && !json_is_null(vb, ve)) {
        char *t = json_string_value(vb, ve);
        const bool fn = t && !strcmp(t, "function");
        free(t);
        if (!fn) {
            tpi_err(err, TPI_ERR_UNSUPPORTED, "a tool's \"type\" must be \"function\"");
            return NULL;
        }
    }
    if (!json_member(b, e, "function", &fb, &fe) || !json_is_object(fb, fe)) {
        tpi_err(err, TPI_ERR_INVALID, "a tool has no \"function\" object");
        return NULL;
    }
    if ((other = json_other_member(fb, fe, fn_keys))) {
        tpi_err(err, TPI_ERR_UNSUPPORTED, "a tool function's field \"%.40s\" is not supported",
                other);
        free(other);
        return NULL;
    }
    if (json_member(fb, fe, "strict", &vb, &ve) && !json_is_null(vb, ve)) {
        const char *p = vb;
        while (p < ve && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
            p++;
        if (ve - p < 5 || memcmp(p, "false", 5)) {
            tpi_err(err, TPI_ERR_UNSUPPORTED,
                    "a tool function's \"strict\" schema adherence is "
                    "not supported (only false)");
            return NULL;
        }
    }
    char *name = json_member(fb, fe, "name", &vb, &ve) ? json_string_value(vb, ve) : NULL;
    if (!name) {
        tpi_err(err, TPI_ERR_INVALID, "a tool function has no \"name\" string");
        return NULL;
    }
    struct json_buf o = {0};
    jput(&o, "{\"type\": \"function\", \"function\": {\"name\": ");
    json_py_put_string(&o, name);
    free(name);
    jput(&o, ", \"description\": ");
    bool ok = put_optional(&o, fb, fe, "description", false, err);
    jput(&o, ", \"parameters\": ");
    ok = ok && put_optional(&o, fb, fe, "parameters", true, err);
    jput(&o, "}}");
    if (ok && o.failed) {
        tpi_err(err, TPI_ERR_NOMEM, "out of memory for a tool");
        ok = false;
    }
    if (!ok) {
        free(o.p);
        return NULL;
    }
    return o.p;
}

int tok_parse_tool_calls(const char *text, struct tok_tool_call **calls, size_t *content_len) {
    static const char open[] = "<tool_call>", close[] = "</tool_call>";
    *calls = NULL;
    *content_len = 0;
    const char *first = strstr(text, open);
    if (!first) return 0;
    int n = 0, cap = 0, rc = 0;
    struct tok_tool_call *c = NULL;
    const char *end = text + strlen(text);
    for (const char *p = first; p && rc == 0; p = strstr(p, open)) {
        const char *b = p + strlen(open), *e = strstr(b, close);
        p = e ? e + strlen(close) : end;
        if (!e) e = end;
        const char *nb, *ne, *ab, *ae;
        char *name = NULL;
        if (!json_is_object(b, e) || !json_member(b, e, "name", &nb, &ne) ||
            !(name = json_string_value(nb, ne)) || !json_member(b, e, "arguments", &ab, &ae)) {
            free(name);
            rc = 1; // vLLM logs it and returns the text as it is
            break;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 4;
            struct tok_tool_call *g = realloc(c, (size_t)cap * sizeof *g);
            if (!g) {
                free(name);
                rc = -1;
                break;
            }
            c = g;
        }
        const char *why = NULL;
        c[n] = (struct tok_tool_call){.name = name, .arguments = json_py_dumps(ab, ae, &why)};
        n++;
        if (!c[n - 1].arguments) rc = why && !strcmp(why, "out of memory") ? -1 : 1;
    }
    if (rc != 0) {
        for (int k = 0; k < n; k++)
            tok_tool_call_free(&c[k]);
        free(c);
        return rc < 0 ? -1 : 0;
    }
    *calls = c;
    *content_len = (size_t)(first - text);
    return n;
}

/* What a ChatML template adds to the plain loop, from its text. */
enum {
    CHAT_ROLES_BY_NAME = 1, /* branches on role names: renders only the four below */
    CHAT_TOOL_RESPONSE = 2, /* "tool" messages: one user turn of <tool_response> blocks */
    CHAT_THINK = 4,         /* Qwen3: an assistant turn's reasoning by the last query */
    CHAT_DROP_THINK = 8,    /* QwQ: every assistant turn keeps what follows its </think> */
    CHAT_TOOLS_Q25 = 16,    /* Qwen2.5's tools block: the system message's content (else
                               the default one), then the tools */
    CHAT_TOOLS_Q3 = 32,     /* Qwen3's: the system message's content and a blank line, if
                               there is one, then the tools */
    CHAT_CALLS_Q25 = 64,    /* Qwen2.5's tool calls: "\n<tool_call>..." each, after the
                               content where there is one */
    CHAT_CALLS_Q3 = 128     /* Qwen3's: after the turn's content, a newline before each
                               but a first one after no content */
};

static unsigned chat_dialect(const char *tmpl) {
    if (!tmpl) return 0;
    unsigned d = 0;
    if (strstr(tmpl, "== \"user\"") || strstr(tmpl, "== 'user'")) d |= CHAT_ROLES_BY_NAME;
    if (strstr(tmpl, "<tool_response>") &&
        (strstr(tmpl, "== \"tool\"") || strstr(tmpl, "== 'tool'")))
        d |= CHAT_TOOL_RESPONSE;
    if (strstr(tmpl, "reasoning_content") && strstr(tmpl, "last_query_index") &&
        strstr(tmpl, "</think>"))
        d |= CHAT_THINK;
    else if (strstr(tmpl, "message.content.split('</think>')[-1].lstrip('\\n')"))
        d |= CHAT_DROP_THINK;
    if (strstr(tmpl, "{{- tool | tojson }}")) {
        if (strstr(tmpl, "{{- messages[0].content + '\\n\\n' }}"))
            d |= CHAT_TOOLS_Q3;
        else if (strstr(tmpl, "{{- messages[0]['content'] }}"))
            d |= CHAT_TOOLS_Q25;
    }
    if (strstr(tmpl, "{{- '\\n<tool_call>\\n{\"name\": \"' }}") &&
        strstr(tmpl, "{{- tool_call.arguments | tojson }}") &&
        !(d & (CHAT_THINK | CHAT_DROP_THINK)))
        d |= CHAT_CALLS_Q25;
    if (strstr(tmpl, "{{- '<tool_call>\\n{\"name\": \"' }}") &&
        strstr(tmpl, "(loop.first and content) or (not loop.first)") && (d & CHAT_THINK))
        d |= CHAT_CALLS_Q3;
    return d;
}

/* The output is a json_buf (json_py.h): a growing string, `failed` once an allocation
 * failed. */
static void put_n(struct json_buf *b, const char *s, size_t len) {
    json_buf_put(b, s, len);
}

static void put(struct json_buf *b, const char *s) {
    put_n(b, s, strlen(s));
}

/* ---- the generation prompt -------------------------------------------------------
 * What the template writes under `{% if add_generation_prompt %}`, run here: string
 * literals written out, `if` / `elif` / `else` on enable_thinking (defined or not, true,
 * false, not, and, or), and the text between tags under Jinja's whitespace rules as
 * Hugging Face sets them (trim_blocks, lstrip_blocks, '-' marks). Anything else in that
 * block is refused rather than guessed. */

/* One `{% %}`, `{{ }}` or `{# #}` tag of the template: [b, e) its inside, without the '-'
 * marks. Comments take the whitespace rules of block tags. */
struct jtag {
    const char *at, *end; /* the tag's first and one-past-last characters */
    const char *b, *e;    /* its inside, trimmed */
    bool block;           /* {% %} or {# #} (else {{ }}) */
    bool comment;         /* {# #} */
    bool dash_l, dash_r;  /* {%- / -%} */
};

/* The next tag at or after p, or false at the end / a broken tag. */
static bool next_tag(const char *p, struct jtag *t) {
    const char *a = strchr(p, '{');
    while (a && a[1] != '%' && a[1] != '{' && a[1] != '#')
        a = strchr(a + 1, '{');
    if (!a) return false;
    const char kind = a[1];
    const char *close = strstr(a + 2, kind == '%' ? "%}" : kind == '{' ? "}}" : "#}");
    if (!close) return false;
    t->at = a;
    t->end = close + 2;
    t->block = kind != '{';
    t->comment = kind == '#';
    t->b = a + 2;
    t->e = close;
    t->dash_l = t->b < t->e && (*t->b == '-' || *t->b == '+');
    if (t->dash_l) t->dash_l = *t->b++ == '-';
    t->dash_r = t->e > t->b && t->e[-1] == '-';
    if (t->dash_r) t->e--;
    while (t->b < t->e && (*t->b == ' ' || *t->b == '\t' || *t->b == '\n'))
        t->b++;
    while (t->e > t->b && (t->e[-1] == ' ' || t->e[-1] == '\t' || t->e[-1] == '\n'))
        t->e--;
    return true;
}

/* Does the tag's inside begin with word w (then a space or its end)? *rest: what follows. */
static bool tag_word(const struct jtag *t, const char *w, const char **rest) {
    const size_t n = strlen(w);
    if ((size_t)(t->e - t->b) < n || memcmp(t->b, w, n)) return false;
    if (t->b + n < t->e && t->b[n] != ' ' && t->b[n] != '\t' && t->b[n] != '\n') return false;
    if (rest) *rest = t->b + n;
    return true;
}

/* The text between two tags as Jinja outputs it (prev NULL: none before). */
static void put_between(struct json_buf *out, const struct jtag *prev, const char *b, const char *e,
                        const struct jtag *next) {
    if (prev && prev->dash_r) {
        while (b < e && (*b == ' ' || *b == '\t' || *b == '\n' || *b == '\r'))
            b++;
    } else if (prev && prev->block && b < e && *b == '\n') { // trim_blocks
        b++;
    }
    if (next->dash_l) {
        while (e > b && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r'))
            e--;
    } else if (next->block) { // lstrip_blocks: blanks from the line's start to the tag
        const char *q = e;
        while (q > b && (q[-1] == ' ' || q[-1] == '\t'))
            q--;
        if (q[-1] == '\n') e = q; // (a tag comes before: q is never the template's start)
    }
    put_n(out, b, (size_t)(e - b));
}

/* A condition on enable_thinking (-1 undefined, 0 false, 1 true), Jinja's way: words
 * separated by blanks, `not`, `and`, `or`, parentheses, and the atoms `enable_thinking`,
 * `enable_thinking is [not] defined|true|false|none`. Returns 0/1, -1 when not that. */
struct jcond {
    const char *p, *e;
    int et;
    bool bad;
};

static bool cond_word(struct jcond *c, const char *w) {
    while (c->p < c->e && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n'))
        c->p++;
    const size_t n = strlen(w);
    if ((size_t)(c->e - c->p) < n || memcmp(c->p, w, n)) return false;
    const char after = c->p + n < c->e ? c->p[n] : ' ';
    if (w[0] != '(' && w[0] != ')' && (isalnum((unsigned char)after) || after == '_')) return false;
    c->p += n;
    return true;
}

static bool cond_or(struct jcond *c);

static bool cond_atom(struct jcond *c) {
    if (cond_word(c, "not")) return !cond_atom(c);
    if (cond_word(c, "(")) {
        const bool v = cond_or(c);
        if (!cond_word(c, ")")) c->bad = true;
        return v;
    }
    if (!cond_word(c, "enable_thinking")) {
        c->bad = true;
        return false;
    }
    if (!cond_word(c, "is")) return c->et == 1; // truthiness: undefined and false are false
    const bool neg = cond_word(c, "not");
    bool v;
    if (cond_word(c, "defined"))
        v = c->et >= 0;
    else if (cond_word(c, "true"))
        v = c->et == 1;
    else if (cond_word(c, "false"))
        v = c->et == 0;
    else if (cond_word(c, "none"))
        v = false;
    else
        c->bad = true, v = false;
    return neg ? !v : v;
}

static bool cond_and(struct jcond *c) {
    bool v = cond_atom(c);
    while (cond_word(c, "and"))
        v = cond_atom(c) && v;
    return v;
}

static bool cond_or(struct jcond *c) {
    bool v = cond_and(c);
    while (cond_word(c, "or"))
        v = cond_and(c) || v;
    return v;
}

static int eval_cond(const char *b, const char *e, int enable_thinking) {
    struct jcond c = {b, e, enable_thinking, false};
    const bool v = cond_or(&c);
    while (c.p < c.e && (*c.p == ' ' || *c.p == '\t' || *c.p == '\n'))
        c.p++;
    return c.bad || c.p != c.e ? -1 : v;
}

/* A tag whose inside is one Jinja string literal: its decoded text into out. */
static bool put_literal(struct json_buf *out, const struct jtag *t) {
    const char *p = t->b;
    if (t->e - p < 2 || (*p != '\'' && *p != '"') || t->e[-1] != *p) return false;
    const char q = *p++;
    for (; p < t->e - 1; p++) {
        if (*p == q) return false; // two literals, or an operator between them
        if (*p != '\\') {
            put_n(out, p, 1);
            continue;
        }
        if (++p >= t->e - 1) return false;
        const char esc = *p == 'n' ? '\n' : *p == 't' ? '\t' : *p == 'r' ? '\r' : *p;
        if (!strchr("ntr\\'\"", *p)) return false;
        put_n(out, &esc, 1);
    }
    return true;
}

/* Run the template's generation-prompt block for enable_thinking into out. Returns 1 when
 * it ran, 0 when the template has no such block, -1 (why in *why) when the block holds
 * what is not run here. */
static int put_generation_prompt(struct json_buf *out, const char *tmpl, int enable_thinking,
                                 const char **why) {
    struct jtag t, prev;
    const char *p = tmpl;
    for (;;) { // the `if add_generation_prompt` tag
        if (!next_tag(p, &t)) return 0;
        const char *rest;
        if (t.block && !t.comment && tag_word(&t, "if", &rest) &&
            eval_cond(rest, t.e, 0) < 0 && // not a condition on enable_thinking
            t.e - rest >= 21 && !memcmp(t.e - 21, "add_generation_prompt", 21)) {
            const char *r = rest;
            while (r < t.e && (*r == ' ' || *r == '\t'))
                r++;
            if (r == t.e - 21) break;
        }
        p = t.end;
    }
    // Nested ifs: each level's state. active: this level writes; taken: a branch ran.
    bool active[16] = {true}, taken[16] = {true};
    int depth = 0;
    prev = t;
    for (;;) {
        if (!next_tag(prev.end, &t)) {
            *why = "its generation prompt block does not end";
            return -1;
        }
        const bool on = active[depth];
        if (on) put_between(out, &prev, prev.end, t.at, &t);
        const char *rest;
        if (t.comment) {
            // nothing written
        } else if (!t.block) {
            if (on && !put_literal(out, &t)) {
                *why = "its generation prompt writes more than string literals";
                return -1;
            }
        } else if (tag_word(&t, "if", &rest)) {
            const int v = eval_cond(rest, t.e, enable_thinking);
            if (v < 0 || depth == 15) {
                *why = "its generation prompt tests more than enable_thinking";
                return -1;
            }
            depth++;
            active[depth] = on && v;
            taken[depth] = v;
        } else if (tag_word(&t, "elif", &rest)) {
            const int v = eval_cond(rest, t.e, enable_thinking);
            if (v < 0 || depth == 0) {
                *why = "its generation prompt tests more than enable_thinking";
                return -1;
            }
            active[depth] = active[depth - 1] && !taken[depth] && v;
            taken[depth] = taken[depth] || v;
        } else if (tag_word(&t, "else", NULL) && depth > 0) {
            active[depth] = active[depth - 1] && !taken[depth];
            taken[depth] = true;
        } else if (tag_word(&t, "endif", NULL)) {
            if (depth == 0) return 1; // the block's own end
            depth--;
        } else {
            *why = "its generation prompt holds statements other than if and literals";
            return -1;
        }
        prev = t;
    }
}

/* Python's s.strip('\n') family on [*b, *e): drop newlines at the front / back. */
static void lstrip_nl(const char **b, const char *e) {
    while (*b < e && **b == '\n')
        (*b)++;
}
static void rstrip_nl(const char *b, const char **e) {
    while (*e > b && (*e)[-1] == '\n')
        (*e)--;
}

/* The last occurrence of needle in [b, e), or NULL. */
static const char *last_of(const char *b, const char *e, const char *needle) {
    const size_t n = strlen(needle);
    if ((size_t)(e - b) < n) return NULL;
    for (const char *p = e - n;; p--) {
        if (!memcmp(p, needle, n)) return p;
        if (p == b) return NULL;
    }
}

/* Length of the whitespace character at s (Python's str.isspace: ASCII \t-\r and space,
 * \x1c-\x1f, U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F,
 * U+3000), or 0. */
static int space_len(const unsigned char *s, const unsigned char *e) {
    if (s >= e) return 0;
    if ((*s >= 0x09 && *s <= 0x0d) || *s == ' ' || (*s >= 0x1c && *s <= 0x1f)) return 1;
    if (e - s >= 2 && s[0] == 0xc2 && (s[1] == 0x85 || s[1] == 0xa0)) return 2;
    if (e - s < 3) return 0;
    const unsigned cp = ((s[0] & 0x0fu) << 12) | ((s[1] & 0x3fu) << 6) | (s[2] & 0x3fu);
    if ((s[0] & 0xf0) != 0xe0 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80) return 0;
    return cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
                   cp == 0x202f || cp == 0x205f || cp == 0x3000
               ? 3
               : 0;
}

/* [*b, *e) with Python's str.strip(): whitespace dropped at both ends. */
static void strip_space(const char **b, const char **e) {
    int n;
    while ((n = space_len((const unsigned char *)*b, (const unsigned char *)*e)) > 0) *b += n;
    for (;;) { // the last character: step back over UTF-8 continuation bytes
        const char *p = *e;
        while (p > *b && ((unsigned char)p[-1] & 0xc0) == 0x80 && *e - p < 3) p--;
        if (p > *b) p--;
        if (p < *b || p == *e ||
            space_len((const unsigned char *)p, (const unsigned char *)*e) != *e - p)
            break;
        *e = p;
    }
}

static bool is_tool_response(const char *s) {
    static const char open[] = "<tool_response>", close[] = "</tool_response>";
    const size_t n = strlen(s);
    return !strncmp(s, open, strlen(open)) && n >= strlen(close) &&
           !strcmp(s + n - strlen(close), close);
}

/* An assistant turn as Qwen3's template writes it: the reasoning is the message's
 * reasoning_content, else what its content holds between <think> and the first </think>
 * (the content then being what follows the last </think>); after the last user query
 * the turn is "<think>\nREASONING\n</think>\n\nCONTENT" when it is the last message or
 * has reasoning, otherwise the content alone. */
static bool put_assistant_think(struct json_buf *b, const struct tok_message *m, bool after_query,
                                bool last) {
    const char *c = m->content ? m->content : "";
    const char *cb = c, *ce = c + strlen(c); // content
    const char *rb = "", *re = rb;           // reasoning
    if (m->reasoning_content) {
        rb = m->reasoning_content;
        re = rb + strlen(rb);
    } else {
        const char *first_end = strstr(c, "</think>");
        if (first_end) {
            cb = last_of(c, ce, "</think>") + strlen("</think>");
            lstrip_nl(&cb, ce);
            rb = c;
            re = first_end;
            rstrip_nl(rb, &re);
            const char *open = last_of(rb, re, "<think>");
            if (open) rb = open + strlen("<think>");
            lstrip_nl(&rb, re);
        }
    }
    const bool has_content = ce > cb; // the template's `content`, as its tool calls test it
    put(b, "<|im_start|>assistant\n");
    if (after_query && (last || re > rb)) {
        lstrip_nl(&rb, re);
        rstrip_nl(rb, &re);
        lstrip_nl(&cb, ce);
        put(b, "<think>\n");
        put_n(b, rb, (size_t)(re - rb));
        put(b, "\n</think>\n\n");
    }
    put_n(b, cb, (size_t)(ce - cb));
    return has_content;
}

/* The tools block's two literals around the definitions: the one that ends in "<tools>"
 * (*pre) and the one that begins "\n</tools>" (*post). False when the template lacks one. */
static bool tools_text(const char *tmpl, struct json_buf *pre, struct json_buf *post) {
    struct jtag t;
    for (const char *p = tmpl; next_tag(p, &t); p = t.end) {
        if (t.block) continue;
        struct json_buf lit = {0};
        if (put_literal(&lit, &t) && lit.p && !lit.failed) {
            if (!pre->p && lit.n >= 7 && !strcmp(lit.p + lit.n - 7, "<tools>")) {
                *pre = lit;
                continue;
            }
            if (!post->p && !strncmp(lit.p, "\n</tools>", 9)) {
                *post = lit;
                continue;
            }
        }
        free(lit.p);
    }
    return pre->p && post->p;
}

/* Qwen2.5's tools block without a system message: the literal of its `else` branch after
 * `{{- messages[0]['content'] }}`, malloc'd; NULL when the template is not so. */
static char *tools_default_system(const char *tmpl) {
    const char *at = strstr(tmpl, "{{- messages[0]['content'] }}");
    struct jtag t;
    if (!at || !next_tag(at, &t) || !next_tag(t.end, &t) || !t.block ||
        !tag_word(&t, "else", NULL) || !next_tag(t.end, &t) || t.block)
        return NULL;
    struct json_buf lit = {0};
    if (!put_literal(&lit, &t) || lit.failed) {
        free(lit.p);
        return NULL;
    }
    return lit.p ? lit.p : calloc(1, 1); // '' writes nothing
}

/* One tool call as the template writes it (Qwen3 prints string arguments as they are). */
static void put_tool_call(struct json_buf *b, const struct tok_tool_call *c, bool qwen3) {
    put(b, "<tool_call>\n{\"name\": \"");
    put(b, c->name);
    put(b, "\", \"arguments\": ");
    put(b, qwen3 && c->arguments_str ? c->arguments_str : c->arguments);
    put(b, "}\n</tool_call>");
}

int tok_apply_chat(const struct tokenizer *t, const struct tok_message *msgs, int n_msgs,
                   const struct tok_chat_opts *opts, char **out, size_t *n_bytes,
                   struct tpi_error *err) {
    static const struct tok_chat_opts plain = {.add_generation_prompt = true,
                                               .enable_thinking = -1};
    if (!opts) opts = &plain;
    *out = NULL;
    if (n_bytes) *n_bytes = 0;
    const char *tmpl = tok_chat_template(t);
    if (tmpl && !strstr(tmpl, IM_START))
        return tpi_err(err, TPI_ERR_UNSUPPORTED,
                       "tokenizer.chat_template is not ChatML (no '<|im_start|>'); only ChatML "
                       "chats are supported");
    if (tok_id_of(t, IM_START) < 0 || tok_id_of(t, IM_END) < 0)
        return tpi_err(err, TPI_ERR_UNSUPPORTED,
                       "the vocabulary has no '<|im_start|>'/'<|im_end|>' tokens, so it cannot "
                       "render ChatML%s",
                       tmpl ? "" : " (and tokenizer.chat_template is absent)");
    if (n_msgs < 0 || (n_msgs > 0 && !msgs))
        return tpi_err(err, TPI_ERR_INVALID, "tok_apply_chat: bad message list");
    if (opts->continue_final && (opts->add_generation_prompt || n_msgs == 0))
        return tpi_err(err, TPI_ERR_INVALID,
                       n_msgs ? "continuing the final message and adding a generation prompt "
                                "cannot go together"
                              : "no final message to continue");
    const unsigned d = chat_dialect(tmpl);
    for (int i = 0; i < n_msgs; i++) {
        const char *r = msgs[i].role;
        if (!r || !r[0]) return tpi_err(err, TPI_ERR_INVALID, "chat message %d has no role", i);
        if ((d & CHAT_ROLES_BY_NAME) && strcmp(r, "system") && strcmp(r, "user") &&
            strcmp(r, "assistant") && strcmp(r, "tool"))
            return tpi_err(err, TPI_ERR_UNSUPPORTED,
                           "chat message %d: the model's chat template renders no '%.32s' "
                           "messages (only system, user, assistant and tool)",
                           i, r);
    }
    const bool tools = opts->n_tools > 0;
    if (tools && (!opts->tools || !(d & (CHAT_TOOLS_Q25 | CHAT_TOOLS_Q3))))
        return tpi_err(err, TPI_ERR_UNSUPPORTED,
                       "the model's chat template has no tools block that tpinfer renders "
                       "(Qwen2.5's or Qwen3's)");
    for (int i = 0; i < n_msgs; i++) {
        if (msgs[i].n_tool_calls <= 0) continue;
        if (strcmp(msgs[i].role, "assistant") || !msgs[i].tool_calls)
            return tpi_err(err, TPI_ERR_INVALID,
                           "chat message %d: only assistant messages "
                           "carry tool calls",
                           i);
        if (!(d & (CHAT_CALLS_Q25 | CHAT_CALLS_Q3)))
            return tpi_err(err, TPI_ERR_UNSUPPORTED,
                           "chat message %d: the model's chat template writes no tool calls "
                           "in a form tpinfer renders (Qwen2.5's or Qwen3's)",
                           i);
    }
    // The last user query: Qwen3 renders the assistant turns after it with their reasoning.
    int last_query = n_msgs - 1;
    for (int i = n_msgs - 1; i >= 0; i--) {
        if (!strcmp(msgs[i].role, "user") &&
            !is_tool_response(msgs[i].content ? msgs[i].content : "")) {
            last_query = i;
            break;
        }
    }

    struct json_buf b = {0};
    const bool first_system = n_msgs > 0 && !strcmp(msgs[0].role, "system");
    if (tools) { // the system turn the tools block writes, with the first system message
        struct json_buf pre = {0}, post = {0};
        char *dflt = (d & CHAT_TOOLS_Q25) && !first_system ? tools_default_system(tmpl) : NULL;
        if (!tools_text(tmpl, &pre, &post) || ((d & CHAT_TOOLS_Q25) && !first_system && !dflt)) {
            free(pre.p), free(post.p), free(dflt);
            return tpi_err(err, TPI_ERR_UNSUPPORTED,
                           "the model's chat template has no tools block that tpinfer renders "
                           "(its text around the tools was not found)");
        }
        put(&b, "<|im_start|>system\n");
        if (first_system) put(&b, msgs[0].content ? msgs[0].content : "");
        if (first_system && (d & CHAT_TOOLS_Q3)) put(&b, "\n\n");
        if (dflt) put(&b, dflt);
        put(&b, pre.p);
        for (int k = 0; k < opts->n_tools; k++) {
            put(&b, "\n");
            put(&b, opts->tools[k] ? opts->tools[k] : "null");
        }
        put(&b, post.p);
        free(pre.p), free(post.p), free(dflt);
    }
    /* A conversation without a system message gets the template's default one, as the
     * template itself renders it. */
    char *sys = !tools && !first_system ? default_system(tmpl) : NULL;
    if (sys) {
        put(&b, IM_START);
        put(&b, "system\n");
        put(&b, sys);
        put(&b, IM_END);
        put(&b, "\n");
        free(sys);
    }
    for (int i = 0; i < n_msgs; i++) {
        const struct tok_message *m = &msgs[i];
        const char *content = m->content ? m->content : "";
        if (tools && i == 0 && first_system) continue; // written in the tools block
        if ((d & CHAT_TOOL_RESPONSE) && !strcmp(m->role, "tool")) {
            if (i == 0 || strcmp(msgs[i - 1].role, "tool")) put(&b, "<|im_start|>user");
            put(&b, "\n<tool_response>\n");
            put(&b, content);
            put(&b, "\n</tool_response>");
            if (i == n_msgs - 1 || strcmp(msgs[i + 1].role, "tool")) put(&b, "<|im_end|>\n");
            continue;
        }
        if ((d & CHAT_THINK) && !strcmp(m->role, "assistant")) {
            const bool has_content = put_assistant_think(&b, m, i > last_query, i == n_msgs - 1);
            for (int k = 0; k < m->n_tool_calls; k++) {
                if (k > 0 || has_content) put(&b, "\n");
                put_tool_call(&b, &m->tool_calls[k], true);
            }
        } else if (m->n_tool_calls > 0) { // Qwen2.5's (checked above)
            put(&b, "<|im_start|>assistant");
            if (content[0]) put(&b, "\n"), put(&b, content);
            for (int k = 0; k < m->n_tool_calls; k++) {
                put(&b, "\n");
                put_tool_call(&b, &m->tool_calls[k], false);
            }
        } else if ((d & CHAT_DROP_THINK) && !strcmp(m->role, "assistant")) {
            const char *cb = content, *ce = content + strlen(content);
            const char *end = last_of(cb, ce, "</think>");
            if (end) cb = end + strlen("</think>");
            lstrip_nl(&cb, ce);
            put(&b, "<|im_start|>assistant\n");
            put_n(&b, cb, (size_t)(ce - cb));
        } else {
            put(&b, IM_START);
            put(&b, m->role);
            put(&b, "\n");
            put(&b, content);
        }
        put(&b, IM_END);
        put(&b, "\n");
    }
    if (opts->add_generation_prompt) {
        const char *why = NULL;
        int ran = tmpl ? put_generation_prompt(&b, tmpl, opts->enable_thinking, &why) : 0;
        if (ran == 0 && tmpl && strstr(tmpl, "add_generation_prompt")) {
            why = "its generation prompt is not one plain `if add_generation_prompt` block";
            ran = -1;
        }
        if (ran < 0) {
            free(b.p);
            return tpi_err(err, TPI_ERR_UNSUPPORTED,
                           "tokenizer.chat_template: %s, which tpinfer does not render", why);
        }
        if (!tmpl) put(&b, "<|im_start|>assistant\n"); // plain ChatML without a template
    }
    if (!b.p) put(&b, ""); // an empty conversation without a prompt: ""
    if (b.failed) {
        free(b.p);
        return tpi_err(err, TPI_ERR_NOMEM, "tok_apply_chat: out of memory");
    }
    if (opts->continue_final) { // cut after the last place the stripped content stands
        const char *fb = msgs[n_msgs - 1].content ? msgs[n_msgs - 1].content : "";
        const char *fe = fb + strlen(fb);
        strip_space(&fb, &fe);
        const char *at = b.p + b.n; // nothing left of it: Python's rindex("") is the end
        if (fe > fb) {
            char *want = malloc((size_t)(fe - fb) + 1);
            if (!want) {
                free(b.p);
                return tpi_err(err, TPI_ERR_NOMEM, "tok_apply_chat: out of memory");
            }
            memcpy(want, fb, (size_t)(fe - fb));
            want[fe - fb] = '\0';
            at = last_of(b.p, b.p + b.n, want);
            free(want);
            if (at) at += fe - fb;
        }
        if (!at) {
            free(b.p);
            return tpi_err(err, TPI_ERR_INVALID,
                           "the final message does not appear in the rendered chat, so it "
                           "cannot be continued (the template changes it)");
        }
        b.n = (size_t)(at - b.p);
        b.p[b.n] = '\0';
    }
    *out = b.p;
    if (n_bytes) *n_bytes = b.n;
    return TPI_OK;
}
