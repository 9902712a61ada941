/* `infergate region set-price` and `set-carbon` (routing/sync.h): the
 * override hash written and announced over a blocking connection of its
 * own, for the command line (the gateway's sync is asynchronous and reads
 * it back); that connection is `infergate usage`'s too (usage.c). The hash
 * holds the price (input, output) and the carbon intensity (carbon); each
 * command keeps the other's fields, since the fleet key's proof covers the
 * whole hash. */
#define _GNU_SOURCE
#include "routing/sync_internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

int route_sync__blocking_command(redisContext *c, const char *addr, int argc, const char **argv,
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

/* The command line's connection: o checked, connected, AUTH and SELECT
 * done. */
redisContext *route_sync__blocking_open(const route_sync_opts *o, char *addr, int *rc, char *err,
                                        size_t err_len)
{
    if (!o->host || !*o->host || o->port < 1 || o->port > 65535) {
        snprintf(err, err_len, "a Redis address HOST:PORT is needed");
        return *rc = -EINVAL, NULL;
    }
    if (!o->cluster || !route_sync__name_ok(o->cluster)) {
        snprintf(err, err_len, "cluster name '%s' must be 1-63 of [A-Za-z0-9._-]",
                 o->cluster ? o->cluster : "");
        return *rc = -EINVAL, NULL;
    }
    if (o->db < 0) {
        snprintf(err, err_len, "redis db %d is negative", o->db);
        return *rc = -EINVAL, NULL;
    }
    route_sync__format_addr(addr, SYNC_ADDR_MAX, o->host, o->port);
    int ms = o->command_timeout_ms > 2000 ? o->command_timeout_ms : 2000;
    struct timeval tv = route_sync__ms_tv(ms);
    redisContext *c = redisConnectWithTimeout(o->host, o->port, tv);
    if (!c) {
        snprintf(err, err_len, "cannot reach Redis at %s: out of memory", addr);
        return *rc = -ENOMEM, NULL;
    }
    *rc = 0;
    char db[16];
    snprintf(db, sizeof(db), "%d", o->db);
    if (c->err) {
        snprintf(err, err_len, "cannot reach Redis at %s: %s", addr, c->errstr);
        *rc = -ECONNREFUSED;
    } else if (redisSetTimeout(c, tv) != REDIS_OK) {
        snprintf(err, err_len, "cannot reach Redis at %s: %s", addr, c->errstr);
        *rc = -EIO;
    }
    if (!*rc && o->password && *o->password) {
        const char *argv[] = {"AUTH", o->password};
        *rc = route_sync__blocking_command(c, addr, 2, argv, NULL, err, err_len);
    }
    if (!*rc && o->db != 0) {
        const char *argv[] = {"SELECT", db};
        *rc = route_sync__blocking_command(c, addr, 2, argv, NULL, err, err_len);
    }
    if (*rc) {
        redisFree(c);
        return NULL;
    }
    return c;
}

/* The fields of the override hash another command wrote, to keep. A
 * concurrent set-price and set-carbon may lose one of the two writes:
 * operators' commands, not a hot path. */
#define OVERRIDE_FIELDS 4
static const char *const override_names[OVERRIDE_FIELDS] = {"input", "output", "carbon", "drain"};

static int read_override(redisContext *c, const char *addr, const char *pkey, char vals[][32], char *err,
                         size_t err_len)
{
    redisReply *r = redisCommand(c, "HGETALL %s", pkey);
    if (!r) {
        snprintf(err, err_len, "Redis at %s: HGETALL: %s", addr, c->errstr[0] ? c->errstr : "no reply");
        return -EIO;
    }
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i + 1 < r->elements; i += 2) {
        const redisReply *k = r->element[i], *v = r->element[i + 1];
        if (k->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING || v->len == 0 || v->len >= 32)
            continue;
        for (int f = 0; f < OVERRIDE_FIELDS; f++)
            if (!strcmp(k->str, override_names[f]) && !vals[f][0])
                snprintf(vals[f], 32, "%.*s", (int)v->len, v->str);
    }
    freeReplyObject(r);
    return 0;
}

/* Writes the override hash of region with vals[f] set (empty: kept from
 * the hash as it is, or absent), signed, and announces it. */
static int set_override(const route_sync_opts *o, const char *region, char vals[][32], char *err,
                        size_t err_len)
{
    if (err_len)
        err[0] = '\0';
    if (!region || !route_sync__name_ok(region)) {
        snprintf(err, err_len, "region name '%s' must be 1-63 of [A-Za-z0-9._-]", region ? region : "");
        return -EINVAL;
    }
    char addr[SYNC_ADDR_MAX], pkey[SYNC_KEY_MAX], rkey[SYNC_KEY_MAX], channel[SYNC_KEY_MAX];
    int rc;
    redisContext *c = route_sync__blocking_open(o, addr, &rc, err, err_len);
    if (!c)
        return rc;
    snprintf(pkey, sizeof(pkey), "infergate:%s:price:%s", o->cluster, region);
    snprintf(rkey, sizeof(rkey), "infergate:%s:region:%s", o->cluster, region);
    snprintf(channel, sizeof(channel), "infergate:%s:events", o->cluster);
    long long exists = 0;
    {
        const char *argv[] = {"EXISTS", rkey};
        if ((rc = route_sync__blocking_command(c, addr, 2, argv, &exists, err, err_len)))
            goto out;
    }
    if ((rc = read_override(c, addr, pkey, vals, err, err_len)))
        goto out;
    {
        /* The hash holds these fields and no others, or the fleet key's
         * proof (over every field) would not hold; a price is both or neither. */
        const char *names[OVERRIDE_FIELDS], *values[OVERRIDE_FIELDS];
        const char *hset[2 + 2 * OVERRIDE_FIELDS + 2] = {"HSET", pkey};
        int n = 0, argc = 2;
        for (int f = 0; f < OVERRIDE_FIELDS; f++) {
            if (!vals[f][0] || (f < 2 && (!vals[0][0] || !vals[1][0])))
                continue;
            names[n] = override_names[f];
            values[n++] = vals[f];
            hset[argc++] = override_names[f];
            hset[argc++] = vals[f];
        }
        char auth[ROUTE_AUTH_VALUE_LEN + 1];
        route_auth_sign(&o->auth, "price", o->cluster, region, names, values, NULL, n, auth);
        if (o->auth.n) {
            hset[argc++] = ROUTE_AUTH_FIELD;
            hset[argc++] = auth;
        }
        const char *multi[] = {"MULTI"}, *del[] = {"DEL", pkey}, *exec[] = {"EXEC"};
        if ((rc = route_sync__blocking_command(c, addr, 1, multi, NULL, err, err_len)) ||
            (rc = route_sync__blocking_command(c, addr, 2, del, NULL, err, err_len)) ||
            (rc = route_sync__blocking_command(c, addr, argc, hset, NULL, err, err_len)) ||
            (rc = route_sync__blocking_command(c, addr, 1, exec, NULL, err, err_len)))
            goto out;
    }
    {
        /* After the write, so a reader told of it reads the new figure. */
        const char *argv[] = {"PUBLISH", channel, region};
        if ((rc = route_sync__blocking_command(c, addr, 3, argv, NULL, err, err_len)))
            goto out;
    }
    if (!exists)
        snprintf(err, err_len,
                 "no gateway of region %s is publishing in cluster %s now; the figure is stored and "
                 "applies when it does",
                 region, o->cluster);
out:
    redisFree(c);
    return rc;
}

int route_set_price(const route_sync_opts *o, const char *region, double input, double output, char *err,
                    size_t err_len)
{
    if (!(input >= 0 && input <= ROUTE_MAX_PRICE) || !(output >= 0 && output <= ROUTE_MAX_PRICE)) {
        snprintf(err, err_len, "prices must be numbers from 0 to %g", ROUTE_MAX_PRICE);
        return -EINVAL;
    }
    char vals[OVERRIDE_FIELDS][32] = {{0}};
    snprintf(vals[0], sizeof(vals[0]), "%.17g", input);
    snprintf(vals[1], sizeof(vals[1]), "%.17g", output);
    return set_override(o, region, vals, err, err_len);
}

int route_set_carbon(const route_sync_opts *o, const char *region, double carbon, char *err, size_t err_len)
{
    if (!(carbon >= 0 && carbon <= ROUTE_MAX_CARBON)) {
        snprintf(err, err_len, "carbon intensity must be a number from 0 to %g gCO2e/kWh", ROUTE_MAX_CARBON);
        return -EINVAL;
    }
    char vals[OVERRIDE_FIELDS][32] = {{0}};
    snprintf(vals[2], sizeof(vals[2]), "%.17g", carbon);
    return set_override(o, region, vals, err, err_len);
}

int route_set_drain(const route_sync_opts *o, const char *region, bool drained, char *err, size_t err_len)
{
    char vals[OVERRIDE_FIELDS][32] = {{0}};
    snprintf(vals[3], sizeof(vals[3]), "%d", drained ? 1 : 0);
    return set_override(o, region, vals, err, err_len);
}
