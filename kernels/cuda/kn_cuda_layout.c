/* kernels/cuda: the host side of the device layouts — weight sizes, the
 * repacking of GGUF blocks into quants plus scales, the Q8_0 activation
 * buffer, the MIG profile in a device name. Plain C, no CUDA calls, so the
 * tests check it on machines without a GPU. */
#include "kernels/cuda/kn_cuda.h"
#include "kernels/quant_blocks.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#define ALIGN_UP(x, a) (((x) + (a)-1) / (a) * (a))

void kn_cuda_mig_profile_from_name(const char *name, char *out, size_t out_len)
{
    if (out_len == 0)
        return;
    out[0] = '\0';
    const char *p = name ? strstr(name, " MIG ") : NULL;
    if (!p)
        return;
    p += 5;
    while (*p == ' ')
        p++;
    size_t n = strcspn(p, " \t");
    if (n >= out_len)
        n = out_len - 1;
    memcpy(out, p, n);
    out[n] = '\0';
}

/* Quants of one row in the device layout. */
static uint64_t q_row_bytes(kn_type type, int n_in)
{
    return type == KN_TYPE_Q8_0 ? (uint64_t)n_in : (uint64_t)n_in / 2;
}

bool kn_cuda_raw_layout(kn_type type)
{
    switch (type) {
    case KN_TYPE_Q4_1:
    case KN_TYPE_Q5_0:
    case KN_TYPE_Q5_1:
    case KN_TYPE_IQ4_NL:
    case KN_TYPE_Q2_K:
    case KN_TYPE_Q3_K:
    case KN_TYPE_Q4_K:
    case KN_TYPE_Q5_K:
    case KN_TYPE_Q6_K:
    case KN_TYPE_IQ4_XS:
    case KN_TYPE_BF16:
    case KN_TYPE_MXFP4:
        return true;
    default:
        return false;
    }
}

uint64_t kn_cuda_weight_bytes(kn_type type, int n_out, int n_in)
{
    if (n_out <= 0 || n_in <= 0)
        return 0;
    if (kn_cuda_raw_layout(type)) /* the rows as they are, in units of 32 elements */
        return n_in % 32 == 0 ? (uint64_t)n_out * kn_row_bytes(type, n_in) : 0;
    switch (type) {
    case KN_TYPE_F32:
        return (uint64_t)n_out * n_in * 4;
    case KN_TYPE_F16:
        return (uint64_t)n_out * n_in * 2;
    case KN_TYPE_Q8_0:
    case KN_TYPE_Q4_0:
        if (n_in % 32 != 0)
            return 0;
        /* Scales start 256-byte aligned after the quants. */
        return ALIGN_UP((uint64_t)n_out * q_row_bytes(type, n_in), 256) + (uint64_t)n_out * (n_in / 32) * 2;
    default: /* no device layout */
        break;
    }
    return 0;
}

int kn_cuda_repack_rows(kn_type type, const void *gguf_rows, int n_rows, int n_in, void *q, uint16_t *scl)
{
    if (n_rows < 0 || n_in <= 0 || n_in % 32 != 0)
        return -EINVAL;
    const size_t nb = (size_t)n_in / 32;
    if (type == KN_TYPE_Q8_0) {
        const kn_block_q8_0 *b = gguf_rows;
        int8_t *dq = q;
        for (size_t i = 0; i < (size_t)n_rows * nb; i++) {
            memcpy(dq + i * KN_QK8_0, b[i].qs, KN_QK8_0);
            scl[i] = b[i].d;
        }
        return 0;
    }
    if (type == KN_TYPE_Q4_0) {
        const kn_block_q4_0 *b = gguf_rows;
        uint8_t *dq = q;
        for (size_t i = 0; i < (size_t)n_rows * nb; i++) {
            memcpy(dq + i * (KN_QK4_0 / 2), b[i].qs, KN_QK4_0 / 2);
            scl[i] = b[i].d;
        }
        return 0;
    }
    return -EINVAL;
}

size_t kn_cuda_q8_meta_offset(int n_rows, int n)
{
    return ALIGN_UP((size_t)n_rows * (size_t)n, 16);
}

size_t kn_cuda_q8_bytes(int n_rows, int n)
{
    return kn_cuda_q8_meta_offset(n_rows, n) + (size_t)n_rows * (size_t)(n / 32) * 8;
}

bool kn_cuda_matmul_wants_q8(kn_type type, int n_rows)
{
    return (type == KN_TYPE_Q8_0 || type == KN_TYPE_Q4_0) && n_rows <= KN_CUDA_MMV_MAX_ROWS;
}
