/* grammar_sample MODEL.gguf: constrained answers from a "model" that picks
 * uniformly among the tokens a grammar allows (the synthetic random model
 * does about that), for the tests that hold runtime/grammar against a JSON
 * Schema validator that is not ours (tests/unit/grammar_oracle.py).
 *
 * Each stdin line is {"schema": {...}} or {"gbnf": "..."} with "n"
 * answers, "seed" and "max_tokens"; each stdout line is {"outputs": [...],
 * "ended": [...], "us_per_mask": x} or {"error": ..., "rc": N}. Only the
 * model's tokenizer is read. Exit 2 for bad arguments. */
#include "runtime/gguf.h"
#include "runtime/grammar/grammar.h"
#include "runtime/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* One answer: its text, whether it ended by the grammar (not max_tokens). */
static json_t *answer(rt_grammar *g, const rt_tokenizer *tok, int max_tokens, uint64_t *rng, uint32_t *mask,
                      int32_t *allowed, double *mask_s, long *masks, bool *ended)
{
    rt_gmatch *m = rt_gmatch_new(g);
    int32_t n = rt_tokenizer_n_vocab(tok);
    char *text = malloc(1);
    size_t len = 0;
    text[0] = '\0';
    *ended = false;
    for (int step = 0; m && step < max_tokens; step++) {
        if (rt_gmatch_must_end(m)) {
            *ended = true;
            break;
        }
        double t0 = now_s();
        int rc = rt_gmatch_mask(m, mask);
        *mask_s += now_s() - t0;
        (*masks)++;
        if (rc)
            break;
        int k = 0;
        for (int32_t t = 0; t < n; t++)
            if ((mask[t >> 5] >> (t & 31)) & 1)
                allowed[k++] = t;
        int32_t t = allowed[next(rng) % (uint64_t)k];
        if (rt_gmatch_accept(m, t)) {
            fprintf(stderr, "grammar_sample: the mask allowed token %d the matcher refused\n", t);
            exit(3);
        }
        if (rt_tokenizer_is_eog(tok, t)) {
            *ended = true;
            break;
        }
        size_t pl = 0;
        const char *p = rt_tokenizer_piece(tok, t, &pl);
        text = realloc(text, len + pl + 1);
        memcpy(text + len, p, pl);
        len += pl;
        text[len] = '\0';
    }
    if (m && rt_gmatch_must_end(m))
        *ended = true;
    rt_gmatch_free(m);
    json_t *s = json_stringn(text, len);
    free(text);
    return s ? s : json_null();
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: grammar_sample MODEL.gguf < cases.jsonl\n");
        return 2;
    }
    char err[512];
    rt_gguf *gg;
    rt_tokenizer *tok;
    if (rt_gguf_open(argv[1], &gg, err, sizeof(err)) || rt_tokenizer_load(gg, &tok, err, sizeof(err))) {
        fprintf(stderr, "%s: %s\n", argv[1], err);
        return 2;
    }
    double t0 = now_s();
    rt_gvocab *v = rt_gvocab_new(tok);
    fprintf(stderr, "vocabulary trie: %.1f ms\n", (now_s() - t0) * 1e3);
    int32_t n = rt_tokenizer_n_vocab(tok);
    uint32_t *mask = calloc(((size_t)n + 31) / 32, sizeof(uint32_t));
    int32_t *allowed = calloc((size_t)n, sizeof(int32_t));
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, stdin) > 0) {
        json_t *c = json_loads(line, 0, NULL);
        if (!c)
            return 2;
        char *gbnf = NULL;
        size_t glen = 0;
        int rc = 0;
        json_t *schema = json_object_get(c, "schema");
        if (schema) {
            rc = rt_schema_gbnf(schema, "", &gbnf, &glen, err, sizeof(err));
            if (!rc) {
                const char root[] = "root ::= value\n";
                gbnf = realloc(gbnf, glen + sizeof(root));
                memcpy(gbnf + glen, root, sizeof(root));
                glen += sizeof(root) - 1;
            }
        } else {
            const char *s = json_string_value(json_object_get(c, "gbnf"));
            gbnf = strdup(s ? s : "");
            glen = strlen(gbnf);
        }
        rt_grammar *g = NULL;
        double tc = now_s();
        if (!rc)
            rc = rt_grammar_new(gbnf, glen, v, &g, err, sizeof(err));
        tc = now_s() - tc;
        json_t *o = json_object();
        if (rc) {
            json_object_set_new(o, "error", json_string(err));
            json_object_set_new(o, "rc", json_integer(rc));
            if (gbnf && getenv("GRAMMAR_SAMPLE_DUMP"))
                fprintf(stderr, "%s\n", gbnf);
        } else {
            json_t *outs = json_array(), *ends = json_array();
            uint64_t rng = (uint64_t)json_integer_value(json_object_get(c, "seed")) * 2654435761u + 1;
            int count = (int)json_integer_value(json_object_get(c, "n"));
            int max_tokens = (int)json_integer_value(json_object_get(c, "max_tokens"));
            double mask_s = 0;
            long masks = 0;
            for (int i = 0; i < (count ? count : 1); i++) {
                bool ended;
                json_array_append_new(outs, answer(g, tok, max_tokens ? max_tokens : 512, &rng, mask, allowed,
                                                   &mask_s, &masks, &ended));
                json_array_append_new(ends, json_boolean(ended));
            }
            json_object_set_new(o, "outputs", outs);
            json_object_set_new(o, "ended", ends);
            json_object_set_new(o, "us_per_mask", json_real(masks ? mask_s / (double)masks * 1e6 : 0));
            json_object_set_new(o, "compile_ms", json_real(tc * 1e3));
            rt_grammar_free(g);
        }
        char *s = json_dumps(o, JSON_COMPACT);
        puts(s);
        fflush(stdout);
        free(s);
        json_decref(o);
        json_decref(c);
        free(gbnf);
    }
    free(line);
    free(mask);
    free(allowed);
    rt_gvocab_free(v);
    rt_tokenizer_free(tok);
    rt_gguf_free(gg);
    return 0;
}
