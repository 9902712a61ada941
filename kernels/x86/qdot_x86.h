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
 * The gemm (the last section) carries the whole forward pass: kn_matmul
 * sends it every quantized matmul, decode's single row included. The dots
 * serve the table's one-weight-row entries. The byte products need one
 * unsigned and one signed operand, which is arranged per case:
 *
 *  - sign trick (one activation row; Q8_0 rows without VNNI): |w| and x with
 *    w's sign: maddubs(|w|, sign(x, w)) = w*x pairwise.
 *  - offset trick: one side's bytes made unsigned (Q4_0's nibbles are;
 *    Q8_0's get +128, an xor), and the other side's sum times 8 (or 128)
 *    taken off again, computed once and shared. Without VNNI only where the
 *    unsigned side is small enough (Q4_0) to keep maddubs' int16 pairs from
 *    saturating.
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

/* ---- the batched entry (gemm): exact whatever the batch ------------------------
 * kn_matmul sends every quantized matmul here, from one activation row
 * (decode) to hundreds (prefill). Each output is computed exactly as the
 * reference computes it: the block's integer dot, exact; times d_w * d_x
 * (exact in float: the product of two halves' significands fits); rounded;
 * added to the running sum in block order, by a separate multiply and add.
 * So an activation row's result is bit-identical to the reference whatever
 * batch it came in, whichever path below served it and however the work was
 * split among threads: continuous batching cannot change a sequence's tokens.
 *
 * That takes one float multiply and add per (weight row, activation row,
 * block) on a block sum that is complete in one lane. Two layouts get
 * complete sums into lanes without repacking the weights:
 *
 *  - mv, lanes = 8 weight rows (narrow batches, up to eight activation rows
 *    a pass): rows j and j + 4 share a register, their first 16 bytes in its
 *    low half and their last 16 in the high, against the activation block's
 *    halves broadcast; four such partial-sum vectors reduce to the eight
 *    rows' block sums in nine instructions, and the float work is done once
 *    for eight rows. One load and unpacking of the weights serves all the
 *    pass's activation rows; at one row, it is the decode matvec, reading
 *    each weight byte once.
 *  - xT, lanes = 8 activation rows (16 rows or more): the activation rows are
 *    transposed once per call (lane j of vector k holds dword k of row j's
 *    block), each weight block is made unsigned once and its dwords are
 *    broadcast, and eight vpdpbusd give eight rows' block sums, shared by up
 *    to four groups of eight rows. The transposition is paid per activation
 *    row, and shared by every weight row.
 *
 * The weights take the unsigned side: Q4_0's nibbles as they are, Q8_0's
 * bytes offset by 128; the activation block's sum times 8 (or 128) is taken
 * off again, computed once per activation block. Without VNNI, vpmaddubsw's
 * int16 pairs would saturate on Q8_0's offset bytes, so there Q8_0 takes the
 * sign trick on the mv path at every width. */

/* Blocks per segment. The xT path's transposed activations (QX_GMAX groups
 * x QX_SEG blocks x 320 bytes, 40 KiB) and the mv path's per-block terms
 * (QM_KMAX x QM_SEG x 8 bytes) live on the stack; longer rows are done a
 * segment at a time, each continuing from the sums the previous one stored,
 * which keeps the block order. */
#define QX_SEG 32
#define QX_GMAX 4
/* Weight rows per output tile of the xT path (see qx_pass). */
#define QX_OB 16
#define QM_SEG 128
#define QM_KMAX 8

/* xT needs unsigned weights whose pair products fit: VNNI, or Q4_0. */
#define QX_OK(q4) (QD_VNNI || (q4))
/* Batches of at least QX_MIN_ROWS rows go to xT, in groups of eight and a
 * rest that fills at least QX_MIN_TAIL lanes; the others to mv. Measured:
 * mv's cost per row falls with its rows (one load and unpacking of the
 * weights serves them all) to below xT's until xT has two full groups. */
#define QX_MIN_ROWS 16
#define QX_MIN_TAIL 6

/* acc + (float)isum * scale, rounded twice as the reference rounds it: the
 * barrier keeps the compiler from contracting the two into an FMA. */
QD_INLINE __m256 qx_accum(__m256 acc, __m256i isum, __m256 scale)
{
    __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(isum), scale);
    __asm__("" : "+x"(t));
    return _mm256_add_ps(acc, t);
}

/* The first n (<= 8) floats at p, the rest zero; and the converse store. */
QD_INLINE __m256 qx_loadn(const float *p, int n)
{
    if (n == 8)
        return _mm256_loadu_ps(p);
    float t[8] = {0};
    for (int j = 0; j < n; j++)
        t[j] = p[j];
    return _mm256_loadu_ps(t);
}

QD_INLINE void qx_storen(float *p, int n, __m256 v)
{
    if (n == 8) {
        _mm256_storeu_ps(p, v);
        return;
    }
    float t[8];
    _mm256_storeu_ps(t, v);
    for (int j = 0; j < n; j++)
        p[j] = t[j];
}

/* The block's scale of weight row w (a row start). */
QD_INLINE uint16_t qx_wd(const char *w, bool q4, int ib)
{
    return q4 ? ((const kn_block_q4_0 *)w + ib)->d : ((const kn_block_q8_0 *)w + ib)->d;
}

/* ---- mv ---- */

/* Per-block terms of up to QM_KMAX activation rows: -off * sum(x), d_x. */
typedef struct qm_act {
    int32_t corr[QM_KMAX][QM_SEG];
    float dx[QM_KMAX][QM_SEG];
} qm_act;

/* Block ib of weight rows a and b (row starts) as one operand pair: lo holds
 * elements 0..15 of a then of b, hi elements 16..31. Unsigned, except Q8_0
 * without VNNI (signed, for the sign trick). */
QD_INLINE void qm_wpair(const char *a, const char *b, bool q4, int ib, __m256i *lo, __m256i *hi)
{
    if (q4) {
        const __m128i ta = _mm_loadu_si128((const __m128i *)((const kn_block_q4_0 *)a + ib)->qs);
        const __m128i tb = _mm_loadu_si128((const __m128i *)((const kn_block_q4_0 *)b + ib)->qs);
        const __m256i t = _mm256_inserti128_si256(_mm256_castsi128_si256(ta), tb, 1);
        *lo = _mm256_and_si256(t, _mm256_set1_epi8(0x0f));
        *hi = _mm256_and_si256(_mm256_srli_epi16(t, 4), _mm256_set1_epi8(0x0f));
        return;
    }
    const int8_t *qa = ((const kn_block_q8_0 *)a + ib)->qs, *qb = ((const kn_block_q8_0 *)b + ib)->qs;
    __m256i l = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)qa)),
                                        _mm_loadu_si128((const __m128i *)qb), 1);
    __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(qa + 16))),
                                        _mm_loadu_si128((const __m128i *)(qb + 16)), 1);
    if (QD_VNNI) {
        l = _mm256_xor_si256(l, _mm256_set1_epi8((char)0x80));
        h = _mm256_xor_si256(h, _mm256_set1_epi8((char)0x80));
    }
    *lo = l;
    *hi = h;
}

/* Partial sums (int32 lanes) of a weight pair's two rows against an
 * activation block whose halves xl, xh are broadcast to both lanes. */
QD_INLINE __m256i qm_pairdot(bool q4, __m256i lo, __m256i hi, __m256i xl, __m256i xh)
{
#if QD_VNNI
    (void)q4;
    return _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), lo, xl), hi, xh);
#else
    const __m256i one = _mm256_set1_epi16(1);
    if (q4) /* four products of at most 15 * 128 per int16 lane */
        return _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, xl), _mm256_maddubs_epi16(hi, xh)),
                                 one);
    const __m256i pl = _mm256_maddubs_epi16(_mm256_sign_epi8(lo, lo), _mm256_sign_epi8(xl, lo));
    const __m256i ph = _mm256_maddubs_epi16(_mm256_sign_epi8(hi, hi), _mm256_sign_epi8(xh, hi));
    return _mm256_add_epi32(_mm256_madd_epi16(pl, one), _mm256_madd_epi16(ph, one));
#endif
}

/* n_t (<= 8) weight rows from w against K activation rows, blocks
 * [b0, b0 + ns); y row r gets (or, past the first segment, continues) the
 * n_t sums. */
QD_INLINE void qm_tile(const char *w, size_t ws, int n_t, bool q4, const void *xq, size_t xs, int K, int b0,
                       int ns, const qm_act *a, float *y, size_t ys)
{
    const char *wr[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) /* missing rows repeat row 0, unstored */
        wr[j] = w + (size_t)(j < n_t ? j : 0) * ws;
    const size_t bsz = q4 ? sizeof(kn_block_q4_0) : sizeof(kn_block_q8_0);
    /* A prefetch at most a cache line after the last (every second Q4_0
     * block, every Q8_0 block): with one every fourth Q4_0 block (72 bytes
     * apart: a line in nine never asked for) the AVX2 decode matvec ran at
     * about half this speed (bench/RESULTS.md). */
    const int pf_every = q4 ? 1 : 0;
    __m256 f[QM_KMAX];
#pragma GCC unroll 8
    for (int r = 0; r < K; r++)
        f[r] = b0 > 0 ? qx_loadn(y + (size_t)r * ys, n_t) : _mm256_setzero_ps();
    for (int b = 0; b < ns; b++) {
        const int ib = b0 + b;
        /* The next tile's rows, at the same place: the eight rows advance
         * together, so a fixed distance ahead within a row would land in
         * this tile's own rows when rows are short. */
        if ((ib & pf_every) == 0)
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++)
                _mm_prefetch(wr[j] + 8 * ws + (size_t)ib * bsz, _MM_HINT_T0);
        __m256i lo[4], hi[4];
#pragma GCC unroll 8
        for (int p = 0; p < 4; p++)
            qm_wpair(wr[p], wr[p + 4], q4, ib, &lo[p], &hi[p]);
        const float *T = kn_x86_f16_table;
        const __m256 dwv =
            _mm256_setr_ps(T[qx_wd(wr[0], q4, ib)], T[qx_wd(wr[1], q4, ib)], T[qx_wd(wr[2], q4, ib)],
                           T[qx_wd(wr[3], q4, ib)], T[qx_wd(wr[4], q4, ib)], T[qx_wd(wr[5], q4, ib)],
                           T[qx_wd(wr[6], q4, ib)], T[qx_wd(wr[7], q4, ib)]);
#pragma GCC unroll 8
        for (int r = 0; r < K; r++) {
            const kn_block_q8_0 *xb = QD_X(r) + ib;
            const __m256i xl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)xb->qs));
            const __m256i xh = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(xb->qs + 16)));
            __m256i v = x86_reduce8(qm_pairdot(q4, lo[0], hi[0], xl, xh), qm_pairdot(q4, lo[1], hi[1], xl, xh),
                                  qm_pairdot(q4, lo[2], hi[2], xl, xh), qm_pairdot(q4, lo[3], hi[3], xl, xh));
            v = _mm256_add_epi32(v, _mm256_set1_epi32(a->corr[r][b]));
            f[r] = qx_accum(f[r], v, _mm256_mul_ps(dwv, _mm256_set1_ps(a->dx[r][b])));
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < K; r++)
        qx_storen(y + (size_t)r * ys, n_t, f[r]);
}

QD_INLINE void qm_run(const char *w, size_t ws, int n_w, bool q4, const void *xq, size_t xs, int K, int nb,
                      float *y, size_t ys)
{
    qm_act a;
    const int off = q4 ? 8 : QD_VNNI ? 128 : 0;
    for (int b0 = 0; b0 < nb; b0 += QM_SEG) {
        const int ns = nb - b0 < QM_SEG ? nb - b0 : QM_SEG;
#pragma GCC unroll 8
        for (int r = 0; r < K; r++) {
            for (int b = 0; b < ns; b++) {
                const kn_block_q8_0 *xb = QD_X(r) + b0 + b;
                a.corr[r][b] = off ? -off * x86_xsum(xb->qs) : 0;
                a.dx[r][b] = kn_x86_f16_table[xb->d];
            }
        }
        for (int o0 = 0; o0 < n_w; o0 += 8) {
            const int n_t = n_w - o0 < 8 ? n_w - o0 : 8;
            qm_tile(w + (size_t)o0 * ws, ws, n_t, q4, xq, xs, K, b0, ns, &a, y + o0, ys);
        }
    }
}

/* ---- xT ---- */

/* One block of a group of eight activation rows, transposed. */
typedef struct qx_blk {
    __m256i q[8]; /* lane j of q[k]: bytes 4k..4k+3 of row j's block */
    __m256i corr; /* lane j: -off * the sum of row j's block */
    __m256 dx;    /* lane j: row j's block scale; 0 past the group's rows */
} qx_blk;

/* 8x8 transpose of 32-bit elements. */
QD_INLINE void qx_transpose8(__m256i r[8])
{
    __m256i t[8], u[8];
#pragma GCC unroll 8
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 8
    for (int i = 0; i < 2; i++) {
        u[4 * i + 0] = _mm256_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
        u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
        u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
#pragma GCC unroll 8
    for (int k = 0; k < 4; k++) {
        r[k] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x20);
        r[k + 4] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x31);
    }
}

/* Transposes n_r (<= 8) activation rows, blocks [b0, b0 + ns), into p. */
QD_INLINE void qx_pack(const void *xq, size_t xs, int n_r, int b0, int ns, int off, qx_blk *p)
{
    for (int b = 0; b < ns; b++) {
        __m256i v[8];
        _Alignas(32) float d[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            if (j < n_r) {
                const kn_block_q8_0 *x = QD_X(j) + b0 + b;
                v[j] = qd_xload(x);
                d[j] = kn_x86_f16_table[x->d];
            } else {
                v[j] = _mm256_setzero_si256();
                d[j] = 0.0f;
            }
        }
        qx_transpose8(v);
        __m256i s = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            p[b].q[k] = v[k];
            s = qd_dot_us(s, _mm256_set1_epi8((char)off), v[k]);
        }
        p[b].corr = _mm256_sub_epi32(_mm256_setzero_si256(), s);
        p[b].dx = _mm256_load_ps(d);
    }
}

/* One weight row (from its start) against G groups' packed blocks [0, ns)
 * of the segment at b0; f[g] carries group g's sums. */
QD_INLINE void qx_row(const char *w, bool q4, int b0, int ns, const qx_blk *p, int G, __m256 *f)
{
    _Alignas(32) uint8_t buf[32];
    for (int b = 0; b < ns; b++) {
        const int ib = b0 + b;
        uint16_t dh;
        if (q4) {
            const kn_block_q4_0 *wb = (const kn_block_q4_0 *)w + ib;
            _mm_prefetch((const char *)wb + QD_PF_AHEAD, _MM_HINT_T0);
            _mm256_store_si256((__m256i *)buf, qd_nibbles(wb));
            dh = wb->d;
        } else {
            const kn_block_q8_0 *wb = (const kn_block_q8_0 *)w + ib;
            _mm_prefetch((const char *)wb + QD_PF_AHEAD, _MM_HINT_T0);
            _mm256_store_si256((__m256i *)buf, _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)wb->qs),
                                                                _mm256_set1_epi8((char)0x80)));
            dh = wb->d;
        }
        /* The dwords are broadcast straight from memory, on the load ports:
         * left to itself the compiler would shuffle them out of a register,
         * on ports the vpdpbusd need. */
        __asm__("" : "+m"(buf));
        __m256i a[8];
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            int32_t t;
            memcpy(&t, buf + 4 * k, sizeof(t));
            a[k] = _mm256_set1_epi32(t);
        }
        const __m256 dw = qd_scale(dh);
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) {
            const qx_blk *P = p + (size_t)g * QX_SEG + b;
#if QD_VNNI
            /* two chains, so eight vpdpbusd latencies do not line up */
            __m256i acc = P->corr, acc1 = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int k = 0; k < 8; k += 2) {
                acc = _mm256_dpbusd_avx_epi32(acc, a[k], P->q[k]);
                acc1 = _mm256_dpbusd_avx_epi32(acc1, a[k + 1], P->q[k + 1]);
            }
            acc = _mm256_add_epi32(acc, acc1);
#else
            /* Q4_0 only: 16 products of at most 15 * 128 per int16 lane */
            __m256i a16 = _mm256_maddubs_epi16(a[0], P->q[0]);
#pragma GCC unroll 8
            for (int k = 1; k < 8; k++)
                a16 = _mm256_add_epi16(a16, _mm256_maddubs_epi16(a[k], P->q[k]));
            const __m256i acc = _mm256_add_epi32(_mm256_madd_epi16(a16, _mm256_set1_epi16(1)), P->corr);
#endif
            f[g] = qx_accum(f[g], acc, _mm256_mul_ps(dw, P->dx));
        }
    }
}

/* All weight rows against nrp (<= 8 * G) activation rows packed in p. The
 * sums go through a small tile so that y is written a run of QX_OB columns
 * of a row at a time: a column at a time, the rows' stride (often a power
 * of two) would put all of them in one cache set. */
QD_INLINE void qx_pass(const char *w, size_t ws, int n_w, bool q4, int nrp, int b0, int ns, const qx_blk *p,
                       int G, float *y, size_t ys)
{
    _Alignas(32) float t[QX_GMAX][QX_OB][8];
    for (int o0 = 0; o0 < n_w; o0 += QX_OB) {
        const int n_o = n_w - o0 < QX_OB ? n_w - o0 : QX_OB;
        if (b0 > 0) /* a later segment continues the sums */
            for (int g = 0; g < G; g++)
                for (int j = 0; j < 8 && 8 * g + j < nrp; j++)
                    for (int i = 0; i < n_o; i++)
                        t[g][i][j] = y[(size_t)(8 * g + j) * ys + o0 + i];
        for (int i = 0; i < n_o; i++) {
            __m256 f[QX_GMAX];
#pragma GCC unroll 4
            for (int g = 0; g < G; g++)
                f[g] = b0 > 0 ? _mm256_load_ps(t[g][i]) : _mm256_setzero_ps();
            qx_row(w + (size_t)(o0 + i) * ws, q4, b0, ns, p, G, f);
#pragma GCC unroll 4
            for (int g = 0; g < G; g++)
                _mm256_store_ps(t[g][i], f[g]);
        }
        for (int g = 0; g < G; g++)
            for (int j = 0; j < 8 && 8 * g + j < nrp; j++)
                for (int i = 0; i < n_o; i++)
                    y[(size_t)(8 * g + j) * ys + o0 + i] = t[g][i][j];
    }
}

QD_INLINE void qx_run(const char *w, size_t ws, int n_w, bool q4, const void *xq, size_t xs, int nr, int nb,
                      float *y, size_t ys)
{
    qx_blk p[QX_GMAX * QX_SEG];
    const int off = q4 ? 8 : 128;
    for (int r0 = 0; r0 < nr; r0 += 8 * QX_GMAX) {
        const int nrp = nr - r0 < 8 * QX_GMAX ? nr - r0 : 8 * QX_GMAX;
        const int G = (nrp + 7) / 8;
        const char *xr = (const char *)xq + (size_t)r0 * xs;
        float *yr = y + (size_t)r0 * ys;
        for (int b0 = 0; b0 < nb; b0 += QX_SEG) {
            const int ns = nb - b0 < QX_SEG ? nb - b0 : QX_SEG;
            for (int g = 0; g < G; g++)
                qx_pack(xr + (size_t)(8 * g) * xs, xs, nrp - 8 * g < 8 ? nrp - 8 * g : 8, b0, ns, off,
                        p + (size_t)g * QX_SEG);
            /* G a constant in each call, so the accumulators stay in registers */
            switch (G) {
            case 1:
                qx_pass(w, ws, n_w, q4, nrp, b0, ns, p, 1, yr, ys);
                break;
            case 2:
                qx_pass(w, ws, n_w, q4, nrp, b0, ns, p, 2, yr, ys);
                break;
            case 3:
                qx_pass(w, ws, n_w, q4, nrp, b0, ns, p, 3, yr, ys);
                break;
            default:
                qx_pass(w, ws, n_w, q4, nrp, b0, ns, p, 4, yr, ys);
                break;
            }
        }
    }
}

/* K (<= QM_KMAX) activation rows on the mv path. */
QD_INLINE void qm_rows(const char *w, size_t ws, int n_w, bool q4, const void *xq, size_t xs, int K, int nb,
                       float *y, size_t ys)
{
    /* K a constant in each call, likewise */
    switch (K) {
    case 1:
        qm_run(w, ws, n_w, q4, xq, xs, 1, nb, y, ys);
        break;
    case 2:
        qm_run(w, ws, n_w, q4, xq, xs, 2, nb, y, ys);
        break;
    case 3:
        qm_run(w, ws, n_w, q4, xq, xs, 3, nb, y, ys);
        break;
    case 4:
        qm_run(w, ws, n_w, q4, xq, xs, 4, nb, y, ys);
        break;
    case 5:
        qm_run(w, ws, n_w, q4, xq, xs, 5, nb, y, ys);
        break;
    case 6:
        qm_run(w, ws, n_w, q4, xq, xs, 6, nb, y, ys);
        break;
    case 7:
        qm_run(w, ws, n_w, q4, xq, xs, 7, nb, y, ys);
        break;
    default:
        qm_run(w, ws, n_w, q4, xq, xs, 8, nb, y, ys);
        break;
    }
}

/* xT for batches of QX_MIN_ROWS rows or more, in groups of eight and a rest
 * of at least QX_MIN_TAIL rows; mv for the others, in even chunks of at most
 * QM_KMAX rows (13 rows as 7 + 6: a chunk's weight work is the same whatever
 * its rows). */
QD_INLINE void qd_gemm(const void *w, size_t ws, int n_w, bool q4, const void *xq, size_t xs, int nr, int n,
                       float *y, size_t ys)
{
    const int nb = n / KN_QK8_0;
    int r = 0;
    if (QX_OK(q4) && nr >= QX_MIN_ROWS) {
        r = nr % 8 >= QX_MIN_TAIL ? nr : nr - nr % 8;
        qx_run(w, ws, n_w, q4, xq, xs, r, nb, y, ys);
    }
    while (r < nr) {
        const int rest = nr - r, chunks = (rest + QM_KMAX - 1) / QM_KMAX;
        const int K = (rest + chunks - 1) / chunks;
        qm_rows(w, ws, n_w, q4, (const char *)xq + (size_t)r * xs, xs, K, nb, y + (size_t)r * ys, ys);
        r += K;
    }
}

static QD_ATTR void QD_FN(gemm_q8_0)(const void *w, size_t w_stride, int n_w, const void *xq, size_t xs,
                                     int nr, int n, float *y, size_t y_stride)
{
    qd_gemm(w, w_stride, n_w, false, xq, xs, nr, n, y, y_stride);
}

static QD_ATTR void QD_FN(gemm_q4_0)(const void *w, size_t w_stride, int n_w, const void *xq, size_t xs,
                                     int nr, int n, float *y, size_t y_stride)
{
    qd_gemm(w, w_stride, n_w, true, xq, xs, nr, n, y, y_stride);
}

#undef QX_SEG
#undef QX_GMAX
#undef QX_OB
#undef QM_SEG
#undef QM_KMAX
#undef QX_OK
#undef QX_MIN_ROWS
#undef QX_MIN_TAIL
#undef QD_X
#undef QD_OFFSET
#undef QD_INLINE
#undef QD_PF_AHEAD
