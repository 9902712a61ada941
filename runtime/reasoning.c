/* A reasoning model's <think> block split from its answer (see
 * reasoning.h). */
#include "runtime/reasoning.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define OPEN "<think>"
#define CLOSE "</think>"

enum { START, IN, AFTER, CONTENT };

struct rt_think {
    int state;
    char *buf; /* what is not yet dealt with */
    size_t len, cap;
    char *out[2]; /* this feed's reasoning and content */
    size_t out_len[2], out_cap[2];
    bool oom;
};

/* Where needle last (last) or first occurs in s[0..n), or -1. */
static long find(const char *s, size_t n, const char *needle, bool last)
{
    size_t k = strlen(needle);
    long at = -1;
    for (size_t i = 0; k <= n && i <= n - k; i++)
        if (!memcmp(s + i, needle, k)) {
            at = (long)i;
            if (!last)
                break;
        }
    return at;
}

bool rt_think_template(const char *tmpl, size_t len)
{
    return tmpl && find(tmpl, len, OPEN, false) >= 0 && find(tmpl, len, CLOSE, false) >= 0;
}

bool rt_think_open(const char *prompt, size_t len)
{
    long o = find(prompt, len, OPEN, true), c = find(prompt, len, CLOSE, true);
    return o >= 0 && o > c;
}

rt_think *rt_think_new(bool open)
{
    rt_think *t = calloc(1, sizeof(*t));
    if (t)
        t->state = open ? IN : START;
    return t;
}

void rt_think_free(rt_think *t)
{
    if (!t)
        return;
    free(t->buf);
    free(t->out[0]);
    free(t->out[1]);
    free(t);
}

static bool grow(char **b, size_t *cap, size_t need)
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

static void emit(rt_think *t, int which, const char *s, size_t n)
{
    if (!n || t->oom)
        return;
    if (!grow(&t->out[which], &t->out_cap[which], t->out_len[which] + n + 1)) {
        t->oom = true;
        return;
    }
    memcpy(t->out[which] + t->out_len[which], s, n);
    t->out_len[which] += n;
    t->out[which][t->out_len[which]] = '\0';
}

/* Drops buf's first n bytes. */
static void consume(rt_think *t, size_t n)
{
    memmove(t->buf, t->buf + n, t->len - n);
    t->len -= n;
}

/* How much of s[0..n)'s end could be the start of marker m. */
static size_t partial(const char *s, size_t n, const char *m)
{
    size_t k = strlen(m);
    for (size_t l = k - 1 < n ? k - 1 : n; l > 0; l--)
        if (!memcmp(s + n - l, m, l))
            return l;
    return 0;
}

static bool is_ws(char c)
{
    return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

/* One step of the state machine; false when it needs more text. */
static bool step(rt_think *t, bool final)
{
    size_t i = 0;
    switch (t->state) {
    case START: /* whitespace, then <think> or the answer */
        while (i < t->len && is_ws(t->buf[i]))
            i++;
        if (t->len - i >= sizeof(OPEN) - 1 && !memcmp(t->buf + i, OPEN, sizeof(OPEN) - 1)) {
            consume(t, i + sizeof(OPEN) - 1);
            t->state = IN;
            return true;
        }
        if (!final &&
            !memcmp(t->buf + i, OPEN, t->len - i < sizeof(OPEN) - 1 ? t->len - i : sizeof(OPEN) - 1))
            return false;
        t->state = CONTENT;
        return true;
    case IN: {
        long k = find(t->buf, t->len, CLOSE, false);
        size_t end = k >= 0 ? (size_t)k : final ? t->len : t->len - partial(t->buf, t->len, CLOSE);
        emit(t, 0, t->buf, end);
        consume(t, k >= 0 ? end + sizeof(CLOSE) - 1 : end);
        if (k >= 0)
            t->state = AFTER;
        return k >= 0;
    }
    case AFTER: /* the blank lines between the thinking and the answer */
        while (i < t->len && is_ws(t->buf[i]))
            i++;
        consume(t, i);
        if (t->len == 0)
            return false;
        t->state = CONTENT;
        return true;
    default:
        emit(t, 1, t->buf, t->len);
        consume(t, t->len);
        return false;
    }
}

int rt_think_feed(rt_think *t, const char *text, size_t len, bool final, const char **reasoning,
                  size_t *reasoning_len, const char **content, size_t *content_len)
{
    t->out_len[0] = t->out_len[1] = 0;
    if (!t->oom && grow(&t->buf, &t->cap, t->len + len + 1)) {
        memcpy(t->buf + t->len, text, len);
        t->len += len;
    } else {
        t->oom = true;
    }
    while (!t->oom && step(t, final))
        ;
    *reasoning = t->out_len[0] ? t->out[0] : "";
    *reasoning_len = t->out_len[0];
    *content = t->out_len[1] ? t->out[1] : "";
    *content_len = t->out_len[1];
    return t->oom ? -ENOMEM : 0;
}
