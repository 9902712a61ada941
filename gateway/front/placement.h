/* Placement by intent, the front door's side (issue 31): which policy a
 * request is routed by and who chose it (x-infergate-policy where its
 * tenant allows, else the tenant's, else the fleet's), the primary
 * policy's hysteresis states (one per list: the fleet's, each tenant's
 * own), a ring of the last decisions for /v1/regions, this region's grid
 * carbon intensity (region.carbon, or polled from region.carbon_source),
 * and each request's energy and gCO2e estimate. Loop thread only. */
#ifndef GW_PLACEMENT_H
#define GW_PLACEMENT_H

#include "gateway/front/request_internal.h"

#include <jansson.h>

/* A carbon_source's file, or its HTTP answer with the headers, at most. */
#define GW_CARBON_BODY_MAX 4096

/* The decisions /v1/regions explains. */
#define GW_PLACEMENT_RING 32

/* Allocates g->placement and starts polling carbon_source (the first poll
 * now). 0 or -ENOMEM (err filled). */
int gw_placement_start(gw_serve *g, char *err, size_t err_len);
void gw_placement_stop(gw_serve *g);
/* Fills q->policy and q->primary for request p of tenant tc (NULL: no
 * tenants), from x-infergate-policy, the tenant or routing.policy. false
 * when the request was answered instead: 400 for a value that is no
 * policy, 403 for one its tenant does not allow (allow_policies). */
bool gw_placement_policy(gw_front_req *p, const gw_tenant_cfg *tc, route_query *q);
/* After route_decide: appends the intent ("; intent carbon (header)") to
 * the decision's reason, which x-infergate-route and the access log carry,
 * and keeps the decision in the ring. */
void gw_placement_decided(gw_front_req *p, const route_query *q);
/* {"decisions": [...newest first], "primary": [{list, current, spilled, switches}], "carbon": {...}}. */
json_t *gw_placement_json(gw_serve *g);
/* This region's intensity as configured or last polled (gCO2e/kWh; 0: not
 * given); `region set-carbon` overrides it in the record (routing/sync.h). */
double gw_placement_carbon(const gw_serve *g);
/* The intensity of the region that served p (the routing table's record,
 * the override included), 0 when not known. */
double gw_placement_region_carbon(const gw_serve *g, const char *region);
/* A carbon_source's answer: the file's bytes, or with http the whole
 * HTTP/1.x answer (status 200 and a body). The body is one decimal number
 * from 0 to ROUTE_MAX_CARBON with blanks around it; *out set when it is.
 * NULL when taken, else why not (for the log). buf need not be
 * NUL-terminated; at most GW_CARBON_BODY_MAX bytes are taken. */
const char *gw_carbon_parse(const char *buf, size_t n, bool http, double *out);
/* A region (p->remote, else this one) answered p 429: the primary policy
 * spills from it for primary_hold_ms. */
void gw_placement_note_busy(gw_front_req *p);
/* A request's energy said by a peer, at most (Wh); a request's power
 * share said by a peer, at most (W). */
#define GW_ENERGY_MAX_WH 1e6
#define GW_POWER_MAX_W 1e6
/* Energy is counted per try, at the gateway the request came in to, each
 * try's share under the region that served it (infergate_energy_wh_total,
 * infergate_gco2e_total, spend's Redis rows) and the sum in p->energy_wh
 * and p->gco2e (the access log). A local worker's try: its power shared
 * among the sequences it runs x the try's time, at this region's
 * intensity. A region's try: what its answer's x-infergate-energy trailer
 * says; a try that ends without one (its stream cut by an error event, the
 * region dead mid-stream, replayed elsewhere, the client gone and the
 * stream reset) is the rate its answer's x-infergate-power header said x
 * the try's time here. Nothing is counted for a forwarded request: its
 * origin counts it.
 *
 * gw_placement_try_begin: p's try was sent at p->t_sent (its target set
 * in p); the one before, if still open, ends first. gw_placement_try_end: p's
 * try ends now and is counted (nothing when none is open). */
void gw_placement_try_begin(gw_front_req *p);
void gw_placement_try_end(gw_front_req *p);
/* A try beside p's own ends now (a hedge's copy that lost, failed or was
 * let go: hedge.c loads its target into p first) and is counted as
 * gw_placement_try_end counts one, from p->t_sent; p's own try stays open.
 * A region's try that said no rate (a hedge's copy answers only whole, so
 * a losing one never does; a region of an older version, or with no power
 * configured) cannot be counted: infergate_energy_unknown_tries_total
 * counts those, by region. */
void gw_placement_try_aside(gw_front_req *p);
/* At the request's end: its open try ends (gw_placement_try_end). */
void gw_placement_energy(gw_front_req *p);
/* A forwarded request served here, at its end: its energy as the
 * x-infergate-energy trailer's value, "WH GCO2E" (into buf, n bytes). 0,
 * or -1 when not known (no power figure, not served by a local worker). */
int gw_placement_energy_trailer(gw_front_req *p, char *buf, size_t n);
/* A forwarded request served here, as its answer starts: the rate of its
 * energy as x-infergate-power's value, "WATTS GCO2E_PER_KWH" (its worker's
 * draw shared among the sequences it runs, this region's intensity), which
 * the origin counts by when no trailer comes. 0, or -1 when not known. */
int gw_placement_power_header(gw_front_req *p, char *buf, size_t n);
/* The trailers of a region's answer to p's open try: its
 * x-infergate-energy is that try's energy (a malformed one is logged and
 * left out). */
void gw_placement_energy_said(gw_front_req *p, const gw_http_header *hs, size_t n);
/* The headers of a region's answer to p's open try: its x-infergate-power
 * (a malformed one is logged and left out). */
void gw_placement_power_said(gw_front_req *p, const gw_http_header *hs, size_t n);
/* x-infergate-energy's value: two decimal numbers and one space between,
 * Wh (0 to GW_ENERGY_MAX_WH) and gCO2e (0 to that at ROUTE_MAX_CARBON).
 * NULL when taken, else why not. */
const char *gw_energy_parse(const char *v, double *wh, double *gco2e);
/* x-infergate-power's value: two decimal numbers and one space between,
 * W (0 to GW_POWER_MAX_W) and gCO2e/kWh (0 to ROUTE_MAX_CARBON). NULL
 * when taken, else why not. */
const char *gw_power_parse(const char *v, double *watts, double *carbon);

#endif
