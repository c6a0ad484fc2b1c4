/*
 * watchdog.c — see watchdog.h. One pthread per watched context; it sleeps on a
 * condition variable for a period (a quarter of the timeout, at most 1 s), so stopping
 * it is immediate.
 */
#define _POSIX_C_SOURCE 200809L
#include "watchdog.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

struct tpi_watchdog {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    double (*probe)(void *arg);
    void *arg;
    double timeout_s, period_s;
    int world_rank;
    tpi_watchdog_fire_fn fire;
};

static void default_fire(void *arg, int world_rank, double waited_s) {
    (void)arg;
    fprintf(stderr,
            "[rank %d] tpinfer: waited %.0f s for this rank's GPU work to finish (a collective "
            "whose peer is not taking part?); stopping (TPI_COMM_OP_TIMEOUT sets the limit)\n",
            world_rank, waited_s);
    fflush(stderr);
    _exit(3);
}

static void *watch(void *p) {
    struct tpi_watchdog *w = p;
    pthread_mutex_lock(&w->mu);
    while (!w->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        const double t = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + w->period_s;
        ts.tv_sec = (time_t)t;
        ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
        while (!w->stop && pthread_cond_timedwait(&w->cv, &w->mu, &ts) != ETIMEDOUT) {
        }
        if (w->stop) break;
        const double waited = w->probe(w->arg);
        if (waited > w->timeout_s) {
            pthread_mutex_unlock(&w->mu);
            w->fire(w->arg, w->world_rank, waited);
            pthread_mutex_lock(&w->mu);
            break; // fired once (the default never returns)
        }
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

int tpi_watchdog_start(struct tpi_watchdog **out, double (*probe)(void *arg), void *arg,
                       double timeout_s, int world_rank, tpi_watchdog_fire_fn fire,
                       struct tpi_error *err) {
    *out = NULL;
    if (timeout_s <= 0 || !probe) return TPI_OK;
    struct tpi_watchdog *w = calloc(1, sizeof *w);
    if (!w) return tpi_err(err, TPI_ERR_NOMEM, "watchdog: out of memory");
    w->probe = probe;
    w->arg = arg;
    w->timeout_s = timeout_s;
    w->period_s = timeout_s / 4 < 1.0 ? timeout_s / 4 : 1.0;
    w->world_rank = world_rank;
    w->fire = fire ? fire : default_fire;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->thread, NULL, watch, w) != 0) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        free(w);
        return tpi_err(err, TPI_ERR_INVALID, "watchdog: cannot start a thread on rank %d",
                       world_rank);
    }
    *out = w;
    return TPI_OK;
}

void tpi_watchdog_stop(struct tpi_watchdog **wp) {
    if (!wp || !*wp) return;
    struct tpi_watchdog *w = *wp;
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
    *wp = NULL;
}
