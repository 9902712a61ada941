/* Prompt-prefix hashes, the choice they feed, and a worker's set of them
 * (see prefix.h). The body scan is a bounded skip over JSON bytes: it
 * keeps the spans of a few top-level values and never builds a document,
 * so the gateway can afford it on its request path; bytes that are not
 * JSON end it early with what it found. */
#include "gateway/base/prefix.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define SEED 0x696e66657270667aull /* "infergpz": the chain's version */

typedef struct gw_prefix_entry {
    uint64_t hash;
    uint64_t used; /* s->clock at its last use */
    double work;   /* the worker's KV work at its last use; < 0: not stamped yet */
} gw_prefix_entry;

static uint64_t mix(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

static uint64_t load_le(const unsigned char *p, size_t n)
{
    uint64_t w = 0;
    for (size_t i = 0; i < n; i++)
        w |= (uint64_t)p[i] << (8 * i);
    return w;
}

uint64_t gw_prefix_hash(uint64_t seed, const void *data, size_t len)
{
    const unsigned char *p = data;
    uint64_t h = seed ^ (len * 0x9e3779b97f4a7c15ull);
    for (; len >= 8; p += 8, len -= 8)
        h = (h ^ mix(load_le(p, 8))) * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
    h = mix(h ^ mix(load_le(p, len) ^ (uint64_t)len << 56));
    return h ? h : 1;
}

/* ---- the body scan ---- */

typedef struct span {
    const unsigned char *p;
    size_t len;
} span;

static const unsigned char *ws(const unsigned char *p, const unsigned char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

/* Past the string at p (its opening quote); NULL when it does not end. */
static const unsigned char *skip_string(const unsigned char *p, const unsigned char *end)
{
    for (p++; p < end; p++) {
        if (*p == '\\')
            p++;
        else if (*p == '"')
            return p + 1;
    }
    return NULL;
}

/* Past the value at p; NULL when it does not end within the bytes. Nesting
 * is counted, not recursed. */
static const unsigned char *skip_value(const unsigned char *p, const unsigned char *end)
{
    if (p >= end)
        return NULL;
    if (*p == '"')
        return skip_string(p, end);
    if (*p != '{' && *p != '[') {
        while (p < end && !strchr(",}] \t\r\n", *p))
            p++;
        return p;
    }
    size_t depth = 0;
    while (p < end) {
        if (*p == '"') {
            if (!(p = skip_string(p, end)))
                return NULL;
            continue;
        }
        if (*p == '{' || *p == '[')
            depth++;
        else if ((*p == '}' || *p == ']') && --depth == 0)
            return p + 1;
        p++;
    }
    return NULL;
}

static bool key_is(span k, const char *name)
{
    size_t n = strlen(name);
    return k.len == n + 2 && !memcmp(k.p + 1, name, n);
}

typedef struct fields {
    span model, tools, messages, prompt, user;
} fields;

/* The spans of the top-level values read (the last of repeats, as a lax
 * parser would; the worker refuses repeats anyway). */
static void scan_fields(const unsigned char *p, const unsigned char *end, fields *f)
{
    memset(f, 0, sizeof(*f));
    p = ws(p, end);
    if (p == end || *p != '{')
        return;
    p = ws(p + 1, end);
    while (p < end && *p == '"') {
        const unsigned char *k = p;
        if (!(p = skip_string(p, end)))
            return;
        span key = {k, (size_t)(p - k)};
        p = ws(p, end);
        if (p == end || *p != ':')
            return;
        p = ws(p + 1, end);
        const unsigned char *v = p;
        if (!(p = skip_value(p, end)) || p == v)
            return;
        span val = {v, (size_t)(p - v)};
        if (key_is(key, "model"))
            f->model = val;
        else if (key_is(key, "tools"))
            f->tools = val;
        else if (key_is(key, "messages"))
            f->messages = val;
        else if (key_is(key, "prompt"))
            f->prompt = val;
        else if (key_is(key, "user") && *v == '"')
            f->user = val;
        p = ws(p, end);
        if (p == end || *p != ',')
            return;
        p = ws(p + 1, end);
    }
}

static void push(gw_prefix_chain *c, uint64_t *h, const unsigned char *from, const unsigned char *to,
                 const unsigned char *base)
{
    *h = gw_prefix_hash(*h, from, (size_t)(to - from));
    c->hash[c->n] = *h;
    c->end[c->n] = (uint32_t)(to - base);
    c->n++;
}

void gw_prefix_chain_of(const void *body, size_t len, gw_prefix_chain *c)
{
    const unsigned char *p = body, *end = p + len;
    fields f;
    c->n = 0;
    c->user = 0;
    if (len > UINT32_MAX)
        return;
    scan_fields(p, end, &f);
    if (f.user.p)
        c->user = gw_prefix_hash(SEED, f.user.p, f.user.len);
    uint64_t h = gw_prefix_hash(SEED, f.model.p ? f.model.p : p, f.model.len);
    if (f.tools.p)
        h = gw_prefix_hash(h, f.tools.p, f.tools.len);
    if (f.messages.p && f.messages.p[0] == '[') {
        /* one chunk per element, from the array's start: each chunk's
         * bytes include the separators before it */
        const unsigned char *q = ws(f.messages.p + 1, end), *from = f.messages.p;
        while (c->n < GW_PREFIX_MAX && q < end && *q != ']') {
            const unsigned char *e = skip_value(q, end);
            if (!e || e == q)
                return;
            push(c, &h, from, e, f.messages.p);
            from = e;
            q = ws(e, end);
            if (q < end && *q == ',')
                q = ws(q + 1, end);
        }
    } else if (f.prompt.p && f.prompt.len > 1) {
        /* fixed pieces of the value without its closing quote or bracket,
         * so that a prompt that grows keeps its leading pieces' hashes */
        const unsigned char *q = f.prompt.p, *last = f.prompt.p + f.prompt.len - 1;
        while (c->n < GW_PREFIX_MAX && q < last) {
            const unsigned char *e = (size_t)(last - q) > GW_PREFIX_CHUNK ? q + GW_PREFIX_CHUNK : last;
            push(c, &h, q, e, f.prompt.p);
            q = e;
        }
    }
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static bool held_has(const uint64_t *held, int n, uint64_t h)
{
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (held[mid] < h)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && held[lo] == h;
}

int gw_prefix_match(const gw_prefix_chain *c, const uint64_t *held, int n)
{
    for (int i = c ? c->n - 1 : -1; i >= 0 && n > 0; i--)
        if (held_has(held, n, c->hash[i]))
            return i + 1;
    return 0;
}

double gw_prefix_bytes(const gw_prefix_chain *c, int chunks)
{
    return c && chunks > 0 ? (double)c->end[chunks - 1] : 0;
}

int gw_prefix_sort(uint64_t *v, int n)
{
    if (n <= 0)
        return 0;
    qsort(v, (size_t)n, sizeof(*v), cmp_u64);
    int k = 1;
    for (int i = 1; i < n; i++)
        if (v[i] != v[k - 1])
            v[k++] = v[i];
    return k;
}

/* ---- the choice ---- */

/* A candidate's expected time to first token; *hit the bytes it holds. */
static double expect(const gw_prefix_chain *c, double prompt_bytes, const gw_prefix_cand *cand, double *hit)
{
    *hit = gw_prefix_bytes(c, gw_prefix_match(c, cand->held, cand->n_held));
    double left = prompt_bytes > *hit ? prompt_bytes - *hit : 0;
    return cand->wait_ms + left * cand->ms_per_byte;
}

int gw_prefix_choose(const gw_prefix_chain *c, double prompt_bytes, const gw_prefix_cand *cand, int n,
                     uint64_t session, double *ttft_ms, double *cached_bytes)
{
    double best = 0, hit;
    int pick = -1;
    for (int i = 0; i < n; i++) {
        double e = expect(c, prompt_bytes, &cand[i], &hit);
        if (pick < 0 || e < best) {
            pick = i;
            best = e;
        }
    }
    if (pick >= 0 && session) {
        /* rendezvous: each near-equal candidate's score is a hash of the
         * session and its id; the highest wins, and stays the highest when
         * others come and go */
        uint64_t top = 0;
        double near = best * (1 + GW_PREFIX_NEAR_FRAC) + GW_PREFIX_NEAR_MS;
        for (int i = 0; i < n; i++) {
            uint64_t score = gw_prefix_hash(session, &cand[i].id, sizeof(cand[i].id));
            if (score > top && expect(c, prompt_bytes, &cand[i], &hit) <= near) {
                top = score;
                pick = i;
            }
        }
    }
    if (pick >= 0) {
        double e = expect(c, prompt_bytes, &cand[pick], &hit);
        if (ttft_ms)
            *ttft_ms = e;
        if (cached_bytes)
            *cached_bytes = hit;
    }
    return pick;
}

/* ---- a worker's set ---- */

int gw_prefix_set_init(gw_prefix_set *s, int cap)
{
    memset(s, 0, sizeof(*s));
    if (cap < 1 || !(s->e = calloc((size_t)cap, sizeof(*s->e))))
        return -ENOMEM;
    s->cap = cap;
    return 0;
}

void gw_prefix_set_free(gw_prefix_set *s)
{
    free(s->e);
    memset(s, 0, sizeof(*s));
}

void gw_prefix_set_add(gw_prefix_set *s, const gw_prefix_chain *c)
{
    for (int i = 0; i < c->n && s->cap; i++) {
        int at = -1, oldest = 0;
        for (int j = 0; j < s->n && at < 0; j++) {
            if (s->e[j].hash == c->hash[i])
                at = j;
            else if (s->e[j].used < s->e[oldest].used)
                oldest = j;
        }
        if (at < 0)
            at = s->n < s->cap ? s->n++ : oldest;
        s->e[at] = (gw_prefix_entry){c->hash[i], ++s->clock, -1};
    }
}

void gw_prefix_set_age(gw_prefix_set *s, double work, double keep)
{
    int k = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->e[i].work < 0)
            s->e[i].work = work;
        if (work - s->e[i].work <= keep)
            s->e[k++] = s->e[i];
    }
    s->n = k;
}

static int by_use_desc(const void *a, const void *b)
{
    uint64_t x = ((const gw_prefix_entry *)a)->used, y = ((const gw_prefix_entry *)b)->used;
    return x > y ? -1 : x < y;
}

int gw_prefix_set_list(const gw_prefix_set *s, uint64_t *out, int max)
{
    if (s->n == 0 || max <= 0)
        return 0;
    gw_prefix_entry *tmp = malloc((size_t)s->n * sizeof(*tmp));
    if (!tmp)
        return 0;
    memcpy(tmp, s->e, (size_t)s->n * sizeof(*tmp));
    qsort(tmp, (size_t)s->n, sizeof(*tmp), by_use_desc);
    int k = s->n < max ? s->n : max;
    for (int i = 0; i < k; i++)
        out[i] = tmp[i].hash;
    free(tmp);
    return k;
}
