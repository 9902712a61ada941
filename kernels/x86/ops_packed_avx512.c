/* kernels/x86: the packed gemms of the K-quants (Q2_K..Q6_K), IQ4_XS and
 * the 32-element types Q4_1, Q5_0, Q5_1, IQ4_NL and MXFP4 on AVX-512 VNNI, over
 * rows that kn_pack laid out 16 to a group (kn_pack.h): lane j of every
 * vector is weight row j, so one vpdpbusd of a quad vector (4 quants of
 * each of the 16 rows, unsigned bytes) against the activations' matching
 * dword, broadcast, adds 4 products to each row's sum, and no lanes are
 * ever reduced. Each activation row of a batch (up to KP_KMAX at once)
 * takes the unpacked weights while they are in registers.
 *
 * The arithmetic is the reference's (kn_ref.c), lane by lane: a K-quant
 * super-block's exact integer sums isum = sum_g sc_g * sum_{i in g} q_i x_i
 * (the group dots by vpdpbusd, times the scales by vpmulld) and msum =
 * sum_g m_g * bsum_g (vpdpwssd of the mins against the activations' group
 * sums), then (float)isum * (d * dx) - (float)msum * (dmin * dx) added to
 * the row's running sum; a 32-element block's sumi and quant sum likewise.
 * Where a type's quants carry an offset (Q3_K's 4, Q6_K's 32, IQ4_XS's
 * levels, IQ4_NL's and MXFP4's moved up by 128 to be unsigned, Q5_0's 16), the
 * offset times the group sums comes off the exact integer first. So every
 * row's result has the bits of the reference dot, whatever its batch.
 * Built with -ffp-contract=off: no multiply-add may fuse.
 *
 * The file gets the AVX2 flags from the build; these functions carry their
 * own target attribute, and kn_x86_packed_fill installs them only on a CPU
 * with AVX-512 VNNI, VBMI and GFNI (gf2p8affineqb moves a byte's bit
 * fields in one instruction: a high nibble down, 2-bit fields into place). */
#include "kernels/kn.h"
#include "kernels/kn_pack.h"
#include "kernels/quant_blocks.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "kernels/x86/ops_x86.h"

#define KP_ATTR __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,gfni")))
#define KP_INLINE static inline __attribute__((always_inline)) KP_ATTR

/* Activation rows per pass over the weights, and super-blocks (or blocks)
 * per segment of the activations' precomputed sums. */
#define KP_KMAX 8
#define KP_SEG 16
#define KL_SEG 128

/* acc + a . b (16-bit pairs), b the dword at p broadcast. */
KP_INLINE __m512i kp_dpwssd_bcast(__m512i acc, __m512i a, const void *p)
{
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(a), "m"(*(const int32_t *)p));
    return acc;
}

/* The gf2p8affineqb matrix whose result byte has bits lo_out..lo_out+n-1
 * from the input's bits lo_in..lo_in+n-1, and zeros elsewhere. */
static inline uint64_t kp_gf_move(int lo_out, int n, int lo_in)
{
    uint64_t a = 0;
    for (int i = 0; i < n; i++)
        a |= (uint64_t)(1u << (lo_in + i)) << (8 * (7 - (lo_out + i)));
    return a;
}

KP_INLINE __m512i kp_gf(__m512i v, uint64_t m)
{
    return _mm512_gf2p8affine_epi64_epi8(v, _mm512_set1_epi64((long long)m), 0);
}

KP_INLINE __m512i kp_load(const uint8_t *p)
{
    return _mm512_loadu_si512((const void *)p);
}

/* 16 rows' pairs of bytes at p as 16-bit pairs, zero- or sign-extended. */
KP_INLINE __m512i kp_pairs(const uint8_t *p, bool sign)
{
    const __m256i v = _mm256_loadu_si256((const __m256i *)p);
    return sign ? _mm512_cvtepi8_epi16(v) : _mm512_cvtepu8_epi16(v);
}

/* The pair's first (second) value as int32 lanes. */
KP_INLINE __m512i kp_lo16(__m512i p, bool sign)
{
    return sign ? _mm512_srai_epi32(_mm512_slli_epi32(p, 16), 16) : _mm512_and_si512(p, _mm512_set1_epi32(0xffff));
}

KP_INLINE __m512i kp_hi16(__m512i p, bool sign)
{
    return sign ? _mm512_srai_epi32(p, 16) : _mm512_srli_epi32(p, 16);
}

/* ---- K-quants and IQ4_XS ------------------------------------------------------ */

typedef struct kp_type {
    size_t bytes;       /* packed super-block */
    bool g16;           /* groups of 16 (else of 32) */
    bool has_min;       /* a dmin term */
    bool bs32;          /* the mins/offsets need the activations' sums of 32 */
} kp_type;

KP_INLINE kp_type kp_type_of(kn_type t)
{
    switch (t) {
    case KN_TYPE_Q4_K:
        return (kp_type){KN_PK_Q4K_BYTES, false, true, true};
    case KN_TYPE_Q5_K:
        return (kp_type){KN_PK_Q5K_BYTES, false, true, true};
    case KN_TYPE_Q6_K:
        return (kp_type){KN_PK_Q6K_BYTES, true, false, false};
    case KN_TYPE_Q3_K:
        return (kp_type){KN_PK_Q3K_BYTES, true, false, false};
    case KN_TYPE_Q2_K:
        return (kp_type){KN_PK_Q2K_BYTES, true, true, false};
    default:
        return (kp_type){KN_PK_IQ4XS_BYTES, false, false, true};
    }
}

/* A unit (64 elements) of a packed super-block, unpacked: w[i] its quad i
 * (w[4g..4g+3] group g of its 4 of 16, or w[8g..8g+7] group g of its 2 of
 * 32) as unsigned bytes, s[g] each group's scale as int32 lanes. */
typedef struct kp_unit {
    __m512i w[16];
    __m512i s[4];
} kp_unit;

/* The nib vectors' unit u: low nibbles to w[k], high to w[8 + k]. */
KP_INLINE void kp_nib(const uint8_t *nib, int u, kp_unit *x)
{
    const uint64_t down = kp_gf_move(0, 4, 4);
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        const __m512i v = kp_load(nib + 64 * (8 * u + k));
        x->w[k] = _mm512_and_si512(v, _mm512_set1_epi8(0x0f));
        x->w[8 + k] = kp_gf(v, down);
    }
}

/* w[i] += add where quad 16u + i's hbit mask has the bit. */
KP_INLINE void kp_hbit(const uint8_t *hb, int u, kp_unit *x, int add)
{
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) {
        uint64_t m;
        memcpy(&m, hb + 8 * (16 * u + i), 8);
        x->w[i] = _mm512_mask_add_epi8(x->w[i], (__mmask64)m, x->w[i], _mm512_set1_epi8((char)add));
    }
}

/* The lo2 vectors' unit u: field f of vector 4u + a to w[4f + a]. */
KP_INLINE void kp_lo2(const uint8_t *lo2, int u, kp_unit *x)
{
#pragma GCC unroll 4
    for (int a = 0; a < 4; a++) {
        const __m512i v = kp_load(lo2 + 64 * (4 * u + a));
        x->w[a] = _mm512_and_si512(v, _mm512_set1_epi8(3));
        x->w[4 + a] = kp_gf(v, kp_gf_move(0, 2, 2));
        x->w[8 + a] = kp_gf(v, kp_gf_move(0, 2, 4));
        x->w[12 + a] = kp_gf(v, kp_gf_move(0, 2, 6));
    }
}

/* The q3 vectors' unit u: quads 16u..16u+15 to w[0..15]. */
KP_INLINE void kp_q3(const uint8_t *q3, int u, kp_unit *x)
{
    const __m512i m7 = _mm512_set1_epi8(7);
#pragma GCC unroll 2
    for (int c = 0; c < 2; c++) {
        const uint8_t *v = q3 + 64 * 3 * (2 * u + c);
        const __m512i v0 = kp_load(v), v1 = kp_load(v + 64), v2 = kp_load(v + 128);
        __m512i *w = x->w + 8 * c;
        w[0] = _mm512_and_si512(v0, m7);
        w[1] = kp_gf(v0, kp_gf_move(0, 3, 3));
        w[2] = _mm512_and_si512(v1, m7);
        w[3] = kp_gf(v1, kp_gf_move(0, 3, 3));
        w[4] = _mm512_and_si512(v2, m7);
        w[5] = kp_gf(v2, kp_gf_move(0, 3, 3));
        w[6] = _mm512_or_si512(kp_gf(v0, kp_gf_move(0, 2, 6)), kp_gf(v2, kp_gf_move(2, 1, 6)));
        w[7] = _mm512_or_si512(kp_gf(v1, kp_gf_move(0, 2, 6)), kp_gf(v2, kp_gf_move(2, 1, 7)));
    }
}

KP_INLINE void kp_unpack(kn_type t, const uint8_t *sb, int u, kp_unit *x)
{
    switch (t) {
    case KN_TYPE_Q4_K:
    case KN_TYPE_Q5_K: {
        kp_nib(sb + KN_PK_Q4K_NIB, u, x);
        if (t == KN_TYPE_Q5_K)
            kp_hbit(sb + KN_PK_Q5K_HBIT, u, x, 16);
        const __m512i p = kp_pairs(sb + KN_PK_Q4K_SC + 32 * u, false);
        x->s[0] = kp_lo16(p, false);
        x->s[1] = kp_hi16(p, false);
        return;
    }
    case KN_TYPE_Q6_K: {
        const uint8_t *nib = sb + KN_PK_Q6K_NIB, *hi2 = sb + KN_PK_Q6K_HI2;
        const uint64_t down = kp_gf_move(0, 4, 4);
#pragma GCC unroll 4
        for (int a = 0; a < 4; a++) {
            const __m512i h = kp_load(hi2 + 64 * (4 * u + a));
#pragma GCC unroll 2
            for (int k = a; k < 8; k += 4) {
                const __m512i v = kp_load(nib + 64 * (8 * u + k));
                /* low nibble | field k / 4 at bits 4-5; high nibble | field 2 + k / 4 */
                x->w[k] = _mm512_ternarylogic_epi32(v, kp_gf(h, kp_gf_move(4, 2, 2 * (k / 4))),
                                                    _mm512_set1_epi8(0x0f), 0xec); /* (a & c) | b */
                x->w[8 + k] = _mm512_or_si512(kp_gf(v, down), kp_gf(h, kp_gf_move(4, 2, 2 * (2 + k / 4))));
            }
        }
#pragma GCC unroll 2
        for (int q = 0; q < 2; q++) {
            const __m512i p = kp_pairs(sb + KN_PK_Q6K_SC + 32 * (2 * u + q), true);
            x->s[2 * q] = kp_lo16(p, true);
            x->s[2 * q + 1] = kp_hi16(p, true);
        }
        return;
    }
    case KN_TYPE_Q3_K:
    case KN_TYPE_Q2_K: {
        const bool q3 = t == KN_TYPE_Q3_K;
        if (q3)
            kp_q3(sb + KN_PK_Q3K_Q3, u, x);
        else
            kp_lo2(sb + KN_PK_Q2K_LO2, u, x);
#pragma GCC unroll 2
        for (int q = 0; q < 2; q++) {
            const __m512i p = kp_pairs(sb + (q3 ? KN_PK_Q3K_SC : KN_PK_Q2K_SCM) + 32 * (2 * u + q), q3);
            /* Q2_K's byte holds the min above the scale */
            x->s[2 * q] = q3 ? kp_lo16(p, true) : _mm512_and_si512(p, _mm512_set1_epi32(0xf));
            x->s[2 * q + 1] = q3 ? kp_hi16(p, true) : _mm512_and_si512(_mm512_srli_epi32(p, 16), _mm512_set1_epi32(0xf));
        }
        return;
    }
    default: { /* IQ4_XS: the levels moved up by 128, by table */
        const __m512i lut = _mm512_broadcast_i32x4(_mm_add_epi8(_mm_loadu_si128((const __m128i *)kn_iq4nl_values),
                                                                _mm_set1_epi8((char)0x80)));
        const uint8_t *nib = sb + KN_PK_IQ4XS_NIB;
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const __m512i v = kp_load(nib + 64 * (8 * u + k));
            /* vpermb reads 6 index bits; the table repeats every 16 */
            x->w[k] = _mm512_permutexvar_epi8(v, lut);
            x->w[8 + k] = _mm512_permutexvar_epi8(_mm512_srli_epi16(v, 4), lut);
        }
        const __m512i p = kp_pairs(sb + KN_PK_IQ4XS_SC + 32 * u, true);
        x->s[0] = kp_lo16(p, true);
        x->s[1] = kp_hi16(p, true);
        return;
    }
    }
}

/* The super-block's min (has_min) or offset vectors as 16-bit pairs, one
 * per pair of groups (8 of 16, or 4 of 32), for vpdpwssd against the
 * activations' group sums: mins for msum; offsets negated, which add into
 * isum. */
KP_INLINE int kp_mins(kn_type t, const uint8_t *sb, __m512i *m)
{
    switch (t) {
    case KN_TYPE_Q4_K:
    case KN_TYPE_Q5_K:
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++)
            m[p] = kp_pairs(sb + KN_PK_Q4K_MN + 32 * p, false);
        return 4;
    case KN_TYPE_Q2_K:
#pragma GCC unroll 8
        for (int p = 0; p < 8; p++)
            m[p] = _mm512_srli_epi16(kp_pairs(sb + KN_PK_Q2K_SCM + 32 * p, false), 4);
        return 8;
    case KN_TYPE_Q6_K:
    case KN_TYPE_Q3_K: {
        const bool q6 = t == KN_TYPE_Q6_K;
#pragma GCC unroll 8
        for (int p = 0; p < 8; p++)
            m[p] = _mm512_sub_epi16(_mm512_setzero_si512(),
                                    _mm512_slli_epi16(kp_pairs(sb + (q6 ? KN_PK_Q6K_SC : KN_PK_Q3K_SC) + 32 * p, true),
                                                      q6 ? 5 : 2));
        return 8;
    }
    default: /* IQ4_XS */
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++)
            m[p] = _mm512_sub_epi16(_mm512_setzero_si512(),
                                    _mm512_slli_epi16(kp_pairs(sb + KN_PK_IQ4XS_SC + 32 * p, true), 7));
        return 4;
    }
}

#define KP_X(k) ((const kn_block_q8_K *)((const char *)xq + (size_t)(k)*xs))

/* The activations' sums of each 32, as 16-bit pairs: bs32[k][b][g]. */
typedef struct kp_act {
    int16_t bs32[KP_KMAX][KP_SEG][8];
} kp_act;

/* One unit's share of isum for one activation row's super-block x. */
KP_INLINE __m512i kp_unit_dot(bool g16, const kp_unit *w, const int8_t *x, __m512i isum)
{
    if (g16) {
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            __m512i a = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++)
                a = x86_dpbusd_bcast(a, w->w[4 * g + i], x + 16 * g + 4 * i);
            isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(a, w->s[g]));
        }
        return isum;
    }
#pragma GCC unroll 2
    for (int g = 0; g < 2; g++) {
        __m512i a = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++)
            a = x86_dpbusd_bcast(a, w->w[8 * g + i], x + 32 * g + 4 * i);
        isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(a, w->s[g]));
    }
    return isum;
}

/* n_t (<= 16) rows of one group (g: its first super-block) against K
 * activation rows, super-blocks [b0, b0 + ns); y row k gets (past the
 * first segment, continues) the n_t sums. */
KP_INLINE void kp_tile(kn_type t, const uint8_t *g, int n_t, const void *xq, size_t xs, int K, int b0, int ns,
                       const kp_act *a, float *y, size_t ys)
{
    const kp_type ty = kp_type_of(t);
    const __mmask16 keep = (__mmask16)((1u << n_t) - 1);
    __m512 f[KP_KMAX];
#pragma GCC unroll 8
    for (int k = 0; k < K; k++)
        f[k] = b0 > 0 ? _mm512_maskz_loadu_ps(keep, y + (size_t)k * ys) : _mm512_setzero_ps();
    for (int b = 0; b < ns; b++) {
        const int ib = b0 + b;
        const uint8_t *sb = g + (size_t)ib * ty.bytes;
        /* the next super-block (past the group's end, the next group's) */
        for (size_t l = 0; l < ty.bytes; l += 64)
            _mm_prefetch((const char *)sb + ty.bytes + l, _MM_HINT_T0);
        __m512i isum[KP_KMAX];
#pragma GCC unroll 8
        for (int k = 0; k < K; k++)
            isum[k] = _mm512_setzero_si512();
        for (int u = 0; u < 4; u++) {
            kp_unit w;
            kp_unpack(t, sb, u, &w);
#pragma GCC unroll 8
            for (int k = 0; k < K; k++)
                isum[k] = kp_unit_dot(ty.g16, &w, KP_X(k)[ib].qs + 64 * u, isum[k]);
        }
        __m512i m[8];
        const int nm = kp_mins(t, sb, m);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sb));
        const __m512 dmin = ty.has_min ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sb + 32))) : d;
#pragma GCC unroll 8
        for (int k = 0; k < K; k++) {
            const kn_block_q8_K *x = KP_X(k) + ib;
            const int16_t *bs = ty.bs32 ? a->bs32[k][b] : x->bsums;
            __m512i msum = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int p = 0; p < nm; p++) {
                if (ty.has_min)
                    msum = kp_dpwssd_bcast(msum, m[p], bs + 2 * p);
                else
                    isum[k] = kp_dpwssd_bcast(isum[k], m[p], bs + 2 * p);
            }
            const __m512 dx = _mm512_set1_ps(x->d);
            __m512 s = _mm512_mul_ps(_mm512_cvtepi32_ps(isum[k]), _mm512_mul_ps(d, dx));
            if (ty.has_min)
                s = _mm512_sub_ps(s, _mm512_mul_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(dmin, dx)));
            f[k] = _mm512_add_ps(f[k], s);
        }
    }
#pragma GCC unroll 8
    for (int k = 0; k < K; k++)
        _mm512_mask_storeu_ps(y + (size_t)k * ys, keep, f[k]);
}

KP_INLINE void kp_run(kn_type t, const void *w, int n_w, const void *xq, size_t xs, int K, int nb, float *y,
                      size_t ys)
{
    const kp_type ty = kp_type_of(t);
    const size_t gb = (size_t)nb * ty.bytes;
    kp_act a;
    for (int b0 = 0; b0 < nb; b0 += KP_SEG) {
        const int ns = nb - b0 < KP_SEG ? nb - b0 : KP_SEG;
        if (ty.bs32)
            for (int k = 0; k < K; k++)
                for (int b = 0; b < ns; b++)
                    for (int j = 0; j < 8; j++)
                        a.bs32[k][b][j] =
                            (int16_t)(KP_X(k)[b0 + b].bsums[2 * j] + KP_X(k)[b0 + b].bsums[2 * j + 1]);
        for (int o0 = 0; o0 < n_w; o0 += 16)
            kp_tile(t, (const uint8_t *)w + (size_t)(o0 / 16) * gb, n_w - o0 < 16 ? n_w - o0 : 16, xq, xs, K, b0,
                    ns, &a, y + o0, ys);
    }
}

/* Batches cut into even chunks of at most KP_KMAX rows, K a constant in
 * each call so that the accumulators stay in registers. */
KP_INLINE void kp_gemm(kn_type t, const void *w, int n_w, const void *xq, size_t xs, int nr, int n, float *y,
                       size_t ys)
{
    const int nb = n / KN_QK_K;
    for (int r = 0; r < nr;) {
        const int rest = nr - r, chunks = (rest + KP_KMAX - 1) / KP_KMAX;
        const int K = (rest + chunks - 1) / chunks;
        const char *xr = (const char *)xq + (size_t)r * xs;
        float *yr = y + (size_t)r * ys;
        switch (K) {
#define KP_CASE(k)                                                                                           \
    case k:                                                                                                  \
        kp_run(t, w, n_w, xr, xs, k, nb, yr, ys);                                                            \
        break;
            KP_CASE(1)
            KP_CASE(2)
            KP_CASE(3)
            KP_CASE(4)
            KP_CASE(5)
            KP_CASE(6)
            KP_CASE(7)
            KP_CASE(8)
#undef KP_CASE
        }
        r += K;
    }
}

#define KP_TYPE(T, tn)                                                                                       \
    static KP_ATTR void avx512_gemm_##tn##_packed(const void *w, int n_w, const void *xq, size_t xs, int nr,  \
                                                  int n, float *y, size_t ys)                                \
    {                                                                                                        \
        kp_gemm(KN_TYPE_##T, w, n_w, xq, xs, nr, n, y, ys);                                                  \
    }
KP_TYPE(Q2_K, q2_K)
KP_TYPE(Q3_K, q3_K)
KP_TYPE(Q4_K, q4_K)
KP_TYPE(Q5_K, q5_K)
KP_TYPE(Q6_K, q6_K)
KP_TYPE(IQ4_XS, iq4_xs)
#undef KP_TYPE

/* ---- the 32-element types: Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4 against Q8_0 --------
 * kn_pack_q4_0's scheme (a group's block scales first, then its blocks'
 * quants): per block and activation row, sumi by 8 vpdpbusd (less the
 * offset times the activation block's quant sum, xs), then
 * (float)sumi * (d * dx) + (float)xs * (m * dx) as the reference. MXFP4's
 * d is made from its exponent byte in integer lanes, exactly as
 * kn_e8m0_half makes it, subnormal 2^-128 and 2^-127 included. */

#define KL_KMAX 16
#define KL_X(k) ((const kn_block_q8_0 *)((const char *)xq + (size_t)(k)*xs))

typedef struct kl_act {
    int32_t corr[KL_KMAX][KL_SEG]; /* -offset * xs */
    float xsf[KL_KMAX][KL_SEG];    /* (float)xs, for the min's term */
    float dx[KL_KMAX][KL_SEG];
} kl_act;

KP_INLINE size_t kl_scale_bytes(kn_type t)
{
    return t == KN_TYPE_Q4_1 || t == KN_TYPE_Q5_1 ? KN_PL_SCALE_DM
           : t == KN_TYPE_MXFP4                   ? KN_PL_SCALE_E8
                                                  : KN_PL_SCALE_D;
}

/* The 16 rows' d of a block: halves, or MXFP4's 2^(e - 128) from its
 * exponent bytes (the bits (e - 1) << 23, or for e < 2 the subnormal
 * 0x00200000 << e). */
KP_INLINE __m512 kl_scale(kn_type t, const uint8_t *sc)
{
    if (t != KN_TYPE_MXFP4)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sc));
    const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)sc));
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __m512i sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    const __mmask16 tiny = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(tiny, normal, sub));
}

KP_INLINE size_t kl_quant_bytes(kn_type t)
{
    return t == KN_TYPE_Q5_0 || t == KN_TYPE_Q5_1 ? KN_PL_QUANT_5 : KN_PL_QUANT_4;
}

/* One block's 8 quad vectors, unsigned. */
KP_INLINE void kl_unpack(kn_type t, const uint8_t *q, __m512i *w)
{
    if (t == KN_TYPE_IQ4_NL || t == KN_TYPE_MXFP4) {
        const int8_t *levels = t == KN_TYPE_MXFP4 ? kn_mxfp4_values : kn_iq4nl_values;
        const __m512i lut = _mm512_broadcast_i32x4(
            _mm_add_epi8(_mm_loadu_si128((const __m128i *)levels), _mm_set1_epi8((char)0x80)));
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const __m512i v = kp_load(q + 64 * k);
            w[k] = _mm512_permutexvar_epi8(v, lut);
            w[4 + k] = _mm512_permutexvar_epi8(_mm512_srli_epi16(v, 4), lut);
        }
        return;
    }
    if (t == KN_TYPE_Q5_0 || t == KN_TYPE_Q5_1) {
        /* quad k is a mask away, quad 4 + k two fields put together */
        const __m512i h = kp_load(q + KN_PL_QUANT_4);
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const __m512i v = kp_load(q + 64 * k);
            w[k] = _mm512_and_si512(v, _mm512_set1_epi8(0x1f));
            w[4 + k] = _mm512_or_si512(kp_gf(v, kp_gf_move(0, 3, 5)), kp_gf(h, kp_gf_move(3, 2, 2 * k)));
        }
        return;
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        const __m512i v = kp_load(q + 64 * k);
        w[k] = _mm512_and_si512(v, _mm512_set1_epi8(0x0f));
        w[4 + k] = kp_gf(v, kp_gf_move(0, 4, 4));
    }
}

KP_INLINE void kl_tile(kn_type t, const uint8_t *sc, const uint8_t *q, size_t group_bytes, int nb, int n_t,
                       const void *xq, size_t xs, int K, int b0, int ns, const kl_act *a, float *y, size_t ys)
{
    const bool has_min = t == KN_TYPE_Q4_1 || t == KN_TYPE_Q5_1;
    const bool has_off = t == KN_TYPE_Q5_0 || t == KN_TYPE_IQ4_NL || t == KN_TYPE_MXFP4;
    const size_t sb = kl_scale_bytes(t), qb = kl_quant_bytes(t);
    const __mmask16 keep = (__mmask16)((1u << n_t) - 1);
    __m512 f[KL_KMAX];
#pragma GCC unroll 16
    for (int k = 0; k < K; k++)
        f[k] = b0 > 0 ? _mm512_maskz_loadu_ps(keep, y + (size_t)k * ys) : _mm512_setzero_ps();
    for (int b = 0; b < ns; b++) {
        const int ib = b0 + b;
        const uint8_t *qblk = q + (size_t)ib * qb;
        /* as the Q4_0 p16 gemm: the lines of the block 8 ahead, its scales 16 ahead */
        const char *ahead = x86_p16_ahead((const char *)q, ib, 8, nb, qb, group_bytes);
        for (size_t l = 0; l < qb; l += 64)
            _mm_prefetch(ahead + l, _MM_HINT_T0);
        _mm_prefetch(x86_p16_ahead((const char *)sc, ib, 16, nb, sb, group_bytes), _MM_HINT_T0);
        const __m512 d = kl_scale(t, sc + (size_t)ib * sb);
        const __m512 m = has_min ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sc + (size_t)ib * sb + 32)))
                                 : d;
        __m512i w[8];
        kl_unpack(t, qblk, w);
#pragma GCC unroll 16
        for (int k = 0; k < K; k++) {
            const int8_t *x = (KL_X(k) + ib)->qs;
            /* two chains, so a lone activation row is not one long wait */
            __m512i s0 = x86_dpbusd_bcast(_mm512_setzero_si512(), w[0], x);
            __m512i s1 = x86_dpbusd_bcast(_mm512_setzero_si512(), w[1], x + 4);
#pragma GCC unroll 3
            for (int i = 2; i < 8; i += 2) {
                s0 = x86_dpbusd_bcast(s0, w[i], x + 4 * i);
                s1 = x86_dpbusd_bcast(s1, w[i + 1], x + 4 * i + 4);
            }
            __m512i sumi = _mm512_add_epi32(s0, s1);
            if (has_off)
                sumi = _mm512_add_epi32(sumi, _mm512_set1_epi32(a->corr[k][b]));
            const __m512 dx = _mm512_set1_ps(a->dx[k][b]);
            __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(sumi), _mm512_mul_ps(d, dx));
            if (has_min)
                v = _mm512_add_ps(v, _mm512_mul_ps(_mm512_set1_ps(a->xsf[k][b]), _mm512_mul_ps(m, dx)));
            f[k] = _mm512_add_ps(f[k], v);
        }
    }
#pragma GCC unroll 16
    for (int k = 0; k < K; k++)
        _mm512_mask_storeu_ps(y + (size_t)k * ys, keep, f[k]);
}

KP_INLINE void kl_run(kn_type t, const void *w, int n_w, const void *xq, size_t xs, int K, int nb, float *y,
                      size_t ys)
{
    const size_t sb = kl_scale_bytes(t), qb = kl_quant_bytes(t);
    const size_t quants_at = ((size_t)nb * sb + 63) & ~(size_t)63, gb = quants_at + (size_t)nb * qb;
    const int off = t == KN_TYPE_Q5_0 ? 16 : t == KN_TYPE_IQ4_NL || t == KN_TYPE_MXFP4 ? 128 : 0;
    kl_act a;
    for (int b0 = 0; b0 < nb; b0 += KL_SEG) {
        const int ns = nb - b0 < KL_SEG ? nb - b0 : KL_SEG;
        for (int k = 0; k < K; k++)
            for (int b = 0; b < ns; b++) {
                const kn_block_q8_0 *xb = KL_X(k) + b0 + b;
                const int32_t sum = x86_xsum(xb->qs);
                a.corr[k][b] = -off * sum;
                a.xsf[k][b] = (float)sum;
                a.dx[k][b] = kn_x86_f16_table[xb->d];
            }
        for (int o0 = 0; o0 < n_w; o0 += 16) {
            const uint8_t *g = (const uint8_t *)w + (size_t)(o0 / 16) * gb;
            kl_tile(t, g, g + quants_at, gb, nb, n_w - o0 < 16 ? n_w - o0 : 16, xq, xs, K, b0, ns, &a, y + o0,
                    ys);
        }
    }
}

KP_INLINE void kl_gemm(kn_type t, const void *w, int n_w, const void *xq, size_t xs, int nr, int n, float *y,
                       size_t ys)
{
    const int nb = n / 32;
    for (int r = 0; r < nr;) {
        const int rest = nr - r, chunks = (rest + KL_KMAX - 1) / KL_KMAX;
        const int K = (rest + chunks - 1) / chunks;
        const char *xr = (const char *)xq + (size_t)r * xs;
        float *yr = y + (size_t)r * ys;
        switch (K) {
#define KL_CASE(k)                                                                                           \
    case k:                                                                                                  \
        kl_run(t, w, n_w, xr, xs, k, nb, yr, ys);                                                            \
        break;
            KL_CASE(1)
            KL_CASE(2)
            KL_CASE(3)
            KL_CASE(4)
            KL_CASE(5)
            KL_CASE(6)
            KL_CASE(7)
            KL_CASE(8)
            KL_CASE(9)
            KL_CASE(10)
            KL_CASE(11)
            KL_CASE(12)
            KL_CASE(13)
            KL_CASE(14)
            KL_CASE(15)
            KL_CASE(16)
#undef KL_CASE
        }
        r += K;
    }
}

#define KL_TYPE(T, tn)                                                                                       \
    static KP_ATTR void avx512_gemm_##tn##_packed(const void *w, int n_w, const void *xq, size_t xs, int nr,  \
                                                  int n, float *y, size_t ys)                                \
    {                                                                                                        \
        kl_gemm(KN_TYPE_##T, w, n_w, xq, xs, nr, n, y, ys);                                                  \
    }
KL_TYPE(Q4_1, q4_1)
KL_TYPE(Q5_0, q5_0)
KL_TYPE(Q5_1, q5_1)
KL_TYPE(IQ4_NL, iq4_nl)
KL_TYPE(MXFP4, mxfp4)
#undef KL_TYPE

void kn_x86_packed_fill(kn_ops *ops)
{
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512vbmi") || !__builtin_cpu_supports("gfni"))
        return;
#define KP_SET(T, tn) ops->gemm_packed[KN_TYPE_##T] = avx512_gemm_##tn##_packed;
    KP_SET(Q2_K, q2_K)
    KP_SET(Q3_K, q3_K)
    KP_SET(Q4_K, q4_K)
    KP_SET(Q5_K, q5_K)
    KP_SET(Q6_K, q6_K)
    KP_SET(IQ4_XS, iq4_xs)
    KP_SET(Q4_1, q4_1)
    KP_SET(Q5_0, q5_0)
    KP_SET(Q5_1, q5_1)
    KP_SET(IQ4_NL, iq4_nl)
    KP_SET(MXFP4, mxfp4)
#undef KP_SET
}

#endif
