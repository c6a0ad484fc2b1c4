/*
 * cmd_tokenize.c — `tpinfer tokenize`: token ids of text with a model's
 * vocabulary (vocab-only GGUFs work: no tensor is read).
 *
 *   tpinfer tokenize -m FILE --text "..."   one JSON array of ids on stdout
 *   tpinfer tokenize -m FILE --jsonl IN     per {"text": ...} line, {"ids": [...]};
 *                                           a bad line gives {"error": "line N: ..."}
 *                                           and the rest go on (exit 1 at the end)
 * Added tokens written in the text (<|im_start|>) become their ids; with
 * --no-special CONTROL tokens stay text (USER_DEFINED ones such as <think> are
 * still split out, as Hugging Face and llama.cpp do).
 */
#define _GNU_SOURCE /* getline */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "gguf.h"
#include "text/tokenizer.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: tpinfer tokenize -m FILE (--text TEXT | --jsonl IN) [--no-special]\n"
            "  -m, --model FILE  GGUF with a tokenizer.ggml.* vocabulary (tensors not needed)\n"
            "  --text TEXT       print TEXT's ids as one JSON array\n"
            "  --jsonl IN        read {\"text\": ...} lines from IN ('-' for stdin), write one\n"
            "                    {\"ids\": [...]} line each; a bad line gives {\"error\": ...}\n"
            "  --no-special      control tokens written in the text stay plain text\n");
}

/* Write ids as a JSON array (no spaces) to `out`. */
static void print_ids(FILE *out, const int32_t *ids, int n) {
    fputc('[', out);
    for (int i = 0; i < n; i++)
        fprintf(out, i ? ",%d" : "%d", ids[i]);
    fputc(']', out);
}

/* One {"error": "line N: msg"} line, JSON-escaped by cJSON. */
static void print_error_line(long lineno, const char *msg) {
    char buf[1200];
    snprintf(buf, sizeof buf, "line %ld: %s", lineno, msg);
    cJSON *o = cJSON_CreateObject();
    char *s = NULL;
    if (o && cJSON_AddStringToObject(o, "error", buf)) s = cJSON_PrintUnformatted(o);
    if (s)
        printf("%s\n", s);
    else
        printf("{\"error\":\"line %ld: out of memory\"}\n", lineno);
    free(s);
    cJSON_Delete(o);
}

static int run_jsonl(const struct tokenizer *t, const char *in_path, bool special) {
    FILE *in = strcmp(in_path, "-") == 0 ? stdin : fopen(in_path, "r");
    if (!in) {
        fprintf(stderr, "tpinfer tokenize: cannot open %s: %s\n", in_path, strerror(errno));
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long lineno = 0, n_bad = 0;
    errno = 0;
    while ((n = getline(&line, &cap, in)) > 0) {
        lineno++;
        cJSON *j = tpi_json_parse(line, (size_t)n);
        const cJSON *jt = j ? cJSON_GetObjectItemCaseSensitive(j, "text") : NULL;
        if (!j || !cJSON_IsString(jt)) {
            print_error_line(lineno, !j ? "not valid JSON" : "no \"text\" string");
            n_bad++;
            cJSON_Delete(j);
            continue;
        }
        int32_t *ids = NULL;
        int n_ids = 0;
        struct tpi_error err = {0};
        /* cJSON strings are NUL-terminated: a \u0000 in the text ends it early */
        if (tok_encode(t, jt->valuestring, strlen(jt->valuestring), special, &ids, &n_ids, &err) !=
            TPI_OK) {
            print_error_line(lineno, err.msg);
            n_bad++;
        } else {
            fputs("{\"ids\":", stdout);
            print_ids(stdout, ids, n_ids);
            fputs("}\n", stdout);
        }
        free(ids);
        cJSON_Delete(j);
    }
    const bool read_err = ferror(in);
    const int read_errno = errno;
    free(line);
    if (in != stdin) fclose(in);
    if (read_err) {
        fprintf(stderr, "tpinfer tokenize: read error on %s after line %ld: %s\n", in_path, lineno,
                read_errno ? strerror(read_errno) : "I/O error");
        return 1;
    }
    if (n_bad) fprintf(stderr, "tpinfer tokenize: %ld of %ld lines failed\n", n_bad, lineno);
    return n_bad ? 1 : 0;
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL, *jsonl = NULL;
    bool special = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_val = i + 1 < argc;
        if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has_val) {
            model = argv[++i];
        } else if (!strcmp(a, "--text") && has_val) {
            text = argv[++i];
        } else if (!strcmp(a, "--jsonl") && has_val) {
            jsonl = argv[++i];
        } else if (!strcmp(a, "--no-special")) {
            special = false;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "tpinfer tokenize: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!model || (!text == !jsonl)) {
        fprintf(stderr, "tpinfer tokenize: need -m FILE and exactly one of --text / --jsonl\n");
        usage(stderr);
        return 2;
    }

    struct tpi_error err = {0};
    struct gguf_file *f = NULL;
    struct tokenizer *t = NULL;
    if (gguf_open(model, &f, &err) != TPI_OK || tok_load(f, &t, &err) != TPI_OK) {
        fprintf(stderr, "tpinfer tokenize: %s\n", err.msg);
        gguf_close(&f);
        return 1;
    }
    gguf_close(&f); /* the tokenizer holds its own copies */

    int rc = 0;
    if (text) {
        int32_t *ids = NULL;
        int n_ids = 0;
        if (tok_encode(t, text, strlen(text), special, &ids, &n_ids, &err) != TPI_OK) {
            fprintf(stderr, "tpinfer tokenize: --text: %s\n", err.msg);
            rc = 1;
        } else {
            print_ids(stdout, ids, n_ids);
            fputc('\n', stdout);
        }
        free(ids);
    } else {
        rc = run_jsonl(t, jsonl, special);
    }
    tok_free(&t);
    return rc; /* main checks that stdout took it all */
}
