/* OpenAI's error object (see oai_error.h). One encoder serves both the
 * bounded buffer and the malloc'd string: given no buffer it only
 * measures, and the message gets a budget of bytes the rest leaves. */
#include "gateway/base/oai_error.h"
#include "gateway/base/utf8.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Copies n bytes to buf + at (when there is a buf); returns n. */
static size_t put(char *buf, size_t at, const char *s, size_t n)
{
    if (buf)
        memcpy(buf + at, s, n);
    return n;
}

#define PUT(buf, at, lit) put(buf, at, lit, sizeof(lit) - 1)

/* The character of s at *i (n bytes in all) as a JSON string holds it:
 * its bytes in out, their count returned (at most 6), *i moved past it. */
static size_t escape_char(const unsigned char *s, size_t n, size_t *i, char out[6])
{
    static const char hex[] = "0123456789ABCDEF";
    unsigned char c = s[*i];
    if (c >= 0x80) {
        size_t skip, k = gw_utf8_seq(s + *i, n - *i, &skip);
        if (!k) {
            *i += skip;
            memcpy(out, GW_UTF8_REPLACEMENT, 3);
            return 3;
        }
        memcpy(out, s + *i, k);
        *i += k;
        return k;
    }
    (*i)++;
    const char *short_form = c == '"'    ? "\\\""
                             : c == '\\' ? "\\\\"
                             : c == '\b' ? "\\b"
                             : c == '\f' ? "\\f"
                             : c == '\n' ? "\\n"
                             : c == '\r' ? "\\r"
                             : c == '\t' ? "\\t"
                                         : NULL;
    if (short_form) {
        memcpy(out, short_form, 2);
        return 2;
    }
    if (c >= 0x20) {
        out[0] = (char)c;
        return 1;
    }
    memcpy(out, "\\u00", 4);
    out[4] = hex[c >> 4];
    out[5] = hex[c & 15];
    return 6;
}

/* s as a JSON string, quoted (NULL: null), of which the characters take at
 * most room bytes: those that would not fit are left out. */
static size_t put_string(char *buf, size_t at, const char *s, size_t room)
{
    if (!s)
        return PUT(buf, at, "null");
    size_t len = PUT(buf, at, "\""), n = strlen(s), i = 0, used = 0;
    while (i < n) {
        char ch[6];
        size_t next = i, k = escape_char((const unsigned char *)s, n, &next, ch);
        if (k > room - used)
            break;
        used += put(buf, at + len + used, ch, k);
        i = next;
    }
    len += used;
    return len + PUT(buf, at + len, "\"");
}

/* The object with room bytes for the message's characters; buf NULL:
 * only its length. */
static size_t encode(char *buf, size_t room, const char *message, const char *type, const char *param,
                     const char *code)
{
    size_t n = PUT(buf, 0, "{\"error\":{\"message\":");
    n += put_string(buf, n, message ? message : "", room);
    n += PUT(buf, n, ",\"type\":");
    n += put_string(buf, n, type, SIZE_MAX);
    n += PUT(buf, n, ",\"param\":");
    n += put_string(buf, n, param, SIZE_MAX);
    n += PUT(buf, n, ",\"code\":");
    n += put_string(buf, n, code, SIZE_MAX);
    return n + PUT(buf, n, "}}");
}

size_t gw_oai_error_write(char *buf, size_t cap, const char *message, const char *type, const char *param,
                          const char *code)
{
    size_t rest = encode(NULL, 0, message, type, param, code); /* all but the message's characters */
    if (cap <= rest) {
        if (cap)
            buf[0] = '\0';
        return 0;
    }
    size_t n = encode(buf, cap - 1 - rest, message, type, param, code);
    buf[n] = '\0';
    return n;
}

char *gw_oai_error_json(const char *message, const char *type, const char *param, const char *code,
                        size_t *len)
{
    size_t n = encode(NULL, SIZE_MAX, message, type, param, code);
    char *buf = malloc(n + 1);
    if (!buf)
        return NULL;
    encode(buf, SIZE_MAX, message, type, param, code);
    buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}
