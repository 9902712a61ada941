/* kernels/x86: the AVX2 packed gemms of the 32-element types Q5_0, Q5_1,
 * IQ4_NL and MXFP4 (kn_pack's layout, kn_pack.h), for CPUs without the
 * AVX-512 VBMI/GFNI ones of ops_packed_avx512.c. (Q4_1 keeps its gemm over
 * the rows as they lie, ops_kquant_avx2.c: level with this one at decode,
 * faster at prefill, bench/RESULTS.md.) Built with the AVX2
 * flags and -ffp-contract=off; installed in the AVX2 table (and so in the
 * tables copied from it), whose constructor checks the CPU. They serve
 * decode and prefill alike: a model whose table has them packs its matrices
 * of these types at load.
 *
 * The code is packed_x86.h's, compiled here for AVX2 and in
 * ops_avxvnni_avx2.c for AVX-VNNI (vpdpbusd in place of vpmaddubsw +
 * vpmaddwd, IQ4_NL moved up by 128 in place of the sign trick, and Q4_1
 * packed too: faster there than its gemm over the rows as they lie).
 *
 * Dword j of a packed quant vector is row j's four bytes of a quad pair, so
 * a 256-bit half of it is eight weight rows in eight int32 lanes, against
 * the activation block's matching dword broadcast: the lanes hold the eight
 * rows' complete block sums, with no reduction across lanes.
 *
 *  - Q5_0's and Q5_1's 5 bits (two shifts and masks and an or from the
 *    layout's fields) and MXFP4's doubled E2M1 levels moved up
 *    by 12 (a vpshufb of the nibbles) are the unsigned side of vpmaddubsw:
 *    quants of at most 31, so four quads' pairs (at most 4 * 2 * 31 * 128)
 *    add up in int16 before they are widened. Q5_0's 16 and MXFP4's 12
 *    times the activation block's quant sum, computed once per call, come
 *    off again.
 *  - IQ4_NL's levels (-127..113, a vpshufb away) are too wide for that
 *    (pairs of 241 * 127 saturate int16), so they take the sign trick,
 *    |level| . sign(x, level), each pair at most 2 * 127 * 127
 *    (activations, as the Q8_0 quantizer makes them, stay within +-127),
 *    widened a quad at a time.
 *
 * Each block's integer sum is exact; then (float)sumi * (d * dx) +
 * (float)xs * (m * dx), each product rounded (the min's term only for
 * Q5_1: the reference adds an exact 0 for the others), is added to the
 * row's running sum in block order, as the reference does, so the results
 * are the reference's bits. MXFP4's d, 2^(e - 128), is made from its
 * exponent byte in integer lanes exactly as kn_e8m0_half makes it,
 * subnormal 2^-128 and 2^-127 included. */
#include "kernels/kn.h"
#include "kernels/kn_pack.h"
#include "kernels/quant_blocks.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "kernels/x86/ops_x86.h"

#define PA_VNNI 0
#define PA_FN(n) avx2_##n
#define PA_ATTR
#include "kernels/x86/packed_x86.h"

void kn_x86_packed_avx2_fill(kn_ops *ops)
{
    avx2_packed_fill(ops);
}

#endif
