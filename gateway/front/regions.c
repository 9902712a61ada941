/* The gateway's side of cross-region routing: its own region's record
 * (from the config and its workers' load), the Redis sync that shares it,
 * RTT to every peer from PINGs on the pooled connections, and the routing
 * table as JSON (/v1/regions) and as a page for operators (/dashboard). */
#include "gateway/front/placement.h"
#include "gateway/front/serve_internal.h"
#include "gateway/front/route_events.h"
#include "gateway/base/clock.h"
#include "gateway/base/prefix.h"

#include "routing/router.h"
#include "routing/sync.h"

#include <errno.h>
#include <event2/event.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A peer not heard from for 20 x stale_after_ms, and at least this long,
 * leaves the table (route_table_prune). */
#define FORGET_MIN_MS (10 * 60 * 1000)

#define MAX_REGIONS 256
/* How often the peers' RTTs are read into the table (a 5x change is to be
 * routed by within a second: PINGs every 250 ms, read every 100). */
#define RTT_READ_MS 100

bool gw_regions_enabled(const gw_serve *g)
{
    return g->table != NULL;
}

/* Where a region is reached: the config's peers entry, else its record's
 * endpoint (with peer_tls, only a tls: one enters the table: tls_only). */
const char *gw_regions_endpoint(const gw_serve *g, const route_region *r)
{
    for (int i = 0; i < g->cfg->n_peers; i++)
        if (!strcmp(g->cfg->peers[i].name, r->rec.name))
            return g->cfg->peers[i].endpoint;
    return r->rec.endpoint;
}

const char *gw_regions_target(const gw_serve *g, const route_region *r, char *buf, size_t len)
{
    const char *e = gw_regions_endpoint(g, r);
    if (strncmp(e, "tls:", 4))
        return e;
    /* The peer's certificate must name the region (gateway/upstream/upstream.h). */
    snprintf(buf, len, "tls:%s@%s", r->rec.name, e + 4);
    return buf;
}

#define BIAS_SAMPLES (sizeof(((gw_serve *)0)->est_err_ms) / sizeof(double))

static double with_bias(double est_ms, double bias_ms)
{
    if (est_ms <= 0) /* not given */
        return 0;
    return fmin(fmax(est_ms + bias_ms, est_ms / 2), ROUTE_MAX_MS);
}

static int cmp_ms(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of the last BIAS_SAMPLES errors, not their EWMA: on a loaded
 * host one request's TTFT scatters several times over, and a few slow
 * first requests (a cold start) held an EWMA's bias tens of ms off for
 * dozens of requests after. */
void gw_regions_note_ttft(gw_serve *g, double est_ms, double measured_ms)
{
    if (!(est_ms > 0 && measured_ms >= 0 && measured_ms < ROUTE_MAX_MS))
        return;
    g->est_err_ms[g->est_err_n++ % BIAS_SAMPLES] = measured_ms - est_ms;
    size_t n = g->est_err_n < BIAS_SAMPLES ? g->est_err_n : BIAS_SAMPLES;
    double s[BIAS_SAMPLES];
    memcpy(s, g->est_err_ms, n * sizeof(s[0]));
    qsort(s, n, sizeof(s[0]), cmp_ms);
    g->est_bias_ms = n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

/* The prompt-prefix hashes of the record (issue 30): the ready workers'
 * most recent, taken in turn from each, and their mean prefill rate. */
static void local_prefixes(gw_serve *g, route_record *r)
{
    int n_w = gw_supervisor_count(g->sup), rated = 0;
    double ms = 0;
    for (int k = 0; r->n_prefixes < ROUTE_MAX_PREFIXES; k++) {
        bool more = false;
        for (int i = 0; i < n_w && r->n_prefixes < ROUTE_MAX_PREFIXES; i++) {
            const gw_worker_info *w = gw_supervisor_worker(g->sup, i);
            if (!w->ready || k >= w->n_recent)
                continue;
            more = true;
            bool dup = false;
            for (int j = 0; j < r->n_prefixes && !dup; j++)
                dup = r->prefixes[j] == w->recent[k];
            if (!dup)
                r->prefixes[r->n_prefixes++] = w->recent[k];
        }
        if (!more)
            break;
    }
    r->n_prefixes = gw_prefix_sort(r->prefixes, r->n_prefixes);
    for (int i = 0; i < n_w; i++) {
        const gw_worker_info *w = gw_supervisor_worker(g->sup, i);
        double x = w->ready ? gw_supervisor_ms_per_byte(w) : 0;
        ms += x;
        rated += x > 0;
    }
    r->prefill_ms_per_byte = rated ? fmin(ms / rated, ROUTE_MAX_MS) : 0;
}

/* This region's record: the configured identity plus the workers' load. */
static void local_record(gw_serve *g, route_record *r)
{
    const gw_config *c = g->cfg;
    memset(r, 0, sizeof(*r));
    snprintf(r->name, sizeof(r->name), "%s", c->region.name);
    snprintf(r->endpoint, sizeof(r->endpoint), "%s", c->region.endpoint ? c->region.endpoint : "");
    for (int i = 0; i < c->n_workers && r->n_models < ROUTE_MAX_MODELS; i++) {
        bool dup = false;
        for (int j = 0; j < r->n_models; j++)
            dup |= !strcmp(r->models[j], c->workers[i].name);
        if (!dup)
            snprintf(r->models[r->n_models++], ROUTE_NAME_MAX, "%s", c->workers[i].name);
    }
    for (int i = 0; i < c->region.n_tags && i < ROUTE_MAX_TAGS; i++)
        snprintf(r->tags[r->n_tags++], sizeof(r->tags[0]), "%s", c->region.tags[i]);
    r->price_in = c->region.price_in;
    r->price_out = c->region.price_out;
    r->carbon = gw_placement_carbon(g);
    snprintf(r->gpu, sizeof(r->gpu), "%s", c->region.gpu ? c->region.gpu : "cpu");
    /* A worker that has served nothing yet (just started, or restarted
     * after a crash) has no estimates (0): averaged in, it halved the
     * region's, and a region of fresh workers said 0, so its queue cost
     * nothing to peers' routing however long. Only measured workers count;
     * with none, the last record's estimates stand. */
    int ready = 0, n_ttft = 0, n_tpot = 0, m_ttft[ROUTE_MAX_MODELS] = {0}, m_tpot[ROUTE_MAX_MODELS] = {0};
    double ttft = 0, tpot = 0;
    r->n_load = r->n_models;
    for (int i = 0; i < gw_supervisor_count(g->sup); i++) {
        const gw_worker_info *w = gw_supervisor_worker(g->sup, i);
        /* a worker not ready (starting, restarting after a crash) serves
         * nothing: counted, it made the region look free to take traffic */
        if (!w->ready)
            continue;
        r->capacity += w->max_seqs;
        ready++;
        r->running += w->running;
        r->queued += w->queued;
        /* The queue is counted apart (running, queued): the time estimate
         * must not count it again, nor keep the wait of a queue long gone. */
        ttft += w->prefill_ewma_ms;
        tpot += w->tpot_ewma_ms;
        n_ttft += w->prefill_ewma_ms > 0;
        n_tpot += w->tpot_ewma_ms > 0;
        if (w->est_ttft_ms > 0 && (r->ttft_est_ms == 0 || w->est_ttft_ms < r->ttft_est_ms))
            r->ttft_est_ms = fmin(w->est_ttft_ms, ROUTE_MAX_MS);
        for (int m = 0; m < r->n_load; m++) {
            if (strcmp(r->models[m], w->model))
                continue;
            route_model_load *l = &r->load[m];
            l->capacity += w->max_seqs;
            l->running += w->running;
            l->queued += w->queued;
            l->ttft_ms += w->prefill_ewma_ms;
            l->tpot_ms += w->tpot_ewma_ms;
            /* a request goes to the least loaded worker (gw_supervisor_pick):
             * the model's wait is its best worker's */
            if (w->est_ttft_ms > 0 && (r->load_est_ms[m] == 0 || w->est_ttft_ms < r->load_est_ms[m]))
                r->load_est_ms[m] = fmin(w->est_ttft_ms, ROUTE_MAX_MS);
            m_ttft[m] += w->prefill_ewma_ms > 0;
            m_tpot[m] += w->tpot_ewma_ms > 0;
        }
    }
    const route_region *last = g->table ? route_table_find(g->table, r->name) : NULL;
    const route_record *was = last ? &last->rec : NULL;
    /* Within a record's bounds whatever a worker's stats say. */
    r->ttft_ms = fmin(n_ttft ? ttft / n_ttft : was ? was->ttft_ms : 0, ROUTE_MAX_MS);
    r->tpot_ms = fmin(n_tpot ? tpot / n_tpot : was ? was->tpot_ms : 0, ROUTE_MAX_MS);
    for (int m = 0; m < r->n_load; m++) {
        route_model_load *l = &r->load[m];
        /* the models are the config's, in its order: the last record's m is this m */
        const route_model_load *lw = was && m < was->n_load ? &was->load[m] : NULL;
        l->ttft_ms = fmin(m_ttft[m] ? l->ttft_ms / m_ttft[m] : lw ? lw->ttft_ms : 0, ROUTE_MAX_MS);
        l->tpot_ms = fmin(m_tpot[m] ? l->tpot_ms / m_tpot[m] : lw ? lw->tpot_ms : 0, ROUTE_MAX_MS);
    }
    /* What the workers' replay leaves out (the hops to and from the worker,
     * tokenizing, thread hand-offs), as measured here; at least half the
     * replay's figure whatever it says. */
    r->ttft_est_ms = with_bias(r->ttft_est_ms, g->est_bias_ms);
    for (int m = 0; m < r->n_load; m++)
        r->load_est_ms[m] = with_bias(r->load_est_ms[m], g->est_bias_ms);
    r->healthy = ready > 0 && !g->draining;
    r->draining = g->draining;
    r->updated_ms = gw_epoch_ms();
    r->instances = 1; /* this gateway: others of the region are not counted in its own view */
    if (c->routing.cache_aware)
        local_prefixes(g, r);
}

/* This region's record, into the table and to Redis. */
static void publish_local(gw_serve *g, int64_t now)
{
    route_record me;
    local_record(g, &me);
    int rc = route_table_upsert(g->table, &me, true, now);
    static bool told;
    if (rc && !told) {
        /* The config is checked against the record's limits: a bug. */
        char err[160];
        if (rc != -EINVAL || route_record_check(&me, err, sizeof(err)) == 0)
            snprintf(err, sizeof(err), "%s", strerror(-rc));
        fprintf(stderr, "infergate: this region's own record is refused: %s\n", err);
        told = true;
    }
    if (g->sync)
        route_sync_set_local(g->sync, &me);
    else
        route_table_set_shared_ok(g->table, true, now);
}

/* A worker came up or went: routing hears of it now, not at the next
 * heartbeat. Until then a gateway whose /readyz had said ready left its
 * own region out as unhealthy (503), and one whose last worker had died
 * went on sending it requests. */
static void on_workers_changed(void *ud)
{
    publish_local(ud, gw_mono_ms());
}

/* A worker's stats were read: its queue estimate goes into our own record
 * now, for routing here (the table) and for the next heartbeat's write
 * (route_sync_set_local writes at once only when the record's identity or
 * health changed). Refreshed only at the heartbeat, the local figure was
 * up to a stats interval plus a heartbeat old, and a queue that came and
 * went in between was never seen. */
static void on_worker_stats(void *ud)
{
    publish_local(ud, gw_mono_ms());
}

/* The fleet keys of the config's redis section (checked by the loader). */
static void fleet_keys(const gw_config *c, route_auth_keys *k)
{
    char err[160];
    route_auth_keys_set(k, (const char *const *)c->redis.record_keys, c->redis.n_record_keys, err,
                        sizeof(err));
}

void gw_regions_reload(gw_serve *g, const gw_config *c)
{
    route_auth_keys k;
    if (!g->sync || !c->redis.n_record_keys)
        return;
    fleet_keys(c, &k);
    route_sync_set_auth(g->sync, &k);
    memset(&k, 0, sizeof(k));
}

/* Records and price overrides in Redis that no fleet key proves are
 * ignored; said here, once a heartbeat at most (a forged record is read
 * at each full read and each announcement). */
static void say_refused_records(gw_serve *g)
{
    const char *last;
    unsigned long long n = g->sync ? route_sync_auth_refused(g->sync, &last) : 0;
    if (n > g->auth_refused_said)
        fprintf(stderr,
                "infergate: %llu read(s) from Redis not proved by the fleet key, ignored; the last: %s\n",
                n - g->auth_refused_said, last);
    g->auth_refused_said = n;
}

/* The peers' RTTs and last PING answers, from their connections, into the table. */
static void read_rtts(gw_serve *g)
{
    for (int i = 0; i < route_table_count(g->table); i++) {
        route_region *r = route_table_at(g->table, i);
        char buf[GW_TARGET_MAX];
        const char *target = r->local ? "" : gw_regions_target(g, r, buf, sizeof(buf));
        double ewma_us, p95_us;
        if (*target && gw_upstream_rtt(g->pool, target, &ewma_us, &p95_us) == 0)
            route_table_set_rtt(g->table, r->rec.name, ewma_us / 1000.0, p95_us / 1000.0);
        if (*target) /* its own sign of life, for when Redis says nothing */
            route_table_set_answered(g->table, r->rec.name, gw_upstream_ping_answered_ms(g->pool, target));
    }
}

/* Every RTT_READ_MS: read once a heartbeat, a peer's RTT grown fivefold
 * was routed to for up to a second more. The routing events are looked
 * for at the same pace. */
static void on_rtt_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    read_rtts(arg);
    gw_route_events_poll(arg);
}

/* Every heartbeat: publish ourselves, keep a pooled connection to each peer
 * (its PINGs measure RTT) and read the RTT back into the table. */
static void on_heartbeat(evutil_socket_t fd, short what, void *arg)
{
    gw_serve *g = arg;
    int64_t now = gw_mono_ms();
    publish_local(g, now);
    say_refused_records(g);
    /* A region silent this long is gone (or never was: a stray key): no
     * longer dialled, listed or counted against the table's size. A
     * request that still holds it (a long stream) checks route_region_is
     * before it reports on it. */
    int64_t stale = g->cfg->routing.stale_after_ms;
    route_table_prune(g->table, stale * 20 > FORGET_MIN_MS ? stale * 20 : FORGET_MIN_MS, now);
    for (int i = 0; i < route_table_count(g->table); i++) {
        route_region *r = route_table_at(g->table, i);
        if (r->local)
            continue;
        char buf[GW_TARGET_MAX];
        const char *target = gw_regions_target(g, r, buf, sizeof(buf));
        if (!*target)
            continue;
        gw_upstream_connect(g->pool, target);
    }
    read_rtts(g);
}

int gw_regions_start(gw_serve *g, char *err, size_t err_len)
{
    const gw_config *c = g->cfg;
    if (!c->region.name)
        return 0;
    const gw_routing_cfg *rc = &c->routing;
    route_table_opts to = {
        .stale_after_ms = rc->stale_after_ms,
        .eject_after = rc->eject_after,
        .eject_base_ms = rc->eject_base_ms,
        .eject_max_ms = rc->eject_max_ms,
        /* anyone who can write to the store would otherwise have tenants'
         * prompts sent in clear to a peer never verified */
        .tls_only = c->peer_tls.ca || c->peer_tls.cert,
    };
    if (!(g->table = route_table_new(&to, MAX_REGIONS))) {
        snprintf(err, err_len, "out of memory");
        return -ENOMEM;
    }
    gw_upstream_set_ping_interval(g->pool, rc->ping_interval_ms);
    if (c->redis.address) {
        route_sync_opts so;
        route_sync_opts_default(&so);
        so.host = c->redis.host;
        so.port = c->redis.port;
        so.password = c->redis.password;
        so.db = c->redis.db;
        so.command_timeout_ms = c->redis.timeout_ms;
        so.cluster = c->cluster;
        fleet_keys(c, &so.auth);
        so.heartbeat_ms = rc->heartbeat_ms;
        /* A live peer's record must be re-read well within stale_after_ms:
         * the table only counts a record as seen when its updated_ms moves. */
        so.full_read_ms = rc->stale_after_ms / 2 > rc->heartbeat_ms ? rc->stale_after_ms / 2 : rc->heartbeat_ms;
        int e = route_sync_opts_check(&so, err, err_len);
        if (e)
            return e;
        g->sync = route_sync_new(g->base, &so, g->table);
        memset(&so.auth, 0, sizeof(so.auth));
        if (!g->sync) {
            snprintf(err, err_len, "out of memory");
            return -ENOMEM;
        }
    }
    g->heartbeat = event_new(g->base, -1, EV_PERSIST, on_heartbeat, g);
    int ms = rc->heartbeat_ms > 0 ? rc->heartbeat_ms : 1000;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    if (!g->heartbeat || event_add(g->heartbeat, &tv)) {
        snprintf(err, err_len, "out of memory");
        return -ENOMEM;
    }
    g->events = gw_route_events_new();
    g->rtt_timer = event_new(g->base, -1, EV_PERSIST, on_rtt_timer, g);
    struct timeval rtv = {0, RTT_READ_MS * 1000};
    if (!g->events || !g->rtt_timer || event_add(g->rtt_timer, &rtv)) {
        snprintf(err, err_len, "out of memory");
        return -ENOMEM;
    }
    gw_supervisor_on_ready_change(g->sup, on_workers_changed, g);
    gw_supervisor_on_stats(g->sup, on_worker_stats, g);
    on_heartbeat(-1, 0, g);
    fprintf(stderr, "infergate: region %s (%s), policy %s, %s\n", c->region.name,
            c->region.endpoint ? c->region.endpoint : "no endpoint for peers",
            gw_policy_name(rc->policy),
            c->redis.address ? "sharing state through Redis" : "no Redis: this region only");
    return 0;
}

void gw_regions_publish(gw_serve *g)
{
    if (g->table)
        publish_local(g, gw_mono_ms());
}

void gw_regions_stop(gw_serve *g)
{
    if (g->table) {
        gw_supervisor_on_ready_change(g->sup, NULL, NULL);
        gw_supervisor_on_stats(g->sup, NULL, NULL);
    }
    if (g->heartbeat)
        event_free(g->heartbeat);
    g->heartbeat = NULL;
    if (g->rtt_timer)
        event_free(g->rtt_timer);
    g->rtt_timer = NULL;
    gw_route_events_free(g->events);
    g->events = NULL;
    route_sync_free(g->sync);
    g->sync = NULL;
    route_table_free(g->table);
    g->table = NULL;
}

/* One region as the table shows it. */
static json_t *region_json(gw_serve *g, route_region *r, int64_t now, int64_t wall)
{
    json_t *models = json_array(), *tags = json_array();
    for (int i = 0; i < r->rec.n_models; i++)
        json_array_append_new(models, json_string(r->rec.models[i]));
    for (int i = 0; i < r->rec.n_tags; i++)
        json_array_append_new(tags, json_string(r->rec.tags[i]));
    bool ejected = route_region_ejected(r, now);
    json_t *load = r->rec.n_load ? json_object() : json_null();
    for (int i = 0; i < r->rec.n_load; i++) {
        const route_model_load *l = &r->rec.load[i];
        double q = route_model_queue_ms(r, i);
        json_object_set_new(load, r->rec.models[i],
                            json_pack("{s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:f}", "capacity", l->capacity,
                                      "running", l->running, "queued", l->queued, "ttft_ms", l->ttft_ms,
                                      "tpot_ms", l->tpot_ms, "est_ms", r->rec.load_est_ms[i], "queue_ms", q,
                                      "expected_ms", route_rtt_ms(r) + q));
    }
    json_t *o = json_pack(
        "{s:s, s:s, s:b, s:o, s:o, s:f, s:f, s:s, s:i, s:i, s:i, s:f, s:f, s:b, s:b, s:b, s:o, s:o, "
        "s:f, s:f, s:I, s:i, s:I, s:i}",
        "name", r->rec.name, "endpoint", r->local ? r->rec.endpoint : gw_regions_endpoint(g, r), "local",
        r->local, "models", models, "tags", tags, "price_input", r->rec.price_in, "price_output",
        r->rec.price_out, "gpu", r->rec.gpu, "capacity", r->rec.capacity, "running", r->rec.running, "queued",
        r->rec.queued, "ttft_ms", r->rec.ttft_ms, "tpot_ms", r->rec.tpot_ms, "healthy", r->rec.healthy,
        "stale", !route_region_fresh(g->table, r, now), "ejected", ejected, "rtt_ms",
        r->rtt_known ? json_real(r->rtt_ewma_ms) : json_null(), "rtt_p95_ms",
        r->rtt_known ? json_real(r->rtt_p95_ms) : json_null(), "queue_ms", route_queue_ms(r), "expected_ms",
        route_expected_ms(r), "age_ms", (json_int_t)(wall - r->rec.updated_ms), "consecutive_failures",
        r->consecutive_failures, "ejected_for_ms", (json_int_t)(ejected ? r->ejected_until_ms - now : 0),
        "instances", r->rec.instances);
    if (o) {
        json_object_set_new(o, "model_load", load); /* per model: what routing ranks by */
        /* the region's own queue-based estimate (0: an older gateway's record) */
        json_object_set_new(o, "ttft_est_ms", json_real(r->rec.ttft_est_ms));
        json_object_set_new(o, "draining", json_boolean(r->rec.draining));
        /* stale, yet a candidate: it answers our PINGs while Redis shows nothing newer */
        json_object_set_new(o, "held_by_ping", json_boolean(route_region_held_by_ping(g->table, r, now)));
        /* gCO2e/kWh, 0: not given */
        json_object_set_new(o, "carbon", json_real(r->rec.carbon));
        /* prompt prefixes its record carries (issue 30) */
        json_object_set_new(o, "prefixes", json_integer(r->rec.n_prefixes));
    } else {
        json_decref(load);
    }
    return o;
}

char *gw_regions_json(gw_serve *g, size_t *len)
{
    int64_t now = gw_mono_ms(), wall = gw_epoch_ms();
    json_t *list = json_array();
    for (int i = 0; g->table && i < route_table_count(g->table); i++)
        json_array_append_new(list, region_json(g, route_table_at(g->table, i), now, wall));
    json_t *o = json_pack("{s:s?, s:s, s:b, s:b, s:s?, s:o}", "region", g->cfg->region.name, "policy",
                          gw_policy_name(g->cfg->routing.policy), "redis_configured",
                          g->cfg->redis.address != NULL, "redis_connected", g->sync && route_sync_connected(g->sync),
                          "redis_error", g->sync && !route_sync_connected(g->sync) ? route_sync_last_error(g->sync) : NULL, "regions", list);
    if (o) /* the last decisions and the intents that made them */
        json_object_set_new(o, "placement", gw_placement_json(g));
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (s)
        *len = strlen(s);
    return s;
}

/* Names, tags and models come from other regions' records: escape them. */
static void html(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

/* The same table as a page that refreshes itself: no scripts, no assets. */
/* One budget cell: what the tenant has spent of it this period, as its
 * last request saw the fleet's figure. */
static void budget_cell(FILE *f, gw_serve *g, const char *t, const char *period, double budget)
{
    if (!(budget > 0)) {
        fprintf(f, "<td>—</td>");
        return;
    }
    char labels[2 * GW_TENANT_NAME_MAX + 40];
    snprintf(labels, sizeof(labels), "tenant=\"%s\",period=\"%s\"", t, period);
    double used = gw_metrics_sum(g->metrics, "infergate_budget_spend", labels);
    fprintf(f, "<td class=%s>%.4g / %.4g (%.0f%%)</td>", used >= budget ? "bad" : "ok", used, budget,
            100.0 * used / budget);
}

/* The tenants: what this gateway counted for each since it started
 * (/metrics' figures), and their budgets' use. */
static void dashboard_tenants(gw_serve *g, FILE *f)
{
    if (!g->cfg->n_tenants)
        return;
    fprintf(f, "<h2>tenants</h2><table><tr><th>tenant</th><th>spend</th><th>tokens</th><th>gCO2e</th>"
               "<th>budget today</th><th>budget this month</th></tr>");
    for (int i = 0; i < g->cfg->n_tenants; i++) {
        const gw_tenant_cfg *tc = gw_serve_tenant_cfg(g, g->cfg->tenants[i].name);
        if (!tc)
            continue;
        char t[2 * GW_TENANT_NAME_MAX + 1], prefix[2 * GW_TENANT_NAME_MAX + 16];
        gw_metrics_escape(tc->name, t, sizeof(t));
        snprintf(prefix, sizeof(prefix), "tenant=\"%s\",", t);
        fprintf(f, "<tr><td>");
        html(f, tc->name);
        fprintf(f, "</td><td>%.4g</td><td>%.0f</td><td>%.4g</td>", gw_metrics_sum(g->metrics, "infergate_spend_total", prefix),
                gw_metrics_sum(g->metrics, "infergate_tokens_total", prefix),
                gw_metrics_sum(g->metrics, "infergate_gco2e_total", prefix));
        budget_cell(f, g, t, "day", tc->budget_daily);
        budget_cell(f, g, t, "month", tc->budget_monthly);
        fprintf(f, "</tr>");
    }
    fprintf(f, "</table><p>spend, tokens and gCO2e: counted by this gateway since it started (the requests "
               "that came in here); budgets: the fleet's figure as the tenant's last request saw it</p>");
}

char *gw_regions_dashboard(gw_serve *g, size_t *len)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f)
        return NULL;
    int64_t now = gw_mono_ms(), wall = gw_epoch_ms();
    bool redis = g->sync && route_sync_connected(g->sync);
    fprintf(f, "<!doctype html><html><head><meta charset=utf-8><meta http-equiv=refresh content=\"2; url=/dashboard\">"
               "<title>infergate regions</title><style>"
               "body{font:14px system-ui,sans-serif;margin:2em;color:#222}"
               "table{border-collapse:collapse}td,th{padding:.35em .8em;border-bottom:1px solid #ddd;text-align:right}"
               "td:first-child,th:first-child{text-align:left}.bad{color:#b00;font-weight:600}.ok{color:#070}"
               ".local{background:#f3f7ff}</style></head><body>");
    fprintf(f, "<h1>infergate — region ");
    html(f, g->cfg->region.name ? g->cfg->region.name : "(none)");
    fprintf(f, "</h1><p>policy <b>%s</b> · Redis <span class=%s>%s</span> · refreshed every 2 s</p>",
            gw_policy_name(g->cfg->routing.policy), redis ? "ok" : "bad",
            g->cfg->redis.address ? (redis ? "connected" : "away: routing on last known records") : "not configured");
    fprintf(f, "<table><tr><th>region</th><th>health</th><th>RTT ms</th><th>RTT p95</th><th>queue ms</th>"
               "<th>expected ms</th><th>running</th><th>queued</th><th>capacity</th><th>$/M in</th><th>$/M out</th>"
               "<th>gCO2e/kWh</th>"
               "<th>tags</th><th>models</th><th>age s</th></tr>");
    for (int i = 0; g->table && i < route_table_count(g->table); i++) {
        route_region *r = route_table_at(g->table, i);
        bool stale = !route_region_fresh(g->table, r, now), ejected = route_region_ejected(r, now);
        const char *health = ejected ? "ejected" : stale ? "stale" : r->rec.healthy ? "healthy" : "unhealthy";
        if (stale && !ejected && route_region_held_by_ping(g->table, r, now))
            health = "stale, held by its PINGs";
        fprintf(f, "<tr%s><td>", r->local ? " class=local" : "");
        html(f, r->rec.name);
        fprintf(f, "%s</td><td class=%s>%s</td>", r->local ? " (here)" : "", !strcmp(health, "healthy") ? "ok" : "bad",
                health);
        if (r->rtt_known || r->local)
            fprintf(f, "<td>%.1f</td><td>%.1f</td>", r->rtt_ewma_ms, r->rtt_p95_ms);
        else
            fprintf(f, "<td>—</td><td>—</td>");
        fprintf(f, "<td>%.1f</td><td>%.1f</td><td>%d</td><td>%d</td><td>%d</td><td>%.2f</td><td>%.2f</td>",
                route_queue_ms(r), route_expected_ms(r), r->rec.running, r->rec.queued, r->rec.capacity,
                r->rec.price_in, r->rec.price_out);
        if (r->rec.carbon > 0)
            fprintf(f, "<td>%.0f</td><td>", r->rec.carbon);
        else
            fprintf(f, "<td>—</td><td>");
        for (int t = 0; t < r->rec.n_tags; t++) {
            fputs(t ? ", " : "", f);
            html(f, r->rec.tags[t]);
        }
        fprintf(f, "</td><td>");
        for (int m = 0; m < r->rec.n_models; m++) {
            fputs(m ? ", " : "", f);
            html(f, r->rec.models[m]);
        }
        fprintf(f, "</td><td>%.1f</td></tr>", (double)(wall - r->rec.updated_ms) / 1000.0);
    }
    fprintf(f, "</table>");
    dashboard_tenants(g, f);
    fprintf(f, "</body></html>\n");
    if (fclose(f)) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}
