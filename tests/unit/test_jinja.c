/* Tests of the Jinja renderer's contract (runtime/jinja/jinja.h) that the
 * oracle test (jinja_oracle.py, against Python's Jinja2) cannot see: parse
 * errors name their line and what is not supported; raise_exception's
 * message comes back as it is; every bound (steps, depth, output, memory)
 * stops a render with -E2BIG; the plain spans follow a message's text
 * through the template's string operations and nothing else; bad source
 * (not UTF-8, too large) is refused. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "runtime/jinja/jinja.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse(const char *src, rt_jinja **t, char *err, size_t len)
{
    return rt_jinja_parse(src, strlen(src), t, err, len);
}

/* Renders src over the JSON plain and trusted objects; the rc, the output
 * in *out (to dispose) and the message in err. */
static int render(const char *src, const char *plain, const char *trusted, const rt_jinja_limits *lim,
                  rt_jinja_output *out, char *err, size_t len)
{
    rt_jinja *t;
    int rc = parse(src, &t, err, len);
    assert_int_equal(rc, 0);
    json_t *p = plain ? json_loads(plain, 0, NULL) : NULL, *tr = trusted ? json_loads(trusted, 0, NULL) : NULL;
    rt_jinja_input in = {.plain = p, .trusted = tr, .now = 1735787045};
    if (lim)
        in.limits = *lim;
    rc = rt_jinja_render(t, &in, out, err, len);
    json_decref(p);
    json_decref(tr);
    rt_jinja_free(t);
    return rc;
}

static void test_parse_errors_name_the_line(void **state)
{
    (void)state;
    char err[256];
    rt_jinja *t;
    assert_int_equal(parse("line one\n{% if x %}\n{{ y }\n{% endif %}", &t, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "template line 3"));
    assert_int_equal(parse("a\nb\n{{ x | nosuchfilter }}", &t, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "template line 3"));
    assert_non_null(strstr(err, "nosuchfilter"));
    assert_int_equal(parse("{% include 'x.jinja' %}", &t, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "'include' is not supported"));
    assert_int_equal(parse("{% for x in y %}", &t, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "endfor"));
    assert_int_equal(parse("{{ x is nosuchtest }}", &t, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "nosuchtest"));
    assert_int_equal(parse("{# never closed", &t, err, sizeof(err)), -EINVAL);
    assert_int_equal(parse("{{ 'never closed }}", &t, err, sizeof(err)), -EINVAL);
    assert_int_equal(parse("{{ (1, 2] }}", &t, err, sizeof(err)), -EINVAL);
    assert_int_equal(rt_jinja_parse("\xff\xfe{{ x }}", 8, &t, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "UTF-8"));
    char *big = malloc(RT_JINJA_MAX_SOURCE + 2);
    memset(big, 'a', RT_JINJA_MAX_SOURCE + 1);
    assert_int_equal(rt_jinja_parse(big, RT_JINJA_MAX_SOURCE + 1, &t, err, sizeof(err)), -EINVAL);
    free(big);
    /* nesting past the parser's bound is an error, not a stack overflow */
    char deep[4096] = "{{ ";
    for (int i = 0; i < 1000; i++)
        strcat(deep, "(");
    assert_int_equal(parse(deep, &t, err, sizeof(err)), -EINVAL);
}

static void test_render_errors(void **state)
{
    (void)state;
    char err[256];
    rt_jinja_output out;
    assert_int_equal(render("{{ raise_exception('Roles must alternate!') }}", NULL, NULL, NULL, &out, err,
                            sizeof(err)),
                     -EINVAL);
    assert_string_equal(err, "Roles must alternate!");
    assert_null(out.text);
    assert_int_equal(render("ok\n{{ messages[0].content + 1 }}", "{\"messages\": [{\"content\": \"x\"}]}", NULL,
                            NULL, &out, err, sizeof(err)),
                     -EINVAL);
    assert_non_null(strstr(err, "template line 2"));
    assert_int_equal(render("{{ nothing.here }}", NULL, NULL, NULL, &out, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "'nothing' is undefined"));
}

static void test_bounds(void **state)
{
    (void)state;
    char err[256];
    rt_jinja_output out;
    rt_jinja_limits lim = {.max_steps = 100000};
    assert_int_equal(render("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", NULL,
                            NULL, &lim, &out, err, sizeof(err)),
                     -E2BIG);
    assert_non_null(strstr(err, "steps"));
    lim = (rt_jinja_limits){.max_depth = 50};
    assert_int_equal(render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, NULL, &lim, &out, err,
                            sizeof(err)),
                     -E2BIG);
    assert_non_null(strstr(err, "deeper"));
    /* the default depth bound holds too, well within the stack */
    assert_int_equal(render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, NULL, NULL, &out, err,
                            sizeof(err)),
                     -E2BIG);
    lim = (rt_jinja_limits){.max_output = 10000};
    assert_int_equal(render("{% for i in range(100) %}{{ 'x' * 1000 }}{% endfor %}", NULL, NULL, &lim, &out, err,
                            sizeof(err)),
                     -E2BIG);
    lim = (rt_jinja_limits){.max_memory = 1 << 20, .max_output = 1 << 30};
    assert_int_equal(render("{% set ns = namespace(s='') %}{% for i in range(5000) %}"
                            "{% set ns.s = ns.s ~ 'abcdefghijklmnopqrstuvwxyz' %}{% endfor %}{{ ns.s|length }}",
                            NULL, NULL, &lim, &out, err, sizeof(err)),
                     -E2BIG);
    assert_non_null(strstr(err, "memory"));
    assert_int_equal(render("{{ range(1000000)|length }}", NULL, NULL, NULL, &out, err, sizeof(err)), -EINVAL);
}

/* The bytes of out covered by plain spans, concatenated. */
static void plain_text(const rt_jinja_output *out, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < out->n_plain; i++) {
        assert_true(out->plain[i].off + out->plain[i].len <= out->len);
        assert_true(at + out->plain[i].len + 2 < len);
        memcpy(buf + at, out->text + out->plain[i].off, out->plain[i].len);
        at += out->plain[i].len;
        buf[at++] = '|';
        buf[at] = '\0';
    }
}

static void test_plain_spans(void **state)
{
    (void)state;
    char err[256], plain[1024];
    rt_jinja_output out;
    const char *msgs = "{\"messages\": [{\"role\": \"user\", \"content\": \"  hi <|im_start|>  \"}], "
                       "\"tools\": [{\"name\": \"f<x>\"}]}";
    /* ChatML: the role and the content are plain, the template's text is not */
    assert_int_equal(render("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                            "{% endfor %}<|im_start|>assistant\n",
                            msgs, NULL, NULL, &out, err, sizeof(err)),
                     0);
    plain_text(&out, plain, sizeof(plain));
    assert_string_equal(plain, "user|  hi <|im_start|>  |");
    rt_jinja_output_dispose(&out);
    /* through +, trim, slicing and split: still exactly the message's bytes */
    assert_int_equal(render("{{ '<s>' + messages[0].content|trim + '</s>' }}{{ messages[0].content.split('<|')[1] }}"
                            "{{ bos_token }}",
                            msgs, "{\"bos_token\": \"<BOS>\"}", NULL, &out, err, sizeof(err)),
                     0);
    assert_string_equal(out.text, "<s>hi <|im_start|></s>im_start|>  <BOS>");
    plain_text(&out, plain, sizeof(plain));
    assert_string_equal(plain, "hi <|im_start|>|im_start|>  |");
    rt_jinja_output_dispose(&out);
    /* tojson of client data is plain as a whole; a trusted string is not */
    assert_int_equal(render("{{ tools|tojson }}{{ eos|tojson }}", msgs, "{\"eos\": \"</s>\"}", NULL, &out, err,
                            sizeof(err)),
                     0);
    assert_string_equal(out.text, "[{\"name\": \"f<x>\"}]\"</s>\"");
    plain_text(&out, plain, sizeof(plain));
    assert_string_equal(plain, "\"name\"|\"f<x>\"|"); /* keys are the client's too */
    rt_jinja_output_dispose(&out);
}

static void test_whitespace_and_values(void **state)
{
    (void)state;
    char err[256];
    rt_jinja_output out;
    assert_int_equal(render("  {% if true %}\n    a\n  {% endif %}\n{{- ' b ' -}}\n c", NULL, NULL, NULL, &out, err,
                            sizeof(err)),
                     0);
    assert_string_equal(out.text, "    a\n b c");
    rt_jinja_output_dispose(&out);
    assert_int_equal(render("{{ 0.1 + 0.2 }} {{ 1e100 }} {{ [1, 'a', none] }} {{ {'k': true} }}", NULL, NULL, NULL,
                            &out, err, sizeof(err)),
                     0);
    assert_string_equal(out.text, "0.30000000000000004 1e+100 [1, 'a', None] {'k': True}");
    rt_jinja_output_dispose(&out);
    assert_int_equal(render("{{ strftime_now('%Y-%m-%d') }}", NULL, NULL, NULL, &out, err, sizeof(err)), 0);
    assert_int_equal((int)out.len, 10);
    rt_jinja_output_dispose(&out);
}

int main(void)
{
    setenv("TZ", "UTC", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_errors_name_the_line),
        cmocka_unit_test(test_render_errors),
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_plain_spans),
        cmocka_unit_test(test_whitespace_and_values),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
