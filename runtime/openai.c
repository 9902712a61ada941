/* OpenAI request parsing and response encoding (see openai.h).
 *
 * Parsing follows the OpenAI API reference for the fields a local model can
 * honour, checking each one's type and range and naming it in the error's
 * `param`; JSON null means the field is absent, as the Python SDK sends it.
 * Choices the reference leaves open are made the way vLLM and llama.cpp's
 * server make them, so clients written against those keep working:
 *   - max_completion_tokens wins over max_tokens when both are given;
 *   - the text parts of an array content are joined with "\n";
 *   - top_k and min_p (not OpenAI fields) are accepted, top_k < 0 means off;
 *   - duplicate keys are rejected, so that the gateway (which reads only
 *     `model` and `stream`) and the worker cannot see different values.
 *
 * Encoding builds jansson trees and dumps them compact. Text that is not
 * valid UTF-8 has each ill-formed subsequence replaced by U+FFFD, so a
 * response is always valid JSON whatever bytes the model produced. */
#include "runtime/openai.h"
#include "gateway/base/oai_error.h"
#include "gateway/base/utf8.h"

#include <jansson.h>

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char invalid_request[] = "invalid_request_error";

/* ---- errors ---- */

static void error_vset(rt_oai_error *e, int status, const char *type, const char *param, const char *code,
                       const char *fmt, va_list ap)
{
    e->status = status;
    e->type = type;
    e->code = code;
    if (param != e->param_buf)
        e->param_buf[0] = '\0';
    e->param = param;
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
}

void rt_oai_error_set(rt_oai_error *e, int status, const char *type, const char *param, const char *code,
                      const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    error_vset(e, status, type, param, code, fmt, ap);
    va_end(ap);
}

/* A 400 invalid_request_error; returns -EINVAL for `return bad(...)`. */
static int bad(rt_oai_error *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int bad(rt_oai_error *e, const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    error_vset(e, 400, invalid_request, param, NULL, fmt, ap);
    va_end(ap);
    return -EINVAL;
}

static int oom(rt_oai_error *e)
{
    rt_oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory parsing the request");
    return -ENOMEM;
}

/* Formats an indexed param name ("messages[2].content[0].type") into the
 * error's own storage. */
static const char *param_at(rt_oai_error *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static const char *param_at(rt_oai_error *e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->param_buf, sizeof(e->param_buf), fmt, ap);
    va_end(ap);
    return e->param_buf;
}

/* ---- UTF-8 repair (gateway/base/utf8.h) ---- */

/* A JSON string of n bytes of s (NUL bytes allowed: jansson escapes them),
 * repaired when it is not valid UTF-8. NULL only on ENOMEM. */
static json_t *json_text(const char *s, size_t n)
{
    if (!s) {
        s = "";
        n = 0;
    }
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, skip;
    while (i < n) {
        size_t k = gw_utf8_seq(p + i, n - i, &skip);
        if (k == 0)
            break;
        i += k;
    }
    if (i == n)
        return json_stringn(s, n);

    /* Worst case every byte becomes the three bytes of U+FFFD. */
    if (n > (SIZE_MAX - 1) / 3)
        return NULL;
    char *fixed = malloc(n * 3 + 1);
    if (!fixed)
        return NULL;
    memcpy(fixed, s, i);
    size_t o = i;
    while (i < n) {
        size_t k = gw_utf8_seq(p + i, n - i, &skip);
        if (k > 0) {
            memcpy(fixed + o, s + i, k);
            o += k;
            i += k;
        } else {
            memcpy(fixed + o, GW_UTF8_REPLACEMENT, 3);
            o += 3;
            i += skip;
        }
    }
    json_t *j = json_stringn(fixed, o);
    free(fixed);
    return j;
}

static json_t *json_cstr(const char *s)
{
    return json_text(s, s ? strlen(s) : 0);
}

/* ---- field readers ----
 * Each returns 1 when the field is present, 0 when it is absent or null,
 * -EINVAL (with *e filled) when its type or range is wrong. */

static json_t *field(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return v && !json_is_null(v) ? v : NULL;
}

static int get_bool(json_t *obj, const char *key, bool *out, rt_oai_error *e)
{
    json_t *v = field(obj, key);
    if (!v)
        return 0;
    if (!json_is_boolean(v))
        return bad(e, key, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 1;
}

/* A number in [lo, hi], or (lo, hi] with lo_open. */
static int get_number(json_t *obj, const char *key, double lo, double hi, bool lo_open, double *out,
                      rt_oai_error *e)
{
    json_t *v = field(obj, key);
    if (!v)
        return 0;
    if (!json_is_number(v))
        return bad(e, key, "'%s' must be a number", key);
    double d = json_number_value(v);
    if ((lo_open ? !(d > lo) : !(d >= lo)) || !(d <= hi))
        return bad(e, key, "'%s' must be %s %g and at most %g", key, lo_open ? "greater than" : "at least",
                   lo, hi);
    *out = d;
    return 1;
}

/* An integer in [lo, hi]. A real with an integral value (100.0) counts, as
 * pydantic's lax mode in vLLM allows. */
static int get_int(json_t *obj, const char *key, long long lo, long long hi, long long *out, rt_oai_error *e)
{
    json_t *v = field(obj, key);
    if (!v)
        return 0;
    long long x = 0;
    if (json_is_integer(v)) {
        x = json_integer_value(v);
    } else if (json_is_real(v)) {
        double d = json_real_value(v);
        /* The range test comes first: converting an out-of-range double
         * is undefined. 2^63 is the first value that does not fit. */
        if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0) || d != (double)(long long)d)
            return bad(e, key, "'%s' must be an integer", key);
        x = (long long)d;
    } else {
        return bad(e, key, "'%s' must be an integer", key);
    }
    if (x < lo)
        return bad(e, key, "'%s' must be at least %lld", key, lo);
    if (x > hi)
        return bad(e, key, "'%s' must be at most %lld", key, hi);
    *out = x;
    return 1;
}

static int get_string(json_t *obj, const char *key, const char **out, rt_oai_error *e)
{
    json_t *v = field(obj, key);
    if (!v)
        return 0;
    if (!json_is_string(v))
        return bad(e, key, "'%s' must be a string", key);
    *out = json_string_value(v);
    return 1;
}

/* ---- request parts ---- */

static int parse_prompt(json_t *root, int32_t n_vocab, rt_oai_request *req, rt_oai_error *e)
{
    static const char shape[] = "'prompt' must be a string, an array of token ids, or an array with one of "
                                "either";
    json_t *p = field(root, "prompt");
    if (!p)
        return bad(e, "prompt", "'prompt' is required");
    /* A batch of one is the one prompt. */
    if (json_is_array(p) && json_array_size(p) == 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        p = json_array_get(p, 0);
    if (json_is_string(p)) {
        if (json_string_length(p) == 0)
            return bad(e, "prompt", "prompt must not be empty");
        req->prompt = strdup(json_string_value(p));
        return req->prompt ? 0 : oom(e);
    }
    if (!json_is_array(p))
        return bad(e, "prompt", shape);
    size_t n = json_array_size(p);
    if (n == 0)
        return bad(e, "prompt", "prompt must not be empty");
    if (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0)))
        return bad(e, "prompt", "a batch of prompts is not supported: send one prompt per request");
    if (n > INT_MAX)
        return bad(e, "prompt", "'prompt' has too many tokens");
    int32_t *ids = malloc(n * sizeof(*ids));
    if (!ids)
        return oom(e);
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(p, i);
        if (!json_is_integer(t)) {
            free(ids);
            return bad(e, "prompt", shape);
        }
        long long id = json_integer_value(t);
        if (id < 0 || (n_vocab > 0 && id >= n_vocab) || id > INT32_MAX) {
            free(ids);
            return bad(e, "prompt", "prompt[%zu]: token id %lld is out of range [0, %ld)", i, id,
                       n_vocab > 0 ? (long)n_vocab : (long)INT32_MAX + 1);
        }
        ids[i] = (int32_t)id;
    }
    req->prompt_tokens = ids;
    req->n_prompt_tokens = (int)n;
    return 0;
}

/* Content as a string, or an array of {"type":"text","text":...} parts
 * joined with "\n" (as vLLM joins them). *out is malloc'd. */
static int parse_content(json_t *c, size_t mi, char **out, rt_oai_error *e)
{
    if (json_is_string(c)) {
        *out = strdup(json_string_value(c));
        return *out ? 0 : oom(e);
    }
    if (!json_is_array(c))
        return bad(e, param_at(e, "messages[%zu].content", mi),
                   "'messages[%zu].content' must be a string or an array of text parts", mi);
    size_t total = 1, n = json_array_size(c);
    for (size_t j = 0; j < n; j++) {
        json_t *part = json_array_get(c, j);
        if (!json_is_object(part))
            return bad(e, param_at(e, "messages[%zu].content[%zu]", mi, j),
                       "'messages[%zu].content[%zu]' must be an object", mi, j);
        json_t *type = json_object_get(part, "type");
        if (!json_is_string(type))
            return bad(e, param_at(e, "messages[%zu].content[%zu].type", mi, j),
                       "'messages[%zu].content[%zu].type' must be a string", mi, j);
        if (strcmp(json_string_value(type), "text") != 0)
            return bad(e, param_at(e, "messages[%zu].content[%zu].type", mi, j),
                       "content part type '%.40s' is not supported: only 'text' parts are",
                       json_string_value(type));
        json_t *text = json_object_get(part, "text");
        if (!json_is_string(text))
            return bad(e, param_at(e, "messages[%zu].content[%zu].text", mi, j),
                       "'messages[%zu].content[%zu].text' must be a string", mi, j);
        total += json_string_length(text) + 1;
    }
    char *s = malloc(total);
    if (!s)
        return oom(e);
    size_t o = 0;
    for (size_t j = 0; j < n; j++) {
        json_t *text = json_object_get(json_array_get(c, j), "text");
        size_t len = json_string_length(text);
        if (j > 0)
            s[o++] = '\n';
        memcpy(s + o, json_string_value(text), len);
        o += len;
    }
    s[o] = '\0';
    *out = s;
    return 0;
}

/* An assistant's tool_calls (each function's arguments parsed, as chat
 * templates read them), a tool's tool_call_id, a name. */
static int parse_tool_fields(json_t *msg, size_t i, const char *role, rt_oai_msg_extra *m, rt_oai_error *e)
{
    json_t *name = field(msg, "name"), *tcid = field(msg, "tool_call_id"), *calls = field(msg, "tool_calls");
    if (name && !json_is_string(name))
        return bad(e, param_at(e, "messages[%zu].name", i), "'messages[%zu].name' must be a string", i);
    if (name && !(m->name = strdup(json_string_value(name))))
        return oom(e);
    if (!strcmp(role, "tool")) {
        if (!tcid || !json_is_string(tcid))
            return bad(e, param_at(e, "messages[%zu].tool_call_id", i),
                       "'messages[%zu].tool_call_id' is required of a tool message, as a string", i);
        if (!(m->tool_call_id = strdup(json_string_value(tcid))))
            return oom(e);
    }
    if (!calls)
        return 0;
    if (strcmp(role, "assistant") || !json_is_array(calls))
        return bad(e, param_at(e, "messages[%zu].tool_calls", i),
                   "'messages[%zu].tool_calls' must be an array, on an assistant message", i);
    if (!(m->tool_calls = json_array()))
        return oom(e);
    for (size_t k = 0; k < json_array_size(calls); k++) {
        json_t *c = json_array_get(calls, k), *fn = json_is_object(c) ? json_object_get(c, "function") : NULL;
        json_t *id = json_is_object(c) ? json_object_get(c, "id") : NULL;
        json_t *fname = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
        json_t *args = json_is_object(fn) ? json_object_get(fn, "arguments") : NULL;
        if (!json_is_string(fname) || !json_is_string(args) || (id && !json_is_string(id)))
            return bad(
                e, param_at(e, "messages[%zu].tool_calls[%zu]", i, k),
                "'messages[%zu].tool_calls[%zu]' must be {\"id\", \"type\": \"function\", \"function\": "
                "{\"name\", \"arguments\"}} with strings",
                i, k);
        json_error_t je;
        json_t *parsed = json_loads(json_string_value(args), JSON_DECODE_ANY, &je);
        if (!parsed)
            return bad(e, param_at(e, "messages[%zu].tool_calls[%zu].function.arguments", i, k),
                       "'messages[%zu].tool_calls[%zu].function.arguments' is not JSON: %s", i, k, je.text);
        json_t *out = json_pack("{s:O?, s:s, s:{s:O, s:o}}", "id", id, "type", "function", "function", "name",
                                fname, "arguments", parsed);
        if (!out || json_array_append_new(m->tool_calls, out))
            return oom(e);
    }
    return 0;
}

static int parse_messages(json_t *root, rt_oai_request *req, rt_oai_error *e)
{
    json_t *m = field(root, "messages");
    if (!m)
        return bad(e, "messages", "'messages' is required");
    if (!json_is_array(m))
        return bad(e, "messages", "'messages' must be an array");
    size_t n = json_array_size(m);
    if (n == 0)
        return bad(e, "messages", "'messages' must not be empty");
    if (n > INT_MAX)
        return bad(e, "messages", "'messages' has too many entries");
    req->messages = calloc(n, sizeof(*req->messages));
    req->extra = calloc(n, sizeof(*req->extra));
    if (!req->messages || !req->extra)
        return oom(e);
    for (size_t i = 0; i < n; i++) {
        json_t *msg = json_array_get(m, i);
        if (!json_is_object(msg))
            return bad(e, param_at(e, "messages[%zu]", i), "'messages[%zu]' must be an object", i);

        json_t *role = field(msg, "role");
        if (!role)
            return bad(e, param_at(e, "messages[%zu].role", i), "'messages[%zu].role' is required", i);
        if (!json_is_string(role))
            return bad(e, param_at(e, "messages[%zu].role", i), "'messages[%zu].role' must be a string", i);
        const char *r = json_string_value(role);
        const char *canon;
        if (strcmp(r, "system") == 0 || strcmp(r, "developer") == 0)
            canon = "system"; /* developer is the o1-era name of the system role */
        else if (strcmp(r, "user") == 0)
            canon = "user";
        else if (strcmp(r, "assistant") == 0)
            canon = "assistant";
        else if (strcmp(r, "tool") == 0)
            canon = "tool";
        else
            return bad(e, param_at(e, "messages[%zu].role", i),
                       "'messages[%zu].role' must be one of system, user, assistant, tool, developer (got "
                       "'%.40s')",
                       i, r);

        /* Count the entry before filling it, so that dispose frees what a
         * failure leaves behind. */
        req->n_messages = (int)i + 1;
        req->messages[i].role = strdup(canon);
        if (!req->messages[i].role)
            return oom(e);
        int rc = parse_tool_fields(msg, i, req->messages[i].role, &req->extra[i], e);
        if (rc < 0)
            return rc;
        json_t *content = field(msg, "content");
        /* an assistant's turn may be its tool calls alone */
        if (!content && req->extra[i].tool_calls)
            continue;
        if (!content)
            return bad(e, param_at(e, "messages[%zu].content", i), "'messages[%zu].content' is required", i);
        rc = parse_content(content, i, &req->messages[i].content, e);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* One stop sequence into req->stop[req->n_stop]. */
static int add_stop(json_t *v, rt_oai_request *req, rt_oai_error *e)
{
    if (!json_is_string(v))
        return bad(e, "stop", "'stop' must be a string or an array of strings");
    size_t len = json_string_length(v);
    if (len == 0)
        return bad(e, "stop", "'stop' must not contain an empty string");
    if (len > RT_OAI_MAX_STOP_BYTES)
        return bad(e, "stop", "a stop sequence may be at most %d bytes, got %zu", RT_OAI_MAX_STOP_BYTES, len);
    if (!(req->stop[req->n_stop] = strdup(json_string_value(v))))
        return oom(e);
    req->n_stop++;
    return 0;
}

static int parse_stop(json_t *root, rt_oai_request *req, rt_oai_error *e)
{
    json_t *s = field(root, "stop");
    if (!s)
        return 0;
    if (json_is_string(s))
        return add_stop(s, req, e);
    if (!json_is_array(s))
        return bad(e, "stop", "'stop' must be a string or an array of strings");
    size_t n = json_array_size(s);
    if (n > RT_OAI_MAX_STOPS)
        return bad(e, "stop", "'stop' allows at most %d sequences, got %zu", RT_OAI_MAX_STOPS, n);
    for (size_t i = 0; i < n; i++) {
        int rc = add_stop(json_array_get(s, i), req, e);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int parse_sampling(json_t *root, rt_oai_request *req, rt_oai_error *e)
{
    rt_sampler_params *sp = &req->sampling;
    double d;
    long long x = 0;
    int rc;

    if ((rc = get_number(root, "temperature", 0, 2, false, &d, e)) < 0)
        return rc;
    if (rc)
        sp->temperature = (float)d;
    /* 0 keeps only the likeliest token (greedy), as the reference's range allows */
    if ((rc = get_number(root, "top_p", 0, 1, false, &d, e)) < 0)
        return rc;
    if (rc)
        sp->top_p = (float)d;
    if ((rc = get_number(root, "presence_penalty", -2, 2, false, &d, e)) < 0)
        return rc;
    if (rc)
        sp->presence_penalty = (float)d;
    if ((rc = get_number(root, "frequency_penalty", -2, 2, false, &d, e)) < 0)
        return rc;
    if (rc)
        sp->frequency_penalty = (float)d;
    if ((rc = get_number(root, "min_p", 0, 1, false, &d, e)) < 0)
        return rc;
    if (rc)
        sp->min_p = (float)d;
    /* llama.cpp takes top_k <= 0 as off, vLLM -1: both mean off here. */
    if ((rc = get_int(root, "top_k", LLONG_MIN, INT_MAX, &x, e)) < 0)
        return rc;
    if (rc)
        sp->top_k = x > 0 ? (int)x : 0;
    if ((rc = get_int(root, "seed", LLONG_MIN, LLONG_MAX, &x, e)) < 0)
        return rc;
    if (rc) {
        sp->seed = (uint64_t)x;
        req->has_seed = true;
    }
    return 0;
}

/* Chat's logprobs (a boolean) and top_logprobs (0..20, only with it). */
static int parse_logprobs(json_t *root, rt_oai_request *req, rt_oai_error *e)
{
    long long x = 0;
    int rc;
    if ((rc = get_bool(root, "logprobs", &req->logprobs, e)) < 0)
        return rc;
    if ((rc = get_int(root, "top_logprobs", 0, RT_OAI_MAX_TOP_LOGPROBS, &x, e)) < 0)
        return rc;
    if (rc && !req->logprobs)
        return bad(e, "top_logprobs", "'top_logprobs' requires 'logprobs' to be true");
    req->top_logprobs = (int)x;
    return 0;
}

/* {"token id": bias in [-100, 100], ...}, as OpenAI's logit_bias. */
static int parse_logit_bias(json_t *root, int32_t n_vocab, rt_sampler_params *sp, rt_oai_error *e)
{
    json_t *lb = field(root, "logit_bias");
    if (!lb)
        return 0;
    if (!json_is_object(lb))
        return bad(e, "logit_bias", "'logit_bias' must be an object mapping token ids to numbers");
    if (json_object_size(lb) > RT_SAMPLER_MAX_BIAS)
        return bad(e, "logit_bias", "'logit_bias' may name at most %d tokens, got %zu", RT_SAMPLER_MAX_BIAS,
                   json_object_size(lb));
    const char *key;
    json_t *v;
    json_object_foreach(lb, key, v)
    {
        /* Decimal digits only, no sign, space or leading zero: strtoll
         * alone read "05" and " +5" as 5, and two keys for one token
         * summed past the bound of 100. */
        char *end;
        errno = 0;
        long long id = strtoll(key, &end, 10);
        bool canonical = key[0] >= '0' && key[0] <= '9' && (key[0] != '0' || !key[1]);
        if (!canonical || *end || errno || id > INT32_MAX || (n_vocab > 0 && id >= n_vocab))
            return bad(e, "logit_bias", "logit_bias: '%.40s' is not a token id of this model (0 to %ld)", key,
                       n_vocab > 0 ? (long)n_vocab - 1 : (long)INT32_MAX);
        double b = json_is_number(v) ? json_number_value(v) : NAN;
        if (!(b >= -100.0 && b <= 100.0))
            return bad(e, "logit_bias", "logit_bias['%.40s'] must be a number from -100 to 100", key);
        sp->bias[sp->n_bias++] = (rt_sampler_bias){(int32_t)id, (float)b};
    }
    return 0;
}

static int unsupported(rt_oai_error *e, const char *param, const char *what)
{
    rt_oai_error_set(e, 400, invalid_request, param, "unsupported_parameter",
                     "%s is not supported by this server", what);
    return -EINVAL;
}

/* Fields OpenAI defines that this server cannot honour: each is refused
 * when it asks for something, rather than ignored (a client would read a
 * null where it asked for log probabilities, or free text where it asked
 * for JSON). Their off values pass, as SDKs send them. */
static int refuse_unsupported(json_t *root, bool chat, rt_oai_error *e)
{
    bool b = false;
    long long x = 0;
    int rc;
    if (!chat) {
        /* the legacy endpoint's logprobs (an integer, with text offsets,
         * mostly asked for with echo) is not served; chat's is */
        if (field(root, "logprobs"))
            return unsupported(e, "logprobs", "'logprobs' on /v1/completions");
        if ((rc = get_bool(root, "echo", &b, e)) < 0)
            return rc;
        if (b)
            return unsupported(e, "echo", "'echo'");
        const char *sfx = NULL;
        if ((rc = get_string(root, "suffix", &sfx, e)) < 0)
            return rc;
        if (sfx && *sfx)
            return unsupported(e, "suffix", "'suffix' (insertion)");
        if ((rc = get_int(root, "best_of", 1, 20, &x, e)) < 0)
            return rc;
        if (rc && x != 1)
            return unsupported(e, "best_of", "'best_of' other than 1");
        return 0;
    }
    /* The legacy function calling is not served (tools are): functions
     * offered with "auto" would be dropped and never called, so they are
     * refused, as vLLM refuses them. With "none" they are allowed: the
     * model answers in text, as asked. */
    json_t *l = field(root, "functions"), *c = field(root, "function_call");
    if (l && !json_is_array(l))
        return bad(e, "functions", "'functions' must be an array");
    if (c && !json_is_string(c) && !json_is_object(c))
        return bad(e, "function_call", "'function_call' must be a string or an object");
    bool none = c && json_is_string(c) && strcmp(json_string_value(c), "none") == 0;
    bool auto_ = !c || (json_is_string(c) && strcmp(json_string_value(c), "auto") == 0);
    if (!none && !auto_)
        return unsupported(e, "function_call", "a 'function_call' other than none (use tools)");
    if (!none && l && json_array_size(l) > 0)
        return unsupported(e, "functions", "function calling with 'functions' (use tools)");
    return 0;
}

/* response_format: text, json_object, or json_schema with its schema; and
 * llama.cpp's grammar. Both endpoints. */
static int parse_structured(json_t *root, rt_oai_request *req, rt_oai_error *e)
{
    json_t *rf = field(root, "response_format"), *g = field(root, "grammar");
    if (g) {
        if (!json_is_string(g))
            return bad(e, "grammar", "'grammar' must be a string (GBNF)");
        if (!(req->grammar = strdup(json_string_value(g))))
            return oom(e);
    }
    if (!rf)
        return 0;
    json_t *t = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
    if (!json_is_string(t))
        return bad(e, "response_format", "'response_format' must be an object with a string 'type'");
    const char *type = json_string_value(t);
    if (!strcmp(type, "text"))
        return 0;
    if (req->grammar)
        return bad(e, "grammar", "'grammar' and a 'response_format' other than text exclude each other");
    if (!strcmp(type, "json_object")) {
        req->json_schema = json_pack("{s:s}", "type", "object");
        return req->json_schema ? 0 : oom(e);
    }
    if (strcmp(type, "json_schema"))
        return bad(e, "response_format.type",
                   "'response_format.type' must be text, json_object or json_schema");
    json_t *js = json_object_get(rf, "json_schema");
    if (!json_is_object(js))
        return bad(e, "response_format.json_schema", "'response_format.json_schema' must be an object");
    json_t *schema = json_object_get(js, "schema"), *strict = json_object_get(js, "strict");
    /* strict true or false, the schema is enforced: OpenAI's false promises
     * no adherence, which an answer that adheres keeps */
    if (strict && !json_is_boolean(strict))
        return bad(e, "response_format.json_schema.strict",
                   "'response_format.json_schema.strict' must be a boolean");
    if (schema && !json_is_object(schema) && !json_is_boolean(schema))
        return bad(e, "response_format.json_schema.schema",
                   "'response_format.json_schema.schema' must be an object");
    req->json_schema = schema ? json_incref(schema) : json_pack("{s:s}", "type", "object");
    return req->json_schema ? 0 : oom(e);
}

/* OpenAI's rule for a function's name: 1 to 64 of a-z A-Z 0-9 _ - (and
 * the dots some clients use); the grammar that forces a call writes it. */
static bool function_name(const char *s)
{
    size_t n = strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.");
    return n > 0 && n <= 64 && s[n] == '\0';
}

/* tools, tool_choice and parallel_tool_calls (chat). */
static int parse_tools(json_t *root, rt_oai_request *req, rt_oai_error *e)
{
    json_t *l = field(root, "tools"), *c = field(root, "tool_choice");
    int rc;
    req->parallel_tool_calls = true;
    if ((rc = get_bool(root, "parallel_tool_calls", &req->parallel_tool_calls, e)) < 0)
        return rc;
    if (l && !json_is_array(l))
        return bad(e, "tools", "'tools' must be an array");
    if (c && !json_is_string(c) && !json_is_object(c))
        return bad(e, "tool_choice", "'tool_choice' must be a string or an object");
    for (size_t i = 0; l && i < json_array_size(l); i++) {
        json_t *t = json_array_get(l, i), *fn = json_is_object(t) ? json_object_get(t, "function") : NULL;
        json_t *type = json_is_object(t) ? json_object_get(t, "type") : NULL;
        json_t *name = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
        json_t *params = json_is_object(fn) ? json_object_get(fn, "parameters") : NULL;
        if (!json_is_string(type) || strcmp(json_string_value(type), "function") || !json_is_string(name) ||
            !function_name(json_string_value(name)) || (params && !json_is_object(params)))
            return bad(
                e, param_at(e, "tools[%zu]", i),
                "'tools[%zu]' must be {\"type\": \"function\", \"function\": {\"name\", \"description\", "
                "\"parameters\": {...}}}, the name 1 to 64 of a-z, A-Z, 0-9, _, - and .",
                i);
        json_t *strict = json_object_get(fn, "strict");
        if (strict && !json_is_boolean(strict))
            return bad(e, param_at(e, "tools[%zu].function.strict", i),
                       "'tools[%zu].function.strict' must be a boolean", i);
    }
    const char *choice = json_is_string(c) ? json_string_value(c) : NULL;
    if (choice && !strcmp(choice, "none"))
        req->tool_choice = RT_TOOL_NONE;
    else if (choice && !strcmp(choice, "required"))
        req->tool_choice = RT_TOOL_REQUIRED;
    else if (choice && strcmp(choice, "auto"))
        return bad(e, "tool_choice",
                   "'tool_choice' must be none, auto, required or {\"type\": \"function\", "
                   "\"function\": {\"name\"}}");
    if (json_is_object(c)) {
        json_t *fn = json_object_get(c, "function"),
               *name = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
        if (!json_is_string(name))
            return bad(e, "tool_choice", "'tool_choice.function.name' must be a string");
        req->tool_choice = RT_TOOL_NAMED;
        if (!(req->tool_name = strdup(json_string_value(name))))
            return oom(e);
        bool found = false;
        for (size_t i = 0; l && i < json_array_size(l) && !found; i++)
            found = !strcmp(
                json_string_value(json_object_get(json_object_get(json_array_get(l, i), "function"), "name")),
                req->tool_name);
        if (!found)
            return bad(e, "tool_choice",
                       "'tool_choice' names the function '%.60s', which 'tools' does not have",
                       req->tool_name);
    }
    bool have = l && json_array_size(l) > 0;
    if (!have && (req->tool_choice == RT_TOOL_REQUIRED || req->tool_choice == RT_TOOL_NAMED))
        return bad(e, "tool_choice", "'tool_choice' asks for a tool call, and 'tools' offers none");
    if (have && req->tool_choice != RT_TOOL_NONE)
        req->tools = json_incref(l);
    return 0;
}

static int parse_fields(json_t *root, bool chat, int32_t n_vocab, rt_oai_request *req, rt_oai_error *e)
{
    const char *s = NULL;
    long long x = 0;
    int rc;

    json_t *model = json_object_get(root, "model");
    if (!model || json_is_null(model))
        return bad(e, "model", "you must provide a model parameter");
    if (!json_is_string(model))
        return bad(e, "model", "'model' must be a string");
    if (json_string_length(model) == 0)
        return bad(e, "model", "'model' must not be empty");
    req->model = strdup(json_string_value(model));
    if (!req->model)
        return oom(e);

    rc = chat ? parse_messages(root, req, e) : parse_prompt(root, n_vocab, req, e);
    if (rc < 0)
        return rc;

    if ((rc = get_bool(root, "stream", &req->stream, e)) < 0)
        return rc;
    /* vLLM's extension: generate max_tokens even past end-of-text
     * (benchmarks need fixed-length outputs). */
    if ((rc = get_bool(root, "ignore_eos", &req->ignore_eos, e)) < 0)
        return rc;
    /* vLLM's chat_template_kwargs: the model's Jinja template reads them
     * all; enable_thinking is checked, as the built-in Qwen3 family reads
     * it too. */
    json_t *kw = chat ? field(root, "chat_template_kwargs") : NULL;
    if (kw) {
        if (!json_is_object(kw))
            return bad(e, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
        json_t *et = field(kw, "enable_thinking");
        if (et && !json_is_boolean(et))
            return bad(e, "chat_template_kwargs.enable_thinking",
                       "'chat_template_kwargs.enable_thinking' must be a boolean");
        req->no_thinking = et && json_is_false(et);
        req->template_kwargs = json_incref(kw);
    }
    json_t *so = field(root, "stream_options");
    if (so) {
        if (!json_is_object(so))
            return bad(e, "stream_options", "'stream_options' must be an object");
        /* OpenAI and vLLM both refuse options for a stream not asked for. */
        if (!req->stream)
            return bad(e, "stream_options", "'stream_options' is only allowed when 'stream' is true");
        json_t *iu = field(so, "include_usage");
        if (iu && !json_is_boolean(iu))
            return bad(e, "stream_options.include_usage", "'stream_options.include_usage' must be a boolean");
        req->include_usage = iu && json_is_true(iu);
    }

    /* Both names are checked, so that a wrong type in either is reported;
     * the newer name wins, as in vLLM. */
    long long mt = -1, mct = -1;
    if ((rc = get_int(root, "max_tokens", 1, INT_MAX, &mt, e)) < 0)
        return rc;
    if ((rc = get_int(root, "max_completion_tokens", 1, INT_MAX, &mct, e)) < 0)
        return rc;
    req->max_tokens = (int)(mct > 0 ? mct : mt);
    req->max_tokens_name = mct > 0 ? "max_completion_tokens" : "max_tokens";

    if ((rc = get_int(root, "n", 1, LLONG_MAX, &x, e)) < 0)
        return rc;
    if (rc && x != 1)
        return unsupported(e, "n", "'n' other than 1 (one choice a request)");

    if ((rc = parse_sampling(root, req, e)) < 0)
        return rc;
    if ((rc = parse_logit_bias(root, n_vocab, &req->sampling, e)) < 0)
        return rc;
    if ((rc = refuse_unsupported(root, chat, e)) < 0)
        return rc;
    if ((rc = parse_structured(root, req, e)) < 0)
        return rc;
    if (chat && (rc = parse_tools(root, req, e)) < 0)
        return rc;
    if (req->tools && (req->json_schema || req->grammar) && req->tool_choice != RT_TOOL_AUTO)
        return bad(e, "tool_choice", "a required tool call and a response format exclude each other");
    if (chat && (rc = parse_logprobs(root, req, e)) < 0)
        return rc;
    if ((rc = parse_stop(root, req, e)) < 0)
        return rc;

    if ((rc = get_string(root, "user", &s, e)) < 0)
        return rc;
    if (rc) {
        req->user = strdup(s);
        if (!req->user)
            return oom(e);
    }
    return 0;
}

int rt_oai_parse(const char *body, size_t len, bool chat, int32_t n_vocab, rt_oai_request *req,
                 rt_oai_error *e)
{
    rt_oai_error scratch;
    if (!e)
        e = &scratch;
    memset(e, 0, sizeof(*e));
    memset(req, 0, sizeof(*req));
    req->chat = chat;
    req->max_tokens = -1;
    rt_sampler_params_default(&req->sampling);
    /* OpenAI's defaults, whatever the sampler's own are. */
    req->sampling.temperature = 1.0f;
    req->sampling.top_p = 1.0f;
    req->sampling.top_k = 0;
    req->sampling.min_p = 0.0f;
    req->sampling.presence_penalty = 0.0f;
    req->sampling.frequency_penalty = 0.0f;

    json_error_t jerr;
    json_t *root =
        json_loadb(body ? body : "", body ? len : 0, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        if (json_error_code(&jerr) == json_error_out_of_memory)
            return oom(e);
        return bad(e, NULL, "invalid JSON: %s at line %d column %d", jerr.text, jerr.line, jerr.column);
    }
    int rc;
    if (!json_is_object(root))
        rc = bad(e, NULL, "the request body must be a JSON object");
    else
        rc = parse_fields(root, chat, n_vocab, req, e);
    json_decref(root);
    if (rc < 0) {
        rt_oai_request_dispose(req);
        req->chat = chat;
        req->max_tokens = -1;
    }
    return rc;
}

void rt_oai_request_dispose(rt_oai_request *req)
{
    if (!req)
        return;
    free(req->model);
    free(req->prompt);
    free(req->prompt_tokens);
    for (int i = 0; i < req->n_messages; i++) {
        free(req->messages[i].role);
        free(req->messages[i].content);
        if (req->extra) {
            json_decref(req->extra[i].tool_calls);
            free(req->extra[i].tool_call_id);
            free(req->extra[i].name);
        }
    }
    free(req->extra);
    free(req->messages);
    for (int i = 0; i < req->n_stop && i < RT_OAI_MAX_STOPS; i++)
        free(req->stop[i]);
    free(req->user);
    json_decref(req->template_kwargs);
    json_decref(req->tools);
    free(req->tool_name);
    json_decref(req->json_schema);
    free(req->grammar);
    memset(req, 0, sizeof(*req));
}

/* ---- encoding ----
 * Trees are built bottom-up: a child is filled before it is attached, since
 * a failed attach releases it. */

/* Adds key: v to obj, taking v's reference; a NULL v (failed allocation) or
 * a failed insert marks the build as failed. */
static void put(json_t *obj, const char *key, json_t *v, bool *ok)
{
    if (!obj || !v) {
        json_decref(v);
        *ok = false;
        return;
    }
    if (json_object_set_new(obj, key, v) < 0)
        *ok = false;
}

static void push(json_t *arr, json_t *v, bool *ok)
{
    if (!arr || !v) {
        json_decref(v);
        *ok = false;
        return;
    }
    if (json_array_append_new(arr, v) < 0)
        *ok = false;
}

/* Returns o, or NULL (releasing o) when the build failed. */
static json_t *done(json_t *o, bool ok)
{
    if (!ok || !o) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *nullable_str(const char *s)
{
    return s ? json_cstr(s) : json_null();
}

static json_t *usage_json(const rt_oai_usage *u)
{
    bool ok = true;
    json_t *o = json_object();
    put(o, "prompt_tokens", json_integer(u->prompt_tokens), &ok);
    put(o, "completion_tokens", json_integer(u->completion_tokens), &ok);
    put(o, "total_tokens", json_integer((json_int_t)u->prompt_tokens + u->completion_tokens), &ok);
    json_t *d = json_object();
    put(d, "cached_tokens", json_integer(u->cached_tokens), &ok);
    put(o, "prompt_tokens_details", d, &ok);
    return done(o, ok);
}

/* The fields every response and chunk starts with, then "choices". */
static json_t *envelope(const char *id, const char *object, long created, const char *model, json_t *choices)
{
    bool ok = true;
    json_t *o = json_object();
    put(o, "id", json_cstr(id), &ok);
    put(o, "object", json_string(object), &ok);
    put(o, "created", json_integer(created), &ok);
    put(o, "model", json_cstr(model), &ok);
    put(o, "choices", choices, &ok);
    return done(o, ok);
}

/* {"token", "logprob", "bytes"} of one token; -inf as OpenAI writes it. */
static json_t *token_lp_json(const rt_oai_token_lp *t, bool *ok)
{
    json_t *o = json_object(), *bytes = json_array();
    for (size_t i = 0; i < t->len; i++)
        push(bytes, json_integer((unsigned char)t->text[i]), ok);
    put(o, "token", json_text(t->text, t->len), ok);
    /* a log-probability is at most 0; NaN and -inf as OpenAI writes -inf */
    double v = t->logprob > -9999.0f ? (t->logprob < 0.0f ? t->logprob : 0.0) : -9999.0;
    put(o, "logprob", json_real(v), ok);
    put(o, "bytes", bytes, ok);
    return o;
}

/* One token's entry: {"token","logprob","bytes","top_logprobs":[...]}. */
static json_t *logprob_entry_json(const rt_oai_logprob *lp)
{
    bool ok = true;
    json_t *e = token_lp_json(&lp->tok, &ok), *top = json_array();
    for (int j = 0; j < lp->n_top; j++)
        push(top, token_lp_json(&lp->top[j], &ok), &ok);
    put(e, "top_logprobs", top, &ok);
    return done(e, ok);
}

/* {"content": [...], "refusal": null}: chat's logprobs for n tokens. */
static json_t *logprobs_json(const rt_oai_logprob *lp, int n)
{
    bool ok = true;
    json_t *content = json_array();
    for (int i = 0; i < n; i++)
        push(content, logprob_entry_json(&lp[i]), &ok);
    json_t *o = json_object();
    put(o, "content", content, &ok);
    put(o, "refusal", json_null(), &ok);
    return done(o, ok);
}

/* The same as text, one entry's tree at a time: a whole answer's tree took
 * ~10 KB a token with 20 alternatives (a 32k-token answer, 300 MB), its
 * text ~1.3 KB. *len gets the length; NULL on out of memory. */
static char *logprobs_text(const rt_oai_logprob *lp, int n, size_t *len)
{
    static const char head[] = "{\"content\":[", tail[] = "],\"refusal\":null}";
    size_t cap = 4096, o = sizeof(head) - 1;
    char *buf = malloc(cap);
    if (!buf)
        return NULL;
    memcpy(buf, head, o);
    for (int i = 0; i < n; i++) {
        json_t *e = logprob_entry_json(&lp[i]);
        size_t need = e ? json_dumpb(e, NULL, 0, JSON_COMPACT) : 0;
        if (need && o + need + sizeof(tail) + 1 > cap) {
            while (o + need + sizeof(tail) + 1 > cap)
                cap *= 2;
            char *b = realloc(buf, cap);
            need = b ? need : 0;
            buf = b ? b : buf;
        }
        if (!need || json_dumpb(e, buf + o + (i > 0), need, JSON_COMPACT) != need) {
            json_decref(e);
            free(buf);
            return NULL;
        }
        json_decref(e);
        if (i > 0)
            buf[o] = ',';
        o += need + (i > 0);
    }
    memcpy(buf + o, tail, sizeof(tail));
    *len = o + sizeof(tail) - 1;
    return buf;
}

/* A choice: index 0, the payload under `key`, logprobs (null when not
 * asked for), finish_reason. */
static json_t *choice_json(const char *key, json_t *payload, json_t *logprobs, const char *finish_reason)
{
    bool ok = true;
    json_t *c = json_object();
    put(c, "index", json_integer(0), &ok);
    put(c, key, payload, &ok);
    put(c, "logprobs", logprobs ? logprobs : json_null(), &ok);
    put(c, "finish_reason", nullable_str(finish_reason), &ok);
    return done(c, ok);
}

static json_t *one(json_t *v)
{
    bool ok = true;
    json_t *a = json_array();
    push(a, v, &ok);
    return done(a, ok);
}

/* [{"index", "id", "type": "function", "function": {"name", "arguments"}}] */
static json_t *calls_json(const rt_oai_tool_call *calls, int n, bool with_index)
{
    json_t *a = json_array();
    bool ok = a != NULL;
    for (int i = 0; ok && i < n; i++) {
        /* a piece of a streamed call's arguments says nothing else */
        json_t *c = calls[i].name
                        ? json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", calls[i].id, "type", "function",
                                    "function", "name", calls[i].name, "arguments", calls[i].arguments)
                        : json_pack("{s:{s:s}}", "function", "arguments", calls[i].arguments);
        if (c && with_index)
            put(c, "index", json_integer(calls[i].index), &ok);
        push(a, c, &ok);
    }
    return done(a, ok);
}

static char *dump_and_free(json_t *o)
{
    if (!o)
        return NULL;
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

char *rt_oai_response_json(const rt_oai_head *h, const char *text, size_t text_len, const char *finish_reason,
                           const rt_oai_usage *usage, const rt_oai_logprob *lp, int n_lp)
{
    const rt_oai_answer a = {.text = text, .text_len = text_len};
    return rt_oai_response_answer_json(h, &a, finish_reason, usage, lp, n_lp);
}

char *rt_oai_response_answer_json(const rt_oai_head *h, const rt_oai_answer *a, const char *finish_reason,
                                  const rt_oai_usage *usage, const rt_oai_logprob *lp, int n_lp)
{
    bool ok = true, chat = h->chat;
    const char *text = a->text;
    size_t text_len = a->text_len;
    json_t *payload;
    if (chat) {
        payload = json_object();
        put(payload, "role", json_string("assistant"), &ok);
        /* a turn of tool calls alone has content null, as OpenAI's */
        put(payload, "content", a->n_calls && !text_len ? json_null() : json_text(text, text ? text_len : 0),
            &ok);
        put(payload, "refusal", json_null(), &ok);
        if (a->reasoning)
            put(payload, "reasoning_content", json_text(a->reasoning, a->reasoning_len), &ok);
        if (a->n_calls)
            put(payload, "tool_calls", calls_json(a->calls, a->n_calls, false), &ok);
        payload = done(payload, ok);
    } else {
        payload = json_text(text, text ? text_len : 0);
    }
    json_t *choices = one(choice_json(chat ? "message" : "text", payload, NULL, finish_reason));
    json_t *o = envelope(h->id, chat ? "chat.completion" : "text_completion", h->created, h->model, choices);
    if (usage)
        put(o, "usage", usage_json(usage), &ok);
    char *js = dump_and_free(done(o, ok));
    if (!js || !h->logprobs)
        return js;
    /* The logprobs go in as text where the tree says null: the key, quotes
     * unescaped, can be nowhere else (a quote inside a string is \"). */
    static const char key[] = "\"logprobs\":null";
    char *at = strstr(js, key);
    size_t lps_len = 0;
    char *lps = at ? logprobs_text(lp, n_lp, &lps_len) : NULL;
    size_t pre = at ? (size_t)(at - js) + sizeof("\"logprobs\":") - 1 : 0, len = strlen(js);
    char *out = lps ? malloc(len - 4 + lps_len + 1) : NULL;
    if (out) {
        memcpy(out, js, pre);
        memcpy(out + pre, lps, lps_len);
        memcpy(out + pre + lps_len, js + pre + 4, len - pre - 4 + 1);
    }
    free(lps);
    free(js);
    return out;
}

char *rt_oai_chunk_sse(const rt_oai_head *st, bool first, const char *text, size_t text_len,
                       const char *finish_reason, const rt_oai_usage *usage, const rt_oai_logprob *lp,
                       int n_lp, size_t *out_len)
{
    if (out_len)
        *out_len = 0;
    bool ok = true, chat = st->chat;
    json_t *o;
    const char *object = chat ? "chat.completion.chunk" : "text_completion";
    if (!text && usage) {
        /* The usage chunk comes after the last token and has no choice. */
        o = envelope(st->id, object, st->created, st->model, json_array());
        put(o, "usage", usage_json(usage), &ok);
        o = done(o, ok);
    } else {
        json_t *payload;
        if (chat) {
            /* The first delta names the role; the last may carry no text (an
             * empty delta beside the finish_reason). */
            payload = json_object();
            if (first)
                put(payload, "role", json_string("assistant"), &ok);
            if (text || first)
                put(payload, "content", json_text(text, text ? text_len : 0), &ok);
            payload = done(payload, ok);
        } else {
            payload = json_text(text, text ? text_len : 0);
        }
        json_t *lps = st->logprobs && n_lp > 0 ? logprobs_json(lp, n_lp) : NULL;
        if (st->logprobs && n_lp > 0 && !lps)
            ok = false;
        json_t *choices = one(choice_json(chat ? "delta" : "text", payload, lps, finish_reason));
        o = envelope(st->id, object, st->created, st->model, choices);
        /* With include_usage every other chunk says "usage": null. */
        if (st->include_usage)
            put(o, "usage", json_null(), &ok);
        o = done(o, ok);
    }
    if (!o)
        return NULL;

    static const char prefix[] = "data: ", suffix[] = "\n\n";
    const size_t pre = sizeof(prefix) - 1, suf = sizeof(suffix) - 1;
    size_t n = json_dumpb(o, NULL, 0, JSON_COMPACT);
    char *sse = n ? malloc(pre + n + suf + 1) : NULL;
    if (!sse) {
        json_decref(o);
        return NULL;
    }
    memcpy(sse, prefix, pre);
    size_t got = json_dumpb(o, sse + pre, n, JSON_COMPACT);
    json_decref(o);
    if (got != n) {
        free(sse);
        return NULL;
    }
    memcpy(sse + pre + n, suffix, suf + 1);
    if (out_len)
        *out_len = pre + n + suf;
    return sse;
}

/* A chat chunk whose delta is d (taken). */
static char *delta_chunk_sse(const rt_oai_head *st, json_t *d, size_t *out_len)
{
    bool ok = true;
    json_t *choices = one(choice_json("delta", d, NULL, NULL));
    json_t *o = envelope(st->id, "chat.completion.chunk", st->created, st->model, choices);
    if (st->include_usage)
        put(o, "usage", json_null(), &ok);
    char *js = dump_and_free(done(o, ok));
    size_t n = js ? strlen(js) : 0;
    char *sse = js ? malloc(n + 9) : NULL;
    if (sse) {
        memcpy(sse, "data: ", 6);
        memcpy(sse + 6, js, n);
        memcpy(sse + 6 + n, "\n\n", 3);
    }
    free(js);
    if (out_len)
        *out_len = sse ? n + 8 : 0;
    return sse;
}

char *rt_oai_calls_chunk_sse(const rt_oai_head *st, const rt_oai_tool_call *calls, int n_calls,
                             size_t *out_len)
{
    bool ok = true;
    json_t *delta = json_object();
    put(delta, "tool_calls", calls_json(calls, n_calls, true), &ok);
    return delta_chunk_sse(st, done(delta, ok), out_len);
}

char *rt_oai_reasoning_chunk_sse(const rt_oai_head *st, const char *text, size_t len, size_t *out_len)
{
    bool ok = true;
    json_t *delta = json_object();
    put(delta, "reasoning_content", json_text(text, len), &ok);
    return delta_chunk_sse(st, done(delta, ok), out_len);
}

static json_t *model_object(const char *model, long created)
{
    bool ok = true;
    json_t *m = json_object();
    put(m, "id", json_cstr(model), &ok);
    put(m, "object", json_string("model"), &ok);
    put(m, "created", json_integer(created), &ok);
    put(m, "owned_by", json_string("infergate"), &ok);
    return done(m, ok);
}

char *rt_oai_models_json(const char *model, long created)
{
    bool ok = true;
    json_t *o = json_object();
    put(o, "object", json_string("list"), &ok);
    put(o, "data", one(model_object(model, created)), &ok);
    return dump_and_free(done(o, ok));
}

char *rt_oai_model_json(const char *model, long created)
{
    return dump_and_free(model_object(model, created));
}

char *rt_oai_error_json(const rt_oai_error *e)
{
    const char *type = e->type;
    if (!type)
        type = e->status == 429 ? "rate_limit_error" : e->status >= 500 ? "server_error" : invalid_request;
    return gw_oai_error_json(e->message, type, e->param, e->code, NULL);
}
