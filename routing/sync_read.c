/* Peers' records from Redis (routing/sync.h): one region read when the
 * events channel names it, every region read in full (SCAN + HGETALL)
 * every full_read_ms; a region's hash turned into one record (its
 * gateways' entries merged through routing/instance.h, or the plain fields
 * of a gateway from before entries) with its price override, and upserted
 * into the table.
 *
 * A peer's record is upserted (seen_ms = now) only when it differs from the
 * table's copy: every heartbeat stamps a new updated_ms, so a live peer is
 * refreshed by every read while a dead one (whose key lives on for its TTL)
 * is not. The table's stale_after_ms must therefore exceed full_read_ms
 * plus a heartbeat, or a quiet live peer goes stale between full reads. */
#define _GNU_SOURCE
#include "gateway/base/clock.h"
#include "routing/sync_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- records ---- */

/* Every field: a read that finds the table's copy is no news (see above). */
static bool record_equal(const route_record *a, const route_record *b)
{
    if (strcmp(a->name, b->name) || strcmp(a->endpoint, b->endpoint) || strcmp(a->gpu, b->gpu) ||
        a->n_models != b->n_models || a->n_tags != b->n_tags || a->price_in != b->price_in ||
        a->price_out != b->price_out || a->capacity != b->capacity || a->running != b->running ||
        a->queued != b->queued || a->ttft_ms != b->ttft_ms || a->tpot_ms != b->tpot_ms ||
        a->healthy != b->healthy || a->updated_ms != b->updated_ms || a->instances != b->instances ||
        a->version != b->version || a->ttft_est_ms != b->ttft_est_ms || a->draining != b->draining ||
        a->carbon != b->carbon)
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
            x->ttft_ms != y->ttft_ms || x->tpot_ms != y->tpot_ms || a->load_est_ms[i] != b->load_est_ms[i])
            return false;
    }
    return a->n_prefixes == b->n_prefixes && a->prefill_ms_per_byte == b->prefill_ms_per_byte &&
           !memcmp(a->prefixes, b->prefixes, (size_t)a->n_prefixes * sizeof(a->prefixes[0]));
}

/* The fields of a hash reply as route_auth_verify takes them (names end at
 * their first NUL, as they are read). -1 for a field that is not a string
 * or more than max. */
static int hash_fields(const redisReply *h, const char **names, const char **values, size_t *lens, int max)
{
    int n = 0;
    for (size_t i = 0; i + 1 < h->elements; i += 2) {
        const redisReply *k = h->element[i], *v = h->element[i + 1];
        if (k->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING || n == max)
            return -1;
        names[n] = k->str;
        values[n] = v->str;
        lens[n++] = v->len;
    }
    return n;
}

/* Whether an override hash (HGETALL reply) is there and proved. */
static bool override_proved(route_sync *s, const char *region, const redisReply *r)
{
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements == 0)
        return false;
    if (s->o.auth.n) {
        const char *names[8], *values[8];
        size_t lens[8];
        int n = hash_fields(r, names, values, lens, 8);
        if (n < 0 || route_sync__auth_check(s, "price", region, names, values, lens, n))
            return false;
    }
    return true;
}

bool route_sync__carbon_parse(route_sync *s, const char *region, const redisReply *r, double *carbon)
{
    if (!override_proved(s, region, r))
        return false;
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
        const redisReply *k = r->element[i], *v = r->element[i + 1];
        if (k->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING || k->len != 6 ||
            memcmp(k->str, "carbon", 6))
            continue;
        char buf[65];
        if (v->len == 0 || v->len > 64)
            return false;
        memcpy(buf, v->str, v->len);
        buf[v->len] = '\0';
        return strlen(buf) == v->len && route_number_parse(buf, ROUTE_MAX_CARBON, carbon);
    }
    return false;
}

bool route_sync__drain_parse(route_sync *s, const char *region, const redisReply *r)
{
    if (!override_proved(s, region, r))
        return false;
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
        const redisReply *k = r->element[i], *v = r->element[i + 1];
        if (k->type == REDIS_REPLY_STRING && v->type == REDIS_REPLY_STRING && k->len == 5 &&
            !memcmp(k->str, "drain", 5))
            return v->len == 1 && v->str[0] == '1';
    }
    return false;
}

/* Parses {input, output} of a price hash. false when absent, malformed or
 * not proved by a fleet key. */
bool route_sync__price_parse(route_sync *s, const char *region, const redisReply *r, double *in, double *out)
{
    bool has_in = false, has_out = false;
    if (!override_proved(s, region, r))
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

/* ---- reads ---- */

int route_sync__read_region(route_sync *s, const char *name)
{
    if (!s->cmd.ready)
        return -ENOTCONN;
    if (s->n_pending >= SYNC_MAX_PENDING)
        return -EBUSY;
    sync_req *q = route_sync__req_new(s, REQ_READ);
    if (!q)
        return -ENOMEM;
    snprintf(q->name, sizeof(q->name), "%s", name);
    char key[SYNC_KEY_MAX], pkey[SYNC_KEY_MAX];
    snprintf(key, sizeof(key), "%s%s", s->prefix_region, name);
    snprintf(pkey, sizeof(pkey), "%s%s", s->prefix_price, name);
    const char *multi[] = {"MULTI"}, *h1[] = {"HGETALL", key}, *h2[] = {"HGETALL", pkey}, *exec[] = {"EXEC"};
    int rc = route_sync__send_plain(s, 1, multi);
    if (!rc)
        rc = route_sync__send_plain(s, 2, h1);
    if (!rc)
        rc = route_sync__send_plain(s, 2, h2);
    if (!rc)
        rc = route_sync__req_send(q, 1, exec, NULL);
    if (rc) {
        route_sync__req_free(q);
        route_sync__conn_drop(&s->cmd);
        route_sync__conn_drop(&s->sub);
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
    route_entry_fields *lines = malloc(sizeof(*lines));
    int n = 0, rc = -ENOMEM;
    char id[ROUTE_INSTANCE_ID_LEN + 1], err[200];
    *last_writer = false;
    if (!pairs || !inst || !lines) {
        route_sync__set_err(s, "out of memory");
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
        if (route_instance_split(pairs[i].v->str, pairs[i].v->len, lines, err, sizeof(err)) == 0 &&
            route_sync__auth_check(s, "region", name, lines->names, lines->values, lines->lens, lines->n))
            continue; /* said */
        if (route_instance_decode(e, pairs[i].v->str, pairs[i].v->len, err, sizeof(err))) {
            route_sync__set_err(s, "region %s, %.*s: %s", name, (int)pairs[i].k->len, pairs[i].k->str, err);
            continue;
        }
        *last_writer |= e->updated_ms == plain_ms;
        n++;
    }
    rc = n ? route_instances_merge(inst, n, out) : -ENOENT;
out:
    free(pairs);
    free(inst);
    free(lines);
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
            route_sync__set_err(s, "reading region %s: a field is not a string", name);
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
    /* Plain fields no fleet key proves (said and counted) are as
     * unreadable ones: the entries stand, or nothing does. */
    int prc = route_sync__auth_check(s, "region", name, names, values, lens, n);
    if (!prc)
        prc = route_record_from_fields(&plain, names, values, lens, n, perr, sizeof(perr));
    bool last_writer;
    int rc = record_from_entries(s, name, hash, prc ? -1 : plain.updated_ms, &last_writer, rec);
    if (rc == 0 && (last_writer || prc))
        return 0;
    if (rc != 0 && rc != -ENOENT)
        return rc;
    if (prc == -EINVAL) {
        route_sync__set_err(s, "region %s: %s", name, perr);
        return -EINVAL;
    }
    if (prc)
        return prc;
    *rec = plain;
    rec->instances = 1;
    return 0;
}

void route_sync__on_read(route_sync *s, sync_req *q, redisReply *r)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_ARRAY) {
        route_sync__set_err(s, "reading region %s: %s", q->name,
                            r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply (is the key a hash?)");
        /* a key of another type under our prefix is a peer's doing, not the
         * store's; an error from EXEC is the store's */
        if (r->type == REDIS_REPLY_ERROR)
            route_sync__store_failed(s);
        return;
    }
    const redisReply *hash = r->element[0], *price = r->element[1];
    if (s->has_local && !strcmp(q->name, s->local.name)) {
        route_sync__apply_own_override(s, price);
        return;
    }
    if (hash->elements == 0 || hash->elements % 2)
        return; /* expired: the table's clock retires it */
    route_record rec;
    if (record_from_hash(s, q->name, hash, &rec))
        return;
    double in, out;
    if (route_sync__price_parse(s, q->name, price, &in, &out)) {
        rec.price_in = in;
        rec.price_out = out;
    }
    double carbon;
    if (route_sync__carbon_parse(s, q->name, price, &carbon))
        rec.carbon = carbon;
    if (route_sync__drain_parse(s, q->name, price)) {
        rec.healthy = false;
        rec.draining = true;
    }
    route_region *cur = route_table_find(s->table, q->name);
    if (cur && (cur->local || record_equal(&cur->rec, &rec)))
        return;
    int rc = route_table_upsert(s->table, &rec, false, gw_mono_ms());
    if (rc == -EPERM)
        route_sync__set_err(s, "region %s: endpoint %s is not tls: (peers use mutual TLS): refused", q->name,
                            rec.endpoint);
    else if (rc)
        route_sync__set_err(s, "routing table: cannot add region %s: %s", q->name, strerror(-rc));
}

static void send_scan(route_sync *s, const char *cursor)
{
    sync_req *q = route_sync__req_new(s, REQ_SCAN);
    if (!q) {
        route_sync__set_err(s, "out of memory");
        s->scan_active = false;
        return;
    }
    const char *argv[] = {"SCAN", cursor, "MATCH", s->scan_match, "COUNT", SYNC_SCAN_COUNT};
    if (route_sync__req_send(q, 6, argv, NULL)) {
        route_sync__req_free(q);
        s->scan_active = false;
    }
}

void route_sync__full_read_start(route_sync *s)
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

void route_sync__on_scan(route_sync *s, redisReply *r)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_STRING ||
        r->element[1]->type != REDIS_REPLY_ARRAY) {
        route_sync__set_err(s, "SCAN: %s", r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
        s->scan_active = false;
        route_sync__store_failed(s);
        return;
    }
    size_t plen = strlen(s->prefix_region);
    const redisReply *keys = r->element[1];
    for (size_t i = 0; i < keys->elements; i++) {
        const redisReply *k = keys->element[i];
        if (k->type != REDIS_REPLY_STRING || k->len <= plen || memcmp(k->str, s->prefix_region, plen))
            continue;
        const char *name = k->str + plen;
        if (strlen(name) != k->len - plen || !route_sync__name_ok(name))
            continue;
        int rc = route_sync__read_region(s, name);
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
            route_sync__full_read_start(s);
    } else
        send_scan(s, r->element[0]->str);
}

void route_sync__on_full_read(evutil_socket_t fd, short what, void *arg)
{
    route_sync__full_read_start(arg);
}
