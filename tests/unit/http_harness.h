/* Shared harness of the HTTP server's tests that run real clients
 * (test_http_server.c, test_http1.c, test_http_tls.c): a server on the
 * test's own libevent loop (loop_harness.h) with a handler that answers by
 * path, on a cleartext or a TLS port (its certificate made by openssl),
 * cmocka set-ups with the limits a test wants (HARNESS_SETUP), child
 * processes (curl, h2load, openssl) run while the loop turns, and raw
 * sockets for bytes no client tool sends. Every wait is bounded by
 * WAIT_MS, every child is reaped, and only 127.0.0.1 and files under /tmp
 * are used.
 *
 * Paths the handler knows: /hello (a whole response), /tiny ("ok"), /big
 * (BIG_RESPONSE bytes of pattern_byte in one response), /echo (the body
 * back), /headers (the request's headers as "name: value" lines), /stream
 * (ten pieces from later loop turns, then the end), /sized (the same with
 * their length said in advance), /sized-short (a byte more said than
 * sent, so the end fails and the stream is reset), /slow (pieces that
 * never end), /paced (PACED bytes written as on_writable allows), /flood
 * (writes until -ENOBUFS, then resets), /reset (reset at once), /hang
 * (never answered). A test may set check_request to look at every request
 * before it is answered. */
#ifndef HTTP_HARNESS_H
#define HTTP_HARNESS_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* strcasestr, strptime, timegm */
#endif
#include "gateway/http/http_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

extern char **environ;

#define PACED (8 << 20)
#define BIG_RESPONSE (16 << 20)

typedef struct tsrv {
    struct event_base *base;
    struct event *tick;
    gw_http_server *srv;
    gw_http_limits lim;
    int port;
    const char *scheme; /* of url(): "http", or "https" on a TLS listener */
    char dir[64];       /* scratch files for this test */
    int n_request, n_close, n_finished, n_unfinished, n_writable;
    bool in_api; /* set around our gw_http_* calls: on_close must not run inside */
    char protocol[16], authority[128];
    int flood_enobufs;
    size_t flood_written, flood_pending_max, paced_pending_max;
    void (*check_request)(const gw_http_request *req);
} tsrv;

#define HARNESS_CTX tsrv
#include "loop_harness.h"

typedef struct tstream {
    tsrv *t;
    gw_http_stream *s;
    struct event *ev;
    int n;
    bool flood, paced, paused, sized, sized_short, head;
    size_t sent;
} tstream;

HARNESS uint8_t pattern_byte(size_t i)
{
    return (uint8_t)(i * 7 + (i >> 12));
}

/* What /big answers: BIG_RESPONSE bytes of pattern_byte. */
HARNESS const uint8_t *big_response(void)
{
    static uint8_t *b;
    if (!b) {
        b = malloc(BIG_RESPONSE);
        assert_non_null(b);
        for (size_t i = 0; i < BIG_RESPONSE; i++)
            b[i] = pattern_byte(i);
    }
    return b;
}

HARNESS int api_respond(tsrv *t, gw_http_stream *s, int status, const char *ctype, const void *body,
                        size_t len)
{
    gw_http_header h[] = {{"content-type", ctype}};
    t->in_api = true;
    int rc = gw_http_respond(s, status, h, 1, body, len);
    t->in_api = false;
    return rc;
}

/* /paced: writes while the stream holds at most half its bound, then
 * waits for on_writable; never -ENOBUFS. */
HARNESS void paced_write(tstream *ts)
{
    tsrv *t = ts->t;
    static uint8_t chunk[65536];
    size_t half = t->lim.max_stream_buffer / 2;
    t->in_api = true;
    while (ts->sent < PACED && gw_http_pending(ts->s) <= half) {
        size_t n = PACED - ts->sent < sizeof(chunk) ? PACED - ts->sent : sizeof(chunk);
        for (size_t i = 0; i < n; i++)
            chunk[i] = pattern_byte(ts->sent + i);
        assert_int_equal(gw_http_write(ts->s, chunk, n), 0);
        ts->sent += n;
        if (gw_http_pending(ts->s) > t->paced_pending_max)
            t->paced_pending_max = gw_http_pending(ts->s);
    }
    if (ts->sent == PACED)
        assert_int_equal(gw_http_end(ts->s), 0);
    t->in_api = false;
}

HARNESS void on_stream_tick(evutil_socket_t fd, short what, void *arg)
{
    tstream *ts = arg;
    tsrv *t = ts->t;
    char piece[32];
    t->in_api = true;
    if (ts->flood) {
        /* Write until the server refuses: the peer reads nothing. */
        static uint8_t chunk[16384];
        int rc;
        while ((rc = gw_http_write(ts->s, chunk, sizeof(chunk))) == 0) {
            t->flood_written += sizeof(chunk);
            if (gw_http_pending(ts->s) > t->flood_pending_max)
                t->flood_pending_max = gw_http_pending(ts->s);
        }
        assert_int_equal(rc, -ENOBUFS);
        t->flood_enobufs++;
        gw_http_reset(ts->s);
        gw_http_reset(ts->s); /* twice is harmless */
        assert_int_equal(gw_http_write(ts->s, "x", 1), -EPIPE);
        event_del(ts->ev);
    } else if (ts->n < 10) { /* /stream: ten pieces, then the end; /slow: practically never */
        int len = snprintf(piece, sizeof(piece), "piece %d\n", ts->n++);
        assert_int_equal(gw_http_write(ts->s, piece, (size_t)len), 0);
        /* /sized ends with its last piece: its client, told the length,
         * may close as soon as that arrives. */
        if (ts->n == 10 && ts->sized && !ts->sized_short) {
            /* past the length said; a HEAD's bytes are dropped, counted or not */
            assert_int_equal(gw_http_write(ts->s, "x", 1), ts->head ? 0 : -EINVAL);
            assert_int_equal(gw_http_end(ts->s), 0);
            event_del(ts->ev);
        }
    } else if (ts->sized_short) {
        assert_int_equal(gw_http_end(ts->s), -EPIPE);
        gw_http_reset(ts->s);
        event_del(ts->ev);
    } else {
        assert_int_equal(gw_http_end(ts->s), 0);
        assert_int_equal(gw_http_write(ts->s, "late", 4), -EINVAL);
        event_del(ts->ev);
    }
    t->in_api = false;
}

HARNESS void on_request(void *ud, gw_http_stream *s, const gw_http_request *req)
{
    tsrv *t = ud;
    t->n_request++;
    tstream *ts = calloc(1, sizeof(*ts));
    assert_non_null(ts);
    ts->t = t;
    ts->s = s;
    gw_http_set_user(s, ts);
    assert_non_null(req->method);
    assert_non_null(req->path);
    assert_non_null(req->body);
    assert_non_null(req->protocol);
    snprintf(t->protocol, sizeof(t->protocol), "%s", req->protocol);
    snprintf(t->authority, sizeof(t->authority), "%s", req->authority ? req->authority : "(none)");
    if (t->check_request)
        t->check_request(req);
    const char *p = req->path;
    if (!strcmp(p, "/hello")) {
        assert_int_equal(api_respond(t, s, 200, "text/plain", "hello world\n", 12), 0);
        assert_int_equal(api_respond(t, s, 200, "text/plain", "again", 5), -EINVAL);
    } else if (!strcmp(p, "/tiny")) {
        assert_int_equal(api_respond(t, s, 200, "text/plain", "ok", 2), 0);
    } else if (!strcmp(p, "/big")) {
        assert_int_equal(api_respond(t, s, 200, "application/octet-stream", big_response(), BIG_RESPONSE), 0);
    } else if (!strcmp(p, "/echo")) {
        assert_int_equal(api_respond(t, s, 200, "application/octet-stream", req->body, req->body_len), 0);
    } else if (!strcmp(p, "/headers")) {
        char out[4096] = "";
        for (size_t i = 0; i < req->n_headers; i++)
            snprintf(out + strlen(out), sizeof(out) - strlen(out), "%s: %s\n", req->headers[i].name,
                     req->headers[i].value);
        assert_int_equal(api_respond(t, s, 200, "text/plain", out, strlen(out)), 0);
    } else if (!strcmp(p, "/stream") || !strcmp(p, "/slow") || !strcmp(p, "/flood") || !strcmp(p, "/paced") ||
               !strcmp(p, "/sized") || !strcmp(p, "/sized-short")) {
        /* content-length given by the application is the server's to set: dropped */
        gw_http_header h[] = {
            {"content-type", "text/plain"}, {"cache-control", "no-cache"}, {"content-length", "3"}};
        ts->sized = !strncmp(p, "/sized", 6);
        ts->head = !strcmp(req->method, "HEAD");
        ts->sized_short = !strcmp(p, "/sized-short");
        t->in_api = true;
        if (ts->sized) /* ten pieces of 8 bytes ("piece 0\n") */
            assert_int_equal(gw_http_begin_length(s, 200, h, 3, ts->sized_short ? 81 : 80), 0);
        else
            assert_int_equal(gw_http_begin(s, 200, h, 3), 0);
        assert_int_equal(gw_http_begin(s, 200, h, 2), -EINVAL);
        t->in_api = false;
        ts->flood = !strcmp(p, "/flood");
        if (!strcmp(p, "/slow"))
            ts->n = -1000000; /* never reaches the end */
        if (!strcmp(p, "/paced")) {
            ts->paced = true;
            paced_write(ts);
            return;
        }
        ts->ev = event_new(t->base, -1, EV_PERSIST, on_stream_tick, ts);
        assert_non_null(ts->ev);
        struct timeval tv = {0, 5000};
        assert_int_equal(event_add(ts->ev, &tv), 0);
    } else if (!strcmp(p, "/reset")) {
        t->in_api = true;
        gw_http_reset(s);
        t->in_api = false;
    } else if (!strcmp(p, "/hang")) {
        /* never answered: only the connection's end closes it */
    } else {
        assert_int_equal(api_respond(t, s, 404, "text/plain", "no\n", 3), 0);
    }
}

HARNESS void on_writable(void *ud, gw_http_stream *s, void *stream_ud)
{
    tsrv *t = ud;
    tstream *ts = stream_ud;
    assert_false(t->in_api);
    assert_ptr_equal(ts->s, s);
    assert_true(gw_http_pending(s) <= t->lim.max_stream_buffer / 2);
    t->n_writable++;
    if (ts->paced)
        paced_write(ts);
}

HARNESS void on_close(void *ud, gw_http_stream *s, void *stream_ud, bool finished)
{
    tsrv *t = ud;
    tstream *ts = stream_ud;
    assert_false(t->in_api);
    assert_non_null(ts);
    assert_ptr_equal(ts->s, s);
    assert_int_equal(gw_http_write(s, "x", 1), -EPIPE);
    gw_http_reset(s);
    t->n_close++;
    if (finished)
        t->n_finished++;
    else
        t->n_unfinished++;
    if (ts->ev)
        event_free(ts->ev);
    free(ts);
}

/* A server on a fresh loop; no listener yet. */
HARNESS tsrv *harness_new(const gw_http_limits *lim)
{
    tsrv *t = calloc(1, sizeof(*t));
    assert_non_null(t);
    loop_open(t, "infergate-http");
    gw_http_handler h = {.on_request = on_request, .on_close = on_close, .on_writable = on_writable};
    t->srv = gw_http_server_new(t->base, lim, &h, t);
    assert_non_null(t->srv);
    t->lim = t->srv->limits; /* what the server runs with, defaults filled in */
    t->scheme = "http";
    return t;
}

/* A server listening on a cleartext TCP port of 127.0.0.1. */
HARNESS tsrv *harness_new_tcp(const gw_http_limits *lim)
{
    tsrv *t = harness_new(lim);
    char err[256] = "";
    if (gw_http_server_listen(t->srv, "tcp:127.0.0.1:0", err, sizeof(err)))
        fail_msg("listen: %s", err);
    t->port = gw_http_server_port(t->srv);
    assert_true(t->port > 0);
    return t;
}

HARNESS int harness_teardown(void **state)
{
    tsrv *t = *state;
    if (t->srv)
        gw_http_server_free(t->srv);
    loop_close(t);
    free(t);
    return 0;
}

/* Defines the cmocka set-up `name`: the server start(&lim) gives (a
 * harness_new_* or the test's own), with the limits named by designated
 * initializers (.max_body = 1000), or 0 for none; a field not named is
 * zero, which gives its default. */
#define HARNESS_SETUP(name, start, ...)                                                                      \
    static int name(void **state)                                                                            \
    {                                                                                                        \
        gw_http_limits lim = {__VA_ARGS__};                                                                  \
        *state = start(&lim);                                                                                \
        return 0;                                                                                            \
    }

/* The URL of `path` on the server's port; four calls' results stay valid. */
HARNESS const char *url(tsrv *t, const char *path)
{
    static char bufs[4][128];
    static int next;
    char *b = bufs[next++ % 4];
    snprintf(b, sizeof(bufs[0]), "%s://127.0.0.1:%d%s", t->scheme, t->port, path);
    return b;
}

HARNESS bool have_tool(const char *name)
{
    const char *path = getenv("PATH");
    char buf[512];
    if (!path)
        path = "/usr/bin:/bin";
    while (*path) {
        const char *end = strchr(path, ':');
        size_t n = end ? (size_t)(end - path) : strlen(path);
        snprintf(buf, sizeof(buf), "%.*s/%s", (int)n, path, name);
        if (access(buf, X_OK) == 0)
            return true;
        path += n + (end ? 1 : 0);
    }
    return false;
}

#define REQUIRE_TOOL(name)                                                                                   \
    do {                                                                                                     \
        if (!have_tool(name)) {                                                                              \
            fprintf(stderr, "%s not found: skipped\n", name);                                                \
            skip();                                                                                          \
        }                                                                                                    \
    } while (0)

HARNESS char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) {
        b[n] = '\0';
        if (len)
            *len = (size_t)n;
    }
    return b;
}

/* Path of a scratch file of this test. */
HARNESS const char *scratch(tsrv *t, const char *name)
{
    static char bufs[8][160];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, sizeof(bufs[0]), "%s/%s", t->dir, name);
    return b;
}

/* Runs argv with stdout and stderr in scratch files `out_name` and
 * `out_name`.err, turning the loop until it exits. Returns its exit
 * status; fails the test on a timeout. */
HARNESS int run_child(tsrv *t, char *const argv[], const char *out_name)
{
    char out[160], errp[170];
    snprintf(out, sizeof(out), "%s/%s", t->dir, out_name);
    snprintf(errp, sizeof(errp), "%s/%s.err", t->dir, out_name);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, 2, errp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    assert_int_equal(rc, 0);
    long deadline = now_ms() + WAIT_MS;
    int st;
    for (;;) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid)
            break;
        assert_int_equal(w, 0);
        if (now_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            fail_msg("%s did not finish in %d ms", argv[0], WAIT_MS);
        }
        event_base_loop(t->base, EVLOOP_ONCE);
    }
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (code != 0) {
        char *e = slurp(errp, NULL);
        fprintf(stderr, "(%s exited %d: %s)\n", argv[0], code, e ? e : "");
        free(e);
    }
    return code;
}

/* The child's stdout (or stderr with ".err" appended), NUL-terminated. */
HARNESS char *child_out(tsrv *t, const char *out_name)
{
    char *s = slurp(scratch(t, out_name), NULL);
    assert_non_null(s);
    return s;
}

HARNESS void expect_output(tsrv *t, const char *name, const char *want)
{
    char *got = child_out(t, name);
    assert_string_equal(got, want);
    free(got);
}

/* `head` (a response's header section, as curl -D or the wire has it)
 * carries one Date header in IMF-fixdate form, within a minute of now. */
HARNESS void expect_date_header(const char *head)
{
    const char *d = strcasestr(head, "\ndate: ");
    if (!d)
        fail_msg("no Date header in\n%s", head);
    assert_null(strcasestr(d + 1, "\ndate: "));
    struct tm tm = {0};
    const char *end = strptime(d + 7, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    if (!end || (*end != '\r' && *end != '\n'))
        fail_msg("Date header not IMF-fixdate: %.40s", d + 7);
    long long skew = (long long)timegm(&tm) - (long long)time(NULL);
    assert_true(skew > -60 && skew < 60);
}

/* What /stream sends. */
static const char ten_pieces[] __attribute__((unused)) = "piece 0\npiece 1\npiece 2\npiece 3\npiece 4\n"
                                                         "piece 5\npiece 6\npiece 7\npiece 8\npiece 9\n";

HARNESS bool requests_reach(tsrv *t, void *arg)
{
    return t->n_request >= *(int *)arg;
}

HARNESS bool no_streams(tsrv *t, void *arg)
{
    return gw_http_server_active_streams(t->srv) == 0;
}

/* Waits until n streams have closed, and checks that all of them
 * finished. */
HARNESS void expect_finished(tsrv *t, int n)
{
    assert_true(run_until(t, closes_reach, &n));
    assert_int_equal(t->n_finished, n);
}

HARNESS bool flood_done(tsrv *t, void *arg)
{
    return t->flood_enobufs > 0 && t->n_close > 0;
}

/* Runs argv, a client that fetches /paced into scratch file "out", as the
 * n-th request of the test: every byte arrives in order, on_writable paced
 * the stream and the stream never held more than its bound. */
HARNESS void expect_paced(tsrv *t, char *const argv[], int n)
{
    t->n_writable = 0;
    assert_int_equal(run_child(t, argv, "meta"), 0);
    size_t len = 0;
    char *got = slurp(scratch(t, "out"), &len);
    assert_non_null(got);
    assert_int_equal(len, PACED);
    for (size_t k = 0; k < len; k++)
        if ((uint8_t)got[k] != pattern_byte(k))
            fail_msg("byte %zu differs", k);
    free(got);
    expect_finished(t, n);
    assert_true(t->n_writable > 0);
    assert_true(t->paced_pending_max <= t->lim.max_stream_buffer);
}

HARNESS void write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

/* A file of `len` pseudo-random bytes (every byte value, NULs included). */
HARNESS uint8_t *random_file(const char *path, size_t len)
{
    uint8_t *buf = malloc(len + 1);
    assert_non_null(buf);
    uint32_t x = 12345;
    for (size_t i = 0; i < len; i++) {
        x = x * 1103515245u + 12345u;
        buf[i] = (uint8_t)(x >> 16);
    }
    write_file(path, buf, len);
    return buf;
}

/* ---- curl, and the TLS listener's certificate ---- */

#define CURL_MAX_ARGS 40

/* Appends the arguments from `arg` on, up to NULL, to argv[0..n). */
HARNESS size_t curl_push(char **argv, size_t n, const char *arg, va_list ap)
{
    for (; arg; arg = va_arg(ap, const char *)) {
        assert_true(n < CURL_MAX_ARGS - 1);
        argv[n++] = (char *)arg;
    }
    argv[n] = NULL;
    return n;
}

/* Starts curl's argv in `argv`: quiet but for errors, past any proxy, and
 * on a TLS listener taking its self-signed certificate. */
HARNESS size_t curl_base(tsrv *t, char **argv)
{
    size_t n = 0;
    argv[n++] = "curl";
    argv[n++] = "-sS";
    if (!strcmp(t->scheme, "https"))
        argv[n++] = "-k";
    argv[n++] = "--noproxy";
    argv[n++] = "*";
    return n;
}

/* curl's argv for run_child: curl_base, then the arguments given up to
 * NULL. Valid until the next call. */
HARNESS __attribute__((sentinel)) char **curl_argv(tsrv *t, const char *arg, ...)
{
    static char *argv[CURL_MAX_ARGS];
    va_list ap;
    va_start(ap, arg);
    curl_push(argv, curl_base(t, argv), arg, ap);
    va_end(ap);
    return argv;
}

/* POSTs `len` pseudo-random bytes (scratch file "in") to /echo with curl
 * and the arguments given up to NULL: answered 200, the same bytes back. */
HARNESS __attribute__((sentinel)) void post_echo(tsrv *t, size_t len, ...)
{
    uint8_t *buf = random_file(scratch(t, "in"), len);
    char data[200];
    snprintf(data, sizeof(data), "@%s", scratch(t, "in"));
    char *argv[CURL_MAX_ARGS];
    va_list ap;
    va_start(ap, len);
    const char *first = va_arg(ap, const char *);
    size_t n = curl_push(argv, curl_base(t, argv), first, ap);
    va_end(ap);
    const char *tail[] = {"--data-binary", data,           "-o", scratch(t, "out"), "-w",
                          "%{http_code}",  url(t, "/echo")};
    for (size_t i = 0; i < sizeof(tail) / sizeof(tail[0]); i++) {
        assert_true(n < CURL_MAX_ARGS - 1);
        argv[n++] = (char *)tail[i];
    }
    argv[n] = NULL;
    assert_int_equal(run_child(t, argv, "code"), 0);
    expect_output(t, "code", "200");
    size_t got_len = 0;
    char *got = slurp(scratch(t, "out"), &got_len);
    assert_non_null(got);
    if (got_len != len) {
        char args[512] = "";
        for (size_t i = 0; argv[i]; i++)
            snprintf(args + strlen(args), sizeof(args) - strlen(args), " %s", argv[i]);
        fail_msg("POST of %zu bytes with%s: %zu came back", len, args, got_len);
    }
    assert_memory_equal(got, buf, len);
    free(got);
    free(buf);
}

/* A self-signed P-256 certificate for localhost, and its key, made by
 * `openssl req` into the files named. */
HARNESS void make_cert(tsrv *t, const char *cert, const char *key)
{
    char *argv[] = {"openssl",
                    "req",
                    "-x509",
                    "-newkey",
                    "ec",
                    "-pkeyopt",
                    "ec_paramgen_curve:P-256",
                    "-nodes",
                    "-days",
                    "1",
                    "-subj",
                    "/CN=localhost",
                    "-keyout",
                    (char *)key,
                    "-out",
                    (char *)cert,
                    NULL};
    assert_int_equal(run_child(t, argv, "openssl"), 0);
}

/* A server listening on a TLS port of 127.0.0.1, with a certificate made
 * for it (scratch files cert.pem, key.pem). Without openssl or curl it
 * has no listener, and each test skips (REQUIRE_TOOL). */
HARNESS tsrv *harness_new_tls(const gw_http_limits *lim)
{
    tsrv *t = harness_new(lim);
    if (!have_tool("openssl") || !have_tool("curl"))
        return t; /* each test skips */
    char cert[160], key[160], err[512] = "";
    snprintf(cert, sizeof(cert), "%s", scratch(t, "cert.pem"));
    snprintf(key, sizeof(key), "%s", scratch(t, "key.pem"));
    make_cert(t, cert, key);
    if (gw_http_server_listen_tls(t->srv, "tcp:127.0.0.1:0", cert, key, err, sizeof(err)))
        fail_msg("listen_tls: %s", err);
    t->port = gw_http_server_port(t->srv);
    assert_true(t->port > 0);
    t->scheme = "https";
    return t;
}

/* ---- raw sockets, for bytes no client tool sends ---- */

HARNESS int raw_connect(tsrv *t, int rcvbuf)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    if (rcvbuf)
        assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf)), 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)t->port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

HARNESS void raw_send(int fd, const void *data, size_t len)
{
    const char *p = data;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        assert_true(n > 0);
        p += n;
        len -= (size_t)n;
    }
}

/* Reads `fd` until the server's close, which must be a reset (a response
 * cut short, whose FIN would make it look whole), within 5 s. */
HARNESS void expect_reset(int fd)
{
    struct timeval tv = {5, 0};
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
    char buf[16384];
    ssize_t r;
    int reads = 0;
    while ((r = recv(fd, buf, sizeof(buf), 0)) > 0 && reads++ < 100000)
        ;
    assert_int_equal(r, -1);
    assert_int_equal(errno, ECONNRESET);
}

/* Reads until the server closes (or resets) the connection, turning the
 * loop meanwhile. Returns the bytes read, NUL-terminated, in a buffer of
 * `cap` bytes; fails the test after WAIT_MS. */
HARNESS char *raw_read_all(tsrv *t, int fd, size_t cap, size_t *len)
{
    char *buf = malloc(cap + 1);
    assert_non_null(buf);
    size_t n = 0;
    long deadline = now_ms() + WAIT_MS;
    for (;;) {
        ssize_t r = recv(fd, buf + n, cap - n, MSG_DONTWAIT);
        if (r > 0) {
            n += (size_t)r;
            assert_true(n < cap);
            continue;
        }
        if (r == 0 || (errno != EAGAIN && errno != EINTR))
            break; /* EOF, or ECONNRESET */
        if (now_ms() > deadline)
            fail_msg("the server did not close the connection in %d ms", WAIT_MS);
        event_base_loop(t->base, EVLOOP_ONCE);
    }
    buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}

/* Sends `req` on a new connection and returns all the server sent back
 * until it closed. */
HARNESS char *raw_exchange(tsrv *t, const char *req, size_t req_len)
{
    int fd = raw_connect(t, 0);
    raw_send(fd, req, req_len);
    char *got = raw_read_all(t, fd, 1 << 20, NULL);
    close(fd);
    return got;
}

#endif
