/* OpenAI-compatible request parsing and response encoding for
 * /v1/completions and /v1/chat/completions (JSON through jansson).
 *
 * Parsing is strict about types and lenient about unknown fields, as
 * OpenAI's API is: a field with the wrong type is a 400 naming the field,
 * an unknown field is ignored. The gateway passes bodies through unchanged;
 * only the worker parses them fully. */
#ifndef RT_OPENAI_H
#define RT_OPENAI_H

#include "runtime/sampler.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct json_t;

#define RT_OAI_MAX_STOPS 4 /* OpenAI allows up to 4 stop sequences */
/* Bytes of one stop sequence. The text that could still begin one is held
 * back from the stream and searched again at every token: a long one would
 * cost each token time that grows with its square. */
#define RT_OAI_MAX_STOP_BYTES 512
#define RT_OAI_MAX_TOP_LOGPROBS RT_MAX_TOP_LOGPROBS /* top_logprobs: 0..20 */

typedef struct rt_oai_error {
    int status;          /* HTTP status: 400, 404, 413, 429, 500, 503, 504 */
    char message[256];
    const char *type;    /* "invalid_request_error", "rate_limit_error", "server_error", ... */
    const char *param;   /* the offending field, or NULL */
    const char *code;    /* e.g. "model_not_found", "context_length_exceeded", or NULL */
    /* Storage for an indexed param such as "messages[3].role": param then
     * points here, so copy the struct only while the original lives. */
    char param_buf[64];
} rt_oai_error;

typedef struct rt_oai_message {
    char *role;    /* system (developer too), user, assistant, tool */
    char *content; /* NULL: null (an assistant's turn of tool calls alone) */
} rt_oai_message;

/* A message's fields for tool calling, beside it (rt_oai_request.extra). */
typedef struct rt_oai_msg_extra {
    /* An assistant's tool calls, as the request had them but each
     * function's arguments parsed from their JSON text (what chat
     * templates read, as vLLM gives them); NULL when none. */
    struct json_t *tool_calls;
    char *tool_call_id; /* a tool's answer: the call it answers */
    char *name;         /* or NULL */
} rt_oai_msg_extra;

typedef enum rt_oai_tool_choice {
    RT_TOOL_AUTO = 0, /* the model may call a tool (the default with tools) */
    RT_TOOL_NONE,     /* it answers in text: the tools are not offered */
    RT_TOOL_REQUIRED, /* it calls at least one: enforced by the grammar */
    RT_TOOL_NAMED,    /* it calls the one named: enforced by the grammar */
} rt_oai_tool_choice;

typedef struct rt_oai_request {
    bool chat;
    bool stream;
    bool include_usage; /* stream_options.include_usage */
    char *model;
    /* completions: the prompt as text, or as token ids (exactly one set) */
    char *prompt;
    int32_t *prompt_tokens;
    int n_prompt_tokens;
    /* chat: the messages (content of string type; an array of text parts is
     * joined) */
    rt_oai_message *messages;
    int n_messages;
    rt_oai_msg_extra *extra; /* n_messages of them, or NULL */
    int max_tokens; /* max_tokens or max_completion_tokens; -1 when absent */
    const char *max_tokens_name; /* which of the two it came by, for errors */
    rt_sampler_params sampling; /* temperature (default 1), top_p, seed, penalties */
    bool has_seed;
    char *stop[RT_OAI_MAX_STOPS];
    int n_stop;
    char *user;
    bool ignore_eos; /* non-standard (vLLM): keep generating past end-of-generation tokens */
    bool no_thinking; /* chat, non-standard (vLLM): chat_template_kwargs.enable_thinking false */
    /* chat, non-standard (vLLM): chat_template_kwargs, every entry a variable
     * of the model's Jinja template (enable_thinking, reasoning_effort...);
     * NULL when absent. The request holds a reference. */
    struct json_t *template_kwargs;
    /* chat: the tools offered ([{"type":"function","function":{name,
     * description, parameters}}], checked), NULL when none or tool_choice
     * none; the choice, the function named, and whether several calls may
     * come in one answer (parallel_tool_calls, default true). A function's
     * "strict" (a boolean) changes nothing: its parameters are enforced
     * where tool_choice is required or names it, and not with auto. */
    struct json_t *tools;
    rt_oai_tool_choice tool_choice;
    char *tool_name;
    bool parallel_tool_calls;
    /* Structured output: the JSON Schema the answer must match
     * (response_format json_schema's, or {"type":"object"} for
     * json_object), and llama.cpp's "grammar" (GBNF); NULL when absent.
     * Both endpoints take them. The schema is enforced whatever
     * json_schema's "strict" (a boolean) says: OpenAI's strict false
     * promises no adherence, which an adhering answer keeps. */
    struct json_t *json_schema;
    char *grammar;
    bool logprobs;   /* chat: each token's log-probability... */
    int top_logprobs; /* ...and this many of the likeliest */
} rt_oai_request;

/* Parses a request body. chat selects the endpoint's schema. n_vocab bounds
 * token ids in a token-array prompt (<= 0: unbounded). On failure returns
 * -EINVAL with *e filled (status 400), or -ENOMEM (status 500), and *req
 * holds nothing to free. */
int rt_oai_parse(const char *body, size_t len, bool chat, int32_t n_vocab, rt_oai_request *req, rt_oai_error *e);
void rt_oai_request_dispose(rt_oai_request *req);

/* Sets *e (message formatted printf-style). */
void rt_oai_error_set(rt_oai_error *e, int status, const char *type, const char *param, const char *code,
                      const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* {"error":{"message","type","param","code"}} as a malloc'd string. */
char *rt_oai_error_json(const rt_oai_error *e);

typedef struct rt_oai_usage {
    int prompt_tokens, completion_tokens;
    int cached_tokens; /* of prompt_tokens, those the prefix cache held: prompt_tokens_details.cached_tokens */
} rt_oai_usage;

/* One tool call the model made, as a response or a chunk says it. */
#define RT_OAI_CALL_ID_MAX 48
typedef struct rt_oai_tool_call {
    int index;                   /* its place among the answer's calls, from 0 */
    char id[RT_OAI_CALL_ID_MAX]; /* "call_..." */
    const char *name;            /* the function's; NULL in a chunk: a piece of the call's arguments alone */
    const char *arguments;       /* JSON text (valid UTF-8) */
} rt_oai_tool_call;

/* What a response, or every chunk of one streamed response, repeats. */
typedef struct rt_oai_head {
    bool chat;
    bool include_usage; /* chunks carry "usage": null until the usage chunk */
    bool logprobs;      /* the choice carries a logprobs object (chat) */
    const char *id, *model;
    long created;
} rt_oai_head;

/* One generated token's log-probability and the likeliest alternatives
 * (text: the token's bytes, which need not be whole UTF-8 characters). */
typedef struct rt_oai_token_lp {
    const char *text;
    size_t len;
    float logprob; /* -inf is written as -9999.0, as OpenAI does */
} rt_oai_token_lp;

typedef struct rt_oai_logprob {
    rt_oai_token_lp tok;
    int n_top;
    rt_oai_token_lp top[RT_OAI_MAX_TOP_LOGPROBS];
} rt_oai_logprob;

/* Whole (non-streamed) response. finish_reason "stop" or "length"; a chat
 * message carries "refusal": null, as OpenAI's SDK types have it; with
 * h->logprobs, choices[0].logprobs is {"content":[n_lp entries],
 * "refusal":null}. */
char *rt_oai_response_json(const rt_oai_head *h, const char *text, size_t text_len, const char *finish_reason,
                           const rt_oai_usage *usage, const rt_oai_logprob *lp, int n_lp);
/* What a chat's answer has beside its text: the model's reasoning
 * (reasoning_content, where it is not NULL) and its tool calls (content
 * null when it has no text). */
typedef struct rt_oai_answer {
    const char *text;
    size_t text_len;
    const char *reasoning;
    size_t reasoning_len;
    const rt_oai_tool_call *calls;
    int n_calls;
} rt_oai_answer;
char *rt_oai_response_answer_json(const rt_oai_head *h, const rt_oai_answer *a, const char *finish_reason,
                                  const rt_oai_usage *usage, const rt_oai_logprob *lp, int n_lp);
/* One SSE event "data: {...}\n\n" of a streamed response, with the delta
 * text (chat: the first chunk also carries "role":"assistant"), the
 * finish_reason on the last one (NULL before), the log-probabilities of
 * the tokens it covers (n_lp > 0, with h->logprobs), and a usage chunk
 * (empty choices) when usage != NULL and text == NULL. Returns a malloc'd
 * string and its length in *out_len. */
char *rt_oai_chunk_sse(const rt_oai_head *h, bool first, const char *text, size_t text_len,
                       const char *finish_reason, const rt_oai_usage *usage, const rt_oai_logprob *lp,
                       int n_lp, size_t *out_len);
/* A chat chunk whose delta is a piece of the model's reasoning_content. */
char *rt_oai_reasoning_chunk_sse(const rt_oai_head *h, const char *text, size_t len, size_t *out_len);
/* A chat chunk whose delta carries tool calls: each whole, its head (id,
 * name, the arguments so far), or a piece of its arguments (name NULL), as
 * OpenAI's stream sends a call's head and then its arguments in pieces. */
char *rt_oai_calls_chunk_sse(const rt_oai_head *h, const rt_oai_tool_call *calls, int n_calls,
                             size_t *out_len);
/* {"object":"list","data":[{"id":model,"object":"model","created":..,"owned_by":"infergate"}]} */
char *rt_oai_models_json(const char *model, long created);
/* One model object, as GET /v1/models/{model} answers. */
char *rt_oai_model_json(const char *model, long created);

#endif
