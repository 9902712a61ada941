/* Active health checks (issue 32 point 4): every routing.health_check_ms
 * this gateway sends a one-token completion of its own (max_tokens 1) to
 * each peer region it may route to and to each local worker, so that one
 * that takes connections and answers PINGs and stats but fails requests
 * is ejected before a tenant's request finds it.
 *
 * A check fails on an answer other than 200 or 429 (a 429 is busy, not
 * failing: it counts neither way, nor does a stream refused unprocessed),
 * on a transport failure (a refused connect, a reset, the connection's
 * PINGs unanswered: the pool fails the check with it), and on no answer
 * within routing.health_check_timeout_ms, unless the target was plainly
 * busy meanwhile (a worker that generated tokens since the check was sent,
 * a region whose record shows a queue): a loaded target is slow, not
 * broken. health_check_failures failed checks in a row eject the target;
 * health_check_successes passed ones in a row bring it back.
 *
 * The checks feed the health state routing already keeps: a region's
 * ejection (route_region_report_check: the same ejected flag, events,
 * counters and /v1/regions row as an ejection by failed requests), a
 * worker's readiness (gw_supervisor_set_check_down: not picked, and its
 * region's record counts it out). One check at a time per target; a peer
 * region's models are checked in turn, one per check. Regions already out
 * for what their record says (stale, unhealthy, draining) are not
 * checked; nor is a worker before its first stats.
 *
 * A check is no tenant's request: it is not in the access log (a line on
 * stderr when a target starts failing, is ejected or returns), nor in
 * spend, limits or the request metrics, and the peer that serves it
 * (x-infergate-health-check over a verified peer connection) leaves it
 * out of its access log and request metrics too, counting it in
 * infergate_health_checks_served_total. It does run on the worker as one
 * small request: the worker's own EWMAs see it, deliberately (on an idle
 * worker it is the only fresh measure). Loop thread only. */
#ifndef GW_HEALTH_H
#define GW_HEALTH_H

#include <jansson.h>

#define GW_HEALTH_HEADER "x-infergate-health-check"

typedef struct gw_serve gw_serve;
typedef struct route_region route_region;

/* Allocates g->health and starts its timer (checks run while
 * routing.health_check_ms > 0, which a reload may change). 0 or -ENOMEM
 * (err filled). */
int gw_health_start(gw_serve *g, char *err, size_t err_len);
/* Cancels the checks in flight; before the pool goes. */
void gw_health_stop(gw_serve *g);
/* r's checks for /v1/regions: {"state": "passing"|"failing"|"ejected"|
 * "unchecked", "failures", "successes", "last", "age_ms", "latency_ms"};
 * JSON null while checks are off. */
json_t *gw_health_region_json(gw_serve *g, const route_region *r);

#endif
