/* The Jinja lexer: template source to tokens, with Jinja2's whitespace
 * rules as Hugging Face configures them (trim_blocks: the newline after a
 * block or comment tag goes; lstrip_blocks: the spaces and tabs before
 * one on its line go; `-` strips all whitespace on its side, `+` keeps
 * it), its newline normalisation (\r\n and \r become \n, one trailing
 * newline is dropped) and its string escapes (Python's unicode-escape). */
#include "runtime/jinja/lex.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Noreturn void lex_fail(jn_lexer *lx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static _Noreturn void lex_fail(jn_lexer *lx, const char *fmt, ...)
{
    int n = snprintf(lx->err, lx->err_len, "template line %d: ", lx->line);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < lx->err_len)
        vsnprintf(lx->err + n, lx->err_len - (size_t)n, fmt, ap);
    va_end(ap);
    *lx->arena->rc = -EINVAL;
    longjmp(*lx->arena->fail, 1);
}

static void push(jn_lexer *lx, jn_tok t)
{
    if (lx->n == lx->cap) {
        int cap = lx->cap ? lx->cap * 2 : 256;
        jn_tok *v = jn_alloc(lx->arena, (size_t)cap * sizeof(*v));
        if (lx->n)
            memcpy(v, lx->toks, (size_t)lx->n * sizeof(*v));
        lx->toks = v;
        lx->cap = cap;
    }
    lx->toks[lx->n++] = t;
}

/* Python's \s at p (ASCII and the Unicode spaces); its length in *adv. */
static bool space_at(const char *p, size_t left, size_t *adv)
{
    return left > 0 && ju_isspace_at(p, left, adv);
}

static void count_lines(jn_lexer *lx, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++)
        lx->line += lx->src[i] == '\n';
}

/* Advances over whitespace from pos; returns the new position. */
static size_t skip_space(jn_lexer *lx, size_t pos)
{
    size_t adv;
    while (pos < lx->len && space_at(lx->src + pos, lx->len - pos, &adv))
        pos += adv;
    return pos;
}

/* The data before a tag, stripped as the tag's sign and kind say. */
static void emit_data(jn_lexer *lx, size_t from, size_t to, char sign, bool is_var)
{
    const char *s = lx->src;
    if (sign == '-') {
        /* rstrip(): Python whitespace, the Unicode spaces included */
        size_t end = from, i = from, adv;
        while (i < to) {
            if (space_at(s + i, to - i, &adv)) {
                i += adv;
                continue;
            }
            i += adv ? adv : 1;
            end = i;
        }
        to = end;
    } else if (sign != '+' && !is_var) {
        size_t l_pos = to;
        while (l_pos > from && s[l_pos - 1] != '\n')
            l_pos--;
        if (l_pos > from || lx->line_starting) {
            bool blank = true;
            for (size_t i = l_pos; i < to && blank; i++)
                blank = s[i] == ' ' || s[i] == '\t';
            if (blank)
                to = l_pos;
        }
    }
    if (to > from)
        push(lx, (jn_tok){.type = JT_DATA, .p = s + from, .len = to - from, .line = lx->line});
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* A \x, \u or \U escape's code point from n hex digits at p, or -1. */
static long hex_escape(const char *p, size_t left, int n)
{
    if (left < (size_t)n)
        return -1;
    long v = 0;
    for (int i = 0; i < n; i++) {
        int h = hexval(p[i]);
        if (h < 0)
            return -1;
        v = v * 16 + h;
    }
    return v;
}

/* A string literal's value: Python's unicode-escape of its body. */
static void lex_string(jn_lexer *lx, size_t *pos)
{
    const char *s = lx->src;
    char q = s[*pos];
    size_t i = *pos + 1, start_line = (size_t)lx->line;
    char *out = jn_alloc(lx->arena, lx->len - i + 1), *o = out;
    for (;;) {
        if (i >= lx->len)
            lex_fail(lx, "unterminated string");
        char c = s[i];
        if (c == q)
            break;
        if (c == '\n')
            lx->line++;
        if (c != '\\' || i + 1 >= lx->len) {
            *o++ = c;
            i++;
            continue;
        }
        char e = s[i + 1];
        long cp = -2;
        size_t used = 2;
        switch (e) {
        case '\\': cp = '\\'; break;
        case '\'': cp = '\''; break;
        case '"': cp = '"'; break;
        case 'a': cp = 7; break;
        case 'b': cp = 8; break;
        case 'f': cp = 12; break;
        case 'n': cp = 10; break;
        case 'r': cp = 13; break;
        case 't': cp = 9; break;
        case 'v': cp = 11; break;
        case '\n': cp = -3; lx->line++; break; /* a line continuation */
        case 'x': cp = hex_escape(s + i + 2, lx->len - i - 2, 2); used = 4; break;
        case 'u': cp = hex_escape(s + i + 2, lx->len - i - 2, 4); used = 6; break;
        case 'U': cp = hex_escape(s + i + 2, lx->len - i - 2, 8); used = 10; break;
        default:
            if (e >= '0' && e <= '7') {
                cp = 0;
                used = 1;
                while (used < 4 && i + used < lx->len && s[i + used] >= '0' && s[i + used] <= '7')
                    cp = cp * 8 + (s[i + used++] - '0');
            }
        }
        if (cp == -1 || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            lex_fail(lx, "a string has a bad escape");
        if (cp == -2) { /* not an escape: both characters stay */
            *o++ = '\\';
            i++;
            continue;
        }
        if (cp >= 0)
            o += put_utf8(o, (unsigned)cp);
        i += used;
    }
    (void)start_line;
    push(lx, (jn_tok){.type = JT_STRING, .p = out, .len = (size_t)(o - out), .line = lx->line});
    *pos = i + 1;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

/* Digits with single underscores between them, from pos; returns the end. */
static size_t digits(const char *s, size_t len, size_t pos)
{
    while (pos < len && (is_digit(s[pos]) || (s[pos] == '_' && pos + 1 < len && is_digit(s[pos + 1]))))
        pos++;
    return pos;
}

static void lex_number(jn_lexer *lx, size_t *pos)
{
    const char *s = lx->src;
    size_t start = *pos, i = digits(s, lx->len, start);
    bool is_float = false;
    bool after_dot = start > 0 && s[start - 1] == '.';
    if (!after_dot && i + 1 < lx->len && s[i] == '.' && is_digit(s[i + 1])) {
        i = digits(s, lx->len, i + 1);
        is_float = true;
    }
    if (!after_dot && i < lx->len && (s[i] == 'e' || s[i] == 'E')) {
        size_t j = i + 1;
        if (j < lx->len && (s[j] == '+' || s[j] == '-'))
            j++;
        if (j < lx->len && is_digit(s[j])) {
            i = digits(s, lx->len, j);
            is_float = true;
        }
    }
    char buf[64];
    size_t n = 0;
    for (size_t k = start; k < i && n + 1 < sizeof(buf); k++)
        if (s[k] != '_')
            buf[n++] = s[k];
    buf[n] = '\0';
    jn_tok t = {.type = is_float ? JT_FLOAT : JT_INT, .line = lx->line, .p = s + start, .len = i - start};
    if (is_float) {
        t.f = strtod(buf, NULL);
    } else {
        errno = 0;
        unsigned long long v = strtoull(buf, NULL, 10);
        if (errno || v > INT64_MAX)
            lex_fail(lx, "an integer too large");
        t.i = (int64_t)v;
    }
    push(lx, t);
    *pos = i;
}

static const char *const k_ops2[] = {"//", "**", "==", "!=", ">=", "<="};
static const char k_ops1[] = "+-/*%~[](){}><=.:|,;";

/* Inside a tag: tokens until its end; returns the position after it. */
static size_t lex_tag(jn_lexer *lx, size_t pos, jn_tok_type end_type, const char *end)
{
    const char *s = lx->src;
    char stack[64];
    int depth = 0;
    for (;;) {
        size_t ws = skip_space(lx, pos);
        count_lines(lx, pos, ws);
        pos = ws;
        if (pos >= lx->len)
            lex_fail(lx, "unexpected end of template (a tag is not closed)");
        if (depth == 0) {
            char sign = s[pos] == '-' || s[pos] == '+' ? s[pos] : 0;
            size_t at = pos + (sign ? 1 : 0);
            if (!strncmp(s + at, end, 2)) {
                push(lx, (jn_tok){.type = end_type, .line = lx->line});
                pos = at + 2;
                lx->line_starting = false;
                if (sign == '-') {
                    size_t e = skip_space(lx, pos);
                    lx->line_starting = e > pos && s[e - 1] == '\n';
                    count_lines(lx, pos, e);
                    pos = e;
                } else if (sign != '+' && end_type == JT_BLOCK_END && pos < lx->len && s[pos] == '\n') {
                    lx->line++;
                    pos++;
                    lx->line_starting = true;
                }
                return pos;
            }
        }
        char c = s[pos];
        if (c == '\'' || c == '"') {
            lex_string(lx, &pos);
            continue;
        }
        if (is_digit(c)) {
            lex_number(lx, &pos);
            continue;
        }
        if (is_name_start(c)) {
            size_t e = pos;
            while (e < lx->len && is_name_char(s[e]))
                e++;
            push(lx, (jn_tok){.type = JT_NAME, .p = s + pos, .len = e - pos, .line = lx->line});
            pos = e;
            continue;
        }
        size_t oplen = 0;
        for (size_t k = 0; k < sizeof(k_ops2) / sizeof(k_ops2[0]) && !oplen; k++)
            if (pos + 1 < lx->len && !strncmp(s + pos, k_ops2[k], 2))
                oplen = 2;
        if (!oplen && c && strchr(k_ops1, c))
            oplen = 1;
        if (!oplen)
            lex_fail(lx, "unexpected character '%c'", c >= 0x20 && c < 0x7f ? c : '?');
        if (c == '(' || c == '[' || c == '{') {
            if (depth == (int)sizeof(stack))
                lex_fail(lx, "brackets nested too deep");
            stack[depth++] = c == '(' ? ')' : c == '[' ? ']' : '}';
        } else if (c == ')' || c == ']' || c == '}') {
            if (depth == 0 || stack[depth - 1] != c)
                lex_fail(lx, "unexpected '%c'", c);
            depth--;
        }
        push(lx, (jn_tok){.type = JT_OP, .p = s + pos, .len = oplen, .line = lx->line});
        pos += oplen;
    }
}

/* A comment from after its "{#": to after its "#}", with its end's sign. */
static size_t lex_comment(jn_lexer *lx, size_t pos)
{
    const char *end = NULL;
    for (size_t i = pos; i + 1 < lx->len; i++)
        if (lx->src[i] == '#' && lx->src[i + 1] == '}') {
            end = lx->src + i;
            break;
        }
    if (!end)
        lex_fail(lx, "missing end of comment tag");
    size_t e = (size_t)(end - lx->src);
    char sign = e > pos && (lx->src[e - 1] == '-' || lx->src[e - 1] == '+') ? lx->src[e - 1] : 0;
    count_lines(lx, pos, e);
    pos = e + 2;
    lx->line_starting = false;
    if (sign == '-') {
        size_t s2 = skip_space(lx, pos);
        lx->line_starting = s2 > pos && lx->src[s2 - 1] == '\n';
        count_lines(lx, pos, s2);
        pos = s2;
    } else if (sign != '+' && pos < lx->len && lx->src[pos] == '\n') {
        lx->line++;
        pos++;
        lx->line_starting = true;
    }
    return pos;
}

/* Whether a block tag at pos (after "{%" and its sign) is `{% NAME %}`;
 * its end in *end and the end's sign in *sign. */
static bool tag_is(jn_lexer *lx, size_t pos, const char *name, size_t *end, char *sign)
{
    const char *s = lx->src;
    pos = skip_space(lx, pos);
    size_t n = strlen(name);
    if (pos + n > lx->len || strncmp(s + pos, name, n) || (pos + n < lx->len && is_name_char(s[pos + n])))
        return false;
    pos = skip_space(lx, pos + n);
    *sign = pos < lx->len && (s[pos] == '-' || s[pos] == '+') ? s[pos] : 0;
    pos += *sign ? 1 : 0;
    if (pos + 1 >= lx->len || s[pos] != '%' || s[pos + 1] != '}')
        return false;
    *end = pos + 2;
    return true;
}

/* {% raw %}: everything up to {% endraw %} is data. */
static size_t lex_raw(jn_lexer *lx, size_t pos, char open_sign)
{
    size_t body = pos;
    if (open_sign == '-')
        body = skip_space(lx, pos);
    for (size_t i = body; i + 1 < lx->len; i++) {
        if (lx->src[i] != '{' || lx->src[i + 1] != '%')
            continue;
        size_t at = i + 2, end;
        char sign = lx->src[at] == '-' || lx->src[at] == '+' ? lx->src[at] : 0;
        char esign;
        if (!tag_is(lx, at + (sign ? 1 : 0), "endraw", &end, &esign))
            continue;
        size_t to = i;
        if (sign == '-')
            while (to > body && (lx->src[to - 1] == ' ' || lx->src[to - 1] == '\t' || lx->src[to - 1] == '\n' ||
                                 lx->src[to - 1] == '\r'))
                to--;
        if (to > body)
            push(lx, (jn_tok){.type = JT_DATA, .p = lx->src + body, .len = to - body, .line = lx->line});
        count_lines(lx, pos, end);
        lx->line_starting = false;
        if (esign == '-') {
            size_t e = skip_space(lx, end);
            count_lines(lx, end, e);
            end = e;
        } else if (esign != '+' && end < lx->len && lx->src[end] == '\n') {
            lx->line++;
            end++;
            lx->line_starting = true;
        }
        return end;
    }
    lex_fail(lx, "missing end of raw directive");
}

void jn_lex(jn_lexer *lx)
{
    const char *s = lx->src;
    size_t pos = 0;
    lx->line = 1;
    lx->line_starting = true;
    while (pos < lx->len) {
        size_t i = pos;
        while (i + 1 < lx->len && !(s[i] == '{' && (s[i + 1] == '{' || s[i + 1] == '%' || s[i + 1] == '#')))
            i++;
        if (i + 1 >= lx->len) { /* no more tags */
            push(lx, (jn_tok){.type = JT_DATA, .p = s + pos, .len = lx->len - pos, .line = lx->line});
            count_lines(lx, pos, lx->len);
            break;
        }
        char kind = s[i + 1];
        char sign = i + 2 < lx->len && (s[i + 2] == '-' || s[i + 2] == '+') ? s[i + 2] : 0;
        emit_data(lx, pos, i, sign, kind == '{');
        count_lines(lx, pos, i);
        size_t after = i + 2 + (sign ? 1 : 0), end;
        char esign;
        if (kind == '#')
            pos = lex_comment(lx, after);
        else if (kind == '%' && tag_is(lx, after, "raw", &end, &esign))
            pos = lex_raw(lx, end, esign);
        else {
            push(lx, (jn_tok){.type = kind == '{' ? JT_VAR_BEGIN : JT_BLOCK_BEGIN, .line = lx->line});
            pos = lex_tag(lx, after, kind == '{' ? JT_VAR_END : JT_BLOCK_END, kind == '{' ? "}}" : "%}");
        }
    }
    push(lx, (jn_tok){.type = JT_EOF, .line = lx->line});
}
