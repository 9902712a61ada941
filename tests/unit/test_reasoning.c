/* Reasoning split from the answer (runtime/reasoning): recorded answers of
 * thinking models, whole and fed split at every byte, give the same
 * reasoning and content; the template and prompt checks. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "runtime/reasoning.h"

static const struct {
    bool open;
    const char *text, *reasoning, *content;
} CASES[] = {
    {false, "<think>\nLet me see.\n</think>\n\nIt is 4.", "\nLet me see.\n", "It is 4."},
    {false, "\n<think>a < b</think>x</think>", "a < b", "x</think>"},
    {false, "No thinking here.", "", "No thinking here."},
    {false, "  <thin", "", "  <thin"},
    {false, "<think>\n\n</think>\n\nHi", "\n\n", "Hi"},
    {true, "Hmm, 2+2.\n</think>\n\n4", "Hmm, 2+2.\n", "4"},
    {true, "cut short </thi", "cut short </thi", ""},
    {false, "", "", ""},
};

static void run(size_t k, size_t cut_a, size_t cut_b)
{
    rt_think *t = rt_think_new(CASES[k].open);
    assert_non_null(t);
    const char *s = CASES[k].text;
    size_t n = strlen(s), cuts[3] = {cut_a, cut_b, n}, at = 0;
    char r[256] = "", c[256] = "";
    size_t rl = 0, cl = 0;
    for (int i = 0; i < 3; i++) {
        const char *pr, *pc;
        size_t nr, nc;
        assert_int_equal(rt_think_feed(t, s + at, cuts[i] - at, i == 2, &pr, &nr, &pc, &nc), 0);
        memcpy(r + rl, pr, nr);
        memcpy(c + cl, pc, nc);
        rl += nr;
        cl += nc;
        r[rl] = c[cl] = '\0';
        at = cuts[i];
    }
    if (strcmp(r, CASES[k].reasoning) || strcmp(c, CASES[k].content))
        fail_msg("%s cut %zu %zu: reasoning [%s] content [%s]", s, cut_a, cut_b, r, c);
    rt_think_free(t);
}

static void test_recorded(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof(CASES) / sizeof(CASES[0]); k++) {
        size_t n = strlen(CASES[k].text);
        for (size_t a = 0; a <= n; a++)
            for (size_t b = a; b <= n; b++)
                run(k, a, b);
    }
}

static void test_checks(void **state)
{
    (void)state;
    const char *q3 = "{%- if enable_thinking is false %}<think>\n\n</think>\n\n{%- endif %}";
    assert_true(rt_think_template(q3, strlen(q3)));
    assert_false(rt_think_template("<|im_start|>", 12));
    assert_true(rt_think_open("<|Assistant|><think>\n", 21));
    assert_false(rt_think_open("<think>\n\n</think>\n\n", 19));
    assert_false(rt_think_open("plain", 5));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recorded),
        cmocka_unit_test(test_checks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
