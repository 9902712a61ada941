/* Region records and the routing table as one gateway sees it.
 *
 * A record is what a region publishes about itself (through Redis, or set
 * locally for this gateway's own region): endpoint, models, residency tags,
 * prices, capacity and load. To it each gateway adds what only it can know:
 * its RTT to that region (latency is a property of the pair), the region's
 * failure history (ejection), and how fresh the record is. Records are
 * region.c's, the table table.c's. */
#ifndef ROUTE_REGION_H
#define ROUTE_REGION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ROUTE_MAX_MODELS 16
#define ROUTE_MAX_TAGS 8
#define ROUTE_NAME_MAX 64
#define ROUTE_MAX_INSTANCES 16 /* gateways merged under one region name */
/* Bounds on a record's numbers: prices as the config allows them, latency
 * estimates well past any real one, so that the router's arithmetic on
 * them stays finite and in range whatever a record says. */
#define ROUTE_MAX_PRICE 1e9
#define ROUTE_MAX_MS 1e7
/* Grid carbon intensity, gCO2e/kWh: the dirtiest grids are near 1200. */
#define ROUTE_MAX_CARBON 1e5
#define ROUTE_HOST_MAX 46 /* INET6_ADDRSTRLEN */
#define ROUTE_MAX_PREFIXES 64 /* prompt-prefix hashes a record carries */

/* One model's share of a region's load. A region may serve several models
 * on different workers: its totals would show one model's idle workers as
 * room for another, and average a large model's latency with a small one's. */
typedef struct route_model_load {
    int capacity, running, queued; /* sequences, on the workers of this model */
    double ttft_ms, tpot_ms;
} route_model_load;

typedef struct route_record {
    char name[ROUTE_NAME_MAX];
    char endpoint[128]; /* upstream target of the region's gateway: "tls:10.0.0.5:8443" */
    char models[ROUTE_MAX_MODELS][ROUTE_NAME_MAX];
    int n_models;
    char tags[ROUTE_MAX_TAGS][32]; /* residency tags: "eu", "us", "gdpr" */
    int n_tags;
    double price_in, price_out; /* per million input / output tokens */
    char gpu[64];
    int capacity, running, queued; /* sequences */
    double ttft_ms, tpot_ms;       /* the region's own estimates */
    double ttft_est_ms;            /* as load_est_ms, over every model; 0: not given */
    bool draining;                 /* its gateway drains (SIGTERM): unhealthy, on purpose */
    /* Grid carbon intensity where it runs, gCO2e/kWh (region.carbon, its
     * carbon_source, or `infergate region set-carbon`); 0: not given. */
    double carbon;
    int n_load;                    /* load[] entries: n_models, or 0 (see load) */
    bool healthy;
    int64_t updated_ms; /* epoch ms, set by the publisher */
    /* Gateways merged into this record (routing/instance.h): 1 for this
     * gateway's own and for a record of the single-writer form. With
     * `version`, not a field of the hash. */
    int instances;
    /* Changes whenever one of the merged gateways writes (a digest of their
     * updated_ms; 0 for a single writer): updated_ms, the newest, stands
     * still while a gateway whose clock is ahead has stopped and the
     * others write on. route_table_upsert takes either moving as news. */
    uint64_t version;
    /* Per model, in models' order, when n_load is n_models; with none (a
     * record from an older gateway) the totals above stand for every
     * model. Last: route_decide reads the fields above for every region,
     * and these only for the one model asked for. */
    route_model_load load[ROUTE_MAX_MODELS];
    /* With load[]: the time to first token a request of that model
     * arriving now should expect, from the workers' queues (prompt tokens
     * ahead, prefill and decode rates measured there); 0: not given (an
     * older gateway), and the router estimates from the counts. */
    double load_est_ms[ROUTE_MAX_MODELS];
    /* The prompt-prefix hashes (gateway/base/prefix.h) the region's
     * workers hold: its workers' most recently used, at most
     * ROUTE_MAX_PREFIXES, sorted ascending; and its prefill rate in ms per
     * byte of prompt chunks (gw_prefix_bytes; 0: not measured). What the
     * latency policy counts a hit as saving (issue 30). */
    int n_prefixes;
    double prefill_ms_per_byte;
    uint64_t prefixes[ROUTE_MAX_PREFIXES];
} route_record;

/* Serialises a record as the field/value pairs of a Redis hash (and back).
 * Fields: endpoint models tags price_in price_out gpu capacity running
 * queued ttft_ms tpot_ms model_load healthy updated_ms; lists are
 * comma-separated. model_load is empty, or the updated_ms it was written
 * with, ";", and an entry per model, in models' order:
 * "capacity:running:queued:ttft_ms:tpot_ms". Then ttft_est_ms, model_est
 * (as model_load: the stamp, ";", each model's load_est_ms, comma-separated;
 * taken with model_load only) and draining (0|1): fields older readers
 * ignore; then carbon (gCO2e/kWh, 0 to ROUTE_MAX_CARBON) and prefixes
 * (empty, or the prefill ms per prompt byte, ";", and up to
 * ROUTE_MAX_PREFIXES hashes of 16 lowercase hex digits, comma-separated,
 * ascending). */
typedef struct route_field {
    const char *name;
    /* The longest value: model_load's stamp (up to 20 bytes) and 16
     * entries of up to 81 (three ints of 10 digits, two numbers of up to 23
     * characters, separators). */
    char value[1400];
} route_field;
#define ROUTE_N_FIELDS 19
/* Numbers are written so that they read back exactly (shortest %g that
 * round-trips); healthy is "1" or "0"; updated_ms an integer. r must pass
 * route_record_check (a comma inside a model or tag would split it). */
void route_record_to_fields(const route_record *r, route_field out[ROUTE_N_FIELDS]);
/* Fills r (name set by the caller) from n pairs; unknown fields are
 * ignored, missing ones keep r's value. -EINVAL with err when a known field
 * does not parse ("price_in: must be a number >= 0"): numbers decimal,
 * from 0 to ROUTE_MAX_PRICE (prices) or ROUTE_MAX_MS (ttft_ms, tpot_ms),
 * integers within int (updated_ms: int64), healthy 0|1, the endpoint
 * empty or valid for route_endpoint_check, model_load empty or well
 * formed (taken only when its stamp is the record's updated_ms and it has
 * an entry per model; otherwise, or when missing, n_load is 0),
 * strings and list items within their buffers, without control characters
 * or NUL bytes, list items non-empty, none twice ("models: entry 2
 * repeats entry 1") and at most ROUTE_MAX_MODELS / ROUTE_MAX_TAGS of
 * them. On error r is unchanged. */
int route_record_from_fields(route_record *r, const char *const *names, const char *const *values,
                             const size_t *lens, int n, char *err, size_t err_len);
/* 0 when r can be put in a table and published: name set, every string
 * NUL-terminated within its buffer, counts in range, models and tags
 * non-empty, none twice, without commas or control characters, numbers
 * within the bounds above, n_load 0 or n_models, the endpoint empty or valid. Else
 * -EINVAL with err naming the field. */
int route_record_check(const route_record *r, char *err, size_t err_len);
/* A record's number (a price, a latency): decimal digits only (no hex,
 * inf, nan or spaces), from 0 to max. */
bool route_number_parse(const char *s, double max, double *out);

/* HOST:PORT where HOST is a numeric IPv4 address, [IPv6] or localhost
 * (what the gateway connects to without a blocking DNS lookup) and PORT 1
 * to 65535. host (without brackets) gets ROUTE_HOST_MAX bytes. NULL when
 * valid, else why not. */
const char *route_host_port(const char *s, char host[ROUTE_HOST_MAX], int *port);
/* A region's endpoint: "tls:HOST:PORT" or "tcp:HOST:PORT" within the
 * record's buffer. NULL when valid, else why not. A record comes from any
 * writer to Redis: "unix:/path" or a name to resolve would have this
 * gateway forward tenants' requests where no peer is. */
const char *route_endpoint_check(const char *endpoint);

typedef struct route_region {
    route_record rec;
    uint64_t id;     /* new for each region the table takes in: see route_region_is */
    bool local;      /* this gateway's own region */
    int64_t seen_ms; /* when this gateway last received the record (gw_mono_ms) */
    bool graced;     /* a recovery grace raised seen_ms since the record last changed: once only */
    /* RTT from here, from HTTP/2 PINGs (local region: 0). */
    double rtt_ewma_ms, rtt_p95_ms;
    bool rtt_known;
    int64_t answered_ms; /* its last PING answered (gw_mono_ms); 0: never (route_table_set_answered) */
    /* Outlier ejection: consecutive failures eject for a back-off that
     * doubles each time; after it one probe request decides. */
    int consecutive_failures;
    int ejections;
    int64_t ejected_until_ms;
    bool probing;
    int64_t busy_ms; /* its last 429 (route_region_note_busy); 0: none */
    /* Active health checks (route_region_report_check): the consecutive
     * checks failed and passed, and whether the checks ejected it. */
    int check_failures, check_successes;
    bool check_down;
} route_region;

typedef struct route_table route_table;

/* The clock of a table's own times (seen_ms, ejection, probes, the store
 * going away) is gw_mono_ms (gateway/base/clock.h), so that a step of the
 * wall clock neither keeps a region ejected nor a dead one fresh. Every
 * now_ms given to the table and the router is this clock's; a record's
 * updated_ms stays its publisher's wall clock, only ever compared with
 * itself. */

typedef struct route_table_opts {
    int64_t stale_after_ms; /* a record older than this leaves the candidates (e.g. 3 heartbeats) */
    int eject_after;        /* consecutive failures that eject (e.g. 3) */
    int64_t eject_base_ms;  /* first ejection length; doubles, capped at eject_max_ms */
    int64_t eject_max_ms;
    /* A probe whose outcome is not reported within this time (the request
     * was never sent, or is still waiting) may be claimed again; 0: 10000. */
    int64_t probe_timeout_ms;
    /* Peers are reached over mutual TLS: a peer's record naming another
     * kind of endpoint is refused (-EPERM), as a Unix socket always is. */
    bool tls_only;
} route_table_opts;

route_table *route_table_new(const route_table_opts *o, int max_regions);
void route_table_free(route_table *t);
int route_table_count(const route_table *t);
route_region *route_table_at(route_table *t, int i);
route_region *route_table_find(route_table *t, const char *name);
/* Inserts or replaces a record (keeping RTT and ejection state). -ENOSPC
 * past max_regions, -EINVAL when route_record_check fails.
 * seen_ms becomes now_ms for a new record and whenever updated_ms (or version) changes:
 * re-reading a record its publisher has stopped refreshing is no news, so
 * it still goes stale. The local region's record is set by this process
 * only: an upsert of the same name with local == false (our own record read
 * back from Redis) is ignored and returns 0.
 * Region pointers (route_table_at, find, decisions) stay valid memory for
 * the table's life; a removed region's slot is reused for a new region only
 * after every other free slot, so look a region up again by name rather
 * than keep a pointer across a remove. */
int route_table_upsert(route_table *t, const route_record *r, bool local, int64_t now_ms);
void route_table_remove(route_table *t, const char *name);
/* Whether r is still the region whose id a caller kept (a decision's
 * cand_id): a request outlives a decision, and its region may have been
 * removed since and its slot given to another. */
bool route_region_is(const route_region *r, uint64_t id);
/* Removes the peers not heard from for longer than forget_ms (a region
 * taken down, a stray key under the prefix), so that they are neither
 * dialled nor listed for ever, nor fill the table. Nothing is removed while
 * the shared store is away: silence then is no news. Returns the count. */
int route_table_prune(route_table *t, int64_t forget_ms, int64_t now_ms);
/* Unknown names and values that are negative or not finite are ignored. */
void route_table_set_rtt(route_table *t, const char *name, double ewma_ms, double p95_ms);
/* When the region last answered a PING of ours (gw_mono_ms): this
 * gateway's own sight of it, whatever the store says. While the store is
 * away, a peer that has ever answered is a candidate exactly while it
 * answered within stale_after_ms, however old its record. With the store
 * up, its record's age rules, but a peer that answers stays a candidate
 * with its last record until a full read of the store shows that record
 * is no longer refreshed: one begun after it went stale and at least the
 * recovery grace after the store came back (a frozen store ages every
 * record, and is found out only when a command times out). Unknown names,
 * the local region and older times are ignored. */
void route_table_set_answered(route_table *t, const char *name, int64_t answered_ms);
/* Whether r is a candidate as far as news goes (what route_decide uses):
 * see route_table_set_answered and route_table_set_shared_ok. */
bool route_region_current(const route_table *t, const route_region *r, int64_t now_ms);
/* A candidate by its PINGs: its record is stale by its age
 * (route_region_fresh false), yet it answers and is current. */
bool route_region_held_by_ping(const route_table *t, const route_region *r, int64_t now_ms);
/* Whether the shared store (Redis) is reachable and read in full (default
 * true); now_ms is when that changed. While it is not, records age with no
 * news either way: those fresh when the store went away still show as
 * stale (route_region_fresh) but stay candidates (a peer that answers our
 * PINGs: while it answers, route_table_set_answered), and failures (ejection)
 * keep dead regions out; those already stale then stay out, so a region
 * gone for days does not come back with every Redis restart. Where full
 * reads still come (the subscription or our writes down), news is as of
 * the last one (route_table_note_full_read): a region silent through them
 * goes stale. When it is back, records current at the last news and not
 * received since are as old as they were then: their regions have the
 * rest of stale_after_ms to be heard from again. */
void route_table_set_shared_ok(route_table *t, bool ok, int64_t now_ms);
/* When the store is back, each peer still has to reconnect on its own
 * back-off before its next write reaches us: records current at the loss
 * stay candidates at least grace_ms after it is back (0, the default: only
 * what was left of their stale_after_ms). A record has the grace once
 * until it changes: a store that flapped gave a dead region a new one at
 * each return, and kept it a candidate for as long as the flapping. */
void route_table_set_recovery_grace(route_table *t, int64_t grace_ms);
bool route_table_shared_ok(const route_table *t);
/* A full read of the store that started at started_ms read every record
 * there (its replies may still be landing): whatever it did not refresh
 * was silent as of then. */
void route_table_note_full_read(route_table *t, int64_t started_ms);

/* Outcome of a request sent to a region: failures count towards ejection,
 * a success clears them.
 * eject_after consecutive failures (<= 0: never) eject the region for
 * eject_base_ms * 2^(ejections-1), capped at eject_max_ms. When that time
 * is up the region takes exactly one probe request at a time
 * (route_region_take_probe); that request's outcome goes to
 * route_region_report_probe. Outcomes of other requests reported while
 * ejected or probing (requests sent before) only count: an old request's
 * failure no longer doubled the back-off, nor its success ended it. */
void route_region_report(route_table *t, route_region *r, bool ok, int64_t now_ms);
/* The probe's outcome: success makes the region healthy again (failures and
 * the back-off reset); failure ejects it again for twice as long. `claim`
 * is the request's (route_region_probe_claim): a probe that timed out and
 * was claimed again is the new claim's to decide, and this outcome only
 * counts, as any other request's. */
void route_region_report_probe(route_table *t, route_region *r, bool ok, int64_t now_ms, uint64_t claim);
/* The outcome of an active health check (a one-token request this
 * gateway sends on its own, gateway/front/health.h): another input to the
 * same ejection state as requests' outcomes, with thresholds of its own.
 * `failures` consecutive failed checks eject the region (counted in
 * ejections, as any ejection) and keep it out, with no probe request,
 * until `successes` consecutive checks pass; that return ends the
 * ejection as a probe's success does. A check's success does not end an
 * ejection that requests' failures began (a region may answer a one-token
 * request and fail real ones): the probe request decides that one. Check
 * outcomes leave consecutive_failures alone. failures and successes < 1
 * are taken as 1. */
void route_region_report_check(route_table *t, route_region *r, bool ok, int failures, int successes,
                               int64_t now_ms);
/* Checks turned off: a region the checks ejected is usable again, as if
 * they had passed; their counts start over. */
void route_region_check_reset(route_region *r);

/* Heartbeat fresh: the record was received within stale_after_ms (<= 0:
 * never stale). The local region is always fresh. */
bool route_region_fresh(const route_table *t, const route_region *r, int64_t now_ms);
/* Ejected now: inside the back-off, or its probe is out. false once the
 * back-off is over and the probe is free to take. */
bool route_region_ejected(const route_region *r, int64_t now_ms);
/* Claims the region's one probe: true when its back-off is over and no
 * other probe is out (route_decide claims it for a region it puts first). */
bool route_region_take_probe(route_region *r, int64_t now_ms);
/* Whether a request may be sent to a candidate past the first now: not
 * ejected, and if out of its back-off, its probe claimed for this request
 * (*probe set: report its outcome with route_region_report_probe). Such a
 * candidate was left unclaimed by route_decide. */
bool route_region_claim(route_region *r, int64_t now_ms, bool *probe);
/* Which claim of r's probe is out, read by the request that just claimed
 * it (route_region_take_probe, route_region_claim, route_decide's
 * d.probe), for its release and report. */
uint64_t route_region_probe_claim(const route_region *r);
/* Gives a claimed probe back unused (the request never reached the region,
 * or the region refused it unprocessed, or its client left before the
 * answer), so the next request may take it now rather than after
 * probe_timeout_ms; nothing if that claim is no longer the one out. */
void route_region_release_probe(route_region *r, uint64_t claim);

#endif
