/* Percent-decoding (see url.h). */
#include "gateway/base/url.h"

static int hex_digit(int c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

long gw_url_decode(const char *s, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int c = (unsigned char)s[i];
        if (c == '%' && i + 2 < n && hex_digit(s[i + 1]) >= 0 && hex_digit(s[i + 2]) >= 0) {
            c = hex_digit(s[i + 1]) * 16 + hex_digit(s[i + 2]);
            i += 2;
        } else if (c == '+') {
            c = ' ';
        }
        if (o >= cap)
            return -1;
        out[o++] = (char)c;
    }
    return (long)o;
}
