/* Region state shared through Redis (hiredis async on the gateway's
 * libevent loop; any server speaking the protocol: Redis, Valkey).
 *
 * Keys (cluster = key prefix):
 *   infergate:<cluster>:region:<name>   hash of the record: the fields of
 *                                       route_record_to_fields (the last
 *                                       writer's, for gateways before
 *                                       entries) and one entry per gateway
 *                                       of the region (routing/instance.h),
 *                                       TTL = heartbeat * ttl_heartbeats
 *   infergate:<cluster>:price:<name>    hash {input, output}: a price set at run time
 *                                       (`infergate region set-price`), and/or
 *                                       {carbon} (`set-carbon`, gCO2e/kWh); it overrides
 *                                       the record's price for every reader, and
 *                                       the owner publishes it as its own
 *   infergate:<cluster>:events          pub/sub: the name of a region that changed
 *   infergate:<cluster>:spend:<tenant>:day:<YYYY-MM-DD>  hash of a tenant's totals that
 *   infergate:<cluster>:spend:<tenant>:month:<YYYY-MM>   UTC day / month (route_spend_fields),
 *                                       TTL 3 / 70 days (route_sync_spend_add)
 *   infergate:<cluster>:usage:<YYYY-MM-DD>  hash "<field>|<region>|<tenant>|<model>": the day's
 *                                       breakdown (`infergate usage`), TTL 400 days
 *
 * Every heartbeat this gateway writes its record (HSET + PEXPIRE in one
 * MULTI), removes the entries of its region's other gateways that stopped
 * writing, and reads its price override; on a change it also PUBLISHes. A
 * peer's record is its gateways' entries merged. It
 * SUBSCRIBEs to the events channel (a second connection) and re-reads a
 * region when told, and reads every region in full (SCAN + HGETALL) every
 * full_read_ms. hiredis 0.14 has no command timeouts: each command carries
 * a deadline timer of ours, and a connection whose command misses it is
 * dropped and re-made with back-off. While Redis is away the table keeps
 * the last records (they go stale on their own clock), and on reconnect the
 * record is published and everything read again.
 *
 * Where it is done: sync.c (options, lifecycle, status), sync_conn.c (the
 * two connections: setup, reconnect, deadlines, reply dispatch),
 * sync_write.c (the local record, the heartbeat write, announcements),
 * sync_read.c (peers' records: announced and full reads, merged through
 * routing/instance.h), sync_limit.c (the fleet-wide rate limit),
 * sync_spend.c (spend and budgets' totals), usage.c (their blocking read),
 * set_price.c (route_set_price, blocking); their shared state is
 * sync_internal.h. */
#ifndef ROUTE_SYNC_H
#define ROUTE_SYNC_H

#include "routing/record_auth.h"
#include "routing/region.h"

#include <stdbool.h>
#include <stdint.h>

struct event_base;
typedef struct route_sync route_sync;

typedef struct route_sync_opts {
    const char *host; /* numeric address or "localhost" */
    int port;
    const char *password; /* NULL or "": none (no AUTH) */
    int db;
    const char *cluster;
    int heartbeat_ms;       /* 1000 */
    int ttl_heartbeats;     /* 3 */
    int full_read_ms;       /* 5000 */
    int command_timeout_ms; /* 500 */
    int reconnect_min_ms;   /* 100 */
    int reconnect_max_ms;   /* 1000 */
    /* The fleet keys (routing/record_auth.h): with any, the record and
     * price overrides this gateway writes are signed with the first, and a
     * peer's record or a price override that none proves is ignored (said
     * in route_sync_last_error, counted by route_sync_auth_refused). None
     * (the default): nothing is signed or checked. */
    route_auth_keys auth;
} route_sync_opts;

void route_sync_opts_default(route_sync_opts *o);
/* 0 when route_sync_new can use o: host numeric or "localhost" (a name
 * would block the loop in getaddrinfo), port, db, cluster of
 * [A-Za-z0-9._-], timings positive. Else -EINVAL with err (for the config
 * loader; route_sync_new with bad options never connects and says why in
 * route_sync_last_error). */
int route_sync_opts_check(const route_sync_opts *o, char *err, size_t err_len);

/* Starts connecting (failures are retried, never fatal). The table is
 * updated in place on the loop's thread. NULL on out of memory. */
route_sync *route_sync_new(struct event_base *base, const route_sync_opts *o, route_table *table);
void route_sync_free(route_sync *s);
/* The local record to publish from now on (copied). A change from the last
 * one published is announced at once. */
void route_sync_set_local(route_sync *s, const route_record *rec);
bool route_sync_connected(const route_sync *s);
/* Epoch ms of the last successful exchange with Redis (0: never). */
int64_t route_sync_last_ok_ms(const route_sync *s);
/* The last problem with Redis, for logs and /v1/regions ("" if none yet);
 * kept after recovery, so read it together with route_sync_connected. */
const char *route_sync_last_error(const route_sync *s);
/* Records and price overrides read from Redis that no fleet key proved
 * (each read of one counts), since the start; *last, when last is not NULL,
 * says the last one's region and why ("" if none yet). */
unsigned long long route_sync_auth_refused(const route_sync *s, const char **last);
/* New fleet keys (a rotation: a reload), for the records written and read
 * from now on. */
void route_sync_set_auth(route_sync *s, const route_auth_keys *k);

/* Fleet-wide rate limit, one atomic GCRA script per check (EVALSHA, loaded
 * on connect): `cost` units against a limit of `rate` per second with a
 * burst of `burst`, under key infergate:<cluster>:limit:<key> (and
 * infergate:<cluster>:limit-at:<key>, when it was written). The callback
 * gets 0 (allowed), -EAGAIN with retry_after_ms (limited), or -ENOTCONN
 * when Redis is away or missed its deadline — then the caller uses its
 * local bucket. Returns 0, or -ENOTCONN at once (no callback) when not
 * connected. */
/* The callback never runs inside route_sync_limit, and must not call
 * route_sync_free; -EINVAL for a rate or cost <= 0, a negative burst or a
 * key longer than 256 bytes. Errors the server returns answer -ENOTCONN
 * too (the local bucket decides). */
typedef void (*route_limit_cb)(void *ud, int result, int retry_after_ms);
int route_sync_limit(route_sync *s, const char *key, double rate, double burst, double cost, route_limit_cb cb,
                     void *ud);
/* Forgets a pending limit callback (the request went away). */
void route_sync_limit_cancel(route_sync *s, void *ud);
/* Gives back `amount` of what route_sync_limit charged under key (same
 * rate and burst), when it turned out not used; the bucket never fills past
 * full. Fire and forget: 0 when sent, -ENOTCONN when not connected (the
 * refund is lost), -EINVAL as route_sync_limit, or for amount <= 0. */
int route_sync_refund(route_sync *s, const char *key, double rate, double burst, double amount);
/* Takes `amount` more under key without asking (the estimate was low: a
 * completion ran longer than charged for); the bucket may go into debt,
 * and the next requests wait. Fire and forget, as route_sync_refund. */
int route_sync_charge(route_sync *s, const char *key, double rate, double burst, double amount);

/* Spend (issue 31): what requests cost, their tokens and emissions, added
 * up per tenant for its budget and per tenant, model and region for
 * `infergate usage`. Amounts are in route_spend_fields' order. */
enum {
    ROUTE_SPEND_COST,       /* in the prices' currency */
    ROUTE_SPEND_PROMPT,     /* tokens */
    ROUTE_SPEND_COMPLETION, /* tokens */
    ROUTE_SPEND_GCO2E,
    ROUTE_SPEND_ENERGY_WH,
    ROUTE_SPEND_REQUESTS,
    ROUTE_SPEND_N
};
/* Their names in Redis' hashes: cost prompt_tokens completion_tokens gco2e
 * energy_wh requests. */
extern const char *const route_spend_fields[ROUTE_SPEND_N];

typedef struct route_spend {
    const char *tenant; /* 1-64 of [A-Za-z0-9._-] */
    const char *model;  /* at most 256 bytes; "": "-" */
    const char *region; /* a region name; "": "-" */
    const char *day;    /* "YYYY-MM-DD", UTC: the day (and month) it is counted in */
    double v[ROUTE_SPEND_N];
} route_spend;

/* Whether day is "YYYY-MM-DD" (digits and dashes; the calendar unchecked). */
bool route_spend_day_ok(const char *day);

/* result 0 with the tenant's cost that day and that month after the
 * operation, or -ENOTCONN (Redis away, missed the deadline, or answered an
 * error: then nothing is known of whether an addition was applied). Never
 * runs inside the call that asked, nor after route_sync_spend_cancel(ud). */
typedef void (*route_spend_cb)(void *ud, int result, double day_cost, double month_cost);
/* Adds a's amounts to its tenant's day and month totals and to the day's
 * breakdown, in one atomic script (EVAL). 0 when sent (cb, if any, says
 * how it went), -ENOTCONN at once when not connected, -EINVAL for a
 * malformed name, day or a non-finite amount, -ENOMEM. */
int route_sync_spend_add(route_sync *s, const route_spend *a, route_spend_cb cb, void *ud);
/* Reads tenant's cost the day `day` and its month; returns as
 * route_sync_spend_add (cb required). */
int route_sync_spend_read(route_sync *s, const char *tenant, const char *day, route_spend_cb cb, void *ud);
/* Forgets the callbacks still pending for ud. */
void route_sync_spend_cancel(route_sync *s, void *ud);

/* `infergate usage`: one amount of the breakdown (the day, which amount,
 * region, tenant, model: "-" when none). */
typedef void (*route_usage_cb)(void *ud, const char *day, int field, const char *region, const char *tenant,
                               const char *model, double value);
/* Reads the breakdown of each UTC day from `from` to `to` (both
 * "YYYY-MM-DD", at most 400 days) over a blocking connection of its own,
 * calling cb per amount (tenant: only that tenant's, or NULL for all).
 * 0 or -errno, err filled. */
int route_usage_read(const route_sync_opts *o, const char *from, const char *to, const char *tenant,
                     route_usage_cb cb, void *ud, char *err, size_t err_len);

/* `infergate region set-price`: writes the price override (signed with
 * o->auth's first key; -EINVAL without one: the gateways would ignore it)
 * and announces it (blocking, with a timeout; for the command line). 0 or
 * -errno, err filled. */
/* On success err holds a warning, or "" (e.g. no gateway of that region
 * publishes now: the price is stored all the same). */
int route_set_price(const route_sync_opts *o, const char *region, double input, double output, char *err,
                    size_t err_len);
/* `infergate region set-carbon`: the region's grid carbon intensity
 * (gCO2e/kWh, 0 to ROUTE_MAX_CARBON), the override hash's carbon field,
 * on the same terms as route_set_price (each keeps the other's fields).
 * It overrides the record's carbon for every reader. */
int route_set_carbon(const route_sync_opts *o, const char *region, double carbon, char *err, size_t err_len);
/* `infergate region drain|undrain`: the hash's drain field, 1 or 0, on the
 * same terms. A drained region is published unhealthy and draining by its
 * own gateway, and taken so by every peer as soon as the announcement
 * reaches it: no new request goes there, its streams finish, no process
 * exits. */
int route_set_drain(const route_sync_opts *o, const char *region, bool drained, char *err, size_t err_len);

#endif
