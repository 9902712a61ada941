/* Region records (see region.h): the record's Redis hash encoding, strict
 * on the way in because any gateway of the fleet (or an operator with
 * redis-cli) writes these fields, and the checks a record passes before it
 * is published or taken into a table. The table itself is table.c. */
#include "routing/region.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FIELD_VALUE_MAX ((int)sizeof(((route_field *)0)->value))
#define TAG_MAX ((int)sizeof(((route_record *)0)->tags[0]))
#define MODEL_MAX ((int)sizeof(((route_record *)0)->models[0]))

enum {
    F_ENDPOINT,
    F_MODELS,
    F_TAGS,
    F_PRICE_IN,
    F_PRICE_OUT,
    F_GPU,
    F_CAPACITY,
    F_RUNNING,
    F_QUEUED,
    F_TTFT,
    F_TPOT,
    F_MODEL_LOAD,
    F_HEALTHY,
    F_UPDATED,
    F_TTFT_EST,
    F_MODEL_EST,
    F_DRAINING,
    F_CARBON,
    F_PREFIXES,
    F_N
};

static const char *const field_names[F_N] = {"endpoint", "models",     "tags",    "price_in",  "price_out",
                                             "gpu",      "capacity",   "running", "queued",    "ttft_ms",
                                             "tpot_ms",  "model_load", "healthy", "updated_ms",
                                             "ttft_est_ms", "model_est", "draining",
                                             "carbon",   "prefixes"};

_Static_assert(F_N == ROUTE_N_FIELDS, "route_field list and ROUTE_N_FIELDS disagree");

static int fail(char *err, size_t err_len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t err_len, const char *fmt, ...)
{
    if (err && err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return -EINVAL;
}

/* ---- record -> fields ---- */

/* The shortest %g that reads back as the same double: 0.4 stays "0.4" for
 * an operator reading Redis, and nothing is lost in the round trip. */
static void fmt_num(char *out, size_t n, double x)
{
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(out, n, "%.*g", prec, x);
        if (strtod(out, NULL) == x)
            return;
    }
}

static void join(char *out, size_t n, const char *items, size_t stride, int count)
{
    size_t at = 0;
    out[0] = '\0';
    for (int i = 0; i < count; i++) {
        int w = snprintf(out + at, n - at, "%s%s", i ? "," : "", items + (size_t)i * stride);
        if (w < 0 || (size_t)w >= n - at)
            return; /* cannot happen for a checked record: the buffer holds the largest list */
        at += (size_t)w;
    }
}

static void join_load(char *out, size_t n, const route_model_load *load, int count, int64_t stamp)
{
    out[0] = '\0';
    if (!count)
        return;
    int w0 = snprintf(out, n, "%lld;", (long long)stamp);
    size_t at = w0 > 0 ? (size_t)w0 : 0;
    for (int i = 0; i < count; i++) {
        char ttft[32], tpot[32];
        fmt_num(ttft, sizeof(ttft), load[i].ttft_ms);
        fmt_num(tpot, sizeof(tpot), load[i].tpot_ms);
        int w = snprintf(out + at, n - at, "%s%d:%d:%d:%s:%s", i ? "," : "", load[i].capacity,
                         load[i].running, load[i].queued, ttft, tpot);
        if (w < 0 || (size_t)w >= n - at)
            return; /* cannot happen for a checked record: see route_field */
        at += (size_t)w;
    }
}

/* model_est: "UPDATED_MS;" and each model's est_ms. A field of its own,
 * not a sixth part of model_load's entries: a gateway that reads five
 * would refuse the whole record. */
static void join_est(char *out, size_t n, const double *est_ms, int count, int64_t stamp)
{
    out[0] = '\0';
    if (!count)
        return;
    int w0 = snprintf(out, n, "%lld;", (long long)stamp);
    size_t at = w0 > 0 ? (size_t)w0 : 0;
    for (int i = 0; i < count; i++) {
        char est[32];
        fmt_num(est, sizeof(est), est_ms[i]);
        int w = snprintf(out + at, n - at, "%s%s", i ? "," : "", est);
        if (w < 0 || (size_t)w >= n - at)
            return;
        at += (size_t)w;
    }
}

/* prefixes: "MS_PER_BYTE;" and the hashes, or empty for none. */
static void join_prefixes(char *out, size_t n, const route_record *r)
{
    out[0] = '\0';
    if (!r->n_prefixes)
        return;
    fmt_num(out, n, r->prefill_ms_per_byte);
    size_t at = strlen(out);
    for (int i = 0; i < r->n_prefixes && at + 18 < n; i++)
        at += (size_t)snprintf(out + at, n - at, "%s%016" PRIx64, i ? "," : ";", r->prefixes[i]);
}

void route_record_to_fields(const route_record *r, route_field out[ROUTE_N_FIELDS])
{
    for (int f = 0; f < F_N; f++) {
        out[f].name = field_names[f];
        out[f].value[0] = '\0';
    }
    snprintf(out[F_ENDPOINT].value, FIELD_VALUE_MAX, "%s", r->endpoint);
    join(out[F_MODELS].value, FIELD_VALUE_MAX, r->models[0], sizeof(r->models[0]), r->n_models);
    join(out[F_TAGS].value, FIELD_VALUE_MAX, r->tags[0], sizeof(r->tags[0]), r->n_tags);
    fmt_num(out[F_PRICE_IN].value, FIELD_VALUE_MAX, r->price_in);
    fmt_num(out[F_PRICE_OUT].value, FIELD_VALUE_MAX, r->price_out);
    snprintf(out[F_GPU].value, FIELD_VALUE_MAX, "%s", r->gpu);
    snprintf(out[F_CAPACITY].value, FIELD_VALUE_MAX, "%d", r->capacity);
    snprintf(out[F_RUNNING].value, FIELD_VALUE_MAX, "%d", r->running);
    snprintf(out[F_QUEUED].value, FIELD_VALUE_MAX, "%d", r->queued);
    fmt_num(out[F_TTFT].value, FIELD_VALUE_MAX, r->ttft_ms);
    fmt_num(out[F_TPOT].value, FIELD_VALUE_MAX, r->tpot_ms);
    join_load(out[F_MODEL_LOAD].value, FIELD_VALUE_MAX, r->load, r->n_load, r->updated_ms);
    snprintf(out[F_HEALTHY].value, FIELD_VALUE_MAX, "%d", r->healthy ? 1 : 0);
    snprintf(out[F_UPDATED].value, FIELD_VALUE_MAX, "%lld", (long long)r->updated_ms);
    fmt_num(out[F_TTFT_EST].value, FIELD_VALUE_MAX, r->ttft_est_ms);
    join_est(out[F_MODEL_EST].value, FIELD_VALUE_MAX, r->load_est_ms, r->n_load, r->updated_ms);
    snprintf(out[F_DRAINING].value, FIELD_VALUE_MAX, "%d", r->draining ? 1 : 0);
    fmt_num(out[F_CARBON].value, FIELD_VALUE_MAX, r->carbon);
    join_prefixes(out[F_PREFIXES].value, FIELD_VALUE_MAX, r);
}

/* ---- fields -> record ---- */

static bool has_ctl(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return true;
    return false;
}

/* Whether s is well-formed UTF-8 (no overlong forms, surrogates or code
 * points past U+10FFFF). A record's text reaches JSON (/v1/regions,
 * /v1/models), where anything else cannot be written, and a model name
 * that is not text matches no request. */
static bool utf8_ok(const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    for (size_t i = 0; i < len;) {
        unsigned c = s[i];
        size_t n = c < 0x80             ? 1
                   : (c & 0xE0) == 0xC0 ? 2
                   : (c & 0xF0) == 0xE0 ? 3
                   : (c & 0xF8) == 0xF0 ? 4
                                        : 0;
        if (n == 0 || n > len - i)
            return false;
        uint32_t cp = n == 1 ? c : c & (0x3Fu >> (n - 1));
        for (size_t k = 1; k < n; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return false;
            cp = cp << 6 | (s[i + k] & 0x3Fu);
        }
        static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += n;
    }
    return true;
}

/* Text a record may carry: UTF-8 without control characters. */
static const char *text_problem(const char *s, size_t len)
{
    if (has_ctl(s, len))
        return "control characters are not allowed";
    return utf8_ok(s, len) ? NULL : "not valid UTF-8";
}

bool route_number_parse(const char *v, double max, double *out)
{
    /* strtod also takes hex, "inf", "nan" and leading spaces: not ours. */
    size_t len = strlen(v);
    char *end;
    errno = 0;
    double x = len && strspn(v, "0123456789.eE+-") == len ? strtod(v, &end) : -1;
    if (x < 0 || errno || *end || !(x <= max))
        return false;
    *out = x;
    return true;
}

static int parse_num(const char *field, const char *v, double max, double *out, char *err, size_t err_len)
{
    if (!route_number_parse(v, max, out))
        return fail(err, err_len, "%s: must be a number from 0 to %g", field, max);
    return 0;
}

static int parse_int(const char *field, const char *v, long long max, long long *out, char *err,
                     size_t err_len)
{
    size_t len = strlen(v);
    char *end;
    errno = 0;
    long long x = len && len <= 19 && strspn(v, "0123456789") == len ? strtoll(v, &end, 10) : -1;
    if (x < 0 || errno || x > max)
        return fail(err, err_len, "%s: must be a whole number from 0 to %lld", field, max);
    *out = x;
    return 0;
}

static int parse_str(const char *field, const char *v, char *dst, size_t size, char *err, size_t err_len)
{
    size_t len = strlen(v);
    if (len >= size)
        return fail(err, err_len, "%s: longer than %zu bytes", field, size - 1);
    const char *why = text_problem(v, len);
    if (why)
        return fail(err, err_len, "%s: %s", field, why);
    memcpy(dst, v, len + 1);
    return 0;
}

/* The index of s among the first n slots of `size` bytes, or -1. */
static int find_item(const char *items, size_t size, int n, const char *s)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(items + (size_t)i * size, s))
            return i;
    return -1;
}

/* A comma-separated list into count slots of `size` bytes each, no entry
 * twice. */
static int parse_list(const char *field, const char *v, char *dst, size_t size, int max, int *count,
                      char *err, size_t err_len)
{
    int n = 0;
    if (!*v) {
        *count = 0;
        return 0;
    }
    for (const char *p = v;; n++) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (n == max)
            return fail(err, err_len, "%s: more than %d entries", field, max);
        if (len == 0)
            return fail(err, err_len, "%s: entry %d is empty", field, n + 1);
        if (len >= size)
            return fail(err, err_len, "%s: entry %d is longer than %zu bytes", field, n + 1, size - 1);
        const char *why = text_problem(p, len);
        if (why)
            return fail(err, err_len, "%s: entry %d: %s", field, n + 1, why);
        /* "eu, gdpr" would make a tag " gdpr" that no query names. */
        if (p[0] == ' ' || p[len - 1] == ' ')
            return fail(err, err_len, "%s: entry %d has leading or trailing spaces", field, n + 1);
        memcpy(dst + (size_t)n * size, p, len);
        dst[(size_t)n * size + len] = '\0';
        /* A name twice would count its load twice in a merge. */
        int twin = find_item(dst, size, n, dst + (size_t)n * size);
        if (twin >= 0)
            return fail(err, err_len, "%s: entry %d repeats entry %d", field, n + 1, twin + 1);
        if (!c)
            break;
        p = c + 1;
    }
    *count = n + 1;
    return 0;
}

/* The "UPDATED_MS;" a per-model field starts with: its stamp, and where
 * its entries begin (*rest). */
static int parse_stamp(const char *field, const char *v, long long *stamp, const char **rest, char *err,
                       size_t err_len)
{
    const char *semi = strchr(v, ';');
    char stamp_s[24];
    if (!semi || (size_t)(semi - v) >= sizeof(stamp_s))
        return fail(err, err_len, "%s: must be updated_ms;entries", field);
    memcpy(stamp_s, v, (size_t)(semi - v));
    stamp_s[semi - v] = '\0';
    if (parse_int(field, stamp_s, INT64_MAX, stamp, err, err_len))
        return -EINVAL;
    *rest = semi + 1;
    return 0;
}

/* model_load: "UPDATED_MS;" then "capacity:running:queued:ttft_ms:tpot_ms"
 * per model, comma-separated. Read after every other field: it counts
 * only when written with this record's updated_ms and with an entry per
 * model. A gateway of a version before it rewrites the other fields and
 * leaves this one as it was (HSET), so a stale one is ignored, not an
 * error: the region-wide figures then stand. */
static int parse_load(const char *field, const char *v, route_record *r, char *err, size_t err_len)
{
    route_model_load *load = r->load;
    r->n_load = 0;
    if (!*v)
        return 0;
    long long stamp;
    const char *rest;
    if (parse_stamp(field, v, &stamp, &rest, err, err_len))
        return -EINVAL;
    int n = 0;
    for (const char *p = rest; *p || n == 0; n++) {
        if (n == ROUTE_MAX_MODELS)
            return fail(err, err_len, "%s: more than %d entries", field, ROUTE_MAX_MODELS);
        char part[5][32];
        for (int k = 0; k < 5; k++) {
            size_t len = strcspn(p, k < 4 ? ":," : ",");
            if (len >= sizeof(part[k]) || (k < 4 && p[len] != ':'))
                return fail(err, err_len, "%s: entry %d must be capacity:running:queued:ttft_ms:tpot_ms",
                            field, n + 1);
            memcpy(part[k], p, len);
            part[k][len] = '\0';
            p += len + (p[len] == ':');
        }
        long long x[3];
        for (int k = 0; k < 3; k++)
            if (parse_int(field, part[k], INT_MAX, &x[k], err, err_len))
                return -EINVAL;
        route_model_load *l = &load[n];
        if (parse_num(field, part[3], ROUTE_MAX_MS, &l->ttft_ms, err, err_len) ||
            parse_num(field, part[4], ROUTE_MAX_MS, &l->tpot_ms, err, err_len))
            return -EINVAL;
        l->capacity = (int)x[0];
        l->running = (int)x[1];
        l->queued = (int)x[2];
        if (*p == ',' && !*++p)
            return fail(err, err_len, "%s: entry %d is empty", field, n + 2);
    }
    if (stamp == r->updated_ms && n == r->n_models)
        r->n_load = n;
    return 0;
}

/* model_est, read after model_load: taken when its stamp is the record's
 * updated_ms and it has an entry per model of a model_load taken; else
 * (or when missing: an older writer) every load_est_ms is 0, not given. */
static int parse_est(const char *field, const char *v, route_record *r, char *err, size_t err_len)
{
    double est[ROUTE_MAX_MODELS];
    for (int i = 0; i < ROUTE_MAX_MODELS; i++)
        r->load_est_ms[i] = 0;
    if (!*v)
        return 0;
    char part[32];
    long long stamp;
    const char *rest;
    if (parse_stamp(field, v, &stamp, &rest, err, err_len))
        return -EINVAL;
    int n = 0;
    for (const char *p = rest; *p || n == 0; n++) {
        size_t len = strcspn(p, ",");
        if (n == ROUTE_MAX_MODELS)
            return fail(err, err_len, "%s: more than %d entries", field, ROUTE_MAX_MODELS);
        if (len >= sizeof(part))
            return fail(err, err_len, "%s: entry %d is too long", field, n + 1);
        memcpy(part, p, len);
        part[len] = '\0';
        if (parse_num(field, part, ROUTE_MAX_MS, &est[n], err, err_len))
            return -EINVAL;
        p += len;
        if (*p == ',' && !*++p)
            return fail(err, err_len, "%s: entry %d is empty", field, n + 2);
    }
    if (stamp == r->updated_ms && n == r->n_load)
        for (int i = 0; i < n; i++)
            r->load_est_ms[i] = est[i];
    return 0;
}

/* prefixes, read last: empty or missing (an older writer) is none. */
static int parse_prefixes(const char *field, const char *v, route_record *r, char *err, size_t err_len)
{
    r->n_prefixes = 0;
    r->prefill_ms_per_byte = 0;
    if (!*v)
        return 0;
    const char *semi = strchr(v, ';');
    char num[32];
    size_t nl = semi ? (size_t)(semi - v) : 0;
    if (!semi || nl == 0 || nl >= sizeof(num))
        return fail(err, err_len, "%s: want MS_PER_BYTE;HASH,...", field);
    memcpy(num, v, nl);
    num[nl] = '\0';
    double ms;
    if (parse_num(field, num, ROUTE_MAX_MS, &ms, err, err_len))
        return -EINVAL;
    uint64_t h[ROUTE_MAX_PREFIXES];
    int n = 0;
    for (const char *p = semi + 1;; p++) {
        if (n == ROUTE_MAX_PREFIXES)
            return fail(err, err_len, "%s: more than %d hashes", field, ROUTE_MAX_PREFIXES);
        if (strspn(p, "0123456789abcdef") != 16 || (p[16] != ',' && p[16] != '\0'))
            return fail(err, err_len, "%s: hash %d is not 16 lowercase hex digits", field, n + 1);
        h[n] = strtoull(p, NULL, 16);
        if (n > 0 && h[n] <= h[n - 1])
            return fail(err, err_len, "%s: hash %d is not above the one before", field, n + 1);
        n++;
        p += 16;
        if (!*p)
            break;
    }
    memcpy(r->prefixes, h, (size_t)n * sizeof(h[0]));
    r->n_prefixes = n;
    r->prefill_ms_per_byte = ms;
    return 0;
}

static int parse_field(route_record *r, int f, const char *v, char *err, size_t err_len)
{
    const char *name = field_names[f];
    long long x;
    int rc = 0;
    switch (f) {
    case F_ENDPOINT: {
        if ((rc = parse_str(name, v, r->endpoint, sizeof(r->endpoint), err, err_len)))
            return rc;
        const char *why = *v ? route_endpoint_check(v) : NULL;
        return why ? fail(err, err_len, "%s: %s", name, why) : 0;
    }
    case F_GPU:
        return parse_str(name, v, r->gpu, sizeof(r->gpu), err, err_len);
    case F_MODELS:
        return parse_list(name, v, r->models[0], sizeof(r->models[0]), ROUTE_MAX_MODELS, &r->n_models, err,
                          err_len);
    case F_TAGS:
        return parse_list(name, v, r->tags[0], sizeof(r->tags[0]), ROUTE_MAX_TAGS, &r->n_tags, err, err_len);
    case F_PRICE_IN:
        return parse_num(name, v, ROUTE_MAX_PRICE, &r->price_in, err, err_len);
    case F_PRICE_OUT:
        return parse_num(name, v, ROUTE_MAX_PRICE, &r->price_out, err, err_len);
    case F_TTFT:
        return parse_num(name, v, ROUTE_MAX_MS, &r->ttft_ms, err, err_len);
    case F_TPOT:
        return parse_num(name, v, ROUTE_MAX_MS, &r->tpot_ms, err, err_len);
    case F_MODEL_LOAD:
        return parse_load(name, v, r, err, err_len);
    case F_MODEL_EST:
        return parse_est(name, v, r, err, err_len);
    case F_PREFIXES:
        return parse_prefixes(name, v, r, err, err_len);
    case F_TTFT_EST:
        return parse_num(name, v, ROUTE_MAX_MS, &r->ttft_est_ms, err, err_len);
    case F_CARBON:
        return parse_num(name, v, ROUTE_MAX_CARBON, &r->carbon, err, err_len);
    case F_CAPACITY:
    case F_RUNNING:
    case F_QUEUED:
        if ((rc = parse_int(name, v, INT_MAX, &x, err, err_len)))
            return rc;
        *(f == F_CAPACITY ? &r->capacity : f == F_RUNNING ? &r->running : &r->queued) = (int)x;
        return 0;
    case F_HEALTHY:
    case F_DRAINING:
        if (strcmp(v, "0") && strcmp(v, "1"))
            return fail(err, err_len, "%s: must be 0 or 1", name);
        *(f == F_HEALTHY ? &r->healthy : &r->draining) = v[0] == '1';
        return 0;
    case F_UPDATED:
        if ((rc = parse_int(name, v, INT64_MAX, &x, err, err_len)))
            return rc;
        r->updated_ms = (int64_t)x;
        return 0;
    }
    return 0;
}

int route_record_from_fields(route_record *r, const char *const *names, const char *const *values,
                             const size_t *lens, int n, char *err, size_t err_len)
{
    /* Parsed into a copy: a bad field leaves the caller's record whole. */
    route_record tmp = *r;
    char buf[FIELD_VALUE_MAX], load[FIELD_VALUE_MAX] = "", est[FIELD_VALUE_MAX] = "", pre[FIELD_VALUE_MAX] = "";
    for (int i = 0; i < n; i++) {
        int f = 0;
        while (f < F_N && strcmp(names[i], field_names[f]))
            f++;
        if (f == F_N)
            continue;
        size_t len = lens ? lens[i] : strlen(values[i]);
        if (len >= sizeof(buf))
            return fail(err, err_len, "%s: longer than %d bytes", field_names[f], FIELD_VALUE_MAX - 1);
        if (memchr(values[i], '\0', len))
            return fail(err, err_len, "%s: contains a NUL byte", field_names[f]);
        char *to = f == F_MODEL_LOAD ? load : f == F_MODEL_EST ? est : f == F_PREFIXES ? pre : buf;
        memcpy(to, values[i], len);
        to[len] = '\0';
        int rc = to != buf ? 0 : parse_field(&tmp, f, buf, err, err_len);
        if (rc)
            return rc;
    }
    /* Last, against this record's updated_ms and models; a record read
     * without it has none. */
    int rc = parse_field(&tmp, F_MODEL_LOAD, load, err, err_len);
    if (!rc)
        rc = parse_field(&tmp, F_MODEL_EST, est, err, err_len);
    if (!rc)
        rc = parse_field(&tmp, F_PREFIXES, pre, err, err_len);
    if (rc)
        return rc;
    *r = tmp;
    return 0;
}

/* ---- checks ---- */

const char *route_host_port(const char *s, char host[ROUTE_HOST_MAX], int *port)
{
    const char *ps;
    size_t hl;
    if (s[0] == '[') {
        const char *end = strchr(s, ']');
        if (!end || end[1] != ':')
            return "want HOST:PORT or [IPV6]:PORT";
        hl = (size_t)(end - s - 1);
        if (hl >= ROUTE_HOST_MAX)
            return "not a numeric IPv6 address";
        memcpy(host, s + 1, hl);
        ps = end + 2;
    } else {
        const char *colon = strrchr(s, ':');
        if (!colon)
            return "want HOST:PORT or [IPV6]:PORT";
        hl = (size_t)(colon - s);
        if (hl >= ROUTE_HOST_MAX)
            return "HOST must be a numeric IPv4 address, [IPv6] or localhost";
        memcpy(host, s, hl);
        ps = colon + 1;
    }
    host[hl] = '\0';
    size_t nd = strspn(ps, "0123456789");
    if (nd == 0 || nd > 5 || ps[nd] || atol(ps) < 1 || atol(ps) > 65535)
        return "port must be a number from 1 to 65535";
    *port = (int)atol(ps);
    unsigned char a[16];
    if (s[0] == '[')
        return inet_pton(AF_INET6, host, a) == 1 ? NULL : "not a numeric IPv6 address";
    if (strcmp(host, "localhost") && inet_pton(AF_INET, host, a) != 1)
        return "HOST must be a numeric IPv4 address, [IPv6] or localhost: names are not resolved";
    return NULL;
}

const char *route_endpoint_check(const char *endpoint)
{
    if (strncmp(endpoint, "tls:", 4) && strncmp(endpoint, "tcp:", 4))
        return "must be tls:HOST:PORT or tcp:HOST:PORT";
    if (strlen(endpoint) >= sizeof(((route_record *)0)->endpoint))
        return "too long";
    char host[ROUTE_HOST_MAX];
    int port;
    return route_host_port(endpoint + 4, host, &port);
}

static int check_str(const char *field, const char *s, size_t size, bool need, char *err, size_t err_len)
{
    const char *nul = memchr(s, '\0', size);
    if (!nul)
        return fail(err, err_len, "%s: not terminated within %zu bytes", field, size);
    if (need && nul == s)
        return fail(err, err_len, "%s: empty", field);
    const char *why = text_problem(s, (size_t)(nul - s));
    return why ? fail(err, err_len, "%s: %s", field, why) : 0;
}

static int check_list(const char *field, const char *items, size_t size, int n, int max, char *err,
                      size_t err_len)
{
    if (n < 0 || n > max)
        return fail(err, err_len, "%s: count %d is not within 0..%d", field, n, max);
    for (int i = 0; i < n; i++) {
        const char *s = items + (size_t)i * size;
        char name[48];
        snprintf(name, sizeof(name), "%s[%d]", field, i);
        int rc = check_str(name, s, size, true, err, err_len);
        if (rc)
            return rc;
        if (strchr(s, ','))
            return fail(err, err_len, "%s: contains a comma", name);
        if (s[0] == ' ' || s[strlen(s) - 1] == ' ')
            return fail(err, err_len, "%s: has leading or trailing spaces", name);
        int twin = find_item(items, size, i, s);
        if (twin >= 0)
            return fail(err, err_len, "%s: repeats %s[%d]", name, field, twin);
    }
    return 0;
}

int route_record_check(const route_record *r, char *err, size_t err_len)
{
    int rc;
    if ((rc = check_str("name", r->name, sizeof(r->name), true, err, err_len)) ||
        (rc = check_str("endpoint", r->endpoint, sizeof(r->endpoint), false, err, err_len)) ||
        (rc = check_str("gpu", r->gpu, sizeof(r->gpu), false, err, err_len)) ||
        (rc = check_list("models", r->models[0], sizeof(r->models[0]), r->n_models, ROUTE_MAX_MODELS, err,
                         err_len)) ||
        (rc = check_list("tags", r->tags[0], sizeof(r->tags[0]), r->n_tags, ROUTE_MAX_TAGS, err, err_len)))
        return rc;
    const char *why = r->endpoint[0] ? route_endpoint_check(r->endpoint) : NULL;
    if (why)
        return fail(err, err_len, "endpoint: %s", why);
    const double nums[] = {r->price_in, r->price_out, r->ttft_ms, r->tpot_ms, r->ttft_est_ms, r->carbon};
    static const char *const num_names[] = {"price_in", "price_out", "ttft_ms", "tpot_ms", "ttft_est_ms",
                                            "carbon"};
    for (int i = 0; i < 6; i++) {
        double max = i < 2 ? ROUTE_MAX_PRICE : i < 5 ? ROUTE_MAX_MS : ROUTE_MAX_CARBON;
        if (!(nums[i] >= 0 && nums[i] <= max))
            return fail(err, err_len, "%s: must be a number from 0 to %g", num_names[i], max);
    }
    if (r->capacity < 0 || r->running < 0 || r->queued < 0)
        return fail(err, err_len, "%s: must not be negative",
                    r->capacity < 0  ? "capacity"
                    : r->running < 0 ? "running"
                                     : "queued");
    if (r->n_load != 0 && r->n_load != r->n_models)
        return fail(err, err_len, "model_load: %d entries for %d models", r->n_load, r->n_models);
    for (int i = 0; i < r->n_load; i++) {
        const route_model_load *l = &r->load[i];
        if (l->capacity < 0 || l->running < 0 || l->queued < 0 ||
            !(l->ttft_ms >= 0 && l->ttft_ms <= ROUTE_MAX_MS) ||
            !(l->tpot_ms >= 0 && l->tpot_ms <= ROUTE_MAX_MS) ||
            !(r->load_est_ms[i] >= 0 && r->load_est_ms[i] <= ROUTE_MAX_MS))
            return fail(err, err_len, "model_load[%d]: counts must not be negative, times within 0..%g", i,
                        ROUTE_MAX_MS);
    }
    if (r->updated_ms < 0)
        return fail(err, err_len, "updated_ms: must not be negative");
    if (r->instances < 0 || r->instances > ROUTE_MAX_INSTANCES)
        return fail(err, err_len, "instances: %d is not within 0..%d", r->instances, ROUTE_MAX_INSTANCES);
    if (r->n_prefixes < 0 || r->n_prefixes > ROUTE_MAX_PREFIXES ||
        !(r->prefill_ms_per_byte >= 0 && r->prefill_ms_per_byte <= ROUTE_MAX_MS))
        return fail(err, err_len, "prefixes: %d hashes (at most %d), %g ms a byte (0..%g)", r->n_prefixes,
                    ROUTE_MAX_PREFIXES, r->prefill_ms_per_byte, ROUTE_MAX_MS);
    for (int i = 1; i < r->n_prefixes; i++)
        if (r->prefixes[i] <= r->prefixes[i - 1])
            return fail(err, err_len, "prefixes: not ascending at %d", i + 1);
    return 0;
}
