/* Internals of the HTTP server shared by its files and by its tests and
 * fuzzers: server.c (the server, connections and their choice of
 * protocol, the application's stream API), http2.c (HTTP/2 connections on
 * nghttp2: I/O and responses) and http2_request.c (their requests:
 * assembly, bounds, refusals), http1.c (HTTP/1.x sessions) and
 * http1_parse.c (their request parser), tls.c (OpenSSL contexts) and
 * listen.c (listeners). Nothing outside gateway/http/ and its tests
 * should include this.
 *
 * Ownership: a server owns its listeners and connections; a connection owns
 * its bufferevent (a socket's, or OpenSSL's over the socket), its protocol
 * session and its streams. A connection starts undecided (cleartext: the
 * first bytes tell; TLS: ALPN does) and then turns into one protocol for
 * good: the core calls that protocol through its table (gw_http_proto),
 * never by testing which one it is. An HTTP/2 stream lives from the first
 * HEADERS frame of a request until nghttp2 closes it; an HTTP/1.x stream
 * from its complete request head until its response drained. A stream the
 * application saw (on_request) lives on, detached, until on_close
 * returned.
 *
 * Discipline (h2o's): protocol work (nghttp2_session_mem_recv / mem_send,
 * HTTP/1.x parsing, deciding that a stream is over) happens only in loop
 * callbacks, never inside a gw_http_* call the application makes; those
 * only buffer and make the connection's send event active. Closed streams
 * are queued and their on_close runs once no protocol call is on the stack.
 * A connection is freed only from a loop callback, after every call into
 * its session and every handler callback of it returned. */
#ifndef GW_HTTP_INTERNAL_H
#define GW_HTTP_INTERNAL_H

#include "gateway/http/http.h"

#include <nghttp2/nghttp2.h>

struct bufferevent;
struct event;
struct evbuffer;
struct evconnlistener;
struct ssl_ctx_st; /* OpenSSL's SSL_CTX */

/* Output bytes queued on an HTTP/2 connection before nghttp2 is asked for
 * more: a slow reader holds at most this much (plus one frame) per
 * connection in the socket's buffer; the rest waits in per-stream buffers
 * bounded by max_stream_buffer, or in the peer's flow-control window. */
#define GW_HTTP_OUT_SOFT_MAX (64 * 1024)
/* The send path is woken when the output has drained to this. */
#define GW_HTTP_OUT_LOW_WATER (16 * 1024)
/* Linger bound for a connection whose last bytes wait for a peer that does
 * not read (HTTP/2 GOAWAY), or for the peer's close after ours (HTTP/1.x). */
#define GW_HTTP_LINGER_MS 5000

typedef struct gw_http_conn gw_http_conn;
typedef struct gw_listener gw_listener;

/* A stream's life, in order; each state names who holds the response. */
typedef enum gw_stream_state {
    GW_SS_HEADERS,  /* request headers arriving */
    GW_SS_BODY,     /* request body arriving */
    GW_SS_REJECTED, /* the server answered (400, 413, 431): the rest of the request is ignored */
    GW_SS_APP,      /* on_request (or on_head) was called: the application answers */
    GW_SS_CLOSED,   /* the protocol is done with it; on_close is due (application streams only) */
} gw_stream_state;

typedef struct gw_arena_chunk gw_arena_chunk;

struct gw_http_stream {
    gw_http_conn *conn;
    gw_http_stream *prev, *next; /* conn->streams while open, conn->closed after */
    int32_t id;                  /* HTTP/2 stream id; HTTP/1.x: request number on the connection */
    gw_stream_state state;
    bool remote_ended; /* END_STREAM received */
    bool resp_started; /* response head submitted */
    bool resp_ended;   /* no more data will be written */
    bool fin_sent;     /* END_STREAM handed to the transport */
    bool deferred;     /* the data source answered NGHTTP2_ERR_DEFERRED */
    bool reset;        /* gw_http_reset was called */
    bool finished;     /* what on_close reports */
    bool above_half;   /* a write left pending above max_stream_buffer / 2: on_writable when it falls */
    bool writable_due; /* HTTP/2: it fell inside nghttp2; on_writable runs after */
    bool head;         /* a HEAD request, whose response has no body */
    bool bodiless;     /* the response carries no body bytes (HEAD, 204, 304) */
    bool chunked;      /* HTTP/1.x: the response body is in chunked coding */
    bool sized;        /* a streamed response of a length said in advance (gw_http_begin_length) */
    uint64_t resp_left; /* sized: body bytes still to be written */
    bool rst_after_fin; /* HTTP/2: RST_STREAM(NO_ERROR) once the response ended (a body timed out) */
    bool reset_for_client; /* HTTP/2: nghttp2 reset it, the application holding it, for a frame the
                              client sent that the protocol forbids there (conn_count_cut) */
    bool body_dropped;  /* HTTP/2: answered from its head (on_head): the body that comes is dropped */
    int reject_status;  /* pending server answer (400, 413, 414, 431), 0 if none */
    /* HTTP/2: monotonic ms by which the stream must move on, 0 for no
     * bound: its header block (header_timeout_ms), each piece of its body,
     * and, once answered, its pending output while the peer's window holds
     * it (idle_timeout_ms). The connection's timer checks them. */
    int64_t due_ms;
    int64_t drop_until_ms; /* HTTP/2, answered with its body still coming: dropped until then at most */
    void *user;

    /* request: strings live in the arena */
    gw_arena_chunk *arena;
    const char *method, *path, *authority;
    gw_http_header *headers;
    size_t n_headers, cap_headers;
    size_t header_bytes; /* HTTP/2: counted as SETTINGS_MAX_HEADER_LIST_SIZE counts them */
    size_t header_kept;  /* HTTP/2: what its kept fields cost (bytes + 32 each), in conn->h2_header_bytes */
    size_t body_held;    /* HTTP/2: its whole request body, in conn->h2_body_held */
    uint8_t *body;
    size_t body_len, body_cap;
    gw_http_request req;

    struct evbuffer *out; /* HTTP/2: response bytes not yet given to nghttp2 */
    /* gw_http_end_trailers' fields (name, value, ...; in the arena), sent
     * after the last DATA over HTTP/2 */
    const char *trailers[2 * GW_HTTP_MAX_TRAILERS];
    size_t n_trailers;
};

/* A protocol's side of a connection and its streams: the table the core
 * calls once the protocol is chosen (h2o's h2o_conn_callbacks_t), one per
 * protocol (http1.c, http2.c), and one in server.c for a connection not
 * yet decided. The connection members are always filled (gw_conn_nop
 * where a protocol has nothing to do); the stream members are filled by
 * the protocols, an undecided connection having no streams. */
typedef struct gw_http_proto {
    /* Loop callbacks of the connection: each may free it (the caller must
     * not touch it after). */
    void (*on_send)(gw_http_conn *c);  /* the send event fired (gw_conn_schedule_send) */
    void (*on_timer)(gw_http_conn *c); /* the connection's timer fired */
    void (*drain)(gw_http_conn *c);    /* the server began draining */
    /* Bookkeeping the core reports; none of these frees the connection. */
    void (*set_bounds)(gw_http_conn *c); /* the server's limits changed */
    void (*no_streams)(gw_http_conn *c); /* its last open stream closed */
    /* The connection is about to be freed, whatever the cause (reset,
     * error, timeout, server shutdown), its streams still open. */
    void (*closing)(gw_http_conn *c);
    /* The application's side of a stream, each called once the core has
     * checked the call (gw_http_respond and friends): buffer and schedule
     * only. submit: `length` is a streamed response's length said in
     * advance (gw_http_begin_length), or -1; the content-length and
     * transfer-encoding the application gives are dropped, as framing is
     * the server's. */
    int (*submit)(gw_http_stream *s, int status, const gw_http_header *headers, size_t n_headers,
                  const void *body, size_t body_len, bool whole, int64_t length);
    int (*write)(gw_http_stream *s, const void *data, size_t len);
    int (*end)(gw_http_stream *s);
    void (*reset)(gw_http_stream *s);
    size_t (*pending)(const gw_http_stream *s);
} gw_http_proto;

/* An HTTP/1.x connection's place in its request/response cycle. */
typedef enum gw_h1_state {
    GW_H1_IDLE,   /* before a request's first byte (idle timeout; header timeout for the first) */
    GW_H1_HEAD,   /* request head arriving (header timeout) */
    GW_H1_BODY,   /* request body arriving (idle timeout, re-armed on progress) */
    GW_H1_APP,    /* on_request was called; the response drains before the next request */
    GW_H1_CLOSE,  /* the last response is queued: close once it drained */
    GW_H1_LINGER, /* our side is shut; input is dropped until the peer closes (bounded) */
} gw_h1_state;

/* Where a chunked request body is. */
typedef enum gw_h1_chunk_state {
    GW_H1_CHUNK_SIZE,    /* chunk-size [ext] CRLF */
    GW_H1_CHUNK_DATA,    /* `body_left` bytes of data */
    GW_H1_CHUNK_CRLF,    /* the CRLF after the data */
    GW_H1_CHUNK_TRAILER, /* trailer lines up to the empty one; counted, not kept */
} gw_h1_chunk_state;

typedef struct gw_h1 {
    gw_h1_state state;
    gw_http_stream *cur; /* the request being read or answered */
    int32_t n_requests;
    size_t scanned;       /* head bytes searched for its end, so a trickle is not rescanned */
    bool keep_alive;      /* another request may follow the current one */
    bool chunked_body;    /* the request body is chunked, else body_left counts it */
    bool eof;             /* the peer closed its side */
    bool abort;           /* gw_http_reset: close without finishing */
    bool http10;          /* the current request is HTTP/1.0 */
    bool expect_continue; /* the current request waits for 100 Continue before its body */
    gw_h1_chunk_state chunk;
    uint64_t body_left; /* content-length bytes, or bytes of the current chunk, still to come */
    size_t trailer_bytes;
    struct evbuffer_cb_entry *out_cb; /* counts its output in the held bytes (gw_conn_held_add) */
} gw_h1;

struct gw_http_conn {
    gw_http_server *srv;
    gw_http_conn *prev, *next;
    struct bufferevent *bev;
    const gw_http_proto *proto; /* chosen once: undecided, then HTTP/1.x or HTTP/2 for good */
    nghttp2_session *ngh;    /* HTTP/2 only */
    struct event *send_ev;   /* made active to run the send path from the loop */
    struct event *idle_ev;   /* the connection's one timer: idle, header, linger bounds */
    struct event *closed_ev; /* HTTP/1 while a response is produced: the peer's close, unread (EV_CLOSED) */
    gw_http_stream *streams; /* open */
    gw_http_stream *closed;  /* closed, on_close due; in closing order */
    gw_http_stream *closed_tail;
    size_t n_streams;
    bool tls;
    int8_t peer;       /* TLS: whether the client is a peer gateway (gw_conn_peer), -1 until asked */
    bool read_paused;  /* HTTP/2 output above the soft maximum: peer must read first */
    bool goaway;       /* idle GOAWAY submitted */
    bool lingering;    /* nghttp2 is done; waiting for the output to drain, then for the peer to close */
    bool h2_shut;      /* HTTP/2, lingering: the output drained and our side is shut */
    bool h2_peer_eof;  /* HTTP/2, lingering: the peer shut its side before our output drained */
    bool writable_due; /* some stream's writable_due is set */
    bool broken;       /* an allocation failed where no error could be returned: close */
    bool dead;         /* being freed: gw_http_* calls on its streams fail */
    bool h2_framed;    /* HTTP/2: a frame came after the preface (header_timeout until then) */
    int64_t h2_check_ms;  /* HTTP/2 with streams: when the timer is set to check their due_ms, 0: not set */
    size_t h2_body_bytes; /* HTTP/2: request body bytes held by streams still receiving theirs */
    size_t h2_body_held;  /* HTTP/2: whole request bodies of its open streams (answered ones may wait
                             on the peer's window for idle_timeout_ms, and longer while it opens a byte) */
    size_t h2_header_bytes; /* HTTP/2: header bytes kept by its open streams (H2_CONN_HEADER_BUDGET) */
    uint32_t h2_cut;        /* HTTP/2: streams the application had, ended reset, since h2_cut_since_ms */
    int64_t h2_cut_since_ms;
    int64_t h2_reset_debt;  /* HTTP/2: the client's RST_STREAMs, in thousandths, less the bucket's refill */
    int64_t h2_reset_ms;    /* HTTP/2: when h2_reset_debt was last refilled */
    int32_t h2_last_id;     /* HTTP/2: the highest stream id of the client's HEADERS */
    size_t h2_out_held;     /* HTTP/2: response bytes its streams hold (their `out`), max_conn_buffer */
    int64_t h2_slow_since_ms; /* HTTP/2: since when it holds half its bound (min_read_rate), 0: it does not */
    size_t h2_slow_read;      /* HTTP/2: response bytes that went out since then */
    bool h2_slow_cut;         /* HTTP/2: read below min_read_rate: to be cut once nghttp2 is out of the way */
    bool h2_sweep_due;      /* HTTP/2: h2_out_held fell to half its bound: full streams may go on */
    int32_t h2_refused[8];  /* HTTP/2: the latest streams nghttp2 refused before they were made */
    uint8_t h2_refused_next;
    gw_h1 h1;             /* HTTP/1.x only */
};

struct gw_listener {
    gw_listener *next;
    gw_http_server *srv;
    struct evconnlistener *evl;
    struct event *retry_ev; /* re-enables accepting after EMFILE and friends */
    struct ssl_ctx_st *tls; /* NULL for cleartext */
    char *unix_path;        /* unlinked when the listener goes, if still ours */
    unsigned long long unix_dev, unix_ino;
    int port;  /* TCP: the bound port; -1 for Unix sockets */
    int index; /* the order it was added in (gw_http_server_set_tls) */
};

struct gw_http_server {
    struct event_base *base;
    gw_http_limits limits;
    gw_http_handler handler;
    void *ud;
    gw_listener *listeners;
    gw_http_conn *conns;
    size_t n_conns;
    size_t active_streams;
    size_t h2_out_held;             /* response bytes all connections hold (max_buffer): HTTP/2
                                       streams' `out`, HTTP/1 connections' output */
    bool h2_sweep_due;              /* h2_out_held fell to half max_buffer: full streams may go on */
    struct event *sweep_ev;         /* runs that sweep when HTTP/1 output made it due */
    bool draining;                  /* gw_http_server_drain: no new requests */
    int port;                       /* of the last TCP listener, 0 if none */
    int n_listeners_added;
    int64_t accept_err_logged;      /* gw_mono_coarse_ms of the last "cannot accept" line */
    time_t date_sec;                /* the second `date` was formatted for */
    char date[32];                  /* IMF-fixdate, for the Date header */
    nghttp2_session_callbacks *cbs; /* shared by every HTTP/2 connection */
    nghttp2_option *opt;
};

/* ---- server.c: what every protocol shares ---- */

/* Copies p[0..n) with a NUL after it into the arena; NULL on no memory. */
char *gw_arena_strndup(gw_arena_chunk **head, const void *p, size_t n);
/* A new stream, linked into c->streams and counted. NULL on no memory. */
gw_http_stream *gw_stream_new(gw_http_conn *c, int32_t id);
/* The server answered a request itself: the application hears of it
 * (on_refused), with what is known of the request (s may be NULL). */
void gw_server_refused(gw_http_server *srv, int status, const gw_http_stream *s, const char *protocol);
/* Whether the connection's streams should pause (gw_http_full): they hold
 * more than half max_conn_buffer, or, while the server's streams hold more
 * than half max_buffer, more than their share of that half (a connection
 * that reads is not held back by others that do not). */
bool gw_conn_full(const gw_http_conn *c);
/* Whether the connection's client presented a certificate that makes it
 * a peer gateway (gw_tls_peer_verified, asked once per connection). */
bool gw_conn_peer(gw_http_conn *c);
/* The Date header's value for a response sent now (RFC 9110 6.6.1: an
 * origin server with a clock sends one), formatted at most once a second. */
const char *gw_http_date(gw_http_server *srv);
/* Shows a request whose body is still to come to on_head (if any), as
 * protocol; true when the application answered it (or reset it) there,
 * and the stream is then the application's (GW_SS_APP). */
bool gw_stream_offer_head(gw_http_stream *s, const char *protocol);
/* s->req from what the stream has gathered (an empty body when none came),
 * as the application sees it. */
void gw_stream_fill_request(gw_http_stream *s, const char *protocol);
/* Why a request head is refused for a field that must appear once and is
 * repeated (authorization, content-length, content-type, host, ...): with
 * two, a proxy in front that reads the last and this server the first
 * would not agree on who sent it or how long it is. NULL when none is. */
const char *gw_stream_repeated_field(const gw_http_stream *s);
/* The protocol is done with the stream: a stream the application saw
 * waits in c->closed for gw_conn_flush_closed, others are freed now. */
void gw_stream_closed(gw_http_stream *s, bool finished);
/* Runs on_close for the closed streams. Only with no protocol call on the
 * stack: the handler may call any gw_http_* function. */
void gw_conn_flush_closed(gw_http_conn *c);
/* Calls on_writable for `s` if the application should still hear it. */
void gw_stream_writable(gw_http_stream *s);
/* A full stream that no longer is (gw_http_full): on_writable. */
void gw_stream_sweep(gw_http_stream *s);
/* Response bytes the connection took (n > 0) or gave back (n < 0), on its
 * count and the server's (max_conn_buffer, max_buffer); when the server's
 * falls to half its bound, the streams it held back on every connection
 * are swept. True when the connection's count fell from over half its
 * bound to below (its own full streams may go on). */
bool gw_conn_held_add(gw_http_conn *c, ptrdiff_t n);
/* Closes every stream (on_close unfinished) and frees the connection. */
void gw_conn_free(gw_http_conn *c);
void gw_conn_schedule_send(gw_http_conn *c);
/* A protocol table's member for what the protocol has nothing to do on. */
void gw_conn_nop(gw_http_conn *c);
/* How long a connection with nothing in flight may stay: the idle timeout,
 * 0 while the server drains. */
int gw_conn_idle_ms(const gw_http_conn *c);
/* (Re)arms the connection's timer; sets c->broken when it cannot. */
void gw_conn_set_timer(gw_http_conn *c, int ms);
/* Serves a connected socket, over TLS when `tls` is given. Takes `fd`. */
int gw_conn_adopt(gw_http_server *srv, int fd, struct ssl_ctx_st *tls);

/* ---- http2.c: HTTP/2 connections (I/O, responses, the application's side) ---- */

int gw_h2_server_init(gw_http_server *srv);
void gw_h2_server_dispose(gw_http_server *srv);
/* Turns a connection into HTTP/2 (its table) and feeds it what was read;
 * frees it on failure (the caller must not touch it after). */
void gw_h2_start(gw_http_conn *c);
/* Submits response headers, with `body` queued when given, without
 * scheduling the send. With `whole`, the response ends after the body;
 * else `length`, when >= 0, is the body's length said in advance. 0,
 * -EINVAL or -ENOMEM. */
int gw_h2_submit_response(gw_http_stream *s, int status, const gw_http_header *headers, size_t n_headers,
                          const void *body, size_t body_len, bool whole, int64_t length);
/* Resets a stream the application holds (RST_STREAM INTERNAL_ERROR). */
void gw_h2_reset(gw_http_stream *s);
/* nghttp2 closed the stream: its output leaves the held counts. */
void gw_h2_stream_dropped(gw_http_stream *s);

/* ---- http2_request.c: HTTP/2 requests (nghttp2's receive callbacks, bounds, refusals) ---- */

/* Sets the receive callbacks that assemble requests. */
void gw_h2_request_callbacks(nghttp2_session_callbacks *cb);
/* The stream's output waits on the peer: due within idle_timeout_ms. */
void gw_h2_stream_due_idle(gw_http_stream *s);
/* The same for its response: within window_timeout_ms, or never. */
void gw_h2_stream_due_output(gw_http_stream *s);
/* The connection's timer fired with streams open: deals with those past
 * their bounds and sets the timer for the next. -1 when the connection
 * must go (a header block left open). */
int gw_h2_check_streams(gw_http_conn *c);
/* The connection has no streams: its idle timeout runs (no_streams). */
void gw_h2_arm_idle(gw_http_conn *c);

/* ---- http1.c ---- */

void gw_h1_start(gw_http_conn *c); /* as gw_h2_start */

/* ---- http1_parse.c: the HTTP/1.x request parser ---- */

/* What the parser returns other than an HTTP status (400, 413, 417, 431,
 * 501, 505) to refuse the request with; `why` then says why in words, or
 * is NULL for 413 and 431 when only the limit is to blame. */
#define GW_H1_MORE 0   /* more input is needed */
#define GW_H1_DONE 1   /* the head (the stream exists, in c->h1.cur) or the body is complete */
#define GW_H1_NOMEM -1 /* no memory: close the connection */

/* Parses the head from the connection's input once it is all there. */
int gw_h1_parse_head(gw_http_conn *c, const char **why);
/* Moves body bytes from the input into c->h1.cur. */
int gw_h1_parse_body(gw_http_conn *c, const char **why);
bool gw_h1_is_tchar(unsigned char ch);      /* RFC 9110 5.6.2 */
bool gw_h1_is_field_char(unsigned char ch); /* field-vchar, SP, HTAB, obs-text */
/* Connection-specific fields (and content-length, which the server sets):
 * never handed to the application, nor taken from it. */
bool gw_h1_hop_by_hop(const char *name, size_t len);

/* ---- tls.c: OpenSSL behind these few calls ---- */

/* A server context (TLS 1.2 minimum, ALPN h2 then http/1.1) with the
 * certificate chain and key loaded and checked. 0 or a negative errno
 * with err filled. */
int gw_tls_ctx_new(const char *cert_file, const char *key_file, const char *client_ca,
                   const char *const *peer_names, int n_peer_names, struct ssl_ctx_st **out, char *err,
                   size_t err_len);
void gw_tls_ctx_free(struct ssl_ctx_st *ctx);
/* A bufferevent running the server side of a handshake on `fd`, which it
 * owns from here; NULL on no memory. */
struct bufferevent *gw_tls_bev_new(struct event_base *base, int fd, struct ssl_ctx_st *ctx);
/* After the handshake: whether ALPN chose h2. */
bool gw_tls_alpn_h2(struct bufferevent *bev);
/* Did the peer present a certificate that verified against the client CA? */
bool gw_tls_peer_verified(struct bufferevent *bev);
/* Sends close_notify (best effort) before our side of the socket shuts. */
void gw_tls_close_notify(struct bufferevent *bev);

/* ---- listen.c ---- */

/* Parses `spec` and adds a listener to srv->listeners; it takes `tls`
 * (NULL for cleartext), also on failure. */
int gw_listener_add(gw_http_server *srv, const char *spec, struct ssl_ctx_st *tls, char *err, size_t err_len);
void gw_listener_free_all(gw_http_server *srv);

#endif
