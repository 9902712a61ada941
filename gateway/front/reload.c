/* SIGHUP for `infergate serve`: the config file read again, and what may
 * change without a restart taken from it (tenants and keys, limits, the
 * routing policy, timeouts, the drain grace, TLS certificates); the access
 * log opened again, for logrotate. The running config keeps the rest,
 * and says what it kept. */
#include "gateway/front/serve_internal.h"

#include "gateway/front/access_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const gw_tenant_cfg *gw_serve_tenant_cfg(const gw_serve *g, const char *name)
{
    const gw_config *c = g->reloaded ? g->reloaded : g->cfg;
    for (int i = 0; i < c->n_tenants; i++)
        if (!strcmp(c->tenants[i].name, name))
            return &c->tenants[i];
    return NULL;
}

/* A rotated (renamed) access log file is left behind; one that cannot be
 * opened again keeps the old one in use. */
static void reopen_access_log(gw_serve *g)
{
    if (!g->own_access_log)
        return;
    int rc = gw_alog_reopen(g->alog, g->cfg->access_log);
    if (rc)
        fprintf(stderr, "infergate: SIGHUP: access log %s: %s; still writing the old file\n",
                g->cfg->access_log, strerror(-rc));
}

/* Certificates are read again on every reload, so that one renewed in
 * place (certbot, cert-manager) is served without the restart that
 * drains; a listener whose files do not load keeps what it had. Listeners
 * were started in the config's order (start_listeners). So are peer_tls's
 * files, for the connections to other regions made from then on. Returns
 * how many listeners took new ones; *peer whether peer_tls did. */
static int reload_tls(gw_serve *g, const gw_config *c, bool *peer)
{
    int n = 0;
    const gw_peer_tls_cfg *pt = &g->cfg->peer_tls;
    *peer = false;
    if ((pt->ca || pt->cert) && gw_config_peer_tls_eq(g->cfg, c)) {
        char err[512];
        if (gw_upstream_set_tls(g->pool, pt->ca, pt->cert, pt->key, err, sizeof(err)))
            fprintf(stderr, "infergate: reload: peer_tls keeps its certificates: %s\n", err);
        else
            *peer = true;
    }
    for (int i = 0; i < g->cfg->n_listen && i < c->n_listen; i++) {
        const gw_listen_cfg *run = &g->cfg->listen[i], *l = &c->listen[i];
        if (!run->tls_cert || !l->tls_cert || strcmp(run->address, l->address) != 0)
            continue; /* a restart's business, said by gw_config_restart_diff */
        char err[512];
        if (gw_http_server_set_tls(g->http, i, l->tls_cert, l->tls_key, l->tls_client_ca,
                                   (const char *const *)l->tls_peer_names, l->n_tls_peer_names, err,
                                   sizeof(err)))
            fprintf(stderr, "infergate: reload: listener %s keeps its certificate: %s\n", l->address, err);
        else
            n++;
    }
    return n;
}

/* Tenants, keys, limits, the routing policy, the drain grace and TLS
 * certificates change; the rest stays as started (say which when it
 * differs). A config that does not load changes nothing. */
void gw_serve_reload(gw_serve *g)
{
    reopen_access_log(g);
    /* the listeners are gone and nothing new is taken: a reload would
     * only report their certificates as not loaded */
    if (g->draining) {
        fprintf(stderr, "infergate: SIGHUP while draining: log reopened, config not reloaded\n");
        return;
    }
    if (!g->cfg->path) {
        fprintf(stderr, "infergate: SIGHUP: running on the built-in default, nothing to reload\n");
        return;
    }
    char err[512];
    gw_config *c;
    if (gw_config_load(g->cfg->path, &c, err, sizeof(err))) {
        fprintf(stderr, "infergate: reload failed, keeping the running config: %s\n", err);
        return;
    }
    /* As at start: the demo worker when none is configured, --listen. */
    char *addr = g->listen_override && c->n_listen > 0 ? strdup(g->listen_override) : NULL;
    if ((c->n_workers == 0 && gw_config_default_worker(c, g->cfg->workers[0].model)) ||
        (g->listen_override && c->n_listen > 0 && !addr)) {
        fprintf(stderr, "infergate: reload failed (out of memory), keeping the running config\n");
        free(addr);
        gw_config_free(c);
        return;
    }
    if (addr) {
        free(c->listen[0].address);
        c->listen[0].address = addr;
    }
    gw_tenants *t = gw_tenants_new(c, g->tenants);
    if (!t) {
        fprintf(stderr, "infergate: reload failed (out of memory), keeping the running config\n");
        gw_config_free(c);
        return;
    }
    if (gw_tenants_open(t) != gw_tenants_open(g->tenants)) {
        fprintf(stderr, "infergate: reload refused: turning authentication %s needs a restart (listeners "
                        "depend on it)\n",
                gw_tenants_open(t) ? "off" : "on");
        gw_tenants_free(t);
        gw_config_free(c);
        return;
    }
    /* The region section is kept as started: a tenant's residency needs
     * one, which the file may have added since (and its check passed). */
    for (int i = 0; i < c->n_tenants && !gw_regions_enabled(g); i++)
        if (c->tenants[i].n_residency > 0) {
            fprintf(stderr,
                    "infergate: reload refused: tenant '%s' has a residency, and this gateway started "
                    "without a region section (adding one needs a restart)\n",
                    c->tenants[i].name);
            gw_tenants_free(t);
            gw_config_free(c);
            return;
        }
    gw_tenants_free(g->tenants);
    g->tenants = t;
    /* The proxy stops taking a stream's upstream data at half the buffer,
     * and the upstream window, fixed at start, must fit in the rest (see
     * gw_serve_run): a smaller buffer waits for a restart. */
    if (c->limits.stream_buffer_bytes < 4 * (size_t)g->up_window) {
        fprintf(
            stderr,
            "infergate: reload: stream_buffer_bytes %zu is below 4 x the upstream window of %u bytes set at "
            "start; keeping %zu until a restart\n",
            c->limits.stream_buffer_bytes, g->up_window, 4 * (size_t)g->up_window);
        c->limits.stream_buffer_bytes = 4 * (size_t)g->up_window;
    }
    if (gw_serve_conn_window(&c->limits) < g->up_window) {
        const size_t need = 2 * (size_t)c->limits.max_concurrent_streams * g->up_window;
        fprintf(stderr,
                "infergate: reload: conn_buffer_bytes %zu is below 2 x max_concurrent_streams x the upstream "
                "window of %u bytes set at start; keeping %zu until a restart\n",
                c->limits.conn_buffer_bytes, g->up_window, need);
        c->limits.conn_buffer_bytes = need;
        if (c->limits.buffer_bytes < need)
            c->limits.buffer_bytes = need;
    }
    gw_http_limits l;
    gw_serve_http_limits(g, c, true, &l);
    gw_http_server_set_limits(g->http, &l);
    gw_upstream_set_response_timeout(g->pool, c->limits.response_timeout_ms);
    gw_regions_reload(g, c);
    bool peer_tls;
    int n_tls = reload_tls(g, c, &peer_tls);
    char kept[512];
    if (gw_config_restart_diff(g->cfg, c, kept, sizeof(kept)))
        fprintf(stderr, "infergate: reload: kept as started until a restart: %s\n", kept);
    /* The running config keeps the entries the supervisor, the listeners
     * and the routing table point into; only the reloaded parts move over. */
    g->cfg->limits = c->limits;
    g->cfg->routing.policy = c->routing.policy;
    g->cfg->routing.slo_ms = c->routing.slo_ms;
    g->cfg->routing.spread = c->routing.spread;
    g->cfg->routing.replay = c->routing.replay;
    g->cfg->routing.replay_max = c->routing.replay_max;
    gw_front_hedge_reload(g, &c->routing);
    g->cfg->routing.health_check_ms = c->routing.health_check_ms; /* read at each check (front/health.c) */
    g->cfg->routing.health_check_timeout_ms = c->routing.health_check_timeout_ms;
    g->cfg->routing.health_check_failures = c->routing.health_check_failures;
    g->cfg->routing.health_check_successes = c->routing.health_check_successes;
    /* Retries turned off end the saved ones; turned on, they start with
     * the few a start has. */
    if (c->routing.retry_budget <= 0)
        g->retry_tokens = 0;
    else if (g->cfg->routing.retry_budget <= 0)
        g->retry_tokens = GW_RETRY_TOKENS_START;
    g->cfg->routing.retry_budget = c->routing.retry_budget;
    g->cfg->drain_grace_s = c->drain_grace_s;
    g->cfg->worker_hang_timeout_s = c->worker_hang_timeout_s;
    gw_config_free(g->reloaded);
    g->reloaded = c;
    fprintf(stderr,
            "infergate: reloaded %s: %d tenants, limits, routing policy, timeouts, fleet keys and %d TLS "
            "listeners' certificates updated%s\n",
            c->path, c->n_tenants, n_tls, peer_tls ? ", peer_tls's too" : "");
}
