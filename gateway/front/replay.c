/* Mid-stream failover by token replay. A streamed answer whose worker or
 * region fails after its first byte goes on elsewhere: the gateway has
 * read every token id delivered (the worker tags each SSE event with a
 * comment line ": ig TOKEN", stripped here, never seen by clients), and
 * sends the request to the next candidate with them in x-infergate-resume
 * ("ID CREATED SEED T1,T2,..."). That worker prefills the prompt and the
 * tokens, brings its sampler (penalties, the generator's draws) and stop
 * strings to where the failed run had them, and answers with the same id
 * and created, from the next token on: the client's stream goes on with no
 * text repeated or missing, and with greedy or seeded sampling equals an
 * unbroken run's.
 *
 * Trust: the two headers are the gateways' own. A client's are refused
 * (400); a peer region's (a forwarded request, over verified TLS) pass on
 * to its worker, whose tags and x-infergate-replay pass back unread, so
 * the origin replays. The body is never touched.
 *
 * Requests with tools, reasoning, logprobs or a grammar resume alike: the
 * worker rebuilds their parsers' and matcher's state from the tokens.
 * Not replayed: answers not streamed (nothing went out before a failure,
 * so dispatch.c's retry sends them again whole; their worker answers
 * x-infergate-replay "off WHY"), and a failure after the last token's tag:
 * it ends the stream as before, logged. */
#include "gateway/front/request_internal.h"

#include "gateway/base/mem.h"
#include "gateway/base/replay_wire.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RBUF_MAX (256 * 1024) /* an event longer than this (no blank line) passes on unread */
/* x-infergate-resume's bound: the next hop's head must fit its
 * limits.max_header_bytes (64 KiB by default) with the rest. ~8,000 tokens. */
#define RESUME_MAX (48 * 1024)

static bool replay_on(const gw_front_req *p)
{
    return p->g->cfg->routing.replay && p->g->cfg->routing.replay_max > 0;
}

int gw_front_replay_refuse_client(gw_front_req *p)
{
    if (p->forwarded || (!gw_http_header_get(p->req, "x-infergate-resume") &&
                         !gw_http_header_get(p->req, "x-infergate-replay")))
        return 0;
    gw_front_respond(p, 400, "invalid_request_error", "internal_header", NULL, 0,
                     "x-infergate-resume and x-infergate-replay are the gateways' own headers (token "
                     "replay): only a peer region may send them");
    return -1;
}

size_t gw_front_replay_headers(gw_front_req *p, gw_http_header *h)
{
    size_t n = 0;
    const char *v;
    if (p->forwarded) { /* the origin's: passed on, its tags passed back */
        if ((v = gw_http_header_get(p->req, "x-infergate-replay"))) {
            h[n++] = (gw_http_header){"x-infergate-replay", v};
            p->replay_pass = true;
        }
        if ((v = gw_http_header_get(p->req, "x-infergate-resume")))
            h[n++] = (gw_http_header){"x-infergate-resume", v};
        return n;
    }
    if (!replay_on(p))
        return 0;
    p->replay_asked = true;
    h[n++] = (gw_http_header){"x-infergate-replay", "1"};
    if (p->resuming && p->resume_hdr)
        h[n++] = (gw_http_header){"x-infergate-resume", p->resume_hdr};
    return n;
}

void gw_front_replay_response(gw_front_req *p, const gw_http_header *hs, size_t n, gw_http_header *out,
                              size_t *k)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(hs[i].name, "x-infergate-replay"))
            continue;
        if (p->replay_pass)
            out[(*k)++] = hs[i];
        else if (p->replay_asked && strncmp(hs[i].value, "off", 3) &&
                 strlen(hs[i].value) < sizeof(p->replay_run))
            snprintf(p->replay_run, sizeof(p->replay_run), "%s", hs[i].value);
        else if (p->replay_asked)
            snprintf(p->replay_off, sizeof(p->replay_off), "%s", hs[i].value);
    }
}

bool gw_front_replay_same_run(const gw_front_req *p, const gw_http_header *hs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(hs[i].name, "x-infergate-replay"))
            return !strcmp(hs[i].value, p->replay_run);
    return false;
}

/* The scan's callbacks (gateway/base/replay_wire.h): a token delivered, and
 * the bytes that go to the client. */
static int note_tag(void *ud, int32_t t, bool end)
{
    gw_front_req *p = ud;
    (void)end; /* the scan keeps p->replay_end */
    if (p->n_rtoks == p->cap_rtoks) {
        int cap = p->cap_rtoks ? p->cap_rtoks * 2 : 256;
        int32_t *nt = gw_mem_realloc(p->rtoks, (size_t)cap * sizeof(int32_t));
        if (!nt)
            return -ENOMEM;
        p->rtoks = nt;
        p->cap_rtoks = cap;
    }
    p->rtoks[p->n_rtoks++] = t;
    return 0;
}

static int pass_on(void *ud, const uint8_t *b, size_t len)
{
    return gw_http_write(((gw_front_req *)ud)->stream, b, len);
}

static int rbuf_add(gw_front_req *p, const uint8_t *data, size_t len)
{
    if (p->rbuf_len + len > p->rbuf_cap) {
        size_t cap = p->rbuf_cap ? p->rbuf_cap : 4096;
        while (cap < p->rbuf_len + len)
            cap *= 2;
        uint8_t *nb = gw_mem_realloc(p->rbuf, cap);
        if (!nb)
            return -ENOMEM;
        p->rbuf = nb;
        p->rbuf_cap = cap;
    }
    memcpy(p->rbuf + p->rbuf_len, data, len);
    p->rbuf_len += len;
    return 0;
}

int gw_front_replay_write(gw_front_req *p, const uint8_t *data, size_t len)
{
    static const gw_replay_scan_cbs cbs = {pass_on, note_tag};
    size_t used;
    int rc;
    /* whole events to the client, tag lines read and left out; an error
     * event (1) is not written: the caller replays instead */
    if (!p->rbuf_len) {
        /* nothing held: whole events go from data itself and only an
         * unfinished one is kept (a copy of every chunk into the hold was
         * most of what the bookkeeping cost a streamed answer:
         * bench/bench_gateway.sh --replay-ab --callgrind) */
        rc = gw_replay_scan(data, len, 0, &p->replay_end, &cbs, p, &used);
        if (rc || used == len)
            return rc;
        if (len - used > RBUF_MAX) /* no event boundary within reach */
            return gw_http_write(p->stream, data + used, len - used);
        return rbuf_add(p, data + used, len - used);
    }
    size_t seen = p->rbuf_len;
    if ((rc = rbuf_add(p, data, len)))
        return rc;
    rc = gw_replay_scan(p->rbuf, p->rbuf_len, seen, &p->replay_end, &cbs, p, &used);
    memmove(p->rbuf, p->rbuf + used, p->rbuf_len - used);
    p->rbuf_len -= used;
    if (rc == 0 && p->rbuf_len > RBUF_MAX) { /* no event boundary within reach */
        rc = gw_http_write(p->stream, p->rbuf, p->rbuf_len);
        p->rbuf_len = 0;
    }
    if (rc == 1)
        p->rbuf_len = 0;
    return rc;
}

const char *gw_front_target_said(const gw_front_req *p, char *buf, size_t cap)
{
    if (p->remote)
        snprintf(buf, cap, "region %s", p->region);
    else
        snprintf(buf, cap, "worker %d", p->worker);
    return buf;
}

/* x-infergate-resume for the tokens delivered, in p->resume_hdr: "ID
 * CREATED SEED T1,T2,..." (no tokens: it failed before its first). NULL,
 * or why it cannot be. */
static const char *build_resume(gw_front_req *p)
{
    size_t cap = strlen(p->replay_run) + 2 + (size_t)p->n_rtoks * 12;
    char *h = gw_mem_realloc(p->resume_hdr, cap);
    if (!h)
        return "out of memory";
    p->resume_hdr = h;
    size_t k = (size_t)snprintf(h, cap, "%s", p->replay_run);
    for (int i = 0; i < p->n_rtoks && k <= RESUME_MAX; i++)
        k += (size_t)snprintf(h + k, cap - k, "%c%d", i ? ',' : ' ', (int)p->rtoks[i]);
    return k > RESUME_MAX ? "too many tokens for x-infergate-resume" : NULL;
}

bool gw_front_replay(gw_front_req *p)
{
    if (!p->replay_asked || !p->stream)
        return false;
    const char *why = NULL;
    if (!p->replay_run[0])
        why = p->replay_off[0] ? p->replay_off : "the upstream said no run (x-infergate-replay)";
    else if (p->replay_end)
        why = "the answer had ended";
    else if (p->replays >= p->g->cfg->routing.replay_max)
        why = "routing.replay_max reached";
    else
        why = build_resume(p);
    if (!why) {
        p->replays++;
        p->resuming = true;
        p->rbuf_len = 0;
        p->sse_head_len = 0;
        p->sse_error = false; /* an error event replayed is no part of the answer */
        gw_usage_scan_init(&p->usage);
        char from[ROUTE_NAME_MAX + 16], to[ROUTE_NAME_MAX + 16];
        gw_front_target_said(p, from, sizeof(from));
        gw_front_spend_share(p, p->n_rtoks); /* what it served, at its prices, before the target moves */
        if (gw_front_retry(p, false)) { /* the region was told it failed */
            fprintf(stderr, "infergate: event=replay request=%s from=\"%s\" to=\"%s\" tokens=%d\n", p->id,
                    from, gw_front_target_said(p, to, sizeof(to)), p->n_rtoks);
            gw_metrics_add(p->g->metrics, "infergate_replays_total", "outcome=\"resumed\"", 1);
            return true;
        }
        p->resuming = false;
        why = "no retry left (routing.retry_budget) or no other candidate";
    }
    fprintf(stderr, "infergate: event=replay_refused request=%s tokens=%d why=\"%s\"\n", p->id, p->n_rtoks,
            why);
    gw_metrics_add(p->g->metrics, "infergate_replays_total", "outcome=\"refused\"", 1);
    return false;
}

void gw_front_replay_free(gw_front_req *p)
{
    gw_mem_free(p->rtoks);
    gw_mem_free(p->rbuf);
    gw_mem_free(p->resume_hdr);
    p->rtoks = NULL;
    p->rbuf = NULL;
    p->resume_hdr = NULL;
}
