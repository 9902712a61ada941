/* The HTTP/2 host of the runtime engine (`infergate worker`): the
 * OpenAI-compatible endpoints over the gateway's HTTP server, and nothing
 * of the engine's own work. A completion request's body goes to an offload
 * thread, where the engine prepares it (parse, template, tokens); back on
 * the loop it is submitted, and the engine's events become the answer: one
 * JSON object, or SSE chunks written as the tokens come (a reader too slow
 * for the stream's bound loses its stream, and its request). Also /health,
 * /v1/models and /internal/stats (the engine's figures, as JSON).
 *
 * Everything here runs on the loop's thread; the engine's compute thread
 * only makes the loop's notify event active (rt_engine_set_wake). */
#ifndef GW_WORKER_H
#define GW_WORKER_H

#include "gateway/http/http.h"
#include "runtime/engine.h"

#include <stddef.h>

typedef struct gw_worker gw_worker;

typedef struct gw_worker_opts {
    gw_http_limits limits;
    int drain_grace_s; /* on SIGTERM or SIGINT, open streams finish within this */
} gw_worker_opts;

/* The loop, the HTTP server, the offload thread and the signal handlers,
 * in front of e (started, or started before gw_worker_run), which it
 * borrows. NULL with err filled on failure. */
gw_worker *gw_worker_new(rt_engine *e, const gw_worker_opts *o, char *err, size_t err_len);
/* unix:PATH or tcp:HOST:PORT. 0, or a negative code with err filled. */
int gw_worker_listen(gw_worker *w, const char *addr, char *err, size_t err_len);
/* Serves until a signal's drain has ended: every stream closed, or the
 * grace passed. */
void gw_worker_run(gw_worker *w);
/* Closes the server (its streams cancel their requests), drops the
 * requests being prepared, stops the engine and hands its last events,
 * then frees the loop. The engine is the caller's to free. NULL is
 * ignored. */
void gw_worker_free(gw_worker *w);

#endif
