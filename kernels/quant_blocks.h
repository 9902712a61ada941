/* Block layouts of the quantized weight types, exactly as GGUF (ggml) stores
 * them, so files written by other tools load unchanged. Shared by the C and
 * CUDA backends: one definition, checked by static asserts. Scales are IEEE
 * halves (uint16_t) unless said otherwise; every struct is packed by nature
 * (2-byte members first or only byte arrays after them), as ggml's are. */
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
#define KN_QK4_1 32
#define KN_QK5_0 32
#define KN_QK5_1 32
#define KN_QK4_NL 32
#define KN_QK_MXFP4 32
/* The K-quants' and IQ4_XS's super-block. */
#define KN_QK_K 256
#define KN_K_SCALE_SIZE 12

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

/* Q4_1: nibbles as Q4_0's, with a minimum: x[i] = d * q[i] + m. */
typedef struct kn_block_q4_1 {
    uint16_t d, m;
    uint8_t qs[KN_QK4_1 / 2];
} kn_block_q4_1;

/* Q5_0: Q4_0's nibbles plus a fifth bit, bit i of qh (little-endian 32
 * bits) for element i: x[i] = d * (q[i] - 16). */
typedef struct kn_block_q5_0 {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[KN_QK5_0 / 2];
} kn_block_q5_0;

/* Q5_1: Q5_0's quants with a minimum: x[i] = d * q[i] + m. */
typedef struct kn_block_q5_1 {
    uint16_t d, m;
    uint8_t qh[4];
    uint8_t qs[KN_QK5_1 / 2];
} kn_block_q5_1;

/* Q2_K: 16 groups of 16. scales[j]: group j's 4-bit scale (low nibble) and
 * 4-bit min (high): x = d * sc * q - dmin * m, q 2 bits. Byte l of each
 * 32-byte half of qs holds, from its low bits up, elements l, l + 32,
 * l + 64, l + 96 of that half's 128. */
typedef struct kn_block_q2_K {
    uint8_t scales[KN_QK_K / 16];
    uint8_t qs[KN_QK_K / 4];
    uint16_t d, dmin;
} kn_block_q2_K;

/* Q3_K: 16 groups of 16, x = d * (sc - 32) * (q - 4 * !h): q's low 2 bits
 * in qs as Q2_K's, its high bit h in hmask (bit k of byte l: element
 * 32 k + l). The 6-bit scales: the low nibbles of groups 0-7 and 8-15 in
 * bytes 0-7 (low, high nibble), the top 2 bits of group j in byte 8 + j % 4
 * at bit 2 * (j / 4). */
typedef struct kn_block_q3_K {
    uint8_t hmask[KN_QK_K / 8];
    uint8_t qs[KN_QK_K / 4];
    uint8_t scales[KN_K_SCALE_SIZE];
    uint16_t d;
} kn_block_q3_K;

/* Q4_K: 8 groups of 32, x = d * sc * q - dmin * m with 6-bit sc and m
 * (packed as kn_k4_scale_min unpacks them). qs in 32-byte runs: run r holds
 * group 2r in its low nibbles and 2r + 1 in its high ones. */
typedef struct kn_block_q4_K {
    uint16_t d, dmin;
    uint8_t scales[KN_K_SCALE_SIZE];
    uint8_t qs[KN_QK_K / 2];
} kn_block_q4_K;

/* Q5_K: Q4_K plus a fifth bit: bit 2r (2r + 1) of qh[l] for element l of
 * group 2r (2r + 1). */
typedef struct kn_block_q5_K {
    uint16_t d, dmin;
    uint8_t scales[KN_K_SCALE_SIZE];
    uint8_t qh[KN_QK_K / 8];
    uint8_t qs[KN_QK_K / 2];
} kn_block_q5_K;

/* Q6_K: 16 groups of 16 with signed 8-bit scales: x = d * sc * (q - 32).
 * Each 128-element half: ql's 64 bytes hold elements l and l + 64 (byte
 * l < 32: elements l, l + 64; byte 32 + l: l + 32, l + 96) in low/high
 * nibbles; qh's 32 bytes their top 2 bits, elements l, l + 32, l + 64,
 * l + 96 from the low bits up. */
typedef struct kn_block_q6_K {
    uint8_t ql[KN_QK_K / 2];
    uint8_t qh[KN_QK_K / 4];
    int8_t scales[KN_QK_K / 16];
    uint16_t d;
} kn_block_q6_K;

/* Q8_K: the K-quants' activations. A float scale, and the sums of each 16
 * quants (for the mins and offsets). Never in a file. */
typedef struct kn_block_q8_K {
    float d;
    int8_t qs[KN_QK_K];
    int16_t bsums[KN_QK_K / 16];
} kn_block_q8_K;

/* IQ4_NL: Q4_0's nibble order, each an index into kn_iq4nl_values:
 * x[i] = d * kn_iq4nl_values[q[i]]. */
typedef struct kn_block_iq4_nl {
    uint16_t d;
    uint8_t qs[KN_QK4_NL / 2];
} kn_block_iq4_nl;

/* IQ4_XS: 8 IQ4_NL-style groups of 32 under one scale: group j's 6-bit
 * scale ls (low nibble in scales_l[j / 2], nibble j % 2; top 2 bits at bit
 * 2j of scales_h): x = d * (ls - 32) * kn_iq4nl_values[q]. */
typedef struct kn_block_iq4_xs {
    uint16_t d;
    uint16_t scales_h;
    uint8_t scales_l[KN_QK_K / 64];
    uint8_t qs[KN_QK_K / 2];
} kn_block_iq4_xs;

/* MXFP4 (OCP microscaling): an E8M0 exponent e and 32 E2M1 values in
 * Q4_0's nibble order: x[i] = 2^(e - 128) * kn_mxfp4_values[q[i]] (the
 * levels are E2M1's doubled, hence the half of 2^(e - 127)). */
typedef struct kn_block_mxfp4 {
    uint8_t e;
    uint8_t qs[KN_QK_MXFP4 / 2];
} kn_block_mxfp4;

KN_STATIC_ASSERT(sizeof(kn_block_q8_0) == 34, "Q8_0 block must be 34 bytes");
KN_STATIC_ASSERT(sizeof(kn_block_q4_0) == 18, "Q4_0 block must be 18 bytes");
KN_STATIC_ASSERT(sizeof(kn_block_q4_1) == 20, "Q4_1 block must be 20 bytes");
KN_STATIC_ASSERT(sizeof(kn_block_q5_0) == 22, "Q5_0 block must be 22 bytes");
KN_STATIC_ASSERT(sizeof(kn_block_q5_1) == 24, "Q5_1 block must be 24 bytes");
KN_STATIC_ASSERT(sizeof(kn_block_q2_K) == 84, "Q2_K block must be 84 bytes");
KN_STATIC_ASSERT(sizeof(kn_block_q3_K) == 110, "Q3_K block must be 110 bytes");
KN_STATIC_ASSERT(sizeof(kn_block_q4_K) == 144, "Q4_K block must be 144 bytes");
KN_STATIC_ASSERT(sizeof(kn_block_q5_K) == 176, "Q5_K block must be 176 bytes");
KN_STATIC_ASSERT(sizeof(kn_block_q6_K) == 210, "Q6_K block must be 210 bytes");
KN_STATIC_ASSERT(sizeof(kn_block_q8_K) == 292, "Q8_K block must be 292 bytes");
KN_STATIC_ASSERT(sizeof(kn_block_iq4_nl) == 18, "IQ4_NL block must be 18 bytes");
KN_STATIC_ASSERT(sizeof(kn_block_iq4_xs) == 136, "IQ4_XS block must be 136 bytes");
KN_STATIC_ASSERT(sizeof(kn_block_mxfp4) == 17, "MXFP4 block must be 17 bytes");

/* The 16 levels of IQ4_NL and IQ4_XS (ggml's kvalues_iq4nl). */
static const int8_t kn_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                           1,    13,   25,  38,  53,  69,  89,  113};

/* E2M1's 16 values, doubled to integers (ggml's kvalues_mxfp4). */
static const int8_t kn_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* The helpers below run on the host and, in kernels/cuda, on the device. */
#ifdef __CUDACC__
#define KN_HD __host__ __device__
#else
#define KN_HD
#endif

/* 2^(e - 128), the half of E8M0's 2^(e - 127), exactly (ggml's
 * GGML_E8M0_TO_FP32_HALF: e 0 and 1 are subnormal floats). */
static inline KN_HD float kn_e8m0_half(uint8_t e)
{
    const uint32_t u = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    union {
        uint32_t u;
        float f;
    } v;
    v.u = u;
    return v.f;
#endif
}

/* Q4_K and Q5_K: the 6-bit scale and min of group j < 8 from the 12 bytes.
 * Groups 0-3: the low 6 bits of bytes j (scale) and j + 4 (min); groups
 * 4-7: the nibbles of byte j + 4 (scale low, min low) and the top 2 bits
 * of bytes j - 4 (scale) and j (min). */
static inline KN_HD void kn_k4_scale_min(int j, const uint8_t *s, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4));
        *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

/* Q3_K: group j's 6-bit scale (0..63; the weight uses it less 32). */
static inline KN_HD int kn_q3k_scale(int j, const uint8_t *s)
{
    const int lo = j < 8 ? s[j] & 0xf : s[j - 8] >> 4;
    return lo | (((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4);
}

/* IQ4_XS: group j's 6-bit scale (0..63; the weight uses it less 32). */
static inline KN_HD int kn_iq4xs_scale(int j, const kn_block_iq4_xs *b)
{
    return ((b->scales_l[j / 2] >> (4 * (j % 2))) & 0xf) | (((b->scales_h >> (2 * j)) & 3) << 4);
}

#endif
