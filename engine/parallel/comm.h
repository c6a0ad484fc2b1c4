/*
 * comm.h — the communicator interface: one vtable, two implementations chosen
 * at run time (--comm nccl|mpi). A `struct comm` is one group of ranks (a TP
 * group, a PP chain, the world). Every call is ordered on the backend's stream:
 * NCCL enqueues on it; MPI waits for it, stages device buffers through pinned
 * host memory, and returns when the data is in place.
 *
 * Calls and bytes are counted per collective in c->stats (tests and bench read
 * them). Errors never abort: each call returns a status and fills err with the
 * rank and the failing call.
 */
#ifndef COMM_H
#define COMM_H

#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../kernels/ops.h"
#include "../tpi.h"

enum comm_kind { COMM_MPI = 0, COMM_NCCL = 1 };
enum comm_dtype { COMM_F32 = 0, COMM_F16, COMM_BF16, COMM_I32, COMM_U8, COMM_DTYPE_COUNT };
enum comm_op {
    COMM_OP_ALLREDUCE = 0,
    COMM_OP_ALLGATHER,
    COMM_OP_SEND,
    COMM_OP_RECV,
    COMM_OP_BCAST,
    COMM_OP_BARRIER,
    COMM_OP_COUNT
};

struct comm_stats {
    uint64_t calls[COMM_OP_COUNT];
    uint64_t bytes[COMM_OP_COUNT]; /* payload bytes this rank sent or reduced */
};

struct comm;

struct comm_vtable {
    int (*allreduce_sum)(struct comm *c, void *buf, size_t count, enum comm_dtype dt,
                         struct tpi_error *err);
    /* dst += the group's sum of src (F32; src may be clobbered); optional: comm.c
     * otherwise sums in place and adds with the backend's add. */
    int (*allreduce_add)(struct comm *c, float *src, float *dst, size_t count,
                         struct tpi_error *err);
    /* allreduce_add of n_rows x n_cols, then h = rmsnorm(dst) * w; optional, and it may
     * decline (*normed = false) after doing the allreduce_add alone. */
    int (*allreduce_add_norm)(struct comm *c, float *src, float *dst, int n_rows, int n_cols,
                              const float *w, float eps, float *h, bool *normed,
                              struct tpi_error *err);
    int (*allgather)(struct comm *c, const void *send, void *recv, size_t count,
                     enum comm_dtype dt, struct tpi_error *err);
    int (*send)(struct comm *c, const void *buf, size_t count, enum comm_dtype dt, int peer,
                struct tpi_error *err);
    int (*recv)(struct comm *c, void *buf, size_t count, enum comm_dtype dt, int peer,
                struct tpi_error *err);
    int (*bcast)(struct comm *c, void *buf, size_t count, enum comm_dtype dt, int root,
                 struct tpi_error *err);
    int (*barrier)(struct comm *c, struct tpi_error *err);
    void (*destroy)(struct comm *c);
};

struct comm {
    const struct comm_vtable *vt;
    enum comm_kind kind;
    int rank, size;            /* within this group */
    int world_rank;            /* for messages */
    MPI_Comm mpi;              /* the group as an MPI communicator (owned by the caller) */
    const struct ops *ops;     /* backend whose memory the buffers live in */
    struct ops_ctx *octx;
    double timeout_s;          /* init / collective timeout (NCCL) */
    struct comm_stats stats;
    void *impl;                /* implementation state */
};

/* Create a communicator over the MPI group `group` (collective over it). Buffers
 * passed later live in `ops` memory. NCCL init is non-blocking with `timeout_s`;
 * on timeout the error names rank, host, GPU and the NCCL_SOCKET_IFNAME /
 * NCCL_DEBUG=INFO hints. COMM_NCCL without CUDA is TPI_ERR_UNSUPPORTED. */
int comm_create(struct comm **out, enum comm_kind kind, MPI_Comm group, const struct ops *ops,
                struct ops_ctx *octx, double timeout_s, struct tpi_error *err);
/* Destroy and set *c to NULL; accepts NULL. Does not free c->mpi. */
void comm_free(struct comm **c);

/* In-place sum over the group of `count` items at buf. */
int comm_allreduce_sum(struct comm *c, void *buf, size_t count, enum comm_dtype dt,
                       struct tpi_error *err);
/* dst += the sum over the group of every rank's src (count f32 items; src's contents
 * are undefined afterwards): the tensor-parallel residual update. Counted as an
 * all-reduce. */
int comm_allreduce_add(struct comm *c, float *src, float *dst, size_t count,
                       struct tpi_error *err);
/* comm_allreduce_add over n_rows x n_cols, and where the communicator can do it in the
 * same pass (the peer all-reduce, decode-sized steps) also h = x / sqrt(mean(x^2) + eps)
 * * w per row: *normed says whether h was written (if not, the caller runs its norm). */
int comm_allreduce_add_norm(struct comm *c, float *src, float *dst, int n_rows, int n_cols,
                            const float *w, float eps, float *h, bool *normed,
                            struct tpi_error *err);
/* recv (size * count items, rank-major) = every rank's send (count items). */
int comm_allgather(struct comm *c, const void *send, void *recv, size_t count,
                   enum comm_dtype dt, struct tpi_error *err);
/* Point-to-point to/from group rank `peer`. */
int comm_send(struct comm *c, const void *buf, size_t count, enum comm_dtype dt, int peer,
              struct tpi_error *err);
int comm_recv(struct comm *c, void *buf, size_t count, enum comm_dtype dt, int peer,
              struct tpi_error *err);
/* Broadcast `count` items from group rank `root`. */
int comm_bcast(struct comm *c, void *buf, size_t count, enum comm_dtype dt, int root,
               struct tpi_error *err);
int comm_barrier(struct comm *c, struct tpi_error *err);

/* The limit on one collective after set-up: TPI_COMM_OP_TIMEOUT seconds, default 600
 * (the MPI communicator's per-call timeout, and the GPU watchdog's). */
double comm_op_timeout_s(void);

/* Bytes of one item of dt. */
size_t comm_dtype_size(enum comm_dtype dt);
/* "mpi" / "nccl"; and parse, -1 when unknown. */
const char *comm_kind_name(enum comm_kind k);
int comm_kind_from_name(const char *name);
/* Item i of a host buffer of dt as a double, and set it from one (f16/bf16 rounded
 * to nearest even): what correctness checks of collectives compare. */
double comm_item_get(const void *buf, enum comm_dtype dt, size_t i);
void comm_item_set(void *buf, enum comm_dtype dt, size_t i, double v);

/* Name of a collective ("allreduce", ...). */
const char *comm_op_name(enum comm_op op);

#endif /* COMM_H */
