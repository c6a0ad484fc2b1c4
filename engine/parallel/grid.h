/*
 * grid.h — MPI bootstrap and the rank grid: world = tp * pp, tp_rank = rank % tp,
 * pp_stage = rank / tp (TP groups are consecutive ranks, so mpirun's by-slot
 * fill keeps a TP group on one node). The local rank on a node picks the GPU.
 *
 * Also the agreement helpers that keep ranks from hanging: every fallible step
 * that other ranks wait on ends in grid_agree(), so one rank's failure becomes
 * every rank's clear error instead of a hang.
 */
#ifndef GRID_H
#define GRID_H

#include <mpi.h>
#include <stdint.h>

#include "../tpi.h"
#include "comm.h"

struct tpi_grid {
    int world_size, world_rank;
    int tp, pp;
    int tp_rank, pp_stage;
    int local_rank, local_size; /* on this node (MPI_COMM_TYPE_SHARED) */
    char host[256];
    MPI_Comm world;   /* dup of MPI_COMM_WORLD, MPI_ERRORS_RETURN */
    MPI_Comm tp_comm; /* ranks of this stage: size tp, rank tp_rank */
    MPI_Comm pp_comm; /* ranks with this tp_rank across stages: size pp, rank pp_stage */
    MPI_Comm node;    /* ranks on this node */
};

/* MPI_Init_thread (FUNNELED) unless already initialised; sets MPI_ERRORS_RETURN on
 * MPI_COMM_WORLD. Under mpirun with several ranks, a rank still inside MPI_Init after
 * grid_wait() seconds (a peer never started it) prints so and exits 1 (SIGALRM).
 * Safe to call more than once. */
int grid_mpi_init(int *argc, char ***argv, struct tpi_error *err);
/* MPI_Finalize if grid_mpi_init initialised MPI; with several ranks first a barrier that
 * waits grid_set_wait's seconds, after which it prints why and calls MPI_Abort (a peer
 * that never comes would keep MPI_Finalize waiting forever). */
void grid_mpi_finalize(void);

/* How long start-up (MPI_Init under a launcher, grid_init, cli's shared seed) and
 * grid_mpi_finalize wait for every rank: the run's --comm-timeout (default 60 s); call it
 * before grid_mpi_init. Seconds <= 0 keep the current value. */
void grid_set_wait(double seconds);

/* The limit grid_set_wait set. */
double grid_wait(void);

/* Wait for a nonblocking collective posted on g->world (`what` names it) at most
 * TPI_COMM_OP_TIMEOUT seconds; when it fails or times out, print one line saying so
 * (`cmd`, this rank, what) and end the job with MPI_Abort: the peers may be waiting in
 * the same call, and its buffers may still be in use. Returns only on success. */
void grid_wait_or_abort(const struct tpi_grid *g, MPI_Request *req, const char *cmd,
                        const char *what);

/* Wait for a nonblocking MPI request at most timeout_s seconds (<= 0: no limit), testing
 * it with short sleeps: TPI_OK, TPI_ERR_TIMEOUT (the request is still pending: its
 * buffers must stay allocated) or TPI_ERR_COMM. */
int grid_poll(MPI_Request *req, double timeout_s);

/* Build the grid for tp x pp over MPI_COMM_WORLD (collective). Errors when
 * tp*pp != world size ("--tp 2 --pp 1 needs 2 ranks, launched with 1: run under
 * mpirun -np 2"), tp or pp < 1. */
int grid_init(struct tpi_grid *g, int tp, int pp, struct tpi_error *err);
void grid_free(struct tpi_grid *g);

/* World rank of (tp_rank, pp_stage). */
int grid_rank_of(const struct tpi_grid *g, int tp_rank, int pp_stage);

/* Collective over g->world: every rank passes its local status and err. Returns
 * TPI_OK when all ranks were OK; otherwise every rank returns the first failing
 * rank's status, with err = "rank R (host H): <its message>"; a rank that does not
 * come within TPI_COMM_OP_TIMEOUT is a TPI_ERR_TIMEOUT on the ranks that did. */
int grid_agree(const struct tpi_grid *g, int status, struct tpi_error *err);

/* MPI_Bcast of n items of dt at buf from world rank root, over g->world, that gives up
 * after TPI_COMM_OP_TIMEOUT (TPI_ERR_TIMEOUT naming the ranks; the request is left
 * posted, so the caller stops the job rather than reuse buf). */
int grid_bcast(const struct tpi_grid *g, void *buf, int n, MPI_Datatype dt, int root,
               struct tpi_error *err);

/* The run identity ranks must share before loading a model. */
struct run_identity {
    uint64_t model_size;     /* total bytes of all parts */
    uint64_t metadata_hash;  /* gguf_metadata_hash */
    uint64_t data_hash;      /* gguf_data_sample_hash */
    int32_t tp, pp;
    int32_t backend;         /* 0 cpu, 1 cuda */
    int32_t comm;            /* enum comm_kind */
    int32_t n_ctx;
    int32_t n_slot;          /* sequences in the KV cache (--parallel) */
    int32_t n_ubatch;        /* micro-batch capacity */
    uint64_t seed;
    uint64_t pp_layers_hash; /* FNV-1a of --pp-layers (0: balanced) */
    uint64_t rope_hash;      /* FNV-1a of the rope scaling options (0: none given) */
};

/* Allgather every rank's identity and compare with rank 0's: on a mismatch every
 * rank returns TPI_ERR_INVALID naming the field and the ranks ("model file
 * differs: rank 1 has size X, rank 0 has Y"). */
int grid_check_identity(const struct tpi_grid *g, const struct run_identity *id,
                        struct tpi_error *err);

/* One value every rank of a command must share: what it is (an option or an input, as
 * the user gave it) and its value, or a hash of it when `hashed` (not printed). */
struct grid_same {
    const char *what;
    uint64_t value;
    int hashed;
};

/* Allgather n values per rank (giving up after TPI_COMM_OP_TIMEOUT) and compare each
 * with rank 0's: on a mismatch every rank returns TPI_ERR_INVALID naming the first
 * value that differs and the ranks ("rank 1's -n is 5, rank 0's is 8": every rank must be
 * given the same options and inputs). */
int grid_check_same(const struct tpi_grid *g, const struct grid_same *vals, int n,
                    struct tpi_error *err);

#endif /* GRID_H */
