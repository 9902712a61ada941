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
static int grow_floats(float **p, size_t n)
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
        if (grow_floats(&a->x, t * hp->n_embd) || grow_floats(&a->xb, t * (size_t)hp->n_embd) ||
            grow_floats(&a->q, t * q_dim) || grow_floats(&a->k, t * kv_dim) || grow_floats(&a->v, t * kv_dim) ||
            grow_floats(&a->att, t * q_dim) || grow_floats(&a->hb, t * (size_t)hp->n_ff) ||
            grow_floats(&a->hb2, t * (size_t)hp->n_ff))
            return -ENOMEM;
        int32_t *pos = realloc(a->pos, t * sizeof(int32_t));
        if (!pos)
            return -ENOMEM;
        a->pos = pos;
        a->cap = n_tokens;
    }
    if (n_out > a->n_out_cap) {
        if (grow_floats(&a->out_x, (size_t)n_out * hp->n_embd) ||
            grow_floats(&a->out_logits, (size_t)n_out * hp->n_vocab))
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

static void add_rows_bias(float *x, const float *b, int n_rows, int n)
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

static int matmul(rt_model *m, const rt_weight *w, const float *x, int n_rows, float *y)
{
    return kn_matmul(m->kn, w->data, w->type, w->n_out, w->n_in, x, n_rows, y);
}

/* Products of one input with n weights (Q, K, V; gate, up): one kn_matmul_n
 * per type among them, so that the input is quantized once per type (a
 * Q4_K_M file has attn_v in Q6_K in some layers, attn_q and attn_k in Q4_K). */
static int matmul_shared(rt_model *m, const float *x, int n_rows, const rt_weight *const *w, float *const *y,
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

static void layer_forward(rt_model *m, int l, rt_batch_entry *e, int n_entries, int T, int *rc)
{
    const rt_hparams *hp = &m->hp;
    const rt_layer *L = &m->layers[l];
    rt_act *a = &m->act;
    int dim = hp->n_embd;
    int q_dim = hp->n_head * hp->head_dim;
    int kv_dim = hp->n_head_kv * hp->head_dim;

    kn_rmsnorm(m->kn, a->xb, a->x, L->attn_norm, T, dim, hp->norm_eps);
    const rt_weight *qkv[] = {&L->wq, &L->wk, &L->wv};
    float *const qkv_out[] = {a->q, a->k, a->v};
    if ((*rc = matmul_shared(m, a->xb, T, qkv, qkv_out, 3)))
        return;
    add_rows_bias(a->q, L->bq, T, q_dim);
    add_rows_bias(a->k, L->bk, T, kv_dim);
    add_rows_bias(a->v, L->bv, T, kv_dim);
    kn_rope(m->kn, a->q, T, a->pos, hp->n_head, hp->head_dim, hp->n_rot, m->rope_inv_freq, hp->rope_neox);
    kn_rope(m->kn, a->k, T, a->pos, hp->n_head_kv, hp->head_dim, hp->n_rot, m->rope_inv_freq, hp->rope_neox);

    /* Store the new K and V rows in each sequence's blocks, then attend. */
    const kn_ops *ops = kn_ctx_ops(m->kn);
    int row = 0;
    for (int i = 0; i < n_entries; i++) {
        rt_seq *s = e[i].seq;
        const int bt = s->kv->block_tokens;
        const bool q8 = s->kv->type == KN_TYPE_Q8_0;
        const size_t rw = kn_kv_row_units(s->kv->type, hp->head_dim);
        const size_t k_off = (size_t)l * 2 * bt * hp->n_head_kv * rw;
        const size_t v_off = k_off + (size_t)bt * hp->n_head_kv * rw;
        for (int j = 0; j < e[i].n_tokens; j++) {
            int p = s->len + j;
            for (int g = 0; g < hp->n_head_kv; g++) {
                uint16_t *at = s->blocks[p / bt] + ((size_t)g * bt + p % bt) * rw;
                size_t src = (size_t)(row + j) * kv_dim + (size_t)g * hp->head_dim;
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
            .blocks = s->blocks,
            .k_off = k_off,
            .v_off = v_off,
            .block_tokens = bt,
            .kv_type = s->kv->type,
        };
        row += e[i].n_tokens;
    }
    if ((*rc = kn_attention(m->kn, a->attn, n_entries, hp->n_head, hp->n_head_kv, hp->head_dim,
                            1.0f / sqrtf((float)hp->head_dim))))
        return;
    if ((*rc = matmul(m, &L->wo, a->att, T, a->xb)))
        return;
    add_inplace(a->x, a->xb, (size_t)T * dim);

    kn_rmsnorm(m->kn, a->xb, a->x, L->ffn_norm, T, dim, hp->norm_eps);
    const rt_weight *gate_up[] = {&L->w_gate, &L->w_up};
    float *const gate_up_out[] = {a->hb, a->hb2};
    if ((*rc = matmul_shared(m, a->xb, T, gate_up, gate_up_out, 2)))
        return;
    kn_silu_mul(m->kn, a->hb, a->hb2, T, hp->n_ff);
    if ((*rc = matmul(m, &L->w_down, a->hb, T, a->xb)))
        return;
    add_inplace(a->x, a->xb, (size_t)T * dim);
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

    for (int l = 0; l < hp->n_layer; l++) {
        layer_forward(m, l, e, n_entries, T, &rc);
        if (rc)
            return rc;
    }

    if (n_out > 0) {
        int o = 0;
        t = 0;
        for (int i = 0; i < n_entries; i++) {
            t += e[i].n_tokens;
            if (e[i].logits)
                memcpy(a->out_x + (size_t)o++ * dim, a->x + (size_t)(t - 1) * dim, (size_t)dim * sizeof(float));
        }
        kn_rmsnorm(m->kn, a->out_x, a->out_x, m->output_norm, n_out, dim, hp->norm_eps);
        if ((rc = matmul(m, &m->output, a->out_x, n_out, a->out_logits)))
            return rc;
        o = 0;
        for (int i = 0; i < n_entries; i++)
            if (e[i].logits)
                memcpy(e[i].logits, a->out_logits + (size_t)o++ * hp->n_vocab, (size_t)hp->n_vocab * sizeof(float));
    }
    return 0;
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
