/* Spend and budgets (front/spend.h): a served request's cost, tokens and
 * emissions counted at its end, into /metrics and into Redis (what Redis
 * has not acknowledged is kept and sent again: none lost while it is
 * away); a tenant's budget checked before its request is dispatched. */
#include "gateway/front/spend.h"
#include "gateway/front/request_internal.h"

#include "routing/sync.h"

#include <event2/event.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SPEND_BUCKETS 1024
#define SPEND_FLUSH_MS 500
/* Unsent (tenant, model, region, day) rows kept while Redis is away; past
 * it the breakdown of what is counted is lost (the budget's figures are
 * kept all the same), said once. */
#define SPEND_MAX_ROWS 100000
#define DAY_LEN 11 /* "YYYY-MM-DD" and its NUL */

/* A tenant's figures for its budget, for the day (and its month) in day. */
typedef struct spend_account {
    struct spend_account *next;
    char tenant[GW_TENANT_NAME_MAX + 1];
    char day[DAY_LEN];
    double fleet_day, fleet_month;   /* the cost Redis last said */
    double unsent_day, unsent_month; /* counted here, not yet acknowledged by Redis */
} spend_account;

/* What this gateway counted for one (day, tenant, model, region) and Redis
 * has not acknowledged: v waiting, fly sent and unanswered. */
typedef struct spend_row {
    struct spend_row *next;
    gw_spend *sp;
    char day[DAY_LEN];
    char tenant[GW_TENANT_NAME_MAX + 1];
    char model[GW_BODY_MODEL_MAX];
    char region[ROUTE_NAME_MAX];
    double v[ROUTE_SPEND_N], fly[ROUTE_SPEND_N];
    bool in_flight;
} spend_row;

struct gw_spend {
    gw_serve *g;
    struct event *flush_ev;
    spend_account *acct[SPEND_BUCKETS];
    spend_row *rows[SPEND_BUCKETS];
    int n_rows;
    bool rows_full_said;
};

double gw_spend_cost(double price_in, double price_out, double prompt_tokens, double completion_tokens)
{
    return (price_in * prompt_tokens + price_out * completion_tokens) / 1e6;
}

static unsigned hash_str(unsigned h, const char *s)
{
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

static void today(char day[DAY_LEN])
{
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(day, DAY_LEN, "%Y-%m-%d", &tm);
}

/* The tenant's account, rolled to `day` (a new day starts from 0, a new
 * month too); NULL on out of memory. */
static spend_account *account(gw_spend *sp, const char *tenant, const char *day)
{
    unsigned b = hash_str(2166136261u, tenant) % SPEND_BUCKETS;
    spend_account *a = sp->acct[b];
    while (a && strcmp(a->tenant, tenant))
        a = a->next;
    if (!a) {
        if (!(a = calloc(1, sizeof(*a))))
            return NULL;
        snprintf(a->tenant, sizeof(a->tenant), "%s", tenant);
        snprintf(a->day, sizeof(a->day), "%s", day);
        a->next = sp->acct[b];
        sp->acct[b] = a;
    }
    if (strcmp(a->day, day) > 0)
        return a; /* an answer about yesterday after midnight */
    if (strncmp(a->day, day, 7)) {
        a->fleet_month = a->unsent_month = 0;
    }
    if (strcmp(a->day, day)) {
        a->fleet_day = a->unsent_day = 0;
        snprintf(a->day, sizeof(a->day), "%s", day);
    }
    return a;
}

/* ---- Redis: sending what it has not taken ---- */

static bool row_empty(const double *v)
{
    for (int i = 0; i < ROUTE_SPEND_N; i++)
        if (v[i] != 0)
            return false;
    return true;
}

static void row_remove(spend_row *r)
{
    gw_spend *sp = r->sp;
    unsigned b = hash_str(hash_str(hash_str(hash_str(2166136261u, r->day), r->tenant), r->model), r->region) %
                 SPEND_BUCKETS;
    for (spend_row **pp = &sp->rows[b]; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            sp->n_rows--;
            free(r);
            return;
        }
}

static void row_send(spend_row *r);

/* Redis answered a row's addition: what it took leaves the unsent
 * figures, and its totals become the fleet's; else it is sent again. */
static void on_added(void *ud, int result, double day_cost, double month_cost)
{
    spend_row *r = ud;
    gw_spend *sp = r->sp;
    r->in_flight = false;
    if (result) {
        for (int i = 0; i < ROUTE_SPEND_N; i++)
            r->v[i] += r->fly[i];
        memset(r->fly, 0, sizeof(r->fly));
        return; /* the timer sends it again */
    }
    char day[DAY_LEN];
    today(day);
    spend_account *a = account(sp, r->tenant, day);
    if (a && !strcmp(a->day, r->day)) {
        a->unsent_day = fmax(0, a->unsent_day - r->fly[ROUTE_SPEND_COST]);
        a->fleet_day = fmax(a->fleet_day, day_cost);
    }
    if (a && !strncmp(a->day, r->day, 7)) {
        a->unsent_month = fmax(0, a->unsent_month - r->fly[ROUTE_SPEND_COST]);
        a->fleet_month = fmax(a->fleet_month, month_cost);
    }
    memset(r->fly, 0, sizeof(r->fly));
    if (row_empty(r->v))
        row_remove(r);
}

static void row_send(spend_row *r)
{
    route_sync *s = r->sp->g->sync;
    if (r->in_flight || row_empty(r->v) || !s || !route_sync_connected(s))
        return;
    route_spend a = {.tenant = r->tenant, .model = r->model, .region = r->region, .day = r->day};
    memcpy(a.v, r->v, sizeof(a.v));
    int rc = route_sync_spend_add(s, &a, on_added, r);
    if (rc == -EINVAL) { /* names Redis keys cannot hold: never sendable */
        fprintf(stderr, "infergate: spend: cannot send tenant '%s' model '%s' region '%s' to Redis\n",
                r->tenant, r->model, r->region);
        row_remove(r);
        return;
    }
    if (rc)
        return;
    memcpy(r->fly, r->v, sizeof(r->fly));
    memset(r->v, 0, sizeof(r->v));
    r->in_flight = true;
}

static void on_flush(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_spend *sp = arg;
    if (!sp->g->sync || !route_sync_connected(sp->g->sync))
        return;
    for (int b = 0; b < SPEND_BUCKETS; b++)
        for (spend_row *r = sp->rows[b], *next; r; r = next) {
            next = r->next;
            row_send(r);
        }
}

/* Adds v to its row (made when new) and sends it when nothing of it is
 * in flight. */
static void row_add(gw_spend *sp, const char *day, const char *tenant, const char *model, const char *region,
                    const double *v)
{
    unsigned b =
        hash_str(hash_str(hash_str(hash_str(2166136261u, day), tenant), model), region) % SPEND_BUCKETS;
    spend_row *r = sp->rows[b];
    while (r && (strcmp(r->day, day) || strcmp(r->tenant, tenant) || strcmp(r->model, model) ||
                 strcmp(r->region, region)))
        r = r->next;
    if (!r) {
        if (sp->n_rows >= SPEND_MAX_ROWS || !(r = calloc(1, sizeof(*r)))) {
            if (!sp->rows_full_said)
                fprintf(stderr,
                        "infergate: spend: %d rows wait for Redis; the breakdown of what is counted "
                        "from now on is not sent (budgets still hold it)\n",
                        sp->n_rows);
            sp->rows_full_said = true;
            return;
        }
        r->sp = sp;
        snprintf(r->day, sizeof(r->day), "%s", day);
        snprintf(r->tenant, sizeof(r->tenant), "%s", tenant);
        snprintf(r->model, sizeof(r->model), "%s", model);
        snprintf(r->region, sizeof(r->region), "%s", region);
        r->next = sp->rows[b];
        sp->rows[b] = r;
        sp->n_rows++;
    }
    for (int i = 0; i < ROUTE_SPEND_N; i++)
        r->v[i] += v[i];
    row_send(r);
}

gw_spend *gw_spend_new(gw_serve *g)
{
    gw_spend *sp = calloc(1, sizeof(*sp));
    if (!sp)
        return NULL;
    sp->g = g;
    struct timeval tv = {0, SPEND_FLUSH_MS * 1000};
    if (!(sp->flush_ev = event_new(g->base, -1, EV_PERSIST, on_flush, sp)) || event_add(sp->flush_ev, &tv)) {
        gw_spend_free(sp);
        return NULL;
    }
    return sp;
}

void gw_spend_free(gw_spend *sp)
{
    if (!sp)
        return;
    if (sp->flush_ev)
        event_free(sp->flush_ev);
    double lost = 0;
    for (int b = 0; b < SPEND_BUCKETS; b++) {
        for (spend_row *r = sp->rows[b], *next; r; r = next) {
            next = r->next;
            lost += r->v[ROUTE_SPEND_COST] + r->fly[ROUTE_SPEND_COST];
            if (r->in_flight && sp->g->sync)
                route_sync_spend_cancel(sp->g->sync, r);
            free(r);
        }
        for (spend_account *a = sp->acct[b], *next; a; a = next) {
            next = a->next;
            free(a);
        }
    }
    if (lost > 0)
        fprintf(stderr,
                "infergate: spend: %g counted here was not acknowledged by Redis (lost, or in flight)\n",
                lost);
    free(sp);
}

/* ---- the end of a request: counting ---- */

static void count_metrics(gw_front_req *p, const char *tenant, const double *v)
{
    char t[2 * GW_TENANT_NAME_MAX + 1], m[2 * GW_BODY_MODEL_MAX + 1], r[2 * ROUTE_NAME_MAX + 1], labels[600];
    gw_metrics_escape(tenant, t, sizeof(t));
    gw_metrics_escape(p->model[0] ? p->model : "-", m, sizeof(m));
    gw_metrics_escape(p->region[0] ? p->region : "-", r, sizeof(r));
    gw_metrics *mx = p->g->metrics;
    int n = snprintf(labels, sizeof(labels), "tenant=\"%s\",model=\"%s\",region=\"%s\"", t, m, r);
    gw_metrics_add(mx, "infergate_spend_total", labels, v[ROUTE_SPEND_COST]);
    snprintf(labels + n, sizeof(labels) - (size_t)n, ",kind=\"prompt\"");
    gw_metrics_add(mx, "infergate_tokens_total", labels, v[ROUTE_SPEND_PROMPT]);
    snprintf(labels + n, sizeof(labels) - (size_t)n, ",kind=\"completion\"");
    gw_metrics_add(mx, "infergate_tokens_total", labels, v[ROUTE_SPEND_COMPLETION]);
}

/* One try's share of a request (prompt and completion tokens, and the
 * request itself when `requests`), at p's present prices and under its
 * present region. */
static void count_share(gw_front_req *p, double prompt, double completion, int requests)
{
    gw_spend *sp = p->g->spend;
    double v[ROUTE_SPEND_N] = {
        [ROUTE_SPEND_COST] = gw_spend_cost(p->price_in, p->price_out, prompt, completion),
        [ROUTE_SPEND_PROMPT] = prompt,
        [ROUTE_SPEND_COMPLETION] = completion,
        [ROUTE_SPEND_REQUESTS] = requests, /* its energy went in per try (gw_front_spend_energy) */
    };
    const char *tenant = p->tenant[0] ? p->tenant : "-";
    p->cost += v[ROUTE_SPEND_COST];
    p->spend_counted = true;
    count_metrics(p, tenant, v);
    char day[DAY_LEN];
    today(day);
    spend_account *a = account(sp, tenant, day);
    if (a) {
        a->unsent_day += v[ROUTE_SPEND_COST];
        a->unsent_month += v[ROUTE_SPEND_COST];
    }
    if (p->g->sync) /* without Redis the account is all there is */
        row_add(sp, day, tenant, p->model, p->region, v);
}

/* The prompt as the worker counted it (else the estimate the tenant was
 * charged), unless an earlier try's share counted it. */
static double prompt_left(gw_front_req *p)
{
    if (p->spend_prompt_done)
        return 0;
    p->spend_prompt_done = true;
    return p->prompt_tokens >= 0 ? p->prompt_tokens : (double)(p->req->body_len / 4);
}

void gw_front_spend_share(gw_front_req *p, int delivered)
{
    if (!p->g->spend || p->forwarded || p->tries == 0 || delivered < p->spend_tokens_done)
        return;
    double prompt = prompt_left(p), completion = delivered - p->spend_tokens_done;
    p->spend_tokens_done = delivered;
    count_share(p, prompt, completion, 0);
}

/* A request that reached a worker or region and was answered (or hung up
 * on, or stalled, once sent): its prompt and the completion tokens seen,
 * less what a replayed try's share counted (gw_front_spend_share). */
void gw_front_spend_count(gw_front_req *p, int tokens)
{
    if (!p->g->spend || p->forwarded || p->tries == 0 || !(p->status == 200 || p->status == 499 || p->stalled))
        return;
    double completion = tokens > p->spend_tokens_done ? tokens - p->spend_tokens_done : 0;
    count_share(p, prompt_left(p), completion, 1);
}

void gw_front_spend_energy(gw_front_req *p, const char *region, double wh, double gco2e)
{
    gw_spend *sp = p->g->spend;
    if (!sp || p->forwarded || !p->g->sync)
        return;
    double v[ROUTE_SPEND_N] = {[ROUTE_SPEND_GCO2E] = gco2e, [ROUTE_SPEND_ENERGY_WH] = wh};
    char day[DAY_LEN];
    today(day);
    row_add(sp, day, p->tenant[0] ? p->tenant : "-", p->model, region, v);
}

/* ---- the start of a request: its tenant's budget ---- */

/* What the budget holds the tenant to, as of its last request, for the
 * dashboard and alerts. */
static void budget_gauges(gw_serve *g, const gw_tenant_cfg *tc, double used_day, double used_month)
{
    char labels[2 * GW_TENANT_NAME_MAX + 40], t[2 * GW_TENANT_NAME_MAX + 1];
    gw_metrics_escape(tc->name, t, sizeof(t));
    for (int month = 0; month < 2; month++) {
        double budget = month ? tc->budget_monthly : tc->budget_daily;
        if (!(budget > 0))
            continue;
        snprintf(labels, sizeof(labels), "tenant=\"%s\",period=\"%s\"", t, month ? "month" : "day");
        gw_metrics_set(g->metrics, "infergate_budget_spend", labels, month ? used_month : used_day);
        gw_metrics_set(g->metrics, "infergate_budget", labels, budget);
    }
}

static void budget_decide(gw_front_req *p)
{
    gw_serve *g = p->g;
    const gw_tenant_cfg *tc = gw_serve_tenant_cfg(g, p->tenant);
    char day[DAY_LEN];
    today(day);
    spend_account *a = tc ? account(g->spend, p->tenant, day) : NULL;
    if (a) {
        double used_day = a->fleet_day + a->unsent_day, used_month = a->fleet_month + a->unsent_month;
        budget_gauges(g, tc, used_day, used_month);
        bool daily = tc->budget_daily > 0 && used_day >= tc->budget_daily;
        if (daily || (tc->budget_monthly > 0 && used_month >= tc->budget_monthly)) {
            gw_front_respond_final(
                p, 429, "insufficient_quota", "insufficient_quota",
                "tenant '%s' has spent %.6g of its %s budget of %.6g; it renews at the start of the "
                "next UTC %s",
                p->tenant, daily ? used_day : used_month, daily ? "daily" : "monthly",
                daily ? tc->budget_daily : tc->budget_monthly, daily ? "day" : "month");
            return;
        }
    }
    gw_front_dispatch(p);
}

static void on_budget_read(void *ud, int result, double day_cost, double month_cost)
{
    gw_front_req *p = ud;
    p->budget_pending = false;
    char day[DAY_LEN];
    today(day);
    spend_account *a = result == 0 ? account(p->g->spend, p->tenant, day) : NULL;
    if (a && !strcmp(a->day, day)) {
        /* Spend only grows within a period: an answer that crossed an
         * addition's in flight is not allowed to take it back. */
        a->fleet_day = fmax(a->fleet_day, day_cost);
        a->fleet_month = fmax(a->fleet_month, month_cost);
    }
    budget_decide(p);
}

void gw_front_budget(gw_front_req *p)
{
    gw_serve *g = p->g;
    const gw_tenant_cfg *tc = p->forwarded || !p->tenant[0] ? NULL : gw_serve_tenant_cfg(g, p->tenant);
    if (!g->spend || !tc || !(tc->budget_daily > 0 || tc->budget_monthly > 0)) {
        gw_front_dispatch(p);
        return;
    }
    char day[DAY_LEN];
    today(day);
    if (g->sync && route_sync_connected(g->sync) &&
        route_sync_spend_read(g->sync, p->tenant, day, on_budget_read, p) == 0) {
        p->budget_pending = true;
        return;
    }
    budget_decide(p); /* the last figures seen, and what was counted here since */
}

void gw_front_budget_cancel(gw_front_req *p)
{
    if (p->budget_pending)
        route_sync_spend_cancel(p->g->sync, p);
    p->budget_pending = false;
}

double gw_front_worst_cost(const gw_front_req *p, double price_in, double price_out)
{
    return gw_spend_cost(price_in, price_out, p->charged - p->charged_completion, p->charged_completion);
}
