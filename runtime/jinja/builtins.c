/* Jinja's filters, tests and global functions, and the str, dict and list
 * methods templates call, as Jinja2 3.1 and Python 3 define them (see
 * jinja.h for the set). Case mappings (upper, lower, title, capitalize)
 * are ASCII's: the other letters keep their case. */
#define _GNU_SOURCE /* memmem */
#include "runtime/jinja/internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- names ---- */

enum {
    F_ABS, F_CAPITALIZE, F_COUNT, F_DEFAULT, F_D, F_DICTSORT, F_E, F_ESCAPE, F_FIRST, F_FLOAT, F_INDENT, F_INT,
    F_ITEMS, F_JOIN, F_LAST, F_LENGTH, F_LIST, F_LOWER, F_MAP, F_MAX, F_MIN, F_REJECT, F_REJECTATTR, F_REPLACE,
    F_REVERSE, F_ROUND, F_SAFE, F_SELECT, F_SELECTATTR, F_SORT, F_STRING, F_SUM, F_TITLE, F_TOJSON, F_TRIM,
    F_UNIQUE, F_UPPER, F_N
};
static const char *const k_filters[F_N] = {
    "abs", "capitalize", "count", "default", "d", "dictsort", "e", "escape", "first", "float", "indent", "int",
    "items", "join", "last", "length", "list", "lower", "map", "max", "min", "reject", "rejectattr", "replace",
    "reverse", "round", "safe", "select", "selectattr", "sort", "string", "sum", "title", "tojson", "trim",
    "unique", "upper",
};

enum {
    T_BOOLEAN, T_CALLABLE, T_DEFINED, T_DIVISIBLEBY, T_EQ, T_EQUALTO, T_EQ_OP, T_ESCAPED, T_EVEN, T_FALSE,
    T_FILTER, T_FLOAT, T_GE, T_GE_OP, T_GT, T_GT_OP, T_GREATERTHAN, T_IN, T_INTEGER, T_ITERABLE, T_LE, T_LE_OP,
    T_LESSTHAN, T_LOWER, T_LT, T_LT_OP, T_MAPPING, T_NE, T_NE_OP, T_NONE, T_NUMBER, T_ODD, T_SAMEAS,
    T_SEQUENCE, T_STRING, T_TEST, T_TRUE, T_UNDEFINED, T_UPPER, T_N
};
static const char *const k_tests[T_N] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "==", "escaped", "even", "false",
    "filter", "float", "ge", ">=", "gt", ">", "greaterthan", "in", "integer", "iterable", "le", "<=",
    "lessthan", "lower", "lt", "<", "mapping", "ne", "!=", "none", "number", "odd", "sameas",
    "sequence", "string", "test", "true", "undefined", "upper",
};

enum { G_RANGE, G_NAMESPACE, G_DICT, G_RAISE, G_STRFTIME, G_N };
static const char *const k_funcs[G_N] = {"range", "namespace", "dict", "raise_exception", "strftime_now"};

enum {
    M_STRIP, M_LSTRIP, M_RSTRIP, M_SPLIT, M_RSPLIT, M_STARTSWITH, M_ENDSWITH, M_REPLACE, M_UPPER, M_LOWER,
    M_TITLE, M_CAPITALIZE, M_FIND, M_RFIND, M_COUNT, M_JOIN, M_SPLITLINES, M_ISDIGIT, M_ISALPHA, M_ISALNUM,
    M_ISSPACE, M_ISLOWER, M_ISUPPER, M_STR_N,
    M_ITEMS = M_STR_N, M_KEYS, M_VALUES, M_GET, M_DICT_N,
    M_INDEX = M_DICT_N, M_LCOUNT, M_LIST_N,
    M_CYCLE = M_LIST_N, M_N
};
static const char *const k_methods[M_N] = {
    "strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "replace", "upper", "lower",
    "title", "capitalize", "find", "rfind", "count", "join", "splitlines", "isdigit", "isalpha", "isalnum",
    "isspace", "islower", "isupper",
    "items", "keys", "values", "get",
    "index", "count",
    "cycle",
};

static int find_name(const char *const *names, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(names[i], name))
            return i;
    return -1;
}

int jn_filter_id(const char *name) { return find_name(k_filters, F_N, name); }
int jn_test_id(const char *name) { return find_name(k_tests, T_N, name); }
int jn_func_id(const char *name) { return find_name(k_funcs, G_N, name); }

int jn_method_id(jv self, const char *name)
{
    int lo, hi;
    switch (self.kind) {
    case JV_STR: lo = 0; hi = M_STR_N; break;
    case JV_DICT: lo = M_STR_N; hi = M_DICT_N; break;
    case JV_LIST: lo = M_DICT_N; hi = M_LIST_N; break;
    case JV_LOOP: lo = M_LIST_N; hi = M_N; break;
    default: return -1;
    }
    for (int i = lo; i < hi; i++)
        if (!strcmp(k_methods[i], name))
            return i;
    /* ImmutableSandboxedEnvironment refuses what changes a value */
    return -1;
}

/* ---- argument helpers ---- */

typedef struct args {
    const jv *pos;
    int n_pos;
    const char **kw;
    const jv *kw_vals;
    int n_kw;
    const char *what;
} args;

/* Argument i, by position or by keyword name; dflt when absent. */
static jv arg(jctx *c, const args *a, int i, const char *name, jv dflt)
{
    if (i >= 0 && i < a->n_pos)
        return a->pos[i];
    for (int k = 0; k < a->n_kw; k++)
        if (name && !strcmp(a->kw[k], name))
            return a->kw_vals[k];
    (void)c;
    return dflt;
}

static void check_args(jctx *c, const args *a, int max_pos, const char *const *names)
{
    if (a->n_pos > max_pos)
        jn_fail(c, "%s takes at most %d positional argument(s)", a->what, max_pos);
    for (int k = 0; k < a->n_kw; k++) {
        bool ok = false;
        for (int i = 0; names && names[i] && !ok; i++)
            ok = !strcmp(names[i], a->kw[k]);
        if (!ok)
            jn_fail(c, "%s got an unexpected keyword argument '%s'", a->what, a->kw[k]);
    }
}

static const jstr *need_str(jctx *c, jv v, const char *what)
{
    if (v.kind != JV_STR)
        jn_fail(c, "%s needs a string, not %s", what, jv_type_name(v));
    return v.s;
}

static int64_t need_int(jctx *c, jv v, const char *what)
{
    if (v.kind == JV_INT)
        return v.i;
    if (v.kind == JV_BOOL)
        return v.b;
    jn_fail(c, "%s needs an integer, not %s", what, jv_type_name(v));
}

/* str(v), undefined as "" (Jinja's soft_str) */
static const jstr *soft_str(jctx *c, jv v)
{
    return jv_to_str(c, v);
}

/* ---- strings ---- */

static size_t cp_len_at(const jstr *s, size_t i)
{
    unsigned char ch = (unsigned char)s->p[i];
    size_t k = ch < 0x80 ? 1 : ch < 0xe0 ? 2 : ch < 0xf0 ? 3 : 4;
    return i + k <= s->len ? k : s->len - i;
}

static size_t prev_cp(const jstr *s, size_t end)
{
    size_t i = end - 1;
    while (i > 0 && ((unsigned char)s->p[i] & 0xc0) == 0x80)
        i--;
    return i;
}

/* Whether the code point at p (k bytes) is one of chars' (NULL: whitespace). */
static bool in_set(const jstr *chars, const char *p, size_t k)
{
    if (!chars) {
        size_t adv;
        return ju_isspace_at(p, k, &adv);
    }
    for (size_t i = 0; i < chars->len;) {
        size_t n = cp_len_at(chars, i);
        if (n == k && !memcmp(chars->p + i, p, k))
            return true;
        i += n;
    }
    return false;
}

static const jstr *strip(jctx *c, const jstr *s, const jstr *chars, bool left, bool right)
{
    size_t b = 0, e = s->len;
    while (left && b < e && in_set(chars, s->p + b, cp_len_at(s, b)))
        b += cp_len_at(s, b);
    while (right && e > b) {
        size_t p = prev_cp(s, e);
        if (!in_set(chars, s->p + p, e - p))
            break;
        e = p;
    }
    return js_sub(&c->arena, s, b, e - b);
}

static jv str_list(jctx *c, const jstr **parts, uint32_t n)
{
    jlist *l = jl_new(&c->arena, n);
    for (uint32_t i = 0; i < n; i++)
        ((jv *)l->items)[i] = jv_str(parts[i]);
    return jv_list(l);
}

/* Python's str.split and str.rsplit (sep NULL: runs of whitespace). */
static jv split(jctx *c, const jstr *s, const jstr *sep, int64_t maxsplit, bool from_right)
{
    if (sep && sep->len == 0)
        jn_fail(c, "empty separator");
    jn_cost(c, s->len / 16 + 1);
    uint32_t cap = 16, n = 0;
    const jstr **parts = jn_alloc(&c->arena, cap * sizeof(*parts));
    size_t b = 0, e = s->len;
    /* pieces are found from the chosen end, then put in order */
    for (;;) {
        if (n + 2 > cap) {
            const jstr **more = jn_alloc(&c->arena, cap * 2 * sizeof(*more));
            memcpy(more, parts, n * sizeof(*more));
            parts = more;
            cap *= 2;
        }
        if (!sep) { /* skip whitespace at the end we cut from */
            size_t adv;
            if (!from_right)
                while (b < e && ju_isspace_at(s->p + b, e - b, &adv))
                    b += adv;
            else
                while (e > b) {
                    size_t p = prev_cp(s, e);
                    if (!ju_isspace_at(s->p + p, e - p, &adv))
                        break;
                    e = p;
                }
            if (b >= e)
                break;
        }
        if (maxsplit >= 0 && (int64_t)n >= maxsplit) {
            parts[n++] = js_sub(&c->arena, s, b, e - b);
            break;
        }
        size_t at = 0, len = 0;
        bool found = false;
        if (sep) {
            const char *hit = NULL;
            if (!from_right)
                hit = memmem(s->p + b, e - b, sep->p, sep->len);
            else
                for (size_t i = e; i >= b + sep->len && !hit; i--)
                    if (!memcmp(s->p + i - sep->len, sep->p, sep->len))
                        hit = s->p + i - sep->len;
            if (hit) {
                at = (size_t)(hit - s->p);
                len = sep->len;
                found = true;
            }
        } else {
            size_t adv;
            if (!from_right) {
                for (size_t i = b; i < e && !found; i += cp_len_at(s, i))
                    if (ju_isspace_at(s->p + i, e - i, &adv)) {
                        at = i;
                        found = true;
                    }
                for (len = 0; found && at + len < e && ju_isspace_at(s->p + at + len, e - at - len, &adv);)
                    len += adv;
            } else {
                for (size_t i = e; i > b && !found;) {
                    size_t p = prev_cp(s, i);
                    if (ju_isspace_at(s->p + p, i - p, &adv)) {
                        size_t start = p;
                        while (start > b) {
                            size_t q = prev_cp(s, start);
                            if (!ju_isspace_at(s->p + q, start - q, &adv))
                                break;
                            start = q;
                        }
                        at = start;
                        len = i - start;
                        found = true;
                    }
                    i = p;
                }
            }
        }
        if (!found) {
            parts[n++] = js_sub(&c->arena, s, b, e - b);
            break;
        }
        if (!from_right) {
            parts[n++] = js_sub(&c->arena, s, b, at - b);
            b = at + len;
        } else {
            parts[n++] = js_sub(&c->arena, s, at + len, e - at - len);
            e = at;
        }
        if (sep && b == e && !from_right) {
            parts[n++] = js_sub(&c->arena, s, b, 0);
            break;
        }
        if (sep && b == e && from_right) {
            parts[n++] = js_sub(&c->arena, s, b, 0);
            break;
        }
    }
    if (from_right)
        for (uint32_t i = 0; i < n / 2; i++) {
            const jstr *t = parts[i];
            parts[i] = parts[n - 1 - i];
            parts[n - 1 - i] = t;
        }
    return str_list(c, parts, n);
}

static const jstr *replace(jctx *c, const jstr *s, const jstr *old, const jstr *new_, int64_t count)
{
    jbuf out = {0};
    size_t i = 0;
    int64_t done = 0;
    jn_cost(c, s->len / 16 + 1);
    if (old->len == 0) { /* Python inserts new before every character and at the end */
        for (; i <= s->len && (count < 0 || done < count); done++) {
            jb_addstr(c, &out, new_);
            if (i == s->len) {
                i++;
                break;
            }
            size_t k = cp_len_at(s, i);
            jb_addstr(c, &out, js_sub(&c->arena, s, i, k));
            i += k;
        }
        if (i < s->len)
            jb_addstr(c, &out, js_sub(&c->arena, s, i, s->len - i));
        return jb_finish(c, &out);
    }
    while (i < s->len && (count < 0 || done < count)) {
        const char *hit = memmem(s->p + i, s->len - i, old->p, old->len);
        if (!hit)
            break;
        size_t at = (size_t)(hit - s->p);
        jb_addstr(c, &out, js_sub(&c->arena, s, i, at - i));
        jb_addstr(c, &out, new_);
        i = at + old->len;
        done++;
    }
    jb_addstr(c, &out, js_sub(&c->arena, s, i, s->len - i));
    return jb_finish(c, &out);
}

typedef enum casing { CASE_UPPER, CASE_LOWER, CASE_TITLE, CASE_CAPITALIZE } casing;

static const jstr *recase(jctx *c, const jstr *s, casing how)
{
    char *p = jn_alloc(&c->arena, s->len + 1);
    bool word_start = true;
    for (size_t i = 0; i < s->len; i++) {
        char ch = s->p[i];
        bool lower = ch >= 'a' && ch <= 'z', upper = ch >= 'A' && ch <= 'Z';
        bool up = how == CASE_UPPER || ((how == CASE_TITLE && word_start) || (how == CASE_CAPITALIZE && i == 0));
        if (up && lower)
            ch = (char)(ch - 32);
        else if (!up && upper)
            ch = (char)(ch + 32);
        word_start = !(lower || upper || (ch & 0x80));
        p[i] = ch;
    }
    return js_taint_like(&c->arena, s, p, s->len);
}

static bool all_of(const jstr *s, int (*pred)(int), bool need_one)
{
    if (s->len == 0)
        return false;
    for (size_t i = 0; i < s->len; i++)
        if (!pred((unsigned char)s->p[i]))
            return false;
    (void)need_one;
    return true;
}

static int is_digit(int ch) { return ch >= '0' && ch <= '9'; }
static int is_alpha(int ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'); }
static int is_alnum(int ch) { return is_digit(ch) || is_alpha(ch); }
static int is_space(int ch) { return ch == ' ' || (ch >= '\t' && ch <= '\r') || (ch >= 0x1c && ch <= 0x1f); }

/* islower/isupper: some cased letter, none of the other case */
static bool cased(const jstr *s, bool want_lower)
{
    bool any = false;
    for (size_t i = 0; i < s->len; i++) {
        char ch = s->p[i];
        if (ch >= 'a' && ch <= 'z') {
            if (!want_lower)
                return false;
            any = true;
        } else if (ch >= 'A' && ch <= 'Z') {
            if (want_lower)
                return false;
            any = true;
        }
    }
    return any;
}

static int64_t find(const jstr *s, const jstr *sub, bool last)
{
    if (sub->len > s->len)
        return -1;
    const char *hit = NULL;
    if (!last)
        hit = memmem(s->p, s->len, sub->p, sub->len);
    else
        for (size_t i = s->len - sub->len + 1; i-- > 0 && !hit;)
            if (!memcmp(s->p + i, sub->p, sub->len))
                hit = s->p + i;
    if (!hit)
        return -1;
    /* a code point index */
    int64_t n = 0;
    for (const char *q = s->p; q < hit; q++)
        n += ((unsigned char)*q & 0xc0) != 0x80;
    return n;
}

static bool affix(jctx *c, const jstr *s, jv what, bool suffix)
{
    if (what.kind == JV_LIST && what.l->is_tuple) {
        for (uint32_t i = 0; i < what.l->n; i++)
            if (affix(c, s, what.l->items[i], suffix))
                return true;
        return false;
    }
    const jstr *a = need_str(c, what, suffix ? "endswith" : "startswith");
    if (a->len > s->len)
        return false;
    return !memcmp(s->p + (suffix ? s->len - a->len : 0), a->p, a->len);
}

static jv join(jctx *c, const jstr *sep, const jlist *items, const char *attribute)
{
    jbuf out = {0};
    jn_cost(c, items->n);
    for (uint32_t i = 0; i < items->n; i++) {
        if (i && sep)
            jb_addstr(c, &out, sep);
        jv v = items->items[i];
        if (attribute)
            v = jn_getitem(c, v, jv_strv(&c->arena, attribute, strlen(attribute)));
        jb_str(c, &out, v);
    }
    return jv_str(jb_finish(c, &out));
}

static jv splitlines(jctx *c, const jstr *s)
{
    uint32_t n = 0, cap = 8;
    const jstr **parts = jn_alloc(&c->arena, cap * sizeof(*parts));
    size_t b = 0;
    for (size_t i = 0; i < s->len; i++) {
        char ch = s->p[i];
        if (ch != '\n' && ch != '\r' && ch != '\v' && ch != '\f' && ch != 0x1c && ch != 0x1d && ch != 0x1e)
            continue;
        if (n + 1 >= cap) {
            const jstr **more = jn_alloc(&c->arena, cap * 2 * sizeof(*more));
            memcpy(more, parts, n * sizeof(*more));
            parts = more;
            cap *= 2;
        }
        parts[n++] = js_sub(&c->arena, s, b, i - b);
        if (ch == '\r' && i + 1 < s->len && s->p[i + 1] == '\n')
            i++;
        b = i + 1;
    }
    if (b < s->len) {
        if (n + 1 >= cap) {
            const jstr **more = jn_alloc(&c->arena, (cap + 1) * sizeof(*more));
            memcpy(more, parts, n * sizeof(*more));
            parts = more;
        }
        parts[n++] = js_sub(&c->arena, s, b, s->len - b);
    }
    return str_list(c, parts, n);
}

/* ---- methods ---- */

static const jstr *opt_str(jctx *c, jv v, const char *what)
{
    return v.kind == JV_NONE || v.kind == JV_UNDEF ? NULL : need_str(c, v, what);
}

static jv dict_pairs(jctx *c, const jdict *d, int which)
{
    jlist *l = jl_new(&c->arena, d->n);
    jn_cost(c, d->n);
    for (uint32_t i = 0; i < d->n; i++) {
        if (which == 0) {
            jlist *pair = jl_new(&c->arena, 2);
            pair->is_tuple = true;
            ((jv *)pair->items)[0] = d->keys[i];
            ((jv *)pair->items)[1] = d->vals[i];
            ((jv *)l->items)[i] = jv_list(pair);
        } else {
            ((jv *)l->items)[i] = which == 1 ? d->keys[i] : d->vals[i];
        }
    }
    return jv_list(l);
}

static jv str_method(jctx *c, int id, const jstr *s, const args *a)
{
    jv none = jv_none();
    switch (id) {
    case M_STRIP:
    case M_LSTRIP:
    case M_RSTRIP:
        check_args(c, a, 1, NULL);
        return jv_str(strip(c, s, opt_str(c, arg(c, a, 0, NULL, none), "strip"), id != M_RSTRIP, id != M_LSTRIP));
    case M_SPLIT:
    case M_RSPLIT: {
        static const char *const names[] = {"sep", "maxsplit", NULL};
        check_args(c, a, 2, names);
        const jstr *sep = opt_str(c, arg(c, a, 0, "sep", none), "split");
        int64_t max = need_int(c, arg(c, a, 1, "maxsplit", jv_int(-1)), "split");
        return split(c, s, sep, max, id == M_RSPLIT);
    }
    case M_STARTSWITH:
    case M_ENDSWITH:
        check_args(c, a, 1, NULL);
        return jv_bool(affix(c, s, arg(c, a, 0, NULL, none), id == M_ENDSWITH));
    case M_REPLACE: {
        check_args(c, a, 3, NULL);
        const jstr *old = need_str(c, arg(c, a, 0, NULL, none), "replace");
        const jstr *new_ = need_str(c, arg(c, a, 1, NULL, none), "replace");
        return jv_str(replace(c, s, old, new_, need_int(c, arg(c, a, 2, NULL, jv_int(-1)), "replace")));
    }
    case M_UPPER:
    case M_LOWER:
    case M_TITLE:
    case M_CAPITALIZE:
        check_args(c, a, 0, NULL);
        return jv_str(recase(c, s, id == M_UPPER ? CASE_UPPER : id == M_LOWER ? CASE_LOWER
                                               : id == M_TITLE ? CASE_TITLE : CASE_CAPITALIZE));
    case M_FIND:
    case M_RFIND:
        check_args(c, a, 1, NULL);
        return jv_int(find(s, need_str(c, arg(c, a, 0, NULL, none), "find"), id == M_RFIND));
    case M_COUNT: {
        check_args(c, a, 1, NULL);
        const jstr *sub = need_str(c, arg(c, a, 0, NULL, none), "count");
        if (sub->len == 0)
            return jv_int((int64_t)ju_len(s) + 1);
        int64_t n = 0;
        for (const char *p = s->p, *end = s->p + s->len; (p = memmem(p, (size_t)(end - p), sub->p, sub->len));
             p += sub->len)
            n++;
        return jv_int(n);
    }
    case M_JOIN:
        check_args(c, a, 1, NULL);
        return join(c, s, jn_iterate(c, arg(c, a, 0, NULL, none)), NULL);
    case M_SPLITLINES:
        check_args(c, a, 0, NULL);
        return splitlines(c, s);
    case M_ISDIGIT:
        return jv_bool(all_of(s, is_digit, true));
    case M_ISALPHA:
        return jv_bool(all_of(s, is_alpha, true));
    case M_ISALNUM:
        return jv_bool(all_of(s, is_alnum, true));
    case M_ISSPACE:
        return jv_bool(all_of(s, is_space, true));
    case M_ISLOWER:
    case M_ISUPPER:
        return jv_bool(cased(s, id == M_ISLOWER));
    default:
        jn_fail(c, "no such str method");
    }
}

jv jn_call_method(jctx *c, const jmethod *m, const jv *pos, int n_pos, const char **kw, const jv *kw_vals, int n_kw)
{
    args a = {pos, n_pos, kw, kw_vals, n_kw, k_methods[m->id]};
    jv self = m->self;
    jn_cost(c, 1);
    if (self.kind == JV_STR)
        return str_method(c, m->id, self.s, &a);
    switch (m->id) {
    case M_ITEMS:
    case M_KEYS:
    case M_VALUES:
        check_args(c, &a, 0, NULL);
        return dict_pairs(c, self.d, m->id == M_ITEMS ? 0 : m->id == M_KEYS ? 1 : 2);
    case M_GET: {
        check_args(c, &a, 2, NULL);
        jv v;
        if (n_pos < 1)
            jn_fail(c, "get expected at least 1 argument");
        return jd_get(self.d, pos[0], &v) ? v : arg(c, &a, 1, NULL, jv_none());
    }
    case M_INDEX:
    case M_LCOUNT: {
        check_args(c, &a, 1, NULL);
        jv x = arg(c, &a, 0, NULL, jv_undef(NULL));
        int64_t n = 0;
        jn_cost(c, self.l->n);
        for (uint32_t i = 0; i < self.l->n; i++)
            if (jv_equal(self.l->items[i], x)) {
                if (m->id == M_INDEX)
                    return jv_int(i);
                n++;
            }
        if (m->id == M_INDEX)
            jn_fail(c, "the value is not in the list");
        return jv_int(n);
    }
    case M_CYCLE:
        if (n_pos == 0)
            jn_fail(c, "no items for cycling given");
        return pos[self.loop->i % (uint32_t)n_pos];
    default:
        jn_fail(c, "no such method");
    }
}

/* ---- tests ---- */

static bool same(jv a, jv b)
{
    if (a.kind != b.kind)
        return false;
    switch (a.kind) {
    case JV_UNDEF:
    case JV_NONE:
        return true;
    case JV_BOOL:
        return a.b == b.b;
    case JV_INT:
        return a.i == b.i;
    case JV_FLOAT:
        return a.f == b.f;
    case JV_STR:
        return a.s == b.s;
    case JV_LIST:
        return a.l == b.l;
    default:
        return a.d == b.d;
    }
}

bool jn_call_test(jctx *c, int id, jv v, const jv *a, int n)
{
    jv x = n > 0 ? a[0] : jv_undef(NULL);
    if (n > 1)
        jn_fail(c, "the test '%s' takes at most one argument", k_tests[id]);
    switch (id) {
    case T_BOOLEAN: return v.kind == JV_BOOL;
    case T_CALLABLE: return v.kind == JV_MACRO || v.kind == JV_FUNC || v.kind == JV_METHOD;
    case T_DEFINED: return v.kind != JV_UNDEF;
    case T_UNDEFINED: return v.kind == JV_UNDEF;
    case T_NONE: return v.kind == JV_NONE;
    case T_TRUE: return v.kind == JV_BOOL && v.b;
    case T_FALSE: return v.kind == JV_BOOL && !v.b;
    case T_INTEGER: return v.kind == JV_INT;
    case T_FLOAT: return v.kind == JV_FLOAT;
    case T_NUMBER: return v.kind == JV_INT || v.kind == JV_FLOAT || v.kind == JV_BOOL;
    case T_STRING: return v.kind == JV_STR;
    case T_MAPPING: return v.kind == JV_DICT;
    case T_ITERABLE:
        return v.kind == JV_STR || v.kind == JV_LIST || v.kind == JV_DICT || v.kind == JV_UNDEF || v.kind == JV_LOOP;
    case T_SEQUENCE: return v.kind == JV_STR || v.kind == JV_LIST || v.kind == JV_DICT;
    case T_ESCAPED: return false;
    case T_SAMEAS: return same(v, x);
    case T_EQ: case T_EQUALTO: case T_EQ_OP: return jv_equal(v, x);
    case T_NE: case T_NE_OP: return !jv_equal(v, x);
    case T_LT: case T_LT_OP: case T_LESSTHAN: return jv_compare(c, v, x) < 0;
    case T_LE: case T_LE_OP: return jv_compare(c, v, x) <= 0;
    case T_GT: case T_GT_OP: case T_GREATERTHAN: return jv_compare(c, v, x) > 0;
    case T_GE: case T_GE_OP: return jv_compare(c, v, x) >= 0;
    case T_IN: {
        if (x.kind == JV_STR) {
            const jstr *s = need_str(c, v, "in");
            return s->len == 0 || memmem(x.s->p, x.s->len, s->p, s->len);
        }
        const jlist *l = jn_iterate(c, x);
        for (uint32_t i = 0; i < l->n; i++)
            if (jv_equal(v, l->items[i]))
                return true;
        return false;
    }
    case T_ODD:
    case T_EVEN: {
        int64_t i = need_int(c, v, k_tests[id]);
        return (i % 2 != 0) == (id == T_ODD);
    }
    case T_DIVISIBLEBY: {
        int64_t d = need_int(c, x, "divisibleby");
        if (d == 0)
            jn_fail(c, "integer division or modulo by zero");
        return need_int(c, v, "divisibleby") % d == 0;
    }
    case T_LOWER:
    case T_UPPER:
        return v.kind == JV_STR && cased(v.s, id == T_LOWER);
    case T_FILTER:
    case T_TEST: {
        const jstr *s = need_str(c, v, k_tests[id]);
        char *name = jn_strdup(&c->arena, s->p, s->len);
        return id == T_FILTER ? jn_filter_id(name) >= 0 : jn_test_id(name) >= 0;
    }
    default:
        jn_fail(c, "no such test");
    }
}

/* ---- filters ---- */

static jv list_of(jctx *c, const jv *items, uint32_t n)
{
    jlist *l = jl_new(&c->arena, n);
    if (n)
        memcpy((jv *)l->items, items, n * sizeof(jv));
    return jv_list(l);
}

/* An item's attribute by a dotted path ("a.b", "0"), as Jinja's
 * make_attrgetter reads it: item lookup first. */
static jv attr_path(jctx *c, jv v, const jstr *path)
{
    size_t b = 0;
    for (size_t i = 0; i <= path->len; i++) {
        if (i < path->len && path->p[i] != '.')
            continue;
        const char *part = path->p + b;
        size_t len = i - b;
        bool digits = len > 0 && len < 18;
        for (size_t k = 0; k < len && digits; k++)
            digits = part[k] >= '0' && part[k] <= '9';
        jv key = digits ? jv_int(strtoll(jn_strdup(&c->arena, part, len), NULL, 10)) : jv_strv(&c->arena, part, len);
        v = jn_getitem(c, v, key);
        b = i + 1;
    }
    return v;
}

/* select, reject, selectattr, rejectattr */
static jv select_items(jctx *c, jv seq, const args *a, bool by_attr, bool keep)
{
    const jlist *l = jn_iterate(c, seq);
    int at = 0;
    const jstr *path = NULL;
    if (by_attr) {
        path = need_str(c, arg(c, a, 0, NULL, jv_undef(NULL)), a->what);
        at = 1;
    }
    int test = -1;
    if (a->n_pos > at) {
        const jstr *name = need_str(c, a->pos[at], a->what);
        test = jn_test_id(jn_strdup(&c->arena, name->p, name->len));
        if (test < 0)
            jn_fail(c, "no test named '%.*s'", (int)name->len, name->p);
    }
    jv *keepv = jn_alloc(&c->arena, (l->n ? l->n : 1) * sizeof(jv));
    uint32_t n = 0;
    jn_cost(c, l->n);
    for (uint32_t i = 0; i < l->n; i++) {
        jv v = path ? attr_path(c, l->items[i], path) : l->items[i];
        bool ok = test < 0 ? jv_truthy(v) : jn_call_test(c, test, v, a->pos + at + 1, a->n_pos - at - 1);
        if (ok == keep)
            keepv[n++] = l->items[i];
    }
    return list_of(c, keepv, n);
}

static jv map_items(jctx *c, jv seq, const args *a)
{
    const jlist *l = jn_iterate(c, seq);
    jv *out = jn_alloc(&c->arena, (l->n ? l->n : 1) * sizeof(jv));
    jv attribute = arg(c, a, -1, "attribute", jv_undef(NULL));
    jv dflt = arg(c, a, -1, "default", jv_undef(NULL));
    jn_cost(c, l->n);
    if (attribute.kind != JV_UNDEF) {
        const jstr *path = need_str(c, attribute, "map");
        for (uint32_t i = 0; i < l->n; i++) {
            jv v = attr_path(c, l->items[i], path);
            out[i] = v.kind == JV_UNDEF && dflt.kind != JV_UNDEF ? dflt : v;
        }
        return list_of(c, out, l->n);
    }
    const jstr *name = need_str(c, arg(c, a, 0, NULL, jv_undef(NULL)), "map");
    int f = jn_filter_id(jn_strdup(&c->arena, name->p, name->len));
    if (f < 0)
        jn_fail(c, "no filter named '%.*s'", (int)name->len, name->p);
    for (uint32_t i = 0; i < l->n; i++)
        out[i] = jn_call_filter(c, f, l->items[i], a->pos + 1, a->n_pos - 1, a->kw, a->kw_vals, a->n_kw);
    return list_of(c, out, l->n);
}

static jv length(jctx *c, jv v)
{
    switch (v.kind) {
    case JV_UNDEF: return jv_int(0);
    case JV_STR: return jv_int((int64_t)ju_len(v.s));
    case JV_LIST: return jv_int(v.l->n);
    case JV_DICT: case JV_NS: return jv_int(v.d->n);
    default: jn_fail(c, "object of type '%s' has no len()", jv_type_name(v));
    }
}

static jv tojson(jctx *c, jv v, const args *a)
{
    static const char *const names[] = {"ensure_ascii", "indent", "separators", "sort_keys", NULL};
    check_args(c, a, 4, names);
    if (jv_truthy(arg(c, a, 0, "ensure_ascii", jv_bool(false))))
        jn_fail(c, "tojson: ensure_ascii is not supported");
    jv ind = arg(c, a, 1, "indent", jv_none());
    int indent = -1;
    if (ind.kind == JV_INT || ind.kind == JV_BOOL) {
        int64_t i = need_int(c, ind, "tojson indent");
        indent = i < 0 ? 0 : i > 64 ? 64 : (int)i;
    } else if (ind.kind == JV_STR) {
        jn_fail(c, "tojson: a string indent is not supported");
    }
    const char *item_sep = NULL, *key_sep = NULL;
    jv seps = arg(c, a, 2, "separators", jv_none());
    if (seps.kind == JV_LIST && seps.l->n == 2) {
        const jstr *s1 = need_str(c, seps.l->items[0], "separators"), *s2 = need_str(c, seps.l->items[1], "separators");
        item_sep = jn_strdup(&c->arena, s1->p, s1->len);
        key_sep = jn_strdup(&c->arena, s2->p, s2->len);
    } else if (seps.kind != JV_NONE) {
        jn_fail(c, "tojson: separators must be a pair of strings");
    }
    jbuf out = {0};
    jb_json(c, &out, v, indent, item_sep, key_sep, jv_truthy(arg(c, a, 3, "sort_keys", jv_bool(false))));
    return jv_str(jb_finish(c, &out));
}

static jv to_int(jctx *c, jv v, jv dflt)
{
    switch (v.kind) {
    case JV_INT: return v;
    case JV_BOOL: return jv_int(v.b);
    case JV_FLOAT:
        if (!isfinite(v.f) || fabs(v.f) >= 9.2e18)
            return dflt;
        return jv_int((int64_t)v.f);
    case JV_STR: {
        char *s = jn_strdup(&c->arena, v.s->p, v.s->len), *end;
        errno = 0;
        long long i = strtoll(s, &end, 10);
        while (*end == ' ' || *end == '\n' || *end == '\t')
            end++;
        if (!errno && end != s && !*end)
            return jv_int(i);
        double f = strtod(s, &end);
        while (*end == ' ' || *end == '\n' || *end == '\t')
            end++;
        if (end != s && !*end && isfinite(f) && fabs(f) < 9.2e18)
            return jv_int((int64_t)f);
        return dflt;
    }
    default: return dflt;
    }
}

static jv to_float(jctx *c, jv v, jv dflt)
{
    switch (v.kind) {
    case JV_INT: return jv_float((double)v.i);
    case JV_BOOL: return jv_float(v.b);
    case JV_FLOAT: return v;
    case JV_STR: {
        char *s = jn_strdup(&c->arena, v.s->p, v.s->len), *end;
        double f = strtod(s, &end);
        while (*end == ' ' || *end == '\n' || *end == '\t')
            end++;
        return end != s && !*end ? jv_float(f) : dflt;
    }
    default: return dflt;
    }
}

static const jstr *escape_html(jctx *c, const jstr *s)
{
    jbuf out = {0};
    for (size_t i = 0; i < s->len; i++) {
        switch (s->p[i]) {
        case '&': jb_addc(c, &out, "&amp;"); break;
        case '<': jb_addc(c, &out, "&lt;"); break;
        case '>': jb_addc(c, &out, "&gt;"); break;
        case '"': jb_addc(c, &out, "&#34;"); break;
        case '\'': jb_addc(c, &out, "&#39;"); break;
        default: jb_add(c, &out, s->p + i, 1);
        }
    }
    return js_taint_like(&c->arena, s, out.p ? out.p : "", out.len);
}

static const jstr *indent(jctx *c, const jstr *s, const args *a)
{
    static const char *const names[] = {"width", "first", "blank", NULL};
    check_args(c, a, 3, names);
    jv w = arg(c, a, 0, "width", jv_int(4));
    const jstr *pad;
    if (w.kind == JV_STR) {
        pad = w.s;
    } else {
        int64_t n = need_int(c, w, "indent");
        n = n < 0 ? 0 : n > 256 ? 256 : n;
        char sp[257];
        memset(sp, ' ', (size_t)n);
        pad = js_new(&c->arena, sp, (size_t)n, false);
    }
    bool first = jv_truthy(arg(c, a, 1, "first", jv_bool(false))), blank = jv_truthy(arg(c, a, 2, "blank", jv_bool(false)));
    jbuf out = {0};
    size_t b = 0;
    bool line0 = true;
    for (size_t i = 0; i <= s->len; i++) {
        if (i < s->len && s->p[i] != '\n')
            continue;
        size_t len = i - b;
        bool indent_it = line0 ? first : (blank || len > 0);
        if (indent_it && !(line0 && len == 0 && i == s->len && !first))
            jb_addstr(c, &out, pad);
        jb_addstr(c, &out, js_sub(&c->arena, s, b, len));
        if (i < s->len)
            jb_addc(c, &out, "\n");
        b = i + 1;
        line0 = false;
    }
    return jb_finish(c, &out);
}

/* sort, dictsort, unique, min, max: an insertion sort, charged for its work */
static void sort_values(jctx *c, jv *v, uint32_t n, const jv *keys, bool reverse)
{
    uint32_t *idx = jn_alloc(&c->arena, (n ? n : 1) * sizeof(*idx));
    jv *tmp = jn_alloc(&c->arena, (n ? n : 1) * sizeof(jv));
    for (uint32_t i = 0; i < n; i++)
        idx[i] = i;
    for (uint32_t i = 1; i < n; i++) {
        jn_cost(c, i);
        for (uint32_t j = i; j > 0; j--) {
            int r = jv_compare(c, keys[idx[j]], keys[idx[j - 1]]);
            if (reverse ? r <= 0 : r >= 0)
                break;
            uint32_t t = idx[j];
            idx[j] = idx[j - 1];
            idx[j - 1] = t;
        }
    }
    for (uint32_t i = 0; i < n; i++)
        tmp[i] = v[idx[i]];
    memcpy(v, tmp, n * sizeof(jv));
}

static jv sort_key(jctx *c, jv v, bool case_sensitive, const jstr *attribute)
{
    if (attribute)
        v = attr_path(c, v, attribute);
    if (!case_sensitive && v.kind == JV_STR)
        return jv_str(recase(c, v.s, CASE_LOWER));
    return v;
}

static jv sort_filter(jctx *c, jv seq, const args *a)
{
    static const char *const names[] = {"reverse", "case_sensitive", "attribute", NULL};
    check_args(c, a, 3, names);
    bool reverse = jv_truthy(arg(c, a, 0, "reverse", jv_bool(false)));
    bool cs = jv_truthy(arg(c, a, 1, "case_sensitive", jv_bool(false)));
    jv attr = arg(c, a, 2, "attribute", jv_none());
    const jstr *path = attr.kind == JV_STR ? attr.s : NULL;
    const jlist *l = jn_iterate(c, seq);
    jv *items = jn_alloc(&c->arena, (l->n ? l->n : 1) * sizeof(jv)), *keys = jn_alloc(&c->arena, (l->n ? l->n : 1) * sizeof(jv));
    for (uint32_t i = 0; i < l->n; i++) {
        items[i] = l->items[i];
        keys[i] = sort_key(c, l->items[i], cs, path);
    }
    sort_values(c, items, l->n, keys, reverse);
    return list_of(c, items, l->n);
}

static jv dictsort(jctx *c, jv v, const args *a)
{
    static const char *const names[] = {"case_sensitive", "by", "reverse", NULL};
    check_args(c, a, 3, names);
    if (v.kind != JV_DICT)
        jn_fail(c, "dictsort needs a mapping, not %s", jv_type_name(v));
    bool cs = jv_truthy(arg(c, a, 0, "case_sensitive", jv_bool(false)));
    jv by = arg(c, a, 1, "by", jv_undef(NULL));
    bool by_value = by.kind == JV_STR && by.s->len == 5 && !memcmp(by.s->p, "value", 5);
    jv pairs = dict_pairs(c, v.d, 0);
    uint32_t n = pairs.l->n;
    jv *items = (jv *)pairs.l->items, *keys = jn_alloc(&c->arena, (n ? n : 1) * sizeof(jv));
    for (uint32_t i = 0; i < n; i++)
        keys[i] = sort_key(c, items[i].l->items[by_value ? 1 : 0], cs, NULL);
    sort_values(c, items, n, keys, jv_truthy(arg(c, a, 2, "reverse", jv_bool(false))));
    return pairs;
}

static jv unique(jctx *c, jv seq)
{
    const jlist *l = jn_iterate(c, seq);
    jv *out = jn_alloc(&c->arena, (l->n ? l->n : 1) * sizeof(jv));
    uint32_t n = 0;
    jn_cost(c, (uint64_t)l->n * l->n / 8 + 1);
    for (uint32_t i = 0; i < l->n; i++) {
        jv k = sort_key(c, l->items[i], false, NULL);
        bool seen = false;
        for (uint32_t j = 0; j < n && !seen; j++)
            seen = jv_equal(sort_key(c, out[j], false, NULL), k);
        if (!seen)
            out[n++] = l->items[i];
    }
    return list_of(c, out, n);
}

static jv reverse(jctx *c, jv v)
{
    if (v.kind == JV_STR) {
        jbuf out = {0};
        for (size_t e = v.s->len; e > 0;) {
            size_t p = prev_cp(v.s, e);
            jb_addstr(c, &out, js_sub(&c->arena, v.s, p, e - p));
            e = p;
        }
        return jv_str(jb_finish(c, &out));
    }
    const jlist *l = jn_iterate(c, v);
    jlist *r = jl_new(&c->arena, l->n);
    for (uint32_t i = 0; i < l->n; i++)
        ((jv *)r->items)[i] = l->items[l->n - 1 - i];
    return jv_list(r);
}

static jv min_max(jctx *c, jv seq, bool want_max)
{
    const jlist *l = jn_iterate(c, seq);
    if (l->n == 0)
        return jv_undef("the sequence is empty");
    jv best = l->items[0];
    for (uint32_t i = 1; i < l->n; i++) {
        int r = jv_compare(c, sort_key(c, l->items[i], false, NULL), sort_key(c, best, false, NULL));
        if (want_max ? r > 0 : r < 0)
            best = l->items[i];
    }
    return best;
}

static jv sum(jctx *c, jv seq, const args *a)
{
    const jlist *l = jn_iterate(c, seq);
    jv attr = arg(c, a, -1, "attribute", jv_none());
    jv total = arg(c, a, 1, "start", jv_int(0));
    for (uint32_t i = 0; i < l->n; i++) {
        jv v = attr.kind == JV_STR ? attr_path(c, l->items[i], attr.s) : l->items[i];
        if ((total.kind != JV_INT && total.kind != JV_FLOAT) || (v.kind != JV_INT && v.kind != JV_FLOAT && v.kind != JV_BOOL))
            jn_fail(c, "sum needs numbers");
        if (total.kind == JV_FLOAT || v.kind == JV_FLOAT)
            total = jv_float((total.kind == JV_FLOAT ? total.f : (double)total.i) +
                             (v.kind == JV_FLOAT ? v.f : (double)(v.kind == JV_BOOL ? v.b : v.i)));
        else if (__builtin_add_overflow(total.i, v.kind == JV_BOOL ? v.b : v.i, &total.i))
            jn_fail(c, "an integer overflowed 64 bits");
    }
    return total;
}

static jv first_last(jctx *c, jv v, bool last)
{
    const jlist *l = jn_iterate(c, v);
    if (l->n == 0)
        return jv_undef("the sequence is empty");
    return l->items[last ? l->n - 1 : 0];
}

static jv filter_str_ops(jctx *c, int id, jv v, const args *a)
{
    const jstr *s = soft_str(c, v);
    switch (id) {
    case F_TRIM:
        check_args(c, a, 1, NULL);
        return jv_str(strip(c, s, opt_str(c, arg(c, a, 0, "chars", jv_none()), "trim"), true, true));
    case F_UPPER: return jv_str(recase(c, s, CASE_UPPER));
    case F_LOWER: return jv_str(recase(c, s, CASE_LOWER));
    case F_TITLE: return jv_str(recase(c, s, CASE_TITLE));
    case F_CAPITALIZE: {
        const jstr *low = recase(c, s, CASE_LOWER);
        return jv_str(recase(c, low, CASE_CAPITALIZE));
    }
    case F_REPLACE: {
        check_args(c, a, 3, NULL);
        const jstr *old = soft_str(c, arg(c, a, 0, "old", jv_undef(NULL)));
        const jstr *new_ = soft_str(c, arg(c, a, 1, "new", jv_undef(NULL)));
        jv count = arg(c, a, 2, "count", jv_none());
        return jv_str(replace(c, s, old, new_, count.kind == JV_NONE ? -1 : need_int(c, count, "replace")));
    }
    case F_E:
    case F_ESCAPE:
        return jv_str(escape_html(c, s));
    case F_INDENT:
        return jv_str(indent(c, s, a));
    default:
        return jv_str(s);
    }
}

jv jn_call_filter(jctx *c, int id, jv v, const jv *pos, int n_pos, const char **kw, const jv *kw_vals, int n_kw)
{
    args a = {pos, n_pos, kw, kw_vals, n_kw, k_filters[id]};
    jn_cost(c, 1);
    switch (id) {
    case F_ABS:
        if (v.kind == JV_INT)
            return jv_int(v.i < 0 ? (v.i == INT64_MIN ? v.i : -v.i) : v.i);
        if (v.kind == JV_FLOAT)
            return jv_float(fabs(v.f));
        if (v.kind == JV_BOOL)
            return jv_int(v.b);
        jn_fail(c, "bad operand type for abs(): '%s'", jv_type_name(v));
    case F_COUNT:
    case F_LENGTH:
        return length(c, v);
    case F_DEFAULT:
    case F_D: {
        static const char *const names[] = {"default_value", "boolean", NULL};
        check_args(c, &a, 2, names);
        jv dflt = arg(c, &a, 0, "default_value", jv_str(js_lit(&c->arena, "")));
        bool boolean = jv_truthy(arg(c, &a, 1, "boolean", jv_bool(false)));
        return v.kind == JV_UNDEF || (boolean && !jv_truthy(v)) ? dflt : v;
    }
    case F_DICTSORT: return dictsort(c, v, &a);
    case F_FIRST: return first_last(c, v, false);
    case F_LAST: return first_last(c, v, true);
    case F_FLOAT: return to_float(c, v, arg(c, &a, 0, "default", jv_float(0.0)));
    case F_INT: return to_int(c, v, arg(c, &a, 0, "default", jv_int(0)));
    case F_ITEMS:
        if (v.kind == JV_UNDEF)
            return jv_list(jl_new(&c->arena, 0));
        if (v.kind != JV_DICT)
            jn_fail(c, "Can only get item pairs from a mapping.");
        return dict_pairs(c, v.d, 0);
    case F_JOIN: {
        static const char *const names[] = {"d", "attribute", NULL};
        check_args(c, &a, 2, names);
        const jstr *sep = soft_str(c, arg(c, &a, 0, "d", jv_str(js_lit(&c->arena, ""))));
        jv attr = arg(c, &a, 1, "attribute", jv_none());
        const char *path = attr.kind == JV_STR ? jn_strdup(&c->arena, attr.s->p, attr.s->len) : NULL;
        return join(c, sep, jn_iterate(c, v), path);
    }
    case F_LIST: {
        const jlist *l = jn_iterate(c, v);
        return list_of(c, l->items, l->n);
    }
    case F_MAP: return map_items(c, v, &a);
    case F_MAX: return min_max(c, v, true);
    case F_MIN: return min_max(c, v, false);
    case F_SELECT: return select_items(c, v, &a, false, true);
    case F_REJECT: return select_items(c, v, &a, false, false);
    case F_SELECTATTR: return select_items(c, v, &a, true, true);
    case F_REJECTATTR: return select_items(c, v, &a, true, false);
    case F_REVERSE: return reverse(c, v);
    case F_ROUND: {
        jv f = to_float(c, v, jv_float(0));
        int64_t prec = need_int(c, arg(c, &a, 0, "precision", jv_int(0)), "round");
        double m = pow(10.0, (double)(prec < 0 ? 0 : prec > 15 ? 15 : prec));
        return jv_float(nearbyint(f.f * m) / m);
    }
    case F_SAFE: return v;
    case F_SORT: return sort_filter(c, v, &a);
    case F_STRING: return jv_str(soft_str(c, v));
    case F_SUM: return sum(c, v, &a);
    case F_TOJSON: return tojson(c, v, &a);
    case F_UNIQUE: return unique(c, v);
    default:
        return filter_str_ops(c, id, v, &a);
    }
}

/* ---- global functions ---- */

static jv range(jctx *c, const args *a)
{
    check_args(c, a, 3, NULL);
    if (a->n_pos == 0)
        jn_fail(c, "range expected at least 1 argument");
    int64_t start = 0, stop, step = 1;
    if (a->n_pos == 1) {
        stop = need_int(c, a->pos[0], "range");
    } else {
        start = need_int(c, a->pos[0], "range");
        stop = need_int(c, a->pos[1], "range");
        if (a->n_pos == 3)
            step = need_int(c, a->pos[2], "range");
    }
    if (step == 0)
        jn_fail(c, "range() arg 3 must not be zero");
    double count = step > 0 ? ((double)stop - (double)start) / (double)step : ((double)start - (double)stop) / (double)-step;
    count = count <= 0 ? 0 : ceil(count);
    if (count > 100000) /* Jinja's sandbox: MAX_RANGE */
        jn_fail(c, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    jlist *l = jl_new(&c->arena, (uint32_t)count);
    jn_cost(c, (uint64_t)count);
    for (uint32_t i = 0; i < l->n; i++)
        ((jv *)l->items)[i] = jv_int(start + (int64_t)i * step);
    return jv_list(l);
}

static jv strftime_now(jctx *c, const args *a)
{
    check_args(c, a, 1, NULL);
    const jstr *fmt = need_str(c, arg(c, a, 0, NULL, jv_undef(NULL)), "strftime_now");
    char *f = jn_strdup(&c->arena, fmt->p, fmt->len > 256 ? 256 : fmt->len);
    struct tm tm;
    if (!localtime_r(&c->now, &tm))
        jn_fail(c, "strftime_now: the time is out of range");
    char out[512];
    size_t n = strftime(out, sizeof(out), f, &tm);
    return jv_strv(&c->arena, out, n);
}

jv jn_call_func(jctx *c, int id, const jv *pos, int n_pos, const char **kw, const jv *kw_vals, int n_kw)
{
    args a = {pos, n_pos, kw, kw_vals, n_kw, k_funcs[id]};
    jn_cost(c, 1);
    switch (id) {
    case G_RANGE:
        return range(c, &a);
    case G_NAMESPACE:
    case G_DICT: {
        jdict *d = jd_new(&c->arena);
        if (n_pos > 1)
            jn_fail(c, "%s takes at most one positional argument", k_funcs[id]);
        if (n_pos == 1) {
            if (pos[0].kind != JV_DICT)
                jn_fail(c, "%s's argument must be a mapping", k_funcs[id]);
            for (uint32_t i = 0; i < pos[0].d->n; i++)
                jd_set(&c->arena, d, pos[0].d->keys[i], pos[0].d->vals[i]);
        }
        for (int k = 0; k < n_kw; k++)
            jd_set(&c->arena, d, jv_str(js_lit(&c->arena, kw[k])), kw_vals[k]);
        return (jv){.kind = id == G_NAMESPACE ? JV_NS : JV_DICT, .d = d};
    }
    case G_RAISE: {
        const jstr *msg = soft_str(c, arg(c, &a, 0, NULL, jv_undef(NULL)));
        jn_fail_raw(c, -EINVAL, jn_strdup(&c->arena, msg->p, msg->len));
    }
    case G_STRFTIME:
        return strftime_now(c, &a);
    default:
        jn_fail(c, "no such function");
    }
}
