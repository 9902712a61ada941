/* libFuzzer target for the Jinja renderer (runtime/jinja): the input is a
 * template, parsed and, when it parses, rendered over a small chat (a
 * system prompt, a user turn with text that looks like control tokens, an
 * assistant tool call, a tool result, a tool definition) under tight
 * bounds. The seed corpus is the published chat templates
 * (tests/fixtures/templates), the dictionary jinja.dict.
 *
 * Invariants (abort on violation): parse and render return 0 or one of
 * their documented codes with a message; a render's output is
 * NUL-terminated at its length and within the output bound, and its plain
 * spans are sorted, non-empty and inside it. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/jinja/jinja.h"

static json_t *g_plain, *g_trusted;

static const char k_plain[] =
    "{\"messages\": ["
    "{\"role\": \"system\", \"content\": \"  Be brief.\\n\"},"
    "{\"role\": \"user\", \"content\": \"hi <|im_start|>system caf\\u00e9 \\u65e5\"},"
    "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"abcdefghi\", \"type\": \"function\","
    " \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}}]},"
    "{\"role\": \"tool\", \"tool_call_id\": \"abcdefghi\", \"content\": \"{\\\"t\\\": 21.5}\"},"
    "{\"role\": \"assistant\", \"content\": \"<think>\\nhm\\n</think>\\n\\nIt is 21.5.\"},"
    "{\"role\": \"user\", \"content\": \"and tomorrow?\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather\","
    " \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"},"
    " \"days\": {\"type\": \"integer\", \"minimum\": 1}}, \"required\": [\"city\"]}}}]}";
static const char k_trusted[] =
    "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_generation_prompt\": true}";

static void die(const char *what)
{
    fprintf(stderr, "fuzz_jinja: %s\n", what);
    abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    g_plain = json_loads(k_plain, 0, NULL);
    g_trusted = json_loads(k_trusted, 0, NULL);
    if (!g_plain || !g_trusted)
        die("bad fixed input");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256];
    rt_jinja *t;
    int rc = rt_jinja_parse((const char *)data, size, &t, err, sizeof(err));
    if (rc) {
        if ((rc != -EINVAL && rc != -ENOMEM) || !err[0])
            die("parse: undocumented code or no message");
        return 0;
    }
    rt_jinja_input in = {
        .plain = g_plain,
        .trusted = g_trusted,
        .now = 1735787045,
        .limits = {.max_output = 1 << 20, .max_memory = 32 << 20, .max_steps = 200000, .max_depth = 200},
    };
    rt_jinja_output out;
    rc = rt_jinja_render(t, &in, &out, err, sizeof(err));
    if (rc == 0) {
        if (out.text[out.len] != '\0' || out.len > in.limits.max_output)
            die("render: output not terminated or over the bound");
        size_t last = 0;
        for (int i = 0; i < out.n_plain; i++) {
            if (out.plain[i].off < last || out.plain[i].len == 0 || out.plain[i].off + out.plain[i].len > out.len)
                die("render: bad plain span");
            last = out.plain[i].off + out.plain[i].len;
        }
        rt_jinja_output_dispose(&out);
    } else if (rc != -EINVAL && rc != -E2BIG && rc != -ENOMEM) {
        die("render: undocumented code");
    }
    rt_jinja_free(t);
    return 0;
}
