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
 * the first queued of the tenant with the least virtual time (the new
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
        if (there && r->tn[t].vt < r->tn[b].vt)
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

static double vt_run(const replay *r, int i)
{
    return r->tn[r->run_tn[i]].vt;
}

/* Whether slot i's prompt goes before slot j's (j < i), as sched.c's
 * goes_before: the tenant with the least virtual time, then an aged
 * prompt, then, of two not aged, the one with fewer tokens left. */
static bool in_line_before(const replay *r, int i, int j)
{
    if (r->distinct > 1 && vt_run(r, i) != vt_run(r, j))
        return vt_run(r, i) < vt_run(r, j);
    const rt_est_seq *a = &r->run[i], *b = &r->run[j];
    if (a->aged != b->aged)
        return a->aged;
    return !a->aged && a->prefill_left < b->prefill_left;
}

/* The prompt in line for a step's budget (in_line_before); -1 when none. */
static int prompt_in_line(const replay *r)
{
    int first = -1;
    for (int i = 0; i < r->n; i++)
        if (r->run[i].prefill_left > 0 && (first < 0 || in_line_before(r, i, first)))
            first = i;
    return first;
}

static void charge(replay *r, int i, int tokens)
{
    if (r->distinct > 1)
        r->tn[r->run_tn[i]].due += tokens / r->tn[r->run_tn[i]].weight;
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

/* Each tenant is charged what the steps replayed computed for it. */
static void settle(replay *r)
{
    for (int t = 0; r->distinct > 1 && t < r->n_tn; t++) {
        r->tn[t].vt += r->tn[t].due;
        r->tn[t].due = 0;
    }
}

/* One step as build_batch makes it: every decode one token, then prompt
 * chunks within the budget, in line (prompt_in_line, as of the step's
 * start: a prompt done in this step decodes from the next); then each
 * tenant is charged. Returns the step's tokens; *done when the new
 * request's prompt is done. */
static int one_step(replay *r, int budget, bool *done)
{
    int tokens = 0;
    for (int i = 0; i < r->n; i++)
        if (r->run[i].prefill_left == 0) {
            r->run[i].decode_left--;
            charge(r, i, 1);
            tokens++;
        }
    int i;
    while (budget > 0 && (i = prompt_in_line(r)) >= 0) {
        rt_est_seq *e = &r->run[i];
        int take = e->prefill_left < budget ? e->prefill_left : budget;
        budget -= take;
        tokens += take;
        e->prefill_left -= take;
        charge(r, i, take);
        *done |= e->decode_left == -1 && e->prefill_left == 0;
    }
    settle(r);
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
        int first = prompt_in_line(r);
        int budget = rt_sched_prefill_budget(max_batch_tokens, n_dec);
        long k = first < 0 ? min_dec : (r->run[first].prefill_left - 1) / (budget > 0 ? budget : 1);
        if (first >= 0 && k > min_dec)
            k = min_dec;
        if (k >= 1 && (r->distinct <= 1 || one_line(r))) {
            /* k steps alike: every decode one token, the first prompt in
             * line the whole budget (no prompt completes, no slot frees
             * before the last of them). Not with prompts of tenants to
             * share among: the line changes as they are charged. */
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
            settle(r);
            work += k * r->n;
        } else {
            bool done = false;
            t += rt_step_fit_ms(f, one_step(r, budget, &done));
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
        tenants[t].due = 0;
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
