/* Conformance of the HTTP/2 server (gateway/http/http2*.c) to RFC 9113 where
 * a client breaks it: frames on closed streams (5.1), stream ids that go
 * down (5.1.1), PRIORITY that depends on itself (5.3.1) or comes on stream
 * 0 (6.3), and the floods the server answers with ENHANCE_YOUR_CALM (rapid
 * reset, a header block decoding past twice max_header_list); also the
 * bound on the closed streams it remembers, header-timeout cuts reported
 * to the application (on_refused), and the bounds on the response bytes
 * held for slow readers per connection and per server (max_conn_buffer,
 * max_buffer), with the producers paused rather than cut.
 *
 * The client is raw bytes on a socket: frames no client library sends.
 * What the server answers is read frame by frame (GOAWAY and RST_STREAM
 * codes, the end of responses); HPACK blocks are built from the static
 * table. The server runs on the test's loop (http_harness.h); every wait
 * is bounded by WAIT_MS. */
#include "http_harness.h"

#include <netinet/tcp.h>

#include <nghttp2/nghttp2.h>

enum { F_DATA = 0, F_HEADERS = 1, F_PRIORITY = 2, F_RST = 3, F_SETTINGS = 4, F_GOAWAY = 7, F_CONT = 9 };
enum { FL_END_STREAM = 1, FL_ACK = 1, FL_END_HEADERS = 4, FL_PRIORITY = 0x20 };

/* What the server sent on a raw connection. */
typedef struct rawc {
    tsrv *t;
    int fd;
    uint8_t in[1 << 16];
    size_t in_len;
    bool eof;
    bool goaway;
    uint32_t goaway_err;
    int32_t last_id; /* the GOAWAY's last stream id */
    int n_rst;
    int32_t rst_id;
    uint32_t rst_err;
    int n_ended; /* responses whose END_STREAM came */
} rawc;

/* on_refused's reports */
static int refused_status[64], n_refused;

static void on_refused(void *ud, int status, const char *method, const char *path, const char *protocol)
{
    if (n_refused < 64)
        refused_status[n_refused] = status;
    n_refused++;
}

static tsrv *start(const gw_http_limits *lim)
{
    tsrv *t = calloc(1, sizeof(*t));
    assert_non_null(t);
    loop_open(t, "infergate-h2rfc");
    gw_http_handler h = {
        .on_request = on_request, .on_close = on_close, .on_writable = on_writable, .on_refused = on_refused};
    t->srv = gw_http_server_new(t->base, lim, &h, t);
    assert_non_null(t->srv);
    t->lim = t->srv->limits;
    t->scheme = "http";
    char err[256] = "";
    if (gw_http_server_listen(t->srv, "tcp:127.0.0.1:0", err, sizeof(err)))
        fail_msg("listen: %s", err);
    t->port = gw_http_server_port(t->srv);
    n_refused = 0;
    return t;
}

HARNESS_SETUP(setup, start, .max_concurrent_streams = 100)
HARNESS_SETUP(setup_header_timeout, start, .header_timeout_ms = 200, .idle_timeout_ms = 60000)
HARNESS_SETUP(setup_buffers, start, .max_stream_buffer = 128 << 10, .max_conn_buffer = 256 << 10,
              .max_buffer = 320 << 10)
HARNESS_SETUP(setup_min_read_rate, start, .max_stream_buffer = 128 << 10, .max_conn_buffer = 256 << 10,
              .max_buffer = 1 << 20, .idle_timeout_ms = 1000, .min_read_rate = 1 << 20)

static void put_frame(uint8_t *b, size_t len, int type, int flags, int32_t id)
{
    b[0] = (uint8_t)(len >> 16), b[1] = (uint8_t)(len >> 8), b[2] = (uint8_t)len;
    b[3] = (uint8_t)type, b[4] = (uint8_t)flags;
    b[5] = (uint8_t)((uint32_t)id >> 24), b[6] = (uint8_t)(id >> 16), b[7] = (uint8_t)(id >> 8), b[8] = (uint8_t)id;
}

static void rc_send(rawc *c, const void *p, size_t n)
{
    assert_int_equal(send(c->fd, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

static void send_frame(rawc *c, int type, int flags, int32_t id, const void *payload, size_t len)
{
    uint8_t b[9 + 4096];
    assert_true(len <= 4096);
    put_frame(b, len, type, flags, id);
    if (len)
        memcpy(b + 9, payload, len);
    rc_send(c, b, 9 + len);
}

/* GET /hello or any path from the static table's :path "/" with a literal
 * :path: the header block of a request. */
static size_t request_block(uint8_t *b, const char *path)
{
    size_t n = 0;
    b[n++] = 0x82; /* :method GET */
    b[n++] = 0x86; /* :scheme http */
    b[n++] = 0x04; /* :path, literal without indexing */
    b[n++] = (uint8_t)strlen(path);
    memcpy(b + n, path, strlen(path));
    n += strlen(path);
    b[n++] = 0x01; /* :authority, literal without indexing */
    b[n++] = 9;
    memcpy(b + n, "127.0.0.1", 9);
    return n + 9;
}

static void send_request(rawc *c, int32_t id, const char *path, int flags)
{
    uint8_t b[256];
    size_t n = request_block(b, path);
    send_frame(c, F_HEADERS, FL_END_HEADERS | flags, id, b, n);
}

/* Takes the frames the server sent so far. */
static void raw_read(rawc *c)
{
    for (;;) {
        ssize_t n = recv(c->fd, c->in + c->in_len, sizeof(c->in) - c->in_len, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
            c->eof = true;
            break;
        }
        if (n < 0)
            break;
        c->in_len += (size_t)n;
        size_t off = 0;
        while (c->in_len - off >= 9) {
            const uint8_t *h = c->in + off;
            size_t len = (size_t)h[0] << 16 | (size_t)h[1] << 8 | h[2];
            if (c->in_len - off < 9 + len)
                break;
            int32_t id = (int32_t)(((uint32_t)h[5] << 24 | (uint32_t)h[6] << 16 | (uint32_t)h[7] << 8 | h[8]) &
                                   0x7fffffff);
            const uint8_t *p = h + 9;
            if (h[3] == F_SETTINGS && !(h[4] & FL_ACK))
                send_frame(c, F_SETTINGS, FL_ACK, 0, NULL, 0);
            else if (h[3] == F_GOAWAY && len >= 8) {
                c->goaway = true;
                c->last_id = (int32_t)(((uint32_t)p[0] << 24 | p[1] << 16 | p[2] << 8 | p[3]) & 0x7fffffff);
                c->goaway_err = (uint32_t)p[4] << 24 | p[5] << 16 | p[6] << 8 | p[7];
            } else if (h[3] == F_RST && len == 4) {
                c->n_rst++;
                c->rst_id = id;
                c->rst_err = (uint32_t)p[0] << 24 | p[1] << 16 | p[2] << 8 | p[3];
            } else if ((h[3] == F_DATA || h[3] == F_HEADERS) && (h[4] & FL_END_STREAM))
                c->n_ended++;
            off += 9 + len;
        }
        memmove(c->in, c->in + off, c->in_len - off);
        c->in_len -= off;
    }
}

static rawc *raw_open_window(tsrv *t, int32_t window);

static rawc *raw_open(tsrv *t)
{
    return raw_open_window(t, -1);
}

/* A raw client connected, nothing sent yet. */
static rawc *raw_new(tsrv *t)
{
    rawc *c = calloc(1, sizeof(*c));
    assert_non_null(c);
    c->t = t;
    c->fd = raw_connect(t, 0);
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return c;
}

/* With SETTINGS_INITIAL_WINDOW_SIZE `window` (-1: none sent). */
static rawc *raw_open_window(tsrv *t, int32_t window)
{
    rawc *c = raw_new(t);
    rc_send(c, NGHTTP2_CLIENT_MAGIC, NGHTTP2_CLIENT_MAGIC_LEN);
    const uint8_t iw[6] = {0, 4, (uint8_t)(window >> 24), (uint8_t)(window >> 16), (uint8_t)(window >> 8),
                           (uint8_t)window};
    send_frame(c, F_SETTINGS, 0, 0, iw, window < 0 ? 0 : 6);
    return c;
}

static void raw_close(rawc *c)
{
    close(c->fd);
    free(c);
}

static bool got_goaway(tsrv *t, void *arg)
{
    rawc *c = arg;
    raw_read(c);
    return c->goaway || c->eof;
}

static bool got_rst(tsrv *t, void *arg)
{
    rawc *c = arg;
    raw_read(c);
    return c->n_rst > 0 || c->goaway || c->eof;
}

static int want_ended;
static bool got_ended(tsrv *t, void *arg)
{
    rawc *c = arg;
    raw_read(c);
    return c->n_ended >= want_ended || c->goaway || c->eof;
}

/* A stream error of `code` on `id`, or a connection error of that code
 * (RFC 9113 5.4.1: an endpoint may treat a stream error as one). */
static void expect_error(tsrv *t, rawc *c, int32_t id, uint32_t code)
{
    assert_true(run_until(t, got_rst, c));
    if (c->goaway) {
        assert_int_equal(c->goaway_err, code);
    } else {
        assert_false(c->eof);
        assert_int_equal(c->rst_id, id);
        assert_int_equal(c->rst_err, code);
    }
}

static void expect_conn_error(tsrv *t, rawc *c, uint32_t code)
{
    assert_true(run_until(t, got_goaway, c));
    assert_true(c->goaway);
    assert_int_equal(c->goaway_err, code);
}

/* One whole request on stream `id`, its answer read. */
static void request_answered(tsrv *t, rawc *c, int32_t id)
{
    send_request(c, id, "/hello", FL_END_STREAM);
    want_ended = c->n_ended + 1;
    assert_true(run_until(t, got_ended, c));
    assert_false(c->goaway);
}

/* ---- 5.1: frames on closed streams ---- */

/* DATA on a stream closed by both ends' END_STREAM: STREAM_CLOSED. */
static void test_data_on_closed_stream(void **state)
{
    tsrv *t = *state;
    rawc *c = raw_open(t);
    request_answered(t, c, 1);
    send_frame(c, F_DATA, 0, 1, "xyz", 3);
    expect_error(t, c, 1, NGHTTP2_STREAM_CLOSED);
    raw_close(c);
}

/* HEADERS on a closed stream: STREAM_CLOSED. */
static void test_headers_on_closed_stream(void **state)
{
    tsrv *t = *state;
    rawc *c = raw_open(t);
    request_answered(t, c, 1);
    send_request(c, 1, "/hello", FL_END_STREAM);
    expect_error(t, c, 1, NGHTTP2_STREAM_CLOSED);
    raw_close(c);
}

/* DATA after the client's own RST_STREAM (5.1 "closed": any frame but
 * PRIORITY after RST_STREAM is a STREAM_CLOSED error). */
static void test_data_after_client_reset(void **state)
{
    tsrv *t = *state;
    rawc *c = raw_open(t);
    send_request(c, 1, "/hang", 0);
    const uint8_t cancel[4] = {0, 0, 0, NGHTTP2_CANCEL};
    send_frame(c, F_RST, 0, 1, cancel, 4);
    send_frame(c, F_DATA, 0, 1, "xyz", 3);
    expect_error(t, c, 1, NGHTTP2_STREAM_CLOSED);
    raw_close(c);
}

/* DATA on a half-closed (remote) stream, whose answer is still to come:
 * a stream error STREAM_CLOSED (5.1), the connection going on. */
static void test_data_on_half_closed(void **state)
{
    tsrv *t = *state;
    rawc *c = raw_open(t);
    send_request(c, 1, "/hang", FL_END_STREAM);
    send_frame(c, F_DATA, 0, 1, "xyz", 3);
    expect_error(t, c, 1, NGHTTP2_STREAM_CLOSED);
    raw_close(c);
}

/* The closed streams remembered for this are bounded: after many, the
 * oldest are forgotten (frames on them are then ignored, or taken for a
 * stream id that went down), the latest still known as closed. */
static void test_closed_streams_bounded(void **state)
{
    tsrv *t = *state;
    rawc *c = raw_open(t);
    int32_t id = 1;
    for (int i = 0; i < 600; i++, id += 2) {
        send_request(c, id, "/tiny", FL_END_STREAM);
        if (i % 50 == 49) { /* within max_concurrent_streams */
            want_ended = i + 1;
            assert_true(run_until(t, got_ended, c));
        }
    }
    want_ended = 600;
    assert_true(run_until(t, got_ended, c));
    assert_false(c->goaway);
    nghttp2_session *ngh = t->srv->conns->ngh;
    int kept = 0;
    for (int32_t i = 1; i < id; i += 2)
        kept += nghttp2_session_find_stream(ngh, i) != NULL;
    assert_true(kept <= (int)t->lim.max_concurrent_streams);
    assert_null(nghttp2_session_find_stream(ngh, 1));
    nghttp2_stream *last = nghttp2_session_find_stream(ngh, id - 2);
    assert_non_null(last);
    assert_int_equal(nghttp2_stream_get_state(last), NGHTTP2_STREAM_STATE_CLOSED);
    raw_close(c);
}

/* ---- 5.1.1: stream identifiers ---- */

/* A new stream whose id is lower than one the client opened: PROTOCOL_ERROR. */
static void test_stream_id_goes_down(void **state)
{
    tsrv *t = *state;
    rawc *c = raw_open(t);
    send_request(c, 5, "/hang", FL_END_STREAM);
    send_request(c, 3, "/hello", FL_END_STREAM);
    expect_conn_error(t, c, NGHTTP2_PROTOCOL_ERROR);
    raw_close(c);
}

/* An even id (the server's) from a client: PROTOCOL_ERROR. */
static void test_even_stream_id(void **state)
{
    tsrv *t = *state;
    rawc *c = raw_open(t);
    send_request(c, 2, "/hello", FL_END_STREAM);
    expect_conn_error(t, c, NGHTTP2_PROTOCOL_ERROR);
    raw_close(c);
}

/* ---- 5.3.1, 6.3: PRIORITY ---- */

static void priority_payload(uint8_t p[5], int32_t dep)
{
    p[0] = (uint8_t)((uint32_t)dep >> 24), p[1] = (uint8_t)(dep >> 16), p[2] = (uint8_t)(dep >> 8);
    p[3] = (uint8_t)dep, p[4] = 15;
}

/* A PRIORITY frame whose stream depends on itself: PROTOCOL_ERROR. */
static void test_priority_on_itself(void **state)
{
    tsrv *t = *state;
    rawc *c = raw_open(t);
    request_answered(t, c, 1); /* the client's SETTINGS are in */
    uint8_t p[5];
    priority_payload(p, 3);
    send_frame(c, F_PRIORITY, 0, 3, p, 5);
    expect_error(t, c, 3, NGHTTP2_PROTOCOL_ERROR);
    raw_close(c);
}

/* A HEADERS frame whose priority makes its stream depend on itself. */
static void test_headers_priority_on_itself(void **state)
{
    tsrv *t = *state;
    rawc *c = raw_open(t);
    request_answered(t, c, 1);
    uint8_t b[256];
    priority_payload(b, 3);
    size_t n = 5 + request_block(b + 5, "/hello");
    send_frame(c, F_HEADERS, FL_END_HEADERS | FL_END_STREAM | FL_PRIORITY, 3, b, n);
    expect_error(t, c, 3, NGHTTP2_PROTOCOL_ERROR);
    raw_close(c);
}

/* PRIORITY on stream 0: a connection error PROTOCOL_ERROR. */
static void test_priority_on_stream_0(void **state)
{
    tsrv *t = *state;
    rawc *c = raw_open(t);
    request_answered(t, c, 1);
    uint8_t p[5];
    priority_payload(p, 1);
    send_frame(c, F_PRIORITY, 0, 0, p, 5);
    expect_conn_error(t, c, NGHTTP2_PROTOCOL_ERROR);
    raw_close(c);
}

/* PRIORITY of a length other than 5: a stream error FRAME_SIZE_ERROR. */
static void test_priority_bad_length(void **state)
{
    tsrv *t = *state;
    rawc *c = raw_open(t);
    request_answered(t, c, 1);
    uint8_t p[6] = {0};
    send_frame(c, F_PRIORITY, 0, 3, p, 6);
    expect_error(t, c, 3, NGHTTP2_FRAME_SIZE_ERROR);
    raw_close(c);
}

/* ---- floods: ENHANCE_YOUR_CALM ---- */

/* Rapid reset (CVE-2023-44487): streams opened and reset at once, faster
 * than any client cancels, get GOAWAY ENHANCE_YOUR_CALM; the application
 * counts the cut (on_refused). */
static void test_rapid_reset(void **state)
{
    tsrv *t = *state;
    rawc *c = raw_open(t);
    const uint8_t cancel[4] = {0, 0, 0, NGHTTP2_CANCEL};
    uint8_t b[256];
    size_t n = request_block(b, "/hang");
    int32_t id = 1;
    for (int i = 0; i < 1500 && !c->goaway && !c->eof; i++, id += 2) {
        send_frame(c, F_HEADERS, FL_END_HEADERS, id, b, n);
        send_frame(c, F_RST, 0, id, cancel, 4);
        if (i % 100 == 99)
            run_for(t, 1), raw_read(c);
    }
    expect_conn_error(t, c, NGHTTP2_ENHANCE_YOUR_CALM);
    run_for(t, 20);
    assert_true(n_refused >= 1);
    assert_int_equal(refused_status[0], GW_HTTP_CUT_CALM);
    raw_close(c);
}

/* An HPACK bomb: one large field put in the dynamic table, then a block of
 * one-byte references to it that decodes to far more than
 * max_header_list: GOAWAY ENHANCE_YOUR_CALM, not a stream reset. */
static void test_hpack_bomb(void **state)
{
    tsrv *t = *state;
    rawc *c = raw_open(t);
    static uint8_t b[4096];
    size_t n = request_block(b, "/hello");
    /* literal with incremental indexing, new name "x-bomb", a 3000-byte value */
    b[n++] = 0x40;
    b[n++] = 6;
    memcpy(b + n, "x-bomb", 6);
    n += 6;
    b[n++] = 0x7f; /* 7-bit prefix full: 127 + varint */
    size_t vlen = 3000, rest = vlen - 127;
    b[n++] = (uint8_t)(0x80 | (rest & 0x7f));
    b[n++] = (uint8_t)(rest >> 7);
    memset(b + n, 'a', vlen);
    n += vlen;
    send_frame(c, F_HEADERS, 0, 1, b, n);
    /* CONTINUATIONs of 0xbe (dynamic index 62): 3 KB of headers a byte */
    memset(b, 0xbe, 4000);
    for (int i = 0; i < 40 && !c->goaway && !c->eof; i++) {
        send_frame(c, F_CONT, i == 39 ? FL_END_HEADERS : 0, 1, b, 4000);
        raw_read(c);
    }
    expect_conn_error(t, c, NGHTTP2_ENHANCE_YOUR_CALM);
    run_for(t, 20);
    assert_true(n_refused >= 1);
    assert_int_equal(refused_status[n_refused - 1], GW_HTTP_CUT_CALM);
    assert_int_equal(t->n_request, 0);
    raw_close(c);
}

/* ---- response bytes held for slow readers ---- */

static int want_requests;
static bool requests_in(tsrv *t, void *arg)
{
    return t->n_request >= want_requests;
}

/* A connection with windows of 0 and six /paced requests on it, run until
 * the server has had `requests` in all, and a little after. */
static rawc *open_paced(tsrv *t, int requests)
{
    rawc *c = raw_open_window(t, 0);
    for (int i = 0; i < 6; i++)
        send_request(c, 1 + 2 * i, "/paced", FL_END_STREAM);
    want_requests = requests;
    assert_true(run_until(t, requests_in, NULL));
    run_for(t, 100);
    return c;
}

/* Two connections whose client opens no window, each with six /paced
 * streams (8 MiB each, written while not gw_http_full): what the server
 * holds stays within max_conn_buffer per connection and max_buffer in
 * all, no stream is cut (the producers pause), and once the windows open
 * every stream completes, those of the connection the server's bound
 * held back from the start included (they never wrote: only the sweep
 * when the server's count falls to half tells them to go on). */
static void test_held_bytes_bounded(void **state)
{
    tsrv *t = *state;
    rawc *c[2];
    for (int k = 0; k < 2; k++) {
        c[k] = open_paced(t, 6 * (k + 1));
    }
    const gw_http_limits *lim = &t->lim;
    assert_true(t->srv->h2_out_held <= lim->max_buffer);
    for (gw_http_conn *sc = t->srv->conns; sc; sc = sc->next)
        assert_true(sc->h2_out_held <= lim->max_conn_buffer);
    assert_true(t->srv->h2_out_held > lim->max_buffer / 2);
    assert_int_equal(t->n_close, 0);
    for (int k = 0; k < 2; k++) {
        const uint8_t iw[6] = {0, 4, 0x7f, 0xff, 0xff, 0xff};
        const uint8_t wu[4] = {0x7f, 0xff - 1, 0xff, 0xff};
        send_frame(c[k], F_SETTINGS, 0, 0, iw, 6);
        send_frame(c[k], 8 /* WINDOW_UPDATE */, 0, 0, wu, 4);
    }
    for (int k = 0; k < 2; k++) {
        want_ended = 6;
        assert_true(run_until(t, got_ended, c[k]));
        assert_false(c[k]->goaway);
    }
    int twelve = 12;
    assert_true(run_until(t, closes_reach, &twelve));
    assert_int_equal(t->n_finished, 12);
    assert_int_equal(t->srv->h2_out_held, 0);
    raw_close(c[0]);
    raw_close(c[1]);
}

/* A connection that holds half its bound and reads a few bytes at a time
 * (every stream's timer kept going) is closed once it has read below
 * min_read_rate for idle_timeout_ms: GOAWAY ENHANCE_YOUR_CALM, reported as
 * GW_HTTP_CUT_SLOW. One holding the same bytes that reads them at once is
 * not. */
static void test_min_read_rate(void **state)
{
    tsrv *t = *state;
    rawc *c[2];
    for (int k = 0; k < 2; k++) {
        c[k] = open_paced(t, 6 * (k + 1));
        assert_true(gw_conn_full(t->srv->conns));
        if (k == 1)
            break;
        /* c[0]: 16 bytes of window on stream 1 every 50 ms, for 4 s at most */
        const uint8_t wu[4] = {0, 0, 0, 16};
        for (int n = 0; n < 80 && !c[0]->goaway && !c[0]->eof; n++) {
            send_frame(c[0], 8 /* WINDOW_UPDATE */, 0, 1, wu, 4);
            run_for(t, 50);
            raw_read(c[0]);
        }
        assert_true(run_until(t, got_goaway, c[0]));
        assert_true(c[0]->goaway);
        assert_int_equal(c[0]->goaway_err, NGHTTP2_ENHANCE_YOUR_CALM);
        assert_int_equal(n_refused, 1);
        assert_int_equal(refused_status[0], GW_HTTP_CUT_SLOW);
    }
    /* c[1]: the same bytes held, the windows then opened wide: every answer whole */
    const uint8_t iw[6] = {0, 4, 0x7f, 0xff, 0xff, 0xff};
    const uint8_t big[4] = {0x7f, 0xff - 1, 0xff, 0xff};
    send_frame(c[1], F_SETTINGS, 0, 0, iw, 6);
    send_frame(c[1], 8 /* WINDOW_UPDATE */, 0, 0, big, 4);
    want_ended = 6;
    assert_true(run_until(t, got_ended, c[1]));
    assert_false(c[1]->goaway);
    assert_int_equal(n_refused, 1);
    raw_close(c[0]);
    raw_close(c[1]);
}

/* ---- header timeout ---- */

static bool refused_reach(tsrv *t, void *arg)
{
    return n_refused >= *(int *)arg;
}

/* A header block left open past header_timeout_ms: the connection is cut,
 * and the application hears of it (counted, logged). */
static void test_header_block_timeout_reported(void **state)
{
    tsrv *t = *state;
    rawc *c = raw_open(t);
    uint8_t b[256];
    size_t n = request_block(b, "/hello");
    send_frame(c, F_HEADERS, 0, 1, b, n); /* no END_HEADERS, no CONTINUATION */
    int one = 1;
    assert_true(run_until(t, refused_reach, &one));
    assert_int_equal(refused_status[0], GW_HTTP_CUT_HEADER_TIMEOUT);
    raw_close(c);
}

/* No frame after the preface within header_timeout_ms: reported too. */
static void test_preface_timeout_reported(void **state)
{
    tsrv *t = *state;
    rawc *c = raw_new(t);
    rc_send(c, NGHTTP2_CLIENT_MAGIC, NGHTTP2_CLIENT_MAGIC_LEN); /* and no SETTINGS */
    int one = 1;
    assert_true(run_until(t, refused_reach, &one));
    assert_int_equal(refused_status[0], GW_HTTP_CUT_HEADER_TIMEOUT);
    raw_close(c);
}

/* An HTTP/1.1 request head left incomplete: reported as well. */
static void test_h1_head_timeout_reported(void **state)
{
    tsrv *t = *state;
    rawc *c = raw_new(t);
    const char *head = "GET /hello HTTP/1.1\r\nHost: x\r\n";
    rc_send(c, head, strlen(head));
    int one = 1;
    assert_true(run_until(t, refused_reach, &one));
    assert_int_equal(refused_status[0], GW_HTTP_CUT_HEADER_TIMEOUT);
    raw_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_data_on_closed_stream, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_headers_on_closed_stream, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_data_after_client_reset, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_data_on_half_closed, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_closed_streams_bounded, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_stream_id_goes_down, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_even_stream_id, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_priority_on_itself, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_headers_priority_on_itself, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_priority_on_stream_0, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_priority_bad_length, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_rapid_reset, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_hpack_bomb, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_header_block_timeout_reported, setup_header_timeout,
                                        harness_teardown),
        cmocka_unit_test_setup_teardown(test_preface_timeout_reported, setup_header_timeout, harness_teardown),
        cmocka_unit_test_setup_teardown(test_h1_head_timeout_reported, setup_header_timeout, harness_teardown),
        cmocka_unit_test_setup_teardown(test_held_bytes_bounded, setup_buffers, harness_teardown),
        cmocka_unit_test_setup_teardown(test_min_read_rate, setup_min_read_rate, harness_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
