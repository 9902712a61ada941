/* Worker supervisor: spawns `infergate worker` processes (one per device
 * entry of each configured model), reads their /internal/stats over the
 * upstream pool to know which are ready and how loaded, restarts a worker
 * that dies (with exponential back-off and a log line giving its exit
 * status), and stops them all on shutdown. */
#ifndef GW_SUPERVISOR_H
#define GW_SUPERVISOR_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct event_base;
typedef struct gw_upstream_pool gw_upstream_pool;
typedef struct gw_config gw_config;
typedef struct gw_supervisor gw_supervisor;

/* A tenant's share of a worker, as its stats said (runtime/sched.h's
 * rt_sched_tenant_stats): counts since the worker started. */
typedef struct gw_worker_tenant {
    char name[65];
    double weight;
    int running, queued;
    double tokens, preempted, pushed_out;
    int folded; /* "(other)"'s: the tenants whose figures it holds (RT_SCHED_TENANT_OTHER) */
} gw_worker_tenant;
#define GW_WORKER_TENANTS 65 /* kept per worker, at most (RT_SCHED_TENANT_REPORTS) */

typedef struct gw_worker_info {
    int index;
    const char *model;  /* model id */
    const char *device; /* "cpu" or a GPU / MIG UUID */
    const char *target; /* "unix:/path" for the upstream pool */
    pid_t pid;          /* 0 while not running */
    bool ready;         /* stats answered recently, and not ejected by its health checks */
    /* Has answered stats since it was started (a health check's target:
     * one still loading its model is not failing), and its health checks
     * ejected it (gw_supervisor_set_check_down). */
    bool answered, check_down;
    double tokens_generated; /* tokens it has generated since its start, by its last stats */
    int restarts;
    int queued, running, max_seqs, kv_blocks_free, kv_blocks_total;
    double ttft_ewma_ms, tpot_ewma_ms, tokens_per_s;
    double prefill_ewma_ms; /* admission to first token: service time without queueing */
    /* The worker's own estimate of the time to first token a request
     * joining now waits (runtime/sched_est.h; 0 until it has run a step),
     * the prompt tokens ahead of it, and the prefill rate measured. */
    double est_ttft_ms, prefill_tokens_per_s;
    /* device, backend and threads as the worker states them: workers of
     * one class have their prefill rates pooled ("" until its stats) */
    char rate_class[384];
    int prompt_tokens_ahead;
    /* prefix cache: prompt tokens computed and taken from it since the
     * worker started, and the KV blocks it holds */
    double prompt_tokens_computed, prompt_tokens_cached;
    int kv_blocks_cached;
    /* The prompt a TTFT estimate is for (tokens), and the prompt-prefix
     * hashes (gateway/base/prefix.h) the worker holds, sorted ascending:
     * valid until its next stats. */
    int est_prompt_tokens;
    double prompt_bytes_per_token; /* body bytes of prompt-prefix chunks a prompt token takes; 0: none seen */
    const uint64_t *prefixes;
    int n_prefixes;
    /* the first GW_PREFIX_RECENT of them as reported: most recently used first */
    const uint64_t *recent;
    int n_recent;
    /* its tenants' shares, valid until its next stats */
    const gw_worker_tenant *tenants;
    int n_tenants;
} gw_worker_info;

/* Workers run as `exe worker ...`, exe being this process's own binary.
 * They run the image this process was started from, opened here: after
 * the file is replaced on disk (a package upgrade), a restarted worker
 * still matches its gateway. NULL, err filled, when the binary cannot be
 * opened or the runtime directory made. */
gw_supervisor *gw_supervisor_new(struct event_base *base, gw_upstream_pool *pool, const gw_config *c,
                                 const char *exe, char *err, size_t err_len);
/* Spawns every worker. 0 or -errno (err filled). */
int gw_supervisor_start(gw_supervisor *s, char *err, size_t err_len);
/* The gateway drains: a worker that exits is not restarted. */
void gw_supervisor_drain(gw_supervisor *s);
/* No more restarts or stats (its requests on the pool are cancelled, so
 * the pool may go next), and SIGTERM to every worker. Does not wait. */
void gw_supervisor_stop(gw_supervisor *s);
/* After gw_supervisor_stop: waits for the workers to exit, SIGKILL to
 * those still alive after grace_s, or one second after *hurry becomes
 * true (a signal handler's flag; hurry may be NULL); blocks (the loop is
 * shutting down). */
void gw_supervisor_wait(gw_supervisor *s, int grace_s, volatile sig_atomic_t *hurry);
void gw_supervisor_free(gw_supervisor *s);

/* fn(ud) is called on the loop each time a worker becomes ready or stops
 * being so (its first stats, its exit, its stats gone quiet). */
void gw_supervisor_on_ready_change(gw_supervisor *s, void (*fn)(void *ud), void *ud);
/* fn(ud) is called on the loop after each worker's stats are read (every
 * stats interval, per worker), once its figures are updated: what routes
 * by them reads them then, not up to a heartbeat later. */
void gw_supervisor_on_stats(gw_supervisor *s, void (*fn)(void *ud), void *ud);

/* The active health checks (gateway/front/health.h) eject worker i
 * (down) or bring it back: while down it is not ready (no request is
 * picked for it, the region's record counts it out), whatever its stats
 * say. A restarted worker starts up. */
void gw_supervisor_set_check_down(gw_supervisor *s, int i, bool down);

int gw_supervisor_count(const gw_supervisor *s);
const gw_worker_info *gw_supervisor_worker(const gw_supervisor *s, int i);
int gw_supervisor_ready_count(const gw_supervisor *s);
/* Is some configured worker serving this model id (ready or not)? */
bool gw_supervisor_serves(const gw_supervisor *s, const char *model);
/* The least-loaded ready worker serving model, other than `exclude` (-1 for
 * none): fewest queued, then fewest running relative to max_seqs. -1 when
 * none is ready. Counts the request as queued on it until the next stats. */
int gw_supervisor_pick(gw_supervisor *s, const char *model, int exclude);
/* As gw_supervisor_pick, cache-aware (issue 30): when some worker holds a
 * prefix of the request's chain (may be NULL) or the request names a
 * session (non-zero), the worker with the least expected time to first
 * token — its queue plus the prefill of the prompt_tokens it does not hold
 * (gw_prefix_choose) — the session's consistent choice among near-equal
 * ones. Otherwise exactly gw_supervisor_pick. prompt_bytes: the chain's
 * (gw_prefix_bytes), priced at each worker's prefill rate over its
 * measured bytes per token. *cached_bytes (may be NULL) gets the bytes
 * the chosen one is expected to hold. */
typedef struct gw_prefix_chain gw_prefix_chain;
int gw_supervisor_pick_for(gw_supervisor *s, const char *model, int exclude, const gw_prefix_chain *chain,
                           double prompt_bytes, uint64_t session, double *cached_bytes);
/* A worker's prefill ms per prompt byte (gw_prefix_bytes), from its
 * measured rate and bytes per token; 0 while it has measured no rate. */
double gw_supervisor_ms_per_byte(const gw_worker_info *w);
/* As gw_supervisor_pick, among the workers whose KV cache is larger than
 * worker `than`'s (by its last stats): for a request too long for it. */
int gw_supervisor_pick_larger(gw_supervisor *s, const char *model, int than);

#endif
