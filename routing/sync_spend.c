/* Spend shared by the fleet (routing/sync.h): each request's cost, tokens
 * and emissions added to its tenant's per-day and per-month totals and to
 * the day's breakdown by tenant, model and region, in one atomic script
 * over the sync's command connection (never blocking the loop); and the
 * tenant's totals read back, for its budget. */
#define _GNU_SOURCE
#include "routing/sync_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Keys outlive their period (a day key is read for a day, a month key for
 * a month; the breakdown is what `infergate usage` reads back). */
#define SPEND_DAY_TTL_S "259200"     /* 3 days */
#define SPEND_MONTH_TTL_S "6048000"  /* 70 days */
#define SPEND_USAGE_TTL_S "34560000" /* 400 days */
#define SPEND_MODEL_MAX 256

/* KEYS: the tenant's day and month totals, the day's breakdown. ARGV 1-6:
 * the amounts (route_spend_field order), 7: "region|tenant|model" (the
 * breakdown's field is "<amount>|" and that), 8-10: the keys' TTLs.
 * Returns the day's and the month's cost after the addition. */
static const char spend_add_lua[] =
    "local f = {'cost', 'prompt_tokens', 'completion_tokens', 'gco2e', 'energy_wh', 'requests'}\n"
    "for i = 1, 6 do\n"
    "  if tonumber(ARGV[i]) ~= 0 then\n"
    "    redis.call('HINCRBYFLOAT', KEYS[1], f[i], ARGV[i])\n"
    "    redis.call('HINCRBYFLOAT', KEYS[2], f[i], ARGV[i])\n"
    "    redis.call('HINCRBYFLOAT', KEYS[3], f[i] .. '|' .. ARGV[7], ARGV[i])\n"
    "  end\n"
    "end\n"
    "redis.call('EXPIRE', KEYS[1], ARGV[8])\n"
    "redis.call('EXPIRE', KEYS[2], ARGV[9])\n"
    "redis.call('EXPIRE', KEYS[3], ARGV[10])\n"
    "return {redis.call('HGET', KEYS[1], 'cost') or '0', redis.call('HGET', KEYS[2], 'cost') or '0'}\n";

static const char spend_read_lua[] =
    "return {redis.call('HGET', KEYS[1], 'cost') or '0', redis.call('HGET', KEYS[2], 'cost') or '0'}\n";

const char *const route_spend_fields[ROUTE_SPEND_N] = {"cost",  "prompt_tokens", "completion_tokens",
                                                       "gco2e", "energy_wh",     "requests"};

bool route_spend_day_ok(const char *day)
{
    if (!day || strlen(day) != 10 || day[4] != '-' || day[7] != '-')
        return false;
    for (int i = 0; i < 10; i++)
        if (i != 4 && i != 7 && (day[i] < '0' || day[i] > '9'))
            return false;
    return true;
}

static bool tenant_ok(const char *t)
{
    size_t n = t ? strlen(t) : 0;
    return n >= 1 && n <= 64 &&
           strspn(t, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") == n;
}

static void answer(sync_req *q, int result, double day, double month)
{
    route_spend_cb cb = q->spend_cb;
    q->spend_cb = NULL;
    if (cb && !q->s->freeing)
        cb(q->ud, result, day, month);
}

void route_sync__spend_answer_lost(sync_req *q)
{
    answer(q, -ENOTCONN, 0, 0);
}

/* A request about tenant's day and month totals (in q->key and
 * q->key_last); NULL with *rc -ENOTCONN or -ENOMEM. */
static sync_req *spend_req(route_sync *s, const char *tenant, const char *day, route_spend_cb cb, void *ud,
                           int *rc)
{
    *rc = -ENOTCONN;
    if (!s->cmd.ready || s->n_pending >= SYNC_MAX_PENDING_LIMITS)
        return NULL;
    *rc = -ENOMEM;
    sync_req *q = route_sync__req_new(s, REQ_SPEND);
    if (!q)
        return NULL;
    q->spend_cb = cb;
    q->ud = ud;
    snprintf(q->key, sizeof(q->key), "infergate:%s:spend:%s:day:%s", s->cluster, tenant, day);
    snprintf(q->key_last, sizeof(q->key_last), "infergate:%s:spend:%s:month:%.7s", s->cluster, tenant, day);
    return q;
}

static int spend_send(sync_req *q, int argc, const char **argv)
{
    int rc = route_sync__req_send(q, argc, argv, NULL);
    if (rc)
        route_sync__req_free(q);
    return rc;
}

int route_sync_spend_add(route_sync *s, const route_spend *a, route_spend_cb cb, void *ud)
{
    if (!s || !a || !tenant_ok(a->tenant) || !route_spend_day_ok(a->day) ||
        (a->region[0] && !route_sync__name_ok(a->region)) || strlen(a->model) > SPEND_MODEL_MAX)
        return -EINVAL;
    for (int i = 0; i < ROUTE_SPEND_N; i++)
        if (!isfinite(a->v[i]))
            return -EINVAL;
    int rc;
    sync_req *q = spend_req(s, a->tenant, a->day, cb, ud, &rc);
    if (!q)
        return rc;
    snprintf(q->spend_key, sizeof(q->spend_key), "infergate:%s:usage:%s", s->cluster, a->day);
    snprintf(q->spend_field, sizeof(q->spend_field), "%s|%s|%s", a->region[0] ? a->region : "-", a->tenant,
             a->model[0] ? a->model : "-");
    for (int i = 0; i < ROUTE_SPEND_N; i++)
        snprintf(q->spend_args[i], sizeof(q->spend_args[i]), "%.17g", a->v[i]);
    const char *argv[] = {"EVAL",           spend_add_lua,    "3",
                          q->key,           q->key_last,      q->spend_key,
                          q->spend_args[0], q->spend_args[1], q->spend_args[2],
                          q->spend_args[3], q->spend_args[4], q->spend_args[5],
                          q->spend_field,   SPEND_DAY_TTL_S,  SPEND_MONTH_TTL_S,
                          SPEND_USAGE_TTL_S};
    return spend_send(q, (int)(sizeof(argv) / sizeof(argv[0])), argv);
}

int route_sync_spend_read(route_sync *s, const char *tenant, const char *day, route_spend_cb cb, void *ud)
{
    if (!s || !cb || !tenant_ok(tenant) || !route_spend_day_ok(day))
        return -EINVAL;
    int rc;
    sync_req *q = spend_req(s, tenant, day, cb, ud, &rc);
    if (!q)
        return rc;
    const char *argv[] = {"EVAL", spend_read_lua, "2", q->key, q->key_last};
    return spend_send(q, 5, argv);
}

void route_sync_spend_cancel(route_sync *s, void *ud)
{
    for (sync_req *q = s ? s->pending : NULL; q; q = q->next)
        if (q->kind == REQ_SPEND && q->ud == ud)
            q->spend_cb = NULL;
}

static bool reply_number(const redisReply *r, double *out)
{
    if (r->type != REDIS_REPLY_STRING)
        return false;
    char *end;
    double v = strtod(r->str, &end);
    if (end == r->str || *end || !isfinite(v))
        return false;
    *out = v;
    return true;
}

void route_sync__on_spend(route_sync *s, sync_req *q, redisReply *r)
{
    double day, month;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 && reply_number(r->element[0], &day) &&
        reply_number(r->element[1], &month)) {
        answer(q, 0, day, month);
        return;
    }
    route_sync__set_err(s, "spend script: %s", r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
    answer(q, -ENOTCONN, 0, 0);
}
