/* libFuzzer target for the grammar compiler (runtime/grammar): the first
 * byte picks what the rest is — GBNF (even) or a JSON Schema (odd), which
 * rt_schema_gbnf writes as GBNF first — and the grammar is compiled for a
 * small vocabulary (the 256 byte tokens, JSON's punctuation and a few
 * words, written once in LLVMFuzzerInitialize). A grammar that compiles is
 * then walked for a few tokens, each picked among those the mask allows by
 * the input's bytes. The seed corpus is the schemas and grammars the tests
 * use (corpus_grammar), the dictionary grammar.dict.
 *
 * Invariants (abort on violation): compiling returns 0 or -EINVAL with a
 * reason (or -ENOMEM); the GBNF a schema is written as compiles unless it is
 * too large or no value satisfies it; every token the mask allows is accepted, and one it refuses is
 * not; a schema's text that the matcher says is complete parses as JSON.
 *
 * A state past the matcher's bound of parse stacks (an ambiguous grammar,
 * corpus_grammar/gbnf_ambiguous_past_bound; an enum of hundreds of values
 * before enums were written as prefix trees) once let the mask allow a
 * token accept refused: both now follow match.c's run_stack.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "runtime/gguf.h"
#include "runtime/grammar/grammar.h"
#include "runtime/tokenizer.h"

#define MAX_STEPS 48

static rt_tokenizer *g_tok;
static rt_gvocab *g_vocab;

static void die(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_grammar: %s: %s\n", what, detail);
    abort();
}

/* A SentencePiece vocabulary of the byte tokens and some JSON pieces,
 * written to a temporary file and loaded (as fuzz_tokenizer does). */
static rt_tokenizer *vocab(void)
{
    static const char *const words[] = {
        "\xe2\x96\x81",   "{\"",   "\":",  "\",", "\"}", "{",  "}", "[", "]", ",", ":",  "\"",
        "true",           "false", "null", "0",   "1",   "12", "-", ".", "e", "a", "ab", "name",
        "\xe2\x96\x81\"", "\\n",   "\\"};
    const size_t n_words = sizeof(words) / sizeof(words[0]);
    size_t n = 3 + 256 + n_words;
    char **s = calloc(n, sizeof(*s));
    float *score = calloc(n, sizeof(*score));
    int32_t *type = calloc(n, sizeof(*type));
    if (!s || !score || !type)
        die("vocab", "out of memory");
    s[0] = strdup("<unk>"), type[0] = 2;
    s[1] = strdup("<s>"), type[1] = 3;
    s[2] = strdup("</s>"), type[2] = 3;
    for (int b = 0; b < 256; b++) {
        char buf[16];
        snprintf(buf, sizeof(buf), "<0x%02X>", b);
        s[3 + b] = strdup(buf), type[3 + b] = 6;
    }
    for (size_t i = 0; i < n_words; i++)
        s[259 + i] = strdup(words[i]), type[259 + i] = 1, score[259 + i] = -(float)i;
    char path[] = "/tmp/infergate-fuzz-grammar-XXXXXX", err[256] = "";
    int fd = mkstemp(path);
    if (fd < 0)
        die("mkstemp", path);
    close(fd);
    rt_gguf_writer *w = rt_gguf_writer_new();
    if (!w || rt_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama") ||
        rt_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)s, (uint64_t)n) ||
        rt_gguf_writer_add_arr_f32(w, "tokenizer.ggml.scores", score, (uint64_t)n) ||
        rt_gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", type, (uint64_t)n) ||
        rt_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1) ||
        rt_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2) ||
        rt_gguf_writer_write(w, path, err, sizeof(err)))
        die("writer", err);
    rt_gguf_writer_free(w);
    for (size_t i = 0; i < n; i++)
        free(s[i]);
    free(s);
    free(score);
    free(type);
    rt_gguf *g = NULL;
    rt_tokenizer *t = NULL;
    if (rt_gguf_open(path, &g, err, sizeof(err)) || rt_tokenizer_load(g, &t, err, sizeof(err)))
        die("load", err);
    rt_gguf_free(g);
    unlink(path);
    return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    g_tok = vocab();
    if (!(g_vocab = rt_gvocab_new(g_tok)))
        die("gvocab", "out of memory");
    return 0;
}

/* Walks m for a few tokens picked by pick[]; the text it writes in *text. */
static void walk(rt_gmatch *m, const uint8_t *pick, size_t n_pick, char *text, size_t *len, bool *ended)
{
    int32_t nv = rt_gvocab_n(g_vocab);
    uint32_t *mask = calloc(((size_t)nv + 31) / 32, sizeof(uint32_t));
    int32_t *allowed = malloc((size_t)nv * sizeof(int32_t));
    if (!mask || !allowed)
        die("walk", "out of memory");
    *len = 0;
    *ended = false;
    for (size_t step = 0; step < MAX_STEPS && !rt_gmatch_must_end(m); step++) {
        if (rt_gmatch_mask(m, mask))
            break;
        int k = 0;
        for (int32_t t = 0; t < nv; t++)
            if ((mask[t >> 5] >> (t & 31)) & 1)
                allowed[k++] = t;
        if (!k)
            die("walk", "an empty mask returned 0");
        /* one refused token (if any) must be refused by accept too */
        uint32_t r = n_pick ? pick[step % n_pick] : 0;
        int32_t bad = (int32_t)((r * 131u + step) % (uint32_t)nv);
        if (!((mask[bad >> 5] >> (bad & 31)) & 1) && rt_gmatch_accept(m, bad) != -EINVAL)
            die("walk", "the matcher accepted a token the mask refused");
        int32_t t = allowed[(r + step) % (uint32_t)k];
        if (rt_gmatch_accept(m, t))
            die("walk", "the matcher refused a token the mask allowed");
        if (rt_tokenizer_is_eog(g_tok, t)) {
            *ended = true;
            break;
        }
        size_t pl = 0;
        const char *p = rt_tokenizer_piece(g_tok, t, &pl);
        if (*len + pl < 4096) {
            memcpy(text + *len, p, pl);
            *len += pl;
        }
    }
    if (rt_gmatch_must_end(m))
        *ended = true;
    free(mask);
    free(allowed);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 8192)
        return 0;
    bool schema = data[0] & 1;
    const char *src = (const char *)data + 1;
    size_t src_len = size - 1;
    char err[256] = "", *gbnf = NULL;
    size_t gbnf_len = 0;
    if (schema) {
        json_t *s = json_loadb(src, src_len, JSON_DECODE_ANY, NULL);
        if (!s)
            return 0;
        int rc = rt_schema_gbnf(s, "", &gbnf, &gbnf_len, err, sizeof(err));
        json_decref(s);
        if (rc) {
            if ((rc != -EINVAL && rc != -ENOMEM) || !err[0])
                die("schema refused without a reason", err);
            free(gbnf);
            return 0;
        }
        char *g = realloc(gbnf, gbnf_len + 32);
        if (!g)
            die("schema", "out of memory");
        gbnf = g;
        gbnf_len += (size_t)snprintf(gbnf + gbnf_len, 32, "root ::= value\n");
        src = gbnf;
        src_len = gbnf_len;
    }
    rt_grammar *g = NULL;
    int rc = rt_grammar_new(src, src_len, g_vocab, &g, err, sizeof(err));
    if (rc) {
        if ((rc != -EINVAL && rc != -ENOMEM) || !err[0])
            die("refused without a reason", err);
        if (schema && rc == -EINVAL && !strstr(err, "too") && !strstr(err, "never end"))
            die("a schema's GBNF does not compile", err);
        free(gbnf);
        return 0;
    }
    rt_gmatch *m = rt_gmatch_new(g);
    if (!m)
        die("gmatch_new", "out of memory");
    static char text[4096];
    size_t len;
    bool ended;
    walk(m, data, size, text, &len, &ended);
    if (schema && ended && rt_gmatch_can_end(m)) {
        json_t *v = json_loadb(text, len, JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL, NULL);
        if (!v)
            die("a complete answer to a schema is not JSON", text);
        json_decref(v);
    }
    rt_gmatch_free(m);
    rt_grammar_free(g);
    free(gbnf);
    return 0;
}
