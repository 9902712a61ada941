/* Prometheus registry (see metrics.h). Families live in declaration order;
 * each keeps its series in first-use order plus an open-addressing index
 * on the label string, so an update costs one hash of the labels whatever
 * the number of series. The family and the series used last are tried
 * first: updates mostly repeat the previous one's name and labels. */
#include "gateway/front/metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DROPPED_NAME "infergate_metrics_dropped_total"
#define DROPPED_HELP "Metric updates dropped because the registry reached its series limit."

typedef struct series {
    char *labels;
    double value;      /* counter, gauge */
    double sum;        /* histogram */
    uint64_t count;    /* histogram */
    uint64_t *buckets; /* histogram: per-bucket (not cumulative) counts, +Inf last */
} series;

typedef struct family {
    char *name, *help;
    gw_metric_type type;
    double *bounds;
    int n_bounds;
    series **s;
    size_t n, cap;
    int32_t *index;   /* positions in s, -1 empty */
    size_t index_cap; /* power of two, at least 2n */
    series *last;     /* the series found last, NULL after a clear */
} family;

struct gw_metrics {
    family **f;
    family *last; /* the family found last */
    int n, cap;
    size_t max_series, n_series;
    double dropped;
};

gw_metrics *gw_metrics_new(size_t max_series)
{
    gw_metrics *m = calloc(1, sizeof(*m));
    if (m)
        m->max_series = max_series;
    return m;
}

static void series_free(series *s)
{
    if (!s)
        return;
    free(s->labels);
    free(s->buckets);
    free(s);
}

static void family_clear(family *f)
{
    for (size_t i = 0; i < f->n; i++)
        series_free(f->s[i]);
    f->n = 0;
    f->last = NULL;
    for (size_t i = 0; i < f->index_cap; i++)
        f->index[i] = -1;
}

static void family_free(family *f)
{
    if (!f)
        return;
    family_clear(f);
    free(f->s);
    free(f->index);
    free(f->bounds);
    free(f->name);
    free(f->help);
    free(f);
}

void gw_metrics_free(gw_metrics *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->n; i++)
        family_free(m->f[i]);
    free(m->f);
    free(m);
}

static family *find_family(gw_metrics *m, const char *name)
{
    if (m->last && !strcmp(m->last->name, name))
        return m->last;
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->f[i]->name, name))
            return m->last = m->f[i];
    return NULL;
}

static bool valid_name(const char *s)
{
    if (!s || !*s || (*s >= '0' && *s <= '9'))
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_' ||
              *s == ':'))
            return false;
    return true;
}

int gw_metrics_describe(gw_metrics *m, const char *name, gw_metric_type type, const char *help,
                        const double *buckets, int n_buckets)
{
    if (!valid_name(name) || (type != GW_COUNTER && type != GW_GAUGE && type != GW_HISTOGRAM) ||
        n_buckets < 0 || (n_buckets > 0 && !buckets))
        return -EINVAL;
    if (type != GW_HISTOGRAM)
        n_buckets = 0;
    for (int i = 0; i < n_buckets; i++)
        if (!isfinite(buckets[i]) || (i > 0 && !(buckets[i] > buckets[i - 1])))
            return -EINVAL;
    if (find_family(m, name) || !strcmp(name, DROPPED_NAME))
        return -EEXIST;
    if (m->n == m->cap) {
        int cap = m->cap ? 2 * m->cap : 16;
        family **f = realloc(m->f, (size_t)cap * sizeof(*f));
        if (!f)
            return -ENOMEM;
        m->f = f;
        m->cap = cap;
    }
    family *f = calloc(1, sizeof(*f));
    if (!f || !(f->name = strdup(name)) || !(f->help = strdup(help ? help : "")) ||
        (n_buckets && !(f->bounds = malloc((size_t)n_buckets * sizeof(*f->bounds))))) {
        family_free(f);
        return -ENOMEM;
    }
    f->type = type;
    f->n_bounds = n_buckets;
    if (n_buckets)
        memcpy(f->bounds, buckets, (size_t)n_buckets * sizeof(*buckets));
    m->f[m->n++] = f;
    return 0;
}

/* ---- series lookup ---- */

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static size_t index_slot(const family *f, const char *labels)
{
    size_t mask = f->index_cap - 1, i = (size_t)hash_str(labels) & mask;
    while (f->index[i] >= 0 && strcmp(f->s[f->index[i]]->labels, labels))
        i = (i + 1) & mask;
    return i;
}

static int grow(family *f)
{
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 8;
        series **s = realloc(f->s, cap * sizeof(*s));
        if (!s)
            return -ENOMEM;
        f->s = s;
        f->cap = cap;
    }
    if (2 * (f->n + 1) > f->index_cap) {
        size_t cap = f->index_cap ? 2 * f->index_cap : 16;
        int32_t *idx = malloc(cap * sizeof(*idx));
        if (!idx)
            return -ENOMEM;
        free(f->index);
        f->index = idx;
        f->index_cap = cap;
        for (size_t i = 0; i < cap; i++)
            idx[i] = -1;
        for (size_t i = 0; i < f->n; i++)
            idx[index_slot(f, f->s[i]->labels)] = (int32_t)i;
    }
    return 0;
}

/* The series of `labels` in the family `name` of type `type` (*fp), made
 * on first use; NULL for an unknown family, the wrong type, the cap, or no
 * memory. */
static series *get_series(gw_metrics *m, const char *name, gw_metric_type type, const char *labels,
                          family **fp)
{
    family *f = find_family(m, name);
    if (!f || f->type != type)
        return NULL;
    *fp = f;
    if (!labels)
        labels = "";
    if (f->last && !strcmp(f->last->labels, labels))
        return f->last;
    if (f->index_cap) {
        int32_t at = f->index[index_slot(f, labels)];
        if (at >= 0)
            return f->last = f->s[at];
    }
    if (m->n_series >= m->max_series || f->n >= INT32_MAX) {
        m->dropped += 1;
        return NULL;
    }
    series *s = calloc(1, sizeof(*s));
    if (!s || grow(f) || !(s->labels = strdup(labels)) ||
        (type == GW_HISTOGRAM && !(s->buckets = calloc((size_t)f->n_bounds + 1, sizeof(*s->buckets))))) {
        series_free(s);
        m->dropped += 1;
        return NULL;
    }
    f->index[index_slot(f, labels)] = (int32_t)f->n;
    f->s[f->n++] = s;
    m->n_series++;
    return f->last = s;
}

void gw_metrics_add(gw_metrics *m, const char *name, const char *labels, double v)
{
    if (!(v >= 0)) /* counters only go up; also NaN */
        return;
    family *f;
    series *s = get_series(m, name, GW_COUNTER, labels, &f);
    if (s)
        s->value += v;
}

double gw_metrics_sum(gw_metrics *m, const char *name, const char *prefix)
{
    family *f = find_family(m, name);
    if (!f || f->type == GW_HISTOGRAM)
        return 0;
    size_t n = strlen(prefix);
    double sum = 0;
    for (size_t i = 0; i < f->n; i++)
        if (!strncmp(f->s[i]->labels, prefix, n))
            sum += f->s[i]->value;
    return sum;
}

void gw_metrics_count_to(gw_metrics *m, const char *name, const char *labels, double total)
{
    family *f;
    series *s = get_series(m, name, GW_COUNTER, labels, &f);
    if (s && total > s->value)
        s->value = total;
}

void gw_metrics_set(gw_metrics *m, const char *name, const char *labels, double v)
{
    family *f;
    series *s = get_series(m, name, GW_GAUGE, labels, &f);
    if (s)
        s->value = v;
}

void gw_metrics_observe(gw_metrics *m, const char *name, const char *labels, double v)
{
    if (isnan(v))
        return;
    family *f;
    series *s = get_series(m, name, GW_HISTOGRAM, labels, &f);
    if (!s)
        return;
    int b = 0;
    while (b < f->n_bounds && v > f->bounds[b])
        b++;
    s->buckets[b]++;
    s->count++;
    s->sum += v;
}

void gw_metrics_clear(gw_metrics *m, const char *name)
{
    family *f = find_family(m, name);
    if (!f)
        return;
    m->n_series -= f->n;
    family_clear(f);
}

/* ---- text ---- */

void gw_metrics_escape(const char *value, char *buf, size_t cap)
{
    if (!cap)
        return;
    size_t o = 0;
    for (const char *p = value ? value : ""; *p; p++) {
        const char *rep = *p == '\\' ? "\\\\" : *p == '"' ? "\\\"" : *p == '\n' ? "\\n" : NULL;
        size_t n = rep ? 2 : 1;
        if (o + n > cap - 1) {
            /* Cut before a whole UTF-8 sequence, never inside one. */
            if (((unsigned char)*p & 0xC0) == 0x80) {
                while (o > 0 && ((unsigned char)buf[o - 1] & 0xC0) == 0x80)
                    o--;
                if (o > 0 && ((unsigned char)buf[o - 1] & 0xC0) == 0xC0)
                    o--;
            }
            break;
        }
        if (rep)
            memcpy(buf + o, rep, 2);
        else
            buf[o] = *p;
        o += n;
    }
    buf[o] = '\0';
}

typedef struct out {
    char *p;
    size_t len, cap;
    bool oom;
} out;

static void put(out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(out *o, const char *fmt, ...)
{
    if (o->oom)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(o->p + o->len, o->cap - o->len, fmt, ap);
    va_end(ap);
    if (n < 0) {
        o->oom = true;
        return;
    }
    if ((size_t)n >= o->cap - o->len) {
        size_t cap = o->cap;
        while (cap - o->len <= (size_t)n)
            cap *= 2;
        char *p = realloc(o->p, cap);
        if (!p) {
            o->oom = true;
            return;
        }
        o->p = p;
        o->cap = cap;
        va_start(ap, fmt);
        vsnprintf(o->p + o->len, o->cap - o->len, fmt, ap);
        va_end(ap);
    }
    o->len += (size_t)n;
}

/* Shortest of %.15g / %.17g that reads back exactly, in Prometheus's
 * spelling of the non-finite values. */
static const char *num(double v, char buf[32])
{
    if (isnan(v))
        return "NaN";
    if (isinf(v))
        return v > 0 ? "+Inf" : "-Inf";
    snprintf(buf, 32, "%.15g", v);
    if (strtod(buf, NULL) != v)
        snprintf(buf, 32, "%.17g", v);
    return buf;
}

/* HELP text escapes only backslash and newline. */
static void put_help(out *o, const char *name, const char *help)
{
    put(o, "# HELP %s ", name);
    for (const char *p = help; *p; p++) {
        if (*p == '\\')
            put(o, "\\\\");
        else if (*p == '\n')
            put(o, "\\n");
        else
            put(o, "%c", *p);
    }
    put(o, "\n");
}

static const char *type_name(gw_metric_type t)
{
    return t == GW_COUNTER ? "counter" : t == GW_GAUGE ? "gauge" : "histogram";
}

static void put_histogram(out *o, const family *f, const series *s)
{
    char a[32];
    const char *sep = s->labels[0] ? "," : "";
    uint64_t cum = 0;
    for (int b = 0; b <= f->n_bounds; b++) {
        cum += s->buckets[b];
        put(o, "%s_bucket{%s%sle=\"%s\"} %" PRIu64 "\n", f->name, s->labels, sep,
            b < f->n_bounds ? num(f->bounds[b], a) : "+Inf", cum);
    }
    const char *lb = s->labels[0] ? "{" : "", *rb = s->labels[0] ? "}" : "";
    put(o, "%s_sum%s%s%s %s\n", f->name, lb, s->labels, rb, num(s->sum, a));
    put(o, "%s_count%s%s%s %" PRIu64 "\n", f->name, lb, s->labels, rb, s->count);
}

char *gw_metrics_render(const gw_metrics *m, size_t *len)
{
    out o = {.cap = 4096};
    if (!(o.p = malloc(o.cap)))
        return NULL;
    o.p[0] = '\0';
    char a[32];
    for (int i = 0; i < m->n; i++) {
        const family *f = m->f[i];
        put_help(&o, f->name, f->help);
        put(&o, "# TYPE %s %s\n", f->name, type_name(f->type));
        for (size_t j = 0; j < f->n; j++) {
            const series *s = f->s[j];
            if (f->type == GW_HISTOGRAM)
                put_histogram(&o, f, s);
            else if (s->labels[0])
                put(&o, "%s{%s} %s\n", f->name, s->labels, num(s->value, a));
            else
                put(&o, "%s %s\n", f->name, num(s->value, a));
        }
    }
    put_help(&o, DROPPED_NAME, DROPPED_HELP);
    put(&o, "# TYPE %s counter\n%s %s\n", DROPPED_NAME, DROPPED_NAME, num(m->dropped, a));
    if (o.oom) {
        free(o.p);
        return NULL;
    }
    if (len)
        *len = o.len;
    return o.p;
}
