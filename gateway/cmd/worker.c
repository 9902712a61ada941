/* `infergate worker`: one model on one device behind an OpenAI-compatible
 * HTTP/2 server. Its stages: parse the options (the engine's from the
 * runtime's option table, the host's here), load the engine, listen, run,
 * drain. The work is the engine's (runtime/engine.h); the transport is
 * gateway/worker/. */
#include "gateway/base/num.h"
#include "gateway/cmd/cli.h"
#include "gateway/worker/worker.h"

#include "runtime/chat.h"

#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DRAIN_GRACE_S 30

/* getopt's values for the host's options, then one per rt_eopt. */
enum { O_NAME = 256, O_BODY, O_DEVICE, O_GRACE, O_TABLE = 512 };

typedef struct worker_args {
    const char *listen;
    rt_engine_opts engine;
    gw_worker_opts host;
} worker_args;

static void usage(FILE *f)
{
    fprintf(
        f, "usage: infergate worker --model FILE --listen unix:PATH|tcp:HOST:PORT [options]\n"
           "Serves one model over HTTP/2 cleartext (OpenAI-compatible), with continuous batching.\n"
           "  --model-name NAME      the id clients use in \"model\" (default: the file name without .gguf)\n"
           "  --device cpu|cuda      where the model runs (default cpu; cuda: the GPU or MIG slice\n"
           "                         CUDA_VISIBLE_DEVICES shows)\n");
    rt_eopt_usage(f);
    fprintf(f,
            "  --max-body BYTES       largest request body (default 1048576)\n"
            "  --drain-grace-s S      on SIGTERM, open streams finish within this (default %d)\n",
            DRAIN_GRACE_S);
}

/* The engine's options come from the runtime's table: the flag's value is
 * a name of a named option, or a number in its range. NULL, or why not. */
static const char *engine_option(rt_engine_opts *o, rt_eopt id, const char *arg, char *why, size_t why_len)
{
    const rt_eopt_def *d = &rt_eopt_defs[id];
    long v = d->name ? rt_eopt_lookup(id, arg) : 0;
    if (id == RT_EOPT_CHAT_TEMPLATE && v < 0 && rt_eopt_is_template_path(arg)) {
        o->chat_template_path = arg; /* read and parsed when the engine loads */
        return NULL;
    }
    if (d->name ? v < 0 : gw_parse_int(arg, (long)d->min, (long)d->max, &v) != 0) {
        char range[512];
        snprintf(why, why_len, "--%s: %s%s", d->flag, rt_eopt_range(id, range, sizeof(range)),
                 id == RT_EOPT_CHAT_TEMPLATE ? "; or a Jinja file's path (with a '/' or ending in .jinja)" : "");
        return why;
    }
    rt_engine_opts_set(o, id, v);
    return NULL;
}

/* The host's own options. NULL, or why not. */
static const char *host_option(worker_args *a, int c, const char *arg)
{
    long v;
    switch (c) {
    case 'm':
        a->engine.model_path = arg;
        return NULL;
    case 'l':
        a->listen = arg;
        return NULL;
    case O_NAME:
        a->engine.model_name = arg;
        return NULL;
    case O_DEVICE:
        a->engine.model.device = arg;
        return strcmp(arg, "cpu") && strcmp(arg, "cuda") ? "--device: cpu or cuda" : NULL;
    case O_GRACE:
        if (gw_parse_int(arg, 0, 86400, &v))
            return "--drain-grace-s: 0 to 86400";
        a->host.drain_grace_s = (int)v;
        return NULL;
    case O_BODY:
        if (gw_parse_int(arg, 1, GW_WORKER_MAX_BODY, &v))
            return "--max-body: 1 to 1073741824";
        a->host.limits.max_body = (size_t)v;
        return NULL;
    }
    return "";
}

/* 0: run; 1: done (--help); -1: bad usage (said). */
static int parse_options(int argc, char **argv, worker_args *a)
{
    enum { N_HOST = 7 };
    struct option opts[N_HOST + RT_EOPT_N + 1] = {
        {"model", required_argument, 0, 'm'},
        {"listen", required_argument, 0, 'l'},
        {"model-name", required_argument, 0, O_NAME},
        {"max-body", required_argument, 0, O_BODY},
        {"device", required_argument, 0, O_DEVICE},
        {"drain-grace-s", required_argument, 0, O_GRACE},
        {"help", no_argument, 0, 'h'},
    };
    for (int id = 0; id < RT_EOPT_N; id++)
        opts[N_HOST + id] = (struct option){rt_eopt_defs[id].flag, required_argument, 0, O_TABLE + id};
    *a = (worker_args){.host.drain_grace_s = DRAIN_GRACE_S};
    rt_engine_opts_default(&a->engine);
    a->engine.model.device = "cpu";
    gw_http_limits_default(&a->host.limits);
    /* Its one client is its gateway, which multiplexes many requests on a
     * connection and has bounded their bodies already. */
    a->host.limits.max_conn_body = SIZE_MAX;
    a->host.limits.max_cut_streams = UINT32_MAX; /* its clients' cancellations all come over it */
    /* A slow client of the gateway pauses its sequence here (the gateway
     * reads no more of the stream), for as long as the gateway keeps it:
     * the gateway bounds its clients, and its buffers. */
    a->host.limits.window_timeout_ms = -1;
    a->host.limits.max_conn_buffer = SIZE_MAX;
    a->host.limits.max_buffer = SIZE_MAX;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:l:h", opts, NULL)) != -1) {
        char why[600];
        const char *bad;
        if (c == 'h') {
            usage(stdout);
            return 1;
        } else if (c >= O_TABLE && c < O_TABLE + RT_EOPT_N) {
            bad = engine_option(&a->engine, (rt_eopt)(c - O_TABLE), optarg, why, sizeof(why));
        } else if ((bad = host_option(a, c, optarg)) && !*bad) {
            usage(stderr);
            return -1;
        }
        if (bad) {
            fprintf(stderr, "worker: %s (got '%s')\n", bad, optarg);
            return -1;
        }
    }
    if (!a->engine.model_path || !a->listen || optind != argc) {
        usage(stderr);
        return -1;
    }
    return 0;
}

/* The model, its tokenizer and template, and the scheduler; what the
 * operator should know about them. */
static rt_engine *load_engine(const worker_args *a)
{
    rt_engine *e;
    char err[768];
    if (rt_engine_new(&a->engine, &e, err, sizeof(err))) {
        fprintf(stderr, "worker: %s\n", err);
        return NULL;
    }
    const char *warning;
    for (int i = 0; (warning = rt_engine_warning(e, i)); i++)
        fprintf(stderr, "worker: warning: %s\n", warning);
    return e;
}

/* The host in front of the engine, listening. */
static gw_worker *listen_on(rt_engine *e, const worker_args *a)
{
    char err[512], what[1024];
    gw_worker *w = gw_worker_new(e, &a->host, err, sizeof(err));
    if (!w) {
        fprintf(stderr, "worker: %s\n", err);
        return NULL;
    }
    if (gw_worker_listen(w, a->listen, err, sizeof(err))) {
        fprintf(stderr, "worker: listen %s: %s\n", a->listen, err);
        gw_worker_free(w);
        return NULL;
    }
    rt_engine_describe(e, what, sizeof(what));
    fprintf(stderr, "worker: ready: %s; listening on %s\n", what, a->listen);
    return w;
}

/* Open streams have finished or the grace has passed: the host closes what
 * is left, the engine's last events are handled, and both are freed. */
static void drain(gw_worker *w, rt_engine *e)
{
    gw_worker_free(w);
    rt_engine_free(e);
}

int gw_cmd_worker(int argc, char **argv)
{
    worker_args a;
    int rc = parse_options(argc, argv, &a);
    if (rc)
        return rc > 0 ? 0 : 2;
    rt_engine *e = load_engine(&a);
    if (!e)
        return 1;
    gw_worker *w = listen_on(e, &a);
    if (w)
        gw_worker_run(w);
    drain(w, e);
    return w ? 0 : 1;
}
