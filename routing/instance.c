/* Several gateways under one region name (see instance.h): their entries
 * in the region's hash, and the merge readers make of them. */
#include "routing/instance.h"
#include "routing/route_internal.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define PREFIX_LEN (sizeof(ROUTE_INSTANCE_PREFIX) - 1)

bool route_instance_field(const char *name, size_t len, char id[ROUTE_INSTANCE_ID_LEN + 1])
{
    if (len != PREFIX_LEN + ROUTE_INSTANCE_ID_LEN || memcmp(name, ROUTE_INSTANCE_PREFIX, PREFIX_LEN))
        return false;
    for (size_t i = 0; i < ROUTE_INSTANCE_ID_LEN; i++) {
        char c = name[PREFIX_LEN + i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return false;
        id[i] = c;
    }
    id[ROUTE_INSTANCE_ID_LEN] = '\0';
    return true;
}

size_t route_instance_encode(const route_record *r, char *out)
{
    route_field f[ROUTE_N_FIELDS];
    route_record_to_fields(r, f);
    size_t at = 0;
    for (int i = 0; i < ROUTE_N_FIELDS; i++)
        at += (size_t)snprintf(out + at, ROUTE_INSTANCE_VALUE_MAX - at, "%s=%s\n", f[i].name, f[i].value);
    return at;
}

int route_instance_split(const char *value, size_t len, route_entry_fields *out, char *err, size_t err_len)
{
    int line = 0;
    const char *p = value, *end = value + len;
    out->n = 0;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p)), *le = nl ? nl : end;
        const char *eq = memchr(p, '=', (size_t)(le - p));
        line++;
        if (!eq) {
            snprintf(err, err_len, "line %d: no '='", line);
            return -EINVAL;
        }
        if (out->n == ROUTE_ENTRY_MAX_LINES) {
            snprintf(err, err_len, "more than %d lines", ROUTE_ENTRY_MAX_LINES);
            return -EINVAL;
        }
        size_t nlen = (size_t)(eq - p);
        if (memchr(p, '\0', nlen)) {
            snprintf(err, err_len, "line %d: a NUL byte in the name", line);
            return -EINVAL;
        }
        if (nlen < ROUTE_ENTRY_NAME_MAX) { /* a longer name is none of ours */
            int n = out->n++;
            memcpy(out->name_buf[n], p, nlen);
            out->name_buf[n][nlen] = '\0';
            out->names[n] = out->name_buf[n];
            out->values[n] = eq + 1;
            out->lens[n] = (size_t)(le - eq - 1);
        }
        p = nl ? nl + 1 : end;
    }
    return 0;
}

int route_instance_decode(route_record *r, const char *value, size_t len, char *err, size_t err_len)
{
    route_entry_fields f;
    int rc = route_instance_split(value, len, &f, err, err_len);
    return rc ? rc : route_record_from_fields(r, f.names, f.values, f.lens, f.n, err, err_len);
}

static int find(const char *items, size_t stride, int n, const char *s)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(items + (size_t)i * stride, s))
            return i;
    return -1;
}

/* Sums and capacity-weighted estimates of one load (a region's, a
 * model's) over the entries merged. */
typedef struct load_sum {
    long long capacity, running, queued;
    double ttft, ttft_w, tpot, tpot_w, est, est_w;
} load_sum;

static void load_add(load_sum *s, int capacity, int running, int queued, double ttft, double tpot, double est)
{
    /* an entry with no estimate yet (a gateway of fresh workers) would
     * pull the average towards a free region's */
    double w = capacity > 0 ? capacity : 1;
    s->capacity += capacity;
    s->running += running;
    s->queued += queued;
    if (ttft > 0) {
        s->ttft += w * ttft;
        s->ttft_w += w;
    }
    if (tpot > 0) {
        s->tpot += w * tpot;
        s->tpot_w += w;
    }
    /* the load balancer spreads requests over the gateways: what one
     * waits for is their average */
    if (est > 0) {
        s->est += w * est;
        s->est_w += w;
    }
}

static int clamp_int(long long x)
{
    return x > INT_MAX ? INT_MAX : (int)x;
}

static void load_take(const load_sum *s, route_model_load *l)
{
    l->capacity = clamp_int(s->capacity);
    l->running = clamp_int(s->running);
    l->queued = clamp_int(s->queued);
    l->ttft_ms = s->ttft_w > 0 ? fmin(s->ttft / s->ttft_w, ROUTE_MAX_MS) : 0;
    l->tpot_ms = s->tpot_w > 0 ? fmin(s->tpot / s->tpot_w, ROUTE_MAX_MS) : 0;
}

static double est_take(const load_sum *s)
{
    return s->est_w > 0 ? fmin(s->est / s->est_w, ROUTE_MAX_MS) : 0;
}

/* The first healthy entry that peers can reach (region.endpoint is
 * optional: one without would take the others' endpoint away), else the
 * first healthy one; n when none is healthy. */
static int lead_of(const route_record *inst, int n)
{
    int first = n;
    for (int i = 0; i < n; i++) {
        if (!inst[i].healthy)
            continue;
        if (inst[i].endpoint[0])
            return i;
        if (first == n)
            first = i;
    }
    return first;
}

int route_instances_merge(const route_record *inst, int n, route_record *out)
{
    if (n <= 0)
        return -ENOENT;
    if (n > ROUTE_MAX_INSTANCES)
        n = ROUTE_MAX_INSTANCES;
    int lead = lead_of(inst, n);
    int64_t newest = 0;
    uint64_t version = ROUTE__FNV_SEED; /* over every entry's stamp */
    for (int i = 0; i < n; i++) {
        newest = inst[i].updated_ms > newest ? inst[i].updated_ms : newest;
        version = route__hash_bytes(version, &inst[i].updated_ms, sizeof(inst[i].updated_ms));
    }
    if (lead == n) {
        *out = inst[0];
        out->instances = n;
        out->updated_ms = newest;
        out->version = version;
        return 0;
    }
    const route_record *L = &inst[lead];
    bool member[ROUTE_MAX_INSTANCES] = {false};
    bool per_model = L->n_load > 0;
    route_record m = *L;
    m.n_models = m.n_tags = m.n_load = m.instances = 0;
    load_sum total = {0};
    for (int i = 0; i < n; i++) {
        const route_record *e = &inst[i];
        if (!e->healthy || strcmp(e->endpoint, L->endpoint))
            continue;
        member[i] = true;
        m.instances++;
        load_add(&total, e->capacity, e->running, e->queued, e->ttft_ms, e->tpot_ms, e->ttft_est_ms);
        m.price_in = fmax(m.price_in, e->price_in);
        m.price_out = fmax(m.price_out, e->price_out);
        m.carbon = fmax(m.carbon, e->carbon); /* as prices: the worst a request may meet */
        per_model &= e->n_load > 0;
    }
    /* Prompt prefixes are one gateway's workers': behind the region's load
     * balancer a request may reach another's, so a merged region has none. */
    if (m.instances > 1)
        m.n_prefixes = 0;
    route_model_load l;
    load_take(&total, &l);
    m.capacity = l.capacity;
    m.running = l.running;
    m.queued = l.queued;
    m.ttft_ms = l.ttft_ms;
    m.tpot_ms = l.tpot_ms;
    m.ttft_est_ms = est_take(&total);
    m.updated_ms = newest;
    m.version = version;

    /* What every member has, in the lead's order, each once: a name the
     * lead repeats (route_record_check refuses it; a caller may not have
     * asked) would count its entries' load twice. */
    load_sum total_models = {0};
    for (int t = 0; t < L->n_tags; t++) {
        bool all = find(L->tags[0], sizeof(L->tags[0]), t, L->tags[t]) < 0;
        for (int i = 0; i < n && all; i++)
            all =
                !member[i] || find(inst[i].tags[0], sizeof(inst[i].tags[0]), inst[i].n_tags, L->tags[t]) >= 0;
        if (all)
            memcpy(m.tags[m.n_tags++], L->tags[t], sizeof(m.tags[0]));
    }
    for (int k = 0; k < L->n_models; k++) {
        load_sum ms = {0};
        bool all = find(L->models[0], sizeof(L->models[0]), k, L->models[k]) < 0;
        for (int i = 0; i < n && all; i++) {
            if (!member[i])
                continue;
            const route_record *e = &inst[i];
            int j = find(e->models[0], sizeof(e->models[0]), e->n_models, L->models[k]);
            all = j >= 0;
            if (all && per_model)
                load_add(&ms, e->load[j].capacity, e->load[j].running, e->load[j].queued, e->load[j].ttft_ms,
                         e->load[j].tpot_ms, e->load_est_ms[j]);
        }
        if (!all)
            continue;
        memcpy(m.models[m.n_models], L->models[k], sizeof(m.models[0]));
        if (per_model) {
            load_take(&ms, &m.load[m.n_models]);
            m.load_est_ms[m.n_models] = est_take(&ms);
            /* the workers of a model outside the merge serve none of the
             * region's requests: not room in its totals */
            total_models.capacity += ms.capacity;
            total_models.running += ms.running;
            total_models.queued += ms.queued;
        }
        m.n_models++;
    }
    m.n_load = per_model ? m.n_models : 0;
    if (per_model) {
        m.capacity = clamp_int(total_models.capacity);
        m.running = clamp_int(total_models.running);
        m.queued = clamp_int(total_models.queued);
    }
    *out = m;
    return 0;
}
