/* kernels: reference dequantizers and quantizers of the legacy types beyond
 * Q8_0/Q4_0 (Q4_1, Q5_0, Q5_1), the K-quants (Q2_K..Q6_K, and Q8_K, the
 * K-quants' activations), IQ4_NL, IQ4_XS and BF16, on GGUF's block layouts
 * (quant_blocks.h).
 *
 * The quantizers follow the algorithms of ggml's reference quantizers, as
 * llama.cpp's quantize tool runs them without an importance matrix: a
 * scale (and min) per group fitted by a short search (make_qx_quants,
 * make_qkx2_quants, make_q3_quants below), the groups' scales quantized
 * against a super-block scale, then every weight quantized again against
 * its group's quantized scale. They are written here from that
 * description, so their blocks are valid blocks of the type and close to
 * what llama.cpp writes; bit-exactness with its files is not promised.
 * Compiled with -ffp-contract=off, so a multiply-add rounds as written. */
#include "kernels/kn_quants.h"

#include "kernels/kn.h"
#include "kernels/quant_blocks.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

/* Below this a group is all zero (ggml's GROUP_MAX_EPS). */
#define GROUP_EPS 1e-15f

/* Round to nearest, ties to even, as ggml's magic-number trick does for
 * |f| < 2^22; out-of-range and NaN input is clamped (NaN to 0) rather than
 * undefined, so a broken tensor quantizes to something. */
static inline int nearest_int(float f)
{
    if (!(fabsf(f) <= 4194303.0f))
        return f > 0 ? 4194303 : f < 0 ? -4194303 : 0;
    return (int)lrintf(f);
}

/* (int)f truncated toward zero and clamped to [lo, hi]; NaN gives lo. */
static inline int trunc_clamp(float f, int lo, int hi)
{
    if (!(f >= (float)lo))
        return lo;
    return f >= (float)hi ? hi : (int)f;
}

static inline int clampi(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

static inline float h2f(uint16_t h)
{
    return kn_fp16_to_fp32(h);
}

static inline uint16_t f2h(float f)
{
    return kn_fp32_to_fp16(f);
}

/* ---- legacy 32-element blocks ---------------------------------------------- */

static void minmax(const float *x, int n, float *lo, float *hi)
{
    float mn = FLT_MAX, mx = -FLT_MAX;
    for (int j = 0; j < n; j++) {
        mn = x[j] < mn ? x[j] : mn;
        mx = x[j] > mx ? x[j] : mx;
    }
    *lo = mn;
    *hi = mx;
}

/* The element of largest magnitude, with its sign. */
static float signed_absmax(const float *x, int n)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++)
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    return max;
}

void kn_quantize_q4_1(const float *x, void *vy, int64_t n)
{
    kn_block_q4_1 *y = vy;
    for (int64_t i = 0; i < n / KN_QK4_1; i++, x += KN_QK4_1) {
        float mn, mx;
        minmax(x, KN_QK4_1, &mn, &mx);
        const float d = (mx - mn) / 15.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        y[i].m = f2h(mn);
        for (int j = 0; j < KN_QK4_1 / 2; j++) {
            const int q0 = trunc_clamp((x[j] - mn) * id + 0.5f, 0, 15);
            const int q1 = trunc_clamp((x[j + 16] - mn) * id + 0.5f, 0, 15);
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

void kn_dequantize_q4_1(const void *vx, float *y, int64_t n)
{
    const kn_block_q4_1 *x = vx;
    for (int64_t i = 0; i < n / KN_QK4_1; i++, y += KN_QK4_1) {
        const float d = h2f(x[i].d), m = h2f(x[i].m);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(x[i].qs[j] & 0xf) * d + m;
            y[j + 16] = (float)(x[i].qs[j] >> 4) * d + m;
        }
    }
}

/* Q5_0 and Q5_1 share the packing: low nibbles as Q4_0's, the fifth bits in
 * qh, bit j for element j. */
static void pack5(const int *q, uint8_t *qs, uint8_t *qh4)
{
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 0xf) | ((q[j + 16] & 0xf) << 4));
        qh |= (uint32_t)((q[j] >> 4) & 1) << j;
        qh |= (uint32_t)((q[j + 16] >> 4) & 1) << (j + 16);
    }
    for (int k = 0; k < 4; k++)
        qh4[k] = (uint8_t)(qh >> (8 * k));
}

static inline int unpack5(const uint8_t *qs, const uint8_t *qh4, int j)
{
    const uint32_t qh = qh4[0] | (uint32_t)qh4[1] << 8 | (uint32_t)qh4[2] << 16 | (uint32_t)qh4[3] << 24;
    const int lo = j < 16 ? qs[j] & 0xf : qs[j - 16] >> 4;
    return lo | (int)((qh >> j) & 1) << 4;
}

void kn_quantize_q5_0(const float *x, void *vy, int64_t n)
{
    kn_block_q5_0 *y = vy;
    for (int64_t i = 0; i < n / KN_QK5_0; i++, x += KN_QK5_0) {
        const float d = signed_absmax(x, KN_QK5_0) / -16.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int q[32];
        y[i].d = f2h(d);
        for (int j = 0; j < 32; j++)
            q[j] = trunc_clamp(x[j] * id + 16.5f, 0, 31);
        pack5(q, y[i].qs, y[i].qh);
    }
}

void kn_dequantize_q5_0(const void *vx, float *y, int64_t n)
{
    const kn_block_q5_0 *x = vx;
    for (int64_t i = 0; i < n / KN_QK5_0; i++, y += KN_QK5_0) {
        const float d = h2f(x[i].d);
        for (int j = 0; j < 32; j++)
            y[j] = (float)(unpack5(x[i].qs, x[i].qh, j) - 16) * d;
    }
}

void kn_quantize_q5_1(const float *x, void *vy, int64_t n)
{
    kn_block_q5_1 *y = vy;
    for (int64_t i = 0; i < n / KN_QK5_1; i++, x += KN_QK5_1) {
        float mn, mx;
        minmax(x, KN_QK5_1, &mn, &mx);
        const float d = (mx - mn) / 31.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int q[32];
        y[i].d = f2h(d);
        y[i].m = f2h(mn);
        for (int j = 0; j < 32; j++)
            q[j] = trunc_clamp((x[j] - mn) * id + 0.5f, 0, 31);
        pack5(q, y[i].qs, y[i].qh);
    }
}

void kn_dequantize_q5_1(const void *vx, float *y, int64_t n)
{
    const kn_block_q5_1 *x = vx;
    for (int64_t i = 0; i < n / KN_QK5_1; i++, y += KN_QK5_1) {
        const float d = h2f(x[i].d), m = h2f(x[i].m);
        for (int j = 0; j < 32; j++)
            y[j] = (float)unpack5(x[i].qs, x[i].qh, j) * d + m;
    }
}

/* ---- the group fits --------------------------------------------------------- */

/* Symmetric levels -nmax..nmax-1 (stored + nmax) for n values: the scale
 * of the largest magnitude, then, weighting each value by its square, the
 * least-squares scale for the levels of 18 nearby trial scales, keeping
 * the best. Returns the scale (0 for an all-zero group). */
static float fit_symmetric(int n, int nmax, const float *x, int8_t *L)
{
    const float max = signed_absmax(x, n), amax = fabsf(max);
    if (amax < GROUP_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = -nmax / max, sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; i++) {
        const int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        const float w = x[i] * x[i];
        L[i] = (int8_t)(l + nmax);
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f, best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0)
            continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0.0f;
        for (int i = 0; i < n; i++) {
            const int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            const float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0.0f && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++)
                L[i] = (int8_t)(nmax + clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Q3_K's groups: levels -nmax..nmax-1 (stored + nmax), then a few passes
 * that move single levels while the weighted fit improves. */
static float fit_q3(int n, int nmax, const float *x, int8_t *L)
{
    const float max = signed_absmax(x, n), amax = fabsf(max);
    if (amax < GROUP_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    const float iscale = -nmax / max;
    float sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; i++) {
        const int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        const float w = x[i] * x[i];
        L[i] = (int8_t)l;
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int pass = 0; pass < 5; pass++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx <= 0.0f)
                continue;
            float sl2 = suml2 - w * L[i] * L[i];
            const int nl = clampi(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
            if (nl == L[i])
                continue;
            slx += w * x[i] * nl;
            sl2 += w * nl * nl;
            if (sl2 > 0.0f && slx * slx * suml2 > sumlx * sumlx * sl2) {
                L[i] = (int8_t)nl;
                sumlx = slx;
                suml2 = sl2;
                changed++;
            }
        }
        if (!changed)
            break;
    }
    for (int i = 0; i < n; i++)
        L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Levels 0..nmax with a scale and a min (x ~ scale * l - min, min >= 0
 * returned in *the_min): the range's fit, then nstep + 1 trial scales
 * around it, each refitted by weighted least squares for scale and min
 * together, kept when the weighted error (absolute with use_mad, else
 * squared) falls. */
static float fit_scale_min(int n, int nmax, const float *x, const float *wt, uint8_t *L, float *the_min,
                           uint8_t *Laux, float rmin, float rdelta, int nstep, bool use_mad)
{
    float mn = x[0], mx = x[0], sum_w = wt[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        mn = x[i] < mn ? x[i] : mn;
        mx = x[i] > mx ? x[i] : mx;
        sum_w += wt[i];
        sum_x += wt[i] * x[i];
    }
    if (mn > 0.0f)
        mn = 0.0f;
    if (mx == mn) {
        memset(L, 0, (size_t)n);
        *the_min = -mn;
        return 0.0f;
    }
    float iscale = nmax / (mx - mn), scale = 1.0f / iscale, best = 0.0f;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clampi(nearest_int(iscale * (x[i] - mn)), 0, nmax);
        float diff = scale * L[i] + mn - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best += wt[i] * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (mx - mn);
        float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
        for (int i = 0; i < n; i++) {
            const int l = clampi(nearest_int(iscale * (x[i] - mn)), 0, nmax);
            Laux[i] = (uint8_t)l;
            sum_l += wt[i] * l;
            sum_l2 += wt[i] * l * l;
            sum_xl += wt[i] * l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D <= 0.0f)
            continue;
        float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
        float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        if (this_min > 0.0f) {
            this_min = 0.0f;
            this_scale = sum_xl / sum_l2;
        }
        float err = 0.0f;
        for (int i = 0; i < n; i++) {
            float diff = this_scale * Laux[i] + this_min - x[i];
            diff = use_mad ? fabsf(diff) : diff * diff;
            err += wt[i] * diff;
        }
        if (err < best) {
            memcpy(L, Laux, (size_t)n);
            best = err;
            scale = this_scale;
            mn = this_min;
        }
    }
    *the_min = -mn;
    return scale;
}

/* Q2_K's and Q3_K's 2-bit quants: byte l of each 32-byte run holds
 * elements l, l + 32, l + 64, l + 96 of its 128, from the low bits up. */
static void pack2(const uint8_t *L, uint8_t *qs)
{
    for (int j = 0; j < KN_QK_K; j += 128)
        for (int l = 0; l < 32; l++)
            qs[j / 4 + l] =
                (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

static inline int unpack2(const uint8_t *qs, int e)
{
    return (qs[e / 128 * 32 + e % 32] >> (2 * (e % 128 / 32))) & 3;
}

/* ---- Q2_K ------------------------------------------------------------------- */

void kn_quantize_q2_K(const float *x, void *vy, int64_t n)
{
    kn_block_q2_K *y = vy;
    uint8_t L[KN_QK_K], Laux[16];
    float wt[16], mins[16], scales[16];
    for (int64_t i = 0; i < n / KN_QK_K; i++, x += KN_QK_K) {
        float max_scale = 0.0f, max_min = 0.0f;
        for (int j = 0; j < 16; j++) {
            for (int l = 0; l < 16; l++)
                wt[l] = fabsf(x[16 * j + l]);
            scales[j] = fit_scale_min(16, 3, x + 16 * j, wt, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
            max_scale = scales[j] > max_scale ? scales[j] : max_scale;
            max_min = mins[j] > max_min ? mins[j] : max_min;
        }
        memset(y[i].scales, 0, sizeof(y[i].scales));
        y[i].d = y[i].dmin = f2h(0.0f);
        if (max_scale > 0.0f) {
            const float iscale = 15.0f / max_scale;
            for (int j = 0; j < 16; j++)
                y[i].scales[j] = (uint8_t)clampi(nearest_int(iscale * scales[j]), 0, 15);
            y[i].d = f2h(max_scale / 15.0f);
        }
        if (max_min > 0.0f) {
            const float iscale = 15.0f / max_min;
            for (int j = 0; j < 16; j++)
                y[i].scales[j] |= (uint8_t)(clampi(nearest_int(iscale * mins[j]), 0, 15) << 4);
            y[i].dmin = f2h(max_min / 15.0f);
        }
        for (int j = 0; j < 16; j++) {
            const float d = h2f(y[i].d) * (y[i].scales[j] & 0xf);
            if (d == 0.0f)
                continue;
            const float dm = h2f(y[i].dmin) * (y[i].scales[j] >> 4);
            for (int l = 0; l < 16; l++)
                L[16 * j + l] = (uint8_t)clampi(nearest_int((x[16 * j + l] + dm) / d), 0, 3);
        }
        pack2(L, y[i].qs);
    }
}

void kn_dequantize_q2_K(const void *vx, float *y, int64_t n)
{
    const kn_block_q2_K *x = vx;
    for (int64_t i = 0; i < n / KN_QK_K; i++, y += KN_QK_K) {
        const float d = h2f(x[i].d), dmin = h2f(x[i].dmin);
        for (int e = 0; e < KN_QK_K; e++) {
            const uint8_t sc = x[i].scales[e / 16];
            y[e] = d * (sc & 0xf) * (float)unpack2(x[i].qs, e) - dmin * (sc >> 4);
        }
    }
}

/* ---- Q3_K ------------------------------------------------------------------- */

void kn_quantize_q3_K(const float *x, void *vy, int64_t n)
{
    kn_block_q3_K *y = vy;
    int8_t L[KN_QK_K];
    float scales[16];
    for (int64_t i = 0; i < n / KN_QK_K; i++, x += KN_QK_K) {
        float max_scale = 0.0f, amax = 0.0f;
        for (int j = 0; j < 16; j++) {
            scales[j] = fit_q3(16, 4, x + 16 * j, L + 16 * j);
            if (fabsf(scales[j]) > amax) {
                amax = fabsf(scales[j]);
                max_scale = scales[j];
            }
        }
        memset(y[i].scales, 0, sizeof(y[i].scales));
        y[i].d = f2h(0.0f);
        if (max_scale != 0.0f) {
            const float iscale = -32.0f / max_scale;
            for (int j = 0; j < 16; j++) {
                const int l = clampi(nearest_int(iscale * scales[j]), -32, 31) + 32;
                if (j < 8)
                    y[i].scales[j] = (uint8_t)(l & 0xf);
                else
                    y[i].scales[j - 8] |= (uint8_t)((l & 0xf) << 4);
                y[i].scales[8 + j % 4] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
            }
            y[i].d = f2h(1.0f / iscale);
        }
        for (int j = 0; j < 16; j++) {
            const float d = h2f(y[i].d) * (float)(kn_q3k_scale(j, y[i].scales) - 32);
            if (d == 0.0f)
                continue;
            for (int l = 0; l < 16; l++)
                L[16 * j + l] = (int8_t)(clampi(nearest_int(x[16 * j + l] / d), -4, 3) + 4);
        }
        /* the high bit of element e at bit e / 32 of hmask[e % 32] */
        uint8_t L2[KN_QK_K];
        memset(y[i].hmask, 0, sizeof(y[i].hmask));
        for (int e = 0; e < KN_QK_K; e++) {
            int l = L[e];
            if (l > 3) {
                y[i].hmask[e % 32] |= (uint8_t)(1u << (e / 32));
                l -= 4;
            }
            L2[e] = (uint8_t)l;
        }
        pack2(L2, y[i].qs);
    }
}

void kn_dequantize_q3_K(const void *vx, float *y, int64_t n)
{
    const kn_block_q3_K *x = vx;
    for (int64_t i = 0; i < n / KN_QK_K; i++, y += KN_QK_K) {
        const float d = h2f(x[i].d);
        for (int e = 0; e < KN_QK_K; e++) {
            const int hi = (x[i].hmask[e % 32] >> (e / 32)) & 1;
            const int q = unpack2(x[i].qs, e) - (hi ? 0 : 4);
            y[e] = d * (float)(kn_q3k_scale(e / 16, x[i].scales) - 32) * (float)q;
        }
    }
}

/* ---- Q4_K and Q5_K ------------------------------------------------------------ */

/* Packs group j's 6-bit scale and min into the 12 bytes (kn_k4_scale_min). */
static void pack_k4_scale_min(uint8_t *s, int j, int ls, int lm)
{
    if (j < 4) {
        s[j] = (uint8_t)ls;
        s[j + 4] = (uint8_t)lm;
    } else {
        s[j + 4] = (uint8_t)((ls & 0xf) | ((lm & 0xf) << 4));
        s[j - 4] |= (uint8_t)((ls >> 4) << 6);
        s[j] |= (uint8_t)((lm >> 4) << 6);
    }
}

/* The shared part of Q4_K and Q5_K: 8 groups of 32 levels 0..nmax, their
 * scales and mins against the super-block's d and dmin; L gets the levels
 * requantized against the quantized scales. */
static void quantize_k_scale_min(const float *x, int nmax, float rmin, int nstep, uint16_t *dp, uint16_t *dminp,
                                 uint8_t *sc12, uint8_t *L)
{
    uint8_t Laux[32];
    float wt[32], mins[8], scales[8], max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 8; j++) {
        float sum_x2 = 0.0f;
        for (int l = 0; l < 32; l++)
            sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32.0f);
        for (int l = 0; l < 32; l++)
            wt[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = fit_scale_min(32, nmax, x + 32 * j, wt, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, false);
        max_scale = scales[j] > max_scale ? scales[j] : max_scale;
        max_min = mins[j] > max_min ? mins[j] : max_min;
    }
    const float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
    memset(sc12, 0, KN_K_SCALE_SIZE);
    for (int j = 0; j < 8; j++)
        pack_k4_scale_min(sc12, j, clampi(nearest_int(inv_scale * scales[j]), 0, 63),
                          clampi(nearest_int(inv_min * mins[j]), 0, 63));
    *dp = f2h(max_scale / 63.0f);
    *dminp = f2h(max_min / 63.0f);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        kn_k4_scale_min(j, sc12, &sc, &m);
        const float d = h2f(*dp) * sc;
        if (d == 0.0f)
            continue;
        const float dm = h2f(*dminp) * m;
        for (int l = 0; l < 32; l++)
            L[32 * j + l] = (uint8_t)clampi(nearest_int((x[32 * j + l] + dm) / d), 0, nmax);
    }
}

void kn_quantize_q4_K(const float *x, void *vy, int64_t n)
{
    kn_block_q4_K *y = vy;
    uint8_t L[KN_QK_K];
    for (int64_t i = 0; i < n / KN_QK_K; i++, x += KN_QK_K) {
        quantize_k_scale_min(x, 15, -1.0f, 20, &y[i].d, &y[i].dmin, y[i].scales, L);
        for (int r = 0; r < 4; r++)
            for (int l = 0; l < 32; l++)
                y[i].qs[32 * r + l] = (uint8_t)(L[64 * r + l] | (L[64 * r + 32 + l] << 4));
    }
}

void kn_dequantize_q4_K(const void *vx, float *y, int64_t n)
{
    const kn_block_q4_K *x = vx;
    for (int64_t i = 0; i < n / KN_QK_K; i++, y += KN_QK_K) {
        const float d = h2f(x[i].d), dmin = h2f(x[i].dmin);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            kn_k4_scale_min(j, x[i].scales, &sc, &m);
            const float dl = d * sc, ml = dmin * m;
            const uint8_t *q = x[i].qs + 32 * (j / 2);
            for (int l = 0; l < 32; l++)
                y[32 * j + l] = dl * (float)(j % 2 ? q[l] >> 4 : q[l] & 0xf) - ml;
        }
    }
}

void kn_quantize_q5_K(const float *x, void *vy, int64_t n)
{
    kn_block_q5_K *y = vy;
    uint8_t L[KN_QK_K];
    for (int64_t i = 0; i < n / KN_QK_K; i++, x += KN_QK_K) {
        quantize_k_scale_min(x, 31, -0.5f, 15, &y[i].d, &y[i].dmin, y[i].scales, L);
        memset(y[i].qh, 0, sizeof(y[i].qh));
        for (int r = 0; r < 4; r++)
            for (int l = 0; l < 32; l++) {
                const int l1 = L[64 * r + l], l2 = L[64 * r + 32 + l];
                y[i].qh[l] |= (uint8_t)(((l1 >> 4) << (2 * r)) | ((l2 >> 4) << (2 * r + 1)));
                y[i].qs[32 * r + l] = (uint8_t)((l1 & 0xf) | ((l2 & 0xf) << 4));
            }
    }
}

void kn_dequantize_q5_K(const void *vx, float *y, int64_t n)
{
    const kn_block_q5_K *x = vx;
    for (int64_t i = 0; i < n / KN_QK_K; i++, y += KN_QK_K) {
        const float d = h2f(x[i].d), dmin = h2f(x[i].dmin);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            kn_k4_scale_min(j, x[i].scales, &sc, &m);
            const float dl = d * sc, ml = dmin * m;
            const uint8_t *q = x[i].qs + 32 * (j / 2);
            for (int l = 0; l < 32; l++) {
                const int lo = j % 2 ? q[l] >> 4 : q[l] & 0xf;
                y[32 * j + l] = dl * (float)(lo | (((x[i].qh[l] >> j) & 1) << 4)) - ml;
            }
        }
    }
}

/* ---- Q6_K ------------------------------------------------------------------- */

void kn_quantize_q6_K(const float *x, void *vy, int64_t n)
{
    kn_block_q6_K *y = vy;
    int8_t L[KN_QK_K];
    float scales[16];
    for (int64_t i = 0; i < n / KN_QK_K; i++, x += KN_QK_K) {
        float max_scale = 0.0f, max_abs = 0.0f;
        for (int j = 0; j < 16; j++) {
            scales[j] = fit_symmetric(16, 32, x + 16 * j, L + 16 * j);
            if (fabsf(scales[j]) > max_abs) {
                max_abs = fabsf(scales[j]);
                max_scale = scales[j];
            }
        }
        if (max_abs < GROUP_EPS) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        const float iscale = -128.0f / max_scale;
        y[i].d = f2h(1.0f / iscale);
        for (int j = 0; j < 16; j++)
            y[i].scales[j] = (int8_t)clampi(nearest_int(iscale * scales[j]), -128, 127);
        for (int j = 0; j < 16; j++) {
            const float d = h2f(y[i].d) * y[i].scales[j];
            if (d == 0.0f)
                continue;
            for (int l = 0; l < 16; l++)
                L[16 * j + l] = (int8_t)(clampi(nearest_int(x[16 * j + l] / d), -32, 31) + 32);
        }
        for (int h = 0; h < 2; h++) {
            const int8_t *Lh = L + 128 * h;
            uint8_t *ql = y[i].ql + 64 * h, *qh = y[i].qh + 32 * h;
            for (int l = 0; l < 32; l++) {
                ql[l] = (uint8_t)((Lh[l] & 0xf) | ((Lh[l + 64] & 0xf) << 4));
                ql[l + 32] = (uint8_t)((Lh[l + 32] & 0xf) | ((Lh[l + 96] & 0xf) << 4));
                qh[l] = (uint8_t)((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) |
                                  ((Lh[l + 96] >> 4) << 6));
            }
        }
    }
}

void kn_dequantize_q6_K(const void *vx, float *y, int64_t n)
{
    const kn_block_q6_K *x = vx;
    for (int64_t i = 0; i < n / KN_QK_K; i++, y += KN_QK_K) {
        const float d = h2f(x[i].d);
        for (int e = 0; e < KN_QK_K; e++) {
            const int h = e / 128, k = e % 128 / 32, l = e % 32;
            const uint8_t b = x[i].ql[64 * h + 32 * (k % 2) + l];
            const int lo = k < 2 ? b & 0xf : b >> 4;
            const int q = lo | (((x[i].qh[32 * h + l] >> (2 * k)) & 3) << 4);
            y[e] = d * (float)x[i].scales[e / 16] * (float)(q - 32);
        }
    }
}

/* ---- Q8_K ------------------------------------------------------------------- */

void kn_quantize_q8_K(const float *x, void *vy, int64_t n)
{
    kn_block_q8_K *y = vy;
    for (int64_t i = 0; i < n / KN_QK_K; i++, x += KN_QK_K) {
        const float max = signed_absmax(x, KN_QK_K);
        memset(&y[i], 0, sizeof(y[i]));
        if (max == 0.0f || !(fabsf(max) <= FLT_MAX))
            continue; /* all zero (or not finite: left zero rather than NaN) */
        const float iscale = -127.0f / max;
        for (int j = 0; j < KN_QK_K; j++)
            y[i].qs[j] = (int8_t)clampi(nearest_int(iscale * x[j]), -128, 127);
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int l = 0; l < 16; l++)
                s += y[i].qs[16 * g + l];
            y[i].bsums[g] = (int16_t)s;
        }
        y[i].d = 1.0f / iscale;
    }
}

void kn_dequantize_q8_K(const void *vx, float *y, int64_t n)
{
    const kn_block_q8_K *x = vx;
    for (int64_t i = 0; i < n / KN_QK_K; i++, y += KN_QK_K)
        for (int j = 0; j < KN_QK_K; j++)
            y[j] = x[i].d * (float)x[i].qs[j];
}

/* ---- IQ4_NL and IQ4_XS -------------------------------------------------------- */

/* The index of the level of kn_iq4nl_values nearest x. */
static int iq4_index(float x)
{
    const int8_t *v = kn_iq4nl_values;
    if (!(x > v[0]))
        return 0;
    if (x >= v[15])
        return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (x < v[mid])
            hi = mid;
        else
            lo = mid;
    }
    return x - v[hi - 1] < v[hi] - x ? hi - 1 : hi;
}

/* One group of 32: the scale that maps the largest magnitude to the end
 * level, refitted by least squares (weights x^2) over 15 trial scales.
 * Returns it (0 for an all-zero group). */
static float iq4_fit(const float *x)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    if (amax < GROUP_EPS)
        return 0.0f;
    const int8_t *v = kn_iq4nl_values;
    float id = 1.0f / (-max / v[0]), sumqx = 0.0f, sumq2 = 0.0f;
    for (int j = 0; j < 32; j++) {
        const float q = v[iq4_index(id * x[j])], w = x[j] * x[j];
        sumqx += w * q * x[j];
        sumq2 += w * q * q;
    }
    float d = sumq2 > 0.0f ? sumqx / sumq2 : 0.0f, best = d * sumqx;
    for (int t = -7; t <= 7; t++) {
        id = (t + v[0]) / max;
        sumqx = sumq2 = 0.0f;
        for (int j = 0; j < 32; j++) {
            const float q = v[iq4_index(id * x[j])], w = x[j] * x[j];
            sumqx += w * q * x[j];
            sumq2 += w * q * q;
        }
        if (sumq2 > 0.0f && sumqx * sumqx > best * sumq2) {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    return d;
}

/* 32 levels against scale d into Q4_0's nibble order. */
static void iq4_pack(const float *x, float d, uint8_t *qs)
{
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 16; j++)
        qs[j] = (uint8_t)(iq4_index(id * x[j]) | (iq4_index(id * x[j + 16]) << 4));
}

void kn_quantize_iq4_nl(const float *x, void *vy, int64_t n)
{
    kn_block_iq4_nl *y = vy;
    for (int64_t i = 0; i < n / KN_QK4_NL; i++, x += KN_QK4_NL) {
        const float d = iq4_fit(x);
        y[i].d = f2h(d);
        iq4_pack(x, d, y[i].qs);
    }
}

void kn_dequantize_iq4_nl(const void *vx, float *y, int64_t n)
{
    const kn_block_iq4_nl *x = vx;
    for (int64_t i = 0; i < n / KN_QK4_NL; i++, y += KN_QK4_NL) {
        const float d = h2f(x[i].d);
        for (int j = 0; j < 16; j++) {
            y[j] = d * kn_iq4nl_values[x[i].qs[j] & 0xf];
            y[j + 16] = d * kn_iq4nl_values[x[i].qs[j] >> 4];
        }
    }
}

/* ---- MXFP4 ------------------------------------------------------------------ */

/* The index of the level nearest x / d, the first among equals (ggml's
 * best_index_mxfp4, which compares each level's error in turn). */
static int mxfp4_index(float x, float d)
{
    int best = 0;
    float best_err = fabsf(kn_mxfp4_values[0] * d - x);
    for (int i = 1; i < 16; i++) {
        const float err = fabsf(kn_mxfp4_values[i] * d - x);
        if (err < best_err) {
            best = i;
            best_err = err;
        }
    }
    return best;
}

/* ggml's quantize_row_mxfp4_ref: the exponent that puts the largest
 * magnitude in the top binade of E2M1 (6 = 1.5 * 2^2), then each value's
 * nearest level. */
void kn_quantize_mxfp4(const float *x, void *vy, int64_t n)
{
    kn_block_mxfp4 *y = vy;
    for (int64_t i = 0; i < n / KN_QK_MXFP4; i++, x += KN_QK_MXFP4) {
        float amax = 0.0f;
        for (int j = 0; j < KN_QK_MXFP4; j++)
            amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        const uint8_t e = amax > 0.0f ? (uint8_t)(floorf(log2f(amax)) - 2 + 127) : 0;
        const float d = kn_e8m0_half(e);
        y[i].e = e;
        for (int j = 0; j < KN_QK_MXFP4 / 2; j++)
            y[i].qs[j] = (uint8_t)(mxfp4_index(x[j], d) | mxfp4_index(x[j + 16], d) << 4);
    }
}

void kn_dequantize_mxfp4(const void *vx, float *y, int64_t n)
{
    const kn_block_mxfp4 *x = vx;
    for (int64_t i = 0; i < n / KN_QK_MXFP4; i++, y += KN_QK_MXFP4) {
        const float d = kn_e8m0_half(x[i].e);
        for (int j = 0; j < 16; j++) {
            y[j] = d * kn_mxfp4_values[x[i].qs[j] & 0xf];
            y[j + 16] = d * kn_mxfp4_values[x[i].qs[j] >> 4];
        }
    }
}

void kn_quantize_iq4_xs(const float *x, void *vy, int64_t n)
{
    kn_block_iq4_xs *y = vy;
    for (int64_t i = 0; i < n / KN_QK_K; i++, x += KN_QK_K) {
        float scales[8], max_scale = 0.0f, amax = 0.0f;
        for (int j = 0; j < 8; j++) {
            scales[j] = iq4_fit(x + 32 * j);
            if (fabsf(scales[j]) > amax) {
                amax = fabsf(scales[j]);
                max_scale = scales[j];
            }
        }
        const float d = -max_scale / 32.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        y[i].scales_h = 0;
        memset(y[i].scales_l, 0, sizeof(y[i].scales_l));
        for (int j = 0; j < 8; j++) {
            const int l = clampi(nearest_int(id * scales[j]), -32, 31);
            iq4_pack(x + 32 * j, d * (float)l, y[i].qs + 16 * j);
            y[i].scales_l[j / 2] |= (uint8_t)(((l + 32) & 0xf) << (4 * (j % 2)));
            y[i].scales_h |= (uint16_t)(((l + 32) >> 4) << (2 * j));
        }
    }
}

void kn_dequantize_iq4_xs(const void *vx, float *y, int64_t n)
{
    const kn_block_iq4_xs *x = vx;
    for (int64_t i = 0; i < n / KN_QK_K; i++, y += KN_QK_K) {
        const float d = h2f(x[i].d);
        for (int j = 0; j < 8; j++) {
            const float dl = d * (float)(kn_iq4xs_scale(j, &x[i]) - 32);
            const uint8_t *q = x[i].qs + 16 * j;
            for (int l = 0; l < 16; l++) {
                y[32 * j + l] = dl * kn_iq4nl_values[q[l] & 0xf];
                y[32 * j + l + 16] = dl * kn_iq4nl_values[q[l] >> 4];
            }
        }
    }
}

/* ---- BF16 ------------------------------------------------------------------- */

void kn_quantize_bf16(const float *x, void *vy, int64_t n)
{
    uint16_t *y = vy;
    for (int64_t i = 0; i < n; i++)
        y[i] = kn_fp32_to_bf16(x[i]);
}

void kn_dequantize_bf16(const void *vx, float *y, int64_t n)
{
    const uint16_t *x = vx;
    for (int64_t i = 0; i < n; i++)
        y[i] = kn_bf16_to_fp32(x[i]);
}
