/* Tests of the upstream HTTP/2 client pool (gateway/upstream/upstream.c,
 * gateway/upstream/conn.c) against the project's own HTTP/2 server
 * (gateway/http/http.h), an independently written peer, run on the same loop in
 * this process: over a Unix socket, TCP and TLS. Where a fault is needed
 * that the server cannot make on cue, a small fault-injecting peer in this
 * file plays the server: one that accepts and closes, one that accepts and
 * says nothing, one that answers the first stream and sends GOAWAY.
 *
 * Every wait is bounded (WAIT_MS, loop_harness.h); only 127.0.0.1 and
 * files under /tmp are used. Nothing asserts on timing. Callbacks check
 * that they never run inside a gw_upstream_* call (t->in_api). */
#define _GNU_SOURCE /* memmem */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "gateway/http/http_internal.h"     /* to count the server's connections */
#include "gateway/upstream/upstream_internal.h" /* to count the pool's connections */

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <openssl/ssl.h>

#define ECHO_BIG (1 << 20)
#define FLOW_TOTAL (3 << 19)  /* 1.5 MiB: more than the server buffers for a stream */
#define FLOW_WINDOW (1 << 16) /* the client's stream window in the flow-control test */
#define FRAME_MAX 16384

/* ---- the fixture: server, pool, loop ---- */

typedef struct tctx tctx;

typedef struct sstream { /* the server's side of a stream */
    tctx *t;
    gw_http_stream *s;
    struct event *ev;
    int n;
    size_t written;
    char mode; /* 's'tream, 'f'low, 'w' slow, 'd'rip */
} sstream;

struct tctx {
    struct event_base *base;
    struct event *tick;
    gw_http_server *srv;
    gw_upstream_pool *pool;
    gw_upstream_opts opts;
    char dir[64];
    char unix_target[128], tcp_target[64];
    int port;
    bool in_api;
    /* server side */
    int n_request, n_close, n_finished, n_unfinished;
    size_t max_conns;
    char authority[64], custom[64];
    size_t flow_pending_max;
    int flow_enobufs;
};

#define HARNESS_CTX tctx
#include "loop_harness.h"

static void on_stream_tick(evutil_socket_t fd, short what, void *arg)
{
    sstream *ss = arg;
    if (ss->mode == 's' || ss->mode == 'd') {
        char piece[32];
        if (ss->n < (ss->mode == 'd' ? 12 : 10)) {
            int len = snprintf(piece, sizeof(piece), "piece %d\n", ss->n++);
            assert_int_equal(gw_http_write(ss->s, piece, (size_t)len), 0);
        } else {
            assert_int_equal(gw_http_end(ss->s), 0);
            event_del(ss->ev);
        }
    } else if (ss->mode == 'f') {
        /* Writes until the server refuses to hold more for this stream;
         * the client's window decides how much of it leaves. */
        uint8_t chunk[FRAME_MAX];
        while (ss->written < FLOW_TOTAL) {
            for (size_t i = 0; i < sizeof(chunk); i++)
                chunk[i] = (uint8_t)((ss->written + i) * 13 + ((ss->written + i) >> 11));
            int rc = gw_http_write(ss->s, chunk, sizeof(chunk));
            if (rc == -ENOBUFS) {
                ss->t->flow_enobufs++;
                break;
            }
            assert_int_equal(rc, 0);
            ss->written += sizeof(chunk);
            if (gw_http_pending(ss->s) > ss->t->flow_pending_max)
                ss->t->flow_pending_max = gw_http_pending(ss->s);
        }
        if (ss->written == FLOW_TOTAL) {
            assert_int_equal(gw_http_end(ss->s), 0);
            event_del(ss->ev);
        }
    }
}

static void srv_on_request(void *ud, gw_http_stream *s, const gw_http_request *req)
{
    tctx *t = ud;
    t->n_request++;
    if (t->srv->n_conns > t->max_conns)
        t->max_conns = t->srv->n_conns;
    sstream *ss = calloc(1, sizeof(*ss));
    assert_non_null(ss);
    ss->t = t;
    ss->s = s;
    gw_http_set_user(s, ss);
    const char *p = req->path, *v;
    snprintf(t->authority, sizeof(t->authority), "%s", req->authority ? req->authority : "");
    snprintf(t->custom, sizeof(t->custom), "%s", (v = gw_http_header_get(req, "x-custom")) ? v : "");
    gw_http_header h[] = {{"content-type", "text/plain"}, {"x-test", "yes"}};
    if (!strcmp(p, "/hello")) {
        assert_string_equal(req->method, "GET");
        assert_int_equal(gw_http_respond(s, 200, h, 2, "hello world\n", 12), 0);
    } else if (!strcmp(p, "/echo")) {
        assert_string_equal(req->method, "POST");
        assert_int_equal(gw_http_respond(s, 200, h, 2, req->body, req->body_len), 0);
    } else if (!strcmp(p, "/stream") || !strcmp(p, "/flow") || !strcmp(p, "/slow") || !strcmp(p, "/drip")) {
        assert_int_equal(gw_http_begin(s, 200, h, 2), 0);
        ss->mode = p[1] == 's' && p[2] == 't' ? 's' : p[1] == 'f' ? 'f' : p[1] == 'd' ? 'd' : 'w';
        if (ss->mode == 'w') { /* one piece, then nothing, ever */
            assert_int_equal(gw_http_write(s, "first\n", 6), 0);
            return;
        }
        ss->ev = event_new(t->base, -1, EV_PERSIST, on_stream_tick, ss);
        assert_non_null(ss->ev);
        struct timeval tv = {0, ss->mode == 'd' ? 50000 : 2000};
        assert_int_equal(event_add(ss->ev, &tv), 0);
    } else if (!strcmp(p, "/trailers")) {
        /* a body, then two trailer fields */
        gw_http_header tr[] = {{"x-energy", "1.5 2"}, {"x-two", "b"}};
        assert_int_equal(gw_http_begin(s, 200, h, 2), 0);
        assert_int_equal(gw_http_write(s, "body\n", 5), 0);
        assert_int_equal(gw_http_end_trailers(s, tr, GW_HTTP_MAX_TRAILERS + 1), -EINVAL);
        assert_int_equal(gw_http_end_trailers(s, tr, 2), 0);
        assert_int_equal(gw_http_end_trailers(s, tr, 2), -EINVAL); /* ended already */
    } else if (!strcmp(p, "/hang")) {
        /* never answered */
    } else {
        assert_int_equal(gw_http_respond(s, 404, h, 1, "no\n", 3), 0);
    }
}

static void srv_on_close(void *ud, gw_http_stream *s, void *stream_ud, bool finished)
{
    tctx *t = ud;
    sstream *ss = stream_ud;
    assert_non_null(ss);
    t->n_close++;
    if (finished)
        t->n_finished++;
    else
        t->n_unfinished++;
    if (ss->ev)
        event_free(ss->ev);
    free(ss);
}

static int setup(void **state)
{
    tctx *t = calloc(1, sizeof(*t));
    assert_non_null(t);
    loop_open(t, "infergate-up");
    gw_http_handler h = {.on_request = srv_on_request, .on_close = srv_on_close};
    t->srv = gw_http_server_new(t->base, NULL, &h, t);
    assert_non_null(t->srv);
    char spec[128], err[256] = "";
    snprintf(spec, sizeof(spec), "unix:%s/s.sock", t->dir);
    if (gw_http_server_listen(t->srv, spec, err, sizeof(err)))
        fail_msg("listen: %s", err);
    snprintf(t->unix_target, sizeof(t->unix_target), "%s", spec);
    if (gw_http_server_listen(t->srv, "tcp:127.0.0.1:0", err, sizeof(err)))
        fail_msg("listen: %s", err);
    t->port = gw_http_server_port(t->srv);
    assert_true(t->port > 0);
    snprintf(t->tcp_target, sizeof(t->tcp_target), "tcp:127.0.0.1:%d", t->port);
    gw_upstream_opts_default(&t->opts);
    *state = t;
    return 0;
}

static int teardown(void **state)
{
    tctx *t = *state;
    if (t->pool)
        gw_upstream_pool_free(t->pool);
    if (t->srv)
        gw_http_server_free(t->srv);
    loop_close(t);
    free(t);
    return 0;
}

static gw_upstream_pool *pool(tctx *t)
{
    if (!t->pool) {
        char err[256] = "";
        t->pool = gw_upstream_pool_new(t->base, &t->opts, err, sizeof(err));
        if (!t->pool)
            fail_msg("pool: %s", err);
    }
    return t->pool;
}

/* ---- client requests ---- */

typedef struct creq {
    tctx *t;
    gw_upstream_req *r;
    int status;
    int n_response, n_data, n_end, n_error;
    gw_upstream_error err;
    bool responded;
    bool hold;               /* do not consume: the flow-control test */
    bool cancel_in_response; /* cancel from inside on_response */
    char x_test[16];
    char trailers[64]; /* "name=value;" each, as on_trailers gave them */
    size_t len_at_trailers;
    uint8_t *body;
    size_t len, cap, unconsumed;
    /* on_error sends this instead (a caller's retry) */
    const char *retry_target;
    struct creq *cancel_on_error; /* on_error cancels this other request, if still out */
} creq;

static bool creq_done(const creq *c)
{
    return c->n_end + c->n_error > 0;
}

static void c_on_response(void *ud, int status, const gw_http_header *h, size_t n)
{
    creq *c = ud;
    assert_false(c->t->in_api);
    assert_false(creq_done(c));
    assert_int_equal(c->n_response, 0);
    c->n_response++;
    c->status = status;
    for (size_t i = 0; i < n; i++) {
        assert_true(h[i].name[0] != ':');
        if (!strcmp(h[i].name, "x-test"))
            snprintf(c->x_test, sizeof(c->x_test), "%s", h[i].value);
    }
    if (c->cancel_in_response) {
        gw_upstream_cancel(c->r);
        c->r = NULL;
    }
}

static void c_on_data(void *ud, const uint8_t *data, size_t len)
{
    creq *c = ud;
    assert_false(c->t->in_api);
    assert_false(creq_done(c));
    assert_int_equal(c->n_response, 1);
    assert_non_null(c->r);
    c->n_data++;
    if (c->len + len > c->cap) {
        c->cap = (c->len + len) * 2;
        c->body = realloc(c->body, c->cap);
        assert_non_null(c->body);
    }
    memcpy(c->body + c->len, data, len);
    c->len += len;
    if (c->hold) {
        c->unconsumed += len;
    } else {
        gw_upstream_consume(c->r, len); /* from inside the callback, as the gateway does */
    }
}

static void c_on_end(void *ud)
{
    creq *c = ud;
    assert_false(c->t->in_api);
    assert_false(creq_done(c));
    assert_int_equal(c->n_response, 1);
    c->n_end++;
    c->r = NULL;
}

static const gw_upstream_cbs cbs;

static void c_on_error(void *ud, gw_upstream_error e, bool responded)
{
    creq *c = ud;
    assert_false(c->t->in_api);
    assert_false(creq_done(c));
    assert_int_equal(responded, c->n_response > 0);
    c->r = NULL;
    if (c->retry_target) { /* the caller tries elsewhere, from inside the callback */
        const char *target = c->retry_target;
        c->retry_target = NULL;
        c->r = gw_upstream_send(c->t->pool, target, "GET", "/hello", NULL, NULL, 0, NULL, 0, &cbs, c);
        assert_non_null(c->r);
        return;
    }
    c->n_error++;
    c->err = e;
    c->responded = responded;
    if (c->cancel_on_error && c->cancel_on_error->r) {
        gw_upstream_cancel(c->cancel_on_error->r);
        c->cancel_on_error->r = NULL;
    }
}

static void c_on_trailers(void *ud, const gw_http_header *h, size_t n)
{
    creq *c = ud;
    assert_false(c->t->in_api);
    assert_false(creq_done(c));
    assert_int_equal(c->n_response, 1);
    assert_int_equal(c->trailers[0], '\0'); /* once */
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += (size_t)snprintf(c->trailers + k, sizeof(c->trailers) - k, "%s=%s;", h[i].name, h[i].value);
    c->len_at_trailers = c->len;
}

static const gw_upstream_cbs cbs = {c_on_response, c_on_data, c_on_end, c_on_error, c_on_trailers};

static void send_req(tctx *t, creq *c, const char *target, const char *method, const char *path,
                     const gw_http_header *h, size_t nh, const void *body, size_t len)
{
    c->t = t;
    t->in_api = true;
    c->r = gw_upstream_send(pool(t), target, method, path, NULL, h, nh, body, len, &cbs, c);
    t->in_api = false;
    assert_non_null(c->r);
}

static bool is_done(tctx *t, void *arg)
{
    return creq_done(arg);
}

static bool all_done(tctx *t, void *arg)
{
    creq *cs = arg;
    for (int i = 0; i < 100 && cs[i].t; i++)
        if (!creq_done(&cs[i]))
            return false;
    return true;
}

static void wait_done(tctx *t, creq *c)
{
    assert_true(run_until(t, is_done, c));
}

static void expect_ok(creq *c, int status, const char *body)
{
    if (c->n_error)
        fail_msg("request failed: %s (responded %d)", gw_upstream_error_name(c->err), c->responded);
    assert_int_equal(c->n_end, 1);
    assert_int_equal(c->status, status);
    if (body) {
        assert_int_equal(c->len, strlen(body));
        assert_memory_equal(c->body, body, c->len);
    }
}

static void expect_error(creq *c, gw_upstream_error e, bool responded)
{
    assert_int_equal(c->n_end, 0);
    assert_int_equal(c->n_error, 1);
    if (c->err != e)
        fail_msg("expected %s, got %s", gw_upstream_error_name(e), gw_upstream_error_name(c->err));
    assert_int_equal(c->responded, responded);
}

static uint8_t *random_bytes(size_t len, uint32_t seed)
{
    uint8_t *b = malloc(len);
    assert_non_null(b);
    for (size_t i = 0; i < len; i++) { /* every byte value, NULs included */
        seed = seed * 1103515245u + 12345u;
        b[i] = (uint8_t)(seed >> 16);
    }
    return b;
}

/* ---- GET and POST over Unix sockets and TCP ---- */

static void get_hello(tctx *t, const char *target)
{
    creq c = {0};
    int closes = t->n_close + 1;
    send_req(t, &c, target, "GET", "/hello", NULL, 0, NULL, 0);
    wait_done(t, &c);
    expect_ok(&c, 200, "hello world\n");
    assert_string_equal(c.x_test, "yes");
    assert_true(run_until(t, closes_reach, &closes));
    free(c.body);
}

static void test_get_unix(void **state)
{
    tctx *t = *state;
    get_hello(t, t->unix_target);
    assert_string_equal(t->authority, "localhost");
    assert_int_equal(t->n_finished, 1);
}

/* A response's trailers come after its whole body, before its end. */
static void test_trailers(void **state)
{
    tctx *t = *state;
    creq c = {0};
    send_req(t, &c, t->unix_target, "GET", "/trailers", NULL, 0, NULL, 0);
    wait_done(t, &c);
    expect_ok(&c, 200, "body\n");
    assert_string_equal(c.trailers, "x-energy=1.5 2;x-two=b;");
    assert_int_equal(c.len_at_trailers, 5);
    free(c.body);
}

static void test_get_tcp(void **state)
{
    tctx *t = *state;
    get_hello(t, t->tcp_target);
    char want[64], localhost[64];
    snprintf(want, sizeof(want), "127.0.0.1:%d", t->port);
    assert_string_equal(t->authority, want);
    snprintf(localhost, sizeof(localhost), "tcp:localhost:%d", t->port);
    get_hello(t, localhost);
    assert_int_equal(t->n_finished, 2);
    /* the same connection served the first request again */
    get_hello(t, t->tcp_target);
    assert_int_equal(gw_upstream_conn_count(t->pool, t->tcp_target), 1);
}

static void post_echo(tctx *t, const char *target, size_t len, uint32_t seed)
{
    uint8_t *body = random_bytes(len, seed);
    creq c = {0};
    gw_http_header h[] = {{"content-type", "application/octet-stream"}, {"x-custom", "passed through"}};
    t->in_api = true;
    c.t = t;
    c.r = gw_upstream_send(pool(t), target, "POST", "/echo", "example.test", h, 2, body, len, &cbs, &c);
    t->in_api = false;
    assert_non_null(c.r);
    memset(body, 0, len); /* the pool copied it */
    wait_done(t, &c);
    expect_ok(&c, 200, NULL);
    uint8_t *want = random_bytes(len, seed);
    assert_int_equal(c.len, len);
    assert_memory_equal(c.body, want, len);
    assert_string_equal(t->custom, "passed through");
    assert_string_equal(t->authority, "example.test");
    free(want);
    free(body);
    free(c.body);
}

static void test_post_unix(void **state)
{
    tctx *t = *state;
    post_echo(t, t->unix_target, 3, 1);
    post_echo(t, t->unix_target, ECHO_BIG, 2);
    post_echo(t, t->unix_target, 0, 3);
}

static void test_post_tcp(void **state)
{
    tctx *t = *state;
    post_echo(t, t->tcp_target, ECHO_BIG, 4);
    post_echo(t, t->tcp_target, 100000, 5);
}

/* The server answers 413 before the upload ended: the response arrives
 * whole, and the rest of the body is not sent. */
static void test_early_response(void **state)
{
    tctx *t = *state;
    size_t len = 2 * ECHO_BIG;
    uint8_t *body = random_bytes(len, 6);
    creq c = {0};
    send_req(t, &c, t->tcp_target, "POST", "/echo", NULL, 0, body, len);
    wait_done(t, &c);
    expect_ok(&c, 413, NULL);
    assert_non_null(memmem(c.body, c.len, "request_too_large", 17));
    assert_int_equal(t->n_request, 0);
    /* the connection still serves */
    get_hello(t, t->tcp_target);
    free(body);
    free(c.body);
}

/* ---- many streams, one connection ---- */

static void test_concurrent_one_conn(void **state)
{
    tctx *t = *state;
    creq *cs = calloc(101, sizeof(*cs));
    char bodies[100][16];
    assert_non_null(cs);
    for (int i = 0; i < 100; i++) {
        int n = snprintf(bodies[i], sizeof(bodies[i]), "request %d", i);
        send_req(t, &cs[i], t->tcp_target, "POST", "/echo", NULL, 0, bodies[i], (size_t)n);
    }
    assert_true(run_until(t, all_done, cs));
    for (int i = 0; i < 100; i++) {
        cs[i].body = realloc(cs[i].body, cs[i].len + 1);
        cs[i].body[cs[i].len] = '\0';
        expect_ok(&cs[i], 200, bodies[i]);
        free(cs[i].body);
    }
    assert_int_equal(t->n_request, 100);
    assert_int_equal(t->max_conns, 1);
    assert_int_equal(gw_upstream_conn_count(t->pool, t->tcp_target), 1);
    free(cs);
}

static void test_max_streams_per_conn(void **state)
{
    tctx *t = *state;
    t->opts.max_streams_per_conn = 4;
    creq cs[11] = {0};
    for (int i = 0; i < 10; i++)
        send_req(t, &cs[i], t->unix_target, "GET", "/hello", NULL, 0, NULL, 0);
    assert_true(run_until(t, all_done, cs));
    for (int i = 0; i < 10; i++) {
        expect_ok(&cs[i], 200, "hello world\n");
        free(cs[i].body);
    }
    /* 4 + 4 + 2: three connections, all still open */
    assert_int_equal(gw_upstream_conn_count(t->pool, t->unix_target), 3);
}

/* ---- streaming and flow control ---- */

static void test_stream_in_order(void **state)
{
    tctx *t = *state;
    creq c = {0};
    send_req(t, &c, t->unix_target, "GET", "/stream", NULL, 0, NULL, 0);
    wait_done(t, &c);
    char want[256] = "";
    for (int i = 0; i < 10; i++)
        snprintf(want + strlen(want), sizeof(want) - strlen(want), "piece %d\n", i);
    expect_ok(&c, 200, want);
    assert_true(c.n_data >= 2); /* it came in pieces */
    free(c.body);
}

static bool flow_blocked(tctx *t, void *arg)
{
    return t->flow_enobufs > 0 && ((creq *)arg)->len >= FLOW_WINDOW;
}

static void test_flow_control(void **state)
{
    tctx *t = *state;
    t->opts.stream_window = FLOW_WINDOW;
    creq c = {.hold = true};
    send_req(t, &c, t->tcp_target, "GET", "/flow", NULL, 0, NULL, 0);
    /* The caller consumes nothing: one window arrives, the rest piles up
     * at the server until its writes are refused. */
    assert_true(run_until(t, flow_blocked, &c));
    size_t got = c.len;
    assert_true(got > 0);
    assert_true(got <= FLOW_WINDOW + FRAME_MAX);
    assert_true(t->flow_pending_max > FLOW_TOTAL / 2);
    run_for(t, 100);
    assert_int_equal(c.len, got); /* nothing more until it consumes */
    assert_false(creq_done(&c));
    /* Consuming opens the window: the rest comes, in order. */
    t->in_api = true;
    gw_upstream_consume(c.r, c.unconsumed);
    t->in_api = false;
    c.unconsumed = 0;
    c.hold = false;
    wait_done(t, &c);
    expect_ok(&c, 200, NULL);
    assert_int_equal(c.len, FLOW_TOTAL);
    for (size_t i = 0; i < FLOW_TOTAL; i++)
        if (c.body[i] != (uint8_t)(i * 13 + (i >> 11)))
            fail_msg("byte %zu differs", i);
    free(c.body);
}

/* ---- cancel ---- */

static bool got_data(tctx *t, void *arg)
{
    return ((creq *)arg)->n_data > 0;
}

static void test_cancel(void **state)
{
    tctx *t = *state;
    creq c = {0};
    send_req(t, &c, t->unix_target, "GET", "/slow", NULL, 0, NULL, 0);
    assert_true(run_until(t, got_data, &c));
    t->in_api = true;
    gw_upstream_cancel(c.r);
    t->in_api = false;
    int one = 1;
    assert_true(run_until(t, closes_reach, &one));
    assert_int_equal(t->n_unfinished, 1); /* the server saw the reset */
    run_for(t, 50);
    assert_int_equal(c.n_end + c.n_error, 0); /* no callbacks after cancel */
    /* the connection goes on serving */
    get_hello(t, t->unix_target);
    assert_int_equal(gw_upstream_conn_count(t->pool, t->unix_target), 1);
    free(c.body);
}

static bool has_response(tctx *t, void *arg)
{
    return ((creq *)arg)->n_response > 0;
}

static void test_cancel_early(void **state)
{
    tctx *t = *state;
    /* cancelled before the pool even picked a connection */
    creq a = {0}, b = {.cancel_in_response = true};
    send_req(t, &a, t->unix_target, "GET", "/hello", NULL, 0, NULL, 0);
    t->in_api = true;
    gw_upstream_cancel(a.r);
    t->in_api = false;
    /* cancelled from inside its own on_response: no data, no end */
    send_req(t, &b, t->unix_target, "GET", "/hello", NULL, 0, NULL, 0);
    assert_true(run_until(t, has_response, &b));
    run_for(t, 50); /* for anything that should not come */
    assert_int_equal(a.n_response + a.n_data + a.n_end + a.n_error, 0);
    assert_int_equal(b.n_response, 1);
    assert_int_equal(b.n_data + b.n_end + b.n_error, 0);
    get_hello(t, t->unix_target);
}

/* ---- failures ---- */

static void test_connect_refused(void **state)
{
    tctx *t = *state;
    char target[160];
    /* no such socket file */
    creq a = {0};
    snprintf(target, sizeof(target), "unix:%s/none.sock", t->dir);
    send_req(t, &a, target, "GET", "/hello", NULL, 0, NULL, 0);
    /* a socket file nobody listens on */
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    snprintf(sun.sun_path, sizeof(sun.sun_path), "%s/dead.sock", t->dir);
    int ufd = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_int_equal(bind(ufd, (struct sockaddr *)&sun, sizeof(sun)), 0);
    creq b = {0};
    snprintf(target, sizeof(target), "unix:%s", sun.sun_path);
    send_req(t, &b, target, "GET", "/hello", NULL, 0, NULL, 0);
    /* a TCP port bound but not listening */
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int tfd = socket(AF_INET, SOCK_STREAM, 0);
    socklen_t sl = sizeof(sin);
    assert_int_equal(bind(tfd, (struct sockaddr *)&sin, sizeof(sin)), 0);
    assert_int_equal(getsockname(tfd, (struct sockaddr *)&sin, &sl), 0);
    creq c = {0};
    snprintf(target, sizeof(target), "tcp:127.0.0.1:%d", ntohs(sin.sin_port));
    send_req(t, &c, target, "GET", "/hello", NULL, 0, NULL, 0);
    /* the caller retries elsewhere from inside on_error */
    creq d = {.retry_target = t->unix_target};
    send_req(t, &d, target, "GET", "/hello", NULL, 0, NULL, 0);
    wait_done(t, &a);
    wait_done(t, &b);
    wait_done(t, &c);
    wait_done(t, &d);
    expect_error(&a, GW_UP_CONNECT, false);
    expect_error(&b, GW_UP_CONNECT, false);
    expect_error(&c, GW_UP_CONNECT, false);
    expect_ok(&d, 200, "hello world\n");
    assert_int_equal(gw_upstream_conn_count(t->pool, target), 0);
    close(ufd);
    close(tfd);
    free(d.body);
}

static void test_bad_targets(void **state)
{
    tctx *t = *state;
    const char *bad[] = {
        "foo:bar", "tcp:example.com:80", "tcp:127.0.0.1:0", "tcp:127.0.0.1:99999", "tcp:127.0.0.1",
        "unix:",   "tls:1.2.3.4",        "tcp:[::1:80",     "tcp:127.0.0.1:8x0",   NULL};
    creq c = {0};
    for (int i = 0; bad[i]; i++) {
        t->in_api = true;
        assert_null(gw_upstream_send(pool(t), bad[i], "GET", "/", NULL, NULL, 0, NULL, 0, &cbs, &c));
        assert_int_equal(gw_upstream_connect(t->pool, bad[i]), -EINVAL);
        t->in_api = false;
    }
    assert_null(gw_upstream_send(t->pool, t->tcp_target, NULL, "/", NULL, NULL, 0, NULL, 0, &cbs, &c));
    assert_string_equal(gw_upstream_error_name(GW_UP_RESET), "reset");
    assert_string_equal(gw_upstream_error_name(GW_UP_TIMEOUT), "timeout");
    assert_string_equal(gw_upstream_error_name(GW_UP_STALLED), "stalled");
    char err[256] = "";
    gw_upstream_opts o;
    gw_upstream_opts_default(&o);
    o.stream_window = 1u << 31;
    assert_null(gw_upstream_pool_new(t->base, &o, err, sizeof(err)));
    assert_non_null(strstr(err, "stream_window"));
}

static void test_server_killed(void **state)
{
    tctx *t = *state;
    creq a = {0}, b = {0};
    send_req(t, &a, t->unix_target, "GET", "/slow", NULL, 0, NULL, 0);
    send_req(t, &b, t->unix_target, "GET", "/hang", NULL, 0, NULL, 0);
    assert_true(run_until(t, got_data, &a));
    gw_http_server_free(t->srv); /* mid-stream */
    t->srv = NULL;
    wait_done(t, &a);
    wait_done(t, &b);
    expect_error(&a, GW_UP_RESET, true);
    expect_error(&b, GW_UP_RESET, false);
    assert_int_equal(gw_upstream_conn_count(t->pool, t->unix_target), 0);
    free(a.body);
}

/* The response timeout bounds each wait, not the whole response: no
 * headers in time, or a body that stops, fail; a body that keeps coming
 * (12 pieces 50 ms apart) runs as long as it takes. */
static void test_response_timeout(void **state)
{
    tctx *t = *state;
    t->opts.response_timeout_ms = 300;
    creq c = {0};
    send_req(t, &c, t->unix_target, "GET", "/hang", NULL, 0, NULL, 0);
    wait_done(t, &c);
    expect_error(&c, GW_UP_STALLED, false);
    int one = 1;
    assert_true(run_until(t, closes_reach, &one)); /* the server's stream was reset */
    assert_int_equal(t->n_unfinished, 1);
    creq d = {0};
    send_req(t, &d, t->unix_target, "GET", "/slow", NULL, 0, NULL, 0);
    wait_done(t, &d);
    assert_int_equal(d.status, 200);
    assert_int_equal(d.len, 6);
    expect_error(&d, GW_UP_STALLED, true);
    int two = 2;
    assert_true(run_until(t, closes_reach, &two));
    assert_int_equal(t->n_unfinished, 2);
    creq e = {0};
    send_req(t, &e, t->unix_target, "GET", "/drip", NULL, 0, NULL, 0);
    wait_done(t, &e);
    assert_int_equal(e.n_error, 0);
    assert_int_equal(e.n_end, 1);
    assert_int_equal(e.len, strlen("piece 0\n") * 10 + strlen("piece 10\n") * 2);
    /* A caller holding data it has not taken is behind, not the target:
     * the clock starts once it has taken it. */
    creq f = {.hold = true};
    send_req(t, &f, t->unix_target, "GET", "/slow", NULL, 0, NULL, 0);
    assert_true(run_until(t, got_data, &f));
    run_for(t, 700);
    assert_false(creq_done(&f));
    t->in_api = true;
    gw_upstream_consume(f.r, f.unconsumed);
    t->in_api = false;
    f.unconsumed = 0;
    wait_done(t, &f);
    expect_error(&f, GW_UP_STALLED, true);
    /* Changed to none, the timeout is off for the requests in flight too;
     * back on, it counts from their last progress. */
    creq g = {0}, h = {0};
    send_req(t, &g, t->unix_target, "GET", "/hang", NULL, 0, NULL, 0);
    gw_upstream_set_response_timeout(t->pool, 0);
    send_req(t, &h, t->unix_target, "GET", "/hang", NULL, 0, NULL, 0);
    run_for(t, 500);
    assert_false(creq_done(&g));
    assert_false(creq_done(&h));
    gw_upstream_set_response_timeout(t->pool, 100);
    wait_done(t, &g);
    wait_done(t, &h);
    expect_error(&g, GW_UP_STALLED, false);
    expect_error(&h, GW_UP_STALLED, false);
    free(d.body);
    free(e.body);
    free(f.body);
}

static bool either_done(tctx *t, void *arg)
{
    creq **c = arg;
    return creq_done(c[0]) || creq_done(c[1]);
}

/* Two requests stalled in one sweep, the first told cancels the second:
 * no callback comes for it after. The sweep took both off first and told
 * the second all the same. */
static void test_cancel_in_stall_sweep(void **state)
{
    tctx *t = *state;
    t->opts.response_timeout_ms = 200;
    creq a = {0}, b = {0};
    a.cancel_on_error = &b;
    b.cancel_on_error = &a;
    send_req(t, &a, t->unix_target, "GET", "/hang", NULL, 0, NULL, 0);
    send_req(t, &b, t->unix_target, "GET", "/hang", NULL, 0, NULL, 0);
    assert_true(run_until(t, either_done, (creq *[]){&a, &b}));
    run_for(t, 300);
    assert_int_equal(a.n_error + b.n_error, 1);
}

static bool no_conns(tctx *t, void *arg)
{
    return gw_upstream_conn_count(t->pool, arg) == 0 && t->srv->n_conns == 0;
}

static void test_idle_close(void **state)
{
    tctx *t = *state;
    t->opts.idle_close_ms = 100;
    get_hello(t, t->tcp_target);
    assert_int_equal(gw_upstream_conn_count(t->pool, t->tcp_target), 1);
    assert_true(run_until(t, no_conns, t->tcp_target));
    get_hello(t, t->tcp_target); /* a new one is made on demand */
}

static bool targets_at_most(tctx *t, void *arg)
{
    if (t->pool)
        up_pool_kick(t->pool); /* the sweep runs from the kick, at most once a second */
    return gw_upstream_target_count(t->pool) <= (size_t)(uintptr_t)arg;
}

/* A target nobody asks for, with no connection left, is forgotten after
 * idle_close_ms: one was kept for every endpoint string ever seen. */
static void test_targets_forgotten(void **state)
{
    tctx *t = *state;
    t->opts.idle_close_ms = 100;
    get_hello(t, t->tcp_target);
    creq c[8];
    int fds[8];
    for (int i = 0; i < 8; i++) { /* eight ports bound, not listening: refused at once */
        struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t sl = sizeof(sin);
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        assert_int_equal(bind(fds[i], (struct sockaddr *)&sin, sizeof(sin)), 0);
        assert_int_equal(getsockname(fds[i], (struct sockaddr *)&sin, &sl), 0);
        char target[64];
        snprintf(target, sizeof(target), "tcp:127.0.0.1:%d", ntohs(sin.sin_port));
        memset(&c[i], 0, sizeof(c[i]));
        send_req(t, &c[i], target, "GET", "/", NULL, 0, NULL, 0);
    }
    for (int i = 0; i < 8; i++) {
        wait_done(t, &c[i]);
        close(fds[i]);
    }
    assert_true(gw_upstream_target_count(t->pool) >= 9);
    assert_true(run_until(t, no_conns, t->tcp_target));
    assert_true(run_until(t, targets_at_most, (void *)(uintptr_t)0));
    get_hello(t, t->tcp_target); /* made again on demand */
    assert_int_equal(gw_upstream_target_count(t->pool), 1);
}

static void test_pool_free_with_streams(void **state)
{
    tctx *t = *state;
    creq a = {0}, b = {0};
    send_req(t, &a, t->unix_target, "GET", "/slow", NULL, 0, NULL, 0);
    assert_true(run_until(t, got_data, &a));
    send_req(t, &b, t->tcp_target, "GET", "/hello", NULL, 0, NULL, 0); /* still pending */
    t->in_api = true;
    gw_upstream_pool_free(t->pool); /* no callbacks */
    t->in_api = false;
    t->pool = NULL;
    int one = 1;
    assert_true(run_until(t, closes_reach, &one));
    assert_int_equal(t->n_unfinished, 1);
    assert_int_equal(a.n_end + a.n_error + b.n_response + b.n_end + b.n_error, 0);
    free(a.body);
}

/* ---- RTT ---- */

static bool have_rtt(tctx *t, void *arg)
{
    double e, p;
    return gw_upstream_rtt(t->pool, arg, &e, &p) == 0 && up_target_get(t->pool, arg)->n_rtt >= 3;
}

static void test_rtt(void **state)
{
    tctx *t = *state;
    double ewma = 0, p95 = 0;
    assert_int_equal(gw_upstream_rtt(pool(t), t->tcp_target, &ewma, &p95), -ENOENT);
    gw_upstream_set_ping_interval(t->pool, 20);
    t->in_api = true;
    assert_int_equal(gw_upstream_connect(t->pool, t->tcp_target), 0);
    assert_int_equal(gw_upstream_connect(t->pool, t->tcp_target), 0); /* one is enough */
    t->in_api = false;
    assert_true(run_until(t, have_rtt, t->tcp_target));
    assert_int_equal(gw_upstream_rtt(t->pool, t->tcp_target, &ewma, &p95), 0);
    assert_true(ewma > 0);
    assert_true(p95 > 0);
    assert_int_equal(gw_upstream_conn_count(t->pool, t->tcp_target), 1);
    assert_int_equal(t->srv->n_conns, 1);
    gw_upstream_set_ping_interval(t->pool, 0);
    assert_int_equal(gw_upstream_rtt(t->pool, "tcp:127.0.0.1:1", &ewma, &p95), -ENOENT);
}

static void test_rtt_stats(void **state)
{
    tctx *t = *state;
    up_target *tg = up_target_get(pool(t), "unix:/tmp/none.sock");
    assert_non_null(tg);
    for (int i = 1; i <= 100; i++)
        up_target_rtt_sample(tg, i); /* the last 64: 37..100 */
    double e, p;
    assert_int_equal(gw_upstream_rtt(t->pool, "unix:/tmp/none.sock", &e, &p), 0);
    assert_true(p == 97); /* ceil(0.95 * 64) = 61st of 37..100 */
    assert_true(e == 100); /* peak EWMA: every rise counts at once */
    /* a fall pulls it down by 1/8 a sample: slowly */
    up_target_rtt_sample(tg, 20);
    assert_int_equal(gw_upstream_rtt(t->pool, "unix:/tmp/none.sock", &e, &p), 0);
    assert_true(e == 90);
    for (int i = 0; i < 40; i++)
        up_target_rtt_sample(tg, 20);
    assert_int_equal(gw_upstream_rtt(t->pool, "unix:/tmp/none.sock", &e, &p), 0);
    assert_true(e > 20 && e < 21);
    /* and a jump of 5x reads in full with its first sample */
    up_target_rtt_sample(tg, 100);
    assert_int_equal(gw_upstream_rtt(t->pool, "unix:/tmp/none.sock", &e, &p), 0);
    assert_true(e == 100);
}

/* ---- fault-injecting peers ---- */

typedef enum fmode {
    F_CLOSE,  /* accepts and closes */
    F_SILENT, /* accepts and says nothing */
    F_HTTP1,  /* answers whatever comes like an HTTP/1.1 server */
    F_GOAWAY, /* first connection: answers the first of two streams, then GOAWAY; later ones answer all */
    F_DEAF,   /* sends its SETTINGS, then reads everything and answers nothing (not even PING) */
} fmode;

typedef struct fconn {
    int fd;
    struct event *ev;
    uint8_t buf[1 << 16];
    size_t len, off;
    bool magic;
    int n_headers;
    int32_t ids[8];
} fconn;

typedef struct fpeer {
    tctx *t;
    fmode mode;
    int lfd;
    struct event *lev;
    int n_accepted;
    fconn conns[4];
    char target[160];
} fpeer;

static void fwrite_all(int fd, const void *p, size_t n)
{
    assert_int_equal(write(fd, p, n), (ssize_t)n);
}

static void frame(int fd, uint8_t type, uint8_t flags, int32_t id, const void *payload, uint32_t len)
{
    uint8_t h[9] = {(uint8_t)(len >> 16), (uint8_t)(len >> 8), (uint8_t)len,       type,       flags,
                    (uint8_t)(id >> 24),  (uint8_t)(id >> 16), (uint8_t)(id >> 8), (uint8_t)id};
    fwrite_all(fd, h, 9);
    if (len)
        fwrite_all(fd, payload, len);
}

static void answer_200(int fd, int32_t id)
{
    static const uint8_t status_200 = 0x88; /* HPACK static table entry 8 */
    frame(fd, 1, 0x1 | 0x4, id, &status_200, 1);
}

static void on_fconn(evutil_socket_t fd, short what, void *arg)
{
    fpeer *f = arg;
    fconn *fc = NULL;
    int idx = 0;
    for (; idx < 4; idx++)
        if (f->conns[idx].fd == fd && f->conns[idx].ev) {
            fc = &f->conns[idx];
            break;
        }
    assert_non_null(fc);
    ssize_t n = read(fd, fc->buf + fc->len, sizeof(fc->buf) - fc->len);
    if (n <= 0) {
        event_del(fc->ev);
        return;
    }
    if (f->mode == F_DEAF)
        return;
    fc->len += (size_t)n;
    if (!fc->magic && fc->len >= 24) {
        fc->magic = true;
        fc->off = 24;
    }
    while (fc->magic && fc->len - fc->off >= 9) {
        const uint8_t *h = fc->buf + fc->off;
        size_t flen = (size_t)h[0] << 16 | (size_t)h[1] << 8 | h[2];
        if (fc->len - fc->off < 9 + flen)
            break;
        int32_t id =
            (int32_t)((uint32_t)(h[5] & 0x7f) << 24 | (uint32_t)h[6] << 16 | (uint32_t)h[7] << 8 | h[8]);
        if (h[3] == 1 && fc->n_headers < 8) { /* HEADERS */
            fc->ids[fc->n_headers++] = id;
            if (idx > 0) /* later connections answer everything */
                answer_200(fd, id);
        }
        fc->off += 9 + flen;
    }
    if (idx == 0 && fc->n_headers == 2) {
        uint8_t goaway[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int32_t last = fc->ids[0];
        goaway[0] = (uint8_t)(last >> 24);
        goaway[1] = (uint8_t)(last >> 16);
        goaway[2] = (uint8_t)(last >> 8);
        goaway[3] = (uint8_t)last;
        answer_200(fd, fc->ids[0]);
        frame(fd, 7, 0, 0, goaway, 8);
        fc->n_headers++; /* once */
    }
}

static void on_faccept(evutil_socket_t lfd, short what, void *arg)
{
    fpeer *f = arg;
    int fd = accept(lfd, NULL, NULL);
    if (fd == -1)
        return;
    if (f->mode == F_CLOSE || f->n_accepted >= 4) {
        close(fd);
        f->n_accepted++;
        return;
    }
    fconn *fc = &f->conns[f->n_accepted++];
    fc->fd = fd;
    if (f->mode == F_HTTP1) {
        static const char resp[] = "HTTP/1.1 400 Bad Request\r\nconnection: close\r\n\r\n";
        fwrite_all(fd, resp, sizeof(resp) - 1);
    }
    if (f->mode == F_GOAWAY || f->mode == F_DEAF) {
        frame(fd, 4, 0, 0, NULL, 0); /* our SETTINGS */
        fc->ev = event_new(f->t->base, fd, EV_READ | EV_PERSIST, on_fconn, f);
        assert_non_null(fc->ev);
        assert_int_equal(event_add(fc->ev, NULL), 0);
    }
}

static void fpeer_start(tctx *t, fpeer *f, fmode mode, bool tcp)
{
    memset(f, 0, sizeof(*f));
    f->t = t;
    f->mode = mode;
    for (int i = 0; i < 4; i++)
        f->conns[i].fd = -1;
    if (tcp) {
        struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t sl = sizeof(sin);
        f->lfd = socket(AF_INET, SOCK_STREAM, 0);
        assert_int_equal(bind(f->lfd, (struct sockaddr *)&sin, sizeof(sin)), 0);
        assert_int_equal(getsockname(f->lfd, (struct sockaddr *)&sin, &sl), 0);
        snprintf(f->target, sizeof(f->target), "tcp:127.0.0.1:%d", ntohs(sin.sin_port));
    } else {
        struct sockaddr_un sun = {.sun_family = AF_UNIX};
        snprintf(sun.sun_path, sizeof(sun.sun_path), "%s/fault.sock", t->dir);
        unlink(sun.sun_path);
        f->lfd = socket(AF_UNIX, SOCK_STREAM, 0);
        assert_int_equal(bind(f->lfd, (struct sockaddr *)&sun, sizeof(sun)), 0);
        snprintf(f->target, sizeof(f->target), "unix:%s", sun.sun_path);
    }
    assert_int_equal(listen(f->lfd, 16), 0);
    f->lev = event_new(t->base, f->lfd, EV_READ | EV_PERSIST, on_faccept, f);
    assert_non_null(f->lev);
    assert_int_equal(event_add(f->lev, NULL), 0);
}

static void fpeer_stop(fpeer *f)
{
    event_free(f->lev);
    close(f->lfd);
    for (int i = 0; i < 4; i++) {
        if (f->conns[i].ev)
            event_free(f->conns[i].ev);
        if (f->conns[i].fd >= 0)
            close(f->conns[i].fd);
    }
}

static void test_peer_closes_at_once(void **state)
{
    tctx *t = *state;
    fpeer f;
    fpeer_start(t, &f, F_CLOSE, false);
    creq c = {0};
    send_req(t, &c, f.target, "POST", "/echo", NULL, 0, "x", 1);
    wait_done(t, &c);
    expect_error(&c, GW_UP_CONNECT, false); /* no HTTP/2 from it: as good as refused */
    fpeer_stop(&f);
}

static void test_peer_silent(void **state)
{
    tctx *t = *state;
    t->opts.connect_timeout_ms = 150;
    fpeer f;
    fpeer_start(t, &f, F_SILENT, true);
    creq c = {0};
    send_req(t, &c, f.target, "GET", "/hello", NULL, 0, NULL, 0);
    wait_done(t, &c);
    expect_error(&c, GW_UP_TIMEOUT, false); /* no SETTINGS within connect_timeout_ms */
    assert_int_equal(f.n_accepted, 1);
    fpeer_stop(&f);
}

static bool rtt_over_50ms(tctx *t, void *arg)
{
    double e;
    return gw_upstream_rtt(t->pool, arg, &e, NULL) == 0 && e > 50000;
}

/* A peer whose connection stays up but that no longer answers anything
 * (a wedged process, a route that drops packets without a reset): once a
 * PING has gone unanswered for ten intervals the connection is given up,
 * and its requests fail rather than wait for ever. */
static void test_peer_deaf(void **state)
{
    tctx *t = *state;
    fpeer f;
    fpeer_start(t, &f, F_DEAF, true);
    gw_upstream_set_ping_interval(pool(t), 20);
    creq c = {0};
    send_req(t, &c, f.target, "GET", "/hello", NULL, 0, NULL, 0);
    /* meanwhile the PING out counts as an RTT of its age: past 50 ms
     * before the connection is given up at 200 */
    up_target_rtt_sample(up_target_get(pool(t), f.target), 1000);
    assert_true(run_until(t, rtt_over_50ms, f.target));
    wait_done(t, &c);
    expect_error(&c, GW_UP_TIMEOUT, false);
    assert_int_equal(gw_upstream_conn_count(t->pool, f.target), 0);
    gw_upstream_set_ping_interval(t->pool, 0);
    fpeer_stop(&f);
}

static bool accepted_two(tctx *t, void *arg)
{
    return ((fpeer *)arg)->n_accepted >= 2;
}

static void test_goaway(void **state)
{
    tctx *t = *state;
    fpeer f;
    fpeer_start(t, &f, F_GOAWAY, false);
    creq a = {0}, b = {0}, c = {0};
    send_req(t, &a, f.target, "GET", "/a", NULL, 0, NULL, 0);
    send_req(t, &b, f.target, "GET", "/b", NULL, 0, NULL, 0);
    wait_done(t, &a);
    wait_done(t, &b);
    expect_ok(&a, 200, "");
    expect_error(&b, GW_UP_REFUSED, false); /* above last_stream_id: never processed, sent elsewhere */
    /* the connection takes no new streams: the next request opens another */
    send_req(t, &c, f.target, "GET", "/c", NULL, 0, NULL, 0);
    wait_done(t, &c);
    expect_ok(&c, 200, "");
    assert_true(run_until(t, accepted_two, &f));
    assert_int_equal(f.n_accepted, 2);
    fpeer_stop(&f);
}

/* ---- TLS ---- */

static bool have_openssl(void)
{
    return system("openssl version >/dev/null 2>&1") == 0;
}

/* A CA, a server certificate for localhost and 127.0.0.1, one for another
 * name, a client certificate, and a second, unrelated CA. */
static void make_certs(tctx *t)
{
    char cmd[4096];
    snprintf(
        cmd, sizeof(cmd),
        "cd '%s' && exec >openssl.log 2>&1 && "
        "for ca in ca other; do openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
        "-keyout $ca.key -out $ca.crt -days 2 -subj /CN=test-$ca || exit 1; done && "
        "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' >srv.ext && "
        "printf 'subjectAltName=DNS:elsewhere.test\\n' >wrong.ext && "
        "printf 'extendedKeyUsage=clientAuth\\n' >cli.ext && "
        "for c in srv wrong cli; do openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
        "-keyout $c.key -out $c.csr -subj /CN=$c && "
        "openssl x509 -req -in $c.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile $c.ext "
        "-out $c.crt || exit 1; done",
        t->dir);
    if (system(cmd) != 0)
        fail_msg("openssl failed: see %s/openssl.log", t->dir);
}

static void path_in(tctx *t, char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", t->dir, name);
}

static int listen_tls(tctx *t, const char *cert, const char *key)
{
    char c[128], k[128], err[256] = "";
    path_in(t, c, sizeof(c), cert);
    path_in(t, k, sizeof(k), key);
    if (gw_http_server_listen_tls(t->srv, "tcp:127.0.0.1:0", c, k, err, sizeof(err)))
        fail_msg("listen_tls: %s", err);
    return gw_http_server_port(t->srv);
}

static void test_tls_config_errors(void **state)
{
    tctx *t = *state;
    if (!have_openssl())
        skip();
    make_certs(t);
    char ca[128], crt[128], key[128], other_key[128], missing[128], err[256];
    path_in(t, ca, sizeof(ca), "ca.crt");
    path_in(t, crt, sizeof(crt), "cli.crt");
    path_in(t, key, sizeof(key), "cli.key");
    path_in(t, other_key, sizeof(other_key), "other.key");
    path_in(t, missing, sizeof(missing), "missing.pem");
    gw_upstream_opts o;
    gw_upstream_opts_default(&o);
    struct {
        const char *ca, *cert, *key, *want;
    } cases[] = {
        {missing, NULL, NULL, "tls_ca_file"}, {key, NULL, NULL, "tls_ca_file"},
        {ca, crt, NULL, "go together"},       {ca, missing, key, "tls_cert_file"},
        {ca, crt, missing, "tls_key_file"},   {ca, crt, other_key, "mismatch"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        o.tls_ca_file = cases[i].ca;
        o.tls_cert_file = cases[i].cert;
        o.tls_key_file = cases[i].key;
        err[0] = '\0';
        assert_null(gw_upstream_pool_new(t->base, &o, err, sizeof(err)));
        if (!strstr(err, cases[i].want))
            fail_msg("case %zu: \"%s\" lacks \"%s\"", i, err, cases[i].want);
    }
    o.tls_cert_file = crt;
    o.tls_key_file = key;
    gw_upstream_pool *p = gw_upstream_pool_new(t->base, &o, err, sizeof(err));
    assert_non_null(p);
    gw_upstream_pool_free(p);
}

/* The response timeout shorter than the connect timeout, and a TLS peer
 * that never answers the ClientHello: the request never left, so its
 * target did not stall it (the proxy would not retry a stalled request
 * elsewhere): a timeout. */
static void test_never_sent_not_stalled(void **state)
{
    tctx *t = *state;
    if (!have_openssl())
        skip();
    make_certs(t);
    char ca[128], target[170];
    path_in(t, ca, sizeof(ca), "ca.crt");
    t->opts.tls_ca_file = ca;
    t->opts.connect_timeout_ms = 3000;
    t->opts.response_timeout_ms = 150;
    fpeer f;
    fpeer_start(t, &f, F_SILENT, true);
    creq c = {0};
    snprintf(target, sizeof(target), "tls:%s", f.target + 4);
    send_req(t, &c, target, "GET", "/hello", NULL, 0, NULL, 0);
    wait_done(t, &c);
    expect_error(&c, GW_UP_TIMEOUT, false);
    fpeer_stop(&f);
}

static void test_tls_failures(void **state)
{
    tctx *t = *state;
    if (!have_openssl())
        skip();
    make_certs(t);
    char other_ca[128];
    path_in(t, other_ca, sizeof(other_ca), "other.crt");
    t->opts.tls_ca_file = other_ca;
    t->opts.connect_timeout_ms = 300;
    char target[170];
    /* a cleartext peer that answers the ClientHello with HTTP/1.1 */
    fpeer f1;
    fpeer_start(t, &f1, F_HTTP1, true);
    creq a = {0};
    snprintf(target, sizeof(target), "tls:%s", f1.target + 4);
    send_req(t, &a, target, "GET", "/hello", NULL, 0, NULL, 0);
    /* a peer that never answers the ClientHello */
    fpeer f;
    fpeer_start(t, &f, F_SILENT, true);
    creq b = {0};
    snprintf(target, sizeof(target), "tls:%s", f.target + 4);
    send_req(t, &b, target, "GET", "/hello", NULL, 0, NULL, 0);
    /* a real TLS server whose certificate the pool's CA did not sign */
    int port = listen_tls(t, "srv.crt", "srv.key");
    creq c = {0};
    snprintf(target, sizeof(target), "tls:127.0.0.1:%d", port);
    send_req(t, &c, target, "GET", "/hello", NULL, 0, NULL, 0);
    wait_done(t, &a);
    wait_done(t, &b);
    wait_done(t, &c);
    expect_error(&a, GW_UP_CONNECT, false);
    expect_error(&b, GW_UP_TIMEOUT, false);
    expect_error(&c, GW_UP_CONNECT, false);
    assert_int_equal(t->n_request, 0);
    fpeer_stop(&f);
    fpeer_stop(&f1);
}

/* Files read again (a renewed certificate, a reload): the next connection
 * uses them; ones that do not load leave the pool as it was. */
static void test_tls_reload(void **state)
{
    tctx *t = *state;
    if (!have_openssl())
        skip();
    make_certs(t);
    char ca[128], other_ca[128], missing[128], err[256], target[64];
    path_in(t, ca, sizeof(ca), "ca.crt");
    path_in(t, other_ca, sizeof(other_ca), "other.crt");
    path_in(t, missing, sizeof(missing), "missing.pem");
    t->opts.tls_ca_file = other_ca;
    t->opts.connect_timeout_ms = 2000;
    snprintf(target, sizeof(target), "tls:127.0.0.1:%d", listen_tls(t, "srv.crt", "srv.key"));
    creq a = {0};
    send_req(t, &a, target, "GET", "/hello", NULL, 0, NULL, 0);
    wait_done(t, &a);
    expect_error(&a, GW_UP_CONNECT, false); /* the CA did not sign it */
    assert_int_equal(gw_upstream_set_tls(t->pool, missing, NULL, NULL, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "tls_ca_file"));
    creq b = {0};
    send_req(t, &b, target, "GET", "/hello", NULL, 0, NULL, 0);
    wait_done(t, &b);
    expect_error(&b, GW_UP_CONNECT, false); /* still the old CA */
    assert_int_equal(gw_upstream_set_tls(t->pool, ca, NULL, NULL, err, sizeof(err)), 0);
    get_hello(t, target);
}

static void test_tls(void **state)
{
    tctx *t = *state;
    if (!have_openssl())
        skip();
    make_certs(t);
    char ca[128], crt[128], key[128];
    path_in(t, ca, sizeof(ca), "ca.crt");
    path_in(t, crt, sizeof(crt), "cli.crt");
    path_in(t, key, sizeof(key), "cli.key");
    t->opts.tls_ca_file = ca;
    t->opts.tls_cert_file = crt; /* mutual TLS: offered when asked for */
    t->opts.tls_key_file = key;
    int port = listen_tls(t, "srv.crt", "srv.key");
    char by_ip[64], by_name[64];
    snprintf(by_ip, sizeof(by_ip), "tls:127.0.0.1:%d", port);
    snprintf(by_name, sizeof(by_name), "tls:localhost:%d", port);
    get_hello(t, by_ip);
    get_hello(t, by_name);
    post_echo(t, by_ip, ECHO_BIG, 7);
    /* the certificate names another host: verification fails */
    int wrong = listen_tls(t, "wrong.crt", "wrong.key");
    char target[64];
    snprintf(target, sizeof(target), "tls:127.0.0.1:%d", wrong);
    creq c = {0};
    send_req(t, &c, target, "GET", "/hello", NULL, 0, NULL, 0);
    wait_done(t, &c);
    expect_error(&c, GW_UP_CONNECT, false);
    /* RTT over TLS */
    gw_upstream_set_ping_interval(t->pool, 20);
    assert_true(run_until(t, have_rtt, by_ip));
}

/* Mutual TLS: the project's server does not ask for client certificates,
 * so a TLS terminator in this file does: it requires a certificate from
 * our CA, then pipes the cleartext to the server through a socketpair. */
typedef struct mtls_peer {
    tctx *t;
    SSL_CTX *ctx;
    int lfd, port;
    struct event *lev;
    struct bufferevent *tls[4], *plain[4];
    int n, n_with_cert;
} mtls_peer;

static int alpn_h2(SSL *ssl, const unsigned char **out, unsigned char *outlen, const unsigned char *in,
                   unsigned int inlen, void *arg)
{
    static const unsigned char h2[] = {2, 'h', '2'};
    if (SSL_select_next_proto((unsigned char **)out, outlen, h2, sizeof(h2), in, inlen) !=
        OPENSSL_NPN_NEGOTIATED)
        return SSL_TLSEXT_ERR_ALERT_FATAL;
    return SSL_TLSEXT_ERR_OK;
}

static void mtls_pipe(struct bufferevent *from, void *arg)
{
    mtls_peer *m = arg;
    for (int i = 0; i < m->n; i++) {
        if (m->tls[i] == from && m->plain[i])
            bufferevent_write_buffer(m->plain[i], bufferevent_get_input(from));
        else if (m->plain[i] == from && m->tls[i])
            bufferevent_write_buffer(m->tls[i], bufferevent_get_input(from));
    }
}

static void mtls_event(struct bufferevent *bev, short what, void *arg)
{
    mtls_peer *m = arg;
    for (int i = 0; i < m->n; i++) {
        if (m->tls[i] != bev && m->plain[i] != bev)
            continue;
        if (what & BEV_EVENT_CONNECTED) {
            X509 *peer = SSL_get_peer_certificate(bufferevent_openssl_get_ssl(bev));
            if (peer)
                m->n_with_cert++;
            X509_free(peer);
            return;
        }
        bufferevent_free(m->tls[i]);
        bufferevent_free(m->plain[i]);
        m->tls[i] = m->plain[i] = NULL;
    }
}

static void mtls_accept(evutil_socket_t lfd, short what, void *arg)
{
    mtls_peer *m = arg;
    int fd = accept(lfd, NULL, NULL), sv[2];
    if (fd == -1)
        return;
    if (m->n == 4) {
        close(fd);
        return;
    }
    assert_int_equal(evutil_make_socket_nonblocking(fd), 0);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    assert_int_equal(gw_http_server_adopt(m->t->srv, sv[0]), 0);
    assert_int_equal(evutil_make_socket_nonblocking(sv[1]), 0);
    SSL *ssl = SSL_new(m->ctx);
    assert_non_null(ssl);
    int i = m->n++;
    m->tls[i] =
        bufferevent_openssl_socket_new(m->t->base, fd, ssl, BUFFEREVENT_SSL_ACCEPTING, BEV_OPT_CLOSE_ON_FREE);
    m->plain[i] = bufferevent_socket_new(m->t->base, sv[1], BEV_OPT_CLOSE_ON_FREE);
    assert_non_null(m->tls[i]);
    assert_non_null(m->plain[i]);
    bufferevent_setcb(m->tls[i], mtls_pipe, NULL, mtls_event, m);
    bufferevent_setcb(m->plain[i], mtls_pipe, NULL, mtls_event, m);
    bufferevent_enable(m->tls[i], EV_READ | EV_WRITE);
    bufferevent_enable(m->plain[i], EV_READ | EV_WRITE);
}

static void mtls_start(tctx *t, mtls_peer *m)
{
    char crt[128], key[128], ca[128];
    path_in(t, crt, sizeof(crt), "srv.crt");
    path_in(t, key, sizeof(key), "srv.key");
    path_in(t, ca, sizeof(ca), "ca.crt");
    memset(m, 0, sizeof(*m));
    m->t = t;
    m->ctx = SSL_CTX_new(TLS_server_method());
    assert_non_null(m->ctx);
    assert_int_equal(SSL_CTX_use_certificate_chain_file(m->ctx, crt), 1);
    assert_int_equal(SSL_CTX_use_PrivateKey_file(m->ctx, key, SSL_FILETYPE_PEM), 1);
    assert_int_equal(SSL_CTX_load_verify_locations(m->ctx, ca, NULL), 1);
    SSL_CTX_set_verify(m->ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    SSL_CTX_set_alpn_select_cb(m->ctx, alpn_h2, NULL);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sin);
    m->lfd = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_equal(bind(m->lfd, (struct sockaddr *)&sin, sizeof(sin)), 0);
    assert_int_equal(getsockname(m->lfd, (struct sockaddr *)&sin, &sl), 0);
    assert_int_equal(listen(m->lfd, 16), 0);
    m->port = ntohs(sin.sin_port);
    m->lev = event_new(t->base, m->lfd, EV_READ | EV_PERSIST, mtls_accept, m);
    assert_non_null(m->lev);
    assert_int_equal(event_add(m->lev, NULL), 0);
}

static void mtls_stop(mtls_peer *m)
{
    for (int i = 0; i < m->n; i++) {
        if (m->tls[i])
            bufferevent_free(m->tls[i]);
        if (m->plain[i])
            bufferevent_free(m->plain[i]);
    }
    event_free(m->lev);
    close(m->lfd);
    SSL_CTX_free(m->ctx);
}

static void test_mtls(void **state)
{
    tctx *t = *state;
    if (!have_openssl())
        skip();
    make_certs(t);
    char ca[128], crt[128], key[128], target[64], err[256];
    path_in(t, ca, sizeof(ca), "ca.crt");
    path_in(t, crt, sizeof(crt), "cli.crt");
    path_in(t, key, sizeof(key), "cli.key");
    mtls_peer m;
    mtls_start(t, &m);
    snprintf(target, sizeof(target), "tls:localhost:%d", m.port);
    /* with the client certificate */
    t->opts.tls_ca_file = ca;
    t->opts.tls_cert_file = crt;
    t->opts.tls_key_file = key;
    get_hello(t, target);
    assert_int_equal(m.n_with_cert, 1);
    /* without one, the peer refuses the handshake */
    gw_upstream_opts o = t->opts;
    o.tls_cert_file = o.tls_key_file = NULL;
    gw_upstream_pool *saved = t->pool;
    t->pool = gw_upstream_pool_new(t->base, &o, err, sizeof(err));
    assert_non_null(t->pool);
    creq c = {0};
    send_req(t, &c, target, "GET", "/hello", NULL, 0, NULL, 0);
    wait_done(t, &c);
    expect_error(&c, GW_UP_CONNECT, false);
    gw_upstream_pool_free(t->pool);
    t->pool = saved;
    assert_int_equal(m.n_with_cert, 1);
    mtls_stop(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_get_unix, setup, teardown),
        cmocka_unit_test_setup_teardown(test_get_tcp, setup, teardown),
        cmocka_unit_test_setup_teardown(test_trailers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_post_unix, setup, teardown),
        cmocka_unit_test_setup_teardown(test_post_tcp, setup, teardown),
        cmocka_unit_test_setup_teardown(test_early_response, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_one_conn, setup, teardown),
        cmocka_unit_test_setup_teardown(test_max_streams_per_conn, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stream_in_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_flow_control, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel_early, setup, teardown),
        cmocka_unit_test_setup_teardown(test_connect_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_targets, setup, teardown),
        cmocka_unit_test_setup_teardown(test_server_killed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_response_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel_in_stall_sweep, setup, teardown),
        cmocka_unit_test_setup_teardown(test_never_sent_not_stalled, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idle_close, setup, teardown),
        cmocka_unit_test_setup_teardown(test_targets_forgotten, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pool_free_with_streams, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rtt, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rtt_stats, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peer_closes_at_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peer_silent, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peer_deaf, setup, teardown),
        cmocka_unit_test_setup_teardown(test_goaway, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tls_config_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tls_failures, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tls, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tls_reload, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mtls, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
