/* What `infergate serve` measures: the metric families the request path
 * counts into (declared once at start) and the per-worker gauges, read
 * from the supervisor each time /metrics is scraped. */
#include "gateway/front/serve_internal.h"

#include "gateway/front/access_log.h"
#include "routing/sync.h"

#include <errno.h>
#include <stdio.h>

static const double latency_buckets[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
static const double token_buckets[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1};
#define NB(a) ((int)(sizeof(a) / sizeof(a[0])))

int gw_serve_metrics_init(gw_metrics *m)
{
    int rc = 0;
    rc |= gw_metrics_describe(m, "infergate_requests_total", GW_COUNTER,
                              "Requests by model, tenant, status and target.", NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_request_duration_seconds", GW_HISTOGRAM,
                              "Time from request to the end of the response, at the gateway.", latency_buckets,
                              NB(latency_buckets));
    rc |= gw_metrics_describe(m, "infergate_ttft_seconds", GW_HISTOGRAM,
                              "Time to the first response byte of streamed completions, at the gateway.",
                              latency_buckets, NB(latency_buckets));
    rc |= gw_metrics_describe(m, "infergate_tpot_seconds", GW_HISTOGRAM,
                              "Mean time per output token of streamed completions, at the gateway.", token_buckets,
                              NB(token_buckets));
    rc |= gw_metrics_describe(m, "infergate_upstream_errors_total", GW_COUNTER, "Upstream failures by kind.", NULL,
                              0);
    rc |= gw_metrics_describe(
        m, "infergate_requests_incomplete_total", GW_COUNTER,
        "Answers whose status went out but not all of the answer (counted under that "
        "status in infergate_requests_total), by why: the upstream failed (its error kind), "
        "the stream carried an error event, or the client left.",
        NULL, 0);
    rc |= gw_metrics_describe(
        m, "infergate_http_refused_total", GW_COUNTER,
        "Requests the HTTP server answered itself (malformed, too large, too slow), by status; "
        "status=\"refused_stream\": HTTP/2 streams refused unanswered, to be sent again; "
        "status=\"header_timeout\": connections cut with a request head (or the HTTP/2 preface, first "
        "frame or a header block) not complete within header_timeout_ms; status=\"enhance_your_calm\": "
        "HTTP/2 connections closed for a flood (rapid reset, a header block decoding past twice the limit); "
        "status=\"min_read_rate\": HTTP/2 connections that held half conn_buffer_bytes and read them slower "
        "than min_read_rate_bytes a second.",
        NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_replays_total", GW_COUNTER,
                              "Streams whose worker or region failed mid-answer, by outcome: resumed elsewhere "
                              "from the tokens delivered (token replay), or refused (routing.replay off, "
                              "replay_max or the retry budget spent, a request that cannot be resumed).",
                              NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_hedges_total", GW_COUNTER,
                              "Hedged requests (routing.hedge), by outcome: sent (a second copy went out), "
                              "won_hedge, won_primary (the copy that answered first), failed (one copy failed "
                              "while the other was out: it went on alone), cancelled (copies reset: the loser, "
                              "or both when the client left), suppressed (due, but past routing.hedge_share).",
                              NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_health_checks_total", GW_COUNTER,
                              "Active health checks (routing.health_check_ms) by target (worker-N, "
                              "region-NAME) and outcome: ok, fail, or busy (a 429, a refused stream, a "
                              "timeout while the target was plainly busy: counted neither way).",
                              NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_health_ejections_total", GW_COUNTER,
                              "Targets ejected by their health checks (health_check_failures failed in a row).",
                              NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_health_returns_total", GW_COUNTER,
                              "Targets the health checks had ejected, back (health_check_successes passed in a "
                              "row).",
                              NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_health_checks_served_total", GW_COUNTER,
                              "Peer regions' health checks this gateway answered (kept out of the access log "
                              "and the request metrics).",
                              NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_worker_check_down", GW_GAUGE,
                              "1 for a worker its health checks ejected (not picked until they pass).", NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_spend_total", GW_COUNTER,
                              "What requests cost (the serving region's price per million input and output "
                              "tokens times their usage; 0 without a region section), by tenant, model and "
                              "region, counted where they came in.",
                              NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_tokens_total", GW_COUNTER,
                              "Tokens of the requests counted in infergate_spend_total, by kind (prompt or "
                              "completion).",
                              NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_budget_spend", GW_GAUGE,
                              "A tenant's spend this UTC day or month (period) as its budget saw it at its "
                              "last request: the fleet's figure and what this gateway has not sent yet.",
                              NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_budget", GW_GAUGE, "A tenant's budget for the period (its config).",
                              NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_energy_wh_total", GW_COUNTER,
                              "Energy estimated for the requests that came in here (Wh: the serving "
                              "worker's power draw shared among its running sequences, as the serving "
                              "region measured it), by tenant and serving region.",
                              NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_energy_unknown_tries_total", GW_COUNTER,
                              "Tries served by a region whose answer said no power rate (an older "
                              "version, no power configured, a hedge's losing copy): their energy is "
                              "not in infergate_energy_wh_total. By serving region.",
                              NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_gco2e_total", GW_COUNTER,
                              "Emissions estimated for them (gCO2e: energy x the serving region's grid "
                              "carbon intensity), by tenant and serving region.",
                              NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_workers_up", GW_GAUGE, "Workers ready to serve.", NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_worker_queue_depth", GW_GAUGE, "Requests waiting in each worker.", NULL,
                              0);
    rc |= gw_metrics_describe(m, "infergate_worker_running", GW_GAUGE, "Sequences running in each worker.", NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_worker_kv_blocks_free", GW_GAUGE, "Free KV cache blocks per worker.",
                              NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_worker_restarts_total", GW_COUNTER, "Restarts of each worker.",
                              NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_route_events_total", GW_COUNTER,
                              "Routing events, as logged (event=...): Redis lost or regained, a region "
                              "joined, gone, stale, ejected, unhealthy, drained or returned, a failover, "
                              "a change of preferred region.",
                              NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_worker_prompt_tokens_total", GW_COUNTER,
                              "Prompt tokens each worker computed (source=\"computed\") and took from its "
                              "prefix cache (source=\"cached\") since it started.",
                              NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_worker_prefix_cache_hit_ratio", GW_GAUGE,
                              "Of the prompt tokens each worker was given since it started, the share its "
                              "prefix cache held.",
                              NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_worker_kv_blocks_cached", GW_GAUGE,
                              "KV blocks in each worker's prefix cache (in use or evictable).", NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_worker_tenant_weight", GW_GAUGE,
                              "Each tenant's weight in each worker's fair share, as its last request "
                              "brought it.",
                              NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_worker_tenant_running", GW_GAUGE,
                              "Sequence slots each tenant holds in each worker.", NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_worker_tenant_queued", GW_GAUGE,
                              "Requests of each tenant waiting in each worker.", NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_worker_tenant_tokens_total", GW_COUNTER,
                              "Tokens each worker computed for each tenant (prompt and generated, what "
                              "its fair share charges: a recompute is not counted again), since the "
                              "worker started.",
                              NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_worker_tenant_preemptions_total", GW_COUNTER,
                              "Requests of each tenant that gave their slot to another tenant's (fair "
                              "share), since the worker started.",
                              NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_worker_tenants_folded", GW_GAUGE,
                              "Tenants each worker counts under tenant \"(other)\" now: past the 64 it "
                              "keeps figures for, none of them idle.",
                              NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_worker_tenant_pushed_out_total", GW_COUNTER,
                              "Requests of each tenant that gave their place in a worker's full queue to "
                              "another tenant's (answered 429), since the worker started.",
                              NULL, 0);
    rc |= gw_metrics_describe(
        m, "infergate_access_log_dropped_total", GW_COUNTER,
        "Access log lines dropped: its reader fell a megabyte behind, or a write failed.", NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_region_records_refused_total", GW_COUNTER,
                              "Reads of region records and price overrides from Redis that no fleet key "
                              "proved (redis.record_keys), ignored.",
                              NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_peer_identity_refused_total", GW_COUNTER,
                              "Connections refused for their peer's identity: a region's certificate that "
                              "does not name it, a worker socket served by another process.",
                              NULL, 0);
    return rc ? -ENOMEM : 0;
}

static void worker_prefix_metrics(gw_metrics *m, const char *labels, const gw_worker_info *w)
{
    char l[400];
    const double all = w->prompt_tokens_computed + w->prompt_tokens_cached;
    snprintf(l, sizeof(l), "%s,source=\"computed\"", labels);
    gw_metrics_count_to(m, "infergate_worker_prompt_tokens_total", l, w->prompt_tokens_computed);
    snprintf(l, sizeof(l), "%s,source=\"cached\"", labels);
    gw_metrics_count_to(m, "infergate_worker_prompt_tokens_total", l, w->prompt_tokens_cached);
    gw_metrics_set(m, "infergate_worker_prefix_cache_hit_ratio", labels, all > 0 ? w->prompt_tokens_cached / all : 0);
    gw_metrics_set(m, "infergate_worker_kv_blocks_cached", labels, w->kv_blocks_cached);
}

/* Each tenant's share of the worker (runtime/sched.h). */
static void worker_tenant_metrics(gw_metrics *m, const char *labels, const gw_worker_info *w)
{
    int folded = 0;
    for (int k = 0; k < w->n_tenants; k++)
        folded += w->tenants[k].folded;
    gw_metrics_set(m, "infergate_worker_tenants_folded", labels, folded);
    for (int k = 0; k < w->n_tenants; k++) {
        const gw_worker_tenant *t = &w->tenants[k];
        char name[2 * sizeof(t->name)], l[600];
        gw_metrics_escape(t->name[0] ? t->name : "-", name, sizeof(name));
        snprintf(l, sizeof(l), "%s,tenant=\"%s\"", labels, name);
        gw_metrics_set(m, "infergate_worker_tenant_weight", l, t->weight);
        gw_metrics_set(m, "infergate_worker_tenant_running", l, t->running);
        gw_metrics_set(m, "infergate_worker_tenant_queued", l, t->queued);
        gw_metrics_count_to(m, "infergate_worker_tenant_tokens_total", l, t->tokens);
        gw_metrics_count_to(m, "infergate_worker_tenant_preemptions_total", l, t->preempted);
        gw_metrics_count_to(m, "infergate_worker_tenant_pushed_out_total", l, t->pushed_out);
    }
}

void gw_serve_metrics_workers(gw_serve *g)
{
    gw_metrics *m = g->metrics;
    gw_metrics_set(m, "infergate_workers_up", "", gw_supervisor_ready_count(g->sup));
    gw_metrics_clear(m, "infergate_worker_queue_depth");
    gw_metrics_clear(m, "infergate_worker_running");
    gw_metrics_clear(m, "infergate_worker_kv_blocks_free");
    gw_metrics_clear(m, "infergate_worker_prefix_cache_hit_ratio");
    gw_metrics_clear(m, "infergate_worker_kv_blocks_cached");
    gw_metrics_clear(m, "infergate_worker_tenant_weight");
    gw_metrics_clear(m, "infergate_worker_tenant_running");
    gw_metrics_clear(m, "infergate_worker_tenant_queued");
    gw_metrics_clear(m, "infergate_worker_tenants_folded");
    for (int i = 0; i < gw_supervisor_count(g->sup); i++) {
        const gw_worker_info *w = gw_supervisor_worker(g->sup, i);
        char model[128], device[128], labels[320];
        gw_metrics_escape(w->model, model, sizeof(model));
        gw_metrics_escape(w->device, device, sizeof(device));
        snprintf(labels, sizeof(labels), "worker=\"%d\",model=\"%s\",device=\"%s\"", i, model, device);
        gw_metrics_set(m, "infergate_worker_queue_depth", labels, w->ready ? w->queued : 0);
        gw_metrics_set(m, "infergate_worker_running", labels, w->ready ? w->running : 0);
        /* Not ready, its cache is not known: no series, rather than a 0
         * that reads as a full cache. */
        if (w->ready) {
            gw_metrics_set(m, "infergate_worker_kv_blocks_free", labels, w->kv_blocks_free);
            worker_prefix_metrics(m, labels, w);
            worker_tenant_metrics(m, labels, w);
        }
        gw_metrics_count_to(m, "infergate_worker_restarts_total", labels, w->restarts);
        gw_metrics_set(m, "infergate_worker_check_down", labels, w->check_down);
    }
    if (g->alog)
        gw_metrics_count_to(m, "infergate_access_log_dropped_total", "", (double)gw_alog_dropped(g->alog));
    if (g->sync)
        gw_metrics_count_to(m, "infergate_region_records_refused_total", "",
                            (double)route_sync_auth_refused(g->sync, NULL));
    gw_metrics_count_to(m, "infergate_peer_identity_refused_total", "",
                        (double)gw_upstream_peer_refused(g->pool, NULL));
}
