/* CUDA benchmark: the decode matvec's effective bandwidth (weight bytes read
 * per second) for Q8_0, Q4_0, Q4_K, Q5_K and Q6_K next to the device's
 * measured copy bandwidth, with and without programmatic dependent launch;
 * prefill GEMM TFLOP/s at 512 rows (dequantize + cublasGemmEx) for Q8_0,
 * Q4_0 and Q4_K next to cublasGemmEx on F16 weights of the same shape; and
 * decode tokens/s of a synthetic ~1.1B llama (dim 2048, 22 layers, 32/4
 * heads, ffn 5632, vocab 32000) in Q8_0, Q4_0 and Q4_K_M (llama.cpp's
 * mixture, quantized from an F16 file by `model quantize`'s code) at batch
 * 1 and, aggregated, at batch 32, with and without PDL. Markdown output for
 * bench/RESULTS.md. Exits 77 without a CUDA device.
 *
 *   bench_cuda [--dir DIR] [--reps N] [--no-model] [--matvec-only]
 *
 * Kernel timings replay the calls from a CUDA graph (no launch gaps) and
 * cycle through enough copies of the weights to overflow the L2 cache, so
 * every byte really comes from device memory. Models are generated into DIR
 * (default /tmp/infergate-bench) once. */
#include "bench/bench_util.h"
#include "kernels/kn.h"
#include "runtime/model.h"
#include "runtime/model_gen.h"
#include "runtime/quantize.h"
#ifdef INFERGATE_HAVE_CUDA
#include "kernels/cuda/kn_cuda.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifndef INFERGATE_HAVE_CUDA
int main(void)
{
    fprintf(stderr, "bench_cuda: built without CUDA\n");
    return 77;
}
#else

#define MAX_REPS 15
#define ROTATE_BYTES ((size_t)512 << 20) /* weight copies cycled through: 10x an H100's L2 */

static kn_cuda *kc;

static void die(const char *what, int rc)
{
    fprintf(stderr, "bench_cuda: %s failed (%d): %s\n", what, rc, kc ? kn_cuda_error(kc) : "");
    exit(1);
}

#define CK(call)                                                                                             \
    do {                                                                                                     \
        int rc_ = (call);                                                                                    \
        if (rc_)                                                                                             \
            die(#call, rc_);                                                                                 \
    } while (0)

static uint64_t rng = 88172645463325252ull;

/* ---- device copy bandwidth ---- */

/* Bytes read plus bytes written per second by a device-to-device copy (as
 * CUDA's bandwidthTest counts it), median of reps. */
static double copy_bandwidth(int reps)
{
    const size_t n = (size_t)1 << 30;
    void *a, *b;
    CK(kn_cuda_alloc(kc, n, &a));
    CK(kn_cuda_alloc(kc, n, &b));
    CK(kn_cuda_memset(kc, a, 1, n));
    CK(kn_cuda_copy_d2d(kc, b, a, n)); /* warm-up */
    CK(kn_cuda_sync(kc));
    double v[MAX_REPS];
    for (int r = 0; r < reps; r++) {
        double t0 = bench_now();
        for (int i = 0; i < 5; i++)
            CK(kn_cuda_copy_d2d(kc, i % 2 ? a : b, i % 2 ? b : a, n));
        CK(kn_cuda_sync(kc));
        v[r] = 5.0 * 2.0 * (double)n / (bench_now() - t0);
    }
    kn_cuda_release(kc, a);
    kn_cuda_release(kc, b);
    return bench_median(v, reps);
}

/* ---- matrices ---- */

typedef struct mat {
    kn_type type;
    int n_out, n_in, copies;
    kn_cuda_weight *w;
} mat;

static void mat_make(mat *m, kn_type type, int n_out, int n_in, size_t rotate_bytes)
{
    const size_t rb = kn_row_bytes(type, n_in);
    uint8_t *host = malloc(rb * n_out);
    float *row = malloc((size_t)n_in * sizeof(float));
    if (!host || !row)
        die("malloc", -12);
    for (int o = 0; o < n_out; o++) {
        for (int i = 0; i < n_in; i++)
            row[i] = bench_frand(&rng) * 0.02f;
        kn_quantize_row(type, row, host + (size_t)o * rb, n_in);
    }
    const uint64_t bytes = kn_cuda_weight_bytes(type, n_out, n_in);
    m->type = type;
    m->n_out = n_out;
    m->n_in = n_in;
    m->copies = (int)((rotate_bytes + bytes - 1) / bytes);
    if (m->copies < 2)
        m->copies = 2;
    m->w = calloc((size_t)m->copies, sizeof(*m->w));
    for (int c = 0; c < m->copies; c++)
        CK(kn_cuda_weight_upload(kc, host, type, n_out, n_in, &m->w[c]));
    free(host);
    free(row);
}

static void mat_free(mat *m)
{
    for (int c = 0; c < m->copies; c++)
        kn_cuda_weight_release(kc, &m->w[c]);
    free(m->w);
}

/* Seconds per matmul of n_rows rows, cycling through the copies: `iters`
 * calls recorded in one graph, replayed `reps` times (median). */
static double time_matmul(mat *m, const float *d_x, const void *d_xq, int n_rows, float *d_y, int iters,
                          int reps)
{
    CK(kn_cuda_matmul_reserve(kc, m->type, m->n_out, m->n_in, n_rows));
    CK(kn_cuda_matmul(kc, &m->w[0], d_x, d_xq, n_rows, d_y, false)); /* warm-up, outside the graph */
    CK(kn_cuda_sync(kc));
    kn_cuda_graph *g;
    CK(kn_cuda_capture_begin(kc));
    for (int i = 0; i < iters; i++)
        CK(kn_cuda_matmul(kc, &m->w[i % m->copies], d_x, d_xq, n_rows, d_y, false));
    CK(kn_cuda_capture_end(kc, &g));
    CK(kn_cuda_graph_launch(kc, g));
    CK(kn_cuda_sync(kc));
    double v[MAX_REPS];
    for (int r = 0; r < reps; r++) {
        double t0 = bench_now();
        CK(kn_cuda_graph_launch(kc, g));
        CK(kn_cuda_sync(kc));
        v[r] = (bench_now() - t0) / iters;
    }
    kn_cuda_graph_free(g);
    return bench_median(v, reps);
}

/* Matrix shapes of a 7-8B llama layer (attention out, FFN up, FFN down). */
static const struct {
    int n_out, n_in;
} shapes[] = {{4096, 4096}, {14336, 4096}, {4096, 14336}};
enum { N_SHAPES = 3, PREFILL_ROWS = 512 };

static void bench_gemm(const void *d_x, void *d_y, int reps)
{
    printf("\n## Prefill GEMM (%d rows)\n\n", PREFILL_ROWS);
    printf("Q8_0/Q4_0/Q4_K: dequantize to F16 tiles + cublasGemmEx (F16 in, F32 accumulate and out); F16: "
           "cublasGemmEx alone on the same shape.\n\n");
    printf("| n_out x n_in | q8_0 TFLOP/s | q4_0 TFLOP/s | q4_K TFLOP/s | f16 cuBLAS TFLOP/s | q8_0 / f16 | "
           "q4_0 / f16 | q4_K / f16 |\n|---|---|---|---|---|---|---|---|\n");
    static const kn_type gtypes[] = {KN_TYPE_Q8_0, KN_TYPE_Q4_0, KN_TYPE_Q4_K, KN_TYPE_F16};
    for (int s = 0; s < N_SHAPES; s++) {
        double tf[4];
        for (int t = 0; t < 4; t++) {
            mat m;
            mat_make(&m, gtypes[t], shapes[s].n_out, shapes[s].n_in, (size_t)256 << 20);
            double sec = time_matmul(&m, d_x, NULL, PREFILL_ROWS, d_y, 20, reps);
            tf[t] = 2.0 * PREFILL_ROWS * m.n_out * (double)m.n_in / sec / 1e12;
            mat_free(&m);
        }
        printf("| %d x %d | %.0f | %.0f | %.0f | %.0f | %.0f%% | %.0f%% | %.0f%% |\n", shapes[s].n_out,
               shapes[s].n_in, tf[0], tf[1], tf[2], tf[3], 100.0 * tf[0] / tf[3], 100.0 * tf[1] / tf[3],
               100.0 * tf[2] / tf[3]);
        fflush(stdout);
    }
}

static void bench_kernels(double copy_bw, int reps, bool gemm)
{
    const int max_in = 14336;
    float *x = malloc((size_t)PREFILL_ROWS * max_in * sizeof(float));
    for (size_t i = 0; i < (size_t)PREFILL_ROWS * max_in; i++)
        x[i] = bench_frand(&rng);
    void *d_x, *d_xq, *d_y;
    CK(kn_cuda_alloc(kc, (size_t)PREFILL_ROWS * max_in * sizeof(float), &d_x));
    CK(kn_cuda_upload(kc, d_x, x, (size_t)PREFILL_ROWS * max_in * sizeof(float)));
    CK(kn_cuda_alloc(kc, kn_cuda_q8_bytes(1, max_in), &d_xq));
    CK(kn_cuda_alloc(kc, (size_t)PREFILL_ROWS * 14336 * sizeof(float), &d_y));
    free(x);

    printf("## Decode matvec (1 row): effective bandwidth\n\n");
    printf("Weight bytes read per second, device layout (34 bytes per 32 weights for Q8_0, 18 for Q4_0; "
           "the K-quants as their GGUF blocks: 144, 176 and 210 bytes per 256 for Q4_K, Q5_K, Q6_K), "
           "against the measured copy bandwidth %.0f GB/s.\n\n",
           copy_bw / 1e9);
    printf("With PDL, each call may launch while the one before it finishes and stream its weights in "
           "meanwhile (programmatic dependent launch, sm_90), as in a forward step; plain: each call starts "
           "after the last has ended. Both timed in this run.\n\n");
    printf("| type | n_out x n_in | MB | us/call | GB/s | of copy bw | plain us/call | plain of copy bw |\n"
           "|---|---|---|---|---|---|---|---|\n");
    /* the K-quants meet the F32 activations (kn_cuda_matmul_wants_q8) */
    static const kn_type qtypes[] = {KN_TYPE_Q8_0, KN_TYPE_Q4_0, KN_TYPE_Q4_K, KN_TYPE_Q5_K, KN_TYPE_Q6_K};
    for (int t = 0; t < (int)(sizeof(qtypes) / sizeof(qtypes[0])); t++) {
        for (int s = 0; s < N_SHAPES; s++) {
            mat m;
            mat_make(&m, qtypes[t], shapes[s].n_out, shapes[s].n_in, ROTATE_BYTES);
            const void *xq = kn_cuda_matmul_wants_q8(qtypes[t], 1) ? d_xq : NULL;
            if (xq)
                CK(kn_cuda_quantize_q8(kc, d_x, 1, m.n_in, d_xq));
            const bool pdl = kn_cuda_set_pdl(kc, true);
            double sec = time_matmul(&m, d_x, xq, 1, d_y, 200, reps);
            kn_cuda_set_pdl(kc, false);
            double plain = time_matmul(&m, d_x, xq, 1, d_y, 200, reps);
            kn_cuda_set_pdl(kc, pdl);
            double bytes = (double)m.w[0].bytes;
            printf("| %s | %d x %d | %.1f | %.1f | %.0f | %.0f%% | %.1f | %.0f%% |\n",
                   kn_type_name(qtypes[t]), m.n_out, m.n_in, bytes / 1e6, sec * 1e6, bytes / sec / 1e9,
                   100.0 * bytes / sec / copy_bw, plain * 1e6, 100.0 * bytes / plain / copy_bw);
            fflush(stdout);
            mat_free(&m);
        }
    }

    if (gemm)
        bench_gemm(d_x, d_y, reps);
    kn_cuda_release(kc, d_x);
    kn_cuda_release(kc, d_xq);
    kn_cuda_release(kc, d_y);
}

/* ---- whole-model decode ---- */

/* Decode tokens per second with `batch` sequences, each prefilled with
 * n_prompt tokens, over n_decode steps (the token fed back is fixed:
 * sampling is not what is measured). */
static double decode_tps(rt_model *m, int batch, int n_prompt, int n_decode)
{
    const rt_hparams *hp = rt_model_hparams(m);
    char err[512];
    const int per_seq = n_prompt + n_decode + 16;
    rt_kv *kv = rt_kv_new(m, (size_t)batch * per_seq * rt_model_kv_bytes_per_token(m, KN_TYPE_F16), 16,
                          KN_TYPE_F16, err, sizeof(err));
    if (!kv) {
        fprintf(stderr, "bench_cuda: %s\n", err);
        exit(1);
    }
    rt_seq **seqs = calloc((size_t)batch, sizeof(*seqs));
    rt_batch_entry *e = calloc((size_t)batch, sizeof(*e));
    int32_t *toks = malloc((size_t)n_prompt * sizeof(int32_t));
    float *logits = malloc((size_t)batch * hp->n_vocab * sizeof(float));
    for (int i = 0; i < n_prompt; i++)
        toks[i] = 3 + (i * 7919) % (hp->n_vocab - 3);
    for (int b = 0; b < batch; b++) {
        seqs[b] = rt_seq_new(kv, per_seq);
        rt_batch_entry p = {.seq = seqs[b], .tokens = toks, .n_tokens = n_prompt, .logits = logits};
        if (!seqs[b] || rt_model_forward(m, &p, 1))
            die("prefill", -1);
    }
    double t0 = 0;
    for (int step = -2; step < n_decode; step++) { /* two untimed steps: graphs recorded */
        if (step == 0)
            t0 = bench_now();
        for (int b = 0; b < batch; b++)
            e[b] = (rt_batch_entry){.seq = seqs[b],
                                    .tokens = &toks[(step + 2 + b) % n_prompt],
                                    .n_tokens = 1,
                                    .logits = logits + (size_t)b * hp->n_vocab};
        if (rt_model_forward(m, e, batch))
            die("decode step", -1);
    }
    double tps = (double)batch * n_decode / (bench_now() - t0);
    for (int b = 0; b < batch; b++)
        rt_seq_free(seqs[b]);
    rt_kv_free(kv);
    free(seqs);
    free(e);
    free(toks);
    free(logits);
    return tps;
}

static void bench_model(const char *dir, double copy_bw, int reps)
{
    rt_gen_params gp;
    rt_gen_params_default(&gp);
    gp.dim = 2048;
    gp.layers = 22;
    gp.heads = 32;
    gp.kv_heads = 4;
    gp.ffn = 5632;
    gp.vocab = 32000;
    gp.ctx = 2048;
    mkdir(dir, 0755);
    printf("\n## Decode, synthetic ~1.1B model\n\n");
    printf("dim %d, %d layers, %d heads (%d KV), ffn %d, vocab %d; prompt 128 tokens, then 128 decode steps. "
           "Bound = copy bandwidth / bytes read per token (batch 1 reads every weight once per token).\n\n",
           gp.dim, gp.layers, gp.heads, gp.kv_heads, gp.ffn, gp.vocab);
    printf("| type | MB/token | batch 1 tok/s | bound tok/s | of bound | batch 32 aggregate tok/s | "
           "batch 1 plain | batch 32 plain |\n|---|---|---|---|---|---|---|---|\n");
    /* Q4_K_M: quantized from an F16 file (a mixture is no generator type) */
    static const struct {
        kn_type gen;
        const char *label;
        bool q4_k_m;
    } types[] = {{KN_TYPE_Q8_0, "q8_0", false}, {KN_TYPE_Q4_0, "q4_0", false}, {KN_TYPE_F16, "Q4_K_M", true}};
    for (int t = 0; t < 3; t++) {
        char gen[512], path[600], err[512];
        snprintf(gen, sizeof(gen), "%s/synth-%d-%d-%d-%d-%s.gguf", dir, gp.dim, gp.layers, gp.ffn, gp.vocab,
                 kn_type_name(types[t].gen));
        snprintf(path, sizeof(path), "%s", gen);
        if (types[t].q4_k_m)
            snprintf(path, sizeof(path), "%s/synth-%d-%d-%d-%d-Q4_K_M.gguf", dir, gp.dim, gp.layers, gp.ffn,
                     gp.vocab);
        struct stat st;
        if (stat(path, &st) != 0 && stat(gen, &st) != 0) {
            gp.type = types[t].gen;
            fprintf(stderr, "generating %s\n", gen);
            if (rt_model_gen(&gp, gen, err, sizeof(err))) {
                fprintf(stderr, "bench_cuda: %s\n", err);
                exit(1);
            }
        }
        if (stat(path, &st) != 0) {
            fprintf(stderr, "quantizing %s\n", path);
            rt_quant_opts qo = {.ftype = RT_FTYPE_Q4_K_M};
            if (rt_quantize_file(gen, path, &qo, NULL, err, sizeof(err))) {
                fprintf(stderr, "bench_cuda: %s\n", err);
                exit(1);
            }
        }
        /* The same model twice, the second with PDL off (its context reads
         * the variable when made), timed in alternation. */
        rt_model_opts o = {.device = "cuda"};
        rt_model *m[2];
        for (int i = 0; i < 2; i++) {
            if (i == 1)
                setenv("INFERGATE_CUDA_PDL", "0", 1);
            if (rt_model_load(path, &o, &m[i], err, sizeof(err))) {
                fprintf(stderr, "bench_cuda: %s: %s\n", path, err);
                exit(1);
            }
        }
        unsetenv("INFERGATE_CUDA_PDL");
        double b1[2][MAX_REPS], b32[2][MAX_REPS];
        for (int r = 0; r < reps; r++)
            for (int i = 0; i < 2; i++) {
                b1[i][r] = decode_tps(m[i], 1, 128, 128);
                b32[i][r] = decode_tps(m[i], 32, 128, 128);
            }
        double bytes = (double)rt_model_bytes_per_token(m[0]), bound = copy_bw / bytes;
        double d1 = bench_median(b1[0], reps), d32 = bench_median(b32[0], reps);
        printf("| %s | %.0f | %.0f | %.0f | %.0f%% | %.0f | %.0f | %.0f |\n", types[t].label,
               bytes / 1e6, d1, bound, 100.0 * d1 / bound, d32, bench_median(b1[1], reps),
               bench_median(b32[1], reps));
        fflush(stdout);
        rt_model_free(m[0]);
        rt_model_free(m[1]);
    }
}

int main(int argc, char **argv)
{
    const char *dir = "/tmp/infergate-bench";
    int reps = 5;
    bool model = true, gemm = true;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dir") && i + 1 < argc)
            dir = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-model"))
            model = false;
        else if (!strcmp(argv[i], "--matvec-only"))
            model = false, gemm = false;
        else {
            fprintf(stderr, "usage: bench_cuda [--dir DIR] [--reps N] [--no-model] [--matvec-only]\n");
            return 2;
        }
    }
    reps = reps < 1 ? 1 : reps > MAX_REPS ? MAX_REPS : reps;
    char err[512];
    int n;
    if (kn_cuda_device_count(&n, err, sizeof(err))) {
        fprintf(stderr, "bench_cuda: no CUDA device: %s\n", err);
        return 77;
    }
    if (kn_cuda_new(0, &kc, err, sizeof(err))) {
        fprintf(stderr, "bench_cuda: %s\n", err);
        return 77;
    }
    kn_cuda_info info;
    CK(kn_cuda_get_info(kc, &info));
    printf("# bench_cuda on %s (%s%s%s), compute capability %d.%d, %d SMs, %.1f GiB\n\n", info.name,
           info.uuid, info.mig_profile[0] ? ", MIG " : "", info.mig_profile, info.cc_major, info.cc_minor,
           info.sm_count, (double)info.mem_total / (1u << 30));
    double bw = copy_bandwidth(reps);
    printf("Device-to-device copy: %.0f GB/s (bytes read + written per second, median of %d).\n\n", bw / 1e9,
           reps);
    bench_kernels(bw, reps, gemm);
    kn_cuda_free(kc); /* the models bring their own contexts */
    kc = NULL;
    if (model)
        bench_model(dir, bw, reps < 3 ? reps : 3);
    return 0;
}
#endif
