/* What the scheduler's TTFT estimate costs its compute thread (runtime/
 * sched_est.h; sched.c refreshes it at most every 50 ms): the replay in
 * arrival order (rt_est_ttft, one tenant) against the replay in fair
 * share's order (rt_est_ttft_fair) with 2 and 8 tenants, which jumps over
 * runs of alike steps only while one tenant's prompts are in line. A
 * flooded worker: every slot decoding (up to 700 tokens left), a queue of
 * prompts of ~100 tokens and answers of 700. Thread CPU time per estimate,
 * the cases alternated, the median of the repetitions.
 *
 *   bench_sched_est [--seqs 64] [--queue 64] [--reps 200] */
#include "bench/bench_util.h"
#include "runtime/sched_est.h"

#include <stdio.h>

#define MAX 1024

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static rt_est_seq run0[MAX], q0[MAX];
static int run_tn0[MAX], q_tn0[MAX];

/* One estimate with n_tn tenants (0: rt_est_ttft); its result in *ms. */
static double timed(const rt_step_fit *f, int seqs, int nq, int n_tn, double *ms)
{
    rt_est_seq run[MAX], q[MAX];
    int run_tn[MAX];
    rt_est_tenant tn[8];
    memcpy(run, run0, sizeof(run));
    memcpy(q, q0, sizeof(q));
    memcpy(run_tn, run_tn0, sizeof(run_tn));
    for (int i = 0; i < 8; i++)
        tn[i] = (rt_est_tenant){.vt = 100.0 * i, .weight = 1};
    for (int i = 0; i < seqs; i++)
        run_tn[i] %= n_tn > 0 ? n_tn : 1;
    int q_tn[MAX];
    for (int i = 0; i < nq; i++)
        q_tn[i] = q_tn0[i] % (n_tn > 0 ? n_tn : 1);
    double t0 = cpu_now();
    *ms = n_tn == 0 ? rt_est_ttft(f, seqs, 512, run, seqs, q, nq, 100, 200000)
                    : rt_est_ttft_fair(f, seqs, 512, run, run_tn, seqs, q, q_tn, nq, tn, n_tn, 100, n_tn - 1,
                                       200000);
    return cpu_now() - t0;
}

int main(int argc, char **argv)
{
    int seqs = bench_arg_int(argc, argv, "--seqs", 64), nq = bench_arg_int(argc, argv, "--queue", 64);
    int reps = bench_arg_int(argc, argv, "--reps", 200);
    if (seqs < 1 || seqs > MAX || nq < 0 || nq > MAX || reps < 1)
        return 2;
    rt_step_fit f = {0};
    for (int i = 0; i < 300; i++) {
        int n = 1 + (i * 37) % 512;
        rt_step_fit_add(&f, n, 8 + 0.05 * n);
    }
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < seqs; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        run0[i] = (rt_est_seq){0, 1 + (int)(x % 700), false};
        run_tn0[i] = (int)(x >> 32 & 7);
    }
    for (int i = 0; i < nq; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        q0[i] = (rt_est_seq){50 + (int)(x % 100), 699, false};
        q_tn0[i] = (int)(x >> 32 & 7);
    }
    const int cases[3] = {0, 2, 8};
    double *t[3], est[3];
    for (int c = 0; c < 3; c++)
        t[c] = malloc((size_t)reps * sizeof(double));
    for (int r = 0; r < reps; r++)
        for (int c = 0; c < 3; c++)
            t[c][r] = timed(&f, seqs, nq, cases[c], &est[c]);
    printf("slots %d, queue %d: thread CPU per estimate (median of %d)\n", seqs, nq, reps);
    for (int c = 0; c < 3; c++)
        printf("  %-28s %8.1f us   estimate %.0f ms\n",
               c == 0 ? "arrival order (rt_est_ttft)" : c == 1 ? "fair, 2 tenants" : "fair, 8 tenants",
               bench_median(t[c], reps) * 1e6, est[c]);
    for (int c = 0; c < 3; c++)
        free(t[c]);
    return 0;
}
