/* Routing internals shared by table.c (the table) and router.c (the
 * decision): the table's slot layout with what is precomputed at upsert so
 * that route_decide compares 64-bit hashes, not strings; and the hash,
 * which sync_write.c and instance.c use for their digests too. */
#ifndef ROUTE_INTERNAL_H
#define ROUTE_INTERNAL_H

#include "routing/region.h"

#include <stddef.h>
#include <string.h>

typedef struct route_slot {
    route_region r; /* first: a route_region * is a route_slot * */
    bool in_use;
    const struct route_table *table;
    uint64_t name_hash;
    uint64_t model_hash[ROUTE_MAX_MODELS];
    uint8_t model_len[ROUTE_MAX_MODELS];
    uint64_t tag_hash[ROUTE_MAX_TAGS];
    /* One bit per model / tag hash: most regions that lack the model are
     * turned away without reading the hash arrays. */
    uint64_t model_bloom, tag_bloom;
    int64_t probe_deadline_ms; /* a claimed probe not reported by then may be claimed again */
    uint64_t probe_claims;     /* probes claimed so far: the current one's claim (route_region_probe_claim) */
    /* route_decide's scratch between its two passes. */
    double scratch_ms;
    bool scratch_ok;
    int8_t scratch_pri; /* its index in q->primary's list; -1: not listed, or not able */
} route_slot;

struct route_table {
    route_table_opts o;
    int max, n;
    route_slot *slots; /* max entries, never moved: region pointers stay valid memory */
    int *order;        /* n slot indices in insertion order (route_table_at) */
    int *free_q;       /* free slot indices, reused oldest-freed first */
    int free_head, free_n;
    bool shared_ok;         /* the shared store (Redis) is reachable: stale records leave the candidates */
    int64_t shared_lost_ms; /* when it went away: records stale then stay out */
    int64_t read_ms;        /* the last full read's start: what it read was news as of then */
    int64_t recovery_grace_ms; /* route_table_set_recovery_grace */
    int64_t back_ms;           /* when the shared store last came back (or first read in full) */
    uint64_t last_id;          /* the last route_region.id given */
    uint64_t rng;              /* route_decide's spreading (splitmix64) */
};

static inline route_slot *route__slot(route_region *r)
{
    return (route_slot *)r;
}

/* FNV-1a: short names, no allocation, good enough spread for <= a few
 * thousand names; every hash match is confirmed with strcmp. Also the
 * digests of a region's entries (sync_write.c, instance.c), which are only ever
 * compared with themselves: bytes continue a hash begun at ROUTE__FNV_SEED. */
#define ROUTE__FNV_SEED 14695981039346656037ull

static inline uint64_t route__hash_bytes(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static inline uint64_t route__hash(const char *s)
{
    return route__hash_bytes(ROUTE__FNV_SEED, s, strlen(s));
}

static inline uint64_t route__bloom_bit(uint64_t h)
{
    return 1ull << (h >> 58);
}

/* Ejection state as route_decide needs it (inline: it runs per region
 * per request). */
enum { ROUTE__USABLE, ROUTE__EJECTED, ROUTE__PROBE };

static inline int route__ejection_state(const route_region *r, int64_t now_ms)
{
    if (r->check_down) /* out until its checks pass: they are its probes */
        return ROUTE__EJECTED;
    if (r->ejected_until_ms == 0)
        return ROUTE__USABLE;
    if (now_ms < r->ejected_until_ms)
        return ROUTE__EJECTED;
    if (r->probing && now_ms < ((const route_slot *)r)->probe_deadline_ms)
        return ROUTE__EJECTED;
    return ROUTE__PROBE;
}

static inline bool route__fresh(const route_table *t, const route_region *r, int64_t now_ms)
{
    return r->local || t->o.stale_after_ms <= 0 || now_ms - r->seen_ms <= t->o.stale_after_ms;
}

/* While the shared store is away, the last time news came: the loss, or
 * a full read since (reads still come while the subscription or our own
 * writes fail). Judged at the loss alone, a region read after it and dead
 * after that stayed a candidate for as long as the store was partly away;
 * judged at now, every live peer dropped out once reads stopped too. */
static inline int64_t route__news_ms(const route_table *t)
{
    return t->read_ms > t->shared_lost_ms ? t->read_ms : t->shared_lost_ms;
}

/* Whether r answered one of our PINGs within stale_after_ms. */
static inline bool route__answers(const route_table *t, const route_region *r, int64_t now_ms)
{
    return !r->local && r->answered_ms > 0 && t->o.stale_after_ms > 0 &&
           now_ms - r->answered_ms <= t->o.stale_after_ms;
}

/* Whether the store has shown that r's record is no longer refreshed: a
 * full read began after the record went stale, and at least the recovery
 * grace after the store came back (each peer reconnects on its own
 * back-off before its next write). */
static inline bool route__shown_stale(const route_table *t, const route_region *r)
{
    return t->read_ms > r->seen_ms + t->o.stale_after_ms && t->read_ms >= t->back_ms + t->recovery_grace_ms;
}

/* A candidate as far as news goes. While the store is away, a peer we
 * PING is judged by its answers alone; one we have never heard answer, by
 * its record's age when the last news came. With the store up, by the
 * record's age, but a peer that answers our PINGs stays until the store
 * has shown its record is no longer refreshed: a frozen store is found
 * out only when a command times out, and meanwhile every record aged and
 * healthy peers were dropped for the store's silence. */
static inline bool route__current(const route_table *t, const route_region *r, int64_t now_ms)
{
    if (!t->shared_ok && r->answered_ms > 0 && !r->local)
        return route__answers(t, r, now_ms);
    if (route__fresh(t, r, t->shared_ok ? now_ms : route__news_ms(t)))
        return true;
    return route__answers(t, r, now_ms) && !route__shown_stale(t, r);
}

#endif
