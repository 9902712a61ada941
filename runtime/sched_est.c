/* The scheduler's TTFT estimate (see sched_est.h): the step-time fit and
 * the replay of the scheduler's policy over the requests ahead. */
#include "runtime/sched_est.h"

#include <limits.h>
#include <math.h>
#include <stddef.h>

#define PREFILL_MIN 16 /* prompt tokens per step at least, while others decode */
/* Weight of a step seen n steps ago: 0.995^n, a memory of about 200
 * steps (a fraction of a second busy, the last load when idle). */
#define FIT_DECAY 0.995
/* How fast a class's floor follows its mean up: a machine that really
 * became slower is believed after a thousand or so of that class's steps. */
#define FLOOR_RISE 0.002

/* Prompt tokens a step may carry besides its decodes. While sequences are
 * decoding, prefill is spread over the steps — a little more than one
 * prompt token per decoding sequence, so that prompts (which in chat
 * traffic are about as long as answers) keep up — instead of arriving as one
 * big chunk that stalls every stream for a step many times longer than the
 * others. With nothing decoding, a prompt takes the whole budget. */
int rt_sched_prefill_budget(int max_batch_tokens, int n_dec)
{
    int all = max_batch_tokens - n_dec;
    if (n_dec == 0)
        return all;
    int b = n_dec + n_dec / 2;
    if (b < PREFILL_MIN)
        b = PREFILL_MIN;
    return b < all ? b : all;
}

int rt_sched_catchup_budget(int max_batch_tokens, int n_dec)
{
    int normal = rt_sched_prefill_budget(max_batch_tokens, n_dec), room = max_batch_tokens - n_dec - normal;
    return n_dec + normal < room ? n_dec + normal : room;
}

bool rt_sched_fair_before(double vt_a, double recent_a, double vt_b, double recent_b)
{
    return vt_a < vt_b || (vt_a == vt_b && recent_a < recent_b);
}

int rt_sched_owed(double recent, double w, double sum_recent, double sum_w)
{
    double owed = sum_recent * w / sum_w - recent;
    return owed >= 1 ? (owed < INT_MAX ? (int)owed : INT_MAX) : 0;
}

static int class_of(int tokens)
{
    int c = 0;
    while (tokens > 1 && c < RT_STEP_CLASSES - 1) {
        tokens >>= 1;
        c++;
    }
    return c;
}

/* Every class's weights age with every step, as the line's do (a memory of
 * about 200 steps), but its means stand while it sees none: a size seen
 * rarely (a prompt's chunks while others decode) keeps its last figure,
 * and its next steps replace it at once. A memory of its own ~10 steps
 * made the decodes' figure, the bulk of a flooded worker's estimate, follow
 * a single slow step (an estimate 6 of 7 times further off, flooded). */
static void class_add(rt_step_fit *f, int tokens, double ms)
{
    for (int i = 0; i < RT_STEP_CLASSES; i++) {
        rt_step_class *c = &f->cls[i];
        bool gone = c->w < 1e-30; /* no denormals: the means stand all the same */
        c->w = gone ? 0 : c->w * FIT_DECAY;
        c->wn = gone ? 0 : c->wn * FIT_DECAY;
        c->wms = gone ? 0 : c->wms * FIT_DECAY;
    }
    rt_step_class *c = &f->cls[class_of(tokens)];
    c->w += 1;
    c->wn += tokens;
    c->wms += ms;
    c->n = c->wn / c->w;
    c->ms = c->wms / c->w;
    if (!c->steps || c->ms < c->floor_ms)
        c->floor_ms = c->ms;
    else
        c->floor_ms += (c->ms - c->floor_ms) * FLOOR_RISE;
    c->steps++;
}

void rt_step_fit_relax(rt_step_fit *f, double idle_s)
{
    if (!(idle_s > 0))
        return;
    const double k = exp2(-idle_s / RT_STEP_RELAX_HALF_S);
    for (int i = 0; i < RT_STEP_CLASSES; i++) {
        rt_step_class *c = &f->cls[i];
        if (!c->steps)
            continue;
        c->ms = c->floor_ms + (c->ms - c->floor_ms) * k;
        c->w *= k;
        c->wn = c->n * c->w;
        c->wms = c->ms * c->w;
    }
}

double rt_step_fit_ms(const rt_step_fit *f, int tokens)
{
    const rt_step_class *lo = NULL, *hi = NULL; /* the nearest classes seen below and above */
    for (int i = 0; i < RT_STEP_CLASSES; i++) {
        const rt_step_class *c = &f->cls[i];
        if (!c->steps)
            continue;
        if (c->n <= tokens)
            lo = c;
        else if (!hi)
            hi = c;
    }
    if (lo && hi)
        return lo->ms + (hi->ms - lo->ms) * (tokens - lo->n) / (hi->n - lo->n);
    if (lo) /* past the largest: the line's slope from there */
        return lo->ms + f->token_ms * (tokens - lo->n);
    if (hi) { /* below the smallest: its cost less the line's slope, never below proportional */
        double down = hi->ms - f->token_ms * (hi->n - tokens), prop = hi->ms * tokens / hi->n;
        return down > prop ? down : prop;
    }
    return f->base_ms + f->token_ms * tokens;
}

void rt_step_fit_add(rt_step_fit *f, int tokens, double ms)
{
    if (!(ms >= 0) || tokens < 1)
        return;
    class_add(f, tokens, ms);
    double n = tokens;
    f->s0 = f->s0 * FIT_DECAY + 1;
    f->s1 = f->s1 * FIT_DECAY + n;
    f->s2 = f->s2 * FIT_DECAY + n * n;
    f->sy = f->sy * FIT_DECAY + ms;
    f->s1y = f->s1y * FIT_DECAY + n * ms;
    f->steps++;
    double det = f->s0 * f->s2 - f->s1 * f->s1;
    /* Steps all of one size (a steady flood, one decoding stream) say
     * nothing of the slope: keep the last one and refit the base. det /
     * (s0 s2) is the sizes' variance over their mean square: below 1e-2
     * (sizes within ~10% of each other), the few older steps of other
     * sizes left in the sums would tilt the line at will. */
    if (det > 1e-2 * f->s0 * f->s2) {
        f->token_ms = (f->s0 * f->s1y - f->s1 * f->sy) / det;
        f->base_ms = (f->sy - f->token_ms * f->s1) / f->s0;
    } else {
        f->base_ms = (f->sy - f->token_ms * f->s1) / f->s0;
    }
    if (f->token_ms < 0) {
        f->token_ms = 0;
        f->base_ms = f->sy / f->s0;
    }
    if (f->base_ms < 0) {
        f->base_ms = 0;
        f->token_ms = f->s1y / f->s2;
    }
}

/* The replay's state: the slots and their tenants, the queue (a taken
 * entry's prefill_left is -1), the new request (decode_left -1 marks it),
 * the tenants (NULL: one, in arrival order) and how many of them have
 * requests left. */
typedef struct replay {
    rt_est_seq *run, *q, fresh;
    int *run_tn, fresh_tn;
    const int *q_tn;
    int n, nq, qi, max_seqs, distinct, n_tn;
    bool admitted;
    rt_est_tenant *tn;
} replay;

/* The next request a free slot takes (an index in q, nq for the new one):
 * the first queued of the tenant with the least virtual time (and recent
 * work per weight, rt_sched_fair_before) (the new
 * request last of its tenant's), or with one tenant the first queued; -1
 * when none is left. */
static int next_in(replay *r)
{
    while (r->qi < r->nq && r->q[r->qi].prefill_left < 0)
        r->qi++;
    int best = r->qi < r->nq ? r->qi : r->admitted ? -1 : r->nq;
    if (best < 0 || r->distinct <= 1)
        return best;
    for (int i = r->qi + 1; i <= r->nq; i++) {
        bool there = i < r->nq ? r->q[i].prefill_left >= 0 : !r->admitted;
        int t = i < r->nq ? r->q_tn[i] : r->fresh_tn, b = best < r->nq ? r->q_tn[best] : r->fresh_tn;
        if (there && rt_sched_fair_before(r->tn[t].vt, r->tn[t].recent / r->tn[t].weight, r->tn[b].vt,
                                          r->tn[b].recent / r->tn[b].weight))
            best = i;
    }
    return best;
}

static void admit(replay *r)
{
    int i;
    while (r->n < r->max_seqs && (i = next_in(r)) >= 0) {
        if (r->tn)
            r->run_tn[r->n] = i < r->nq ? r->q_tn[i] : r->fresh_tn;
        r->run[r->n++] = i < r->nq ? r->q[i] : r->fresh;
        if (i == r->nq)
            r->admitted = true;
        else
            r->q[i].prefill_left = -1;
    }
}

/* A prompt's place in line for a step's budget (fair_order, goes_before
 * and the passes of build_batch in sched.c), as the step starts: those of
 * tenants owed work first, then (with several tenants) the least virtual
 * time, then an aged prompt, then, of two not aged, the one with fewer
 * tokens left, then the slot. */
typedef struct line_key {
    bool owed, aged;
    double vt;
    int left, slot;
} line_key;

static line_key key_of(const replay *r, int i)
{
    const rt_est_tenant *t = r->distinct > 1 ? &r->tn[r->run_tn[i]] : NULL;
    return (line_key){.owed = t && t->owed, .aged = r->run[i].aged, .vt = t ? t->vt : 0,
                      .left = r->run[i].prefill_left, .slot = i};
}

static bool before(line_key a, line_key b)
{
    if (a.owed != b.owed)
        return a.owed;
    if (a.vt != b.vt)
        return a.vt < b.vt;
    if (a.aged != b.aged)
        return a.aged;
    if (!a.aged && a.left != b.left)
        return a.left < b.left;
    return a.slot < b.slot;
}

/* The prompt in line after the one of key prev (NULL: the first); -1 when
 * none. A prompt served in the step but not done only moves up the line
 * (fewer tokens left), so it does not come round again. */
static int prompt_after(const replay *r, const line_key *prev)
{
    int next = -1;
    line_key kn = {0};
    for (int i = 0; i < r->n; i++) {
        if (r->run[i].prefill_left <= 0)
            continue;
        line_key k = key_of(r, i);
        if ((!prev || before(*prev, k)) && (next < 0 || before(k, kn))) {
            next = i;
            kn = k;
        }
    }
    return next;
}

static void charge(replay *r, int i, int tokens)
{
    if (r->distinct > 1) {
        r->tn[r->run_tn[i]].due += tokens / r->tn[r->run_tn[i]].weight;
        r->tn[r->run_tn[i]].used += tokens;
    }
}

/* Drops the finished (prompt done, nothing left to generate) from the
 * slots, in order; the new request keeps its prompt until it is done. */
static void compact(replay *r)
{
    int k = 0;
    for (int i = 0; i < r->n; i++) {
        const rt_est_seq *e = &r->run[i];
        if (e->prefill_left > 0 || e->decode_left > 0) {
            if (r->tn)
                r->run_tn[k] = r->run_tn[i];
            r->run[k++] = *e;
        } else if (r->tn && --r->tn[r->run_tn[i]].live == 0) {
            r->distinct--;
        }
    }
    r->n = k;
}

/* Each tenant is charged what the last `steps` steps (alike) computed for
 * it, and its recent work decays and grows step by step, as sched.c's. */
static void settle(replay *r, long steps)
{
    for (int t = 0; r->distinct > 1 && t < r->n_tn; t++) {
        rt_est_tenant *e = &r->tn[t];
        double per_step = e->used / (double)steps; /* whole: the steps were alike */
        for (long k = 0; k < steps; k++)
            e->recent = e->recent * RT_SCHED_RECENT_DECAY + per_step;
        e->vt += e->due;
        e->due = e->used = 0;
    }
}

/* What each tenant present is owed as the step starts (sched.c's
 * owe_tenants), when the step has catch-up tokens (pool) to give. */
static void owe(replay *r, int pool)
{
    double sum_recent = 0, sum_w = 0;
    for (int t = 0; r->distinct > 1 && t < r->n_tn; t++)
        if (r->tn[t].live > 0) {
            sum_recent += r->tn[t].recent;
            sum_w += r->tn[t].weight;
        }
    for (int t = 0; r->distinct > 1 && t < r->n_tn; t++) {
        rt_est_tenant *e = &r->tn[t];
        e->allow = pool > 0 && e->live > 0 ? rt_sched_owed(e->recent, e->weight, sum_recent, sum_w) : 0;
        e->owed = e->allow > 0;
    }
}

/* One step as build_batch makes it: every decode one token, then prompt
 * chunks within the budget, in line (prompt_after), those of tenants owed
 * work taking up to what they are owed of pool on top; then each tenant is
 * charged. Returns the step's tokens; *done when the new request's prompt
 * is done. */
static int one_step(replay *r, int budget, int pool, bool *done)
{
    int tokens = 0;
    owe(r, pool);
    for (int i = 0; i < r->n; i++)
        if (r->run[i].prefill_left == 0) {
            r->run[i].decode_left--;
            charge(r, i, 1);
            tokens++;
        }
    for (int i = prompt_after(r, NULL); i >= 0 && (budget > 0 || pool > 0);) {
        const line_key at = key_of(r, i);
        rt_est_seq *e = &r->run[i];
        int take = e->prefill_left < budget ? e->prefill_left : budget;
        budget -= take;
        if (r->distinct > 1 && r->tn[r->run_tn[i]].allow > 0) {
            int *allow = &r->tn[r->run_tn[i]].allow, more = e->prefill_left - take;
            more = more < pool ? more : pool;
            more = more < *allow ? more : *allow;
            pool -= more;
            *allow -= more;
            take += more;
        }
        tokens += take;
        e->prefill_left -= take;
        charge(r, i, take);
        *done |= e->decode_left == -1 && e->prefill_left == 0;
        i = prompt_after(r, &at);
    }
    settle(r, 1);
    return tokens;
}

/* Whether the prompts in the slots are all one tenant's (or none): then
 * the line for a step's budget stays as it is while no slot frees. */
static bool one_line(const replay *r)
{
    int t = -1;
    for (int i = 0; i < r->n; i++)
        if (r->run[i].prefill_left > 0) {
            if (t >= 0 && r->run_tn[i] != t)
                return false;
            t = r->run_tn[i];
        }
    return true;
}

static double run_replay(replay *r, const rt_step_fit *f, int max_batch_tokens, long max_work)
{
    double t = 0;
    long work = 0;
    while (work < max_work) {
        admit(r);
        int n_dec = 0, min_dec = INT_MAX;
        for (int i = 0; i < r->n; i++)
            if (r->run[i].prefill_left == 0) {
                n_dec++;
                min_dec = r->run[i].decode_left < min_dec ? r->run[i].decode_left : min_dec;
            }
        if (r->n == 0)
            break; /* cannot happen: the target is admitted once a slot is free */
        int budget = rt_sched_prefill_budget(max_batch_tokens, n_dec);
        int pool = r->distinct > 1 ? rt_sched_catchup_budget(max_batch_tokens, n_dec) : 0;
        owe(r, pool);
        int first = prompt_after(r, NULL);
        long k = first < 0 ? min_dec : (r->run[first].prefill_left - 1) / (budget > 0 ? budget : 1);
        if (first >= 0 && k > min_dec)
            k = min_dec;
        if (k >= 1 && (r->distinct <= 1 || first < 0 || (pool == 0 && one_line(r)))) {
            /* k steps alike: every decode one token, the first prompt in
             * line the whole budget (no prompt completes, no slot frees
             * before the last of them). Not with prompts of tenants to
             * share among (the line changes as they are charged), nor with
             * catch-up tokens to give (what a tenant is owed changes). */
            int tokens = n_dec + (first >= 0 ? budget : 0);
            t += (double)k * rt_step_fit_ms(f, tokens);
            for (int i = 0; i < r->n; i++) {
                if (r->run[i].prefill_left == 0) {
                    r->run[i].decode_left -= (int)k;
                    charge(r, i, (int)k);
                } else if (i == first) {
                    r->run[i].prefill_left -= (int)k * budget;
                    charge(r, i, (int)k * budget);
                }
            }
            settle(r, k);
            work += k * r->n;
        } else {
            bool done = false;
            t += rt_step_fit_ms(f, one_step(r, budget, pool, &done));
            if (done)
                return t;
            work += r->n;
        }
        compact(r);
    }
    return t;
}

double rt_est_ttft(const rt_step_fit *f, int max_seqs, int max_batch_tokens, rt_est_seq *run, int n,
                   rt_est_seq *queued, int n_queued, int prompt, long max_work)
{
    if (f->steps == 0)
        return 0;
    replay r = {.run = run, .q = queued, .fresh = {prompt < 1 ? 1 : prompt, -1}, .n = n, .nq = n_queued,
                .max_seqs = max_seqs, .distinct = 1};
    return run_replay(&r, f, max_batch_tokens, max_work);
}

double rt_est_ttft_fair(const rt_step_fit *f, int max_seqs, int max_batch_tokens, rt_est_seq *run, int *run_tn,
                        int n, rt_est_seq *queued, const int *q_tn, int n_queued, rt_est_tenant *tenants,
                        int n_tenants, int prompt, int tenant, long max_work)
{
    if (f->steps == 0)
        return 0;
    replay r = {.run = run, .q = queued, .fresh = {prompt < 1 ? 1 : prompt, -1}, .run_tn = run_tn,
                .fresh_tn = tenant, .q_tn = q_tn, .n = n, .nq = n_queued, .max_seqs = max_seqs,
                .n_tn = n_tenants, .tn = tenants};
    for (int t = 0; t < n_tenants; t++) {
        tenants[t].live = 0;
        tenants[t].due = tenants[t].used = 0;
    }
    tenants[tenant].live++;
    for (int i = 0; i < n; i++)
        tenants[run_tn[i]].live++;
    for (int i = 0; i < n_queued; i++)
        tenants[q_tn[i]].live++;
    for (int t = 0; t < n_tenants; t++)
        r.distinct += tenants[t].live > 0;
    return run_replay(&r, f, max_batch_tokens, max_work);
}
