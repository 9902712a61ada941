/* Markers in a model's streamed text (see markers.h). */
#include "runtime/markers.h"

#include <stdlib.h>
#include <string.h>

long rt_mk_find(const char *s, size_t n, const char *needle, bool last)
{
    size_t k = strlen(needle);
    long at = -1;
    for (size_t i = 0; k <= n && i <= n - k; i++)
        if (s[i] == needle[0] && !memcmp(s + i, needle, k)) {
            at = (long)i;
            if (!last)
                break;
        }
    return at;
}

size_t rt_mk_partial(const char *s, size_t n, const char *m)
{
    size_t k = strlen(m);
    for (size_t l = k - 1 < n ? k - 1 : n; l > 0; l--)
        if (!memcmp(s + n - l, m, l))
            return l;
    return 0;
}

bool rt_mk_is_ws(char c)
{
    return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

bool rt_mk_grow(char **b, size_t *cap, size_t need)
{
    if (need <= *cap)
        return true;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    char *nb = realloc(*b, c);
    if (!nb)
        return false;
    *b = nb;
    *cap = c;
    return true;
}

bool rt_mk_put(rt_mk_buf *b, const char *s, size_t n)
{
    if (!n)
        return true;
    if (!rt_mk_grow(&b->p, &b->cap, b->len + n + 1))
        return false;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return true;
}
