/* The HTTP/2 host of the runtime engine (see worker.h): transport only.
 * The event loop owns the sockets; the engine's compute thread owns the
 * model, and its events reach the loop through rt_engine_poll, run when the
 * compute thread makes the notify event active. */
#include "gateway/worker/worker.h"

#include "gateway/base/clock.h"
#include "gateway/base/offload.h"
#include "gateway/base/prefix.h"
#include "gateway/base/replay_wire.h"
#include "gateway/worker/logprobs.h"
#include "runtime/reasoning.h"

#include <errno.h>
#include <event2/event.h>
#include <inttypes.h>
#include <event2/thread.h>
#include <jansson.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct wreq wreq;

/* One request's state on the loop side. Freed when both its final engine
 * event has been handled and its stream has closed. */
struct wreq {
    gw_worker *w;
    uint32_t prompt_bytes; /* its prompt-prefix chunks' bytes (gateway/base/prefix.h) */
    gw_http_stream *stream; /* NULL once closed */
    uint64_t id;
    bool preparing; /* with the offload thread (wprep): not yet submitted */
    bool submitted, final_seen, begun, sent_first;
    bool chat, stream_mode, include_usage, logprobs;
    bool held;   /* its sequence is paused (rt_engine_hold) until its reader catches up */
    bool mute;   /* a resumed run's tokens go through the parsers: nothing is sent */
    /* Token replay (the gateway's, gateway/front/replay.c): each event
     * carries its token's id in a comment line, which the gateway reads
     * and strips; the response's x-infergate-replay says the id, created
     * and seed a resumed run needs (or "off" and why not). */
    bool replay_info;
    const char *replay_off; /* asked for, but this request cannot be resumed: why */
    uint64_t seed;
    bool end_due; /* the stream ends once the backlog has gone */
    /* Events that came while the stream was full: the engine runs ahead
     * of this loop, so a hold takes effect some events late. */
    char *backlog;
    size_t backlog_len, backlog_cap;
    gw_lp_list lp; /* log-probabilities not yet sent */
    int lp_ready;  /* the last event's: lp's entries of tokens 1..lp_ready may go */
    char cid[40];
    long created;
    char *text; /* non-streamed: the whole completion */
    size_t text_len, text_cap;
    /* A chat with tools: its answer's tool calls read out of the text, and
     * how many of them have gone out (streamed) */
    rt_tc_parser *tc;
    rt_think *think; /* a thinking model's chat: its reasoning split out */
    int calls_sent;
    bool head_sent;   /* the call being written: its head has gone out... */
    size_t args_sent; /* ...and this much of its arguments */
};

struct gw_worker {
    rt_engine *engine;
    struct event_base *base;
    struct event *notify, *sigterm, *sigint, *drain_timer;
    struct event *more; /* zero timer: the engine's next slice of events, after the sockets' turn */
    gw_http_server *http;
    gw_offload *prep; /* the engine prepares requests there, off the loop */
    double drain_deadline;
    int drain_grace_s;
    bool device_lost; /* a sticky device error: the process ends shortly */
    /* The prompts' chain hashes (gateway/base/prefix.h) whose KV the
     * prefix cache most likely still holds: reported in the stats, for the
     * gateway's cache-aware choice of worker. */
    gw_prefix_set prefixes;
    double bytes_per_token; /* of those chunks per prompt token, averaged; 0: none seen */
};

/* Prefix hashes a worker reports at most (a stats answer of ~10 KB). */
#define PREFIX_SET_CAP 512

static const gw_http_header json_headers[] = {{"content-type", "application/json"}};

/* body (taken), with one more header when `extra` is given. */
static void respond_json_with(gw_http_stream *s, int status, char *body, const gw_http_header *extra)
{
    if (!body) {
        gw_http_reset(s);
        return;
    }
    gw_http_header h[2] = {json_headers[0], extra ? *extra : json_headers[0]};
    /* A response that cannot be queued (out of memory) must not leave the
     * stream open without one. */
    if (gw_http_respond(s, status, h, extra ? 2 : 1, body, strlen(body)))
        gw_http_reset(s);
    free(body);
}

static void respond_json(gw_http_stream *s, int status, char *body)
{
    respond_json_with(s, status, body, NULL);
}

/* An error response, with one more header when `extra` is given. */
static void respond_error_with(gw_http_stream *s, const rt_oai_error *e, const gw_http_header *extra)
{
    char *body = rt_oai_error_json(e);
    if (!body) {
        gw_http_reset(s);
        return;
    }
    gw_http_header h[2] = {{"content-type", "application/json"}};
    if (extra)
        h[1] = *extra;
    if (gw_http_respond(s, e->status, h, extra ? 2 : 1, body, strlen(body)))
        gw_http_reset(s);
    free(body);
}

/* retry_after_s > 0 adds Retry-After. */
static void respond_error_after(gw_http_stream *s, const rt_oai_error *e, int retry_after_s)
{
    char ra[16];
    snprintf(ra, sizeof(ra), "%d", retry_after_s);
    const gw_http_header h = {"retry-after", ra};
    respond_error_with(s, e, retry_after_s > 0 ? &h : NULL);
}

static void respond_error(gw_http_stream *s, const rt_oai_error *e)
{
    respond_error_with(s, e, NULL);
}

static void wreq_maybe_free(wreq *r)
{
    if (r->stream || r->preparing || (r->submitted && !r->final_seen))
        return;
    free(r->text);
    free(r->backlog);
    gw_lp_free(&r->lp);
    rt_tc_parser_free(r->tc);
    rt_think_free(r->think);
    free(r);
}

/* Gives up on a request whose answer cannot go out. */
static void abandon(wreq *r)
{
    gw_http_reset(r->stream);
    rt_engine_cancel(r->w->engine, r->id);
}

/* ---- answers: the engine's events as JSON or SSE ---- */

/* Appends p[0..n) to a growing buffer, NUL-terminated. */
static bool buf_append(char **buf, size_t *len, size_t *cap, const char *p, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap * 2 : 256;
        while (c < *len + n + 1)
            c *= 2;
        char *np = realloc(*buf, c);
        if (!np)
            return false;
        *buf = np;
        *cap = c;
    }
    memcpy(*buf + *len, p, n);
    *len += n;
    (*buf)[*len] = '\0';
    return true;
}

static bool append_text(wreq *r, const char *p, size_t n)
{
    return buf_append(&r->text, &r->text_len, &r->text_cap, p, n);
}

/* The prompt's tokens as counted here, in a header: the gateway charges
 * them to the tenant's tokens per minute, stream or not, usage asked for
 * or not. */
#define PROMPT_TOKENS_HEADER "x-infergate-prompt-tokens"

static bool begin_stream(wreq *r, int prompt_tokens)
{
    if (r->begun)
        return true;
    char n[16], replay[96];
    snprintf(n, sizeof(n), "%d", prompt_tokens);
    if (r->replay_off)
        snprintf(replay, sizeof(replay), "off %s", r->replay_off);
    else
        snprintf(replay, sizeof(replay), "%s %ld %llu", r->cid, r->created, (unsigned long long)r->seed);
    gw_http_header h[] = {{"content-type", "text/event-stream"},
                          {"cache-control", "no-cache"},
                          {PROMPT_TOKENS_HEADER, n},
                          {"x-infergate-replay", replay}};
    if (gw_http_begin(r->stream, 200, h, r->replay_info || r->replay_off ? 4 : 3))
        return false;
    r->begun = true;
    return true;
}

/* A slow reader pushes back: its sequence pauses once its stream holds
 * half the per-stream bound, and goes on when the stream has drained to
 * that (on_writable), so the bound is never reached (the events already on
 * their way fit in the other half). Before, such a reader lost its stream
 * at the bound, which its gateway took for this worker failing. */
static void push_back(wreq *r)
{
    if (!r->held && r->submitted && !r->final_seen && gw_http_full(r->stream) &&
        !rt_engine_hold(r->w->engine, r->id, true))
        r->held = true;
}

/* Streamed output: to the stream while it is not full, else kept in
 * order in the backlog (and the sequence held) until on_writable. False
 * when it cannot be (no memory; the stream's bound passed). */
static bool out_write(wreq *r, const char *p, size_t n)
{
    if (!r->backlog_len && !gw_http_full(r->stream)) {
        if (gw_http_write(r->stream, p, n))
            return false;
        push_back(r);
        return true;
    }
    if (!buf_append(&r->backlog, &r->backlog_len, &r->backlog_cap, p, n))
        return false;
    push_back(r);
    return true;
}

/* Ends the stream, now or once the backlog has gone. */
static void out_end(wreq *r)
{
    if (r->backlog_len)
        r->end_due = true;
    else if (gw_http_end(r->stream))
        gw_http_reset(r->stream);
}

/* The stream has room again: the backlog goes while it fits, then the end
 * if due; with nothing left behind, the sequence goes on. */
static void on_writable(void *ud, gw_http_stream *s, void *stream_ud)
{
    wreq *r = stream_ud;
    if (!r)
        return;
    size_t off = 0;
    while (off < r->backlog_len && !gw_http_full(s)) {
        size_t n = r->backlog_len - off < 16384 ? r->backlog_len - off : 16384;
        if (gw_http_write(s, r->backlog + off, n)) {
            abandon(r);
            return;
        }
        off += n;
    }
    memmove(r->backlog, r->backlog + off, r->backlog_len - off);
    r->backlog_len -= off;
    if (r->backlog_len)
        return;
    if (r->end_due) {
        r->end_due = false;
        out_end(r);
    }
    if (r->held && !gw_http_full(s) && !rt_engine_hold(r->w->engine, r->id, false))
        r->held = false;
}

/* Writes one SSE event (NULL: out of memory); a reader whose stream still
 * passes the per-stream bound (push_back) loses it, and so its request. */
static bool write_sse(wreq *r, char *ev, size_t len)
{
    if (r->mute) {
        bool made = ev != NULL;
        free(ev);
        return made;
    }
    if (!ev || !out_write(r, ev, len)) {
        free(ev);
        abandon(r);
        return false;
    }
    free(ev);
    return true;
}

static rt_oai_head head_of(const wreq *r)
{
    return (rt_oai_head){r->chat,   r->include_usage, r->logprobs, r->cid, rt_engine_model_name(r->w->engine),
                         r->created};
}

/* A chunk with text, or the last one, takes the log-probabilities of the
 * tokens whose text has begun to go out and not yet sent. */
static bool write_chunk(wreq *r, bool first, const char *text, size_t len, const char *finish,
                        const rt_oai_usage *usage)
{
    size_t n = 0;
    const rt_oai_head h = head_of(r);
    bool oom = false;
    const int n_lp = r->logprobs && !usage && (len || finish) ? gw_lp_ready(&r->lp, r->lp_ready) : 0;
    rt_oai_logprob *lp = gw_lp_render(&r->lp, n_lp, rt_engine_tokenizer(r->w->engine), &oom);
    char *ev = oom ? NULL : rt_oai_chunk_sse(&h, first, text, len, finish, usage, lp, lp ? n_lp : 0, &n);
    if (lp)
        gw_lp_drop(&r->lp, n_lp);
    free(lp);
    return write_sse(r, ev, n);
}

/* A stream already begun ends with an error event, which OpenAI's SDKs
 * read and raise (the gateway writes one too when a worker fails
 * mid-stream); where even that cannot be written, the stream is reset. */
static void fail_stream(wreq *r, const rt_oai_error *e)
{
    char *j = rt_oai_error_json(e);
    size_t n = j ? strlen(j) + sizeof("data: \n\n") - 1 : 0;
    char *ev = j ? malloc(n + 1) : NULL;
    if (ev)
        snprintf(ev, n + 1, "data: %s\n\n", j);
    free(j);
    if (write_sse(r, ev, n))
        out_end(r);
}

/* A call's id: the response's unique part and the call's place. */
static void call_id(const wreq *r, int index, char id[RT_OAI_CALL_ID_MAX])
{
    const char *uniq = strchr(r->cid, '-') ? strchr(r->cid, '-') + 1 : r->cid;
    snprintf(id, RT_OAI_CALL_ID_MAX, "call_%.24s%d", uniq, index);
}

/* The tool calls from the parser's from-th on, as the response says them
 * (malloc'd; NULL with *n 0 when none or out of memory). */
static rt_oai_tool_call *calls_of(wreq *r, int from, int *n)
{
    *n = rt_tc_n_calls(r->tc) - from;
    rt_oai_tool_call *c = *n > 0 ? calloc((size_t)*n, sizeof(*c)) : NULL;
    if (!c)
        *n = 0;
    for (int i = 0; i < *n; i++) {
        const rt_tc_call *tc = rt_tc_call_at(r->tc, from + i);
        c[i] = (rt_oai_tool_call){.index = from + i, .name = tc->name, .arguments = tc->arguments};
        call_id(r, from + i, c[i].id);
    }
    return c;
}

/* A chat with tools answers "tool_calls" where it made any. */
static const char *finish_of(const wreq *r, const char *finish)
{
    return r->tc && rt_tc_n_calls(r->tc) > 0 && finish && !strcmp(finish, "stop") ? "tool_calls" : finish;
}

/* An answer's next text split as the response says it: the reasoning (a
 * thinking model's, or harmony's analysis channel), the content (with
 * tools: what the tool-call parser lets out) and, in the parser, the
 * calls. false when out of memory. */
static bool split(wreq *r, const char *text, size_t len, bool final, const char **reasoning,
                  size_t *reasoning_len, const char **content, size_t *content_len)
{
    *reasoning = "";
    *reasoning_len = 0;
    *content = text ? text : "";
    *content_len = len;
    if (r->think &&
        rt_think_feed(r->think, *content, len, final, reasoning, reasoning_len, content, content_len))
        return false;
    if (r->tc && rt_tc_feed(r->tc, *content, *content_len, final, content, content_len))
        return false;
    if (r->tc && !*reasoning_len) /* harmony's analysis channel */
        rt_tc_reasoning(r->tc, reasoning, reasoning_len);
    return true;
}

/* How much of s[0..n) is whole UTF-8 characters: a piece of a call's
 * arguments goes out as a JSON string. */
static size_t utf8_whole(const char *s, size_t n)
{
    size_t i = n, back = 0;
    while (i > 0 && back < 4 && ((unsigned char)s[i - 1] & 0xC0) == 0x80)
        i--, back++;
    if (i == 0)
        return n;
    unsigned char lead = (unsigned char)s[i - 1];
    size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    return need > back + 1 ? i - 1 : n;
}

/* One tool-call chunk: c whole or its head, or (name NULL) a piece of its
 * arguments. */
static bool write_call(wreq *r, int index, const char *name, const char *args, size_t args_len)
{
    char *piece = strndup(args, args_len);
    rt_oai_tool_call c = {.index = index, .name = name, .arguments = piece};
    call_id(r, index, c.id);
    const rt_oai_head h = head_of(r);
    size_t len = 0;
    char *ev = piece ? rt_oai_calls_chunk_sse(&h, &c, 1, &len) : NULL;
    free(piece);
    return write_sse(r, ev, len);
}

/* Streamed tool calls, as OpenAI streams them: a call's head (id, name)
 * as soon as its name is known, then its arguments in pieces as they
 * come, the rest when it ends; a call that ends before its head went out
 * goes whole. */
static bool write_calls(wreq *r)
{
    if (!r->tc)
        return true;
    for (; r->calls_sent < rt_tc_n_calls(r->tc); r->calls_sent++, r->head_sent = false, r->args_sent = 0) {
        const rt_tc_call *c = rt_tc_call_at(r->tc, r->calls_sent);
        size_t n = strlen(c->arguments);
        if (!r->head_sent) {
            if (!write_call(r, r->calls_sent, c->name, c->arguments, n))
                return false;
        } else if (n > r->args_sent &&
                   !write_call(r, r->calls_sent, NULL, c->arguments + r->args_sent, n - r->args_sent)) {
            return false;
        }
    }
    const char *name, *args;
    size_t len;
    if (!rt_tc_pending(r->tc, &name, &args, &len))
        return true;
    len = utf8_whole(args, len);
    if (!r->head_sent) {
        if (!write_call(r, r->calls_sent, name, "", 0))
            return false;
        r->head_sent = true;
    }
    if (len > r->args_sent) {
        if (!write_call(r, r->calls_sent, NULL, args + r->args_sent, len - r->args_sent))
            return false;
        r->args_sent = len;
    }
    return true;
}

/* Token replay: the event's token, as a comment line that opens the
 * event its text goes out in (or one of its own when no text goes out):
 * the gateway that reads it has had exactly the text of the tokens it
 * read. "end": the answer is complete, nothing is left to resume. */
static bool tag_token(wreq *r, int32_t token, bool alone, bool end)
{
    char line[GW_REPLAY_TAG_MAX];
    if (!r->replay_info || out_write(r, line, gw_replay_tag_format(line, token, end, alone)))
        return true;
    abandon(r);
    return false;
}

static void handle_stream_event(wreq *r, const rt_sched_event *ev)
{
    if (!begin_stream(r, ev->prompt_tokens)) {
        abandon(r);
        return;
    }
    /* A chat stream opens with the role alone, as OpenAI's does: the Node
     * SDK's stream helper builds a choice from its first chunk and then
     * appends that chunk's logprobs again. */
    if (r->chat && !r->sent_first) {
        if (!write_chunk(r, true, "", 0, NULL, NULL))
            return;
        r->sent_first = true;
    }
    const char *text, *reasoning;
    size_t len, reasoning_len, n = 0;
    if (!split(r, ev->text, ev->text_len, ev->kind == RT_EV_DONE, &reasoning, &reasoning_len, &text, &len)) {
        abandon(r);
        return;
    }
    /* the tag opens the token's first event: the gateway that has read it
     * has had the text of every token before */
    if (!tag_token(r, ev->token, !len && !reasoning_len, ev->kind == RT_EV_DONE))
        return;
    const rt_oai_head h = head_of(r);
    char *rc = reasoning_len ? rt_oai_reasoning_chunk_sse(&h, reasoning, reasoning_len, &n) : NULL;
    if (reasoning_len && !write_sse(r, rc, n))
        return;
    if (len && !write_chunk(r, false, text, len, NULL, NULL))
        return;
    if (!write_calls(r) || ev->kind != RT_EV_DONE)
        return;
    rt_oai_usage u = {ev->prompt_tokens, ev->completion_tokens, ev->cached_tokens};
    /* No text: chat's last delta is {}, a completion's text "", as OpenAI's */
    if (!write_chunk(r, false, NULL, 0, finish_of(r, ev->finish_reason), NULL))
        return;
    if (r->include_usage && !write_chunk(r, false, NULL, 0, NULL, &u))
        return;
    static const char done[] = "data: [DONE]\n\n";
    if (out_write(r, done, sizeof(done) - 1))
        out_end(r);
    else
        abandon(r);
}

static void handle_whole_event(wreq *r, const rt_sched_event *ev)
{
    if (ev->text_len && !append_text(r, ev->text, ev->text_len)) {
        abandon(r);
        return;
    }
    if (ev->kind != RT_EV_DONE)
        return;
    rt_oai_usage u = {ev->prompt_tokens, ev->completion_tokens, ev->cached_tokens};
    const rt_oai_head h = head_of(r);
    bool oom = false;
    const int n_lp = gw_lp_ready(&r->lp, r->lp_ready);
    rt_oai_logprob *lp = gw_lp_render(&r->lp, n_lp, rt_engine_tokenizer(r->w->engine), &oom);
    rt_oai_answer a = {0};
    rt_oai_tool_call *calls = NULL;
    oom = oom || !split(r, r->text, r->text_len, true, &a.reasoning, &a.reasoning_len, &a.text, &a.text_len);
    if (r->tc && !oom) {
        calls = calls_of(r, 0, &a.n_calls);
        a.calls = calls;
        oom = a.n_calls != rt_tc_n_calls(r->tc);
    }
    if (!a.reasoning_len) /* null, as vLLM's */
        a.reasoning = NULL;
    char n[16];
    snprintf(n, sizeof(n), "%d", ev->prompt_tokens);
    const gw_http_header counted = {PROMPT_TOKENS_HEADER, n};
    respond_json_with(
        r->stream, 200,
        oom ? NULL
            : rt_oai_response_answer_json(&h, &a, finish_of(r, ev->finish_reason), &u, lp, lp ? n_lp : 0),
        &counted);
    free(calls);
    free(lp);
}

/* The answers already failed have had their moment to go out; what is
 * queued or running goes with the connections, and the gateway sends it to
 * another worker as it does when a worker crashes. Freeing the model could
 * hang on a lost device, so nothing is freed. */
static void on_device_lost(evutil_socket_t fd, short what, void *arg)
{
    fprintf(stderr, "worker: exiting (status 70) for a new process with a working device\n");
    _exit(70);
}

/* A lost device fails every step from now on, and only a new process gets
 * a working context: the supervisor starts one when this one exits. */
static void device_lost(gw_worker *w)
{
    if (w->device_lost)
        return;
    w->device_lost = true;
    fprintf(stderr, "worker: the device failed beyond recovery (%s)\n",
            rt_model_backend_name(rt_engine_model(w->engine)));
    struct timeval tv = {0, 200000};
    if (event_base_once(w->base, -1, EV_TIMEOUT, on_device_lost, w, &tv))
        on_device_lost(-1, 0, w);
}

static void handle_event(void *arg, const rt_engine_event *e)
{
    wreq *r = e->user;
    const rt_sched_event *ev = &e->ev;
    if (e->device_lost)
        device_lost(r->w);
    if (ev->kind != RT_EV_TEXT)
        r->final_seen = true;
    if (ev->kind == RT_EV_DONE && r->prompt_bytes && ev->prompt_tokens > 0) {
        /* what the gateway, which counts bytes, needs to price a prefill */
        double x = (double)r->prompt_bytes / ev->prompt_tokens, *b = &r->w->bytes_per_token;
        *b = *b > 0 ? *b + 0.1 * (x - *b) : x;
    }
    if (r->stream) {
        if (ev->kind == RT_EV_ERROR) {
            if (r->begun)
                fail_stream(r, e->error);
            else
                respond_error_after(r->stream, e->error, e->retry_after_s);
        } else if (ev->logprobs && gw_lp_add(&r->lp, ev->completion_tokens, ev->token, ev->logprobs)) {
            abandon(r);
        } else {
            /* Entries past it are of text held back: a streamed chunk
             * takes them only once their text begins to go out, and at the
             * end those of a matched stop string's tokens are never sent. */
            r->lp_ready = ev->lp_ready;
            if (r->stream_mode)
                handle_stream_event(r, ev);
            else
                handle_whole_event(r, ev);
        }
    }
    wreq_maybe_free(r);
}

/* Events a loop callback takes from the engine at most. The compute thread
 * can queue them faster than the loop formats them (a step of 256
 * sequences with top_logprobs is 256 JSON chunks): taken all at once, the
 * loop fell seconds behind its sockets, so that its gateway's new
 * connections timed out unanswered and its stats went stale. */
#define W_POLL_SLICE 64

static void on_notify(evutil_socket_t fd, short what, void *arg)
{
    gw_worker *w = arg;
    static const struct timeval now = {0, 0};
    /* A timer, not event_active: libevent runs what is activated during
     * its pass in the same pass, before it polls the sockets again. */
    if (rt_engine_poll_max(w->engine, 0, W_POLL_SLICE, handle_event, w) == W_POLL_SLICE)
        evtimer_add(w->more, &now);
}

static void wake(void *arg)
{
    event_active(((gw_worker *)arg)->notify, EV_READ, 0);
}

/* ---- requests ---- */

static int64_t header_int(const gw_http_request *req, const char *name, int64_t dflt)
{
    const char *v = gw_http_header_get(req, name);
    if (!v)
        return dflt;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    return errno || end == v || *end ? -1 : x;
}

/* A completion request on its way to the engine. The loop copies the body
 * (the stream, and with it the request, may close first); the offload
 * thread has the engine prepare it (parse, template, tokens), which for a
 * long prompt takes long enough to hold back every other stream's tokens
 * (~150 ms for 256 KiB); the loop then submits it. */
typedef struct wprep {
    gw_offload_job job; /* first */
    wreq *r;            /* the loop's: the offload thread does not touch it */
    rt_engine *engine;
    bool chat;
    char *body;
    size_t body_len;
    rt_priority prio;
    int64_t deadline_ms;
    int32_t *resume; /* x-infergate-resume's tokens (resume_parse) */
    int n_resume;
    uint64_t resume_seed;
    char tenant[RT_SCHED_TENANT_MAX + 1]; /* the scheduler's fair share: "" none */
    double weight;
    int rc; /* rt_engine_prepare's; e says why */
    rt_engine_req req;
    rt_oai_error e;
} wprep;

static void wprep_free(wprep *p)
{
    rt_engine_req_dispose(&p->req);
    free(p->resume);
    free(p->body);
    free(p);
}

/* Offload thread. */
static void prepare(gw_offload_job *job)
{
    wprep *p = (wprep *)job;
    p->rc =
        rt_engine_prepare(p->engine, p->body, p->body_len, p->chat, p->prio, p->deadline_ms, &p->req, &p->e);
}

/* A resumed run's tokens' text, as the unbroken run's events carried it
 * (rt_sched_req.resumed_text): through the parsers of tool calls and
 * reasoning as those events took it, with what went out then marked sent
 * (the calls' heads and arguments) and nothing written, so that the next
 * event goes on with exactly the chunks the unbroken run sent next. */
static int resumed_text(void *ud, const char *text, size_t len)
{
    wreq *r = ud;
    const char *content, *reasoning;
    size_t content_len, reasoning_len;
    r->mute = true;
    bool ok =
        split(r, text, len, false, &reasoning, &reasoning_len, &content, &content_len) && write_calls(r);
    r->mute = false;
    return ok ? 0 : -ENOMEM;
}

/* Token replay, once the request is prepared: what it asked for, if it
 * can have it. A resumed run continues where the gateway's tokens end,
 * with the id, created and seed of the run it continues; its stream does
 * not open with the role again, its parsers and grammar matcher are where
 * the tokens left them (resumed_text; the scheduler's resume_text), and
 * its call ids, made of the id, are the same. Only a streamed answer is
 * resumed (one not streamed is sent again whole), and its gateway is told
 * so. False for a resume this request cannot have. */
static bool replay_ready(wreq *r, wprep *p)
{
    r->replay_off = !p->req.q.stream ? "not streamed" : NULL;
    if (!r->replay_info && !p->resume)
        r->replay_off = NULL;
    if (r->replay_off) {
        r->replay_info = false;
        return !p->resume;
    }
    if (p->resume) {
        p->req.run.resume = p->resume;
        p->req.run.n_resume = p->n_resume;
        p->req.run.sampling.seed = p->resume_seed;
        p->req.run.resumed_text = resumed_text;
        p->req.run.resumed_ud = r;
        r->sent_first = true;
    }
    r->seed = p->req.run.sampling.seed;
    return true;
}

/* Loop: queues a prepared request, or says why it cannot run. */
static void submit_prepared(gw_worker *w, wprep *p)
{
    wreq *r = p->r;
    int retry = 0;
    if (p->rc) {
        retry = rt_engine_retry_after(w->engine, &p->e, p->prio);
    } else if (!replay_ready(r, p)) {
        rt_oai_error_set(&p->e, 400, "invalid_request_error", NULL, "resume_refused",
                         "x-infergate-resume: this request cannot be resumed (%s)", r->replay_off);
    } else {
        r->stream_mode = p->req.q.stream;
        r->include_usage = p->req.q.include_usage;
        r->logprobs = p->req.q.logprobs;
        /* harmony's parser splits out the reasoning too, tools or not */
        const rt_tc_format tf = rt_engine_tool_format(w->engine);
        if (((p->req.q.tools || (r->chat && tf == RT_TC_HARMONY)) && !(r->tc = rt_tc_parser_new(tf))) ||
            (p->req.reasoning && !(r->think = rt_think_new(p->req.reasoning == 2)))) {
            rt_engine_error_oom(&p->e);
            respond_error_after(r->stream, &p->e, 1);
            return;
        }
        p->req.run.tenant = p->tenant;
        p->req.run.weight = p->weight;
        if (rt_engine_submit(w->engine, &p->req, r, &r->id, &p->e, &retry) == 0) {
            r->submitted = true;
            return;
        }
    }
    respond_error_after(r->stream, &p->e, retry);
}

static void on_prepared(void *ud, gw_offload_job *job, bool ran)
{
    gw_worker *w = ud;
    wprep *p = (wprep *)job;
    wreq *r = p->r;
    r->preparing = false;
    rt_engine_release(w->engine, p->prio);
    if (ran && r->stream)
        submit_prepared(w, p);
    wprep_free(p);
    wreq_maybe_free(r);
}

/* x-infergate-resume (gateway/base/replay_wire.h): the run a resumed
 * request continues and the tokens it had generated. Only a gateway sends
 * it (the worker's socket is the gateway's; a gateway takes it from no
 * client, only from a peer region over verified TLS). 0, or -EINVAL for a
 * malformed one, -ENOMEM. */
static int resume_parse(const char *v, wreq *r, wprep *p)
{
    gw_replay_resume x;
    int rc = gw_replay_resume_parse(v, &x);
    if (rc)
        return rc;
    /* a resume with no tokens still resumes: the run failed before its first */
    p->resume = x.tokens ? x.tokens : malloc(sizeof(int32_t));
    if (!p->resume)
        return -ENOMEM;
    p->n_resume = x.n_tokens;
    snprintf(r->cid, sizeof(r->cid), "%s", x.id);
    r->created = x.created;
    p->resume_seed = x.seed;
    return 0;
}

/* The request's loop state and its job for the offload thread; 0, or
 * -ENOMEM, -EINVAL (a malformed x-infergate-resume). */
static int new_request(gw_worker *w, gw_http_stream *s, const gw_http_request *req, bool chat,
                       rt_priority pr, int64_t deadline, uint32_t prompt_bytes, const char *tenant,
                       double weight)
{
    wreq *r = calloc(1, sizeof(*r));
    wprep *p = calloc(1, sizeof(*p));
    char *body = malloc(req->body_len + 1);
    if (!r || !p || !body) {
        free(r);
        free(p);
        free(body);
        return -ENOMEM;
    }
    if (req->body_len)
        memcpy(body, req->body, req->body_len);
    r->w = w;
    r->stream = s;
    r->chat = chat;
    r->prompt_bytes = prompt_bytes;
    r->preparing = true;
    rt_engine_response_id(w->engine, chat, r->cid, sizeof(r->cid), &r->created);
    r->replay_info = gw_http_header_get(req, "x-infergate-replay") != NULL;
    const char *resume = gw_http_header_get(req, "x-infergate-resume");
    int rc = resume ? resume_parse(resume, r, p) : 0;
    if (rc) {
        free(p->resume);
        free(r);
        free(p);
        free(body);
        return rc;
    }
    *p = (wprep){.resume = p->resume,
                 .n_resume = p->n_resume,
                 .resume_seed = p->resume_seed,
                 .r = r,
                 .engine = w->engine,
                 .chat = chat,
                 .body = body,
                 .body_len = req->body_len,
                 .prio = pr,
                 .deadline_ms = deadline,
                 .weight = weight};
    snprintf(p->tenant, sizeof(p->tenant), "%s", tenant);
    gw_http_set_user(s, r);
    gw_offload_submit(w->prep, &p->job, pr == RT_PRIO_INTERACTIVE);
    return 0;
}

/* The tenant the gateway serves the request for, and its weight, for the
 * scheduler's fair share (none: the nameless tenant, weight 1). False when
 * either is malformed. */
static bool tenant_of(const gw_http_request *req, const char **tenant, double *weight)
{
    const char *t = gw_http_header_get(req, "x-infergate-tenant");
    const char *v = gw_http_header_get(req, "x-infergate-tenant-weight");
    *tenant = t ? t : "";
    *weight = 1;
    if (v) {
        char *end = (char *)v;
        errno = 0;
        *weight = strspn(v, "0123456789.eE+-") == strlen(v) ? strtod(v, &end) : -1;
        if (errno || end == v || *end)
            return false;
    }
    return strlen(*tenant) <= RT_SCHED_TENANT_MAX && *weight >= RT_SCHED_WEIGHT_MIN &&
           *weight <= RT_SCHED_WEIGHT_MAX;
}

static void handle_completion(gw_worker *w, gw_http_stream *s, const gw_http_request *req, bool chat)
{
    rt_oai_error e;
    const char *prio = gw_http_header_get(req, "x-infergate-priority");
    int64_t deadline = header_int(req, "x-infergate-deadline-ms", 0);
    if ((prio && strcmp(prio, "interactive") && strcmp(prio, "batch")) || deadline < 0) {
        rt_oai_error_set(&e, 400, "invalid_request_error", NULL, NULL,
                         "x-infergate-priority must be interactive or batch, and x-infergate-deadline-ms "
                         "epoch milliseconds");
        respond_error(s, &e);
        return;
    }
    rt_priority pr = prio && !strcmp(prio, "batch") ? RT_PRIO_BATCH : RT_PRIO_INTERACTIVE;
    const char *tenant;
    double weight;
    if (!tenant_of(req, &tenant, &weight)) {
        rt_oai_error_set(&e, 400, "invalid_request_error", NULL, NULL,
                         "x-infergate-tenant must be at most %d bytes, and x-infergate-tenant-weight a "
                         "number from %g to %g",
                         RT_SCHED_TENANT_MAX, RT_SCHED_WEIGHT_MIN, RT_SCHED_WEIGHT_MAX);
        respond_error(s, &e);
        return;
    }
    int retry;
    if (rt_engine_admit(w->engine, pr, deadline, tenant, weight, &e, &retry)) {
        respond_error_after(s, &e, retry);
        return;
    }
    gw_prefix_chain c;
    gw_prefix_chain_of(req->body, req->body_len, &c);
    int rc = new_request(w, s, req, chat, pr, deadline, c.n ? c.end[c.n - 1] : 0, tenant, weight);
    if (rc) {
        rt_engine_release(w->engine, pr);
        if (rc == -EINVAL)
            rt_oai_error_set(&e, 400, "invalid_request_error", NULL, "bad_resume",
                             "x-infergate-resume must be 'ID CREATED SEED TOKEN,TOKEN,...'");
        else
            rt_engine_error_oom(&e);
        respond_error_after(s, &e, rc == -EINVAL ? 0 : 1);
        return;
    }
    gw_prefix_set_add(&w->prefixes, &c);
}

/* The prefix hashes held, most recently used first, after dropping those
 * whose KV has most likely been evicted since: more KV written since
 * their last use than the pool holds. None without the cache. */
static json_t *prefix_hashes(gw_worker *w, const rt_sched_stats *st)
{
    json_t *a = json_array();
    uint64_t v[PREFIX_SET_CAP];
    if (!a || !st->prefix_cache)
        return a;
    gw_prefix_set_age(&w->prefixes, (double)(st->prompt_tokens_computed + st->tokens_generated),
                      (double)st->kv_blocks_total * st->kv_block_tokens);
    int n = gw_prefix_set_list(&w->prefixes, v, PREFIX_SET_CAP);
    for (int i = 0; i < n; i++) {
        char hex[17];
        snprintf(hex, sizeof(hex), "%016" PRIx64, v[i]);
        json_array_append_new(a, json_string(hex));
    }
    return a;
}

/* The scheduler's share of the worker per tenant (runtime/sched.h). */
static json_t *tenants_json(gw_worker *w)
{
    rt_sched_tenant_stats ts[RT_SCHED_TENANT_REPORTS];
    int n = rt_engine_tenants(w->engine, ts, RT_SCHED_TENANT_REPORTS);
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) {
        json_t *e = json_pack("{s:s, s:f, s:i, s:i, s:I, s:I, s:I}", "name", ts[i].name, "weight", ts[i].weight,
                              "running", ts[i].running, "queued", ts[i].queued, "tokens", (json_int_t)ts[i].tokens,
                              "preempted", (json_int_t)ts[i].preempted, "pushed_out",
                              (json_int_t)ts[i].pushed_out);
        if (e && !strcmp(ts[i].name, RT_SCHED_TENANT_OTHER)) /* the tenants past the figures kept */
            json_object_set_new(e, "folded", json_integer(ts[i].folded));
        json_array_append_new(a, e);
    }
    return a;
}

static void handle_stats(gw_worker *w, gw_http_stream *s)
{
    rt_sched_stats st;
    rt_engine_stats(w->engine, &st);
    const rt_model *m = rt_engine_model(w->engine);
    rt_device_info dev;
    rt_model_device_info(m, &dev);
    json_t *o = json_pack(
        "{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:I, s:I, s:I, s:s, s:s, "
        "s:s, s:i, s:s}",
        "queued", st.queued, "queued_batch", st.queued_batch, "running", st.running, "kv_blocks_free",
        st.kv_blocks_free, "kv_blocks_total", st.kv_blocks_total, "kv_block_tokens", st.kv_block_tokens,
        "max_seqs", st.max_seqs, "max_queue", st.max_queue, "max_batch_tokens", st.max_batch_tokens,
        "ttft_ewma_ms", st.ttft_ewma_ms, "prefill_ewma_ms", st.prefill_ewma_ms, "tpot_ewma_ms",
        st.tpot_ewma_ms, "tokens_per_s", st.tokens_per_s, "requests_done", (json_int_t)st.requests_done,
        "tokens_generated", (json_int_t)st.tokens_generated, "preemptions", (json_int_t)st.preemptions,
        "device", dev.kind, "model", rt_engine_model_name(w->engine), "backend", rt_model_backend_name(m),
        "threads", rt_model_threads(m), "kv_type", kn_type_name(st.kv_type));
    /* What routing ranks this worker by, and the rates it comes from
     * (runtime/sched_est.h). */
    if (o) {
        json_object_set_new(o, "pushed_out", json_integer((json_int_t)st.pushed_out));
        json_object_set_new(o, "est_ttft_ms", json_real(st.est_ttft_ms));
        json_object_set_new(o, "requests_cancelled", json_integer((json_int_t)st.requests_cancelled));
        json_object_set_new(o, "prompt_tokens_ahead", json_integer(st.prompt_tokens_ahead));
        json_object_set_new(o, "est_prompt_tokens", json_integer(st.est_prompt_tokens));
        json_object_set_new(o, "step_base_ms", json_real(st.step_base_ms));
        json_object_set_new(o, "prefill_tokens_per_s", json_real(st.prefill_tokens_per_s));
        /* workers of one class run a model at one speed: the gateway pools
         * their measured rates (gw_supervisor's ms_per_byte) */
        char cls[sizeof(dev.kind) + sizeof(dev.name) + sizeof(dev.mig_profile) + 48];
        snprintf(cls, sizeof(cls), "%s/%s/%s/%s/%d", dev.kind, dev.name, dev.mig_profile,
                 rt_model_backend_name(m), rt_model_threads(m));
        json_object_set_new(o, "rate_class", json_string(cls));
        json_object_set_new(o, "decode_step_ms",
                            json_real(st.step_base_ms + st.step_token_ms * (st.running > 0 ? st.running : 1)));
    }
    /* the prefix cache: prompt tokens computed and reused, its hit rate and size */
    const double prompt_all = (double)(st.prompt_tokens_computed + st.prompt_tokens_cached);
    json_t *pc = o ? json_pack("{s:b, s:I, s:I, s:f, s:i, s:i}", "prefix_cache", st.prefix_cache,
                               "prompt_tokens_computed", (json_int_t)st.prompt_tokens_computed,
                               "prompt_tokens_cached", (json_int_t)st.prompt_tokens_cached,
                               "prefix_cache_hit_rate", prompt_all > 0 ? st.prompt_tokens_cached / prompt_all : 0.0,
                               "kv_blocks_cached", st.kv_blocks_cached, "kv_blocks_evictable",
                               st.kv_blocks_evictable)
                   : NULL;
    if (pc && json_object_update(o, pc)) {
        json_decref(o);
        o = NULL;
    }
    json_decref(pc);
    if (o)
        json_object_set_new(o, "prefix_hashes", prefix_hashes(w, &st));
    if (o)
        json_object_set_new(o, "prompt_bytes_per_token", json_real(w->bytes_per_token));
    if (o)
        json_object_set_new(o, "tenants", tenants_json(w));
    /* On a GPU: which one (the MIG slice, if any) and its memory. */
    if (o && strcmp(dev.kind, "cpu") != 0) {
        json_t *d =
            json_pack("{s:s, s:s, s:s, s:I, s:I, s:I}", "name", dev.name, "uuid", dev.uuid, "mig_profile",
                      dev.mig_profile, "memory_total_bytes", (json_int_t)dev.mem_total, "memory_free_bytes",
                      (json_int_t)dev.mem_free, "weights_bytes", (json_int_t)dev.mem_weights);
        if (d)
            json_object_set_new(o, "device_info", d);
    }
    respond_json(s, 200, o ? json_dumps(o, JSON_COMPACT) : NULL);
    json_decref(o);
}

static void on_request(void *ud, gw_http_stream *s, const gw_http_request *req)
{
    gw_worker *w = ud;
    rt_oai_error e;
    const char *path = req->path, *model = rt_engine_model_name(w->engine);
    size_t plen = strcspn(path, "?");
    /* HEAD is GET without the body, which the HTTP layer leaves out. */
    bool get = !strcmp(req->method, "GET") || !strcmp(req->method, "HEAD"),
         post = !strcmp(req->method, "POST");
    const char *allow = "GET, HEAD";
#define PATH_IS(p) (plen == sizeof(p) - 1 && !strncmp(path, p, plen))
#define MODELS_DIR "/v1/models/"
    if (PATH_IS("/v1/completions") || PATH_IS("/v1/chat/completions")) {
        allow = "POST";
        if (post) {
            handle_completion(w, s, req, PATH_IS("/v1/chat/completions"));
            return;
        }
    } else if (PATH_IS("/health")) {
        if (get) {
            static const char ok[] = "{\"status\":\"ok\"}";
            if (gw_http_respond(s, 200, json_headers, 1, ok, sizeof(ok) - 1))
                gw_http_reset(s);
            return;
        }
    } else if (PATH_IS("/v1/models")) {
        if (get) {
            respond_json(s, 200, rt_oai_models_json(model, rt_engine_created(w->engine)));
            return;
        }
    } else if (plen > sizeof(MODELS_DIR) - 1 && !strncmp(path, MODELS_DIR, sizeof(MODELS_DIR) - 1)) {
        if (get) {
            const char *id = path + sizeof(MODELS_DIR) - 1;
            size_t id_len = plen - (sizeof(MODELS_DIR) - 1);
            if (gw_http_segment_is(id, id_len, model)) {
                respond_json(s, 200, rt_oai_model_json(model, rt_engine_created(w->engine)));
            } else {
                rt_oai_error_set(&e, 404, "invalid_request_error", "model", "model_not_found",
                                 "the model '%.*s' does not exist", (int)(id_len > 128 ? 128 : id_len), id);
                respond_error(s, &e);
            }
            return;
        }
    } else if (PATH_IS("/internal/stats")) {
        if (get) {
            handle_stats(w, s);
            return;
        }
    } else {
        rt_oai_error_set(&e, 404, "invalid_request_error", NULL, "not_found", "no route for %s %.*s",
                         req->method, (int)plen, path);
        respond_error(s, &e);
        return;
    }
#undef PATH_IS
#undef MODELS_DIR
    rt_oai_error_set(&e, 405, "invalid_request_error", NULL, "method_not_allowed",
                     "%s is not allowed on %.*s", req->method, (int)plen, path);
    respond_error_with(s, &e, &(const gw_http_header){"allow", allow}); /* RFC 9110 15.5.6 */
}

static void on_close(void *ud, gw_http_stream *s, void *stream_ud, bool finished)
{
    gw_worker *w = ud;
    wreq *r = stream_ud;
    if (!r)
        return;
    r->stream = NULL;
    if (r->submitted && !r->final_seen)
        rt_engine_cancel(w->engine, r->id);
    wreq_maybe_free(r);
}

/* ---- lifecycle ---- */

static void on_drain_tick(evutil_socket_t fd, short what, void *arg)
{
    gw_worker *w = arg;
    /* the connections too, as the gateway's: over TCP, one freed with its
     * peer's last frames unread is reset, and the end of its last
     * response lost (each lingers at most 5 s after its GOAWAY) */
    if ((gw_http_server_active_streams(w->http) == 0 && !gw_http_server_has_conns(w->http)) ||
        gw_mono_s() > w->drain_deadline)
        event_base_loopexit(w->base, NULL);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    gw_worker *w = arg;
    if (w->drain_timer)
        return;
    fprintf(stderr, "worker: signal %d: draining %zu open streams (at most %d s)\n", (int)sig,
            gw_http_server_active_streams(w->http), w->drain_grace_s);
    gw_http_server_drain(w->http);
    w->drain_deadline = gw_mono_s() + w->drain_grace_s;
    w->drain_timer = event_new(w->base, -1, EV_PERSIST, on_drain_tick, w);
    struct timeval tv = {0, 50000};
    if (!w->drain_timer || event_add(w->drain_timer, &tv))
        event_base_loopexit(w->base, NULL);
}

gw_worker *gw_worker_new(rt_engine *e, const gw_worker_opts *o, char *err, size_t err_len)
{
    /* The compute thread makes the notify event active: libevent must lock. */
    if (evthread_use_pthreads()) {
        snprintf(err, err_len, "libevent has no pthreads support");
        return NULL;
    }
    gw_worker *w = calloc(1, sizeof(*w));
    if (!w) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    w->engine = e;
    w->drain_grace_s = o->drain_grace_s;
    if (gw_prefix_set_init(&w->prefixes, PREFIX_SET_CAP)) {
        snprintf(err, err_len, "out of memory");
        goto fail;
    }
    w->base = event_base_new();
    gw_http_handler h = {.on_request = on_request, .on_close = on_close, .on_writable = on_writable};
    if (!w->base || !(w->http = gw_http_server_new(w->base, &o->limits, &h, w)) ||
        !(w->notify = event_new(w->base, -1, 0, on_notify, w)) || !(w->more = evtimer_new(w->base, on_notify, w))) {
        snprintf(err, err_len, "out of memory");
        goto fail;
    }
    rt_engine_set_wake(e, wake, w);
    if (!(w->prep = gw_offload_new(w->base, prepare, on_prepared, w))) {
        snprintf(err, err_len, "cannot start the request thread");
        goto fail;
    }
    w->sigterm = evsignal_new(w->base, SIGTERM, on_signal, w);
    w->sigint = evsignal_new(w->base, SIGINT, on_signal, w);
    if (!w->sigterm || !w->sigint || event_add(w->sigterm, NULL) || event_add(w->sigint, NULL)) {
        snprintf(err, err_len, "cannot set up events");
        goto fail;
    }
    signal(SIGPIPE, SIG_IGN);
    /* The gateway reloads on SIGHUP; `pkill -HUP infergate` reaches its
     * workers too, which have nothing to reload and must not die of it. */
    signal(SIGHUP, SIG_IGN);
    return w;
fail:
    gw_worker_free(w);
    return NULL;
}

int gw_worker_listen(gw_worker *w, const char *addr, char *err, size_t err_len)
{
    return gw_http_server_listen(w->http, addr, err, err_len);
}

void gw_worker_run(gw_worker *w)
{
    event_base_dispatch(w->base);
}

void gw_worker_free(gw_worker *w)
{
    if (!w)
        return;
    /* The server first (its streams close and cancel), then the requests
     * being prepared (their streams are gone), then the engine (its last
     * events land in the queue), then the queue. */
    if (w->http)
        gw_http_server_free(w->http);
    gw_offload_free(w->prep);
    rt_engine_stop(w->engine);
    rt_engine_poll(w->engine, 0, handle_event, w);
    rt_engine_set_wake(w->engine, NULL, NULL);
    if (w->notify)
        event_free(w->notify);
    if (w->more)
        event_free(w->more);
    if (w->sigterm)
        event_free(w->sigterm);
    if (w->sigint)
        event_free(w->sigint);
    if (w->drain_timer)
        event_free(w->drain_timer);
    if (w->base)
        event_base_free(w->base);
    gw_prefix_set_free(&w->prefixes);
    free(w);
}
