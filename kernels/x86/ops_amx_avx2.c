/* kernels: the AMX backend. The AVX-512 VNNI table whose packed Q8_0 gemm
 * (the one every matmul of a model with packed weights goes through) runs
 * its int8 products on the AMX tile unit: one tdpbssd multiplies up to 16
 * activation rows' block by 16 weight rows' block (16 x 16 x 32), where
 * vpdpbusd does 16 x 32 for one activation row at a time. What is left on
 * the vector unit is the scaling, once per (block, activation row) for 16
 * weight rows: read the tile's sums back, convert, scale, add.
 *
 * Results are bit-identical to the other tables and to the reference: each
 * block's exact integer dot (the tile's), scaled by d_w * d_x and added to
 * the running sum in block order, without FMA.
 *
 * A Q8_0 activation block lies in memory as a 2-byte scale and 32 quants,
 * so a block column of 16 activation rows is an A tile as it is (32 bytes
 * a row, at the rows' stride), and a packed weight block's 8 quads are the
 * B tile (kn_pack_q8_0). Linux hands out the tile state only to a process
 * that asks (arch_prctl ARCH_REQ_XCOMP_PERM); kn_ops_amx() asks, and
 * returns NULL when the CPU, the kernel or the compiler says no. Each call
 * loads its tile configuration and releases the tiles on the way out, so
 * any thread may call it. */
#include "kernels/kn.h"
#include "kernels/quant_blocks.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && defined(__linux__)

#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kernels/x86/ops_x86.h"

#define AMX_ATTR __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl")))

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* Blocks whose activation scales are gathered at once, and activation rows
 * below which the VNNI kernel (no tile set-up) is the faster one. */
#define AMX_SEG 128
#define AMX_MIN_ROWS 8

/* The palette-1 configuration: tiles 0/3 A (m rows x 32 bytes), 1/4 B
 * (8 rows x 64 bytes), 2/5 C (m rows x 16 int32); two sets so that one
 * block's product can run while the last one's sums are read. */
typedef struct amx_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

static AMX_ATTR void amx_configure(int m)
{
    amx_cfg c;
    memset(&c, 0, sizeof(c));
    c.palette = 1;
    for (int set = 0; set < 2; set++) {
        c.rows[3 * set] = (uint8_t)m;
        c.colsb[3 * set] = 32;
        c.rows[3 * set + 1] = 8;
        c.colsb[3 * set + 1] = 64;
        c.rows[3 * set + 2] = (uint8_t)m;
        c.colsb[3 * set + 2] = 64;
    }
    _tile_loadconfig(&c);
}

/* f + (float)isum * scale, rounded twice as the reference rounds it (the
 * barrier keeps the compiler from contracting the two into an FMA). */
static inline __attribute__((always_inline)) AMX_ATTR __m512 amx_accum(__m512 f, __m512i isum, __m512 scale)
{
    __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), scale);
    __asm__("" : "+v"(t));
    return _mm512_add_ps(f, t);
}

/* Adds one block's tile sums (c: 16 rows of 16 int32, rows past m unused)
 * to the accumulators. */
static inline __attribute__((always_inline)) AMX_ATTR void amx_scale_block(__m512 *f, const int32_t *c,
                                                                            const char *blk, const float *dx)
{
    const __m512 dwv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++)
        f[r] = amx_accum(f[r], _mm512_loadu_si512((const void *)(c + 16 * r)),
                         _mm512_mul_ps(dwv, _mm512_set1_ps(dx[r])));
}

/* m (<= 16) activation rows against n_w packed weight rows; tiles
 * configured for m. */
static AMX_ATTR void amx_rows(const char *w, int n_w, const char *xq, size_t xs, int m, int nb, float *y,
                              size_t ys)
{
    /* Rows past m are scaled too (the accumulators stay in registers that
     * way) but never stored; zeros keep them harmless. */
    _Alignas(64) int32_t c0[16 * 16] = {0}, c1[16 * 16] = {0};
    float dx[AMX_SEG][16];
    const size_t group_bytes = (size_t)nb * KN_P16_BLOCK_BYTES;
    memset(dx, 0, sizeof(dx));
    for (int b0 = 0; b0 < nb; b0 += AMX_SEG) {
        const int ns = nb - b0 < AMX_SEG ? nb - b0 : AMX_SEG;
        for (int b = 0; b < ns; b++)
            for (int r = 0; r < m; r++)
                dx[b][r] = kn_x86_f16_table[((const kn_block_q8_0 *)(xq + (size_t)r * xs) + b0 + b)->d];
        for (int o0 = 0; o0 < n_w; o0 += 16) {
            const char *wg = w + (size_t)(o0 / 16) * group_bytes;
            const __mmask16 keep = (__mmask16)(n_w - o0 < 16 ? (1u << (n_w - o0)) - 1 : 0xffffu);
            __m512 f[16];
            for (int r = 0; r < 16; r++)
                f[r] = b0 > 0 && r < m ? _mm512_maskz_loadu_ps(keep, y + (size_t)r * ys + o0)
                                       : _mm512_setzero_ps();
            int b = 0;
            for (; b + 2 <= ns; b += 2) {
                const char *k0 = wg + (size_t)(b0 + b) * KN_P16_BLOCK_BYTES, *k1 = k0 + KN_P16_BLOCK_BYTES;
                const char *a0 = xq + (size_t)(b0 + b) * sizeof(kn_block_q8_0) + 2;
                _tile_loadd(0, a0, (long)xs);
                _tile_loadd(1, k0 + 32, 64);
                _tile_zero(2);
                _tile_dpbssd(2, 0, 1);
                _tile_loadd(3, a0 + sizeof(kn_block_q8_0), (long)xs);
                _tile_loadd(4, k1 + 32, 64);
                _tile_zero(5);
                _tile_dpbssd(5, 3, 4);
                _tile_stored(2, c0, 64);
                amx_scale_block(f, c0, k0, dx[b]);
                _tile_stored(5, c1, 64);
                amx_scale_block(f, c1, k1, dx[b + 1]);
            }
            if (b < ns) {
                const char *k0 = wg + (size_t)(b0 + b) * KN_P16_BLOCK_BYTES;
                _tile_loadd(0, xq + (size_t)(b0 + b) * sizeof(kn_block_q8_0) + 2, (long)xs);
                _tile_loadd(1, k0 + 32, 64);
                _tile_zero(2);
                _tile_dpbssd(2, 0, 1);
                _tile_stored(2, c0, 64);
                amx_scale_block(f, c0, k0, dx[b]);
            }
            for (int r = 0; r < m; r++)
                _mm512_mask_storeu_ps(y + (size_t)r * ys + o0, keep, f[r]);
        }
    }
}

static void (*vnni_gemm_p16)(const void *w, int n_w, const void *xq, size_t xq_stride, int nr, int n, float *y,
                             size_t y_stride);

static AMX_ATTR void amx_gemm_q8_0_p16(const void *w, int n_w, const void *xq, size_t xs, int nr, int n,
                                       float *y, size_t ys)
{
    if (nr < AMX_MIN_ROWS) {
        vnni_gemm_p16(w, n_w, xq, xs, nr, n, y, ys);
        return;
    }
    /* Even chunks of at most 16 rows (17 as 9 + 8): a chunk costs the same
     * tile work whatever its rows. */
    int configured = 0;
    for (int r = 0; r < nr;) {
        const int rest = nr - r, chunks = (rest + 15) / 16, m = (rest + chunks - 1) / chunks;
        if (m != configured) {
            amx_configure(m);
            configured = m;
        }
        amx_rows(w, n_w, (const char *)xq + (size_t)r * xs, xs, m, n / KN_QK8_0, y + (size_t)r * ys, ys);
        r += m;
    }
    _tile_release();
}

static kn_ops ops_amx;
static const kn_ops *ops_amx_ready;
static pthread_once_t ops_amx_once = PTHREAD_ONCE_INIT;

static void ops_amx_init(void)
{
    const kn_ops *base = kn_ops_avx512vnni();
    if (base == NULL || base->gemm_q8_0_p16 == NULL)
        return;
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return;
    const bool amx_tile = (d >> 24) & 1, amx_int8 = (d >> 25) & 1;
    if (!amx_tile || !amx_int8)
        return;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0)
        return;
    ops_amx = *base;
    ops_amx.name = "amx";
    vnni_gemm_p16 = base->gemm_q8_0_p16;
    ops_amx.gemm_q8_0_p16 = amx_gemm_q8_0_p16;
    ops_amx_ready = &ops_amx;
}

const kn_ops *kn_ops_amx(void)
{
    pthread_once(&ops_amx_once, ops_amx_init);
    return ops_amx_ready;
}

#else

const kn_ops *kn_ops_amx(void)
{
    return NULL;
}

#endif
