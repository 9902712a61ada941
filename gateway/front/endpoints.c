/* A request comes in: its id, who sends it (an API key, a peer region
 * over mutual TLS, or anyone where no key is configured), and the endpoint
 * table: health, readiness, metrics, /v1/models, the routing table for
 * admins, and completions, whose body is read for the few fields routing
 * needs (model, max_tokens) before limits.c and dispatch.c take them on.
 * The body itself goes to the worker unchanged. */
#include "gateway/front/request_internal.h"

#include "gateway/front/body_fields.h"
#include "gateway/front/health.h"
#include "gateway/base/mem.h"

#include "routing/router.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* The request's id: the client's x-request-id when it is a plain one (it
 * goes into headers and the log), else one made here. */
static void request_id(gw_front_req *p, const gw_http_request *r)
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

/* ---- who sends it ---- */

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
    char cookie[512];
    *t = NULL;
    if (gw_http_header_get(r, "x-infergate-hop"))
        return r->peer_verified ? SENDER_PEER : SENDER_BAD_PEER;
    if (gw_tenants_open(g->tenants))
        return SENDER_ANYONE;
    const char *a = gw_http_header_get(r, "authorization"), *key;
    if (a && strncasecmp(a, "Bearer ", 7) == 0)
        key = a + 7;
    else if (!a && gw_front_path_is(r, "/dashboard") && (key = gw_dashboard_key(r, cookie, sizeof(cookie))))
        ; /* a browser sends no header: its login cookie */
    else
        return SENDER_NO_KEY;
    *t = gw_tenants_auth(g->tenants, key);
    return *t ? SENDER_TENANT : SENDER_BAD_KEY;
}

static bool refused(sender who)
{
    return who == SENDER_NO_KEY || who == SENDER_BAD_KEY || who == SENDER_BAD_PEER;
}

/* A request another region's gateway forwarded: accepted only over a
 * connection whose client certificate verified (mutual TLS), and then the
 * tenant it names is taken as given. */
static void accept_forwarded(gw_front_req *p)
{
    const char *tenant = gw_http_header_get(p->req, "x-infergate-tenant");
    p->forwarded = true;
    p->health_check = gw_http_header_get(p->req, GW_HEALTH_HEADER) != NULL;
    if (tenant && strlen(tenant) < sizeof(p->tenant))
        snprintf(p->tenant, sizeof(p->tenant), "%s", tenant);
}

/* The answer to a sender identify() refused. */
static void respond_refused(gw_front_req *p, sender who)
{
    const gw_http_request *r = p->req;
    if (who != SENDER_BAD_PEER && gw_front_path_is(r, "/dashboard") && !gw_http_header_get(r, "authorization") &&
        (!strcmp(r->method, "GET") || !strcmp(r->method, "HEAD")))
        gw_dashboard_login_page(p, 401, who == SENDER_BAD_KEY ? "That key is no longer valid." : NULL);
    else if (who == SENDER_BAD_PEER)
        gw_front_respond(
            p, 403, "permission_error", "peer_not_authenticated", NULL, 0,
            "forwarded requests (x-infergate-hop) are accepted only from peer gateways with a verified "
            "client certificate");
    else if (who == SENDER_NO_KEY)
        gw_front_respond(p, 401, "invalid_request_error", "missing_api_key", NULL, 0,
                         "missing API key: send it as 'Authorization: Bearer KEY'");
    else
        gw_front_respond(p, 401, "invalid_request_error", "invalid_api_key", NULL, 0, "invalid API key");
}

/* ---- endpoints ---- */

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
static void handle_models(gw_front_req *p, gw_tenant *t, const char *one, size_t one_len)
{
    gw_serve *g = p->g;
    model_list l = {.data = json_array(), .t = t, .one = one, .one_len = one_len, .created = g->started};
    const char *need[MAX_NEED_TAGS];
    char buf[512];
    int n_need = 0;
    if ((n_need = gw_front_need_tags(p, gw_serve_tenant_cfg(g, p->tenant), buf, sizeof(buf), need)) < 0) {
        json_decref(l.data);
        gw_front_respond(p, 400, "invalid_request_error", "bad_residency", NULL, 0,
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
        gw_front_respond(p, 404, "invalid_request_error", "model_not_found", "model", 0,
                         "the model '%.*s' does not exist", (int)(one_len > 128 ? 128 : one_len), one);
        return;
    }
    json_t *o = one ? l.found : json_pack("{s:s, s:O}", "object", "list", "data", l.data);
    json_decref(l.data);
    char *body = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (body)
        gw_front_respond_plain(p, 200, "application/json", body, strlen(body));
    else
        gw_http_reset(p->stream);
    free(body);
}

/* POST /admin/drain[?deadline_s=N]: the gateway drains itself (as on
 * SIGTERM or SIGUSR1) with N seconds (1..86400; default drain_grace_s)
 * for what is in flight: a spot instance told it will be reclaimed. 202,
 * then the drain: this answer is one of the streams that finish. */
static void handle_drain(gw_front_req *p)
{
    gw_serve *g = p->g;
    long grace = g->cfg->drain_grace_s;
    const char *q = strchr(p->req->path, '?');
    if (q && !strncmp(q + 1, "deadline_s=", 11)) {
        char *end;
        grace = strtol(q + 12, &end, 10);
        if (end == q + 12 || (*end && *end != '&') || grace < 1 || grace > 86400) {
            gw_front_respond(p, 400, "invalid_request_error", "invalid_value", "deadline_s", 0,
                             "deadline_s must be 1 to 86400 seconds");
            return;
        }
    }
    char body[96];
    int n = snprintf(body, sizeof(body), "{\"draining\":true,\"deadline_s\":%ld,\"open_streams\":%zu}", grace,
                     gw_http_server_active_streams(g->http));
    bool was = g->draining;
    gw_front_respond_plain(p, was ? 409 : 202, "application/json", body, (size_t)n);
    gw_serve_drain(g, (int)grace, "POST /admin/drain");
}

/* /v1/regions and /dashboard: the routing table, for admins. */
static void handle_regions(gw_front_req *p, bool html)
{
    size_t len = 0;
    char *body = html ? gw_regions_dashboard(p->g, &len) : gw_regions_json(p->g, &len);
    const char *q = strstr(p->req->path, "?key=");
    if (body && html)
        gw_dashboard_page(p, body, len, q && !gw_http_header_get(p->req, "authorization") ? q + 5 : NULL);
    else if (body)
        gw_front_respond_plain(p, 200, "application/json", body, len);
    else
        gw_http_reset(p->stream);
    free(body);
}

/* POST /v1/completions and /v1/chat/completions: the model the body
 * names, checked against what the tenant may use; then the tenant's
 * limits, or straight to dispatch without a tenant (no keys, or a peer). */
static void handle_completion(gw_front_req *p, gw_tenant *t)
{
    const gw_http_request *r = p->req;
    gw_body_fields f;
    char why[128];
    int rc = gw_body_fields_scan(r->body, r->body_len, &f, why, sizeof(why));
    if (rc == -ENOMEM) {
        gw_front_respond(p, 503, "server_error", NULL, NULL, 1, "out of memory reading the request");
        return;
    }
    if (rc) {
        gw_front_respond(p, 400, "invalid_request_error", NULL, NULL, 0, "invalid JSON body: %s", why);
        return;
    }
    if (!f.has_model || f.model_len == 0) {
        gw_front_respond(p, 400, "invalid_request_error", NULL, "model", 0,
                         "'model' must be a non-empty string");
        return;
    }
    if (f.model_len >= sizeof(p->model)) { /* longer than any model name can be */
        gw_front_respond(p, 404, "invalid_request_error", "model_not_found", "model", 0,
                         "the model '%.64s...' does not exist", f.model);
        return;
    }
    memcpy(p->model, f.model, f.model_len + 1);
    p->completion = true;
    p->stream_asked = f.stream;
    p->max_tokens = f.max_tokens;

    if (t && !gw_tenant_allows_model(t, p->model)) {
        gw_front_respond(p, 403, "permission_error", "model_not_allowed", "model", 0,
                         "tenant '%s' may not use model '%s'", p->tenant, p->model);
        return;
    }
    if (!t) {
        gw_front_dispatch(p);
        return;
    }
    gw_front_limit(p, f.max_tokens, f.prompt_ids);
}

void gw_front_on_request(void *ud, gw_http_stream *s, const gw_http_request *r)
{
    gw_serve *g = ud;
    gw_front_req *p = gw_mem_alloc(sizeof(*p));
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
    p->prompt_tokens = -1;
    p->t_start = gw_mono_s();
    request_id(p, r);
    gw_http_set_user(s, p);

    size_t plen = strcspn(r->path, "?");
    /* HEAD is GET without the body, which the HTTP layer leaves out. */
    bool get = !strcmp(r->method, "GET") || !strcmp(r->method, "HEAD"), post = !strcmp(r->method, "POST");
#define PATH_IS(x) gw_front_path_is(r, x)
    if ((PATH_IS("/healthz") || PATH_IS("/readyz")) && !get) {
        gw_front_respond_not_allowed(p, "GET, HEAD");
        return;
    }
    if (PATH_IS("/healthz") && get) {
        gw_front_respond_plain(p, 200, "application/json", "{\"status\":\"ok\"}", 15);
        return;
    }
    if (PATH_IS("/readyz") && get) {
        int n = gw_supervisor_ready_count(g->sup);
        char body[96];
        int len = snprintf(body, sizeof(body), "{\"ready\":%s,\"workers_ready\":%d,\"workers\":%d}",
                           n > 0 && !g->draining ? "true" : "false", n, gw_supervisor_count(g->sup));
        gw_front_respond_plain(p, n > 0 && !g->draining ? 200 : 503, "application/json", body, (size_t)len);
        return;
    }
    if (PATH_IS("/dashboard/login")) { /* the key is in the form */
        gw_dashboard_login(p);
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
            gw_front_respond(p, 404, "invalid_request_error", "not_found", NULL, 0,
                             "only completions are forwarded");
        return;
    }
    if (t)
        snprintf(p->tenant, sizeof(p->tenant), "%s", gw_tenant_name(t));
    if ((PATH_IS("/v1/regions") || PATH_IS("/dashboard")) && get) {
        if (t && !gw_tenant_admin(t)) {
            gw_front_respond(p, 403, "permission_error", "admin_only", NULL, 0, "%.*s needs an admin key",
                             (int)plen, r->path);
            return;
        }
        handle_regions(p, PATH_IS("/dashboard"));
        return;
    }
    if (PATH_IS("/metrics") && get) {
        if (t && !gw_tenant_admin(t)) {
            gw_front_respond(p, 403, "permission_error", "admin_only", NULL, 0,
                             "/metrics needs an admin key");
            return;
        }
        gw_serve_metrics_workers(g);
        size_t len;
        char *body = gw_metrics_render(g->metrics, &len);
        if (body)
            gw_front_respond_plain(p, 200, "text/plain; version=0.0.4", body, len);
        else
            gw_http_reset(s);
        free(body);
        return;
    }
    if (PATH_IS("/v1/models") && get) {
        handle_models(p, t, NULL, 0);
        return;
    }
    if (PATH_IS("/admin/drain") && post) {
        if (t && !gw_tenant_admin(t))
            gw_front_respond(p, 403, "permission_error", "admin_only", NULL, 0, "/admin/drain needs an admin key");
        else
            handle_drain(p);
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
    if (PATH_IS("/v1/completions") || PATH_IS("/v1/chat/completions") || PATH_IS("/admin/drain"))
        gw_front_respond_not_allowed(p, "POST");
    else if (PATH_IS("/v1/models") || model_path || PATH_IS("/metrics") || PATH_IS("/v1/regions") ||
             PATH_IS("/dashboard"))
        gw_front_respond_not_allowed(p, "GET, HEAD");
    else
        gw_front_respond(p, 404, "invalid_request_error", "not_found", NULL, 0, "no route for %s %.*s",
                         r->method, (int)plen, r->path);
#undef PATH_IS
}

/* A request refused whatever its body says is answered from its head, so
 * that a client without a valid key cannot make the gateway take in (and
 * hold) a body. The answer is on_request's own. A request that passes is
 * identified again when whole (one more key hash): a SIGHUP between the two
 * may have replaced the tenants, so the first answer is not kept. */
void gw_front_on_head(void *ud, gw_http_stream *s, const gw_http_request *r)
{
    gw_tenant *t;
    if (gw_front_path_is(r, "/dashboard/login") ? !gw_dashboard_login_fits(r) : refused(identify(ud, r, &t)))
        gw_front_on_request(ud, s, r);
}
