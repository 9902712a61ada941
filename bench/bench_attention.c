/* Decode attention benchmark: S sequences, one new token each, over a paged
 * KV cache of C positions per sequence, every layer in turn (so the cache is
 * read from memory, as a decode step reads it). Attention at decode has
 * nothing to share between sequences: each reads its own cache once, so it
 * is bound by memory bandwidth, and this prints how close it comes. The F16
 * and the Q8_0 cache are timed in alternate repetitions of one run.
 *
 *   bench_attention [--seqs S] [--ctx C] [--layers L] [--heads H]
 *                   [--kv-heads K] [--head-dim D] [--block-tokens B]
 *                   [--threads T] [--reps N] [--huge 1|0] [--chunk R [--tile T]] [--pairs N]
 *
 * Blocks are handed out in a shuffled order, as a pool looks after requests
 * have come and gone.
 *
 * With --chunk R, a step of chunked prefill beside the decodes instead:
 * the S sequences decoding and one more computing R prompt rows at the end
 * of its C positions (a chat turn whose prefix was cached), F16 cache,
 * with the query rows an item takes together (kn_attn_params.tile) at 4
 * (the old default) against --tile T (0: the default now), alternated:
 * wall time and the calling thread's CPU time (all of it at --threads 1).
 * With --pairs N, the two-row KV kernels against the one-row ones (see
 * pairs_main). */
#include "bench/bench_util.h"
#include "bench/membw.h"
#include "kernels/kn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MAX_REPS 31

typedef struct cache {
    kn_type type;
    size_t row, block_units, pool_bytes; /* row and block in 16-bit units */
    uint16_t *pool;
    uint16_t **tables;
    double t[MAX_REPS];
} cache;

static int cache_init(cache *c, kn_type type, int S, int per_seq, int L, int KH, int D, int BT, const int *order,
                      bool huge, uint64_t *rng)
{
    const int n_blocks = S * per_seq;
    c->type = type;
    c->row = kn_kv_row_units(type, D);
    c->block_units = 2 * (size_t)L * BT * KH * c->row;
    c->pool_bytes = (size_t)n_blocks * c->block_units * sizeof(uint16_t);
    /* Mapped as rt_kv_new maps its pool: on huge pages unless --huge 0. */
    c->pool = mmap(NULL, c->pool_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    c->tables = malloc((size_t)n_blocks * sizeof(*c->tables));
    float *x = malloc((size_t)D * sizeof(float));
    if (c->pool == MAP_FAILED || !c->tables || !x || c->row == 0) {
        if (c->pool != MAP_FAILED)
            munmap(c->pool, c->pool_bytes);
        free(c->tables);
        free(x);
        return -1;
    }
    if (huge)
        madvise(c->pool, c->pool_bytes, MADV_HUGEPAGE);
    for (size_t r = 0; r < (size_t)n_blocks * c->block_units / c->row; r++) {
        for (int i = 0; i < D; i++)
            x[i] = bench_frand(rng);
        kn_quantize_row(type, x, c->pool + r * c->row, D);
    }
    for (int i = 0; i < n_blocks; i++)
        c->tables[i] = c->pool + (size_t)order[i] * c->block_units;
    free(x);
    return 0;
}

/* One decode step: every layer's attention for every sequence. */
static int step(kn_ctx *ctx, const cache *c, kn_attn_seq *seqs, const float *q, float *out, int S, int C,
                int per_seq, int L, int H, int KH, int D, int BT)
{
    const float scale = 1.0f / sqrtf((float)D);
    for (int l = 0; l < L; l++) {
        const size_t k_off = (size_t)l * 2 * BT * KH * c->row;
        for (int s = 0; s < S; s++)
            seqs[s] = (kn_attn_seq){.q = q + (size_t)s * H * D,
                                    .out = out + (size_t)s * H * D,
                                    .n_q = 1,
                                    .pos0 = C - 1,
                                    .blocks = c->tables + (size_t)s * per_seq,
                                    .k_off = k_off,
                                    .v_off = k_off + (size_t)BT * KH * c->row,
                                    .block_tokens = BT,
                                    .kv_type = c->type};
        if (kn_attention(ctx, seqs, S, H, KH, D, scale))
            return -1;
    }
    return 0;
}

/* What both modes allocate, freed; returns 0 (main's exit status). */
static int release(kn_ctx *ctx, kn_attn_seq *seqs, float *out, float *q, int *order)
{
    kn_ctx_free(ctx);
    free(seqs);
    free(out);
    free(q);
    free(order);
    return 0;
}

static double thread_cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One step of S decodes and an R-row prompt chunk (sequence S), every
 * layer in turn, at the given tile. */
static int chunk_step(kn_ctx *ctx, const cache *c, kn_attn_seq *seqs, const float *q, float *out, int S,
                      int C, int R, int per_seq, int L, int H, int KH, int D, int BT, int tile)
{
    const kn_attn_params p = {
        .n_head = H, .n_kv_head = KH, .head_dim = D, .scale = 1.0f / sqrtf((float)D), .tile = tile};
    for (int l = 0; l < L; l++) {
        const size_t k_off = (size_t)l * 2 * BT * KH * c->row;
        for (int s = 0; s <= S; s++)
            seqs[s] = (kn_attn_seq){.q = q + (size_t)s * H * D,
                                    .out = out + (size_t)s * H * D,
                                    .n_q = s < S ? 1 : R,
                                    .pos0 = s < S ? C - 1 : C - R,
                                    .blocks = c->tables + (size_t)s * per_seq,
                                    .k_off = k_off,
                                    .v_off = k_off + (size_t)BT * KH * c->row,
                                    .block_tokens = BT,
                                    .kv_type = c->type};
        if (kn_attention_ex(ctx, seqs, S + 1, &p))
            return -1;
    }
    return 0;
}

/* --pairs N: the two-row kernels against the one-row ones twice, on one
 * block of 16 K and V rows of --head-dim (in L1, as attention's tiles
 * read them), N calls each, alternated, in this thread's CPU time. */
static int pairs_main(int N, int D, int reps)
{
    kn_ctx *ctx = kn_ctx_new(1, KN_BACKEND_AUTO);
    const kn_ops *o = ctx ? kn_ctx_ops(ctx) : NULL;
    enum { BT = 16 };
    uint16_t *kv = malloc((size_t)BT * D * sizeof(uint16_t));
    float *q = malloc(2 * (size_t)D * sizeof(float)), *sc = malloc(2 * BT * sizeof(float));
    float *acc = malloc(2 * (size_t)D * sizeof(float));
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    if (!o || !o->kv_scores2 || !kv || !q || !sc || !acc)
        return 1;
    for (int i = 0; i < BT * D; i++)
        kv[i] = kn_fp32_to_fp16(bench_frand(&rng));
    for (int i = 0; i < 2 * D; i++)
        q[i] = acc[i] = bench_frand(&rng);
    for (int i = 0; i < 2 * BT; i++)
        sc[i] = bench_frand(&rng) * 0.1f;
    double t[4][MAX_REPS];
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < 4; k++) {
            double c0 = thread_cpu();
            for (int n = 0; n < N; n++)
                switch (k) {
                case 0:
                    o->kv_scores(q, kv, D, BT, D, 0.125f, sc);
                    o->kv_scores(q + D, kv, D, BT, D, 0.125f, sc + BT);
                    break;
                case 1:
                    o->kv_scores2(q, q + D, kv, D, BT, D, 0.125f, sc, sc + BT);
                    break;
                case 2:
                    o->kv_accum(acc, sc, kv, D, BT, D);
                    o->kv_accum(acc + D, sc + BT, kv, D, BT, D);
                    break;
                default:
                    o->kv_accum2(acc, acc + D, sc, sc + BT, kv, D, BT, D);
                }
            t[k][r] = thread_cpu() - c0;
        }
    printf("two-row KV kernels [%s]: %d x (2 query rows over a block of %d rows of %d halves), median of %d\n",
           o->name, N, BT, D, reps);
    const char *names[4] = {"kv_scores x 2", "kv_scores2", "kv_accum x 2", "kv_accum2"};
    for (int k = 0; k < 4; k++) {
        const double m = bench_median(t[k], reps);
        printf("  %-14s %.1f ns a call\n", names[k], m / N * 1e9);
        if (k % 2)
            printf("  %-14s x%.2f\n", "new / old", m / bench_median(t[k - 1], reps));
    }
    free(acc);
    free(sc);
    free(q);
    free(kv);
    kn_ctx_free(ctx);
    return 0;
}

/* --chunk R: tile 4 against --tile, alternated (see the top). */
static int chunk_main(int argc, char **argv, int S, int C, int R, int L, int H, int KH, int D, int BT, int T,
                      bool huge, int reps)
{
    const int tile = bench_arg_int(argc, argv, "--tile", 0), per_seq = (C + BT - 1) / BT;
    const int n_blocks = (S + 1) * per_seq, tiles[2] = {4, tile};
    int *order = malloc((size_t)n_blocks * sizeof(int));
    float *q = malloc((size_t)(S + R) * H * D * sizeof(float)),
          *out = malloc((size_t)(S + R) * H * D * sizeof(float));
    kn_attn_seq *seqs = malloc((size_t)(S + 1) * sizeof(*seqs));
    kn_ctx *ctx = kn_ctx_new(T, KN_BACKEND_AUTO);
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    cache c;
    if (!order || !q || !out || !seqs || !ctx || R < 1 || R > C)
        return 1;
    for (int i = 0; i < n_blocks; i++)
        order[i] = (int)((uint64_t)i * 7919 % (uint64_t)n_blocks); /* scattered over the pool */
    if (cache_init(&c, KN_TYPE_F16, S + 1, per_seq, L, KH, D, BT, order, huge, &rng))
        return 1;
    for (size_t i = 0; i < (size_t)(S + R) * H * D; i++)
        q[i] = bench_frand(&rng);
    double wall[2][MAX_REPS], cpu[2][MAX_REPS];
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < 2; k++) {
            double t0 = bench_now(), c0 = thread_cpu();
            if (chunk_step(ctx, &c, seqs, q, out, S, C, R, per_seq, L, H, KH, D, BT, tiles[k]))
                return 1;
            cpu[k][r] = thread_cpu() - c0;
            wall[k][r] = bench_now() - t0;
        }
    printf("chunked prefill attention [%s, %d threads]: %d decodes and a %d-row chunk at %d positions, "
           "%d layers, %d/%d heads of %d, f16; median of %d\n",
           kn_ctx_ops(ctx)->name, T, S, R, C, L, H, KH, D, reps);
    const double w0 = bench_median(wall[0], reps), c0 = bench_median(cpu[0], reps);
    for (int k = 0; k < 2; k++) {
        const double w = bench_median(wall[k], reps), cp = bench_median(cpu[k], reps);
        char name[16];
        snprintf(name, sizeof(name), tiles[k] ? "%d" : "default", tiles[k]);
        printf("  tile %-7s: %.2f ms wall (x%.2f), %.2f ms this thread's CPU (x%.2f)\n", name, w * 1e3, w / w0,
               cp * 1e3, cp / c0);
    }
    munmap(c.pool, c.pool_bytes);
    free(c.tables);
    return release(ctx, seqs, out, q, order);
}

int main(int argc, char **argv)
{
    const int S = bench_arg_int(argc, argv, "--seqs", 16), C = bench_arg_int(argc, argv, "--ctx", 192);
    const int L = bench_arg_int(argc, argv, "--layers", 12), H = bench_arg_int(argc, argv, "--heads", 12);
    const int KH = bench_arg_int(argc, argv, "--kv-heads", H), D = bench_arg_int(argc, argv, "--head-dim", 64);
    const int BT = bench_arg_int(argc, argv, "--block-tokens", 16), T = bench_arg_int(argc, argv, "--threads", 2);
    const bool huge = bench_arg_int(argc, argv, "--huge", 1) != 0;
    int reps = bench_arg_int(argc, argv, "--reps", 9);
    if (S < 1 || C < 1 || L < 1 || H < 1 || KH < 1 || H % KH || D < 32 || D % 32 || BT < 1 || T < 1 ||
        reps < 1) {
        fprintf(stderr, "bench_attention: every size must be positive, heads a multiple of kv-heads and the "
                        "head size a multiple of 32\n");
        return 2;
    }
    reps = reps > MAX_REPS ? MAX_REPS : reps;
    const int chunk = bench_arg_int(argc, argv, "--chunk", 0), pairs = bench_arg_int(argc, argv, "--pairs", 0);
    if (pairs > 0)
        return pairs_main(pairs, D, reps);
    if (chunk > 0)
        return chunk_main(argc, argv, S, C, chunk, L, H, KH, D, BT, T, huge, reps);
    const int per_seq = (C + BT - 1) / BT, n_blocks = S * per_seq;
    int *order = malloc((size_t)n_blocks * sizeof(int));
    float *q = malloc((size_t)S * H * D * sizeof(float)), *out = malloc((size_t)S * H * D * sizeof(float));
    kn_attn_seq *seqs = malloc((size_t)S * sizeof(*seqs));
    kn_ctx *ctx = kn_ctx_new(T, KN_BACKEND_AUTO);
    if (!order || !q || !out || !seqs || !ctx) {
        fprintf(stderr, "bench_attention: out of memory\n");
        return 1;
    }
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < n_blocks; i++)
        order[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        int j = (int)((uint64_t)((bench_frand(&rng) + 1.0f) * 0.5f * (float)(i + 1)) % (uint64_t)(i + 1));
        int t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    cache caches[2];
    if (cache_init(&caches[0], KN_TYPE_F16, S, per_seq, L, KH, D, BT, order, huge, &rng) ||
        cache_init(&caches[1], KN_TYPE_Q8_0, S, per_seq, L, KH, D, BT, order, huge, &rng)) {
        fprintf(stderr, "bench_attention: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < (size_t)S * H * D; i++)
        q[i] = bench_frand(&rng);

    for (int r = 0; r < reps; r++)
        for (int c = 0; c < 2; c++) {
            double t0 = bench_now();
            if (step(ctx, &caches[c], seqs, q, out, S, C, per_seq, L, H, KH, D, BT)) {
                fprintf(stderr, "bench_attention: kn_attention failed\n");
                return 1;
            }
            caches[c].t[r] = bench_now() - t0;
        }
    const double bw = membw_measure(T, (size_t)1 << 30, 3);
    printf("decode attention [%s, %d threads]: %d seqs x %d positions, %d layers, %d/%d heads of %d, "
           "blocks of %d%s; memory %.1f GB/s\n",
           kn_ctx_ops(ctx)->name, T, S, C, L, H, KH, D, BT, huge ? ", huge pages" : "", bw / 1e9);
    double t_f16 = 0;
    for (int c = 0; c < 2; c++) {
        const double t = bench_median(caches[c].t, reps);
        const double bytes = (double)S * C * L * KH * caches[c].row * 2 * sizeof(uint16_t);
        t_f16 = c == 0 ? t : t_f16;
        printf("  %-4s cache: %.1f us per layer, %.2f ms per step (x%.2f of f16); K+V read %.1f MB at %.1f GB/s "
               "(%.0f%% of memory)\n",
               kn_type_name(caches[c].type), t / L * 1e6, t * 1e3, t / t_f16, bytes / 1e6, bytes / t / 1e9,
               bw > 0 ? 100.0 * bytes / t / bw : 0.0);
        munmap(caches[c].pool, caches[c].pool_bytes);
        free(caches[c].tables);
    }
    return release(ctx, seqs, out, q, order);
}
