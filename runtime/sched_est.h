/* The scheduler's time-to-first-token estimate (what routing ranks a
 * worker and its region by): a model of one step's duration fitted to the
 * steps this worker ran, and a fast replay of the scheduler's own policy
 * (slots, chunked prefill with prefill_budget, decodes first) over the
 * requests ahead of a new one, until that one's prompt is done.
 *
 * Why a replay and not a formula over the counts: the counts (running,
 * queued, an unloaded TTFT) know nothing of how long the prompts ahead
 * are, how many tokens the running requests still have to go, or how a
 * step slows as the batch grows; a flooded worker's estimate read a third
 * of what its requests waited. Pure functions and a small state, no
 * locks: the scheduler calls them on its compute thread. */
#ifndef RT_SCHED_EST_H
#define RT_SCHED_EST_H

#include <stdbool.h>

/* A step's duration against its size (tokens in the step). A step's cost
 * is no line: below some size a step costs about the same whatever it
 * carries (reading the weights), above it grows with the tokens, and a
 * kernel's efficiency changes with the batch's shape. A line fitted
 * across decode steps of 1-2 tokens and whole prompts of hundreds put the
 * mid-sized steps of chunked prefill (a few decodes and 16 prompt tokens)
 * at a fraction of their cost. So each class of sizes (powers of two)
 * keeps its own recent mean size and time, and a size between two classes
 * seen is interpolated between them; a line (base_ms + token_ms x tokens,
 * exponentially weighted least squares over recent steps) extends past
 * the smallest and largest classes seen. */
#define RT_STEP_CLASSES 16 /* 1, 2-3, 4-7, ..., 32768 and more */

typedef struct rt_step_class {
    double w, wn, wms; /* its steps' weights (as the line's), and weighted tokens and milliseconds */
    double n, ms;      /* their weighted means */
    double floor_ms;   /* the lowest ms has been, rising slowly with it (rt_step_fit_relax) */
    long steps;        /* seen; 0: no figure */
} rt_step_class;

typedef struct rt_step_fit {
    double s0, s1, s2, sy, s1y; /* weighted sums of 1, n, n^2, y, n*y */
    double base_ms, token_ms;   /* the line; 0 and 0 until a step is seen */
    long steps;
    rt_step_class cls[RT_STEP_CLASSES];
} rt_step_fit;

void rt_step_fit_add(rt_step_fit *f, int tokens, double ms);
/* The expected duration of a step of `tokens` tokens; 0 before any step. */
double rt_step_fit_ms(const rt_step_fit *f, int tokens);
/* A worker idle for idle_s more seconds: each class's mean moves toward its
 * floor (half the way every RT_STEP_RELAX_HALF_S) and its weight falls as
 * much, so that the next steps of that size soon replace it. Without it a
 * stretch of slow steps (a flood, a busy machine) stood in an idle
 * worker's estimate until a request came, and routing, going by that
 * estimate, sent none: the worker was shunned for good. Optimism is the
 * cheaper error: a worker that really is slower now costs one request's
 * TTFT, and that request's steps correct the figure. */
#define RT_STEP_RELAX_HALF_S 2.0
void rt_step_fit_relax(rt_step_fit *f, double idle_s);

/* Prompt tokens a step may carry besides n_dec decodes (the scheduler's
 * policy, here so that the replay follows the same one). */
int rt_sched_prefill_budget(int max_batch_tokens, int n_dec);

/* Catch-up (sched.h): the tokens computed for a tenant lately, decayed by
 * this factor at every step (a memory of about 100 steps). */
#define RT_SCHED_RECENT_DECAY 0.99

/* Prompt tokens a step may carry past rt_sched_prefill_budget for the
 * prompts of tenants owed work (rt_sched_owed): as many as the step holds
 * without them (so it at most doubles, and so does the decoding streams'
 * time for that token), within max_batch_tokens; 0 with nothing decoding,
 * when the budget is whole already. */
int rt_sched_catchup_budget(int max_batch_tokens, int n_dec);

/* The work a tenant is owed, in whole tokens: its weight's share (w of
 * sum_w, the weights of the tenants present) of the tokens computed lately
 * for them all (sum_recent), less its own (recent); 0 when it has had its
 * share, and so always for a tenant alone. */
int rt_sched_owed(double recent, double w, double sum_recent, double sum_w);

/* Whether a tenant of virtual time vt_a and recent work per weight
 * recent_a has its waiting request admitted before one of vt_b and
 * recent_b: the least virtual time first, and among tenants level (one
 * coming back starts level with the least present), the one served less
 * lately. */
bool rt_sched_fair_before(double vt_a, double recent_a, double vt_b, double recent_b);

/* A request ahead in the replay: prompt tokens still to prefill and
 * tokens still to generate after the first (0 once decoding: then left
 * counts the tokens to go). */
typedef struct rt_est_seq {
    int prefill_left; /* > 0 while its prompt is not done */
    int decode_left;  /* tokens to generate after the prompt's (or the next) one */
    /* Its prompt has waited the scheduler's prompt_max_wait_ms: it goes
     * before the shorter ones (the new request's never has; a prompt
     * that ages while the replay runs is not seen to). */
    bool aged;
} rt_est_seq;

/* A tenant in rt_est_ttft_fair's replay: the scheduler's virtual time and
 * weight (sched.c: tokens computed for it / weight, the least goes next). */
typedef struct rt_est_tenant {
    double vt;
    double weight; /* > 0 */
    double recent; /* tokens computed for it lately (sched.c's, decayed by RT_SCHED_RECENT_DECAY a step) */
    int live;      /* scratch: its requests in the replay */
    double due;    /* scratch: what the step being replayed charges it */
    double used;   /* scratch: the tokens computed for it in the steps being replayed */
    int allow;     /* scratch: what it may still take past the budget in this step (rt_sched_owed) */
    bool owed;     /* scratch: owed work at the step's start: its prompts go first */
} rt_est_tenant;

/* Milliseconds until a new request with a prompt of `prompt` tokens gets
 * its first token, if it joined now behind `queued` (in admission order)
 * with `running` in the slots (decode_left >= 0; the running array holds
 * max_seqs entries). A step's prompt budget goes to the aged prompts first,
 * in admission order, then to the others, the fewest tokens left first,
 * as sched.c's build_batch gives it. The arrays are changed (scratch). Stops
 * after max_work sequence-steps of replay and returns what it reached (a
 * lower bound). 0 while the fit has seen no step. */
double rt_est_ttft(const rt_step_fit *f, int max_seqs, int max_batch_tokens, rt_est_seq *running, int n_running,
                   rt_est_seq *queued, int n_queued, int prompt, long max_work);

/* rt_est_ttft in the order the scheduler's fair share between tenants
 * takes them (sched.h): a free slot goes to the first queued request of
 * the tenant with the least virtual time, a step's prompt tokens to the
 * prompts of the tenants with the least first (rt_est_ttft's order within
 * a tenant, and between tenants of equal virtual times), and each step
 * charges every tenant the tokens it computed for it, over its weight; the
 * prompts of tenants owed work (rt_sched_owed, at the step's start) go
 * first and may take rt_sched_catchup_budget's tokens on top, as the
 * scheduler's catch-up. run_tn[i] and q_tn[i] are the tenants (indices in
 * tenants, n_tenants entries) of running[i] and queued[i]; the new request
 * is tenant `tenant`'s, after that tenant's queued ones. The arrays are
 * changed (scratch). With one tenant it is rt_est_ttft.
 * Not replayed: fair-share preemption (a tenant holding more slots per
 * weight gives one way to another's waiting request), so with every slot
 * held a lighter tenant's request is estimated to wait for one to free. */
double rt_est_ttft_fair(const rt_step_fit *f, int max_seqs, int max_batch_tokens, rt_est_seq *running,
                        int *run_tn, int n_running, rt_est_seq *queued, const int *q_tn, int n_queued,
                        rt_est_tenant *tenants, int n_tenants, int prompt, int tenant, long max_work);

#endif
