/* HTTP/2 server sessions: one nghttp2 server session per connection on a
 * libevent bufferevent, over cleartext (prior knowledge) or TLS with ALPN
 * h2. The wiring of nghttp2's examples/libevent-server.c, with h2o's
 * discipline on top: a soft maximum on the output buffer, deferred close,
 * streams whose on_close runs outside nghttp2. This file holds the
 * connection (its I/O, timer, drain and end), the responses and the
 * application's side of a stream; the requests, their bounds and the
 * server's refusals are http2_request.c's. See
 * gateway/http/http_internal.h for ownership and the rules on which calls
 * may happen where. */
#include "gateway/http/http_internal.h"
#include "gateway/base/clock.h"
#include "gateway/base/mem.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

/* Receive windows for request bodies, at most (max_body, max_conn_body
 * bound them further). */
#define H2_STREAM_WINDOW ((size_t)1 << 20)
#define H2_CONN_WINDOW ((size_t)16 << 20)

/* ---- responses ---- */

/* Response bytes a stream's `out` took (n > 0) or gave back (n < 0), on
 * its connection's and the server's counts (max_conn_buffer, max_buffer).
 * When the connection is no longer full, or the server's count falls to
 * half its bound, the full streams they held back may go on
 * (conn_notify_writable). */
static void held_add(gw_http_stream *s, ptrdiff_t n)
{
    gw_http_conn *c = s->conn;
    if (gw_conn_held_add(c, n))
        c->h2_sweep_due = c->writable_due = true;
    if (c->srv->h2_sweep_due)
        c->writable_due = true; /* swept by conn_notify_writable, or the server's event if first */
}

/* n response bytes went out (the client's window let them). A connection
 * holding half its bound must move min_read_rate bytes a second, over each
 * idle_timeout_ms it holds it; one that trickles keeps every stream's
 * timer going, and the memory for as long as it likes. Cut from
 * conn_settle, outside nghttp2. */
static void slow_read_check(gw_http_conn *c, size_t n)
{
    const gw_http_limits *l = &c->srv->limits;
    if (!l->min_read_rate || c->goaway || c->h2_slow_cut)
        return;
    if (!gw_conn_full(c)) {
        c->h2_slow_since_ms = 0;
        return;
    }
    const int64_t now = gw_mono_coarse_ms();
    if (!c->h2_slow_since_ms) {
        c->h2_slow_since_ms = now;
        c->h2_slow_read = 0;
        return;
    }
    c->h2_slow_read += n;
    const int64_t ms = now - c->h2_slow_since_ms;
    if (ms < l->idle_timeout_ms)
        return;
    if ((double)c->h2_slow_read * 1000.0 < (double)l->min_read_rate * (double)ms) {
        c->h2_slow_cut = true;
        return;
    }
    c->h2_slow_since_ms = now;
    c->h2_slow_read = 0;
}

static void slow_read_cut(gw_http_conn *c)
{
    c->h2_slow_cut = false;
    fprintf(stderr,
            "http2: a connection holding %zu response bytes read %zu in %.1f s, below min_read_rate (%zu bytes "
            "a second): closed (ENHANCE_YOUR_CALM)\n",
            c->h2_out_held, c->h2_slow_read, (double)(gw_mono_coarse_ms() - c->h2_slow_since_ms) / 1e3,
            c->srv->limits.min_read_rate);
    c->goaway = true;
    gw_server_refused(c->srv, GW_HTTP_CUT_SLOW, NULL, "HTTP/2");
    if (nghttp2_session_terminate_session(c->ngh, NGHTTP2_ENHANCE_YOUR_CALM))
        c->broken = true;
    gw_conn_set_timer(c, GW_HTTP_LINGER_MS); /* for the GOAWAY to go out */
}

/* The stream's output is dropped (closed, or its connection going). */
static void held_drop(gw_http_stream *s)
{
    if (s->out && evbuffer_get_length(s->out))
        held_add(s, -(ptrdiff_t)evbuffer_get_length(s->out));
}

/* The trailer fields gw_http_end_trailers gave, as the HEADERS frame that
 * ends the stream (nghttp2 copies them). 0, or nghttp2's error: the
 * stream then ends on its last DATA, without them. */
static int submit_trailers(gw_http_stream *s)
{
    nghttp2_nv nv[GW_HTTP_MAX_TRAILERS];
    for (size_t i = 0; i < s->n_trailers; i++) {
        const char *name = s->trailers[2 * i], *value = s->trailers[2 * i + 1];
        /* never indexed: a trailer says what one response came to */
        nv[i] = (nghttp2_nv){(uint8_t *)name, (uint8_t *)value, strlen(name), strlen(value),
                             NGHTTP2_NV_FLAG_NO_INDEX};
    }
    return nghttp2_submit_trailer(s->conn->ngh, s->id, nv, s->n_trailers);
}

static ssize_t data_read_cb(nghttp2_session *ngh, int32_t id, uint8_t *buf, size_t len, uint32_t *flags,
                            nghttp2_data_source *src, void *ud)
{
    gw_http_stream *s = src->ptr;
    size_t have = s->out ? evbuffer_get_length(s->out) : 0;
    if (have == 0 && !s->resp_ended) {
        s->deferred = true;
        return NGHTTP2_ERR_DEFERRED;
    }
    size_t n = have < len ? have : len;
    if (n && evbuffer_remove(s->out, buf, n) != (int)n)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    if (n) {
        held_add(s, -(ptrdiff_t)n);
        slow_read_check(s->conn, n);
    }
    /* Output moved: what is left (held by the peer's window) gets a new
     * bound; with nothing left there is none. */
    if (n && have > n)
        gw_h2_stream_due_output(s);
    else if (n)
        s->due_ms = 0;
    if (s->resp_ended && n == have) {
        *flags |= NGHTTP2_DATA_FLAG_EOF;
        /* nghttp2 lets the read callback submit the trailers that end it */
        if (s->n_trailers && !submit_trailers(s))
            *flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
    }
    /* on_writable may not run inside nghttp2: conn_settle calls it. */
    if (s->above_half && !gw_http_full(s)) {
        s->above_half = false;
        s->writable_due = true;
        s->conn->writable_due = true;
    }
    return (ssize_t)n;
}

/* x-request-id is new on every response: in the HPACK dynamic table it
 * would only push out fields that repeat, and nghttp2 keeps the entries of
 * one name on one hash chain, which it walks on every response. */
static uint8_t hpack_flags(const char *name, size_t len)
{
    return len == 12 && !memcmp(name, "x-request-id", 12) ? NGHTTP2_NV_FLAG_NO_INDEX : NGHTTP2_NV_FLAG_NONE;
}

/* Framing and the date are the server's: the application's are not sent. */
static bool server_header(const char *name, size_t len)
{
    return (len == 4 && !strcasecmp(name, "date")) || (len == 14 && !strcasecmp(name, "content-length")) ||
           (len == 17 && !strcasecmp(name, "transfer-encoding"));
}

int gw_h2_submit_response(gw_http_stream *s, int status, const gw_http_header *headers, size_t n_headers,
                          const void *body, size_t body_len, bool whole, int64_t length)
{
    if (status < 100 || status > 999 || (n_headers && !headers) || (body_len && !body))
        return -EINVAL;
    if (!s->out && !(s->out = evbuffer_new()))
        return -ENOMEM;
    nghttp2_nv stack_nv[16], *nv = stack_nv;
    if (n_headers + 3 > sizeof(stack_nv) / sizeof(stack_nv[0])) {
        if (n_headers > SIZE_MAX / sizeof(*nv) - 3 || !(nv = malloc((n_headers + 3) * sizeof(*nv))))
            return -ENOMEM;
    }
    char st[4] = {(char)('0' + status / 100), (char)('0' + status / 10 % 10), (char)('0' + status % 10),
                  '\0'};
    const char *date = gw_http_date(s->conn->srv);
    size_t n_nv = 0;
    nv[n_nv++] = (nghttp2_nv){(uint8_t *)":status", (uint8_t *)st, 7, 3, NGHTTP2_NV_FLAG_NONE};
    nv[n_nv++] = (nghttp2_nv){(uint8_t *)"date", (uint8_t *)date, 4, strlen(date), NGHTTP2_NV_FLAG_NO_INDEX};
    /* The length where it is known (a HEAD response says the GET's), so
     * that a client can tell a cut body from a whole one. */
    bool no_content = status < 200 || status == 204 || status == 304;
    bool sized = !whole && length >= 0 && !no_content;
    char len_buf[24];
    if (!no_content && (whole || sized)) {
        int n = snprintf(len_buf, sizeof(len_buf), "%lld", whole ? (long long)body_len : (long long)length);
        nv[n_nv++] = (nghttp2_nv){(uint8_t *)"content-length", (uint8_t *)len_buf, 14, (size_t)n,
                                  NGHTTP2_NV_FLAG_NONE};
    }
    for (size_t i = 0; i < n_headers; i++) {
        size_t nlen = strlen(headers[i].name);
        if (server_header(headers[i].name, nlen))
            continue;
        nv[n_nv++] = (nghttp2_nv){(uint8_t *)headers[i].name, (uint8_t *)headers[i].value, nlen,
                                  strlen(headers[i].value), hpack_flags(headers[i].name, nlen)};
    }
    /* A HEAD response, 204 or 304 has no body (RFC 9110 9.3.2, 15.3.5,
     * 15.4.5): DATA after it is a protocol error to the client. */
    s->bodiless = s->head || no_content;
    if (s->bodiless)
        body_len = 0;
    int rc = -ENOMEM;
    if (body_len && evbuffer_add(s->out, body, body_len))
        goto out;
    held_add(s, (ptrdiff_t)body_len);
    nghttp2_data_provider dp = {.source.ptr = s, .read_callback = data_read_cb};
    s->resp_ended = whole;
    int rv = nghttp2_submit_response(s->conn->ngh, s->id, nv, n_nv, whole && !body_len ? NULL : &dp);
    if (rv) {
        evbuffer_drain(s->out, body_len);
        held_add(s, -(ptrdiff_t)body_len);
        s->resp_ended = false;
        rc = rv == NGHTTP2_ERR_NOMEM ? -ENOMEM : -EINVAL;
        goto out;
    }
    s->resp_started = true;
    s->sized = sized;
    s->resp_left = sized ? (uint64_t)length : 0;
    /* A body queued with the headers is output like any other: bounded
     * while the peer's window holds it. */
    if (body_len && !s->due_ms)
        gw_h2_stream_due_output(s);
    rc = 0;
out:
    if (nv != stack_nv)
        free(nv);
    return rc;
}

/* ---- the connection ---- */

/* Feeds everything read to nghttp2. 0, or -1 when the connection must go. */
static int conn_recv(gw_http_conn *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    while (evbuffer_get_length(in) > 0) {
        struct evbuffer_iovec v;
        if (evbuffer_peek(in, -1, NULL, &v, 1) < 1)
            return -1;
        ssize_t rv = nghttp2_session_mem_recv(c->ngh, v.iov_base, v.iov_len);
        if (rv < 0)
            return -1;
        evbuffer_drain(in, (size_t)rv);
    }
    return 0;
}

/* Cleartext: writes the output to the socket now instead of waiting for
 * the loop to report it writable, which costs two epoll_ctl calls and a
 * loop turn per write. The bufferevent writes (EV_WRITE enabled) only what
 * the socket did not take. 0, or -1 when the connection must go. */
static int conn_flush(gw_http_conn *c)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);
    if (c->tls || evbuffer_get_length(out) == 0)
        return 0;
    /* The bufferevent keeps the front of its output frozen, and thaws it
     * itself only around its own writes. */
    evbuffer_unfreeze(out, 1);
    int n = evbuffer_write(out, bufferevent_getfd(c->bev));
    int e = errno;
    evbuffer_freeze(out, 1);
    if (n < 0 && e != EAGAIN && e != EWOULDBLOCK && e != EINTR)
        return -1;
    if (evbuffer_get_length(out) == 0)
        return bufferevent_disable(c->bev, EV_WRITE) ? -1 : 0;
    return bufferevent_enable(c->bev, EV_WRITE) ? -1 : 0;
}

/* Moves frames from nghttp2 to the output until it is above the soft
 * maximum; the write callback comes back for the rest. While the output is
 * that full the peer is not reading, so we stop reading too (h2o), and
 * read again once it is not. Both are decided here, whoever called: a
 * cleartext flush from an application's write (h2_on_send) can empty
 * the output itself, and then no write callback comes to do it. */
static int conn_send(gw_http_conn *c)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);
    /* what the socket takes now makes room for more frames */
    if (evbuffer_get_length(out) >= GW_HTTP_OUT_SOFT_MAX && conn_flush(c))
        return -1;
    while (evbuffer_get_length(out) < GW_HTTP_OUT_SOFT_MAX) {
        const uint8_t *data;
        ssize_t n = nghttp2_session_mem_send(c->ngh, &data);
        if (n < 0)
            return -1;
        if (n == 0)
            break;
        if (evbuffer_add(out, data, (size_t)n))
            return -1;
        if (evbuffer_get_length(out) >= GW_HTTP_OUT_SOFT_MAX && conn_flush(c))
            return -1;
    }
    if (conn_flush(c))
        return -1;
    bool full = evbuffer_get_length(out) >= GW_HTTP_OUT_SOFT_MAX;
    if (full && !c->read_paused && !c->lingering) {
        c->read_paused = true;
        bufferevent_disable(c->bev, EV_READ);
    } else if (!full && c->read_paused && !c->lingering) {
        c->read_paused = false;
        if (bufferevent_enable(c->bev, EV_READ))
            return -1;
    }
    return 0;
}

/* on_writable for the streams whose buffer fell while nghttp2 sent, and,
 * when the connection's or the server's held bytes fell to half their
 * bound, for every stream they held back (the server's: on every
 * connection). The handler cannot close or free streams (gw_http_* calls
 * only buffer), so the lists hold still under it. */
static void conn_notify_writable(gw_http_conn *c)
{
    if (!c->writable_due)
        return;
    c->writable_due = false;
    const bool sweep = c->h2_sweep_due;
    c->h2_sweep_due = false;
    for (gw_http_stream *s = c->streams; s; s = s->next) {
        if (s->writable_due) {
            /* Full again (a stream told before it wrote): told later. */
            s->writable_due = false;
            s->above_half = true;
            gw_stream_sweep(s);
        } else if (sweep) {
            gw_stream_sweep(s);
        }
    }
    gw_http_server *srv = c->srv;
    if (srv->h2_sweep_due) {
        srv->h2_sweep_due = false;
        for (gw_http_conn *o = srv->conns; o; o = o->next)
            for (gw_http_stream *s = o->dead ? NULL : o->streams; s; s = s->next)
                gw_stream_sweep(s);
    }
}

/* The end of every loop callback of a connection: on_close for the streams
 * nghttp2 closed, then the connection goes if it failed or if nghttp2 is
 * done with it and the output drained. */
static void conn_settle(gw_http_conn *c, int rc)
{
    if (rc || c->broken) {
        gw_conn_free(c);
        return;
    }
    gw_conn_flush_closed(c);
    conn_notify_writable(c);
    if (c->h2_slow_cut) {
        slow_read_cut(c);
        if (!c->broken && conn_send(c))
            c->broken = true;
    }
    if (c->broken) {
        gw_conn_free(c);
        return;
    }
    if (nghttp2_session_want_read(c->ngh) || nghttp2_session_want_write(c->ngh))
        return;
    /* nghttp2 is done. The output goes out, then our side is shut, and what
     * the peer still sends (WINDOW_UPDATEs for the data it reads, its own
     * GOAWAY) is read and dropped until it closes, for a bounded time, as
     * HTTP/1 does (h1_shut). Closed with that input unread, the kernel
     * resets the connection and drops what it had not sent yet: the end of
     * the last response, our GOAWAY. */
    if (!c->lingering) {
        c->lingering = true;
        c->read_paused = false;
        bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
        gw_conn_set_timer(c, GW_HTTP_LINGER_MS);
        if (c->broken || bufferevent_enable(c->bev, EV_READ)) {
            gw_conn_free(c);
            return;
        }
    }
    if (!c->h2_shut && evbuffer_get_length(bufferevent_get_output(c->bev)) == 0) {
        if (c->h2_peer_eof) { /* it has closed its side: nothing more to wait for */
            gw_conn_free(c);
            return;
        }
        c->h2_shut = true;
        if (c->tls)
            gw_tls_close_notify(c->bev);
        shutdown(bufferevent_getfd(c->bev), SHUT_WR);
    }
}

static void on_read(struct bufferevent *bev, void *arg)
{
    gw_http_conn *c = arg;
    if (c->lingering) { /* the peer's last frames: nothing more is read from them */
        struct evbuffer *in = bufferevent_get_input(bev);
        evbuffer_drain(in, evbuffer_get_length(in));
        return;
    }
    int rc = conn_recv(c);
    if (!rc)
        rc = conn_send(c);
    conn_settle(c, rc);
}

static void on_write(struct bufferevent *bev, void *arg)
{
    /* also stops the write event once the output drained, and reads again */
    conn_settle(arg, conn_send(arg));
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    gw_http_conn *c = arg;
    /* Lingering, the peer's end of its sending is no reason to drop what
     * is still going out to it: that goes, then the connection. */
    if (what == (BEV_EVENT_READING | BEV_EVENT_EOF) && c->lingering && !c->h2_shut &&
        evbuffer_get_length(bufferevent_get_output(bev)) > 0) {
        c->h2_peer_eof = true;
        bufferevent_disable(bev, EV_READ);
        return;
    }
    /* EOF, error, or no write progress for idle_timeout_ms: the peer is
     * gone or not reading, and its streams end unfinished. */
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT))
        gw_conn_free(c);
}

static void h2_on_send(gw_http_conn *c)
{
    conn_settle(c, conn_send(c));
}

static void h2_on_timer(gw_http_conn *c)
{
    if (c->lingering || c->goaway) {
        gw_conn_free(c);
        return;
    }
    if (c->n_streams > 0) {
        if (gw_h2_check_streams(c))
            gw_conn_free(c);
        else
            conn_settle(c, conn_send(c));
        return;
    }
    /* No frame after the preface in header_timeout_ms: a slowloris. */
    if (!c->h2_framed && !c->srv->draining)
        gw_server_refused(c->srv, GW_HTTP_CUT_HEADER_TIMEOUT, NULL, "HTTP/2");
    c->goaway = true;
    if (nghttp2_session_terminate_session(c->ngh, NGHTTP2_NO_ERROR)) {
        gw_conn_free(c);
        return;
    }
    /* Bound the wait for the GOAWAY to go out. */
    gw_conn_set_timer(c, GW_HTTP_LINGER_MS);
    conn_settle(c, conn_send(c));
}

/* A GOAWAY with the last stream nghttp2 took: the client opens no more
 * here (nghttp2 refuses any that cross it), the open ones finish, and the
 * idle timer, 0 while draining, then sends the final GOAWAY and closes.
 * Without it a client with a pooled connection (the gateway's to its
 * workers) kept sending, and a drain ran to its grace period. */
static void h2_drain(gw_http_conn *c)
{
    if (c->lingering || c->goaway || c->dead)
        return;
    if (nghttp2_submit_goaway(c->ngh, NGHTTP2_FLAG_NONE, nghttp2_session_get_last_proc_stream_id(c->ngh),
                              NGHTTP2_NO_ERROR, NULL, 0)) {
        gw_conn_free(c);
        return;
    }
    if (c->n_streams == 0)
        gw_conn_set_timer(c, 0);
    conn_settle(c, conn_send(c));
}

/* ---- the application's side: buffer and schedule only ---- */

static void stream_kick(gw_http_stream *s)
{
    if (s->deferred) {
        s->deferred = false;
        nghttp2_session_resume_data(s->conn->ngh, s->id);
    }
    gw_conn_schedule_send(s->conn);
}

static int h2_submit(gw_http_stream *s, int status, const gw_http_header *headers, size_t n_headers,
                     const void *body, size_t body_len, bool whole, int64_t length)
{
    int rc = gw_h2_submit_response(s, status, headers, n_headers, body, body_len, whole, length);
    if (!rc)
        gw_conn_schedule_send(s->conn);
    return rc;
}

static int h2_write(gw_http_stream *s, const void *data, size_t len)
{
    if (s->bodiless)
        return 0;
    if (evbuffer_add(s->out, data, len))
        return -ENOMEM;
    held_add(s, (ptrdiff_t)len);
    if (!s->due_ms)
        gw_h2_stream_due_output(s); /* until the output moves */
    stream_kick(s);
    return 0;
}

static int h2_end(gw_http_stream *s)
{
    s->resp_ended = true;
    if (!s->due_ms)
        gw_h2_stream_due_output(s); /* until END_STREAM goes */
    stream_kick(s);
    return 0;
}

void gw_h2_reset(gw_http_stream *s)
{
    s->reset = true;
    if (nghttp2_submit_rst_stream(s->conn->ngh, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_INTERNAL_ERROR))
        s->conn->broken = true; /* no memory for the frame: drop the connection, and the stream with it */
    gw_conn_schedule_send(s->conn);
}

static size_t h2_pending(const gw_http_stream *s)
{
    return s->out ? evbuffer_get_length(s->out) : 0;
}

/* Its streams' output leaves the server's count with it. */
static void h2_closing(gw_http_conn *c)
{
    for (gw_http_stream *s = c->streams; s; s = s->next)
        held_drop(s);
}

void gw_h2_stream_dropped(gw_http_stream *s)
{
    held_drop(s);
}

static const gw_http_proto h2_proto = {
    .on_send = h2_on_send,
    .on_timer = h2_on_timer,
    .drain = h2_drain,
    .set_bounds = gw_conn_nop, /* the limits are read as frames come; SETTINGS already went */
    .no_streams = gw_h2_arm_idle,
    .closing = h2_closing,
    .submit = h2_submit,
    .write = h2_write,
    .end = h2_end,
    .reset = gw_h2_reset,
    .pending = h2_pending,
};

void gw_h2_start(gw_http_conn *c)
{
    const gw_http_limits *lim = &c->srv->limits;
    c->proto = &h2_proto;
    /* Receive windows for request bodies: RFC 9113's 64 KiB for the whole
     * connection took a round trip per 64 KiB of every body on it, and a
     * peer region forwards all its requests here over one connection (128
     * KB prompts across an 80 ms link: ~6 a second). The body bounds
     * (max_body, max_conn_body) are kept as the DATA comes, not by the
     * windows; nghttp2 opens them again as it reads. */
    size_t stream_win = lim->max_body < H2_STREAM_WINDOW ? lim->max_body : H2_STREAM_WINDOW;
    size_t conn_win = lim->max_conn_body < H2_CONN_WINDOW ? lim->max_conn_body : H2_CONN_WINDOW;
    stream_win = stream_win < 65535 ? 65535 : stream_win;
    conn_win = conn_win < 65535 ? 65535 : conn_win;
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, lim->max_concurrent_streams},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE,
         lim->max_header_list > UINT32_MAX ? UINT32_MAX : (uint32_t)lim->max_header_list},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, (uint32_t)stream_win},
    };
    if (nghttp2_session_server_new3(&c->ngh, c->srv->cbs, c, c->srv->opt, gw_mem_nghttp2()) ||
        nghttp2_submit_settings(c->ngh, NGHTTP2_FLAG_NONE, iv, sizeof(iv) / sizeof(iv[0])) ||
        nghttp2_session_set_local_window_size(c->ngh, NGHTTP2_FLAG_NONE, 0, (int32_t)conn_win)) {
        gw_conn_free(c);
        return;
    }
    /* Its protocol became known after the drain began (in detection or
     * the TLS handshake then): no stream is taken here, as on every other
     * connection, and it closes once the GOAWAY is out. A review's client
     * opened six streams during a drain this way, each served. */
    const bool drain = c->srv->draining;
    if (drain && nghttp2_submit_goaway(c->ngh, NGHTTP2_FLAG_NONE, 0, NGHTTP2_NO_ERROR, NULL, 0)) {
        gw_conn_free(c);
        return;
    }
    bufferevent_setcb(c->bev, on_read, on_write, on_event, c);
    bufferevent_setwatermark(c->bev, EV_WRITE, GW_HTTP_OUT_LOW_WATER, 0);
    if (!c->tls && bufferevent_disable(c->bev, EV_WRITE)) { /* conn_flush writes */
        gw_conn_free(c);
        return;
    }
    /* header_timeout_ms (from accept, or the end of the TLS handshake)
     * until the client's first frame, then idle_timeout_ms. */
    /* The GOAWAY goes out before the first bytes are read: nghttp2 ignores
     * new streams only once it has sent it, and requests that came with
     * the preface would otherwise be dispatched, then refused. */
    if (drain && conn_send(c)) {
        gw_conn_free(c);
        return;
    }
    gw_conn_set_timer(c, drain ? 0 : lim->header_timeout_ms);
    on_read(c->bev, c); /* the preface and whatever came with it; our SETTINGS */
}

/* ---- the server's shared nghttp2 setup ---- */

int gw_h2_server_init(gw_http_server *srv)
{
    if (nghttp2_session_callbacks_new(&srv->cbs) || nghttp2_option_new(&srv->opt))
        return -ENOMEM;
    gw_h2_request_callbacks(srv->cbs);
    /* Closed streams are remembered (nghttp2 keeps as many as
     * SETTINGS_MAX_CONCURRENT_STREAMS, less the open ones, the oldest
     * going first), so that frames on them are the STREAM_CLOSED errors
     * RFC 9113 5.1 requires, not ignored; and RFC 7540 priorities are
     * not switched off (SETTINGS_NO_RFC7540_PRIORITIES), so that PRIORITY
     * frames are checked (5.3.1, 6.3: on stream 0, or depending on
     * themselves) rather than skipped unread. */
    /* Flood bounds (nghttp2's defaults, stated): queued SETTINGS/PING
     * ACKs, SETTINGS entries per frame, CONTINUATIONs per HEADERS, and the
     * RST_STREAM token bucket against rapid reset (CVE-2023-44487): twice
     * ours (conn_count_reset), which says ENHANCE_YOUR_CALM first. */
    nghttp2_option_set_max_outbound_ack(srv->opt, 1000);
    nghttp2_option_set_max_settings(srv->opt, 32);
    nghttp2_option_set_max_continuations(srv->opt, 8);
    nghttp2_option_set_stream_reset_rate_limit(srv->opt, 2000, 66);
    return 0;
}

void gw_h2_server_dispose(gw_http_server *srv)
{
    if (srv->opt)
        nghttp2_option_del(srv->opt);
    if (srv->cbs)
        nghttp2_session_callbacks_del(srv->cbs);
    srv->opt = NULL;
    srv->cbs = NULL;
}
