/* HTTP/2 server sessions: h2c with prior knowledge, one nghttp2 server
 * session per connection on a libevent bufferevent (the wiring of nghttp2's
 * examples/libevent-server.c, with h2o's discipline on top: a soft maximum
 * on the output buffer, deferred close, streams whose on_close runs outside
 * nghttp2). See gateway/http_internal.h for ownership and the rules on
 * which calls may happen where. */
#include "gateway/http_internal.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/util.h>

/* Linger bound for a connection whose last frames (GOAWAY) wait for a peer
 * that does not read. */
#define GW_HTTP_LINGER_MS 5000

static const uint8_t empty_body[1];

void gw_http_limits_default(gw_http_limits *l)
{
    l->max_body = 1 << 20;
    l->max_concurrent_streams = 256;
    l->max_header_list = 64 << 10;
    l->max_stream_buffer = 1 << 20;
    l->idle_timeout_ms = 120000;
}

/* ---- per-stream arena for request strings ---- */

struct gw_arena_chunk {
    gw_arena_chunk *next;
    size_t used, cap;
    char data[];
};

static char *arena_strndup(gw_arena_chunk **head, const uint8_t *p, size_t n)
{
    gw_arena_chunk *c = *head;
    if (!c || c->cap - c->used < n + 1) {
        size_t cap = n + 1 > 4000 ? n + 1 : 4000;
        if (!(c = malloc(sizeof(*c) + cap)))
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
        free(c);
        c = next;
    }
}

/* ---- streams ---- */

static void conn_schedule_send(gw_http_conn *c)
{
    if (!c->dead)
        event_active(c->send_ev, EV_WRITE, 0);
}

static void conn_arm_idle(gw_http_conn *c)
{
    if (c->lingering || c->goaway || c->dead)
        return;
    int ms = c->srv->limits.idle_timeout_ms;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    if (event_add(c->idle_ev, &tv))
        c->broken = true;
}

static gw_http_stream *stream_new(gw_http_conn *c, int32_t id)
{
    gw_http_stream *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->conn = c;
    s->id = id;
    s->state = GW_SS_HEADERS;
    s->next = c->streams;
    if (c->streams)
        c->streams->prev = s;
    c->streams = s;
    if (c->n_streams++ == 0 && !c->lingering && !c->goaway)
        event_del(c->idle_ev);
    c->srv->active_streams++;
    return s;
}

static void stream_free(gw_http_stream *s)
{
    arena_free(s->arena);
    free(s->headers);
    free(s->body);
    if (s->out)
        evbuffer_free(s->out);
    free(s);
}

/* nghttp2 (or the connection's end) closed the stream. The application's
 * streams wait in conn->closed for conn_flush_closed; others go now. */
static void stream_closed(gw_http_stream *s, bool finished)
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
    if (--c->n_streams == 0)
        conn_arm_idle(c);
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

/* Runs on_close for the streams nghttp2 closed; never with an nghttp2 call
 * on the stack, so the handler may call any gw_http_* function. */
static void conn_flush_closed(gw_http_conn *c)
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
    if (s->resp_ended && n == have)
        *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

/* Submits response headers, with `body` queued when given. With `whole`,
 * the response ends after the body. 0, -EINVAL or -ENOMEM. */
static int stream_submit(gw_http_stream *s, int status, const gw_http_header *headers, size_t n_headers,
                         const void *body, size_t body_len, bool whole)
{
    if (status < 100 || status > 999 || (n_headers && !headers) || (body_len && !body))
        return -EINVAL;
    if (!s->out && !(s->out = evbuffer_new()))
        return -ENOMEM;
    nghttp2_nv stack_nv[16], *nv = stack_nv;
    if (n_headers + 1 > sizeof(stack_nv) / sizeof(stack_nv[0])) {
        if (n_headers > SIZE_MAX / sizeof(*nv) - 1 || !(nv = malloc((n_headers + 1) * sizeof(*nv))))
            return -ENOMEM;
    }
    char st[4];
    snprintf(st, sizeof(st), "%d", status);
    nv[0] = (nghttp2_nv){(uint8_t *)":status", (uint8_t *)st, 7, 3, NGHTTP2_NV_FLAG_NONE};
    for (size_t i = 0; i < n_headers; i++)
        nv[i + 1] = (nghttp2_nv){(uint8_t *)headers[i].name, (uint8_t *)headers[i].value,
                                 strlen(headers[i].name), strlen(headers[i].value), NGHTTP2_NV_FLAG_NONE};
    int rc = -ENOMEM;
    if (body_len && evbuffer_add(s->out, body, body_len))
        goto out;
    nghttp2_data_provider dp = {.source.ptr = s, .read_callback = data_read_cb};
    s->resp_ended = whole;
    int rv = nghttp2_submit_response(s->conn->ngh, s->id, nv, n_headers + 1, whole && !body_len ? NULL : &dp);
    if (rv) {
        evbuffer_drain(s->out, body_len);
        s->resp_ended = false;
        rc = rv == NGHTTP2_ERR_NOMEM ? -ENOMEM : -EINVAL;
        goto out;
    }
    s->resp_started = true;
    rc = 0;
out:
    if (nv != stack_nv)
        free(nv);
    return rc;
}

/* The server answers instead of the application (the request never
 * reaches it): a JSON error in the OpenAI shape. */
static void stream_reject(gw_http_stream *s, int status, const char *message, const char *code)
{
    static const gw_http_header hdr[] = {{"content-type", "application/json"}};
    char body[320];
    s->state = GW_SS_REJECTED;
    free(s->body);
    s->body = NULL;
    s->body_len = s->body_cap = 0;
    int n = snprintf(body, sizeof(body),
                     "{\"error\":{\"message\":\"%s\",\"type\":\"invalid_request_error\",\"param\":null,"
                     "\"code\":\"%s\"}}",
                     message, code);
    if (stream_submit(s, status, hdr, 1, body, (size_t)n, true) &&
        nghttp2_submit_rst_stream(s->conn->ngh, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_INTERNAL_ERROR))
        s->conn->broken = true;
}

static void stream_fail(gw_http_stream *s)
{
    s->state = GW_SS_REJECTED;
    if (nghttp2_submit_rst_stream(s->conn->ngh, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_INTERNAL_ERROR))
        s->conn->broken = true;
}

static void stream_reject_body(gw_http_stream *s)
{
    char msg[96];
    snprintf(msg, sizeof(msg), "request body larger than %zu bytes", s->conn->srv->limits.max_body);
    stream_reject(s, 413, msg, "request_too_large");
}

/* ---- request assembly (nghttp2 callbacks) ---- */

static gw_http_stream *stream_of(nghttp2_session *ngh, int32_t id)
{
    return nghttp2_session_get_stream_user_data(ngh, id);
}

static int on_begin_headers_cb(nghttp2_session *ngh, const nghttp2_frame *frame, void *ud)
{
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    gw_http_stream *s = stream_new(ud, frame->hd.stream_id);
    if (!s)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE; /* RST_STREAM INTERNAL_ERROR */
    if (nghttp2_session_set_stream_user_data(ngh, frame->hd.stream_id, s))
        stream_closed(s, false); /* nghttp2 holds no such stream: nothing will close it */
    return 0;
}

static bool name_is(const uint8_t *name, size_t len, const char *lit)
{
    return strlen(lit) == len && !memcmp(name, lit, len);
}

static int on_header_cb(nghttp2_session *ngh, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
                        const uint8_t *value, size_t valuelen, uint8_t flags, void *ud)
{
    gw_http_stream *s;
    if (frame->hd.type != NGHTTP2_HEADERS || !(s = stream_of(ngh, frame->hd.stream_id)))
        return 0;
    if (s->state != GW_SS_HEADERS && s->state != GW_SS_BODY)
        return 0;
    /* Counted as SETTINGS_MAX_HEADER_LIST_SIZE counts (RFC 9113 6.5.2);
     * HPACK bounds each field, so the sum cannot wrap. */
    s->header_bytes += namelen + valuelen + 32;
    if (s->header_bytes > s->conn->srv->limits.max_header_list)
        s->reject_status = 431;
    if (s->reject_status || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0; /* trailers are counted, not kept */
    if (namelen && name[0] == ':') {
        const char **slot = name_is(name, namelen, ":method")      ? &s->method
                            : name_is(name, namelen, ":path")      ? &s->path
                            : name_is(name, namelen, ":authority") ? &s->authority
                                                                   : NULL;
        if (slot && !(*slot = arena_strndup(&s->arena, value, valuelen)))
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
        return 0;
    }
    if (s->n_headers == s->cap_headers) {
        size_t cap = s->cap_headers ? s->cap_headers * 2 : 16;
        gw_http_header *h = realloc(s->headers, cap * sizeof(*h));
        if (!h)
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
        s->headers = h;
        s->cap_headers = cap;
    }
    gw_http_header *h = &s->headers[s->n_headers];
    if (!(h->name = arena_strndup(&s->arena, name, namelen)) ||
        !(h->value = arena_strndup(&s->arena, value, valuelen)))
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    s->n_headers++;
    return 0;
}

static void request_headers_done(gw_http_stream *s)
{
    const gw_http_limits *lim = &s->conn->srv->limits;
    if (s->reject_status) {
        char msg[96];
        snprintf(msg, sizeof(msg), "request headers larger than %zu bytes", lim->max_header_list);
        stream_reject(s, 431, msg, "request_header_fields_too_large");
        return;
    }
    if (!s->method || !s->path) { /* nghttp2 lets CONNECT through without :path */
        stream_reject(s, 400, "request lacks :method or :path", "invalid_request");
        return;
    }
    if (!s->authority)
        s->authority =
            gw_http_header_get(&(gw_http_request){.headers = s->headers, .n_headers = s->n_headers}, "host");
    s->state = GW_SS_BODY;
    /* nghttp2 checked that content-length is a number and will check it
     * against the DATA that follows. A large one is grown into as the data
     * comes, so that a claim alone does not reserve max_body. */
    const char *cl = gw_http_header_get(&(gw_http_request){.headers = s->headers, .n_headers = s->n_headers},
                                        "content-length");
    if (cl) {
        unsigned long long n = strtoull(cl, NULL, 10);
        if (n > lim->max_body) {
            stream_reject_body(s);
        } else if (n > 0) {
            size_t cap = n < 65536 ? (size_t)n : 65536;
            if (!(s->body = malloc(cap)))
                stream_fail(s);
            else
                s->body_cap = cap;
        }
    }
}

static void request_complete(gw_http_stream *s)
{
    if (s->state != GW_SS_BODY)
        return;
    if (s->reject_status) { /* trailers too large */
        request_headers_done(s);
        return;
    }
    gw_http_server *srv = s->conn->srv;
    s->req = (gw_http_request){
        .method = s->method,
        .path = s->path,
        .authority = s->authority,
        .headers = s->headers,
        .n_headers = s->n_headers,
        .body = s->body ? s->body : empty_body,
        .body_len = s->body_len,
    };
    s->state = GW_SS_APP;
    srv->handler.on_request(srv->ud, s, &s->req);
}

static int on_data_chunk_recv_cb(nghttp2_session *ngh, uint8_t flags, int32_t id, const uint8_t *data,
                                 size_t len, void *ud)
{
    gw_http_stream *s = stream_of(ngh, id);
    if (!s || s->state != GW_SS_BODY)
        return 0;
    size_t max = s->conn->srv->limits.max_body;
    if (len > max - s->body_len) {
        stream_reject_body(s);
        return 0;
    }
    if (s->body_len + len > s->body_cap) {
        size_t cap = s->body_cap < 16384 ? 16384 : s->body_cap;
        while (cap < s->body_len + len)
            cap = cap > SIZE_MAX / 2 ? SIZE_MAX : cap * 2;
        if (cap > max)
            cap = max;
        uint8_t *b = realloc(s->body, cap);
        if (!b) {
            stream_fail(s);
            return 0;
        }
        s->body = b;
        s->body_cap = cap;
    }
    memcpy(s->body + s->body_len, data, len);
    s->body_len += len;
    return 0;
}

static int on_frame_recv_cb(nghttp2_session *ngh, const nghttp2_frame *frame, void *ud)
{
    if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA)
        return 0;
    gw_http_stream *s = stream_of(ngh, frame->hd.stream_id);
    if (!s)
        return 0;
    if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_REQUEST &&
        s->state == GW_SS_HEADERS)
        request_headers_done(s);
    if (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) {
        s->remote_ended = true;
        request_complete(s);
    }
    return 0;
}

static int on_frame_send_cb(nghttp2_session *ngh, const nghttp2_frame *frame, void *ud)
{
    if ((frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA) ||
        !(frame->hd.flags & NGHTTP2_FLAG_END_STREAM))
        return 0;
    gw_http_stream *s = stream_of(ngh, frame->hd.stream_id);
    if (!s)
        return 0;
    /* A rejected upload is not cut short with RST_STREAM(NO_ERROR) as
     * RFC 9113 8.1 allows: curl 7.88 takes it for a failure. The rest of
     * the body is read and dropped; flow control is refilled as it comes. */
    s->fin_sent = true;
    return 0;
}

static int on_stream_close_cb(nghttp2_session *ngh, int32_t id, uint32_t error_code, void *ud)
{
    gw_http_stream *s = stream_of(ngh, id);
    if (s)
        stream_closed(s, s->fin_sent);
    return 0;
}

/* ---- connections ---- */

static void conn_free(gw_http_conn *c)
{
    gw_http_server *srv = c->srv;
    c->dead = true;
    /* nghttp2_session_del runs no callbacks: close our streams ourselves. */
    if (c->ngh)
        nghttp2_session_del(c->ngh);
    c->ngh = NULL;
    while (c->streams)
        stream_closed(c->streams, false);
    conn_flush_closed(c);
    if (c->send_ev)
        event_free(c->send_ev);
    if (c->idle_ev)
        event_free(c->idle_ev);
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

/* Moves frames from nghttp2 to the output until it is above the soft
 * maximum; the write callback comes back for the rest. While the output is
 * that full the peer is not reading, so we stop reading too (h2o). */
static int conn_send(gw_http_conn *c)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);
    while (evbuffer_get_length(out) < GW_HTTP_OUT_SOFT_MAX) {
        const uint8_t *data;
        ssize_t n = nghttp2_session_mem_send(c->ngh, &data);
        if (n < 0)
            return -1;
        if (n == 0)
            break;
        if (evbuffer_add(out, data, (size_t)n))
            return -1;
    }
    if (evbuffer_get_length(out) >= GW_HTTP_OUT_SOFT_MAX && !c->read_paused) {
        c->read_paused = true;
        bufferevent_disable(c->bev, EV_READ);
    }
    return 0;
}

/* The end of every loop callback of a connection: on_close for the streams
 * nghttp2 closed, then the connection goes if it failed or if nghttp2 is
 * done with it and the output drained. */
static void conn_settle(gw_http_conn *c, int rc)
{
    if (rc || c->broken) {
        conn_free(c);
        return;
    }
    conn_flush_closed(c);
    if (c->broken) {
        conn_free(c);
        return;
    }
    if (nghttp2_session_want_read(c->ngh) || nghttp2_session_want_write(c->ngh))
        return;
    if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0) {
        conn_free(c);
        return;
    }
    if (!c->lingering) {
        c->lingering = true;
        bufferevent_disable(c->bev, EV_READ);
        bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
        struct timeval tv = {GW_HTTP_LINGER_MS / 1000, 0};
        if (event_add(c->idle_ev, &tv))
            conn_free(c);
    }
}

static void on_read(struct bufferevent *bev, void *arg)
{
    gw_http_conn *c = arg;
    int rc = conn_recv(c);
    if (!rc)
        rc = conn_send(c);
    conn_settle(c, rc);
}

static void on_write(struct bufferevent *bev, void *arg)
{
    gw_http_conn *c = arg;
    int rc = conn_send(c);
    if (!rc && c->read_paused && !c->lingering &&
        evbuffer_get_length(bufferevent_get_output(bev)) < GW_HTTP_OUT_SOFT_MAX) {
        c->read_paused = false;
        if (bufferevent_enable(bev, EV_READ))
            rc = -1;
    }
    conn_settle(c, rc);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    /* EOF, error, or no write progress for idle_timeout_ms: the peer is
     * gone or not reading, and its streams end unfinished. */
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT))
        conn_free(arg);
}

static void on_send_ev(evutil_socket_t fd, short what, void *arg)
{
    gw_http_conn *c = arg;
    conn_settle(c, conn_send(c));
}

static void on_idle(evutil_socket_t fd, short what, void *arg)
{
    gw_http_conn *c = arg;
    if (c->lingering || c->goaway) {
        conn_free(c);
        return;
    }
    if (c->n_streams > 0)
        return;
    c->goaway = true;
    if (nghttp2_session_terminate_session(c->ngh, NGHTTP2_NO_ERROR)) {
        conn_free(c);
        return;
    }
    /* Bound the wait for the GOAWAY to go out. */
    struct timeval tv = {GW_HTTP_LINGER_MS / 1000, 0};
    conn_settle(c, event_add(c->idle_ev, &tv) ? -1 : conn_send(c));
}

static int conn_session_new(gw_http_conn *c)
{
    const gw_http_limits *lim = &c->srv->limits;
    if (nghttp2_session_server_new2(&c->ngh, c->srv->cbs, c, c->srv->opt))
        return -1;
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, lim->max_concurrent_streams},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE,
         lim->max_header_list > UINT32_MAX ? UINT32_MAX : (uint32_t)lim->max_header_list},
        {NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES, 1},
    };
    return nghttp2_submit_settings(c->ngh, NGHTTP2_FLAG_NONE, iv, sizeof(iv) / sizeof(iv[0])) ? -1 : 0;
}

int gw_http_server_adopt(gw_http_server *srv, int fd)
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
    if (!(c->bev = bufferevent_socket_new(srv->base, fd, BEV_OPT_CLOSE_ON_FREE))) {
        evutil_closesocket(fd);
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
    c->idle_ev = evtimer_new(srv->base, on_idle, c);
    if (!c->send_ev || !c->idle_ev || conn_session_new(c) || bufferevent_set_timeouts(c->bev, NULL, &wt) ||
        bufferevent_enable(c->bev, EV_READ | EV_WRITE)) {
        conn_free(c);
        return -ENOMEM;
    }
    bufferevent_setcb(c->bev, on_read, on_write, on_event, c);
    bufferevent_setwatermark(c->bev, EV_WRITE, GW_HTTP_OUT_LOW_WATER, 0);
    conn_arm_idle(c);
    conn_schedule_send(c); /* our SETTINGS */
    if (c->broken) {
        conn_free(c);
        return -ENOMEM;
    }
    return 0;
}

/* ---- server ---- */

gw_http_server *gw_http_server_new(struct event_base *base, const gw_http_limits *limits,
                                   const gw_http_handler *handler, void *ud)
{
    if (!base || !handler || !handler->on_request)
        return NULL;
    gw_http_server *srv = calloc(1, sizeof(*srv));
    if (!srv)
        return NULL;
    srv->base = base;
    gw_http_limits_default(&srv->limits);
    if (limits) { /* zero means "the default" */
        const gw_http_limits *l = limits;
        if (l->max_body)
            srv->limits.max_body = l->max_body;
        if (l->max_concurrent_streams)
            srv->limits.max_concurrent_streams = l->max_concurrent_streams;
        if (l->max_header_list)
            srv->limits.max_header_list = l->max_header_list;
        if (l->max_stream_buffer)
            srv->limits.max_stream_buffer = l->max_stream_buffer;
        if (l->idle_timeout_ms > 0)
            srv->limits.idle_timeout_ms = l->idle_timeout_ms;
    }
    srv->handler = *handler;
    srv->ud = ud;
    if (nghttp2_session_callbacks_new(&srv->cbs) || nghttp2_option_new(&srv->opt)) {
        gw_http_server_free(srv);
        return NULL;
    }
    nghttp2_session_callbacks *cb = srv->cbs;
    nghttp2_session_callbacks_set_on_begin_headers_callback(cb, on_begin_headers_cb);
    nghttp2_session_callbacks_set_on_header_callback(cb, on_header_cb);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data_chunk_recv_cb);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame_recv_cb);
    nghttp2_session_callbacks_set_on_frame_send_callback(cb, on_frame_send_cb);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_stream_close_cb);
    /* Flood bounds (nghttp2's defaults, stated): queued SETTINGS/PING
     * ACKs, SETTINGS entries per frame, CONTINUATIONs per HEADERS, and the
     * RST_STREAM token bucket against rapid reset (CVE-2023-44487). */
    nghttp2_option_set_no_closed_streams(srv->opt, 1);
    nghttp2_option_set_max_outbound_ack(srv->opt, 1000);
    nghttp2_option_set_max_settings(srv->opt, 32);
    nghttp2_option_set_max_continuations(srv->opt, 8);
    nghttp2_option_set_stream_reset_rate_limit(srv->opt, 1000, 33);
    return srv;
}

int gw_http_server_listen(gw_http_server *srv, const char *spec, char *err, size_t err_len)
{
    return gw_listener_add(srv, spec, err, err_len);
}

int gw_http_server_port(const gw_http_server *srv)
{
    return srv->port;
}

void gw_http_server_stop_listening(gw_http_server *srv)
{
    gw_listener_free_all(srv);
}

size_t gw_http_server_active_streams(const gw_http_server *srv)
{
    return srv->active_streams;
}

void gw_http_server_free(gw_http_server *srv)
{
    if (!srv)
        return;
    gw_listener_free_all(srv);
    while (srv->conns)
        conn_free(srv->conns);
    if (srv->opt)
        nghttp2_option_del(srv->opt);
    if (srv->cbs)
        nghttp2_session_callbacks_del(srv->cbs);
    free(srv);
}

/* ---- the application's side of a stream: buffer and schedule only ---- */

void gw_http_set_user(gw_http_stream *s, void *stream_ud)
{
    s->user = stream_ud;
}

const char *gw_http_header_get(const gw_http_request *req, const char *name)
{
    for (size_t i = 0; i < req->n_headers; i++)
        if (!strcmp(req->headers[i].name, name))
            return req->headers[i].value;
    return NULL;
}

/* -EPIPE when the stream is gone (its on_close is due), -EINVAL when the
 * call does not fit the response's state. */
static int stream_check(const gw_http_stream *s)
{
    if (s->state == GW_SS_CLOSED || s->reset || s->conn->dead)
        return -EPIPE;
    return s->state == GW_SS_APP ? 0 : -EINVAL;
}

static void stream_kick(gw_http_stream *s)
{
    if (s->deferred) {
        s->deferred = false;
        nghttp2_session_resume_data(s->conn->ngh, s->id);
    }
    conn_schedule_send(s->conn);
}

int gw_http_respond(gw_http_stream *s, int status, const gw_http_header *headers, size_t n_headers,
                    const void *body, size_t body_len)
{
    int rc = stream_check(s);
    if (rc)
        return rc;
    if (s->resp_started)
        return -EINVAL;
    if ((rc = stream_submit(s, status, headers, n_headers, body, body_len, true)))
        return rc;
    conn_schedule_send(s->conn);
    return 0;
}

int gw_http_begin(gw_http_stream *s, int status, const gw_http_header *headers, size_t n_headers)
{
    int rc = stream_check(s);
    if (rc)
        return rc;
    if (s->resp_started)
        return -EINVAL;
    if ((rc = stream_submit(s, status, headers, n_headers, NULL, 0, false)))
        return rc;
    conn_schedule_send(s->conn);
    return 0;
}

int gw_http_write(gw_http_stream *s, const void *data, size_t len)
{
    int rc = stream_check(s);
    if (rc)
        return rc;
    if (!s->resp_started || s->resp_ended || (len && !data))
        return -EINVAL;
    size_t max = s->conn->srv->limits.max_stream_buffer, pending = evbuffer_get_length(s->out);
    if (pending > max || len > max - pending)
        return -ENOBUFS;
    if (len == 0)
        return 0;
    if (evbuffer_add(s->out, data, len))
        return -ENOMEM;
    stream_kick(s);
    return 0;
}

int gw_http_end(gw_http_stream *s)
{
    int rc = stream_check(s);
    if (rc)
        return rc;
    if (!s->resp_started || s->resp_ended)
        return -EINVAL;
    s->resp_ended = true;
    stream_kick(s);
    return 0;
}

size_t gw_http_pending(const gw_http_stream *s)
{
    return s->out ? evbuffer_get_length(s->out) : 0;
}

void gw_http_reset(gw_http_stream *s)
{
    if (stream_check(s))
        return;
    s->reset = true;
    if (nghttp2_submit_rst_stream(s->conn->ngh, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_INTERNAL_ERROR))
        s->conn->broken = true; /* no memory for the frame: drop the connection, and the stream with it */
    conn_schedule_send(s->conn);
}
