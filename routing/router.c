/* The routing decision (see router.h). It runs for every request, so it
 * allocates nothing and compares precomputed 64-bit hashes (a string
 * compare only confirms a match): one pass filters every region and finds
 * the fastest, a second keeps the best ROUTE_MAX_CANDIDATES in order by
 * insertion into a short sorted array. */
#include "routing/router.h"
#include "gateway/base/prefix.h"
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
    /* latency step (or SLO group, then step; primary: the list index
     * minus ROUTE_MAX_PRIMARY for an able listed region): the main key */
    int64_t k1;
    double k2; /* carbon: the intensity within the SLO; else 0 */
    double price, ms;
} rank;

static bool rank_less(const rank *a, const rank *b)
{
    if (a->k1 != b->k1)
        return a->k1 < b->k1;
    if (a->k2 != b->k2)
        return a->k2 < b->k2;
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

static const char *ordinal(int i)
{
    static const char *const o[ROUTE_MAX_PRIMARY] = {"1st", "2nd", "3rd", "4th", "5th", "6th", "7th", "8th"};
    return i >= 0 && i < ROUTE_MAX_PRIMARY ? o[i] : "?";
}

/* "primary 2nd of 3 (1 spilled), 30.0 ms within slo 500": cand[0] is the
 * list's able region pri. */
static void format_primary(out_buf *b, const route_query *q, const route_decision *d, int pri)
{
    int spilled = 0;
    for (int i = 0; i < q->primary->n; i++)
        spilled += q->primary->spilled[i];
    put_str(b, "primary ");
    put_str(b, ordinal(pri));
    put_str(b, " of ");
    put_num(b, q->primary->n, 0, true);
    if (spilled) {
        put_str(b, " (");
        put_num(b, spilled, 0, true);
        put_str(b, " spilled)");
    }
    put_str(b, ", ");
    put_num(b, d->expected_ms[0], 1, false);
    if (q->slo_ms > 0) {
        put_str(b, " ms within slo ");
        put_num(b, q->slo_ms, 3, true);
    } else {
        put_str(b, " ms, no slo");
    }
}

static void format_reason(const route_query *q, route_decision *d, int pri)
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
    bool by_slo = q->policy == ROUTE_COST || q->policy == ROUTE_CARBON;
    bool latency = !by_slo || (q->slo_ms > 0 && ms > q->slo_ms);
    if (q->policy == ROUTE_PRIMARY && pri >= 0) {
        format_primary(&b, q, d, pri);
        latency = by_slo = false;
    } else if (q->policy == ROUTE_PRIMARY && q->primary && q->primary->n) {
        put_str(&b, "primary: none able within slo ");
        put_num(&b, q->slo_ms, 3, true);
        put_str(&b, ", ");
    } else if (by_slo && latency) {
        put_str(&b, q->policy == ROUTE_COST ? "cost: none within slo " : "carbon: none within slo ");
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
    } else if (by_slo) {
        if (q->policy == ROUTE_CARBON) {
            put_str(&b, "carbon ");
            if (r->rec.carbon > 0)
                put_num(&b, r->rec.carbon, 0, true);
            else
                put_str(&b, "unknown");
            put_str(&b, " g/kWh, ");
        } else {
            put_str(&b, "cost ");
            put_num(&b, r->rec.price_out, 2, false);
            put_str(&b, "/M, ");
        }
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
/* The prefill the region's cached prefix of the request saves: its
 * expected TTFT with the hit is this much below the one without. */
static double prefix_saved_ms(const route_region *r, const route_query *q)
{
    if (!q->chain || !r->rec.n_prefixes)
        return 0;
    return gw_prefix_bytes(q->chain, gw_prefix_match(q->chain, r->rec.prefixes, r->rec.n_prefixes)) *
           r->rec.prefill_ms_per_byte;
}

static void spread_first(route_table *t, const route_query *q, rank *top, int n_top)
{
    const double best = top[0].ms, near = fmax(ROUTE_NEAR_FRAC * best, ROUTE_NEAR_MS), edge = best + near;
    double w[ROUTE_MAX_CANDIDATES], sum = 0;
    int n = 0;
    for (; n < n_top; n++) {
        /* under cost, only the preferred's price group: a dearer region
         * as fast is no choice of the policy's */
        if (top[n].ms >= edge ||
            (q->policy != ROUTE_LATENCY && (top[n].k1 != top[0].k1 || top[n].k2 != top[0].k2)) ||
            (q->policy == ROUTE_COST && top[n].price != top[0].price))
            break;
        w[n] = top[n].ms <= best ? 1.0 : (edge - top[n].ms) / near;
        sum += w[n];
    }
    if (n < 2)
        return;
    int pick = 0;
    if (q->session) {
        uint64_t high = 0;
        for (int i = 0; i < n; i++) {
            const char *name = top[i].s->r.rec.name;
            uint64_t score = gw_prefix_hash(q->session, name, strlen(name));
            if (score > high) {
                high = score;
                pick = i;
            }
        }
    } else {
        double x = next_unit(t) * sum;
        while (pick < n - 1 && x >= w[pick]) {
            x -= w[pick];
            pick++;
        }
    }
    rank chosen = top[pick];
    memmove(&top[1], &top[0], (size_t)pick * sizeof(*top));
    top[0] = chosen;
}

void route_primary_init(route_primary *p, const char *const *names, int n, double return_frac, int64_t hold_ms)
{
    memset(p, 0, sizeof(*p));
    for (int i = 0; i < n && p->n < ROUTE_MAX_PRIMARY; i++) {
        snprintf(p->names[p->n], ROUTE_NAME_MAX, "%s", names[i]);
        p->hash[p->n] = route__hash(p->names[p->n]);
        p->n++;
    }
    p->return_frac = return_frac > 0 && return_frac <= 1 ? return_frac : 0.8;
    p->hold_ms = hold_ms > 0 ? hold_ms : 0;
    p->current = -1;
}

void route_region_note_busy(route_region *r, int64_t now_ms)
{
    r->busy_ms = now_ms > 0 ? now_ms : 1;
}

static int primary_index(const route_primary *p, const route_slot *s)
{
    for (int i = 0; i < p->n; i++)
        if (p->hash[i] == s->name_hash && !strcmp(p->names[i], s->r.rec.name))
            return i;
    return -1;
}

/* The hysteresis of one listed region seen now with expected latency ms
 * (router.h): whether it is able. */
static bool primary_able(route_primary *p, int i, const route_region *r, double ms, const route_query *q)
{
    bool busy = r->busy_ms && q->now_ms - r->busy_ms < p->hold_ms;
    bool over = (q->slo_ms > 0 && ms > q->slo_ms) || busy;
    if (!p->spilled[i]) {
        if (over) {
            p->spilled[i] = true;
            p->below_since_ms[i] = 0;
        }
        return !over;
    }
    bool below = !busy && (q->slo_ms <= 0 || ms < p->return_frac * q->slo_ms);
    if (!below) {
        p->below_since_ms[i] = 0;
        return false;
    }
    if (!p->below_since_ms[i])
        p->below_since_ms[i] = q->now_ms > 0 ? q->now_ms : 1;
    if (q->now_ms - p->below_since_ms[i] < p->hold_ms)
        return false;
    p->spilled[i] = false;
    p->below_since_ms[i] = 0;
    return true;
}

/* Among the near-best (the spread window), the regions holding the
 * longest prefix of the request go first, the first of them drawn among
 * them as spreading draws (or by the session): a conversation stays with
 * its KV while its region is about as fast as the best, whatever the
 * noise in the estimates, and a prefix every region holds (a shared system
 * prompt) still spreads. A hit that saves less than ROUTE_NEAR_MS (a short
 * prompt repeated) decides nothing. True when it ordered the front. */
static bool keep_prefix(route_table *t, const route_query *q, rank *top, int n_top)
{
    if (!q->chain || n_top < 1)
        return false;
    const double best = top[0].ms, edge = best + fmax(ROUTE_NEAR_FRAC * best, ROUTE_NEAR_MS);
    double held[ROUTE_MAX_CANDIDATES], most = 0, saved = 0;
    int n_near = 0;
    for (; n_near < n_top && top[n_near].ms < edge; n_near++) {
        if (q->policy == ROUTE_COST && (top[n_near].k1 != top[0].k1 || top[n_near].price != top[0].price))
            break;
        const route_record *rec = &top[n_near].s->r.rec;
        held[n_near] = gw_prefix_bytes(q->chain, gw_prefix_match(q->chain, rec->prefixes, rec->n_prefixes));
        if (held[n_near] > most) {
            most = held[n_near];
            saved = most * rec->prefill_ms_per_byte;
        }
    }
    if (!(most > 0) || saved < ROUTE_NEAR_MS)
        return false;
    rank order[ROUTE_MAX_CANDIDATES];
    int k = 0;
    for (int i = 0; i < n_near; i++)
        if (held[i] == most)
            order[k++] = top[i];
    const int holders = k;
    for (int i = 0; i < n_top; i++)
        if (i >= n_near || held[i] != most)
            order[k++] = top[i];
    memcpy(top, order, (size_t)n_top * sizeof(*top));
    if (q->spread && holders > 1)
        spread_first(t, q, top, holders);
    return true;
}

int route_decide(route_table *t, const route_query *q, route_decision *d)
{
    route_primary *pl = q->policy == ROUTE_PRIMARY && q->primary && q->primary->n ? q->primary : NULL;
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
        s->scratch_pri = -1;
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
        double rtt = route_rtt_ms(r);
        s->scratch_ms = rtt + fmax(0, route_model_queue_ms(r, mi) - prefix_saved_ms(r, q));
        s->scratch_ok = true;
        int pi = pl ? primary_index(pl, s) : -1;
        if (pi >= 0 && primary_able(pl, pi, r, s->scratch_ms, q))
            s->scratch_pri = (int8_t)pi;
        if (s->scratch_ms < best)
            best = s->scratch_ms;
        n_ok++;
    }

    /* Pass 2: the best ROUTE_MAX_CANDIDATES, in order. */
    rank top[ROUTE_MAX_CANDIDATES];
    int n_top = 0;
    bool by_slo = q->policy == ROUTE_COST || q->policy == ROUTE_CARBON;
    for (int i = 0; i < t->n && n_ok; i++) {
        route_slot *s = &t->slots[t->order[i]];
        if (!s->scratch_ok)
            continue;
        n_ok--;
        /* >= 0, so truncation is floor; capped so that the cast stays in
         * range whatever a record or an RTT says. */
        double steps = (s->scratch_ms - best) / ROUTE_TIE_MS;
        rank k = {s, steps < 1e15 ? (int64_t)steps : (int64_t)1e15, 0, route_price(&s->r, q), s->scratch_ms};
        if (by_slo) /* within the SLO: by price (carbon), then exact latency; the rest after, by latency */
            k.k1 = q->slo_ms <= 0 || k.ms <= q->slo_ms ? 0 : 1 + k.k1;
        if (q->policy == ROUTE_CARBON && k.k1 == 0) /* a region stating no intensity after those that do */
            k.k2 = s->r.rec.carbon > 0 ? s->r.rec.carbon : INFINITY;
        if (s->scratch_pri >= 0)
            k.k1 = s->scratch_pri - ROUTE_MAX_PRIMARY;
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
    int pri = -1;
    if (pl) {
        pri = n_top && top[0].s->scratch_pri >= 0 ? top[0].s->scratch_pri : -1;
        if (pl->decided && pri != pl->current)
            pl->switches++;
        pl->current = pri;
        pl->decided = true;
    }
    /* the primary list orders the front itself: a held prefix does not reorder it */
    if (!(pl == NULL && keep_prefix(t, q, top, n_top)) && q->spread && n_top > 1)
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
    /* a probe put first is not the list's choice */
    format_reason(q, d, d->n && d->cand[0] == d->preferred ? pri : -1);
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
