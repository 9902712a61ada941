/* The routing decision: which regions may serve a request, in which order.
 *
 * Filters: serves the model; healthy; heartbeat fresh; not ejected (a
 * region whose ejection has run out is tried as a probe); residency allowed
 * (every tag the request needs — the tenant's residency narrowed by the
 * x-infergate-residency header — must be on the region); price at or below
 * the cap (x-infergate-max-price, per million output tokens).
 * Order: policy "latency" (default): expected latency = RTT from here +
 * the region's queueing estimate, ties to the cheaper; policy "cost":
 * cheapest region whose expected latency is within the SLO, then the rest
 * by latency (so a request still has somewhere to go).
 * The local region is a candidate like any other. */
#ifndef ROUTE_ROUTER_H
#define ROUTE_ROUTER_H

#include "routing/region.h"

typedef enum route_policy { ROUTE_LATENCY = 0, ROUTE_COST = 1 } route_policy;

typedef struct route_query {
    const char *model;
    const char *const *need_tags; /* residency: all required */
    int n_need_tags;
    double max_price; /* <= 0: no cap */
    route_policy policy;
    double slo_ms; /* cost policy: latency bound */
    int64_t now_ms;
} route_query;

#define ROUTE_MAX_CANDIDATES 16

typedef struct route_decision {
    int n;                                  /* candidates in order */
    route_region *cand[ROUTE_MAX_CANDIDATES];
    double expected_ms[ROUTE_MAX_CANDIDATES];
    char reason[160]; /* for x-infergate-route and the log: "latency:12.3ms" / "cost:0.40/M within 50ms" */
    /* Why regions were left out (counts): */
    int out_model, out_stale, out_unhealthy, out_ejected, out_residency, out_price;
} route_decision;

/* Expected latency of a region from here, in ms. */
double route_expected_ms(const route_region *r);
/* Fills d; returns d->n (0: nowhere to send it; the counts say why). */
int route_decide(route_table *t, const route_query *q, route_decision *d);

#endif
