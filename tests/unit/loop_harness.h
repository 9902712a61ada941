/* The event-loop half of the harness of the tests that run a server (or a
 * client pool) on their own libevent loop (http_harness.h, test_upstream.c):
 * the loop with a tick, a scratch directory under /tmp, and waits bounded
 * by WAIT_MS that turn the loop until a condition holds.
 *
 * The fixture types differ from test to test, so the including file
 * defines HARNESS_CTX as its fixture's type first. That type must be
 * complete at the include and have at least these members:
 *     struct event_base *base; struct event *tick; char dir[64]; int n_close; */
#ifndef LOOP_HARNESS_H
#define LOOP_HARNESS_H

#ifndef HARNESS_CTX
#error "define HARNESS_CTX as the fixture's type before including loop_harness.h"
#endif

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

/* Every helper is static and a test uses only some of them. */
#define HARNESS static __attribute__((unused))

#define WAIT_MS 30000

HARNESS long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000L + ts.tv_nsec / 1000000;
}

HARNESS void on_tick(evutil_socket_t fd, short what, void *arg) {}

/* Gives t a fresh loop and the scratch directory /tmp/<prefix>-XXXXXX.
 * The tick wakes the loop every 5 ms so that waits can check children
 * and clocks even when no socket is ready. */
HARNESS void loop_open(HARNESS_CTX *t, const char *prefix)
{
    signal(SIGPIPE, SIG_IGN);
    t->base = event_base_new();
    assert_non_null(t->base);
    t->tick = event_new(t->base, -1, EV_PERSIST, on_tick, NULL);
    assert_non_null(t->tick);
    struct timeval tv = {0, 5000};
    assert_int_equal(event_add(t->tick, &tv), 0);
    snprintf(t->dir, sizeof(t->dir), "/tmp/%s-XXXXXX", prefix);
    assert_non_null(mkdtemp(t->dir));
}

/* Frees the loop and removes the scratch directory; whatever ran on the
 * loop (server, pool) must be freed first. */
HARNESS void loop_close(HARNESS_CTX *t)
{
    event_free(t->tick);
    event_base_free(t->base);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", t->dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", t->dir);
}

typedef bool (*cond_fn)(HARNESS_CTX *t, void *arg);

/* Turns the loop until cond holds: false if it did not in WAIT_MS. */
HARNESS bool run_until(HARNESS_CTX *t, cond_fn cond, void *arg)
{
    long deadline = now_ms() + WAIT_MS;
    while (!cond(t, arg)) {
        if (now_ms() > deadline)
            return false;
        event_base_loop(t->base, EVLOOP_ONCE);
    }
    return true;
}

/* Turns the loop for about `ms` (for checks that nothing more happens). */
HARNESS void run_for(HARNESS_CTX *t, int ms)
{
    long end = now_ms() + ms;
    while (now_ms() < end)
        event_base_loop(t->base, EVLOOP_ONCE);
}

HARNESS bool closes_reach(HARNESS_CTX *t, void *arg)
{
    return t->n_close >= *(int *)arg;
}

#endif
