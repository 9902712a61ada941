/* The runtime engine without sockets: a small synthetic model (byte-level
 * SentencePiece vocabulary, no chat template: chats render as ChatML, whose
 * <|im_end|> no token of it ends, so it is a stop string).
 *
 * The prompt path: completion and chat bodies become the tokens, stops,
 * max_tokens and seeds the worker and `infergate generate` run, and a
 * caller-filled request (rt_engine_build) the same tokens as its body.
 * Running: a request's events come to the end in order, text and counts
 * agreeing. Refusals: each maps to its OpenAI error object (status, type,
 * param, code) and Retry-After. The option table says what the scheduler's
 * defaults, the worker's flags and the config say. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "gateway/base/clock.h"
#include "runtime/chat.h"
#include "runtime/engine.h"
#include "runtime/model_gen.h"
#include "runtime/tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CTX 256
#define KV_TOKENS 192 /* below the context: a long enough request is refused as too big for the pool */

static char dir[64], path[96];
static rt_engine *engine;

static int setup(void **state)
{
    snprintf(dir, sizeof(dir), "/tmp/infergate-test-engine-XXXXXX");
    if (!mkdtemp(dir))
        return -1;
    snprintf(path, sizeof(path), "%s/tiny.gguf", dir);
    rt_gen_params p;
    rt_gen_params_default(&p);
    p.dim = 64;
    p.layers = 2;
    p.heads = 4;
    p.kv_heads = 2;
    p.ffn = 128;
    p.vocab = 512;
    p.ctx = CTX;
    p.seed = 7;
    char err[512];
    if (rt_model_gen(&p, path, err, sizeof(err))) {
        fprintf(stderr, "gen: %s\n", err);
        return -1;
    }
    rt_engine_opts o;
    rt_engine_opts_default(&o);
    o.model_path = path;
    o.model.n_threads = 1;
    if (rt_engine_load(&o, &engine, err, sizeof(err))) {
        fprintf(stderr, "load: %s\n", err);
        return -1;
    }
    rt_sched_opts so = o.sched;
    so.kv_bytes = KV_TOKENS * rt_model_kv_bytes_per_token(rt_engine_model(engine), KN_TYPE_F16);
    so.max_seqs = 1;
    so.max_queue = 1;
    if (rt_engine_start(engine, &so, err, sizeof(err))) {
        fprintf(stderr, "start: %s\n", err);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    rt_engine_free(engine);
    unlink(path);
    rmdir(dir);
    return 0;
}

/* ---- helpers ---- */

static int prepare(const char *body, bool chat, rt_engine_req *req, rt_oai_error *e)
{
    return rt_engine_prepare(engine, body, strlen(body), chat, RT_PRIO_INTERACTIVE, 0, req, e);
}

/* The tokens decoded, with no leading-space stripping (NUL-terminated). */
static void decode(const rt_engine_req *req, char *buf, size_t cap)
{
    int n =
        rt_tokenizer_decode(rt_engine_tokenizer(engine), req->run.prompt, req->run.n_prompt, false, buf, cap);
    assert_true(n >= 0 && (size_t)n < cap);
}

typedef struct seen {
    int n_text, n_final;
    char text[4096];
    size_t text_len;
    rt_sched_event last;
    rt_oai_error error;
    int retry_after_s;
} seen;

static void on_event(void *arg, const rt_engine_event *e)
{
    seen *s = arg;
    assert_int_equal(s->n_final, 0); /* nothing after the final event */
    if (e->ev.kind == RT_EV_TEXT)
        s->n_text++;
    else
        s->n_final++;
    assert_true(s->text_len + e->ev.text_len < sizeof(s->text));
    memcpy(s->text + s->text_len, e->ev.text, e->ev.text_len);
    s->text_len += e->ev.text_len;
    s->last = e->ev;
    assert_true((e->ev.kind == RT_EV_ERROR) == (e->error != NULL));
    if (e->error) {
        s->error = *e->error;
        s->error.param = NULL; /* may point into the event's storage */
        s->retry_after_s = e->retry_after_s;
    }
}

/* Polls until the request's final event (60 s at most). */
static void run_to_end(seen *s)
{
    double until = gw_mono_s() + 60;
    while (s->n_final == 0 && gw_mono_s() < until)
        rt_engine_poll(engine, 1000, on_event, s);
    assert_int_equal(s->n_final, 1);
}

static void assert_error(const rt_oai_error *e, int status, const char *type, const char *param,
                         const char *code)
{
    assert_int_equal(e->status, status);
    assert_string_equal(e->type, type);
    if (param)
        assert_string_equal(e->param, param);
    else
        assert_null(e->param);
    if (code)
        assert_string_equal(e->code, code);
    else
        assert_null(e->code);
    assert_true(e->message[0] != '\0');
}

/* ---- the prompt path ---- */

static void test_completion_prompt(void **state)
{
    rt_engine_req req;
    rt_oai_error e;
    char text[512];
    assert_int_equal(prepare("{\"model\":\"tiny\",\"prompt\":\"hello world\"}", false, &req, &e), 0);
    /* BOS (the tokenizer adds it by default) and then the text */
    assert_int_equal(req.run.prompt[0], rt_tokenizer_bos(rt_engine_tokenizer(engine)));
    decode(&req, text, sizeof(text));
    assert_non_null(strstr(text, "hello world"));
    assert_int_equal(req.run.max_tokens, 16); /* /v1/completions' default */
    assert_int_equal(req.run.n_stops, 0);     /* no turn end outside chats */
    assert_false(req.q.stream);
    uint64_t seed = req.run.sampling.seed;
    int n = req.run.n_prompt;
    int32_t first[64];
    assert_true(n <= 64);
    memcpy(first, req.run.prompt, (size_t)n * sizeof(int32_t));
    rt_engine_req_dispose(&req);

    /* A prompt that writes BOS itself gets no second one; special tokens
     * written in a completion's prompt are read as tokens. */
    assert_int_equal(prepare("{\"model\":\"tiny\",\"prompt\":\"<s>hello world\",\"seed\":5,\"max_tokens\":3,"
                             "\"stop\":[\"ab\",\"cd\"],\"stream\":true}",
                             false, &req, &e),
                     0);
    assert_int_equal(req.run.n_prompt, n);
    assert_memory_equal(req.run.prompt, first, (size_t)n * sizeof(int32_t));
    assert_int_equal(req.run.sampling.seed, 5);
    assert_int_equal(req.run.max_tokens, 3);
    assert_int_equal(req.run.n_stops, 2);
    assert_string_equal(req.run.stops[0], "ab");
    assert_string_equal(req.run.stops[1], "cd");
    assert_true(req.q.stream);
    rt_engine_req_dispose(&req);

    /* Without a seed, each request draws anew. */
    assert_int_equal(prepare("{\"model\":\"tiny\",\"prompt\":\"hello world\"}", false, &req, &e), 0);
    assert_int_not_equal(req.run.sampling.seed, seed);
    rt_engine_req_dispose(&req);

    /* Token ids go as they are. */
    assert_int_equal(prepare("{\"model\":\"tiny\",\"prompt\":[1,300,17]}", false, &req, &e), 0);
    assert_int_equal(req.run.n_prompt, 3);
    assert_int_equal(req.run.prompt[1], 300);
    rt_engine_req_dispose(&req);
}

static void test_chat_prompt(void **state)
{
    rt_engine_req req;
    rt_oai_error e;
    char text[512];
    assert_int_equal(
        prepare("{\"model\":\"tiny\",\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
                "{\"role\":\"user\",\"content\":\"hi\"}],\"stop\":\"xy\"}",
                true, &req, &e),
        0);
    decode(&req, text, sizeof(text));
    /* the ChatML fallback, ending with the assistant turn's opening */
    assert_non_null(strstr(text, "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                                 "<|im_start|>assistant\n"));
    assert_int_equal(req.run.max_tokens, 0); /* chat: up to the context */
    /* the request's stop, then the turn end no token of this vocabulary ends */
    assert_int_equal(req.run.n_stops, 2);
    assert_string_equal(req.run.stops[0], "xy");
    assert_string_equal(req.run.stops[1], "<|im_end|>");
    rt_engine_req_dispose(&req);

    /* ignore_eos asks for the length: no implicit stop */
    assert_int_equal(prepare("{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                             "\"ignore_eos\":true}",
                             true, &req, &e),
                     0);
    assert_int_equal(req.run.n_stops, 0);
    assert_true(req.run.ignore_eos);
    rt_engine_req_dispose(&req);
}

/* `infergate generate` fills the request in itself: the same tokens. */
static void test_build_matches_prepare(void **state)
{
    rt_engine_req a, b;
    rt_oai_error e;
    assert_int_equal(
        prepare("{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"hey there\"}],"
                "\"max_tokens\":4,\"seed\":9}",
                true, &a, &e),
        0);
    rt_oai_message msg = {"user", "hey there"};
    rt_oai_request q = {.chat = true, .messages = &msg, .n_messages = 1, .max_tokens = 4, .has_seed = true};
    rt_sampler_params_default(&q.sampling);
    q.sampling.seed = 9;
    assert_int_equal(rt_engine_build(engine, &q, &b, &e), 0);
    assert_int_equal(a.run.n_prompt, b.run.n_prompt);
    assert_memory_equal(a.run.prompt, b.run.prompt, (size_t)a.run.n_prompt * sizeof(int32_t));
    assert_int_equal(a.run.n_stops, b.run.n_stops);
    assert_int_equal(a.run.max_tokens, b.run.max_tokens);
    assert_int_equal(a.run.sampling.seed, b.run.sampling.seed);
    rt_engine_req_dispose(&a);
    rt_engine_req_dispose(&b);
}

/* ---- running ---- */

/* Prepares body and submits it; *n_prompt its prompt tokens. */
static uint64_t submit_body(const char *body, seen *s, int *n_prompt)
{
    rt_engine_req req;
    rt_oai_error e;
    uint64_t id;
    int retry;
    assert_int_equal(prepare(body, false, &req, &e), 0);
    assert_int_equal(rt_engine_submit(engine, &req, s, &id, &e, &retry), 0);
    *n_prompt = req.run.n_prompt;
    rt_engine_req_dispose(&req); /* the engine keeps what it needs */
    return id;
}

static void test_run_to_the_end(void **state)
{
    static const char body[] = "{\"model\":\"tiny\",\"prompt\":\"once "
                               "upon\",\"max_tokens\":8,\"temperature\":0,\"ignore_eos\":true}";
    seen s = {0}, again = {0};
    int n_prompt;
    uint64_t id = submit_body(body, &s, &n_prompt);
    run_to_end(&s);
    assert_int_equal(s.last.kind, RT_EV_DONE);
    assert_string_equal(s.last.finish_reason, "length");
    assert_int_equal(s.last.completion_tokens, 8);
    assert_int_equal(s.last.prompt_tokens, n_prompt);
    assert_int_equal(s.n_text, 7); /* one event a token, the last one final */
    assert_int_equal(s.last.id, id);

    /* Greedy: the same request gives the same text. */
    submit_body(body, &again, &n_prompt);
    run_to_end(&again);
    assert_int_equal(again.text_len, s.text_len);
    assert_memory_equal(again.text, s.text, s.text_len);

    /* Taken in slices (rt_engine_poll_max): at most 3 events a call, the
     * rest kept in order for the next. */
    seen sliced = {0};
    submit_body(body, &sliced, &n_prompt);
    double until = gw_mono_s() + 60;
    int calls = 0;
    while (sliced.n_final == 0 && gw_mono_s() < until) {
        int n = rt_engine_poll_max(engine, 1000, 3, on_event, &sliced);
        assert_true(n >= 0 && n <= 3);
        calls += n > 0;
    }
    assert_int_equal(sliced.n_final, 1);
    assert_true(calls >= 3); /* 8 events */
    assert_int_equal(sliced.text_len, s.text_len);
    assert_memory_equal(sliced.text, s.text, s.text_len);
}

/* A cancelled request still has its final event. */
static void test_cancel(void **state)
{
    seen s = {0};
    int n_prompt;
    rt_engine_cancel(
        engine, submit_body("{\"model\":\"tiny\",\"prompt\":\"abc\",\"max_tokens\":100,\"ignore_eos\":true}",
                            &s, &n_prompt));
    run_to_end(&s);
    assert_true(s.last.kind == RT_EV_ERROR || s.last.kind == RT_EV_DONE);
    if (s.last.kind == RT_EV_ERROR)
        assert_int_equal(s.last.error, -ECANCELED);
}

/* ---- refusals as OpenAI errors ---- */

static void test_bad_requests(void **state)
{
    rt_engine_req req;
    rt_oai_error e;
    assert_int_equal(prepare("{\"model\":", false, &req, &e), -EINVAL);
    assert_error(&e, 400, "invalid_request_error", NULL, NULL);
    rt_engine_req_dispose(&req);

    assert_int_equal(
        prepare("{\"model\":\"tiny\",\"prompt\":\"x\",\"temperature\":\"hot\"}", false, &req, &e), -EINVAL);
    assert_error(&e, 400, "invalid_request_error", "temperature", NULL);
    rt_engine_req_dispose(&req);

    assert_int_equal(prepare("{\"model\":\"tiny\"}", true, &req, &e), -EINVAL);
    assert_error(&e, 400, "invalid_request_error", "messages", NULL);
    rt_engine_req_dispose(&req);

    assert_int_equal(prepare("{\"model\":\"other\",\"prompt\":\"x\"}", false, &req, &e), -ENOENT);
    assert_error(&e, 404, "invalid_request_error", "model", "model_not_found");
    assert_non_null(strstr(e.message, "this worker serves 'tiny'"));
    rt_engine_req_dispose(&req);

    /* A deadline gone by: no parse */
    assert_int_equal(rt_engine_prepare(engine, "{", 1, false, RT_PRIO_BATCH, 1, &req, &e), -ETIMEDOUT);
    assert_error(&e, 504, "timeout_error", NULL, "deadline_exceeded");
    assert_int_equal(rt_engine_retry_after(engine, &e, RT_PRIO_BATCH), 0);
    rt_engine_req_dispose(&req);
}

static void submit_refused(const char *body, bool chat, int rc, rt_oai_error *e, int *retry)
{
    rt_engine_req req;
    assert_int_equal(prepare(body, chat, &req, e), 0);
    seen s = {0};
    uint64_t id;
    assert_int_equal(rt_engine_submit(engine, &req, &s, &id, e, retry), rc);
    rt_engine_req_dispose(&req);
    assert_int_equal(rt_engine_poll(engine, 100, on_event, &s), 0); /* a refused request has no events */
}

static void test_submit_refusals(void **state)
{
    rt_oai_error e;
    int retry;
    char body[2048];
    /* max_tokens past the context: it is the field to blame */
    submit_refused("{\"model\":\"tiny\",\"prompt\":\"hi\",\"max_tokens\":1000}", false, -E2BIG, &e, &retry);
    assert_error(&e, 400, "invalid_request_error", "max_tokens", "context_length_exceeded");
    assert_non_null(strstr(e.message, "maximum context length is 256 tokens"));
    assert_int_equal(retry, 0);

    /* a prompt of the whole context, max_tokens not sent: the prompt is */
    int n = snprintf(body, sizeof(body), "{\"model\":\"tiny\",\"prompt\":[1");
    for (int i = 1; i < CTX; i++)
        n += snprintf(body + n, sizeof(body) - (size_t)n, ",300");
    snprintf(body + n, sizeof(body) - (size_t)n, "]}");
    submit_refused(body, false, -E2BIG, &e, &retry);
    assert_error(&e, 400, "invalid_request_error", "prompt", "context_length_exceeded");
    assert_non_null(strstr(e.message, "the default max_tokens (not sent)"));

    /* within the context, past the KV pool: not worth a retry */
    submit_refused("{\"model\":\"tiny\",\"prompt\":\"hi\",\"max_tokens\":230}", false, -ENOSPC, &e, &retry);
    assert_error(&e, 503, "server_error", NULL, "kv_cache_too_small");
    assert_non_null(strstr(e.message, "holds 192 tokens"));
    assert_int_equal(retry, 0);
}

static void test_admission(void **state)
{
    rt_oai_error e;
    int retry;
    /* max_seqs 1 and max_queue 1: room for two */
    assert_int_equal(rt_engine_admit(engine, RT_PRIO_INTERACTIVE, 0, NULL, 0, &e, &retry), 0);
    assert_int_equal(rt_engine_admit(engine, RT_PRIO_INTERACTIVE, 0, NULL, 0, &e, &retry), 0);
    rt_sched_stats st;
    rt_engine_stats(engine, &st);
    assert_int_equal(st.queued, 2); /* admitted, not yet submitted, count as queued */
    assert_int_equal(rt_engine_admit(engine, RT_PRIO_INTERACTIVE, 0, NULL, 0, &e, &retry), -EAGAIN);
    assert_error(&e, 429, "rate_limit_error", NULL, "queue_full");
    assert_in_range(retry, 1, 60);
    assert_int_equal(rt_engine_retry_after(engine, &e, RT_PRIO_INTERACTIVE), retry);
    rt_engine_release(engine, RT_PRIO_INTERACTIVE);
    rt_engine_release(engine, RT_PRIO_INTERACTIVE);
    rt_engine_stats(engine, &st);
    assert_int_equal(st.queued, 0);

    assert_int_equal(rt_engine_admit(engine, RT_PRIO_BATCH, gw_epoch_ms() - 1000, NULL, 0, &e, &retry),
                     -ETIMEDOUT);
    assert_error(&e, 504, "timeout_error", NULL, "deadline_exceeded");
    assert_int_equal(retry, 0);

    rt_engine_error_oom(&e);
    assert_error(&e, 503, "server_error", NULL, NULL);
    assert_in_range(rt_engine_retry_after(engine, &e, RT_PRIO_BATCH), 1, 60);
}

/* An error the scheduler gives comes as the error object to answer with. */
static void test_event_errors(void **state)
{
    rt_oai_message msg = {"user", "hi"};
    rt_oai_request q = {.chat = true, .messages = &msg, .n_messages = 1, .max_tokens = 4};
    rt_sampler_params_default(&q.sampling);
    rt_engine_req req;
    rt_oai_error e;
    assert_int_equal(rt_engine_build(engine, &q, &req, &e), 0);
    req.run.deadline_ms = gw_epoch_ms() - 1; /* past before its first token */
    seen s = {0};
    uint64_t id;
    int retry;
    assert_int_equal(rt_engine_submit(engine, &req, &s, &id, &e, &retry), 0);
    rt_engine_req_dispose(&req);
    run_to_end(&s);
    assert_int_equal(s.last.kind, RT_EV_ERROR);
    assert_int_equal(s.last.error, -ETIMEDOUT);
    assert_error(&s.error, 504, "timeout_error", NULL, "deadline_exceeded");
    assert_int_equal(s.retry_after_s, 0);
}

/* ---- what the engine says of itself ---- */

static void test_identity(void **state)
{
    assert_string_equal(rt_engine_model_name(engine), "tiny");
    assert_null(rt_engine_warning(engine, 0)); /* no template: the documented fallback, no warning */
    char id1[40], id2[40], what[1024];
    long created;
    rt_engine_response_id(engine, true, id1, sizeof(id1), &created);
    rt_engine_response_id(engine, false, id2, sizeof(id2), &created);
    assert_true(!strncmp(id1, "chatcmpl-", 9) && !strncmp(id2, "cmpl-", 5));
    assert_string_not_equal(id1 + 9, id2 + 5);
    rt_engine_describe(engine, what, sizeof(what));
    assert_non_null(strstr(what, "model 'tiny' (llama, 2 layers, ctx 256)"));
    assert_non_null(
        strstr(what, "chat template chatml (none in file: fallback), turns end at the text <|im_end|>"));
}

static void test_option_table(void **state)
{
    char buf[512];
    assert_string_equal(rt_eopt_range(RT_EOPT_KV_TYPE, buf, sizeof(buf)), "f16 or q8_0");
    assert_string_equal(rt_eopt_range(RT_EOPT_MAX_SEQS, buf, sizeof(buf)), "1 to 4096");
    assert_string_equal(rt_eopt_range(RT_EOPT_CHAT_TEMPLATE, buf, sizeof(buf)), "one of " RT_CHAT_KIND_NAMES);
    assert_int_equal(rt_eopt_lookup(RT_EOPT_KV_TYPE, "q8_0"), 1);
    assert_int_equal(rt_eopt_lookup(RT_EOPT_KV_TYPE, "q4_0"), -1);
    assert_int_equal(rt_eopt_lookup(RT_EOPT_CHAT_TEMPLATE, "llama3"), RT_CHAT_LLAMA3);

    rt_sched_opts so;
    rt_sched_opts_default(&so);
    assert_int_equal(so.max_seqs, rt_eopt_defs[RT_EOPT_MAX_SEQS].dflt);
    assert_int_equal(so.kv_bytes, (size_t)rt_eopt_defs[RT_EOPT_KV_CACHE_MB].dflt << 20);
    assert_int_equal(so.batch_max_wait_ms, rt_eopt_defs[RT_EOPT_BATCH_MAX_WAIT_MS].dflt);
    assert_int_equal(so.prompt_max_wait_ms, 10000);
    assert_int_equal(so.prompt_max_wait_ms, rt_eopt_defs[RT_EOPT_PROMPT_MAX_WAIT_MS].dflt);

    rt_engine_opts o;
    rt_engine_opts_default(&o);
    assert_int_equal(o.chat_kind, -1);
    rt_engine_opts_set(&o, RT_EOPT_KV_TYPE, 1);
    rt_engine_opts_set(&o, RT_EOPT_KV_CACHE_MB, 64);
    rt_engine_opts_set(&o, RT_EOPT_THREADS, 3);
    rt_engine_opts_set(&o, RT_EOPT_PROMPT_MAX_WAIT_MS, 0);
    assert_int_equal(o.sched.kv_type, KN_TYPE_Q8_0);
    assert_int_equal(o.sched.kv_bytes, 64u << 20);
    assert_int_equal(o.model.n_threads, 3);
    assert_int_equal(o.sched.prompt_max_wait_ms, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_completion_prompt),
        cmocka_unit_test(test_chat_prompt),
        cmocka_unit_test(test_build_matches_prepare),
        cmocka_unit_test(test_run_to_the_end),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_submit_refusals),
        cmocka_unit_test(test_admission),
        cmocka_unit_test(test_event_errors),
        cmocka_unit_test(test_identity),
        cmocka_unit_test(test_option_table),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
