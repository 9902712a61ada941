/* Per-token costs of a sequence's sampling step over one row of logits:
 * rt_sampler_sample (greedy, and temperature 0.8 with top_p 0.95) and
 * rt_logprobs (chosen token and 5 likeliest), with the row copied first as
 * the scheduler copies it. Beside them, in the same run, the definition of
 * log sum exp in scalar double (what rt_logprobs ran before it used the
 * vector unit's exponentials), so the two read as a ratio.
 *
 *   bench_sampler [--vocab N] [--reps R] [--iters I]
 *
 * Logits are uniform in [-10, 10), from a fixed seed: flatter than a
 * model's, so top_p keeps a wide nucleus (the sampler's slow case). */
#include "bench/bench_util.h"
#include "runtime/sampler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_REPS 31

static double scalar_lse(const float *x, int32_t n)
{
    float max = -INFINITY;
    for (int32_t i = 0; i < n; i++)
        max = x[i] > max ? x[i] : max;
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++)
        sum += exp((double)x[i] - (double)max);
    return log(sum) + (double)max;
}

enum { GREEDY, TEMP, LOGPROBS, SCALAR_LSE, N_CASES };
static const char *const k_case[N_CASES] = {"sample greedy", "sample t=0.8 top_p=0.95", "rt_logprobs k=5",
                                            "log sum exp, scalar double"};

int main(int argc, char **argv)
{
    const int n = bench_arg_int(argc, argv, "--vocab", 32000);
    int reps = bench_arg_int(argc, argv, "--reps", 7);
    const int iters = bench_arg_int(argc, argv, "--iters", 200);
    if (n < 1 || reps < 1 || iters < 1) {
        fprintf(stderr, "bench_sampler: --vocab, --reps and --iters must be positive\n");
        return 2;
    }
    reps = reps > MAX_REPS ? MAX_REPS : reps;
    float *logits = malloc((size_t)n * sizeof(float)), *row = malloc((size_t)n * sizeof(float));
    if (!logits || !row)
        return 1;
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    for (int32_t i = 0; i < n; i++)
        logits[i] = 10.0f * bench_frand(&seed);

    rt_sampler_params gp, tp;
    rt_sampler_params_default(&gp);
    gp.temperature = 0.0f;
    rt_sampler_params_default(&tp);
    tp.temperature = 0.8f;
    tp.top_p = 0.95f;
    tp.seed = 1;
    rt_sampler *greedy = rt_sampler_new(&gp, n), *temp = rt_sampler_new(&tp, n);
    if (!greedy || !temp)
        return 1;

    double t[N_CASES][MAX_REPS];
    volatile double sink = 0.0;
    rt_token_logprobs lp;
    /* cases alternate within each repetition, so drift hits all alike */
    for (int r = 0; r < reps; r++)
        for (int c = 0; c < N_CASES; c++) {
            const double t0 = bench_now();
            for (int i = 0; i < iters; i++) {
                memcpy(row, logits, (size_t)n * sizeof(float));
                if (c == GREEDY)
                    sink += rt_sampler_sample(greedy, row);
                else if (c == TEMP)
                    sink += rt_sampler_sample(temp, row);
                else if (c == LOGPROBS) {
                    rt_logprobs(row, n, i % n, 5, &lp);
                    sink += lp.logprob;
                } else
                    sink += scalar_lse(row, n);
            }
            t[c][r] = (bench_now() - t0) / iters;
        }
    printf("vocab %d, %d reps of %d rows (the row copy included), median per row:\n", n, reps, iters);
    const double base = bench_median(t[SCALAR_LSE], reps);
    for (int c = 0; c < N_CASES; c++) {
        const double m = bench_median(t[c], reps);
        printf("  %-28s %8.1f us  (%.2fx the scalar log sum exp)\n", k_case[c], m * 1e6, m / base);
    }
    rt_sampler_free(greedy);
    rt_sampler_free(temp);
    free(logits);
    free(row);
    return sink == 12345.0; /* keeps the work */
}
