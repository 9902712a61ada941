/* Tool-call parsing (runtime/toolcall): recorded answers of each format,
 * whole and fed split at every byte (and byte by byte), give the same
 * content and calls; text that only looks like a call stays content; the
 * forcing grammar compiles and names a refused schema keyword; gpt-oss's
 * harmony channels give reasoning, content and calls. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>

#include <stdlib.h>
#include <string.h>

#include "runtime/toolcall.h"

typedef struct want {
    rt_tc_format f;
    const char *text;
    const char *content;
    int n_calls;
    const char *calls[3][2]; /* name, arguments */
} want;


static const want CASES[] = {
    {RT_TC_HERMES, "Hello there.", "Hello there.", 0, {{0}}},
    {RT_TC_HERMES, "  spaces kept when no call  \n", "  spaces kept when no call  \n", 0, {{0}}},
    {RT_TC_HERMES,
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"n\": "
     "123456789012345678901234}}"
     "\n</tool_call>",
     "",
     1,
     {{"get_weather", "{\"city\": \"Paris\", \"n\": 123456789012345678901234}"}}},
    {RT_TC_HERMES,
     "Let me check.\n\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n"
     "{\"arguments\": {\"x\": [1, \"}\"]}, \"name\": \"b\"}\n</tool_call>\n",
     "Let me check.",
     2,
     {{"a", "{}"}, {"b", "{\"x\": [1, \"}\"]}"}}},
    /* arguments as a string of JSON, as OpenAI's API writes them */
    {RT_TC_HERMES,
     "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"k\\\": 1}\"}</tool_call>",
     "",
     1,
     {{"f", "{\"k\": 1}"}}},
    /* a string that is not JSON: the string itself (fuzz_toolcall's find) */
    {RT_TC_HERMES,
     "<tool_call>{\"name\": \"f\", \"arguments\": \"abc\"}</tool_call>",
     "",
     1,
     {{"f", "\"abc\""}}},
    /* not JSON, no name: it stays text */
    {RT_TC_HERMES, "x <tool_call>{nope}</tool_call> y", "x <tool_call>{nope}</tool_call> y", 0, {{0}}},
    {RT_TC_HERMES,
     "<tool_call>{\"arguments\": {}}</tool_call>",
     "<tool_call>{\"arguments\": {}}</tool_call>",
     0,
     {{0}}},
    /* the answer ended before the closing tag */
    {RT_TC_HERMES, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}", "", 1, {{"f", "{\"a\": 1}"}}},
    {RT_TC_HERMES, "a <tool_call> b", "a <tool_call> b", 0, {{0}}},
    {RT_TC_HERMES, "ends with <tool_ca", "ends with <tool_ca", 0, {{0}}},
    {RT_TC_LLAMA3,
     "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}",
     "",
     1,
     {{"get_weather", "{\"city\": \"Oslo\"}"}}},
    {RT_TC_LLAMA3, "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}", "", 1, {{"f", "{}"}}},
    {RT_TC_LLAMA3, "The weather is fine. {\"name\": 1}", "The weather is fine. {\"name\": 1}", 0, {{0}}},
    {RT_TC_LLAMA3, "{\"a\": 1}", "{\"a\": 1}", 0, {{0}}},
    {RT_TC_LLAMA3, " <|pyth", " <|pyth", 0, {{0}}},
    /* several calls, separated by ';' */
    {RT_TC_LLAMA3,
     "{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"parameters\": {}}",
     "",
     2,
     {{"a", "{\"x\": 1}"}, {"b", "{}"}}},
    {RT_TC_LLAMA3,
     "<|python_tag|>{\"name\": \"a\", \"parameters\": {}};{\"name\": \"b\", \"parameters\": {\"y\": \"; "
     "\"}};\n"
     "{\"name\": \"c\", \"parameters\": {}}",
     "",
     3,
     {{"a", "{}"}, {"b", "{\"y\": \"; \"}"}, {"c", "{}"}}},
    {RT_TC_LLAMA3,
     "{\"name\": \"a\", \"parameters\": {}}; and more",
     "{\"name\": \"a\", \"parameters\": {}}; and more",
     0,
     {{0}}},
    {RT_TC_LLAMA3,
     "{\"name\": \"a\", \"parameters\": {}}; {\"nope\": 1}",
     "{\"name\": \"a\", \"parameters\": {}}; {\"nope\": 1}",
     0,
     {{0}}},
    {RT_TC_MISTRAL,
     "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"q\": \"x\"}}, {\"name\": \"b\", \"arguments\": {}}]",
     "",
     2,
     {{"a", "{\"q\": \"x\"}"}, {"b", "{}"}}},
    {RT_TC_MISTRAL, "Sure. [TOOL_CALLS][{\"name\": \"a\"}]", "Sure.", 1, {{"a", "{}"}}},
    {RT_TC_MISTRAL, "[TOOL_CALLS] not a list", "[TOOL_CALLS] not a list", 0, {{0}}},
    {RT_TC_MISTRAL, "[TOOL_CALLS][{\"name\": \"a\"}, 5]", "[TOOL_CALLS][{\"name\": \"a\"}, 5]", 0, {{0}}},
};

/* gpt-oss's harmony: its cases with the reasoning they give. */
typedef struct hwant {
    want w;
    const char *reasoning;
} hwant;

#define H_CALL(name) "<|channel|>commentary to=functions." name " <|constrain|>json<|message|>"

static const hwant HARMONY_CASES[] = {
    /* gpt-oss: the answer follows the prompt's <|start|>assistant; <|call|>
     * and <|return|> end generation, so most answers stop before them */
    {{RT_TC_HARMONY,
     "<|channel|>analysis<|message|>User asks weather. Need to call get_weather.<|end|>"
     "<|start|>assistant" H_CALL("get_weather") "{\"location\":\"San Francisco, CA\"}",
     "",
     1,
     {{"get_weather", "{\"location\":\"San Francisco, CA\"}"}}},
     "User asks weather. Need to call get_weather."},
    {{RT_TC_HARMONY,
     H_CALL("f") "{\"n\": 123456789012345678901234, \"s\": \"<|\"}<|call|>",
     "",
     1,
     {{"f", "{\"n\": 123456789012345678901234, \"s\": \"<|\"}"}}},
     ""},
    {{RT_TC_HARMONY,
     "<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant<|channel|>final<|message|>Hello! How "
     "can I help?",
     "Hello! How can I help?",
     0,
     {{0}}},
     "Simple."},
    /* the recipient in the role, as the template renders a past call */
    {{RT_TC_HARMONY,
     "<|start|>assistant to=functions.f<|channel|>commentary json<|message|> {\"a\": [1, 2]}\n<|call|>",
     "",
     1,
     {{"f", "{\"a\": [1, 2]}"}}},
     ""},
    /* a preamble is content; two calls; a built-in tool's message is reasoning */
    {{RT_TC_HARMONY,
     "<|channel|>commentary<|message|>Checking the weather.<|end|>"
     "<|start|>assistant" H_CALL("w") "{}<|call|>"
     "<|start|>assistant" H_CALL("g") "{\"b\":2}<|call|>"
     "<|start|>assistant<|channel|>analysis to=browser.search<|message|>{\"q\":\"x\"}<|call|>",
     "Checking the weather.",
     2,
     {{"w", "{}"}, {"g", "{\"b\":2}"}}},
     "{\"q\":\"x\"}"},
    {{RT_TC_HARMONY, "Just text, no <|channel|> here.", "Just text, no <|channel|> here.", 0, {{0}}}, ""},
    {{RT_TC_HARMONY, "<|channel|>final<|message|>Ends with <|en", "Ends with <|en", 0, {{0}}}, ""},
    {{RT_TC_HARMONY, "<|chan", "<|chan", 0, {{0}}}, ""},
    {{RT_TC_HARMONY, "<|channel|>analysis<|message|>cut short", "", 0, {{0}}}, "cut short"},
};

/* Feeds w's text in pieces cut at the given offsets; checks the result. */
static int n_pending; /* feeds that saw a call's arguments in part */

static void run(const want *w, const char *reasoning, const size_t *cuts, int n_cuts)
{
    rt_tc_parser *p = rt_tc_parser_new(w->f);
    assert_non_null(p);
    size_t n = strlen(w->text), at = 0;
    char got[1024] = "", seen[1024], seen_name[64], thought[1024] = "";
    size_t got_len = 0, seen_len = 0, thought_len = 0;
    for (int i = 0; i <= n_cuts; i++) {
        size_t to = i < n_cuts ? cuts[i] : n;
        const char *c;
        size_t c_len;
        int before = rt_tc_n_calls(p);
        assert_int_equal(rt_tc_feed(p, w->text + at, to - at, i == n_cuts, &c, &c_len), 0);
        /* arguments streamed in pieces are a prefix of the call's */
        for (int k = before; k < rt_tc_n_calls(p) && seen_len; k++, seen_len = 0) {
            assert_string_equal(rt_tc_call_at(p, k)->name, seen_name);
            assert_memory_equal(rt_tc_call_at(p, k)->arguments, seen, seen_len);
        }
        const char *pn, *pa;
        size_t pl;
        if (rt_tc_pending(p, &pn, &pa, &pl)) {
            assert_true(pl >= seen_len && pl < sizeof(seen));
            assert_memory_equal(pa, seen, seen_len);
            memcpy(seen, pa, pl);
            seen_len = pl;
            snprintf(seen_name, sizeof(seen_name), "%s", pn);
            n_pending++;
        }
        const char *r;
        size_t r_len;
        rt_tc_reasoning(p, &r, &r_len);
        assert_true(thought_len + r_len < sizeof(thought));
        memcpy(thought + thought_len, r, r_len);
        thought_len += r_len;
        thought[thought_len] = '\0';
        assert_true(got_len + c_len < sizeof(got));
        memcpy(got + got_len, c, c_len);
        got_len += c_len;
        got[got_len] = '\0';
        at = to;
    }
    if (strcmp(got, w->content) || rt_tc_n_calls(p) != w->n_calls)
        fail_msg("%s %s cut %d: content [%s] calls %d", rt_tc_format_name(w->f), w->text,
                 n_cuts ? (int)cuts[0] : -1, got, rt_tc_n_calls(p));
    assert_string_equal(thought, reasoning ? reasoning : "");
    for (int i = 0; i < w->n_calls; i++) {
        assert_string_equal(rt_tc_call_at(p, i)->name, w->calls[i][0]);
        assert_string_equal(rt_tc_call_at(p, i)->arguments, w->calls[i][1]);
    }
    rt_tc_parser_free(p);
}

static void test_recorded(void **state)
{
    (void)state;
    const size_t n_plain = sizeof(CASES) / sizeof(CASES[0]);
    for (size_t k = 0; k < n_plain + sizeof(HARMONY_CASES) / sizeof(HARMONY_CASES[0]); k++) {
        const want *w = k < n_plain ? &CASES[k] : &HARMONY_CASES[k - n_plain].w;
        const char *r = k < n_plain ? NULL : HARMONY_CASES[k - n_plain].reasoning;
        size_t n = strlen(w->text);
        run(w, r, NULL, 0);
        for (size_t cut = 0; cut <= n; cut++)
            run(w, r, &cut, 1);
        size_t *every = malloc((n + 1) * sizeof(size_t));
        for (size_t i = 0; i <= n; i++)
            every[i] = i;
        run(w, r, every, (int)n + 1);
        free(every);
    }
    assert_true(n_pending > 100);
}

/* Content that streams goes out as it comes, but for what may open a call. */
static void test_streams_early(void **state)
{
    (void)state;
    rt_tc_parser *p = rt_tc_parser_new(RT_TC_HERMES);
    const char *c;
    size_t n;
    assert_int_equal(rt_tc_feed(p, "Hello <tool", 11, false, &c, &n), 0);
    assert_int_equal(n, 5);
    assert_memory_equal(c, "Hello", 5);
    assert_int_equal(rt_tc_feed(p, "bar", 3, false, &c, &n), 0);
    assert_string_equal(c, " <toolbar");
    rt_tc_parser_free(p);
    p = rt_tc_parser_new(RT_TC_LLAMA3);
    assert_int_equal(rt_tc_feed(p, "Hi", 2, false, &c, &n), 0);
    assert_string_equal(c, "Hi");
    rt_tc_parser_free(p);
}

static void test_detect(void **state)
{
    (void)state;
    const char *q = "{% for t in tools %}<tool_call>{% endfor %}";
    const char *l = "<|start_header_id|>ipython<|end_header_id|>";
    const char *m = "[AVAILABLE_TOOLS]{{ tools }}[TOOL_CALLS]";
    assert_int_equal(rt_tc_detect(q, strlen(q)), RT_TC_HERMES);
    assert_int_equal(rt_tc_detect(l, strlen(l)), RT_TC_LLAMA3);
    assert_int_equal(rt_tc_detect(m, strlen(m)), RT_TC_MISTRAL);
    assert_int_equal(rt_tc_detect(NULL, 0), RT_TC_HERMES);
    const char *h = "{{- '<|start|>assistant<|channel|>final<|message|>' }}";
    assert_int_equal(rt_tc_detect(h, strlen(h)), RT_TC_HARMONY);
}

/* A harmony call cut short: {} (its arguments are not JSON yet); the
 * harmony answer that streams its final channel as it comes. */
static void test_harmony_cut(void **state)
{
    (void)state;
    rt_tc_parser *p = rt_tc_parser_new(RT_TC_HARMONY);
    const char *c, *r, *pn, *pa;
    size_t n, rn, pl;
    const char *text = H_CALL("f") "{\"a\": ";
    assert_int_equal(rt_tc_feed(p, text, strlen(text), false, &c, &n), 0);
    assert_true(rt_tc_pending(p, &pn, &pa, &pl));
    assert_string_equal(pn, "f");
    assert_int_equal(pl, 5);
    assert_int_equal(rt_tc_feed(p, "", 0, true, &c, &n), 0);
    assert_false(rt_tc_pending(p, &pn, &pa, &pl));
    assert_int_equal(rt_tc_n_calls(p), 1);
    assert_string_equal(rt_tc_call_at(p, 0)->arguments, "{}");
    rt_tc_parser_free(p);
    p = rt_tc_parser_new(RT_TC_HARMONY);
    text = "<|channel|>analysis<|message|>Hm<|end|><|start|>assistant<|channel|>final<|message|>Hi <|";
    assert_int_equal(rt_tc_feed(p, text, strlen(text), false, &c, &n), 0);
    rt_tc_reasoning(p, &r, &rn);
    assert_int_equal(rn, 2);
    assert_int_equal(n, 3);
    assert_memory_equal(c, "Hi ", 3);
    rt_tc_parser_free(p);
}

static void test_grammar(void **state)
{
    (void)state;
    json_t *tools =
        json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"
                   "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
                   "\"required\":[\"city\"]}}},{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]",
                   0, NULL);
    char *g = NULL, err[256];
    size_t len = 0;
    for (int f = RT_TC_HERMES; f <= RT_TC_HARMONY; f++) {
        assert_int_equal(rt_tc_grammar((rt_tc_format)f, tools, NULL, true, &g, &len, err, sizeof(err)), 0);
        assert_non_null(strstr(g, "root ::="));
        assert_non_null(strstr(g, "get_weather"));
        free(g);
    }
    assert_int_equal(rt_tc_grammar(RT_TC_HERMES, tools, "f", false, &g, &len, err, sizeof(err)), 0);
    assert_null(strstr(g, "get_weather"));
    free(g);
    assert_int_equal(rt_tc_grammar(RT_TC_HERMES, tools, "nope", false, &g, &len, err, sizeof(err)), -22);
    json_object_set_new(json_object_get(json_object_get(json_array_get(tools, 0), "function"), "parameters"),
                        "minProperties", json_integer(1));
    assert_int_equal(rt_tc_grammar(RT_TC_HERMES, tools, NULL, false, &g, &len, err, sizeof(err)), -22);
    assert_non_null(strstr(err, "tools[0].function.parameters"));
    assert_non_null(strstr(err, "minProperties"));
    json_decref(tools);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recorded), cmocka_unit_test(test_streams_early),
        cmocka_unit_test(test_detect),   cmocka_unit_test(test_harmony_cut),
        cmocka_unit_test(test_grammar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
