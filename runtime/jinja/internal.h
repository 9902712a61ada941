/* The Jinja renderer's shared types (see jinja.h): the arena, values, the
 * syntax tree and the render state. Not for callers.
 *
 * Memory: a parsed template lives in one arena (its tree, names and
 * constants); a render allocates every value in an arena of its own,
 * freed at once when it ends. Values are immutable but for namespaces, so
 * they share freely (a slice of a list or a string points into it).
 *
 * Errors: the lexer, parser and evaluator leave through longjmp to the one
 * setjmp of rt_jinja_parse or rt_jinja_render, having written the reason.
 * Nothing but arena memory is held in between, so the jump leaks nothing:
 * the arenas and the output buffer are freed by the function that set the
 * jump. */
#ifndef RT_JINJA_INTERNAL_H
#define RT_JINJA_INTERNAL_H

#include "runtime/jinja/jinja.h"

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- arena ---- */

typedef struct jn_chunk jn_chunk;

typedef struct jn_arena {
    jn_chunk *head;
    size_t used, limit; /* bytes taken from malloc; limit 0: none */
    jmp_buf *fail;      /* where an allocation that fails jumps... */
    char *err;          /* ...having written why here */
    size_t err_len;
    int *rc;
} jn_arena;

void *jn_alloc(jn_arena *a, size_t n); /* zeroed, 8-aligned; jumps on failure */
char *jn_strdup(jn_arena *a, const char *s, size_t n);
void jn_arena_free(jn_arena *a);

/* ---- values ---- */

typedef enum jv_kind {
    JV_UNDEF = 0, /* Jinja's undefined: prints empty, false, iterates nothing */
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST, /* also tuples (is_tuple) */
    JV_DICT,
    JV_NS,     /* namespace(): the one mutable value */
    JV_LOOP,   /* a for loop's `loop` */
    JV_MACRO,  /* a macro, bound to the frame it was defined in */
    JV_FUNC,   /* a global function (range, namespace, ...) */
    JV_METHOD, /* a method bound to its receiver (str.split, dict.items) */
} jv_kind;

typedef struct jstr jstr;
typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jloop jloop;
typedef struct jmacro jmacro;
typedef struct jmethod jmethod;

typedef struct jv {
    uint8_t kind;
    union {
        bool b;
        int64_t i;
        double f;
        const jstr *s;
        const jlist *l;
        jdict *d; /* JV_DICT and JV_NS */
        jloop *loop;
        const jmacro *macro;
        int func;
        const jmethod *method;
        const char *undef_name; /* JV_UNDEF: what was looked up, for messages (may be NULL) */
    };
} jv;

/* A string: bytes (not NUL-terminated, valid UTF-8), and the byte ranges
 * of them that came from plain input. */
typedef struct jspan {
    uint32_t off, len;
} jspan;

struct jstr {
    const char *p;
    uint32_t len;
    uint32_t n_spans;
    const jspan *spans;
    bool ascii; /* every byte < 0x80: code points are bytes */
};

struct jlist {
    uint32_t n;
    bool is_tuple;
    const jv *items;
};

struct jdict {
    uint32_t n, cap;
    jv *keys, *vals; /* insertion order */
};

struct jmethod {
    jv self;
    int id;
};

/* ---- the syntax tree ---- */

typedef enum jn_op {
    /* expressions */
    JE_CONST, JE_NAME, JE_ATTR, JE_ITEM, JE_SLICE, JE_CALL, JE_FILTER, JE_TEST, JE_NOT, JE_NEG, JE_POS,
    JE_BIN, JE_AND, JE_OR, JE_COMPARE, JE_COND, JE_LIST, JE_TUPLE, JE_DICT, JE_CONCAT,
    /* statements */
    JS_TEXT, JS_PRINT, JS_IF, JS_FOR, JS_SET, JS_SET_BLOCK, JS_MACRO, JS_BREAK, JS_CONTINUE, JS_BLOCK,
} jn_op;

typedef enum jn_binop { JB_ADD, JB_SUB, JB_MUL, JB_DIV, JB_FLOORDIV, JB_MOD, JB_POW } jn_binop;
typedef enum jn_cmp { JC_EQ, JC_NE, JC_LT, JC_LE, JC_GT, JC_GE, JC_IN, JC_NOTIN } jn_cmp;

typedef struct jn_node jn_node;

/* A list of nodes (statements of a body, arguments). */
typedef struct jn_nodes {
    jn_node **v;
    int n;
} jn_nodes;

struct jn_node {
    uint8_t op;
    int line;
    union {
        jv k;                 /* JE_CONST */
        const char *name;     /* JE_NAME */
        struct {              /* JE_TEXT */
            const char *p;
            size_t len;
        } text;
        struct { /* JE_ATTR (name), JE_ITEM (a), JE_SLICE (a, b, c: any NULL), JE_NOT/NEG/POS (obj) */
            jn_node *obj;
            const char *name;
            jn_node *a, *b, *c;
        } sub;
        struct { /* JE_CALL (fn), JE_FILTER and JE_TEST (obj, id; negated for a test) */
            jn_node *fn;
            jn_node *obj;
            int id;
            bool negated;
            jn_nodes args;
            const char **kw_names; /* n_kw of them, their values after the positional ones in args */
            int n_kw;
        } call;
        struct { /* JE_BIN (binop in kind), JE_AND, JE_OR, JE_CONCAT (items), JE_COND (a if b else c) */
            int kind;
            jn_node *a, *b, *c;
            jn_nodes items;
        } bin;
        struct { /* JE_COMPARE: items[0] ops[0] items[1] ops[1] ... */
            jn_nodes items;
            uint8_t *ops;
        } cmp;
        struct { /* JE_LIST, JE_TUPLE, JE_DICT (keys and values interleaved) */
            jn_nodes items;
        } seq;
        struct { /* JS_IF: conds[i] -> bodies[i], then else_body (may be empty) */
            jn_nodes conds;
            jn_nodes *bodies;
            jn_nodes else_body;
        } if_;
        struct { /* JS_FOR */
            const char **targets;
            int n_targets;
            jn_node *iter, *filter;
            jn_nodes body, else_body;
        } for_;
        struct { /* JS_SET (value), JS_SET_BLOCK (body): targets, or ns.attr */
            const char **targets;
            int n_targets;
            const char *attr; /* non-NULL: targets[0].attr = value */
            jn_node *value;
            jn_nodes body;
        } set;
        struct { /* JS_MACRO */
            const char *name;
            const char **params;
            jn_node **defaults; /* NULL where a parameter has none */
            int n_params;
            jn_nodes body;
        } macro;
        struct { /* JS_BLOCK (generation): just a body */
            jn_nodes body;
        } block;
        jn_node *expr; /* JS_PRINT */
    };
};

struct rt_jinja {
    jn_arena arena;
    jn_nodes body;
    char *source; /* the normalised source (names are looked up in it) */
    size_t source_len;
};

/* ---- the render state ---- */

typedef struct jframe jframe;
struct jframe {
    jframe *parent;
    uint32_t n, cap;
    const char **names;
    jv *vals;
};

struct jmacro {
    const jn_node *def;
    jframe *scope;
};

struct jloop {
    const jlist *items;
    uint32_t i;
};

/* One growing string: the output, or a set block's or a macro's text. */
typedef struct jbuf {
    char *p;
    size_t len, cap;
    jspan *spans;
    uint32_t n_spans, cap_spans;
} jbuf;

typedef struct jctx {
    jn_arena arena;
    jmp_buf fail;
    char *err;
    size_t err_len;
    int rc;
    int line; /* of what is being evaluated, for messages */
    jframe *root;
    const rt_jinja_input *in;
    jdict *plain_vars, *trusted_vars;
    rt_jinja_limits lim;
    uint64_t steps;
    int depth;
    jbuf *out; /* where text goes now */
    size_t out_total; /* bytes written to all buffers, against max_output */
    time_t now;
} jctx;

/* Fails the render: "template line N: <fmt>" with rc -EINVAL. */
_Noreturn void jn_fail(jctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Fails with exactly this message (raise_exception) or this rc. */
_Noreturn void jn_fail_raw(jctx *c, int rc, const char *msg);
/* Charges n steps of work; fails past the bound. */
void jn_cost(jctx *c, uint64_t n);

/* values.c */
jv jv_undef(const char *name);
jv jv_none(void);
jv jv_bool(bool b);
jv jv_int(int64_t i);
jv jv_float(double f);
jv jv_str(const jstr *s);
jv jv_list(const jlist *l);
jv jv_func(int id);
const jstr *js_new(jn_arena *a, const char *p, size_t n, bool plain);
const jstr *js_lit(jn_arena *a, const char *cstr);
const jstr *js_sub(jn_arena *a, const jstr *s, size_t off, size_t n); /* bytes [off, off+n), spans clipped */
const jstr *js_taint_like(jn_arena *a, const jstr *from, const char *p, size_t n); /* plain if from had any */
jv jv_strv(jn_arena *a, const char *p, size_t n);
jlist *jl_new(jn_arena *a, uint32_t n);
jdict *jd_new(jn_arena *a);
void jd_set(jn_arena *a, jdict *d, jv key, jv val);
bool jd_get(const jdict *d, jv key, jv *val);
bool jd_get_str(const jdict *d, const char *key, size_t len, jv *val);
bool jv_truthy(jv v);
bool jv_equal(jv a, jv b);
int jv_compare(jctx *c, jv a, jv b); /* <0, 0, >0; fails on types Python cannot order */
const char *jv_type_name(jv v);
/* str(v) and repr(v), as Python writes them, appended to b. */
void jb_str(jctx *c, jbuf *b, jv v);
void jb_repr(jctx *c, jbuf *b, jv v);
const jstr *jv_to_str(jctx *c, jv v); /* str(v) as a string (no copy for a string) */
/* json.dumps(v, ensure_ascii=False, indent=indent (<0: none), separators, sort_keys) */
void jb_json(jctx *c, jbuf *b, jv v, int indent, const char *item_sep, const char *key_sep, bool sort_keys);
jv jv_from_json(jctx *c, const json_t *j, bool plain);

/* buffers (values.c) */
void jb_add(jctx *c, jbuf *b, const char *p, size_t n);
void jb_addc(jctx *c, jbuf *b, const char *s);
void jb_addstr(jctx *c, jbuf *b, const jstr *s); /* keeps its spans */
const jstr *jb_finish(jctx *c, jbuf *b); /* the buffer as a string in the arena */

/* utf8 helpers (values.c) */
size_t ju_len(const jstr *s);                             /* code points */
size_t ju_offset(const jstr *s, size_t cp);               /* byte offset of code point cp (<= len) */
bool ju_isspace_at(const char *p, size_t n, size_t *adv); /* Python's str.isspace for one code point */

/* lex.c and parse.c */
typedef struct jn_parser jn_parser;
int jn_parse(rt_jinja *t, char *err, size_t err_len);

/* builtins.c: filters, tests, global functions and methods by name */
int jn_filter_id(const char *name);
int jn_test_id(const char *name);
int jn_func_id(const char *name);
int jn_method_id(jv self, const char *name); /* -1: no such method */
jv jn_call_filter(jctx *c, int id, jv v, const jv *args, int n_args, const char **kw, const jv *kw_vals, int n_kw);
bool jn_call_test(jctx *c, int id, jv v, const jv *args, int n_args);
jv jn_call_func(jctx *c, int id, const jv *args, int n_args, const char **kw, const jv *kw_vals, int n_kw);
jv jn_call_method(jctx *c, const jmethod *m, const jv *args, int n_args, const char **kw, const jv *kw_vals,
                  int n_kw);

/* eval.c: attribute and item access with Jinja's fall-backs, iteration */
jv jn_getattr(jctx *c, jv obj, const char *name);
jv jn_getitem(jctx *c, jv obj, jv key);
const jlist *jn_iterate(jctx *c, jv v); /* list(v); fails for what Python cannot iterate */

#endif
