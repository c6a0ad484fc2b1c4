/*
 * cli_common.c — see cli_common.h.
 */
#include "cli_common.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gguf.h"
#include "kernels/ops.h"
#include "text/tokenizer.h"

void cli_common_init(struct cli_common *c) {
    memset(c, 0, sizeof *c);
    c->tp = c->pp = 1;
    c->backend = "auto";
    c->n_ubatch = 512;
    c->comm_timeout_s = 60.0;
}

void cli_common_usage(FILE *f, bool ctx_line) {
    fprintf(f,
            "  -m, --model FILE       GGUF model (first part of a split model)\n"
            "  --tp N                 tensor-parallel ranks (1)\n"
            "  --pp N                 pipeline stages (1); run tp*pp ranks under mpirun\n"
            "  --pp-layers a,b,...    layers per stage (default: balanced)\n"
            "  --backend NAME         cpu | cuda | auto (auto)\n"
            "  --comm NAME            mpi | nccl (nccl with cuda, else mpi)\n");
    if (ctx_line) fprintf(f, "  -c, --ctx-size N       KV cache positions (min(4096, model context))\n");
    fprintf(f,
            "  --rope-scaling KIND    none | linear | yarn (the model's rope.scaling.type)\n"
            "  --rope-scale N         context scaling factor (the model's rope.scaling.factor)\n"
            "  --yarn-orig-ctx N      YaRN: the model's trained context (its\n"
            "                         rope.scaling.original_context_length, else context_length)\n");
    fprintf(f,
            "  -t, --threads N        CPU threads (the node's cores shared by its ranks)\n"
            "  --ubatch N             tokens per micro-batch (512)\n"
            "  --seed N               sampling seed, -1 = random (random)\n"
            "  --comm-timeout S       seconds start-up (until the model loads) and a run's\n"
            "                         end wait for every rank (60; the end at least 60);\n"
            "                         loading and the run itself wait TPI_COMM_OP_TIMEOUT\n"
            "                         seconds (600) for a silent peer\n"
            "  -v, --verbose          debug logs\n");
}

static int parse_int(const char *cmd, const char *opt, const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi) {
        fprintf(stderr, "tpinfer %s: %s expects an integer in [%ld, %ld], got '%s'\n", cmd, opt, lo,
                hi, s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int cli_sampling_parse(struct sampler_params *sp, unsigned *set, int argc, char **argv, int *i,
                       const char *cmd) {
    const char *a = argv[*i];
    for (int k = 0; k < n_sampler_fields; k++) {
        const struct sampler_field_desc *d = &sampler_fields[k];
        if (strcmp(a, d->option) != 0) continue;
        if (*i + 1 >= argc) {
            fprintf(stderr, "tpinfer %s: option %s needs a value\n", cmd, a);
            return -1;
        }
        const char *val = argv[++*i];
        char *end;
        errno = 0;
        const double v = strtod(val, &end);
        if (errno || *end || end == val || !sampler_field_ok(d, v)) {
            if (d->is_int)
                fprintf(stderr, "tpinfer %s: %s expects an integer in [%.0f, %.0f], got '%s'\n",
                        cmd, a, d->lo, d->hi, val);
            else if (isfinite(d->lo))
                fprintf(stderr, "tpinfer %s: %s expects a number in [%g, %g], got '%s'\n", cmd, a,
                        d->lo, d->hi, val);
            else
                fprintf(stderr, "tpinfer %s: %s expects a finite number, got '%s'\n", cmd, a,
                        val);
            return -1;
        }
        sampler_field_set(sp, d, v);
        *set |= d->bit;
        return 1;
    }
    return 0;
}

void cli_sampling_from_model(struct sampler_params *sp, unsigned set, const struct model *m,
                             bool root, const char *cmd) {
    const unsigned took = model_sampling_defaults(m->gguf, sp, set, false, root);
    if (!root || !took) return;
    char line[256];
    size_t n = 0;
#define PUT(bit, ...)                                                                          \
    if ((took & (bit)) && n < sizeof line)                                                     \
        n += (size_t)snprintf(line + n, sizeof line - n, __VA_ARGS__);
    PUT(SP_TEMP, " --temp %g", (double)sp->temp)
    PUT(SP_TOP_K, " --top-k %d", sp->top_k)
    PUT(SP_TOP_P, " --top-p %g", (double)sp->top_p)
    PUT(SP_MIN_P, " --min-p %g", (double)sp->min_p)
    PUT(SP_REPEAT_PENALTY, " --repeat-penalty %g", (double)sp->repeat_penalty)
    PUT(SP_REPEAT_LAST_N, " --repeat-last-n %d", sp->repeat_last_n)
#undef PUT
    fprintf(stderr,
            "tpinfer %s: sampling as the model recommends (general.sampling.*):%s; an option "
            "given overrides its value\n",
            cmd, line);
}

void cli_sampling_usage(FILE *f) {
    fprintf(f,
            "  --temp T               temperature, <= 0 greedy (0.8)\n"
            "  --top-k K              (40; 0 or -1 = off)   --top-p P in [0, 1] (0.95)\n"
            "  --min-p P              in [0, 1] (0.05)      --repeat-penalty R (1.0 = off)\n"
            "  --repeat-last-n N      tokens the penalties look back over, prompt included\n"
            "                         (64; 0 off, -1 the whole context)\n"
            "  --presence-penalty P --frequency-penalty F   in [-2, 2], over the same tokens\n"
            "                         (0; a request line in OpenAI's form: its generated ones)\n"
            "  A model's general.sampling.* keys (its recommended sampling) replace these\n"
            "  defaults, as in llama.cpp; an option given wins.\n");
}

int cli_shared_seed(MPI_Comm world, bool draw, uint64_t seed, uint64_t *out,
                    struct tpi_error *err) {
    // On the heap: a request that timed out may still write it when a late rank comes.
    uint64_t *s = malloc(sizeof *s);
    if (!s) return tpi_err(err, TPI_ERR_NOMEM, "out of memory");
    *s = draw ? (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32) : seed;
    int rank = 0;
    MPI_Comm_rank(world, &rank);
    MPI_Request req;
    const int st = MPI_Ibcast(s, 1, MPI_UINT64_T, 0, world, &req) == MPI_SUCCESS
                       ? grid_poll(&req, grid_wait())
                       : TPI_ERR_COMM;
    if (st == TPI_ERR_TIMEOUT)
        return tpi_err(err, TPI_ERR_TIMEOUT,
                       "world rank %d waited %.0f s at start-up for the other ranks (the run's "
                       "seed from rank 0): one is stuck (--comm-timeout S changes the limit)",
                       rank, grid_wait());
    *out = *s;
    free(s);
    if (st != TPI_OK)
        return tpi_err(err, TPI_ERR_COMM, "the broadcast of the run's seed failed on world rank %d",
                       rank);
    return TPI_OK;
}

int cli_common_parse(struct cli_common *c, int argc, char **argv, int *i, const char *cmd) {
    const char *a = argv[*i];
    const char *val = *i + 1 < argc ? argv[*i + 1] : NULL;
#define NEED_VAL                                                                   \
    do {                                                                           \
        if (!val) {                                                                \
            fprintf(stderr, "tpinfer %s: option %s needs a value\n", cmd, a);      \
            return -1;                                                             \
        }                                                                          \
        (*i)++;                                                                    \
    } while (0)
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
        NEED_VAL;
        c->model = val;
    } else if (!strcmp(a, "--tp")) {
        NEED_VAL;
        return parse_int(cmd, a, val, 1, 4096, &c->tp) ? -1 : 1;
    } else if (!strcmp(a, "--pp")) {
        NEED_VAL;
        return parse_int(cmd, a, val, 1, MODEL_MAX_STAGES, &c->pp) ? -1 : 1;
    } else if (!strcmp(a, "--pp-layers")) {
        NEED_VAL;
        c->n_pp_layers = 0;
        char buf[4096];
        snprintf(buf, sizeof buf, "%s", val);
        for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
            if (c->n_pp_layers == MODEL_MAX_STAGES ||
                parse_int(cmd, a, tok, 1, 100000, &c->pp_layers[c->n_pp_layers]))
                return -1;
            c->n_pp_layers++;
        }
    } else if (!strcmp(a, "--backend")) {
        NEED_VAL;
        c->backend = val;
    } else if (!strcmp(a, "--comm")) {
        NEED_VAL;
        if (comm_kind_from_name(val) < 0) {
            fprintf(stderr, "tpinfer %s: --comm expects mpi or nccl, got '%s'\n", cmd, val);
            return -1;
        }
        c->comm = val;
    } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
        NEED_VAL;
        return parse_int(cmd, a, val, 0, 1 << 24, &c->n_ctx) ? -1 : 1;
    } else if (!strcmp(a, "--rope-scaling")) {
        NEED_VAL;
        if (model_rope_scaling_from_name(val, strlen(val)) < 0) {
            fprintf(stderr, "tpinfer %s: --rope-scaling expects none, linear or yarn, got '%s'\n",
                    cmd, val);
            return -1;
        }
        c->rope.scaling = val;
    } else if (!strcmp(a, "--rope-scale")) {
        NEED_VAL;
        char *end;
        const double v = strtod(val, &end);
        if (*end || end == val || !(v >= 1e-6) || !(v <= 1e6)) {
            fprintf(stderr, "tpinfer %s: --rope-scale expects a factor in [1e-6, 1e6], got '%s'\n",
                    cmd, val);
            return -1;
        }
        c->rope.scale = (float)v;
    } else if (!strcmp(a, "--yarn-orig-ctx")) {
        NEED_VAL;
        return parse_int(cmd, a, val, 1, 1 << 30, &c->rope.orig_ctx) ? -1 : 1;
    } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
        NEED_VAL;
        return parse_int(cmd, a, val, 0, 4096, &c->n_threads) ? -1 : 1;
    } else if (!strcmp(a, "--ubatch") || !strcmp(a, "-ub")) {
        NEED_VAL;
        return parse_int(cmd, a, val, 1, 1 << 20, &c->n_ubatch) ? -1 : 1;
    } else if (!strcmp(a, "--seed") || !strcmp(a, "-s")) {
        NEED_VAL;
        if (!strcmp(val, "-1")) { // llama.cpp's spelling of "a random seed"
            c->seed_set = false;
            c->seed_random = true;
            return 1;
        }
        char *end;
        errno = 0;
        unsigned long long v = strtoull(val, &end, 10);
        // strtoull takes "-2" as 2^64 - 2; a seed is written without a sign.
        if (errno || *end || end == val || val[strspn(val, " \t")] == '-') {
            fprintf(stderr,
                    "tpinfer %s: --seed expects an integer in [0, 2^64) or -1 (random), got "
                    "'%s'\n",
                    cmd, val);
            return -1;
        }
        c->seed = v;
        c->seed_set = true;
        c->seed_random = false;
    } else if (!strcmp(a, "--comm-timeout")) {
        NEED_VAL;
        char *end;
        c->comm_timeout_s = strtod(val, &end);
        if (*end || end == val || !(c->comm_timeout_s > 0) || !isfinite(c->comm_timeout_s)) {
            fprintf(stderr, "tpinfer %s: --comm-timeout expects seconds > 0, got '%s'\n", cmd, val);
            return -1;
        }
    } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
        c->verbose = true;
    } else {
        return 0;
    }
#undef NEED_VAL
    return 1;
}

int cli_rank(const struct cli_run *r) { return r->grid_ok ? r->grid.world_rank : 0; }

int cli_parse_ids(const char *s, int32_t **ids, int *n) {
    size_t cap = 16;
    *n = 0;
    *ids = malloc(sizeof(int32_t) * cap);
    if (!*ids) return -1;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX) goto bad;
        if ((size_t)*n == cap) {
            int32_t *q = realloc(*ids, sizeof(int32_t) * (cap *= 2));
            if (!q) goto bad;
            *ids = q;
        }
        (*ids)[(*n)++] = (int32_t)v;
        p = end;
        while (*p == ' ') p++;
        if (*p == ',') p++;
        else if (*p) goto bad;
    }
    if (*n > 0) return 0;
bad:
    free(*ids);
    *ids = NULL;
    return -1;
}

int cli_start(struct cli_run *r, struct cli_common *c, int *argc, char ***argv, const char *cmd) {
    memset(r, 0, sizeof *r);
    struct tpi_error err = {0};
    grid_set_wait(c->comm_timeout_s);
    if (grid_mpi_init(argc, argv, &err)) {
        fprintf(stderr, "tpinfer %s: %s\n", cmd, err.msg);
        return 1;
    }
    // The grid's own errors (tp*pp != ranks) are the same on every rank: print once; a
    // timeout or MPI's failure only the ranks that met it know.
    if (grid_init(&r->grid, c->tp, c->pp, &err)) {
        int rank = 0;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        if (err.status != TPI_ERR_INVALID)
            fprintf(stderr, "tpinfer %s: error on rank %d: %s\n", cmd, rank, err.msg);
        else if (rank == 0)
            fprintf(stderr, "tpinfer %s: %s\n", cmd, err.msg);
        grid_free(&r->grid);
        grid_mpi_finalize();
        return 1;
    }
    r->grid_ok = true;
    tpi_log_set(c->verbose ? TPI_LOG_DEBUG : TPI_LOG_INFO,
                r->grid.world_size > 1 ? r->grid.world_rank : -1);

    // One seed for the run: rank 0's choice, so the identity check agrees and a run
    // can be repeated from the seed it reports. Every rank takes part, given --seed or
    // not (a rank without it takes rank 0's; a rank whose own differs fails the check).
    uint64_t seed0 = 0;
    if (cli_shared_seed(r->grid.world, !c->seed_set, c->seed, &seed0, &err))
        return cli_fail_all(r, cmd, &err);
    if (!c->seed_set) c->seed = seed0;
    if (!c->model) {
        err = (struct tpi_error){TPI_ERR_INVALID, ""};
        snprintf(err.msg, sizeof err.msg, "no model given (-m FILE)");
        return cli_fail_all(r, cmd, &err);
    }
    // Backend and communicator: nccl goes with cuda, mpi with the CPU.
    const char *backend = c->backend;
    int n_dev = 0;
    if (!strcmp(backend, "auto"))
        backend = ops_cuda_get() && ops_cuda_available(&n_dev) && n_dev > 0 ? "cuda" : "cpu";
    const char *comm = c->comm ? c->comm : cli_default_comm(backend);
    struct model_params p = {
        .path = c->model,
        .backend = backend,
        .n_threads = c->n_threads,
        .comm = (enum comm_kind)comm_kind_from_name(comm),
        .comm_timeout_s = c->comm_timeout_s,
        .n_ctx = c->n_ctx,
        .rope = c->rope,
        .n_ubatch = c->n_ubatch,
        .pp_layers = c->n_pp_layers ? c->pp_layers : NULL,
        .n_pp_layers = c->n_pp_layers,
        .seed = c->seed,
    };
    int rc = model_load(&r->model, &p, &r->grid, &err);
    if (rc) return cli_fail_all(r, cmd, &err);
    rc = tok_load(r->model->gguf, &r->tok, &err);
    if ((rc = grid_agree(&r->grid, rc, &err))) return cli_fail_all(r, cmd, &err);
    return 0;
}

int cli_finish(struct cli_run *r, int code) {
    tok_free(&r->tok);
    model_free(&r->model);
    if (r->grid_ok) grid_free(&r->grid);
    r->grid_ok = false;
    grid_mpi_finalize();
    return code;
}

int cli_fail_all(struct cli_run *r, const char *cmd, const struct tpi_error *err) {
    // A timeout is not known to every rank alike (rank 0 may be the one stuck): each rank
    // that met one says so.
    if (err->status == TPI_ERR_TIMEOUT)
        fprintf(stderr, "tpinfer %s: error on rank %d: %s\n", cmd, cli_rank(r), err->msg);
    else if (cli_rank(r) == 0)
        fprintf(stderr, "tpinfer %s: error: %s\n", cmd, err->msg);
    return cli_finish(r, 1);
}

int cli_fail_rank(struct cli_run *r, const char *cmd, const struct tpi_error *err) {
    fprintf(stderr, "tpinfer %s: error on rank %d: %s\n", cmd, cli_rank(r), err->msg);
    fflush(stderr);
    if (r->grid_ok && r->grid.world_size > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    return cli_finish(r, 1);
}

void cli_unescape(char *s) {
    char *out = s;
    for (const char *in = s; *in; in++) {
        if (in[0] != '\\' || !in[1]) {
            *out++ = *in;
            continue;
        }
        const char c = in[1];
        const char *plain = strchr("nrt'\"\\", c);
        if (plain) {
            *out++ = c == 'n' ? '\n' : c == 'r' ? '\r' : c == 't' ? '\t' : c;
            in++;
            continue;
        }
        const int hi = c == 'x' && in[2] ? tpi_hex_digit(in[2]) : -1;
        const int lo = hi >= 0 && in[3] ? tpi_hex_digit(in[3]) : -1;
        if (lo >= 0 && (hi | lo)) {
            *out++ = (char)(hi * 16 + lo);
            in += 3;
            continue;
        }
        *out++ = *in; // an unknown escape: the backslash stays, the next char follows
    }
    *out = '\0';
}

const char *cli_default_comm(const char *backend) {
#ifdef TPI_HAVE_NCCL
    return !strcmp(backend, "cuda") ? "nccl" : "mpi";
#else // built without NCCL: several GPUs talk through MPI
    (void)backend;
    return "mpi";
#endif
}
