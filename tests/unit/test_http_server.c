/* Tests of the HTTP/2 server (gateway/http/server.c, gateway/http/listen.c)
 * with real clients: curl --http2-prior-knowledge and h2load run as child
 * processes while this process runs the server's loop, and a small
 * nghttp2 client session on a socket, driven by the same loop, for what the
 * tools cannot do on cue (reset after the first DATA, never read, CONNECT,
 * huge headers, reset during upload).
 *
 * See http_harness.h for the handler's paths. Every wait is bounded
 * (WAIT_MS), every child is reaped, and only 127.0.0.1 and a socket file
 * under /tmp are used. Tests needing a tool that is missing are skipped.
 * Nothing asserts on timing. */
#include "http_harness.h"

#include <sys/stat.h>
#include <sys/un.h>

#include <nghttp2/nghttp2.h>

#define BIG_BODY ((1 << 20) - 1)

/* What every request of these tests must look like, on top of what the
 * harness checks. */
static void check_request(const gw_http_request *req)
{
    if (!strcmp(req->path, "/hello")) {
        assert_string_equal(req->method, "GET");
        assert_non_null(req->authority);
        assert_non_null(gw_http_header_get(req, "user-agent"));
        assert_null(gw_http_header_get(req, "no-such-header"));
    } else if (!strcmp(req->path, "/echo")) {
        assert_string_equal(req->method, "POST");
    }
}

static tsrv *start(const gw_http_limits *lim)
{
    tsrv *t = harness_new_tcp(lim);
    t->check_request = check_request;
    return t;
}

HARNESS_SETUP(setup, start, 0)
HARNESS_SETUP(setup_small, start, .max_header_list = 4096, .max_stream_buffer = 256 << 10)
HARNESS_SETUP(setup_idle, start, .idle_timeout_ms = 100)
HARNESS_SETUP(setup_few_streams, start, .max_concurrent_streams = 16)
/* a machine that stalls a few hundred ms must not make a pause a timeout */
HARNESS_SETUP(setup_stream_bounds, start, .idle_timeout_ms = 1000)
HARNESS_SETUP(setup_header_block, start, .idle_timeout_ms = 60000, .header_timeout_ms = 200)
HARNESS_SETUP(setup_conn_body, start, .max_body = 1000)

/* ---- tests with curl and h2load ---- */

#define H2C "--http2-prior-knowledge"

static void test_get_whole(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOL("curl");
    char **argv = curl_argv(t, H2C, "-o", scratch(t, "body"), "-D", scratch(t, "head"), "-w",
                            "%{http_code} %{http_version}", url(t, "/hello"), NULL);
    assert_int_equal(run_child(t, argv, "meta"), 0);
    expect_output(t, "meta", "200 2");
    expect_output(t, "body", "hello world\n");
    char *head = child_out(t, "head");
    expect_date_header(head);
    free(head);
    int one = 1;
    assert_true(run_until(t, closes_reach, &one));
    assert_int_equal(t->n_request, 1);
    assert_int_equal(t->n_finished, 1);
    assert_int_equal(gw_http_server_active_streams(t->srv), 0);
}

static void test_post_echo(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOL("curl");
    post_echo(t, 3, H2C, "-H", "Expect:", "-H", "content-type: application/octet-stream", NULL);
    post_echo(t, BIG_BODY, H2C, "-H", "Expect:", "-H", "content-type: application/octet-stream", NULL);
    expect_finished(t, 2);
}

static void test_body_too_large(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOL("curl");
    size_t len = (1 << 20) + 1;
    char *buf = calloc(1, len);
    assert_non_null(buf);
    write_file(scratch(t, "in"), buf, len);
    free(buf);
    char data[200];
    snprintf(data, sizeof(data), "@%s", scratch(t, "in"));
    char **argv = curl_argv(t, H2C, "-H", "Expect:", "--data-binary", data, "-o", scratch(t, "out"), "-w",
                            "%{http_code}", url(t, "/echo"), NULL);
    /* The server answers before the upload ends and drops the rest. */
    assert_int_equal(run_child(t, argv, "code"), 0);
    expect_output(t, "code", "413");
    expect_output(t, "out",
                  "{\"error\":{\"message\":\"request body larger than 1048576 bytes\",\"type\":"
                  "\"invalid_request_error\",\"param\":null,\"code\":\"request_too_large\"}}");
    /* curl may exit before the loop has seen its connection go */
    assert_true(run_until(t, no_streams, NULL));
    assert_int_equal(t->n_request, 0);
    assert_int_equal(t->n_close, 0);
}

static void test_streaming(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOL("curl");
    char **argv = curl_argv(t, H2C, "-N", "-o", scratch(t, "out"), url(t, "/stream"), NULL);
    assert_int_equal(run_child(t, argv, "meta"), 0);
    expect_output(t, "out", ten_pieces);
    expect_finished(t, 1);
}

static void test_big_response(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOL("curl");
    char **argv = curl_argv(t, H2C, "-o", scratch(t, "out"), url(t, "/big"), NULL);
    assert_int_equal(run_child(t, argv, "meta"), 0);
    size_t len = 0;
    char *got = slurp(scratch(t, "out"), &len);
    assert_non_null(got);
    assert_int_equal(len, BIG_RESPONSE);
    assert_memory_equal(got, big_response(), BIG_RESPONSE);
    free(got);
    expect_finished(t, 1);
}

static void test_many_streams(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOL("h2load");
    char *argv[] = {"h2load", "-n", "200", "-c", "2", "-m", "20", (char *)url(t, "/tiny"), NULL};
    assert_int_equal(run_child(t, argv, "h2load"), 0);
    char *o = child_out(t, "h2load");
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
    char **argv = curl_argv(t, H2C, "--unix-socket", path, "http://localhost/hello", NULL);
    assert_int_equal(run_child(t, argv, "out"), 0);
    expect_output(t, "out", "hello world\n");
    gw_http_server_drain(t->srv);
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
    int n_closed, n_refused, n_rst;
    uint32_t goaway_err;
    /* request bodies sent piece by piece (cli_upload) */
    struct tupload {
        char data[4096];
        size_t len, off;
        bool end;
    } up[8];
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
    c->n_closed++;
    c->n_refused += err == NGHTTP2_REFUSED_STREAM;
    return 0;
}

static int cli_on_frame(nghttp2_session *s, const nghttp2_frame *f, void *ud)
{
    tcli *c = ud;
    if (f->hd.type == NGHTTP2_GOAWAY) {
        c->goaway = true;
        c->goaway_err = f->goaway.error_code;
    }
    c->n_rst += f->hd.type == NGHTTP2_RST_STREAM;
    return 0;
}

/* Connects and sends the preface with SETTINGS_INITIAL_WINDOW_SIZE = window.
 * With `reading` false the client never reads: a peer that stalls. */
static tcli *cli_new_rcvbuf(tsrv *t, uint32_t window, bool reading, int rcvbuf)
{
    tcli *c = calloc(1, sizeof(*c));
    assert_non_null(c);
    c->t = t;
    c->fd = raw_connect(t, rcvbuf);
    nghttp2_session_callbacks *cb;
    assert_int_equal(nghttp2_session_callbacks_new(&cb), 0);
    nghttp2_session_callbacks_set_on_header_callback(cb, cli_on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, cli_on_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, cli_on_close);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, cli_on_frame);
    /* header blocks past nghttp2's own 64 KiB are sent: they are the test */
    nghttp2_option *opt;
    assert_int_equal(nghttp2_option_new(&opt), 0);
    nghttp2_option_set_max_send_header_block_length(opt, 1 << 20);
    assert_int_equal(nghttp2_session_client_new2(&c->ngh, cb, c, opt), 0);
    nghttp2_option_del(opt);
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

/* Forgets the last response, for the next one on the same connection. */
static void cli_next(tcli *c)
{
    c->closed = false;
    c->status = 0;
    c->body_len = 0;
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

/* A POST /echo whose body goes out as cli_upload_add gives it. */
static ssize_t cli_upload_read(nghttp2_session *s, int32_t id, uint8_t *buf, size_t len, uint32_t *flags,
                               nghttp2_data_source *src, void *ud)
{
    struct tupload *u = src->ptr;
    size_t n = u->len - u->off < len ? u->len - u->off : len;
    if (n == 0 && !u->end)
        return NGHTTP2_ERR_DEFERRED;
    memcpy(buf, u->data + u->off, n);
    u->off += n;
    if (u->end && u->off == u->len)
        *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

static int32_t cli_upload(tcli *c, int slot)
{
    nghttp2_nv nv[] = {NV(":method", "POST"), NV(":scheme", "http"), NV(":authority", "127.0.0.1"),
                       NV(":path", "/echo")};
    nghttp2_data_provider dp = {.source.ptr = &c->up[slot], .read_callback = cli_upload_read};
    int32_t id = nghttp2_submit_request(c->ngh, NULL, nv, 4, &dp, NULL);
    assert_true(id > 0);
    assert_int_equal(cli_send(c), 0);
    return id;
}

static void cli_upload_add(tcli *c, int slot, int32_t id, size_t n, bool end)
{
    struct tupload *u = &c->up[slot];
    assert_true(u->len + n <= sizeof(u->data));
    memset(u->data + u->len, 'a' + slot, n);
    u->len += n;
    u->end = end;
    nghttp2_session_resume_data(c->ngh, id);
    assert_int_equal(cli_send(c), 0);
}

static bool cli_closed(tsrv *t, void *arg)
{
    return ((tcli *)arg)->closed;
}

static bool cli_rst_seen(tsrv *t, void *arg)
{
    return ((tcli *)arg)->n_rst > 0;
}

static bool cli_status_seen(tsrv *t, void *arg)
{
    return ((tcli *)arg)->status != 0;
}

static bool cli_eof(tsrv *t, void *arg)
{
    return ((tcli *)arg)->eof;
}

struct cli_wait {
    tcli *c;
    int n;
};

static bool closes_reach_cli(tsrv *t, void *arg)
{
    struct cli_wait *w = arg;
    return w->c->n_closed >= w->n;
}

static bool cli_goaway(tsrv *t, void *arg)
{
    return ((tcli *)arg)->goaway;
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

/* A client that opens its windows wide, asks for /big and reads nothing:
 * returned once the server has stopped reading it. */
static tcli *cli_stalled_on_big(tsrv *t)
{
    tcli *c = cli_new_rcvbuf(t, (1u << 31) - 1, false, 4096);
    assert_int_equal(nghttp2_session_set_local_window_size(c->ngh, NGHTTP2_FLAG_NONE, 0, (1 << 30)), 0);
    cli_get(c, "/big");
    assert_true(run_until(t, read_paused, NULL));
    return c;
}

/* A peer that opens its windows wide and then stops reading: the server
 * keeps at most the soft maximum (plus a frame) in the connection's output
 * and stops reading the peer; the peer's going ends the stream. */
static void test_stalled_reader(void **state)
{
    tsrv *t = *state;
    tcli *c = cli_stalled_on_big(t);
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

/* A paused connection reads again once its output drains, however it
 * drained. Here the peer catches up and the next flush is an
 * application's write (the protocol's on_send, as on_send_ev runs it),
 * which the socket takes whole: no write callback came after it, and the
 * connection stayed paused with the rest of /big never sent. */
static void test_paused_read_resumes(void **state)
{
    tsrv *t = *state;
    tcli *c = cli_stalled_on_big(t);
    gw_http_conn *sc = t->srv->conns;
    /* room in the kernel for the whole output once the peer has read */
    int big = 4 << 20;
    assert_int_equal(setsockopt(bufferevent_getfd(sc->bev), SOL_SOCKET, SO_SNDBUF, &big, sizeof(big)), 0);
    c->rev = event_new(t->base, c->fd, EV_READ | EV_PERSIST, cli_on_read, c);
    assert_non_null(c->rev);
    for (int i = 0; i < 20; i++) { /* the peer reads what the kernel holds */
        cli_on_read(c->fd, EV_READ, c);
        usleep(5000);
    }
    sc->proto->on_send(sc);
    assert_int_equal(evbuffer_get_length(bufferevent_get_output(sc->bev)) >= GW_HTTP_OUT_SOFT_MAX,
                     sc->read_paused);
    assert_int_equal(event_add(c->rev, NULL), 0);
    assert_true(run_until(t, cli_closed, c));
    assert_int_equal(c->close_err, NGHTTP2_NO_ERROR);
    assert_int_equal(c->data_total, BIG_RESPONSE);
    assert_false(t->srv->conns->read_paused);
    cli_free(c);
}

/* content-length on a whole response and on a stream of a length said in
 * advance (not the application's own); a stream that ends short is reset. */
static void test_sized_stream(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOL("curl");
    char **argv =
        curl_argv(t, H2C, "-D", scratch(t, "head"), "-o", scratch(t, "out"), url(t, "/sized"), NULL);
    assert_int_equal(run_child(t, argv, "meta"), 0);
    expect_output(t, "out", ten_pieces);
    char *head = child_out(t, "head");
    assert_non_null(strstr(head, "content-length: 80\r\n"));
    assert_null(strstr(head, "content-length: 3"));
    free(head);
    expect_finished(t, 1);
    char **whole = curl_argv(t, H2C, "-D", scratch(t, "head"), "-o", "/dev/null", url(t, "/hello"), NULL);
    assert_int_equal(run_child(t, whole, "meta"), 0);
    head = child_out(t, "head");
    assert_non_null(strstr(head, "content-length: 12\r\n"));
    free(head);
    expect_finished(t, 2);
    char **cut = curl_argv(t, H2C, "-o", scratch(t, "out"), url(t, "/sized-short"), NULL);
    assert_int_not_equal(run_child(t, cut, "meta"), 0);
    int three = 3;
    assert_true(run_until(t, closes_reach, &three));
    assert_int_equal(t->n_unfinished, 1);
    /* HEAD, on a connection the client keeps: the length said, the pieces
     * dropped, the end whole (the harness checks gw_http_end gives 0). */
    tcli *c = cli_new(t, 65535, true);
    nghttp2_nv head_nv[] = {NV(":method", "HEAD"), NV(":scheme", "http"), NV(":authority", "x"),
                            NV(":path", "/sized")};
    assert_true(nghttp2_submit_request(c->ngh, NULL, head_nv, 4, NULL, NULL) > 0);
    cli_send(c);
    assert_true(run_until(t, cli_closed, c));
    assert_int_equal(c->status, 200);
    assert_int_equal(c->close_err, NGHTTP2_NO_ERROR);
    assert_int_equal(c->body_len, 0);
    int four = 4;
    assert_true(run_until(t, closes_reach, &four));
    assert_int_equal(t->n_finished, 3);
    cli_free(c);
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
    cli_next(c);
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

    /* A :path that alone is over it: the target is too long. */
    cli_next(c);
    big[0] = '/';
    nghttp2_nv long_nv[] = {NV(":method", "GET"), NV(":scheme", "http"), NV(":authority", "x"),
                            NV(":path", big)};
    assert_true(nghttp2_submit_request(c->ngh, NULL, long_nv, 4, NULL, NULL) > 0);
    cli_send(c);
    assert_true(run_until(t, cli_closed, c));
    assert_int_equal(c->status, 414);
    assert_non_null(strstr(c->body, "uri_too_long"));
    /* The same as HEAD: the answer has no body (DATA would be a protocol
     * error to the client). */
    cli_next(c);
    /* :path first, so that :method comes after the stream is refused */
    nghttp2_nv head_nv[] = {NV(":path", big), NV(":method", "HEAD"), NV(":scheme", "http"),
                            NV(":authority", "x")};
    assert_true(nghttp2_submit_request(c->ngh, NULL, head_nv, 4, NULL, NULL) > 0);
    cli_send(c);
    assert_true(run_until(t, cli_closed, c));
    assert_int_equal(c->status, 414);
    assert_int_equal(c->body_len, 0);
    assert_int_equal(c->close_err, NGHTTP2_NO_ERROR);

    /* A field with bytes HTTP forbids: 400, as over HTTP/1, not a bare
     * reset; the application never hears of it. */
    cli_next(c);
    nghttp2_nv bad_nv[] = {NV(":method", "GET"), NV(":scheme", "http"), NV(":authority", "x"),
                           NV(":path", "/hello"), NV("x-bad", "a\001b")};
    assert_true(nghttp2_submit_request(c->ngh, NULL, bad_nv, 5, NULL, NULL) > 0);
    cli_send(c);
    assert_true(run_until(t, cli_closed, c));
    assert_int_equal(c->status, 400);
    assert_non_null(strstr(c->body, "malformed request header field"));

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
    assert_true(run_until(t, requests_reach, &two));
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
    int one = 1;
    assert_true(run_until(t, requests_reach, &one));
    cli_free(c);
    assert_true(run_until(t, closes_reach, &one));
    assert_int_equal(t->n_unfinished, 1);
    assert_int_equal(gw_http_server_active_streams(t->srv), 0);
}

/* Draining: the connection is told GOAWAY naming its last stream while that
 * stream still runs, the stream finishes whole, and then the server closes
 * the connection (before, it stayed open for the client to go on using). */
static void test_drain(void **state)
{
    tsrv *t = *state;
    tcli *c = cli_new(t, 65535, true);
    cli_get(c, "/stream");
    int one = 1;
    assert_true(run_until(t, requests_reach, &one));
    gw_http_server_drain(t->srv);
    assert_true(run_until(t, cli_goaway, c));
    assert_false(c->closed);
    assert_true(run_until(t, cli_closed, c));
    assert_int_equal(c->status, 200);
    assert_int_equal(c->close_err, NGHTTP2_NO_ERROR);
    assert_string_equal(c->body, ten_pieces);
    assert_true(run_until(t, cli_eof, c));
    expect_finished(t, 1);
    cli_free(c);
}

static void run_for_exactly(tsrv *t, int ms);

static bool no_conns(tsrv *t, void *arg)
{
    return t->srv->conns == NULL;
}

/* A drain whose last stream is a large one, to a client reading at its
 * own pace. Once all is handed to the kernel, the server shuts its side
 * and reads what the client still sends, dropping it, until the client
 * closes. Freed at once instead, with frames of the client's unread (its
 * WINDOW_UPDATEs, a PING), the kernel reset the connection and dropped the
 * end of the response it still held. */
static void test_drain_linger(void **state)
{
    tsrv *t = *state;
    tcli *c = cli_new_rcvbuf(t, 65535, true, 4096);
    cli_get(c, "/big");
    int one = 1;
    assert_true(run_until(t, requests_reach, &one));
    gw_http_server_drain(t->srv);
    assert_true(run_until(t, cli_closed, c));
    assert_int_equal(c->close_err, NGHTTP2_NO_ERROR);
    assert_int_equal(c->data_total, BIG_RESPONSE);
    assert_true(run_until(t, cli_eof, c)); /* the server's side is shut */
    assert_true(c->goaway);
    assert_non_null(t->srv->conns); /* ... and it reads on */
    static const uint8_t ping[17] = {0, 0, 8, 6 /* PING */, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8};
    assert_int_equal(send(c->fd, ping, sizeof(ping), MSG_NOSIGNAL), (ssize_t)sizeof(ping));
    run_for_exactly(t, 100);
    char b;
    assert_int_equal(recv(c->fd, &b, 1, MSG_DONTWAIT), 0); /* still a clean end, not a reset */
    cli_free(c);
    assert_true(run_until(t, no_conns, NULL));
}

static bool cli_closed_or_goaway(tsrv *t, void *arg)
{
    tcli *c = arg;
    return c->closed || c->goaway;
}

/* "MadeYouReset": a client makes the server reset the streams it sends,
 * each already taken by the application, with a frame the protocol
 * forbids there (a WINDOW_UPDATE past the stream's largest window: a
 * stream error; nghttp2 1.52 takes a 0 increment, or DATA after the
 * stream's end, for connection errors). nghttp2 1.52 counts only
 * the resets a client sends; past 64 such streams (max_concurrent_streams
 * 16 here) the connection is told ENHANCE_YOUR_CALM and closed. */
static void test_made_you_reset(void **state)
{
    tsrv *t = *state;
    tcli *c = cli_new(t, 65535, true);
    int i;
    for (i = 0; i < 200 && !c->goaway; i++) {
        c->closed = false;
        int32_t id = cli_get(c, "/hang");
        int n = i + 1;
        assert_true(run_until(t, requests_reach, &n) || c->goaway);
        const uint8_t wu[13] = {0,
                                0,
                                4,
                                8 /* WINDOW_UPDATE */,
                                0,
                                (uint8_t)(id >> 24),
                                (uint8_t)(id >> 16),
                                (uint8_t)(id >> 8),
                                (uint8_t)id,
                                0x7f,
                                0xff,
                                0xff,
                                0xff};
        assert_int_equal(send(c->fd, wu, sizeof(wu), MSG_NOSIGNAL), (ssize_t)sizeof(wu));
        assert_true(run_until(t, cli_closed_or_goaway, c));
    }
    assert_true(c->goaway);
    assert_int_equal(c->goaway_err, NGHTTP2_ENHANCE_YOUR_CALM);
    assert_true(i >= 64 && i <= 66);
    cli_free(c);

    /* A client's own cancellations are not that: 80 streams it resets
     * itself leave its connection open (nghttp2's bucket bounds those). */
    c = cli_new(t, 65535, true);
    int base = t->n_request;
    for (i = 0; i < 80; i++) {
        c->closed = false;
        int32_t id = cli_get(c, "/hang");
        int n = base + i + 1;
        assert_true(run_until(t, requests_reach, &n));
        assert_int_equal(nghttp2_submit_rst_stream(c->ngh, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL), 0);
        assert_int_equal(cli_send(c), 0);
        assert_true(run_until(t, cli_closed, c));
    }
    cli_get(c, "/hello");
    c->closed = false;
    assert_true(run_until(t, cli_closed, c));
    assert_false(c->goaway);
    assert_int_equal(c->status, 200);
    cli_free(c);
}

/* Turns the loop for about ms milliseconds, however far off its next
 * event is (run_for waits for one). */
static void run_for_exactly(tsrv *t, int ms)
{
    long end = now_ms() + ms;
    while (now_ms() < end) {
        struct timeval tv = {0, 5000};
        event_base_loopexit(t->base, &tv);
        event_base_dispatch(t->base);
    }
}

/* idle_timeout_ms bounds each pause inside a request body, as it does for
 * HTTP/1.x: a body that keeps coming is read whole; one that stops gets 408
 * and the application never hears of it. Before, the stream stayed open for
 * ever, holding its body. */
static void test_body_timeout(void **state)
{
    tsrv *t = *state;
    tcli *c = cli_new(t, 65535, true);
    int32_t id = cli_upload(c, 0);
    for (int i = 0; i < 4; i++) { /* four pauses well short of the timeout (1 s) */
        cli_upload_add(c, 0, id, 10, false);
        run_for_exactly(t, 150);
    }
    cli_upload_add(c, 0, id, 10, true);
    assert_true(run_until(t, cli_closed, c));
    assert_int_equal(c->status, 200);
    assert_int_equal(c->body_len, 50);
    assert_int_equal(t->n_request, 1);

    cli_next(c);
    long t0 = now_ms();
    id = cli_upload(c, 1);
    cli_upload_add(c, 1, id, 10, false);
    assert_true(run_until(t, cli_closed, c));
    assert_int_equal(c->status, 408);
    assert_non_null(strstr(c->body, "\"code\":\"request_timeout\""));
    assert_true(now_ms() - t0 >= 950);
    assert_int_equal(t->n_request, 1);
    cli_free(c);
}

/* Empty DATA frames are no part of a body: sent every 200 ms, they no
 * longer keep a stream waiting for its body past idle_timeout_ms (1 s). */
static void test_empty_data_not_progress(void **state)
{
    tsrv *t = *state;
    tcli *c = cli_new(t, 65535, true);
    int32_t id = cli_upload(c, 0);
    const uint8_t empty[9] = {
        0, 0, 0, 0 /* DATA */, 0, (uint8_t)(id >> 24), (uint8_t)(id >> 16), (uint8_t)(id >> 8), (uint8_t)id};
    long t0 = now_ms();
    for (int i = 0; i < 20 && !c->closed; i++) {
        assert_int_equal(send(c->fd, empty, sizeof(empty), MSG_NOSIGNAL), (ssize_t)sizeof(empty));
        run_for_exactly(t, 200);
    }
    assert_true(c->closed);
    assert_int_equal(c->status, 408);
    assert_true(now_ms() - t0 < 3000);
    assert_int_equal(t->n_request, 0);
    cli_free(c);
}

/* A request answered (413 for its content-length) with its body still
 * coming, over a client window of `window`: a byte of body every 100 ms
 * until the stream is reset, at most max_ms. Returns the ms it took. */
static long answered_body_case(tsrv *t, uint32_t window, long max_ms)
{
    tcli *c = cli_new(t, window, true);
    char big_len[32];
    snprintf(big_len, sizeof(big_len), "%zu", t->lim.max_body + 1);
    nghttp2_nv nv[] = {NV(":method", "POST"), NV(":scheme", "http"), NV(":authority", "127.0.0.1"),
                       NV(":path", "/echo"), NV("content-length", big_len)};
    int32_t id = nghttp2_submit_headers(c->ngh, NGHTTP2_FLAG_NONE, -1, NULL, nv, 5, NULL);
    assert_true(id > 0);
    long t0 = now_ms(); /* before the server's 5 s can have begun */
    assert_int_equal(cli_send(c), 0);
    assert_true(run_until(t, cli_status_seen, c));
    assert_int_equal(c->status, 413);
    const uint8_t piece[10] = {
        0,           0,  1, 0 /* DATA */, 0, (uint8_t)(id >> 24), (uint8_t)(id >> 16), (uint8_t)(id >> 8),
        (uint8_t)id, 'x'};
    while (!c->n_rst && now_ms() - t0 < max_ms) {
        assert_int_equal(send(c->fd, piece, sizeof(piece), MSG_NOSIGNAL), (ssize_t)sizeof(piece));
        run_for_exactly(t, 100);
    }
    assert_true(c->n_rst > 0);
    assert_int_equal(t->n_request, 0);
    cli_free(c);
    return now_ms() - t0;
}

/* The body of a request already answered is read and dropped for
 * GW_HTTP_LINGER_MS (5 s) in all, as HTTP/1 lingers: a byte every 100 ms
 * kept the stream open for ever, each within idle_timeout_ms (two minutes
 * here). */
static void test_answered_body_bounded(void **state)
{
    assert_true(answered_body_case(*state, 65535, 9000) >= 4500);
}

/* The same with the client's window shut: the answer's end never goes
 * out, and the 5 s run from the answer, not from its end going. Before,
 * a byte every 100 ms kept such a stream (and, on a server with tenants,
 * one a client without a key had opened) for ever. */
static void test_answered_body_window_shut(void **state)
{
    answered_body_case(*state, 0, 12000);
}

/* Trailers of a request already answered (400 here, for a field with a
 * control byte) are bounded as any header block is: 40 one-byte
 * references to a 4000-byte field decode to past twice max_header_list,
 * and the stream is reset instead of decoded on. Before, such a block was
 * not counted at all. */
static void test_answered_trailers_bounded(void **state)
{
    tsrv *t = *state;
    tcli *c = cli_new(t, 65535, true);
    nghttp2_nv nv[] = {NV(":method", "POST"), NV(":scheme", "http"), NV(":authority", "127.0.0.1"),
                       NV(":path", "/echo"), NV("x-bad", "a\001b")};
    int32_t id = nghttp2_submit_headers(c->ngh, NGHTTP2_FLAG_NONE, -1, NULL, nv, 5, NULL);
    assert_true(id > 0);
    assert_int_equal(cli_send(c), 0);
    assert_true(run_until(t, cli_status_seen, c));
    assert_int_equal(c->status, 400);
    static char big[4000];
    memset(big, 'v', sizeof(big));
    nghttp2_nv tr[40];
    for (int i = 0; i < 40; i++)
        tr[i] = (nghttp2_nv){(uint8_t *)"x-big", (uint8_t *)big, 5, sizeof(big), NGHTTP2_NV_FLAG_NONE};
    assert_int_equal(nghttp2_submit_headers(c->ngh, NGHTTP2_FLAG_END_STREAM, id, NULL, tr, 40, NULL), 0);
    assert_int_equal(cli_send(c), 0);
    /* our end is closed once the trailers are sent: the reset is seen as a frame */
    assert_true(run_until(t, cli_rst_seen, c));
    assert_int_equal(t->n_request, 0);
    cli_free(c);
}

/* A response the client's flow-control window holds (a window of 0 here)
 * is reset after idle_timeout_ms, and the application hears of it: the
 * work behind it stops. Before, the stream and its buffered output stayed
 * for as long as the client kept the connection. */
static void test_window_held(void **state)
{
    tsrv *t = *state;
    tcli *c = cli_new(t, 0, true);
    cli_get(c, "/stream");
    assert_true(run_until(t, cli_closed, c));
    assert_int_equal(c->status, 200);
    assert_int_equal(c->close_err, NGHTTP2_INTERNAL_ERROR);
    int one = 1;
    assert_true(run_until(t, closes_reach, &one));
    assert_int_equal(t->n_unfinished, 1);
    cli_free(c);
    /* A whole response (headers and body submitted together) as well. */
    c = cli_new(t, 0, true);
    cli_get(c, "/hello");
    assert_true(run_until(t, cli_closed, c));
    assert_int_equal(c->status, 200);
    assert_int_equal(c->close_err, NGHTTP2_INTERNAL_ERROR);
    assert_int_equal(c->body_len, 0);
    cli_free(c);
}

/* A header block left open (HEADERS without END_HEADERS, then nothing)
 * holds the whole connection: it is closed after header_timeout_ms. So is
 * a connection that sent the preface's magic and no frame. Before, both
 * waited for idle_timeout_ms (a minute here). */
static void test_header_block_timeout(void **state)
{
    tsrv *t = *state;
    static const char magic[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    static const uint8_t settings[] = {0, 0, 0, 4, 0, 0, 0, 0, 0};
    /* length 3, HEADERS, no flags, stream 1: :method GET, :path /, :scheme http */
    static const uint8_t headers[] = {0, 0, 3, 1, 0, 0, 0, 0, 1, 0x82, 0x84, 0x86};
    for (int i = 0; i < 2; i++) {
        long t0 = now_ms();
        int fd = raw_connect(t, 0);
        raw_send(fd, magic, sizeof(magic) - 1);
        if (i == 0) {
            raw_send(fd, settings, sizeof(settings));
            raw_send(fd, headers, sizeof(headers));
        }
        free(raw_read_all(t, fd, 1 << 16, NULL));
        close(fd);
        long took = now_ms() - t0;
        if (took < 150 || took > 20000)
            fail_msg("case %d: closed after %ld ms", i, took);
    }
    assert_int_equal(t->n_request, 0);
}

/* Request bodies still arriving on one connection are held to 4 x max_body:
 * past it a newer stream is refused (REFUSED_STREAM, safe to send again);
 * the oldest always goes on, and the rest complete. */
static void test_conn_body_bound(void **state)
{
    tsrv *t = *state;
    tcli *c = cli_new(t, 65535, true);
    int32_t ids[6];
    for (int i = 0; i < 6; i++) {
        ids[i] = cli_upload(c, i);
        cli_upload_add(c, i, ids[i], 900, false); /* max_body 1000: 4 fit in 4000 */
    }
    assert_true(run_until(t, closes_reach_cli, &(struct cli_wait){c, 2}));
    assert_int_equal(c->n_refused, 2);
    for (int i = 0; i < 4; i++)
        cli_upload_add(c, i, ids[i], 50, true);
    assert_true(run_until(t, closes_reach_cli, &(struct cli_wait){c, 6}));
    assert_int_equal(c->n_refused, 2);
    assert_int_equal(t->n_request, 4);
    cli_free(c);
}

static bool handled_reach(tsrv *t, void *arg)
{
    struct cli_wait *w = arg;
    return t->n_request + w->c->n_refused >= w->n;
}

/* Whole bodies count too while their streams stay open: with its window
 * shut, a client holds every answer, and each answered request's body
 * with it. Six bodies sent one after another, each alone on the wire: the
 * four that fit are taken, the next are refused. Before, each went on as
 * the oldest arriving, and 256 streams of a connection pinned 256 bodies
 * until idle_timeout_ms, longer with a byte of window now and then. */
static void test_conn_body_held(void **state)
{
    tsrv *t = *state;
    tcli *c = cli_new(t, 0, true);
    for (int i = 0; i < 6; i++) {
        int32_t id = cli_upload(c, i);
        cli_upload_add(c, i, id, 900, true);
        assert_true(run_until(t, handled_reach, &(struct cli_wait){c, i + 1}));
    }
    assert_int_equal(t->n_request, 4);
    assert_int_equal(c->n_refused, 2);
    cli_free(c);
}

static void test_segment_is(void **state)
{
    (void)state;
    static const char name[] = "org/model-1";
    const struct {
        const char *seg;
        bool is;
    } cases[] = {
        {"org/model-1", true},    {"org%2Fmodel-1", true},
        {"org%2fmodel-1", true},  {"%6Frg%2Fmodel-1", true},
        {"org%2Fmodel-", false},  {"org%2Fmodel-1x", false},
        {"org%2", false},         {"org%2Gmodel-1", false},
        {"org%", false},          {"", false},
        {"org%00model-1", false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        if (gw_http_segment_is(cases[i].seg, strlen(cases[i].seg), name) != cases[i].is)
            fail_msg("'%s' against '%s': expected %d", cases[i].seg, name, cases[i].is);
    /* the segment is bounded by its length, not its NUL */
    assert_true(gw_http_segment_is("org%2Fmodel-1/rest", 13, name));
    assert_false(gw_http_segment_is("org%2F", 5, "org/"));
    assert_true(gw_http_segment_is("", 0, ""));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_get_whole, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_post_echo, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_body_too_large, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_streaming, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_sized_stream, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_big_response, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_many_streams, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_stalled_reader, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_paused_read_resumes, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_unix_socket, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_listen_errors, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_client_reset, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_slow_reader, setup_small, harness_teardown),
        cmocka_unit_test_setup_teardown(test_rejects, setup_small, harness_teardown),
        cmocka_unit_test_setup_teardown(test_free_closes_streams, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_eof_closes_streams, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_idle_timeout, setup_idle, harness_teardown),
        cmocka_unit_test_setup_teardown(test_drain, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_drain_linger, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_made_you_reset, setup_few_streams, harness_teardown),
        cmocka_unit_test_setup_teardown(test_body_timeout, setup_stream_bounds, harness_teardown),
        cmocka_unit_test_setup_teardown(test_empty_data_not_progress, setup_stream_bounds, harness_teardown),
        cmocka_unit_test_setup_teardown(test_answered_trailers_bounded, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_answered_body_bounded, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_answered_body_window_shut, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_window_held, setup_stream_bounds, harness_teardown),
        cmocka_unit_test_setup_teardown(test_header_block_timeout, setup_header_block, harness_teardown),
        cmocka_unit_test_setup_teardown(test_conn_body_bound, setup_conn_body, harness_teardown),
        cmocka_unit_test_setup_teardown(test_conn_body_held, setup_conn_body, harness_teardown),
        cmocka_unit_test(test_segment_is),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
