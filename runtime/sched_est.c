/* The scheduler's TTFT estimate (see sched_est.h): the step-time fit and
 * the replay of the scheduler's policy over the requests ahead. */
#include "runtime/sched_est.h"

#include <limits.h>
#include <stddef.h>

#define PREFILL_MIN 16 /* prompt tokens per step at least, while others decode */
/* Weight of a step seen n steps ago: 0.995^n, a memory of about 200
 * steps (a fraction of a second busy, the last load when idle). */
#define FIT_DECAY 0.995

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
    c->steps++;
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

/* Drops the finished (prompt done, nothing left to generate) from the
 * slots, in order; the new request keeps its prompt until it is done. */
static int compact(rt_est_seq *r, int n)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        if (r[i].prefill_left > 0 || r[i].decode_left > 0)
            r[k++] = r[i];
    return k;
}

double rt_est_ttft(const rt_step_fit *f, int max_seqs, int max_batch_tokens, rt_est_seq *run, int n,
                   rt_est_seq *queued, int n_queued, int prompt, long max_work)
{
    if (f->steps == 0)
        return 0;
    if (prompt < 1)
        prompt = 1;
    double t = 0;
    int qi = 0;
    bool admitted = false; /* the new request: decode_left -1 marks it */
    long work = 0;
    while (work < max_work) {
        while (n < max_seqs && !admitted) {
            if (qi < n_queued) {
                run[n++] = queued[qi++];
            } else {
                admitted = true;
                run[n++] = (rt_est_seq){prompt, -1};
            }
        }
        int n_dec = 0, first = -1, min_dec = INT_MAX;
        for (int i = 0; i < n; i++) {
            if (run[i].prefill_left == 0) {
                n_dec++;
                min_dec = run[i].decode_left < min_dec ? run[i].decode_left : min_dec;
            } else if (first < 0) {
                first = i;
            }
        }
        if (n == 0)
            break; /* cannot happen: the target is admitted once a slot is free */
        int budget = rt_sched_prefill_budget(max_batch_tokens, n_dec);
        long k = first < 0 ? min_dec : (run[first].prefill_left - 1) / (budget > 0 ? budget : 1);
        if (first >= 0 && k > min_dec)
            k = min_dec;
        if (k >= 1) {
            /* k steps alike: every decode one token, the first prompt in
             * line the whole budget (no prompt completes, no slot frees
             * before the last of them) */
            int tokens = n_dec + (first >= 0 ? budget : 0);
            t += (double)k * rt_step_fit_ms(f, tokens);
            for (int i = 0; i < n; i++) {
                if (run[i].prefill_left == 0)
                    run[i].decode_left -= (int)k;
                else if (i == first)
                    run[i].prefill_left -= (int)k * budget;
            }
            work += k * n;
        } else {
            /* one step as build_batch makes it: decodes, then prompt
             * chunks in admission order within the budget */
            int tokens = n_dec, left = budget;
            bool done_target = false;
            for (int i = 0; i < n; i++) {
                if (run[i].prefill_left == 0) {
                    run[i].decode_left--;
                    continue;
                }
                int take = run[i].prefill_left < left ? run[i].prefill_left : left;
                if (take <= 0)
                    continue;
                left -= take;
                tokens += take;
                run[i].prefill_left -= take;
                done_target |= run[i].decode_left == -1 && run[i].prefill_left == 0;
            }
            t += rt_step_fit_ms(f, tokens);
            if (done_target)
                return t;
            work += n;
        }
        n = compact(run, n);
    }
    return t;
}
