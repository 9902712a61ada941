/* Llama-family model: hyper-parameters and weights from GGUF, handed to the
 * device that runs the batched forward pass (see model.h, device.h). */
#include "runtime/model.h"
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

int rt_hparams_from_gguf(const rt_gguf *g, rt_hparams *hp, char *err, size_t err_len)
{
    memset(hp, 0, sizeof(*hp));
    rt_gguf_str arch;
    int rc = rt_gguf_get_str(g, "general.architecture", &arch);
    if (rc == -ENOENT)
        return ERR("missing required key general.architecture");
    if (rc < 0)
        return ERR("key general.architecture is not a string");
    if (arch.n >= sizeof(hp->arch))
        return ERR("general.architecture is too long (%llu bytes)", (unsigned long long)arch.n);
    memcpy(hp->arch, arch.p, arch.n);
    hp->arch[arch.n] = '\0';
    if (strcmp(hp->arch, "llama") == 0 || strcmp(hp->arch, "mistral") == 0) {
        hp->rope_neox = false;
    } else if (strcmp(hp->arch, "qwen2") == 0) {
        hp->rope_neox = true;
    } else {
        return ERR("general.architecture \"%s\" is not supported (llama, mistral, qwen2)", hp->arch);
    }

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
    REQ("feed_forward_length", n_ff);
    REQ("attention.head_count", n_head);
#undef REQ
    hp->n_head_kv = hp->n_head;
    if ((rc = get_arch_u32(g, a, "attention.head_count_kv", false, &v, err, err_len)) < 0)
        return rc;
    if (rc == 0)
        hp->n_head_kv = (int)v;
    if (hp->n_head_kv <= 0 || hp->n_head % hp->n_head_kv != 0)
        return ERR("%s.attention.head_count_kv = %d does not divide head_count %d", a, hp->n_head_kv,
                   hp->n_head);
    hp->head_dim = hp->n_embd / hp->n_head;
    if ((rc = get_arch_u32(g, a, "attention.key_length", false, &v, err, err_len)) < 0)
        return rc;
    if (rc == 0)
        hp->head_dim = (int)v;
    if (hp->head_dim <= 0 || hp->head_dim % 2 != 0 || hp->head_dim > 1024)
        return ERR("head dimension %d (embedding_length / head_count) is unusable", hp->head_dim);
    hp->n_rot = hp->head_dim;
    if ((rc = get_arch_u32(g, a, "rope.dimension_count", false, &v, err, err_len)) < 0)
        return rc;
    if (rc == 0)
        hp->n_rot = (int)v;
    if (hp->n_rot <= 0 || hp->n_rot > hp->head_dim || hp->n_rot % 2 != 0)
        return ERR("%s.rope.dimension_count = %d must be even and at most the head dimension %d", a,
                   hp->n_rot, hp->head_dim);
    hp->rope_freq_base = 10000.0f;
    if ((rc = get_arch_f32(g, a, "rope.freq_base", &hp->rope_freq_base, err, err_len)) < 0)
        return rc;
    if (!(hp->rope_freq_base > 0.0f) || !isfinite(hp->rope_freq_base))
        return ERR("%s.rope.freq_base must be a positive number", a);
    /* RoPE scaling as llama.cpp reads it: the type none or linear, or no
     * type (then a factor, if given, is linear); the factor from
     * rope.scaling.factor, else the older rope.scale_linear; 0 means none.
     * yarn and the rest would give wrong logits without a word: refused. */
    hp->rope_scale = 1.0f;
    char key[96];
    snprintf(key, sizeof(key), "%s.rope.scaling.type", a);
    rt_gguf_str st;
    rc = rt_gguf_get_str(g, key, &st);
    if (rc < 0 && rc != -ENOENT)
        return ERR("key %s is not a string", key);
    bool typed = rc == 0, none = typed && st.n == 4 && !memcmp(st.p, "none", 4);
    bool linear = typed && st.n == 6 && !memcmp(st.p, "linear", 6);
    if (typed && !none && !linear) {
        char shown[40];
        return ERR("%s = \"%s\": this RoPE scaling is not supported (none and linear are)", key,
                   rt_gguf_printable(shown, sizeof(shown), st));
    }
    if (!none) {
        const char *fk = "rope.scaling.factor";
        if ((rc = get_arch_f32(g, a, fk, &hp->rope_scale, err, err_len)) == 1)
            rc = get_arch_f32(g, a, fk = "rope.scale_linear", &hp->rope_scale, err, err_len);
        if (rc < 0)
            return rc;
        if (rc == 1 && linear)
            return ERR("missing required key %s.rope.scaling.factor (%s is linear)", a, key);
        if (hp->rope_scale == 0.0f)
            hp->rope_scale = 1.0f;
        if (!(hp->rope_scale > 0.0f) || !isfinite(hp->rope_scale))
            return ERR("%s.%s must be a positive number", a, fk);
    }
    hp->norm_eps = 1e-5f;
    if ((rc = get_arch_f32(g, a, "attention.layer_norm_rms_epsilon", &hp->norm_eps, err, err_len)) < 0)
        return rc;
    if (!(hp->norm_eps >= 0.0f) || !isfinite(hp->norm_eps))
        return ERR("%s.attention.layer_norm_rms_epsilon must be a number, not negative", a);

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

static int bind_layers(rt_model *m, char *err, size_t err_len)
{
    const rt_hparams *hp = &m->hp;
    const rt_gguf *g = m->gguf;
    int64_t q_dim = (int64_t)hp->n_head * hp->head_dim;
    int64_t kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    char name[96];
    int rc;
    /* the last layer's first tensor, before a block_count from the file
     * sizes an allocation (2^30 layers asked for 283 GB) */
    snprintf(name, sizeof(name), "blk.%d.attn_q.weight", hp->n_layer - 1);
    if (!rt_gguf_find_tensor(g, name))
        return ERR("missing required tensor %s (block_count is %d)", name, hp->n_layer);
    m->layers = calloc((size_t)hp->n_layer, sizeof(*m->layers));
    if (!m->layers)
        return -ENOMEM;
    for (int l = 0; l < hp->n_layer; l++) {
        rt_layer *L = &m->layers[l];
#define W(field, suffix, n_in, n_out)                                                                        \
    do {                                                                                                     \
        snprintf(name, sizeof(name), "blk.%d.%s", l, suffix);                                                \
        if ((rc = bind_weight(g, name, n_in, n_out, &L->field, err, err_len)) < 0)                           \
            return rc;                                                                                       \
    } while (0)
#define V(field, suffix, n, req)                                                                             \
    do {                                                                                                     \
        snprintf(name, sizeof(name), "blk.%d.%s", l, suffix);                                                \
        if ((rc = load_vector(g, name, n, req, &L->field, err, err_len)) < 0)                                \
            return rc;                                                                                       \
    } while (0)
        W(wq, "attn_q.weight", hp->n_embd, q_dim);
        W(wk, "attn_k.weight", hp->n_embd, kv_dim);
        W(wv, "attn_v.weight", hp->n_embd, kv_dim);
        W(wo, "attn_output.weight", q_dim, hp->n_embd);
        W(w_gate, "ffn_gate.weight", hp->n_embd, hp->n_ff);
        W(w_up, "ffn_up.weight", hp->n_embd, hp->n_ff);
        W(w_down, "ffn_down.weight", hp->n_ff, hp->n_embd);
        V(attn_norm, "attn_norm.weight", hp->n_embd, true);
        V(ffn_norm, "ffn_norm.weight", hp->n_embd, true);
        V(bq, "attn_q.bias", q_dim, false);
        V(bk, "attn_k.bias", kv_dim, false);
        V(bv, "attn_v.bias", kv_dim, false);
#undef W
#undef V
    }
    return 0;
}

/* What kn_rope turns each position by: the base's frequencies, the linear
 * scale, and the per-pair factors of rope_freqs.weight (Llama 3.1 and
 * later), which *has_factors reports. */
static int rope_frequencies(rt_model *m, bool *has_factors, char *err, size_t err_len)
{
    const rt_hparams *hp = &m->hp;
    float *factors;
    int rc = load_vector(m->gguf, "rope_freqs.weight", hp->n_rot / 2, false, &factors, err, err_len);
    if (rc < 0)
        return rc;
    *has_factors = factors != NULL;
    for (int i = 0; factors && i < hp->n_rot / 2 && !rc; i++)
        if (!(factors[i] > 0.0f) || !isfinite(factors[i]))
            rc = ERR("tensor rope_freqs.weight: element %d is %g, not a positive number", i, factors[i]);
    if (!rc && !(m->rope_inv_freq = malloc((size_t)(hp->n_rot / 2) * sizeof(double))))
        rc = -ENOMEM;
    if (!rc)
        kn_rope_inv_freq(m->rope_inv_freq, hp->n_rot, hp->rope_freq_base, hp->rope_scale, factors);
    free(factors);
    return rc;
}

static uint64_t weight_bytes(const rt_weight *w)
{
    return w->nbytes;
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
    if ((rc = bind_weight(m->gguf, "token_embd.weight", hp->n_embd, hp->n_vocab, &m->tok_embd, err, err_len)) < 0)
        goto fail;
    if (hp->tied_output)
        m->output = m->tok_embd;
    else if ((rc = bind_weight(m->gguf, "output.weight", hp->n_embd, hp->n_vocab, &m->output, err, err_len)) < 0)
        goto fail;
    if ((rc = load_vector(m->gguf, "output_norm.weight", hp->n_embd, true, &m->output_norm, err, err_len)) < 0)
        goto fail;
    if ((rc = bind_layers(m, err, err_len)) < 0)
        goto fail;
    bool rope_factors;
    if ((rc = rope_frequencies(m, &rope_factors, err, err_len)) < 0)
        goto fail;
    if ((rc = rt_tokenizer_load(m->gguf, &m->tok, err, err_len)) < 0)
        goto fail;
    if (rt_tokenizer_n_vocab(m->tok) > hp->n_vocab) {
        rc = ERR("tokenizer has %d tokens but token_embd.weight only %d rows", rt_tokenizer_n_vocab(m->tok),
                 hp->n_vocab);
        goto fail;
    }

    m->bytes_per_token = kn_row_bytes(m->tok_embd.type, hp->n_embd) + (hp->tied_output ? m->tok_embd.nbytes : 0);
    m->weight_bytes = m->tok_embd.nbytes + (hp->tied_output ? 0 : m->output.nbytes);
    if (!hp->tied_output)
        m->bytes_per_token += m->output.nbytes;
    for (int l = 0; l < hp->n_layer; l++) {
        const rt_layer *L = &m->layers[l];
        uint64_t b = weight_bytes(&L->wq) + weight_bytes(&L->wk) + weight_bytes(&L->wv) + weight_bytes(&L->wo) +
                     weight_bytes(&L->w_gate) + weight_bytes(&L->w_up) + weight_bytes(&L->w_down);
        m->bytes_per_token += b;
        m->weight_bytes += b;
    }

    const char *device = opts && opts->device ? opts->device : "cpu";
    bool cuda = strcmp(device, "cuda") == 0;
    if (!cuda && strcmp(device, "cpu") != 0) {
        rc = ERR("device \"%s\" is neither cpu nor cuda", device);
        goto fail;
    }
    /* The CUDA forward pass turns positions by base alone (its angle table
     * is built on the device): until it takes the factors, such a model
     * runs on the CPU only. */
    if (cuda && (rope_factors || hp->rope_scale != 1.0f)) {
        rc = ERR("RoPE %s: not supported on cuda yet (run this model with device cpu)",
                 rope_factors ? "frequency factors (rope_freqs.weight)" : "linear scaling");
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

void rt_model_free(rt_model *m)
{
    if (!m)
        return;
    if (m->layers) {
        for (int l = 0; l < m->hp.n_layer; l++) {
            rt_layer *L = &m->layers[l];
            free(L->attn_norm);
            free(L->ffn_norm);
            free(L->bq);
            free(L->bk);
            free(L->bv);
        }
        free(m->layers);
    }
    free(m->output_norm);
    free(m->rope_inv_freq);
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
