/* Internals of the upstream HTTP/2 client pool, shared by gateway/upstream/upstream.c
 * (pool, targets, requests, the public calls) and gateway/upstream/conn.c
 * (connections: sockets, TLS, the nghttp2 client session), and by their
 * tests and fuzzers. Nothing else should include this.
 *
 * Ownership: a pool owns its targets; a target owns its connections; a
 * connection owns its nghttp2 session, its bufferevent and the requests
 * submitted on it. A request waits in pool->pending until the pool's kick
 * event gives it to a connection; once finished or cancelled it waits in
 * pool->graveyard until the next kick frees it, so that code up the stack
 * (an nghttp2 callback that called the user, who cancelled) may still look
 * at it.
 *
 * Discipline (h2o's, as in gateway/http/http_internal.h): nghttp2_session_mem_recv
 * and mem_send run only from a connection's loop callbacks, never from a
 * gw_upstream_* call; those only submit and make the send event active. The
 * user's callbacks run from loop callbacks only (never from inside
 * gw_upstream_send or gw_upstream_cancel). A connection is freed only at the
 * end of one of its own loop callbacks, after every nghttp2 call and every
 * user callback of it returned. */
#ifndef GW_UPSTREAM_INTERNAL_H
#define GW_UPSTREAM_INTERNAL_H

#include "gateway/upstream/upstream.h"
#include "gateway/base/clock.h"

#include <nghttp2/nghttp2.h>
#include <sys/socket.h>

struct bufferevent;
struct event;
struct ssl_ctx_st;
struct ssl_st;

/* Output queued on a connection before nghttp2 is asked for more frames;
 * the send path wakes again when it has drained to the low water mark. */
#define GW_UP_OUT_SOFT_MAX (64 * 1024)
#define GW_UP_OUT_LOW_WATER (16 * 1024)
/* The connection-level receive window is at least this, and at least
 * stream_window times max_streams_per_conn, so that callers that hold back
 * some streams never stall the others on the connection. */
#define GW_UP_CONN_WINDOW_MIN (16 << 20)
/* Bytes of response header fields kept per response (name + value + 32
 * each, as SETTINGS_MAX_HEADER_LIST_SIZE counts); more resets the stream. */
#define GW_UP_MAX_HEADER_LIST (64 << 10)
/* A target never gets more connections than this: past it, requests share
 * the least loaded one and nghttp2 queues them until a stream slot frees. */
#define GW_UP_MAX_CONNS_PER_TARGET 64
/* RTT samples kept per target for the percentile. */
#define GW_UP_RTT_SAMPLES 64
/* Bound on waiting for the last frames (GOAWAY) to drain before a close. */
#define GW_UP_LINGER_MS 1000

typedef struct up_target up_target;
typedef struct up_conn up_conn;

typedef enum up_target_kind {
    UP_UNIX, /* h2c over a Unix socket */
    UP_TCP,  /* h2c over TCP */
    UP_TLS,  /* h2 over TLS */
} up_target_kind;

/* A request's life, in order. */
typedef enum up_req_state {
    UP_RS_PENDING, /* in pool->pending: no connection yet */
    UP_RS_OPEN,    /* submitted on r->conn (stream_id > 0); callbacks may come */
    UP_RS_DONE,    /* final callback given, or cancelled: in pool->graveyard */
} up_req_state;

struct gw_upstream_req {
    gw_upstream_pool *pool;
    up_target *target;
    up_conn *conn;                /* while OPEN */
    gw_upstream_req *prev, *next; /* pool->pending, conn->reqs or pool->graveyard */
    up_req_state state;
    int32_t stream_id;
    gw_upstream_cbs cbs;
    void *ud;
    /* request: the pseudo-headers and headers as nghttp2 wants them, their
     * strings and the body, all in this allocation after the struct */
    nghttp2_nv *nv;
    size_t n_nv;
    const uint8_t *body;
    size_t body_len, body_off;
    /* response */
    bool responded;    /* on_response was called */
    bool proto_error;  /* nghttp2 found the response malformed */
    size_t unconsumed; /* bytes given to on_data and not yet consumed */
    int status;        /* of the HEADERS being received */
    char *hbuf;        /* its fields, "name\0value\0" each */
    size_t hlen, hcap, n_h;
    uint64_t moved_ns; /* the last sign of progress, for response_timeout_ms */
    gw_upstream_req *stalled_next; /* the sweep's list of requests to fail */
    bool never_sent;               /* ... its connection's transport not up when taken off */
};

struct up_conn {
    up_target *target;
    up_conn *prev, *next;      /* target->conns */
    int fd;                    /* closed after the bufferevent is freed */
    int connect_errno;         /* connect() failed at once: reported from deadline_ev */
    struct event *connect_ev;  /* the socket becomes writable: TCP connect done */
    struct event *deadline_ev; /* connect_timeout_ms until the peer's SETTINGS */
    struct event *idle_ev;     /* idle_close_ms without requests; then the linger bound */
    struct event *send_ev;     /* made active to run the send path from the loop */
    struct event *ping_ev;     /* every ping_interval_ms */
    struct bufferevent *bev;
    struct ssl_st *ssl; /* TLS targets; freed after the bufferevent */
    nghttp2_session *ngh;
    gw_upstream_req *reqs; /* OPEN requests on this connection */
    size_t n_reqs;
    bool ready;            /* transport up (TCP connected, TLS handshake and ALPN done) */
    bool established;      /* the peer's SETTINGS arrived: failures are resets, not connect errors */
    bool draining;         /* GOAWAY sent or received, or stream ids ran out: no new requests */
    bool lingering;        /* nghttp2 is done; waiting for the output to drain */
    bool proto_error;      /* the peer broke HTTP/2 on the connection */
    bool dead;             /* being torn down: no more nghttp2 calls */
    int fail;              /* gw_upstream_error the connection failed with, 0 if none */
    uint64_t ping_sent_ns; /* opaque data of the PING in flight, 0 if none */
};

struct up_target {
    up_target *next;
    gw_upstream_pool *pool;
    char *name; /* as given to gw_upstream_send */
    up_target_kind kind;
    struct sockaddr_storage addr;
    socklen_t addr_len;
    char host[256]; /* TLS: SNI and the name or address the certificate must match */
    bool host_is_ip;
    char peer_name[64]; /* "tls:NAME@": what the certificate must name too; "" for none */
    bool peer_told;     /* a refusal of this target was said: once, until a connection is taken */
    char *authority; /* default :authority */
    up_conn *conns;
    size_t n_conns;
    uint64_t used_ns; /* last asked for by name (up_target_get) */
    /* RTT from PING, microseconds */
    double rtt_ewma_us;
    double rtt_us[GW_UP_RTT_SAMPLES];
    unsigned n_rtt, rtt_pos;
    int64_t answered_ms; /* gw_mono_ms of the last PING answered; 0: none yet */
};

struct gw_upstream_pool {
    struct event_base *base;
    gw_upstream_opts opts; /* tls_* point to nothing: see the SSL_CTX */
    uint32_t conn_window;
    int ping_interval_ms;
    struct ssl_ctx_st *ssl_ctx;
    nghttp2_session_callbacks *cbs; /* shared by every connection */
    nghttp2_option *ngopt;
    up_target *targets;
    uint64_t targets_swept_ns;
    gw_upstream_req *pending, *pending_tail;
    gw_upstream_req *graveyard;
    struct event *kick_ev; /* dispatches pending requests and frees the graveyard */
    /* response_timeout_ms is kept by a sweep over the open requests every
     * eighth of it (10 ms to 1 s) rather than a timer per request: progress
     * then costs a clock read, not a timer re-armed per piece of body. */
    uint64_t response_timeout_ns; /* 0: none */
    struct event *stall_ev;
    /* Who must answer on a Unix target (gw_upstream_expect_pid), and the
     * connections refused for their peer's identity. */
    struct up_expect {
        char *target;
        int pid;
    } * expect;
    int n_expect;
    unsigned long long peer_refused;
    char peer_last[256];
};

/* ---- upstream.c ---- */

/* Makes the pool's kick event active. */
void up_pool_kick(gw_upstream_pool *p);
/* r is finished: it goes to the graveyard (it must be on no list). */
void up_req_retire(gw_upstream_req *r);
/* Adds an RTT sample to the target's statistics. */
void up_target_rtt_sample(up_target *t, double us);
/* The target of that name, parsed and added when new; NULL for a bad name
 * or out of memory. */
up_target *up_target_get(gw_upstream_pool *p, const char *name);
/* The pid that must listen on t (a Unix target), 0 when any may. */
int up_target_expected_pid(const up_target *t);
/* Counts a connection refused for its peer's identity; says why on stderr
 * the first time in a row for its target. */
void up_peer_refused(up_target *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* r's response moved (headers, a piece of body, or its reader took some):
 * its response timeout starts again. */
static inline void up_req_progress(gw_upstream_req *r)
{
    r->moved_ns = gw_mono_ns();
}

/* ---- upstream_conn.c ---- */

/* Sets the shared nghttp2 callbacks and options. 0 or -ENOMEM. */
int up_conn_callbacks_init(gw_upstream_pool *p);
/* A new connection to t, connecting (fd < 0) or over an already connected
 * cleartext socket (fd >= 0, owned from here, also on failure). Failures
 * to connect are reported later, from the loop. NULL on out of memory. */
up_conn *up_conn_new(up_target *t, int fd);
/* Frees without callbacks: requests still on it are only unlinked (for
 * gw_upstream_pool_free, which frees them itself). */
void up_conn_free(up_conn *c);
/* Whether new requests may go on c (not failing, closing or past GOAWAY). */
bool up_conn_usable(const up_conn *c);
/* How many requests the connection takes before another is opened. */
size_t up_conn_limit(const up_conn *c);
/* Submits r on c. 0, -EAGAIN (no stream ids left: c is draining now, try
 * another connection) or -ENOMEM. */
int up_conn_submit(up_conn *c, gw_upstream_req *r);
/* Takes r off its connection or off the pending list; with rst_code >= 0,
 * its stream is reset with that code. Returns its unconsumed bytes to the
 * connection window. */
void up_req_unlink(gw_upstream_req *r, int rst_code);
/* Acknowledges n bytes of r's response data. */
void up_conn_consume(gw_upstream_req *r, size_t n);
/* (Re)arms or stops the PING timer after the pool's interval changed. */
void up_conn_ping_rearm(up_conn *c);

/* For tests and fuzzers: a connection to `target` over an already
 * connected cleartext socket (socketpair); the pool owns fd from here.
 * 0, -EINVAL (bad target) or -ENOMEM. */
int gw_upstream_adopt(gw_upstream_pool *p, const char *target, int fd);
/* For tests: number of connections the pool holds to target. */
size_t gw_upstream_conn_count(gw_upstream_pool *p, const char *target);
/* Targets the pool keeps (forgotten once idle: sweep_targets). */
size_t gw_upstream_target_count(const gw_upstream_pool *p);

#endif
