/* Hedged requests. A short answer not streamed (max_tokens at most
 * routing.hedge_max_tokens) that has not come after a delay — the first
 * target's p95 over its recent such answers, or routing.hedge_delay_ms —
 * gets a second copy, sent to the next target as failover would choose it
 * (a sibling worker, else the next candidate region). A worker sends a
 * non-streamed answer's head once the answer is whole, so the first copy
 * to answer with anything but a failure failover would move on from wins,
 * and the other's upstream stream is reset at once: its worker drops the
 * sequence. A copy that fails while the other is out leaves the other to
 * answer, no retry spent. Each eligible request adds routing.hedge_share
 * to a bucket a hedge takes one from, so hedges stay within that share of
 * traffic.
 *
 * While both are out, the copy's target (worker, region, prices, probe)
 * is held here; the winner's ends in the request, so the relay, the log,
 * spend and the region's health see the answer that went out, once. */
#include "gateway/front/request_internal.h"

#include "gateway/base/mem.h"
#include "gateway/front/placement.h"

#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HEDGE_TOKENS_MAX 10 /* the bucket saves at most this many hedges */
#define LAT_TARGETS 64      /* targets whose answer times are kept */
#define LAT_SAMPLES 64      /* answers kept of each (a ring) */
#define LAT_MIN_SAMPLES 8   /* fewer: no p95, so no hedge with hedge_delay_ms 0 */

/* Where one try went: the fields of the request a try sets (dispatch.c's
 * choice, relay.c's send). */
typedef struct target {
    gw_upstream_req *up;
    int worker, cand;
    route_region *remote;
    uint64_t remote_id, probe_claim;
    bool probe;
    char region[ROUTE_NAME_MAX];
    double price_in, price_out, est_at_send, t_sent;
} target;

typedef enum {
    H_WAIT, /* the delay runs (or, without a p95, answer times are only noted) */
    H_OUT,  /* the copy is out beside the first try */
    H_ONE,  /* one try left: no copy, or the race is decided */
} hedge_state;

struct gw_front_hedge {
    gw_front_req *p;
    struct event *timer; /* NULL when none is armed */
    hedge_state state;
    bool sending;  /* the copy is being sent: relay.c gives it our callbacks */
    bool promoted; /* the copy's stream is the request's: its callbacks go to relay.c's */
    target copy;   /* while H_OUT */
    const char *outcome;
};

/* A gateway's (g->hedges): the bucket, and its targets' recent answer times. */
struct gw_hedges {
    double tokens;
    uint64_t clock; /* calls to slot(): a target's use is stamped with it */
    struct {
        char key[ROUTE_NAME_MAX + 4]; /* "w:N" or "r:REGION"; "" unused */
        double ms[LAT_SAMPLES];
        unsigned n;    /* answers noted; the ring's next slot is n % LAT_SAMPLES */
        uint64_t used; /* when last used: the least recent is replaced */
    } t[LAT_TARGETS];
};

static void save(const gw_front_req *p, target *t)
{
    *t = (target){.up = p->up,
                  .worker = p->worker,
                  .cand = p->cand,
                  .remote = p->remote,
                  .remote_id = p->remote_id,
                  .probe_claim = p->probe_claim,
                  .probe = p->probe,
                  .price_in = p->price_in,
                  .price_out = p->price_out,
                  .est_at_send = p->est_at_send,
                  .t_sent = p->t_sent};
    memcpy(t->region, p->region, sizeof(t->region));
}

static void load(gw_front_req *p, const target *t)
{
    p->up = t->up;
    p->worker = t->worker;
    p->cand = t->cand;
    p->remote = t->remote;
    p->remote_id = t->remote_id;
    p->probe_claim = t->probe_claim;
    p->probe = t->probe;
    p->price_in = t->price_in;
    p->price_out = t->price_out;
    p->est_at_send = t->est_at_send;
    p->t_sent = t->t_sent;
    memcpy(p->region, t->region, sizeof(p->region));
}

static void count(gw_front_req *p, const char *outcome)
{
    char labels[48];
    snprintf(labels, sizeof(labels), "outcome=\"%s\"", outcome);
    gw_metrics_add(p->g->metrics, "infergate_hedges_total", labels, 1);
}

/* ---- answer times, per target ---- */

static int lat_slot(struct gw_hedges *hs, const gw_front_req *p, bool add)
{
    char k[sizeof(hs->t[0].key)];
    if (p->remote)
        snprintf(k, sizeof(k), "r:%s", p->region);
    else
        snprintf(k, sizeof(k), "w:%d", p->worker);
    int lru = 0;
    for (int i = 0; i < LAT_TARGETS; i++) {
        if (!strcmp(hs->t[i].key, k)) {
            hs->t[i].used = ++hs->clock;
            return i;
        }
        if (hs->t[i].used < hs->t[lru].used)
            lru = i;
    }
    if (!add)
        return -1;
    memcpy(hs->t[lru].key, k, sizeof(k));
    hs->t[lru].n = 0;
    hs->t[lru].used = ++hs->clock;
    return lru;
}

/* The try p holds answered (or, a loser, took at least this long). */
static void lat_note(const gw_front_req *p)
{
    struct gw_hedges *hs = p->g->hedges;
    int i = lat_slot(hs, p, true);
    hs->t[i].ms[hs->t[i].n++ % LAT_SAMPLES] = (gw_mono_s() - p->t_sent) * 1e3;
}

static int cmp_ms(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The p95 of the target's recent answers (ms); -1 with too few. */
static double lat_p95(const gw_front_req *p)
{
    struct gw_hedges *hs = p->g->hedges;
    int i = lat_slot(hs, p, false);
    if (i < 0 || hs->t[i].n < LAT_MIN_SAMPLES)
        return -1;
    unsigned n = hs->t[i].n < LAT_SAMPLES ? hs->t[i].n : LAT_SAMPLES;
    double v[LAT_SAMPLES];
    memcpy(v, hs->t[i].ms, n * sizeof(v[0]));
    qsort(v, n, sizeof(v[0]), cmp_ms);
    return v[(n * 95 + 99) / 100 - 1];
}

/* ---- the race ---- */

/* A status failover moves on from (dispatch.c, relay.c): the other copy
 * may still answer. remote: the try went to a region. */
static bool failed(bool remote, int status)
{
    return status >= 500 || status == 429 ||
           (remote && (status == 401 || status == 403 || status == 404 || status == 421));
}

static void disarm(struct gw_front_hedge *h)
{
    if (h->timer)
        event_free(h->timer);
    h->timer = NULL;
}

static void log_end(struct gw_front_hedge *h, const char *outcome)
{
    h->outcome = outcome;
    fprintf(stderr, "infergate: event=hedge_end request=%s outcome=%s\n", h->p->id, outcome);
}

/* What the copy's region hears when the copy is let go. */
enum { GIVE_BACK, REPORT_FAILED, REPORT_OK };

/* Resets the copy if it is still out and settles its region: GIVE_BACK
 * (it lost, or the client left: its probe goes to the next request) or a
 * report of how it went. The request keeps the try it holds. */
static void drop_copy(struct gw_front_hedge *h, int report)
{
    gw_front_req *p = h->p;
    target held;
    save(p, &held);
    load(p, &h->copy);
    gw_placement_try_aside(p); /* what it ran counts, though it did not answer */
    if (p->up) {
        gw_upstream_cancel(p->up);
        if (report == GIVE_BACK) {
            count(p, "cancelled");
            lat_note(p); /* it took at least this long */
        }
    }
    if (report == GIVE_BACK)
        gw_front_probe_give_back(p);
    else
        gw_front_region_report(p, report == REPORT_OK);
    load(p, &held);
    h->copy.up = NULL;
    h->state = H_ONE;
}

/* The copy's stream becomes the request's try. */
static void promote(struct gw_front_hedge *h)
{
    load(h->p, &h->copy);
    gw_placement_try_begin(h->p); /* the first try's share is counted; the copy's try is the request's */
    h->copy.up = NULL;
    h->promoted = true;
    h->state = H_ONE;
}

static void copy_response(void *ud, int status, const gw_http_header *hs, size_t n)
{
    struct gw_front_hedge *h = ud;
    gw_front_req *p = h->p;
    if (!h->promoted && failed(h->copy.remote != NULL, status)) { /* the first try goes on alone */
        drop_copy(h, status == 429 ? REPORT_OK : REPORT_FAILED);
        count(p, "failed");
        log_end(h, "hedge_failed");
        return;
    }
    if (!h->promoted) { /* the copy answered first: the first try is reset */
        gw_upstream_cancel(p->up);
        p->up = NULL;
        count(p, "cancelled");
        lat_note(p);
        gw_front_probe_give_back(p);
        promote(h);
        count(p, "won_hedge");
        log_end(h, "won_hedge");
    }
    gw_front_up_cbs.on_response(p, status, hs, n);
}

static void copy_data(void *ud, const uint8_t *data, size_t len)
{
    struct gw_front_hedge *h = ud;
    if (h->promoted) /* data comes only after the answer, which decided the race */
        gw_front_up_cbs.on_data(h->p, data, len);
}

static void copy_end(void *ud)
{
    struct gw_front_hedge *h = ud;
    if (h->promoted)
        gw_front_up_cbs.on_end(h->p);
}

static void copy_error(void *ud, gw_upstream_error e, bool responded)
{
    struct gw_front_hedge *h = ud;
    gw_front_req *p = h->p;
    if (h->promoted) {
        gw_front_up_cbs.on_error(p, e, responded);
        return;
    }
    char labels[64];
    snprintf(labels, sizeof(labels), "kind=\"%s\"", gw_upstream_error_name(e));
    gw_metrics_add(p->g->metrics, "infergate_upstream_errors_total", labels, 1);
    h->copy.up = NULL; /* gone: nothing to reset */
    drop_copy(h, e == GW_UP_REFUSED ? GIVE_BACK : REPORT_FAILED);
    count(p, "failed");
    log_end(h, "hedge_failed");
}

/* a region's energy trailer, once the copy's answer is the request's */
static void copy_trailers(void *ud, const gw_http_header *hs, size_t n)
{
    struct gw_front_hedge *h = ud;
    if (h->promoted)
        gw_front_up_cbs.on_trailers(h->p, hs, n);
}

static const gw_upstream_cbs copy_cbs = {copy_response, copy_data, copy_end, copy_error, copy_trailers};

/* The delay passed with no answer: the copy goes out, if the bucket
 * holds a hedge and there is a next target. */
static void fire(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct gw_front_hedge *h = arg;
    gw_front_req *p = h->p;
    disarm(h);
    h->state = H_ONE;
    if (!p->stream || p->responded || !p->up)
        return;
    if (p->g->hedges->tokens < 1) {
        count(p, "suppressed");
        h->outcome = "suppressed";
        return;
    }
    target first;
    save(p, &first);
    char from[ROUTE_NAME_MAX + 16], to[ROUTE_NAME_MAX + 16];
    gw_front_target_said(p, from, sizeof(from));
    h->sending = true;
    bool sent = gw_front_send_next(p);
    h->sending = false;
    save(p, &h->copy);
    gw_front_target_said(p, to, sizeof(to));
    load(p, &first);
    if (!sent || !h->copy.up) { /* nowhere else to go, or it could not be queued */
        if (sent) {
            load(p, &h->copy);
            gw_front_probe_give_back(p);
            load(p, &first);
        }
        return;
    }
    p->g->hedges->tokens -= 1;
    h->state = H_OUT;
    count(p, "sent");
    fprintf(stderr, "infergate: event=hedge request=%s from=\"%s\" to=\"%s\" after_ms=%.0f\n", p->id, from, to,
            (gw_mono_s() - p->t_sent) * 1e3);
}

/* Short and not streamed, from a client (a forwarded request is hedged by
 * the gateway it came from). Unset max_tokens counts as the worker's
 * default: 256 for a chat, 16 else. */
static bool eligible(const gw_front_req *p)
{
    const gw_routing_cfg *r = &p->g->cfg->routing;
    if (!r->hedge || !p->completion || p->stream_asked || p->forwarded)
        return false;
    long long max = p->max_tokens >= 0                                  ? p->max_tokens
                    : gw_front_path_is(p->req, "/v1/chat/completions") ? 256
                                                                        : 16;
    return max <= r->hedge_max_tokens;
}

void gw_front_hedge_arm(gw_front_req *p)
{
    if (p->hedge || !eligible(p))
        return;
    gw_serve *g = p->g;
    const gw_routing_cfg *r = &g->cfg->routing;
    struct gw_front_hedge *h = gw_mem_alloc(sizeof(*h));
    if (!h || (!g->hedges && !(g->hedges = calloc(1, sizeof(*g->hedges))))) {
        gw_mem_free(h);
        return;
    }
    memset(h, 0, sizeof(*h));
    h->p = p;
    h->state = H_WAIT;
    p->hedge = h;
    g->hedges->tokens += r->hedge_share;
    if (g->hedges->tokens > HEDGE_TOKENS_MAX)
        g->hedges->tokens = HEDGE_TOKENS_MAX;
    double delay = r->hedge_delay_ms > 0 ? r->hedge_delay_ms : lat_p95(p);
    if (delay < 0 || !(h->timer = evtimer_new(g->base, fire, h)))
        return; /* its answer time is noted all the same */
    long us = (long)(delay * 1e3);
    struct timeval tv = {us / 1000000, us % 1000000};
    evtimer_add(h->timer, &tv);
}

bool gw_front_hedge_sending(gw_front_req *p, const gw_upstream_cbs **cbs, void **ud)
{
    if (!p->hedge->sending)
        return false;
    *cbs = &copy_cbs;
    *ud = p->hedge;
    return true;
}

bool gw_front_hedge_primary_answered(gw_front_req *p, int status)
{
    struct gw_front_hedge *h = p->hedge;
    bool bad = failed(p->remote != NULL, status);
    if (status >= 200 && status < 300) /* a refusal's quick answer says nothing of the delay */
        lat_note(p);
    disarm(h);
    if (h->state != H_OUT) {
        h->state = H_ONE;
        return false;
    }
    if (!bad) { /* the first try answered first */
        drop_copy(h, GIVE_BACK);
        count(p, "won_primary");
        log_end(h, "won_primary");
        return false;
    }
    gw_upstream_cancel(p->up);
    p->up = NULL;
    gw_front_region_report(p, status == 429);
    promote(h);
    count(p, "failed");
    log_end(h, "primary_failed");
    return true;
}

bool gw_front_hedge_primary_failed(gw_front_req *p, bool at_fault)
{
    struct gw_front_hedge *h = p->hedge;
    disarm(h);
    if (h->state != H_OUT) {
        h->state = H_ONE;
        return false;
    }
    if (at_fault)
        gw_front_region_failed(p);
    else
        gw_front_probe_give_back(p);
    promote(h);
    count(p, "failed");
    log_end(h, "primary_failed");
    return true;
}

void gw_front_hedge_stop(gw_front_req *p)
{
    struct gw_front_hedge *h = p->hedge;
    if (!h)
        return;
    disarm(h);
    if (h->state == H_OUT) { /* the client left with both out */
        drop_copy(h, GIVE_BACK);
        log_end(h, "cancelled");
    }
}

void gw_front_hedge_free(gw_front_req *p)
{
    if (p->hedge)
        disarm(p->hedge);
    gw_mem_free(p->hedge);
    p->hedge = NULL;
}

const char *gw_front_hedge_said(const gw_front_req *p)
{
    return p->hedge ? p->hedge->outcome : NULL;
}

void gw_front_hedge_reload(gw_serve *g, const gw_routing_cfg *r)
{
    gw_routing_cfg *run = &g->cfg->routing;
    if (g->hedges && (r->hedge != run->hedge || r->hedge_share != run->hedge_share))
        g->hedges->tokens = 0;
    run->hedge = r->hedge;
    run->hedge_max_tokens = r->hedge_max_tokens;
    run->hedge_delay_ms = r->hedge_delay_ms;
    run->hedge_share = r->hedge_share;
}

void gw_front_hedges_free(gw_serve *g)
{
    free(g->hedges);
    g->hedges = NULL;
}
