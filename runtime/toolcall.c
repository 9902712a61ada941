/* Tool calls in a model's text (see toolcall.h): the grammar that forces
 * one, and the parser that reads them out of the answer as it streams. */
#include "runtime/toolcall.h"

#include "runtime/grammar/grammar.h"
#include "runtime/harmony.h"
#include "runtime/markers.h"

#include <jansson.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HERMES_OPEN "<tool_call>"
#define HERMES_CLOSE "</tool_call>"
#define PYTHON_TAG "<|python_tag|>"
#define MISTRAL_TAG "[TOOL_CALLS]"

rt_tc_format rt_tc_detect(const char *t, size_t n)
{
    if (!t)
        return RT_TC_HERMES;
    if (rt_harmony_template(t, n))
        return RT_TC_HARMONY;
    if (rt_mk_find(t, n, MISTRAL_TAG, false) >= 0)
        return RT_TC_MISTRAL;
    if (rt_mk_find(t, n, HERMES_OPEN, false) >= 0)
        return RT_TC_HERMES;
    if (rt_mk_find(t, n, "<|start_header_id|>", false) >= 0 &&
        (rt_mk_find(t, n, PYTHON_TAG, false) >= 0 || rt_mk_find(t, n, "ipython", false) >= 0))
        return RT_TC_LLAMA3;
    return RT_TC_HERMES;
}

const char *rt_tc_format_name(rt_tc_format f)
{
    return f == RT_TC_LLAMA3    ? "llama3"
           : f == RT_TC_MISTRAL ? "mistral"
           : f == RT_TC_HARMONY ? "harmony"
                                : "hermes";
}

/* ---- the grammar ---- */

typedef struct gbuf {
    char *p;
    size_t len;
    bool oom;
} gbuf;

/* Appends, keeping p NUL-terminated (rt_schema_gbnf appends to it too). */
static void gput(gbuf *b, const char *fmt, ...)
{
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *np = b->oom || n < 0 ? NULL : realloc(b->p, b->len + (size_t)n + 1);
    if (!np) {
        b->oom = true;
        va_end(ap2);
        return;
    }
    b->p = np;
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    b->len += (size_t)n;
}

/* Function names are written into GBNF literals as they are, so they are
 * held to OpenAI's rule (openai.c checks it too). */
static bool plain_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 64)
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_' ||
              *s == '-' || *s == '.'))
            return false;
    return true;
}

/* tc-call ::= one of the functions' {"name": N, "<key>": ARGS} (harmony's
 * commentary message to the function). */
static int call_rules(gbuf *b, rt_tc_format f, const json_t *tools, const char *only, char *err,
                      size_t err_len)
{
    const char *key = f == RT_TC_LLAMA3 ? "parameters" : "arguments";
    gbuf alts = {0};
    int n = 0;
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const json_t *fn = json_object_get(json_array_get(tools, i), "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (!name || (only && strcmp(name, only)))
            continue;
        if (!plain_name(name)) {
            snprintf(err, err_len, "tools[%zu].function.name must be 1 to 64 of a-z, A-Z, 0-9, _, - and .",
                     i);
            free(alts.p);
            return -EINVAL;
        }
        json_t *params = json_object_get(fn, "parameters"), *any = NULL;
        if (!params && !(params = any = json_pack("{s:s}", "type", "object"))) {
            free(alts.p);
            return -ENOMEM;
        }
        char prefix[32], why[256];
        snprintf(prefix, sizeof(prefix), "t%zu-", i);
        int rc = rt_schema_gbnf(params, prefix, &b->p, &b->len, why, sizeof(why));
        json_decref(any);
        if (rc) {
            snprintf(err, err_len, "tools[%zu].function.parameters: %s", i, why);
            free(alts.p);
            return rc;
        }
        if (f == RT_TC_HARMONY)
            gput(b,
                 "tc-fn%zu ::= \"<|channel|>commentary to=functions.%s <|constrain|>json<|message|>\" "
                 "t%zu-value\n",
                 i, name, i);
        else
            gput(b, "tc-fn%zu ::= \"{\\\"name\\\": \\\"%s\\\", \\\"%s\\\": \" t%zu-value \"}\"\n", i, name,
                 key, i);
        gput(&alts, "%stc-fn%zu", n++ ? " | " : "", i);
    }
    if (!n) {
        snprintf(err, err_len, "no function in 'tools' to call");
        free(alts.p);
        return -EINVAL;
    }
    gput(b, "tc-call ::= %s\n", alts.oom ? "" : alts.p);
    bool oom = alts.oom;
    free(alts.p);
    return oom ? -ENOMEM : 0;
}

int rt_tc_grammar(rt_tc_format f, const json_t *tools, const char *name, bool parallel, char **out,
                  size_t *len, char *err, size_t err_len)
{
    gbuf b = {0};
    int rc = call_rules(&b, f, tools, name, err, err_len);
    if (!rc) {
        /* a few calls at most: the synthetic model would go on for ever */
        if (f == RT_TC_HERMES)
            gput(&b, "tc-one ::= \"" HERMES_OPEN "\\n\" tc-call \"\\n" HERMES_CLOSE "\"\nroot ::= tc-one%s\n",
                 parallel ? " (\"\\n\" tc-one){0,7}" : "");
        else if (f == RT_TC_MISTRAL)
            gput(&b, "root ::= \"" MISTRAL_TAG "[\" tc-call%s \"]\"\n",
                 parallel ? " (\", \" tc-call){0,7}" : "");
        else /* Llama 3.1's templates take one call a turn; harmony's <|call|> ends it */
            gput(&b, "root ::= tc-call\n");
        rc = b.oom ? -ENOMEM : 0;
    }
    if (rc == -ENOMEM)
        snprintf(err, err_len, "out of memory");
    if (rc) {
        free(b.p);
        return rc;
    }
    *out = b.p;
    *len = b.len;
    return 0;
}

/* The end of the JSON value starting at s[i] (its syntax loosely: strings,
 * brackets, scalars), or -1 where it does not end in s[0..n). */
static long skip_value(const char *s, size_t n, size_t i)
{
    int depth = 0;
    bool scalar = i < n && s[i] != '"' && s[i] != '{' && s[i] != '[';
    for (; i < n; i++) {
        char c = s[i];
        if (scalar) {
            if (c == ',' || c == '}' || c == ']' || rt_mk_is_ws(c))
                return (long)i;
            continue;
        }
        if (c == '"') {
            for (i++; i < n && s[i] != '"'; i++)
                if (s[i] == '\\')
                    i++;
            if (i >= n)
                return -1;
            if (depth == 0)
                return (long)i + 1;
        } else if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            if (--depth <= 0)
                return depth == 0 ? (long)i + 1 : -1;
        }
    }
    return scalar ? (long)n : -1;
}

static size_t skip_ws(const char *s, size_t n, size_t i)
{
    while (i < n && rt_mk_is_ws(s[i]))
        i++;
    return i;
}

/* Whether s[0..n) is one JSON value (numbers of any size). */
static bool is_json(const char *s, size_t n)
{
    json_error_t je;
    json_t *v = json_loadb(s, n, JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL, &je);
    json_decref(v);
    return v != NULL;
}

/* A call's object {"name": N, "arguments"/"parameters": V} in s[0..n)
 * (whitespace around it allowed): the name decoded and V's text; false
 * when it is not one. */
static bool read_call(const char *s, size_t n, rt_tc_call *out, bool *oom)
{
    size_t i = skip_ws(s, n, 0);
    long end = skip_value(s, n, i);
    if (i >= n || s[i] != '{' || end < 0 || skip_ws(s, n, (size_t)end) != n ||
        !is_json(s + i, (size_t)end - i))
        return false;
    const char *name = NULL, *args = NULL;
    size_t name_len = 0, args_len = 0;
    for (i = skip_ws(s, n, i + 1); i < (size_t)end && s[i] == '"';) {
        long k_end = skip_value(s, n, i);
        size_t v = skip_ws(s, n, skip_ws(s, n, (size_t)k_end) + 1); /* past ':' */
        long v_end = skip_value(s, n, v);
        if (k_end < 0 || v_end < 0)
            return false;
        const char *key = s + i + 1;
        size_t key_len = (size_t)k_end - i - 2;
#define KEY_IS(k) (key_len == sizeof(k) - 1 && !memcmp(key, k, key_len))
        if (KEY_IS("name"))
            name = s + v, name_len = (size_t)v_end - v;
        else if (KEY_IS("arguments") || KEY_IS("parameters"))
            args = s + v, args_len = (size_t)v_end - v;
#undef KEY_IS
        i = skip_ws(s, n, (size_t)v_end);
        i = i < n && s[i] == ',' ? skip_ws(s, n, i + 1) : i;
    }
    json_t *nm = name ? json_loadb(name, name_len, JSON_DECODE_ANY, NULL) : NULL;
    if (!json_is_string(nm)) {
        json_decref(nm);
        return false;
    }
    out->name = strdup(json_string_value(nm));
    json_decref(nm);
    /* arguments given as a string of JSON (as OpenAI's API writes them)
     * are that string's text */
    json_t *as = args && *args == '"' ? json_loadb(args, args_len, JSON_DECODE_ANY, NULL) : NULL;
    if (as && !is_json(json_string_value(as), json_string_length(as))) { /* then the string itself */
        json_decref(as);
        as = NULL;
    }
    out->arguments = as ? strdup(json_string_value(as)) : args ? strndup(args, args_len) : strdup("{}");
    json_decref(as);
    if (!out->name || !out->arguments) {
        free(out->name);
        free(out->arguments);
        *oom = true;
        return false;
    }
    return true;
}

/* ---- the parser ---- */

enum { OUT, IN_CALL, HOLD, PLAIN, DONE };

struct rt_tc_parser {
    rt_tc_format f;
    int state;
    char *buf; /* the answer so far */
    size_t len, cap;
    size_t pos;    /* buf before it is dealt with */
    size_t open;   /* IN_CALL, HOLD: where the call's marker began */
    /* IN_CALL: the call being written, once its head {"name": N,
     * "arguments": { is there: N, and where its arguments begin and how
     * far they are known to be its (a JSON scan: depth, in a string) */
    char *head_name;
    size_t args_from, args_to;
    int args_depth;
    bool args_str, args_esc, args_done;
    char *content; /* this feed's content */
    size_t c_len, c_cap;
    rt_tc_call *calls;
    int n_calls, calls_cap;
    bool oom;
    rt_harmony *h;         /* harmony: its parser does it all */
    const char *reasoning; /* harmony: this feed's */
    size_t reasoning_len;
};

rt_tc_parser *rt_tc_parser_new(rt_tc_format f)
{
    rt_tc_parser *p = calloc(1, sizeof(*p));
    if (p) {
        p->f = f;
        p->state = f == RT_TC_LLAMA3 ? HOLD : OUT;
        p->reasoning = "";
    }
    if (p && f == RT_TC_HARMONY && !(p->h = rt_harmony_new())) {
        free(p);
        return NULL;
    }
    return p;
}

void rt_tc_parser_free(rt_tc_parser *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->n_calls; i++) {
        free(p->calls[i].name);
        free(p->calls[i].arguments);
    }
    free(p->calls);
    free(p->head_name);
    free(p->buf);
    free(p->content);
    rt_harmony_free(p->h);
    free(p);
}

int rt_tc_n_calls(const rt_tc_parser *p)
{
    return p->h ? rt_harmony_n_calls(p->h) : p->n_calls;
}

const rt_tc_call *rt_tc_call_at(const rt_tc_parser *p, int i)
{
    return p->h ? rt_harmony_call_at(p->h, i) : &p->calls[i];
}

void rt_tc_reasoning(const rt_tc_parser *p, const char **text, size_t *len)
{
    *text = p->reasoning;
    *len = p->reasoning_len;
}

static void emit(rt_tc_parser *p, const char *s, size_t n)
{
    if (!n || p->oom)
        return;
    if (!rt_mk_grow(&p->content, &p->c_cap, p->c_len + n + 1)) {
        p->oom = true;
        return;
    }
    memcpy(p->content + p->c_len, s, n);
    p->c_len += n;
    p->content[p->c_len] = '\0';
}

static bool read_head(const char *s, size_t n, size_t from, char **name, size_t *args);

/* A call whose head {"name": N, "arguments": { is whole but whose rest is
 * not (cut short, or more after it): its arguments may have streamed
 * already, so it stays a call, with them as far as they are JSON ({}
 * else). */
static bool broken_call(const char *s, size_t to, size_t from, rt_tc_call *out, bool *oom)
{
    size_t a;
    if (!read_head(s, to, from, &out->name, &a))
        return false;
    long e = skip_value(s, to, a);
    out->arguments = e > 0 && is_json(s + a, (size_t)e - a) ? strndup(s + a, (size_t)e - a) : strdup("{}");
    if (!out->arguments) {
        free(out->name);
        *oom = true;
        return false;
    }
    return true;
}

/* Room for one more call; false when out of memory (p->oom set). */
static bool room_for_call(rt_tc_parser *p)
{
    if (p->n_calls < p->calls_cap)
        return true;
    int cap = p->calls_cap ? p->calls_cap * 2 : 4;
    rt_tc_call *nc = realloc(p->calls, (size_t)cap * sizeof(*nc));
    if (!nc) {
        p->oom = true;
        return false;
    }
    p->calls = nc;
    p->calls_cap = cap;
    return true;
}

/* Drops the calls after the first n (they were text after all). */
static void drop_calls(rt_tc_parser *p, int n)
{
    while (p->n_calls > n) {
        p->n_calls--;
        free(p->calls[p->n_calls].name);
        free(p->calls[p->n_calls].arguments);
    }
}

/* buf[from..to) is a call's JSON text: a call, else it stays content
 * (buf[raw..to_raw), the markers with it). */
static void call_or_text(rt_tc_parser *p, size_t from, size_t to, size_t raw, size_t raw_end)
{
    rt_tc_call c;
    bool oom = false;
    if (!room_for_call(p))
        return;
    if (read_call(p->buf + from, to - from, &c, &oom) || (!oom && broken_call(p->buf, to, from, &c, &oom)))
        p->calls[p->n_calls++] = c;
    else if (oom)
        p->oom = true;
    else
        emit(p, p->buf + raw, raw_end - raw);
}

/* Llama 3's calls in buf[from..to): one, or several separated by ';' (as
 * Llama 3.1 writes parallel calls, after <|python_tag|> too). true when
 * all of it is calls (then added); false, nothing added, else. */
static bool calls_semicolon(rt_tc_parser *p, size_t from, size_t to)
{
    const char *s = p->buf;
    int before = p->n_calls;
    for (size_t i = skip_ws(s, to, from); i < to;) {
        long e = s[i] == '{' ? skip_value(s, to, i) : -1;
        rt_tc_call c;
        bool oom = false;
        if (e < 0 || !room_for_call(p) || !read_call(s + i, (size_t)e - i, &c, &oom)) {
            p->oom = p->oom || oom;
            drop_calls(p, before);
            return false;
        }
        p->calls[p->n_calls++] = c;
        i = skip_ws(s, to, (size_t)e);
        if (i < to && s[i] == ';')
            i = skip_ws(s, to, i + 1);
        else if (i < to) {
            drop_calls(p, before);
            return false;
        }
    }
    return p->n_calls > before;
}

/* Mistral's [{call}, ...] (or one call) in buf[from..to): the calls, else
 * the text from raw stays content. */
static void calls_list(rt_tc_parser *p, size_t from, size_t to, size_t raw)
{
    const char *s = p->buf;
    size_t i = skip_ws(s, to, from);
    long end = i < to && s[i] == '[' ? skip_value(s, to, i) : -1;
    if (end < 0 || skip_ws(s, to, (size_t)end) != to) {
        call_or_text(p, from, to, raw, to);
        return;
    }
    int before = p->n_calls;
    for (i = skip_ws(s, to, i + 1); i < (size_t)end && s[i] == '{';) {
        long e = skip_value(s, to, i);
        rt_tc_call c;
        bool oom = false;
        if (e < 0 || !room_for_call(p) || !read_call(s + i, (size_t)e - i, &c, &oom)) {
            p->oom = p->oom || oom;
            break;
        }
        p->calls[p->n_calls++] = c;
        i = skip_ws(s, to, (size_t)e);
        i = i < to && s[i] == ',' ? skip_ws(s, to, i + 1) : i;
    }
    if (i + 1 == (size_t)end && s[i] == ']')
        return;
    /* not a list of calls after all: all of it is text */
    drop_calls(p, before);
    emit(p, s + raw, to - raw);
}

/* OUT: content up to the next marker; whitespace before a marker (and
 * after the last call) is dropped, so it is held until what follows it
 * is known. */
static void scan_out(rt_tc_parser *p, bool final)
{
    const char *m = p->f == RT_TC_MISTRAL ? MISTRAL_TAG : HERMES_OPEN;
    long k = rt_mk_find(p->buf + p->pos, p->len - p->pos, m, false);
    size_t end = k >= 0 ? p->pos + (size_t)k : p->len;
    if (k < 0 && !final)
        end -= rt_mk_partial(p->buf + p->pos, p->len - p->pos, m);
    size_t text_end = end;
    if (k >= 0 || !final || p->n_calls)
        while (text_end > p->pos && rt_mk_is_ws(p->buf[text_end - 1]))
            text_end--;
    emit(p, p->buf + p->pos, text_end - p->pos);
    p->pos = k >= 0 ? end : text_end;
    if (k >= 0) {
        p->open = text_end; /* the whitespace is text again if no call comes */
        p->pos = end + strlen(m);
        p->state = p->f == RT_TC_MISTRAL ? HOLD : IN_CALL;
    } else if (final) {
        p->pos = p->len;
    }
}

/* s[*i] begins "key" followed by ':' (whitespace around): *i past it. */
static bool match_key(const char *s, size_t n, size_t *i, const char *key)
{
    size_t k = strlen(key), j = *i;
    if (j + k + 2 > n || s[j] != '"' || memcmp(s + j + 1, key, k) || s[j + k + 1] != '"')
        return false;
    j = skip_ws(s, n, j + k + 2);
    if (j >= n || s[j] != ':')
        return false;
    *i = skip_ws(s, n, j + 1);
    return true;
}

/* Whether s[from..n) begins {"name": N, "arguments": { (whitespace
 * around): N decoded (malloc'd) and where the arguments begin. */
static bool read_head(const char *s, size_t n, size_t from, char **name, size_t *args)
{
    size_t i = skip_ws(s, n, from);
    if (i >= n || s[i] != '{')
        return false;
    i = skip_ws(s, n, i + 1);
    long e = match_key(s, n, &i, "name") && i < n && s[i] == '"' ? skip_value(s, n, i) : -1;
    if (e < 0)
        return false;
    size_t j = skip_ws(s, n, (size_t)e);
    if (j >= n || s[j] != ',')
        return false;
    j = skip_ws(s, n, j + 1);
    if (!match_key(s, n, &j, "arguments") || j >= n || s[j] != '{')
        return false;
    json_t *nm = json_loadb(s + i, (size_t)e - i, JSON_DECODE_ANY, NULL);
    *name = json_is_string(nm) ? strdup(json_string_value(nm)) : NULL;
    json_decref(nm);
    *args = j;
    return *name != NULL;
}

/* The arguments' text known so far: up to the end of their value. */
static void scan_args(rt_tc_parser *p)
{
    for (; !p->args_done && p->args_to < p->len; p->args_to++) {
        char c = p->buf[p->args_to];
        if (p->args_str) {
            if (p->args_esc)
                p->args_esc = false;
            else if (c == '\\')
                p->args_esc = true;
            else if (c == '"')
                p->args_str = false;
        } else if (c == '"') {
            p->args_str = true;
        } else if (c == '{' || c == '[') {
            p->args_depth++;
        } else if ((c == '}' || c == ']') && --p->args_depth == 0) {
            p->args_done = true;
        }
    }
}

static void drop_head(rt_tc_parser *p)
{
    free(p->head_name);
    p->head_name = NULL;
    p->args_from = p->args_to = 0;
    p->args_depth = 0;
    p->args_str = p->args_esc = p->args_done = false;
}

/* IN_CALL (hermes): the call ends at its closing tag, or with the answer. */
static void scan_call(rt_tc_parser *p, bool final)
{
    long k = rt_mk_find(p->buf + p->pos, p->len - p->pos, HERMES_CLOSE, false);
    if (k < 0 && !final) {
        /* still open: its head, then its arguments as they come */
        if (!p->head_name && read_head(p->buf, p->len, p->pos, &p->head_name, &p->args_from))
            p->args_to = p->args_from;
        if (p->head_name)
            scan_args(p);
        return;
    }
    size_t to = k >= 0 ? p->pos + (size_t)k : p->len;
    size_t raw_end = k >= 0 ? to + sizeof(HERMES_CLOSE) - 1 : p->len;
    call_or_text(p, p->pos, to, p->open, raw_end);
    drop_head(p);
    p->pos = raw_end;
    p->state = OUT;
}

/* HOLD: llama3's answer that may be a call, mistral's list after its
 * marker: read when the answer is complete. */
static void scan_hold(rt_tc_parser *p, bool final)
{
    if (p->f == RT_TC_LLAMA3) {
        size_t i = skip_ws(p->buf, p->len, 0);
        bool tag =
            p->len - i >= sizeof(PYTHON_TAG) - 1 && !memcmp(p->buf + i, PYTHON_TAG, sizeof(PYTHON_TAG) - 1);
        bool maybe = i == p->len || p->buf[i] == '{' || tag ||
                     !memcmp(p->buf + i, PYTHON_TAG, p->len - i < 14 ? p->len - i : 14);
        if (!maybe) { /* plain text from here: it streams */
            p->state = PLAIN;
            return;
        }
        if (!final)
            return;
        size_t from = tag ? i + sizeof(PYTHON_TAG) - 1 : i;
        if (!calls_semicolon(p, from, p->len) && !p->oom)
            call_or_text(p, from, p->len, 0, p->len);
    } else if (final) {
        calls_list(p, p->pos, p->len, p->open);
    } else {
        return;
    }
    p->pos = p->len;
    p->state = DONE;
}

int rt_tc_feed(rt_tc_parser *p, const char *text, size_t len, bool final, const char **content,
               size_t *content_len)
{
    if (p->h)
        return rt_harmony_feed(p->h, text, len, final, &p->reasoning, &p->reasoning_len, content,
                               content_len);
    p->c_len = 0;
    if (!p->oom && rt_mk_grow(&p->buf, &p->cap, p->len + len + 1)) {
        memcpy(p->buf + p->len, text, len);
        p->len += len;
        p->buf[p->len] = '\0';
    } else {
        p->oom = true;
    }
    for (size_t guard = 0; !p->oom && guard < p->len + 2; guard++) {
        int state = p->state;
        size_t pos = p->pos;
        if (state == OUT)
            scan_out(p, final);
        else if (state == IN_CALL)
            scan_call(p, final);
        else if (state == HOLD)
            scan_hold(p, final);
        if (p->state == PLAIN) {
            emit(p, p->buf + p->pos, p->len - p->pos);
            p->pos = p->len;
        }
        if (state == p->state && pos == p->pos)
            break;
    }
    *content = p->c_len ? p->content : "";
    *content_len = p->c_len;
    return p->oom ? -ENOMEM : 0;
}

bool rt_tc_pending(const rt_tc_parser *p, const char **name, const char **args, size_t *len)
{
    if (p->h)
        return rt_harmony_pending(p->h, name, args, len);
    if (p->state != IN_CALL || !p->head_name)
        return false;
    *name = p->head_name;
    *args = p->buf + p->args_from;
    *len = p->args_to - p->args_from;
    return true;
}
