/* `infergate usage`: the fleet's tokens, spend and gCO2e by tenant, model
 * and region, read back from Redis (routing/sync.h: the day breakdowns the
 * gateways add each request to), as a table or as JSON. */
#include "gateway/cmd/cli.h"
#include "gateway/config/config.h"
#include "routing/sync.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage_usage(FILE *f)
{
    fprintf(f,
            "usage: infergate usage [options]\n"
            "\n"
            "Prints the requests, tokens, spend, energy and gCO2e the fleet's gateways counted, by tenant,\n"
            "model and region, from Redis (each UTC day is kept 400 days).\n"
            "\n"
            "options:\n"
            "  --tenant T          only tenant T\n"
            "  --since YYYY-MM-DD  from this UTC day (default: the first of this month)\n"
            "  --until YYYY-MM-DD  to this UTC day, included (default: today)\n"
            "  --json              one JSON object: {since, until, rows: [...], total}\n"
            "  --redis HOST:PORT   Redis server (default 127.0.0.1:6379; [v6addr]:PORT for IPv6)\n"
            "  --password P        Redis password (default: $INFERGATE_REDIS_PASSWORD)\n"
            "  --db N              Redis database (default 0)\n"
            "  --cluster NAME      key prefix shared by the fleet (default \"default\")\n"
            "  --config FILE       take Redis and cluster from a gateway config (the options above\n"
            "                      override it)\n");
}

typedef struct usage_row {
    char *tenant, *model, *region;
    double v[ROUTE_SPEND_N];
} usage_row;

typedef struct usage_sum {
    usage_row *rows;
    size_t n, cap;
    bool oom;
} usage_sum;

static void on_amount(void *ud, const char *day, int field, const char *region, const char *tenant,
                      const char *model, double value)
{
    (void)day;
    usage_sum *u = ud;
    size_t i = 0;
    while (i < u->n && (strcmp(u->rows[i].tenant, tenant) || strcmp(u->rows[i].model, model) ||
                        strcmp(u->rows[i].region, region)))
        i++;
    if (i == u->n) {
        if (u->n == u->cap) {
            size_t cap = u->cap ? 2 * u->cap : 64;
            usage_row *r = realloc(u->rows, cap * sizeof(*r));
            if (!r) {
                u->oom = true;
                return;
            }
            u->rows = r;
            u->cap = cap;
        }
        usage_row *r = &u->rows[u->n];
        memset(r, 0, sizeof(*r));
        r->tenant = strdup(tenant);
        r->model = strdup(model);
        r->region = strdup(region);
        u->n++;
        if (!r->tenant || !r->model || !r->region)
            u->oom = true;
    }
    u->rows[i].v[field] += value;
}

static int row_cmp(const void *a, const void *b)
{
    const usage_row *x = a, *y = b;
    int d = strcmp(x->tenant ? x->tenant : "", y->tenant ? y->tenant : "");
    if (!d)
        d = strcmp(x->model ? x->model : "", y->model ? y->model : "");
    return d ? d : strcmp(x->region ? x->region : "", y->region ? y->region : "");
}

static json_t *row_json(const usage_row *r)
{
    json_t *o = json_object();
    if (r->tenant) {
        json_object_set_new(o, "tenant", json_string(r->tenant));
        json_object_set_new(o, "model", json_string(r->model));
        json_object_set_new(o, "region", json_string(r->region));
    }
    for (int f = 0; f < ROUTE_SPEND_N; f++)
        json_object_set_new(o, route_spend_fields[f], json_real(r->v[f]));
    return o;
}

static void print_line(const char *t, const char *m, const char *r, const double *v)
{
    printf("%-20s %-24s %-12s %9.0f %12.0f %12.0f %14.6f %12.3f\n", t, m, r, v[ROUTE_SPEND_REQUESTS],
           v[ROUTE_SPEND_PROMPT], v[ROUTE_SPEND_COMPLETION], v[ROUTE_SPEND_COST], v[ROUTE_SPEND_GCO2E]);
}

static int print_usage(usage_sum *u, const char *since, const char *until, bool json)
{
    qsort(u->rows, u->n, sizeof(*u->rows), row_cmp);
    usage_row total = {0};
    for (size_t i = 0; i < u->n; i++)
        for (int f = 0; f < ROUTE_SPEND_N; f++)
            total.v[f] += u->rows[i].v[f];
    if (json) {
        json_t *o = json_object(), *rows = json_array();
        json_object_set_new(o, "since", json_string(since));
        json_object_set_new(o, "until", json_string(until));
        for (size_t i = 0; i < u->n; i++)
            json_array_append_new(rows, row_json(&u->rows[i]));
        json_object_set_new(o, "rows", rows);
        json_object_set_new(o, "total", row_json(&total));
        int rc = json_dumpf(o, stdout, JSON_INDENT(2) | JSON_REAL_PRECISION(12));
        json_decref(o);
        printf("\n");
        return rc;
    }
    printf("usage from %s to %s (UTC days)\n", since, until);
    printf("%-20s %-24s %-12s %9s %12s %12s %14s %12s\n", "TENANT", "MODEL", "REGION", "REQUESTS",
           "PROMPT_TOK", "COMPL_TOK", "SPEND", "GCO2E");
    for (size_t i = 0; i < u->n; i++)
        print_line(u->rows[i].tenant, u->rows[i].model, u->rows[i].region, u->rows[i].v);
    print_line("TOTAL", "", "", total.v);
    return 0;
}

static void usage_sum_free(usage_sum *u)
{
    for (size_t i = 0; i < u->n; i++) {
        free(u->rows[i].tenant);
        free(u->rows[i].model);
        free(u->rows[i].region);
    }
    free(u->rows);
}

int gw_cmd_usage(int argc, char **argv)
{
    gw_cli_redis rd;
    gw_cli_redis_init(&rd);
    const char *tenant = NULL;
    char since[16], until[16];
    bool json = false;
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(until, sizeof(until), "%Y-%m-%d", &tm);
    strftime(since, sizeof(since), "%Y-%m-01", &tm);

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--json")) {
            json = true;
            continue;
        }
        if (a[0] != '-' || i + 1 >= argc) {
            fprintf(stderr, "infergate usage: %s\n\n",
                    a[0] != '-' ? "no arguments but options" : "an option needs a value");
            usage_usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        int rc;
        if (!strcmp(a, "--tenant")) {
            tenant = v;
        } else if (!strcmp(a, "--since") || !strcmp(a, "--until")) {
            if (!route_spend_day_ok(v)) {
                fprintf(stderr, "infergate usage: %s: '%s' is not a day (YYYY-MM-DD)\n", a, v);
                return 2;
            }
            snprintf(a[2] == 's' ? since : until, sizeof(since), "%s", v);
        } else if ((rc = gw_cli_redis_option(&rd, "infergate usage", a, v)) != 0) {
            if (rc < 0)
                return 2;
        } else {
            fprintf(stderr, "infergate usage: unknown option '%s'\n\n", a);
            usage_usage(stderr);
            return 2;
        }
    }
    char err[512];
    gw_config *cfg = NULL;
    if (gw_cli_redis_config(&rd, "infergate usage", &cfg))
        return 1;
    usage_sum u = {0};
    int rc = route_usage_read(&rd.o, since, until, tenant, on_amount, &u, err, sizeof(err));
    if (rc)
        fprintf(stderr, "infergate usage: %s\n", err);
    else if (u.oom)
        fprintf(stderr, "infergate usage: out of memory\n");
    else
        rc = print_usage(&u, since, until, json);
    usage_sum_free(&u);
    gw_config_free(cfg);
    return rc || u.oom || fflush(stdout) ? 1 : 0;
}
