/*
 * test_watchdog.c — the device-wait watchdog (engine/parallel/watchdog.c) with a probe
 * the test controls: silent while the probe stays under the timeout, one call of the
 * fire function soon after it passes it (with the rank and the wait), nothing started
 * for a zero timeout, a prompt stop, and the default action in a child process: one
 * line on stderr naming the rank, exit status 3.
 */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "parallel/watchdog.h"
#include "testutil.h"
#include "tpi.h"

struct fake {
    double t0;      /* the simulated wait started then (0: not waiting) */
    double report;  /* when > 0, the probe reports this wait instead (no clock, no load) */
    int fired;
    int rank;
    double waited;
};

static double probe(void *arg) {
    const struct fake *f = arg;
    double r;
    __atomic_load(&f->report, &r, __ATOMIC_SEQ_CST);
    if (r > 0) return r;
    return f->t0 > 0 ? tpi_time_s() - f->t0 : 0.0;
}

static void on_fire(void *arg, int rank, double waited) {
    struct fake *f = arg;
    f->fired++;
    f->rank = rank;
    f->waited = waited;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

START_TEST(test_quiet_then_fires_once) {
    struct fake f = {0};
    struct tpi_watchdog *w = NULL;
    struct tpi_error err = {0};
    ck_assert_int_eq(tpi_watchdog_start(&w, probe, &f, 0.3, 5, on_fire, &err), TPI_OK);
    ck_assert_ptr_nonnull(w);
    sleep_s(0.8); // not waiting: nothing happens
    ck_assert_int_eq(__atomic_load_n(&f.fired, __ATOMIC_SEQ_CST), 0);
    f.t0 = tpi_time_s(); // a wait starts and never ends
    double t = 0;
    while (__atomic_load_n(&f.fired, __ATOMIC_SEQ_CST) == 0 && t < 3.0) {
        sleep_s(0.02);
        t = tpi_time_s() - f.t0;
    }
    ck_assert_msg(f.fired == 1, "fired %d times in %.2f s", f.fired, t);
    // soon after: the period is 0.075 s; the bound leaves room for a loaded machine
    ck_assert_msg(t >= 0.3 && t < 2.0, "fired after %.2f s for a 0.3 s timeout", t);
    ck_assert_int_eq(f.rank, 5);
    ck_assert(f.waited > 0.3);
    sleep_s(0.5); // once only
    ck_assert_int_eq(f.fired, 1);
    tpi_watchdog_stop(&w);
    ck_assert_ptr_null(w);
}
END_TEST

START_TEST(test_short_waits_never_fire) {
    // The probe reports waits under the timeout (set by the test, not read off a clock,
    // so a loaded machine cannot stretch them); the watchdog polls many times meanwhile.
    struct fake f = {0};
    struct tpi_watchdog *w = NULL;
    struct tpi_error err = {0};
    ck_assert_int_eq(tpi_watchdog_start(&w, probe, &f, 0.4, 0, on_fire, &err), TPI_OK);
    static const double waits[] = {0.1, 0.39, 0.2, 0.399};
    for (int i = 0; i < 8; i++) {
        double r = waits[i % 4];
        __atomic_store(&f.report, &r, __ATOMIC_SEQ_CST);
        sleep_s(0.12);
        r = -1.0; // not waiting
        __atomic_store(&f.report, &r, __ATOMIC_SEQ_CST);
        sleep_s(0.03);
    }
    ck_assert_int_eq(__atomic_load_n(&f.fired, __ATOMIC_SEQ_CST), 0);
    tpi_watchdog_stop(&w);
    ck_assert_ptr_null(w);
}
END_TEST

START_TEST(test_stop_is_prompt) {
    // A 40 s timeout polls once a second; stopping must not wait for the next poll.
    struct fake f = {0};
    struct tpi_watchdog *w = NULL;
    struct tpi_error err = {0};
    ck_assert_int_eq(tpi_watchdog_start(&w, probe, &f, 40.0, 0, on_fire, &err), TPI_OK);
    sleep_s(0.05);
    const double t0 = tpi_time_s();
    tpi_watchdog_stop(&w); // the thread waits on a condition variable
    const double took = tpi_time_s() - t0;
    ck_assert_msg(took < 0.5, "stop took %.2f s (a poll is 1 s)", took);
    ck_assert_int_eq(f.fired, 0);
}
END_TEST

START_TEST(test_zero_timeout_starts_nothing) {
    struct fake f = {0};
    struct tpi_watchdog *w = (struct tpi_watchdog *)&f;
    struct tpi_error err = {0};
    ck_assert_int_eq(tpi_watchdog_start(&w, probe, &f, 0.0, 0, on_fire, &err), TPI_OK);
    ck_assert_ptr_null(w);
    tpi_watchdog_stop(&w); // NULL is fine
    tpi_watchdog_stop(NULL);
}
END_TEST

static double stuck(void *arg) {
    (void)arg;
    return 1e6;
}

START_TEST(test_default_action_stops_the_process) {
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    const pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        struct tpi_watchdog *w = NULL;
        struct tpi_error err = {0};
        if (tpi_watchdog_start(&w, stuck, NULL, 0.2, 7, NULL, &err)) _exit(10);
        sleep_s(5.0); // the watchdog ends the process long before this returns
        _exit(11);
    }
    close(fds[1]);
    char buf[1024] = {0};
    size_t n = 0;
    ssize_t k;
    while (n < sizeof buf - 1 && (k = read(fds[0], buf + n, sizeof buf - 1 - n)) > 0) n += (size_t)k;
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    fprintf(stderr, "child stderr: %s", buf);
    ck_assert(WIFEXITED(st));
    ck_assert_int_eq(WEXITSTATUS(st), 3);
    ck_assert_ptr_nonnull(strstr(buf, "[rank 7]"));
    ck_assert_ptr_nonnull(strstr(buf, "TPI_COMM_OP_TIMEOUT"));
    ck_assert_ptr_null(strchr(strchr(buf, '\n') + 1, '\n')); // one line
}
END_TEST

int main(void) {
    Suite *s = suite_create("watchdog");
    TCase *tc = tcase_create("watchdog");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_quiet_then_fires_once);
    tcase_add_test(tc, test_short_waits_never_fire);
    tcase_add_test(tc, test_stop_is_prompt);
    tcase_add_test(tc, test_zero_timeout_starts_nothing);
    tcase_add_test(tc, test_default_action_stops_the_process);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
