/* Connections of the upstream pool: a non-blocking connect (Unix or TCP),
 * TLS through an OpenSSL bufferevent when the target asks for it, and one
 * nghttp2 client session per connection (the wiring of nghttp2's
 * examples/libevent-client.c, with h2o's discipline on top: a soft maximum
 * on the output buffer, user callbacks and frees only from loop callbacks,
 * deferred close). Inbound flow control is the caller's: the stream window
 * opens again only as gw_upstream_consume acknowledges data.
 *
 * A connection counts as established once the peer's SETTINGS arrive; a
 * failure before that (refused, no socket file, TLS or ALPN failure, a
 * peer that closes at once) is GW_UP_CONNECT, after it GW_UP_RESET. So is
 * a peer that is not who the target names: a certificate without the
 * region's name ("tls:NAME@"), a Unix socket whose listener is not the
 * worker the supervisor started (SO_PEERCRED). */
#define _GNU_SOURCE /* struct ucred */
#include "gateway/upstream/upstream_internal.h"
#include "gateway/base/clock.h"
#include "gateway/base/mem.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

static void conn_settle(up_conn *c);

static gw_upstream_pool *pool_of(const up_conn *c)
{
    return c->target->pool;
}

static void conn_schedule_send(up_conn *c)
{
    if (!c->dead)
        event_active(c->send_ev, EV_WRITE, 0);
}

static void conn_arm_idle(up_conn *c)
{
    if (c->dead || c->lingering || c->draining || !c->established || c->n_reqs)
        return;
    int ms = pool_of(c)->opts.idle_close_ms;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    event_add(c->idle_ev, &tv);
}

size_t up_conn_limit(const up_conn *c)
{
    size_t lim = (size_t)pool_of(c)->opts.max_streams_per_conn;
    /* Before the peer's SETTINGS this is nghttp2's initial assumption (100). */
    uint32_t peer = nghttp2_session_get_remote_settings(c->ngh, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS);
    return peer < lim ? peer : lim;
}

bool up_conn_usable(const up_conn *c)
{
    return !c->dead && !c->draining && !c->fail && !c->lingering &&
           nghttp2_session_check_request_allowed(c->ngh);
}

/* ---- requests on a connection ---- */

void up_req_unlink(gw_upstream_req *r, int rst_code)
{
    gw_upstream_pool *p = r->pool;
    if (r->state == UP_RS_PENDING) {
        if (r->prev)
            r->prev->next = r->next;
        else
            p->pending = r->next;
        if (r->next)
            r->next->prev = r->prev;
        else
            p->pending_tail = r->prev;
    } else if (r->state == UP_RS_OPEN) {
        up_conn *c = r->conn;
        if (!c->dead) {
            /* nghttp2 forgets r (even for a request still queued in it);
             * the window its unread data took is the connection's again. */
            nghttp2_session_set_stream_user_data(c->ngh, r->stream_id, NULL);
            if (r->unconsumed)
                nghttp2_session_consume_connection(c->ngh, r->unconsumed);
            /* Without memory for the RST_STREAM the peer would work on:
             * the connection goes, from the send path, and the stream with it. */
            if (rst_code >= 0 &&
                nghttp2_submit_rst_stream(c->ngh, NGHTTP2_FLAG_NONE, r->stream_id, (uint32_t)rst_code))
                c->fail = GW_UP_NOMEM;
            conn_schedule_send(c);
        }
        if (r->prev)
            r->prev->next = r->next;
        else
            c->reqs = r->next;
        if (r->next)
            r->next->prev = r->prev;
        if (--c->n_reqs == 0)
            conn_arm_idle(c);
    }
    r->prev = r->next = NULL;
    r->conn = NULL;
    r->unconsumed = 0;
}

static void req_fail(gw_upstream_req *r, gw_upstream_error e, int rst_code)
{
    bool responded = r->responded;
    up_req_unlink(r, rst_code);
    up_req_retire(r);
    if (r->cbs.on_error)
        r->cbs.on_error(r->ud, e, responded);
}

static void req_end(up_conn *c, gw_upstream_req *r)
{
    /* A response may end before the request body went out (an early 413):
     * the rest of the body is not sent (RFC 9113 8.1). */
    int rst = nghttp2_session_get_stream_local_close(c->ngh, r->stream_id) == 0 ? NGHTTP2_NO_ERROR : -1;
    up_req_unlink(r, rst);
    up_req_retire(r);
    if (r->cbs.on_end)
        r->cbs.on_end(r->ud);
}

static ssize_t body_read_cb(nghttp2_session *ngh, int32_t id, uint8_t *buf, size_t len, uint32_t *flags,
                            nghttp2_data_source *src, void *ud)
{
    gw_upstream_req *r = nghttp2_session_get_stream_user_data(ngh, id);
    if (!r) /* cancelled or ended: its RST_STREAM is queued */
        return NGHTTP2_ERR_DEFERRED;
    size_t n = r->body_len - r->body_off;
    if (n > len)
        n = len;
    memcpy(buf, r->body + r->body_off, n);
    r->body_off += n;
    if (r->body_off == r->body_len)
        *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

int up_conn_submit(up_conn *c, gw_upstream_req *r)
{
    nghttp2_data_provider dp = {.read_callback = body_read_cb};
    int32_t id = nghttp2_submit_request(c->ngh, NULL, r->nv, r->n_nv, r->body_len ? &dp : NULL, r);
    if (id == NGHTTP2_ERR_STREAM_ID_NOT_AVAILABLE) {
        c->draining = true;
        return -EAGAIN;
    }
    if (id < 0)
        return -ENOMEM;
    r->stream_id = id;
    r->state = UP_RS_OPEN;
    r->conn = c;
    r->prev = NULL;
    r->next = c->reqs;
    if (c->reqs)
        c->reqs->prev = r;
    c->reqs = r;
    if (c->n_reqs++ == 0)
        event_del(c->idle_ev);
    conn_schedule_send(c);
    return 0;
}

void up_conn_consume(gw_upstream_req *r, size_t n)
{
    up_conn *c = r->conn;
    if (n > r->unconsumed)
        n = r->unconsumed;
    if (!n || c->dead)
        return;
    r->unconsumed -= n;
    if (nghttp2_session_consume(c->ngh, r->stream_id, n))
        c->fail = GW_UP_NOMEM; /* the window would never open again: the send path closes */
    conn_schedule_send(c);
}

/* ---- nghttp2 callbacks (response side) ---- */

static gw_upstream_req *req_of(nghttp2_session *ngh, int32_t id)
{
    return id > 0 ? nghttp2_session_get_stream_user_data(ngh, id) : NULL;
}

static int on_begin_headers_cb(nghttp2_session *ngh, const nghttp2_frame *frame, void *ud)
{
    gw_upstream_req *r = req_of(ngh, frame->hd.stream_id);
    if (r && frame->hd.type == NGHTTP2_HEADERS) {
        /* a final response after 1xx starts afresh, as do trailers */
        r->hlen = r->n_h = 0;
        if (!r->responded)
            r->status = 0;
    }
    return 0;
}

static int on_header_cb(nghttp2_session *ngh, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
                        const uint8_t *value, size_t valuelen, uint8_t flags, void *ud)
{
    gw_upstream_req *r;
    if (frame->hd.type != NGHTTP2_HEADERS || !(r = req_of(ngh, frame->hd.stream_id)) ||
        (r->responded && !r->cbs.on_trailers))
        return 0; /* trailers nobody reads are dropped */
    if (!r->responded && namelen == 7 && !memcmp(name, ":status", 7)) {
        /* nghttp2 checked it is three digits */
        r->status = valuelen == 3 ? (value[0] - '0') * 100 + (value[1] - '0') * 10 + (value[2] - '0') : 0;
        return 0;
    }
    if (namelen && name[0] == ':')
        return 0;
    size_t need = namelen + valuelen + 2;
    /* HPACK bounds each field; the list is bounded here, so no sum wraps. */
    if (r->hlen + need + 32 * (r->n_h + 1) > GW_UP_MAX_HEADER_LIST) {
        r->proto_error = true;
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE; /* RST_STREAM; on_stream_close reports it */
    }
    if (r->hlen + need > r->hcap) {
        size_t cap = r->hcap ? r->hcap : 512;
        while (cap < r->hlen + need)
            cap *= 2;
        char *b = gw_mem_realloc(r->hbuf, cap);
        if (!b)
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
        r->hbuf = b;
        r->hcap = cap;
    }
    memcpy(r->hbuf + r->hlen, name, namelen);
    r->hbuf[r->hlen + namelen] = '\0';
    r->hlen += namelen + 1;
    memcpy(r->hbuf + r->hlen, value, valuelen);
    r->hbuf[r->hlen + valuelen] = '\0';
    r->hlen += valuelen + 1;
    r->n_h++;
    return 0;
}

/* The fields gathered in r->hbuf, in stack (cap entries) or, past it,
 * allocated (freed by the caller when it is not stack); NULL when out of
 * memory (r failed). */
static gw_http_header *fields_of(gw_upstream_req *r, gw_http_header *stack, size_t cap)
{
    gw_http_header *h = stack;
    if (r->n_h > cap && !(h = malloc(r->n_h * sizeof(*h)))) {
        req_fail(r, GW_UP_NOMEM, NGHTTP2_INTERNAL_ERROR);
        return NULL;
    }
    const char *s = r->hbuf;
    for (size_t i = 0; i < r->n_h; i++) {
        h[i].name = s;
        s += strlen(s) + 1;
        h[i].value = s;
        s += strlen(s) + 1;
    }
    return h;
}

/* The response's head (trailers: its end's fields) to the caller. */
static void fields_deliver(gw_upstream_req *r, bool trailers)
{
    gw_http_header stack[32], *h = fields_of(r, stack, sizeof(stack) / sizeof(stack[0]));
    if (!h)
        return;
    r->responded = true;
    up_req_progress(r);
    if (trailers)
        r->cbs.on_trailers(r->ud, h, r->n_h);
    else if (r->cbs.on_response)
        r->cbs.on_response(r->ud, r->status, h, r->n_h);
    if (h != stack)
        free(h);
    /* r may be retired by now, but it is freed only from the pool's kick. */
    gw_mem_free(r->hbuf);
    r->hbuf = NULL;
    r->hlen = r->hcap = r->n_h = 0;
}

/* Streams above last_stream_id were never processed (RFC 9113 6.8): they
 * fail as refused, so that the caller sends them again elsewhere and does
 * not count a draining target's GOAWAY as its failure (each such stream
 * was a step towards ejecting it). */
static void conn_on_goaway(up_conn *c, int32_t last_stream_id)
{
    c->draining = true;
    for (;;) { /* rescan: a callback may cancel any request of c */
        gw_upstream_req *r = c->reqs;
        while (r && r->stream_id <= last_stream_id)
            r = r->next;
        if (!r)
            break;
        /* nghttp2 closes the stream itself; an answer already begun on a
         * stream the peer now says it never processed is a broken peer */
        req_fail(r, r->responded ? GW_UP_RESET : GW_UP_REFUSED, -1);
    }
}

static void conn_on_ping_ack(up_conn *c, const uint8_t *opaque)
{
    uint64_t sent;
    memcpy(&sent, opaque, sizeof(sent));
    if (!sent || sent != c->ping_sent_ns)
        return; /* not ours, or one we gave up on */
    c->ping_sent_ns = 0;
    uint64_t now = gw_mono_ns();
    if (now >= sent)
        up_target_rtt_sample(c->target, (double)(now - sent) / 1000.0);
}

static int on_frame_recv_cb(nghttp2_session *ngh, const nghttp2_frame *frame, void *ud)
{
    up_conn *c = ud;
    switch (frame->hd.type) {
    case NGHTTP2_SETTINGS:
        if (!(frame->hd.flags & NGHTTP2_FLAG_ACK) && !c->established) {
            c->established = true;
            event_del(c->deadline_ev);
            conn_arm_idle(c);
        }
        return 0;
    case NGHTTP2_PING:
        if (frame->hd.flags & NGHTTP2_FLAG_ACK)
            conn_on_ping_ack(c, frame->ping.opaque_data);
        return 0;
    case NGHTTP2_GOAWAY:
        conn_on_goaway(c, frame->goaway.last_stream_id);
        return 0;
    case NGHTTP2_HEADERS:
    case NGHTTP2_DATA:
        break;
    default:
        return 0;
    }
    gw_upstream_req *r = req_of(ngh, frame->hd.stream_id);
    if (!r)
        return 0;
    bool end = frame->hd.flags & NGHTTP2_FLAG_END_STREAM;
    if (frame->hd.type == NGHTTP2_HEADERS && r->responded && r->cbs.on_trailers) {
        fields_deliver(r, true);
        if (r->state != UP_RS_OPEN)
            return 0; /* cancelled from on_trailers */
    } else if (frame->hd.type == NGHTTP2_HEADERS && !r->responded) {
        if (r->status >= 200) {
            fields_deliver(r, false);
            if (r->state != UP_RS_OPEN)
                return 0; /* cancelled from on_response */
        } else if (r->status >= 100 && !end) {
            return 0; /* 1xx: the final response follows */
        } else {      /* nghttp2 lets 000-099 through as final */
            req_fail(r, GW_UP_PROTOCOL, NGHTTP2_PROTOCOL_ERROR);
            return 0;
        }
    }
    if (end)
        req_end(c, r);
    return 0;
}

static int on_data_chunk_recv_cb(nghttp2_session *ngh, uint8_t flags, int32_t id, const uint8_t *data,
                                 size_t len, void *ud)
{
    gw_upstream_req *r = req_of(ngh, id);
    if (!r || !r->cbs.on_data) { /* nobody will consume it */
        nghttp2_session_consume(ngh, id, len);
        return 0;
    }
    if (!r->responded) { /* cannot happen past nghttp2's checks; never hand on a body without a status */
        nghttp2_session_consume(ngh, id, len);
        req_fail(r, GW_UP_PROTOCOL, NGHTTP2_PROTOCOL_ERROR);
        return 0;
    }
    r->unconsumed += len;
    up_req_progress(r);
    r->cbs.on_data(r->ud, data, len);
    return 0;
}

static int on_stream_close_cb(nghttp2_session *ngh, int32_t id, uint32_t error_code, void *ud)
{
    gw_upstream_req *r = req_of(ngh, id);
    /* closed before its response ended: reset by the peer, or by nghttp2 for an error */
    if (r)
        req_fail(r,
                 r->proto_error                                          ? GW_UP_PROTOCOL
                 : error_code == NGHTTP2_REFUSED_STREAM && !r->responded ? GW_UP_REFUSED
                                                                         : GW_UP_RESET,
                 -1);
    return 0;
}

static int on_invalid_frame_recv_cb(nghttp2_session *ngh, const nghttp2_frame *frame, int lib_error_code,
                                    void *ud)
{
    up_conn *c = ud;
    gw_upstream_req *r = req_of(ngh, frame->hd.stream_id);
    if (r)
        r->proto_error = true;
    else if (frame->hd.stream_id == 0)
        c->proto_error = true;
    return 0;
}

int up_conn_callbacks_init(gw_upstream_pool *p)
{
    if (nghttp2_session_callbacks_new(&p->cbs) || nghttp2_option_new(&p->ngopt))
        return -ENOMEM;
    nghttp2_session_callbacks *cb = p->cbs;
    nghttp2_session_callbacks_set_on_begin_headers_callback(cb, on_begin_headers_cb);
    nghttp2_session_callbacks_set_on_header_callback(cb, on_header_cb);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame_recv_cb);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data_chunk_recv_cb);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_stream_close_cb);
    nghttp2_session_callbacks_set_on_invalid_frame_recv_callback(cb, on_invalid_frame_recv_cb);
    /* Windows open only through gw_upstream_consume. Flood bounds as in
     * the server: queued SETTINGS/PING ACKs, SETTINGS entries per frame,
     * CONTINUATIONs per HEADERS. */
    nghttp2_option_set_no_auto_window_update(p->ngopt, 1);
    nghttp2_option_set_max_outbound_ack(p->ngopt, 1000);
    nghttp2_option_set_max_settings(p->ngopt, 32);
    nghttp2_option_set_max_continuations(p->ngopt, 8);
    return 0;
}

/* ---- connection I/O ---- */

/* Feeds everything read to nghttp2. 0, or -1 with c->fail set. */
static int conn_recv(up_conn *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    while (evbuffer_get_length(in) > 0 && !c->fail) {
        struct evbuffer_iovec v;
        if (evbuffer_peek(in, -1, NULL, &v, 1) < 1)
            break;
        ssize_t rv = nghttp2_session_mem_recv(c->ngh, v.iov_base, v.iov_len);
        if (rv < 0) {
            c->fail = rv == NGHTTP2_ERR_NOMEM ? GW_UP_NOMEM : GW_UP_PROTOCOL;
            return -1;
        }
        evbuffer_drain(in, (size_t)rv);
    }
    return c->fail ? -1 : 0;
}

/* Cleartext: writes the output to the socket now instead of waiting for
 * the loop to report it writable, which costs two epoll_ctl calls and a
 * loop turn per write. The bufferevent writes (EV_WRITE enabled) only what
 * the socket did not take. 0, or -1 with c->fail set. */
static int conn_flush(up_conn *c)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);
    if (c->ssl || evbuffer_get_length(out) == 0)
        return 0;
    /* The bufferevent keeps the front of its output frozen, and thaws it
     * itself only around its own writes. */
    evbuffer_unfreeze(out, 1);
    int n = evbuffer_write(out, c->fd);
    int e = errno;
    evbuffer_freeze(out, 1);
    if (n < 0 && e != EAGAIN && e != EWOULDBLOCK && e != EINTR) {
        c->fail = !c->established ? GW_UP_CONNECT : c->proto_error ? GW_UP_PROTOCOL : GW_UP_RESET;
        return -1;
    }
    if (evbuffer_get_length(out) == 0 ? bufferevent_disable(c->bev, EV_WRITE)
                                      : bufferevent_enable(c->bev, EV_WRITE)) {
        c->fail = GW_UP_NOMEM;
        return -1;
    }
    return 0;
}

/* Moves frames from nghttp2 to the output until it holds the soft maximum;
 * the write callback comes back for the rest once it drained. Reading goes
 * on meanwhile: a client that stopped reading while its peer waits for it
 * to read could deadlock both. */
static int conn_send(up_conn *c)
{
    if (!c->ready || c->dead || c->fail)
        return 0;
    struct evbuffer *out = bufferevent_get_output(c->bev);
    while (evbuffer_get_length(out) < GW_UP_OUT_SOFT_MAX) {
        const uint8_t *data;
        ssize_t n = nghttp2_session_mem_send(c->ngh, &data);
        if (n < 0) {
            c->fail = n == NGHTTP2_ERR_NOMEM ? GW_UP_NOMEM : GW_UP_PROTOCOL;
            return -1;
        }
        if (n == 0)
            break;
        if (evbuffer_add(out, data, (size_t)n)) {
            c->fail = GW_UP_NOMEM;
            return -1;
        }
        if (evbuffer_get_length(out) >= GW_UP_OUT_SOFT_MAX && conn_flush(c))
            return -1;
    }
    return conn_flush(c);
}

/* Fails every request still on c, then frees it. Only at the end of one of
 * c's loop callbacks. */
static void conn_close(up_conn *c)
{
    gw_upstream_error e = c->fail           ? (gw_upstream_error)c->fail
                          : !c->established ? GW_UP_CONNECT
                          : c->proto_error  ? GW_UP_PROTOCOL
                                            : GW_UP_RESET;
    c->dead = true;
    gw_upstream_req *r;
    while ((r = c->reqs)) /* callbacks may cancel others: take the head each time */
        req_fail(r, e, -1);
    up_conn_free(c);
}

/* The end of every loop callback of a connection: it goes if it failed, or
 * if nghttp2 is done with it and its output drained. */
static void conn_settle(up_conn *c)
{
    if (!c->fail && c->ready && !nghttp2_session_want_read(c->ngh) && !nghttp2_session_want_write(c->ngh)) {
        size_t left = evbuffer_get_length(bufferevent_get_output(c->bev));
        if (c->n_reqs == 0 && left > 0) {
            if (!c->lingering) { /* let the last frames (GOAWAY) out, for a bounded time */
                struct timeval tv = {GW_UP_LINGER_MS / 1000, (GW_UP_LINGER_MS % 1000) * 1000};
                c->lingering = c->draining = true;
                bufferevent_disable(c->bev, EV_READ);
                bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
                if (event_add(c->idle_ev, &tv))
                    c->fail = GW_UP_NOMEM;
            }
            if (!c->fail)
                return;
        }
        conn_close(c);
        return;
    }
    if (c->fail)
        conn_close(c);
}

static void on_read(struct bufferevent *bev, void *arg)
{
    up_conn *c = arg;
    if (!conn_recv(c))
        conn_send(c);
    conn_settle(c);
}

static void on_write(struct bufferevent *bev, void *arg)
{
    up_conn *c = arg;
    conn_send(c);
    conn_settle(c);
}

static void on_send_ev(evutil_socket_t fd, short what, void *arg)
{
    up_conn *c = arg;
    conn_send(c);
    conn_settle(c);
}

static void conn_ping(up_conn *c)
{
    uint64_t now = gw_mono_ns();
    int ms = pool_of(c)->ping_interval_ms;
    /* One PING in flight. One unanswered for ten intervals means a peer
     * that is up but no longer answers (a wedged process, packets dropped
     * without a reset): the connection fails, so that its streams end
     * rather than wait for ever, and a region's failures count. */
    if (c->ping_sent_ns) {
        if (now - c->ping_sent_ns >= (uint64_t)ms * 10000000u)
            c->fail = GW_UP_TIMEOUT;
        return;
    }
    uint8_t opaque[8];
    memcpy(opaque, &now, sizeof(opaque));
    if (nghttp2_submit_ping(c->ngh, NGHTTP2_FLAG_NONE, opaque) == 0)
        c->ping_sent_ns = now;
}

static void on_ping(evutil_socket_t fd, short what, void *arg)
{
    up_conn *c = arg;
    /* A draining connection (GOAWAY) still carries the streams it had:
     * without PINGs a peer that then wedged held them until
     * response_timeout_ms (10 minutes by default), not ~10 intervals. */
    if (!c->ready || c->lingering || (c->draining && !c->n_reqs))
        return;
    conn_ping(c);
    conn_send(c);
    conn_settle(c);
}

void up_conn_ping_rearm(up_conn *c)
{
    int ms = pool_of(c)->ping_interval_ms;
    if (c->dead || !c->ready || ms <= 0) {
        event_del(c->ping_ev);
        return;
    }
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    event_add(c->ping_ev, &tv);
}

static void conn_ready(up_conn *c)
{
    c->ready = true;
    up_conn_ping_rearm(c);
    if (pool_of(c)->ping_interval_ms > 0)
        conn_ping(c); /* a first sample at once */
    conn_send(c);
}

/* The verified certificate of a "tls:NAME@" target carries NAME: a
 * certificate of the fleet's CA for another name (another region's, an
 * application's) is not the region this connection is meant to reach. */
static bool peer_named(up_conn *c, SSL *ssl)
{
    up_target *t = c->target;
    if (!t->peer_name[0])
        return true;
    X509 *cert = SSL_get0_peer_certificate(ssl);
    if (cert && gw_tls_cert_named(cert, t->peer_name))
        return true;
    char cn[128] = "";
    if (cert)
        X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof(cn));
    up_peer_refused(t, "peer %s (%s) is not region %s: its certificate (CN %s) does not name it", t->name,
                    t->authority, t->peer_name, cn);
    return false;
}

/* The listener of a Unix target is the process that must answer there. */
static bool peer_is_expected(up_conn *c)
{
    up_target *t = c->target;
    int pid = t->kind == UP_UNIX ? up_target_expected_pid(t) : 0;
    if (!pid)
        return true;
    struct ucred cred;
    socklen_t len = sizeof(cred);
    if (getsockopt(c->fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == -1)
        cred.pid = 0;
    if (cred.pid == pid) {
        t->peer_told = false;
        return true;
    }
    up_peer_refused(t, "%s is served by pid %d (uid %d), not by pid %d", t->name, (int)cred.pid,
                    (int)cred.uid, pid);
    return false;
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    up_conn *c = arg;
    if (what & BEV_EVENT_CONNECTED) { /* TLS handshake done (and verified) */
        const unsigned char *proto = NULL;
        unsigned len = 0;
        SSL *ssl = bufferevent_openssl_get_ssl(bev);
        SSL_get0_alpn_selected(ssl, &proto, &len);
        if (len == 2 && !memcmp(proto, "h2", 2) && peer_named(c, ssl)) {
            c->target->peer_told = false;
            conn_ready(c);
        } else {
            c->fail = GW_UP_CONNECT;
        }
    } else if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT)) {
        /* Read what came before the end: it may finish streams. */
        if (c->ready && (what & BEV_EVENT_EOF))
            conn_recv(c);
        if (!c->fail)
            c->fail = !c->established ? GW_UP_CONNECT : c->proto_error ? GW_UP_PROTOCOL : GW_UP_RESET;
    }
    conn_settle(c);
}

/* The socket is connected: wraps it in a bufferevent (with TLS when the
 * target asks for it). */
static void conn_transport_start(up_conn *c)
{
    gw_upstream_pool *p = pool_of(c);
    up_target *t = c->target;
    int one = 1; /* fails harmlessly on Unix sockets */
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    /* Without BEV_OPT_CLOSE_ON_FREE: c keeps the socket (and the SSL), so
     * that who frees what is plain on every path, failures included. */
    if (t->kind == UP_TLS) {
        SSL *ssl = SSL_new(p->ssl_ctx);
        if (!ssl) {
            c->fail = GW_UP_NOMEM;
            return;
        }
        SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
        int ok = t->host_is_ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), t->host)
                               : SSL_set_tlsext_host_name(ssl, t->host) && SSL_set1_host(ssl, t->host);
        if (ok != 1 ||
            !(c->bev = bufferevent_openssl_socket_new(p->base, c->fd, ssl, BUFFEREVENT_SSL_CONNECTING, 0))) {
            SSL_free(ssl);
            c->fail = GW_UP_NOMEM;
            return;
        }
        c->ssl = ssl;
        bufferevent_openssl_set_allow_dirty_shutdown(c->bev, 1);
    } else if (!(c->bev = bufferevent_socket_new(p->base, c->fd, 0))) {
        c->fail = GW_UP_NOMEM;
        return;
    }
    /* A peer that takes nothing we write for this long is gone. */
    int ms = p->opts.idle_close_ms;
    struct timeval wt = {ms / 1000, (ms % 1000) * 1000};
    bufferevent_setcb(c->bev, on_read, on_write, on_event, c);
    bufferevent_setwatermark(c->bev, EV_WRITE, GW_UP_OUT_LOW_WATER, 0);
    /* Cleartext output goes out from conn_flush; the write event only
     * waits for a socket that did not take it all. */
    if (bufferevent_set_timeouts(c->bev, NULL, &wt) ||
        bufferevent_enable(c->bev, t->kind == UP_TLS ? EV_READ | EV_WRITE : EV_READ)) {
        c->fail = GW_UP_NOMEM;
        return;
    }
    if (t->kind != UP_TLS)
        conn_ready(c);
}

static void on_connect_ev(evutil_socket_t fd, short what, void *arg)
{
    up_conn *c = arg;
    int e = 0;
    socklen_t len = sizeof(e);
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) == -1)
        e = errno;
    if (e || !peer_is_expected(c))
        c->fail = GW_UP_CONNECT;
    else
        conn_transport_start(c);
    conn_settle(c);
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    up_conn *c = arg;
    if (c->established)
        return;
    c->fail = c->connect_errno ? GW_UP_CONNECT : GW_UP_TIMEOUT;
    conn_settle(c);
}

static void on_idle(evutil_socket_t fd, short what, void *arg)
{
    up_conn *c = arg;
    if (c->lingering || c->draining) { /* the linger bound passed */
        conn_close(c);
        return;
    }
    if (c->n_reqs)
        return;
    c->draining = true;
    if (nghttp2_session_terminate_session(c->ngh, NGHTTP2_NO_ERROR)) {
        c->fail = GW_UP_NOMEM;
    } else {
        struct timeval tv = {GW_UP_LINGER_MS / 1000, (GW_UP_LINGER_MS % 1000) * 1000};
        if (event_add(c->idle_ev, &tv))
            c->fail = GW_UP_NOMEM;
        conn_send(c);
    }
    conn_settle(c);
}

/* ---- life ---- */

static int conn_session_new(up_conn *c)
{
    gw_upstream_pool *p = pool_of(c);
    if (nghttp2_session_client_new3(&c->ngh, p->cbs, c, p->ngopt, gw_mem_nghttp2()))
        return -1;
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, p->opts.stream_window},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, GW_UP_MAX_HEADER_LIST},
        {NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES, 1},
    };
    if (nghttp2_submit_settings(c->ngh, NGHTTP2_FLAG_NONE, iv, sizeof(iv) / sizeof(iv[0])))
        return -1;
    return nghttp2_session_set_local_window_size(c->ngh, NGHTTP2_FLAG_NONE, 0, (int32_t)p->conn_window) ? -1
                                                                                                        : 0;
}

up_conn *up_conn_new(up_target *t, int fd)
{
    gw_upstream_pool *p = t->pool;
    up_conn *c = calloc(1, sizeof(*c));
    if (!c) {
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    c->target = t;
    c->fd = fd;
    c->next = t->conns;
    if (t->conns)
        t->conns->prev = c;
    t->conns = c;
    t->n_conns++;
    c->deadline_ev = evtimer_new(p->base, on_deadline, c);
    c->idle_ev = evtimer_new(p->base, on_idle, c);
    c->send_ev = event_new(p->base, -1, 0, on_send_ev, c);
    c->ping_ev = event_new(p->base, -1, EV_PERSIST, on_ping, c);
    if (!c->deadline_ev || !c->idle_ev || !c->send_ev || !c->ping_ev || conn_session_new(c))
        goto fail;
    if (fd >= 0) {
        int fl = fcntl(fd, F_GETFL);
        if (fl == -1 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) == -1 || fcntl(fd, F_SETFD, FD_CLOEXEC) == -1)
            c->connect_errno = errno;
    } else if ((c->fd = socket(t->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) == -1) {
        c->connect_errno = errno;
    } else if (connect(c->fd, (const struct sockaddr *)&t->addr, t->addr_len) == -1 && errno != EINPROGRESS &&
               errno != EINTR) {
        c->connect_errno = errno; /* ECONNREFUSED, ENOENT, EAGAIN (a full Unix backlog), ... */
    }
    if (c->connect_errno) { /* reported from the loop, never from the caller's call */
        event_active(c->deadline_ev, EV_TIMEOUT, 0);
        return c;
    }
    int ms = p->opts.connect_timeout_ms;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    if (!(c->connect_ev = event_new(p->base, c->fd, EV_WRITE, on_connect_ev, c)) ||
        event_add(c->connect_ev, NULL) || event_add(c->deadline_ev, &tv))
        goto fail;
    return c;
fail:
    up_conn_free(c);
    return NULL;
}

void up_conn_free(up_conn *c)
{
    up_target *t = c->target;
    c->dead = true;
    if (c->prev)
        c->prev->next = c->next;
    else
        t->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    t->n_conns--;
    if (c->connect_ev)
        event_free(c->connect_ev);
    if (c->deadline_ev)
        event_free(c->deadline_ev);
    if (c->idle_ev)
        event_free(c->idle_ev);
    if (c->send_ev)
        event_free(c->send_ev);
    if (c->ping_ev)
        event_free(c->ping_ev);
    if (c->bev) {
        /* Inside one of its callbacks libevent frees the bufferevent only
         * after the callback returns; its events must leave epoll before
         * the socket is closed below, not after. */
        bufferevent_setcb(c->bev, NULL, NULL, NULL, NULL);
        bufferevent_disable(c->bev, EV_READ | EV_WRITE);
        bufferevent_free(c->bev);
    }
    if (c->ssl)
        SSL_free(c->ssl);
    if (c->fd >= 0)
        close(c->fd);
    if (c->ngh)
        nghttp2_session_del(c->ngh);
    free(c);
}
