/* Jinja values (see internal.h): the arena they live in, strings that know
 * which of their bytes are plain input, lists, dicts, and Python's rules
 * for them: truth, equality, ordering, str(), repr() and json.dumps(). */
#include "runtime/jinja/internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- arena ---- */

struct jn_chunk {
    jn_chunk *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

static _Noreturn void arena_fail(jn_arena *a, int rc, const char *why)
{
    if (a->err && a->err_len)
        snprintf(a->err, a->err_len, "%s", why);
    *a->rc = rc;
    longjmp(*a->fail, 1);
}

void *jn_alloc(jn_arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    jn_chunk *h = a->head;
    if (!h || h->size - h->used < n) {
        size_t size = n > 32768 ? n : 32768;
        if (a->limit && a->used + size + sizeof(jn_chunk) > a->limit)
            arena_fail(a, -E2BIG, "the template used more memory than a render may");
        h = malloc(sizeof(jn_chunk) + size);
        if (!h)
            arena_fail(a, -ENOMEM, "out of memory rendering the template");
        h->next = a->head;
        h->size = size;
        h->used = 0;
        a->head = h;
        a->used += size + sizeof(jn_chunk);
    }
    void *p = h->data + h->used;
    h->used += n;
    memset(p, 0, n);
    return p;
}

char *jn_strdup(jn_arena *a, const char *s, size_t n)
{
    char *p = jn_alloc(a, n + 1);
    memcpy(p, s, n);
    return p;
}

void jn_arena_free(jn_arena *a)
{
    for (jn_chunk *h = a->head, *next; h; h = next) {
        next = h->next;
        free(h);
    }
    a->head = NULL;
    a->used = 0;
}

/* ---- constructors ---- */

jv jv_undef(const char *name) { return (jv){.kind = JV_UNDEF, .undef_name = name}; }
jv jv_none(void) { return (jv){.kind = JV_NONE}; }
jv jv_bool(bool b) { return (jv){.kind = JV_BOOL, .b = b}; }
jv jv_int(int64_t i) { return (jv){.kind = JV_INT, .i = i}; }
jv jv_float(double f) { return (jv){.kind = JV_FLOAT, .f = f}; }
jv jv_str(const jstr *s) { return (jv){.kind = JV_STR, .s = s}; }
jv jv_list(const jlist *l) { return (jv){.kind = JV_LIST, .l = l}; }
jv jv_func(int id) { return (jv){.kind = JV_FUNC, .func = id}; }

static bool all_ascii(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)p[i] >= 0x80)
            return false;
    return true;
}

const jstr *js_new(jn_arena *a, const char *p, size_t n, bool plain)
{
    if (n > UINT32_MAX / 2)
        arena_fail(a, -E2BIG, "a string in the template is too long");
    jstr *s = jn_alloc(a, sizeof(*s));
    s->p = jn_strdup(a, p, n);
    s->len = (uint32_t)n;
    s->ascii = all_ascii(p, n);
    if (plain && n > 0) {
        jspan *sp = jn_alloc(a, sizeof(*sp));
        *sp = (jspan){0, (uint32_t)n};
        s->spans = sp;
        s->n_spans = 1;
    }
    return s;
}

const jstr *js_lit(jn_arena *a, const char *cstr)
{
    return js_new(a, cstr, strlen(cstr), false);
}

jv jv_strv(jn_arena *a, const char *p, size_t n)
{
    return jv_str(js_new(a, p, n, false));
}

const jstr *js_sub(jn_arena *a, const jstr *s, size_t off, size_t n)
{
    if (off == 0 && n == s->len)
        return s;
    jstr *r = jn_alloc(a, sizeof(*r));
    r->p = s->p + off;
    r->len = (uint32_t)n;
    r->ascii = s->ascii || all_ascii(r->p, n);
    uint32_t k = 0;
    jspan *sp = s->n_spans ? jn_alloc(a, s->n_spans * sizeof(*sp)) : NULL;
    for (uint32_t i = 0; i < s->n_spans; i++) {
        size_t b = s->spans[i].off, e = b + s->spans[i].len;
        if (b < off)
            b = off;
        if (e > off + n)
            e = off + n;
        if (b < e)
            sp[k++] = (jspan){(uint32_t)(b - off), (uint32_t)(e - b)};
    }
    r->spans = sp;
    r->n_spans = k;
    return r;
}

const jstr *js_taint_like(jn_arena *a, const jstr *from, const char *p, size_t n)
{
    return js_new(a, p, n, from && from->n_spans > 0);
}

jlist *jl_new(jn_arena *a, uint32_t n)
{
    jlist *l = jn_alloc(a, sizeof(*l));
    l->n = n;
    l->items = n ? jn_alloc(a, (size_t)n * sizeof(jv)) : NULL;
    return l;
}

jdict *jd_new(jn_arena *a)
{
    return jn_alloc(a, sizeof(jdict));
}

static bool key_equal(jv a, const char *key, size_t len)
{
    return a.kind == JV_STR && a.s->len == len && memcmp(a.s->p, key, len) == 0;
}

bool jd_get_str(const jdict *d, const char *key, size_t len, jv *val)
{
    for (uint32_t i = 0; i < d->n; i++)
        if (key_equal(d->keys[i], key, len)) {
            *val = d->vals[i];
            return true;
        }
    return false;
}

bool jd_get(const jdict *d, jv key, jv *val)
{
    if (key.kind == JV_STR)
        return jd_get_str(d, key.s->p, key.s->len, val);
    for (uint32_t i = 0; i < d->n; i++)
        if (jv_equal(d->keys[i], key)) {
            *val = d->vals[i];
            return true;
        }
    return false;
}

void jd_set(jn_arena *a, jdict *d, jv key, jv val)
{
    for (uint32_t i = 0; i < d->n; i++)
        if (jv_equal(d->keys[i], key)) {
            d->vals[i] = val;
            return;
        }
    if (d->n == d->cap) {
        uint32_t cap = d->cap ? d->cap * 2 : 8;
        jv *k = jn_alloc(a, cap * sizeof(jv)), *v = jn_alloc(a, cap * sizeof(jv));
        if (d->n) {
            memcpy(k, d->keys, d->n * sizeof(jv));
            memcpy(v, d->vals, d->n * sizeof(jv));
        }
        d->keys = k;
        d->vals = v;
        d->cap = cap;
    }
    d->keys[d->n] = key;
    d->vals[d->n++] = val;
}

/* ---- Python's rules ---- */

bool jv_truthy(jv v)
{
    switch (v.kind) {
    case JV_UNDEF:
    case JV_NONE:
        return false;
    case JV_BOOL:
        return v.b;
    case JV_INT:
        return v.i != 0;
    case JV_FLOAT:
        return v.f != 0.0;
    case JV_STR:
        return v.s->len > 0;
    case JV_LIST:
        return v.l->n > 0;
    case JV_DICT:
        return v.d->n > 0;
    default:
        return true;
    }
}

static bool is_number(jv v)
{
    return v.kind == JV_INT || v.kind == JV_FLOAT || v.kind == JV_BOOL;
}

static double as_double(jv v)
{
    return v.kind == JV_FLOAT ? v.f : v.kind == JV_BOOL ? (double)v.b : (double)v.i;
}

static int64_t as_int(jv v)
{
    return v.kind == JV_BOOL ? (int64_t)v.b : v.i;
}

bool jv_equal(jv a, jv b)
{
    if (is_number(a) && is_number(b)) {
        if (a.kind == JV_FLOAT || b.kind == JV_FLOAT)
            return as_double(a) == as_double(b);
        return as_int(a) == as_int(b);
    }
    if (a.kind != b.kind)
        return false;
    switch (a.kind) {
    case JV_UNDEF:
    case JV_NONE:
        return true;
    case JV_STR:
        return a.s->len == b.s->len && memcmp(a.s->p, b.s->p, a.s->len) == 0;
    case JV_LIST:
        if (a.l->is_tuple != b.l->is_tuple || a.l->n != b.l->n)
            return false;
        for (uint32_t i = 0; i < a.l->n; i++)
            if (!jv_equal(a.l->items[i], b.l->items[i]))
                return false;
        return true;
    case JV_DICT:
        if (a.d->n != b.d->n)
            return false;
        for (uint32_t i = 0; i < a.d->n; i++) {
            jv other;
            if (!jd_get(b.d, a.d->keys[i], &other) || !jv_equal(a.d->vals[i], other))
                return false;
        }
        return true;
    case JV_NS:
        return a.d == b.d;
    case JV_FUNC:
        return a.func == b.func;
    case JV_MACRO:
        return a.macro == b.macro;
    default:
        return false;
    }
}

const char *jv_type_name(jv v)
{
    switch (v.kind) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return v.l->is_tuple ? "tuple" : "list";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_LOOP: return "LoopContext";
    case JV_MACRO: return "Macro";
    default: return "builtin_function_or_method";
    }
}

int jv_compare(jctx *c, jv a, jv b)
{
    if (is_number(a) && is_number(b)) {
        if (a.kind == JV_FLOAT || b.kind == JV_FLOAT) {
            double x = as_double(a), y = as_double(b);
            return x < y ? -1 : x > y ? 1 : 0;
        }
        int64_t x = as_int(a), y = as_int(b);
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a.kind == JV_STR && b.kind == JV_STR) {
        /* UTF-8 byte order is code point order */
        size_t n = a.s->len < b.s->len ? a.s->len : b.s->len;
        int r = memcmp(a.s->p, b.s->p, n);
        return r ? r : a.s->len < b.s->len ? -1 : a.s->len > b.s->len ? 1 : 0;
    }
    if (a.kind == JV_LIST && b.kind == JV_LIST && a.l->is_tuple == b.l->is_tuple) {
        for (uint32_t i = 0; i < a.l->n && i < b.l->n; i++) {
            if (jv_equal(a.l->items[i], b.l->items[i]))
                continue;
            return jv_compare(c, a.l->items[i], b.l->items[i]);
        }
        return a.l->n < b.l->n ? -1 : a.l->n > b.l->n ? 1 : 0;
    }
    jn_fail(c, "'<' not supported between instances of '%s' and '%s'", jv_type_name(a), jv_type_name(b));
}

/* ---- buffers ---- */

static void jb_grow(jctx *c, jbuf *b, size_t n)
{
    if (n > c->lim.max_output || c->out_total > c->lim.max_output - n)
        jn_fail_raw(c, -E2BIG, "the template's output is larger than a render may write");
    c->out_total += n;
    if (b->len + n + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1)
        cap *= 2;
    char *p = jn_alloc(&c->arena, cap);
    if (b->len)
        memcpy(p, b->p, b->len);
    b->p = p;
    b->cap = cap;
}

void jb_add(jctx *c, jbuf *b, const char *p, size_t n)
{
    if (n == 0)
        return;
    jb_grow(c, b, n);
    memcpy(b->p + b->len, p, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void jb_addc(jctx *c, jbuf *b, const char *s)
{
    jb_add(c, b, s, strlen(s));
}

static void jb_span(jctx *c, jbuf *b, size_t off, size_t n)
{
    if (b->n_spans && b->spans[b->n_spans - 1].off + b->spans[b->n_spans - 1].len == off) {
        b->spans[b->n_spans - 1].len += (uint32_t)n;
        return;
    }
    if (b->n_spans == b->cap_spans) {
        uint32_t cap = b->cap_spans ? b->cap_spans * 2 : 8;
        jspan *sp = jn_alloc(&c->arena, cap * sizeof(*sp));
        if (b->n_spans)
            memcpy(sp, b->spans, b->n_spans * sizeof(*sp));
        b->spans = sp;
        b->cap_spans = cap;
    }
    b->spans[b->n_spans++] = (jspan){(uint32_t)off, (uint32_t)n};
}

void jb_addstr(jctx *c, jbuf *b, const jstr *s)
{
    size_t at = b->len;
    if (at + s->len > UINT32_MAX / 2)
        jn_fail_raw(c, -E2BIG, "the template's output is larger than a render may write");
    jb_add(c, b, s->p, s->len);
    for (uint32_t i = 0; i < s->n_spans; i++)
        jb_span(c, b, at + s->spans[i].off, s->spans[i].len);
}

const jstr *jb_finish(jctx *c, jbuf *b)
{
    jstr *s = jn_alloc(&c->arena, sizeof(*s));
    s->p = b->p ? b->p : "";
    s->len = (uint32_t)b->len;
    s->ascii = all_ascii(s->p, s->len);
    s->spans = b->spans;
    s->n_spans = b->n_spans;
    return s;
}

/* ---- UTF-8 ---- */

static size_t cp_len(unsigned char ch)
{
    return ch < 0x80 ? 1 : ch < 0xe0 ? 2 : ch < 0xf0 ? 3 : 4;
}

size_t ju_len(const jstr *s)
{
    if (s->ascii)
        return s->len;
    size_t n = 0;
    for (size_t i = 0; i < s->len; i += cp_len((unsigned char)s->p[i]))
        n++;
    return n;
}

size_t ju_offset(const jstr *s, size_t cp)
{
    if (s->ascii)
        return cp < s->len ? cp : s->len;
    size_t i = 0;
    while (cp-- > 0 && i < s->len)
        i += cp_len((unsigned char)s->p[i]);
    return i < s->len ? i : s->len;
}

static uint32_t decode_cp(const char *p, size_t n, size_t *adv)
{
    unsigned char c0 = (unsigned char)p[0];
    size_t k = cp_len(c0);
    if (k > n)
        k = n;
    *adv = k;
    if (k == 1)
        return c0;
    uint32_t cp = c0 & (0xff >> (k + 1));
    for (size_t i = 1; i < k; i++)
        cp = (cp << 6) | ((unsigned char)p[i] & 0x3f);
    return cp;
}

bool ju_isspace_at(const char *p, size_t n, size_t *adv)
{
    uint32_t cp = decode_cp(p, n, adv);
    switch (cp) {
    case ' ': case '\t': case '\n': case '\v': case '\f': case '\r':
    case 0x1c: case 0x1d: case 0x1e: case 0x1f: case 0x85: case 0xa0: case 0x1680:
    case 0x2028: case 0x2029: case 0x202f: case 0x205f: case 0x3000:
        return true;
    default:
        return cp >= 0x2000 && cp <= 0x200a;
    }
}

/* ---- str(), repr() ---- */

/* Python's repr of a float: the shortest digits that read back the same,
 * positional for exponents -4..15, else scientific with at least two
 * exponent digits; integral values keep ".0". */
static void float_repr(char *out, size_t cap, double f)
{
    if (isnan(f)) {
        snprintf(out, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(out, cap, f < 0 ? "-inf" : "inf");
        return;
    }
    char digits[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(digits, sizeof(digits), "%.*e", prec - 1, f);
        if (strtod(digits, NULL) == f)
            break;
    }
    /* digits: [-]d[.ddd]e[+-]XX */
    bool neg = digits[0] == '-';
    const char *d = digits + neg;
    char mant[24];
    int nm = 0;
    const char *q = d;
    for (; *q && *q != 'e'; q++)
        if (*q != '.')
            mant[nm++] = *q;
    mant[nm] = '\0';
    int exp = atoi(q + 1);
    while (nm > 1 && mant[nm - 1] == '0')
        mant[--nm] = '\0';
    char *o = out;
    size_t left = cap;
#define PUT(...) do { int w_ = snprintf(o, left, __VA_ARGS__); if (w_ > 0 && (size_t)w_ < left) { o += w_; left -= (size_t)w_; } } while (0)
    if (neg)
        PUT("-");
    if (exp < -4 || exp >= 16) {
        PUT("%c", mant[0]);
        if (nm > 1)
            PUT(".%s", mant + 1);
        PUT("e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    } else if (exp < 0) {
        PUT("0.");
        for (int i = 0; i < -exp - 1; i++)
            PUT("0");
        PUT("%s", mant);
    } else {
        for (int i = 0; i <= exp; i++)
            PUT("%c", i < nm ? mant[i] : '0');
        PUT(".");
        if (nm > exp + 1)
            PUT("%s", mant + exp + 1);
        else
            PUT("0");
    }
#undef PUT
}

static void repr_str(jctx *c, jbuf *b, const jstr *s)
{
    bool has_sq = memchr(s->p, '\'', s->len) != NULL, has_dq = memchr(s->p, '"', s->len) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    jb_add(c, b, &q, 1);
    size_t start = b->len;
    for (size_t i = 0; i < s->len;) {
        size_t adv;
        uint32_t cp = decode_cp(s->p + i, s->len - i, &adv);
        char esc[16];
        const char *e = NULL;
        if (cp == (uint32_t)q || cp == '\\') {
            snprintf(esc, sizeof(esc), "\\%c", (char)cp);
            e = esc;
        } else if (cp == '\n') {
            e = "\\n";
        } else if (cp == '\r') {
            e = "\\r";
        } else if (cp == '\t') {
            e = "\\t";
        } else if (cp < 0x20 || (cp >= 0x7f && cp <= 0xa0) || cp == 0xad) {
            snprintf(esc, sizeof(esc), "\\x%02x", cp);
            e = esc;
        } else if ((cp >= 0x2000 && cp <= 0x200f) || (cp >= 0x2028 && cp <= 0x202f) ||
                   (cp >= 0x205f && cp <= 0x206f) || cp == 0x3000 || cp == 0xfeff || cp == 0x1680) {
            snprintf(esc, sizeof(esc), "\\u%04x", cp);
            e = esc;
        }
        if (e)
            jb_addc(c, b, e);
        else
            jb_add(c, b, s->p + i, adv);
        i += adv;
    }
    if (s->n_spans && b->len > start)
        jb_span(c, b, start, b->len - start);
    jb_add(c, b, &q, 1);
}

void jb_repr(jctx *c, jbuf *b, jv v)
{
    jn_cost(c, 1);
    switch (v.kind) {
    case JV_STR:
        repr_str(c, b, v.s);
        return;
    case JV_LIST:
        jb_addc(c, b, v.l->is_tuple ? "(" : "[");
        for (uint32_t i = 0; i < v.l->n; i++) {
            if (i)
                jb_addc(c, b, ", ");
            jb_repr(c, b, v.l->items[i]);
        }
        jb_addc(c, b, v.l->is_tuple ? (v.l->n == 1 ? ",)" : ")") : "]");
        return;
    case JV_DICT:
        jb_addc(c, b, "{");
        for (uint32_t i = 0; i < v.d->n; i++) {
            if (i)
                jb_addc(c, b, ", ");
            jb_repr(c, b, v.d->keys[i]);
            jb_addc(c, b, ": ");
            jb_repr(c, b, v.d->vals[i]);
        }
        jb_addc(c, b, "}");
        return;
    case JV_NS:
        jb_addc(c, b, "<Namespace {");
        for (uint32_t i = 0; i < v.d->n; i++) {
            if (i)
                jb_addc(c, b, ", ");
            jb_repr(c, b, v.d->keys[i]);
            jb_addc(c, b, ": ");
            jb_repr(c, b, v.d->vals[i]);
        }
        jb_addc(c, b, "}>");
        return;
    default:
        jb_str(c, b, v);
    }
}

void jb_str(jctx *c, jbuf *b, jv v)
{
    char num[64];
    switch (v.kind) {
    case JV_UNDEF:
        return;
    case JV_NONE:
        jb_addc(c, b, "None");
        return;
    case JV_BOOL:
        jb_addc(c, b, v.b ? "True" : "False");
        return;
    case JV_INT:
        snprintf(num, sizeof(num), "%lld", (long long)v.i);
        jb_addc(c, b, num);
        return;
    case JV_FLOAT:
        float_repr(num, sizeof(num), v.f);
        jb_addc(c, b, num);
        return;
    case JV_STR:
        jb_addstr(c, b, v.s);
        return;
    case JV_LIST:
    case JV_DICT:
    case JV_NS:
        jb_repr(c, b, v);
        return;
    default:
        /* Python names an object's address here: nothing a prompt can use */
        jn_fail(c, "cannot turn a %s into text", jv_type_name(v));
    }
}

const jstr *jv_to_str(jctx *c, jv v)
{
    if (v.kind == JV_STR)
        return v.s;
    jbuf b = {0};
    jb_str(c, &b, v);
    return jb_finish(c, &b);
}

/* ---- json.dumps ---- */

static void json_str(jctx *c, jbuf *b, const jstr *s)
{
    size_t start = b->len;
    jb_addc(c, b, "\"");
    size_t run = 0;
    for (size_t i = 0; i < s->len; i++) {
        unsigned char ch = (unsigned char)s->p[i];
        const char *e = NULL;
        char esc[8];
        switch (ch) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        default:
            if (ch < 0x20) {
                snprintf(esc, sizeof(esc), "\\u%04x", ch);
                e = esc;
            }
        }
        if (!e)
            continue;
        jb_add(c, b, s->p + run, i - run);
        jb_addc(c, b, e);
        run = i + 1;
    }
    jb_add(c, b, s->p + run, s->len - run);
    jb_addc(c, b, "\"");
    if (s->n_spans)
        jb_span(c, b, start, b->len - start);
}

static void json_indent(jctx *c, jbuf *b, int indent, int level)
{
    jb_addc(c, b, "\n");
    for (int i = 0; i < indent * level; i++)
        jb_addc(c, b, " ");
}

typedef struct json_fmt {
    int indent;
    const char *item_sep, *key_sep;
    bool sort_keys;
} json_fmt;

static void json_value(jctx *c, jbuf *b, jv v, const json_fmt *f, int level);

static void json_key(jctx *c, jbuf *b, jv k)
{
    if (k.kind == JV_STR) {
        json_str(c, b, k.s);
        return;
    }
    jbuf t = {0};
    if (k.kind == JV_BOOL)
        jb_addc(c, &t, k.b ? "true" : "false");
    else if (k.kind == JV_NONE)
        jb_addc(c, &t, "null");
    else if (k.kind == JV_INT || k.kind == JV_FLOAT)
        jb_str(c, &t, k);
    else
        jn_fail(c, "keys must be str, int, float, bool or None, not %s", jv_type_name(k));
    json_str(c, b, jb_finish(c, &t));
}

static void json_dict(jctx *c, jbuf *b, const jdict *d, const json_fmt *f, int level)
{
    if (d->n == 0) {
        jb_addc(c, b, "{}");
        return;
    }
    uint32_t *order = jn_alloc(&c->arena, d->n * sizeof(uint32_t));
    for (uint32_t i = 0; i < d->n; i++)
        order[i] = i;
    if (f->sort_keys) /* insertion sort: dicts in prompts are small, and this charges its cost */
        for (uint32_t i = 1; i < d->n; i++) {
            jn_cost(c, i);
            for (uint32_t j = i; j > 0 && jv_compare(c, d->keys[order[j]], d->keys[order[j - 1]]) < 0; j--) {
                uint32_t t = order[j];
                order[j] = order[j - 1];
                order[j - 1] = t;
            }
        }
    jb_addc(c, b, "{");
    for (uint32_t i = 0; i < d->n; i++) {
        if (i)
            jb_addc(c, b, f->item_sep);
        if (f->indent >= 0)
            json_indent(c, b, f->indent, level + 1);
        json_key(c, b, d->keys[order[i]]);
        jb_addc(c, b, f->key_sep);
        json_value(c, b, d->vals[order[i]], f, level + 1);
    }
    if (f->indent >= 0)
        json_indent(c, b, f->indent, level);
    jb_addc(c, b, "}");
}

static void json_value(jctx *c, jbuf *b, jv v, const json_fmt *f, int level)
{
    jn_cost(c, 1);
    if (level > c->lim.max_depth)
        jn_fail(c, "tojson: nesting deeper than %d", c->lim.max_depth);
    char num[64];
    switch (v.kind) {
    case JV_NONE:
        jb_addc(c, b, "null");
        return;
    case JV_BOOL:
        jb_addc(c, b, v.b ? "true" : "false");
        return;
    case JV_INT:
        jb_str(c, b, v);
        return;
    case JV_FLOAT:
        if (isnan(v.f))
            jb_addc(c, b, "NaN");
        else if (isinf(v.f))
            jb_addc(c, b, v.f < 0 ? "-Infinity" : "Infinity");
        else {
            float_repr(num, sizeof(num), v.f);
            jb_addc(c, b, num);
        }
        return;
    case JV_STR:
        json_str(c, b, v.s);
        return;
    case JV_LIST:
        if (v.l->n == 0) {
            jb_addc(c, b, "[]");
            return;
        }
        jb_addc(c, b, "[");
        for (uint32_t i = 0; i < v.l->n; i++) {
            if (i)
                jb_addc(c, b, f->item_sep);
            if (f->indent >= 0)
                json_indent(c, b, f->indent, level + 1);
            json_value(c, b, v.l->items[i], f, level + 1);
        }
        if (f->indent >= 0)
            json_indent(c, b, f->indent, level);
        jb_addc(c, b, "]");
        return;
    case JV_DICT:
        json_dict(c, b, v.d, f, level);
        return;
    default:
        jn_fail(c, "Object of type %s is not JSON serializable", jv_type_name(v));
    }
}

void jb_json(jctx *c, jbuf *b, jv v, int indent, const char *item_sep, const char *key_sep, bool sort_keys)
{
    json_fmt f = {
        .indent = indent,
        .item_sep = item_sep ? item_sep : indent >= 0 ? "," : ", ",
        .key_sep = key_sep ? key_sep : ": ",
        .sort_keys = sort_keys,
    };
    json_value(c, b, v, &f, 0);
}

/* ---- from JSON ---- */

jv jv_from_json(jctx *c, const json_t *j, bool plain)
{
    jn_cost(c, 1);
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        jdict *d = jd_new(&c->arena);
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)j, k, v)
        {
            jv key = jv_str(js_new(&c->arena, k, strlen(k), plain));
            jd_set(&c->arena, d, key, jv_from_json(c, v, plain));
        }
        return (jv){.kind = JV_DICT, .d = d};
    }
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        if (n > UINT32_MAX / 2)
            jn_fail_raw(c, -E2BIG, "an array in the input is too long");
        jlist *l = jl_new(&c->arena, (uint32_t)n);
        for (size_t i = 0; i < n; i++)
            ((jv *)l->items)[i] = jv_from_json(c, json_array_get(j, i), plain);
        return jv_list(l);
    }
    case JSON_STRING:
        return jv_str(js_new(&c->arena, json_string_value(j), json_string_length(j), plain));
    case JSON_INTEGER:
        return jv_int((int64_t)json_integer_value(j));
    case JSON_REAL:
        return jv_float(json_real_value(j));
    case JSON_TRUE:
        return jv_bool(true);
    case JSON_FALSE:
        return jv_bool(false);
    default:
        return jv_none();
    }
}
