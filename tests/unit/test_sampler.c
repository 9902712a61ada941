/* Sampler and stop-matcher tests: greedy and filters on crafted logits,
 * seeding, penalties, empirical frequencies against softmax, nucleus and
 * top-k membership against a full sort, and the stop matcher against a naive
 * reference over random chunkings (UTF-8 hold-back included). */
#define _GNU_SOURCE /* memmem */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/sampler.h"

static uint64_t rng_state;

static uint32_t rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

static rt_sampler *make(float temp, int top_k, float top_p, float min_p, uint64_t seed, int32_t n)
{
    rt_sampler_params p;
    rt_sampler_params_default(&p);
    p.temperature = temp;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.seed = seed;
    rt_sampler *s = rt_sampler_new(&p, n);
    assert_non_null(s);
    return s;
}

static int32_t draw(rt_sampler *s, const float *logits, int32_t n)
{
    float tmp[64];
    assert_true(n <= 64);
    memcpy(tmp, logits, (size_t)n * sizeof(float));
    return rt_sampler_sample(s, tmp);
}

static void test_defaults_and_greedy(void **state)
{
    (void)state;
    rt_sampler_params p;
    rt_sampler_params_default(&p);
    assert_true(p.temperature == 1.0f && p.top_p == 1.0f && p.top_k == 0 && p.min_p == 0.0f);
    assert_true(p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f);
    assert_null(rt_sampler_new(&p, 0));

    float logits[] = {1.0f, 5.0f, -2.0f, 5.0f, 4.9f};
    rt_sampler *s = make(0.0f, 0, 1.0f, 0.0f, 1, 5);
    for (int i = 0; i < 10; i++)
        assert_int_equal(draw(s, logits, 5), 1); /* lowest index wins the tie */
    rt_sampler_free(s);
    s = make(1.0f, 1, 1.0f, 0.0f, 1, 5); /* top_k 1 is greedy */
    for (int i = 0; i < 10; i++)
        assert_int_equal(draw(s, logits, 5), 1);
    rt_sampler_free(s);
    s = make(0.8f, 0, 1e-6f, 0.0f, 1, 5); /* a tiny nucleus keeps the best only */
    for (int i = 0; i < 100; i++)
        assert_int_equal(draw(s, logits, 5), 1);
    rt_sampler_free(s);
    s = make(1.0f, 0, 0.0f, 0.0f, 1, 5); /* and an empty one too: greedy */
    for (int i = 0; i < 100; i++)
        assert_int_equal(draw(s, logits, 5), 1);
    rt_sampler_free(s);
    s = make(-1.0f, 0, 1.0f, 0.0f, 1, 5); /* negative temperature: greedy */
    assert_int_equal(draw(s, logits, 5), 1);
    rt_sampler_free(s);
    s = make(1e-45f, 0, 1.0f, 0.0f, 1, 5); /* too small to divide by: greedy */
    for (int i = 0; i < 20; i++)
        assert_int_equal(draw(s, logits, 5), 1);
    rt_sampler_free(s);

    float nan_logits[] = {NAN, 1.0f, NAN, 2.0f};
    s = make(0.0f, 0, 1.0f, 0.0f, 1, 4);
    assert_int_equal(draw(s, nan_logits, 4), 3);
    rt_sampler_free(s);
    s = make(1.0f, 0, 1.0f, 0.0f, 3, 4);
    for (int i = 0; i < 200; i++) {
        int32_t t = draw(s, nan_logits, 4);
        assert_true(t == 1 || t == 3);
    }
    rt_sampler_free(s);
    float inf_logits[] = {0.0f, INFINITY, 3.0f, INFINITY};
    s = make(1.0f, 0, 1.0f, 0.0f, 3, 4);
    for (int i = 0; i < 100; i++) {
        int32_t t = draw(s, inf_logits, 4);
        assert_true(t == 1 || t == 3);
    }
    rt_sampler_free(s);
    float one[] = {0.5f};
    s = make(1.0f, 0, 0.9f, 0.1f, 3, 1);
    assert_int_equal(draw(s, one, 1), 0);
    rt_sampler_free(s);
}

static void test_seeds(void **state)
{
    (void)state;
    float logits[64];
    for (int i = 0; i < 64; i++)
        logits[i] = (float)(i % 7) * 0.1f;
    int32_t a[100], b[100], c[100];
    rt_sampler *s1 = make(1.0f, 0, 1.0f, 0.0f, 1234, 64);
    rt_sampler *s2 = make(1.0f, 0, 1.0f, 0.0f, 1234, 64);
    rt_sampler *s3 = make(1.0f, 0, 1.0f, 0.0f, 1235, 64);
    for (int i = 0; i < 100; i++) {
        a[i] = draw(s1, logits, 64);
        b[i] = draw(s2, logits, 64);
        c[i] = draw(s3, logits, 64);
    }
    assert_memory_equal(a, b, sizeof(a));
    assert_memory_not_equal(a, c, sizeof(a));
    rt_sampler_free(s1);
    rt_sampler_free(s2);
    rt_sampler_free(s3);
}

static void test_filters(void **state)
{
    (void)state;
    /* probabilities 0.5, 0.3, 0.15, 0.05 */
    float logits[] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    int hist[4] = {0};
    rt_sampler *s = make(1.0f, 0, 1.0f, 0.2f, 7, 4); /* min_p 0.2: threshold 0.1 */
    for (int i = 0; i < 5000; i++)
        hist[draw(s, logits, 4)]++;
    assert_int_equal(hist[3], 0);
    assert_true(hist[0] > 0 && hist[1] > 0 && hist[2] > 0);
    rt_sampler_free(s);
    s = make(1.0f, 0, 1.0f, 0.7f, 7, 4); /* threshold 0.35: only the best */
    for (int i = 0; i < 200; i++)
        assert_int_equal(draw(s, logits, 4), 0);
    rt_sampler_free(s);
    s = make(1.0f, 0, 1.0f, 5.0f, 7, 4); /* min_p above 1 still keeps one */
    assert_int_equal(draw(s, logits, 4), 0);
    rt_sampler_free(s);

    memset(hist, 0, sizeof(hist));
    s = make(1.0f, 2, 1.0f, 0.0f, 8, 4);
    for (int i = 0; i < 5000; i++)
        hist[draw(s, logits, 4)]++;
    assert_true(hist[2] == 0 && hist[3] == 0);
    /* renormalised over the two: 0.625 / 0.375 */
    assert_true(fabs(hist[0] / 5000.0 - 0.625) < 0.03);
    rt_sampler_free(s);

    memset(hist, 0, sizeof(hist));
    s = make(1.0f, 0, 0.75f, 0.0f, 9, 4); /* 0.5 + 0.3 reaches 0.75 */
    for (int i = 0; i < 5000; i++)
        hist[draw(s, logits, 4)]++;
    assert_true(hist[2] == 0 && hist[3] == 0);
    assert_true(fabs(hist[0] / 5000.0 - 0.625) < 0.03);
    rt_sampler_free(s);
}

/* A nucleus that ends inside a run of equal probabilities takes the run's
 * lowest ids, as a sort would: 60 equal tokens at top_p 0.31 are 19. */
static void test_nucleus_ties(void **state)
{
    (void)state;
    enum { N = 60, KEEP = 19 };
    float logits[N];
    for (int i = 0; i < N; i++)
        logits[i] = 1.5f;
    int hist[N] = {0};
    rt_sampler *s = make(1.0f, 0, 0.31f, 0.0f, 11, N);
    for (int d = 0; d < 6000; d++)
        hist[draw(s, logits, N)]++;
    for (int i = 0; i < N; i++)
        if ((i < KEEP) != (hist[i] > 0))
            fail_msg("token %d drawn %d times; the nucleus is tokens 0..%d", i, hist[i], KEEP - 1);
    rt_sampler_free(s);
}

static void test_logit_bias(void **state)
{
    (void)state;
    float logits[] = {2.0f, 1.9f, 0.0f, -1.0f};
    rt_sampler_params p;
    rt_sampler_params_default(&p);
    p.temperature = 0.0f;
    p.n_bias = 2;
    p.bias[0] = (rt_sampler_bias){0, -100.0f}; /* the best one banned */
    p.bias[1] = (rt_sampler_bias){3, 2.5f};    /* 1.5: behind 1.9 */
    rt_sampler *s = rt_sampler_new(&p, 4);
    assert_non_null(s);
    assert_int_equal(draw(s, logits, 4), 1);
    rt_sampler_free(s);
    p.bias[1].bias = 3.0f; /* 2.0: now ahead */
    s = rt_sampler_new(&p, 4);
    assert_int_equal(draw(s, logits, 4), 3);
    rt_sampler_free(s);
    /* sampled: +100 makes a token all but certain, -100 all but impossible */
    p.temperature = 1.0f;
    p.n_bias = 1;
    p.bias[0] = (rt_sampler_bias){2, 100.0f};
    s = rt_sampler_new(&p, 4);
    for (int i = 0; i < 200; i++)
        assert_int_equal(draw(s, logits, 4), 2);
    rt_sampler_free(s);
    /* a bias outside the vocabulary, or too many, is refused */
    p.bias[0].token = 4;
    assert_null(rt_sampler_new(&p, 4));
    p.bias[0] = (rt_sampler_bias){1, NAN};
    assert_null(rt_sampler_new(&p, 4));
    p.bias[0].bias = 1.0f;
    p.n_bias = RT_SAMPLER_MAX_BIAS + 1;
    assert_null(rt_sampler_new(&p, 4));
}

/* rt_logprobs against the definition, in long double, on random rows of
 * odd sizes with ties, NaN and infinities. */
static void test_logprobs_reference(void **state)
{
    (void)state;
    rng_state = 7;
    float x[333], row[333];
    for (int iter = 0; iter < 600; iter++) {
        int32_t n = 1 + (int32_t)(rnd() % 333);
        /* a third of the rows without NaN or infinities: those take the
         * vector unit's exponentials */
        const bool plain = iter % 3 == 0;
        for (int32_t i = 0; i < n; i++) {
            uint32_t r = plain ? 3 + rnd() % 97 : rnd() % 100;
            x[i] = r < 3    ? NAN
                   : r < 6  ? -INFINITY
                   : r < 20 ? (float)(rnd() % 4)
                            : ((float)(rnd() % 20001) - 10000.0f) / 997.0f;
        }
        if (iter % 50 == 7)
            x[rnd() % (uint32_t)n] = INFINITY;
        int k = (int)(rnd() % 23);
        int32_t chosen = (int32_t)(rnd() % (uint32_t)n);
        rt_token_logprobs lp;
        memcpy(row, x, (size_t)n * sizeof(float)); /* rt_logprobs spends its row */
        rt_logprobs(row, n, chosen, k, &lp);

        float max = -INFINITY;
        for (int32_t i = 0; i < n; i++)
            if (x[i] > max)
                max = x[i];
        if (max == -INFINITY) {
            assert_int_equal(lp.n_top, 0);
            assert_true(lp.logprob == -INFINITY);
            continue;
        }
        long double sum = 0.0L;
        for (int32_t i = 0; i < n; i++)
            sum += x[i] == max                         ? 1.0L
                   : isinf(max) || !(x[i] > -INFINITY) ? 0.0L
                                                       : expl((long double)x[i] - max);
        int want_k = k > RT_MAX_TOP_LOGPROBS ? RT_MAX_TOP_LOGPROBS : k;
        int finite = 0;
        for (int32_t i = 0; i < n; i++)
            finite += x[i] > -INFINITY;
        if (want_k > finite)
            want_k = finite;
        assert_int_equal(lp.n_top, want_k);
        for (int j = 0; j < lp.n_top; j++) {
            int32_t t = lp.top[j];
            assert_true(t >= 0 && t < n && x[t] > -INFINITY);
            if (j > 0) { /* best first, the lower id first on ties */
                int32_t p = lp.top[j - 1];
                assert_true(x[p] > x[t] || (x[p] == x[t] && p < t));
            }
            /* nothing left out beats the last one taken */
            if (j == lp.n_top - 1)
                for (int32_t i = 0; i < n; i++) {
                    bool taken = false;
                    for (int q = 0; q < lp.n_top; q++)
                        taken |= lp.top[q] == i;
                    assert_true(taken || !(x[i] > x[t]));
                }
        }
        for (int j = -1; j < lp.n_top; j++) {
            int32_t t = j < 0 ? chosen : lp.top[j];
            float got = j < 0 ? lp.logprob : lp.top_logprob[j];
            if (!(x[t] > -INFINITY) || (isinf(max) && x[t] != max)) {
                assert_true(got == -INFINITY);
                continue;
            }
            long double want = x[t] == max ? -logl(sum) : (long double)x[t] - max - logl(sum);
            assert_true(fabsl((long double)got - want) <= 1e-5L * (1.0L + fabsl(want)));
        }
    }
    /* k 0: the chosen token's only; an id out of range: -inf */
    float y[] = {1.0f, 2.0f};
    rt_token_logprobs lp;
    rt_logprobs(y, 2, 1, 0, &lp);
    assert_int_equal(lp.n_top, 0);
    assert_true(fabsf(lp.logprob - (float)-log1p(exp(-1.0))) < 1e-6f);
    y[0] = 1.0f, y[1] = 2.0f;
    rt_logprobs(y, 2, 5, 1, &lp);
    assert_true(lp.logprob == -INFINITY);
    assert_int_equal(lp.top[0], 1);
}

static void test_penalties(void **state)
{
    (void)state;
    float logits[] = {2.0f, 1.9f, 0.0f};
    rt_sampler_params p;
    rt_sampler_params_default(&p);
    p.temperature = 0.0f;
    p.presence_penalty = 0.5f;
    rt_sampler *s = rt_sampler_new(&p, 3);
    assert_int_equal(draw(s, logits, 3), 0);
    rt_sampler_accept(s, 0);
    assert_int_equal(draw(s, logits, 3), 1); /* 1.5 < 1.9 */
    float tmp[3] = {2.0f, 1.9f, 0.0f};
    rt_sampler_sample(s, tmp);
    assert_true(fabsf(tmp[0] - 1.5f) < 1e-6f && tmp[1] == 1.9f); /* penalised in place */
    rt_sampler_accept(s, -1);                                    /* out of range: ignored */
    rt_sampler_accept(s, 3);
    rt_sampler_free(s);

    p.presence_penalty = 0.0f;
    p.frequency_penalty = 0.06f;
    s = rt_sampler_new(&p, 3);
    rt_sampler_accept(s, 0);
    assert_int_equal(draw(s, logits, 3), 0); /* 1.94 > 1.9 */
    rt_sampler_accept(s, 0);
    assert_int_equal(draw(s, logits, 3), 1); /* 1.88 < 1.9 */
    rt_sampler_free(s);

    /* a negative presence penalty encourages repeats */
    p.frequency_penalty = 0.0f;
    p.presence_penalty = -0.2f;
    s = rt_sampler_new(&p, 3);
    rt_sampler_accept(s, 1);
    assert_int_equal(draw(s, logits, 3), 1);
    rt_sampler_free(s);
}

/* A sampler resumed from a run's first tokens (token replay) picks what
 * the run picked next: penalties counted, the generator past one draw a
 * token; a greedy one draws nothing to skip. */
static void test_resume(void **state)
{
    (void)state;
    enum { N = 16, STEPS = 40, CUT = 17 };
    float logits[STEPS][N];
    rng_state = 11;
    for (int i = 0; i < STEPS; i++)
        for (int j = 0; j < N; j++)
            logits[i][j] = (float)(rnd() % 1000) / 400.0f;
    for (int greedy = 0; greedy < 2; greedy++) {
        rt_sampler_params p;
        rt_sampler_params_default(&p);
        p.temperature = greedy ? 0.0f : 0.9f;
        p.top_p = 0.95f;
        p.seed = 1234;
        p.frequency_penalty = 0.4f;
        p.presence_penalty = 0.2f;
        rt_sampler *a = rt_sampler_new(&p, N), *b = rt_sampler_new(&p, N);
        int32_t toks[STEPS];
        for (int i = 0; i < STEPS; i++) {
            toks[i] = draw(a, logits[i], N);
            rt_sampler_accept(a, toks[i]);
        }
        rt_sampler_resume(b, toks, CUT);
        for (int i = CUT; i < STEPS; i++) {
            assert_int_equal(draw(b, logits[i], N), toks[i]);
            rt_sampler_accept(b, toks[i]);
        }
        rt_sampler_free(a);
        rt_sampler_free(b);
    }
}

static void test_distribution(void **state)
{
    (void)state;
    float logits[] = {1.0f, 2.0f, 3.0f};
    const float temps[] = {1.0f, 2.0f, 0.5f};
    for (int k = 0; k < 3; k++) {
        double z = 0, p[3];
        for (int i = 0; i < 3; i++)
            z += exp(logits[i] / temps[k]);
        for (int i = 0; i < 3; i++)
            p[i] = exp(logits[i] / temps[k]) / z;
        rt_sampler *s = make(temps[k], 0, 1.0f, 0.0f, 2024 + k, 3);
        int hist[3] = {0};
        for (int i = 0; i < 20000; i++)
            hist[draw(s, logits, 3)]++;
        for (int i = 0; i < 3; i++)
            if (fabs(hist[i] / 20000.0 - p[i]) > 0.02)
                fail_msg("temp %.1f token %d: %.4f vs softmax %.4f", temps[k], i, hist[i] / 20000.0, p[i]);
        rt_sampler_free(s);
    }
}

/* A vocabulary long enough for the vector softmax (and a tail after it),
 * with NaN and -inf tokens among the rest: the draws follow the softmax
 * and never pick a masked token. */
static void test_distribution_vector(void **state)
{
    (void)state;
    enum { N = 37 };
    float logits[N];
    for (int i = 0; i < N; i++)
        logits[i] = (float)(i % 5) * 0.5f;
    logits[3] = NAN;
    logits[10] = -INFINITY;
    double p[N], z = 0;
    for (int i = 0; i < N; i++)
        z += p[i] = (i == 3 || i == 10) ? 0.0 : exp(logits[i] / 0.8);
    rt_sampler *s = make(0.8f, 0, 1.0f, 0.0f, 77, N);
    int hist[N] = {0};
    enum { DRAWS = 40000 };
    for (int d = 0; d < DRAWS; d++) {
        float tmp[N];
        memcpy(tmp, logits, sizeof(tmp));
        hist[rt_sampler_sample(s, tmp)]++;
    }
    assert_int_equal(hist[3], 0);
    assert_int_equal(hist[10], 0);
    for (int i = 0; i < N; i++)
        if (fabs(hist[i] / (double)DRAWS - p[i] / z) > 0.006)
            fail_msg("token %d: %.4f vs softmax %.4f", i, hist[i] / (double)DRAWS, p[i] / z);
    rt_sampler_free(s);
}

static int cmp_desc(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x > y ? -1 : x < y ? 1 : 0;
}

/* On a large vocabulary every draw lies in the nucleus / top-k that a full
 * sort computes. */
static void test_large_vocab(void **state)
{
    (void)state;
    int32_t n = 50000;
    float *logits = malloc((size_t)n * sizeof(float)), *tmp = malloc((size_t)n * sizeof(float));
    float *sorted = malloc((size_t)n * sizeof(float));
    rng_state = 5;
    for (int32_t i = 0; i < n; i++)
        logits[i] = (float)(rnd() % 100000) / 10000.0f; /* flat-ish: the nucleus is thousands wide */
    memcpy(sorted, logits, (size_t)n * sizeof(float));
    qsort(sorted, (size_t)n, sizeof(float), cmp_desc);
    double z = 0;
    for (int32_t i = 0; i < n; i++)
        z += exp(sorted[i] - sorted[0]);
    double cum = 0;
    float cut = sorted[n - 1];
    for (int32_t i = 0; i < n; i++) {
        cum += exp(sorted[i] - sorted[0]) / z;
        if (cum >= 0.9) {
            cut = sorted[i];
            break;
        }
    }
    rt_sampler *s = make(1.0f, 0, 0.9f, 0.0f, 77, n);
    rt_sampler *k = make(1.0f, 40, 1.0f, 0.0f, 78, n);
    int distinct = 0;
    char *seen = calloc((size_t)n, 1);
    for (int it = 0; it < 300; it++) {
        memcpy(tmp, logits, (size_t)n * sizeof(float));
        int32_t t = rt_sampler_sample(s, tmp);
        assert_true(t >= 0 && t < n && logits[t] >= cut);
        distinct += !seen[t];
        seen[t] = 1;
        memcpy(tmp, logits, (size_t)n * sizeof(float));
        t = rt_sampler_sample(k, tmp);
        assert_true(t >= 0 && t < n && logits[t] >= sorted[39]);
    }
    assert_true(distinct > 100);
    free(seen);
    rt_sampler_free(s);
    rt_sampler_free(k);
    free(logits);
    free(tmp);
    free(sorted);
}

/* ---- stop strings ---- */

typedef struct collected {
    char buf[4096];
    size_t n;
} collected;

static void take(rt_stop *s, bool final, collected *c)
{
    size_t n;
    const char *p = rt_stop_take(s, final, &n);
    assert_true(c->n + n <= sizeof(c->buf));
    memcpy(c->buf + c->n, p, n);
    c->n += n;
}

static void expect_take(rt_stop *s, bool final, const char *want)
{
    size_t n;
    const char *p = rt_stop_take(s, final, &n);
    if (n != strlen(want) || memcmp(p, want, n) != 0)
        fail_msg("took '%.*s', want '%s'", (int)n, p, want);
}

static void test_stop_basic(void **state)
{
    (void)state;
    const char *one[] = {"END"};
    rt_stop *s = rt_stop_new(one, 1);
    assert_false(rt_stop_feed(s, "hello E", 7));
    expect_take(s, false, "hello ");
    assert_false(rt_stop_feed(s, "N", 1));
    expect_take(s, false, "");
    assert_int_equal(rt_stop_tail_len(s), 0);
    assert_true(rt_stop_feed(s, "D more", 6));
    expect_take(s, true, "");
    assert_int_equal(rt_stop_tail_len(s), 8); /* "END more": fed from the match on */
    assert_true(rt_stop_feed(s, "x", 1)); /* stays stopped */
    assert_int_equal(rt_stop_tail_len(s), 8);
    rt_stop_free(s);

    /* a false alarm is released once it cannot match any more */
    const char *abc[] = {"abc"};
    s = rt_stop_new(abc, 1);
    assert_false(rt_stop_feed(s, "xab", 3));
    expect_take(s, false, "x");
    assert_false(rt_stop_feed(s, "d", 1));
    expect_take(s, false, "abd");
    assert_false(rt_stop_feed(s, "ab", 2));
    expect_take(s, false, "");
    expect_take(s, true, "ab"); /* end of generation releases the prefix */
    rt_stop_free(s);

    /* several stops, one spanning three chunks */
    const char *two[] = {"###", "\n\nUser:"};
    s = rt_stop_new(two, 2);
    assert_false(rt_stop_feed(s, "Hi\n\nUs", 6));
    expect_take(s, false, "Hi");
    assert_false(rt_stop_feed(s, "er", 2));
    expect_take(s, false, "");
    assert_true(rt_stop_feed(s, ":", 1));
    expect_take(s, true, "");
    assert_int_equal(rt_stop_tail_len(s), 7);
    rt_stop_free(s);

    /* the earliest match wins, whichever string it is */
    const char *overlap[] = {"bc", "abcd"};
    s = rt_stop_new(overlap, 2);
    assert_true(rt_stop_feed(s, "xabcd", 5));
    expect_take(s, false, "x");
    assert_int_equal(rt_stop_tail_len(s), 4);
    rt_stop_free(s);
    s = rt_stop_new(overlap, 2);
    assert_true(rt_stop_feed(s, "xabc", 4)); /* "bc" is complete, "abcd" is not yet */
    expect_take(s, true, "xa");
    rt_stop_free(s);

    /* the match can start in text fed long before */
    const char *lng[] = {"0123456789"};
    s = rt_stop_new(lng, 1);
    collected c = {.n = 0};
    const char *chunks[] = {"x0", "12", "34", "567", "8", "9tail"};
    bool stopped = false;
    for (int i = 0; i < 6 && !stopped; i++) {
        stopped = rt_stop_feed(s, chunks[i], strlen(chunks[i]));
        take(s, false, &c);
    }
    assert_true(stopped);
    assert_int_equal(c.n, 1);
    assert_int_equal(c.buf[0], 'x');
    rt_stop_free(s);

    const char *many[17] = {"a", "b", "c", "d", "e", "f", "g", "h", "i",
                            "j", "k", "l", "m", "n", "o", "p", "q"};
    assert_null(rt_stop_new(many, 17));
    const char *empty[] = {"", "zz"};
    s = rt_stop_new(empty, 2); /* an empty stop string is ignored */
    assert_false(rt_stop_feed(s, "abc", 3));
    expect_take(s, false, "abc");
    rt_stop_free(s);
    s = rt_stop_new(NULL, 0);
    assert_false(rt_stop_feed(s, "abc", 3));
    expect_take(s, false, "abc");
    assert_int_equal(rt_stop_error(s), 0);
    rt_stop_free(s);
}

static void test_stop_utf8(void **state)
{
    (void)state;
    rt_stop *s = rt_stop_new(NULL, 0);
    assert_false(rt_stop_feed(s, "h\xc3", 2));
    expect_take(s, false, "h");
    assert_false(rt_stop_feed(s, "\xa9", 1));
    expect_take(s, false, "\xc3\xa9");
    const char *emoji = "\xf0\x9f\x98\x80";
    for (int i = 0; i < 3; i++) {
        assert_false(rt_stop_feed(s, emoji + i, 1));
        expect_take(s, false, "");
    }
    assert_false(rt_stop_feed(s, emoji + 3, 1));
    expect_take(s, false, emoji);
    /* stray continuation bytes never become valid: not held */
    assert_false(rt_stop_feed(s, "a\x80\x80", 3));
    expect_take(s, false, "a\x80\x80");
    /* a truncated sequence at the very end goes out with final */
    assert_false(rt_stop_feed(s, "\xe2\x82", 2));
    expect_take(s, false, "");
    expect_take(s, true, "\xe2\x82");
    rt_stop_free(s);

    /* hold-back of a stop prefix and of a partial character together */
    const char *st[] = {"\xc3\xa9!"};
    s = rt_stop_new(st, 1);
    assert_false(rt_stop_feed(s, "caf\xc3", 4));
    expect_take(s, false, "caf");
    assert_false(rt_stop_feed(s, "\xa9", 1));
    expect_take(s, false, "");
    assert_true(rt_stop_feed(s, "!", 1));
    expect_take(s, true, "");
    rt_stop_free(s);

    /* random valid UTF-8 in random chunks: every chunk is valid UTF-8 */
    rng_state = 11;
    static const char *chars[] = {"a", " ", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "\n"};
    for (int iter = 0; iter < 200; iter++) {
        char text[512];
        size_t n = 0;
        while (n < 400) {
            const char *ch = chars[rnd() % 6];
            memcpy(text + n, ch, strlen(ch));
            n += strlen(ch);
        }
        const char *stops[] = {"\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac"};
        s = rt_stop_new(stops, 1);
        collected c = {.n = 0};
        for (size_t off = 0; off < n;) {
            size_t k = 1 + rnd() % 7;
            if (k > n - off)
                k = n - off;
            bool stop = rt_stop_feed(s, text + off, k);
            off += k;
            size_t before = c.n;
            take(s, stop, &c);
            /* each chunk decodes as whole characters */
            for (size_t i = before; i < c.n;) {
                uint8_t b = (uint8_t)c.buf[i];
                size_t l = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
                assert_true(i + l <= c.n);
                i += l;
            }
            if (stop)
                break;
        }
        take(s, true, &c);
        const char *hit = memmem(text, n, stops[0], strlen(stops[0]));
        size_t want = hit ? (size_t)(hit - text) : n;
        assert_int_equal(c.n, want);
        assert_memory_equal(c.buf, text, want);
        rt_stop_free(s);
    }
}

/* Earliest occurrence of any stop in text[0..n), or n. */
static size_t first_stop(const char *text, size_t n, const char *const *stops, int ns)
{
    size_t at = n;
    for (int i = 0; i < ns; i++) {
        const char *hit = memmem(text, n, stops[i], strlen(stops[i]));
        if (hit && (size_t)(hit - text) < at)
            at = (size_t)(hit - text);
    }
    return at;
}

/* Random text and stops over {a, b, c}, random chunking. Generation ends at
 * the first chunk after which some stop occurs (a stop that completes first
 * wins over one that starts earlier but would complete later), and the
 * output is the text before the earliest occurrence at that moment. Between
 * chunks exactly the longest suffix that could still start a stop is held. */
static void test_stop_reference(void **state)
{
    (void)state;
    rng_state = 2023;
    for (int iter = 0; iter < 2000; iter++) {
        char stops_buf[4][8];
        const char *stops[4];
        int ns = 1 + (int)(rnd() % 4);
        for (int i = 0; i < ns; i++) {
            int l = 1 + (int)(rnd() % 5);
            for (int k = 0; k < l; k++)
                stops_buf[i][k] = "abc"[rnd() % 3];
            stops_buf[i][l] = '\0';
            stops[i] = stops_buf[i];
        }
        char text[64];
        size_t n = rnd() % sizeof(text);
        for (size_t i = 0; i < n; i++)
            text[i] = "abc"[rnd() % 3];
        rt_stop *s = rt_stop_new(stops, ns);
        collected c = {.n = 0};
        bool stop = false;
        size_t want = n;
        for (size_t off = 0; off < n && !stop;) {
            size_t k = 1 + rnd() % 6;
            if (k > n - off)
                k = n - off;
            stop = rt_stop_feed(s, text + off, k);
            off += k;
            size_t at = first_stop(text, off, stops, ns);
            assert_int_equal(stop, at < off);
            if (stop)
                want = at;
            take(s, false, &c);
            if (!stop) {
                size_t held = off - c.n, best = 0;
                for (size_t h = 1; h <= off; h++)
                    for (int i = 0; i < ns; i++)
                        if (strlen(stops[i]) > h && memcmp(text + off - h, stops[i], h) == 0)
                            best = h;
                assert_int_equal(held, best);
            }
        }
        take(s, true, &c);
        assert_int_equal(c.n, want);
        assert_memory_equal(c.buf, text, want);
        rt_stop_free(s);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_and_greedy),
        cmocka_unit_test(test_resume),
        cmocka_unit_test(test_seeds),
        cmocka_unit_test(test_filters),
        cmocka_unit_test(test_nucleus_ties),
        cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_logprobs_reference),
        cmocka_unit_test(test_distribution),
        cmocka_unit_test(test_distribution_vector),
        cmocka_unit_test(test_large_vocab),
        cmocka_unit_test(test_stop_basic),
        cmocka_unit_test(test_stop_utf8),
        cmocka_unit_test(test_stop_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
