/* The Jinja parser: tokens to the syntax tree (internal.h), with Jinja2's
 * grammar and precedence (conditional, or, and, not, comparisons, + -, ~,
 * * / // %, **, unary - +, then primaries with their attributes,
 * subscripts, calls, filters and tests), and rt_jinja_parse around it. */
#include "runtime/jinja/lex.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NEST 200 /* nested statements plus nested expressions */

typedef struct parser {
    jn_lexer lx;
    jn_arena *a;
    int pos;
    int depth;
} parser;

static _Noreturn void fail_at(parser *p, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static _Noreturn void fail_at(parser *p, int line, const char *fmt, ...)
{
    int n = snprintf(p->lx.err, p->lx.err_len, "template line %d: ", line);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < p->lx.err_len)
        vsnprintf(p->lx.err + n, p->lx.err_len - (size_t)n, fmt, ap);
    va_end(ap);
    *p->a->rc = -EINVAL;
    longjmp(*p->a->fail, 1);
}

static const jn_tok *cur(parser *p) { return &p->lx.toks[p->pos]; }
static const jn_tok *peek(parser *p, int k)
{
    int i = p->pos + k;
    return &p->lx.toks[i < p->lx.n ? i : p->lx.n - 1];
}
static void next(parser *p)
{
    if (cur(p)->type != JT_EOF)
        p->pos++;
}

static bool tok_is(const jn_tok *t, jn_tok_type type, const char *text)
{
    return t->type == type && (!text || (t->len == strlen(text) && !memcmp(t->p, text, t->len)));
}
static bool is_op(parser *p, const char *op) { return tok_is(cur(p), JT_OP, op); }
static bool is_name(parser *p, const char *name) { return tok_is(cur(p), JT_NAME, name); }

static bool skip_op(parser *p, const char *op)
{
    if (!is_op(p, op))
        return false;
    next(p);
    return true;
}
static bool skip_name(parser *p, const char *name)
{
    if (!is_name(p, name))
        return false;
    next(p);
    return true;
}

static const char *describe(const jn_tok *t)
{
    switch (t->type) {
    case JT_EOF: return "end of template";
    case JT_DATA: return "text";
    case JT_VAR_BEGIN: return "'{{'";
    case JT_VAR_END: return "'}}'";
    case JT_BLOCK_BEGIN: return "'{%'";
    case JT_BLOCK_END: return "'%}'";
    case JT_STRING: return "a string";
    case JT_INT: case JT_FLOAT: return "a number";
    default: return NULL;
    }
}

static _Noreturn void unexpected(parser *p, const char *wanted)
{
    const jn_tok *t = cur(p);
    const char *d = describe(t);
    if (d)
        fail_at(p, t->line, "expected %s, found %s", wanted, d);
    fail_at(p, t->line, "expected %s, found '%.*s'", wanted, (int)(t->len > 40 ? 40 : t->len), t->p);
}

static void expect_op(parser *p, const char *op)
{
    if (!skip_op(p, op)) {
        char w[16];
        snprintf(w, sizeof(w), "'%s'", op);
        unexpected(p, w);
    }
}

static void expect(parser *p, jn_tok_type type, const char *what)
{
    if (cur(p)->type != type)
        unexpected(p, what);
    next(p);
}

static const char *name_of(parser *p)
{
    if (cur(p)->type != JT_NAME)
        unexpected(p, "a name");
    const char *s = jn_strdup(p->a, cur(p)->p, cur(p)->len);
    next(p);
    return s;
}

static jn_node *node(parser *p, jn_op op, int line)
{
    jn_node *n = jn_alloc(p->a, sizeof(*n));
    n->op = (uint8_t)op;
    n->line = line;
    return n;
}

static void nodes_add(parser *p, jn_nodes *ns, jn_node *n)
{
    /* grows by doubling into the arena; the old array is left behind */
    if ((ns->n & (ns->n - 1)) == 0) {
        int cap = ns->n ? ns->n * 2 : 4;
        jn_node **v = jn_alloc(p->a, (size_t)cap * sizeof(*v));
        if (ns->n)
            memcpy(v, ns->v, (size_t)ns->n * sizeof(*v));
        ns->v = v;
    }
    ns->v[ns->n++] = n;
}

static void enter(parser *p)
{
    if (++p->depth > MAX_NEST)
        fail_at(p, cur(p)->line, "nested deeper than %d", MAX_NEST);
}

/* ---- expressions ---- */

static jn_node *parse_expression(parser *p);
static jn_node *parse_tuple(parser *p, bool with_condexpr, bool explicit_parens);
static jn_node *parse_unary(parser *p, bool with_filter);
static jn_node *parse_or(parser *p);

/* Positional and keyword arguments after "(" up to ")". */
static void parse_call_args(parser *p, jn_node *call)
{
    expect_op(p, "(");
    jn_nodes kwv = {0};
    const char *names[64];
    while (!is_op(p, ")")) {
        if (call->call.args.n + kwv.n > 0)
            expect_op(p, ",");
        if (is_op(p, ")"))
            break;
        if (is_op(p, "*") || is_op(p, "**"))
            fail_at(p, cur(p)->line, "*args and **kwargs are not supported");
        if (cur(p)->type == JT_NAME && tok_is(peek(p, 1), JT_OP, "=")) {
            if (kwv.n == 64)
                fail_at(p, cur(p)->line, "too many keyword arguments");
            names[kwv.n] = name_of(p);
            next(p);
            nodes_add(p, &kwv, parse_expression(p));
        } else {
            if (kwv.n)
                fail_at(p, cur(p)->line, "a positional argument follows a keyword argument");
            nodes_add(p, &call->call.args, parse_expression(p));
        }
    }
    next(p);
    call->call.n_kw = kwv.n;
    if (kwv.n) {
        call->call.kw_names = jn_alloc(p->a, (size_t)kwv.n * sizeof(char *));
        memcpy(call->call.kw_names, names, (size_t)kwv.n * sizeof(char *));
        for (int i = 0; i < kwv.n; i++)
            nodes_add(p, &call->call.args, kwv.v[i]);
    }
}

static jn_node *parse_list(parser *p, int line)
{
    jn_node *n = node(p, JE_LIST, line);
    expect_op(p, "[");
    while (!is_op(p, "]")) {
        if (n->seq.items.n)
            expect_op(p, ",");
        if (is_op(p, "]"))
            break;
        nodes_add(p, &n->seq.items, parse_expression(p));
    }
    next(p);
    return n;
}

static jn_node *parse_dict(parser *p, int line)
{
    jn_node *n = node(p, JE_DICT, line);
    expect_op(p, "{");
    while (!is_op(p, "}")) {
        if (n->seq.items.n)
            expect_op(p, ",");
        if (is_op(p, "}"))
            break;
        nodes_add(p, &n->seq.items, parse_expression(p));
        expect_op(p, ":");
        nodes_add(p, &n->seq.items, parse_expression(p));
    }
    next(p);
    return n;
}

static jn_node *constant(parser *p, jv k, int line)
{
    jn_node *n = node(p, JE_CONST, line);
    n->k = k;
    return n;
}

static jn_node *parse_primary(parser *p)
{
    const jn_tok *t = cur(p);
    int line = t->line;
    switch (t->type) {
    case JT_NAME: {
        static const char *const k_true[] = {"true", "True"}, *const k_false[] = {"false", "False"},
                                 *const k_none[] = {"none", "None"};
        for (int i = 0; i < 2; i++) {
            if (skip_name(p, k_true[i]))
                return constant(p, jv_bool(true), line);
            if (skip_name(p, k_false[i]))
                return constant(p, jv_bool(false), line);
            if (skip_name(p, k_none[i]))
                return constant(p, jv_none(), line);
        }
        jn_node *n = node(p, JE_NAME, line);
        n->name = name_of(p);
        return n;
    }
    case JT_STRING: {
        /* adjacent literals are one string */
        size_t total = 0;
        int k = 0;
        while (peek(p, k)->type == JT_STRING)
            total += peek(p, k++)->len;
        char *s = jn_alloc(p->a, total + 1);
        size_t at = 0;
        for (; cur(p)->type == JT_STRING; next(p)) {
            memcpy(s + at, cur(p)->p, cur(p)->len);
            at += cur(p)->len;
        }
        jstr *js = jn_alloc(p->a, sizeof(*js));
        *js = *js_new(p->a, s, total, false);
        return constant(p, jv_str(js), line);
    }
    case JT_INT:
        next(p);
        return constant(p, jv_int(t->i), line);
    case JT_FLOAT:
        next(p);
        return constant(p, jv_float(t->f), line);
    default:
        break;
    }
    if (is_op(p, "(")) {
        next(p);
        jn_node *n = parse_tuple(p, true, true);
        expect_op(p, ")");
        return n;
    }
    if (is_op(p, "["))
        return parse_list(p, line);
    if (is_op(p, "{"))
        return parse_dict(p, line);
    unexpected(p, "an expression");
}

/* What follows "[": an index, or a slice a:b:c (any part left out). */
static jn_node *parse_subscript(parser *p, jn_node *obj, int line)
{
    jn_node *parts[3] = {NULL, NULL, NULL};
    int k = 0;
    bool slice = false;
    for (;;) {
        if (!is_op(p, ":") && !is_op(p, "]"))
            parts[k] = parse_expression(p);
        if (is_op(p, ":") && k < 2) {
            next(p);
            k++;
            slice = true;
            continue;
        }
        break;
    }
    expect_op(p, "]");
    jn_node *n = node(p, slice ? JE_SLICE : JE_ITEM, line);
    n->sub.obj = obj;
    n->sub.a = parts[0];
    n->sub.b = parts[1];
    n->sub.c = parts[2];
    if (!slice && !parts[0])
        fail_at(p, line, "an empty subscript");
    return n;
}

static jn_node *parse_postfix(parser *p, jn_node *n)
{
    for (;;) {
        int line = cur(p)->line;
        if (skip_op(p, ".")) {
            if (cur(p)->type == JT_INT) {
                jn_node *item = node(p, JE_ITEM, line);
                item->sub.obj = n;
                item->sub.a = constant(p, jv_int(cur(p)->i), line);
                next(p);
                n = item;
                continue;
            }
            jn_node *attr = node(p, JE_ATTR, line);
            attr->sub.obj = n;
            attr->sub.name = name_of(p);
            n = attr;
        } else if (skip_op(p, "[")) {
            n = parse_subscript(p, n, line);
        } else if (is_op(p, "(")) {
            jn_node *call = node(p, JE_CALL, line);
            call->call.fn = n;
            parse_call_args(p, call);
            n = call;
        } else {
            return n;
        }
    }
}

static const char *dotted_name(parser *p)
{
    const char *name = name_of(p);
    while (is_op(p, ".") && peek(p, 1)->type == JT_NAME) {
        next(p);
        const char *more = name_of(p);
        size_t n = strlen(name) + strlen(more) + 2;
        char *s = jn_alloc(p->a, n);
        snprintf(s, n, "%s.%s", name, more);
        name = s;
    }
    return name;
}

static jn_node *parse_filter(parser *p, jn_node *obj)
{
    int line = cur(p)->line;
    jn_node *f = node(p, JE_FILTER, line);
    const char *name = dotted_name(p);
    f->call.obj = obj;
    f->call.id = jn_filter_id(name);
    if (f->call.id < 0)
        fail_at(p, line, "no filter named '%s'", name);
    if (is_op(p, "("))
        parse_call_args(p, f);
    return f;
}

static bool test_arg_follows(parser *p)
{
    const jn_tok *t = cur(p);
    if (t->type == JT_NAME)
        return !is_name(p, "else") && !is_name(p, "or") && !is_name(p, "and");
    return t->type == JT_STRING || t->type == JT_INT || t->type == JT_FLOAT || is_op(p, "(") || is_op(p, "[") ||
           is_op(p, "{");
}

static jn_node *parse_test(parser *p, jn_node *obj)
{
    int line = cur(p)->line;
    jn_node *t = node(p, JE_TEST, line);
    t->call.obj = obj;
    t->call.negated = skip_name(p, "not");
    const char *name = dotted_name(p);
    t->call.id = jn_test_id(name);
    if (t->call.id < 0)
        fail_at(p, line, "no test named '%s'", name);
    if (is_op(p, "(")) {
        parse_call_args(p, t);
    } else if (test_arg_follows(p)) {
        if (is_name(p, "is"))
            fail_at(p, line, "you cannot chain multiple tests with is");
        nodes_add(p, &t->call.args, parse_postfix(p, parse_primary(p)));
    }
    return t;
}

static jn_node *parse_filter_expr(parser *p, jn_node *n)
{
    for (;;) {
        if (skip_op(p, "|")) {
            n = parse_filter(p, n);
        } else if (skip_name(p, "is")) {
            n = parse_test(p, n);
        } else if (is_op(p, "(")) {
            jn_node *call = node(p, JE_CALL, cur(p)->line);
            call->call.fn = n;
            parse_call_args(p, call);
            n = call;
        } else {
            return n;
        }
    }
}

static jn_node *parse_unary(parser *p, bool with_filter)
{
    enter(p);
    int line = cur(p)->line;
    jn_node *n;
    if (skip_op(p, "-") || (is_op(p, "+") && (next(p), true))) {
        bool neg = p->lx.toks[p->pos - 1].p[0] == '-';
        n = node(p, neg ? JE_NEG : JE_POS, line);
        n->sub.obj = parse_unary(p, false);
    } else {
        n = parse_postfix(p, parse_primary(p));
    }
    if (with_filter)
        n = parse_filter_expr(p, n);
    p->depth--;
    return n;
}

static jn_node *binary(parser *p, jn_binop op, jn_node *a, jn_node *b, int line)
{
    jn_node *n = node(p, JE_BIN, line);
    n->bin.kind = op;
    n->bin.a = a;
    n->bin.b = b;
    return n;
}

static jn_node *parse_pow(parser *p)
{
    jn_node *n = parse_unary(p, true);
    while (is_op(p, "**")) {
        int line = cur(p)->line;
        next(p);
        n = binary(p, JB_POW, n, parse_unary(p, true), line);
    }
    return n;
}

static jn_node *parse_math2(parser *p)
{
    jn_node *n = parse_pow(p);
    for (;;) {
        int line = cur(p)->line;
        jn_binop op;
        if (is_op(p, "*"))
            op = JB_MUL;
        else if (is_op(p, "/"))
            op = JB_DIV;
        else if (is_op(p, "//"))
            op = JB_FLOORDIV;
        else if (is_op(p, "%"))
            op = JB_MOD;
        else
            return n;
        next(p);
        n = binary(p, op, n, parse_pow(p), line);
    }
}

static jn_node *parse_concat(parser *p)
{
    jn_node *first = parse_math2(p);
    if (!is_op(p, "~"))
        return first;
    jn_node *n = node(p, JE_CONCAT, cur(p)->line);
    nodes_add(p, &n->bin.items, first);
    while (skip_op(p, "~"))
        nodes_add(p, &n->bin.items, parse_math2(p));
    return n;
}

static jn_node *parse_math1(parser *p)
{
    jn_node *n = parse_concat(p);
    for (;;) {
        int line = cur(p)->line;
        if (skip_op(p, "+"))
            n = binary(p, JB_ADD, n, parse_concat(p), line);
        else if (skip_op(p, "-"))
            n = binary(p, JB_SUB, n, parse_concat(p), line);
        else
            return n;
    }
}

static jn_node *parse_compare(parser *p)
{
    int line = cur(p)->line;
    jn_node *first = parse_math1(p);
    jn_node *n = NULL;
    uint8_t ops[64];
    for (;;) {
        int op;
        if (skip_op(p, "=="))
            op = JC_EQ;
        else if (skip_op(p, "!="))
            op = JC_NE;
        else if (skip_op(p, "<"))
            op = JC_LT;
        else if (skip_op(p, "<="))
            op = JC_LE;
        else if (skip_op(p, ">"))
            op = JC_GT;
        else if (skip_op(p, ">="))
            op = JC_GE;
        else if (skip_name(p, "in"))
            op = JC_IN;
        else if (is_name(p, "not") && tok_is(peek(p, 1), JT_NAME, "in")) {
            next(p);
            next(p);
            op = JC_NOTIN;
        } else
            break;
        if (!n) {
            n = node(p, JE_COMPARE, line);
            nodes_add(p, &n->cmp.items, first);
        }
        if (n->cmp.items.n > 64)
            fail_at(p, line, "a comparison chain too long");
        ops[n->cmp.items.n - 1] = (uint8_t)op;
        nodes_add(p, &n->cmp.items, parse_math1(p));
    }
    if (!n)
        return first;
    n->cmp.ops = jn_alloc(p->a, (size_t)n->cmp.items.n);
    memcpy(n->cmp.ops, ops, (size_t)n->cmp.items.n - 1);
    return n;
}

static jn_node *parse_not(parser *p)
{
    if (is_name(p, "not")) {
        int line = cur(p)->line;
        next(p);
        enter(p);
        jn_node *n = node(p, JE_NOT, line);
        n->sub.obj = parse_not(p);
        p->depth--;
        return n;
    }
    return parse_compare(p);
}

static jn_node *parse_and(parser *p)
{
    jn_node *n = parse_not(p);
    while (is_name(p, "and")) {
        jn_node *a = node(p, JE_AND, cur(p)->line);
        next(p);
        a->bin.a = n;
        a->bin.b = parse_not(p);
        n = a;
    }
    return n;
}

static jn_node *parse_or(parser *p)
{
    jn_node *n = parse_and(p);
    while (is_name(p, "or")) {
        jn_node *o = node(p, JE_OR, cur(p)->line);
        next(p);
        o->bin.a = n;
        o->bin.b = parse_and(p);
        n = o;
    }
    return n;
}

static jn_node *parse_condexpr(parser *p)
{
    enter(p);
    jn_node *n = parse_or(p);
    while (is_name(p, "if")) {
        jn_node *c = node(p, JE_COND, cur(p)->line);
        next(p);
        c->bin.a = n;
        c->bin.b = parse_or(p);
        if (skip_name(p, "else"))
            c->bin.c = parse_condexpr(p);
        n = c;
    }
    p->depth--;
    return n;
}

static jn_node *parse_expression(parser *p)
{
    return parse_condexpr(p);
}

static bool tuple_ends(parser *p)
{
    const jn_tok *t = cur(p);
    return t->type == JT_VAR_END || t->type == JT_BLOCK_END || t->type == JT_EOF || is_op(p, ")") ||
           is_name(p, "recursive") || (is_name(p, "if"));
}

/* Expressions separated by commas: a tuple if there is a comma (or the
 * parentheses are empty), else the one expression. */
static jn_node *parse_tuple(parser *p, bool with_condexpr, bool explicit_parens)
{
    int line = cur(p)->line;
    jn_node *t = node(p, JE_TUPLE, line);
    bool comma = false;
    for (;;) {
        if (t->seq.items.n)
            expect_op(p, ",");
        if (tuple_ends(p))
            break;
        nodes_add(p, &t->seq.items, with_condexpr ? parse_expression(p) : parse_or(p));
        if (!is_op(p, ","))
            break;
        comma = true;
    }
    if (!comma && t->seq.items.n == 1)
        return t->seq.items.v[0];
    if (t->seq.items.n == 0 && !explicit_parens)
        unexpected(p, "an expression");
    return t;
}

/* ---- statements ---- */

static jn_nodes parse_body(parser *p, const char *const *ends);

static void end_block(parser *p)
{
    expect(p, JT_BLOCK_END, "'%}'");
}

/* Names to assign: one, or several separated by commas (optionally in
 * parentheses), for for-loops and set. */
static const char **parse_targets(parser *p, int *n)
{
    const char *names[16];
    int k = 0;
    bool paren = skip_op(p, "(");
    do {
        if (k == 16)
            fail_at(p, cur(p)->line, "too many names to unpack into");
        names[k++] = name_of(p);
    } while (skip_op(p, ",") && cur(p)->type == JT_NAME);
    if (paren)
        expect_op(p, ")");
    const char **v = jn_alloc(p->a, (size_t)k * sizeof(char *));
    memcpy(v, names, (size_t)k * sizeof(char *));
    *n = k;
    return v;
}

static jn_node *parse_if(parser *p, int line)
{
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    jn_node *n = node(p, JS_IF, line);
    jn_nodes bodies[256];
    for (;;) {
        if (n->if_.conds.n == 256)
            fail_at(p, line, "too many elif branches");
        nodes_add(p, &n->if_.conds, parse_tuple(p, true, false));
        end_block(p);
        bodies[n->if_.conds.n - 1] = parse_body(p, ends);
        if (skip_name(p, "elif"))
            continue;
        if (skip_name(p, "else")) {
            end_block(p);
            static const char *const only_end[] = {"endif", NULL};
            n->if_.else_body = parse_body(p, only_end);
        }
        break;
    }
    if (!skip_name(p, "endif"))
        unexpected(p, "'endif'");
    end_block(p);
    n->if_.bodies = jn_alloc(p->a, (size_t)n->if_.conds.n * sizeof(jn_nodes));
    memcpy(n->if_.bodies, bodies, (size_t)n->if_.conds.n * sizeof(jn_nodes));
    return n;
}

static jn_node *parse_for(parser *p, int line)
{
    static const char *const ends[] = {"else", "endfor", NULL}, *const only_end[] = {"endfor", NULL};
    jn_node *n = node(p, JS_FOR, line);
    n->for_.targets = parse_targets(p, &n->for_.n_targets);
    if (!skip_name(p, "in"))
        unexpected(p, "'in'");
    n->for_.iter = parse_tuple(p, false, false);
    if (skip_name(p, "if"))
        n->for_.filter = parse_expression(p);
    if (is_name(p, "recursive"))
        fail_at(p, line, "recursive for loops are not supported");
    end_block(p);
    n->for_.body = parse_body(p, ends);
    if (skip_name(p, "else")) {
        end_block(p);
        n->for_.else_body = parse_body(p, only_end);
    }
    if (!skip_name(p, "endfor"))
        unexpected(p, "'endfor'");
    end_block(p);
    return n;
}

static jn_node *parse_set(parser *p, int line)
{
    jn_node *n = node(p, JS_SET, line);
    if (cur(p)->type == JT_NAME && tok_is(peek(p, 1), JT_OP, ".") && tok_is(peek(p, 2), JT_NAME, NULL)) {
        n->set.targets = jn_alloc(p->a, sizeof(char *));
        n->set.targets[0] = name_of(p);
        n->set.n_targets = 1;
        next(p);
        n->set.attr = name_of(p);
    } else {
        n->set.targets = parse_targets(p, &n->set.n_targets);
    }
    if (skip_op(p, "=")) {
        n->set.value = parse_tuple(p, true, false);
        end_block(p);
        return n;
    }
    if (is_op(p, "|"))
        fail_at(p, line, "filtered set blocks are not supported");
    if (n->set.attr || n->set.n_targets != 1)
        fail_at(p, line, "a set block assigns one name");
    end_block(p);
    static const char *const ends[] = {"endset", NULL};
    n->op = JS_SET_BLOCK;
    n->set.body = parse_body(p, ends);
    next(p);
    end_block(p);
    return n;
}

static jn_node *parse_macro(parser *p, int line)
{
    jn_node *n = node(p, JS_MACRO, line);
    n->macro.name = name_of(p);
    expect_op(p, "(");
    const char *params[64];
    jn_node *defaults[64];
    int k = 0;
    while (!is_op(p, ")")) {
        if (k)
            expect_op(p, ",");
        if (is_op(p, ")"))
            break;
        if (k == 64)
            fail_at(p, line, "too many macro parameters");
        params[k] = name_of(p);
        defaults[k] = skip_op(p, "=") ? parse_expression(p) : NULL;
        if (!defaults[k] && k > 0 && defaults[k - 1])
            fail_at(p, line, "a parameter without a default follows one with a default");
        k++;
    }
    next(p);
    end_block(p);
    n->macro.n_params = k;
    n->macro.params = jn_alloc(p->a, (size_t)(k ? k : 1) * sizeof(char *));
    n->macro.defaults = jn_alloc(p->a, (size_t)(k ? k : 1) * sizeof(jn_node *));
    memcpy(n->macro.params, params, (size_t)k * sizeof(char *));
    memcpy(n->macro.defaults, defaults, (size_t)k * sizeof(jn_node *));
    static const char *const ends[] = {"endmacro", NULL};
    n->macro.body = parse_body(p, ends);
    next(p);
    if (cur(p)->type == JT_NAME) /* {% endmacro name %} */
        next(p);
    end_block(p);
    return n;
}

static jn_node *parse_statement(parser *p)
{
    int line = cur(p)->line;
    if (cur(p)->type != JT_NAME)
        unexpected(p, "a tag name");
    if (skip_name(p, "if"))
        return parse_if(p, line);
    if (skip_name(p, "for"))
        return parse_for(p, line);
    if (skip_name(p, "set"))
        return parse_set(p, line);
    if (skip_name(p, "macro"))
        return parse_macro(p, line);
    if (skip_name(p, "break") || skip_name(p, "continue")) {
        jn_node *n = node(p, p->lx.toks[p->pos - 1].p[0] == 'b' ? JS_BREAK : JS_CONTINUE, line);
        end_block(p);
        return n;
    }
    if (skip_name(p, "generation")) {
        /* Hugging Face marks the assistant's part for training with it:
         * for a prompt it is its body */
        static const char *const ends[] = {"endgeneration", NULL};
        end_block(p);
        jn_node *n = node(p, JS_BLOCK, line);
        n->block.body = parse_body(p, ends);
        next(p);
        end_block(p);
        return n;
    }
    fail_at(p, line, "the tag '%.*s' is not supported", (int)(cur(p)->len > 32 ? 32 : cur(p)->len), cur(p)->p);
}

static bool at_end_tag(parser *p, const char *const *ends)
{
    if (!ends || cur(p)->type != JT_BLOCK_BEGIN)
        return false;
    for (int i = 0; ends[i]; i++)
        if (tok_is(peek(p, 1), JT_NAME, ends[i]))
            return true;
    return false;
}

/* Statements until one of the end tags (its name left current) or, with
 * ends NULL, the end of the template. */
static jn_nodes parse_body(parser *p, const char *const *ends)
{
    enter(p);
    jn_nodes body = {0};
    for (;;) {
        const jn_tok *t = cur(p);
        if (t->type == JT_EOF) {
            if (ends) {
                int last = 0;
                while (ends[last + 1])
                    last++;
                fail_at(p, t->line, "unexpected end of template: '%s' was expected", ends[last]);
            }
            break;
        }
        if (at_end_tag(p, ends)) {
            next(p);
            break;
        }
        if (t->type == JT_DATA) {
            jn_node *n = node(p, JS_TEXT, t->line);
            n->text.p = t->p;
            n->text.len = t->len;
            nodes_add(p, &body, n);
            next(p);
        } else if (t->type == JT_VAR_BEGIN) {
            jn_node *n = node(p, JS_PRINT, t->line);
            next(p);
            n->expr = parse_tuple(p, true, false);
            expect(p, JT_VAR_END, "'}}'");
            nodes_add(p, &body, n);
        } else if (t->type == JT_BLOCK_BEGIN) {
            next(p);
            nodes_add(p, &body, parse_statement(p));
        } else {
            unexpected(p, "text or a tag");
        }
    }
    p->depth--;
    return body;
}

/* ---- the template ---- */

/* \r\n and \r to \n, one trailing newline off: Jinja2 does both before
 * lexing. */
static size_t normalise(char *dst, const char *src, size_t len)
{
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            dst[o++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            dst[o++] = src[i];
        }
    }
    if (o > 0 && dst[o - 1] == '\n')
        o--;
    dst[o] = '\0';
    return o;
}

static bool valid_utf8(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned char c = u[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!k || i + k > n)
            return false;
        uint32_t cp = k == 1 ? c : c & (0x7f >> k);
        for (size_t j = 1; j < k; j++) {
            if ((u[i + j] & 0xc0) != 0x80)
                return false;
            cp = (cp << 6) | (u[i + j] & 0x3f);
        }
        static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min[k] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        i += k;
    }
    return true;
}

int rt_jinja_parse(const char *src, size_t len, rt_jinja **out, char *err, size_t err_len)
{
    *out = NULL;
    if (err && err_len)
        err[0] = '\0';
    if (len > RT_JINJA_MAX_SOURCE) {
        snprintf(err, err_len, "the template is larger than %u bytes", RT_JINJA_MAX_SOURCE);
        return -EINVAL;
    }
    if (memchr(src, '\0', len) || !valid_utf8(src, len)) {
        snprintf(err, err_len, "the template is not UTF-8 text");
        return -EINVAL;
    }
    rt_jinja *t = calloc(1, sizeof(*t));
    if (!t) {
        snprintf(err, err_len, "out of memory parsing the template");
        return -ENOMEM;
    }
    jmp_buf fail;
    char dummy[8];
    volatile int rc = 0;
    t->arena = (jn_arena){.fail = &fail, .err = err ? err : dummy, .err_len = err ? err_len : sizeof(dummy),
                          .rc = (int *)&rc};
    parser *p = NULL;
    if (setjmp(fail)) {
        jn_arena_free(&t->arena);
        free(t);
        return rc ? rc : -EINVAL;
    }
    t->source = jn_alloc(&t->arena, len + 1);
    t->source_len = normalise(t->source, src, len);
    p = jn_alloc(&t->arena, sizeof(*p));
    p->a = &t->arena;
    p->lx = (jn_lexer){.src = t->source, .len = t->source_len, .arena = &t->arena, .err = t->arena.err,
                       .err_len = t->arena.err_len};
    jn_lex(&p->lx);
    t->body = parse_body(p, NULL);
    t->arena.fail = NULL;
    *out = t;
    return 0;
}

void rt_jinja_free(rt_jinja *t)
{
    if (!t)
        return;
    jn_arena_free(&t->arena);
    free(t);
}

bool rt_jinja_uses(const rt_jinja *t, const char *name)
{
    size_t n = strlen(name);
    for (const char *s = t->source; (s = strstr(s, name)); s += n) {
        bool left = s == t->source || !(s[-1] == '_' || (s[-1] >= 'a' && s[-1] <= 'z') ||
                                         (s[-1] >= 'A' && s[-1] <= 'Z') || (s[-1] >= '0' && s[-1] <= '9'));
        char r = s[n];
        bool right = !(r == '_' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9'));
        if (left && right)
            return true;
    }
    return false;
}
