/* The HTTP server's shared core: the server object, connections from
 * accept to the choice of protocol (the HTTP/2 preface or anything else on
 * cleartext, ALPN on TLS), what streams of every protocol share (request
 * arena, closing, on_close outside protocol code), and the application's
 * stream API, which checks a call and hands it to the connection's
 * protocol table (http2.c or http1.c). See
 * gateway/http/http_internal.h for ownership and the rules on which calls may
 * happen where. */
#include "gateway/http/http_internal.h"
#include "gateway/base/mem.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/util.h>

static const char h2_preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

void gw_http_limits_default(gw_http_limits *l)
{
    l->max_body = 1 << 20;
    l->max_conn_body = 0; /* 4 x max_body */
    l->max_concurrent_streams = 256;
    l->max_cut_streams = 0; /* 2 x max_concurrent_streams, at least 64 */
    l->max_header_list = 64 << 10;
    l->max_stream_buffer = 1 << 20;
    l->max_conn_buffer = 16 << 20;
    l->max_buffer = 256 << 20;
    l->window_timeout_ms = 0; /* idle_timeout_ms */
    l->idle_timeout_ms = 120000;
    l->header_timeout_ms = 10000;
    l->max_connections = 10000;
}

/* ---- per-stream arena for request strings ---- */

struct gw_arena_chunk {
    gw_arena_chunk *next;
    size_t used, cap;
    char data[];
};

char *gw_arena_strndup(gw_arena_chunk **head, const void *p, size_t n)
{
    gw_arena_chunk *c = *head;
    if (!c || c->cap - c->used < n + 1) {
        /* The first chunk fits malloc's per-thread cache (a request's
         * header strings seldom need more); later ones are larger. */
        size_t cap = *head ? 4000 : 1000;
        if (n + 1 > cap)
            cap = n + 1;
        if (!(c = gw_mem_alloc(sizeof(*c) + cap)))
            return NULL;
        c->next = *head;
        c->used = 0;
        c->cap = cap;
        *head = c;
    }
    char *s = c->data + c->used;
    memcpy(s, p, n);
    s[n] = '\0';
    c->used += n + 1;
    return s;
}

static void arena_free(gw_arena_chunk *c)
{
    while (c) {
        gw_arena_chunk *next = c->next;
        gw_mem_free(c);
        c = next;
    }
}

/* ---- streams ---- */

void gw_conn_schedule_send(gw_http_conn *c)
{
    if (!c->dead)
        event_active(c->send_ev, EV_WRITE, 0);
}

int gw_conn_idle_ms(const gw_http_conn *c)
{
    return c->srv->draining ? 0 : c->srv->limits.idle_timeout_ms;
}

void gw_conn_set_timer(gw_http_conn *c, int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    if (event_add(c->idle_ev, &tv))
        c->broken = true;
}

gw_http_stream *gw_stream_new(gw_http_conn *c, int32_t id)
{
    gw_http_stream *s = gw_mem_alloc(sizeof(*s));
    if (!s)
        return NULL;
    memset(s, 0, sizeof(*s));
    s->conn = c;
    s->id = id;
    s->state = GW_SS_HEADERS;
    s->next = c->streams;
    if (c->streams)
        c->streams->prev = s;
    c->streams = s;
    c->n_streams++;
    c->srv->active_streams++;
    return s;
}

void gw_server_refused(gw_http_server *srv, int status, const gw_http_stream *s, const char *protocol)
{
    if (srv->handler.on_refused)
        srv->handler.on_refused(srv->ud, status, s ? s->method : NULL, s ? s->path : NULL, protocol);
}

const char *gw_http_date(gw_http_server *srv)
{
    /* By hand, not strftime: %a and %b follow the locale. */
    static const char days[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                       "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    struct timeval tv;
    struct tm tm;
    if (event_base_gettimeofday_cached(srv->base, &tv))
        gettimeofday(&tv, NULL);
    if (srv->date[0] && tv.tv_sec == srv->date_sec)
        return srv->date;
    srv->date_sec = tv.tv_sec;
    gmtime_r(&srv->date_sec, &tm);
    /* gmtime_r's fields fit (a year past 9999 would not: left to the clock) */
    int n = snprintf(srv->date, sizeof(srv->date), "%s, %02d %s %04d %02d:%02d:%02d GMT", days[tm.tm_wday % 7],
                     tm.tm_mday, months[tm.tm_mon % 12], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
    if (n < 0 || (size_t)n >= sizeof(srv->date))
        srv->date[0] = '\0';
    return srv->date;
}

bool gw_conn_peer(gw_http_conn *c)
{
    if (c->peer < 0)
        c->peer = c->tls && gw_tls_peer_verified(c->bev);
    return c->peer;
}

bool gw_stream_offer_head(gw_http_stream *s, const char *protocol)
{
    gw_http_server *srv = s->conn->srv;
    if (!srv->handler.on_head)
        return false;
    gw_stream_fill_request(s, protocol);
    gw_stream_state state = s->state;
    s->state = GW_SS_APP;
    srv->handler.on_head(srv->ud, s, &s->req);
    if (s->resp_started || s->reset)
        return true;
    s->state = state;
    return false;
}

void gw_stream_fill_request(gw_http_stream *s, const char *protocol)
{
    static const uint8_t empty_body[1];
    s->req = (gw_http_request){
        .method = s->method,
        .path = s->path,
        .authority = s->authority,
        .headers = s->headers,
        .n_headers = s->n_headers,
        .body = s->body ? s->body : empty_body,
        .body_len = s->body_len,
        .protocol = protocol,
        .peer_verified = gw_conn_peer(s->conn),
    };
}

const char *gw_stream_repeated_field(const gw_http_stream *s)
{
    static const struct {
        const char *name, *why;
    } single[] = {
        {"authorization", "more than one Authorization header"},
        {"proxy-authorization", "more than one Proxy-Authorization header"},
        {"content-length", "more than one Content-Length header"},
        {"content-type", "more than one Content-Type header"},
        {"host", "more than one Host header"},
        {"x-infergate-tenant", "more than one x-infergate-tenant header"},
    };
    for (size_t k = 0; k < sizeof(single) / sizeof(single[0]); k++) {
        int seen = 0;
        for (size_t i = 0; i < s->n_headers && seen < 2; i++)
            seen += s->headers[i].name[0] == single[k].name[0] && !strcmp(s->headers[i].name, single[k].name);
        if (seen > 1)
            return single[k].why;
    }
    return NULL;
}

static void stream_free(gw_http_stream *s)
{
    arena_free(s->arena);
    gw_mem_free(s->headers);
    gw_mem_free(s->body);
    if (s->out)
        evbuffer_free(s->out);
    gw_mem_free(s);
}

void gw_stream_closed(gw_http_stream *s, bool finished)
{
    gw_http_conn *c = s->conn;
    if (s->prev)
        s->prev->next = s->next;
    else
        c->streams = s->next;
    if (s->next)
        s->next->prev = s->prev;
    s->prev = s->next = NULL;
    c->srv->active_streams--;
    c->h2_header_bytes -= s->header_kept;
    s->header_kept = 0;
    c->h2_body_held -= s->body_held;
    s->body_held = 0;
    if (--c->n_streams == 0)
        c->proto->no_streams(c);
    if (s->state != GW_SS_APP) {
        stream_free(s);
        return;
    }
    s->state = GW_SS_CLOSED;
    s->finished = finished;
    if (s->out) { /* what the peer will never get */
        evbuffer_free(s->out);
        s->out = NULL;
    }
    if (c->closed_tail)
        c->closed_tail->next = s;
    else
        c->closed = s;
    c->closed_tail = s;
}

void gw_conn_flush_closed(gw_http_conn *c)
{
    gw_http_stream *s;
    while ((s = c->closed)) {
        c->closed = s->next;
        if (!c->closed)
            c->closed_tail = NULL;
        gw_http_server *srv = c->srv;
        if (srv->handler.on_close)
            srv->handler.on_close(srv->ud, s, s->user, s->finished);
        stream_free(s);
    }
}

void gw_stream_writable(gw_http_stream *s)
{
    gw_http_server *srv = s->conn->srv;
    if (srv->handler.on_writable && s->state == GW_SS_APP && !s->resp_ended && !s->reset && !s->conn->dead)
        srv->handler.on_writable(srv->ud, s, s->user);
}

void gw_stream_sweep(gw_http_stream *s)
{
    if (s->above_half && !gw_http_full(s)) {
        s->above_half = false;
        gw_stream_writable(s);
    }
}

static void server_sweep(gw_http_server *srv)
{
    if (!srv->h2_sweep_due)
        return;
    srv->h2_sweep_due = false;
    for (gw_http_conn *o = srv->conns; o; o = o->next)
        for (gw_http_stream *s = o->dead ? NULL : o->streams; s; s = s->next)
            gw_stream_sweep(s);
}

static void on_sweep(evutil_socket_t fd, short what, void *arg)
{
    server_sweep(arg);
}

bool gw_conn_held_add(gw_http_conn *c, ptrdiff_t n)
{
    gw_http_server *srv = c->srv;
    const size_t srv_half = srv->limits.max_buffer / 2;
    const bool conn_over = gw_conn_full(c), srv_over = srv->h2_out_held > srv_half;
    c->h2_out_held += (size_t)n;
    srv->h2_out_held += (size_t)n;
    if (srv_over && srv->h2_out_held <= srv_half) {
        srv->h2_sweep_due = true;
        if (srv->sweep_ev)
            event_active(srv->sweep_ev, EV_TIMEOUT, 0);
    }
    return conn_over && !gw_conn_full(c);
}

/* ---- connections ---- */

void gw_conn_free(gw_http_conn *c)
{
    gw_http_server *srv = c->srv;
    c->dead = true;
    c->proto->closing(c);
    /* nghttp2_session_del runs no callbacks: close our streams ourselves. */
    if (c->ngh)
        nghttp2_session_del(c->ngh);
    c->ngh = NULL;
    while (c->streams)
        gw_stream_closed(c->streams, false);
    c->h1.cur = NULL;
    gw_conn_flush_closed(c);
    if (c->send_ev)
        event_free(c->send_ev);
    if (c->idle_ev)
        event_free(c->idle_ev);
    if (c->closed_ev)
        event_free(c->closed_ev);
    bufferevent_free(c->bev);
    if (c->prev)
        c->prev->next = c->next;
    else
        srv->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    srv->n_conns--;
    free(c);
}

/* Cleartext: the HTTP/2 preface (RFC 9113 3.4) or HTTP/1.x. A request line
 * cannot start like the preface for long: "PRI * HTTP/2.0" is no HTTP/1.x
 * version, so waiting for all 24 bytes loses nothing. */
static void detect_on_read(struct bufferevent *bev, void *arg)
{
    gw_http_conn *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    size_t want = sizeof(h2_preface) - 1, n = evbuffer_get_length(in);
    if (n == 0)
        return;
    if (n > want)
        n = want;
    const unsigned char *p = evbuffer_pullup(in, (ev_ssize_t)n);
    if (!p) {
        gw_conn_free(c);
        return;
    }
    if (memcmp(p, h2_preface, n))
        gw_h1_start(c);
    else if (n == want)
        gw_h2_start(c);
}

static void detect_on_event(struct bufferevent *bev, short what, void *arg)
{
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT))
        gw_conn_free(arg);
}

static void tls_on_event(struct bufferevent *bev, short what, void *arg)
{
    gw_http_conn *c = arg;
    if (what & BEV_EVENT_CONNECTED) {
        if (gw_tls_alpn_h2(bev))
            gw_h2_start(c);
        else
            gw_h1_start(c);
        return;
    }
    /* A failed handshake (a TLS 1.1 client, a bad record) or a peer gone. */
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT))
        gw_conn_free(c);
}

static void on_send_ev(evutil_socket_t fd, short what, void *arg)
{
    gw_http_conn *c = arg;
    c->proto->on_send(c);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    gw_http_conn *c = arg;
    c->proto->on_timer(c);
}

void gw_conn_nop(gw_http_conn *c) {}

/* No preface, or no handshake, in header_timeout_ms: a slowloris, or a
 * client that never spoke, counted as cut (on_refused). */
static void undecided_on_timer(gw_http_conn *c)
{
    gw_server_refused(c->srv, GW_HTTP_CUT_HEADER_TIMEOUT, NULL, NULL);
    gw_conn_free(c);
}

/* A connection whose protocol is not known yet (cleartext detection, or
 * the TLS handshake) has no streams: their members are never called. */
static const gw_http_proto undecided = {
    .on_send = gw_conn_nop,
    .on_timer = undecided_on_timer,
    .drain = gw_conn_nop, /* the protocol, once chosen, sees srv->draining */
    .set_bounds = gw_conn_nop,
    .no_streams = gw_conn_nop,
    .closing = gw_conn_nop,
};

int gw_conn_adopt(gw_http_server *srv, int fd, struct ssl_ctx_st *tls)
{
    gw_http_conn *c = calloc(1, sizeof(*c));
    if (!c) {
        evutil_closesocket(fd);
        return -ENOMEM;
    }
    if (evutil_make_socket_nonblocking(fd) || evutil_make_socket_closeonexec(fd)) {
        evutil_closesocket(fd);
        free(c);
        return -EBADF; /* not a socket we could use without blocking the loop */
    }
    int one = 1; /* fails harmlessly on Unix sockets */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    c->srv = srv;
    c->tls = tls != NULL;
    c->peer = -1;
    c->proto = &undecided;
    if (tls)
        c->bev = gw_tls_bev_new(srv->base, fd, tls); /* owns fd, also on failure */
    else if (!(c->bev = bufferevent_socket_new(srv->base, fd, BEV_OPT_CLOSE_ON_FREE)))
        evutil_closesocket(fd);
    if (!c->bev) {
        free(c);
        return -ENOMEM;
    }
    c->next = srv->conns;
    if (srv->conns)
        srv->conns->prev = c;
    srv->conns = c;
    srv->n_conns++;
    int ms = srv->limits.idle_timeout_ms;
    struct timeval wt = {ms / 1000, (ms % 1000) * 1000};
    c->send_ev = event_new(srv->base, -1, 0, on_send_ev, c);
    c->idle_ev = evtimer_new(srv->base, on_timer, c);
    if (!c->send_ev || !c->idle_ev || bufferevent_set_timeouts(c->bev, NULL, &wt)) {
        gw_conn_free(c);
        return -ENOMEM;
    }
    bufferevent_setcb(c->bev, tls ? NULL : detect_on_read, NULL, tls ? tls_on_event : detect_on_event, c);
    gw_conn_set_timer(c, srv->limits.header_timeout_ms);
    if (c->broken || bufferevent_enable(c->bev, EV_READ | EV_WRITE)) {
        gw_conn_free(c);
        return -ENOMEM;
    }
    return 0;
}

int gw_http_server_adopt(gw_http_server *srv, int fd)
{
    return gw_conn_adopt(srv, fd, NULL);
}

/* ---- server ---- */

void gw_http_server_set_limits(gw_http_server *srv, const gw_http_limits *limits)
{
    static const gw_http_limits none; /* zero means "the default" */
    const gw_http_limits *l = limits ? limits : &none;
    gw_http_limits_default(&srv->limits);
    if (l->max_body)
        srv->limits.max_body = l->max_body;
    if (l->max_concurrent_streams)
        srv->limits.max_concurrent_streams = l->max_concurrent_streams;
    if (l->max_header_list)
        srv->limits.max_header_list = l->max_header_list;
    if (l->max_stream_buffer)
        srv->limits.max_stream_buffer = l->max_stream_buffer;
    if (l->max_conn_buffer)
        srv->limits.max_conn_buffer = l->max_conn_buffer;
    if (l->max_buffer)
        srv->limits.max_buffer = l->max_buffer;
    srv->limits.window_timeout_ms = l->window_timeout_ms;
    srv->limits.min_read_rate = l->min_read_rate;
    if (l->idle_timeout_ms > 0)
        srv->limits.idle_timeout_ms = l->idle_timeout_ms;
    if (l->header_timeout_ms > 0)
        srv->limits.header_timeout_ms = l->header_timeout_ms;
    if (l->max_connections)
        srv->limits.max_connections = l->max_connections;
    /* 0: 4 x max_body, worked out here once (the DATA path and the receive
     * window read it) */
    size_t mb = srv->limits.max_body;
    srv->limits.max_conn_body = l->max_conn_body ? l->max_conn_body : mb > SIZE_MAX / 4 ? SIZE_MAX : 4 * mb;
    uint32_t mcs = srv->limits.max_concurrent_streams;
    srv->limits.max_cut_streams = l->max_cut_streams ? l->max_cut_streams : mcs > 32 ? 2 * mcs : 64;
    for (gw_http_conn *c = srv->conns; c; c = c->next)
        c->proto->set_bounds(c);
}

gw_http_server *gw_http_server_new(struct event_base *base, const gw_http_limits *limits,
                                   const gw_http_handler *handler, void *ud)
{
    if (!base || !handler || !handler->on_request)
        return NULL;
    gw_http_server *srv = calloc(1, sizeof(*srv));
    if (!srv)
        return NULL;
    srv->base = base;
    gw_http_server_set_limits(srv, limits);
    srv->handler = *handler;
    srv->ud = ud;
    if (!(srv->sweep_ev = event_new(base, -1, 0, on_sweep, srv)) || gw_h2_server_init(srv)) {
        gw_http_server_free(srv);
        return NULL;
    }
    return srv;
}

int gw_http_server_listen(gw_http_server *srv, const char *spec, char *err, size_t err_len)
{
    return gw_listener_add(srv, spec, NULL, err, err_len);
}

int gw_http_server_listen_tls(gw_http_server *srv, const char *spec, const char *cert_file,
                              const char *key_file, char *err, size_t err_len)
{
    return gw_http_server_listen_tls_peer(srv, spec, cert_file, key_file, NULL, NULL, 0, err, err_len);
}

int gw_http_server_set_tls(gw_http_server *srv, int index, const char *cert_file, const char *key_file,
                           const char *client_ca, const char *const *peer_names, int n_peer_names, char *err,
                           size_t err_len)
{
    gw_listener *l = srv->listeners;
    while (l && l->index != index)
        l = l->next;
    if (!l || !l->tls) {
        snprintf(err, err_len, "listener %d is not a TLS listener", index);
        return -EINVAL;
    }
    struct ssl_ctx_st *ctx;
    int rc = gw_tls_ctx_new(cert_file, key_file, client_ca, peer_names, n_peer_names, &ctx, err, err_len);
    if (rc)
        return rc;
    /* Connections made under the old context hold their own reference. */
    gw_tls_ctx_free(l->tls);
    l->tls = ctx;
    return 0;
}

int gw_http_server_listen_tls_peer(gw_http_server *srv, const char *spec, const char *cert_file,
                                   const char *key_file, const char *client_ca, const char *const *peer_names,
                                   int n_peer_names, char *err, size_t err_len)
{
    struct ssl_ctx_st *ctx;
    int rc = gw_tls_ctx_new(cert_file, key_file, client_ca, peer_names, n_peer_names, &ctx, err, err_len);
    if (rc)
        return rc;
    return gw_listener_add(srv, spec, ctx, err, err_len);
}

int gw_http_server_port(const gw_http_server *srv)
{
    return srv->port;
}

void gw_http_server_drain(gw_http_server *srv)
{
    gw_listener_free_all(srv);
    srv->draining = true;
    for (gw_http_conn *c = srv->conns, *next; c; c = next) {
        next = c->next; /* draining may free c */
        c->proto->drain(c);
    }
}

size_t gw_http_server_active_streams(const gw_http_server *srv)
{
    return srv->active_streams;
}

bool gw_http_server_has_conns(const gw_http_server *srv)
{
    for (const gw_http_conn *c = srv->conns; c; c = c->next)
        if (c->proto != &undecided)
            return true;
    return false;
}

void gw_http_server_free(gw_http_server *srv)
{
    if (!srv)
        return;
    gw_listener_free_all(srv);
    while (srv->conns)
        gw_conn_free(srv->conns);
    gw_h2_server_dispose(srv);
    if (srv->sweep_ev)
        event_free(srv->sweep_ev);
    free(srv);
}

/* ---- the application's side of a stream ---- */

void gw_http_set_user(gw_http_stream *s, void *stream_ud)
{
    s->user = stream_ud;
}

const char *gw_http_header_get(const gw_http_request *req, const char *name)
{
    /* The first byte settles most mismatches without a call. */
    for (size_t i = 0; i < req->n_headers; i++)
        if (req->headers[i].name[0] == name[0] && !strcmp(req->headers[i].name, name))
            return req->headers[i].value;
    return NULL;
}

static int hex_digit(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

bool gw_http_segment_is(const char *seg, size_t seg_len, const char *name)
{
    size_t i = 0;
    for (; i < seg_len && *name; name++) {
        int c = (unsigned char)seg[i++];
        if (c == '%') {
            int hi = i + 1 < seg_len ? hex_digit(seg[i]) : -1, lo = hi >= 0 ? hex_digit(seg[i + 1]) : -1;
            if (lo < 0)
                return false;
            c = hi << 4 | lo;
            i += 2;
        }
        if (c != (unsigned char)*name)
            return false;
    }
    return i == seg_len && !*name;
}

/* -EPIPE when the stream is gone (its on_close is due), -EINVAL when the
 * call does not fit the response's state. */
static int stream_check(const gw_http_stream *s)
{
    if (s->state == GW_SS_CLOSED || s->reset || s->conn->dead)
        return -EPIPE;
    return s->state == GW_SS_APP ? 0 : -EINVAL;
}

static int stream_start(gw_http_stream *s, int status, const gw_http_header *headers, size_t n_headers,
                        const void *body, size_t body_len, bool whole, int64_t length)
{
    int rc = stream_check(s);
    if (rc)
        return rc;
    if (s->resp_started)
        return -EINVAL;
    return s->conn->proto->submit(s, status, headers, n_headers, body, body_len, whole, length);
}

int gw_http_respond(gw_http_stream *s, int status, const gw_http_header *headers, size_t n_headers,
                    const void *body, size_t body_len)
{
    return stream_start(s, status, headers, n_headers, body, body_len, true, -1);
}

int gw_http_begin(gw_http_stream *s, int status, const gw_http_header *headers, size_t n_headers)
{
    return stream_start(s, status, headers, n_headers, NULL, 0, false, -1);
}

int gw_http_begin_length(gw_http_stream *s, int status, const gw_http_header *headers, size_t n_headers,
                         uint64_t length)
{
    if (length > INT64_MAX)
        return -EINVAL;
    return stream_start(s, status, headers, n_headers, NULL, 0, false, (int64_t)length);
}

int gw_http_write(gw_http_stream *s, const void *data, size_t len)
{
    int rc = stream_check(s);
    if (rc)
        return rc;
    if (!s->resp_started || s->resp_ended || (len && !data))
        return -EINVAL;
    if (s->sized && !s->bodiless && len > s->resp_left)
        return -EINVAL; /* past the length said */
    const gw_http_limits *lim = &s->conn->srv->limits;
    size_t max = lim->max_stream_buffer, pending = gw_http_pending(s);
    size_t conn_held = s->conn->h2_out_held, srv_held = s->conn->srv->h2_out_held;
    if (pending > max || len > max - pending || len > lim->max_conn_buffer - conn_held ||
        len > lim->max_buffer - srv_held)
        return -ENOBUFS;
    if (len == 0)
        return 0;
    rc = s->conn->proto->write(s, data, len);
    if (!rc && s->sized && !s->bodiless)
        s->resp_left -= len;
    if (!rc)
        gw_http_full(s); /* marks a producer that should pause now for on_writable */
    return rc;
}

bool gw_conn_full(const gw_http_conn *c)
{
    const gw_http_server *srv = c->srv;
    const size_t srv_half = srv->limits.max_buffer / 2;
    return c->h2_out_held > srv->limits.max_conn_buffer / 2 ||
           (srv->h2_out_held > srv_half && c->h2_out_held > srv_half / (srv->n_conns ? srv->n_conns : 1));
}

bool gw_http_full(gw_http_stream *s)
{
    /* A producer told so waits for on_writable, whether it wrote or not. */
    if (gw_http_pending(s) > s->conn->srv->limits.max_stream_buffer / 2 || gw_conn_full(s->conn))
        return s->above_half = true;
    return false;
}

int gw_http_end(gw_http_stream *s)
{
    int rc = stream_check(s);
    if (rc)
        return rc;
    if (!s->resp_started || s->resp_ended)
        return -EINVAL;
    if (s->sized && !s->bodiless && s->resp_left)
        return -EPIPE; /* short of the length said: only a reset tells the client */
    return s->conn->proto->end(s);
}

int gw_http_end_trailers(gw_http_stream *s, const gw_http_header *trailers, size_t n)
{
    int rc = stream_check(s);
    if (rc)
        return rc;
    if (n > GW_HTTP_MAX_TRAILERS || (n && !trailers) || !s->resp_started || s->resp_ended)
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        const char *name = trailers[i].name, *value = trailers[i].value;
        if (!name[0] || name[0] == ':' || !value)
            return -EINVAL;
        if (!(s->trailers[2 * i] = gw_arena_strndup(&s->arena, name, strlen(name))) ||
            !(s->trailers[2 * i + 1] = gw_arena_strndup(&s->arena, value, strlen(value))))
            return -ENOMEM;
    }
    s->n_trailers = n;
    return gw_http_end(s);
}

size_t gw_http_pending(const gw_http_stream *s)
{
    return s->conn->proto->pending(s);
}

void gw_http_reset(gw_http_stream *s)
{
    if (stream_check(s))
        return;
    s->conn->proto->reset(s);
}
