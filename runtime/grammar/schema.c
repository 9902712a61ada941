/* JSON Schema to GBNF (see grammar.h for what is enforced). Every value
 * is written compactly but for a little optional whitespace, and bounded
 * where the schema bounds it: a string's characters and an integer's
 * digits are counted in the grammar itself, so what matches the grammar
 * validates against the schema. */
#include "runtime/grammar/grammar.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64
#define MAX_DIGITS 15 /* an integer's digits, a fraction's: past that a float loses them anyway */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
} sbuf;

typedef struct ref {
    char *ptr, *rule;
} ref;

typedef struct sc {
    sbuf *out;  /* the body being written */
    sbuf *defs; /* rule definitions */
    const json_t *root;
    const char *prefix;
    int n_rules;
    ref *refs;
    int n_refs, cap_refs;
    char *err;
    size_t err_len;
    int rc;
    int depth;
} sc;

static void put(sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void puts_(sbuf *b, const char *s)
{
    put(b, s, strlen(s));
}

static void putf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void putf(sbuf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof(tmp)) {
        put(b, tmp, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    put(b, big, (size_t)n);
    free(big);
}

static int refuse(sc *c, const char *path, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int refuse(sc *c, const char *path, const char *fmt, ...)
{
    if (c->rc)
        return c->rc;
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    snprintf(c->err, c->err_len, "%s at %s", why, path);
    c->rc = -EINVAL;
    return c->rc;
}

/* A fresh rule name; its definition is written by the caller. */
static char *new_rule(sc *c, char *name, size_t n)
{
    snprintf(name, n, "%sr%d", c->prefix, c->n_rules++);
    return name;
}

/* A GBNF literal for bytes s (quotes, backslashes and controls escaped). */
static void put_literal(sbuf *b, const char *s, size_t n)
{
    puts_(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\')
            putf(b, "\\%c", ch);
        else if (ch < 0x20 || ch == 0x7f)
            putf(b, "\\x%02x", ch);
        else
            put(b, (const char *)&ch, 1);
    }
    puts_(b, "\"");
}

/* The compact JSON text of v as a GBNF literal. */
static int put_json_literal(sc *c, const json_t *v, const char *path)
{
    char *j = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!j)
        return refuse(c, path, "a value that cannot be written as JSON");
    put_literal(c->out, j, strlen(j));
    free(j);
    return 0;
}

/* ---- primitives, once per prefix ---- */

static void put_primitives(sc *c)
{
    const char *P = c->prefix;
    sbuf *o = c->defs;
    putf(o, "%sws ::= (\" \" | \"\\n\"{1,2} [ \\t]{0,20})?\n", P);
    putf(o, "%shex4 ::= ([0-9a-cA-CeEfF] [0-9a-fA-F] | [dD] [0-7]) [0-9a-fA-F] [0-9a-fA-F]\n", P);
    putf(o, "%sbool ::= \"true\" | \"false\"\n", P);
    putf(o, "%snull ::= \"null\"\n", P);
    putf(o, "%sfrac ::= \".\" [0-9]{1,%d}\n", P, MAX_DIGITS);
    putf(o, "%sint ::= \"-\"? (\"0\" | [1-9] [0-9]{0,%d})\n", P, MAX_DIGITS - 1);
    putf(o, "%snumber ::= %sint %sfrac?\n", P, P, P);
    putf(o, "%sstring ::= \"\\\"\" ([^\"\\\\\\x00-\\x1f] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" %shex4))* \"\\\"\"\n", P, P);
    /* any JSON value */
    putf(o, "%sany ::= %sobject | %sarray | %sstring | %snumber | %sbool | %snull\n", P, P, P, P, P, P, P);
    putf(o, "%sobject ::= \"{\" %sws (%sstring %sws \":\" %sws %sany (%sws \",\" %sws %sstring %sws \":\" %sws %sany)*)? %sws \"}\"\n",
         P, P, P, P, P, P, P, P, P, P, P, P, P);
    putf(o, "%sarray ::= \"[\" %sws (%sany (%sws \",\" %sws %sany)*)? %sws \"]\"\n", P, P, P, P, P, P, P);
}

/* ---- the parts ---- */

static int value_rule(sc *c, const json_t *s, const char *path, char *name, size_t n);

static void child_path(char *out, size_t n, const char *path, const char *a, const char *b)
{
    snprintf(out, n, "%s/%s%s%s", path, a, b ? "/" : "", b ? b : "");
}

/* A string's characters counted min..max (max < 0: no bound). */
static void put_string(sc *c, long min, long max)
{
    const char *P = c->prefix;
    putf(c->out, "\"\\\"\" ([^\"\\\\\\x00-\\x1f] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" %shex4))", P);
    if (max < 0)
        putf(c->out, "{%ld,}", min);
    else
        putf(c->out, "{%ld,%ld}", min, max);
    puts_(c->out, " \"\\\"\"");
}

static const char *const k_formats[][2] = {
    {"date", "(\"0\" [1-9] [0-9] [0-9] | [1-9] [0-9] [0-9] [0-9]) \"-\" (\"02-\" D28 | (\"0\" [469] | \"11\") \"-\" D30 | (\"0\" [13578] | \"1\" [02]) \"-\" D31)"},
    {"time", "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? (\"Z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])"},
    {"uuid", "[0-9a-f]{8} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{12}"},
    {"email", "[a-zA-Z0-9._%+-]{1,32} \"@\" [a-zA-Z0-9-]{1,32} (\".\" [a-zA-Z0-9-]{1,32}){0,2} \".\" [a-zA-Z]{2,6}"},
};

/* The body of a format, D28/D30/D31 written out. */
static void put_format_body(sc *c, const char *body)
{
    for (const char *p = body; *p; p++) {
        if (p[0] == 'D' && (p[1] == '2' || p[1] == '3')) {
            int d = (p[1] - '0') * 10 + (p[2] - '0');
            putf(c->out, "(\"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8]%s%s)", d >= 30 ? " | \"29\" | \"30\"" : "",
                 d == 31 ? " | \"31\"" : "");
            p += 2;
            continue;
        }
        put(c->out, p, 1);
    }
}

static int put_format(sc *c, const char *fmt, const char *path)
{
    puts_(c->out, "\"\\\"\" ");
    if (!strcmp(fmt, "date-time")) {
        put_format_body(c, k_formats[0][1]);
        puts_(c->out, " \"T\" ");
        put_format_body(c, k_formats[1][1]);
    } else {
        size_t i = 0;
        while (i < sizeof(k_formats) / sizeof(k_formats[0]) && strcmp(k_formats[i][0], fmt))
            i++;
        if (i == sizeof(k_formats) / sizeof(k_formats[0]))
            return refuse(c, path, "the string format '%.40s' is not supported (date, time, date-time, uuid, email)",
                          fmt);
        put_format_body(c, k_formats[i][1]);
    }
    puts_(c->out, " \"\\\"\"");
    return 0;
}

static int by_text(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Bytes of the UTF-8 character that starts with byte c. */
static size_t char_len(unsigned char c)
{
    return c < 0xc0 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
}

#define ENUM_MAX_NEST 32 /* prefix groups within groups; the GBNF parser's bound is 100 */

/* The sorted texts t[0..n), all beginning with their first `at` bytes
 * (written already), as a prefix tree: their longest common prefix, then
 * each group of texts sharing the next character, the group's own tree.
 * An enum written as alternatives puts one parse stack per value in the
 * matcher's state, past its bound for a few hundred values. */
static int put_enum_tree(sc *c, char **t, size_t n, size_t at, int nest, const char *path)
{
    if (nest > ENUM_MAX_NEST)
        return refuse(c, path, "an 'enum' whose values share prefixes more than %d deep", ENUM_MAX_NEST);
    size_t common = strlen(t[0] + at);
    for (size_t i = 1; i < n; i++) {
        size_t k = 0;
        while (k < common && t[i][at + k] == t[0][at + k])
            k++;
        common = k;
    }
    while (common && ((unsigned char)t[0][at + common] & 0xc0) == 0x80)
        common--; /* never within a character */
    if (common) {
        put_literal(c->out, t[0] + at, common);
        puts_(c->out, " ");
        at += common;
    }
    /* sorted: a text that ends here is first */
    bool optional = t[0][at] == '\0';
    size_t i = optional ? 1 : 0;
    if (i == n)
        return 0;
    puts_(c->out, "(");
    for (bool first = true; i < n; first = false) {
        size_t cl = char_len((unsigned char)t[i][at]), j = i + 1;
        while (j < n && !strncmp(t[j] + at, t[i] + at, cl))
            j++;
        if (!first)
            puts_(c->out, " | ");
        if (put_enum_tree(c, t + i, j - i, at, nest + 1, path))
            return c->rc;
        i = j;
    }
    puts_(c->out, optional ? ")?" : ")");
    return 0;
}

static int put_enum(sc *c, const json_t *v, const char *path)
{
    size_t n = json_array_size(v), k = 0;
    char **t = calloc(n, sizeof(*t));
    if (!t)
        return refuse(c, path, "out of memory");
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++)
        if (!(t[i] = json_dumps(json_array_get(v, i), JSON_COMPACT | JSON_ENCODE_ANY)))
            rc = refuse(c, path, "a value that cannot be written as JSON");
    if (!rc) {
        qsort(t, n, sizeof(*t), by_text);
        for (size_t i = 0; i < n; i++) { /* repeated values once */
            char *x = t[i];
            t[i] = NULL;
            if (k && !strcmp(t[k - 1], x))
                free(x);
            else
                t[k++] = x;
        }
        puts_(c->out, "(");
        rc = put_enum_tree(c, t, k, 0, 0, path);
        puts_(c->out, ")");
    }
    for (size_t i = 0; i < n; i++)
        free(t[i]);
    free(t);
    return rc;
}

/* A pattern, anchored ^...$, as the string's content: characters and
 * escapes as GBNF, its own " and \ written as JSON escapes. */
static int put_pattern(sc *c, const char *re, const char *path)
{
    size_t n = strlen(re);
    if (n < 2 || re[0] != '^' || re[n - 1] != '$' || (n >= 3 && re[n - 2] == '\\'))
        return refuse(c, path, "a 'pattern' must be anchored with ^ and $ to be enforced");
    puts_(c->out, "\"\\\"\" (");
    int depth = 0;
    bool atom = false; /* a quantifier may follow: it repeats that */
    for (size_t i = 1; i + 1 < n; i++) {
        char ch = re[i];
        bool quant = ch == '*' || ch == '+' || ch == '?' || ch == '{';
        if (quant && !atom)
            return refuse(c, path, "a 'pattern' quantifier with nothing to repeat (or a lazy one) is not supported");
        atom = !quant && ch != '(' && ch != '|';
        switch (ch) {
        case '(':
            if (i + 2 < n && re[i + 1] == '?') {
                if (re[i + 2] != ':')
                    return refuse(c, path, "a 'pattern' with lookaround or named groups is not supported");
                i += 2;
            }
            depth++;
            puts_(c->out, " (");
            break;
        case ')':
            if (--depth < 0)
                return refuse(c, path, "a 'pattern' with an unbalanced ')'");
            puts_(c->out, ") ");
            break;
        case '|':
            puts_(c->out, " | ");
            break;
        case '*': case '+': case '?':
            put(c->out, &re[i], 1);
            puts_(c->out, " ");
            break;
        case '{': {
            size_t j = i + 1, m = 0, k = 0;
            while (j + 1 < n && re[j] >= '0' && re[j] <= '9')
                j++, m++;
            if (j + 1 < n && re[j] == ',')
                for (j++; j + 1 < n && re[j] >= '0' && re[j] <= '9'; j++)
                    k++;
            if (!m || re[j] != '}' || j + 1 >= n)
                return refuse(c, path, "a 'pattern' with a repetition other than {m}, {m,} or {m,n}");
            if (k && strtoul(re + i + 1, NULL, 10) > strtoul(re + i + m + 2, NULL, 10))
                return refuse(c, path, "a 'pattern' repetition {m,n} with n below m");
            put(c->out, &re[i], j - i + 1);
            puts_(c->out, " ");
            i = j;
            break;
        }
        case '.':
            puts_(c->out, "[^\"\\\\\\x00-\\x1f] ");
            break;
        case '[': {
            size_t j = i + 1;
            if (j < n && re[j] == '^')
                j++;
            if (j < n && re[j] == ']')
                j++;
            while (j + 1 < n && re[j] != ']') {
                if (re[j] == '\\')
                    j++;
                j++;
            }
            if (re[j] != ']')
                return refuse(c, path, "a 'pattern' with an unterminated class");
            bool neg = re[i + 1] == '^';
            /* A JSON string holds " and \ escaped, controls never: the
             * class loses them, and takes their escaped forms instead. */
            bool quote = false, bslash = false;
            puts_(c->out, "( [");
            size_t from = c->out->len;
            for (size_t k = i + 1; k < j; k++) {
                if (re[k] == '\\' && k + 1 < j) {
                    char e = re[++k];
                    if (e == 'd')
                        puts_(c->out, "0-9");
                    else if (e == 'w')
                        puts_(c->out, "a-zA-Z0-9_");
                    else if (e == 's')
                        puts_(c->out, " "); /* the other spaces are controls */
                    else if (e == '\\')
                        bslash = true;
                    else if (e == '"')
                        quote = true;
                    else if (e == 'D' || e == 'W' || e == 'S' || strchr("tnrfv0", e) || (unsigned char)e < 0x21 ||
                             (unsigned char)e >= 0x80)
                        return refuse(c, path, "a 'pattern' class with \\%c is not supported", e);
                    else
                        putf(c->out, "\\%c", e);
                } else if (re[k] == '"') {
                    return refuse(c, path, "a 'pattern' class with '\"' is not supported");
                } else if (k + 2 < j && re[k + 1] == '-' && re[k + 2] != '\\' &&
                           (unsigned char)re[k + 2] < (unsigned char)re[k]) {
                    return refuse(c, path, "a 'pattern' class range whose end is before its start");
                } else if (k + 2 < j && re[k + 1] == '-' && re[k + 2] != '\\' &&
                           (unsigned char)re[k] <= '\\') {
                    /* a range over " or \: written around them */
                    unsigned lo = (unsigned char)re[k], hi = (unsigned char)re[k + 2];
                    static const unsigned char skip[] = {'"', '\\'};
                    for (size_t x = 0; x < 2; x++) {
                        if (lo > skip[x] || hi < skip[x])
                            continue;
                        if (lo < skip[x])
                            putf(c->out, "\\x%02x-\\x%02x", lo, skip[x] - 1u);
                        *(x ? &bslash : &quote) = true;
                        lo = skip[x] + 1u;
                    }
                    if (hi < 0x80 && lo > hi) { /* it ended at one of them */
                        k += 2;
                        continue;
                    }
                    putf(c->out, "\\x%02x-", lo);
                    k++; /* its end is written next */
                } else {
                    if ((unsigned char)re[k] < 0x20)
                        return refuse(c, path, "a 'pattern' with a control character");
                    put(c->out, &re[k], 1);
                }
            }
            if (neg) /* never a raw quote, backslash or control */
                puts_(c->out, "\"\\\\\\x00-\\x1f");
            if (c->out->len == from) /* nothing but " or \ */
                c->out->len = from - 1;
            else
                puts_(c->out, "]");
            if (quote && !neg)
                puts_(c->out, c->out->len == from - 1 ? " \"\\\\\\\"\"" : " | \"\\\\\\\"\"");
            if (bslash && !neg)
                puts_(c->out, c->out->len == from - 1 ? " \"\\\\\\\\\"" : " | \"\\\\\\\\\"");
            puts_(c->out, " ) ");
            i = j;
            break;
        }
        case '\\': {
            char e = i + 2 < n ? re[++i] : 0;
            if (e == 'd')
                puts_(c->out, "[0-9] ");
            else if (e == 'w')
                puts_(c->out, "[a-zA-Z0-9_] ");
            else if (e == 's')
                puts_(c->out, "(\" \" | \"\\\\t\" | \"\\\\n\" | \"\\\\r\") ");
            else if (e == '\\' || e == '"')
                putf(c->out, "\"\\\\\\%c\" ", e);
            else if (e && strchr(".^$|?*+()[]{}/-", e))
                putf(c->out, "\"%c\" ", e);
            else
                return refuse(c, path, "a 'pattern' escape \\%c is not supported", e ? e : ' ');
            break;
        }
        case '^': case '$':
            return refuse(c, path, "a 'pattern' with ^ or $ inside it is not supported");
        case '"':
            puts_(c->out, "\"\\\\\\\"\" ");
            break;
        default:
            if ((unsigned char)ch < 0x20)
                return refuse(c, path, "a 'pattern' with a control character");
            /* one character, all its UTF-8 bytes in one literal: a byte
             * alone is no text, and a quantifier repeats the character
             * (jansson gave us well-formed UTF-8) */
            size_t k = (unsigned char)ch < 0xc0 ? 1 : (unsigned char)ch < 0xe0 ? 2 : (unsigned char)ch < 0xf0 ? 3 : 4;
            if (i + k > n - 1)
                k = n - 1 - i;
            put_literal(c->out, &re[i], k);
            puts_(c->out, " ");
            i += k - 1;
        }
    }
    if (depth)
        return refuse(c, path, "a 'pattern' with an unbalanced '('");
    puts_(c->out, ") \"\\\"\"");
    return 0;
}

/* ---- numbers ---- */

/* Alternatives for the whole numbers lo..hi of n digits each (leading
 * zeros when pad). */
static void int_same_len(sbuf *o, const char *lo, const char *hi, int n, bool *first)
{
    if (n == 0)
        return;
    if (lo[0] == hi[0]) {
        /* a common digit, then the rest */
        sbuf rest = {0};
        bool f2 = true;
        int_same_len(&rest, lo + 1, hi + 1, n - 1, &f2);
        putf(o, "%s\"%c\"%s%s%s", *first ? "" : " | ", lo[0], n > 1 ? " (" : "", rest.p ? rest.p : "",
             n > 1 ? ")" : "");
        free(rest.p);
        *first = false;
        return;
    }
    bool lo_all0 = true, hi_all9 = true;
    for (int i = 1; i < n; i++) {
        lo_all0 = lo_all0 && lo[i] == '0';
        hi_all9 = hi_all9 && hi[i] == '9';
    }
    if (lo_all0 && hi_all9) {
        putf(o, "%s[%c-%c]", *first ? "" : " | ", lo[0], hi[0]);
        if (n > 1)
            putf(o, " [0-9]{%d}", n - 1);
        *first = false;
        return;
    }
    char nines[32], zeros[32];
    memset(nines, '9', 31);
    memset(zeros, '0', 31);
    nines[n - 1] = zeros[n - 1] = '\0';
    char a[32], b[32];
    a[0] = lo[0];
    memcpy(a + 1, nines, (size_t)n);
    int_same_len(o, lo, a, n, first);
    if (hi[0] - lo[0] > 1) {
        putf(o, " | [%c-%c]", lo[0] + 1, hi[0] - 1);
        if (n > 1)
            putf(o, " [0-9]{%d}", n - 1);
    }
    b[0] = hi[0];
    memcpy(b + 1, zeros, (size_t)n);
    int_same_len(o, b, hi, n, first);
}

/* Alternatives for the whole numbers lo..hi, 0 <= lo <= hi, no leading zeros. */
static void int_range(sbuf *o, long long lo, long long hi, bool *first)
{
    for (int len = 1; len <= MAX_DIGITS + 1; len++) {
        long long p = 1;
        for (int i = 1; i < len; i++)
            p *= 10;
        long long a = len == 1 ? 0 : p, b = p * 10 - 1;
        if (a < lo)
            a = lo;
        if (b > hi)
            b = hi;
        if (a > b)
            continue;
        char sa[32], sb[32];
        snprintf(sa, sizeof(sa), "%lld", a);
        snprintf(sb, sizeof(sb), "%lld", b);
        int_same_len(o, sa, sb, len, first);
    }
}

#define BIG 999999999999999LL /* MAX_DIGITS nines */

/* An integer in [lo, hi]. */
static void put_int_range(sc *c, long long lo, long long hi)
{
    bool first = true;
    puts_(c->out, "(");
    if (lo < 0) {
        puts_(c->out, "\"-\" (");
        bool f2 = true;
        int_range(c->out, hi < 0 ? -hi : 1, -lo, &f2);
        puts_(c->out, ")");
        first = false;
    }
    if (hi >= 0) {
        sbuf part = {0};
        bool f2 = true;
        int_range(&part, lo > 0 ? lo : 0, hi, &f2);
        putf(c->out, "%s(%s)", first ? "" : " | ", part.p ? part.p : "");
        free(part.p);
    }
    puts_(c->out, ")");
}

/* A magnitude m (ipart.frac, ipart without leading zeros) in the range
 * lo..hi, either end inclusive or not; the ends whole numbers. */
static void put_magnitude(sc *c, long long lo, bool lo_ex, long long hi, bool hi_ex, bool *first)
{
    const char *P = c->prefix;
    char nz[64], zero[64];
    snprintf(nz, sizeof(nz), "\".\" [0-9]{0,7} [1-9] [0-9]{0,7}");
    snprintf(zero, sizeof(zero), "(\".\" \"0\"{1,%d})?", MAX_DIGITS);
    if (lo == hi) {
        if (!lo_ex && !hi_ex) {
            putf(c->out, "%s\"%lld\" %s", *first ? "" : " | ", lo, zero);
            *first = false;
        }
        return;
    }
    if (lo + 1 <= hi - 1) {
        sbuf mid = {0};
        bool f2 = true;
        int_range(&mid, lo + 1, hi - 1, &f2);
        putf(c->out, "%s(%s) %sfrac?", *first ? "" : " | ", mid.p ? mid.p : "", P);
        free(mid.p);
        *first = false;
    }
    putf(c->out, "%s\"%lld\" ", *first ? "" : " | ", lo);
    if (lo_ex)
        put(c->out, nz, strlen(nz));
    else
        putf(c->out, "%sfrac?", P);
    *first = false;
    if (!hi_ex)
        putf(c->out, " | \"%lld\" %s", hi, zero);
}

static int bound(sc *c, const json_t *s, const char *key, const char *path, bool is_int, bool up, double *v, bool *set)
{
    json_t *b = json_object_get(s, key);
    if (!b)
        return 0;
    if (!json_is_number(b))
        return refuse(c, path, "'%s' must be a number", key);
    double x = json_number_value(b);
    if (!is_int && x != floor(x))
        return refuse(c, path, "a fractional '%s' on a number is not supported (whole-number bounds are)", key);
    if (fabs(x) > (double)BIG)
        x = x < 0 ? -(double)BIG : (double)BIG;
    if (*set && (up ? x >= *v : x <= *v))
        return 0;
    *v = x;
    *set = true;
    return 0;
}

static int put_number(sc *c, const json_t *s, const char *path, bool is_int)
{
    double lo = -(double)BIG, hi = (double)BIG;
    bool lo_set = false, hi_set = false, lo_ex = false, hi_ex = false;
    double x;
    bool xs = false;
    if (bound(c, s, "minimum", path, is_int, false, &lo, &lo_set))
        return c->rc;
    if (bound(c, s, "exclusiveMinimum", path, is_int, false, &x, &xs))
        return c->rc;
    if (xs && (!lo_set || x >= lo)) {
        lo = x;
        lo_ex = lo_set = true;
    }
    xs = false;
    if (bound(c, s, "maximum", path, is_int, true, &hi, &hi_set))
        return c->rc;
    if (bound(c, s, "exclusiveMaximum", path, is_int, true, &x, &xs))
        return c->rc;
    if (xs && (!hi_set || x <= hi)) {
        hi = x;
        hi_ex = hi_set = true;
    }
    const char *P = c->prefix;
    if (!lo_set && !hi_set) {
        putf(c->out, is_int ? "%sint" : "%snumber", P);
        return 0;
    }
    if (is_int) {
        long long a = (long long)ceil(lo), b = (long long)floor(hi);
        if (lo_ex && (double)a == lo)
            a++;
        if (hi_ex && (double)b == hi)
            b--;
        if (a > b)
            return refuse(c, path, "no integer lies between the bounds");
        put_int_range(c, a, b);
        return 0;
    }
    long long L = (long long)lo, H = (long long)hi;
    if (L > H || (L == H && (lo_ex || hi_ex)))
        return refuse(c, path, "no number lies between the bounds");
    bool first = true;
    puts_(c->out, "(");
    if (L < 0) { /* x < 0: "-" m, m in (max(0, -H), -L] */
        puts_(c->out, "\"-\" (");
        bool f2 = true;
        if (H < 0)
            put_magnitude(c, -H, hi_ex, -L, lo_ex, &f2);
        else
            put_magnitude(c, 0, true, -L, lo_ex, &f2);
        puts_(c->out, ")");
        first = false;
    }
    if (H > 0 || (H == 0 && !hi_ex)) { /* x >= 0 */
        sbuf part = {0};
        sbuf *saved = c->out;
        c->out = &part;
        bool f2 = true;
        put_magnitude(c, L > 0 ? L : 0, L > 0 ? lo_ex : (L == 0 && lo_ex), H, hi_ex, &f2);
        c->out = saved;
        if (part.oom)
            saved->oom = true;
        putf(c->out, "%s(%s)", first ? "" : " | ", part.p ? part.p : "");
        free(part.p);
    }
    puts_(c->out, ")");
    return 0;
}

/* ---- compound values ---- */

static long count_bound(sc *c, const json_t *s, const char *key, const char *path, long dflt)
{
    json_t *v = json_object_get(s, key);
    if (!v)
        return dflt;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 100000) {
        refuse(c, path, "'%s' must be a whole number from 0 to 100000", key);
        return dflt;
    }
    return (long)json_integer_value(v);
}

static int put_string_schema(sc *c, const json_t *s, const char *path)
{
    long min = count_bound(c, s, "minLength", path, 0), max = count_bound(c, s, "maxLength", path, -1);
    if (c->rc)
        return c->rc;
    json_t *fmt = json_object_get(s, "format"), *pat = json_object_get(s, "pattern");
    if ((fmt || pat) && (json_object_get(s, "minLength") || json_object_get(s, "maxLength")))
        return refuse(c, path, "'minLength' or 'maxLength' with a 'format' or 'pattern' is not supported");
    if (fmt && pat)
        return refuse(c, path, "both 'format' and 'pattern' is not supported");
    if (fmt) {
        if (!json_is_string(fmt))
            return refuse(c, path, "'format' must be a string");
        return put_format(c, json_string_value(fmt), path);
    }
    if (pat) {
        if (!json_is_string(pat))
            return refuse(c, path, "'pattern' must be a string");
        return put_pattern(c, json_string_value(pat), path);
    }
    if (max >= 0 && max < min)
        return refuse(c, path, "'maxLength' is below 'minLength'");
    put_string(c, min, max);
    return 0;
}

static int put_object(sc *c, const json_t *s, const char *path)
{
    const char *P = c->prefix;
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props))
        return refuse(c, path, "'properties' must be an object");
    if (req && !json_is_array(req))
        return refuse(c, path, "'required' must be an array");
    size_t n = props ? json_object_size(props) : 0;
    if (n == 0 && addl && json_is_object(addl)) {
        /* a map: any keys, values of one schema */
        char vr[64], p2[512];
        child_path(p2, sizeof(p2), path, "additionalProperties", NULL);
        if (value_rule(c, addl, p2, vr, sizeof(vr)))
            return c->rc;
        putf(c->out, "\"{\" %sws (%sstring %sws \":\" %sws %s (%sws \",\" %sws %sstring %sws \":\" %sws %s)*)? %sws \"}\"",
             P, P, P, P, vr, P, P, P, P, P, vr, P);
        return 0;
    }
    /* every required name must be a property */
    for (size_t i = 0; req && i < json_array_size(req); i++) {
        json_t *r = json_array_get(req, i);
        if (!json_is_string(r))
            return refuse(c, path, "'required' must list strings");
        if (!props || !json_object_get(props, json_string_value(r)))
            return refuse(c, path, "the required property '%.60s' is not in 'properties'", json_string_value(r));
    }
    /* kv_i for each property, then the chain of what may follow */
    char (*kv)[64] = calloc(n ? n : 1, 64);
    bool *required = calloc(n ? n : 1, 1);
    if (!kv || !required) {
        free(kv);
        free(required);
        c->out->oom = true;
        return 0;
    }
    size_t i = 0;
    const char *key;
    json_t *ps;
    json_object_foreach(props, key, ps)
    {
        char vr[64], p2[512];
        child_path(p2, sizeof(p2), path, "properties", key);
        if (value_rule(c, ps, p2, vr, sizeof(vr)))
            break;
        for (size_t k = 0; req && k < json_array_size(req); k++)
            required[i] = required[i] || !strcmp(json_string_value(json_array_get(req, k)), key);
        new_rule(c, kv[i], 64);
        sbuf *o = c->defs;
        putf(o, "%s ::= ", kv[i]);
        json_t *ks = json_string(key);
        char *enc = ks ? json_dumps(ks, JSON_ENCODE_ANY) : NULL;
        json_decref(ks);
        if (!enc) {
            c->out->oom = true;
            break;
        }
        put_literal(o, enc, strlen(enc));
        free(enc);
        putf(o, " %sws \":\" %sws %s\n", P, P, vr);
        i++;
    }
    if (c->rc) {
        free(kv);
        free(required);
        return c->rc;
    }
    /* after_k: what may follow once something was written, from k on;
     * first_k: the first property written is k or later */
    char (*after)[64] = calloc(n + 1, 64), (*firstr)[64] = calloc(n + 1, 64);
    if (!after || !firstr) {
        c->out->oom = true;
    } else {
        for (size_t k = n + 1; k-- > 0;) {
            new_rule(c, after[k], 64);
            new_rule(c, firstr[k], 64);
            if (k == n) {
                putf(c->defs, "%s ::= \"\"\n%s ::= \"\"\n", after[k], firstr[k]);
                continue;
            }
            putf(c->defs, "%s ::= %sws \",\" %sws %s %s%s%s\n", after[k], P, P, kv[k], after[k + 1],
                 required[k] ? "" : " | ", required[k] ? "" : after[k + 1]);
            putf(c->defs, "%s ::= %s %s%s%s\n", firstr[k], kv[k], after[k + 1], required[k] ? "" : " | ",
                 required[k] ? "" : firstr[k + 1]);
        }
        putf(c->out, "\"{\" %sws %s %sws \"}\"", P, firstr[0], P);
    }
    free(after);
    free(firstr);
    free(kv);
    free(required);
    return 0;
}

static int put_array(sc *c, const json_t *s, const char *path)
{
    const char *P = c->prefix;
    long min = count_bound(c, s, "minItems", path, 0), max = count_bound(c, s, "maxItems", path, -1);
    if (c->rc)
        return c->rc;
    if (max >= 0 && max < min)
        return refuse(c, path, "'maxItems' is below 'minItems'");
    json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
    if (prefix && !json_is_array(prefix))
        return refuse(c, path, "'prefixItems' must be an array");
    size_t np = prefix ? json_array_size(prefix) : 0;
    if (max >= 0 && (size_t)max < np)
        return refuse(c, path, "'maxItems' is below the number of 'prefixItems'");
    char ir[64] = "";
    bool no_more = items && json_is_false(items);
    if (!no_more) {
        char p2[512];
        child_path(p2, sizeof(p2), path, "items", NULL);
        if (items ? value_rule(c, items, p2, ir, sizeof(ir)) : (snprintf(ir, sizeof(ir), "%sany", P), 0))
            return c->rc;
    }
    sbuf body = {0};
    sbuf *saved = c->out;
    for (size_t i = 0; i < np; i++) {
        char pr[64], p2[512], idx[24];
        snprintf(idx, sizeof(idx), "%zu", i);
        child_path(p2, sizeof(p2), path, "prefixItems", idx);
        c->out = saved;
        if (value_rule(c, json_array_get(prefix, i), p2, pr, sizeof(pr))) {
            free(body.p);
            return c->rc;
        }
        c->out = &body;
        if (i)
            putf(&body, " %sws \",\" %sws ", P, P);
        putf(&body, "%s", pr);
    }
    c->out = saved;
    long rest_min = min > (long)np ? min - (long)np : 0, rest_max = max < 0 ? -1 : max - (long)np;
    if (no_more && rest_min > 0) {
        free(body.p);
        return refuse(c, path, "'minItems' asks for more items than 'prefixItems' and items false allow");
    }
    puts_(c->out, "\"[\" ");
    putf(c->out, "%sws ", P);
    if (np) {
        put(c->out, body.p, body.len);
        if (!no_more && rest_max != 0) {
            putf(c->out, " (%sws \",\" %sws %s)", P, P, ir);
            if (rest_max < 0)
                putf(c->out, "{%ld,}", rest_min);
            else
                putf(c->out, "{%ld,%ld}", rest_min, rest_max);
        }
    } else if (!no_more && max != 0) {
        bool opt = min == 0;
        putf(c->out, "%s%s (%sws \",\" %sws %s)", opt ? "(" : "", ir, P, P, ir);
        long a = min > 0 ? min - 1 : 0;
        if (max < 0)
            putf(c->out, "{%ld,}", a);
        else
            putf(c->out, "{%ld,%ld}", a, max - 1);
        if (opt)
            puts_(c->out, ")?");
    }
    free(body.p);
    putf(c->out, " %sws \"]\"", P);
    return 0;
}

/* ---- a schema ---- */

static const char *const k_ignored[] = {"title", "description", "default", "examples", "$schema", "$id",
                                        "$comment", "deprecated", "readOnly", "writeOnly", "strict",
                                        "$defs", "definitions", NULL};
static const char *const k_enforced[] = {"type", "properties", "required", "additionalProperties", "items",
                                         "prefixItems", "minItems", "maxItems", "minLength", "maxLength",
                                         "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
                                         "exclusiveMaximum", "enum", "const", "anyOf", "oneOf", "allOf", "$ref",
                                         NULL};

static bool listed(const char *const *l, const char *k)
{
    for (int i = 0; l[i]; i++)
        if (!strcmp(l[i], k))
            return true;
    return false;
}

static int check_keywords(sc *c, const json_t *s, const char *path)
{
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)s, k, v)
    {
        if (!listed(k_ignored, k) && !listed(k_enforced, k))
            return refuse(c, path, "the JSON Schema keyword '%.60s' is not supported", k);
    }
    return 0;
}

/* Resolves a local $ref to its rule (compiled on first use). */
static int ref_rule(sc *c, const char *ptr, const char *path, char *name, size_t n)
{
    for (int i = 0; i < c->n_refs; i++)
        if (!strcmp(c->refs[i].ptr, ptr)) {
            snprintf(name, n, "%s", c->refs[i].rule);
            return 0;
        }
    if (strncmp(ptr, "#/", 2) && strcmp(ptr, "#"))
        return refuse(c, path, "only local '$ref's (#/...) are supported");
    const json_t *t = c->root;
    char part[256];
    for (const char *p = ptr + 1; *p == '/' && t;) {
        p++;
        size_t k = 0;
        while (*p && *p != '/' && k + 1 < sizeof(part)) {
            if (p[0] == '~' && (p[1] == '0' || p[1] == '1')) {
                part[k++] = p[1] == '0' ? '~' : '/';
                p += 2;
            } else {
                part[k++] = *p++;
            }
        }
        part[k] = '\0';
        t = json_is_object(t) ? json_object_get(t, part) : NULL;
    }
    if (!t)
        return refuse(c, path, "the '$ref' %.100s points nowhere", ptr);
    if (c->n_refs == c->cap_refs) {
        int cap = c->cap_refs ? c->cap_refs * 2 : 8;
        ref *r = realloc(c->refs, (size_t)cap * sizeof(*r));
        if (!r) {
            c->out->oom = true;
            return -ENOMEM;
        }
        c->refs = r;
        c->cap_refs = cap;
    }
    char rn[64];
    new_rule(c, rn, sizeof(rn));
    c->refs[c->n_refs].ptr = strdup(ptr);
    c->refs[c->n_refs].rule = strdup(rn);
    if (!c->refs[c->n_refs].ptr || !c->refs[c->n_refs].rule) {
        c->out->oom = true;
        return -ENOMEM;
    }
    c->n_refs++;
    snprintf(name, n, "%s", rn);
    /* the target's own rule, defined as an alias of its value */
    char vr[64];
    if (value_rule(c, t, ptr, vr, sizeof(vr)))
        return c->rc;
    putf(c->defs, "%s ::= %s\n", rn, vr);
    return 0;
}

static int put_alternatives(sc *c, const json_t *list, const char *key, const char *path)
{
    if (!json_is_array(list) || json_array_size(list) == 0)
        return refuse(c, path, "'%s' must be a non-empty array", key);
    char (*names)[64] = calloc(json_array_size(list), 64);
    if (!names) {
        c->out->oom = true;
        return 0;
    }
    for (size_t i = 0; i < json_array_size(list); i++) {
        char p2[512], idx[24];
        snprintf(idx, sizeof(idx), "%zu", i);
        child_path(p2, sizeof(p2), path, key, idx);
        if (value_rule(c, json_array_get(list, i), p2, names[i], 64)) {
            free(names);
            return c->rc;
        }
    }
    for (size_t i = 0; i < json_array_size(list); i++)
        putf(c->out, "%s%s", i ? " | " : "", names[i]);
    free(names);
    return 0;
}

/* The body of a schema of one type. */
static int put_typed(sc *c, const json_t *s, const char *type, const char *path)
{
    const char *P = c->prefix;
    if (!strcmp(type, "string"))
        return put_string_schema(c, s, path);
    if (!strcmp(type, "integer") || !strcmp(type, "number"))
        return put_number(c, s, path, type[0] == 'i');
    if (!strcmp(type, "boolean")) {
        putf(c->out, "%sbool", P);
        return 0;
    }
    if (!strcmp(type, "null")) {
        putf(c->out, "%snull", P);
        return 0;
    }
    if (!strcmp(type, "object"))
        return put_object(c, s, path);
    if (!strcmp(type, "array"))
        return put_array(c, s, path);
    return refuse(c, path, "the type '%.40s' is not a JSON Schema type", type);
}

/* Writes the body of schema s (a sequence or alternatives). */
static int put_schema_body(sc *c, const json_t *s, const char *path)
{
    if (json_is_true(s) || (json_is_object(s) && json_object_size(s) == 0)) {
        putf(c->out, "%sany", c->prefix);
        return 0;
    }
    if (json_is_false(s))
        return refuse(c, path, "the schema false accepts nothing");
    if (!json_is_object(s))
        return refuse(c, path, "a schema must be an object or a boolean");
    if (check_keywords(c, s, path))
        return c->rc;
    json_t *v;
    if ((v = json_object_get(s, "$ref"))) {
        if (!json_is_string(v))
            return refuse(c, path, "'$ref' must be a string");
        char rn[64];
        if (ref_rule(c, json_string_value(v), path, rn, sizeof(rn)))
            return c->rc;
        putf(c->out, "%s", rn);
        return 0;
    }
    if ((v = json_object_get(s, "const")))
        return put_json_literal(c, v, path);
    if ((v = json_object_get(s, "enum"))) {
        if (!json_is_array(v) || json_array_size(v) == 0)
            return refuse(c, path, "'enum' must be a non-empty array");
        return put_enum(c, v, path);
    }
    if ((v = json_object_get(s, "anyOf")))
        return put_alternatives(c, v, "anyOf", path);
    if ((v = json_object_get(s, "oneOf")))
        return put_alternatives(c, v, "oneOf", path);
    if ((v = json_object_get(s, "allOf"))) {
        if (!json_is_array(v) || json_array_size(v) != 1)
            return refuse(c, path, "'allOf' of other than one schema is not supported");
        char p2[512];
        child_path(p2, sizeof(p2), path, "allOf", "0");
        return put_schema_body(c, json_array_get(v, 0), p2);
    }
    json_t *type = json_object_get(s, "type");
    if (json_is_string(type))
        return put_typed(c, s, json_string_value(type), path);
    if (json_is_array(type)) {
        if (json_array_size(type) == 0)
            return refuse(c, path, "'type' must not be empty");
        for (size_t i = 0; i < json_array_size(type); i++) {
            json_t *t = json_array_get(type, i);
            if (!json_is_string(t))
                return refuse(c, path, "'type' must list strings");
            char rn[64];
            new_rule(c, rn, sizeof(rn));
            sbuf part = {0};
            sbuf *saved = c->out;
            c->out = &part;
            int rc = put_typed(c, s, json_string_value(t), path);
            c->out = saved;
            if (!rc)
                putf(c->defs, "%s ::= %s\n", rn, part.p ? part.p : "\"\"");
            free(part.p);
            if (rc)
                return rc;
            putf(c->out, "%s%s", i ? " | " : "", rn);
        }
        return 0;
    }
    if (type)
        return refuse(c, path, "'type' must be a string or an array of strings");
    if (json_object_get(s, "properties") || json_object_get(s, "additionalProperties"))
        return put_object(c, s, path);
    if (json_object_get(s, "items") || json_object_get(s, "prefixItems"))
        return put_array(c, s, path);
    putf(c->out, "%sany", c->prefix);
    return 0;
}

/* A rule for schema s; its name in name. */
static int value_rule(sc *c, const json_t *s, const char *path, char *name, size_t n)
{
    if (c->rc)
        return c->rc;
    if (++c->depth > MAX_DEPTH)
        return refuse(c, path, "the schema nests deeper than %d", MAX_DEPTH);
    sbuf body = {0};
    sbuf *saved = c->out;
    c->out = &body;
    int rc = put_schema_body(c, s, path);
    c->out = saved;
    if (body.oom)
        saved->oom = true;
    if (!rc) {
        new_rule(c, name, n);
        putf(c->defs, "%s ::= %s\n", name, body.p ? body.p : "\"\"");
    }
    free(body.p);
    c->depth--;
    return rc;
}

int rt_schema_gbnf(const json_t *schema, const char *prefix, char **out, size_t *len, char *err, size_t err_len)
{
    sbuf b = {.p = *out, .len = *len, .cap = *out ? *len + 1 : 0};
    char dummy[8];
    sc c = {.out = &b, .defs = &b, .root = schema, .prefix = prefix, .err = err && err_len ? err : dummy,
            .err_len = err && err_len ? err_len : sizeof(dummy)};
    put_primitives(&c);
    char name[64];
    int rc = value_rule(&c, schema, "#", name, sizeof(name));
    if (!rc)
        putf(&b, "%svalue ::= %s\n", prefix, name);
    for (int i = 0; i < c.n_refs; i++) {
        free(c.refs[i].ptr);
        free(c.refs[i].rule);
    }
    free(c.refs);
    if (b.oom) {
        snprintf(c.err, c.err_len, "out of memory compiling the schema");
        rc = -ENOMEM;
    }
    *out = b.p;
    *len = b.len;
    return rc;
}
