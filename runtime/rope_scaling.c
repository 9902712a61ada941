/* RoPE scalings as llama.cpp applies them (ggml's rope_yarn and
 * llama_context's attention factor), reduced to what kn_rope takes: one
 * inverse frequency per rotated pair, and a magnitude the layer multiplies
 * Q's and K's rotated dimensions by. ggml's YaRN angle for pair i is
 *     theta = p * f_i * (s * (1 - r_i) + r_i),    f_i = base^(-2i/n_rot) / factors[i]
 * with s = 1 / factor and r_i its ramp between the correction dimensions:
 * linear in the position p, so a per-pair frequency carries it exactly. */
#include "runtime/model_internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

/* ggml_rope_yarn_corr_dim: the pair index whose wavelength fits n_rot
 * rotations into the original context. */
static float corr_dim(int n_rot, int n_ctx_orig, float rotations, float base)
{
    return (float)n_rot * logf((float)n_ctx_orig / (rotations * 2.0f * (float)M_PI)) / (2.0f * logf(base));
}

/* The magnitude YaRN gives cos and sin: llama_context's attention factor
 * times ggml's in-kernel 1 + 0.1 ln(factor) (which that factor cancels
 * when the file gives a log multiplier), times rope.scaling.attn_factor. */
static float yarn_mscale(const rt_hparams *hp, float factor, bool no_mscale)
{
    if (no_mscale) /* Mistral 3 passes 1 / (1 + 0.1 ln factor) to cancel it */
        return 1.0f;
    if (hp->yarn_log_mul != 0.0f && factor > 1.0f)
        return (0.1f * logf(factor) + 1.0f) / (0.1f * hp->yarn_log_mul * logf(factor) + 1.0f) *
               hp->rope_attn_factor;
    return (1.0f + 0.1f * logf(factor)) * hp->rope_attn_factor;
}

int rt_rope_build(rt_rope *r, const rt_hparams *hp, float base, rt_rope_scaling scaling, float factor,
                  const float *factors, bool yarn_no_mscale)
{
    const int half = hp->n_rot / 2;
    double *inv = malloc((size_t)half * sizeof(double));
    if (!inv)
        return -ENOMEM;
    float lo = 0.0f, hi = 0.0f;
    if (scaling == RT_ROPE_SCALING_YARN) {
        lo = floorf(corr_dim(hp->n_rot, hp->n_ctx_orig, hp->yarn_beta_fast, base));
        hi = ceilf(corr_dim(hp->n_rot, hp->n_ctx_orig, hp->yarn_beta_slow, base));
        lo = lo > 0.0f ? lo : 0.0f;
        hi = hi < (float)(hp->n_rot - 1) ? hi : (float)(hp->n_rot - 1);
    }
    for (int i = 0; i < half; i++) {
        double f = pow((double)base, -2.0 * i / hp->n_rot);
        if (factors)
            f /= factors[i];
        if (scaling == RT_ROPE_SCALING_LINEAR && factor != 1.0f) {
            f /= factor;
        } else if (scaling == RT_ROPE_SCALING_YARN) {
            /* rope_yarn_ramp, ext_factor 1 */
            const float y = ((float)i - lo) / fmaxf(0.001f, hi - lo);
            const float ramp = 1.0f - fminf(1.0f, fmaxf(0.0f, y));
            f *= (double)(1.0f / factor) * (1.0 - ramp) + ramp;
        }
        inv[i] = f;
    }
    r->inv_freq = inv;
    r->mscale = scaling == RT_ROPE_SCALING_YARN ? yarn_mscale(hp, factor, yarn_no_mscale) : hp->rope_attn_factor;
    return 0;
}
