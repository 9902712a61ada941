/* Tests of the HTTP/2 server (gateway/http_server.c, gateway/listen.c)
 * with real clients: curl --http2-prior-knowledge and h2load run as child
 * processes while this process runs the server's loop, and a small
 * nghttp2 client session on a socket, driven by the same loop, for what the
 * tools cannot do on cue (reset after the first DATA, never read, CONNECT,
 * huge headers, reset during upload).
 *
 * Every wait is bounded (WAIT_MS), every child is reaped, and only
 * 127.0.0.1 and a socket file under /tmp are used. Tests needing a tool
 * that is missing are skipped. Nothing asserts on timing. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "gateway/http_internal.h" /* to look at a connection's output buffer */

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <nghttp2/nghttp2.h>

extern char **environ;

#define WAIT_MS 30000
#define BIG_BODY ((1 << 20) - 1)
#define BIG_RESPONSE (16 << 20)

static uint8_t *big_response(void)
{
    static uint8_t *b;
    if (!b) {
        b = malloc(BIG_RESPONSE);
        assert_non_null(b);
        for (size_t i = 0; i < BIG_RESPONSE; i++)
            b[i] = (uint8_t)(i * 7 + (i >> 12));
    }
    return b;
}

/* ---- the server under test and its handler ---- */

typedef struct tstream tstream;

typedef struct tsrv {
    struct event_base *base;
    struct event *tick;
    gw_http_server *srv;
    gw_http_limits lim;
    int port;
    char dir[64]; /* scratch files for this test */
    int n_request, n_close, n_finished, n_unfinished;
    bool in_api; /* set around our gw_http_* calls: on_close must not run inside */
    /* /flood */
    int flood_enobufs;
    size_t flood_written, flood_pending_max;
} tsrv;

struct tstream {
    tsrv *t;
    gw_http_stream *s;
    struct event *ev;
    int n;
    bool flood;
};

static int api_respond(tsrv *t, gw_http_stream *s, int status, const char *ctype, const void *body,
                       size_t len)
{
    gw_http_header h[] = {{"content-type", ctype}};
    t->in_api = true;
    int rc = gw_http_respond(s, status, h, 1, body, len);
    t->in_api = false;
    return rc;
}

static void on_stream_tick(evutil_socket_t fd, short what, void *arg)
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
    } else {
        assert_int_equal(gw_http_end(ts->s), 0);
        assert_int_equal(gw_http_write(ts->s, "late", 4), -EINVAL);
        event_del(ts->ev);
    }
    t->in_api = false;
}

static void on_request(void *ud, gw_http_stream *s, const gw_http_request *req)
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
    const char *p = req->path;
    if (!strcmp(p, "/hello")) {
        assert_string_equal(req->method, "GET");
        assert_non_null(req->authority);
        assert_non_null(gw_http_header_get(req, "user-agent"));
        assert_null(gw_http_header_get(req, "no-such-header"));
        assert_int_equal(api_respond(t, s, 200, "text/plain", "hello world\n", 12), 0);
        assert_int_equal(api_respond(t, s, 200, "text/plain", "again", 5), -EINVAL);
    } else if (!strcmp(p, "/echo")) {
        assert_string_equal(req->method, "POST");
        assert_int_equal(api_respond(t, s, 200, "application/octet-stream", req->body, req->body_len), 0);
    } else if (!strcmp(p, "/big")) {
        assert_int_equal(api_respond(t, s, 200, "application/octet-stream", big_response(), BIG_RESPONSE), 0);
    } else if (!strcmp(p, "/tiny")) {
        assert_int_equal(api_respond(t, s, 200, "text/plain", "ok", 2), 0);
    } else if (!strcmp(p, "/stream") || !strcmp(p, "/slow") || !strcmp(p, "/flood")) {
        gw_http_header h[] = {{"content-type", "text/plain"}, {"cache-control", "no-cache"}};
        t->in_api = true;
        assert_int_equal(gw_http_begin(s, 200, h, 2), 0);
        assert_int_equal(gw_http_begin(s, 200, h, 2), -EINVAL);
        t->in_api = false;
        ts->flood = !strcmp(p, "/flood");
        if (!strcmp(p, "/slow"))
            ts->n = -1000000; /* never reaches the end */
        ts->ev = event_new(t->base, -1, EV_PERSIST, on_stream_tick, ts);
        assert_non_null(ts->ev);
        struct timeval tv = {0, 5000};
        assert_int_equal(event_add(ts->ev, &tv), 0);
    } else if (!strcmp(p, "/hang")) {
        /* never answered: only the connection's end closes it */
    } else {
        assert_int_equal(api_respond(t, s, 404, "text/plain", "no\n", 3), 0);
    }
}

static void on_close(void *ud, gw_http_stream *s, void *stream_ud, bool finished)
{
    tsrv *t = ud;
    tstream *ts = stream_ud;
    assert_false(t->in_api);
    assert_non_null(ts);
    assert_ptr_equal(ts->s, s);
    /* The stream is gone: calls fail cleanly until on_close returns. */
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

static void on_tick(evutil_socket_t fd, short what, void *arg) {}

static int setup_limits(void **state, const gw_http_limits *lim)
{
    signal(SIGPIPE, SIG_IGN);
    tsrv *t = calloc(1, sizeof(*t));
    assert_non_null(t);
    t->base = event_base_new();
    assert_non_null(t->base);
    /* Wakes the loop often so that waits can check children and clocks. */
    t->tick = event_new(t->base, -1, EV_PERSIST, on_tick, NULL);
    struct timeval tv = {0, 5000};
    assert_int_equal(event_add(t->tick, &tv), 0);
    if (lim)
        t->lim = *lim;
    else
        gw_http_limits_default(&t->lim);
    gw_http_handler h = {.on_request = on_request, .on_close = on_close};
    t->srv = gw_http_server_new(t->base, &t->lim, &h, t);
    assert_non_null(t->srv);
    char err[256] = "";
    int rc = gw_http_server_listen(t->srv, "tcp:127.0.0.1:0", err, sizeof(err));
    if (rc)
        fail_msg("listen: %s", err);
    t->port = gw_http_server_port(t->srv);
    assert_true(t->port > 0);
    snprintf(t->dir, sizeof(t->dir), "/tmp/infergate-http-XXXXXX");
    assert_non_null(mkdtemp(t->dir));
    *state = t;
    return 0;
}

static int setup(void **state)
{
    return setup_limits(state, NULL);
}

static int teardown(void **state)
{
    tsrv *t = *state;
    if (t->srv)
        gw_http_server_free(t->srv);
    event_free(t->tick);
    event_base_free(t->base);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", t->dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", t->dir);
    free(t);
    return 0;
}

static long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000L + ts.tv_nsec / 1000000;
}

/* ---- child processes ---- */

static bool have_tool(const char *name)
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

static char *slurp(const char *path, size_t *len)
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

/* Runs argv with stdout and stderr in files under t->dir, turning the loop
 * until it exits. Returns its exit status; fails the test on a timeout. */
static int run_child(tsrv *t, char *const argv[], const char *out_name)
{
    char out[128], errp[128];
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
        fprintf(stderr, "%s exited %d: %s\n", argv[0], code, e ? e : "");
        free(e);
    }
    return code;
}

typedef bool (*cond_fn)(tsrv *t, void *arg);

static bool run_until(tsrv *t, cond_fn cond, void *arg)
{
    long deadline = now_ms() + WAIT_MS;
    while (!cond(t, arg)) {
        if (now_ms() > deadline)
            return false;
        event_base_loop(t->base, EVLOOP_ONCE);
    }
    return true;
}

static bool closes_reach(tsrv *t, void *arg)
{
    return t->n_close >= *(int *)arg;
}

static void write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static void url(tsrv *t, char *buf, size_t len, const char *path)
{
    snprintf(buf, len, "http://127.0.0.1:%d%s", t->port, path);
}

/* ---- tests with curl and h2load ---- */

static void test_get_whole(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOL("curl");
    char u[128], body[128];
    url(t, u, sizeof(u), "/hello");
    snprintf(body, sizeof(body), "%s/body", t->dir);
    char *argv[] = {"curl",
                    "-sS",
                    "--noproxy",
                    "*",
                    "--http2-prior-knowledge",
                    "-o",
                    body,
                    "-w",
                    "%{http_code} %{http_version}",
                    u,
                    NULL};
    assert_int_equal(run_child(t, argv, "meta"), 0);
    char meta[128];
    snprintf(meta, sizeof(meta), "%s/meta", t->dir);
    char *m = slurp(meta, NULL), *b = slurp(body, NULL);
    assert_string_equal(m, "200 2");
    assert_string_equal(b, "hello world\n");
    free(m);
    free(b);
    int one = 1;
    assert_true(run_until(t, closes_reach, &one));
    assert_int_equal(t->n_request, 1);
    assert_int_equal(t->n_finished, 1);
    assert_int_equal(gw_http_server_active_streams(t->srv), 0);
}

static void post_echo(tsrv *t, size_t len)
{
    char in[128], out[128], u[128], data[140];
    snprintf(in, sizeof(in), "%s/in", t->dir);
    snprintf(out, sizeof(out), "%s/out", t->dir);
    snprintf(data, sizeof(data), "@%s", in);
    url(t, u, sizeof(u), "/echo");
    uint8_t *buf = malloc(len + 1);
    assert_non_null(buf);
    uint32_t x = 12345;
    for (size_t i = 0; i < len; i++) { /* every byte value, NULs included */
        x = x * 1103515245u + 12345u;
        buf[i] = (uint8_t)(x >> 16);
    }
    write_file(in, buf, len);
    char *argv[] = {"curl",
                    "-sS",
                    "--http2-prior-knowledge",
                    "-H",
                    "Expect:",
                    "-H",
                    "content-type: application/octet-stream",
                    "--data-binary",
                    data,
                    "-o",
                    out,
                    "-w",
                    "%{http_code}",
                    u,
                    NULL};
    assert_int_equal(run_child(t, argv, "code"), 0);
    char codep[128];
    snprintf(codep, sizeof(codep), "%s/code", t->dir);
    char *code = slurp(codep, NULL);
    assert_string_equal(code, "200");
    size_t got_len = 0;
    char *got = slurp(out, &got_len);
    assert_non_null(got);
    assert_int_equal(got_len, len);
    assert_memory_equal(got, buf, len);
    free(code);
    free(got);
    free(buf);
}

static void test_post_echo(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOL("curl");
    post_echo(t, 3);
    post_echo(t, BIG_BODY);
    int two = 2;
    assert_true(run_until(t, closes_reach, &two));
    assert_int_equal(t->n_finished, 2);
}

static void test_body_too_large(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOL("curl");
    char in[128], out[128], u[128], data[140];
    snprintf(in, sizeof(in), "%s/in", t->dir);
    snprintf(out, sizeof(out), "%s/out", t->dir);
    snprintf(data, sizeof(data), "@%s", in);
    url(t, u, sizeof(u), "/echo");
    size_t len = (1 << 20) + 1;
    char *buf = calloc(1, len);
    assert_non_null(buf);
    write_file(in, buf, len);
    free(buf);
    char *argv[] = {"curl", "-sS",     "--noproxy",     "*",  "--http2-prior-knowledge",
                    "-H",   "Expect:", "--data-binary", data, "-o",
                    out,    "-w",      "%{http_code}",  u,    NULL};
    /* The server answers before the upload ends and drops the rest. */
    assert_int_equal(run_child(t, argv, "code"), 0);
    char codep[128];
    snprintf(codep, sizeof(codep), "%s/code", t->dir);
    char *code = slurp(codep, NULL), *got = slurp(out, NULL);
    assert_string_equal(code, "413");
    assert_string_equal(got, "{\"error\":{\"message\":\"request body larger than 1048576 bytes\",\"type\":"
                             "\"invalid_request_error\",\"param\":null,\"code\":\"request_too_large\"}}");
    free(code);
    free(got);
    assert_int_equal(t->n_request, 0);
    assert_int_equal(t->n_close, 0);
    assert_int_equal(gw_http_server_active_streams(t->srv), 0);
}

static void test_streaming(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOL("curl");
    char u[128], out[128];
    url(t, u, sizeof(u), "/stream");
    snprintf(out, sizeof(out), "%s/out", t->dir);
    char *argv[] = {"curl", "-sS", "--noproxy", "*", "-N", "--http2-prior-knowledge", "-o", out, u, NULL};
    assert_int_equal(run_child(t, argv, "meta"), 0);
    char *got = slurp(out, NULL);
    char want[256] = "";
    for (int i = 0; i < 10; i++)
        snprintf(want + strlen(want), sizeof(want) - strlen(want), "piece %d\n", i);
    assert_string_equal(got, want);
    free(got);
    int one = 1;
    assert_true(run_until(t, closes_reach, &one));
    assert_int_equal(t->n_finished, 1);
}

static void test_big_response(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOL("curl");
    char u[128], out[128];
    url(t, u, sizeof(u), "/big");
    snprintf(out, sizeof(out), "%s/out", t->dir);
    char *argv[] = {"curl", "-sS", "--noproxy", "*", "--http2-prior-knowledge", "-o", out, u, NULL};
    assert_int_equal(run_child(t, argv, "meta"), 0);
    size_t len = 0;
    char *got = slurp(out, &len);
    assert_int_equal(len, BIG_RESPONSE);
    assert_memory_equal(got, big_response(), BIG_RESPONSE);
    free(got);
    int one = 1;
    assert_true(run_until(t, closes_reach, &one));
    assert_int_equal(t->n_finished, 1);
}

static void test_many_streams(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOL("h2load");
    char u[128];
    url(t, u, sizeof(u), "/tiny");
    char *argv[] = {"h2load", "-n", "200", "-c", "2", "-m", "20", u, NULL};
    assert_int_equal(run_child(t, argv, "h2load"), 0);
    char p[128];
    snprintf(p, sizeof(p), "%s/h2load", t->dir);
    char *o = slurp(p, NULL);
    assert_non_null(o);
    if (!strstr(o, "200 succeeded, 0 failed, 0 errored") || !strstr(o, "status codes: 200 2xx"))
        fail_msg("h2load: %s", o);
    free(o);
    int n = 200;
    assert_true(run_until(t, closes_reach, &n));
    assert_int_equal(t->n_request, 200);
    assert_int_equal(t->n_finished, 200);
}

static void test_unix_socket(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOL("curl");
    char path[96], spec[140], err[256] = "";
    snprintf(path, sizeof(path), "%s/gw.sock", t->dir);
    snprintf(spec, sizeof(spec), "unix:%s", path);
    /* A stale socket file, as a crashed server leaves it. */
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", path);
    assert_int_equal(bind(fd, (struct sockaddr *)&sun, sizeof(sun)), 0);
    close(fd);
    if (gw_http_server_listen(t->srv, spec, err, sizeof(err)))
        fail_msg("%s", err);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0660);
    /* A live one is not taken over. */
    assert_int_equal(gw_http_server_listen(t->srv, spec, err, sizeof(err)), -EADDRINUSE);
    char *argv[] = {"curl",
                    "-sS",
                    "--noproxy",
                    "*",
                    "--http2-prior-knowledge",
                    "--unix-socket",
                    path,
                    "http://localhost/hello",
                    NULL};
    assert_int_equal(run_child(t, argv, "out"), 0);
    char out[128];
    snprintf(out, sizeof(out), "%s/out", t->dir);
    char *got = slurp(out, NULL);
    assert_string_equal(got, "hello world\n");
    free(got);
    gw_http_server_stop_listening(t->srv);
    assert_int_equal(stat(path, &st), -1); /* the file goes with the listener */
    assert_int_equal(gw_http_server_port(t->srv), 0);
}

static void test_listen_errors(void **state)
{
    tsrv *t = *state;
    char err[256];
    const char *bad[] = {
        "http://x",         "tcp:",        "tcp:127.0.0.1", "tcp:127.0.0.1:65536", "tcp:127.0.0.1:-1",
        "tcp:localhost:80", "tcp:[::1:80", "tcp:::1:80",    "tcp:127.0.0.1:8x",    "unix:"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        assert_int_equal(gw_http_server_listen(t->srv, bad[i], err, sizeof(err)), -EINVAL);
        assert_true(strlen(err) > 0);
    }
    char path[128], spec[140];
    snprintf(path, sizeof(path), "%s/file", t->dir);
    write_file(path, "x", 1);
    snprintf(spec, sizeof(spec), "unix:%s", path);
    assert_int_equal(gw_http_server_listen(t->srv, spec, err, sizeof(err)), -EEXIST);
    /* The port the first listener holds. */
    snprintf(spec, sizeof(spec), "tcp:127.0.0.1:%d", t->port);
    assert_int_equal(gw_http_server_listen(t->srv, spec, err, sizeof(err)), -EADDRINUSE);
    assert_non_null(strstr(err, "bind"));
    /* IPv6 loopback, where the host has it. */
    if (gw_http_server_listen(t->srv, "tcp:[::1]:0", err, sizeof(err)) == 0)
        assert_true(gw_http_server_port(t->srv) > 0);
}

/* ---- an nghttp2 client on a socket, driven by the test's loop ---- */

typedef struct tcli {
    tsrv *t;
    int fd;
    nghttp2_session *ngh;
    struct event *rev;
    int status;
    char body[4096];
    size_t body_len, data_total;
    bool closed, goaway, eof, rst_on_data, rst_sent;
    uint32_t close_err;
} tcli;

static ssize_t cli_send(tcli *c)
{
    for (;;) {
        const uint8_t *data;
        ssize_t n = nghttp2_session_mem_send(c->ngh, &data);
        assert_true(n >= 0);
        if (n == 0)
            return 0;
        for (ssize_t off = 0; off < n;) { /* small frames on a blocking socket */
            ssize_t w = send(c->fd, data + off, (size_t)(n - off), MSG_NOSIGNAL);
            if (w == -1)
                return -1;
            off += w;
        }
    }
}

static void cli_on_read(evutil_socket_t fd, short what, void *arg)
{
    tcli *c = arg;
    uint8_t buf[16384];
    for (;;) {
        ssize_t n = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n == 0 || (n == -1 && errno != EAGAIN && errno != EINTR)) {
            c->eof = true;
            event_del(c->rev);
            return;
        }
        if (n == -1)
            break;
        assert_int_equal(nghttp2_session_mem_recv(c->ngh, buf, (size_t)n), n);
    }
    cli_send(c);
}

static int cli_on_header(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *name, size_t namelen,
                         const uint8_t *value, size_t valuelen, uint8_t flags, void *ud)
{
    tcli *c = ud;
    if (namelen == 7 && !memcmp(name, ":status", 7))
        c->status = atoi((const char *)value);
    return 0;
}

static int cli_on_data(nghttp2_session *s, uint8_t flags, int32_t id, const uint8_t *data, size_t len,
                       void *ud)
{
    tcli *c = ud;
    size_t room = sizeof(c->body) - 1 - c->body_len, n = len < room ? len : room;
    memcpy(c->body + c->body_len, data, n);
    c->body_len += n;
    c->body[c->body_len] = '\0';
    c->data_total += len;
    if (c->rst_on_data && !c->rst_sent) {
        c->rst_sent = true;
        assert_int_equal(nghttp2_submit_rst_stream(s, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL), 0);
    }
    return 0;
}

static int cli_on_close(nghttp2_session *s, int32_t id, uint32_t err, void *ud)
{
    tcli *c = ud;
    c->closed = true;
    c->close_err = err;
    return 0;
}

static int cli_on_frame(nghttp2_session *s, const nghttp2_frame *f, void *ud)
{
    tcli *c = ud;
    if (f->hd.type == NGHTTP2_GOAWAY)
        c->goaway = true;
    return 0;
}

/* Connects and sends the preface with SETTINGS_INITIAL_WINDOW_SIZE = window.
 * With `reading` false the client never reads: a peer that stalls. */
static tcli *cli_new_rcvbuf(tsrv *t, uint32_t window, bool reading, int rcvbuf)
{
    tcli *c = calloc(1, sizeof(*c));
    assert_non_null(c);
    c->t = t;
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(c->fd >= 0);
    if (rcvbuf)
        assert_int_equal(setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf)), 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)t->port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(c->fd, (struct sockaddr *)&a, sizeof(a)), 0);
    nghttp2_session_callbacks *cb;
    assert_int_equal(nghttp2_session_callbacks_new(&cb), 0);
    nghttp2_session_callbacks_set_on_header_callback(cb, cli_on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, cli_on_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, cli_on_close);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, cli_on_frame);
    assert_int_equal(nghttp2_session_client_new(&c->ngh, cb, c), 0);
    nghttp2_session_callbacks_del(cb);
    nghttp2_settings_entry iv[] = {{NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, window}};
    assert_int_equal(nghttp2_submit_settings(c->ngh, NGHTTP2_FLAG_NONE, iv, 1), 0);
    if (reading) {
        c->rev = event_new(t->base, c->fd, EV_READ | EV_PERSIST, cli_on_read, c);
        assert_int_equal(event_add(c->rev, NULL), 0);
    }
    return c;
}

static tcli *cli_new(tsrv *t, uint32_t window, bool reading)
{
    return cli_new_rcvbuf(t, window, reading, 0);
}

static void cli_free(tcli *c)
{
    if (c->rev)
        event_free(c->rev);
    nghttp2_session_del(c->ngh);
    close(c->fd);
    free(c);
}

#define NV(n, v)                                                                                             \
    {                                                                                                        \
        (uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, strlen(v), NGHTTP2_NV_FLAG_NONE                       \
    }

static int32_t cli_get(tcli *c, const char *path)
{
    nghttp2_nv nv[] = {NV(":method", "GET"), NV(":scheme", "http"), NV(":authority", "127.0.0.1"),
                       NV(":path", path), NV("user-agent", "test_http_server")};
    int32_t id = nghttp2_submit_request(c->ngh, NULL, nv, 5, NULL, NULL);
    assert_true(id > 0);
    assert_int_equal(cli_send(c), 0);
    return id;
}

static bool cli_closed(tsrv *t, void *arg)
{
    return ((tcli *)arg)->closed;
}

static bool cli_eof(tsrv *t, void *arg)
{
    return ((tcli *)arg)->eof;
}

static bool no_streams(tsrv *t, void *arg)
{
    return gw_http_server_active_streams(t->srv) == 0;
}

static bool flood_done(tsrv *t, void *arg)
{
    return t->flood_enobufs > 0 && t->n_close > 0;
}

static void test_client_reset(void **state)
{
    tsrv *t = *state;
    tcli *c = cli_new(t, 65535, true);
    c->rst_on_data = true;
    cli_get(c, "/slow");
    int one = 1;
    assert_true(run_until(t, closes_reach, &one));
    assert_true(c->rst_sent);
    assert_int_equal(t->n_request, 1);
    assert_int_equal(t->n_unfinished, 1);
    assert_int_equal(gw_http_server_active_streams(t->srv), 0);
    /* The connection goes on: another request on it. */
    c->closed = false;
    c->body_len = 0;
    c->rst_on_data = false;
    cli_get(c, "/hello");
    assert_true(run_until(t, cli_closed, c));
    assert_int_equal(c->status, 200);
    assert_string_equal(c->body, "hello world\n");
    cli_free(c);
}

static void test_slow_reader(void **state)
{
    tsrv *t = *state;
    tcli *c = cli_new(t, 16, false);
    cli_get(c, "/flood");
    assert_true(run_until(t, flood_done, NULL));
    size_t max = t->lim.max_stream_buffer;
    assert_int_equal(t->flood_enobufs, 1);
    assert_true(t->flood_pending_max <= max);
    /* Only the peer's window (16 bytes) left the stream's buffer. */
    assert_true(t->flood_written <= max + 16);
    assert_true(t->flood_written + 16384 > max);
    assert_int_equal(t->n_unfinished, 1);
    assert_true(run_until(t, no_streams, NULL));
    cli_free(c);
}

static bool read_paused(tsrv *t, void *arg)
{
    return t->srv->conns && t->srv->conns->read_paused;
}

/* A peer that opens its windows wide and then stops reading: the server
 * keeps at most the soft maximum (plus a frame) in the connection's output
 * and stops reading the peer; the peer's going ends the stream. */
static void test_stalled_reader(void **state)
{
    tsrv *t = *state;
    tcli *c = cli_new_rcvbuf(t, (1u << 31) - 1, false, 4096);
    assert_int_equal(nghttp2_session_set_local_window_size(c->ngh, NGHTTP2_FLAG_NONE, 0, (1 << 30)), 0);
    cli_get(c, "/big");
    assert_true(run_until(t, read_paused, NULL));
    gw_http_conn *sc = t->srv->conns;
    size_t out = evbuffer_get_length(bufferevent_get_output(sc->bev));
    assert_true(out >= GW_HTTP_OUT_SOFT_MAX);
    assert_true(out <= GW_HTTP_OUT_SOFT_MAX + 16384 + 9);
    assert_true(gw_http_pending(sc->streams) > 0);
    cli_free(c);
    int one = 1;
    assert_true(run_until(t, closes_reach, &one));
    assert_int_equal(t->n_unfinished, 1);
    assert_null(t->srv->conns);
}

static void test_rejects(void **state)
{
    tsrv *t = *state;
    tcli *c = cli_new(t, 65535, true);
    /* CONNECT passes nghttp2's checks without :path. */
    nghttp2_nv connect_nv[] = {NV(":method", "CONNECT"), NV(":authority", "example.com:443")};
    assert_true(nghttp2_submit_request(c->ngh, NULL, connect_nv, 2, NULL, NULL) > 0);
    cli_send(c);
    assert_true(run_until(t, cli_closed, c));
    assert_int_equal(c->status, 400);
    assert_non_null(strstr(c->body, "\"type\":\"invalid_request_error\""));

    /* Headers over max_header_list (4 KiB here). */
    c->closed = false;
    c->status = 0;
    c->body_len = 0;
    char big[5000];
    memset(big, 'a', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    nghttp2_nv big_nv[] = {NV(":method", "GET"), NV(":scheme", "http"), NV(":authority", "x"),
                           NV(":path", "/hello"), NV("x-big", big)};
    assert_true(nghttp2_submit_request(c->ngh, NULL, big_nv, 5, NULL, NULL) > 0);
    cli_send(c);
    assert_true(run_until(t, cli_closed, c));
    assert_int_equal(c->status, 431);
    assert_non_null(strstr(c->body, "request_header_fields_too_large"));

    /* Reset during the upload: the application never hears of it. */
    nghttp2_nv post_nv[] = {NV(":method", "POST"), NV(":scheme", "http"), NV(":authority", "x"),
                            NV(":path", "/echo")};
    int32_t id = nghttp2_submit_headers(c->ngh, NGHTTP2_FLAG_NONE, -1, NULL, post_nv, 4, NULL);
    assert_true(id > 0);
    cli_send(c);
    assert_int_equal(nghttp2_submit_rst_stream(c->ngh, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL), 0);
    cli_send(c);
    assert_true(run_until(t, no_streams, NULL));
    assert_int_equal(t->n_request, 0);
    assert_int_equal(t->n_close, 0);
    cli_free(c);
}

static void test_free_closes_streams(void **state)
{
    tsrv *t = *state;
    tcli *c = cli_new(t, 65535, true);
    cli_get(c, "/hang");
    cli_get(c, "/slow");
    int two = 2;
    long deadline = now_ms() + WAIT_MS;
    while (t->n_request < two && now_ms() < deadline)
        event_base_loop(t->base, EVLOOP_ONCE);
    assert_int_equal(t->n_request, 2);
    assert_int_equal(gw_http_server_active_streams(t->srv), 2);
    gw_http_server_free(t->srv);
    t->srv = NULL;
    assert_int_equal(t->n_close, 2);
    assert_int_equal(t->n_unfinished, 2);
    cli_free(c);
}

static void test_idle_timeout(void **state)
{
    tsrv *t = *state;
    tcli *c = cli_new(t, 65535, true);
    cli_get(c, "/hello");
    assert_true(run_until(t, cli_eof, c));
    assert_int_equal(c->status, 200);
    assert_true(c->goaway);
    cli_free(c);
}

static void test_eof_closes_streams(void **state)
{
    tsrv *t = *state;
    tcli *c = cli_new(t, 65535, true);
    cli_get(c, "/hang");
    long deadline = now_ms() + WAIT_MS;
    while (t->n_request < 1 && now_ms() < deadline)
        event_base_loop(t->base, EVLOOP_ONCE);
    cli_free(c);
    int one = 1;
    assert_true(run_until(t, closes_reach, &one));
    assert_int_equal(t->n_unfinished, 1);
    assert_int_equal(gw_http_server_active_streams(t->srv), 0);
}

static int setup_small(void **state)
{
    gw_http_limits l;
    gw_http_limits_default(&l);
    l.max_header_list = 4096;
    l.max_stream_buffer = 256 << 10;
    return setup_limits(state, &l);
}

static int setup_idle(void **state)
{
    gw_http_limits l;
    gw_http_limits_default(&l);
    l.idle_timeout_ms = 100;
    return setup_limits(state, &l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_get_whole, setup, teardown),
        cmocka_unit_test_setup_teardown(test_post_echo, setup, teardown),
        cmocka_unit_test_setup_teardown(test_body_too_large, setup, teardown),
        cmocka_unit_test_setup_teardown(test_streaming, setup, teardown),
        cmocka_unit_test_setup_teardown(test_big_response, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_streams, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stalled_reader, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unix_socket, setup, teardown),
        cmocka_unit_test_setup_teardown(test_listen_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_reset, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slow_reader, setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_rejects, setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_free_closes_streams, setup, teardown),
        cmocka_unit_test_setup_teardown(test_eof_closes_streams, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idle_timeout, setup_idle, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
