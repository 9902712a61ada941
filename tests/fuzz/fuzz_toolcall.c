/* libFuzzer target for the tool-call parser (runtime/toolcall): the first
 * byte picks the format (hermes, llama3, mistral, harmony) and the second a piece
 * size; the rest is a model's answer, fed whole and then in pieces of that
 * size, as a stream gives it. The seed corpus is recorded answers of each
 * format (corpus_toolcall), the dictionary toolcall.dict.
 *
 * Invariants (abort on violation): feeding never fails; the content and
 * the calls (and harmony's reasoning) are the same whole and in pieces;
 * every call has a name and arguments that parse as JSON; the content and
 * the reasoning are no longer than the answer. */
#include <jansson.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/toolcall.h"

static void die(const char *what)
{
    fprintf(stderr, "fuzz_toolcall: %s\n", what);
    abort();
}

/* Feeds text in pieces of `piece` bytes (0: whole); the content and the
 * reasoning joined. */
static rt_tc_parser *feed(rt_tc_format f, const char *text, size_t n, size_t piece, char *content,
                          size_t *c_len, char *thought, size_t *t_len)
{
    rt_tc_parser *p = rt_tc_parser_new(f);
    if (!p)
        die("out of memory");
    *c_len = *t_len = 0;
    size_t at = 0;
    do {
        size_t k = piece && n - at > piece ? piece : n - at;
        const char *c;
        size_t len;
        if (rt_tc_feed(p, text + at, k, at + k == n, &c, &len))
            die("feed failed");
        if (*c_len + len > n)
            die("more content than text");
        memcpy(content + *c_len, c, len);
        *c_len += len;
        rt_tc_reasoning(p, &c, &len);
        if (*t_len + len > n)
            die("more reasoning than text");
        memcpy(thought + *t_len, c, len);
        *t_len += len;
        at += k;
    } while (at < n);
    return p;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    rt_tc_format f = (rt_tc_format)(data[0] % 4);
    size_t piece = data[1] % 17 + 1;
    const char *text = (const char *)data + 2;
    size_t n = size - 2;
    char *a = malloc(n + 1), *b = malloc(n + 1), *ra = malloc(n + 1), *rb = malloc(n + 1);
    size_t a_len, b_len, ra_len, rb_len;
    rt_tc_parser *whole = feed(f, text, n, 0, a, &a_len, ra, &ra_len),
                 *pieces = feed(f, text, n, piece, b, &b_len, rb, &rb_len);
    if (a_len != b_len || memcmp(a, b, a_len))
        die("content differs whole and in pieces");
    if (ra_len != rb_len || memcmp(ra, rb, ra_len))
        die("reasoning differs whole and in pieces");
    if (rt_tc_n_calls(whole) != rt_tc_n_calls(pieces))
        die("calls differ whole and in pieces");
    for (int i = 0; i < rt_tc_n_calls(whole); i++) {
        const rt_tc_call *x = rt_tc_call_at(whole, i), *y = rt_tc_call_at(pieces, i);
        if (!x->name || strcmp(x->name, y->name) || strcmp(x->arguments, y->arguments))
            die("a call differs whole and in pieces");
        json_t *v = json_loads(x->arguments, JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL, NULL);
        if (!v)
            die("a call's arguments are not JSON");
        json_decref(v);
    }
    rt_tc_parser_free(whole);
    rt_tc_parser_free(pieces);
    free(a);
    free(b);
    free(ra);
    free(rb);
    return 0;
}
