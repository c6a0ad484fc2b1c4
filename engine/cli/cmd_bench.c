/*
 * cmd_bench.c — `tpinfer bench`: llama-bench's prompt-processing (ppN) and
 * generation (tgN) tests on a tp x pp rank grid, with llama-bench's options,
 * output formats and statistics, plus the communicator traffic per repetition
 * and the weight-read bandwidth of generation against the memory roofline.
 *
 * What is timed, as llama-bench: ppN is N tokens of pseudo-random ids fed in
 * forwards of up to -b tokens (one forward with the defaults), the logits of
 * each forward's last token computed; tgN is N single-token forwards, each
 * asking for its logits (sampling is not timed: a fixed id is fed, sent each step
 * from the rank with the logits to all, as decoding does). With -d D
 * the KV cache is filled to D positions before every repetition (untimed) and
 * the test runs at positions D.. . A repetition starts and ends with every rank
 * in step (a barrier before, a backend sync and an agreement after), so rank 0's
 * clock covers the whole grid's work. t/s = (n_prompt + n_gen) / seconds.
 *
 * A model is loaded once per (model, ubatch, threads) combination with a KV
 * cache just big enough for the deepest test and a micro-batch that holds the
 * longest prompt, so ppN is one batched pass through each stage.
 *
 * stdout: only the results (world rank 0). Progress and load summaries: stderr.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_report.h"
#include "cli.h"
#include "cli_common.h"
#include "gguf.h"
#include "model/model.h"

#define CMD "bench"
#define IS2(v, s) (!strcmp((v), (s)))
#define MAX_LIST 64

/* An option that takes a comma list and may repeat; the first use replaces the default. */
struct int_list {
    int v[MAX_LIST];
    int n;
    bool set;
};

struct bench_opts {
    const char *models[MAX_LIST];
    int n_models;
    struct int_list n_prompt, n_gen, n_depth, n_batch, n_ubatch, n_threads;
    int pg[MAX_LIST][2];
    int n_pg;
    int reps;
    bool warmup;
    enum bench_format fmt;
    double roofline_gbps;
    struct cli_common common; /* --tp --pp --pp-layers --backend --comm --seed ... */
};

static void usage(FILE *f) {
    fprintf(f,
            "usage: tpinfer bench -m FILE [options]      (under mpirun -np tp*pp for tp/pp > 1)\n"
            "  -m, --model F[,F]      model(s); repeat or comma-separate\n"
            "  -p, --n-prompt N[,N]   prompt tokens (512)\n"
            "  -n, --n-gen N[,N]      generated tokens (128)\n"
            "  -pg PP,TG              prompt then generation test (repeatable)\n"
            "  -d, --n-depth N[,N]    KV cache filled to N positions first (0)\n"
            "  -r, --repetitions N    repetitions per test (5)\n"
            "  -b, --batch-size N[,N] tokens per forward while prompting (2048)\n"
            "  -ub, --ubatch-size N[,N] micro-batch capacity (default: the longest prompt)\n"
            "  -t, --threads N[,N]    CPU threads per rank (0: the node's cores shared by its ranks)\n"
            "  --no-warmup            skip the untimed warm-up run of each test\n"
            "  -o, --output FMT       md | csv | json | jsonl (md)\n"
            "  --roofline-gbps X      per-GPU memory read roofline in GB/s: print tg's fraction\n"
            "  --tp N --pp N          tensor / pipeline parallel sizes (tp*pp = MPI world)\n"
            "  --pp-layers a,b,...    layers per stage (balanced)\n"
            "  --backend cpu|cuda|auto, --comm mpi|nccl, --comm-timeout S, -v\n"
            "  --rope-scaling none|linear|yarn, --rope-scale N, --yarn-orig-ctx N: as run\n"
            "Each -p value is a pp test and each -n value a tg test (-pg for both in one);\n"
            "lists of -b, -ub, -t and -d run every combination with them. A value may be\n"
            "llama-bench's range FIRST-LAST[+STEP|*MULT], e.g. -p 64-512*2 (64,128,256,512).\n");
}

/* Append "a,b,c" to l (values in [lo, hi]); -1 after printing an error. */
static int parse_list(struct int_list *l, const char *opt, const char *s, int lo, int hi) {
    if (!l->set) {
        l->n = 0;
        l->set = true;
    }
    const char *p = s;
    while (*p) {
        // N, or llama-bench's range FIRST-LAST[+STEP|*MULT] (step 1 by default)
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10), last = v, step = 1;
        char op = '+';
        bool ok = !errno && end != p && *p != '-' && *p != '+';
        if (ok && *end == '-') {
            const char *q = end + 1;
            last = strtol(q, &end, 10);
            ok = !errno && end != q && *q != '-' && *q != '+' && last >= v;
            if (ok && (*end == '+' || *end == '*')) {
                op = *end;
                q = end + 1;
                step = strtol(q, &end, 10);
                ok = !errno && end != q && *q != '-' && *q != '+' &&
                     (op == '+' ? step >= 1 : step >= 2 && v >= 1) && step <= 1L << 24;
            }
        }
        if (!ok || v < lo || last > hi || (*end && *end != ',')) {
            fprintf(stderr,
                    "tpinfer " CMD ": %s expects integers in [%d, %d] or ranges FIRST-LAST[+STEP|"
                    "*MULT], got '%s'\n",
                    opt, lo, hi, s);
            return -1;
        }
        for (long x = v; x <= last; x = op == '+' ? x + step : x * step) {
            if (l->n == MAX_LIST) {
                fprintf(stderr, "tpinfer " CMD ": %s: more than %d values\n", opt, MAX_LIST);
                return -1;
            }
            l->v[l->n++] = (int)x;
        }
        p = *end ? end + 1 : end;
    }
    if (l->n == 0) {
        fprintf(stderr, "tpinfer " CMD ": %s: empty list\n", opt);
        return -1;
    }
    return 0;
}

static void list_default(struct int_list *l, int v) { *l = (struct int_list){.v = {v}, .n = 1}; }

/* 0 ok, 2 usage error, -1 help printed. */
static int parse_args(int argc, char **argv, struct bench_opts *o) {
    memset(o, 0, sizeof *o);
    list_default(&o->n_prompt, 512);
    list_default(&o->n_gen, 128);
    list_default(&o->n_depth, 0);
    list_default(&o->n_batch, 2048);
    list_default(&o->n_ubatch, 0); /* 0: the longest prompt of the model's tests */
    list_default(&o->n_threads, 0);
    o->reps = 5;
    o->warmup = true;
    o->fmt = BENCH_MD;
    cli_common_init(&o->common);
    const int big = 1 << 24;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
#define IS(s) (!strcmp(a, s))
        if (IS("-h") || IS("--help")) {
            usage(stdout);
            return -1;
        }
        if (IS("--no-warmup")) {
            o->warmup = false;
            continue;
        }
        bool takes_value = IS("-m") || IS("--model") || IS("-p") || IS("--n-prompt") || IS("-n") ||
                           IS("--n-gen") || IS("-pg") || IS("-d") || IS("--n-depth") || IS("-r") ||
                           IS("--repetitions") || IS("-b") || IS("--batch-size") || IS("-ub") ||
                           IS("--ubatch-size") || IS("--ubatch") || IS("-t") || IS("--threads") ||
                           IS("-o") || IS("--output") || IS("--roofline-gbps");
        if (!takes_value) {
            // --tp, --pp, --backend, --comm, ...: the options every model command shares.
            int crc = cli_common_parse(&o->common, argc, argv, &i, CMD);
            if (crc < 0) return 2;
            if (crc == 0) {
                fprintf(stderr, "tpinfer " CMD ": unknown option '%s'\n", a);
                usage(stderr);
                return 2;
            }
            continue;
        }
        if (!val) {
            fprintf(stderr, "tpinfer " CMD ": option %s needs a value\n", a);
            return 2;
        }
        i++;
        if (IS("-m") || IS("--model")) {
            char *copy = strdup(val); // the strings live until exit, like argv
            for (char *t = strtok(copy, ","); t; t = strtok(NULL, ",")) {
                if (o->n_models == MAX_LIST) {
                    fprintf(stderr, "tpinfer " CMD ": more than %d models\n", MAX_LIST);
                    return 2;
                }
                o->models[o->n_models++] = t;
            }
        } else if (IS("-p") || IS("--n-prompt")) {
            rc = parse_list(&o->n_prompt, a, val, 0, big);
        } else if (IS("-n") || IS("--n-gen")) {
            rc = parse_list(&o->n_gen, a, val, 0, big);
        } else if (IS("-pg")) {
            int pp_, tg_;
            char c;
            if (sscanf(val, "%d,%d%c", &pp_, &tg_, &c) != 2 || pp_ < 0 || tg_ < 0 ||
                o->n_pg == MAX_LIST) {
                fprintf(stderr, "tpinfer " CMD ": -pg expects PP,TG (two integers >= 0), got '%s'\n",
                        val);
                return 2;
            }
            o->pg[o->n_pg][0] = pp_;
            o->pg[o->n_pg][1] = tg_;
            o->n_pg++;
        } else if (IS("-d") || IS("--n-depth")) {
            rc = parse_list(&o->n_depth, a, val, 0, big);
        } else if (IS("-r") || IS("--repetitions")) {
            struct int_list l = {0};
            rc = parse_list(&l, a, val, 1, 100000);
            if (!rc && l.n != 1) {
                fprintf(stderr, "tpinfer bench: %s takes one count, got '%s'\n", a, val);
                rc = -1;
            }
            if (!rc) o->reps = l.v[0];
        } else if (IS("-b") || IS("--batch-size")) {
            rc = parse_list(&o->n_batch, a, val, 1, big);
        } else if (IS("-ub") || IS("--ubatch-size") || IS("--ubatch")) {
            rc = parse_list(&o->n_ubatch, a, val, 1, big);
        } else if (IS("-t") || IS("--threads")) {
            rc = parse_list(&o->n_threads, a, val, 0, 4096);
        } else if (IS("-o") || IS("--output")) {
            if (IS2(val, "md") || IS2(val, "markdown")) o->fmt = BENCH_MD;
            else if (IS2(val, "csv")) o->fmt = BENCH_CSV;
            else if (IS2(val, "json")) o->fmt = BENCH_JSON;
            else if (IS2(val, "jsonl")) o->fmt = BENCH_JSONL;
            else {
                fprintf(stderr, "tpinfer " CMD ": -o expects md, csv, json or jsonl, got '%s'\n",
                        val);
                return 2;
            }
        } else if (IS("--roofline-gbps")) {
            char *end;
            o->roofline_gbps = strtod(val, &end);
            if (*end || end == val || o->roofline_gbps <= 0) {
                fprintf(stderr, "tpinfer " CMD ": --roofline-gbps expects GB/s > 0, got '%s'\n",
                        val);
                return 2;
            }
        }
        if (rc) return 2;
#undef IS
    }
    if (o->common.model && o->n_models == 0) o->models[o->n_models++] = o->common.model;
    if (o->n_models == 0) {
        fprintf(stderr, "tpinfer " CMD ": no model given (-m FILE)\n");
        usage(stderr);
        return 2;
    }
    return 0;
}

/* ---- the tests ------------------------------------------------------------ */

struct test_spec {
    int n_prompt, n_gen, n_depth, n_batch;
};

/* Every test of one loaded model, in llama-bench's order within it: per batch size and
 * depth, the pp tests, then tg, then pg, into t (NULL: only counted). Returns the count.
 * The loads (model, then -ub, then -t) are the outer loops, so with a list of -b beside
 * a list of -ub or -t the rows come in another order than llama-bench's, which nests
 * the batch size outside those two (the same rows). */
static int make_tests(const struct bench_opts *o, struct test_spec *t) {
    int n = 0;
#define ADD(...) (t ? (void)(t[n] = (struct test_spec){__VA_ARGS__}) : (void)0, n++)
    for (int ib = 0; ib < o->n_batch.n; ib++)
        for (int id = 0; id < o->n_depth.n; id++) {
            const int b = o->n_batch.v[ib], d = o->n_depth.v[id];
            for (int i = 0; i < o->n_prompt.n; i++)
                if (o->n_prompt.v[i] > 0) ADD(o->n_prompt.v[i], 0, d, b);
            for (int i = 0; i < o->n_gen.n; i++)
                if (o->n_gen.v[i] > 0) ADD(0, o->n_gen.v[i], d, b);
            for (int i = 0; i < o->n_pg; i++)
                if (o->pg[i][0] > 0 || o->pg[i][1] > 0) ADD(o->pg[i][0], o->pg[i][1], d, b);
        }
#undef ADD
    return n;
}

/* Per-run state shared by the helpers below. */
struct bench_run {
    struct tpi_grid *g;
    struct model *m;
    int32_t *tokens; /* pseudo-random ids, the same on every rank */
    int32_t *pos, *seq;
    int n_tok_cap;
    float *logits;   /* n_vocab on last-stage ranks */
};

/* Feed positions [pos0, pos0 + n) of slot 0 in forwards of up to `chunk` tokens; with
 * want_logits, each forward asks for its last token's logits. */
static int feed(struct bench_run *br, int pos0, int n, int chunk, bool want_logits,
                struct tpi_error *err) {
    for (int t0 = 0; t0 < n; t0 += chunk) {
        const int k = TPI_MIN(chunk, n - t0);
        for (int i = 0; i < k; i++) {
            br->pos[i] = pos0 + t0 + i;
            br->seq[i] = 0;
        }
        const int32_t out_idx = k - 1;
        // Every chunk reuses the first k ids: the buffer holds one chunk.
        int rc = model_forward(br->m, br->tokens, br->pos, br->seq, k, &out_idx,
                               want_logits ? 1 : 0, br->logits, err);
        if (rc) return rc;
    }
    return TPI_OK;
}

/* n single-token steps at positions pos0.., each asking for its logits. As in real
 * decoding, each step's token comes from the rank that holds the logits (the last
 * stage) to every rank before the next step starts, so pipeline stages cannot run
 * ahead on ids they would not have yet. */
static int generate(struct bench_run *br, int pos0, int n, struct tpi_error *err) {
    // A fixed id: sampling is not what is measured, and every rank must feed the same one.
    const int32_t seq = 0, out_idx = 0;
    const int decider = br->m->grid ? model_decider_rank(br->m) : -1;
    int32_t tok = br->tokens[0];
    for (int i = 0; i < n; i++) {
        const int32_t pos = pos0 + i;
        int rc = model_forward(br->m, &tok, &pos, &seq, 1, &out_idx, 1, br->logits, err);
        if (!rc && decider >= 0) rc = model_bcast_i32(br->m, &tok, 1, decider, err);
        if (rc) return rc;
    }
    return TPI_OK;
}

/* One repetition's timed work (the caller fills the depth first). */
static int run_test(struct bench_run *br, const struct test_spec *t, struct tpi_error *err) {
    int rc = TPI_OK;
    if (t->n_prompt > 0) rc = feed(br, t->n_depth, t->n_prompt, t->n_batch, true, err);
    if (!rc && t->n_gen > 0) rc = generate(br, t->n_depth + t->n_prompt, t->n_gen, err);
    return rc;
}

/* Sum of both communicators' counters on this rank. */
static void comm_snapshot(const struct model *m, struct comm_stats *s) {
    memset(s, 0, sizeof *s);
    const struct comm *cs[2] = {m->tp_comm, m->pp_comm};
    for (int c = 0; c < 2; c++) {
        if (!cs[c]) continue;
        for (int k = 0; k < COMM_OP_COUNT; k++) {
            s->calls[k] += cs[c]->stats.calls[k];
            s->bytes[k] += cs[c]->stats.bytes[k];
        }
    }
}

/* Bytes of weights this rank reads to generate one token: every matrix and vector
 * it holds, except the embedding table, of which one row is read. */
static double weight_bytes_per_token(const struct model *m) {
    const struct model_config *c = &m->cfg;
    const struct model_plan *p = &m->plan;
    const struct model_weights *w = &m->w;
    double n = 0;
#define WB(x) ((double)(x).ne1 * (double)(x).row_bytes)
    const double q_dim = (double)p->n_head_local * c->head_dim;
    const double kv_dim = (double)p->n_kv_local * c->head_dim;
    for (int l = 0; l < p->n_layer_stage; l++) {
        const struct model_layer *L = &w->layers[l];
        n += WB(L->wq) + WB(L->wk) + WB(L->wv) + WB(L->wo);
        n += WB(L->w_gate) + WB(L->w_up) + WB(L->w_down);
        n += 2.0 * c->n_embd * sizeof(float); // attn_norm, ffn_norm
        if (L->bq) n += (q_dim + 2 * kv_dim) * sizeof(float);
        if (L->q_norm) n += 2.0 * c->head_dim * sizeof(float);
    }
    if (p->is_first && w->token_embd.data) n += (double)w->token_embd.row_bytes;
    if (p->is_last) {
        n += (double)c->n_embd * sizeof(float); // output_norm
        n += WB(w->output);                      // lm_head: read in full (tied or not)
    }
#undef WB
    return n;
}

/* Bytes of this rank's KV cache (K and V of its layers and heads) per position that a
 * token attends to. */
static double kv_bytes_per_position(const struct model *m) {
    const struct ops_kv *kv = &m->kv;
    return kv->n_slot > 0 && kv->n_ctx > 0 ? (double)kv->n_bytes / kv->n_slot / kv->n_ctx : 0;
}

static void cpu_info(char *buf, size_t n) {
    snprintf(buf, n, "%s", "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        char *c = strchr(line, ':');
        if (!c) break;
        c++;
        while (*c == ' ' || *c == '\t') c++;
        c[strcspn(c, "\n")] = 0;
        snprintf(buf, n, "%s", c);
        break;
    }
    fclose(f);
}

/* Total tensor bytes and parameter count of the file. */
static void model_totals(const struct gguf_file *f, uint64_t *n_bytes, uint64_t *n_params) {
    *n_bytes = *n_params = 0;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        uint64_t ne = 1;
        for (int d = 0; d < GGUF_MAX_DIMS; d++) ne *= (uint64_t)t->ne[d];
        *n_bytes += t->n_bytes;
        *n_params += ne;
    }
}

/* Print a rank-local runtime error and stop every rank: another rank may be waiting in
 * a collective this one will never join. */
static int die_rank(const struct tpi_grid *g, const struct tpi_error *err) {
    fprintf(stderr, "tpinfer " CMD ": error on rank %d: %s\n", g->world_rank, err->msg);
    fflush(stderr);
    if (g->world_size > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
}

/* Everything that stays the same for the tests of one loaded model. */
struct load_info {
    const char *path;
    char model_type[128];
    uint64_t model_size, model_n_params;
    char gpu_info[128];
    const char *backend, *comm;
    int n_ubatch, n_threads;
    double wbytes_rank[BENCH_MAX_RANKS]; /* weight bytes per token of each rank (rank 0) */
    double kvpos_rank[BENCH_MAX_RANKS];  /* KV bytes per attended position, each rank */
};

/* Load `path` with room for `tests`; retries with smaller micro-batches when the
 * backend runs out of memory and the size was not forced with -ub. */
static int load_model(struct model **m, const struct bench_opts *o, struct tpi_grid *g,
                      const char *path, const char *backend, const char *comm, int n_threads,
                      int ubatch_opt, const struct test_spec *tests, int n_tests,
                      struct tpi_error *err) {
    int max_ctx = 1, max_prompt = 1;
    for (int i = 0; i < n_tests; i++) {
        const struct test_spec *t = &tests[i];
        max_ctx = TPI_MAX(max_ctx, t->n_depth + t->n_prompt + t->n_gen);
        max_prompt = TPI_MAX(max_prompt, TPI_MIN(t->n_prompt, t->n_batch));
        // The depth fill goes through model_forward's own micro-batching; a few hundred
        // tokens per pass are enough to keep it fast without a huge activation buffer.
        if (t->n_depth > 0)
            max_prompt = TPI_MAX(max_prompt, TPI_MIN(TPI_MIN(t->n_depth, t->n_batch), 512));
    }
    int n_ctx = max_ctx + 16; // a margin, and room for the warm-up
    if (g->world_rank == 0 && max_ctx > 4096)
        TPI_LOGI("bench: the longest test needs %d positions (depth + prompt + generation); "
                 "a model trained on fewer runs past what it knows, as llama-bench lets it",
                 max_ctx);
    if (o->common.n_ctx > n_ctx) n_ctx = o->common.n_ctx;
    int n_ubatch = ubatch_opt > 0 ? ubatch_opt : max_prompt;
    struct model_params p = {
        .path = path,
        .backend = backend,
        .n_threads = n_threads,
        .comm = (enum comm_kind)comm_kind_from_name(comm),
        .comm_timeout_s = o->common.comm_timeout_s,
        .n_ctx = n_ctx,
        .rope = o->common.rope,
        .n_ubatch = n_ubatch,
        .pp_layers = o->common.n_pp_layers ? o->common.pp_layers : NULL,
        .n_pp_layers = o->common.n_pp_layers,
        .seed = o->common.seed,
    };
    for (;;) {
        int rc = model_load(m, &p, g, err); // agreed: every rank has the same rc
        if (rc != TPI_ERR_NOMEM || ubatch_opt > 0 || p.n_ubatch <= 1) return rc;
        p.n_ubatch /= 2;
        if (g->world_rank == 0)
            TPI_LOGW("out of memory with a micro-batch of %d tokens: retrying with %d (prompts "
                     "then take several passes per stage)",
                     p.n_ubatch * 2, p.n_ubatch);
    }
}

int cmd_bench(int argc, char **argv) {
    struct bench_opts o;
    int prc = parse_args(argc, argv, &o);
    if (prc < 0) return 0;
    if (prc) return prc;

    struct tpi_error err;
    tpi_err_clear(&err);
    grid_set_wait(o.common.comm_timeout_s);
    if (grid_mpi_init(&argc, &argv, &err)) {
        fprintf(stderr, "tpinfer " CMD ": %s\n", err.msg);
        return 1;
    }
    struct tpi_grid g;
    if (grid_init(&g, o.common.tp, o.common.pp, &err)) {
        // The same on every rank (tp*pp vs the world): printed once; a timeout or MPI's
        // failure by each rank that met one.
        int rank = 0;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        if (err.status != TPI_ERR_INVALID)
            fprintf(stderr, "tpinfer " CMD ": error on rank %d: %s\n", rank, err.msg);
        else if (rank == 0)
            fprintf(stderr, "tpinfer " CMD ": error: %s\n", err.msg);
        grid_free(&g);
        grid_mpi_finalize();
        return 1;
    }
    const bool root = g.world_rank == 0;
    tpi_log_set(o.common.verbose ? TPI_LOG_DEBUG : TPI_LOG_INFO,
                g.world_size > 1 ? g.world_rank : -1);
    if (g.world_size > BENCH_MAX_RANKS) {
        if (root) fprintf(stderr, "tpinfer " CMD ": error: more than %d ranks\n", BENCH_MAX_RANKS);
        grid_free(&g);
        grid_mpi_finalize();
        return 1;
    }

    // Backend and communicator, as the other model commands pick them.
    const char *backend = o.common.backend;
    if (!strcmp(backend, "auto"))
        backend = ops_cuda_available(NULL) && ops_cuda_get() ? "cuda" : "cpu";
    const char *comm = o.common.comm ? o.common.comm : cli_default_comm(backend);

    const int n_tests = make_tests(&o, NULL); // at most 64^4 x 3: every list's cap
    struct test_spec *tests = malloc(sizeof *tests * (size_t)(n_tests > 0 ? n_tests : 1));
    if (tests) make_tests(&o, tests);
    int max_tok = 1;
    for (int i = 0; tests && i < n_tests; i++)
        max_tok = TPI_MAX(max_tok, TPI_MAX(TPI_MIN(tests[i].n_prompt, tests[i].n_batch),
                                           TPI_MIN(tests[i].n_depth, tests[i].n_batch)));
    struct bench_run br = {.g = &g, .n_tok_cap = max_tok};
    br.tokens = malloc(sizeof(int32_t) * (size_t)max_tok);
    br.pos = malloc(sizeof(int32_t) * (size_t)max_tok);
    br.seq = malloc(sizeof(int32_t) * (size_t)max_tok);
    uint64_t *samples = malloc(sizeof(uint64_t) * (size_t)o.reps);
    if (!br.tokens || !br.pos || !br.seq || !samples || !tests) {
        free(br.tokens), free(br.pos), free(br.seq), free(samples), free(tests);
        tpi_err(&err, TPI_ERR_NOMEM, "out of memory");
        return die_rank(&g, &err);
    }

    char cpu[128];
    cpu_info(cpu, sizeof cpu);
    if (root && n_tests == 0) TPI_LOGW("no tests: every -p, -n and -pg is 0");
    bool first_row = true, header_done = false;
    // The markdown's optional columns: threads on the CPU or when given, the batch sizes
    // when given (their defaults: 2048 and 0, the longest prompt) or swept.
    const unsigned md_cols =
        (!strcmp(backend, "cpu") || o.n_threads.n > 1 || o.n_threads.v[0] != 0 ? BENCH_MD_THREADS
                                                                               : 0) |
        (o.n_batch.n > 1 || o.n_batch.v[0] != 2048 ? BENCH_MD_BATCH : 0) |
        (o.n_ubatch.n > 1 || o.n_ubatch.v[0] != 0 ? BENCH_MD_UBATCH : 0);
    int code = 0;
    // Rank 0's tests must be every rank's: the ranks run each test's steps together.
    const struct grid_same same[] = {
        {"number of tests (-p, -n, -pg, -d, -b)", (uint64_t)n_tests, 0},
        {"tests (-p, -n, -pg, -d, -b)",
         tpi_fnv1a(TPI_FNV_INIT, tests, sizeof *tests * (size_t)n_tests), 1},
        {"-r", (uint64_t)o.reps, 0},
        {"--no-warmup", (uint64_t)!o.warmup, 0},
        {"number of models (-m)", (uint64_t)o.n_models, 0},
        {"-ub list", tpi_fnv1a(TPI_FNV_INIT, o.n_ubatch.v, sizeof(int) * (size_t)o.n_ubatch.n) ^
                         (uint64_t)o.n_ubatch.n, 1},
        {"number of -t values", (uint64_t)o.n_threads.n, 0},
    };
    if (grid_check_same(&g, same, (int)(sizeof same / sizeof same[0]), &err)) {
        if (err.status != TPI_ERR_INVALID) return die_rank(&g, &err);
        if (root) fprintf(stderr, "tpinfer " CMD ": error: %s\n", err.msg);
        code = 1;
    }

    // A model that cannot be loaded is skipped, as llama-bench skips it: the others run
    // and the exit status is 1 (the load's failure is agreed, so every rank skips it).
    const bool checks_failed = code != 0;
    for (int im = 0; im < o.n_models && !checks_failed; im++) {
        bool load_failed = false;
        for (int iu = 0; iu < o.n_ubatch.n && !load_failed; iu++)
            for (int it = 0; it < o.n_threads.n && !load_failed; it++) {
                const int n_threads = o.n_threads.v[it];
                struct model *m = NULL;
                int rc = load_model(&m, &o, &g, o.models[im], backend, comm, n_threads,
                                    o.n_ubatch.v[iu], tests, n_tests, &err);
                if (rc) {
                    if (root) fprintf(stderr, "tpinfer " CMD ": error: %s\n", err.msg);
                    code = 1;
                    load_failed = true;
                    break;
                }
                br.m = m;
                // The header after the first load, so a missing model prints no table.
                if (root && !header_done)
                    bench_print_header(stdout, o.fmt, o.roofline_gbps > 0, md_cols);
                header_done = true;
                // Deterministic ids in [0, n_vocab): the same stream on every rank.
                uint64_t s = 0x9E3779B97F4A7C15ull;
                for (int i = 0; i < max_tok; i++) {
                    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
                    br.tokens[i] = (int32_t)(s % (uint64_t)m->cfg.n_vocab);
                }
                br.logits = model_has_logits(m) ? model_logits_alloc(m, 1) : NULL;
                if (model_has_logits(m) && !br.logits) {
                    tpi_err(&err, TPI_ERR_NOMEM, "out of memory for logits");
                    return die_rank(&g, &err);
                }

                // What every row of this model repeats; rank 0 collects each rank's bytes.
                struct load_info li = {.path = o.models[im], .backend = m->ops->name,
                                       .comm = comm, .n_ubatch = m->s.n_ubatch,
                                       .n_threads = model_cpu_threads(n_threads, &g)};
                model_totals(m->gguf, &li.model_size, &li.model_n_params);
                int64_t ftype = -1;
                if (!gguf_get_int(m->gguf, "general.file_type", &ftype)) ftype = -1;
                bench_model_type(li.model_type, sizeof li.model_type, m->cfg.arch_name,
                                 m->cfg.n_layer, m->cfg.n_embd, m->cfg.n_head, ftype);
                // llama-bench leaves gpu_info empty on the CPU (threads are n_threads)
                snprintf(li.gpu_info, sizeof li.gpu_info, "%s",
                         strcmp(m->ops->name, "cpu") ? m->ops->device_name(m->octx) : "");
                const double mine_b[2] = {weight_bytes_per_token(m), kv_bytes_per_position(m)};
                double all_b[2 * BENCH_MAX_RANKS];
                MPI_Request req;
                MPI_Igather(mine_b, 2, MPI_DOUBLE, all_b, 2, MPI_DOUBLE, 0, g.world, &req);
                grid_wait_or_abort(&g, &req, CMD, "the gather of the ranks' bytes per token");
                for (int k = 0; root && k < g.world_size; k++) {
                    li.wbytes_rank[k] = all_b[2 * k];
                    li.kvpos_rank[k] = all_b[2 * k + 1];
                }

                for (int ti = 0; ti < n_tests; ti++) {
                    const struct test_spec *t = &tests[ti];
                    char name[64];
                    bench_test_name(name, sizeof name, t->n_prompt, t->n_gen, t->n_depth);
                    if (root)
                        TPI_LOGI("bench: %s %s: %s%d repetitions", li.model_type, name,
                                 o.warmup ? "warm-up, " : "", o.reps);
                    struct bench_result r = {
                        .build_commit = cli_build_commit(),
                        .build_number = cli_build_number(), .cpu_info = cpu,
                        .gpu_info = li.gpu_info, .backend = li.backend,
                        .model_filename = li.path, .model_type = li.model_type,
                        .model_size = li.model_size, .model_n_params = li.model_n_params,
                        .n_batch = t->n_batch, .n_ubatch = li.n_ubatch,
                        .n_threads = li.n_threads, .tp = g.tp, .pp = g.pp, .comm = li.comm,
                        .n_prompt = t->n_prompt, .n_gen = t->n_gen, .n_depth = t->n_depth,
                        .n_samples = o.reps, .samples_ns = samples,
                        .roofline_gbps = o.roofline_gbps, .roofline_devices = g.tp,
                    };
                    time_t now = time(NULL);
                    struct tm tmv;
                    strftime(r.test_time, sizeof r.test_time, "%Y-%m-%dT%H:%M:%SZ",
                             gmtime_r(&now, &tmv));

                    // Warm-up: the test once, untimed, its generation steps twice. A
                    // decode step's graph is recorded the second time its shape is seen
                    // (forward.c), and shapes follow the position (pos_log2): after this
                    // every shape the timed steps use has its graph, so the repetitions
                    // measure replays, not one-time recordings (llama-bench's one step
                    // covered only position 0's shape).
                    if (o.warmup) {
                        rc = TPI_OK;
                        if (t->n_depth > 0) rc = feed(&br, 0, t->n_depth, t->n_batch, false, &err);
                        if (!rc && t->n_prompt > 0)
                            rc = feed(&br, t->n_depth, t->n_prompt, t->n_batch, true, &err);
                        for (int k = 0; k < 2 && !rc && t->n_gen > 0; k++)
                            rc = generate(&br, t->n_depth + t->n_prompt, t->n_gen, &err);
                        if (rc) return die_rank(&g, &err);
                    }
                    const int64_t records0 = m->n_graph_records;

                    struct comm_stats c0, c1, csum = {0};
                    for (int rep = 0; rep < o.reps; rep++) {
                        // Depth: refill positions 0..d-1 (slot reuse overwrites; untimed).
                        if (t->n_depth > 0 &&
                            (rc = feed(&br, 0, t->n_depth, t->n_batch, false, &err)))
                            return die_rank(&g, &err);
                        m->ops->sync(m->octx);
                        comm_snapshot(m, &c0);
                        MPI_Request breq;
                        MPI_Ibarrier(g.world, &breq);
                        grid_wait_or_abort(&g, &breq, CMD, "the barrier before a repetition");
                        const double t0 = tpi_time_s();
                        rc = run_test(&br, t, &err);
                        if (rc) return die_rank(&g, &err);
                        // Every rank's queued work done, then in step again: the time
                        // covers the slowest rank.
                        m->ops->sync(m->octx);
                        rc = model_agree(m, TPI_OK, &err);
                        const double t1 = tpi_time_s();
                        if (rc) return die_rank(&g, &err);
                        comm_snapshot(m, &c1);
                        for (int k = 0; k < COMM_OP_COUNT; k++) {
                            csum.calls[k] += c1.calls[k] - c0.calls[k];
                            csum.bytes[k] += c1.bytes[k] - c0.bytes[k];
                        }
                        samples[rep] = (uint64_t)((t1 - t0) * 1e9 + 0.5);
                    }
                    // Counters per repetition, the busiest rank's.
                    uint64_t mine[8], most[8];
                    const uint64_t R = (uint64_t)o.reps;
                    mine[0] = csum.calls[COMM_OP_ALLREDUCE] / R;
                    mine[1] = csum.bytes[COMM_OP_ALLREDUCE] / R;
                    mine[2] = csum.calls[COMM_OP_ALLGATHER] / R;
                    mine[3] = csum.bytes[COMM_OP_ALLGATHER] / R;
                    mine[4] = (csum.calls[COMM_OP_SEND] + csum.calls[COMM_OP_RECV]) / R;
                    mine[5] = (csum.bytes[COMM_OP_SEND] + csum.bytes[COMM_OP_RECV]) / R;
                    mine[6] = csum.calls[COMM_OP_BCAST] / R;
                    mine[7] = csum.bytes[COMM_OP_BCAST] / R;
                    MPI_Request rreq;
                    MPI_Ireduce(mine, most, 8, MPI_UINT64_T, MPI_MAX, 0, g.world, &rreq);
                    grid_wait_or_abort(&g, &rreq, CMD, "the reduction of the ranks' traffic");
                    // Recordings inside the timed repetitions are one-time costs counted
                    // in the figure (--no-warmup, or a shape first seen there): said.
                    if (root && m->n_graph_records > records0)
                        TPI_LOGW("bench: %s %s: %lld decode-step graphs were recorded inside the "
                                 "timed repetitions; their one-time cost is in the figure",
                                 li.model_type, name, (long long)(m->n_graph_records - records0));
                    // Rank 0's timings are the result; other ranks only needed to take part.
                    if (!root) continue;
                    r.comm_per_rep = (struct bench_comm_counts){
                        most[0], most[1], most[2], most[3], most[4], most[5], most[6], most[7]};
                    if (t->n_prompt == 0 && t->n_gen > 0) {
                        double mean_ns = 0;
                        for (int i = 0; i < o.reps; i++) mean_ns += (double)samples[i];
                        mean_ns /= o.reps;
                        const double s_per_tok = mean_ns * 1e-9 / t->n_gen;
                        // token i (0-based) sits at n_depth + i and attends n_depth + i + 1
                        // positions: (n_gen + 1) / 2 past the depth on average
                        const double attended = t->n_depth + (t->n_gen + 1) / 2.0;
                        r.has_gbps = true;
                        r.n_ranks = g.world_size;
                        for (int k = 0; k < g.world_size; k++) {
                            r.gbps_rank[k] = li.wbytes_rank[k] / s_per_tok / 1e9;
                            r.gbps_sum += r.gbps_rank[k];
                            r.weight_bytes_per_token += li.wbytes_rank[k];
                            r.kv_bytes_per_token += li.kvpos_rank[k] * attended;
                        }
                        r.read_gbps = (r.weight_bytes_per_token + r.kv_bytes_per_token) /
                                      s_per_tok / 1e9;
                    }
                    bench_print_result(stdout, o.fmt, &r, first_row, md_cols);
                    first_row = false;
                }
                model_logits_free(m, br.logits);
                br.logits = NULL;
                model_free(&m);
            }
    }

    // Closed even after an error, so a JSON document stays well-formed.
    if (root && header_done)
        bench_print_footer(stdout, o.fmt, cli_build_commit(), cli_build_number());
    free(br.tokens);
    free(tests);
    free(br.pos);
    free(br.seq);
    free(samples);
    grid_free(&g);
    grid_mpi_finalize();
    return code;
}
