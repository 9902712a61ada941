/* `infergate serve`: the front door of one region. Loads the config (or
 * the built-in default with a synthetic demo model), starts the workers,
 * listens, and runs the loop: SIGHUP reloads tenants, keys and limits;
 * SIGTERM drains (stop accepting, finish in-flight streams up to a grace
 * period, stop the workers). */
#include "gateway/front/access_log.h"
#include "gateway/base/clock.h"
#include "gateway/cmd/cli.h"
#include "gateway/front/serve_internal.h"

#include "kernels/kn.h"
#include "runtime/model_gen.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <event2/event.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- the no-config default: a synthetic demo model in the cache ---- */

static int demo_model_path(char *out, size_t n, char *err, size_t err_len)
{
    char dir[PATH_MAX];
    const char *x = getenv("INFERGATE_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (x && *x)
        snprintf(dir, sizeof(dir), "%s", x);
    else if (xdg && *xdg)
        snprintf(dir, sizeof(dir), "%s/infergate", xdg);
    else if (home && *home)
        snprintf(dir, sizeof(dir), "%s/.cache/infergate", home);
    else
        snprintf(dir, sizeof(dir), "/tmp/infergate-cache");
    /* mkdir -p of the last two levels is enough for the usual layouts. */
    char parent[PATH_MAX];
    snprintf(parent, sizeof(parent), "%s", dir);
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent) {
        *slash = '\0';
        mkdir(parent, 0755);
    }
    if (mkdir(dir, 0755) == -1 && errno != EEXIST) {
        int e = errno;
        snprintf(err, err_len, "cannot make the cache directory %.900s: %s", dir, strerror(e));
        return -e;
    }
    if (snprintf(out, n, "%s/demo.gguf", dir) >= (int)n) {
        snprintf(err, err_len, "cache directory path too long");
        return -ENAMETOOLONG;
    }
    struct stat st;
    if (stat(out, &st) == 0)
        return 0;
    rt_gen_params p;
    rt_gen_params_default(&p);
    p.chat_template = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                      "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}";
    fprintf(stderr, "infergate: writing the synthetic demo model to %s (first run)\n", out);
    return rt_model_gen(&p, out, err, err_len);
}

/* ---- signals ---- */

/* Ends the loop with SIGTERM and SIGINT held back: once the loop has
 * stopped, libevent's handler would take a signal into a pipe nobody reads
 * and a "stop now" would be lost. serve() catches them plainly, then lets
 * them through (the gateway has no other thread they could go to). */
static void stop_signals(int how)
{
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    sigprocmask(how, &stop, NULL);
}

static void loop_exit(gw_serve *g)
{
    stop_signals(SIG_BLOCK);
    event_base_loopexit(g->base, NULL);
}

static void on_drain_tick(evutil_socket_t fd, short what, void *arg)
{
    gw_serve *g = arg;
    size_t open = gw_http_server_active_streams(g->http);
    /* The connections too, as they close: freed at once, one whose peer
     * had not read the end of its last response lost it to a reset. */
    if ((open == 0 && !gw_http_server_has_conns(g->http)) || gw_mono_s() > g->drain_deadline) {
        if (open)
            fprintf(stderr, "infergate: grace period over: closing %zu open streams\n", open);
        loop_exit(g);
    }
}

/* Set by a second SIGTERM or SIGINT: stop now, workers get a second, not
 * the grace. */
static volatile sig_atomic_t hurry;

static void on_hurry(int sig)
{
    (void)sig;
    hurry = 1;
}

static void on_term(evutil_socket_t sig, short what, void *arg)
{
    gw_serve *g = arg;
    if (g->draining) {
        fprintf(stderr, "infergate: second signal: stopping now\n");
        hurry = 1; /* for the wait for the workers, after the loop */
        loop_exit(g);
        return;
    }
    g->draining = true;
    gw_regions_publish(g); /* healthy=0 goes out before the loop ends */
    gw_supervisor_drain(g->sup);
    fprintf(stderr, "infergate: signal %d: draining — no new connections, %zu open streams finish within %d s\n",
            (int)sig, gw_http_server_active_streams(g->http), g->cfg->drain_grace_s);
    gw_http_server_drain(g->http);
    g->drain_deadline = gw_mono_s() + g->cfg->drain_grace_s;
    g->drain_timer = event_new(g->base, -1, EV_PERSIST, on_drain_tick, g);
    struct timeval tv = {0, 50000};
    if (!g->drain_timer || event_add(g->drain_timer, &tv))
        loop_exit(g);
}

/* File descriptors kept back from client connections: workers' sockets,
 * peer regions, Redis, the access log, listeners. */
#define FD_RESERVE 256

/* Raises the soft limit on open files to the hard one (systemd's default
 * soft limit is 1024); returns it, 0 when it cannot be read. */
static rlim_t raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl))
        return 0;
    if (rl.rlim_cur < rl.rlim_max) {
        struct rlimit up = {rl.rlim_max, rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &up) == 0)
            rl.rlim_cur = rl.rlim_max;
    }
    return rl.rlim_cur;
}

/* The HTTP server's limits from c. `said`: the cut to the file limit was
 * already said at start (a reload says it again only if it moves). */
static void http_limits(const gw_serve *g, const gw_config *c, bool said, gw_http_limits *l)
{
    gw_http_limits_default(l);
    l->max_body = c->limits.max_body_bytes;
    l->max_concurrent_streams = c->limits.max_concurrent_streams;
    l->max_header_list = c->limits.max_header_bytes;
    l->max_stream_buffer = c->limits.stream_buffer_bytes;
    l->idle_timeout_ms = c->limits.idle_timeout_ms;
    l->header_timeout_ms = c->limits.header_timeout_ms;
    l->max_connections = c->limits.max_connections;
    /* Past the file limit, client connections took the descriptors the
     * gateway needs for its workers and peers: a restarted worker was
     * "ready" and every request to it got 503 until clients left. */
    rlim_t lim = g->fd_limit;
    if (lim != 0 && lim != RLIM_INFINITY && (rlim_t)l->max_connections + FD_RESERVE > lim) {
        size_t cap = lim > 2 * FD_RESERVE ? (size_t)(lim - FD_RESERVE) : (size_t)lim / 2;
        if (!said || g->cfg->limits.max_connections != c->limits.max_connections)
            fprintf(
                stderr,
                "infergate: limits.max_connections %zu does not fit the open-file limit %llu (%d kept for "
                "workers, peers and Redis): taking %zu; raise the limit (ulimit -n, LimitNOFILE=) for "
                "more\n",
                (size_t)l->max_connections, (unsigned long long)lim, FD_RESERVE, cap);
        l->max_connections = cap;
    }
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
static void on_hup(evutil_socket_t sig, short what, void *arg)
{
    gw_serve *g = arg;
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
     * gw_cmd_serve): a smaller buffer waits for a restart. */
    if (c->limits.stream_buffer_bytes < 4 * (size_t)g->up_window) {
        fprintf(
            stderr,
            "infergate: reload: stream_buffer_bytes %zu is below 4 x the upstream window of %u bytes set at "
            "start; keeping %zu until a restart\n",
            c->limits.stream_buffer_bytes, g->up_window, 4 * (size_t)g->up_window);
        c->limits.stream_buffer_bytes = 4 * (size_t)g->up_window;
    }
    gw_http_limits l;
    http_limits(g, c, true, &l);
    gw_http_server_set_limits(g->http, &l);
    gw_upstream_set_response_timeout(g->pool, c->limits.response_timeout_ms);
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
            "infergate: reloaded %s: %d tenants, limits, routing policy, timeouts and %d TLS listeners' "
            "certificates updated%s\n",
            c->path, c->n_tenants, n_tls, peer_tls ? ", peer_tls's too" : "");
}

/* ---- startup ---- */

static bool is_loopback(const char *addr)
{
    if (!strncmp(addr, "unix:", 5))
        return true;
    char host[256];
    snprintf(host, sizeof(host), "%s", addr);
    char *colon = strrchr(host, ':');
    if (colon)
        *colon = '\0';
    char *h = host;
    if (*h == '[') {
        h++;
        h[strcspn(h, "]")] = '\0';
    }
    if (!strcmp(h, "localhost"))
        return true;
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, h, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, h, &a6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&a6);
    return false;
}

static int start_listeners(gw_serve *g, char *err, size_t err_len)
{
    for (int i = 0; i < g->cfg->n_listen; i++) {
        const gw_listen_cfg *l = &g->cfg->listen[i];
        char spec[600];
        if (!strncmp(l->address, "unix:", 5))
            snprintf(spec, sizeof(spec), "%s", l->address);
        else
            snprintf(spec, sizeof(spec), "tcp:%s", l->address);
        int rc = l->tls_cert ? gw_http_server_listen_tls_peer(
                                   g->http, spec, l->tls_cert, l->tls_key, l->tls_client_ca,
                                   (const char *const *)l->tls_peer_names, l->n_tls_peer_names, err, err_len)
                             : gw_http_server_listen(g->http, spec, err, err_len);
        if (rc)
            return rc;
    }
    return 0;
}

static void print_ready(gw_serve *g)
{
    const gw_listen_cfg *l = &g->cfg->listen[0];
    const char *scheme = l->tls_cert ? "https" : "http";
    char url[600];
    if (!strncmp(l->address, "unix:", 5))
        snprintf(url, sizeof(url), "--unix-socket %s http://localhost", l->address + 5);
    else
        snprintf(url, sizeof(url), "%s://%s", scheme, l->address);
    fprintf(stderr, "infergate: listening on");
    for (int i = 0; i < g->cfg->n_listen; i++)
        fprintf(stderr, " %s%s", g->cfg->listen[i].address, g->cfg->listen[i].tls_cert ? " (TLS)" : "");
    fprintf(stderr, " — HTTP/1.1 and HTTP/2; %d workers starting\n", gw_supervisor_count(g->sup));
    if (gw_tenants_open(g->tenants))
        fprintf(stderr, "infergate: no tenants configured: no API key is needed, so only loopback addresses "
                        "are served\n");
    fprintf(stderr,
            "infergate: try:\n  curl %s/v1/chat/completions -H 'content-type: application/json'%s -d "
            "'{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello!\"}],\"max_tokens\":32}'\n",
            url, gw_tenants_open(g->tenants) ? "" : " -H 'authorization: Bearer YOUR_KEY'", g->cfg->workers[0].name);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: infergate serve [--config FILE] [--listen HOST:PORT]\n"
               "       infergate serve --check --config FILE\n"
               "Runs the gateway of one region. Without --config: 127.0.0.1:8080, one CPU worker on a\n"
               "synthetic demo model (random weights), no API keys. See README.md for the config.\n"
               "--check reads the config and the files it names and says what is wrong (exit 1) or\n"
               "that nothing is (exit 0): before a restart or a SIGHUP.\n");
}

/* --check: the config parses and the files it names can be read. */
static bool readable(const char *config, const char *what, const char *file)
{
    if (!file || access(file, R_OK) == 0)
        return true;
    fprintf(stderr, "infergate: %s: %s %s: %s\n", config, what, file, strerror(errno));
    return false;
}

static int check_config(const char *path)
{
    gw_config *c;
    char err[1024];
    if (gw_config_load(path, &c, err, sizeof(err))) {
        fprintf(stderr, "infergate: %s\n", err);
        return 1;
    }
    bool bad = false;
    for (int i = 0; i < c->n_workers; i++)
        bad |= !readable(path, "workers[].model", c->workers[i].model);
    for (int i = 0; i < c->n_listen; i++) {
        const gw_listen_cfg *l = &c->listen[i];
        bad |= !readable(path, "listen[].tls.cert", l->tls_cert);
        bad |= !readable(path, "listen[].tls.key", l->tls_key);
        bad |= !readable(path, "listen[].tls.client_ca", l->tls_client_ca);
    }
    bad |= !readable(path, "peer_tls.ca", c->peer_tls.ca);
    bad |= !readable(path, "peer_tls.cert", c->peer_tls.cert);
    bad |= !readable(path, "peer_tls.key", c->peer_tls.key);
    if (!bad)
        printf("infergate: %s is valid: %d listeners, %d workers, %d tenants%s\n", path, c->n_listen,
               c->n_workers, c->n_tenants, c->region.name ? ", region settings included" : "");
    gw_config_free(c);
    return bad;
}

static void serve_dispose(gw_serve *g)
{
    if (g->http)
        gw_http_server_free(g->http);
    gw_regions_stop(g);
    if (g->sup)
        gw_supervisor_free(g->sup);
    if (g->pool)
        gw_upstream_pool_free(g->pool);
    gw_tenants_free(g->tenants);
    gw_metrics_free(g->metrics);
    gw_alog_close(g->alog, 2000);
    struct event *evs[] = {g->sigterm, g->sigint, g->sighup, g->drain_timer};
    for (size_t i = 0; i < sizeof(evs) / sizeof(evs[0]); i++)
        if (evs[i])
            event_free(evs[i]);
    if (g->base)
        event_base_free(g->base);
    gw_config_free(g->reloaded);
    gw_config_free(g->cfg);
}

int gw_cmd_serve(int argc, char **argv)
{
    static const struct option opts[] = {{"config", required_argument, 0, 'c'},
                                         {"listen", required_argument, 0, 'l'},
                                         {"check", no_argument, 0, 'k'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *config = NULL, *listen = NULL;
    bool check = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "c:l:h", opts, NULL)) != -1) {
        if (c == 'c' || c == 'l') {
            *(c == 'c' ? &config : &listen) = optarg;
            continue;
        }
        if (c == 'k') {
            check = true;
            continue;
        }
        usage(c == 'h' ? stdout : stderr);
        return c == 'h' ? 0 : 2;
    }
    if (optind != argc || (check && !config)) {
        usage(stderr);
        return 2;
    }
    if (check)
        return check_config(config);
    signal(SIGPIPE, SIG_IGN);
    /* A reload asked for while starting (probing GPUs, writing the demo
     * model) must not kill the gateway; it is ignored until the loop runs. */
    signal(SIGHUP, SIG_IGN);
    gw_serve g = {.started = (long)time(NULL)};
    char err[1024], exe[PATH_MAX];
    int status = 1;
    if (config) {
        if (gw_config_load(config, &g.cfg, err, sizeof(err))) {
            fprintf(stderr, "infergate: %s\n", err);
            return 1;
        }
    }
    if (!g.cfg || g.cfg->n_workers == 0) {
        char demo[PATH_MAX];
        if (demo_model_path(demo, sizeof(demo), err, sizeof(err))) {
            fprintf(stderr, "infergate: demo model: %s\n", err);
            return 1;
        }
        if (g.cfg ? gw_config_default_worker(g.cfg, demo) : gw_config_default(demo, &g.cfg)) {
            fprintf(stderr, "infergate: out of memory\n");
            gw_config_free(g.cfg);
            return 1;
        }
        fprintf(stderr,
                "infergate: no workers configured: serving the synthetic demo model %s — its weights are RANDOM, so its "
                "text is gibberish.\n"
                "infergate: to serve a real model, write a config with `workers: [{model: /path/to/model.gguf}]` "
                "and run `infergate serve --config FILE` (see README.md).\n",
                demo);
    }
    if (listen && g.cfg->n_listen > 0) {
        /* --listen replaces the first listener's address (TLS settings stay). */
        char *a = strdup(listen);
        if (!a) {
            fprintf(stderr, "infergate: out of memory\n");
            goto out;
        }
        free(g.cfg->listen[0].address);
        g.cfg->listen[0].address = a;
    }
    g.retry_tokens = g.cfg->routing.retry_budget > 0 ? GW_RETRY_TOKENS_START : 0;
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0) {
        fprintf(stderr, "infergate: cannot find my own binary: %s\n", strerror(errno));
        goto out;
    }
    exe[n] = '\0';

    if (!(g.tenants = gw_tenants_new(g.cfg, NULL)) || !(g.metrics = gw_metrics_new(10000)) ||
        gw_proxy_metrics_init(g.metrics)) {
        fprintf(stderr, "infergate: out of memory\n");
        goto out;
    }
    if (gw_tenants_open(g.tenants)) {
        for (int i = 0; i < g.cfg->n_listen; i++)
            if (!is_loopback(g.cfg->listen[i].address)) {
                fprintf(stderr,
                        "infergate: %s: listen address %s is not loopback, and no tenants (API keys) are "
                        "configured: refusing to serve it without authentication\n",
                        g.cfg->path ? g.cfg->path : "default config", g.cfg->listen[i].address);
                goto out;
            }
    }
    const char *log = g.cfg->access_log ? g.cfg->access_log : "stdout";
    if (strcmp(log, "off") != 0) {
        if (!(g.alog = gw_alog_open(log))) {
            fprintf(stderr, "infergate: access log %s: %s\n", log, strerror(errno));
            goto out;
        }
        g.own_access_log = strcmp(log, "stdout") && strcmp(log, "stderr");
    }

    g.base = event_base_new();
    gw_upstream_opts uo;
    gw_upstream_opts_default(&uo);
    /* Mutual TLS to other regions: our client certificate, their CA. */
    uo.tls_ca_file = g.cfg->peer_tls.ca;
    uo.tls_cert_file = g.cfg->peer_tls.cert;
    uo.tls_key_file = g.cfg->peer_tls.key;
    uo.response_timeout_ms = g.cfg->limits.response_timeout_ms;
    /* The proxy stops taking a stream's upstream data once the client's
     * side holds half of stream_buffer_bytes; what the worker may still
     * send (the window) must fit in the other half, or the stream of a
     * client that merely reads slowly is reset. A reload keeps the buffer
     * at 4 x this window at least (on_hup). */
    if (uo.stream_window > g.cfg->limits.stream_buffer_bytes / 4)
        uo.stream_window = (uint32_t)(g.cfg->limits.stream_buffer_bytes / 4);
    g.up_window = uo.stream_window;
    g.listen_override = listen;
    g.fd_limit = raise_fd_limit();
    gw_http_limits lim;
    http_limits(&g, g.cfg, false, &lim);
    gw_http_handler h = {.on_request = gw_proxy_on_request,
                         .on_head = gw_proxy_on_head,
                         .on_refused = gw_proxy_on_refused,
                         .on_close = gw_proxy_on_close,
                         .on_writable = gw_proxy_on_writable};
    if (!g.base || !(g.pool = gw_upstream_pool_new(g.base, &uo, err, sizeof(err))) ||
        !(g.http = gw_http_server_new(g.base, &lim, &h, &g))) {
        fprintf(stderr, "infergate: cannot start: %s\n", g.base && !g.pool ? err : "out of memory");
        goto out;
    }
    if (!(g.sup = gw_supervisor_new(g.base, g.pool, g.cfg, exe, err, sizeof(err)))) {
        fprintf(stderr, "infergate: %s\n", err);
        goto out;
    }
    g.sigterm = evsignal_new(g.base, SIGTERM, on_term, &g);
    g.sigint = evsignal_new(g.base, SIGINT, on_term, &g);
    g.sighup = evsignal_new(g.base, SIGHUP, on_hup, &g);
    if (!g.sigterm || !g.sigint || !g.sighup || event_add(g.sigterm, NULL) || event_add(g.sigint, NULL) ||
        event_add(g.sighup, NULL)) {
        fprintf(stderr, "infergate: cannot set up signals\n");
        goto out;
    }
    if (start_listeners(&g, err, sizeof(err))) {
        fprintf(stderr, "infergate: listen: %s\n", err);
        goto out;
    }
    if (gw_supervisor_start(g.sup, err, sizeof(err))) {
        fprintf(stderr, "infergate: %s\n", err);
        goto out;
    }
    if (gw_regions_start(&g, err, sizeof(err))) {
        fprintf(stderr, "infergate: routing: %s\n", err);
        goto out;
    }
    print_ready(&g);
    event_base_dispatch(g.base);
    /* Drained (or told twice): close what is left, then the workers. The
     * pool goes before they are waited for: the loop will not run again to
     * send the RST_STREAMs of what was cut, and closing their connections
     * tells them as well, so they drop that work now instead of at the end
     * of their grace. */
    gw_http_server_free(g.http);
    g.http = NULL;
    gw_regions_stop(&g);
    gw_supervisor_stop(g.sup);
    gw_upstream_pool_free(g.pool);
    g.pool = NULL;
    /* Workers have no client left and stop at once; one that does not is
     * killed after the grace, or a second after a signal to stop now. The
     * loop no longer runs: such a signal is caught plainly from here, one
     * held back since the loop ended included. */
    struct sigaction sa = {.sa_handler = on_hurry};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    stop_signals(SIG_UNBLOCK);
    gw_supervisor_wait(g.sup, g.cfg->drain_grace_s, &hurry);
    fprintf(stderr, "infergate: stopped\n");
    status = 0;
out:
    serve_dispose(&g);
    return status;
}
