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

/* What --arch writes beyond llama's tensors and keys: each family's as
 * llama.cpp's converter names them (see runtime/arch.c for what they do). */
enum {
    GEN_QKV_BIAS = 1u << 0,  /* attn_q/k/v.bias */
    GEN_QK_NORM = 1u << 1,   /* attn_q_norm / attn_k_norm of head_dim */
    GEN_QK_ROW = 1u << 2,    /* ... of the whole row (olmo2) */
    GEN_POST = 1u << 3,      /* post_attention_norm, post_ffw_norm */
    GEN_NO_PRE = 1u << 4,    /* no attn_norm / ffn_norm */
    GEN_SOFTCAP = 1u << 5,   /* gemma2's soft-cap keys */
    GEN_FUSED = 1u << 6,     /* attn_qkv and a double ffn_up (phi3) */
    GEN_LONGROPE = 1u << 7,  /* rope_factors_long / _short (phi3) */
    GEN_OAI = 1u << 8,       /* gpt-oss: sinks, every bias, post_attention_norm before the FFN, YaRN */
    GEN_GRANITE = 1u << 9,   /* granite's multipliers */
    GEN_TIED = 1u << 10,     /* no output.weight by default (gemma) */
    GEN_GEMMA3 = 1u << 11,   /* global RoPE base 1e6, linear scaling 8 */
};

typedef struct gen_arch {
    const char *name, *gguf; /* --arch, general.architecture */
    unsigned f;
    int experts, used; /* default experts (0: dense) */
    int swa;           /* attention.sliding_window written (0: none) */
} gen_arch;

static const gen_arch gen_archs[] = {
    {"llama", "llama", 0, 0, 0, 0},
    {"mixtral", "llama", 0, 8, 2, 0},
    {"qwen2", "qwen2", GEN_QKV_BIAS, 0, 0, 0},
    {"qwen3", "qwen3", GEN_QK_NORM, 0, 0, 0},
    {"qwen3moe", "qwen3moe", GEN_QK_NORM, 8, 2, 0},
    {"gemma2", "gemma2", GEN_POST | GEN_SOFTCAP | GEN_TIED, 0, 0, 4096},
    {"gemma3", "gemma3", GEN_POST | GEN_QK_NORM | GEN_TIED | GEN_GEMMA3, 0, 0, 1024},
    {"phi3", "phi3", GEN_FUSED | GEN_LONGROPE, 0, 0, 0},
    {"gpt-oss", "gpt-oss", GEN_OAI, 8, 2, 128},
    {"granite", "granite", GEN_GRANITE, 0, 0, 0},
    {"granitemoe", "granitemoe", GEN_GRANITE, 8, 2, 0},
    {"olmo2", "olmo2", GEN_NO_PRE | GEN_POST | GEN_QK_ROW, 0, 0, 0},
    {"smollm3", "smollm3", 0, 0, 0, 0},
    {"mistral3", "mistral3", 0, 0, 0, 0},
};

const char *rt_gen_arch_names(void)
{
    return "llama, mixtral, qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3, gpt-oss, granite, granitemoe, olmo2, "
           "smollm3, mistral3";
}

static const gen_arch *gen_arch_find(const char *name)
{
    for (size_t i = 0; i < sizeof(gen_archs) / sizeof(gen_archs[0]); i++)
        if (!strcmp(gen_archs[i].name, name ? name : "llama"))
            return &gen_archs[i];
    return NULL;
}

/* n_exp matrices of n_out x n_in in one 3D tensor (ffn_*_exps). */
static int add_experts(rt_gguf_writer *w, gen_bufs *b, const rt_gen_params *p, const char *name, uint32_t type,
                       int n_in, int n_out, int n_exp, float scale)
{
    size_t row = kn_row_bytes(type, n_in), rows = (size_t)n_out * n_exp;
    uint8_t *data = bufs_alloc(b, row * rows);
    float *tmp = malloc((size_t)n_in * sizeof(float));
    if (!data || !tmp) {
        free(tmp);
        return -ENOMEM;
    }
    uint64_t s = p->seed ^ name_hash(name);
    float a = scale * sqrtf(3.0f / (float)n_in);
    for (size_t o = 0; o < rows; o++) {
        for (int i = 0; i < n_in; i++)
            tmp[i] = a * uniform(&s);
        kn_quantize_row((kn_type)type, tmp, data + o * row, n_in);
    }
    free(tmp);
    int64_t ne[3] = {n_in, n_out, n_exp};
    return rt_gguf_writer_add_tensor(w, name, type, 3, ne, data, row * rows);
}

/* A small F32 tensor of n x rows values around `center` (biases, sinks,
 * RoPE factors). */
static int add_small(rt_gguf_writer *w, gen_bufs *b, const rt_gen_params *p, const char *name, int n, int rows,
                     float center, float spread)
{
    float *v = bufs_alloc(b, (size_t)n * rows * sizeof(float));
    if (!v)
        return -ENOMEM;
    uint64_t s = p->seed ^ name_hash(name);
    for (size_t i = 0; i < (size_t)n * rows; i++)
        v[i] = center + spread * uniform(&s);
    int64_t ne[2] = {n, rows};
    return rt_gguf_writer_add_tensor(w, name, KN_TYPE_F32, rows > 1 ? 2 : 1, ne, v,
                                     (uint64_t)n * rows * sizeof(float));
}

typedef struct gen_ctx {
    rt_gguf_writer *w;
    gen_bufs bufs;
    const rt_gen_params *p;
    const gen_arch *a;
    int head_dim, q_dim, kv_dim, experts, used;
} gen_ctx;

static int kv_u32(gen_ctx *g, const char *suffix, uint32_t v)
{
    char key[96];
    snprintf(key, sizeof(key), "%s.%s", g->a->gguf, suffix);
    return rt_gguf_writer_add_u32(g->w, key, v);
}

static int kv_f32(gen_ctx *g, const char *suffix, float v)
{
    char key[96];
    snprintf(key, sizeof(key), "%s.%s", g->a->gguf, suffix);
    return rt_gguf_writer_add_f32(g->w, key, v);
}

static int kv_str(gen_ctx *g, const char *suffix, const char *v)
{
    char key[96];
    snprintf(key, sizeof(key), "%s.%s", g->a->gguf, suffix);
    return rt_gguf_writer_add_str(g->w, key, v);
}

static int write_keys(gen_ctx *g)
{
    const rt_gen_params *p = g->p;
    const unsigned f = g->a->f;
    rt_gguf_writer *w = g->w;
    int rc;
    const int swa = p->swa > 0 ? p->swa : g->a->swa;
    if ((rc = rt_gguf_writer_add_str(w, "general.architecture", g->a->gguf)) ||
        (rc = rt_gguf_writer_add_str(w, "general.name", "infergate synthetic (random weights)")) ||
        (rc = rt_gguf_writer_add_u32(w, "general.file_type", (uint32_t)rt_ftype_of_type(p->type))) ||
        (rc = rt_gguf_writer_add_u32(w, "general.quantization_version", 2)) ||
        (rc = kv_u32(g, "context_length", (uint32_t)p->ctx)) || (rc = kv_u32(g, "embedding_length", (uint32_t)p->dim)) ||
        (rc = kv_u32(g, "block_count", (uint32_t)p->layers)) || (rc = kv_u32(g, "feed_forward_length", (uint32_t)p->ffn)) ||
        (rc = kv_u32(g, "attention.head_count", (uint32_t)p->heads)) ||
        (rc = kv_u32(g, "attention.head_count_kv", (uint32_t)p->kv_heads)) ||
        (rc = kv_u32(g, "rope.dimension_count", (uint32_t)g->head_dim)) ||
        (rc = kv_f32(g, "rope.freq_base", (f & GEN_GEMMA3) ? 1000000.0f : p->rope_base)) ||
        (rc = kv_f32(g, "attention.layer_norm_rms_epsilon", 1e-5f)) || (rc = kv_u32(g, "vocab_size", (uint32_t)p->vocab)) ||
        (rc = add_vocab(w, p)))
        return rc;
    if ((p->rope_scaling && (rc = kv_str(g, "rope.scaling.type", p->rope_scaling))) ||
        (p->rope_scaling_factor > 0 && (rc = kv_f32(g, "rope.scaling.factor", p->rope_scaling_factor))))
        return rc;
    if (g->experts && ((rc = kv_u32(g, "expert_count", (uint32_t)g->experts)) ||
                       (rc = kv_u32(g, "expert_used_count", (uint32_t)g->used)) ||
                       (rc = kv_u32(g, "expert_feed_forward_length", (uint32_t)p->ffn))))
        return rc;
    if (swa && (rc = kv_u32(g, "attention.sliding_window", (uint32_t)swa)))
        return rc;
    if ((f & GEN_SOFTCAP) &&
        ((rc = kv_f32(g, "attn_logit_softcapping", p->attn_softcap > 0 ? p->attn_softcap : 50.0f)) ||
         (rc = kv_f32(g, "final_logit_softcapping", p->final_softcap > 0 ? p->final_softcap : 30.0f))))
        return rc;
    if ((f & GEN_GEMMA3) && !p->rope_scaling &&
        ((rc = kv_str(g, "rope.scaling.type", "linear")) || (rc = kv_f32(g, "rope.scaling.factor", 8.0f))))
        return rc;
    if ((f & GEN_LONGROPE) && ((rc = kv_u32(g, "rope.scaling.original_context_length", (uint32_t)(p->ctx / 4))) ||
                               (rc = kv_f32(g, "rope.scaling.attn_factor", 1.19f))))
        return rc;
    if ((f & GEN_OAI) && !p->rope_scaling &&
        ((rc = kv_str(g, "rope.scaling.type", "yarn")) || (rc = kv_f32(g, "rope.scaling.factor", 32.0f)) ||
         (rc = kv_u32(g, "rope.scaling.original_context_length", (uint32_t)(p->ctx / 32 > 0 ? p->ctx / 32 : 1)))))
        return rc;
    if ((f & GEN_GRANITE) && ((rc = kv_f32(g, "embedding_scale", 12.0f)) || (rc = kv_f32(g, "residual_scale", 0.22f)) ||
                              (rc = kv_f32(g, "attention.scale", 0.015625f)) || (rc = kv_f32(g, "logit_scale", 8.0f))))
        return rc;
    if (p->rope_freqs) {
        int64_t ne[1] = {g->head_dim / 2};
        if ((rc = rt_gguf_writer_add_tensor(w, "rope_freqs.weight", KN_TYPE_F32, 1, ne, p->rope_freqs,
                                            (uint64_t)(g->head_dim / 2) * sizeof(float))))
            return rc;
    }
    if ((f & GEN_LONGROPE) && ((rc = add_small(w, &g->bufs, p, "rope_factors_long.weight", g->head_dim / 2, 1, 4.0f, 2.0f)) ||
                               (rc = add_small(w, &g->bufs, p, "rope_factors_short.weight", g->head_dim / 2, 1, 1.0f, 0.05f))))
        return rc;
    return 0;
}

static int add_layer(gen_ctx *g, int l)
{
    const rt_gen_params *p = g->p;
    const unsigned f = g->a->f;
    rt_gguf_writer *w = g->w;
    gen_bufs *b = &g->bufs;
    char name[96];
    int rc;
    /* The projections back into the residual stream are scaled down by
     * sqrt(2 * layers), as GPT-2 initialises them: the residual path
     * dominates, as in trained models, rather than a chaotic random
     * network that amplifies every rounding. */
    const float res = 1.0f / sqrtf(2.0f * (float)p->layers);
#define N(suffix) (snprintf(name, sizeof(name), "blk.%d.%s", l, suffix), name)
    if (!(f & GEN_NO_PRE) && (rc = add_norm(w, b, p, N("attn_norm.weight"), p->dim)))
        return rc;
    if (f & GEN_FUSED) {
        if ((rc = add_matrix(w, b, p, N("attn_qkv.weight"), p->type, p->dim, g->q_dim + 2 * g->kv_dim, 1)))
            return rc;
    } else if ((rc = add_matrix(w, b, p, N("attn_q.weight"), p->type, p->dim, g->q_dim, 1)) ||
               (rc = add_matrix(w, b, p, N("attn_k.weight"), p->type, p->dim, g->kv_dim, 1)) ||
               (rc = add_matrix(w, b, p, N("attn_v.weight"), p->type, p->dim, g->kv_dim, 1))) {
        return rc;
    }
    if ((rc = add_matrix(w, b, p, N("attn_output.weight"), p->type, g->q_dim, p->dim, res)))
        return rc;
    if ((f & (GEN_QKV_BIAS | GEN_OAI)) && ((rc = add_small(w, b, p, N("attn_q.bias"), g->q_dim, 1, 0, 0.1f)) ||
                                           (rc = add_small(w, b, p, N("attn_k.bias"), g->kv_dim, 1, 0, 0.1f)) ||
                                           (rc = add_small(w, b, p, N("attn_v.bias"), g->kv_dim, 1, 0, 0.1f))))
        return rc;
    if ((f & GEN_OAI) && ((rc = add_small(w, b, p, N("attn_output.bias"), p->dim, 1, 0, 0.05f)) ||
                          (rc = add_small(w, b, p, N("attn_sinks.weight"), p->heads, 1, 0, 1.0f))))
        return rc;
    const bool row = f & GEN_QK_ROW;
    if ((f & (GEN_QK_NORM | GEN_QK_ROW)) &&
        ((rc = add_norm(w, b, p, N("attn_q_norm.weight"), row ? g->q_dim : g->head_dim)) ||
         (rc = add_norm(w, b, p, N("attn_k_norm.weight"), row ? g->kv_dim : g->head_dim))))
        return rc;
    if ((f & GEN_POST) && (rc = add_norm(w, b, p, N("post_attention_norm.weight"), p->dim)))
        return rc;
    if (g->experts) {
        const int ne = g->experts;
        /* gpt-oss's experts are MXFP4 in its files; float models keep
         * theirs in their own type (the exactness tests, and the F32 file
         * that `model gen --type` quantizes) */
        const bool is_float = p->type == KN_TYPE_F32 || p->type == KN_TYPE_F16 || p->type == KN_TYPE_BF16;
        const uint32_t xt = (f & GEN_OAI) && !is_float ? KN_TYPE_MXFP4 : p->type;
        /* the router in the weights' type: llama.cpp's quantize leaves it
         * F32, but then a last-bit difference between the fast and the
         * scalar F32 dot can flip a later Q8_0 rounding of the activations,
         * and the tests compare the two paths exactly */
        if ((rc = add_matrix(w, b, p, N("ffn_gate_inp.weight"), p->type, p->dim, ne, 1)) ||
            (rc = add_experts(w, b, p, N("ffn_gate_exps.weight"), xt, p->dim, p->ffn, ne, 1)) ||
            (rc = add_experts(w, b, p, N("ffn_up_exps.weight"), xt, p->dim, p->ffn, ne, 1)) ||
            (rc = add_experts(w, b, p, N("ffn_down_exps.weight"), xt, p->ffn, p->dim, ne, res)))
            return rc;
        if ((f & GEN_OAI) && ((rc = add_small(w, b, p, N("ffn_gate_inp.bias"), ne, 1, 0, 0.1f)) ||
                              (rc = add_small(w, b, p, N("ffn_gate_exps.bias"), p->ffn, ne, 0, 0.1f)) ||
                              (rc = add_small(w, b, p, N("ffn_up_exps.bias"), p->ffn, ne, 0, 0.1f)) ||
                              (rc = add_small(w, b, p, N("ffn_down_exps.bias"), p->dim, ne, 0, 0.05f))))
            return rc;
    } else if (f & GEN_FUSED) {
        if ((rc = add_matrix(w, b, p, N("ffn_up.weight"), p->type, p->dim, 2 * p->ffn, 1)) ||
            (rc = add_matrix(w, b, p, N("ffn_down.weight"), p->type, p->ffn, p->dim, res)))
            return rc;
    } else if ((rc = add_matrix(w, b, p, N("ffn_gate.weight"), p->type, p->dim, p->ffn, 1)) ||
               (rc = add_matrix(w, b, p, N("ffn_up.weight"), p->type, p->dim, p->ffn, 1)) ||
               (rc = add_matrix(w, b, p, N("ffn_down.weight"), p->type, p->ffn, p->dim, res))) {
        return rc;
    }
    if (!(f & GEN_NO_PRE) &&
        (rc = add_norm(w, b, p, (f & GEN_OAI) ? N("post_attention_norm.weight") : N("ffn_norm.weight"), p->dim)))
        return rc;
    if ((f & GEN_POST) && (rc = add_norm(w, b, p, N("post_ffw_norm.weight"), p->dim)))
        return rc;
#undef N
    return 0;
}

int rt_model_gen(const rt_gen_params *p, const char *path, char *err, size_t err_len)
{
    int rc = check_params(p, err, err_len);
    if (rc)
        return rc;
    const gen_arch *a = gen_arch_find(p->arch);
    if (!a) {
        snprintf(err, err_len, "unknown --arch %s (%s)", p->arch, rt_gen_arch_names());
        return -EINVAL;
    }
    gen_ctx g = {.p = p, .a = a, .experts = a->experts, .used = a->used};
    if (p->experts > 0) {
        g.experts = p->experts;
        g.used = p->experts_used > 0 ? p->experts_used : (a->used ? a->used : 2);
    } else if (p->experts_used > 0 && g.experts) {
        g.used = p->experts_used;
    }
    if (g.experts && (g.used < 1 || g.used > g.experts)) {
        snprintf(err, err_len, "experts-used %d must be between 1 and experts %d", g.used, g.experts);
        return -EINVAL;
    }
    g.head_dim = p->dim / p->heads;
    g.q_dim = p->dim;
    g.kv_dim = g.head_dim * p->kv_heads;
    if (!(g.w = rt_gguf_writer_new()))
        return -ENOMEM;
    const bool tied = p->tied || (a->f & GEN_TIED);
    /* Embeddings of unit scale; projections of variance 1/n_in so that
     * activations keep their size through the layers. */
    if ((rc = write_keys(&g)) ||
        (rc = add_matrix(g.w, &g.bufs, p, "token_embd.weight", p->type, p->dim, p->vocab, sqrtf((float)p->dim))))
        goto out;
    for (int l = 0; l < p->layers; l++)
        if ((rc = add_layer(&g, l)))
            goto out;
    if ((rc = add_norm(g.w, &g.bufs, p, "output_norm.weight", p->dim)))
        goto out;
    /* Logits of a few units spread, so greedy choices are clear. */
    if (!tied && (rc = add_matrix(g.w, &g.bufs, p, "output.weight", p->type, p->dim, p->vocab, 4.0f)))
        goto out;
    rc = rt_gguf_writer_write(g.w, path, err, err_len);
    goto done;
out:
    if (rc == -ENOMEM)
        snprintf(err, err_len, "out of memory while generating the model");
done:
    rt_gguf_writer_free(g.w);
    for (int i = 0; i < g.bufs.n; i++)
        free(g.bufs.p[i]);
    free(g.bufs.p);
    return rc;
}
