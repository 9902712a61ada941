/* libFuzzer target for the entries of gateways that share a region name
 * (routing/instance.c): any writer to Redis sets them, and every gateway
 * reads and merges them.
 *
 * Each input is up to ROUTE_MAX_INSTANCES + 2 entries, separated by an
 * empty line; an entry is lines of NAME=VALUE (any byte but a newline).
 * Each is decoded: when refused, there is a reason and the record is
 * unchanged; when taken, it passes route_record_check, and encoded and
 * decoded gives the same entry again. The taken ones merge into a record that passes
 * route_record_check and goes into a routing table, whose counts are
 * within the entries', and whose models, tags and endpoint are the lead's
 * (the first healthy entry with an endpoint, else the first healthy one). Violations are __builtin_trap so
 * the fuzzer keeps them. */
#define _GNU_SOURCE
#include "routing/instance.h"

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_CHECK(cond)                                                                                     \
    do {                                                                                                     \
        if (!(cond))                                                                                         \
            __builtin_trap();                                                                                \
    } while (0)

#define MAX_ENTRIES (ROUTE_MAX_INSTANCES + 2)

static void fresh(route_record *r)
{
    memset(r, 0, sizeof(*r));
    strcpy(r->name, "fz");
}

static bool has(const char *items, size_t stride, int n, const char *s)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(items + (size_t)i * stride, s))
            return true;
    return false;
}

static int used_lead(const route_record *inst, int n)
{
    for (int i = 0; i < n; i++)
        if (inst[i].healthy && inst[i].endpoint[0])
            return i;
    for (int i = 0; i < n; i++)
        if (inst[i].healthy)
            return i;
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static route_record inst[MAX_ENTRIES], back, before;
    static char buf[ROUTE_INSTANCE_VALUE_MAX], buf2[ROUTE_INSTANCE_VALUE_MAX];
    int n = 0;
    const char *p = (const char *)data, *end = p + size;
    while (p < end && n < MAX_ENTRIES) {
        const char *sep = memmem(p, (size_t)(end - p), "\n\n", 2), *e_end = sep ? sep + 1 : end;
        route_record *r = &inst[n];
        fresh(r);
        before = *r;
        char err[256] = "";
        int rc = route_instance_decode(r, p, (size_t)(e_end - p), err, sizeof(err));
        if (rc) {
            FUZZ_CHECK(rc == -EINVAL && err[0]);
            FUZZ_CHECK(!memcmp(r, &before, sizeof(*r)));
        } else {
            FUZZ_CHECK(route_record_check(r, err, sizeof(err)) == 0);
            size_t len = route_instance_encode(r, buf);
            FUZZ_CHECK(len < sizeof(buf) && len == strlen(buf));
            fresh(&back);
            FUZZ_CHECK(route_instance_decode(&back, buf, len, err, sizeof(err)) == 0);
            /* the same entry again (load[] past n_load is no part of it) */
            size_t len2 = route_instance_encode(&back, buf2);
            FUZZ_CHECK(len2 == len && !memcmp(buf, buf2, len));
            n++;
        }
        p = sep ? sep + 2 : end;
    }
    if (!n)
        return 0;

    route_record m;
    FUZZ_CHECK(route_instances_merge(inst, n, &m) == 0);
    char err[256];
    FUZZ_CHECK(route_record_check(&m, err, sizeof(err)) == 0);
    /* the first healthy entry with an endpoint, else the first healthy one */
    int lead = used_lead(inst, n < ROUTE_MAX_INSTANCES ? n : ROUTE_MAX_INSTANCES),
        used = n < ROUTE_MAX_INSTANCES ? n : ROUTE_MAX_INSTANCES;
    FUZZ_CHECK(m.instances >= 1 && m.instances <= used);
    FUZZ_CHECK(m.healthy == (lead < used));
    if (lead < used) {
        /* the entries' totals, or with per-model load their models' */
        long long cap = 0;
        for (int i = 0; i < used; i++) {
            long long per_model = 0;
            for (int j = 0; j < inst[i].n_load; j++)
                per_model += inst[i].load[j].capacity;
            cap += inst[i].capacity > per_model ? inst[i].capacity : per_model;
        }
        FUZZ_CHECK(m.capacity <= cap);
        for (int i = 0; i < m.n_models; i++)
            FUZZ_CHECK(has(inst[lead].models[0], sizeof(m.models[0]), inst[lead].n_models, m.models[i]));
        for (int i = 0; i < m.n_tags; i++)
            FUZZ_CHECK(has(inst[lead].tags[0], sizeof(m.tags[0]), inst[lead].n_tags, m.tags[i]));
        FUZZ_CHECK(!strcmp(m.endpoint, inst[lead].endpoint));
    }
    route_table_opts o = {
        .stale_after_ms = 3000, .eject_after = 3, .eject_base_ms = 1000, .eject_max_ms = 60000};
    route_table *t = route_table_new(&o, 4);
    FUZZ_CHECK(t && route_table_upsert(t, &m, false, 1) == 0);
    route_table_free(t);
    return 0;
}
