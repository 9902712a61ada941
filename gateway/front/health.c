/* Active health checks (see health.h): a timer that sends each target its
 * one-token request when due, and what each outcome does to the target's
 * health state (a region's ejection in the routing table, a worker's
 * readiness in the supervisor). */
#include "gateway/front/health.h"

#include "gateway/base/clock.h"
#include "gateway/front/serve_internal.h"
#include "routing/router.h"

#include <errno.h>
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TICK_MS 100       /* due checks are looked for this often */
#define MAX_REGION_CHECKS 256 /* the routing table's size (regions.c) */

typedef enum { OUT_OK, OUT_FAIL, OUT_BUSY } outcome;

typedef struct check {
    struct gw_health *h;
    bool used, is_worker;
    bool mark; /* a region's: still in the table at this tick */
    int worker;         /* its index, for a worker */
    uint64_t region_id; /* for a region: route_region.id */
    char name[ROUTE_NAME_MAX + 8]; /* "worker-N" or "region-NAME": its metrics label */
    gw_upstream_req *req; /* the check in flight; NULL: none */
    int status;
    int64_t sent_ms, done_ms;
    double tokens_at_send; /* a worker's tokens_generated when sent: busy or stuck */
    int model_turn;        /* a region's model checked next */
    pid_t pid;             /* a worker's process its counts are of */
    int failures, successes; /* a worker's, in a row (a region's are in its route_region) */
    char last[48];
    double latency_ms;
} check;

typedef struct gw_health {
    gw_serve *g;
    struct event *tick;
    check *workers;
    int n_workers;
    check regions[MAX_REGION_CHECKS];
    bool on;
    unsigned long long seq;
} gw_health;

/* ---- outcomes ---- */

static void count(gw_health *h, const char *family, const check *c, const char *outcome_name)
{
    char esc[2 * sizeof(c->name)], labels[sizeof(esc) + 40];
    gw_metrics_escape(c->name, esc, sizeof(esc)); /* a peer's name is what its record says */
    if (outcome_name)
        snprintf(labels, sizeof(labels), "target=\"%s\",outcome=\"%s\"", esc, outcome_name);
    else
        snprintf(labels, sizeof(labels), "target=\"%s\"", esc);
    gw_metrics_add(h->g->metrics, family, labels, 1);
}

static void worker_outcome(gw_health *h, check *c, outcome o, const char *why)
{
    gw_serve *g = h->g;
    const gw_worker_info *w = gw_supervisor_worker(g->sup, c->worker);
    const gw_routing_cfg *rc = &g->cfg->routing;
    if (w->pid != c->pid) /* sent to a process gone since: nothing of the one there now */
        return;
    if (o == OUT_OK) {
        c->failures = 0;
        c->successes++;
        if (w->check_down && c->successes >= rc->health_check_successes) {
            gw_supervisor_set_check_down(g->sup, c->worker, false);
            fprintf(stderr, "infergate: event=worker_returned worker=%d model=%s by=check successes=%d\n",
                    c->worker, w->model, c->successes);
            count(h, "infergate_health_returns_total", c, NULL);
        }
        return;
    }
    c->successes = 0;
    if (c->failures++ == 0 && !w->check_down)
        fprintf(stderr, "infergate: event=health_check_failed target=%s why=\"%s\"\n", c->name, why);
    if (!w->check_down && c->failures >= rc->health_check_failures) {
        gw_supervisor_set_check_down(g->sup, c->worker, true);
        fprintf(stderr, "infergate: event=worker_ejected worker=%d model=%s by=check failures=%d why=\"%s\"\n",
                c->worker, w->model, c->failures, why);
        count(h, "infergate_health_ejections_total", c, NULL);
    }
}

/* The region's ejection is logged by the routing events (region_ejected
 * by=check, region_returned), as any other. */
static void region_outcome(gw_health *h, check *c, outcome o, const char *why)
{
    gw_serve *g = h->g;
    route_region *r = NULL;
    for (int i = 0; g->table && i < route_table_count(g->table) && !r; i++)
        if (route_table_at(g->table, i)->id == c->region_id)
            r = route_table_at(g->table, i);
    if (!r)
        return;
    const gw_routing_cfg *rc = &g->cfg->routing;
    bool was = r->check_down;
    if (o == OUT_FAIL && r->check_failures == 0 && !was)
        fprintf(stderr, "infergate: event=health_check_failed target=%s why=\"%s\"\n", c->name, why);
    route_region_report_check(g->table, r, o == OUT_OK, rc->health_check_failures, rc->health_check_successes,
                              gw_mono_ms());
    if (r->check_down != was)
        count(h, was ? "infergate_health_returns_total" : "infergate_health_ejections_total", c, NULL);
}

static void finish(check *c, outcome o, const char *why)
{
    gw_health *h = c->h;
    c->req = NULL;
    c->done_ms = gw_mono_ms();
    c->latency_ms = (double)(c->done_ms - c->sent_ms);
    snprintf(c->last, sizeof(c->last), "%s", why);
    count(h, "infergate_health_checks_total", c, o == OUT_OK ? "ok" : o == OUT_BUSY ? "busy" : "fail");
    if (o == OUT_BUSY)
        return; /* says nothing of its health either way */
    if (c->is_worker)
        worker_outcome(h, c, o, why);
    else
        region_outcome(h, c, o, why);
}

static void on_response(void *ud, int status, const gw_http_header *hs, size_t n)
{
    (void)hs;
    (void)n;
    ((check *)ud)->status = status;
}

static void on_data(void *ud, const uint8_t *data, size_t len)
{
    (void)data;
    gw_upstream_consume(((check *)ud)->req, len);
}

static void on_end(void *ud)
{
    check *c = ud;
    char why[32];
    snprintf(why, sizeof(why), "status %d", c->status);
    finish(c, c->status == 200 ? OUT_OK : c->status == 429 ? OUT_BUSY : OUT_FAIL, c->status == 200 ? "ok" : why);
}

static void on_error(void *ud, gw_upstream_error e, bool responded)
{
    (void)responded;
    /* a stream refused unprocessed (RFC 9113 8.7): the target holds too
     * many, which says nothing of its health */
    finish(ud, e == GW_UP_REFUSED ? OUT_BUSY : OUT_FAIL, gw_upstream_error_name(e));
}

static const gw_upstream_cbs check_cbs = {on_response, on_data, on_end, on_error, NULL}; /* a check has no energy to count */

/* No answer within the timeout: failing, unless the target was busy. */
static void timed_out(gw_health *h, check *c)
{
    gw_upstream_cancel(c->req);
    c->req = NULL;
    bool busy;
    if (c->is_worker) {
        busy = gw_supervisor_worker(h->g->sup, c->worker)->tokens_generated > c->tokens_at_send;
    } else {
        busy = false;
        for (int i = 0; h->g->table && i < route_table_count(h->g->table); i++) {
            const route_region *r = route_table_at(h->g->table, i);
            if (r->id == c->region_id)
                busy = r->rec.queued > 0;
        }
    }
    finish(c, busy ? OUT_BUSY : OUT_FAIL, busy ? "timeout while busy" : "timeout");
}

/* ---- sending ---- */

static void send_check(gw_health *h, check *c, const char *target, const char *authority, const char *model)
{
    gw_serve *g = h->g;
    json_t *o = json_pack("{s:s, s:s, s:i}", "model", model, "prompt", "hi", "max_tokens", 1);
    char *body = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!body)
        return;
    char id[40];
    snprintf(id, sizeof(id), "health-%llu", ++h->seq);
    gw_http_header hs[6];
    size_t n = 0;
    hs[n++] = (gw_http_header){"content-type", "application/json"};
    hs[n++] = (gw_http_header){"x-request-id", id};
    hs[n++] = (gw_http_header){GW_HEALTH_HEADER, "1"};
    if (!c->is_worker) { /* as a forwarded request: served by the peer itself */
        hs[n++] = (gw_http_header){"x-infergate-hop", "1"};
        if (g->cfg->region.name)
            hs[n++] = (gw_http_header){"x-infergate-origin", g->cfg->region.name};
    }
    c->status = 0;
    c->sent_ms = gw_mono_ms();
    if (c->is_worker)
        c->tokens_at_send = gw_supervisor_worker(g->sup, c->worker)->tokens_generated;
    c->req = gw_upstream_send(g->pool, target, "POST", "/v1/completions", authority, hs, n, body, strlen(body),
                              &check_cbs, c);
    free(body);
    if (!c->req) /* a target the pool cannot use: as a failed connect */
        finish(c, OUT_FAIL, "connect");
}

static bool due(const check *c, int64_t now, int interval)
{
    return !c->req && (c->sent_ms == 0 || now - c->sent_ms >= interval);
}

static void check_workers(gw_health *h, int64_t now, int interval)
{
    gw_supervisor *sup = h->g->sup;
    for (int i = 0; i < h->n_workers; i++) {
        check *c = &h->workers[i];
        const gw_worker_info *w = gw_supervisor_worker(sup, i);
        if (w->pid != c->pid) { /* a new process (the supervisor put it up): counts start over */
            if (c->req)
                gw_upstream_cancel(c->req);
            c->req = NULL;
            c->pid = w->pid;
            c->failures = c->successes = 0;
        }
        if (w->pid && w->answered && due(c, now, interval))
            send_check(h, c, w->target, "localhost", w->model);
    }
}

static check *region_check(gw_health *h, const route_region *r)
{
    check *free_slot = NULL;
    for (int i = 0; i < MAX_REGION_CHECKS; i++) {
        check *c = &h->regions[i];
        if (c->used && c->region_id == r->id)
            return c;
        if (!c->used && !free_slot)
            free_slot = c;
    }
    if (free_slot) {
        *free_slot = (check){.h = h, .used = true, .region_id = r->id};
        snprintf(free_slot->name, sizeof(free_slot->name), "region-%s", r->rec.name);
    }
    return free_slot;
}

/* The next model of r a check may use: one its record says a worker is
 * ready for (where it says); NULL when none. */
static const char *next_model(check *c, const route_region *r)
{
    for (int k = 0; k < r->rec.n_models; k++) {
        int m = (c->model_turn + k) % r->rec.n_models;
        if (r->rec.n_load == 0 || r->rec.load[m].capacity > 0) {
            c->model_turn = m + 1;
            return r->rec.models[m];
        }
    }
    return NULL;
}

static void check_regions(gw_health *h, int64_t now, int interval)
{
    gw_serve *g = h->g;
    for (int i = 0; i < MAX_REGION_CHECKS; i++)
        h->regions[i].mark = false;
    for (int i = 0; g->table && i < route_table_count(g->table); i++) {
        route_region *r = route_table_at(g->table, i);
        check *c = r->local ? NULL : region_check(h, r);
        if (!c)
            continue;
        c->mark = true;
        /* out already for what its record says: nothing to learn */
        if (!route_region_current(g->table, r, now) || !r->rec.healthy || r->rec.draining || !due(c, now, interval))
            continue;
        char buf[GW_TARGET_MAX];
        const char *target = gw_regions_target(g, r, buf, sizeof(buf)), *model = next_model(c, r);
        if (*target && model)
            send_check(h, c, target, r->rec.name, model);
    }
    for (int i = 0; i < MAX_REGION_CHECKS; i++) { /* regions gone from the table */
        check *c = &h->regions[i];
        if (!c->used || c->mark)
            continue;
        if (c->req)
            gw_upstream_cancel(c->req);
        *c = (check){0};
    }
}

/* Checks turned off (a reload): what they ejected comes back. */
static void turn_off(gw_health *h)
{
    gw_serve *g = h->g;
    for (int i = 0; i < h->n_workers; i++) {
        check *c = &h->workers[i];
        if (c->req)
            gw_upstream_cancel(c->req);
        c->req = NULL;
        c->failures = c->successes = 0;
        gw_supervisor_set_check_down(g->sup, i, false);
    }
    for (int i = 0; i < MAX_REGION_CHECKS; i++) {
        if (h->regions[i].req)
            gw_upstream_cancel(h->regions[i].req);
        h->regions[i] = (check){0};
    }
    for (int i = 0; g->table && i < route_table_count(g->table); i++)
        route_region_check_reset(route_table_at(g->table, i));
    fprintf(stderr, "infergate: health checks off\n");
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_health *h = arg;
    const gw_routing_cfg *rc = &h->g->cfg->routing;
    if (rc->health_check_ms <= 0 || h->g->draining) {
        if (h->on)
            turn_off(h);
        h->on = false;
        return;
    }
    h->on = true;
    int64_t now = gw_mono_ms();
    for (int i = 0; i < h->n_workers; i++)
        if (h->workers[i].req && now - h->workers[i].sent_ms >= rc->health_check_timeout_ms)
            timed_out(h, &h->workers[i]);
    for (int i = 0; i < MAX_REGION_CHECKS; i++)
        if (h->regions[i].req && now - h->regions[i].sent_ms >= rc->health_check_timeout_ms)
            timed_out(h, &h->regions[i]);
    check_workers(h, now, rc->health_check_ms);
    check_regions(h, now, rc->health_check_ms);
}

/* ---- life ---- */

int gw_health_start(gw_serve *g, char *err, size_t err_len)
{
    gw_health *h = calloc(1, sizeof(*h));
    int n = gw_supervisor_count(g->sup);
    if (!h || (n && !(h->workers = calloc((size_t)n, sizeof(*h->workers)))))
        goto oom;
    h->g = g;
    h->n_workers = n;
    for (int i = 0; i < n; i++) {
        h->workers[i] = (check){.h = h, .used = true, .is_worker = true, .worker = i};
        snprintf(h->workers[i].name, sizeof(h->workers[i].name), "worker-%d", i);
    }
    struct timeval tv = {0, TICK_MS * 1000};
    if (!(h->tick = event_new(g->base, -1, EV_PERSIST, on_tick, h)) || event_add(h->tick, &tv))
        goto oom;
    g->health = h;
    return 0;
oom:
    if (h && h->tick)
        event_free(h->tick);
    if (h)
        free(h->workers);
    free(h);
    snprintf(err, err_len, "out of memory");
    return -ENOMEM;
}

void gw_health_stop(gw_serve *g)
{
    gw_health *h = g->health;
    if (!h)
        return;
    event_free(h->tick);
    for (int i = 0; i < h->n_workers; i++)
        if (h->workers[i].req)
            gw_upstream_cancel(h->workers[i].req);
    for (int i = 0; i < MAX_REGION_CHECKS; i++)
        if (h->regions[i].req)
            gw_upstream_cancel(h->regions[i].req);
    free(h->workers);
    free(h);
    g->health = NULL;
}

json_t *gw_health_region_json(gw_serve *g, const route_region *r)
{
    gw_health *h = g->health;
    if (!h || !h->on || r->local)
        return json_null();
    const check *c = NULL;
    for (int i = 0; i < MAX_REGION_CHECKS && !c; i++)
        if (h->regions[i].used && h->regions[i].region_id == r->id)
            c = &h->regions[i];
    const char *state = r->check_down            ? "ejected"
                        : r->check_failures > 0  ? "failing"
                        : c && c->done_ms        ? "passing"
                                                 : "unchecked";
    int64_t now = gw_mono_ms();
    return json_pack("{s:s, s:i, s:i, s:s, s:o, s:o}", "state", state, "failures", r->check_failures, "successes",
                     r->check_successes, "last", c && c->done_ms ? c->last : "", "age_ms",
                     c && c->done_ms ? json_integer(now - c->done_ms) : json_null(), "latency_ms",
                     c && c->done_ms ? json_real(c->latency_ms) : json_null());
}
