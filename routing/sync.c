/* Region state shared through Redis: this gateway's record written every
 * heartbeat, every peer's record read on announcement and in full (the
 * entries of its gateways merged: routing/instance.h), run-time price
 * overrides, and the fleet-wide GCRA rate limit (routing/sync.h).
 *
 * This file: the options and their check, the life of a route_sync (its
 * keys, instance id, timers and two connections) and what it tells its
 * caller (connected, last success, last error). The work is in
 * sync_conn.c, sync_write.c, sync_read.c and sync_limit.c (the map is in
 * sync.h; the shared state in sync_internal.h). */
#define _GNU_SOURCE
#include "routing/sync.h"
#include "gateway/base/clock.h"
#include "routing/sync_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

void route_sync__set_err(route_sync *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, sizeof(s->err), fmt, ap);
    va_end(ap);
}

/* Redis answered, with an error: what it holds cannot be trusted to be
 * current (see scan_failed). */
void route_sync__store_failed(route_sync *s)
{
    s->scan_failed = true;
    if (!s->freeing)
        route_table_set_shared_ok(s->table, false, gw_mono_ms());
}

/* Names become Redis keys and response headers: keep them to a safe set. */
bool route_sync__name_ok(const char *n)
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
    /* A frozen Redis (SIGSTOP, a stalled VM) accepts connections and
     * answers nothing: every try fails by timeout and the back-off grows.
     * Capped at 5 s, gateways came back 4-6 s after it answered again;
     * a try a second costs a down Redis next to nothing. */
    o->reconnect_max_ms = 1000;
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
    if (!o->cluster || !route_sync__name_ok(o->cluster)) {
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
void route_sync__format_addr(char *out, size_t len, const char *host, int port)
{
    snprintf(out, len, strchr(host, ':') ? "[%.200s]:%d" : "%.200s:%d", host, port);
}

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
        route_sync__set_err(s, "%s", err);
    } else {
        s->host_ok = host_literal(o->host, s->host, sizeof(s->host));
        route_sync__format_addr(s->addr, sizeof(s->addr), s->host, o->port);
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

    if (route_sync__conn_init(s, &s->cmd, CONN_CMD) || route_sync__conn_init(s, &s->sub, CONN_SUB))
        goto fail;
    /* Until the first full read, the table has no news from the fleet. */
    route_table_set_shared_ok(table, false, gw_mono_ms());
    s->write_ok = true; /* until a write says otherwise */
    s->heartbeat_ev = event_new(base, -1, EV_PERSIST, route_sync__on_heartbeat, s);
    s->full_read_ev = event_new(base, -1, EV_PERSIST, route_sync__on_full_read, s);
    if (!s->heartbeat_ev || !s->full_read_ev)
        goto fail;
    struct timeval hb = route_sync__ms_tv(s->host_ok ? s->o.heartbeat_ms : 1000),
                   fr = route_sync__ms_tv(s->host_ok ? s->o.full_read_ms : 1000);
    evtimer_add(s->heartbeat_ev, &hb);
    evtimer_add(s->full_read_ev, &fr);
    route_sync__conn_start(&s->cmd);
    route_sync__conn_start(&s->sub);
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
    route_sync__conn_dispose(&s->cmd);
    route_sync__conn_dispose(&s->sub);
    /* Freeing the contexts answered every request; this is a guard. */
    while (s->pending)
        route_sync__req_free(s->pending);
    if (s->heartbeat_ev)
        event_free(s->heartbeat_ev);
    if (s->full_read_ev)
        event_free(s->full_read_ev);
    memset(s->password, 0, sizeof(s->password));
    memset(&s->o.auth, 0, sizeof(s->o.auth));
    free(s);
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

/* ---- the fleet keys ---- */

int route_sync__auth_check(route_sync *s, const char *kind, const char *region, const char *const *names,
                           const char *const *values, const size_t *lens, int n)
{
    int rc = route_auth_verify(&s->o.auth, kind, s->cluster, region, names, values, lens, n);
    if (rc == 0)
        return 0;
    s->auth_refused++;
    snprintf(s->auth_last, sizeof(s->auth_last), "%s of region %s: %s",
             !strcmp(kind, "price") ? "price override" : "record", region, route_auth_strerror(rc));
    route_sync__set_err(s, "%s; ignored", s->auth_last);
    return rc;
}

unsigned long long route_sync_auth_refused(const route_sync *s, const char **last)
{
    if (last)
        *last = s->auth_last;
    return s->auth_refused;
}

void route_sync_set_auth(route_sync *s, const route_auth_keys *k)
{
    s->o.auth = *k;
}
