/* Sampler: picks the next token from logits (penalties, greedy, top-k,
 * temperature softmax, top-p, min-p, seeded draw), and the stop-string
 * matcher that decides how much streamed text may leave the worker.
 *
 * Sampling runs once per generated token per sequence, so it never
 * allocates: every buffer is sized for the vocabulary in rt_sampler_new.
 * Ties always go to the lower token id, which keeps the result a function of
 * (seed, logits) alone, independent of sort stability or platform. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kn.h"
#include "runtime/sampler.h"

typedef struct cand {
    float v; /* logit, then probability */
    int32_t id;
} cand;

struct rt_sampler {
    rt_sampler_params p;
    int32_t n_vocab;
    uint32_t *count; /* times each token was generated */
    int32_t *seen;   /* tokens with count > 0, for penalties in O(seen) */
    int32_t n_seen;
    cand *c;
    uint64_t rng[4]; /* xoshiro256** */
    void (*softmax)(float *x, int n); /* the CPU table's, on the vector unit */
    float least;                      /* scaled logits below it (against the best) get probability 0 */
};

/* ---- PRNG: xoshiro256** seeded through splitmix64 (Blackman & Vigna) ---- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t rng_next(uint64_t s[4])
{
    uint64_t r = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t s[4])
{
    return (double)(rng_next(s) >> 11) * 0x1.0p-53;
}

/* ---- sampler ---- */

void rt_sampler_params_default(rt_sampler_params *p)
{
    memset(p, 0, sizeof(*p));
    p->temperature = 1.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
}

bool rt_sampler_params_ok(const rt_sampler_params *p, int32_t n_vocab)
{
    if (p->n_bias < 0 || p->n_bias > RT_SAMPLER_MAX_BIAS)
        return false;
    for (int i = 0; i < p->n_bias; i++)
        if (p->bias[i].token < 0 || p->bias[i].token >= n_vocab || !isfinite(p->bias[i].bias))
            return false;
    return true;
}

rt_sampler *rt_sampler_new(const rt_sampler_params *p, int32_t n_vocab)
{
    if (n_vocab <= 0)
        return NULL;
    rt_sampler *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    if (p)
        s->p = *p;
    else
        rt_sampler_params_default(&s->p);
    /* NaN and negative knobs mean "off" (or greedy), never undefined behaviour */
    if (!(s->p.temperature > 0.0f))
        s->p.temperature = 0.0f;
    if (s->p.top_k < 0)
        s->p.top_k = 0;
    if (isnan(s->p.top_p))
        s->p.top_p = 1.0f;
    if (!(s->p.min_p > 0.0f))
        s->p.min_p = 0.0f;
    if (!isfinite(s->p.presence_penalty))
        s->p.presence_penalty = 0.0f;
    if (!isfinite(s->p.frequency_penalty))
        s->p.frequency_penalty = 0.0f;
    if (!rt_sampler_params_ok(&s->p, n_vocab)) {
        free(s);
        return NULL;
    }
    s->n_vocab = n_vocab;
    s->softmax = kn_ops_best()->softmax;
    /* A probability e^z / S (z <= 0 against the best, 1 <= S <= n_vocab)
     * stays a normal float, above e^-87.3, for z >= ln n_vocab - 87.3.
     * Below that it would be a subnormal, and without flush-to-zero each one
     * costs a microcode assist wherever it is made or read: logits spread
     * over 100 units (a low temperature) took 3.5x the time of a flat row.
     * The tokens given 0 here are e^-75 (32000 tokens) less likely than the
     * best. */
    s->least = logf((float)n_vocab) - 86.0f;
    s->count = calloc((size_t)n_vocab, sizeof(uint32_t));
    s->seen = malloc((size_t)n_vocab * sizeof(int32_t));
    s->c = malloc((size_t)n_vocab * sizeof(cand));
    if (!s->count || !s->seen || !s->c) {
        rt_sampler_free(s);
        return NULL;
    }
    uint64_t x = s->p.seed;
    for (int i = 0; i < 4; i++)
        s->rng[i] = splitmix64(&x);
    return s;
}

void rt_sampler_free(rt_sampler *s)
{
    if (!s)
        return;
    free(s->c);
    free(s->seen);
    free(s->count);
    free(s);
}

void rt_sampler_accept(rt_sampler *s, int32_t tok)
{
    if (tok < 0 || tok >= s->n_vocab)
        return;
    if (s->count[tok] == 0)
        s->seen[s->n_seen++] = tok;
    if (s->count[tok] < UINT32_MAX)
        s->count[tok]++;
}

/* Whether a pick draws from the generator: the greedy cases of
 * rt_sampler_sample do not. */
static bool draws(const rt_sampler_params *p)
{
    const float inv_t = 1.0f / p->temperature;
    return !(p->temperature == 0.0f || p->top_k == 1 || p->top_p <= 0.0f || !isfinite(inv_t));
}

void rt_sampler_resume(rt_sampler *s, const int32_t *toks, int n)
{
    for (int i = 0; i < n; i++) {
        rt_sampler_accept(s, toks[i]);
        if (draws(&s->p))
            (void)rng_next(s->rng);
    }
}

/* Total order: higher value first, then lower id. Without branches: in a
 * partition the order of probabilities is a coin toss per token, and a
 * mispredicted branch per token cost more than the rest of the loop. */
static inline bool cand_before(const cand *a, const cand *b)
{
    return (a->v > b->v) | ((a->v == b->v) & (a->id < b->id));
}

static inline void cand_swap(cand *a, cand *b)
{
    cand t = *a;
    *a = *b;
    *b = t;
}

/* In-place sorts, best first. glibc's qsort may malloc a merge buffer, and
 * sampling must not allocate. */
static void cand_sift(cand *a, size_t i, size_t n)
{
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        /* the root holds the worst, so extraction leaves the best in front */
        if (c + 1 < n && cand_before(&a[c], &a[c + 1]))
            c++;
        if (!cand_before(&a[i], &a[c]))
            break;
        cand_swap(&a[i], &a[c]);
        i = c;
    }
}

static void cand_heapsort(cand *a, size_t n)
{
    for (size_t i = n / 2; i-- > 0;)
        cand_sift(a, i, n);
    for (size_t end = n; end > 1; end--) {
        cand_swap(&a[0], &a[end - 1]);
        cand_sift(a, 0, end - 1);
    }
}

/* Median of a[lo], a[mid], a[hi - 1], left at a[hi - 1]. */
static void cand_median_last(cand *a, size_t lo, size_t hi)
{
    size_t mid = lo + (hi - lo) / 2, last = hi - 1;
    if (cand_before(&a[mid], &a[lo]))
        cand_swap(&a[mid], &a[lo]);
    if (cand_before(&a[last], &a[lo]))
        cand_swap(&a[last], &a[lo]);
    if (cand_before(&a[mid], &a[last]))
        cand_swap(&a[mid], &a[last]);
}

/* Lomuto partition around a[hi - 1]; returns the pivot's final place and
 * puts the mass (sum of v) of what went before it in *mass. Every element
 * is swapped, so the loop has no branch on the data: when x does not go
 * before the pivot, both places it touches are at or past store, where
 * such elements belong. */
static size_t cand_partition(cand *a, size_t lo, size_t hi, double *mass)
{
    const size_t last = hi - 1;
    const cand pivot = a[last];
    size_t store = lo;
    double sum = 0.0;
    for (size_t i = lo; i < last; i++) {
        const cand x = a[i];
        const bool before = cand_before(&x, &pivot);
        a[i] = a[store];
        a[store] = x;
        store += before;
        sum += before ? (double)x.v : 0.0;
    }
    cand_swap(&a[store], &a[last]);
    *mass = sum;
    return store;
}

static void cand_sort(cand *a, size_t n)
{
    size_t lo = 0, hi = n;
    for (int depth = 0; hi - lo > 16; depth++) {
        if (depth == 48) {
            cand_heapsort(a + lo, hi - lo);
            return;
        }
        cand_median_last(a, lo, hi);
        double mass;
        size_t p = cand_partition(a, lo, hi, &mass);
        /* recurse into the smaller side, loop on the larger: stack O(log n) */
        if (p - lo < hi - p - 1) {
            cand_sort(a + lo, p - lo);
            lo = p + 1;
        } else {
            cand_sort(a + p + 1, hi - p - 1);
            hi = p;
        }
    }
    for (size_t i = lo + 1; i < hi; i++)
        for (size_t j = i; j > lo && cand_before(&a[j], &a[j - 1]); j--)
            cand_swap(&a[j], &a[j - 1]);
}

/* Moves the k best of a[0..n) to a[0..k), in no particular order.
 * Quickselect with a median-of-three pivot; after too many rounds (inputs
 * built to defeat the pivot) it sorts what is left, so O(n log n) at worst. */
static void select_top(cand *a, size_t n, size_t k)
{
    size_t lo = 0, hi = n;
    for (int round = 0; hi - lo > 1; round++) {
        if (round == 64) {
            cand_heapsort(a + lo, hi - lo);
            return;
        }
        cand_median_last(a, lo, hi);
        double mass;
        size_t store = cand_partition(a, lo, hi, &mass);
        if (store == k || store + 1 == k)
            return;
        if (store > k)
            hi = store;
        else
            lo = store + 1;
    }
}

/* The nucleus of a[0..n) (v: probabilities) moved to a[0..k), in no
 * particular order; returns k. It is the shortest run of the best (in
 * cand_before's order) whose mass reaches target, or all n. Quickselect on
 * mass: whatever lies before a pivot is either all in the nucleus or holds
 * its end, so O(n) where sorting as far as the nucleus reaches took ~1.6 ms
 * a row of 32000 flat logits. */
static size_t select_mass(cand *a, size_t n, double target)
{
    size_t lo = 0, hi = n;
    double acc = 0.0; /* mass of a[0..lo), all of it in the nucleus */
    for (int round = 0; hi - lo > 16 && round < 64; round++) {
        cand_median_last(a, lo, hi);
        double left;
        const size_t p = cand_partition(a, lo, hi, &left);
        if (acc + left >= target) {
            hi = p; /* the nucleus ends before the pivot */
            continue;
        }
        acc += left;
        if (acc + a[p].v >= target)
            return p + 1;
        acc += a[p].v;
        lo = p + 1;
    }
    cand_sort(a + lo, hi - lo);
    for (size_t i = lo; i < hi; i++) {
        acc += a[i].v;
        if (acc >= target)
            return i + 1;
    }
    /* rounding: a[0..hi) summed in another order fell short by an ulp */
    return hi;
}

/* Candidates for a nucleus of the given mass out of n probabilities, into
 * c; returns how many. A float's exponent sorts it into one of 128 powers
 * of two (all of [0, 1]); the candidates are the tokens in the fewest top
 * powers whose mass reaches target, and one power below, so that a sum
 * rounded differently here than in select_mass still leaves the whole
 * nucleus among them. A peaked distribution keeps a handful of 32000. */
static size_t heavy_tokens(const float *prob, int32_t n, double target, cand *c)
{
    enum { POWERS = 128, CHAINS = 4 };
    double mass[CHAINS][POWERS] = {{0.0}};
    for (int32_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &prob[i], sizeof(bits));
        uint32_t e = bits >> 23; /* probabilities are >= 0: no sign bit */
        e = e < POWERS ? e : POWERS - 1;
        /* four tables: consecutive tokens of one power would otherwise wait
         * on each other's load and store of the same sum */
        mass[i & (CHAINS - 1)][e] += prob[i];
    }
    int lowest = 0;
    double acc = 0.0;
    for (int e = POWERS - 1; e >= 0; e--) {
        for (int k = 0; k < CHAINS; k++)
            acc += mass[k][e];
        if (acc >= target) {
            lowest = e > 0 ? e - 1 : 0;
            break;
        }
    }
    size_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &prob[i], sizeof(bits));
        c[m] = (cand){prob[i], i};
        m += (bits >> 23) >= (uint32_t)lowest;
    }
    return m;
}

/* The largest of x[0..n), NaN never counting; -inf if there is none. In
 * four chains held in registers: one chain of dependent compares took ~1 ns
 * a token, an array of four indexed by i & 3 lived on the stack. */
static float max_logit(const float *x, int32_t n)
{
    float m0 = -INFINITY, m1 = -INFINITY, m2 = -INFINITY, m3 = -INFINITY;
    int32_t i = 0;
    for (; i + 4 <= n; i += 4) {
        m0 = x[i] > m0 ? x[i] : m0;
        m1 = x[i + 1] > m1 ? x[i + 1] : m1;
        m2 = x[i + 2] > m2 ? x[i + 2] : m2;
        m3 = x[i + 3] > m3 ? x[i + 3] : m3;
    }
    for (; i < n; i++)
        m0 = x[i] > m0 ? x[i] : m0;
    return fmaxf(fmaxf(m0, m1), fmaxf(m2, m3));
}

/* Sum of x[0..n) in double, four chains as max_logit. */
static double sum_probs(const float *x, int32_t n)
{
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    int32_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += x[i];
        s1 += x[i + 1];
        s2 += x[i + 2];
        s3 += x[i + 3];
    }
    for (; i < n; i++)
        s0 += x[i];
    return (s0 + s1) + (s2 + s3);
}

/* The first token with the largest logit (NaN never compares greater; all
 * NaN or -inf: token 0). */
static int32_t argmax(const float *logits, int32_t n)
{
    const float max = max_logit(logits, n);
    if (max == -INFINITY)
        return 0;
    for (int32_t i = 0; i < n; i++)
        if (logits[i] == max)
            return i;
    return 0;
}

/* x[0..n) becomes the probabilities of a draw at temperature 1 / inv_t:
 * the exponentials on the vector unit (the CPU table's softmax), where
 * expf, a division and chains of dependent maxima and sums took ~5 ns a
 * token, 32000 of them at every step of every sequence. NaN counts as
 * -inf. Returns the probabilities' sum. */
static double probabilities(rt_sampler *s, float *x, int32_t n, float inv_t)
{
    const float max = max_logit(x, n);
    if (isinf(max)) {
        /* an infinite maximum makes the tokens that reach it equally likely */
        for (int32_t i = 0; i < n; i++)
            x[i] = x[i] == max || (isnan(x[i]) && max == -INFINITY) ? 1.0f : 0.0f;
    } else {
        const float least = s->least; /* a local: x must not be seen to alias it */
        for (int32_t i = 0; i < n; i++) {
            const float z = (x[i] - max) * inv_t;
            x[i] = z >= least ? z : -INFINITY; /* NaN too */
        }
        s->softmax(x, n);
    }
    return sum_probs(x, n);
}

/* The token that u, in [0, sum of p), falls on: the first whose running sum
 * passes u. Blocks of 16 are summed first and only the one u lands in is
 * walked, where a walk token by token, a compare and a dependent add each,
 * was half the time of a draw from 32000 tokens at top_p 1. The blocks'
 * sums round differently from the running one, so a walk that falls short
 * goes on into the next block. Rounding that leaves u at the very top gives
 * the last token with a probability (0 where none has one). */
static int32_t draw_index(const float *p, int32_t n, double u)
{
    enum { BLOCK = 16 };
    double cum = 0.0;
    int32_t i = 0, last_block = -1;
    for (; i + BLOCK <= n; i += BLOCK) {
        const double b = sum_probs(p + i, BLOCK);
        if (cum + b > u)
            break;
        cum += b;
        last_block = b > 0.0 ? i : last_block;
    }
    int32_t last = -1;
    for (; i < n; i++) {
        if (p[i] <= 0.0f)
            continue;
        cum += p[i];
        last = i;
        if (u < cum)
            return i;
    }
    if (last < 0 && last_block >= 0)
        for (int32_t j = last_block; j < last_block + BLOCK; j++)
            last = p[j] > 0.0f ? j : last;
    return last < 0 ? 0 : last;
}

int32_t rt_sampler_sample(rt_sampler *s, float *logits)
{
    const rt_sampler_params *p = &s->p;
    int32_t n = s->n_vocab;

    for (int i = 0; i < p->n_bias; i++)
        logits[p->bias[i].token] += p->bias[i].bias;
    if (p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f)
        for (int32_t i = 0; i < s->n_seen; i++) {
            int32_t t = s->seen[i];
            logits[t] -= (float)s->count[t] * p->frequency_penalty + p->presence_penalty;
        }
    /* a temperature too small to divide by is the greedy limit */
    const float inv_t = 1.0f / p->temperature;
    if (!draws(p))
        return argmax(logits, n);

    /* logits is ours to change: it holds the probabilities as they are
     * computed, of every token or of the top_k best */
    cand *c = s->c;
    size_t m = (size_t)n;
    double sum;
    if (p->top_k > 0 && p->top_k < n) {
        for (int32_t i = 0; i < n; i++)
            c[i] = (cand){isnan(logits[i]) ? -INFINITY : logits[i], i};
        select_top(c, m, (size_t)p->top_k);
        m = (size_t)p->top_k;
        for (size_t i = 0; i < m; i++)
            logits[i] = c[i].v;
        sum = probabilities(s, logits, (int32_t)m, inv_t);
        for (size_t i = 0; i < m; i++)
            c[i].v = logits[i];
    } else {
        sum = probabilities(s, logits, n, inv_t);
        if (p->top_p >= 1.0f && p->min_p <= 0.0f) /* the OpenAI defaults */
            return draw_index(logits, n, rng_uniform(s->rng) * sum);
        if (p->top_p < 1.0f) {
            m = heavy_tokens(logits, n, (double)p->top_p * sum, c);
        } else {
            for (int32_t i = 0; i < n; i++)
                c[i] = (cand){logits[i], i};
        }
    }

    if (p->top_p < 1.0f)
        m = select_mass(c, m, (double)p->top_p * sum);

    if (p->min_p > 0.0f) {
        float pmax = 0.0f;
        size_t imax = 0;
        for (size_t i = 0; i < m; i++)
            if (c[i].v > pmax || (c[i].v == pmax && c[i].id < c[imax].id)) {
                pmax = c[i].v;
                imax = i;
            }
        float thr = p->min_p * pmax;
        if (thr > pmax) { /* min_p above 1: only the best survives */
            c[0] = c[imax];
            m = 1;
        } else {
            size_t k = 0;
            for (size_t i = 0; i < m; i++)
                if (c[i].v >= thr)
                    c[k++] = c[i];
            m = k;
        }
    }

    /* the survivors' probabilities, in their order, where draw_index walks them */
    for (size_t i = 0; i < m; i++)
        logits[i] = c[i].v;
    return c[draw_index(logits, (int32_t)m, rng_uniform(s->rng) * sum_probs(logits, (int32_t)m))].id;
}

/* ---- log-probabilities ---- */

/* x's log-probability given the row's max and log sum exp(x - max). */
static float logprob_of(float x, float max, double lse)
{
    if (x == max)
        return (float)-lse;
    if (isinf(max) || !(x > -INFINITY))
        return -INFINITY;
    return (float)((double)x - (double)max - lse);
}

/* Log-probabilities take one scalar pass over the row (the likeliest
 * tokens, the max among them, NaN made -inf), then the sum
 * of exponentials: where the max is finite, the CPU table's softmax takes
 * them on the vector unit, in place (the value at the max becomes e^0 /
 * sum). In scalar double they took 0.17 ms for a
 * vocabulary of 32000, per token of each request that asks, on the step
 * every other request waits for. */
void rt_logprobs(float *logits, int32_t n, int32_t chosen, int k, rt_token_logprobs *out)
{
    k = k < 0 ? 0 : k > RT_MAX_TOP_LOGPROBS ? RT_MAX_TOP_LOGPROBS : k;
    out->n_top = 0;
    out->logprob = -INFINITY;
    /* the kk best by insertion, at least one: the first holds the max. A
     * value must beat thr, the last kept once there are kk; after the
     * first few tokens almost every one fails that one compare (as NaN and
     * -inf always do: NaN is then made -inf, in the row that is spent
     * anyway, which the softmax below takes as no mass). */
    const int kk = k > 0 ? k : 1;
    int32_t top[RT_MAX_TOP_LOGPROBS];
    int m = 0;
    float thr = -INFINITY;
    for (int32_t i = 0; i < n; i++) {
        const float v = logits[i];
        if (v <= thr)
            continue;
        if (!(v > thr)) {
            logits[i] = -INFINITY;
            continue;
        }
        int j = m < kk ? m++ : kk - 1;
        while (j > 0 && v > logits[top[j - 1]]) {
            top[j] = top[j - 1];
            j--;
        }
        top[j] = i;
        if (m == kk)
            thr = logits[top[kk - 1]];
    }
    if (m == 0)
        return; /* no token has a chance: nothing is known */
    const float max = logits[top[0]];
    /* the logits reported, before the row is spent */
    if (m > k)
        m = k;
    for (int j = 0; j < m; j++) {
        out->top[j] = top[j];
        out->top_logprob[j] = logits[top[j]];
    }
    const float x_chosen = chosen >= 0 && chosen < n ? logits[chosen] : -INFINITY;
    double lse;
    if (!isinf(max)) {
        kn_ops_best()->softmax(logits, (int)n);
        lse = -log((double)logits[top[0]]);
    } else { /* an infinite max shares the mass among the tokens that reach it */
        int32_t at_max = 0;
        for (int32_t i = 0; i < n; i++)
            at_max += logits[i] == max;
        lse = log((double)at_max);
    }
    out->logprob = logprob_of(x_chosen, max, lse);
    for (int j = 0; j < m; j++)
        out->top_logprob[j] = logprob_of(out->top_logprob[j], max, lse);
    out->n_top = m;
}

/* ---- stop strings ---- */

#define RT_STOP_MAX 16

struct rt_stop {
    char *stop[RT_STOP_MAX];
    size_t stop_len[RT_STOP_MAX];
    int n;
    size_t max_len;
    char *buf;
    size_t len, cap;
    size_t emitted; /* bytes of buf already handed out by take */
    size_t end;     /* after a match: where the output ends */
    bool matched;
    int err;
};

rt_stop *rt_stop_new(const char *const *stops, int n)
{
    if (n < 0 || n > RT_STOP_MAX || (n > 0 && !stops))
        return NULL;
    rt_stop *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    for (int i = 0; i < n; i++) {
        size_t l = stops[i] ? strlen(stops[i]) : 0;
        if (l == 0)
            continue; /* an empty stop string would end every generation at once */
        s->stop[s->n] = malloc(l);
        if (!s->stop[s->n]) {
            rt_stop_free(s);
            return NULL;
        }
        memcpy(s->stop[s->n], stops[i], l);
        s->stop_len[s->n++] = l;
        if (l > s->max_len)
            s->max_len = l;
    }
    return s;
}

void rt_stop_free(rt_stop *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n; i++)
        free(s->stop[i]);
    free(s->buf);
    free(s);
}

int rt_stop_error(const rt_stop *s)
{
    return s->err;
}

size_t rt_stop_tail_len(const rt_stop *s)
{
    return s->matched && !s->err ? s->len - s->end : 0;
}

/* First occurrence of needle in hay[from..n), or SIZE_MAX. */
static size_t find_from(const char *hay, size_t n, size_t from, const char *needle, size_t nl)
{
    while (from + nl <= n) {
        const char *p = memchr(hay + from, needle[0], n - nl + 1 - from);
        if (!p)
            return SIZE_MAX;
        size_t at = (size_t)(p - hay);
        if (memcmp(p, needle, nl) == 0)
            return at;
        from = at + 1;
    }
    return SIZE_MAX;
}

bool rt_stop_feed(rt_stop *s, const char *bytes, size_t n)
{
    if (s->matched)
        return true;
    if (s->emitted) {
        /* take()'s pointer is only valid until this call: drop what it gave out */
        memmove(s->buf, s->buf + s->emitted, s->len - s->emitted);
        s->len -= s->emitted;
        s->emitted = 0;
    }
    if (n > s->cap - s->len) {
        size_t cap = s->cap ? s->cap : 256;
        while (cap - s->len < n) {
            if (cap > SIZE_MAX / 2) {
                cap = 0;
                break;
            }
            cap *= 2;
        }
        char *b = cap ? realloc(s->buf, cap) : NULL;
        if (!b) {
            /* out of memory: end the generation with the text we have */
            s->err = -ENOMEM;
            s->matched = true;
            s->end = s->len;
            return true;
        }
        s->buf = b;
        s->cap = cap;
    }
    size_t old = s->len;
    if (n)
        memcpy(s->buf + s->len, bytes, n);
    s->len += n;
    if (s->n == 0)
        return false;
    /* only an occurrence that ends in the new bytes can be new */
    size_t from = old >= s->max_len - 1 ? old - (s->max_len - 1) : 0;
    size_t best = SIZE_MAX;
    for (int i = 0; i < s->n; i++) {
        size_t at = find_from(s->buf, s->len, from, s->stop[i], s->stop_len[i]);
        if (at < best)
            best = at;
    }
    if (best == SIZE_MAX)
        return false;
    s->matched = true;
    s->end = best;
    return true;
}

/* Longest suffix of buf[lo..len) that is a proper prefix of a stop string. */
static size_t stop_hold(const rt_stop *s, size_t lo)
{
    size_t avail = s->len - lo;
    size_t h = s->max_len ? s->max_len - 1 : 0;
    if (h > avail)
        h = avail;
    for (; h > 0; h--) {
        const char *tail = s->buf + s->len - h;
        for (int i = 0; i < s->n; i++)
            if (s->stop_len[i] > h && tail[0] == s->stop[i][0] && memcmp(tail, s->stop[i], h) == 0)
                return h;
    }
    return 0;
}

/* Moves end back to the start of a UTF-8 sequence that is not complete
 * before end, so a chunk never ends inside a character. */
static size_t utf8_cut(const char *b, size_t lo, size_t end)
{
    for (size_t i = end, k = 0; i > lo && k < 4; k++) {
        uint8_t c = (uint8_t)b[--i];
        if ((c & 0xC0) == 0x80)
            continue;
        size_t need = c < 0x80             ? 1
                      : (c & 0xE0) == 0xC0 ? 2
                      : (c & 0xF0) == 0xE0 ? 3
                      : (c & 0xF8) == 0xF0 ? 4
                                           : 1;
        return end - i < need ? i : end;
    }
    /* only continuation bytes: invalid, and waiting would not mend it */
    return end;
}

const char *rt_stop_take(rt_stop *s, bool final, size_t *len)
{
    size_t safe;
    if (s->matched)
        safe = s->end;
    else if (final)
        safe = s->len;
    else
        safe = utf8_cut(s->buf, s->emitted, s->len - stop_hold(s, s->emitted));
    if (safe < s->emitted)
        safe = s->emitted;
    const char *out = s->buf ? s->buf + s->emitted : "";
    *len = safe - s->emitted;
    s->emitted = safe;
    return out;
}
