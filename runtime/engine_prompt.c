/* The prompt path (see engine.h): an OpenAI request to prompt tokens (the
 * chat template, special tokens, BOS), sampling options and stop strings.
 * Runs on any thread: it reads only what the load settled. */
#define _GNU_SOURCE /* asprintf */
#include "runtime/engine_internal.h"

#include "runtime/tokenizer.h"

#include <jansson.h>

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* Encodes src, special tokens matched outside the plain spans only, in one
 * pass where the tokens fit len + 16 (a token covers a byte or more, but
 * for BOS and the leading space; a vocabulary without "▁" spends three
 * byte tokens on each space and takes a second pass). malloc'd; count in
 * *n, or NULL with *n < 0 on an encoder error. */
static int32_t *encode(const rt_tokenizer *tok, const char *src, size_t len, bool bos,
                       const rt_text_span *plain, int n_plain, int *n)
{
    size_t cap = len + 16;
    if (cap > INT_MAX) {
        *n = -E2BIG;
        return NULL;
    }
    int32_t *t = malloc(cap * sizeof(int32_t));
    int count = t ? rt_tokenizer_encode_spans(tok, src, len, bos, plain, n_plain, t, (int)cap) : -ENOMEM;
    if (count > (int)cap) {
        int32_t *bigger = realloc(t, (size_t)count * sizeof(int32_t));
        int again =
            bigger ? rt_tokenizer_encode_spans(tok, src, len, bos, plain, n_plain, bigger, count) : -ENOMEM;
        t = bigger ? bigger : t;
        count = again == count ? count : again < 0 ? again : -EIO;
    }
    *n = count;
    if (count <= 0) {
        free(t);
        return NULL;
    }
    return t;
}

/* One message as Hugging Face's apply_chat_template gives it to the
 * template: role, content (null for an assistant's turn of tool calls
 * alone), and tool_calls, tool_call_id and name where it has them.
 * Harmony's (gpt-oss's) published template asks whether a text is `in`
 * such a turn's content, which fails on null, in jinja2 as here; the
 * SDKs send null for that turn, so an agent's second request was a 400.
 * For that template the content is "" instead, which it reads as none. */
static json_t *message_var(const rt_oai_request *q, int i, bool empty_not_null)
{
    const rt_oai_message *m = &q->messages[i];
    const rt_oai_msg_extra *x = q->extra ? &q->extra[i] : NULL;
    json_t *o = json_pack("{s:s, s:o}", "role", m->role, "content",
                          m->content ? json_string(m->content)
                          : empty_not_null && x && x->tool_calls ? json_string("")
                                                                 : json_null());
    bool ok = o != NULL;
    if (ok && x && x->tool_calls)
        ok = json_object_set(o, "tool_calls", x->tool_calls) == 0;
    if (ok && x && x->tool_call_id)
        ok = json_object_set_new(o, "tool_call_id", json_string(x->tool_call_id)) == 0;
    if (ok && x && x->name)
        ok = json_object_set_new(o, "name", json_string(x->name)) == 0;
    if (!ok)
        json_decref(o);
    return ok ? o : NULL;
}

/* The variables a chat's Jinja template reads from the client (messages,
 * tools, chat_template_kwargs' entries), as Hugging Face's
 * apply_chat_template passes them; their strings are plain text in the
 * prompt. NULL when out of memory. */
static json_t *client_vars(const rt_engine *e, const rt_oai_request *q)
{
    const bool harmony = e->tc_format == RT_TC_HARMONY;
    json_t *vars = q->template_kwargs ? json_deep_copy(q->template_kwargs) : json_object();
    json_t *msgs = json_array();
    bool ok = vars && msgs && json_object_set(vars, "messages", msgs) == 0;
    if (ok && q->tools)
        ok = json_object_set(vars, "tools", q->tools) == 0;
    for (int i = 0; ok && i < q->n_messages; i++)
        ok = json_array_append_new(msgs, message_var(q, i, harmony)) == 0;
    json_decref(msgs);
    if (!ok) {
        json_decref(vars);
        return NULL;
    }
    return vars;
}

/* The variables the template reads from the model: bos_token, eos_token
 * (the texts that read back as those tokens, else empty: the encoder adds
 * BOS by id) and add_generation_prompt. */
static json_t *model_vars(const rt_engine *e)
{
    return json_pack("{s:s, s:s, s:b}", "bos_token", e->bos_text, "eos_token", e->eos_text,
                     "add_generation_prompt", 1);
}

/* A chat rendered by the model's Jinja template (the tool_use one for a
 * request with tools, where the model has one). As render_chat. */
static int render_jinja(const rt_engine *e, const rt_oai_request *q, char **text, rt_text_span **plain,
                        int *n_plain, rt_oai_error *err)
{
    json_t *cv = client_vars(e, q), *mv = model_vars(e);
    char why[256];
    rt_jinja_output out;
    const rt_jinja *t = (q->tools && e->tmpl_tools) || !e->tmpl ? e->tmpl_tools : e->tmpl;
    /* A render costs some microseconds; the bounds stop a template that
     * loops or grows without end long before it costs a second. */
    rt_jinja_input in = {.plain = cv, .trusted = mv,
                         .limits = {.max_output = 64u << 20, .max_memory = 512u << 20, .max_steps = 20000000}};
    int rc = cv && mv ? rt_jinja_render(t, &in, &out, why, sizeof(why)) : -ENOMEM;
    json_decref(cv);
    json_decref(mv);
    if (rc == -ENOMEM) {
        rt_engine_error_oom(err);
        return rc;
    }
    if (rc) {
        rt_oai_error_set(err, 400, "invalid_request_error", "messages", NULL, "the chat template failed: %s", why);
        return -EINVAL;
    }
    *text = out.text;
    *plain = out.plain;
    *n_plain = out.n_plain;
    return 0;
}

/* A message's text for a family renderer, which knows no tools: a tool's
 * answer is the user's <tool_response>, an assistant's calls follow its
 * text as <tool_call>s, as Qwen2.5's template writes both. malloc'd in
 * *own where it differs from content; false when out of memory. */
static bool family_text(const rt_oai_request *q, int i, const char **role, const char **text, char **own)
{
    const rt_oai_msg_extra *x = q->extra ? &q->extra[i] : NULL;
    const char *content = q->messages[i].content ? q->messages[i].content : "";
    *role = q->messages[i].role;
    *text = content;
    *own = NULL;
    if (!strcmp(*role, "tool")) {
        *role = "user";
        if (asprintf(own, "<tool_response>\n%s\n</tool_response>", content) < 0)
            return (*own = NULL), false;
        *text = *own;
        return true;
    }
    if (!x || !x->tool_calls)
        return true;
    char *acc = strdup(content);
    for (size_t k = 0; acc && k < json_array_size(x->tool_calls); k++) {
        json_t *fn = json_object_get(json_array_get(x->tool_calls, k), "function");
        char *args = json_dumps(json_object_get(fn, "arguments"), JSON_COMPACT | JSON_ENCODE_ANY),
             *next = NULL;
        if (args && asprintf(&next, "%s%s<tool_call>\n{\"name\": \"%s\", \"arguments\": %s}\n</tool_call>",
                             acc, *acc ? "\n" : "", json_string_value(json_object_get(fn, "name")), args) < 0)
            next = NULL;
        free(args);
        free(acc);
        acc = next;
    }
    *text = *own = acc;
    return acc != NULL;
}

/* A chat's messages rendered by the template: the text, and the spans of
 * it the messages' content went to. 0, or -ENOMEM / -EINVAL with *err. */
static int render_chat(const rt_engine *e, const rt_oai_request *q, char **text, rt_text_span **plain,
                       int *n_plain, rt_oai_error *err)
{
    if (e->tmpl || e->tmpl_tools)
        return render_jinja(e, q, text, plain, n_plain, err);
    rt_chat_msg *msgs = calloc((size_t)q->n_messages, sizeof(*msgs));
    char **own = calloc((size_t)q->n_messages, sizeof(*own));
    char why[256];
    int rc = msgs && own ? 0 : -ENOMEM;
    for (int i = 0; !rc && i < q->n_messages; i++)
        if (!family_text(q, i, &msgs[i].role, &msgs[i].content, &own[i]))
            rc = -ENOMEM;
    const rt_chat_opts co = {.no_thinking = q->no_thinking};
    if (!rc)
        rc = rt_chat_render(e->chat_kind, msgs, q->n_messages, e->bos_text[0] ? e->bos_text : NULL, &co, text,
                            plain, n_plain, why, sizeof(why));
    for (int i = 0; own && i < q->n_messages; i++)
        free(own[i]);
    free(own);
    free(msgs);
    if (rc == -ENOMEM)
        rt_engine_error_oom(err);
    else if (rc)
        rt_oai_error_set(err, 400, "invalid_request_error", "messages", NULL, "%s", why);
    return rc;
}

/* Prompt tokens for a request; malloc'd, count in *n; *think_open: the
 * chat's prompt leaves the answer inside a <think> block. NULL with *err
 * filled and *n < 0: -ENOMEM, -EINVAL. */
static int32_t *prompt_tokens(const rt_engine *e, const rt_oai_request *q, int *n, bool *think_open,
                              rt_oai_error *err)
{
    if (q->prompt_tokens) {
        int32_t *t = malloc((size_t)q->n_prompt_tokens * sizeof(int32_t));
        if (!t) {
            rt_engine_error_oom(err);
            *n = -ENOMEM;
            return NULL;
        }
        memcpy(t, q->prompt_tokens, (size_t)q->n_prompt_tokens * sizeof(int32_t));
        *n = q->n_prompt_tokens;
        return t;
    }
    /* A completion's prompt is the client's whole prompt, special tokens
     * written in it included (as llama.cpp's server and vLLM read it); a
     * chat's messages are text, within the template's special tokens, so a
     * message cannot open a turn of another role. */
    char *text = NULL;
    const char *src = q->prompt;
    rt_text_span *plain = NULL;
    int n_plain = 0;
    if (q->chat) {
        if ((*n = render_chat(e, q, &text, &plain, &n_plain, err)))
            return NULL;
        src = text;
        *think_open = rt_think_open(text, strlen(text));
    }
    /* A prompt (or template) that writes BOS itself gets no second one. */
    bool bos = rt_tokenizer_add_bos_default(e->tok);
    if (e->bos_text[0] && !strncmp(src, e->bos_text, strlen(e->bos_text)))
        bos = false;
    int32_t *t = encode(e->tok, src, strlen(src), bos, plain, n_plain, n);
    free(plain);
    free(text);
    const char *param = q->chat ? "messages" : "prompt";
    if (*n == 0) {
        rt_oai_error_set(err, 400, "invalid_request_error", param, NULL, "the prompt encodes to no tokens");
        *n = -EINVAL;
    } else if (*n == -ENOMEM) {
        rt_engine_error_oom(err);
    } else if (!t) { /* beyond what the encoder takes (~700 MB), past any sane --max-body */
        rt_oai_error_set(err, 400, "invalid_request_error", param, NULL, "the prompt is too long to encode");
        *n = -EINVAL;
    }
    return t;
}

int rt_engine_grammar(rt_engine *e, const char *src, size_t len, rt_grammar **out, char *err, size_t err_len)
{
    pthread_mutex_lock(&e->gmu);
    int oldest = 0;
    for (int i = 0; i < RT_ENGINE_GRAMMARS; i++) {
        if (e->grammars[i].gbnf && strlen(e->grammars[i].gbnf) == len &&
            !memcmp(e->grammars[i].gbnf, src, len)) {
            e->grammars[i].used = ++e->grammar_clock;
            *out = rt_grammar_ref(e->grammars[i].g);
            pthread_mutex_unlock(&e->gmu);
            return 0;
        }
        if (e->grammars[i].used < e->grammars[oldest].used)
            oldest = i;
    }
    pthread_mutex_unlock(&e->gmu);
    /* compiled unlocked: another thread may compile the same meanwhile */
    int rc = rt_grammar_new(src, len, e->gvocab, out, err, err_len);
    char *copy = rc ? NULL : strndup(src, len);
    if (!copy)
        return rc;
    pthread_mutex_lock(&e->gmu);
    free(e->grammars[oldest].gbnf);
    rt_grammar_free(e->grammars[oldest].g);
    e->grammars[oldest].gbnf = copy;
    e->grammars[oldest].g = rt_grammar_ref(*out);
    e->grammars[oldest].used = ++e->grammar_clock;
    pthread_mutex_unlock(&e->gmu);
    return 0;
}

void rt_engine_grammars_free(rt_engine *e)
{
    for (int i = 0; i < RT_ENGINE_GRAMMARS; i++) {
        free(e->grammars[i].gbnf);
        rt_grammar_free(e->grammars[i].g);
    }
}

/* The grammar the answer is held to: the request's GBNF, its
 * response_format's schema, or the tool calls tool_choice asks for. 0 (and
 * req->grammar_ NULL where none), or -EINVAL / -ENOMEM with *err. */
static int make_grammar(rt_engine *e, rt_engine_req *req, rt_oai_error *err)
{
    const rt_oai_request *q = &req->q;
    char *gbnf = NULL, why[320];
    size_t len = 0;
    const char *param;
    int rc = 0;
    why[0] = '\0';
    if (q->grammar) {
        param = "grammar";
    } else if (q->json_schema) {
        param = "response_format.json_schema.schema";
        if (!(rc = rt_schema_gbnf(q->json_schema, "", &gbnf, &len, why, sizeof(why)))) {
            char *g = realloc(gbnf, len + sizeof("root ::= value\n"));
            rc = g ? 0 : -ENOMEM;
            if (g) {
                gbnf = g;
                memcpy(gbnf + len, "root ::= value\n", sizeof("root ::= value\n"));
                len += sizeof("root ::= value\n") - 1;
            }
        }
    } else if (q->tools && (q->tool_choice == RT_TOOL_REQUIRED || q->tool_choice == RT_TOOL_NAMED)) {
        param = "tools";
        rc = rt_tc_grammar(e->tc_format, q->tools, q->tool_choice == RT_TOOL_NAMED ? q->tool_name : NULL,
                           q->parallel_tool_calls, &gbnf, &len, why, sizeof(why));
    } else {
        return 0;
    }
    if (!rc)
        rc = rt_engine_grammar(e, q->grammar ? q->grammar : gbnf, q->grammar ? strlen(q->grammar) : len,
                               &req->grammar_, why, sizeof(why));
    free(gbnf);
    if (rc == -ENOMEM)
        rt_engine_error_oom(err);
    else if (rc)
        rt_oai_error_set(err, 400, "invalid_request_error", param, NULL, "'%s': %s", param, why);
    return rc;
}

/* req->q parsed or filled: the rest of req. */
static int make_run(rt_engine *e, rt_engine_req *req, rt_oai_error *err)
{
    const rt_oai_request *q = &req->q;
    int n, rc;
    if ((rc = make_grammar(e, req, err)))
        return rc;
    bool think_open = false;
    if (!(req->prompt_ = prompt_tokens(e, q, &n, &think_open, err)))
        return n;
    req->reasoning = q->chat && e->thinks ? (think_open ? 2 : 1) : 0;
    rt_sampler_params sp = q->sampling;
    /* Without a seed every request draws anew, as OpenAI's do: a seed of 0
     * for all of them gave the same "random" completion every time. */
    if (!q->has_seed)
        sp.seed = atomic_fetch_add(&e->next_seed, 1);
    int n_stops = 0;
    for (int i = 0; i < q->n_stop; i++)
        req->stops_[n_stops++] = q->stop[i];
    if (q->chat && e->turn_stop && !q->ignore_eos) /* ignore_eos: the length asked for */
        req->stops_[n_stops++] = e->turn_stop;
    req->run = (rt_sched_req){
        .prompt = req->prompt_,
        .n_prompt = n,
        .max_tokens = q->max_tokens > 0 ? q->max_tokens : (q->chat ? 0 : 16),
        .sampling = sp,
        .stops = req->stops_,
        .n_stops = n_stops,
        .ignore_eos = q->ignore_eos,
        .logprobs = q->logprobs,
        .top_logprobs = q->top_logprobs,
        .grammar = req->grammar_,
    };
    return 0;
}

int rt_engine_prepare(rt_engine *e, const char *body, size_t len, bool chat, rt_priority prio,
                      int64_t deadline_ms, rt_engine_req *req, rt_oai_error *err)
{
    *req = (rt_engine_req){0};
    /* It may have waited behind long prompts: no parse for a lost cause. */
    if (rt_engine_deadline_passed(deadline_ms)) {
        rt_engine_error_deadline(err);
        return -ETIMEDOUT;
    }
    int rc = rt_oai_parse(body, len, chat, rt_model_hparams(e->model)->n_vocab, &req->q, err);
    if (rc)
        return rc;
    req->owns_q_ = true;
    if (strcmp(req->q.model, e->model_name) != 0) {
        rt_oai_error_set(err, 404, "invalid_request_error", "model", "model_not_found",
                         "the model '%s' does not exist; this worker serves '%s'", req->q.model,
                         e->model_name);
        return -ENOENT;
    }
    if ((rc = make_run(e, req, err)))
        return rc;
    req->run.priority = prio;
    req->run.deadline_ms = deadline_ms;
    return 0;
}

int rt_engine_build(rt_engine *e, const rt_oai_request *q, rt_engine_req *req, rt_oai_error *err)
{
    *req = (rt_engine_req){.q = *q};
    return make_run(e, req, err);
}

void rt_engine_req_dispose(rt_engine_req *req)
{
    if (req->owns_q_)
        rt_oai_request_dispose(&req->q);
    free(req->prompt_);
    rt_grammar_free(req->grammar_);
    *req = (rt_engine_req){0};
}
