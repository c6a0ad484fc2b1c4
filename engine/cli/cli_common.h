/*
 * cli_common.h — what the model-running subcommands share: the common options
 * (--tp, --pp, --pp-layers, --backend, --comm, -c, -t, --ubatch, --seed,
 * --comm-timeout) and the sampling options, MPI + rank-grid setup, loading the model and
 * tokenizer on every rank, and ending a run so that an error on any rank is one clear line
 * and a non-zero exit everywhere, never a hang.
 */
#ifndef CLI_COMMON_H
#define CLI_COMMON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "model/model.h"
#include "model/sampling.h"
#include "parallel/grid.h"

struct tokenizer;

struct cli_common {
    const char *model;    /* -m */
    int tp, pp;           /* --tp, --pp (1) */
    int pp_layers[MODEL_MAX_STAGES];
    int n_pp_layers;      /* --pp-layers a,b,... */
    const char *backend;  /* --backend cpu|cuda|auto (auto) */
    const char *comm;     /* --comm mpi|nccl (nccl with cuda, else mpi) */
    int n_ctx;            /* -c/--ctx-size (0: min(4096, model context)) */
    struct model_rope_opts rope; /* --rope-scaling, --rope-scale, --yarn-orig-ctx */
    int n_threads;        /* -t/--threads (0: all cores) */
    int n_ubatch;         /* --ubatch (512) */
    uint64_t seed;        /* --seed (random, the same on every rank) */
    bool seed_set;        /* --seed N given */
    bool seed_random;     /* --seed -1 given: random even where the command's default is not */
    double comm_timeout_s;/* --comm-timeout (60) */
    bool verbose;         /* -v */
};

/* Defaults. */
void cli_common_init(struct cli_common *c);

/* If argv[*i] is a common option, consume it (and its value, advancing *i) and
 * return 1; 0 when it is not one; -1 after printing a usage error to stderr. */
int cli_common_parse(struct cli_common *c, int argc, char **argv, int *i, const char *cmd);

/* The common options' help lines (ctx_line: with -c, which perplexity words itself). */
void cli_common_usage(FILE *f, bool ctx_line);

/* If argv[*i] is a sampling option (--temp, --top-k, --top-p, --min-p, --repeat-penalty,
 * --repeat-last-n, --presence-penalty, --frequency-penalty), check its value's range,
 * store it in sp, add its bit (enum sampler_field) to *set, advance *i past the value and
 * return 1; 0 when it is not one; -1 after printing a usage error to stderr. */
int cli_sampling_parse(struct sampler_params *sp, unsigned *set, int argc, char **argv, int *i,
                       const char *cmd);

/* Take the model's recommended sampling (model_sampling_defaults) into sp for the
 * fields not in `set`; world rank 0 (root) says on stderr which it took. */
void cli_sampling_from_model(struct sampler_params *sp, unsigned set, const struct model *m,
                             bool root, const char *cmd);

/* The sampling options' help lines, with the defaults sampler_params_default sets. */
void cli_sampling_usage(FILE *f);

/* World rank 0's seed into *out, broadcast: `seed`, or one it draws when `draw`.
 * Collective: every rank calls it, whatever its own options say. Errors: a rank that did
 * not come within grid_wait() seconds (TPI_ERR_TIMEOUT), MPI's failure. */
int cli_shared_seed(MPI_Comm world, bool draw, uint64_t seed, uint64_t *out,
                    struct tpi_error *err);

/* The context of a running command on one rank. */
struct cli_run {
    struct tpi_grid grid;
    bool grid_ok;
    struct model *model;
    struct tokenizer *tok;
};

/* MPI init, grid (tp x pp over the world), a shared seed, then the model and the
 * tokenizer on every rank. On error prints one line (on world rank 0, or on every
 * rank when the grid could not be built) and returns non-zero. */
int cli_start(struct cli_run *r, struct cli_common *c, int *argc, char ***argv, const char *cmd);

/* Free the model, the grid and MPI; returns `code`. */
int cli_finish(struct cli_run *r, int code);

/* A runtime error that may be local to this rank (forward, comm): print it with the
 * rank and stop every rank (MPI_Abort when there are several). Returns 1. */
int cli_fail_rank(struct cli_run *r, const char *cmd, const struct tpi_error *err);

/* An error every rank has in common (agreed, or decided from the same inputes):
 * printed once by world rank 0. Returns 1 after cli_finish. */
int cli_fail_all(struct cli_run *r, const char *cmd, const struct tpi_error *err);

/* World rank (0 before the grid exists). */
int cli_rank(const struct cli_run *r);

/* Parse "1,2,3" into a malloc'd int32 array; -1 on a bad list. */
int cli_parse_ids(const char *s, int32_t **ids, int *n);

/* The communicator a backend uses unless --comm says: nccl with cuda (when built with
 * NCCL), else mpi. */
const char *cli_default_comm(const char *backend);

/* llama.cpp's escapes (its default --escape), in place: \n \r \t \' \" \\ and \xHH
 * (not \x00, which would end the string); any other backslash stays as it is. */
void cli_unescape(char *s);

#endif /* CLI_COMMON_H */
