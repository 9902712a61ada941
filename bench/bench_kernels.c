/* Kernel benchmark: memory read bandwidth, then the matmul of each weight
 * type at decode width (one activation row: bound by weight bytes read) and
 * at prefill width (64 rows: bound by arithmetic), at 1 and 2 threads, with
 * the scalar reference at one point for scale. Prints a Markdown table.
 *
 *   bench_kernels [--reps N] [--pool-mib M] [--types | --mxfp4 | --legacy [--shape OUTxIN]]
 *                 [--backend avx2|avxvnni]
 *
 * --types instead compares every weight type with Q8_0 and Q4_0 (see
 * bench_types); --mxfp4 MXFP4's gemm over rows as they lie and over packed
 * rows with IQ4_NL and Q4_0 in thread CPU time (see bench_mxfp4); --legacy
 * the same for every 32-element type (--shape: another matrix than
 * 2880 x 2880). --backend avx2 (avxvnni) runs any of them on the AVX2
 * (AVX-VNNI) table, as a CPU without AVX-512 would, on any CPU that has it
 * (the default: the CPU's best table).
 *
 * "cold" matvec cycles through copies of the matrix filling a pool far larger
 * than the last-level cache, as decode does through a model's layers, for one
 * activation row and for 16 (a decode step of 16 sequences); "hot"
 * repeats one matrix, which then sits in cache. Where the table has a packed
 * Q8_0 gemm (AVX-512 VNNI, AMX), "q8_0 (packed)" is what a model's Q8_0
 * matrices run as; its cold pool is a quarter of the pool per shape. Measurements of the
 * configurations alternate within each repetition and the medians are shown. */
#include "bench/membw.h"
#include "kernels/kn.h"
#include "kernels/quant_blocks.h"

#include <immintrin.h>
#include <stdbool.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_REPS 15
#define N_SHAPES 4
#define N_TYPES 5
#define MM_ROWS 64

static const int shapes[N_SHAPES][2] = {{768, 768}, {2048, 768}, {768, 2048}, {32000, 768}}; /* n_out, n_in */
/* The last two are Q8_0 and Q4_0 packed for the p16 gemms of the AVX-512
 * and AMX tables, as a model holds its Q8_0 and Q4_0 matrices on those
 * CPUs. */
static const kn_type types[N_TYPES] = {KN_TYPE_F16, KN_TYPE_Q8_0, KN_TYPE_Q4_0, KN_TYPE_Q8_0_P16,
                                       KN_TYPE_Q4_0_P16};

static double best(const double *v, int n)
{
    double b = 0;
    for (int i = 0; i < n; i++)
        b = v[i] > b ? v[i] : b;
    return b;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

/* ---- pool of weights ------------------------------------------------------
 * Filled by tiling a few hundred random rows' worth of valid blocks, so every
 * block-aligned offset starts a valid block and any window is a matrix. */
static void fill_pool(uint8_t *pool, size_t bytes, kn_type type)
{
    const int n = 4096;
    const size_t tile = kn_row_bytes(type, n) * 64;
    float *x = malloc((size_t)n * sizeof(float));
    uint8_t *t = malloc(tile);
    for (size_t r = 0; r < 64; r++) {
        for (int i = 0; i < n; i++)
            x[i] = bench_frand(&rng_state);
        kn_quantize_row(type, x, t + r * kn_row_bytes(type, n), n);
    }
    for (size_t off = 0; off < bytes; off += tile)
        memcpy(pool + off, t, bytes - off < tile ? bytes - off : tile);
    free(t);
    free(x);
}

static size_t mat_bytes_of(kn_type type, int n_out, int n_in)
{
    return kn_type_packed(type) ? kn_pack_bytes(kn_unpacked_type(type), n_out, n_in)
                                : kn_row_bytes(type, n_in) * (size_t)n_out;
}

/* The pool as copies of one packed n_out x n_in matrix (packing moves rows
 * between blocks, so a window of a tiled pool would not be a matrix). */
static void fill_pool_packed(uint8_t *pool, size_t bytes, kn_type type, int n_out, int n_in)
{
    const kn_type base = kn_unpacked_type(type);
    const size_t rb = kn_row_bytes(base, n_in), mb = mat_bytes_of(type, n_out, n_in);
    uint8_t *q = malloc(rb * (size_t)n_out);
    float *x = malloc((size_t)n_in * sizeof(float));
    for (int o = 0; o < n_out; o++) {
        for (int i = 0; i < n_in; i++)
            x[i] = bench_frand(&rng_state);
        kn_quantize_row(base, x, q + (size_t)o * rb, n_in);
    }
    kn_pack(base, q, n_out, n_in, pool);
    for (size_t off = mb; off + mb <= bytes; off += mb)
        memcpy(pool + off, pool, mb);
    free(x);
    free(q);
}

/* Each copy of the matrix once, so every weight comes from memory: decode
 * of one sequence (n_rows 1) or of a batch of them. */
static double time_cold(kn_ctx *ctx, const uint8_t *pool, size_t mat_bytes, int n_mats, kn_type type, int n_out,
                        int n_in, const float *x, int n_rows, float *y)
{
    double t0 = bench_now();
    for (int m = 0; m < n_mats; m++)
        kn_matmul(ctx, pool + (size_t)m * mat_bytes, type, n_out, n_in, x, n_rows, y);
    return bench_now() - t0;
}

/* Calls repeated until at least `min_s` seconds have passed; seconds per call. */
static double time_repeat(kn_ctx *ctx, const uint8_t *w, kn_type type, int n_out, int n_in, const float *x,
                          int n_rows, float *y, double min_s)
{
    int calls = 0;
    double t0 = bench_now(), t;
    do {
        kn_matmul(ctx, w, type, n_out, n_in, x, n_rows, y);
        calls++;
        t = bench_now() - t0;
    } while (t < min_s || calls < 3);
    return t / calls;
}

/* ---- --types: every weight type against Q8_0 and Q4_0 -----------------------
 * Decode: the matvec of one activation row over a pool of copies of a
 * 2048 x 768 matrix (TY_POOL_MIB in all, as a small model's layers follow
 * one another; on a machine whose L3 holds the pool it is an L3 figure, not
 * DRAM bandwidth). Prefill: 128 activation rows against one matrix. Both as
 * effective weight GB/s (bytes of the type's weights read per second), at
 * 2 threads, and as a share of Q4_0's (packed, as a model holds it, where
 * the table has the packed gemm). The float types at 64 rows also as
 * GFLOP/s a thread against the core's F32 FMA peak, measured here. */
#define TY_POOL_MIB 64
#define TY_N_OUT 2048
#define TY_N_IN 768

/* F32 FMA peak of one thread: 12 independent chains, in named registers
 * (an array of them went through the stack on every step, and measured
 * half the peak), on 256-bit vectors or 512-bit ones. */
#define FMA12(V, fma)                                                                                       \
    do {                                                                                                     \
        a0 = fma(a0, m, c), a1 = fma(a1, m, c), a2 = fma(a2, m, c), a3 = fma(a3, m, c);                     \
        a4 = fma(a4, m, c), a5 = fma(a5, m, c), a6 = fma(a6, m, c), a7 = fma(a7, m, c);                     \
        a8 = fma(a8, m, c), a9 = fma(a9, m, c), a10 = fma(a10, m, c), a11 = fma(a11, m, c);                 \
        __asm__("" : "+" V(a0), "+" V(a1), "+" V(a2), "+" V(a3), "+" V(a4), "+" V(a5), "+" V(a6), "+" V(a7), \
                "+" V(a8), "+" V(a9), "+" V(a10), "+" V(a11));                                               \
    } while (0)
#define FMA_ITERS 20000000L

__attribute__((target("avx2,fma"))) static double fma_peak256(void)
{
    const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    __m256 a0 = m, a1 = m, a2 = m, a3 = m, a4 = m, a5 = m, a6 = m, a7 = m, a8 = m, a9 = m, a10 = m, a11 = m;
    const double t0 = bench_now();
    for (long k = 0; k < FMA_ITERS; k++)
        FMA12("x", _mm256_fmadd_ps);
    const double s = bench_now() - t0;
    const __m256 t = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                                   _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    if (_mm256_cvtss_f32(_mm256_add_ps(t, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)))) == 1.5f)
        printf(" ");
    return (double)FMA_ITERS * 12 * 8 * 2 / s / 1e9;
}

__attribute__((target("avx512f"))) static double fma_peak512(void)
{
    const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    __m512 a0 = m, a1 = m, a2 = m, a3 = m, a4 = m, a5 = m, a6 = m, a7 = m, a8 = m, a9 = m, a10 = m, a11 = m;
    const double t0 = bench_now();
    for (long k = 0; k < FMA_ITERS; k++)
        FMA12("v", _mm512_fmadd_ps);
    const double s = bench_now() - t0;
    const __m512 t = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                   _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    if (_mm512_reduce_add_ps(_mm512_add_ps(t, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)))) == 1.5f)
        printf(" ");
    return (double)FMA_ITERS * 12 * 16 * 2 / s / 1e9;
}

/* The core's peak: the wider vectors where the CPU has them. */
static double fma_peak_gflops(void)
{
    const double p256 = fma_peak256();
    if (!__builtin_cpu_supports("avx512f"))
        return p256;
    const double p512 = fma_peak512();
    return p512 > p256 ? p512 : p256;
}

/* A pool of TY_POOL_MIB (and a margin) of copies of an n_out x n_in
 * matrix for each type that the table runs (have[i]: a file type, or a
 * packed one whose packed gemm the table has); 1 when out of memory. */
static int type_pools(const kn_ops *ops, const kn_type *tys, int nt, int n_out, int n_in, uint8_t **pool,
                      bool *have)
{
    const size_t pool_bytes = (size_t)TY_POOL_MIB << 20;
    for (int ti = 0; ti < nt; ti++) {
        const kn_type t = tys[ti];
        have[ti] = !kn_type_packed(t) || (kn_pack_bytes(kn_unpacked_type(t), 16, n_in) > 0 &&
                                          ops->gemm_packed[kn_unpacked_type(t)] != NULL);
        if (!have[ti])
            continue;
        const size_t mat = mat_bytes_of(t, n_out, n_in);
        const int n_mats = (int)(pool_bytes / mat);
        if ((pool[ti] = aligned_alloc(64, pool_bytes + (64 << 20))) == NULL)
            return 1;
        if (kn_type_packed(t))
            fill_pool_packed(pool[ti], (size_t)n_mats * mat, t, n_out, n_in);
        else
            fill_pool(pool[ti], (size_t)n_mats * mat, t);
    }
    return 0;
}

/* The table --types, --mxfp4 and --legacy run: the CPU's best, or one named. */
static kn_backend bench_backend = KN_BACKEND_AUTO;

static int bench_types(int reps)
{
    /* each type as it is in the file, then packed where the table has a
     * gemm for that (as a model holds it) */
    static const kn_type files[] = {KN_TYPE_Q8_0, KN_TYPE_Q4_0, KN_TYPE_Q4_1, KN_TYPE_Q5_0, KN_TYPE_Q5_1,
                                    KN_TYPE_IQ4_NL, KN_TYPE_Q2_K, KN_TYPE_Q3_K, KN_TYPE_Q4_K, KN_TYPE_Q5_K,
                                    KN_TYPE_Q6_K, KN_TYPE_IQ4_XS, KN_TYPE_F16, KN_TYPE_BF16, KN_TYPE_F32};
    enum { NF = sizeof(files) / sizeof(files[0]), NT = 2 * NF, ROWS = 128, FROWS = 64 };
    kn_type tys[NT];
    for (int i = 0; i < NF; i++) {
        tys[2 * i] = files[i];
        tys[2 * i + 1] = kn_packed_type(files[i]);
    }
    const size_t pool_bytes = (size_t)TY_POOL_MIB << 20;
    kn_ctx *ctx = kn_ctx_new(2, bench_backend), *ctx1 = kn_ctx_new(1, bench_backend);
    float *x = malloc((size_t)ROWS * TY_N_IN * sizeof(float));
    float *y = aligned_alloc(64, (size_t)ROWS * TY_N_OUT * sizeof(float));
    if (!ctx || !ctx1 || !x || !y)
        return 1;
    for (int i = 0; i < ROWS * TY_N_IN; i++)
        x[i] = bench_frand(&rng_state);
    double mv[NT][MAX_REPS], mm[NT][MAX_REPS], fl[NT][MAX_REPS], peak[MAX_REPS];
    bool have[NT];
    uint8_t *pool[NT] = {0};
    if (type_pools(kn_ctx_ops(ctx), tys, NT, TY_N_OUT, TY_N_IN, pool, have))
        return 1;
    /* Every type once per repetition, one after another, so that each
     * type's median is taken over the same stretches of a shared
     * machine's load as the others'. */
    for (int r = 0; r < reps; r++) {
        for (int ti = 0; ti < NT; ti++) {
            if (!have[ti])
                continue;
            const kn_type t = tys[ti];
            const size_t mat = mat_bytes_of(t, TY_N_OUT, TY_N_IN);
            const int n_mats = (int)(pool_bytes / mat);
            /* passes over the pool for at least 0.1 s: one is a few ms */
            int passes = 0;
            double s = 0;
            do {
                s += time_cold(ctx, pool[ti], mat, n_mats, t, TY_N_OUT, TY_N_IN, x, 1, y);
                passes++;
            } while (s < 0.1);
            mv[ti][r] = (double)mat * n_mats * passes / s;
            s = time_repeat(ctx, pool[ti], t, TY_N_OUT, TY_N_IN, x, ROWS, y, 0.05);
            mm[ti][r] = (double)mat / s;
            s = time_repeat(ctx1, pool[ti], t, TY_N_OUT, TY_N_IN, x, FROWS, y, 0.05);
            fl[ti][r] = 2.0 * FROWS * TY_N_OUT * TY_N_IN / s;
        }
        peak[r] = fma_peak_gflops();
    }
    const double pk = bench_median(peak, reps);
    double q4mv = 0, q4mm = 0;
    for (int ti = 0; ti < NT; ti++)
        if (have[ti] && (tys[ti] == KN_TYPE_Q4_0_P16 || (tys[ti] == KN_TYPE_Q4_0 && q4mv == 0))) {
            q4mv = bench_median(mv[ti], reps);
            q4mm = bench_median(mm[ti], reps);
        }
    printf("## weight types (%s backend, %dx%d, 2 threads, median of %d runs)\n\n", kn_ctx_ops(ctx)->name,
           TY_N_OUT, TY_N_IN, reps);
    printf("F32 FMA peak, 1 thread: %.1f GFLOP/s\n\n", pk);
    printf("| type | bits/weight | matvec GB/s | vs q4_0 | %d rows GB/s | vs q4_0 | %d rows GFLOP/s, 1 thread | vs "
           "FMA peak |\n|---|---|---|---|---|---|---|---|\n",
           ROWS, FROWS);
    for (int ti = 0; ti < NT; ti++) {
        if (!have[ti])
            continue;
        const kn_type t = tys[ti], base = kn_unpacked_type(t);
        const double v = bench_median(mv[ti], reps), m = bench_median(mm[ti], reps), f = bench_median(fl[ti], reps);
        printf("| %s | %.2f | %.2f | %.0f%% | %.2f | %.0f%% | %.1f | %.0f%% |\n", kn_type_name(t),
               8.0 * kn_type_block_bytes(base) / kn_type_block_elems(base), v / 1e9, 100 * v / q4mv, m / 1e9,
               100 * m / q4mm, f / 1e9, 100 * f / 1e9 / pk);
    }
    kn_ctx_free(ctx1);
    kn_ctx_free(ctx);
    free(y);
    free(x);
    for (int ti = 0; ti < NT; ti++)
        free(pool[ti]);
    return 0;
}

/* ---- --mxfp4: MXFP4 as it lies (the AVX2 gemm, before its packed layout)
 * and packed, against IQ4_NL and Q4_0 packed and as they lie; --legacy:
 * every 32-element type so ---------------------------------------------------
 * gpt-oss-20b's expert shape (2880 x 2880). Decode: the matvec of one row
 * over a pool of copies (TY_POOL_MIB), as weight GB/s; prefill: 128 rows
 * against one matrix, as GFLOP/s. One thread, timed in the thread's CPU
 * time (the context's only thread is the caller), every configuration once
 * per repetition in turn, so a shared machine's load neither counts nor
 * falls on one of them more than the others; medians. */
/* n_out x n_in: 2880 x 2880 unless --shape OUTxIN says otherwise */
static int mx_out = 2880, mx_in = 2880;
#define MX_ROWS 128

static double thread_cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The types of files[] (at most 8), each as it lies and packed. */
static int bench_mxfp4(int reps, const kn_type *files, int nf, const char *title)
{
    enum { NT_MAX = 16 };
    const int NT = 2 * nf;
    kn_type tys[NT_MAX];
    for (int i = 0; i < nf; i++) {
        tys[2 * i] = files[i];
        tys[2 * i + 1] = kn_packed_type(files[i]);
    }
    const size_t pool_bytes = (size_t)TY_POOL_MIB << 20;
    kn_ctx *ctx = kn_ctx_new(1, bench_backend);
    float *x = malloc((size_t)MX_ROWS * mx_in * sizeof(float));
    float *y = aligned_alloc(64, (size_t)MX_ROWS * mx_out * sizeof(float));
    if (!ctx || !x || !y)
        return 1;
    for (int i = 0; i < MX_ROWS * mx_in; i++)
        x[i] = bench_frand(&rng_state);
    double mv[NT_MAX][MAX_REPS], mm[NT_MAX][MAX_REPS];
    bool have[NT_MAX];
    uint8_t *pool[NT_MAX] = {0};
    if (type_pools(kn_ctx_ops(ctx), tys, NT, mx_out, mx_in, pool, have))
        return 1;
    for (int r = 0; r < reps; r++)
        for (int ti = 0; ti < NT; ti++) {
            if (!have[ti])
                continue;
            const kn_type t = tys[ti];
            const size_t mat = mat_bytes_of(t, mx_out, mx_in);
            const int n_mats = (int)(pool_bytes / mat);
            double t0 = thread_cpu_now();
            int passes = 0;
            do {
                for (int m = 0; m < n_mats; m++)
                    kn_matmul(ctx, pool[ti] + (size_t)m * mat, t, mx_out, mx_in, x, 1, y);
                passes++;
            } while (thread_cpu_now() - t0 < 0.1);
            mv[ti][r] = (double)mat * n_mats * passes / (thread_cpu_now() - t0);
            int calls = 0;
            t0 = thread_cpu_now();
            do {
                kn_matmul(ctx, pool[ti], t, mx_out, mx_in, x, MX_ROWS, y);
                calls++;
            } while (thread_cpu_now() - t0 < 0.1 || calls < 3);
            mm[ti][r] = 2.0 * MX_ROWS * mx_out * mx_in * calls / (thread_cpu_now() - t0);
        }
    printf("## %s (%s backend, %dx%d, 1 thread, thread CPU time, median of %d runs)\n\n", title,
           kn_ctx_ops(ctx)->name, mx_out, mx_in, reps);
    printf("| type | bits/weight | matvec GB/s | matvec us | %d rows GFLOP/s |\n|---|---|---|---|---|\n",
           MX_ROWS);
    for (int ti = 0; ti < NT; ti++) {
        if (!have[ti])
            continue;
        const kn_type t = tys[ti], base = kn_unpacked_type(t);
        const double v = bench_median(mv[ti], reps), m = bench_median(mm[ti], reps);
        printf("| %s | %.2f | %.2f | %.0f | %.1f |\n", kn_type_name(t),
               8.0 * kn_type_block_bytes(base) / kn_type_block_elems(base), v / 1e9,
               1e6 * (double)mat_bytes_of(t, mx_out, mx_in) / v, m / 1e9);
    }
    kn_ctx_free(ctx);
    free(y);
    free(x);
    for (int ti = 0; ti < NT; ti++)
        free(pool[ti]);
    return 0;
}

int main(int argc, char **argv)
{
    int reps = 5;
    size_t pool_mib = 1024;
    bool by_type = false, mxfp4 = false, legacy = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--types") == 0)
            by_type = true;
        else if (strcmp(argv[i], "--mxfp4") == 0)
            mxfp4 = true;
        else if (strcmp(argv[i], "--legacy") == 0)
            legacy = true;
        else if (strcmp(argv[i], "--pool-mib") == 0 && i + 1 < argc)
            pool_mib = (size_t)atol(argv[++i]);
        else if (strcmp(argv[i], "--shape") == 0 && i + 1 < argc &&
                 sscanf(argv[i + 1], "%dx%d", &mx_out, &mx_in) == 2 && mx_out > 0 && mx_in > 0)
            i++;
        else if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc && strcmp(argv[i + 1], "avx2") == 0)
            bench_backend = KN_BACKEND_AVX2, i++;
        else if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc && strcmp(argv[i + 1], "avxvnni") == 0)
            bench_backend = KN_BACKEND_AVXVNNI, i++;
        else {
            fprintf(stderr,
                    "usage: %s [--reps N] [--pool-mib M] [--types | --mxfp4 | --legacy [--shape OUTxIN]] "
                    "[--backend avx2|avxvnni]\n",
                    argv[0]);
            return 2;
        }
    }
    if (reps < 3)
        reps = 3;
    if (reps > MAX_REPS)
        reps = MAX_REPS;
    if (!__builtin_cpu_supports("avx2")) {
        fprintf(stderr, "bench_kernels: needs AVX2\n");
        return 1;
    }
    if (by_type)
        return bench_types(reps);
    if (mxfp4) {
        static const kn_type f[] = {KN_TYPE_MXFP4, KN_TYPE_IQ4_NL, KN_TYPE_Q4_0};
        return bench_mxfp4(reps, f, 3, "MXFP4");
    }
    if (legacy) {
        static const kn_type f[] = {KN_TYPE_Q4_0, KN_TYPE_Q4_1, KN_TYPE_Q5_0, KN_TYPE_Q5_1, KN_TYPE_IQ4_NL,
                                    KN_TYPE_MXFP4};
        return bench_mxfp4(reps, f, 6, "32-element types");
    }
    const size_t pool_bytes = pool_mib << 20;
    uint8_t *pool = aligned_alloc(64, pool_bytes);
    kn_ctx *ctx[2] = {kn_ctx_new(1, KN_BACKEND_AUTO), kn_ctx_new(2, KN_BACKEND_AUTO)};
    kn_ctx *ref = kn_ctx_new(1, KN_BACKEND_REF);
    float *x = malloc((size_t)MM_ROWS * 2048 * sizeof(float));
    /* on a cache line, as a model's activations are: threads write
     * neighbouring chunks of each output row */
    float *y = aligned_alloc(64, (size_t)MM_ROWS * 32000 * sizeof(float));
    if (!pool || !ctx[0] || !ctx[1] || !ref || !x || !y) {
        fprintf(stderr, "bench_kernels: out of memory\n");
        return 1;
    }
    for (int i = 0; i < MM_ROWS * 2048; i++)
        x[i] = bench_frand(&rng_state);

    /* (a) bandwidth */
    memset(pool, 1, pool_bytes);
    double bw[2][MAX_REPS];
    for (int r = 0; r < reps; r++)
        for (int t = 0; t < 2; t++)
            bw[t][r] = membw_pass(pool, pool_bytes, t + 1);

    /* (b) per type: cold matvec, hot matvec, matmul at 64 rows */
    double cold[N_TYPES][N_SHAPES][2][MAX_REPS], cold16[N_TYPES][N_SHAPES][2][MAX_REPS],
        hot[N_TYPES][N_SHAPES][2][MAX_REPS], mm[N_TYPES][N_SHAPES][2][MAX_REPS];
    double ref_mv[MAX_REPS], ref_mm[MAX_REPS];
    /* the packed types where the table has both gemms (AVX-512, AMX) */
    const bool packed =
        kn_ctx_ops(ctx[0])->gemm_q8_0_p16 != NULL && kn_ctx_ops(ctx[0])->gemm_q4_0_p16 != NULL;
    const int n_types = packed ? N_TYPES : N_TYPES - 2;
    const size_t region = pool_bytes / N_SHAPES / 64 * 64; /* packed: one region of copies per shape */
    for (int ti = 0; ti < n_types; ti++) {
        const kn_type type = types[ti];
        const bool p16 = kn_type_packed(type);
        if (p16)
            for (int si = 0; si < N_SHAPES; si++)
                fill_pool_packed(pool + si * region, region, type, shapes[si][0], shapes[si][1]);
        else
            fill_pool(pool, pool_bytes, type);
        for (int r = 0; r < reps; r++) {
            for (int si = 0; si < N_SHAPES; si++) {
                const int n_out = shapes[si][0], n_in = shapes[si][1];
                const size_t mat_bytes = mat_bytes_of(type, n_out, n_in);
                const uint8_t *w = p16 ? pool + si * region : pool;
                const int n_mats = (int)((p16 ? region : pool_bytes) / mat_bytes);
                for (int t = 0; t < 2; t++) {
                    double s = time_cold(ctx[t], w, mat_bytes, n_mats, type, n_out, n_in, x, 1, y);
                    cold[ti][si][t][r] = (double)mat_bytes * n_mats / s;
                    s = time_cold(ctx[t], w, mat_bytes, n_mats, type, n_out, n_in, x, 16, y);
                    cold16[ti][si][t][r] = (double)mat_bytes * n_mats / s;
                    s = time_repeat(ctx[t], w, type, n_out, n_in, x, 1, y, 0.02);
                    hot[ti][si][t][r] = (double)mat_bytes / s;
                    s = time_repeat(ctx[t], w, type, n_out, n_in, x, MM_ROWS, y, 0.03);
                    mm[ti][si][t][r] = 2.0 * MM_ROWS * n_out * n_in / s;
                }
            }
            if (type == KN_TYPE_Q8_0) {
                const size_t mat_bytes = kn_row_bytes(type, 768) * 2048;
                ref_mv[r] = (double)mat_bytes / time_repeat(ref, pool, type, 2048, 768, x, 1, y, 0.02);
                ref_mm[r] =
                    2.0 * MM_ROWS * 2048 * 768 / time_repeat(ref, pool, type, 2048, 768, x, MM_ROWS, y, 0);
            }
        }
    }

    printf("## kernels (%s backend, median of %d runs; bandwidth: %zu MiB buffer)\n\n",
           kn_ctx_ops(ctx[0])->name, reps, pool_mib);
    printf("| measure | 1 thread | 2 threads |\n|---|---|---|\n");
    printf("| memory read bandwidth, median GB/s | %.2f | %.2f |\n", bench_median(bw[0], reps) / 1e9,
           bench_median(bw[1], reps) / 1e9);
    printf("| memory read bandwidth, best GB/s | %.2f | %.2f |\n\n", best(bw[0], reps) / 1e9,
           best(bw[1], reps) / 1e9);
    printf(
        "| type | n_out x n_in | threads | matvec cold GB/s | 16 rows cold GB/s | matvec hot GB/s | matmul 64 rows "
        "GFLOP/s |\n");
    printf("|---|---|---|---|---|---|---|\n");
    for (int ti = 0; ti < n_types; ti++)
        for (int si = 0; si < N_SHAPES; si++)
            for (int t = 0; t < 2; t++)
                printf("| %s | %dx%d | %d | %.2f | %.2f | %.2f | %.1f |\n", kn_type_name(types[ti]), shapes[si][0],
                       shapes[si][1], t + 1, bench_median(cold[ti][si][t], reps) / 1e9,
                       bench_median(cold16[ti][si][t], reps) / 1e9,
                       bench_median(hot[ti][si][t], reps) / 1e9, bench_median(mm[ti][si][t], reps) / 1e9);
    printf("| q8_0 (ref backend) | 2048x768 | 1 | - | - | %.2f | %.1f |\n", bench_median(ref_mv, reps) / 1e9,
           bench_median(ref_mm, reps) / 1e9);

    kn_ctx_free(ref);
    kn_ctx_free(ctx[1]);
    kn_ctx_free(ctx[0]);
    free(y);
    free(x);
    free(pool);
    return 0;
}
