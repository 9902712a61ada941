/* Tests of OpenAI request parsing and response encoding.
 *
 * Parsing: every field's happy path, a table of wrong types and ranges (each
 * must be a 400 invalid_request_error naming the field in `param`, leaving
 * nothing to free), null as absent, unknown fields ignored, prompt shapes
 * (text, token ids, one-string array), stop shapes, both max-token names,
 * chat messages and their content parts, malformed JSON.
 * Encoding: every encoder's output is parsed back with jansson and checked
 * field by field; SSE framing is exact; ill-formed UTF-8 in model text still
 * gives valid JSON, with U+FFFD in place of each bad subsequence. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "runtime/openai.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_VOCAB 32000

/* ---- helpers ---- */

static int parse(const char *body, bool chat, rt_oai_request *r, rt_oai_error *e)
{
    /* An exact-size copy, so that ASan sees any read past the length. */
    size_t n = strlen(body);
    char *copy = malloc(n ? n : 1);
    assert_non_null(copy);
    memcpy(copy, body, n);
    int rc = rt_oai_parse(copy, n, chat, N_VOCAB, r, e);
    free(copy);
    return rc;
}

static void parse_ok(const char *body, bool chat, rt_oai_request *r)
{
    rt_oai_error e;
    int rc = parse(body, chat, r, &e);
    if (rc != 0)
        fail_msg("parse of %s failed: %d %s (param %s)", body, rc, e.message, e.param ? e.param : "null");
}

static void expect_bad(const char *body, bool chat, const char *param, const char *needle)
{
    rt_oai_request r;
    rt_oai_error e;
    int rc = parse(body, chat, &r, &e);
    if (rc != -EINVAL)
        fail_msg("parse of %s: want -EINVAL, got %d", body, rc);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.type, "invalid_request_error");
    assert_null(e.code);
    if (param == NULL) {
        if (e.param)
            fail_msg("%s: want param null, got %s", body, e.param);
    } else {
        if (!e.param || strcmp(e.param, param) != 0)
            fail_msg("%s: want param %s, got %s (%s)", body, param, e.param ? e.param : "null", e.message);
    }
    if (needle && !strstr(e.message, needle))
        fail_msg("%s: message '%s' lacks '%s'", body, e.message, needle);
    /* Nothing left to free after a failure. */
    assert_null(r.model);
    assert_null(r.prompt);
    assert_null(r.prompt_tokens);
    assert_null(r.messages);
    assert_int_equal(r.n_messages, 0);
    assert_int_equal(r.n_stop, 0);
    assert_null(r.user);
    rt_oai_request_dispose(&r);
}

static json_t *load(const char *s, size_t n)
{
    json_error_t je;
    json_t *j = json_loadb(s, n, JSON_ALLOW_NUL, &je);
    if (!j)
        fail_msg("not valid JSON (%s): %.*s", je.text, (int)n, s);
    return j;
}

static json_t *path(json_t *j, const char *p)
{
    /* "a.b.0.c": object keys and array indexes. */
    char buf[128];
    snprintf(buf, sizeof(buf), "%s", p);
    for (char *tok = strtok(buf, "."); tok && j; tok = strtok(NULL, "."))
        j = json_is_array(j) ? json_array_get(j, (size_t)atoi(tok)) : json_object_get(j, tok);
    if (!j)
        fail_msg("no %s", p);
    return j;
}

static void expect_str(json_t *j, const char *p, const char *want)
{
    json_t *v = path(j, p);
    if (!json_is_string(v))
        fail_msg("%s is not a string", p);
    assert_string_equal(json_string_value(v), want);
}

static void expect_int(json_t *j, const char *p, long long want)
{
    json_t *v = path(j, p);
    if (!json_is_integer(v))
        fail_msg("%s is not an integer", p);
    assert_int_equal(json_integer_value(v), want);
}

static void expect_null(json_t *j, const char *p)
{
    assert_true(json_is_null(path(j, p)));
}

/* ---- parsing: happy paths ---- */

static void test_completions_defaults(void **state)
{
    (void)state;
    rt_oai_request r;
    parse_ok("{\"model\":\"m\",\"prompt\":\"hello\"}", false, &r);
    assert_false(r.chat);
    assert_string_equal(r.model, "m");
    assert_string_equal(r.prompt, "hello");
    assert_null(r.prompt_tokens);
    assert_int_equal(r.n_prompt_tokens, 0);
    assert_null(r.messages);
    assert_false(r.stream);
    assert_false(r.include_usage);
    assert_int_equal(r.max_tokens, -1);
    assert_true(r.sampling.temperature == 1.0f);
    assert_true(r.sampling.top_p == 1.0f);
    assert_int_equal(r.sampling.top_k, 0);
    assert_true(r.sampling.min_p == 0.0f);
    assert_true(r.sampling.presence_penalty == 0.0f);
    assert_true(r.sampling.frequency_penalty == 0.0f);
    assert_false(r.has_seed);
    assert_int_equal(r.n_stop, 0);
    assert_null(r.user);
    rt_oai_request_dispose(&r);
    rt_oai_request_dispose(&r); /* disposing twice is harmless */
}

static void test_completions_all_fields(void **state)
{
    (void)state;
    rt_oai_request r;
    parse_ok("{\"model\":\"llama\",\"prompt\":\"Once\",\"stream\":true,"
             "\"stream_options\":{\"include_usage\":true},\"max_tokens\":10,\"temperature\":0.5,"
             "\"top_p\":0.9,\"seed\":-42,\"stop\":\"\\n\",\"presence_penalty\":0.5,"
             "\"frequency_penalty\":-1.5,\"n\":1,\"user\":\"u-1\",\"top_k\":40,\"min_p\":0.05}",
             false, &r);
    assert_string_equal(r.model, "llama");
    assert_string_equal(r.prompt, "Once");
    assert_true(r.stream);
    assert_true(r.include_usage);
    assert_int_equal(r.max_tokens, 10);
    assert_float_equal(r.sampling.temperature, 0.5, 1e-6);
    assert_float_equal(r.sampling.top_p, 0.9, 1e-6);
    assert_true(r.has_seed);
    assert_true(r.sampling.seed == (uint64_t)-42);
    assert_int_equal(r.n_stop, 1);
    assert_string_equal(r.stop[0], "\n");
    assert_float_equal(r.sampling.presence_penalty, 0.5, 1e-6);
    assert_float_equal(r.sampling.frequency_penalty, -1.5, 1e-6);
    assert_string_equal(r.user, "u-1");
    assert_int_equal(r.sampling.top_k, 40);
    assert_float_equal(r.sampling.min_p, 0.05, 1e-6);
    rt_oai_request_dispose(&r);

    /* Edges of the ranges are inside; integers count as numbers; an
     * integral real counts as an integer; negative top_k means off. */
    parse_ok("{\"model\":\"m\",\"prompt\":\"p\",\"temperature\":0,\"top_p\":1,\"presence_penalty\":-2,"
             "\"frequency_penalty\":2,\"max_tokens\":100.0,\"top_k\":-1,\"min_p\":1,\"seed\":0,"
             "\"stream\":false,\"include_usage\":true}",
             false, &r);
    assert_true(r.sampling.temperature == 0.0f);
    assert_true(r.sampling.top_p == 1.0f);
    assert_true(r.sampling.presence_penalty == -2.0f);
    assert_true(r.sampling.frequency_penalty == 2.0f);
    assert_int_equal(r.max_tokens, 100);
    assert_int_equal(r.sampling.top_k, 0);
    assert_true(r.has_seed);
    assert_true(r.sampling.seed == 0);
    assert_false(r.stream);
    assert_false(r.include_usage); /* only inside stream_options */
    rt_oai_request_dispose(&r);

    parse_ok("{\"model\":\"m\",\"prompt\":\"p\",\"temperature\":2}", false, &r);
    assert_true(r.sampling.temperature == 2.0f);
    rt_oai_request_dispose(&r);
}

static void test_prompt_shapes(void **state)
{
    (void)state;
    rt_oai_request r;
    parse_ok("{\"model\":\"m\",\"prompt\":[1,2,31999,0]}", false, &r);
    assert_null(r.prompt);
    assert_int_equal(r.n_prompt_tokens, 4);
    assert_int_equal(r.prompt_tokens[0], 1);
    assert_int_equal(r.prompt_tokens[2], 31999);
    assert_int_equal(r.prompt_tokens[3], 0);
    rt_oai_request_dispose(&r);

    /* A batch of one token array is that array. */
    parse_ok("{\"model\":\"m\",\"prompt\":[[7,8]]}", false, &r);
    assert_int_equal(r.n_prompt_tokens, 2);
    assert_int_equal(r.prompt_tokens[1], 8);
    rt_oai_request_dispose(&r);

    parse_ok("{\"model\":\"m\",\"prompt\":[\"only one\"]}", false, &r);
    assert_string_equal(r.prompt, "only one");
    assert_null(r.prompt_tokens);
    rt_oai_request_dispose(&r);

    /* Non-ASCII and escapes come through decoded. */
    parse_ok("{\"model\":\"m\",\"prompt\":\"caf\\u00e9 \\ud83d\\ude00\\t\"}", false, &r);
    assert_string_equal(r.prompt, "caf\xc3\xa9 \xf0\x9f\x98\x80\t");
    rt_oai_request_dispose(&r);

    /* With n_vocab <= 0 ids are not bounded above. */
    rt_oai_error e;
    const char *big = "{\"model\":\"m\",\"prompt\":[123456789]}";
    assert_int_equal(rt_oai_parse(big, strlen(big), false, 0, &r, &e), 0);
    assert_int_equal(r.prompt_tokens[0], 123456789);
    rt_oai_request_dispose(&r);

    expect_bad("{\"model\":\"m\",\"prompt\":[32000]}", false, "prompt", "out of range");
    expect_bad("{\"model\":\"m\",\"prompt\":[5,-1]}", false, "prompt", "prompt[1]");
    expect_bad("{\"model\":\"m\",\"prompt\":[1,99999999999999]}", false, "prompt", "out of range");
    expect_bad("{\"model\":\"m\",\"prompt\":\"\"}", false, "prompt", "prompt must not be empty");
    expect_bad("{\"model\":\"m\",\"prompt\":[]}", false, "prompt", "prompt must not be empty");
    expect_bad("{\"model\":\"m\",\"prompt\":[\"\"]}", false, "prompt", "prompt must not be empty");
    expect_bad("{\"model\":\"m\",\"prompt\":[\"a\",\"b\"]}", false, "prompt", "batch");
    expect_bad("{\"model\":\"m\",\"prompt\":[[1],[2]]}", false, "prompt", "batch");
    expect_bad("{\"model\":\"m\",\"prompt\":[[]]}", false, "prompt", "empty");
    expect_bad("{\"model\":\"m\",\"prompt\":[[\"a\"]]}", false, "prompt", NULL);
    expect_bad("{\"model\":\"m\",\"prompt\":[1,\"a\"]}", false, "prompt", NULL);
    expect_bad("{\"model\":\"m\",\"prompt\":[1,2.5]}", false, "prompt", NULL);
    expect_bad("{\"model\":\"m\",\"prompt\":5}", false, "prompt", NULL);
    expect_bad("{\"model\":\"m\",\"prompt\":{}}", false, "prompt", NULL);
    expect_bad("{\"model\":\"m\",\"prompt\":true}", false, "prompt", NULL);
    expect_bad("{\"model\":\"m\"}", false, "prompt", "required");
    expect_bad("{\"model\":\"m\",\"prompt\":null}", false, "prompt", "required");
}

static void test_stop_shapes(void **state)
{
    (void)state;
    rt_oai_request r;
    parse_ok("{\"model\":\"m\",\"prompt\":\"p\",\"stop\":\"END\"}", false, &r);
    assert_int_equal(r.n_stop, 1);
    assert_string_equal(r.stop[0], "END");
    rt_oai_request_dispose(&r);

    parse_ok("{\"model\":\"m\",\"prompt\":\"p\",\"stop\":[\"a\",\"bb\",\"\\n\\n\",\"</s>\"]}", false, &r);
    assert_int_equal(r.n_stop, 4);
    assert_string_equal(r.stop[0], "a");
    assert_string_equal(r.stop[1], "bb");
    assert_string_equal(r.stop[2], "\n\n");
    assert_string_equal(r.stop[3], "</s>");
    rt_oai_request_dispose(&r);

    parse_ok("{\"model\":\"m\",\"prompt\":\"p\",\"stop\":[]}", false, &r);
    assert_int_equal(r.n_stop, 0);
    rt_oai_request_dispose(&r);

    expect_bad("{\"model\":\"m\",\"prompt\":\"p\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", false, "stop",
               "at most 4");
    expect_bad("{\"model\":\"m\",\"prompt\":\"p\",\"stop\":\"\"}", false, "stop", "empty");
    expect_bad("{\"model\":\"m\",\"prompt\":\"p\",\"stop\":[\"a\",\"\"]}", false, "stop", "empty");
    expect_bad("{\"model\":\"m\",\"prompt\":\"p\",\"stop\":[\"a\",null]}", false, "stop", NULL);
    expect_bad("{\"model\":\"m\",\"prompt\":\"p\",\"stop\":[\"a\",1]}", false, "stop", NULL);
    expect_bad("{\"model\":\"m\",\"prompt\":\"p\",\"stop\":1}", false, "stop", NULL);
    expect_bad("{\"model\":\"m\",\"prompt\":\"p\",\"stop\":{}}", false, "stop", NULL);
    /* A stop sequence of RT_OAI_MAX_STOP_BYTES is taken, one byte more is not. */
    char body[RT_OAI_MAX_STOP_BYTES + 100], stop[RT_OAI_MAX_STOP_BYTES + 2];
    memset(stop, 'x', RT_OAI_MAX_STOP_BYTES);
    stop[RT_OAI_MAX_STOP_BYTES] = '\0';
    snprintf(body, sizeof(body), "{\"model\":\"m\",\"prompt\":\"p\",\"stop\":[\"a\",\"%s\"]}", stop);
    parse_ok(body, false, &r);
    assert_int_equal(r.n_stop, 2);
    assert_int_equal(strlen(r.stop[1]), RT_OAI_MAX_STOP_BYTES);
    rt_oai_request_dispose(&r);
    strcat(stop, "x");
    snprintf(body, sizeof(body), "{\"model\":\"m\",\"prompt\":\"p\",\"stop\":\"%s\"}", stop);
    expect_bad(body, false, "stop", "at most 512 bytes");
}

static void test_max_tokens_names(void **state)
{
    (void)state;
    rt_oai_request r;
    parse_ok("{\"model\":\"m\",\"prompt\":\"p\",\"max_tokens\":7}", false, &r);
    assert_int_equal(r.max_tokens, 7);
    rt_oai_request_dispose(&r);
    parse_ok("{\"model\":\"m\",\"prompt\":\"p\",\"max_completion_tokens\":9}", false, &r);
    assert_int_equal(r.max_tokens, 9);
    rt_oai_request_dispose(&r);
    /* Both: the newer name wins, in whichever order they come. */
    parse_ok("{\"model\":\"m\",\"prompt\":\"p\",\"max_tokens\":7,\"max_completion_tokens\":9}", false, &r);
    assert_int_equal(r.max_tokens, 9);
    rt_oai_request_dispose(&r);
    parse_ok("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
             "\"max_completion_tokens\":3,\"max_tokens\":70}",
             true, &r);
    assert_int_equal(r.max_tokens, 3);
    rt_oai_request_dispose(&r);
    parse_ok("{\"model\":\"m\",\"prompt\":\"p\",\"max_tokens\":null,\"max_completion_tokens\":4}", false, &r);
    assert_int_equal(r.max_tokens, 4);
    rt_oai_request_dispose(&r);
    parse_ok("{\"model\":\"m\",\"prompt\":\"p\",\"max_tokens\":2147483647}", false, &r);
    assert_int_equal(r.max_tokens, 2147483647);
    rt_oai_request_dispose(&r);
    /* A wrong type in the losing name is still reported. */
    expect_bad("{\"model\":\"m\",\"prompt\":\"p\",\"max_tokens\":\"7\",\"max_completion_tokens\":9}", false,
               "max_tokens", "integer");
    expect_bad("{\"model\":\"m\",\"prompt\":\"p\",\"max_tokens\":2147483648}", false, "max_tokens",
               "at most");
}

static void test_null_is_absent_and_unknown_ignored(void **state)
{
    (void)state;
    rt_oai_request r;
    parse_ok("{\"model\":\"m\",\"prompt\":\"p\",\"stream\":null,\"stream_options\":null,\"max_tokens\":null,"
             "\"max_completion_tokens\":null,\"temperature\":null,\"top_p\":null,\"seed\":null,\"stop\":null,"
             "\"presence_penalty\":null,\"frequency_penalty\":null,\"n\":null,\"user\":null,\"top_k\":null,"
             "\"min_p\":null,\"logit_bias\":null,\"logprobs\":null,\"echo\":null,\"suffix\":null,"
             "\"best_of\":null,\"top_logprobs\":null}",
             false, &r);
    assert_false(r.stream);
    assert_int_equal(r.max_tokens, -1);
    assert_true(r.sampling.temperature == 1.0f);
    assert_true(r.sampling.top_p == 1.0f);
    assert_false(r.has_seed);
    assert_int_equal(r.n_stop, 0);
    assert_null(r.user);
    rt_oai_request_dispose(&r);

    parse_ok("{\"model\":\"m\",\"prompt\":\"p\",\"stream\":true,\"stream_options\":{\"include_usage\":null}}",
             false, &r);
    assert_true(r.stream);
    assert_false(r.include_usage);
    rt_oai_request_dispose(&r);

    parse_ok("{\"metadata\":{\"k\":\"v\"},\"model\":\"m\",\"store\":false,\"echo\":false,"
             "\"prompt\":\"p\",\"x-vendor\":[1,{\"deep\":[null,true]}],\"stream_options\":{\"other\":1},"
             "\"stream\":true}",
             false, &r);
    assert_string_equal(r.prompt, "p");
    rt_oai_request_dispose(&r);

    /* Each endpoint ignores the other's field. */
    parse_ok("{\"model\":\"m\",\"prompt\":\"p\",\"messages\":5}", false, &r);
    rt_oai_request_dispose(&r);
    parse_ok("{\"model\":\"m\",\"prompt\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", true, &r);
    assert_null(r.prompt);
    rt_oai_request_dispose(&r);
}

/* ---- parsing: wrong types and ranges ---- */

#define C(frag) "{\"model\":\"m\",\"prompt\":\"p\"," frag "}"
#define H(frag) "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]," frag "}"

static const struct bad_case {
    const char *body;
    const char *param;
    const char *needle;
} bad_cases[] = {
    {"{\"model\":1,\"prompt\":\"p\"}", "model", "'model' must be a string"},
    {"{\"model\":[],\"prompt\":\"p\"}", "model", "must be a string"},
    {"{\"prompt\":\"p\"}", "model", "model"},
    {"{\"model\":null,\"prompt\":\"p\"}", "model", "model"},
    {"{\"model\":\"\",\"prompt\":\"p\"}", "model", "empty"},
    {C("\"stream\":\"yes\""), "stream", "'stream' must be a boolean"},
    {C("\"stream\":1"), "stream", "boolean"},
    {C("\"stream\":true,\"stream_options\":1"), "stream_options", "object"},
    {C("\"stream\":true,\"stream_options\":{\"include_usage\":1}"), "stream_options.include_usage",
     "boolean"},
    {C("\"stream_options\":{\"include_usage\":true}"), "stream_options", "stream"},
    {C("\"max_tokens\":\"10\""), "max_tokens", "'max_tokens' must be an integer"},
    {C("\"max_tokens\":1.5"), "max_tokens", "integer"},
    {C("\"max_tokens\":true"), "max_tokens", "integer"},
    {C("\"max_tokens\":0"), "max_tokens", "at least 1"},
    {C("\"max_tokens\":-5"), "max_tokens", "at least 1"},
    {C("\"max_tokens\":1e300"), "max_tokens", "integer"},
    {C("\"max_completion_tokens\":\"x\""), "max_completion_tokens", "integer"},
    {C("\"max_completion_tokens\":0"), "max_completion_tokens", "at least 1"},
    {C("\"temperature\":\"hot\""), "temperature", "'temperature' must be a number"},
    {C("\"temperature\":[1]"), "temperature", "number"},
    {C("\"temperature\":-0.1"), "temperature", "at least 0"},
    {C("\"temperature\":2.5"), "temperature", "at most 2"},
    {C("\"top_p\":\"x\""), "top_p", "number"},
    {C("\"top_p\":-0.1"), "top_p", "at least 0"},
    {C("\"logit_bias\":[1]"), "logit_bias", "object"},
    {C("\"logit_bias\":{\"x\":1}"), "logit_bias", "not a token id"},
    {C("\"logit_bias\":{\"12x\":1}"), "logit_bias", "not a token id"},
    {C("\"logit_bias\":{\"32000\":1}"), "logit_bias", "not a token id"},
    {C("\"logit_bias\":{\"-1\":1}"), "logit_bias", "not a token id"},
    {C("\"logit_bias\":{\"05\":1}"), "logit_bias", "not a token id"},
    {C("\"logit_bias\":{\" 5\":1}"), "logit_bias", "not a token id"},
    {C("\"logit_bias\":{\"+5\":1}"), "logit_bias", "not a token id"},
    {C("\"logit_bias\":{\"\":1}"), "logit_bias", "not a token id"},
    {C("\"logit_bias\":{\"5\":100.5}"), "logit_bias", "-100 to 100"},
    {C("\"logit_bias\":{\"5\":\"1\"}"), "logit_bias", "-100 to 100"},
    {C("\"echo\":1"), "echo", "boolean"},
    {C("\"best_of\":0"), "best_of", "at least 1"},
    {H("\"logprobs\":true,\"top_logprobs\":21"), "top_logprobs", "at most 20"},
    {H("\"logprobs\":1"), "logprobs", "boolean"},
    {H("\"response_format\":\"json\""), "response_format", "'type'"},
    {C("\"top_p\":1.01"), "top_p", "at most 1"},
    {C("\"seed\":\"1\""), "seed", "integer"},
    {C("\"seed\":1.5"), "seed", "integer"},
    {C("\"presence_penalty\":3"), "presence_penalty", "at most 2"},
    {C("\"presence_penalty\":\"x\""), "presence_penalty", "number"},
    {C("\"frequency_penalty\":-2.01"), "frequency_penalty", "at least -2"},
    {C("\"frequency_penalty\":{}"), "frequency_penalty", "number"},
    {C("\"n\":0"), "n", "at least 1"},
    {C("\"n\":\"1\""), "n", "integer"},
    {C("\"user\":1"), "user", "'user' must be a string"},
    {C("\"user\":false"), "user", "string"},
    {C("\"top_k\":\"x\""), "top_k", "integer"},
    {C("\"top_k\":1.5"), "top_k", "integer"},
    {C("\"top_k\":4294967296"), "top_k", "at most"},
    {C("\"min_p\":2"), "min_p", "at most 1"},
    {C("\"min_p\":\"x\""), "min_p", "number"},
    /* chat */
    {"{\"model\":\"m\"}", "messages", "required"},
    {"{\"model\":\"m\",\"messages\":null}", "messages", "required"},
    {"{\"model\":\"m\",\"messages\":\"hi\"}", "messages", "array"},
    {"{\"model\":\"m\",\"messages\":{}}", "messages", "array"},
    {"{\"model\":\"m\",\"messages\":[]}", "messages", "empty"},
    {"{\"model\":\"m\",\"messages\":[\"hi\"]}", "messages[0]", "object"},
    {"{\"model\":\"m\",\"messages\":[{\"content\":\"x\"}]}", "messages[0].role", "required"},
    {"{\"model\":\"m\",\"messages\":[{\"role\":1,\"content\":\"x\"}]}", "messages[0].role", "string"},
    {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"tool\",\"content\":"
     "\"x\"}]}",
     "messages[1].tool_call_id", "required"},
    {"{\"model\":\"m\",\"messages\":[{\"role\":\"function\",\"content\":\"x\"}]}", "messages[0].role",
     "one of"},
    {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\"}]}", "messages[0].content", "required"},
    {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":null}]}", "messages[0].content",
     "required"},
    {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages[0].content",
     "string or an array of text parts"},
    {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[\"x\"]}]}", "messages[0].content[0]",
     "object"},
    {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
     "{\"type\":\"image_url\",\"image_url\":{\"url\":\"http://x\"}}]}]}",
     "messages[0].content[1].type", "'image_url'"},
    {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"a\"}]}]}",
     "messages[0].content[0].type", "string"},
    {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":7}]}]}",
     "messages[0].content[0].text", "string"},
    {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}",
     "messages[0].content[0].text", "string"},
    {H("\"n\":-3"), "n", NULL},
    {H("\"temperature\":\"0\""), "temperature", NULL},
    {H("\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]"), "stop", NULL},
};

static void test_bad_fields(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(bad_cases) / sizeof(bad_cases[0]); i++) {
        const struct bad_case *c = &bad_cases[i];
        bool chat = strstr(c->body, "\"prompt\"") == NULL;
        expect_bad(c->body, chat, c->param, c->needle);
    }
}

static void test_malformed_json(void **state)
{
    (void)state;
    expect_bad("{\"model\":", false, NULL, "invalid JSON: ");
    expect_bad("{\"model\":\"m\",\n \"prompt\": x}", false, NULL, "at line 2 column");
    expect_bad("", false, NULL, "invalid JSON: ");
    expect_bad("{\"model\":\"m\",\"prompt\":\"p\"} trailing", true, NULL, "invalid JSON: ");
    expect_bad("{\"model\":\"m\",\"prompt\":\"\xff\"}", false, NULL, "invalid JSON: ");
    expect_bad("{\"model\":\"m\",\"prompt\":\"a\\u0000b\"}", false, NULL, "invalid JSON: ");
    expect_bad("{\"model\":\"m\",\"model\":\"n\",\"prompt\":\"p\"}", false, NULL, "duplicate");
    expect_bad("[1,2]", false, NULL, "must be a JSON object");
    expect_bad("\"str\"", true, NULL, "must be a JSON object");
    expect_bad("null", true, NULL, "must be a JSON object");

    /* Nesting far past jansson's depth limit is an error, not a stack
     * overflow. */
    size_t deep = 100000;
    char *nest = malloc(deep + 64);
    assert_non_null(nest);
    int o = snprintf(nest, 64, "{\"model\":\"m\",\"prompt\":\"p\",\"x\":");
    memset(nest + o, '[', deep);
    nest[o + deep] = '\0';
    expect_bad(nest, false, NULL, "depth");
    free(nest);

    rt_oai_request r;
    rt_oai_error e;
    assert_int_equal(rt_oai_parse(NULL, 0, false, N_VOCAB, &r, &e), -EINVAL);
    assert_int_equal(e.status, 400);
    /* Only len bytes are parsed. */
    const char *body = "{\"model\":\"m\",\"prompt\":\"p\"}GARBAGE";
    assert_int_equal(rt_oai_parse(body, strlen(body) - 7, false, N_VOCAB, &r, &e), 0);
    rt_oai_request_dispose(&r);
    /* e may be NULL. */
    assert_int_equal(rt_oai_parse("{", 1, false, N_VOCAB, &r, NULL), -EINVAL);
}

static void test_chat_messages(void **state)
{
    (void)state;
    rt_oai_request r;
    parse_ok("{\"model\":\"m\",\"messages\":["
             "{\"role\":\"developer\",\"content\":\"be brief\"},"
             "{\"role\":\"system\",\"content\":\"sys\",\"name\":\"ignored\"},"
             "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"part one\"},"
             "{\"type\":\"text\",\"text\":\"part two\"}]},"
             "{\"role\":\"assistant\",\"content\":\"\"},"
             "{\"role\":\"user\",\"content\":[]}],\"stream\":true}",
             true, &r);
    assert_true(r.chat);
    assert_true(r.stream);
    assert_null(r.prompt);
    assert_int_equal(r.n_messages, 5);
    assert_string_equal(r.messages[0].role, "system");
    assert_string_equal(r.messages[0].content, "be brief");
    assert_string_equal(r.messages[1].role, "system");
    assert_string_equal(r.messages[2].role, "user");
    assert_string_equal(r.messages[2].content, "part one\npart two");
    assert_string_equal(r.messages[3].role, "assistant");
    assert_string_equal(r.messages[3].content, "");
    assert_string_equal(r.messages[4].content, "");
    rt_oai_request_dispose(&r);

    /* A failure deep in the list frees what the earlier entries took. */
    expect_bad(
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"b\"}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"c\"},{\"type\":\"refusal\"}]}]}",
        true, "messages[2].content[1].type", NULL);
}

static void test_logit_bias_and_top_p(void **state)
{
    (void)state;
    rt_oai_request r;
    parse_ok("{\"model\":\"m\",\"prompt\":\"p\",\"top_p\":0,\"logit_bias\":{\"5\":-100,\"31999\":2.5}}",
             false, &r);
    assert_true(r.sampling.top_p == 0.0f);
    assert_int_equal(r.sampling.n_bias, 2);
    assert_int_equal(r.sampling.bias[0].token, 5);
    assert_true(r.sampling.bias[0].bias == -100.0f);
    assert_int_equal(r.sampling.bias[1].token, 31999);
    assert_true(r.sampling.bias[1].bias == 2.5f);
    rt_oai_request_dispose(&r);
    parse_ok("{\"model\":\"m\",\"prompt\":\"p\",\"logit_bias\":{}}", false, &r);
    assert_int_equal(r.sampling.n_bias, 0);
    rt_oai_request_dispose(&r);

    /* At most RT_SAMPLER_MAX_BIAS tokens. */
    char body[16384];
    int o = snprintf(body, sizeof(body), "{\"model\":\"m\",\"prompt\":\"p\",\"logit_bias\":{");
    for (int i = 0; i <= RT_SAMPLER_MAX_BIAS; i++)
        o += snprintf(body + o, sizeof(body) - (size_t)o, "%s\"%d\":1", i ? "," : "", i);
    snprintf(body + o, sizeof(body) - (size_t)o, "}}");
    expect_bad(body, false, "logit_bias", "at most 300");
}

/* Fields OpenAI defines that the server cannot honour are refused when
 * they ask for something, and pass at their off values. */
static void expect_unsupported(const char *fields, bool chat, const char *param)
{
    char body[512];
    snprintf(body, sizeof(body),
             chat ? "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],%s}"
                  : "{\"model\":\"m\",\"prompt\":\"p\",%s}",
             fields);
    rt_oai_request r;
    rt_oai_error e;
    assert_int_equal(parse(body, chat, &r, &e), -EINVAL);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.type, "invalid_request_error");
    assert_non_null(e.code);
    assert_string_equal(e.code, "unsupported_parameter");
    assert_non_null(e.param);
    assert_string_equal(e.param, param);
    assert_non_null(strstr(e.message, "not supported"));
    assert_null(r.model);
}

/* tools, tool_choice, parallel_tool_calls, the history's tool calls and
 * answers, response_format and grammar, as the engine gets them. */
static void test_tool_fields(void **state)
{
    (void)state;
    rt_oai_request r;
    parse_ok("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"w?\"},"
             "{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":"
             "{\"name\":\"get\",\"arguments\":\"{\\\"city\\\": \\\"Oslo\\\"}\"}}]},"
             "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"sunny\"}],"
             "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get\",\"parameters\":{}}}],"
             "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get\"}},"
             "\"parallel_tool_calls\":false}",
             true, &r);
    assert_int_equal(r.n_messages, 3);
    assert_null(r.messages[1].content);
    assert_string_equal(r.messages[2].role, "tool");
    assert_string_equal(r.extra[2].tool_call_id, "c1");
    /* the arguments reach the template parsed, as vLLM gives them */
    json_t *args =
        json_object_get(json_object_get(json_array_get(r.extra[1].tool_calls, 0), "function"), "arguments");
    assert_string_equal(json_string_value(json_object_get(args, "city")), "Oslo");
    assert_int_equal(json_array_size(r.tools), 1);
    assert_int_equal(r.tool_choice, RT_TOOL_NAMED);
    assert_string_equal(r.tool_name, "get");
    assert_false(r.parallel_tool_calls);
    rt_oai_request_dispose(&r);

    parse_ok(H("\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"none\""),
             true, &r);
    assert_null(r.tools); /* none: not offered */
    rt_oai_request_dispose(&r);
    parse_ok(H("\"response_format\":{\"type\":\"json_object\"}"), true, &r);
    assert_string_equal(json_string_value(json_object_get(r.json_schema, "type")), "object");
    rt_oai_request_dispose(&r);
    parse_ok(
        "{\"model\":\"m\",\"prompt\":\"p\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
        "{\"name\":\"x\",\"strict\":true,\"schema\":{\"type\":\"integer\"}}}}",
        false, &r);
    assert_string_equal(json_string_value(json_object_get(r.json_schema, "type")), "integer");
    rt_oai_request_dispose(&r);
    parse_ok("{\"model\":\"m\",\"prompt\":\"p\",\"grammar\":\"root ::= \\\"a\\\"\"}", false, &r);
    assert_string_equal(r.grammar, "root ::= \"a\"");
    rt_oai_request_dispose(&r);

    expect_bad(H("\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]"), true, "tools[0]",
               "1 to 64");
    expect_bad(H("\"tools\":[{\"type\":\"retrieval\"}]"), true, "tools[0]", "function");
    expect_bad(H("\"tool_choice\":\"sometimes\""), true, "tool_choice", "none, auto, required");
    expect_bad(H("\"grammar\":\"root ::= x\",\"response_format\":{\"type\":\"json_object\"}"), true,
               "grammar", "exclude");
    expect_bad(H("\"response_format\":{\"type\":\"yaml\"}"), true, "response_format.type", "json_schema");
    expect_bad(
        "{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"type\":\"function\","
        "\"function\":{\"name\":\"f\",\"arguments\":\"{nope\"}}]}]}",
        true, "messages[0].tool_calls[0].function.arguments", "not JSON");
}

static void test_unsupported_fields(void **state)
{
    (void)state;
    /* tools are served; the legacy functions are not */
    expect_bad(H("\"tool_choice\":\"required\""), true, "tool_choice", "offers none");
    expect_bad(H("\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}"), true,
               "tool_choice", "does not have");
    expect_unsupported("\"function_call\":{\"name\":\"f\"}", true, "function_call");
    expect_unsupported("\"functions\":[{\"name\":\"f\"}]", true, "functions");
    expect_bad(H("\"tools\":{}"), true, "tools", "must be an array");
    expect_bad(H("\"tool_choice\":5"), true, "tool_choice", "string or an object");
    expect_unsupported("\"logprobs\":0", false, "logprobs");
    expect_unsupported("\"echo\":true", false, "echo");
    expect_unsupported("\"suffix\":\"}\"", false, "suffix");
    expect_unsupported("\"best_of\":2", false, "best_of");
    expect_unsupported("\"n\":2", false, "n");
    expect_unsupported("\"n\":2", true, "n");

    static const char *const off_chat[] = {
        "\"logprobs\":false",
        "\"response_format\":{\"type\":\"text\"}",
        "\"tool_choice\":\"auto\"",
        "\"tool_choice\":\"none\"",
        "\"function_call\":\"auto\"",
        "\"tools\":[]",
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"none\"",
        "\"functions\":[{\"name\":\"f\"}],\"function_call\":\"none\"",
        "\"logprobs\":null"};
    static const char *const off_completions[] = {"\"echo\":false", "\"suffix\":\"\"", "\"best_of\":1",
                                                  "\"logprobs\":null", "\"suffix\":null"};
    char body[512];
    rt_oai_request r;
    for (size_t i = 0; i < sizeof(off_chat) / sizeof(off_chat[0]); i++) {
        snprintf(body, sizeof(body),
                 "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],%s}", off_chat[i]);
        parse_ok(body, true, &r);
        rt_oai_request_dispose(&r);
    }
    for (size_t i = 0; i < sizeof(off_completions) / sizeof(off_completions[0]); i++) {
        snprintf(body, sizeof(body), "{\"model\":\"m\",\"prompt\":\"p\",%s}", off_completions[i]);
        parse_ok(body, false, &r);
        rt_oai_request_dispose(&r);
    }
}

/* vLLM's chat_template_kwargs: enable_thinking is read (Qwen3), the
 * other variables ignored; the completions endpoint has no template. */
static void test_chat_template_kwargs(void **state)
{
    (void)state;
    rt_oai_request r;
    parse_ok(H("\"chat_template_kwargs\":{\"enable_thinking\":false,\"other\":[1]}"), true, &r);
    assert_true(r.no_thinking);
    rt_oai_request_dispose(&r);
    parse_ok(H("\"chat_template_kwargs\":{\"enable_thinking\":true}"), true, &r);
    assert_false(r.no_thinking);
    rt_oai_request_dispose(&r);
    parse_ok(H("\"chat_template_kwargs\":{}"), true, &r);
    assert_false(r.no_thinking);
    rt_oai_request_dispose(&r);
    expect_bad(H("\"chat_template_kwargs\":[]"), true, "chat_template_kwargs", "must be an object");
    expect_bad(H("\"chat_template_kwargs\":{\"enable_thinking\":0}"), true,
               "chat_template_kwargs.enable_thinking", "must be a boolean");
}

static void test_chat_logprobs_fields(void **state)
{
    (void)state;
    rt_oai_request r;
    parse_ok(H("\"logprobs\":true,\"top_logprobs\":5"), true, &r);
    assert_true(r.logprobs);
    assert_int_equal(r.top_logprobs, 5);
    rt_oai_request_dispose(&r);
    parse_ok(H("\"logprobs\":true"), true, &r);
    assert_true(r.logprobs);
    assert_int_equal(r.top_logprobs, 0);
    rt_oai_request_dispose(&r);
    parse_ok(H("\"logprobs\":false,\"top_logprobs\":null"), true, &r);
    assert_false(r.logprobs);
    rt_oai_request_dispose(&r);
    expect_bad(H("\"top_logprobs\":2"), true, "top_logprobs", "requires 'logprobs'");
    expect_bad(H("\"logprobs\":false,\"top_logprobs\":0"), true, "top_logprobs", "requires 'logprobs'");
    expect_bad(H("\"logprobs\":true,\"top_logprobs\":-1"), true, "top_logprobs", "at least 0");
}

static void test_error_set_and_json(void **state)
{
    (void)state;
    rt_oai_request r;
    rt_oai_error e;
    assert_int_equal(
        parse("{\"model\":\"m\",\"messages\":[{\"role\":\"bot\",\"content\":\"x\"}]}", true, &r, &e),
        -EINVAL);
    char *s = rt_oai_error_json(&e);
    assert_non_null(s);
    json_t *j = load(s, strlen(s));
    expect_str(j, "error.type", "invalid_request_error");
    expect_str(j, "error.param", "messages[0].role");
    expect_null(j, "error.code");
    assert_non_null(strstr(json_string_value(path(j, "error.message")), "'bot'"));
    json_decref(j);
    free(s);

    /* Setting again replaces the indexed param. */
    rt_oai_error_set(&e, 404, "invalid_request_error", "model", "model_not_found",
                     "The model '%s' does not exist", "gpt-9");
    assert_int_equal(e.status, 404);
    assert_string_equal(e.param, "model");
    assert_string_equal(e.param_buf, "");
    s = rt_oai_error_json(&e);
    j = load(s, strlen(s));
    expect_str(j, "error.message", "The model 'gpt-9' does not exist");
    expect_str(j, "error.param", "model");
    expect_str(j, "error.code", "model_not_found");
    json_decref(j);
    free(s);

    /* Null param and type; a message cut inside a UTF-8 sequence, or
     * carrying bad bytes, still gives valid JSON. */
    char longer[400];
    memset(longer, 'a', sizeof(longer));
    memcpy(longer + 254, "\xc3\xa9\xc3\xa9", 4);
    longer[sizeof(longer) - 1] = '\0';
    rt_oai_error_set(&e, 503, NULL, NULL, NULL, "%s \xff", longer);
    s = rt_oai_error_json(&e);
    j = load(s, strlen(s));
    expect_null(j, "error.param");
    expect_null(j, "error.code");
    expect_str(j, "error.type", "server_error");
    json_decref(j);
    free(s);
    rt_oai_error_set(&e, 429, NULL, NULL, NULL, "slow down");
    s = rt_oai_error_json(&e);
    j = load(s, strlen(s));
    expect_str(j, "error.type", "rate_limit_error");
    json_decref(j);
    free(s);
}

/* ---- encoding ---- */

static void test_response_json(void **state)
{
    (void)state;
    rt_oai_usage u = {.prompt_tokens = 5, .completion_tokens = 7};
    char *s = rt_oai_response_json(&(rt_oai_head){false, false, false, "cmpl-1", "llama", 1700000000},
                                   "Hello \"world\"\n", 14, "length", &u, NULL, 0);
    assert_non_null(s);
    assert_null(strchr(s, '\n')); /* compact */
    json_t *j = load(s, strlen(s));
    expect_str(j, "id", "cmpl-1");
    expect_str(j, "object", "text_completion");
    expect_int(j, "created", 1700000000);
    expect_str(j, "model", "llama");
    assert_int_equal(json_array_size(path(j, "choices")), 1);
    expect_int(j, "choices.0.index", 0);
    expect_str(j, "choices.0.text", "Hello \"world\"\n");
    expect_null(j, "choices.0.logprobs");
    expect_str(j, "choices.0.finish_reason", "length");
    expect_int(j, "usage.prompt_tokens", 5);
    expect_int(j, "usage.completion_tokens", 7);
    expect_int(j, "usage.total_tokens", 12);
    json_decref(j);
    free(s);

    s = rt_oai_response_json(&(rt_oai_head){true, false, false, "chatcmpl-2", "m", 1}, "Hi", 2, "stop", &u,
                             NULL, 0);
    j = load(s, strlen(s));
    expect_str(j, "object", "chat.completion");
    expect_str(j, "choices.0.message.role", "assistant");
    expect_str(j, "choices.0.message.content", "Hi");
    expect_null(j, "choices.0.message.refusal");
    expect_str(j, "choices.0.finish_reason", "stop");
    assert_null(json_object_get(path(j, "choices.0"), "text"));
    expect_int(j, "usage.total_tokens", 12);
    json_decref(j);
    free(s);

    /* Only text_len bytes are taken. */
    s = rt_oai_response_json(&(rt_oai_head){true, false, false, "x", "m", 1}, "Hi there", 2, "stop", NULL,
                             NULL, 0);
    j = load(s, strlen(s));
    expect_str(j, "choices.0.message.content", "Hi");
    assert_null(json_object_get(j, "usage"));
    json_decref(j);
    free(s);
}

/* Checks the framing and returns the parsed payload. */
static json_t *load_sse(const char *s, size_t n)
{
    assert_non_null(s);
    assert_int_equal(strlen(s), n);
    assert_true(n > 8);
    assert_memory_equal(s, "data: ", 6);
    assert_memory_equal(s + n - 2, "\n\n", 2);
    assert_null(memchr(s + 6, '\n', n - 8));
    return load(s + 6, n - 8);
}

static void test_chunk_chat(void **state)
{
    (void)state;
    size_t n = 0;
    char *s = rt_oai_chunk_sse(&(rt_oai_head){true, false, false, "c1", "m", 10}, true, "", 0, NULL, NULL,
                               NULL, 0, &n);
    json_t *j = load_sse(s, n);
    expect_str(j, "id", "c1");
    expect_str(j, "object", "chat.completion.chunk");
    expect_int(j, "created", 10);
    expect_str(j, "model", "m");
    expect_str(j, "choices.0.delta.role", "assistant");
    expect_str(j, "choices.0.delta.content", "");
    expect_null(j, "choices.0.finish_reason");
    expect_int(j, "choices.0.index", 0);
    assert_null(json_object_get(j, "usage"));
    json_decref(j);
    free(s);

    s = rt_oai_chunk_sse(&(rt_oai_head){true, false, false, "c1", "m", 10}, false, "lo wor", 2, NULL, NULL,
                         NULL, 0, &n);
    j = load_sse(s, n);
    expect_str(j, "choices.0.delta.content", "lo");
    assert_null(json_object_get(path(j, "choices.0.delta"), "role"));
    expect_null(j, "choices.0.finish_reason");
    json_decref(j);
    free(s);

    s = rt_oai_chunk_sse(&(rt_oai_head){true, false, false, "c1", "m", 10}, false, NULL, 0, "stop", NULL,
                         NULL, 0, &n);
    j = load_sse(s, n);
    assert_int_equal(json_object_size(path(j, "choices.0.delta")), 0);
    expect_str(j, "choices.0.finish_reason", "stop");
    json_decref(j);
    free(s);

    rt_oai_usage u = {.prompt_tokens = 3, .completion_tokens = 4};
    s = rt_oai_chunk_sse(&(rt_oai_head){true, false, false, "c1", "m", 10}, false, NULL, 0, NULL, &u, NULL, 0,
                         &n);
    j = load_sse(s, n);
    assert_true(json_is_array(path(j, "choices")));
    assert_int_equal(json_array_size(path(j, "choices")), 0);
    expect_int(j, "usage.prompt_tokens", 3);
    expect_int(j, "usage.completion_tokens", 4);
    expect_int(j, "usage.total_tokens", 7);
    json_decref(j);
    free(s);

    /* Exact bytes of a small chunk. */
    s = rt_oai_chunk_sse(&(rt_oai_head){true, false, false, "a", "b", 1}, false, "x", 1, NULL, NULL, NULL, 0,
                         &n);
    assert_string_equal(
        s, "data: {\"id\":\"a\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"b\","
           "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"},\"logprobs\":null,"
           "\"finish_reason\":null}]}\n\n");
    free(s);
    /* out_len may be NULL. */
    s = rt_oai_chunk_sse(&(rt_oai_head){true, false, false, "a", "b", 1}, false, "x", 1, NULL, NULL, NULL, 0,
                         NULL);
    assert_non_null(s);
    free(s);

    /* With include_usage, every chunk before the usage one says null. */
    const rt_oai_head iu = {true, true, false, "c2", "m", 10};
    s = rt_oai_chunk_sse(&iu, true, "", 0, NULL, NULL, NULL, 0, &n);
    j = load_sse(s, n);
    expect_null(j, "usage");
    json_decref(j);
    free(s);
    s = rt_oai_chunk_sse(&iu, false, NULL, 0, "stop", NULL, NULL, 0, &n);
    j = load_sse(s, n);
    expect_null(j, "usage");
    json_decref(j);
    free(s);
    s = rt_oai_chunk_sse(&iu, false, NULL, 0, NULL, &u, NULL, 0, &n);
    j = load_sse(s, n);
    expect_int(j, "usage.total_tokens", 7);
    json_decref(j);
    free(s);
}

static void test_chunk_completions(void **state)
{
    (void)state;
    size_t n = 0;
    char *s = rt_oai_chunk_sse(&(rt_oai_head){false, false, false, "k", "m", 5}, true, "tok", 3, NULL, NULL,
                               NULL, 0, &n);
    json_t *j = load_sse(s, n);
    expect_str(j, "object", "text_completion");
    expect_str(j, "choices.0.text", "tok");
    expect_null(j, "choices.0.finish_reason");
    expect_null(j, "choices.0.logprobs");
    json_decref(j);
    free(s);

    s = rt_oai_chunk_sse(&(rt_oai_head){false, false, false, "k", "m", 5}, false, NULL, 0, "length", NULL,
                         NULL, 0, &n);
    j = load_sse(s, n);
    expect_str(j, "choices.0.text", "");
    expect_str(j, "choices.0.finish_reason", "length");
    json_decref(j);
    free(s);

    rt_oai_usage u = {.prompt_tokens = 1, .completion_tokens = 2};
    s = rt_oai_chunk_sse(&(rt_oai_head){false, false, false, "k", "m", 5}, false, NULL, 0, NULL, &u, NULL, 0,
                         &n);
    j = load_sse(s, n);
    assert_int_equal(json_array_size(path(j, "choices")), 0);
    expect_int(j, "usage.total_tokens", 3);
    json_decref(j);
    free(s);
}

static void test_logprobs_json(void **state)
{
    (void)state;
    rt_oai_logprob lp[2] = {
        {.tok = {"Hi", 2, -0.25f}, .n_top = 2, .top = {{"Hi", 2, -0.25f}, {"\xe2", 1, -1.5f}}},
        {.tok = {"!", 1, -INFINITY}, .n_top = 0},
    };
    rt_oai_usage u = {.prompt_tokens = 1, .completion_tokens = 2};
    const rt_oai_head h = {true, false, true, "c", "m", 1};
    char *s = rt_oai_response_json(&h, "Hi!", 3, "stop", &u, lp, 2);
    json_t *j = load(s, strlen(s));
    expect_str(j, "choices.0.logprobs.content.0.token", "Hi");
    assert_true(json_real_value(path(j, "choices.0.logprobs.content.0.logprob")) == -0.25);
    assert_int_equal(json_array_size(path(j, "choices.0.logprobs.content.0.bytes")), 2);
    expect_int(j, "choices.0.logprobs.content.0.bytes.1", 'i');
    assert_int_equal(json_array_size(path(j, "choices.0.logprobs.content.0.top_logprobs")), 2);
    /* a token that is part of a UTF-8 character: text repaired, bytes exact */
    expect_str(j, "choices.0.logprobs.content.0.top_logprobs.1.token", "\xef\xbf\xbd");
    expect_int(j, "choices.0.logprobs.content.0.top_logprobs.1.bytes.0", 0xe2);
    assert_true(json_real_value(path(j, "choices.0.logprobs.content.1.logprob")) == -9999.0);
    assert_int_equal(json_array_size(path(j, "choices.0.logprobs.content.1.top_logprobs")), 0);
    expect_null(j, "choices.0.logprobs.refusal");
    json_decref(j);
    free(s);
    /* asked for, none generated: an empty list; not asked for: null */
    s = rt_oai_response_json(&h, "", 0, "length", &u, NULL, 0);
    j = load(s, strlen(s));
    assert_int_equal(json_array_size(path(j, "choices.0.logprobs.content")), 0);
    json_decref(j);
    free(s);
    const rt_oai_head off = {true, false, false, "c", "m", 1};
    s = rt_oai_response_json(&off, "Hi!", 3, "stop", &u, lp, 2);
    j = load(s, strlen(s));
    expect_null(j, "choices.0.logprobs");
    json_decref(j);
    free(s);

    /* out of range: NaN as -inf, anything above 0 as 0 (never JSON's
     * missing infinity) */
    rt_oai_logprob odd[2] = {{.tok = {"a", 1, NAN}}, {.tok = {"b", 1, INFINITY}}};
    s = rt_oai_response_json(&h, "ab", 2, "stop", &u, odd, 2);
    assert_non_null(s);
    j = load(s, strlen(s));
    assert_true(json_real_value(path(j, "choices.0.logprobs.content.0.logprob")) == -9999.0);
    assert_true(json_real_value(path(j, "choices.0.logprobs.content.1.logprob")) == 0.0);
    json_decref(j);
    free(s);

    /* a chunk carries those of its tokens; one without, null */
    size_t n;
    s = rt_oai_chunk_sse(&h, false, "Hi", 2, NULL, NULL, lp, 1, &n);
    j = load_sse(s, n);
    assert_int_equal(json_array_size(path(j, "choices.0.logprobs.content")), 1);
    expect_str(j, "choices.0.logprobs.content.0.token", "Hi");
    json_decref(j);
    free(s);
    s = rt_oai_chunk_sse(&h, true, "", 0, NULL, NULL, NULL, 0, &n);
    j = load_sse(s, n);
    expect_null(j, "choices.0.logprobs");
    json_decref(j);
    free(s);
}

static void test_invalid_utf8(void **state)
{
    (void)state;
    static const struct {
        const char *in;
        size_t len;
        const char *want;
    } cases[] = {
        {"a\xff\xc3(b\xe0\x80", 7, "a\xef\xbf\xbd\xef\xbf\xbd(b\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xf0\x9f\x98", 3, "\xef\xbf\xbd"},                         /* truncated emoji: one replacement */
        {"\xf0\x9f\x98\x80!", 5, "\xf0\x9f\x98\x80!"},               /* whole emoji kept */
        {"\xed\xa0\x80", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* surrogate */
        {"\xc0\xaf", 2, "\xef\xbf\xbd\xef\xbf\xbd"},                 /* overlong */
        {"\xf4\x90\x80\x80", 4, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* > U+10FFFF */
        {"caf\xc3\xa9", 5, "caf\xc3\xa9"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        for (int chat = 0; chat < 2; chat++) {
            size_t n;
            char *s = rt_oai_chunk_sse(&(rt_oai_head){chat, false, false, "i", "m", 1}, false, cases[i].in,
                                       cases[i].len, NULL, NULL, NULL, 0, &n);
            json_t *j = load_sse(s, n);
            expect_str(j, chat ? "choices.0.delta.content" : "choices.0.text", cases[i].want);
            json_decref(j);
            free(s);

            s = rt_oai_response_json(&(rt_oai_head){chat, false, false, "i", "m", 1}, cases[i].in,
                                     cases[i].len, "stop", NULL, NULL, 0);
            j = load(s, strlen(s));
            expect_str(j, chat ? "choices.0.message.content" : "choices.0.text", cases[i].want);
            json_decref(j);
            free(s);
        }
    }

    /* A NUL byte in model text is escaped, not a truncation. */
    size_t n;
    char *s = rt_oai_chunk_sse(&(rt_oai_head){false, false, false, "i", "m", 1}, false, "a\0b", 3, NULL, NULL,
                               NULL, 0, &n);
    assert_non_null(strstr(s, "a\\u0000b"));
    json_t *j = load_sse(s, n);
    assert_int_equal(json_string_length(path(j, "choices.0.text")), 3);
    json_decref(j);
    free(s);

    /* Bad bytes in the id or model names are repaired too. */
    s = rt_oai_models_json("bad\xffname", 3);
    j = load(s, strlen(s));
    expect_str(j, "data.0.id", "bad\xef\xbf\xbdname");
    json_decref(j);
    free(s);
}

static void test_models_json(void **state)
{
    (void)state;
    char *s = rt_oai_models_json("tinyllama-1.1b", 1700000001);
    assert_non_null(s);
    json_t *j = load(s, strlen(s));
    expect_str(j, "object", "list");
    assert_int_equal(json_array_size(path(j, "data")), 1);
    expect_str(j, "data.0.id", "tinyllama-1.1b");
    expect_str(j, "data.0.object", "model");
    expect_int(j, "data.0.created", 1700000001);
    expect_str(j, "data.0.owned_by", "infergate");
    json_decref(j);
    free(s);

    s = rt_oai_model_json("tinyllama-1.1b", 1700000001);
    j = load(s, strlen(s));
    expect_str(j, "id", "tinyllama-1.1b");
    expect_str(j, "object", "model");
    expect_int(j, "created", 1700000001);
    json_decref(j);
    free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_completions_defaults),
        cmocka_unit_test(test_completions_all_fields),
        cmocka_unit_test(test_prompt_shapes),
        cmocka_unit_test(test_stop_shapes),
        cmocka_unit_test(test_max_tokens_names),
        cmocka_unit_test(test_null_is_absent_and_unknown_ignored),
        cmocka_unit_test(test_bad_fields),
        cmocka_unit_test(test_malformed_json),
        cmocka_unit_test(test_chat_messages),
        cmocka_unit_test(test_logit_bias_and_top_p),
        cmocka_unit_test(test_unsupported_fields),
        cmocka_unit_test(test_tool_fields),
        cmocka_unit_test(test_chat_logprobs_fields),
        cmocka_unit_test(test_chat_template_kwargs),
        cmocka_unit_test(test_logprobs_json),
        cmocka_unit_test(test_error_set_and_json),
        cmocka_unit_test(test_response_json),
        cmocka_unit_test(test_chunk_chat),
        cmocka_unit_test(test_chunk_completions),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_models_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
