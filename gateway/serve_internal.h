/* State of `infergate serve` shared by serve.c (lifecycle: config, signals,
 * workers, drain) and proxy.c (one client request: auth, limits, the
 * worker choice, the upstream stream, access log and metrics). */
#ifndef GW_SERVE_INTERNAL_H
#define GW_SERVE_INTERNAL_H

#include "gateway/config.h"
#include "gateway/http.h"
#include "gateway/metrics.h"
#include "gateway/supervisor.h"
#include "gateway/tenant.h"
#include "gateway/upstream.h"

#include <stdio.h>

struct event;

typedef struct gw_serve {
    struct event_base *base;
    gw_config *cfg;      /* as started: listeners and workers */
    gw_config *reloaded; /* the last SIGHUP's config: tenants refer to it */
    gw_http_server *http;
    gw_upstream_pool *pool;
    gw_supervisor *sup;
    gw_tenants *tenants;
    gw_metrics *metrics;
    FILE *access_log;
    bool own_access_log;
    struct event *sigterm, *sigint, *sighup, *drain_timer, *metrics_timer;
    bool draining;
    double drain_deadline;
    uint64_t next_request;
} gw_serve;

/* gw_http_handler callbacks of the front door (proxy.c). */
void gw_proxy_on_request(void *ud, gw_http_stream *s, const gw_http_request *req);
void gw_proxy_on_close(void *ud, gw_http_stream *s, void *stream_ud, bool finished);
void gw_proxy_on_writable(void *ud, gw_http_stream *s, void *stream_ud);
/* Declares the metric families (once at start). */
int gw_proxy_metrics_init(gw_metrics *m);
/* Refreshes the per-worker gauges from the supervisor. */
void gw_proxy_metrics_workers(gw_serve *g);

#endif
