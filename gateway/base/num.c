/* Number parsing shared by the subcommands: whole-string, range-checked,
 * never silently wrapping (strtol/strtod with every error checked). */
#include "gateway/base/num.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int gw_parse_int(const char *s, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

int gw_parse_u64(const char *s, uint64_t *out)
{
    /* strtoull takes "-1" (as 2^64 - 1) and leading spaces: digits only */
    if (!*s || strspn(s, "0123456789") != strlen(s))
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end)
        return -1;
    *out = v;
    return 0;
}

int gw_parse_float(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}
