/* The Jinja evaluator: runs a parsed template over its input (see
 * jinja.h) with Jinja2's semantics: scopes (a for loop's iterations and a
 * macro's call each get a fresh frame; if blocks do not; a macro sees the
 * frame it was defined in, as it is when called), Python's operators and
 * Jinja's undefined (printable, false and empty, but an error to look
 * into), attribute and item access that fall back on each other. */
#define _GNU_SOURCE /* memmem */
#include "runtime/jinja/internal.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- failing and bounds ---- */

_Noreturn void jn_fail(jctx *c, const char *fmt, ...)
{
    int n = snprintf(c->err, c->err_len, "template line %d: ", c->line);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < c->err_len)
        vsnprintf(c->err + n, c->err_len - (size_t)n, fmt, ap);
    va_end(ap);
    c->rc = -EINVAL;
    longjmp(c->fail, 1);
}

_Noreturn void jn_fail_raw(jctx *c, int rc, const char *msg)
{
    snprintf(c->err, c->err_len, "%s", msg);
    c->rc = rc;
    longjmp(c->fail, 1);
}

void jn_cost(jctx *c, uint64_t n)
{
    c->steps += n;
    if (c->steps > c->lim.max_steps)
        jn_fail_raw(c, -E2BIG, "the template took more steps than a render may (a loop too long?)");
}

static void enter(jctx *c)
{
    if (++c->depth > c->lim.max_depth)
        jn_fail_raw(c, -E2BIG, "the template nested deeper than a render may (recursion?)");
}

/* ---- frames ---- */

static jframe *frame_new(jctx *c, jframe *parent)
{
    jframe *f = jn_alloc(&c->arena, sizeof(*f));
    f->parent = parent;
    return f;
}

static void frame_set(jctx *c, jframe *f, const char *name, jv v)
{
    for (uint32_t i = 0; i < f->n; i++)
        if (!strcmp(f->names[i], name)) {
            f->vals[i] = v;
            return;
        }
    if (f->n == f->cap) {
        uint32_t cap = f->cap ? f->cap * 2 : 8;
        const char **names = jn_alloc(&c->arena, cap * sizeof(char *));
        jv *vals = jn_alloc(&c->arena, cap * sizeof(jv));
        if (f->n) {
            memcpy(names, f->names, f->n * sizeof(char *));
            memcpy(vals, f->vals, f->n * sizeof(jv));
        }
        f->names = names;
        f->vals = vals;
        f->cap = cap;
    }
    f->names[f->n] = name;
    f->vals[f->n++] = v;
}

static char *undef_msg(jctx *c, const char *fmt, const char *a, const char *b)
{
    size_t n = strlen(fmt) + strlen(a) + (b ? strlen(b) : 0) + 1;
    char *s = jn_alloc(&c->arena, n);
    snprintf(s, n, fmt, a, b);
    return s;
}

static jv lookup(jctx *c, jframe *f, const char *name)
{
    for (; f; f = f->parent)
        for (uint32_t i = 0; i < f->n; i++)
            if (!strcmp(f->names[i], name))
                return f->vals[i];
    jv v;
    size_t len = strlen(name);
    if (jd_get_str(c->trusted_vars, name, len, &v) || jd_get_str(c->plain_vars, name, len, &v))
        return v;
    int id = jn_func_id(name);
    if (id >= 0)
        return jv_func(id);
    return jv_undef(undef_msg(c, "'%s' is undefined", name, NULL));
}

/* ---- access ---- */

static _Noreturn void fail_undefined(jctx *c, jv v)
{
    jn_fail(c, "%s", v.undef_name ? v.undef_name : "a value is undefined");
}

static const char *object_name(jv v)
{
    switch (v.kind) {
    case JV_DICT: return "dict object";
    case JV_LIST: return v.l->is_tuple ? "tuple object" : "list object";
    case JV_STR: return "str object";
    case JV_NONE: return "None";
    case JV_INT: return "int object";
    case JV_FLOAT: return "float object";
    case JV_BOOL: return "bool object";
    default: return "object";
    }
}

static jv no_attr(jctx *c, jv obj, const char *name)
{
    return jv_undef(undef_msg(c, "'%s' has no attribute '%s'", object_name(obj), name));
}

static jv method(jctx *c, jv self, int id)
{
    jmethod *m = jn_alloc(&c->arena, sizeof(*m));
    m->self = self;
    m->id = id;
    return (jv){.kind = JV_METHOD, .method = m};
}

static jv loop_attr(jctx *c, jloop *l, const char *name)
{
    int64_t i = l->i, n = l->items->n;
    if (!strcmp(name, "index"))
        return jv_int(i + 1);
    if (!strcmp(name, "index0"))
        return jv_int(i);
    if (!strcmp(name, "revindex"))
        return jv_int(n - i);
    if (!strcmp(name, "revindex0"))
        return jv_int(n - i - 1);
    if (!strcmp(name, "first"))
        return jv_bool(i == 0);
    if (!strcmp(name, "last"))
        return jv_bool(i == n - 1);
    if (!strcmp(name, "length"))
        return jv_int(n);
    if (!strcmp(name, "depth"))
        return jv_int(1);
    if (!strcmp(name, "depth0"))
        return jv_int(0);
    if (!strcmp(name, "previtem"))
        return i > 0 ? l->items->items[i - 1] : jv_undef("there is no previous item");
    if (!strcmp(name, "nextitem"))
        return i + 1 < n ? l->items->items[i + 1] : jv_undef("there is no next item");
    int id = jn_method_id((jv){.kind = JV_LOOP, .loop = l}, name);
    if (id >= 0)
        return method(c, (jv){.kind = JV_LOOP, .loop = l}, id);
    return jv_undef(undef_msg(c, "'LoopContext' has no attribute '%s'", name, NULL));
}

jv jn_getattr(jctx *c, jv obj, const char *name)
{
    jv v;
    switch (obj.kind) {
    case JV_UNDEF:
        fail_undefined(c, obj);
    case JV_DICT: {
        int id = jn_method_id(obj, name);
        if (id >= 0)
            return method(c, obj, id);
        if (jd_get_str(obj.d, name, strlen(name), &v))
            return v;
        return no_attr(c, obj, name);
    }
    case JV_NS:
        if (jd_get_str(obj.d, name, strlen(name), &v))
            return v;
        return jv_undef(undef_msg(c, "'Namespace' has no attribute '%s'", name, NULL));
    case JV_LOOP:
        return loop_attr(c, obj.loop, name);
    default: {
        int id = jn_method_id(obj, name);
        if (id >= 0)
            return method(c, obj, id);
        return no_attr(c, obj, name);
    }
    }
}

static bool as_index(jv k, int64_t *i)
{
    if (k.kind == JV_INT)
        *i = k.i;
    else if (k.kind == JV_BOOL)
        *i = k.b;
    else
        return false;
    return true;
}

jv jn_getitem(jctx *c, jv obj, jv key)
{
    int64_t i;
    jv v;
    switch (obj.kind) {
    case JV_UNDEF:
        fail_undefined(c, obj);
    case JV_DICT:
    case JV_NS:
        if (jd_get(obj.d, key, &v))
            return v;
        break;
    case JV_LIST:
        if (as_index(key, &i)) {
            if (i < 0)
                i += obj.l->n;
            if (i >= 0 && i < obj.l->n)
                return obj.l->items[i];
            return jv_undef(undef_msg(c, "%s has no item at that index", object_name(obj), NULL));
        }
        break;
    case JV_STR:
        if (as_index(key, &i)) {
            int64_t n = (int64_t)ju_len(obj.s);
            if (i < 0)
                i += n;
            if (i >= 0 && i < n) {
                size_t b = ju_offset(obj.s, (size_t)i), e = ju_offset(obj.s, (size_t)i + 1);
                return jv_str(js_sub(&c->arena, obj.s, b, e - b));
            }
            return jv_undef("'str object' has no item at that index");
        }
        break;
    default:
        break;
    }
    if (key.kind == JV_STR) {
        char *name = jn_strdup(&c->arena, key.s->p, key.s->len);
        if (obj.kind == JV_DICT || obj.kind == JV_NS)
            return obj.kind == JV_DICT ? jn_getattr(c, obj, name) : no_attr(c, obj, name);
        return jn_getattr(c, obj, name);
    }
    return jv_undef(undef_msg(c, "%s has no such item", object_name(obj), NULL));
}

const jlist *jn_iterate(jctx *c, jv v)
{
    switch (v.kind) {
    case JV_UNDEF:
        return jl_new(&c->arena, 0);
    case JV_LIST:
        return v.l;
    case JV_DICT: {
        jlist *l = jl_new(&c->arena, v.d->n);
        memcpy((jv *)l->items, v.d->keys, v.d->n * sizeof(jv));
        return l;
    }
    case JV_STR: {
        size_t n = ju_len(v.s);
        jn_cost(c, n);
        jlist *l = jl_new(&c->arena, (uint32_t)n);
        for (size_t i = 0, at = 0; i < n; i++) {
            size_t next = at + 1;
            while (next < v.s->len && ((unsigned char)v.s->p[next] & 0xc0) == 0x80)
                next++;
            ((jv *)l->items)[i] = jv_str(js_sub(&c->arena, v.s, at, next - at));
            at = next;
        }
        return l;
    }
    default:
        jn_fail(c, "'%s' object is not iterable", jv_type_name(v));
    }
}

/* ---- slices ---- */

static int64_t slice_bound(jctx *c, jv v, int64_t dflt)
{
    if (v.kind == JV_NONE || v.kind == JV_UNDEF)
        return dflt;
    int64_t i;
    if (!as_index(v, &i))
        jn_fail(c, "slice indices must be integers or None");
    return i;
}

/* Python's slice.indices(n) and the count of items it selects. */
static int64_t slice_indices(jctx *c, jv a, jv b, jv s, int64_t n, int64_t *start, int64_t *step)
{
    int64_t st = slice_bound(c, s, 1);
    if (st == 0)
        jn_fail(c, "slice step cannot be zero");
    int64_t lo = st < 0 ? -1 : 0, hi = st < 0 ? n - 1 : n;
    int64_t b0 = slice_bound(c, a, st < 0 ? hi : lo), e0 = slice_bound(c, b, st < 0 ? lo : hi);
    if (a.kind == JV_INT || a.kind == JV_BOOL) {
        if (b0 < 0)
            b0 += n;
        b0 = b0 < lo ? lo : b0 > hi ? hi : b0;
    }
    if (b.kind == JV_INT || b.kind == JV_BOOL) {
        if (e0 < 0)
            e0 += n;
        e0 = e0 < lo ? lo : e0 > hi ? hi : e0;
    }
    *start = b0;
    *step = st;
    if (st > 0)
        return e0 > b0 ? (e0 - b0 + st - 1) / st : 0;
    return b0 > e0 ? (b0 - e0 - st - 1) / -st : 0;
}

static jv slice(jctx *c, jv obj, jv a, jv b, jv s)
{
    int64_t start, step, count;
    if (obj.kind == JV_LIST) {
        count = slice_indices(c, a, b, s, obj.l->n, &start, &step);
        jlist *l = jn_alloc(&c->arena, sizeof(*l));
        l->is_tuple = obj.l->is_tuple;
        l->n = (uint32_t)count;
        if (step == 1) { /* a view: lists never change */
            l->items = obj.l->items + start;
            return jv_list(l);
        }
        jn_cost(c, (uint64_t)count);
        jv *items = jn_alloc(&c->arena, (size_t)(count ? count : 1) * sizeof(jv));
        for (int64_t i = 0; i < count; i++)
            items[i] = obj.l->items[start + i * step];
        l->items = items;
        return jv_list(l);
    }
    if (obj.kind == JV_STR) {
        int64_t n = (int64_t)ju_len(obj.s);
        count = slice_indices(c, a, b, s, n, &start, &step);
        if (step == 1) {
            size_t from = ju_offset(obj.s, (size_t)start), to = ju_offset(obj.s, (size_t)(start + count));
            return jv_str(js_sub(&c->arena, obj.s, from, to - from));
        }
        jn_cost(c, (uint64_t)count);
        jbuf out = {0};
        for (int64_t i = 0; i < count; i++) {
            size_t from = ju_offset(obj.s, (size_t)(start + i * step));
            size_t to = ju_offset(obj.s, (size_t)(start + i * step + 1));
            jb_addstr(c, &out, js_sub(&c->arena, obj.s, from, to - from));
        }
        return jv_str(jb_finish(c, &out));
    }
    if (obj.kind == JV_UNDEF)
        fail_undefined(c, obj);
    jn_fail(c, "'%s' object is not subscriptable", jv_type_name(obj));
}

/* ---- operators ---- */

static bool numeric(jv v)
{
    return v.kind == JV_INT || v.kind == JV_BOOL || v.kind == JV_FLOAT;
}

static double dbl(jv v)
{
    return v.kind == JV_FLOAT ? v.f : v.kind == JV_BOOL ? v.b : (double)v.i;
}

static int64_t ival(jv v)
{
    return v.kind == JV_BOOL ? v.b : v.i;
}

static _Noreturn void bad_operands(jctx *c, const char *op, jv a, jv b)
{
    if (a.kind == JV_UNDEF)
        fail_undefined(c, a);
    if (b.kind == JV_UNDEF)
        fail_undefined(c, b);
    jn_fail(c, "unsupported operand type(s) for %s: '%s' and '%s'", op, jv_type_name(a), jv_type_name(b));
}

static jv concat2(jctx *c, const jstr *a, const jstr *b)
{
    jbuf out = {0};
    jb_addstr(c, &out, a);
    jb_addstr(c, &out, b);
    return jv_str(jb_finish(c, &out));
}

static jv repeat(jctx *c, jv seq, int64_t n)
{
    if (n < 0)
        n = 0;
    if (seq.kind == JV_STR) {
        if (n > 0 && seq.s->len > c->lim.max_output / (uint64_t)n)
            jn_fail_raw(c, -E2BIG, "the template's output is larger than a render may write");
        jbuf out = {0};
        for (int64_t i = 0; i < n; i++)
            jb_addstr(c, &out, seq.s);
        return jv_str(jb_finish(c, &out));
    }
    if (n > 0 && seq.l->n > 100000 / (uint64_t)n)
        jn_fail_raw(c, -E2BIG, "a list too long");
    jlist *l = jl_new(&c->arena, (uint32_t)(seq.l->n * n));
    l->is_tuple = seq.l->is_tuple;
    for (int64_t i = 0; i < n; i++)
        memcpy((jv *)l->items + i * seq.l->n, seq.l->items, seq.l->n * sizeof(jv));
    return jv_list(l);
}

static jv int_result(jctx *c, bool overflow, int64_t r)
{
    if (overflow)
        jn_fail(c, "an integer overflowed 64 bits");
    return jv_int(r);
}

/* Python's float divmod: the floor quotient, or the remainder with the
 * divisor's sign. */
static double float_divmod(double x, double y, bool want_mod)
{
    double mod = fmod(x, y), div = (x - mod) / y;
    if (mod != 0) {
        if ((y < 0) != (mod < 0)) {
            mod += y;
            div -= 1.0;
        }
    } else {
        mod = copysign(0.0, y);
    }
    if (want_mod)
        return mod;
    if (div == 0)
        return copysign(0.0, x / y);
    double fl = floor(div);
    return div - fl > 0.5 ? fl + 1.0 : fl;
}

static jv arith(jctx *c, jn_binop op, jv a, jv b)
{
    static const char *const names[] = {"+", "-", "*", "/", "//", "%", "**"};
    int64_t r;
    if (op == JB_ADD && a.kind == JV_STR && b.kind == JV_STR)
        return concat2(c, a.s, b.s);
    if (op == JB_ADD && a.kind == JV_LIST && b.kind == JV_LIST && a.l->is_tuple == b.l->is_tuple) {
        jlist *l = jl_new(&c->arena, a.l->n + b.l->n);
        l->is_tuple = a.l->is_tuple;
        memcpy((jv *)l->items, a.l->items, a.l->n * sizeof(jv));
        memcpy((jv *)l->items + a.l->n, b.l->items, b.l->n * sizeof(jv));
        jn_cost(c, l->n);
        return jv_list(l);
    }
    if (op == JB_MUL && (a.kind == JV_STR || a.kind == JV_LIST) && (b.kind == JV_INT || b.kind == JV_BOOL))
        return repeat(c, a, ival(b));
    if (op == JB_MUL && (b.kind == JV_STR || b.kind == JV_LIST) && (a.kind == JV_INT || a.kind == JV_BOOL))
        return repeat(c, b, ival(a));
    if (!numeric(a) || !numeric(b))
        bad_operands(c, names[op], a, b);
    bool fl = a.kind == JV_FLOAT || b.kind == JV_FLOAT;
    int64_t x = ival(a), y = ival(b);
    double fx = dbl(a), fy = dbl(b);
    switch (op) {
    case JB_ADD:
        if (fl)
            return jv_float(fx + fy);
        if (__builtin_add_overflow(x, y, &r))
            jn_fail(c, "an integer overflowed 64 bits");
        return jv_int(r);
    case JB_SUB:
        if (fl)
            return jv_float(fx - fy);
        if (__builtin_sub_overflow(x, y, &r))
            jn_fail(c, "an integer overflowed 64 bits");
        return jv_int(r);
    case JB_MUL:
        if (fl)
            return jv_float(fx * fy);
        if (__builtin_mul_overflow(x, y, &r))
            jn_fail(c, "an integer overflowed 64 bits");
        return jv_int(r);
    case JB_DIV:
        if (fy == 0)
            jn_fail(c, "division by zero");
        return jv_float(fx / fy);
    case JB_FLOORDIV:
    case JB_MOD:
        if (fl ? fy == 0 : y == 0)
            jn_fail(c, op == JB_MOD ? "modulo by zero" : "integer division or modulo by zero");
        if (fl)
            return jv_float(float_divmod(fx, fy, op == JB_MOD));
        if (x == INT64_MIN && y == -1)
            jn_fail(c, "an integer overflowed 64 bits");
        {
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {
                q--;
                m += y;
            }
            return jv_int(op == JB_MOD ? m : q);
        }
    case JB_POW:
        if (!fl && y >= 0) {
            int64_t acc = 1;
            for (int64_t i = 0; i < y; i++) {
                if (__builtin_mul_overflow(acc, x, &acc))
                    jn_fail(c, "an integer overflowed 64 bits");
                if (acc == 0 || acc == 1)
                    break;
            }
            return jv_int(acc);
        }
        return jv_float(pow(fx, fy));
    }
    bad_operands(c, names[op], a, b);
}

static bool contains(jctx *c, jv needle, jv hay)
{
    switch (hay.kind) {
    case JV_UNDEF:
        return false;
    case JV_STR:
        if (needle.kind != JV_STR)
            jn_fail(c, "'in <string>' requires string as left operand, not %s", jv_type_name(needle));
        jn_cost(c, hay.s->len / 64);
        return needle.s->len == 0 || memmem(hay.s->p, hay.s->len, needle.s->p, needle.s->len) != NULL;
    case JV_LIST:
        jn_cost(c, hay.l->n);
        for (uint32_t i = 0; i < hay.l->n; i++)
            if (jv_equal(needle, hay.l->items[i]))
                return true;
        return false;
    case JV_DICT:
    case JV_NS: {
        jv v;
        jn_cost(c, hay.d->n);
        return jd_get(hay.d, needle, &v);
    }
    default:
        jn_fail(c, "argument of type '%s' is not iterable", jv_type_name(hay));
    }
}

static bool compare(jctx *c, jn_cmp op, jv a, jv b)
{
    switch (op) {
    case JC_EQ:
        return jv_equal(a, b);
    case JC_NE:
        return !jv_equal(a, b);
    case JC_IN:
        return contains(c, a, b);
    case JC_NOTIN:
        return !contains(c, a, b);
    default:
        break;
    }
    if (a.kind == JV_UNDEF)
        fail_undefined(c, a);
    if (b.kind == JV_UNDEF)
        fail_undefined(c, b);
    int r = jv_compare(c, a, b);
    return op == JC_LT ? r < 0 : op == JC_LE ? r <= 0 : op == JC_GT ? r > 0 : r >= 0;
}

/* ---- expressions ---- */

typedef enum flow { FLOW_NEXT, FLOW_BREAK, FLOW_CONTINUE } flow;

static jv eval(jctx *c, jframe *f, const jn_node *n);
static flow exec_body(jctx *c, jframe *f, const jn_nodes *body);

/* The arguments of a call: positional values in *args (n_args of them),
 * keyword values after them. */
static jv *eval_args(jctx *c, jframe *f, const jn_node *n, int *n_pos)
{
    int total = n->call.args.n;
    jv *vals = jn_alloc(&c->arena, (size_t)(total ? total : 1) * sizeof(jv));
    for (int i = 0; i < total; i++)
        vals[i] = eval(c, f, n->call.args.v[i]);
    *n_pos = total - n->call.n_kw;
    return vals;
}

static jv call_macro(jctx *c, const jmacro *m, const jv *args, int n_pos, const char **kw, const jv *kw_vals,
                     int n_kw)
{
    const jn_node *d = m->def;
    if (n_pos > d->macro.n_params)
        jn_fail(c, "macro '%s' takes not more than %d argument(s)", d->macro.name, d->macro.n_params);
    jframe *mf = frame_new(c, m->scope);
    bool *set = jn_alloc(&c->arena, (size_t)(d->macro.n_params + 1));
    for (int i = 0; i < n_pos; i++) {
        frame_set(c, mf, d->macro.params[i], args[i]);
        set[i] = true;
    }
    for (int k = 0; k < n_kw; k++) {
        int i = 0;
        while (i < d->macro.n_params && strcmp(d->macro.params[i], kw[k]))
            i++;
        if (i == d->macro.n_params)
            jn_fail(c, "macro '%s' has no parameter named '%s'", d->macro.name, kw[k]);
        if (set[i])
            jn_fail(c, "macro '%s' got multiple values for parameter '%s'", d->macro.name, kw[k]);
        frame_set(c, mf, d->macro.params[i], kw_vals[k]);
        set[i] = true;
    }
    for (int i = 0; i < d->macro.n_params; i++)
        if (!set[i])
            frame_set(c, mf, d->macro.params[i],
                      d->macro.defaults[i] ? eval(c, mf, d->macro.defaults[i])
                                           : jv_undef(undef_msg(c, "parameter '%s' was not provided",
                                                                d->macro.params[i], NULL)));
    jbuf out = {0}, *saved = c->out;
    int line = c->line;
    c->out = &out;
    exec_body(c, mf, &d->macro.body);
    c->out = saved;
    c->line = line;
    return jv_str(jb_finish(c, &out));
}

static jv eval_call(jctx *c, jframe *f, const jn_node *n)
{
    jv fn = eval(c, f, n->call.fn);
    int n_pos;
    jv *args = eval_args(c, f, n, &n_pos);
    const char **kw = n->call.kw_names;
    const jv *kw_vals = args + n_pos;
    c->line = n->line;
    switch (fn.kind) {
    case JV_MACRO:
        return call_macro(c, fn.macro, args, n_pos, kw, kw_vals, n->call.n_kw);
    case JV_FUNC:
        return jn_call_func(c, fn.func, args, n_pos, kw, kw_vals, n->call.n_kw);
    case JV_METHOD:
        return jn_call_method(c, fn.method, args, n_pos, kw, kw_vals, n->call.n_kw);
    case JV_UNDEF:
        fail_undefined(c, fn);
    default:
        jn_fail(c, "'%s' object is not callable", jv_type_name(fn));
    }
}

static jv eval_compare(jctx *c, jframe *f, const jn_node *n)
{
    jv a = eval(c, f, n->cmp.items.v[0]);
    for (int i = 1; i < n->cmp.items.n; i++) {
        jv b = eval(c, f, n->cmp.items.v[i]);
        c->line = n->line;
        if (!compare(c, (jn_cmp)n->cmp.ops[i - 1], a, b))
            return jv_bool(false);
        a = b;
    }
    return jv_bool(true);
}

static jv eval_seq(jctx *c, jframe *f, const jn_node *n)
{
    if (n->op == JE_DICT) {
        jdict *d = jd_new(&c->arena);
        for (int i = 0; i + 1 < n->seq.items.n; i += 2) {
            jv k = eval(c, f, n->seq.items.v[i]);
            jd_set(&c->arena, d, k, eval(c, f, n->seq.items.v[i + 1]));
        }
        return (jv){.kind = JV_DICT, .d = d};
    }
    jlist *l = jl_new(&c->arena, (uint32_t)n->seq.items.n);
    l->is_tuple = n->op == JE_TUPLE;
    for (int i = 0; i < n->seq.items.n; i++)
        ((jv *)l->items)[i] = eval(c, f, n->seq.items.v[i]);
    return jv_list(l);
}

static jv eval_filter(jctx *c, jframe *f, const jn_node *n)
{
    jv v = eval(c, f, n->call.obj);
    int n_pos;
    jv *args = eval_args(c, f, n, &n_pos);
    c->line = n->line;
    return jn_call_filter(c, n->call.id, v, args, n_pos, n->call.kw_names, args + n_pos, n->call.n_kw);
}

static jv eval_test(jctx *c, jframe *f, const jn_node *n)
{
    jv v = eval(c, f, n->call.obj);
    int n_pos;
    jv *args = eval_args(c, f, n, &n_pos);
    c->line = n->line;
    bool r = jn_call_test(c, n->call.id, v, args, n_pos);
    return jv_bool(n->call.negated ? !r : r);
}

static jv eval_inner(jctx *c, jframe *f, const jn_node *n)
{
    switch ((jn_op)n->op) {
    case JE_CONST:
        return n->k;
    case JE_NAME:
        return lookup(c, f, n->name);
    case JE_ATTR: {
        jv obj = eval(c, f, n->sub.obj);
        c->line = n->line;
        return jn_getattr(c, obj, n->sub.name);
    }
    case JE_ITEM: {
        jv obj = eval(c, f, n->sub.obj), key = eval(c, f, n->sub.a);
        c->line = n->line;
        return jn_getitem(c, obj, key);
    }
    case JE_SLICE: {
        jv obj = eval(c, f, n->sub.obj);
        jv a = n->sub.a ? eval(c, f, n->sub.a) : jv_none();
        jv b = n->sub.b ? eval(c, f, n->sub.b) : jv_none();
        jv s = n->sub.c ? eval(c, f, n->sub.c) : jv_none();
        c->line = n->line;
        return slice(c, obj, a, b, s);
    }
    case JE_CALL:
        return eval_call(c, f, n);
    case JE_FILTER:
        return eval_filter(c, f, n);
    case JE_TEST:
        return eval_test(c, f, n);
    case JE_NOT:
        return jv_bool(!jv_truthy(eval(c, f, n->sub.obj)));
    case JE_NEG:
    case JE_POS: {
        jv v = eval(c, f, n->sub.obj);
        c->line = n->line;
        if (!numeric(v))
            jn_fail(c, "bad operand type for unary %c: '%s'", n->op == JE_NEG ? '-' : '+', jv_type_name(v));
        if (n->op == JE_POS)
            return v.kind == JV_BOOL ? jv_int(v.b) : v;
        if (v.kind == JV_FLOAT)
            return jv_float(-v.f);
        return int_result(c, ival(v) == INT64_MIN, -ival(v));
    }
    case JE_BIN: {
        jv a = eval(c, f, n->bin.a), b = eval(c, f, n->bin.b);
        c->line = n->line;
        return arith(c, (jn_binop)n->bin.kind, a, b);
    }
    case JE_AND: {
        jv a = eval(c, f, n->bin.a);
        return jv_truthy(a) ? eval(c, f, n->bin.b) : a;
    }
    case JE_OR: {
        jv a = eval(c, f, n->bin.a);
        return jv_truthy(a) ? a : eval(c, f, n->bin.b);
    }
    case JE_COMPARE:
        return eval_compare(c, f, n);
    case JE_COND:
        if (jv_truthy(eval(c, f, n->bin.b)))
            return eval(c, f, n->bin.a);
        return n->bin.c ? eval(c, f, n->bin.c) : jv_undef("the condition was false and there is no else");
    case JE_LIST:
    case JE_TUPLE:
    case JE_DICT:
        return eval_seq(c, f, n);
    case JE_CONCAT: {
        jbuf out = {0};
        for (int i = 0; i < n->bin.items.n; i++)
            jb_str(c, &out, eval(c, f, n->bin.items.v[i]));
        return jv_str(jb_finish(c, &out));
    }
    default:
        jn_fail(c, "internal error: not an expression");
    }
}

static jv eval(jctx *c, jframe *f, const jn_node *n)
{
    jn_cost(c, 1);
    enter(c);
    c->line = n->line;
    jv v = eval_inner(c, f, n);
    c->depth--;
    return v;
}

/* ---- statements ---- */

static void assign(jctx *c, jframe *f, const char **targets, int n_targets, jv v)
{
    if (n_targets == 1) {
        frame_set(c, f, targets[0], v);
        return;
    }
    const jlist *l = jn_iterate(c, v);
    if ((int)l->n != n_targets)
        jn_fail(c, "%s values to unpack (expected %d, got %u)", (int)l->n > n_targets ? "too many" : "not enough",
                n_targets, l->n);
    for (int i = 0; i < n_targets; i++)
        frame_set(c, f, targets[i], l->items[i]);
}

static void exec_set(jctx *c, jframe *f, const jn_node *n)
{
    jv v;
    if (n->op == JS_SET_BLOCK) {
        jbuf out = {0}, *saved = c->out;
        c->out = &out;
        exec_body(c, f, &n->set.body);
        c->out = saved;
        v = jv_str(jb_finish(c, &out));
    } else {
        v = eval(c, f, n->set.value);
    }
    c->line = n->line;
    if (!n->set.attr) {
        assign(c, f, n->set.targets, n->set.n_targets, v);
        return;
    }
    jv ns = lookup(c, f, n->set.targets[0]);
    if (ns.kind != JV_NS)
        jn_fail(c, "cannot assign attribute on non-namespace object");
    jd_set(&c->arena, ns.d, jv_str(js_lit(&c->arena, n->set.attr)), v);
}

static const jlist *filtered(jctx *c, jframe *f, const jn_node *n, const jlist *items)
{
    if (!n->for_.filter)
        return items;
    jlist *keep = jl_new(&c->arena, items->n);
    keep->n = 0;
    for (uint32_t i = 0; i < items->n; i++) {
        jframe *it = frame_new(c, f);
        assign(c, it, n->for_.targets, n->for_.n_targets, items->items[i]);
        if (jv_truthy(eval(c, it, n->for_.filter)))
            ((jv *)keep->items)[keep->n++] = items->items[i];
    }
    return keep;
}

static void exec_for(jctx *c, jframe *f, const jn_node *n)
{
    jv seq = eval(c, f, n->for_.iter);
    c->line = n->line;
    const jlist *items = filtered(c, f, n, jn_iterate(c, seq));
    if (items->n == 0) {
        exec_body(c, f, &n->for_.else_body);
        return;
    }
    jloop *lp = jn_alloc(&c->arena, sizeof(*lp));
    lp->items = items;
    for (uint32_t i = 0; i < items->n; i++) {
        lp->i = i;
        jframe *it = frame_new(c, f);
        frame_set(c, it, "loop", (jv){.kind = JV_LOOP, .loop = lp});
        c->line = n->line;
        assign(c, it, n->for_.targets, n->for_.n_targets, items->items[i]);
        if (exec_body(c, it, &n->for_.body) == FLOW_BREAK)
            break;
    }
}

static flow exec(jctx *c, jframe *f, const jn_node *n)
{
    jn_cost(c, 1);
    c->line = n->line;
    switch ((jn_op)n->op) {
    case JS_TEXT:
        jb_add(c, c->out, n->text.p, n->text.len);
        return FLOW_NEXT;
    case JS_PRINT:
        jb_str(c, c->out, eval(c, f, n->expr));
        return FLOW_NEXT;
    case JS_IF:
        for (int i = 0; i < n->if_.conds.n; i++)
            if (jv_truthy(eval(c, f, n->if_.conds.v[i])))
                return exec_body(c, f, &n->if_.bodies[i]);
        return exec_body(c, f, &n->if_.else_body);
    case JS_FOR:
        exec_for(c, f, n);
        return FLOW_NEXT;
    case JS_SET:
    case JS_SET_BLOCK:
        exec_set(c, f, n);
        return FLOW_NEXT;
    case JS_MACRO: {
        jmacro *m = jn_alloc(&c->arena, sizeof(*m));
        m->def = n;
        m->scope = f;
        frame_set(c, f, n->macro.name, (jv){.kind = JV_MACRO, .macro = m});
        return FLOW_NEXT;
    }
    case JS_BREAK:
        return FLOW_BREAK;
    case JS_CONTINUE:
        return FLOW_CONTINUE;
    case JS_BLOCK:
        return exec_body(c, f, &n->block.body);
    default:
        jn_fail(c, "internal error: not a statement");
    }
}

static flow exec_body(jctx *c, jframe *f, const jn_nodes *body)
{
    enter(c);
    flow r = FLOW_NEXT;
    for (int i = 0; i < body->n && r == FLOW_NEXT; i++)
        r = exec(c, f, body->v[i]);
    c->depth--;
    return r;
}

/* ---- the render ---- */

static jdict *vars_of(jctx *c, const json_t *obj, bool plain)
{
    if (!obj || !json_is_object(obj))
        return jd_new(&c->arena);
    jv v = jv_from_json(c, obj, plain);
    return v.d;
}

static void copy_out(jctx *c, const jbuf *b, rt_jinja_output *out)
{
    out->text = malloc(b->len + 1);
    out->plain = b->n_spans ? malloc(b->n_spans * sizeof(rt_text_span)) : NULL;
    if (!out->text || (b->n_spans && !out->plain)) {
        free(out->text);
        free(out->plain);
        *out = (rt_jinja_output){0};
        jn_fail_raw(c, -ENOMEM, "out of memory rendering the template");
    }
    memcpy(out->text, b->p ? b->p : "", b->len);
    out->text[b->len] = '\0';
    out->len = b->len;
    for (uint32_t i = 0; i < b->n_spans; i++)
        out->plain[i] = (rt_text_span){b->spans[i].off, b->spans[i].len};
    out->n_plain = (int)b->n_spans;
}

int rt_jinja_render(const rt_jinja *t, const rt_jinja_input *in, rt_jinja_output *out, char *err,
                    size_t err_len)
{
    *out = (rt_jinja_output){0};
    char dummy[8];
    jctx *c = calloc(1, sizeof(*c));
    if (!c) {
        snprintf(err, err_len, "out of memory rendering the template");
        return -ENOMEM;
    }
    c->err = err && err_len ? err : dummy;
    c->err_len = err && err_len ? err_len : sizeof(dummy);
    c->err[0] = '\0';
    c->in = in;
    c->lim = in->limits;
    if (!c->lim.max_output)
        c->lim.max_output = 16u << 20;
    if (!c->lim.max_memory)
        c->lim.max_memory = 256u << 20;
    if (!c->lim.max_steps)
        c->lim.max_steps = 50000000;
    if (!c->lim.max_depth)
        c->lim.max_depth = 400;
    c->now = in->now ? in->now : time(NULL);
    c->arena = (jn_arena){.limit = c->lim.max_memory, .fail = &c->fail, .err = c->err, .err_len = c->err_len,
                          .rc = &c->rc};
    int rc = 0;
    if (setjmp(c->fail)) {
        rc = c->rc ? c->rc : -EINVAL;
        goto done;
    }
    c->trusted_vars = vars_of(c, in->trusted, false);
    c->plain_vars = vars_of(c, in->plain, true);
    c->root = frame_new(c, NULL);
    jbuf *b = jn_alloc(&c->arena, sizeof(*b));
    c->out = b;
    exec_body(c, c->root, &t->body);
    copy_out(c, b, out);
done:
    jn_arena_free(&c->arena);
    free(c);
    return rc;
}

void rt_jinja_output_dispose(rt_jinja_output *out)
{
    free(out->text);
    free(out->plain);
    *out = (rt_jinja_output){0};
}
