/* HTTP server of infergate: listeners and server sessions on one libevent
 * loop. Today it speaks HTTP/2 cleartext with prior knowledge (h2c), which
 * is what workers serve and what the gateway's upstream pool speaks; the
 * gateway's front door adds HTTP/1.1 and TLS behind this same interface.
 *
 * A request reaches the application once, whole (headers and a bounded
 * body), through on_request. The application answers at once with
 * gw_http_respond, or streams with gw_http_begin / gw_http_write /
 * gw_http_end, possibly later from other loop callbacks. on_close tells it
 * the stream is gone (finished, reset by the peer, or its connection
 * closed); after on_close returns the stream pointer is invalid. Every call
 * here happens on the loop's thread. */
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
} gw_http_request;

typedef struct gw_http_limits {
    size_t max_body;                 /* bytes; larger -> 413 (default 1 MiB) */
    uint32_t max_concurrent_streams; /* SETTINGS_MAX_CONCURRENT_STREAMS (default 256) */
    size_t max_header_list;          /* bytes of headers per request (default 64 KiB) */
    size_t max_stream_buffer;        /* response bytes held for a slow reader before
                                        the stream is reset (default 1 MiB) */
    int idle_timeout_ms;             /* close a connection with no streams after this (default 120000) */
} gw_http_limits;

void gw_http_limits_default(gw_http_limits *l);

typedef struct gw_http_handler {
    /* A complete request. The request and its strings live until on_close. */
    void (*on_request)(void *ud, gw_http_stream *s, const gw_http_request *req);
    /* The stream is gone; `stream_ud` is what gw_http_set_user stored.
     * `finished` is true when the response was sent completely. */
    void (*on_close)(void *ud, gw_http_stream *s, void *stream_ud, bool finished);
} gw_http_handler;

/* NULL on out of memory. Zero limits take the defaults. The process must
 * ignore SIGPIPE: a peer that vanishes mid-write would otherwise kill it. */
gw_http_server *gw_http_server_new(struct event_base *base, const gw_http_limits *limits,
                                   const gw_http_handler *handler, void *ud);
/* Starts listening on "unix:/path" or "tcp:HOST:PORT" (HOST may be [::1]).
 * A stale Unix socket file is replaced. 0, or a negative errno with err
 * filled. Several listeners per server are fine. */
int gw_http_server_listen(gw_http_server *srv, const char *spec, char *err, size_t err_len);
/* Port of the last TCP listener started (useful after "tcp:HOST:0"), 0 if
 * none is listening. */
int gw_http_server_port(const gw_http_server *srv);
/* Serves an already connected stream socket (socket activation, a
 * socketpair from a supervisor, fuzzers); the server owns `fd` from here,
 * also on failure. 0, -ENOMEM, or -EBADF when it cannot be made
 * non-blocking. */
int gw_http_server_adopt(gw_http_server *srv, int fd);
/* Stops accepting; existing connections go on. */
void gw_http_server_stop_listening(gw_http_server *srv);
/* Number of open streams over all connections. */
size_t gw_http_server_active_streams(const gw_http_server *srv);
/* Closes every connection (their streams get on_close) and frees. Not
 * from inside a handler callback. */
void gw_http_server_free(gw_http_server *srv);

void gw_http_set_user(gw_http_stream *s, void *stream_ud);
/* Value of the first header with this lower-case name, or NULL. */
const char *gw_http_header_get(const gw_http_request *req, const char *name);

/* A whole response. 0, or -EINVAL when a response was already started. */
int gw_http_respond(gw_http_stream *s, int status, const gw_http_header *headers, size_t n_headers,
                    const void *body, size_t body_len);
/* Streaming response: headers now, data as it comes, then end. write
 * returns -ENOBUFS when the peer has not read and the bytes held for it
 * would pass max_stream_buffer: the caller should then give up (reset). */
int gw_http_begin(gw_http_stream *s, int status, const gw_http_header *headers, size_t n_headers);
int gw_http_write(gw_http_stream *s, const void *data, size_t len);
int gw_http_end(gw_http_stream *s);
/* Bytes written but not yet sent to the peer. */
size_t gw_http_pending(const gw_http_stream *s);
/* Abort the stream (RST_STREAM with INTERNAL_ERROR or CANCEL); on_close follows. */
void gw_http_reset(gw_http_stream *s);

#endif
