/* The router of a mixture-of-experts layer, one token at a time: from its
 * n router logits, the k experts it uses (largest logit first; the lower
 * index first among equals) and their weights. Shared by the CPU forward
 * (runtime/moe.c) and the CUDA plugin's routing kernel (kernels/cuda), so
 * both choose the same experts by the same arithmetic: plain C that nvcc
 * compiles for the device too. */
#ifndef KN_MOE_ROUTE_H
#define KN_MOE_ROUTE_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#ifdef __CUDACC__
#define KN_ROUTE_HD __host__ __device__
#else
#define KN_ROUTE_HD
#endif

/* The k largest of n logits into pick, by selection (k and n are small). */
static inline KN_ROUTE_HD void kn_moe_top_k(const float *x, int n, int k, int32_t *pick)
{
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n; e++) {
            bool taken = false;
            for (int i = 0; i < j && !taken; i++)
                taken = pick[i] == e;
            if (!taken && (best < 0 || x[e] > x[best]))
                best = e;
        }
        pick[j] = best;
    }
}

/* softmax_topk: the softmax over the k chosen logits (gpt-oss); else the
 * softmax over all n, the chosen ones' shares renormalised to sum to 1
 * when norm_w. */
static inline KN_ROUTE_HD void kn_moe_route(const float *logits, int n, int k, bool softmax_topk, bool norm_w,
                                            int32_t *pick, float *w)
{
    kn_moe_top_k(logits, n, k, pick); /* softmax keeps the order */
    const float mx = logits[pick[0]];
    if (softmax_topk) {
        float sum = 0.0f;
        for (int j = 0; j < k; j++)
            sum += w[j] = expf(logits[pick[j]] - mx);
        for (int j = 0; j < k; j++)
            w[j] /= sum;
        return;
    }
    float sum = 0.0f;
    for (int e = 0; e < n; e++)
        sum += expf(logits[e] - mx);
    float chosen = 0.0f;
    for (int j = 0; j < k; j++)
        chosen += w[j] = expf(logits[pick[j]] - mx) / sum;
    if (norm_w)
        for (int j = 0; j < k; j++)
            w[j] /= chosen;
}

#endif
