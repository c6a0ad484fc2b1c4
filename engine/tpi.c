/*
 * tpi.c — implementation of the project-wide basics in tpi.h: error records,
 * stderr logging with a rank prefix, clocks, core count, hashing, a whole-input JSON
 * parse, f16/bf16.
 */
#define _GNU_SOURCE
#include "tpi.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int tpi_err(struct tpi_error *err, int status, const char *fmt, ...) {
    if (err) {
        err->status = status;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return status;
}

int tpi_err_wrap(struct tpi_error *err, const char *fmt, ...) {
    if (!err) return TPI_ERR_INVALID;
    char prefix[512], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    snprintf(err->msg, sizeof err->msg, "%s: %s", prefix, old);
    return err->status;
}

void tpi_err_clear(struct tpi_error *err) {
    if (err) {
        err->status = TPI_OK;
        err->msg[0] = '\0';
    }
}

const char *tpi_status_name(int status) {
    static const char *names[] = {"ok",   "io",   "format", "invalid", "nomem", "unsupported",
                                  "comm", "cuda", "timeout", "interrupted"};
    if (status >= 0 && status < (int)(sizeof names / sizeof names[0])) return names[status];
    return "error";
}

/* Process-wide logging settings: set once at start-up by the CLI. */
static int g_log_level = TPI_LOG_INFO;
static int g_log_rank = -1;

void tpi_log_set(int level, int rank) {
    g_log_level = level;
    g_log_rank = rank;
}

void tpi_log(int level, const char *fmt, ...) {
    if (level > g_log_level) return;
    static const char *tags[] = {"error: ", "warning: ", "", ""};
    char line[2048];
    int off = 0;
    if (g_log_rank >= 0) off = snprintf(line, sizeof line, "[rank %d] ", g_log_rank);
    off += snprintf(line + off, sizeof line - (size_t)off, "%s", tags[level & 3]);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + off, sizeof line - (size_t)off, fmt, ap);
    va_end(ap);
    /* One fputs per line so ranks sharing a terminal do not interleave mid-line. */
    size_t n = strlen(line);
    if (n + 1 < sizeof line && (n == 0 || line[n - 1] != '\n')) {
        line[n] = '\n';
        line[n + 1] = '\0';
    }
    fputs(line, stderr);
    fflush(stderr);
}

char *tpi_strdup(const char *s) {
    const size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

double tpi_time_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int tpi_cpu_count(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

char *tpi_read_stream(FILE *f, size_t *n) {
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    if (!buf) return errno = ENOMEM, NULL;
    for (;;) {
        if (len + 1 == cap) {
            char *p = realloc(buf, cap *= 2);
            if (!p) { /* the whole stream or nothing: no short text */
                free(buf);
                return errno = ENOMEM, NULL;
            }
            buf = p;
        }
        errno = 0;
        const size_t got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        const int e = errno ? errno : EIO;
        free(buf);
        return errno = e, NULL;
    }
    buf[len] = '\0';
    *n = len;
    return buf;
}

struct json_member_at {
    cJSON *item;
    size_t at;
};

static const char *json_key(const cJSON *c) {
    return c->string ? c->string : "";
}

static int cmp_member_at(const void *a, const void *b) {
    const struct json_member_at *x = a, *y = b;
    const int c = strcmp(json_key(x->item), json_key(y->item));
    return c ? c : (x->at > y->at) - (x->at < y->at);
}

/* Every object under v (v included) made what Python's json.loads makes of it: a repeated
 * key keeps its first place and its last value. False when memory ran out. */
static bool json_last_wins(cJSON *v) {
    if (!cJSON_IsObject(v) && !cJSON_IsArray(v)) return true;
    size_t n = 0;
    for (cJSON *c = v->child; c; c = c->next) {
        if (!json_last_wins(c)) return false;
        n++;
    }
    if (!cJSON_IsObject(v) || n < 2) return true;
    struct json_member_at *m = malloc(n * sizeof *m);
    if (!m) return false;
    size_t i = 0;
    for (cJSON *c = v->child; c; c = c->next, i++)
        m[i] = (struct json_member_at){c, i};
    qsort(m, n, sizeof *m, cmp_member_at);
    for (i = 0; i < n;) {
        size_t j = i;
        while (j + 1 < n && !strcmp(json_key(m[j + 1].item), json_key(m[i].item)))
            j++;
        if (j > i) { // m[i] holds the first place, m[j] the last value; the rest go
            for (size_t k = i + 1; k < j; k++)
                cJSON_Delete(cJSON_DetachItemViaPointer(v, m[k].item));
            cJSON *last = cJSON_DetachItemViaPointer(v, m[j].item);
            cJSON_ReplaceItemViaPointer(v, m[i].item, last);
        }
        i = j + 1;
    }
    free(m);
    return true;
}

struct cJSON *tpi_json_parse(const char *text, size_t len) {
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!j) return NULL;
    const char *stop = text + len;
    while (end < stop && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r'))
        end++;
    if (end < stop && !(*end == '\0' && end + 1 == stop)) { /* something after the value */
        cJSON_Delete(j);
        return NULL;
    }
    if (!json_last_wins(j)) {
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

int tpi_utf8_scan(const unsigned char *p, size_t n, int *len) {
    const unsigned c = p[0];
    const int k = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3
                             : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    *len = k;
    unsigned lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80;
    unsigned hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
    int m = 1;
    for (; m < k && (size_t)m < n && p[m] >= lo && p[m] <= hi; m++)
        lo = 0x80, hi = 0xbf;
    return m;
}

size_t tpi_utf8_bad(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        int k;
        const int m = tpi_utf8_scan((const unsigned char *)s + i, n - i, &k);
        if (m != k) return i;
        i += (size_t)m;
    }
    return n;
}

int tpi_hex_digit(char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

char *tpi_utf8_fix(const char *s, size_t n, size_t *out_n) {
    char *o = malloc(n * 3 + 1);
    if (!o) return NULL;
    size_t no = 0;
    for (size_t i = 0; i < n;) {
        int k;
        const int m = tpi_utf8_scan((const unsigned char *)s + i, n - i, &k);
        if (m == k) {
            memcpy(o + no, s + i, (size_t)k), no += (size_t)k;
        } else {
            memcpy(o + no, "\xef\xbf\xbd", 3), no += 3;
        }
        i += (size_t)m;
    }
    o[no] = '\0';
    *out_n = no;
    return o;
}

struct cJSON *tpi_json_text(const char *s, size_t n) {
    const bool has_nul = memchr(s, 0, n) != NULL;
    /* no NUL: cJSON's own string, from a terminated copy; else the quoted text by hand,
     * escaped as cJSON's printer escapes (", \\, \b \f \n \r \t, other controls as \u00XX) */
    char *b = malloc(has_nul ? n * 6 + 3 : n + 1);
    if (!b) return NULL;
    cJSON *j;
    if (!has_nul) {
        memcpy(b, s, n);
        b[n] = '\0';
        j = cJSON_CreateString(b);
    } else {
        static const char hex[] = "0123456789abcdef";
        size_t o = 0;
        b[o++] = '"';
        for (size_t i = 0; i < n; i++) {
            const unsigned char c = (unsigned char)s[i];
            const char *e = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\b' ? "\\b"
                          : c == '\f' ? "\\f" : c == '\n' ? "\\n" : c == '\r' ? "\\r"
                          : c == '\t' ? "\\t" : NULL;
            if (e) {
                b[o++] = e[0], b[o++] = e[1];
            } else if (c < 32) {
                memcpy(b + o, "\\u00", 4), o += 4;
                b[o++] = hex[c >> 4], b[o++] = hex[c & 15];
            } else {
                b[o++] = (char)c;
            }
        }
        b[o++] = '"';
        b[o] = '\0';
        j = cJSON_CreateRaw(b);
    }
    free(b);
    return j;
}

#ifdef TPI_CPU_AVX2
int tpi_cpu_avx2(void) {
    static int known = -1; /* a race here only writes the same value twice */
    int v = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (v < 0) {
        const char *e = getenv("TPI_CPU_BASELINE");
        v = __builtin_cpu_supports("avx2") && !(e && *e && strcmp(e, "0"));
        __atomic_store_n(&known, v, __ATOMIC_RELAXED);
    }
    return v;
}
#endif

uint64_t tpi_fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

float tpi_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t tpi_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0));
    if (absx >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* overflow to inf */
    if (absx < 0x38800000u) { /* result is subnormal or zero */
        float a;
        memcpy(&a, &absx, 4);
        /* 2^-24 is the smallest f16 subnormal; rint gives round-to-nearest-even. */
        uint32_t m = (uint32_t)rintf(a * 16777216.0f);
        return (uint16_t)(sign | m);
    }
    uint32_t mant = absx & 0x7fffff;
    uint32_t e = (absx >> 23) - 127 + 15;
    uint32_t h = (e << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++; /* carries into exponent correctly */
    return (uint16_t)(sign | h);
}

float tpi_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t tpi_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* quiet nan */
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}
