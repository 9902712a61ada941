/* What a reload cannot change in a running gateway (see config.h):
 * section by section, what differs between the running config and a new
 * one, so that SIGHUP names what waits for a restart. */
#include "gateway/config/config.h"

#include <stdio.h>
#include <string.h>

static bool str_eq(const char *a, const char *b)
{
    return a == b || (a && b && !strcmp(a, b));
}

static bool strs_eq(char *const *a, int na, char *const *b, int nb)
{
    if (na != nb)
        return false;
    for (int i = 0; i < na; i++)
        if (!str_eq(a[i], b[i]))
            return false;
    return true;
}

/* A listener's TLS files and peer names reload (gw_http_server_set_tls);
 * its address, and whether it has TLS at all, wait for a restart. */
static bool listen_eq(const gw_listen_cfg *a, const gw_listen_cfg *b)
{
    return str_eq(a->address, b->address) && (a->tls_cert != NULL) == (b->tls_cert != NULL);
}

static bool worker_eq(const gw_worker_cfg *a, const gw_worker_cfg *b)
{
    return str_eq(a->model, b->model) && str_eq(a->name, b->name) &&
           strs_eq(a->devices, a->n_devices, b->devices, b->n_devices) && a->threads == b->threads &&
           a->kv_cache_mb == b->kv_cache_mb && a->max_seqs == b->max_seqs &&
           a->max_batch_tokens == b->max_batch_tokens && a->max_queue == b->max_queue &&
           a->batch_max_wait_ms == b->batch_max_wait_ms && a->prompt_max_wait_ms == b->prompt_max_wait_ms &&
           a->kv_q8_0 == b->kv_q8_0 && a->prefix_cache == b->prefix_cache &&
           str_eq(a->chat_template, b->chat_template) && a->power_watts == b->power_watts;
}

static bool region_eq(const gw_region_cfg *a, const gw_region_cfg *b)
{
    return str_eq(a->name, b->name) && str_eq(a->endpoint, b->endpoint) &&
           strs_eq(a->tags, a->n_tags, b->tags, b->n_tags) && a->price_in == b->price_in &&
           a->price_out == b->price_out && str_eq(a->gpu, b->gpu) && a->carbon == b->carbon &&
           str_eq(a->carbon_source, b->carbon_source) && a->carbon_poll_ms == b->carbon_poll_ms;
}

static bool redis_eq(const gw_redis_cfg *a, const gw_redis_cfg *b)
{
    return str_eq(a->address, b->address) && str_eq(a->password, b->password) && a->db == b->db &&
           a->timeout_ms == b->timeout_ms;
}

/* The routing settings fixed at start; policy, slo_ms, spread,
 * cache_aware, retry_budget, replay, replay_max and the hedge keys are
 * read per request and reload, and so do the health_check keys (read at
 * each check). */
static bool routing_fixed_eq(const gw_routing_cfg *a, const gw_routing_cfg *b)
{
    return a->heartbeat_ms == b->heartbeat_ms && a->stale_after_ms == b->stale_after_ms &&
           a->eject_after == b->eject_after && a->eject_base_ms == b->eject_base_ms &&
           a->eject_max_ms == b->eject_max_ms && a->ping_interval_ms == b->ping_interval_ms;
}

static bool peers_eq(const gw_config *a, const gw_config *b)
{
    if (a->n_peers != b->n_peers)
        return false;
    for (int i = 0; i < a->n_peers; i++)
        if (!str_eq(a->peers[i].name, b->peers[i].name) ||
            !str_eq(a->peers[i].endpoint, b->peers[i].endpoint))
            return false;
    return gw_config_peer_tls_eq(a, b);
}

bool gw_config_peer_tls_eq(const gw_config *a, const gw_config *b)
{
    return str_eq(a->peer_tls.ca, b->peer_tls.ca) && str_eq(a->peer_tls.cert, b->peer_tls.cert) &&
           str_eq(a->peer_tls.key, b->peer_tls.key);
}

int gw_config_restart_diff(const gw_config *run, const gw_config *c, char *out, size_t len)
{
    bool listen = run->n_listen == c->n_listen, workers = run->n_workers == c->n_workers;
    for (int i = 0; listen && i < c->n_listen; i++)
        listen = listen_eq(&run->listen[i], &c->listen[i]);
    for (int i = 0; workers && i < c->n_workers; i++)
        workers = worker_eq(&run->workers[i], &c->workers[i]);
    const struct {
        bool same;
        const char *name;
    } parts[] = {
        {listen, "listen"},
        {workers, "workers"},
        {region_eq(&run->region, &c->region), "region"},
        {str_eq(run->cluster, c->cluster), "cluster"},
        {redis_eq(&run->redis, &c->redis), "redis"},
        {routing_fixed_eq(&run->routing, &c->routing),
         "routing (heartbeat_ms, stale_after_ms, ejection, ping_interval_ms)"},
        {peers_eq(run, c), "peers, peer_tls"},
        {str_eq(run->access_log, c->access_log) && run->access_log_mode == c->access_log_mode, "logging"},
        {run->stats_interval_ms == c->stats_interval_ms, "stats_interval_ms"},
        {str_eq(run->runtime_dir, c->runtime_dir), "runtime_dir"},
    };
    int n = 0;
    size_t at = 0;
    if (len)
        out[0] = '\0';
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
        if (parts[i].same)
            continue;
        if (at < len) {
            int w = snprintf(out + at, len - at, "%s%s", n ? ", " : "", parts[i].name);
            at += w > 0 ? (size_t)w : 0;
        }
        n++;
    }
    return n;
}
