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
    s->n_vocab = n_vocab;
    s->softmax = kn_ops_best()->softmax;
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

/* Total order: higher value first, then lower id. */
static inline bool cand_before(const cand *a, const cand *b)
{
    return a->v > b->v || (a->v == b->v && a->id < b->id);
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

/* Lomuto partition around a[hi - 1]; returns the pivot's final place. */
static size_t cand_partition(cand *a, size_t lo, size_t hi)
{
    size_t last = hi - 1, store = lo;
    cand pivot = a[last];
    for (size_t i = lo; i < last; i++)
        if (cand_before(&a[i], &pivot))
            cand_swap(&a[i], &a[store++]);
    cand_swap(&a[store], &a[last]);
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
        size_t p = cand_partition(a, lo, hi);
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
        size_t store = cand_partition(a, lo, hi);
        if (store == k || store + 1 == k)
            return;
        if (store > k)
            hi = store;
        else
            lo = store + 1;
    }
}

/* The first token with the largest logit (NaN never compares greater; all
 * NaN or -inf: token 0). The maximum in four chains, then its index: one
 * chain of dependent compares took ~1 ns a token. */
static int32_t argmax(const float *logits, int32_t n)
{
    float mx[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    for (int32_t i = 0; i < n; i++)
        mx[i & 3] = logits[i] > mx[i & 3] ? logits[i] : mx[i & 3];
    const float max = fmaxf(fmaxf(mx[0], mx[1]), fmaxf(mx[2], mx[3]));
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
    float mx[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    for (int32_t i = 0; i < n; i++) {
        const float v = isnan(x[i]) ? -INFINITY : x[i];
        x[i] = v;
        mx[i & 3] = v > mx[i & 3] ? v : mx[i & 3];
    }
    const float max = fmaxf(fmaxf(mx[0], mx[1]), fmaxf(mx[2], mx[3]));
    if (isinf(max)) {
        /* an infinite maximum makes the tokens that reach it equally likely */
        for (int32_t i = 0; i < n; i++)
            x[i] = x[i] == max ? 1.0f : 0.0f;
    } else {
        for (int32_t i = 0; i < n; i++)
            x[i] = (x[i] - max) * inv_t;
        s->softmax(x, n);
    }
    double part[4] = {0.0, 0.0, 0.0, 0.0};
    for (int32_t i = 0; i < n; i++)
        part[i & 3] += x[i];
    return (part[0] + part[1]) + (part[2] + part[3]);
}

int32_t rt_sampler_sample(rt_sampler *s, float *logits)
{
    const rt_sampler_params *p = &s->p;
    int32_t n = s->n_vocab;

    if (p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f)
        for (int32_t i = 0; i < s->n_seen; i++) {
            int32_t t = s->seen[i];
            logits[t] -= (float)s->count[t] * p->frequency_penalty + p->presence_penalty;
        }
    /* a temperature too small to divide by is the greedy limit */
    const float inv_t = 1.0f / p->temperature;
    if (p->temperature == 0.0f || p->top_k == 1 || !isfinite(inv_t))
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
        for (int32_t i = 0; i < n; i++)
            c[i] = (cand){logits[i], i};
    }

    if (p->top_p < 1.0f) {
        /* Sort only as far as the nucleus reaches: the best 64, then the
         * next 256, ... A peaked distribution never sorts the vocabulary. */
        double target = (double)p->top_p * sum, cum = 0.0;
        size_t done = 0, chunk = 64, keep = m;
        while (done < m && keep == m) {
            size_t cnt = m - done < chunk ? m - done : chunk;
            if (cnt < m - done)
                select_top(c + done, m - done, cnt);
            cand_sort(c + done, cnt);
            for (size_t i = done; i < done + cnt; i++) {
                cum += c[i].v;
                if (cum >= target) {
                    keep = i + 1;
                    break;
                }
            }
            done += cnt;
            chunk *= 4;
        }
        m = keep;
        sum = 0.0;
        for (size_t i = 0; i < m; i++)
            sum += c[i].v;
    }

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
        sum = 0.0;
        for (size_t i = 0; i < m; i++)
            sum += c[i].v;
    }

    double u = rng_uniform(s->rng) * sum, cum = 0.0;
    size_t last = 0;
    for (size_t i = 0; i < m; i++) {
        if (c[i].v <= 0.0f)
            continue;
        cum += c[i].v;
        last = i;
        if (u < cum)
            return c[i].id;
    }
    /* rounding left u at the very top, or every probability was 0 */
    return c[last].id;
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
