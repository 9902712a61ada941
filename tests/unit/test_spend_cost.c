/* Tests of spend's arithmetic (gateway/front/spend.h): a request's cost is
 * the price per million input tokens times its prompt plus the price per
 * million output tokens times its completion; nothing is free but what a
 * zero price makes so, and nothing is counted twice. And the day names the
 * Redis keys are made of (routing/sync.h: route_spend_day_ok). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "gateway/front/spend.h"
#include "routing/sync.h"

#include <math.h>

static void assert_close(double got, double want)
{
    if (fabs(got - want) > 1e-12 * (fabs(want) > 1 ? fabs(want) : 1))
        fail_msg("got %.17g, want %.17g", got, want);
}

static void test_cost(void **state)
{
    (void)state;
    /* 1000 prompt tokens at 0.5 per million, 200 completion at 1.5 */
    assert_close(gw_spend_cost(0.5, 1.5, 1000, 200), 0.0005 + 0.0003);
    /* a million of each at the prices themselves */
    assert_close(gw_spend_cost(3, 15, 1e6, 1e6), 18);
    /* input and output prices are not swapped */
    assert_close(gw_spend_cost(1, 0, 0, 1e6), 0);
    assert_close(gw_spend_cost(0, 1, 1e6, 0), 0);
    assert_close(gw_spend_cost(1, 0, 1e6, 0), 1);
    /* no region section: prices 0, every request free */
    assert_close(gw_spend_cost(0, 0, 123456, 7890), 0);
    /* a context's worth at the config's highest price stays finite */
    assert_true(isfinite(gw_spend_cost(1e9, 1e9, 1 << 24, 1 << 24)));
    /* linear: two requests cost what both did together */
    assert_close(gw_spend_cost(0.7, 2.1, 300, 40) + gw_spend_cost(0.7, 2.1, 500, 60),
                 gw_spend_cost(0.7, 2.1, 800, 100));
}

static void test_day(void **state)
{
    (void)state;
    assert_true(route_spend_day_ok("2026-11-29"));
    assert_true(route_spend_day_ok("1999-01-01"));
    assert_false(route_spend_day_ok(NULL));
    assert_false(route_spend_day_ok(""));
    assert_false(route_spend_day_ok("2026-11-2"));
    assert_false(route_spend_day_ok("2026-11-290"));
    assert_false(route_spend_day_ok("2026/11/29"));
    assert_false(route_spend_day_ok("2026-1a-29"));
    assert_false(route_spend_day_ok("2026-11-29:x"));
    assert_false(route_spend_day_ok("*026-11-29")); /* a key pattern */
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_cost), cmocka_unit_test(test_day)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
