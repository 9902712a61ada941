/* The fleet-wide rate limit over the sync's connection (routing/sync.h):
 * one atomic GCRA script per check, charge or refund (EVALSHA of the script
 * loaded at connect, EVAL once when the server's script cache lost it). */
#define _GNU_SOURCE
#include "routing/sync_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
const char route_sync__gcra_lua[] =
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

void route_sync__limit_answer(sync_req *q, int result, int retry_after_ms)
{
    route_limit_cb cb = q->cb;
    q->cb = NULL;
    if (cb && !q->s->freeing)
        cb(q->ud, result, retry_after_ms);
}

static int send_limit(sync_req *q)
{
    route_sync *s = q->s;
    if (q->retried) {
        const char *argv[] = {"EVAL",     route_sync__gcra_lua, "2",        q->key,    q->key_last,
                              q->args[0], q->args[1],           q->args[2], q->args[3]};
        return route_sync__req_send(q, 9, argv, NULL);
    }
    const char *argv[] = {"EVALSHA",  s->sha,     "2",        q->key,    q->key_last,
                          q->args[0], q->args[1], q->args[2], q->args[3]};
    return route_sync__req_send(q, 9, argv, NULL);
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
    sync_req *q = route_sync__req_new(s, REQ_LIMIT);
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
        route_sync__req_free(q);
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
bool route_sync__on_limit(route_sync *s, sync_req *q, redisReply *r)
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
            route_sync__limit_answer(q, 0, 0);
        else {
            long long ms = r->element[1]->integer;
            route_sync__limit_answer(q, -EAGAIN, ms < 1 ? 1 : ms > 86400000 ? 86400000 : (int)ms);
        }
        return false;
    }
    route_sync__set_err(s, "rate limit script: %s",
                        r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
    route_sync__limit_answer(q, -ENOTCONN, 0);
    return false;
}
