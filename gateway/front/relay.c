/* The upstream stream of a request: the request sent on to the chosen
 * worker or region (the body unchanged), and the answer relayed back chunk
 * by chunk. Response data is acknowledged upstream only once the client
 * side has room for it, so a slow client holds back its upstream stream
 * instead of filling a buffer here. Streamed events go out whole, their
 * tokens counted as they pass; a failure before the first byte goes back
 * to dispatch.c to be tried elsewhere, one after it ends the stream with
 * an error event. */
#include "gateway/front/placement.h"
#include "gateway/front/request_internal.h"

#include "gateway/base/mem.h"
#include "gateway/base/oai_error.h"

#include "routing/router.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The log's upstream_error and the metric, for one failure of the upstream. */
static void note_upstream_error(gw_front_req *p, const char *kind)
{
    p->error_kind = kind;
    char labels[64];
    snprintf(labels, sizeof(labels), "kind=\"%s\"", kind);
    gw_metrics_add(p->g->metrics, "infergate_upstream_errors_total", labels, 1);
}

/* An upstream's Retry-After (seconds), within 1..60; 0 without one. */
static int retry_after_of(const gw_http_header *hs, size_t n)
{
    int retry_after = 0;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(hs[i].name, "retry-after")) {
            long v = strtol(hs[i].value, NULL, 10);
            retry_after = v < 1 ? 1 : v > 60 ? 60 : (int)v;
        }
    return retry_after;
}

static void cut_stream(gw_front_req *p, bool stalled);

/* A resumed try (token replay) answers a stream whose status has gone
 * out: it goes on if it continues the same run, else it has failed too. */
static void resumed_response(gw_front_req *p, int status, const gw_http_header *hs, size_t n)
{
    if (status == 200 && gw_front_replay_same_run(p, hs, n)) {
        p->resuming = false;
        return;
    }
    gw_upstream_cancel(p->up);
    p->up = NULL;
    note_upstream_error(p, "resume_refused");
    gw_front_region_report(p, status < 500);
    if (!gw_front_replay(p))
        cut_stream(p, false);
}

static void up_response(void *ud, int status, const gw_http_header *hs, size_t n)
{
    gw_front_req *p = ud;
    if (p->remote) /* what its energy is counted by, should it end without its trailer */
        gw_placement_power_said(p, hs, n);
    if (p->resuming) {
        resumed_response(p, status, hs, n);
        return;
    }
    if (p->hedge && gw_front_hedge_primary_answered(p, status))
        return; /* it failed, and the hedge out goes on in its place */
    /* A region's 503 (no worker ready, draining) or 502 (its worker failed
     * before answering, already retried there) is worth the next region;
     * so is its 401/403 (it does not take our certificate),
     * 404 (its record lists a model it does not serve) or 421 (nor the
     * residency): the region is wrong for the request, and counts it as a
     * failure. Its 504 is not (the request held a worker there for
     * response_timeout_ms, and could hold the next one as long), nor a 500:
     * those are passed on, and count against the region all the same. */
    bool wrong_region = status == 401 || status == 403 || status == 404 || status == 421;
    /* A 503 with no Retry-After is a worker's "never here": the request
     * does not fit its KV cache, which says nothing of its region's health. */
    int retry_after = retry_after_of(hs, n);
    bool too_big = status == 503 && !retry_after;
    if ((status == 502 || (status == 503 && !too_big) || wrong_region) && p->remote) {
        gw_upstream_cancel(p->up);
        p->up = NULL;
        note_upstream_error(p, wrong_region ? "status_4xx" : "status_5xx");
        if (gw_front_retry(p, true))
            return;
        if (!p->stream)
            return;
        /* Nowhere else to go: say what happened (a new request for its
         * body is not possible). Its 502 or 503 passes on; its 4xx is about
         * our request to it, not the client's to us, whom a 401 would tell
         * its key is wrong and a 421 that it misdirected the request. */
        gw_front_respond(p, wrong_region ? 502 : status, "server_error", "upstream_failed", NULL, 1,
                         "region %s answered %d", p->region, status);
        return;
    }
    /* A region whose queues are full (429) is alive, only busy: the next
     * candidate may have room, and nothing counts against the region.
     * Passed on, its 429 told the client to back off while the fleet had
     * room elsewhere. */
    if (status == 429)
        gw_placement_note_busy(p); /* policy primary spills from it a while */
    if (status == 429 && p->remote) {
        gw_upstream_cancel(p->up);
        p->up = NULL;
        gw_front_region_report(p, true);
        if (gw_front_retry(p, false) || !p->stream)
            return;
        gw_front_respond(p, 429, "rate_limit_error", "queue_full", NULL, retry_after ? retry_after : 1,
                         "region %s is at capacity and no other region could take the request; retry shortly",
                         p->region);
        return;
    }
    /* A local worker that turned the request away unstarted — its queue
     * full (429), its memory short (503) — leaves it to a sibling, whose
     * queue is its own, else to the next region; one whose KV cache is too
     * small for it, to a sibling with a larger one. The old answer is let
     * go only once the request is on its way: with nowhere to go, it
     * passes on as it is (a region's too-big 503 too, counted as no
     * failure of the region). */
    if ((status == 429 || status == 503) && !p->remote && p->worker >= 0) {
        gw_upstream_req *old = p->up;
        p->up = NULL;
        if (too_big ? gw_front_retry_on_larger(p) : gw_front_retry(p, false)) {
            gw_upstream_cancel(old);
            return;
        }
        p->up = old;
    }
    gw_front_region_report(p, status < 500 || too_big);
    p->responded = true;
    p->status = status;
    gw_http_header out[13];
    size_t k = 0;
    char worker[16];
    *gw_front_put_int(worker, p->worker) = '\0';
    int64_t length = -1; /* the upstream's content-length, which nghttp2 has checked is a number */
    bool prompt_said = false;
    for (size_t i = 0; i < n; i++) {
        if (k < 5 && (!strcmp(hs[i].name, "content-type") || !strcmp(hs[i].name, "cache-control") ||
                      !strcmp(hs[i].name, "retry-after"))) {
            out[k++] = hs[i];
            if (!strcmp(hs[i].name, "content-type") && !strncmp(hs[i].value, "text/event-stream", 17))
                p->sse = true;
        } else if (!strcmp(hs[i].name, "x-infergate-prompt-tokens") && !prompt_said) {
            /* the worker's count, which the tenant's tpm is charged (and
             * which a region passes on to the gateway that sent it there) */
            long v = strspn(hs[i].value, "0123456789") == strlen(hs[i].value) && strlen(hs[i].value) <= 9
                         ? strtol(hs[i].value, NULL, 10)
                         : -1;
            if (v >= 0 && hs[i].value[0]) {
                p->prompt_tokens = (int)v;
                out[k++] = hs[i];
                prompt_said = true;
            }
        } else if (!strcmp(hs[i].name, "content-length") && strlen(hs[i].value) <= 18 &&
                   strspn(hs[i].value, "0123456789") == strlen(hs[i].value) && hs[i].value[0]) {
            length = strtoll(hs[i].value, NULL, 10);
        }
    }
    gw_front_replay_response(p, hs, n, out, &k);
    out[k++] = (gw_http_header){"x-request-id", p->id};
    if (p->sse) /* nginx in front would otherwise hold the tokens back in its buffers */
        out[k++] = (gw_http_header){"x-accel-buffering", "no"};
    if (!p->remote)
        out[k++] = (gw_http_header){"x-infergate-worker", worker};
    if (p->region[0])
        out[k++] = (gw_http_header){"x-infergate-region", p->region};
    char route[320];
    if (p->route.n)
        out[k++] = (gw_http_header){"x-infergate-route", gw_front_route_said(p, route, sizeof(route))};
    /* Its origin counts a forwarded request's energy: by this rate, if the
     * stream ends without its trailer (cut, the client gone). */
    char power[64];
    if (p->forwarded && !gw_placement_power_header(p, power, sizeof(power)))
        out[k++] = (gw_http_header){"x-infergate-power", power};
    if (!p->stream)
        return;
    /* The length passes on, so that the client can tell a whole body from
     * a cut one (an HTTP/1.0 client could not, nor keep the connection);
     * events are held and ended with an error event of ours instead. */
    int rc = length >= 0 && !p->sse ? gw_http_begin_length(p->stream, status, out, k, (uint64_t)length)
                                    : gw_http_begin(p->stream, status, out, k);
    if (rc) {
        gw_upstream_cancel(p->up);
        p->up = NULL;
        gw_http_reset(p->stream);
    }
}

static void sse_line(gw_front_req *p)
{
    const char *h = p->sse_head;
    int n = p->sse_head_len;
    if (n < 6 || memcmp(h, "data: ", 6))
        return;
    /* a worker whose model failed mid-stream ends with an error event */
    if (n >= 14 && !memcmp(h + 6, "{\"error\"", 8))
        p->sse_error = true;
    else
        p->events += !(n >= 12 && !memcmp(h + 6, "[DONE]", 6));
}

/* Counts SSE events (one per token in a completion stream) by the start
 * of each line, kept across calls: an upstream's DATA frames split lines
 * anywhere, and a chunk's first byte is no line's start. */
static void scan_sse(gw_front_req *p, const uint8_t *data, size_t len)
{
    const uint8_t *q = data, *end = data + len;
    while (q < end) {
        if (p->sse_head_len < 0) {
            const uint8_t *nl = memchr(q, '\n', (size_t)(end - q));
            if (!nl)
                return;
            q = nl + 1;
            p->sse_head_len = 0;
            continue;
        }
        uint8_t c = *q++;
        if (c == '\n') {
            sse_line(p);
            p->sse_head_len = 0;
            continue;
        }
        p->sse_head[p->sse_head_len++] = (char)c;
        if (p->sse_head_len == SSE_LINE_HEAD) {
            sse_line(p);
            p->sse_head_len = -1;
        }
    }
}

/* SSE data goes to the client a whole event at a time: the bytes after the
 * last blank line are held until the rest of their event comes (an
 * upstream's DATA frames follow its flow-control window, not events). So
 * the error event written after an upstream failure never lands inside a
 * half-sent event, which a client would read as one event of broken JSON.
 * An "event" longer than the hold's bound is let through as it comes: at
 * most SSE_HOLD_MAX, and a quarter of stream_buffer_bytes, so that what a
 * slow reader's stream holds (half the buffer before the upstream is read
 * no more, its window of a quarter, and the hold) never exceeds it: with a
 * small buffer, an event of a few KiB (top_logprobs) was held whole and
 * written at once past it, and the stream reset. */
#define SSE_HOLD_MAX 16384

static size_t sse_hold_max(const gw_front_req *p)
{
    size_t q = p->g->cfg->limits.stream_buffer_bytes / 4;
    return q < SSE_HOLD_MAX ? q : SSE_HOLD_MAX;
}

static int sse_hold(gw_front_req *p, const uint8_t *data, size_t len)
{
    if (!p->hold && !(p->hold = gw_mem_alloc(SSE_HOLD_MAX)))
        return -ENOMEM;
    memcpy(p->hold + p->hold_len, data, len);
    p->hold_len += len;
    return 0;
}

static int sse_write(gw_front_req *p, const uint8_t *data, size_t len)
{
    size_t cut = len; /* data[0..cut) ends the last whole event */
    while (cut > 0 && !(data[cut - 1] == '\n' &&
                        (cut >= 2 ? data[cut - 2] == '\n' : p->hold_len && p->hold[p->hold_len - 1] == '\n')))
        cut--;
    size_t hold_max = sse_hold_max(p);
    if (cut == 0 && p->hold_len + len <= hold_max)
        return sse_hold(p, data, len);
    if (cut == 0 || len - cut > hold_max)
        cut = len; /* no event boundary within reach: pass it all */
    int rc;
    if (p->hold_len) {
        /* The held start of an event and its rest in one write: in two, a
         * bound met between them left half an event before the error
         * event (client_too_slow), which the client read as broken JSON. */
        uint8_t *buf = p->hold_len + cut <= SSE_HOLD_MAX ? p->hold : gw_mem_alloc(p->hold_len + cut);
        if (!buf)
            return -ENOMEM;
        if (buf != p->hold)
            memcpy(buf, p->hold, p->hold_len);
        memcpy(buf + p->hold_len, data, cut);
        rc = gw_http_write(p->stream, buf, p->hold_len + cut);
        if (buf != p->hold)
            gw_mem_free(buf);
        if (!rc)
            p->hold_len = 0;
    } else {
        rc = gw_http_write(p->stream, data, cut);
    }
    return rc || cut == len ? rc : sse_hold(p, data + cut, len - cut);
}

/* The client read too slowly for the bytes held for it (a bound on its
 * stream, its connection or the gateway passed: the upstream pauses at
 * half, so only one that does not gets here). Its stream is cut, the
 * client told why where the error event still fits, and neither the
 * worker nor the region is blamed: they did nothing wrong. */
static void client_too_slow(gw_front_req *p)
{
    static const char ev[] = "data: {\"error\":{\"message\":\"the client read the stream too slowly: the "
                             "response held for it passed limits.stream_buffer_bytes, conn_buffer_bytes or "
                             "buffer_bytes\",\"type\":\"server_error\",\"param\":null,\"code\":"
                             "\"client_too_slow\"}}\n\n";
    gw_upstream_cancel(p->up);
    p->up = NULL;
    p->cut = true;
    p->error_kind = "client_too_slow";
    p->hold_len = 0;
    if (p->sse && !gw_http_write(p->stream, ev, sizeof(ev) - 1) && !gw_http_end(p->stream))
        return;
    gw_http_reset(p->stream);
}

static void up_data(void *ud, const uint8_t *data, size_t len)
{
    gw_front_req *p = ud;
    double now = gw_mono_s();
    if (!p->t_first) {
        p->t_first = now;
        /* an event stream's first data is its first token */
        if (p->sse && p->est_at_send > 0)
            gw_regions_note_ttft(p->g, p->est_at_send, (now - p->t_sent) * 1e3);
    }
    p->t_last = now;
    if (p->sse)
        scan_sse(p, data, len);
    gw_usage_scan_feed(&p->usage, data, len);
    if (!p->stream)
        return;
    /* a run that can be resumed has its tags read (replay.c) */
    int rc = p->sse && p->replay_run[0] ? gw_front_replay_write(p, data, len)
             : p->sse                  ? sse_write(p, data, len)
                                       : gw_http_write(p->stream, data, len);
    if (rc == 1) { /* an error event: the worker failed in-band, replayed elsewhere if it may be */
        gw_upstream_cancel(p->up);
        p->up = NULL;
        note_upstream_error(p, "stream_error");
        gw_front_region_failed(p);
        if (!gw_front_replay(p))
            cut_stream(p, false);
        return;
    }
    if (rc == -ENOBUFS) {
        client_too_slow(p);
        return;
    }
    if (rc) {
        gw_upstream_cancel(p->up);
        p->up = NULL;
        gw_http_reset(p->stream);
        return;
    }
    p->bytes_out += len;
    if (!gw_http_full(p->stream))
        gw_upstream_consume(p->up, len);
    else
        p->unconsumed += len;
}

static void up_end(void *ud)
{
    gw_front_req *p = ud;
    p->up = NULL;
    if (p->sse_error) { /* ended cleanly, but on an error: a failure all the same */
        note_upstream_error(p, "stream_error");
        gw_front_region_failed(p);
    }
    /* A forwarded request's energy goes back to its origin, which counts
     * it (placement.h): only here are the worker and its share known. */
    char energy[64];
    gw_http_header tr = {"x-infergate-energy", energy};
    bool said = p->forwarded && p->stream && !gw_placement_energy_trailer(p, energy, sizeof(energy));
    /* An upstream that ends without a blank line: its last bytes go as they are. */
    if (p->stream &&
        ((p->hold_len && gw_http_write(p->stream, p->hold, p->hold_len)) ||
         (p->rbuf_len && gw_http_write(p->stream, p->rbuf, p->rbuf_len)) ||
         (said ? gw_http_end_trailers(p->stream, &tr, 1) : gw_http_end(p->stream))))
        gw_http_reset(p->stream);
    p->hold_len = 0;
    p->rbuf_len = 0;
    gw_placement_try_end(p);
}

/* The event that ends a stream its upstream cut (an OpenAI error object,
 * which the SDKs read and raise), into ev (cap bytes); returns its length. */
static size_t error_event(char *ev, size_t cap, bool stalled)
{
    memcpy(ev, "data: ", 6);
    size_t n = 6 + gw_oai_error_write(ev + 6, cap - 8,
                                      stalled ? "the worker serving this stream stopped sending "
                                                "(limits.response_timeout_ms)"
                                              : "the worker serving this stream failed",
                                      stalled ? "timeout_error" : "server_error", NULL,
                                      stalled ? "upstream_timeout" : "upstream_failed");
    memcpy(ev + n, "\n\n", 2);
    return n + 2;
}

static void up_error(void *ud, gw_upstream_error e, bool responded)
{
    gw_front_req *p = ud;
    p->up = NULL;
    note_upstream_error(p, gw_upstream_error_name(e));
    if (!p->stream)
        return;
    if (!responded && p->hedge && gw_front_hedge_primary_failed(p, e != GW_UP_REFUSED))
        return;
    if (!responded && !p->resuming) {
        /* A stalled target had the request all along: another try would
         * double the wait, and a request that wedges a worker could wedge
         * the next. */
        if (e == GW_UP_STALLED) {
            p->stalled = true;
            gw_front_region_failed(p);
            gw_front_respond(p, 504, "timeout_error", "upstream_timeout", NULL, 1,
                             "%s %s did not answer within limits.response_timeout_ms",
                             p->remote ? "region" : "worker", p->remote ? p->region : "serving this request");
            return;
        }
        if (gw_front_retry(p, e != GW_UP_REFUSED))
            return;
        /* Routed: every region the request may use has failed it, so the
         * service is unavailable to it for now (never a region it may not use). */
        if (p->stream && p->route.n)
            gw_front_respond(p, 503, "server_error", "no_region_available", NULL, 1,
                             "no region this request may use could serve it (last: %s, %s)", p->region,
                             p->error_kind);
        else if (p->stream)
            gw_front_respond(p, 502, "server_error", "upstream_failed", NULL, 1,
                             "the worker failed before answering (%s)", p->error_kind);
        return;
    }
    /* Mid-response (or a resumed try, before its own): a stream goes on
     * elsewhere from the tokens delivered (replay.c) where it may. */
    gw_front_region_failed(p);
    if (!p->sse || !gw_front_replay(p))
        cut_stream(p, e == GW_UP_STALLED);
}

/* A stream of events ends with an error event clients can read; anything
 * else can only be cut off. */
static void cut_stream(gw_front_req *p, bool stalled)
{
    p->cut = true;
    if (p->sse) {
        /* What was held of a half-received event is dropped. */
        p->hold_len = 0;
        p->rbuf_len = 0;
        char ev[256];
        size_t len = error_event(ev, sizeof(ev), stalled);
        if (!gw_http_write(p->stream, ev, len) && !gw_http_end(p->stream))
            return;
    }
    gw_http_reset(p->stream);
}

/* A region's answer ends with what its serving cost in energy. */
static void up_trailers(void *ud, const gw_http_header *hs, size_t n)
{
    gw_front_req *p = ud;
    if (p->remote)
        gw_placement_energy_said(p, hs, n);
}

const gw_upstream_cbs gw_front_up_cbs = {up_response, up_data, up_end, up_error, up_trailers};

void gw_front_send_upstream(gw_front_req *p)
{
    gw_serve *g = p->g;
    const gw_http_request *r = p->req;
    gw_http_header h[12];
    size_t n = 0;
    h[n++] = (gw_http_header){"content-type", "application/json"};
    h[n++] = (gw_http_header){"x-request-id", p->id};
    if (p->tenant[0])
        h[n++] = (gw_http_header){"x-infergate-tenant", p->tenant};
    /* Priority is the client's to ask, within its tenant's policy. */
    const gw_tenant *t = p->tenant[0] ? gw_tenants_find(g->tenants, p->tenant) : NULL;
    const char *v = t && gw_tenant_batch_only(t) ? "batch" : gw_http_header_get(r, "x-infergate-priority");
    if (v)
        h[n++] = (gw_http_header){"x-infergate-priority", v};
    if ((v = gw_http_header_get(r, "x-infergate-deadline-ms")))
        h[n++] = (gw_http_header){"x-infergate-deadline-ms", v};
    n += gw_front_replay_headers(p, h + n);
    const char *target;
    char target_buf[GW_TARGET_MAX], weight[32];
    /* A local worker shares itself among tenants by weight (sched.h); the
     * tenant and its weight are this gateway's, never the client's. A
     * receiving gateway uses its own tenant's weight. */
    const gw_tenant_cfg *tc = !p->remote && p->tenant[0] ? gw_serve_tenant_cfg(g, p->tenant) : NULL;
    if (tc && tc->weight > 0) {
        snprintf(weight, sizeof(weight), "%.17g", tc->weight);
        h[n++] = (gw_http_header){"x-infergate-tenant-weight", weight};
    }
    if (p->remote) {
        /* The receiving gateway serves it itself: one hop, never more. */
        h[n++] = (gw_http_header){"x-infergate-hop", "1"};
        if (g->cfg->region.name)
            h[n++] = (gw_http_header){"x-infergate-origin", g->cfg->region.name};
        if (p->n_need) /* checked there against its own tags (421) */
            h[n++] = (gw_http_header){"x-infergate-residency", p->need_list};
        target = gw_regions_target(g, p->remote, target_buf, sizeof(target_buf));
    } else {
        target = gw_supervisor_worker(g->sup, p->worker)->target;
    }
    /* Sent to a worker idle as last seen: its TTFT is the worker's
     * estimate plus what the estimate leaves out (hops, tokenizing,
     * hand-offs), which gw_regions_note_ttft learns. Not from a queue: an
     * estimate too low under load, learnt as a bias, kept an idle region
     * looking loaded to peers. Nor beside a running request: its estimate
     * is up to a stats interval old, and a stream that ended meanwhile
     * (a client sending its next request as the last ends) taught a bias
     * of minus the whole wait it had meant, which halved the busy estimate. */
    const gw_worker_info *wi = p->remote ? NULL : gw_supervisor_worker(g->sup, p->worker);
    p->est_at_send = wi && wi->queued == 0 && wi->running == 0 ? wi->est_ttft_ms : 0;
    p->tries++;
    p->local_tries += !p->remote;
    p->t_sent = gw_mono_s();
    const gw_upstream_cbs *cbs = &gw_front_up_cbs;
    void *ud = p;
    bool copy = p->hedge && gw_front_hedge_sending(p, &cbs, &ud);
    if (!copy) /* the try before it, cut or refused, is counted first */
        gw_placement_try_begin(p);
    p->up = gw_upstream_send(g->pool, target, r->method, r->path, p->remote ? p->remote->rec.name : "localhost",
                             h, n, r->body, r->body_len, cbs, ud);
    /* A target the pool cannot use (a peer's record with an endpoint it
     * cannot parse) or no memory: as a failed connect, the region is told
     * and the next candidate tried (a hedge's copy is let go: hedge.c). */
    if (!p->up && !copy)
        up_error(p, GW_UP_CONNECT, false);
    else if (p->up && p->tries == 1)
        gw_front_hedge_arm(p);
}

void gw_front_on_writable(void *ud, gw_http_stream *s, void *stream_ud)
{
    gw_front_req *p = stream_ud;
    if (p && p->up && p->unconsumed) {
        gw_upstream_consume(p->up, p->unconsumed);
        p->unconsumed = 0;
    }
}
