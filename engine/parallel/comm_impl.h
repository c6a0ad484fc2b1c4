/*
 * comm_impl.h — private to engine/parallel: what comm.c (the dispatcher) shares
 * with the two implementations (comm_mpi.c, comm_nccl.c) and with grid.c.
 * Nothing outside engine/parallel includes this.
 */
#ifndef COMM_IMPL_H
#define COMM_IMPL_H

#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>

#include "comm.h"

/* Fill c->vt and c->impl for the MPI communicator (collective over c->mpi; every
 * rank has already arrived). On error c->impl is left NULL. */
int comm_mpi_init(struct comm *c, struct tpi_error *err);

/* Same for NCCL: bootstrap the unique id over c->mpi and init with the timeout.
 * Every rank posts the same MPI calls whatever fails locally, so the group
 * never deadlocks on mismatched collectives. Without TPI_HAVE_NCCL: UNSUPPORTED. */
int comm_nccl_init(struct comm *c, struct tpi_error *err);

struct peer_ar;
/* The one-shot peer all-reduce for c's group (comm_peer.c; TPI_HAVE_NCCL builds):
 * collective over c->mpi; NULL when the group agreed not to use it. why gets "on
 * (...)" or "off (reason)". */
struct peer_ar *comm_peer_ar_create(struct comm *c, bool one_host, char *why, size_t n_why);
/* Wait for the group, unmap and free; collective; accepts NULL. */
void comm_peer_ar_free(struct comm *c, struct peer_ar *p);

/* True when the comm's buffers are device memory (the "cuda" backend). */
bool comm_on_device(const struct comm *c);

/* Wait for `req` with MPI_Test and a backoff sleep; timeout_s <= 0 waits forever.
 * Returns TPI_OK, TPI_ERR_TIMEOUT (req still pending) or TPI_ERR_COMM. */
int comm_poll_request(MPI_Request *req, double timeout_s);

/* Agreement over `group` with nonblocking MPI and a timeout: every rank passes its
 * status and err; all return the most telling failure (a non-timeout failure
 * before a timeout, then the lowest rank) with err "rank R (host H): msg", or
 * TPI_OK when all were OK. Buffers of an abandoned request are leaked on purpose. */
int comm_agree(MPI_Comm group, int status, double timeout_s, struct tpi_error *err);

/* Text of an MPI error code. */
const char *comm_mpi_errstr(int code, char *buf, size_t n);

/* This host's name (gethostname), never NULL. */
const char *comm_host_name(char *buf, size_t n);

#endif /* COMM_IMPL_H */
