/* kernels: tensor type table (the traits of every type; the conversions of
 * the types beyond F32, F16, Q8_0 and Q4_0 are in kn_quants.c), IEEE half
 * and bfloat16 conversion and the reference Q8_0 and Q4_0 quantizers. These
 * two reproduce ggml's quantize_row_q8_0_ref and quantize_row_q4_0_ref
 * operation for operation, so a file we quantize is byte-identical to one
 * made by llama.cpp's tools and theirs load unchanged. */
#include "kernels/kn.h"
#include "kernels/kn_quants.h"
#include "kernels/quant_blocks.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

static void f32_to_f32(const float *x, void *y, int64_t n)
{
    memcpy(y, x, (size_t)n * sizeof(float));
}

static void f32_from_f32(const void *x, float *y, int64_t n)
{
    memcpy(y, x, (size_t)n * sizeof(float));
}

static void f16_from_f32(const float *x, void *y, int64_t n)
{
    uint16_t *h = y;
    for (int64_t i = 0; i < n; i++)
        h[i] = kn_fp32_to_fp16(x[i]);
}

static void f16_to_f32(const void *x, float *y, int64_t n)
{
    const uint16_t *h = x;
    for (int64_t i = 0; i < n; i++)
        y[i] = kn_fp16_to_fp32(h[i]);
}

static void quantize_q8_0(const float *x, void *y, int64_t n);
static void quantize_q4_0(const float *x, void *y, int64_t n);
static void dequantize_q8_0(const void *x, float *y, int64_t n);
static void dequantize_q4_0(const void *x, float *y, int64_t n);

/* Indexed by ggml's type number; name NULL where this build knows none. */
static const kn_type_traits type_traits[KN_TYPE_COUNT] = {
    [KN_TYPE_F32] = {"f32", 1, sizeof(float), KN_TYPE_F32, f32_from_f32, f32_to_f32},
    [KN_TYPE_F16] = {"f16", 1, sizeof(uint16_t), KN_TYPE_F32, f16_to_f32, f16_from_f32},
    [KN_TYPE_Q4_0] = {"q4_0", KN_QK4_0, sizeof(kn_block_q4_0), KN_TYPE_Q8_0, dequantize_q4_0, quantize_q4_0},
    [KN_TYPE_Q8_0] = {"q8_0", KN_QK8_0, sizeof(kn_block_q8_0), KN_TYPE_Q8_0, dequantize_q8_0, quantize_q8_0},
#define KN_TRAITS(T, t, elems, act) [KN_TYPE_##T] = {#t, elems, sizeof(kn_block_##t), KN_TYPE_##act, kn_dequantize_##t, kn_quantize_##t}
    KN_TRAITS(Q4_1, q4_1, KN_QK4_1, Q8_0),
    KN_TRAITS(Q5_0, q5_0, KN_QK5_0, Q8_0),
    KN_TRAITS(Q5_1, q5_1, KN_QK5_1, Q8_0),
    KN_TRAITS(Q2_K, q2_K, KN_QK_K, Q8_K),
    KN_TRAITS(Q3_K, q3_K, KN_QK_K, Q8_K),
    KN_TRAITS(Q4_K, q4_K, KN_QK_K, Q8_K),
    KN_TRAITS(Q5_K, q5_K, KN_QK_K, Q8_K),
    KN_TRAITS(Q6_K, q6_K, KN_QK_K, Q8_K),
    KN_TRAITS(Q8_K, q8_K, KN_QK_K, Q8_K),
    KN_TRAITS(IQ4_NL, iq4_nl, KN_QK4_NL, Q8_0),
    KN_TRAITS(IQ4_XS, iq4_xs, KN_QK_K, Q8_K),
    KN_TRAITS(MXFP4, mxfp4, KN_QK_MXFP4, Q8_0),
#undef KN_TRAITS
    [KN_TYPE_BF16] = {"bf16", 1, sizeof(uint16_t), KN_TYPE_BF16, kn_dequantize_bf16, kn_quantize_bf16},
};

const kn_type_traits *kn_type_traits_of(uint32_t type)
{
    return type < KN_TYPE_COUNT && type_traits[type].name != NULL ? &type_traits[type] : NULL;
}

bool kn_type_supported(uint32_t type)
{
    return kn_type_traits_of(type) != NULL && type != KN_TYPE_Q8_K;
}

/* ggml's enum names (GGML_TYPE_ less its prefix) of every type number ggml
 * has given, the removed ones too: what a refusal calls a type this build
 * does not read. */
static const char *const ggml_names[] = {
    "F32",     "F16",    "Q4_0",    "Q4_1",     "Q4_2",     "Q4_3",       "Q5_0",       "Q5_1",
    "Q8_0",    "Q8_1",   "Q2_K",    "Q3_K",     "Q4_K",     "Q5_K",       "Q6_K",       "Q8_K",
    "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S",    "IQ4_NL",   "IQ3_S",      "IQ2_S",      "IQ4_XS",
    "I8",      "I16",    "I32",     "I64",      "F64",      "IQ1_M",      "BF16",       "Q4_0_4_4",
    "Q4_0_4_8", "Q4_0_8_8", "TQ1_0", "TQ2_0",   "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8", "MXFP4",
    "NVFP4",   "Q1_0",   "Q2_0",
};

const char *kn_ggml_type_name(uint32_t type)
{
    return type < sizeof(ggml_names) / sizeof(ggml_names[0]) ? ggml_names[type] : NULL;
}

/* The packed types' names: the file type's, and " (packed)". */
static const char *const packed_names[KN_TYPE_COUNT] = {
#define KN_PACKED_NAME(T, t) [KN_TYPE_##T] = #t " (packed)"
    KN_PACKED_NAME(Q8_0, q8_0),  KN_PACKED_NAME(Q4_0, q4_0),     KN_PACKED_NAME(Q4_1, q4_1),
    KN_PACKED_NAME(Q5_0, q5_0),  KN_PACKED_NAME(Q5_1, q5_1),     KN_PACKED_NAME(IQ4_NL, iq4_nl),
    KN_PACKED_NAME(Q2_K, q2_K),  KN_PACKED_NAME(Q3_K, q3_K),     KN_PACKED_NAME(Q4_K, q4_K),
    KN_PACKED_NAME(Q5_K, q5_K),  KN_PACKED_NAME(Q6_K, q6_K),     KN_PACKED_NAME(IQ4_XS, iq4_xs),
    KN_PACKED_NAME(MXFP4, mxfp4),
#undef KN_PACKED_NAME
};

const char *kn_type_name(uint32_t type)
{
    if (kn_type_packed((kn_type)type))
        return (type & 0xff) < KN_TYPE_COUNT ? packed_names[type & 0xff] : NULL;
    const kn_type_traits *t = kn_type_traits_of(type);
    return t != NULL ? t->name : NULL;
}

int kn_type_from_name(const char *name, kn_type *out)
{
    if (name == NULL)
        return -1;
    for (uint32_t i = 0; i < KN_TYPE_COUNT; i++) {
        if (type_traits[i].name != NULL && strcasecmp(name, type_traits[i].name) == 0) {
            if (out != NULL)
                *out = (kn_type)i;
            return 0;
        }
    }
    return -1;
}

int64_t kn_type_block_elems(uint32_t type)
{
    const kn_type_traits *t = kn_type_traits_of(type);
    return t != NULL ? t->block_elems : 0;
}

size_t kn_type_block_bytes(uint32_t type)
{
    const kn_type_traits *t = kn_type_traits_of(type);
    return t != NULL ? t->block_bytes : 0;
}

size_t kn_row_bytes(uint32_t type, int64_t n)
{
    int64_t be = kn_type_block_elems(type);
    size_t bb = kn_type_block_bytes(type);
    if (be == 0 || n < 0 || n % be != 0)
        return 0;
    uint64_t nb = (uint64_t)(n / be);
    /* n comes from file headers: refuse sizes whose byte count would wrap. */
    if (nb > SIZE_MAX / bb)
        return 0;
    return (size_t)nb * bb;
}

size_t kn_kv_row_units(kn_type kv_type, int head_dim)
{
    if (head_dim <= 0 || (kv_type != KN_TYPE_F16 && kv_type != KN_TYPE_Q8_0))
        return 0;
    return kn_row_bytes(kv_type, head_dim) / sizeof(uint16_t);
}

/* ---- IEEE 754 binary16 ---------------------------------------------------
 * Portable bit manipulation rather than F16C, so the reference and the file
 * tools give the same answer on every CPU; the SIMD backends use F16C, which
 * rounds the same way (to nearest, ties to even). */

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static inline float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

float kn_fp16_to_fp32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;

    if (exp == 0) {
        /* Zero or subnormal: mant * 2^-24 is exact in float. */
        float v = (float)mant * (1.0f / 16777216.0f);
        return f32_from_bits(f32_bits(v) | sign);
    }
    if (exp == 31) /* inf, or NaN with its payload kept */
        return f32_from_bits(sign | 0x7f800000u | (mant << 13));
    return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t kn_fp32_to_fp16(float f)
{
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;

    if (a >= 0x7f800000u) {
        if (a == 0x7f800000u)
            return sign | 0x7c00u;
        /* NaN: keep the top payload bits and force it quiet so it stays NaN. */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    }
    /* 65520 is halfway between 65504 (max half) and 65536; ties to even
     * round it up, so everything from there on is infinity. */
    if (a >= 0x477ff000u)
        return sign | 0x7c00u;
    if (a < 0x38800000u) {
        /* Below the smallest normal half: produce a subnormal (or zero) by
         * shifting the full significand into units of 2^-24. */
        uint32_t e = a >> 23;
        if (e < 102) /* under half of 2^-24: rounds to zero */
            return sign;
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e;
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1)))
            q++;
        return (uint16_t)(sign | q);
    }
    uint32_t h = ((a >> 23) - 112) << 10 | ((a >> 13) & 0x3ffu);
    uint32_t rem = a & 0x1fffu;
    /* A carry out of the mantissa correctly bumps the exponent. */
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
        h++;
    return (uint16_t)(sign | h);
}

/* Rounded to nearest even on the 16 bits dropped; a NaN stays a NaN (its
 * payload's top bits kept, made quiet), as ggml's conversion does. */
uint16_t kn_fp32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 64);
    return (uint16_t)((u + (0x7fffu + ((u >> 16) & 1))) >> 16);
}

/* ---- reference quantization ---------------------------------------------- */

static void quantize_q8_0(const float *x, void *vy, int64_t n)
{
    kn_block_q8_0 *y = vy;
    int64_t nb = n / KN_QK8_0;
    for (int64_t i = 0; i < nb; i++) {
        const float *xb = x + i * KN_QK8_0;
        float amax = 0.0f;
        for (int j = 0; j < KN_QK8_0; j++)
            amax = fmaxf(amax, fabsf(xb[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = kn_fp32_to_fp16(d);
        for (int j = 0; j < KN_QK8_0; j++) {
            /* |x*id| <= 127 for finite input; the range test only keeps
             * NaN/inf input from an undefined conversion. */
            float r = roundf(xb[j] * id);
            y[i].qs[j] = (int8_t)(r >= -128.0f && r <= 127.0f ? (int)r : 0);
        }
    }
}

/* a * b rounded to float on its own, as ggml computes it: a compiler allowed
 * to contract `a * b + c` into a fused multiply-add would skip this rounding
 * and, at exact ties, pick another level than ggml does. */
static inline float mul_rounded(float a, float b)
{
    volatile float p = a * b;
    return p;
}

static void quantize_q4_0(const float *x, void *vy, int64_t n)
{
    kn_block_q4_0 *y = vy;
    int64_t nb = n / KN_QK4_0;
    for (int64_t i = 0; i < nb; i++) {
        const float *xb = x + i * KN_QK4_0;
        float amax = 0.0f, max = 0.0f;
        /* Keep the sign of the largest magnitude: mapping it to -8 uses the
         * one extra negative level of the 4-bit range. */
        for (int j = 0; j < KN_QK4_0; j++) {
            if (amax < fabsf(xb[j])) {
                amax = fabsf(xb[j]);
                max = xb[j];
            }
        }
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = kn_fp32_to_fp16(d);
        for (int j = 0; j < KN_QK4_0 / 2; j++) {
            /* ggml truncates x*id + 8.5 to int8; the value is in [0.5, 16.5]
             * for finite input, where int truncation is identical. The
             * clamps only keep NaN/inf input defined. */
            float f0 = mul_rounded(xb[j], id) + 8.5f;
            float f1 = mul_rounded(xb[j + KN_QK4_0 / 2], id) + 8.5f;
            int q0 = f0 >= 0.0f ? (f0 < 15.0f ? (int)f0 : 15) : 0;
            int q1 = f1 >= 0.0f ? (f1 < 15.0f ? (int)f1 : 15) : 0;
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static void dequantize_q8_0(const void *x, float *y, int64_t n)
{
    const kn_block_q8_0 *b = x;
    for (int64_t i = 0; i < n / KN_QK8_0; i++) {
        const float d = kn_fp16_to_fp32(b[i].d);
        for (int j = 0; j < KN_QK8_0; j++)
            y[i * KN_QK8_0 + j] = (float)b[i].qs[j] * d;
    }
}

static void dequantize_q4_0(const void *x, float *y, int64_t n)
{
    const kn_block_q4_0 *b = x;
    for (int64_t i = 0; i < n / KN_QK4_0; i++) {
        const float d = kn_fp16_to_fp32(b[i].d);
        float *yb = y + i * KN_QK4_0;
        for (int j = 0; j < KN_QK4_0 / 2; j++) {
            yb[j] = (float)((b[i].qs[j] & 0x0f) - 8) * d;
            yb[j + KN_QK4_0 / 2] = (float)((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

void kn_quantize_row(kn_type type, const float *x, void *y, int64_t n)
{
    const kn_type_traits *t = kn_type_traits_of(type);
    if (t != NULL)
        t->quantize_row(x, y, n);
}

void kn_dequantize_row(kn_type type, const void *x, float *y, int64_t n)
{
    const kn_type_traits *t = kn_type_traits_of(type);
    if (t != NULL)
        t->dequantize_row(x, y, n);
}

size_t kn_pack_q8_0_bytes(int n_out, int n_in)
{
    if (n_out <= 0 || n_in <= 0 || n_in % KN_QK8_0)
        return 0;
    return (size_t)((n_out + 15) / 16) * kn_p16_group_bytes(n_in / KN_QK8_0);
}

size_t kn_pack_q4_0_bytes(int n_out, int n_in)
{
    if (n_out <= 0 || n_in <= 0 || n_in % KN_QK4_0)
        return 0;
    return (size_t)((n_out + 15) / 16) * kn_p16_q4_group_bytes(n_in / KN_QK4_0);
}

/* Both layouts (kn.h): blocks of a 16-bit scale and then quads quad
 * dwords of quants, as Q8_0 and Q4_0 blocks are. */
static void pack_p16(const void *w, int n_out, int n_in, size_t block_bytes, int quads, void *dst)
{
    const int nb = n_in / 32;
    const size_t row_bytes = (size_t)nb * block_bytes, quant_bytes = (size_t)quads * 64;
    const size_t group_bytes = kn_p16_quants_at(nb) + (size_t)nb * quant_bytes;
    uint8_t *group = dst;
    for (int g = 0; g < (n_out + 15) / 16; g++, group += group_bytes) {
        memset(group, 0, group_bytes); /* padding rows: zero scales, zero quants */
        for (int b = 0; b < nb; b++) {
            uint8_t *sc = group + (size_t)b * KN_P16_SCALE_BYTES;
            uint8_t *q = group + kn_p16_quants_at(nb) + (size_t)b * quant_bytes;
            for (int j = 0; j < 16 && g * 16 + j < n_out; j++) {
                const uint8_t *blk = (const uint8_t *)w + (size_t)(g * 16 + j) * row_bytes + b * block_bytes;
                memcpy(sc + 2 * j, blk, 2); /* the scale, then the quants */
                for (int k = 0; k < quads; k++)
                    memcpy(q + 64 * k + 4 * j, blk + 2 + 4 * k, 4);
            }
        }
    }
}

void kn_pack_q8_0(const void *w, int n_out, int n_in, void *dst)
{
    pack_p16(w, n_out, n_in, sizeof(kn_block_q8_0), 8, dst);
}

void kn_pack_q4_0(const void *w, int n_out, int n_in, void *dst)
{
    pack_p16(w, n_out, n_in, sizeof(kn_block_q4_0), 4, dst);
}
