/* Quantizing a GGUF file: llama.cpp's file types and its rules for each
 * tensor's type (see quantize.h), and the conversion, rows spread over the
 * kernel pool's threads. */
#include "runtime/quantize.h"

#include "runtime/gguf.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- file types ---- */

static const struct {
    const char *name;
    rt_ftype ft;
    kn_type base;
} ftypes[] = {
    {"Q4_0", RT_FTYPE_Q4_0, KN_TYPE_Q4_0},       {"Q4_1", RT_FTYPE_Q4_1, KN_TYPE_Q4_1},
    {"Q5_0", RT_FTYPE_Q5_0, KN_TYPE_Q5_0},       {"Q5_1", RT_FTYPE_Q5_1, KN_TYPE_Q5_1},
    {"IQ4_NL", RT_FTYPE_IQ4_NL, KN_TYPE_IQ4_NL}, {"IQ4_XS", RT_FTYPE_IQ4_XS, KN_TYPE_IQ4_XS},
    {"Q2_K", RT_FTYPE_Q2_K, KN_TYPE_Q2_K},       {"Q3_K_S", RT_FTYPE_Q3_K_S, KN_TYPE_Q3_K},
    {"Q3_K_M", RT_FTYPE_Q3_K_M, KN_TYPE_Q3_K},   {"Q3_K_L", RT_FTYPE_Q3_K_L, KN_TYPE_Q3_K},
    {"Q4_K_S", RT_FTYPE_Q4_K_S, KN_TYPE_Q4_K},   {"Q4_K_M", RT_FTYPE_Q4_K_M, KN_TYPE_Q4_K},
    {"Q5_K_S", RT_FTYPE_Q5_K_S, KN_TYPE_Q5_K},   {"Q5_K_M", RT_FTYPE_Q5_K_M, KN_TYPE_Q5_K},
    {"Q6_K", RT_FTYPE_Q6_K, KN_TYPE_Q6_K},       {"Q8_0", RT_FTYPE_Q8_0, KN_TYPE_Q8_0},
    {"F16", RT_FTYPE_F16, KN_TYPE_F16},          {"BF16", RT_FTYPE_BF16, KN_TYPE_BF16},
    {"F32", RT_FTYPE_F32, KN_TYPE_F32},          {"MXFP4_MOE", RT_FTYPE_MXFP4_MOE, KN_TYPE_MXFP4},
};
#define N_FTYPES (sizeof(ftypes) / sizeof(ftypes[0]))

int rt_ftype_from_name(const char *name, rt_ftype *out)
{
    if (name == NULL)
        return -1;
    /* llama.cpp's quantize tool: a K-quant of three mixtures, unsuffixed,
     * is its _M one */
    static const struct {
        const char *alias;
        rt_ftype ft;
    } aliases[] = {{"Q3_K", RT_FTYPE_Q3_K_M}, {"Q4_K", RT_FTYPE_Q4_K_M}, {"Q5_K", RT_FTYPE_Q5_K_M}};
    for (size_t i = 0; i < sizeof(aliases) / sizeof(aliases[0]); i++) {
        if (strcasecmp(name, aliases[i].alias) == 0) {
            *out = aliases[i].ft;
            return 0;
        }
    }
    for (size_t i = 0; i < N_FTYPES; i++) {
        if (strcasecmp(name, ftypes[i].name) == 0) {
            *out = ftypes[i].ft;
            return 0;
        }
    }
    return -1;
}

const char *rt_ftype_name(rt_ftype ft)
{
    for (size_t i = 0; i < N_FTYPES; i++)
        if (ftypes[i].ft == ft)
            return ftypes[i].name;
    return NULL;
}

const char *rt_ftype_names(void)
{
    return "Q4_K_M, Q4_K_S, Q5_K_M, Q5_K_S, Q3_K_M, Q3_K_S, Q3_K_L, Q2_K, Q6_K, Q8_0, Q4_0, Q4_1, Q5_0, "
           "Q5_1, IQ4_NL, IQ4_XS, MXFP4_MOE, F16, BF16, F32 (Q3_K, Q4_K, Q5_K: the _M mixtures)";
}

kn_type rt_ftype_base_type(rt_ftype ft)
{
    for (size_t i = 0; i < N_FTYPES; i++)
        if (ftypes[i].ft == ft)
            return ftypes[i].base;
    return KN_TYPE_F32;
}

int rt_ftype_of_type(kn_type t)
{
    switch (t) {
    case KN_TYPE_Q3_K:
        return RT_FTYPE_Q3_K_M;
    case KN_TYPE_Q4_K:
        return RT_FTYPE_Q4_K_M;
    case KN_TYPE_Q5_K:
        return RT_FTYPE_Q5_K_M;
    default:
        break;
    }
    for (size_t i = 0; i < N_FTYPES; i++)
        if (ftypes[i].base == t)
            return (int)ftypes[i].ft;
    return -1;
}

/* ---- each tensor's type: llama.cpp's llama_tensor_get_type ---- */

typedef enum tensor_cat {
    CAT_OTHER,
    CAT_TOKEN_EMBD,
    CAT_OUTPUT,
    CAT_ATTN_Q,
    CAT_ATTN_K,
    CAT_ATTN_V, /* attn_v, attn_qkv and attn_kv_b, which llama.cpp treats alike */
    CAT_ATTN_OUTPUT,
    CAT_FFN_UP,
    CAT_FFN_GATE,
    CAT_FFN_DOWN,
} tensor_cat;

static tensor_cat category(const char *name)
{
    if (strcmp(name, "output.weight") == 0)
        return CAT_OUTPUT;
    if (strcmp(name, "token_embd.weight") == 0 || strcmp(name, "per_layer_token_embd.weight") == 0)
        return CAT_TOKEN_EMBD;
    static const struct {
        const char *part;
        tensor_cat cat;
    } parts[] = {
        {"attn_qkv.weight", CAT_ATTN_V}, {"attn_kv_b.weight", CAT_ATTN_V},
        {"attn_v.weight", CAT_ATTN_V},   {"attn_k.weight", CAT_ATTN_K},
        {"attn_q.weight", CAT_ATTN_Q},   {"attn_output.weight", CAT_ATTN_OUTPUT},
        {"ffn_up", CAT_FFN_UP},          {"ffn_gate", CAT_FFN_GATE},
        {"ffn_down", CAT_FFN_DOWN},
    };
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++)
        if (strstr(name, parts[i].part))
            return parts[i].cat;
    return CAT_OTHER;
}

/* llama.cpp's tensor_allows_quantization: matrices named "...weight", but
 * norms, gating and position tables, and the small matrices it names. */
static bool allows_quantization(const char *name, uint32_t n_dims)
{
    size_t n = strlen(name);
    if (n_dims < 2 || n < 6 || strcmp(name + n - 6, "weight") != 0)
        return false;
    static const char *const kept[] = {
        "_norm.weight",
        "ffn_gate_inp.weight",
        "ffn_gate_tid2eid.weight",
        "altup",
        "laurel",
        "per_layer_model_proj",
        "ssm_conv1d",
        "shortconv.conv.weight",
        "indexer.k_proj.weight",
        "indexer.q_proj.weight",
        "time_mix_",
        "attn_rel_b.weight",
        ".position_embd",
        ".patch_embd",
        ".patch_merger",
        ".rel_pos",
    };
    for (size_t i = 0; i < sizeof(kept) / sizeof(kept[0]); i++)
        if (strstr(name, kept[i]))
            return false;
    return strcmp(name, "position_embd.weight") != 0 && strcmp(name, "token_types.weight") != 0;
}

/* The layer a "blk.N." tensor is in; -1 for another. */
static int layer_of(const char *name)
{
    int l, used = 0;
    return sscanf(name, "blk.%d.%n", &l, &used) == 1 && used > 0 ? l : -1;
}

/* llama.cpp's choice of the layers that get more bits: the first and last
 * eighth, and every third one between. */
static bool use_more_bits(int i, int n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

/* The mixture's rule for one quantized tensor, of n_experts matrices (its
 * ne[2]; 1 for a plain matrix): llama_tensor_get_type_impl's branches of
 * the ftypes quantize.h lists. */
static kn_type mixture_type(const rt_quant_model *qm, rt_ftype ft, kn_type t, tensor_cat cat, int64_t nx,
                            int64_t n_experts, int layer)
{
    const int n = qm->n_layer;
    const bool eight = qm->n_expert == 8; /* Mixtral: its small attention matrices get more bits */
    if (cat == CAT_OUTPUT || (!qm->has_output && cat == CAT_TOKEN_EMBD)) {
        if (ft == RT_FTYPE_MXFP4_MOE || nx % kn_type_block_elems(t) != 0)
            return KN_TYPE_Q8_0;
        return t != KN_TYPE_Q8_0 ? KN_TYPE_Q6_K : t;
    }
    if (ft == RT_FTYPE_MXFP4_MOE)
        return n_experts > 1 ? KN_TYPE_MXFP4 : KN_TYPE_Q8_0;
    switch (cat) {
    case CAT_ATTN_V:
        if (ft == RT_FTYPE_Q2_K)
            t = qm->n_gqa >= 4 ? KN_TYPE_Q4_K : KN_TYPE_Q3_K;
        else if (ft == RT_FTYPE_Q3_K_M)
            t = layer < 2 ? KN_TYPE_Q5_K : KN_TYPE_Q4_K;
        else if (ft == RT_FTYPE_Q3_K_L)
            t = KN_TYPE_Q5_K;
        else if ((ft == RT_FTYPE_IQ4_NL || ft == RT_FTYPE_IQ4_XS) && qm->n_gqa >= 4)
            t = KN_TYPE_Q5_K;
        else if ((ft == RT_FTYPE_Q4_K_M || ft == RT_FTYPE_Q5_K_M) && use_more_bits(layer, n))
            t = KN_TYPE_Q6_K;
        else if (ft == RT_FTYPE_Q4_K_S && layer < 4)
            t = KN_TYPE_Q5_K;
        /* 70B: 8 heads share attn_v, an eighth of attn_q's size */
        if (qm->llama_70b && (t == KN_TYPE_Q3_K || t == KN_TYPE_Q4_K))
            t = KN_TYPE_Q5_K;
        return eight ? KN_TYPE_Q8_0 : t;
    case CAT_ATTN_K:
        return eight ? KN_TYPE_Q8_0 : t;
    case CAT_FFN_DOWN:
        if (ft == RT_FTYPE_Q2_K)
            return KN_TYPE_Q3_K;
        if (ft == RT_FTYPE_Q3_K_M)
            return layer < n / 16 ? KN_TYPE_Q5_K : KN_TYPE_Q4_K;
        if (ft == RT_FTYPE_Q3_K_L)
            return KN_TYPE_Q5_K;
        if (ft == RT_FTYPE_Q4_K_M)
            return use_more_bits(layer, n) ? KN_TYPE_Q6_K : t;
        if (layer < n / 8 && (ft == RT_FTYPE_IQ4_NL || ft == RT_FTYPE_IQ4_XS))
            return KN_TYPE_Q5_K;
        if (ft == RT_FTYPE_Q5_K_M && use_more_bits(layer, n))
            return KN_TYPE_Q6_K;
        if (ft == RT_FTYPE_Q4_K_S && layer < n / 8)
            return KN_TYPE_Q5_K;
        return t;
    case CAT_ATTN_OUTPUT:
        if (eight)
            return ft == RT_FTYPE_Q2_K || ft == RT_FTYPE_Q3_K_S || ft == RT_FTYPE_Q3_K_M || ft == RT_FTYPE_IQ4_NL ||
                           ft == RT_FTYPE_Q4_K_S || ft == RT_FTYPE_Q4_K_M || ft == RT_FTYPE_IQ4_XS
                       ? KN_TYPE_Q5_K
                       : t;
        if (ft == RT_FTYPE_Q2_K)
            return KN_TYPE_Q3_K;
        if (ft == RT_FTYPE_Q3_K_M)
            return KN_TYPE_Q4_K;
        if (ft == RT_FTYPE_Q3_K_L)
            return KN_TYPE_Q5_K;
        return t;
    default:
        return t;
    }
}

/* llama.cpp's tensor_type_fallback: a type whose block does not divide the
 * rows gives way to a 32-element one, then to F16. -1: none defined. */
static int fallback(kn_type t, int64_t nx, bool *fell)
{
    *fell = nx % kn_type_block_elems(t) != 0;
    if (!*fell)
        return (int)t;
    kn_type r;
    switch (t) {
    case KN_TYPE_Q2_K:
    case KN_TYPE_Q3_K:
        r = KN_TYPE_Q4_0;
        break;
    case KN_TYPE_Q4_K:
        r = KN_TYPE_Q5_0;
        break;
    case KN_TYPE_Q5_K:
        r = KN_TYPE_Q5_1;
        break;
    case KN_TYPE_Q6_K:
        r = KN_TYPE_Q8_0;
        break;
    case KN_TYPE_IQ4_XS:
        r = KN_TYPE_IQ4_NL;
        break;
    default:
        return -1;
    }
    return nx % kn_type_block_elems(r) != 0 ? (int)KN_TYPE_F16 : (int)r;
}

static int tensor_type(const rt_quant_model *qm, rt_ftype ft, bool pure, const char *name, uint32_t n_dims,
                       const int64_t *ne, kn_type src, bool *fell)
{
    *fell = false;
    if (!allows_quantization(name, n_dims))
        return (int)src;
    kn_type t = rt_ftype_base_type(ft);
    if (t == KN_TYPE_F32 || t == KN_TYPE_F16 || t == KN_TYPE_BF16)
        return (int)t; /* not quantized: llama.cpp's rules and fallbacks pass them by */
    if (!pure)
        t = mixture_type(qm, ft, t, category(name), ne[0], n_dims > 2 ? ne[2] : 1, layer_of(name));
    return fallback(t, ne[0], fell);
}

int rt_quant_tensor_type(const rt_quant_model *qm, rt_ftype ft, bool pure, const char *name, uint32_t n_dims,
                         const int64_t *ne, kn_type src)
{
    bool fell;
    return tensor_type(qm, ft, pure, name, n_dims, ne, src, &fell);
}

/* ---- the conversion ---- */

/* The rules' view of the model: its layer count and head grouping from the
 * architecture's keys (the layers counted from the tensor names where the
 * key is missing). */
static void model_of(const rt_gguf *g, rt_quant_model *qm)
{
    memset(qm, 0, sizeof(*qm));
    qm->n_gqa = 1;
    char arch[32] = "", key[96];
    rt_gguf_str s;
    if (rt_gguf_get_str(g, "general.architecture", &s) == 0 && s.n < sizeof(arch))
        memcpy(arch, s.p, s.n);
    uint32_t v, heads = 0, kv_heads = 0;
    snprintf(key, sizeof(key), "%s.block_count", arch);
    if (rt_gguf_get_u32(g, key, &v) == 0 && v <= (1u << 20))
        qm->n_layer = (int)v;
    snprintf(key, sizeof(key), "%s.attention.head_count", arch);
    if (rt_gguf_get_u32(g, key, &v) == 0)
        heads = v;
    snprintf(key, sizeof(key), "%s.attention.head_count_kv", arch);
    if (rt_gguf_get_u32(g, key, &v) == 0)
        kv_heads = v;
    if (heads > 0 && kv_heads > 0)
        qm->n_gqa = (int)(heads / kv_heads);
    snprintf(key, sizeof(key), "%s.expert_count", arch);
    if (rt_gguf_get_u32(g, key, &v) == 0 && v <= (1u << 16))
        qm->n_expert = (int)v;
    qm->has_output = rt_gguf_find_tensor(g, "output.weight") != NULL;
    for (int64_t i = 0; i < rt_gguf_n_tensors(g) && qm->n_layer == 0; i++) {
        const rt_gguf_tensor *t = rt_gguf_tensor_at(g, i);
        char name[96];
        rt_gguf_printable(name, sizeof(name), t->name);
        int l = layer_of(name);
        qm->n_layer = l >= qm->n_layer ? l + 1 : qm->n_layer;
    }
    qm->llama_70b = strcmp(arch, "llama") == 0 && qm->n_layer == 80 && qm->n_gqa > 1;
}

typedef struct convert_job {
    const rt_gguf_tensor *t;
    kn_type to;
    int64_t n_rows, chunk;
    size_t in_row, out_row;
    uint8_t *out;
    atomic_int failed;
} convert_job;

/* Rows [i * chunk, ...) of the tensor: to floats (where they are not),
 * then to the new type. */
static void convert_rows(void *arg, int i)
{
    convert_job *j = arg;
    const int64_t nx = j->t->ne[0], r0 = (int64_t)i * j->chunk;
    const int64_t r1 = r0 + j->chunk < j->n_rows ? r0 + j->chunk : j->n_rows;
    float *row = NULL;
    if (j->t->type != KN_TYPE_F32 && !(row = malloc((size_t)nx * sizeof(float)))) {
        atomic_store(&j->failed, 1);
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *in = (const uint8_t *)j->t->data + (size_t)r * j->in_row;
        const float *x = (const float *)in;
        if (row) {
            kn_dequantize_row((kn_type)j->t->type, in, row, nx);
            x = row;
        }
        kn_quantize_row(j->to, x, j->out + (size_t)r * j->out_row, nx);
    }
    free(row);
}

static bool is_float(uint32_t t)
{
    return t == KN_TYPE_F32 || t == KN_TYPE_F16 || t == KN_TYPE_BF16;
}

/* Converts tensor t to type `to` into a new buffer (*out, malloc'ed). */
static int convert(kn_ctx *kc, const rt_gguf_tensor *t, kn_type to, void **out, size_t *out_bytes)
{
    const int64_t nx = t->ne[0];
    convert_job j = {.t = t,
                     .to = to,
                     .n_rows = nx ? (int64_t)(t->nbytes / kn_row_bytes(t->type, nx)) : 0,
                     .in_row = kn_row_bytes(t->type, nx),
                     .out_row = kn_row_bytes(to, nx)};
    atomic_init(&j.failed, 0);
    *out_bytes = (size_t)j.n_rows * j.out_row;
    if (!(j.out = malloc(*out_bytes ? *out_bytes : 1)))
        return -ENOMEM;
    /* items of about 64K elements: enough to spread a matrix over the
     * threads, few enough that handing them out costs nothing */
    j.chunk = nx >= 65536 ? 1 : 65536 / (nx ? nx : 1);
    int64_t items = (j.n_rows + j.chunk - 1) / j.chunk;
    if (items > INT32_MAX) {
        free(j.out);
        return -EINVAL;
    }
    kn_parallel_for(kc, (int)items, convert_rows, &j);
    if (atomic_load(&j.failed)) {
        free(j.out);
        return -ENOMEM;
    }
    *out = j.out;
    return 0;
}

typedef struct quant_run {
    rt_gguf *in;
    rt_gguf_writer *w;
    kn_ctx *kc;
    void **bufs; /* the converted tensors, alive until the file is written */
    int64_t n_bufs;
} quant_run;

static int quantize_tensors(quant_run *q, const rt_quant_opts *o, rt_quant_stats *st, const char *path,
                            char *err, size_t err_len)
{
    rt_quant_model qm;
    model_of(q->in, &qm);
    const int64_t n = rt_gguf_n_tensors(q->in);
    for (int64_t i = 0; i < n; i++) {
        const rt_gguf_tensor *t = rt_gguf_tensor_at(q->in, i);
        char name[256];
        if (t->name.n >= sizeof(name) || memchr(t->name.p, '\0', t->name.n)) {
            snprintf(err, err_len, "%s: tensor %lld: its name is not one GGUF allows", path, (long long)i);
            return -EINVAL;
        }
        memcpy(name, t->name.p, t->name.n);
        name[t->name.n] = '\0';
        bool fell;
        int to = tensor_type(&qm, o->ftype, o->pure, name, t->n_dims, t->ne, (kn_type)t->type, &fell);
        if (to < 0) {
            snprintf(err, err_len,
                     "%s: tensor %s: rows of %lld elements are not whole %s blocks, and llama.cpp "
                     "defines no type to fall back to",
                     path, name, (long long)t->ne[0], kn_type_name(rt_ftype_base_type(o->ftype)));
            return -EINVAL;
        }
        if (o->progress)
            o->progress(o->progress_arg, i, n, name, (kn_type)t->type, (kn_type)to);
        const void *data = t->data;
        size_t nbytes = t->nbytes;
        int rc;
        if ((uint32_t)to != t->type) {
            if (!is_float(t->type)) {
                snprintf(err, err_len,
                         "%s: tensor %s is %s: quantize converts F32, F16 and BF16 weights only", path, name,
                         kn_type_name(t->type));
                return -EINVAL;
            }
            void *buf;
            if ((rc = convert(q->kc, t, (kn_type)to, &buf, &nbytes)) < 0) {
                snprintf(err, err_len, "%s: tensor %s: %s", path, name, strerror(-rc));
                return rc;
            }
            q->bufs[q->n_bufs++] = buf;
            data = buf;
            st->n_quantized += !is_float((uint32_t)to);
        }
        st->n_fallback += fell;
        st->bytes_in += t->nbytes;
        st->bytes_out += nbytes;
        st->n_tensors++;
        if ((rc = rt_gguf_writer_add_tensor(q->w, name, (uint32_t)to, t->n_dims, t->ne, data, nbytes)) < 0) {
            snprintf(err, err_len, "%s: tensor %s: %s", path, name, strerror(-rc));
            return rc;
        }
    }
    if (o->progress)
        o->progress(o->progress_arg, n, n, NULL, KN_TYPE_F32, KN_TYPE_F32);
    return 0;
}

int rt_quantize_file(const char *in, const char *out, const rt_quant_opts *o, rt_quant_stats *stats,
                     char *err, size_t err_len)
{
    rt_quant_stats st = {0};
    quant_run q = {0};
    int rc;
    if (rt_ftype_name(o->ftype) == NULL) {
        snprintf(err, err_len, "file type %d is not one quantize writes", (int)o->ftype);
        return -EINVAL;
    }
    if ((rc = rt_gguf_open(in, &q.in, err, err_len)) < 0)
        return rc;
    rc = -ENOMEM;
    q.w = rt_gguf_writer_new();
    q.kc = kn_ctx_new(o->n_threads, KN_BACKEND_REF);
    q.bufs = calloc((size_t)rt_gguf_n_tensors(q.in) + 1, sizeof(*q.bufs));
    if (!q.w || !q.kc || !q.bufs) {
        snprintf(err, err_len, "%s: out of memory", out);
        goto out;
    }
    for (int64_t i = 0; i < rt_gguf_n_kv(q.in); i++) {
        if ((rc = rt_gguf_writer_copy_kv(q.w, q.in, i)) < 0) {
            snprintf(err, err_len, "%s: key/value %lld: %s", in, (long long)i, strerror(-rc));
            goto out;
        }
    }
    if ((rc = rt_gguf_writer_add_u32(q.w, "general.file_type", (uint32_t)o->ftype)) < 0 ||
        (rc = rt_gguf_writer_add_u32(q.w, "general.quantization_version", 2)) < 0) {
        snprintf(err, err_len, "%s: %s", out, strerror(-rc));
        goto out;
    }
    if ((rc = quantize_tensors(&q, o, &st, in, err, err_len)) < 0)
        goto out;
    rc = rt_gguf_writer_write(q.w, out, err, err_len);
out:
    if (stats)
        *stats = st;
    for (int64_t i = 0; i < q.n_bufs; i++)
        free(q.bufs[i]);
    free(q.bufs);
    kn_ctx_free(q.kc);
    rt_gguf_writer_free(q.w);
    rt_gguf_free(q.in);
    return rc;
}
