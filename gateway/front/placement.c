/* Placement by intent, the front door's side (see placement.h): the policy
 * a request is routed by, the primary policy's states, the ring of recent
 * decisions, this region's carbon intensity and polling it, and per-request
 * energy. */
#include "gateway/front/placement.h"

#include "gateway/base/num.h"
#include "gateway/front/metrics.h"
#include "routing/router.h"

#include <dlfcn.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_TENANT_STATES 1024
#define CARBON_TIMEOUT_S 5
#define POWER_CACHE_MS 1000 /* an NVML reading stands this long */
#define MAX_POWER_WORKERS 256

typedef struct tenant_state {
    char tenant[GW_TENANT_NAME_MAX + 1];
    route_primary st;
} tenant_state;

typedef struct decision {
    int64_t at_ms; /* epoch */
    char id[48], tenant[GW_TENANT_NAME_MAX + 1], model[64], region[ROUTE_NAME_MAX];
    const char *policy, *intent;
    char reason[160];
} decision;

typedef struct power_cache {
    double watts; /* < 0: not measurable (no NVML, a MIG, an error) */
    int64_t at_ms;
} power_cache;

struct gw_placement {
    route_primary fleet;
    tenant_state *tenants;
    int n_tenants;
    decision ring[GW_PLACEMENT_RING];
    int ring_next, ring_n;
    /* carbon */
    double carbon; /* configured, then as last polled */
    char carbon_error[200];
    int64_t carbon_polled_ms; /* epoch of the last good figure; 0: none */
    struct event *carbon_timer;
    struct bufferevent *http;
    /* NVML */
    void *nvml;
    bool nvml_tried;
    int (*nvml_handle)(const char *uuid, void **dev);
    int (*nvml_index)(unsigned index, void **dev);
    int (*nvml_power)(void *dev, unsigned *mw);
    power_cache power[MAX_POWER_WORKERS];
};

static const gw_config *live_cfg(const gw_serve *g)
{
    return g->reloaded ? g->reloaded : g->cfg;
}

/* ---- the policy and who chose it ---- */

static route_policy to_route(gw_route_policy p)
{
    switch (p) {
    case GW_POLICY_COST: return ROUTE_COST;
    case GW_POLICY_CARBON: return ROUTE_CARBON;
    case GW_POLICY_PRIMARY: return ROUTE_PRIMARY;
    default: return ROUTE_LATENCY;
    }
}

static bool same_list(const route_primary *st, char *const *names, int n, double frac, int64_t hold)
{
    if (st->n != (n < ROUTE_MAX_PRIMARY ? n : ROUTE_MAX_PRIMARY) || st->return_frac != frac || st->hold_ms != hold)
        return false;
    for (int i = 0; i < st->n; i++)
        if (strcmp(st->names[i], names[i]))
            return false;
    return true;
}

/* The state of a list, begun anew when the list (a reload) changed. */
static route_primary *list_state(route_primary *st, char *const *names, int n, const gw_routing_cfg *rc)
{
    if (!same_list(st, names, n, rc->primary_return, rc->primary_hold_ms))
        route_primary_init(st, (const char *const *)names, n, rc->primary_return, rc->primary_hold_ms);
    return st;
}

static route_primary *primary_for(gw_serve *g, const gw_tenant_cfg *tc)
{
    gw_placement *pl = g->placement;
    const gw_config *c = live_cfg(g);
    if (!tc || !tc->n_primary)
        return c->routing.n_primary ? list_state(&pl->fleet, c->routing.primary, c->routing.n_primary, &c->routing)
                                    : NULL;
    for (int i = 0; i < pl->n_tenants; i++)
        if (!strcmp(pl->tenants[i].tenant, tc->name))
            return list_state(&pl->tenants[i].st, tc->primary, tc->n_primary, &c->routing);
    if (pl->n_tenants == MAX_TENANT_STATES)
        return NULL;
    tenant_state *t = realloc(pl->tenants, (size_t)(pl->n_tenants + 1) * sizeof(*t));
    if (!t)
        return NULL;
    pl->tenants = t;
    t = &pl->tenants[pl->n_tenants++];
    memset(t, 0, sizeof(*t));
    snprintf(t->tenant, sizeof(t->tenant), "%s", tc->name);
    return list_state(&t->st, tc->primary, tc->n_primary, &c->routing);
}

static const char *intent_names[] = {"fleet", "tenant", "header"};

bool gw_placement_policy(gw_front_req *p, const gw_tenant_cfg *tc, route_query *q)
{
    gw_serve *g = p->g;
    gw_route_policy pol = g->cfg->routing.policy;
    int intent = 0;
    if (tc && tc->policy != GW_POLICY_DEFAULT) {
        pol = tc->policy;
        intent = 1;
    }
    const char *h = gw_http_header_get(p->req, "x-infergate-policy");
    if (h) {
        gw_route_policy want = GW_POLICY_DEFAULT;
        for (int i = GW_POLICY_LATENCY; i <= GW_POLICY_PRIMARY; i++)
            if (!strcmp(h, gw_policy_name((gw_route_policy)i)))
                want = (gw_route_policy)i;
        if (want == GW_POLICY_DEFAULT) {
            gw_front_respond(p, 400, "invalid_request_error", "bad_policy", NULL, 0,
                             "x-infergate-policy must be latency, cost, carbon or primary");
            return false;
        }
        /* Without tenants (no auth, loopback only) the operator is the client. */
        if (live_cfg(g)->n_tenants && !(tc && (tc->allow_policies & (1u << want)))) {
            gw_front_respond(p, 403, "permission_error", "policy_not_allowed", NULL, 0,
                             "x-infergate-policy: %s is not allowed for tenant '%s' (its allow_policies)",
                             gw_policy_name(want), tc ? tc->name : "");
            return false;
        }
        pol = want;
        intent = 2;
    }
    q->policy = to_route(pol);
    q->primary = pol == GW_POLICY_PRIMARY ? primary_for(g, tc) : NULL;
    if (pol == GW_POLICY_PRIMARY && !q->primary) {
        /* (the config requires a list wherever a tenant may use primary) */
        gw_front_respond(p, 400, "invalid_request_error", "bad_policy", NULL, 0,
                         "x-infergate-policy: primary needs routing.primary, the preferred regions");
        return false;
    }
    p->intent_policy = gw_policy_name(pol);
    p->intent_source = intent_names[intent];
    return true;
}

void gw_placement_decided(gw_front_req *p, const route_query *q)
{
    gw_placement *pl = p->g->placement;
    route_decision *d = &p->route;
    size_t n = strlen(d->reason);
    snprintf(d->reason + n, sizeof(d->reason) - n, "; intent %s (%s)", p->intent_policy, p->intent_source);
    if (!pl)
        return;
    decision *e = &pl->ring[pl->ring_next];
    pl->ring_next = (pl->ring_next + 1) % GW_PLACEMENT_RING;
    if (pl->ring_n < GW_PLACEMENT_RING)
        pl->ring_n++;
    e->at_ms = gw_epoch_ms();
    e->policy = p->intent_policy;
    e->intent = p->intent_source;
    snprintf(e->id, sizeof(e->id), "%s", p->id);
    snprintf(e->tenant, sizeof(e->tenant), "%s", p->tenant);
    snprintf(e->model, sizeof(e->model), "%s", q->model ? q->model : "");
    snprintf(e->region, sizeof(e->region), "%s", d->n ? d->cand[0]->rec.name : "");
    snprintf(e->reason, sizeof(e->reason), "%s", d->reason);
}

static json_t *primary_json(const char *tenant, const route_primary *st)
{
    json_t *list = json_array(), *spilled = json_array();
    for (int i = 0; i < st->n; i++) {
        json_array_append_new(list, json_string(st->names[i]));
        if (st->spilled[i])
            json_array_append_new(spilled, json_string(st->names[i]));
    }
    return json_pack("{s:s?, s:o, s:o, s:s?, s:I, s:f, s:I}", "tenant", tenant, "regions", list, "spilled",
                     spilled, "current", st->current >= 0 ? st->names[st->current] : NULL, "switches",
                     (json_int_t)st->switches, "return_frac", st->return_frac, "hold_ms",
                     (json_int_t)st->hold_ms);
}

json_t *gw_placement_json(gw_serve *g)
{
    gw_placement *pl = g->placement;
    if (!pl)
        return json_null();
    json_t *ring = json_array(), *prim = json_array();
    for (int k = 1; k <= pl->ring_n; k++) {
        const decision *e = &pl->ring[(pl->ring_next - k + GW_PLACEMENT_RING) % GW_PLACEMENT_RING];
        json_array_append_new(ring, json_pack("{s:I, s:s, s:s, s:s, s:s, s:s, s:s, s:s}", "at_ms",
                                              (json_int_t)e->at_ms, "request_id", e->id, "tenant", e->tenant,
                                              "model", e->model, "policy", e->policy, "intent", e->intent,
                                              "region", e->region, "reason", e->reason));
    }
    if (pl->fleet.n)
        json_array_append_new(prim, primary_json(NULL, &pl->fleet));
    for (int i = 0; i < pl->n_tenants; i++)
        json_array_append_new(prim, primary_json(pl->tenants[i].tenant, &pl->tenants[i].st));
    const gw_config *c = g->cfg;
    json_t *carbon = json_pack("{s:f, s:s?, s:I, s:s?}", "configured_or_polled", pl->carbon, "source",
                               c->region.carbon_source, "polled_at_ms", (json_int_t)pl->carbon_polled_ms, "error",
                               pl->carbon_error[0] ? pl->carbon_error : NULL);
    return json_pack("{s:o, s:o, s:o}", "decisions", ring, "primary", prim, "carbon", carbon);
}

/* ---- carbon intensity ---- */

double gw_placement_carbon(const gw_serve *g)
{
    return g->placement ? g->placement->carbon : g->cfg->region.carbon;
}

double gw_placement_region_carbon(const gw_serve *g, const char *region)
{
    route_region *r = g->table && region && region[0] ? route_table_find(g->table, region) : NULL;
    return r ? r->rec.carbon : gw_placement_carbon(g);
}

/* A figure as a carbon_source gives it: the body, blanks around it, one
 * decimal number from 0 to ROUTE_MAX_CARBON. NULL when taken, else why not. */
static const char *parse_figure(const char *body, size_t len, double *out)
{
    while (len && (body[len - 1] == ' ' || body[len - 1] == '\n' || body[len - 1] == '\r' || body[len - 1] == '\t'))
        len--;
    while (len && (*body == ' ' || *body == '\n' || *body == '\r' || *body == '\t')) {
        body++;
        len--;
    }
    char buf[64];
    if (len == 0 || len >= sizeof(buf))
        return "not a number (the body must hold one figure in gCO2e/kWh)";
    memcpy(buf, body, len);
    buf[len] = '\0';
    if (strlen(buf) != len || !route_number_parse(buf, ROUTE_MAX_CARBON, out))
        return "not a number from 0 to 100000 gCO2e/kWh";
    return NULL;
}

const char *gw_carbon_parse(const char *buf, size_t n, bool http, double *out)
{
    if (n > GW_CARBON_BODY_MAX)
        return http ? "answer longer than 4096 bytes" : "longer than 4096 bytes";
    if (!http)
        return parse_figure(buf, n, out);
    const char *sp = memchr(buf, ' ', n), *body = NULL;
    for (size_t i = 0; i + 4 <= n && !body; i++)
        if (!memcmp(buf + i, "\r\n\r\n", 4))
            body = buf + i + 4;
    if (n < 7 || memcmp(buf, "HTTP/1.", 7) || !sp || (size_t)(buf + n - sp) < 4 || memcmp(sp + 1, "200", 3) ||
        !body)
        return "no HTTP 200 answer";
    return parse_figure(body, (size_t)(buf + n - body), out);
}

/* A poll's answer (buf, n; NULL with why when it failed before one). */
static void carbon_take(gw_serve *g, const char *buf, size_t n, bool http, const char *why)
{
    gw_placement *pl = g->placement;
    double v = 0;
    if (!why)
        why = gw_carbon_parse(buf, n, http, &v);
    if (why) {
        snprintf(pl->carbon_error, sizeof(pl->carbon_error), "%s", why);
        fprintf(stderr, "infergate: region.carbon_source %s: %s; the figure stays %g gCO2e/kWh\n",
                g->cfg->region.carbon_source, why, pl->carbon);
        return;
    }
    pl->carbon_error[0] = '\0';
    pl->carbon_polled_ms = gw_epoch_ms();
    if (v == pl->carbon)
        return;
    pl->carbon = v;
    gw_regions_publish(g); /* peers and this gateway's table see it now */
}

static void poll_file(gw_serve *g, const char *path)
{
    /* A local file of a few bytes: read on the loop, bounded. */
    char buf[GW_CARBON_BODY_MAX + 1];
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        char why[160];
        snprintf(why, sizeof(why), "cannot open: %s", strerror(errno));
        carbon_take(g, NULL, 0, false, why);
        return;
    }
    ssize_t n = read(fd, buf, sizeof(buf));
    close(fd);
    carbon_take(g, buf, n < 0 ? 0 : (size_t)n, false, n < 0 ? "cannot read" : NULL);
}

/* The HTTP/1.0 answer whole (the server closes), or failed. */
static void http_done(gw_serve *g, struct evbuffer *in, const char *failed)
{
    gw_placement *pl = g->placement;
    char buf[GW_CARBON_BODY_MAX + 1];
    size_t n = evbuffer_get_length(in);
    if (n > sizeof(buf))
        n = sizeof(buf); /* one past the bound: refused as too long */
    evbuffer_remove(in, buf, n);
    carbon_take(g, buf, n, true, failed);
    bufferevent_free(pl->http);
    pl->http = NULL;
}

static void http_read(struct bufferevent *bev, void *ud)
{
    gw_serve *g = ud;
    if (evbuffer_get_length(bufferevent_get_input(bev)) > GW_CARBON_BODY_MAX)
        http_done(g, bufferevent_get_input(bev), "answer longer than 4096 bytes");
}

static void http_event(struct bufferevent *bev, short what, void *ud)
{
    gw_serve *g = ud;
    if (what & BEV_EVENT_CONNECTED)
        return;
    http_done(g, bufferevent_get_input(bev),
              what & BEV_EVENT_EOF ? NULL : what & BEV_EVENT_TIMEOUT ? "timed out" : "connection failed");
}

static void poll_http(gw_serve *g, const char *url)
{
    gw_placement *pl = g->placement;
    if (pl->http)
        return; /* the last poll is still out */
    const char *hp = url + 7, *slash = strchr(hp, '/');
    char hostport[300], host[ROUTE_HOST_MAX];
    size_t len = slash ? (size_t)(slash - hp) : strlen(hp);
    int port;
    snprintf(hostport, sizeof(hostport), "%.*s", (int)len, hp);
    if (route_host_port(hostport, host, &port)) /* the loader checked it */
        return;
    pl->http = bufferevent_socket_new(g->base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (!pl->http)
        return;
    bufferevent_setcb(pl->http, http_read, NULL, http_event, g);
    struct timeval tv = {CARBON_TIMEOUT_S, 0};
    bufferevent_set_timeouts(pl->http, &tv, &tv);
    bufferevent_enable(pl->http, EV_READ);
    evbuffer_add_printf(bufferevent_get_output(pl->http), "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n",
                        slash ? slash : "/", hostport);
    if (bufferevent_socket_connect_hostname(pl->http, NULL, AF_UNSPEC, strcmp(host, "localhost") ? host : "127.0.0.1",
                                            port))
        http_done(g, bufferevent_get_input(pl->http), "connection failed");
}

static void on_carbon_timer(evutil_socket_t fd, short what, void *ud)
{
    gw_serve *g = ud;
    const char *src = g->cfg->region.carbon_source;
    if (!strncmp(src, "http://", 7))
        poll_http(g, src);
    else
        poll_file(g, src);
}

int gw_placement_start(gw_serve *g, char *err, size_t err_len)
{
    gw_placement *pl = calloc(1, sizeof(*pl));
    if (!pl) {
        snprintf(err, err_len, "out of memory");
        return -ENOMEM;
    }
    g->placement = pl;
    pl->fleet.current = -1;
    pl->carbon = g->cfg->region.carbon;
    if (!g->cfg->region.carbon_source || !g->cfg->region.name)
        return 0;
    int ms = g->cfg->region.carbon_poll_ms > 0 ? g->cfg->region.carbon_poll_ms : 60000;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    pl->carbon_timer = event_new(g->base, -1, EV_PERSIST, on_carbon_timer, g);
    if (!pl->carbon_timer || event_add(pl->carbon_timer, &tv)) {
        snprintf(err, err_len, "out of memory");
        return -ENOMEM;
    }
    on_carbon_timer(-1, 0, g);
    return 0;
}

void gw_placement_stop(gw_serve *g)
{
    gw_placement *pl = g->placement;
    if (!pl)
        return;
    if (pl->carbon_timer)
        event_free(pl->carbon_timer);
    if (pl->http)
        bufferevent_free(pl->http);
    if (pl->nvml)
        dlclose(pl->nvml);
    free(pl->tenants);
    free(pl);
    g->placement = NULL;
}

void gw_placement_note_busy(gw_front_req *p)
{
    gw_serve *g = p->g;
    route_region *r = gw_front_remote_region(p);
    if (!r && !p->remote && g->table && g->cfg->region.name)
        r = route_table_find(g->table, g->cfg->region.name);
    if (r)
        route_region_note_busy(r, gw_mono_ms());
}

/* ---- energy ---- */

/* A GPU's draw through NVML, dlopened on first use (nothing to link; a
 * machine without the driver has no library and every worker falls back
 * to its power_watts). A worker's device is a GPU UUID or a GPU index
 * (NVML's numbering: the supervisor gives CUDA the same PCI order). MIG
 * instances have no reading of their own: their workers use power_watts
 * too. -1 when not measured. */
static double nvml_watts(gw_placement *pl, const char *device)
{
    if (!pl->nvml_tried) {
        pl->nvml_tried = true;
        pl->nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
        int (*init)(void) = pl->nvml ? (int (*)(void))dlsym(pl->nvml, "nvmlInit_v2") : NULL;
        pl->nvml_handle = pl->nvml ? (int (*)(const char *, void **))dlsym(pl->nvml, "nvmlDeviceGetHandleByUUID") : NULL;
        pl->nvml_index = pl->nvml ? (int (*)(unsigned, void **))dlsym(pl->nvml, "nvmlDeviceGetHandleByIndex_v2") : NULL;
        pl->nvml_power = pl->nvml ? (int (*)(void *, unsigned *))dlsym(pl->nvml, "nvmlDeviceGetPowerUsage") : NULL;
        if (!init || !pl->nvml_handle || !pl->nvml_index || !pl->nvml_power || init() != 0) {
            pl->nvml_handle = NULL;
            pl->nvml_power = NULL;
        }
    }
    void *dev;
    unsigned mw;
    long index;
    if (!pl->nvml_power)
        return -1;
    if (!strncmp(device, "GPU-", 4)) {
        if (pl->nvml_handle(device, &dev) != 0)
            return -1;
    } else if (gw_parse_int(device, 0, 1 << 20, &index) != 0 || pl->nvml_index((unsigned)index, &dev) != 0) {
        return -1;
    }
    if (pl->nvml_power(dev, &mw) != 0)
        return -1;
    return mw / 1000.0;
}

static double worker_watts(gw_serve *g, const gw_worker_info *w)
{
    gw_placement *pl = g->placement;
    int64_t now = gw_mono_ms();
    if (w->index >= 0 && w->index < MAX_POWER_WORKERS && strcmp(w->device, "cpu")) {
        power_cache *c = &pl->power[w->index];
        if (!c->at_ms || now - c->at_ms >= POWER_CACHE_MS) {
            c->watts = nvml_watts(pl, w->device);
            c->at_ms = now;
        }
        if (c->watts > 0)
            return c->watts;
    }
    /* the config's worker entry: same model, and this device among its own (or auto) */
    const gw_config *cfg = g->cfg;
    for (int i = 0; i < cfg->n_workers; i++) {
        const gw_worker_cfg *wc = &cfg->workers[i];
        if (strcmp(wc->name, w->model))
            continue;
        for (int d = 0; d < wc->n_devices; d++)
            if (!strcmp(wc->devices[d], w->device) || !strcmp(wc->devices[d], "auto"))
                return wc->power_watts;
    }
    return 0;
}

/* A local worker's draw shared among the sequences it runs: 0 when the
 * worker is not known, or its power. */
static double local_watts(gw_serve *g, int worker)
{
    if (!g->placement || worker < 0 || worker >= gw_supervisor_count(g->sup))
        return 0;
    const gw_worker_info *w = gw_supervisor_worker(g->sup, worker);
    double watts = worker_watts(g, w);
    if (!(watts > 0))
        return 0;
    /* The approximation: the worker's draw is shared evenly among the
     * sequences it runs, and the count it last reported (a stats sample,
     * at most stats_interval_ms old, this request included) stands for the
     * whole of the request's time there. Idle draw between requests is
     * nobody's; a request's share of a batch's prefill is not weighed by
     * its tokens. */
    return watts / (w->running > 0 ? w->running : 1);
}

/* What dur_s of a local worker's share cost. */
static void local_energy(gw_serve *g, int worker, double dur_s, double *wh, double *gco2e)
{
    *wh = *gco2e = 0;
    double watts = dur_s > 0 ? local_watts(g, worker) : 0;
    if (!(watts > 0))
        return;
    *wh = watts * dur_s / 3600.0;
    *gco2e = *wh * gw_placement_region_carbon(g, g->cfg->region.name) / 1000.0;
}

int gw_placement_energy_trailer(gw_front_req *p, char *buf, size_t n)
{
    double wh, gco2e;
    local_energy(p->g, p->remote ? -1 : p->worker, gw_mono_s() - p->t_start, &wh, &gco2e);
    if (!(wh > 0))
        return -1;
    int len = snprintf(buf, n, "%.9g %.9g", wh, gco2e);
    return len > 0 && (size_t)len < n ? 0 : -1;
}

int gw_placement_power_header(gw_front_req *p, char *buf, size_t n)
{
    double watts = p->remote ? 0 : local_watts(p->g, p->worker);
    if (!(watts > 0))
        return -1;
    int len = snprintf(buf, n, "%.9g %.9g", watts, gw_placement_region_carbon(p->g, p->g->cfg->region.name));
    return len > 0 && (size_t)len < n ? 0 : -1;
}

/* "A B": two numbers within 0..max_a and 0..max_b. */
static const char *two_numbers(const char *v, double max_a, double max_b, double *a, double *b)
{
    char buf[64];
    size_t len = strlen(v);
    const char *sp = memchr(v, ' ', len);
    if (!sp || len >= sizeof(buf))
        return "not two numbers (\"A B\")";
    memcpy(buf, v, len + 1);
    buf[sp - v] = '\0';
    double x, y;
    if (!route_number_parse(buf, max_a, &x) || !route_number_parse(buf + (sp - v) + 1, max_b, &y))
        return "a number out of range";
    *a = x;
    *b = y;
    return NULL;
}

const char *gw_energy_parse(const char *v, double *wh, double *gco2e)
{
    return two_numbers(v, GW_ENERGY_MAX_WH, GW_ENERGY_MAX_WH * ROUTE_MAX_CARBON / 1000.0, wh, gco2e);
}

const char *gw_power_parse(const char *v, double *watts, double *carbon)
{
    return two_numbers(v, GW_POWER_MAX_W, ROUTE_MAX_CARBON, watts, carbon);
}

/* The value of header `name` in hs, parsed by parse into *a and *b; false
 * when absent or malformed (logged). */
static bool said(gw_front_req *p, const gw_http_header *hs, size_t n, const char *name,
                 const char *(*parse)(const char *, double *, double *), double *a, double *b)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(hs[i].name, name))
            continue;
        const char *why = parse(hs[i].value, a, b);
        if (why)
            fprintf(stderr, "infergate: region %s: %s '%.64s' not taken: %s\n", p->region, name, hs[i].value, why);
        return !why;
    }
    return false;
}

void gw_placement_energy_said(gw_front_req *p, const gw_http_header *hs, size_t n)
{
    if (p->etry.open && p->etry.remote &&
        said(p, hs, n, "x-infergate-energy", gw_energy_parse, &p->etry.wh, &p->etry.gco2e))
        p->etry.said = true;
}

void gw_placement_power_said(gw_front_req *p, const gw_http_header *hs, size_t n)
{
    double watts, carbon;
    if (p->etry.open && p->etry.remote && said(p, hs, n, "x-infergate-power", gw_power_parse, &watts, &carbon)) {
        p->etry.watts = watts;
        p->etry.carbon = carbon;
    }
}

/* p's try, as its target and t_sent say, is the open one. */
static void try_open(gw_front_req *p)
{
    p->etry.open = true;
    p->etry.remote = p->remote != NULL;
    p->etry.said = false;
    p->etry.worker = p->worker;
    snprintf(p->etry.region, sizeof(p->etry.region), "%s", p->region);
    p->etry.t0 = p->t_sent > 0 ? p->t_sent : gw_mono_s(); /* a hedge's copy: since it was sent */
    p->etry.watts = p->etry.carbon = 0;
}

void gw_placement_try_begin(gw_front_req *p)
{
    gw_placement_try_end(p);
    if (!p->forwarded) /* else its origin counts it */
        try_open(p);
}

void gw_placement_try_aside(gw_front_req *p)
{
    if (p->forwarded)
        return;
    struct gw_front_try own = p->etry;
    try_open(p);
    gw_placement_try_end(p);
    p->etry = own;
}

void gw_placement_try_end(gw_front_req *p)
{
    if (!p->etry.open)
        return;
    p->etry.open = false;
    gw_serve *g = p->g;
    double wh = 0, gco2e = 0, dur = gw_mono_s() - p->etry.t0;
    if (!p->etry.remote) {
        local_energy(g, p->etry.worker, dur, &wh, &gco2e);
    } else if (p->etry.said) {
        wh = p->etry.wh;
        gco2e = p->etry.gco2e;
    } else if (p->etry.watts > 0) { /* cut short: the rate it said, for as long as it served */
        wh = dur > 0 ? p->etry.watts * dur / 3600.0 : 0;
        gco2e = wh * p->etry.carbon / 1000.0;
    } else if (g->placement && dur > 0) {
        char region[2 * ROUTE_NAME_MAX + 1], labels[2 * ROUTE_NAME_MAX + 16];
        gw_metrics_escape(p->etry.region[0] ? p->etry.region : "-", region, sizeof(region));
        snprintf(labels, sizeof(labels), "region=\"%s\"", region);
        gw_metrics_add(g->metrics, "infergate_energy_unknown_tries_total", labels, 1);
    }
    if (!g->placement || !(wh > 0))
        return;
    p->energy_wh += wh;
    p->gco2e += gco2e;
    const char *served_by = p->etry.remote ? p->etry.region : g->cfg->region.name;
    char tenant[2 * GW_TENANT_NAME_MAX + 1], region[2 * ROUTE_NAME_MAX + 1], labels[300];
    gw_metrics_escape(p->tenant[0] ? p->tenant : "-", tenant, sizeof(tenant));
    gw_metrics_escape(served_by && served_by[0] ? served_by : "-", region, sizeof(region));
    snprintf(labels, sizeof(labels), "tenant=\"%s\",region=\"%s\"", tenant, region);
    gw_metrics_add(g->metrics, "infergate_energy_wh_total", labels, wh);
    if (gco2e > 0)
        gw_metrics_add(g->metrics, "infergate_gco2e_total", labels, gco2e);
    gw_front_spend_energy(p, p->etry.region, wh, gco2e);
}

void gw_placement_energy(gw_front_req *p)
{
    gw_placement_try_end(p);
}
