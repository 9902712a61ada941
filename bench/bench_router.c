/* Cost of one routing decision (route_decide) for 16 and 256 regions.
 *
 * Regions are random (fixed seed): each serves a random subset of 8 models,
 * the queried model is served by every other region, each carries 0 to 3
 * of 6 residency tags, random prices, RTTs, capacity and load; a few are
 * unhealthy, stale or ejected so every filter runs. The query asks for that
 * model with one residency tag. Each run times RUNS_N decisions; the median
 * of RUNS runs is printed as a Markdown table (per policy: latency, cost,
 * latency spread, carbon, and primary with three listed regions, taken
 * from the latency order's 4th, 6th and 8th candidates so that the list
 * is searched, not met first).
 *
 *   build-route/bench_router [decisions-per-run] */
#include "bench/bench_util.h"
#include "routing/region.h"
#include "routing/router.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RUNS 7

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static route_table *make_table(int n, unsigned seed, int64_t now)
{
    static const char *const models[] = {"llama-7b", "llama-70b", "mistral-7b", "qwen-14b",
                                         "phi-3",    "gemma-9b",  "tiny",       "mixtral"};
    static const char *const tags[] = {"eu", "us", "gdpr", "hipaa", "apac", "edge"};
    route_table_opts o = {
        .stale_after_ms = 3000, .eject_after = 3, .eject_base_ms = 1000, .eject_max_ms = 30000};
    route_table *t = route_table_new(&o, n);
    if (!t)
        return NULL;
    srand(seed);
    for (int i = 0; i < n; i++) {
        route_record r;
        memset(&r, 0, sizeof(r));
        snprintf(r.name, sizeof(r.name), "region-%03d", i);
        snprintf(r.endpoint, sizeof(r.endpoint), "tls:10.0.%d.%d:8443", i / 250, i % 250 + 1);
        if (i % 2 == 0)
            strcpy(r.models[r.n_models++], models[0]); /* the queried model: half the regions */
        for (int m = 1; m < 8; m++)
            if (rand() % 3 == 0)
                strcpy(r.models[r.n_models++], models[m]);
        for (int g = 0; g < 6 && r.n_tags < 3; g++)
            if (rand() % 4 == 0)
                strcpy(r.tags[r.n_tags++], tags[g]);
        r.price_in = (rand() % 100) / 100.0;
        r.price_out = (rand() % 400) / 100.0;
        strcpy(r.gpu, "H100");
        r.capacity = 8 + rand() % 56;
        r.running = rand() % 64;
        r.queued = rand() % 4 ? 0 : rand() % 30;
        r.ttft_ms = 5 + rand() % 60;
        r.tpot_ms = 5 + rand() % 30;
        r.healthy = rand() % 20 != 0;
        r.updated_ms = 1;
        r.carbon = 50 + (i * 53) % 700; /* not from rand(): the table stays the earlier runs' */
        /* half the regions publish their queue-based estimate (issue 34);
         * rand() left alone, so that the table is the one the earlier
         * runs timed, estimates aside */
        if (i % 2) {
            r.ttft_est_ms = 5 + (i * 37) % 400;
            r.n_load = r.n_models;
            for (int m = 0; m < r.n_load; m++)
                r.load_est_ms[m] = 5 + (i * 37 + m * 11) % 400;
        }
        int64_t seen = rand() % 20 == 0 ? now - 10000 : now;
        if (route_table_upsert(t, &r, i == 0, seen)) {
            route_table_free(t);
            return NULL;
        }
        route_table_set_rtt(t, r.name, 1 + (rand() % 2000) / 10.0, 250);
        if (rand() % 20 == 0)
            for (int k = 0; k < 3; k++)
                route_region_report(t, route_table_find(t, r.name), false, now);
    }
    return t;
}

int main(int argc, char **argv)
{
    long per_run = argc > 1 ? atol(argv[1]) : 100000;
    if (per_run < 1)
        per_run = 100000;
    const int sizes[] = {16, 256};
    const char *tag_eu[] = {"eu"};
    int64_t now = 1700000000000;
    unsigned long sink = 0;

    printf("| regions | policy | candidates | ns/decision (median of %d x %ld) | min | max |\n", RUNS,
           per_run);
    printf("|---:|---|---:|---:|---:|---:|\n");
    for (size_t si = 0; si < sizeof(sizes) / sizeof(*sizes); si++) {
        route_table *t = make_table(sizes[si], 42, now);
        if (!t) {
            fprintf(stderr, "bench_router: table setup failed\n");
            return 1;
        }
        /* latency, cost, latency spreading the first choice (routing.spread), carbon, primary */
        static const route_policy policy[] = {ROUTE_LATENCY, ROUTE_COST, ROUTE_LATENCY, ROUTE_CARBON, ROUTE_PRIMARY};
        static const char *const label[] = {"latency", "cost", "latency, spread", "carbon", "primary (3 listed)"};
        route_primary prim;
        {
            route_query lq = {.model = "llama-7b", .need_tags = tag_eu, .n_need_tags = 1, .now_ms = now};
            route_decision ld;
            route_decide(t, &lq, &ld);
            const char *names[3];
            int n = 0;
            for (int k = 3; k < ld.n && n < 3; k += 2)
                names[n++] = ld.cand[k]->rec.name;
            route_primary_init(&prim, names, n, 0.8, 3000);
        }
        for (int pol = 0; pol < 5; pol++) {
            route_query q = {.model = "llama-7b",
                             .need_tags = tag_eu,
                             .n_need_tags = 1,
                             .policy = policy[pol],
                             .primary = &prim,
                             .slo_ms = 300,
                             .now_ms = now,
                             .prompt_tokens = 500,
                             .output_tokens = 200,
                             .spread = pol == 2};
            route_decision d;
            double ns[RUNS];
            for (int i = 0; i < 1000; i++) /* warm the caches */
                sink += (unsigned long)route_decide(t, &q, &d);
            for (int run = 0; run < RUNS; run++) {
                int64_t t0 = now_ns();
                for (long i = 0; i < per_run; i++) {
                    q.now_ms = now + (i & 511); /* inside every back-off: no probe changes state */
                    sink += (unsigned long)route_decide(t, &q, &d);
                }
                ns[run] = (double)(now_ns() - t0) / (double)per_run;
            }
            qsort(ns, RUNS, sizeof(*ns), bench_cmp_double);
            printf("| %d | %s | %d | %.0f | %.0f | %.0f |\n", sizes[si], label[pol], d.n,
                   ns[RUNS / 2], ns[0], ns[RUNS - 1]);
        }
        route_table_free(t);
    }
    fprintf(stderr, "(checksum %lu)\n", sink);
    return 0;
}
