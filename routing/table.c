/* The routing table (see region.h): the regions this gateway knows, each
 * with what this gateway adds to its record (RTT, freshness, ejection and
 * probes), in slots that never move (route_internal.h: what route_decide
 * reads precomputed). The records themselves are region.c's. */
#include "routing/region.h"
#include "routing/route_internal.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- the table ---- */

route_table *route_table_new(const route_table_opts *o, int max_regions)
{
    if (max_regions < 1)
        return NULL;
    route_table *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    t->o = *o;
    if (t->o.probe_timeout_ms <= 0)
        t->o.probe_timeout_ms = 10000;
    t->max = max_regions;
    t->shared_ok = true;
    t->rng = (uint64_t)(uintptr_t)t ^ ((uint64_t)time(NULL) << 20);
    if (!(t->slots = calloc((size_t)max_regions, sizeof(*t->slots))))
        goto fail_table;
    if (!(t->order = calloc((size_t)max_regions, sizeof(*t->order))))
        goto fail_slots;
    if (!(t->free_q = calloc((size_t)max_regions, sizeof(*t->free_q))))
        goto fail_order;
    for (int i = 0; i < max_regions; i++)
        t->free_q[i] = i;
    t->free_n = max_regions;
    return t;

fail_order:
    free(t->order);
fail_slots:
    free(t->slots);
fail_table:
    free(t);
    return NULL;
}

void route_table_free(route_table *t)
{
    if (!t)
        return;
    free(t->free_q);
    free(t->order);
    free(t->slots);
    free(t);
}

int route_table_count(const route_table *t)
{
    return t->n;
}

route_region *route_table_at(route_table *t, int i)
{
    if (i < 0 || i >= t->n)
        return NULL;
    return &t->slots[t->order[i]].r;
}

static int find_index(const route_table *t, const char *name, uint64_t h)
{
    for (int i = 0; i < t->n; i++) {
        const route_slot *s = &t->slots[t->order[i]];
        if (s->name_hash == h && !strcmp(s->r.rec.name, name))
            return i;
    }
    return -1;
}

route_region *route_table_find(route_table *t, const char *name)
{
    int i = find_index(t, name, route__hash(name));
    return i < 0 ? NULL : &t->slots[t->order[i]].r;
}

static void slot_index_record(route_slot *s)
{
    const route_record *r = &s->r.rec;
    s->name_hash = route__hash(r->name);
    s->model_bloom = s->tag_bloom = 0;
    for (int i = 0; i < r->n_models; i++) {
        s->model_hash[i] = route__hash(r->models[i]);
        s->model_len[i] = (uint8_t)strlen(r->models[i]);
        s->model_bloom |= route__bloom_bit(s->model_hash[i]);
    }
    for (int i = 0; i < r->n_tags; i++) {
        s->tag_hash[i] = route__hash(r->tags[i]);
        s->tag_bloom |= route__bloom_bit(s->tag_hash[i]);
    }
}

int route_table_upsert(route_table *t, const route_record *r, bool local, int64_t now_ms)
{
    int rc = route_record_check(r, NULL, 0);
    if (rc)
        return rc;
    if (!local && t->o.tls_only && r->endpoint[0] && strncmp(r->endpoint, "tls:", 4) != 0)
        return -EPERM;
    int i = find_index(t, r->name, route__hash(r->name));
    if (i >= 0) {
        route_slot *s = &t->slots[t->order[i]];
        if (s->r.local && !local)
            return 0;
        if (local || r->updated_ms != s->r.rec.updated_ms || r->version != s->r.rec.version) {
            s->r.seen_ms = now_ms;
            s->r.graced = false;
        }
        s->r.rec = *r;
        s->r.local = local;
        if (local) {
            s->r.rtt_ewma_ms = s->r.rtt_p95_ms = 0;
            s->r.rtt_known = true;
        }
        slot_index_record(s);
        return 0;
    }
    if (t->n == t->max)
        return -ENOSPC;
    int si = t->free_q[t->free_head];
    t->free_head = (t->free_head + 1) % t->max;
    t->free_n--;
    route_slot *s = &t->slots[si];
    memset(s, 0, sizeof(*s));
    s->in_use = true;
    s->table = t;
    s->r.id = ++t->last_id;
    s->r.rec = *r;
    s->r.local = local;
    s->r.seen_ms = now_ms;
    s->r.rtt_known = local; /* RTT to ourselves is 0; a peer's comes with its first PING */
    slot_index_record(s);
    t->order[t->n++] = si;
    return 0;
}

bool route_region_is(const route_region *r, uint64_t id)
{
    return ((const route_slot *)r)->in_use && r->id == id;
}

void route_table_remove(route_table *t, const char *name)
{
    int i = find_index(t, name, route__hash(name));
    if (i < 0)
        return;
    int si = t->order[i];
    t->slots[si].in_use = false;
    memmove(&t->order[i], &t->order[i + 1], (size_t)(t->n - i - 1) * sizeof(*t->order));
    t->n--;
    t->free_q[(t->free_head + t->free_n) % t->max] = si;
    t->free_n++;
}

int route_table_prune(route_table *t, int64_t forget_ms, int64_t now_ms)
{
    if (!t->shared_ok || forget_ms <= 0)
        return 0;
    int n = 0;
    for (int i = 0; i < t->n;) {
        const route_region *r = &t->slots[t->order[i]].r;
        if (!r->local && now_ms - r->seen_ms > forget_ms) {
            route_table_remove(t, r->rec.name);
            n++;
        } else {
            i++;
        }
    }
    return n;
}

void route_table_set_rtt(route_table *t, const char *name, double ewma_ms, double p95_ms)
{
    route_region *r = route_table_find(t, name);
    if (!r || r->local || !isfinite(ewma_ms) || !isfinite(p95_ms) || ewma_ms < 0 || p95_ms < 0)
        return;
    r->rtt_ewma_ms = ewma_ms;
    r->rtt_p95_ms = p95_ms;
    r->rtt_known = true;
}

void route_table_set_answered(route_table *t, const char *name, int64_t answered_ms)
{
    route_region *r = route_table_find(t, name);
    if (r && !r->local && answered_ms > r->answered_ms)
        r->answered_ms = answered_ms;
}

void route_table_set_shared_ok(route_table *t, bool ok, int64_t now_ms)
{
    if (t->shared_ok && !ok)
        t->shared_lost_ms = now_ms;
    /* Back: a record current at the loss and not read since gets the age it
     * had then, so its region keeps what was left of its window for its
     * next write to reach us (judged at now, the outage would have made
     * every peer stale at once). */
    const int64_t news = route__news_ms(t);
    if (!t->shared_ok && ok && now_ms > news) {
        /* ... and at least the grace: as if seen then */
        const int64_t floor = now_ms + t->recovery_grace_ms - t->o.stale_after_ms;
        for (int i = 0; i < t->n; i++) {
            route_region *r = &t->slots[t->order[i]].r;
            if (!r->local && r->seen_ms <= news && route__fresh(t, r, news)) {
                r->seen_ms += now_ms - news;
                if (r->seen_ms < floor && !r->graced) {
                    r->seen_ms = floor;
                    r->graced = true;
                }
            }
        }
    }
    if (!t->shared_ok && ok)
        t->back_ms = now_ms;
    t->shared_ok = ok;
}

void route_table_note_full_read(route_table *t, int64_t started_ms)
{
    if (started_ms > t->read_ms)
        t->read_ms = started_ms;
}

void route_table_set_recovery_grace(route_table *t, int64_t grace_ms)
{
    t->recovery_grace_ms = grace_ms > 0 ? grace_ms : 0;
}

bool route_table_shared_ok(const route_table *t)
{
    return t->shared_ok;
}

/* ---- freshness and ejection ---- */

bool route_region_fresh(const route_table *t, const route_region *r, int64_t now_ms)
{
    return route__fresh(t, r, now_ms);
}

bool route_region_current(const route_table *t, const route_region *r, int64_t now_ms)
{
    return route__current(t, r, now_ms);
}

bool route_region_held_by_ping(const route_table *t, const route_region *r, int64_t now_ms)
{
    return !route__fresh(t, r, now_ms) && route__answers(t, r, now_ms) && route__current(t, r, now_ms);
}

bool route_region_ejected(const route_region *r, int64_t now_ms)
{
    return route__ejection_state(r, now_ms) == ROUTE__EJECTED;
}

bool route_region_take_probe(route_region *r, int64_t now_ms)
{
    route_slot *s = route__slot(r);
    if (route__ejection_state(r, now_ms) != ROUTE__PROBE)
        return false;
    r->probing = true;
    s->probe_deadline_ms = now_ms + s->table->o.probe_timeout_ms;
    s->probe_claims++;
    return true;
}

uint64_t route_region_probe_claim(const route_region *r)
{
    return route__slot((route_region *)r)->probe_claims;
}

static bool probe_is(route_region *r, uint64_t claim)
{
    route_slot *s = route__slot(r);
    return s->in_use && r->probing && s->probe_claims == claim;
}

bool route_region_claim(route_region *r, int64_t now_ms, bool *probe)
{
    int st = route__ejection_state(r, now_ms);
    *probe = st == ROUTE__PROBE && route_region_take_probe(r, now_ms);
    return st == ROUTE__USABLE || *probe;
}

void route_region_release_probe(route_region *r, uint64_t claim)
{
    if (probe_is(r, claim))
        r->probing = false;
}

static void eject(const route_table *t, route_region *r, int64_t now_ms)
{
    /* Doubling by a loop with the cap inside: 2^(ejections-1) would
     * overflow long before any sane cap stops it. */
    int64_t len = t->o.eject_base_ms > 0 ? t->o.eject_base_ms : 1;
    int64_t cap = t->o.eject_max_ms > 0 ? t->o.eject_max_ms : len;
    if (r->ejections < INT_MAX)
        r->ejections++;
    for (int i = 1; i < r->ejections && len < cap; i++)
        len *= 2;
    if (len > cap)
        len = cap;
    r->ejected_until_ms = now_ms + len;
    r->probing = false;
}

void route_region_report(route_table *t, route_region *r, bool ok, int64_t now_ms)
{
    if (!route__slot(r)->in_use)
        return; /* removed since the decision */
    if (ok) {
        r->consecutive_failures = 0;
        return;
    }
    if (r->consecutive_failures < INT_MAX)
        r->consecutive_failures++;
    if (r->ejected_until_ms == 0 && t->o.eject_after > 0 && r->consecutive_failures >= t->o.eject_after)
        eject(t, r, now_ms);
}

static void end_ejection(route_region *r)
{
    r->probing = false;
    r->ejections = 0;
    r->ejected_until_ms = 0;
}

void route_region_report_check(route_table *t, route_region *r, bool ok, int failures, int successes,
                               int64_t now_ms)
{
    if (!route__slot(r)->in_use)
        return;
    if (!ok) {
        r->check_successes = 0;
        if (r->check_failures < INT_MAX)
            r->check_failures++;
        if (!r->check_down && r->check_failures >= (failures > 0 ? failures : 1)) {
            r->check_down = true;
            eject(t, r, now_ms); /* counted and logged as any ejection */
        }
        return;
    }
    r->check_failures = 0;
    if (r->check_successes < INT_MAX)
        r->check_successes++;
    if (r->check_down && r->check_successes >= (successes > 0 ? successes : 1)) {
        r->check_down = false;
        end_ejection(r);
    }
}

void route_region_check_reset(route_region *r)
{
    if (r->check_down)
        end_ejection(r);
    r->check_down = false;
    r->check_failures = r->check_successes = 0;
}

void route_region_report_probe(route_table *t, route_region *r, bool ok, int64_t now_ms, uint64_t claim)
{
    /* counted as any outcome (while ejected, that only counts); then, if
     * the probe is still this claim's (not timed out and claimed again), it
     * decides */
    bool probing = probe_is(r, claim);
    route_region_report(t, r, ok, now_ms);
    if (!probing)
        return;
    if (ok) {
        end_ejection(r);
    } else {
        eject(t, r, now_ms);
    }
}
