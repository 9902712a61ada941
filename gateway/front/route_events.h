/* Routing events, for operators: one line on stderr each, as
 * "infergate: event=NAME key=value ...", and a count in
 * infergate_route_events_total{event="NAME"}. The events:
 *   redis_lost (error), redis_regained (after_ms);
 *   region_joined, region_gone (left the table: silent too long);
 *   region_stale (age_ms): out of the candidates for its record's age
 *   (route_region_current), region_ejected (failures, ejections, for_ms;
 *   or failures, ejections, by=check: by its active health checks, out
 *   until they pass),
 *   region_unhealthy, region_drained (its gateway drains),
 *   region_returned (was: stale|ejected|unhealthy|drained): usable again;
 *   region_held_by_ping (age_ms, redis: ok|away): its record is stale
 *   but it answers our PINGs and Redis has shown nothing newer, so it stays
 *   a candidate; region_held_by_ping_end (by: record|stale);
 *   failover (from, to, why): a request moved on before its answer began;
 *   preferred (model, policy, tags, region, was): the region a policy
 *   ranks first for a kind of request changed.
 * The region and Redis events are seen by polling the table every
 * ~100 ms (gw_route_events_poll), so one shorter than that may go unseen
 * but for its counter (ejections are counted, not sampled). Loop thread
 * only. */
#ifndef GW_ROUTE_EVENTS_H
#define GW_ROUTE_EVENTS_H

#include "routing/router.h"

typedef struct gw_serve gw_serve;
typedef struct gw_route_events gw_route_events;

/* NULL on out of memory. */
gw_route_events *gw_route_events_new(void);
void gw_route_events_free(gw_route_events *e);
/* Compares the table and the Redis link with what the last call saw. */
void gw_route_events_poll(gw_serve *g);
/* A request that failed at from (a region's name, or "local") goes on to
 * to; why: the upstream's error kind. */
void gw_route_events_failover(gw_serve *g, const char *from, const char *to, const char *why);
/* After a decision: logs when q's kind of request (model, policy, tags)
 * now ranks another region first. preferred may be NULL (none). At most
 * one line a second for a kind; the counter counts every change. */
void gw_route_events_preferred(gw_serve *g, const route_query *q, const route_region *preferred);

#endif
