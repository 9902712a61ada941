/* Mixture-of-experts FFN layers on the CPU: the router's choice of
 * n_expert_used experts per token and their weights (softmax over all, then
 * the top k, renormalised where the family says; or gpt-oss's softmax over
 * the top k's logits), then, expert by expert, the rows of the batch that
 * chose it gathered into one matmul, so that each expert's weights are read
 * once per step whatever the number of tokens, and an expert no token chose
 * is not read at all (decode reads k of n). The weighted outputs are summed
 * per token in expert order: a token's result does not depend on its
 * batch. A shared expert, where a file has one, adds every token's dense
 * FFN. */
#include "kernels/kn_moe_route.h"
#include "runtime/model_internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int grow_ints(int32_t **p, size_t n)
{
    int32_t *np = realloc(*p, (n ? n : 1) * sizeof(int32_t));
    if (!np)
        return -ENOMEM;
    *p = np;
    return 0;
}

int rt_moe_reserve(rt_model *m, int T)
{
    const rt_hparams *hp = &m->hp;
    rt_act *a = &m->act;
    const size_t t = (size_t)T, k = (size_t)hp->n_expert_used, ff = (size_t)hp->n_ff_exp;
    if (rt_grow_floats(&a->moe_logits, t * hp->n_expert) || rt_grow_floats(&a->moe_w, t * k) ||
        rt_grow_floats(&a->moe_x, t * hp->n_embd) || rt_grow_floats(&a->moe_y, t * hp->n_embd) ||
        rt_grow_floats(&a->moe_h, t * ff) || rt_grow_floats(&a->moe_h2, t * ff) || grow_ints(&a->moe_pick, t * k) ||
        grow_ints(&a->moe_rows, t * k) || grow_ints(&a->moe_trace, (size_t)hp->n_layer * t * k))
        return -ENOMEM;
    return 0;
}

/* One token's experts and weights from its router logits. */
static void route(const rt_model *m, const float *logits, int32_t *pick, float *w)
{
    kn_moe_route(logits, m->hp.n_expert, m->hp.n_expert_used, m->arch->gating == RT_GATING_SOFTMAX_TOPK,
                 (m->arch->flags & RT_ARCH_MOE_NORM_W) != 0, pick, w);
}

int rt_moe_ffn(rt_model *m, int l, const float *x, int T, float *y)
{
    const rt_hparams *hp = &m->hp;
    const rt_experts *ex = m->layers[l].moe;
    rt_act *a = &m->act;
    const int d = hp->n_embd, k = hp->n_expert_used, ne = hp->n_expert, ff = hp->n_ff_exp;
    int rc;
    if ((rc = rt_matmul(m, &ex->router, x, T, a->moe_logits)))
        return rc;
    rt_add_rows_bias(a->moe_logits, ex->b_router, T, ne);
    for (int t = 0; t < T; t++)
        route(m, a->moe_logits + (size_t)t * ne, a->moe_pick + (size_t)t * k, a->moe_w + (size_t)t * k);
    memcpy(a->moe_trace + (size_t)l * a->cap * k, a->moe_pick, (size_t)T * k * sizeof(int32_t));

    memset(y, 0, (size_t)T * d * sizeof(float));
    if (ex->sh_up.data && (rc = rt_dense_ffn(m, &ex->sh_gate, &ex->sh_up, &ex->sh_down, NULL, NULL, NULL, x, T, y)))
        return rc;
    /* Each expert's (token, slot) pairs, in token order. */
    for (int e = 0; e < ne; e++) {
        int n = 0;
        for (int i = 0; i < T * k; i++)
            if (a->moe_pick[i] == e)
                a->moe_rows[n++] = i;
        if (!n)
            continue;
        for (int r = 0; r < n; r++)
            memcpy(a->moe_x + (size_t)r * d, x + (size_t)(a->moe_rows[r] / k) * d, (size_t)d * sizeof(float));
        const rt_weight *gate_up[] = {&ex->gate[e], &ex->up[e]};
        float *const outs[] = {a->moe_h, a->moe_h2};
        if ((rc = rt_matmul_shared(m, a->moe_x, n, gate_up, outs, 2)))
            return rc;
        if (ex->b_gate)
            rt_add_rows_bias(a->moe_h, ex->b_gate + (size_t)e * ff, n, ff);
        if (ex->b_up)
            rt_add_rows_bias(a->moe_h2, ex->b_up + (size_t)e * ff, n, ff);
        rt_apply_act(m, a->moe_h, a->moe_h2, n, ff);
        if ((rc = rt_matmul(m, &ex->down[e], a->moe_h, n, a->moe_y)))
            return rc;
        if (ex->b_down)
            rt_add_rows_bias(a->moe_y, ex->b_down + (size_t)e * d, n, d);
        for (int r = 0; r < n; r++) {
            const float w = a->moe_w[a->moe_rows[r]];
            float *yt = y + (size_t)(a->moe_rows[r] / k) * d;
            const float *src = a->moe_y + (size_t)r * d;
            for (int i = 0; i < d; i++)
                yt[i] += w * src[i];
        }
    }
    return 0;
}

const int32_t *rt_model_expert_choices(const rt_model *m, int layer)
{
    if (layer < 0 || layer >= m->hp.n_layer || !m->layers[layer].moe || !m->act.moe_trace)
        return NULL;
    return m->act.moe_trace + (size_t)layer * m->act.cap * m->hp.n_expert_used;
}
