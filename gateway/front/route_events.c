/* Routing events (see route_events.h): what the table and the Redis link
 * did since the last look, logged once per change and counted. */
#include "gateway/front/route_events.h"

#include "gateway/base/clock.h"
#include "gateway/front/metrics.h"
#include "gateway/front/serve_internal.h"
#include "routing/sync.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SEEN 256  /* regions followed (the table's size in regions.c) */
#define MAX_KINDS 16  /* kinds of request whose preferred region is followed */
#define PREF_LOG_MS 1000

/* What was last seen of a region: the reason it was out of use, if any. */
typedef struct seen_region {
    uint64_t id;
    char name[ROUTE_NAME_MAX];
    const char *out; /* NULL: usable; else "stale", "ejected", "unhealthy" or "drained" */
    int ejections;
    bool held; /* a candidate by its PINGs only (route_region_held_by_ping) */
    bool mark; /* still in the table at this poll */
} seen_region;

typedef struct pref_kind {
    char key[160]; /* model, policy, tags */
    char region[ROUTE_NAME_MAX];
    int64_t logged_ms;
    uint64_t used; /* for replacing the least recently used */
} pref_kind;

struct gw_route_events {
    seen_region seen[MAX_SEEN];
    int n_seen;
    bool polled, redis_ok, redis_ever;
    int64_t redis_lost_ms, started_ms;
    pref_kind kinds[MAX_KINDS];
    uint64_t tick;
};

gw_route_events *gw_route_events_new(void)
{
    return calloc(1, sizeof(gw_route_events));
}

void gw_route_events_free(gw_route_events *e)
{
    free(e);
}

static void count(gw_serve *g, const char *event)
{
    char labels[64];
    snprintf(labels, sizeof(labels), "event=\"%s\"", event);
    gw_metrics_add(g->metrics, "infergate_route_events_total", labels, 1);
}

/* Why r is out of use now; NULL when it is usable. Draining before
 * unhealthy: a draining gateway says both. */
static const char *out_reason(const route_table *t, const route_region *r, int64_t now)
{
    if (!r->local && !route_region_current(t, r, now))
        return "stale";
    if (route_region_ejected(r, now))
        return "ejected";
    if (r->rec.draining)
        return "drained";
    if (!r->rec.healthy)
        return "unhealthy";
    return NULL;
}

static seen_region *find_seen(gw_route_events *e, uint64_t id, int hint)
{
    if (hint < e->n_seen && e->seen[hint].id == id)
        return &e->seen[hint];
    for (int i = 0; i < e->n_seen; i++)
        if (e->seen[i].id == id)
            return &e->seen[i];
    return NULL;
}

static void region_changed(gw_serve *g, const route_region *r, seen_region *s, const char *out, int64_t now)
{
    if (r->ejections > s->ejections) {
        /* counted even when the ejection ended between two polls */
        if (r->check_down) /* by its health checks (front/health.h): out until they pass */
            fprintf(stderr, "infergate: event=region_ejected region=%s failures=%d ejections=%d by=check\n",
                    r->rec.name, r->check_failures, r->ejections);
        else
            fprintf(stderr, "infergate: event=region_ejected region=%s failures=%d ejections=%d for_ms=%lld\n",
                    r->rec.name, r->consecutive_failures, r->ejections,
                    (long long)(r->ejected_until_ms > now ? r->ejected_until_ms - now : 0));
        count(g, "region_ejected");
    }
    s->ejections = r->ejections;
    bool held = route_region_held_by_ping(g->table, r, now);
    if (held != s->held) {
        /* its record aged past stale while Redis said nothing newer, and it
         * answers our PINGs: used with that record (or that ends) */
        if (held)
            fprintf(stderr, "infergate: event=region_held_by_ping region=%s age_ms=%lld redis=%s\n", r->rec.name,
                    (long long)(now - r->seen_ms), route_table_shared_ok(g->table) ? "ok" : "away");
        else
            fprintf(stderr, "infergate: event=region_held_by_ping_end region=%s by=%s\n", r->rec.name,
                    route_region_fresh(g->table, r, now) ? "record" : "stale");
        count(g, held ? "region_held_by_ping" : "region_held_by_ping_end");
        s->held = held;
    }
    if (out == s->out || (out && s->out && !strcmp(out, s->out)))
        return;
    if (!out) {
        fprintf(stderr, "infergate: event=region_returned region=%s was=%s\n", r->rec.name, s->out);
        count(g, "region_returned");
    } else if (strcmp(out, "ejected")) { /* ejections are logged above */
        char ev[32];
        snprintf(ev, sizeof(ev), "region_%s", out);
        if (!strcmp(out, "stale"))
            fprintf(stderr, "infergate: event=region_stale region=%s age_ms=%lld\n", r->rec.name,
                    (long long)(now - r->seen_ms));
        else
            fprintf(stderr, "infergate: event=%s region=%s\n", ev, r->rec.name);
        count(g, ev);
    }
    s->out = out;
}

static void poll_redis(gw_serve *g, gw_route_events *e, int64_t now)
{
    if (!g->sync)
        return;
    bool ok = route_sync_connected(g->sync);
    e->redis_ever |= ok;
    /* a start takes a moment to connect: lost only after 2 s of trying */
    if (ok == e->redis_ok || (!ok && !e->redis_ever && now - e->started_ms < 2000))
        return;
    if (!ok) {
        const char *why = route_sync_last_error(g->sync);
        fprintf(stderr, "infergate: event=redis_lost error=\"%s\"\n", why ? why : "");
        count(g, "redis_lost");
        e->redis_lost_ms = now;
    } else if (e->polled) {
        fprintf(stderr, "infergate: event=redis_regained after_ms=%lld\n",
                (long long)(e->redis_lost_ms ? now - e->redis_lost_ms : 0));
        count(g, "redis_regained");
    }
    e->redis_ok = ok;
}

void gw_route_events_poll(gw_serve *g)
{
    gw_route_events *e = g->events;
    if (!e || !g->table)
        return;
    int64_t now = gw_mono_ms();
    if (!e->polled) {
        e->redis_ok = true; /* as if connected at start: see poll_redis */
        e->started_ms = now;
    }
    poll_redis(g, e, now);
    for (int i = 0; i < e->n_seen; i++)
        e->seen[i].mark = false;
    int n = route_table_count(g->table);
    for (int i = 0; i < n; i++) {
        const route_region *r = route_table_at(g->table, i);
        const char *out = out_reason(g->table, r, now);
        seen_region *s = find_seen(e, r->id, i);
        if (!s && e->n_seen < MAX_SEEN) {
            s = &e->seen[e->n_seen++];
            *s = (seen_region){.id = r->id, .out = out, .ejections = r->ejections};
            snprintf(s->name, sizeof(s->name), "%s", r->rec.name);
            if (e->polled && !r->local) {
                fprintf(stderr, "infergate: event=region_joined region=%s%s%s\n", r->rec.name,
                        out ? " out=" : "", out ? out : "");
                count(g, "region_joined");
            }
        } else if (s) {
            region_changed(g, r, s, out, now);
        }
        if (s)
            s->mark = true;
    }
    for (int i = 0; i < e->n_seen;) {
        if (e->seen[i].mark) {
            i++;
            continue;
        }
        fprintf(stderr, "infergate: event=region_gone region=%s\n", e->seen[i].name);
        count(g, "region_gone");
        e->seen[i] = e->seen[--e->n_seen];
    }
    e->polled = true;
}

void gw_route_events_failover(gw_serve *g, const char *from, const char *to, const char *why)
{
    fprintf(stderr, "infergate: event=failover from=%s to=%s why=%s\n", from, to, why ? why : "unknown");
    count(g, "failover");
}

static void kind_key(const route_query *q, char *key, size_t cap)
{
    int n = snprintf(key, cap, "model=%s policy=%s tags=", q->model ? q->model : "",
                     q->policy == ROUTE_COST      ? "cost"
                     : q->policy == ROUTE_CARBON  ? "carbon"
                     : q->policy == ROUTE_PRIMARY ? "primary"
                                                  : "latency");
    for (int i = 0; i < q->n_need_tags && n > 0 && (size_t)n < cap; i++)
        n += snprintf(key + n, cap - (size_t)n, "%s%s", i ? "," : "", q->need_tags[i]);
    if (q->n_need_tags == 0 && n > 0 && (size_t)n < cap)
        snprintf(key + n, cap - (size_t)n, "-");
}

void gw_route_events_preferred(gw_serve *g, const route_query *q, const route_region *preferred)
{
    gw_route_events *e = g->events;
    if (!e)
        return;
    char key[sizeof(e->kinds[0].key)];
    kind_key(q, key, sizeof(key));
    const char *name = preferred ? preferred->rec.name : "-";
    pref_kind *k = NULL, *lru = &e->kinds[0];
    for (int i = 0; i < MAX_KINDS && !k; i++) {
        if (!strcmp(e->kinds[i].key, key))
            k = &e->kinds[i];
        else if (e->kinds[i].used < lru->used)
            lru = &e->kinds[i];
    }
    e->tick++;
    if (!k) { /* the first decision for this kind: nothing changed */
        *lru = (pref_kind){.used = e->tick};
        snprintf(lru->key, sizeof(lru->key), "%s", key);
        snprintf(lru->region, sizeof(lru->region), "%s", name);
        return;
    }
    k->used = e->tick;
    if (!strcmp(k->region, name))
        return;
    count(g, "preferred");
    int64_t now = gw_mono_ms();
    if (now - k->logged_ms >= PREF_LOG_MS) {
        fprintf(stderr, "infergate: event=preferred %s region=%s was=%s\n", key, name, k->region);
        k->logged_ms = now;
    }
    snprintf(k->region, sizeof(k->region), "%s", name);
}
