/* Gateway configuration: one YAML file (libyaml), validated whole before it
 * is used, so a bad file never half-applies. Errors name the file, the line
 * and the key: "gateway.yaml:12: tenants[0].rps: must be a number > 0".
 *
 * Schema (every key optional unless marked; units in the names):
 *
 *   listen:                     # default: [{address: "127.0.0.1:8080"}]
 *     - address: "0.0.0.0:8443" # HOST:PORT, [IPv6]:PORT, or unix:/path
 *       tls: {cert: FILE, key: FILE}   # TLS with ALPN h2 / http/1.1, TLS 1.2 minimum
 *         client_ca: FILE       # require client certificates signed by this CA (the peer listener)
 *         peer_names: [NAME]    # with client_ca: the names (CN or DNS SAN) a peer's certificate
 *                               # must carry; none: any certificate from client_ca
 *   workers:                    # default: one CPU worker on the demo model
 *     - model: FILE             # required
 *       name: ID                # model id clients ask for; default: file name without .gguf
 *       devices: [cpu]          # cpu, or GPU indices / GPU- / MIG- UUIDs (one worker each), or "auto"
 *       threads: 0              # 0: one per CPU this process may run on
 *       kv_cache_mb: 256
 *       kv_type: f16            # f16 | q8_0 (cpu devices only: half the KV memory and reads)
 *       max_seqs: 32
 *       max_batch_tokens: 512
 *       max_queue: 64
 *       batch_max_wait_ms: 30000  # a batch request waiting this long starts in turn with
 *                                 # interactive ones (no starving under interactive load)
 *       prompt_max_wait_ms: 10000 # the prompt with the fewest tokens left goes first (cached chat
 *                                 # turns sooner); one waiting this long goes first, in arrival
 *                                 # order (0: arrival order)
 *       prefix_cache: true      # reuse the KV of prompt prefixes seen before
 *       chat_template: llama3   # render chats as this family, whatever the model's template
 *                               # says (see `infergate worker --help` for the names)
 *       power_watts: 0          # the worker's power draw, for energy / gCO2e estimates (a GPU's
 *                               # is measured through NVML where it can be; 0: not given)
 *   tenants:                    # none: no auth, and the gateway only listens on loopback
 *     - name: acme              # required
 *       keys: [SHA256-HEX, ...] # required; `infergate key new` prints a key and its hash
 *       models: ["*"]           # allowed model ids
 *       rps: 10                 # requests per second (0 = unlimited)
 *       tpm: 100000             # tokens per minute (0 = unlimited)
 *       admin: false            # may read /metrics-like admin endpoints
 *       residency: [eu]         # region tags every request needs (none: any region)
 *       policy: latency         # latency | cost | carbon | primary; default: routing.policy
 *       slo_ms: 200             # cost policy bound; default: routing.slo_ms
 *       max_price: 2.5          # per million tokens, both prices (routing/router.h); default: no cap
 *       priority: interactive   # interactive: x-infergate-priority decides; batch: every request is batch
 *       weight: 1               # its share of a worker against other tenants' (0.001 to 1e6)
 *       budget: {daily: 5, monthly: 100}  # spend per UTC day / month in the prices' currency (either
 *                               # may be left out); at it: 429 insufficient_quota (front/spend.h)
 *       primary: [onprem, reserved]  # policy primary: this tenant's preferred regions; default routing.primary
 *       allow_policies: [carbon]     # x-infergate-policy values its requests may give; default none
 *   limits:
 *     max_body_bytes: 1048576
 *     max_header_bytes: 65536
 *     max_concurrent_streams: 256
 *     max_connections: 10000
 *     header_timeout_ms: 10000
 *     idle_timeout_ms: 120000
 *     stream_buffer_bytes: 1048576
 *     conn_buffer_bytes: 16777216  # response bytes one connection's streams hold (>= stream_buffer_bytes)
 *     buffer_bytes: 268435456      # response bytes all connections hold (>= conn_buffer_bytes)
 *     min_read_rate_bytes: 4096    # a connection holding half conn_buffer_bytes reads this a second, or goes
 *     response_timeout_ms: 600000  # longest a worker's or region's response may stand still
 *                           # (no headers yet, or no more body): then 504 (not retried), or an
 *                           # error event mid-stream; 0: none. 600 s is the OpenAI SDK's own
 *                           # timeout. A reload applies at once, to requests in flight too.
 *   logging:
 *     access_log: stdout        # stdout, stderr, off, or a file path
 *     access_log_mode: "0640"   # a log file's mode when created (octal); others may not write
 *   drain_grace_s: 30
 *   stats_interval_ms: 250      # how often worker stats are read
 *   worker_hang_timeout_s: 30   # a ready worker that answers no stats this long is killed
 *                               # and restarted (0: never)
 *   runtime_dir: /tmp/infergate-<pid>   # worker sockets: this user's, others may not write (else refused)
 *
 * Regions (all optional: without them the gateway serves its own workers):
 *   region:                     # this gateway's region in the fleet
 *     name: eu-west             # required; 1-63 of A-Z a-z 0-9 . _ -
 *     endpoint: "tls:10.0.0.5:8443"  # how peers reach it: tls:|tcp: HOST:PORT (numeric or localhost)
 *     tags: [eu, gdpr]          # residency tags, at most 8, each 1-31 of A-Z a-z 0-9 . _ -
 *     price: {input: 0.5, output: 1.5}  # per million tokens; default 0
 *     gpu: H100                 # shown to operators
 *     carbon: 250               # grid carbon intensity, gCO2e/kWh (0-100000); default 0: not given
 *     carbon_source: FILE       # or http://HOST:PORT/PATH: a body holding the current figure, polled
 *     carbon_poll_ms: 60000     # how often (1000-86400000); a bad figure is logged and kept out
 *   cluster: default            # Redis key prefix: infergate:<cluster>:...
 *   redis:                      # shared region state; needs `region`
 *     address: "127.0.0.1:6379" # required; HOST:PORT (numeric or localhost)
 *     password: SECRET
 *     db: 0
 *     timeout_ms: 500           # each command's deadline (10-60000; more for a Redis across a WAN)
 *     record_keys: [KEY]        # required: the fleet keys (32-128 bytes each, the same in every
 *                               # gateway) whose HMAC signs this gateway's record and proves
 *                               # peers' records and price overrides (unproved: ignored); the
 *                               # first signs, a second is also accepted (a rotation); reloads
 *   routing:
 *     policy: latency           # latency | cost | carbon | primary
 *     slo_ms: 500               # cost, carbon and primary policies: expected latency bound
 *     primary: [onprem, reserved, ondemand]  # policy primary: preferred regions, in order (at most 8)
 *     primary_return: 0.8       # a spilled region is back below this fraction of slo_ms ...
 *     primary_hold_ms: 3000     # ... held this long (a 429 from it spills it this long)
 *     spread: true              # share among near-best regions (routing/router.h), not all to the best
 *     cache_aware: true         # local worker by prompt prefix held vs queue (issue 30); false: least loaded
 *     heartbeat_ms: 1000        # record publication period
 *     stale_after_ms: 3000      # default 3 heartbeats; more than two
 *     eject_after: 3            # consecutive failures (0: never eject)
 *     eject_base_ms: 1000       # first ejection; doubles up to eject_max_ms
 *     eject_max_ms: 30000
 *     ping_interval_ms: 250     # RTT probes (HTTP/2 PING) to each peer; 10 unanswered: it is gone
 *     retry_budget: 0.2         # fraction of requests that may be retried, 0 to 1
 *     replay: true              # a stream whose worker or region fails mid-answer goes on elsewhere
 *                               # from the tokens delivered (token replay); false: it ends with an error event
 *     replay_max: 2             # replays of one request, at most (0-16; 0 is replay: false); each spends
 *                               # a retry from retry_budget too
 *     hedge: false              # a short answer not streamed that is late gets a second copy elsewhere
 *                               # (hedged request); the first whole answer wins, the other is cancelled
 *     hedge_max_tokens: 64      # short: max_tokens at most this (1-1000000; unset: 256 chat, 16 else)
 *     hedge_delay_ms: 0         # the copy goes after this (0-600000); 0: the first target's p95 of
 *                               # recent such answers (no copy before it has 8 of them)
 *     hedge_share: 0.05         # hedges per eligible request, at most (0-1; a token bucket)
 *     health_check_ms: 0        # active health checks: a one-token request to each peer region and
 *                               # local worker this often (0: off, else 100-3600000); reloads
 *     health_check_timeout_ms: 5000  # a check not answered within this fails (50-600000)
 *     health_check_failures: 2  # checks failed in a row that eject the region or worker (1-100)
 *     health_check_successes: 2 # checks passed in a row that bring it back (1-100)
 *   peers:                      # static peers / endpoint overrides (e.g. a private link); needs `region`
 *     - name: us-east           # required, not this region
 *       endpoint: "tls:10.1.0.5:8443"  # required
 *   peer_tls: {ca: FILE, cert: FILE, key: FILE}  # client side of mutual TLS to peers;
 *                               # cert and key together, ca optional (else the system store)
 */
#ifndef GW_CONFIG_H
#define GW_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gw_listen_cfg {
    char *address;            /* "HOST:PORT" or "unix:/path" */
    char *tls_cert, *tls_key; /* both or neither */
    char *tls_client_ca;      /* NULL: no client certificates asked for (only with cert/key) */
    /* With client_ca: the names (subject CN or DNS SAN) a client
     * certificate must carry to be taken for a peer gateway; none: any
     * certificate from client_ca */
    char **tls_peer_names;
    int n_tls_peer_names;
} gw_listen_cfg;

typedef struct gw_worker_cfg {
    char *model;    /* path */
    char *name;     /* model id */
    char **devices; /* "cpu", a GPU/MIG UUID, or "auto" */
    int n_devices;
    int threads, kv_cache_mb, max_seqs, max_batch_tokens, max_queue, batch_max_wait_ms, prompt_max_wait_ms;
    bool kv_q8_0;        /* kv_type: q8_0 */
    bool prefix_cache;   /* prefix_cache (true): the worker's --prefix-cache */
    char *chat_template; /* a family name (the worker's --chat-template), or NULL */
    double power_watts;  /* its power draw for energy estimates; 0: not given (a GPU's is measured) */
} gw_worker_cfg;

/* Routing policy; a tenant's DEFAULT takes routing.policy. */
typedef enum gw_route_policy {
    GW_POLICY_DEFAULT = 0,
    GW_POLICY_LATENCY,
    GW_POLICY_COST,
    GW_POLICY_CARBON,
    GW_POLICY_PRIMARY
} gw_route_policy;
/* "latency", "cost", "carbon", "primary" ("default" for DEFAULT). */
const char *gw_policy_name(gw_route_policy p);

#define GW_TENANT_NAME_MAX 64 /* characters of a tenant's name */

typedef struct gw_tenant_cfg {
    char *name;
    uint8_t (*key_hashes)[32]; /* SHA-256 of each key */
    int n_keys;
    char **models; /* "*" allows all */
    int n_models;
    double rps, tpm; /* 0 = unlimited */
    bool admin;
    char **residency; /* region tags every request needs; n_residency 0: any region */
    int n_residency;
    gw_route_policy policy; /* DEFAULT: routing.policy */
    double slo_ms;          /* 0: routing.slo_ms */
    double max_price;       /* per million of a request's tokens (routing/router.h); 0: no cap */
    bool batch_only;        /* priority: batch, whatever the request asks */
    /* Its share of a worker's tokens and slots against the other tenants'
     * there (runtime/sched.h's fair share); 1 unless set. Reloads. */
    double weight;
    double budget_daily, budget_monthly; /* spend per UTC day / month; 0: none */
    char **primary;         /* policy primary: this tenant's preferred regions, in order; NULL: routing.primary */
    int n_primary;
    unsigned allow_policies; /* bit (1 << gw_route_policy) for each x-infergate-policy value allowed */
} gw_tenant_cfg;

#define GW_TENANT_WEIGHT_MIN 1e-3 /* the scheduler's range (RT_SCHED_WEIGHT_MIN, _MAX) */
#define GW_TENANT_WEIGHT_MAX 1e6

typedef struct gw_limits_cfg {
    size_t max_body_bytes, max_header_bytes, stream_buffer_bytes;
    size_t conn_buffer_bytes, buffer_bytes; /* response bytes held per connection, per gateway */
    size_t min_read_rate_bytes; /* a connection holding half its conn_buffer_bytes reads at least this a
                                   second, over idle_timeout_ms, or is closed; 0: no bound */
    uint32_t max_concurrent_streams;
    int max_connections, header_timeout_ms, idle_timeout_ms;
    int response_timeout_ms; /* 0: none */
} gw_limits_cfg;

typedef struct gw_region_cfg {
    char *name;     /* NULL: no region section */
    char *endpoint; /* "tls:HOST:PORT" | "tcp:HOST:PORT"; NULL: peers cannot reach us */
    char **tags;
    int n_tags;
    double price_in, price_out; /* per million tokens */
    char *gpu;                  /* NULL: not given */
    double carbon;              /* grid carbon intensity, gCO2e/kWh; 0: not given */
    char *carbon_source;        /* a file or http://HOST:PORT/PATH polled for it; NULL: none */
    int carbon_poll_ms;
} gw_region_cfg;

typedef struct gw_redis_cfg {
    char *address; /* NULL: no Redis */
    char *host;    /* the address split: numeric, or "localhost" */
    int port;
    char *password; /* NULL: none */
    int db;
    int timeout_ms; /* each command's deadline (500; a Redis across a WAN may need more) */
    /* The fleet keys (routing/record_auth.h): 1 or 2 with a Redis, the
     * first signing; each checked by route_auth_keys_set */
    char **record_keys;
    int n_record_keys;
} gw_redis_cfg;

typedef struct gw_routing_cfg {
    gw_route_policy policy; /* LATENCY or COST, never DEFAULT */
    double slo_ms;
    bool spread; /* route_query.spread */
    char **primary; /* policy primary: the preferred regions, in order */
    int n_primary;
    double primary_return; /* back to a spilled region below this fraction of slo_ms ... */
    int primary_hold_ms;   /* ... for this long; a 429 spills it for as long */
    bool cache_aware; /* local workers chosen by the prompt prefix they hold (gw_supervisor_pick_for) */
    int heartbeat_ms, stale_after_ms, eject_after, eject_base_ms, eject_max_ms, ping_interval_ms;
    double retry_budget;
    bool replay;    /* mid-stream failover by token replay (gateway/front/replay.c) */
    int replay_max; /* replays of one request, at most */
    /* Hedged requests (gateway/front/hedge.c) */
    bool hedge;
    int hedge_max_tokens, hedge_delay_ms; /* delay 0: the first target's recent p95 */
    double hedge_share;
    /* Active health checks (gateway/front/health.h): every health_check_ms
     * (0: off) a one-token request to each peer region and local worker;
     * one not answered within health_check_timeout_ms fails; failures in a
     * row eject, successes in a row return. */
    int health_check_ms, health_check_timeout_ms, health_check_failures, health_check_successes;
} gw_routing_cfg;

typedef struct gw_peer_cfg {
    char *name, *endpoint;
} gw_peer_cfg;

typedef struct gw_peer_tls_cfg {
    char *ca, *cert, *key; /* each NULL when not given; cert and key together */
} gw_peer_tls_cfg;

typedef struct gw_config {
    char *path; /* NULL for the built-in default */
    gw_listen_cfg *listen;
    int n_listen;
    gw_worker_cfg *workers;
    int n_workers;
    gw_tenant_cfg *tenants;
    int n_tenants;
    gw_limits_cfg limits;
    char *access_log;
    unsigned access_log_mode; /* a log file's when created */
    int drain_grace_s, stats_interval_ms, worker_hang_timeout_s;
    char *runtime_dir;
    gw_region_cfg region;
    char *cluster; /* never NULL */
    gw_redis_cfg redis;
    gw_routing_cfg routing;
    gw_peer_cfg *peers;
    int n_peers;
    gw_peer_tls_cfg peer_tls;
} gw_config;

/* Parses and validates path. 0, or -EINVAL with err "FILE:LINE: KEY: why",
 * -errno when the file cannot be read, -ENOMEM. A file without `workers`
 * gives n_workers == 0: the caller adds the default with
 * gw_config_default_worker. Without tenants, every listen address must be
 * loopback or a Unix socket. */
int gw_config_load(const char *path, gw_config **out, char *err, size_t err_len);
/* The same from memory (tests, fuzzing); name stands for FILE in errors and
 * becomes c->path. */
int gw_config_parse(const char *name, const char *text, size_t len, gw_config **out, char *err,
                    size_t err_len);
/* Adds one CPU worker on demo_model (defaults as documented above) when c
 * has no worker. 0 or -ENOMEM. */
int gw_config_default_worker(gw_config *c, const char *demo_model);
/* The built-in default: 127.0.0.1:8080, one CPU worker on demo_model, no
 * tenants. */
int gw_config_default(const char *demo_model, gw_config **out);
void gw_config_free(gw_config *c);
/* The sections a running gateway keeps as started (listen, workers,
 * region, cluster, redis, routing timings, peers, logging,
 * stats_interval_ms, runtime_dir) that differ in c: their names,
 * comma-separated, in out; returns how many. Tenants, limits, routing
 * policy, slo_ms, retry_budget, hedging, drain_grace_s and
 * worker_hang_timeout_s reload. */
int gw_config_restart_diff(const gw_config *run, const gw_config *c, char *out, size_t len);
/* Whether a and b name the same peer_tls files. */
bool gw_config_peer_tls_eq(const gw_config *a, const gw_config *b);

/* SHA-256 of a key, for config files: "infergate key new". Writes 64 hex
 * characters and a NUL. */
void gw_key_hash_hex(const char *key, char hex[65]);

#endif
