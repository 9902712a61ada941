/* libFuzzer target for a region's carbon_source answer
 * (gateway/front/placement.c, gw_carbon_parse): whoever serves the URL or
 * writes the file chooses its bytes, and the figure steers routing; and,
 * on the same bytes, a peer region's x-infergate-energy trailer
 * (gw_energy_parse) and x-infergate-power header (gw_power_parse).
 *
 * The first byte chooses the form (odd: an HTTP/1.x answer, even: a file's
 * bytes); the rest is the answer, not NUL-terminated. A figure taken is
 * a finite number from 0 to ROUTE_MAX_CARBON; one refused says why; the
 * answer is never read past its end (ASan). Violations are __builtin_trap
 * so the fuzzer keeps them. */
#include "gateway/front/placement.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_CHECK(cond)                                                                                     \
    do {                                                                                                     \
        if (!(cond))                                                                                         \
            __builtin_trap();                                                                                \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    bool http = data[0] & 1;
    size_t n = size - 1;
    char *buf = malloc(n ? n : 1); /* exactly the answer: a read past it is ASan's */
    if (!buf)
        return 0;
    memcpy(buf, data + 1, n);
    double v = -1;
    const char *why = gw_carbon_parse(buf, n, http, &v);
    if (why)
        FUZZ_CHECK(*why);
    else
        FUZZ_CHECK(isfinite(v) && v >= 0 && v <= ROUTE_MAX_CARBON && n <= GW_CARBON_BODY_MAX);
    free(buf);
    /* The same bytes as a peer region's x-infergate-energy trailer
     * (gw_energy_parse): two numbers in range, or why not. */
    char *t = malloc(n + 1);
    if (!t)
        return 0;
    memcpy(t, data + 1, n);
    t[n] = '\0';
    double wh = -1, gco2e = -1;
    why = gw_energy_parse(t, &wh, &gco2e);
    if (why)
        FUZZ_CHECK(*why);
    else
        FUZZ_CHECK(isfinite(wh) && isfinite(gco2e) && wh >= 0 && gco2e >= 0 && wh <= GW_ENERGY_MAX_WH);
    /* and as its x-infergate-power header (gw_power_parse) */
    double watts = -1, carbon = -1;
    why = gw_power_parse(t, &watts, &carbon);
    if (why)
        FUZZ_CHECK(*why);
    else
        FUZZ_CHECK(isfinite(watts) && isfinite(carbon) && watts >= 0 && watts <= GW_POWER_MAX_W && carbon >= 0 &&
                   carbon <= ROUTE_MAX_CARBON);
    free(t);
    return 0;
}
