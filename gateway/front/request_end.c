/* The end of a request: its line in the access log, its metrics, the
 * settling of its tenant's token charge, and its memory; and the line and
 * count of a request the HTTP server refused before it became one. */
#include "gateway/front/placement.h"
#include "gateway/front/request_internal.h"

#include "gateway/front/access_log.h"
#include "gateway/base/mem.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A JSON string of client-given bytes: as they are when they are UTF-8,
 * else with each byte past ASCII written \xHH (what was sent stays
 * readable in the log). NULL only on out of memory. */
static json_t *json_text(const char *v, size_t len)
{
    json_t *s = json_stringn(v, len);
    if (s || len > SIZE_MAX / 4)
        return s;
    char *esc = malloc(4 * len + 1), *o = esc;
    if (!esc)
        return NULL;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)v[i];
        if (c < 0x80)
            *o++ = (char)c;
        else
            o += sprintf(o, "\\x%02X", c);
    }
    s = json_stringn(esc, (size_t)(o - esc));
    free(esc);
    return s;
}

static void json_field_strn(FILE *f, const char *k, const char *v, size_t len)
{
    json_t *s = json_text(v ? v : "", v ? len : 0);
    char *e = s ? json_dumps(s, JSON_ENCODE_ANY) : NULL;
    fprintf(f, ",\"%s\":%s", k, e ? e : "\"\"");
    free(e);
    json_decref(s);
}

static void json_field_str(FILE *f, const char *k, const char *v)
{
    json_field_strn(f, k, v, v ? strlen(v) : 0);
}

/* x-infergate-route and the log's route: the decision's reason is about
 * its first choice; a request that failed over, or whose hedged copy
 * answered first, says so, or the header described one region and
 * x-infergate-region named another. */
const char *gw_front_route_said(const gw_front_req *p, char *buf, size_t n)
{
    if (!p->route.n)
        return "";
    if (p->cand <= 1)
        return p->route.reason;
    const char *hedge = gw_front_hedge_said(p);
    snprintf(buf, n, "%s candidate %d of %d; first choice %.63s: %.159s",
             hedge && !strcmp(hedge, "won_hedge") ? "hedged copy to" : "failover to", p->cand, p->route.n,
             p->route.cand[0]->rec.name, p->route.reason);
    return buf;
}

/* The path, but for the secrets a query string may carry (the dashboard's
 * ?key=, a client's ?api_key=...: gw_alog_redact_path). Out of memory, the
 * path without its query. */
static void json_field_path(FILE *f, const char *path)
{
    char *red = gw_alog_redact_path(path);
    if (red)
        json_field_str(f, "path", red);
    else
        json_field_strn(f, "path", path, strcspn(path, "?"));
    free(red);
}

/* The label lists of the last request that finished: requests that follow
 * each other mostly share model, tenant, status and target, and escaping
 * and formatting them anew cost more than the rest of the bookkeeping. */
static struct {
    bool valid;
    int status;
    char model[GW_BODY_MODEL_MAX], tenant[GW_TENANT_NAME_MAX + 1], target[96];
    char labels[512];       /* model, tenant, status, target */
    char model_labels[180]; /* model only */
} last_labels;

/* The model label is a model some worker or region was asked for: the
 * names a client makes up (answered 404 or 403 here) would each start a
 * series of their own, until the metrics' bound refused real ones. */
static void request_labels(const gw_front_req *p, const char *target, const char *out[2])
{
    const char *m = p->worker >= 0 || p->remote ? p->model : "";
    /* A forwarded request's tenant is the peer's word: one this gateway
     * does not know starts no series of its own. */
    const char *tn = p->forwarded && !gw_tenants_find(p->g->tenants, p->tenant) ? "" : p->tenant;
    if (!last_labels.valid || last_labels.status != p->status || strcmp(last_labels.model, m) ||
        strcmp(last_labels.tenant, tn) || strcmp(last_labels.target, target)) {
        char model[160], tenant[2 * GW_TENANT_NAME_MAX + 1];
        gw_metrics_escape(m[0] ? m : "-", model, sizeof(model));
        gw_metrics_escape(tn[0] ? tn : "-", tenant, sizeof(tenant));
        snprintf(last_labels.labels, sizeof(last_labels.labels),
                 "model=\"%s\",tenant=\"%s\",status=\"%d\",target=\"%s\"", model, tenant, p->status, target);
        snprintf(last_labels.model_labels, sizeof(last_labels.model_labels), "model=\"%s\"", model);
        last_labels.status = p->status;
        snprintf(last_labels.model, sizeof(last_labels.model), "%s", m);
        snprintf(last_labels.tenant, sizeof(last_labels.tenant), "%s", tn);
        snprintf(last_labels.target, sizeof(last_labels.target), "%s", target);
        last_labels.valid = true;
    }
    out[0] = last_labels.labels;
    out[1] = last_labels.model_labels;
}

/* "worker-N", "region-NAME" or "-"; buf holds at least 20 bytes. */
static void target_name(const gw_front_req *p, char *buf, size_t cap)
{
    if (p->remote) {
        snprintf(buf, cap, "region-%s", p->region);
    } else if (p->worker >= 0) {
        memcpy(buf, "worker-", 7);
        *gw_front_put_int(buf + 7, p->worker) = '\0';
    } else {
        snprintf(buf, cap, "-");
    }
}

static void finish_log(gw_front_req *p, bool complete)
{
    if (p->logged)
        return;
    p->logged = true;
    gw_serve *g = p->g;
    if (p->health_check) { /* a peer's check: no tenant's request, out of the log and request figures */
        gw_metrics_add(g->metrics, "infergate_health_checks_served_total", "", 1);
        return;
    }
    double now = gw_mono_s(), dur = now - p->t_start;
    double ttft = p->t_first > 0 ? p->t_first - p->t_start : -1;
    /* Without a usage object, tokens are counted in events: one each but
     * the last of a whole stream (the finish_reason) and a chat stream's
     * first (the role). */
    int bare = complete + gw_front_path_is(p->req, "/v1/chat/completions");
    int tokens =
        p->usage.tokens >= 0 ? p->usage.tokens : (p->sse && p->events >= bare ? p->events - bare : -1);
    /* tokens, not events: a usage chunk (include_usage) is one event more */
    double tpot = p->sse && tokens > 1 ? (p->t_last - p->t_first) / (tokens - 1) : -1;
    char target[96];
    target_name(p, target, sizeof(target));
    gw_placement_energy(p);
    gw_front_spend_count(p, tokens);

    /* A line is queued whole at the fflush, and written by the log's
     * thread (gateway/front/access_log.h). */
    FILE *f = g->alog ? gw_alog_file(g->alog) : NULL;
    if (f) {
        fprintf(f, "{\"ts\":%ld", (long)time(NULL));
        json_field_str(f, "request_id", p->id);
        json_field_str(f, "method", p->req->method);
        json_field_path(f, p->req->path);
        json_field_str(f, "protocol", p->req->protocol);
        json_field_str(f, "tenant", p->tenant);
        json_field_str(f, "model", p->model);
        json_field_str(f, "target", target);
        json_field_str(f, "region", p->region);
        char route[320];
        json_field_str(f, "route", gw_front_route_said(p, route, sizeof(route)));
        fprintf(f, ",\"status\":%d,\"bytes\":%zu,\"ttft_ms\":%.3f,\"duration_ms\":%.3f,\"tokens\":%d,\"tries\":%d",
                p->status, p->bytes_out, ttft >= 0 ? ttft * 1e3 : -1.0, dur * 1e3, tokens, p->tries);
        if (p->spend_counted)
            fprintf(f, ",\"cost\":%.9g", p->cost);
        if (p->intent_policy) {
            json_field_str(f, "policy", p->intent_policy);
            json_field_str(f, "intent", p->intent_source);
        }
        if (p->energy_wh > 0)
            fprintf(f, ",\"energy_wh\":%.6g,\"gco2e\":%.6g", p->energy_wh, p->gco2e);
        if (p->error_kind)
            json_field_str(f, "upstream_error", p->error_kind);
        if (gw_front_hedge_said(p))
            json_field_str(f, "hedge", gw_front_hedge_said(p));
        if (p->responded)
            fprintf(f, ",\"complete\":%s", complete ? "true" : "false");
        fputs("}\n", f);
        fflush(f);
    }

    const char *labels[2];
    request_labels(p, target, labels);
    gw_metrics_add(g->metrics, "infergate_requests_total", labels[0], 1);
    if (p->model[0] && (p->worker >= 0 || p->remote)) {
        gw_metrics_observe(g->metrics, "infergate_request_duration_seconds", labels[1], dur);
        if (p->sse && ttft >= 0)
            gw_metrics_observe(g->metrics, "infergate_ttft_seconds", labels[1], ttft);
        if (tpot >= 0)
            gw_metrics_observe(g->metrics, "infergate_tpot_seconds", labels[1], tpot);
    }
    gw_front_limit_settle(p, now, tokens);
}

static void req_free(gw_front_req *p)
{
    gw_mem_free(p->hold);
    gw_front_replay_free(p);
    gw_front_hedge_free(p);
    gw_mem_free(p);
}

/* A request the HTTP server answered itself (malformed, too large, too
 * slow), an HTTP/2 stream it refused unanswered (status 0), or a
 * connection it cut (GW_HTTP_CUT_*: logged with status 0 and why). */
void gw_front_on_refused(void *ud, int status, const char *method, const char *path, const char *protocol)
{
    gw_serve *g = ud;
    const char *cut = status == GW_HTTP_CUT_HEADER_TIMEOUT ? "header_timeout"
                      : status == GW_HTTP_CUT_CALM         ? "enhance_your_calm"
                      : status == GW_HTTP_CUT_SLOW         ? "min_read_rate"
                                                           : NULL;
    const char *h2_error = status == 0                                               ? "REFUSED_STREAM"
                           : status == GW_HTTP_CUT_CALM || status == GW_HTTP_CUT_SLOW ? "ENHANCE_YOUR_CALM"
                                                                                      : NULL;
    char labels[32];
    if (status > 0)
        snprintf(labels, sizeof(labels), "status=\"%d\"", status);
    else
        snprintf(labels, sizeof(labels), "status=\"%s\"", cut ? cut : "refused_stream");
    gw_metrics_add(g->metrics, "infergate_http_refused_total", labels, 1);
    FILE *f = g->alog ? gw_alog_file(g->alog) : NULL;
    if (!f)
        return;
    fprintf(f, "{\"ts\":%ld", (long)time(NULL));
    json_field_str(f, "method", method ? method : "");
    json_field_path(f, path ? path : "");
    json_field_str(f, "protocol", protocol ? protocol : "");
    fprintf(f, ",\"status\":%d,\"refused_by\":\"http\"", status > 0 ? status : 0);
    if (cut)
        json_field_str(f, "cut", cut);
    if (h2_error)
        json_field_str(f, "h2_error", h2_error);
    fputs("}\n", f);
    fflush(f);
}

/* The stream is gone, answered whole or not: the upstream is let go, and
 * the request logged, counted and freed. */
void gw_front_on_close(void *ud, gw_http_stream *s, void *stream_ud, bool finished)
{
    gw_front_req *p = stream_ud;
    if (!p)
        return;
    p->stream = NULL;
    gw_front_limit_cancel(p);
    gw_front_budget_cancel(p);
    if (p->up) {
        /* The client went away: the worker stops generating for it. */
        gw_upstream_cancel(p->up);
        p->up = NULL;
        if (!p->status || p->responded)
            p->error_kind = "client_closed";
    }
    gw_front_hedge_stop(p);
    /* A probe the client left before its answer says nothing of the
     * region: the next request probes, now rather than after
     * probe_timeout_ms. */
    gw_front_probe_give_back(p);
    if (!finished && !p->status)
        p->status = 499;
    /* The status went out, so it is what is counted; whether the answer
     * did too is said beside it (a cut stream logged as a plain 200). */
    bool complete = finished && !p->cut && !p->sse_error;
    if (p->responded && !complete) {
        char labels[64];
        snprintf(labels, sizeof(labels), "reason=\"%s\"",
                 p->cut         ? p->error_kind
                 : p->sse_error ? "stream_error"
                                : "client_closed");
        gw_metrics_add(p->g->metrics, "infergate_requests_incomplete_total", labels, 1);
    }
    finish_log(p, complete);
    req_free(p);
}
