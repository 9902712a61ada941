/* HTTP/2 requests: nghttp2's callbacks that open a server stream, gather
 * its request (headers, body), hand it to the application, and close it;
 * the bounds a stream and its connection are held to while they do (the
 * header list, the header and body room of a connection, the deadlines
 * the connection's timer checks) and the server's own answers when one is
 * exceeded (400, 408, 413, 414, 431, REFUSED_STREAM). The connection, its
 * I/O and the responses are http2.c's. See gateway/http/http_internal.h
 * for ownership and the rules on which calls may happen where. */
#include "gateway/http/http_internal.h"
#include "gateway/base/clock.h"
#include "gateway/base/mem.h"
#include "gateway/base/oai_error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bytes of request headers (names and values) a connection's open streams
 * may keep together: at least 4 x max_header_list. 256 streams of 4 KiB
 * each fit. */
#define H2_CONN_HEADER_BUDGET ((size_t)1 << 20)
/* reject_status for a stream refused (RST_STREAM REFUSED_STREAM) once its
 * headers are in: the budget above was spent. Not an HTTP status. */
#define H2_REJECT_REFUSE 1
/* The window of limits.max_cut_streams (conn_count_cut). */
#define H2_CUT_WINDOW_MS 10000

/* ---- stream bounds ---- */

/* Sets the stream's bound and makes sure the connection's timer comes by
 * then. The timer only ever moves earlier here; when it fires it finds
 * the next bound (a stream that moved on has a later one by then). */
static void stream_due(gw_http_stream *s, int64_t due)
{
    gw_http_conn *c = s->conn;
    s->due_ms = due;
    if (!due || c->lingering || c->goaway || c->dead || (c->h2_check_ms && c->h2_check_ms <= due))
        return;
    c->h2_check_ms = due;
    int64_t ms = due - gw_mono_coarse_ms();
    gw_conn_set_timer(c, ms > 0 ? (int)ms : 0);
}

void gw_h2_stream_due_idle(gw_http_stream *s)
{
    int64_t due = gw_mono_coarse_ms() + s->conn->srv->limits.idle_timeout_ms;
    /* An answered request's body is read and dropped for a bounded time
     * in all, as HTTP/1 lingers, not for as long as it keeps coming. */
    if (s->drop_until_ms && due > s->drop_until_ms)
        due = s->drop_until_ms;
    stream_due(s, due);
}

/* The stream stops receiving its request body: the body leaves the
 * connection's count, and no bound is left on it until it answers. */
static void stream_body_done(gw_http_stream *s)
{
    if (s->state == GW_SS_BODY)
        s->conn->h2_body_bytes -= s->body_len;
    s->due_ms = 0;
}

void gw_h2_arm_idle(gw_http_conn *c)
{
    /* The idle timer takes over from the streams' bounds. */
    if (!c->lingering && !c->goaway && !c->dead) {
        c->h2_check_ms = 0;
        gw_conn_set_timer(c, gw_conn_idle_ms(c));
    }
}

/* ---- the server's answers ---- */

/* Answered with its body still coming: the rest is read and dropped, each
 * piece due within idle_timeout_ms and all of it within
 * GW_HTTP_LINGER_MS from now. From now, not from when the answer's end
 * goes out: a peer that keeps its window shut holds that back, and a
 * byte of body now and then kept such a stream open for ever. */
static void stream_drop_rest(gw_http_stream *s)
{
    if (!s->drop_until_ms)
        s->drop_until_ms = gw_mono_coarse_ms() + GW_HTTP_LINGER_MS;
    gw_h2_stream_due_idle(s);
}

/* The request will never reach the application: what came of its body goes. */
static void stream_drop_request(gw_http_stream *s)
{
    stream_body_done(s);
    s->state = GW_SS_REJECTED;
    gw_mem_free(s->body);
    s->body = NULL;
    s->body_len = s->body_cap = 0;
}

/* The server answers instead of the application (the request never
 * reaches it). */
static void stream_reject(gw_http_stream *s, int status, const char *message, const char *code)
{
    static const gw_http_header hdr[] = {{"content-type", "application/json"}};
    char body[320];
    gw_server_refused(s->conn->srv, status, s, "HTTP/2");
    stream_drop_request(s);
    size_t n = gw_oai_error_write(body, sizeof(body), message, "invalid_request_error", NULL, code);
    if (gw_h2_submit_response(s, status, hdr, 1, body, n, true, -1) &&
        nghttp2_submit_rst_stream(s->conn->ngh, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_INTERNAL_ERROR))
        s->conn->broken = true;
    else if (!s->remote_ended)
        stream_drop_rest(s);
}

static void stream_fail(gw_http_stream *s)
{
    stream_body_done(s);
    s->state = GW_SS_REJECTED;
    if (nghttp2_submit_rst_stream(s->conn->ngh, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_INTERNAL_ERROR))
        s->conn->broken = true;
}

/* Refused before the application saw it: a client may send it again
 * (RFC 9113 8.7), as nghttp2's and curl's do by themselves. */
static void stream_refuse(gw_http_stream *s)
{
    gw_server_refused(s->conn->srv, 0, s, "HTTP/2");
    stream_drop_request(s);
    if (nghttp2_submit_rst_stream(s->conn->ngh, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_REFUSED_STREAM))
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
    gw_http_conn *c = ud;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    gw_http_stream *s = gw_stream_new(c, frame->hd.stream_id);
    if (!s)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE; /* RST_STREAM INTERNAL_ERROR */
    if (nghttp2_session_set_stream_user_data(ngh, frame->hd.stream_id, s)) {
        gw_stream_closed(s, false); /* nghttp2 holds no such stream: nothing will close it */
        return 0;
    }
    if (c->n_streams == 1)
        c->h2_check_ms = 0; /* the idle timer gives way to the streams' bounds */
    stream_due(s, gw_mono_coarse_ms() + c->srv->limits.header_timeout_ms);
    return 0;
}

static bool name_is(const uint8_t *name, size_t len, const char *lit)
{
    return strlen(lit) == len && !memcmp(name, lit, len);
}

/* Counts a field, valid or not, as SETTINGS_MAX_HEADER_LIST_SIZE counts
 * (RFC 9113 6.5.2); HPACK bounds each field, so the sum cannot wrap. Past
 * the limit the stream is answered 431; past twice the limit decoding
 * stops (false: RST): one-byte references to a large field in the HPACK
 * table made 128 KiB on the wire decode to 130,000 fields, each checked by
 * nghttp2, and a few such blocks a second held the event loop. */
static bool count_field(gw_http_stream *s, const uint8_t *name, size_t namelen, size_t valuelen)
{
    const size_t limit = s->conn->srv->limits.max_header_list;
    s->header_bytes += namelen + valuelen + 32;
    if (s->header_bytes > 2 * limit)
        return false;
    if (s->header_bytes > limit && (!s->reject_status || s->reject_status == H2_REJECT_REFUSE))
        /* Over its own limit, sending it again would not help: not refused
         * but answered, 414 when :path alone is over the limit. */
        s->reject_status = name_is(name, namelen, ":path") && namelen + valuelen + 32 > limit ? 414 : 431;
    return true;
}

static int on_header_cb(nghttp2_session *ngh, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
                        const uint8_t *value, size_t valuelen, uint8_t flags, void *ud)
{
    gw_http_stream *s;
    if (frame->hd.type != NGHTTP2_HEADERS || !(s = stream_of(ngh, frame->hd.stream_id)))
        return 0;
    gw_http_conn *c = s->conn;
    const size_t limit = c->srv->limits.max_header_list;
    if (s->state != GW_SS_HEADERS && s->state != GW_SS_BODY) {
        /* Trailers of a request already answered (401, 413...): nothing
         * is kept, but nghttp2 checks each field all the same, so the
         * block is bounded as any other is (count_field). */
        s->header_bytes += namelen + valuelen + 32;
        return s->header_bytes > 2 * limit ? NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE : 0;
    }
    if (!count_field(s, name, namelen, valuelen))
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    if (frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0; /* trailers are counted, not kept */
    if (s->reject_status) {
        /* Refused, only :method is still kept (pseudo-headers come in any
         * order): the refusal of a HEAD has no body. */
        if (!s->method && name_is(name, namelen, ":method") &&
            !(s->method = gw_arena_strndup(&s->arena, value, valuelen)))
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
        return 0;
    }
    if (namelen && name[0] == ':') {
        const char **slot = name_is(name, namelen, ":method")      ? &s->method
                            : name_is(name, namelen, ":path")      ? &s->path
                            : name_is(name, namelen, ":authority") ? &s->authority
                                                                   : NULL;
        if (slot && !(*slot = gw_arena_strndup(&s->arena, value, valuelen)))
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
        return 0;
    }
    /* What a connection's open streams keep is bounded too: 256 streams of
     * 64 KiB each, their bodies never sent, held a connection's worth of
     * memory per 17 KB on the wire. Past the budget the stream is refused
     * (not processed: the client may send it again, and a peer gateway
     * would not count it as this region failing); a peer gateway,
     * multiplexing its clients' requests, is not held to it. */
    /* A field costs its slot and terminators besides its bytes: counted
     * as 32 (as above), 2-byte empty fields on the wire no longer keep
     * five times the budget. */
    const size_t budget = 4 * limit > H2_CONN_HEADER_BUDGET ? 4 * limit : H2_CONN_HEADER_BUDGET;
    const size_t cost = namelen + valuelen + 32;
    if (c->h2_header_bytes + cost > budget && !gw_conn_peer(c)) {
        s->reject_status = H2_REJECT_REFUSE;
        return 0;
    }
    c->h2_header_bytes += cost;
    s->header_kept += cost;
    if (s->n_headers == s->cap_headers) {
        size_t cap = s->cap_headers ? s->cap_headers * 2 : 16;
        gw_http_header *h = gw_mem_realloc(s->headers, cap * sizeof(*h));
        if (!h)
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
        s->headers = h;
        s->cap_headers = cap;
    }
    gw_http_header *h = &s->headers[s->n_headers];
    if (!(h->name = gw_arena_strndup(&s->arena, name, namelen)) ||
        !(h->value = gw_arena_strndup(&s->arena, value, valuelen)))
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    s->n_headers++;
    return 0;
}

/* A field nghttp2 finds invalid (bytes HTTP forbids in a name or value):
 * answered 400, as HTTP/1 answers it, where nghttp2 alone would reset the
 * stream, uncounted and unexplained. Counted against the header limits
 * like any other field, kept no more. */
static int on_invalid_header_cb(nghttp2_session *ngh, const nghttp2_frame *frame, const uint8_t *name,
                                size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                                void *ud)
{
    gw_http_stream *s;
    if (frame->hd.type != NGHTTP2_HEADERS || !(s = stream_of(ngh, frame->hd.stream_id)) ||
        frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE; /* trailers: the reset nghttp2 would give */
    if (s->state != GW_SS_HEADERS)
        return 0;
    if (!count_field(s, name, namelen, valuelen))
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    if (!s->reject_status || s->reject_status == H2_REJECT_REFUSE)
        s->reject_status = 400;
    return 0;
}

static void request_headers_done(gw_http_stream *s, bool end_stream)
{
    const gw_http_limits *lim = &s->conn->srv->limits;
    /* Before any answer: the server's own refusals of a HEAD have no body. */
    s->head = s->method && !strcmp(s->method, "HEAD");
    if (s->reject_status == H2_REJECT_REFUSE) {
        stream_refuse(s);
        return;
    }
    if (s->reject_status == 414) {
        stream_reject(s, 414, "request target too long", "uri_too_long");
        return;
    }
    if (s->reject_status == 400) {
        stream_reject(s, 400, "malformed request header field", "invalid_request");
        return;
    }
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
    unsigned long long n = cl ? strtoull(cl, NULL, 10) : 0;
    if (n > lim->max_body) {
        stream_reject_body(s);
        return;
    }
    /* A request with a body to come is shown to on_head first (see
     * http.h); an answer there leaves the body to be dropped as it comes. */
    if (!end_stream && gw_stream_offer_head(s, "HTTP/2")) {
        s->body_dropped = true;
        stream_drop_rest(s);
        return;
    }
    size_t cap = n < 65536 ? (size_t)n : 65536;
    if (cap && !(s->body = gw_mem_alloc(cap))) {
        stream_fail(s);
        return;
    }
    s->body_cap = cap;
}

static void request_complete(gw_http_stream *s)
{
    if (s->state != GW_SS_BODY)
        return;
    if (s->reject_status) { /* trailers too large */
        request_headers_done(s, true);
        return;
    }
    gw_http_server *srv = s->conn->srv;
    stream_body_done(s);
    s->body_held = s->body_len;
    s->conn->h2_body_held += s->body_held;
    gw_stream_fill_request(s, "HTTP/2");
    s->state = GW_SS_APP;
    srv->handler.on_request(srv->ud, s, &s->req);
}

static int on_data_chunk_recv_cb(nghttp2_session *ngh, uint8_t flags, int32_t id, const uint8_t *data,
                                 size_t len, void *ud)
{
    gw_http_stream *s = stream_of(ngh, id);
    if (!s || s->state != GW_SS_BODY)
        return 0;
    gw_http_conn *c = s->conn;
    size_t max = c->srv->limits.max_body;
    if (s->body_len > max || len > max - s->body_len) { /* max may have shrunk (reload) */
        stream_reject_body(s);
        return 0;
    }
    /* The request bodies one connection holds, arriving or whole in its
     * open streams, are held to max_conn_body: 256 streams each near
     * max_body would pin 256 MiB before any of them is authenticated, and
     * answered ones stay while a peer that keeps its window shut holds
     * their answers. Past it a newer body is refused, to be sent again.
     * The oldest arriving goes on, so a connection never stalls, unless
     * whole bodies already fill the room it needs (they go as their
     * streams close). A peer gateway, multiplexing its clients' requests,
     * is not held to it. */
    const size_t room = c->srv->limits.max_conn_body;
    if (c->h2_body_bytes + c->h2_body_held + len > room && !gw_conn_peer(c)) {
        bool refuse = c->h2_body_held && c->h2_body_held + s->body_len + len > room;
        for (gw_http_stream *o = c->streams; o && !refuse; o = o->next)
            refuse = o->state == GW_SS_BODY && o->id < s->id;
        if (refuse) {
            stream_refuse(s);
            return 0;
        }
    }
    if (s->body_len + len > s->body_cap) {
        size_t cap = s->body_cap < 16384 ? 16384 : s->body_cap;
        while (cap < s->body_len + len)
            cap = cap > SIZE_MAX / 2 ? SIZE_MAX : cap * 2;
        if (cap > max)
            cap = max;
        if (cap < s->body_len + len)
            cap = s->body_len + len;
        uint8_t *b = gw_mem_realloc(s->body, cap);
        if (!b) {
            stream_fail(s);
            return 0;
        }
        s->body = b;
        s->body_cap = cap;
    }
    memcpy(s->body + s->body_len, data, len);
    s->body_len += len;
    c->h2_body_bytes += len;
    return 0;
}

static int on_frame_recv_cb(nghttp2_session *ngh, const nghttp2_frame *frame, void *ud)
{
    gw_http_conn *c = ud;
    if (!c->h2_framed) { /* the preface is in: header_timeout gives way to idle_timeout */
        c->h2_framed = true;
        if (c->n_streams == 0)
            gw_h2_arm_idle(c);
    }
    if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA)
        return 0;
    gw_http_stream *s = stream_of(ngh, frame->hd.stream_id);
    if (!s)
        return 0;
    /* ended before its head is looked at: a request refused there has no
     * body to drop, and its answer the whole idle_timeout_ms to go */
    if (frame->hd.flags & NGHTTP2_FLAG_END_STREAM)
        s->remote_ended = true;
    if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_REQUEST &&
        s->state == GW_SS_HEADERS)
        request_headers_done(s, frame->hd.flags & NGHTTP2_FLAG_END_STREAM);
    if (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) {
        request_complete(s);
    } else {
        /* The next piece of the body is due. Only a DATA frame that brought
         * some of it counts: empty ones every so often held a stream (and
         * its kept headers) open for ever. */
        bool body_due = s->state == GW_SS_BODY || s->body_dropped;
        bool moved = frame->hd.type == NGHTTP2_HEADERS
                         ? body_due
                         : (body_due || s->state == GW_SS_REJECTED) && frame->hd.length > frame->data.padlen;
        if (moved)
            gw_h2_stream_due_idle(s);
    }
    return 0;
}

static int on_frame_send_cb(nghttp2_session *ngh, const nghttp2_frame *frame, void *ud)
{
    if (frame->hd.type == NGHTTP2_RST_STREAM) {
        /* Ours go through gw_h2_reset (s->reset) or end in NO_ERROR; any
         * other is nghttp2's, for what the client sent (conn_count_cut). */
        gw_http_stream *s = stream_of(ngh, frame->hd.stream_id);
        if (s && s->state == GW_SS_APP && !s->reset && !s->fin_sent &&
            frame->rst_stream.error_code != NGHTTP2_NO_ERROR)
            s->reset_for_client = true;
        return 0;
    }
    if ((frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA) ||
        !(frame->hd.flags & NGHTTP2_FLAG_END_STREAM))
        return 0;
    gw_http_stream *s = stream_of(ngh, frame->hd.stream_id);
    if (!s)
        return 0;
    /* A rejected upload is not cut short with RST_STREAM(NO_ERROR) as
     * RFC 9113 8.1 allows: curl 7.88 takes it for a failure. The rest of
     * the body is read and dropped; flow control is refilled as it comes,
     * each piece due within idle_timeout_ms (stream_reject). A body that
     * had already stopped is closed now. */
    s->fin_sent = true;
    if (s->rst_after_fin && nghttp2_submit_rst_stream(ngh, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_NO_ERROR))
        s->conn->broken = true;
    else if ((s->body_dropped || s->state == GW_SS_REJECTED) && !s->remote_ended)
        stream_drop_rest(s);
    return 0;
}

/* nghttp2 reset a stream the application had taken, for a frame the
 * client sent that the protocol forbids there. Past limits.max_cut_streams
 * such streams in H2_CUT_WINDOW_MS, the connection is told to calm down
 * and closed. nghttp2 1.52 bounds only the RST_STREAMs a client sends
 * (rapid reset, CVE-2023-44487, by its own token bucket, which closes
 * gracefully: a client's own cancellations are left to it); a client can
 * as well make the server reset its streams ("MadeYouReset",
 * CVE-2025-8671), and each such stream cost the application its work all
 * the same. Peer gateways are not held to it. */
static void conn_count_cut(gw_http_conn *c)
{
    int64_t now = gw_mono_coarse_ms();
    if (now - c->h2_cut_since_ms > H2_CUT_WINDOW_MS) {
        c->h2_cut_since_ms = now;
        c->h2_cut = 0;
    }
    if (++c->h2_cut <= c->srv->limits.max_cut_streams || c->goaway || gw_conn_peer(c))
        return;
    fprintf(stderr,
            "http2: a client made the server reset %u of its streams in %d s: closed (ENHANCE_YOUR_CALM)\n",
            (unsigned)c->h2_cut, H2_CUT_WINDOW_MS / 1000);
    c->goaway = true;
    if (nghttp2_session_terminate_session(c->ngh, NGHTTP2_ENHANCE_YOUR_CALM))
        c->broken = true;
    gw_conn_set_timer(c, GW_HTTP_LINGER_MS); /* for the GOAWAY to go out */
}

static int on_stream_close_cb(nghttp2_session *ngh, int32_t id, uint32_t error_code, void *ud)
{
    gw_http_stream *s = stream_of(ngh, id);
    if (s) {
        bool cut = s->reset_for_client;
        gw_http_conn *c = s->conn;
        stream_body_done(s);
        gw_stream_closed(s, s->fin_sent);
        if (cut)
            conn_count_cut(c);
    }
    return 0;
}

/* ---- the connection's timer ---- */

/* The streams' bounds: a header block left open holds the whole
 * connection (nothing may come between its frames), so the connection
 * goes; a body that stopped arriving gets 408; a response the peer's
 * window has held for idle_timeout_ms is reset, and the application
 * hears of it (on_close unfinished), so no upstream work waits on it. */
int gw_h2_check_streams(gw_http_conn *c)
{
    int64_t now = gw_mono_coarse_ms(), next = 0;
    c->h2_check_ms = 0;
    for (gw_http_stream *s = c->streams; s; s = s->next) {
        if (!s->due_ms)
            continue;
        if (s->due_ms > now) {
            next = next && next < s->due_ms ? next : s->due_ms;
            continue;
        }
        s->due_ms = 0;
        if (s->state == GW_SS_HEADERS)
            return -1;
        if (s->state == GW_SS_BODY) {
            stream_reject(s, 408, "the request body stopped arriving", "request_timeout");
            s->rst_after_fin = true;
        } else if (s->state == GW_SS_REJECTED || (s->body_dropped && s->fin_sent)) {
            /* answered, and the rest of the body stopped coming */
            if (nghttp2_submit_rst_stream(c->ngh, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_NO_ERROR))
                c->broken = true;
        } else if (s->state == GW_SS_APP && !s->reset) {
            gw_h2_reset(s);
        }
    }
    if (next) {
        c->h2_check_ms = next;
        gw_conn_set_timer(c, (int)(next - now));
    }
    return 0;
}

/* ---- registration ---- */

void gw_h2_request_callbacks(nghttp2_session_callbacks *cb)
{
    nghttp2_session_callbacks_set_on_begin_headers_callback(cb, on_begin_headers_cb);
    nghttp2_session_callbacks_set_on_header_callback(cb, on_header_cb);
    nghttp2_session_callbacks_set_on_invalid_header_callback(cb, on_invalid_header_cb);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data_chunk_recv_cb);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame_recv_cb);
    nghttp2_session_callbacks_set_on_frame_send_callback(cb, on_frame_send_cb);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_stream_close_cb);
}
