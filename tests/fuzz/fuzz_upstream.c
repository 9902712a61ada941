/* libFuzzer target for the upstream HTTP/2 client pool: the input is what
 * a server sends on a client connection, after an empty SETTINGS frame
 * (prepended, so that the fuzzer spends its time on what follows). The
 * connection is the pool's own over a socketpair (gw_upstream_adopt), on
 * which three requests were sent, each used as a caller would: one
 * consumes every piece and, if it fails, is sent again to a target that
 * does not exist; one uploads a body larger than the initial window and
 * cancels after a little data without consuming it (or at its trailers);
 * one cancels from inside on_response. Trailers are read whole. Then the
 * server end is closed, and every request must have had exactly one final
 * callback (or have been cancelled), in order, and the connection must be
 * gone.
 *
 * Build: cmake -B build-fuzz -DCMAKE_C_COMPILER=clang -DINFERGATE_FUZZ=ON
 *        && cmake --build build-fuzz --target fuzz_upstream
 * Run:   ./build-fuzz/fuzz_upstream -max_total_time=180 CORPUS_DIR tests/fuzz/corpus_upstream */
#include "gateway/upstream/upstream_internal.h"
#include "fuzz_loop.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#define TARGET "unix:/nonexistent/fuzz-peer.sock"
#define RETRY_TARGET "unix:/nonexistent/fuzz-retry.sock"
#define UPLOAD (70 * 1024)

static struct event_base *base;
static gw_upstream_pool *pool;
static uint8_t upload[UPLOAD];

typedef struct freq {
    gw_upstream_req *r;
    int mode;
    bool responded, done, retried;
    size_t got;
    unsigned sum;
} freq;

static freq reqs[3];
static int n_live;

static const gw_upstream_cbs cbs;

static void finish(freq *f)
{
    if (f->done)
        abort();
    f->done = true;
    f->r = NULL;
    n_live--;
}

static void on_response(void *ud, int status, const gw_http_header *h, size_t n)
{
    freq *f = ud;
    if (f->done || f->responded || status < 200 || status > 999)
        abort();
    f->responded = true;
    for (size_t i = 0; i < n; i++) /* every string must be readable */
        f->sum += (unsigned)strlen(h[i].name) + (unsigned)strlen(h[i].value);
    if (f->mode == 2) {
        gw_upstream_cancel(f->r);
        finish(f);
    }
}

static void on_data(void *ud, const uint8_t *data, size_t len)
{
    freq *f = ud;
    if (f->done || !f->responded || !len)
        abort();
    for (size_t i = 0; i < len; i++)
        f->sum += data[i];
    f->got += len;
    if (f->mode == 0) {
        gw_upstream_consume(f->r, len);
    } else if (f->got > 1000) { /* mode 1: cancels with data unconsumed */
        gw_upstream_cancel(f->r);
        finish(f);
    }
}

static void on_end(void *ud)
{
    freq *f = ud;
    if (!f->responded)
        abort();
    finish(f);
}

static void on_error(void *ud, gw_upstream_error e, bool responded)
{
    freq *f = ud;
    if (f->done || responded != f->responded || !strcmp(gw_upstream_error_name(e), "unknown"))
        abort();
    if (f->mode == 0 && !f->retried) {
        f->retried = true;
        f->responded = false;
        f->r = gw_upstream_send(pool, RETRY_TARGET, "GET", "/retry", NULL, NULL, 0, NULL, 0, &cbs, f);
        if (f->r)
            return;
    }
    finish(f);
}

/* Trailers come after the response, before its end, and read whole; mode
 * 2 already cancelled in on_response, so mode 1 cancels here. */
static void on_trailers(void *ud, const gw_http_header *h, size_t n)
{
    freq *f = ud;
    if (f->done || !f->responded)
        abort();
    for (size_t i = 0; i < n; i++)
        f->sum += (unsigned)strlen(h[i].name) + (unsigned)strlen(h[i].value);
    if (f->mode == 1) {
        gw_upstream_cancel(f->r);
        finish(f);
    }
}

static const gw_upstream_cbs cbs = {on_response, on_data, on_end, on_error, on_trailers};

static void init(void)
{
    signal(SIGPIPE, SIG_IGN);
    gw_upstream_opts o;
    gw_upstream_opts_default(&o);
    o.stream_window = 65535;
    o.connect_timeout_ms = 1000;
    char err[256];
    if (!(base = event_base_new()) || !(pool = gw_upstream_pool_new(base, &o, err, sizeof(err))))
        abort();
    for (size_t i = 0; i < UPLOAD; i++)
        upload[i] = (uint8_t)(i * 31);
}

static size_t conns_left(void)
{
    return gw_upstream_conn_count(pool, TARGET) + gw_upstream_conn_count(pool, RETRY_TARGET);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint8_t settings[9] = {0, 0, 0, 4, 0, 0, 0, 0, 0};
    if (!base)
        init();
    int sv[2];
    fz_socketpair(sv);
    if (gw_upstream_adopt(pool, TARGET, sv[0]))
        abort();
    static const gw_http_header h[] = {{"content-type", "application/json"}, {"x-request-id", "fuzz"}};
    memset(reqs, 0, sizeof(reqs));
    n_live = 3;
    for (int i = 0; i < 3; i++) {
        reqs[i].mode = i;
        reqs[i].r = gw_upstream_send(pool, TARGET, i == 1 ? "POST" : "GET", "/v1/completions", NULL, h, 2,
                                     i == 1 ? upload : NULL, i == 1 ? UPLOAD : 0, &cbs, &reqs[i]);
        if (!reqs[i].r)
            abort();
    }
    if (write(sv[1], settings, sizeof(settings)) != (ssize_t)sizeof(settings))
        abort();
    fz_feed(base, sv[1], data, size);
    close(sv[1]);
    for (int turn = 0; turn < 1000 && (n_live || conns_left()); turn++)
        event_base_loop(base, EVLOOP_NONBLOCK);
    if (n_live || conns_left() || pool->pending) {
        fprintf(stderr, "leftover: %d requests, %zu connections\n", n_live,
                gw_upstream_conn_count(pool, TARGET));
        abort();
    }
    return 0;
}
