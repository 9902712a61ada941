/* kernels/x86: what the x86 backend files share. Internal to kernels/x86;
 * everything else reaches these kernels only through the kn_ops tables. */
#ifndef KN_OPS_X86_H
#define KN_OPS_X86_H

#include <immintrin.h>

/* All 65536 IEEE halves as floats, for block scales: filled by kn_ops_avx2()
 * before it first returns its table. */
extern float kn_x86_f16_table[1 << 16];

/* Fills a table's K-quant, IQ4_XS, BF16 and F16 gemm entries and its Q8_K
 * and BF16 activation quantizers (ops_kquant_avx2.c). */
struct kn_ops;
void kn_x86_kquant_fill(struct kn_ops *ops);
/* Fills an AVX-512 VNNI table's gemm_packed entries of the types beyond
 * Q8_0 and Q4_0 where the CPU has VBMI and GFNI too
 * (ops_packed_avx512.c). */
void kn_x86_packed_fill(struct kn_ops *ops);
/* Fills an AVX2 table's gemm_packed entries of Q5_0, Q5_1, IQ4_NL and
 * MXFP4 (ops_packed_avx2.c). */
void kn_x86_packed_avx2_fill(struct kn_ops *ops);
/* Replaces an AVX-512 table's F16 and BF16 gemms by 512-bit ones where the
 * CPU has AVX512_BF16 (ops_float_avx512.c). */
void kn_x86_float512_fill(struct kn_ops *ops);

/* The float gemms' walk over tiles of up to 4 weight rows by XMAX (<= 4)
 * activation rows: TILE(wo, a, xr, b, yo) for each, with a and b constants
 * (the tile's weight rows at wo, activation rows at xr, outputs at yo), so
 * that a tile's accumulators stay in registers. */
#define X86_TILE_CASE(a, b, XMAX, TILE)                                                                      \
    if (wr_n == (a) && xr_n == (b) && (b) <= (XMAX)) {                                                       \
        TILE(wo, a, xr, b, yo);                                                                              \
        continue;                                                                                            \
    }
#define X86_TILE_ROW(a, XMAX, TILE)                                                                          \
    X86_TILE_CASE(a, 4, XMAX, TILE) X86_TILE_CASE(a, 3, XMAX, TILE) X86_TILE_CASE(a, 2, XMAX, TILE)          \
        X86_TILE_CASE(a, 1, XMAX, TILE)
#define X86_FLOAT_TILES(XMAX, w, ws, n_w, x, xs, nr, y, ys, TILE)                                            \
    for (int r_ = 0; r_ < (nr); r_ += (XMAX)) {                                                              \
        const int xr_n = (nr)-r_ < (XMAX) ? (nr)-r_ : (XMAX);                                                \
        const char *xr = (const char *)(x) + (size_t)r_ * (xs);                                              \
        for (int o_ = 0; o_ < (n_w); o_ += 4) {                                                              \
            const int wr_n = (n_w)-o_ < 4 ? (n_w)-o_ : 4;                                                    \
            const char *wo = (const char *)(w) + (size_t)o_ * (ws);                                          \
            float *yo = (y) + (size_t)r_ * (ys) + o_;                                                        \
            X86_TILE_ROW(4, XMAX, TILE)                                                                      \
            X86_TILE_ROW(3, XMAX, TILE) X86_TILE_ROW(2, XMAX, TILE) X86_TILE_ROW(1, XMAX, TILE)              \
        }                                                                                                    \
    }

static inline float hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The 256-bit mv tiles' lane sum (qdot_x86.h's Q4_0 and Q8_0, Q4_1 and
 * Q5_1 in ops_kquant_avx2.c): c_p holds partial sums of tile rows p (low
 * half) and p + 4 (high half); lane j of the result is row j's total. */
static inline __m256i x86_reduce8(__m256i c0, __m256i c1, __m256i c2, __m256i c3)
{
    const __m256i s01 = _mm256_add_epi32(_mm256_unpacklo_epi32(c0, c1), _mm256_unpackhi_epi32(c0, c1));
    const __m256i s23 = _mm256_add_epi32(_mm256_unpacklo_epi32(c2, c3), _mm256_unpackhi_epi32(c2, c3));
    return _mm256_add_epi32(_mm256_unpacklo_epi64(s01, s23), _mm256_unpackhi_epi64(s01, s23));
}

/* Sum of the 32 quants of an activation block (qs: a Q8_0 block's), exact
 * in int32: the offset tricks' correction and the mins' term. */
static inline __attribute__((always_inline)) int32_t x86_xsum(const int8_t *qs)
{
    const __m256i v = _mm256_loadu_si256((const __m256i *)qs);
    const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), v), _mm256_set1_epi16(1));
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
    return _mm_cvtsi128_si32(h);
}

/* For prefetching a packed Q8_0 group (kn_pack_q8_0): block ib + ahead of
 * the run at `base` (the group's scales or its quants, blocks `unit` bytes
 * apart); past the group's end, the same run of the next group. */
static inline const char *x86_p16_ahead(const char *base, int ib, int ahead, int nb, size_t unit,
                                        size_t group_bytes)
{
    const int t = ib + ahead;
    return t < nb ? base + (size_t)t * unit : base + group_bytes + (size_t)(t - nb) * unit;
}

/* acc + u (unsigned bytes) . the four signed bytes at p, broadcast: the
 * dword read by the multiply-add itself ({1to16}). Written out because GCC
 * neither folds a set1 into the embedded broadcast nor keeps it a load: it
 * moved the activations' dwords through general registers, one broadcast
 * uop per multiply-add, and the p16 gemm ran at two thirds of this speed on
 * Zen 4 (bench/RESULTS.md). */
static inline __attribute__((always_inline, target("avx512f,avx512vnni"))) __m512i
x86_dpbusd_bcast(__m512i acc, __m512i u, const void *p)
{
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const int32_t *)p));
    return acc;
}

/* acc + (float)isum * scale for 16 lanes, rounded twice as the reference
 * rounds a Q8_0 block's sum: the barrier keeps the compiler from contracting
 * the two into an FMA. Shared by the AVX-512 and AMX gemms, whose results
 * must stay bit-identical to each other and to the reference. */
static inline __attribute__((always_inline, target("avx512f"))) __m512 x86_block_accum(__m512 acc, __m512i isum,
                                                                                       __m512 scale)
{
    __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), scale);
    __asm__("" : "+v"(t));
    return _mm512_add_ps(acc, t);
}

#endif
