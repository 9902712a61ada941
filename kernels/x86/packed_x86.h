/* kernels/x86: the packed gemms of Q5_0, Q5_1, IQ4_NL and MXFP4 (with VNNI
 * Q4_1 too) over kn_pack's layout on 256-bit vectors (ops_packed_avx2.c
 * describes the scheme), written once and compiled twice: ops_packed_avx2.c
 * includes it for plain AVX2 (vpmaddubsw + vpmaddwd; IQ4_NL on the sign
 * trick), ops_avxvnni_avx2.c for AVX-VNNI (vpdpbusd sums the unsigned quants into
 * int32 lanes at once, so IQ4_NL's levels move up by 128 like the others).
 * Both with -ffp-contract=off. The includer defines:
 *
 *   PA_VNNI   0 or 1
 *   PA_FN(n)  the name of the entry point n (gemm_q5_0_packed, ...)
 *   PA_ATTR   function attributes (the target of the VNNI build)
 *
 * and gets PA_FN(packed_fill)(ops), which installs the gemms in a table. */

#define PA_INLINE static inline __attribute__((always_inline)) PA_ATTR
/* Activation rows a pass: one load and unpacking of the weights serves them. */
#define PA_KMAX 8
/* Blocks whose activation terms are computed at once (on the stack). */
#define PA_SEG 128
#define PA_X(k) ((const kn_block_q8_0 *)((const char *)xq + (size_t)(k)*xs))

typedef struct pa_act {
    int32_t corr[PA_KMAX][PA_SEG]; /* -offset * the block's quant sum */
    float xsf[PA_KMAX][PA_SEG];    /* the quant sum, for the min's term */
    float dx[PA_KMAX][PA_SEG];
} pa_act;

PA_INLINE bool pa_has_min(kn_type t)
{
    return t == KN_TYPE_Q4_1 || t == KN_TYPE_Q5_1;
}

PA_INLINE bool pa_q5(kn_type t)
{
    return t == KN_TYPE_Q5_0 || t == KN_TYPE_Q5_1;
}

/* IQ4_NL's levels take the sign trick (no offset) without VNNI. */
#define PA_SIGNED(t) (!PA_VNNI && (t) == KN_TYPE_IQ4_NL)

/* What the unsigned quants were moved up by. */
PA_INLINE int pa_offset(kn_type t)
{
    return t == KN_TYPE_Q5_0 ? 16 : t == KN_TYPE_MXFP4 ? 12 : t == KN_TYPE_IQ4_NL && PA_VNNI ? 128 : 0;
}

PA_INLINE size_t pa_scale_bytes(kn_type t)
{
    return pa_has_min(t) ? KN_PL_SCALE_DM : t == KN_TYPE_MXFP4 ? KN_PL_SCALE_E8 : KN_PL_SCALE_D;
}

PA_INLINE size_t pa_quant_bytes(kn_type t)
{
    return pa_q5(t) ? KN_PL_QUANT_5 : KN_PL_QUANT_4;
}

/* The codebook as vpshufb tables: the levels moved up by the type's
 * offset, and (IQ4_NL on the sign trick) their magnitudes. */
typedef struct pa_luts {
    __m256i lv, mag;
} pa_luts;

PA_INLINE pa_luts pa_luts_of(kn_type t)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)(t == KN_TYPE_MXFP4 ? kn_mxfp4_values : kn_iq4nl_values));
    pa_luts l;
    l.lv = _mm256_broadcastsi128_si256(_mm_add_epi8(v, _mm_set1_epi8((char)pa_offset(t))));
    l.mag = _mm256_broadcastsi128_si256(_mm_abs_epi8(v));
    return l;
}

/* Eight rows' d of a block, from sc (the half's first row's scale). */
PA_INLINE __m256 pa_scale(kn_type t, const uint8_t *sc)
{
    if (t != KN_TYPE_MXFP4)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)sc));
    /* the bits (e - 1) << 23, or for e < 2 the subnormal 0x00200000 << e */
    const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)sc));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    const __m256i tiny = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, tiny));
}

/* One half of a block's quants (q: its first vector's half): w[i] quad i
 * (elements 4i..4i+3 for i < 4, 16 + 4(i - 4).. for the rest), unsigned
 * (IQ4_NL: its signed levels, and a[i] their magnitudes). */
PA_INLINE void pa_unpack(kn_type t, const pa_luts *l, const uint8_t *q, __m256i w[8], __m256i a[8])
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    if (pa_q5(t)) {
        /* quad k is a mask away; quad 4 + k's low 3 bits sit above it, its
         * top 2 in the fifth vector's field k, moved to bits 3-4 (what the
         * 16-bit shifts carry across bytes, the masks clear) */
        const __m256i h = _mm256_loadu_si256((const __m256i *)(q + KN_PL_QUANT_4));
        const __m256i m18 = _mm256_set1_epi8(0x18);
        const __m256i top[4] = {_mm256_and_si256(_mm256_slli_epi16(h, 3), m18),
                                _mm256_and_si256(_mm256_slli_epi16(h, 1), m18),
                                _mm256_and_si256(_mm256_srli_epi16(h, 1), m18),
                                _mm256_and_si256(_mm256_srli_epi16(h, 3), m18)};
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 64 * k));
            w[k] = _mm256_and_si256(v, _mm256_set1_epi8(0x1f));
            w[4 + k] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 5), _mm256_set1_epi8(7)), top[k]);
        }
        return;
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 64 * k));
        const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if (t == KN_TYPE_Q4_1) {
            w[k] = lo;
            w[4 + k] = hi;
            continue;
        }
        w[k] = _mm256_shuffle_epi8(l->lv, lo);
        w[4 + k] = _mm256_shuffle_epi8(l->lv, hi);
        if (PA_SIGNED(t)) {
            a[k] = _mm256_shuffle_epi8(l->mag, lo);
            a[4 + k] = _mm256_shuffle_epi8(l->mag, hi);
        }
    }
}

/* The activation dword at p in every lane, broadcast from memory. */
PA_INLINE __m256i pa_bcast(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, sizeof(v));
    return _mm256_set1_epi32(v);
}

/* The eight rows' block sums against activation block x (less the
 * offset's share, which the caller adds): vpdpbusd, or vpmaddubsw and
 * vpmaddwd. */
PA_INLINE __m256i pa_dot(kn_type t, const __m256i w[8], const __m256i a[8], const int8_t *x)
{
#if PA_VNNI
    (void)t;
    (void)a;
    /* two chains, so a lone activation row is not one long wait */
    __m256i s0 = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), w[0], pa_bcast(x));
    __m256i s1 = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), w[4], pa_bcast(x + 16));
#pragma GCC unroll 3
    for (int k = 1; k < 4; k++) {
        s0 = _mm256_dpbusd_avx_epi32(s0, w[k], pa_bcast(x + 4 * k));
        s1 = _mm256_dpbusd_avx_epi32(s1, w[4 + k], pa_bcast(x + 16 + 4 * k));
    }
    return _mm256_add_epi32(s0, s1);
#else
    const __m256i one = _mm256_set1_epi16(1);
    if (!PA_SIGNED(t)) { /* quants of at most 31: four quads' pairs fit int16 */
        __m256i s0 = _mm256_maddubs_epi16(w[0], pa_bcast(x)), s1 = _mm256_maddubs_epi16(w[4], pa_bcast(x + 16));
#pragma GCC unroll 3
        for (int k = 1; k < 4; k++) {
            s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(w[k], pa_bcast(x + 4 * k)));
            s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(w[4 + k], pa_bcast(x + 16 + 4 * k)));
        }
        return _mm256_add_epi32(_mm256_madd_epi16(s0, one), _mm256_madd_epi16(s1, one));
    }
    __m256i s0 = _mm256_setzero_si256(), s1 = s0;
#pragma GCC unroll 4
    for (int i = 0; i < 8; i += 2) {
        const __m256i p0 = _mm256_maddubs_epi16(a[i], _mm256_sign_epi8(pa_bcast(x + 4 * i), w[i]));
        const __m256i p1 = _mm256_maddubs_epi16(a[i + 1], _mm256_sign_epi8(pa_bcast(x + 4 * i + 4), w[i + 1]));
        s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(p0, one));
        s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(p1, one));
    }
    return _mm256_add_epi32(s0, s1);
#endif
}

/* n_t (<= 16) rows of one group (scales at sc, quants at q) against K
 * activation rows, blocks [b0, b0 + ns); y row k gets (past the first
 * segment, continues) the n_t sums. Both halves of a block in turn, so each
 * line of quants is read once. */
PA_INLINE void pa_tile(kn_type t, int H, const uint8_t *sc, const uint8_t *q, size_t gb, int nb, int n_t,
                       const void *xq, size_t xs, int K, int b0, int ns, const pa_act *act, float *y, size_t ys)
{
    const bool has_min = pa_has_min(t), has_off = pa_offset(t) != 0;
    const size_t sb = pa_scale_bytes(t), qb = pa_quant_bytes(t), half_sc = t == KN_TYPE_MXFP4 ? 8 : 16;
    const pa_luts l = pa_luts_of(t);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i keep[2] = {_mm256_cmpgt_epi32(_mm256_set1_epi32(n_t), lane),
                             _mm256_cmpgt_epi32(_mm256_set1_epi32(n_t - 8), lane)};
    __m256 f[2][PA_KMAX];
#pragma GCC unroll 2
    for (int h = 0; h < H; h++)
#pragma GCC unroll 8
        for (int k = 0; k < K; k++)
            f[h][k] = b0 > 0 ? _mm256_maskload_ps(y + (size_t)k * ys + 8 * h, keep[h]) : _mm256_setzero_ps();
    for (int b = 0; b < ns; b++) {
        const int ib = b0 + b;
        /* the block 16 ahead (4 KiB), its scales 32 ahead */
        const char *ahead = x86_p16_ahead((const char *)q, ib, 16, nb, qb, gb);
        for (size_t line = 0; line < qb; line += 64)
            _mm_prefetch(ahead + line, _MM_HINT_T0);
        _mm_prefetch(x86_p16_ahead((const char *)sc, ib, 32, nb, sb, gb), _MM_HINT_T0);
#pragma GCC unroll 2
        for (int h = 0; h < H; h++) {
            const uint8_t *s = sc + (size_t)ib * sb + half_sc * h;
            const __m256 d = pa_scale(t, s);
            const __m256 m = has_min ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 32))) : d;
            __m256i w[8], a[8];
            pa_unpack(t, &l, q + (size_t)ib * qb + 32 * h, w, a);
#pragma GCC unroll 8
            for (int k = 0; k < K; k++) {
                __m256i si = pa_dot(t, w, a, (PA_X(k) + ib)->qs);
                if (has_off)
                    si = _mm256_add_epi32(si, _mm256_set1_epi32(act->corr[k][b]));
                const __m256 dx = _mm256_set1_ps(act->dx[k][b]);
                __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(si), _mm256_mul_ps(d, dx));
                if (has_min)
                    v = _mm256_add_ps(v, _mm256_mul_ps(_mm256_set1_ps(act->xsf[k][b]), _mm256_mul_ps(m, dx)));
                f[h][k] = _mm256_add_ps(f[h][k], v);
            }
        }
    }
#pragma GCC unroll 2
    for (int h = 0; h < H; h++)
#pragma GCC unroll 8
        for (int k = 0; k < K; k++)
            _mm256_maskstore_ps(y + (size_t)k * ys + 8 * h, keep[h], f[h][k]);
}

PA_INLINE void pa_run(kn_type t, const void *w, int n_w, const void *xq, size_t xs, int K, int nb, float *y,
                      size_t ys)
{
    const size_t sb = pa_scale_bytes(t), qb = pa_quant_bytes(t);
    const size_t quants_at = ((size_t)nb * sb + 63) & ~(size_t)63, gb = quants_at + (size_t)nb * qb;
    const bool terms = pa_offset(t) != 0 || pa_has_min(t);
    pa_act act;
    for (int b0 = 0; b0 < nb; b0 += PA_SEG) {
        const int ns = nb - b0 < PA_SEG ? nb - b0 : PA_SEG;
        for (int k = 0; k < K; k++)
            for (int b = 0; b < ns; b++) {
                const kn_block_q8_0 *xb = PA_X(k) + b0 + b;
                const int32_t sum = terms ? x86_xsum(xb->qs) : 0;
                act.corr[k][b] = -pa_offset(t) * sum;
                act.xsf[k][b] = (float)sum;
                act.dx[k][b] = kn_x86_f16_table[xb->d];
            }
        for (int o0 = 0; o0 < n_w; o0 += 16) {
            const uint8_t *g = (const uint8_t *)w + (size_t)(o0 / 16) * gb;
            const int n_t = n_w - o0 < 16 ? n_w - o0 : 16;
            /* the halves a constant in each call, so the sums stay in registers */
            if (n_t > 8)
                pa_tile(t, 2, g, g + quants_at, gb, nb, n_t, xq, xs, K, b0, ns, &act, y + o0, ys);
            else
                pa_tile(t, 1, g, g + quants_at, gb, nb, n_t, xq, xs, K, b0, ns, &act, y + o0, ys);
        }
    }
}

/* Batches cut into even chunks of at most PA_KMAX rows, K a constant in
 * each call so that the accumulators stay in registers. */
PA_INLINE void pa_gemm(kn_type t, const void *w, int n_w, const void *xq, size_t xs, int nr, int n, float *y,
                       size_t ys)
{
    for (int r = 0; r < nr;) {
        const int rest = nr - r, chunks = (rest + PA_KMAX - 1) / PA_KMAX;
        const int K = (rest + chunks - 1) / chunks;
        const char *xr = (const char *)xq + (size_t)r * xs;
        float *yr = y + (size_t)r * ys;
        switch (K) {
#define PA_CASE(k)                                                                                           \
    case k:                                                                                                  \
        pa_run(t, w, n_w, xr, xs, k, n / 32, yr, ys);                                                        \
        break;
            PA_CASE(1)
            PA_CASE(2)
            PA_CASE(3)
            PA_CASE(4)
            PA_CASE(5)
            PA_CASE(6)
            PA_CASE(7)
            PA_CASE(8)
#undef PA_CASE
        }
        r += K;
    }
}

#define PA_TYPE(T, tn)                                                                                       \
    static PA_ATTR void PA_FN(gemm_##tn##_packed)(const void *w, int n_w, const void *xq, size_t xs, int nr,  \
                                                  int n, float *y, size_t ys)                                \
    {                                                                                                        \
        pa_gemm(KN_TYPE_##T, w, n_w, xq, xs, nr, n, y, ys);                                                  \
    }
#if PA_VNNI
PA_TYPE(Q4_1, q4_1)
#endif
PA_TYPE(Q5_0, q5_0)
PA_TYPE(Q5_1, q5_1)
PA_TYPE(IQ4_NL, iq4_nl)
PA_TYPE(MXFP4, mxfp4)
#undef PA_TYPE

/* Q4_1 only with VNNI: on plain AVX2 its gemm over the rows as they lie
 * (ops_kquant_avx2.c) measured level at decode and faster at prefill
 * (bench/RESULTS.md). */
static void PA_FN(packed_fill)(kn_ops *ops)
{
#if PA_VNNI
    ops->gemm_packed[KN_TYPE_Q4_1] = PA_FN(gemm_q4_1_packed);
#endif
    ops->gemm_packed[KN_TYPE_Q5_0] = PA_FN(gemm_q5_0_packed);
    ops->gemm_packed[KN_TYPE_Q5_1] = PA_FN(gemm_q5_1_packed);
    ops->gemm_packed[KN_TYPE_IQ4_NL] = PA_FN(gemm_iq4_nl_packed);
    ops->gemm_packed[KN_TYPE_MXFP4] = PA_FN(gemm_mxfp4_packed);
}

#undef PA_SIGNED
#undef PA_X
#undef PA_SEG
#undef PA_KMAX
#undef PA_INLINE
