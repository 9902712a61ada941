/* Where a request goes: a local worker (no region section, or a request
 * another region forwarded here), else the routing decision's candidate
 * regions in order, held to the residency and price the request needs.
 * And failover: a try that fails before the first response byte moves
 * on, to a sibling worker or the next candidate, while the retry budget
 * lasts; a remote region hears how each request it took went, which is
 * what ejects it. */
#include "gateway/front/health.h"
#include "gateway/front/placement.h"
#include "gateway/front/request_internal.h"

#include "gateway/front/route_events.h"
#include "routing/router.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TRIES 2          /* local workers: a failure before the first response byte is retried once */
#define RETRY_TOKENS_MAX 100 /* the retry budget saves up at most this many retries */
#define SESSION_MAX 256      /* bytes of an x-infergate-session */

/* ---- the first try ---- */

/* Residency the request needs: the tenant's tags, narrowed further by the
 * x-infergate-residency header (comma-separated). Returns the count, or -1
 * for a header with too many or malformed tags. */
int gw_front_need_tags(gw_front_req *p, const gw_tenant_cfg *tc, char *buf, size_t cap, const char **need)
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
static void keep_need(gw_front_req *p, const char *const *need, int n)
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
static const char *residency_missing(gw_front_req *p, char *buf, size_t cap)
{
    const char *need[MAX_NEED_TAGS];
    int n = gw_front_need_tags(p, NULL, buf, cap, need);
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

/* The prompt's size as the cache-aware choice prices it: its chunks'
 * bytes (gw_prefix_bytes), else the whole body's. */
static double prompt_bytes(const gw_front_req *p)
{
    return p->chain.n ? gw_prefix_bytes(&p->chain, p->chain.n) : (double)p->req->body_len;
}

/* A local worker for the request, other than `exclude`: with several to
 * choose from, the one likeliest to hold its prompt's prefix, weighed
 * against its queue, and the session's among near-equal ones
 * (gw_supervisor_pick_for). The chain is hashed once per request. */
static void hash_chain(gw_front_req *p)
{
    if (p->chain_done)
        return;
    gw_prefix_chain_of(p->req->body, p->req->body_len, &p->chain);
    p->chain_done = true;
    if (!p->session)
        p->session = p->chain.user;
}

static int pick_local(gw_front_req *p, int exclude)
{
    gw_supervisor *sup = p->g->sup;
    if (gw_supervisor_count(sup) < 2 || !p->g->cfg->routing.cache_aware)
        return gw_supervisor_pick(sup, p->model, exclude);
    hash_chain(p);
    return gw_supervisor_pick_for(sup, p->model, exclude, &p->chain, prompt_bytes(p), p->session, NULL);
}

/* x-infergate-session: who the client says it is, for affinity; false
 * (answered 400) when malformed. */
static bool take_session(gw_front_req *p)
{
    const char *h = gw_http_header_get(p->req, "x-infergate-session");
    if (!h)
        return true;
    size_t n = strlen(h);
    if (n == 0 || n > SESSION_MAX) {
        gw_front_respond(p, 400, "invalid_request_error", "bad_session", NULL, 0,
                         "x-infergate-session must be 1 to %d bytes", SESSION_MAX);
        return false;
    }
    p->session = gw_prefix_hash(0, h, n);
    return true;
}

/* Sends the request to the next usable candidate region; false when none
 * is left. A local candidate without a ready worker is passed over. */
/* The request's size as the cost policy and the price cap count it (what
 * the tenant is charged for now, gw_front_limit): the body's bytes / 4 and
 * the answer's maximum. */
static void request_size(const gw_front_req *p, route_query *q)
{
    q->prompt_tokens = (int)(p->req->body_len / 4 < INT_MAX ? p->req->body_len / 4 : INT_MAX);
    q->output_tokens = (int)p->charged_completion;
}

static bool try_next(gw_front_req *p)
{
    gw_serve *g = p->g;
    route_query q = {
        .model = p->model, .need_tags = p->need, .n_need_tags = p->n_need, .max_price = p->max_price};
    request_size(p, &q); /* the cap is judged as route_decide judged it */
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
        double worst = gw_front_worst_cost(p, r->rec.price_in, r->rec.price_out);
        if (p->max_cost > 0 && worst > p->max_cost) {
            if (probe && !r->local)
                route_region_release_probe(r, p->probe_claim);
            p->probe = false;
            if (!p->cost_skipped++ || worst < p->min_worst)
                p->min_worst = worst;
            continue;
        }
        if (r->local) {
            int w = pick_local(p, p->remote ? -1 : p->worker);
            if (w < 0)
                continue;
            p->remote = NULL;
            p->worker = w;
        } else {
            if (!*gw_regions_endpoint(g, r)) {
                if (probe)
                    route_region_release_probe(r, p->probe_claim);
                continue;
            }
            p->remote = r;
            p->remote_id = id;
            p->worker = -1;
        }
        snprintf(p->region, sizeof(p->region), "%s", r->rec.name);
        p->price_in = r->rec.price_in;
        p->price_out = r->rec.price_out;
        gw_front_send_upstream(p);
        return true;
    }
    return false;
}

/* x-infergate-max-cost: the most the request may cost, into p->max_cost;
 * false (answered 400) when malformed. */
static bool read_max_cost(gw_front_req *p)
{
    const char *h = gw_http_header_get(p->req, "x-infergate-max-cost");
    if (!h)
        return true;
    char *end;
    double v = strtod(h, &end);
    if (end == h || *end || !(v > 0) || !isfinite(v)) {
        gw_front_respond(p, 400, "invalid_request_error", "bad_max_cost", NULL, 0,
                         "x-infergate-max-cost must be a positive amount, in the prices' currency");
        return false;
    }
    p->max_cost = v;
    return true;
}

/* 400 max_cost_exceeded: the request's worst case is over its
 * x-infergate-max-cost at the price of every region that could serve it
 * (the cheapest of them: worst). */
static void respond_over_max_cost(gw_front_req *p, double worst)
{
    gw_front_respond(
        p, 400, "invalid_request_error", "max_cost_exceeded", NULL, 0,
        "the worst case of this request (%.0f prompt and %.0f completion tokens) costs %.6g at the "
        "price of %s, over its x-infergate-max-cost of %.6g",
        p->charged - p->charged_completion, p->charged_completion, worst,
        p->cost_skipped > 1 ? "the cheapest region that could serve it" : "the region that would serve it",
        p->max_cost);
}

/* Local workers only (no region section, or a request forwarded to us);
 * else the routing decision and its first candidate. */
void gw_front_dispatch(gw_front_req *p)
{
    gw_serve *g = p->g;
    if (gw_front_replay_refuse_client(p) || !read_max_cost(p))
        return;
    if (!p->forwarded && gw_http_header_get(p->req, GW_HEALTH_HEADER)) {
        gw_front_respond(p, 400, "invalid_request_error", "internal_header", NULL, 0,
                         GW_HEALTH_HEADER " is the gateways' own header (active health checks): only a peer "
                         "region may send it");
        return;
    }
    g->retry_tokens += g->cfg->routing.retry_budget;
    if (g->retry_tokens > RETRY_TOKENS_MAX)
        g->retry_tokens = RETRY_TOKENS_MAX;
    if (!take_session(p))
        return;
    if (!gw_regions_enabled(g) || p->forwarded) {
        /* A gateway with no region has no tags: a request that needs
         * some, by its header or its tenant's residency, cannot be held to
         * them here (a forwarded one was, by the region that chose us). The
         * config refuses such a tenant without a region section, at start
         * and at a reload; this holds whatever the config said. */
        const char *need[MAX_NEED_TAGS];
        char buf[512];
        if (!p->forwarded && !gw_regions_enabled(g) &&
            gw_front_need_tags(p, gw_serve_tenant_cfg(g, p->tenant), buf, sizeof(buf), need) != 0) {
            gw_front_respond(p, 400, "invalid_request_error", "bad_residency", NULL, 0,
                             "residency cannot be met: this gateway has no region section, so no tags");
            return;
        }
        const char *missing = p->forwarded ? residency_missing(p, buf, sizeof(buf)) : NULL;
        if (missing) { /* the origin fails over on 421 */
            gw_front_respond(p, 421, "invalid_request_error", "misdirected_request", NULL, 0,
                             "region %s does not have the residency tag '%s' this request needs",
                             g->cfg->region.name ? g->cfg->region.name : "-", missing);
            return;
        }
        if (!gw_supervisor_serves(g->sup, p->model)) {
            gw_front_respond(p, 404, "invalid_request_error", "model_not_found", "model", 0,
                             "the model '%s' does not exist", p->model);
            return;
        }
        if (g->cfg->region.name)
            snprintf(p->region, sizeof(p->region), "%s", g->cfg->region.name);
        p->price_in = g->cfg->region.price_in; /* 0 without a region section */
        p->price_out = g->cfg->region.price_out;
        double worst = gw_front_worst_cost(p, p->price_in, p->price_out);
        if (p->max_cost > 0 && worst > p->max_cost) {
            p->cost_skipped = 1;
            respond_over_max_cost(p, worst);
            return;
        }
        p->worker = pick_local(p, -1);
        if (p->worker < 0) {
            gw_front_respond(p, 503, "server_error", "no_worker_ready", NULL, 1,
                             "no worker for model '%s' is ready", p->model);
            return;
        }
        gw_front_send_upstream(p);
        return;
    }
    const gw_tenant_cfg *tc = gw_serve_tenant_cfg(g, p->tenant);
    if (p->tenant[0] && !tc) {
        /* A reload dropped the tenant while its limit was checked: without
         * its residency the request could go anywhere. */
        gw_front_respond(p, 401, "invalid_request_error", "invalid_api_key", NULL, 0,
                         "tenant '%s' was removed by a configuration reload", p->tenant);
        return;
    }
    const char *need[MAX_NEED_TAGS];
    char buf[512];
    int n_need = gw_front_need_tags(p, tc, buf, sizeof(buf), need);
    if (n_need < 0) {
        gw_front_respond(p, 400, "invalid_request_error", "bad_residency", NULL, 0,
                         "x-infergate-residency must be at most %d comma-separated tags", MAX_NEED_TAGS);
        return;
    }
    double max_price = tc ? tc->max_price : 0;
    const char *mp = gw_http_header_get(p->req, "x-infergate-max-price");
    if (mp) {
        char *end;
        double v = strtod(mp, &end);
        if (end == mp || *end || !(v > 0)) {
            gw_front_respond(p, 400, "invalid_request_error", "bad_max_price", NULL, 0,
                             "x-infergate-max-price must be a positive price per million tokens");
            return;
        }
        /* A request may lower its tenant's cap, never raise it. */
        if (max_price <= 0 || v < max_price)
            max_price = v;
    }
    keep_need(p, need, n_need);
    p->max_price = max_price;
    if (g->cfg->routing.cache_aware)
        hash_chain(p);
    route_query q = {
        .model = p->model,
        .need_tags = p->need,
        .n_need_tags = p->n_need,
        .max_price = max_price,
        .slo_ms = tc && tc->slo_ms > 0 ? tc->slo_ms : g->cfg->routing.slo_ms,
        .now_ms = gw_mono_ms(),
        .spread = g->cfg->routing.spread,
        .chain = p->chain_done ? &p->chain : NULL,
        .session = p->session,
    };
    request_size(p, &q);
    if (!gw_placement_policy(p, tc, &q))
        return;
    int n_cand = route_decide(g->table, &q, &p->route);
    gw_placement_decided(p, &q);
    gw_route_events_preferred(g, &q, p->route.preferred);
    if (n_cand == 0) {
        const route_decision *d = &p->route;
        if (d->out_model == route_table_count(g->table))
            gw_front_respond(p, 404, "invalid_request_error", "model_not_found", "model", 0,
                             "no region serves the model '%s'", p->model);
        else
            gw_front_respond(
                p, 503, "server_error", "no_region", NULL, 1,
                "no region may serve this request now (left out: %d residency, %d price, %d unhealthy, "
                "%d stale, %d ejected)",
                d->out_residency, d->out_price, d->out_unhealthy, d->out_stale, d->out_ejected);
        return;
    }
    p->cand = 0;
    if (try_next(p))
        return;
    if (p->cost_skipped)
        respond_over_max_cost(p, p->min_worst);
    else
        gw_front_respond(p, 503, "server_error", "no_worker_ready", NULL, 1,
                         "no region has a ready worker for '%s'", p->model);
}

/* ---- failover ---- */

/* The region tried, if the table still holds it (a stream may outlive a
 * region pruned for silence, and its slot go to another). */
route_region *gw_front_remote_region(const gw_front_req *p)
{
    return p->remote && route_region_is(p->remote, p->remote_id) ? p->remote : NULL;
}

/* The remote region being tried answered the request, or failed it: its
 * failures are what ejects it; a probe's outcome decides its ejection,
 * once (a stream that fails long after its answer must not decide a later
 * probe, held by another request), and only while its claim is the one out. */
void gw_front_region_report(gw_front_req *p, bool ok)
{
    if (gw_front_remote_region(p) && p->probe)
        route_region_report_probe(p->g->table, p->remote, ok, gw_mono_ms(), p->probe_claim);
    else if (gw_front_remote_region(p))
        route_region_report(p->g->table, p->remote, ok, gw_mono_ms());
    p->probe = false;
}

/* A probe this request holds and will not report: the next request's. */
void gw_front_probe_give_back(gw_front_req *p)
{
    if (p->probe && gw_front_remote_region(p))
        route_region_release_probe(p->remote, p->probe_claim);
    p->probe = false;
}

void gw_front_region_failed(gw_front_req *p)
{
    gw_front_region_report(p, false);
}

/* Sends the request again, to local worker w: a retry spent. */
static bool resend_local(gw_front_req *p, int w)
{
    p->g->retry_tokens -= 1;
    p->worker = w;
    gw_front_send_upstream(p);
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
bool gw_front_retry(gw_front_req *p, bool region_at_fault)
{
    gw_serve *g = p->g;
    if (region_at_fault)
        gw_front_region_failed(p);
    else
        gw_front_probe_give_back(p); /* refused unprocessed */
    if (!p->stream || g->retry_tokens < 1)
        return false;
    int other = !p->remote && p->worker >= 0 && p->local_tries < MAX_TRIES
                    ? pick_local(p, p->worker)
                    : -1;
    if (other >= 0)
        return resend_local(p, other);
    if (p->route.n) {
        char from[ROUTE_NAME_MAX];
        snprintf(from, sizeof(from), "%s", p->region[0] ? p->region : "local");
        g->retry_tokens -= 1;
        if (try_next(p)) {
            gw_route_events_failover(g, from, p->region, p->error_kind ? p->error_kind : "busy");
            return true;
        }
        g->retry_tokens += 1; /* nowhere left to go: no retry was spent */
    }
    return false;
}

bool gw_front_send_next(gw_front_req *p)
{
    int other = !p->remote && p->worker >= 0 && p->local_tries < MAX_TRIES ? pick_local(p, p->worker) : -1;
    if (other >= 0) {
        p->worker = other;
        gw_front_send_upstream(p);
        return true;
    }
    return p->route.n && try_next(p);
}

/* A local worker too small for the request (its 503 kv_cache_too_small)
 * hands it to a sibling with a larger cache, once: one the same size
 * would say the same, and other regions' workers, as a rule, too. */
bool gw_front_retry_on_larger(gw_front_req *p)
{
    gw_serve *g = p->g;
    if (!p->stream || g->retry_tokens < 1 || p->local_tries >= MAX_TRIES)
        return false;
    int w = gw_supervisor_pick_larger(g->sup, p->model, p->worker);
    return w >= 0 && resend_local(p, w);
}
