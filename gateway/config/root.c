/* The top level of a config file (see config.h): its keys, the order the
 * sections are read in (tenants before listen, the region sections last),
 * and the settings small enough to need no file of their own: limits,
 * logging and the process's scalars, with their defaults. */
#include "gateway/config/config_internal.h"
#include "gateway/cmd/cli.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Leaves room in sun_path (108 bytes) for the worker socket names. */
#define CFG_RUNTIME_DIR_MAX 80

int gw_cfg_root_init(gw_config *c)
{
    gw_limits_cfg *l = &c->limits;
    l->max_body_bytes = 1048576;
    l->max_header_bytes = 65536;
    l->max_concurrent_streams = 256;
    l->max_connections = 10000;
    l->header_timeout_ms = 10000;
    l->idle_timeout_ms = 120000;
    l->stream_buffer_bytes = 1048576;
    l->conn_buffer_bytes = 16777216;
    l->buffer_bytes = 268435456;
    l->min_read_rate_bytes = 4096;
    l->response_timeout_ms = 600000;
    c->drain_grace_s = 30;
    c->stats_interval_ms = 250;
    c->worker_hang_timeout_s = 30;
    c->access_log_mode = 0640;
    return (c->access_log = strdup("stdout")) ? 0 : -ENOMEM;
}

static int parse_limits(cfg_parser *p, const yaml_node_t *n, gw_limits_cfg *l)
{
    enum {
        K_BODY,
        K_HDR,
        K_STREAMS,
        K_CONNS,
        K_HDR_TO,
        K_IDLE_TO,
        K_BUF,
        K_RESP_TO,
        K_CONN_BUF,
        K_ALL_BUF,
        K_READ_RATE,
        K_N
    };
    static const char *const keys[K_N] = {
        "max_body_bytes",    "max_header_bytes", "max_concurrent_streams", "max_connections",
        "header_timeout_ms", "idle_timeout_ms",  "stream_buffer_bytes",    "response_timeout_ms",
        "conn_buffer_bytes", "buffer_bytes",     "min_read_rate_bytes"};
    static const long long lo[K_N] = {1, 1024, 1, 1, 1, 1, 4096, 0, 4096, 4096, 0};
    static const long long hi[K_N] = {GW_WORKER_MAX_BODY, 1 << 24,  INT_MAX,  INT_MAX,    86400000,  86400000,
                                      1LL << 30,          86400000, 1LL << 34, 1LL << 40, 1LL << 34};
    yaml_node_t *v[K_N];
    int rc = gw_cfg_map_take(p, n, "limits", keys, K_N, v);
    if (rc)
        return rc;
    for (int k = 0; k < K_N; k++) {
        char kp[CFG_PATH_MAX];
        long long x;
        if (!v[k])
            continue;
        if ((rc = gw_cfg_int(p, v[k], (gw_cfg_path_key(kp, "limits", keys[k]), kp), lo[k], hi[k], &x)))
            return rc;
        switch (k) {
        case K_BODY:
            l->max_body_bytes = (size_t)x;
            break;
        case K_HDR:
            l->max_header_bytes = (size_t)x;
            break;
        case K_STREAMS:
            l->max_concurrent_streams = (uint32_t)x;
            break;
        case K_CONNS:
            l->max_connections = (int)x;
            break;
        case K_HDR_TO:
            l->header_timeout_ms = (int)x;
            break;
        case K_IDLE_TO:
            l->idle_timeout_ms = (int)x;
            break;
        case K_BUF:
            l->stream_buffer_bytes = (size_t)x;
            break;
        case K_RESP_TO:
            l->response_timeout_ms = (int)x;
            break;
        case K_CONN_BUF:
            l->conn_buffer_bytes = (size_t)x;
            break;
        case K_ALL_BUF:
            l->buffer_bytes = (size_t)x;
            break;
        case K_READ_RATE:
            l->min_read_rate_bytes = (size_t)x;
            break;
        }
    }
    /* Each bound holds the one inside it: a stream's buffer in its
     * connection's, a connection's in the gateway's. */
    if (l->conn_buffer_bytes < l->stream_buffer_bytes)
        return gw_cfg_perr(p, v[K_CONN_BUF] ? v[K_CONN_BUF] : v[K_BUF], "limits.conn_buffer_bytes",
                           "conn_buffer_bytes (%zu) must be at least stream_buffer_bytes (%zu)",
                           l->conn_buffer_bytes, l->stream_buffer_bytes);
    if (l->buffer_bytes < l->conn_buffer_bytes)
        return gw_cfg_perr(p, v[K_ALL_BUF] ? v[K_ALL_BUF] : v[K_CONN_BUF], "limits.buffer_bytes",
                           "buffer_bytes (%zu) must be at least conn_buffer_bytes (%zu)", l->buffer_bytes,
                           l->conn_buffer_bytes);
    return 0;
}

/* An octal mode, as chmod takes it; a log others could write to could be
 * filled with lines no request made. */
static int parse_log_mode(cfg_parser *p, const yaml_node_t *n, gw_config *c)
{
    const char *path = "logging.access_log_mode";
    if (n->type != YAML_SCALAR_NODE || gw_cfg_is_null(n))
        return gw_cfg_perr(p, n, path, "must be an octal mode such as \"0640\", not %s", gw_cfg_node_kind(n));
    const char *v = (const char *)n->data.scalar.value;
    size_t len = n->data.scalar.length;
    unsigned m = 0;
    bool ok = len >= 3 && len <= 4;
    for (size_t i = 0; ok && i < len; i++) {
        ok = v[i] >= '0' && v[i] <= '7';
        m = m * 8 + (unsigned)(v[i] - '0');
    }
    if (!ok || m > 0777)
        return gw_cfg_perr(p, n, path, "must be an octal mode such as \"0640\"");
    if (m & 0002)
        return gw_cfg_perr(p, n, path, "%04o lets every local user write to the log", m);
    c->access_log_mode = m;
    return 0;
}

static int parse_logging(cfg_parser *p, const yaml_node_t *n, gw_config *c)
{
    static const char *const keys[] = {"access_log", "access_log_mode"};
    yaml_node_t *v[2];
    int rc = gw_cfg_map_take(p, n, "logging", keys, 2, v);
    if (rc)
        return rc;
    if (v[0] && (rc = gw_cfg_str(p, v[0], "logging.access_log", &c->access_log)))
        return rc;
    return v[1] ? parse_log_mode(p, v[1], c) : 0;
}

static int parse_runtime_dir(cfg_parser *p, const yaml_node_t *n, gw_config *c)
{
    int rc = gw_cfg_str(p, n, "runtime_dir", &c->runtime_dir);
    if (rc)
        return rc;
    if (c->runtime_dir[0] != '/')
        return gw_cfg_perr(p, n, "runtime_dir", "must be an absolute path");
    if (strlen(c->runtime_dir) > CFG_RUNTIME_DIR_MAX)
        return gw_cfg_perr(p, n, "runtime_dir",
                           "longer than %d bytes: worker socket paths would not fit a Unix socket address",
                           CFG_RUNTIME_DIR_MAX);
    return 0;
}

/* Without a region this gateway has no tags to hold a tenant's requests
 * to: they would be served here whatever it asked; nor a price, so a
 * budget would never be reached. tenants is the parsed section's node
 * (NULL when there is none). */
static int check_no_residency(cfg_parser *p, const yaml_node_t *tenants, const gw_config *c)
{
    for (int i = 0; i < c->n_tenants; i++) {
        const gw_tenant_cfg *t = &c->tenants[i];
        const char *key = t->n_residency > 0                             ? "residency"
                          : t->budget_daily > 0 || t->budget_monthly > 0 ? "budget"
                                                                         : NULL;
        if (!key)
            continue;
        char tp[CFG_PATH_MAX], rp[CFG_PATH_MAX];
        gw_cfg_path_idx(tp, "tenants", i);
        gw_cfg_path_key(rp, tp, key);
        const yaml_node_t *item = yaml_document_get_node(p->doc, tenants->data.sequence.items.start[i]);
        return gw_cfg_perr(p, gw_cfg_map_value(p, item, key), rp, "%s",
                           key[0] == 'r'
                               ? "residency needs a region section: its tags say where this gateway may serve"
                               : "a budget needs a region section: its price is what requests cost "
                                 "(without one every request costs 0)");
    }
    return 0;
}

int gw_cfg_parse_root(cfg_parser *p, const yaml_node_t *root, gw_config *c)
{
    enum {
        K_LISTEN,
        K_WORKERS,
        K_TENANTS,
        K_LIMITS,
        K_LOGGING,
        K_DRAIN,
        K_STATS,
        K_HANG,
        K_RUNDIR,
        K_REGION,
        K_CLUSTER,
        K_REDIS,
        K_ROUTING,
        K_PEERS,
        K_PEER_TLS,
        K_N
    };
    static const char *const keys[K_N] = {
        "listen",      "workers",       "tenants",           "limits",
        "logging",     "drain_grace_s", "stats_interval_ms", "worker_hang_timeout_s",
        "runtime_dir", "region",        "cluster",           "redis",
        "routing",     "peers",         "peer_tls"};
    yaml_node_t *v[K_N] = {0};
    int rc;
    long long x;
    if (root && (rc = gw_cfg_map_take(p, root, "", keys, K_N, v)))
        return rc;
    /* Tenants first: whether the listeners may leave loopback depends on them. */
    if (v[K_TENANTS] && (rc = gw_cfg_parse_tenants(p, v[K_TENANTS], c)))
        return rc;
    if ((rc = v[K_LISTEN] ? gw_cfg_parse_listen(p, v[K_LISTEN], c) : gw_cfg_listen_default(c)))
        return rc;
    if (v[K_WORKERS] && (rc = gw_cfg_parse_workers(p, v[K_WORKERS], c)))
        return rc;
    if (v[K_LIMITS] && (rc = parse_limits(p, v[K_LIMITS], &c->limits)))
        return rc;
    if (v[K_LOGGING] && (rc = parse_logging(p, v[K_LOGGING], c)))
        return rc;
    if (v[K_DRAIN]) {
        if ((rc = gw_cfg_int(p, v[K_DRAIN], "drain_grace_s", 0, 86400, &x)))
            return rc;
        c->drain_grace_s = (int)x;
    }
    if (v[K_STATS]) {
        if ((rc = gw_cfg_int(p, v[K_STATS], "stats_interval_ms", 10, 60000, &x)))
            return rc;
        c->stats_interval_ms = (int)x;
    }
    if (v[K_HANG]) {
        if ((rc = gw_cfg_int(p, v[K_HANG], "worker_hang_timeout_s", 0, 86400, &x)))
            return rc;
        c->worker_hang_timeout_s = (int)x;
    }
    if (v[K_RUNDIR] && (rc = parse_runtime_dir(p, v[K_RUNDIR], c)))
        return rc;
    if (!v[K_REGION] && (rc = check_no_residency(p, v[K_TENANTS], c)))
        return rc;
    return gw_cfg_parse_routing(p, v[K_REGION], v[K_CLUSTER], v[K_REDIS], v[K_ROUTING], v[K_PEERS],
                                v[K_PEER_TLS], c);
}
