/* `infergate worker`: one model on one device behind an OpenAI-compatible
 * HTTP/2 server. The event loop owns the sockets; the runtime scheduler's
 * compute thread owns the model. Scheduler events cross to the loop through
 * a mutex-protected queue and one libevent event made active from the
 * compute thread. */
#include "gateway/cmd/cli.h"
#include "gateway/base/clock.h"
#include "gateway/base/num.h"
#include "gateway/http/http.h"
#include "gateway/worker/logprobs.h"
#include "gateway/base/offload.h"

#include "runtime/chat.h"
#include "runtime/gguf.h"
#include "runtime/model.h"
#include "runtime/openai.h"
#include "runtime/sched.h"
#include "runtime/tokenizer.h"

#include <errno.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <getopt.h>
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define DRAIN_GRACE_S 30

typedef struct wreq wreq;
typedef struct worker worker;

/* One request's state on the loop side. Freed when both its final
 * scheduler event has been handled and its stream has closed. */
struct wreq {
    worker *w;
    gw_http_stream *stream; /* NULL once closed */
    uint64_t id;
    bool preparing; /* with the offload thread (wprep): not yet submitted */
    bool submitted, final_seen, begun, sent_first;
    bool ended;            /* answered or reset early: later events are dropped */
    atomic_bool text_lost; /* the compute thread could not queue a TEXT event */
    bool chat, stream_mode, include_usage, logprobs;
    gw_lp_list lp; /* log-probabilities not yet sent */
    int lp_ready;  /* the last event's: lp's entries of tokens 1..lp_ready may go */
    char cid[40];
    long created;
    char *text; /* non-streamed: the whole completion */
    size_t text_len, text_cap;
};

/* A scheduler event copied for the loop. */
typedef struct wevent {
    struct wevent *next;
    wreq *r;
    rt_sched_event ev;
    char text[]; /* then, when ev.logprobs is set, the rt_token_logprobs it points to */
} wevent;

struct worker {
    struct event_base *base;
    struct event *notify, *sigterm, *sigint, *drain_timer;
    gw_http_server *http;
    rt_model *model;
    rt_sched *sched;
    gw_offload *prep; /* parses and encodes requests off the loop */
    const rt_tokenizer *tok;
    rt_chat_kind chat_kind;
    const char *bos_text; /* the tokenizer's, "" when the model has no BOS */
    /* rt_chat_turn_end's text where no token of it ends generation: a
     * chat's implicit stop string; NULL where the model ends turns itself */
    const char *turn_stop;
    const char *model_name;
    long created;
    pthread_mutex_t mu;
    wevent *head, *tail;
    double drain_deadline;
    int drain_grace_s;
    uint64_t next_cid; /* from a random start: ids unique across workers */
    uint64_t next_seed; /* for requests that name none; the sampler mixes it */
    int preparing[2];   /* requests with the offload thread, by rt_priority */
    bool device_lost;   /* a sticky device error: the process ends shortly */
};

/* The scheduler's rule, applied before it sees the request. */
static bool deadline_passed(int64_t deadline_ms)
{
    return deadline_ms && gw_epoch_ms() > deadline_ms;
}

static void set_deadline_error(rt_oai_error *e)
{
    rt_oai_error_set(e, 504, "timeout_error", NULL, "deadline_exceeded",
                     "the request's deadline passed before it could start");
}

static void set_queue_full_error(rt_oai_error *e)
{
    rt_oai_error_set(e, 429, "rate_limit_error", NULL, "queue_full",
                     "the worker's queue is full; retry shortly");
}

static const gw_http_header json_headers[] = {{"content-type", "application/json"}};

static void respond_json(gw_http_stream *s, int status, char *body)
{
    if (!body) {
        gw_http_reset(s);
        return;
    }
    /* A response that cannot be queued (out of memory) must not leave the
     * stream open without one. */
    if (gw_http_respond(s, status, json_headers, 1, body, strlen(body)))
        gw_http_reset(s);
    free(body);
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

/* Seconds until a turned-away request would likely find room: the queue
 * ahead (for an interactive request, the interactive requests; for a batch
 * one, all) drained max_seqs at a time, each request taking what the
 * recent finished ones took once admitted (first token, then its share of
 * tokens at the per-token pace). Not the TTFT clients see: it holds the
 * queueing this already counts. A constant 1 told a thousand clients to
 * come back together in a second, whatever the backlog. 1 to 60. */
static int retry_after_s(worker *w, rt_priority prio)
{
    rt_sched_stats st;
    rt_sched_get_stats(w->sched, &st);
    double per_req = st.requests_done ? (double)st.done_tokens / (double)st.requests_done : 0.0;
    double req_s = (st.prefill_ewma_ms + per_req * st.tpot_ewma_ms) * 1e-3;
    int ahead = prio == RT_PRIO_BATCH ? st.queued : st.queued - st.queued_batch;
    double wait = (double)(ahead + 1) / (st.max_seqs > 0 ? st.max_seqs : 1) * req_s;
    return wait < 1.0 ? 1 : wait > 60.0 ? 60 : (int)ceil(wait);
}

static void wreq_maybe_free(wreq *r)
{
    if (r->stream || r->preparing || (r->submitted && !r->final_seen))
        return;
    free(r->text);
    gw_lp_free(&r->lp);
    free(r);
}

/* ---- scheduler events: compute thread -> loop ---- */

static void on_sched_event(void *user, const rt_sched_event *ev)
{
    wreq *r = user;
    worker *w = r->w;
    const size_t lp_at =
        (ev->text_len + 1 + _Alignof(rt_token_logprobs) - 1) & ~(_Alignof(rt_token_logprobs) - 1);
    const size_t size =
        sizeof(wevent) + (ev->logprobs ? lp_at + sizeof(rt_token_logprobs) : ev->text_len + 1);
    wevent *we = malloc(size);
    if (!we) {
        /* A lost TEXT event would leave a hole in the text: the request is
         * stopped and its client told (handle_event) instead. Losing the
         * final event would leak the request, so it is retried until it
         * fits. */
        if (ev->kind == RT_EV_TEXT) {
            atomic_store(&r->text_lost, true);
            rt_sched_cancel(w->sched, ev->id);
            return;
        }
        while (!(we = malloc(size)))
            nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    we->next = NULL;
    we->r = r;
    we->ev = *ev;
    if (ev->text_len)
        memcpy(we->text, ev->text, ev->text_len);
    we->text[ev->text_len] = '\0';
    we->ev.text = we->text;
    if (ev->logprobs) {
        rt_token_logprobs *lp = (rt_token_logprobs *)(void *)(we->text + lp_at);
        *lp = *ev->logprobs;
        we->ev.logprobs = lp;
    }
    pthread_mutex_lock(&w->mu);
    if (w->tail)
        w->tail->next = we;
    else
        w->head = we;
    w->tail = we;
    pthread_mutex_unlock(&w->mu);
    event_active(w->notify, EV_READ, 0);
}

static bool append_text(wreq *r, const char *p, size_t n)
{
    if (r->text_len + n + 1 > r->text_cap) {
        size_t cap = r->text_cap ? r->text_cap * 2 : 256;
        while (cap < r->text_len + n + 1)
            cap *= 2;
        char *np = realloc(r->text, cap);
        if (!np)
            return false;
        r->text = np;
        r->text_cap = cap;
    }
    memcpy(r->text + r->text_len, p, n);
    r->text_len += n;
    r->text[r->text_len] = '\0';
    return true;
}

static bool begin_stream(wreq *r)
{
    if (r->begun)
        return true;
    gw_http_header h[] = {{"content-type", "text/event-stream"}, {"cache-control", "no-cache"}};
    if (gw_http_begin(r->stream, 200, h, 2))
        return false;
    r->begun = true;
    return true;
}

/* Writes one SSE event (NULL: out of memory); a reader too slow for the
 * per-stream bound loses its stream, and so its request. */
static bool write_sse(wreq *r, char *ev, size_t len)
{
    if (!ev || gw_http_write(r->stream, ev, len)) {
        free(ev);
        gw_http_reset(r->stream);
        rt_sched_cancel(r->w->sched, r->id);
        return false;
    }
    free(ev);
    return true;
}

static rt_oai_head head_of(const wreq *r)
{
    return (rt_oai_head){r->chat, r->include_usage, r->logprobs, r->cid, r->w->model_name, r->created};
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
    rt_oai_logprob *lp = gw_lp_render(&r->lp, n_lp, r->w->tok, &oom);
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
    if (write_sse(r, ev, n) && gw_http_end(r->stream))
        gw_http_reset(r->stream);
}

static void handle_stream_event(wreq *r, const rt_sched_event *ev)
{
    if (!begin_stream(r)) {
        gw_http_reset(r->stream);
        rt_sched_cancel(r->w->sched, r->id);
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
    if (ev->text_len && !write_chunk(r, false, ev->text, ev->text_len, NULL, NULL))
        return;
    if (ev->kind != RT_EV_DONE)
        return;
    rt_oai_usage u = {ev->prompt_tokens, ev->completion_tokens};
    /* No text: chat's last delta is {}, a completion's text "", as OpenAI's */
    if (!write_chunk(r, false, NULL, 0, ev->finish_reason, NULL))
        return;
    if (r->include_usage && !write_chunk(r, false, NULL, 0, NULL, &u))
        return;
    static const char done[] = "data: [DONE]\n\n";
    if (gw_http_write(r->stream, done, sizeof(done) - 1) || gw_http_end(r->stream))
        gw_http_reset(r->stream);
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
static void device_lost(worker *w)
{
    if (w->device_lost)
        return;
    w->device_lost = true;
    fprintf(stderr, "worker: the device failed beyond recovery (%s)\n", rt_model_backend_name(w->model));
    struct timeval tv = {0, 200000};
    if (event_base_once(w->base, -1, EV_TIMEOUT, on_device_lost, w, &tv))
        on_device_lost(-1, 0, w);
}

static void handle_event(wreq *r, const rt_sched_event *ev)
{
    worker *w = r->w;
    if (ev->kind != RT_EV_TEXT)
        r->final_seen = true;
    if (!r->stream || r->ended)
        return;
    rt_oai_error e;
    if (atomic_load(&r->text_lost)) {
        /* Events after the lost one are dropped: the client gets a reset,
         * or an error where nothing was sent yet, never a text with a hole. */
        r->ended = true;
        rt_oai_error_set(&e, 503, "server_error", NULL, NULL, "out of memory while generating");
        if (r->begun)
            fail_stream(r, &e);
        else
            respond_error(r->stream, &e);
        return;
    }
    if (ev->kind == RT_EV_ERROR) {
        int retry = 0;
        if (ev->error == -ETIMEDOUT) {
            set_deadline_error(&e);
        } else if (ev->error == -ENOMEM) {
            rt_oai_error_set(&e, 503, "server_error", NULL, NULL, "out of memory while running the model");
            retry = 1;
        } else if (ev->error == -ENOTRECOVERABLE) {
            rt_oai_error_set(&e, 503, "server_error", NULL, NULL, "the device failed; this worker restarts");
            retry = 1;
            device_lost(w);
        } else {
            rt_oai_error_set(&e, 500, "server_error", NULL, NULL, "the model failed to run this request (%s)",
                             strerror(-ev->error));
        }
        if (r->begun)
            fail_stream(r, &e);
        else
            respond_error_after(r->stream, &e, retry);
        return;
    }
    /* An end-of-generation token is no part of the answer. */
    if (ev->logprobs && !rt_tokenizer_is_eog(w->tok, ev->token) &&
        gw_lp_add(&r->lp, ev->completion_tokens, ev->token, ev->logprobs)) {
        gw_http_reset(r->stream);
        rt_sched_cancel(w->sched, r->id);
        return;
    }
    /* Entries past it are of text held back: a streamed chunk takes them
     * only once their text begins to go out, and at the end those of a
     * matched stop string's tokens are never sent. */
    r->lp_ready = ev->lp_ready;
    if (r->stream_mode) {
        handle_stream_event(r, ev);
        return;
    }
    if (ev->text_len && !append_text(r, ev->text, ev->text_len)) {
        gw_http_reset(r->stream);
        rt_sched_cancel(w->sched, r->id);
        return;
    }
    if (ev->kind == RT_EV_DONE) {
        rt_oai_usage u = {ev->prompt_tokens, ev->completion_tokens};
        const rt_oai_head h = head_of(r);
        bool oom = false;
        const int n_lp = gw_lp_ready(&r->lp, r->lp_ready);
        rt_oai_logprob *lp = gw_lp_render(&r->lp, n_lp, w->tok, &oom);
        respond_json(r->stream, 200,
                     oom ? NULL
                         : rt_oai_response_json(&h, r->text ? r->text : "", r->text_len, ev->finish_reason,
                                                &u, lp, lp ? n_lp : 0));
        free(lp);
    }
}

static void on_notify(evutil_socket_t fd, short what, void *arg)
{
    worker *w = arg;
    pthread_mutex_lock(&w->mu);
    wevent *we = w->head;
    w->head = w->tail = NULL;
    pthread_mutex_unlock(&w->mu);
    while (we) {
        wevent *next = we->next;
        handle_event(we->r, &we->ev);
        wreq_maybe_free(we->r);
        free(we);
        we = next;
    }
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

/* Prompt tokens for a parsed request; malloc'd, count in *n. */
static int32_t *prompt_tokens(worker *w, const rt_oai_request *q, int *n, rt_oai_error *e)
{
    char *text = NULL;
    const char *src = q->prompt;
    bool bos = rt_tokenizer_add_bos_default(w->tok);
    /* A completion's prompt is the client's whole prompt, special tokens
     * written in it included (as llama.cpp's server and vLLM read it); a
     * chat's messages are text, within the template's special tokens, so a
     * message cannot open a turn of another role. */
    rt_text_span *plain = NULL;
    int n_plain = 0;
    if (q->prompt_tokens) {
        int32_t *t = malloc((size_t)q->n_prompt_tokens * sizeof(int32_t));
        if (t)
            memcpy(t, q->prompt_tokens, (size_t)q->n_prompt_tokens * sizeof(int32_t));
        *n = q->n_prompt_tokens;
        if (!t)
            rt_oai_error_set(e, 503, "server_error", NULL, NULL, "out of memory");
        return t;
    }
    if (q->chat) {
        rt_chat_msg *msgs = calloc((size_t)q->n_messages, sizeof(*msgs));
        char err[256];
        if (!msgs) {
            rt_oai_error_set(e, 503, "server_error", NULL, NULL, "out of memory");
            return NULL;
        }
        for (int i = 0; i < q->n_messages; i++)
            msgs[i] = (rt_chat_msg){q->messages[i].role, q->messages[i].content};
        const rt_chat_opts co = {.no_thinking = q->no_thinking};
        int rc = rt_chat_render(w->chat_kind, msgs, q->n_messages, w->bos_text[0] ? w->bos_text : NULL, &co,
                                &text, &plain, &n_plain, err, sizeof(err));
        free(msgs);
        if (rc == -ENOMEM) {
            rt_oai_error_set(e, 503, "server_error", NULL, NULL, "out of memory");
            return NULL;
        }
        if (rc) {
            rt_oai_error_set(e, 400, "invalid_request_error", "messages", NULL, "%s", err);
            return NULL;
        }
        src = text;
    }
    /* A prompt (or template) that writes BOS itself gets no second one. */
    if (w->bos_text[0] && !strncmp(src, w->bos_text, strlen(w->bos_text)))
        bos = false;
    size_t len = strlen(src);
    int32_t *t = encode(w->tok, src, len, bos, plain, n_plain, n);
    free(plain);
    free(text);
    if (*n == 0)
        rt_oai_error_set(e, 400, "invalid_request_error", q->chat ? "messages" : "prompt", NULL,
                         "the prompt encodes to no tokens");
    else if (*n == -ENOMEM)
        rt_oai_error_set(e, 503, "server_error", NULL, NULL, "out of memory");
    else if (!t) /* beyond what the encoder takes (~700 MB), past any sane --max-body */
        rt_oai_error_set(e, 400, "invalid_request_error", q->chat ? "messages" : "prompt", NULL,
                         "the prompt is too long to encode");
    return t;
}

/* A completion request on its way to the scheduler. The loop copies the
 * body (the stream, and with it the request, may close first); the offload
 * thread parses it and encodes the prompt, which for a long prompt takes
 * long enough to hold back every other stream's tokens (~150 ms for 256
 * KiB); the loop then submits it. */
typedef struct wprep {
    gw_offload_job job; /* first */
    wreq *r;            /* the loop's: the offload thread does not touch it */
    worker *w;
    bool chat;
    char *body;
    size_t body_len;
    rt_priority prio;
    int64_t deadline_ms;
    bool parsed, failed; /* q to dispose; e says why */
    rt_oai_request q;
    rt_oai_error e;
    int32_t *toks;
    int n_prompt;
} wprep;

static void wprep_free(wprep *p)
{
    if (p->parsed)
        rt_oai_request_dispose(&p->q);
    free(p->toks);
    free(p->body);
    free(p);
}

/* Offload thread: parse, check the model, encode. Only what the request
 * brought and what never changes (model, tokenizer, template) is read. */
static void prepare(gw_offload_job *job)
{
    wprep *p = (wprep *)job;
    worker *w = p->w;
    p->failed = true;
    /* It may have waited behind long prompts: no parse for a lost cause. */
    if (deadline_passed(p->deadline_ms)) {
        set_deadline_error(&p->e);
        return;
    }
    if (rt_oai_parse(p->body, p->body_len, p->chat, rt_model_hparams(w->model)->n_vocab, &p->q, &p->e))
        return;
    p->parsed = true;
    if (strcmp(p->q.model, w->model_name) != 0) {
        rt_oai_error_set(&p->e, 404, "invalid_request_error", "model", "model_not_found",
                         "the model '%s' does not exist; this worker serves '%s'", p->q.model, w->model_name);
        return;
    }
    if ((p->toks = prompt_tokens(w, &p->q, &p->n_prompt, &p->e)))
        p->failed = false;
}

/* Loop: queues a prepared request, or says why it cannot run. */
static void submit_prepared(worker *w, wprep *p)
{
    wreq *r = p->r;
    rt_oai_request *q = &p->q;
    rt_oai_error e = p->e;
    int n_prompt = p->n_prompt;
    if (p->failed)
        goto fail;
    r->stream_mode = q->stream;
    r->include_usage = q->include_usage;
    r->logprobs = q->logprobs;
    /* Without a seed every request draws anew, as OpenAI's do: a seed of 0
     * for all of them gave the same "random" completion every time. */
    if (!q->has_seed)
        q->sampling.seed = w->next_seed++;
    const char *stops[RT_OAI_MAX_STOPS + 1];
    int n_stops = 0;
    for (int i = 0; i < q->n_stop; i++)
        stops[n_stops++] = q->stop[i];
    if (r->chat && w->turn_stop && !q->ignore_eos) /* ignore_eos: the length asked for */
        stops[n_stops++] = w->turn_stop;
    rt_sched_req sr = {
        .prompt = p->toks,
        .n_prompt = n_prompt,
        .max_tokens = q->max_tokens > 0 ? q->max_tokens : (r->chat ? 0 : 16),
        .sampling = q->sampling,
        .stops = stops,
        .n_stops = n_stops,
        .ignore_eos = q->ignore_eos,
        .logprobs = q->logprobs,
        .top_logprobs = q->top_logprobs,
        .priority = p->prio,
        .deadline_ms = p->deadline_ms,
        .cb = on_sched_event,
        .user = r,
    };
    int ctx = rt_model_hparams(w->model)->n_ctx_train;
    int rc = rt_sched_submit(w->sched, &sr, &r->id);
    switch (rc) {
    case 0:
        r->submitted = true;
        return;
    case -EAGAIN:
        set_queue_full_error(&e);
        break;
    case -E2BIG: {
        /* A field the client did not send is not the one to blame: with
         * /v1/completions' default of 16 new tokens, the prompt is. */
        bool sent = q->max_tokens > 0;
        const char *param = n_prompt < ctx && sent ? q->max_tokens_name : r->chat ? "messages" : "prompt";
        rt_oai_error_set(&e, 400, "invalid_request_error", param, "context_length_exceeded",
                         "this model's maximum context length is %d tokens; the prompt has %d tokens and "
                         "%s asks for %d more",
                         ctx, n_prompt, sent ? q->max_tokens_name : "the default max_tokens (not sent)",
                         sr.max_tokens > 0 ? sr.max_tokens : 0);
        break;
    }
    case -ENOSPC: {
        rt_sched_stats st;
        rt_sched_get_stats(w->sched, &st);
        long long pool = (long long)st.kv_blocks_total * st.kv_block_tokens;
        if (n_prompt >= pool)
            rt_oai_error_set(&e, 503, "server_error", NULL, "kv_cache_too_small",
                             "this worker's KV cache holds %lld tokens, fewer than the prompt's %d", pool,
                             n_prompt);
        else
            rt_oai_error_set(
                &e, 503, "server_error", NULL, "kv_cache_too_small",
                "this worker's KV cache holds %lld tokens; the prompt has %d and max_tokens asks "
                "for %d more",
                pool, n_prompt, sr.max_tokens);
        break;
    }
    default:
        rt_oai_error_set(&e, 503, "server_error", NULL, NULL, "cannot queue the request (%s)", strerror(-rc));
        break;
    }
fail:;
    /* a full queue and a failure to queue pass; a pool too small does not */
    bool busy = e.status == 429 || (e.status == 503 && !(e.code && !strcmp(e.code, "kv_cache_too_small")));
    respond_error_after(r->stream, &e, busy ? retry_after_s(w, p->prio) : 0);
}

static void on_prepared(void *ud, gw_offload_job *job, bool ran)
{
    wprep *p = (wprep *)job;
    wreq *r = p->r;
    r->preparing = false;
    p->w->preparing[p->prio]--;
    if (ran && r->stream)
        submit_prepared(ud, p);
    wprep_free(p);
    wreq_maybe_free(r);
}

static void handle_completion(worker *w, gw_http_stream *s, const gw_http_request *req, bool chat)
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
    if (deadline_passed(deadline)) {
        set_deadline_error(&e);
        respond_error(s, &e);
        return;
    }
    /* A request being prepared counts against its priority's queue limit:
     * past it, it is turned away before its body costs a parse. */
    if (w->preparing[pr] >= rt_sched_room(w->sched, pr)) {
        set_queue_full_error(&e);
        respond_error_after(s, &e, retry_after_s(w, pr));
        return;
    }
    wreq *r = calloc(1, sizeof(*r));
    wprep *p = calloc(1, sizeof(*p));
    char *body = malloc(req->body_len + 1);
    if (!r || !p || !body) {
        free(r);
        free(p);
        free(body);
        rt_oai_error_set(&e, 503, "server_error", NULL, NULL, "out of memory");
        respond_error_after(s, &e, 1);
        return;
    }
    if (req->body_len)
        memcpy(body, req->body, req->body_len);
    r->w = w;
    r->stream = s;
    r->chat = chat;
    r->preparing = true;
    r->created = (long)time(NULL);
    snprintf(r->cid, sizeof(r->cid), "%s-%llx%08llx", chat ? "chatcmpl" : "cmpl",
             (unsigned long long)++w->next_cid, (unsigned long long)r->created);
    *p = (wprep){.r = r,
                 .w = w,
                 .chat = chat,
                 .body = body,
                 .body_len = req->body_len,
                 .prio = pr,
                 .deadline_ms = deadline};
    gw_http_set_user(s, r);
    w->preparing[pr]++;
    gw_offload_submit(w->prep, &p->job, pr == RT_PRIO_INTERACTIVE);
}

static void handle_stats(worker *w, gw_http_stream *s)
{
    rt_sched_stats st;
    rt_sched_get_stats(w->sched, &st);
    /* Requests still being parsed and encoded are queued as far as the
     * gateway's choice of worker goes: a burst counted none of them. */
    st.queued += w->preparing[RT_PRIO_INTERACTIVE] + w->preparing[RT_PRIO_BATCH];
    st.queued_batch += w->preparing[RT_PRIO_BATCH];
    rt_device_info dev;
    rt_model_device_info(w->model, &dev);
    json_t *o = json_pack(
        "{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:I, s:I, s:I, s:s, s:s, "
        "s:s, s:i, s:s}",
        "queued", st.queued, "queued_batch", st.queued_batch, "running", st.running, "kv_blocks_free",
        st.kv_blocks_free, "kv_blocks_total", st.kv_blocks_total, "kv_block_tokens", st.kv_block_tokens,
        "max_seqs", st.max_seqs, "max_queue", st.max_queue, "max_batch_tokens", st.max_batch_tokens,
        "ttft_ewma_ms", st.ttft_ewma_ms, "prefill_ewma_ms", st.prefill_ewma_ms, "tpot_ewma_ms",
        st.tpot_ewma_ms, "tokens_per_s", st.tokens_per_s, "requests_done", (json_int_t)st.requests_done,
        "tokens_generated", (json_int_t)st.tokens_generated, "preemptions", (json_int_t)st.preemptions,
        "device", dev.kind, "model", w->model_name, "backend", rt_model_backend_name(w->model), "threads",
        rt_model_threads(w->model), "kv_type", kn_type_name(st.kv_type));
    /* On a GPU: which one (the MIG slice, if any) and its memory. */
    if (o && strcmp(dev.kind, "cpu") != 0) {
        json_t *d = json_pack("{s:s, s:s, s:s, s:I, s:I, s:I}", "name", dev.name, "uuid", dev.uuid, "mig_profile",
                              dev.mig_profile, "memory_total_bytes", (json_int_t)dev.mem_total,
                              "memory_free_bytes", (json_int_t)dev.mem_free, "weights_bytes",
                              (json_int_t)dev.mem_weights);
        if (d)
            json_object_set_new(o, "device_info", d);
    }
    respond_json(s, 200, o ? json_dumps(o, JSON_COMPACT) : NULL);
    json_decref(o);
}

static void on_request(void *ud, gw_http_stream *s, const gw_http_request *req)
{
    worker *w = ud;
    rt_oai_error e;
    const char *path = req->path;
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
            respond_json(s, 200, rt_oai_models_json(w->model_name, w->created));
            return;
        }
    } else if (plen > sizeof(MODELS_DIR) - 1 && !strncmp(path, MODELS_DIR, sizeof(MODELS_DIR) - 1)) {
        if (get) {
            const char *id = path + sizeof(MODELS_DIR) - 1;
            size_t id_len = plen - (sizeof(MODELS_DIR) - 1);
            if (gw_http_segment_is(id, id_len, w->model_name)) {
                respond_json(s, 200, rt_oai_model_json(w->model_name, w->created));
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
        rt_oai_error_set(&e, 404, "invalid_request_error", NULL, "not_found", "no route for %s %.*s", req->method,
                         (int)plen, path);
        respond_error(s, &e);
        return;
    }
#undef PATH_IS
#undef MODELS_DIR
    rt_oai_error_set(&e, 405, "invalid_request_error", NULL, "method_not_allowed", "%s is not allowed on %.*s",
                     req->method, (int)plen, path);
    respond_error_with(s, &e, &(const gw_http_header){"allow", allow}); /* RFC 9110 15.5.6 */
}

static void on_close(void *ud, gw_http_stream *s, void *stream_ud, bool finished)
{
    worker *w = ud;
    wreq *r = stream_ud;
    if (!r)
        return;
    r->stream = NULL;
    if (r->submitted && !r->final_seen)
        rt_sched_cancel(w->sched, r->id);
    wreq_maybe_free(r);
}

/* ---- lifecycle ---- */

static void on_drain_tick(evutil_socket_t fd, short what, void *arg)
{
    worker *w = arg;
    /* the connections too, as the gateway's: over TCP, one freed with its
     * peer's last frames unread is reset, and the end of its last
     * response lost (each lingers at most 5 s after its GOAWAY) */
    if ((gw_http_server_active_streams(w->http) == 0 && !gw_http_server_has_conns(w->http)) ||
        gw_mono_s() > w->drain_deadline)
        event_base_loopexit(w->base, NULL);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    worker *w = arg;
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

static void usage(FILE *f)
{
    rt_sched_opts d;
    rt_sched_opts_default(&d);
    fprintf(
        f,
        "usage: infergate worker --model FILE --listen unix:PATH|tcp:HOST:PORT [options]\n"
        "Serves one model over HTTP/2 cleartext (OpenAI-compatible), with continuous batching.\n"
        "  --model-name NAME      the id clients use in \"model\" (default: the file name without .gguf)\n"
        "  --device cpu|cuda      where the model runs (default cpu; cuda: the GPU or MIG slice\n"
        "                         CUDA_VISIBLE_DEVICES shows)\n"
        "  --threads N            compute threads (default: one per usable CPU)\n"
        "  --kv-cache-mb M        KV cache pool (default %zu)\n"
        "  --kv-type f16|q8_0     KV cache elements (default f16; q8_0: CPU only, half the memory\n"
        "                         and half the bytes decode attention reads, slightly less precise)\n"
        "  --max-seqs S           sequences decoded together (default %d)\n"
        "  --max-batch-tokens T   tokens per forward pass, prefill chunks included (default %d)\n"
        "  --max-queue Q          requests of a priority waiting; past it 429 (default %d)\n"
        "  --batch-max-wait-ms MS a batch request waiting this long starts in turn with interactive\n"
        "                         ones, oldest first (default %d)\n"
        "  --max-body BYTES       largest request body (default 1048576)\n"
        "  --chat-template NAME   render chats as this family, not as the model's template says,\n"
        "                         one of: " RT_CHAT_KIND_NAMES "\n"
        "  --drain-grace-s S      on SIGTERM, open streams finish within this (default %d)\n",
        d.kv_bytes >> 20, d.max_seqs, d.max_batch_tokens, d.max_queue, d.batch_max_wait_ms, DRAIN_GRACE_S);
}

int gw_cmd_worker(int argc, char **argv)
{
    enum {
        O_NAME = 256,
        O_THREADS,
        O_KV,
        O_KV_TYPE,
        O_SEQS,
        O_BATCH,
        O_QUEUE,
        O_BODY,
        O_DEVICE,
        O_BATCH_WAIT,
        O_GRACE,
        O_CHAT
    };
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"listen", required_argument, 0, 'l'},
        {"model-name", required_argument, 0, O_NAME},
        {"threads", required_argument, 0, O_THREADS},
        {"kv-cache-mb", required_argument, 0, O_KV},
        {"max-seqs", required_argument, 0, O_SEQS},
        {"max-batch-tokens", required_argument, 0, O_BATCH},
        {"max-queue", required_argument, 0, O_QUEUE},
        {"max-body", required_argument, 0, O_BODY},
        {"device", required_argument, 0, O_DEVICE},
        {"kv-type", required_argument, 0, O_KV_TYPE},
        {"batch-max-wait-ms", required_argument, 0, O_BATCH_WAIT},
        {"drain-grace-s", required_argument, 0, O_GRACE},
        {"chat-template", required_argument, 0, O_CHAT},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *model_path = NULL, *listen = NULL, *name = NULL, *device = "cpu";
    long threads = 0, kv_mb = -1, grace = DRAIN_GRACE_S, v;
    int chat_kind = -1; /* -1: the model's template decides */
    rt_sched_opts so;
    rt_sched_opts_default(&so);
    gw_http_limits lim;
    gw_http_limits_default(&lim);
    /* Its one client is its gateway, which multiplexes many requests on a
     * connection and has bounded their bodies already. */
    lim.max_conn_body = SIZE_MAX;
    lim.max_cut_streams = UINT32_MAX; /* its clients' cancellations all come over it */
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:l:h", opts, NULL)) != -1) {
        const char *bad = NULL;
        switch (c) {
        case 'm': model_path = optarg; break;
        case 'l': listen = optarg; break;
        case O_NAME: name = optarg; break;
        case O_DEVICE:
            device = optarg;
            bad = strcmp(device, "cpu") && strcmp(device, "cuda") ? "--device: cpu or cuda" : NULL;
            break;
        case O_THREADS: bad = gw_parse_int(optarg, 1, 1024, &threads) ? "--threads: 1 to 1024" : NULL; break;
        case O_KV: bad = gw_parse_int(optarg, 1, 1 << 20, &kv_mb) ? "--kv-cache-mb: 1 to 1048576" : NULL; break;
        case O_CHAT:
            chat_kind = rt_chat_kind_from_name(optarg);
            bad = chat_kind < 0 ? "--chat-template: one of " RT_CHAT_KIND_NAMES : NULL;
            break;
        case O_KV_TYPE:
            bad = strcmp(optarg, "f16") && strcmp(optarg, "q8_0") ? "--kv-type: f16 or q8_0" : NULL;
            so.kv_type = strcmp(optarg, "q8_0") ? KN_TYPE_F16 : KN_TYPE_Q8_0;
            break;
        case O_SEQS:
            bad = gw_parse_int(optarg, 1, 4096, &v) ? "--max-seqs: 1 to 4096" : NULL;
            so.max_seqs = (int)v;
            break;
        case O_BATCH:
            bad = gw_parse_int(optarg, 1, 1 << 20, &v) ? "--max-batch-tokens: 1 to 1048576" : NULL;
            so.max_batch_tokens = (int)v;
            break;
        case O_QUEUE:
            bad = gw_parse_int(optarg, 0, 1 << 20, &v) ? "--max-queue: 0 to 1048576" : NULL;
            so.max_queue = (int)v;
            break;
        case O_BATCH_WAIT:
            bad = gw_parse_int(optarg, 0, 86400000, &v) ? "--batch-max-wait-ms: 0 to 86400000" : NULL;
            so.batch_max_wait_ms = (int)v;
            break;
        case O_GRACE:
            bad = gw_parse_int(optarg, 0, 86400, &grace) ? "--drain-grace-s: 0 to 86400" : NULL;
            break;
        case O_BODY:
            bad = gw_parse_int(optarg, 1, GW_WORKER_MAX_BODY, &v) ? "--max-body: 1 to 1073741824" : NULL;
            lim.max_body = (size_t)v;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (bad) {
            fprintf(stderr, "worker: %s (got '%s')\n", bad, optarg);
            return 2;
        }
    }
    if (!model_path || !listen || optind != argc) {
        usage(stderr);
        return 2;
    }
    if (kv_mb > 0)
        so.kv_bytes = (size_t)kv_mb << 20;

    /* The compute thread makes the notify event active: libevent must lock. */
    if (evthread_use_pthreads()) {
        fprintf(stderr, "worker: libevent has no pthreads support\n");
        return 1;
    }
    worker w = {0};
    char err[512], namebuf[256];
    int status = 1;
    pthread_mutex_init(&w.mu, NULL);
    rt_model_opts mo = {.n_threads = (int)threads, .device = device};
    if (rt_model_load(model_path, &mo, &w.model, err, sizeof(err))) {
        fprintf(stderr, "worker: %s: %s\n", model_path, err);
        goto out;
    }
    if (!name) {
        snprintf(namebuf, sizeof(namebuf), "%s", model_path);
        char *base = basename(namebuf);
        size_t n = strlen(base);
        if (n > 5 && !strcmp(base + n - 5, ".gguf"))
            base[n - 5] = '\0';
        name = base;
    }
    w.model_name = name;
    w.drain_grace_s = (int)grace;
    w.created = (long)time(NULL);
    if (getrandom(&w.next_seed, sizeof(w.next_seed), GRND_NONBLOCK) != (ssize_t)sizeof(w.next_seed))
        w.next_seed = (uint64_t)w.created ^ ((uint64_t)getpid() << 32);
    /* Completion ids count from a random start, so that two workers (or a
     * restarted one) do not hand out the same id in the same second. */
    w.next_cid = w.next_seed * 0x9E3779B97F4A7C15ull;
    w.tok = rt_model_tokenizer(w.model);
    rt_gguf_str tmpl = {NULL, 0};
    rt_gguf_get_str(rt_model_gguf(w.model), "tokenizer.chat_template", &tmpl);
    bool recognised;
    w.chat_kind = rt_chat_detect(tmpl.p, tmpl.n, &recognised);
    if (chat_kind >= 0)
        w.chat_kind = (rt_chat_kind)chat_kind;
    else if (tmpl.p && !recognised)
        fprintf(stderr, "worker: warning: the model's chat template is none we render; chats are rendered as "
                        "ChatML, which "
                        "this model may not have been trained on. If its template is one of the families we "
                        "know, name it "
                        "with --chat-template (config: chat_template)\n");
    const char *end = rt_chat_turn_end(w.chat_kind);
    const int32_t end_tok = rt_tokenizer_find(w.tok, end);
    w.turn_stop = end_tok >= 0 && rt_tokenizer_is_eog(w.tok, end_tok) ? NULL : end;
    /* A BOS whose text would not read back as it (not a control token, a
     * NUL in it) is added by id instead of written by the template: as
     * text it reached the model as plain characters, and no BOS. */
    int32_t bos = rt_tokenizer_bos(w.tok);
    w.bos_text = rt_tokenizer_text_is_token(w.tok, bos) ? rt_tokenizer_token_text(w.tok, bos) : "";
    if (!(w.sched = rt_sched_new(w.model, &so, err, sizeof(err)))) {
        fprintf(stderr, "worker: %s\n", err);
        goto out;
    }
    w.base = event_base_new();
    gw_http_handler h = {.on_request = on_request, .on_close = on_close};
    if (!w.base || !(w.http = gw_http_server_new(w.base, &lim, &h, &w))) {
        fprintf(stderr, "worker: out of memory\n");
        goto out;
    }
    w.notify = event_new(w.base, -1, 0, on_notify, &w);
    if (!(w.prep = gw_offload_new(w.base, prepare, on_prepared, &w))) {
        fprintf(stderr, "worker: cannot start the request thread\n");
        goto out;
    }
    w.sigterm = evsignal_new(w.base, SIGTERM, on_signal, &w);
    w.sigint = evsignal_new(w.base, SIGINT, on_signal, &w);
    if (!w.notify || !w.sigterm || !w.sigint || event_add(w.sigterm, NULL) || event_add(w.sigint, NULL)) {
        fprintf(stderr, "worker: cannot set up events\n");
        goto out;
    }
    signal(SIGPIPE, SIG_IGN);
    /* The gateway reloads on SIGHUP; `pkill -HUP infergate` reaches its
     * workers too, which have nothing to reload and must not die of it. */
    signal(SIGHUP, SIG_IGN);
    if (gw_http_server_listen(w.http, listen, err, sizeof(err))) {
        fprintf(stderr, "worker: listen %s: %s\n", listen, err);
        goto out;
    }
    rt_sched_stats st;
    rt_sched_get_stats(w.sched, &st);
    rt_device_info dev;
    rt_model_device_info(w.model, &dev);
    char where[512];
    if (strcmp(dev.kind, "cpu"))
        snprintf(where, sizeof(where), "%s %s%s%s (%.0f MiB, %.0f MiB free)", dev.name, dev.uuid,
                 dev.mig_profile[0] ? ", MIG " : "", dev.mig_profile, (double)dev.mem_total / 1048576.0,
                 (double)dev.mem_free / 1048576.0);
    else
        snprintf(where, sizeof(where), "cpu");
    rt_gguf_str pre = {"", 0};
    if (rt_tokenizer_pre_fallback(w.tok) &&
        rt_gguf_get_str(rt_model_gguf(w.model), "tokenizer.ggml.pre", &pre) == 0)
        fprintf(stderr,
                "worker: warning: tokenizer.ggml.pre '%.*s' is not one this build knows: words are split as "
                "GPT-2 "
                "splits them, which may not be how the model was trained\n",
                (int)(pre.n > 64 ? 64 : pre.n), pre.p);
    fprintf(
        stderr,
        "worker: ready: model '%s' (%s, %d layers, ctx %d) on %s, %s kernels, %d threads; KV %d blocks of "
        "%d tokens of %s; chat template %s%s%s%s; listening on %s\n",
        w.model_name, rt_model_hparams(w.model)->arch, rt_model_hparams(w.model)->n_layer,
        rt_model_hparams(w.model)->n_ctx_train, where, rt_model_backend_name(w.model),
        rt_model_threads(w.model), st.kv_blocks_total, st.kv_block_tokens, kn_type_name(st.kv_type),
        rt_chat_kind_name(w.chat_kind),
        chat_kind >= 0          ? " (--chat-template)"
        : tmpl.p && !recognised ? " (unrecognised template: fallback)"
        : tmpl.p                ? ""
                                : " (none in file: fallback)",
        w.turn_stop ? ", turns end at the text " : "", w.turn_stop ? w.turn_stop : "", listen);
    event_base_dispatch(w.base);
    status = 0;
out:
    /* The server first (its streams close and cancel), then the requests
     * being prepared (their streams are gone), then the scheduler (its last
     * events land in the queue), then the queue. */
    if (w.http)
        gw_http_server_free(w.http);
    gw_offload_free(w.prep);
    rt_sched_free(w.sched);
    if (w.base)
        on_notify(-1, 0, &w);
    if (w.notify)
        event_free(w.notify);
    if (w.sigterm)
        event_free(w.sigterm);
    if (w.sigint)
        event_free(w.sigint);
    if (w.drain_timer)
        event_free(w.drain_timer);
    if (w.base)
        event_base_free(w.base);
    rt_model_free(w.model);
    pthread_mutex_destroy(&w.mu);
    return status;
}
