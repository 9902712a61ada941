/* The scheduler's TTFT estimate (runtime/sched_est.h): the step-time fit
 * recovers a linear step cost, and the replay, which jumps over runs of
 * alike steps, gives what a plain step-by-step simulation of the
 * scheduler's policy gives, on hand-worked and on random queues; with
 * tenants, in the order fair share takes them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "runtime/sched_est.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SEQS 8
#define MAX_BATCH 64

static rt_step_fit linear_fit(double base, double per_token)
{
    rt_step_fit f = {0};
    for (int i = 0; i < 300; i++) {
        int n = 1 + (i * 7) % 60;
        rt_step_fit_add(&f, n, base + per_token * n);
    }
    return f;
}

/* Whether prompt a goes before prompt b (admitted before it) in a step's
 * budget, as sched.c's goes_before: least virtual time, then aged, then,
 * of two not aged, the fewer tokens left. */
static bool line_before(const rt_est_seq *a, double vt_a, const rt_est_seq *b, double vt_b)
{
    if (vt_a != vt_b)
        return vt_a < vt_b;
    if (a->aged != b->aged)
        return a->aged;
    return !a->aged && a->prefill_left < b->prefill_left;
}

/* The reference: one step at a time, as build_batch makes them (every
 * decode one token, then prompt chunks within the budget, in line_before's
 * order as of the step's start), slots refilled from the queue, then the
 * new request. */
static double reference(const rt_step_fit *f, int max_seqs, int max_batch, const rt_est_seq *run0, int n,
                        const rt_est_seq *queued, int n_queued, int prompt)
{
    rt_est_seq run[64];
    memcpy(run, run0, (size_t)n * sizeof(*run));
    int qi = 0;
    bool admitted = false;
    double t = 0;
    for (;;) {
        while (n < max_seqs && !admitted) {
            if (qi < n_queued)
                run[n++] = queued[qi++];
            else {
                run[n++] = (rt_est_seq){prompt, -1, false};
                admitted = true;
            }
        }
        int n_dec = 0;
        for (int i = 0; i < n; i++)
            n_dec += run[i].prefill_left == 0;
        int left = rt_sched_prefill_budget(max_batch, n_dec), tokens = n_dec;
        bool done = false, served[64] = {0};
        for (int i = 0; i < n; i++)
            if (run[i].prefill_left == 0) {
                run[i].decode_left--;
                served[i] = true;
            }
        rt_est_seq start[64];
        memcpy(start, run, (size_t)n * sizeof(*run));
        for (;;) {
            int i = -1;
            for (int k = 0; k < n; k++)
                if (!served[k] && (i < 0 || line_before(&start[k], 0, &start[i], 0)))
                    i = k;
            if (i < 0 || left <= 0)
                break;
            served[i] = true;
            int take = run[i].prefill_left < left ? run[i].prefill_left : left;
            left -= take;
            tokens += take;
            run[i].prefill_left -= take;
            done |= run[i].decode_left == -1 && run[i].prefill_left == 0;
        }
        t += rt_step_fit_ms(f, tokens);
        if (done)
            return t;
        int k = 0;
        for (int i = 0; i < n; i++)
            if (run[i].prefill_left > 0 || run[i].decode_left > 0)
                run[k++] = run[i];
        n = k;
    }
}

static void test_fit_recovers_a_line(void **state)
{
    (void)state;
    rt_step_fit f = linear_fit(3.0, 0.25);
    assert_true(fabs(f.base_ms - 3.0) < 1e-6);
    assert_true(fabs(f.token_ms - 0.25) < 1e-6);
    /* steps of one size on the same line say nothing new: the line stays */
    for (int i = 0; i < 2000; i++)
        rt_step_fit_add(&f, 40, 3.0 + 0.25 * 40);
    assert_true(fabs(f.token_ms - 0.25) < 1e-6 && fabs(f.base_ms - 3.0) < 1e-6);
    /* then a flood of one size, each step twice as slow: whether the base
     * or the slope grew is unknowable, but that size's cost is learnt */
    for (int i = 0; i < 2000; i++)
        rt_step_fit_add(&f, 40, 2.0 * (3.0 + 0.25 * 40));
    assert_true(fabs(rt_step_fit_ms(&f, 40) - 26.0) < 0.01);
    /* nonsense samples are ignored, never a negative cost */
    rt_step_fit_add(&f, 0, 5);
    rt_step_fit_add(&f, 10, -1);
    rt_step_fit_add(&f, 10, NAN);
    assert_true(f.base_ms >= 0 && f.token_ms >= 0);
    rt_step_fit g = {0};
    for (int i = 0; i < 50; i++)
        rt_step_fit_add(&g, 1 + i % 30, 10.0 - 0.2 * (1 + i % 30)); /* cheaper when bigger: slope 0 */
    assert_true(g.token_ms == 0 && g.base_ms > 0);
}

/* A worker flooded, then idle: the flood's slow steps stood in its
 * estimate while no step came to replace them (test_regions saw an idle
 * region shunned for 30 s). Idle, each class falls back toward its floor,
 * and the next real step sets it at once; busy, the figures are as
 * before; a machine slow for long enough is believed. */
static void test_idle_relaxes_to_floor(void **state)
{
    (void)state;
    rt_step_fit f = {0};
    for (int i = 0; i < 300; i++)
        rt_step_fit_add(&f, 20, 10.0);
    for (int i = 0; i < 20; i++)
        rt_step_fit_add(&f, 20, 400.0); /* a stall in a flood */
    double flooded = rt_step_fit_ms(&f, 20);
    assert_true(flooded > 30.0);
    rt_step_fit g = f;
    rt_step_fit_relax(&g, 0);
    rt_step_fit_relax(&g, -1);
    rt_step_fit_relax(&g, NAN);
    assert_true(rt_step_fit_ms(&g, 20) == flooded);
    const double floor = g.cls[4].floor_ms; /* 16-31 tokens; the stall raised it a little */
    assert_true(floor >= 10.0 && floor < 12.0);
    rt_step_fit_relax(&g, RT_STEP_RELAX_HALF_S);
    assert_true(fabs(rt_step_fit_ms(&g, 20) - (floor + (flooded - floor) / 2)) < 1e-6);
    for (int i = 0; i < 100; i++) /* 20 s idle */
        rt_step_fit_relax(&g, 0.2);
    assert_true(fabs(rt_step_fit_ms(&g, 20) - floor) < 0.1);
    rt_step_fit_add(&g, 20, 30.0); /* the next step after a long idle is most of the figure */
    assert_true(rt_step_fit_ms(&g, 20) > 25.0);
    /* three times slower for good: after a few hundred steps the floor
     * has followed, and idling no longer takes the figure back down */
    rt_step_fit h = {0};
    for (int i = 0; i < 300; i++)
        rt_step_fit_add(&h, 20, 10.0);
    for (int i = 0; i < 1500; i++)
        rt_step_fit_add(&h, 20, 30.0);
    rt_step_fit_relax(&h, 60);
    assert_true(rt_step_fit_ms(&h, 20) > 28.0);
}

/* A CPU-like step cost: flat while the weights' reading dominates, then
 * growing, and cheaper per token in big prompt chunks than in small ones. */
static double curved_ms(int n)
{
    return n <= 8 ? 0.5 : n <= 64 ? 0.5 + 0.25 * (n - 8) : 14.5 + 0.02 * (n - 64);
}

/* Steps of 1, 17 and 256 tokens only (decodes, one decode with a 16-token
 * prompt chunk, a whole prompt): each size's cost is what was measured
 * for it, where the line through all of them misses the middle one. */
static void test_mid_sizes_measured(void **state)
{
    (void)state;
    rt_step_fit f = {0};
    for (int i = 0; i < 600; i++) {
        int n = i % 40 == 0 ? 256 : i % 3 == 0 ? 17 : 1;
        rt_step_fit_add(&f, n, curved_ms(n));
    }
    for (int n = 1; n <= 256; n *= 16)
        assert_true(fabs(rt_step_fit_ms(&f, n + (n == 16)) - curved_ms(n + (n == 16))) < 1e-9);
    assert_true(fabs(f.base_ms + f.token_ms * 17 - curved_ms(17)) > 0.25 * curved_ms(17));
    /* between and past the sizes seen: interpolated, then the line's slope */
    double mid = rt_step_fit_ms(&f, 100);
    assert_true(mid > curved_ms(17) && mid < curved_ms(256));
    assert_true(fabs(rt_step_fit_ms(&f, 512) - (curved_ms(256) + f.token_ms * 256)) < 1e-9);
    /* below the smallest seen: never more than its cost, never below proportional */
    rt_step_fit g = {0};
    for (int i = 0; i < 20; i++)
        rt_step_fit_add(&g, 256, curved_ms(256));
    double one = rt_step_fit_ms(&g, 1);
    assert_true(one >= curved_ms(256) / 256 - 1e-12 && one <= curved_ms(256));
    /* a size whose steps slow down (the machine loaded) follows, over the line's memory */
    for (int i = 0; i < 600; i++)
        rt_step_fit_add(&f, 17, 2 * curved_ms(17));
    assert_true(fabs(rt_step_fit_ms(&f, 17) - 2 * curved_ms(17)) < 0.05 * curved_ms(17));
}

/* The busy case in structure: one sequence decoding, a new prompt of 256
 * goes in 16-token chunks beside it (the prefill budget), so its first
 * token comes after 16 steps of 17 tokens, at what such a step costs. */
static void test_busy_is_chunks_times_mixed_steps(void **state)
{
    (void)state;
    rt_step_fit f = {0};
    for (int i = 0; i < 600; i++) {
        int n = i % 40 == 0 ? 256 : i % 3 == 0 ? 17 : 1;
        rt_step_fit_add(&f, n, curved_ms(n));
    }
    rt_est_seq run[MAX_SEQS] = {{0, 1000, false}};
    double busy = rt_est_ttft(&f, 2, 512, run, 1, NULL, 0, 256, 100000);
    assert_true(rt_sched_prefill_budget(512, 1) == 16);
    assert_true(fabs(busy - 16 * curved_ms(17)) < 1e-9);
    /* flooded, in structure: slots decoding 300 and 600 more, one request
     * (256 + 100) waiting ahead. 300 steps of two decodes free a slot; the
     * one ahead prefills in 16 chunks beside the other's decodes, decodes
     * its 100 beside it, and only then ours goes in, in 16 chunks. */
    rt_est_seq full[MAX_SEQS] = {{0, 300, false}, {0, 600, false}}, q[1] = {{256, 100, false}};
    double flood = rt_est_ttft(&f, 2, 512, full, 2, q, 1, 256, 100000);
    assert_true(fabs(flood - (400 * rt_step_fit_ms(&f, 2) + 32 * curved_ms(17))) < 1e-9);
}

static void test_nothing_measured(void **state)
{
    (void)state;
    rt_step_fit f = {0};
    rt_est_seq run[MAX_SEQS];
    assert_true(rt_est_ttft(&f, MAX_SEQS, MAX_BATCH, run, 0, NULL, 0, 100, 100000) == 0);
}

static void test_by_hand(void **state)
{
    (void)state;
    rt_step_fit f = linear_fit(2.0, 0.5);
    rt_est_seq run[MAX_SEQS];
    /* idle: the prompt in chunks of the whole budget (64 + 36) */
    double idle = rt_est_ttft(&f, MAX_SEQS, MAX_BATCH, run, 0, NULL, 0, 100, 100000);
    assert_true(fabs(idle - ((2 + 0.5 * 64) + (2 + 0.5 * 36))) < 1e-6);
    /* every slot decoding 10 more: 10 steps of 8 tokens before the slot */
    for (int i = 0; i < MAX_SEQS; i++)
        run[i] = (rt_est_seq){0, 10 + i, false};
    double full = rt_est_ttft(&f, MAX_SEQS, MAX_BATCH, run, MAX_SEQS, NULL, 0, 10, 100000);
    /* then 7 decodes and its 10 prompt tokens (budget 16) in one step */
    assert_true(fabs(full - (10 * (2 + 0.5 * 8) + (2 + 0.5 * 17))) < 1e-6);
}

static void test_matches_step_by_step(void **state)
{
    (void)state;
    srand(34);
    rt_step_fit f = linear_fit(1.5, 0.07);
    for (int trial = 0; trial < 400; trial++) {
        int max_seqs = 1 + rand() % MAX_SEQS, max_batch = max_seqs + rand() % 200;
        rt_est_seq run[MAX_SEQS], run_copy[MAX_SEQS], q[32], q_copy[32];
        int n = rand() % (max_seqs + 1), nq = rand() % 32;
        for (int i = 0; i < n; i++)
            run[i] = rand() % 2 ? (rt_est_seq){0, 1 + rand() % 300, false}
                                : (rt_est_seq){1 + rand() % 500, rand() % 300, rand() % 4 == 0};
        for (int i = 0; i < nq; i++)
            q[i] = (rt_est_seq){1 + rand() % 800, rand() % 300, rand() % 4 == 0};
        int prompt = 1 + rand() % 600;
        memcpy(run_copy, run, sizeof(run));
        memcpy(q_copy, q, sizeof(q));
        double want = reference(&f, max_seqs, max_batch, run, n, q, nq, prompt);
        double got = rt_est_ttft(&f, max_seqs, max_batch, run_copy, n, q_copy, nq, prompt, 100000000);
        assert_true(fabs(got - want) <= 1e-9 * want);
    }
}

static void test_grows_with_the_queue(void **state)
{
    (void)state;
    rt_step_fit f = linear_fit(2.0, 0.1);
    double last = 0;
    for (int nq = 0; nq < 20; nq++) {
        rt_est_seq run[MAX_SEQS], q[20];
        for (int i = 0; i < MAX_SEQS; i++)
            run[i] = (rt_est_seq){0, 50, false};
        for (int i = 0; i < nq; i++)
            q[i] = (rt_est_seq){200, 50, false};
        double t = rt_est_ttft(&f, MAX_SEQS, MAX_BATCH, run, MAX_SEQS, q, nq, 200, 100000000);
        assert_true(t > last);
        last = t;
    }
}

static void test_work_bound(void **state)
{
    (void)state;
    rt_step_fit f = linear_fit(2.0, 0.1);
    rt_est_seq run[1] = {{0, 1000000, false}}, run2[1] = {{0, 1000000, false}};
    /* one slot held for a million steps, one step at a time at most */
    double cut = rt_est_ttft(&f, 1, 1, run, 1, NULL, 0, 5, 1000);
    double all = rt_est_ttft(&f, 1, 1, run2, 1, NULL, 0, 5, 100000000);
    assert_true(cut > 0 && cut <= all);
}

/* ---- fair share between tenants (rt_est_ttft_fair) ---- */

/* The reference, fair: one step at a time as sched.c makes them. A free
 * slot takes the first queued request of the tenant with the least
 * virtual time (the new one after its tenant's); decodes, then prompt
 * chunks by tenant virtual time as of the step's start (admission order
 * within a tenant); each tenant charged its tokens over its weight.
 * Catch-up: with two tenants or more present, those owed work as the step
 * starts (rt_sched_owed over their recent tokens) have their prompts
 * first, and each may take up to what it is owed of
 * rt_sched_catchup_budget's tokens on top of the budget; every tenant's
 * recent tokens decay and grow a step at a time. */
static double reference_fair(const rt_step_fit *f, int max_seqs, int max_batch, const rt_est_seq *run0,
                             const int *run_tn0, int n, const rt_est_seq *q0, const int *q_tn, int nq,
                             const rt_est_tenant *tn0, int n_tn, int prompt, int tenant)
{
    rt_est_seq run[64], q[64];
    int run_tn[64];
    bool taken[65] = {0};
    rt_est_tenant tn[8];
    memcpy(run, run0, (size_t)n * sizeof(*run));
    memcpy(run_tn, run_tn0, (size_t)n * sizeof(*run_tn));
    memcpy(q, q0, (size_t)nq * sizeof(*q));
    memcpy(tn, tn0, (size_t)n_tn * sizeof(*tn));
    double t = 0;
    for (;;) {
        while (n < max_seqs) {
            int best = -1;
            for (int i = 0; i <= nq; i++) {
                int ti = i < nq ? q_tn[i] : tenant;
                const rt_est_tenant *a = &tn[ti], *b = &tn[best < 0 ? 0 : best < nq ? q_tn[best] : tenant];
                if (!taken[i] && (best < 0 || a->vt < b->vt || (a->vt == b->vt && a->recent / a->weight <
                                                                                      b->recent / b->weight)))
                    best = i;
            }
            if (best < 0)
                break;
            taken[best] = true;
            run_tn[n] = best < nq ? q_tn[best] : tenant;
            run[n++] = best < nq ? q[best] : (rt_est_seq){prompt, -1, false};
        }
        double vt[8], due[8] = {0}, used[8] = {0};
        bool present[8] = {0}, owed[8] = {0};
        int allow[8] = {0}, n_present = 0;
        for (int i = 0; i < n; i++)
            present[run_tn[i]] = true;
        for (int i = 0; i <= nq; i++)
            if (!taken[i])
                present[i < nq ? q_tn[i] : tenant] = true;
        double sum_recent = 0, sum_w = 0;
        for (int i = 0; i < n_tn; i++) {
            vt[i] = tn[i].vt;
            n_present += present[i];
            sum_recent += present[i] ? tn[i].recent : 0;
            sum_w += present[i] ? tn[i].weight : 0;
        }
        int n_dec = 0, tokens = 0;
        for (int i = 0; i < n; i++)
            if (run[i].prefill_left == 0) {
                n_dec++;
                run[i].decode_left--;
                due[run_tn[i]] += 1 / tn[run_tn[i]].weight;
                used[run_tn[i]] += 1;
            }
        int left = rt_sched_prefill_budget(max_batch, n_dec);
        int pool = n_present > 1 ? rt_sched_catchup_budget(max_batch, n_dec) : 0;
        for (int i = 0; i < n_tn; i++) {
            allow[i] = pool > 0 && present[i] ? rt_sched_owed(tn[i].recent, tn[i].weight, sum_recent, sum_w) : 0;
            owed[i] = allow[i] > 0;
        }
        tokens = n_dec;
        bool done = false, served[64] = {0};
        rt_est_seq start[64];
        memcpy(start, run, (size_t)n * sizeof(*run));
        for (;;) { /* the prompts: owed first, then in line_before's order, at the step's start */
            int next = -1;
            for (int i = 0; i < n; i++) {
                if (run[i].prefill_left <= 0 || served[i])
                    continue;
                int a = run_tn[i], b = next < 0 ? 0 : run_tn[next];
                if (next < 0 || (owed[a] && !owed[b]) ||
                    (owed[a] == owed[b] && line_before(&start[i], vt[a], &start[next], vt[b])))
                    next = i;
            }
            if (next < 0 || (left <= 0 && pool <= 0))
                break;
            served[next] = true;
            int tt = run_tn[next];
            int take = run[next].prefill_left < left ? run[next].prefill_left : left;
            left -= take;
            int more = run[next].prefill_left - take;
            more = more < pool ? more : pool;
            more = more < allow[tt] ? more : allow[tt];
            pool -= more;
            allow[tt] -= more;
            take += more;
            tokens += take;
            run[next].prefill_left -= take;
            due[tt] += take / tn[tt].weight;
            used[tt] += take;
            done |= run[next].decode_left == -1 && run[next].prefill_left == 0;
        }
        for (int i = 0; i < n_tn; i++) {
            tn[i].vt += due[i];
            tn[i].recent = tn[i].recent * RT_SCHED_RECENT_DECAY + used[i];
        }
        t += rt_step_fit_ms(f, tokens);
        if (done)
            return t;
        int k = 0;
        for (int i = 0; i < n; i++)
            if (run[i].prefill_left > 0 || run[i].decode_left > 0) {
                run_tn[k] = run_tn[i];
                run[k++] = run[i];
            }
        n = k;
    }
}

/* Catch-up: tenant 0's seven sequences decode (the step's prompt budget is
 * 16 tokens, and 23 more for a tenant owed work); tenant 1's new 30-token
 * prompt, with nothing done for it lately against tenant 0's 1000 tokens,
 * is done in one step, where without it (no recent work on either side,
 * nobody owed) it takes two. */
static void test_fair_catch_up(void **state)
{
    (void)state;
    rt_step_fit f = linear_fit(2.0, 0.5);
    for (int owed = 0; owed < 2; owed++) {
        rt_est_seq run[MAX_SEQS];
        int run_tn[MAX_SEQS];
        for (int i = 0; i < MAX_SEQS - 1; i++) {
            run[i] = (rt_est_seq){0, 100, false};
            run_tn[i] = 0;
        }
        rt_est_tenant tn[2] = {{.vt = 10, .weight = 1, .recent = owed ? 1000 : 0}, {.vt = 10, .weight = 1}};
        double got = rt_est_ttft_fair(&f, MAX_SEQS, MAX_BATCH, run, run_tn, MAX_SEQS - 1, NULL, NULL, 0, tn, 2, 30,
                                      1, 100000000);
        double want = owed ? 2 + 0.5 * (7 + 30) : (2 + 0.5 * (7 + 16)) + (2 + 0.5 * (7 + 14));
        assert_true(fabs(got - want) < 1e-9);
    }
}

/* A light tenant's request takes the free slot before a heavy tenant's
 * queued ones, which came first: its first token comes as if they were
 * not there. In arrival order it waited for them. */
static void test_fair_admission_order(void **state)
{
    (void)state;
    rt_step_fit f = linear_fit(2.0, 0.5);
    rt_est_seq run[MAX_SEQS], run2[MAX_SEQS], q[3], q2[3];
    int run_tn[MAX_SEQS], q_tn[3] = {0, 0, 0};
    for (int i = 0; i < MAX_SEQS - 1; i++) {
        run[i] = run2[i] = (rt_est_seq){0, 100, false};
        run_tn[i] = 0;
    }
    for (int i = 0; i < 3; i++)
        q[i] = q2[i] = (rt_est_seq){200, 50, false};
    rt_est_tenant tn[2] = {{.vt = 1000, .weight = 1}, {.vt = 0, .weight = 1}};
    double fair = rt_est_ttft_fair(&f, MAX_SEQS, MAX_BATCH, run, run_tn, MAX_SEQS - 1, q, q_tn, 3, tn, 2, 10, 1,
                                   100000000);
    double alone = rt_est_ttft(&f, MAX_SEQS, MAX_BATCH, run2, MAX_SEQS - 1, NULL, 0, 10, 100000000);
    assert_true(fabs(fair - alone) <= 1e-9 * alone);
    /* the old replay, arrival order: behind the three, far later */
    for (int i = 0; i < MAX_SEQS - 1; i++)
        run2[i] = (rt_est_seq){0, 100, false};
    double arrival = rt_est_ttft(&f, MAX_SEQS, MAX_BATCH, run2, MAX_SEQS - 1, q2, 3, 10, 100000000);
    assert_true(arrival > 10 * fair);
    /* the heavy tenant's own new request still waits behind its three */
    for (int i = 0; i < MAX_SEQS - 1; i++)
        run[i] = (rt_est_seq){0, 100, false};
    for (int i = 0; i < 3; i++)
        q[i] = (rt_est_seq){200, 50, false};
    tn[0].vt = 1000;
    tn[1].vt = 0;
    double heavy = rt_est_ttft_fair(&f, MAX_SEQS, MAX_BATCH, run, run_tn, MAX_SEQS - 1, q, q_tn, 3, tn, 2, 10, 0,
                                    100000000);
    assert_true(fabs(heavy - arrival) <= 1e-9 * arrival);
}

/* A step's prompt budget goes to the tenant with the least virtual time
 * first: the light tenant's 30-token prompt shares the first step with
 * the heavy one's 200 (admitted first), and is done in it. */
static void test_fair_prompt_order(void **state)
{
    (void)state;
    rt_step_fit f = linear_fit(2.0, 0.5);
    rt_est_seq run[MAX_SEQS] = {{200, 10, false}};
    int run_tn[MAX_SEQS] = {0};
    rt_est_tenant tn[2] = {{.vt = 10, .weight = 1}, {.vt = 0, .weight = 1}};
    double fair = rt_est_ttft_fair(&f, MAX_SEQS, MAX_BATCH, run, run_tn, 1, NULL, NULL, 0, tn, 2, 30, 1,
                                   100000000);
    assert_true(fabs(fair - (2 + 0.5 * MAX_BATCH)) < 1e-9);
}

/* On random queues of up to four tenants of several weights and recent
 * work (catch-up), the replay (which jumps over steps while one tenant's
 * prompts are in line) gives what the fair step-by-step reference gives;
 * with one tenant, what rt_est_ttft gives. */
static void test_fair_matches_step_by_step(void **state)
{
    (void)state;
    srand(35);
    rt_step_fit f = linear_fit(1.5, 0.07);
    for (int trial = 0; trial < 400; trial++) {
        int max_seqs = 1 + rand() % MAX_SEQS, max_batch = max_seqs + rand() % 200, n_tn = 1 + rand() % 4;
        rt_est_seq run[MAX_SEQS], run_copy[MAX_SEQS], q[32], q_copy[32];
        int run_tn[MAX_SEQS], run_tn_copy[MAX_SEQS], q_tn[32];
        rt_est_tenant tn[4], tn_copy[4];
        for (int i = 0; i < n_tn; i++)
            /* weights of powers of two: the replay charges a run of alike
             * steps at once, the reference one by one, and other weights'
             * rounding may break a tie of virtual times otherwise */
            tn[i] = (rt_est_tenant){.vt = rand() % 500, .weight = (double)(1 << rand() % 4) / 2,
                                    .recent = rand() % 3 ? rand() % 2000 : 0};
        int n = rand() % (max_seqs + 1), nq = rand() % 32, prompt = 1 + rand() % 600, tenant = rand() % n_tn;
        for (int i = 0; i < n; i++) {
            run[i] = rand() % 2 ? (rt_est_seq){0, 1 + rand() % 300, false}
                                : (rt_est_seq){1 + rand() % 500, rand() % 300, rand() % 4 == 0};
            run_tn[i] = rand() % n_tn;
        }
        for (int i = 0; i < nq; i++) {
            q[i] = (rt_est_seq){1 + rand() % 800, rand() % 300, rand() % 4 == 0};
            q_tn[i] = rand() % n_tn;
        }
        memcpy(run_copy, run, sizeof(run));
        memcpy(run_tn_copy, run_tn, sizeof(run_tn));
        memcpy(q_copy, q, sizeof(q));
        memcpy(tn_copy, tn, sizeof(tn));
        double want = reference_fair(&f, max_seqs, max_batch, run, run_tn, n, q, q_tn, nq, tn, n_tn, prompt, tenant);
        double got = rt_est_ttft_fair(&f, max_seqs, max_batch, run_copy, run_tn_copy, n, q_copy, q_tn, nq, tn_copy,
                                      n_tn, prompt, tenant, 100000000);
        assert_true(fabs(got - want) <= 1e-9 * want);
        if (n_tn == 1) {
            memcpy(run_copy, run, sizeof(run));
            memcpy(q_copy, q, sizeof(q));
            double one = rt_est_ttft(&f, max_seqs, max_batch, run_copy, n, q_copy, nq, prompt, 100000000);
            assert_true(fabs(one - want) <= 1e-9 * want);
        }
    }
}

/* One sequence decoding, a 400-token prompt admitted before the new
 * request's 30 (a chat turn whose prefix was cached): the new one takes
 * the budget (16 a step beside one decode) first and is done in 2 steps;
 * in admission order it waited the 25 steps of the long one. Once the
 * long one has waited prompt_max_wait_ms (aged), it goes first again. */
static void test_shortest_prompt_first(void **state)
{
    (void)state;
    rt_step_fit f = linear_fit(2.0, 0.5);
    rt_est_seq run[MAX_SEQS] = {{0, 1000, false}, {400, 10, false}};
    assert_true(rt_sched_prefill_budget(MAX_BATCH, 1) == 16);
    double shortest = rt_est_ttft(&f, MAX_SEQS, MAX_BATCH, run, 2, NULL, 0, 30, 100000000);
    assert_true(fabs(shortest - 2 * (2 + 0.5 * 17)) < 1e-9);
    rt_est_seq aged[MAX_SEQS] = {{0, 1000, false}, {400, 10, true}};
    double behind = rt_est_ttft(&f, MAX_SEQS, MAX_BATCH, aged, 2, NULL, 0, 30, 100000000);
    assert_true(fabs(behind - (25 * (2 + 0.5 * 17) + (2 + 0.5 * 18) + (2 + 0.5 * 16))) < 1e-9);
    /* the same between two tenants while their virtual times are equal:
     * the new one's (weight 16) is charged 16 / 16 for its first chunk,
     * the other 1 for its decode */
    rt_est_seq two[MAX_SEQS] = {{0, 1000, false}, {400, 10, false}};
    int run_tn[MAX_SEQS] = {0, 0};
    rt_est_tenant tn[2] = {{.vt = 5, .weight = 1}, {.vt = 5, .weight = 16}};
    double fair = rt_est_ttft_fair(&f, MAX_SEQS, MAX_BATCH, two, run_tn, 2, NULL, NULL, 0, tn, 2, 30, 1,
                                   100000000);
    assert_true(fabs(fair - shortest) < 1e-9);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fit_recovers_a_line),  cmocka_unit_test(test_mid_sizes_measured),
        cmocka_unit_test(test_idle_relaxes_to_floor),
        cmocka_unit_test(test_busy_is_chunks_times_mixed_steps), cmocka_unit_test(test_nothing_measured),
        cmocka_unit_test(test_by_hand),              cmocka_unit_test(test_matches_step_by_step),
        cmocka_unit_test(test_grows_with_the_queue), cmocka_unit_test(test_work_bound),
        cmocka_unit_test(test_fair_admission_order), cmocka_unit_test(test_fair_prompt_order),
        cmocka_unit_test(test_fair_matches_step_by_step), cmocka_unit_test(test_shortest_prompt_first),
        cmocka_unit_test(test_fair_catch_up),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
