/* The prompt path (see engine.h): an OpenAI request to prompt tokens (the
 * chat template, special tokens, BOS), sampling options and stop strings.
 * Runs on any thread: it reads only what the load settled. */
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

/* The variables a chat's Jinja template reads from the client (messages,
 * chat_template_kwargs' entries), as Hugging Face's apply_chat_template
 * passes them; their strings are plain text in the prompt. NULL when out
 * of memory. */
static json_t *client_vars(const rt_oai_request *q)
{
    json_t *vars = q->template_kwargs ? json_deep_copy(q->template_kwargs) : json_object();
    json_t *msgs = json_array();
    bool ok = vars && msgs && json_object_set(vars, "messages", msgs) == 0;
    for (int i = 0; ok && i < q->n_messages; i++) {
        json_t *m = json_object();
        ok = m && json_array_append_new(msgs, m) == 0 &&
             json_object_set_new(m, "role", json_string(q->messages[i].role)) == 0 &&
             json_object_set_new(m, "content",
                                 q->messages[i].content ? json_string(q->messages[i].content) : json_null()) == 0;
    }
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
    json_t *cv = client_vars(q), *mv = model_vars(e);
    char why[256];
    rt_jinja_output out;
    const rt_jinja *t = e->tmpl ? e->tmpl : e->tmpl_tools;
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

/* A chat's messages rendered by the template: the text, and the spans of
 * it the messages' content went to. 0, or -ENOMEM / -EINVAL with *err. */
static int render_chat(const rt_engine *e, const rt_oai_request *q, char **text, rt_text_span **plain,
                       int *n_plain, rt_oai_error *err)
{
    if (e->tmpl || e->tmpl_tools)
        return render_jinja(e, q, text, plain, n_plain, err);
    rt_chat_msg *msgs = calloc((size_t)q->n_messages, sizeof(*msgs));
    char why[256];
    if (!msgs) {
        rt_engine_error_oom(err);
        return -ENOMEM;
    }
    for (int i = 0; i < q->n_messages; i++)
        msgs[i] = (rt_chat_msg){q->messages[i].role, q->messages[i].content};
    const rt_chat_opts co = {.no_thinking = q->no_thinking};
    int rc = rt_chat_render(e->chat_kind, msgs, q->n_messages, e->bos_text[0] ? e->bos_text : NULL, &co, text,
                            plain, n_plain, why, sizeof(why));
    free(msgs);
    if (rc == -ENOMEM)
        rt_engine_error_oom(err);
    else if (rc)
        rt_oai_error_set(err, 400, "invalid_request_error", "messages", NULL, "%s", why);
    return rc;
}

/* Prompt tokens for a request; malloc'd, count in *n. NULL with *err
 * filled and *n < 0: -ENOMEM, -EINVAL. */
static int32_t *prompt_tokens(const rt_engine *e, const rt_oai_request *q, int *n, rt_oai_error *err)
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

/* req->q parsed or filled: the rest of req. */
static int make_run(rt_engine *e, rt_engine_req *req, rt_oai_error *err)
{
    const rt_oai_request *q = &req->q;
    int n;
    if (!(req->prompt_ = prompt_tokens(e, q, &n, err)))
        return n;
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
    *req = (rt_engine_req){0};
}
