/* kernels/x86: what the x86 backend files share. Internal to kernels/x86;
 * everything else reaches these kernels only through the kn_ops tables. */
#ifndef KN_OPS_X86_H
#define KN_OPS_X86_H

#include <immintrin.h>

/* All 65536 IEEE halves as floats, for block scales: filled by kn_ops_avx2()
 * before it first returns its table. */
extern float kn_x86_f16_table[1 << 16];

static inline float hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#endif
