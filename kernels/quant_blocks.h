/* Block layouts of the quantized weight types, exactly as GGUF (ggml) stores
 * them, so files written by other tools load unchanged. Shared by the C and
 * CUDA backends: one definition, checked by static asserts. */
#ifndef KN_QUANT_BLOCKS_H
#define KN_QUANT_BLOCKS_H

#include <stdint.h>

#ifdef __cplusplus
#define KN_STATIC_ASSERT static_assert
#else
#include <assert.h>
#define KN_STATIC_ASSERT _Static_assert
#endif

#define KN_QK8_0 32
#define KN_QK4_0 32

/* Q8_0: 32 signed bytes and one F16 scale: x[i] = d * qs[i]. */
typedef struct kn_block_q8_0 {
    uint16_t d; /* IEEE half */
    int8_t qs[KN_QK8_0];
} kn_block_q8_0;

/* Q4_0: 32 unsigned nibbles and one F16 scale: x[i] = d * (q[i] - 8).
 * Byte j holds element j in its low nibble and element j+16 in its high one. */
typedef struct kn_block_q4_0 {
    uint16_t d;
    uint8_t qs[KN_QK4_0 / 2];
} kn_block_q4_0;

KN_STATIC_ASSERT(sizeof(kn_block_q8_0) == 34, "Q8_0 block must be 34 bytes");
KN_STATIC_ASSERT(sizeof(kn_block_q4_0) == 18, "Q4_0 block must be 18 bytes");

#endif
