/* kernels/x86: the quantized dots and gemm (Q8_0 and Q4_0 weights against
 * Q8_0 activations), written once and compiled twice: ops_avx2.c includes it
 * for plain AVX2 (vpmaddubsw + vpmaddwd), ops_avxvnni_avx2.c for AVX-VNNI
 * (vpdpbusd does both steps in one instruction). The includer defines:
 *
 *   QD_VNNI   0 or 1
 *   QD_FN(n)  the name of the entry point n (dot_q8_0, gemm_q4_0, ...)
 *   QD_ATTR   function attributes (the target of the VNNI build)
 *
 * and provides hsum256() and kn_x86_f16_table (ops_x86.h).
 *
 * These loops carry the whole forward pass. The byte products need one
 * unsigned and one signed operand, which is arranged per case, choosing what
 * measured fastest:
 *
 *  - sign trick (one activation row; Q8_0 rows without VNNI): |w| and x with
 *    w's sign: maddubs(|w|, sign(x, w)) = w*x pairwise.
 *  - offset trick (two or three rows): the activation bytes get +128 (an
 *    xor) to become unsigned, and the weight block's 128 * sum(w), computed
 *    once per block and shared by all rows, is taken off again. Without VNNI
 *    only for Q4_0, where |w| <= 8 keeps maddubs' int16 pairs from
 *    saturating.
 *  - gemm (four rows or more): see the section below.
 *
 * Every case computes each block's exact integer dot, then adds it times
 * d_w * d_x in float, as the reference does. Block scales come from a table
 * of all 65536 halves as floats: a movzx and a broadcast load replace two
 * conversions and a broadcast, which would otherwise cost as much ALU time as
 * the integer dot. A tensor's scales span a narrow range, so the part of the
 * table in use stays in L1. */

/* Weight bytes prefetched ahead: the hardware prefetcher alone leaves the
 * decode matvec at half the memory bandwidth on the machines we measured. */
#define QD_PF_AHEAD 2048

#define QD_INLINE static inline __attribute__((always_inline)) QD_ATTR

QD_INLINE __m256 qd_scale(uint16_t h)
{
    return _mm256_broadcast_ss(&kn_x86_f16_table[h]);
}

/* int32 lanes of sum(u * s) for unsigned bytes u and signed bytes s, added to
 * acc; each u*s pair must fit int16 on the maddubs path. */
QD_INLINE __m256i qd_dot_us(__m256i acc, __m256i u, __m256i s)
{
#if QD_VNNI
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
    const __m256i p16 = _mm256_maddubs_epi16(u, s);
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
#endif
}

/* Q4_0 nibbles in element order (low nibbles are elements 0..15, high ones
 * 16..31) as unsigned bytes 0..15. */
QD_INLINE __m256i qd_nibbles(const kn_block_q4_0 *b)
{
    const __m128i t = _mm_loadu_si128((const __m128i *)b->qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0f));
}

/* Weight block ib as signed bytes, with its scale. */
QD_INLINE __m256i qd_wblock(const void *w, bool q4, int ib, __m256 *d)
{
    if (q4) {
        const kn_block_q4_0 *b = (const kn_block_q4_0 *)w + ib;
        _mm_prefetch((const char *)b + QD_PF_AHEAD, _MM_HINT_T0);
        *d = qd_scale(b->d);
        return _mm256_sub_epi8(qd_nibbles(b), _mm256_set1_epi8(8));
    }
    const kn_block_q8_0 *b = (const kn_block_q8_0 *)w + ib;
    _mm_prefetch((const char *)b + QD_PF_AHEAD, _MM_HINT_T0);
    *d = qd_scale(b->d);
    return _mm256_loadu_si256((const __m256i *)b->qs);
}

static inline __m256i qd_xload(const kn_block_q8_0 *x)
{
    return _mm256_loadu_si256((const __m256i *)x->qs);
}

#define QD_X(r) ((const kn_block_q8_0 *)((const char *)xq + (size_t)(r)*xs))

/* True where the offset trick is used: its int16 pairs fit for Q4_0 on
 * maddubs, and vpdpbusd has no int16 step at all. */
#define QD_OFFSET(q4) (QD_VNNI || (q4))

/* acc + one row's block dot times d_w * d_x; aw (|w|, sign trick) or c (the
 * offset correction) are the weight block's operands prepared in qd_rows. */
QD_INLINE __m256 qd_term(__m256 acc, bool q4, __m256i w, __m256i aw, __m256i c, __m256 dw,
                         const kn_block_q8_0 *x)
{
    const __m256i qx = qd_xload(x);
    __m256i s;
    if (QD_OFFSET(q4)) {
        const __m256i xu = _mm256_xor_si256(qx, _mm256_set1_epi8((char)0x80));
#if QD_VNNI
        s = qd_dot_us(c, xu, w); /* c = -128 * sum(w) per lane */
#else
        /* c = maddubs(128, w): int16 pairs, subtracted before widening */
        const __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(xu, w), c);
        s = _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
#endif
    } else {
        s = qd_dot_us(_mm256_setzero_si256(), aw, _mm256_sign_epi8(qx, w));
    }
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, qd_scale(x->d)), acc);
}

/* K activation rows (a constant at each call site, so the accumulators stay
 * in registers) against one weight row of nb blocks; the weight block and
 * its shared correction are prepared once for all K rows. */
QD_INLINE void qd_rows(const void *w, bool q4, const void *xq, size_t xs, int K, int nb, float *out)
{
    const kn_block_q8_0 *x0 = QD_X(0), *x1 = QD_X(K > 1 ? 1 : 0), *x2 = QD_X(K > 2 ? 2 : 0),
                        *x3 = QD_X(K > 3 ? 3 : 0);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int ib = 0; ib < nb; ib++) {
        __m256 dw;
        const __m256i wq = qd_wblock(w, q4, ib, &dw);
        __m256i aw = wq, c = wq;
        if (QD_OFFSET(q4)) {
#if QD_VNNI
            c = _mm256_sub_epi32(_mm256_setzero_si256(),
                                 qd_dot_us(_mm256_setzero_si256(), _mm256_set1_epi8((char)0x80), wq));
#else
            c = _mm256_maddubs_epi16(_mm256_set1_epi8((char)0x80), wq);
#endif
        } else {
            aw = _mm256_sign_epi8(wq, wq);
        }
        a0 = qd_term(a0, q4, wq, aw, c, dw, x0 + ib);
        if (K > 1)
            a1 = qd_term(a1, q4, wq, aw, c, dw, x1 + ib);
        if (K > 2)
            a2 = qd_term(a2, q4, wq, aw, c, dw, x2 + ib);
        if (K > 3)
            a3 = qd_term(a3, q4, wq, aw, c, dw, x3 + ib);
    }
    out[0] = hsum256(a0);
    if (K > 1)
        out[1] = hsum256(a1);
    if (K > 2)
        out[2] = hsum256(a2);
    if (K > 3)
        out[3] = hsum256(a3);
}

/* acc + block ib of one row, for the single-row loop: the sign trick, which
 * measured faster here than the offset trick for a single row (its shared
 * correction has no other rows to be shared with). */
QD_INLINE __m256 qd_single(__m256 acc, const void *w, bool q4, int ib, const kn_block_q8_0 *x)
{
    __m256 dw;
    const __m256i wq = qd_wblock(w, q4, ib, &dw);
    const __m256i s =
        qd_dot_us(_mm256_setzero_si256(), _mm256_sign_epi8(wq, wq), _mm256_sign_epi8(qd_xload(x), wq));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, qd_scale(x->d)), acc);
}

/* One activation row, the decode case: four blocks per step into four
 * accumulators so the FMA latency chain does not bound the rate at which
 * weight bytes are consumed. */
QD_INLINE void qd_one(const void *w, bool q4, const kn_block_q8_0 *x, int nb, float *out)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int ib = 0;
    for (; ib + 4 <= nb; ib += 4) {
        a0 = qd_single(a0, w, q4, ib, x + ib);
        a1 = qd_single(a1, w, q4, ib + 1, x + ib + 1);
        a2 = qd_single(a2, w, q4, ib + 2, x + ib + 2);
        a3 = qd_single(a3, w, q4, ib + 3, x + ib + 3);
    }
    for (; ib < nb; ib++)
        a0 = qd_single(a0, w, q4, ib, x + ib);
    *out = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

QD_INLINE void qd_dot(const void *w, bool q4, const void *xq, size_t xs, int nr, int n, float *out)
{
    const int nb = n / KN_QK8_0;
    for (; nr >= 4; nr -= 4, xq = (const char *)xq + 4 * xs, out += 4)
        qd_rows(w, q4, xq, xs, 4, nb, out);
    switch (nr) {
    case 3:
        qd_rows(w, q4, xq, xs, 3, nb, out);
        break;
    case 2:
        qd_rows(w, q4, xq, xs, 2, nb, out);
        break;
    case 1:
        qd_one(w, q4, xq, nb, out);
        break;
    }
}

static QD_ATTR void QD_FN(dot_q8_0)(const void *w, const void *xq, size_t xs, int nr, int n, float *out)
{
    qd_dot(w, false, xq, xs, nr, n, out);
}

static QD_ATTR void QD_FN(dot_q4_0)(const void *w, const void *xq, size_t xs, int nr, int n, float *out)
{
    qd_dot(w, true, xq, xs, nr, n, out);
}

/* ---- several weight rows at once (gemm) ---------------------------------------
 * For wide batches. Eight weight rows are repacked per block so that 32-bit
 * lane j of register k holds bytes 4k..4k+3 of row j; an activation block's
 * dword k, broadcast to all lanes straight from memory, then meets all eight
 * rows in one instruction, eight instructions give the eight rows' block
 * dots in the eight lanes, and the float work (convert, scale, FMA) is done
 * once for eight rows instead of once per row. The repacking is paid once
 * per eight weight rows and segment, and shared by every activation row.
 *
 * The weights take the unsigned side: Q4_0's nibbles as they are (0..15),
 * Q8_0's bytes offset by 128. That adds 8 (or 128) times the activation
 * block's sum to each dot, which is computed once per activation block and
 * taken off by starting the accumulation from its negative. Without VNNI only
 * Q4_0 is done here: 16 products of at most 15 * 127 fit an int16 lane of
 * vpmaddubsw's results, while Q8_0's 255 * 127 pairs would saturate. */

#if QD_VNNI
#define QG_HAVE_Q8 1
#else
#define QG_HAVE_Q8 0
#endif

/* Blocks per repacked segment and activation rows per group: the repacked
 * tile (QG_SEG * 288 bytes) and the corrections (QG_ROWS * QG_SEG * 4 bytes)
 * live on the stack, 34 KiB together, and stay in L1/L2. */
#define QG_SEG 64
#define QG_ROWS 64

typedef struct qg_block {
    __m256i w[8]; /* w[k], lane j: bytes 4k..4k+3 of weight row j, unsigned */
    __m256 d;     /* the eight rows' scales */
} qg_block;

/* 8x8 transpose of 32-bit elements. */
QD_INLINE void qg_transpose8(__m256i r[8])
{
    __m256i t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        u[4 * i + 0] = _mm256_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
        u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
        u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int k = 0; k < 4; k++) {
        r[k] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x20);
        r[k + 4] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x31);
    }
}

/* Repacks n_t (<= 8) weight rows, blocks [b0, b0 + ns), into g; missing
 * rows are zero. */
QD_INLINE void qg_repack(const char *w, size_t w_stride, int n_t, bool q4, int b0, int ns, qg_block *g)
{
    for (int b = 0; b < ns; b++) {
        __m256i r[8];
        _Alignas(32) float d[8];
        for (int j = 0; j < 8; j++) {
            if (j >= n_t) {
                r[j] = _mm256_setzero_si256();
                d[j] = 0.0f;
            } else if (q4) {
                const kn_block_q4_0 *blk = (const kn_block_q4_0 *)(w + (size_t)j * w_stride) + b0 + b;
                r[j] = qd_nibbles(blk);
                d[j] = kn_x86_f16_table[blk->d];
            } else {
                const kn_block_q8_0 *blk = (const kn_block_q8_0 *)(w + (size_t)j * w_stride) + b0 + b;
                r[j] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)blk->qs),
                                        _mm256_set1_epi8((char)0x80));
                d[j] = kn_x86_f16_table[blk->d];
            }
        }
        qg_transpose8(r);
        for (int k = 0; k < 8; k++)
            g[b].w[k] = r[k];
        g[b].d = _mm256_load_ps(d);
    }
}

/* -off * sum(x) of one activation block. */
QD_INLINE int32_t qg_corr(const kn_block_q8_0 *x, int off)
{
    const __m256i s16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), qd_xload(x));
    __m256i s = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
    return -off * _mm_cvtsi128_si32(t);
}

/* Dword k of an activation block's quants, in every lane. */
QD_INLINE __m256i qg_xk(const kn_block_q8_0 *x, int k)
{
    int32_t v;
    memcpy(&v, x->qs + 4 * k, sizeof(v));
    return _mm256_set1_epi32(v);
}

/* The eight rows' exact integer block dots with one activation block,
 * starting from the block's correction. */
QD_INLINE __m256i qg_block_dot(const qg_block *g, const kn_block_q8_0 *x, int32_t corr)
{
#if QD_VNNI
    __m256i a = _mm256_set1_epi32(corr);
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++)
        a = qd_dot_us(a, g->w[k], qg_xk(x, k));
    return a;
#else
    __m256i a = _mm256_maddubs_epi16(g->w[0], qg_xk(x, 0));
#pragma GCC unroll 8
    for (int k = 1; k < 8; k++)
        a = _mm256_add_epi16(a, _mm256_maddubs_epi16(g->w[k], qg_xk(x, k)));
    return _mm256_add_epi32(_mm256_madd_epi16(a, _mm256_set1_epi16(1)), _mm256_set1_epi32(corr));
#endif
}

/* The same for two activation rows, each repacked weight vector loaded once
 * for both. */
QD_INLINE void qg_block_dot2(const qg_block *g, const kn_block_q8_0 *x0, const kn_block_q8_0 *x1, int32_t c0,
                             int32_t c1, __m256i *s0, __m256i *s1)
{
#if QD_VNNI
    __m256i a0 = _mm256_set1_epi32(c0), a1 = _mm256_set1_epi32(c1);
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        const __m256i wk = g->w[k];
        a0 = qd_dot_us(a0, wk, qg_xk(x0, k));
        a1 = qd_dot_us(a1, wk, qg_xk(x1, k));
    }
    *s0 = a0;
    *s1 = a1;
#else
    __m256i a0 = _mm256_maddubs_epi16(g->w[0], qg_xk(x0, 0)),
            a1 = _mm256_maddubs_epi16(g->w[0], qg_xk(x1, 0));
#pragma GCC unroll 8
    for (int k = 1; k < 8; k++) {
        const __m256i wk = g->w[k];
        a0 = _mm256_add_epi16(a0, _mm256_maddubs_epi16(wk, qg_xk(x0, k)));
        a1 = _mm256_add_epi16(a1, _mm256_maddubs_epi16(wk, qg_xk(x1, k)));
    }
    *s0 = _mm256_add_epi32(_mm256_madd_epi16(a0, _mm256_set1_epi16(1)), _mm256_set1_epi32(c0));
    *s1 = _mm256_add_epi32(_mm256_madd_epi16(a1, _mm256_set1_epi16(1)), _mm256_set1_epi32(c1));
#endif
}

/* y row += or = the tile's eight (or n_t) outputs. */
QD_INLINE void qg_store(float *y, int n_t, __m256 f, bool add)
{
    if (n_t == 8) {
        _mm256_storeu_ps(y, add ? _mm256_add_ps(f, _mm256_loadu_ps(y)) : f);
        return;
    }
    float t[8];
    _mm256_storeu_ps(t, f);
    for (int j = 0; j < n_t; j++)
        y[j] = add ? y[j] + t[j] : t[j];
}

QD_INLINE void qd_gemm(const void *w, size_t w_stride, int n_w, bool q4, const void *xq, size_t xs, int nr,
                       int n, float *y, size_t y_stride)
{
    qg_block g[QG_SEG];
    int32_t corr[QG_ROWS][QG_SEG];
    const int nb = n / KN_QK8_0, off = q4 ? 8 : 128;
    for (int r0 = 0; r0 < nr; r0 += QG_ROWS) {
        const int nrg = nr - r0 < QG_ROWS ? nr - r0 : QG_ROWS;
        for (int b0 = 0; b0 < nb; b0 += QG_SEG) {
            const int ns = nb - b0 < QG_SEG ? nb - b0 : QG_SEG;
            const bool add = b0 > 0; /* later segments add to the partial sums */
            for (int r = 0; r < nrg; r++)
                for (int b = 0; b < ns; b++)
                    corr[r][b] = qg_corr(QD_X(r0 + r) + b0 + b, off);
            for (int o0 = 0; o0 < n_w; o0 += 8) {
                const int n_t = n_w - o0 < 8 ? n_w - o0 : 8;
                float *yt = y + (size_t)r0 * y_stride + o0;
                qg_repack((const char *)w + (size_t)o0 * w_stride, w_stride, n_t, q4, b0, ns, g);
                int r = 0;
                /* two activation rows per pass share each load of the
                 * repacked weights */
                for (; r + 2 <= nrg; r += 2) {
                    const kn_block_q8_0 *x0 = QD_X(r0 + r) + b0, *x1 = QD_X(r0 + r + 1) + b0;
                    __m256 f0 = _mm256_setzero_ps(), f1 = _mm256_setzero_ps();
                    for (int b = 0; b < ns; b++) {
                        __m256i a0, a1;
                        qg_block_dot2(&g[b], x0 + b, x1 + b, corr[r][b], corr[r + 1][b], &a0, &a1);
                        f0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a0), _mm256_mul_ps(g[b].d, qd_scale(x0[b].d)),
                                             f0);
                        f1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a1), _mm256_mul_ps(g[b].d, qd_scale(x1[b].d)),
                                             f1);
                    }
                    qg_store(yt + (size_t)r * y_stride, n_t, f0, add);
                    qg_store(yt + (size_t)(r + 1) * y_stride, n_t, f1, add);
                }
                if (r < nrg) {
                    const kn_block_q8_0 *x0 = QD_X(r0 + r) + b0;
                    __m256 f0 = _mm256_setzero_ps();
                    for (int b = 0; b < ns; b++) {
                        const __m256i a0 = qg_block_dot(&g[b], x0 + b, corr[r][b]);
                        f0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a0), _mm256_mul_ps(g[b].d, qd_scale(x0[b].d)),
                                             f0);
                    }
                    qg_store(yt + (size_t)r * y_stride, n_t, f0, add);
                }
            }
        }
    }
}

#if QG_HAVE_Q8
static QD_ATTR void QD_FN(gemm_q8_0)(const void *w, size_t w_stride, int n_w, const void *xq, size_t xs,
                                     int nr, int n, float *y, size_t y_stride)
{
    qd_gemm(w, w_stride, n_w, false, xq, xs, nr, n, y, y_stride);
}
#endif

static QD_ATTR void QD_FN(gemm_q4_0)(const void *w, size_t w_stride, int n_w, const void *xq, size_t xs,
                                     int nr, int n, float *y, size_t y_stride)
{
    qd_gemm(w, w_stride, n_w, true, xq, xs, nr, n, y, y_stride);
}

#undef QG_SEG
#undef QG_ROWS
#undef QG_HAVE_Q8
#undef QD_X
#undef QD_OFFSET
#undef QD_INLINE
#undef QD_PF_AHEAD
