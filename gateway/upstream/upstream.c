/* Upstream HTTP/2 client pool: targets, requests and the public calls.
 * gw_upstream_send only copies the request and queues it; the pool's kick
 * event (a loop callback) gives it to a connection with a free stream slot
 * or opens one, so that no outcome, not even an immediate connect failure,
 * reaches the caller from inside gw_upstream_send. Connections themselves
 * live in gateway/upstream/conn.c; see gateway/upstream/upstream_internal.h for who
 * owns what and which calls may happen where. */
#include "gateway/upstream/upstream_internal.h"
#include "gateway/base/clock.h"
#include "gateway/base/mem.h"
#include "routing/region.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

const char *gw_upstream_error_name(gw_upstream_error e)
{
    switch (e) {
    case GW_UP_CONNECT:
        return "connect";
    case GW_UP_RESET:
        return "reset";
    case GW_UP_PROTOCOL:
        return "protocol";
    case GW_UP_TIMEOUT:
        return "timeout";
    case GW_UP_NOMEM:
        return "nomem";
    case GW_UP_STALLED:
        return "stalled";
    case GW_UP_REFUSED:
        return "refused";
    }
    return "unknown";
}

void gw_upstream_opts_default(gw_upstream_opts *o)
{
    *o = (gw_upstream_opts){
        .connect_timeout_ms = 3000,
        .response_timeout_ms = 0,
        .stream_window = 256 << 10,
        .max_streams_per_conn = 128,
        .idle_close_ms = 60000,
    };
}

/* ---- TLS context ---- */

static void ssl_err(char *err, size_t err_len, const char *what, const char *file)
{
    char reason[200] = "";
    unsigned long e = ERR_get_error();
    if (e)
        ERR_error_string_n(e, reason, sizeof(reason));
    ERR_clear_error();
    snprintf(err, err_len, "%s %s: %s", what, file, reason[0] ? reason : "unusable");
}

/* One client context for every "tls:" target: TLS 1.2 or later, the peer
 * verified against the CA file (else the system store), ALPN h2, and the
 * client certificate when mutual TLS is configured. The files are read now
 * so that a bad one is a configuration error, not a failed request. */
static SSL_CTX *ssl_ctx_new(const gw_upstream_opts *o, char *err, size_t err_len)
{
    static const unsigned char alpn[] = {2, 'h', '2'};
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) {
        snprintf(err, err_len, "out of memory for the TLS context");
        return NULL;
    }
    if (!SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) ||
        SSL_CTX_set_alpn_protos(ctx, alpn, sizeof(alpn))) {
        snprintf(err, err_len, "cannot configure the TLS context");
        goto fail;
    }
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    if (o->tls_ca_file) {
        if (SSL_CTX_load_verify_locations(ctx, o->tls_ca_file, NULL) != 1) {
            ssl_err(err, err_len, "tls_ca_file", o->tls_ca_file);
            goto fail;
        }
    } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
        ssl_err(err, err_len, "system CA store", "(default paths)");
        goto fail;
    }
    if (!o->tls_cert_file != !o->tls_key_file) {
        snprintf(err, err_len, "tls_cert_file and tls_key_file go together");
        goto fail;
    }
    if (o->tls_cert_file) {
        if (SSL_CTX_use_certificate_chain_file(ctx, o->tls_cert_file) != 1) {
            ssl_err(err, err_len, "tls_cert_file", o->tls_cert_file);
            goto fail;
        }
        if (SSL_CTX_use_PrivateKey_file(ctx, o->tls_key_file, SSL_FILETYPE_PEM) != 1) {
            ssl_err(err, err_len, "tls_key_file", o->tls_key_file);
            goto fail;
        }
        if (SSL_CTX_check_private_key(ctx) != 1) {
            ssl_err(err, err_len, "tls_key_file does not match", o->tls_cert_file);
            goto fail;
        }
    }
    return ctx;
fail:
    SSL_CTX_free(ctx);
    return NULL;
}

/* ---- pool ---- */

int gw_upstream_set_tls(gw_upstream_pool *p, const char *ca_file, const char *cert_file, const char *key_file,
                        char *err, size_t err_len)
{
    gw_upstream_opts o = p->opts;
    o.tls_ca_file = ca_file;
    o.tls_cert_file = cert_file;
    o.tls_key_file = key_file;
    SSL_CTX *ctx = ssl_ctx_new(&o, err, err_len);
    if (!ctx)
        return -EINVAL;
    SSL_CTX_free(p->ssl_ctx); /* each connection's SSL holds a reference of its own */
    p->ssl_ctx = ctx;
    return 0;
}

static void on_kick(evutil_socket_t fd, short what, void *arg);
static void on_stall_sweep(evutil_socket_t fd, short what, void *arg);

gw_upstream_pool *gw_upstream_pool_new(struct event_base *base, const gw_upstream_opts *o, char *err,
                                       size_t err_len)
{
    gw_upstream_opts d;
    gw_upstream_opts_default(&d);
    if (o) { /* zero means "the default", as in gw_http_limits */
        if (o->connect_timeout_ms > 0)
            d.connect_timeout_ms = o->connect_timeout_ms;
        if (o->response_timeout_ms > 0)
            d.response_timeout_ms = o->response_timeout_ms;
        if (o->stream_window)
            d.stream_window = o->stream_window;
        if (o->max_streams_per_conn > 0)
            d.max_streams_per_conn = o->max_streams_per_conn;
        if (o->idle_close_ms > 0)
            d.idle_close_ms = o->idle_close_ms;
        d.tls_ca_file = o->tls_ca_file;
        d.tls_cert_file = o->tls_cert_file;
        d.tls_key_file = o->tls_key_file;
    }
    if (!base) {
        snprintf(err, err_len, "no event base");
        return NULL;
    }
    if (d.stream_window > NGHTTP2_MAX_WINDOW_SIZE) {
        snprintf(err, err_len, "stream_window %u is larger than %u", d.stream_window,
                 (unsigned)NGHTTP2_MAX_WINDOW_SIZE);
        return NULL;
    }
    gw_upstream_pool *p = calloc(1, sizeof(*p));
    if (!p) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    p->base = base;
    p->opts = d;
    uint64_t w = (uint64_t)d.stream_window * (uint64_t)d.max_streams_per_conn;
    if (w < GW_UP_CONN_WINDOW_MIN)
        w = GW_UP_CONN_WINDOW_MIN;
    p->conn_window = w > NGHTTP2_MAX_WINDOW_SIZE ? NGHTTP2_MAX_WINDOW_SIZE : (uint32_t)w;
    if (!(p->ssl_ctx = ssl_ctx_new(&d, err, err_len)))
        goto fail;
    p->opts.tls_ca_file = p->opts.tls_cert_file = p->opts.tls_key_file = NULL;
    if (!(p->kick_ev = event_new(base, -1, 0, on_kick, p)) ||
        !(p->stall_ev = event_new(base, -1, EV_PERSIST, on_stall_sweep, p)) || up_conn_callbacks_init(p)) {
        snprintf(err, err_len, "out of memory");
        goto fail;
    }
    gw_upstream_set_response_timeout(p, p->opts.response_timeout_ms);
    return p;
fail:
    gw_upstream_pool_free(p);
    return NULL;
}

static void req_free(gw_upstream_req *r)
{
    gw_mem_free(r->hbuf);
    gw_mem_free(r);
}

static void reap(gw_upstream_pool *p)
{
    gw_upstream_req *r;
    while ((r = p->graveyard)) {
        p->graveyard = r->next;
        req_free(r);
    }
}

void gw_upstream_pool_free(gw_upstream_pool *p)
{
    if (!p)
        return;
    up_target *t;
    while ((t = p->targets)) {
        p->targets = t->next;
        while (t->conns) {
            up_conn *c = t->conns;
            gw_upstream_req *r;
            while ((r = c->reqs)) {
                c->reqs = r->next;
                req_free(r);
            }
            c->n_reqs = 0;
            up_conn_free(c);
        }
        free(t->name);
        free(t->authority);
        free(t);
    }
    gw_upstream_req *r;
    while ((r = p->pending)) {
        p->pending = r->next;
        req_free(r);
    }
    reap(p);
    if (p->kick_ev)
        event_free(p->kick_ev);
    if (p->stall_ev)
        event_free(p->stall_ev);
    if (p->ssl_ctx)
        SSL_CTX_free(p->ssl_ctx);
    if (p->ngopt)
        nghttp2_option_del(p->ngopt);
    if (p->cbs)
        nghttp2_session_callbacks_del(p->cbs);
    for (int i = 0; i < p->n_expect; i++)
        free(p->expect[i].target);
    free(p->expect);
    free(p);
}

void up_pool_kick(gw_upstream_pool *p)
{
    event_active(p->kick_ev, EV_TIMEOUT, 0);
}

void up_req_retire(gw_upstream_req *r)
{
    gw_upstream_pool *p = r->pool;
    r->state = UP_RS_DONE;
    r->conn = NULL;
    r->prev = NULL;
    r->next = p->graveyard;
    p->graveyard = r;
    up_pool_kick(p);
}

/* ---- targets ---- */

/* "HOST:PORT" with HOST a numeric IPv4 address, [IPv6] or localhost, as
 * routing checks region endpoints. Names are not resolved: that would
 * block the loop, and targets come from the configuration, where an
 * address is as easy to write. */
static int parse_host_port(up_target *t, const char *s)
{
    char host[ROUTE_HOST_MAX];
    int port;
    if (route_host_port(s, host, &port))
        return -EINVAL;
    memset(&t->addr, 0, sizeof(t->addr));
    if (s[0] == '[') {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&t->addr;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)port);
        inet_pton(AF_INET6, host, &a->sin6_addr);
        t->addr_len = sizeof(*a);
        t->host_is_ip = true;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&t->addr;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)port);
        t->host_is_ip = strcmp(host, "localhost") != 0;
        if (t->host_is_ip)
            inet_pton(AF_INET, host, &a->sin_addr);
        else
            a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        t->addr_len = sizeof(*a);
    }
    snprintf(t->host, sizeof(t->host), "%s", host);
    return (t->authority = strdup(s)) ? 0 : -ENOMEM;
}

/* "NAME@HOST:PORT": the peer name a certificate must carry, and the rest. */
static const char *take_peer_name(up_target *t, const char *s)
{
    const char *at = strchr(s, '@');
    if (!at)
        return s;
    size_t n = (size_t)(at - s);
    if (n == 0 || n >= sizeof(t->peer_name))
        return NULL;
    memcpy(t->peer_name, s, n);
    t->peer_name[n] = '\0';
    return at + 1;
}

static int parse_target(up_target *t, const char *name)
{
    if (!strncmp(name, "unix:", 5)) {
        struct sockaddr_un *a = (struct sockaddr_un *)&t->addr;
        const char *path = name + 5;
        if (!*path || strlen(path) >= sizeof(a->sun_path))
            return -EINVAL;
        memset(a, 0, sizeof(*a));
        a->sun_family = AF_UNIX;
        memcpy(a->sun_path, path, strlen(path) + 1);
        t->addr_len = sizeof(*a);
        t->kind = UP_UNIX;
        snprintf(t->host, sizeof(t->host), "localhost");
        return (t->authority = strdup("localhost")) ? 0 : -ENOMEM;
    }
    if (!strncmp(name, "tcp:", 4)) {
        t->kind = UP_TCP;
        return parse_host_port(t, name + 4);
    }
    if (!strncmp(name, "tls:", 4)) {
        t->kind = UP_TLS;
        const char *hp = take_peer_name(t, name + 4);
        return hp ? parse_host_port(t, hp) : -EINVAL;
    }
    return -EINVAL;
}

static up_target *target_find(gw_upstream_pool *p, const char *name)
{
    for (up_target *t = p->targets; t; t = t->next)
        if (!strcmp(t->name, name))
            return t;
    return NULL;
}

up_target *up_target_get(gw_upstream_pool *p, const char *name)
{
    if (!name)
        return NULL;
    up_target *t = target_find(p, name);
    if (!t) {
        if (!(t = calloc(1, sizeof(*t))))
            return NULL;
        t->pool = p;
        if (parse_target(t, name) || !(t->name = strdup(name))) {
            free(t->authority);
            free(t);
            return NULL;
        }
        t->next = p->targets;
        p->targets = t;
    }
    t->used_ns = gw_mono_ns();
    return t;
}

/* Forgets targets with no connection and no request waiting that nobody
 * asked for in idle_close_ms: one was kept for every endpoint string ever
 * seen, and a region rotating its endpoint (or a record written to do so)
 * grew the pool without end. At most once a second. */
static void sweep_targets(gw_upstream_pool *p)
{
    uint64_t now = gw_mono_ns();
    if (now - p->targets_swept_ns < 1000000000u)
        return;
    p->targets_swept_ns = now;
    uint64_t idle = (uint64_t)p->opts.idle_close_ms * 1000000u;
    for (up_target **tp = &p->targets; *tp;) {
        up_target *t = *tp;
        bool held = t->conns != NULL || now - t->used_ns < idle;
        for (gw_upstream_req *r = p->pending; r && !held; r = r->next)
            held = r->target == t;
        if (held) {
            tp = &t->next;
            continue;
        }
        *tp = t->next;
        free(t->name);
        free(t->authority);
        free(t);
    }
}

size_t gw_upstream_target_count(const gw_upstream_pool *p)
{
    size_t n = 0;
    for (const up_target *t = p->targets; t; t = t->next)
        n++;
    return n;
}

/* A connection of t with a free stream slot, else a new one, else (at the
 * bound on connections) the least loaded. NULL on out of memory. */
static up_conn *target_pick(up_target *t)
{
    up_conn *least = NULL;
    for (up_conn *c = t->conns; c; c = c->next) {
        if (!up_conn_usable(c))
            continue;
        if (c->n_reqs < up_conn_limit(c))
            return c;
        if (!least || c->n_reqs < least->n_reqs)
            least = c;
    }
    if (least && t->n_conns >= GW_UP_MAX_CONNS_PER_TARGET)
        return least;
    return up_conn_new(t, -1);
}

/* Peak-sensitive (as Finagle's and Linkerd's peak EWMA): a sample above
 * the average replaces it at once, one below pulls it down by 1/8. A
 * plain EWMA still read 269 ms 4 s after a peer's RTT went from 100 to
 * 500 ms, and routing kept sending it requests meanwhile. */
void up_target_rtt_sample(up_target *t, double us)
{
    if (t->n_rtt == 0 || us > t->rtt_ewma_us)
        t->rtt_ewma_us = us;
    else
        t->rtt_ewma_us += (us - t->rtt_ewma_us) / 8;
    t->rtt_us[t->rtt_pos] = us;
    t->answered_ms = gw_mono_ms();
    t->rtt_pos = (t->rtt_pos + 1) % GW_UP_RTT_SAMPLES;
    if (t->n_rtt < GW_UP_RTT_SAMPLES)
        t->n_rtt++;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int gw_upstream_rtt(gw_upstream_pool *p, const char *target, double *ewma_us, double *p95_us)
{
    up_target *t = target ? target_find(p, target) : NULL;
    if (!t || t->n_rtt == 0)
        return -ENOENT;
    double s[GW_UP_RTT_SAMPLES];
    memcpy(s, t->rtt_us, t->n_rtt * sizeof(s[0]));
    qsort(s, t->n_rtt, sizeof(s[0]), cmp_double);
    size_t k = (size_t)ceil(0.95 * t->n_rtt);
    /* A PING out longer than the average is a sample already: at least
     * that long (a peer slowed down is seen before its answer comes). */
    double ewma = t->rtt_ewma_us;
    uint64_t now = gw_mono_ns();
    for (const up_conn *c = t->conns; c; c = c->next)
        if (c->ping_sent_ns && now > c->ping_sent_ns && (double)(now - c->ping_sent_ns) / 1000.0 > ewma)
            ewma = (double)(now - c->ping_sent_ns) / 1000.0;
    if (ewma_us)
        *ewma_us = ewma;
    if (p95_us)
        *p95_us = s[k ? k - 1 : 0];
    return 0;
}

int64_t gw_upstream_ping_answered_ms(gw_upstream_pool *p, const char *target)
{
    up_target *t = target ? target_find(p, target) : NULL;
    return t ? t->answered_ms : 0;
}

void gw_upstream_set_ping_interval(gw_upstream_pool *p, int ping_interval_ms)
{
    p->ping_interval_ms = ping_interval_ms > 0 ? ping_interval_ms : 0;
    for (up_target *t = p->targets; t; t = t->next)
        for (up_conn *c = t->conns; c; c = c->next)
            up_conn_ping_rearm(c);
}

int gw_upstream_connect(gw_upstream_pool *p, const char *target)
{
    up_target *t = up_target_get(p, target);
    if (!t)
        return -EINVAL;
    for (up_conn *c = t->conns; c; c = c->next)
        if (up_conn_usable(c))
            return 0;
    return up_conn_new(t, -1) ? 0 : -ENOMEM;
}

/* ---- who answers ---- */

static struct up_expect *expect_find(const gw_upstream_pool *p, const char *target)
{
    for (int i = 0; i < p->n_expect; i++)
        if (!strcmp(p->expect[i].target, target))
            return &p->expect[i];
    return NULL;
}

int gw_upstream_expect_pid(gw_upstream_pool *p, const char *target, int pid)
{
    struct up_expect *e = expect_find(p, target);
    if (e) {
        e->pid = pid;
        return 0;
    }
    if (!pid)
        return 0;
    struct up_expect *grown = realloc(p->expect, sizeof(*grown) * (size_t)(p->n_expect + 1));
    if (!grown)
        return -ENOMEM;
    p->expect = grown;
    if (!(grown[p->n_expect].target = strdup(target)))
        return -ENOMEM;
    grown[p->n_expect++].pid = pid;
    return 0;
}

int up_target_expected_pid(const up_target *t)
{
    const struct up_expect *e = expect_find(t->pool, t->name);
    return e ? e->pid : 0;
}

void up_peer_refused(up_target *t, const char *fmt, ...)
{
    gw_upstream_pool *p = t->pool;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->peer_last, sizeof(p->peer_last), fmt, ap);
    va_end(ap);
    p->peer_refused++;
    /* Once in a row per target: a peer dialled every heartbeat would
     * fill the log with the same line. */
    if (!t->peer_told)
        fprintf(stderr, "infergate: %s: connection refused\n", p->peer_last);
    t->peer_told = true;
}

unsigned long long gw_upstream_peer_refused(const gw_upstream_pool *p, const char **last)
{
    if (last)
        *last = p->peer_last;
    return p->peer_refused;
}

int gw_upstream_adopt(gw_upstream_pool *p, const char *target, int fd)
{
    up_target *t = up_target_get(p, target);
    if (!t || t->kind == UP_TLS) {
        close(fd);
        return -EINVAL;
    }
    return up_conn_new(t, fd) ? 0 : -ENOMEM;
}

size_t gw_upstream_conn_count(gw_upstream_pool *p, const char *target)
{
    up_target *t = target_find(p, target);
    return t ? t->n_conns : 0;
}

/* ---- requests ---- */

/* Takes r off its list if its response has stood still too long. A
 * request whose caller holds data it has not taken waits for the caller. */
static void stall_check(gw_upstream_req *r, uint64_t now, gw_upstream_req **stalled)
{
    if (r->unconsumed || now - r->moved_ns <= r->pool->response_timeout_ns)
        return;
    r->never_sent = r->state == UP_RS_PENDING || (r->state == UP_RS_OPEN && !r->conn->ready);
    up_req_unlink(r, NGHTTP2_CANCEL);
    up_req_retire(r);
    r->stalled_next = *stalled;
    *stalled = r;
}

static void on_stall_sweep(evutil_socket_t fd, short what, void *arg)
{
    gw_upstream_pool *p = arg;
    uint64_t now = gw_mono_ns();
    gw_upstream_req *stalled = NULL, *r, *next;
    /* Taken off first, told after: a callback may send or cancel others. */
    for (r = p->pending; r; r = next) {
        next = r->next;
        stall_check(r, now, &stalled);
    }
    for (up_target *t = p->targets; t; t = t->next)
        for (up_conn *c = t->conns; c; c = c->next)
            for (r = c->reqs; r; r = next) {
                next = r->next;
                stall_check(r, now, &stalled);
            }
    /* A request that never left (no connection came up in the time) did
     * not stall at its target, which never had it: a connect timeout,
     * worth another target. */
    for (r = stalled; r; r = r->stalled_next) /* retired: freed only from the kick */
        if (r->cbs.on_error)
            r->cbs.on_error(r->ud, r->never_sent ? GW_UP_TIMEOUT : GW_UP_STALLED, r->responded);
}

void gw_upstream_set_response_timeout(gw_upstream_pool *p, int ms)
{
    p->opts.response_timeout_ms = ms > 0 ? ms : 0;
    p->response_timeout_ns = ms > 0 ? (uint64_t)ms * 1000000u : 0;
    event_del(p->stall_ev);
    if (ms <= 0)
        return;
    int every = ms / 8 < 10 ? 10 : ms / 8 > 1000 ? 1000 : ms / 8;
    struct timeval tv = {every / 1000, (every % 1000) * 1000};
    event_add(p->stall_ev, &tv);
}

static void on_kick(evutil_socket_t fd, short what, void *arg)
{
    gw_upstream_pool *p = arg;
    reap(p);
    sweep_targets(p);
    gw_upstream_req *r;
    /* Callbacks below may queue more requests: they are taken in this loop. */
    while ((r = p->pending)) {
        up_req_unlink(r, -1);
        up_conn *c;
        int rc = -ENOMEM;
        for (int tries = 0; tries < 4; tries++) {
            if (!(c = target_pick(r->target))) {
                rc = -ENOMEM;
                break;
            }
            if ((rc = up_conn_submit(c, r)) != -EAGAIN)
                break;
        }
        if (rc) {
            up_req_retire(r);
            if (r->cbs.on_error)
                r->cbs.on_error(r->ud, rc == -ENOMEM ? GW_UP_NOMEM : GW_UP_CONNECT, false);
        }
    }
}

static size_t str_size(const char *s)
{
    return s ? strlen(s) + 1 : 1;
}

/* Copies a string into the request's allocation; returns the next free byte. */
static char *put(char *dst, const char *s, size_t *len)
{
    *len = s ? strlen(s) : 0;
    if (*len)
        memcpy(dst, s, *len);
    dst[*len] = '\0';
    return dst + *len + 1;
}

gw_upstream_req *gw_upstream_send(gw_upstream_pool *p, const char *target, const char *method,
                                  const char *path, const char *authority, const gw_http_header *headers,
                                  size_t n_headers, const void *body, size_t body_len,
                                  const gw_upstream_cbs *cbs, void *ud)
{
    if (!p || !method || !path || !cbs || (n_headers && !headers) || (body_len && !body))
        return NULL;
    up_target *t = up_target_get(p, target);
    if (!t)
        return NULL;
    if (!authority)
        authority = t->authority;
    const char *scheme = t->kind == UP_TLS ? "https" : "http";
    size_t n_nv = n_headers + 4;
    if (n_headers > (SIZE_MAX - sizeof(gw_upstream_req)) / (2 * sizeof(nghttp2_nv)))
        return NULL;
    size_t size = sizeof(gw_upstream_req) + n_nv * sizeof(nghttp2_nv);
    size_t strs = str_size(method) + str_size(scheme) + str_size(authority) + str_size(path);
    for (size_t i = 0; i < n_headers; i++) {
        if (!headers[i].name || !headers[i].value)
            return NULL;
        strs += str_size(headers[i].name) + str_size(headers[i].value);
    }
    if (strs > SIZE_MAX - size || body_len > SIZE_MAX - size - strs)
        return NULL;
    /* Everything after the struct is written below. */
    gw_upstream_req *r = gw_mem_alloc(size + strs + body_len);
    if (!r)
        return NULL;
    memset(r, 0, sizeof(*r));
    r->pool = p;
    r->target = t;
    r->cbs = *cbs;
    r->ud = ud;
    r->nv = (nghttp2_nv *)(r + 1);
    r->n_nv = n_nv;
    char *s = (char *)(r->nv + n_nv);
    const char *names[4] = {":method", ":scheme", ":authority", ":path"};
    const char *values[4] = {method, scheme, authority, path};
    for (size_t i = 0; i < n_nv; i++) {
        const char *name = i < 4 ? names[i] : headers[i - 4].name;
        const char *value = i < 4 ? values[i] : headers[i - 4].value;
        nghttp2_nv *nv = &r->nv[i];
        nv->flags = NGHTTP2_NV_FLAG_NONE;
        if (i < 4) {
            nv->name = (uint8_t *)name; /* string literal */
            nv->namelen = strlen(name);
        } else {
            nv->name = (uint8_t *)s;
            s = put(s, name, &nv->namelen);
            /* New on every request: indexed, it would only push out fields
             * that repeat and lengthen the chain nghttp2 walks per request. */
            if (nv->namelen == 12 && !memcmp(name, "x-request-id", 12))
                nv->flags = NGHTTP2_NV_FLAG_NO_INDEX;
        }
        nv->value = (uint8_t *)s;
        s = put(s, value, &nv->valuelen);
    }
    if (body_len)
        memcpy(s, body, body_len);
    r->body = (const uint8_t *)s;
    r->body_len = body_len;
    up_req_progress(r);
    r->state = UP_RS_PENDING;
    r->prev = p->pending_tail;
    if (p->pending_tail)
        p->pending_tail->next = r;
    else
        p->pending = r;
    p->pending_tail = r;
    up_pool_kick(p);
    return r;
}

void gw_upstream_consume(gw_upstream_req *r, size_t n)
{
    if (r && r->state == UP_RS_OPEN && n) {
        up_req_progress(r);
        up_conn_consume(r, n);
    }
}

void gw_upstream_cancel(gw_upstream_req *r)
{
    if (!r)
        return;
    if (r->state == UP_RS_DONE) {
        /* Retired by a stall sweep that has not told it yet (the caller
         * cancels from another request's callback): it is not told. */
        r->cbs.on_error = NULL;
        return;
    }
    up_req_unlink(r, NGHTTP2_CANCEL);
    up_req_retire(r);
}
