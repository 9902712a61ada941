/* kernels: the reference conversions of the types beyond F32/F16/Q8_0/Q4_0
 * (kn_quants.c), for the traits table in kn_types.c. Internal to kernels/;
 * everything else reaches them through kn_type_traits_of. */
#ifndef KN_QUANTS_H
#define KN_QUANTS_H

#include <stdint.h>

#define KN_QUANT_FNS(t)                                                                                      \
    void kn_dequantize_##t(const void *x, float *y, int64_t n);                                             \
    void kn_quantize_##t(const float *x, void *y, int64_t n);
KN_QUANT_FNS(q4_1)
KN_QUANT_FNS(q5_0)
KN_QUANT_FNS(q5_1)
KN_QUANT_FNS(q2_K)
KN_QUANT_FNS(q3_K)
KN_QUANT_FNS(q4_K)
KN_QUANT_FNS(q5_K)
KN_QUANT_FNS(q6_K)
KN_QUANT_FNS(q8_K)
KN_QUANT_FNS(iq4_nl)
KN_QUANT_FNS(iq4_xs)
KN_QUANT_FNS(mxfp4)
KN_QUANT_FNS(bf16)
#undef KN_QUANT_FNS

#endif
