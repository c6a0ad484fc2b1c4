/*
 * cmd_perplexity.c — `tpinfer perplexity -m FILE -f TEXT [-c N]`: perplexity of a
 * text file the way llama.cpp's llama-perplexity measures it (see
 * engine/model/perplexity.h): windows of N tokens (-c, default 512), the second
 * half of each scored. Progress goes to stderr; the final "PPL = x +/- y" line is
 * the only thing on stdout.
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
               "  -c, --ctx-size N       window size in tokens (512)\n");
    cli_common_usage(f, false);
}

static void progress(int w, int n, double ppl, void *user) {
    (void)user;
    fprintf(stderr, "[%d/%d] %.4f\n", w + 1, n, ppl);
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
    const char *file = NULL;
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
        fprintf(stderr, "tpinfer perplexity: unknown option %s (tpinfer perplexity --help)\n",
                argv[i]);
        return 2;
    }
    if (!c.model || !file) {
        fprintf(stderr, "tpinfer perplexity: need -m FILE and -f TEXT\n");
        return 2;
    }
    if (c.n_ctx == 0) c.n_ctx = 512; // llama-perplexity's default window
    if (c.n_ctx < 4) { // before any rank loads the model: the window scores its second half
        fprintf(stderr, "tpinfer perplexity: -c is the window and must be at least 4 tokens, got %d\n",
                c.n_ctx);
        return 2;
    }
    const int n_window = c.n_ctx;

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
    };
    if ((rc = grid_check_same(&r.grid, same, 2, &err))) {
        free(ids);
        return rc == TPI_ERR_INVALID ? cli_fail_all(&r, "perplexity", &err)
                                     : cli_fail_rank(&r, "perplexity", &err);
    }
    if (cli_rank(&r) == 0)
        TPI_LOGI("%d tokens, %d windows of %d", n_ids, n_ids / n_window, n_window);
    struct ppl_result res;
    // BOS over each window's first token only when the vocabulary adds BOS (as llama.cpp).
    rc = model_perplexity(r.model, ids, n_ids, n_window, tok_add_bos(r.tok) ? tok_bos(r.tok) : -1,
                          progress, NULL, &res, &err);
    free(ids);
    if (rc == TPI_ERR_INVALID) return cli_fail_all(&r, "perplexity", &err); // same on all ranks
    if (rc) return cli_fail_rank(&r, "perplexity", &err);
    if (cli_rank(&r) == 0) {
        printf("PPL = %.4f +/- %.5f\n", res.ppl, res.ppl_err);
        fflush(stdout);
        TPI_LOGI("%d windows, %d tokens scored, forward %.2f s", res.n_windows, res.n_scored,
                 r.model->t_forward_s);
    }
    return cli_finish(&r, 0);
}
