/* The batched forward pass of a llama-family model: rt_model_forward
 * checks the batch, grows its sequences and hands the step to the model's
 * device (device.h); rt_cpu_forward is the CPU's. All new tokens of all
 * sequences in a batch go through each weight matrix together (one read of
 * the weights serves the whole batch), while attention runs per sequence
 * over its own paged KV cache. */
#include "runtime/device.h"
#include "runtime/model_internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void rt_act_dispose(rt_act *a)
{
    free(a->x);
    free(a->xb);
    free(a->q);
    free(a->k);
    free(a->v);
    free(a->att);
    free(a->hb);
    free(a->hb2);
    free(a->pos);
    free(a->y);
    free(a->moe_logits);
    free(a->moe_pick);
    free(a->moe_w);
    free(a->moe_rows);
    free(a->moe_x);
    free(a->moe_h);
    free(a->moe_h2);
    free(a->moe_y);
    free(a->moe_trace);
    free(a->out_x);
    free(a->out_logits);
    free(a->attn);
    memset(a, 0, sizeof(*a));
}

/* Scratch: what it held is not kept. Cache-line aligned, because the
 * threads of a matmul write neighbouring column chunks of each output row;
 * off the line they would share a line at every chunk edge (it cost a
 * 16-row gemm on two threads 5-9% with its weights from memory, 20% with
 * them in cache). */
int rt_grow_floats(float **p, size_t n)
{
    const size_t line = 64, bytes = (n * sizeof(float) + line - 1) / line * line;
    float *np = aligned_alloc(line, bytes);
    if (!np)
        return -ENOMEM;
    free(*p);
    *p = np;
    return 0;
}

/* Buffers only ever grow, so a steady stream of same-sized steps allocates
 * nothing. */
static int act_reserve(rt_model *m, int n_tokens, int n_out, int n_seqs)
{
    rt_act *a = &m->act;
    const rt_hparams *hp = &m->hp;
    size_t q_dim = (size_t)hp->n_head * hp->head_dim;
    size_t kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    if (n_tokens > a->cap) {
        size_t t = (size_t)n_tokens;
        int ffi = hp->n_ff > hp->n_ff_shexp ? hp->n_ff : hp->n_ff_shexp;
        size_t ff = (size_t)(ffi > hp->n_ff_exp ? ffi : hp->n_ff_exp);
        if (rt_grow_floats(&a->x, t * hp->n_embd) || rt_grow_floats(&a->xb, t * (size_t)hp->n_embd) ||
            rt_grow_floats(&a->y, t * (size_t)hp->n_embd) || rt_grow_floats(&a->q, t * q_dim) ||
            rt_grow_floats(&a->k, t * kv_dim) || rt_grow_floats(&a->v, t * kv_dim) ||
            rt_grow_floats(&a->att, t * q_dim) || rt_grow_floats(&a->hb, t * ff) || rt_grow_floats(&a->hb2, t * ff))
            return -ENOMEM;
        if (hp->n_expert > 0 && rt_moe_reserve(m, n_tokens))
            return -ENOMEM;
        int32_t *pos = realloc(a->pos, t * sizeof(int32_t));
        if (!pos)
            return -ENOMEM;
        a->pos = pos;
        a->cap = n_tokens;
    }
    if (n_out > a->n_out_cap) {
        if (rt_grow_floats(&a->out_x, (size_t)n_out * hp->n_embd) ||
            rt_grow_floats(&a->out_logits, (size_t)n_out * hp->n_vocab))
            return -ENOMEM;
        a->n_out_cap = n_out;
    }
    if (n_seqs > a->n_attn_cap) {
        kn_attn_seq *s = realloc(a->attn, (size_t)n_seqs * sizeof(*s));
        if (!s)
            return -ENOMEM;
        a->attn = s;
        a->n_attn_cap = n_seqs;
    }
    return 0;
}

void rt_add_rows_bias(float *x, const float *b, int n_rows, int n)
{
    if (!b)
        return;
    for (int r = 0; r < n_rows; r++)
        for (int i = 0; i < n; i++)
            x[(size_t)r * n + i] += b[i];
}

static void add_inplace(float *y, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] += x[i];
}

int rt_matmul(rt_model *m, const rt_weight *w, const float *x, int n_rows, float *y)
{
    return kn_matmul(m->kn, w->data, w->type, w->n_out, w->n_in, x, n_rows, y);
}

/* Products of one input with n weights (Q, K, V; gate, up): one kn_matmul_n
 * per type among them, so that the input is quantized once per type (a
 * Q4_K_M file has attn_v in Q6_K in some layers, attn_q and attn_k in Q4_K). */
int rt_matmul_shared(rt_model *m, const float *x, int n_rows, const rt_weight *const *w, float *const *y,
                     int n)
{
    bool done[KN_MM_MAX_OUTS] = {false};
    if (n > KN_MM_MAX_OUTS)
        return -EINVAL;
    for (int k = 0; k < n; k++) {
        if (done[k])
            continue;
        kn_mm_out outs[KN_MM_MAX_OUTS];
        int n_outs = 0;
        for (int i = k; i < n; i++) {
            if (!done[i] && w[i]->type == w[k]->type && w[i]->n_in == w[k]->n_in) {
                outs[n_outs++] = (kn_mm_out){w[i]->data, w[i]->n_out, y[i]};
                done[i] = true;
            }
        }
        int rc = kn_matmul_n(m->kn, w[k]->type, w[k]->n_in, x, n_rows, outs, n_outs);
        if (rc)
            return rc;
    }
    return 0;
}

static int validate(const rt_model *m, const rt_batch_entry *e, int n, int *n_tokens, int *n_out)
{
    *n_tokens = 0;
    *n_out = 0;
    for (int i = 0; i < n; i++) {
        if (!e[i].seq || e[i].n_tokens <= 0 || !e[i].tokens)
            return -EINVAL;
        for (int j = 0; j < e[i].n_tokens; j++)
            if (e[i].tokens[j] < 0 || e[i].tokens[j] >= m->hp.n_vocab)
                return -EINVAL;
        for (int k = 0; k < i; k++)
            if (e[k].seq == e[i].seq)
                return -EINVAL;
        if (e[i].n_tokens > INT32_MAX - *n_tokens)
            return -E2BIG;
        *n_tokens += e[i].n_tokens;
        *n_out += e[i].logits != NULL;
    }
    return 0;
}

/* The RoPE seq's rows turn by at layer L: LongRoPE's long factors for a
 * sequence past the original context, else the layer's own. */
static const rt_rope *rope_of(const rt_model *m, const rt_layer *L, const rt_seq *s)
{
    if (L->rope == RT_ROPE_MAIN && s->rope_long && m->rope[RT_ROPE_LONG].inv_freq)
        return &m->rope[RT_ROPE_LONG];
    return &m->rope[L->rope];
}

/* x's rotated dimensions (the first n_rot of each head) times mscale. */
static void scale_rotated(float *x, int n_rows, int n_heads, int head_dim, int n_rot, float mscale)
{
    for (size_t h = 0; h < (size_t)n_rows * n_heads; h++)
        for (int i = 0; i < n_rot; i++)
            x[h * head_dim + i] *= mscale;
}

/* RoPE of Q and K, entries that share a RoPE in one call. */
static void rope_qk(rt_model *m, const rt_layer *L, const rt_batch_entry *e, int n_entries)
{
    const rt_hparams *hp = &m->hp;
    rt_act *a = &m->act;
    if (L->rope == RT_ROPE_OFF)
        return;
    const size_t q_dim = (size_t)hp->n_head * hp->head_dim, kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    int row = 0;
    for (int i = 0; i < n_entries;) {
        const rt_rope *r = rope_of(m, L, e[i].seq);
        int rows = 0, j = i;
        for (; j < n_entries && rope_of(m, L, e[j].seq) == r; j++)
            rows += e[j].n_tokens;
        float *q = a->q + row * q_dim, *k = a->k + row * kv_dim;
        kn_rope(m->kn, q, rows, a->pos + row, hp->n_head, hp->head_dim, hp->n_rot, r->inv_freq, hp->rope_neox);
        kn_rope(m->kn, k, rows, a->pos + row, hp->n_head_kv, hp->head_dim, hp->n_rot, r->inv_freq, hp->rope_neox);
        if (r->mscale != 1.0f) {
            scale_rotated(q, rows, hp->n_head, hp->head_dim, hp->n_rot, r->mscale);
            scale_rotated(k, rows, hp->n_head_kv, hp->head_dim, hp->n_rot, r->mscale);
        }
        row += rows;
        i = j;
    }
}

/* The new K and V rows into each sequence's blocks of layer l, then
 * attention of the new queries over them: a->att. */
static int attend(rt_model *m, int l, rt_batch_entry *e, int n_entries)
{
    const rt_hparams *hp = &m->hp;
    const rt_layer *L = &m->layers[l];
    rt_act *a = &m->act;
    const int q_dim = hp->n_head * hp->head_dim, kv_dim = hp->n_head_kv * hp->head_dim;
    const kn_ops *ops = kn_ctx_ops(m->kn);
    int row = 0;
    for (int i = 0; i < n_entries; i++) {
        rt_seq *s = e[i].seq;
        const int bt = s->kv->block_tokens;
        const bool q8 = s->kv->type == KN_TYPE_Q8_0;
        const size_t rw = kn_kv_row_units(s->kv->type, hp->head_dim);
        int g;
        size_t k_off, v_off;
        rt_kv_layer_at(s->kv, l, &g, &k_off, &v_off);
        uint16_t **table = rt_seq_table(s, g);
        for (int j = 0; j < e[i].n_tokens; j++) {
            int p = s->len + j;
            for (int h = 0; h < hp->n_head_kv; h++) {
                uint16_t *at = table[p / bt] + ((size_t)h * bt + p % bt) * rw;
                size_t src = (size_t)(row + j) * kv_dim + (size_t)h * hp->head_dim;
                if (q8) {
                    ops->quantize_q8_0(a->k + src, at + k_off, hp->head_dim);
                    ops->quantize_q8_0(a->v + src, at + v_off, hp->head_dim);
                } else {
                    ops->to_f16(a->k + src, at + k_off, hp->head_dim);
                    ops->to_f16(a->v + src, at + v_off, hp->head_dim);
                }
            }
        }
        a->attn[i] = (kn_attn_seq){
            .q = a->q + (size_t)row * q_dim,
            .out = a->att + (size_t)row * q_dim,
            .n_q = e[i].n_tokens,
            .pos0 = s->len,
            .blocks = table,
            .k_off = k_off,
            .v_off = v_off,
            .block_tokens = bt,
            .kv_type = s->kv->type,
        };
        row += e[i].n_tokens;
    }
    const kn_attn_params p = {
        .n_head = hp->n_head,
        .n_kv_head = hp->n_head_kv,
        .head_dim = hp->head_dim,
        .scale = hp->attn_scale,
        .softcap = hp->attn_softcap,
        .sinks = L->sinks,
        .window = L->local ? hp->n_swa : 0,
    };
    return kn_attention_ex(m->kn, a->attn, n_entries, &p);
}

/* RMSNorm of Q's or K's rows (or heads), or of a block's output (post
 * norms), computed here rather than by the backend's rmsnorm: its vector
 * sum differs from the scalar one in the last bits, which before a matmul
 * only scale a row (its Q8_0 quantization absorbs that), but here change
 * scores, or the residual stream OLMo 2 multiplies without a norm, and
 * through some later quantization the logits; the fast and the reference
 * paths must agree. A pass over a few rows of floats a token. */
static void exact_rmsnorm(float *x, const float *g, int n_rows, int n, float eps)
{
    for (int r = 0; r < n_rows; r++) {
        float *v = x + (size_t)r * n;
        double ss = 0.0;
        for (int i = 0; i < n; i++)
            ss += (double)v[i] * v[i];
        const float scale = 1.0f / sqrtf((float)(ss / n) + eps);
        for (int i = 0; i < n; i++)
            v[i] = v[i] * scale * g[i];
    }
}

/* x += post_norm(out) * residual_scale: a block's output into the
 * residual stream. */
static void add_block_out(rt_model *m, const float *post_norm, float *out, int T)
{
    const rt_hparams *hp = &m->hp;
    const size_t n = (size_t)T * hp->n_embd;
    if (post_norm)
        exact_rmsnorm(out, post_norm, T, hp->n_embd, hp->norm_eps);
    if (hp->residual_scale != 1.0f)
        for (size_t i = 0; i < n; i++)
            out[i] *= hp->residual_scale;
    add_inplace(m->act.x, out, n);
}

static int attention_block(rt_model *m, int l, rt_batch_entry *e, int n_entries, int T)
{
    const rt_hparams *hp = &m->hp;
    const rt_layer *L = &m->layers[l];
    rt_act *a = &m->act;
    const int q_dim = hp->n_head * hp->head_dim, kv_dim = hp->n_head_kv * hp->head_dim;
    int rc;
    const float *in = a->x; /* OLMo 2 projects the stream itself */
    if (L->attn_norm) {
        kn_rmsnorm(m->kn, a->xb, a->x, L->attn_norm, T, hp->n_embd, hp->norm_eps);
        in = a->xb;
    }
    const rt_weight *qkv[] = {&L->wq, &L->wk, &L->wv};
    float *const qkv_out[] = {a->q, a->k, a->v};
    if ((rc = rt_matmul_shared(m, in, T, qkv, qkv_out, 3)))
        return rc;
    rt_add_rows_bias(a->q, L->bq, T, q_dim);
    rt_add_rows_bias(a->k, L->bk, T, kv_dim);
    rt_add_rows_bias(a->v, L->bv, T, kv_dim);
    if (L->q_norm) { /* per head, or over the whole row */
        const bool head = m->arch->qk_norm == RT_QK_NORM_HEAD;
        exact_rmsnorm(a->q, L->q_norm, head ? T * hp->n_head : T, head ? hp->head_dim : q_dim, hp->norm_eps);
        exact_rmsnorm(a->k, L->k_norm, head ? T * hp->n_head_kv : T, head ? hp->head_dim : kv_dim, hp->norm_eps);
    }
    rope_qk(m, L, e, n_entries);
    if ((rc = attend(m, l, e, n_entries)) || (rc = rt_matmul(m, &L->wo, a->att, T, a->y)))
        return rc;
    rt_add_rows_bias(a->y, L->bo, T, hp->n_embd);
    add_block_out(m, L->attn_post_norm, a->y, T);
    return 0;
}

/* gate = act(gate) * up, the family's activation. */
void rt_apply_act(rt_model *m, float *gate, const float *up, int T, int n)
{
    switch (m->arch->act) {
    case RT_ACT_GELU: kn_gelu_mul(m->kn, gate, up, T, n); break;
    case RT_ACT_SWIGLU_OAI: kn_swiglu_oai(m->kn, gate, up, T, n, 1.702f, 7.0f); break;
    default: kn_silu_mul(m->kn, gate, up, T, n); break;
    }
}

int rt_dense_ffn(rt_model *m, const rt_weight *w_gate, const rt_weight *w_up, const rt_weight *w_down,
                 const float *b_gate, const float *b_up, const float *b_down, const float *x, int T, float *y)
{
    rt_act *a = &m->act;
    const rt_weight *gate_up[] = {w_gate, w_up};
    float *const gate_up_out[] = {a->hb, a->hb2};
    int rc, n = w_gate->n_out;
    if ((rc = rt_matmul_shared(m, x, T, gate_up, gate_up_out, 2)))
        return rc;
    rt_add_rows_bias(a->hb, b_gate, T, n);
    rt_add_rows_bias(a->hb2, b_up, T, n);
    rt_apply_act(m, a->hb, a->hb2, T, n);
    if ((rc = rt_matmul(m, w_down, a->hb, T, y)))
        return rc;
    rt_add_rows_bias(y, b_down, T, w_down->n_out);
    return 0;
}

static int ffn_block(rt_model *m, int l, int T)
{
    const rt_hparams *hp = &m->hp;
    const rt_layer *L = &m->layers[l];
    rt_act *a = &m->act;
    int rc;
    const float *in = a->x;
    if (L->ffn_norm) {
        kn_rmsnorm(m->kn, a->xb, a->x, L->ffn_norm, T, hp->n_embd, hp->norm_eps);
        in = a->xb;
    }
    if (L->moe)
        rc = rt_moe_ffn(m, l, in, T, a->y);
    else
        rc = rt_dense_ffn(m, &L->w_gate, &L->w_up, &L->w_down, L->b_gate, L->b_up, L->b_down, in, T, a->y);
    if (rc)
        return rc;
    add_block_out(m, L->ffn_post_norm, a->y, T);
    return 0;
}

/* Logits of the rows that want them: the final norm, the output head, and
 * the family's bias, multiplier and soft-cap. */
static int output_logits(rt_model *m, rt_batch_entry *e, int n_entries, int n_out)
{
    const rt_hparams *hp = &m->hp;
    rt_act *a = &m->act;
    const int dim = hp->n_embd, V = hp->n_vocab;
    int o = 0, t = 0, rc;
    for (int i = 0; i < n_entries; i++) {
        t += e[i].n_tokens;
        if (e[i].logits)
            memcpy(a->out_x + (size_t)o++ * dim, a->x + (size_t)(t - 1) * dim, (size_t)dim * sizeof(float));
    }
    kn_rmsnorm(m->kn, a->out_x, a->out_x, m->output_norm, n_out, dim, hp->norm_eps);
    if ((rc = rt_matmul(m, &m->output, a->out_x, n_out, a->out_logits)))
        return rc;
    rt_add_rows_bias(a->out_logits, m->output_bias, n_out, V);
    const float cap = hp->final_softcap, inv_scale = 1.0f / hp->logit_scale;
    if (cap > 0.0f || hp->logit_scale != 1.0f)
        for (size_t i = 0; i < (size_t)n_out * V; i++) {
            float z = a->out_logits[i] * inv_scale;
            a->out_logits[i] = cap > 0.0f ? cap * tanhf(z / cap) : z;
        }
    o = 0;
    for (int i = 0; i < n_entries; i++)
        if (e[i].logits)
            memcpy(e[i].logits, a->out_logits + (size_t)o++ * V, (size_t)V * sizeof(float));
    return 0;
}

int rt_cpu_forward(rt_model *m, rt_batch_entry *e, int n_entries, int T, int n_out)
{
    const rt_hparams *hp = &m->hp;
    int rc;
    if ((rc = act_reserve(m, T, n_out, n_entries)))
        return rc;
    rt_act *a = &m->act;
    int dim = hp->n_embd;
    size_t emb_row = kn_row_bytes(m->tok_embd.type, dim);
    int t = 0;
    for (int i = 0; i < n_entries; i++) {
        for (int j = 0; j < e[i].n_tokens; j++, t++) {
            a->pos[t] = e[i].seq->len + j;
            kn_dequantize_row(m->tok_embd.type, (const char *)m->tok_embd.data + (size_t)e[i].tokens[j] * emb_row,
                              a->x + (size_t)t * dim, dim);
        }
    }
    if (hp->embd_scale != 1.0f)
        for (size_t i = 0; i < (size_t)T * dim; i++)
            a->x[i] *= hp->embd_scale;

    for (int l = 0; l < hp->n_layer; l++)
        if ((rc = attention_block(m, l, e, n_entries, T)) || (rc = ffn_block(m, l, T)))
            return rc;
    return n_out > 0 ? output_logits(m, e, n_entries, n_out) : 0;
}

int rt_model_forward(rt_model *m, rt_batch_entry *e, int n_entries)
{
    int T, n_out, rc;
    if (n_entries <= 0)
        return -EINVAL;
    if ((rc = validate(m, e, n_entries, &T, &n_out)))
        return rc;
    for (int i = 0; i < n_entries; i++) {
        if ((rc = rt_seq_grow(e[i].seq, e[i].n_tokens))) {
            while (i-- > 0)
                rt_seq_shrink(e[i].seq);
            return rc;
        }
    }
    if ((rc = m->dev->forward(m, e, n_entries, T, n_out))) {
        for (int i = 0; i < n_entries; i++)
            rt_seq_shrink(e[i].seq);
        return rc;
    }
    for (int i = 0; i < n_entries; i++)
        e[i].seq->len += e[i].n_tokens;
    return 0;
}
