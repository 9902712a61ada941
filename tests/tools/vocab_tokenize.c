/* vocab_tokenize VOCAB.json: our tokenizer on a published vocabulary, for
 * the test that holds it against Hugging Face's tokenizer of the same
 * vocabulary (tests/unit/vocab_oracle.py).
 *
 * VOCAB.json is what tests/integration/node/vocab_dump.mjs writes from a
 * model's tokenizer.json, as llama.cpp's converter writes it into a GGUF:
 * {"pre": ..., "tokens": [...], "token_type": [...], "merges": [...],
 * "eos": id}, and for a SentencePiece vocabulary {"model": "llama",
 * "scores": [...], "add_space_prefix": bool} (no pre-tokenizer, no merges:
 * what llama.cpp's converter writes for one). It goes into a GGUF in memory, and the tokenizer is loaded
 * from that as a worker loads one. Each stdin line is a JSON string; each
 * stdout line is the JSON array of its token ids (no BOS, specials as
 * text) or {"error": ...}. Exit 2 for a bad VOCAB.json. */
#include "runtime/gguf.h"
#include "runtime/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A JSON array of strings as a C array (pointing into arr). */
static const char **strings(json_t *arr, size_t *n)
{
    *n = json_array_size(arr);
    const char **v = calloc(*n ? *n : 1, sizeof(*v));
    for (size_t i = 0; v && i < *n; i++)
        if (!(v[i] = json_string_value(json_array_get(arr, i)))) {
            free(v);
            return NULL;
        }
    return v;
}

static rt_tokenizer *load(const char *path)
{
    json_error_t jerr;
    json_t *o = json_load_file(path, 0, &jerr);
    if (!o) {
        fprintf(stderr, "vocab_tokenize: %s: %s (line %d)\n", path, jerr.text, jerr.line);
        return NULL;
    }
    size_t n_tok, n_merges;
    const char **tok = strings(json_object_get(o, "tokens"), &n_tok);
    const char **merges = strings(json_object_get(o, "merges"), &n_merges);
    json_t *types = json_object_get(o, "token_type"), *scores_j = json_object_get(o, "scores");
    int32_t *type = calloc(n_tok ? n_tok : 1, sizeof(*type));
    float *scores = calloc(n_tok ? n_tok : 1, sizeof(*scores));
    const char *pre = json_string_value(json_object_get(o, "pre"));
    const char *model = json_string_value(json_object_get(o, "model"));
    bool spm = model && strcmp(model, "llama") == 0;
    rt_tokenizer *t = NULL;
    rt_gguf *g = NULL;
    void *mem = NULL;
    size_t mem_len;
    char err[512] = "";
    if (!tok || !merges || !type || !scores || !pre || json_array_size(types) != n_tok ||
        (spm && json_array_size(scores_j) != n_tok)) {
        fprintf(stderr, "vocab_tokenize: %s: needs pre, tokens, token_type (as many) and merges; "
                        "scores (as many) for model llama\n", path);
        goto out;
    }
    for (size_t i = 0; i < n_tok; i++) {
        type[i] = (int32_t)json_integer_value(json_array_get(types, i));
        scores[i] = spm ? (float)json_number_value(json_array_get(scores_j, i)) : 0.0f;
    }
    rt_gguf_writer *w = rt_gguf_writer_new();
    int wrc = !w || rt_gguf_writer_add_str(w, "tokenizer.ggml.model", spm ? "llama" : "gpt2");
    if (!wrc && spm)
        wrc = rt_gguf_writer_add_arr_f32(w, "tokenizer.ggml.scores", scores, n_tok) ||
              rt_gguf_writer_add_bool(w, "tokenizer.ggml.add_space_prefix",
                                      json_is_true(json_object_get(o, "add_space_prefix")));
    else if (!wrc)
        wrc = rt_gguf_writer_add_str(w, "tokenizer.ggml.pre", pre) ||
              rt_gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", merges, n_merges);
    if (wrc || rt_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", tok, n_tok) ||
        rt_gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", type, n_tok) ||
        rt_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id",
                               (uint32_t)json_integer_value(json_object_get(o, "eos"))) ||
        rt_gguf_writer_write_mem(w, &mem, &mem_len, err, sizeof(err)) ||
        rt_gguf_open_mem(mem, mem_len, &g, err, sizeof(err)) || rt_tokenizer_load(g, &t, err, sizeof(err))) {
        fprintf(stderr, "vocab_tokenize: %s: %s\n", path, err[0] ? err : "the GGUF could not be built");
        t = NULL;
    }
    rt_gguf_writer_free(w);
    if (t && !spm && rt_tokenizer_pre_fallback(t)) {
        fprintf(stderr, "vocab_tokenize: %s: pre-tokenizer '%s' is not ours\n", path, pre);
        rt_tokenizer_free(t);
        t = NULL;
    }
out:
    /* the tokenizer keeps what it needs of the GGUF */
    rt_gguf_free(g);
    free(mem);
    free(tok);
    free(merges);
    free(type);
    free(scores);
    json_decref(o);
    return t;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: vocab_tokenize VOCAB.json < lines of JSON strings\n");
        return 2;
    }
    rt_tokenizer *t = load(argv[1]);
    if (!t)
        return 2;
    size_t cap = 0;
    char *line = NULL;
    int32_t *ids = NULL;
    int max = 0;
    while (getline(&line, &cap, stdin) > 0) {
        json_error_t jerr;
        json_t *in = json_loads(line, JSON_DECODE_ANY, &jerr), *out;
        const char *text = json_string_value(in);
        size_t len = json_string_length(in);
        int n = text ? rt_tokenizer_encode(t, text, len, false, false, ids, max) : -1;
        if (n > max) {
            int32_t *more = realloc(ids, (size_t)(unsigned)n * sizeof(*ids));
            if (more) {
                ids = more;
                max = n;
                n = rt_tokenizer_encode(t, text, len, false, false, ids, max);
            } else {
                n = -1;
            }
        }
        if (n < 0) {
            out = json_pack("{s:s, s:i}", "error", text ? "encode failed" : "not a JSON string", "rc", n);
        } else {
            out = json_array();
            for (int i = 0; i < n; i++)
                json_array_append_new(out, json_integer(ids[i]));
        }
        char *s = json_dumps(out, JSON_COMPACT);
        printf("%s\n", s ? s : "{\"error\": \"out of memory\"}");
        fflush(stdout);
        free(s);
        json_decref(out);
        json_decref(in);
    }
    free(line);
    free(ids);
    rt_tokenizer_free(t);
    return 0;
}
