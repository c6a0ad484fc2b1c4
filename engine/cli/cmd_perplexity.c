/*
 * cmd_perplexity.c — `tpinfer perplexity -m FILE -f TEXT [-c N] [--chunks N]`: perplexity
 * of a text file the way llama.cpp's llama-perplexity measures it (see
 * engine/model/perplexity.h): windows of N tokens (-c, default 512), the second half of
 * each scored. stdout carries llama-perplexity's lines: the running estimate after each
 * window ("[1]x,[2]y,...") and "Final estimate: PPL = x +/- y"; the rest goes to stderr.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_common.h"
#include "model/perplexity.h"
#include "text/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f, "usage: tpinfer perplexity -m FILE -f TEXT [-c N] [options]\n"
               "  -f, --file TEXT        text file to score\n"
               "  -c, --ctx-size N       window size in tokens (512)\n"
               "  --chunks N             score the first N windows only (-1: all)\n"
               "  -b, --batch-size N     taken for llama-perplexity's command lines; each\n"
               "                         window is one forward (in --ubatch pieces) whatever N\n");
    cli_common_usage(f, false);
}

static void progress(int w, int n, double ppl, void *user) {
    (void)user;
    printf("[%d]%.4f,%s", w + 1, ppl, w + 1 == n ? "\n" : ""); // llama-perplexity's line
    fflush(stdout);
}

/* The bytes of [s, s + n) that do not begin a well-formed UTF-8 character made U+FFFD
 * one by one, as llama.cpp's tokenizer reads text (unicode_cpts_from_utf8), in place of
 * *s (realloc'd, NUL-terminated, *n updated); how many there were, or -1 when memory
 * runs out. */
static long utf8_replace_bytes(char **s, size_t *n) {
    long bad = 0;
    for (size_t i = 0; i < *n;) {
        int k;
        const int m = tpi_utf8_scan((const unsigned char *)*s + i, *n - i, &k);
        if (m == k) i += (size_t)k;
        else bad++, i++;
    }
    if (!bad) return 0;
    char *o = malloc(*n + 2 * (size_t)bad + 1);
    if (!o) return -1;
    size_t no = 0;
    for (size_t i = 0; i < *n;) {
        int k;
        const int m = tpi_utf8_scan((const unsigned char *)*s + i, *n - i, &k);
        if (m == k) {
            memcpy(o + no, *s + i, (size_t)k), no += (size_t)k, i += (size_t)k;
        } else {
            memcpy(o + no, "\xef\xbf\xbd", 3), no += 3, i++;
        }
    }
    o[no] = '\0';
    free(*s);
    *s = o;
    *n = no;
    return bad;
}

/* The whole file, NUL-terminated; NULL with err set. */
static char *read_text(const char *path, size_t *n, struct tpi_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        tpi_err(err, TPI_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = tpi_read_stream(f, n);
    const int e = errno;
    fclose(f);
    if (!buf && e == ENOMEM)
        tpi_err(err, TPI_ERR_NOMEM, "%s: out of memory", path);
    else if (!buf)
        tpi_err(err, TPI_ERR_IO, "%s: read failed: %s", path, strerror(e));
    return buf;
}

int cmd_perplexity(int argc, char **argv) {
    struct cli_common c;
    cli_common_init(&c);
    c.n_ctx = 512; // llama-perplexity's default window; -c 0 is refused below, as there
    const char *file = NULL;
    long n_chunks = -1;
    for (int i = 1; i < argc; i++) {
        int r = cli_common_parse(&c, argc, argv, &i, "perplexity");
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
        if ((!strcmp(argv[i], "-f") || !strcmp(argv[i], "--file")) && i + 1 < argc) {
            file = argv[++i];
            continue;
        }
        if ((!strcmp(argv[i], "-b") || !strcmp(argv[i], "--batch-size")) && i + 1 < argc) {
            // llama-perplexity's batch only groups its decode calls: the result is the same
            char *end;
            errno = 0;
            const long b = strtol(argv[++i], &end, 10);
            if (errno || end == argv[i] || *end || b < 1 || b > 1 << 24) {
                fprintf(stderr, "tpinfer perplexity: -b expects a positive integer, got '%s'\n",
                        argv[i]);
                return 2;
            }
            continue;
        }
        if (!strcmp(argv[i], "--chunks") && i + 1 < argc) {
            char *end;
            errno = 0;
            n_chunks = strtol(argv[++i], &end, 10);
            if (errno || end == argv[i] || *end || n_chunks < -1 || n_chunks == 0 ||
                n_chunks > 1 << 24) {
                fprintf(stderr, "tpinfer perplexity: --chunks expects -1 (all) or a count of "
                                "windows from 1, got '%s'\n", argv[i]);
                return 2;
            }
            continue;
        }
        if (!strcmp(argv[i], "-f") || !strcmp(argv[i], "--file") || !strcmp(argv[i], "--chunks") ||
            !strcmp(argv[i], "-b") || !strcmp(argv[i], "--batch-size")) {
            fprintf(stderr, "tpinfer perplexity: %s needs a value\n", argv[i]);
            return 2;
        }
        fprintf(stderr, "tpinfer perplexity: unknown option %s (tpinfer perplexity --help)\n",
                argv[i]);
        return 2;
    }
    if (!c.model || !file) {
        fprintf(stderr, "tpinfer perplexity: need -m FILE and -f TEXT\n");
        return 2;
    }
    if (c.n_ctx < 4) { // before any rank loads the model: the window scores its second half
        fprintf(stderr, "tpinfer perplexity: -c is the window and must be at least 4 tokens, got %d\n",
                c.n_ctx);
        return 2;
    }
    const int n_window = c.n_ctx;
    // A text that cannot be opened stops the command before the model loads (minutes for
    // a large one); it is read after, by every rank alike.
    FILE *probe = fopen(file, "rb");
    if (!probe) {
        fprintf(stderr, "tpinfer perplexity: %s: cannot open: %s\n", file, strerror(errno));
        return 1;
    }
    fclose(probe);

    struct cli_run r;
    if (cli_start(&r, &c, &argc, &argv, "perplexity")) return 1;
    struct tpi_error err = {0};
    int32_t *ids = NULL;
    int n_ids = 0;
    size_t n_text = 0;
    // Every rank reads and tokenizes the same text (each may have its own copy of it).
    char *text = read_text(file, &n_text, &err);
    int rc = text ? TPI_OK : err.status;
    // As llama-perplexity reads -f: one final newline dropped (common/arg.cpp), and the
    // text tokenized without parsing special tokens (`<|endoftext|>` in it is text).
    if (!rc && n_text > 0 && text[n_text - 1] == '\n') text[--n_text] = '\0';
    // Bytes that are not UTF-8 (a Latin-1 file) read as U+FFFD each, as llama.cpp reads them.
    const long n_bad = rc ? 0 : utf8_replace_bytes(&text, &n_text);
    if (n_bad < 0) rc = tpi_err(&err, TPI_ERR_NOMEM, "%s: out of memory", file);
    if (n_bad > 0 && cli_rank(&r) == 0)
        TPI_LOGW("%s: %ld bytes are not UTF-8; each reads as U+FFFD, as llama.cpp reads them",
                 file, n_bad);
    if (!rc) rc = tok_encode(r.tok, text, n_text, false, &ids, &n_ids, &err);
    free(text);
    if ((rc = grid_agree(&r.grid, rc, &err))) {
        free(ids);
        return cli_fail_all(&r, "perplexity", &err);
    }
    // Each rank's own copy of the text must be rank 0's: a different one is garbage.
    const struct grid_same same[] = {
        {"text (-f) length in tokens", (uint64_t)n_ids, 0},
        {"text (-f)", tpi_fnv1a(TPI_FNV_INIT, ids, sizeof *ids * (size_t)n_ids), 1},
        {"--chunks", (uint64_t)n_chunks, 0},
    };
    if ((rc = grid_check_same(&r.grid, same, 3, &err))) {
        free(ids);
        return rc == TPI_ERR_INVALID ? cli_fail_all(&r, "perplexity", &err)
                                     : cli_fail_rank(&r, "perplexity", &err);
    }
    if (cli_rank(&r) == 0 && n_window > r.model->cfg.n_ctx_train)
        TPI_LOGW("the model was trained on only %d context tokens (%d specified)",
                 r.model->cfg.n_ctx_train, n_window);
    if (cli_rank(&r) == 0 && n_ids >= 2 * n_window)
        TPI_LOGI("%d tokens, %d windows of %d", n_ids,
                 n_chunks > 0 && n_chunks < n_ids / n_window ? (int)n_chunks : n_ids / n_window,
                 n_window);
    struct ppl_result res;
    // BOS over each window's first token only when the vocabulary adds BOS (as llama.cpp).
    rc = model_perplexity(r.model, ids, n_ids, n_window, (int)n_chunks,
                          tok_add_bos(r.tok) ? tok_bos(r.tok) : -1, progress, NULL, &res, &err);
    free(ids);
    if (rc == TPI_ERR_INVALID) return cli_fail_all(&r, "perplexity", &err); // same on all ranks
    if (rc) return cli_fail_rank(&r, "perplexity", &err);
    if (cli_rank(&r) == 0) {
        printf("Final estimate: PPL = %.4f +/- %.5f\n", res.ppl, res.ppl_err);
        fflush(stdout);
        TPI_LOGI("%d windows, %d tokens scored, forward %.2f s", res.n_windows, res.n_scored,
                 r.model->t_forward_s);
    }
    return cli_finish(&r, 0);
}
