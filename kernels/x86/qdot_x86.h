/* kernels/x86: the quantized row dots (Q8_0 and Q4_0 weights against Q8_0
 * activations), written once and compiled twice: ops_avx2.c includes it for
 * plain AVX2 (vpmaddubsw + vpmaddwd), ops_avxvnni_avx2.c for AVX-VNNI
 * (vpdpbusd does both steps in one instruction). The includer defines:
 *
 *   QD_VNNI   0 or 1
 *   QD_FN(n)  the name of the entry point n (dot_q8_0, dot_q4_0)
 *   QD_ATTR   function attributes (the target of the VNNI build)
 *
 * and provides hsum256() and kn_x86_f16_table (ops_x86.h).
 *
 * These loops carry the whole forward pass, so the instruction mix is chosen
 * per case; the multiply ports (0 and 1) are the bottleneck, so work moves to
 * port 5 where it can:
 *
 *  - sign trick (AVX2 Q8_0): maddubs wants unsigned x signed bytes, so it gets
 *    |w| and x with w's sign: maddubs(|w|, sign(x, w)) = w*x pairwise.
 *  - offset trick (several rows; Q8_0 with VNNI): the activation bytes get
 *    +128 (an xor) to become unsigned, and the weight block's 128 * sum(w),
 *    computed once per block and shared by all rows, is taken off again.
 *    Without VNNI only for Q4_0, where |w| <= 8 keeps maddubs' int16 pairs
 *    from saturating.
 *  - raw nibbles (Q4_0, one row): the nibbles q in 0..15 are already
 *    unsigned, so sum((q - 8) x) = sum(q x) - 8 sum(x), with no byte
 *    arithmetic on the weights at all.
 *
 * Every case computes each block's exact integer dot, then adds it times
 * d_w * d_x in float, as the reference does. Block scales come from a table
 * of all 65536 halves as floats: a movzx and a broadcast load replace two
 * conversions and a broadcast, which would otherwise cost as much ALU time as
 * the integer dot. A tensor's scales span a narrow range, so the part of the
 * table in use stays in L1. */

/* Weight bytes prefetched ahead: the hardware prefetcher alone leaves the
 * decode matvec at half the memory bandwidth on the machines we measured. */
#define QD_PF_AHEAD 1024

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

/* acc + block ib of one row, for the single-row loop. */
QD_INLINE __m256 qd_single(__m256 acc, const void *w, bool q4, int ib, const kn_block_q8_0 *x)
{
    if (q4) {
        const kn_block_q4_0 *b = (const kn_block_q4_0 *)w + ib;
        _mm_prefetch((const char *)b + QD_PF_AHEAD, _MM_HINT_T0);
        const __m256i q = qd_nibbles(b), qx = qd_xload(x);
        /* sum((q - 8) x) = sum(q x) - 8 sum(x) */
#if QD_VNNI
        const __m256i s8x = qd_dot_us(_mm256_setzero_si256(), _mm256_set1_epi8(8), qx);
        const __m256i s = qd_dot_us(_mm256_sub_epi32(_mm256_setzero_si256(), s8x), q, qx);
#else
        const __m256i p16 =
            _mm256_sub_epi16(_mm256_maddubs_epi16(q, qx), _mm256_maddubs_epi16(_mm256_set1_epi8(8), qx));
        const __m256i s = _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
#endif
        return _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(qd_scale(b->d), qd_scale(x->d)), acc);
    }
    __m256 dw;
    const __m256i wq = qd_wblock(w, false, ib, &dw);
#if QD_VNNI
    const __m256i c = _mm256_sub_epi32(_mm256_setzero_si256(),
                                       qd_dot_us(_mm256_setzero_si256(), _mm256_set1_epi8((char)0x80), wq));
    return qd_term(acc, false, wq, wq, c, dw, x);
#else
    return qd_term(acc, false, wq, _mm256_sign_epi8(wq, wq), wq, dw, x);
#endif
}

/* One activation row, the decode case: two blocks per step into two
 * accumulators so the FMA latency chain does not bound the rate at which
 * weight bytes are consumed. */
QD_INLINE void qd_one(const void *w, bool q4, const kn_block_q8_0 *x, int nb, float *out)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int ib = 0;
    for (; ib + 2 <= nb; ib += 2) {
        a0 = qd_single(a0, w, q4, ib, x + ib);
        a1 = qd_single(a1, w, q4, ib + 1, x + ib + 1);
    }
    if (ib < nb)
        a0 = qd_single(a0, w, q4, ib, x + ib);
    *out = hsum256(_mm256_add_ps(a0, a1));
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

#undef QD_X
#undef QD_OFFSET
#undef QD_INLINE
#undef QD_PF_AHEAD
