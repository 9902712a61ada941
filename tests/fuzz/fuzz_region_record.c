/* libFuzzer target for the region record's Redis hash encoding
 * (routing/region.c): any writer to Redis (a gateway of the fleet, an
 * operator with redis-cli, something else on a shared server) sets these
 * fields, and every gateway parses them.
 *
 * Each input is a hash: lines of NAME TAB VALUE (the value may hold any
 * byte but a newline, NUL included). Parsed into a record: when refused,
 * there is a reason and the record is unchanged; when taken, the record
 * passes route_record_check, goes into a routing table, and written back
 * as fields and read again gives the same fields. Violations are
 * __builtin_trap so the fuzzer keeps them. */
#include "routing/region.h"

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

#define MAX_FIELDS 32

static route_record fresh(void)
{
    route_record r;
    memset(&r, 0, sizeof(r));
    strcpy(r.name, "fz");
    return r;
}

static void same_fields(const route_record *a, const route_record *b)
{
    static route_field fa[ROUTE_N_FIELDS], fb[ROUTE_N_FIELDS];
    route_record_to_fields(a, fa);
    route_record_to_fields(b, fb);
    for (int i = 0; i < ROUTE_N_FIELDS; i++)
        FUZZ_CHECK(!strcmp(fa[i].name, fb[i].name) && !strcmp(fa[i].value, fb[i].value));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *names[MAX_FIELDS], *values[MAX_FIELDS];
    char *name_bufs[MAX_FIELDS];
    size_t lens[MAX_FIELDS];
    int n = 0;
    const char *p = (const char *)data, *end = p + size;
    while (p < end && n < MAX_FIELDS) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *line_end = nl ? nl : end;
        const char *tab = memchr(p, '\t', (size_t)(line_end - p));
        if (tab) {
            size_t nlen = (size_t)(tab - p);
            name_bufs[n] = malloc(nlen + 1);
            if (!name_bufs[n])
                break;
            memcpy(name_bufs[n], p, nlen);
            name_bufs[n][nlen] = '\0';
            names[n] = name_bufs[n];
            values[n] = tab + 1;
            lens[n] = (size_t)(line_end - tab - 1);
            n++;
        }
        p = nl ? nl + 1 : end;
    }

    route_record r = fresh(), before = r;
    char err[256] = "";
    int rc = route_record_from_fields(&r, names, values, lens, n, err, sizeof(err));
    if (rc) {
        FUZZ_CHECK(rc == -EINVAL && err[0]);
        FUZZ_CHECK(!memcmp(&r, &before, sizeof(r)));
    } else {
        FUZZ_CHECK(route_record_check(&r, err, sizeof(err)) == 0);
        route_table_opts o = {
            .stale_after_ms = 3000, .eject_after = 3, .eject_base_ms = 1000, .eject_max_ms = 60000};
        route_table *t = route_table_new(&o, 4);
        FUZZ_CHECK(t && route_table_upsert(t, &r, false, 1) == 0);
        route_table_free(t);

        static route_field f[ROUTE_N_FIELDS];
        route_record_to_fields(&r, f);
        const char *n2[ROUTE_N_FIELDS], *v2[ROUTE_N_FIELDS];
        for (int i = 0; i < ROUTE_N_FIELDS; i++) {
            n2[i] = f[i].name;
            v2[i] = f[i].value;
        }
        route_record back = fresh();
        FUZZ_CHECK(route_record_from_fields(&back, n2, v2, NULL, ROUTE_N_FIELDS, err, sizeof(err)) == 0);
        same_fields(&r, &back);
    }
    for (int i = 0; i < n; i++)
        free(name_bufs[i]);
    return 0;
}
