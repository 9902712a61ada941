/* HTTP/1.x server sessions (RFC 9112): one request at a time per
 * connection, parsed by gateway/http/http1_parse.c; a pipelined request is
 * parsed only once the previous response drained, so a connection holds
 * one stream and its output, and its input is capped by the read watermark
 * while the application works. Keep-alive by version and Connection,
 * Expect: 100-continue, timeouts for an idle connection, a slow head
 * (slowloris) and a stalled body.
 *
 * Responses go straight into the connection's output: Content-Length for a
 * whole one or a stream of a length said in advance, chunked coding (one
 * chunk per gw_http_write, sent at once) for another stream, or the close
 * for such a stream to an HTTP/1.0 client. A request the
 * parser refuses is answered with a JSON error and the connection closes,
 * our side first: the write side is shut and input is dropped until the
 * peer closes too (bounded), so that unread input does not turn our close
 * into a reset that destroys the answer in flight. See
 * gateway/http/http_internal.h for the rules on which calls may happen where. */
#include "gateway/http/http_internal.h"
#include "gateway/base/oai_error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

/* Input read beyond max_header_list before reading pauses: what may wait,
 * pipelined, while the application answers. */
#define GW_H1_IN_SLACK (16 * 1024)

/* ---- server answers ---- */

static const struct {
    int status;
    const char *reason;
} reasons[] = {
    {100, "Continue"},
    {200, "OK"},
    {201, "Created"},
    {202, "Accepted"},
    {204, "No Content"},
    {206, "Partial Content"},
    {301, "Moved Permanently"},
    {302, "Found"},
    {303, "See Other"},
    {304, "Not Modified"},
    {307, "Temporary Redirect"},
    {308, "Permanent Redirect"},
    {400, "Bad Request"},
    {401, "Unauthorized"},
    {403, "Forbidden"},
    {404, "Not Found"},
    {405, "Method Not Allowed"},
    {408, "Request Timeout"},
    {409, "Conflict"},
    {413, "Content Too Large"},
    {414, "URI Too Long"},
    {415, "Unsupported Media Type"},
    {417, "Expectation Failed"},
    {421, "Misdirected Request"},
    {422, "Unprocessable Content"},
    {429, "Too Many Requests"},
    {431, "Request Header Fields Too Large"},
    {500, "Internal Server Error"},
    {501, "Not Implemented"},
    {502, "Bad Gateway"},
    {503, "Service Unavailable"},
    {504, "Gateway Timeout"},
    {505, "HTTP Version Not Supported"},
};

static const char *reason_phrase(int status)
{
    for (size_t i = 0; i < sizeof(reasons) / sizeof(reasons[0]); i++)
        if (reasons[i].status == status)
            return reasons[i].reason;
    return ""; /* the reason phrase may be empty (RFC 9112 4) */
}

static const char *error_code(int status)
{
    return status == 408   ? "request_timeout" /* as HTTP/2 says it */
           : status == 413 ? "request_too_large"
           : status == 414 ? "uri_too_long"
           : status == 417 ? "expectation_failed"
           : status == 431 ? "request_header_fields_too_large"
           : status == 501 ? "not_implemented"
           : status == 505 ? "http_version_not_supported"
                           : "invalid_request";
}

/* The server answers the current request instead of the application and
 * closes: after a framing error nothing more on the connection can be
 * trusted, and after a 413 the body is not read. */
static void h1_reject(gw_http_conn *c, int status, const char *message)
{
    gw_h1 *h = &c->h1;
    struct evbuffer *out = bufferevent_get_output(c->bev);
    gw_server_refused(c->srv, status, h->cur, h->http10 ? "HTTP/1.0" : "HTTP/1.1");
    const bool head = h->cur && h->cur->head; /* the length said, no body */
    if (h->cur) { /* never reached the application: freed, no on_close */
        gw_http_stream *s = h->cur;
        h->cur = NULL;
        gw_stream_closed(s, false);
    }
    char body[320];
    size_t n =
        gw_oai_error_write(body, sizeof(body), message, "invalid_request_error", NULL, error_code(status));
    if (evbuffer_add_printf(out,
                            "HTTP/1.1 %d %s\r\ndate: %s\r\ncontent-type: application/json\r\n"
                            "content-length: %zu\r\nconnection: close\r\n\r\n",
                            status, reason_phrase(status), gw_http_date(c->srv), n) < 0 ||
        (!head && evbuffer_add(out, body, n)))
        c->broken = true;
    h->state = GW_H1_CLOSE;
    event_del(c->idle_ev);
}

/* Answers what the parser refused (`rc` an HTTP status), or closes when
 * memory ran out. True: the state moved on. */
static bool h1_refuse(gw_http_conn *c, int rc, const char *why)
{
    const gw_http_limits *lim = &c->srv->limits;
    char msg[96];
    if (rc < 400) { /* GW_H1_NOMEM */
        c->broken = true;
        return true;
    }
    if (rc == 413 && !why) {
        snprintf(msg, sizeof(msg), "request body larger than %zu bytes", lim->max_body);
        why = msg;
    } else if (rc == 431 && !why) {
        snprintf(msg, sizeof(msg), "request headers larger than %zu bytes", lim->max_header_list);
        why = msg;
    }
    h1_reject(c, rc, why ? why : "malformed request");
    return true;
}

/* ---- requests ---- */

static void h1_run(gw_http_conn *c);

/* The peer's close while its response is produced: with the input at its
 * bound (requests pipelined behind this one) reading stops, and a close
 * read only after them went unseen, so a completion ran to its end for a
 * client long gone. EV_CLOSED (EPOLLRDHUP) tells without reading. Once the
 * response is whole the reads see the close in turn: the watch stops, as
 * it would fire again and again (level-triggered). */
static void on_peer_closed(evutil_socket_t fd, short what, void *arg)
{
    gw_http_conn *c = arg;
    gw_h1 *h = &c->h1;
    if (h->state == GW_H1_APP && h->cur && !h->cur->resp_ended) {
        h->eof = true;
        h1_run(c);
        return;
    }
    event_del(c->closed_ev);
}

static void h1_watch_close(gw_http_conn *c)
{
    struct event_base *base = c->srv->base;
    if (!c->closed_ev && (event_base_get_features(base) & EV_FEATURE_EARLY_CLOSE))
        c->closed_ev = event_new(base, bufferevent_getfd(c->bev), EV_CLOSED | EV_PERSIST, on_peer_closed, c);
    if (c->closed_ev)
        event_add(c->closed_ev, NULL);
}

/* Input is read up to a head's bound and a little more (pipelined
 * requests wait there). */
static size_t h1_in_max(const gw_http_conn *c)
{
    const gw_http_limits *lim = &c->srv->limits;
    return lim->max_header_list > SIZE_MAX - GW_H1_IN_SLACK ? 0 : lim->max_header_list + GW_H1_IN_SLACK;
}

/* The write callback comes when the output fell to half the stream bound
 * (on_writable) and when it drained (the response is done). Set again
 * when a reload changes the bounds: a head larger than the old read bound,
 * within the new one, waited for ever. */
static void h1_set_bounds(gw_http_conn *c)
{
    bufferevent_setwatermark(c->bev, EV_READ, 0, h1_in_max(c));
    bufferevent_setwatermark(c->bev, EV_WRITE, c->srv->limits.max_stream_buffer / 2, 0);
    /* A head half read, past a bound now lowered: reading stops there, so
     * the parser must look again now (431) rather than at the next read. */
    if (c->h1.state == GW_H1_HEAD || c->h1.state == GW_H1_IDLE)
        gw_conn_schedule_send(c);
}

/* In the states that leave input for later (a response under way, or
 * flushed before the close), reading stops once the input is at its
 * bound: libevent runs the read callback again and again while it sits
 * there with reading enabled, and the loop spun at full speed for as long
 * as the response took. It resumes where input is wanted again (the next
 * request, or the linger). */
static void h1_hold_full_input(gw_http_conn *c)
{
    size_t max = h1_in_max(c);
    if (max && evbuffer_get_length(bufferevent_get_input(c->bev)) >= max)
        bufferevent_disable(c->bev, EV_READ);
}

static void h1_dispatch(gw_http_conn *c)
{
    gw_h1 *h = &c->h1;
    gw_http_stream *s = h->cur;
    gw_http_server *srv = c->srv;
    event_del(c->idle_ev); /* the application's turn: the peer may wait */
    gw_stream_fill_request(s, h->http10 ? "HTTP/1.0" : "HTTP/1.1");
    s->state = GW_SS_APP;
    h->state = GW_H1_APP;
    h1_watch_close(c);
    srv->handler.on_request(srv->ud, s, &s->req);
}

/* A request with a body to come is shown to on_head first (see http.h).
 * True when the application answered it: the body is left unread, so the
 * answer says connection: close and the connection closes after it,
 * before any 100 Continue. */
static bool h1_head(gw_http_conn *c)
{
    gw_h1 *h = &c->h1;
    if (!h->chunked_body && h->body_left == 0)
        return false;
    bool keep_alive = h->keep_alive;
    h->keep_alive = false; /* what an answer now says */
    if (gw_stream_offer_head(h->cur, h->http10 ? "HTTP/1.0" : "HTTP/1.1")) {
        event_del(c->idle_ev);
        h->state = GW_H1_APP;
        return true;
    }
    h->keep_alive = keep_alive;
    return false;
}

/* Reads as far as the input goes. True when the state moved on (to APP or
 * CLOSE), false when more input is needed. */
static bool h1_read(gw_http_conn *c)
{
    gw_h1 *h = &c->h1;
    struct evbuffer *in = bufferevent_get_input(c->bev);
    if (h->state == GW_H1_IDLE) {
        /* Empty lines before a request line are ignored (RFC 9112 2.2). */
        const unsigned char *p;
        while ((p = evbuffer_pullup(in, 2)) && p[0] == '\r' && p[1] == '\n')
            evbuffer_drain(in, 2);
        size_t len = evbuffer_get_length(in);
        if (len == 0 || (len == 1 && *evbuffer_pullup(in, 1) == '\r'))
            return false;
        h->state = GW_H1_HEAD;
        h->scanned = 0;
        if (h->n_requests > 0) /* the first request's bound runs from accept */
            gw_conn_set_timer(c, c->srv->limits.header_timeout_ms);
    }
    const gw_http_limits *lim = &c->srv->limits;
    const char *why;
    int rc;
    if (h->state == GW_H1_HEAD) {
        if ((rc = gw_h1_parse_head(c, &why)) == GW_H1_MORE)
            return false;
        if (rc != GW_H1_DONE)
            return h1_refuse(c, rc, why);
        if (h1_head(c))
            return true;
        h->state = GW_H1_BODY;
        if (h->expect_continue &&
            evbuffer_add(bufferevent_get_output(c->bev), "HTTP/1.1 100 Continue\r\n\r\n", 25)) {
            c->broken = true;
            return true;
        }
        /* Waiting for the body is waiting on the peer as idle is. */
        gw_conn_set_timer(c, lim->idle_timeout_ms);
    }
    size_t before = evbuffer_get_length(in);
    rc = gw_h1_parse_body(c, &why);
    if (rc == GW_H1_MORE) {
        if (evbuffer_get_length(in) < before) /* progress */
            gw_conn_set_timer(c, lim->idle_timeout_ms);
        return false;
    }
    if (rc != GW_H1_DONE)
        return h1_refuse(c, rc, why);
    h1_dispatch(c);
    return true;
}

/* ---- the connection ---- */

/* Our side is done: shut it, and drop input until the peer closes. */
static void h1_shut(gw_http_conn *c)
{
    if (c->tls)
        gw_tls_close_notify(c->bev);
    shutdown(bufferevent_getfd(c->bev), SHUT_WR);
    c->h1.state = GW_H1_LINGER;
    gw_conn_set_timer(c, GW_HTTP_LINGER_MS);
    if (bufferevent_enable(c->bev, EV_READ))
        c->broken = true;
}

/* The connection is about to be freed: a response started and not all
 * sent ends in a TCP reset, not a FIN. An HTTP/1.0 body is delimited by
 * the close, so a FIN would make a cut body look whole (and a proxy in
 * front, nginx's HTTP/1.0 upstreams, pass it on as such). */
/* Its output counts in the bytes the server holds for slow readers
 * (max_buffer), as HTTP/2 streams' do: a thousand HTTP/1 clients that stop
 * reading held a stream's bound each, outside every other. */
static void h1_out_cb(struct evbuffer *b, const struct evbuffer_cb_info *info, void *arg)
{
    gw_conn_held_add(arg, (ptrdiff_t)info->n_added - (ptrdiff_t)info->n_deleted);
}

static void h1_closing(gw_http_conn *c)
{
    if (c->h1.out_cb) {
        evbuffer_remove_cb_entry(bufferevent_get_output(c->bev), c->h1.out_cb);
        c->h1.out_cb = NULL;
        gw_conn_held_add(c, -(ptrdiff_t)c->h2_out_held);
    }
    gw_http_stream *s = c->h1.cur;
    if (!s || !s->resp_started || (s->resp_ended && evbuffer_get_length(bufferevent_get_output(c->bev)) == 0))
        return;
    evutil_socket_t fd = bufferevent_getfd(c->bev);
    const struct linger lg = {.l_onoff = 1, .l_linger = 0};
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
}

/* The end of every loop callback of a connection: drives it as far as it
 * goes. May free it: the caller must not touch it after. */
static void h1_run(gw_http_conn *c)
{
    gw_h1 *h = &c->h1;
    struct evbuffer *in = bufferevent_get_input(c->bev), *out = bufferevent_get_output(c->bev);
    size_t half = c->srv->limits.max_stream_buffer / 2;
    for (;;) {
        if (c->broken || h->abort) {
            gw_conn_free(c);
            return;
        }
        switch (h->state) {
        case GW_H1_IDLE:
        case GW_H1_HEAD:
        case GW_H1_BODY:
            if (h1_read(c))
                break;
            if (h->eof) { /* a request cut short, or none */
                gw_conn_free(c);
                return;
            }
            return;
        case GW_H1_APP: {
            gw_http_stream *s = h->cur;
            size_t left = evbuffer_get_length(out);
            if (h->eof && !s->resp_ended) { /* the client gave up */
                gw_conn_free(c);
                return;
            }
            if (s->above_half && !s->resp_ended && left <= half && !gw_http_full(s)) {
                s->above_half = false;
                gw_stream_writable(s);
                break;
            }
            if (!s->resp_ended || left > 0) {
                h1_hold_full_input(c);
                return;
            }
            h->cur = NULL;
            if (c->closed_ev)
                event_del(c->closed_ev);
            gw_stream_closed(s, true);
            gw_conn_flush_closed(c);
            /* A peer that shut its side after pipelining still gets the
             * answers to the requests it sent whole. */
            if (h->keep_alive && (!h->eof || evbuffer_get_length(in) > 0) && !c->srv->draining) {
                h->state = GW_H1_IDLE;
                if (bufferevent_enable(c->bev, EV_READ))
                    c->broken = true;
                gw_conn_set_timer(c, c->srv->limits.idle_timeout_ms);
            } else {
                h->state = GW_H1_CLOSE;
            }
            break;
        }
        case GW_H1_CLOSE:
            if (evbuffer_get_length(out) > 0) {
                h1_hold_full_input(c);
                return;
            }
            if (h->eof) {
                gw_conn_free(c);
                return;
            }
            h1_shut(c);
            break;
        case GW_H1_LINGER:
            evbuffer_drain(in, evbuffer_get_length(in));
            if (h->eof) {
                gw_conn_free(c);
                return;
            }
            return;
        }
    }
}

static void on_read(struct bufferevent *bev, void *arg)
{
    h1_run(arg);
}

static void on_write(struct bufferevent *bev, void *arg)
{
    h1_run(arg);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    gw_http_conn *c = arg;
    /* An EOF leaves a response that is whole (ended, still draining) to be
     * sent: the peer may only have shut its write side. One the application
     * is still producing is dropped (h1_run): a socket closed or half-closed
     * cannot be told apart here, and a completion must not run on for a
     * client that went away (nginx aborts the same way by default), so a
     * client that half-closes after its request gets no streamed answer.
     * OpenSSL stops both directions at the peer's close, so over TLS an EOF
     * ends the connection. Errors and a peer that stopped reading (write
     * timeout) end it at once. */
    if ((what & BEV_EVENT_EOF) && !(what & (BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT)) && !c->tls) {
        c->h1.eof = true;
        h1_run(c);
        return;
    }
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT))
        gw_conn_free(c);
}

static void h1_on_send(gw_http_conn *c)
{
    h1_run(c);
}

static void h1_on_timer(gw_http_conn *c)
{
    /* A body that stalled gets 408 (as over HTTP/2), then the close. Idle
     * between requests, a head not complete in time (slowloris), or a peer
     * that does not close after us: closed at once. */
    if (c->h1.state == GW_H1_BODY && !c->h1.abort) {
        h1_reject(c, 408, "the request body stopped arriving");
        gw_conn_set_timer(c, GW_HTTP_LINGER_MS);
        h1_run(c);
        return;
    }
    /* The head's bound (from accept for the first request) cut it: told;
     * not a drain's close of a connection that never sent a request. */
    if (c->h1.state == GW_H1_HEAD || (c->h1.state == GW_H1_IDLE && c->h1.n_requests == 0 && !c->srv->draining))
        gw_server_refused(c->srv, GW_HTTP_CUT_HEADER_TIMEOUT, NULL, c->h1.http10 ? "HTTP/1.0" : "HTTP/1.1");
    if (c->h1.state != GW_H1_APP)
        gw_conn_free(c);
}

/* Between requests a connection closes now; with one in progress, after
 * its response (the keep-alive test above). */
static void h1_drain(gw_http_conn *c)
{
    if (c->h1.state == GW_H1_IDLE)
        gw_conn_set_timer(c, 0);
}

/* ---- the application's side: buffer and schedule only ---- */

static bool valid_header(const gw_http_header *h)
{
    if (!h->name || !h->value || !*h->name)
        return false;
    for (const char *p = h->name; *p; p++)
        if (!gw_h1_is_tchar((unsigned char)*p))
            return false;
    for (const char *p = h->value; *p; p++)
        if (!gw_h1_is_field_char((unsigned char)*p))
            return false;
    return true;
}

static int h1_submit(gw_http_stream *s, int status, const gw_http_header *headers, size_t n_headers,
                     const void *body, size_t body_len, bool whole, int64_t length)
{
    gw_http_conn *c = s->conn;
    gw_h1 *h = &c->h1;
    if (status < 200 || status > 999 || (n_headers && !headers) || (body_len && !body))
        return -EINVAL;
    for (size_t i = 0; i < n_headers; i++)
        if (!valid_header(&headers[i]))
            return -EINVAL;
    bool no_content = status == 204 || status == 304; /* never a body, nor its length */
    bool sized = !whole && length >= 0 && !no_content;
    /* Draining: the connection closes after this response; say so, or a
     * client that reuses it races the close with its next request. */
    bool keep_alive = h->keep_alive && !c->srv->draining;
    if (!whole && !sized && !no_content && !s->head && h->http10)
        keep_alive = false; /* the close delimits the stream */
    struct evbuffer *buf = evbuffer_new();
    if (!buf)
        return -ENOMEM;
    int rc = evbuffer_add_printf(buf, "HTTP/1.1 %d %s\r\ndate: %s\r\n", status, reason_phrase(status),
                                 gw_http_date(c->srv)) < 0;
    for (size_t i = 0; i < n_headers && !rc; i++)
        if (!gw_h1_hop_by_hop(headers[i].name, strlen(headers[i].name)) &&
            strcasecmp(headers[i].name, "date"))
            rc = evbuffer_add_printf(buf, "%s: %s\r\n", headers[i].name, headers[i].value) < 0;
    if (!rc && whole && !no_content)
        rc = evbuffer_add_printf(buf, "content-length: %zu\r\n", body_len) < 0;
    else if (!rc && sized)
        rc = evbuffer_add_printf(buf, "content-length: %lld\r\n", (long long)length) < 0;
    bool chunked = !whole && !sized && !no_content && !s->head && !h->http10;
    if (!rc && chunked)
        rc = evbuffer_add(buf, "transfer-encoding: chunked\r\n", 28);
    if (!rc && !keep_alive)
        rc = evbuffer_add(buf, "connection: close\r\n", 19);
    else if (!rc && h->http10)
        rc = evbuffer_add(buf, "connection: keep-alive\r\n", 24);
    if (!rc)
        rc = evbuffer_add(buf, "\r\n", 2);
    if (!rc && whole && body_len && !s->head && !no_content)
        rc = evbuffer_add(buf, body, body_len);
    if (!rc)
        rc = evbuffer_add_buffer(bufferevent_get_output(c->bev), buf);
    evbuffer_free(buf);
    if (rc)
        return -ENOMEM;
    h->keep_alive = keep_alive;
    s->bodiless = s->head || no_content;
    s->chunked = chunked;
    s->sized = sized;
    s->resp_left = sized ? (uint64_t)length : 0;
    s->resp_started = true;
    s->resp_ended = whole;
    gw_conn_schedule_send(c);
    return 0;
}

static int h1_write(gw_http_stream *s, const void *data, size_t len)
{
    struct evbuffer *out = bufferevent_get_output(s->conn->bev);
    if (s->bodiless)
        return 0; /* a HEAD response, 204 or 304: the bytes have no place */
    if (s->chunked) {
        char size[24];
        int n = snprintf(size, sizeof(size), "%zx\r\n", len);
        if (evbuffer_add(out, size, (size_t)n))
            return -ENOMEM;
        if (evbuffer_add(out, data, len) || evbuffer_add(out, "\r\n", 2)) {
            s->conn->broken = true; /* half a chunk went out: the framing is lost */
            gw_conn_schedule_send(s->conn);
            return -ENOMEM;
        }
        return 0;
    }
    return evbuffer_add(out, data, len) ? -ENOMEM : 0;
}

static int h1_end(gw_http_stream *s)
{
    if (s->chunked && evbuffer_add(bufferevent_get_output(s->conn->bev), "0\r\n\r\n", 5))
        return -ENOMEM;
    s->resp_ended = true;
    gw_conn_schedule_send(s->conn);
    return 0;
}

static void h1_reset(gw_http_stream *s)
{
    /* No stream to reset in HTTP/1.x: the connection goes, from the loop. */
    s->reset = true;
    s->conn->h1.abort = true;
    gw_conn_schedule_send(s->conn);
}

static size_t h1_pending(const gw_http_stream *s)
{
    if (s != s->conn->h1.cur || s->state != GW_SS_APP)
        return 0;
    return evbuffer_get_length(bufferevent_get_output(s->conn->bev));
}

static const gw_http_proto h1_proto = {
    .on_send = h1_on_send,
    .on_timer = h1_on_timer,
    .drain = h1_drain,
    .set_bounds = h1_set_bounds,
    .no_streams = gw_conn_nop, /* the connection keeps its own timer by its state */
    .closing = h1_closing,
    .submit = h1_submit,
    .write = h1_write,
    .end = h1_end,
    .reset = h1_reset,
    .pending = h1_pending,
};

void gw_h1_start(gw_http_conn *c)
{
    c->proto = &h1_proto;
    c->h1.state = GW_H1_IDLE;
    /* no memory for the entry: its output goes uncounted, as before */
    c->h1.out_cb = evbuffer_add_cb(bufferevent_get_output(c->bev), h1_out_cb, c);
    bufferevent_setcb(c->bev, on_read, on_write, on_event, c);
    h1_set_bounds(c);
    h1_run(c);
}
