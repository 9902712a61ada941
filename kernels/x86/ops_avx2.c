/* kernels: the AVX2/FMA/F16C backend. Built with -mavx2 -mfma -mf16c and
 * reached only through kn_ops_avx2(), which checks the CPU first, so no
 * instruction here runs on a machine without them.
 *
 * The quantized dots and gemm carry the whole forward pass; they live in
 * qdot_x86.h, shared with the AVX-VNNI build: the block's integer dot with
 * vpmaddubsw + vpmaddwd, then scaled by d_w * d_x. Every function finishes
 * sizes that are not a multiple of the vector width with a scalar tail. */
#include "kernels/kn.h"
#include "kernels/quant_blocks.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "kernels/x86/ops_x86.h"

static inline float hmax256(__m256 v)
{
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float h2f(uint16_t h)
{
    return _cvtsh_ss(h);
}

/* ---- activation quantization ---------------------------------------------
 * Bit-identical to the reference: same amax, same d and 1/d computed in
 * scalar, same product, and roundf's ties-away-from-zero rebuilt exactly as
 * trunc(t) + trunc(2 * (t - trunc(t))) (every step is exact for |t| < 2^23). */
/* roundf(v * id) for 8 lanes, as the reference rounds: halves away from
 * zero, by truncation plus the truncated doubled remainder. */
static inline __m256i q8_round(__m256 v, __m256 idv)
{
    __m256 t = _mm256_mul_ps(v, idv);
    /* Keep the rounded product: fusing it into the subtraction below (FMA
     * contraction) would change which values tie. */
    __asm__("" : "+x"(t));
    const __m256 tr = _mm256_round_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 fr2 = _mm256_add_ps(_mm256_sub_ps(t, tr), _mm256_sub_ps(t, tr));
    return _mm256_cvtps_epi32(_mm256_add_ps(tr, _mm256_round_ps(fr2, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC)));
}

/* Named vectors, not arrays: GCC -O2 kept arrays of them on the stack. */
static void avx2_quantize_q8_0(const float *x, void *y, int n)
{
    kn_block_q8_0 *yb = y;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int ib = 0; ib < n / KN_QK8_0; ib++) {
        const float *xb = x + ib * KN_QK8_0;
        const __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
        const __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
        const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v0, absmask), _mm256_and_ps(v1, absmask)),
                                       _mm256_max_ps(_mm256_and_ps(v2, absmask), _mm256_and_ps(v3, absmask)));
        const float amax = hmax256(m);
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        /* vcvtps2ph rounds to nearest even, as kn_fp32_to_fp16 does */
        yb[ib].d = (uint16_t)_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256 idv = _mm256_set1_ps(id);
        const __m256i p01 = _mm256_packs_epi32(q8_round(v0, idv), q8_round(v1, idv));
        const __m256i p23 = _mm256_packs_epi32(q8_round(v2, idv), q8_round(v3, idv));
        /* the packs work per 128-bit lane; restore element order */
        const __m256i p = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23), perm);
        _mm256_storeu_si256((__m256i *)yb[ib].qs, p);
    }
}

/* ---- float weight dots ---------------------------------------------------- */

static inline __m256 load_w8(const void *w, bool half, int i)
{
    if (half)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i)));
    return _mm256_loadu_ps((const float *)w + i);
}

static inline float load_w1(const void *w, bool half, int i)
{
    return half ? h2f(((const uint16_t *)w)[i]) : ((const float *)w)[i];
}

/* One or two activation rows against one weight row, four chains of
 * eight lanes per row (a single row is bound by memory, and four chains
 * keep the loads going); the same order of additions for a row whether it
 * comes alone or paired, so an F32 or F16 model gives a sequence the same
 * bits in any batch. */
static inline __attribute__((always_inline)) void dotf_rows(const void *w, bool half, const float *x,
                                                            size_t xs, int K, int n, float *out)
{
    const float *x0 = x, *x1 = x + (K > 1 ? xs : 0);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, c0 = a0, c1 = a0, c2 = a0, c3 = a0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m256 w0 = load_w8(w, half, i), w1 = load_w8(w, half, i + 8);
        const __m256 w2 = load_w8(w, half, i + 16), w3 = load_w8(w, half, i + 24);
        a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x0 + i), a0);
        a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x0 + i + 8), a1);
        a2 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x0 + i + 16), a2);
        a3 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x0 + i + 24), a3);
        if (K > 1) {
            c0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x1 + i), c0);
            c1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x1 + i + 8), c1);
            c2 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x1 + i + 16), c2);
            c3 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x1 + i + 24), c3);
        }
    }
    for (; i + 8 <= n; i += 8) {
        const __m256 w0 = load_w8(w, half, i);
        a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x0 + i), a0);
        if (K > 1)
            c0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x1 + i), c0);
    }
    float s0 = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3))), s1 = 0;
    if (K > 1)
        s1 = hsum256(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)));
    for (; i < n; i++) {
        const float wi = load_w1(w, half, i);
        s0 += wi * x0[i];
        s1 += wi * x1[i];
    }
    out[0] = s0;
    if (K > 1)
        out[1] = s1;
}

static inline __attribute__((always_inline)) void dotf(const void *w, bool half, const float *x, size_t xs,
                                                       int nr, int n, float *out)
{
    for (; nr >= 2; nr -= 2, x += 2 * xs, out += 2)
        dotf_rows(w, half, x, xs, 2, n, out);
    if (nr == 1)
        dotf_rows(w, half, x, xs, 1, n, out);
}

/* xs in bytes, as every dot of the table takes it; rows of floats. */
static void avx2_dot_f32(const void *w, const void *x, size_t xs, int nr, int n, float *out)
{
    dotf(w, false, x, xs / sizeof(float), nr, n, out);
}

static void avx2_dot_f16(const void *w, const void *x, size_t xs, int nr, int n, float *out)
{
    dotf(w, true, x, xs / sizeof(float), nr, n, out);
}

/* ---- quantized weight dots (qdot_x86.h, here without VNNI) ---------------- */

float kn_x86_f16_table[1 << 16];
static pthread_once_t f16_table_once = PTHREAD_ONCE_INIT;

/* Types without a kernel in this file run the reference's (a type's dot
 * and gemm come together: a reference gemm only where there is no dot). */
static void fill_from_ref(kn_ops *ops)
{
    const kn_ops *ref = kn_ops_ref();
    for (int t = 0; t < KN_TYPE_COUNT; t++) {
        if (ops->quantize[t] == NULL)
            ops->quantize[t] = ref->quantize[t];
        if (ops->dot[t] == NULL) {
            ops->dot[t] = ref->dot[t];
            ops->gemm[t] = ref->gemm[t];
        }
    }
}

static void f16_table_init(void)
{
    for (int i = 0; i < (1 << 16); i += 8) {
        const __m128i h = _mm_add_epi16(_mm_set1_epi16((short)i), _mm_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7));
        _mm256_storeu_ps(kn_x86_f16_table + i, _mm256_cvtph_ps(h));
    }
}

#define QD_VNNI 0
#define QD_FN(n) avx2_##n
#define QD_ATTR
#include "kernels/x86/qdot_x86.h"

/* ---- elementwise ---------------------------------------------------------- */

/* expf for 8 lanes: Cephes' range reduction (x = n ln2 + r, ln2 split in two
 * so r is exact) and degree-6 polynomial, about 1 ulp. Inputs below -87
 * give 0, above the largest result +inf. From -87 up every result is a
 * normal float (n >= -126, and at n = -126 the polynomial is 1.4), and so
 * is e^-87, which the lanes below it compute before the mask clears them:
 * the clamp was at ln FLT_MIN, where the product came out subnormal, a
 * microcode assist per lane, and a softmax over logits far below their
 * maximum (masked tokens, a low temperature) ran 3x slower. The results
 * given up, e^-87.34 to e^-87, are below 1.7e-38. */
static inline __m256 exp256(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(-87.0f), hi = _mm256_set1_ps(88.72283172607421875f);
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* 2^n split as 2^(n/2) * 2^(n - n/2) so n = 128 (x near the top of the
     * range) still scales without overflowing the exponent field. */
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    const __m256 s1 =
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
    const __m256 s2 =
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
    return _mm256_and_ps(_mm256_mul_ps(_mm256_mul_ps(p, s1), s2), under);
}

static void avx2_rmsnorm(float *y, const float *x, const float *g, int n, float eps)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
        a0 = _mm256_fmadd_ps(v0, v0, a0);
        a1 = _mm256_fmadd_ps(v1, v1, a1);
    }
    for (; i + 8 <= n; i += 8) {
        const __m256 v0 = _mm256_loadu_ps(x + i);
        a0 = _mm256_fmadd_ps(v0, v0, a0);
    }
    float ss = hsum256(_mm256_add_ps(a0, a1));
    for (; i < n; i++)
        ss += x[i] * x[i];
    const float scale = 1.0f / sqrtf(ss / (float)n + eps);
    const __m256 sv = _mm256_set1_ps(scale);
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), sv), _mm256_loadu_ps(g + i)));
    for (; i < n; i++)
        y[i] = x[i] * scale * g[i];
}

static void avx2_softmax(float *x, int n)
{
    if (n <= 0)
        return;
    __m256 mv = _mm256_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + i));
    float max = hmax256(mv);
    for (; i < n; i++)
        max = fmaxf(max, x[i]);
    const __m256 maxv = _mm256_set1_ps(max);
    __m256 sv = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
        const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), maxv));
        _mm256_storeu_ps(x + i, e);
        sv = _mm256_add_ps(sv, e);
    }
    float sum = hsum256(sv);
    for (; i < n; i++) {
        const float d = x[i] - max;
        x[i] = d < -87.0f ? 0.0f : expf(d); /* as exp256: no subnormals */
        sum += x[i];
    }
    const float inv = 1.0f / sum;
    const __m256 iv = _mm256_set1_ps(inv);
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), iv));
    for (; i < n; i++)
        x[i] *= inv;
}

static void avx2_silu_mul(float *gate, const float *up, int n)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 e = exp256(_mm256_xor_ps(g, sign));
        const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, e));
        _mm256_storeu_ps(gate + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
    }
    for (; i < n; i++)
        gate[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

/* ---- attention over the F16 KV cache -------------------------------------- */

static inline __m256 load_h8(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* The eight lane sums of a0..a7, in order, as one vector. */
static inline __m256 hsum8x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6,
                             __m256 a7)
{
    const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

/* Eight K rows at a time, so one q load serves eight FMAs and the eight
 * sums leave as one vector. The accumulators are named, not an array: an
 * array's loop is not unrolled at -O2 and its FMAs go through the stack. */
static void avx2_kv_scores(const float *q, const uint16_t *k, size_t stride, int n, int hd, float scale,
                           float *out)
{
    const int hd8 = hd & ~7;
    int r = 0;
    for (; r + 8 <= n; r += 8) {
        const uint16_t *k0 = k + (size_t)r * stride, *k1 = k0 + stride, *k2 = k1 + stride, *k3 = k2 + stride;
        const uint16_t *k4 = k3 + stride, *k5 = k4 + stride, *k6 = k5 + stride, *k7 = k6 + stride;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        for (int i = 0; i < hd8; i += 8) {
            const __m256 qv = _mm256_loadu_ps(q + i);
            a0 = _mm256_fmadd_ps(qv, load_h8(k0 + i), a0);
            a1 = _mm256_fmadd_ps(qv, load_h8(k1 + i), a1);
            a2 = _mm256_fmadd_ps(qv, load_h8(k2 + i), a2);
            a3 = _mm256_fmadd_ps(qv, load_h8(k3 + i), a3);
            a4 = _mm256_fmadd_ps(qv, load_h8(k4 + i), a4);
            a5 = _mm256_fmadd_ps(qv, load_h8(k5 + i), a5);
            a6 = _mm256_fmadd_ps(qv, load_h8(k6 + i), a6);
            a7 = _mm256_fmadd_ps(qv, load_h8(k7 + i), a7);
        }
        __m256 sum = hsum8x8(a0, a1, a2, a3, a4, a5, a6, a7);
        if (hd8 < hd) {
            float t[8];
            for (int j = 0; j < 8; j++) {
                t[j] = 0;
                for (int i = hd8; i < hd; i++)
                    t[j] += q[i] * _cvtsh_ss(k0[(size_t)j * stride + i]);
            }
            sum = _mm256_add_ps(sum, _mm256_loadu_ps(t));
        }
        _mm256_storeu_ps(out + r, _mm256_mul_ps(sum, _mm256_set1_ps(scale)));
    }
    for (; r < n; r++) {
        const uint16_t *kr = k + (size_t)r * stride;
        __m256 a0 = _mm256_setzero_ps();
        for (int i = 0; i < hd8; i += 8)
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load_h8(kr + i), a0);
        float s = hsum256(a0);
        for (int i = hd8; i < hd; i++)
            s += q[i] * _cvtsh_ss(kr[i]);
        out[r] = s * scale;
    }
}

/* Four K rows from k0 against two query rows: avx2_kv_scores's sums for
 * them, accumulated and reduced as it does (hsum8x8's tree is the same in
 * every lane), so the same bits. */
static inline void kv_scores_4x2(const float *q0, const float *q1, const uint16_t *k0, size_t stride, int hd,
                                 float scale, float *out0, float *out1)
{
    const int hd8 = hd & ~7;
    const uint16_t *k1 = k0 + stride, *k2 = k1 + stride, *k3 = k2 + stride;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int i = 0; i < hd8; i += 8) {
        const __m256 x = _mm256_loadu_ps(q0 + i), y = _mm256_loadu_ps(q1 + i);
        __m256 kv = load_h8(k0 + i);
        a0 = _mm256_fmadd_ps(x, kv, a0);
        b0 = _mm256_fmadd_ps(y, kv, b0);
        kv = load_h8(k1 + i);
        a1 = _mm256_fmadd_ps(x, kv, a1);
        b1 = _mm256_fmadd_ps(y, kv, b1);
        kv = load_h8(k2 + i);
        a2 = _mm256_fmadd_ps(x, kv, a2);
        b2 = _mm256_fmadd_ps(y, kv, b2);
        kv = load_h8(k3 + i);
        a3 = _mm256_fmadd_ps(x, kv, a3);
        b3 = _mm256_fmadd_ps(y, kv, b3);
    }
    __m256 sum = hsum8x8(a0, a1, a2, a3, b0, b1, b2, b3);
    if (hd8 < hd) {
        float t[8];
        for (int j = 0; j < 8; j++) {
            const float *q = j < 4 ? q0 : q1;
            t[j] = 0;
            for (int i = hd8; i < hd; i++)
                t[j] += q[i] * _cvtsh_ss(k0[(size_t)(j & 3) * stride + i]);
        }
        sum = _mm256_add_ps(sum, _mm256_loadu_ps(t));
    }
    sum = _mm256_mul_ps(sum, _mm256_set1_ps(scale));
    _mm_storeu_ps(out0, _mm256_castps256_ps128(sum));
    _mm_storeu_ps(out1, _mm256_extractf128_ps(sum, 1));
}

/* avx2_kv_scores for two query rows, each K piece converted once for both
 * rows' FMAs (the conversions bound the one-row loop): the eights it takes
 * as two fours, the rest one row at a time, as it does. */
static void avx2_kv_scores2(const float *q0, const float *q1, const uint16_t *k, size_t stride, int n, int hd,
                            float scale, float *out0, float *out1)
{
    int r = 0;
    for (; r + 8 <= n; r += 8) {
        kv_scores_4x2(q0, q1, k + (size_t)r * stride, stride, hd, scale, out0 + r, out1 + r);
        kv_scores_4x2(q0, q1, k + (size_t)(r + 4) * stride, stride, hd, scale, out0 + r + 4, out1 + r + 4);
    }
    if (r < n) {
        avx2_kv_scores(q0, k + (size_t)r * stride, stride, n - r, hd, scale, out0 + r);
        avx2_kv_scores(q1, k + (size_t)r * stride, stride, n - r, hd, scale, out1 + r);
    }
}

/* 64 output lanes held in registers across all n rows, then 8 at a time. */
static void avx2_kv_accum(float *acc, const float *w, const uint16_t *v, size_t stride, int n, int hd)
{
    int i = 0;
    for (; i + 64 <= hd; i += 64) {
        float *o = acc + i;
        __m256 a0 = _mm256_loadu_ps(o), a1 = _mm256_loadu_ps(o + 8), a2 = _mm256_loadu_ps(o + 16);
        __m256 a3 = _mm256_loadu_ps(o + 24), a4 = _mm256_loadu_ps(o + 32), a5 = _mm256_loadu_ps(o + 40);
        __m256 a6 = _mm256_loadu_ps(o + 48), a7 = _mm256_loadu_ps(o + 56);
        for (int r = 0; r < n; r++) {
            const __m256 wv = _mm256_broadcast_ss(w + r);
            const uint16_t *vr = v + (size_t)r * stride + i;
            a0 = _mm256_fmadd_ps(wv, load_h8(vr), a0);
            a1 = _mm256_fmadd_ps(wv, load_h8(vr + 8), a1);
            a2 = _mm256_fmadd_ps(wv, load_h8(vr + 16), a2);
            a3 = _mm256_fmadd_ps(wv, load_h8(vr + 24), a3);
            a4 = _mm256_fmadd_ps(wv, load_h8(vr + 32), a4);
            a5 = _mm256_fmadd_ps(wv, load_h8(vr + 40), a5);
            a6 = _mm256_fmadd_ps(wv, load_h8(vr + 48), a6);
            a7 = _mm256_fmadd_ps(wv, load_h8(vr + 56), a7);
        }
        _mm256_storeu_ps(o, a0);
        _mm256_storeu_ps(o + 8, a1);
        _mm256_storeu_ps(o + 16, a2);
        _mm256_storeu_ps(o + 24, a3);
        _mm256_storeu_ps(o + 32, a4);
        _mm256_storeu_ps(o + 40, a5);
        _mm256_storeu_ps(o + 48, a6);
        _mm256_storeu_ps(o + 56, a7);
    }
    for (; i + 8 <= hd; i += 8) {
        __m256 a0 = _mm256_loadu_ps(acc + i);
        for (int r = 0; r < n; r++)
            a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(w + r), load_h8(v + (size_t)r * stride + i), a0);
        _mm256_storeu_ps(acc + i, a0);
    }
    for (; i < hd; i++) {
        float s = acc[i];
        for (int r = 0; r < n; r++)
            s += w[r] * _cvtsh_ss(v[(size_t)r * stride + i]);
        acc[i] = s;
    }
}

/* avx2_kv_accum for two rows of weights over the same V rows: 32 lanes of
 * both held in registers across all n rows, each V piece converted once
 * for both; each lane's sum is taken in the order avx2_kv_accum takes it
 * (and the lanes past the last 32 by it), so the same bits. */
static void avx2_kv_accum2(float *acc0, float *acc1, const float *w0, const float *w1, const uint16_t *v,
                           size_t stride, int n, int hd)
{
    int i = 0;
    for (; i + 32 <= hd; i += 32) {
        float *o = acc0 + i, *p = acc1 + i;
        __m256 a0 = _mm256_loadu_ps(o), a1 = _mm256_loadu_ps(o + 8), a2 = _mm256_loadu_ps(o + 16);
        __m256 a3 = _mm256_loadu_ps(o + 24), b0 = _mm256_loadu_ps(p), b1 = _mm256_loadu_ps(p + 8);
        __m256 b2 = _mm256_loadu_ps(p + 16), b3 = _mm256_loadu_ps(p + 24);
        for (int r = 0; r < n; r++) {
            const __m256 x = _mm256_broadcast_ss(w0 + r), y = _mm256_broadcast_ss(w1 + r);
            const uint16_t *vr = v + (size_t)r * stride + i;
            __m256 h = load_h8(vr);
            a0 = _mm256_fmadd_ps(x, h, a0);
            b0 = _mm256_fmadd_ps(y, h, b0);
            h = load_h8(vr + 8);
            a1 = _mm256_fmadd_ps(x, h, a1);
            b1 = _mm256_fmadd_ps(y, h, b1);
            h = load_h8(vr + 16);
            a2 = _mm256_fmadd_ps(x, h, a2);
            b2 = _mm256_fmadd_ps(y, h, b2);
            h = load_h8(vr + 24);
            a3 = _mm256_fmadd_ps(x, h, a3);
            b3 = _mm256_fmadd_ps(y, h, b3);
        }
        _mm256_storeu_ps(o, a0);
        _mm256_storeu_ps(o + 8, a1);
        _mm256_storeu_ps(o + 16, a2);
        _mm256_storeu_ps(o + 24, a3);
        _mm256_storeu_ps(p, b0);
        _mm256_storeu_ps(p + 8, b1);
        _mm256_storeu_ps(p + 16, b2);
        _mm256_storeu_ps(p + 24, b3);
    }
    if (i < hd) {
        avx2_kv_accum(acc0 + i, w0, v + i, stride, n, hd - i);
        avx2_kv_accum(acc1 + i, w1, v + i, stride, n, hd - i);
    }
}

static inline __m256 load_q8x8(const int8_t *p)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* A Q8_0 block (32 lanes) at a time, its accumulators held across all n
 * rows; each row's weight is folded into the block scale first. */
static void avx2_kv_accum_q8_0(float *acc, const float *w, const void *v, size_t stride, int n, int hd)
{
    for (int b = 0; b < hd / KN_QK8_0; b++) {
        float *o = acc + b * KN_QK8_0;
        __m256 a0 = _mm256_loadu_ps(o), a1 = _mm256_loadu_ps(o + 8), a2 = _mm256_loadu_ps(o + 16);
        __m256 a3 = _mm256_loadu_ps(o + 24);
        for (int r = 0; r < n; r++) {
            const kn_block_q8_0 *vb = (const kn_block_q8_0 *)((const char *)v + (size_t)r * stride) + b;
            const __m256 f = _mm256_set1_ps(w[r] * h2f(vb->d));
            a0 = _mm256_fmadd_ps(f, load_q8x8(vb->qs), a0);
            a1 = _mm256_fmadd_ps(f, load_q8x8(vb->qs + 8), a1);
            a2 = _mm256_fmadd_ps(f, load_q8x8(vb->qs + 16), a2);
            a3 = _mm256_fmadd_ps(f, load_q8x8(vb->qs + 24), a3);
        }
        _mm256_storeu_ps(o, a0);
        _mm256_storeu_ps(o + 8, a1);
        _mm256_storeu_ps(o + 16, a2);
        _mm256_storeu_ps(o + 24, a3);
    }
}

static void avx2_to_f16(const float *x, uint16_t *y, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++)
        y[i] = kn_fp32_to_fp16(x[i]);
}

static kn_ops ops_avx2 = {
    .name = "avx2",
    .quantize_q8_0 = avx2_quantize_q8_0,
    .quantize = {[KN_TYPE_Q8_0] = avx2_quantize_q8_0},
    .dot = {[KN_TYPE_F32] = avx2_dot_f32,
            [KN_TYPE_F16] = avx2_dot_f16,
            [KN_TYPE_Q8_0] = avx2_dot_q8_0,
            [KN_TYPE_Q4_0] = avx2_dot_q4_0},
    .gemm = {[KN_TYPE_Q8_0] = avx2_gemm_q8_0, [KN_TYPE_Q4_0] = avx2_gemm_q4_0},
    .rmsnorm = avx2_rmsnorm,
    .softmax = avx2_softmax,
    .silu_mul = avx2_silu_mul,
    .kv_scores = avx2_kv_scores,
    .kv_accum = avx2_kv_accum,
    .kv_scores2 = avx2_kv_scores2,
    .kv_accum2 = avx2_kv_accum2,
    .kv_accum_q8_0 = avx2_kv_accum_q8_0,
    .to_f16 = avx2_to_f16,
};

static void avx2_init(void)
{
    f16_table_init();
    kn_x86_kquant_fill(&ops_avx2);
    kn_x86_packed_avx2_fill(&ops_avx2);
    fill_from_ref(&ops_avx2);
}

const kn_ops *kn_ops_avx2(void)
{
    /* avx2 and fma through the builtin, which also checks that the OS saves
     * the ymm state; f16c through cpuid because clang's builtin does not
     * know that name. */
    unsigned a, b, c, d;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
        return NULL;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_F16C))
        return NULL;
    pthread_once(&f16_table_once, avx2_init);
    return &ops_avx2;
}

#else /* not an x86-64 build with the AVX2 flags */

const kn_ops *kn_ops_avx2(void)
{
    return NULL;
}

#endif
