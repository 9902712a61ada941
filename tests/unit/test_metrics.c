/* Tests of the Prometheus registry: the exact text exposition of counters,
 * gauges and histograms (declaration order, first-use order, cumulative
 * buckets, _sum and _count, HELP escaping), number spelling, label-value
 * escaping with truncation, gauge clearing, the series cap with its dropped
 * counter, describe's errors, ignored misuse, and many series in one
 * family (the index grows). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "gateway/front/metrics.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DROPPED(n)                                                                                           \
    "# HELP infergate_metrics_dropped_total Metric updates dropped because the registry reached its series " \
    "limit.\n"                                                                                               \
    "# TYPE infergate_metrics_dropped_total counter\n"                                                       \
    "infergate_metrics_dropped_total " n "\n"

static void assert_render(const gw_metrics *m, const char *want)
{
    size_t len = 0;
    char *got = gw_metrics_render(m, &len);
    assert_non_null(got);
    assert_int_equal(len, strlen(got));
    if (strcmp(got, want))
        fail_msg("render:\n--- got\n%s--- want\n%s", got, want);
    free(got);
}

/* test_render's families as they render twice: the series of temp and
 * idle, which change in between, are left to the test. */
#define REQ_TOTAL_TEXT                                                                                       \
    "# HELP req_total Requests.\n"                                                                           \
    "# TYPE req_total counter\n"                                                                             \
    "req_total{code=\"500\"} 2.5\n"                                                                          \
    "req_total{code=\"200\"} 1\n"
#define TEMP_HEAD "# HELP temp Back\\\\slash \"q\"\\nline two\n# TYPE temp gauge\n"
#define LAT_SECONDS_TEXT                                                                                     \
    "# HELP lat_seconds Latency.\n"                                                                          \
    "# TYPE lat_seconds histogram\n"                                                                         \
    "lat_seconds_bucket{model=\"m\",le=\"0.125\"} 2\n"                                                       \
    "lat_seconds_bucket{model=\"m\",le=\"0.5\"} 2\n"                                                         \
    "lat_seconds_bucket{model=\"m\",le=\"1\"} 3\n"                                                           \
    "lat_seconds_bucket{model=\"m\",le=\"+Inf\"} 4\n"                                                        \
    "lat_seconds_sum{model=\"m\"} 4.9375\n"                                                                  \
    "lat_seconds_count{model=\"m\"} 4\n"                                                                     \
    "lat_seconds_bucket{le=\"0.125\"} 0\n"                                                                   \
    "lat_seconds_bucket{le=\"0.5\"} 1\n"                                                                     \
    "lat_seconds_bucket{le=\"1\"} 1\n"                                                                       \
    "lat_seconds_bucket{le=\"+Inf\"} 1\n"                                                                    \
    "lat_seconds_sum 0.25\n"                                                                                 \
    "lat_seconds_count 1\n"
#define IDLE_HEAD "# HELP idle Never set.\n# TYPE idle gauge\n"

static void test_render(void **state)
{
    gw_metrics *m = gw_metrics_new(100);
    assert_non_null(m);
    static const double lat[] = {0.125, 0.5, 1};
    assert_int_equal(gw_metrics_describe(m, "req_total", GW_COUNTER, "Requests.", NULL, 0), 0);
    assert_int_equal(gw_metrics_describe(m, "temp", GW_GAUGE, "Back\\slash \"q\"\nline two", NULL, 0), 0);
    assert_int_equal(gw_metrics_describe(m, "lat_seconds", GW_HISTOGRAM, "Latency.", lat, 3), 0);
    assert_int_equal(gw_metrics_describe(m, "idle", GW_GAUGE, "Never set.", NULL, 0), 0);

    /* Updated in an order other than declaration, to see both orders. */
    gw_metrics_observe(m, "lat_seconds", "model=\"m\"", 0.0625);
    gw_metrics_add(m, "req_total", "code=\"500\"", 2);
    gw_metrics_add(m, "req_total", "code=\"200\"", 1);
    gw_metrics_add(m, "req_total", "code=\"500\"", 0.5);
    gw_metrics_set(m, "temp", "", 21.5);
    gw_metrics_set(m, "temp", "", -3);
    gw_metrics_observe(m, "lat_seconds", "model=\"m\"", 0.125); /* le is inclusive */
    gw_metrics_observe(m, "lat_seconds", "model=\"m\"", 0.75);
    gw_metrics_observe(m, "lat_seconds", "model=\"m\"", 4);
    gw_metrics_observe(m, "lat_seconds", "", 0.25);

    assert_render(m, REQ_TOTAL_TEXT TEMP_HEAD "temp -3\n" LAT_SECONDS_TEXT IDLE_HEAD DROPPED("0"));

    /* Misuse is ignored: wrong type, undeclared, counters going down, NaN
     * observations. None of it is a dropped update either. */
    gw_metrics_set(m, "req_total", "code=\"200\"", 100);
    gw_metrics_add(m, "temp", "", 1);
    gw_metrics_observe(m, "req_total", "", 1);
    gw_metrics_add(m, "nope_total", "", 1);
    gw_metrics_add(m, "req_total", "code=\"200\"", -1);
    gw_metrics_add(m, "req_total", "code=\"200\"", NAN);
    gw_metrics_observe(m, "lat_seconds", "", NAN);
    gw_metrics_add(m, "infergate_metrics_dropped_total", "", 1);

    /* Clearing a gauge family drops its series; setting brings them back. */
    gw_metrics_clear(m, "temp");
    gw_metrics_clear(m, "undeclared");
    gw_metrics_set(m, "idle", "w=\"1\"", 0);
    assert_render(m, REQ_TOTAL_TEXT TEMP_HEAD LAT_SECONDS_TEXT IDLE_HEAD "idle{w=\"1\"} 0\n" DROPPED("0"));
    gw_metrics_free(m);
}

/* A total kept elsewhere comes in as it is, and never goes down. */
static void test_count_to(void **state)
{
    gw_metrics *m = gw_metrics_new(100);
    assert_non_null(m);
    assert_int_equal(gw_metrics_describe(m, "restarts_total", GW_COUNTER, "Restarts.", NULL, 0), 0);
    assert_int_equal(gw_metrics_describe(m, "g", GW_GAUGE, "A gauge.", NULL, 0), 0);
    gw_metrics_count_to(m, "restarts_total", "w=\"0\"", 2);
    gw_metrics_count_to(m, "restarts_total", "w=\"0\"", 1);
    gw_metrics_count_to(m, "restarts_total", "w=\"1\"", 0);
    gw_metrics_count_to(m, "g", "", 3); /* not a counter: ignored */
    size_t len;
    char *text = gw_metrics_render(m, &len);
    assert_non_null(text);
    assert_non_null(strstr(text, "restarts_total{w=\"0\"} 2\n"));
    assert_non_null(strstr(text, "restarts_total{w=\"1\"} 0\n"));
    assert_null(strstr(text, "\ng 3"));
    free(text);
    gw_metrics_count_to(m, "restarts_total", "w=\"0\"", 5);
    text = gw_metrics_render(m, &len);
    assert_non_null(strstr(text, "restarts_total{w=\"0\"} 5\n"));
    free(text);
    gw_metrics_free(m);
}

/* gw_metrics_sum: the series whose labels begin with a prefix, added up
 * (the dashboard's per-tenant figures). */
static void test_sum(void **state)
{
    gw_metrics *m = gw_metrics_new(100);
    assert_non_null(m);
    assert_int_equal(gw_metrics_describe(m, "spend_total", GW_COUNTER, "Spend.", NULL, 0), 0);
    gw_metrics_add(m, "spend_total", "tenant=\"a\",model=\"x\"", 1.5);
    gw_metrics_add(m, "spend_total", "tenant=\"a\",model=\"y\"", 2);
    gw_metrics_add(m, "spend_total", "tenant=\"ab\",model=\"x\"", 4);
    assert_true(gw_metrics_sum(m, "spend_total", "tenant=\"a\",") == 3.5);
    assert_true(gw_metrics_sum(m, "spend_total", "") == 7.5);
    assert_true(gw_metrics_sum(m, "nothing_total", "") == 0);
    gw_metrics_free(m);
}

static void test_numbers(void **state)
{
    gw_metrics *m = gw_metrics_new(100);
    assert_int_equal(gw_metrics_describe(m, "g", GW_GAUGE, "", NULL, 0), 0);
    static const double bounds[] = {-1, 0.001, 2.5e9};
    assert_int_equal(gw_metrics_describe(m, "h", GW_HISTOGRAM, "", bounds, 3), 0);
    static const struct {
        double v;
        const char *label, *want;
    } cases[] = {
        {0.1, "a", "0.1"},
        {1.0 / 3, "b", "0.33333333333333331"},
        {1234567, "c", "1234567"},
        {1e21, "d", "1e+21"},
        {-2.5e-7, "e", "-2.5e-07"},
        {INFINITY, "f", "+Inf"},
        {-INFINITY, "g", "-Inf"},
        {NAN, "h", "NaN"},
        {9007199254740993.0, "i", "9007199254740992"},
    };
    char want[2048] = "# HELP g \n# TYPE g gauge\n";
    for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
        char labels[32];
        snprintf(labels, sizeof(labels), "k=\"%s\"", cases[i].label);
        gw_metrics_set(m, "g", labels, cases[i].v);
        snprintf(want + strlen(want), sizeof(want) - strlen(want), "g{%s} %s\n", labels, cases[i].want);
    }
    gw_metrics_observe(m, "h", "", -5);
    strcat(want, "# HELP h \n# TYPE h histogram\n"
                 "h_bucket{le=\"-1\"} 1\n"
                 "h_bucket{le=\"0.001\"} 1\n"
                 "h_bucket{le=\"2500000000\"} 1\n"
                 "h_bucket{le=\"+Inf\"} 1\n"
                 "h_sum -5\n"
                 "h_count 1\n" DROPPED("0"));
    assert_render(m, want);
    gw_metrics_free(m);
}

static void test_escape(void **state)
{
    char buf[64];
    gw_metrics_escape("a\"b\\c\nd", buf, sizeof(buf));
    assert_string_equal(buf, "a\\\"b\\\\c\\nd");
    gw_metrics_escape("plain", buf, sizeof(buf));
    assert_string_equal(buf, "plain");
    gw_metrics_escape("", buf, sizeof(buf));
    assert_string_equal(buf, "");
    gw_metrics_escape(NULL, buf, sizeof(buf));
    assert_string_equal(buf, "");
    /* Truncation never splits an escape or a UTF-8 sequence. */
    gw_metrics_escape("ab\"cd", buf, 5);
    assert_string_equal(buf, "ab\\\"");
    gw_metrics_escape("ab\"cd", buf, 4);
    assert_string_equal(buf, "ab");
    gw_metrics_escape("a\xc3\xa9", buf, 3);
    assert_string_equal(buf, "a");
    gw_metrics_escape("a\xc3\xa9", buf, 4);
    assert_string_equal(buf, "a\xc3\xa9");
    gw_metrics_escape("\xe2\x82\xac\xe2\x82\xac", buf, 6); /* two euro signs, room for one */
    assert_string_equal(buf, "\xe2\x82\xac");
    gw_metrics_escape("abc", buf, 1);
    assert_string_equal(buf, "");
    buf[0] = 'x';
    gw_metrics_escape("abc", buf, 0);
    assert_int_equal(buf[0], 'x');
}

static void test_cap(void **state)
{
    gw_metrics *m = gw_metrics_new(3);
    assert_int_equal(gw_metrics_describe(m, "c_total", GW_COUNTER, "C.", NULL, 0), 0);
    assert_int_equal(gw_metrics_describe(m, "g", GW_GAUGE, "G.", NULL, 0), 0);
    gw_metrics_add(m, "c_total", "x=\"1\"", 1);
    gw_metrics_add(m, "c_total", "x=\"2\"", 1);
    gw_metrics_set(m, "g", "", 7);
    /* Full: new series are dropped and counted, existing ones still move. */
    gw_metrics_add(m, "c_total", "x=\"3\"", 1);
    gw_metrics_set(m, "g", "w=\"0\"", 1);
    gw_metrics_add(m, "c_total", "x=\"1\"", 1);
    assert_render(m, "# HELP c_total C.\n# TYPE c_total counter\n"
                     "c_total{x=\"1\"} 2\n"
                     "c_total{x=\"2\"} 1\n"
                     "# HELP g G.\n# TYPE g gauge\n"
                     "g 7\n" DROPPED("2"));
    /* Clearing frees room. */
    gw_metrics_clear(m, "g");
    gw_metrics_add(m, "c_total", "x=\"3\"", 5);
    gw_metrics_set(m, "g", "", 8);
    assert_render(m, "# HELP c_total C.\n# TYPE c_total counter\n"
                     "c_total{x=\"1\"} 2\n"
                     "c_total{x=\"2\"} 1\n"
                     "c_total{x=\"3\"} 5\n"
                     "# HELP g G.\n# TYPE g gauge\n" DROPPED("3"));
    gw_metrics_free(m);

    /* A registry with no room drops everything. */
    m = gw_metrics_new(0);
    assert_int_equal(gw_metrics_describe(m, "c_total", GW_COUNTER, "C.", NULL, 0), 0);
    gw_metrics_add(m, "c_total", "", 1);
    assert_render(m, "# HELP c_total C.\n# TYPE c_total counter\n" DROPPED("1"));
    gw_metrics_free(m);
    gw_metrics_free(NULL);
}

static void test_describe_errors(void **state)
{
    gw_metrics *m = gw_metrics_new(10);
    static const double up[] = {1, 2}, down[] = {2, 1}, same[] = {1, 1};
    double nan_b[] = {NAN}, inf_b[] = {INFINITY};
    assert_int_equal(gw_metrics_describe(m, "a_total", GW_COUNTER, "", NULL, 0), 0);
    assert_int_equal(gw_metrics_describe(m, "a_total", GW_GAUGE, "", NULL, 0), -EEXIST);
    assert_int_equal(gw_metrics_describe(m, "infergate_metrics_dropped_total", GW_COUNTER, "", NULL, 0),
                     -EEXIST);
    assert_int_equal(gw_metrics_describe(m, "", GW_COUNTER, "", NULL, 0), -EINVAL);
    assert_int_equal(gw_metrics_describe(m, "1abc", GW_COUNTER, "", NULL, 0), -EINVAL);
    assert_int_equal(gw_metrics_describe(m, "a-b", GW_COUNTER, "", NULL, 0), -EINVAL);
    assert_int_equal(gw_metrics_describe(m, NULL, GW_COUNTER, "", NULL, 0), -EINVAL);
    assert_int_equal(gw_metrics_describe(m, "h", GW_HISTOGRAM, "", down, 2), -EINVAL);
    assert_int_equal(gw_metrics_describe(m, "h", GW_HISTOGRAM, "", same, 2), -EINVAL);
    assert_int_equal(gw_metrics_describe(m, "h", GW_HISTOGRAM, "", nan_b, 1), -EINVAL);
    assert_int_equal(gw_metrics_describe(m, "h", GW_HISTOGRAM, "", inf_b, 1), -EINVAL);
    assert_int_equal(gw_metrics_describe(m, "h", GW_HISTOGRAM, "", NULL, 2), -EINVAL);
    assert_int_equal(gw_metrics_describe(m, "h", GW_HISTOGRAM, "", up, -1), -EINVAL);
    assert_int_equal(gw_metrics_describe(m, "ns:h_seconds", GW_HISTOGRAM, NULL, up, 2), 0);
    /* A histogram without bounds has only +Inf. */
    assert_int_equal(gw_metrics_describe(m, "h0", GW_HISTOGRAM, "", NULL, 0), 0);
    gw_metrics_observe(m, "h0", "", 3);
    char *out = gw_metrics_render(m, NULL);
    assert_non_null(out);
    assert_non_null(strstr(out, "# HELP ns:h_seconds \n# TYPE ns:h_seconds histogram\n"));
    assert_non_null(strstr(out, "h0_bucket{le=\"+Inf\"} 1\nh0_sum 3\nh0_count 1\n"));
    free(out);
    gw_metrics_free(m);
}

static void test_many_series(void **state)
{
    enum { N = 5000 };
    gw_metrics *m = gw_metrics_new(N);
    assert_int_equal(gw_metrics_describe(m, "r_total", GW_COUNTER, "R.", NULL, 0), 0);
    /* Pseudo-random first-use order (fixed stride, coprime with N). */
    for (int i = 0; i < N; i++) {
        char l[32];
        snprintf(l, sizeof(l), "i=\"%d\"", (i * 7919) % N);
        gw_metrics_add(m, "r_total", l, 1);
    }
    for (int i = 0; i < N; i++) {
        char l[32];
        snprintf(l, sizeof(l), "i=\"%d\"", i);
        gw_metrics_add(m, "r_total", l, (double)i);
    }
    size_t cap = 64 + (size_t)N * 40, len = 0;
    char *want = malloc(cap);
    assert_non_null(want);
    len = (size_t)snprintf(want, cap, "# HELP r_total R.\n# TYPE r_total counter\n");
    for (int i = 0; i < N; i++) {
        int k = (i * 7919) % N;
        len += (size_t)snprintf(want + len, cap - len, "r_total{i=\"%d\"} %d\n", k, k + 1);
    }
    snprintf(want + len, cap - len, DROPPED("0"));
    assert_render(m, want);
    free(want);
    gw_metrics_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_render),      cmocka_unit_test(test_count_to),      cmocka_unit_test(test_sum),
        cmocka_unit_test(test_numbers),     cmocka_unit_test(test_escape),
        cmocka_unit_test(test_cap),         cmocka_unit_test(test_describe_errors),
        cmocka_unit_test(test_many_series),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
