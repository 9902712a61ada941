/* kernels: the AVX-512 VNNI backend. The AVX2 table (with its AVX-VNNI
 * quantized dots where the CPU has them) whose batched entry, the quantized
 * gemm that carries every matmul, is rebuilt on 512-bit vectors. Read the
 * comment of the batched entry in qdot_x86.h first: this is its mv layout,
 * sixteen weight rows wide. With twice the lanes, and 32 registers to hold
 * the accumulators of up to sixteen activation rows while one load and
 * unpacking of the weights serves them all, that one layout measured as fast
 * at every batch width as the 256-bit tables' two, and faster than either
 * below a few dozen rows, where continuous batching decodes.
 *
 * Results are bit-identical to the 256-bit tables and to the reference:
 * each block's exact integer dot, scaled by d_w * d_x and added to the
 * running sum in block order, without FMA.
 *
 * The file gets the AVX2 flags from the build; these functions carry their
 * own target attribute, and kn_ops_avx512vnni() checks the CPU (and that the
 * OS saves the 512-bit state) before any of them can run. */
#include "kernels/kn.h"
#include "kernels/quant_blocks.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "kernels/x86/ops_x86.h"

#define QZ_ATTR __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define QZ_INLINE static inline __attribute__((always_inline)) QZ_ATTR

/* Blocks per segment (longer rows are done a segment at a time, each
 * continuing from the sums the previous one stored, which keeps the block
 * order), and activation rows per pass over the weights. */
#define QZ_MSEG 128
#define QZ_KMAX 16
/* Blocks ahead that the packed gemm prefetches its weights. */
#define QZ_P16_AHEAD 8

enum { QZ_Q8, QZ_Q4, QZ_P16, QZ_P16_Q4 }; /* weight layouts */

#define QZ_X(r) ((const kn_block_q8_0 *)((const char *)xq + (size_t)(r)*xs))

/* ---- mv: lanes = 16 weight rows ---------------------------------------------
 * Rows p, p + 4, p + 8, p + 12 share a register, one per 128-bit lane, as
 * their first (lo) or last (hi) 16 bytes, against the activation block's
 * halves broadcast to the four lanes; four such partial-sum vectors reduce
 * to the sixteen rows' block sums in nine instructions. */

typedef struct qz_act {
    int32_t corr[QZ_KMAX][QZ_MSEG]; /* -off * sum(x) per block */
    float dx[QZ_KMAX][QZ_MSEG];
} qz_act;

/* The segment's activation terms: corr, the zero-point correction, and the
 * scales. */
QZ_INLINE void qz_act_fill(qz_act *a, const void *xq, size_t xs, int K, int b0, int ns, int off)
{
    for (int r = 0; r < K; r++) {
        for (int b = 0; b < ns; b++) {
            const kn_block_q8_0 *xb = QZ_X(r) + b0 + b;
            a->corr[r][b] = -off * x86_xsum(xb->qs);
            a->dx[r][b] = kn_x86_f16_table[xb->d];
        }
    }
}

/* 16 bytes from each of a, b, c, d, in that lane order. */
QZ_INLINE __m512i qz_load4(const void *a, const void *b, const void *c, const void *d)
{
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)a));
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)b), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)c), 2);
    return _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)d), 3);
}

/* c_p holds partial sums of rows p + 4L in lane L; lane j of the result is
 * row j's total. */
QZ_INLINE __m512i qz_reduce(__m512i c0, __m512i c1, __m512i c2, __m512i c3)
{
    const __m512i s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(c0, c1), _mm512_unpackhi_epi32(c0, c1));
    const __m512i s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(c2, c3), _mm512_unpackhi_epi32(c2, c3));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
}

/* n_t (<= 16) weight rows from w against K activation rows, blocks
 * [b0, b0 + ns); y row r gets (past the first segment, continues) the n_t
 * sums. vidx: lane j, row j's offset from w (0 for missing rows). */
QZ_INLINE void qz_mv_tile(const char *w, size_t ws, int n_t, bool q4, const void *xq, size_t xs, int K,
                          int b0, int ns, const qz_act *a, __m512i vidx, float *y, size_t ys)
{
    const char *wr[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++) /* missing rows repeat row 0, unstored */
        wr[j] = w + (size_t)(j < n_t ? j : 0) * ws;
    const size_t bsz = q4 ? sizeof(kn_block_q4_0) : sizeof(kn_block_q8_0);
    const int pf_every = q4 ? 3 : 1; /* about one prefetch per cache line */
    const __mmask16 keep = (__mmask16)((1u << n_t) - 1);
    __m512 f[QZ_KMAX];
#pragma GCC unroll 16
    for (int r = 0; r < K; r++)
        f[r] = b0 > 0 ? _mm512_maskz_loadu_ps(keep, y + (size_t)r * ys) : _mm512_setzero_ps();
    for (int b = 0; b < ns; b++) {
        const int ib = b0 + b;
        const size_t at = (size_t)ib * bsz;
        /* The next tile's rows, at the same place: the sixteen rows advance
         * together, so a fixed distance ahead within a row would land in
         * this tile's own rows when rows are short. */
        if ((ib & pf_every) == 0) {
#pragma GCC unroll 16
            for (int j = 0; j < 16; j++)
                _mm_prefetch(wr[j] + 16 * ws + at, _MM_HINT_T0);
        }
        __m512i lo[4], hi[4];
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            const int o = 2; /* the quants follow the 16-bit scale */
            if (q4) {
                const __m512i t =
                    qz_load4(wr[p] + at + o, wr[p + 4] + at + o, wr[p + 8] + at + o, wr[p + 12] + at + o);
                lo[p] = _mm512_and_si512(t, _mm512_set1_epi8(0x0f));
                hi[p] = _mm512_and_si512(_mm512_srli_epi16(t, 4), _mm512_set1_epi8(0x0f));
            } else {
                lo[p] = _mm512_xor_si512(
                    qz_load4(wr[p] + at + o, wr[p + 4] + at + o, wr[p + 8] + at + o, wr[p + 12] + at + o),
                    _mm512_set1_epi8((char)0x80));
                hi[p] = _mm512_xor_si512(qz_load4(wr[p] + at + o + 16, wr[p + 4] + at + o + 16,
                                                  wr[p + 8] + at + o + 16, wr[p + 12] + at + o + 16),
                                         _mm512_set1_epi8((char)0x80));
            }
        }
        /* the sixteen scales: one gather of the dwords that begin the
         * blocks, their low halves converted (rows too long for the gather's
         * 32-bit offsets, 128 MiB, take them one by one) */
        __m512 dwv;
        if (ws <= INT32_MAX / 16) {
            const __m512i dg = _mm512_i32gather_epi32(vidx, w + at, 1);
            dwv = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dg));
        } else {
            _Alignas(64) float d[16];
            for (int j = 0; j < 16; j++) {
                uint16_t h;
                memcpy(&h, wr[j] + at, sizeof(h));
                d[j] = kn_x86_f16_table[h];
            }
            dwv = _mm512_load_ps(d);
        }
#pragma GCC unroll 16
        for (int r = 0; r < K; r++) {
            const kn_block_q8_0 *xb = QZ_X(r) + ib;
            const __m512i xl = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)xb->qs));
            const __m512i xh = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(xb->qs + 16)));
            __m512i c[4];
#pragma GCC unroll 4
            for (int p = 0; p < 4; p++)
                c[p] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[p], xl), hi[p], xh);
            const __m512i v =
                _mm512_add_epi32(qz_reduce(c[0], c[1], c[2], c[3]), _mm512_set1_epi32(a->corr[r][b]));
            f[r] = x86_block_accum(f[r], v, _mm512_mul_ps(dwv, _mm512_set1_ps(a->dx[r][b])));
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < K; r++)
        _mm512_mask_storeu_ps(y + (size_t)r * ys, keep, f[r]);
}

QZ_INLINE void qz_mv_run(const char *w, size_t ws, int n_w, bool q4, const void *xq, size_t xs, int K, int nb,
                         float *y, size_t ys)
{
    qz_act a;
    for (int b0 = 0; b0 < nb; b0 += QZ_MSEG) {
        const int ns = nb - b0 < QZ_MSEG ? nb - b0 : QZ_MSEG;
        qz_act_fill(&a, xq, xs, K, b0, ns, q4 ? 8 : 128);
        for (int o0 = 0; o0 < n_w; o0 += 16) {
            const int n_t = n_w - o0 < 16 ? n_w - o0 : 16;
            /* row offsets for the scales' gather (unused past 128 MiB rows) */
            const __m512i j = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
            const __m512i vidx = _mm512_mullo_epi32(_mm512_maskz_mov_epi32((__mmask16)((1u << n_t) - 1), j),
                                                    _mm512_set1_epi32((int32_t)(ws & INT32_MAX)));
            qz_mv_tile(w + (size_t)o0 * ws, ws, n_t, q4, xq, xs, K, b0, ns, &a, vidx, y + o0, ys);
        }
    }
}

/* ---- p16: rows packed by kn_pack_q8_0 ---------------------------------------
 * A quad vector holds 4 quants of each of 16 rows, dword j row j's: one
 * vpdpbusd against the activations' matching dword, broadcast, adds to row
 * j's sum in lane j. No unpacking, no lane reduction: 8 multiply-adds and the
 * scaling per block and activation row, where the mv layout needs 8 plus
 * sixteen more. vpdpbusd wants one side unsigned: the weights' sign bits
 * are flipped as they are loaded (q + 128), and `corr` takes the 128 * sum(x)
 * that this adds back out. */

/* One group (sc: its scales, q: its quants) of nb blocks, blocks b0 .. b0 + ns.
 * Q4_0 (q4): a block's 4 quads unpack to the 8 of Q8_0's layout, low
 * nibbles then high, unsigned as they are (corr takes out the 8). */
QZ_INLINE void qz_p16_tile(const char *sc, const char *q, size_t group_bytes, int nb, int n_t, bool q4,
                           const void *xq, size_t xs, int K, int b0, int ns, const qz_act *a, float *y,
                           size_t ys)
{
    const size_t qbytes = q4 ? KN_P16_Q4_QUANT_BYTES : KN_P16_QUANT_BYTES;
    const __mmask16 keep = (__mmask16)((1u << n_t) - 1);
    __m512 f[QZ_KMAX];
#pragma GCC unroll 16
    for (int r = 0; r < K; r++)
        f[r] = b0 > 0 ? _mm512_maskz_loadu_ps(keep, y + (size_t)r * ys) : _mm512_setzero_ps();
    for (int b = 0; b < ns; b++) {
        const int ib = b0 + b;
        const char *qb = q + (size_t)ib * qbytes;
        /* Every line of the block QZ_P16_AHEAD ahead, and its scales: a
         * block's 128 multiply-adds at 16 rows outlast a line's fetch, but
         * the hardware prefetcher alone left them waiting (two lines of the
         * eight asked for, 4 blocks ahead, read 9 GB/s from memory at 16
         * rows where this reads 24; bench/RESULTS.md). */
        const char *ahead = x86_p16_ahead(q, ib, QZ_P16_AHEAD, nb, qbytes, group_bytes);
        for (size_t l = 0; l < qbytes; l += 64)
            _mm_prefetch(ahead + l, _MM_HINT_T0);
        _mm_prefetch(x86_p16_ahead(sc, ib, 2 * QZ_P16_AHEAD, nb, KN_P16_SCALE_BYTES, group_bytes),
                     _MM_HINT_T0);
        const __m512 dwv =
            _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sc + (size_t)ib * KN_P16_SCALE_BYTES)));
        __m512i wv[8];
        if (q4) {
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const __m512i v = _mm512_loadu_si512((const void *)(qb + 64 * k));
                wv[k] = _mm512_and_si512(v, _mm512_set1_epi8(0x0f));
                wv[k + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0f));
            }
        } else {
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++)
                wv[k] = _mm512_xor_si512(_mm512_loadu_si512((const void *)(qb + 64 * k)),
                                         _mm512_set1_epi8((char)0x80));
        }
#pragma GCC unroll 16
        for (int r = 0; r < K; r++) {
            const int8_t *xd = (QZ_X(r) + ib)->qs;
            /* two chains, so a lone activation row is not one long wait */
            __m512i s0 = x86_dpbusd_bcast(_mm512_setzero_si512(), wv[0], xd);
            __m512i s1 = x86_dpbusd_bcast(_mm512_setzero_si512(), wv[1], xd + 4);
#pragma GCC unroll 3
            for (int k = 2; k < 8; k += 2) {
                s0 = x86_dpbusd_bcast(s0, wv[k], xd + 4 * k);
                s1 = x86_dpbusd_bcast(s1, wv[k + 1], xd + 4 * k + 4);
            }
            const __m512i v = _mm512_add_epi32(_mm512_add_epi32(s0, s1), _mm512_set1_epi32(a->corr[r][b]));
            f[r] = x86_block_accum(f[r], v, _mm512_mul_ps(dwv, _mm512_set1_ps(a->dx[r][b])));
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < K; r++)
        _mm512_mask_storeu_ps(y + (size_t)r * ys, keep, f[r]);
}

QZ_INLINE void qz_p16_run(const char *w, int n_w, bool q4, const void *xq, size_t xs, int K, int nb, float *y,
                          size_t ys)
{
    qz_act a;
    const size_t group_bytes = q4 ? kn_p16_q4_group_bytes(nb) : kn_p16_group_bytes(nb);
    for (int b0 = 0; b0 < nb; b0 += QZ_MSEG) {
        const int ns = nb - b0 < QZ_MSEG ? nb - b0 : QZ_MSEG;
        qz_act_fill(&a, xq, xs, K, b0, ns, q4 ? 8 : 128);
        for (int o0 = 0; o0 < n_w; o0 += 16) {
            const char *g = w + (size_t)(o0 / 16) * group_bytes;
            qz_p16_tile(g, g + kn_p16_quants_at(nb), group_bytes, nb, n_w - o0 < 16 ? n_w - o0 : 16, q4, xq,
                        xs, K, b0, ns, &a, y + o0, ys);
        }
    }
}

/* ---- dispatch -------------------------------------------------------------- */

/* Batches are cut into even chunks of at most QZ_KMAX rows (17 rows as 9 +
 * 8, not 16 + 1: a chunk's weight work is the same whatever its rows). K is
 * a constant in each call so that the accumulators stay in registers. */
QZ_INLINE void qz_gemm(const void *w, size_t ws, int n_w, int kind, const void *xq, size_t xs, int nr, int n,
                       float *y, size_t ys)
{
    const int nb = n / KN_QK8_0;
    for (int r = 0; r < nr;) {
        const int rest = nr - r, chunks = (rest + QZ_KMAX - 1) / QZ_KMAX;
        const int K = (rest + chunks - 1) / chunks;
        const char *xr = (const char *)xq + (size_t)r * xs;
        float *yr = y + (size_t)r * ys;
        switch (K) {
#define QZ_CASE(k)                                                                                           \
    case k:                                                                                                  \
        if (kind == QZ_P16 || kind == QZ_P16_Q4)                                                             \
            qz_p16_run(w, n_w, kind == QZ_P16_Q4, xr, xs, k, nb, yr, ys);                                    \
        else                                                                                                 \
            qz_mv_run(w, ws, n_w, kind == QZ_Q4, xr, xs, k, nb, yr, ys);                                     \
        break;
            QZ_CASE(1)
            QZ_CASE(2)
            QZ_CASE(3)
            QZ_CASE(4)
            QZ_CASE(5)
            QZ_CASE(6)
            QZ_CASE(7)
            QZ_CASE(8)
            QZ_CASE(9)
            QZ_CASE(10)
            QZ_CASE(11)
            QZ_CASE(12)
            QZ_CASE(13)
            QZ_CASE(14)
            QZ_CASE(15)
            QZ_CASE(16)
#undef QZ_CASE
        }
        r += K;
    }
}

static QZ_ATTR void avx512_gemm_q8_0(const void *w, size_t w_stride, int n_w, const void *xq, size_t xs,
                                     int nr, int n, float *y, size_t y_stride)
{
    qz_gemm(w, w_stride, n_w, QZ_Q8, xq, xs, nr, n, y, y_stride);
}

static QZ_ATTR void avx512_gemm_q8_0_p16(const void *w, int n_w, const void *xq, size_t xs, int nr, int n,
                                         float *y, size_t y_stride)
{
    qz_gemm(w, 0, n_w, QZ_P16, xq, xs, nr, n, y, y_stride);
}

static QZ_ATTR void avx512_gemm_q4_0_p16(const void *w, int n_w, const void *xq, size_t xs, int nr, int n,
                                         float *y, size_t y_stride)
{
    qz_gemm(w, 0, n_w, QZ_P16_Q4, xq, xs, nr, n, y, y_stride);
}

static QZ_ATTR void avx512_gemm_q4_0(const void *w, size_t w_stride, int n_w, const void *xq, size_t xs,
                                     int nr, int n, float *y, size_t y_stride)
{
    qz_gemm(w, w_stride, n_w, QZ_Q4, xq, xs, nr, n, y, y_stride);
}

static kn_ops ops_avx512;
static pthread_once_t ops_avx512_once = PTHREAD_ONCE_INIT;

static void ops_avx512_init(void)
{
    const kn_ops *base = kn_ops_avxvnni();
    ops_avx512 = base != NULL ? *base : *kn_ops_avx2();
    ops_avx512.name = "avx512vnni";
    ops_avx512.gemm[KN_TYPE_Q8_0] = avx512_gemm_q8_0;
    ops_avx512.gemm[KN_TYPE_Q4_0] = avx512_gemm_q4_0;
    ops_avx512.gemm_q8_0_p16 = avx512_gemm_q8_0_p16;
    ops_avx512.gemm_q4_0_p16 = avx512_gemm_q4_0_p16;
    ops_avx512.gemm_packed[KN_TYPE_Q8_0] = avx512_gemm_q8_0_p16;
    ops_avx512.gemm_packed[KN_TYPE_Q4_0] = avx512_gemm_q4_0_p16;
    kn_x86_packed_fill(&ops_avx512);
    kn_x86_float512_fill(&ops_avx512);
}

const kn_ops *kn_ops_avx512vnni(void)
{
    /* the AVX2 table first: it checks AVX2/FMA/F16C and fills the scale
     * table these kernels read; the builtin checks that the OS saves the
     * 512-bit state as well as the CPUID bits */
    if (kn_ops_avx2() == NULL)
        return NULL;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512vnni"))
        return NULL;
    pthread_once(&ops_avx512_once, ops_avx512_init);
    return &ops_avx512;
}

#else

const kn_ops *kn_ops_avx512vnni(void)
{
    return NULL;
}

#endif
