/* Model benchmark: prefill and decode tokens/s of a synthetic model in F16,
 * Q8_0 and Q4_0 at 1 and 2 threads, next to the machine's memory read
 * bandwidth measured in the same run. Batch-1 decode reads every weight
 * once per token, so bandwidth / bytes-per-token is its bound.
 *
 *   bench_model [--dir DIR] [--dim 768 --layers 12 --heads 12 --ffn 2048
 *                --vocab 32000] [--prompt 128] [--decode 64] [--reps 3]
 *               [--types]
 *
 * --types instead runs every weight type (each file of one type
 * throughout, and the Q4_K_M mixture) at 2 threads against Q8_0 and Q4_0 of
 * the same run: decode as effective weight GB/s (bytes of weights read per
 * token x tokens/s) and prefill tokens/s, every type once per repetition so
 * that the medians of all cover the same stretches of a shared machine's
 * load.
 *
 * Models are generated into DIR (default /tmp/infergate-bench) once; the
 * --types files are quantized from the F32 one by `model quantize`'s code. */
#include "bench/bench_util.h"
#include "bench/membw.h"
#include "kernels/kn.h"
#include "runtime/model.h"
#include "runtime/model_gen.h"
#include "runtime/quantize.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_REPS 15

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Tokens per second of wall time, and per CPU-second of the process (its
 * compute threads together): on a shared machine the second leaves out
 * the time others' work took the cores. */
typedef struct rates {
    double prefill, decode, prefill_cpu, decode_cpu;
} rates;

/* One prefill of n_prompt tokens then n_decode greedy-free decode steps
 * (the token fed back is fixed: sampling is not what is measured). */
static void run_once_rates(rt_model *m, int n_prompt, int n_decode, rates *out)
{
    const rt_hparams *hp = rt_model_hparams(m);
    char err[256];
    rt_kv *kv = rt_kv_new(m, (size_t)(n_prompt + n_decode + 16) * rt_model_kv_bytes_per_token(m, KN_TYPE_F16),
                          16, KN_TYPE_F16, err, sizeof(err));
    rt_seq *s = kv ? rt_seq_new(kv, n_prompt + n_decode + 16) : NULL;
    int32_t *toks = malloc((size_t)n_prompt * sizeof(int32_t));
    float *logits = malloc((size_t)hp->n_vocab * sizeof(float));
    if (!s || !toks || !logits) {
        fprintf(stderr, "bench_model: out of memory\n");
        exit(1);
    }
    for (int i = 0; i < n_prompt; i++)
        toks[i] = 3 + (i * 7919) % (hp->n_vocab - 3);
    double t0 = bench_now(), c0 = cpu_now();
    rt_batch_entry e = {.seq = s, .tokens = toks, .n_tokens = n_prompt, .logits = logits};
    if (rt_model_forward(m, &e, 1)) {
        fprintf(stderr, "bench_model: prefill failed\n");
        exit(1);
    }
    double t1 = bench_now(), c1 = cpu_now();
    for (int i = 0; i < n_decode; i++) {
        e = (rt_batch_entry){.seq = s, .tokens = &toks[i % n_prompt], .n_tokens = 1, .logits = logits};
        if (rt_model_forward(m, &e, 1)) {
            fprintf(stderr, "bench_model: decode failed\n");
            exit(1);
        }
    }
    double t2 = bench_now(), c2 = cpu_now();
    *out = (rates){n_prompt / (t1 - t0), n_decode / (t2 - t1), n_prompt / (c1 - c0), n_decode / (c2 - c1)};
    free(logits);
    free(toks);
    rt_seq_free(s);
    rt_kv_free(kv);
}

static void run_once(rt_model *m, int n_prompt, int n_decode, double *prefill_tps, double *decode_tps)
{
    rates r;
    run_once_rates(m, n_prompt, n_decode, &r);
    *prefill_tps = r.prefill;
    *decode_tps = r.decode;
}

/* ---- --types ---- */

/* Every file type: one weight type throughout, and the mixture. */
static const struct {
    rt_ftype ft;
    bool pure;
    const char *label;
} bench_types[] = {
    {RT_FTYPE_Q8_0, true, "q8_0"},     {RT_FTYPE_Q4_0, true, "q4_0"},     {RT_FTYPE_Q4_1, true, "q4_1"},
    {RT_FTYPE_Q5_0, true, "q5_0"},     {RT_FTYPE_Q5_1, true, "q5_1"},     {RT_FTYPE_IQ4_NL, true, "iq4_nl"},
    {RT_FTYPE_Q2_K, true, "q2_K"},     {RT_FTYPE_Q3_K_S, true, "q3_K"},   {RT_FTYPE_Q4_K_S, true, "q4_K"},
    {RT_FTYPE_Q5_K_S, true, "q5_K"},   {RT_FTYPE_Q6_K, true, "q6_K"},     {RT_FTYPE_IQ4_XS, true, "iq4_xs"},
    {RT_FTYPE_F16, true, "f16"},       {RT_FTYPE_BF16, true, "bf16"},     {RT_FTYPE_Q4_K_M, false, "Q4_K_M (mix)"},
};
#define N_BENCH_TYPES (int)(sizeof(bench_types) / sizeof(bench_types[0]))

static int bench_all_types(rt_gen_params *gp, const char *dir, int n_prompt, int n_decode, int reps)
{
    char f32[512], err[1024];
    snprintf(f32, sizeof(f32), "%s/synth-%d-%d-%d-%d-f32.gguf", dir, gp->dim, gp->layers, gp->ffn, gp->vocab);
    struct stat st;
    gp->type = KN_TYPE_F32;
    if (stat(f32, &st) != 0) {
        fprintf(stderr, "generating %s\n", f32);
        if (rt_model_gen(gp, f32, err, sizeof(err))) {
            fprintf(stderr, "bench_model: %s\n", err);
            return 1;
        }
    }
    rt_model *m[N_BENCH_TYPES];
    for (int t = 0; t < N_BENCH_TYPES; t++) {
        char path[600];
        snprintf(path, sizeof(path), "%s.%s%s.gguf", f32, rt_ftype_name(bench_types[t].ft),
                 bench_types[t].pure ? "-pure" : "");
        if (stat(path, &st) != 0) {
            fprintf(stderr, "quantizing %s\n", path);
            rt_quant_opts qo = {.ftype = bench_types[t].ft, .pure = bench_types[t].pure};
            if (rt_quantize_file(f32, path, &qo, NULL, err, sizeof(err))) {
                fprintf(stderr, "bench_model: %s\n", err);
                return 1;
            }
        }
        rt_model_opts o = {.n_threads = 2};
        if (rt_model_load(path, &o, &m[t], err, sizeof(err))) {
            fprintf(stderr, "bench_model: %s: %s\n", path, err);
            return 1;
        }
    }
    rates rr[N_BENCH_TYPES][MAX_REPS];
    for (int t = 0; t < N_BENCH_TYPES; t++) /* warm-up: pages in, buffers at full size */
        run_once_rates(m[t], n_prompt, 4, &rr[t][0]);
    for (int r = 0; r < reps; r++)
        for (int t = 0; t < N_BENCH_TYPES; t++)
            run_once_rates(m[t], n_prompt, n_decode, &rr[t][r]);

    printf("model: dim %d, %d layers, %d heads, ffn %d, vocab %d; 2 threads (%s kernels); prompt %d tokens, "
           "decode %d tokens, %d reps, medians\n\n",
           gp->dim, gp->layers, gp->heads, gp->ffn, gp->vocab, rt_model_backend_name(m[0]), n_prompt, n_decode,
           reps);
    printf("| type | bits/weight | MB read/token | decode tok/s | decode GB/s | vs q8_0 | vs q4_0 | prefill tok/s "
           "| vs q8_0 | vs q4_0 |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    double gbs[N_BENCH_TYPES], ptps[N_BENCH_TYPES], v[MAX_REPS];
    for (int t = 0; t < N_BENCH_TYPES; t++) {
        double bytes = (double)rt_model_bytes_per_token(m[t]);
        for (int r = 0; r < reps; r++)
            v[r] = rr[t][r].prefill;
        ptps[t] = bench_median(v, reps);
        for (int r = 0; r < reps; r++)
            v[r] = rr[t][r].decode;
        gbs[t] = bench_median(v, reps) * bytes / 1e9;
    }
    for (int t = 0; t < N_BENCH_TYPES; t++) {
        double bytes = (double)rt_model_bytes_per_token(m[t]);
        double bpw = 8.0 * (double)rt_model_weight_bytes(m[t]) /
                     ((double)gp->layers * (4.0 * gp->dim * gp->dim + 3.0 * gp->dim * gp->ffn) +
                      2.0 * gp->dim * gp->vocab);
        printf("| %s | %.2f | %.1f | %.1f | %.2f | %.0f%% | %.0f%% | %.1f | %.0f%% | %.0f%% |\n",
               bench_types[t].label, bpw, bytes / 1e6, gbs[t] * 1e9 / bytes, gbs[t], 100 * gbs[t] / gbs[0],
               100 * gbs[t] / gbs[1], ptps[t], 100 * ptps[t] / ptps[0], 100 * ptps[t] / ptps[1]);
    }
    /* The same runs against Q4_0 (bench_types[1]) as the median of each
     * repetition's own ratio, which compares runs seconds apart, and in
     * CPU time: both steadier than the table above on a loaded machine. */
    printf("\nAgainst q4_0, the median of each repetition's ratio: wall time, and the process's CPU time\n\n");
    printf("| type | decode GB/CPU-s | decode vs q4_0 (wall) | (CPU) | prefill tok/CPU-s | prefill vs q4_0 "
           "(wall) | (CPU) |\n");
    printf("|---|---|---|---|---|---|---|\n");
    const double q4_bytes = (double)rt_model_bytes_per_token(m[1]);
    for (int t = 0; t < N_BENCH_TYPES; t++) {
        double bytes = (double)rt_model_bytes_per_token(m[t]), col[6];
        const double scale[6] = {bytes / 1e9, bytes / q4_bytes, bytes / q4_bytes, 1, 1, 1};
        for (int c = 0; c < 6; c++) {
            for (int r = 0; r < reps; r++) {
                const rates *x = &rr[t][r], *q = &rr[1][r];
                v[r] = c == 0   ? x->decode_cpu
                       : c == 1 ? x->decode / q->decode
                       : c == 2 ? x->decode_cpu / q->decode_cpu
                       : c == 3 ? x->prefill_cpu
                       : c == 4 ? x->prefill / q->prefill
                                : x->prefill_cpu / q->prefill_cpu;
            }
            col[c] = bench_median(v, reps) * scale[c];
        }
        printf("| %s | %.2f | %.0f%% | %.0f%% | %.1f | %.0f%% | %.0f%% |\n", bench_types[t].label, col[0],
               100 * col[1], 100 * col[2], col[3], 100 * col[4], 100 * col[5]);
    }
    for (int t = 0; t < N_BENCH_TYPES; t++)
        rt_model_free(m[t]);
    return 0;
}

int main(int argc, char **argv)
{
    rt_gen_params gp;
    rt_gen_params_default(&gp);
    gp.dim = 768;
    gp.layers = 12;
    gp.heads = 12;
    gp.kv_heads = 12;
    gp.ffn = 2048;
    gp.vocab = 32000;
    gp.ctx = 2048;
    const char *dir = "/tmp/infergate-bench";
    int n_prompt = 128, n_decode = 64, reps = 3;
    bool all_types = false;
    for (int i = 1; i < argc; i += 2) {
        const char *k = argv[i];
        if (!strcmp(k, "--types")) {
            all_types = true;
            i--;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "bench_model: %s needs a value\n", k);
            return 2;
        }
        int v = atoi(argv[i + 1]);
        if (!strcmp(k, "--dir"))
            dir = argv[i + 1];
        else if (!strcmp(k, "--dim"))
            gp.dim = v;
        else if (!strcmp(k, "--layers"))
            gp.layers = v;
        else if (!strcmp(k, "--heads"))
            gp.heads = gp.kv_heads = v;
        else if (!strcmp(k, "--ffn"))
            gp.ffn = v;
        else if (!strcmp(k, "--vocab"))
            gp.vocab = v;
        else if (!strcmp(k, "--prompt"))
            n_prompt = v;
        else if (!strcmp(k, "--decode"))
            n_decode = v;
        else if (!strcmp(k, "--reps"))
            reps = v < 1 ? 1 : v > MAX_REPS ? MAX_REPS : v;
        else {
            fprintf(stderr, "bench_model: unknown option %s\n", k);
            return 2;
        }
    }
    mkdir(dir, 0755);
    if (all_types)
        return bench_all_types(&gp, dir, n_prompt, n_decode, reps);

    static const kn_type types[] = {KN_TYPE_F16, KN_TYPE_Q8_0, KN_TYPE_Q4_0};
    enum { N_TYPES = 3, N_THREADS = 2 };
    rt_model *models[N_TYPES][N_THREADS];
    for (int t = 0; t < N_TYPES; t++) {
        char path[512], err[512];
        snprintf(path, sizeof(path), "%s/synth-%d-%d-%d-%d-%s.gguf", dir, gp.dim, gp.layers, gp.ffn, gp.vocab,
                 kn_type_name(types[t]));
        struct stat st;
        if (stat(path, &st) != 0) {
            gp.type = types[t];
            fprintf(stderr, "generating %s\n", path);
            if (rt_model_gen(&gp, path, err, sizeof(err))) {
                fprintf(stderr, "bench_model: %s\n", err);
                return 1;
            }
        }
        for (int th = 0; th < N_THREADS; th++) {
            rt_model_opts o = {.n_threads = th + 1};
            if (rt_model_load(path, &o, &models[t][th], err, sizeof(err))) {
                fprintf(stderr, "bench_model: %s: %s\n", path, err);
                return 1;
            }
        }
    }

    double bw[N_THREADS][MAX_REPS];
    double pre[N_TYPES][N_THREADS][MAX_REPS], dec[N_TYPES][N_THREADS][MAX_REPS];
    /* Warm-up pass: pages of the mapping in, buffers at full size. */
    for (int t = 0; t < N_TYPES; t++)
        for (int th = 0; th < N_THREADS; th++)
            run_once(models[t][th], n_prompt, 4, &pre[t][th][0], &dec[t][th][0]);
    for (int r = 0; r < reps; r++) {
        for (int th = 0; th < N_THREADS; th++)
            bw[th][r] = membw_measure(th + 1, (size_t)1 << 31, 2);
        for (int t = 0; t < N_TYPES; t++)
            for (int th = 0; th < N_THREADS; th++)
                run_once(models[t][th], n_prompt, n_decode, &pre[t][th][r], &dec[t][th][r]);
    }

    double bw_med[N_THREADS];
    for (int th = 0; th < N_THREADS; th++)
        bw_med[th] = bench_median(bw[th], reps);
    printf("memory read bandwidth: 1 thread %.2f GB/s, 2 threads %.2f GB/s (median of %d)\n\n", bw_med[0] / 1e9,
           bw_med[1] / 1e9, reps);
    printf("model: dim %d, %d layers, %d heads, ffn %d, vocab %d; prompt %d tokens, decode %d tokens, %d reps\n\n",
           gp.dim, gp.layers, gp.heads, gp.ffn, gp.vocab, n_prompt, n_decode, reps);
    printf("| type | MB read/token | threads | prefill tok/s | decode tok/s | decode bound tok/s | decode / bound "
           "| prefill / decode |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    for (int t = 0; t < N_TYPES; t++) {
        double bytes = (double)rt_model_bytes_per_token(models[t][0]);
        for (int th = 0; th < N_THREADS; th++) {
            double p = bench_median(pre[t][th], reps), d = bench_median(dec[t][th], reps);
            double bound = bw_med[N_THREADS - 1] / bytes;
            printf("| %s | %.1f | %d | %.1f | %.1f | %.1f | %.0f%% | %.1fx |\n", kn_type_name(types[t]), bytes / 1e6,
                   th + 1, p, d, bound, 100.0 * d / bound, p / d);
        }
    }
    printf("\nbound = 2-thread bandwidth / bytes read per token.\n");
    for (int t = 0; t < N_TYPES; t++)
        for (int th = 0; th < N_THREADS; th++)
            rt_model_free(models[t][th]);
    return 0;
}
