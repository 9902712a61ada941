/* Internals of the HTTP/2 server (gateway/http_server.c) shared with its
 * listeners (gateway/listen.c) and its tests and fuzzers. Nothing outside
 * gateway/http_*.c and gateway/listen.c should include this.
 *
 * Ownership: a server owns its listeners and connections; a connection owns
 * its nghttp2 session, its bufferevent and its streams. A stream lives from
 * the first HEADERS frame of a request until nghttp2 closes it; a stream the
 * application saw (on_request) lives on, detached, until on_close returned.
 *
 * Discipline (h2o's): nghttp2_session_mem_recv / mem_send are called only
 * from loop callbacks, never from a gw_http_* call the application makes;
 * those only buffer and make the connection's send event active. Streams
 * that nghttp2 closes are queued and their on_close runs after nghttp2
 * returned. A connection is freed only from a loop callback, after every
 * nghttp2 call and every handler callback of it returned. */
#ifndef GW_HTTP_INTERNAL_H
#define GW_HTTP_INTERNAL_H

#include "gateway/http.h"

#include <nghttp2/nghttp2.h>

struct bufferevent;
struct event;
struct evbuffer;
struct evconnlistener;

/* Output bytes queued on a connection before nghttp2 is asked for more:
 * a slow reader holds at most this much (plus one frame) per connection in
 * the socket's buffer; the rest waits in per-stream buffers bounded by
 * max_stream_buffer, or in the peer's flow-control window. */
#define GW_HTTP_OUT_SOFT_MAX (64 * 1024)
/* The send path is woken when the output has drained to this. */
#define GW_HTTP_OUT_LOW_WATER (16 * 1024)

typedef struct gw_http_conn gw_http_conn;
typedef struct gw_listener gw_listener;

/* A stream's life, in order; each state names who holds the response. */
typedef enum gw_stream_state {
    GW_SS_HEADERS,  /* request headers arriving */
    GW_SS_BODY,     /* request body arriving */
    GW_SS_REJECTED, /* the server answered (400, 413, 431): the rest of the request is ignored */
    GW_SS_APP,      /* on_request was called: the application answers */
    GW_SS_CLOSED,   /* nghttp2 forgot it; on_close is due (application streams only) */
} gw_stream_state;

typedef struct gw_arena_chunk gw_arena_chunk;

struct gw_http_stream {
    gw_http_conn *conn;
    gw_http_stream *prev, *next; /* conn->streams while open, conn->closed after */
    int32_t id;
    gw_stream_state state;
    bool remote_ended; /* END_STREAM received */
    bool resp_started; /* response HEADERS submitted */
    bool resp_ended;   /* no more data will be written */
    bool fin_sent;     /* END_STREAM handed to the transport */
    bool deferred;     /* the data source answered NGHTTP2_ERR_DEFERRED */
    bool reset;        /* gw_http_reset was called */
    bool finished;     /* what on_close reports */
    int reject_status; /* pending server answer (400, 413, 431), 0 if none */
    void *user;

    /* request: strings live in the arena */
    gw_arena_chunk *arena;
    const char *method, *path, *authority;
    gw_http_header *headers;
    size_t n_headers, cap_headers;
    size_t header_bytes; /* counted as SETTINGS_MAX_HEADER_LIST_SIZE counts them */
    uint8_t *body;
    size_t body_len, body_cap;
    gw_http_request req;

    struct evbuffer *out; /* response bytes not yet given to nghttp2 */
};

struct gw_http_conn {
    gw_http_server *srv;
    gw_http_conn *prev, *next;
    struct bufferevent *bev;
    nghttp2_session *ngh;
    struct event *send_ev;   /* made active to run the send path from the loop */
    struct event *idle_ev;   /* idle timeout, then the linger bound once closing */
    gw_http_stream *streams; /* open */
    gw_http_stream *closed;  /* closed, on_close due; in closing order */
    gw_http_stream *closed_tail;
    size_t n_streams;
    bool read_paused; /* output above the soft maximum: peer must read first */
    bool goaway;      /* idle GOAWAY submitted */
    bool lingering;   /* nghttp2 is done; waiting for the output to drain */
    bool broken;      /* an allocation failed where no error could be returned: close */
    bool dead;        /* being freed: gw_http_* calls on its streams fail */
};

struct gw_listener {
    gw_listener *next;
    gw_http_server *srv;
    struct evconnlistener *evl;
    struct event *retry_ev; /* re-enables accepting after EMFILE and friends */
    char *unix_path;        /* unlinked when the listener goes, if still ours */
    unsigned long long unix_dev, unix_ino;
    int port; /* TCP: the bound port; -1 for Unix sockets */
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
    int port;                       /* of the last TCP listener, 0 if none */
    nghttp2_session_callbacks *cbs; /* shared by every connection */
    nghttp2_option *opt;
};

/* listen.c: parses `spec` and adds a listener to srv->listeners. */
int gw_listener_add(gw_http_server *srv, const char *spec, char *err, size_t err_len);
void gw_listener_free_all(gw_http_server *srv);

#endif
