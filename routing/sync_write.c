/* This gateway's record in Redis (routing/sync.h): the local record as the
 * caller sets it, with its run-time price override; written every
 * heartbeat (HSET + PEXPIRE in one MULTI, with the removal of the entries
 * of the region's other gateways that stopped writing); announced on the
 * events channel when it changed enough.
 *
 * What is announced. The events channel carries a region's name when its
 * record changed in a way that moves routing decisions: endpoint, models,
 * tags, price, GPU, capacity or health at once (route_sync_set_local, or a
 * price override seen at the heartbeat), and a material load change at the
 * next heartbeat: queued going to or from zero, running+queued moving by
 * max(1, capacity/8) or a TTFT (measured or queue-based)/per-token estimate
 * by 25%. So a region
 * announces at most about once a heartbeat for load, and each announcement
 * costs every peer one read. Smaller load drift reaches peers through the
 * full read every full_read_ms (sync_read.c). */
#define _GNU_SOURCE
#include "gateway/base/clock.h"
#include "routing/route_internal.h"
#include "routing/sync_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the local record ---- */

/* The fields a routing decision filters on: changes are announced at once. */
static bool identity_changed(const route_record *a, const route_record *b)
{
    if (strcmp(a->endpoint, b->endpoint) || strcmp(a->gpu, b->gpu) || a->n_models != b->n_models ||
        a->n_tags != b->n_tags || a->price_in != b->price_in || a->price_out != b->price_out ||
        a->capacity != b->capacity || a->healthy != b->healthy || a->draining != b->draining ||
        a->carbon != b->carbon)
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
    if (load_moved(&a, &b) || now->n_load != then->n_load || moved_by(now->ttft_est_ms, then->ttft_est_ms, 0.25))
        return true;
    for (int i = 0; i < now->n_load; i++)
        if (load_moved(&now->load[i], &then->load[i]) || moved_by(now->load_est_ms[i], then->load_est_ms[i], 0.25))
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
    if (s->has_carbon_override)
        out->carbon = s->override_carbon;
    if (s->override_drain) {
        out->healthy = false;
        out->draining = true;
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
        route_sync__set_err(s, "routing table: cannot add the local region %s: %s", e.name, strerror(-rc));
}

void route_sync__apply_own_override(route_sync *s, const redisReply *price)
{
    double in = 0, out = 0;
    bool has = route_sync__price_parse(s, s->local.name, price, &in, &out);
    double carbon = 0;
    bool has_c = route_sync__carbon_parse(s, s->local.name, price, &carbon);
    bool drain = route_sync__drain_parse(s, s->local.name, price);
    if (has == s->has_override && (!has || (in == s->override_in && out == s->override_out)) &&
        has_c == s->has_carbon_override && (!has_c || carbon == s->override_carbon) &&
        drain == s->override_drain)
        return;
    s->override_drain = drain;
    s->has_carbon_override = has_c;
    s->override_carbon = carbon;
    s->has_override = has;
    s->override_in = in;
    s->override_out = out;
    /* Peers apply the override key themselves; the table's own copy follows
     * now, the published record at the next heartbeat (identity changed). */
    local_to_table(s);
}

/* ---- heartbeat write ---- */

/* The entry's bytes: the record's lines and the auth line. */
#define ENTRY_CAP (ROUTE_INSTANCE_VALUE_MAX + sizeof(ROUTE_AUTH_FIELD "=\n") + ROUTE_AUTH_VALUE_LEN)

/* The record's auth value (routing/record_auth.h), over the fields that
 * are written both as the hash's plain fields and as our entry's lines:
 * one value proves both. */
static void sign_record(const route_sync *s, const route_record *r, const route_field *f,
                        char out[ROUTE_AUTH_VALUE_LEN + 1])
{
    const char *names[ROUTE_N_FIELDS], *values[ROUTE_N_FIELDS];
    for (int i = 0; i < ROUTE_N_FIELDS; i++) {
        names[i] = f[i].name;
        values[i] = f[i].value;
    }
    route_auth_sign(&s->o.auth, "region", s->cluster, r->name, names, values, NULL, ROUTE_N_FIELDS, out);
}

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
    sync_req *q = route_sync__req_new(s, REQ_WRITE);
    route_field *f = malloc(sizeof(route_field) * ROUTE_N_FIELDS);
    char *entry = malloc(ENTRY_CAP);
    if (!q || !f || !entry) {
        route_sync__set_err(s, "out of memory");
        if (q)
            route_sync__req_free(q);
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
    const char *hset[6 + 2 * ROUTE_N_FIELDS];
    int n_hset = 2;
    hset[0] = "HSET";
    hset[1] = key;
    for (int i = 0; i < ROUTE_N_FIELDS; i++) {
        hset[n_hset++] = f[i].name;
        hset[n_hset++] = f[i].value;
    }
    size_t entry_len = route_instance_encode(&q->rec, entry);
    char auth[ROUTE_AUTH_VALUE_LEN + 1];
    if (s->o.auth.n) {
        sign_record(s, &q->rec, f, auth);
        hset[n_hset++] = ROUTE_AUTH_FIELD;
        hset[n_hset++] = auth;
        snprintf(entry + entry_len, ENTRY_CAP - entry_len, ROUTE_AUTH_FIELD "=%s\n", auth);
    }
    hset[n_hset++] = field;
    hset[n_hset++] = entry;

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
    int rc = route_sync__send_plain(s, 1, multi);
    if (!rc)
        rc = route_sync__send_plain(s, 2, hgetall);
    if (!rc)
        rc = route_sync__send_plain(s, n_hset, hset);
    if (!rc && n_gone)
        rc = route_sync__send_plain(s, 2 + n_gone, hdel);
    if (!rc)
        rc = route_sync__send_plain(s, 3, pexpire);
    if (!rc)
        rc = route_sync__send_plain(s, 2, price);
    if (!rc && announce)
        rc = route_sync__send_plain(s, 3, publish);
    if (!rc)
        rc = route_sync__req_send(q, 1, exec, NULL);
    free(f);
    free(entry);
    if (rc) {
        /* A MULTI left open would swallow the next block: start over. */
        route_sync__req_free(q);
        route_sync__conn_drop(&s->cmd);
        route_sync__conn_drop(&s->sub);
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
        return; /* said by route_sync__on_write */
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

void route_sync__on_write(route_sync *s, sync_req *q, redisReply *r)
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
        route_sync__set_err(s, "writing the record of %s: %s", q->rec.name, why);
        route_sync__store_failed(s);
        return;
    }
    if (q->announced) {
        s->announced = q->rec;
        s->has_announced = true;
    }
    const redisReply *price = r->element[q->price_at];
    if (price->type == REDIS_REPLY_ERROR)
        route_sync__set_err(s, "reading the price override of %s: %s", q->rec.name, price->str);
    if (s->has_local && !strcmp(s->local.name, q->rec.name)) {
        route_sync__apply_own_override(s, price);
        track_siblings(s, q, r->element[0]);
    }
}

void route_sync__heartbeat(route_sync *s)
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

void route_sync__on_heartbeat(evutil_socket_t fd, short what, void *arg)
{
    route_sync__heartbeat(arg);
}

/* ---- set by the caller ---- */

void route_sync_set_local(route_sync *s, const route_record *rec)
{
    char err[160];
    if (route_record_check(rec, err, sizeof(err))) {
        route_sync__set_err(s, "local record not published: %s", err);
        return;
    }
    bool had = s->has_local;
    if (had && strcmp(rec->name, s->local.name)) {
        s->has_override = s->has_carbon_override = s->override_drain = false; /* another region's price */
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
