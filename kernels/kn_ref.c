/* kernels: the scalar reference backend. Plain loops, written for clarity
 * rather than speed: every faster backend is tested against this table. The
 * quantized dots follow ggml's ggml_vec_dot_q8_0_q8_0 and
 * ggml_vec_dot_q4_0_q8_0 (integer sum per block, then one float multiply by
 * both block scales), so fast paths that do the same integer work agree with
 * it up to the order of the float additions. */
#include "kernels/kn.h"
#include "kernels/quant_blocks.h"

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

static void ref_quantize_q8_0(const float *x, void *y, int n)
{
    kn_quantize_row(KN_TYPE_Q8_0, x, y, n);
}

/* The float dots accumulate in double: the oracle should be more accurate
 * than what it checks, so test tolerances measure the fast path alone. */
static void ref_dot_f32(const void *vw, const void *x, size_t x_stride, int nr, int n, float *out)
{
    const float *w = vw;
    for (int r = 0; r < nr; r++) {
        const float *xr = (const float *)((const char *)x + (size_t)r * x_stride);
        double s = 0.0;
        for (int i = 0; i < n; i++)
            s += (double)w[i] * (double)xr[i];
        out[r] = (float)s;
    }
}

static void ref_dot_f16(const void *vw, const void *x, size_t x_stride, int nr, int n, float *out)
{
    const uint16_t *w = vw;
    for (int r = 0; r < nr; r++) {
        const float *xr = (const float *)((const char *)x + (size_t)r * x_stride);
        double s = 0.0;
        for (int i = 0; i < n; i++)
            s += (double)kn_fp16_to_fp32(w[i]) * (double)xr[i];
        out[r] = (float)s;
    }
}

static void ref_dot_q8_0(const void *w, const void *xq, size_t xq_stride, int nr, int n, float *out)
{
    const kn_block_q8_0 *wb = w;
    const int nb = n / KN_QK8_0;
    for (int r = 0; r < nr; r++) {
        const kn_block_q8_0 *xb = (const kn_block_q8_0 *)((const char *)xq + (size_t)r * xq_stride);
        float sumf = 0.0f;
        for (int ib = 0; ib < nb; ib++) {
            int sumi = 0;
            for (int j = 0; j < KN_QK8_0; j++)
                sumi += wb[ib].qs[j] * xb[ib].qs[j];
            sumf += (float)sumi * (kn_fp16_to_fp32(wb[ib].d) * kn_fp16_to_fp32(xb[ib].d));
        }
        out[r] = sumf;
    }
}

static void ref_dot_q4_0(const void *w, const void *xq, size_t xq_stride, int nr, int n, float *out)
{
    const kn_block_q4_0 *wb = w;
    const int nb = n / KN_QK4_0;
    for (int r = 0; r < nr; r++) {
        const kn_block_q8_0 *xb = (const kn_block_q8_0 *)((const char *)xq + (size_t)r * xq_stride);
        float sumf = 0.0f;
        for (int ib = 0; ib < nb; ib++) {
            int sumi = 0;
            for (int j = 0; j < KN_QK4_0 / 2; j++) {
                const int v0 = (wb[ib].qs[j] & 0x0f) - 8;
                const int v1 = (wb[ib].qs[j] >> 4) - 8;
                sumi += v0 * xb[ib].qs[j] + v1 * xb[ib].qs[j + KN_QK4_0 / 2];
            }
            sumf += (float)sumi * (kn_fp16_to_fp32(wb[ib].d) * kn_fp16_to_fp32(xb[ib].d));
        }
        out[r] = sumf;
    }
}

static void ref_gemm_q8_0(const void *w, size_t w_stride, int n_w, const void *xq, size_t xq_stride, int nr,
                          int n, float *y, size_t y_stride)
{
    for (int r = 0; r < nr; r++)
        for (int o = 0; o < n_w; o++)
            ref_dot_q8_0((const char *)w + (size_t)o * w_stride, (const char *)xq + (size_t)r * xq_stride, 0,
                         1, n, &y[(size_t)r * y_stride + o]);
}

static void ref_gemm_q4_0(const void *w, size_t w_stride, int n_w, const void *xq, size_t xq_stride, int nr,
                          int n, float *y, size_t y_stride)
{
    for (int r = 0; r < nr; r++)
        for (int o = 0; o < n_w; o++)
            ref_dot_q4_0((const char *)w + (size_t)o * w_stride, (const char *)xq + (size_t)r * xq_stride, 0,
                         1, n, &y[(size_t)r * y_stride + o]);
}

/* ---- the other 32-element types, against Q8_0 activations ------------------
 * A weight block as the integers its dot multiplies (Q5_0's q - 16,
 * IQ4_NL's levels, Q4_1's and Q5_1's q as they are) with its scale d and
 * min m (0 for the types without one). Per block: the exact integer dot
 * sumi, the activation block's exact quant sum xs, then
 *   sumf += (float)sumi * (d * dx) + (float)xs * (m * dx)
 * each product rounded to float, then their sum, then the running sum. */
static void legacy_unpack(kn_type t, const void *w, int ib, int8_t q[32], float *d, float *m)
{
    *m = 0.0f;
    switch (t) {
    case KN_TYPE_Q4_1: {
        const kn_block_q4_1 *b = (const kn_block_q4_1 *)w + ib;
        for (int j = 0; j < 16; j++) {
            q[j] = (int8_t)(b->qs[j] & 0xf);
            q[j + 16] = (int8_t)(b->qs[j] >> 4);
        }
        *d = kn_fp16_to_fp32(b->d);
        *m = kn_fp16_to_fp32(b->m);
        return;
    }
    case KN_TYPE_Q5_0:
    case KN_TYPE_Q5_1: {
        const bool q51 = t == KN_TYPE_Q5_1;
        const kn_block_q5_0 *b0 = (const kn_block_q5_0 *)w + ib;
        const kn_block_q5_1 *b1 = (const kn_block_q5_1 *)w + ib;
        const uint8_t *qs = q51 ? b1->qs : b0->qs, *qh = q51 ? b1->qh : b0->qh;
        const uint32_t h = qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
        for (int j = 0; j < 32; j++) {
            const int lo = j < 16 ? qs[j] & 0xf : qs[j - 16] >> 4;
            q[j] = (int8_t)((lo | (int)((h >> j) & 1) << 4) - (q51 ? 0 : 16));
        }
        *d = kn_fp16_to_fp32(q51 ? b1->d : b0->d);
        if (q51)
            *m = kn_fp16_to_fp32(b1->m);
        return;
    }
    case KN_TYPE_MXFP4: {
        /* ggml's vec_dot_mxfp4_q8_0: d = 2^(e-128) * dx times the integer
         * dot; the min term below adds an exact 0 */
        const kn_block_mxfp4 *b = (const kn_block_mxfp4 *)w + ib;
        for (int j = 0; j < 16; j++) {
            q[j] = kn_mxfp4_values[b->qs[j] & 0xf];
            q[j + 16] = kn_mxfp4_values[b->qs[j] >> 4];
        }
        *d = kn_e8m0_half(b->e);
        return;
    }
    default: { /* IQ4_NL */
        const kn_block_iq4_nl *b = (const kn_block_iq4_nl *)w + ib;
        for (int j = 0; j < 16; j++) {
            q[j] = kn_iq4nl_values[b->qs[j] & 0xf];
            q[j + 16] = kn_iq4nl_values[b->qs[j] >> 4];
        }
        *d = kn_fp16_to_fp32(b->d);
        return;
    }
    }
}

static void ref_dot_legacy(kn_type t, const void *w, const void *xq, size_t xq_stride, int nr, int n,
                           float *out)
{
    for (int r = 0; r < nr; r++) {
        const kn_block_q8_0 *xb = (const kn_block_q8_0 *)((const char *)xq + (size_t)r * xq_stride);
        float sumf = 0.0f;
        for (int ib = 0; ib < n / 32; ib++) {
            int8_t q[32];
            float d, m;
            legacy_unpack(t, w, ib, q, &d, &m);
            int sumi = 0, xs = 0;
            for (int j = 0; j < 32; j++) {
                sumi += q[j] * xb[ib].qs[j];
                xs += xb[ib].qs[j];
            }
            const float dx = kn_fp16_to_fp32(xb[ib].d);
            sumf += (float)sumi * (d * dx) + (float)xs * (m * dx);
        }
        out[r] = sumf;
    }
}

/* ---- the K-quants and IQ4_XS, against Q8_K activations ---------------------
 * A super-block as the integers its dot multiplies (Q3_K's q - 4 * !h,
 * Q6_K's q - 32, IQ4_XS's levels, the others' q as they are), the integer
 * scale of each group of 16 (Q3_K's and IQ4_XS's less 32; a group of 32's
 * twice), the integer min of each (0 without mins), and d and dmin. Per
 * super-block: the exact integers
 *   isum = sum_g sc_g * sum_{i in g} q_i x_i,   msum = sum_g m_g * bsum_g
 * then sumf += (float)isum * (d * dx) - (float)msum * (dmin * dx), each
 * product rounded to float, then their difference, then the running sum. */
typedef struct ksuper {
    int8_t q[KN_QK_K];
    int16_t sc[16], mn[16];
    float d, dmin;
} ksuper;

static void ksuper_unpack(kn_type t, const void *w, int ib, ksuper *k)
{
    memset(k->mn, 0, sizeof(k->mn));
    k->dmin = 0.0f;
    switch (t) {
    case KN_TYPE_Q2_K: {
        const kn_block_q2_K *b = (const kn_block_q2_K *)w + ib;
        for (int e = 0; e < KN_QK_K; e++)
            k->q[e] = (int8_t)((b->qs[e / 128 * 32 + e % 32] >> (2 * (e % 128 / 32))) & 3);
        for (int g = 0; g < 16; g++) {
            k->sc[g] = b->scales[g] & 0xf;
            k->mn[g] = b->scales[g] >> 4;
        }
        k->d = kn_fp16_to_fp32(b->d);
        k->dmin = kn_fp16_to_fp32(b->dmin);
        return;
    }
    case KN_TYPE_Q3_K: {
        const kn_block_q3_K *b = (const kn_block_q3_K *)w + ib;
        for (int e = 0; e < KN_QK_K; e++) {
            const int lo = (b->qs[e / 128 * 32 + e % 32] >> (2 * (e % 128 / 32))) & 3;
            k->q[e] = (int8_t)(lo - ((b->hmask[e % 32] >> (e / 32)) & 1 ? 0 : 4));
        }
        for (int g = 0; g < 16; g++)
            k->sc[g] = (int16_t)(kn_q3k_scale(g, b->scales) - 32);
        k->d = kn_fp16_to_fp32(b->d);
        return;
    }
    case KN_TYPE_Q4_K:
    case KN_TYPE_Q5_K: {
        const bool q5 = t == KN_TYPE_Q5_K;
        const kn_block_q4_K *b4 = (const kn_block_q4_K *)w + ib;
        const kn_block_q5_K *b5 = (const kn_block_q5_K *)w + ib;
        const uint8_t *qs = q5 ? b5->qs : b4->qs, *scales = q5 ? b5->scales : b4->scales;
        for (int e = 0; e < KN_QK_K; e++) {
            const int j = e / 32, byte = qs[32 * (j / 2) + e % 32];
            const int lo = j % 2 ? byte >> 4 : byte & 0xf;
            k->q[e] = (int8_t)(lo | (q5 ? ((b5->qh[e % 32] >> j) & 1) << 4 : 0));
        }
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            kn_k4_scale_min(j, scales, &sc, &m);
            k->sc[2 * j] = k->sc[2 * j + 1] = sc;
            k->mn[2 * j] = k->mn[2 * j + 1] = m;
        }
        k->d = kn_fp16_to_fp32(q5 ? b5->d : b4->d);
        k->dmin = kn_fp16_to_fp32(q5 ? b5->dmin : b4->dmin);
        return;
    }
    case KN_TYPE_Q6_K: {
        const kn_block_q6_K *b = (const kn_block_q6_K *)w + ib;
        for (int e = 0; e < KN_QK_K; e++) {
            const int h = e / 128, c = e % 128 / 32, l = e % 32;
            const uint8_t byte = b->ql[64 * h + 32 * (c % 2) + l];
            const int lo = c < 2 ? byte & 0xf : byte >> 4;
            k->q[e] = (int8_t)((lo | (((b->qh[32 * h + l] >> (2 * c)) & 3) << 4)) - 32);
        }
        for (int g = 0; g < 16; g++)
            k->sc[g] = b->scales[g];
        k->d = kn_fp16_to_fp32(b->d);
        return;
    }
    default: { /* IQ4_XS */
        const kn_block_iq4_xs *b = (const kn_block_iq4_xs *)w + ib;
        for (int j = 0; j < 8; j++) {
            for (int l = 0; l < 16; l++) {
                k->q[32 * j + l] = kn_iq4nl_values[b->qs[16 * j + l] & 0xf];
                k->q[32 * j + l + 16] = kn_iq4nl_values[b->qs[16 * j + l] >> 4];
            }
            k->sc[2 * j] = k->sc[2 * j + 1] = (int16_t)(kn_iq4xs_scale(j, b) - 32);
        }
        k->d = kn_fp16_to_fp32(b->d);
        return;
    }
    }
}

static void ref_dot_kquant(kn_type t, const void *w, const void *xq, size_t xq_stride, int nr, int n,
                           float *out)
{
    for (int r = 0; r < nr; r++) {
        const kn_block_q8_K *xb = (const kn_block_q8_K *)((const char *)xq + (size_t)r * xq_stride);
        float sumf = 0.0f;
        for (int ib = 0; ib < n / KN_QK_K; ib++) {
            ksuper k;
            ksuper_unpack(t, w, ib, &k);
            int isum = 0, msum = 0;
            for (int g = 0; g < 16; g++) {
                int s = 0;
                for (int l = 0; l < 16; l++)
                    s += k.q[16 * g + l] * xb[ib].qs[16 * g + l];
                isum += k.sc[g] * s;
                msum += k.mn[g] * xb[ib].bsums[g];
            }
            sumf += (float)isum * (k.d * xb[ib].d) - (float)msum * (k.dmin * xb[ib].d);
        }
        out[r] = sumf;
    }
}

/* BF16 weights against BF16 activations: the products of the two bfloat16
 * values, summed in double. */
static void ref_dot_bf16(const void *vw, const void *x, size_t x_stride, int nr, int n, float *out)
{
    const uint16_t *w = vw;
    for (int r = 0; r < nr; r++) {
        const uint16_t *xr = (const uint16_t *)((const char *)x + (size_t)r * x_stride);
        double s = 0.0;
        for (int i = 0; i < n; i++)
            s += (double)kn_bf16_to_fp32(w[i]) * (double)kn_bf16_to_fp32(xr[i]);
        out[r] = (float)s;
    }
}

static void ref_quantize_q8_K(const float *x, void *y, int n)
{
    kn_quantize_row(KN_TYPE_Q8_K, x, y, n);
}

static void ref_quantize_bf16(const float *x, void *y, int n)
{
    kn_quantize_row(KN_TYPE_BF16, x, y, n);
}

/* Every type's entries: the dot, and the gemm as one dot per output. */
#define REF_TYPE(T, t, family)                                                                               \
    static void ref_dot_##t(const void *w, const void *xq, size_t xs, int nr, int n, float *out)             \
    {                                                                                                        \
        family(KN_TYPE_##T, w, xq, xs, nr, n, out);                                                          \
    }                                                                                                        \
    static void ref_gemm_##t(const void *w, size_t ws, int n_w, const void *xq, size_t xs, int nr, int n,    \
                             float *y, size_t ys)                                                            \
    {                                                                                                        \
        for (int r = 0; r < nr; r++)                                                                         \
            for (int o = 0; o < n_w; o++)                                                                    \
                family(KN_TYPE_##T, (const char *)w + (size_t)o * ws, (const char *)xq + (size_t)r * xs, 0, \
                       1, n, &y[(size_t)r * ys + o]);                                                        \
    }
REF_TYPE(Q4_1, q4_1, ref_dot_legacy)
REF_TYPE(Q5_0, q5_0, ref_dot_legacy)
REF_TYPE(Q5_1, q5_1, ref_dot_legacy)
REF_TYPE(IQ4_NL, iq4_nl, ref_dot_legacy)
REF_TYPE(MXFP4, mxfp4, ref_dot_legacy)
REF_TYPE(Q2_K, q2_K, ref_dot_kquant)
REF_TYPE(Q3_K, q3_K, ref_dot_kquant)
REF_TYPE(Q4_K, q4_K, ref_dot_kquant)
REF_TYPE(Q5_K, q5_K, ref_dot_kquant)
REF_TYPE(Q6_K, q6_K, ref_dot_kquant)
REF_TYPE(IQ4_XS, iq4_xs, ref_dot_kquant)
#undef REF_TYPE

static void ref_rmsnorm(float *y, const float *x, const float *g, int n, float eps)
{
    double ss = 0.0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * (double)x[i];
    const float scale = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++)
        y[i] = x[i] * scale * g[i];
}

static void ref_softmax(float *x, int n)
{
    float max = -INFINITY;
    for (int i = 0; i < n; i++)
        max = fmaxf(max, x[i]);
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    const float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++)
        x[i] *= inv;
}

static void ref_silu_mul(float *gate, const float *up, int n)
{
    for (int i = 0; i < n; i++)
        gate[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

static void ref_kv_scores(const float *q, const uint16_t *k, size_t stride, int n, int hd, float scale,
                          float *out)
{
    for (int r = 0; r < n; r++) {
        double s = 0.0;
        for (int i = 0; i < hd; i++)
            s += (double)q[i] * (double)kn_fp16_to_fp32(k[(size_t)r * stride + i]);
        out[r] = (float)(s * scale);
    }
}

static void ref_kv_accum(float *acc, const float *w, const uint16_t *v, size_t stride, int n, int hd)
{
    for (int i = 0; i < hd; i++) {
        double s = 0.0;
        for (int r = 0; r < n; r++)
            s += (double)w[r] * (double)kn_fp16_to_fp32(v[(size_t)r * stride + i]);
        acc[i] = (float)(acc[i] + s);
    }
}

static void ref_kv_accum_q8_0(float *acc, const float *w, const void *v, size_t stride, int n, int hd)
{
    for (int i = 0; i < hd; i++) {
        double s = 0.0;
        for (int r = 0; r < n; r++) {
            const kn_block_q8_0 *b =
                (const kn_block_q8_0 *)((const char *)v + (size_t)r * stride) + i / KN_QK8_0;
            s += (double)w[r] * kn_fp16_to_fp32(b->d) * b->qs[i % KN_QK8_0];
        }
        acc[i] = (float)(acc[i] + s);
    }
}

static void ref_to_f16(const float *x, uint16_t *y, int n)
{
    for (int i = 0; i < n; i++)
        y[i] = kn_fp32_to_fp16(x[i]);
}

static const kn_ops ops_ref = {
    .name = "ref",
    .quantize_q8_0 = ref_quantize_q8_0,
    .quantize = {[KN_TYPE_Q8_0] = ref_quantize_q8_0,
                 [KN_TYPE_Q8_K] = ref_quantize_q8_K,
                 [KN_TYPE_BF16] = ref_quantize_bf16},
    .dot = {[KN_TYPE_F32] = ref_dot_f32,    [KN_TYPE_F16] = ref_dot_f16,   [KN_TYPE_BF16] = ref_dot_bf16,
            [KN_TYPE_Q8_0] = ref_dot_q8_0,  [KN_TYPE_Q4_0] = ref_dot_q4_0, [KN_TYPE_Q4_1] = ref_dot_q4_1,
            [KN_TYPE_Q5_0] = ref_dot_q5_0,  [KN_TYPE_Q5_1] = ref_dot_q5_1, [KN_TYPE_IQ4_NL] = ref_dot_iq4_nl,
            [KN_TYPE_Q2_K] = ref_dot_q2_K,  [KN_TYPE_Q3_K] = ref_dot_q3_K, [KN_TYPE_Q4_K] = ref_dot_q4_K,
            [KN_TYPE_Q5_K] = ref_dot_q5_K,  [KN_TYPE_Q6_K] = ref_dot_q6_K, [KN_TYPE_IQ4_XS] = ref_dot_iq4_xs,
            [KN_TYPE_MXFP4] = ref_dot_mxfp4},
    .gemm = {[KN_TYPE_Q8_0] = ref_gemm_q8_0,  [KN_TYPE_Q4_0] = ref_gemm_q4_0,    [KN_TYPE_Q4_1] = ref_gemm_q4_1,
             [KN_TYPE_Q5_0] = ref_gemm_q5_0,  [KN_TYPE_Q5_1] = ref_gemm_q5_1,    [KN_TYPE_IQ4_NL] = ref_gemm_iq4_nl,
             [KN_TYPE_Q2_K] = ref_gemm_q2_K,  [KN_TYPE_Q3_K] = ref_gemm_q3_K,    [KN_TYPE_Q4_K] = ref_gemm_q4_K,
             [KN_TYPE_Q5_K] = ref_gemm_q5_K,  [KN_TYPE_Q6_K] = ref_gemm_q6_K,    [KN_TYPE_IQ4_XS] = ref_gemm_iq4_xs,
             [KN_TYPE_MXFP4] = ref_gemm_mxfp4},
    .rmsnorm = ref_rmsnorm,
    .softmax = ref_softmax,
    .silu_mul = ref_silu_mul,
    .kv_scores = ref_kv_scores,
    .kv_accum = ref_kv_accum,
    .kv_accum_q8_0 = ref_kv_accum_q8_0,
    .to_f16 = ref_to_f16,
};

const kn_ops *kn_ops_ref(void)
{
    return &ops_ref;
}

static const kn_ops *best_ops;
static pthread_once_t best_once = PTHREAD_ONCE_INIT;

static void pick_best(void)
{
    const kn_ops *ops = kn_ops_amx();
    if (ops == NULL)
        ops = kn_ops_avx512vnni();
    if (ops == NULL)
        ops = kn_ops_avxvnni();
    if (ops == NULL)
        ops = kn_ops_avx2();
    best_ops = ops != NULL ? ops : &ops_ref;
}

/* Chosen once: the tables' checks run CPUID (a VM exit under
 * virtualisation), and the sampler asks per token. */
const kn_ops *kn_ops_best(void)
{
    pthread_once(&best_once, pick_best);
    return best_ops;
}
