/* The front door's request path: auth and limits, the few body fields
 * routing needs (model, stream, max_tokens), the least-loaded ready worker,
 * and the response streamed back chunk by chunk. The body goes to the
 * worker unchanged. Response data is acknowledged upstream only once the
 * client side has room for it, so a slow client holds back its upstream
 * stream instead of filling a buffer here. */
#include "gateway/front/serve_internal.h"
#include "gateway/base/clock.h"

#include "gateway/front/access_log.h"
#include "gateway/front/body_fields.h"
#include "gateway/base/mem.h"

#include "routing/router.h"
#include "routing/sync.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define MAX_TRIES 2          /* local workers: a failure before the first response byte is retried once */
#define RETRY_TOKENS_MAX 100 /* the retry budget saves up at most this many retries */
#define MAX_NEED_TAGS 16
#define NEED_TAG_MAX 32 /* a residency tag's bytes, its NUL included */
#define SSE_LINE_HEAD 14 /* bytes of an SSE line that tell its kind: "data: {\"error\"" */

typedef struct preq {
    gw_serve *g;
    gw_http_stream *stream; /* NULL once closed */
    const gw_http_request *req;
    gw_upstream_req *up;
    char id[48];
    char model[GW_BODY_MODEL_MAX];
    char tenant[GW_TENANT_NAME_MAX + 1];
    int worker, tries, status;
    int local_tries; /* of the tries, those sent to a local worker (MAX_TRIES) */
    bool responded, sse, logged;
    bool sse_error;              /* the answer's stream held an error event */
    bool cut;                    /* the upstream failed after the status went out */
    bool stalled;                /* answered 504: the upstream held it response_timeout_ms, unanswered */
    bool forwarded;              /* came from a peer region: served here, never forwarded again */
    bool limit_pending;          /* waiting for the shared rate limit's answer */
    int limit_stage;             /* LIMIT_RPS or LIMIT_TPM (below) */
    route_decision route;        /* candidate regions, in order */
    int cand;                    /* candidates taken: the one being tried is route.cand[cand - 1] */
    bool probe;                  /* the request is the probe of the region it is sent to */
    uint64_t probe_claim;        /* which claim of that probe it holds (route_region_probe_claim) */
    route_region *remote;        /* the remote region being tried; NULL when local */
    uint64_t remote_id;          /* its id then: the table may have dropped it since (route_region_is) */
    /* What every candidate must have, kept for failover: a record may
     * change between the decision and a later candidate, and a reload may
     * drop the tenant whose residency it was. need[] points into need_buf;
     * need_list is the same tags comma-joined, sent to the peer. */
    const char *need[MAX_NEED_TAGS];
    int n_need;
    char need_buf[MAX_NEED_TAGS * NEED_TAG_MAX];
    char need_list[MAX_NEED_TAGS * NEED_TAG_MAX];
    double max_price;
    char region[ROUTE_NAME_MAX]; /* the region that answers */
    const char *error_kind; /* upstream failure, for the log */
    size_t bytes_out, unconsumed;
    double t_start, t_first, t_last;
    double t_sent; /* when the last try went out: what hangup_tokens counts from */
    int events;
    char sse_head[SSE_LINE_HEAD]; /* the first bytes of the SSE line being read */
    int sse_head_len;             /* of them; -1: past them, until the line ends */
    gw_usage_scan usage; /* completion_tokens of the answer, read as it passes */
    double charged;      /* tokens taken from the tenant's budget: prompt and completion estimates */
    double charged_completion; /* of which the completion's */
    bool charged_shared;       /* taken from the fleet-wide (Redis) bucket, not the local one */
    /* SSE: the bytes after the last whole event, held back (see sse_write) */
    uint8_t *hold;
    size_t hold_len;
} preq;

/* ---- metrics ---- */

static const double latency_buckets[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
static const double token_buckets[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1};
#define NB(a) ((int)(sizeof(a) / sizeof(a[0])))

int gw_proxy_metrics_init(gw_metrics *m)
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
        "status=\"refused_stream\": HTTP/2 streams refused unanswered, to be sent again.",
        NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_workers_up", GW_GAUGE, "Workers ready to serve.", NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_worker_queue_depth", GW_GAUGE, "Requests waiting in each worker.", NULL,
                              0);
    rc |= gw_metrics_describe(m, "infergate_worker_running", GW_GAUGE, "Sequences running in each worker.", NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_worker_kv_blocks_free", GW_GAUGE, "Free KV cache blocks per worker.",
                              NULL, 0);
    rc |= gw_metrics_describe(m, "infergate_worker_restarts_total", GW_COUNTER, "Restarts of each worker.",
                              NULL, 0);
    rc |= gw_metrics_describe(
        m, "infergate_access_log_dropped_total", GW_COUNTER,
        "Access log lines dropped: its reader fell a megabyte behind, or a write failed.", NULL, 0);
    return rc ? -ENOMEM : 0;
}

void gw_proxy_metrics_workers(gw_serve *g)
{
    gw_metrics *m = g->metrics;
    gw_metrics_set(m, "infergate_workers_up", "", gw_supervisor_ready_count(g->sup));
    gw_metrics_clear(m, "infergate_worker_queue_depth");
    gw_metrics_clear(m, "infergate_worker_running");
    gw_metrics_clear(m, "infergate_worker_kv_blocks_free");
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
        if (w->ready)
            gw_metrics_set(m, "infergate_worker_kv_blocks_free", labels, w->kv_blocks_free);
        gw_metrics_count_to(m, "infergate_worker_restarts_total", labels, w->restarts);
    }
    if (g->alog)
        gw_metrics_count_to(m, "infergate_access_log_dropped_total", "", (double)gw_alog_dropped(g->alog));
}

/* ---- the end of a request: access log and metrics ---- */

/* A JSON string of client-given bytes: as they are when they are UTF-8,
 * else with each byte past ASCII written \xHH (what was sent stays
 * readable in the log, and a path or model name of any bytes can be
 * answered). NULL only on out of memory. */
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
 * its first choice; a request that failed over says so, or the header
 * described one region and x-infergate-region named another. */
static const char *route_said(const preq *p, char *buf, size_t n)
{
    if (!p->route.n)
        return "";
    if (p->cand <= 1)
        return p->route.reason;
    snprintf(buf, n, "failover to candidate %d of %d; first choice %.63s: %.159s", p->cand, p->route.n,
             p->route.cand[0]->rec.name, p->route.reason);
    return buf;
}

/* The path, but for an API key given as ?key= (the dashboard takes the
 * admin key so): the log gets "?key=REDACTED". */
static void json_field_path(FILE *f, const char *path)
{
    const char *kq = strstr(path, "?key=");
    if (!kq) {
        json_field_str(f, "path", path);
        return;
    }
    size_t n = (size_t)(kq - path) + 5;
    char *red = malloc(n + sizeof("REDACTED"));
    if (red) {
        memcpy(red, path, n);
        memcpy(red + n, "REDACTED", sizeof("REDACTED"));
    }
    json_field_strn(f, "path", red ? red : path, red ? strlen(red) : (size_t)(kq - path));
    free(red);
}

/* The label lists of the last request that finished: requests that follow
 * each other mostly share model, tenant, status and target, and escaping
 * and formatting them anew cost more than the rest of the bookkeeping. */
static struct {
    bool valid;
    int status;
    char model[GW_BODY_MODEL_MAX], tenant[GW_TENANT_NAME_MAX + 1], target[96];
    char labels[400];       /* model, tenant, status, target */
    char model_labels[180]; /* model only */
} last_labels;

/* The model label is a model some worker or region was asked for: the
 * names a client makes up (answered 404 or 403 here) would each start a
 * series of their own, until the metrics' bound refused real ones. */
static void request_labels(const preq *p, const char *target, const char *out[2])
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

/* Writes v in decimal (at most 11 bytes, no NUL) and returns the end:
 * printf's machinery costs more than the rest of a header. */
static char *put_int(char *o, int v)
{
    char digits[12];
    int n = 0;
    unsigned u = v < 0 ? 0u - (unsigned)v : (unsigned)v;
    do
        digits[n++] = (char)('0' + u % 10);
    while (u /= 10);
    if (v < 0)
        *o++ = '-';
    while (n > 0)
        *o++ = digits[--n];
    return o;
}

/* "worker-N", "region-NAME" or "-"; buf holds at least 20 bytes. */
static void target_name(const preq *p, char *buf, size_t cap)
{
    if (p->remote) {
        snprintf(buf, cap, "region-%s", p->region);
    } else if (p->worker >= 0) {
        memcpy(buf, "worker-", 7);
        *put_int(buf + 7, p->worker) = '\0';
    } else {
        snprintf(buf, cap, "-");
    }
}

static const gw_tenant_cfg *tenant_cfg(const gw_serve *g, const char *name);

enum { LIMIT_RPS, LIMIT_TPM };

/* The fleet-wide bucket of a tenant's limit: its Redis key, rate per
 * second and burst. false when that limit is off. */
static bool shared_bucket(const gw_tenant_cfg *tc, int which, char key[128], double *per_s, double *burst)
{
    *per_s = which == LIMIT_RPS ? tc->rps : tc->tpm / 60.0;
    *burst = which == LIMIT_RPS ? (tc->rps > 1 ? tc->rps : 1) : tc->tpm;
    snprintf(key, 128, "tenant:%s:%s", tc->name, which == LIMIT_RPS ? "rps" : "tpm");
    return *per_s > 0;
}

/* Settles the tenant's token charge once the answer is known: back > 0
 * gives tokens back, back < 0 takes more (into debt). */
static void settle(preq *p, double now, double back)
{
    gw_serve *g = p->g;
    if (p->charged_shared) {
        const gw_tenant_cfg *tc = tenant_cfg(g, p->tenant);
        char key[128];
        double per_s, burst;
        if (tc && shared_bucket(tc, LIMIT_TPM, key, &per_s, &burst)) {
            if (back > 0)
                route_sync_refund(g->sync, key, per_s, burst, back);
            else
                route_sync_charge(g->sync, key, per_s, burst, -back);
        }
        return;
    }
    gw_tenant *t = gw_tenants_find(g->tenants, p->tenant);
    if (t && back > 0)
        gw_tenant_refund(t, now, back);
    else if (t)
        gw_tenant_charge(t, now, -back);
}

static route_region *remote_region(const preq *p);

/* Tokens a request whose answer never came back (its client hung up, or
 * the upstream stalled) could have been given in dur_s since its last try
 * went out (earlier tries, the body's upload, a wait for the shared limit
 * gave none): at its worker's pace after its prefill, or at the pace a
 * remote region's record gives (the network's time counts as work: a
 * little more), at most what it asked for. Counted as none, a request sent
 * to another region and hung up on was free however long it ran. */
static int hangup_tokens(const preq *p, double dur_s)
{
    double first_ms = 0, per_ms = 0;
    const route_region *r = remote_region(p);
    if (p->worker >= 0) {
        const gw_worker_info *w = gw_supervisor_worker(p->g->sup, p->worker);
        first_ms = w ? w->prefill_ewma_ms : 0;
        per_ms = w ? w->tpot_ewma_ms : 0;
    } else if (r) {
        first_ms = r->rec.ttft_ms;
        per_ms = r->rec.tpot_ms;
    }
    if (!(per_ms > 0))
        return (int)p->charged_completion; /* no pace known: what it asked */
    double gen_ms = dur_s * 1e3 - first_ms;
    return gen_ms <= 0 ? 0 : (int)fmin(p->charged_completion, 1.0 + gen_ms / per_ms);
}

/* Whether the request's path, before any query, is path. */
static bool path_is(const gw_http_request *r, const char *path)
{
    size_t plen = strcspn(r->path, "?");
    return plen == strlen(path) && !strncmp(r->path, path, plen);
}

static void finish_log(preq *p, bool complete)
{
    if (p->logged)
        return;
    p->logged = true;
    gw_serve *g = p->g;
    double now = gw_mono_s(), dur = now - p->t_start;
    double ttft = p->t_first > 0 ? p->t_first - p->t_start : -1;
    /* Without a usage object, tokens are counted in events: one each but
     * the last of a whole stream (the finish_reason) and a chat stream's
     * first (the role). */
    int bare = complete + path_is(p->req, "/v1/chat/completions");
    int tokens =
        p->usage.tokens >= 0 ? p->usage.tokens : (p->sse && p->events >= bare ? p->events - bare : -1);
    /* tokens, not events: a usage chunk (include_usage) is one event more */
    double tpot = p->sse && tokens > 1 ? (p->t_last - p->t_first) / (tokens - 1) : -1;
    char target[96];
    target_name(p, target, sizeof(target));

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
        json_field_str(f, "route", route_said(p, route, sizeof(route)));
        fprintf(f, ",\"status\":%d,\"bytes\":%zu,\"ttft_ms\":%.3f,\"duration_ms\":%.3f,\"tokens\":%d,\"tries\":%d",
                p->status, p->bytes_out, ttft >= 0 ? ttft * 1e3 : -1.0, dur * 1e3, tokens, p->tries);
        if (p->error_kind)
            json_field_str(f, "upstream_error", p->error_kind);
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
    /* What the estimate charged at admission over-counted comes back: all
     * of it when no completion was served (an error, or no answer at
     * all), else the completion estimate past the tokens generated; what
     * it under-counted (no max_tokens: the estimate is a guess, the
     * worker's bound the context) is taken now, into debt. The prompt's
     * estimate stays: the prompt was computed. A client that hangs up on
     * a request already sent on keeps the charge for its prompt and for
     * the tokens it was seen to get, or could have got in the time
     * (hangup_tokens): else hanging up would make tpm free. So does a
     * request answered 504 for a stalled upstream, which held a worker
     * all that time (a long answer not streamed is one, on demand). */
    if (p->charged > 0 && p->tenant[0]) {
        bool worked = (p->status == 499 && p->tries > 0) || p->stalled;
        if (worked && tokens < 0)
            tokens = hangup_tokens(p, now - p->t_sent);
        double back = p->status != 200 && !worked ? p->charged
                      : tokens >= 0               ? p->charged_completion - tokens
                                                  : 0;
        if (back != 0)
            settle(p, now, back);
    }
}

static void preq_free(preq *p)
{
    gw_mem_free(p->hold);
    gw_mem_free(p);
}

/* ---- answers made here ---- */

/* The body bytes a response of `len` sends: none to a HEAD request, whose
 * response says the length and stops there (the access log's "bytes"). */
static size_t body_bytes(const preq *p, size_t len)
{
    return strcmp(p->req->method, "HEAD") ? len : 0;
}

/* An OpenAI error object, with one more header when `extra` is given. */
static void respond_with(preq *p, int status, const gw_http_header *extra, const char *type, const char *code,
                         const char *param, const char *msg)
{
    json_t *o = json_pack("{s:{s:o, s:s, s:s?, s:s?}}", "error", "message", json_text(msg, strlen(msg)),
                          "type", type, "param", param, "code", code);
    char *body = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    gw_http_header h[3] = {{"content-type", "application/json"}, {"x-request-id", p->id}};
    if (extra)
        h[2] = *extra;
    p->status = status;
    if (!body || gw_http_respond(p->stream, status, h, extra ? 3 : 2, body, strlen(body)))
        gw_http_reset(p->stream);
    else
        p->bytes_out += body_bytes(p, strlen(body));
    free(body);
}

static void respond(preq *p, int status, const char *type, const char *code, const char *param, int retry_after,
                    const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static void respond(preq *p, int status, const char *type, const char *code, const char *param, int retry_after,
                    const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    char ra[16];
    snprintf(ra, sizeof(ra), "%d", retry_after);
    const gw_http_header h = {"retry-after", ra};
    respond_with(p, status, retry_after > 0 ? &h : NULL, type, code, param, msg);
}

/* 405 names the methods the path takes (RFC 9110 15.5.6). */
static void respond_not_allowed(preq *p, const char *allow)
{
    char msg[96];
    snprintf(msg, sizeof(msg), "%.16s is not allowed here (allowed: %s)", p->req->method, allow);
    const gw_http_header h = {"allow", allow};
    respond_with(p, 405, &h, "invalid_request_error", "method_not_allowed", NULL, msg);
}

static void respond_plain(preq *p, int status, const char *ctype, const char *body, size_t len)
{
    gw_http_header h[2] = {{"content-type", ctype}, {"x-request-id", p->id}};
    p->status = status;
    p->bytes_out += body_bytes(p, len);
    if (gw_http_respond(p->stream, status, h, 2, body, len))
        gw_http_reset(p->stream);
}

/* ---- upstream ---- */

static void send_upstream(preq *p);
static bool try_next(preq *p);
static void note_upstream_error(preq *p, const char *kind);

/* The region tried, if the table still holds it (a stream may outlive a
 * region pruned for silence, and its slot go to another). */
static route_region *remote_region(const preq *p)
{
    return p->remote && route_region_is(p->remote, p->remote_id) ? p->remote : NULL;
}

/* The remote region being tried answered the request, or failed it: its
 * failures are what ejects it; a probe's outcome decides its ejection,
 * once (a stream that fails long after its answer must not decide a later
 * probe, held by another request), and only while its claim is the one out. */
static void region_report(preq *p, bool ok)
{
    if (remote_region(p) && p->probe)
        route_region_report_probe(p->g->table, p->remote, ok, gw_mono_ms(), p->probe_claim);
    else if (remote_region(p))
        route_region_report(p->g->table, p->remote, ok, gw_mono_ms());
    p->probe = false;
}

/* A probe this request holds and will not report: the next request's. */
static void probe_give_back(preq *p)
{
    if (p->probe && remote_region(p))
        route_region_release_probe(p->remote, p->probe_claim);
    p->probe = false;
}

static void region_failed(preq *p)
{
    region_report(p, false);
}

/* Sends the request again, to local worker w: a retry spent. */
static bool resend_local(preq *p, int w)
{
    p->g->retry_tokens -= 1;
    p->worker = w;
    send_upstream(p);
    return true;
}

/* A failure before the first response byte moves the request on: from a
 * local worker to another one here (once), else to the next candidate
 * region — while the retry budget lasts, so a fleet-wide outage does not
 * multiply the load. This region is one candidate however many workers it
 * has: without the first step a worker's crash sent the request to a
 * farther region, or failed it where there was none, with a sibling ready.
 * The region that failed is told so first, budget or not: its failures
 * are what ejects it (not a refused stream, which says nothing of its
 * health: it holds too many request bodies on the connection). */
static bool retry(preq *p, bool region_at_fault)
{
    gw_serve *g = p->g;
    if (region_at_fault)
        region_failed(p);
    else
        probe_give_back(p); /* refused unprocessed */
    if (!p->stream || g->retry_tokens < 1)
        return false;
    int other = !p->remote && p->worker >= 0 && p->local_tries < MAX_TRIES
                    ? gw_supervisor_pick(g->sup, p->model, p->worker)
                    : -1;
    if (other >= 0)
        return resend_local(p, other);
    if (p->route.n) {
        g->retry_tokens -= 1;
        if (try_next(p))
            return true;
        g->retry_tokens += 1; /* nowhere left to go: no retry was spent */
    }
    return false;
}

/* A local worker too small for the request (its 503 kv_cache_too_small)
 * hands it to a sibling with a larger cache, once: one the same size
 * would say the same, and other regions' workers, as a rule, too. */
static bool retry_on_larger(preq *p)
{
    gw_serve *g = p->g;
    if (!p->stream || g->retry_tokens < 1 || p->local_tries >= MAX_TRIES)
        return false;
    int w = gw_supervisor_pick_larger(g->sup, p->model, p->worker);
    return w >= 0 && resend_local(p, w);
}

/* An upstream's Retry-After (seconds), within 1..60; 0 without one. */
static int retry_after_of(const gw_http_header *hs, size_t n)
{
    int retry_after = 0;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(hs[i].name, "retry-after")) {
            long v = strtol(hs[i].value, NULL, 10);
            retry_after = v < 1 ? 1 : v > 60 ? 60 : (int)v;
        }
    return retry_after;
}

static void up_response(void *ud, int status, const gw_http_header *hs, size_t n)
{
    preq *p = ud;
    /* A region's 503 (no worker ready, draining) or 502 (its worker failed
     * before answering, already retried there) is worth the next region;
     * so is its 401/403 (it does not take our certificate),
     * 404 (its record lists a model it does not serve) or 421 (nor the
     * residency): the region is wrong for the request, and counts it as a
     * failure. Its 504 is not (the request held a worker there for
     * response_timeout_ms, and could hold the next one as long), nor a 500:
     * those are passed on, and count against the region all the same. */
    bool wrong_region = status == 401 || status == 403 || status == 404 || status == 421;
    /* A 503 with no Retry-After is a worker's "never here": the request
     * does not fit its KV cache, which says nothing of its region's health. */
    int retry_after = retry_after_of(hs, n);
    bool too_big = status == 503 && !retry_after;
    if ((status == 502 || (status == 503 && !too_big) || wrong_region) && p->remote) {
        gw_upstream_cancel(p->up);
        p->up = NULL;
        note_upstream_error(p, wrong_region ? "status_4xx" : "status_5xx");
        if (retry(p, true))
            return;
        if (!p->stream)
            return;
        /* Nowhere else to go: say what happened (a new request for its
         * body is not possible). Its 502 or 503 passes on; its 4xx is about
         * our request to it, not the client's to us, whom a 401 would tell
         * its key is wrong and a 421 that it misdirected the request. */
        respond(p, wrong_region ? 502 : status, "server_error", "upstream_failed", NULL, 1,
                "region %s answered %d", p->region, status);
        return;
    }
    /* A region whose queues are full (429) is alive, only busy: the next
     * candidate may have room, and nothing counts against the region.
     * Passed on, its 429 told the client to back off while the fleet had
     * room elsewhere. */
    if (status == 429 && p->remote) {
        gw_upstream_cancel(p->up);
        p->up = NULL;
        region_report(p, true);
        if (retry(p, false) || !p->stream)
            return;
        respond(p, 429, "rate_limit_error", "queue_full", NULL, retry_after ? retry_after : 1,
                "region %s is at capacity and no other region could take the request; retry shortly",
                p->region);
        return;
    }
    /* A local worker that turned the request away unstarted — its queue
     * full (429), its memory short (503) — leaves it to a sibling, whose
     * queue is its own, else to the next region; one whose KV cache is too
     * small for it, to a sibling with a larger one. The old answer is let
     * go only once the request is on its way: with nowhere to go, it
     * passes on as it is (a region's too-big 503 too, counted as no
     * failure of the region). */
    if ((status == 429 || status == 503) && !p->remote && p->worker >= 0) {
        gw_upstream_req *old = p->up;
        p->up = NULL;
        if (too_big ? retry_on_larger(p) : retry(p, false)) {
            gw_upstream_cancel(old);
            return;
        }
        p->up = old;
    }
    region_report(p, status < 500 || too_big);
    p->responded = true;
    p->status = status;
    gw_http_header out[10];
    size_t k = 0;
    char worker[16];
    *put_int(worker, p->worker) = '\0';
    int64_t length = -1; /* the upstream's content-length, which nghttp2 has checked is a number */
    for (size_t i = 0; i < n; i++) {
        if (k < 5 && (!strcmp(hs[i].name, "content-type") || !strcmp(hs[i].name, "cache-control") ||
                      !strcmp(hs[i].name, "retry-after"))) {
            out[k++] = hs[i];
            if (!strcmp(hs[i].name, "content-type") && !strncmp(hs[i].value, "text/event-stream", 17))
                p->sse = true;
        } else if (!strcmp(hs[i].name, "content-length") && strlen(hs[i].value) <= 18 &&
                   strspn(hs[i].value, "0123456789") == strlen(hs[i].value) && hs[i].value[0]) {
            length = strtoll(hs[i].value, NULL, 10);
        }
    }
    out[k++] = (gw_http_header){"x-request-id", p->id};
    if (p->sse) /* nginx in front would otherwise hold the tokens back in its buffers */
        out[k++] = (gw_http_header){"x-accel-buffering", "no"};
    if (!p->remote)
        out[k++] = (gw_http_header){"x-infergate-worker", worker};
    if (p->region[0])
        out[k++] = (gw_http_header){"x-infergate-region", p->region};
    char route[320];
    if (p->route.n)
        out[k++] = (gw_http_header){"x-infergate-route", route_said(p, route, sizeof(route))};
    if (!p->stream)
        return;
    /* The length passes on, so that the client can tell a whole body from
     * a cut one (an HTTP/1.0 client could not, nor keep the connection);
     * events are held and ended with an error event of ours instead. */
    int rc = length >= 0 && !p->sse ? gw_http_begin_length(p->stream, status, out, k, (uint64_t)length)
                                    : gw_http_begin(p->stream, status, out, k);
    if (rc) {
        gw_upstream_cancel(p->up);
        p->up = NULL;
        gw_http_reset(p->stream);
    }
}

static void sse_line(preq *p)
{
    const char *h = p->sse_head;
    int n = p->sse_head_len;
    if (n < 6 || memcmp(h, "data: ", 6))
        return;
    /* a worker whose model failed mid-stream ends with an error event */
    if (n >= 14 && !memcmp(h + 6, "{\"error\"", 8))
        p->sse_error = true;
    else
        p->events += !(n >= 12 && !memcmp(h + 6, "[DONE]", 6));
}

/* Counts SSE events (one per token in a completion stream) by the start
 * of each line, kept across calls: an upstream's DATA frames split lines
 * anywhere, and a chunk's first byte is no line's start. */
static void scan_sse(preq *p, const uint8_t *data, size_t len)
{
    const uint8_t *q = data, *end = data + len;
    while (q < end) {
        if (p->sse_head_len < 0) {
            const uint8_t *nl = memchr(q, '\n', (size_t)(end - q));
            if (!nl)
                return;
            q = nl + 1;
            p->sse_head_len = 0;
            continue;
        }
        uint8_t c = *q++;
        if (c == '\n') {
            sse_line(p);
            p->sse_head_len = 0;
            continue;
        }
        p->sse_head[p->sse_head_len++] = (char)c;
        if (p->sse_head_len == SSE_LINE_HEAD) {
            sse_line(p);
            p->sse_head_len = -1;
        }
    }
}

/* SSE data goes to the client a whole event at a time: the bytes after the
 * last blank line are held until the rest of their event comes (an
 * upstream's DATA frames follow its flow-control window, not events). So
 * the error event written after an upstream failure never lands inside a
 * half-sent event, which a client would read as one event of broken JSON.
 * An "event" longer than the hold's bound is let through as it comes: at
 * most SSE_HOLD_MAX, and a quarter of stream_buffer_bytes, so that what a
 * slow reader's stream holds (half the buffer before the upstream is read
 * no more, its window of a quarter, and the hold) never exceeds it: with a
 * small buffer, an event of a few KiB (top_logprobs) was held whole and
 * written at once past it, and the stream reset. */
#define SSE_HOLD_MAX 16384

static size_t sse_hold_max(const preq *p)
{
    size_t q = p->g->cfg->limits.stream_buffer_bytes / 4;
    return q < SSE_HOLD_MAX ? q : SSE_HOLD_MAX;
}

static int sse_hold(preq *p, const uint8_t *data, size_t len)
{
    if (!p->hold && !(p->hold = gw_mem_alloc(SSE_HOLD_MAX)))
        return -ENOMEM;
    memcpy(p->hold + p->hold_len, data, len);
    p->hold_len += len;
    return 0;
}

static int sse_write(preq *p, const uint8_t *data, size_t len)
{
    size_t cut = len; /* data[0..cut) ends the last whole event */
    while (cut > 0 && !(data[cut - 1] == '\n' &&
                        (cut >= 2 ? data[cut - 2] == '\n' : p->hold_len && p->hold[p->hold_len - 1] == '\n')))
        cut--;
    size_t hold_max = sse_hold_max(p);
    if (cut == 0 && p->hold_len + len <= hold_max)
        return sse_hold(p, data, len);
    if (cut == 0 || len - cut > hold_max)
        cut = len; /* no event boundary within reach: pass it all */
    if (p->hold_len) {
        int rc = gw_http_write(p->stream, p->hold, p->hold_len);
        if (rc)
            return rc;
        p->hold_len = 0;
    }
    int rc = gw_http_write(p->stream, data, cut);
    return rc || cut == len ? rc : sse_hold(p, data + cut, len - cut);
}

static void up_data(void *ud, const uint8_t *data, size_t len)
{
    preq *p = ud;
    double now = gw_mono_s();
    if (!p->t_first)
        p->t_first = now;
    p->t_last = now;
    if (p->sse)
        scan_sse(p, data, len);
    gw_usage_scan_feed(&p->usage, data, len);
    if (!p->stream)
        return;
    int rc = p->sse ? sse_write(p, data, len) : gw_http_write(p->stream, data, len);
    if (rc) {
        gw_upstream_cancel(p->up);
        p->up = NULL;
        gw_http_reset(p->stream);
        return;
    }
    p->bytes_out += len;
    if (gw_http_pending(p->stream) <= p->g->cfg->limits.stream_buffer_bytes / 2)
        gw_upstream_consume(p->up, len);
    else
        p->unconsumed += len;
}

/* The log's upstream_error and the metric, for one failure of the upstream. */
static void note_upstream_error(preq *p, const char *kind)
{
    p->error_kind = kind;
    char labels[64];
    snprintf(labels, sizeof(labels), "kind=\"%s\"", kind);
    gw_metrics_add(p->g->metrics, "infergate_upstream_errors_total", labels, 1);
}

static void up_end(void *ud)
{
    preq *p = ud;
    p->up = NULL;
    if (p->sse_error) { /* ended cleanly, but on an error: a failure all the same */
        note_upstream_error(p, "stream_error");
        region_failed(p);
    }
    /* An upstream that ends without a blank line: its last bytes go as they are. */
    if (p->stream &&
        ((p->hold_len && gw_http_write(p->stream, p->hold, p->hold_len)) || gw_http_end(p->stream)))
        gw_http_reset(p->stream);
    p->hold_len = 0;
}

static void up_error(void *ud, gw_upstream_error e, bool responded)
{
    preq *p = ud;
    p->up = NULL;
    note_upstream_error(p, gw_upstream_error_name(e));
    if (!p->stream)
        return;
    if (!responded) {
        /* A stalled target had the request all along: another try would
         * double the wait, and a request that wedges a worker could wedge
         * the next. */
        if (e == GW_UP_STALLED) {
            p->stalled = true;
            region_failed(p);
            respond(p, 504, "timeout_error", "upstream_timeout", NULL, 1,
                    "%s %s did not answer within limits.response_timeout_ms", p->remote ? "region" : "worker",
                    p->remote ? p->region : "serving this request");
            return;
        }
        if (retry(p, e != GW_UP_REFUSED))
            return;
        /* Routed: every region the request may use has failed it, so the
         * service is unavailable to it for now (never a region it may not use). */
        if (p->stream && p->route.n)
            respond(p, 503, "server_error", "no_region_available", NULL, 1,
                    "no region this request may use could serve it (last: %s, %s)", p->region, p->error_kind);
        else if (p->stream)
            respond(p, 502, "server_error", "upstream_failed", NULL, 1, "the worker failed before answering (%s)",
                    p->error_kind);
        return;
    }
    /* Mid-response: a stream of events ends with an error event clients can
     * read; anything else can only be cut off. */
    p->cut = true;
    region_failed(p);
    if (p->sse) {
        /* What was held of a half-received event is dropped. */
        p->hold_len = 0;
        static const char failed[] =
            "data: {\"error\":{\"message\":\"the worker serving this stream failed\","
            "\"type\":\"server_error\",\"param\":null,\"code\":\"upstream_failed\"}}\n\n";
        static const char stalled[] =
            "data: {\"error\":{\"message\":\"the worker serving this stream stopped "
            "sending (limits.response_timeout_ms)\",\"type\":\"timeout_error\","
            "\"param\":null,\"code\":\"upstream_timeout\"}}\n\n";
        const char *ev = e == GW_UP_STALLED ? stalled : failed;
        size_t len = e == GW_UP_STALLED ? sizeof(stalled) - 1 : sizeof(failed) - 1;
        if (!gw_http_write(p->stream, ev, len) && !gw_http_end(p->stream))
            return;
    }
    gw_http_reset(p->stream);
}

static const gw_upstream_cbs up_cbs = {up_response, up_data, up_end, up_error};

static void send_upstream(preq *p)
{
    gw_serve *g = p->g;
    const gw_http_request *r = p->req;
    gw_http_header h[10];
    size_t n = 0;
    h[n++] = (gw_http_header){"content-type", "application/json"};
    h[n++] = (gw_http_header){"x-request-id", p->id};
    if (p->tenant[0])
        h[n++] = (gw_http_header){"x-infergate-tenant", p->tenant};
    /* Priority is the client's to ask, within its tenant's policy. */
    const gw_tenant *t = p->tenant[0] ? gw_tenants_find(g->tenants, p->tenant) : NULL;
    const char *v = t && gw_tenant_batch_only(t) ? "batch" : gw_http_header_get(r, "x-infergate-priority");
    if (v)
        h[n++] = (gw_http_header){"x-infergate-priority", v};
    if ((v = gw_http_header_get(r, "x-infergate-deadline-ms")))
        h[n++] = (gw_http_header){"x-infergate-deadline-ms", v};
    const char *target;
    if (p->remote) {
        /* The receiving gateway serves it itself: one hop, never more. */
        h[n++] = (gw_http_header){"x-infergate-hop", "1"};
        if (g->cfg->region.name)
            h[n++] = (gw_http_header){"x-infergate-origin", g->cfg->region.name};
        if (p->n_need) /* checked there against its own tags (421) */
            h[n++] = (gw_http_header){"x-infergate-residency", p->need_list};
        target = gw_regions_target(g, p->remote);
    } else {
        target = gw_supervisor_worker(g->sup, p->worker)->target;
    }
    p->tries++;
    p->local_tries += !p->remote;
    p->t_sent = gw_mono_s();
    p->up = gw_upstream_send(g->pool, target, r->method, r->path, p->remote ? p->remote->rec.name : "localhost", h, n,
                             r->body, r->body_len, &up_cbs, p);
    /* A target the pool cannot use (a peer's record with an endpoint it
     * cannot parse) or no memory: as a failed connect, the region is told
     * and the next candidate tried. */
    if (!p->up)
        up_error(p, GW_UP_CONNECT, false);
}

/* ---- requests ---- */

static void request_id(preq *p, const gw_http_request *r)
{
    const char *v = gw_http_header_get(r, "x-request-id");
    bool ok = v && *v && strlen(v) < sizeof(p->id);
    for (const char *c = v; ok && *c; c++)
        ok = isalnum((unsigned char)*c) || strchr("-_.:", *c);
    if (ok) {
        snprintf(p->id, sizeof(p->id), "%s", v);
        return;
    }
    /* 48 random bits drawn once per process, then a counter from a random
     * start: unique without a system call per request. */
    static uint64_t prefix, counter;
    static bool seeded;
    if (!seeded) {
        uint64_t rnd[2] = {0, 0};
        if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd)) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            rnd[0] ^= (uint64_t)ts.tv_nsec << 20 ^ (uint64_t)ts.tv_sec ^ (uint64_t)getpid() << 40;
        }
        prefix = rnd[0];
        counter = rnd[1];
        seeded = true;
    }
    static const char hex[] = "0123456789abcdef";
    uint64_t n = ++counter;
    memcpy(p->id, "req-", 4);
    for (int i = 0; i < 12; i++) {
        p->id[4 + i] = hex[(prefix >> (44 - 4 * i)) & 15];
        p->id[16 + i] = hex[(n >> (44 - 4 * i)) & 15];
    }
    p->id[28] = '\0';
}

/* Who sends a request, from its head alone: on_head and on_request both
 * ask, so a head refused early is refused for the same reason later. */
typedef enum {
    SENDER_ANYONE,   /* no keys configured */
    SENDER_TENANT,   /* a valid key */
    SENDER_PEER,     /* a forwarded request over a verified peer connection */
    SENDER_NO_KEY,   /* keys required, none sent */
    SENDER_BAD_KEY,  /* a key no tenant holds */
    SENDER_BAD_PEER, /* forwarded, but the connection's certificate was not verified */
} sender;

static sender identify(gw_serve *g, const gw_http_request *r, gw_tenant **t)
{
    *t = NULL;
    if (gw_http_header_get(r, "x-infergate-hop"))
        return r->peer_verified ? SENDER_PEER : SENDER_BAD_PEER;
    if (gw_tenants_open(g->tenants))
        return SENDER_ANYONE;
    const char *a = gw_http_header_get(r, "authorization"), *key;
    const char *q = strstr(r->path, "?key=");
    if (a && strncasecmp(a, "Bearer ", 7) == 0)
        key = a + 7;
    else if (!a && q && path_is(r, "/dashboard"))
        key = q + 5; /* a browser refreshing the page sends no header */
    else
        return SENDER_NO_KEY;
    *t = gw_tenants_auth(g->tenants, key);
    return *t ? SENDER_TENANT : SENDER_BAD_KEY;
}

static bool refused(sender who)
{
    return who == SENDER_NO_KEY || who == SENDER_BAD_KEY || who == SENDER_BAD_PEER;
}

static const gw_tenant_cfg *tenant_cfg(const gw_serve *g, const char *name)
{
    const gw_config *c = g->reloaded ? g->reloaded : g->cfg;
    for (int i = 0; i < c->n_tenants; i++)
        if (!strcmp(c->tenants[i].name, name))
            return &c->tenants[i];
    return NULL;
}

/* Sends the request to the next usable candidate region; false when none
 * is left. A local candidate without a ready worker is passed over. */
static bool try_next(preq *p)
{
    gw_serve *g = p->g;
    const route_query q = {
        .model = p->model, .need_tags = p->need, .n_need_tags = p->n_need, .max_price = p->max_price};
    while (p->cand < p->route.n) {
        /* the first was claimed by route_decide; a later one may have
         * been ejected since, or be out of its back-off (one probe), or its
         * record replaced by one that no longer qualifies (tags, model,
         * price) */
        route_region *r = p->route.cand[p->cand];
        uint64_t id = p->route.cand_id[p->cand];
        bool probe = p->cand == 0 && p->route.probe;
        if (p->cand++ > 0 && (!route_region_is(r, id) || !route_region_allows(r, &q) ||
                              (!r->local && !route_region_claim(r, gw_mono_ms(), &probe))))
            continue;
        p->probe = probe;
        p->probe_claim = probe ? route_region_probe_claim(r) : 0;
        if (r->local) {
            int w = gw_supervisor_pick(g->sup, p->model, p->remote ? -1 : p->worker);
            if (w < 0)
                continue;
            p->remote = NULL;
            p->worker = w;
        } else {
            if (!*gw_regions_target(g, r)) {
                if (probe)
                    route_region_release_probe(r, p->probe_claim);
                continue;
            }
            p->remote = r;
            p->remote_id = id;
            p->worker = -1;
        }
        snprintf(p->region, sizeof(p->region), "%s", r->rec.name);
        send_upstream(p);
        return true;
    }
    return false;
}

/* Residency the request needs: the tenant's tags, narrowed further by the
 * x-infergate-residency header (comma-separated). Returns the count, or -1
 * for a header with too many or malformed tags. */
static int need_tags(preq *p, const gw_tenant_cfg *tc, char *buf, size_t cap, const char **need)
{
    int n = 0;
    for (int i = 0; tc && i < tc->n_residency && n < MAX_NEED_TAGS; i++)
        need[n++] = tc->residency[i];
    const char *h = gw_http_header_get(p->req, "x-infergate-residency");
    if (!h)
        return n;
    if (strlen(h) >= cap)
        return -1;
    strcpy(buf, h);
    for (char *save = NULL, *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
        if (n == MAX_NEED_TAGS || strlen(tok) >= NEED_TAG_MAX)
            return -1;
        need[n++] = tok;
    }
    return n;
}

/* Copies the tags into p (need_tags' pointers are into a stack buffer and
 * the tenant's config). */
static void keep_need(preq *p, const char *const *need, int n)
{
    char *b = p->need_buf, *l = p->need_list;
    p->n_need = 0;
    p->need_list[0] = '\0';
    for (int i = 0; i < n; i++) {
        size_t len = strnlen(need[i], NEED_TAG_MAX - 1);
        memcpy(b, need[i], len);
        b[len] = '\0';
        p->need[p->n_need++] = b;
        b += len + 1;
        l += sprintf(l, "%s%s", i ? "," : "", p->need[i]);
    }
}

/* A forwarded request's residency, as its origin sent it: every tag must
 * be this region's (the origin's view of our record may be out of date).
 * NULL when it is, else the first tag missing (in buf). */
static const char *residency_missing(preq *p, char *buf, size_t cap)
{
    const char *need[MAX_NEED_TAGS];
    int n = need_tags(p, NULL, buf, cap, need);
    if (n < 0)
        return "(malformed x-infergate-residency)";
    const gw_config *c = p->g->cfg;
    for (int j = 0; j < n; j++) {
        bool have = false;
        for (int k = 0; k < c->region.n_tags && !have; k++)
            have = !strcmp(c->region.tags[k], need[j]);
        if (!have)
            return need[j];
    }
    return NULL;
}

/* What /v1/models lists: each model id once, those the tenant may use. */
typedef struct model_list {
    json_t *data;
    gw_tenant *t;
    const char *one; /* /v1/models/{one}: the id asked for, as sent */
    size_t one_len;
    json_t *found;
    long created;
} model_list;

static void list_model(void *ud, const char *id)
{
    model_list *l = ud;
    if (l->t && !gw_tenant_allows_model(l->t, id))
        return;
    for (size_t i = 0; i < json_array_size(l->data); i++)
        if (!strcmp(json_string_value(json_object_get(json_array_get(l->data, i), "id")), id))
            return;
    json_t *m = json_pack("{s:s, s:s, s:I, s:s}", "id", id, "object", "model", "created",
                          (json_int_t)l->created, "owned_by", "infergate");
    if (m && l->one && !l->found && gw_http_segment_is(l->one, l->one_len, id))
        l->found = json_incref(m);
    json_array_append_new(l->data, m);
}

/* GET /v1/models (one == NULL) or /v1/models/{one}: the models this
 * tenant may use here, from the local workers and from the regions a
 * completion could be routed to (current, healthy, with the residency
 * the request needs). */
static void handle_models(preq *p, gw_tenant *t, const char *one, size_t one_len)
{
    gw_serve *g = p->g;
    model_list l = {.data = json_array(), .t = t, .one = one, .one_len = one_len, .created = g->started};
    const char *need[MAX_NEED_TAGS];
    char buf[512];
    int n_need = 0;
    if ((n_need = need_tags(p, tenant_cfg(g, p->tenant), buf, sizeof(buf), need)) < 0) {
        json_decref(l.data);
        respond(p, 400, "invalid_request_error", "bad_residency", NULL, 0,
                "x-infergate-residency must be at most %d comma-separated tags", MAX_NEED_TAGS);
        return;
    }
    /* The local workers' models whether or not a worker is ready now, where
     * this region has the residency asked for. */
    bool here = true;
    for (int j = 0; j < n_need && here; j++) {
        here = false;
        for (int k = 0; k < g->cfg->region.n_tags && !here; k++)
            here = !strcmp(g->cfg->region.tags[k], need[j]);
    }
    for (int i = 0; l.data && here && i < g->cfg->n_workers; i++)
        list_model(&l, g->cfg->workers[i].name);
    if (l.data && gw_regions_enabled(g))
        route_models(g->table, need, n_need, gw_mono_ms(), list_model, &l);
    if (one && !l.found) {
        json_decref(l.data);
        respond(p, 404, "invalid_request_error", "model_not_found", "model", 0,
                "the model '%.*s' does not exist", (int)(one_len > 128 ? 128 : one_len), one);
        return;
    }
    json_t *o = one ? l.found : json_pack("{s:s, s:O}", "object", "list", "data", l.data);
    json_decref(l.data);
    char *body = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (body)
        respond_plain(p, 200, "application/json", body, strlen(body));
    else
        gw_http_reset(p->stream);
    free(body);
}

/* Local workers only (no region section, or a request forwarded to us);
 * else the routing decision and its first candidate. */
static void dispatch(preq *p)
{
    gw_serve *g = p->g;
    g->retry_tokens += g->cfg->routing.retry_budget;
    if (g->retry_tokens > RETRY_TOKENS_MAX)
        g->retry_tokens = RETRY_TOKENS_MAX;
    if (!gw_regions_enabled(g) || p->forwarded) {
        /* A gateway with no region has no tags: a request that needs
         * some, by its header or its tenant's residency, cannot be held to
         * them here (a forwarded one was, by the region that chose us). The
         * config refuses such a tenant without a region section, at start
         * and at a reload; this holds whatever the config said. */
        const char *need[MAX_NEED_TAGS];
        char buf[512];
        if (!p->forwarded && !gw_regions_enabled(g) &&
            need_tags(p, tenant_cfg(g, p->tenant), buf, sizeof(buf), need) != 0) {
            respond(p, 400, "invalid_request_error", "bad_residency", NULL, 0,
                    "residency cannot be met: this gateway has no region section, so no tags");
            return;
        }
        const char *missing = p->forwarded ? residency_missing(p, buf, sizeof(buf)) : NULL;
        if (missing) { /* the origin fails over on 421 */
            respond(p, 421, "invalid_request_error", "misdirected_request", NULL, 0,
                    "region %s does not have the residency tag '%s' this request needs",
                    g->cfg->region.name ? g->cfg->region.name : "-", missing);
            return;
        }
        if (!gw_supervisor_serves(g->sup, p->model)) {
            respond(p, 404, "invalid_request_error", "model_not_found", "model", 0, "the model '%s' does not exist",
                    p->model);
            return;
        }
        if (g->cfg->region.name)
            snprintf(p->region, sizeof(p->region), "%s", g->cfg->region.name);
        p->worker = gw_supervisor_pick(g->sup, p->model, -1);
        if (p->worker < 0) {
            respond(p, 503, "server_error", "no_worker_ready", NULL, 1, "no worker for model '%s' is ready",
                    p->model);
            return;
        }
        send_upstream(p);
        return;
    }
    const gw_tenant_cfg *tc = tenant_cfg(g, p->tenant);
    if (p->tenant[0] && !tc) {
        /* A reload dropped the tenant while its limit was checked: without
         * its residency the request could go anywhere. */
        respond(p, 401, "invalid_request_error", "invalid_api_key", NULL, 0,
                "tenant '%s' was removed by a configuration reload", p->tenant);
        return;
    }
    const char *need[MAX_NEED_TAGS];
    char buf[512];
    int n_need = need_tags(p, tc, buf, sizeof(buf), need);
    if (n_need < 0) {
        respond(p, 400, "invalid_request_error", "bad_residency", NULL, 0,
                "x-infergate-residency must be at most %d comma-separated tags", MAX_NEED_TAGS);
        return;
    }
    double max_price = tc ? tc->max_price : 0;
    const char *mp = gw_http_header_get(p->req, "x-infergate-max-price");
    if (mp) {
        char *end;
        double v = strtod(mp, &end);
        if (end == mp || *end || !(v > 0)) {
            respond(p, 400, "invalid_request_error", "bad_max_price", NULL, 0,
                    "x-infergate-max-price must be a positive price per million output tokens");
            return;
        }
        /* A request may lower its tenant's cap, never raise it. */
        if (max_price <= 0 || v < max_price)
            max_price = v;
    }
    keep_need(p, need, n_need);
    p->max_price = max_price;
    gw_route_policy pol = tc && tc->policy != GW_POLICY_DEFAULT ? tc->policy : g->cfg->routing.policy;
    route_query q = {
        .model = p->model,
        .need_tags = p->need,
        .n_need_tags = p->n_need,
        .max_price = max_price,
        .policy = pol == GW_POLICY_COST ? ROUTE_COST : ROUTE_LATENCY,
        .slo_ms = tc && tc->slo_ms > 0 ? tc->slo_ms : g->cfg->routing.slo_ms,
        .now_ms = gw_mono_ms(),
    };
    if (route_decide(g->table, &q, &p->route) == 0) {
        const route_decision *d = &p->route;
        if (d->out_model == route_table_count(g->table))
            respond(p, 404, "invalid_request_error", "model_not_found", "model", 0,
                    "no region serves the model '%s'", p->model);
        else
            respond(p, 503, "server_error", "no_region", NULL, 1,
                    "no region may serve this request now (left out: %d residency, %d price, %d unhealthy, "
                    "%d stale, %d ejected)",
                    d->out_residency, d->out_price, d->out_unhealthy, d->out_stale, d->out_ejected);
        return;
    }
    p->cand = 0;
    if (!try_next(p))
        respond(p, 503, "server_error", "no_worker_ready", NULL, 1, "no region has a ready worker for '%s'",
                p->model);
}

/* ---- tenant limits: fleet-wide through Redis, local buckets without ---- */

static void limit_local(preq *p)
{
    gw_tenant *t = gw_tenants_find(p->g->tenants, p->tenant);
    int retry;
    if (t && gw_tenant_admit(t, gw_mono_s(), p->charged, &retry)) {
        p->charged = 0;
        respond(p, 429, "rate_limit_error", "rate_limit_exceeded", NULL, retry,
                "tenant '%s' is over its request or token rate; retry in %d s", p->tenant, retry);
        return;
    }
    dispatch(p);
}

static void on_shared_limit(void *ud, int result, int retry_after_ms);

/* Stage LIMIT_RPS checks requests per second, LIMIT_TPM tokens per minute. */
static void limit_shared(preq *p, int stage)
{
    gw_serve *g = p->g;
    const gw_tenant_cfg *tc = tenant_cfg(g, p->tenant);
    for (; tc && stage <= LIMIT_TPM; stage++) {
        char key[128];
        double per_s, burst;
        if (!shared_bucket(tc, stage, key, &per_s, &burst))
            continue;
        p->limit_pending = true;
        p->limit_stage = stage;
        double cost = stage == LIMIT_RPS ? 1 : p->charged;
        if (route_sync_limit(g->sync, key, per_s, burst, cost, on_shared_limit, p) == 0) {
            p->charged_shared = stage == LIMIT_TPM;
            return;
        }
        p->limit_pending = false;
        limit_local(p); /* Redis went away between the check and now */
        return;
    }
    dispatch(p);
}

static void on_shared_limit(void *ud, int result, int retry_after_ms)
{
    preq *p = ud;
    p->limit_pending = false;
    if (result == -ENOTCONN) {
        p->charged_shared = false;
        limit_local(p);
        return;
    }
    if (result == -EAGAIN) {
        int retry = (retry_after_ms + 999) / 1000;
        p->charged = 0;
        respond(p, 429, "rate_limit_error", "rate_limit_exceeded", NULL, retry > 0 ? retry : 1,
                "tenant '%s' is over its fleet-wide request or token rate; retry in %d s", p->tenant,
                retry > 0 ? retry : 1);
        return;
    }
    limit_shared(p, p->limit_stage + 1);
}

#define MAX_CHARGED_TOKENS (1ll << 24)

static void handle_completion(preq *p, gw_tenant *t)
{
    gw_serve *g = p->g;
    const gw_http_request *r = p->req;
    gw_body_fields f;
    char why[128];
    int rc = gw_body_fields_scan(r->body, r->body_len, &f, why, sizeof(why));
    if (rc == -ENOMEM) {
        respond(p, 503, "server_error", NULL, NULL, 1, "out of memory reading the request");
        return;
    }
    if (rc) {
        respond(p, 400, "invalid_request_error", NULL, NULL, 0, "invalid JSON body: %s", why);
        return;
    }
    long long max_tokens = f.max_tokens;
    bool chat = strstr(r->path, "/chat/") != NULL;
    if (!f.has_model || f.model_len == 0) {
        respond(p, 400, "invalid_request_error", NULL, "model", 0, "'model' must be a non-empty string");
        return;
    }
    if (f.model_len >= sizeof(p->model)) { /* longer than any model name can be */
        respond(p, 404, "invalid_request_error", "model_not_found", "model", 0,
                "the model '%.64s...' does not exist", f.model);
        return;
    }
    memcpy(p->model, f.model, f.model_len + 1);

    if (t && !gw_tenant_allows_model(t, p->model)) {
        respond(p, 403, "permission_error", "model_not_allowed", "model", 0, "tenant '%s' may not use model '%s'",
                p->tenant, p->model);
        return;
    }
    if (!t) {
        dispatch(p);
        return;
    }
    /* Charge an estimate now (4 bytes a token for the prompt, the asked
     * maximum for the answer) and refund the difference at the end. No
     * context is longer than MAX_CHARGED_TOKENS: a larger ask, which the
     * worker refuses, must not put the tenant's bucket 2^63 into debt
     * while it is on its way. */
    p->charged_completion = max_tokens > 0
                                ? (double)(max_tokens < MAX_CHARGED_TOKENS ? max_tokens : MAX_CHARGED_TOKENS)
                            : chat ? 256
                                   : 16;
    p->charged = (double)r->body_len / 4 + p->charged_completion;
    if (g->sync && route_sync_connected(g->sync))
        limit_shared(p, LIMIT_RPS);
    else
        limit_local(p);
}

/* /v1/regions and /dashboard: the routing table, for admins. */
static void handle_regions(preq *p, bool html)
{
    size_t len = 0;
    char *body = html ? gw_regions_dashboard(p->g, &len) : gw_regions_json(p->g, &len);
    if (body)
        respond_plain(p, 200, html ? "text/html; charset=utf-8" : "application/json", body, len);
    else
        gw_http_reset(p->stream);
    free(body);
}

/* A request another region's gateway forwarded: accepted only over a
 * connection whose client certificate verified (mutual TLS), and then the
 * tenant it names is taken as given. */
static void accept_forwarded(preq *p)
{
    const char *tenant = gw_http_header_get(p->req, "x-infergate-tenant");
    p->forwarded = true;
    if (tenant && strlen(tenant) < sizeof(p->tenant))
        snprintf(p->tenant, sizeof(p->tenant), "%s", tenant);
}

/* The answer to a sender identify() refused. */
static void respond_refused(preq *p, sender who)
{
    if (who == SENDER_BAD_PEER)
        respond(p, 403, "permission_error", "peer_not_authenticated", NULL, 0,
                "forwarded requests (x-infergate-hop) are accepted only from peer gateways with a verified "
                "client certificate");
    else if (who == SENDER_NO_KEY)
        respond(p, 401, "invalid_request_error", "missing_api_key", NULL, 0,
                "missing API key: send it as 'Authorization: Bearer KEY'");
    else
        respond(p, 401, "invalid_request_error", "invalid_api_key", NULL, 0, "invalid API key");
}

void gw_proxy_on_request(void *ud, gw_http_stream *s, const gw_http_request *r)
{
    gw_serve *g = ud;
    preq *p = gw_mem_alloc(sizeof(*p));
    if (!p) {
        gw_http_reset(s);
        return;
    }
    memset(p, 0, sizeof(*p));
    p->g = g;
    p->stream = s;
    p->req = r;
    p->worker = -1;
    gw_usage_scan_init(&p->usage);
    p->t_start = gw_mono_s();
    request_id(p, r);
    gw_http_set_user(s, p);

    size_t plen = strcspn(r->path, "?");
    /* HEAD is GET without the body, which the HTTP layer leaves out. */
    bool get = !strcmp(r->method, "GET") || !strcmp(r->method, "HEAD"), post = !strcmp(r->method, "POST");
#define PATH_IS(x) path_is(r, x)
    if ((PATH_IS("/healthz") || PATH_IS("/readyz")) && !get) {
        respond_not_allowed(p, "GET, HEAD");
        return;
    }
    if (PATH_IS("/healthz") && get) {
        respond_plain(p, 200, "application/json", "{\"status\":\"ok\"}", 15);
        return;
    }
    if (PATH_IS("/readyz") && get) {
        int n = gw_supervisor_ready_count(g->sup);
        char body[96];
        int len = snprintf(body, sizeof(body), "{\"ready\":%s,\"workers_ready\":%d,\"workers\":%d}",
                           n > 0 && !g->draining ? "true" : "false", n, gw_supervisor_count(g->sup));
        respond_plain(p, n > 0 && !g->draining ? 200 : 503, "application/json", body, (size_t)len);
        return;
    }
    bool completion = (PATH_IS("/v1/completions") || PATH_IS("/v1/chat/completions")) && post;
    gw_tenant *t;
    sender who = identify(g, r, &t);
    if (refused(who)) {
        respond_refused(p, who);
        return;
    }
    if (who == SENDER_PEER) {
        accept_forwarded(p);
        if (completion)
            handle_completion(p, NULL);
        else
            respond(p, 404, "invalid_request_error", "not_found", NULL, 0, "only completions are forwarded");
        return;
    }
    if (t)
        snprintf(p->tenant, sizeof(p->tenant), "%s", gw_tenant_name(t));
    if ((PATH_IS("/v1/regions") || PATH_IS("/dashboard")) && get) {
        if (t && !gw_tenant_admin(t)) {
            respond(p, 403, "permission_error", "admin_only", NULL, 0, "%.*s needs an admin key", (int)plen, r->path);
            return;
        }
        handle_regions(p, PATH_IS("/dashboard"));
        return;
    }
    if (PATH_IS("/metrics") && get) {
        if (t && !gw_tenant_admin(t)) {
            respond(p, 403, "permission_error", "admin_only", NULL, 0, "/metrics needs an admin key");
            return;
        }
        gw_proxy_metrics_workers(g);
        size_t len;
        char *body = gw_metrics_render(g->metrics, &len);
        if (body)
            respond_plain(p, 200, "text/plain; version=0.0.4", body, len);
        else
            gw_http_reset(s);
        free(body);
        return;
    }
    if (PATH_IS("/v1/models") && get) {
        handle_models(p, t, NULL, 0);
        return;
    }
    static const char models_dir[] = "/v1/models/";
    bool model_path = plen > sizeof(models_dir) - 1 && !strncmp(r->path, models_dir, sizeof(models_dir) - 1);
    if (get && model_path) {
        handle_models(p, t, r->path + sizeof(models_dir) - 1, plen - (sizeof(models_dir) - 1));
        return;
    }
    if (completion) {
        handle_completion(p, t);
        return;
    }
    if (PATH_IS("/v1/completions") || PATH_IS("/v1/chat/completions"))
        respond_not_allowed(p, "POST");
    else if (PATH_IS("/v1/models") || model_path || PATH_IS("/metrics") || PATH_IS("/v1/regions") ||
             PATH_IS("/dashboard"))
        respond_not_allowed(p, "GET, HEAD");
    else
        respond(p, 404, "invalid_request_error", "not_found", NULL, 0, "no route for %s %.*s", r->method, (int)plen,
                r->path);
#undef PATH_IS
}

/* A request refused whatever its body says is answered from its head, so
 * that a client without a valid key cannot make the gateway take in (and
 * hold) a body. The answer is on_request's own. A request that passes is
 * identified again when whole (one more key hash): a SIGHUP between the two
 * may have replaced the tenants, so the first answer is not kept. */
void gw_proxy_on_head(void *ud, gw_http_stream *s, const gw_http_request *r)
{
    gw_tenant *t;
    if (refused(identify(ud, r, &t)))
        gw_proxy_on_request(ud, s, r);
}

void gw_proxy_on_refused(void *ud, int status, const char *method, const char *path, const char *protocol)
{
    gw_serve *g = ud;
    char labels[32];
    if (status)
        snprintf(labels, sizeof(labels), "status=\"%d\"", status);
    else
        snprintf(labels, sizeof(labels), "status=\"refused_stream\"");
    gw_metrics_add(g->metrics, "infergate_http_refused_total", labels, 1);
    FILE *f = g->alog ? gw_alog_file(g->alog) : NULL;
    if (!f)
        return;
    fprintf(f, "{\"ts\":%ld", (long)time(NULL));
    json_field_str(f, "method", method ? method : "");
    json_field_path(f, path ? path : "");
    json_field_str(f, "protocol", protocol);
    fprintf(f, ",\"status\":%d,\"refused_by\":\"http\"%s}\n", status,
            status ? "" : ",\"h2_error\":\"REFUSED_STREAM\"");
    fflush(f);
}

void gw_proxy_on_writable(void *ud, gw_http_stream *s, void *stream_ud)
{
    preq *p = stream_ud;
    if (p && p->up && p->unconsumed) {
        gw_upstream_consume(p->up, p->unconsumed);
        p->unconsumed = 0;
    }
}

void gw_proxy_on_close(void *ud, gw_http_stream *s, void *stream_ud, bool finished)
{
    preq *p = stream_ud;
    if (!p)
        return;
    p->stream = NULL;
    if (p->limit_pending) {
        /* Whether the shared bucket took the charge is not known: no refund. */
        route_sync_limit_cancel(p->g->sync, p);
        p->charged = 0;
    }
    if (p->up) {
        /* The client went away: the worker stops generating for it. */
        gw_upstream_cancel(p->up);
        p->up = NULL;
        if (!p->status || p->responded)
            p->error_kind = "client_closed";
    }
    /* A probe the client left before its answer says nothing of the
     * region: the next request probes, now rather than after
     * probe_timeout_ms. */
    probe_give_back(p);
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
    preq_free(p);
}
