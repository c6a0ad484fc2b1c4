/*
 * cmd_tokenize.c — `tpinfer tokenize`: token ids of text with a model's
 * vocabulary (vocab-only GGUFs work: no tensor is read).
 *
 *   tpinfer tokenize -m FILE -p TEXT        one JSON array of ids on stdout (--text too)
 *   tpinfer tokenize -m FILE -f FILE|--stdin   the whole file as one text
 *   tpinfer tokenize -m FILE --jsonl IN     per {"text": ...} line, {"ids": [...]};
 *                                           a bad line gives {"error": "line N: ..."}
 *                                           and the rest go on (exit 1 at the end)
 * As llama-tokenize reads it, the text has its escapes processed (\n, \t, \xNN ...)
 * unless --no-escape, from -p (as `run -p` does), -f or --stdin alike. Added tokens
 * written in the text (<|im_start|>) become their ids; with --no-special CONTROL tokens
 * stay text (USER_DEFINED ones such as <think> are still split out, as Hugging Face and
 * llama.cpp do). --pieces prints llama-tokenize's default view, "id -> 'piece'" lines;
 * --ids its list, "[1, 2, 3]".
 */
#define _GNU_SOURCE /* getline */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_common.h"
#include "gguf.h"
#include "text/json_py.h"
#include "text/tokenizer.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: tpinfer tokenize -m FILE (-p TEXT | -f FILE | --stdin | --jsonl IN) [options]\n"
            "  -m, --model FILE  GGUF with a tokenizer.ggml.* vocabulary (tensors not needed)\n"
            "  -p, --prompt TEXT, --text TEXT\n"
            "                    tokenize TEXT\n"
            "  -f, --file FILE   tokenize the whole file\n"
            "  --stdin           tokenize the whole of stdin\n"
            "  --jsonl IN        read {\"text\": ...} lines from IN ('-' for stdin), write one\n"
            "                    {\"ids\": [...]} line each; a bad line gives {\"error\": ...}\n"
            "  --no-escape       take the text as given (by default \\n \\t \\xNN ... escapes\n"
            "                    are processed, as llama-tokenize and run -p do)\n"
            "  --no-special, --no-parse-special\n"
            "                    control tokens written in the text stay plain text\n"
            "  --no-bos          leave out the BOS the vocabulary adds (when it adds one)\n"
            "  --ids             print the ids as llama-tokenize --ids does: [1, 2, 3]\n"
            "  --pieces          print llama-tokenize's default view: one 'id -> 'piece'' a line\n"
            "  --show-count      then print 'Total number of tokens: N'\n"
            "Default output: the ids as one JSON array without spaces, [1,2,3]. Text that is\n"
            "not UTF-8 is refused, naming the byte (llama.cpp reads such bytes as U+FFFD).\n");
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
        if (json_text_holds_nul(line, (size_t)n)) { /* cJSON's strings would end at it */
            print_error_line(lineno, "the text holds \\u0000 (a NUL character), which tpinfer "
                                     "cannot take");
            n_bad++;
            cJSON_Delete(j);
            continue;
        }
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

/* How the ids of one text are printed. */
struct tok_view {
    bool ids_spaced; /* --ids: [1, 2, 3] */
    bool pieces;     /* --pieces: "     1 -> 'a'" lines */
    bool count;      /* --show-count */
};

static void print_view(const struct tokenizer *t, const int32_t *ids, int n,
                       const struct tok_view *v) {
    if (v->pieces) {
        for (int i = 0; i < n; i++) {
            const struct tok_str p = tok_token_bytes(t, ids[i]);
            printf("%6d -> '%.*s'\n", ids[i], (int)p.len, p.data);
        }
    } else if (v->ids_spaced) {
        fputc('[', stdout);
        for (int i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
        fputs("]\n", stdout);
    } else {
        print_ids(stdout, ids, n);
        fputc('\n', stdout);
    }
    if (v->count) printf("Total number of tokens: %d\n", n);
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *jsonl = NULL, *file = NULL;
    char *text = NULL;
    bool special = true, escape = true, no_bos = false, from_stdin = false;
    struct tok_view view = {0};
    int n_inputs = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_val = i + 1 < argc;
        if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has_val) {
            model = argv[++i];
        } else if ((!strcmp(a, "--text") || !strcmp(a, "-p") || !strcmp(a, "--prompt")) &&
                   has_val) {
            text = argv[++i];
            n_inputs++;
        } else if ((!strcmp(a, "-f") || !strcmp(a, "--file")) && has_val) {
            file = argv[++i];
            n_inputs++;
        } else if (!strcmp(a, "--stdin")) {
            from_stdin = true;
            n_inputs++;
        } else if (!strcmp(a, "--jsonl") && has_val) {
            jsonl = argv[++i];
            n_inputs++;
        } else if (!strcmp(a, "--no-special") || !strcmp(a, "--no-parse-special")) {
            special = false;
        } else if (!strcmp(a, "--no-escape")) {
            escape = false;
        } else if (!strcmp(a, "--no-bos")) {
            no_bos = true;
        } else if (!strcmp(a, "--ids")) {
            view.ids_spaced = true;
        } else if (!strcmp(a, "--pieces")) {
            view.pieces = true;
        } else if (!strcmp(a, "--show-count")) {
            view.count = true;
        } else if (!strcmp(a, "--log-disable")) {
            // llama-tokenize's: tokenize writes no log
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!has_val && (!strcmp(a, "-m") || !strcmp(a, "--model") || !strcmp(a, "-p") ||
                                !strcmp(a, "--prompt") || !strcmp(a, "--text") ||
                                !strcmp(a, "-f") || !strcmp(a, "--file") ||
                                !strcmp(a, "--jsonl"))) {
            fprintf(stderr, "tpinfer tokenize: %s needs a value\n", a);
            return 2;
        } else {
            fprintf(stderr, "tpinfer tokenize: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!model || n_inputs != 1) {
        fprintf(stderr, "tpinfer tokenize: need -m FILE and exactly one of -p / -f / --stdin / "
                        "--jsonl\n");
        usage(stderr);
        return 2;
    }
    if (view.ids_spaced && view.pieces) {
        fprintf(stderr, "tpinfer tokenize: --ids and --pieces are two views: give one\n");
        return 2;
    }
    if (jsonl && (view.ids_spaced || view.pieces || view.count || no_bos)) {
        fprintf(stderr, "tpinfer tokenize: --jsonl writes {\"ids\": [...]} lines: --ids, "
                        "--pieces, --show-count and --no-bos go with -p, -f or --stdin\n");
        return 2;
    }

    // The text first: a file that cannot be read is reported before the model is opened.
    char *owned = NULL;
    size_t n_text = 0;
    if (file || from_stdin) {
        FILE *in = from_stdin ? stdin : fopen(file, "rb");
        if (!in) {
            fprintf(stderr, "tpinfer tokenize: cannot open %s: %s\n", file, strerror(errno));
            return 1;
        }
        owned = tpi_read_stream(in, &n_text);
        const int e = errno;
        if (in != stdin) fclose(in);
        if (!owned) {
            fprintf(stderr, "tpinfer tokenize: cannot read %s: %s\n", file ? file : "stdin",
                    strerror(e));
            return 1;
        }
    } else if (text) {
        owned = tpi_strdup(text);
        if (!owned) return 1;
        n_text = strlen(owned);
    }
    // llama-tokenize processes the escapes of every source (-p, -f, --stdin) alike
    if (owned && escape && !memchr(owned, '\0', n_text)) {
        cli_unescape(owned);
        n_text = strlen(owned);
    }

    struct tpi_error err = {0};
    struct gguf_file *f = NULL;
    struct tokenizer *t = NULL;
    if (gguf_open(model, &f, &err) != TPI_OK || tok_load(f, &t, &err) != TPI_OK) {
        fprintf(stderr, "tpinfer tokenize: %s\n", err.msg);
        gguf_close(&f);
        free(owned);
        return 1;
    }
    gguf_close(&f); /* the tokenizer holds its own copies */

    int rc = 0;
    if (owned) {
        int32_t *ids = NULL;
        int n_ids = 0;
        if (tok_encode(t, owned, n_text, special, &ids, &n_ids, &err) != TPI_OK) {
            fprintf(stderr, "tpinfer tokenize: %s: %s\n",
                    file ? file : from_stdin ? "stdin" : "-p", err.msg);
            rc = 1;
        } else {
            int skip = no_bos && n_ids > 0 && tok_add_bos(t) && ids[0] == tok_bos(t);
            print_view(t, ids + skip, n_ids - skip, &view);
        }
        free(ids);
        free(owned);
    } else {
        rc = run_jsonl(t, jsonl, special);
    }
    tok_free(&t);
    return rc; /* main checks that stdout took it all */
}
