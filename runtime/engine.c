/* The engine's life, admission, submission and events (see engine.h); the
 * prompt path is engine_prompt.c. Scheduler events cross from the compute
 * thread to the owner through a mutex-protected queue, copied, as the
 * scheduler's callbacks must not block or keep what they are given. */
#include "runtime/engine_internal.h"

#include "gateway/base/clock.h"
#include "runtime/gguf.h"
#include "runtime/tokenizer.h"

#include <errno.h>
#include <limits.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* One submitted request, until its final event is delivered. */
typedef struct ereq {
    rt_engine *e;
    void *user;
    atomic_bool text_lost; /* the compute thread could not queue a TEXT event */
} ereq;

/* A scheduler event copied for the owner thread. */
struct rt_engine_qev {
    rt_engine_qev *next;
    ereq *r;
    rt_sched_event ev;
    char text[]; /* then, when ev.logprobs is set, the rt_token_logprobs it points to */
};

/* ---- options ---- */

void rt_engine_opts_default(rt_engine_opts *o)
{
    *o = (rt_engine_opts){.model = {.n_threads = (int)rt_eopt_defs[RT_EOPT_THREADS].dflt},
                          .chat_kind = (int)rt_eopt_defs[RT_EOPT_CHAT_TEMPLATE].dflt};
    rt_sched_opts_default(&o->sched);
}

void rt_engine_opts_set(rt_engine_opts *o, rt_eopt id, long long v)
{
    switch (id) {
    case RT_EOPT_THREADS:
        o->model.n_threads = (int)v;
        break;
    case RT_EOPT_KV_CACHE_MB:
        o->sched.kv_bytes = (size_t)v << 20;
        break;
    case RT_EOPT_KV_TYPE:
        o->sched.kv_type = rt_eopt_kv_type(v);
        break;
    case RT_EOPT_MAX_SEQS:
        o->sched.max_seqs = (int)v;
        break;
    case RT_EOPT_MAX_BATCH_TOKENS:
        o->sched.max_batch_tokens = (int)v;
        break;
    case RT_EOPT_MAX_QUEUE:
        o->sched.max_queue = (int)v;
        break;
    case RT_EOPT_BATCH_MAX_WAIT_MS:
        o->sched.batch_max_wait_ms = (int)v;
        break;
    case RT_EOPT_PROMPT_MAX_WAIT_MS:
        o->sched.prompt_max_wait_ms = (int)v;
        break;
    case RT_EOPT_CHAT_TEMPLATE:
        o->chat_kind = (int)v;
        break;
    case RT_EOPT_PREFIX_CACHE:
        o->sched.prefix_cache = v != 0;
        break;
    case RT_EOPT_N:
        break;
    }
}

/* ---- errors ---- */

void rt_engine_error_oom(rt_oai_error *err)
{
    rt_oai_error_set(err, 503, "server_error", NULL, NULL, "out of memory");
}

void rt_engine_error_deadline(rt_oai_error *err)
{
    rt_oai_error_set(err, 504, "timeout_error", NULL, "deadline_exceeded",
                     "the request's deadline passed before it could start");
}

bool rt_engine_deadline_passed(int64_t deadline_ms)
{
    return deadline_ms && gw_epoch_ms() > deadline_ms;
}

static void error_queue_full(rt_oai_error *err)
{
    rt_oai_error_set(err, 429, "rate_limit_error", NULL, "queue_full",
                     "the worker's queue is full; retry shortly");
}

/* Seconds until a turned-away request would likely find room: the queue
 * ahead (for an interactive request, the interactive requests; for a batch
 * one, all) drained max_seqs at a time, each request taking what the
 * recent finished ones took once admitted (first token, then its share of
 * tokens at the per-token pace). Not the TTFT clients see: it holds the
 * queueing this already counts. A constant 1 told a thousand clients to
 * come back together in a second, whatever the backlog. 1 to 60. */
static int time_to_room(rt_engine *e, rt_priority prio)
{
    rt_sched_stats st = {0};
    if (e->sched)
        rt_sched_get_stats(e->sched, &st);
    double per_req = st.requests_done ? (double)st.done_tokens / (double)st.requests_done : 0.0;
    double req_s = (st.prefill_ewma_ms + per_req * st.tpot_ewma_ms) * 1e-3;
    int ahead = prio == RT_PRIO_BATCH ? st.queued : st.queued - st.queued_batch;
    double wait = (double)(ahead + 1) / (st.max_seqs > 0 ? st.max_seqs : 1) * req_s;
    return wait < 1.0 ? 1 : wait > 60.0 ? 60 : (int)ceil(wait);
}

int rt_engine_retry_after(rt_engine *e, const rt_oai_error *err, rt_priority prio)
{
    /* a full queue and a failure to queue pass; a pool too small does not */
    bool busy = err->status == 429 ||
                (err->status == 503 && !(err->code && !strcmp(err->code, "kv_cache_too_small")));
    return busy ? time_to_room(e, prio) : 0;
}

/* ---- life ---- */

/* A model template that did not parse (why) falls back on the family its
 * text is recognised as, ChatML failing that. */
static void warn_template(rt_engine *e, const char *why)
{
    if (e->chat_forced || !e->tmpl_present || e->tmpl || !why)
        return;
    if (e->tmpl_recognised) {
        snprintf(e->warnings[e->n_warnings++], RT_ENGINE_WARNING_MAX,
                 "the model's chat template does not parse (%s); chats are rendered by the built-in %s family "
                 "it resembles",
                 why, rt_chat_kind_name(e->chat_kind));
        return;
    }
    snprintf(
        e->warnings[e->n_warnings++], RT_ENGINE_WARNING_MAX,
        "the model's chat template is none we render (%s); chats are rendered as ChatML, which this model "
        "may not have been trained on. Name a family or a Jinja file with --%s (config: %s)",
        why, rt_eopt_defs[RT_EOPT_CHAT_TEMPLATE].flag, rt_eopt_defs[RT_EOPT_CHAT_TEMPLATE].key);
}

/* A file's bytes, malloc'd (NUL-terminated, length in *len); NULL with
 * errno set. */
static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            if (cap > RT_JINJA_MAX_SOURCE) {
                errno = EFBIG;
                break;
            }
            char *more = realloc(buf, cap = cap ? cap * 2 : 65536);
            if (!more)
                break;
            buf = more;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) {
            if (!ferror(f)) {
                fclose(f);
                buf[n] = '\0';
                *len = n;
                return buf;
            }
            break;
        }
    }
    int saved = errno ? errno : EIO;
    fclose(f);
    free(buf);
    errno = saved;
    return NULL;
}

/* A template whose whole text is a family's name is that family (chat.h):
 * no Jinja. */
static bool names_a_family(const char *tmpl, size_t len)
{
    char name[32];
    if (len == 0 || len >= sizeof(name))
        return false;
    memcpy(name, tmpl, len);
    name[len] = '\0';
    return rt_chat_kind_from_name(name) >= 0;
}

/* The Jinja templates: the file's, else the model's and its tool_use one.
 * 0, or for the file a negative code with err filled; the model's that do
 * not parse leave *why filled (and tmpl NULL) for the warning. */
static int load_templates(rt_engine *e, const rt_engine_opts *o, const char *tmpl, size_t len, char *why,
                          size_t why_len, char *err, size_t err_len)
{
    why[0] = '\0';
    if (e->chat_forced || !tmpl || names_a_family(tmpl, len))
        return 0;
    int rc = rt_jinja_parse(tmpl, len, &e->tmpl, why, why_len);
    if (rc && o->chat_template_path) {
        snprintf(err, err_len, "%s: %s", o->chat_template_path, why);
        return rc;
    }
    if (rc == -ENOMEM) {
        snprintf(err, err_len, "out of memory parsing the chat template");
        return rc;
    }
    rt_gguf_str tools = {NULL, 0};
    if (o->chat_template_path ||
        rt_gguf_get_str(rt_model_gguf(e->model), "tokenizer.chat_template.tool_use", &tools) || !tools.p)
        return 0;
    char tools_why[256];
    if (rt_jinja_parse(tools.p, tools.n, &e->tmpl_tools, tools_why, sizeof(tools_why)) == 0 || e->n_warnings >= 2)
        return 0;
    snprintf(e->warnings[e->n_warnings++], RT_ENGINE_WARNING_MAX,
             "the model's tool_use chat template does not parse (%s): requests with tools render through its "
             "default template",
             tools_why);
    return 0;
}

static void warn_pre(rt_engine *e)
{
    rt_gguf_str pre = {"", 0};
    if (!rt_tokenizer_pre_fallback(e->tok) ||
        rt_gguf_get_str(rt_model_gguf(e->model), "tokenizer.ggml.pre", &pre))
        return;
    snprintf(e->warnings[e->n_warnings++], RT_ENGINE_WARNING_MAX,
             "tokenizer.ggml.pre '%.*s' is not one this build knows: words are split as GPT-2 splits them, "
             "which may not be how the model was trained",
             (int)(pre.n > 64 ? 64 : pre.n), pre.p);
}

/* The format the model writes tool calls in: as its templates' text
 * shows them (the tool_use one's first), else as its family's. */
static rt_tc_format tool_format(const rt_engine *e, const char *tmpl, size_t len)
{
    rt_gguf_str tools = {NULL, 0};
    rt_gguf_get_str(rt_model_gguf(e->model), "tokenizer.chat_template.tool_use", &tools);
    if (tools.p && rt_tc_detect(tools.p, tools.n) != RT_TC_HERMES)
        return rt_tc_detect(tools.p, tools.n);
    if (tmpl && rt_tc_detect(tmpl, len) != RT_TC_HERMES)
        return rt_tc_detect(tmpl, len);
    switch (e->chat_kind) {
    case RT_CHAT_LLAMA31:
    case RT_CHAT_LLAMA32:
        return RT_TC_LLAMA3;
    case RT_CHAT_MISTRAL_V3:
    case RT_CHAT_MISTRAL_V3_TEKKEN:
    case RT_CHAT_MISTRAL_V7:
    case RT_CHAT_MISTRAL_V7_TEKKEN:
        return RT_TC_MISTRAL;
    default:
        return RT_TC_HERMES;
    }
}

/* The templates chats are rendered through (see rt_engine_load), and
 * what ends a turn. 0, or a negative code with err filled (a template
 * file that cannot be read or parsed). */
static int settle_chat(rt_engine *e, const rt_engine_opts *o, char *err, size_t err_len)
{
    rt_gguf_str tmpl = {NULL, 0};
    char *file = NULL, why[256];
    e->chat_forced = o->chat_kind >= 0;
    if (o->chat_template_path && !e->chat_forced) {
        size_t len;
        if (!(file = read_file(o->chat_template_path, &len))) {
            snprintf(err, err_len, "%s: %s", o->chat_template_path, strerror(errno));
            return -errno;
        }
        tmpl = (rt_gguf_str){file, len};
        if (!(e->tmpl_file = strdup(o->chat_template_path))) {
            free(file);
            snprintf(err, err_len, "out of memory");
            return -ENOMEM;
        }
    } else {
        rt_gguf_get_str(rt_model_gguf(e->model), "tokenizer.chat_template", &tmpl);
    }
    e->tmpl_present = tmpl.p != NULL;
    e->chat_kind = rt_chat_detect(tmpl.p, tmpl.n, &e->tmpl_recognised);
    if (e->chat_forced)
        e->chat_kind = (rt_chat_kind)o->chat_kind;
    e->tc_format = tool_format(e, tmpl.p, tmpl.n);
    e->thinks = rt_think_template(tmpl.p, tmpl.n) || e->chat_kind == RT_CHAT_QWEN3 ||
                e->chat_kind == RT_CHAT_QWEN3_THINKING;
    int rc = load_templates(e, o, tmpl.p, tmpl.n, why, sizeof(why), err, err_len);
    free(file);
    if (rc)
        return rc;
    warn_template(e, why[0] ? why : NULL);
    const char *end = rt_chat_turn_end(e->chat_kind);
    const int32_t end_tok = rt_tokenizer_find(e->tok, end);
    e->turn_stop = end_tok >= 0 && rt_tokenizer_is_eog(e->tok, end_tok) ? NULL : end;
    /* A BOS whose text would not read back as it (not a control token, a
     * NUL in it) is added by id instead of written by the template: as
     * text it reached the model as plain characters, and no BOS. */
    int32_t bos = rt_tokenizer_bos(e->tok), eos = rt_tokenizer_eos(e->tok);
    e->bos_text = rt_tokenizer_text_is_token(e->tok, bos) ? rt_tokenizer_token_text(e->tok, bos) : "";
    e->eos_text = rt_tokenizer_text_is_token(e->tok, eos) ? rt_tokenizer_token_text(e->tok, eos) : "";
    return 0;
}

/* The file name without .gguf. */
static char *name_of_file(const char *path)
{
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", path);
    char *base = basename(buf);
    size_t n = strlen(base);
    if (n > 5 && !strcmp(base + n - 5, ".gguf"))
        base[n - 5] = '\0';
    return strdup(base);
}

int rt_engine_load(const rt_engine_opts *o, rt_engine **out, char *err, size_t err_len)
{
    rt_engine *e = calloc(1, sizeof(*e));
    char why[512];
    if (!e) {
        snprintf(err, err_len, "out of memory");
        return -ENOMEM;
    }
    int rc = rt_model_load(o->model_path, &o->model, &e->model, why, sizeof(why));
    if (rc) {
        snprintf(err, err_len, "%s: %s", o->model_path, why);
        free(e);
        return rc;
    }
    e->model_name = o->model_name ? strdup(o->model_name) : name_of_file(o->model_path);
    if (!e->model_name) {
        rt_model_free(e->model);
        free(e);
        snprintf(err, err_len, "out of memory");
        return -ENOMEM;
    }
    e->created = (long)time(NULL);
    uint64_t seed;
    if (getrandom(&seed, sizeof(seed), GRND_NONBLOCK) != (ssize_t)sizeof(seed))
        seed = (uint64_t)e->created ^ ((uint64_t)getpid() << 32);
    atomic_init(&e->next_seed, seed);
    /* Response ids count from a random start, so that two workers (or a
     * restarted one) do not hand out the same id in the same second. */
    e->next_cid = seed * 0x9E3779B97F4A7C15ull;
    e->tok = rt_model_tokenizer(e->model);
    rc = settle_chat(e, o, err, err_len);
    /* a trie of the vocabulary's texts, for grammars */
    if (!rc && !(e->gvocab = rt_gvocab_new(e->tok))) {
        snprintf(err, err_len, "out of memory");
        rc = -ENOMEM;
    }
    if (rc) {
        rt_jinja_free(e->tmpl);
        rt_jinja_free(e->tmpl_tools);
        free(e->tmpl_file);
        free(e->model_name);
        rt_model_free(e->model);
        free(e);
        return rc;
    }
    warn_pre(e);
    pthread_mutex_init(&e->mu, NULL);
    pthread_mutex_init(&e->gmu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&e->cv, &ca);
    pthread_condattr_destroy(&ca);
    *out = e;
    return 0;
}

int rt_engine_start(rt_engine *e, const rt_sched_opts *so, char *err, size_t err_len)
{
    if (e->sched) {
        snprintf(err, err_len, "the engine is running already");
        return -EALREADY;
    }
    if (!(e->sched = rt_sched_new(e->model, so, err, err_len)))
        return -ENOMEM;
    return 0;
}

int rt_engine_new(const rt_engine_opts *o, rt_engine **out, char *err, size_t err_len)
{
    int rc = rt_engine_load(o, out, err, err_len);
    if (rc)
        return rc;
    if ((rc = rt_engine_start(*out, &o->sched, err, err_len))) {
        rt_engine_free(*out);
        *out = NULL;
    }
    return rc;
}

void rt_engine_stop(rt_engine *e)
{
    rt_sched_free(e->sched);
    e->sched = NULL;
}

void rt_engine_free(rt_engine *e)
{
    if (!e)
        return;
    rt_engine_stop(e);
    for (rt_engine_qev *q = e->head, *next; q; q = next) {
        next = q->next;
        if (q->ev.kind != RT_EV_TEXT)
            free(q->r);
        free(q);
    }
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    rt_engine_grammars_free(e);
    pthread_mutex_destroy(&e->gmu);
    rt_jinja_free(e->tmpl);
    rt_jinja_free(e->tmpl_tools);
    rt_gvocab_free(e->gvocab);
    free(e->tmpl_file);
    free(e->model_name);
    rt_model_free(e->model);
    free(e);
}

rt_tc_format rt_engine_tool_format(const rt_engine *e)
{
    return e->tc_format;
}

const char *rt_engine_model_name(const rt_engine *e)
{
    return e->model_name;
}

long rt_engine_created(const rt_engine *e)
{
    return e->created;
}

const rt_model *rt_engine_model(const rt_engine *e)
{
    return e->model;
}

const rt_tokenizer *rt_engine_tokenizer(const rt_engine *e)
{
    return e->tok;
}

const char *rt_engine_warning(const rt_engine *e, int i)
{
    return i >= 0 && i < e->n_warnings ? e->warnings[i] : NULL;
}

void rt_engine_describe(const rt_engine *e, char *buf, size_t len)
{
    rt_sched_stats st = {0};
    if (e->sched)
        rt_sched_get_stats(e->sched, &st);
    rt_device_info dev;
    rt_model_device_info(e->model, &dev);
    char where[512];
    if (strcmp(dev.kind, "cpu"))
        snprintf(where, sizeof(where), "%s %s%s%s (%.0f MiB, %.0f MiB free)", dev.name, dev.uuid,
                 dev.mig_profile[0] ? ", MIG " : "", dev.mig_profile, (double)dev.mem_total / 1048576.0,
                 (double)dev.mem_free / 1048576.0);
    else
        snprintf(where, sizeof(where), "cpu");
    const rt_hparams *hp = rt_model_hparams(e->model);
    snprintf(
        buf, len,
        "model '%s' (%s, %d layers, ctx %d) on %s, %s kernels, %d threads; KV %d blocks of %d tokens of %s; "
        "prefix cache %s; chat template %s%s%s%s",
        e->model_name, hp->arch, hp->n_layer, hp->n_ctx_train, where, rt_model_backend_name(e->model),
        rt_model_threads(e->model), st.kv_blocks_total, st.kv_block_tokens, kn_type_name(st.kv_type),
        st.prefix_cache ? "on" : "off",
        e->tmpl_file ? e->tmpl_file : e->tmpl ? "the model's" : rt_chat_kind_name(e->chat_kind),
        e->tmpl_tools                            ? " (Jinja, and its tool_use one for tools)"
        : e->tmpl                                ? " (Jinja)"
        : e->chat_forced                         ? " (--chat-template)"
        : e->tmpl_present && !e->tmpl_recognised ? " (unrecognised template: fallback)"
        : e->tmpl_present                        ? ""
                                                 : " (none in file: fallback)",
        e->turn_stop ? ", turns end at the text " : "", e->turn_stop ? e->turn_stop : "");
}

/* ---- admission and submission ---- */

int rt_engine_admit(rt_engine *e, rt_priority prio, int64_t deadline_ms, const char *tenant, double weight,
                    rt_oai_error *err, int *retry_after_s)
{
    *retry_after_s = 0;
    if (rt_engine_deadline_passed(deadline_ms)) {
        rt_engine_error_deadline(err);
        return -ETIMEDOUT;
    }
    /* A request being prepared counts against its priority's queue limit:
     * past it, it is turned away before its body costs a parse. */
    if (!e->sched || (e->admitted[prio] >= rt_sched_room(e->sched, prio) &&
                      !rt_sched_may_push_out(e->sched, prio, tenant, weight))) {
        error_queue_full(err);
        *retry_after_s = time_to_room(e, prio);
        return -EAGAIN;
    }
    e->admitted[prio]++;
    return 0;
}

void rt_engine_release(rt_engine *e, rt_priority prio)
{
    e->admitted[prio]--;
}

/* Says why the scheduler refused req (rt_sched_submit's rc). */
static void refusal(rt_engine *e, int rc, const rt_engine_req *req, rt_oai_error *err)
{
    const rt_oai_request *q = &req->q;
    const int n_prompt = req->run.n_prompt, ctx = rt_model_hparams(e->model)->n_ctx_train;
    switch (rc) {
    case -EAGAIN:
        error_queue_full(err);
        break;
    case -E2BIG: {
        /* A field the client did not send is not the one to blame: with
         * /v1/completions' default of 16 new tokens, the prompt is. */
        bool sent = q->max_tokens > 0;
        const char *param = n_prompt < ctx && sent ? q->max_tokens_name : q->chat ? "messages" : "prompt";
        rt_oai_error_set(err, 400, "invalid_request_error", param, "context_length_exceeded",
                         "this model's maximum context length is %d tokens; the prompt has %d tokens and "
                         "%s asks for %d more",
                         ctx, n_prompt, sent ? q->max_tokens_name : "the default max_tokens (not sent)",
                         req->run.max_tokens > 0 ? req->run.max_tokens : 0);
        break;
    }
    case -ENOSPC: {
        rt_sched_stats st;
        rt_engine_stats(e, &st);
        long long pool = (long long)st.kv_blocks_total * st.kv_block_tokens;
        if (n_prompt >= pool)
            rt_oai_error_set(err, 503, "server_error", NULL, "kv_cache_too_small",
                             "this worker's KV cache holds %lld tokens, fewer than the prompt's %d", pool,
                             n_prompt);
        else
            rt_oai_error_set(
                err, 503, "server_error", NULL, "kv_cache_too_small",
                "this worker's KV cache holds %lld tokens; the prompt has %d and max_tokens asks "
                "for %d more",
                pool, n_prompt, req->run.max_tokens);
        break;
    }
    case -EILSEQ:
    case -ENOTSUP:
    case -EINVAL:
        if (req->run.n_resume) {
            rt_oai_error_set(err, 400, "invalid_request_error", NULL, "resume_refused",
                             "x-infergate-resume: this request cannot be resumed (%s)",
                             rc == -EILSEQ    ? "a resumed token is not in the grammar's language"
                             : rc == -ENOTSUP ? "the log-probabilities of resumed tokens whose text was held "
                                                "back went with the failed run"
                                              : "the resumed tokens had ended the answer or are out of range");
            break;
        }
        /* fall through */
    default:
        rt_oai_error_set(err, 503, "server_error", NULL, NULL, "cannot queue the request (%s)",
                         strerror(-rc));
        break;
    }
}

static void on_sched_event(void *user, const rt_sched_event *ev);

int rt_engine_submit(rt_engine *e, const rt_engine_req *req, void *user, uint64_t *id, rt_oai_error *err,
                     int *retry_after_s)
{
    ereq *r = calloc(1, sizeof(*r));
    int rc = -ENOMEM;
    if (r) {
        r->e = e;
        r->user = user;
        atomic_init(&r->text_lost, false);
        rt_sched_req sr = req->run;
        sr.cb = on_sched_event;
        sr.user = r;
        rc = e->sched ? rt_sched_submit(e->sched, &sr, id) : -ESHUTDOWN;
    }
    if (rc == 0)
        return 0;
    free(r);
    refusal(e, rc, req, err);
    *retry_after_s = rt_engine_retry_after(e, err, req->run.priority);
    return rc;
}

void rt_engine_cancel(rt_engine *e, uint64_t id)
{
    if (e->sched)
        rt_sched_cancel(e->sched, id);
}

int rt_engine_hold(rt_engine *e, uint64_t id, bool hold)
{
    return e->sched ? rt_sched_hold(e->sched, id, hold) : 0;
}

/* ---- events ---- */

/* Compute thread (or rt_sched_free's caller): copies ev for the owner. */
static void on_sched_event(void *user, const rt_sched_event *ev)
{
    ereq *r = user;
    rt_engine *e = r->e;
    const size_t lp_at =
        (ev->text_len + 1 + _Alignof(rt_token_logprobs) - 1) & ~(_Alignof(rt_token_logprobs) - 1);
    const size_t size =
        sizeof(rt_engine_qev) + (ev->logprobs ? lp_at + sizeof(rt_token_logprobs) : ev->text_len + 1);
    rt_engine_qev *q = malloc(size);
    if (!q) {
        /* A lost TEXT event would leave a hole in the text: the request is
         * stopped and its final event made an error instead. Losing the
         * final event would leak the request, so it is retried until it
         * fits. */
        if (ev->kind == RT_EV_TEXT) {
            atomic_store(&r->text_lost, true);
            rt_sched_cancel(e->sched, ev->id);
            return;
        }
        while (!(q = malloc(size)))
            nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    q->next = NULL;
    q->r = r;
    q->ev = *ev;
    if (ev->text_len)
        memcpy(q->text, ev->text, ev->text_len);
    q->text[ev->text_len] = '\0';
    q->ev.text = q->text;
    if (ev->logprobs) {
        rt_token_logprobs *lp = (rt_token_logprobs *)(void *)(q->text + lp_at);
        *lp = *ev->logprobs;
        q->ev.logprobs = lp;
    }
    pthread_mutex_lock(&e->mu);
    if (e->tail)
        e->tail->next = q;
    else
        e->head = q;
    e->tail = q;
    void (*wake)(void *) = e->wake;
    void *wake_arg = e->wake_arg;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (wake)
        wake(wake_arg);
}

void rt_engine_set_wake(rt_engine *e, void (*fn)(void *arg), void *arg)
{
    pthread_mutex_lock(&e->mu);
    e->wake = fn;
    e->wake_arg = arg;
    pthread_mutex_unlock(&e->mu);
}

/* The error a failed request answers with; returns its Retry-After. */
static int event_error(const rt_sched_event *ev, rt_oai_error *err, bool *device_lost)
{
    switch (ev->error) {
    case -ETIMEDOUT:
        rt_engine_error_deadline(err);
        return 0;
    case -EAGAIN: /* pushed out of the full queue by another tenant's request (sched.h) */
        rt_oai_error_set(err, 429, "rate_limit_error", NULL, "queue_full",
                         "the worker's queue is full, and this request's place went to another tenant's; "
                         "retry shortly");
        return 1;
    case -ENOMEM:
        rt_oai_error_set(err, 503, "server_error", NULL, NULL, "out of memory while running the model");
        return 1;
    case -ENOTRECOVERABLE:
        rt_oai_error_set(err, 503, "server_error", NULL, NULL, "the device failed; this worker restarts");
        *device_lost = true;
        return 1;
    default:
        rt_oai_error_set(err, 500, "server_error", NULL, NULL, "the model failed to run this request (%s)",
                         strerror(-ev->error));
        return 0;
    }
}

/* Waits for the queue to fill, at most timeout_ms (-1: for ever); takes
 * its first max events. */
static rt_engine_qev *take_events(rt_engine *e, int timeout_ms, int max)
{
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&e->mu);
    int rc = 0;
    while (!e->head && timeout_ms != 0 && rc == 0)
        rc = timeout_ms < 0 ? pthread_cond_wait(&e->cv, &e->mu)
                            : pthread_cond_timedwait(&e->cv, &e->mu, &until);
    rt_engine_qev *q = e->head, *last = q;
    for (int n = 1; last && n < max; n++)
        last = last->next;
    if (last && last->next) {
        e->head = last->next;
        last->next = NULL;
    } else {
        e->head = e->tail = NULL;
    }
    pthread_mutex_unlock(&e->mu);
    return q;
}

int rt_engine_poll(rt_engine *e, int timeout_ms, rt_engine_event_fn fn, void *arg)
{
    return rt_engine_poll_max(e, timeout_ms, INT_MAX, fn, arg);
}

int rt_engine_poll_max(rt_engine *e, int timeout_ms, int max, rt_engine_event_fn fn, void *arg)
{
    int n = 0;
    for (rt_engine_qev *q = take_events(e, timeout_ms, max > 0 ? max : 1), *next; q; q = next) {
        next = q->next;
        ereq *r = q->r;
        const bool final = q->ev.kind != RT_EV_TEXT;
        rt_oai_error err;
        rt_engine_event out = {.user = r->user, .ev = q->ev};
        if (atomic_load(&r->text_lost)) {
            /* Events after the lost one are dropped, and those before it
             * not yet delivered: never a text with a hole. */
            if (!final) {
                free(q);
                continue;
            }
            out.ev.kind = RT_EV_ERROR;
            out.ev.error = -ENOMEM;
            rt_oai_error_set(&err, 503, "server_error", NULL, NULL, "out of memory while generating");
            out.error = &err;
        } else if (q->ev.kind == RT_EV_ERROR) {
            out.retry_after_s = event_error(&q->ev, &err, &out.device_lost);
            out.error = &err;
        }
        /* An end-of-generation token is no part of the answer. */
        if (out.ev.logprobs && rt_tokenizer_is_eog(e->tok, out.ev.token))
            out.ev.logprobs = NULL;
        fn(arg, &out);
        n++;
        if (final)
            free(r);
        free(q);
    }
    return n;
}

/* ---- figures ---- */

int rt_engine_tenants(rt_engine *e, rt_sched_tenant_stats *out, int max)
{
    return e->sched ? rt_sched_tenants(e->sched, out, max) : 0;
}

void rt_engine_stats(rt_engine *e, rt_sched_stats *st)
{
    if (!e->sched) {
        *st = (rt_sched_stats){0};
        return;
    }
    rt_sched_get_stats(e->sched, st);
    /* Requests still being parsed and encoded are queued as far as the
     * gateway's choice of worker goes: a burst counted none of them. */
    st->queued += e->admitted[RT_PRIO_INTERACTIVE] + e->admitted[RT_PRIO_BATCH];
    st->queued_batch += e->admitted[RT_PRIO_BATCH];
}

void rt_engine_response_id(rt_engine *e, bool chat, char *id, size_t id_len, long *created)
{
    *created = (long)time(NULL);
    snprintf(id, id_len, "%s-%llx%08llx", chat ? "chatcmpl" : "cmpl", (unsigned long long)++e->next_cid,
             (unsigned long long)*created);
}
