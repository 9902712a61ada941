/* HTTP server of infergate: listeners and server sessions on one libevent
 * loop. One listener serves every client: on a cleartext listener the
 * first bytes choose HTTP/2 (the prior-knowledge preface, h2c, which is
 * what workers serve and what the upstream pool speaks) or HTTP/1.x; on a
 * TLS listener ALPN chooses ("h2", else HTTP/1.1). The application sees
 * the same requests and streams whichever protocol carries them.
 *
 * A request reaches the application once, whole (headers and a bounded
 * body), through on_request. The application answers at once with
 * gw_http_respond, or streams with gw_http_begin / gw_http_write /
 * gw_http_end, possibly later from other loop callbacks. on_close tells it
 * the stream is gone (finished, reset by the peer, or its connection
 * closed); after on_close returns the stream pointer is invalid. Every call
 * here happens on the loop's thread, and no handler callback ever runs
 * inside a gw_http_* call.
 *
 * HTTP/1.x specifics: requests on a connection are served one at a time,
 * in order (a pipelined request reaches on_request after the previous
 * stream's on_close). gw_http_respond and gw_http_begin_length send
 * Content-Length; another streamed response is sent chunked (one chunk per
 * gw_http_write, at once) or, to an HTTP/1.0 client, delimited by closing
 * the connection. gw_http_reset
 * closes the connection. The connection-specific headers (connection,
 * keep-alive, proxy-connection, transfer-encoding, upgrade, te, expect,
 * those named by Connection, and host, which is the authority) are not in
 * the request's headers, and a chunked body arrives de-chunked: a request
 * looks the same as over HTTP/2. Response headers of those names given by
 * the application are not sent; the server frames the message itself. */
#ifndef GW_HTTP_H
#define GW_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;

typedef struct gw_http_server gw_http_server;
typedef struct gw_http_stream gw_http_stream;

typedef struct gw_http_header {
    const char *name; /* lower case */
    const char *value;
} gw_http_header;

typedef struct gw_http_request {
    const char *method;
    const char *path; /* with query string */
    const char *authority;
    const gw_http_header *headers; /* regular headers, in arrival order */
    size_t n_headers;
    const uint8_t *body;
    size_t body_len;
    const char *protocol; /* "HTTP/2", "HTTP/1.1" or "HTTP/1.0" */
    /* TLS with a client certificate that verified against the listener's
     * client CA (gw_http_server_listen_tls_peer): another region's gateway. */
    bool peer_verified;
} gw_http_request;

typedef struct gw_http_limits {
    size_t max_body;                 /* bytes; larger -> 413 (default 1 MiB) */
    size_t max_conn_body;            /* HTTP/2: request body bytes one connection holds, still
                                        arriving or whole in its open streams; past it a newer
                                        stream is refused (REFUSED_STREAM, safe to send again),
                                        the oldest arriving goes on unless whole ones fill it.
                                        0: 4 x max_body; SIZE_MAX: no bound (a worker, whose one
                                        client is its gateway). Connections with a verified
                                        client certificate (peers) are not bound */
    uint32_t max_concurrent_streams; /* SETTINGS_MAX_CONCURRENT_STREAMS (default 256) */
    uint32_t max_cut_streams;        /* HTTP/2: streams a connection may see reset (by its client,
                                        or by nghttp2 for what the client sent) while the
                                        application held them, per 10 s; past it the connection
                                        gets GOAWAY ENHANCE_YOUR_CALM, as it does for RST_STREAMs
                                        of its own past 1000 at once, 33 a second after (rapid
                                        reset). 0: twice max_concurrent_streams, at least 64;
                                        UINT32_MAX: neither bound (a worker, whose one client is
                                        its gateway). Peers are not bound */
    size_t max_header_list;          /* bytes of headers per request, larger -> 431 (default
                                        64 KiB): HTTP/2 counts as SETTINGS_MAX_HEADER_LIST_SIZE
                                        does, HTTP/1.x the raw request line and header lines */
    size_t max_stream_buffer;        /* response bytes held for a slow reader before
                                        the stream is reset (default 1 MiB) */
    size_t max_conn_buffer;          /* HTTP/2: response bytes one connection's streams hold
                                        together (default 16 MiB); SIZE_MAX: no bound */
    size_t max_buffer;               /* HTTP/2: response bytes all connections hold together
                                        (default 256 MiB); SIZE_MAX: no bound. Past half of
                                        any of the three a producer pauses (gw_http_full),
                                        past the whole a write is -ENOBUFS */
    int window_timeout_ms;           /* HTTP/2: a response the peer's flow-control window
                                        holds, no byte moving, this long is reset (0:
                                        idle_timeout_ms); -1: never (a worker, whose one
                                        client, its gateway, bounds its own clients and
                                        cancels what they leave) */
    size_t min_read_rate;            /* HTTP/2: bytes a second that a connection holding half its
                                        max_conn_buffer (gw_http_full's sense) must read, taken over
                                        idle_timeout_ms; slower, it is closed (GOAWAY
                                        ENHANCE_YOUR_CALM, on_refused GW_HTTP_CUT_SLOW): a byte a
                                        second per stream moves every stream's timer on, and held
                                        the bound for as long as the client liked. 0 (the
                                        default): no bound */
    int idle_timeout_ms;             /* close a connection with no streams after this (default 120000);
                                        also bounds an HTTP/1.x keep-alive wait, a pause inside a
                                        request body (408), a peer that stops reading, and an
                                        HTTP/2 response its flow-control window holds (reset) */
    int header_timeout_ms;           /* HTTP/1.x: a request head must be complete this long after
                                        its first byte (after accept for a connection's first
                                        request, the TLS handshake included); HTTP/2: the
                                        handshake, the preface up to the first frame, and each
                                        request's header block (default 10000) */
    size_t max_connections;          /* with this many open, a newly accepted connection is closed
                                        at once (default 10000); adopted ones count, but
                                        gw_http_server_adopt never refuses */
} gw_http_limits;

void gw_http_limits_default(gw_http_limits *l);

/* on_refused's status for a connection the server cut, answering nothing:
 * a request head (HTTP/1.x), the preface, the first frame or a header
 * block (HTTP/2) not complete within header_timeout_ms (the protocol NULL
 * when not even that was learnt); an HTTP/2 flood told GOAWAY
 * ENHANCE_YOUR_CALM (streams reset faster than any client cancels, streams
 * it made the server reset, a header block decoding to more than twice
 * max_header_list). */
#define GW_HTTP_CUT_HEADER_TIMEOUT (-1)
#define GW_HTTP_CUT_CALM (-2)
/* An HTTP/2 connection that held half its max_conn_buffer and read slower
 * than min_read_rate (GOAWAY ENHANCE_YOUR_CALM). */
#define GW_HTTP_CUT_SLOW (-3)

typedef struct gw_http_handler {
    /* A complete request. The request and its strings live until on_close. */
    void (*on_request)(void *ud, gw_http_stream *s, const gw_http_request *req);
    /* The stream is gone; `stream_ud` is what gw_http_set_user stored.
     * `finished` is true when the response was sent completely. */
    void (*on_close)(void *ud, gw_http_stream *s, void *stream_ud, bool finished);
    /* May be NULL. A request whose body is still to come, by its head alone
     * (req->body empty), so that one refused whatever its body (no valid
     * key) costs no more than its head: the application may answer it now
     * with gw_http_respond (or reset it), and the body is then not taken
     * in: HTTP/1.x closes the connection after the answer (no 100
     * Continue is sent), HTTP/2 drops the DATA as it comes. It does
     * nothing else with the stream here; when it does not answer, the body
     * comes and on_request follows. on_close follows an answer given here
     * as it follows one given to on_request. */
    void (*on_head)(void *ud, gw_http_stream *s, const gw_http_request *req);
    /* May be NULL. The server answered a request itself, which the
     * application never sees (400, 408, 413, 414, 417, 431, 501, 505), or
     * refused with no answer (status 0: HTTP/2 REFUSED_STREAM, for memory
     * the connection's open streams hold): for its counters and logs. method and path are NULL where they
     * were not read (or not valid); protocol is "HTTP/1.0", "HTTP/1.1" or "HTTP/2", or NULL where it was
     * never learnt. Also a connection the server cut (a negative status, GW_HTTP_CUT_*). Runs from the
     * loop, never inside a gw_http_* call. */
    void (*on_refused)(void *ud, int status, const char *method, const char *path, const char *protocol);
    /* May be NULL. Flow control for producers that can pause (proxies):
     * called from the loop, once each time the stream's gw_http_pending()
     * is no longer gw_http_full after a gw_http_write left it full (its
     * own bytes, or its connection's or the server's, fell to half their
     * bound). Not called after gw_http_end or gw_http_reset, nor once the
     * stream is closed. A producer pauses when gw_http_full() after a
     * write and resumes here. */
    void (*on_writable)(void *ud, gw_http_stream *s, void *stream_ud);
} gw_http_handler;

/* NULL on out of memory. Zero limits take the defaults. The process must
 * ignore SIGPIPE: a peer that vanishes mid-write would otherwise kill it. */
gw_http_server *gw_http_server_new(struct event_base *base, const gw_http_limits *limits,
                                   const gw_http_handler *handler, void *ud);
/* Replaces the limits, zero fields taking the defaults as in _new (a
 * config reload). Body, header, buffer, timeout and connection bounds hold
 * from their next check on, also for open connections;
 * max_concurrent_streams, the write timeout and the HTTP/1.x watermarks
 * for connections accepted from now on. */
void gw_http_server_set_limits(gw_http_server *srv, const gw_http_limits *limits);
/* Starts listening on "unix:/path" or "tcp:HOST:PORT" (HOST may be [::1]).
 * A stale Unix socket file is replaced. 0, or a negative errno with err
 * filled. Several listeners per server are fine. */
int gw_http_server_listen(gw_http_server *srv, const char *spec, char *err, size_t err_len);
/* The same over TLS (1.2 or later), with ALPN choosing h2 or http/1.1.
 * `cert_file` is a PEM certificate chain (leaf first), `key_file` its PEM
 * private key; both are read and checked against each other now. 0, or a
 * negative errno with err filled (naming the file at fault): -ENOENT or
 * -EACCES when a file cannot be opened, -EINVAL when it does not hold a
 * usable certificate or key or the two do not match, -ENOMEM, or what
 * gw_http_server_listen returns. */
int gw_http_server_listen_tls(gw_http_server *srv, const char *spec, const char *cert_file,
                              const char *key_file, char *err, size_t err_len);
/* The same, and client certificates are verified against client_ca: one
 * that is presented must verify (else the handshake fails); requests on a
 * connection that presented one have peer_verified set, when it carries
 * one of the n_peer_names as its subject CN or a DNS SAN (no wildcards),
 * or whatever its names with n_peer_names 0. */
int gw_http_server_listen_tls_peer(gw_http_server *srv, const char *spec, const char *cert_file,
                                   const char *key_file, const char *client_ca, const char *const *peer_names,
                                   int n_peer_names, char *err, size_t err_len);
/* Whether a certificate (OpenSSL's X509) carries name as its subject CN or
 * a DNS SAN, in any case, no wildcard standing for it: the test of
 * peer_names, which the upstream pool makes of the peers it dials too. */
struct x509_st;
bool gw_tls_cert_named(struct x509_st *cert, const char *name);
/* Loads a TLS listener's certificate, key, client CA and peer names again
 * (a certificate renewed in place, or new files): connections accepted from
 * now on use them, those open keep theirs. `index` is the listener's place
 * in the order listeners were added (0 for the first). On failure (err
 * filled, as gw_http_server_listen_tls_peer) the listener keeps what it
 * had. */
int gw_http_server_set_tls(gw_http_server *srv, int index, const char *cert_file, const char *key_file,
                           const char *client_ca, const char *const *peer_names, int n_peer_names, char *err,
                           size_t err_len);
/* Port of the last TCP listener started (useful after "tcp:HOST:0"), 0 if
 * none is listening. */
int gw_http_server_port(const gw_http_server *srv);
/* Serves an already connected stream socket (socket activation, a
 * socketpair from a supervisor, fuzzers) in cleartext, choosing HTTP/2 or
 * HTTP/1.x by its first bytes; the server owns `fd` from here,
 * also on failure. 0, -ENOMEM, or -EBADF when it cannot be made
 * non-blocking. */
int gw_http_server_adopt(gw_http_server *srv, int fd);
/* Stops accepting and winds the connections down: each HTTP/2 one gets a
 * GOAWAY naming the last stream it started, so its client sends new
 * requests elsewhere, and closes after that stream; an HTTP/1.x one closes
 * when idle, or after the response in progress. Open streams finish. */
void gw_http_server_drain(gw_http_server *srv);
/* Number of open streams over all connections. */
size_t gw_http_server_active_streams(const gw_http_server *srv);
/* Whether any client connection that has carried requests is still open,
 * closing ones included (an HTTP/2 one lingers until its peer has read the
 * end and closed, at most GW_HTTP_LINGER_MS); not one whose protocol or
 * TLS handshake is still to come, which has nothing to lose. */
bool gw_http_server_has_conns(const gw_http_server *srv);
/* Closes every connection (their streams get on_close) and frees. Not
 * from inside a handler callback. */
void gw_http_server_free(gw_http_server *srv);

void gw_http_set_user(gw_http_stream *s, void *stream_ud);
/* Value of the first header with this lower-case name, or NULL. */
const char *gw_http_header_get(const gw_http_request *req, const char *name);
/* Whether a path segment, percent-decoded, is `name` (clients escape the
 * '/' of a model id such as "org/model" as %2F). A malformed escape never
 * matches. */
bool gw_http_segment_is(const char *seg, size_t seg_len, const char *name);

/* A whole response. 0, or -EINVAL when a response was already started. */
int gw_http_respond(gw_http_stream *s, int status, const gw_http_header *headers, size_t n_headers,
                    const void *body, size_t body_len);
/* Streaming response: headers now, data as it comes, then end. write
 * returns -ENOBUFS when the peer has not read and the bytes held for it
 * would pass max_stream_buffer: the caller should then give up (reset),
 * or, better, pause before that (see on_writable). On HTTP/1.x a status
 * below 200 is -EINVAL, and response header names and values must not
 * hold CR, LF or NUL (-EINVAL). */
int gw_http_begin(gw_http_stream *s, int status, const gw_http_header *headers, size_t n_headers);
/* A streamed response whose body is `length` bytes, said in advance
 * (content-length; to an HTTP/1.x client neither chunked nor closed to
 * delimit it, so an HTTP/1.0 client keeps the connection and can tell a cut
 * body from a whole one). Writes past it are -EINVAL; gw_http_end before
 * all of it is -EPIPE, and the caller then resets the stream. A response
 * without a body (to HEAD; 204, 304) says the length and drops what is
 * written, as gw_http_begin's does; its end is never short. */
int gw_http_begin_length(gw_http_stream *s, int status, const gw_http_header *headers, size_t n_headers,
                         uint64_t length);
int gw_http_write(gw_http_stream *s, const void *data, size_t len);
int gw_http_end(gw_http_stream *s);
/* Trailer fields a response may end with, at most. */
#define GW_HTTP_MAX_TRAILERS 4
/* gw_http_end, with trailer fields after the body (RFC 9110 6.5): at most
 * GW_HTTP_MAX_TRAILERS, lower-case names, no pseudo-headers; copied. Over
 * HTTP/2 only: an HTTP/1.x response ends without them (a chunked trailer
 * reaches only a client that asked with TE: trailers, and what this server
 * says in them is for its HTTP/2 peers). gw_http_end's return codes, and
 * -EINVAL for trailers it does not take, -ENOMEM. */
int gw_http_end_trailers(gw_http_stream *s, const gw_http_header *trailers, size_t n);
/* Bytes written but not yet sent to the peer: on HTTP/2 what waits in the
 * stream's own buffer; on HTTP/1.x all that waits in the connection's
 * output (the response head and chunk framing included). */
size_t gw_http_pending(const gw_http_stream *s);
/* Whether a producer should pause (on_writable then says when to go on,
 * written or not): the stream holds more than half max_stream_buffer, or
 * (HTTP/2) its connection's streams more than half max_conn_buffer, or,
 * while all of the server's hold more than half max_buffer, more than
 * their connection's share of that. */
bool gw_http_full(gw_http_stream *s);
/* Abort the stream (RST_STREAM with INTERNAL_ERROR on HTTP/2; closing the
 * connection on HTTP/1.x); on_close follows, from the loop. */
void gw_http_reset(gw_http_stream *s);

#endif
