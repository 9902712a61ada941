/* The routing decision: which regions may serve a request, in which order.
 *
 * Filters: serves the model; healthy; heartbeat fresh; not ejected (a
 * region whose ejection has run out is tried as a probe); residency allowed
 * (every tag the request needs — the tenant's residency narrowed by the
 * x-infergate-residency header — must be on the region); price at or below
 * the cap (x-infergate-max-price, the tenant's max_price): the request's
 * price per million of its tokens, (prompt tokens x price_in + expected
 * output tokens x price_out) / (prompt + output tokens), at most max_price;
 * a query that gives neither compares price_out (the cap's old meaning,
 * which this equals for a region whose two prices are the same).
 * Order: policy "latency" (default): expected latency = RTT from here +
 * the region's queueing estimate, ties to the cheaper; policy "cost":
 * cheapest region whose expected latency is within the SLO, then the rest
 * by latency (so a request still has somewhere to go). A region's price
 * for a request: its prompt tokens x price_in + its expected output tokens
 * x price_out (per million); a query that gives neither compares price_out.
 * The local region is a candidate like any other.
 *
 * Expected latency (ms), what a client waits for its first token:
 *   rtt   = 0 for the local region, else rtt_ewma_ms, or ROUTE_UNKNOWN_RTT_MS
 *           before the first PING answer (a region we never measured should
 *           not win over one we have);
 *   queue = the region's own estimate (est_ms of the model, else
 *           ttft_est_ms): what its workers' queues say a request arriving
 *           now waits for its first token; for a record without one (an
 *           older gateway's),
 *           ttft_ms + waiting * service / max(1, capacity), where
 *           service = ttft_ms + tpot_ms * ROUTE_SERVICE_TOKENS is one
 *           request's time in a slot and waiting = max(0, running + queued
 *           + 1 - capacity) the requests (this one included) that need a
 *           slot to free first: capacity slots free up every `service` ms.
 *           ttft_ms is the region's unloaded time to first token.
 * Ties: a region less than ROUTE_TIE_MS slower than the fastest candidate
 * counts as equally fast; further ones are compared in ROUTE_TIE_MS steps
 * from the fastest (a total order, so the result does not depend on table
 * order). Equal latency goes to the lower price, then the lower exact
 * latency, then the name.
 * Cost policy: regions with expected <= slo_ms (slo_ms <= 0: no bound)
 * first, by price, then exact latency, then name; then the others by
 * latency as above.
 * Spreading (q->spread): the order above is the preferred one, and every
 * request following it sent a whole fleet's traffic to one region between
 * two of its records, then all of it to the next (herding). With spread,
 * the first candidate is drawn among those near the preferred one —
 * expected latency within max(ROUTE_NEAR_FRAC x its latency, ROUTE_NEAR_MS)
 * of it, and under the cost policy the same price group — with weight
 * falling linearly from 1 (as fast as the preferred) to 0 (at the edge of
 * that window); the others follow in order. Equal regions share evenly,
 * and a region that slows loses its share gradually, not at once.
 * Stale records are left out; while the shared store is away, only those
 * stale when it went (route_table_set_shared_ok). A region whose ejection back-off is over
 * claims its probe when it comes first (d->probe); further down it stays
 * in the list unclaimed, for the request to claim (route_region_claim) if
 * it gets that far.
 * Models and residency tags are looked for by hash and confirmed byte for
 * byte.
 * route_decide allocates nothing and mutates the table only to claim a
 * probe: one table per thread (the gateway's loop). */
#ifndef ROUTE_ROUTER_H
#define ROUTE_ROUTER_H

#include "routing/region.h"

#define ROUTE_UNKNOWN_RTT_MS 50.0
#define ROUTE_SERVICE_TOKENS 128
#define ROUTE_TIE_MS 0.5
#define ROUTE_NEAR_FRAC 0.5
#define ROUTE_NEAR_MS 5.0

typedef enum route_policy { ROUTE_LATENCY = 0, ROUTE_COST = 1 } route_policy;

typedef struct route_query {
    const char *model;
    const char *const *need_tags; /* residency: all required */
    int n_need_tags;
    double max_price; /* per million of the request's tokens, as above; <= 0: no cap */
    route_policy policy;
    double slo_ms; /* cost policy: latency bound */
    int64_t now_ms; /* gw_mono_ms() */
    /* The request's size for the cost policy (and ties): 0 and 0, price_out alone. */
    int prompt_tokens, output_tokens;
    bool spread; /* draw the first candidate among the near-best (above); false: the preferred order */
} route_query;

#define ROUTE_MAX_CANDIDATES 16

typedef struct route_decision {
    int n; /* candidates in order */
    route_region *cand[ROUTE_MAX_CANDIDATES];
    uint64_t cand_id[ROUTE_MAX_CANDIDATES]; /* for route_region_is, once the decision is old */
    double expected_ms[ROUTE_MAX_CANDIDATES];
    /* For x-infergate-route and the log, about cand[0]: "latency 12.3 ms (rtt 5.1 + queue 7.2)",
     * "cost 0.40/M, 38.0 ms within slo 50", "cost: none within slo 50, latency ...", " probe"
     * appended for a probe; when n is 0: "no region: model 3, stale 0, ...". */
    char reason[160];
    bool probe; /* cand[0] is its region's probe after an ejection */
    /* The first of the preferred order (cand[0] without spreading; NULL
     * when n is 0): what "the policy prefers" means for its log line. */
    route_region *preferred;
    /* Why regions were left out (counts): */
    int out_model, out_stale, out_unhealthy, out_ejected, out_residency, out_price;
} route_decision;

/* Expected latency of a region from here, in ms, over all its models: route_rtt_ms + route_queue_ms. */
double route_expected_ms(const route_region *r);
double route_rtt_ms(const route_region *r);
double route_queue_ms(const route_region *r);
/* The queueing estimate for one model (its index in r->rec.models): from
 * that model's load where the record has it, else route_queue_ms. What
 * route_decide ranks by, with the RTT. */
double route_model_queue_ms(const route_region *r, int model);
/* Fills d; returns d->n (0: nowhere to send it; the counts say why). */
int route_decide(route_table *t, const route_query *q, route_decision *d);
/* A region's price for q, per million tokens scaled as above. */
double route_price(const route_region *r, const route_query *q);
/* Seeds the table's generator for spreading (tests; a new table is seeded
 * from its address and the clock). */
void route_table_seed(route_table *t, uint64_t seed);
/* Calls fn with each model of each region that is current, healthy and
 * has every tag in need_tags: what /v1/models lists. Ejection and price
 * are left aside (they pass); a model served by several regions comes
 * once per region. Mutates nothing. */
void route_models(const route_table *t, const char *const *need_tags, int n_need_tags, int64_t now_ms,
                  void (*fn)(void *ud, const char *model), void *ud);

/* Whether r passes q's filters on what its record says: serves q->model
 * (a peer with a ready worker, where its model_load says), has every tag q needs,
 * its price for q within q->max_price (as route_decide). For a failover to
 * a later candidate of an earlier decision: the record may have been
 * replaced since (route_table_upsert). */
bool route_region_allows(const route_region *r, const route_query *q);

#endif
