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
    .quantize = {[KN_TYPE_Q8_0] = ref_quantize_q8_0},
    .dot = {[KN_TYPE_F32] = ref_dot_f32,
            [KN_TYPE_F16] = ref_dot_f16,
            [KN_TYPE_Q8_0] = ref_dot_q8_0,
            [KN_TYPE_Q4_0] = ref_dot_q4_0},
    .gemm = {[KN_TYPE_Q8_0] = ref_gemm_q8_0, [KN_TYPE_Q4_0] = ref_gemm_q4_0},
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
