/* Tests of the one OpenAI error-object encoder (gateway/base/oai_error.c):
 * the exact bytes of a plain object (what the HTTP tests expect of a
 * refusal); quotes, backslashes, every control character and non-ASCII
 * UTF-8 in a message, read back unchanged by jansson; bytes that are not
 * UTF-8 replaced by U+FFFD; type, param and code escaped too, NULL as null;
 * and every buffer size, from none to more than enough, giving either
 * nothing or one whole object whose message is a prefix of the message. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "gateway/base/oai_error.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* The object parsed, with its four members checked to be there; fails the
 * test when s is not valid JSON. */
static json_t *parse(const char *s, size_t len)
{
    json_error_t err;
    json_t *j = json_loadb(s, len, 0, &err);
    if (!j)
        fail_msg("not valid JSON (%s at %d): %s", err.text, err.position, s);
    json_t *e = json_object_get(j, "error");
    assert_true(json_is_object(e));
    assert_int_equal(json_object_size(e), 4);
    assert_true(json_is_string(json_object_get(e, "message")));
    return j;
}

static const char *member(json_t *j, const char *key)
{
    return json_string_value(json_object_get(json_object_get(j, "error"), key));
}

static bool is_null(json_t *j, const char *key)
{
    return json_is_null(json_object_get(json_object_get(j, "error"), key));
}

static void test_plain_bytes(void **state)
{
    (void)state;
    size_t len = 0;
    char *s = gw_oai_error_json("request body larger than 100000 bytes", "invalid_request_error", NULL,
                                "request_too_large", &len);
    static const char want[] = "{\"error\":{\"message\":\"request body larger than 100000 bytes\",\"type\":"
                               "\"invalid_request_error\",\"param\":null,\"code\":\"request_too_large\"}}";
    assert_string_equal(s, want);
    assert_int_equal(len, strlen(want));
    char buf[256];
    assert_int_equal(gw_oai_error_write(buf, sizeof(buf), "request body larger than 100000 bytes",
                                        "invalid_request_error", NULL, "request_too_large"),
                     strlen(want));
    assert_string_equal(buf, want);
    free(s);
}

static void test_escapes(void **state)
{
    (void)state;
    /* Every control character, DEL, quotes, backslashes, a slash, and
     * UTF-8 of two, three and four bytes. */
    char msg[200];
    size_t n = 0;
    for (int c = 1; c < 0x20; c++)
        msg[n++] = (char)c;
    static const char rest[] =
        "\x7f say \"hi\" \\ C:\\path\\ a/b caf\xc3\xa9 \xe6\xbc\xa2\xe5\xad\x97 \xf0\x9f\x98\x80";
    memcpy(msg + n, rest, sizeof(rest));
    char *s = gw_oai_error_json(msg, "invalid_request_error", "messages[0].content", "bad\"code\\", NULL);
    json_t *j = parse(s, strlen(s));
    assert_string_equal(member(j, "message"), msg);
    assert_string_equal(member(j, "type"), "invalid_request_error");
    assert_string_equal(member(j, "param"), "messages[0].content");
    assert_string_equal(member(j, "code"), "bad\"code\\");
    /* as jansson writes them: short forms, else \u00XX */
    assert_non_null(strstr(s, "\\u0001\\u0002"));
    assert_non_null(strstr(s, "\\b\\t\\n\\u000B\\f\\r"));
    assert_non_null(strstr(s, "\\u001F\x7f"));
    assert_non_null(strstr(s, "caf\xc3\xa9 \xe6\xbc\xa2\xe5\xad\x97 \xf0\x9f\x98\x80"));
    /* the same bytes as jansson's compact dump */
    char *ref = json_dumps(j, JSON_COMPACT);
    assert_string_equal(s, ref);
    free(ref);
    json_decref(j);
    free(s);
}

static void test_not_utf8(void **state)
{
    (void)state;
    static const struct {
        const char *in, *want;
    } cases[] = {
        {"model '\xff\xfe" "abc'", "model '\xef\xbf\xbd\xef\xbf\xbd" "abc'"},
        {"cut \xe6\xbc", "cut \xef\xbf\xbd"},                        /* a character cut short: one U+FFFD */
        {"overlong \xc0\xaf", "overlong \xef\xbf\xbd\xef\xbf\xbd"}, /* never a slash */
        {"surrogate \xed\xa0\x80.", "surrogate \xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd."},
        {"too high \xf4\x90\x80\x80", "too high \xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xe6\xbc\"", "\xef\xbf\xbd\""}, /* the quote after a broken lead byte is still escaped */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *s = gw_oai_error_json(cases[i].in, "server_error", NULL, NULL, NULL);
        json_t *j = parse(s, strlen(s));
        assert_string_equal(member(j, "message"), cases[i].want);
        assert_true(is_null(j, "param") && is_null(j, "code"));
        json_decref(j);
        free(s);
    }
}

static void test_nulls(void **state)
{
    (void)state;
    char *s = gw_oai_error_json(NULL, NULL, NULL, NULL, NULL);
    assert_string_equal(s, "{\"error\":{\"message\":\"\",\"type\":null,\"param\":null,\"code\":null}}");
    free(s);
}

/* Every buffer size: nothing, or one whole object whose message is the
 * start of the message, cut between characters, never inside one or
 * inside an escape. */
static void test_every_size(void **state)
{
    (void)state;
    static const char msg[] = "a \"quoted\" \\ caf\xc3\xa9 \x01\xe6\xbc\xa2 \xff end";
    size_t full_len;
    char *full = gw_oai_error_json(msg, "invalid_request_error", "model", "model_not_found", &full_len);
    json_t *fj = parse(full, full_len);
    const char *whole = member(fj, "message");
    size_t shortest = strlen("{\"error\":{\"message\":\"\",\"type\":\"invalid_request_error\",\"param\":"
                             "\"model\",\"code\":\"model_not_found\"}}");
    char buf[256];
    for (size_t cap = 0; cap <= full_len + 2; cap++) {
        memset(buf, 'x', sizeof(buf));
        size_t n = gw_oai_error_write(buf, cap, msg, "invalid_request_error", "model", "model_not_found");
        if (cap <= shortest) {
            assert_int_equal(n, 0);
            if (cap)
                assert_int_equal(buf[0], '\0');
            assert_int_equal(buf[cap], 'x');
            continue;
        }
        assert_true(n < cap);
        assert_int_equal(buf[n], '\0');
        assert_int_equal(strlen(buf), n);
        json_t *j = parse(buf, n);
        const char *m = member(j, "message");
        assert_int_equal(strncmp(m, whole, strlen(m)), 0);
        if (cap > full_len)
            assert_string_equal(buf, full);
        json_decref(j);
    }
    json_decref(fj);
    free(full);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_bytes), cmocka_unit_test(test_escapes),
        cmocka_unit_test(test_not_utf8),    cmocka_unit_test(test_nulls),
        cmocka_unit_test(test_every_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
