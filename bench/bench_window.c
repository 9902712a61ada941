/* Sliding-window KV benchmark: the paged KV blocks one sequence holds at a
 * long context in the families with sliding-window layers (gemma2, gemma3,
 * gpt-oss, their own windows and layer patterns), against what every layer
 * would hold without windows and what the global layers alone hold. The
 * sequence is prefilled in chunks, as the scheduler prefills, then decodes;
 * the blocks are counted after every step (the peak: a chunk's positions
 * are all held while it runs). Also the most positions the pool, sized for
 * the context without windows, could give one sequence.
 *
 *   bench_window [--dir DIR] [--ctx 4096] [--chunk 512] [--decode 64]
 *                [--threads 2] [--families gemma2,gemma3,gpt-oss]
 *
 * Models (dim 512, 12 layers, head_dim 64, Q8_0) are generated into DIR
 * (default /tmp/infergate-bench) once. */
#include "kernels/kn.h"
#include "runtime/model.h"
#include "runtime/model_gen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define BLOCK_TOKENS 16

static rt_model *get_model(const char *dir, rt_gen_params *gp, int threads)
{
    char path[512], err[512];
    snprintf(path, sizeof(path), "%s/window-%s-%d-%d-%d-%s.gguf", dir, gp->arch, gp->dim, gp->layers, gp->ctx,
             kn_type_name(gp->type));
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "generating %s\n", path);
        if (rt_model_gen(gp, path, err, sizeof(err))) {
            fprintf(stderr, "bench_window: %s\n", err);
            exit(1);
        }
    }
    rt_model_opts o = {.n_threads = threads};
    rt_model *m;
    if (rt_model_load(path, &o, &m, err, sizeof(err))) {
        fprintf(stderr, "bench_window: %s: %s\n", path, err);
        exit(1);
    }
    return m;
}

static void run(const char *dir, const char *arch, int ctx, int chunk, int n_decode, int threads)
{
    rt_gen_params gp;
    rt_gen_params_default(&gp);
    gp.arch = arch;
    gp.dim = 512;
    gp.layers = 12;
    gp.heads = 8;
    gp.kv_heads = 4;
    gp.ffn = 1024;
    gp.vocab = 4096;
    gp.ctx = ctx + n_decode;
    gp.type = KN_TYPE_Q8_0;
    rt_model *m = get_model(dir, &gp, threads);
    const rt_hparams *hp = rt_model_hparams(m);
    char err[256];
    const size_t pool = (size_t)(ctx + n_decode + BLOCK_TOKENS) * rt_model_kv_bytes_per_token(m, KN_TYPE_F16);
    rt_kv *kv = rt_kv_new(m, pool, BLOCK_TOKENS, KN_TYPE_F16, err, sizeof(err));
    rt_seq *s = kv ? rt_seq_new(kv, ctx + n_decode) : NULL;
    int32_t *toks = malloc((size_t)(ctx + n_decode) * sizeof(int32_t));
    if (!s || !toks) {
        fprintf(stderr, "bench_window: %s\n", kv ? "out of memory" : err);
        exit(1);
    }
    for (int i = 0; i < ctx + n_decode; i++)
        toks[i] = 3 + (i * 7919) % (hp->n_vocab - 3);
    int peak = 0;
    for (int i = 0; i < ctx + n_decode;) {
        /* the prompt in chunks, then one position a step */
        int n = i < ctx ? (ctx - i < chunk ? ctx - i : chunk) : 1;
        rt_batch_entry e = {.seq = s, .tokens = toks + i, .n_tokens = n, .logits = NULL};
        if (rt_model_forward(m, &e, 1)) {
            fprintf(stderr, "bench_window: forward failed at position %d\n", i);
            exit(1);
        }
        peak = rt_seq_blocks(s) > peak ? rt_seq_blocks(s) : peak;
        i += n;
    }
    const int held = rt_seq_blocks(s), len = rt_seq_len(s);
    /* rt_kv_blocks_for(len) is every layer's KV at len positions: what a
     * cache without windows holds. The ideal with windows: the global
     * layers' len positions and each sliding layer's window. */
    const double mb = rt_kv_block_bytes(kv) / 1e6, all = rt_kv_blocks_for(kv, len) * mb;
    int n_local = 0;
    for (int l = 0; l < hp->n_layer; l++)
        n_local += !strcmp(arch, "gemma3") ? l % 6 < 5 : l % 2 == 0;
    const double per = all / ((double)hp->n_layer * len); /* MB a layer's position */
    const double global = per * (hp->n_layer - n_local) * len;
    const double ideal = global + per * n_local * (hp->n_swa < len ? hp->n_swa : len);
    printf("| %s | %d / %d | %d | %d | %.1f (%d blocks) | %.1f | %.1f | %.1f | %.1f | %.0f%% | %lld |\n", arch,
           n_local, hp->n_layer, hp->n_swa, len, held * mb, held, peak * mb, all, global, ideal, 100.0 * held * mb / all,
           (long long)rt_kv_seq_tokens_max(kv));
    free(toks);
    rt_seq_free(s);
    rt_kv_free(kv);
    rt_model_free(m);
}

int main(int argc, char **argv)
{
    const char *dir = "/tmp/infergate-bench";
    const char *families = "gemma2,gemma3,gpt-oss";
    int ctx = 4096, chunk = 512, n_decode = 64, threads = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--dir"))
            dir = v;
        else if (!strcmp(k, "--families"))
            families = v;
        else if (!strcmp(k, "--ctx"))
            ctx = atoi(v);
        else if (!strcmp(k, "--chunk"))
            chunk = atoi(v);
        else if (!strcmp(k, "--decode"))
            n_decode = atoi(v);
        else if (!strcmp(k, "--threads"))
            threads = atoi(v);
        else {
            fprintf(stderr, "bench_window: unknown option %s\n", k);
            return 2;
        }
    }
    if (ctx < 1 || chunk < 1 || n_decode < 0 || threads < 1) {
        fprintf(stderr, "bench_window: --ctx, --chunk and --threads must be positive\n");
        return 2;
    }
    mkdir(dir, 0755);
    printf("context %d (prefill in chunks of %d) + %d decoded, blocks of %d positions, F16 KV, %d threads\n\n", ctx,
           chunk, n_decode, BLOCK_TOKENS, threads);
    printf("| family | sliding layers | window | positions | MB held | peak MB | MB without windows | global layers' "
           "MB | global + windows MB | held / without | pool's max positions |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
    char list[256];
    snprintf(list, sizeof(list), "%s", families);
    for (char *save = NULL, *f = strtok_r(list, ",", &save); f; f = strtok_r(NULL, ",", &save))
        run(dir, f, ctx, chunk, n_decode, threads);
    return 0;
}
