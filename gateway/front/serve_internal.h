/* State of `infergate serve` shared by serve.c (lifecycle: config, signals,
 * workers, drain), reload.c (SIGHUP), regions.c (cross-region routing),
 * serve_metrics.c and the request path (request_internal.h: auth, limits,
 * the worker or region choice, the upstream stream, access log and
 * metrics). */
#ifndef GW_SERVE_INTERNAL_H
#define GW_SERVE_INTERNAL_H

#include "gateway/config/config.h"
#include "gateway/base/clock.h"
#include "gateway/http/http.h"
#include "gateway/front/metrics.h"
#include "gateway/supervisor/supervisor.h"
#include "gateway/front/tenant.h"
#include "gateway/upstream/upstream.h"

#include <stdio.h>

struct event;
typedef struct route_table route_table;
typedef struct route_sync route_sync;
typedef struct route_region route_region;
typedef struct gw_placement gw_placement;

/* Retries a gateway may make before its budget has saved any: a budget
 * that started at 0 failed over none of the first requests after a start
 * (four of them at the default 0.2), as Envoy's min_retry_concurrency
 * avoids. */
#define GW_RETRY_TOKENS_START 3

typedef struct gw_serve {
    struct event_base *base;
    gw_config *cfg;      /* as started: listeners and workers */
    gw_config *reloaded; /* the last SIGHUP's config: tenants refer to it */
    gw_http_server *http;
    gw_upstream_pool *pool;
    gw_supervisor *sup;
    gw_tenants *tenants;
    gw_metrics *metrics;
    struct gw_alog *alog; /* NULL: logging off */
    bool own_access_log;  /* a file, opened again on SIGHUP */
    struct event *sigterm, *sigint, *sighup, *sigusr1, *drain_timer, *metrics_timer;
    route_table *table; /* NULL without a region section: local workers only */
    route_sync *sync;   /* NULL without Redis */
    struct gw_spend *spend; /* spend and budgets (front/spend.h) */
    struct event *heartbeat, *rtt_timer;
    struct gw_route_events *events; /* with a table: routing events logged (route_events.h) */
    struct gw_placement *placement; /* policies by intent, carbon, energy (placement.h) */
    double est_bias_ms; /* gw_regions_note_ttft: measured TTFT - the workers' estimate, as a median */
    double est_err_ms[15]; /* its last samples (a ring; est_err_n of them so far): the bias is their median */
    unsigned est_err_n;
    unsigned long long fd_limit; /* the open-file limit, raised at start (0: unknown) */
    double retry_tokens; /* retry budget: each request adds routing.retry_budget, a retry takes 1;
                          * starts at GW_RETRY_TOKENS_START where the budget is not 0 */
    bool draining;
    double drain_deadline;
    const char *listen_override; /* --listen: replaces the first listener's address, reloads too */
    uint32_t up_window;          /* the upstream stream window, fixed at start */
    uint64_t next_request;
    long started; /* epoch s: the "created" of the models it lists */
    unsigned long long auth_refused_said; /* of route_sync_auth_refused: said on stderr */
} gw_serve;

/* gw_http_handler callbacks of the front door: endpoints.c (on_request,
 * on_head), request_end.c (on_refused, on_close), relay.c (on_writable). */
void gw_front_on_request(void *ud, gw_http_stream *s, const gw_http_request *req);
void gw_front_on_head(void *ud, gw_http_stream *s, const gw_http_request *req);
void gw_front_on_refused(void *ud, int status, const char *method, const char *path, const char *protocol);
void gw_front_on_close(void *ud, gw_http_stream *s, void *stream_ud, bool finished);
void gw_front_on_writable(void *ud, gw_http_stream *s, void *stream_ud);
/* reload.c: SIGHUP. Tenants, keys, limits, the routing policy, timeouts,
 * the drain grace and TLS certificates change; the rest stays as started
 * (said when it differs). A config that does not load changes nothing. */
void gw_serve_reload(gw_serve *g);
/* A tenant's config as last loaded (a reload's, else the start's); NULL
 * when no tenant has that name. */
const gw_tenant_cfg *gw_serve_tenant_cfg(const gw_serve *g, const char *name);
/* serve.c: the HTTP server's limits from config c (the file limit may cut
 * max_connections; said is whether that was said already, at start). */
void gw_serve_http_limits(const gw_serve *g, const gw_config *c, bool said, gw_http_limits *l);
/* The upstream stream window at which every stream of a client connection
 * (max_concurrent_streams) may have its window on the way and still fit in
 * half of conn_buffer_bytes; at least 1 KiB. */
size_t gw_serve_conn_window(const gw_limits_cfg *l);
/* regions.c: cross-region routing state. */
int gw_regions_start(gw_serve *g, char *err, size_t err_len);
void gw_regions_stop(gw_serve *g);
/* Publishes this region's record now (a drain begun: peers must stop
 * sending before the listeners close, not a TTL later). */
void gw_regions_publish(gw_serve *g);
/* Drains (serve.c): the region's record says unhealthy at once (peers
 * route elsewhere), no new connections or streams, the open ones finish
 * within grace_s, then the gateway and its workers stop. `why` is for the
 * log. Nothing when already draining. */
void gw_serve_drain(gw_serve *g, int grace_s, const char *why);
bool gw_regions_enabled(const gw_serve *g);
/* Where a region is reached (its record's endpoint, or the config's peers
 * entry), and that as an upstream target: a tls: one names the region its
 * certificate must carry ("tls:NAME@HOST:PORT", in buf of GW_TARGET_MAX). */
#define GW_TARGET_MAX 256
const char *gw_regions_endpoint(const gw_serve *g, const route_region *r);
const char *gw_regions_target(const gw_serve *g, const route_region *r, char *buf, size_t len);
/* A reload: the fleet keys of c (a rotation) from now on. */
void gw_regions_reload(gw_serve *g, const gw_config *c);
char *gw_regions_json(gw_serve *g, size_t *len);
/* A streamed request served here got its first token measured_ms after it
 * was sent to a worker idle as last seen whose estimate then said est_ms:
 * what the estimate leaves out (the hops, tokenizing) is learnt (the
 * median of the last 15 such errors) and added to the one this region
 * publishes. */
void gw_regions_note_ttft(gw_serve *g, double est_ms, double measured_ms);
char *gw_regions_dashboard(gw_serve *g, size_t *len);

/* serve_metrics.c: declares the metric families (once at start); 0 or
 * -ENOMEM. */
int gw_serve_metrics_init(gw_metrics *m);
/* Refreshes the per-worker gauges from the supervisor. */
void gw_serve_metrics_workers(gw_serve *g);

#endif
