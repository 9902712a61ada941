/* Request body fields and response usage without a JSON document (see
 * body_fields.h). The body scan is one pass over the bytes with a bit
 * stack for the nesting (no recursion, no allocation); it follows
 * jansson's lexer where the two could disagree on what is accepted:
 * whitespace is SP, HT, LF and CR; strings are strict UTF-8 without
 * control characters, surrogate code points or \u0000; integers must fit
 * a long long. */
#define _GNU_SOURCE /* memmem */
#include "gateway/front/body_fields.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 2048 /* jansson's JSON_PARSER_MAX_DEPTH: it accepts no deeper */

typedef struct scan {
    const uint8_t *start, *p, *end;
    char *err;
    size_t err_len;
} scan;

static int fail(scan *s, const char *what)
{
    size_t at = (size_t)(s->p - s->start);
    if (s->err_len) {
        if (s->p >= s->end)
            snprintf(s->err, s->err_len, "unexpected end of input at byte %zu", at);
        else
            snprintf(s->err, s->err_len, "%s at byte %zu", what, at);
    }
    return -EINVAL;
}

/* Byte classes: PLAIN stands for itself inside a string (printable ASCII
 * but the quote and the backslash), WS is JSON whitespace. */
enum { PLAIN = 1, WS = 2 };
static const uint8_t cls[256] = {
    [' '] = PLAIN | WS,      ['\t'] = WS, ['\n'] = WS, ['\r'] = WS, [0x21] = PLAIN, [0x23 ... 0x5b] = PLAIN,
    [0x5d ... 0x7f] = PLAIN,
};

/* Through locals: a byte read through s->p could alias s->p itself. */
static inline void skip_ws(scan *s)
{
    const uint8_t *p = s->p, *end = s->end;
    while (p < end && (cls[*p] & WS))
        p++;
    s->p = p;
}

/* Length of the well-formed UTF-8 sequence (2 to 4 bytes) at p, else 0:
 * no overlong forms, no surrogates, nothing above U+10FFFF. */
static size_t utf8_seq(const uint8_t *p, const uint8_t *end)
{
    uint8_t c = p[0];
    size_t n;
    uint32_t v;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
        v = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        v = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        v = c & 0x07;
    } else {
        return 0;
    }
    if ((size_t)(end - p) < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80)
            return 0;
        v = v << 6 | (p[i] & 0x3F);
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF) || (n == 3 && v < 0x800) || (n == 4 && v < 0x10000))
        return 0;
    return n;
}

static int hex4(const uint8_t *p, const uint8_t *end, uint32_t *v)
{
    if (end - p < 4)
        return -1;
    uint32_t x = 0;
    for (int i = 0; i < 4; i++) {
        uint8_t c = p[i];
        x <<= 4;
        if (c >= '0' && c <= '9')
            x |= (uint32_t)(c - '0');
        else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f')
            x |= (uint32_t)((c | 0x20) - 'a' + 10);
        else
            return -1;
    }
    *v = x;
    return 0;
}

/* The decoded bytes of a string go to out[0..cap) (what does not fit is
 * counted, not kept); *n counts them all. */
static inline void emit(char *out, size_t cap, size_t *n, const void *b, size_t len)
{
    if (out && *n < cap)
        memcpy(out + *n, b, len < cap - *n ? len : cap - *n);
    *n += len;
}

/* The string whose opening quote is at s->p; s->p ends after its closing
 * quote. With out, its decoded bytes as emit keeps them and *dlen their
 * count. */
static int scan_string(scan *s, char *out, size_t cap, size_t *dlen)
{
    const uint8_t *p = s->p + 1, *end = s->end;
    size_t n = 0;
    for (;;) {
        const uint8_t *run = p;
        while (p < end && (cls[*p] & PLAIN))
            p++;
        emit(out, cap, &n, run, (size_t)(p - run));
        s->p = p;
        if (p == end)
            return fail(s, "");
        uint8_t c = *p;
        if (c == '"')
            break;
        if (c < 0x20)
            return fail(s, "control character in a string");
        if (c >= 0x80) {
            size_t k = utf8_seq(p, end);
            if (!k)
                return fail(s, "invalid UTF-8 in a string");
            emit(out, cap, &n, p, k);
            p += k;
            continue;
        }
        if (end - p < 2) {
            s->p = end;
            return fail(s, "");
        }
        char one;
        switch (p[1]) {
        case '"':
        case '\\':
        case '/':
            one = (char)p[1];
            break;
        case 'b':
            one = '\b';
            break;
        case 'f':
            one = '\f';
            break;
        case 'n':
            one = '\n';
            break;
        case 'r':
            one = '\r';
            break;
        case 't':
            one = '\t';
            break;
        case 'u': {
            uint32_t cp, lo;
            if (hex4(p + 2, end, &cp))
                return fail(s, "invalid \\u escape");
            p += 6;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (end - p < 2 || p[0] != '\\' || p[1] != 'u' || hex4(p + 2, end, &lo) || lo < 0xDC00 ||
                    lo > 0xDFFF)
                    return fail(s, "unpaired UTF-16 surrogate in a \\u escape");
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                p += 6;
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                return fail(s, "unpaired UTF-16 surrogate in a \\u escape");
            } else if (cp == 0) {
                return fail(s, "\\u0000 in a string");
            }
            uint8_t u[4];
            size_t k;
            if (cp < 0x80) {
                u[0] = (uint8_t)cp;
                k = 1;
            } else if (cp < 0x800) {
                u[0] = (uint8_t)(0xC0 | cp >> 6);
                u[1] = (uint8_t)(0x80 | (cp & 0x3F));
                k = 2;
            } else if (cp < 0x10000) {
                u[0] = (uint8_t)(0xE0 | cp >> 12);
                u[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
                u[2] = (uint8_t)(0x80 | (cp & 0x3F));
                k = 3;
            } else {
                u[0] = (uint8_t)(0xF0 | cp >> 18);
                u[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
                u[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
                u[3] = (uint8_t)(0x80 | (cp & 0x3F));
                k = 4;
            }
            emit(out, cap, &n, u, k);
            continue;
        }
        default:
            return fail(s, "invalid escape in a string");
        }
        emit(out, cap, &n, &one, 1);
        p += 2;
    }
    s->p = p + 1;
    if (dlen)
        *dlen = n;
    return 0;
}

/* [0-9]+ from `from`: *p past it, or the scan fails there. */
static int digit_run(scan *s, const uint8_t **p, const uint8_t *from)
{
    const uint8_t *q = from;
    if (q == s->end || *q < '0' || *q > '9') {
        s->p = q;
        return fail(s, "invalid number");
    }
    while (q < s->end && *q >= '0' && *q <= '9')
        q++;
    *p = q;
    return 0;
}

/* -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? at s->p. *is_int when it
 * has neither fraction nor exponent, with its value in *v; an integer
 * outside long long is refused, as jansson refuses it. */
static int scan_number(scan *s, bool *is_int, long long *v)
{
    const uint8_t *p = s->p, *end = s->end;
    bool neg = p < end && *p == '-';
    p += neg;
    uint64_t u = 0, lim = neg ? (uint64_t)LLONG_MAX + 1 : (uint64_t)LLONG_MAX;
    bool ovf = false;
    if (p == end || *p < '0' || *p > '9') {
        s->p = p;
        return fail(s, "invalid number");
    }
    if (*p == '0') {
        p++;
    } else {
        while (p < end && *p >= '0' && *p <= '9') {
            unsigned d = (unsigned)(*p++ - '0');
            if (u > (lim - d) / 10)
                ovf = true;
            else
                u = u * 10 + d;
        }
    }
    *is_int = true;
    if (p < end && *p == '.') {
        *is_int = false;
        if (digit_run(s, &p, p + 1))
            return -EINVAL;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        *is_int = false;
        p++;
        if (digit_run(s, &p, p < end && (*p == '+' || *p == '-') ? p + 1 : p))
            return -EINVAL;
    }
    if (*is_int && ovf)
        return fail(s, "integer out of range");
    s->p = p;
    if (*is_int)
        *v = neg ? (long long)(0 - u) : (long long)u;
    return 0;
}

/* A number with a fraction or an exponent whose value is integral (100.0,
 * 1e2): the worker takes it for that integer, so the charge estimate does
 * too, whatever the text's length (100000.000... with 600 zeros is still
 * 100000 to the worker: left out, the gateway charged max_tokens instead).
 * 1 integral, 0 not, -ENOMEM. */
static int integral_real(const uint8_t *text, size_t len, long long *v)
{
    char stack[512], *buf = len < sizeof(stack) ? stack : malloc(len + 1);
    if (!buf)
        return -ENOMEM;
    memcpy(buf, text, len);
    buf[len] = '\0';
    double d = strtod(buf, NULL);
    if (buf != stack)
        free(buf);
    /* The range test comes first: converting an out-of-range double is
     * undefined. The worker applies the same one. */
    if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0) || d != (double)(long long)d)
        return 0;
    *v = (long long)d;
    return 1;
}

enum { F_NONE, F_MODEL, F_MAX_TOKENS, F_MAX_COMPLETION_TOKENS, F_PROMPT, F_STREAM };

static const char *const field_names[] = {NULL,     "model", "max_tokens", "max_completion_tokens",
                                          "prompt", "stream"};

static int field_of(const char *k, size_t len)
{
    switch (len) {
    case 5:
        return memcmp(k, "model", 5) ? F_NONE : F_MODEL;
    case 6:
        return !memcmp(k, "prompt", 6) ? F_PROMPT : !memcmp(k, "stream", 6) ? F_STREAM : F_NONE;
    case 10:
        return memcmp(k, "max_tokens", 10) ? F_NONE : F_MAX_TOKENS;
    case 21:
        return memcmp(k, "max_completion_tokens", 21) ? F_NONE : F_MAX_COMPLETION_TOKENS;
    }
    return F_NONE;
}

int gw_body_fields_scan(const void *body, size_t len, gw_body_fields *out, char *err, size_t err_len)
{
    scan s = {body, body, (const uint8_t *)body + len, err, err_len};
    uint8_t objects[MAX_DEPTH / 8]; /* bit set: that level is an object, else an array */
    int depth = 0, field = F_NONE;
    unsigned seen = 0;
    bool int_val[5] = {false}, in_prompt = false;
    long long val[5] = {0};
    memset(out, 0, sizeof(*out));
    out->max_tokens = -1;
    if (err_len)
        err[0] = '\0';

    skip_ws(&s);
    if (s.p == s.end || *s.p != '{')
        return fail(&s, "the body must be a JSON object");

value:
    skip_ws(&s);
    if (s.p == s.end)
        return fail(&s, "");
    switch (*s.p) {
    case '{':
    case '[': {
        uint8_t open = *s.p;
        in_prompt |= field == F_PROMPT;
        field = F_NONE;
        if (depth == MAX_DEPTH)
            return fail(&s, "nesting deeper than 2048 levels");
        if (open == '{')
            objects[depth / 8] |= (uint8_t)(1u << depth % 8);
        else
            objects[depth / 8] &= (uint8_t) ~(1u << depth % 8);
        depth++;
        s.p++;
        skip_ws(&s);
        if (s.p < s.end && *s.p == (open == '{' ? '}' : ']')) {
            s.p++;
            depth--;
            goto after;
        }
        if (open == '{')
            goto key;
        goto value;
    }
    case '"':
        if (field == F_MODEL) {
            if (scan_string(&s, out->model, sizeof(out->model) - 1, &out->model_len))
                return -EINVAL;
            out->has_model = true;
            out->model[out->model_len < sizeof(out->model) ? out->model_len : sizeof(out->model) - 1] = '\0';
        } else if (scan_string(&s, NULL, 0, NULL)) {
            return -EINVAL;
        }
        goto after;
    case 't':
    case 'n':
        if (s.end - s.p < 4 || memcmp(s.p, *s.p == 't' ? "true" : "null", 4))
            return fail(&s, "invalid literal");
        out->stream |= field == F_STREAM && *s.p == 't';
        s.p += 4;
        goto after_scalar;
    case 'f':
        if (s.end - s.p < 5 || memcmp(s.p, "false", 5))
            return fail(&s, "invalid literal");
        s.p += 5;
        goto after_scalar;
    default: {
        if (*s.p != '-' && (*s.p < '0' || *s.p > '9'))
            return fail(&s, "unexpected character");
        bool is_int = false;
        long long v = 0;
        const uint8_t *num = s.p;
        if (scan_number(&s, &is_int, &v))
            return -EINVAL;
        out->prompt_ids += in_prompt && is_int;
        if (!is_int && (field == F_MAX_TOKENS || field == F_MAX_COMPLETION_TOKENS)) {
            int rc = integral_real(num, (size_t)(s.p - num), &v);
            if (rc < 0)
                return rc;
            is_int = rc == 1;
        }
        if (is_int && (field == F_MAX_TOKENS || field == F_MAX_COMPLETION_TOKENS)) {
            int_val[field] = true;
            val[field] = v;
        }
        goto after_scalar;
    }
    }

after_scalar:
    /* jansson's lexer reads one byte past a number or a literal and puts it
     * back; a NUL put back that way is lost, so jansson takes
     * `{"a":1\0}` for `{"a":1}`. So does this scan, or a body the
     * worker accepts would be refused here. */
    if (s.p < s.end && *s.p == '\0')
        s.p++;

after:
    field = F_NONE;
    in_prompt &= depth > 1; /* back at the top level: the prompt's value is over */
    skip_ws(&s);
    if (depth == 0) {
        if (s.p != s.end)
            return fail(&s, "data after the object");
        goto done;
    }
    if (s.p == s.end)
        return fail(&s, "");
    if (objects[(depth - 1) / 8] & (1u << (depth - 1) % 8)) {
        if (*s.p == ',') {
            s.p++;
            goto key;
        }
        if (*s.p != '}')
            return fail(&s, "expected ',' or '}'");
    } else {
        if (*s.p == ',') {
            s.p++;
            goto value;
        }
        if (*s.p != ']')
            return fail(&s, "expected ',' or ']'");
    }
    s.p++;
    depth--;
    goto after;

key:
    skip_ws(&s);
    if (s.p == s.end || *s.p != '"')
        return fail(&s, "expected a string key");
    if (depth == 1) {
        char k[24]; /* longer than every field name */
        size_t klen;
        const uint8_t *at = s.p;
        if (scan_string(&s, k, sizeof(k), &klen))
            return -EINVAL;
        field = klen <= sizeof(k) ? field_of(k, klen) : F_NONE;
        /* a second prompt's ids count too: the worker refuses the body */
        if (field && field != F_PROMPT) {
            if (seen & (1u << field)) {
                s.p = at;
                char what[64];
                snprintf(what, sizeof(what), "duplicate key '%s'", field_names[field]);
                return fail(&s, what);
            }
            seen |= 1u << field;
        }
    } else if (scan_string(&s, NULL, 0, NULL)) {
        return -EINVAL;
    }
    skip_ws(&s);
    if (s.p == s.end || *s.p != ':')
        return fail(&s, "expected ':'");
    s.p++;
    goto value;

done:
    out->max_tokens = int_val[F_MAX_COMPLETION_TOKENS] ? val[F_MAX_COMPLETION_TOKENS]
                      : int_val[F_MAX_TOKENS]          ? val[F_MAX_TOKENS]
                                                       : -1;
    return 0;
}

/* ---- usage.completion_tokens in a response stream ---- */

#define UKEY "\"completion_tokens\":"
#define UKEY_LEN 20

_Static_assert(sizeof(((gw_usage_scan *)0)->tail) == UKEY_LEN, "the tail holds one key");

void gw_usage_scan_init(gw_usage_scan *u)
{
    memset(u, 0, sizeof(*u));
    u->tokens = -1;
}

/* The value after the key, from d[i]: whitespace, then digits up to a byte
 * that ends an integer. Returns where it stopped (len when the value may
 * go on in the next feed). */
static size_t usage_value(gw_usage_scan *u, const uint8_t *d, size_t len, size_t i)
{
    for (; i < len; i++) {
        uint8_t c = d[i];
        if (u->state == 1) {
            if (c == ' ' || c == '\t' || c == '\n' || c == '\r')
                continue;
            if (c < '0' || c > '9') {
                u->state = 0;
                return i;
            }
            u->state = 2;
            u->acc = c - '0';
            continue;
        }
        if (c >= '0' && c <= '9') {
            if (u->acc <= INT_MAX)
                u->acc = u->acc * 10 + (c - '0');
            continue;
        }
        u->state = 0;
        if (c != '.' && c != 'e' && c != 'E' && u->acc <= INT_MAX)
            u->tokens = (int)u->acc;
        return i;
    }
    return len;
}

/* The key counts unless a backslash precedes its opening quote: in valid
 * JSON that quote is then escaped, and the match lies inside a string. */
void gw_usage_scan_feed(gw_usage_scan *u, const void *data, size_t len)
{
    const uint8_t *d = data;
    size_t i = 0;
    if (u->state) {
        i = usage_value(u, d, len, 0);
    } else if (u->tail_len) {
        /* A key that began in earlier feeds and ends in this one. */
        uint8_t w[2 * UKEY_LEN];
        size_t t = u->tail_len, k = len < UKEY_LEN - 1 ? len : UKEY_LEN - 1;
        memcpy(w, u->tail, t);
        memcpy(w + t, d, k);
        for (size_t at = t > UKEY_LEN - 1 ? t - (UKEY_LEN - 1) : 0; at < t && at + UKEY_LEN <= t + k; at++) {
            if (!memcmp(w + at, UKEY, UKEY_LEN) && (at == 0 || w[at - 1] != '\\')) {
                u->state = 1;
                i = usage_value(u, d, len, at + UKEY_LEN - t);
                break;
            }
        }
    }
    while (i < len) {
        const uint8_t *q = memmem(d + i, len - i, UKEY, UKEY_LEN);
        if (!q)
            break;
        size_t at = (size_t)(q - d);
        uint8_t before = at ? d[at - 1] : u->tail_len ? u->tail[u->tail_len - 1] : 0;
        if (before == '\\') {
            i = at + 1;
            continue;
        }
        u->state = 1;
        i = usage_value(u, d, len, at + UKEY_LEN);
    }
    if (len >= UKEY_LEN) {
        memcpy(u->tail, d + len - UKEY_LEN, UKEY_LEN);
        u->tail_len = UKEY_LEN;
    } else {
        size_t keep = u->tail_len + len > UKEY_LEN ? UKEY_LEN - len : u->tail_len;
        memmove(u->tail, u->tail + u->tail_len - keep, keep);
        memcpy(u->tail + keep, d, len);
        u->tail_len = keep + len;
    }
}
