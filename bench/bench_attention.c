/* Decode attention benchmark: S sequences, one new token each, over a paged
 * F16 KV cache of C positions per sequence, every layer in turn (so the
 * cache is read from memory, as a decode step reads it). Attention at decode
 * has nothing to share between sequences: each reads its own cache once, so
 * it is bound by memory bandwidth, and this prints how close it comes.
 *
 *   bench_attention [--seqs S] [--ctx C] [--layers L] [--heads H]
 *                   [--kv-heads K] [--head-dim D] [--block-tokens B]
 *                   [--threads T] [--reps N]
 *
 * Blocks are handed out in a shuffled order, as a pool looks after requests
 * have come and gone. */
#include "bench/bench_util.h"
#include "bench/membw.h"
#include "kernels/kn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MAX_REPS 31

static int arg_int(int argc, char **argv, const char *name, int dflt)
{
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0)
            return atoi(argv[i + 1]);
    return dflt;
}

int main(int argc, char **argv)
{
    const int S = arg_int(argc, argv, "--seqs", 16), C = arg_int(argc, argv, "--ctx", 192);
    const int L = arg_int(argc, argv, "--layers", 12), H = arg_int(argc, argv, "--heads", 12);
    const int KH = arg_int(argc, argv, "--kv-heads", H), D = arg_int(argc, argv, "--head-dim", 64);
    const int BT = arg_int(argc, argv, "--block-tokens", 16), T = arg_int(argc, argv, "--threads", 2);
    int reps = arg_int(argc, argv, "--reps", 9);
    if (S < 1 || C < 1 || L < 1 || H < 1 || KH < 1 || H % KH || D < 1 || BT < 1 || T < 1 || reps < 1) {
        fprintf(stderr, "bench_attention: every size must be positive and heads a multiple of kv-heads\n");
        return 2;
    }
    reps = reps > MAX_REPS ? MAX_REPS : reps;
    const size_t kv_dim = (size_t)KH * D, block_elems = 2 * (size_t)L * BT * kv_dim;
    const int per_seq = (C + BT - 1) / BT, n_blocks = S * per_seq;
    /* Mapped as rt_kv_new maps its pool. */
    const size_t pool_bytes = (size_t)n_blocks * block_elems * sizeof(uint16_t);
    uint16_t *pool = mmap(NULL, pool_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (pool == MAP_FAILED)
        pool = NULL;
    else if (arg_int(argc, argv, "--huge", 1))
        madvise(pool, pool_bytes, MADV_HUGEPAGE);
    uint16_t **tables = malloc((size_t)n_blocks * sizeof(*tables));
    int *order = malloc((size_t)n_blocks * sizeof(int));
    float *q = malloc((size_t)S * H * D * sizeof(float)), *out = malloc((size_t)S * H * D * sizeof(float));
    kn_attn_seq *seqs = malloc((size_t)S * sizeof(*seqs));
    kn_ctx *ctx = kn_ctx_new(T, KN_BACKEND_AUTO);
    if (!pool || !tables || !order || !q || !out || !seqs || !ctx) {
        fprintf(stderr, "bench_attention: out of memory\n");
        return 1;
    }
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < (size_t)n_blocks * block_elems; i++)
        pool[i] = kn_fp32_to_fp16(bench_frand(&rng));
    for (int i = 0; i < n_blocks; i++)
        order[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        int j = (int)((uint64_t)((bench_frand(&rng) + 1.0f) * 0.5f * (float)(i + 1)) % (uint64_t)(i + 1));
        int t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (int i = 0; i < n_blocks; i++)
        tables[i] = pool + (size_t)order[i] * block_elems;
    for (size_t i = 0; i < (size_t)S * H * D; i++)
        q[i] = bench_frand(&rng);

    const float scale = 1.0f / sqrtf((float)D);
    double t_all[MAX_REPS];
    for (int r = 0; r < reps; r++) {
        double t0 = bench_now();
        for (int l = 0; l < L; l++) {
            const size_t k_off = (size_t)l * 2 * BT * kv_dim;
            for (int s = 0; s < S; s++)
                seqs[s] = (kn_attn_seq){.q = q + (size_t)s * H * D,
                                        .out = out + (size_t)s * H * D,
                                        .n_q = 1,
                                        .pos0 = C - 1,
                                        .blocks = tables + (size_t)s * per_seq,
                                        .k_off = k_off,
                                        .v_off = k_off + (size_t)BT * kv_dim,
                                        .block_tokens = BT};
            if (kn_attention(ctx, seqs, S, H, KH, D, scale)) {
                fprintf(stderr, "bench_attention: kn_attention failed\n");
                return 1;
            }
        }
        t_all[r] = bench_now() - t0;
    }
    const double t = bench_median(t_all, reps);
    const double bytes = (double)S * C * L * kv_dim * 2 * sizeof(uint16_t);
    const double bw = membw_measure(T, (size_t)1 << 30, 3);
    printf("decode attention [%s, %d threads]: %d seqs x %d positions, %d layers, %d/%d heads of %d, "
           "blocks of %d\n",
           kn_ctx_ops(ctx)->name, T, S, C, L, H, KH, D, BT);
    printf("  %.1f us per layer, %.2f ms per step; K+V read %.1f MB at %.1f GB/s; memory %.1f GB/s (%.0f%%)\n",
           t / L * 1e6, t * 1e3, bytes / 1e6, bytes / t / 1e9, bw / 1e9, bw > 0 ? 100.0 * bytes / t / bw : 0.0);
    kn_ctx_free(ctx);
    free(seqs);
    free(out);
    free(q);
    free(order);
    free(tables);
    munmap(pool, pool_bytes);
    return 0;
}
