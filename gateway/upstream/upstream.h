/* Upstream: a pool of HTTP/2 client connections from the gateway to its
 * targets — local workers (h2c over a Unix socket) and, for cross-region
 * routing, other gateways (h2 over TCP, with TLS). Many streams share one
 * connection per target; connections are made on demand and reused.
 *
 * Request bodies are passed through unchanged. Response data is handed to
 * the caller as it arrives; the caller acknowledges it with
 * gw_upstream_consume once it has passed it on, and only then does the
 * pool open the stream's flow-control window again, so a slow client holds
 * back its upstream stream instead of filling a buffer.
 *
 * Every call and callback happens on the loop's thread. After on_end or
 * on_error, or after gw_upstream_cancel returns, the request handle is
 * invalid and no more callbacks come for it. Callbacks are never called
 * from inside gw_upstream_send or gw_upstream_cancel. */
#ifndef GW_UPSTREAM_H
#define GW_UPSTREAM_H

#include "gateway/http/http.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;

typedef struct gw_upstream_pool gw_upstream_pool;
typedef struct gw_upstream_req gw_upstream_req;

typedef enum gw_upstream_error {
    GW_UP_CONNECT = 1, /* could not connect (refused, no such socket, TLS handshake failed) */
    GW_UP_RESET,       /* the stream was reset or the connection closed under it */
    GW_UP_PROTOCOL,    /* the peer broke HTTP/2 */
    GW_UP_TIMEOUT,     /* connect timeout, the connection's PING unanswered for ten ping
                          intervals, or response_timeout_ms passed before the connection's
                          transport was up (the target never had the request) */
    GW_UP_NOMEM,
    GW_UP_STALLED, /* the response stood still for response_timeout_ms (the target
                      had the request all that time: not one to retry blindly) */
    GW_UP_REFUSED, /* RST_STREAM(REFUSED_STREAM) before any answer: the target did not
                      process it (RFC 9113 8.7) and is not failing; send it again */
} gw_upstream_error;

const char *gw_upstream_error_name(gw_upstream_error e); /* "connect", "reset", ... */

typedef struct gw_upstream_opts {
    int connect_timeout_ms;        /* default 3000 */
    /* The longest a request's response may stand still (GW_UP_STALLED):
     * until its headers, then between pieces of its body. Data taken by
     * the caller counts as movement, and while the caller holds data it
     * has not taken the clock waits for it: a response held back by a slow
     * reader is not blamed on the target. Default 0 = none. */
    int response_timeout_ms;
    uint32_t stream_window;        /* per-stream receive window; default 256 KiB */
    int max_streams_per_conn;      /* default 128; past it a second connection is opened */
    int idle_close_ms;             /* close a connection idle this long; default 60000 */
    /* TLS to remote targets ("tls:" targets); all optional. */
    const char *tls_ca_file;       /* verify the peer against this CA (else the system store) */
    const char *tls_cert_file;     /* client certificate for mutual TLS */
    const char *tls_key_file;
} gw_upstream_opts;

void gw_upstream_opts_default(gw_upstream_opts *o);

typedef struct gw_upstream_cbs {
    /* Response headers (status >= 200). */
    void (*on_response)(void *ud, int status, const gw_http_header *headers, size_t n_headers);
    /* A piece of the response body; acknowledge with gw_upstream_consume. */
    void (*on_data)(void *ud, const uint8_t *data, size_t len);
    /* The response ended normally. */
    void (*on_end)(void *ud);
    /* The request failed; `responded` says whether on_response had come. */
    void (*on_error)(void *ud, gw_upstream_error err, bool responded);
    /* May be NULL (trailers are then dropped): the response's trailer
     * fields, after its last on_data and just before on_end. */
    void (*on_trailers)(void *ud, const gw_http_header *trailers, size_t n);
} gw_upstream_cbs;

/* NULL on failure (err filled: e.g. a bad CA or certificate file). */
gw_upstream_pool *gw_upstream_pool_new(struct event_base *base, const gw_upstream_opts *o, char *err,
                                       size_t err_len);
/* Resets every stream (no callbacks) and closes every connection. Not
 * from inside a callback of the pool. */
void gw_upstream_pool_free(gw_upstream_pool *p);

/* Sends a request to target: "unix:/path" (h2c), "tcp:HOST:PORT" (h2c),
 * "tls:HOST:PORT" (h2 over TLS, ALPN h2, SNI and verification against HOST)
 * or "tls:NAME@HOST:PORT" (the same, and the certificate must also carry
 * NAME as its subject CN or a DNS SAN, as a listener's peer_names checks:
 * a peer region's name; a connection to one that does not fails as
 * GW_UP_CONNECT and is counted by gw_upstream_peer_refused).
 * HOST is a numeric IPv4 address, [IPv6] or localhost: names are not
 * resolved, which would block the loop. A connection counts as made once
 * the peer's SETTINGS arrive: a failure before (within connect_timeout_ms)
 * is GW_UP_CONNECT or GW_UP_TIMEOUT. The process must ignore SIGPIPE.
 * headers are regular headers (lower-case names, no pseudo-headers, no
 * connection-specific ones); authority fills :authority. The body is copied.
 * Returns NULL when the request cannot even be queued (out of memory, bad
 * target); otherwise every outcome arrives through the callbacks. */
gw_upstream_req *gw_upstream_send(gw_upstream_pool *p, const char *target, const char *method, const char *path,
                                  const char *authority, const gw_http_header *headers, size_t n_headers,
                                  const void *body, size_t body_len, const gw_upstream_cbs *cbs, void *ud);
/* The caller has passed on n bytes of response data. */
void gw_upstream_consume(gw_upstream_req *r, size_t n);
/* Resets the stream (RST_STREAM CANCEL): the target stops its work. */
void gw_upstream_cancel(gw_upstream_req *r);

/* Round-trip time of the target's pooled connection, from HTTP/2 PING
 * frames sent every ping_interval_ms while the connection is open
 * (0 = never): smoothed (a peak EWMA: a sample above it, or a PING
 * unanswered for longer, counts at once; one below pulls it down by 1/8)
 * and the 95th percentile of the last 64 samples, in microseconds.
 * -ENOENT when no sample yet. */
int gw_upstream_rtt(gw_upstream_pool *p, const char *target, double *ewma_us, double *p95_us);
/* When the target last answered one of those PINGs (gw_mono_ms); 0 when
 * never, or the target is unknown. A peer's own sign of life, whatever
 * the shared store says of it. */
int64_t gw_upstream_ping_answered_ms(gw_upstream_pool *p, const char *target);
void gw_upstream_set_ping_interval(gw_upstream_pool *p, int ping_interval_ms);
/* Changes response_timeout_ms (0: none), for the requests in flight too. */
void gw_upstream_set_response_timeout(gw_upstream_pool *p, int response_timeout_ms);
/* Reads the TLS files again (a certificate renewed in place): connections
 * made from now on use them, open ones keep theirs. -EINVAL with err filled
 * when they do not load, and the pool keeps what it had. */
int gw_upstream_set_tls(gw_upstream_pool *p, const char *ca_file, const char *cert_file, const char *key_file,
                        char *err, size_t err_len);
/* Opens a connection to target now (so RTT is measured before any request). */
int gw_upstream_connect(gw_upstream_pool *p, const char *target);
/* Connections refused for their peer's identity since the pool was made: a
 * "tls:NAME@" target whose certificate does not carry NAME, a Unix target
 * whose listener is not the process gw_upstream_expect_pid named. *last,
 * when last is not NULL, says the last one ("" if none yet). */
unsigned long long gw_upstream_peer_refused(const gw_upstream_pool *p, const char **last);
/* The process that must be listening on a "unix:" target (a worker the
 * supervisor started): a connection whose peer (SO_PEERCRED) is another is
 * refused as GW_UP_CONNECT, and counted above; pid 0 forgets the target
 * (no check). 0, or -ENOMEM. */
int gw_upstream_expect_pid(gw_upstream_pool *p, const char *target, int pid);

#endif
