/* gpt-oss's harmony messages split into reasoning, content and tool calls
 * (see harmony.h). */
#include "runtime/harmony.h"

#include "runtime/markers.h"

#include <jansson.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define START "<|start|>"
#define CHANNEL "<|channel|>"
#define MESSAGE "<|message|>"
#define FUNCTIONS "functions."

/* What ends a message's body (<|start|> too: a model that skips <|end|>). */
static const char *const k_ends[] = {"<|end|>", "<|call|>", "<|return|>", START};
#define N_ENDS (sizeof(k_ends) / sizeof(k_ends[0]))

enum { BEGIN, HEADER, BODY, PLAIN };
enum { REASON, CONTENT, CALL };

struct rt_harmony {
    int state, kind;
    rt_mk_buf in;     /* what is not yet dealt with */
    rt_mk_buf out[2]; /* this feed's reasoning and content */
    rt_mk_buf args;   /* CALL: its body so far */
    char *name;       /* CALL: the function's */
    rt_tc_call *calls;
    int n_calls, calls_cap;
    bool oom;
};

bool rt_harmony_template(const char *tmpl, size_t len)
{
    return tmpl && rt_mk_find(tmpl, len, CHANNEL, false) >= 0 && rt_mk_find(tmpl, len, MESSAGE, false) >= 0;
}

rt_harmony *rt_harmony_new(void)
{
    rt_harmony *h = calloc(1, sizeof(*h));
    if (h)
        h->state = BEGIN;
    return h;
}

void rt_harmony_free(rt_harmony *h)
{
    if (!h)
        return;
    for (int i = 0; i < h->n_calls; i++) {
        free(h->calls[i].name);
        free(h->calls[i].arguments);
    }
    free(h->calls);
    free(h->name);
    free(h->in.p);
    free(h->out[0].p);
    free(h->out[1].p);
    free(h->args.p);
    free(h);
}

int rt_harmony_n_calls(const rt_harmony *h)
{
    return h->n_calls;
}

const rt_tc_call *rt_harmony_call_at(const rt_harmony *h, int i)
{
    return &h->calls[i];
}

/* Drops in's first n bytes. */
static void consume(rt_harmony *h, size_t n)
{
    memmove(h->in.p, h->in.p + n, h->in.len - n);
    h->in.len -= n;
}

static void emit(rt_harmony *h, rt_mk_buf *b, const char *s, size_t n)
{
    if (!h->oom && !rt_mk_put(b, s, n))
        h->oom = true;
}

/* The word after `key` in the header s[0..n) (up to a space or a marker),
 * or NULL; *len its length. */
static const char *word_after(const char *s, size_t n, const char *key, size_t *len)
{
    long k = rt_mk_find(s, n, key, false);
    if (k < 0)
        return NULL;
    size_t i = (size_t)k + strlen(key), j = i;
    while (j < n && !rt_mk_is_ws(s[j]) && s[j] != '<')
        j++;
    *len = j - i;
    return s + i;
}

/* A header s[0..n) read: what its body is, and a call's name. */
static void read_header(rt_harmony *h, const char *s, size_t n)
{
    size_t r_len = 0, c_len = 0;
    const char *to = word_after(s, n, "to=", &r_len), *ch = word_after(s, n, CHANNEL, &c_len);
    const size_t fl = sizeof(FUNCTIONS) - 1;
    if (to && r_len > fl && !memcmp(to, FUNCTIONS, fl)) {
        h->kind = CALL;
        if (!(h->name = strndup(to + fl, r_len - fl)))
            h->oom = true;
    } else if (to || (ch && c_len == 8 && !memcmp(ch, "analysis", 8))) {
        h->kind = REASON;
    } else {
        h->kind = CONTENT;
    }
}

/* The call whose body has ended: appended, its arguments the body when
 * that is JSON (numbers of any size), else {}. */
static void end_call(rt_harmony *h)
{
    const char *a = h->args.p ? h->args.p : "";
    size_t i = 0, n = h->args.len;
    while (i < n && rt_mk_is_ws(a[i]))
        i++;
    while (n > i && rt_mk_is_ws(a[n - 1]))
        n--;
    json_t *v = n > i ? json_loadb(a + i, n - i, JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL, NULL) : NULL;
    char *args = v ? strndup(a + i, n - i) : strdup("{}");
    json_decref(v);
    if (h->n_calls == h->calls_cap) {
        int cap = h->calls_cap ? h->calls_cap * 2 : 4;
        rt_tc_call *nc = args ? realloc(h->calls, (size_t)cap * sizeof(*nc)) : NULL;
        if (!nc) {
            free(args);
            h->oom = true;
            return;
        }
        h->calls = nc;
        h->calls_cap = cap;
    }
    if (!args) {
        h->oom = true;
        return;
    }
    h->calls[h->n_calls++] = (rt_tc_call){.name = h->name, .arguments = args};
    h->name = NULL;
    h->args.len = 0;
}

/* BODY: the body up to its end marker, or as far as no marker may begin. */
static bool body(rt_harmony *h, bool final)
{
    long at = -1;
    size_t end_len = 0, hold = 0;
    for (size_t i = 0; i < N_ENDS; i++) {
        long k = rt_mk_find(h->in.p, h->in.len, k_ends[i], false);
        if (k >= 0 && (at < 0 || k < at))
            at = k, end_len = strlen(k_ends[i]);
        size_t p = rt_mk_partial(h->in.p, h->in.len, k_ends[i]);
        hold = p > hold ? p : hold;
    }
    size_t n = at >= 0 ? (size_t)at : final ? h->in.len : h->in.len - hold;
    emit(h, h->kind == CALL ? &h->args : &h->out[h->kind == REASON ? 0 : 1], h->in.p, n);
    bool ended = at >= 0 || final;
    if (ended && h->kind == CALL && h->name)
        end_call(h);
    consume(h, at >= 0 ? n + end_len : n);
    if (ended)
        h->state = HEADER;
    return at >= 0;
}

/* One step of the state machine; false when it needs more text. */
static bool step(rt_harmony *h, bool final)
{
    static const char *const opens[] = {CHANNEL, START, " to="};
    switch (h->state) {
    case BEGIN: /* a header, or not harmony at all */
        for (size_t i = 0; i < 3; i++) {
            size_t k = strlen(opens[i]), m = h->in.len < k ? h->in.len : k;
            if (memcmp(h->in.p, opens[i], m))
                continue;
            if (m < k && !final)
                return false;
            if (m == k) {
                h->state = HEADER;
                return true;
            }
        }
        h->state = PLAIN;
        return true;
    case HEADER: {
        long k = rt_mk_find(h->in.p, h->in.len, MESSAGE, false);
        if (k < 0) {
            if (final) /* a header with no message: nothing to say */
                consume(h, h->in.len);
            return false;
        }
        read_header(h, h->in.p, (size_t)k);
        consume(h, (size_t)k + sizeof(MESSAGE) - 1);
        h->state = BODY;
        return true;
    }
    case BODY:
        return body(h, final);
    default:
        emit(h, &h->out[1], h->in.p, h->in.len);
        consume(h, h->in.len);
        return false;
    }
}

int rt_harmony_feed(rt_harmony *h, const char *text, size_t len, bool final, const char **reasoning,
                    size_t *reasoning_len, const char **content, size_t *content_len)
{
    h->out[0].len = h->out[1].len = 0;
    if (!h->oom && !rt_mk_put(&h->in, text, len))
        h->oom = true;
    while (!h->oom && h->in.len && step(h, final))
        ;
    if (!h->oom && final && h->state == BODY) /* cut short inside a body */
        body(h, true);
    *reasoning = h->out[0].len ? h->out[0].p : "";
    *reasoning_len = h->out[0].len;
    *content = h->out[1].len ? h->out[1].p : "";
    *content_len = h->out[1].len;
    return h->oom ? -ENOMEM : 0;
}

bool rt_harmony_pending(const rt_harmony *h, const char **name, const char **args, size_t *len)
{
    if (h->state != BODY || h->kind != CALL || !h->name)
        return false;
    const char *a = h->args.p ? h->args.p : "";
    size_t i = 0, n = h->args.len;
    while (i < n && rt_mk_is_ws(a[i]))
        i++;
    while (n > i && rt_mk_is_ws(a[n - 1]))
        n--;
    *name = h->name;
    *args = a + i;
    *len = n - i;
    return true;
}
