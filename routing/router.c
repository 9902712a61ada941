/* The routing decision (see router.h). It runs for every request, so it
 * allocates nothing and compares precomputed 64-bit hashes (a string
 * compare only confirms a match): one pass filters every region and finds
 * the fastest, a second keeps the best ROUTE_MAX_CANDIDATES in order by
 * insertion into a short sorted array. */
#include "routing/router.h"
#include "routing/route_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Required tags hashed once per decision; more than this (never in
 * practice: a region has at most ROUTE_MAX_TAGS) are hashed per region. */
#define NEED_HASHED 32

double route_rtt_ms(const route_region *r)
{
    if (r->local)
        return 0;
    return r->rtt_known ? r->rtt_ewma_ms : ROUTE_UNKNOWN_RTT_MS;
}

static double queue_ms(int capacity, int running, int queued, double ttft_ms, double tpot_ms)
{
    int64_t cap = capacity > 0 ? capacity : 1;
    int64_t waiting = (int64_t)running + queued + 1 - capacity;
    if (waiting <= 0)
        return ttft_ms;
    double service = ttft_ms + tpot_ms * ROUTE_SERVICE_TOKENS;
    return ttft_ms + (double)waiting * service / (double)cap;
}

/* The region's own estimate from its queues when its record has one: the
 * counts alone said 196-313 ms for a flooded worker whose requests waited
 * 800-950 ms (they know nothing of prompt lengths or measured rates). */
double route_queue_ms(const route_region *r)
{
    const route_record *rec = &r->rec;
    if (rec->ttft_est_ms > 0)
        return rec->ttft_est_ms;
    return queue_ms(rec->capacity, rec->running, rec->queued, rec->ttft_ms, rec->tpot_ms);
}

double route_model_queue_ms(const route_region *r, int model)
{
    const route_record *rec = &r->rec;
    if (model < 0 || model >= rec->n_load)
        return route_queue_ms(r);
    const route_model_load *l = &rec->load[model];
    if (rec->load_est_ms[model] > 0)
        return rec->load_est_ms[model];
    return queue_ms(l->capacity, l->running, l->queued, l->ttft_ms, l->tpot_ms);
}

double route_price(const route_region *r, const route_query *q)
{
    if (q->prompt_tokens <= 0 && q->output_tokens <= 0)
        return r->rec.price_out;
    return (q->prompt_tokens > 0 ? q->prompt_tokens : 0) * r->rec.price_in +
           (q->output_tokens > 0 ? q->output_tokens : 0) * r->rec.price_out;
}

/* q's price cap against r: the request's price per million of its tokens,
 * prompt and output weighted as route_price weighs them (price_out alone
 * for a query that gives neither). Compared multiplied out, with a hair of
 * slack, so that a cap equal to both prices passes whatever the rounding. */
static bool under_cap(const route_region *r, const route_query *q)
{
    if (!(q->max_price > 0))
        return true;
    double in = q->prompt_tokens > 0 ? q->prompt_tokens : 0, out = q->output_tokens > 0 ? q->output_tokens : 0;
    if (in + out == 0)
        return r->rec.price_out <= q->max_price;
    return in * r->rec.price_in + out * r->rec.price_out <= q->max_price * (in + out) * (1 + 1e-12);
}

void route_table_seed(route_table *t, uint64_t seed)
{
    t->rng = seed;
}

/* splitmix64: one multiply chain per decision, no state beyond a word. */
static double next_unit(route_table *t)
{
    uint64_t z = (t->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

double route_expected_ms(const route_region *r)
{
    return route_rtt_ms(r) + route_queue_ms(r);
}

/* A model is looked for by its 64-bit hash and length, and a match is
 * confirmed byte for byte (the string is read only then): FNV-1a
 * collisions can be made on purpose, and a client's made-up model name
 * routed as a real one would reach the per-model metrics' labels. */
/* A peer whose record says the model has no ready worker (capacity 0 in
 * its model_load) cannot serve it now, though healthy for its others:
 * ranked, its empty queue would put it first. This region's own workers
 * are looked at when the request is sent (its record is a heartbeat old),
 * and passed over there when none is ready. */
static inline bool model_up(const route_region *r, int model)
{
    return r->local || model >= r->rec.n_load || r->rec.load[model].capacity > 0;
}

static inline int model_index(const route_slot *s, const char *model, size_t len, uint64_t h)
{
    if (!(s->model_bloom & route__bloom_bit(h)))
        return -1;
    for (int i = 0; i < s->r.rec.n_models; i++)
        if (s->model_hash[i] == h && s->model_len[i] == len && !memcmp(s->r.rec.models[i], model, len))
            return i;
    return -1;
}

static bool has_tag(const route_slot *s, const char *tag, uint64_t h)
{
    for (int i = 0; i < s->r.rec.n_tags; i++)
        if (s->tag_hash[i] == h && !strcmp(s->r.rec.tags[i], tag))
            return true;
    return false;
}

bool route_region_allows(const route_region *r, const route_query *q)
{
    const route_slot *s = (const route_slot *)r;
    const char *model = q->model ? q->model : "";
    int mi = model_index(s, model, strlen(model), route__hash(model));
    if (mi < 0 || !model_up(r, mi))
        return false;
    for (int j = 0; j < q->n_need_tags; j++)
        if (!has_tag(s, q->need_tags[j], route__hash(q->need_tags[j])))
            return false;
    return under_cap(r, q);
}

typedef struct rank {
    route_slot *s;
    int64_t k1; /* latency step (or SLO group, then step): the main key */
    double price, ms;
} rank;

static bool rank_less(const rank *a, const rank *b)
{
    if (a->k1 != b->k1)
        return a->k1 < b->k1;
    if (a->price != b->price)
        return a->price < b->price;
    if (a->ms != b->ms)
        return a->ms < b->ms;
    return strcmp(a->s->r.rec.name, b->s->r.rec.name) < 0;
}

/* The reason is written for every request: a hand-rolled fixed-point
 * writer costs a tenth of snprintf's "%.1f". */
typedef struct out_buf {
    char *p, *end; /* end: the last byte, kept for the NUL */
} out_buf;

static void put_str(out_buf *b, const char *s)
{
    while (*s && b->p < b->end)
        *b->p++ = *s++;
    *b->p = '\0';
}

/* x with `decimals` digits after the point, rounded half up; trim drops
 * trailing zeros (and the point) for numbers like an SLO. */
static void put_num(out_buf *b, double x, int decimals, bool trim)
{
    char tmp[48], *q = tmp + sizeof(tmp);
    if (!(x >= 0 && x < 1e15)) {
        snprintf(tmp, sizeof(tmp), "%.*g", decimals + 3, x);
        put_str(b, tmp);
        return;
    }
    uint64_t scale = 1;
    for (int i = 0; i < decimals; i++)
        scale *= 10;
    uint64_t v = (uint64_t)(x * (double)scale + 0.5), ip = v / scale, fp = v % scale;
    *--q = '\0';
    if (decimals) {
        bool keep = !trim;
        for (int i = 0; i < decimals; i++, fp /= 10) {
            keep = keep || fp % 10;
            if (keep)
                *--q = (char)('0' + fp % 10);
        }
        if (keep)
            *--q = '.';
    }
    do
        *--q = (char)('0' + ip % 10);
    while (ip /= 10);
    put_str(b, q);
}

static void format_reason(const route_query *q, route_decision *d)
{
    out_buf b = {d->reason, d->reason + sizeof(d->reason) - 1};
    d->reason[0] = '\0';
    if (d->n == 0) {
        snprintf(d->reason, sizeof(d->reason),
                 "no region: model %d, stale %d, unhealthy %d, ejected %d, residency %d, price %d",
                 d->out_model, d->out_stale, d->out_unhealthy, d->out_ejected, d->out_residency,
                 d->out_price);
        return;
    }
    const route_region *r = d->cand[0];
    double ms = d->expected_ms[0], rtt = route_rtt_ms(r);
    bool latency = q->policy != ROUTE_COST || (q->slo_ms > 0 && ms > q->slo_ms);
    if (q->policy == ROUTE_COST && latency) {
        put_str(&b, "cost: none within slo ");
        put_num(&b, q->slo_ms, 3, true);
        put_str(&b, ", ");
    }
    if (latency) {
        put_str(&b, "latency ");
        put_num(&b, ms, 1, false);
        put_str(&b, " ms (rtt ");
        put_num(&b, rtt, 1, false);
        put_str(&b, " + queue ");
        put_num(&b, ms - rtt, 1, false);
        put_str(&b, ")");
    } else {
        put_str(&b, "cost ");
        put_num(&b, r->rec.price_out, 2, false);
        put_str(&b, "/M, ");
        put_num(&b, ms, 1, false);
        if (q->slo_ms > 0) {
            put_str(&b, " ms within slo ");
            put_num(&b, q->slo_ms, 3, true);
        } else {
            put_str(&b, " ms, no slo");
        }
    }
    if (d->probe)
        put_str(&b, " probe");
}

/* Draws the first candidate among those near the preferred top[0] (see
 * router.h) and moves it to the front, the others keeping their order. */
static void spread_first(route_table *t, const route_query *q, rank *top, int n_top)
{
    const double best = top[0].ms, near = fmax(ROUTE_NEAR_FRAC * best, ROUTE_NEAR_MS), edge = best + near;
    double w[ROUTE_MAX_CANDIDATES], sum = 0;
    int n = 0;
    for (; n < n_top; n++) {
        /* under cost, only the preferred's price group: a dearer region
         * as fast is no choice of the policy's */
        if (top[n].ms >= edge || (q->policy == ROUTE_COST && (top[n].k1 != top[0].k1 || top[n].price != top[0].price)))
            break;
        w[n] = top[n].ms <= best ? 1.0 : (edge - top[n].ms) / near;
        sum += w[n];
    }
    if (n < 2)
        return;
    double x = next_unit(t) * sum;
    int pick = 0;
    while (pick < n - 1 && x >= w[pick]) {
        x -= w[pick];
        pick++;
    }
    rank chosen = top[pick];
    memmove(&top[1], &top[0], (size_t)pick * sizeof(*top));
    top[0] = chosen;
}

int route_decide(route_table *t, const route_query *q, route_decision *d)
{
    const char *model = q->model ? q->model : "";
    size_t model_len = strlen(model);
    uint64_t mh = route__hash(model), need_bloom = 0, nh[NEED_HASHED];
    int n_need = q->n_need_tags > 0 ? q->n_need_tags : 0;
    for (int j = 0; j < n_need && j < NEED_HASHED; j++) {
        nh[j] = route__hash(q->need_tags[j]);
        need_bloom |= route__bloom_bit(nh[j]);
    }
    d->n = 0;
    d->probe = false;
    d->preferred = NULL;
    d->out_model = d->out_stale = d->out_unhealthy = d->out_ejected = d->out_residency = d->out_price = 0;

    /* Pass 1: filters, and the fastest expected latency among the rest. */
    double best = INFINITY;
    int n_ok = 0;
    for (int i = 0; i < t->n; i++) {
        route_slot *s = &t->slots[t->order[i]];
        route_region *r = &s->r;
        s->scratch_ok = false;
        int mi = model_index(s, model, model_len, mh);
        if (mi < 0) {
            d->out_model++;
            continue;
        }
        if (!route__current(t, r, q->now_ms)) {
            d->out_stale++;
            continue;
        }
        if (!r->rec.healthy || !model_up(r, mi)) {
            d->out_unhealthy++;
            continue;
        }
        if (route__ejection_state(r, q->now_ms) == ROUTE__EJECTED) {
            d->out_ejected++;
            continue;
        }
        bool allowed = (need_bloom & ~s->tag_bloom) == 0;
        for (int j = 0; allowed && j < n_need; j++)
            allowed = has_tag(s, q->need_tags[j], j < NEED_HASHED ? nh[j] : route__hash(q->need_tags[j]));
        if (!allowed) {
            d->out_residency++;
            continue;
        }
        if (!under_cap(r, q)) {
            d->out_price++;
            continue;
        }
        s->scratch_ms = route_rtt_ms(r) + route_model_queue_ms(r, mi);
        s->scratch_ok = true;
        if (s->scratch_ms < best)
            best = s->scratch_ms;
        n_ok++;
    }

    /* Pass 2: the best ROUTE_MAX_CANDIDATES, in order. */
    rank top[ROUTE_MAX_CANDIDATES];
    int n_top = 0;
    bool cost = q->policy == ROUTE_COST;
    for (int i = 0; i < t->n && n_ok; i++) {
        route_slot *s = &t->slots[t->order[i]];
        if (!s->scratch_ok)
            continue;
        n_ok--;
        /* >= 0, so truncation is floor; capped so that the cast stays in
         * range whatever a record or an RTT says. */
        double steps = (s->scratch_ms - best) / ROUTE_TIE_MS;
        rank k = {s, steps < 1e15 ? (int64_t)steps : (int64_t)1e15, route_price(&s->r, q), s->scratch_ms};
        if (cost) /* within the SLO: by price, then exact latency; the rest after, by latency */
            k.k1 = q->slo_ms <= 0 || k.ms <= q->slo_ms ? 0 : 1 + k.k1;
        if (n_top == ROUTE_MAX_CANDIDATES && !rank_less(&k, &top[n_top - 1]))
            continue;
        int at = n_top < ROUTE_MAX_CANDIDATES ? n_top++ : n_top - 1;
        while (at > 0 && rank_less(&k, &top[at - 1])) {
            top[at] = top[at - 1];
            at--;
        }
        top[at] = k;
    }

    d->preferred = n_top ? &top[0].s->r : NULL;
    if (q->spread && n_top > 1)
        spread_first(t, q, top, n_top);

    /* A region out of its back-off claims its one probe as the first
     * choice; further down it stays, unclaimed, for the request to claim
     * if the ones before fail it (route_region_claim). Left out, it took
     * no part in failover until it ranked first again. */
    for (int i = 0; i < n_top; i++) {
        route_region *r = &top[i].s->r;
        if (d->n == 0 && route__ejection_state(r, q->now_ms) == ROUTE__PROBE) {
            if (!route_region_take_probe(r, q->now_ms)) {
                d->out_ejected++;
                continue;
            }
            d->probe = true;
        }
        d->cand[d->n] = r;
        d->cand_id[d->n] = r->id;
        d->expected_ms[d->n] = top[i].ms;
        d->n++;
    }
    format_reason(q, d);
    return d->n;
}

void route_models(const route_table *t, const char *const *need_tags, int n_need_tags, int64_t now_ms,
                  void (*fn)(void *ud, const char *model), void *ud)
{
    for (int i = 0; i < t->n; i++) {
        const route_slot *s = &t->slots[t->order[i]];
        const route_region *r = &s->r;
        if (!route__current(t, r, now_ms) || !r->rec.healthy)
            continue;
        bool allowed = true;
        for (int j = 0; allowed && j < n_need_tags; j++)
            allowed = has_tag(s, need_tags[j], route__hash(need_tags[j]));
        for (int m = 0; allowed && m < r->rec.n_models; m++)
            fn(ud, r->rec.models[m]);
    }
}
