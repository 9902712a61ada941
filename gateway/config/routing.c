/* Gateway configuration, the multi-region part (see the schema in
 * config.h): this gateway's region record, the Redis connection, routing
 * parameters, static peers and the peer TLS client identity, and the
 * tenants' routing keys. Names and tags end up in Redis keys and in
 * comma-separated record fields, so they are held to a small alphabet here
 * rather than failing later on another gateway. */
#include "gateway/config/config.h"
#include "gateway/config/config_internal.h"
#include "routing/record_auth.h"
#include "routing/region.h"
#include "routing/router.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define CFG_MAX_PEERS 256
/* The record's buffers, NUL included. */
#define TAG_SIZE ((int)sizeof(((route_record *)0)->tags[0]))
#define ENDPOINT_SIZE ((int)sizeof(((route_record *)0)->endpoint))
#define GPU_SIZE ((int)sizeof(((route_record *)0)->gpu))

static const char name_chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-";

static bool valid_name(const char *s, size_t max)
{
    size_t n = strlen(s);
    return n >= 1 && n <= max && strspn(s, name_chars) == n;
}

int gw_cfg_routing_init(gw_config *c)
{
    c->routing = (gw_routing_cfg){.policy = GW_POLICY_LATENCY,
                                  .slo_ms = 500,
                                  .spread = true,
                                  .cache_aware = true,
                                  .heartbeat_ms = 1000,
                                  .stale_after_ms = 3000,
                                  .eject_after = 3,
                                  .eject_base_ms = 1000,
                                  .eject_max_ms = 30000,
                                  .ping_interval_ms = 250,
                                  .retry_budget = 0.2,
                                  .primary_return = 0.8,
                                  .primary_hold_ms = 3000,
                                  .replay = true,
                                  .replay_max = 2,
                                  .hedge_max_tokens = 64,
                                  .hedge_share = 0.05,
                                  .health_check_timeout_ms = 5000,
                                  .health_check_failures = 2,
                                  .health_check_successes = 2};
    c->region.carbon_poll_ms = 60000;
    return (c->cluster = strdup("default")) ? 0 : -ENOMEM;
}

void gw_cfg_routing_free(gw_config *c)
{
    free(c->region.name);
    free(c->region.endpoint);
    gw_cfg_free_str_list(c->region.tags, c->region.n_tags);
    free(c->region.gpu);
    free(c->region.carbon_source);
    gw_cfg_free_str_list(c->routing.primary, c->routing.n_primary);
    free(c->cluster);
    free(c->redis.address);
    free(c->redis.host);
    free(c->redis.password);
    for (int i = 0; i < c->redis.n_record_keys; i++) /* secrets: not left in freed memory */
        memset(c->redis.record_keys[i], 0, strlen(c->redis.record_keys[i]));
    gw_cfg_free_str_list(c->redis.record_keys, c->redis.n_record_keys);
    for (int i = 0; i < c->n_peers; i++) {
        free(c->peers[i].name);
        free(c->peers[i].endpoint);
    }
    free(c->peers);
    free(c->peer_tls.ca);
    free(c->peer_tls.cert);
    free(c->peer_tls.key);
}

/* ---- shared value checks ---- */

/* A list of names, each valid_name within size - 1 bytes, none twice:
 * bad_name begins the message for one that is not ("a tag is", "must be"),
 * what names an item in the message for a repeat. */
static int name_list(cfg_parser *p, const yaml_node_t *n, const char *path, int max, int size, const char *bad_name,
                     const char *what, char ***out, int *count)
{
    int rc = gw_cfg_str_list(p, n, path, max, out, count);
    if (rc)
        return rc;
    for (int i = 0; i < *count; i++) {
        char ip[CFG_PATH_MAX];
        const yaml_node_t *it = yaml_document_get_node(p->doc, n->data.sequence.items.start[i]);
        gw_cfg_path_idx(ip, path, i);
        if (!valid_name((*out)[i], (size_t)size - 1))
            return gw_cfg_perr(p, it, ip, "%s 1 to %d characters from A-Z a-z 0-9 . _ -", bad_name, size - 1);
        for (int j = 0; j < i; j++)
            if (!strcmp((*out)[i], (*out)[j]))
                return gw_cfg_perr(p, it, ip, "%s %s is listed twice", what, (*out)[i]);
    }
    return 0;
}

int gw_cfg_tags(cfg_parser *p, const yaml_node_t *n, const char *path, char ***out, int *count)
{
    return name_list(p, n, path, ROUTE_MAX_TAGS, TAG_SIZE, "a tag is", "tag", out, count);
}

static const char *const policy_names[] = {"default", "latency", "cost", "carbon", "primary"};

const char *gw_policy_name(gw_route_policy p)
{
    return (unsigned)p < sizeof(policy_names) / sizeof(policy_names[0]) ? policy_names[p] : "?";
}

int gw_cfg_policy(cfg_parser *p, const yaml_node_t *n, const char *path, gw_route_policy *out)
{
    char *s = NULL;
    int rc = gw_cfg_str(p, n, path, &s);
    if (rc)
        return rc;
    *out = GW_POLICY_DEFAULT;
    for (int i = GW_POLICY_LATENCY; i <= GW_POLICY_PRIMARY; i++)
        if (!strcmp(s, policy_names[i]))
            *out = (gw_route_policy)i;
    if (*out == GW_POLICY_DEFAULT)
        rc = gw_cfg_perr(p, n, path, "must be latency, cost, carbon or primary");
    free(s);
    return rc;
}

/* policy primary's list: region names, none twice, at most ROUTE_MAX_PRIMARY. */
int gw_cfg_region_list(cfg_parser *p, const yaml_node_t *n, const char *path, char ***out, int *count)
{
    int rc = name_list(p, n, path, ROUTE_MAX_PRIMARY, ROUTE_NAME_MAX, "must be", "region", out, count);
    return !rc && *count == 0 ? gw_cfg_perr(p, n, path, "give at least one region name") : rc;
}

/* region.carbon_source: a file path, or http://HOST:PORT/PATH with HOST
 * numeric or localhost (polled from the event loop without a blocking
 * DNS lookup); https is not polled. */
static int get_carbon_source(cfg_parser *p, const yaml_node_t *n, char **out)
{
    int rc = gw_cfg_str(p, n, "region.carbon_source", out);
    if (rc)
        return rc;
    const char *s = *out;
    if (!*s || strlen(s) > 1024)
        return gw_cfg_perr(p, n, "region.carbon_source", "a file path or http://HOST:PORT/PATH of 1-1024 bytes");
    if (strncmp(s, "http://", 7)) {
        if (strstr(s, "://"))
            return gw_cfg_perr(p, n, "region.carbon_source", "only http:// URLs (or a file path) are polled");
        return 0;
    }
    const char *slash = strchr(s + 7, '/');
    char hp[300], host[ROUTE_HOST_MAX];
    size_t len = slash ? (size_t)(slash - (s + 7)) : strlen(s + 7);
    int port;
    if (len >= sizeof(hp))
        return gw_cfg_perr(p, n, "region.carbon_source", "HOST:PORT is too long");
    memcpy(hp, s + 7, len);
    hp[len] = '\0';
    const char *why = route_host_port(hp, host, &port);
    return why ? gw_cfg_perr(p, n, "region.carbon_source", "%s", why) : 0;
}

/* "tls:HOST:PORT" | "tcp:HOST:PORT", within a record's endpoint field. */
static int get_endpoint(cfg_parser *p, const yaml_node_t *n, const char *path, char **out)
{
    int rc = gw_cfg_str(p, n, path, out);
    if (rc)
        return rc;
    if (strlen(*out) >= (size_t)ENDPOINT_SIZE)
        return gw_cfg_perr(p, n, path, "longer than %d bytes", ENDPOINT_SIZE - 1);
    const char *why = route_endpoint_check(*out);
    return why ? gw_cfg_perr(p, n, path, "%s", why) : 0;
}

/* ---- sections ---- */

static int parse_region(cfg_parser *p, const yaml_node_t *n, gw_region_cfg *r)
{
    enum { K_NAME, K_ENDPOINT, K_TAGS, K_PRICE, K_GPU, K_CARBON, K_CSRC, K_CPOLL, K_N };
    static const char *const keys[K_N] = {"name", "endpoint", "tags",          "price",
                                          "gpu",  "carbon",   "carbon_source", "carbon_poll_ms"};
    static const char *const price_keys[] = {"input", "output"};
    yaml_node_t *v[K_N], *pv[2];
    int rc = gw_cfg_map_take(p, n, "region", keys, K_N, v);
    if (rc)
        return rc;
    if (!v[K_NAME])
        return gw_cfg_perr(p, n, "region.name", "required");
    if ((rc = gw_cfg_str(p, v[K_NAME], "region.name", &r->name)))
        return rc;
    if (!valid_name(r->name, ROUTE_NAME_MAX - 1))
        return gw_cfg_perr(p, v[K_NAME], "region.name", "must be 1 to %d characters from A-Z a-z 0-9 . _ -",
                           ROUTE_NAME_MAX - 1);
    if (v[K_ENDPOINT] && (rc = get_endpoint(p, v[K_ENDPOINT], "region.endpoint", &r->endpoint)))
        return rc;
    if (v[K_TAGS] && (rc = gw_cfg_tags(p, v[K_TAGS], "region.tags", &r->tags, &r->n_tags)))
        return rc;
    if (v[K_PRICE]) {
        if ((rc = gw_cfg_map_take(p, v[K_PRICE], "region.price", price_keys, 2, pv)))
            return rc;
        if (pv[0] && (rc = gw_cfg_num(p, pv[0], "region.price.input", 1e9, &r->price_in)))
            return rc;
        if (pv[1] && (rc = gw_cfg_num(p, pv[1], "region.price.output", 1e9, &r->price_out)))
            return rc;
    }
    if (v[K_GPU]) {
        if ((rc = gw_cfg_str(p, v[K_GPU], "region.gpu", &r->gpu)))
            return rc;
        if (strlen(r->gpu) >= (size_t)GPU_SIZE)
            return gw_cfg_perr(p, v[K_GPU], "region.gpu", "longer than %d bytes", GPU_SIZE - 1);
    }
    if (v[K_CARBON] && (rc = gw_cfg_num(p, v[K_CARBON], "region.carbon", ROUTE_MAX_CARBON, &r->carbon)))
        return rc;
    if (v[K_CSRC] && (rc = get_carbon_source(p, v[K_CSRC], &r->carbon_source)))
        return rc;
    long long x;
    if (v[K_CPOLL]) {
        if ((rc = gw_cfg_int(p, v[K_CPOLL], "region.carbon_poll_ms", 1000, 86400000, &x)))
            return rc;
        r->carbon_poll_ms = (int)x;
    }
    return 0;
}

/* redis.record_keys: without a fleet key, whoever can write to Redis could
 * add a region that receives tenants' prompts. */
static int parse_record_keys(cfg_parser *p, const yaml_node_t *redis, const yaml_node_t *n, gw_redis_cfg *r)
{
    if (!n)
        return gw_cfg_perr(p, redis, "redis.record_keys",
                           "required: the fleet key that signs and proves the region records in Redis, the "
                           "same in every gateway (32 to 128 bytes: `openssl rand -hex 32`)");
    int rc =
        gw_cfg_str_list(p, n, "redis.record_keys", ROUTE_AUTH_MAX_KEYS, &r->record_keys, &r->n_record_keys);
    if (rc)
        return rc;
    route_auth_keys k;
    char why[160];
    rc = route_auth_keys_set(&k, (const char *const *)r->record_keys, r->n_record_keys, why, sizeof(why));
    memset(&k, 0, sizeof(k));
    if (!rc && r->n_record_keys == 0)
        return gw_cfg_perr(p, n, "redis.record_keys", "give one key (two while rotating)");
    return rc ? gw_cfg_perr(p, n, "redis.record_keys", "%s", why) : 0;
}

static int parse_redis(cfg_parser *p, const yaml_node_t *n, gw_redis_cfg *r)
{
    enum { K_ADDRESS, K_PASSWORD, K_DB, K_TIMEOUT, K_KEYS, K_N };
    static const char *const keys[K_N] = {"address", "password", "db", "timeout_ms", "record_keys"};
    yaml_node_t *v[K_N];
    int rc = gw_cfg_map_take(p, n, "redis", keys, K_N, v);
    if (rc)
        return rc;
    if (!v[K_ADDRESS])
        return gw_cfg_perr(p, n, "redis.address", "required");
    if ((rc = gw_cfg_str(p, v[K_ADDRESS], "redis.address", &r->address)))
        return rc;
    char host[ROUTE_HOST_MAX];
    const char *why = route_host_port(r->address, host, &r->port);
    if (why)
        return gw_cfg_perr(p, v[K_ADDRESS], "redis.address", "%s", why);
    if (!(r->host = strdup(host)))
        return -ENOMEM;
    if (v[K_PASSWORD] && (rc = gw_cfg_str(p, v[K_PASSWORD], "redis.password", &r->password)))
        return rc;
    if (r->password && strlen(r->password) > 255) /* AUTH's limit in routing/sync.c */
        return gw_cfg_perr(p, v[K_PASSWORD], "redis.password", "at most 255 bytes");
    long long x;
    if (v[K_DB]) {
        if ((rc = gw_cfg_int(p, v[K_DB], "redis.db", 0, 65535, &x)))
            return rc;
        r->db = (int)x;
    }
    r->timeout_ms = 500;
    if (v[K_TIMEOUT]) {
        if ((rc = gw_cfg_int(p, v[K_TIMEOUT], "redis.timeout_ms", 10, 60000, &x)))
            return rc;
        r->timeout_ms = (int)x;
    }
    return parse_record_keys(p, n, v[K_KEYS], r);
}

/* Hedged requests: hedge, hedge_max_tokens, hedge_delay_ms, hedge_share
 * (v[0..3], each NULL when not given). */
static int parse_hedge(cfg_parser *p, yaml_node_t *const *v, gw_routing_cfg *r)
{
    long long x;
    int rc;
    if (v[0] && (rc = gw_cfg_bool(p, v[0], "routing.hedge", &r->hedge)))
        return rc;
    if (v[1]) {
        if ((rc = gw_cfg_int(p, v[1], "routing.hedge_max_tokens", 1, 1000000, &x)))
            return rc;
        r->hedge_max_tokens = (int)x;
    }
    if (v[2]) {
        if ((rc = gw_cfg_int(p, v[2], "routing.hedge_delay_ms", 0, 600000, &x)))
            return rc;
        r->hedge_delay_ms = (int)x;
    }
    return v[3] ? gw_cfg_num(p, v[3], "routing.hedge_share", 1, &r->hedge_share) : 0;
}

static int parse_routing(cfg_parser *p, const yaml_node_t *n, gw_routing_cfg *r)
{
    enum {
        K_POLICY,
        K_SLO,
        K_HB,
        K_STALE,
        K_EJ_AFTER,
        K_EJ_BASE,
        K_EJ_MAX,
        K_PING,
        K_HOLD,
        K_REPLAY_MAX,
        K_HC,
        K_HC_TIMEOUT,
        K_HC_FAILURES,
        K_HC_SUCCESSES,
        K_RETRY,
        K_SPREAD,
        K_PRIMARY,
        K_RETURN,
        K_CACHE_AWARE,
        K_REPLAY,
        K_HEDGE,
        K_HEDGE_TOKENS,
        K_HEDGE_DELAY,
        K_HEDGE_SHARE,
        K_N
    };
    static const char *const keys[K_N] = {
        "policy",        "slo_ms",       "heartbeat_ms",     "stale_after_ms",  "eject_after",
        "eject_base_ms", "eject_max_ms", "ping_interval_ms", "primary_hold_ms", "replay_max",
        "health_check_ms", "health_check_timeout_ms", "health_check_failures", "health_check_successes",
        "retry_budget",  "spread",       "primary",          "primary_return",  "cache_aware",
        "replay",        "hedge",        "hedge_max_tokens", "hedge_delay_ms",  "hedge_share"};
    static const long long lo[K_N] = {[K_HB] = 50,     [K_STALE] = 50, [K_EJ_AFTER] = 0, [K_EJ_BASE] = 1,
                                      [K_EJ_MAX] = 1, [K_PING] = 50,  [K_HOLD] = 0,     [K_REPLAY_MAX] = 0,
                                      [K_HC] = 0,     [K_HC_TIMEOUT] = 50, [K_HC_FAILURES] = 1,
                                      [K_HC_SUCCESSES] = 1};
    static const long long hi[K_N] = {[K_HB] = 60000,        [K_STALE] = 3600000,   [K_EJ_AFTER] = 1000,
                                      [K_EJ_BASE] = 3600000, [K_EJ_MAX] = 86400000, [K_PING] = 60000,
                                      [K_HOLD] = 3600000,    [K_REPLAY_MAX] = 16,   [K_HC] = 3600000,
                                      [K_HC_TIMEOUT] = 600000, [K_HC_FAILURES] = 100, [K_HC_SUCCESSES] = 100};
    int *ints[K_N] = {[K_HB] = &r->heartbeat_ms,       [K_STALE] = &r->stale_after_ms,
                      [K_EJ_AFTER] = &r->eject_after,  [K_EJ_BASE] = &r->eject_base_ms,
                      [K_EJ_MAX] = &r->eject_max_ms,   [K_PING] = &r->ping_interval_ms,
                      [K_HOLD] = &r->primary_hold_ms, [K_REPLAY_MAX] = &r->replay_max,
                      [K_HC] = &r->health_check_ms,   [K_HC_TIMEOUT] = &r->health_check_timeout_ms,
                      [K_HC_FAILURES] = &r->health_check_failures,
                      [K_HC_SUCCESSES] = &r->health_check_successes};
    yaml_node_t *v[K_N];
    char kp[CFG_PATH_MAX];
    int rc = gw_cfg_map_take(p, n, "routing", keys, K_N, v);
    if (rc)
        return rc;
    if (v[K_POLICY] && (rc = gw_cfg_policy(p, v[K_POLICY], "routing.policy", &r->policy)))
        return rc;
    if (v[K_SLO] && (rc = gw_cfg_num(p, v[K_SLO], "routing.slo_ms", 3600000, &r->slo_ms)))
        return rc;
    if (v[K_RETRY] && (rc = gw_cfg_num(p, v[K_RETRY], "routing.retry_budget", 1, &r->retry_budget)))
        return rc;
    if (v[K_SPREAD] && (rc = gw_cfg_bool(p, v[K_SPREAD], "routing.spread", &r->spread)))
        return rc;
    if (v[K_CACHE_AWARE] && (rc = gw_cfg_bool(p, v[K_CACHE_AWARE], "routing.cache_aware", &r->cache_aware)))
        return rc;
    if (v[K_PRIMARY] &&
        (rc = gw_cfg_region_list(p, v[K_PRIMARY], "routing.primary", &r->primary, &r->n_primary)))
        return rc;
    if (v[K_RETURN]) {
        if ((rc = gw_cfg_num(p, v[K_RETURN], "routing.primary_return", 1, &r->primary_return)))
            return rc;
        if (!(r->primary_return > 0))
            return gw_cfg_perr(p, v[K_RETURN], "routing.primary_return",
                               "must be more than 0 (a fraction of slo_ms, at most 1)");
    }
    if (r->policy == GW_POLICY_PRIMARY && !r->n_primary)
        return gw_cfg_perr(p, v[K_POLICY], "routing.policy",
                           "primary needs routing.primary: the preferred regions, in order");
    if (v[K_REPLAY] && (rc = gw_cfg_bool(p, v[K_REPLAY], "routing.replay", &r->replay)))
        return rc;
    if ((rc = parse_hedge(p, v + K_HEDGE, r)))
        return rc;
    for (int k = K_HB; k <= K_HC_SUCCESSES; k++) {
        long long x;
        if (!v[k])
            continue;
        if ((rc = gw_cfg_int(p, v[k], (gw_cfg_path_key(kp, "routing", keys[k]), kp), lo[k], hi[k], &x)))
            return rc;
        *ints[k] = (int)x;
    }
    if (!v[K_STALE])
        r->stale_after_ms = 3 * r->heartbeat_ms;
    else if (r->stale_after_ms <= 2 * r->heartbeat_ms)
        /* A quiet peer is refreshed by the full read, every stale_after_ms
         * / 2 but no more often than a heartbeat: its record can be a
         * heartbeat, a read's interval and the read's round trip old. At
         * two heartbeats or less live records would go stale between reads. */
        return gw_cfg_perr(p, v[K_STALE], "routing.stale_after_ms",
                           "not more than twice heartbeat_ms (%d): live records would go stale between reads",
                           r->heartbeat_ms);
    if (r->health_check_ms > 0 && r->health_check_ms < 100)
        /* one check in flight per target: more often is load, not news */
        return gw_cfg_perr(p, v[K_HC], "routing.health_check_ms", "must be 0 (off) or from 100 to 3600000");
    if (r->eject_max_ms < r->eject_base_ms)
        return gw_cfg_perr(p, v[K_EJ_MAX] ? v[K_EJ_MAX] : v[K_EJ_BASE],
                           v[K_EJ_MAX] ? "routing.eject_max_ms" : "routing.eject_base_ms",
                           "eject_max_ms (%d) is less than eject_base_ms (%d)", r->eject_max_ms,
                           r->eject_base_ms);
    return 0;
}

static int parse_peers(cfg_parser *p, const yaml_node_t *n, gw_config *c)
{
    static const char *const keys[] = {"name", "endpoint"};
    int len, rc = gw_cfg_seq_take(p, n, "peers", CFG_MAX_PEERS, &len);
    if (rc)
        return rc;
    if (len && !(c->peers = calloc((size_t)len, sizeof(*c->peers))))
        return -ENOMEM;
    for (int i = 0; i < len; i++) {
        char ip[CFG_PATH_MAX], kp[CFG_PATH_MAX];
        yaml_node_t *it, *v[2];
        gw_peer_cfg *pe = &c->peers[i];
        gw_cfg_path_idx(ip, "peers", i);
        c->n_peers = i + 1;
        if ((rc = gw_cfg_seq_item(p, n, i, ip, &it)) || (rc = gw_cfg_map_take(p, it, ip, keys, 2, v)))
            return rc;
        for (int k = 0; k < 2; k++)
            if (!v[k])
                return gw_cfg_perr(p, it, (gw_cfg_path_key(kp, ip, keys[k]), kp), "required");
        gw_cfg_path_key(kp, ip, "name");
        if ((rc = gw_cfg_str(p, v[0], kp, &pe->name)))
            return rc;
        if (!valid_name(pe->name, ROUTE_NAME_MAX - 1))
            return gw_cfg_perr(p, v[0], kp, "must be 1 to %d characters from A-Z a-z 0-9 . _ -",
                               ROUTE_NAME_MAX - 1);
        if (c->region.name && !strcmp(pe->name, c->region.name))
            return gw_cfg_perr(p, v[0], kp, "%s is this gateway's own region", pe->name);
        for (int j = 0; j < i; j++)
            if (!strcmp(c->peers[j].name, pe->name))
                return gw_cfg_perr(p, v[0], kp, "peer %s is already peers[%d]", pe->name, j);
        if ((rc = get_endpoint(p, v[1], (gw_cfg_path_key(kp, ip, "endpoint"), kp), &pe->endpoint)))
            return rc;
    }
    return 0;
}

static int parse_peer_tls(cfg_parser *p, const yaml_node_t *n, gw_peer_tls_cfg *t)
{
    static const char *const keys[] = {"ca", "cert", "key"};
    yaml_node_t *v[3];
    char **dst[3] = {&t->ca, &t->cert, &t->key};
    char kp[CFG_PATH_MAX];
    int rc = gw_cfg_map_take(p, n, "peer_tls", keys, 3, v);
    if (rc)
        return rc;
    if (!v[1] != !v[2])
        return gw_cfg_perr(p, n, "peer_tls", "cert and key go together: the client identity shown to peers");
    if (!v[0] && !v[1])
        return gw_cfg_perr(p, n, "peer_tls", "give ca, or cert and key, or all three");
    for (int k = 0; k < 3; k++)
        if (v[k] && (rc = gw_cfg_str(p, v[k], (gw_cfg_path_key(kp, "peer_tls", keys[k]), kp), dst[k])))
            return rc;
    return 0;
}

int gw_cfg_parse_routing(cfg_parser *p, const yaml_node_t *region, const yaml_node_t *cluster,
                         const yaml_node_t *redis, const yaml_node_t *routing, const yaml_node_t *peers,
                         const yaml_node_t *peer_tls, gw_config *c)
{
    int rc;
    if (region && (rc = parse_region(p, region, &c->region)))
        return rc;
    /* The region's record lists the models its workers serve. */
    int n_models = 0;
    for (int i = 0; region && i < c->n_workers; i++) {
        int j = 0;
        while (j < i && strcmp(c->workers[j].name, c->workers[i].name))
            j++;
        n_models += j == i;
    }
    if (n_models > ROUTE_MAX_MODELS)
        return gw_cfg_perr(p, region, "region", "the workers serve %d models; a region serves at most %d",
                           n_models, ROUTE_MAX_MODELS);
    if (cluster) {
        if ((rc = gw_cfg_str(p, cluster, "cluster", &c->cluster)))
            return rc;
        if (!valid_name(c->cluster, ROUTE_NAME_MAX - 1))
            return gw_cfg_perr(p, cluster, "cluster", "must be 1 to 63 characters from A-Z a-z 0-9 . _ -");
    }
    /* Both publish or route for a region, which needs this gateway's name. */
    if (redis && !region)
        return gw_cfg_perr(p, redis, "redis",
                           "needs a region section: this gateway's record is published "
                           "under region.name");
    if (peers && !region)
        return gw_cfg_perr(p, peers, "peers", "needs a region section naming this gateway's own region");
    if (redis && (rc = parse_redis(p, redis, &c->redis)))
        return rc;
    if (routing && (rc = parse_routing(p, routing, &c->routing)))
        return rc;
    if (peers && (rc = parse_peers(p, peers, c)))
        return rc;
    if (peer_tls && (rc = parse_peer_tls(p, peer_tls, &c->peer_tls)))
        return rc;
    return 0;
}
