/* kernels: the packed layouts of every quantized weight type (kn_pack,
 * kn_pack_bytes), for the packed gemms of the SIMD tables. Where things lie
 * is described in kn_pack.h; Q8_0 and Q4_0 keep their own packers in
 * kn_types.c. Portable C, run once per matrix at model load: each block is
 * first decoded to the small unsigned integers the gemm multiplies (and its
 * scales to bytes), then scattered into the group's vectors. */
#include "kernels/kn.h"
#include "kernels/kn_pack.h"
#include "kernels/quant_blocks.h"

#include <stdbool.h>
#include <string.h>

/* One row's super-block or block, decoded: u the unsigned quant of each
 * element (the index of IQ4_NL's, IQ4_XS's and MXFP4's level), sc and mn
 * the group scales and mins as the layout stores them, d and m the halves
 * (MXFP4: d its E8M0 exponent byte). */
typedef struct kp_rowblock {
    uint8_t u[KN_QK_K];
    uint8_t sc[16], mn[16];
    uint16_t d, m;
} kp_rowblock;

static void decode_k(kn_type t, const void *blk, kp_rowblock *r)
{
    memset(r, 0, sizeof(*r));
    switch (t) {
    case KN_TYPE_Q4_K:
    case KN_TYPE_Q5_K: {
        const bool q5 = t == KN_TYPE_Q5_K;
        const kn_block_q4_K *b4 = blk;
        const kn_block_q5_K *b5 = blk;
        const uint8_t *qs = q5 ? b5->qs : b4->qs, *scales = q5 ? b5->scales : b4->scales;
        for (int e = 0; e < KN_QK_K; e++) {
            const int j = e / 32, byte = qs[32 * (j / 2) + e % 32];
            const int lo = j % 2 ? byte >> 4 : byte & 0xf;
            r->u[e] = (uint8_t)(lo | (q5 ? ((b5->qh[e % 32] >> j) & 1) << 4 : 0));
        }
        for (int j = 0; j < 8; j++)
            kn_k4_scale_min(j, scales, &r->sc[j], &r->mn[j]);
        r->d = q5 ? b5->d : b4->d;
        r->m = q5 ? b5->dmin : b4->dmin;
        return;
    }
    case KN_TYPE_Q6_K: {
        const kn_block_q6_K *b = blk;
        for (int e = 0; e < KN_QK_K; e++) {
            const int h = e / 128, c = e % 128 / 32, l = e % 32;
            const uint8_t byte = b->ql[64 * h + 32 * (c % 2) + l];
            const int lo = c < 2 ? byte & 0xf : byte >> 4;
            r->u[e] = (uint8_t)(lo | ((b->qh[32 * h + l] >> (2 * c)) & 3) << 4);
        }
        memcpy(r->sc, b->scales, 16);
        r->d = b->d;
        return;
    }
    case KN_TYPE_Q3_K:
    case KN_TYPE_Q2_K: {
        const bool q3 = t == KN_TYPE_Q3_K;
        const kn_block_q3_K *b3 = blk;
        const kn_block_q2_K *b2 = blk;
        const uint8_t *qs = q3 ? b3->qs : b2->qs;
        for (int e = 0; e < KN_QK_K; e++) {
            const int lo = (qs[e / 128 * 32 + e % 32] >> (2 * (e % 128 / 32))) & 3;
            r->u[e] = (uint8_t)(lo | (q3 ? ((b3->hmask[e % 32] >> (e / 32)) & 1) << 2 : 0));
        }
        for (int g = 0; g < 16; g++)
            r->sc[g] = q3 ? (uint8_t)(kn_q3k_scale(g, b3->scales) - 32) : b2->scales[g];
        r->d = q3 ? b3->d : b2->d;
        r->m = q3 ? 0 : b2->dmin;
        return;
    }
    default: { /* IQ4_XS */
        const kn_block_iq4_xs *b = blk;
        for (int j = 0; j < 8; j++) {
            for (int l = 0; l < 16; l++) {
                r->u[32 * j + l] = b->qs[16 * j + l] & 0xf;
                r->u[32 * j + l + 16] = b->qs[16 * j + l] >> 4;
            }
            r->sc[j] = (uint8_t)(kn_iq4xs_scale(j, b) - 32);
        }
        r->d = b->d;
        return;
    }
    }
}

/* The 32-element types' block: u[0..31], d, m. */
static void decode_legacy(kn_type t, const void *blk, kp_rowblock *r)
{
    memset(r, 0, sizeof(*r));
    const uint8_t *qs, *qh = NULL;
    switch (t) {
    case KN_TYPE_Q4_1: {
        const kn_block_q4_1 *b = blk;
        qs = b->qs, r->d = b->d, r->m = b->m;
        break;
    }
    case KN_TYPE_Q5_0: {
        const kn_block_q5_0 *b = blk;
        qs = b->qs, qh = b->qh, r->d = b->d;
        break;
    }
    case KN_TYPE_Q5_1: {
        const kn_block_q5_1 *b = blk;
        qs = b->qs, qh = b->qh, r->d = b->d, r->m = b->m;
        break;
    }
    case KN_TYPE_MXFP4: {
        const kn_block_mxfp4 *b = blk;
        qs = b->qs, r->d = b->e;
        break;
    }
    default: { /* IQ4_NL */
        const kn_block_iq4_nl *b = blk;
        qs = b->qs, r->d = b->d;
        break;
    }
    }
    const uint32_t h = qh ? qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24 : 0;
    for (int i = 0; i < 32; i++)
        r->u[i] = (uint8_t)((i < 16 ? qs[i] & 0xf : qs[i - 16] >> 4) | ((h >> i) & 1) << 4);
}

/* ---- the pieces of a layout, from 16 decoded rows ---------------------------- */

static void put_halves(uint8_t *dst, const kp_rowblock *rb, bool min)
{
    for (int j = 0; j < 16; j++) {
        const uint16_t v = min ? rb[j].m : rb[j].d;
        dst[2 * j] = (uint8_t)v;
        dst[2 * j + 1] = (uint8_t)(v >> 8);
    }
}

/* n_pairs runs of 32 bytes: row j's values 2p and 2p + 1 at 2j, 2j + 1. */
static void put_pairs(uint8_t *dst, const kp_rowblock *rb, bool min, int n_pairs)
{
    for (int p = 0; p < n_pairs; p++)
        for (int j = 0; j < 16; j++)
            for (int e = 0; e < 2; e++)
                dst[32 * p + 2 * j + e] = min ? rb[j].mn[2 * p + e] : rb[j].sc[2 * p + e];
}

/* The nib vectors of a super-block (low 4 bits of u). */
static void put_nib(uint8_t *dst, const kp_rowblock *rb)
{
    for (int u = 0; u < 4; u++)
        for (int k = 0; k < 8; k++)
            for (int j = 0; j < 16; j++)
                for (int e = 0; e < 4; e++) {
                    const int lo = rb[j].u[64 * u + 4 * k + e] & 0xf, hi = rb[j].u[64 * u + 32 + 4 * k + e] & 0xf;
                    dst[64 * (8 * u + k) + 4 * j + e] = (uint8_t)(lo | hi << 4);
                }
}

/* n_quads hbit masks: bit `bit` of u. */
static void put_hbit(uint8_t *dst, const kp_rowblock *rb, int n_quads, int bit)
{
    for (int i = 0; i < n_quads; i++) {
        uint64_t m = 0;
        for (int j = 0; j < 16; j++)
            for (int e = 0; e < 4; e++)
                m |= (uint64_t)((rb[j].u[4 * i + e] >> bit) & 1) << (4 * j + e);
        for (int b = 0; b < 8; b++)
            dst[8 * i + b] = (uint8_t)(m >> (8 * b));
    }
}

static void put_lo2(uint8_t *dst, const kp_rowblock *rb)
{
    for (int u = 0; u < 4; u++)
        for (int a = 0; a < 4; a++)
            for (int j = 0; j < 16; j++)
                for (int e = 0; e < 4; e++) {
                    int v = 0;
                    for (int f = 0; f < 4; f++)
                        v |= (rb[j].u[64 * u + 16 * f + 4 * a + e] & 3) << (2 * f);
                    dst[64 * (4 * u + a) + 4 * j + e] = (uint8_t)v;
                }
}

static void put_q3(uint8_t *dst, const kp_rowblock *rb)
{
    for (int c = 0; c < 8; c++)
        for (int j = 0; j < 16; j++)
            for (int e = 0; e < 4; e++) {
                int q[8];
                for (int i = 0; i < 8; i++)
                    q[i] = rb[j].u[4 * (8 * c + i) + e] & 7;
                uint8_t *at = dst + 64 * 3 * c + 4 * j + e;
                at[0] = (uint8_t)(q[0] | q[1] << 3 | (q[6] & 3) << 6);
                at[64] = (uint8_t)(q[2] | q[3] << 3 | (q[7] & 3) << 6);
                at[128] = (uint8_t)(q[4] | q[5] << 3 | (q[6] >> 2) << 6 | (q[7] >> 2) << 7);
            }
}

static void put_hi2(uint8_t *dst, const kp_rowblock *rb)
{
    for (int u = 0; u < 4; u++)
        for (int a = 0; a < 4; a++)
            for (int j = 0; j < 16; j++)
                for (int e = 0; e < 4; e++) {
                    int v = 0;
                    for (int h = 0; h < 2; h++) {
                        const int k = a + 4 * h;
                        v |= ((rb[j].u[64 * u + 4 * k + e] >> 4) & 3) << (2 * h);
                        v |= ((rb[j].u[64 * u + 32 + 4 * k + e] >> 4) & 3) << (2 * (2 + h));
                    }
                    dst[64 * (4 * u + a) + 4 * j + e] = (uint8_t)v;
                }
}

/* One packed super-block from 16 decoded rows. */
static void pack_super(kn_type t, const kp_rowblock *rb, uint8_t *dst)
{
    switch (t) {
    case KN_TYPE_Q4_K:
    case KN_TYPE_Q5_K:
        put_halves(dst + KN_PK_Q4K_D, rb, false);
        put_halves(dst + KN_PK_Q4K_DMIN, rb, true);
        put_pairs(dst + KN_PK_Q4K_SC, rb, false, 4);
        put_pairs(dst + KN_PK_Q4K_MN, rb, true, 4);
        put_nib(dst + KN_PK_Q4K_NIB, rb);
        if (t == KN_TYPE_Q5_K)
            put_hbit(dst + KN_PK_Q5K_HBIT, rb, 64, 4);
        return;
    case KN_TYPE_Q6_K:
        put_halves(dst + KN_PK_Q6K_D, rb, false);
        put_pairs(dst + KN_PK_Q6K_SC, rb, false, 8);
        put_nib(dst + KN_PK_Q6K_NIB, rb);
        put_hi2(dst + KN_PK_Q6K_HI2, rb);
        return;
    case KN_TYPE_Q3_K:
        put_halves(dst + KN_PK_Q3K_D, rb, false);
        put_pairs(dst + KN_PK_Q3K_SC, rb, false, 8);
        put_q3(dst + KN_PK_Q3K_Q3, rb);
        return;
    case KN_TYPE_Q2_K:
        put_halves(dst + KN_PK_Q2K_D, rb, false);
        put_halves(dst + KN_PK_Q2K_DMIN, rb, true);
        put_pairs(dst + KN_PK_Q2K_SCM, rb, false, 8);
        put_lo2(dst + KN_PK_Q2K_LO2, rb);
        return;
    default: /* IQ4_XS */
        put_halves(dst + KN_PK_IQ4XS_D, rb, false);
        put_pairs(dst + KN_PK_IQ4XS_SC, rb, false, 4);
        put_nib(dst + KN_PK_IQ4XS_NIB, rb);
        return;
    }
}

/* One 32-element block's scales (sc) and quants (q) from 16 decoded rows. */
static void pack_legacy(kn_type t, const kp_rowblock *rb, uint8_t *sc, uint8_t *q)
{
    if (t == KN_TYPE_MXFP4) /* the exponent bytes as they are: 2^-128..2^127 fits no half */
        for (int j = 0; j < 16; j++)
            sc[j] = (uint8_t)rb[j].d;
    else
        put_halves(sc, rb, false);
    if (t == KN_TYPE_Q4_1 || t == KN_TYPE_Q5_1)
        put_halves(sc + 32, rb, true);
    const bool q5 = t == KN_TYPE_Q5_0 || t == KN_TYPE_Q5_1;
    for (int k = 0; k < 4; k++)
        for (int j = 0; j < 16; j++)
            for (int e = 0; e < 4; e++) {
                const int lo = rb[j].u[4 * k + e], hi = rb[j].u[16 + 4 * k + e];
                /* Q5: quad k whole in bits 0-4, quad 4 + k's low 3 bits
                 * above it, its top 2 bits in the fifth vector's field k */
                q[64 * k + 4 * j + e] =
                    q5 ? (uint8_t)((lo & 0x1f) | (hi & 7) << 5) : (uint8_t)((lo & 0xf) | (hi & 0xf) << 4);
                if (q5)
                    q[KN_PL_QUANT_4 + 4 * j + e] =
                        (uint8_t)((k == 0 ? 0 : q[KN_PL_QUANT_4 + 4 * j + e]) | (hi >> 3 & 3) << (2 * k));
            }
}

/* ---- the generic entry -------------------------------------------------------- */

/* A type's packed block: elements, bytes in the file, and in a group the
 * bytes of its scales (0: a K-quant, whose super-block holds them) and of
 * the rest. */
typedef struct kp_shape {
    int elems;
    size_t scale_bytes, quant_bytes;
} kp_shape;

static bool pack_shape(kn_type t, kp_shape *s)
{
    switch (t) {
    case KN_TYPE_Q4_K:
        *s = (kp_shape){KN_QK_K, 0, KN_PK_Q4K_BYTES};
        return true;
    case KN_TYPE_Q5_K:
        *s = (kp_shape){KN_QK_K, 0, KN_PK_Q5K_BYTES};
        return true;
    case KN_TYPE_Q6_K:
        *s = (kp_shape){KN_QK_K, 0, KN_PK_Q6K_BYTES};
        return true;
    case KN_TYPE_Q3_K:
        *s = (kp_shape){KN_QK_K, 0, KN_PK_Q3K_BYTES};
        return true;
    case KN_TYPE_Q2_K:
        *s = (kp_shape){KN_QK_K, 0, KN_PK_Q2K_BYTES};
        return true;
    case KN_TYPE_IQ4_XS:
        *s = (kp_shape){KN_QK_K, 0, KN_PK_IQ4XS_BYTES};
        return true;
    case KN_TYPE_Q4_1:
        *s = (kp_shape){32, KN_PL_SCALE_DM, KN_PL_QUANT_4};
        return true;
    case KN_TYPE_Q5_0:
        *s = (kp_shape){32, KN_PL_SCALE_D, KN_PL_QUANT_5};
        return true;
    case KN_TYPE_Q5_1:
        *s = (kp_shape){32, KN_PL_SCALE_DM, KN_PL_QUANT_5};
        return true;
    case KN_TYPE_IQ4_NL:
        *s = (kp_shape){32, KN_PL_SCALE_D, KN_PL_QUANT_4};
        return true;
    case KN_TYPE_MXFP4:
        *s = (kp_shape){32, KN_PL_SCALE_E8, KN_PL_QUANT_4};
        return true;
    default:
        return false;
    }
}

/* Bytes of one group of 16 rows of nb blocks. */
static size_t group_bytes(const kp_shape *s, int nb)
{
    return (((size_t)nb * s->scale_bytes + 63) & ~(size_t)63) + (size_t)nb * s->quant_bytes;
}

size_t kn_pack_bytes(kn_type t, int n_out, int n_in)
{
    if (t == KN_TYPE_Q8_0)
        return kn_pack_q8_0_bytes(n_out, n_in);
    if (t == KN_TYPE_Q4_0)
        return kn_pack_q4_0_bytes(n_out, n_in);
    kp_shape s;
    if (!pack_shape(t, &s) || n_out <= 0 || n_in <= 0 || n_in % s.elems)
        return 0;
    return (size_t)((n_out + 15) / 16) * group_bytes(&s, n_in / s.elems);
}

void kn_pack(kn_type t, const void *w, int n_out, int n_in, void *dst)
{
    if (t == KN_TYPE_Q8_0) {
        kn_pack_q8_0(w, n_out, n_in, dst);
        return;
    }
    if (t == KN_TYPE_Q4_0) {
        kn_pack_q4_0(w, n_out, n_in, dst);
        return;
    }
    kp_shape s;
    if (kn_pack_bytes(t, n_out, n_in) == 0 || !pack_shape(t, &s))
        return;
    const int nb = n_in / s.elems;
    const size_t bb = kn_type_block_bytes(t), gb = group_bytes(&s, nb);
    const size_t quants_at = gb - (size_t)nb * s.quant_bytes;
    static const kp_rowblock zero; /* padding rows: zero scales, zero quants */
    kp_rowblock rb[16];
    for (int g = 0; g < (n_out + 15) / 16; g++) {
        uint8_t *group = (uint8_t *)dst + (size_t)g * gb;
        memset(group, 0, quants_at);
        for (int b = 0; b < nb; b++) {
            for (int j = 0; j < 16; j++) {
                const int row = 16 * g + j;
                const uint8_t *blk = (const uint8_t *)w + (size_t)row * nb * bb + (size_t)b * bb;
                if (row >= n_out)
                    rb[j] = zero;
                else if (s.scale_bytes == 0)
                    decode_k(t, blk, &rb[j]);
                else
                    decode_legacy(t, blk, &rb[j]);
            }
            uint8_t *q = group + quants_at + (size_t)b * s.quant_bytes;
            if (s.scale_bytes == 0) {
                memset(q, 0, s.quant_bytes); /* the padding at the end */
                pack_super(t, rb, q);
            } else {
                pack_legacy(t, rb, group + (size_t)b * s.scale_bytes, q);
            }
        }
    }
}
