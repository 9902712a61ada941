/* Internals of the Redis sync (routing/sync.h), shared by its files:
 * sync.c (options, lifecycle, the state below), sync_conn.c (the two
 * connections and every request's reply and deadline), sync_write.c (this
 * gateway's record and the heartbeat write), sync_read.c (peers' records),
 * sync_limit.c (the fleet-wide rate limit) and set_price.c (the command
 * line's blocking write). Not for use outside routing/: the callers' contract
 * is sync.h.
 *
 * Two hiredis async connections on the gateway's libevent loop: `cmd` for
 * every command, `sub` for SUBSCRIBE (a subscribed connection takes no
 * other commands). Each is ready once its setup (AUTH, SELECT, SCRIPT LOAD
 * or SUBSCRIBE) has answered. Every command on `cmd` that expects an answer
 * is a sync_req, linked in route_sync.pending until its reply, its deadline
 * or its context's free answers it. */
#ifndef ROUTE_SYNC_INTERNAL_H
#define ROUTE_SYNC_INTERNAL_H

#include "routing/instance.h"
#include "routing/sync.h"

#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include <event2/event.h>

#include <stdbool.h>
#include <stdint.h>
#include <sys/time.h>

/* Requests in flight on `cmd`; past it reads are skipped (the next full
 * read catches up) and limits answer -ENOTCONN (the local bucket decides).
 * Rate-limit checks, one or two per client request, stop short of it: the
 * rest is kept for the heartbeat and the reads, or a busy region's record
 * would expire from its peers' view exactly when it is busiest. */
#define SYNC_MAX_PENDING 4096
#define SYNC_MAX_PENDING_LIMITS (SYNC_MAX_PENDING - 256)
/* Keys SCAN walks per call: the full read takes (keys in the database /
 * this) round trips, and a Redis shared with other data (rate-limit keys,
 * an application's own) in another region must still be read well within
 * stale_after_ms. */
#define SYNC_SCAN_COUNT "1000"
/* "infergate:" + cluster (< ROUTE_NAME_MAX) + ":region:" */
#define SYNC_PREFIX_MAX 96
#define SYNC_KEY_MAX (SYNC_PREFIX_MAX + ROUTE_NAME_MAX)
#define SYNC_LIMIT_KEY_MAX 256
#define SYNC_ADDR_MAX 220

enum conn_kind { CONN_CMD, CONN_SUB };

/* Entries of other gateways under our region name seen in the hash. Past
 * this many, the rest are left alone (and readers merge only
 * ROUTE_MAX_INSTANCES). */
#define SYNC_MAX_SIBLINGS 32

typedef struct sibling {
    char id[ROUTE_INSTANCE_ID_LEN + 1];
    uint64_t digest;    /* of its entry's bytes */
    int64_t changed_ms; /* gw_mono_ms() when we saw them */
} sibling;

typedef struct sync_conn {
    route_sync *s;
    enum conn_kind kind;
    redisAsyncContext *ac; /* NULL while down */
    bool ready;
    int setup_left; /* setup replies still awaited */
    int backoff_ms;
    int64_t ready_ms;       /* gw_mono_ms() when it became ready */
    struct event *setup_ev; /* setup deadline */
    struct event *retry_ev; /* reconnect after back-off */
} sync_conn;

enum req_kind { REQ_WRITE, REQ_READ, REQ_SCAN, REQ_LIMIT, REQ_SPEND };

typedef struct sync_req {
    route_sync *s;
    redisAsyncContext *ac;
    enum req_kind kind;
    struct event *deadline;
    struct sync_req *prev, *next;
    /* REQ_WRITE: the record written, whether this write announced, and
     * where in EXEC's answer the price override is */
    route_record rec;
    bool announced;
    int price_at;
    char gone[SYNC_MAX_SIBLINGS][ROUTE_INSTANCE_ID_LEN + 1]; /* the entries it removed */
    int n_gone;
    /* REQ_READ */
    char name[ROUTE_NAME_MAX];
    /* REQ_LIMIT */
    route_limit_cb cb; /* NULL once cancelled */
    void *ud;
    bool retried;
    char key[SYNC_PREFIX_MAX + SYNC_LIMIT_KEY_MAX + 1];
    char key_last[SYNC_PREFIX_MAX + SYNC_LIMIT_KEY_MAX + 1]; /* the server time key[] was written */
    char args[4][32]; /* rate, burst, cost, force */
    /* REQ_SPEND: key and key_last are the tenant's day and month totals */
    route_spend_cb spend_cb;                     /* NULL once cancelled */
    char spend_key[SYNC_PREFIX_MAX + 16];        /* the day's breakdown */
    char spend_field[ROUTE_NAME_MAX + 72 + 260]; /* "region|tenant|model" */
    char spend_args[ROUTE_SPEND_N][32];
} sync_req;

struct route_sync {
    struct event_base *base;
    route_table *table;
    route_sync_opts o;
    char host[64];
    char addr[SYNC_ADDR_MAX];
    char password[256];
    bool has_password;
    char cluster[ROUTE_NAME_MAX];
    bool host_ok;
    char prefix_region[SYNC_PREFIX_MAX]; /* "infergate:<cluster>:region:" */
    char prefix_price[SYNC_PREFIX_MAX];
    char prefix_limit[SYNC_PREFIX_MAX];
    char prefix_limit_at[SYNC_PREFIX_MAX]; /* when a limit key was written (route_sync__gcra_lua) */
    char channel[SYNC_PREFIX_MAX];
    char scan_match[SYNC_PREFIX_MAX];

    sync_conn cmd, sub;
    char sha[48]; /* of route_sync__gcra_lua, from SCRIPT LOAD */

    struct event *heartbeat_ev, *full_read_ev;
    bool scan_active;
    int64_t scan_started_ms; /* gw_mono_ms */
    bool rescan; /* a full read was asked for during one: its SCAN may have passed news */
    /* A Redis that answers with errors (a replica after a failover says
     * READONLY, a full one OOM) freezes the table's clock as a lost one
     * does; it is trusted again once a full read has gone through with no
     * command failing since it began, and the last write went through. */
    bool scan_failed;
    bool write_ok;

    bool has_local;
    route_record local; /* as the caller set it */
    bool has_override;
    double override_in, override_out;
    bool has_carbon_override; /* `region set-carbon`: the price hash's carbon field */
    double override_carbon;
    bool override_drain; /* `region drain`: the price hash's drain field is 1 */
    bool has_announced;
    route_record announced; /* what peers were last told about */

    /* Gateways that share a region name (several behind a load balancer)
     * each write their record as the entry of this process's random id
     * (routing/instance.h). The key's TTL is renewed by whichever writes,
     * so each also removes the entries of the others that stopped: an
     * entry whose bytes have not changed for a TTL (by our clock, so
     * theirs may be skewed) goes with our next write. */
    char instance[ROUTE_INSTANCE_ID_LEN + 1];
    sibling sib[SYNC_MAX_SIBLINGS];
    int n_sib;
    int64_t sib_seen_ms; /* when sib[] was last read (gw_mono_ms) */

    sync_req *pending; /* every request in flight */
    int n_pending;
    int64_t last_ok_ms;
    unsigned rng;
    bool freeing;
    char err[256];
    unsigned long long auth_refused; /* route_sync_auth_refused */
    char auth_last[160];
};

static inline struct timeval route_sync__ms_tv(int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    return tv;
}

/* ---- sync.c ---- */

/* The last problem, for route_sync_last_error. */
void route_sync__set_err(route_sync *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Redis answered, with an error: the table stops trusting what it holds. */
void route_sync__store_failed(route_sync *s);
/* Whether an object read from Redis (kind "region" or "price", its
 * fields) is proved by a fleet key (routing/record_auth.h): 0, or the
 * refusal said (route_sync__set_err) and counted. Always 0 without keys. */
int route_sync__auth_check(route_sync *s, const char *kind, const char *region, const char *const *names,
                           const char *const *values, const size_t *lens, int n);
/* A region or cluster name: 1-63 of [A-Za-z0-9._-] (they become keys). */
bool route_sync__name_ok(const char *n);
void route_sync__format_addr(char *out, size_t len, const char *host, int port);

/* ---- sync_conn.c ---- */

/* 0 or -ENOMEM. Both connections are started by route_sync_new. */
int route_sync__conn_init(route_sync *s, sync_conn *c, enum conn_kind kind);
void route_sync__conn_start(sync_conn *c);
/* Drops a live context (every pending request is answered with NULL) and
 * reconnects after back-off. */
void route_sync__conn_drop(sync_conn *c);
void route_sync__conn_dispose(sync_conn *c);
/* NULL on out of memory. */
sync_req *route_sync__req_new(route_sync *s, enum req_kind kind);
void route_sync__req_free(sync_req *q);
/* Sends argv on `cmd` with q as the reply's context and arms its deadline:
 * 0, or -ENOTCONN and q is still the caller's (the reply never comes). */
int route_sync__req_send(sync_req *q, int argc, const char **argv, const size_t *lens);
/* A command inside MULTI, its answer folded into the EXEC that follows. */
int route_sync__send_plain(route_sync *s, int argc, const char **argv);

/* ---- sync_write.c: the replies of REQ_WRITE, and the heartbeat timer ---- */

void route_sync__heartbeat(route_sync *s);
void route_sync__on_heartbeat(evutil_socket_t fd, short what, void *arg);
void route_sync__on_write(route_sync *s, sync_req *q, redisReply *r);
/* This gateway's price override, as read in `price` (an HGETALL reply). */
void route_sync__apply_own_override(route_sync *s, const redisReply *price);

/* ---- sync_read.c: REQ_READ and REQ_SCAN ---- */

/* 0, -ENOTCONN (the connection was dropped), -EBUSY (too many pending) or
 * -ENOMEM. */
int route_sync__read_region(route_sync *s, const char *name);
void route_sync__full_read_start(route_sync *s);
void route_sync__on_full_read(evutil_socket_t fd, short what, void *arg);
void route_sync__on_read(route_sync *s, sync_req *q, redisReply *r);
void route_sync__on_scan(route_sync *s, redisReply *r);
/* {input, output} of region's price hash; false when absent, malformed
 * or not proved by a fleet key (route_sync__auth_check). */
bool route_sync__price_parse(route_sync *s, const char *region, const redisReply *r, double *in, double *out);
/* The same hash's carbon field (gCO2e/kWh, `infergate region set-carbon`),
 * on the same terms. */
bool route_sync__carbon_parse(route_sync *s, const char *region, const redisReply *r, double *carbon);
/* Whether a proved override hash (HGETALL reply) drains region. */
bool route_sync__drain_parse(route_sync *s, const char *region, const redisReply *r);

/* ---- sync_limit.c: REQ_LIMIT ---- */

extern const char route_sync__gcra_lua[]; /* loaded by SCRIPT LOAD at connect */
/* Runs q's callback once (none after cancel or while freeing). */
void route_sync__limit_answer(sync_req *q, int result, int retry_after_ms);
/* true when q was re-sent (and is still in flight). */
bool route_sync__on_limit(route_sync *s, sync_req *q, redisReply *r);

/* ---- sync_spend.c: REQ_SPEND ---- */

void route_sync__on_spend(route_sync *s, sync_req *q, redisReply *r);
/* q's answer when its reply never comes (connection lost, deadline). */
void route_sync__spend_answer_lost(sync_req *q);

/* ---- set_price.c: the command line's blocking connection ---- */

/* Connects to o's Redis (AUTH, SELECT done) with its own timeout; NULL and
 * *rc, err set on failure. addr (SYNC_ADDR_MAX) gets the address, for
 * messages. */
redisContext *route_sync__blocking_open(const route_sync_opts *o, char *addr, int *rc, char *err,
                                        size_t err_len);
int route_sync__blocking_command(redisContext *c, const char *addr, int argc, const char **argv,
                                 long long *integer, char *err, size_t err_len);

#endif
