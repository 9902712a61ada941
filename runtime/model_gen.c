/* Synthetic model writer (see model_gen.h). */
#include "runtime/model_gen.h"

#include "kernels/kn.h"
#include "runtime/gguf.h"
#include "runtime/quantize.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SPM_SPACE "\xe2\x96\x81" /* U+2581, SentencePiece's visible space */

void rt_gen_params_default(rt_gen_params *p)
{
    *p = (rt_gen_params){
        .dim = 256,
        .layers = 4,
        .heads = 8,
        .kv_heads = 4,
        .ffn = 768,
        .vocab = 1024,
        .ctx = 2048,
        .type = KN_TYPE_Q8_0,
        .seed = 1,
        .rope_base = 10000.0f,
    };
}

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static float uniform(uint64_t *s)
{
    return (float)((splitmix64(s) >> 40) * (1.0 / 8388608.0) - 1.0);
}

static uint64_t name_hash(const char *name)
{
    uint64_t h = 1469598103934665603ull;
    for (; *name; name++)
        h = (h ^ (uint8_t)*name) * 1099511628211ull;
    return h;
}

/* Owned tensor buffers, freed after the write. */
typedef struct gen_bufs {
    void **p;
    int n, cap;
} gen_bufs;

static void *bufs_alloc(gen_bufs *b, size_t size)
{
    if (b->n == b->cap) {
        int cap = b->cap ? b->cap * 2 : 64;
        void **np = realloc(b->p, (size_t)cap * sizeof(void *));
        if (!np)
            return NULL;
        b->p = np;
        b->cap = cap;
    }
    void *p = malloc(size ? size : 1);
    if (p)
        b->p[b->n++] = p;
    return p;
}

/* A matrix of n_out rows of n_in uniform values scaled to variance
 * scale^2 / n_in, quantized row by row to `type`. */
static int add_matrix(rt_gguf_writer *w, gen_bufs *b, const rt_gen_params *p, const char *name, uint32_t type,
                      int n_in, int n_out, float scale)
{
    size_t row = kn_row_bytes(type, n_in);
    uint8_t *data = bufs_alloc(b, row * (size_t)n_out);
    float *tmp = malloc((size_t)n_in * sizeof(float));
    if (!data || !tmp) {
        free(tmp);
        return -ENOMEM;
    }
    uint64_t s = p->seed ^ name_hash(name);
    float a = scale * sqrtf(3.0f / (float)n_in);
    for (int o = 0; o < n_out; o++) {
        for (int i = 0; i < n_in; i++)
            tmp[i] = a * uniform(&s);
        kn_quantize_row((kn_type)type, tmp, data + (size_t)o * row, n_in);
    }
    free(tmp);
    int64_t ne[2] = {n_in, n_out};
    return rt_gguf_writer_add_tensor(w, name, type, 2, ne, data, row * (size_t)n_out);
}

static int add_norm(rt_gguf_writer *w, gen_bufs *b, const rt_gen_params *p, const char *name, int n)
{
    float *v = bufs_alloc(b, (size_t)n * sizeof(float));
    if (!v)
        return -ENOMEM;
    uint64_t s = p->seed ^ name_hash(name);
    for (int i = 0; i < n; i++)
        v[i] = 1.0f + 0.1f * uniform(&s);
    int64_t ne[1] = {n};
    return rt_gguf_writer_add_tensor(w, name, KN_TYPE_F32, 1, ne, v, (uint64_t)n * sizeof(float));
}

/* <unk> <s> </s>, the 256 byte tokens, then pieces of lowercase letters
 * with and without a leading U+2581, shortest first, until the vocabulary
 * is full. Every prefix of a piece is a piece, so SentencePiece merging can
 * build each one from characters. */
static int add_vocab(rt_gguf_writer *w, const rt_gen_params *p)
{
    int n = p->vocab;
    char **tokens = calloc((size_t)n, sizeof(char *));
    float *scores = calloc((size_t)n, sizeof(float));
    int32_t *types = calloc((size_t)n, sizeof(int32_t));
    int rc = -ENOMEM;
    if (!tokens || !scores || !types)
        goto out;
    const char *special[3] = {"<unk>", "<s>", "</s>"};
    int t = 0;
    for (; t < 3; t++) {
        tokens[t] = strdup(special[t]);
        types[t] = t == 0 ? 2 : 3;
    }
    for (int byte = 0; byte < 256; byte++, t++) {
        char buf[8];
        snprintf(buf, sizeof(buf), "<0x%02X>", byte);
        tokens[t] = strdup(buf);
        types[t] = 6;
    }
    if (t < n) {
        tokens[t] = strdup(SPM_SPACE);
        types[t] = 1;
        scores[t] = -1.0f;
        t++;
    }
    for (int len = 1; t < n && len <= 6; len++) {
        long count = 1;
        for (int i = 0; i < len; i++)
            count *= 26;
        for (long k = 0; k < count && t < n; k++) {
            for (int spaced = 0; spaced < 2 && t < n; spaced++) {
                char buf[16];
                int o = 0;
                if (spaced) {
                    memcpy(buf, SPM_SPACE, 3);
                    o = 3;
                }
                long v = k;
                for (int i = len - 1; i >= 0; i--, v /= 26)
                    buf[o + i] = (char)('a' + v % 26);
                buf[o + len] = '\0';
                tokens[t] = strdup(buf);
                types[t] = 1;
                scores[t] = -(float)t;
                t++;
            }
        }
    }
    for (int i = 0; i < n; i++)
        if (!tokens[i])
            goto out;
    if ((rc = rt_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama")) ||
        (rc = rt_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tokens, (uint64_t)n)) ||
        (rc = rt_gguf_writer_add_arr_f32(w, "tokenizer.ggml.scores", scores, (uint64_t)n)) ||
        (rc = rt_gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", types, (uint64_t)n)) ||
        (rc = rt_gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 0)) ||
        (rc = rt_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1)) ||
        (rc = rt_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2)) ||
        (rc = rt_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", true)) ||
        (rc = rt_gguf_writer_add_bool(w, "tokenizer.ggml.add_eos_token", false)))
        goto out;
    if (p->chat_template && (rc = rt_gguf_writer_add_str(w, "tokenizer.chat_template", p->chat_template)))
        goto out;
    rc = 0;
out:
    if (tokens)
        for (int i = 0; i < n; i++)
            free(tokens[i]);
    free(tokens);
    free(scores);
    free(types);
    return rc;
}

static int check_params(const rt_gen_params *p, char *err, size_t err_len)
{
    int64_t blk = kn_type_block_elems(p->type);
    if (!kn_type_supported(p->type) || rt_ftype_of_type(p->type) < 0) {
        snprintf(err, err_len, "unsupported weight type %u", p->type);
        return -EINVAL;
    }
    if (p->dim <= 0 || p->layers <= 0 || p->heads <= 0 || p->kv_heads <= 0 || p->ffn <= 0 || p->ctx <= 0) {
        snprintf(err, err_len, "dim, layers, heads, kv-heads, ffn and ctx must be positive");
        return -EINVAL;
    }
    if (p->dim % p->heads || (p->dim / p->heads) % 2 || p->heads % p->kv_heads) {
        snprintf(err, err_len, "dim %d must split into %d heads of even size, and kv-heads %d must divide heads",
                 p->dim, p->heads, p->kv_heads);
        return -EINVAL;
    }
    if (p->dim % blk || p->ffn % blk) {
        snprintf(err, err_len, "dim %d and ffn %d must be multiples of %lld for %s", p->dim, p->ffn,
                 (long long)blk, kn_type_name(p->type));
        return -EINVAL;
    }
    if (p->vocab < 259 || p->vocab > 1 << 22) {
        snprintf(err, err_len, "vocab %d must be between 259 (3 specials + 256 bytes) and %d", p->vocab, 1 << 22);
        return -EINVAL;
    }
    return 0;
}

int rt_model_gen(const rt_gen_params *p, const char *path, char *err, size_t err_len)
{
    int rc = check_params(p, err, err_len);
    if (rc)
        return rc;
    gen_bufs bufs = {0};
    rt_gguf_writer *w = rt_gguf_writer_new();
    if (!w)
        return -ENOMEM;
    int head_dim = p->dim / p->heads;
    int kv_dim = head_dim * p->kv_heads;
    char name[64];
    if ((rc = rt_gguf_writer_add_str(w, "general.architecture", "llama")) ||
        (rc = rt_gguf_writer_add_str(w, "general.name", "infergate synthetic (random weights)")) ||
        (rc = rt_gguf_writer_add_u32(w, "general.file_type", (uint32_t)rt_ftype_of_type(p->type))) ||
        (rc = rt_gguf_writer_add_u32(w, "general.quantization_version", 2)) ||
        (rc = rt_gguf_writer_add_u32(w, "llama.context_length", (uint32_t)p->ctx)) ||
        (rc = rt_gguf_writer_add_u32(w, "llama.embedding_length", (uint32_t)p->dim)) ||
        (rc = rt_gguf_writer_add_u32(w, "llama.block_count", (uint32_t)p->layers)) ||
        (rc = rt_gguf_writer_add_u32(w, "llama.feed_forward_length", (uint32_t)p->ffn)) ||
        (rc = rt_gguf_writer_add_u32(w, "llama.attention.head_count", (uint32_t)p->heads)) ||
        (rc = rt_gguf_writer_add_u32(w, "llama.attention.head_count_kv", (uint32_t)p->kv_heads)) ||
        (rc = rt_gguf_writer_add_u32(w, "llama.rope.dimension_count", (uint32_t)head_dim)) ||
        (rc = rt_gguf_writer_add_f32(w, "llama.rope.freq_base", p->rope_base)) ||
        (rc = rt_gguf_writer_add_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f)) ||
        (rc = rt_gguf_writer_add_u32(w, "llama.vocab_size", (uint32_t)p->vocab)) || (rc = add_vocab(w, p)))
        goto out;
    if ((p->rope_scaling && (rc = rt_gguf_writer_add_str(w, "llama.rope.scaling.type", p->rope_scaling))) ||
        (p->rope_scaling_factor > 0 &&
         (rc = rt_gguf_writer_add_f32(w, "llama.rope.scaling.factor", p->rope_scaling_factor))))
        goto out;
    if (p->rope_freqs) {
        int64_t ne[1] = {head_dim / 2};
        if ((rc = rt_gguf_writer_add_tensor(w, "rope_freqs.weight", KN_TYPE_F32, 1, ne, p->rope_freqs,
                                            (uint64_t)(head_dim / 2) * sizeof(float))))
            goto out;
    }

    /* Embeddings of unit scale; projections of variance 1/n_in so that
     * activations keep their size through the layers. */
    if ((rc = add_matrix(w, &bufs, p, "token_embd.weight", p->type, p->dim, p->vocab, sqrtf((float)p->dim))))
        goto out;
    for (int l = 0; l < p->layers; l++) {
        /* The projections back into the residual stream are scaled down by
         * sqrt(2 * layers), as GPT-2 initialises them: the residual path
         * dominates, as in trained models, rather than a chaotic random
         * network that amplifies every rounding. */
        float res = 1.0f / sqrtf(2.0f * (float)p->layers);
        struct {
            const char *suffix;
            int n_in, n_out;
            float scale;
        } m[] = {
            {"attn_q.weight", p->dim, p->dim, 1},   {"attn_k.weight", p->dim, kv_dim, 1},
            {"attn_v.weight", p->dim, kv_dim, 1},   {"attn_output.weight", p->dim, p->dim, res},
            {"ffn_gate.weight", p->dim, p->ffn, 1}, {"ffn_up.weight", p->dim, p->ffn, 1},
            {"ffn_down.weight", p->ffn, p->dim, res},
        };
        snprintf(name, sizeof(name), "blk.%d.attn_norm.weight", l);
        if ((rc = add_norm(w, &bufs, p, name, p->dim)))
            goto out;
        for (size_t i = 0; i < sizeof(m) / sizeof(m[0]); i++) {
            snprintf(name, sizeof(name), "blk.%d.%s", l, m[i].suffix);
            if ((rc = add_matrix(w, &bufs, p, name, p->type, m[i].n_in, m[i].n_out, m[i].scale)))
                goto out;
        }
        snprintf(name, sizeof(name), "blk.%d.ffn_norm.weight", l);
        if ((rc = add_norm(w, &bufs, p, name, p->dim)))
            goto out;
    }
    if ((rc = add_norm(w, &bufs, p, "output_norm.weight", p->dim)))
        goto out;
    /* Logits of a few units spread, so greedy choices are clear. */
    if (!p->tied && (rc = add_matrix(w, &bufs, p, "output.weight", p->type, p->dim, p->vocab, 4.0f)))
        goto out;
    rc = rt_gguf_writer_write(w, path, err, err_len);
    goto done;
out:
    if (rc == -ENOMEM)
        snprintf(err, err_len, "out of memory while generating the model");
done:
    rt_gguf_writer_free(w);
    for (int i = 0; i < bufs.n; i++)
        free(bufs.p[i]);
    free(bufs.p);
    return rc;
}
