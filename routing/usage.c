/* `infergate usage`'s read (routing/sync.h): the day breakdowns that
 * sync_spend.c adds to, read back over the command line's blocking
 * connection (set_price.c), one HGETALL a day. */
#define _GNU_SOURCE
#include "routing/sync_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define USAGE_MAX_DAYS 400

/* Midnight UTC of "YYYY-MM-DD"; -1 when it is no date. */
static time_t day_start(const char *day)
{
    if (!route_spend_day_ok(day))
        return -1;
    struct tm tm = {0};
    tm.tm_year = atoi(day) - 1900;
    tm.tm_mon = atoi(day + 5) - 1;
    tm.tm_mday = atoi(day + 8);
    if (tm.tm_mon < 0 || tm.tm_mon > 11 || tm.tm_mday < 1 || tm.tm_mday > 31)
        return -1;
    return timegm(&tm);
}

/* One field "<amount>|<region>|<tenant>|<model>" of a day's hash; the
 * model is the rest (it may hold '|'); false when malformed. */
static bool split_field(char *f, int *field, char **region, char **tenant, char **model)
{
    char *a = strchr(f, '|'), *b = a ? strchr(a + 1, '|') : NULL, *c = b ? strchr(b + 1, '|') : NULL;
    if (!c)
        return false;
    *a = *b = *c = '\0';
    for (*field = 0; *field < ROUTE_SPEND_N && strcmp(f, route_spend_fields[*field]); ++*field)
        ;
    *region = a + 1;
    *tenant = b + 1;
    *model = c + 1;
    return *field < ROUTE_SPEND_N;
}

static int read_day(redisContext *c, const char *addr, const char *key, const char *day, const char *tenant,
                    route_usage_cb cb, void *ud, char *err, size_t err_len)
{
    redisReply *r = redisCommand(c, "HGETALL %s", key);
    if (!r) {
        snprintf(err, err_len, "Redis at %s: HGETALL: %s", addr, c->errstr[0] ? c->errstr : "no reply");
        return -EIO;
    }
    int rc = 0;
    if (r->type != REDIS_REPLY_ARRAY) {
        snprintf(err, err_len, "Redis at %s: HGETALL %s: %s", addr, key,
                 r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
        rc = -EIO;
    }
    for (size_t i = 0; !rc && i + 1 < r->elements; i += 2) {
        const redisReply *k = r->element[i], *v = r->element[i + 1];
        if (k->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING)
            continue;
        char *f = strndup(k->str, k->len), *region, *tn, *model, *end;
        int field;
        double x = strtod(v->str, &end);
        if (f && split_field(f, &field, &region, &tn, &model) && end != v->str && !*end && isfinite(x) &&
            (!tenant || !strcmp(tenant, tn)))
            cb(ud, day, field, region, tn, model, x);
        free(f);
    }
    freeReplyObject(r);
    return rc;
}

int route_usage_read(const route_sync_opts *o, const char *from, const char *to, const char *tenant,
                     route_usage_cb cb, void *ud, char *err, size_t err_len)
{
    if (err_len)
        err[0] = '\0';
    time_t t0 = day_start(from), t1 = day_start(to);
    if (t0 < 0 || t1 < 0 || t1 < t0) {
        snprintf(err, err_len, "days must be YYYY-MM-DD, the first not after the last ('%s', '%s')",
                 from ? from : "", to ? to : "");
        return -EINVAL;
    }
    if ((t1 - t0) / 86400 >= USAGE_MAX_DAYS) {
        snprintf(err, err_len, "at most %d days at a time (usage is kept that long)", USAGE_MAX_DAYS);
        return -EINVAL;
    }
    char addr[SYNC_ADDR_MAX];
    int rc = 0;
    redisContext *c = route_sync__blocking_open(o, addr, &rc, err, err_len);
    if (!c)
        return rc;
    for (time_t t = t0; !rc && t <= t1; t += 86400) {
        struct tm tm;
        char day[16], key[SYNC_KEY_MAX];
        gmtime_r(&t, &tm);
        strftime(day, sizeof(day), "%Y-%m-%d", &tm);
        snprintf(key, sizeof(key), "infergate:%s:usage:%s", o->cluster, day);
        rc = read_day(c, addr, key, day, tenant, cb, ud, err, err_len);
    }
    redisFree(c);
    return rc;
}
