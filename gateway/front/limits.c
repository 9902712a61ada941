/* A tenant's limits: its requests per second and tokens per minute, taken
 * from buckets shared by the whole fleet through Redis while it is
 * connected (route_sync_limit), else from this gateway's own
 * (gw_tenant_admit). Tokens are charged as an estimate when the request
 * is admitted and settled when its answer is known. */
#include "gateway/front/request_internal.h"

#include "routing/sync.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

enum { LIMIT_RPS, LIMIT_TPM };

#define MAX_CHARGED_TOKENS (1ll << 24)

/* The fleet-wide bucket of a tenant's limit: its Redis key, rate per
 * second and burst. false when that limit is off. */
static bool shared_bucket(const gw_tenant_cfg *tc, int which, char key[128], double *per_s, double *burst)
{
    *per_s = which == LIMIT_RPS ? tc->rps : tc->tpm / 60.0;
    *burst = which == LIMIT_RPS ? (tc->rps > 1 ? tc->rps : 1) : tc->tpm;
    snprintf(key, 128, "tenant:%s:%s", tc->name, which == LIMIT_RPS ? "rps" : "tpm");
    return *per_s > 0;
}

static void limit_local(gw_front_req *p)
{
    gw_tenant *t = gw_tenants_find(p->g->tenants, p->tenant);
    int retry;
    if (t && gw_tenant_admit(t, gw_mono_s(), p->charged, &retry)) {
        p->charged = 0;
        gw_front_respond(p, 429, "rate_limit_error", "rate_limit_exceeded", NULL, retry,
                         "tenant '%s' is over its request or token rate; retry in %d s", p->tenant, retry);
        return;
    }
    gw_front_budget(p);
}

static void on_shared_limit(void *ud, int result, int retry_after_ms);

/* Stage LIMIT_RPS checks requests per second, LIMIT_TPM tokens per minute. */
static void limit_shared(gw_front_req *p, int stage)
{
    gw_serve *g = p->g;
    const gw_tenant_cfg *tc = gw_serve_tenant_cfg(g, p->tenant);
    for (; tc && stage <= LIMIT_TPM; stage++) {
        char key[128];
        double per_s, burst;
        if (!shared_bucket(tc, stage, key, &per_s, &burst))
            continue;
        p->limit_pending = true;
        p->limit_stage = stage;
        double cost = stage == LIMIT_RPS ? 1 : p->charged;
        if (route_sync_limit(g->sync, key, per_s, burst, cost, on_shared_limit, p) == 0) {
            p->charged_shared = stage == LIMIT_TPM;
            return;
        }
        p->limit_pending = false;
        limit_local(p); /* Redis went away between the check and now */
        return;
    }
    gw_front_budget(p);
}

static void on_shared_limit(void *ud, int result, int retry_after_ms)
{
    gw_front_req *p = ud;
    p->limit_pending = false;
    if (result == -ENOTCONN) {
        p->charged_shared = false;
        limit_local(p);
        return;
    }
    if (result == -EAGAIN) {
        int retry = (retry_after_ms + 999) / 1000;
        p->charged = 0;
        gw_front_respond(p, 429, "rate_limit_error", "rate_limit_exceeded", NULL, retry > 0 ? retry : 1,
                         "tenant '%s' is over its fleet-wide request or token rate; retry in %d s", p->tenant,
                         retry > 0 ? retry : 1);
        return;
    }
    limit_shared(p, p->limit_stage + 1);
}

void gw_front_limit(gw_front_req *p, long long max_tokens, long long prompt_ids)
{
    gw_serve *g = p->g;
    bool chat = strstr(p->req->path, "/chat/") != NULL;
    /* Charge an estimate now (4 bytes a token for the prompt, or one a
     * token id when that is more: "[5,7,9]" is 2 bytes an id; the asked
     * maximum for the answer) and settle the difference at the end. No
     * context is longer than MAX_CHARGED_TOKENS: a larger ask, which the
     * worker refuses, must not put the tenant's bucket 2^63 into debt
     * while it is on its way. */
    p->charged_completion = max_tokens > 0
                                ? (double)(max_tokens < MAX_CHARGED_TOKENS ? max_tokens : MAX_CHARGED_TOKENS)
                            : chat ? 256
                                   : 16;
    double prompt = (double)p->req->body_len / 4;
    if ((double)prompt_ids > prompt)
        prompt = (double)(prompt_ids < MAX_CHARGED_TOKENS ? prompt_ids : MAX_CHARGED_TOKENS);
    p->charged = prompt + p->charged_completion;
    if (g->sync && route_sync_connected(g->sync))
        limit_shared(p, LIMIT_RPS);
    else
        limit_local(p);
}

/* The client left while the shared limit's answer was awaited. */
void gw_front_limit_cancel(gw_front_req *p)
{
    if (!p->limit_pending)
        return;
    /* Whether the shared bucket took the charge is not known: no refund. */
    route_sync_limit_cancel(p->g->sync, p);
    p->charged = 0;
}

/* Tokens a request whose answer never came back (its client hung up, or
 * the upstream stalled) could have been given in dur_s since its last try
 * went out (earlier tries, the body's upload, a wait for the shared limit
 * gave none): at its worker's pace after its prefill, or at the pace a
 * remote region's record gives (the network's time counts as work: a
 * little more), at most what it asked for. Counted as none, a request sent
 * to another region and hung up on was free however long it ran. */
static int hangup_tokens(const gw_front_req *p, double dur_s)
{
    double first_ms = 0, per_ms = 0;
    const route_region *r = gw_front_remote_region(p);
    if (p->worker >= 0) {
        const gw_worker_info *w = gw_supervisor_worker(p->g->sup, p->worker);
        first_ms = w ? w->prefill_ewma_ms : 0;
        per_ms = w ? w->tpot_ewma_ms : 0;
    } else if (r) {
        first_ms = r->rec.ttft_ms;
        per_ms = r->rec.tpot_ms;
    }
    if (!(per_ms > 0))
        return (int)p->charged_completion; /* no pace known: what it asked */
    double gen_ms = dur_s * 1e3 - first_ms;
    return gen_ms <= 0 ? 0 : (int)fmin(p->charged_completion, 1.0 + gen_ms / per_ms);
}

/* Settles the tenant's token charge once the answer is known: back > 0
 * gives tokens back, back < 0 takes more (into debt). */
static void settle(gw_front_req *p, double now, double back)
{
    gw_serve *g = p->g;
    if (p->charged_shared) {
        const gw_tenant_cfg *tc = gw_serve_tenant_cfg(g, p->tenant);
        char key[128];
        double per_s, burst;
        if (tc && shared_bucket(tc, LIMIT_TPM, key, &per_s, &burst)) {
            if (back > 0)
                route_sync_refund(g->sync, key, per_s, burst, back);
            else
                route_sync_charge(g->sync, key, per_s, burst, -back);
        }
        return;
    }
    gw_tenant *t = gw_tenants_find(g->tenants, p->tenant);
    if (t && back > 0)
        gw_tenant_refund(t, now, back);
    else if (t)
        gw_tenant_charge(t, now, -back);
}

/* What the estimate charged at admission over-counted comes back: all
 * of it when no completion was served (an error, or no answer at
 * all), else the completion estimate past the tokens generated; what
 * it under-counted (no max_tokens: the estimate is a guess, the
 * worker's bound the context) is taken now, into debt. The prompt was
 * computed: its estimate stays, corrected to the worker's count when it
 * said one (random text is near one token a byte, not four bytes a token;
 * the debt carries into the next minute). A client that hangs up on
 * a request already sent on keeps the charge for its prompt and for
 * the tokens it was seen to get, or could have got in the time
 * (hangup_tokens): else hanging up would make tpm free. So does a
 * request answered 504 for a stalled upstream, which held a worker
 * all that time (a long answer not streamed is one, on demand). */
void gw_front_limit_settle(gw_front_req *p, double now, int tokens)
{
    if (!(p->charged > 0 && p->tenant[0]))
        return;
    bool worked = (p->status == 499 && p->tries > 0) || p->stalled;
    if (worked && tokens < 0)
        tokens = hangup_tokens(p, now - p->t_sent);
    double back = p->status != 200 && !worked ? p->charged
                  : tokens >= 0               ? p->charged_completion - tokens
                                              : 0;
    if ((p->status == 200 || worked) && p->prompt_tokens >= 0)
        back += p->charged - p->charged_completion - p->prompt_tokens;
    if (back != 0)
        settle(p, now, back);
}
