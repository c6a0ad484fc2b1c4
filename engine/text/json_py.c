/*
 * json_py.c — JSON text scanned in place and printed as Python's json.dumps prints it
 * (json_py.h). One recursive scanner validates a value and, when given a buffer, writes
 * it out: strings decoded and escaped again the Python way, integers as written (bar
 * "-0"), floats parsed and written in Python's repr, an object's repeated key printed as
 * Python's dict keeps it (its first place, its last value).
 */
#include "text/json_py.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tpi.h"

enum { JSON_MAX_DEPTH = 512 };

void json_buf_put(struct json_buf *b, const char *s, size_t n) {
    if (b->failed) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 128;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->failed = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void put_s(struct json_buf *b, const char *s) {
    json_buf_put(b, s, strlen(s));
}

static const char *skip_ws(const char *p, const char *e) {
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

static bool hex4(const char *p, const char *e, unsigned *out) {
    if (e - p < 4) return false;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        const int h = tpi_hex_digit(p[i]);
        if (h < 0) return false;
        v = v << 4 | (unsigned)h;
    }
    *out = v;
    return true;
}

static size_t utf8_put(char *o, unsigned cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18);
    o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* The string starting at p (its opening quote): one past its closing quote, or NULL when
 * invalid. With `dec`, its decoded bytes are appended there, and a \u0000 is refused too;
 * *why names a lone surrogate or that NUL, which Python could hold but the engine's C
 * strings cannot. */
static const char *scan_string(const char *p, const char *e, struct json_buf *dec,
                               const char **why) {
    if (p >= e || *p != '"') return NULL;
    p++;
    while (p < e && *p != '"') {
        const unsigned char c = (unsigned char)*p;
        if (c < 0x20) return NULL; // raw control characters are not JSON
        if (c != '\\') {
            const char *run = p;
            while (p < e && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20)
                p++;
            if (dec) json_buf_put(dec, run, (size_t)(p - run));
            continue;
        }
        if (++p >= e) return NULL;
        char one = 0;
        switch (*p) {
        case '"':
            one = '"';
            break;
        case '\\':
            one = '\\';
            break;
        case '/':
            one = '/';
            break;
        case 'b':
            one = '\b';
            break;
        case 'f':
            one = '\f';
            break;
        case 'n':
            one = '\n';
            break;
        case 'r':
            one = '\r';
            break;
        case 't':
            one = '\t';
            break;
        case 'u':
            break;
        default:
            return NULL;
        }
        if (one) {
            if (dec) json_buf_put(dec, &one, 1);
            p++;
            continue;
        }
        unsigned cp;
        if (!hex4(p + 1, e, &cp)) return NULL;
        p += 5;
        if (cp >= 0xD800 && cp < 0xDC00) { // a high surrogate: its low half must follow
            unsigned lo;
            if (e - p < 6 || p[0] != '\\' || p[1] != 'u' || !hex4(p + 2, e, &lo) || lo < 0xDC00 ||
                lo >= 0xE000) {
                if (why) *why = "a string holds a lone UTF-16 surrogate";
                return NULL;
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            p += 6;
        } else if (cp >= 0xDC00 && cp < 0xE000) {
            if (why) *why = "a string holds a lone UTF-16 surrogate";
            return NULL;
        } else if (cp == 0 && dec) { // valid JSON, but not in a decoded C string
            if (why) *why = "a string holds a NUL character";
            return NULL;
        }
        char u[4];
        if (dec) json_buf_put(dec, u, utf8_put(u, cp));
    }
    return p < e ? p + 1 : NULL;
}

void json_py_put_string(struct json_buf *b, const char *s) {
    put_s(b, "\"");
    for (const char *p = s; *p;) {
        const char *run = p;
        while (*p && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20)
            p++;
        json_buf_put(b, run, (size_t)(p - run));
        if (!*p) break;
        const unsigned char c = (unsigned char)*p++;
        static const char from[] = "\"\\\n\r\t\b\f", to[] = "\"\\nrtbf";
        const char *k = strchr(from, c); // c is not NUL
        char esc[8];
        if (k)
            snprintf(esc, sizeof esc, "\\%c", to[k - from]);
        else
            snprintf(esc, sizeof esc, "\\u%04x", c);
        put_s(b, esc);
    }
    put_s(b, "\"");
}

/* A float as Python's repr writes it: the shortest digits that read back as the same
 * double, in positional form for decimal exponents -4..15 and as d.ddde+XX otherwise. */
void json_py_put_float(struct json_buf *b, double v) {
    if (isinf(v)) { // json.loads("1e999") is inf, and json.dumps writes it so
        put_s(b, v < 0 ? "-Infinity" : "Infinity");
        return;
    }
    char s[40];
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(s, sizeof s, "%.*e", prec - 1, v);
        if (strtod(s, NULL) == v) break;
    }
    // s is [-]d[.ddd]e[+-]XX: the digits and the exponent of the first one
    const char *q = s;
    char out[64];
    size_t o = 0;
    if (*q == '-') out[o++] = *q++;
    char dig[20];
    int nd = 0;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') dig[nd++] = *q;
    while (nd > 1 && dig[nd - 1] == '0')
        nd--;
    const int exp10 = atoi(q + 1);
    const int decpt = exp10 + 1; // digits are 0.d1d2... * 10^decpt
    if (decpt <= -4 || decpt > 16) {
        out[o++] = dig[0];
        if (nd > 1) {
            out[o++] = '.';
            for (int i = 1; i < nd; i++)
                out[o++] = dig[i];
        }
        o += (size_t)snprintf(out + o, sizeof out - o, "e%c%02d", exp10 < 0 ? '-' : '+',
                              exp10 < 0 ? -exp10 : exp10);
    } else if (decpt <= 0) {
        out[o++] = '0';
        out[o++] = '.';
        for (int i = 0; i < -decpt; i++)
            out[o++] = '0';
        for (int i = 0; i < nd; i++)
            out[o++] = dig[i];
    } else {
        for (int i = 0; i < decpt; i++)
            out[o++] = i < nd ? dig[i] : '0';
        out[o++] = '.';
        if (decpt >= nd) out[o++] = '0';
        for (int i = decpt; i < nd; i++)
            out[o++] = dig[i];
    }
    json_buf_put(b, out, o);
}

/* A number starting at p: one past it, or NULL. With `out`, written as Python would. */
static const char *scan_number(const char *p, const char *e, struct json_buf *out) {
    const char *s = p;
    if (p < e && *p == '-') p++;
    if (p >= e || *p < '0' || *p > '9') return NULL;
    if (*p == '0') {
        p++;
    } else {
        while (p < e && *p >= '0' && *p <= '9')
            p++;
    }
    bool is_float = false;
    if (p < e && *p == '.') {
        is_float = true;
        if (++p >= e || *p < '0' || *p > '9') return NULL;
        while (p < e && *p >= '0' && *p <= '9')
            p++;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        is_float = true;
        if (++p < e && (*p == '+' || *p == '-')) p++;
        if (p >= e || *p < '0' || *p > '9') return NULL;
        while (p < e && *p >= '0' && *p <= '9')
            p++;
    }
    if (!out) return p;
    if (!is_float) { // Python's int: as written, except that -0 is 0
        if (p - s == 2 && s[0] == '-' && s[1] == '0')
            put_s(out, "0");
        else
            json_buf_put(out, s, (size_t)(p - s));
        return p;
    }
    char tmp[512];
    const size_t n = (size_t)(p - s);
    char *t = n < sizeof tmp ? tmp : malloc(n + 1);
    if (!t) {
        out->failed = true;
        return p;
    }
    memcpy(t, s, n);
    t[n] = '\0';
    json_py_put_float(out, strtod(t, NULL));
    if (t != tmp) free(t);
    return p;
}

/* One member of an object being printed: its decoded key, its place, and where its
 * value was printed in the buffer ([vb, ve) offsets). */
struct py_member {
    char *key;
    size_t at, vb, ve;
};

static int cmp_members(const void *a, const void *b) {
    const struct py_member *x = a, *y = b;
    const int c = strcmp(x->key, y->key);
    return c ? c : (x->at > y->at) - (x->at < y->at);
}

/* The object printed at out->p[start..] with its n members m (in place order) printed
 * again as Python's dict keeps a repeated key: at its first place, with its last value.
 * Nothing is done when no key repeats. m is left sorted by key. */
static void keep_last_values(struct json_buf *out, size_t start, struct py_member *m, size_t n) {
    qsort(m, n, sizeof *m, cmp_members);
    bool repeats = false;
    for (size_t i = 0; i + 1 < n && !repeats; i++)
        repeats = !strcmp(m[i].key, m[i + 1].key);
    if (!repeats) return;
    size_t *value_at = malloc(n * sizeof *value_at); // by place: the member whose value
    char *was = malloc(out->n - start);              // prints there, SIZE_MAX none
    if (!value_at || !was) {
        out->failed = true;
    } else {
        memcpy(was, out->p + start, out->n - start);
        for (size_t i = 0; i < n; i++)
            value_at[i] = SIZE_MAX;
        for (size_t i = 0; i < n;) { // a run of one key: the first place, the last value
            size_t j = i;
            while (j + 1 < n && !strcmp(m[j + 1].key, m[i].key))
                j++;
            value_at[m[i].at] = j;
            i = j + 1;
        }
        out->n = start;
        put_s(out, "{");
        bool first = true;
        for (size_t at = 0; at < n; at++) {
            if (value_at[at] == SIZE_MAX) continue;
            const struct py_member *v = &m[value_at[at]];
            put_s(out, first ? "" : ", ");
            first = false;
            json_py_put_string(out, v->key);
            put_s(out, ": ");
            json_buf_put(out, was + (v->vb - start), v->ve - v->vb);
        }
        put_s(out, "}");
    }
    free(value_at);
    free(was);
}

static const char *scan_value(const char *p, const char *e, struct json_buf *out, int depth,
                              const char **why);

/* The object whose '{' is at p printed as Python prints the dict json.loads makes of it
 * (keep_last_values). One past the object, or NULL when invalid or out of memory. */
static const char *print_object(const char *p, const char *e, struct json_buf *out, int depth,
                                const char **why) {
    const size_t start = out->n;
    struct py_member *m = NULL;
    size_t n = 0, cap = 0;
    const char *res = NULL;
    put_s(out, "{");
    p = skip_ws(p + 1, e);
    if (p < e && *p == '}') res = p + 1;
    while (!res) {
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            struct py_member *q = realloc(m, cap * sizeof *q);
            if (!q) {
                out->failed = true;
                break;
            }
            m = q;
        }
        struct json_buf key = {0};
        const char *ke = scan_string(skip_ws(p, e), e, &key, why);
        struct py_member *it = &m[n++];
        *it = (struct py_member){.key = key.p ? key.p : calloc(1, 1), .at = n - 1};
        if (!it->key || key.failed) out->failed = true;
        if (!ke || out->failed) break;
        p = skip_ws(ke, e);
        if (p >= e || *p != ':') break;
        put_s(out, n > 1 ? ", " : "");
        json_py_put_string(out, it->key);
        put_s(out, ": ");
        it->vb = out->n;
        p = scan_value(p + 1, e, out, depth + 1, why);
        it->ve = out->n;
        if (!p) break;
        p = skip_ws(p, e);
        if (p < e && *p == ',') {
            p++;
        } else {
            if (p < e && *p == '}') res = p + 1;
            break;
        }
    }
    put_s(out, "}");
    if (res && n > 1 && !out->failed) keep_last_values(out, start, m, n);
    for (size_t i = 0; i < n; i++)
        free(m[i].key);
    free(m);
    return out->failed ? NULL : res;
}

/* One value starting at the first non-space of [p, e): one past it, or NULL (*why set
 * for a lone surrogate, a NUL or nesting too deep). With `out`, printed the Python way. */
static const char *scan_value(const char *p, const char *e, struct json_buf *out, int depth,
                              const char **why) {
    p = skip_ws(p, e);
    if (p >= e) return NULL;
    switch (*p) {
    case '"': {
        if (!out) return scan_string(p, e, NULL, why);
        struct json_buf dec = {0};
        const char *end = scan_string(p, e, &dec, why);
        if (end) json_py_put_string(out, dec.p ? dec.p : "");
        if (dec.failed) out->failed = true;
        free(dec.p);
        return end;
    }
    case '{':
    case '[': {
        if (depth >= JSON_MAX_DEPTH) {
            if (why) *why = "nesting deeper than 512";
            return NULL;
        }
        const bool obj = *p == '{';
        if (obj && out) return print_object(p, e, out, depth, why);
        const char close = obj ? '}' : ']';
        if (out) json_buf_put(out, p, 1);
        p = skip_ws(p + 1, e);
        if (p < e && *p == close) {
            if (out) json_buf_put(out, &close, 1);
            return p + 1;
        }
        for (bool first = true;; first = false) {
            if (!first && out) put_s(out, ", ");
            if (obj) {
                const char *ke = scan_string(skip_ws(p, e), e, NULL, why);
                if (!ke) return NULL;
                p = skip_ws(ke, e);
                if (p >= e || *p != ':') return NULL;
                p++;
            }
            p = scan_value(p, e, out, depth + 1, why);
            if (!p) return NULL;
            p = skip_ws(p, e);
            if (p < e && *p == ',') {
                p++;
                continue;
            }
            if (p < e && *p == close) {
                if (out) json_buf_put(out, &close, 1);
                return p + 1;
            }
            return NULL;
        }
    }
    case 't':
    case 'f':
    case 'n':
    case 'N':
    case 'I':
    case '-': {
        // Python's json.loads also takes NaN, Infinity and -Infinity, and json.dumps
        // writes them back as such.
        static const char *const lits[] = {"true", "false", "null", "NaN", "Infinity", "-Infinity"};
        if (*p == '-' && (e - p < 2 || p[1] != 'I')) return scan_number(p, e, out);
        for (int i = 0; i < 6; i++) {
            const size_t n = strlen(lits[i]);
            if ((size_t)(e - p) >= n && !memcmp(p, lits[i], n)) {
                if (out) json_buf_put(out, p, n);
                return p + n;
            }
        }
        return NULL;
    }
    default:
        return scan_number(p, e, out);
    }
}

const char *json_value_end(const char *p, const char *e) {
    return scan_value(p, e, NULL, 0, NULL);
}

/* [b, e) with the spaces around it dropped: one whole value? */
static bool whole_value(const char **b, const char **e) {
    const char *p = skip_ws(*b, *e);
    const char *end = json_value_end(p, *e);
    if (!end || skip_ws(end, *e) != *e) return false;
    *b = p;
    *e = end;
    return true;
}

bool json_is_object(const char *b, const char *e) {
    return whole_value(&b, &e) && *b == '{';
}

bool json_is_string(const char *b, const char *e) {
    return whole_value(&b, &e) && *b == '"';
}

bool json_is_null(const char *b, const char *e) {
    return whole_value(&b, &e) && *b == 'n';
}

char *json_string_value(const char *b, const char *e) {
    if (!whole_value(&b, &e) || *b != '"') return NULL;
    struct json_buf dec = {0};
    if (!scan_string(b, e, &dec, NULL) || dec.failed) {
        free(dec.p);
        return NULL;
    }
    return dec.p ? dec.p : calloc(1, 1);
}

/* Walk the members (obj) or elements of the container [b, e): calls `hit` for each with
 * its key's text (NULL for arrays) and value; stops when it returns true. */
static bool walk(const char *b, const char *e, bool obj,
                 bool (*hit)(void *ctx, const char *kb, const char *ke, const char *vb,
                             const char *ve),
                 void *ctx) {
    if (!whole_value(&b, &e) || *b != (obj ? '{' : '[')) return false;
    const char *p = skip_ws(b + 1, e);
    if (*p == (obj ? '}' : ']')) return false;
    for (;;) {
        const char *kb = NULL, *ke = NULL;
        if (obj) {
            kb = skip_ws(p, e);
            ke = scan_string(kb, e, NULL, NULL);
            p = skip_ws(ke, e) + 1; // past ':' (the whole value was checked)
        }
        const char *vb = skip_ws(p, e), *ve = json_value_end(vb, e);
        if (hit(ctx, kb, ke, vb, ve)) return true;
        p = skip_ws(ve, e);
        if (*p != ',') return false;
        p++;
    }
}

struct member_ctx {
    const char *key;
    const char *vb, *ve;
    bool found;
};

static bool member_hit(void *ctx, const char *kb, const char *ke, const char *vb, const char *ve) {
    struct member_ctx *m = ctx;
    struct json_buf dec = {0};
    if (scan_string(kb, ke, &dec, NULL) && !dec.failed && !strcmp(dec.p ? dec.p : "", m->key)) {
        m->vb = vb;
        m->ve = ve;
        m->found = true; // go on: a later repeat is the one json.loads keeps
    }
    free(dec.p);
    return false;
}

bool json_member(const char *b, const char *e, const char *key, const char **vb, const char **ve) {
    struct member_ctx m = {.key = key};
    walk(b, e, true, member_hit, &m);
    if (m.found) *vb = m.vb, *ve = m.ve;
    return m.found;
}

struct other_ctx {
    const char *const *names;
    char *other;
};

static bool other_hit(void *ctx, const char *kb, const char *ke, const char *vb, const char *ve) {
    (void)vb, (void)ve;
    struct other_ctx *o = ctx;
    struct json_buf dec = {0};
    scan_string(kb, ke, &dec, NULL);
    const char *k = dec.p ? dec.p : "";
    for (const char *const *n = o->names; *n; n++) {
        if (!strcmp(*n, k)) {
            free(dec.p);
            return false;
        }
    }
    o->other = dec.p ? dec.p : calloc(1, 1);
    return true;
}

char *json_other_member(const char *b, const char *e, const char *const *names) {
    struct other_ctx o = {.names = names};
    walk(b, e, true, other_hit, &o);
    return o.other;
}

struct items_ctx {
    const char **vb, **ve;
    int max, n;
};

static bool items_hit(void *ctx, const char *kb, const char *ke, const char *vb, const char *ve) {
    (void)kb, (void)ke;
    struct items_ctx *it = ctx;
    if (it->n < it->max) it->vb[it->n] = vb, it->ve[it->n] = ve;
    it->n++;
    return false;
}

int json_items(const char *b, const char *e, const char **vb, const char **ve, int max) {
    const char *p = b, *q = e;
    if (!whole_value(&p, &q) || *p != '[') return -1;
    struct items_ctx it = {.vb = vb, .ve = ve, .max = max};
    walk(b, e, false, items_hit, &it);
    return it.n;
}

bool json_py_put(struct json_buf *b, const char *vb, const char *ve, const char **why) {
    const char *w = NULL;
    const size_t n0 = b->n;
    const char *p = skip_ws(vb, ve);
    const char *end = scan_value(p, ve, b, 0, &w);
    if (end && skip_ws(end, ve) == ve && !b->failed) return true;
    if (why) *why = b->failed ? "out of memory" : w ? w : "not one valid JSON value";
    if (b->p) b->p[b->n = n0] = '\0'; // what it had appended taken back
    return false;
}

char *json_py_dumps(const char *b, const char *e, const char **why) {
    struct json_buf out = {0};
    if (!json_py_put(&out, b, e, why)) {
        free(out.p);
        return NULL;
    }
    return out.p;
}

bool json_text_holds_nul(const char *s, size_t n) {
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '"') in_str = !in_str;
        else if (in_str && s[i] == '\\' && ++i < n && s[i] == 'u' && i + 4 < n &&
                 !memcmp(s + i + 1, "0000", 4))
            return true;
    }
    return false;
}
