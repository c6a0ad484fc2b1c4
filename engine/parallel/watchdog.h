/*
 * watchdog.h — a thread that stops a rank whose host has been waiting for its GPU too
 * long. A collective on the device (an NCCL call, the peer all-reduce of a large sum)
 * whose peer never takes part leaves the host blocked in a stream sync with no error
 * to return; after the timeout the watchdog prints one line naming the rank and how
 * long it waited, and ends the process (exit code 3), so mpirun ends the job instead
 * of every rank waiting forever. Quiet and cheap otherwise: one probe per period.
 */
#ifndef TPI_WATCHDOG_H
#define TPI_WATCHDOG_H

#include "../tpi.h"

struct tpi_watchdog;

/* What the watchdog does when the probe passes the timeout (default: print and _exit). */
typedef void (*tpi_watchdog_fire_fn)(void *arg, int world_rank, double waited_s);

/* Start watching: probe(arg) returns the seconds the host has been blocked (0: not
 * waiting); above timeout_s, fire(arg, world_rank, waited) runs once on the watchdog
 * thread (fire NULL: the default). timeout_s <= 0 starts nothing (*out = NULL, TPI_OK). */
int tpi_watchdog_start(struct tpi_watchdog **out, double (*probe)(void *arg), void *arg,
                       double timeout_s, int world_rank, tpi_watchdog_fire_fn fire,
                       struct tpi_error *err);
/* Stop and join the thread, free, set *w to NULL; accepts NULL. */
void tpi_watchdog_stop(struct tpi_watchdog **w);

#endif /* TPI_WATCHDOG_H */
