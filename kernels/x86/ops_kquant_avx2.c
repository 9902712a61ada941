/* kernels/x86: the K-quants (Q2_K..Q6_K) and IQ4_XS against Q8_K
 * activations, Q4_1, Q5_0, Q5_1, IQ4_NL and MXFP4 against Q8_0, the Q8_K and BF16
 * activation quantizers, and the F16 and BF16 weight gemms, on
 * AVX2/FMA/F16C. Built with the AVX2 flags and
 * -ffp-contract=off; reached only through the AVX2 table (and the tables
 * built on it), whose constructor checks the CPU.
 *
 * One kernel serves every K-quant: a weight super-block is unpacked once
 * into its 256 quants as bytes in element order (unsigned, with an offset
 * for Q3_K and Q6_K; IQ4_XS's signed levels), the integer scale of each
 * group of 16 as a 16-bit lane pattern, and the mins (or the offsets times
 * the scales); then every activation row of the batch takes it: per 32
 * quants a vpmaddubsw (byte pairs into 16 bits: at most 2 * 63 * 127) and
 * a vpmaddwd by the group's scales, summed in int32 lanes; the activation
 * block's group sums (bsums) times the mins or offsets by one more
 * vpmaddwd. The super-block's integer sums are exact, as the reference's;
 * they are then scaled in float lanes, d * dx and dmin * dx, with FMA, and
 * the lanes summed once at the end of the row. So the float rounding
 * differs from the reference's (the tests allow for the sums' magnitude),
 * but it is the same for an activation row whatever batch it comes in, and
 * whichever thread: decode's single row and prefill's many run this same
 * loop.
 *
 * The float gemms (F16 weights against F32 activations, BF16 against
 * BF16) likewise keep one chain of eight lanes per (weight row, activation
 * row) and tile 4 weight rows by 3 activation rows in registers: twelve
 * independent chains hide the FMA latency, and a row's arithmetic does not
 * depend on the tile it lands in. */
#include "kernels/kn.h"
#include "kernels/quant_blocks.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "kernels/x86/ops_x86.h"

#define KQ_INLINE static inline __attribute__((always_inline))

/* A weight super-block unpacked (see the top of the file). */
typedef struct kq_super {
    __m256i q[8];  /* elements 32c..32c+31: unsigned quants, or IQ4_XS's signed levels */
    __m256i sc[8]; /* 16-bit scales of chunk c's two groups of 16 */
    __m256i mn;    /* 16-bit mins of the 16 groups, or offset * scale (Q3_K, Q6_K) */
    float d, dmin;
} kq_super;

/* ---- activation quantizers ---------------------------------------------------
 * Q8_K, bit for bit as the reference: the same signed maximum, the same
 * scale -127 / max computed in scalar, the product rounded to nearest even
 * (vcvtps2dq, as lrintf), clamped to 127. */
static void avx2_quantize_q8_K(const float *x, void *vy, int n)
{
    kn_block_q8_K *y = vy;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int ib = 0; ib < n / KN_QK_K; ib++, x += KN_QK_K) {
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < KN_QK_K; j += 8)
            m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + j), absmask));
        __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        s = _mm_max_ps(s, _mm_movehl_ps(s, s));
        s = _mm_max_ss(s, _mm_movehdup_ps(s));
        const float amax = _mm_cvtss_f32(s);
        /* the first element of that magnitude, with its sign: eight at a
         * time, the first lane that equals it */
        float max = 0.0f;
        const __m256 av = _mm256_set1_ps(amax);
        for (int j = 0; j < KN_QK_K; j += 8) {
            const int hit = _mm256_movemask_ps(
                _mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), absmask), av, _CMP_EQ_OQ));
            if (hit) {
                max = x[j + __builtin_ctz((unsigned)hit)];
                break;
            }
        }
        memset(&y[ib], 0, sizeof(y[ib]));
        if (max == 0.0f || !(amax <= 3.4028235e38f))
            continue;
        const float iscale = -127.0f / max;
        const __m256 iv = _mm256_set1_ps(iscale);
        for (int j = 0; j < KN_QK_K; j += 32) {
            const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j), iv));
            const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 8), iv));
            const __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 16), iv));
            const __m256i d = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 24), iv));
            /* packs saturate to [-128, 127], as the clamp does */
            const __m256i p = _mm256_permutevar8x32_epi32(
                _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d)), perm);
            _mm256_storeu_si256((__m256i *)(y[ib].qs + j), p);
            /* group sums: bytes to 16-bit pairs, then pairs of those */
            const __m256i s16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), p);
            const __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
            /* lanes 0-3 group 2k, 4-7 group 2k + 1 */
            __m128i t = _mm_hadd_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
            t = _mm_hadd_epi32(t, t);
            y[ib].bsums[j / 16] = (int16_t)_mm_cvtsi128_si32(t);
            y[ib].bsums[j / 16 + 1] = (int16_t)_mm_extract_epi32(t, 1);
        }
        y[ib].d = 1.0f / iscale;
    }
}

/* BF16, bit for bit as kn_fp32_to_bf16: round to nearest even on the
 * dropped half, NaN kept NaN. */
static void avx2_quantize_bf16(const float *x, void *vy, int n)
{
    uint16_t *y = vy;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(x + i));
        const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
        __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
        const __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
        const __m256i nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f800000));
        r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(64)), nan);
        const __m128i p = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
        _mm_storeu_si128((__m128i *)(y + i), p);
    }
    for (; i < n; i++)
        y[i] = kn_fp32_to_bf16(x[i]);
}

/* ---- K-quant gemm -------------------------------------------------------------- */

/* Q4_K and Q5_K: the 12 bytes as the 8 groups' 6-bit scales (bytes 0-7
 * of the result) and mins (bytes 8-15), by 32-bit word: groups 0-3 are the
 * low 6 bits of words 0 (scales) and 1 (mins); groups 4-7 the nibbles of
 * word 2 with the top 2 bits of words 0 (scales) and 1 (mins) above them. */
KQ_INLINE __m128i kq_k4_scales_mins(const uint8_t *s12)
{
    uint32_t u[4];
    memcpy(u, s12, 12);
    const uint32_t m6 = 0x3f3f3f3f, m4 = 0x0f0f0f0f, m2 = 0x03030303;
    const uint32_t sc_lo = u[0] & m6, mn_lo = u[1] & m6;
    const uint32_t sc_hi = (u[2] & m4) | (((u[0] >> 6) & m2) << 4);
    const uint32_t mn_hi = ((u[2] >> 4) & m4) | (((u[1] >> 6) & m2) << 4);
    return _mm_setr_epi32((int)sc_lo, (int)sc_hi, (int)mn_lo, (int)mn_hi);
}

/* Super-block ib of a row of type t unpacked into u. */
KQ_INLINE void kq_unpack(kn_type t, const void *w, int ib, kq_super *u)
{
    /* the 16 groups' scales and mins (or 0) as signed bytes, and the
     * offset's shift (Q3_K's 4 and Q6_K's 32 times the scale take the
     * place of the mins) */
    __m128i S, M = _mm_setzero_si128();
    int off_shift = -1;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(3);
    switch (t) {
    case KN_TYPE_Q4_K: {
        const kn_block_q4_K *b = (const kn_block_q4_K *)w + ib;
        for (int r = 0; r < 4; r++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * r));
            u->q[2 * r] = _mm256_and_si256(v, m4);
            u->q[2 * r + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        }
        const __m128i sm = kq_k4_scales_mins(b->scales);
        S = _mm_unpacklo_epi8(sm, sm); /* each group of 32's twice */
        M = _mm_unpackhi_epi8(sm, sm);
        u->d = kn_x86_f16_table[b->d];
        u->dmin = kn_x86_f16_table[b->dmin];
        break;
    }
    case KN_TYPE_Q5_K: {
        const kn_block_q5_K *b = (const kn_block_q5_K *)w + ib;
        const __m256i qh = _mm256_loadu_si256((const __m256i *)b->qh);
        for (int r = 0; r < 4; r++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * r));
            for (int k = 0; k < 2; k++) {
                const __m256i bit = _mm256_set1_epi8((char)(1 << (2 * r + k)));
                const __m256i hi = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit),
                                                    _mm256_set1_epi8(0x10));
                const __m256i lo = _mm256_and_si256(k ? _mm256_srli_epi16(v, 4) : v, m4);
                u->q[2 * r + k] = _mm256_or_si256(lo, hi);
            }
        }
        const __m128i sm = kq_k4_scales_mins(b->scales);
        S = _mm_unpacklo_epi8(sm, sm);
        M = _mm_unpackhi_epi8(sm, sm);
        u->d = kn_x86_f16_table[b->d];
        u->dmin = kn_x86_f16_table[b->dmin];
        break;
    }
    case KN_TYPE_Q6_K: {
        const kn_block_q6_K *b = (const kn_block_q6_K *)w + ib;
        const __m256i m30 = _mm256_set1_epi8(0x30);
        for (int h = 0; h < 2; h++) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + 32));
            const __m256i hb = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
            u->q[4 * h] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
            u->q[4 * h + 1] =
                _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
            u->q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hb, m30));
            u->q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                              _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
        }
        S = _mm_loadu_si128((const __m128i *)b->scales);
        off_shift = 5;
        u->d = kn_x86_f16_table[b->d];
        u->dmin = 0.0f;
        break;
    }
    case KN_TYPE_Q3_K: {
        const kn_block_q3_K *b = (const kn_block_q3_K *)w + ib;
        const __m256i hm = _mm256_loadu_si256((const __m256i *)b->hmask);
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * h));
            for (int k = 0; k < 4; k++) {
                const __m256i bit = _mm256_set1_epi8((char)(1 << (4 * h + k)));
                const __m256i hi = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit),
                                                    _mm256_set1_epi8(4));
                u->q[4 * h + k] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 2 * k), m3), hi);
            }
        }
        /* the 6-bit scales by 32-bit word: low nibbles from words 0-1,
         * top 2 bits from word 2, as kn_q3k_scale reads them */
        uint32_t a[3];
        memcpy(a, b->scales, 12);
        const uint32_t m4w = 0x0f0f0f0f, m2w = 0x03030303;
        S = _mm_sub_epi8(_mm_setr_epi32((int)((a[0] & m4w) | (((a[2] >> 0) & m2w) << 4)),
                                        (int)((a[1] & m4w) | (((a[2] >> 2) & m2w) << 4)),
                                        (int)(((a[0] >> 4) & m4w) | (((a[2] >> 4) & m2w) << 4)),
                                        (int)(((a[1] >> 4) & m4w) | (((a[2] >> 6) & m2w) << 4))),
                         _mm_set1_epi8(32));
        off_shift = 2;
        u->d = kn_x86_f16_table[b->d];
        u->dmin = 0.0f;
        break;
    }
    case KN_TYPE_Q2_K: {
        const kn_block_q2_K *b = (const kn_block_q2_K *)w + ib;
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * h));
            for (int k = 0; k < 4; k++)
                u->q[4 * h + k] = _mm256_and_si256(_mm256_srli_epi16(v, 2 * k), m3);
        }
        const __m128i v = _mm_loadu_si128((const __m128i *)b->scales);
        S = _mm_and_si128(v, _mm_set1_epi8(0x0f));
        M = _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0f));
        u->d = kn_x86_f16_table[b->d];
        u->dmin = kn_x86_f16_table[b->dmin];
        break;
    }
    default: { /* IQ4_XS: signed levels by table lookup */
        const kn_block_iq4_xs *b = (const kn_block_iq4_xs *)w + ib;
        const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kn_iq4nl_values));
        int8_t sc[16];
        for (int j = 0; j < 8; j++) {
            const __m128i v = _mm_loadu_si128((const __m128i *)(b->qs + 16 * j));
            const __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), m4);
            u->q[j] = _mm256_shuffle_epi8(lut, nib);
            sc[2 * j] = sc[2 * j + 1] = (int8_t)(kn_iq4xs_scale(j, b) - 32);
        }
        S = _mm_loadu_si128((const __m128i *)sc);
        u->d = kn_x86_f16_table[b->d];
        u->dmin = 0.0f;
        break;
    }
    }
    /* chunk c's scales: groups 2c (the low 128 bits' eight 16-bit lanes)
     * and 2c + 1 (the high ones') */
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) {
        const __m128i idx = _mm_setr_epi8((char)(2 * c), (char)(2 * c), (char)(2 * c), (char)(2 * c), (char)(2 * c),
                                          (char)(2 * c), (char)(2 * c), (char)(2 * c), (char)(2 * c + 1),
                                          (char)(2 * c + 1), (char)(2 * c + 1), (char)(2 * c + 1), (char)(2 * c + 1),
                                          (char)(2 * c + 1), (char)(2 * c + 1), (char)(2 * c + 1));
        u->sc[c] = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(S, idx));
    }
    u->mn = off_shift >= 0 ? _mm256_sll_epi16(_mm256_cvtepi8_epi16(S), _mm_cvtsi32_si128(off_shift))
                           : _mm256_cvtepi8_epi16(M);
}

/* One activation row's super-block against an unpacked weight super-block:
 * the float lanes f advanced by it. */
KQ_INLINE __m256 kq_row(const kq_super *u, bool signed_q, bool has_min, const kn_block_q8_K *x, __m256 f)
{
    __m256i acc = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) {
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * c));
        const __m256i p = signed_q ? _mm256_maddubs_epi16(_mm256_sign_epi8(u->q[c], u->q[c]), _mm256_sign_epi8(xv, u->q[c]))
                                   : _mm256_maddubs_epi16(u->q[c], xv);
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, u->sc[c]));
    }
    const __m256i bm = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)x->bsums), u->mn);
    const __m256 dd = _mm256_set1_ps(u->d * x->d);
    if (has_min)
        return _mm256_fnmadd_ps(_mm256_cvtepi32_ps(bm), _mm256_set1_ps(u->dmin * x->d),
                                _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), dd, f));
    /* the offset's share comes off the exact sum */
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc, bm)), dd, f);
}

/* Activation rows a weight row meets at once: their float lanes stay on
 * the stack, the rows' super-blocks in L1/L2 (a gemm item's 64 rows of a
 * 4096-wide Q8_K row are 74 KiB). */
#define KQ_ROWS 64

KQ_INLINE void kq_gemm(kn_type t, const void *w, size_t ws, int n_w, const void *xq, size_t xs, int nr, int n,
                       float *y, size_t ys)
{
    const bool signed_q = t == KN_TYPE_IQ4_XS;
    const bool has_min = t == KN_TYPE_Q4_K || t == KN_TYPE_Q5_K || t == KN_TYPE_Q2_K;
    const int nb = n / KN_QK_K;
    __m256 f[KQ_ROWS];
    for (int r0 = 0; r0 < nr; r0 += KQ_ROWS) {
        const int rn = nr - r0 < KQ_ROWS ? nr - r0 : KQ_ROWS;
        for (int o = 0; o < n_w; o++) {
            const char *wr = (const char *)w + (size_t)o * ws;
            for (int r = 0; r < rn; r++)
                f[r] = _mm256_setzero_ps();
            for (int ib = 0; ib < nb; ib++) {
                kq_super u;
                /* the next row's super-block, at the same place */
                if (o + 1 < n_w)
                    _mm_prefetch(wr + ws + (size_t)ib * kn_type_block_bytes(t), _MM_HINT_T0);
                kq_unpack(t, wr, ib, &u);
                for (int r = 0; r < rn; r++)
                    f[r] = kq_row(&u, signed_q, has_min,
                                  (const kn_block_q8_K *)((const char *)xq + (size_t)(r0 + r) * xs) + ib, f[r]);
            }
            for (int r = 0; r < rn; r++)
                y[(size_t)(r0 + r) * ys + o] = hsum256(f[r]);
        }
    }
}

#define KQ_TYPE(T, tn)                                                                                       \
    static void avx2_gemm_##tn(const void *w, size_t ws, int n_w, const void *xq, size_t xs, int nr, int n,  \
                               float *y, size_t ys)                                                          \
    {                                                                                                        \
        kq_gemm(KN_TYPE_##T, w, ws, n_w, xq, xs, nr, n, y, ys);                                              \
    }                                                                                                        \
    static void avx2_dot_##tn(const void *w, const void *xq, size_t xs, int nr, int n, float *out)            \
    {                                                                                                        \
        kq_gemm(KN_TYPE_##T, w, 0, 1, xq, xs, nr, n, out, 1);                                                \
    }
KQ_TYPE(Q2_K, q2_K)
KQ_TYPE(Q3_K, q3_K)
KQ_TYPE(Q4_K, q4_K)
KQ_TYPE(Q5_K, q5_K)
KQ_TYPE(Q6_K, q6_K)
KQ_TYPE(IQ4_XS, iq4_xs)
#undef KQ_TYPE

/* ---- the 32-element types: Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4 against Q8_0 ----
 * The same scheme a block at a time: the block's 32 quants as bytes
 * (unsigned for Q4_1 and Q5_1, signed for Q5_0's q - 16 and IQ4_NL's
 * levels), the exact integer dot in int32 lanes, scaled by d * dx in float
 * lanes; Q4_1's and Q5_1's min times the activation block's exact quant
 * sum goes to a second, scalar sum in block order. */

/* The 32 fifth bits of qh as bytes 0x10 or 0. */
KQ_INLINE __m256i kl_bits5(const uint8_t *qh)
{
    uint32_t h;
    memcpy(&h, qh, 4);
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)h),
        _mm256_setr_epi64x(0, 0x0101010101010101ll, 0x0202020202020202ll, 0x0303030303030303ll));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

KQ_INLINE __m256i kl_nibbles(const uint8_t *qs)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0x0f));
}

KQ_INLINE __m256i kl_unpack(kn_type t, const void *w, int ib, float *d, float *m)
{
    switch (t) {
    case KN_TYPE_Q4_1: {
        const kn_block_q4_1 *b = (const kn_block_q4_1 *)w + ib;
        *d = kn_x86_f16_table[b->d];
        *m = kn_x86_f16_table[b->m];
        return kl_nibbles(b->qs);
    }
    case KN_TYPE_Q5_0: {
        const kn_block_q5_0 *b = (const kn_block_q5_0 *)w + ib;
        *d = kn_x86_f16_table[b->d];
        return _mm256_sub_epi8(_mm256_or_si256(kl_nibbles(b->qs), kl_bits5(b->qh)), _mm256_set1_epi8(16));
    }
    case KN_TYPE_Q5_1: {
        const kn_block_q5_1 *b = (const kn_block_q5_1 *)w + ib;
        *d = kn_x86_f16_table[b->d];
        *m = kn_x86_f16_table[b->m];
        return _mm256_or_si256(kl_nibbles(b->qs), kl_bits5(b->qh));
    }
    case KN_TYPE_MXFP4: { /* E2M1's doubled levels, like IQ4_NL's through a table */
        const kn_block_mxfp4 *b = (const kn_block_mxfp4 *)w + ib;
        *d = kn_e8m0_half(b->e);
        return _mm256_shuffle_epi8(
            _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kn_mxfp4_values)), kl_nibbles(b->qs));
    }
    default: { /* IQ4_NL */
        const kn_block_iq4_nl *b = (const kn_block_iq4_nl *)w + ib;
        *d = kn_x86_f16_table[b->d];
        return _mm256_shuffle_epi8(
            _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kn_iq4nl_values)), kl_nibbles(b->qs));
    }
    }
}

/* The activation terms of a block: its scale, and its quant sum as a float
 * (for Q4_1's and Q5_1's min). Looked up in tab when the call filled one,
 * else computed where they are needed. */
KQ_INLINE void kl_xterms(const kn_block_q8_0 *xb, const float *tab, size_t at, bool has_min, float *dx,
                         float *xsf)
{
    if (tab != NULL) {
        *dx = tab[2 * at];
        *xsf = tab[2 * at + 1];
        return;
    }
    *dx = kn_x86_f16_table[xb->d];
    *xsf = has_min ? (float)x86_xsum(xb->qs) : 0.0f;
}

/* (row, block) pairs of activation terms a call computes once for all its
 * weight rows: the quant sum cost as much as the dot itself when every
 * weight row took it again. 32 KiB on the stack. */
#define KL_TAB 4096

/* WR (1 or 2) weight rows from wr against rn activation rows from x: both
 * rows' chains in flight at once, and each activation load serves both. */
KQ_INLINE void kl_pass(kn_type t, int WR, const char *wr, size_t ws, bool pf_next, const char *x, size_t xs,
                       int rn, int nb, const float *tab, float *y, size_t ys)
{
    const bool signed_q = t == KN_TYPE_Q5_0 || t == KN_TYPE_IQ4_NL || t == KN_TYPE_MXFP4;
    const bool has_min = t == KN_TYPE_Q4_1 || t == KN_TYPE_Q5_1;
    const size_t bb = kn_type_block_bytes(t);
    __m256 f[2][KQ_ROWS];
    float g[2][KQ_ROWS];
    for (int r = 0; r < rn; r++)
#pragma GCC unroll 2
        for (int o = 0; o < WR; o++) {
            f[o][r] = _mm256_setzero_ps();
            g[o][r] = 0.0f;
        }
    for (int ib = 0; ib < nb; ib++) {
        float d[2], m[2] = {0.0f, 0.0f};
        __m256i q[2], aq[2];
#pragma GCC unroll 2
        for (int o = 0; o < WR; o++) {
            const char *wo = wr + (size_t)o * ws;
            if (pf_next && ib % 4 == 0)
                _mm_prefetch(wo + (size_t)WR * ws + (size_t)ib * bb, _MM_HINT_T0);
            q[o] = kl_unpack(t, wo, ib, &d[o], &m[o]);
            aq[o] = signed_q ? _mm256_sign_epi8(q[o], q[o]) : q[o];
        }
        for (int r = 0; r < rn; r++) {
            const kn_block_q8_0 *xb = (const kn_block_q8_0 *)(x + (size_t)r * xs) + ib;
            const __m256i xv = _mm256_loadu_si256((const __m256i *)xb->qs);
            float dx, xsf;
            kl_xterms(xb, tab, (size_t)r * nb + ib, has_min, &dx, &xsf);
#pragma GCC unroll 2
            for (int o = 0; o < WR; o++) {
                const __m256i p = _mm256_maddubs_epi16(aq[o], signed_q ? _mm256_sign_epi8(xv, q[o]) : xv);
                const __m256i acc = _mm256_madd_epi16(p, _mm256_set1_epi16(1));
                f[o][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_set1_ps(d[o] * dx), f[o][r]);
                if (has_min)
                    g[o][r] += xsf * (m[o] * dx);
            }
        }
    }
    for (int r = 0; r < rn; r++)
#pragma GCC unroll 2
        for (int o = 0; o < WR; o++)
            y[(size_t)r * ys + o] = hsum256(f[o][r]) + g[o][r];
}

KQ_INLINE void kl_gemm(kn_type t, const void *w, size_t ws, int n_w, const void *xq, size_t xs, int nr, int n,
                       float *y, size_t ys)
{
    const bool has_min = t == KN_TYPE_Q4_1 || t == KN_TYPE_Q5_1;
    const int nb = n / 32;
    /* as many activation rows a chunk as the table holds whole (rows too
     * long for one leave it unused) */
    const int fit = nb > 0 ? KL_TAB / nb : KQ_ROWS, rmax = fit < 1 ? KQ_ROWS : fit < KQ_ROWS ? fit : KQ_ROWS;
    float tab[2 * KL_TAB];
    for (int r0 = 0; r0 < nr; r0 += rmax) {
        const int rn = nr - r0 < rmax ? nr - r0 : rmax;
        const char *x = (const char *)xq + (size_t)r0 * xs;
        if (fit >= 1)
            for (int r = 0; r < rn; r++)
                for (int ib = 0; ib < nb; ib++) {
                    const kn_block_q8_0 *xb = (const kn_block_q8_0 *)(x + (size_t)r * xs) + ib;
                    kl_xterms(xb, NULL, 0, has_min, &tab[2 * ((size_t)r * nb + ib)],
                              &tab[2 * ((size_t)r * nb + ib) + 1]);
                }
        const float *tp = fit >= 1 ? tab : NULL;
        float *yr = y + (size_t)r0 * ys;
        int o = 0;
        for (; o + 2 <= n_w; o += 2)
            kl_pass(t, 2, (const char *)w + (size_t)o * ws, ws, o + 2 < n_w, x, xs, rn, nb, tp, yr + o, ys);
        if (o < n_w)
            kl_pass(t, 1, (const char *)w + (size_t)o * ws, ws, false, x, xs, rn, nb, tp, yr + o, ys);
    }
}

/* ---- Q4_1 and Q5_1: eight weight rows a tile, as Q4_0's mv path --------------
 * (qdot_x86.h) lays them out: rows p and p + 4 share a register, their
 * elements 0..15 in one and 16..31 in another, against the activation
 * block's halves broadcast; four such partial-sum vectors reduce to the
 * eight rows' block sums, and the float work is done once for eight rows:
 * (float)sumi * (d * dx) + (float)xs * (m * dx), each rounded, added in
 * block order, the reference's steps, so these gemms give its bits. The
 * quants (at most 31) are the unsigned side of vpmaddubsw: four products
 * of at most 31 * 128 fit an int16 lane. One load and unpacking of the
 * weights serves up to KM_KMAX activation rows. */
#define KM_KMAX 8
#define KM_SEG 128

typedef struct km_act {
    float dx[KM_KMAX][KM_SEG];
    float xsf[KM_KMAX][KM_SEG];
} km_act;

/* Block ib of weight rows a and b (row starts): lo holds elements 0..15
 * of a then of b, hi elements 16..31, as unsigned bytes. */
KQ_INLINE void km_wpair(bool q5, const char *a, const char *b, int ib, __m256i *lo, __m256i *hi)
{
    const kn_block_q5_1 *a5 = (const kn_block_q5_1 *)a + ib, *b5 = (const kn_block_q5_1 *)b + ib;
    const uint8_t *qa = q5 ? a5->qs : ((const kn_block_q4_1 *)a + ib)->qs;
    const uint8_t *qb = q5 ? b5->qs : ((const kn_block_q4_1 *)b + ib)->qs;
    const __m256i t = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)qa)),
                                              _mm_loadu_si128((const __m128i *)qb), 1);
    *lo = _mm256_and_si256(t, _mm256_set1_epi8(0x0f));
    *hi = _mm256_and_si256(_mm256_srli_epi16(t, 4), _mm256_set1_epi8(0x0f));
    if (q5) { /* both rows' fifth bits spread to bytes 0x10 or 0 at once */
        uint32_t ha, hb;
        memcpy(&ha, a5->qh, 4);
        memcpy(&hb, b5->qh, 4);
        const __m256i h = _mm256_set1_epi64x((long long)((uint64_t)hb << 32 | ha));
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
        const __m256i sl = _mm256_shuffle_epi8(
            h, _mm256_setr_epi64x(0, 0x0101010101010101ll, 0x0404040404040404ll, 0x0505050505050505ll));
        const __m256i sh =
            _mm256_shuffle_epi8(h, _mm256_setr_epi64x(0x0202020202020202ll, 0x0303030303030303ll,
                                                      0x0606060606060606ll, 0x0707070707070707ll));
        const __m256i x10 = _mm256_set1_epi8(0x10);
        *lo = _mm256_or_si256(*lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(sl, bit), bit), x10));
        *hi = _mm256_or_si256(*hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(sh, bit), bit), x10));
    }
}

/* n_t (<= 8) weight rows from w against K activation rows, blocks
 * [b0, b0 + ns); y row r gets (past the first segment, continues) the n_t
 * sums. */
KQ_INLINE void km_tile(bool q5, const char *w, size_t ws, int n_t, const void *xq, size_t xs, int K, int b0,
                       int ns, const km_act *a, float *y, size_t ys)
{
    const char *wr[8];
    uint16_t dh[8], mh[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) /* missing rows repeat row 0, unstored */
        wr[j] = w + (size_t)(j < n_t ? j : 0) * ws;
    const size_t bb = q5 ? sizeof(kn_block_q5_1) : sizeof(kn_block_q4_1);
    const __m256i keep =
        _mm256_cmpgt_epi32(_mm256_set1_epi32(n_t), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256 f[KM_KMAX];
#pragma GCC unroll 8
    for (int r = 0; r < K; r++)
        f[r] = b0 > 0 ? _mm256_maskload_ps(y + (size_t)r * ys, keep) : _mm256_setzero_ps();
    for (int b = 0; b < ns; b++) {
        const int ib = b0 + b;
        /* the next tile's rows, at the same place (about one a line) */
        if ((ib & 1) == 0)
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++)
                _mm_prefetch(wr[j] + 8 * ws + (size_t)ib * bb, _MM_HINT_T0);
        __m256i lo[4], hi[4];
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++)
            km_wpair(q5, wr[p], wr[p + 4], ib, &lo[p], &hi[p]);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) { /* d and m lead both blocks */
            memcpy(&dh[j], wr[j] + (size_t)ib * bb, 2);
            memcpy(&mh[j], wr[j] + (size_t)ib * bb + 2, 2);
        }
        const float *T = kn_x86_f16_table;
        const __m256 dwv =
            _mm256_setr_ps(T[dh[0]], T[dh[1]], T[dh[2]], T[dh[3]], T[dh[4]], T[dh[5]], T[dh[6]], T[dh[7]]);
        const __m256 mwv =
            _mm256_setr_ps(T[mh[0]], T[mh[1]], T[mh[2]], T[mh[3]], T[mh[4]], T[mh[5]], T[mh[6]], T[mh[7]]);
#pragma GCC unroll 8
        for (int r = 0; r < K; r++) {
            const kn_block_q8_0 *xb = (const kn_block_q8_0 *)((const char *)xq + (size_t)r * xs) + ib;
            const __m256i xl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)xb->qs));
            const __m256i xh = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(xb->qs + 16)));
            __m256i c[4];
#pragma GCC unroll 4
            for (int p = 0; p < 4; p++)
                c[p] = _mm256_madd_epi16(
                    _mm256_add_epi16(_mm256_maddubs_epi16(lo[p], xl), _mm256_maddubs_epi16(hi[p], xh)),
                    _mm256_set1_epi16(1));
            const __m256i v = x86_reduce8(c[0], c[1], c[2], c[3]);
            const __m256 dx = _mm256_set1_ps(a->dx[r][b]);
            const __m256 t =
                _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(v), _mm256_mul_ps(dwv, dx)),
                              _mm256_mul_ps(_mm256_set1_ps(a->xsf[r][b]), _mm256_mul_ps(mwv, dx)));
            f[r] = _mm256_add_ps(f[r], t);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < K; r++)
        _mm256_maskstore_ps(y + (size_t)r * ys, keep, f[r]);
}

KQ_INLINE void km_run(bool q5, const void *w, size_t ws, int n_w, const void *xq, size_t xs, int K, int nb,
                      float *y, size_t ys)
{
    km_act a;
    for (int b0 = 0; b0 < nb; b0 += KM_SEG) {
        const int ns = nb - b0 < KM_SEG ? nb - b0 : KM_SEG;
        for (int r = 0; r < K; r++)
            for (int b = 0; b < ns; b++)
                kl_xterms((const kn_block_q8_0 *)((const char *)xq + (size_t)r * xs) + b0 + b, NULL, 0, true,
                          &a.dx[r][b], &a.xsf[r][b]);
        for (int o0 = 0; o0 < n_w; o0 += 8)
            km_tile(q5, (const char *)w + (size_t)o0 * ws, ws, n_w - o0 < 8 ? n_w - o0 : 8, xq, xs, K, b0, ns,
                    &a, y + o0, ys);
    }
}

/* Batches cut into even chunks of at most KM_KMAX rows, K a constant in
 * each call so that the accumulators stay in registers. */
KQ_INLINE void km_gemm(bool q5, const void *w, size_t ws, int n_w, const void *xq, size_t xs, int nr, int n,
                       float *y, size_t ys)
{
    for (int r = 0; r < nr;) {
        const int rest = nr - r, chunks = (rest + KM_KMAX - 1) / KM_KMAX;
        const int K = (rest + chunks - 1) / chunks;
        const char *xr = (const char *)xq + (size_t)r * xs;
        float *yr = y + (size_t)r * ys;
        switch (K) {
#define KM_CASE(k)                                                                                           \
    case k:                                                                                                  \
        km_run(q5, w, ws, n_w, xr, xs, k, n / 32, yr, ys);                                                   \
        break;
            KM_CASE(1)
            KM_CASE(2)
            KM_CASE(3)
            KM_CASE(4)
            KM_CASE(5)
            KM_CASE(6)
            KM_CASE(7)
            KM_CASE(8)
#undef KM_CASE
        }
        r += K;
    }
}

static void avx2_gemm_q4_1_mv(const void *w, size_t ws, int n_w, const void *xq, size_t xs, int nr, int n,
                              float *y, size_t ys)
{
    km_gemm(false, w, ws, n_w, xq, xs, nr, n, y, ys);
}

static void avx2_gemm_q5_1_mv(const void *w, size_t ws, int n_w, const void *xq, size_t xs, int nr, int n,
                              float *y, size_t ys)
{
    km_gemm(true, w, ws, n_w, xq, xs, nr, n, y, ys);
}

#define KL_TYPE(T, tn)                                                                                       \
    static void avx2_gemm_##tn(const void *w, size_t ws, int n_w, const void *xq, size_t xs, int nr, int n,  \
                               float *y, size_t ys)                                                          \
    {                                                                                                        \
        kl_gemm(KN_TYPE_##T, w, ws, n_w, xq, xs, nr, n, y, ys);                                              \
    }                                                                                                        \
    static void avx2_dot_##tn(const void *w, const void *xq, size_t xs, int nr, int n, float *out)            \
    {                                                                                                        \
        kl_gemm(KN_TYPE_##T, w, 0, 1, xq, xs, nr, n, out, 1);                                                \
    }
KL_TYPE(Q4_1, q4_1)
KL_TYPE(Q5_0, q5_0)
KL_TYPE(Q5_1, q5_1)
KL_TYPE(IQ4_NL, iq4_nl)
KL_TYPE(MXFP4, mxfp4)
#undef KL_TYPE

/* ---- F16 and BF16 gemm ------------------------------------------------------------ */

/* Eight weights of row w at i as floats: halves, or bfloat16 (the top of a
 * float: a shift). */
KQ_INLINE __m256 kf_w8(const void *w, bool bf, int i)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
    if (bf)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
    return _mm256_cvtph_ps(v);
}

KQ_INLINE float kf_w1(const void *w, bool bf, int i)
{
    const uint16_t v = ((const uint16_t *)w)[i];
    return bf ? kn_bf16_to_fp32(v) : kn_x86_f16_table[v];
}

/* Eight activations of row x at i as floats (F32, or BF16 for BF16). */
KQ_INLINE __m256 kf_x8(const void *x, bool bf, int i)
{
    return bf ? kf_w8(x, true, i) : _mm256_loadu_ps((const float *)x + i);
}

KQ_INLINE float kf_x1(const void *x, bool bf, int i)
{
    return bf ? kn_bf16_to_fp32(((const uint16_t *)x)[i]) : ((const float *)x)[i];
}

/* WR x XR tile: one chain per (weight row, activation row), the scalar
 * tail and the lane sum in a fixed order. */
KQ_INLINE void kf_tile(const char *w, size_t ws, int WR, const char *x, size_t xs, int XR, bool bf, int n,
                       float *y, size_t ys)
{
    __m256 a[4][4]; /* 4 x 3 used: the shared tile walk names 4 x 4 too */
#pragma GCC unroll 4
    for (int o = 0; o < WR; o++)
#pragma GCC unroll 3
        for (int r = 0; r < XR; r++)
            a[o][r] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 xv[3];
#pragma GCC unroll 3
        for (int r = 0; r < XR; r++)
            xv[r] = kf_x8(x + (size_t)r * xs, bf, i);
#pragma GCC unroll 4
        for (int o = 0; o < WR; o++) {
            const __m256 wv = kf_w8(w + (size_t)o * ws, bf, i);
#pragma GCC unroll 3
            for (int r = 0; r < XR; r++)
                a[o][r] = _mm256_fmadd_ps(wv, xv[r], a[o][r]);
        }
    }
#pragma GCC unroll 4
    for (int o = 0; o < WR; o++)
#pragma GCC unroll 3
        for (int r = 0; r < XR; r++) {
            float s = hsum256(a[o][r]);
            for (int k = i; k < n; k++)
                s += kf_w1(w + (size_t)o * ws, bf, k) * kf_x1(x + (size_t)r * xs, bf, k);
            y[(size_t)r * ys + o] = s;
        }
}

KQ_INLINE void kf_gemm(bool bf, const void *w, size_t ws, int n_w, const void *x, size_t xs, int nr, int n,
                       float *y, size_t ys)
{
#define KF_TILE(wo, a, xr, b, yo) kf_tile(wo, ws, a, xr, xs, b, bf, n, yo, ys)
    X86_FLOAT_TILES(3, w, ws, n_w, x, xs, nr, y, ys, KF_TILE)
#undef KF_TILE
}

static void avx2_gemm_f16(const void *w, size_t ws, int n_w, const void *x, size_t xs, int nr, int n, float *y,
                          size_t ys)
{
    kf_gemm(false, w, ws, n_w, x, xs, nr, n, y, ys);
}

static void avx2_gemm_bf16(const void *w, size_t ws, int n_w, const void *x, size_t xs, int nr, int n, float *y,
                           size_t ys)
{
    kf_gemm(true, w, ws, n_w, x, xs, nr, n, y, ys);
}

static void avx2_dot_bf16(const void *w, const void *x, size_t xs, int nr, int n, float *out)
{
    kf_gemm(true, w, 0, 1, x, xs, nr, n, out, 1);
}

void kn_x86_kquant_fill(kn_ops *ops)
{
    ops->quantize[KN_TYPE_Q8_K] = avx2_quantize_q8_K;
    ops->quantize[KN_TYPE_BF16] = avx2_quantize_bf16;
#define KQ_SET(T, tn)                                                                                        \
    ops->dot[KN_TYPE_##T] = avx2_dot_##tn;                                                                   \
    ops->gemm[KN_TYPE_##T] = avx2_gemm_##tn;
    KQ_SET(Q2_K, q2_K)
    KQ_SET(Q3_K, q3_K)
    KQ_SET(Q4_K, q4_K)
    KQ_SET(Q5_K, q5_K)
    KQ_SET(Q6_K, q6_K)
    KQ_SET(IQ4_XS, iq4_xs)
    KQ_SET(Q4_1, q4_1)
    KQ_SET(Q5_0, q5_0)
    KQ_SET(Q5_1, q5_1)
    KQ_SET(IQ4_NL, iq4_nl)
    KQ_SET(MXFP4, mxfp4)
    KQ_SET(BF16, bf16)
#undef KQ_SET
    ops->gemm[KN_TYPE_F16] = avx2_gemm_f16;
    ops->gemm[KN_TYPE_Q4_1] = avx2_gemm_q4_1_mv;
    ops->gemm[KN_TYPE_Q5_1] = avx2_gemm_q5_1_mv;
}

#endif
