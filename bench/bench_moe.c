/* Mixture-of-experts benchmark: batch-1 decode of a synthetic MoE model (a
 * Mixtral-shaped llama file, E experts of which K are used) against a dense
 * model with the same active parameters (an FFN K times an expert's), side
 * by side in one run, as effective GB/s: the bytes a token reads (the
 * chosen experts' only: rt_model_bytes_per_token) times tokens per second.
 * Prefill of a prompt is reported too (each expert read once per step).
 *
 *   bench_moe [--dir DIR] [--dim 1024 --layers 8 --ffn 2048 --experts 8
 *              --experts-used 2 --vocab 8192] [--threads 2] [--prompt 64]
 *              [--decode 64] [--reps 5] [--type q8_0]
 *
 * Models are generated into DIR (default /tmp/infergate-bench) once. */
#include "bench/bench_util.h"
#include "kernels/kn.h"
#include "runtime/model.h"
#include "runtime/model_gen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_REPS 15

static void run_once(rt_model *m, int n_prompt, int n_decode, double *prefill_tps, double *decode_tps)
{
    const rt_hparams *hp = rt_model_hparams(m);
    char err[256];
    rt_kv *kv = rt_kv_new(m, (size_t)(n_prompt + n_decode + 16) * rt_model_kv_bytes_per_token(m, KN_TYPE_F16),
                          16, KN_TYPE_F16, err, sizeof(err));
    rt_seq *s = kv ? rt_seq_new(kv, n_prompt + n_decode + 16) : NULL;
    int32_t *toks = malloc((size_t)n_prompt * sizeof(int32_t));
    float *logits = malloc((size_t)hp->n_vocab * sizeof(float));
    if (!s || !toks || !logits) {
        fprintf(stderr, "bench_moe: out of memory\n");
        exit(1);
    }
    for (int i = 0; i < n_prompt; i++)
        toks[i] = 3 + (i * 7919) % (hp->n_vocab - 3);
    double t0 = bench_now();
    rt_batch_entry e = {.seq = s, .tokens = toks, .n_tokens = n_prompt, .logits = logits};
    if (rt_model_forward(m, &e, 1)) {
        fprintf(stderr, "bench_moe: prefill failed\n");
        exit(1);
    }
    double t1 = bench_now();
    for (int i = 0; i < n_decode; i++) {
        e = (rt_batch_entry){.seq = s, .tokens = &toks[i % n_prompt], .n_tokens = 1, .logits = logits};
        if (rt_model_forward(m, &e, 1)) {
            fprintf(stderr, "bench_moe: decode failed\n");
            exit(1);
        }
    }
    double t2 = bench_now();
    *prefill_tps = n_prompt / (t1 - t0);
    *decode_tps = n_decode / (t2 - t1);
    free(logits);
    free(toks);
    rt_seq_free(s);
    rt_kv_free(kv);
}

static rt_model *get_model(const char *dir, rt_gen_params *gp, const char *tag, int threads)
{
    char path[512], err[512];
    snprintf(path, sizeof(path), "%s/moe-%s-%d-%d-%d-%d-%d-%s.gguf", dir, tag, gp->dim, gp->layers, gp->ffn,
             gp->experts, gp->experts_used, kn_type_name(gp->type));
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "generating %s\n", path);
        if (rt_model_gen(gp, path, err, sizeof(err))) {
            fprintf(stderr, "bench_moe: %s\n", err);
            exit(1);
        }
    }
    rt_model_opts o = {.n_threads = threads};
    rt_model *m;
    if (rt_model_load(path, &o, &m, err, sizeof(err))) {
        fprintf(stderr, "bench_moe: %s: %s\n", path, err);
        exit(1);
    }
    return m;
}

int main(int argc, char **argv)
{
    rt_gen_params moe;
    rt_gen_params_default(&moe);
    moe.dim = 1024;
    moe.layers = 8;
    moe.heads = 16;
    moe.kv_heads = 4;
    moe.ffn = 2048;
    moe.vocab = 8192;
    moe.ctx = 1024;
    moe.experts = 8;
    moe.experts_used = 2;
    moe.arch = "mixtral";
    const char *dir = "/tmp/infergate-bench";
    int n_prompt = 64, n_decode = 64, reps = 5, threads = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i];
        int v = atoi(argv[i + 1]);
        if (!strcmp(k, "--dir"))
            dir = argv[i + 1];
        else if (!strcmp(k, "--dim"))
            moe.dim = v;
        else if (!strcmp(k, "--layers"))
            moe.layers = v;
        else if (!strcmp(k, "--ffn"))
            moe.ffn = v;
        else if (!strcmp(k, "--experts"))
            moe.experts = v;
        else if (!strcmp(k, "--experts-used"))
            moe.experts_used = v;
        else if (!strcmp(k, "--vocab"))
            moe.vocab = v;
        else if (!strcmp(k, "--threads"))
            threads = v;
        else if (!strcmp(k, "--prompt"))
            n_prompt = v;
        else if (!strcmp(k, "--decode"))
            n_decode = v;
        else if (!strcmp(k, "--reps"))
            reps = v < 1 ? 1 : v > MAX_REPS ? MAX_REPS : v;
        else if (!strcmp(k, "--type")) {
            kn_type t;
            if (kn_type_from_name(argv[i + 1], &t)) {
                fprintf(stderr, "bench_moe: unknown type %s\n", argv[i + 1]);
                return 2;
            }
            moe.type = t;
        } else {
            fprintf(stderr, "bench_moe: unknown option %s\n", k);
            return 2;
        }
    }
    mkdir(dir, 0755);
    rt_gen_params dense = moe;
    dense.arch = "llama";
    dense.experts = dense.experts_used = 0;
    dense.ffn = moe.ffn * moe.experts_used;
    rt_model *m[2] = {get_model(dir, &dense, "dense", threads), get_model(dir, &moe, "moe", threads)};
    const char *names[2] = {"dense", "moe"};

    double pre[2][MAX_REPS], dec[2][MAX_REPS];
    for (int k = 0; k < 2; k++) /* pages in, buffers at full size */
        run_once(m[k], n_prompt, 8, &pre[k][0], &dec[k][0]);
    /* alternate the two so that both see the same stretches of load */
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < 2; k++)
            run_once(m[k], n_prompt, n_decode, &pre[k][r], &dec[k][r]);

    printf("dense: dim %d, %d layers, ffn %d; moe: %d experts of ffn %d, %d used; %s, %d threads, %s; prompt %d, "
           "decode %d tokens, median of %d\n\n",
           dense.dim, dense.layers, dense.ffn, moe.experts, moe.ffn, moe.experts_used, kn_type_name(moe.type),
           threads, rt_model_backend_name(m[0]), n_prompt, n_decode, reps);
    printf("| model | weights MB | MB read/token | prefill tok/s | decode tok/s | decode effective GB/s |\n");
    printf("|---|---|---|---|---|---|\n");
    double gbs[2];
    for (int k = 0; k < 2; k++) {
        const double bytes = (double)rt_model_bytes_per_token(m[k]);
        const double p = bench_median(pre[k], reps), d = bench_median(dec[k], reps);
        gbs[k] = bytes * d / 1e9;
        printf("| %s | %.1f | %.1f | %.1f | %.1f | %.2f |\n", names[k], rt_model_weight_bytes(m[k]) / 1e6, bytes / 1e6,
               p, d, gbs[k]);
    }
    printf("\nmoe decode effective GB/s / dense: %.0f%%\n", 100.0 * gbs[1] / gbs[0]);
    rt_model_free(m[0]);
    rt_model_free(m[1]);
    return 0;
}
