/* Tool calls in a model's text: the grammar that makes a model call a tool
 * (tool_choice required or a named function) and the parser that reads its
 * calls out of what it wrote, whole or as it streams, in the format its
 * family was trained on:
 *
 *   hermes   <tool_call>\n{"name": N, "arguments": {...}}\n</tool_call>
 *            (Qwen2.5/3, Hermes, and any ChatML model: the default)
 *   llama3   {"name": N, "parameters": {...}}, the whole answer, maybe
 *            after <|python_tag|>; several separated by ';' (Llama 3.1+)
 *   mistral  [TOOL_CALLS][{"name": N, "arguments": {...}}, ...]
 *   harmony  <|channel|>commentary to=functions.N <|constrain|>json
 *            <|message|>{...}<|call|> among gpt-oss's channels, whose
 *            analysis is reasoning (runtime/harmony.h)
 *
 * A call's arguments are the model's JSON text as written (checked to be
 * JSON), not re-serialised, so that numbers beyond 64 bits and key order
 * survive. Text that looks like a call but is not one (bad JSON, no name)
 * stays content, as vLLM leaves it.
 *
 * Threads: a parser is one request's; the rest is pure. */
#ifndef RT_TOOLCALL_H
#define RT_TOOLCALL_H

#include <stdbool.h>
#include <stddef.h>

typedef struct json_t json_t;

typedef enum rt_tc_format {
    RT_TC_HERMES = 0,
    RT_TC_LLAMA3,
    RT_TC_MISTRAL,
    RT_TC_HARMONY,
} rt_tc_format;

/* The format a chat template's text writes tool calls in (its markers);
 * hermes for NULL or a template without them. */
rt_tc_format rt_tc_detect(const char *tmpl, size_t len);
const char *rt_tc_format_name(rt_tc_format f);

/* GBNF whose language is one call (several where parallel) of the
 * functions in tools (the request's checked array; only the one called
 * name when name is not NULL), each with arguments matching its
 * "parameters" schema (rt_schema_gbnf). malloc'd in *out (*len bytes).
 * 0; -EINVAL with err naming the tool and the schema keyword refused
 * ("tools[1].function.parameters: 'not' at # is not supported"); -ENOMEM. */
int rt_tc_grammar(rt_tc_format f, const json_t *tools, const char *name, bool parallel, char **out,
                  size_t *len, char *err, size_t err_len);

typedef struct rt_tc_call {
    char *name;      /* the function's, decoded */
    char *arguments; /* JSON text */
} rt_tc_call;

typedef struct rt_tc_parser rt_tc_parser;

/* NULL when out of memory. */
rt_tc_parser *rt_tc_parser_new(rt_tc_format f);
void rt_tc_parser_free(rt_tc_parser *p);

/* Feeds the next piece of the answer (final: the answer ends with it).
 * *content and *content_len get the text that is content and may go out
 * now (owned by p, valid until the next call): text that may yet turn out
 * to open a call is held back, and whitespace around calls is dropped.
 * Calls it completes are appended to p's (rt_tc_n_calls). 0, or -ENOMEM
 * (p is then unusable). */
int rt_tc_feed(rt_tc_parser *p, const char *text, size_t len, bool final, const char **content,
               size_t *content_len);
/* The reasoning the last feed let out: harmony's analysis channel (its
 * other formats have none: "", 0). Owned by p, valid until the next feed. */
void rt_tc_reasoning(const rt_tc_parser *p, const char **text, size_t *len);
int rt_tc_n_calls(const rt_tc_parser *p);
/* The i-th call (0 <= i < rt_tc_n_calls), valid while p lives. */
const rt_tc_call *rt_tc_call_at(const rt_tc_parser *p, int i);
/* The call being written (hermes, harmony), for streaming its arguments in pieces
 * as OpenAI does: true once its head {"name": N, "arguments": { has come,
 * with N and the arguments' text so far (valid until the next feed). A
 * well-formed call's final arguments begin with every such text; the call
 * it becomes is the next rt_tc_call_at. */
bool rt_tc_pending(const rt_tc_parser *p, const char **name, const char **args, size_t *len);

#endif
