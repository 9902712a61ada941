/* GBNF to byte-level rules (see grammar.h). Classes become UTF-8 byte
 * sequences (RE2's range splitting); groups and classes of one
 * alternative are spliced into the sequence that holds them; repetitions
 * are right-recursive rules whose recursion ends their alternative, so
 * the matcher runs them as tail calls; a rule that could recurse without
 * consuming a byte is refused. */
#include "runtime/grammar/internal.h"

#include <errno.h>
#include <stdarg.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- building ---- */

typedef struct seq {
    gel *v;
    uint32_t n, cap;
} seq;

typedef struct rule {
    char *name; /* NULL for a synthesized one */
    seq *alts;
    uint32_t n_alts, cap_alts;
    bool defined;
    int line;
} rule;

typedef struct builder {
    const char *src, *p, *end;
    int line;
    rule *rules;
    uint32_t n_rules, cap_rules;
    uint32_t (*sets)[8];
    uint32_t n_sets, cap_sets;
    size_t n_elems;
    char *err;
    size_t err_len;
    int rc;
    jmp_buf fail;
    int depth;
    /* Every seq's and item's array while it lives (grow_tmp, tmp_free):
     * a failure longjmps out of any depth of the parse, and the frames it
     * leaves held some; builder_free frees what is left. */
    void **tmp;
    uint32_t n_tmp, cap_tmp;
    bool *nul;      /* the checks' arrays, here rather than in locals */
    uint8_t *state; /* that a longjmp would leave indeterminate */
} builder;

static _Noreturn void fail(builder *b, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static _Noreturn void fail(builder *b, int rc, const char *fmt, ...)
{
    int n = rc == -ENOMEM ? 0 : snprintf(b->err, b->err_len, "grammar line %d: ", b->line);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < b->err_len)
        vsnprintf(b->err + n, b->err_len - (size_t)n, fmt, ap);
    va_end(ap);
    b->rc = rc;
    longjmp(b->fail, 1);
}

static void *grow(builder *b, void *p, uint32_t *cap, uint32_t need, size_t size)
{
    if (need <= *cap)
        return p;
    uint32_t c = *cap ? *cap * 2 : 8;
    while (c < need)
        c *= 2;
    void *q = realloc(p, (size_t)c * size);
    if (!q)
        fail(b, -ENOMEM, "out of memory compiling the grammar");
    *cap = c;
    return q;
}

/* grow() for a seq's or an item's array, registered in b->tmp. */
static void *grow_tmp(builder *b, void *p, uint32_t *cap, uint32_t need, size_t size)
{
    if (need <= *cap)
        return p;
    if (!p)
        b->tmp = grow(b, b->tmp, &b->cap_tmp, b->n_tmp + 1, sizeof(void *));
    void *q = grow(b, p, cap, need, size);
    if (!p) {
        b->tmp[b->n_tmp++] = q;
        return q;
    }
    for (uint32_t i = b->n_tmp; i-- > 0;) /* the newest arrays grow most */
        if (b->tmp[i] == p) {
            b->tmp[i] = q;
            break;
        }
    return q;
}

static void tmp_free(builder *b, void *p)
{
    if (!p)
        return;
    for (uint32_t i = b->n_tmp; i-- > 0;)
        if (b->tmp[i] == p) {
            b->tmp[i] = b->tmp[--b->n_tmp];
            break;
        }
    free(p);
}

static void seq_add(builder *b, seq *s, gel e)
{
    if (++b->n_elems > RT_GRAMMAR_MAX_ELEMS)
        fail(b, -EINVAL, "the grammar is too large (more than %u elements)", RT_GRAMMAR_MAX_ELEMS);
    s->v = grow_tmp(b, s->v, &s->cap, s->n + 1, sizeof(gel));
    s->v[s->n++] = e;
}

static void seq_cat(builder *b, seq *s, const seq *t)
{
    for (uint32_t i = 0; i < t->n; i++)
        seq_add(b, s, t->v[i]);
}

static uint32_t new_rule(builder *b, const char *name, size_t n)
{
    b->rules = grow(b, b->rules, &b->cap_rules, b->n_rules + 1, sizeof(rule));
    rule *r = &b->rules[b->n_rules];
    memset(r, 0, sizeof(*r));
    if (name) {
        r->name = malloc(n + 1);
        if (!r->name)
            fail(b, -ENOMEM, "out of memory compiling the grammar");
        memcpy(r->name, name, n);
        r->name[n] = '\0';
    }
    r->line = b->line;
    return b->n_rules++;
}

static uint32_t rule_named(builder *b, const char *name, size_t n)
{
    for (uint32_t i = 0; i < b->n_rules; i++)
        if (b->rules[i].name && strlen(b->rules[i].name) == n && !memcmp(b->rules[i].name, name, n))
            return i;
    return new_rule(b, name, n);
}

/* Adds an alternative (taking s's storage). */
static void rule_add_alt(builder *b, uint32_t r, seq *s)
{
    rule *ru = &b->rules[r];
    ru->alts = grow(b, ru->alts, &ru->cap_alts, ru->n_alts + 1, sizeof(seq));
    ru->alts[ru->n_alts++] = *s;
    *s = (seq){0};
}

static uint32_t add_set(builder *b, const uint32_t set[8])
{
    for (uint32_t i = 0; i < b->n_sets; i++)
        if (!memcmp(b->sets[i], set, 32))
            return i;
    b->sets = grow(b, b->sets, &b->cap_sets, b->n_sets + 1, 32);
    memcpy(b->sets[b->n_sets], set, 32);
    return b->n_sets++;
}

static gel byte_range(builder *b, unsigned lo, unsigned hi)
{
    uint32_t set[8] = {0};
    for (unsigned c = lo; c <= hi; c++)
        set[c >> 5] |= 1u << (c & 31);
    return (gel){GE_CHARS, add_set(b, set)};
}

/* ---- items: what one syntactic unit stands for, as alternatives ---- */

typedef struct item {
    seq *alts;
    uint32_t n, cap;
} item;

static void item_free(builder *b, item *it)
{
    for (uint32_t i = 0; i < it->n; i++)
        tmp_free(b, it->alts[i].v);
    tmp_free(b, it->alts);
    *it = (item){0};
}

static void item_add(builder *b, item *it, seq *s)
{
    it->alts = grow_tmp(b, it->alts, &it->cap, it->n + 1, sizeof(seq));
    it->alts[it->n++] = *s;
    *s = (seq){0};
}

/* The item as one element run: spliced when it has one alternative, else
 * a reference to a new rule holding them (the item is consumed). */
static void item_into(builder *b, item *it, seq *out)
{
    if (it->n == 1) {
        seq_cat(b, out, &it->alts[0]);
        item_free(b, it);
        return;
    }
    uint32_t r = new_rule(b, NULL, 0);
    for (uint32_t i = 0; i < it->n; i++)
        rule_add_alt(b, r, &it->alts[i]);
    tmp_free(b, it->alts);
    *it = (item){0};
    seq_add(b, out, (gel){GE_REF, r});
}

static seq seq_copy(builder *b, const seq *s)
{
    seq c = {0};
    seq_cat(b, &c, s);
    return c;
}

/* R ::= alt_1 R | ... | alt_n R | (ε when optional_end): x* as a tail call. */
static uint32_t loop_rule(builder *b, const item *it)
{
    uint32_t r = new_rule(b, NULL, 0);
    for (uint32_t i = 0; i < it->n; i++) {
        seq s = seq_copy(b, &it->alts[i]);
        seq_add(b, &s, (gel){GE_REF, r});
        rule_add_alt(b, r, &s);
    }
    seq empty = {0};
    rule_add_alt(b, r, &empty);
    return r;
}

/* x{m,n} (max < 0: no bound) as one item. */
static void repeat(builder *b, item *it, long min, long max)
{
    item out = {0};
    seq s = {0};
    for (long i = 0; i < min; i++) {
        item copy = {0};
        for (uint32_t k = 0; k < it->n; k++) {
            seq c = seq_copy(b, &it->alts[k]);
            item_add(b, &copy, &c);
        }
        item_into(b, &copy, &s);
    }
    if (max < 0) {
        seq_add(b, &s, (gel){GE_REF, loop_rule(b, it)});
    } else if (max > min) {
        /* O_k ::= x O_{k+1} | ε, built from the innermost out */
        uint32_t next = UINT32_MAX;
        for (long k = max - min; k > 0; k--) {
            uint32_t r = new_rule(b, NULL, 0);
            for (uint32_t a = 0; a < it->n; a++) {
                seq c = seq_copy(b, &it->alts[a]);
                if (next != UINT32_MAX)
                    seq_add(b, &c, (gel){GE_REF, next});
                rule_add_alt(b, r, &c);
            }
            seq empty = {0};
            rule_add_alt(b, r, &empty);
            next = r;
        }
        seq_add(b, &s, (gel){GE_REF, next});
    }
    item_free(b, it);
    item_add(b, &out, &s);
    *it = out;
}

/* ---- UTF-8 classes ---- */

static int utf8_encode(uint32_t cp, uint8_t *o)
{
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xc0 | (cp >> 6));
        o[1] = (uint8_t)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xe0 | (cp >> 12));
        o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (uint8_t)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (uint8_t)(0xf0 | (cp >> 18));
    o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (uint8_t)(0x80 | (cp & 0x3f));
    return 4;
}

/* Alternatives for the code points [lo, hi], all of one encoded length
 * n, as byte-range runs (RE2's split: where lo and hi differ above the
 * last k continuation bytes, cut at the boundaries those bytes span). */
static void utf8_range(builder *b, item *it, uint32_t lo, uint32_t hi)
{
    static const uint32_t max_len[] = {0x7f, 0x7ff, 0xffff, 0x10ffff};
    for (int k = 0; k < 3; k++)
        if (lo <= max_len[k] && hi > max_len[k]) {
            utf8_range(b, it, lo, max_len[k]);
            utf8_range(b, it, max_len[k] + 1, hi);
            return;
        }
    uint8_t L[4], H[4];
    int n = utf8_encode(lo, L);
    utf8_encode(hi, H);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                utf8_range(b, it, lo, lo | m);
                utf8_range(b, it, (lo | m) + 1, hi);
                return;
            }
            if ((hi & m) != m) {
                utf8_range(b, it, lo, (hi & ~m) - 1);
                utf8_range(b, it, hi & ~m, hi);
                return;
            }
        }
    }
    seq s = {0};
    for (int i = 0; i < n; i++)
        seq_add(b, &s, byte_range(b, L[i], H[i]));
    item_add(b, it, &s);
}

typedef struct cprange {
    uint32_t lo, hi;
} cprange;

static int by_lo(const void *a, const void *c)
{
    const cprange *x = a, *y = c;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* The class's ranges (sorted, merged; negated over all code points but
 * the surrogates) as alternatives: one byte set for the ASCII ones. */
static void class_item(builder *b, cprange *r, int n, bool negate, item *it)
{
    qsort(r, (size_t)n, sizeof(*r), by_lo);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m && r[i].lo <= r[m - 1].hi + 1) {
            if (r[i].hi > r[m - 1].hi)
                r[m - 1].hi = r[i].hi;
        } else {
            r[m++] = r[i];
        }
    }
    cprange out[260];
    int k = 0;
    if (negate) {
        uint32_t next = 0;
        for (int i = 0; i < m && k < 258; i++) {
            if (r[i].lo > next)
                out[k++] = (cprange){next, r[i].lo - 1};
            next = r[i].hi + 1;
        }
        if (next <= 0x10ffff)
            out[k++] = (cprange){next, 0x10ffff};
    } else {
        memcpy(out, r, (size_t)m * sizeof(*r));
        k = m;
    }
    uint32_t ascii[8] = {0};
    bool any_ascii = false;
    for (int i = 0; i < k; i++) {
        for (uint32_t c = out[i].lo; c <= out[i].hi && c < 0x80; c++) {
            ascii[c >> 5] |= 1u << (c & 31);
            any_ascii = true;
        }
        uint32_t lo = out[i].lo < 0x80 ? 0x80 : out[i].lo, hi = out[i].hi;
        /* surrogates are no characters */
        if (lo <= hi && lo <= 0xdfff && hi >= 0xd800) {
            if (lo < 0xd800)
                utf8_range(b, it, lo, 0xd7ff);
            if (hi > 0xdfff)
                utf8_range(b, it, 0xe000, hi);
        } else if (lo <= hi) {
            utf8_range(b, it, lo, hi);
        }
    }
    if (any_ascii) {
        seq s = {0};
        seq_add(b, &s, (gel){GE_CHARS, add_set(b, ascii)});
        item_add(b, it, &s);
    }
    if (it->n == 0)
        fail(b, -EINVAL, "an empty character class");
}

/* ---- the syntax ---- */

static void skip_space(builder *b, bool newlines)
{
    while (b->p < b->end) {
        char c = *b->p;
        if (c == '#') {
            while (b->p < b->end && *b->p != '\n')
                b->p++;
        } else if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
            b->p++;
        } else if (c == '\n') {
            /* a newline continues a rule when the next line starts indented or with | */
            const char *q = b->p + 1;
            while (q < b->end && (*q == ' ' || *q == '\t' || *q == '\r'))
                q++;
            bool cont = q < b->end && (*q == '|' || q > b->p + 1) && *q != '\n';
            if (!cont)
                return;
            b->line++;
            b->p++;
        } else {
            return;
        }
        if (b->p > b->src && b->p[-1] == '\n' && newlines)
            b->line++;
    }
}

static bool is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static int hexv(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* One character of a literal or class, escapes read; its code point. */
static uint32_t read_char(builder *b)
{
    if (b->p >= b->end)
        fail(b, -EINVAL, "unexpected end of grammar");
    unsigned char c = (unsigned char)*b->p;
    if (c == '\\') {
        b->p++;
        if (b->p >= b->end)
            fail(b, -EINVAL, "unexpected end of grammar");
        char e = *b->p++;
        int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (digits) {
            uint32_t v = 0;
            for (int i = 0; i < digits; i++) {
                int h = b->p < b->end ? hexv(*b->p) : -1;
                if (h < 0)
                    fail(b, -EINVAL, "a bad \\%c escape", e);
                v = v * 16 + (uint32_t)h;
                b->p++;
            }
            if (v > 0x10ffff)
                fail(b, -EINVAL, "a code point past U+10FFFF");
            return v;
        }
        switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '0': return 0;
        default: return (unsigned char)e; /* \\ \" \] \[ \- and the like */
        }
    }
    /* a UTF-8 character */
    size_t k = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    /* well-formed only: the matcher reads the text's bytes as the code
     * points' UTF-8, which a stray or overlong sequence is not
     * (fuzz_grammar: a class with one allowed a token accept refused) */
    if (b->p + k > b->end || (c >= 0x80 && c < 0xc2) || c > 0xf4)
        fail(b, -EINVAL, "bad UTF-8");
    uint32_t cp = k == 1 ? c : c & (0xff >> (k + 1));
    for (size_t i = 1; i < k; i++) {
        if (((unsigned char)b->p[i] & 0xc0) != 0x80)
            fail(b, -EINVAL, "bad UTF-8");
        cp = (cp << 6) | ((unsigned char)b->p[i] & 0x3f);
    }
    if ((k == 3 && cp < 0x800) || (k == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff))
        fail(b, -EINVAL, "bad UTF-8");
    b->p += k;
    return cp;
}

static void parse_alternatives(builder *b, item *out);

static void parse_literal(builder *b, item *it)
{
    seq s = {0};
    b->p++;
    while (b->p < b->end && *b->p != '"') {
        if (*b->p == '\n')
            fail(b, -EINVAL, "a newline in a literal");
        uint8_t u[4];
        int n = utf8_encode(read_char(b), u);
        for (int i = 0; i < n; i++)
            seq_add(b, &s, byte_range(b, u[i], u[i]));
    }
    if (b->p >= b->end)
        fail(b, -EINVAL, "an unterminated literal");
    b->p++;
    item_add(b, it, &s);
}

static void parse_class(builder *b, item *it)
{
    b->p++;
    bool negate = b->p < b->end && *b->p == '^';
    if (negate)
        b->p++;
    cprange r[256];
    int n = 0;
    while (b->p < b->end && *b->p != ']') {
        if (n == 256)
            fail(b, -EINVAL, "a character class with too many ranges");
        uint32_t lo = read_char(b), hi = lo;
        if (b->p + 1 < b->end && *b->p == '-' && b->p[1] != ']') {
            b->p++;
            hi = read_char(b);
        }
        if (hi < lo)
            fail(b, -EINVAL, "a range whose end is before its start");
        r[n++] = (cprange){lo, hi};
    }
    if (b->p >= b->end)
        fail(b, -EINVAL, "an unterminated character class");
    b->p++;
    class_item(b, r, n, negate, it);
}

static long read_number(builder *b)
{
    long v = 0;
    if (b->p >= b->end || *b->p < '0' || *b->p > '9')
        fail(b, -EINVAL, "a number was expected");
    while (b->p < b->end && *b->p >= '0' && *b->p <= '9') {
        v = v * 10 + (*b->p++ - '0');
        if (v > 100000)
            fail(b, -EINVAL, "a repetition count too large");
    }
    return v;
}

/* A primary with its postfix operators. */
static void parse_item(builder *b, item *it)
{
    char c = *b->p;
    if (c == '"') {
        parse_literal(b, it);
    } else if (c == '[') {
        parse_class(b, it);
    } else if (c == '.') {
        b->p++;
        cprange r = {0, 0x10ffff};
        class_item(b, &r, 1, false, it);
    } else if (c == '(') {
        b->p++;
        if (++b->depth > 100)
            fail(b, -EINVAL, "groups nested too deep");
        parse_alternatives(b, it);
        b->depth--;
        if (b->p >= b->end || *b->p != ')')
            fail(b, -EINVAL, "')' was expected");
        b->p++;
    } else if (is_name_char(c)) {
        const char *s = b->p;
        while (b->p < b->end && is_name_char(*b->p))
            b->p++;
        seq q = {0};
        seq_add(b, &q, (gel){GE_REF, rule_named(b, s, (size_t)(b->p - s))});
        item_add(b, it, &q);
    } else {
        fail(b, -EINVAL, "unexpected '%c'", c >= 0x20 && c < 0x7f ? c : '?');
    }
    for (;;) {
        skip_space(b, false);
        if (b->p >= b->end)
            return;
        c = *b->p;
        if (c == '*' || c == '+' || c == '?') {
            b->p++;
            repeat(b, it, c == '+' ? 1 : 0, c == '?' ? 1 : -1);
        } else if (c == '{') {
            b->p++;
            skip_space(b, false);
            long min = read_number(b), max = min;
            skip_space(b, false);
            if (b->p < b->end && *b->p == ',') {
                b->p++;
                skip_space(b, false);
                max = b->p < b->end && *b->p == '}' ? -1 : read_number(b);
                skip_space(b, false);
            }
            if (b->p >= b->end || *b->p != '}')
                fail(b, -EINVAL, "'}' was expected");
            b->p++;
            if (max >= 0 && max < min)
                fail(b, -EINVAL, "a repetition whose maximum is below its minimum");
            repeat(b, it, min, max);
        } else {
            return;
        }
    }
}

/* Sequences separated by |, up to ')' or the end of the rule. */
static void parse_alternatives(builder *b, item *out)
{
    seq s = {0};
    for (;;) {
        skip_space(b, false);
        if (b->p >= b->end || *b->p == '\n' || *b->p == ')' || *b->p == '|') {
            item_add(b, out, &s);
            if (b->p < b->end && *b->p == '|') {
                b->p++;
                continue;
            }
            return;
        }
        item it = {0};
        parse_item(b, &it);
        item_into(b, &it, &s);
    }
}

static void parse_rule(builder *b)
{
    const char *s = b->p;
    while (b->p < b->end && is_name_char(*b->p))
        b->p++;
    if (b->p == s)
        fail(b, -EINVAL, "a rule name was expected");
    uint32_t r = rule_named(b, s, (size_t)(b->p - s));
    if (b->rules[r].defined)
        fail(b, -EINVAL, "the rule '%s' is defined twice", b->rules[r].name);
    b->rules[r].defined = true;
    b->rules[r].line = b->line;
    skip_space(b, false);
    if (b->end - b->p < 3 || memcmp(b->p, "::=", 3))
        fail(b, -EINVAL, "'::=' was expected");
    b->p += 3;
    item alts = {0};
    parse_alternatives(b, &alts);
    for (uint32_t i = 0; i < alts.n; i++)
        rule_add_alt(b, r, &alts.alts[i]);
    tmp_free(b, alts.alts);
}

/* ---- checks ---- */

/* Whether each rule can match the empty string (a fixed point). */
static bool *nullable(builder *b)
{
    bool *nul = calloc(b->n_rules, 1);
    if (!nul)
        fail(b, -ENOMEM, "out of memory compiling the grammar");
    for (bool changed = true; changed;) {
        changed = false;
        for (uint32_t r = 0; r < b->n_rules; r++) {
            if (nul[r])
                continue;
            for (uint32_t a = 0; a < b->rules[r].n_alts && !nul[r]; a++) {
                const seq *s = &b->rules[r].alts[a];
                bool all = true;
                for (uint32_t i = 0; i < s->n && all; i++)
                    all = s->v[i].type == GE_REF && nul[s->v[i].arg];
                if (all)
                    nul[r] = changed = true;
            }
        }
    }
    return nul;
}

/* Refuses a rule that reaches itself before consuming a byte. */
static void check_left_recursion(builder *b, const bool *nul, uint32_t r, uint8_t *state)
{
    if (state[r] == 2)
        return;
    if (state[r] == 1) {
        b->line = b->rules[r].line;
        fail(b, -EINVAL, "the rule '%s' can recur without consuming anything",
             b->rules[r].name ? b->rules[r].name : "(a group)");
    }
    state[r] = 1;
    for (uint32_t a = 0; a < b->rules[r].n_alts; a++) {
        const seq *s = &b->rules[r].alts[a];
        for (uint32_t i = 0; i < s->n; i++) {
            if (s->v[i].type != GE_REF)
                break;
            check_left_recursion(b, nul, s->v[i].arg, state);
            if (!nul[s->v[i].arg])
                break;
        }
    }
    state[r] = 2;
}

/* Refuses a rule that no text completes: each of its alternatives needs
 * such a rule again (root ::= "a" root). The matcher would follow it for
 * ever, and its masks and its stacks part ways (fuzz_grammar). b->state
 * is the fixed point's scratch (1: completes). */
static void check_productive(builder *b)
{
    uint8_t *ok = b->state;
    memset(ok, 0, b->n_rules);
    for (bool changed = true; changed;) {
        changed = false;
        for (uint32_t r = 0; r < b->n_rules; r++)
            for (uint32_t a = 0; a < b->rules[r].n_alts && !ok[r]; a++) {
                const seq *s = &b->rules[r].alts[a];
                bool all = true;
                for (uint32_t i = 0; i < s->n && all; i++)
                    all = s->v[i].type != GE_REF || ok[s->v[i].arg];
                if (all)
                    ok[r] = changed = true;
            }
    }
    for (uint32_t r = 0; r < b->n_rules; r++)
        if (!ok[r]) {
            b->line = b->rules[r].line;
            fail(b, -EINVAL, "the rule '%s' can never end: each of its alternatives needs it again",
                 b->rules[r].name ? b->rules[r].name : "(a group)");
        }
}

/* ---- flattening ---- */

static rt_grammar *flatten(builder *b, const rt_gvocab *v, uint32_t root)
{
    size_t n_el = 0, n_alts = 0;
    for (uint32_t r = 0; r < b->n_rules; r++)
        for (uint32_t a = 0; a < b->rules[r].n_alts; a++) {
            n_el += b->rules[r].alts[a].n + 1;
            n_alts++;
        }
    rt_grammar *g = calloc(1, sizeof(*g));
    if (!g)
        return NULL;
    g->el = malloc(n_el * sizeof(gel));
    g->alts = malloc((n_alts ? n_alts : 1) * sizeof(uint32_t));
    g->alt_off = malloc((b->n_rules + 1) * sizeof(uint32_t));
    g->sets = malloc((b->n_sets ? b->n_sets : 1) * 32);
    if (!g->el || !g->alts || !g->alt_off || !g->sets) {
        free(g->el);
        free(g->alts);
        free(g->alt_off);
        free(g->sets);
        free(g);
        return NULL;
    }
    uint32_t e = 0, k = 0;
    for (uint32_t r = 0; r < b->n_rules; r++) {
        g->alt_off[r] = k;
        for (uint32_t a = 0; a < b->rules[r].n_alts; a++) {
            g->alts[k++] = e;
            if (b->rules[r].alts[a].n) /* an empty alternative has no array */
                memcpy(g->el + e, b->rules[r].alts[a].v, b->rules[r].alts[a].n * sizeof(gel));
            e += b->rules[r].alts[a].n;
            g->el[e++] = (gel){GE_END, 0};
        }
    }
    g->alt_off[b->n_rules] = k;
    g->n_el = e;
    if (b->n_sets)
        memcpy(g->sets, b->sets, (size_t)b->n_sets * 32);
    g->n_sets = b->n_sets;
    g->n_rules = b->n_rules;
    g->root = root;
    g->v = v;
    atomic_init(&g->refs, 1);
    pthread_mutex_init(&g->mu, NULL);
    return g;
}

static void builder_free(builder *b)
{
    for (uint32_t i = 0; i < b->n_tmp; i++) /* the rules' alternatives' too */
        free(b->tmp[i]);
    free(b->tmp);
    free(b->nul);
    free(b->state);
    for (uint32_t r = 0; r < b->n_rules; r++) {
        free(b->rules[r].alts);
        free(b->rules[r].name);
    }
    free(b->rules);
    free(b->sets);
}

int rt_grammar_new(const char *gbnf, size_t len, const rt_gvocab *v, rt_grammar **out, char *err, size_t err_len)
{
    *out = NULL;
    char dummy[8];
    builder *b = calloc(1, sizeof(*b));
    if (!b) {
        snprintf(err, err_len, "out of memory compiling the grammar");
        return -ENOMEM;
    }
    b->src = b->p = gbnf;
    b->end = gbnf + len;
    b->line = 1;
    b->err = err && err_len ? err : dummy;
    b->err_len = err && err_len ? err_len : sizeof(dummy);
    int rc = 0;
    if (setjmp(b->fail)) {
        rc = b->rc;
        goto done;
    }
    if (len > RT_GRAMMAR_MAX_SOURCE)
        fail(b, -EINVAL, "the grammar is larger than %u bytes", RT_GRAMMAR_MAX_SOURCE);
    for (;;) {
        skip_space(b, true);
        if (b->p >= b->end)
            break;
        parse_rule(b);
        if (b->p < b->end && *b->p != '\n')
            fail(b, -EINVAL, "unexpected '%c' after the rule", *b->p);
    }
    uint32_t root = UINT32_MAX;
    for (uint32_t r = 0; r < b->n_rules; r++) {
        if (b->rules[r].name && !b->rules[r].defined) {
            b->line = b->rules[r].line;
            fail(b, -EINVAL, "the rule '%s' is used but not defined", b->rules[r].name);
        }
        if (b->rules[r].name && !strcmp(b->rules[r].name, "root"))
            root = r;
    }
    if (root == UINT32_MAX)
        fail(b, -EINVAL, "no rule named 'root'");
    b->nul = nullable(b);
    b->state = calloc(b->n_rules, 1);
    if (!b->state)
        fail(b, -ENOMEM, "out of memory compiling the grammar");
    for (uint32_t r = 0; r < b->n_rules; r++)
        check_left_recursion(b, b->nul, r, b->state);
    check_productive(b);
    if (!(*out = flatten(b, v, root)))
        fail(b, -ENOMEM, "out of memory compiling the grammar");
done:
    builder_free(b);
    free(b);
    return rc;
}

rt_grammar *rt_grammar_ref(rt_grammar *g)
{
    atomic_fetch_add(&g->refs, 1);
    return g;
}

void rt_grammar_free(rt_grammar *g)
{
    if (!g || atomic_fetch_sub(&g->refs, 1) != 1)
        return;
    gdfa_free(g->dfa);
    pthread_mutex_destroy(&g->mu);
    free(g->el);
    free(g->alts);
    free(g->alt_off);
    free(g->sets);
    free(g);
}
