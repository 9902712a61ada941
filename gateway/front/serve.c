/* `infergate serve`: the front door of one region, its life from start to
 * stop. Loads the config (or the built-in default with a synthetic demo
 * model), starts the workers, listens, and runs the loop: SIGHUP reloads
 * tenants, keys and limits (reload.c); SIGTERM drains (stop accepting,
 * finish in-flight streams up to a grace period, stop the workers). The
 * command line is gateway/cmd/serve.c's; each request, request_internal.h's. */
#include "gateway/front/health.h"
#include "gateway/front/placement.h"
#include "gateway/front/serve.h"
#include "gateway/front/access_log.h"
#include "gateway/base/clock.h"
#include "gateway/front/serve_internal.h"
#include "gateway/front/spend.h"

#include "runtime/model_gen.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
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
                      "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
                      "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
    fprintf(stderr, "infergate: writing the synthetic demo model to %s (first run)\n", out);
    return rt_model_gen(&p, out, err, err_len);
}

/* ---- signals ---- */

/* Ends the loop with SIGTERM, SIGINT and SIGUSR1 held back: once the loop has
 * stopped, libevent's handler would take a signal into a pipe nobody reads
 * and a "stop now" would be lost. serve() catches them plainly, then lets
 * them through (the gateway has no other thread they could go to). */
static void stop_signals(int how)
{
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGUSR1);
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
    char why[32];
    snprintf(why, sizeof(why), "signal %d", (int)sig);
    gw_serve_drain(g, g->cfg->drain_grace_s, why);
}

void gw_serve_drain(gw_serve *g, int grace_s, const char *why)
{
    if (g->draining)
        return;
    g->draining = true;
    gw_regions_publish(g); /* healthy=0 goes out before the loop ends */
    gw_supervisor_drain(g->sup);
    fprintf(stderr, "infergate: %s: draining — no new connections, %zu open streams finish within %d s\n", why,
            gw_http_server_active_streams(g->http), grace_s);
    gw_http_server_drain(g->http);
    g->drain_deadline = gw_mono_s() + grace_s;
    g->drain_timer = event_new(g->base, -1, EV_PERSIST, on_drain_tick, g);
    struct timeval tv = {0, 50000};
    if (!g->drain_timer || event_add(g->drain_timer, &tv))
        loop_exit(g);
}

/* SIGUSR1: the machine will be reclaimed (a spot instance's notice): the
 * same drain as SIGTERM's, said as such; once draining it is ignored. */
static void on_usr1(evutil_socket_t sig, short what, void *arg)
{
    gw_serve *g = arg;
    gw_serve_drain(g, g->cfg->drain_grace_s, "SIGUSR1 (reclaim notice)");
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

size_t gw_serve_conn_window(const gw_limits_cfg *l)
{
    const size_t w = l->conn_buffer_bytes / (2 * (size_t)(l->max_concurrent_streams ? l->max_concurrent_streams : 1));
    return w < 1024 ? 1024 : w;
}

/* The HTTP server's limits from c. `said`: the cut to the file limit was
 * already said at start (a reload says it again only if it moves). */
void gw_serve_http_limits(const gw_serve *g, const gw_config *c, bool said, gw_http_limits *l)
{
    gw_http_limits_default(l);
    l->max_body = c->limits.max_body_bytes;
    l->max_concurrent_streams = c->limits.max_concurrent_streams;
    l->max_header_list = c->limits.max_header_bytes;
    l->max_stream_buffer = c->limits.stream_buffer_bytes;
    l->max_conn_buffer = c->limits.conn_buffer_bytes;
    l->max_buffer = c->limits.buffer_bytes;
    l->min_read_rate = c->limits.min_read_rate_bytes;
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

/* SIGHUP: reload.c. */
static void on_hup(evutil_socket_t sig, short what, void *arg)
{
    gw_serve_reload(arg);
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

static void serve_dispose(gw_serve *g)
{
    if (g->http)
        gw_http_server_free(g->http);
    gw_health_stop(g);
    gw_regions_stop(g);
    gw_placement_stop(g);
    gw_front_hedges_free(g);
    if (g->sup)
        gw_supervisor_free(g->sup);
    if (g->pool)
        gw_upstream_pool_free(g->pool);
    gw_tenants_free(g->tenants);
    gw_spend_free(g->spend);
    gw_metrics_free(g->metrics);
    gw_alog_close(g->alog, 2000);
    struct event *evs[] = {g->sigterm, g->sigint, g->sighup, g->sigusr1, g->drain_timer};
    for (size_t i = 0; i < sizeof(evs) / sizeof(evs[0]); i++)
        if (evs[i])
            event_free(evs[i]);
    if (g->base)
        event_base_free(g->base);
    gw_config_free(g->reloaded);
    gw_config_free(g->cfg);
}

/* The config file, or the built-in default; the demo model where it names
 * no worker. -1 (said on stderr) when there is none to run. */
static int load_config(gw_serve *g, const char *config, char *err, size_t err_len)
{
    if (config) {
        if (gw_config_load(config, &g->cfg, err, err_len)) {
            fprintf(stderr, "infergate: %s\n", err);
            return -1;
        }
    }
    if (!g->cfg || g->cfg->n_workers == 0) {
        char demo[PATH_MAX];
        if (demo_model_path(demo, sizeof(demo), err, err_len)) {
            fprintf(stderr, "infergate: demo model: %s\n", err);
            return -1;
        }
        if (g->cfg ? gw_config_default_worker(g->cfg, demo) : gw_config_default(demo, &g->cfg)) {
            fprintf(stderr, "infergate: out of memory\n");
            gw_config_free(g->cfg);
            return -1;
        }
        fprintf(stderr,
                "infergate: no workers configured: serving the synthetic demo model %s — its weights are RANDOM, so its "
                "text is gibberish.\n"
                "infergate: to serve a real model, write a config with `workers: [{model: /path/to/model.gguf}]` "
                "and run `infergate serve --config FILE` (see README.md).\n",
                demo);
    }
    return 0;
}

/* What comes before the loop's parts: --listen, the retry budget, this
 * binary's path (the workers run it), the tenants, metrics and access log.
 * -1 (said on stderr) when one is missing. */
static int prepare(gw_serve *g, const char *listen, char exe[PATH_MAX])
{
    if (listen && g->cfg->n_listen > 0) {
        /* --listen replaces the first listener's address (TLS settings stay). */
        char *a = strdup(listen);
        if (!a) {
            fprintf(stderr, "infergate: out of memory\n");
            return -1;
        }
        free(g->cfg->listen[0].address);
        g->cfg->listen[0].address = a;
    }
    g->retry_tokens = g->cfg->routing.retry_budget > 0 ? GW_RETRY_TOKENS_START : 0;
    ssize_t n = readlink("/proc/self/exe", exe, PATH_MAX - 1);
    if (n <= 0) {
        fprintf(stderr, "infergate: cannot find my own binary: %s\n", strerror(errno));
        return -1;
    }
    exe[n] = '\0';

    if (!(g->tenants = gw_tenants_new(g->cfg, NULL)) || !(g->metrics = gw_metrics_new(10000)) ||
        gw_serve_metrics_init(g->metrics)) {
        fprintf(stderr, "infergate: out of memory\n");
        return -1;
    }
    if (gw_tenants_open(g->tenants)) {
        for (int i = 0; i < g->cfg->n_listen; i++)
            if (!is_loopback(g->cfg->listen[i].address)) {
                fprintf(stderr,
                        "infergate: %s: listen address %s is not loopback, and no tenants (API keys) are "
                        "configured: refusing to serve it without authentication\n",
                        g->cfg->path ? g->cfg->path : "default config", g->cfg->listen[i].address);
                return -1;
            }
    }
    const char *log = g->cfg->access_log ? g->cfg->access_log : "stdout";
    if (strcmp(log, "off") != 0) {
        if (!(g->alog = gw_alog_open(log, g->cfg->access_log_mode))) {
            fprintf(stderr, "infergate: access log %s: %s\n", log, strerror(errno));
            return -1;
        }
        g->own_access_log = strcmp(log, "stdout") && strcmp(log, "stderr");
    }
    return 0;
}

/* The loop's parts: the upstream pool, the HTTP server, the workers,
 * signals, listeners and routing. -1 (said on stderr) when one fails. */
static int start(gw_serve *g, const char *exe, char *err, size_t err_len)
{
    g->base = event_base_new();
    if (!g->base || !(g->spend = gw_spend_new(g))) {
        fprintf(stderr, "infergate: out of memory\n");
        return -1;
    }
    gw_upstream_opts uo;
    gw_upstream_opts_default(&uo);
    /* Mutual TLS to other regions: our client certificate, their CA. */
    uo.tls_ca_file = g->cfg->peer_tls.ca;
    uo.tls_cert_file = g->cfg->peer_tls.cert;
    uo.tls_key_file = g->cfg->peer_tls.key;
    uo.response_timeout_ms = g->cfg->limits.response_timeout_ms;
    /* The proxy stops taking a stream's upstream data once the client's
     * side holds half of stream_buffer_bytes; what the worker may still
     * send (the window) must fit in the other half, or the stream of a
     * client that merely reads slowly is reset. A reload keeps the buffer
     * at 4 x this window at least (gw_serve_reload). */
    if (uo.stream_window > g->cfg->limits.stream_buffer_bytes / 4)
        uo.stream_window = (uint32_t)(g->cfg->limits.stream_buffer_bytes / 4);
    /* So for a connection: every stream it may open with its whole window
     * on the way must fit in half of conn_buffer_bytes, or a connection of
     * many slowly read streams is cut (250 streams x 256 KiB was four times
     * the default bound). With the defaults, 16 MiB / (2 x 256) = 32 KiB. */
    const size_t per_conn = gw_serve_conn_window(&g->cfg->limits);
    if (uo.stream_window > per_conn)
        uo.stream_window = (uint32_t)per_conn;
    g->up_window = uo.stream_window;
    g->fd_limit = raise_fd_limit();
    gw_http_limits lim;
    gw_serve_http_limits(g, g->cfg, false, &lim);
    gw_http_handler h = {.on_request = gw_front_on_request,
                         .on_head = gw_front_on_head,
                         .on_refused = gw_front_on_refused,
                         .on_close = gw_front_on_close,
                         .on_writable = gw_front_on_writable};
    if (!g->base || !(g->pool = gw_upstream_pool_new(g->base, &uo, err, err_len)) ||
        !(g->http = gw_http_server_new(g->base, &lim, &h, g))) {
        fprintf(stderr, "infergate: cannot start: %s\n", g->base && !g->pool ? err : "out of memory");
        return -1;
    }
    if (!(g->sup = gw_supervisor_new(g->base, g->pool, g->cfg, exe, err, err_len))) {
        fprintf(stderr, "infergate: %s\n", err);
        return -1;
    }
    g->sigterm = evsignal_new(g->base, SIGTERM, on_term, g);
    g->sigint = evsignal_new(g->base, SIGINT, on_term, g);
    g->sighup = evsignal_new(g->base, SIGHUP, on_hup, g);
    g->sigusr1 = evsignal_new(g->base, SIGUSR1, on_usr1, g);
    if (!g->sigterm || !g->sigint || !g->sighup || !g->sigusr1 || event_add(g->sigterm, NULL) ||
        event_add(g->sigint, NULL) || event_add(g->sighup, NULL) || event_add(g->sigusr1, NULL)) {
        fprintf(stderr, "infergate: cannot set up signals\n");
        return -1;
    }
    if (start_listeners(g, err, err_len)) {
        fprintf(stderr, "infergate: listen: %s\n", err);
        return -1;
    }
    if (gw_supervisor_start(g->sup, err, err_len)) {
        fprintf(stderr, "infergate: %s\n", err);
        return -1;
    }
    if (gw_regions_start(g, err, err_len)) {
        fprintf(stderr, "infergate: routing: %s\n", err);
        return -1;
    }
    if (gw_placement_start(g, err, err_len)) {
        fprintf(stderr, "infergate: placement: %s\n", err);
        return -1;
    }
    if (gw_health_start(g, err, err_len)) {
        fprintf(stderr, "infergate: health checks: %s\n", err);
        return -1;
    }
    print_ready(g);
    return 0;
}

/* Drained (or told twice): close what is left, then the workers. The
 * pool goes before they are waited for: the loop will not run again to
 * send the RST_STREAMs of what was cut, and closing their connections
 * tells them as well, so they drop that work now instead of at the end
 * of their grace. */
static void stop(gw_serve *g)
{
    gw_http_server_free(g->http);
    g->http = NULL;
    gw_health_stop(g);
    gw_regions_stop(g);
    gw_placement_stop(g);
    gw_supervisor_stop(g->sup);
    gw_upstream_pool_free(g->pool);
    g->pool = NULL;
    /* Workers have no client left and stop at once; one that does not is
     * killed after the grace, or a second after a signal to stop now. The
     * loop no longer runs: such a signal is caught plainly from here, one
     * held back since the loop ended included. */
    struct sigaction sa = {.sa_handler = on_hurry};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGUSR1, SIG_IGN); /* a reclaim notice now: the drain is done */
    stop_signals(SIG_UNBLOCK);
    gw_supervisor_wait(g->sup, g->cfg->drain_grace_s, &hurry);
    fprintf(stderr, "infergate: stopped\n");
}

int gw_serve_run(const char *config, const char *listen)
{
    signal(SIGPIPE, SIG_IGN);
    /* A reload asked for while starting (probing GPUs, writing the demo
     * model) must not kill the gateway; it is ignored until the loop runs. */
    signal(SIGHUP, SIG_IGN);
    gw_serve g = {.started = (long)time(NULL), .listen_override = listen};
    char err[1024], exe[PATH_MAX];
    if (load_config(&g, config, err, sizeof(err)))
        return 1;
    int status = 1;
    if (!prepare(&g, listen, exe) && !start(&g, exe, err, sizeof(err))) {
        event_base_dispatch(g.base);
        stop(&g);
        status = 0;
    }
    serve_dispose(&g);
    return status;
}
