/* `infergate generate`: one prompt, offline, with timing — the quickest
 * check that a model loads and computes, and the hook for comparing
 * numerics with other engines (--prompt-tokens, --show-tokens,
 * --dump-logits). It runs through the engine a worker runs (the same
 * tokenization, chat template, stop strings and scheduler), as a request
 * of its own. */
#include "gateway/cmd/cli.h"
#include "gateway/base/clock.h"
#include "gateway/base/num.h"

#include "runtime/chat.h"
#include "runtime/engine.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_STOPS RT_OAI_MAX_STOPS /* as a request's */
#define PREFILL_CHUNK 512

typedef struct gen_args {
    const char *model, *prompt, *prompt_tokens, *dump_logits, *device;
    long n_predict, threads;
    bool show_tokens, ignore_eos, reference, chat;
    int chat_kind; /* -1: the model's template */
    const char *chat_template_path; /* a Jinja file, or NULL */
    rt_sampler_params sp;
    char *stops[MAX_STOPS];
    int n_stops;
} gen_args;

static void usage(FILE *f)
{
    fprintf(f, "usage: infergate generate --model FILE (--prompt TEXT | --prompt-tokens 1,15,27) [options]\n"
               "  -n, --n-predict N        tokens to generate (default 64)\n"
               "  --temp T                 temperature, 0 = greedy (default 0)\n"
               "  --top-k K, --top-p P, --min-p P\n"
               "  --seed N                 sampling seed (default 0)\n"
               "  --presence-penalty X, --frequency-penalty X\n"
               "  --stop STR               stop string (repeatable, up to 4)\n"
               "  --chat                   the prompt is a user message, rendered with the chat template\n"
               "  --chat-template NAME|FILE render it as this family, or through this Jinja file\n"
               "  --threads N              compute threads (default: one per usable CPU)\n"
               "  --reference              scalar reference kernels (slow; for checks)\n"
               "  --device cpu|cuda        where the model runs (default cpu)\n"
               "  --prompt-tokens LIST     prompt as token ids, no tokenizer, BOS only if listed\n"
               "  --show-tokens            print the generated token ids\n"
               "  --dump-logits FILE       write the logits of the last prompt position, one per line\n"
               "  --ignore-eos             keep generating past end-of-generation tokens\n");
}

static int parse_args(int argc, char **argv, gen_args *a)
{
    enum { O_TEMP = 256, O_TOPK, O_TOPP, O_MINP, O_SEED, O_PP, O_FP, O_STOP, O_THREADS, O_REF, O_PT, O_SHOW,
           O_DUMP, O_IGN, O_DEVICE, O_CHAT, O_CHAT_TMPL };
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},    {"prompt", required_argument, 0, 'p'},
        {"n-predict", required_argument, 0, 'n'}, {"temp", required_argument, 0, O_TEMP},
        {"top-k", required_argument, 0, O_TOPK}, {"top-p", required_argument, 0, O_TOPP},
        {"min-p", required_argument, 0, O_MINP}, {"seed", required_argument, 0, O_SEED},
        {"presence-penalty", required_argument, 0, O_PP}, {"frequency-penalty", required_argument, 0, O_FP},
        {"stop", required_argument, 0, O_STOP}, {"threads", required_argument, 0, O_THREADS},
        {"reference", no_argument, 0, O_REF},    {"prompt-tokens", required_argument, 0, O_PT},
        {"show-tokens", no_argument, 0, O_SHOW}, {"dump-logits", required_argument, 0, O_DUMP},
        {"ignore-eos", no_argument, 0, O_IGN},   {"device", required_argument, 0, O_DEVICE},
        {"chat", no_argument, 0, O_CHAT},       {"chat-template", required_argument, 0, O_CHAT_TMPL},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    memset(a, 0, sizeof(*a));
    a->n_predict = 64;
    a->chat_kind = -1;
    rt_sampler_params_default(&a->sp);
    a->sp.temperature = 0.0f;
    optind = 1;
    int c;
    double d;
    long v;
    while ((c = getopt_long(argc, argv, "m:p:n:h", opts, NULL)) != -1) {
        const char *bad = NULL;
        switch (c) {
        case 'm': a->model = optarg; break;
        case 'p': a->prompt = optarg; break;
        case 'n':
            if (gw_parse_int(optarg, 1, 1 << 24, &a->n_predict))
                bad = "-n must be a whole number from 1 to 16777216";
            break;
        case O_TEMP:
            if (gw_parse_float(optarg, &d) || d < 0)
                bad = "--temp must be a number >= 0";
            a->sp.temperature = (float)d;
            break;
        case O_TOPK:
            if (gw_parse_int(optarg, 0, 1 << 24, &v))
                bad = "--top-k must be a whole number >= 0";
            a->sp.top_k = (int)v;
            break;
        case O_TOPP:
            if (gw_parse_float(optarg, &d) || d <= 0 || d > 1)
                bad = "--top-p must be in (0, 1]";
            a->sp.top_p = (float)d;
            break;
        case O_MINP:
            if (gw_parse_float(optarg, &d) || d < 0 || d > 1)
                bad = "--min-p must be in [0, 1]";
            a->sp.min_p = (float)d;
            break;
        case O_SEED:
            if (gw_parse_u64(optarg, &a->sp.seed))
                bad = "--seed must be a whole number from 0 to 2^64 - 1";
            break;
        case O_PP:
            if (gw_parse_float(optarg, &d) || d < -2 || d > 2)
                bad = "--presence-penalty must be in [-2, 2]";
            a->sp.presence_penalty = (float)d;
            break;
        case O_FP:
            if (gw_parse_float(optarg, &d) || d < -2 || d > 2)
                bad = "--frequency-penalty must be in [-2, 2]";
            a->sp.frequency_penalty = (float)d;
            break;
        case O_STOP:
            if (a->n_stops == MAX_STOPS || !*optarg)
                bad = "--stop takes a non-empty string, at most 4 times";
            else
                a->stops[a->n_stops++] = optarg;
            break;
        case O_THREADS:
            if (gw_parse_int(optarg, 1, 1024, &a->threads))
                bad = "--threads must be from 1 to 1024";
            break;
        case O_REF: a->reference = true; break;
        case O_PT: a->prompt_tokens = optarg; break;
        case O_SHOW: a->show_tokens = true; break;
        case O_DUMP: a->dump_logits = optarg; break;
        case O_IGN: a->ignore_eos = true; break;
        case O_DEVICE:
            a->device = optarg;
            if (strcmp(optarg, "cpu") && strcmp(optarg, "cuda"))
                bad = "--device must be cpu or cuda";
            break;
        case O_CHAT: a->chat = true; break;
        case O_CHAT_TMPL:
            if (rt_eopt_is_template_path(optarg) && rt_eopt_lookup(RT_EOPT_CHAT_TEMPLATE, optarg) < 0)
                a->chat_template_path = optarg;
            else if ((a->chat_kind = rt_eopt_lookup(RT_EOPT_CHAT_TEMPLATE, optarg)) < 0)
                bad = "--chat-template must be one of " RT_CHAT_KIND_NAMES " or a Jinja file's path";
            break;
        case 'h': usage(stdout); return 1;
        default: usage(stderr); return -1;
        }
        if (bad) {
            fprintf(stderr, "generate: %s (got '%s')\n", bad, optarg);
            return -1;
        }
    }
    if (!a->model || (!a->prompt == !a->prompt_tokens) || (a->chat && a->prompt_tokens) || optind != argc) {
        usage(stderr);
        return -1;
    }
    return 0;
}

/* "1,15,27" -> ids; returns the count or -1. */
static int parse_token_list(const char *s, int32_t n_vocab, int32_t **out)
{
    int cap = 16, n = 0;
    int32_t *ids = malloc((size_t)cap * sizeof(int32_t));
    if (!ids)
        return -1;
    while (*s) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (errno || end == s || v < 0 || v >= n_vocab || (*end && *end != ','))
            goto bad;
        if (n == cap) {
            int32_t *np = realloc(ids, (size_t)(cap *= 2) * sizeof(int32_t));
            if (!np)
                goto bad;
            ids = np;
        }
        ids[n++] = (int32_t)v;
        s = *end ? end + 1 : end;
    }
    if (n == 0)
        goto bad;
    *out = ids;
    return n;
bad:
    free(ids);
    return -1;
}

static int dump_logits(const char *path, const float *logits, int n)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -errno;
    for (int i = 0; i < n; i++)
        fprintf(f, "%.9g\n", logits[i]);
    return fclose(f) ? -errno : 0;
}

/* The request as the engine takes it: the prompt (text, a chat's one user
 * message, or token ids) and what the options ask. Borrows a's strings. */
static void request_of(const gen_args *a, rt_oai_message *msg, int32_t *ids, int n_ids, rt_oai_request *q)
{
    *q = (rt_oai_request){.chat = a->chat,
                          .prompt = a->chat ? NULL : (char *)a->prompt,
                          .prompt_tokens = ids,
                          .n_prompt_tokens = n_ids,
                          .max_tokens = (int)a->n_predict,
                          .max_tokens_name = "-n",
                          .sampling = a->sp,
                          .has_seed = true,
                          .n_stop = a->n_stops,
                          .ignore_eos = a->ignore_eos};
    for (int i = 0; i < a->n_stops; i++)
        q->stop[i] = a->stops[i];
    if (a->chat) {
        *msg = (rt_oai_message){"user", (char *)a->prompt};
        q->messages = msg;
        q->n_messages = 1;
    }
}

/* What the run's events told. */
typedef struct gen_run {
    bool show_tokens, finished, failed;
    int32_t *tokens; /* generated, n_predict at most */
    int n_tokens, cap;
    double t_first, t_done;
} gen_run;

static void on_event(void *arg, const rt_engine_event *e)
{
    gen_run *g = arg;
    const rt_sched_event *ev = &e->ev;
    if (ev->kind == RT_EV_ERROR) {
        fprintf(stderr, "generate: %s\n", e->error->message);
        g->failed = g->finished = true;
        return;
    }
    /* every other event is of one token */
    if (g->n_tokens == 0)
        g->t_first = gw_mono_s();
    if (g->n_tokens < g->cap)
        g->tokens[g->n_tokens++] = ev->token;
    fwrite(ev->text, 1, ev->text_len, stdout);
    fflush(stdout);
    if (ev->kind == RT_EV_DONE) {
        g->finished = true;
        g->t_done = gw_mono_s();
    }
}

/* The scheduler for this one request: a KV pool of its tokens (the context
 * at most: a longer request is refused with the context's length), one
 * sequence, prompt chunks of PREFILL_CHUNK. */
static int start_engine(rt_engine *e, const rt_engine_req *req, char *err, size_t err_len)
{
    const rt_model *m = rt_engine_model(e);
    long total = (long)req->run.n_prompt + req->run.max_tokens;
    if (total > rt_model_hparams(m)->n_ctx_train)
        total = rt_model_hparams(m)->n_ctx_train;
    rt_sched_opts so;
    rt_sched_opts_default(&so);
    so.kv_bytes = (size_t)(total + 15) / 16 * 16 * rt_model_kv_bytes_per_token(m, KN_TYPE_F16);
    so.block_tokens = 16;
    so.kv_type = KN_TYPE_F16;
    so.max_seqs = 1;
    so.max_batch_tokens = PREFILL_CHUNK;
    so.max_queue = 1;
    return rt_engine_start(e, &so, err, err_len);
}

static void report(const gen_run *g, int n_prompt, double t0, const rt_engine *e)
{
    printf("\n");
    if (g->show_tokens) {
        printf("tokens:");
        for (int i = 0; i < g->n_tokens; i++)
            printf("%s%d", i ? "," : " ", g->tokens[i]);
        printf("\n");
    }
    const rt_model *m = rt_engine_model(e);
    double t_prefill = g->t_first - t0, t_decode = g->t_done - g->t_first;
    /* The last sampled token is never run through the model. */
    int n_decoded = g->n_tokens > 1 ? g->n_tokens - 1 : 0;
    fprintf(stderr, "prefill: %d tokens in %.3f s (%.1f tokens/s)\n", n_prompt, t_prefill,
            n_prompt / (t_prefill > 0 ? t_prefill : 1e-9));
    fprintf(stderr, "decode:  %d tokens in %.3f s (%.1f tokens/s), %d threads, %s kernels\n", n_decoded,
            t_decode, n_decoded / (t_decode > 0 ? t_decode : 1e-9), rt_model_threads(m), rt_model_backend_name(m));
}

int gw_cmd_generate(int argc, char **argv)
{
    gen_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc > 0 ? 0 : 2;

    char err[768];
    rt_engine *e = NULL;
    rt_engine_req req = {0};
    int32_t *ids = NULL;
    float *logits = NULL;
    gen_run g = {.show_tokens = a.show_tokens, .cap = (int)a.n_predict};
    int status = 1, n_ids = 0;

    rt_engine_opts eo;
    rt_engine_opts_default(&eo);
    eo.model_path = a.model;
    eo.model = (rt_model_opts){.n_threads = (int)a.threads, .reference = a.reference, .device = a.device};
    eo.chat_kind = a.chat_kind;
    eo.chat_template_path = a.chat_template_path;
    if (rt_engine_load(&eo, &e, err, sizeof(err))) {
        fprintf(stderr, "generate: %s\n", err);
        return 1;
    }
    const int n_vocab = rt_model_hparams(rt_engine_model(e))->n_vocab;
    if (a.prompt_tokens && (n_ids = parse_token_list(a.prompt_tokens, n_vocab, &ids)) < 0) {
        fprintf(stderr, "generate: --prompt-tokens must be comma-separated ids below %d\n", n_vocab);
        goto out;
    }
    rt_oai_request q;
    rt_oai_message msg;
    rt_oai_error oe;
    request_of(&a, &msg, ids, n_ids, &q);
    if (rt_engine_build(e, &q, &req, &oe)) {
        fprintf(stderr, "generate: %s\n", oe.message);
        goto out;
    }
    g.tokens = malloc((size_t)a.n_predict * sizeof(int32_t));
    logits = a.dump_logits ? malloc((size_t)n_vocab * sizeof(float)) : NULL;
    if (!g.tokens || (a.dump_logits && !logits)) {
        fprintf(stderr, "generate: out of memory\n");
        goto out;
    }
    req.run.first_logits = logits;
    if (start_engine(e, &req, err, sizeof(err))) {
        fprintf(stderr, "generate: %s\n", err);
        goto out;
    }
    uint64_t id;
    int retry;
    double t0 = gw_mono_s();
    if (rt_engine_submit(e, &req, &g, &id, &oe, &retry)) {
        fprintf(stderr, "generate: %s\n", oe.message);
        goto out;
    }
    while (!g.finished)
        rt_engine_poll(e, -1, on_event, &g);
    if (g.failed)
        goto out;
    if (a.dump_logits && (rc = dump_logits(a.dump_logits, logits, n_vocab))) {
        fprintf(stderr, "generate: %s: %s\n", a.dump_logits, strerror(-rc));
        goto out;
    }
    report(&g, req.run.n_prompt, t0, e);
    status = 0;
out:
    free(g.tokens);
    free(logits);
    free(ids);
    rt_engine_req_dispose(&req);
    rt_engine_free(e);
    return status;
}
