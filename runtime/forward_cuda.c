/* The forward pass on a CUDA device: the CUDA plugin's device table (see
 * runtime/device.h), built with kernels/cuda into libinfergate_cuda.so,
 * which alone links the CUDA runtime and cuBLAS.
 *
 * Weights go to the device once, at load. A step uploads one small block of
 * int32 metadata (token ids, positions, KV slots, block tables), runs every
 * layer on device buffers — activations never leave the device — and copies
 * back only the logits the batch asked for. The KV cache is the rt_kv pool
 * in device memory, in F16: the CPU cache's blocks, layer offsets in a block
 * (rt_kv_layer_at) and groups of layers where some slide, but token-major
 * within a layer's K or V (a slot's heads side by side, where the CPU keeps
 * each head's slots together), so a pool is only read by the device that
 * wrote it.
 *
 * Every family the loader reads runs here, by the same hparams and
 * per-layer fields the CPU's forward.c and moe.c act on (never by an
 * architecture's name): Q/K norms, every bias, post-norms and their
 * absence before a block, the multipliers, GELU and gpt-oss's SwiGLU, the
 * layers' RoPEs as the host built them (rt_rope: linear, YaRN, factors,
 * LongRoPE's long ones per sequence, local bases, none), sliding windows,
 * soft-caps, sinks, and experts chosen and grouped on the device.
 *
 * Short steps (decode) are launch-bound: a few hundred small kernels per
 * token. They are recorded once per shape (tokens, sequences, logits rows)
 * into a CUDA graph and replayed; everything that changes from step to step
 * lives in the metadata buffer, so a graph stays valid until a buffer it
 * points at moves. Set INFERGATE_CUDA_GRAPHS=0 to run every step eagerly. */
#include "runtime/device.h"
#include "runtime/model_internal.h"

#include "kernels/cuda/kn_cuda.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GRAPH_MAX_TOKENS 64         /* longer steps are compute-bound: no graph */
#define GRAPH_SLOTS 64              /* decode shapes: (n, n, n) for every batch size seen */
#define ACT_ROUND 64                /* activation capacity grows in these steps */
#define HEADROOM_TOKENS 512         /* activations the memory checks keep room for */
#define HEADROOM_FIXED (160u << 20) /* cuBLAS workspace, dequant tile, scratch, CUDA's own */
#define MIB(x) ((double)(x) / (1024.0 * 1024.0))

/* A layer's matrices and vectors on the device, by role (NULL / d_q NULL:
 * the file has none). Experts are each one 3D tensor uploaded whole: expert
 * e's rows follow expert e - 1's. */
enum {
    LW_Q, LW_K, LW_V, LW_O, LW_GATE, LW_UP, LW_DOWN,
    LW_ROUTER, LW_GATE_EXPS, LW_UP_EXPS, LW_DOWN_EXPS, LW_SH_GATE, LW_SH_UP, LW_SH_DOWN,
    LW_COUNT
};
enum {
    LV_ATTN_NORM, LV_FFN_NORM, LV_BQ, LV_BK, LV_BV, LV_BO, LV_B_GATE, LV_B_UP, LV_B_DOWN,
    LV_Q_NORM, LV_K_NORM, LV_ATTN_POST, LV_FFN_POST, LV_SINKS,
    LV_B_ROUTER, LV_EB_GATE, LV_EB_UP, LV_EB_DOWN,
    LV_COUNT
};

typedef struct cuda_layer {
    kn_cuda_weight w[LW_COUNT];
    float *v[LV_COUNT];
} cuda_layer;

typedef struct step_graph {
    int n_tokens, n_seqs, n_out; /* its shape; n_tokens 0: a free slot */
    /* NULL: the shape was seen once and runs eagerly; recorded next time */
    kn_cuda_graph *g;
    uint64_t last_use;
} step_graph;

/* Offsets (in int32s) of the parts of a step's metadata. Tables go last:
 * their length changes as sequences grow, the other offsets do not. */
/* A model with sliding-window layers keeps its KV by groups of layers (see
 * rt_kv in model_internal.h): slots and table offsets are per group, group
 * g's at g * n_tokens and g * n_seqs. alt: per token, 1 where its sequence
 * turns by LongRoPE's long factors. */
typedef struct meta_layout {
    size_t tokens, pos, tok_seq, alt, slots, out_rows, table_off, tables, total;
} meta_layout;

typedef struct rt_cuda_model {
    kn_cuda *kc;
    kn_cuda_info info;
    kn_cuda_weight tok_embd, output; /* output may be tok_embd (tied) */
    bool tied;
    float *output_norm, *output_bias;
    double *rope_inv[RT_ROPE_SETS]; /* the host's rt_rope tables, uploaded; NULL: a set not used */
    cuda_layer *layers;
    int n_layer;
    uint64_t weight_bytes, headroom;

    int cap; /* tokens the activation buffers hold */
    float *x, *xb, *y, *q, *k, *v, *att, *hb, *hb2, *cs; /* cs: the main table, then the local one */
    /* mixture of experts: router logits, choices and weights per (token,
     * slot), the pairs grouped by expert, and the grouped rows' FFN */
    float *moe_logits, *moe_w, *moe_h, *moe_h2, *moe_y;
    int32_t *moe_pick, *moe_rows, *moe_inv, *moe_off;
    void *xq;                 /* Q8_0 activations, up to KN_CUDA_MMV_MAX_ROWS rows of the widest input */
    int32_t *meta_h, *meta_d; /* pinned host / device */
    size_t meta_cap;
    int out_cap;
    float *out_x, *logits_d, *logits_h; /* logits_h pinned */

    bool graphs_on;
    step_graph graphs[GRAPH_SLOTS];
    uint64_t clock;
    /* What the recorded graphs have baked in; any change drops them. */
    const void *graph_pool;
    size_t graph_block_elems;
    int graph_block_tokens;
    uint64_t graph_gen;
} rt_cuda_model;

/* ---- sizes ---- */

/* The widest FFN of a layer: dense, shared expert, or one expert. */
static int ff_max(const rt_hparams *hp)
{
    int f = hp->n_ff > hp->n_ff_shexp ? hp->n_ff : hp->n_ff_shexp;
    return f > hp->n_ff_exp ? f : hp->n_ff_exp;
}

static size_t act_floats_per_token(const rt_hparams *hp)
{
    size_t q_dim = (size_t)hp->n_head * hp->head_dim, kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    size_t n = 3 * (size_t)hp->n_embd + 2 * q_dim + 2 * kv_dim + 2 * (size_t)ff_max(hp) + 2 * (size_t)hp->n_rot;
    if (hp->n_expert > 0) /* logits, and per slot: weight, choice, group, two FFN rows and an output row */
        n += (size_t)hp->n_expert + (size_t)hp->n_expert_used * (4 + 2 * (size_t)hp->n_ff_exp + hp->n_embd);
    return n;
}

static int max_in(const rt_hparams *hp)
{
    int q_dim = hp->n_head * hp->head_dim, m = hp->n_embd;
    if (q_dim > m)
        m = q_dim;
    return ff_max(hp) > m ? ff_max(hp) : m;
}

/* ---- load / free ---- */

static int upload_floats(kn_cuda *kc, const float *src, int n, float **out)
{
    *out = NULL;
    if (!src)
        return 0;
    int rc = kn_cuda_alloc(kc, (size_t)n * sizeof(float), (void **)out);
    if (rc == 0 && (rc = kn_cuda_upload(kc, *out, src, (size_t)n * sizeof(float)))) {
        kn_cuda_release(kc, *out);
        *out = NULL;
    }
    return rc;
}

static uint64_t weight_dev_bytes(const rt_weight *w)
{
    return kn_cuda_weight_bytes(w->type, w->n_out, w->n_in);
}

/* n views of one 3D tensor as one matrix of all their rows; false when
 * they do not lie one after the other (the loader makes them so). */
static bool experts_whole(const rt_weight *views, int n, rt_weight *out)
{
    *out = views[0];
    for (int e = 1; e < n; e++)
        if (views[e].type != views[0].type || views[e].n_in != views[0].n_in || views[e].n_out != views[0].n_out ||
            (const char *)views[e].data != (const char *)views[0].data + (size_t)e * views[0].nbytes)
            return false;
    out->n_out = n * views[0].n_out;
    out->nbytes = (uint64_t)n * views[0].nbytes;
    return true;
}

/* Layer l's host matrices and vectors by role (data / pointer NULL where
 * the file has none), and each vector's length. -EINVAL when experts are
 * not one tensor each. */
static int layer_sources(const rt_model *m, int l, rt_weight w[LW_COUNT], const float *v[LV_COUNT],
                         int len[LV_COUNT])
{
    const rt_hparams *hp = &m->hp;
    const rt_layer *L = &m->layers[l];
    const int q_dim = hp->n_head * hp->head_dim, kv_dim = hp->n_head_kv * hp->head_dim;
    const bool head = m->arch->qk_norm == RT_QK_NORM_HEAD;
    memset(w, 0, sizeof(rt_weight) * LW_COUNT);
    w[LW_Q] = L->wq;
    w[LW_K] = L->wk;
    w[LW_V] = L->wv;
    w[LW_O] = L->wo;
    w[LW_GATE] = L->w_gate;
    w[LW_UP] = L->w_up;
    w[LW_DOWN] = L->w_down;
    const float *vs[LV_COUNT] = {
        [LV_ATTN_NORM] = L->attn_norm, [LV_FFN_NORM] = L->ffn_norm, [LV_BQ] = L->bq, [LV_BK] = L->bk,
        [LV_BV] = L->bv, [LV_BO] = L->bo, [LV_B_GATE] = L->b_gate, [LV_B_UP] = L->b_up, [LV_B_DOWN] = L->b_down,
        [LV_Q_NORM] = L->q_norm, [LV_K_NORM] = L->k_norm, [LV_ATTN_POST] = L->attn_post_norm,
        [LV_FFN_POST] = L->ffn_post_norm, [LV_SINKS] = L->sinks,
    };
    const int ff = L->w_gate.data ? L->w_gate.n_out : 0;
    const int lens[LV_COUNT] = {
        [LV_ATTN_NORM] = hp->n_embd, [LV_FFN_NORM] = hp->n_embd, [LV_BQ] = q_dim, [LV_BK] = kv_dim,
        [LV_BV] = kv_dim, [LV_BO] = hp->n_embd, [LV_B_GATE] = ff, [LV_B_UP] = ff, [LV_B_DOWN] = hp->n_embd,
        [LV_Q_NORM] = head ? hp->head_dim : q_dim, [LV_K_NORM] = head ? hp->head_dim : kv_dim,
        [LV_ATTN_POST] = hp->n_embd, [LV_FFN_POST] = hp->n_embd, [LV_SINKS] = hp->n_head,
        [LV_B_ROUTER] = hp->n_expert, [LV_EB_GATE] = hp->n_expert * hp->n_ff_exp,
        [LV_EB_UP] = hp->n_expert * hp->n_ff_exp, [LV_EB_DOWN] = hp->n_expert * hp->n_embd,
    };
    memcpy(v, vs, sizeof(vs));
    memcpy(len, lens, sizeof(lens));
    const rt_experts *x = L->moe;
    if (x) {
        w[LW_ROUTER] = x->router;
        if (!experts_whole(x->gate, hp->n_expert, &w[LW_GATE_EXPS]) ||
            !experts_whole(x->up, hp->n_expert, &w[LW_UP_EXPS]) ||
            !experts_whole(x->down, hp->n_expert, &w[LW_DOWN_EXPS]))
            return -EINVAL;
        w[LW_SH_GATE] = x->sh_gate;
        w[LW_SH_UP] = x->sh_up;
        w[LW_SH_DOWN] = x->sh_down;
        v[LV_B_ROUTER] = x->b_router;
        v[LV_EB_GATE] = x->b_gate;
        v[LV_EB_UP] = x->b_up;
        v[LV_EB_DOWN] = x->b_down;
    }
    return 0;
}

static void graphs_drop(rt_cuda_model *c)
{
    for (int i = 0; i < GRAPH_SLOTS; i++) {
        kn_cuda_graph_free(c->graphs[i].g);
        memset(&c->graphs[i], 0, sizeof(c->graphs[i]));
    }
}

/* The activation buffers, for acts_reserve and acts_free: each with its
 * elements per token (4-byte floats or int32s), and a fixed count (the
 * experts' offsets). */
typedef struct act_buf {
    void **p;
    size_t per_token, fixed;
} act_buf;

static int act_bufs(rt_cuda_model *c, const rt_hparams *hp, act_buf *out)
{
    const size_t q_dim = (size_t)hp->n_head * hp->head_dim, kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    const size_t d = (size_t)hp->n_embd, ff = (size_t)ff_max(hp), k = (size_t)hp->n_expert_used;
    const size_t fe = (size_t)hp->n_ff_exp, rot = hp->n_rot > 0 ? (size_t)hp->n_rot : 1;
    const act_buf b[] = {
        {(void **)&c->x, d, 0},
        {(void **)&c->xb, d, 0},
        {(void **)&c->y, d, 0},
        {(void **)&c->q, q_dim, 0},
        {(void **)&c->k, kv_dim, 0},
        {(void **)&c->v, kv_dim, 0},
        {(void **)&c->att, q_dim, 0},
        {(void **)&c->hb, ff, 0},
        {(void **)&c->hb2, ff, 0},
        {(void **)&c->cs, 2 * rot, 0},
        {(void **)&c->moe_logits, (size_t)hp->n_expert, 0},
        {(void **)&c->moe_w, k, 0},
        {(void **)&c->moe_h, k * fe, 0},
        {(void **)&c->moe_h2, k * fe, 0},
        {(void **)&c->moe_y, k * d, 0},
        {(void **)&c->moe_pick, k, 0},
        {(void **)&c->moe_rows, k, 0},
        {(void **)&c->moe_inv, k, 0},
        {(void **)&c->moe_off, 0, (size_t)hp->n_expert + 1},
    };
    const int n = hp->n_expert > 0 ? (int)(sizeof(b) / sizeof(b[0])) : 10; /* dense: no expert buffers */
    memcpy(out, b, (size_t)n * sizeof(b[0]));
    return n;
}

#define MAX_ACT_BUFS 19

static void acts_free(rt_cuda_model *c, const rt_hparams *hp)
{
    act_buf b[MAX_ACT_BUFS];
    const int n = act_bufs(c, hp, b);
    for (int i = 0; i < n; i++) {
        kn_cuda_release(c->kc, *b[i].p);
        *b[i].p = NULL;
    }
    c->cap = 0;
}

static void cuda_model_free(rt_cuda_model *c, const rt_hparams *hp)
{
    if (!c)
        return;
    if (c->kc) {
        kn_cuda_bind_thread(c->kc);
        kn_cuda_sync(c->kc);
        graphs_drop(c);
        acts_free(c, hp);
        kn_cuda_release(c->kc, c->xq);
        kn_cuda_release(c->kc, c->meta_d);
        kn_cuda_host_release(c->kc, c->meta_h);
        kn_cuda_release(c->kc, c->out_x);
        kn_cuda_release(c->kc, c->logits_d);
        kn_cuda_host_release(c->kc, c->logits_h);
        if (c->layers) {
            for (int l = 0; l < c->n_layer; l++) {
                cuda_layer *L = &c->layers[l];
                for (int i = 0; i < LW_COUNT; i++)
                    kn_cuda_weight_release(c->kc, &L->w[i]);
                for (int i = 0; i < LV_COUNT; i++)
                    kn_cuda_release(c->kc, L->v[i]);
            }
        }
        if (!c->tied)
            kn_cuda_weight_release(c->kc, &c->output);
        kn_cuda_weight_release(c->kc, &c->tok_embd);
        kn_cuda_release(c->kc, c->output_norm);
        kn_cuda_release(c->kc, c->output_bias);
        for (int i = 0; i < RT_ROPE_SETS; i++)
            kn_cuda_release(c->kc, c->rope_inv[i]);
        kn_cuda_free(c->kc);
    }
    free(c->layers);
    free(c);
}

static int upload_layer(rt_cuda_model *c, const rt_model *m, int l, cuda_layer *D)
{
    kn_cuda *kc = c->kc;
    rt_weight w[LW_COUNT];
    const float *v[LV_COUNT];
    int len[LV_COUNT], rc;
    if ((rc = layer_sources(m, l, w, v, len)))
        return rc;
    for (int i = 0; i < LW_COUNT; i++)
        if (w[i].data && (rc = kn_cuda_weight_upload(kc, w[i].data, w[i].type, w[i].n_out, w[i].n_in, &D->w[i])))
            return rc;
    for (int i = 0; i < LV_COUNT; i++)
        if ((rc = upload_floats(kc, v[i], len[i], &D->v[i])))
            return rc;
    return 0;
}

/* Device bytes of layer l's matrices and vectors, or -EINVAL with err
 * naming a matrix that has no CUDA layout. */
static int64_t layer_bytes(const rt_model *m, int l, char *err, size_t err_len)
{
    rt_weight w[LW_COUNT];
    const float *v[LV_COUNT];
    int len[LV_COUNT];
    if (layer_sources(m, l, w, v, len)) {
        snprintf(err, err_len, "layer %d: the experts' matrices are not one tensor each", l);
        return -EINVAL;
    }
    int64_t b = 0;
    for (int i = 0; i < LW_COUNT; i++) {
        if (!w[i].data)
            continue;
        uint64_t wb = weight_dev_bytes(&w[i]);
        if (wb == 0) {
            snprintf(err, err_len, "layer %d: a %s weight of %d x %d has no CUDA layout", l,
                     kn_type_name(w[i].type) ? kn_type_name(w[i].type) : "?", w[i].n_out, w[i].n_in);
            return -EINVAL;
        }
        b += (int64_t)wb;
    }
    for (int i = 0; i < LV_COUNT; i++)
        if (v[i])
            b += (int64_t)len[i] * (int64_t)sizeof(float);
    return b;
}

static int upload_ropes(rt_cuda_model *c, const rt_model *m)
{
    for (int i = 0; i < RT_ROPE_SETS; i++) {
        const double *inv = m->rope[i].inv_freq;
        size_t bytes = (size_t)(m->hp.n_rot / 2) * sizeof(double);
        if (!inv || bytes == 0)
            continue;
        int rc = kn_cuda_alloc(c->kc, bytes, (void **)&c->rope_inv[i]);
        if (rc || (rc = kn_cuda_upload(c->kc, c->rope_inv[i], inv, bytes)))
            return rc;
    }
    return 0;
}

static int cuda_load(rt_model *m, char *err, size_t err_len)
{
    const rt_hparams *hp = &m->hp;
    char why[512];
    int rc, n_dev;
    if (hp->head_dim > 256) {
        snprintf(err, err_len, "head dimension %d: the CUDA attention kernel takes at most 256",
                 hp->head_dim);
        return -EINVAL;
    }
    if ((rc = kn_cuda_device_count(&n_dev, why, sizeof(why)))) {
        snprintf(err, err_len, "no CUDA device: %s", why);
        return -ENODEV;
    }
    rt_cuda_model *c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->n_layer = hp->n_layer;
    const char *g = getenv("INFERGATE_CUDA_GRAPHS");
    c->graphs_on = !(g && !strcmp(g, "0"));
    if ((rc = kn_cuda_new(0, &c->kc, why, sizeof(why)))) {
        snprintf(err, err_len, "%s%s", rc == -ENODEV ? "no CUDA device: " : "CUDA: ", why);
        goto fail;
    }
    if ((rc = kn_cuda_get_info(c->kc, &c->info))) {
        snprintf(err, err_len, "CUDA: %s", kn_cuda_error(c->kc));
        goto fail;
    }

    /* Size everything before uploading anything. */
    uint64_t wb = weight_dev_bytes(&m->tok_embd) + (hp->tied_output ? 0 : weight_dev_bytes(&m->output));
    wb += (uint64_t)hp->n_embd * sizeof(float) + (m->output_bias ? (uint64_t)hp->n_vocab * sizeof(float) : 0);
    for (int l = 0; l < hp->n_layer; l++) {
        int64_t b = layer_bytes(m, l, err, err_len);
        if (b < 0) {
            rc = (int)b;
            goto fail;
        }
        wb += (uint64_t)b;
    }
    c->weight_bytes = wb;
    c->headroom = (uint64_t)HEADROOM_TOKENS * act_floats_per_token(hp) * sizeof(float) + HEADROOM_FIXED +
                  (uint64_t)KN_CUDA_MMV_MAX_ROWS * hp->n_vocab * sizeof(float);
    if (wb + c->headroom > c->info.mem_free) {
        snprintf(
            err, err_len,
            "the model does not fit on %s (%s): it needs %.1f MiB of device memory (%.1f MiB of weights, "
            "%.1f MiB for activations) and %.1f MiB of the device's %.1f MiB are free",
            c->info.name, c->info.uuid, MIB(wb + c->headroom), MIB(wb), MIB(c->headroom),
            MIB(c->info.mem_free), MIB(c->info.mem_total));
        rc = -ENOSPC;
        goto fail;
    }

    if ((rc = kn_cuda_weight_upload(c->kc, m->tok_embd.data, m->tok_embd.type, m->tok_embd.n_out,
                                    m->tok_embd.n_in, &c->tok_embd)))
        goto upload_fail;
    c->tied = hp->tied_output;
    if (c->tied)
        c->output = c->tok_embd;
    else if ((rc = kn_cuda_weight_upload(c->kc, m->output.data, m->output.type, m->output.n_out,
                                         m->output.n_in, &c->output)))
        goto upload_fail;
    if ((rc = upload_floats(c->kc, m->output_norm, hp->n_embd, &c->output_norm)) ||
        (rc = upload_floats(c->kc, m->output_bias, hp->n_vocab, &c->output_bias)) || (rc = upload_ropes(c, m)))
        goto upload_fail;
    if (!(c->layers = calloc((size_t)hp->n_layer, sizeof(*c->layers)))) {
        rc = -ENOMEM;
        goto upload_fail;
    }
    for (int l = 0; l < hp->n_layer; l++)
        if ((rc = upload_layer(c, m, l, &c->layers[l])))
            goto upload_fail;
    if ((rc = kn_cuda_alloc(c->kc, kn_cuda_q8_bytes(KN_CUDA_MMV_MAX_ROWS, max_in(hp)), &c->xq)))
        goto upload_fail;
    m->dev_state = c;
    return 0;
upload_fail:
    snprintf(err, err_len, "uploading the weights to %s: %s", c->info.name,
             kn_cuda_error(c->kc)[0] ? kn_cuda_error(c->kc) : strerror(-rc));
fail:
    cuda_model_free(c, hp);
    return rc;
}

static void cuda_device_info(const rt_model *m, rt_device_info *out)
{
    const rt_cuda_model *c = m->dev_state;
    memset(out, 0, sizeof(*out));
    snprintf(out->kind, sizeof(out->kind), "cuda");
    snprintf(out->name, sizeof(out->name), "%s", c->info.name);
    snprintf(out->uuid, sizeof(out->uuid), "%s", c->info.uuid);
    snprintf(out->mig_profile, sizeof(out->mig_profile), "%s", c->info.mig_profile);
    out->mem_total = c->info.mem_total;
    out->mem_free = c->info.mem_free;
    uint64_t f, t;
    if (kn_cuda_mem_info(c->info.ordinal, &f, &t) == 0) {
        out->mem_free = f;
        out->mem_total = t;
    }
    out->mem_weights = c->weight_bytes;
}

/* ---- KV pool ---- */

static int cuda_kv_alloc(const rt_model *m, size_t bytes, void **out, char *err, size_t err_len)
{
    rt_cuda_model *c = m->dev_state;
    *out = NULL;
    uint64_t free_b = 0, total_b = 0;
    kn_cuda_bind_thread(c->kc);
    if (kn_cuda_mem_info(c->info.ordinal, &free_b, &total_b)) {
        snprintf(err, err_len, "cannot read the free memory of %s", c->info.name);
        return -EIO;
    }
    if ((uint64_t)bytes + c->headroom > free_b) {
        snprintf(err, err_len,
                 "KV cache of %.1f MiB does not fit on %s (%s): %.1f MiB of its %.1f MiB are free after the "
                 "model's %.1f MiB of weights, and %.1f MiB of that stay reserved for activations",
                 MIB(bytes), c->info.name, c->info.uuid, MIB(free_b), MIB(total_b), MIB(c->weight_bytes),
                 MIB(c->headroom));
        return -ENOSPC;
    }
    int rc = kn_cuda_alloc(c->kc, bytes, out);
    if (rc) {
        snprintf(err, err_len, "KV cache of %.1f MiB on %s: %s", MIB(bytes), c->info.name,
                 kn_cuda_error(c->kc));
        kn_cuda_clear_error(c->kc);
        return rc;
    }
    return 0;
}

static void cuda_kv_release(const rt_model *m, void *p, size_t bytes)
{
    rt_cuda_model *c = m->dev_state;
    if (c && p) {
        kn_cuda_bind_thread(c->kc);
        kn_cuda_sync(c->kc);
        kn_cuda_release(c->kc, p);
    }
}

/* ---- per-step buffers ---- */

static int acts_reserve(rt_cuda_model *c, const rt_hparams *hp, int n_tokens)
{
    if (n_tokens <= c->cap)
        return 0;
    graphs_drop(c);
    acts_free(c, hp);
    int cap = (n_tokens + ACT_ROUND - 1) / ACT_ROUND * ACT_ROUND;
    act_buf b[MAX_ACT_BUFS];
    const int n = act_bufs(c, hp, b);
    for (int i = 0; i < n; i++) {
        int rc = kn_cuda_alloc(c->kc, ((size_t)cap * b[i].per_token + b[i].fixed) * 4, b[i].p);
        if (rc) {
            acts_free(c, hp);
            return rc;
        }
    }
    c->cap = cap;
    return 0;
}

static int out_reserve(rt_cuda_model *c, const rt_hparams *hp, int n_out)
{
    if (n_out <= c->out_cap)
        return 0;
    graphs_drop(c);
    kn_cuda_release(c->kc, c->out_x);
    kn_cuda_release(c->kc, c->logits_d);
    kn_cuda_host_release(c->kc, c->logits_h);
    c->out_x = c->logits_d = c->logits_h = NULL;
    c->out_cap = 0;
    int cap = n_out < 8 ? 8 : n_out;
    int rc;
    if ((rc = kn_cuda_alloc(c->kc, (size_t)cap * hp->n_embd * sizeof(float), (void **)&c->out_x)) ||
        (rc = kn_cuda_alloc(c->kc, (size_t)cap * hp->n_vocab * sizeof(float), (void **)&c->logits_d)) ||
        (rc = kn_cuda_host_alloc(c->kc, (size_t)cap * hp->n_vocab * sizeof(float), (void **)&c->logits_h)))
        return rc;
    c->out_cap = cap;
    return 0;
}

static int meta_reserve(rt_cuda_model *c, size_t n)
{
    if (n <= c->meta_cap)
        return 0;
    graphs_drop(c);
    kn_cuda_release(c->kc, c->meta_d);
    kn_cuda_host_release(c->kc, c->meta_h);
    c->meta_d = c->meta_h = NULL;
    c->meta_cap = 0;
    size_t cap = n + n / 2 + 256;
    int rc;
    if ((rc = kn_cuda_alloc(c->kc, cap * sizeof(int32_t), (void **)&c->meta_d)) ||
        (rc = kn_cuda_host_alloc(c->kc, cap * sizeof(int32_t), (void **)&c->meta_h)))
        return rc;
    c->meta_cap = cap;
    return 0;
}

/* The kernels' scratch for this many tokens, so that recording a graph
 * never has to allocate. */
static int scratch_reserve(rt_cuda_model *c, const rt_model *m, int n_tokens, int n_out)
{
    static const int dense[] = {LW_Q, LW_K, LW_V, LW_O, LW_GATE, LW_UP, LW_DOWN, LW_ROUTER, LW_SH_GATE, LW_SH_UP,
                                LW_SH_DOWN}; /* the experts' grouped products need none */
    int rc;
    for (int l = 0; l < c->n_layer; l++) {
        const cuda_layer *L = &c->layers[l];
        for (size_t i = 0; i < sizeof(dense) / sizeof(dense[0]); i++) {
            const kn_cuda_weight *w = &L->w[dense[i]];
            if (w->d_q && (rc = kn_cuda_matmul_reserve(c->kc, w->type, w->n_out, w->n_in, n_tokens)))
                return rc;
        }
    }
    if (n_out > 0 &&
        (rc = kn_cuda_matmul_reserve(c->kc, c->output.type, c->output.n_out, c->output.n_in, n_out)))
        return rc;
    return kn_cuda_attention_reserve(c->kc, n_tokens, m->hp.n_head, m->hp.head_dim);
}

static meta_layout layout(int n_tokens, int n_seqs, int n_out, int n_groups, size_t n_table)
{
    meta_layout L;
    size_t T = (size_t)n_tokens, G = (size_t)n_groups;
    L.tokens = 0;
    L.pos = T;
    L.tok_seq = 2 * T;
    L.alt = 3 * T;
    L.slots = 4 * T;
    L.out_rows = L.slots + G * T;
    L.table_off = L.out_rows + (size_t)n_out;
    L.tables = L.table_off + G * (size_t)n_seqs;
    L.total = L.tables + n_table;
    return L;
}

/* Every group's block table of every sequence, as block indices: -1 where a
 * sliding group let go of a block (no query's window reaches it). */
static void meta_fill(const rt_model *m, const rt_kv *kv, const rt_batch_entry *e, int n_entries, int T,
                      const meta_layout *L)
{
    const rt_cuda_model *c = m->dev_state;
    int32_t *h = c->meta_h;
    size_t t0 = 0, o = 0, tab = 0;
    const int bt = kv->block_tokens, G = kv->n_groups;
    const bool has_long = m->rope[RT_ROPE_LONG].inv_freq != NULL;
    for (int i = 0; i < n_entries; i++) {
        const rt_seq *s = e[i].seq;
        for (int g = 0; g < G; g++) {
            uint16_t **table = rt_seq_table(s, g);
            h[L->table_off + (size_t)g * n_entries + i] = (int32_t)tab;
            for (int b = 0; b < s->n_pos; b++)
                h[L->tables + tab++] = table[b] ? rt_kv_block_index(kv, table[b]) : -1;
            for (int j = 0; j < e[i].n_tokens; j++) {
                const int p = s->len + j;
                h[L->slots + (size_t)g * T + t0 + j] = rt_kv_block_index(kv, table[p / bt]) * bt + p % bt;
            }
        }
        for (int j = 0; j < e[i].n_tokens; j++) {
            const size_t t = t0 + j;
            h[L->tokens + t] = e[i].tokens[j];
            h[L->pos + t] = s->len + j;
            h[L->tok_seq + t] = i;
            h[L->alt + t] = has_long && s->rope_long;
        }
        t0 += (size_t)e[i].n_tokens;
        if (e[i].logits)
            h[L->out_rows + o++] = (int32_t)(t0 - 1);
    }
}

/* ---- the step ---- */

static bool wants_q8(int n_rows, const kn_cuda_weight *a, const kn_cuda_weight *b, const kn_cuda_weight *c)
{
    return kn_cuda_matmul_wants_q8(a->type, n_rows) || (b && kn_cuda_matmul_wants_q8(b->type, n_rows)) ||
           (c && kn_cuda_matmul_wants_q8(c->type, n_rows));
}

#define CK(call)                                                                                             \
    do {                                                                                                     \
        if ((rc = (call)))                                                                                   \
            return rc;                                                                                       \
    } while (0)

/* The RMSNorm before a block into xb (quantized for the matrices that
 * want it), or the stream itself where the family has none (OLMo 2): the
 * block's input, and its Q8_0 form or NULL (the matmul makes its own). */
static int block_input(rt_cuda_model *c, const rt_hparams *hp, const float *norm, int T, bool q8,
                       const float **in, void **xq)
{
    *in = c->x;
    *xq = NULL;
    if (!norm)
        return 0;
    *in = c->xb;
    *xq = q8 ? c->xq : NULL;
    return kn_cuda_rmsnorm_q8(c->kc, c->xb, c->x, norm, T, hp->n_embd, hp->norm_eps, *xq);
}

/* A block's output y (its matrix's product, not yet added) into the
 * stream: + bias, post-norm, times the residual multiplier, x += y. */
static int block_output(rt_cuda_model *c, const rt_hparams *hp, const float *bias, const float *post_norm, int T)
{
    const int dim = hp->n_embd;
    int rc;
    if (bias)
        CK(kn_cuda_add_bias(c->kc, c->y, bias, T, dim));
    if (post_norm)
        CK(kn_cuda_rmsnorm(c->kc, c->y, c->y, post_norm, T, dim, hp->norm_eps));
    if (hp->residual_scale != 1.0f)
        CK(kn_cuda_scale_softcap(c->kc, c->y, (size_t)T * dim, hp->residual_scale, 0.0f));
    return kn_cuda_add(c->kc, c->x, c->y, (size_t)T * dim);
}

/* The product with a block's last matrix: straight into the stream
 * (residual add) when nothing comes between and it does not read the
 * stream itself, else into y for block_output. */
static int block_last(rt_cuda_model *c, const rt_hparams *hp, const kn_cuda_weight *w, const float *in, void *xq,
                      int T, const float *bias, const float *post_norm)
{
    int rc;
    if (!bias && !post_norm && hp->residual_scale == 1.0f && in != c->x)
        return kn_cuda_matmul(c->kc, w, in, xq, T, c->x, true);
    CK(kn_cuda_matmul(c->kc, w, in, xq, T, c->y, false));
    return block_output(c, hp, bias, post_norm, T);
}

static kn_cuda_act act_of(const rt_model *m)
{
    switch (m->arch->act) {
    case RT_ACT_GELU: return KN_CUDA_ACT_GELU;
    case RT_ACT_SWIGLU_OAI: return KN_CUDA_ACT_SWIGLU_OAI;
    default: return KN_CUDA_ACT_SILU;
    }
}

static int attention_block(rt_model *m, const rt_kv *kv, int l, int T, int n_seqs, const meta_layout *ML)
{
    const rt_hparams *hp = &m->hp;
    rt_cuda_model *c = m->dev_state;
    kn_cuda *kc = c->kc;
    const cuda_layer *L = &c->layers[l];
    const rt_layer *H = &m->layers[l];
    const int q_dim = hp->n_head * hp->head_dim, kv_dim = hp->n_head_kv * hp->head_dim;
    const int32_t *md = c->meta_d;
    const float *in;
    void *xq;
    int rc;
    CK(block_input(c, hp, L->v[LV_ATTN_NORM], T, wants_q8(T, &L->w[LW_Q], &L->w[LW_K], &L->w[LW_V]), &in, &xq));
    CK(kn_cuda_matmul(kc, &L->w[LW_Q], in, xq, T, c->q, false));
    CK(kn_cuda_matmul(kc, &L->w[LW_K], in, xq, T, c->k, false));
    CK(kn_cuda_matmul(kc, &L->w[LW_V], in, xq, T, c->v, false));
    if (L->v[LV_BQ])
        CK(kn_cuda_add_bias(kc, c->q, L->v[LV_BQ], T, q_dim));
    if (L->v[LV_BK])
        CK(kn_cuda_add_bias(kc, c->k, L->v[LV_BK], T, kv_dim));
    if (L->v[LV_BV])
        CK(kn_cuda_add_bias(kc, c->v, L->v[LV_BV], T, kv_dim));
    if (L->v[LV_Q_NORM]) { /* per head, or over the whole row */
        const bool head = m->arch->qk_norm == RT_QK_NORM_HEAD;
        CK(kn_cuda_rmsnorm(kc, c->q, c->q, L->v[LV_Q_NORM], head ? T * hp->n_head : T, head ? hp->head_dim : q_dim,
                           hp->norm_eps));
        CK(kn_cuda_rmsnorm(kc, c->k, c->k, L->v[LV_K_NORM], head ? T * hp->n_head_kv : T,
                           head ? hp->head_dim : kv_dim, hp->norm_eps));
    }
    int g;
    size_t k_off, v_off;
    rt_kv_layer_at(kv, l, &g, &k_off, &v_off);
    const int bt = kv->block_tokens;
    const size_t rot = hp->n_rot > 0 ? (size_t)hp->n_rot : 1;
    const kn_cuda_rope_kv rk = {
        .d_q = c->q,
        .d_k = c->k,
        .d_v = c->v,
        .d_cs = c->cs + (H->rope == RT_ROPE_LOCAL ? (size_t)c->cap * rot : 0), /* enqueue_step's tables */
        .n_tokens = T,
        .n_head = hp->n_head,
        .n_kv_head = hp->n_head_kv,
        .head_dim = hp->head_dim,
        .rope_dim = H->rope == RT_ROPE_OFF ? 0 : hp->n_rot,
        .neox = hp->rope_neox,
        .d_slots = md + ML->slots + (size_t)g * T,
        .d_pool = kv->pool,
        .block_elems = kv->block_elems,
        .k_off = k_off,
        .v_off = v_off,
        .block_tokens = bt,
    };
    CK(kn_cuda_rope_kv_store(kc, &rk));
    const kn_cuda_attn at = {
        .d_q = c->q,
        .d_out = c->att,
        .n_tokens = T,
        .d_pos = md + ML->pos,
        .d_tok_seq = md + ML->tok_seq,
        .d_table_off = md + ML->table_off + (size_t)g * n_seqs,
        .d_tables = md + ML->tables,
        .d_pool = kv->pool,
        .block_elems = kv->block_elems,
        .k_off = k_off,
        .v_off = v_off,
        .block_tokens = bt,
        .n_head = hp->n_head,
        .n_kv_head = hp->n_head_kv,
        .head_dim = hp->head_dim,
        .scale = hp->attn_scale,
        .window = H->local ? hp->n_swa : 0,
        .softcap = hp->attn_softcap,
        .d_sinks = L->v[LV_SINKS],
    };
    CK(kn_cuda_attention(kc, &at));
    xq = NULL;
    if (wants_q8(T, &L->w[LW_O], NULL, NULL)) {
        CK(kn_cuda_quantize_q8(kc, c->att, T, q_dim, c->xq));
        xq = c->xq;
    }
    return block_last(c, hp, &L->w[LW_O], c->att, xq, T, L->v[LV_BO], L->v[LV_ATTN_POST]);
}

/* act(in.gate + b_gate) * (in.up + b_up) into hb: the input of a dense
 * FFN's down matrix; *xq its Q8_0 form when that matrix wants one. */
static int dense_ffn_hidden(rt_cuda_model *c, kn_cuda_act act, const kn_cuda_weight *gate,
                            const kn_cuda_weight *up, const kn_cuda_weight *down, const float *b_gate,
                            const float *b_up, const float *in, void *in_xq, int T, void **xq)
{
    kn_cuda *kc = c->kc;
    const int ff = gate->n_out;
    int rc;
    CK(kn_cuda_matmul(kc, gate, in, in_xq, T, c->hb, false));
    CK(kn_cuda_matmul(kc, up, in, in_xq, T, c->hb2, false));
    if (b_gate)
        CK(kn_cuda_add_bias(kc, c->hb, b_gate, T, ff));
    if (b_up)
        CK(kn_cuda_add_bias(kc, c->hb2, b_up, T, ff));
    *xq = wants_q8(T, down, NULL, NULL) && ff % 32 == 0 ? c->xq : NULL;
    return kn_cuda_glu_q8(kc, act, c->hb, c->hb2, T, ff, *xq);
}

/* Layer l's experts over T rows of in, into y: the router, the choices,
 * the shared expert (or zeros), then every chosen expert's FFN over its
 * group of rows, summed back by weight. */
static int moe_ffn(rt_model *m, int l, const float *in, void *in_xq, int T)
{
    const rt_hparams *hp = &m->hp;
    rt_cuda_model *c = m->dev_state;
    kn_cuda *kc = c->kc;
    const cuda_layer *L = &c->layers[l];
    const int ne = hp->n_expert, k = hp->n_expert_used, d = hp->n_embd, fe = hp->n_ff_exp;
    const kn_cuda_act act = act_of(m);
    int rc;
    CK(kn_cuda_matmul(kc, &L->w[LW_ROUTER], in, kn_cuda_matmul_wants_q8(L->w[LW_ROUTER].type, T) ? in_xq : NULL, T,
                      c->moe_logits, false));
    if (L->v[LV_B_ROUTER])
        CK(kn_cuda_add_bias(kc, c->moe_logits, L->v[LV_B_ROUTER], T, ne));
    CK(kn_cuda_moe_route(kc, c->moe_logits, T, ne, k, m->arch->gating == RT_GATING_SOFTMAX_TOPK,
                         (m->arch->flags & RT_ARCH_MOE_NORM_W) != 0, c->moe_pick, c->moe_w));
    CK(kn_cuda_moe_group(kc, c->moe_pick, T * k, ne, c->moe_off, c->moe_rows, c->moe_inv));
    if (L->w[LW_SH_UP].d_q) {
        void *xq;
        CK(dense_ffn_hidden(c, act, &L->w[LW_SH_GATE], &L->w[LW_SH_UP], &L->w[LW_SH_DOWN], NULL, NULL, in, in_xq, T,
                            &xq));
        CK(kn_cuda_matmul(kc, &L->w[LW_SH_DOWN], c->hb, xq, T, c->y, false));
    } else {
        CK(kn_cuda_memset(kc, c->y, 0, (size_t)T * d * sizeof(float)));
    }
    CK(kn_cuda_moe_matmul(kc, &L->w[LW_GATE_EXPS], ne, in, k, c->moe_rows, c->moe_off, L->v[LV_EB_GATE], c->moe_h));
    CK(kn_cuda_moe_matmul(kc, &L->w[LW_UP_EXPS], ne, in, k, c->moe_rows, c->moe_off, L->v[LV_EB_UP], c->moe_h2));
    CK(kn_cuda_glu_q8(kc, act, c->moe_h, c->moe_h2, T * k, fe, NULL));
    CK(kn_cuda_moe_matmul(kc, &L->w[LW_DOWN_EXPS], ne, c->moe_h, 0, c->moe_rows, c->moe_off, L->v[LV_EB_DOWN],
                          c->moe_y));
    return kn_cuda_moe_combine(kc, c->y, c->moe_y, c->moe_w, c->moe_inv, T, k, d);
}

static int ffn_block(rt_model *m, int l, int T)
{
    const rt_hparams *hp = &m->hp;
    rt_cuda_model *c = m->dev_state;
    const cuda_layer *L = &c->layers[l];
    const float *in;
    void *xq;
    int rc;
    if (m->layers[l].moe) {
        CK(block_input(c, hp, L->v[LV_FFN_NORM], T, false, &in, &xq));
        CK(moe_ffn(m, l, in, xq, T));
        return block_output(c, hp, NULL, L->v[LV_FFN_POST], T);
    }
    CK(block_input(c, hp, L->v[LV_FFN_NORM], T, wants_q8(T, &L->w[LW_GATE], &L->w[LW_UP], NULL), &in, &xq));
    CK(dense_ffn_hidden(c, act_of(m), &L->w[LW_GATE], &L->w[LW_UP], &L->w[LW_DOWN], L->v[LV_B_GATE], L->v[LV_B_UP],
                        in, xq, T, &xq));
    return block_last(c, hp, &L->w[LW_DOWN], c->hb, xq, T, L->v[LV_B_DOWN], L->v[LV_FFN_POST]);
}

/* Enqueues the whole step (nothing runs on the host in between, which is
 * what lets it be recorded). */
static int enqueue_step(rt_model *m, const rt_kv *kv, int T, int n_seqs, int n_out, const meta_layout *ML)
{
    const rt_hparams *hp = &m->hp;
    rt_cuda_model *c = m->dev_state;
    kn_cuda *kc = c->kc;
    const int dim = hp->n_embd;
    const int32_t *md = c->meta_d;
    const size_t rot = hp->n_rot > 0 ? (size_t)hp->n_rot : 1;
    int rc;

    CK(kn_cuda_embed(kc, &c->tok_embd, md + ML->tokens, T, c->x));
    if (hp->embd_scale != 1.0f)
        CK(kn_cuda_scale_softcap(kc, c->x, (size_t)T * dim, hp->embd_scale, 0.0f));
    if (c->rope_inv[RT_ROPE_MAIN])
        CK(kn_cuda_rope_table_freqs(kc, md + ML->pos, md + ML->alt, T, hp->n_rot, c->rope_inv[RT_ROPE_MAIN],
                                    m->rope[RT_ROPE_MAIN].mscale, c->rope_inv[RT_ROPE_LONG],
                                    m->rope[RT_ROPE_LONG].mscale, c->cs));
    if (c->rope_inv[RT_ROPE_LOCAL])
        CK(kn_cuda_rope_table_freqs(kc, md + ML->pos, NULL, T, hp->n_rot, c->rope_inv[RT_ROPE_LOCAL],
                                    m->rope[RT_ROPE_LOCAL].mscale, NULL, 1.0f, c->cs + (size_t)c->cap * rot));
    for (int l = 0; l < hp->n_layer; l++)
        if ((rc = attention_block(m, kv, l, T, n_seqs, ML)) || (rc = ffn_block(m, l, T)))
            return rc;
    if (n_out > 0) {
        CK(kn_cuda_gather_rows(kc, c->out_x, c->x, md + ML->out_rows, n_out, dim));
        CK(kn_cuda_rmsnorm(kc, c->out_x, c->out_x, c->output_norm, n_out, dim, hp->norm_eps));
        CK(kn_cuda_matmul(kc, &c->output, c->out_x, NULL, n_out, c->logits_d, false));
        if (c->output_bias)
            CK(kn_cuda_add_bias(kc, c->logits_d, c->output_bias, n_out, hp->n_vocab));
        if (hp->logit_scale != 1.0f || hp->final_softcap > 0.0f)
            CK(kn_cuda_scale_softcap(kc, c->logits_d, (size_t)n_out * hp->n_vocab, 1.0f / hp->logit_scale,
                                     hp->final_softcap));
    }
    return 0;
}

/* The slot of this shape: recorded, or seen once and waiting. */
static step_graph *graph_find(rt_cuda_model *c, int T, int n_seqs, int n_out)
{
    for (int i = 0; i < GRAPH_SLOTS; i++) {
        step_graph *g = &c->graphs[i];
        if (g->n_tokens == T && g->n_seqs == n_seqs && g->n_out == n_out)
            return g;
    }
    return NULL;
}

static step_graph *graph_slot(rt_cuda_model *c)
{
    step_graph *oldest = &c->graphs[0];
    for (int i = 0; i < GRAPH_SLOTS; i++) {
        if (!c->graphs[i].n_tokens)
            return &c->graphs[i];
        if (c->graphs[i].last_use < oldest->last_use)
            oldest = &c->graphs[i];
    }
    kn_cuda_graph_free(oldest->g);
    memset(oldest, 0, sizeof(*oldest));
    return oldest;
}

/* Replays the graph of this shape. The first step of a shape runs without
 * one (1: run it eagerly): kernels load lazily and cuBLAS sets up per
 * shape on first use, neither of which may happen while recording. The
 * second records the graph, then replays it. 0, 1, or an error. */
static int run_graph(rt_model *m, const rt_kv *kv, int T, int n_seqs, int n_out, const meta_layout *ML)
{
    rt_cuda_model *c = m->dev_state;
    step_graph *g = graph_find(c, T, n_seqs, n_out);
    if (!g) {
        g = graph_slot(c);
        *g = (step_graph){.n_tokens = T, .n_seqs = n_seqs, .n_out = n_out, .last_use = ++c->clock};
        return 1;
    }
    if (!g->g) {
        kn_cuda_graph *kg = NULL;
        int rc = kn_cuda_capture_begin(c->kc), rc_step = 0;
        if (rc == 0) {
            rc_step = enqueue_step(m, kv, T, n_seqs, n_out, ML);
            rc = kn_cuda_capture_end(c->kc, &kg);
        }
        if (rc == 0 && rc_step) {
            /* The recording held but the step itself failed (a kernel
             * refused its arguments): an error of this step, which would
             * fail as well without a graph, not a reason to give graphs up.
             * The shape is recorded again next time. */
            kn_cuda_graph_free(kg);
            return rc_step;
        }
        if (rc) {
            /* A device that cannot record (or a kernel that refuses to be
             * recorded, which invalidates the capture and so fails its end)
             * still computes: fall back to plain launches for good. */
            fprintf(stderr, "cuda: recording a graph of %d tokens failed (%s); running without graphs\n", T,
                    kn_cuda_error(c->kc));
            kn_cuda_clear_error(c->kc);
            graphs_drop(c);
            c->graphs_on = false;
            return 1;
        }
        g->g = kg;
    }
    g->last_use = ++c->clock;
    return kn_cuda_graph_launch(c->kc, g->g);
}

static int cuda_forward(rt_model *m, rt_batch_entry *e, int n_entries, int n_tokens, int n_out)
{
    rt_cuda_model *c = m->dev_state;
    const rt_hparams *hp = &m->hp;
    const rt_kv *kv = e[0].seq->kv;
    size_t n_table = 0;
    for (int i = 0; i < n_entries; i++) {
        /* One pool per step: the attention kernel reads a single one. */
        if (e[i].seq->kv != kv || !kv->pool)
            return -EINVAL;
        n_table += (size_t)kv->n_groups * e[i].seq->n_pos;
    }
    kn_cuda_clear_error(c->kc);
    int rc = kn_cuda_bind_thread(c->kc);
    const meta_layout ML = layout(n_tokens, n_entries, n_out, kv->n_groups, n_table);
    if (rc || (rc = acts_reserve(c, hp, n_tokens)) || (rc = out_reserve(c, hp, n_out)) ||
        (rc = meta_reserve(c, ML.total)) || (rc = scratch_reserve(c, m, n_tokens, n_out)))
        goto fail;
    if (c->graph_pool != kv->pool || c->graph_block_elems != kv->block_elems ||
        c->graph_block_tokens != kv->block_tokens || c->graph_gen != kn_cuda_scratch_generation(c->kc)) {
        graphs_drop(c);
        c->graph_pool = kv->pool;
        c->graph_block_elems = kv->block_elems;
        c->graph_block_tokens = kv->block_tokens;
        c->graph_gen = kn_cuda_scratch_generation(c->kc);
    }

    meta_fill(m, kv, e, n_entries, n_tokens, &ML);
    if ((rc = kn_cuda_upload_async(c->kc, c->meta_d, c->meta_h, ML.total * sizeof(int32_t))))
        goto fail;
    rc = 1;
    if (c->graphs_on && n_tokens <= GRAPH_MAX_TOKENS)
        rc = run_graph(m, kv, n_tokens, n_entries, n_out, &ML);
    if (rc == 1)
        rc = enqueue_step(m, kv, n_tokens, n_entries, n_out, &ML);
    if (rc)
        goto fail;
    if (n_out > 0 && (rc = kn_cuda_download_async(c->kc, c->logits_h, c->logits_d,
                                                  (size_t)n_out * hp->n_vocab * sizeof(float))))
        goto fail;
    /* Also what makes the pinned metadata free to refill next step. */
    if ((rc = kn_cuda_sync(c->kc)))
        goto fail;
    for (int i = 0, o = 0; i < n_entries; i++)
        if (e[i].logits)
            memcpy(e[i].logits, c->logits_h + (size_t)o++ * hp->n_vocab, (size_t)hp->n_vocab * sizeof(float));
    return 0;
fail:
    fprintf(stderr, "cuda: forward pass of %d tokens failed: %s\n", n_tokens,
            kn_cuda_error(c->kc)[0] ? kn_cuda_error(c->kc) : strerror(-rc));
    /* Leave the stream idle so the next step may reuse the buffers, and
     * say when no step can run any more. */
    if (kn_cuda_recover(c->kc))
        return -ENOTRECOVERABLE;
    return rc < 0 ? rc : -EIO;
}

static void cuda_free(rt_model *m)
{
    cuda_model_free(m->dev_state, &m->hp);
    m->dev_state = NULL;
}

static const rt_device_ops cuda_ops = {
    .abi = RT_DEVICE_ABI,
    .model_size = sizeof(rt_model),
    .kv_size = sizeof(rt_kv),
    .seq_size = sizeof(rt_seq),
    .name = "cuda",
    .kv_q8_0 = false, /* the attention kernel reads halves */
    .load = cuda_load,
    .free = cuda_free,
    .forward = cuda_forward,
    .kv_alloc = cuda_kv_alloc,
    .kv_release = cuda_kv_release,
    .device_info = cuda_device_info,
};

/* The plugin's one exported symbol (RT_DEVICE_PLUGIN_ENTRY; the linker's
 * version script hides every other). */
const rt_device_ops *rt_device_plugin(void);
const rt_device_ops *rt_device_plugin(void)
{
    return &cuda_ops;
}
