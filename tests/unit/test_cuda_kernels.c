/* CUDA backend against the scalar reference.
 *
 * Host checks (every build): a model asked for on device "cuda" without a
 * device, or in a build without CUDA, is refused with "no CUDA device: ...";
 * the device layouts (repacked Q8_0/Q4_0 rows, weight and activation buffer
 * sizes, MIG profile parsing) are what the kernels expect.
 *
 * GPU checks (with a device): every operation on random data with odd sizes
 * against kn_ops_ref / kn_rope_ref / kn_attention on the reference context —
 * exact where the arithmetic is the same (activation quantization, embedding
 * rows), within bounds derived from the magnitudes involved elsewhere (F32
 * summation order; F16 rounding of GEMM inputs) — then a synthetic model:
 * F16 on the GPU against the F32 reference (cosine >= 0.9999), Q8_0 greedy
 * tokens equal to the CPU's for 32 steps, a Q4_K_M file close to the CPU
 * reference, batched equal to alone, graphs equal to plain launches, and
 * the KV cache refused when it cannot fit. The types kept as GGUF blocks
 * (Q4_1 ... IQ4_XS, BF16) are checked through the same matmul and
 * embedding paths (written without a GPU at hand: 2026-11-28, issue 27).
 *
 * Exits 77 (skip) after the host checks when there is no CUDA device or no
 * CUDA in the build. Fixed seeds; no timing. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "kernels/kn.h"
#include "kernels/kn_moe_route.h"
#include "kernels/quant_blocks.h"
#include "runtime/model.h"
#include "runtime/model_gen.h"
#include "runtime/quantize.h"
#include "model_checks.h"
#ifdef INFERGATE_HAVE_CUDA
#include "kernels/cuda/kn_cuda.h"
#endif

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
/* The CUDA driver maps memory where ASan keeps its shadow gap, and keeps
 * allocations until exit. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "protect_shadow_gap=0";
}
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libcuda.so\nleak:libcudart.so\nleak:libcublas\nleak:libnvidia\n";
}
#endif

/* ---- shared: random numbers and synthetic models ---- */

#ifdef INFERGATE_HAVE_CUDA
static uint64_t rng = 1;

static void seed(uint64_t s)
{
    rng = s * 0x9e3779b97f4a7c15ull + 1;
}

static float frand(void) /* [-1, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

static void fill(float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = frand() * scale;
}

#endif

static char dir[64];
static char path_f32[96], path_f16[96], path_q8[96], path_q4[96];

/* A small synthetic llama of dim x ffn (3 layers, 4 heads, 2 KV heads). */
static int gen_shape(const char *path, uint32_t type, int dim, int ffn)
{
    rt_gen_params p;
    rt_gen_params_default(&p);
    p.dim = dim;
    p.layers = 3;
    p.heads = 4;
    p.kv_heads = 2;
    p.ffn = ffn;
    p.vocab = 512;
    p.ctx = 256;
    p.type = type;
    p.seed = 7;
    char err[256];
    int rc = rt_model_gen(&p, path, err, sizeof(err));
    if (rc)
        fprintf(stderr, "gen %s: %s\n", path, err);
    return rc;
}

static int gen(const char *path, uint32_t type)
{
    return gen_shape(path, type, 128, 320);
}

static int make_models(void)
{
    snprintf(dir, sizeof(dir), "/tmp/infergate-test-cuda-XXXXXX");
    if (!mkdtemp(dir))
        return -1;
    snprintf(path_f32, sizeof(path_f32), "%s/f32.gguf", dir);
    snprintf(path_f16, sizeof(path_f16), "%s/f16.gguf", dir);
    snprintf(path_q8, sizeof(path_q8), "%s/q8.gguf", dir);
    snprintf(path_q4, sizeof(path_q4), "%s/q4.gguf", dir);
    return gen(path_f32, KN_TYPE_F32) || gen(path_f16, KN_TYPE_F16) || gen(path_q8, KN_TYPE_Q8_0) ||
           gen(path_q4, KN_TYPE_Q4_0);
}

static void remove_models(void)
{
    unlink(path_f32);
    unlink(path_f16);
    unlink(path_q8);
    unlink(path_q4);
    rmdir(dir);
}

/* ---- host checks ---- */

static bool have_device(char *why, size_t n)
{
#ifdef INFERGATE_HAVE_CUDA
    int count;
    return kn_cuda_device_count(&count, why, n) == 0 && count > 0;
#else
    snprintf(why, n, "built without CUDA");
    return false;
#endif
}

static void test_no_device_refused(void **state)
{
    char why[256], err[512];
    rt_model *m = NULL;
    if (!have_device(why, sizeof(why))) {
        rt_model_opts o = {.device = "cuda"};
        assert_int_equal(rt_model_load(path_q8, &o, &m, err, sizeof(err)), -ENODEV);
        assert_null(m);
        printf("# %s\n", err);
        assert_memory_equal(err, "no CUDA device: ", 16);
    }
    rt_model_opts bad = {.device = "tpu"};
    assert_int_equal(rt_model_load(path_q8, &bad, &m, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "tpu"));
    /* The CPU path is untouched by the option. */
    rt_model_opts cpu = {.device = "cpu"};
    assert_int_equal(rt_model_load(path_q8, &cpu, &m, err, sizeof(err)), 0);
    rt_device_info di;
    rt_model_device_info(m, &di);
    assert_string_equal(di.kind, "cpu");
    assert_int_equal(rt_model_kv_bytes_per_token(m, KN_TYPE_F16), (size_t)2 * 3 * 2 * 32 * 2);
    rt_model_free(m);
}

#ifdef INFERGATE_HAVE_CUDA
static void test_layouts(void **state)
{
    enum { ROWS = 3, N = 96 };
    seed(11);
    float x[ROWS * N];
    fill(x, ROWS * N, 2.0f);
    const kn_type types[] = {KN_TYPE_Q8_0, KN_TYPE_Q4_0};
    for (int t = 0; t < 2; t++) {
        size_t rb = kn_row_bytes(types[t], N);
        uint8_t *g = malloc(rb * ROWS);
        for (int r = 0; r < ROWS; r++)
            kn_quantize_row(types[t], x + r * N, g + r * rb, N);
        const size_t qrow = types[t] == KN_TYPE_Q8_0 ? N : N / 2;
        uint8_t q[ROWS * N];
        uint16_t scl[ROWS * N / 32];
        assert_int_equal(kn_cuda_repack_rows(types[t], g, ROWS, N, q, scl), 0);
        /* Rebuild GGUF blocks from the device layout: they must be the input. */
        for (int r = 0; r < ROWS; r++) {
            uint8_t blocks[sizeof(kn_block_q8_0) * (N / 32)];
            for (int b = 0; b < N / 32; b++) {
                if (types[t] == KN_TYPE_Q8_0) {
                    kn_block_q8_0 *k = (kn_block_q8_0 *)blocks + b;
                    k->d = scl[r * (N / 32) + b];
                    memcpy(k->qs, q + r * qrow + b * 32, 32);
                } else {
                    kn_block_q4_0 *k = (kn_block_q4_0 *)blocks + b;
                    k->d = scl[r * (N / 32) + b];
                    memcpy(k->qs, q + r * qrow + b * 16, 16);
                }
            }
            assert_memory_equal(blocks, g + r * rb, rb);
        }
        free(g);
    }
    assert_int_equal(kn_cuda_repack_rows(KN_TYPE_F16, x, 1, N, NULL, NULL), -EINVAL);
    assert_int_equal(kn_cuda_repack_rows(KN_TYPE_Q8_0, x, 1, 33, NULL, NULL), -EINVAL);

    assert_int_equal(kn_cuda_weight_bytes(KN_TYPE_F32, 3, 5), 60);
    assert_int_equal(kn_cuda_weight_bytes(KN_TYPE_F16, 3, 5), 30);
    assert_int_equal(kn_cuda_weight_bytes(KN_TYPE_Q8_0, 3, 64), 256 + 3 * 2 * 2);
    assert_int_equal(kn_cuda_weight_bytes(KN_TYPE_Q4_0, 10, 64), 512 + 10 * 2 * 2);
    assert_int_equal(kn_cuda_weight_bytes(KN_TYPE_Q4_0, 10, 48), 0);
    /* 4096 x 4096 Q8_0 is as many bytes as in GGUF: 34 per 32 weights. */
    assert_int_equal(kn_cuda_weight_bytes(KN_TYPE_Q8_0, 4096, 4096), (uint64_t)4096 * 128 * 34);
    assert_int_equal(kn_cuda_q8_meta_offset(3, 96), 288);
    assert_int_equal(kn_cuda_q8_bytes(3, 96), 288 + 3 * 3 * 8);
    assert_int_equal(kn_cuda_q8_meta_offset(1, 32), 32);
    assert_true(kn_cuda_matmul_wants_q8(KN_TYPE_Q4_0, KN_CUDA_MMV_MAX_ROWS));
    assert_false(kn_cuda_matmul_wants_q8(KN_TYPE_Q4_0, KN_CUDA_MMV_MAX_ROWS + 1));
    assert_false(kn_cuda_matmul_wants_q8(KN_TYPE_F16, 1));
    /* the other types: their GGUF rows as they are, rows of whole units */
    assert_true(kn_cuda_raw_layout(KN_TYPE_Q4_K) && kn_cuda_raw_layout(KN_TYPE_BF16));
    assert_false(kn_cuda_raw_layout(KN_TYPE_Q8_0) || kn_cuda_raw_layout(KN_TYPE_F16));
    assert_int_equal(kn_cuda_weight_bytes(KN_TYPE_Q4_K, 3, 512), 3 * 2 * 144);
    assert_int_equal(kn_cuda_weight_bytes(KN_TYPE_Q4_K, 3, 96), 0);
    assert_int_equal(kn_cuda_weight_bytes(KN_TYPE_IQ4_NL, 3, 96), 3 * 3 * 18);
    assert_true(kn_cuda_raw_layout(KN_TYPE_MXFP4));
    assert_int_equal(kn_cuda_weight_bytes(KN_TYPE_MXFP4, 3, 96), 3 * 3 * 17);
    assert_int_equal(kn_cuda_weight_bytes(KN_TYPE_BF16, 3, 64), 3 * 128);
    assert_int_equal(kn_cuda_weight_bytes(KN_TYPE_BF16, 3, 33), 0);
    assert_false(kn_cuda_matmul_wants_q8(KN_TYPE_Q4_K, 1));

    char prof[32];
    kn_cuda_mig_profile_from_name("NVIDIA A100-SXM4-40GB MIG 1g.5gb", prof, sizeof(prof));
    assert_string_equal(prof, "1g.5gb");
    kn_cuda_mig_profile_from_name("NVIDIA H100 80GB HBM3 MIG 3g.40gb", prof, sizeof(prof));
    assert_string_equal(prof, "3g.40gb");
    kn_cuda_mig_profile_from_name("NVIDIA H100 80GB HBM3", prof, sizeof(prof));
    assert_string_equal(prof, "");
}
#endif

/* ---- GPU checks ---- */

#ifdef INFERGATE_HAVE_CUDA
static kn_cuda *kc;

static const int32_t prompt[] = {1, 300, 301, 450, 17, 99, 260, 302, 303, 511, 42, 277, 310};
#define N_PROMPT ((int)(sizeof(prompt) / sizeof(prompt[0])))

#define CK(call)                                                                                             \
    do {                                                                                                     \
        int rc_ = (call);                                                                                    \
        if (rc_)                                                                                             \
            fail_msg("%s = %d: %s", #call, rc_, kn_cuda_error(kc));                                          \
    } while (0)

static void *dev_copy(const void *h, size_t bytes)
{
    void *d = NULL;
    CK(kn_cuda_alloc(kc, bytes, &d));
    CK(kn_cuda_upload(kc, d, h, bytes));
    return d;
}

static void *dev_zero(size_t bytes)
{
    void *d = NULL;
    CK(kn_cuda_alloc(kc, bytes, &d));
    CK(kn_cuda_memset(kc, d, 0, bytes));
    return d;
}

static void host_copy(void *h, const void *d, size_t bytes)
{
    CK(kn_cuda_download(kc, h, d, bytes));
}

/* |a - b| <= tol for every element, with the worst named on failure. */
static void assert_close(const char *what, const float *got, const float *want, const float *tol, size_t n)
{
    size_t worst = 0;
    double worst_r = 0;
    for (size_t i = 0; i < n; i++) {
        /* An exact match is no error, equal infinities included (inf - inf is NaN), and passes even
         * where the tolerance is 0 (exact checks): 0/0 is NaN */
        double d = got[i] == want[i] ? 0 : fabs((double)got[i] - want[i]), r = d == 0 ? 0 : d / tol[i];
        if (!(r <= worst_r)) { /* NaN counts as worst */
            worst_r = isnan(r) ? INFINITY : r;
            worst = i;
        }
    }
    if (worst_r > 1.0)
        fail_msg("%s: element %zu is %.9g, want %.9g (tolerance %.3g)", what, worst, got[worst], want[worst],
                 tol[worst]);
}

static int gpu_setup(void **state)
{
    char err[256];
    if (kn_cuda_new(0, &kc, err, sizeof(err))) {
        fprintf(stderr, "kn_cuda_new: %s\n", err);
        return -1;
    }
    kn_cuda_info info;
    if (kn_cuda_get_info(kc, &info) == 0)
        printf("# device: %s (%s%s%s), cc %d.%d, %d SMs, %.0f MiB\n", info.name, info.uuid,
               info.mig_profile[0] ? ", MIG " : "", info.mig_profile, info.cc_major, info.cc_minor,
               info.sm_count, (double)info.mem_total / 1048576.0);
    return 0;
}

static int gpu_teardown(void **state)
{
    kn_cuda_free(kc);
    return 0;
}

static void test_quantize_q8(void **state)
{
    enum { ROWS = 5, N = 160 };
    seed(1);
    float x[ROWS * N];
    fill(x, ROWS * N, 3.0f);
    for (int i = 0; i < 32; i++)
        x[2 * N + 32 + i] = 0.0f; /* a zero block: scale 0, quants 0 */
    x[7] = 127.0f / 3.0f;
    void *dx = dev_copy(x, sizeof(x));
    const size_t bytes = kn_cuda_q8_bytes(ROWS, N);
    void *dq = dev_zero(bytes);
    CK(kn_cuda_quantize_q8(kc, dx, ROWS, N, dq));
    uint8_t *got = malloc(bytes);
    host_copy(got, dq, bytes);
    const size_t moff = kn_cuda_q8_meta_offset(ROWS, N);
    for (int r = 0; r < ROWS; r++) {
        kn_block_q8_0 want[N / 32];
        kn_quantize_row(KN_TYPE_Q8_0, x + r * N, want, N);
        for (int b = 0; b < N / 32; b++) {
            const int8_t *q = (const int8_t *)got + (size_t)r * N + b * 32;
            assert_memory_equal(q, want[b].qs, 32);
            float d;
            int32_t s, sum = 0;
            memcpy(&d, got + moff + ((size_t)r * (N / 32) + b) * 8, 4);
            memcpy(&s, got + moff + ((size_t)r * (N / 32) + b) * 8 + 4, 4);
            for (int j = 0; j < 32; j++)
                sum += want[b].qs[j];
            assert_true(d == kn_fp16_to_fp32(want[b].d));
            assert_int_equal(s, sum);
        }
    }
    free(got);
    kn_cuda_release(kc, dx);
    kn_cuda_release(kc, dq);
}

/* y (+)= W x on the device against the reference: the same integer dots on
 * Q8_0 activations for the quantized matvec, dequantized weights times x
 * in double otherwise. Tolerances scale with sum |w| |x|. */
static void check_matmul(kn_type type, int n_out, int n_in, int n_rows, bool add, bool pass_xq)
{
    const size_t rb = kn_row_bytes(type, n_in);
    uint8_t *w = malloc(rb * n_out);
    float *wf = malloc((size_t)n_out * n_in * sizeof(float));
    float *x = malloc((size_t)n_rows * n_in * sizeof(float));
    float *y0 = malloc((size_t)n_rows * n_out * sizeof(float));
    float *want = malloc((size_t)n_rows * n_out * sizeof(float));
    float *tol = malloc((size_t)n_rows * n_out * sizeof(float));
    float *got = malloc((size_t)n_rows * n_out * sizeof(float));
    fill(x, (size_t)n_rows * n_in, 1.0f);
    fill(y0, (size_t)n_rows * n_out, 4.0f);
    for (int o = 0; o < n_out; o++) {
        float *row = wf + (size_t)o * n_in;
        fill(row, n_in, 0.05f + 0.01f * (o % 7));
        kn_quantize_row(type, row, w + (size_t)o * rb, n_in);
        kn_dequantize_row(type, w + (size_t)o * rb, row, n_in); /* what the device sees */
    }
    const bool quant = type == KN_TYPE_Q8_0 || type == KN_TYPE_Q4_0;
    const bool mmv = n_rows <= KN_CUDA_MMV_MAX_ROWS;
    const bool f16_gemm = !mmv && type != KN_TYPE_F32;
    uint8_t *xq = NULL;
    const size_t xq_rb = quant ? kn_row_bytes(KN_TYPE_Q8_0, n_in) : 0;
    if (quant && mmv) {
        xq = malloc(xq_rb * n_rows);
        for (int r = 0; r < n_rows; r++)
            kn_quantize_row(KN_TYPE_Q8_0, x + (size_t)r * n_in, xq + r * xq_rb, n_in);
    }
    const kn_ops *ref = kn_ops_ref();
    float *col = malloc((size_t)n_rows * sizeof(float));
    for (int o = 0; o < n_out; o++) {
        const float *wr = wf + (size_t)o * n_in;
        if (xq) {
            if (type == KN_TYPE_Q8_0)
                ref->dot[KN_TYPE_Q8_0](w + (size_t)o * rb, xq, xq_rb, n_rows, n_in, col);
            else
                ref->dot[KN_TYPE_Q4_0](w + (size_t)o * rb, xq, xq_rb, n_rows, n_in, col);
        }
        for (int r = 0; r < n_rows; r++) {
            const float *xr = x + (size_t)r * n_in;
            double s = 0, mag = 0;
            for (int i = 0; i < n_in; i++) {
                s += (double)wr[i] * xr[i];
                mag += fabs((double)wr[i] * xr[i]);
            }
            const size_t k = (size_t)r * n_out + o;
            want[k] = (float)(xq ? col[r] : s) + (add ? y0[k] : 0.0f);
            /* F16 inputs: each product off by up to ~2^-10 relative. */
            tol[k] = (float)((f16_gemm ? 2e-3 : 1e-5) * mag + 1e-5 * (add ? fabsf(y0[k]) : 0.0f) + 1e-6);
        }
    }
    kn_cuda_weight dw;
    CK(kn_cuda_weight_upload(kc, w, type, n_out, n_in, &dw));
    void *dx = dev_copy(x, (size_t)n_rows * n_in * sizeof(float));
    void *dy = dev_copy(y0, (size_t)n_rows * n_out * sizeof(float));
    void *dxq = NULL;
    if (pass_xq && kn_cuda_matmul_wants_q8(type, n_rows)) {
        dxq = dev_zero(kn_cuda_q8_bytes(n_rows, n_in));
        CK(kn_cuda_quantize_q8(kc, dx, n_rows, n_in, dxq));
    }
    CK(kn_cuda_matmul(kc, &dw, dx, dxq, n_rows, dy, add));
    host_copy(got, dy, (size_t)n_rows * n_out * sizeof(float));
    char what[96];
    snprintf(what, sizeof(what), "matmul %s %dx%d, %d rows%s", kn_type_name(type), n_out, n_in, n_rows,
             add ? ", add" : "");
    assert_close(what, got, want, tol, (size_t)n_rows * n_out);
    kn_cuda_weight_release(kc, &dw);
    kn_cuda_release(kc, dx);
    kn_cuda_release(kc, dy);
    kn_cuda_release(kc, dxq);
    free(col);
    free(xq);
    free(w);
    free(wf);
    free(x);
    free(y0);
    free(want);
    free(tol);
    free(got);
}

static void test_matvec(void **state)
{
    seed(2);
    const kn_type types[] = {KN_TYPE_Q8_0, KN_TYPE_Q4_0, KN_TYPE_F16, KN_TYPE_F32};
    for (int t = 0; t < 4; t++) {
        for (int r = 1; r <= KN_CUDA_MMV_MAX_ROWS; r++)
            check_matmul(types[t], 37, 96, r, r % 2 == 0, r % 3 != 0);
        check_matmul(types[t], 1029, 4128, 1, false, true);
        check_matmul(types[t], 1029, 4128, 3, true, false);
        check_matmul(types[t], 515, 4128, 8, false, true);
        /* Rows of at least 256 loads per lane group take 8 loads per lane:
         * 8224 is 257 Q4_0 blocks, a partial last step. */
        check_matmul(types[t], 37, 8224, 1, true, false);
        check_matmul(types[t], 37, 8224, 2, false, true);
    }
    /* Rows that are not 16-byte multiples take the scalar float paths. */
    for (int r = 1; r <= KN_CUDA_MMV_MAX_ROWS; r += 3) {
        check_matmul(KN_TYPE_F16, 33, 99, r, false, false);
        check_matmul(KN_TYPE_F16, 33, 100, r, true, false);
        check_matmul(KN_TYPE_F32, 33, 99, r, false, false);
    }
}

static void test_gemm(void **state)
{
    seed(3);
    const kn_type types[] = {KN_TYPE_Q8_0, KN_TYPE_Q4_0, KN_TYPE_F16, KN_TYPE_F32};
    for (int t = 0; t < 4; t++) {
        check_matmul(types[t], 300, 4128, KN_CUDA_MMV_MAX_ROWS + 1, false, false);
        check_matmul(types[t], 301, 96, 77, true, false);
    }
    /* More rows than one dequantized tile holds (16M halves / 8192). */
    check_matmul(KN_TYPE_Q4_0, 2100, 8192, 9, true, false);
    check_matmul(KN_TYPE_Q8_0, 2100, 8192, 9, false, false);
}

/* The types kept as GGUF blocks (kn_cuda_raw_layout): against the
 * dequantized weights times the F32 activations, which is what the device
 * computes (the CPU's dots quantize the activations first). */
static const kn_type block_types[] = {KN_TYPE_Q4_1, KN_TYPE_Q5_0, KN_TYPE_Q5_1, KN_TYPE_IQ4_NL,
                                      KN_TYPE_Q2_K, KN_TYPE_Q3_K, KN_TYPE_Q4_K, KN_TYPE_Q5_K,
                                      KN_TYPE_Q6_K, KN_TYPE_IQ4_XS, KN_TYPE_BF16, KN_TYPE_MXFP4};
#define N_BLOCK_TYPES ((int)(sizeof(block_types) / sizeof(block_types[0])))

static void test_matvec_blocks(void **state)
{
    seed(12);
    for (int t = 0; t < N_BLOCK_TYPES; t++) {
        for (int r = 1; r <= KN_CUDA_MMV_MAX_ROWS; r++)
            check_matmul(block_types[t], 37, 512, r, r % 2 == 0, false);
        check_matmul(block_types[t], 1029, 4096, 1, false, false);
        check_matmul(block_types[t], 515, 4352, 3, true, false); /* 17 super-blocks: a partial step */
    }
}

static void test_gemm_blocks(void **state)
{
    seed(13);
    for (int t = 0; t < N_BLOCK_TYPES; t++) {
        check_matmul(block_types[t], 300, 4096, KN_CUDA_MMV_MAX_ROWS + 1, false, false);
        check_matmul(block_types[t], 301, 256, 77, true, false);
    }
    /* more rows than one dequantized tile holds */
    check_matmul(KN_TYPE_Q4_K, 2100, 8192, 9, true, false);
}

static void test_embed_blocks(void **state)
{
    enum { VOCAB = 29, DIM = 512 };
    seed(14);
    const int32_t toks[] = {0, 28, 11, 11, 3};
    float src[DIM], *got = malloc(sizeof(float) * 5 * DIM), *want = malloc(sizeof(float) * 5 * DIM);
    float *tol = calloc(5 * DIM, sizeof(float));
    int32_t *dt = dev_copy(toks, sizeof(toks));
    float *dx = dev_zero(sizeof(float) * 5 * DIM);
    for (int t = 0; t < N_BLOCK_TYPES; t++) {
        const size_t rb = kn_row_bytes(block_types[t], DIM);
        uint8_t *e = malloc(rb * VOCAB);
        for (int v = 0; v < VOCAB; v++) {
            fill(src, DIM, 1.0f);
            kn_quantize_row(block_types[t], src, e + v * rb, DIM);
        }
        for (int i = 0; i < 5; i++)
            kn_dequantize_row(block_types[t], e + toks[i] * rb, want + i * DIM, DIM);
        /* the same operations as the reference's, but a fused multiply-add
         * where nvcc contracts one (d * q + m): a last-bit difference of the
         * terms, which the row's largest value bounds */
        for (int i = 0; i < 5; i++) {
            float big = 0;
            for (int k = 0; k < DIM; k++)
                big = fmaxf(big, fabsf(want[i * DIM + k]));
            for (int k = 0; k < DIM; k++)
                tol[i * DIM + k] = 1e-6f * big + 1e-7f;
        }
        kn_cuda_weight w;
        CK(kn_cuda_weight_upload(kc, e, block_types[t], VOCAB, DIM, &w));
        CK(kn_cuda_embed(kc, &w, dt, 5, dx));
        host_copy(got, dx, sizeof(float) * 5 * DIM);
        assert_close(kn_type_name(block_types[t]), got, want, tol, 5 * DIM);
        kn_cuda_weight_release(kc, &w);
        free(e);
    }
    kn_cuda_release(kc, dt);
    kn_cuda_release(kc, dx);
    free(got);
    free(want);
    free(tol);
}

/* MXFP4's exponents across the whole E8M0 range (0 and 1 give subnormal
 * scales; 252 is the largest whose every level is a finite float, 253 to
 * 255 overflow the large levels to the same infinities as the reference),
 * decoded by the embedding lookup: bit for bit the reference's
 * kn_e8m0_half times each level. */
static void test_mxfp4_extremes(void **state)
{
    enum { DIM = 64 };
    static const uint8_t exps[] = {0, 1, 2, 3, 126, 127, 128, 129, 200, 251, 252, 253, 254, 255};
    enum { VOCAB = sizeof(exps) };
    seed(15);
    kn_block_mxfp4 rows[VOCAB][DIM / 32];
    for (int v = 0; v < VOCAB; v++)
        for (int b = 0; b < DIM / 32; b++) {
            rows[v][b].e = exps[v];
            for (int j = 0; j < 16; j++)
                rows[v][b].qs[j] = (uint8_t)((frand() + 1.0f) * 127.9f);
        }
    int32_t toks[VOCAB];
    for (int v = 0; v < VOCAB; v++)
        toks[v] = v;
    float *want = malloc(sizeof(float) * VOCAB * DIM), *got = malloc(sizeof(float) * VOCAB * DIM);
    float *tol = calloc(VOCAB * DIM, sizeof(float)); /* exact */
    for (int v = 0; v < VOCAB; v++)
        kn_dequantize_row(KN_TYPE_MXFP4, rows[v], want + v * DIM, DIM);
    int32_t *dt = dev_copy(toks, sizeof(toks));
    float *dx = dev_zero(sizeof(float) * VOCAB * DIM);
    kn_cuda_weight w;
    CK(kn_cuda_weight_upload(kc, rows, KN_TYPE_MXFP4, VOCAB, DIM, &w));
    CK(kn_cuda_embed(kc, &w, dt, VOCAB, dx));
    host_copy(got, dx, sizeof(float) * VOCAB * DIM);
    assert_close("MXFP4 exponents", got, want, tol, VOCAB * DIM);
    kn_cuda_weight_release(kc, &w);
    kn_cuda_release(kc, dt);
    kn_cuda_release(kc, dx);
    free(want);
    free(got);
    free(tol);
}

/* The FFN gates of the new families, the multiplier / soft-cap, and the
 * RoPE table from host-built frequencies, against the CPU's. */
static void test_arch_ops(void **state)
{
    enum { ROWS = 3, N = 320 };
    seed(16);
    kn_ctx *ref = kn_ctx_new(1, KN_BACKEND_REF);
    assert_non_null(ref);
    float g[ROWS * N], u[ROWS * N], want[ROWS * N], got[ROWS * N], tol[ROWS * N];
    const kn_cuda_act acts[] = {KN_CUDA_ACT_GELU, KN_CUDA_ACT_SWIGLU_OAI};
    for (int a = 0; a < 2; a++) {
        fill(g, ROWS * N, 9.0f); /* past the clamp of 7 */
        fill(u, ROWS * N, 9.0f);
        memcpy(want, g, sizeof(g));
        if (acts[a] == KN_CUDA_ACT_GELU)
            kn_gelu_mul(ref, want, u, ROWS, N);
        else
            kn_swiglu_oai(ref, want, u, ROWS, N, 1.702f, 7.0f);
        float *dg = dev_copy(g, sizeof(g)), *du = dev_copy(u, sizeof(u));
        CK(kn_cuda_glu_q8(kc, acts[a], dg, du, ROWS, N, NULL));
        host_copy(got, dg, sizeof(got));
        for (int i = 0; i < ROWS * N; i++)
            tol[i] = 4e-6f * fabsf(want[i]) + 1e-6f;
        assert_close(acts[a] == KN_CUDA_ACT_GELU ? "gelu" : "swiglu_oai", got, want, tol, ROWS * N);
        /* scale then soft-cap, as the logits */
        for (int i = 0; i < ROWS * N; i++) {
            const float z = g[i] * 0.25f;
            want[i] = 30.0f * tanhf(z / 30.0f);
            tol[i] = 4e-6f * fabsf(want[i]) + 1e-6f;
        }
        kn_cuda_upload(kc, dg, g, sizeof(g));
        CK(kn_cuda_scale_softcap(kc, dg, ROWS * N, 0.25f, 30.0f));
        host_copy(got, dg, sizeof(got));
        assert_close("scale_softcap", got, want, tol, ROWS * N);
        kn_cuda_release(kc, dg);
        kn_cuda_release(kc, du);
    }
    /* RoPE by a table of frequencies, the alternative one on odd rows */
    enum { T = 4, HEADS = 3, HD = 64, ROT = 32 };
    double inv[ROT / 2], inv_alt[ROT / 2];
    for (int i = 0; i < ROT / 2; i++) {
        inv[i] = pow(10000.0, -2.0 * i / ROT) / 3.0;
        inv_alt[i] = inv[i] / (1.0 + i);
    }
    const int32_t pos[T] = {0, 5, 1000, 77}, alt[T] = {0, 1, 0, 1};
    float x[T * HEADS * HD], xw[T * HEADS * HD], xt[T * HEADS * HD], tl[T * HEADS * HD];
    fill(x, T * HEADS * HD, 1.0f);
    memcpy(xw, x, sizeof(x));
    for (int t = 0; t < T; t++) {
        kn_rope_ref(xw + t * HEADS * HD, 1, pos + t, HEADS, HD, ROT, alt[t] ? inv_alt : inv, true);
        for (int h = 0; h < HEADS; h++)
            for (int i = 0; i < ROT; i++)
                xw[(t * HEADS + h) * HD + i] *= alt[t] ? 0.5f : 1.25f;
    }
    int32_t *dpos = dev_copy(pos, sizeof(pos)), *dalt = dev_copy(alt, sizeof(alt));
    double *dinv = dev_copy(inv, sizeof(inv)), *dinv_alt = dev_copy(inv_alt, sizeof(inv_alt));
    float *dcs = dev_zero(sizeof(float) * T * ROT), *dx = dev_copy(x, sizeof(x));
    CK(kn_cuda_rope_table_freqs(kc, dpos, dalt, T, ROT, dinv, 1.25f, dinv_alt, 0.5f, dcs));
    CK(kn_cuda_rope(kc, dx, dcs, T, HEADS, HD, ROT, true));
    host_copy(xt, dx, sizeof(xt));
    for (int i = 0; i < T * HEADS * HD; i++)
        tl[i] = 2e-6f; /* the magnitude rounds in the table, the CPU's after the turn */
    assert_close("rope_table_freqs", xt, xw, tl, T * HEADS * HD);
    void *dev[] = {dpos, dalt, dinv, dinv_alt, dcs, dx};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
        kn_cuda_release(kc, dev[i]);
    kn_ctx_free(ref);
}

/* A mixture-of-experts layer's kernels against a host reference built
 * from the same code (kn_moe_route.h) and the dequantized experts: the
 * choices exactly, the grouping's invariants, the weighted sum of SiLU
 * FFNs with biases. */
static void check_moe(kn_type type, int T, int ne, int k, bool topk)
{
    enum { D = 64, FF = 96 };
    const size_t rb_in = kn_row_bytes(type, D), rb_ff = kn_row_bytes(type, FF);
    float *x = malloc(sizeof(float) * T * D), *logits = malloc(sizeof(float) * T * ne);
    float *tmp = malloc(sizeof(float) * FF * D);
    uint8_t *wg = malloc(rb_in * FF * ne), *wu = malloc(rb_in * FF * ne), *wd = malloc(rb_ff * D * ne);
    float *gdq = malloc(sizeof(float) * ne * FF * D), *udq = malloc(sizeof(float) * ne * FF * D);
    float *ddq = malloc(sizeof(float) * ne * D * FF), *bg = malloc(sizeof(float) * ne * FF);
    float *bd = malloc(sizeof(float) * ne * D);
    fill(x, (size_t)T * D, 1.0f);
    fill(logits, (size_t)T * ne, 3.0f);
    fill(bg, (size_t)ne * FF, 0.5f);
    fill(bd, (size_t)ne * D, 0.5f);
    for (int r = 0; r < ne * FF; r++) {
        fill(tmp, D, 0.3f);
        kn_quantize_row(type, tmp, wg + r * rb_in, D);
        kn_dequantize_row(type, wg + r * rb_in, gdq + (size_t)r * D, D);
        fill(tmp, D, 0.3f);
        kn_quantize_row(type, tmp, wu + r * rb_in, D);
        kn_dequantize_row(type, wu + r * rb_in, udq + (size_t)r * D, D);
    }
    for (int r = 0; r < ne * D; r++) {
        fill(tmp, FF, 0.3f);
        kn_quantize_row(type, tmp, wd + r * rb_ff, FF);
        kn_dequantize_row(type, wd + r * rb_ff, ddq + (size_t)r * FF, FF);
    }
    int32_t *pick = malloc(sizeof(int32_t) * T * k), *got_pick = malloc(sizeof(int32_t) * T * k);
    float *w = malloc(sizeof(float) * T * k), *got_w = malloc(sizeof(float) * T * k);
    float *want = calloc((size_t)T * D, sizeof(float)), *got = malloc(sizeof(float) * T * D);
    float *tol = malloc(sizeof(float) * T * D);
    for (int t = 0; t < T; t++) {
        kn_moe_route(logits + t * ne, ne, k, topk, !topk, pick + t * k, w + t * k);
        for (int j = 0; j < k; j++) {
            const int e = pick[t * k + j];
            float h[FF];
            for (int f = 0; f < FF; f++) {
                double gs = bg[e * FF + f], us = 0;
                for (int i = 0; i < D; i++) {
                    gs += (double)gdq[((size_t)e * FF + f) * D + i] * x[t * D + i];
                    us += (double)udq[((size_t)e * FF + f) * D + i] * x[t * D + i];
                }
                h[f] = (float)(gs / (1.0 + exp(-gs)) * us);
            }
            for (int o = 0; o < D; o++) {
                double ys = bd[e * D + o];
                for (int f = 0; f < FF; f++)
                    ys += (double)ddq[((size_t)e * D + o) * FF + f] * h[f];
                want[t * D + o] += w[t * k + j] * (float)ys;
            }
        }
    }
    kn_cuda_weight g_w, u_w, d_w;
    CK(kn_cuda_weight_upload(kc, wg, type, ne * FF, D, &g_w));
    CK(kn_cuda_weight_upload(kc, wu, type, ne * FF, D, &u_w));
    CK(kn_cuda_weight_upload(kc, wd, type, ne * D, FF, &d_w));
    float *dx = dev_copy(x, sizeof(float) * T * D), *dl = dev_copy(logits, sizeof(float) * T * ne);
    float *dbg = dev_copy(bg, sizeof(float) * ne * FF), *dbd = dev_copy(bd, sizeof(float) * ne * D);
    float *dw = dev_zero(sizeof(float) * T * k), *dh = dev_zero(sizeof(float) * T * k * FF);
    float *dh2 = dev_zero(sizeof(float) * T * k * FF), *dye = dev_zero(sizeof(float) * T * k * D);
    float *dy = dev_zero(sizeof(float) * T * D);
    int32_t *dpick = dev_zero(sizeof(int32_t) * T * k), *doff = dev_zero(sizeof(int32_t) * (ne + 1));
    int32_t *drows = dev_zero(sizeof(int32_t) * T * k), *dinv = dev_zero(sizeof(int32_t) * T * k);
    CK(kn_cuda_moe_route(kc, dl, T, ne, k, topk, !topk, dpick, dw));
    CK(kn_cuda_moe_group(kc, dpick, T * k, ne, doff, drows, dinv));
    CK(kn_cuda_moe_matmul(kc, &g_w, ne, dx, k, drows, doff, dbg, dh));
    CK(kn_cuda_moe_matmul(kc, &u_w, ne, dx, k, drows, doff, NULL, dh2));
    CK(kn_cuda_glu_q8(kc, KN_CUDA_ACT_SILU, dh, dh2, T * k, FF, NULL));
    CK(kn_cuda_moe_matmul(kc, &d_w, ne, dh, 0, drows, doff, dbd, dye));
    CK(kn_cuda_moe_combine(kc, dy, dye, dw, dinv, T, k, D));
    host_copy(got_pick, dpick, sizeof(int32_t) * T * k);
    host_copy(got_w, dw, sizeof(float) * T * k);
    host_copy(got, dy, sizeof(float) * T * D);
    int32_t *off = malloc(sizeof(int32_t) * (ne + 1)), *rows = malloc(sizeof(int32_t) * T * k);
    int32_t *inv = malloc(sizeof(int32_t) * T * k);
    host_copy(off, doff, sizeof(int32_t) * (ne + 1));
    host_copy(rows, drows, sizeof(int32_t) * T * k);
    host_copy(inv, dinv, sizeof(int32_t) * T * k);
    char what[64];
    snprintf(what, sizeof(what), "moe %s, %d tokens, %d of %d experts", kn_type_name(type), T, k, ne);
    assert_memory_equal(got_pick, pick, sizeof(int32_t) * T * k);
    for (int i = 0; i < T * k; i++)
        if (fabsf(got_w[i] - w[i]) > 1e-6f)
            fail_msg("%s: weight %d is %g, want %g", what, i, got_w[i], w[i]);
    assert_int_equal(off[0], 0);
    assert_int_equal(off[ne], T * k);
    for (int e = 0; e < ne; e++)
        for (int g = off[e]; g < off[e + 1]; g++) {
            assert_int_equal(pick[rows[g]], e);
            assert_int_equal(inv[rows[g]], g);
            assert_true(g == off[e] || rows[g] > rows[g - 1]); /* pair order */
        }
    for (int i = 0; i < T * D; i++)
        tol[i] = 2e-5f * (1.0f + fabsf(want[i]));
    assert_close(what, got, want, tol, (size_t)T * D);
    kn_cuda_weight_release(kc, &g_w);
    kn_cuda_weight_release(kc, &u_w);
    kn_cuda_weight_release(kc, &d_w);
    void *dev[] = {dx, dl, dbg, dbd, dw, dh, dh2, dye, dy, dpick, doff, drows, dinv};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
        kn_cuda_release(kc, dev[i]);
    void *host[] = {x, logits, tmp, wg, wu, wd, gdq, udq, ddq, bg, bd, pick, got_pick, w, got_w, want, got, tol,
                    off, rows, inv};
    for (size_t i = 0; i < sizeof(host) / sizeof(host[0]); i++)
        free(host[i]);
}

static void test_moe(void **state)
{
    seed(17);
    check_moe(KN_TYPE_F16, 1, 8, 2, false);  /* decode */
    check_moe(KN_TYPE_Q8_0, 7, 8, 2, false); /* a few tokens: some experts share rows */
    check_moe(KN_TYPE_Q4_0, 37, 6, 3, false);
    check_moe(KN_TYPE_MXFP4, 5, 4, 2, true); /* gpt-oss: MXFP4, softmax over the chosen */
    check_moe(KN_TYPE_IQ4_NL, 3, 8, 2, false);
}

static void test_rows_ops(void **state)
{
    enum { ROWS = 3, N = 1001 };
    seed(4);
    const kn_ops *ref = kn_ops_ref();
    float x[ROWS * N], g[N], y[ROWS * N], want[ROWS * N], tol[ROWS * N], b[N];
    fill(x, ROWS * N, 2.0f);
    fill(g, N, 1.5f);
    fill(b, N, 1.0f);
    float *dx = dev_copy(x, sizeof(x)), *dg = dev_copy(g, sizeof(g)), *dy = dev_zero(sizeof(y));

    CK(kn_cuda_rmsnorm(kc, dy, dx, dg, ROWS, N, 1e-5f));
    host_copy(y, dy, sizeof(y));
    for (int r = 0; r < ROWS; r++)
        ref->rmsnorm(want + r * N, x + r * N, g, N, 1e-5f);
    for (int i = 0; i < ROWS * N; i++)
        tol[i] = 1e-5f * (fabsf(want[i]) + 1e-3f);
    assert_close("rmsnorm", y, want, tol, ROWS * N);
    CK(kn_cuda_rmsnorm(kc, dx, dx, dg, ROWS, N, 1e-5f)); /* in place */
    host_copy(y, dx, sizeof(y));
    assert_close("rmsnorm in place", y, want, tol, ROWS * N);

    CK(kn_cuda_upload(kc, dx, x, sizeof(x)));
    CK(kn_cuda_softmax(kc, dx, ROWS, N));
    host_copy(y, dx, sizeof(y));
    memcpy(want, x, sizeof(x));
    for (int r = 0; r < ROWS; r++)
        ref->softmax(want + r * N, N);
    for (int i = 0; i < ROWS * N; i++)
        tol[i] = 1e-5f * want[i] + 1e-9f;
    assert_close("softmax", y, want, tol, ROWS * N);

    float up[ROWS * N];
    fill(up, ROWS * N, 2.0f);
    float *dup = dev_copy(up, sizeof(up));
    CK(kn_cuda_upload(kc, dx, x, sizeof(x)));
    CK(kn_cuda_silu_mul(kc, dx, dup, ROWS, N));
    host_copy(y, dx, sizeof(y));
    memcpy(want, x, sizeof(x));
    ref->silu_mul(want, up, ROWS * N);
    for (int i = 0; i < ROWS * N; i++)
        tol[i] = 1e-6f * (fabsf(want[i]) + 1.0f);
    assert_close("silu_mul", y, want, tol, ROWS * N);

    CK(kn_cuda_upload(kc, dx, x, sizeof(x)));
    CK(kn_cuda_add(kc, dx, dup, ROWS * N));
    host_copy(y, dx, sizeof(y));
    for (int i = 0; i < ROWS * N; i++) {
        want[i] = x[i] + up[i];
        tol[i] = 0.0f;
    }
    assert_close("add", y, want, tol, ROWS * N);

    float *db = dev_copy(b, sizeof(b));
    CK(kn_cuda_upload(kc, dx, x, sizeof(x)));
    CK(kn_cuda_add_bias(kc, dx, db, ROWS, N));
    host_copy(y, dx, sizeof(y));
    for (int i = 0; i < ROWS * N; i++)
        want[i] = x[i] + b[i % N];
    assert_close("add_bias", y, want, tol, ROWS * N);

    const int32_t rows[] = {2, 0, 2};
    int32_t *drows = dev_copy(rows, sizeof(rows));
    CK(kn_cuda_upload(kc, dx, x, sizeof(x)));
    CK(kn_cuda_gather_rows(kc, dy, dx, drows, 3, N));
    host_copy(y, dy, sizeof(y));
    for (int r = 0; r < 3; r++)
        memcpy(want + r * N, x + rows[r] * N, N * sizeof(float));
    assert_close("gather_rows", y, want, tol, ROWS * N);

    kn_cuda_release(kc, dx);
    kn_cuda_release(kc, dg);
    kn_cuda_release(kc, dy);
    kn_cuda_release(kc, dup);
    kn_cuda_release(kc, db);
    kn_cuda_release(kc, drows);
}

/* The fused Q8_0 outputs of rmsnorm and silu_mul equal kn_cuda_quantize_q8
 * of their float results byte for byte; rmsnorm rows of every register
 * tier (up to 4, 8, 16, 32 elements a thread) and the loop beyond. */
static void check_q8_equal(const char *what, void *d_xq, const float *d_y, int rows, int n)
{
    const size_t bytes = kn_cuda_q8_bytes(rows, n);
    void *d_want = dev_zero(bytes);
    CK(kn_cuda_quantize_q8(kc, d_y, rows, n, d_want));
    uint8_t *got = malloc(bytes), *want = malloc(bytes);
    host_copy(got, d_xq, bytes);
    host_copy(want, d_want, bytes);
    if (memcmp(got, want, bytes) != 0)
        fail_msg("%s: fused Q8_0 output differs from kn_cuda_quantize_q8 (n %d)", what, n);
    free(got);
    free(want);
    kn_cuda_release(kc, d_want);
}

static void test_fused_q8(void **state)
{
    enum { ROWS = 3 };
    static const int ns[] = {96, 1024, 2048, 2080, 4096, 8192, 8224};
    const kn_ops *ref = kn_ops_ref();
    seed(11);
    for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++) {
        const int n = ns[k];
        const size_t nf = (size_t)ROWS * n;
        float *x = malloc(nf * sizeof(float)), *g = malloc(n * sizeof(float)), *y = malloc(nf * sizeof(float));
        float *want = malloc(nf * sizeof(float)), *tol = malloc(nf * sizeof(float));
        fill(x, nf, 2.0f);
        fill(g, n, 1.5f);
        float *dx = dev_copy(x, nf * sizeof(float)), *dg = dev_copy(g, n * sizeof(float));
        float *dy = dev_zero(nf * sizeof(float));
        void *dxq = dev_zero(kn_cuda_q8_bytes(ROWS, n));
        CK(kn_cuda_rmsnorm_q8(kc, dy, dx, dg, ROWS, n, 1e-5f, dxq));
        host_copy(y, dy, nf * sizeof(float));
        for (int r = 0; r < ROWS; r++)
            ref->rmsnorm(want + (size_t)r * n, x + (size_t)r * n, g, n, 1e-5f);
        for (size_t i = 0; i < nf; i++)
            tol[i] = 1e-5f * (fabsf(want[i]) + 1e-3f);
        assert_close("rmsnorm_q8", y, want, tol, nf);
        check_q8_equal("rmsnorm_q8", dxq, dy, ROWS, n);

        /* silu_mul_q8 on the same buffers: gate = x, up = the normalised rows */
        memcpy(want, x, nf * sizeof(float));
        ref->silu_mul(want, y, nf);
        CK(kn_cuda_silu_mul_q8(kc, dx, dy, ROWS, n, dxq));
        host_copy(x, dx, nf * sizeof(float));
        for (size_t i = 0; i < nf; i++)
            tol[i] = 1e-6f * (fabsf(want[i]) + 1.0f);
        assert_close("silu_mul_q8", x, want, tol, nf);
        check_q8_equal("silu_mul_q8", dxq, dx, ROWS, n);

        kn_cuda_release(kc, dx);
        kn_cuda_release(kc, dg);
        kn_cuda_release(kc, dy);
        kn_cuda_release(kc, dxq);
        free(x);
        free(g);
        free(y);
        free(want);
        free(tol);
    }
    /* A Q8_0 output needs whole 32-blocks. */
    assert_int_equal(kn_cuda_rmsnorm_q8(kc, NULL, NULL, NULL, 1, 100, 1e-5f, (void *)16), -EINVAL);
    assert_int_equal(kn_cuda_silu_mul_q8(kc, NULL, NULL, 1, 100, (void *)16), -EINVAL);
    kn_cuda_clear_error(kc);
}

static void test_embed(void **state)
{
    enum { VOCAB = 53, DIM = 160 };
    seed(5);
    const kn_type types[] = {KN_TYPE_F32, KN_TYPE_F16, KN_TYPE_Q8_0, KN_TYPE_Q4_0};
    const int32_t toks[] = {0, 52, 17, 17, 3};
    float src[DIM], got[5 * DIM], want[5 * DIM], tol[5 * DIM] = {0};
    int32_t *dt = dev_copy(toks, sizeof(toks));
    float *dx = dev_zero(sizeof(got));
    for (int t = 0; t < 4; t++) {
        const size_t rb = kn_row_bytes(types[t], DIM);
        uint8_t *e = malloc(rb * VOCAB);
        for (int v = 0; v < VOCAB; v++) {
            fill(src, DIM, 1.0f);
            kn_quantize_row(types[t], src, e + v * rb, DIM);
        }
        for (int i = 0; i < 5; i++)
            kn_dequantize_row(types[t], e + toks[i] * rb, want + i * DIM, DIM);
        kn_cuda_weight w;
        CK(kn_cuda_weight_upload(kc, e, types[t], VOCAB, DIM, &w));
        CK(kn_cuda_embed(kc, &w, dt, 5, dx));
        host_copy(got, dx, sizeof(got));
        assert_close(kn_type_name(types[t]), got, want, tol, 5 * DIM); /* exact */
        kn_cuda_weight_release(kc, &w);
        free(e);
    }
    kn_cuda_release(kc, dt);
    kn_cuda_release(kc, dx);
}

static void test_rope(void **state)
{
    enum { ROWS = 4, HEADS = 3, HD = 64 };
    seed(6);
    const int32_t pos[ROWS] = {0, 1, 4095, 100003};
    const int rope_dims[] = {64, 32, 2};
    float x[ROWS * HEADS * HD], want[ROWS * HEADS * HD], got[ROWS * HEADS * HD], tol[ROWS * HEADS * HD];
    int32_t *dpos = dev_copy(pos, sizeof(pos));
    float *dcs = dev_zero(ROWS * HD * sizeof(float));
    for (int neox = 0; neox < 2; neox++) {
        for (int k = 0; k < 3; k++) {
            fill(x, ROWS * HEADS * HD, 1.0f);
            memcpy(want, x, sizeof(x));
            double inv[HD / 2];
            kn_rope_inv_freq(inv, rope_dims[k], 10000.0f, 1.0f, NULL);
            kn_rope_ref(want, ROWS, pos, HEADS, HD, rope_dims[k], inv, neox);
            float *dx = dev_copy(x, sizeof(x));
            CK(kn_cuda_rope_table(kc, dpos, ROWS, rope_dims[k], 10000.0f, dcs));
            CK(kn_cuda_rope(kc, dx, dcs, ROWS, HEADS, HD, rope_dims[k], neox));
            host_copy(got, dx, sizeof(got));
            for (int i = 0; i < ROWS * HEADS * HD; i++)
                tol[i] = 2e-6f;
            assert_close(neox ? "rope neox" : "rope", got, want, tol, ROWS * HEADS * HD);
            kn_cuda_release(kc, dx);
        }
    }
    kn_cuda_release(kc, dpos);
    kn_cuda_release(kc, dcs);
}

/* kn_cuda_rope_kv_store against kn_cuda_rope on Q and K and then
 * kn_cuda_kv_store: the same bits in Q and in the cache, K untouched; GQA
 * heads, both pair layouts, full and partial rotation, scattered slots. */
static void test_rope_kv_store(void **state)
{
    enum { T = 5, NH = 6, NKV = 2, HD = 40, BT = 4, N_BLOCKS = 4 };
    const int q_dim = NH * HD, kv_dim = NKV * HD;
    const size_t block_elems = (size_t)2 * BT * kv_dim, pool_bytes = N_BLOCKS * block_elems * 2;
    const int32_t pos[T] = {0, 7, 8, 300, 4095}, slots[T] = {13, 2, 3, 8, 15};
    const int rope_dims[] = {HD, 16};
    seed(12);
    float q[T * NH * HD], k[T * NKV * HD], v[T * NKV * HD], got[T * NH * HD], want[T * NH * HD];
    int32_t *dpos = dev_copy(pos, sizeof(pos)), *dslots = dev_copy(slots, sizeof(slots));
    float *dcs = dev_zero(T * HD * sizeof(float));
    uint8_t *pool_got = malloc(pool_bytes), *pool_want = malloc(pool_bytes);
    for (int neox = 0; neox < 2; neox++) {
        for (int rd = 0; rd < 2; rd++) {
            fill(q, T * q_dim, 1.0f);
            fill(k, T * kv_dim, 1.0f);
            fill(v, T * kv_dim, 1.0f);
            CK(kn_cuda_rope_table(kc, dpos, T, rope_dims[rd], 10000.0f, dcs));
            float *dq1 = dev_copy(q, sizeof(q)), *dk1 = dev_copy(k, sizeof(k)), *dv = dev_copy(v, sizeof(v));
            float *dq2 = dev_copy(q, sizeof(q)), *dk2 = dev_copy(k, sizeof(k));
            uint16_t *pool1 = dev_zero(pool_bytes), *pool2 = dev_zero(pool_bytes);
            CK(kn_cuda_rope(kc, dq1, dcs, T, NH, HD, rope_dims[rd], neox));
            CK(kn_cuda_rope(kc, dk1, dcs, T, NKV, HD, rope_dims[rd], neox));
            CK(kn_cuda_kv_store(kc, dk1, dv, T, kv_dim, dslots, pool1, block_elems, 0, (size_t)BT * kv_dim, BT));
            const kn_cuda_rope_kv a = {.d_q = dq2,
                                       .d_k = dk2,
                                       .d_v = dv,
                                       .d_cs = dcs,
                                       .n_tokens = T,
                                       .n_head = NH,
                                       .n_kv_head = NKV,
                                       .head_dim = HD,
                                       .rope_dim = rope_dims[rd],
                                       .neox = neox,
                                       .d_slots = dslots,
                                       .d_pool = pool2,
                                       .block_elems = block_elems,
                                       .k_off = 0,
                                       .v_off = (size_t)BT * kv_dim,
                                       .block_tokens = BT};
            CK(kn_cuda_rope_kv_store(kc, &a));
            host_copy(want, dq1, sizeof(want));
            host_copy(got, dq2, sizeof(got));
            assert_memory_equal(got, want, sizeof(got));
            host_copy(pool_want, pool1, pool_bytes);
            host_copy(pool_got, pool2, pool_bytes);
            assert_memory_equal(pool_got, pool_want, pool_bytes);
            host_copy(got, dk2, sizeof(k));
            assert_memory_equal(got, k, sizeof(k));
            kn_cuda_release(kc, dq1);
            kn_cuda_release(kc, dk1);
            kn_cuda_release(kc, dv);
            kn_cuda_release(kc, dq2);
            kn_cuda_release(kc, dk2);
            kn_cuda_release(kc, pool1);
            kn_cuda_release(kc, pool2);
        }
    }
    kn_cuda_rope_kv bad = {.n_tokens = 1, .n_head = 1, .n_kv_head = 1, .head_dim = 8, .rope_dim = 10,
                           .block_tokens = 4};
    assert_int_equal(kn_cuda_rope_kv_store(kc, &bad), -EINVAL);
    kn_cuda_clear_error(kc);
    free(pool_got);
    free(pool_want);
    kn_cuda_release(kc, dpos);
    kn_cuda_release(kc, dslots);
    kn_cuda_release(kc, dcs);
}

static float f16_round(float v)
{
    return kn_fp16_to_fp32(kn_fp32_to_fp16(v));
}

/* New K/V rows stored into a paged F16 cache that already holds earlier
 * positions, then attention of every new token, against kn_attention on
 * the reference context over a host copy of the cache, in the host's
 * head-by-head block layout, with the same rows written (the values are
 * F16-exact, so `pool` holds the same numbers as floats). Block ids are
 * scrambled so block tables matter. */
static void check_attention_x(int head_dim, int n_head, int n_kv, int bt, const int *pos0, const int *n_q,
                              int n_seqs, int window, float softcap, const float *sinks)
{
    enum { N_LAYER = 2, LAYER = 1 };
    const int kv_dim = n_kv * head_dim, q_dim = n_head * head_dim;
    const size_t block_elems = (size_t)2 * N_LAYER * bt * kv_dim;
    const size_t k_off = (size_t)LAYER * 2 * bt * kv_dim, v_off = k_off + (size_t)bt * kv_dim;
    int T = 0, n_blocks = 0, table_off[16];
    for (int s = 0; s < n_seqs; s++) {
        table_off[s] = n_blocks;
        T += n_q[s];
        n_blocks += (pos0[s] + n_q[s] + bt - 1) / bt;
    }
    const int n_pool = n_blocks + 3;
    assert_true(n_pool % 7 != 0); /* so that i -> (7i + 3) mod n_pool is one to one */
    int32_t *tables = malloc((size_t)n_blocks * sizeof(int32_t));
    for (int i = 0; i < n_blocks; i++)
        tables[i] = (int32_t)((i * 7 + 3) % n_pool); /* 7 does not divide n_pool below */
    float *pool = malloc((size_t)n_pool * block_elems * sizeof(float));
    uint16_t *pool_h = malloc((size_t)n_pool * block_elems * sizeof(uint16_t));
    for (size_t i = 0; i < (size_t)n_pool * block_elems; i++) {
        pool[i] = f16_round(frand());
        pool_h[i] = kn_fp32_to_fp16(pool[i]);
    }
    float *q = malloc((size_t)T * q_dim * sizeof(float)), *k = malloc((size_t)T * kv_dim * sizeof(float));
    float *v = malloc((size_t)T * kv_dim * sizeof(float));
    float *want = malloc((size_t)T * q_dim * sizeof(float)), *got = malloc((size_t)T * q_dim * sizeof(float));
    float *tol = malloc((size_t)T * q_dim * sizeof(float));
    fill(q, (size_t)T * q_dim, 2.0f);
    for (size_t i = 0; i < (size_t)T * kv_dim; i++) {
        k[i] = f16_round(frand());
        v[i] = f16_round(frand());
    }
    int32_t *pos = malloc((size_t)T * sizeof(int32_t)), *tok_seq = malloc((size_t)T * sizeof(int32_t));
    int32_t *slots = malloc((size_t)T * sizeof(int32_t));
    kn_attn_seq seqs[16];
    /* Every [bt][kv_dim] K or V region of the device layout becomes
     * [n_kv][bt][head_dim] on the host. */
    uint16_t *ref_h = malloc((size_t)n_pool * block_elems * sizeof(uint16_t));
    for (size_t reg = 0; reg < (size_t)n_pool * 2 * N_LAYER; reg++)
        for (int p = 0; p < bt; p++)
            for (int i = 0; i < kv_dim; i++)
                ref_h[reg * bt * kv_dim + ((size_t)(i / head_dim) * bt + p) * head_dim + i % head_dim] =
                    pool_h[reg * bt * kv_dim + (size_t)p * kv_dim + i];
    uint16_t **blocks = malloc((size_t)n_blocks * sizeof(uint16_t *));
    for (int i = 0; i < n_blocks; i++)
        blocks[i] = ref_h + (size_t)tables[i] * block_elems;
    int t = 0;
    for (int s = 0; s < n_seqs; s++) {
        const int32_t *tab = tables + table_off[s];
        seqs[s] = (kn_attn_seq){.q = q + (size_t)t * q_dim,
                                .out = want + (size_t)t * q_dim,
                                .n_q = n_q[s],
                                .pos0 = pos0[s],
                                .blocks = blocks + table_off[s],
                                .k_off = k_off,
                                .v_off = v_off,
                                .block_tokens = bt,
                                .kv_type = KN_TYPE_F16};
        for (int j = 0; j < n_q[s]; j++, t++) {
            const int p = pos0[s] + j;
            pos[t] = p;
            tok_seq[t] = s;
            slots[t] = tab[p / bt] * bt + p % bt;
            float *row = pool + (size_t)tab[p / bt] * block_elems + (size_t)(p % bt) * kv_dim;
            memcpy(row + k_off, k + (size_t)t * kv_dim, kv_dim * sizeof(float));
            memcpy(row + v_off, v + (size_t)t * kv_dim, kv_dim * sizeof(float));
            uint16_t *blk_h = ref_h + (size_t)tab[p / bt] * block_elems;
            for (int i = 0; i < kv_dim; i++) {
                size_t at = ((size_t)(i / head_dim) * bt + p % bt) * head_dim + i % head_dim;
                blk_h[k_off + at] = kn_fp32_to_fp16(k[(size_t)t * kv_dim + i]);
                blk_h[v_off + at] = kn_fp32_to_fp16(v[(size_t)t * kv_dim + i]);
            }
        }
    }
    const float scale = 1.0f / sqrtf((float)head_dim);
    kn_ctx *ref = kn_ctx_new(1, KN_BACKEND_REF);
    assert_non_null(ref);
    const kn_attn_params ap = {.n_head = n_head,
                               .n_kv_head = n_kv,
                               .head_dim = head_dim,
                               .scale = scale,
                               .softcap = softcap,
                               .sinks = sinks,
                               .window = window};
    assert_int_equal(kn_attention_ex(ref, seqs, n_seqs, &ap), 0);
    kn_ctx_free(ref);

    uint16_t *dpool = dev_copy(pool_h, (size_t)n_pool * block_elems * sizeof(uint16_t));
    float *dq = dev_copy(q, (size_t)T * q_dim * sizeof(float)),
          *dout = dev_zero((size_t)T * q_dim * sizeof(float));
    float *dk = dev_copy(k, (size_t)T * kv_dim * sizeof(float)),
          *dv = dev_copy(v, (size_t)T * kv_dim * sizeof(float));
    int32_t *dpos = dev_copy(pos, (size_t)T * sizeof(int32_t)),
            *dseq = dev_copy(tok_seq, (size_t)T * sizeof(int32_t));
    int32_t *dslots = dev_copy(slots, (size_t)T * sizeof(int32_t));
    int32_t *doff = dev_copy(table_off, (size_t)n_seqs * sizeof(int32_t));
    int32_t *dtab = dev_copy(tables, (size_t)n_blocks * sizeof(int32_t));
    float *dsinks = sinks ? dev_copy(sinks, (size_t)n_head * sizeof(float)) : NULL;
    CK(kn_cuda_kv_store(kc, dk, dv, T, kv_dim, dslots, dpool, block_elems, k_off, v_off, bt));
    const kn_cuda_attn a = {.d_q = dq,
                            .d_out = dout,
                            .n_tokens = T,
                            .d_pos = dpos,
                            .d_tok_seq = dseq,
                            .d_table_off = doff,
                            .d_tables = dtab,
                            .d_pool = dpool,
                            .block_elems = block_elems,
                            .k_off = k_off,
                            .v_off = v_off,
                            .block_tokens = bt,
                            .n_head = n_head,
                            .n_kv_head = n_kv,
                            .head_dim = head_dim,
                            .scale = scale,
                            .window = window,
                            .softcap = softcap,
                            .d_sinks = dsinks};
    CK(kn_cuda_attention(kc, &a));
    host_copy(got, dout, (size_t)T * q_dim * sizeof(float));
    for (size_t i = 0; i < (size_t)T * q_dim; i++)
        tol[i] = 2e-5f; /* outputs are convex combinations of |v| <= 1 */
    char what[96];
    snprintf(what, sizeof(what), "attention hd %d, %d/%d heads, %d tokens, window %d, cap %g%s", head_dim, n_head,
             n_kv, T, window, softcap, sinks ? ", sinks" : "");
    assert_close(what, got, want, tol, (size_t)T * q_dim);

    /* The stored rows: exactly the F16 values given. */
    uint16_t *back = malloc((size_t)n_pool * block_elems * sizeof(uint16_t));
    host_copy(back, dpool, (size_t)n_pool * block_elems * sizeof(uint16_t));
    for (size_t i = 0; i < (size_t)n_pool * block_elems; i++)
        if (kn_fp16_to_fp32(back[i]) != pool[i])
            fail_msg("%s: cache element %zu is %g, want %g", what, i, kn_fp16_to_fp32(back[i]), pool[i]);
    free(back);

    void *dev[] = {dpool, dq, dout, dk, dv, dpos, dseq, dslots, doff, dtab, dsinks};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
        kn_cuda_release(kc, dev[i]);
    free(blocks);
    free(tables);
    free(pool);
    free(pool_h);
    free(ref_h);
    free(q);
    free(k);
    free(v);
    free(want);
    free(got);
    free(tol);
    free(pos);
    free(tok_seq);
    free(slots);
}

static void check_attention(int head_dim, int n_head, int n_kv, int bt, const int *pos0, const int *n_q,
                            int n_seqs)
{
    check_attention_x(head_dim, n_head, n_kv, bt, pos0, n_q, n_seqs, 0, 0.0f, NULL);
}

/* Sliding windows, soft-capped scores and sinks (Gemma 2, gpt-oss), in
 * the kernel's one-pass and split (flash-decoding) forms. */
static void test_attention_swa_softcap_sinks(void **state)
{
    seed(18);
    float sinks[32];
    fill(sinks, 32, 2.0f);
    const int pos0[] = {0, 13, 40}, n_q[] = {7, 1, 3};
    check_attention_x(64, 6, 2, 5, pos0, n_q, 3, 9, 0.0f, NULL);
    check_attention_x(64, 6, 2, 5, pos0, n_q, 3, 0, 0.7f, NULL);
    check_attention_x(128, 6, 2, 5, pos0, n_q, 3, 4, 0.0f, sinks);
    const int d0[] = {777}, d1[] = {1};
    check_attention_x(64, 8, 8, 16, d0, d1, 1, 100, 0.7f, sinks); /* split */
    check_attention_x(64, 32, 4, 16, d0, d1, 1, 0, 0.0f, sinks);
    const int p0[] = {0, 5}, p1[] = {300, 60};
    check_attention_x(64, 6, 3, 16, p0, p1, 2, 33, 0.0f, sinks); /* not split */
}

static void test_attention(void **state)
{
    seed(8);
    /* Prefill from 0, a single decode token, a chunk in the middle. */
    const int pos0[] = {0, 13, 40}, n_q[] = {7, 1, 3};
    const int hds[] = {64, 72, 128, 256, 2};
    for (int i = 0; i < 5; i++)
        check_attention(hds[i], 6, 2, 5, pos0, n_q, 3);
    /* One token alone: its keys split over many blocks. */
    const int d0[] = {777}, d1[] = {1};
    check_attention(128, 8, 8, 16, d0, d1, 1);
    check_attention(64, 32, 4, 16, d0, d1, 1);
    /* Enough tokens that nothing is split. */
    const int p0[] = {0, 5}, p1[] = {300, 60};
    check_attention(64, 6, 3, 16, p0, p1, 2);
}

/* ---- the model on the GPU ---- */

static rt_model *load(const char *path, const char *device, bool reference)
{
    return mc_load(path, device, reference, 2);
}

static float *prompt_logits(rt_model *m, int chunk)
{
    const rt_hparams *hp = rt_model_hparams(m);
    char err[512];
    rt_kv *kv =
        rt_kv_new(m, 128 * rt_model_kv_bytes_per_token(m, KN_TYPE_F16), 16, KN_TYPE_F16, err, sizeof(err));
    if (!kv)
        fail_msg("rt_kv_new: %s", err);
    rt_seq *s = rt_seq_new(kv, 128);
    float *logits = malloc((size_t)hp->n_vocab * sizeof(float));
    for (int i = 0; i < N_PROMPT; i += chunk) {
        int n = N_PROMPT - i < chunk ? N_PROMPT - i : chunk;
        rt_batch_entry e = {.seq = s, .tokens = prompt + i, .n_tokens = n, .logits = logits};
        assert_int_equal(rt_model_forward(m, &e, 1), 0);
    }
    rt_seq_free(s);
    assert_int_equal(rt_kv_blocks_free(kv), rt_kv_blocks_total(kv));
    rt_kv_free(kv);
    return logits;
}

/* |a| / |b|: the overall scale a cosine ignores (a skipped logit multiplier
 * or soft-cap). */
static double norm_ratio(const float *a, const float *b, int n)
{
    double aa = 0, bb = 0;
    for (int i = 0; i < n; i++) {
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    return sqrt(aa / bb);
}

/* The logits of a prompt on the GPU (cuda_path) against the CPU's
 * (cpu_path), whole (GEMM path), one token at a time (matvec path) and in
 * chunks of 5: a cosine of at least min_cos each. */
static void check_gpu_vs_cpu(const char *cpu_path, const char *cuda_path, const char *what, double min_cos)
{
    rt_model *cpu = load(cpu_path, "cpu", true);
    rt_model *gpu = load(cuda_path, "cuda", false);
    assert_string_equal(rt_model_backend_name(gpu), "cuda");
    const int n = rt_model_hparams(cpu)->n_vocab;
    float *base = prompt_logits(cpu, N_PROMPT);
    const int chunks[] = {N_PROMPT, 1, 5};
    for (int k = 0; k < 3; k++) {
        float *l = prompt_logits(gpu, chunks[k]);
        double c = mc_cosine(base, l, n);
        printf("# %s on the GPU, chunks of %d: cosine to the CPU reference %.7f\n", what, chunks[k], c);
        assert_true(c >= min_cos);
        free(l);
    }
    free(base);
    rt_model_free(gpu);
    rt_model_free(cpu);
}

static void test_model_f16_vs_f32(void **state)
{
    check_gpu_vs_cpu(path_f32, path_f16, "f16 (against f32)", 0.9999);
}

/* A Q4_K_M file (llama.cpp's mixture: Q4_K, Q6_K) on the GPU against the
 * CPU's reference kernels, which quantize the activations (Q8_K) where the
 * GPU takes them as floats: close, not equal. */
static void test_model_q4_k_m(void **state)
{
    char f32[128], q4km[128], err[512];
    snprintf(f32, sizeof(f32), "%s/kq-f32.gguf", dir);
    snprintf(q4km, sizeof(q4km), "%s/kq-q4km.gguf", dir);
    /* rows of whole 256-element super-blocks: no fallback types */
    assert_int_equal(gen_shape(f32, KN_TYPE_F32, 256, 512), 0);
    rt_quant_opts qo = {.ftype = RT_FTYPE_Q4_K_M};
    assert_int_equal(rt_quantize_file(f32, q4km, &qo, NULL, err, sizeof(err)), 0);
    check_gpu_vs_cpu(q4km, q4km, "Q4_K_M", 0.999);
    unlink(f32);
    unlink(q4km);
}

static void test_model_q8_greedy(void **state)
{
    enum { STEPS = 32 };
    rt_model *cpu = load(path_q8, "cpu", false);
    rt_model *gpu = load(path_q8, "cuda", false);
    const int n = rt_model_hparams(cpu)->n_vocab;
    int32_t a[STEPS], b[STEPS];
    float *la = malloc((size_t)STEPS * n * sizeof(float)), *lb = malloc((size_t)STEPS * n * sizeof(float));
    mc_greedy(cpu, prompt, N_PROMPT, a, STEPS, la);
    mc_greedy(gpu, prompt, N_PROMPT, b, STEPS, lb);
    double worst = 1.0;
    for (int i = 0; i < STEPS; i++) {
        double c = mc_cosine(la + (size_t)i * n, lb + (size_t)i * n, n);
        worst = c < worst ? c : worst;
    }
    printf("# q8_0 GPU vs CPU: worst cosine of logits over %d greedy steps %.7f\n", STEPS, worst);
    assert_memory_equal(a, b, sizeof(a));
    free(la);
    free(lb);
    rt_model_free(gpu);
    rt_model_free(cpu);

    /* Q4_0 too: the same weights on both sides, only activations differ. */
    cpu = load(path_q4, "cpu", false);
    gpu = load(path_q4, "cuda", false);
    float *l1 = prompt_logits(cpu, N_PROMPT), *l2 = prompt_logits(gpu, N_PROMPT);
    double c = mc_cosine(l1, l2, n);
    printf("# q4_0 GPU vs CPU: cosine %.7f\n", c);
    assert_true(c >= 0.999);
    free(l1);
    free(l2);
    rt_model_free(gpu);
    rt_model_free(cpu);
}

/* Eight sequences of different lengths as one batch per step give the same
 * greedy tokens as each alone; with graphs off, bit-identical logits. */
static void test_model_batch_and_graphs(void **state)
{
    (void)state;
    rt_model *m = load(path_q8, "cuda", false);
    const int V = rt_model_hparams(m)->n_vocab;
    mc_batch_matches_alone(m, prompt, N_PROMPT, 8, 12, "cuda q8_0");

    /* Graph replays (the default for short steps) against plain launches. */
    enum { STEPS = 8 };
    int32_t a[STEPS], b[STEPS];
    float *la = malloc((size_t)STEPS * V * sizeof(float)), *lb = malloc((size_t)STEPS * V * sizeof(float));
    mc_greedy(m, prompt, N_PROMPT, a, STEPS, la);
    rt_model_free(m);
    setenv("INFERGATE_CUDA_GRAPHS", "0", 1);
    m = load(path_q8, "cuda", false);
    unsetenv("INFERGATE_CUDA_GRAPHS");
    mc_greedy(m, prompt, N_PROMPT, b, STEPS, lb);
    assert_memory_equal(a, b, sizeof(a));
    assert_memory_equal(la, lb, (size_t)STEPS * V * sizeof(float));
    free(la);
    free(lb);
    rt_model_free(m);
}

/* Every family of `model gen --arch` on the GPU against the CPU, teacher
 * forced so both see the same tokens: a prompt past the sliding window
 * (8 positions, blocks of 4, so sliding groups let blocks go), then decode
 * steps; the logits of every step at a cosine of at least 0.9999 with an
 * F16 cache and F16 weights, 0.999 quantized (the CPU quantizes the
 * activations of its dots, the GPU's expert products take floats), and
 * their norms within sqrt(2 (1 - that cosine)) of each other (the relative
 * error such a cosine allows; a cosine alone misses a skipped scale, as
 * Granite's logit_scale). gemma2's soft-caps are 2 and 5, small enough to
 * act; gemma3 has 7 layers, so its pattern of 6 gives a global layer (no
 * window, linear RoPE scaling) beside local ones. phi3's context of 64
 * (original 16) turns it by its long factors; gpt-oss in Q8_0 has MXFP4
 * experts. */
static void check_arch_gpu_vs_cpu(const char *arch, uint32_t type, int ctx)
{
    const double min_cos = type == KN_TYPE_F16 ? 0.9999 : 0.999, max_scale = sqrt(2 * (1 - min_cos));
    enum { N_IN = 20, STEPS = 10 };
    char path[128], err[512];
    snprintf(path, sizeof(path), "%s/arch-%s.gguf", dir, arch);
    rt_gen_params p;
    rt_gen_params_default(&p);
    p.arch = arch;
    p.dim = 128;
    p.layers = !strcmp(arch, "gemma3") ? 7 : 4;
    p.heads = 4;
    p.kv_heads = 2;
    p.ffn = 256;
    p.vocab = 512;
    p.ctx = ctx;
    p.type = type;
    p.swa = 8;
    p.attn_softcap = 2;
    p.final_softcap = 5;
    /* the MoE families with 4 experts, 2 used (experts on another makes it MoE) */
    const bool moe = strstr(arch, "moe") || !strcmp(arch, "mixtral") || !strcmp(arch, "gpt-oss");
    p.experts = moe ? 4 : 0;
    p.experts_used = moe ? 2 : 0;
    if (rt_model_gen(&p, path, err, sizeof(err)))
        fail_msg("gen %s: %s", arch, err);
    rt_model *ms[2] = {load(path, "cpu", false), load(path, "cuda", false)};
    const int V = rt_model_hparams(ms[0])->n_vocab;
    rt_kv *kv[2];
    rt_seq *seq[2];
    float *logits[2];
    for (int d = 0; d < 2; d++) {
        kv[d] = rt_kv_new(ms[d], 64 * rt_model_kv_bytes_per_token(ms[d], KN_TYPE_F16), 4, KN_TYPE_F16, err,
                          sizeof(err));
        if (!kv[d])
            fail_msg("rt_kv_new: %s", err);
        seq[d] = rt_seq_new(kv[d], N_IN + STEPS);
        logits[d] = malloc((size_t)V * sizeof(float));
    }
    int32_t in[N_IN];
    for (int i = 0; i < N_IN; i++)
        in[i] = (prompt[i % N_PROMPT] + i) % 512;
    double worst = 1.0, worst_r = 1.0;
    int32_t tok = 0;
    for (int step = 0; step <= STEPS; step++) {
        for (int d = 0; d < 2; d++) {
            rt_batch_entry e = {.seq = seq[d],
                                .tokens = step ? &tok : in,
                                .n_tokens = step ? 1 : N_IN,
                                .logits = logits[d]};
            assert_int_equal(rt_model_forward(ms[d], &e, 1), 0);
        }
        const double c = mc_cosine(logits[0], logits[1], V), r = norm_ratio(logits[1], logits[0], V);
        worst = c < worst ? c : worst;
        worst_r = fabs(r - 1) > fabs(worst_r - 1) ? r : worst_r;
        if (!(c >= min_cos) || !(fabs(r - 1) <= max_scale))
            fail_msg("%s (%s): step %d, cosine %.7f, norm GPU / CPU %.7f", arch, kn_type_name(type), step, c,
                     r);
        tok = mc_argmax(logits[0], V);
    }
    printf("# %s (%s) GPU vs CPU: worst cosine over a %d-token prompt and %d steps %.7f, worst norm "
           "GPU / CPU %.7f\n", arch, kn_type_name(type), N_IN, STEPS, worst, worst_r);
    for (int d = 0; d < 2; d++) {
        rt_seq_free(seq[d]);
        rt_kv_free(kv[d]);
        free(logits[d]);
        rt_model_free(ms[d]);
    }
    unlink(path);
}

static void test_model_archs(void **state)
{
    static const char *archs[] = {"qwen2", "qwen3", "qwen3moe", "mixtral", "gemma2", "gemma3", "gpt-oss",
                                  "granite", "granitemoe", "olmo2", "smollm3", "mistral3"};
    for (size_t i = 0; i < sizeof(archs) / sizeof(archs[0]); i++)
        check_arch_gpu_vs_cpu(archs[i], KN_TYPE_F16, 256);
    check_arch_gpu_vs_cpu("phi3", KN_TYPE_F16, 256); /* short factors */
    check_arch_gpu_vs_cpu("phi3", KN_TYPE_F16, 64);  /* long ones */
    check_arch_gpu_vs_cpu("gpt-oss", KN_TYPE_Q8_0, 256);
    check_arch_gpu_vs_cpu("qwen3moe", KN_TYPE_Q8_0, 256);
}

static void test_device_info_and_limits(void **state)
{
    rt_model *m = load(path_q8, "cuda", false);
    rt_device_info di;
    rt_model_device_info(m, &di);
    printf("# %s %s %s: %.0f MiB, %.0f MiB free, weights %.2f MiB\n", di.name, di.uuid, di.mig_profile,
           (double)di.mem_total / 1048576.0, (double)di.mem_free / 1048576.0,
           (double)di.mem_weights / 1048576.0);
    assert_string_equal(di.kind, "cuda");
    assert_true(di.name[0] != '\0');
    assert_true(!strncmp(di.uuid, "GPU-", 4) || !strncmp(di.uuid, "MIG-", 4));
    assert_true(di.mem_total > 0 && di.mem_free <= di.mem_total && di.mem_weights > 0);
    /* F16 on the device. */
    assert_int_equal(rt_model_kv_bytes_per_token(m, KN_TYPE_F16), (size_t)2 * 3 * 2 * 32 * 2);
    char err[512];
    rt_kv *kv = rt_kv_new(m, (size_t)(di.mem_total + di.mem_total / 2), 16, KN_TYPE_F16, err, sizeof(err));
    assert_null(kv);
    printf("# %s\n", err);
    assert_non_null(strstr(err, "does not fit"));
    assert_non_null(strstr(err, "MiB"));
    rt_model_free(m);
}
#endif

int main(void)
{
    if (make_models()) {
        fprintf(stderr, "cannot generate the test models\n");
        return 1;
    }
    const struct CMUnitTest host[] = {
        cmocka_unit_test(test_no_device_refused),
#ifdef INFERGATE_HAVE_CUDA
        cmocka_unit_test(test_layouts),
#endif
    };
    int failed = cmocka_run_group_tests_name("host checks", host, NULL, NULL);
    char why[256];
    if (failed == 0 && !have_device(why, sizeof(why))) {
        printf("# host checks passed; no CUDA device (%s): GPU checks skipped\n", why);
        remove_models();
        return 77;
    }
#ifdef INFERGATE_HAVE_CUDA
    if (failed == 0) {
        const struct CMUnitTest gpu[] = {
            cmocka_unit_test(test_quantize_q8),
            cmocka_unit_test(test_matvec),
            cmocka_unit_test(test_gemm),
            cmocka_unit_test(test_rows_ops),
            cmocka_unit_test(test_fused_q8),
            cmocka_unit_test(test_embed),
            cmocka_unit_test(test_matvec_blocks),
            cmocka_unit_test(test_gemm_blocks),
            cmocka_unit_test(test_embed_blocks),
            cmocka_unit_test(test_mxfp4_extremes),
            cmocka_unit_test(test_arch_ops),
            cmocka_unit_test(test_moe),
            cmocka_unit_test(test_rope),
            cmocka_unit_test(test_rope_kv_store),
            cmocka_unit_test(test_attention),
            cmocka_unit_test(test_attention_swa_softcap_sinks),
            cmocka_unit_test(test_model_f16_vs_f32),
            cmocka_unit_test(test_model_q8_greedy),
            cmocka_unit_test(test_model_q4_k_m),
            cmocka_unit_test(test_model_batch_and_graphs),
            cmocka_unit_test(test_model_archs),
            cmocka_unit_test(test_device_info_and_limits),
        };
        failed = cmocka_run_group_tests_name("GPU checks", gpu, gpu_setup, gpu_teardown);
    }
#endif
    remove_models();
    return failed ? 1 : 0;
}
