/* Tests of the gateway's JSON field scans (gateway/front/body_fields.c): the
 * request body fields (model, max_completion_tokens over max_tokens) with
 * escapes in keys and values, nesting, numbers, whitespace, duplicates of
 * the fields read, a table of malformed bodies, every truncation of valid
 * bodies and the nesting bound, each checked against jansson where it
 * accepts; and usage.completion_tokens read from a response fed whole, in
 * two pieces split anywhere, and byte by byte. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "gateway/front/body_fields.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int scan(const char *body, gw_body_fields *f, char *err, size_t err_len)
{
    return gw_body_fields_scan(body, strlen(body), f, err, err_len);
}

/* jansson's reading of the same body, as the gateway used to make it. */
/* What the worker takes for an integer (runtime/openai.c, get_int): an
 * integer, or a real with an integral value. (The scan leaves out a
 * number text too long for any sane count; none is compared here.) */
static bool integral(json_t *v, long long *out)
{
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return true;
    }
    if (!json_is_real(v))
        return false;
    double d = json_real_value(v);
    if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0) || d != (double)(long long)d)
        return false;
    *out = (long long)d;
    return true;
}

static void assert_like_jansson(const char *body, size_t len)
{
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    gw_body_fields f;
    char err[128];
    int rc = gw_body_fields_scan(body, len, &f, err, sizeof(err));
    if (!json_is_object(o)) {
        json_decref(o);
        return; /* the scan may accept more than jansson */
    }
    if (rc)
        fail_msg("jansson accepts %.*s, the scan says: %s", (int)len, body, err);
    json_t *m = json_object_get(o, "model");
    assert_int_equal(f.has_model, json_is_string(m));
    if (json_is_string(m)) {
        assert_int_equal(f.model_len, json_string_length(m));
        if (f.model_len < GW_BODY_MODEL_MAX)
            assert_memory_equal(f.model, json_string_value(m), f.model_len + 1);
    }
    long long want = -1;
    if (!integral(json_object_get(o, "max_completion_tokens"), &want))
        integral(json_object_get(o, "max_tokens"), &want);
    assert_int_equal(f.max_tokens, want);
    assert_int_equal(f.stream, json_is_true(json_object_get(o, "stream")));
    json_decref(o);
}

static void test_basic(void **state)
{
    gw_body_fields f;
    char err[128];
    const char *b = "{\"model\":\"m\",\"prompt\":[1,5,6],\"max_tokens\":1,\"temperature\":0}";
    assert_int_equal(scan(b, &f, err, sizeof(err)), 0);
    assert_true(f.has_model);
    assert_int_equal(f.model_len, 1);
    assert_string_equal(f.model, "m");
    assert_int_equal(f.max_tokens, 1);
    assert_like_jansson(b, strlen(b));

    assert_int_equal(scan("{}", &f, err, sizeof(err)), 0);
    assert_false(f.has_model);
    assert_int_equal(f.max_tokens, -1);

    /* JSON whitespace anywhere between tokens */
    b = " \t\r\n{ \"model\" :\n\"llama\" , \"max_tokens\"\t:\r-7 } \n";
    assert_int_equal(scan(b, &f, err, sizeof(err)), 0);
    assert_string_equal(f.model, "llama");
    assert_int_equal(f.max_tokens, -7);
    assert_like_jansson(b, strlen(b));
}

static void test_token_fields(void **state)
{
    static const struct {
        const char *body;
        long long want;
    } cases[] = {
        {"{\"max_tokens\":5,\"max_completion_tokens\":9}", 9},
        {"{\"max_completion_tokens\":9,\"max_tokens\":5}", 9},
        {"{\"max_completion_tokens\":\"9\",\"max_tokens\":5}", 5},
        {"{\"max_completion_tokens\":9.0,\"max_tokens\":5}", 9},
        {"{\"max_completion_tokens\":9.5,\"max_tokens\":5}", 5},
        {"{\"max_completion_tokens\":null,\"max_tokens\":5}", 5},
        {"{\"max_tokens\":5e0}", 5},
        {"{\"max_tokens\":1E2}", 100},
        {"{\"max_tokens\":100.000}", 100},
        {"{\"max_tokens\":-0.0}", 0},
        {"{\"max_tokens\":1e-2}", -1},
        {"{\"max_tokens\":1e300}", -1},
        {"{\"max_tokens\":9223372036854775808.0}", -1},
        {"{\"max_tokens\":100.00000000000000000000000000000000000000000000000000000000000000000}", 100},
        {"{\"max_tokens\":-0}", 0},
        {"{\"max_tokens\":0}", 0},
        {"{\"max_tokens\":9223372036854775807}", 9223372036854775807LL},
        {"{\"max_tokens\":-9223372036854775808}", -9223372036854775807LL - 1},
        {"{\"max_tokens\":[5]}", -1},
        {"{\"max_tokens\":{\"max_tokens\":5}}", -1},
        {"{\"opts\":{\"max_tokens\":5},\"x\":[{\"max_completion_tokens\":3}]}", -1},
        {"{\"max_tok\\u0065ns\":12}", 12},
        {"{\"\\u006dax_completion_tokens\":13,\"max_tokens\":1}", 13},
        {"{\"max_tokens \":5}", -1},
        {"{\"Max_tokens\":5}", -1},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        gw_body_fields f;
        char err[128];
        if (scan(cases[i].body, &f, err, sizeof(err)))
            fail_msg("%s: %s", cases[i].body, err);
        if (f.max_tokens != cases[i].want)
            fail_msg("%s: max_tokens %lld, want %lld", cases[i].body, f.max_tokens, cases[i].want);
        assert_like_jansson(cases[i].body, strlen(cases[i].body));
    }
    /* A number text of any length is read as the worker reads it: left
     * out, a tenant was charged for max_tokens 1 while the worker ran
     * 100000. */
    char body[4200];
    int n = snprintf(body, sizeof(body), "{\"max_tokens\":1,\"max_completion_tokens\":100000.%04000d}", 0);
    gw_body_fields f;
    char err[128];
    assert_int_equal(gw_body_fields_scan(body, (size_t)n, &f, err, sizeof(err)), 0);
    assert_int_equal(f.max_tokens, 100000);
    assert_like_jansson(body, (size_t)n);
}

static void test_model_values(void **state)
{
    static const struct {
        const char *body;
        bool has;
        const char *want;
    } cases[] = {
        {"{\"model\":\"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\te\"}", true, "a\"b\\c/d\b\f\n\r\te"},
        {"{\"model\":\"caf\\u00e9\"}", true, "caf\xc3\xa9"},
        {"{\"model\":\"caf\\u00E9\"}", true, "caf\xc3\xa9"},
        {"{\"model\":\"\\u20ac\\u0041\"}", true,
         "\xe2\x82\xac"
         "A"},
        {"{\"model\":\"\\ud83d\\ude00!\"}", true, "\xf0\x9f\x98\x80!"},
        {"{\"model\":\"\\uDBFF\\uDFFF\"}", true, "\xf4\x8f\xbf\xbf"},
        {"{\"model\":\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"}", true,
         "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"},
        {"{\"model\":\"\x7f\"}", true, "\x7f"},
        {"{\"model\":\"\"}", true, ""},
        {"{\"mod\\u0065l\":\"esc\"}", true, "esc"},
        {"{\"\\u006d\\u006f\\u0064\\u0065\\u006c\":\"all\"}", true, "all"},
        {"{\"model\":1}", false, ""},
        {"{\"model\":null}", false, ""},
        {"{\"model\":true}", false, ""},
        {"{\"model\":[\"m\"]}", false, ""},
        {"{\"model\":{\"model\":\"m\"}}", false, ""},
        {"{\"x\":{\"model\":\"m\"}}", false, ""},
        {"{\"messages\":[{\"model\":\"x\"}],\"model\":\"m\"}", true, "m"},
        {"{\"models\":\"m\"}", false, ""},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        gw_body_fields f;
        char err[128];
        if (scan(cases[i].body, &f, err, sizeof(err)))
            fail_msg("%s: %s", cases[i].body, err);
        assert_int_equal(f.has_model, cases[i].has);
        if (cases[i].has) {
            assert_int_equal(f.model_len, strlen(cases[i].want));
            assert_string_equal(f.model, cases[i].want);
        }
        assert_like_jansson(cases[i].body, strlen(cases[i].body));
    }
}

static void test_model_length(void **state)
{
    char body[1024], want[512];
    gw_body_fields f;
    char err[128];
    for (size_t n = 120; n <= 140; n++) {
        memset(want, 'x', n);
        want[n] = '\0';
        snprintf(body, sizeof(body), "{\"model\":\"%s\"}", want);
        assert_int_equal(scan(body, &f, err, sizeof(err)), 0);
        assert_true(f.has_model);
        assert_int_equal(f.model_len, n);
        if (n < GW_BODY_MODEL_MAX)
            assert_string_equal(f.model, want);
        else
            assert_int_equal(strlen(f.model), GW_BODY_MODEL_MAX - 1);
        assert_like_jansson(body, strlen(body));
    }
    /* escapes count as their decoded bytes: 64 x "\u00e9" is 128 bytes */
    char *o = body;
    o += sprintf(o, "{\"model\":\"");
    for (int i = 0; i < 64; i++)
        o += sprintf(o, "\\u00e9");
    sprintf(o, "\"}");
    assert_int_equal(scan(body, &f, err, sizeof(err)), 0);
    assert_int_equal(f.model_len, 128);
    assert_like_jansson(body, strlen(body));
}

static void test_duplicates(void **state)
{
    static const char *const rejected[] = {
        "{\"model\":\"a\",\"model\":\"b\"}",
        "{\"model\":\"a\",\"mod\\u0065l\":\"b\"}",
        "{\"model\":1,\"model\":\"b\"}",
        "{\"max_tokens\":1,\"max_tokens\":2}",
        "{\"max_completion_tokens\":1,\"x\":0,\"max_completion_tokens\":1}",
    };
    for (size_t i = 0; i < sizeof(rejected) / sizeof(rejected[0]); i++) {
        gw_body_fields f;
        char err[128];
        assert_int_equal(scan(rejected[i], &f, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "duplicate key"));
    }
    /* duplicates of fields not read, or below the top level, are the worker's to refuse */
    gw_body_fields f;
    char err[128];
    assert_int_equal(scan("{\"prompt\":1,\"prompt\":2,\"model\":\"m\"}", &f, err, sizeof(err)), 0);
    assert_int_equal(scan("{\"x\":{\"model\":1,\"model\":2},\"model\":\"m\"}", &f, err, sizeof(err)), 0);
    assert_string_equal(f.model, "m");
}

/* stream, read for hedging (front/hedge.c): true only as the top-level literal */
static void test_stream(void **state)
{
    static const struct {
        const char *body;
        bool stream;
    } cases[] = {
        {"{\"model\":\"m\",\"stream\":true}", true},
        {"{\"stream\" : true ,\"model\":\"m\"}", true},
        {"{\"model\":\"m\",\"stream\":false}", false},
        {"{\"model\":\"m\",\"stream\":null}", false},
        {"{\"model\":\"m\",\"stream\":\"true\"}", false},
        {"{\"model\":\"m\",\"stream\":1}", false},
        {"{\"model\":\"m\",\"x\":{\"stream\":true}}", false},
        {"{\"model\":\"m\",\"stre\\u0061m\":true}", true},
        {"{\"model\":\"m\",\"stream_options\":{\"include_usage\":true}}", false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        gw_body_fields f;
        char err[128];
        assert_int_equal(scan(cases[i].body, &f, err, sizeof(err)), 0);
        assert_int_equal(f.stream, cases[i].stream);
        assert_like_jansson(cases[i].body, strlen(cases[i].body));
    }
    gw_body_fields f;
    char err[128];
    assert_int_equal(scan("{\"stream\":true,\"stream\":false}", &f, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "duplicate key 'stream'"));
}

static void test_malformed(void **state)
{
    static const char *const bad[] = {
        "",
        " ",
        "[]",
        "[{\"model\":\"m\"}]",
        "\"model\"",
        "1",
        "null",
        "{",
        "}",
        "{\"a\"}",
        "{\"a\":}",
        "{\"a\" 1}",
        "{\"a\":1,}",
        "{,}",
        "{\"a\":1 \"b\":2}",
        "{a:1}",
        "{'a':1}",
        "{1:1}",
        "{\"a\":01}",
        "{\"a\":-}",
        "{\"a\":-a}",
        "{\"a\":+1}",
        "{\"a\":1.}",
        "{\"a\":1.e5}",
        "{\"a\":.5}",
        "{\"a\":1e}",
        "{\"a\":1e+}",
        "{\"a\":0x10}",
        "{\"a\":NaN}",
        "{\"a\":Infinity}",
        "{\"a\":tru}",
        "{\"a\":nul}",
        "{\"a\":True}",
        "{\"a\":falsey}",
        "{\"a\":nullx}",
        "{\"a\":[1,2}",
        "{\"a\":[1,]}",
        "{\"a\":[,1]}",
        "{\"a\":{]}",
        "{\"a\":{\"b\":1]}",
        "{\"a\":\"\\x\"}",
        "{\"a\":\"\\u12\"}",
        "{\"a\":\"\\u12g4\"}",
        "{\"a\":\"\\U0041\"}",
        "{\"a\":\"\\ud83d\"}",
        "{\"a\":\"\\ud83dx\"}",
        "{\"a\":\"\\ud83d\\u0041\"}",
        "{\"a\":\"\\ude00\"}",
        "{\"a\":\"\\u0000\"}",
        "{\"a\\u0000\":1}",
        "{\"a\":\"tab\there\"}",
        "{\"a\":\"nl\nhere\"}",
        "{\"a\":\"\x01\"}",
        "{\"a\":\"\xc0\x80\"}",
        "{\"a\":\"\xc1\xbf\"}",
        "{\"a\":\"\xe0\x80\x80\"}",
        "{\"a\":\"\xed\xa0\x80\"}",
        "{\"a\":\"\xf0\x80\x80\x80\"}",
        "{\"a\":\"\xf4\x90\x80\x80\"}",
        "{\"a\":\"\xf5\x80\x80\x80\"}",
        "{\"a\":\"\xff\"}",
        "{\"a\":\"\x80\"}",
        "{\"a\":\"\xc3\"}",
        "{\"a\":\"\xe2\x82\"}",
        "{\"a\":\"\xc3\x28\"}",
        "{\"a\":1}x",
        "{\"a\":1}{}",
        "{\"a\":1} 1",
        "\xef\xbb\xbf{}",
        "{\f}",
        "{\v\"a\":1}",
        "{\"a\":9223372036854775808}",
        "{\"a\":-9223372036854775809}",
        "{\"max_tokens\":99999999999999999999}",
        "{\"a\":[[[[[1]]]]}",
        "{\"a\":\"unterminated}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        gw_body_fields f;
        char err[128] = "unset";
        if (scan(bad[i], &f, err, sizeof(err)) != -EINVAL)
            fail_msg("accepted: %s", bad[i]);
        if (!err[0] || !strstr(err, " at byte "))
            fail_msg("%s: no reason with a position (%s)", bad[i], err);
        json_error_t je;
        json_t *o = json_loads(bad[i], JSON_REJECT_DUPLICATES, &je);
        if (json_is_object(o))
            fail_msg("jansson accepts %s", bad[i]);
        json_decref(o);
    }
    /* NUL bytes are not whitespace either; a small err buffer truncates */
    gw_body_fields f;
    char err[8];
    assert_int_equal(gw_body_fields_scan("{}\0", 3, &f, err, sizeof(err)), -EINVAL);
    assert_int_equal(strlen(err), sizeof(err) - 1);
    assert_int_equal(gw_body_fields_scan("{\"a\":\"\0\"}", 9, &f, NULL, 0), -EINVAL);
}

/* jansson drops a NUL byte that directly follows a number or a literal
 * (its lexer puts the byte back, and a NUL put back is lost): the scan
 * accepts what jansson accepts, and nothing more. */
static void test_nul_after_scalar(void **state)
{
#define B(lit) lit, sizeof(lit) - 1
    static const struct {
        const char *body;
        size_t len;
        int rc;
    } cases[] = {
        {B("{\"a\":1\0,\"max_tokens\":2}"), 0},
        {B("{\"max_tokens\":7\0}"), 0},
        {B("{\"a\":[true\0,false\0,null\0]}"), 0},
        {B("{\"a\":1\0\0}"), -EINVAL},
        {B("{\"a\":\"s\"\0}"), -EINVAL},
        {B("{\"a\":[]\0}"), -EINVAL},
        {B("{\"a\":1}\0"), -EINVAL},
        {B("{\"a\":\0 1}"), -EINVAL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        gw_body_fields f;
        char err[128];
        assert_int_equal(gw_body_fields_scan(cases[i].body, cases[i].len, &f, err, sizeof(err)), cases[i].rc);
        json_error_t je;
        json_t *o = json_loadb(cases[i].body, cases[i].len, JSON_REJECT_DUPLICATES, &je);
        assert_int_equal(o != NULL, cases[i].rc == 0);
        json_decref(o);
        assert_like_jansson(cases[i].body, cases[i].len);
    }
#undef B
    gw_body_fields f;
    assert_int_equal(gw_body_fields_scan("{\"max_tokens\":7\0}", 17, &f, NULL, 0), 0);
    assert_int_equal(f.max_tokens, 7);
}

/* Every proper prefix of a valid body is incomplete. */
static void test_truncation(void **state)
{
    static const char *const good[] = {
        "{\"model\":\"caf\\u00e9 \xe2\x82\xac\",\"prompt\":[1,-2.5e+3,{\"a\":[true,false,null]}],"
        "\"max_tokens\":16,\"max_completion_tokens\":-0,\"s\":\"\\ud83d\\ude00\\n\"}",
        " { \"model\" : \"m\" , \"stop\" : [ \"\\\"\" , \"x\" ] , \"n\" : 1.0E-2 } ",
    };
    for (size_t g = 0; g < sizeof(good) / sizeof(good[0]); g++) {
        size_t len = strlen(good[g]);
        gw_body_fields f;
        char err[128];
        assert_int_equal(gw_body_fields_scan(good[g], len, &f, err, sizeof(err)), 0);
        assert_like_jansson(good[g], len);
        size_t end = len;
        while (good[g][end - 1] == ' ')
            end--; /* trailing whitespace may go */
        for (size_t n = 0; n < end; n++) {
            char *copy = malloc(n ? n : 1); /* exact size: ASan sees any read past n */
            memcpy(copy, good[g], n);
            if (gw_body_fields_scan(copy, n, &f, err, sizeof(err)) != -EINVAL)
                fail_msg("prefix of %zu bytes accepted", n);
            assert_true(err[0] != '\0');
            free(copy);
        }
    }
}

static char *nested(int arrays, const char *inner)
{
    char *b = malloc((size_t)arrays * 2 + strlen(inner) + 16), *o = b;
    o += sprintf(o, "{\"a\":");
    for (int i = 0; i < arrays; i++)
        *o++ = '[';
    o += sprintf(o, "%s", inner);
    for (int i = 0; i < arrays; i++)
        *o++ = ']';
    sprintf(o, "}");
    return b;
}

static void test_depth(void **state)
{
    gw_body_fields f;
    char err[128];
    char *b = nested(2047, ""); /* 2048 levels with the object */
    assert_int_equal(scan(b, &f, err, sizeof(err)), 0);
    assert_like_jansson(b, strlen(b));
    free(b);
    b = nested(2046, "{\"model\":\"m\"}");
    assert_int_equal(scan(b, &f, err, sizeof(err)), 0);
    assert_false(f.has_model);
    free(b);
    b = nested(2048, "");
    assert_int_equal(scan(b, &f, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "nesting"));
    free(b);
    b = nested(100000, "");
    assert_int_equal(scan(b, &f, err, sizeof(err)), -EINVAL);
    free(b);
}

/* ---- usage ---- */

static const char usage_json[] =
    "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"model\":\"m\",\"choices\":[{\"index\":0,"
    "\"text\":\"say \\\"completion_tokens\\\": 99\",\"finish_reason\":\"length\"}],"
    "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":  17,\"total_tokens\":20}}";

static int usage_whole(const char *s, size_t len)
{
    gw_usage_scan u;
    gw_usage_scan_init(&u);
    gw_usage_scan_feed(&u, s, len);
    return u.tokens;
}

static void test_usage_splits(void **state)
{
    static const char *const streams[] = {
        usage_json,
        "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":2,"
        "\"completion_tokens\":4096,\"total_tokens\":4098}}\n\ndata: [DONE]\n\n",
    };
    static const int want[] = {17, 4096};
    for (size_t k = 0; k < sizeof(streams) / sizeof(streams[0]); k++) {
        const char *s = streams[k];
        size_t len = strlen(s);
        assert_int_equal(usage_whole(s, len), want[k]);
        for (size_t cut = 0; cut <= len; cut++) {
            gw_usage_scan u;
            gw_usage_scan_init(&u);
            gw_usage_scan_feed(&u, s, cut);
            gw_usage_scan_feed(&u, s + cut, len - cut);
            if (u.tokens != want[k])
                fail_msg("stream %zu cut at %zu: %d", k, cut, u.tokens);
        }
        for (size_t step = 1; step <= 23; step++) {
            gw_usage_scan u;
            gw_usage_scan_init(&u);
            for (size_t at = 0; at < len; at += step)
                gw_usage_scan_feed(&u, s + at, at + step <= len ? step : len - at);
            if (u.tokens != want[k])
                fail_msg("stream %zu in pieces of %zu: %d", k, step, u.tokens);
        }
    }
}

static void test_usage_values(void **state)
{
    static const struct {
        const char *s;
        int want;
    } cases[] = {
        {"{\"completion_tokens\":5}", 5},
        {"{\"completion_tokens\":\n\t 0 }", 0},
        {"{\"completion_tokens\":5,\"x\":{\"completion_tokens\":6}}", 6}, /* the last one wins */
        {"{\"completion_tokens\":2147483647}", 2147483647},
        {"{\"completion_tokens\":2147483648}", -1},
        {"{\"completion_tokens\":99999999999999999999999}", -1},
        {"{\"completion_tokens\":-1}", -1},
        {"{\"completion_tokens\":1.5}", -1},
        {"{\"completion_tokens\":1e3}", -1},
        {"{\"completion_tokens\":\"7\"}", -1},
        {"{\"completion_tokens\":null}", -1},
        {"{\"completion_tokens\":7", -1}, /* the value never ended */
        {"{\"x\":\"\\\"completion_tokens\\\":7\"}", -1},
        {"{\"\\\"completion_tokens\":7}", -1},
        {"{\"completion_tokens_details\":7}", -1},
        {"{\"usage\":{\"completion_tokens\":8}}", 8},
        {"", -1},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t len = strlen(cases[i].s);
        if (usage_whole(cases[i].s, len) != cases[i].want)
            fail_msg("%s: %d, want %d", cases[i].s, usage_whole(cases[i].s, len), cases[i].want);
        for (size_t cut = 0; cut <= len; cut++) {
            gw_usage_scan u;
            gw_usage_scan_init(&u);
            gw_usage_scan_feed(&u, cases[i].s, cut);
            gw_usage_scan_feed(&u, cases[i].s + cut, len - cut);
            if (u.tokens != cases[i].want)
                fail_msg("%s cut at %zu: %d", cases[i].s, cut, u.tokens);
        }
    }
    /* the key as the very first bytes, fed one byte at a time */
    gw_usage_scan u;
    gw_usage_scan_init(&u);
    for (const char *p = "\"completion_tokens\":12,"; *p; p++)
        gw_usage_scan_feed(&u, p, 1);
    assert_int_equal(u.tokens, 12);
}

/* Token ids in the prompt are counted, one token each (a body of short
 * ids is fewer bytes than 4 a token); text and ids elsewhere are not. */
static void test_prompt_ids(void **state)
{
    static const struct {
        const char *body;
        long long ids;
    } cases[] = {
        {"{\"model\":\"m\",\"prompt\":[1,5,6],\"max_tokens\":1}", 3},
        {"{\"prompt\":[[1,2],[3,4,5]],\"n\":7}", 5},
        {"{\"prompt\":\"text of 99 words\",\"logit_bias\":{\"5\":1},\"stop\":[1]}", 0},
        {"{\"prompt\":[\"a\",2,{\"x\":3}],\"seed\":4,\"x\":[5,6]}", 2},
        {"{\"x\":{\"prompt\":[1,2]},\"prompt\":[]}", 0},
        {"{\"prompt\":[1.5,2e0,-3]}", 1},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        gw_body_fields f;
        char err[128];
        assert_int_equal(scan(cases[i].body, &f, err, sizeof(err)), 0);
        assert_int_equal(f.prompt_ids, cases[i].ids);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basic),
        cmocka_unit_test(test_token_fields),
        cmocka_unit_test(test_model_values),
        cmocka_unit_test(test_model_length),
        cmocka_unit_test(test_duplicates),
        cmocka_unit_test(test_stream),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_nul_after_scalar),
        cmocka_unit_test(test_truncation),
        cmocka_unit_test(test_depth),
        cmocka_unit_test(test_usage_splits),
        cmocka_unit_test(test_usage_values),
        cmocka_unit_test(test_prompt_ids),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
