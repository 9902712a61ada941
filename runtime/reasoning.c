/* A reasoning model's <think> block split from its answer (see
 * reasoning.h). */
#include "runtime/reasoning.h"

#include "runtime/markers.h"

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

bool rt_think_template(const char *tmpl, size_t len)
{
    return tmpl && rt_mk_find(tmpl, len, OPEN, false) >= 0 && rt_mk_find(tmpl, len, CLOSE, false) >= 0;
}

bool rt_think_open(const char *prompt, size_t len)
{
    long o = rt_mk_find(prompt, len, OPEN, true), c = rt_mk_find(prompt, len, CLOSE, true);
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

static void emit(rt_think *t, int which, const char *s, size_t n)
{
    if (!n || t->oom)
        return;
    if (!rt_mk_grow(&t->out[which], &t->out_cap[which], t->out_len[which] + n + 1)) {
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

/* One step of the state machine; false when it needs more text. */
static bool step(rt_think *t, bool final)
{
    size_t i = 0;
    switch (t->state) {
    case START: /* whitespace, then <think> or the answer */
        while (i < t->len && rt_mk_is_ws(t->buf[i]))
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
        long k = rt_mk_find(t->buf, t->len, CLOSE, false);
        size_t end = k >= 0 ? (size_t)k : final ? t->len : t->len - rt_mk_partial(t->buf, t->len, CLOSE);
        emit(t, 0, t->buf, end);
        consume(t, k >= 0 ? end + sizeof(CLOSE) - 1 : end);
        if (k >= 0)
            t->state = AFTER;
        return k >= 0;
    }
    case AFTER: /* the blank lines between the thinking and the answer */
        while (i < t->len && rt_mk_is_ws(t->buf[i]))
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
    if (!t->oom && rt_mk_grow(&t->buf, &t->cap, t->len + len + 1)) {
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
