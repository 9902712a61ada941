/* Region state shared through Redis: this gateway's record written every
 * heartbeat, every peer's record read on announcement and in full (the
 * entries of its gateways merged: routing/instance.h), run-time price
 * overrides, and the fleet-wide GCRA rate limit (routing/sync.h).
 *
 * Two hiredis async connections on the gateway's libevent loop: `cmd` for
 * every command, `sub` for SUBSCRIBE (a subscribed connection takes no
 * other commands). Each is ready once its setup (AUTH, SELECT, SCRIPT LOAD
 * or SUBSCRIBE) has answered.
 *
 * What is announced. The events channel carries a region's name when its
 * record changed in a way that moves routing decisions: endpoint, models,
 * tags, price, GPU, capacity or health at once (route_sync_set_local, or a
 * price override seen at the heartbeat), and a material load change at the
 * next heartbeat: queued going to or from zero, running+queued moving by
 * max(1, capacity/8) or a TTFT/per-token estimate by 25%. So a region
 * announces at most about once a heartbeat for load, and each announcement
 * costs every peer one read. Smaller load drift reaches peers through the
 * full read every full_read_ms. A peer's record is upserted (seen_ms = now)
 * only when it differs from the table's copy: every heartbeat stamps a new
 * updated_ms, so a live peer is refreshed by every read while a dead one
 * (whose key lives on for its TTL) is not. The table's stale_after_ms must
 * therefore exceed full_read_ms plus a heartbeat, or a quiet live peer goes
 * stale between full reads.
 *
 * Deadlines. hiredis 0.14 has no command timeouts: every request carries a
 * libevent timer of command_timeout_ms and a connection's setup one more;
 * a miss on `cmd` drops both connections (the same server is hung; `sub`
 * sends nothing it could miss), a miss on `sub` drops `sub`. Both use TCP
 * keepalive for the quiet case.
 *
 * hiredis 0.14 freeing rules this file relies on: redisAsyncFree() runs
 * every pending callback with a NULL reply before it frees, and is deferred
 * to the end of the callback when called inside one; onConnect(error) is
 * followed by hiredis freeing the context by itself; onDisconnect runs from
 * inside the free. So a NULL reply means "this context is going away":
 * forget it, never free it again, and only ever free the context that
 * c->ac still names (c->ac is cleared first, which also makes any command
 * issued from a callback during the free fail with -ENOTCONN). */
#define _GNU_SOURCE
#include "routing/sync.h"
#include "gateway/base/clock.h"
#include "routing/instance.h"
#include "routing/route_internal.h"

#include <hiredis/hiredis.h>
#include <hiredis/async.h>
#include <hiredis/adapters/libevent.h>

#include <event2/event.h>

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/random.h>
#include <unistd.h>

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

/* GCRA on the server's clock (TIME), so gateways with skewed clocks share
 * one schedule. KEYS[1] holds the TAT (theoretical arrival time) in ms,
 * a plain number as gateways before this one read and write it (a rolling
 * upgrade shares buckets with them); KEYS[2] the server time it was
 * written at: when that clock has stepped back since, the TAT moves back
 * with it (else every check would be refused for as long as the step, a
 * tenant locked out by a clock fix). An older gateway's write leaves
 * KEYS[2] behind it, so the step goes unseen then, as it did before.
 * Both keys are passed in KEYS, as a script must name what it touches.
 * ARGV: rate per second, burst, cost, force. Returns {1, 0} allowed or
 * {0, retry_after_ms}. A cost above the whole burst is admitted once the
 * bucket is full (TAT not ahead of now), leaving it in debt, as the local
 * bucket does; refused, it waits until the bucket is full. A negative
 * cost is a refund: TAT moves back by it, never before now. replicate_commands
 * lets Redis < 5 write after TIME. */
static const char gcra_lua[] =
    "if redis.replicate_commands then pcall(redis.replicate_commands) end\n"
    "local rate = tonumber(ARGV[1])\n"
    "local burst = tonumber(ARGV[2])\n"
    "local cost = tonumber(ARGV[3])\n"
    "local force = ARGV[4] == '1'\n"
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000\n"
    "local interval = 1000 / rate\n"
    "local increment = interval * cost\n"
    "local tolerance = interval * burst\n"
    "local tat = tonumber(redis.call('GET', KEYS[1]))\n"
    "local last = tonumber(redis.call('GET', KEYS[2]))\n"
    "if tat and last and now < last then tat = tat - (last - now) end\n"
    "if not tat or tat < now then tat = now end\n"
    "local new_tat = tat + increment\n"
    "if cost < 0 then\n"
    "  if new_tat <= now then redis.call('DEL', KEYS[1], KEYS[2]) return {1, 0} end\n"
    "elseif force then\n"
    "elseif cost > burst then\n"
    "  if tat > now then return {0, math.ceil(tat - now)} end\n"
    "else\n"
    "  local diff = now - (new_tat - tolerance)\n"
    "  if diff < 0 then return {0, math.ceil(-diff)} end\n"
    "end\n"
    "local ttl = math.ceil(new_tat - now) + 1\n"
    "redis.call('SET', KEYS[1], string.format('%.3f', new_tat), 'PX', ttl)\n"
    "redis.call('SET', KEYS[2], string.format('%.3f', now), 'PX', ttl)\n"
    "return {1, 0}\n";

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

enum req_kind { REQ_WRITE, REQ_READ, REQ_SCAN, REQ_LIMIT };

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
    char prefix_limit_at[SYNC_PREFIX_MAX]; /* when a limit key was written (gcra_lua) */
    char channel[SYNC_PREFIX_MAX];
    char scan_match[SYNC_PREFIX_MAX];

    sync_conn cmd, sub;
    char sha[48]; /* of gcra_lua, from SCRIPT LOAD */

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
};

static struct timeval ms_tv(int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    return tv;
}

static void set_err(route_sync *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_err(route_sync *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, sizeof(s->err), fmt, ap);
    va_end(ap);
}

/* Redis answered, with an error: what it holds cannot be trusted to be
 * current (see scan_failed). */
static void store_failed(route_sync *s)
{
    s->scan_failed = true;
    if (!s->freeing)
        route_table_set_shared_ok(s->table, false, gw_mono_ms());
}

/* Names become Redis keys and response headers: keep them to a safe set. */
static bool name_ok(const char *n)
{
    size_t len = strlen(n);
    if (len == 0 || len >= ROUTE_NAME_MAX)
        return false;
    for (size_t i = 0; i < len; i++) {
        char ch = n[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' ||
              ch == '_' || ch == '.'))
            return false;
    }
    return true;
}

/* redisAsyncConnect resolves with getaddrinfo, which blocks on a name: only
 * literal addresses (and localhost, mapped here) keep the loop unblocked. */
static bool host_literal(const char *host, char *out, size_t out_len)
{
    unsigned char buf[sizeof(struct in6_addr)];
    if (!strcmp(host, "localhost"))
        host = "127.0.0.1";
    else if (inet_pton(AF_INET, host, buf) != 1 && inet_pton(AF_INET6, host, buf) != 1)
        return false;
    if (strlen(host) >= out_len)
        return false;
    strcpy(out, host);
    return true;
}

void route_sync_opts_default(route_sync_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->host = "127.0.0.1";
    o->port = 6379;
    o->password = NULL;
    o->db = 0;
    o->cluster = "default";
    o->heartbeat_ms = 1000;
    o->ttl_heartbeats = 3;
    o->full_read_ms = 5000;
    o->command_timeout_ms = 500;
    o->reconnect_min_ms = 100;
    o->reconnect_max_ms = 5000;
}

int route_sync_opts_check(const route_sync_opts *o, char *err, size_t err_len)
{
    char host[64];
    if (!o->host || !host_literal(o->host, host, sizeof(host))) {
        snprintf(err, err_len, "redis host '%s' must be a numeric address or localhost",
                 o->host ? o->host : "");
        return -EINVAL;
    }
    if (o->port < 1 || o->port > 65535) {
        snprintf(err, err_len, "redis port %d is out of range", o->port);
        return -EINVAL;
    }
    if (o->db < 0) {
        snprintf(err, err_len, "redis db %d is negative", o->db);
        return -EINVAL;
    }
    if (o->password && strlen(o->password) >= 256) {
        snprintf(err, err_len, "redis password is longer than 255 bytes");
        return -EINVAL;
    }
    if (!o->cluster || !name_ok(o->cluster)) {
        snprintf(err, err_len, "cluster name '%s' must be 1-63 of [A-Za-z0-9._-]",
                 o->cluster ? o->cluster : "");
        return -EINVAL;
    }
    if (o->heartbeat_ms < 10 || o->ttl_heartbeats < 1 || o->full_read_ms < 10 || o->command_timeout_ms < 1 ||
        o->reconnect_min_ms < 1 || o->reconnect_max_ms < o->reconnect_min_ms) {
        snprintf(err, err_len, "redis timings must be positive (heartbeat >= 10 ms, reconnect max >= min)");
        return -EINVAL;
    }
    return 0;
}

/* "[::1]:6379" or "10.0.0.5:6379", for messages. */
static void format_addr(char *out, size_t len, const char *host, int port)
{
    snprintf(out, len, strchr(host, ':') ? "[%.200s]:%d" : "%.200s:%d", host, port);
}

/* ---- records ---- */

static bool record_equal(const route_record *a, const route_record *b)
{
    if (strcmp(a->name, b->name) || strcmp(a->endpoint, b->endpoint) || strcmp(a->gpu, b->gpu) ||
        a->n_models != b->n_models || a->n_tags != b->n_tags || a->price_in != b->price_in ||
        a->price_out != b->price_out || a->capacity != b->capacity || a->running != b->running ||
        a->queued != b->queued || a->ttft_ms != b->ttft_ms || a->tpot_ms != b->tpot_ms ||
        a->healthy != b->healthy || a->updated_ms != b->updated_ms || a->instances != b->instances ||
        a->version != b->version)
        return false;
    for (int i = 0; i < a->n_models && i < ROUTE_MAX_MODELS; i++)
        if (strcmp(a->models[i], b->models[i]))
            return false;
    for (int i = 0; i < a->n_tags && i < ROUTE_MAX_TAGS; i++)
        if (strcmp(a->tags[i], b->tags[i]))
            return false;
    if (a->n_load != b->n_load)
        return false;
    for (int i = 0; i < a->n_load && i < ROUTE_MAX_MODELS; i++) {
        const route_model_load *x = &a->load[i], *y = &b->load[i];
        if (x->capacity != y->capacity || x->running != y->running || x->queued != y->queued ||
            x->ttft_ms != y->ttft_ms || x->tpot_ms != y->tpot_ms)
            return false;
    }
    return true;
}

/* The fields a routing decision filters on: changes are announced at once. */
static bool identity_changed(const route_record *a, const route_record *b)
{
    if (strcmp(a->endpoint, b->endpoint) || strcmp(a->gpu, b->gpu) || a->n_models != b->n_models ||
        a->n_tags != b->n_tags || a->price_in != b->price_in || a->price_out != b->price_out ||
        a->capacity != b->capacity || a->healthy != b->healthy)
        return true;
    for (int i = 0; i < a->n_models && i < ROUTE_MAX_MODELS; i++)
        if (strcmp(a->models[i], b->models[i]))
            return true;
    for (int i = 0; i < a->n_tags && i < ROUTE_MAX_TAGS; i++)
        if (strcmp(a->tags[i], b->tags[i]))
            return true;
    return false;
}

static bool moved_by(double now, double then, double frac)
{
    if (now == then)
        return false;
    double base = fabs(then) > 1e-9 ? fabs(then) : 1e-9;
    return fabs(now - then) / base >= frac;
}

/* A load change that moves a latency estimate enough to reorder regions:
 * the region's, or one model's (routing ranks by the model's). A capacity
 * change is one too (a worker gone or back). */
static bool load_moved(const route_model_load *now, const route_model_load *then)
{
    if (now->capacity != then->capacity || (now->queued > 0) != (then->queued > 0))
        return true;
    int step = now->capacity / 8 > 1 ? now->capacity / 8 : 1;
    if (abs((now->running + now->queued) - (then->running + then->queued)) >= step)
        return true;
    return moved_by(now->ttft_ms, then->ttft_ms, 0.25) || moved_by(now->tpot_ms, then->tpot_ms, 0.25);
}

static bool load_changed(const route_record *now, const route_record *then)
{
    const route_model_load a = {now->capacity, now->running, now->queued, now->ttft_ms, now->tpot_ms},
                           b = {then->capacity, then->running, then->queued, then->ttft_ms, then->tpot_ms};
    if (load_moved(&a, &b) || now->n_load != then->n_load)
        return true;
    for (int i = 0; i < now->n_load; i++)
        if (load_moved(&now->load[i], &then->load[i]))
            return true;
    return false;
}

/* The local record as published: the caller's, with a run-time price. */
static void local_effective(const route_sync *s, route_record *out)
{
    *out = s->local;
    if (s->has_override) {
        out->price_in = s->override_in;
        out->price_out = s->override_out;
    }
}

static void local_to_table(route_sync *s)
{
    if (!s->has_local)
        return;
    route_record e;
    local_effective(s, &e);
    int rc = route_table_upsert(s->table, &e, true, gw_mono_ms());
    if (rc)
        set_err(s, "routing table: cannot add the local region %s: %s", e.name, strerror(-rc));
}

/* Parses {input, output} of a price hash. false when absent or malformed. */
static bool price_parse(const redisReply *r, double *in, double *out)
{
    bool has_in = false, has_out = false;
    if (!r || r->type != REDIS_REPLY_ARRAY)
        return false;
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
        const redisReply *k = r->element[i], *v = r->element[i + 1];
        if (k->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING || v->len == 0 || v->len > 64)
            continue;
        char buf[65];
        memcpy(buf, v->str, v->len);
        buf[v->len] = '\0';
        /* as a record's prices: past ROUTE_MAX_PRICE the override would make
         * every record it lands in fail route_record_check, and the region
         * drop out */
        bool is_in = k->len == 5 && !memcmp(k->str, "input", 5),
             is_out = k->len == 6 && !memcmp(k->str, "output", 6);
        if (!is_in && !is_out)
            continue; /* a field of someone else's: not ours to judge */
        double d;
        if (strlen(buf) != v->len || !route_number_parse(buf, ROUTE_MAX_PRICE, &d))
            return false;
        *(is_in ? in : out) = d;
        has_in |= is_in;
        has_out |= is_out;
    }
    return has_in && has_out;
}

static void apply_own_override(route_sync *s, const redisReply *price)
{
    double in = 0, out = 0;
    bool has = price_parse(price, &in, &out);
    if (has == s->has_override && (!has || (in == s->override_in && out == s->override_out)))
        return;
    s->has_override = has;
    s->override_in = in;
    s->override_out = out;
    /* Peers apply the override key themselves; the table's own copy follows
     * now, the published record at the next heartbeat (identity changed). */
    local_to_table(s);
}

/* ---- requests ---- */

static void on_req_reply(redisAsyncContext *ac, void *r, void *privdata);
static void on_req_deadline(evutil_socket_t fd, short what, void *arg);
static void conn_drop(sync_conn *c);
static void full_read_start(route_sync *s);

static sync_req *req_new(route_sync *s, enum req_kind kind)
{
    sync_req *q = calloc(1, sizeof(*q));
    if (!q)
        return NULL;
    q->deadline = evtimer_new(s->base, on_req_deadline, q);
    if (!q->deadline) {
        free(q);
        return NULL;
    }
    q->s = s;
    q->kind = kind;
    return q;
}

static void req_link(sync_req *q)
{
    route_sync *s = q->s;
    q->next = s->pending;
    if (s->pending)
        s->pending->prev = q;
    s->pending = q;
    s->n_pending++;
}

static void req_unlink(sync_req *q)
{
    route_sync *s = q->s;
    if (q->prev)
        q->prev->next = q->next;
    else if (s->pending == q)
        s->pending = q->next;
    else
        return; /* not linked */
    if (q->next)
        q->next->prev = q->prev;
    q->prev = q->next = NULL;
    s->n_pending--;
}

static void req_free(sync_req *q)
{
    req_unlink(q);
    event_free(q->deadline);
    free(q);
}

/* Sends argv on `cmd` with q as the reply's context. On failure the
 * callback never runs and q is still the caller's. */
static int req_send(sync_req *q, int argc, const char **argv, const size_t *lens)
{
    route_sync *s = q->s;
    redisAsyncContext *ac = s->cmd.ac;
    if (!ac || !s->cmd.ready)
        return -ENOTCONN;
    if (redisAsyncCommandArgv(ac, on_req_reply, q, argc, argv, lens) != REDIS_OK)
        return -ENOTCONN;
    q->ac = ac;
    if (!q->prev && s->pending != q)
        req_link(q);
    struct timeval tv = ms_tv(s->o.command_timeout_ms);
    evtimer_add(q->deadline, &tv);
    return 0;
}

/* A command whose answer is folded into the EXEC that follows it. */
static int send_plain(route_sync *s, int argc, const char **argv)
{
    if (!s->cmd.ac || redisAsyncCommandArgv(s->cmd.ac, NULL, NULL, argc, argv, NULL) != REDIS_OK)
        return -ENOTCONN;
    return 0;
}

static void limit_answer(sync_req *q, int result, int retry_after_ms)
{
    route_limit_cb cb = q->cb;
    q->cb = NULL;
    if (cb && !q->s->freeing)
        cb(q->ud, result, retry_after_ms);
}

/* ---- heartbeat write ---- */

/* MULTI; HGETALL the region's hash (the other gateways' entries); HSET
 * our record, as our entry and as the plain fields (which gateways before
 * entries read: last writer wins there, as it did for them); HDEL the
 * entries of gateways that stopped; PEXPIRE; HGETALL own price; [PUBLISH];
 * EXEC: the record and its TTL land together, and the announcement follows
 * the write it announces. */
static void write_local(route_sync *s, bool announce)
{
    if (!s->has_local || !s->cmd.ready || s->n_pending >= SYNC_MAX_PENDING)
        return;
    sync_req *q = req_new(s, REQ_WRITE);
    route_field *f = malloc(sizeof(route_field) * ROUTE_N_FIELDS);
    char *entry = malloc(ROUTE_INSTANCE_VALUE_MAX);
    if (!q || !f || !entry) {
        set_err(s, "out of memory");
        if (q)
            req_free(q);
        free(f);
        free(entry);
        return;
    }
    local_effective(s, &q->rec);
    q->rec.updated_ms = gw_epoch_ms();

    char key[SYNC_KEY_MAX], pkey[SYNC_KEY_MAX], ttl[32], field[sizeof(ROUTE_INSTANCE_PREFIX) + 16];
    snprintf(key, sizeof(key), "%s%s", s->prefix_region, q->rec.name);
    snprintf(pkey, sizeof(pkey), "%s%s", s->prefix_price, q->rec.name);
    snprintf(ttl, sizeof(ttl), "%lld", (long long)s->o.heartbeat_ms * s->o.ttl_heartbeats);
    snprintf(field, sizeof(field), ROUTE_INSTANCE_PREFIX "%s", s->instance);
    route_record_to_fields(&q->rec, f);
    const char *hset[4 + 2 * ROUTE_N_FIELDS];
    hset[0] = "HSET";
    hset[1] = key;
    for (int i = 0; i < ROUTE_N_FIELDS; i++) {
        hset[2 + 2 * i] = f[i].name;
        hset[3 + 2 * i] = f[i].value;
    }
    hset[2 + 2 * ROUTE_N_FIELDS] = field;
    hset[3 + 2 * ROUTE_N_FIELDS] = entry;
    route_instance_encode(&q->rec, entry);

    /* The stopped: unchanged for a TTL (see struct route_sync), as of a
     * view that is current (see track_siblings). */
    char gone[SYNC_MAX_SIBLINGS][sizeof(field)];
    const char *hdel[2 + SYNC_MAX_SIBLINGS] = {"HDEL", key};
    int n_gone = 0;
    int64_t now = gw_mono_ms(), ttl_ms = (int64_t)s->o.heartbeat_ms * s->o.ttl_heartbeats;
    for (int i = 0; i < s->n_sib && now - s->sib_seen_ms <= 2 * (int64_t)s->o.heartbeat_ms; i++)
        if (now - s->sib[i].changed_ms > ttl_ms) {
            snprintf(gone[n_gone], sizeof(gone[0]), ROUTE_INSTANCE_PREFIX "%s", s->sib[i].id);
            snprintf(q->gone[n_gone], sizeof(q->gone[0]), "%s", s->sib[i].id);
            hdel[2 + n_gone] = gone[n_gone];
            n_gone++;
        }
    q->n_gone = n_gone;
    q->price_at = n_gone ? 4 : 3;
    announce |= n_gone > 0; /* the region's merged record changes with it */
    q->announced = announce;

    const char *multi[] = {"MULTI"}, *hgetall[] = {"HGETALL", key}, *pexpire[] = {"PEXPIRE", key, ttl},
               *price[] = {"HGETALL", pkey}, *publish[] = {"PUBLISH", s->channel, q->rec.name},
               *exec[] = {"EXEC"};
    int rc = send_plain(s, 1, multi);
    if (!rc)
        rc = send_plain(s, 2, hgetall);
    if (!rc)
        rc = send_plain(s, 4 + 2 * ROUTE_N_FIELDS, hset);
    if (!rc && n_gone)
        rc = send_plain(s, 2 + n_gone, hdel);
    if (!rc)
        rc = send_plain(s, 3, pexpire);
    if (!rc)
        rc = send_plain(s, 2, price);
    if (!rc && announce)
        rc = send_plain(s, 3, publish);
    if (!rc)
        rc = req_send(q, 1, exec, NULL);
    free(f);
    free(entry);
    if (rc) {
        /* A MULTI left open would swallow the next block: start over. */
        req_free(q);
        conn_drop(&s->cmd);
        conn_drop(&s->sub);
    }
}

/* The other gateways' entries under our name, as our write found them
 * (before its HDEL: what it removed is forgotten). An entry counts as
 * written whenever its bytes change, read or not (one a newer gateway
 * writes in a form we cannot read is alive all the same). After a gap in
 * our view (Redis away, writes refused, our loop held up), nobody's
 * silence is known: every entry starts over. */
static void track_siblings(route_sync *s, const sync_req *q, const redisReply *h)
{
    if (h->type != REDIS_REPLY_ARRAY)
        return; /* said by on_write */
    sibling next[SYNC_MAX_SIBLINGS];
    int n = 0;
    int64_t now = gw_mono_ms();
    bool gap = now - s->sib_seen_ms > 2 * (int64_t)s->o.heartbeat_ms;
    s->sib_seen_ms = now;
    for (size_t i = 0; i + 1 < h->elements && n < SYNC_MAX_SIBLINGS; i += 2) {
        const redisReply *k = h->element[i], *v = h->element[i + 1];
        sibling *e = &next[n];
        if (k->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING ||
            !route_instance_field(k->str, k->len, e->id) || !strcmp(e->id, s->instance))
            continue;
        bool removed = false;
        for (int j = 0; j < q->n_gone; j++)
            removed |= !strcmp(q->gone[j], e->id);
        if (removed)
            continue;
        e->digest = route__hash_bytes(ROUTE__FNV_SEED, v->str, v->len);
        e->changed_ms = now;
        for (int j = 0; j < s->n_sib && !gap; j++)
            if (!strcmp(s->sib[j].id, e->id) && s->sib[j].digest == e->digest)
                e->changed_ms = s->sib[j].changed_ms;
        n++;
    }
    memcpy(s->sib, next, sizeof(next[0]) * (size_t)n);
    s->n_sib = n;
}

static void on_write(route_sync *s, sync_req *q, redisReply *r)
{
    const char *why = r->type == REDIS_REPLY_ERROR ? r->str
                      : r->type != REDIS_REPLY_ARRAY || r->elements < (size_t)q->price_at + 1
                          ? "unexpected reply to EXEC"
                          : NULL;
    /* The store failed when the writes did (HSET, HDEL, PEXPIRE, PUBLISH);
     * an error reading the hash (0) or the price override is a key of the
     * wrong type that someone wrote (SET where HSET was meant): said, and
     * read as no override, but the store is fine. */
    for (size_t i = 0; !why && i < r->elements; i++)
        if (i != 0 && i != (size_t)q->price_at && r->element[i]->type == REDIS_REPLY_ERROR)
            why = r->element[i]->str;
    s->write_ok = !why;
    if (why) {
        set_err(s, "writing the record of %s: %s", q->rec.name, why);
        store_failed(s);
        return;
    }
    if (q->announced) {
        s->announced = q->rec;
        s->has_announced = true;
    }
    const redisReply *price = r->element[q->price_at];
    if (price->type == REDIS_REPLY_ERROR)
        set_err(s, "reading the price override of %s: %s", q->rec.name, price->str);
    if (s->has_local && !strcmp(s->local.name, q->rec.name)) {
        apply_own_override(s, price);
        track_siblings(s, q, r->element[0]);
    }
}

static void heartbeat(route_sync *s)
{
    if (!s->has_local)
        return;
    local_to_table(s);
    route_record e;
    local_effective(s, &e);
    bool announce =
        !s->has_announced || identity_changed(&e, &s->announced) || load_changed(&e, &s->announced);
    write_local(s, announce);
}

static void on_heartbeat(evutil_socket_t fd, short what, void *arg)
{
    heartbeat(arg);
}

/* ---- reads ---- */

static int read_region(route_sync *s, const char *name)
{
    if (!s->cmd.ready)
        return -ENOTCONN;
    if (s->n_pending >= SYNC_MAX_PENDING)
        return -EBUSY;
    sync_req *q = req_new(s, REQ_READ);
    if (!q)
        return -ENOMEM;
    snprintf(q->name, sizeof(q->name), "%s", name);
    char key[SYNC_KEY_MAX], pkey[SYNC_KEY_MAX];
    snprintf(key, sizeof(key), "%s%s", s->prefix_region, name);
    snprintf(pkey, sizeof(pkey), "%s%s", s->prefix_price, name);
    const char *multi[] = {"MULTI"}, *h1[] = {"HGETALL", key}, *h2[] = {"HGETALL", pkey}, *exec[] = {"EXEC"};
    int rc = send_plain(s, 1, multi);
    if (!rc)
        rc = send_plain(s, 2, h1);
    if (!rc)
        rc = send_plain(s, 2, h2);
    if (!rc)
        rc = req_send(q, 1, exec, NULL);
    if (rc) {
        req_free(q);
        conn_drop(&s->cmd);
        conn_drop(&s->sub);
    }
    return rc;
}

typedef struct hash_pair {
    const redisReply *k, *v;
} hash_pair;

static int by_field_name(const void *a, const void *b)
{
    return strcmp(((const hash_pair *)a)->k->str, ((const hash_pair *)b)->k->str);
}

/* The gateways' entries, merged: the first ROUTE_MAX_INSTANCES that read,
 * by id, so that every reader merges the same ones. *last_writer tells
 * whether one of them has the plain fields' updated_ms (plain_ms). -ENOENT
 * when none reads. */
static int record_from_entries(route_sync *s, const char *name, const redisReply *hash, int64_t plain_ms,
                               bool *last_writer, route_record *out)
{
    size_t n_pairs = 0;
    hash_pair *pairs = malloc(sizeof(*pairs) * (hash->elements / 2 + 1));
    route_record *inst = malloc(sizeof(*inst) * ROUTE_MAX_INSTANCES);
    int n = 0, rc = -ENOMEM;
    char id[ROUTE_INSTANCE_ID_LEN + 1], err[200];
    *last_writer = false;
    if (!pairs || !inst) {
        set_err(s, "out of memory");
        goto out;
    }
    for (size_t i = 0; i + 1 < hash->elements; i += 2) {
        const redisReply *k = hash->element[i], *v = hash->element[i + 1];
        if (k->type == REDIS_REPLY_STRING && v->type == REDIS_REPLY_STRING &&
            route_instance_field(k->str, k->len, id))
            pairs[n_pairs++] = (hash_pair){k, v};
    }
    qsort(pairs, n_pairs, sizeof(*pairs), by_field_name);
    for (size_t i = 0; i < n_pairs && n < ROUTE_MAX_INSTANCES; i++) {
        route_record *e = &inst[n];
        memset(e, 0, sizeof(*e));
        snprintf(e->name, sizeof(e->name), "%s", name);
        if (route_instance_decode(e, pairs[i].v->str, pairs[i].v->len, err, sizeof(err))) {
            set_err(s, "region %s, %.*s: %s", name, (int)pairs[i].k->len, pairs[i].k->str, err);
            continue;
        }
        *last_writer |= e->updated_ms == plain_ms;
        n++;
    }
    rc = n ? route_instances_merge(inst, n, out) : -ENOENT;
out:
    free(pairs);
    free(inst);
    return rc;
}

/* A region's record from its hash: its gateways' entries merged, or its
 * plain fields where those are the newer word: no entry reads, or the last
 * writer wrote none (a gateway from before entries, which also keeps the
 * key alive, so the entries of gateways gone since are never removed; or
 * an operator's HSET). 0, or an error already said. */
static int record_from_hash(route_sync *s, const char *name, const redisReply *hash, route_record *rec)
{
    int n = 0;
    const char *names[64], *values[64];
    size_t lens[64];
    char id[ROUTE_INSTANCE_ID_LEN + 1];
    /* route_record_from_fields wants NUL-terminated names; hiredis
     * terminates every string it returns. The entries are not plain
     * fields, and a hash past its small size keeps no order: they are
     * passed over, not counted. */
    for (size_t i = 0; i + 1 < hash->elements && n < 64; i += 2) {
        const redisReply *k = hash->element[i], *v = hash->element[i + 1];
        if (k->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING) {
            set_err(s, "reading region %s: a field is not a string", name);
            return -EINVAL;
        }
        if (route_instance_field(k->str, k->len, id))
            continue;
        names[n] = k->str;
        values[n] = v->str;
        lens[n++] = v->len;
    }
    route_record plain;
    memset(&plain, 0, sizeof(plain));
    snprintf(plain.name, sizeof(plain.name), "%s", name);
    char perr[200];
    int prc = route_record_from_fields(&plain, names, values, lens, n, perr, sizeof(perr));
    bool last_writer;
    int rc = record_from_entries(s, name, hash, prc ? -1 : plain.updated_ms, &last_writer, rec);
    if (rc == 0 && (last_writer || prc))
        return 0;
    if (rc != 0 && rc != -ENOENT)
        return rc;
    if (prc) {
        set_err(s, "region %s: %s", name, perr);
        return -EINVAL;
    }
    *rec = plain;
    rec->instances = 1;
    return 0;
}

static void on_read(route_sync *s, sync_req *q, redisReply *r)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_ARRAY) {
        set_err(s, "reading region %s: %s", q->name,
                r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply (is the key a hash?)");
        /* a key of another type under our prefix is a peer's doing, not the
         * store's; an error from EXEC is the store's */
        if (r->type == REDIS_REPLY_ERROR)
            store_failed(s);
        return;
    }
    const redisReply *hash = r->element[0], *price = r->element[1];
    if (s->has_local && !strcmp(q->name, s->local.name)) {
        apply_own_override(s, price);
        return;
    }
    if (hash->elements == 0 || hash->elements % 2)
        return; /* expired: the table's clock retires it */
    route_record rec;
    if (record_from_hash(s, q->name, hash, &rec))
        return;
    double in, out;
    if (price_parse(price, &in, &out)) {
        rec.price_in = in;
        rec.price_out = out;
    }
    route_region *cur = route_table_find(s->table, q->name);
    if (cur && (cur->local || record_equal(&cur->rec, &rec)))
        return;
    int rc = route_table_upsert(s->table, &rec, false, gw_mono_ms());
    if (rc == -EPERM)
        set_err(s, "region %s: endpoint %s is not tls: (peers use mutual TLS): refused", q->name,
                rec.endpoint);
    else if (rc)
        set_err(s, "routing table: cannot add region %s: %s", q->name, strerror(-rc));
}

static void send_scan(route_sync *s, const char *cursor)
{
    sync_req *q = req_new(s, REQ_SCAN);
    if (!q) {
        set_err(s, "out of memory");
        s->scan_active = false;
        return;
    }
    const char *argv[] = {"SCAN", cursor, "MATCH", s->scan_match, "COUNT", SYNC_SCAN_COUNT};
    if (req_send(q, 6, argv, NULL)) {
        req_free(q);
        s->scan_active = false;
    }
}

static void full_read_start(route_sync *s)
{
    if (!s->cmd.ready)
        return;
    if (s->scan_active) {
        s->rescan = true;
        return;
    }
    s->scan_active = true;
    s->rescan = false;
    s->scan_failed = false;
    s->scan_started_ms = gw_mono_ms();
    send_scan(s, "0");
}

static void on_scan(route_sync *s, redisReply *r)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_STRING ||
        r->element[1]->type != REDIS_REPLY_ARRAY) {
        set_err(s, "SCAN: %s", r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
        s->scan_active = false;
        store_failed(s);
        return;
    }
    size_t plen = strlen(s->prefix_region);
    const redisReply *keys = r->element[1];
    for (size_t i = 0; i < keys->elements; i++) {
        const redisReply *k = keys->element[i];
        if (k->type != REDIS_REPLY_STRING || k->len <= plen || memcmp(k->str, s->prefix_region, plen))
            continue;
        const char *name = k->str + plen;
        if (strlen(name) != k->len - plen || !name_ok(name))
            continue;
        int rc = read_region(s, name);
        if (rc == -ENOTCONN)
            break;
        if (rc)
            s->scan_failed = true; /* a record left unread */
    }
    if (!strcmp(r->element[0]->str, "0") || !s->cmd.ready) {
        s->scan_active = false;
        /* Read in full with both connections up: news reaches us again.
         * The reads of the last page are still in flight; the table keeps
         * each record's age at the loss until they land. */
        if (!s->scan_failed)
            route_table_note_full_read(s->table, s->scan_started_ms);
        if (!s->scan_failed && s->write_ok && route_sync_connected(s))
            route_table_set_shared_ok(s->table, true, gw_mono_ms());
        if (s->rescan)
            full_read_start(s);
    } else
        send_scan(s, r->element[0]->str);
}

static void on_full_read(evutil_socket_t fd, short what, void *arg)
{
    full_read_start(arg);
}

/* ---- rate limit ---- */

static int send_limit(sync_req *q)
{
    route_sync *s = q->s;
    if (q->retried) {
        const char *argv[] = {"EVAL",     gcra_lua,   "2",        q->key,    q->key_last,
                              q->args[0], q->args[1], q->args[2], q->args[3]};
        return req_send(q, 9, argv, NULL);
    }
    const char *argv[] = {"EVALSHA",  s->sha,     "2",        q->key,    q->key_last,
                          q->args[0], q->args[1], q->args[2], q->args[3]};
    return req_send(q, 9, argv, NULL);
}

/* A check (cost > 0, cb), a charge taken without asking (cost > 0, no cb)
 * or a refund (cost < 0, no cb). */
static int limit_req(route_sync *s, const char *key, double rate, double burst, double cost,
                     route_limit_cb cb, void *ud)
{
    if (!s || !key || !(rate > 0) || !isfinite(rate) || !(burst >= 0) || !isfinite(burst) ||
        !isfinite(cost) || strlen(key) > SYNC_LIMIT_KEY_MAX)
        return -EINVAL;
    if (!s->cmd.ready || !s->sha[0] || s->n_pending >= SYNC_MAX_PENDING_LIMITS)
        return -ENOTCONN;
    sync_req *q = req_new(s, REQ_LIMIT);
    if (!q)
        return -ENOMEM;
    q->cb = cb;
    q->ud = ud;
    snprintf(q->key, sizeof(q->key), "%s%s", s->prefix_limit, key);
    snprintf(q->key_last, sizeof(q->key_last), "%s%s", s->prefix_limit_at, key);
    snprintf(q->args[0], sizeof(q->args[0]), "%.17g", rate);
    snprintf(q->args[1], sizeof(q->args[1]), "%.17g", burst);
    snprintf(q->args[2], sizeof(q->args[2]), "%.17g", cost);
    snprintf(q->args[3], sizeof(q->args[3]), "%d", !cb && cost > 0); /* a charge, not a check */
    int rc = send_limit(q);
    if (rc) {
        req_free(q);
        return rc;
    }
    return 0;
}

int route_sync_limit(route_sync *s, const char *key, double rate, double burst, double cost,
                     route_limit_cb cb, void *ud)
{
    if (!cb || !(cost > 0))
        return -EINVAL;
    return limit_req(s, key, rate, burst, cost, cb, ud);
}

int route_sync_refund(route_sync *s, const char *key, double rate, double burst, double amount)
{
    if (!(amount > 0))
        return -EINVAL;
    return limit_req(s, key, rate, burst, -amount, NULL, NULL);
}

int route_sync_charge(route_sync *s, const char *key, double rate, double burst, double amount)
{
    if (!(amount > 0))
        return -EINVAL;
    return limit_req(s, key, rate, burst, amount, NULL, NULL);
}

void route_sync_limit_cancel(route_sync *s, void *ud)
{
    for (sync_req *q = s->pending; q; q = q->next)
        if (q->kind == REQ_LIMIT && q->ud == ud)
            q->cb = NULL;
}

/* true when q was re-sent (and is still in flight). */
static bool on_limit(route_sync *s, sync_req *q, redisReply *r)
{
    if (r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "NOSCRIPT", 8) && !q->retried) {
        /* The script cache was flushed (restart, SCRIPT FLUSH, failover):
         * EVAL runs it and caches it again. */
        q->retried = true;
        if (send_limit(q) == 0)
            return true;
    }
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 && r->element[0]->type == REDIS_REPLY_INTEGER &&
        r->element[1]->type == REDIS_REPLY_INTEGER) {
        if (r->element[0]->integer)
            limit_answer(q, 0, 0);
        else {
            long long ms = r->element[1]->integer;
            limit_answer(q, -EAGAIN, ms < 1 ? 1 : ms > 86400000 ? 86400000 : (int)ms);
        }
        return false;
    }
    set_err(s, "rate limit script: %s", r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
    limit_answer(q, -ENOTCONN, 0);
    return false;
}

/* ---- reply dispatch and deadlines ---- */

static void conn_lost(sync_conn *c);

static void on_req_reply(redisAsyncContext *ac, void *r, void *privdata)
{
    sync_req *q = privdata;
    route_sync *s = q->s;
    redisReply *reply = r;
    evtimer_del(q->deadline);
    if (!reply || ac != s->cmd.ac) {
        /* The context is being freed (by us, or by hiredis after an I/O
         * error or EOF): forget it, do not free it again. */
        if (ac == s->cmd.ac) {
            set_err(s, "connection to Redis at %s lost: %s", s->addr,
                    ac->c.errstr[0] ? ac->c.errstr : "closed");
            conn_lost(&s->cmd);
        }
        if (q->kind == REQ_LIMIT)
            limit_answer(q, -ENOTCONN, 0);
        if (q->kind == REQ_SCAN)
            s->scan_active = false;
        req_free(q);
        return;
    }
    s->last_ok_ms = gw_epoch_ms();
    switch (q->kind) {
    case REQ_WRITE:
        on_write(s, q, reply);
        break;
    case REQ_READ:
        on_read(s, q, reply);
        break;
    case REQ_SCAN:
        on_scan(s, reply);
        break;
    case REQ_LIMIT:
        if (on_limit(s, q, reply))
            return;
        break;
    }
    req_free(q);
}

static void on_req_deadline(evutil_socket_t fd, short what, void *arg)
{
    sync_req *q = arg;
    route_sync *s = q->s;
    set_err(s, "Redis at %s did not answer within %d ms", s->addr, s->o.command_timeout_ms);
    /* Freeing the context answers q (and every other request) with NULL,
     * which frees it: q is gone after this. */
    conn_drop(&s->cmd);
    conn_drop(&s->sub);
}

/* ---- connections ---- */

static void conn_start(sync_conn *c);

static void conn_schedule_retry(sync_conn *c)
{
    route_sync *s = c->s;
    if (s->freeing)
        return;
    /* +-20% jitter so a fleet that lost Redis together does not return in
     * lockstep. */
    int ms = c->backoff_ms;
    int span = ms / 5;
    if (span > 0)
        ms += (int)(rand_r(&s->rng) % (unsigned)(2 * span + 1)) - span;
    if (ms < 1)
        ms = 1;
    struct timeval tv = ms_tv(ms);
    evtimer_add(c->retry_ev, &tv);
    c->backoff_ms = c->backoff_ms > s->o.reconnect_max_ms / 2 ? s->o.reconnect_max_ms : c->backoff_ms * 2;
}

/* Forgets c->ac (which hiredis is freeing or has freed) and retries later. */
static void conn_lost(sync_conn *c)
{
    route_sync *s = c->s;
    if (!c->ac)
        return;
    /* The back-off starts over only for a connection that stayed up:
     * one that a Redis at its client limit, or a proxy, closes right after
     * setup would otherwise be reopened every reconnect_min_ms. */
    if (c->ready && gw_mono_ms() - c->ready_ms >= s->o.reconnect_max_ms)
        c->backoff_ms = s->o.reconnect_min_ms;
    c->ac = NULL;
    c->ready = false;
    c->setup_left = 0;
    evtimer_del(c->setup_ev);
    if (c->kind == CONN_CMD) {
        s->sha[0] = '\0';
        s->scan_active = false;
        s->rescan = false;
    }
    if (!s->freeing)
        route_table_set_shared_ok(s->table, false, gw_mono_ms());
    conn_schedule_retry(c);
}

/* Drops a live context: c->ac is cleared before the free so callbacks that
 * run inside it see a connection that is down. */
static void conn_drop(sync_conn *c)
{
    redisAsyncContext *ac = c->ac;
    if (!ac)
        return;
    conn_lost(c);
    redisAsyncFree(ac);
}

static void conn_became_ready(sync_conn *c)
{
    route_sync *s = c->s;
    c->ready = true;
    c->ready_ms = gw_mono_ms();
    evtimer_del(c->setup_ev);
    s->last_ok_ms = gw_epoch_ms();
    if (c->kind == CONN_CMD) {
        /* Whatever peers saw of us may have expired: announce at once. */
        s->has_announced = false;
        heartbeat(s);
    }
    /* Messages sent while either connection was down are lost. */
    full_read_start(s);
}

static void on_setup_reply(redisAsyncContext *ac, void *r, void *privdata)
{
    sync_conn *c = privdata;
    route_sync *s = c->s;
    redisReply *reply = r;
    if (ac != c->ac)
        return;
    if (!reply) {
        set_err(s, "connection to Redis at %s lost: %s", s->addr, ac->c.errstr[0] ? ac->c.errstr : "closed");
        conn_lost(c);
        return;
    }
    if (reply->type == REDIS_REPLY_ERROR) {
        set_err(s, "Redis at %s: %s", s->addr, reply->str);
        conn_drop(c);
        return;
    }
    if (reply->type == REDIS_REPLY_STRING && c->kind == CONN_CMD && reply->len < sizeof(s->sha)) {
        memcpy(s->sha, reply->str, reply->len); /* SCRIPT LOAD */
        s->sha[reply->len] = '\0';
    }
    if (--c->setup_left == 0)
        conn_became_ready(c);
}

/* Errors that pass: the server is loading, busy, failing over, or out of
 * memory or connections for now. */
static bool transient_error(const char *e)
{
    static const char *const kinds[] = {"LOADING",  "BUSY",        "NOAUTH", "MASTERDOWN",
                                        "TRYAGAIN", "CLUSTERDOWN", "OOM",    "ERR max number of clients"};
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
        if (!strncmp(e, kinds[i], strlen(kinds[i])))
            return true;
    return false;
}

/* A transient error to SCRIPT LOAD is the connection's: it is dropped and
 * set up again, or fleet-wide limits would stay off until some later
 * reconnect. Any other (NOPERM for an ACL user without scripting, the
 * command renamed away, a Redis-speaking server without scripts) refuses
 * it for good: rate limits fall back to the local buckets (no script
 * hash), and records, which need no script, go on. Retried, such a server
 * would have had us reconnect for ever and share no records either. */
static void on_script_reply(redisAsyncContext *ac, void *r, void *privdata)
{
    sync_conn *c = privdata;
    redisReply *reply = r;
    if (ac == c->ac && reply && reply->type == REDIS_REPLY_ERROR && !transient_error(reply->str)) {
        set_err(c->s, "Redis at %s refused SCRIPT LOAD (%s): rate limits are per gateway", c->s->addr,
                reply->str);
        if (--c->setup_left == 0)
            conn_became_ready(c);
        return;
    }
    on_setup_reply(ac, r, privdata);
}

static void on_sub_message(redisAsyncContext *ac, void *r, void *privdata)
{
    sync_conn *c = privdata;
    route_sync *s = c->s;
    redisReply *reply = r;
    if (ac != c->ac)
        return;
    if (!reply) {
        set_err(s, "subscription to Redis at %s lost: %s", s->addr,
                ac->c.errstr[0] ? ac->c.errstr : "closed");
        conn_lost(c);
        return;
    }
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 3 ||
        reply->element[0]->type != REDIS_REPLY_STRING)
        return;
    const redisReply *kind = reply->element[0], *payload = reply->element[2];
    s->last_ok_ms = gw_epoch_ms();
    if (!strcmp(kind->str, "subscribe")) {
        if (!c->ready && --c->setup_left == 0)
            conn_became_ready(c);
        return;
    }
    if (strcmp(kind->str, "message") || payload->type != REDIS_REPLY_STRING)
        return;
    if (strlen(payload->str) != payload->len || !name_ok(payload->str))
        return;
    /* When full, the next full read catches this region up. */
    read_region(s, payload->str);
}

static void on_setup_deadline(evutil_socket_t fd, short what, void *arg)
{
    sync_conn *c = arg;
    route_sync *s = c->s;
    set_err(s, "Redis at %s did not answer within %d ms", s->addr, s->o.command_timeout_ms);
    conn_drop(c);
    if (c->kind == CONN_CMD)
        conn_drop(&s->sub);
}

static void on_connect(const redisAsyncContext *ac, int status)
{
    sync_conn *c = ac->data;
    if (status == REDIS_OK || ac != c->ac)
        return;
    /* hiredis frees the context after this returns. */
    set_err(c->s, "cannot reach Redis at %s: %s", c->s->addr, ac->c.errstr);
    conn_lost(c);
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
    sync_conn *c = ac->data;
    if (ac != c->ac)
        return;
    set_err(c->s, "connection to Redis at %s lost: %s", c->s->addr,
            status == REDIS_OK ? "closed" : ac->c.errstr);
    conn_lost(c);
}

static int setup_send(sync_conn *c, redisCallbackFn *fn, int argc, const char **argv)
{
    if (redisAsyncCommandArgv(c->ac, fn, c, argc, argv, NULL) != REDIS_OK)
        return -1;
    c->setup_left++;
    return 0;
}

static void conn_start(sync_conn *c)
{
    route_sync *s = c->s;
    if (s->freeing || c->ac || !s->host_ok)
        return;
    redisAsyncContext *ac = redisAsyncConnect(s->host, s->o.port);
    if (!ac) {
        set_err(s, "out of memory");
        conn_schedule_retry(c);
        return;
    }
    if (ac->err) {
        set_err(s, "cannot reach Redis at %s: %s", s->addr, ac->errstr ? ac->errstr : ac->c.errstr);
        redisAsyncFree(ac);
        conn_schedule_retry(c);
        return;
    }
    ac->data = c;
    if (redisLibeventAttach(ac, s->base) != REDIS_OK || redisEnableKeepAlive(&ac->c) != REDIS_OK) {
        set_err(s, "cannot set up the connection to Redis at %s", s->addr);
        redisAsyncFree(ac);
        conn_schedule_retry(c);
        return;
    }
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    c->ac = ac;
    c->ready = false;
    c->setup_left = 0;

    /* Queued now, sent once connected; one deadline covers connect and
     * setup. */
    char db[16];
    snprintf(db, sizeof(db), "%d", s->o.db);
    const char *auth[] = {"AUTH", s->password}, *sel[] = {"SELECT", db},
               *load[] = {"SCRIPT", "LOAD", gcra_lua}, *subscribe[] = {"SUBSCRIBE", s->channel};
    int rc = 0;
    if (s->has_password)
        rc = setup_send(c, on_setup_reply, 2, auth);
    if (!rc && c->kind == CONN_CMD) {
        if (s->o.db != 0)
            rc = setup_send(c, on_setup_reply, 2, sel);
        if (!rc)
            rc = setup_send(c, on_script_reply, 3, load);
    }
    if (!rc && c->kind == CONN_SUB)
        rc = setup_send(c, on_sub_message, 2, subscribe);
    if (rc) {
        set_err(s, "cannot queue the setup of the connection to Redis");
        conn_drop(c);
        return;
    }
    struct timeval tv = ms_tv(s->o.command_timeout_ms);
    evtimer_add(c->setup_ev, &tv);
}

static void on_retry(evutil_socket_t fd, short what, void *arg)
{
    conn_start(arg);
}

static int conn_init(route_sync *s, sync_conn *c, enum conn_kind kind)
{
    c->s = s;
    c->kind = kind;
    c->backoff_ms = s->o.reconnect_min_ms;
    c->setup_ev = evtimer_new(s->base, on_setup_deadline, c);
    c->retry_ev = evtimer_new(s->base, on_retry, c);
    return c->setup_ev && c->retry_ev ? 0 : -ENOMEM;
}

static void conn_dispose(sync_conn *c)
{
    conn_drop(c);
    if (c->setup_ev)
        event_free(c->setup_ev);
    if (c->retry_ev)
        event_free(c->retry_ev);
}

/* ---- public ---- */

route_sync *route_sync_new(struct event_base *base, const route_sync_opts *o, route_table *table)
{
    route_sync *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->base = base;
    s->table = table;
    s->o = *o;
    char err[200];
    if (route_sync_opts_check(o, err, sizeof(err))) {
        /* Never connects; says why instead of failing the gateway. */
        set_err(s, "%s", err);
    } else {
        s->host_ok = host_literal(o->host, s->host, sizeof(s->host));
        format_addr(s->addr, sizeof(s->addr), s->host, o->port);
        snprintf(s->cluster, sizeof(s->cluster), "%s", o->cluster);
        if (o->password && *o->password) {
            snprintf(s->password, sizeof(s->password), "%s", o->password);
            s->has_password = true;
        }
    }
    /* A peer back after an outage may take its longest back-off (plus its
     * jitter) and a heartbeat to write again: its record stays until then. */
    route_table_set_recovery_grace(table, (int64_t)o->reconnect_max_ms * 6 / 5 + o->heartbeat_ms);
    s->o.host = NULL; /* the caller's strings are not kept */
    s->o.password = NULL;
    s->o.cluster = NULL;
    snprintf(s->prefix_region, sizeof(s->prefix_region), "infergate:%s:region:", s->cluster);
    snprintf(s->prefix_price, sizeof(s->prefix_price), "infergate:%s:price:", s->cluster);
    snprintf(s->prefix_limit, sizeof(s->prefix_limit), "infergate:%s:limit:", s->cluster);
    snprintf(s->prefix_limit_at, sizeof(s->prefix_limit_at), "infergate:%s:limit-at:", s->cluster);
    snprintf(s->channel, sizeof(s->channel), "infergate:%s:events", s->cluster);
    snprintf(s->scan_match, sizeof(s->scan_match), "infergate:%s:region:*", s->cluster);
    s->rng = (unsigned)getpid() ^ (unsigned)gw_epoch_ms() ^ (unsigned)(uintptr_t)s;
    uint64_t id = 0;
    if (getrandom(&id, sizeof(id), 0) != (ssize_t)sizeof(id))
        id = ((uint64_t)rand_r(&s->rng) << 32) ^ (uint64_t)gw_epoch_ms();
    snprintf(s->instance, sizeof(s->instance), "%016llx", (unsigned long long)id);

    if (conn_init(s, &s->cmd, CONN_CMD) || conn_init(s, &s->sub, CONN_SUB))
        goto fail;
    /* Until the first full read, the table has no news from the fleet. */
    route_table_set_shared_ok(table, false, gw_mono_ms());
    s->write_ok = true; /* until a write says otherwise */
    s->heartbeat_ev = event_new(base, -1, EV_PERSIST, on_heartbeat, s);
    s->full_read_ev = event_new(base, -1, EV_PERSIST, on_full_read, s);
    if (!s->heartbeat_ev || !s->full_read_ev)
        goto fail;
    struct timeval hb = ms_tv(s->host_ok ? s->o.heartbeat_ms : 1000),
                   fr = ms_tv(s->host_ok ? s->o.full_read_ms : 1000);
    evtimer_add(s->heartbeat_ev, &hb);
    evtimer_add(s->full_read_ev, &fr);
    conn_start(&s->cmd);
    conn_start(&s->sub);
    return s;

fail:
    route_sync_free(s);
    return NULL;
}

void route_sync_free(route_sync *s)
{
    if (!s)
        return;
    s->freeing = true;
    conn_dispose(&s->cmd);
    conn_dispose(&s->sub);
    /* Freeing the contexts answered every request; this is a guard. */
    while (s->pending)
        req_free(s->pending);
    if (s->heartbeat_ev)
        event_free(s->heartbeat_ev);
    if (s->full_read_ev)
        event_free(s->full_read_ev);
    memset(s->password, 0, sizeof(s->password));
    free(s);
}

void route_sync_set_local(route_sync *s, const route_record *rec)
{
    char err[160];
    if (route_record_check(rec, err, sizeof(err))) {
        set_err(s, "local record not published: %s", err);
        return;
    }
    bool had = s->has_local;
    if (had && strcmp(rec->name, s->local.name)) {
        s->has_override = false; /* another region's price */
        s->has_announced = false;
        s->n_sib = 0; /* another region's gateways */
    }
    s->local = *rec;
    s->has_local = true;
    local_to_table(s);
    route_record e;
    local_effective(s, &e);
    if (!had || !s->has_announced || identity_changed(&e, &s->announced))
        write_local(s, true);
}

bool route_sync_connected(const route_sync *s)
{
    return s->cmd.ready && s->sub.ready;
}

int64_t route_sync_last_ok_ms(const route_sync *s)
{
    return s->last_ok_ms;
}

const char *route_sync_last_error(const route_sync *s)
{
    return s->err;
}

/* ---- set-price (blocking, for the command line) ---- */

static int blocking_command(redisContext *c, const char *addr, int argc, const char **argv,
                            long long *integer, char *err, size_t err_len)
{
    redisReply *r = redisCommandArgv(c, argc, argv, NULL);
    if (!r) {
        snprintf(err, err_len, "Redis at %s: %s: %s", addr, argv[0], c->errstr[0] ? c->errstr : "no reply");
        return c->err == REDIS_ERR_IO && (errno == EAGAIN || errno == ETIMEDOUT) ? -ETIMEDOUT : -EIO;
    }
    int rc = 0;
    if (r->type == REDIS_REPLY_ERROR) {
        snprintf(err, err_len, "Redis at %s: %s: %s", addr, argv[0], r->str);
        rc = !strncmp(r->str, "NOAUTH", 6) || !strncmp(r->str, "WRONGPASS", 9) || !strcmp(argv[0], "AUTH")
                 ? -EACCES
                 : -EIO;
    } else if (integer) {
        *integer = r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
    }
    freeReplyObject(r);
    return rc;
}

int route_set_price(const route_sync_opts *o, const char *region, double input, double output, char *err,
                    size_t err_len)
{
    if (err_len)
        err[0] = '\0';
    if (!region || !name_ok(region)) {
        snprintf(err, err_len, "region name '%s' must be 1-63 of [A-Za-z0-9._-]", region ? region : "");
        return -EINVAL;
    }
    if (!(input >= 0 && input <= ROUTE_MAX_PRICE) || !(output >= 0 && output <= ROUTE_MAX_PRICE)) {
        snprintf(err, err_len, "prices must be numbers from 0 to %g", ROUTE_MAX_PRICE);
        return -EINVAL;
    }
    if (!o->host || !*o->host || o->port < 1 || o->port > 65535) {
        snprintf(err, err_len, "a Redis address HOST:PORT is needed");
        return -EINVAL;
    }
    if (!o->cluster || !name_ok(o->cluster)) {
        snprintf(err, err_len, "cluster name '%s' must be 1-63 of [A-Za-z0-9._-]",
                 o->cluster ? o->cluster : "");
        return -EINVAL;
    }
    if (o->db < 0) {
        snprintf(err, err_len, "redis db %d is negative", o->db);
        return -EINVAL;
    }
    char addr[SYNC_ADDR_MAX];
    format_addr(addr, sizeof(addr), o->host, o->port);
    int ms = o->command_timeout_ms > 2000 ? o->command_timeout_ms : 2000;
    struct timeval tv = ms_tv(ms);
    redisContext *c = redisConnectWithTimeout(o->host, o->port, tv);
    if (!c) {
        snprintf(err, err_len, "cannot reach Redis at %s: out of memory", addr);
        return -ENOMEM;
    }
    int rc = 0;
    if (c->err) {
        snprintf(err, err_len, "cannot reach Redis at %s: %s", addr, c->errstr);
        rc = -ECONNREFUSED;
        goto out;
    }
    if (redisSetTimeout(c, tv) != REDIS_OK) {
        snprintf(err, err_len, "cannot reach Redis at %s: %s", addr, c->errstr);
        rc = -EIO;
        goto out;
    }
    char db[16], in[32], out_s[32], pkey[SYNC_KEY_MAX], rkey[SYNC_KEY_MAX], channel[SYNC_KEY_MAX];
    snprintf(db, sizeof(db), "%d", o->db);
    snprintf(in, sizeof(in), "%.17g", input);
    snprintf(out_s, sizeof(out_s), "%.17g", output);
    snprintf(pkey, sizeof(pkey), "infergate:%s:price:%s", o->cluster, region);
    snprintf(rkey, sizeof(rkey), "infergate:%s:region:%s", o->cluster, region);
    snprintf(channel, sizeof(channel), "infergate:%s:events", o->cluster);
    if (o->password && *o->password) {
        const char *argv[] = {"AUTH", o->password};
        if ((rc = blocking_command(c, addr, 2, argv, NULL, err, err_len)))
            goto out;
    }
    if (o->db != 0) {
        const char *argv[] = {"SELECT", db};
        if ((rc = blocking_command(c, addr, 2, argv, NULL, err, err_len)))
            goto out;
    }
    long long exists = 0;
    {
        const char *argv[] = {"EXISTS", rkey};
        if ((rc = blocking_command(c, addr, 2, argv, &exists, err, err_len)))
            goto out;
    }
    {
        const char *argv[] = {"HSET", pkey, "input", in, "output", out_s};
        if ((rc = blocking_command(c, addr, 6, argv, NULL, err, err_len)))
            goto out;
    }
    {
        /* After the write, so a reader told of it reads the new price. */
        const char *argv[] = {"PUBLISH", channel, region};
        if ((rc = blocking_command(c, addr, 3, argv, NULL, err, err_len)))
            goto out;
    }
    if (!exists)
        snprintf(err, err_len,
                 "no gateway of region %s is publishing in cluster %s now; the price is stored and "
                 "applies when it does",
                 region, o->cluster);
out:
    redisFree(c);
    return rc;
}
