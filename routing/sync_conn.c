/* The Redis connections of the sync (routing/sync.h): connect, setup
 * (AUTH, SELECT, SCRIPT LOAD, SUBSCRIBE), reconnect with back-off, the
 * requests in flight on `cmd` with their deadlines, and the dispatch of
 * each reply to sync_write.c, sync_read.c or sync_limit.c; `sub`'s
 * messages start a read of the region named.
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
#include "gateway/base/clock.h"
#include "routing/sync_internal.h"

#include <hiredis/adapters/libevent.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- requests ---- */

static void on_req_reply(redisAsyncContext *ac, void *r, void *privdata);
static void on_req_deadline(evutil_socket_t fd, short what, void *arg);

sync_req *route_sync__req_new(route_sync *s, enum req_kind kind)
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

void route_sync__req_free(sync_req *q)
{
    req_unlink(q);
    event_free(q->deadline);
    free(q);
}

/* Sends argv on `cmd` with q as the reply's context. On failure the
 * callback never runs and q is still the caller's. */
int route_sync__req_send(sync_req *q, int argc, const char **argv, const size_t *lens)
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
    struct timeval tv = route_sync__ms_tv(s->o.command_timeout_ms);
    evtimer_add(q->deadline, &tv);
    return 0;
}

/* A command whose answer is folded into the EXEC that follows it. */
int route_sync__send_plain(route_sync *s, int argc, const char **argv)
{
    if (!s->cmd.ac || redisAsyncCommandArgv(s->cmd.ac, NULL, NULL, argc, argv, NULL) != REDIS_OK)
        return -ENOTCONN;
    return 0;
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
            route_sync__set_err(s, "connection to Redis at %s lost: %s", s->addr,
                                ac->c.errstr[0] ? ac->c.errstr : "closed");
            conn_lost(&s->cmd);
        }
        if (q->kind == REQ_LIMIT)
            route_sync__limit_answer(q, -ENOTCONN, 0);
        if (q->kind == REQ_SPEND)
            route_sync__spend_answer_lost(q);
        if (q->kind == REQ_SCAN)
            s->scan_active = false;
        route_sync__req_free(q);
        return;
    }
    s->last_ok_ms = gw_epoch_ms();
    switch (q->kind) {
    case REQ_WRITE:
        route_sync__on_write(s, q, reply);
        break;
    case REQ_READ:
        route_sync__on_read(s, q, reply);
        break;
    case REQ_SCAN:
        route_sync__on_scan(s, reply);
        break;
    case REQ_LIMIT:
        if (route_sync__on_limit(s, q, reply))
            return;
        break;
    case REQ_SPEND:
        route_sync__on_spend(s, q, reply);
        break;
    }
    route_sync__req_free(q);
}

static void on_req_deadline(evutil_socket_t fd, short what, void *arg)
{
    sync_req *q = arg;
    route_sync *s = q->s;
    route_sync__set_err(s, "Redis at %s did not answer within %d ms", s->addr, s->o.command_timeout_ms);
    /* Freeing the context answers q (and every other request) with NULL,
     * which frees it: q is gone after this. */
    route_sync__conn_drop(&s->cmd);
    route_sync__conn_drop(&s->sub);
}

/* ---- connections ---- */

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
    struct timeval tv = route_sync__ms_tv(ms);
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
void route_sync__conn_drop(sync_conn *c)
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
        route_sync__heartbeat(s);
    }
    /* Messages sent while either connection was down are lost. */
    route_sync__full_read_start(s);
}

static void on_setup_reply(redisAsyncContext *ac, void *r, void *privdata)
{
    sync_conn *c = privdata;
    route_sync *s = c->s;
    redisReply *reply = r;
    if (ac != c->ac)
        return;
    if (!reply) {
        route_sync__set_err(s, "connection to Redis at %s lost: %s", s->addr,
                            ac->c.errstr[0] ? ac->c.errstr : "closed");
        conn_lost(c);
        return;
    }
    if (reply->type == REDIS_REPLY_ERROR) {
        route_sync__set_err(s, "Redis at %s: %s", s->addr, reply->str);
        route_sync__conn_drop(c);
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
        route_sync__set_err(c->s, "Redis at %s refused SCRIPT LOAD (%s): rate limits are per gateway",
                            c->s->addr, reply->str);
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
        route_sync__set_err(s, "subscription to Redis at %s lost: %s", s->addr,
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
    if (strlen(payload->str) != payload->len || !route_sync__name_ok(payload->str))
        return;
    /* When full, the next full read catches this region up. */
    route_sync__read_region(s, payload->str);
}

static void on_setup_deadline(evutil_socket_t fd, short what, void *arg)
{
    sync_conn *c = arg;
    route_sync *s = c->s;
    route_sync__set_err(s, "Redis at %s did not answer within %d ms", s->addr, s->o.command_timeout_ms);
    route_sync__conn_drop(c);
    if (c->kind == CONN_CMD)
        route_sync__conn_drop(&s->sub);
}

static void on_connect(const redisAsyncContext *ac, int status)
{
    sync_conn *c = ac->data;
    if (status == REDIS_OK || ac != c->ac)
        return;
    /* hiredis frees the context after this returns. */
    route_sync__set_err(c->s, "cannot reach Redis at %s: %s", c->s->addr, ac->c.errstr);
    conn_lost(c);
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
    sync_conn *c = ac->data;
    if (ac != c->ac)
        return;
    route_sync__set_err(c->s, "connection to Redis at %s lost: %s", c->s->addr,
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

void route_sync__conn_start(sync_conn *c)
{
    route_sync *s = c->s;
    if (s->freeing || c->ac || !s->host_ok)
        return;
    redisAsyncContext *ac = redisAsyncConnect(s->host, s->o.port);
    if (!ac) {
        route_sync__set_err(s, "out of memory");
        conn_schedule_retry(c);
        return;
    }
    if (ac->err) {
        route_sync__set_err(s, "cannot reach Redis at %s: %s", s->addr,
                            ac->errstr ? ac->errstr : ac->c.errstr);
        redisAsyncFree(ac);
        conn_schedule_retry(c);
        return;
    }
    ac->data = c;
    if (redisLibeventAttach(ac, s->base) != REDIS_OK || redisEnableKeepAlive(&ac->c) != REDIS_OK) {
        route_sync__set_err(s, "cannot set up the connection to Redis at %s", s->addr);
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
               *load[] = {"SCRIPT", "LOAD", route_sync__gcra_lua}, *subscribe[] = {"SUBSCRIBE", s->channel};
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
        route_sync__set_err(s, "cannot queue the setup of the connection to Redis");
        route_sync__conn_drop(c);
        return;
    }
    struct timeval tv = route_sync__ms_tv(s->o.command_timeout_ms);
    evtimer_add(c->setup_ev, &tv);
}

static void on_retry(evutil_socket_t fd, short what, void *arg)
{
    route_sync__conn_start(arg);
}

int route_sync__conn_init(route_sync *s, sync_conn *c, enum conn_kind kind)
{
    c->s = s;
    c->kind = kind;
    c->backoff_ms = s->o.reconnect_min_ms;
    c->setup_ev = evtimer_new(s->base, on_setup_deadline, c);
    c->retry_ev = evtimer_new(s->base, on_retry, c);
    return c->setup_ev && c->retry_ev ? 0 : -ENOMEM;
}

void route_sync__conn_dispose(sync_conn *c)
{
    route_sync__conn_drop(c);
    if (c->setup_ev)
        event_free(c->setup_ev);
    if (c->retry_ev)
        event_free(c->retry_ev);
}
