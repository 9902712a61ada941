/* Tests of several gateways under one region name (routing/instance.h), no
 * sockets: an entry's encoding (round trip, bad entries refused with a
 * reason and the record unchanged, fields a newer gateway adds ignored),
 * the field names taken as entries, and the merge rule by rule: health,
 * the lead's endpoint, sums, capacity-weighted estimates that skip entries
 * with none, models and tags every entry has (each once: a repeat is
 * refused), per-model load, highest prices, the newest stamp, and the
 * bound on entries merged. The merge over Redis, with real gateways, is
 * in test_sync. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "routing/instance.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static route_record entry(const char *models, const char *tags, int capacity, double ttft_ms)
{
    route_record r;
    memset(&r, 0, sizeof(r));
    snprintf(r.name, sizeof(r.name), "eu-west");
    const char *names[] = {"models", "tags", "endpoint"};
    const char *values[] = {models, tags, "tls:10.0.0.5:8443"};
    char err[128];
    assert_int_equal(route_record_from_fields(&r, names, values, NULL, 3, err, sizeof(err)), 0);
    r.price_in = 1;
    r.price_out = 2;
    r.capacity = capacity;
    r.running = capacity / 2;
    r.queued = 1;
    r.ttft_ms = ttft_ms;
    r.tpot_ms = 5;
    r.healthy = true;
    r.updated_ms = 1000;
    return r;
}

static void test_encode_round_trip(void **state)
{
    route_record r = entry("tiny,tiny-chat", "eu,gdpr", 8, 20.5);
    snprintf(r.gpu, sizeof(r.gpu), "H100 = 80GB"); /* an '=' in a value */
    r.n_load = 2;
    r.load[0] = (route_model_load){6, 1, 2, 0.1, 3};
    r.load[1] = (route_model_load){2, 0, 0, 7, 0.25};
    char *buf = malloc(ROUTE_INSTANCE_VALUE_MAX);
    assert_non_null(buf);
    size_t len = route_instance_encode(&r, buf);
    assert_int_equal(len, strlen(buf));
    assert_non_null(strstr(buf, "endpoint=tls:10.0.0.5:8443\n"));
    route_record back;
    memset(&back, 0, sizeof(back));
    snprintf(back.name, sizeof(back.name), "eu-west");
    char err[200];
    assert_int_equal(route_instance_decode(&back, buf, len, err, sizeof(err)), 0);
    assert_memory_equal(&back, &r, sizeof(r));

    /* A newer gateway's extra fields, and the last line without its
     * newline, read as well. */
    char longer[4096];
    snprintf(longer, sizeof(longer), "zone=b\nsome_much_longer_field_name_than_any_of_ours=x\n%.*s",
             (int)len - 1, buf);
    memset(&back, 0, sizeof(back));
    snprintf(back.name, sizeof(back.name), "eu-west");
    assert_int_equal(route_instance_decode(&back, longer, strlen(longer), err, sizeof(err)), 0);
    assert_memory_equal(&back, &r, sizeof(r));
    free(buf);
}

static void test_decode_bad(void **state)
{
    static const struct {
        const char *value;
        size_t len; /* 0: strlen */
        const char *want;
    } cases[] = {
        {"endpoint=tls:10.0.0.5:8443\ncapacity\n", 0, "line 2: no '='"},
        {"capacity=-1\n", 0, "capacity: must be a whole number"},
        {"endpoint=unix:/x\n", 0, "endpoint:"},
        {"healthy=2", 0, "healthy: must be 0 or 1"},
        {"capa\0city=1\n", 12, "line 1: a NUL byte in the name"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        route_record r = entry("tiny", "eu", 8, 20), before = r;
        char err[200] = "";
        size_t len = cases[i].len ? cases[i].len : strlen(cases[i].value);
        assert_int_equal(route_instance_decode(&r, cases[i].value, len, err, sizeof(err)), -EINVAL);
        if (!strstr(err, cases[i].want))
            fail_msg("case %zu: error '%s' does not say '%s'", i, err, cases[i].want);
        assert_memory_equal(&r, &before, sizeof(r));
    }
    /* 65 lines: more than an entry may hold */
    char many[1024] = "";
    for (int i = 0; i < 65; i++)
        strcat(many, "x=1\n");
    route_record r = entry("tiny", "eu", 8, 20);
    char err[200];
    assert_int_equal(route_instance_decode(&r, many, strlen(many), err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "more than 64 lines"));
}

static void test_field_names(void **state)
{
    char id[ROUTE_INSTANCE_ID_LEN + 1];
    assert_true(route_instance_field("instance:0123456789abcdef", 25, id));
    assert_string_equal(id, "0123456789abcdef");
    assert_false(route_instance_field("instance:0123456789ABCDEF", 25, id)); /* we write lower case */
    assert_false(route_instance_field("instance:0123456789abcde", 24, id));
    assert_false(route_instance_field("instance:0123456789abcdef0", 26, id));
    assert_false(route_instance_field("instance", 8, id));
    assert_false(route_instance_field("endpoint", 8, id));
    assert_false(route_instance_field("instance:0123456789abcd\0f", 25, id));
}

static void test_merge_sums_and_estimates(void **state)
{
    route_record in[3] = {entry("tiny,tiny-chat", "eu,gdpr", 8, 20),
                          entry("tiny-chat,tiny", "gdpr,eu", 24, 60),
                          entry("tiny,tiny-chat", "eu,gdpr", 0, 0)};
    in[1].price_out = 3;
    in[2].price_in = 1.5;
    in[1].updated_ms = 990; /* a clock behind */
    in[2].updated_ms = 1010;
    route_record m;
    assert_int_equal(route_instances_merge(in, 3, &m), 0);
    assert_int_equal(m.instances, 3);
    assert_true(m.healthy);
    assert_int_equal(m.capacity, 32);
    assert_int_equal(m.running, 16);
    assert_int_equal(m.queued, 3);
    /* (8 x 20 + 24 x 60) / 32: the third, with no estimate, not counted */
    assert_true(m.ttft_ms == 50);
    assert_true(m.tpot_ms == 5);
    assert_true(m.price_in == 1.5 && m.price_out == 3);
    assert_int_equal(m.updated_ms, 1010);
    /* the lead's order */
    assert_int_equal(m.n_models, 2);
    assert_string_equal(m.models[0], "tiny");
    assert_int_equal(m.n_tags, 2);
    assert_string_equal(m.tags[0], "eu");
    assert_int_equal(m.n_load, 0); /* no entry gave per-model load */
    char err[200];
    assert_int_equal(route_record_check(&m, err, sizeof(err)), 0);

    /* No estimate anywhere: none. */
    in[0].ttft_ms = in[1].ttft_ms = 0;
    assert_int_equal(route_instances_merge(in, 3, &m), 0);
    assert_true(m.ttft_ms == 0);
}

static void test_merge_health_and_endpoint(void **state)
{
    route_record in[4] = {entry("tiny", "eu", 8, 20), entry("tiny", "eu", 8, 20), entry("tiny", "eu", 4, 20),
                          entry("tiny", "eu", 2, 20)};
    in[0].healthy = false; /* draining: its load is not the region's */
    in[0].capacity = 100;
    snprintf(in[2].endpoint, sizeof(in[2].endpoint), "tls:10.0.0.6:8443"); /* not behind the lead's */
    in[0].updated_ms = 5000;
    route_record m;
    assert_int_equal(route_instances_merge(in, 4, &m), 0);
    assert_true(m.healthy);
    assert_string_equal(m.endpoint, "tls:10.0.0.5:8443");
    assert_int_equal(m.instances, 2);
    assert_int_equal(m.capacity, 10);
    assert_int_equal(m.updated_ms, 5000); /* any writer keeps it fresh */

    /* None healthy: the first stands, unhealthy, counting them all. */
    for (int i = 0; i < 4; i++)
        in[i].healthy = false;
    assert_int_equal(route_instances_merge(in, 4, &m), 0);
    assert_false(m.healthy);
    assert_int_equal(m.capacity, 100);
    assert_int_equal(m.instances, 4);
    assert_int_equal(m.updated_ms, 5000);

    assert_int_equal(route_instances_merge(in, 0, &m), -ENOENT);

    /* A healthy entry with no endpoint for peers (region.endpoint is
     * optional) does not take the region's away from the others. */
    for (int i = 0; i < 4; i++)
        in[i].healthy = true;
    in[0].endpoint[0] = '\0';
    assert_int_equal(route_instances_merge(in, 4, &m), 0);
    assert_string_equal(m.endpoint, "tls:10.0.0.5:8443");
    assert_int_equal(m.instances, 2);
    assert_int_equal(m.capacity, 10);
}

/* The newest stamp stands still while an entry whose clock is ahead is
 * there; the version moves with any entry's, so the region stays news. */
static void test_merge_version(void **state)
{
    route_record in[2] = {entry("tiny", "eu", 8, 20), entry("tiny", "eu", 8, 20)};
    in[0].updated_ms = 9000; /* stopped, its clock ahead */
    in[1].updated_ms = 1000;
    route_record a, b;
    assert_int_equal(route_instances_merge(in, 2, &a), 0);
    in[1].updated_ms = 1200;
    assert_int_equal(route_instances_merge(in, 2, &b), 0);
    assert_int_equal(a.updated_ms, 9000);
    assert_int_equal(b.updated_ms, 9000);
    assert_true(a.version != b.version);
    route_table_opts o = {
        .stale_after_ms = 3000, .eject_after = 3, .eject_base_ms = 1000, .eject_max_ms = 8000};
    route_table *t = route_table_new(&o, 4);
    assert_non_null(t);
    assert_int_equal(route_table_upsert(t, &a, false, 0), 0);
    assert_int_equal(route_table_upsert(t, &b, false, 2500), 0);
    assert_true(route_region_fresh(t, route_table_find(t, "eu-west"), 4000));
    assert_int_equal(route_table_upsert(t, &b, false, 4000), 0); /* the same again: no news */
    assert_false(route_region_fresh(t, route_table_find(t, "eu-west"), 6000));
    route_table_free(t);
}

static void test_merge_models_and_load(void **state)
{
    route_record in[2] = {entry("a,b,c", "eu,gdpr", 8, 20), entry("c,a", "eu", 4, 40)};
    in[0].n_load = 3;
    in[0].load[0] = (route_model_load){4, 1, 0, 10, 1};
    in[0].load[1] = (route_model_load){2, 0, 0, 10, 1};
    in[0].load[2] = (route_model_load){2, 2, 1, 30, 3};
    in[1].n_load = 2;
    in[1].load[0] = (route_model_load){2, 0, 2, 0, 0};  /* c: no estimate yet */
    in[1].load[1] = (route_model_load){2, 1, 0, 40, 2}; /* a */
    route_record m;
    assert_int_equal(route_instances_merge(in, 2, &m), 0);
    /* only what both have: a request may reach either */
    assert_int_equal(m.n_models, 2);
    assert_string_equal(m.models[0], "a");
    assert_string_equal(m.models[1], "c");
    assert_int_equal(m.n_tags, 1);
    assert_string_equal(m.tags[0], "eu");
    assert_int_equal(m.n_load, 2);
    assert_int_equal(m.load[0].capacity, 6);
    assert_int_equal(m.load[0].running, 2);
    assert_true(m.load[0].ttft_ms == (4 * 10 + 2 * 40) / 6.0);
    assert_int_equal(m.load[1].capacity, 4);
    assert_int_equal(m.load[1].queued, 3);
    assert_true(m.load[1].ttft_ms == 30 && m.load[1].tpot_ms == 3);
    /* the totals count the merged models' workers: b's are no room for them */
    assert_int_equal(m.capacity, 10);
    assert_int_equal(m.running, 4);
    assert_int_equal(m.queued, 3);
    char err[200];
    assert_int_equal(route_record_check(&m, err, sizeof(err)), 0);

    /* One entry without per-model load: the totals stand for every model. */
    in[1].n_load = 0;
    assert_int_equal(route_instances_merge(in, 2, &m), 0);
    assert_int_equal(m.n_load, 0);
    assert_int_equal(m.n_models, 2);
}

/* Found by fuzz_region_entries: "models=tiny,tiny" was taken, and the
 * merge found the first entry for both names, so the region's capacity
 * counted it twice (40 where the entries total 24). */
static void test_repeats(void **state)
{
    static const char found[] = "=43\nmodels=tiny,tiny\n=5\nmodel_load=990;20:5:0:60:5,4:0:0:0:0\n"
                                "healthy=1\nupdated_ms=990\n";
    static const struct {
        const char *value, *want;
    } cases[] = {
        {found, "models: entry 2 repeats entry 1"},
        {"tags=eu,gdpr,eu\n", "tags: entry 3 repeats entry 1"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        route_record r = entry("tiny", "eu", 8, 20), before = r;
        char err[200] = "";
        assert_int_equal(route_instance_decode(&r, cases[i].value, strlen(cases[i].value), err, sizeof(err)),
                         -EINVAL);
        if (!strstr(err, cases[i].want))
            fail_msg("case %zu: error '%s' does not say '%s'", i, err, cases[i].want);
        assert_memory_equal(&r, &before, sizeof(r));
    }

    /* A record built without the parser: refused by the check, and the
     * merge counts each name once. */
    route_record in[2] = {entry("tiny,big", "eu,gdpr", 8, 20), entry("big,tiny", "gdpr,eu", 4, 20)};
    strcpy(in[0].models[1], "tiny");
    strcpy(in[0].tags[1], "eu");
    in[0].n_load = in[1].n_load = 2;
    in[0].load[0] = (route_model_load){20, 5, 0, 60, 5};
    in[0].load[1] = (route_model_load){4, 0, 0, 0, 0};
    in[1].load[0] = (route_model_load){3, 0, 0, 0, 0}; /* big */
    in[1].load[1] = (route_model_load){1, 1, 0, 0, 0}; /* tiny */
    char err[200];
    assert_int_equal(route_record_check(&in[0], err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "models[1]: repeats models[0]"));
    route_record m;
    assert_int_equal(route_instances_merge(in, 2, &m), 0);
    assert_int_equal(m.n_models, 1);
    assert_string_equal(m.models[0], "tiny");
    assert_int_equal(m.n_tags, 1);
    assert_int_equal(m.capacity, 21);
    assert_int_equal(m.load[0].running, 6);
    assert_int_equal(route_record_check(&m, err, sizeof(err)), 0);
}

static void test_merge_bounds(void **state)
{
    route_record *in = calloc(ROUTE_MAX_INSTANCES + 4, sizeof(*in));
    assert_non_null(in);
    for (int i = 0; i < ROUTE_MAX_INSTANCES + 4; i++)
        in[i] = entry("tiny", "eu", 1 << 28, 20); /* sums past INT_MAX */
    route_record m;
    assert_int_equal(route_instances_merge(in, ROUTE_MAX_INSTANCES + 4, &m), 0);
    assert_int_equal(m.instances, ROUTE_MAX_INSTANCES);
    assert_int_equal(m.capacity, 2147483647);
    char err[200];
    assert_int_equal(route_record_check(&m, err, sizeof(err)), 0);
    free(in);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_encode_round_trip),
        cmocka_unit_test(test_decode_bad),
        cmocka_unit_test(test_field_names),
        cmocka_unit_test(test_merge_sums_and_estimates),
        cmocka_unit_test(test_merge_health_and_endpoint),
        cmocka_unit_test(test_merge_models_and_load),
        cmocka_unit_test(test_repeats),
        cmocka_unit_test(test_merge_bounds),
        cmocka_unit_test(test_merge_version),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
