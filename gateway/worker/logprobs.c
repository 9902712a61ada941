/* Pending log-probabilities of one request (see logprobs.h). */
#include "gateway/worker/logprobs.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

int gw_lp_add(gw_lp_list *l, int index, int32_t token, const rt_token_logprobs *lp)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        gw_lp_item *v = l->cap < INT_MAX / 2 ? realloc(l->v, (size_t)cap * sizeof(*v)) : NULL;
        if (!v)
            return -ENOMEM;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = (gw_lp_item){index, token, *lp};
    return 0;
}

int gw_lp_ready(const gw_lp_list *l, int upto)
{
    int n = 0;
    while (n < l->n && l->v[n].index <= upto)
        n++;
    return n;
}

void gw_lp_drop(gw_lp_list *l, int n)
{
    memmove(l->v, l->v + n, (size_t)(l->n - n) * sizeof(*l->v));
    l->n -= n;
}

static rt_oai_token_lp token_lp(const rt_tokenizer *tok, int32_t id, float logprob)
{
    size_t len = 0;
    const char *text = rt_tokenizer_piece(tok, id, &len);
    return (rt_oai_token_lp){text ? text : "", text ? len : 0, logprob};
}

rt_oai_logprob *gw_lp_render(const gw_lp_list *l, int n, const rt_tokenizer *tok, bool *oom)
{
    *oom = false;
    if (n == 0)
        return NULL;
    rt_oai_logprob *out = malloc((size_t)n * sizeof(*out));
    if (!out) {
        *oom = true;
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        const gw_lp_item *it = &l->v[i];
        out[i].tok = token_lp(tok, it->token, it->lp.logprob);
        out[i].n_top = it->lp.n_top; /* rt_logprobs keeps it within RT_OAI_MAX_TOP_LOGPROBS */
        for (int j = 0; j < out[i].n_top; j++)
            out[i].top[j] = token_lp(tok, it->lp.top[j], it->lp.top_logprob[j]);
    }
    return out;
}

void gw_lp_free(gw_lp_list *l)
{
    free(l->v);
    *l = (gw_lp_list){0};
}
