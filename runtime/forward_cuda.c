/* The forward pass on a CUDA device: the CUDA plugin's device table (see
 * runtime/device.h), built with kernels/cuda into libinfergate_cuda.so,
 * which alone links the CUDA runtime and cuBLAS.
 *
 * Weights go to the device once, at load. A step uploads one small block of
 * int32 metadata (token ids, positions, KV slots, block tables), runs every
 * layer on device buffers — activations never leave the device — and copies
 * back only the logits the batch asked for. The KV cache is the rt_kv pool
 * in device memory, in F16, with the CPU cache's block layout.
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

typedef struct cuda_layer {
    kn_cuda_weight wq, wk, wv, wo, w_gate, w_up, w_down;
    float *attn_norm, *ffn_norm, *bq, *bk, *bv; /* device; biases optional */
} cuda_layer;

typedef struct step_graph {
    int n_tokens, n_seqs, n_out; /* its shape; n_tokens 0: a free slot */
    /* NULL: the shape was seen once and runs eagerly; recorded next time */
    kn_cuda_graph *g;
    uint64_t last_use;
} step_graph;

/* Offsets (in int32s) of the parts of a step's metadata. Tables go last:
 * their length changes as sequences grow, the other offsets do not. */
typedef struct meta_layout {
    size_t tokens, pos, slots, tok_seq, out_rows, table_off, tables, total;
} meta_layout;

typedef struct rt_cuda_model {
    kn_cuda *kc;
    kn_cuda_info info;
    kn_cuda_weight tok_embd, output; /* output may be tok_embd (tied) */
    bool tied;
    float *output_norm;
    cuda_layer *layers;
    int n_layer;
    uint64_t weight_bytes, headroom;

    int cap; /* tokens the activation buffers hold */
    float *x, *xb, *q, *k, *v, *att, *hb, *hb2, *cs;
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

static size_t act_floats_per_token(const rt_hparams *hp)
{
    size_t q_dim = (size_t)hp->n_head * hp->head_dim, kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    return 2 * (size_t)hp->n_embd + 2 * q_dim + 2 * kv_dim + 2 * (size_t)hp->n_ff + (size_t)hp->n_rot;
}

static int max_in(const rt_hparams *hp)
{
    int q_dim = hp->n_head * hp->head_dim, m = hp->n_embd;
    if (q_dim > m)
        m = q_dim;
    return hp->n_ff > m ? hp->n_ff : m;
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

static void graphs_drop(rt_cuda_model *c)
{
    for (int i = 0; i < GRAPH_SLOTS; i++) {
        kn_cuda_graph_free(c->graphs[i].g);
        memset(&c->graphs[i], 0, sizeof(c->graphs[i]));
    }
}

static void acts_free(rt_cuda_model *c)
{
    float **bufs[] = {&c->x, &c->xb, &c->q, &c->k, &c->v, &c->att, &c->hb, &c->hb2, &c->cs};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) {
        kn_cuda_release(c->kc, *bufs[i]);
        *bufs[i] = NULL;
    }
    c->cap = 0;
}

static void cuda_model_free(rt_cuda_model *c)
{
    if (!c)
        return;
    if (c->kc) {
        kn_cuda_bind_thread(c->kc);
        kn_cuda_sync(c->kc);
        graphs_drop(c);
        acts_free(c);
        kn_cuda_release(c->kc, c->xq);
        kn_cuda_release(c->kc, c->meta_d);
        kn_cuda_host_release(c->kc, c->meta_h);
        kn_cuda_release(c->kc, c->out_x);
        kn_cuda_release(c->kc, c->logits_d);
        kn_cuda_host_release(c->kc, c->logits_h);
        if (c->layers) {
            for (int l = 0; l < c->n_layer; l++) {
                cuda_layer *L = &c->layers[l];
                kn_cuda_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
                for (size_t i = 0; i < sizeof(ws) / sizeof(ws[0]); i++)
                    kn_cuda_weight_release(c->kc, ws[i]);
                kn_cuda_release(c->kc, L->attn_norm);
                kn_cuda_release(c->kc, L->ffn_norm);
                kn_cuda_release(c->kc, L->bq);
                kn_cuda_release(c->kc, L->bk);
                kn_cuda_release(c->kc, L->bv);
            }
        }
        if (!c->tied)
            kn_cuda_weight_release(c->kc, &c->output);
        kn_cuda_weight_release(c->kc, &c->tok_embd);
        kn_cuda_release(c->kc, c->output_norm);
        kn_cuda_free(c->kc);
    }
    free(c->layers);
    free(c);
}

static int upload_layer(rt_cuda_model *c, const rt_hparams *hp, const rt_layer *L, cuda_layer *D)
{
    kn_cuda *kc = c->kc;
    const rt_weight *src[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    kn_cuda_weight *dst[] = {&D->wq, &D->wk, &D->wv, &D->wo, &D->w_gate, &D->w_up, &D->w_down};
    int rc;
    for (size_t i = 0; i < sizeof(src) / sizeof(src[0]); i++)
        if ((rc = kn_cuda_weight_upload(kc, src[i]->data, src[i]->type, src[i]->n_out, src[i]->n_in, dst[i])))
            return rc;
    int q_dim = hp->n_head * hp->head_dim, kv_dim = hp->n_head_kv * hp->head_dim;
    if ((rc = upload_floats(kc, L->attn_norm, hp->n_embd, &D->attn_norm)) ||
        (rc = upload_floats(kc, L->ffn_norm, hp->n_embd, &D->ffn_norm)) ||
        (rc = upload_floats(kc, L->bq, q_dim, &D->bq)) || (rc = upload_floats(kc, L->bk, kv_dim, &D->bk)) ||
        (rc = upload_floats(kc, L->bv, kv_dim, &D->bv)))
        return rc;
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
    wb += (uint64_t)hp->n_embd * sizeof(float);
    for (int l = 0; l < hp->n_layer; l++) {
        const rt_layer *L = &m->layers[l];
        const rt_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof(ws) / sizeof(ws[0]); i++) {
            uint64_t b = weight_dev_bytes(ws[i]);
            if (b == 0) {
                snprintf(err, err_len, "layer %d: a %s weight of %d x %d has no CUDA layout", l,
                         kn_type_name(ws[i]->type) ? kn_type_name(ws[i]->type) : "?", ws[i]->n_out,
                         ws[i]->n_in);
                rc = -EINVAL;
                goto fail;
            }
            wb += b;
        }
        wb += (uint64_t)(2 * hp->n_embd + (L->bq ? hp->n_head * hp->head_dim : 0) +
                         (L->bk ? 2 * hp->n_head_kv * hp->head_dim : 0)) *
              sizeof(float);
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
    if ((rc = upload_floats(c->kc, m->output_norm, hp->n_embd, &c->output_norm)))
        goto upload_fail;
    if (!(c->layers = calloc((size_t)hp->n_layer, sizeof(*c->layers)))) {
        rc = -ENOMEM;
        goto upload_fail;
    }
    for (int l = 0; l < hp->n_layer; l++)
        if ((rc = upload_layer(c, hp, &m->layers[l], &c->layers[l])))
            goto upload_fail;
    if ((rc = kn_cuda_alloc(c->kc, kn_cuda_q8_bytes(KN_CUDA_MMV_MAX_ROWS, max_in(hp)), &c->xq)))
        goto upload_fail;
    m->dev_state = c;
    return 0;
upload_fail:
    snprintf(err, err_len, "uploading the weights to %s: %s", c->info.name,
             kn_cuda_error(c->kc)[0] ? kn_cuda_error(c->kc) : strerror(-rc));
fail:
    cuda_model_free(c);
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
    acts_free(c);
    int cap = (n_tokens + ACT_ROUND - 1) / ACT_ROUND * ACT_ROUND;
    size_t t = (size_t)cap, q_dim = (size_t)hp->n_head * hp->head_dim;
    size_t kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    struct {
        float **p;
        size_t n;
    } bufs[] = {
        {&c->x, t * hp->n_embd}, {&c->xb, t * hp->n_embd}, {&c->q, t * q_dim},
        {&c->k, t * kv_dim},     {&c->v, t * kv_dim},      {&c->att, t * q_dim},
        {&c->hb, t * hp->n_ff},  {&c->hb2, t * hp->n_ff},  {&c->cs, t * (hp->n_rot > 0 ? hp->n_rot : 1)},
    };
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) {
        int rc = kn_cuda_alloc(c->kc, bufs[i].n * sizeof(float), (void **)bufs[i].p);
        if (rc) {
            acts_free(c);
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
    int rc;
    for (int l = 0; l < c->n_layer; l++) {
        const cuda_layer *L = &c->layers[l];
        const kn_cuda_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof(ws) / sizeof(ws[0]); i++)
            if ((rc = kn_cuda_matmul_reserve(c->kc, ws[i]->type, ws[i]->n_out, ws[i]->n_in, n_tokens)))
                return rc;
    }
    if (n_out > 0 &&
        (rc = kn_cuda_matmul_reserve(c->kc, c->output.type, c->output.n_out, c->output.n_in, n_out)))
        return rc;
    return kn_cuda_attention_reserve(c->kc, n_tokens, m->hp.n_head, m->hp.head_dim);
}

static meta_layout layout(int n_tokens, int n_seqs, int n_out, size_t n_table)
{
    meta_layout L;
    size_t T = (size_t)n_tokens;
    L.tokens = 0;
    L.pos = T;
    L.slots = 2 * T;
    L.tok_seq = 3 * T;
    L.out_rows = 4 * T;
    L.table_off = L.out_rows + (size_t)n_out;
    L.tables = L.table_off + (size_t)n_seqs;
    L.total = L.tables + n_table;
    return L;
}

static void meta_fill(const rt_cuda_model *c, const rt_kv *kv, const rt_batch_entry *e, int n_entries,
                      const meta_layout *L)
{
    int32_t *h = c->meta_h;
    size_t t = 0, o = 0, tab = 0;
    const int bt = kv->block_tokens;
    for (int i = 0; i < n_entries; i++) {
        const rt_seq *s = e[i].seq;
        const int32_t *table = h + L->tables + tab;
        h[L->table_off + i] = (int32_t)tab;
        for (int b = 0; b < s->n_blocks; b++)
            h[L->tables + tab++] = rt_kv_block_index(kv, s->blocks[b]);
        for (int j = 0; j < e[i].n_tokens; j++, t++) {
            const int p = s->len + j;
            h[L->tokens + t] = e[i].tokens[j];
            h[L->pos + t] = p;
            h[L->slots + t] = table[p / bt] * bt + p % bt;
            h[L->tok_seq + t] = i;
        }
        if (e[i].logits)
            h[L->out_rows + o++] = (int32_t)(t - 1);
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

/* Enqueues the whole step (nothing runs on the host in between, which is
 * what lets it be recorded). */
static int enqueue_step(rt_model *m, const rt_kv *kv, int T, int n_seqs, int n_out, const meta_layout *ML)
{
    const rt_hparams *hp = &m->hp;
    rt_cuda_model *c = m->dev_state;
    kn_cuda *kc = c->kc;
    const int dim = hp->n_embd, q_dim = hp->n_head * hp->head_dim, kv_dim = hp->n_head_kv * hp->head_dim;
    const int bt = kv->block_tokens;
    const int32_t *md = c->meta_d;
    int rc;

    CK(kn_cuda_embed(kc, &c->tok_embd, md + ML->tokens, T, c->x));
    CK(kn_cuda_rope_table(kc, md + ML->pos, T, hp->n_rot, hp->rope_freq_base, c->cs));
    for (int l = 0; l < hp->n_layer; l++) {
        const cuda_layer *L = &c->layers[l];
        void *xq = wants_q8(T, &L->wq, &L->wk, &L->wv) ? c->xq : NULL;
        CK(kn_cuda_rmsnorm_q8(kc, c->xb, c->x, L->attn_norm, T, dim, hp->norm_eps, xq));
        CK(kn_cuda_matmul(kc, &L->wq, c->xb, xq, T, c->q, false));
        CK(kn_cuda_matmul(kc, &L->wk, c->xb, xq, T, c->k, false));
        CK(kn_cuda_matmul(kc, &L->wv, c->xb, xq, T, c->v, false));
        if (L->bq)
            CK(kn_cuda_add_bias(kc, c->q, L->bq, T, q_dim));
        if (L->bk)
            CK(kn_cuda_add_bias(kc, c->k, L->bk, T, kv_dim));
        if (L->bv)
            CK(kn_cuda_add_bias(kc, c->v, L->bv, T, kv_dim));
        const size_t k_off = (size_t)l * 2 * bt * kv_dim, v_off = k_off + (size_t)bt * kv_dim;
        const kn_cuda_rope_kv rk = {
            .d_q = c->q,
            .d_k = c->k,
            .d_v = c->v,
            .d_cs = c->cs,
            .n_tokens = T,
            .n_head = hp->n_head,
            .n_kv_head = hp->n_head_kv,
            .head_dim = hp->head_dim,
            .rope_dim = hp->n_rot,
            .neox = hp->rope_neox,
            .d_slots = md + ML->slots,
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
            .d_table_off = md + ML->table_off,
            .d_tables = md + ML->tables,
            .d_pool = kv->pool,
            .block_elems = kv->block_elems,
            .k_off = k_off,
            .v_off = v_off,
            .block_tokens = bt,
            .n_head = hp->n_head,
            .n_kv_head = hp->n_head_kv,
            .head_dim = hp->head_dim,
            .scale = 1.0f / sqrtf((float)hp->head_dim),
        };
        CK(kn_cuda_attention(kc, &at));

        xq = NULL;
        if (wants_q8(T, &L->wo, NULL, NULL)) {
            CK(kn_cuda_quantize_q8(kc, c->att, T, q_dim, c->xq));
            xq = c->xq;
        }
        CK(kn_cuda_matmul(kc, &L->wo, c->att, xq, T, c->x, true)); /* residual */

        xq = wants_q8(T, &L->w_gate, &L->w_up, NULL) ? c->xq : NULL;
        CK(kn_cuda_rmsnorm_q8(kc, c->xb, c->x, L->ffn_norm, T, dim, hp->norm_eps, xq));
        CK(kn_cuda_matmul(kc, &L->w_gate, c->xb, xq, T, c->hb, false));
        CK(kn_cuda_matmul(kc, &L->w_up, c->xb, xq, T, c->hb2, false));
        xq = wants_q8(T, &L->w_down, NULL, NULL) ? c->xq : NULL;
        CK(kn_cuda_silu_mul_q8(kc, c->hb, c->hb2, T, hp->n_ff, xq));
        CK(kn_cuda_matmul(kc, &L->w_down, c->hb, xq, T, c->x, true)); /* residual */
    }
    if (n_out > 0) {
        CK(kn_cuda_gather_rows(kc, c->out_x, c->x, md + ML->out_rows, n_out, dim));
        CK(kn_cuda_rmsnorm(kc, c->out_x, c->out_x, c->output_norm, n_out, dim, hp->norm_eps));
        CK(kn_cuda_matmul(kc, &c->output, c->out_x, NULL, n_out, c->logits_d, false));
    }
    (void)n_seqs;
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
        int rc = kn_cuda_capture_begin(c->kc);
        if (rc == 0) {
            rc = enqueue_step(m, kv, T, n_seqs, n_out, ML);
            int rc2 = kn_cuda_capture_end(c->kc, &kg);
            if (rc || rc2) {
                kn_cuda_graph_free(kg);
                kg = NULL;
            }
        }
        if (!kg) {
            /* A device that cannot record (or a kernel that refuses to be
             * recorded) still computes: fall back to plain launches. */
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
        n_table += (size_t)e[i].seq->n_blocks;
    }
    kn_cuda_clear_error(c->kc);
    int rc = kn_cuda_bind_thread(c->kc);
    const meta_layout ML = layout(n_tokens, n_entries, n_out, n_table);
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

    meta_fill(c, kv, e, n_entries, &ML);
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
    cuda_model_free(m->dev_state);
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
