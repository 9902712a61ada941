/* kernels/cuda: the weight types kept on the device as their GGUF blocks
 * (Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K..Q6_K, IQ4_XS, BF16, MXFP4): a device function
 * that turns 32 consecutive elements of a row (a "unit": a 32-element
 * block, or an eighth of a K-quant super-block) into floats, operation for
 * operation as kernels/kn_quants.c's reference dequantizers. The decode
 * matvec, the dequantize-to-F16 pass before cuBLAS and the embedding lookup
 * all go through it. Not a public header. */
#ifndef KN_CUDA_BLOCKS_CUH
#define KN_CUDA_BLOCKS_CUH

#include "kernels/cuda/kn_cuda_internal.cuh"

/* IQ4_NL's and IQ4_XS's levels (kernels/quant_blocks.h's kn_iq4nl_values). */
__constant__ static const int8_t kn_dev_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                            1,    13,   25,  38,  53,  69,  89,  113};

/* E2M1's levels, doubled (kernels/quant_blocks.h's kn_mxfp4_values). */
__constant__ static const int8_t kn_dev_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* A little-endian half at p (2-byte aligned: every block is, and so is
 * every half in it). */
__device__ __forceinline__ float kn_dev_half(const uint8_t *p)
{
    return __half2float(__ushort_as_half(*(const unsigned short *)p));
}

/* Element l (0..31) of a Q5_0/Q5_1 block: its nibble and its fifth bit. */
__device__ __forceinline__ int kn_dev_unpack5(const uint8_t *qs, uint32_t qh, int l)
{
    const int lo = l < 16 ? qs[l] & 0xf : qs[l - 16] >> 4;
    return lo | (int)((qh >> l) & 1) << 4;
}

/* Elements 32u..32u+31 of a row of type t (a multiple of 32 elements long)
 * into v. */
__device__ __forceinline__ void kn_dq_unit(kn_type t, const uint8_t *__restrict__ row, int u, float (&v)[32])
{
    switch (t) {
    case KN_TYPE_Q4_1: {
        const kn_block_q4_1 *b = (const kn_block_q4_1 *)row + u;
        const float d = kn_dev_half((const uint8_t *)&b->d), m = kn_dev_half((const uint8_t *)&b->m);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            v[j] = (float)(b->qs[j] & 0xf) * d + m;
            v[j + 16] = (float)(b->qs[j] >> 4) * d + m;
        }
        return;
    }
    case KN_TYPE_Q5_0:
    case KN_TYPE_Q5_1: {
        const bool q51 = t == KN_TYPE_Q5_1;
        const uint8_t *blk = row + (size_t)u * (q51 ? sizeof(kn_block_q5_1) : sizeof(kn_block_q5_0));
        const float d = kn_dev_half(blk), m = q51 ? kn_dev_half(blk + 2) : 0.0f;
        const uint8_t *qh4 = blk + (q51 ? 4 : 2), *qs = qh4 + 4;
        const uint32_t qh = qh4[0] | (uint32_t)qh4[1] << 8 | (uint32_t)qh4[2] << 16 | (uint32_t)qh4[3] << 24;
#pragma unroll
        for (int l = 0; l < 32; l++)
            v[l] = q51 ? (float)kn_dev_unpack5(qs, qh, l) * d + m : (float)(kn_dev_unpack5(qs, qh, l) - 16) * d;
        return;
    }
    case KN_TYPE_IQ4_NL: {
        const kn_block_iq4_nl *b = (const kn_block_iq4_nl *)row + u;
        const float d = kn_dev_half((const uint8_t *)&b->d);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            v[j] = d * kn_dev_iq4nl_values[b->qs[j] & 0xf];
            v[j + 16] = d * kn_dev_iq4nl_values[b->qs[j] >> 4];
        }
        return;
    }
    case KN_TYPE_MXFP4: { /* the exponent exactly as kn_e8m0_half makes it, subnormals included */
        const kn_block_mxfp4 *b = (const kn_block_mxfp4 *)row + u;
        const float d = kn_e8m0_half(b->e);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            v[j] = d * kn_dev_mxfp4_values[b->qs[j] & 0xf];
            v[j + 16] = d * kn_dev_mxfp4_values[b->qs[j] >> 4];
        }
        return;
    }
    case KN_TYPE_BF16: {
        const unsigned short *h = (const unsigned short *)row + (size_t)u * 32;
#pragma unroll
        for (int l = 0; l < 32; l++)
            v[l] = __uint_as_float((unsigned)h[l] << 16);
        return;
    }
    case KN_TYPE_Q2_K: {
        const kn_block_q2_K *b = (const kn_block_q2_K *)row + u / 8;
        const int s = u % 8; /* elements 32s..32s+31 of the super-block */
        const float d = kn_dev_half((const uint8_t *)&b->d), dmin = kn_dev_half((const uint8_t *)&b->dmin);
        const uint8_t *qs = b->qs + s / 4 * 32;
        const int shift = 2 * (s % 4);
#pragma unroll
        for (int l = 0; l < 32; l++) {
            const uint8_t sc = b->scales[2 * s + l / 16];
            v[l] = d * (sc & 0xf) * (float)((qs[l] >> shift) & 3) - dmin * (sc >> 4);
        }
        return;
    }
    case KN_TYPE_Q3_K: {
        const kn_block_q3_K *b = (const kn_block_q3_K *)row + u / 8;
        const int s = u % 8;
        const float d = kn_dev_half((const uint8_t *)&b->d);
        const uint8_t *qs = b->qs + s / 4 * 32;
        const int shift = 2 * (s % 4);
#pragma unroll
        for (int l = 0; l < 32; l++) {
            const int hi = (b->hmask[l] >> s) & 1;
            const int q = ((qs[l] >> shift) & 3) - (hi ? 0 : 4);
            v[l] = d * (float)(kn_q3k_scale(2 * s + l / 16, b->scales) - 32) * (float)q;
        }
        return;
    }
    case KN_TYPE_Q4_K:
    case KN_TYPE_Q5_K: {
        const bool q5 = t == KN_TYPE_Q5_K;
        const uint8_t *blk = row + (size_t)(u / 8) * (q5 ? sizeof(kn_block_q5_K) : sizeof(kn_block_q4_K));
        const int j = u % 8;
        const float d = kn_dev_half(blk), dmin = kn_dev_half(blk + 2);
        uint8_t sc, m;
        kn_k4_scale_min(j, blk + 4, &sc, &m);
        const float dl = d * sc, ml = dmin * m;
        const uint8_t *qh = blk + 4 + KN_K_SCALE_SIZE;
        const uint8_t *q = qh + (q5 ? KN_QK_K / 8 : 0) + 32 * (j / 2);
#pragma unroll
        for (int l = 0; l < 32; l++) {
            const int lo = j % 2 ? q[l] >> 4 : q[l] & 0xf;
            v[l] = dl * (float)(lo | (q5 ? ((qh[l] >> j) & 1) << 4 : 0)) - ml;
        }
        return;
    }
    case KN_TYPE_Q6_K: {
        const kn_block_q6_K *b = (const kn_block_q6_K *)row + u / 8;
        const int s = u % 8, h = s / 4, k = s % 4;
        const float d = kn_dev_half((const uint8_t *)&b->d);
#pragma unroll
        for (int l = 0; l < 32; l++) {
            const uint8_t byte = b->ql[64 * h + 32 * (k % 2) + l];
            const int lo = k < 2 ? byte & 0xf : byte >> 4;
            const int q = lo | (((b->qh[32 * h + l] >> (2 * k)) & 3) << 4);
            v[l] = d * (float)b->scales[2 * s + l / 16] * (float)(q - 32);
        }
        return;
    }
    case KN_TYPE_IQ4_XS: {
        const kn_block_iq4_xs *b = (const kn_block_iq4_xs *)row + u / 8;
        const int j = u % 8;
        const float dl = kn_dev_half((const uint8_t *)&b->d) * (float)(kn_iq4xs_scale(j, b) - 32);
        const uint8_t *q = b->qs + 16 * j;
#pragma unroll
        for (int l = 0; l < 16; l++) {
            v[l] = dl * kn_dev_iq4nl_values[q[l] & 0xf];
            v[l + 16] = dl * kn_dev_iq4nl_values[q[l] >> 4];
        }
        return;
    }
    default:
#pragma unroll
        for (int l = 0; l < 32; l++)
            v[l] = 0.0f;
        return;
    }
}

#endif
