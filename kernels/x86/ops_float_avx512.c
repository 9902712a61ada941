/* kernels/x86: the F16 and BF16 weight gemms on 512-bit vectors, for the
 * AVX-512 table: F16 weights widened by vcvtph2ps against F32 activations
 * with 512-bit FMA; BF16 weights against BF16 activations by vdpbf16ps
 * (two products a lane and step, 32 elements an instruction) where the CPU
 * has AVX512_BF16, else left to the AVX2 gemm.
 *
 * A tile is up to 4 weight rows by 4 activation rows, one accumulator per
 * (weight row, activation row): 16 independent chains hide the latency,
 * and each pair's arithmetic (its chunks in order, the tail as a masked
 * chunk, then one fixed reduction) does not depend on the tile it lands
 * in, so a row's result has the same bits whatever its batch. The rounding
 * differs from the reference's double sums by the float accumulation
 * (vdpbf16ps also flushes subnormal inputs and results to zero, as the
 * instruction does). */
#include "kernels/kn.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>

#include "kernels/x86/ops_x86.h"

#define KF_ATTR __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define KF_INLINE static inline __attribute__((always_inline)) KF_ATTR

/* Elements a step: 16 floats, or 32 bfloat16 pairs' worth. */
KF_INLINE int kf_step(bool bf)
{
    return bf ? 32 : 16;
}

/* Weight row w's chunk at i (m: the lanes there are), as the step
 * multiplies it: 16 halves widened, or 32 bfloat16 as they are. */
KF_INLINE __m512 kf_w(const uint16_t *w, bool bf, int i, __mmask32 m)
{
    if (bf)
        return _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(m, w + i));
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16((__mmask16)m, w + i));
}

KF_INLINE __m512 kf_x(const void *x, bool bf, int i, __mmask32 m)
{
    if (bf)
        return _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(m, (const uint16_t *)x + i));
    return _mm512_maskz_loadu_ps((__mmask16)m, (const float *)x + i);
}

KF_INLINE __m512 kf_madd(__m512 acc, __m512 w, __m512 x, bool bf)
{
    if (bf)
        return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)x);
    return _mm512_fmadd_ps(w, x, acc);
}

KF_INLINE void kf_tile(const char *w, size_t ws, int WR, const char *x, size_t xs, int XR, bool bf, int n,
                       float *y, size_t ys)
{
    const int step = kf_step(bf);
    __m512 a[4][4];
#pragma GCC unroll 4
    for (int o = 0; o < WR; o++)
#pragma GCC unroll 4
        for (int r = 0; r < XR; r++)
            a[o][r] = _mm512_setzero_ps();
    for (int i = 0; i < n; i += step) {
        const __mmask32 m = n - i >= step ? (__mmask32)-1 : (__mmask32)((1u << (n - i)) - 1);
        __m512 xv[4];
#pragma GCC unroll 4
        for (int r = 0; r < XR; r++)
            xv[r] = kf_x(x + (size_t)r * xs, bf, i, m);
#pragma GCC unroll 4
        for (int o = 0; o < WR; o++) {
            const __m512 wv = kf_w((const uint16_t *)(w + (size_t)o * ws), bf, i, m);
#pragma GCC unroll 4
            for (int r = 0; r < XR; r++)
                a[o][r] = kf_madd(a[o][r], wv, xv[r], bf);
        }
    }
#pragma GCC unroll 4
    for (int o = 0; o < WR; o++)
#pragma GCC unroll 4
        for (int r = 0; r < XR; r++)
            y[(size_t)r * ys + o] = _mm512_reduce_add_ps(a[o][r]);
}

/* One activation row (decode) against 16 weight rows: a tile of 4 x 1 has
 * only 4 chains, fewer than the multiply-add latency hides, with each
 * weight used once. 16 chains: F16 decode 1.33x, BF16 1.55x the bytes per
 * CPU-second (bench/RESULTS.md). Each pair's arithmetic is kf_tile's, so
 * its bits do not change with the batch. */
KF_INLINE void kf_rows16(const char *w, size_t ws, const char *x, bool bf, int n, float *y)
{
    const int step = kf_step(bf);
    __m512 a[16];
#pragma GCC unroll 16
    for (int o = 0; o < 16; o++)
        a[o] = _mm512_setzero_ps();
    for (int i = 0; i < n; i += step) {
        const __mmask32 m = n - i >= step ? (__mmask32)-1 : (__mmask32)((1u << (n - i)) - 1);
        const __m512 xv = kf_x(x, bf, i, m);
#pragma GCC unroll 16
        for (int o = 0; o < 16; o++)
            a[o] = kf_madd(a[o], kf_w((const uint16_t *)(w + (size_t)o * ws), bf, i, m), xv, bf);
    }
#pragma GCC unroll 16
    for (int o = 0; o < 16; o++)
        y[o] = _mm512_reduce_add_ps(a[o]);
}

KF_INLINE void kf_gemm(bool bf, const void *w, size_t ws, int n_w, const void *x, size_t xs, int nr, int n,
                       float *y, size_t ys)
{
    int o = 0;
    if (nr == 1)
        for (; o + 16 <= n_w; o += 16)
            kf_rows16((const char *)w + (size_t)o * ws, ws, x, bf, n, y + o);
    w = (const char *)w + (size_t)o * ws;
    y += o;
    n_w -= o;
#define KF_TILE(wo, a, xr, b, yo) kf_tile(wo, ws, a, xr, xs, b, bf, n, yo, ys)
    X86_FLOAT_TILES(4, w, ws, n_w, x, xs, nr, y, ys, KF_TILE)
#undef KF_TILE
}

static KF_ATTR void avx512_gemm_f16(const void *w, size_t ws, int n_w, const void *x, size_t xs, int nr, int n,
                                    float *y, size_t ys)
{
    kf_gemm(false, w, ws, n_w, x, xs, nr, n, y, ys);
}

static KF_ATTR void avx512_gemm_bf16(const void *w, size_t ws, int n_w, const void *x, size_t xs, int nr, int n,
                                     float *y, size_t ys)
{
    kf_gemm(true, w, ws, n_w, x, xs, nr, n, y, ys);
}

void kn_x86_float512_fill(kn_ops *ops)
{
    __builtin_cpu_init();
    /* the F16 gemm needs nothing beyond the table's AVX-512 F/BW/VL, but is
     * built with the BF16 target: both come together or not at all */
    if (!__builtin_cpu_supports("avx512bf16"))
        return;
    ops->gemm[KN_TYPE_F16] = avx512_gemm_f16;
    ops->gemm[KN_TYPE_BF16] = avx512_gemm_bf16;
}

#endif
