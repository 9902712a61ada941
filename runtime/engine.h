/* The inference engine: one model on one device behind the OpenAI API's
 * request and error objects. It loads the model with its tokenizer, its
 * chat template family and the turn-end policy; turns a request into
 * prompt tokens, sampling options and stop strings (the one prompt path);
 * runs requests on the continuous-batching scheduler (sched.h); and says
 * every refusal as an OpenAI error object (status, type, param, code,
 * message) with the Retry-After it merits. It owns no sockets: `infergate
 * worker` is an HTTP/2 host in front of it (gateway/worker/), and
 * `infergate generate` runs one prompt through it.
 *
 * Life: rt_engine_load (model, tokenizer, template: the prompt path
 * works), rt_engine_start (the scheduler's compute thread: submit works),
 * rt_engine_stop, rt_engine_free. rt_engine_new is load then start.
 *
 * Threads. One thread owns the engine (the worker's event loop; the "owner
 * thread" below) and makes every call but these: rt_engine_prepare,
 * rt_engine_build and rt_engine_req_dispose may run on any thread,
 * concurrently with each other and with the owner (but for rt_engine_free),
 * for they read only what never changes after load. Events are queued on the compute thread and
 * delivered only inside rt_engine_poll, on the owner thread: no callback
 * ever runs inside another rt_engine_* call. The wake function
 * (rt_engine_set_wake) runs on the compute thread each time an event is
 * queued, and must only arrange for rt_engine_poll to be called (libevent's
 * event_active).
 *
 * Every request rt_engine_submit takes gets exactly one final event (DONE
 * or ERROR), after which its user pointer is never used again; a refused
 * one gets none. */
#ifndef RT_ENGINE_H
#define RT_ENGINE_H

#include "runtime/engine_opts.h"
#include "runtime/model.h"
#include "runtime/openai.h"
#include "runtime/sched.h"
#include "runtime/toolcall.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct rt_engine rt_engine;

typedef struct rt_engine_opts {
    const char *model_path;
    const char *model_name; /* the id clients use in "model"; NULL: the file name without .gguf */
    rt_model_opts model;    /* device, threads, reference kernels */
    rt_sched_opts sched;    /* what rt_engine_new starts the scheduler with */
    int chat_kind;          /* an rt_chat_kind, or -1: as the model's template says */
    /* A file of Jinja to render chats through instead of the model's
     * template (chat_kind -1), or NULL. */
    const char *chat_template_path;
} rt_engine_opts;

/* The table's defaults (engine_opts.h). */
void rt_engine_opts_default(rt_engine_opts *o);
/* Sets option id to v (a value in the table's range, as rt_eopt_lookup or
 * a parse within min..max gives it). */
void rt_engine_opts_set(rt_engine_opts *o, rt_eopt id, long long v);

/* Loads the model and settles its chat template and turn-end policy. 0, or
 * a negative code with err filled ("PATH: why" for the model file, as
 * rt_model_load says it, and for a chat template file that cannot be read
 * or does not parse: -EINVAL, -ENOMEM, -ENODEV, -ENOSPC, -errno).
 *
 * Chats render through, in order: the family o->chat_kind names; the Jinja
 * file o->chat_template_path; the model's own tokenizer.chat_template (and
 * its tokenizer.chat_template.tool_use for a request with tools), rendered
 * as Hugging Face's apply_chat_template renders it (runtime/jinja); where
 * the model has none, or one that does not parse, the family its text is
 * recognised as (chat.h), ChatML failing that, with a warning. */
int rt_engine_load(const rt_engine_opts *o, rt_engine **out, char *err, size_t err_len);
/* Starts the scheduler's compute thread with so (the KV pool is allocated
 * here). 0, or -ENOMEM/-EINVAL with err filled; -EALREADY when started. */
int rt_engine_start(rt_engine *e, const rt_sched_opts *so, char *err, size_t err_len);
/* rt_engine_load, then rt_engine_start with o->sched. */
int rt_engine_new(const rt_engine_opts *o, rt_engine **out, char *err, size_t err_len);
/* Stops the compute thread: every request still open then has its final
 * event (ERROR -ECANCELED) queued for rt_engine_poll, and submit refuses
 * from now on. Idempotent. */
void rt_engine_stop(rt_engine *e);
/* Stops it, and frees it with the events still queued (their user
 * pointers are not touched). NULL is ignored. */
void rt_engine_free(rt_engine *e);

/* What never changes after load. */
const char *rt_engine_model_name(const rt_engine *e);
long rt_engine_created(const rt_engine *e); /* Unix time of the load: the model object's "created" */
const rt_model *rt_engine_model(const rt_engine *e);
const rt_tokenizer *rt_engine_tokenizer(const rt_engine *e);
/* What the operator should know about the load, a sentence each (the chat
 * template fell back, the pre-tokenizer is unknown): the i-th, from 0, or
 * NULL past the last. */
const char *rt_engine_warning(const rt_engine *e, int i);
/* "model 'NAME' (arch, L layers, ctx N) on DEVICE, K kernels, T threads; KV
 * ...; chat template ..." for the start-up line (after rt_engine_start). */
void rt_engine_describe(const rt_engine *e, char *buf, size_t len);

/* ---- the prompt path ---- */

/* A request made ready for rt_engine_submit. Fields are read-only to the
 * caller, save run.priority, run.deadline_ms and run.first_logits, which
 * may be set before submitting. */
typedef struct rt_engine_req {
    rt_oai_request q; /* the request (stream, include_usage, logprobs: what the reply repeats) */
    /* What the scheduler runs: the prompt tokens, max_tokens (the
     * endpoint's default where the request named none), the sampling (a
     * fresh seed where it named none), the stop strings (the request's,
     * and the turn end where the model does not end turns itself). */
    rt_sched_req run;
    /* A chat from a model that thinks in <think> blocks: 1 its answer may
     * open one, 2 it starts inside one (the prompt opened it): its
     * reasoning is split out with an rt_think (reasoning.h); 0: no. */
    int reasoning;
    /* private: the storage run points into */
    int32_t *prompt_;
    rt_grammar *grammar_;
    const char *stops_[RT_OAI_MAX_STOPS + 1];
    bool owns_q_;
} rt_engine_req;

/* Any thread. A request with tools (q.tools not NULL) has its answer's
 * tool calls read by an rt_tc_parser of this format (toolcall.h); with
 * tool_choice required or a named function, the grammar (run.grammar)
 * makes the answer exactly such calls. A harmony model's (gpt-oss) chats
 * are read by one with or without tools: it splits out the reasoning. */
rt_tc_format rt_engine_tool_format(const rt_engine *e);

/* Any thread. Parses an OpenAI request body (chat: /v1/chat/completions,
 * else /v1/completions) and makes it ready to run at priority prio before
 * deadline_ms (epoch milliseconds; 0: none). 0; or with *err filled:
 * -ETIMEDOUT the deadline has passed (504), -EINVAL a bad request (400,
 * naming the field; a prompt that encodes to nothing or too much; a
 * grammar, a response_format schema or a tool's parameters that do not
 * compile or use a JSON Schema keyword not enforced, named), -ENOENT
 * another model (404 model_not_found), -ENOMEM (503; 500 while parsing).
 * req must be disposed whatever the outcome; rt_engine_retry_after says
 * the Retry-After of a refusal. */
int rt_engine_prepare(rt_engine *e, const char *body, size_t len, bool chat, rt_priority prio,
                      int64_t deadline_ms, rt_engine_req *req, rt_oai_error *err);
/* Any thread. The same from a request the caller filled in (q->model is
 * not checked): q is borrowed, and must outlive req. */
int rt_engine_build(rt_engine *e, const rt_oai_request *q, rt_engine_req *req, rt_oai_error *err);
void rt_engine_req_dispose(rt_engine_req *req);

/* ---- admission, running, events (owner thread) ---- */

/* Before a body is prepared: whether a request of priority prio (of
 * tenant, with its weight: NULL and 0 for none, as rt_sched_req's) may
 * still come in, so that one turned away costs no parse. 0: it is counted
 * as queued (rt_engine_stats) until rt_engine_release. -ETIMEDOUT:
 * deadline_ms has passed (504); -EAGAIN: the queue is full and the tenant
 * may not push another's request out (429; rt_sched_room). *err and
 * *retry_after_s (seconds for Retry-After, 0: none) say so. */
int rt_engine_admit(rt_engine *e, rt_priority prio, int64_t deadline_ms, const char *tenant, double weight,
                    rt_oai_error *err, int *retry_after_s);
void rt_engine_release(rt_engine *e, rt_priority prio);

/* Queues req (which may be disposed on return). 0 and *id; or with *err and
 * *retry_after_s filled: -EAGAIN queue full (429), -E2BIG prompt plus
 * max_tokens past the context (400 context_length_exceeded), -ENOSPC more
 * than the KV pool holds (503 kv_cache_too_small), -ENOMEM, -ESHUTDOWN,
 * -EINVAL (503). */
int rt_engine_submit(rt_engine *e, const rt_engine_req *req, void *user, uint64_t *id, rt_oai_error *err,
                     int *retry_after_s);
/* Asks request id to stop; its final event still comes. Unknown ids are
 * ignored. */
void rt_engine_cancel(rt_engine *e, uint64_t id);
/* Pauses request id (hold) or lets it go on (rt_sched_hold): a slow reader
 * pushes back on its sequence. 0, or -ENOMEM. */
int rt_engine_hold(rt_engine *e, uint64_t id, bool hold);

typedef struct rt_engine_event {
    void *user; /* as given to rt_engine_submit */
    /* As the scheduler gave it: text NUL-terminated, logprobs NULL for an
     * end-of-generation token (no part of the answer). */
    rt_sched_event ev;
    /* ev.kind RT_EV_ERROR: the error object to answer with, and the
     * Retry-After it merits (0: none). A request whose text could not be
     * queued (out of memory on the compute thread) gets no more events
     * but this final one, an error, so no answer has a hole. */
    const rt_oai_error *error;
    int retry_after_s;
    /* The device failed beyond recovery: every step fails from now on, and
     * only a new process gets a working one. */
    bool device_lost;
} rt_engine_event;

typedef void (*rt_engine_event_fn)(void *arg, const rt_engine_event *ev);

/* fn(arg) runs on the compute thread whenever an event is queued; set it
 * before the first submit. */
void rt_engine_set_wake(rt_engine *e, void (*fn)(void *arg), void *arg);
/* Delivers the queued events to fn, in order, having waited up to
 * timeout_ms (-1: for ever; 0: not at all) for the first. Returns how many. */
int rt_engine_poll(rt_engine *e, int timeout_ms, rt_engine_event_fn fn, void *arg);
/* As rt_engine_poll, but at most max (> 0) of them; the rest stay queued,
 * in order, for the next call. An event loop takes its events in such
 * slices so that its sockets and timers get their turn between them: the
 * compute thread can queue events faster than a loop formats them. */
int rt_engine_poll_max(rt_engine *e, int timeout_ms, int max, rt_engine_event_fn fn, void *arg);

/* The scheduler's figures, requests admitted and not yet submitted
 * counted as queued; zeros before start and after stop. */
void rt_engine_stats(rt_engine *e, rt_sched_stats *st);
/* The scheduler's figures per tenant (rt_sched_tenants); 0 before start
 * and after stop. */
int rt_engine_tenants(rt_engine *e, rt_sched_tenant_stats *out, int max);
/* An id for the response object ("chatcmpl-..." or "cmpl-...", unique
 * across workers and restarts) and its "created". */
void rt_engine_response_id(rt_engine *e, bool chat, char *id, size_t id_len, long *created);

/* The Retry-After seconds an error merits: for a full queue or a passing
 * failure (429; a 503 but a KV pool too small for the request), the time
 * until a request of priority prio would likely find room (1 to 60); else
 * 0. For a refusal of rt_engine_prepare. */
int rt_engine_retry_after(rt_engine *e, const rt_oai_error *err, rt_priority prio);
/* The 503 every out-of-memory refusal is. */
void rt_engine_error_oom(rt_oai_error *err);

#endif
