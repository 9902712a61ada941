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

/* The AMX intrinsics came with GCC 11 and clang 12. */
#if defined(__clang__)
#define KN_AMX_COMPILER (__clang_major__ >= 12)
#elif defined(__GNUC__)
#define KN_AMX_COMPILER (__GNUC__ >= 11)
#else
#define KN_AMX_COMPILER 0
#endif

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && defined(__linux__) &&     \
    KN_AMX_COMPILER

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
#define AMX_AHEAD 4 /* blocks of weights prefetched ahead */

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

/* Starts block ib's product in tile set `set` (A, B, C in tiles 0-2 or 3-5);
 * the tile numbers must be constants, hence the two branches. The group's
 * scales are at sc, its quants at q. */
static inline __attribute__((always_inline)) AMX_ATTR void amx_product(int set, const char *sc, const char *q,
                                                                       size_t group_bytes, int nb,
                                                                       const char *xq, size_t xs, int ib)
{
    const char *a = xq + (size_t)ib * sizeof(kn_block_q8_0) + 2, *k = q + (size_t)ib * KN_P16_QUANT_BYTES;
    /* The weights come from memory once a step and a tile load waits for
     * them in order: ask for them a few blocks ahead. */
    const char *ahead = x86_p16_ahead(q, ib, AMX_AHEAD, nb, KN_P16_QUANT_BYTES, group_bytes);
    for (int l = 0; l < KN_P16_QUANT_BYTES; l += 64)
        _mm_prefetch(ahead + l, _MM_HINT_T0);
    _mm_prefetch(x86_p16_ahead(sc, ib, 2 * AMX_AHEAD, nb, KN_P16_SCALE_BYTES, group_bytes), _MM_HINT_T0);
    if (set) {
        _tile_loadd(3, a, (long)xs);
        _tile_loadd(4, k, 64);
        _tile_zero(5);
        _tile_dpbssd(5, 3, 4);
    } else {
        _tile_loadd(0, a, (long)xs);
        _tile_loadd(1, k, 64);
        _tile_zero(2);
        _tile_dpbssd(2, 0, 1);
    }
}

/* The sixteen accumulators are named, not an array: GCC keeps an array of
 * them on the stack across the tile instructions, a load and a store more
 * per row and block. */
#define AMX_EACH(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)
#define AMX_INIT(r)                                                                                          \
    __m512 f##r = b0 > 0 && r < m ? _mm512_maskz_loadu_ps(keep, y + (size_t)(r)*ys + o0) : _mm512_setzero_ps();
#define AMX_SCALE(r)                                                                                         \
    f##r = x86_block_accum(f##r, _mm512_load_si512((const void *)(c + 16 * (r))),                                  \
                     _mm512_mul_ps(dwv, _mm512_set1_ps(dxr[r])));
#define AMX_STORE(r)                                                                                         \
    if (r < m)                                                                                               \
        _mm512_mask_storeu_ps(y + (size_t)(r)*ys + o0, keep, f##r);
/* Adds block ib's tile sums (c: 16 rows of 16 int32; rows past m are
 * scaled too, never stored), weighted by its scales. */
#define AMX_SCALE_BLOCK(cbuf, ib, dxrow)                                                                     \
    do {                                                                                                     \
        const int32_t *c = (cbuf);                                                                           \
        const float *dxr = (dxrow);                                                                          \
        const __m512 dwv =                                                                                   \
            _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sc + (size_t)(ib)*KN_P16_SCALE_BYTES)));    \
        AMX_EACH(AMX_SCALE)                                                                                  \
    } while (0)

/* m (<= 16) activation rows against n_w packed weight rows; tiles
 * configured for m. Software-pipelined over the two tile sets: the tile
 * unit works on the next blocks while the vector unit scales the last. */
static AMX_ATTR void amx_rows(const char *w, int n_w, const char *xq, size_t xs, int m, int nb, float *y,
                              size_t ys)
{
    _Alignas(64) int32_t c0[16 * 16] = {0}, c1[16 * 16] = {0};
    float dx[AMX_SEG][16];
    const size_t group_bytes = kn_p16_group_bytes(nb), quants_at = kn_p16_quants_at(nb);
    memset(dx, 0, sizeof(dx));
    for (int b0 = 0; b0 < nb; b0 += AMX_SEG) {
        const int ns = nb - b0 < AMX_SEG ? nb - b0 : AMX_SEG;
        for (int b = 0; b < ns; b++)
            for (int r = 0; r < m; r++)
                dx[b][r] = kn_x86_f16_table[((const kn_block_q8_0 *)(xq + (size_t)r * xs) + b0 + b)->d];
        for (int o0 = 0; o0 < n_w; o0 += 16) {
            const char *sc = w + (size_t)(o0 / 16) * group_bytes, *q = sc + quants_at;
            const __mmask16 keep = (__mmask16)(n_w - o0 < 16 ? (1u << (n_w - o0)) - 1 : 0xffffu);
            AMX_EACH(AMX_INIT)
            /* Block b's sums are stored while b + 1's product runs, and read
             * back an iteration later, when the store has long landed. */
            amx_product(0, sc, q, group_bytes, nb, xq, xs, b0);
            for (int b = 0; b < ns; b += 2) {
                if (b + 1 < ns)
                    amx_product(1, sc, q, group_bytes, nb, xq, xs, b0 + b + 1);
                _tile_stored(2, c0, 64);
                if (b > 0)
                    AMX_SCALE_BLOCK(c1, b0 + b - 1, dx[b - 1]);
                if (b + 1 >= ns) {
                    AMX_SCALE_BLOCK(c0, b0 + b, dx[b]);
                    break;
                }
                if (b + 2 < ns)
                    amx_product(0, sc, q, group_bytes, nb, xq, xs, b0 + b + 2);
                _tile_stored(5, c1, 64);
                AMX_SCALE_BLOCK(c0, b0 + b, dx[b]);
                if (b + 2 >= ns)
                    AMX_SCALE_BLOCK(c1, b0 + b + 1, dx[b + 1]);
            }
            AMX_EACH(AMX_STORE)
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
    ops_amx.gemm_packed[KN_TYPE_Q8_0] = amx_gemm_q8_0_p16;
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
