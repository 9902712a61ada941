/* The front door's request path, shared by the files that make it (the
 * process around it is serve_internal.h's). One request, one gw_front_req,
 * from gw_front_on_request to gw_front_on_close, through:
 *   endpoints.c    its id, who sends it (auth), the endpoint table, /v1/models
 *   limits.c       its tenant's rates: fleet-wide through Redis, else local
 *   spend.c        its tenant's budget, and what it cost (front/spend.h)
 *   dispatch.c     where it goes (a local worker or the routing decision's
 *                  regions), and failover
 *   relay.c        the upstream stream: the request out, the answer back
 *   respond.c      answers made here (OpenAI error objects, small bodies)
 *   request_end.c  its end: the access log line, metrics, settling its charge
 * (serve_metrics.c declares the metric families they count into.) */
#ifndef GW_REQUEST_INTERNAL_H
#define GW_REQUEST_INTERNAL_H

#include "gateway/front/serve_internal.h"
#include "gateway/base/prefix.h"
#include "gateway/front/body_fields.h"

#include "routing/router.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define MAX_NEED_TAGS 16
#define NEED_TAG_MAX 32 /* a residency tag's bytes, its NUL included */
#define SSE_LINE_HEAD 14 /* bytes of an SSE line that tell its kind: "data: {\"error\"" */

typedef struct gw_front_req gw_front_req;

struct gw_front_req {
    gw_serve *g;
    gw_http_stream *stream; /* NULL once closed */
    const gw_http_request *req;
    gw_upstream_req *up;
    char id[48];
    char model[GW_BODY_MODEL_MAX];
    char tenant[GW_TENANT_NAME_MAX + 1];
    int worker, tries, status;
    int local_tries; /* of the tries, those sent to a local worker (MAX_TRIES) */
    bool responded, sse, logged;
    bool sse_error;              /* the answer's stream held an error event */
    bool cut;                    /* the upstream failed after the status went out */
    bool stalled;                /* answered 504: the upstream held it response_timeout_ms, unanswered */
    bool forwarded;              /* came from a peer region: served here, never forwarded again */
    bool health_check;           /* a peer's active health check (front/health.h): no tenant's request */
    bool limit_pending;          /* waiting for the shared rate limit's answer */
    int limit_stage;             /* LIMIT_RPS or LIMIT_TPM (limits.c) */
    route_decision route;        /* candidate regions, in order */
    int cand;                    /* candidates taken: the one being tried is route.cand[cand - 1] */
    bool probe;                  /* the request is the probe of the region it is sent to */
    uint64_t probe_claim;        /* which claim of that probe it holds (route_region_probe_claim) */
    route_region *remote;        /* the remote region being tried; NULL when local */
    uint64_t remote_id;          /* its id then: the table may have dropped it since (route_region_is) */
    /* What every candidate must have, kept for failover: a record may
     * change between the decision and a later candidate, and a reload may
     * drop the tenant whose residency it was. need[] points into need_buf;
     * need_list is the same tags comma-joined, sent to the peer. */
    const char *need[MAX_NEED_TAGS];
    int n_need;
    char need_buf[MAX_NEED_TAGS * NEED_TAG_MAX];
    char need_list[MAX_NEED_TAGS * NEED_TAG_MAX];
    double max_price;
    char region[ROUTE_NAME_MAX]; /* the region that answers */
    const char *error_kind; /* upstream failure, for the log */
    double est_at_send;     /* sent to a local worker with a free slot: its TTFT estimate then (ms); else 0 */
    size_t bytes_out, unconsumed;
    double t_start, t_first, t_last;
    double t_sent; /* when the last try went out: what hangup_tokens counts from */
    int events;
    char sse_head[SSE_LINE_HEAD]; /* the first bytes of the SSE line being read */
    int sse_head_len;             /* of them; -1: past them, until the line ends */
    gw_usage_scan usage; /* completion_tokens of the answer, read as it passes */
    double charged;      /* tokens taken from the tenant's budget: prompt and completion estimates */
    double charged_completion; /* of which the completion's */
    /* The prompt's tokens as the worker counted them (its
     * x-infergate-prompt-tokens, passed on by a region's gateway), -1
     * until said: what the prompt's estimate is corrected to. */
    int prompt_tokens;
    bool charged_shared;       /* taken from the fleet-wide (Redis) bucket, not the local one */
    bool budget_pending;       /* waiting for the fleet's spend, for the tenant's budget (spend.c) */
    bool spend_counted;        /* its cost was counted (spend.c): the log says it */
    double price_in, price_out; /* the serving region's, per million tokens, when it was chosen */
    double max_cost;            /* x-infergate-max-cost; 0: none */
    int cost_skipped;           /* candidates passed over: their worst case was over max_cost */
    double min_worst;           /* the least worst case of those */
    double cost;                /* what it cost, once counted (the sum of its tries' shares) */
    bool spend_prompt_done;     /* its prompt was counted, under the try that served it (a replay's) */
    int spend_tokens_done;      /* completion tokens counted so far, under the tries that served them */
    /* The policy that routed it and who chose it ("header", "tenant",
     * "fleet"): placement.c; NULL when it was not routed. */
    const char *intent_policy, *intent_source;
    /* Its energy (Wh) and emissions (gCO2e) estimate, the sum of its
     * tries' (gw_placement_try_end); 0 unless a worker or region of known
     * power served it. */
    double energy_wh, gco2e;
    /* The try out now (placement.c): what serves it and what its energy is
     * known by, so that each try's share is counted once, under its own
     * region, however it ends (a cut stream, a replay, a client gone). */
    struct gw_front_try {
        bool open, remote, said;
        int worker;
        char region[ROUTE_NAME_MAX];
        double t0;
        double watts, carbon; /* the region's x-infergate-power (its rate); 0: not said */
        double wh, gco2e;     /* its x-infergate-energy trailer, once said */
    } etry;
    /* Cache-aware choice of local worker (dispatch.c): the body's prompt-
     * prefix chain, hashed at the first choice among several workers, and
     * the session (x-infergate-session, else the body's `user`; 0: none). */
    bool chain_done;
    uint64_t session;
    gw_prefix_chain chain;
    /* SSE: the bytes after the last whole event, held back (relay.c) */
    uint8_t *hold;
    size_t hold_len;
    /* Token replay (replay.c) */
    bool replay_asked; /* the worker was asked to tag its events with their tokens */
    bool replay_pass;  /* forwarded by an origin that asked: tags and run pass back unread */
    bool replay_end;   /* the last token's tag came: nothing is left to resume */
    bool resuming;     /* the try out continues the answer: its status is not passed on */
    int replays;
    char replay_run[96]; /* the worker's "ID CREATED SEED", empty until said */
    char replay_off[64]; /* or why it cannot resume this request ("off WHY") */
    int32_t *rtoks;      /* the tokens delivered */
    int n_rtoks, cap_rtoks;
    uint8_t *rbuf; /* what came of an event not yet whole */
    size_t rbuf_len, rbuf_cap;
    char *resume_hdr; /* x-infergate-resume, as last sent */
    /* Hedging (hedge.c): the body's max_tokens (-1: not given) and stream,
     * read for completions only (completion) */
    bool completion, stream_asked;
    long long max_tokens;
    struct gw_front_hedge *hedge; /* NULL: not hedgeable */
};

/* Whether the request's path, before any query, is path. */
static inline bool gw_front_path_is(const gw_http_request *r, const char *path)
{
    size_t plen = strcspn(r->path, "?");
    return plen == strlen(path) && !strncmp(r->path, path, plen);
}

/* Writes v in decimal (at most 11 bytes, no NUL) and returns the end:
 * printf's machinery costs more than the rest of a header. */
static inline char *gw_front_put_int(char *o, int v)
{
    char digits[12];
    int n = 0;
    unsigned u = v < 0 ? 0u - (unsigned)v : (unsigned)v;
    do
        digits[n++] = (char)('0' + u % 10);
    while (u /= 10);
    if (v < 0)
        *o++ = '-';
    while (n > 0)
        *o++ = digits[--n];
    return o;
}

/* ---- respond.c: answers made here, with the request's id ---- */

/* An OpenAI error object (message printf-style, cut at 511 bytes; code
 * and param NULL: null), with retry-after when retry_after > 0. A response
 * that cannot be queued resets the stream. */
void gw_front_respond(gw_front_req *p, int status, const char *type, const char *code, const char *param,
                      int retry_after, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
/* As gw_front_respond (no param), with x-should-retry: false: the OpenAI
 * SDKs retry a 429 unless told not to, and what it says (an exhausted
 * budget) does not pass within their retries. */
void gw_front_respond_final(gw_front_req *p, int status, const char *type, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* 405, naming the methods the path takes (RFC 9110 15.5.6) in allow. */
void gw_front_respond_not_allowed(gw_front_req *p, const char *allow);
/* A body of this content type, copied. */
void gw_front_respond_plain(gw_front_req *p, int status, const char *ctype, const char *body, size_t len);

/* ---- dashboard.c: the operators' page in a browser ---- */

/* The admin key a browser sends for /dashboard: its login cookie (decoded
 * into buf), else a ?key= in the URL (pointing into r->path); NULL if
 * neither. */
const char *gw_dashboard_key(const gw_http_request *r, char *buf, size_t cap);
/* The dashboard's page body (regions.c's), with its security headers; a
 * url_key (the ?key= it was opened with) is set as its cookie. */
void gw_dashboard_page(gw_front_req *p, const char *body, size_t len, const char *url_key);
/* The login form, answered `status`; `why` (a refused key) is shown, and
 * the cookie cleared. */
void gw_dashboard_login_page(gw_front_req *p, int status, const char *why);
/* POST /dashboard/login (form field key): an admin key is set as the
 * cookie and the browser sent to /dashboard (303); else the form again. */
void gw_dashboard_login(gw_front_req *p);
/* The login form's head declares a body small enough to read from anyone. */
bool gw_dashboard_login_fits(const gw_http_request *r);

/* ---- limits.c: the tenant's rates ---- */

/* Charges the tenant an estimate of the request's tokens (its body's
 * bytes / 4 for the prompt, or its token ids if more; for the answer max_tokens, or when it is not
 * given (<= 0) 256 for a chat, 16 else) and checks its limits, fleet-wide while Redis is connected:
 * then dispatches the request, or answers 429. The answer may come later,
 * from Redis (p->limit_pending meanwhile). */
void gw_front_limit(gw_front_req *p, long long max_tokens, long long prompt_ids);
/* The client left: a check of the shared limit still out is let go. */
void gw_front_limit_cancel(gw_front_req *p);
/* Settles the charge once the answer is known; tokens: the completion's,
 * -1 when they were not counted. The prompt's estimate is corrected to
 * p->prompt_tokens when the worker said it. */
void gw_front_limit_settle(gw_front_req *p, double now, int tokens);

/* ---- spend.c: spend and budgets (front/spend.h) ---- */

/* Holds the request's tenant to its budget (the fleet's spend read from
 * Redis first while connected; the request waits, p->budget_pending):
 * then dispatches it, or answers 429 insufficient_quota. */
void gw_front_budget(gw_front_req *p);
/* The client left: a read of the fleet's spend still out is let go. */
void gw_front_budget_cancel(gw_front_req *p);
/* Counts a served request's cost and tokens (tokens: the completion's, -1
 * when not counted), at the price it was sent at; its energy and gCO2e
 * went in per try (gw_front_spend_energy). */
void gw_front_spend_count(gw_front_req *p, int tokens);
/* A streamed try that ends in a token replay (replay.c), before the
 * request moves on: what it served is counted under its own region at its
 * prices (the prompt, unless an earlier try's, and the completion tokens
 * delivered since the last share), so that each region's spend is its
 * own; gw_front_spend_count then counts the rest under the last. */
void gw_front_spend_share(gw_front_req *p, int delivered);
/* One try's energy and gCO2e, counted under the region that served it
 * (region: as p->region was for that try), into the fleet's rows: a
 * stream replayed elsewhere counts each region's share there. The tokens,
 * cost and request go in gw_front_spend_count's row. */
void gw_front_spend_energy(gw_front_req *p, const char *region, double wh, double gco2e);
/* The request's worst case at these prices: the prompt and completion
 * tokens its tenant was charged for (gw_front_limit's estimate). */
double gw_front_worst_cost(const gw_front_req *p, double price_in, double price_out);

/* ---- dispatch.c: where it goes, and failover ---- */

/* Sends the request to a local worker or to its first candidate region,
 * or answers why it cannot be (400 residency or max price, 404 model, 421
 * residency of a forwarded request, 503 nothing ready). */
void gw_front_dispatch(gw_front_req *p);
/* The residency tags the request needs: the tenant's (tc may be NULL),
 * narrowed by x-infergate-residency, into need[MAX_NEED_TAGS] (pointing
 * into buf and tc). Returns the count, -1 for a malformed header. */
int gw_front_need_tags(gw_front_req *p, const gw_tenant_cfg *tc, char *buf, size_t cap, const char **need);
/* A try failed before its first response byte: sends the request on (a
 * sibling worker, the next candidate) while the retry budget lasts; false
 * when it was not (then the caller answers). region_at_fault: the remote
 * region tried is told it failed. */
bool gw_front_retry(gw_front_req *p, bool region_at_fault);
/* Sends the request to the next target as failover chooses it (a sibling
 * worker once, else the next candidate region), no retry spent; false
 * when there is none. */
bool gw_front_send_next(gw_front_req *p);
/* A local worker's KV cache is too small: a sibling's larger one, once. */
bool gw_front_retry_on_larger(gw_front_req *p);
/* The remote region tried, NULL when local or when the table dropped it. */
route_region *gw_front_remote_region(const gw_front_req *p);
/* Tells the remote region tried (if any) how the request went. */
void gw_front_region_report(gw_front_req *p, bool ok);
void gw_front_region_failed(gw_front_req *p);
/* A probe the request holds and will not report goes to the next one. */
void gw_front_probe_give_back(gw_front_req *p);

/* ---- relay.c: the upstream stream ---- */

/* The upstream callbacks of a request (ud: the gw_front_req). */
extern const gw_upstream_cbs gw_front_up_cbs;

/* Sends the request to p->worker, or to p->remote when set; a target that
 * cannot be used fails as a connect would (failover included). */
void gw_front_send_upstream(gw_front_req *p);

/* ---- replay.c: mid-stream failover by token replay ---- */

/* A client's x-infergate-resume or x-infergate-replay: answers 400 and
 * returns -1 (a peer region's, p->forwarded, are taken); else 0. */
int gw_front_replay_refuse_client(gw_front_req *p);
/* The headers the next try carries for replay, into h (room for 2);
 * returns how many. */
size_t gw_front_replay_headers(gw_front_req *p, gw_http_header *h);
/* Reads the upstream's x-infergate-replay (a forwarded request's is
 * passed back: added to out at *k, room for one). */
void gw_front_replay_response(gw_front_req *p, const gw_http_header *hs, size_t n, gw_http_header *out,
                              size_t *k);
/* A resumed try's response continues the run the stream is of. */
bool gw_front_replay_same_run(const gw_front_req *p, const gw_http_header *hs, size_t n);
/* Streamed data of a request that asked for tags: whole events to the
 * client, tags read and stripped. 0; 1 the upstream sent an error event
 * (dropped: to be replayed); or gw_http_write's error. */
int gw_front_replay_write(gw_front_req *p, const uint8_t *data, size_t len);
/* The upstream failed mid-stream (the region, if remote, already told):
 * sends the request on with the tokens delivered (a retry spent, as
 * gw_front_retry) and returns true; false (logged, counted) when it
 * cannot be. */
bool gw_front_replay(gw_front_req *p);
void gw_front_replay_free(gw_front_req *p);
/* "region NAME" or "worker N": the target tried, for the log. */
const char *gw_front_target_said(const gw_front_req *p, char *buf, size_t cap);

/* ---- hedge.c: hedged requests ---- */

/* After the first try went out: a short answer not streamed, with
 * routing.hedge on, gets a second copy if it has not answered after the
 * delay (the copy is sent by gw_front_send_next, with hedge.c's callbacks). */
void gw_front_hedge_arm(gw_front_req *p);
/* Whether gw_front_send_upstream is sending the copy: then its callbacks
 * are *cbs, with *ud. */
bool gw_front_hedge_sending(gw_front_req *p, const gw_upstream_cbs **cbs, void **ud);
/* The try out answered status (relay.c, first thing): true when it failed
 * and the copy out takes its place (the caller returns); false to go on
 * (a copy out lost: cancelled). */
bool gw_front_hedge_primary_answered(gw_front_req *p, int status);
/* The try out failed before answering (p->up gone): true when the copy
 * out takes its place; at_fault: its region is told it failed. */
bool gw_front_hedge_primary_failed(gw_front_req *p, bool at_fault);
/* The client left: a copy out is cancelled. */
void gw_front_hedge_stop(gw_front_req *p);
void gw_front_hedge_free(gw_front_req *p);
/* What became of the hedge, for the log ("won_hedge", "suppressed", ...);
 * NULL when none was due. */
const char *gw_front_hedge_said(const gw_front_req *p);

/* ---- request_end.c ---- */

/* x-infergate-route and the log's route: the decision's reason, or the
 * failover's, composed in buf (n bytes). */
const char *gw_front_route_said(const gw_front_req *p, char *buf, size_t n);

#endif
