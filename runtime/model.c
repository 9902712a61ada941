/* Llama-family model: hyper-parameters and weights from GGUF, handed to the
 * device that runs the batched forward pass (see model.h, device.h). */
#include "runtime/model.h"
#include "runtime/arch.h"
#include "runtime/device.h"
#include "runtime/model_internal.h"

#include "kernels/kn.h"
#include "runtime/gguf.h"
#include "runtime/tokenizer.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ERR(...) (snprintf(err, err_len, __VA_ARGS__), -EINVAL)

/* ---- hyper-parameters ---- */

static int get_arch_u32(const rt_gguf *g, const char *arch, const char *suffix, bool required, uint32_t *out,
                        char *err, size_t err_len)
{
    char key[96];
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    int rc = rt_gguf_get_u32(g, key, out);
    if (rc == -ENOENT && !required)
        return 1;
    if (rc == -ENOENT)
        return ERR("missing required key %s", key);
    if (rc < 0)
        return ERR("key %s has a type that is not an unsigned 32-bit integer", key);
    return 0;
}

static int get_arch_f32(const rt_gguf *g, const char *arch, const char *suffix, float *out, char *err,
                        size_t err_len)
{
    char key[96];
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    int rc = rt_gguf_get_f32(g, key, out);
    if (rc == -ENOENT)
        return 1;
    if (rc < 0)
        return ERR("key %s is not a number", key);
    return 0;
}

/* An optional unsigned key: *out keeps its default when the key is absent
 * or 0 (llama.cpp reads a family's 0 as unset). */
static int opt_u32(const rt_gguf *g, const char *arch, const char *suffix, int *out, char *err, size_t err_len)
{
    uint32_t v;
    int rc = get_arch_u32(g, arch, suffix, false, &v, err, err_len);
    if (rc < 0)
        return rc;
    if (rc == 0 && v != 0) {
        if (v > (1u << 30))
            return ERR("key %s.%s has an unusable value %u", arch, suffix, v);
        *out = (int)v;
    }
    return 0;
}

/* An optional float key, kept at its default when absent or 0; it must be
 * finite and, when `positive`, above 0. */
static int opt_f32(const rt_gguf *g, const char *arch, const char *suffix, bool positive, float *out, char *err,
                   size_t err_len)
{
    float v;
    int rc = get_arch_f32(g, arch, suffix, &v, err, err_len);
    if (rc < 0)
        return rc;
    if (rc == 0 && v != 0.0f) {
        if (!isfinite(v) || (positive && v < 0.0f))
            return ERR("%s.%s = %g is not a usable number", arch, suffix, v);
        *out = v;
    }
    return 0;
}

/* RoPE scaling as llama.cpp reads it: the type none, linear, yarn or
 * longrope, or no type (then a factor, if given, is linear); the factor
 * from rope.scaling.factor, else the older rope.scale_linear; 0 means none.
 * The other types would give wrong logits without a word: refused. */
static int read_rope_scaling(const rt_gguf *g, const rt_arch *ar, rt_hparams *hp, char *err, size_t err_len)
{
    const char *a = hp->arch;
    int rc;
    hp->rope_scale = 1.0f;
    char key[96];
    snprintf(key, sizeof(key), "%s.rope.scaling.type", a);
    rt_gguf_str st;
    rc = rt_gguf_get_str(g, key, &st);
    if (rc < 0 && rc != -ENOENT)
        return ERR("key %s is not a string", key);
    static const char *const names[] = {"none", "linear", "yarn", "longrope"};
    bool typed = rc == 0;
    hp->rope_scaling = RT_ROPE_SCALING_LINEAR;
    if (typed) {
        int t = -1;
        for (int i = 0; i < 4; i++)
            if (rt_gguf_str_eq(st, names[i]))
                t = i;
        if (t < 0) {
            char shown[40];
            return ERR("%s = \"%s\": this RoPE scaling is not supported (none, linear, yarn and longrope are)", key,
                       rt_gguf_printable(shown, sizeof(shown), st));
        }
        hp->rope_scaling = (rt_rope_scaling)t;
    }
    if (hp->rope_scaling != RT_ROPE_SCALING_NONE) {
        const char *fk = "rope.scaling.factor";
        if ((rc = get_arch_f32(g, a, fk, &hp->rope_scale, err, err_len)) == 1)
            rc = get_arch_f32(g, a, fk = "rope.scale_linear", &hp->rope_scale, err, err_len);
        if (rc < 0)
            return rc;
        bool needs = hp->rope_scaling == RT_ROPE_SCALING_LINEAR || hp->rope_scaling == RT_ROPE_SCALING_YARN;
        if (rc == 1 && typed && needs)
            return ERR("missing required key %s.rope.scaling.factor (%s is %s)", a, key, names[hp->rope_scaling]);
        if (hp->rope_scale == 0.0f)
            hp->rope_scale = 1.0f;
        if (!(hp->rope_scale > 0.0f) || !isfinite(hp->rope_scale))
            return ERR("%s.%s must be a positive number", a, fk);
    }
    if (hp->rope_scaling == RT_ROPE_SCALING_NONE)
        hp->rope_scale = 1.0f;
    hp->n_ctx_orig = hp->n_ctx_train;
    hp->rope_attn_factor = 1.0f;
    hp->yarn_beta_fast = 32.0f;
    hp->yarn_beta_slow = 1.0f;
    if ((rc = opt_u32(g, a, "rope.scaling.original_context_length", &hp->n_ctx_orig, err, err_len)) ||
        (rc = opt_f32(g, a, "rope.scaling.attn_factor", true, &hp->rope_attn_factor, err, err_len)) ||
        (rc = opt_f32(g, a, "rope.scaling.yarn_beta_fast", true, &hp->yarn_beta_fast, err, err_len)) ||
        (rc = opt_f32(g, a, "rope.scaling.yarn_beta_slow", true, &hp->yarn_beta_slow, err, err_len)) ||
        (rc = opt_f32(g, a, "rope.scaling.yarn_log_multiplier", false, &hp->yarn_log_mul, err, err_len)))
        return rc;
    hp->rope_freq_base_swa = ar->swa_rope_base > 0.0f ? ar->swa_rope_base : 0.0f;
    return opt_f32(g, a, "rope.freq_base_swa", true, &hp->rope_freq_base_swa, err, err_len);
}

/* Experts, sliding windows, soft-caps and multipliers: the keys of the
 * newer families, each unset (0) where a file leaves it out. */
static int read_family_keys(const rt_gguf *g, const rt_arch *ar, rt_hparams *hp, char *err, size_t err_len)
{
    const char *a = hp->arch;
    int rc;
    if ((rc = opt_u32(g, a, "expert_count", &hp->n_expert, err, err_len)) ||
        (rc = opt_u32(g, a, "expert_used_count", &hp->n_expert_used, err, err_len)))
        return rc;
    if ((ar->flags & RT_ARCH_MOE_ONLY) && hp->n_expert == 0)
        return ERR("missing required key %s.expert_count (%s is a mixture of experts)", a, a);
    if (hp->n_expert > 0 && (hp->n_expert_used <= 0 || hp->n_expert_used > hp->n_expert || hp->n_expert > 4096))
        return ERR("%s.expert_used_count = %d must be between 1 and expert_count = %d", a, hp->n_expert_used,
                   hp->n_expert);
    hp->n_ff_exp = hp->n_ff;
    if ((rc = opt_u32(g, a, "expert_feed_forward_length", &hp->n_ff_exp, err, err_len)) ||
        (rc = opt_u32(g, a, "expert_shared_feed_forward_length", &hp->n_ff_shexp, err, err_len)))
        return rc;
    if (hp->n_expert > 0 && hp->n_ff_exp <= 0)
        return ERR("missing required key %s.expert_feed_forward_length", a);

    hp->n_swa = ar->swa_pattern ? ar->swa_default : 0;
    if (ar->swa_pattern && (rc = opt_u32(g, a, "attention.sliding_window", &hp->n_swa, err, err_len)))
        return rc;
    if (ar->flags & RT_ARCH_SOFTCAP) {
        hp->attn_softcap = ar->attn_softcap;
        hp->final_softcap = ar->final_softcap;
        if ((rc = opt_f32(g, a, "attn_logit_softcapping", true, &hp->attn_softcap, err, err_len)) ||
            (rc = opt_f32(g, a, "final_logit_softcapping", true, &hp->final_softcap, err, err_len)))
            return rc;
    }
    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    /* ggml's gemma_pytorch rule: the 27B shapes (46 and 62 layers) scale by
     * n_embd / n_head, the others by the head size */
    if ((ar->flags & RT_ARCH_GEMMA_QSCALE) && (hp->n_layer == 46 || hp->n_layer == 62))
        hp->attn_scale = 1.0f / sqrtf((float)(hp->n_embd / hp->n_head));
    hp->embd_scale = (ar->flags & RT_ARCH_EMBD_SQRT) ? sqrtf((float)hp->n_embd) : 1.0f;
    hp->residual_scale = 1.0f;
    hp->logit_scale = 1.0f;
    if (ar->flags & RT_ARCH_GRANITE) {
        if ((rc = opt_f32(g, a, "attention.scale", true, &hp->attn_scale, err, err_len)) ||
            (rc = opt_f32(g, a, "embedding_scale", true, &hp->embd_scale, err, err_len)) ||
            (rc = opt_f32(g, a, "residual_scale", true, &hp->residual_scale, err, err_len)) ||
            (rc = opt_f32(g, a, "logit_scale", true, &hp->logit_scale, err, err_len)))
            return rc;
    }
    return 0;
}

int rt_hparams_from_gguf(const rt_gguf *g, rt_hparams *hp, char *err, size_t err_len)
{
    memset(hp, 0, sizeof(*hp));
    rt_gguf_str arch;
    int rc = rt_gguf_get_str(g, "general.architecture", &arch);
    if (rc == -ENOENT)
        return ERR("missing required key general.architecture");
    if (rc < 0)
        return ERR("key general.architecture is not a string");
    if (arch.n >= sizeof(hp->arch)) {
        char shown[40];
        return ERR("general.architecture \"%s\" is not supported", rt_gguf_printable(shown, sizeof(shown), arch));
    }
    memcpy(hp->arch, arch.p, arch.n);
    hp->arch[arch.n] = '\0';
    const rt_arch *ar = strlen(hp->arch) == arch.n ? rt_arch_find(hp->arch) : NULL;
    if (!ar) {
        const char *why = rt_arch_refusal(hp->arch);
        char names[256], shown[40];
        rt_arch_names(names, sizeof(names));
        if (why)
            return ERR("general.architecture \"%s\": %s", hp->arch, why);
        return ERR("general.architecture \"%s\" is not supported (%s)", rt_gguf_printable(shown, sizeof(shown), arch),
                   names);
    }
    hp->rope_neox = (ar->flags & RT_ARCH_ROPE_NEOX) != 0;

    uint32_t v;
    const char *a = hp->arch;
#define REQ(suffix, field)                                                                                   \
    do {                                                                                                     \
        if ((rc = get_arch_u32(g, a, suffix, true, &v, err, err_len)) < 0)                                   \
            return rc;                                                                                       \
        if (v == 0 || v > (1u << 30))                                                                        \
            return ERR("key %s.%s has an unusable value %u", a, suffix, v);                                  \
        hp->field = (int)v;                                                                                  \
    } while (0)
    REQ("context_length", n_ctx_train);
    REQ("embedding_length", n_embd);
    REQ("block_count", n_layer);
    REQ("attention.head_count", n_head);
#undef REQ
    /* an FFN length of 0 is unset: a mixture of experts has its own */
    if ((rc = get_arch_u32(g, a, "feed_forward_length", !(ar->flags & RT_ARCH_MOE_ONLY), &v, err, err_len)) < 0)
        return rc;
    if (rc == 0 && v > (1u << 30))
        return ERR("key %s.feed_forward_length has an unusable value %u", a, v);
    hp->n_ff = rc == 0 ? (int)v : 0;
    hp->n_head_kv = hp->n_head;
    if ((rc = opt_u32(g, a, "attention.head_count_kv", &hp->n_head_kv, err, err_len)) < 0)
        return rc;
    if (hp->n_head_kv <= 0 || hp->n_head % hp->n_head_kv != 0)
        return ERR("%s.attention.head_count_kv = %d does not divide head_count %d", a, hp->n_head_kv,
                   hp->n_head);
    hp->head_dim = hp->n_embd / hp->n_head;
    if ((rc = opt_u32(g, a, "attention.key_length", &hp->head_dim, err, err_len)) < 0)
        return rc;
    if (hp->head_dim <= 0 || hp->head_dim % 2 != 0 || hp->head_dim > 1024)
        return ERR("head dimension %d (embedding_length / head_count) is unusable", hp->head_dim);
    int v_len = hp->head_dim;
    if ((rc = opt_u32(g, a, "attention.value_length", &v_len, err, err_len)) < 0)
        return rc;
    if (v_len != hp->head_dim)
        return ERR("%s.attention.value_length = %d differs from the key length %d: not supported", a, v_len,
                   hp->head_dim);
    hp->n_rot = hp->head_dim;
    if ((rc = opt_u32(g, a, "rope.dimension_count", &hp->n_rot, err, err_len)) < 0)
        return rc;
    if (hp->n_rot <= 0 || hp->n_rot > hp->head_dim || hp->n_rot % 2 != 0)
        return ERR("%s.rope.dimension_count = %d must be even and at most the head dimension %d", a,
                   hp->n_rot, hp->head_dim);
    hp->rope_freq_base = 10000.0f;
    if ((rc = get_arch_f32(g, a, "rope.freq_base", &hp->rope_freq_base, err, err_len)) < 0)
        return rc;
    if (!(hp->rope_freq_base > 0.0f) || !isfinite(hp->rope_freq_base))
        return ERR("%s.rope.freq_base must be a positive number", a);
    if ((rc = read_rope_scaling(g, ar, hp, err, err_len)) < 0)
        return rc;
    hp->norm_eps = 1e-5f;
    if ((rc = get_arch_f32(g, a, "attention.layer_norm_rms_epsilon", &hp->norm_eps, err, err_len)) < 0)
        return rc;
    if (!(hp->norm_eps >= 0.0f) || !isfinite(hp->norm_eps))
        return ERR("%s.attention.layer_norm_rms_epsilon must be a number, not negative", a);
    if ((rc = read_family_keys(g, ar, hp, err, err_len)) < 0)
        return rc;
    if (hp->n_ff <= 0 && hp->n_expert == 0)
        return ERR("key %s.feed_forward_length has an unusable value 0", a);

    const rt_gguf_tensor *emb = rt_gguf_find_tensor(g, "token_embd.weight");
    if (!emb)
        return ERR("missing required tensor token_embd.weight");
    if (emb->n_dims != 2 || emb->ne[0] != hp->n_embd || emb->ne[1] <= 0 || emb->ne[1] > INT32_MAX)
        return ERR("tensor token_embd.weight at data offset %llu has shape [%lld, %lld], expected [%d, n_vocab]",
                   (unsigned long long)emb->offset, (long long)emb->ne[0], (long long)emb->ne[1], hp->n_embd);
    hp->n_vocab = (int)emb->ne[1];
    hp->tied_output = rt_gguf_find_tensor(g, "output.weight") == NULL;
    return 0;
}

/* ---- weights ---- */

static int bind_weight(const rt_gguf *g, const char *name, int64_t n_in, int64_t n_out, rt_weight *w, char *err,
                       size_t err_len)
{
    const rt_gguf_tensor *t = rt_gguf_find_tensor(g, name);
    if (!t)
        return ERR("missing required tensor %s", name);
    if (t->n_dims != 2 || t->ne[0] != n_in || t->ne[1] != n_out)
        return ERR("tensor %s at data offset %llu has shape [%lld, %lld], expected [%lld, %lld]", name,
                   (unsigned long long)t->offset, (long long)t->ne[0], (long long)t->ne[1], (long long)n_in,
                   (long long)n_out);
    w->data = t->data;
    w->type = (kn_type)t->type;
    w->n_in = (int)n_in;
    w->n_out = (int)n_out;
    w->nbytes = t->nbytes;
    return 0;
}

/* Norm gains and biases are small: keep them as owned F32 whatever the file
 * stores, so the kernels see one type. */
static int load_vector(const rt_gguf *g, const char *name, int64_t n, bool required, float **out, char *err,
                       size_t err_len)
{
    *out = NULL;
    const rt_gguf_tensor *t = rt_gguf_find_tensor(g, name);
    if (!t)
        return required ? ERR("missing required tensor %s", name) : 0;
    if (t->ne[0] != n || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1)
        return ERR("tensor %s at data offset %llu has %lld elements in %u dims, expected a vector of %lld", name,
                   (unsigned long long)t->offset, (long long)t->ne[0], t->n_dims, (long long)n);
    float *v = malloc((size_t)n * sizeof(float));
    if (!v)
        return -ENOMEM;
    kn_dequantize_row((kn_type)t->type, t->data, v, n);
    *out = v;
    return 0;
}

/* ---- binding a file's tensors, each marked as used ---- */

typedef struct loader {
    rt_model *m;
    const rt_gguf *g;
    uint8_t *used; /* per tensor of the file: bound to the model */
    char *err;
    size_t err_len;
} loader;

static const rt_gguf_tensor *ld_find(loader *ld, const char *name)
{
    return rt_gguf_find_tensor(ld->g, name);
}

static void ld_mark(loader *ld, const char *name)
{
    const rt_gguf_tensor *t = ld_find(ld, name);
    if (t)
        ld->used[t - rt_gguf_tensor_at(ld->g, 0)] = 1;
}

static int ld_weight(loader *ld, const char *name, int64_t n_in, int64_t n_out, rt_weight *w)
{
    int rc = bind_weight(ld->g, name, n_in, n_out, w, ld->err, ld->err_len);
    if (!rc)
        ld_mark(ld, name);
    return rc;
}

static int ld_vector(loader *ld, const char *name, int64_t n, bool required, float **out)
{
    int rc = load_vector(ld->g, name, n, required, out, ld->err, ld->err_len);
    if (!rc)
        ld_mark(ld, name);
    return rc;
}

/* A small matrix of `rows` rows of n, kept as owned F32 (the experts'
 * biases). */
static int ld_rows(loader *ld, const char *name, int64_t n, int64_t rows, float **out)
{
    char *err = ld->err;
    size_t err_len = ld->err_len;
    *out = NULL;
    const rt_gguf_tensor *t = ld_find(ld, name);
    if (!t)
        return 0;
    if (t->ne[0] != n || t->ne[1] != rows || t->ne[2] != 1 || t->ne[3] != 1)
        return ERR("tensor %s at data offset %llu has shape [%lld, %lld], expected [%lld, %lld]", name,
                   (unsigned long long)t->offset, (long long)t->ne[0], (long long)t->ne[1], (long long)n,
                   (long long)rows);
    float *v = malloc((size_t)(n * rows) * sizeof(float));
    if (!v)
        return -ENOMEM;
    kn_dequantize_row((kn_type)t->type, t->data, v, n * rows);
    *out = v;
    ld_mark(ld, name);
    return 0;
}

/* Rows [row0, row0 + n) of w as a matrix of its own (fused tensors). */
static rt_weight row_view(const rt_weight *w, int row0, int n)
{
    size_t rb = kn_row_bytes(w->type, w->n_in);
    return (rt_weight){(const char *)w->data + (size_t)row0 * rb, w->type, w->n_in, n, (uint64_t)n * rb};
}

/* A 3D tensor of n_exp matrices [n_in, n_out] as n_exp views. */
static int ld_experts(loader *ld, const char *name, int64_t n_in, int64_t n_out, int n_exp, rt_weight **out)
{
    char *err = ld->err;
    size_t err_len = ld->err_len;
    const rt_gguf_tensor *t = ld_find(ld, name);
    if (!t)
        return ERR("missing required tensor %s", name);
    if (t->n_dims != 3 || t->ne[0] != n_in || t->ne[1] != n_out || t->ne[2] != n_exp)
        return ERR("tensor %s at data offset %llu has shape [%lld, %lld, %lld], expected [%lld, %lld, %d]", name,
                   (unsigned long long)t->offset, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                   (long long)n_in, (long long)n_out, n_exp);
    if (!(*out = calloc((size_t)n_exp, sizeof(rt_weight))))
        return -ENOMEM;
    rt_weight all = {t->data, (kn_type)t->type, (int)n_in, (int)(n_out * n_exp), t->nbytes};
    for (int e = 0; e < n_exp; e++)
        (*out)[e] = row_view(&all, (int)(e * n_out), (int)n_out);
    ld_mark(ld, name);
    return 0;
}

static int bind_moe(loader *ld, int l, rt_layer *L)
{
    const rt_hparams *hp = &ld->m->hp;
    const int d = hp->n_embd, f = hp->n_ff_exp, ne = hp->n_expert;
    char name[96];
    int rc;
    rt_experts *x = L->moe = calloc(1, sizeof(*x));
    if (!x)
        return -ENOMEM;
#define N(suffix) (snprintf(name, sizeof(name), "blk.%d.%s", l, suffix), name)
    if ((rc = ld_weight(ld, N("ffn_gate_inp.weight"), d, ne, &x->router)) ||
        (rc = ld_vector(ld, N("ffn_gate_inp.bias"), ne, false, &x->b_router)) ||
        (rc = ld_experts(ld, N("ffn_gate_exps.weight"), d, f, ne, &x->gate)) ||
        (rc = ld_experts(ld, N("ffn_up_exps.weight"), d, f, ne, &x->up)) ||
        (rc = ld_experts(ld, N("ffn_down_exps.weight"), f, d, ne, &x->down)) ||
        (rc = ld_rows(ld, N("ffn_gate_exps.bias"), f, ne, &x->b_gate)) ||
        (rc = ld_rows(ld, N("ffn_up_exps.bias"), f, ne, &x->b_up)) ||
        (rc = ld_rows(ld, N("ffn_down_exps.bias"), d, ne, &x->b_down)))
        return rc;
    if (ld_find(ld, N("ffn_up_shexp.weight"))) {
        const int fs = hp->n_ff_shexp > 0 ? hp->n_ff_shexp : f;
        if ((rc = ld_weight(ld, N("ffn_gate_shexp.weight"), d, fs, &x->sh_gate)) ||
            (rc = ld_weight(ld, N("ffn_up_shexp.weight"), d, fs, &x->sh_up)) ||
            (rc = ld_weight(ld, N("ffn_down_shexp.weight"), fs, d, &x->sh_down)))
            return rc;
    }
#undef N
    return 0;
}

/* The attention's tensors: Q, K and V apart or fused (attn_qkv), the
 * biases and norms the file has. */
static int bind_attention(loader *ld, int l, rt_layer *L)
{
    const rt_hparams *hp = &ld->m->hp;
    const rt_arch *ar = ld->m->arch;
    const int d = hp->n_embd, q_dim = hp->n_head * hp->head_dim, kv_dim = hp->n_head_kv * hp->head_dim;
    char name[96];
    int rc;
#define N(suffix) (snprintf(name, sizeof(name), "blk.%d.%s", l, suffix), name)
    if (ld_find(ld, N("attn_qkv.weight"))) {
        rt_weight qkv;
        if ((rc = ld_weight(ld, name, d, q_dim + 2 * kv_dim, &qkv)))
            return rc;
        L->wq = row_view(&qkv, 0, q_dim);
        L->wk = row_view(&qkv, q_dim, kv_dim);
        L->wv = row_view(&qkv, q_dim + kv_dim, kv_dim);
    } else if ((rc = ld_weight(ld, N("attn_q.weight"), d, q_dim, &L->wq)) ||
               (rc = ld_weight(ld, N("attn_k.weight"), d, kv_dim, &L->wk)) ||
               (rc = ld_weight(ld, N("attn_v.weight"), d, kv_dim, &L->wv))) {
        return rc;
    }
    const bool row_norm = ar->qk_norm == RT_QK_NORM_ROW;
    if ((rc = ld_weight(ld, N("attn_output.weight"), q_dim, d, &L->wo)) ||
        (rc = ld_vector(ld, N("attn_norm.weight"), d, !(ar->flags & RT_ARCH_NO_PRE_NORM), &L->attn_norm)) ||
        (rc = ld_vector(ld, N("attn_q.bias"), q_dim, false, &L->bq)) ||
        (rc = ld_vector(ld, N("attn_k.bias"), kv_dim, false, &L->bk)) ||
        (rc = ld_vector(ld, N("attn_v.bias"), kv_dim, false, &L->bv)) ||
        (rc = ld_vector(ld, N("attn_output.bias"), d, false, &L->bo)))
        return rc;
    if (ar->qk_norm != RT_QK_NORM_NONE &&
        ((rc = ld_vector(ld, N("attn_q_norm.weight"), row_norm ? q_dim : hp->head_dim, true, &L->q_norm)) ||
         (rc = ld_vector(ld, N("attn_k_norm.weight"), row_norm ? kv_dim : hp->head_dim, true, &L->k_norm))))
        return rc;
    if ((ar->flags & RT_ARCH_SINKS) && (rc = ld_vector(ld, N("attn_sinks.weight"), hp->n_head, true, &L->sinks)))
        return rc;
    if ((ar->flags & RT_ARCH_POST_NORMS) &&
        (rc = ld_vector(ld, N("post_attention_norm.weight"), d, true, &L->attn_post_norm)))
        return rc;
#undef N
    return 0;
}

static int bind_ffn(loader *ld, int l, rt_layer *L)
{
    const rt_hparams *hp = &ld->m->hp;
    const rt_arch *ar = ld->m->arch;
    const int d = hp->n_embd, f = hp->n_ff;
    char name[96];
    int rc;
#define N(suffix) (snprintf(name, sizeof(name), "blk.%d.%s", l, suffix), name)
    snprintf(name, sizeof(name), "blk.%d.%s.weight", l, ar->ffn_norm ? ar->ffn_norm : "ffn_norm");
    if ((rc = ld_vector(ld, name, d, !(ar->flags & RT_ARCH_NO_PRE_NORM), &L->ffn_norm)))
        return rc;
    if ((ar->flags & RT_ARCH_POST_NORMS) && (rc = ld_vector(ld, N("post_ffw_norm.weight"), d, true, &L->ffn_post_norm)))
        return rc;
    if (hp->n_expert > 0 && ((ar->flags & RT_ARCH_MOE_ONLY) || ld_find(ld, N("ffn_gate_inp.weight"))))
        return bind_moe(ld, l, L);
    if (ar->flags & RT_ARCH_FUSED_UP) {
        rt_weight up;
        if ((rc = ld_weight(ld, N("ffn_up.weight"), d, 2 * (int64_t)f, &up)))
            return rc;
        L->w_gate = row_view(&up, 0, f);
        L->w_up = row_view(&up, f, f);
    } else if ((rc = ld_weight(ld, N("ffn_gate.weight"), d, f, &L->w_gate)) ||
               (rc = ld_weight(ld, N("ffn_up.weight"), d, f, &L->w_up))) {
        return rc;
    }
    if ((rc = ld_weight(ld, N("ffn_down.weight"), f, d, &L->w_down)) ||
        (rc = ld_vector(ld, N("ffn_gate.bias"), f, false, &L->b_gate)) ||
        (rc = ld_vector(ld, N("ffn_up.bias"), f, false, &L->b_up)) ||
        (rc = ld_vector(ld, N("ffn_down.bias"), d, false, &L->b_down)))
        return rc;
#undef N
    return 0;
}

/* Whether layer l attends through a sliding window (llama.cpp's
 * set_swa_pattern, pattern 1 meaning every layer). */
static bool layer_slides(const rt_arch *ar, const rt_hparams *hp, int l)
{
    const int n = ar->swa_pattern;
    return hp->n_swa > 0 && n > 0 && (n == 1 || l % n < n - 1);
}

static int bind_layers(loader *ld)
{
    rt_model *m = ld->m;
    const rt_hparams *hp = &m->hp;
    char *err = ld->err;
    size_t err_len = ld->err_len;
    char name[96];
    int rc;
    /* the last layer's output projection, before a block_count from the
     * file sizes an allocation (2^30 layers asked for 283 GB) */
    snprintf(name, sizeof(name), "blk.%d.attn_output.weight", hp->n_layer - 1);
    if (!rt_gguf_find_tensor(ld->g, name))
        return ERR("missing required tensor %s (block_count is %d)", name, hp->n_layer);
    m->layers = calloc((size_t)hp->n_layer, sizeof(*m->layers));
    if (!m->layers)
        return -ENOMEM;
    bool rope_on = true;
    if ((m->arch->flags & RT_ARCH_ROPE_SWITCH)) {
        char key[96];
        snprintf(key, sizeof(key), "%s.rope.scaling.finetuned", hp->arch);
        if (rt_gguf_get_bool(ld->g, key, &rope_on) == -EINVAL)
            return ERR("key %s is not a boolean", key);
    }
    for (int l = 0; l < hp->n_layer; l++) {
        rt_layer *L = &m->layers[l];
        if ((rc = bind_attention(ld, l, L)) || (rc = bind_ffn(ld, l, L)))
            return rc;
        L->local = layer_slides(m->arch, hp, l);
        L->rope = RT_ROPE_MAIN;
        if (L->local && m->rope[RT_ROPE_LOCAL].inv_freq)
            L->rope = RT_ROPE_LOCAL;
        if (!rope_on || (m->arch->no_rope_every > 0 && (l + 1) % m->arch->no_rope_every == 0))
            L->rope = RT_ROPE_OFF;
    }
    return 0;
}

/* A factor vector of n_rot / 2 positive numbers, or NULL when absent. */
static int rope_factors(loader *ld, const char *name, float **out)
{
    char *err = ld->err;
    size_t err_len = ld->err_len;
    int rc = ld_vector(ld, name, ld->m->hp.n_rot / 2, false, out);
    for (int i = 0; !rc && *out && i < ld->m->hp.n_rot / 2; i++)
        if (!((*out)[i] > 0.0f) || !isfinite((*out)[i]))
            rc = ERR("tensor %s: element %d is %g, not a positive number", name, i, (*out)[i]);
    return rc;
}

/* The RoPEs the layers turn by: the model's (scaled as its keys say, with
 * rope_freqs.weight's factors, Llama 3.1 and later), the sliding layers'
 * own base where the family has one (unscaled), and LongRoPE's long
 * factors (rope_factors_long / _short.weight, Phi-3) for sequences past the
 * original context. */
static int rope_frequencies(loader *ld)
{
    rt_model *m = ld->m;
    rt_hparams *hp = &m->hp;
    float *factors = NULL, *lng = NULL, *shrt = NULL;
    int rc;
    if ((rc = rope_factors(ld, "rope_freqs.weight", &factors)) ||
        (rc = rope_factors(ld, "rope_factors_long.weight", &lng)) ||
        (rc = rope_factors(ld, "rope_factors_short.weight", &shrt)))
        goto out;
    if (lng || shrt)
        hp->rope_scaling = RT_ROPE_SCALING_LONGROPE;
    const bool no_mscale = (m->arch->flags & RT_ARCH_YARN_NO_MSCALE) != 0;
    if ((rc = rt_rope_build(&m->rope[RT_ROPE_MAIN], hp, hp->rope_freq_base, hp->rope_scaling, hp->rope_scale,
                            shrt ? shrt : factors, no_mscale)))
        goto out;
    if (lng && (rc = rt_rope_build(&m->rope[RT_ROPE_LONG], hp, hp->rope_freq_base, RT_ROPE_SCALING_LONGROPE, 1.0f,
                                   lng, no_mscale)))
        goto out;
    if (hp->rope_freq_base_swa > 0.0f) {
        if ((rc = rt_rope_build(&m->rope[RT_ROPE_LOCAL], hp, hp->rope_freq_base_swa, RT_ROPE_SCALING_NONE, 1.0f,
                                NULL, no_mscale)))
            goto out;
        m->rope[RT_ROPE_LOCAL].mscale = 1.0f;
    }
    m->rope_inv_freq = m->rope[RT_ROPE_MAIN].inv_freq;
out:
    free(factors);
    free(lng);
    free(shrt);
    return rc;
}

/* Every tensor of the file is the model's: one the forward pass does not
 * read would change the answers without a word (an output bias, a .scale
 * tensor, a norm of another family). */
static int check_all_used(loader *ld)
{
    char *err = ld->err;
    size_t err_len = ld->err_len;
    for (int64_t i = 0; i < rt_gguf_n_tensors(ld->g); i++) {
        if (ld->used[i])
            continue;
        const rt_gguf_tensor *t = rt_gguf_tensor_at(ld->g, i);
        char shown[80];
        return ERR("tensor %s is not used by the %s forward pass: a file with it is not supported",
                   rt_gguf_printable(shown, sizeof(shown), t->name), ld->m->hp.arch);
    }
    return 0;
}

int rt_model_matrices(rt_model *m, rt_weight ***out)
{
    const rt_hparams *hp = &m->hp;
    size_t cap = 1 + (size_t)hp->n_layer * (10 + 3 * (size_t)hp->n_expert);
    rt_weight **all = malloc(cap * sizeof(*all));
    if (!all)
        return -ENOMEM;
    int n = 0;
    for (int l = 0; l < hp->n_layer; l++) {
        rt_layer *L = &m->layers[l];
        rt_weight *lw[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++)
            if (lw[i]->data)
                all[n++] = lw[i];
        rt_experts *x = L->moe;
        if (!x)
            continue;
        all[n++] = &x->router;
        for (int e = 0; e < hp->n_expert; e++) {
            all[n++] = &x->gate[e];
            all[n++] = &x->up[e];
            all[n++] = &x->down[e];
        }
        if (x->sh_up.data) {
            all[n++] = &x->sh_gate;
            all[n++] = &x->sh_up;
            all[n++] = &x->sh_down;
        }
    }
    if (!hp->tied_output)
        all[n++] = &m->output;
    *out = all;
    return n;
}

static uint64_t weight_bytes(const rt_weight *w)
{
    return w->nbytes;
}

/* Bytes of the weights, and of those one token reads: the chosen experts
 * only (n_expert_used of n_expert) where a layer has experts. */
static void count_bytes(rt_model *m)
{
    const rt_hparams *hp = &m->hp;
    m->bytes_per_token = kn_row_bytes(m->tok_embd.type, hp->n_embd) + m->output.nbytes;
    m->weight_bytes = m->tok_embd.nbytes + (hp->tied_output ? 0 : m->output.nbytes);
    for (int l = 0; l < hp->n_layer; l++) {
        const rt_layer *L = &m->layers[l];
        uint64_t b = weight_bytes(&L->wq) + weight_bytes(&L->wk) + weight_bytes(&L->wv) + weight_bytes(&L->wo) +
                     weight_bytes(&L->w_gate) + weight_bytes(&L->w_up) + weight_bytes(&L->w_down);
        uint64_t active = b;
        if (L->moe) {
            const rt_experts *x = L->moe;
            uint64_t shared = x->router.nbytes + x->sh_gate.nbytes + x->sh_up.nbytes + x->sh_down.nbytes, ex = 0;
            for (int e = 0; e < hp->n_expert; e++)
                ex += x->gate[e].nbytes + x->up[e].nbytes + x->down[e].nbytes;
            b += shared + ex;
            active += shared + ex / (uint64_t)hp->n_expert * (uint64_t)hp->n_expert_used;
        }
        m->bytes_per_token += active;
        m->weight_bytes += b;
    }
}

/* What the CUDA plugin does not run (the CPU runs it all), or NULL; checked
 * before any device is opened, so that the refusal reads the same on a
 * machine without one. The plugin runs every family the CPU does; its
 * limits are its kernels': the attention keeps a head's query and sums in
 * registers as pairs of halves (an even head size up to 256) and has a grid
 * row per head (at most 65535); the expert products decode rows 32
 * elements at a time, in F32. The prefill GEMM dequantizes a matrix to F16,
 * which holds every block type's values but not MXFP4's power-of-two
 * scales (2^-127 .. 2^127: beyond 2^15 they overflow, under 2^-24 they
 * flush to zero), so MXFP4 is taken for experts only, as gpt-oss has it. */
static bool mxfp4_outside_experts(const rt_model *m)
{
    if (m->output.type == KN_TYPE_MXFP4) /* tok_embd alone is a lookup, exact in any type */
        return true;
    for (int l = 0; l < m->hp.n_layer; l++) {
        const rt_layer *L = &m->layers[l];
        const rt_weight *dense[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down,
                                    L->moe ? &L->moe->router : NULL, L->moe ? &L->moe->sh_gate : NULL,
                                    L->moe ? &L->moe->sh_up : NULL, L->moe ? &L->moe->sh_down : NULL};
        for (size_t i = 0; i < sizeof(dense) / sizeof(dense[0]); i++)
            if (dense[i] && dense[i]->data && dense[i]->type == KN_TYPE_MXFP4)
                return true;
    }
    return false;
}

static const char *cuda_gap(const rt_model *m)
{
    const rt_hparams *hp = &m->hp;
    if (hp->head_dim > 256)
        return "attention heads wider than 256 dimensions";
    if (hp->head_dim % 2 != 0) /* rt_hparams_from_gguf refuses it on every device today */
        return "attention heads of an odd size";
    if (hp->n_head > 65535)
        return "more than 65535 attention heads";
    if (hp->n_expert > 0 && (hp->n_embd % 32 != 0 || hp->n_ff_exp % 32 != 0))
        return "experts whose rows are not a multiple of 32 elements";
    if (mxfp4_outside_experts(m))
        return "MXFP4 matrices outside the experts (the prefill GEMM's F16 cannot hold MXFP4's scales)";
    return NULL;
}

static int bind_model(rt_model *m, char *err, size_t err_len)
{
    const rt_hparams *hp = &m->hp;
    loader ld = {m, m->gguf, calloc((size_t)rt_gguf_n_tensors(m->gguf) + 1, 1), err, err_len};
    int rc = -ENOMEM;
    if (!ld.used)
        return rc;
    if ((rc = ld_weight(&ld, "token_embd.weight", hp->n_embd, hp->n_vocab, &m->tok_embd)) < 0)
        goto out;
    if (hp->tied_output)
        m->output = m->tok_embd;
    else if ((rc = ld_weight(&ld, "output.weight", hp->n_embd, hp->n_vocab, &m->output)) < 0)
        goto out;
    if ((rc = ld_vector(&ld, "output_norm.weight", hp->n_embd, true, &m->output_norm)) < 0 ||
        (rc = ld_vector(&ld, "output.bias", hp->n_vocab, false, &m->output_bias)) < 0 ||
        (rc = rope_frequencies(&ld)) < 0 || (rc = bind_layers(&ld)) < 0 ||
        (rc = check_all_used(&ld)) < 0)
        goto out;
out:
    free(ld.used);
    return rc;
}

/* Takes the leading "path: " off a message of rt_gguf_open. */
static void drop_path(char *err, const char *path)
{
    size_t n = strlen(path);
    if (strncmp(err, path, n) == 0 && err[n] == ':' && err[n + 1] == ' ')
        memmove(err, err + n + 2, strlen(err + n + 2) + 1);
}

int rt_model_load(const char *path, const rt_model_opts *opts, rt_model **out, char *err, size_t err_len)
{
    *out = NULL;
    if (err_len)
        err[0] = '\0';
    rt_model *m = calloc(1, sizeof(*m));
    int rc = -ENOMEM;
    if (!m)
        goto fail;
    rc = rt_gguf_open(path, &m->gguf, err, err_len);
    if (rc < 0) {
        drop_path(err, path); /* the caller names the file, once */
        goto fail;
    }
    if ((rc = rt_hparams_from_gguf(m->gguf, &m->hp, err, err_len)) < 0)
        goto fail;
    const rt_hparams *hp = &m->hp;
    m->arch = rt_arch_find(hp->arch);
    if ((rc = bind_model(m, err, err_len)) < 0)
        goto fail;
    if ((rc = rt_tokenizer_load(m->gguf, &m->tok, err, err_len)) < 0)
        goto fail;
    if (rt_tokenizer_n_vocab(m->tok) > hp->n_vocab) {
        rc = ERR("tokenizer has %d tokens but token_embd.weight only %d rows", rt_tokenizer_n_vocab(m->tok),
                 hp->n_vocab);
        goto fail;
    }
    count_bytes(m);

    const char *device = opts && opts->device ? opts->device : "cpu";
    bool cuda = strcmp(device, "cuda") == 0;
    if (!cuda && strcmp(device, "cpu") != 0) {
        rc = ERR("device \"%s\" is neither cpu nor cuda", device);
        goto fail;
    }
    /* What the CUDA plugin's kernels cannot take is refused here, with the
     * reason, rather than by a step that fails after the load. */
    const char *gap = cuda ? cuda_gap(m) : NULL;
    if (gap) {
        rc = ERR("%s: not supported on cuda yet (run this model with device cpu)", gap);
        goto fail;
    }
    /* On a GPU the CPU kernels only serve host-side odds and ends. */
    int n_threads = cuda ? 1 : opts ? opts->n_threads : 0;
    m->kn = kn_ctx_new(n_threads, opts && opts->reference ? KN_BACKEND_REF : KN_BACKEND_AUTO);
    if (!m->kn) {
        rc = -ENOMEM;
        snprintf(err, err_len, "cannot start the kernel context (%d threads)", n_threads);
        goto fail;
    }
    const rt_device_ops *dev;
    if ((rc = rt_device_get(device, &dev, err, err_len)) < 0 || (rc = dev->load(m, err, err_len)) < 0)
        goto fail;
    m->dev = dev;
    *out = m;
    return 0;
fail:
    /* every failure is said: the out-of-memory paths write no message */
    if (err_len && !err[0])
        snprintf(err, err_len, "%s", strerror(-rc));
    rt_model_free(m);
    return rc;
}

static void free_layer(rt_layer *L)
{
    float *owned[] = {L->attn_norm, L->ffn_norm, L->bq,     L->bk,           L->bv,
                      L->bo,        L->b_gate,   L->b_up,   L->b_down,       L->q_norm,
                      L->k_norm,    L->sinks,    L->attn_post_norm, L->ffn_post_norm};
    for (size_t i = 0; i < sizeof(owned) / sizeof(owned[0]); i++)
        free(owned[i]);
    rt_experts *x = L->moe;
    if (x) {
        free(x->b_router);
        free(x->gate);
        free(x->up);
        free(x->down);
        free(x->b_gate);
        free(x->b_up);
        free(x->b_down);
        free(x);
    }
}

void rt_model_free(rt_model *m)
{
    if (!m)
        return;
    if (m->layers) {
        for (int l = 0; l < m->hp.n_layer; l++)
            free_layer(&m->layers[l]);
        free(m->layers);
    }
    free(m->output_norm);
    free(m->output_bias);
    for (int i = 0; i < RT_ROPE_SETS; i++)
        free(m->rope[i].inv_freq);
    if (m->dev)
        m->dev->free(m);
    kn_ctx_free(m->kn);
    rt_tokenizer_free(m->tok);
    rt_gguf_free(m->gguf);
    free(m);
}

const rt_hparams *rt_model_hparams(const rt_model *m)
{
    return &m->hp;
}

const rt_tokenizer *rt_model_tokenizer(const rt_model *m)
{
    return m->tok;
}

const rt_gguf *rt_model_gguf(const rt_model *m)
{
    return m->gguf;
}

uint64_t rt_model_weight_bytes(const rt_model *m)
{
    return m->weight_bytes;
}

uint64_t rt_model_bytes_per_token(const rt_model *m)
{
    return m->bytes_per_token;
}

size_t rt_model_kv_bytes_per_token(const rt_model *m, kn_type kv_type)
{
    /* K and V of every layer */
    return (size_t)2 * m->hp.n_layer * m->hp.n_head_kv * kn_kv_row_units(kv_type, m->hp.head_dim) *
           sizeof(uint16_t);
}

const char *rt_model_backend_name(const rt_model *m)
{
    return m->dev == &rt_device_cpu ? kn_ctx_ops(m->kn)->name : m->dev->name;
}

void rt_model_device_info(const rt_model *m, rt_device_info *out)
{
    m->dev->device_info(m, out);
}

int rt_model_threads(const rt_model *m)
{
    return kn_ctx_threads(m->kn);
}

void rt_model_parallel_for(rt_model *m, int n, void (*fn)(void *arg, int i), void *arg)
{
    kn_parallel_for(m->kn, n, fn, arg);
}
