/* Percent-decoding of URL query strings and form bodies
 * (application/x-www-form-urlencoded), where names and values arrive
 * encoded. */
#ifndef GW_URL_H
#define GW_URL_H

#include <stddef.h>

/* s[0..n) percent-decoded, '+' read as a space, into out, which may be s
 * itself (the result is never longer). A '%' not followed by two hex
 * digits stays as it is. The decoded length (NULs included, none added),
 * or -1 when it is longer than cap. */
long gw_url_decode(const char *s, size_t n, char *out, size_t cap);

#endif
