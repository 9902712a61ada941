/* Tests of the routing core (routing/region.h, routing/router.h), no
 * sockets: the record's Redis fields (round trip, and a table of bad values
 * each naming its field), the table (upsert, remove, freshness, RTT), every
 * filter on its own, the latency order with its ties, queue growth and RTT
 * changes moving a region, the cost policy, ejection with back-off doubling
 * and a single probe, the local region, and 256 random regions checked
 * against a brute-force ordering of the documented rules. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "gateway/base/prefix.h"
#include "routing/region.h"
#include "routing/router.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const route_table_opts opts = {.stale_after_ms = 3000,
                                      .eject_after = 3,
                                      .eject_base_ms = 1000,
                                      .eject_max_ms = 8000,
                                      .probe_timeout_ms = 5000};

/* A region serving the comma-separated models, with tags, an output price
 * and an idle queue whose estimate is exactly ttft_ms. */
static route_record mk(const char *name, const char *models, const char *tags, double price_out,
                       double ttft_ms)
{
    route_record r;
    memset(&r, 0, sizeof(r));
    snprintf(r.name, sizeof(r.name), "%s", name);
    snprintf(r.endpoint, sizeof(r.endpoint), "tls:10.0.0.1:8443");
    const char *names[] = {"models", "tags"};
    const char *values[] = {models, tags};
    char err[128];
    assert_int_equal(route_record_from_fields(&r, names, values, NULL, 2, err, sizeof(err)), 0);
    r.price_in = price_out / 4;
    r.price_out = price_out;
    r.capacity = 8;
    r.ttft_ms = ttft_ms;
    r.tpot_ms = 1;
    r.healthy = true;
    r.updated_ms = 1;
    return r;
}

static void add(route_table *t, const route_record *r, double rtt_ms, int64_t now)
{
    assert_int_equal(route_table_upsert(t, r, false, now), 0);
    route_table_set_rtt(t, r->name, rtt_ms, rtt_ms * 1.5);
}

static route_query query(const char *model, int64_t now)
{
    route_query q = {.model = model, .policy = ROUTE_LATENCY, .now_ms = now};
    return q;
}

static const char *cand(const route_decision *d, int i)
{
    return i < d->n ? d->cand[i]->rec.name : "(none)";
}

/* ---- fields ---- */

static void fields_to_arrays(const route_field *f, const char **names, const char **values, size_t *lens)
{
    for (int i = 0; i < ROUTE_N_FIELDS; i++) {
        names[i] = f[i].name;
        values[i] = f[i].value;
        lens[i] = strlen(f[i].value);
    }
}

static void assert_record_equal(const route_record *a, const route_record *b)
{
    assert_string_equal(a->name, b->name);
    assert_string_equal(a->endpoint, b->endpoint);
    assert_int_equal(a->n_models, b->n_models);
    for (int i = 0; i < a->n_models; i++)
        assert_string_equal(a->models[i], b->models[i]);
    assert_int_equal(a->n_tags, b->n_tags);
    for (int i = 0; i < a->n_tags; i++)
        assert_string_equal(a->tags[i], b->tags[i]);
    assert_true(a->price_in == b->price_in && a->price_out == b->price_out);
    assert_string_equal(a->gpu, b->gpu);
    assert_int_equal(a->capacity, b->capacity);
    assert_int_equal(a->running, b->running);
    assert_int_equal(a->queued, b->queued);
    assert_true(a->ttft_ms == b->ttft_ms && a->tpot_ms == b->tpot_ms);
    assert_true(a->carbon == b->carbon);
    assert_int_equal(a->n_load, b->n_load);
    for (int i = 0; i < a->n_load; i++) {
        assert_int_equal(a->load[i].capacity, b->load[i].capacity);
        assert_int_equal(a->load[i].running, b->load[i].running);
        assert_int_equal(a->load[i].queued, b->load[i].queued);
        assert_true(a->load[i].ttft_ms == b->load[i].ttft_ms && a->load[i].tpot_ms == b->load[i].tpot_ms);
    }
    assert_int_equal(a->healthy, b->healthy);
    assert_int_equal(a->updated_ms, b->updated_ms);
    assert_int_equal(a->n_prefixes, b->n_prefixes);
    assert_true(a->prefill_ms_per_byte == b->prefill_ms_per_byte || !a->n_prefixes);
    for (int i = 0; i < a->n_prefixes; i++)
        assert_true(a->prefixes[i] == b->prefixes[i]);
}

static void round_trip(const route_record *in)
{
    route_field f[ROUTE_N_FIELDS];
    const char *names[ROUTE_N_FIELDS], *values[ROUTE_N_FIELDS];
    size_t lens[ROUTE_N_FIELDS];
    assert_int_equal(route_record_check(in, NULL, 0), 0);
    route_record_to_fields(in, f);
    fields_to_arrays(f, names, values, lens);
    route_record out;
    memset(&out, 0, sizeof(out));
    strcpy(out.name, in->name);
    char err[128] = "";
    int rc = route_record_from_fields(&out, names, values, lens, ROUTE_N_FIELDS, err, sizeof(err));
    if (rc)
        fail_msg("from_fields: %d %s", rc, err);
    assert_record_equal(in, &out);
}

static void test_fields_round_trip(void **state)
{
    route_record r = mk("eu-west", "llama-7b,tiny", "eu,gdpr", 0.4, 120.5);
    strcpy(r.gpu, "H100 80GB (MIG 3g.40gb)");
    r.price_in = 1.0 / 3;
    r.tpot_ms = 1e-300;
    r.capacity = 2147483647;
    r.running = 17;
    r.queued = 123456;
    r.updated_ms = 1732280000123;
    r.carbon = 123.5;
    round_trip(&r);
    r.n_load = 2;
    r.load[0] = (route_model_load){8, 3, 1, 40.25, 6.5};
    r.load[1] = (route_model_load){2147483647, 0, 0, 1.0 / 3, 1e-300};
    round_trip(&r);

    /* Shortest form that reads back: what an operator sees in redis-cli. */
    route_field f[ROUTE_N_FIELDS];
    route_record_to_fields(&r, f);
    assert_string_equal(f[0].name, "endpoint");
    assert_string_equal(f[0].value, "tls:10.0.0.1:8443");
    assert_string_equal(f[1].value, "llama-7b,tiny");
    assert_string_equal(f[2].value, "eu,gdpr");
    assert_string_equal(f[4].name, "price_out");
    assert_string_equal(f[4].value, "0.4");
    assert_string_equal(f[12].value, "1");
    assert_string_equal(f[11].name, "model_load");
    assert_string_equal(f[11].value,
                        "1732280000123;8:3:1:40.25:6.5,2147483647:0:0:0.3333333333333333:1e-300");
    assert_string_equal(f[13].value, "1732280000123");

    /* Every list and string at its largest. */
    memset(&r, 0, sizeof(r));
    memset(r.name, 'n', sizeof(r.name) - 1);
    /* the longest endpoint route_endpoint_check allows */
    strcpy(r.endpoint, "tcp:[0000:0000:0000:0000:0000:ffff:255.255.255.255]:65535");
    memset(r.gpu, 'g', sizeof(r.gpu) - 1);
    for (int i = 0; i < ROUTE_MAX_MODELS; i++) {
        memset(r.models[i], 'a' + i, sizeof(r.models[i]) - 1);
        r.models[i][sizeof(r.models[i]) - 1] = '\0';
    }
    for (int i = 0; i < ROUTE_MAX_TAGS; i++) {
        memset(r.tags[i], 'a' + i, sizeof(r.tags[i]) - 1);
        r.tags[i][sizeof(r.tags[i]) - 1] = '\0';
    }
    r.n_models = ROUTE_MAX_MODELS;
    r.n_tags = ROUTE_MAX_TAGS;
    r.price_out = ROUTE_MAX_PRICE;
    r.ttft_ms = r.tpot_ms = ROUTE_MAX_MS;
    /* each model_load entry at its longest (route_field's bound) */
    r.n_load = ROUTE_MAX_MODELS;
    for (int i = 0; i < ROUTE_MAX_MODELS; i++)
        r.load[i] = (route_model_load){2147483647, 2147483647, 2147483647, 1.2345678901234567e-300,
                                       1.2345678901234567e-300};
    r.healthy = false;
    round_trip(&r);
    r.updated_ms = INT64_MAX;
    round_trip(&r);
    route_record_to_fields(&r, f);
    assert_int_equal(strlen(f[11].value), 20 + 16 * 81 - 1);

    /* Empty lists, zeros. */
    memset(&r, 0, sizeof(r));
    strcpy(r.name, "z");
    round_trip(&r);
}

static const struct {
    const char *field, *value, *want;
} bad_fields[] = {
    {"price_in", "abc", "price_in: must be a number from 0 to 1e+09"},
    {"price_in", "", "price_in: must be a number from 0 to 1e+09"},
    {"price_out", "-1", "price_out: must be a number from 0 to 1e+09"},
    {"price_out", "inf", "price_out: must be a number from 0 to 1e+09"},
    {"price_out", "nan", "price_out: must be a number from 0 to 1e+09"},
    {"price_out", "0x10", "price_out: must be a number from 0 to 1e+09"},
    {"price_out", "1e999", "price_out: must be a number from 0 to 1e+09"},
    {"price_out", " 1", "price_out: must be a number from 0 to 1e+09"},
    {"price_out", "1.5.5", "price_out: must be a number from 0 to 1e+09"},
    {"ttft_ms", "12ms", "ttft_ms: must be a number from 0 to 1e+07"},
    {"tpot_ms", "-0.5", "tpot_ms: must be a number from 0 to 1e+07"},
    {"capacity", "1.5", "capacity: must be a whole number from 0 to 2147483647"},
    {"capacity", "-3", "capacity: must be a whole number"},
    {"running", "2147483648", "running: must be a whole number"},
    {"queued", "", "queued: must be a whole number"},
    {"queued", "99999999999999999999999", "queued: must be a whole number"},
    {"healthy", "yes", "healthy: must be 0 or 1"},
    {"healthy", "", "healthy: must be 0 or 1"},
    {"updated_ms", "-1", "updated_ms: must be a whole number"},
    {"updated_ms", "9223372036854775808", "updated_ms: must be a whole number"},
    {"models", "a,,b", "models: entry 2 is empty"},
    {"models", "a,", "models: entry 2 is empty"},
    {"models", ",a", "models: entry 1 is empty"},
    {"models", "a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q", "models: more than 16 entries"},
    {"models", "m,aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
     "models: entry 2 is longer than 63 bytes"},
    {"tags", "a,b,c,d,e,f,g,h,i", "tags: more than 8 entries"},
    {"tags", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "tags: entry 1 is longer than 31 bytes"},
    {"tags", "eu, gdpr", "tags: entry 2 has leading or trailing spaces"},
    {"tags", "eu\tus", "tags: entry 1: control characters are not allowed"},
    {"tags", "eu,\xff", "tags: entry 2: not valid UTF-8"},
    {"models", "m\xc0\xaf", "models: entry 1: not valid UTF-8"},     /* overlong '/' */
    {"models", "m\xed\xa0\x80", "models: entry 1: not valid UTF-8"}, /* a surrogate */
    {"gpu", "H100 \xe2\x82", "gpu: not valid UTF-8"},                /* cut short */
    {"endpoint",
     "tls:"
     "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
     "aaaaaaaaaaa"
     "aaaaaaaaaaa:1",
     "endpoint: longer than 127 bytes"},
    {"gpu", "H100\n", "gpu: control characters are not allowed"},
    {"price_out", "1000000001", "price_out: must be a number from 0 to 1e+09"},
    {"ttft_ms", "1e300", "ttft_ms: must be a number from 0 to 1e+07"},
    {"tpot_ms", "10000000.5", "tpot_ms: must be a number from 0 to 1e+07"},
    {"endpoint", "unix:/tmp/w.sock", "endpoint: must be tls:HOST:PORT or tcp:HOST:PORT"},
    {"endpoint", "tls:peer.example:443", "endpoint: HOST must be a numeric IPv4 address"},
    {"model_load", "1;1:2:3:4", "model_load: entry 1 must be capacity:running:queued:ttft_ms:tpot_ms"},
    {"model_load", "1;1:2:3:4:5:6", "model_load: must be a number from 0 to 1e+07"},
    {"model_load", "1;1,2:3:4:5", "model_load: entry 1 must be"},
    {"model_load", "1;1:2:3:4:5,", "model_load: entry 2 is empty"},
    {"model_load", "1;", "model_load: entry 1 must be"},
    {"model_load", "1;-1:2:3:4:5", "model_load: must be a whole number"},
    {"model_load", "1;1:2:2147483648:4:5", "model_load: must be a whole number"},
    {"model_load", "1;1:2:3:inf:5", "model_load: must be a number"},
    {"model_load", "1;1:2:3:4:1e8", "model_load: must be a number from 0 to 1e+07"},
    {"model_load", "1;1:2:3:4:000000000000000000000000000000001", "model_load: entry 1 must be"},
    {"model_load", "1:2:3:4:5", "model_load: must be updated_ms;entries"},
    {"model_load", "x;1:2:3:4:5", "model_load: must be a whole number"},
    {"model_load", "00000000000000000000001;1:2:3:4:5", "model_load: must be a whole number"},
    {"model_load", "000000000000000000000000001;1:2:3:4:5", "model_load: must be updated_ms;entries"},
};

static void test_fields_bad(void **state)
{
    int failed = 0;
    for (size_t i = 0; i < sizeof(bad_fields) / sizeof(*bad_fields); i++) {
        route_record r = mk("a", "m1", "eu", 1, 10), before;
        memcpy(&before, &r, sizeof(r));
        const char *names[] = {"endpoint", bad_fields[i].field};
        const char *values[] = {"tcp:127.0.0.1:1", bad_fields[i].value};
        char err[160] = "";
        int rc = route_record_from_fields(&r, names, values, NULL, 2, err, sizeof(err));
        if (rc != -EINVAL || strncmp(err, bad_fields[i].want, strlen(bad_fields[i].want)) ||
            memcmp(&r, &before, sizeof(r))) {
            print_error("case %zu: rc %d err \"%s\" want \"%s\"\n", i, rc, err, bad_fields[i].want);
            failed++;
        }
    }
    assert_int_equal(failed, 0);

    route_record r = mk("a", "m1", "eu", 1, 10);
    char err[160] = "";
    /* lens are honoured: a NUL inside the value, a value longer than any field. */
    const char *names[] = {"gpu"};
    const char *values[] = {"H1\0000"};
    size_t lens[] = {4};
    assert_int_equal(route_record_from_fields(&r, names, values, lens, 1, err, sizeof(err)), -EINVAL);
    assert_string_equal(err, "gpu: contains a NUL byte");
    static char big[2000];
    memset(big, '1', sizeof(big) - 1);
    values[0] = big;
    names[0] = "capacity";
    assert_int_equal(route_record_from_fields(&r, names, values, NULL, 1, err, sizeof(err)), -EINVAL);
    assert_string_equal(err, "capacity: longer than 1399 bytes");
    /* Only len bytes are read. */
    values[0] = "12345";
    lens[0] = 2;
    assert_int_equal(route_record_from_fields(&r, names, values, lens, 1, err, sizeof(err)), 0);
    assert_int_equal(r.capacity, 12);
    /* model_load counts only when written with the record's updated_ms
     * and with an entry per model: a gateway of an older version rewrites
     * the other fields and leaves it behind, which is no error. */
    const char *nl[] = {"models", "updated_ms", "model_load"};
    const char *vl[] = {"m1,m2", "77", "77;4:1:0:10:2,8:0:0:20:3"};
    assert_int_equal(route_record_from_fields(&r, nl, vl, NULL, 3, err, sizeof(err)), 0);
    assert_int_equal(r.n_load, 2);
    assert_int_equal(r.load[1].capacity, 8);
    vl[1] = "78"; /* rewritten by an older gateway */
    assert_int_equal(route_record_from_fields(&r, nl, vl, NULL, 3, err, sizeof(err)), 0);
    assert_int_equal(r.n_load, 0);
    vl[1] = "77";
    vl[0] = "m1"; /* its models changed since */
    assert_int_equal(route_record_from_fields(&r, nl, vl, NULL, 3, err, sizeof(err)), 0);
    assert_int_equal(r.n_load, 0);
    vl[0] = "m1,m2";
    assert_int_equal(route_record_from_fields(&r, nl, vl, NULL, 2, err, sizeof(err)), 0); /* none given */
    assert_int_equal(r.n_load, 0);
    /* Unknown fields are ignored, missing ones kept; no err buffer is fine. */
    const char *n2[] = {"future_field", "queued"};
    const char *v2[] = {"whatever, really", "7"};
    assert_int_equal(route_record_from_fields(&r, n2, v2, NULL, 2, NULL, 0), 0);
    assert_int_equal(r.queued, 7);
    assert_string_equal(r.models[0], "m1");
    v2[1] = "x";
    assert_int_equal(route_record_from_fields(&r, n2, v2, NULL, 2, NULL, 0), -EINVAL);

    /* route_record_check: what a table or a publisher refuses. */
    route_record c = mk("a", "m1", "eu", 1, 10);
    strcpy(c.models[0], "a,b");
    assert_int_equal(route_record_check(&c, err, sizeof(err)), -EINVAL);
    assert_string_equal(err, "models[0]: contains a comma");
    c = mk("a", "m1", "eu", 1, 10);
    c.n_tags = 9;
    assert_int_equal(route_record_check(&c, err, sizeof(err)), -EINVAL);
    assert_string_equal(err, "tags: count 9 is not within 0..8");
    c = mk("a", "m1", "eu", 1, 10);
    c.price_in = NAN;
    assert_int_equal(route_record_check(&c, err, sizeof(err)), -EINVAL);
    assert_string_equal(err, "price_in: must be a number from 0 to 1e+09");
    c = mk("a", "m1", "eu", 1, 10);
    memset(c.name, 'x', sizeof(c.name));
    assert_int_equal(route_record_check(&c, err, sizeof(err)), -EINVAL);
    assert_string_equal(err, "name: not terminated within 64 bytes");
    c = mk("", "m1", "eu", 1, 10);
    assert_int_equal(route_record_check(&c, err, sizeof(err)), -EINVAL);
    assert_string_equal(err, "name: empty");
    c = mk("a", "m1", "eu", 1, 10);
    c.queued = -1;
    assert_int_equal(route_record_check(&c, err, sizeof(err)), -EINVAL);
    assert_string_equal(err, "queued: must not be negative");
}

/* ---- the table ---- */

static void test_table(void **state)
{
    route_table *t = route_table_new(&opts, 3);
    assert_non_null(t);
    assert_null(route_table_new(&opts, 0));
    route_record a = mk("a", "m", "", 1, 10), b = mk("b", "m", "", 1, 10), c = mk("c", "m", "", 1, 10);
    route_record d = mk("d", "m", "", 1, 10);
    assert_int_equal(route_table_upsert(t, &a, false, 100), 0);
    assert_int_equal(route_table_upsert(t, &b, false, 100), 0);
    assert_int_equal(route_table_upsert(t, &c, false, 100), 0);
    assert_int_equal(route_table_upsert(t, &d, false, 100), -ENOSPC);
    assert_int_equal(route_table_count(t), 3);
    assert_string_equal(route_table_at(t, 1)->rec.name, "b");
    assert_null(route_table_at(t, 3));
    assert_null(route_table_find(t, "d"));
    route_region *rb = route_table_find(t, "b");
    assert_non_null(rb);
    assert_false(rb->rtt_known);
    assert_true(route_expected_ms(rb) == ROUTE_UNKNOWN_RTT_MS + 10);

    /* An invalid record is refused. */
    route_record bad = mk("e", "m", "", 1, 10);
    bad.n_models = -1;
    assert_int_equal(route_table_upsert(t, &bad, false, 100), -EINVAL);
    /* Numbers past their bounds: the router's arithmetic on them must stay
     * finite (1e300 ms once sorted first). */
    bad = mk("e", "m", "", 1, 10);
    bad.ttft_ms = 1e300;
    assert_int_equal(route_table_upsert(t, &bad, false, 100), -EINVAL);
    bad.ttft_ms = ROUTE_MAX_MS;
    bad.price_out = ROUTE_MAX_PRICE * 2;
    assert_int_equal(route_table_upsert(t, &bad, false, 100), -EINVAL);
    /* An endpoint is tls: or tcp: with a numeric host: a record from Redis
     * must not point this gateway at a local socket or a name to resolve. */
    static const char *const endpoints[][2] = {
        {"", "ok"},
        {"tls:10.0.0.1:8443", "ok"},
        {"tcp:[::1]:80", "ok"},
        {"tls:localhost:1", "ok"},
        {"unix:/run/infergate/worker-0.sock", "must be tls:HOST:PORT or tcp:HOST:PORT"},
        {"tls:example.com:443",
         "HOST must be a numeric IPv4 address, [IPv6] or localhost: names are not resolved"},
        {"tls:10.0.0.1:0", "port must be a number from 1 to 65535"},
        {"tls:10.0.0.1", "want HOST:PORT or [IPV6]:PORT"},
    };
    for (size_t i = 0; i < sizeof(endpoints) / sizeof(endpoints[0]); i++) {
        bad = mk("e", "m", "", 1, 10);
        snprintf(bad.endpoint, sizeof(bad.endpoint), "%s", endpoints[i][0]);
        bool ok = !strcmp(endpoints[i][1], "ok");
        char err[160] = "";
        assert_int_equal(route_record_check(&bad, err, sizeof(err)), ok ? 0 : -EINVAL);
        if (!ok) {
            char want[160];
            snprintf(want, sizeof(want), "endpoint: %s", endpoints[i][1]);
            assert_string_equal(err, want);
        }
        const char *name = "endpoint", *value = endpoints[i][0];
        route_record r2 = mk("e", "m", "", 1, 10);
        assert_int_equal(route_record_from_fields(&r2, &name, &value, NULL, 1, err, sizeof(err)),
                         ok ? 0 : -EINVAL);
    }

    /* RTT: bad values and unknown names ignored. */
    route_table_set_rtt(t, "b", 7.5, 9);
    route_table_set_rtt(t, "b", NAN, 9);
    route_table_set_rtt(t, "b", -1, 9);
    route_table_set_rtt(t, "zz", 1, 1);
    assert_true(rb->rtt_known && rb->rtt_ewma_ms == 7.5 && rb->rtt_p95_ms == 9);

    /* Replacing keeps RTT and failures; seen_ms moves only with updated_ms. */
    route_region_report(t, rb, false, 200);
    b.queued = 5;
    assert_int_equal(route_table_upsert(t, &b, false, 2000), 0);
    assert_int_equal(rb->rec.queued, 5);
    assert_true(rb->rtt_ewma_ms == 7.5);
    assert_int_equal(rb->consecutive_failures, 1);
    assert_int_equal(rb->seen_ms, 100);
    b.updated_ms = 2;
    assert_int_equal(route_table_upsert(t, &b, false, 2500), 0);
    assert_int_equal(rb->seen_ms, 2500);

    /* Freshness: stale after stale_after_ms without news. */
    assert_true(route_region_fresh(t, rb, 2500 + 3000));
    assert_false(route_region_fresh(t, rb, 2500 + 3001));
    b.updated_ms = 3;
    assert_int_equal(route_table_upsert(t, &b, false, 5600), 0);
    assert_true(route_region_fresh(t, rb, 5600));

    /* Remove keeps the others in order; the freed slot is reused last. */
    route_region *ra = route_table_find(t, "a");
    route_table_remove(t, "a");
    route_table_remove(t, "nope");
    assert_int_equal(route_table_count(t), 2);
    assert_string_equal(route_table_at(t, 0)->rec.name, "b");
    assert_string_equal(route_table_at(t, 1)->rec.name, "c");
    route_region_report(t, ra, false, 0); /* a stale pointer: ignored */
    assert_int_equal(route_table_upsert(t, &d, false, 100), 0);
    assert_ptr_equal(route_table_find(t, "d"), ra); /* the only free slot */
    assert_int_equal(route_table_find(t, "d")->consecutive_failures, 0);
    route_region *rc = route_table_find(t, "c");
    route_table_remove(t, "c");
    route_table_remove(t, "d");
    assert_int_equal(route_table_upsert(t, &a, false, 100), 0);
    /* c's slot was freed before d's. */
    assert_ptr_equal(route_table_find(t, "a"), rc);
    assert_string_equal(route_table_at(t, 1)->rec.name, "a");
    assert_int_equal(route_table_count(t), 2);
    route_table_free(t);
    route_table_free(NULL);
}

/* ---- filters, one at a time ---- */

static void test_filters(void **state)
{
    route_table *t = route_table_new(&opts, 16);
    int64_t now = 10000;
    route_record ok = mk("ok", "m1,m2", "eu,gdpr,us", 2, 10);
    add(t, &ok, 5, now);
    route_decision d;
    route_query q = query("m1", now);

    /* model */
    route_record other = mk("other-model", "m3", "eu,gdpr,us", 2, 1);
    add(t, &other, 1, now);
    assert_int_equal(route_decide(t, &q, &d), 1);
    assert_string_equal(cand(&d, 0), "ok");
    assert_int_equal(d.out_model, 1);
    q.model = "m";
    assert_int_equal(route_decide(t, &q, &d), 0);
    assert_int_equal(d.out_model, 2);
    assert_string_equal(d.reason,
                        "no region: model 2, stale 0, unhealthy 0, ejected 0, residency 0, price 0");
    q.model = NULL;
    assert_int_equal(route_decide(t, &q, &d), 0);
    q.model = "m1";
    route_table_remove(t, "other-model");

    /* stale: out while the shared store is up; while it is away, a record
     * fresh when it went stays a candidate (still shown stale once it
     * ages), one already stale then stays out */
    route_record stale = mk("stale", "m1", "eu,gdpr,us", 2, 1);
    add(t, &stale, 1, now - 3001);
    assert_int_equal(route_decide(t, &q, &d), 1);
    assert_int_equal(d.out_stale, 1);
    route_record aging = mk("aging", "m1", "eu,gdpr,us", 2, 1);
    add(t, &aging, 0.5, now - 2000);
    assert_int_equal(route_decide(t, &q, &d), 2);
    route_table_set_shared_ok(t, false, now);
    assert_false(route_table_shared_ok(t));
    q.now_ms = now + 60000;
    assert_int_equal(route_decide(t, &q, &d), 2);
    assert_string_equal(cand(&d, 0), "aging");
    assert_string_equal(cand(&d, 1), "ok");
    assert_int_equal(d.out_stale, 1);
    assert_false(route_region_fresh(t, route_table_find(t, "aging"), q.now_ms));
    route_table_set_shared_ok(t, false, now + 30000); /* still away: the loss keeps its time */
    assert_int_equal(route_decide(t, &q, &d), 2);
    /* back: each record current at the loss is as old as it was then, so
     * its region has the rest of its window to be heard from again */
    route_table_set_shared_ok(t, true, q.now_ms);
    assert_int_equal(route_decide(t, &q, &d), 2);
    assert_int_equal(d.out_stale, 1);
    q.now_ms = now + 60000 + 1001; /* "aging" was 2000 ms old of 3000 */
    assert_int_equal(route_decide(t, &q, &d), 1);
    assert_string_equal(cand(&d, 0), "ok");
    q.now_ms = now + 60000 + 3001;
    assert_int_equal(route_decide(t, &q, &d), 0);
    assert_int_equal(d.out_stale, 3);
    q.now_ms = now;
    route_table_remove(t, "stale");
    route_table_remove(t, "aging");

    /* unhealthy */
    route_record sick = mk("sick", "m1", "eu,gdpr,us", 2, 1);
    sick.healthy = false;
    add(t, &sick, 1, now);
    assert_int_equal(route_decide(t, &q, &d), 1);
    assert_int_equal(d.out_unhealthy, 1);
    route_table_remove(t, "sick");

    /* ejected */
    route_record ej = mk("ejected", "m1", "eu,gdpr,us", 2, 1);
    add(t, &ej, 1, now);
    route_region *re = route_table_find(t, "ejected");
    for (int i = 0; i < 3; i++)
        route_region_report(t, re, false, now);
    assert_true(route_region_ejected(re, now));
    assert_int_equal(route_decide(t, &q, &d), 1);
    assert_int_equal(d.out_ejected, 1);
    route_table_remove(t, "ejected");

    /* residency: every needed tag must be on the region */
    route_record only_eu = mk("only-eu", "m1", "eu", 2, 1);
    route_record gdpr_us = mk("gdpr-us", "m1", "gdpr,us", 2, 1);
    route_record none = mk("untagged", "m1", "", 2, 1);
    route_record eug = mk("eu-gdpr", "m1", "gdpr,eu", 2, 1);
    add(t, &only_eu, 1, now);
    add(t, &gdpr_us, 1, now);
    add(t, &none, 1, now);
    add(t, &eug, 1, now);
    const char *eu_gdpr[] = {"eu", "gdpr", "eu"};
    q.need_tags = eu_gdpr;
    q.n_need_tags = 3;
    assert_int_equal(route_decide(t, &q, &d), 2);
    assert_string_equal(cand(&d, 0), "eu-gdpr");
    assert_string_equal(cand(&d, 1), "ok");
    assert_int_equal(d.out_residency, 3);
    const char *eu[] = {"eu"};
    q.need_tags = eu;
    q.n_need_tags = 1;
    assert_int_equal(route_decide(t, &q, &d), 3);
    assert_int_equal(d.out_residency, 2);
    const char *mars[] = {"mars"};
    q.need_tags = mars;
    assert_int_equal(route_decide(t, &q, &d), 0);
    assert_int_equal(d.out_residency, 5);
    /* A tag is matched whole: "e" or "eu2" is not "eu". */
    const char *e[] = {"e"};
    q.need_tags = e;
    assert_int_equal(route_decide(t, &q, &d), 0);
    q.need_tags = NULL;
    q.n_need_tags = 0;
    assert_int_equal(route_decide(t, &q, &d), 5);
    route_table_remove(t, "only-eu");
    route_table_remove(t, "gdpr-us");
    route_table_remove(t, "untagged");
    route_table_remove(t, "eu-gdpr");

    /* price cap on the output price; the cap itself is allowed */
    route_record dear = mk("dear", "m1", "eu", 9, 1);
    route_record exact = mk("exact", "m1", "eu", 3, 1);
    add(t, &dear, 1, now);
    add(t, &exact, 1, now);
    q.max_price = 3;
    assert_int_equal(route_decide(t, &q, &d), 2);
    assert_int_equal(d.out_price, 1);
    q.max_price = 0;
    assert_int_equal(route_decide(t, &q, &d), 3);
    assert_int_equal(d.out_price, 0);
    route_table_free(t);
}

/* The cap counts both prices as the cost policy does: the request's price
 * per million of its tokens. A region at 0.01 in / 3.0 out is under a cap
 * of 2 for a prompt-heavy request and over it for an output-heavy one; a
 * region whose prices are equal passes a cap equal to them whatever the
 * request (the old per-output-token cap's answer). */
static void test_price_cap_both_prices(void **state)
{
    (void)state;
    route_table *t = route_table_new(&opts, 16);
    int64_t now = 10000;
    route_record cheap_in = mk("cheap-in", "m", "eu", 3.0, 10), even = mk("even", "m", "eu", 1.0, 10);
    route_record flat = mk("flat", "m", "eu", 0.1, 10);
    cheap_in.price_in = 0.01;
    even.price_in = 2.0;
    flat.price_in = 0.1;
    add(t, &cheap_in, 5, now);
    add(t, &even, 5, now);
    add(t, &flat, 5, now);
    route_decision d;
    route_query q = query("m", now);
    q.max_price = 2.0;
    q.prompt_tokens = 10000;
    q.output_tokens = 100;
    assert_int_equal(route_decide(t, &q, &d), 3);
    assert_true(route_region_allows(route_table_find(t, "cheap-in"), &q));
    q.prompt_tokens = 10;
    q.output_tokens = 1000;
    assert_int_equal(route_decide(t, &q, &d), 2);
    assert_int_equal(d.out_price, 1);
    assert_false(route_region_allows(route_table_find(t, "cheap-in"), &q));
    assert_true(route_region_allows(route_table_find(t, "even"), &q));
    q.max_price = 0.1; /* flat's two prices: passes at any size */
    for (int n = 1; n < 5000; n += 37) {
        q.prompt_tokens = n;
        q.output_tokens = 7 * n + 3;
        assert_true(route_region_allows(route_table_find(t, "flat"), &q));
    }
    q.prompt_tokens = q.output_tokens = 0; /* no size: output price only */
    q.max_price = 2.0;
    assert_int_equal(route_decide(t, &q, &d), 2);
    assert_false(route_region_allows(route_table_find(t, "cheap-in"), &q));
    route_table_free(t);
}

/* ---- orders ---- */

static void test_latency_order(void **state)
{
    route_table *t = route_table_new(&opts, 16);
    int64_t now = 1000;
    route_record a = mk("a", "m", "", 1, 10), b = mk("b", "m", "", 1, 10), c = mk("c", "m", "", 1, 10);
    add(t, &c, 60, now);
    add(t, &a, 5, now);
    add(t, &b, 25, now);
    route_decision d;
    route_query q = query("m", now);
    assert_int_equal(route_decide(t, &q, &d), 3);
    assert_string_equal(cand(&d, 0), "a");
    assert_string_equal(cand(&d, 1), "b");
    assert_string_equal(cand(&d, 2), "c");
    assert_true(fabs(d.expected_ms[0] - 15) < 1e-9 && fabs(d.expected_ms[2] - 70) < 1e-9);
    assert_string_equal(d.reason, "latency 15.0 ms (rtt 5.0 + queue 10.0)");
    route_table_free(t);

    /* Within 0.5 ms of the fastest: the cheaper wins; equal price: faster; then the name. */
    t = route_table_new(&opts, 16);
    route_record fast_dear = mk("fast-dear", "m", "", 2, 10), slow_cheap = mk("slow-cheap", "m", "", 1, 10);
    route_record far = mk("far", "m", "", 0.5, 10);
    add(t, &fast_dear, 10.0, now);
    add(t, &slow_cheap, 10.45, now);
    add(t, &far, 10.6, now);
    assert_int_equal(route_decide(t, &q, &d), 3);
    assert_string_equal(cand(&d, 0), "slow-cheap");
    assert_string_equal(cand(&d, 1), "fast-dear");
    assert_string_equal(cand(&d, 2), "far");        /* cheapest, but 0.6 ms slower */
    route_table_set_rtt(t, "slow-cheap", 10.5, 11); /* exactly 0.5 ms: no longer a tie */
    assert_int_equal(route_decide(t, &q, &d), 3);
    assert_string_equal(cand(&d, 0), "fast-dear");
    assert_string_equal(cand(&d, 1), "far");
    assert_string_equal(cand(&d, 2), "slow-cheap");
    route_table_free(t);

    t = route_table_new(&opts, 16);
    route_record z = mk("z", "m", "", 1, 10), y = mk("y", "m", "", 1, 10), x = mk("x", "m", "", 1, 10);
    add(t, &z, 5.0, now);
    add(t, &y, 5.2, now);
    add(t, &x, 5.2, now);
    assert_int_equal(route_decide(t, &q, &d), 3);
    assert_string_equal(cand(&d, 0), "z");
    assert_string_equal(cand(&d, 1), "x");
    assert_string_equal(cand(&d, 2), "y");
    route_table_free(t);
}

/* Issue 30: a region whose record holds a prefix of the request's chain
 * expects to answer sooner by that prefix's prefill; with spread on, the
 * conversation is not drawn away from it; a slow or unhealthy one loses;
 * a session draws among near-equal ones by its hash, the same each time. */
static void test_prefix_regions(void **state)
{
    (void)state;
    route_table *t = route_table_new(&opts, 16);
    int64_t now = 1000;
    gw_prefix_chain c;
    const char *body = "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"a long system "
                       "prompt\"},{\"role\":\"user\",\"content\":\"and a question\"}]}";
    gw_prefix_chain_of(body, strlen(body), &c);
    route_record a = mk("a", "m", "", 1, 100), b = mk("b", "m", "", 1, 100);
    b.prefixes[0] = c.hash[1];
    b.n_prefixes = 1;
    b.prefill_ms_per_byte = 0.25;
    round_trip(&b);
    add(t, &a, 10, now);
    add(t, &b, 12, now);
    route_decision d;
    route_query q = query("m", now);
    q.spread = true;
    q.chain = &c;
    q.prompt_tokens = 1000;
    double saved = gw_prefix_bytes(&c, 2) * 0.25;
    for (int i = 0; i < 50; i++) {
        assert_int_equal(route_decide(t, &q, &d), 2);
        assert_string_equal(cand(&d, 0), "b");
    }
    assert_true(fabs(d.expected_ms[0] - (12 + 100 - saved)) < 1e-9);
    /* a little slower than the other even with its hit, within the
     * near-best window (estimates are noisy): it keeps the conversation */
    b.ttft_ms = 100 + saved + 5;
    b.updated_ms = 2;
    add(t, &b, 12, now);
    for (int i = 0; i < 50; i++) {
        assert_int_equal(route_decide(t, &q, &d), 2);
        assert_string_equal(cand(&d, 0), "b");
    }
    /* slow (past the window): the other, spread or not */
    b.ttft_ms = 200;
    b.updated_ms = 3;
    add(t, &b, 12, now);
    assert_int_equal(route_decide(t, &q, &d), 2);
    assert_string_equal(cand(&d, 0), "a");
    q.spread = false;
    assert_int_equal(route_decide(t, &q, &d), 2);
    assert_string_equal(cand(&d, 0), "a");
    /* unhealthy: never */
    b.ttft_ms = 100;
    b.healthy = false;
    b.updated_ms = 4;
    add(t, &b, 12, now);
    assert_int_equal(route_decide(t, &q, &d), 1);
    assert_string_equal(cand(&d, 0), "a");
    /* without a hit, a session stays with one of two alike regions */
    b.healthy = true;
    b.n_prefixes = 0;
    b.updated_ms = 5;
    add(t, &b, 10, now);
    q.spread = true;
    q.chain = NULL;
    int seen[2] = {0, 0};
    for (uint64_t s = 1; s <= 32; s++) {
        q.session = s * 0x9e3779b97f4a7c15ull;
        assert_int_equal(route_decide(t, &q, &d), 2);
        const char *first = cand(&d, 0);
        for (int i = 0; i < 5; i++) {
            route_decide(t, &q, &d);
            assert_string_equal(cand(&d, 0), first);
        }
        seen[first[0] == 'b']++;
    }
    assert_true(seen[0] > 4 && seen[1] > 4);
    /* a prefix both hold (a shared system prompt) still spreads */
    q.session = 0;
    q.chain = &c;
    a.prefixes[0] = b.prefixes[0] = c.hash[1];
    a.n_prefixes = b.n_prefixes = 1;
    a.prefill_ms_per_byte = b.prefill_ms_per_byte = 0.25;
    a.updated_ms = b.updated_ms = 6;
    add(t, &a, 10, now);
    add(t, &b, 10, now);
    seen[0] = seen[1] = 0;
    for (int i = 0; i < 200; i++) {
        assert_int_equal(route_decide(t, &q, &d), 2);
        seen[cand(&d, 0)[0] == 'b']++;
    }
    assert_true(seen[0] > 40 && seen[1] > 40);
    route_table_free(t);
}

static void test_prefix_fields_bad(void **state)
{
    (void)state;
    const char *bad[] = {"2", ";0123456789abcdef", "x;0123456789abcdef", "2;0123456789abcde",
                         "2;0123456789ABCDEF", "2;0123456789abcdef,", "2;0123456789abcdef,0123456789abcdee",
                         "2;0123456789abcdef,0123456789abcdef", "2;0123456789abcdefa"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        route_record r = mk("a", "m", "", 1, 10), was = r;
        const char *names[] = {"prefixes"};
        const char *values[] = {bad[i]};
        char err[128] = "";
        assert_int_equal(route_record_from_fields(&r, names, values, NULL, 1, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "prefixes"));
        assert_int_equal(memcmp(&r, &was, sizeof(r)), 0);
    }
    route_record r = mk("a", "m", "", 1, 10);
    const char *names[] = {"prefixes"};
    const char *values[] = {"0.5;000000000000000a,ffffffffffffffff"};
    assert_int_equal(route_record_from_fields(&r, names, values, NULL, 1, NULL, 0), 0);
    assert_true(r.n_prefixes == 2 && r.prefixes[1] == UINT64_MAX && r.prefill_ms_per_byte == 0.5);
}

static void test_queue_moves(void **state)
{
    route_table *t = route_table_new(&opts, 16);
    int64_t now = 1000;
    route_record a = mk("a", "m", "", 1, 10), b = mk("b", "m", "", 1, 10);
    add(t, &a, 5, now);
    add(t, &b, 25, now);
    route_decision d;
    route_query q = query("m", now);
    assert_int_equal(route_decide(t, &q, &d), 2);
    assert_string_equal(cand(&d, 0), "a");
    /* Busy but not full: no waiting yet. */
    a.running = 7;
    a.updated_ms++;
    assert_int_equal(route_table_upsert(t, &a, false, now), 0);
    assert_int_equal(route_decide(t, &q, &d), 2);
    assert_string_equal(cand(&d, 0), "a");
    /* Full with a queue: each waiting request costs service/capacity =
     * (10 + 128) / 8 = 17.25 ms; two of them outweigh the 20 ms RTT gap. */
    double prev = route_expected_ms(route_table_find(t, "a"));
    for (int queued = 0; queued < 4; queued++) {
        a.running = 8;
        a.queued = queued;
        a.updated_ms++;
        assert_int_equal(route_table_upsert(t, &a, false, now), 0);
        double e = route_expected_ms(route_table_find(t, "a"));
        assert_true(e > prev);
        assert_true(fabs(e - (5 + 10 + (queued + 1) * 17.25)) < 1e-9);
        prev = e;
        assert_int_equal(route_decide(t, &q, &d), 2);
        assert_string_equal(cand(&d, 0), queued == 0 ? "a" : "b");
    }
    assert_string_equal(d.reason, "latency 35.0 ms (rtt 25.0 + queue 10.0)");
    /* Capacity 0 (no worker up) still grows with the queue. */
    a.capacity = 0;
    a.running = 0;
    a.queued = 0;
    a.updated_ms++;
    assert_int_equal(route_table_upsert(t, &a, false, now), 0);
    assert_true(fabs(route_queue_ms(route_table_find(t, "a")) - (10 + 138)) < 1e-9);
    route_table_free(t);
}

static void test_rtt_moves(void **state)
{
    route_table *t = route_table_new(&opts, 16);
    int64_t now = 1000;
    route_record a = mk("a", "m", "", 1, 10), b = mk("b", "m", "", 1, 10),
                 u = mk("unmeasured", "m", "", 0.1, 10);
    add(t, &a, 5, now);
    add(t, &b, 25, now);
    assert_int_equal(route_table_upsert(t, &u, false, now), 0);
    route_decision d;
    route_query q = query("m", now);
    assert_int_equal(route_decide(t, &q, &d), 3);
    assert_string_equal(cand(&d, 0), "a");
    assert_string_equal(cand(&d, 2), "unmeasured"); /* counts as 50 ms */
    route_table_set_rtt(t, "a", 40, 60);
    assert_int_equal(route_decide(t, &q, &d), 3);
    assert_string_equal(cand(&d, 0), "b");
    assert_string_equal(cand(&d, 1), "a");
    route_table_set_rtt(t, "unmeasured", 1, 2);
    assert_int_equal(route_decide(t, &q, &d), 3);
    assert_string_equal(cand(&d, 0), "unmeasured");
    route_table_free(t);
}

static void test_cost_policy(void **state)
{
    route_table *t = route_table_new(&opts, 16);
    int64_t now = 1000;
    route_record fast = mk("fast", "m", "", 3.0, 10);     /* 15 ms */
    route_record mid = mk("mid", "m", "", 1.0, 10);       /* 35 ms */
    route_record mid2 = mk("mid2", "m", "", 1.0, 10);     /* 30 ms: same price, faster */
    route_record slow = mk("slow", "m", "", 0.2, 10);     /* 70 ms: cheapest, over the SLO */
    route_record slower = mk("slower", "m", "", 0.1, 10); /* 90 ms */
    add(t, &fast, 5, now);
    add(t, &mid, 25, now);
    add(t, &mid2, 20, now);
    add(t, &slow, 60, now);
    add(t, &slower, 80, now);
    route_decision d;
    route_query q = query("m", now);
    q.policy = ROUTE_COST;
    q.slo_ms = 50;
    assert_int_equal(route_decide(t, &q, &d), 5);
    assert_string_equal(cand(&d, 0), "mid2");
    assert_string_equal(cand(&d, 1), "mid");
    assert_string_equal(cand(&d, 2), "fast");
    assert_string_equal(cand(&d, 3), "slow");
    assert_string_equal(cand(&d, 4), "slower");
    assert_string_equal(d.reason, "cost 1.00/M, 30.0 ms within slo 50");
    /* A price change moves the choice. */
    fast.price_out = 0.5;
    assert_int_equal(route_table_upsert(t, &fast, false, now), 0);
    assert_int_equal(route_decide(t, &q, &d), 5);
    assert_string_equal(cand(&d, 0), "fast");
    /* A wider SLO lets the cheapest in. */
    q.slo_ms = 75;
    assert_int_equal(route_decide(t, &q, &d), 5);
    assert_string_equal(cand(&d, 0), "slow");
    assert_string_equal(cand(&d, 4), "slower");
    /* No SLO: cheapest first. */
    q.slo_ms = 0;
    assert_int_equal(route_decide(t, &q, &d), 5);
    assert_string_equal(cand(&d, 0), "slower");
    assert_string_equal(d.reason, "cost 0.10/M, 90.0 ms, no slo");
    /* Nothing within the SLO: by latency. */
    q.slo_ms = 10;
    assert_int_equal(route_decide(t, &q, &d), 5);
    assert_string_equal(cand(&d, 0), "fast");
    assert_string_equal(cand(&d, 1), "mid2");
    assert_string_equal(cand(&d, 4), "slower");
    assert_string_equal(d.reason, "cost: none within slo 10, latency 15.0 ms (rtt 5.0 + queue 10.0)");
    route_table_free(t);
}

/* ---- ejection ---- */

/* Active health checks feed the same ejection: failures in a row eject
 * (no probe request while they keep failing, whatever the back-off),
 * successes in a row return; a check's success does not end an ejection
 * requests' failures began, and checks leave requests' count alone. */
static void test_check_ejection(void **state)
{
    (void)state;
    route_table_opts o = opts;
    o.stale_after_ms = 0;
    route_table *t = route_table_new(&o, 16);
    int64_t now = 100000;
    route_record a = mk("a", "m", "", 1, 10), b = mk("b", "m", "", 1, 10);
    add(t, &a, 5, now);
    add(t, &b, 25, now);
    route_region *ra = route_table_find(t, "a");
    route_decision d;
    route_query q = query("m", now);

    route_region_report_check(t, ra, false, 2, 2, now);
    assert_false(route_region_ejected(ra, now));
    assert_int_equal(ra->consecutive_failures, 0);
    route_region_report_check(t, ra, true, 2, 2, now); /* a pass breaks the streak */
    route_region_report_check(t, ra, false, 2, 2, now);
    assert_false(route_region_ejected(ra, now));
    route_region_report_check(t, ra, false, 2, 2, now);
    assert_true(ra->check_down && route_region_ejected(ra, now));
    assert_int_equal(ra->ejections, 1);
    /* long past the back-off: still out, and no probe to claim */
    q.now_ms = now + 100000;
    assert_int_equal(route_decide(t, &q, &d), 1);
    assert_string_equal(cand(&d, 0), "b");
    assert_false(d.probe);
    assert_false(route_region_take_probe(ra, q.now_ms));
    route_region_report_check(t, ra, true, 2, 2, q.now_ms);
    assert_true(route_region_ejected(ra, q.now_ms));
    route_region_report_check(t, ra, true, 2, 2, q.now_ms);
    assert_false(ra->check_down || route_region_ejected(ra, q.now_ms));
    assert_int_equal(ra->ejections, 0);
    assert_int_equal(route_decide(t, &q, &d), 2);
    assert_string_equal(cand(&d, 0), "a");

    /* Ejected by requests: passing checks do not end it; the probe does. */
    int64_t t1 = q.now_ms;
    for (int i = 0; i < 3; i++)
        route_region_report(t, ra, false, t1);
    assert_true(route_region_ejected(ra, t1));
    for (int i = 0; i < 5; i++)
        route_region_report_check(t, ra, true, 2, 2, t1);
    assert_true(route_region_ejected(ra, t1));
    assert_int_equal(ra->consecutive_failures, 3);
    assert_true(route_region_take_probe(ra, t1 + 1000));
    route_region_report_probe(t, ra, true, t1 + 1000, route_region_probe_claim(ra));
    assert_false(route_region_ejected(ra, t1 + 1000));
    /* Checks turned off: what they ejected comes back, counts start over. */
    route_region_report_check(t, ra, false, 1, 1, t1 + 1000);
    assert_true(route_region_ejected(ra, t1 + 1000));
    route_region_check_reset(ra);
    assert_false(route_region_ejected(ra, t1 + 1000));
    assert_int_equal(ra->check_failures, 0);
    route_table_free(t);
}


static void test_ejection(void **state)
{
    route_table_opts o = opts;
    o.stale_after_ms = 0; /* the clock runs far past any heartbeat here */
    route_table *t = route_table_new(&o, 16);
    int64_t now = 100000;
    route_record a = mk("a", "m", "", 1, 10), b = mk("b", "m", "", 1, 10);
    add(t, &a, 5, now);
    add(t, &b, 25, now);
    route_region *ra = route_table_find(t, "a");
    route_decision d;
    route_query q = query("m", now);

    /* Two failures and a success: no ejection. */
    route_region_report(t, ra, false, now);
    route_region_report(t, ra, false, now);
    route_region_report(t, ra, true, now);
    assert_int_equal(ra->consecutive_failures, 0);
    route_region_report(t, ra, false, now);
    route_region_report(t, ra, false, now);
    assert_false(route_region_ejected(ra, now));
    route_region_report(t, ra, false, now);
    assert_true(route_region_ejected(ra, now));
    assert_int_equal(ra->ejections, 1);
    assert_int_equal(ra->ejected_until_ms, now + 1000);
    /* Late failures of requests sent before do not extend it. */
    route_region_report(t, ra, false, now + 10);
    assert_int_equal(ra->ejected_until_ms, now + 1000);
    assert_false(route_region_take_probe(ra, now + 999));

    q.now_ms = now + 999;
    assert_int_equal(route_decide(t, &q, &d), 1);
    assert_string_equal(cand(&d, 0), "b");
    assert_int_equal(d.out_ejected, 1);

    /* Back-off over: a goes first as the one probe... */
    int64_t t1 = now + 1000;
    q.now_ms = t1;
    assert_false(route_region_ejected(ra, t1));
    assert_int_equal(route_decide(t, &q, &d), 2);
    assert_string_equal(cand(&d, 0), "a");
    assert_true(d.probe);
    assert_string_equal(d.reason, "latency 15.0 ms (rtt 5.0 + queue 10.0) probe");
    assert_true(ra->probing);
    /* ...and while it is out, a is left out. */
    assert_int_equal(route_decide(t, &q, &d), 1);
    assert_string_equal(cand(&d, 0), "b");
    assert_false(d.probe);
    assert_false(route_region_take_probe(ra, t1));

    /* An older request's outcome while the probe is out only counts: its
     * failure does not eject again, its success does not end the back-off. */
    route_region_report(t, ra, false, t1);
    route_region_report(t, ra, true, t1);
    assert_int_equal(ra->ejections, 1);
    assert_true(ra->probing);
    assert_true(route_region_ejected(ra, t1));
    /* The probe fails: ejected for twice as long, then 4x, then capped at 8x. */
    route_region_report_probe(t, ra, false, t1, route_region_probe_claim(ra));
    assert_int_equal(ra->ejections, 2);
    assert_int_equal(ra->ejected_until_ms, t1 + 2000);
    int64_t tt = t1 + 2000;
    int64_t want[] = {4000, 8000, 8000};
    for (int i = 0; i < 3; i++) {
        assert_true(route_region_ejected(ra, tt - 1));
        assert_true(route_region_take_probe(ra, tt));
        route_region_report_probe(t, ra, false, tt, route_region_probe_claim(ra));
        assert_int_equal(ra->ejected_until_ms - tt, want[i]);
        tt += want[i];
    }

    /* A claimed probe that is never reported frees up after probe_timeout_ms. */
    assert_true(route_region_take_probe(ra, tt));
    assert_true(route_region_ejected(ra, tt + 4999));
    assert_false(route_region_take_probe(ra, tt + 4999));
    uint64_t stale_claim = route_region_probe_claim(ra);
    tt += 5000;
    assert_false(route_region_ejected(ra, tt));
    assert_true(route_region_take_probe(ra, tt));
    /* The request whose probe timed out neither gives back nor decides the
     * new one: its failure only counts, its client's leaving releases
     * nothing. */
    route_region_release_probe(ra, stale_claim);
    assert_true(ra->probing);
    int before = ra->ejections;
    route_region_report_probe(t, ra, false, tt, stale_claim);
    assert_int_equal(ra->ejections, before);
    assert_true(ra->probing);

    /* The probe succeeds: healthy again, the back-off starts over. */
    route_region_report_probe(t, ra, true, tt, route_region_probe_claim(ra));
    assert_false(route_region_ejected(ra, tt));
    assert_int_equal(ra->ejections, 0);
    assert_int_equal(ra->consecutive_failures, 0);
    q.now_ms = tt;
    assert_int_equal(route_decide(t, &q, &d), 2);
    assert_string_equal(cand(&d, 0), "a");
    assert_false(d.probe);
    for (int i = 0; i < 3; i++)
        route_region_report(t, ra, false, tt);
    assert_int_equal(ra->ejected_until_ms, tt + 1000);

    /* A region out of its back-off but not first stays a candidate,
     * unclaimed, for failover to claim as its probe. */
    route_table_set_rtt(t, "a", 40, 50);
    tt += 1000;
    q.now_ms = tt;
    assert_int_equal(route_decide(t, &q, &d), 2);
    assert_string_equal(cand(&d, 0), "b");
    assert_string_equal(cand(&d, 1), "a");
    assert_false(d.probe);
    assert_false(ra->probing);
    bool probe = false;
    assert_true(route_region_claim(ra, tt, &probe)); /* b failed the request: a is tried, as the probe */
    assert_true(probe && ra->probing);
    assert_false(route_region_claim(ra, tt, &probe)); /* one probe at a time */
    assert_false(probe);
    route_region_release_probe(
        ra, route_region_probe_claim(ra)); /* given back unused (refused, or no way there) */
    assert_true(route_region_claim(ra, tt, &probe) && probe);
    assert_int_equal(route_decide(t, &q, &d), 1);
    assert_string_equal(cand(&d, 0), "b");
    assert_int_equal(d.out_ejected, 1);
    tt += 5000; /* the probe never reported: free again (probe_timeout_ms) */
    q.now_ms = tt;
    assert_true(route_region_claim(route_table_find(t, "b"), tt, &probe)); /* usable: nothing to claim */
    assert_false(probe);
    /* When b goes, a gets its probe. */
    route_region *rb = route_table_find(t, "b");
    for (int i = 0; i < 3; i++)
        route_region_report(t, rb, false, tt);
    assert_int_equal(route_decide(t, &q, &d), 1);
    assert_string_equal(cand(&d, 0), "a");
    assert_true(d.probe);
    route_table_free(t);

    /* eject_after 0: never ejected. */
    o.eject_after = 0;
    t = route_table_new(&o, 4);
    add(t, &a, 5, now);
    ra = route_table_find(t, "a");
    for (int i = 0; i < 100; i++)
        route_region_report(t, ra, false, now);
    assert_false(route_region_ejected(ra, now));
    assert_int_equal(ra->consecutive_failures, 100);
    route_table_free(t);
}

/* ---- the local region ---- */

static void test_local(void **state)
{
    route_table *t = route_table_new(&opts, 16);
    int64_t now = 1000;
    route_record here = mk("here", "m", "eu", 1, 10), peer = mk("peer", "m", "eu", 1, 10);
    assert_int_equal(route_table_upsert(t, &here, true, now), 0);
    add(t, &peer, 5, now);
    route_table_set_rtt(t, "here", 30, 30); /* ignored: RTT to ourselves is 0 */
    route_region *rh = route_table_find(t, "here");
    assert_true(rh->local && rh->rtt_known && rh->rtt_ewma_ms == 0);
    route_decision d;
    route_query q = query("m", now + 100000); /* never stale */
    assert_int_equal(route_decide(t, &q, &d), 1);
    q.now_ms = now;
    assert_int_equal(route_decide(t, &q, &d), 2);
    assert_string_equal(cand(&d, 0), "here");
    assert_string_equal(d.reason, "latency 10.0 ms (rtt 0.0 + queue 10.0)");
    /* Loaded: the peer wins. */
    here.running = 8;
    here.queued = 1;
    assert_int_equal(route_table_upsert(t, &here, true, now), 0);
    assert_int_equal(route_decide(t, &q, &d), 2);
    assert_string_equal(cand(&d, 0), "peer");
    assert_string_equal(cand(&d, 1), "here");
    /* Our own record read back from Redis does not replace the local one. */
    route_record echo = mk("here", "other", "", 1, 10);
    assert_int_equal(route_table_upsert(t, &echo, false, now), 0);
    assert_true(rh->local);
    assert_string_equal(rh->rec.models[0], "m");
    /* It is ejected like any other. */
    for (int i = 0; i < 3; i++)
        route_region_report(t, rh, false, now);
    assert_int_equal(route_decide(t, &q, &d), 1);
    assert_int_equal(d.out_ejected, 1);
    route_table_free(t);
}

/* ---- many regions against a brute-force reference ---- */

typedef struct ref_entry {
    route_region *r;
    double ms;
    int group; /* cost: 0 within the SLO, 1 over */
    int64_t step;
} ref_entry;

/* route_models: what /v1/models lists beside the local workers. */
typedef struct seen_models {
    char list[512];
} seen_models;

static void note_model(void *ud, const char *model)
{
    seen_models *s = ud;
    size_t n = strlen(s->list);
    snprintf(s->list + n, sizeof(s->list) - n, "%s%s", n ? "," : "", model);
}

static void test_models(void **state)
{
    route_table *t = route_table_new(&opts, 16);
    int64_t now = 10000;
    route_record eu = mk("eu", "a,b", "eu,gdpr", 2, 10), us = mk("us", "b,c", "us", 1, 10),
                 sick = mk("sick", "d", "eu", 1, 10), old = mk("old", "e", "eu", 1, 10),
                 out = mk("out", "f", "eu", 1, 10);
    sick.healthy = false;
    add(t, &eu, 5, now);
    add(t, &us, 5, now);
    add(t, &sick, 5, now);
    add(t, &old, 5, now - 3001);
    add(t, &out, 5, now);
    for (int i = 0; i < 3; i++) /* ejected: its models are still there */
        route_region_report(t, route_table_find(t, "out"), false, now);
    route_decision d;
    route_query q = query("f", now);
    assert_int_equal(route_decide(t, &q, &d), 0);
    assert_int_equal(d.out_ejected, 1);

    seen_models s = {""};
    route_models(t, NULL, 0, now, note_model, &s);
    assert_string_equal(s.list, "a,b,b,c,f");
    const char *eu_only[] = {"eu"}, *both[] = {"eu", "gdpr"}, *none[] = {"ap"};
    s.list[0] = '\0';
    route_models(t, eu_only, 1, now, note_model, &s);
    assert_string_equal(s.list, "a,b,f");
    s.list[0] = '\0';
    route_models(t, both, 2, now, note_model, &s);
    assert_string_equal(s.list, "a,b");
    s.list[0] = '\0';
    route_models(t, none, 1, now, note_model, &s);
    assert_string_equal(s.list, "");
    route_table_free(t);
}

/* The store back after an outage: a record current at the loss keeps what
 * was left of its window, and at least the recovery grace, for its region
 * (reconnecting on its own back-off) to write again. Without the grace,
 * peers that reconnected a few seconds apart dropped out of each other's
 * candidates in between. */
static void test_recovery_grace(void **state)
{
    (void)state;
    route_table *t = route_table_new(&opts, 16); /* stale after 3000 ms */
    route_record a = mk("a", "m", "eu", 1, 10), b = mk("b", "m", "eu", 1, 10);
    add(t, &a, 5, 10000);
    add(t, &b, 5, 10000);
    route_table_set_shared_ok(t, false, 12000); /* each had 1000 ms left */
    route_table_set_shared_ok(t, true, 20000);
    assert_true(route_region_fresh(t, route_table_find(t, "a"), 21000));
    assert_false(route_region_fresh(t, route_table_find(t, "a"), 21001));
    route_table_set_recovery_grace(t, 7000);
    route_table_set_shared_ok(t, false, 21000);
    route_table_set_shared_ok(t, true, 30000);
    /* a was fresh at the loss (seen 18000, stale after 21000): grace */
    assert_true(route_region_fresh(t, route_table_find(t, "a"), 37000));
    assert_false(route_region_fresh(t, route_table_find(t, "a"), 37001));
    route_table_free(t);
}

/* The grace is given once until the record changes. A store that went
 * away 5 s after each return (within the 7 s grace, so the record was
 * fresh at each loss) gave a dead region a new grace every time: a
 * candidate for as long as the flapping. A record read again earns it
 * again. */
static void test_recovery_grace_once(void **state)
{
    (void)state;
    route_table *t = route_table_new(&opts, 16); /* stale after 3000 ms */
    route_table_set_recovery_grace(t, 7000);
    route_record dead = mk("dead", "m", "eu", 1, 10), live = mk("live", "m", "eu", 1, 10);
    add(t, &dead, 5, 19000);
    add(t, &live, 5, 19000);
    int64_t back = 0;
    for (int i = 0; i < 10; i++) {
        int64_t lost = 20000 + 6000 * i;
        route_table_set_shared_ok(t, false, lost);
        back = lost + 1000;
        route_table_set_shared_ok(t, true, back);
        live.updated_ms++; /* written and read at each return */
        assert_int_equal(route_table_upsert(t, &live, false, back), 0);
    }
    assert_false(route_region_fresh(t, route_table_find(t, "dead"), back));
    route_decision d;
    route_query q = query("m", back);
    assert_int_equal(route_decide(t, &q, &d), 1);
    assert_string_equal(cand(&d, 0), "live");
    /* live, read just before a loss, has the grace on its return */
    route_table_set_shared_ok(t, false, back + 2000);
    route_table_set_shared_ok(t, true, back + 3000);
    assert_true(route_region_fresh(t, route_table_find(t, "live"), back + 3000 + 4000));
    route_table_free(t);
}

/* While the store is partly away (subscription or our own writes down,
 * full reads still coming), news is as of the last full read: a region
 * silent through the reads goes stale, one they refresh stays, and once
 * the reads stop too the last one's news holds. Judged at the loss, a
 * region read after it and dead after that stayed a candidate for as long
 * as the store was away; judged at now, every live peer dropped out once
 * the reads stopped. */
static void test_news_as_of_last_read(void **state)
{
    (void)state;
    route_table *t = route_table_new(&opts, 16); /* stale after 3000 ms */
    route_record dies = mk("dies", "m", "eu", 1, 10), live = mk("live", "m", "eu", 1, 10);
    add(t, &live, 5, 9000);
    route_table_set_shared_ok(t, false, 10000);
    add(t, &dies, 5, 11000); /* first read after the loss */
    route_table_note_full_read(t, 11000);
    route_decision d;
    route_query q = query("m", 13000);
    assert_int_equal(route_decide(t, &q, &d), 2);
    for (int64_t at = 12000; at <= 16000; at += 1000) { /* reads go on; only "live" writes */
        live.updated_ms++;
        assert_int_equal(route_table_upsert(t, &live, false, at), 0);
        route_table_note_full_read(t, at);
    }
    q.now_ms = 16000;
    assert_int_equal(route_decide(t, &q, &d), 1);
    assert_string_equal(cand(&d, 0), "live");
    q.now_ms = 60000; /* the reads stopped too: news as of the last */
    assert_int_equal(route_decide(t, &q, &d), 1);
    assert_string_equal(cand(&d, 0), "live");
    /* back: "live" has the rest of its window as of that read */
    route_table_set_shared_ok(t, true, 60000);
    assert_true(route_region_fresh(t, route_table_find(t, "live"), 63000));
    assert_false(route_region_fresh(t, route_table_find(t, "live"), 63001));
    assert_false(route_region_fresh(t, route_table_find(t, "dies"), 60000));
    route_table_free(t);
}

/* Issue 34: a frozen store is found out only when a command times out,
 * and meanwhile every record aged: a peer that answers our PINGs stays a
 * candidate with its last record until a full read of the store shows the
 * record is no longer refreshed (one begun after it went stale, and the
 * recovery grace after the store came back); one that stops answering
 * goes stale by its record's age. */
static void test_held_by_ping(void **state)
{
    (void)state;
    route_table *t = route_table_new(&opts, 16); /* stale after 3000 ms */
    route_record a = mk("a", "m", "eu", 1, 10), b = mk("b", "m", "eu", 1, 10);
    add(t, &a, 5, 10000);
    add(t, &b, 5, 10000);
    route_table_note_full_read(t, 10000);
    route_table_set_answered(t, "a", 13800);
    route_table_set_answered(t, "b", 10500);
    route_table_set_answered(t, "a", 12000); /* older: ignored */
    route_table_set_answered(t, "nobody", 13000);
    /* frozen, not yet found out: a answers, b does not */
    route_decision d;
    route_query q = query("m", 14000);
    assert_int_equal(route_decide(t, &q, &d), 1);
    assert_string_equal(cand(&d, 0), "a");
    assert_false(route_region_fresh(t, route_table_find(t, "a"), 14000));
    assert_true(route_region_current(t, route_table_find(t, "a"), 14000));
    assert_true(route_region_held_by_ping(t, route_table_find(t, "a"), 14000));
    assert_false(route_region_current(t, route_table_find(t, "b"), 14000));
    /* found out; a goes on answering, then stops; c, read just before the
     * loss, stops answering at once: its record fresh at the loss no
     * longer keeps it */
    route_record c = mk("c", "m", "eu", 1, 10);
    add(t, &c, 5, 14500);
    route_table_set_answered(t, "c", 14600);
    route_table_set_recovery_grace(t, 2000);
    route_table_set_shared_ok(t, false, 15000);
    assert_true(route_region_current(t, route_table_find(t, "c"), 17600));
    assert_false(route_region_current(t, route_table_find(t, "c"), 17601));
    route_table_set_answered(t, "a", 18000);
    q.now_ms = 20000;
    assert_int_equal(route_decide(t, &q, &d), 1);
    assert_false(route_region_current(t, route_table_find(t, "a"), 21001));
    /* back at 22000 (a answering again): a full read within the grace
     * does not yet count against it; one after it does */
    route_table_set_answered(t, "a", 22000);
    route_table_note_full_read(t, 22000);
    route_table_set_shared_ok(t, true, 22000);
    route_table_set_answered(t, "a", 23500);
    route_table_note_full_read(t, 23000);
    assert_true(route_region_held_by_ping(t, route_table_find(t, "a"), 23600));
    route_table_note_full_read(t, 24000);
    assert_false(route_region_current(t, route_table_find(t, "a"), 24000));
    /* its record read anew: fresh again, by the record */
    a.updated_ms++;
    assert_int_equal(route_table_upsert(t, &a, false, 24100), 0);
    assert_true(route_region_fresh(t, route_table_find(t, "a"), 24100));
    assert_false(route_region_held_by_ping(t, route_table_find(t, "a"), 24100));
    route_table_free(t);
}

/* With the store answering, records rule: a peer that answers PINGs but
 * whose record full reads no longer refresh goes stale once a read begun
 * after its record went stale has completed. */
static void test_ping_yields_to_reads(void **state)
{
    (void)state;
    route_table *t = route_table_new(&opts, 16); /* stale after 3000 ms */
    route_record a = mk("a", "m", "eu", 1, 10);
    add(t, &a, 5, 10000);
    route_table_set_answered(t, "a", 13900);
    route_table_note_full_read(t, 12500);
    assert_true(route_region_current(t, route_table_find(t, "a"), 14000));
    route_table_note_full_read(t, 13500);
    assert_false(route_region_current(t, route_table_find(t, "a"), 14000));
    route_table_free(t);
}

/* Peers reached over mutual TLS: a peer's record naming another kind of
 * endpoint never enters the table (nor would its requests go in clear to
 * a peer never verified). No endpoint at all is no dial either, and fine. */
static void test_tls_only(void **state)
{
    (void)state;
    route_table_opts o = opts;
    o.tls_only = true;
    route_table *t = route_table_new(&o, 16);
    route_record clear = mk("clear", "m", "eu", 1, 10), none = mk("none", "m", "eu", 1, 10);
    snprintf(clear.endpoint, sizeof(clear.endpoint), "tcp:10.0.0.2:8080");
    none.endpoint[0] = '\0';
    assert_int_equal(route_table_upsert(t, &clear, false, 1000), -EPERM);
    assert_int_equal(route_table_upsert(t, &none, false, 1000), 0);
    assert_int_equal(route_table_upsert(t, &clear, true, 1000), 0); /* our own: never dialled */
    route_table_free(t);
    t = route_table_new(&opts, 16);
    assert_int_equal(route_table_upsert(t, &clear, false, 1000), 0);
    route_table_free(t);
}

/* Peers silent past forget_ms leave the table, the local region never, and
 * nothing leaves while the store is away. */
static void test_prune(void **state)
{
    (void)state;
    route_table *t = route_table_new(&opts, 16);
    route_record here = mk("here", "m", "eu", 1, 10), gone = mk("gone", "m", "eu", 1, 10),
                 live = mk("live", "m", "eu", 1, 10);
    assert_int_equal(route_table_upsert(t, &here, true, 1000), 0);
    add(t, &gone, 5, 1000);
    add(t, &live, 5, 1000);
    /* a decision a long request keeps */
    route_decision d;
    route_query q = query("m", 1000);
    assert_int_equal(route_decide(t, &q, &d), 3);
    live.updated_ms++;
    assert_int_equal(route_table_upsert(t, &live, false, 50000), 0);
    route_table_set_shared_ok(t, false, 60000);
    assert_int_equal(route_table_prune(t, 30000, 90000), 0);
    route_table_set_shared_ok(t, true, 60000);
    assert_int_equal(route_table_prune(t, 60000, 61000), 0);
    assert_int_equal(route_table_prune(t, 30000, 61000), 1);
    assert_null(route_table_find(t, "gone"));
    assert_non_null(route_table_find(t, "live"));
    assert_non_null(route_table_find(t, "here"));
    assert_int_equal(route_table_count(t), 2);
    /* Its slot serves a new region, after every other free slot: filled
     * up, the table gives it out. The old decision's candidate there is no
     * longer the region it was, nor is one back under the same name. */
    for (int i = 0; i < 13; i++) {
        char name[24];
        snprintf(name, sizeof(name), "filler-%d", i);
        route_record f = mk(name, "m", "eu", 1, 10);
        add(t, &f, 5, 62000);
    }
    route_record other = mk("other", "m", "eu", 1, 10);
    add(t, &other, 5, 62000);
    assert_int_equal(route_table_count(t), 16);
    int gone_at = -1;
    for (int i = 0; i < d.n; i++) {
        bool is = route_region_is(d.cand[i], d.cand_id[i]);
        if (!strcmp(d.cand[i]->rec.name, "other")) {
            gone_at = i;
            assert_false(is);
        } else {
            assert_true(is);
        }
    }
    assert_true(gone_at >= 0);
    route_table_remove(t, "other");
    add(t, &gone, 5, 62000);
    assert_non_null(route_table_find(t, "gone"));
    assert_false(route_region_is(route_table_find(t, "gone"), d.cand_id[gone_at]));
    route_table_free(t);
}

/* A failover re-checks a later candidate against the query: the record
 * it holds may have been replaced since the decision. */
static void test_allows(void **state)
{
    (void)state;
    route_table *t = route_table_new(&opts, 16);
    int64_t now = 10000;
    route_record eu = mk("eu", "a,b", "eu,gdpr", 2, 10);
    add(t, &eu, 5, now);
    route_region *r = route_table_find(t, "eu");
    const char *need_eu[] = {"eu"}, *need_both[] = {"eu", "gdpr"}, *need_us[] = {"us"};
    route_query q = {.model = "a", .need_tags = need_both, .n_need_tags = 2};
    assert_true(route_region_allows(r, &q));
    q.model = "c";
    assert_false(route_region_allows(r, &q)); /* not its model */
    q.model = "a";
    q.need_tags = need_us;
    q.n_need_tags = 1;
    assert_false(route_region_allows(r, &q)); /* not its tag */
    q.need_tags = need_eu;
    q.max_price = 1.5;
    assert_false(route_region_allows(r, &q)); /* above the cap */
    q.max_price = 2;
    assert_true(route_region_allows(r, &q));
    /* the region's record replaced: eu dropped */
    route_record moved = mk("eu", "a,b", "us", 2, 10);
    moved.updated_ms++;
    assert_int_equal(route_table_upsert(t, &moved, false, now + 1), 0);
    assert_false(route_region_allows(r, &q));
    q.need_tags = need_us;
    assert_true(route_region_allows(r, &q));
    route_table_free(t);
}

/* A region serving two models is ranked for each by that model's load:
 * its idle workers of one model are no room for the other. */
static void test_model_load(void **state)
{
    (void)state;
    route_table *t = route_table_new(&opts, 16);
    int64_t now = 10000;
    route_record near = mk("near", "a,b", "", 1, 10), far = mk("far", "a", "", 1, 10);
    near.capacity = 9; /* a region-wide look: 1 running of 9, no wait */
    near.running = 1;
    near.n_load = 2;
    near.load[0] = (route_model_load){1, 1, 4, 10, 5}; /* a: one slot, busy, 4 waiting */
    near.load[1] = (route_model_load){8, 0, 0, 10, 5}; /* b: idle */
    far.capacity = 2;
    add(t, &near, 5, now);
    add(t, &far, 50, now);
    route_decision d;
    route_query q = query("a", now);
    route_decide(t, &q, &d);
    assert_string_equal(cand(&d, 0), "far");
    assert_string_equal(cand(&d, 1), "near");
    /* ttft, then 1 running + 4 queued + this one - 1 slot = 5 services of 10 + 5 x 128 ms */
    route_region *r = route_table_find(t, "near");
    assert_true(fabs(route_model_queue_ms(r, 0) - (10 + 5.0 * (10 + 5 * ROUTE_SERVICE_TOKENS))) < 1e-9);
    assert_true(fabs(d.expected_ms[1] - (5 + route_model_queue_ms(r, 0))) < 1e-9);
    q.model = "b";
    route_decide(t, &q, &d);
    assert_string_equal(cand(&d, 0), "near");
    assert_true(fabs(d.expected_ms[0] - 15) < 1e-9);
    /* A model with no ready worker (capacity 0) is not served there now,
     * though the region is healthy for its other model: its empty queue
     * must not put it first. */
    near.load[0] = (route_model_load){0, 0, 0, 0, 0};
    near.updated_ms++;
    assert_int_equal(route_table_upsert(t, &near, false, now), 0);
    q.model = "a";
    route_decide(t, &q, &d);
    assert_int_equal(d.n, 1);
    assert_string_equal(cand(&d, 0), "far");
    assert_int_equal(d.out_unhealthy, 1);
    assert_false(route_region_allows(r, &q));
    q.model = "b";
    assert_true(route_region_allows(r, &q));
    /* This region's own record is a heartbeat old: its workers are looked
     * at when the request is sent, so it stays a candidate. */
    route_record here = near;
    strcpy(here.name, "here");
    assert_int_equal(route_table_upsert(t, &here, true, now), 0);
    q.model = "a";
    assert_true(route_region_allows(route_table_find(t, "here"), &q));
    route_table_remove(t, "here");
    /* A record without model_load (an older gateway): the totals stand. */
    near.n_load = 0;
    near.updated_ms++;
    assert_int_equal(route_table_upsert(t, &near, false, now), 0);
    q.model = "a";
    route_decide(t, &q, &d);
    assert_string_equal(cand(&d, 0), "near");
    assert_true(route_model_queue_ms(r, 0) == route_queue_ms(r));
    route_table_free(t);
}

static int ref_cmp(const void *pa, const void *pb)
{
    const ref_entry *a = pa, *b = pb;
    if (a->group != b->group)
        return a->group - b->group;
    if (a->step != b->step)
        return a->step < b->step ? -1 : 1;
    if (a->r->rec.price_out != b->r->rec.price_out)
        return a->r->rec.price_out < b->r->rec.price_out ? -1 : 1;
    if (a->ms != b->ms)
        return a->ms < b->ms ? -1 : 1;
    return strcmp(a->r->rec.name, b->r->rec.name);
}

static bool ref_has(char (*list)[ROUTE_NAME_MAX], int n, const char *s)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(list[i], s))
            return true;
    return false;
}

static bool ref_has_tag(const route_record *r, const char *s)
{
    for (int i = 0; i < r->n_tags; i++)
        if (!strcmp(r->tags[i], s))
            return true;
    return false;
}


/* ---- carbon and primary policies ---- */

static void test_carbon_policy(void **state)
{
    route_table *t = route_table_new(&opts, 16);
    int64_t now = 1000;
    route_record dirty = mk("dirty", "m", "", 1.0, 10); /* 15 ms, 300 g */
    route_record clean = mk("clean", "m", "", 2.0, 10); /* 35 ms, 100 g */
    route_record far = mk("far", "m", "", 1.0, 10);     /* 70 ms, 50 g: over the SLO */
    route_record mute = mk("mute", "m", "", 1.0, 10);   /* 10 ms, no figure */
    dirty.carbon = 300;
    clean.carbon = 100;
    far.carbon = 50;
    add(t, &dirty, 5, now);
    add(t, &clean, 25, now);
    add(t, &far, 60, now);
    add(t, &mute, 0, now);
    route_decision d;
    route_query q = query("m", now);
    q.policy = ROUTE_CARBON;
    q.slo_ms = 50;
    assert_int_equal(route_decide(t, &q, &d), 4);
    assert_string_equal(cand(&d, 0), "clean");
    assert_string_equal(cand(&d, 1), "dirty");
    assert_string_equal(cand(&d, 2), "mute"); /* stating no figure: after those that do */
    assert_string_equal(cand(&d, 3), "far");
    assert_string_equal(d.reason, "carbon 100 g/kWh, 35.0 ms within slo 50");
    /* The price cap rules first. */
    q.max_price = 1.5;
    assert_int_equal(route_decide(t, &q, &d), 3);
    assert_string_equal(cand(&d, 0), "dirty");
    q.max_price = 0;
    /* A new figure (set-carbon) moves the choice. */
    dirty.carbon = 20;
    assert_int_equal(route_table_upsert(t, &dirty, false, now), 0);
    route_decide(t, &q, &d);
    assert_string_equal(cand(&d, 0), "dirty");
    /* A wider SLO lets the cleanest in; none within it: by latency. */
    q.slo_ms = 80;
    route_decide(t, &q, &d);
    assert_string_equal(cand(&d, 0), "dirty");
    far.carbon = 5;
    assert_int_equal(route_table_upsert(t, &far, false, now), 0);
    route_decide(t, &q, &d);
    assert_string_equal(cand(&d, 0), "far");
    q.slo_ms = 5;
    route_decide(t, &q, &d);
    assert_string_equal(cand(&d, 0), "mute");
    assert_string_equal(d.reason, "carbon: none within slo 5, latency 10.0 ms (rtt 0.0 + queue 10.0)");
    route_table_free(t);
}

/* Sets a region's idle estimate (its ttft_ms) to ms. */
static void set_queue(route_table *t, route_record *r, double ms, int64_t now)
{
    r->ttft_ms = ms;
    r->updated_ms++;
    assert_int_equal(route_table_upsert(t, r, false, now), 0);
}

static void test_primary_policy(void **state)
{
    route_table_opts o = opts;
    o.stale_after_ms = 0; /* records are set by hand here, not refreshed */
    route_table *t = route_table_new(&o, 16);
    int64_t now = 1000;
    route_record own = mk("own", "m", "eu", 1.0, 10);  /* 15 ms */
    route_record rsv = mk("rsv", "m", "eu", 2.0, 10);  /* 30 ms */
    route_record ond = mk("ond", "m", "", 0.5, 10);    /* 12 ms: fastest, not listed */
    add(t, &own, 5, now);
    add(t, &rsv, 20, now);
    add(t, &ond, 2, now);
    route_primary pl;
    const char *list[] = {"own", "rsv"};
    route_primary_init(&pl, list, 2, 0.5, 1000);
    route_decision d;
    route_query q = query("m", now);
    q.policy = ROUTE_PRIMARY;
    q.primary = &pl;
    q.slo_ms = 100;
    assert_int_equal(route_decide(t, &q, &d), 3);
    assert_string_equal(cand(&d, 0), "own");
    assert_string_equal(cand(&d, 1), "rsv");
    assert_string_equal(cand(&d, 2), "ond");
    assert_string_equal(d.reason, "primary 1st of 2, 15.0 ms within slo 100");
    /* own's queue grows past the SLO: spill to rsv */
    set_queue(t, &own, 200, now);
    q.now_ms = now += 10;
    route_decide(t, &q, &d);
    assert_string_equal(cand(&d, 0), "rsv");
    assert_string_equal(d.reason, "primary 2nd of 2 (1 spilled), 30.0 ms within slo 100");
    assert_int_equal(pl.switches, 1);
    /* Back under the SLO but not under half of it: no return, however
     * often it crosses the SLO (no flapping). */
    for (int i = 0; i < 50; i++) {
        set_queue(t, &own, i % 2 ? 90 : 110, now);
        q.now_ms = now += 100;
        route_decide(t, &q, &d);
        assert_string_equal(cand(&d, 0), "rsv");
    }
    /* Under half the SLO: back only after the hold time. */
    set_queue(t, &own, 20, now);
    q.now_ms = now += 10;
    route_decide(t, &q, &d);
    assert_string_equal(cand(&d, 0), "rsv");
    q.now_ms = now += 999;
    route_decide(t, &q, &d);
    assert_string_equal(cand(&d, 0), "rsv");
    q.now_ms = now += 1;
    route_decide(t, &q, &d);
    assert_string_equal(cand(&d, 0), "own");
    assert_int_equal(pl.switches, 2);
    /* A rise during the hold starts it again. */
    set_queue(t, &own, 200, now);
    q.now_ms = now += 10;
    route_decide(t, &q, &d);
    set_queue(t, &own, 20, now);
    q.now_ms = now += 10;
    route_decide(t, &q, &d);
    set_queue(t, &own, 60, now);
    q.now_ms = now += 600;
    route_decide(t, &q, &d);
    set_queue(t, &own, 20, now);
    q.now_ms = now += 600;
    route_decide(t, &q, &d);
    assert_string_equal(cand(&d, 0), "rsv");
    q.now_ms = now += 1000;
    route_decide(t, &q, &d);
    assert_string_equal(cand(&d, 0), "own");
    assert_int_equal(pl.switches, 4);
    /* A 429 spills it for the hold time, its estimate low or not. */
    route_region_note_busy(route_table_find(t, "own"), now);
    q.now_ms = now += 10;
    route_decide(t, &q, &d);
    assert_string_equal(cand(&d, 0), "rsv");
    q.now_ms = now += 1000; /* the 429 is as old as the hold: the return's hold starts */
    route_decide(t, &q, &d);
    assert_string_equal(cand(&d, 0), "rsv");
    q.now_ms = now += 1000;
    route_decide(t, &q, &d);
    assert_string_equal(cand(&d, 0), "own");
    /* None of the list able: the fastest of all */
    set_queue(t, &own, 200, now);
    set_queue(t, &rsv, 200, now);
    q.now_ms = now += 10;
    route_decide(t, &q, &d);
    assert_string_equal(cand(&d, 0), "ond");
    assert_string_equal(d.reason, "primary: none able within slo 100, latency 12.0 ms (rtt 2.0 + queue 10.0)");
    /* Residency rules first: a request that needs eu never goes to ond */
    const char *eu[] = {"eu"};
    q.need_tags = eu;
    q.n_need_tags = 1;
    assert_int_equal(route_decide(t, &q, &d), 2);
    assert_string_equal(cand(&d, 0), "own");
    /* Without a list: the latency policy */
    q.need_tags = NULL;
    q.n_need_tags = 0;
    q.primary = NULL;
    route_decide(t, &q, &d);
    assert_string_equal(cand(&d, 0), "ond");
    route_table_free(t);
}
static void test_many(void **state)
{
    enum { N = 256 };
    static const char *const models[] = {"llama-7b", "llama-70b", "mistral", "tiny", "qwen", "phi"};
    static const char *const tags[] = {"eu", "us", "gdpr", "hipaa", "apac", "edge"};
    route_table *t = route_table_new(&opts, N);
    srand(12345);
    int64_t now = 1000000;
    for (int i = 0; i < N; i++) {
        route_record r;
        memset(&r, 0, sizeof(r));
        snprintf(r.name, sizeof(r.name), "region-%03d", (i * 97) % N);
        for (int m = 0; m < 6; m++)
            if (rand() % 2)
                strcpy(r.models[r.n_models++], models[m]);
        for (int g = 0; g < 6; g++)
            if (rand() % 3 == 0)
                strcpy(r.tags[r.n_tags++], tags[g]);
        r.price_out = (rand() % 8) * 0.25;
        r.capacity = rand() % 16;
        r.running = rand() % 16;
        r.queued = rand() % 4 ? 0 : rand() % 20;
        r.ttft_ms = 5 + rand() % 40;
        r.tpot_ms = (rand() % 100) / 50.0;
        r.healthy = rand() % 10 != 0;
        r.updated_ms = 1;
        bool local = i == 17;
        assert_int_equal(route_table_upsert(t, &r, local, now - (rand() % 10 == 0 ? 5000 : 0)), 0);
        if (rand() % 8)
            route_table_set_rtt(t, r.name, (rand() % 2000) / 10.0, 300);
        route_region *rr = route_table_find(t, r.name);
        if (rand() % 12 == 0)
            for (int k = 0; k < 3; k++)
                route_region_report(t, rr, false, now);
    }
    assert_int_equal(route_table_count(t), N);

    static ref_entry ref[N];
    for (int iter = 0; iter < 400; iter++) {
        route_query q = query(models[rand() % 6], now);
        const char *need[2];
        q.n_need_tags = rand() % 3;
        for (int j = 0; j < q.n_need_tags; j++)
            need[j] = tags[rand() % 3];
        q.need_tags = need;
        q.max_price = rand() % 3 ? 0 : 1.0;
        q.policy = rand() % 2 ? ROUTE_COST : ROUTE_LATENCY;
        q.slo_ms = rand() % 4 ? 20 + rand() % 150 : 0;

        int n_ref = 0, out = 0;
        double best = INFINITY;
        for (int i = 0; i < N; i++) {
            route_region *r = route_table_at(t, i);
            const route_record *rec = &r->rec;
            bool ok = ref_has((char(*)[ROUTE_NAME_MAX])rec->models, rec->n_models, q.model) &&
                      route_region_fresh(t, r, now) && rec->healthy && !route_region_ejected(r, now) &&
                      r->ejected_until_ms == 0 && (q.max_price <= 0 || rec->price_out <= q.max_price);
            for (int j = 0; ok && j < q.n_need_tags; j++)
                ok = ref_has_tag(rec, need[j]);
            if (!ok) {
                out++;
                continue;
            }
            double ms = (r->local ? 0 : r->rtt_known ? r->rtt_ewma_ms : 50) + route_queue_ms(r);
            ref[n_ref++] = (ref_entry){r, ms, 0, 0};
            if (ms < best)
                best = ms;
        }
        for (int i = 0; i < n_ref; i++) {
            ref[i].step = (int64_t)floor((ref[i].ms - best) / 0.5);
            if (q.policy == ROUTE_COST && q.slo_ms > 0 && ref[i].ms > q.slo_ms)
                ref[i].group = 1;
            else if (q.policy == ROUTE_COST)
                ref[i].step = 0;
        }
        qsort(ref, (size_t)n_ref, sizeof(*ref), ref_cmp);

        route_decision d;
        int n = route_decide(t, &q, &d);
        int want = n_ref < ROUTE_MAX_CANDIDATES ? n_ref : ROUTE_MAX_CANDIDATES;
        if (n != want)
            fail_msg("iter %d: %d candidates, want %d", iter, n, want);
        assert_int_equal(
            d.out_model + d.out_stale + d.out_unhealthy + d.out_ejected + d.out_residency + d.out_price, out);
        for (int i = 0; i < n; i++)
            if (d.cand[i] != ref[i].r || d.expected_ms[i] != ref[i].ms)
                fail_msg("iter %d: candidate %d is %s, want %s", iter, i, cand(&d, i), ref[i].r->rec.name);
    }
    route_table_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fields_round_trip),
        cmocka_unit_test(test_fields_bad),
        cmocka_unit_test(test_prefix_regions),
        cmocka_unit_test(test_prefix_fields_bad),
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_filters),
        cmocka_unit_test(test_latency_order),
        cmocka_unit_test(test_queue_moves),
        cmocka_unit_test(test_rtt_moves),
        cmocka_unit_test(test_cost_policy),
        cmocka_unit_test(test_ejection),
        cmocka_unit_test(test_check_ejection),
        cmocka_unit_test(test_local),
        cmocka_unit_test(test_models),
        cmocka_unit_test(test_allows),
        cmocka_unit_test(test_model_load),
        cmocka_unit_test(test_prune),
        cmocka_unit_test(test_recovery_grace),
        cmocka_unit_test(test_recovery_grace_once),
        cmocka_unit_test(test_news_as_of_last_read),
        cmocka_unit_test(test_held_by_ping),
        cmocka_unit_test(test_price_cap_both_prices),
        cmocka_unit_test(test_ping_yields_to_reads),
        cmocka_unit_test(test_tls_only),
        cmocka_unit_test(test_many),
        cmocka_unit_test(test_carbon_policy),
        cmocka_unit_test(test_primary_policy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
