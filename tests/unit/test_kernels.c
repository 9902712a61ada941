/* Unit tests of kernels/: half conversion edge cases, the reference
 * quantizers against hand-made blocks (GGUF layout, nibble order), round-trip
 * error bounds, every op of each SIMD table against the scalar reference on
 * odd sizes, and the context's batched operations (matmul over the thread
 * pool, RoPE, paged GQA attention, parallel_for) against the reference or a
 * naive implementation written here. SIMD comparisons skip on CPUs without
 * the instructions. Fixed seeds; tolerances are relative to the magnitude of
 * the sums involved, never to timing. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "kernels/kn.h"
#include "kernels/quant_blocks.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- helpers -------------------------------------------------------------- */

static uint64_t rng = 0x243f6a8885a308d3ull;

static void seed(uint64_t s)
{
    rng = s * 0x9e3779b97f4a7c15ull + 1;
}

static uint32_t rnd32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

/* uniform in [-1, 1) */
static float frand(void)
{
    return (float)rnd32() * (2.0f / 4294967296.0f) - 1.0f;
}

static void fill(float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = frand() * scale;
}

static float f32_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

/* The SIMD tables this CPU runs (none on a CPU without AVX2). */
static int fast_tables(const kn_ops **out)
{
    int n = 0;
    if (kn_ops_avx2() != NULL)
        out[n++] = kn_ops_avx2();
    if (kn_ops_avxvnni() != NULL)
        out[n++] = kn_ops_avxvnni();
    if (kn_ops_avx512vnni() != NULL)
        out[n++] = kn_ops_avx512vnni();
    if (kn_ops_amx() != NULL)
        out[n++] = kn_ops_amx();
    return n;
}

/* fast_tables, skipping the test where there are none to compare. */
static int fast_tables_or_skip(const kn_ops **out)
{
    int n = fast_tables(out);
    if (n == 0)
        skip();
    return n;
}

static void check_close(float got, double want, double tol, const char *what, const char *table, int n, int r)
{
    if (!(fabs((double)got - want) <= tol)) {
        print_error("%s [%s] n=%d row=%d: got %.9g want %.9g (tol %.3g)\n", what, table, n, r, (double)got,
                    want, tol);
        fail();
    }
}

/* ---- half precision ------------------------------------------------------- */

/* Independent oracle: the nearest half by search over the monotonic
 * positive halves, ties to the even code. */
static uint16_t half_oracle(float f)
{
    uint16_t sign = (bits_of(f) >> 16) & 0x8000;
    double a = fabs((double)f);
    if (isnan(f))
        return 0x7e00;
    if (a >= 65520.0)
        return sign | 0x7c00;
    int lo = 0, hi = 0x7bff;
    while (lo < hi) { /* largest code with value <= a */
        int mid = (lo + hi + 1) / 2;
        if ((double)kn_fp16_to_fp32((uint16_t)mid) <= a)
            lo = mid;
        else
            hi = mid - 1;
    }
    double vlo = kn_fp16_to_fp32((uint16_t)lo);
    if (vlo == a || lo == 0x7bff)
        return sign | (uint16_t)lo;
    double vhi = kn_fp16_to_fp32((uint16_t)(lo + 1));
    int pick = (a - vlo < vhi - a) ? lo : (a - vlo > vhi - a) ? lo + 1 : ((lo & 1) ? lo + 1 : lo);
    return sign | (uint16_t)pick;
}

static void test_fp16_known(void **state)
{
    (void)state;
    struct {
        float f;
        uint16_t h;
    } cases[] = {
        {0.0f, 0x0000},
        {-0.0f, 0x8000},
        {1.0f, 0x3c00},
        {-2.0f, 0xc000},
        {0.5f, 0x3800},
        {65504.0f, 0x7bff}, /* largest half */
        {65519.0f, 0x7bff}, /* below the halfway point */
        {65520.0f, 0x7c00}, /* halfway to 65536: even rounds up to inf */
        {1e10f, 0x7c00},
        {-1e10f, 0xfc00},
        {INFINITY, 0x7c00},
        {-INFINITY, 0xfc00},
        {0x1p-14f, 0x0400}, /* smallest normal */
        {0x1p-24f, 0x0001}, /* smallest subnormal */
        {0x1p-25f, 0x0000}, /* half of it: tie to even zero */
        {0x1.000002p-25f, 0x0001},
        {0x3p-25f, 0x0002},   /* 1.5 units: tie to even 2 */
        {0x5p-25f, 0x0002},   /* 2.5 units: tie to even 2 */
        {0x3ffp-24f, 0x03ff}, /* largest subnormal */
        {0x1p-30f, 0x0000},
        {0x1.002p0f, 0x3c00}, /* 1 + 2^-11: tie to even 1 */
        {0x1.006p0f, 0x3c02}, /* 1 + 3 * 2^-11: tie to even 1 + 2^-9 */
        {0x1.0021p0f, 0x3c01},
        {0x1.ffdp15f, 0x7bff},  /* 65512: nearer 65504 */
        {0x1.ffcp-15f, 0x0400}, /* rounds up into the smallest normal */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint16_t h = kn_fp32_to_fp16(cases[i].f);
        if (h != cases[i].h) {
            print_error("fp32_to_fp16(%a) = 0x%04x, want 0x%04x\n", (double)cases[i].f, h, cases[i].h);
            fail();
        }
    }
    /* NaN stays NaN both ways, quiet, sign kept */
    uint16_t hn = kn_fp32_to_fp16(NAN);
    assert_true((hn & 0x7c00) == 0x7c00 && (hn & 0x03ff) != 0);
    hn = kn_fp32_to_fp16(f32_of(0xff800001u)); /* signalling, payload in the low bits only */
    assert_true((hn & 0xfc00) == 0xfc00 && (hn & 0x03ff) != 0);
    assert_true(isnan(kn_fp16_to_fp32(0x7e00)));
    assert_true(isnan(kn_fp16_to_fp32(0xfc01)));
    assert_true(isinf(kn_fp16_to_fp32(0x7c00)) && kn_fp16_to_fp32(0x7c00) > 0);
    assert_true(isinf(kn_fp16_to_fp32(0xfc00)) && kn_fp16_to_fp32(0xfc00) < 0);
    assert_true(kn_fp16_to_fp32(0x0001) == 0x1p-24f);
    assert_true(kn_fp16_to_fp32(0x03ff) == 0x3ffp-24f);
    assert_true(kn_fp16_to_fp32(0x8001) == -0x1p-24f);
    assert_true(bits_of(kn_fp16_to_fp32(0x8000)) == 0x80000000u);
    assert_true(kn_fp16_to_fp32(0x7bff) == 65504.0f);
    assert_true(kn_fp16_to_fp32(0x3555) == 0x1.554p-2f);
}

static void test_fp16_exhaustive(void **state)
{
    (void)state;
    /* every half survives the round trip */
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = kn_fp16_to_fp32((uint16_t)h);
        if (isnan(f))
            continue;
        assert_int_equal(kn_fp32_to_fp16(f), h);
    }
    /* midpoints between neighbouring halves, and one float ulp either side */
    for (uint32_t h = 0; h < 0x7bff; h++) {
        double a = kn_fp16_to_fp32((uint16_t)h), b = kn_fp16_to_fp32((uint16_t)(h + 1));
        float mid = (float)((a + b) / 2);
        float probes[3] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY)};
        for (int k = 0; k < 3; k++) {
            for (int s = 0; s < 2; s++) {
                float f = s ? -probes[k] : probes[k];
                uint16_t got = kn_fp32_to_fp16(f), want = half_oracle(f);
                if (got != want) {
                    print_error("fp32_to_fp16(%a) = 0x%04x, want 0x%04x\n", (double)f, got, want);
                    fail();
                }
            }
        }
    }
    /* a sweep across all float exponents */
    for (uint64_t u = 0; u < 0x100000000ull; u += 7919 * 13) {
        float f = f32_of((uint32_t)u);
        if (isnan(f))
            continue;
        assert_int_equal(kn_fp32_to_fp16(f), half_oracle(f));
    }
}

/* ---- type table ------------------------------------------------------------ */

static void test_types(void **state)
{
    (void)state;
    kn_type t;
    assert_true(kn_type_supported(KN_TYPE_F32) && kn_type_supported(KN_TYPE_Q4_0));
    assert_true(kn_type_supported(3) && kn_type_supported(12) && kn_type_supported(KN_TYPE_BF16));
    assert_false(kn_type_supported(16)); /* IQ2_XXS */
    assert_false(kn_type_supported(KN_TYPE_Q8_K));
    assert_string_equal(kn_ggml_type_name(16), "IQ2_XXS");
    assert_string_equal(kn_ggml_type_name(KN_TYPE_Q4_K), "Q4_K");
    assert_string_equal(kn_ggml_type_name(39), "MXFP4");
    assert_null(kn_ggml_type_name(200));
    assert_string_equal(kn_type_name(KN_TYPE_Q8_0), "q8_0");
    assert_null(kn_type_name(4));
    assert_int_equal(kn_type_from_name("q4_0", &t), 0);
    assert_int_equal(t, KN_TYPE_Q4_0);
    assert_int_equal(kn_type_from_name("f16", &t), 0);
    assert_int_equal(t, KN_TYPE_F16);
    assert_int_equal(kn_type_from_name("q4_2", &t), -1);
    assert_int_equal(kn_type_from_name(NULL, &t), -1);
    assert_int_equal(kn_type_block_elems(KN_TYPE_Q8_0), 32);
    assert_int_equal(kn_type_block_elems(KN_TYPE_F16), 1);
    assert_int_equal(kn_type_block_bytes(KN_TYPE_Q4_0), 18);
    assert_int_equal(kn_type_block_bytes(99), 0);
    assert_int_equal(kn_row_bytes(KN_TYPE_Q8_0, 64), 68);
    assert_int_equal(kn_row_bytes(KN_TYPE_Q4_0, 4096), 2304);
    assert_int_equal(kn_row_bytes(KN_TYPE_F16, 7), 14);
    assert_int_equal(kn_row_bytes(KN_TYPE_Q8_0, 33), 0);
    assert_int_equal(kn_row_bytes(KN_TYPE_F32, -1), 0);
    assert_int_equal(kn_row_bytes(KN_TYPE_F32, INT64_MAX), 0); /* would wrap */
}

/* ---- reference quantization ------------------------------------------------ */

static void test_quant_known_q8_0(void **state)
{
    (void)state;
    float x[32] = {0};
    x[0] = 1.0f;    /* amax: d = 1/127 */
    x[1] = -0.25f;  /* -31.75 -> -32 */
    x[2] = 0.1f;    /* 12.7 -> 13 */
    x[3] = 0.5039f; /* 63.995 -> 64 */
    x[31] = -1.0f;
    kn_block_q8_0 b;
    kn_quantize_row(KN_TYPE_Q8_0, x, &b, 32);
    assert_int_equal(b.d, 0x2008); /* half nearest 1/127 */
    int8_t want[32] = {127, -32, 13, 64};
    want[31] = -127;
    assert_memory_equal(b.qs, want, 32);
    /* the serialized block is d (little endian) then the 32 bytes */
    const uint8_t *raw = (const uint8_t *)&b;
    assert_int_equal(raw[0], 0x08);
    assert_int_equal(raw[1], 0x20);
    assert_int_equal((int8_t)raw[2], 127);

    /* all zero: d = 0, all q = 0 */
    memset(x, 0, sizeof(x));
    kn_quantize_row(KN_TYPE_Q8_0, x, &b, 32);
    assert_int_equal(b.d, 0);
    for (int j = 0; j < 32; j++)
        assert_int_equal(b.qs[j], 0);

    /* ties round away from zero (roundf): d = 1 exactly, so x*id = x */
    for (int j = 0; j < 32; j++)
        x[j] = (float)(j - 16) + 0.5f;
    x[0] = 127.0f;
    kn_quantize_row(KN_TYPE_Q8_0, x, &b, 32);
    assert_int_equal(b.d, 0x3c00);
    for (int j = 1; j < 32; j++) {
        int want_q = j - 16 >= 0 ? j - 16 + 1 : j - 16; /* 0.5 -> 1, -0.5 -> -1, -1.5 -> -2 */
        assert_int_equal(b.qs[j], want_q);
    }
}

static void test_quant_known_q4_0(void **state)
{
    (void)state;
    float x[32] = {0};
    x[0] = -2.0f; /* the largest magnitude, negative: d = -2 / -8 = 0.25 */
    x[5] = 1.0f;  /* 4 + 8.5 -> 12 */
    x[16] = 0.5f; /* 2 + 8.5 -> 10, in the high nibble of byte 0 */
    x[20] = -1.0f;
    kn_block_q4_0 b;
    kn_quantize_row(KN_TYPE_Q4_0, x, &b, 32);
    assert_int_equal(b.d, 0x3400); /* 0.25 */
    uint8_t want[16];
    memset(want, 0x88, sizeof(want)); /* zeros quantize to 8 in both nibbles */
    want[0] = 0xa0;                   /* element 0 -> 0 low, element 16 -> 10 high */
    want[4] = 0x48;                   /* element 4 -> 8, element 20 -> 4 */
    want[5] = 0x8c;                   /* element 5 -> 12, element 21 -> 8 */
    assert_memory_equal(b.qs, want, 16);

    float y[32];
    kn_dequantize_row(KN_TYPE_Q4_0, &b, y, 32);
    assert_true(y[0] == -2.0f && y[5] == 1.0f && y[16] == 0.5f && y[20] == -1.0f && y[1] == 0.0f);

    /* the largest magnitude positive: d negative, it maps to level 0 */
    memset(x, 0, sizeof(x));
    x[31] = 2.0f;
    x[30] = -2.0f + 0.25f; /* -1.75 * -4 = 7 + 8.5 -> 15 */
    kn_quantize_row(KN_TYPE_Q4_0, x, &b, 32);
    assert_int_equal(b.d, 0xb400); /* -0.25 */
    assert_int_equal(b.qs[15] >> 4, 0);
    assert_int_equal(b.qs[14] >> 4, 15);
    assert_int_equal(b.qs[0], 0x88);
    kn_dequantize_row(KN_TYPE_Q4_0, &b, y, 32);
    assert_true(y[31] == 2.0f && y[30] == -1.75f);

    /* -x maps to +8, which saturates at 15: the one asymmetric level */
    memset(x, 0, sizeof(x));
    x[0] = 1.0f;
    x[1] = -1.0f;
    kn_quantize_row(KN_TYPE_Q4_0, x, &b, 32);
    assert_int_equal(b.qs[0] & 0x0f, 0);
    assert_int_equal(b.qs[1] & 0x0f, 15);
}

static void test_quant_roundtrip(void **state)
{
    (void)state;
    enum { N = 4096 };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    void *q = malloc(kn_row_bytes(KN_TYPE_F32, N));
    assert_non_null(x);
    assert_non_null(y);
    assert_non_null(q);
    seed(1);
    for (int trial = 0; trial < 4; trial++) {
        float scale = trial == 0 ? 1.0f : trial == 1 ? 1e-3f : trial == 2 ? 300.0f : 1.0f;
        fill(x, N, scale);
        if (trial == 3) /* outliers, as real weights have */
            for (int i = 0; i < N; i += 97)
                x[i] *= 40.0f;

        kn_quantize_row(KN_TYPE_Q8_0, x, q, N);
        kn_dequantize_row(KN_TYPE_Q8_0, q, y, N);
        const kn_block_q8_0 *b8 = q;
        for (int i = 0; i < N; i++) {
            float d = kn_fp16_to_fp32(b8[i / 32].d);
            /* half a step, plus the rounding of the scale to a half (absolute
             * 2^-25 once it is subnormal) over up to 127 steps */
            assert_true(fabsf(x[i] - y[i]) <= 0.5f * d + 127.0f * fmaxf(d * 0x1p-11f, 0x1p-25f));
        }

        kn_quantize_row(KN_TYPE_Q4_0, x, q, N);
        kn_dequantize_row(KN_TYPE_Q4_0, q, y, N);
        const kn_block_q4_0 *b4 = q;
        double se = 0, ss = 0;
        for (int i = 0; i < N; i++) {
            float d = fabsf(kn_fp16_to_fp32(b4[i / 32].d));
            /* a full step only at the saturated +8 level, else half */
            assert_true(fabsf(x[i] - y[i]) <= d + 8.0f * fmaxf(d * 0x1p-11f, 0x1p-25f));
            se += (double)(x[i] - y[i]) * (x[i] - y[i]);
            ss += (double)x[i] * x[i];
        }
        assert_true(trial == 3 || se / ss < 0.02); /* about 12% rms error for uniform data */

        kn_quantize_row(KN_TYPE_F16, x, q, N);
        kn_dequantize_row(KN_TYPE_F16, q, y, N);
        for (int i = 0; i < N; i++)
            assert_true(fabsf(x[i] - y[i]) <= fabsf(x[i]) * 0x1p-11f + 0x1p-25f);

        kn_quantize_row(KN_TYPE_F32, x, q, N);
        kn_dequantize_row(KN_TYPE_F32, q, y, N);
        assert_memory_equal(x, y, N * sizeof(float));
    }
    free(q);
    free(y);
    free(x);
}

/* ---- the other types: GGUF definitions, round trips, reference dots -------- */

/* The types beyond F32, F16, Q8_0 and Q4_0, each with the bound of a round
 * trip's RMS error relative to the data's RMS on uniform data: 1.5 times
 * what was measured at 1 and 1e-3 (Q4_1 .060, Q5_0 .031, Q5_1 .029, IQ4_NL
 * .065, Q2_K .235, Q3_K .125, Q4_K .055, Q5_K .030, Q6_K .021, IQ4_XS .094
 * (.065 at 1: at 1e-3 its super-block scale is a subnormal half), BF16
 * .0015; Q4_0 .065, Q8_0 .0044 for scale). */
/* MXFP4 (gpt-oss's experts): E2M1 levels under a power-of-two scale,
 * measured .144 at 1 and .118 at 1e-3. */
#define MXFP4_RMSE 0.22
typedef struct type_case {
    kn_type t;
    double rmse; /* relative RMS error of quantize -> dequantize, uniform data */
} type_case;

static const type_case new_types[] = {
    {KN_TYPE_Q4_1, 0.090},  {KN_TYPE_Q5_0, 0.047},   {KN_TYPE_Q5_1, 0.045}, {KN_TYPE_IQ4_NL, 0.100},
    {KN_TYPE_Q2_K, 0.35},   {KN_TYPE_Q3_K, 0.19},    {KN_TYPE_Q4_K, 0.083}, {KN_TYPE_Q5_K, 0.045},
    {KN_TYPE_Q6_K, 0.032},  {KN_TYPE_IQ4_XS, 0.140}, {KN_TYPE_BF16, 0.0023}, {KN_TYPE_MXFP4, MXFP4_RMSE},
};
#define N_NEW_TYPES ((int)(sizeof(new_types) / sizeof(new_types[0])))

static void test_types_traits(void **state)
{
    (void)state;
    static const struct {
        kn_type t;
        const char *name;
        int64_t elems;
        size_t bytes;
        kn_type act;
    } want[] = {
        {KN_TYPE_F32, "f32", 1, 4, KN_TYPE_F32},        {KN_TYPE_F16, "f16", 1, 2, KN_TYPE_F32},
        {KN_TYPE_BF16, "bf16", 1, 2, KN_TYPE_BF16},     {KN_TYPE_Q4_0, "q4_0", 32, 18, KN_TYPE_Q8_0},
        {KN_TYPE_Q4_1, "q4_1", 32, 20, KN_TYPE_Q8_0},   {KN_TYPE_Q5_0, "q5_0", 32, 22, KN_TYPE_Q8_0},
        {KN_TYPE_Q5_1, "q5_1", 32, 24, KN_TYPE_Q8_0},   {KN_TYPE_Q8_0, "q8_0", 32, 34, KN_TYPE_Q8_0},
        {KN_TYPE_Q2_K, "q2_K", 256, 84, KN_TYPE_Q8_K},  {KN_TYPE_Q3_K, "q3_K", 256, 110, KN_TYPE_Q8_K},
        {KN_TYPE_Q4_K, "q4_K", 256, 144, KN_TYPE_Q8_K}, {KN_TYPE_Q5_K, "q5_K", 256, 176, KN_TYPE_Q8_K},
        {KN_TYPE_Q6_K, "q6_K", 256, 210, KN_TYPE_Q8_K}, {KN_TYPE_Q8_K, "q8_K", 256, 292, KN_TYPE_Q8_K},
        {KN_TYPE_IQ4_NL, "iq4_nl", 32, 18, KN_TYPE_Q8_0}, {KN_TYPE_IQ4_XS, "iq4_xs", 256, 136, KN_TYPE_Q8_K},
        {KN_TYPE_MXFP4, "mxfp4", 32, 17, KN_TYPE_Q8_0},
    };
    /* ggml's numbers */
    assert_int_equal(KN_TYPE_Q4_1, 3);
    assert_int_equal(KN_TYPE_Q5_0, 6);
    assert_int_equal(KN_TYPE_Q5_1, 7);
    assert_int_equal(KN_TYPE_Q2_K, 10);
    assert_int_equal(KN_TYPE_Q6_K, 14);
    assert_int_equal(KN_TYPE_Q8_K, 15);
    assert_int_equal(KN_TYPE_IQ4_NL, 20);
    assert_int_equal(KN_TYPE_IQ4_XS, 23);
    assert_int_equal(KN_TYPE_BF16, 30);
    assert_int_equal(KN_TYPE_MXFP4, 39);
    const kn_ops *ref = kn_ops_ref();
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        const kn_type_traits *tt = kn_type_traits_of(want[i].t);
        kn_type back;
        assert_non_null(tt);
        assert_string_equal(tt->name, want[i].name);
        assert_string_equal(kn_type_name(want[i].t), want[i].name);
        assert_int_equal(tt->block_elems, want[i].elems);
        assert_int_equal(tt->block_bytes, want[i].bytes);
        assert_int_equal(kn_type_block_bytes(want[i].t), want[i].bytes);
        assert_int_equal(tt->vec_dot_type, want[i].act);
        assert_non_null(tt->dequantize_row);
        assert_non_null(tt->quantize_row);
        assert_int_equal(kn_type_from_name(want[i].name, &back), 0);
        assert_int_equal(back, want[i].t);
        if (want[i].t != KN_TYPE_Q8_K)
            assert_non_null(ref->dot[want[i].t]);
        if (want[i].act != KN_TYPE_F32)
            assert_non_null(ref->quantize[want[i].act]);
    }
    kn_type t;
    assert_int_equal(kn_type_from_name("Q4_K", &t), 0);
    assert_int_equal(t, KN_TYPE_Q4_K);
    assert_int_equal(kn_type_from_name("iq2_xxs", &t), -1);
    assert_null(kn_type_traits_of(16)); /* IQ2_XXS: not read yet */
    assert_null(kn_type_traits_of(KN_TYPE_COUNT));
    assert_int_equal(kn_row_bytes(KN_TYPE_Q4_K, 4096), 16 * 144);
    assert_int_equal(kn_row_bytes(KN_TYPE_Q4_K, 4000), 0); /* not whole super-blocks */
    /* the runtime loads every type but the activations' Q8_K */
    assert_true(kn_type_supported(KN_TYPE_Q4_K));
    assert_false(kn_type_supported(KN_TYPE_Q8_K));
}

/* ---- GGUF's definitions, written out the way ggml's dequantizers loop ------ */

static float h(uint16_t v)
{
    return kn_fp16_to_fp32(v);
}

/* Element values of one block of type t at raw, as GGUF defines them. */
static void gguf_decode(kn_type t, const uint8_t *raw, float *y)
{
    switch (t) {
    case KN_TYPE_Q4_1: {
        const kn_block_q4_1 *b = (const void *)raw;
        for (int j = 0; j < 16; j++) {
            y[j] = (b->qs[j] & 0xF) * h(b->d) + h(b->m);
            y[j + 16] = (b->qs[j] >> 4) * h(b->d) + h(b->m);
        }
        break;
    }
    case KN_TYPE_Q5_0:
    case KN_TYPE_Q5_1: {
        const bool one = t == KN_TYPE_Q5_1;
        const kn_block_q5_1 *b1 = (const void *)raw;
        const kn_block_q5_0 *b0 = (const void *)raw;
        uint32_t qh;
        memcpy(&qh, one ? b1->qh : b0->qh, 4);
        const uint8_t *qs = one ? b1->qs : b0->qs;
        for (int j = 0; j < 16; j++) {
            const uint8_t xh0 = ((qh >> j) << 4) & 0x10, xh1 = (qh >> (j + 12)) & 0x10;
            const int x0 = (qs[j] & 0x0F) | xh0, x1 = (qs[j] >> 4) | xh1;
            if (one) {
                y[j] = x0 * h(b1->d) + h(b1->m);
                y[j + 16] = x1 * h(b1->d) + h(b1->m);
            } else {
                y[j] = (x0 - 16) * h(b0->d);
                y[j + 16] = (x1 - 16) * h(b0->d);
            }
        }
        break;
    }
    case KN_TYPE_IQ4_NL: {
        const kn_block_iq4_nl *b = (const void *)raw;
        for (int j = 0; j < 16; j++) {
            y[j] = h(b->d) * kn_iq4nl_values[b->qs[j] & 0xf];
            y[j + 16] = h(b->d) * kn_iq4nl_values[b->qs[j] >> 4];
        }
        break;
    }
    case KN_TYPE_MXFP4: {
        /* OCP MX: E2M1 (sign, 2-bit exponent, 1-bit mantissa) times 2^(e - 127) */
        static const float e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
        const kn_block_mxfp4 *b = (const void *)raw;
        for (int j = 0; j < 32; j++) {
            const int q = j < 16 ? b->qs[j] & 0xf : b->qs[j - 16] >> 4;
            y[j] = ldexpf((q & 8) ? -e2m1[q & 7] : e2m1[q & 7], b->e - 127);
        }
        break;
    }
    case KN_TYPE_Q2_K: {
        const kn_block_q2_K *b = (const void *)raw;
        const uint8_t *q = b->qs;
        int is = 0;
        for (int n = 0; n < 256; n += 128, q += 32)
            for (int shift = 0; shift < 8; shift += 2)
                for (int half = 0; half < 2; half++) {
                    const uint8_t sc = b->scales[is++];
                    const float dl = h(b->d) * (sc & 0xF), ml = h(b->dmin) * (sc >> 4);
                    for (int l = 0; l < 16; l++)
                        *y++ = dl * ((q[l + 16 * half] >> shift) & 3) - ml;
                }
        break;
    }
    case KN_TYPE_Q3_K: {
        const kn_block_q3_K *b = (const void *)raw;
        /* the 16 scales, unpacked the way ggml does it: 4 words */
        uint32_t aux[4];
        memcpy(aux, b->scales, 12);
        const uint32_t tmp = aux[2], k1 = 0x03030303, k2 = 0x0f0f0f0f;
        aux[2] = ((aux[0] >> 4) & k2) | (((tmp >> 4) & k1) << 4);
        aux[3] = ((aux[1] >> 4) & k2) | (((tmp >> 6) & k1) << 4);
        aux[0] = (aux[0] & k2) | (((tmp >> 0) & k1) << 4);
        aux[1] = (aux[1] & k2) | (((tmp >> 2) & k1) << 4);
        const int8_t *scales = (const int8_t *)aux;
        const uint8_t *q = b->qs;
        uint8_t m = 1;
        int is = 0;
        for (int n = 0; n < 256; n += 128, q += 32)
            for (int shift = 0; shift < 8; shift += 2, m <<= 1)
                for (int half = 0; half < 2; half++) {
                    const float dl = h(b->d) * (scales[is++] - 32);
                    for (int l = 16 * half; l < 16 * half + 16; l++)
                        *y++ = dl * (((q[l] >> shift) & 3) - ((b->hmask[l] & m) ? 0 : 4));
                }
        break;
    }
    case KN_TYPE_Q4_K:
    case KN_TYPE_Q5_K: {
        const bool five = t == KN_TYPE_Q5_K;
        const kn_block_q4_K *b4 = (const void *)raw;
        const kn_block_q5_K *b5 = (const void *)raw;
        const uint8_t *sc12 = five ? b5->scales : b4->scales, *q = five ? b5->qs : b4->qs;
        const float d = h(five ? b5->d : b4->d), dmin = h(five ? b5->dmin : b4->dmin);
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0, is = 0; j < 256; j += 64, q += 32, is += 2, u1 <<= 2, u2 <<= 2) {
            int sc[2], mn[2];
            for (int k = 0; k < 2; k++) { /* ggml's get_scale_min_k4 */
                const int s = is + k;
                sc[k] = s < 4 ? sc12[s] & 63 : (sc12[s + 4] & 0xF) | ((sc12[s - 4] >> 6) << 4);
                mn[k] = s < 4 ? sc12[s + 4] & 63 : (sc12[s + 4] >> 4) | ((sc12[s] >> 6) << 4);
            }
            for (int l = 0; l < 32; l++)
                *y++ = d * sc[0] * ((q[l] & 0xF) + (five && (b5->qh[l] & u1) ? 16 : 0)) - dmin * mn[0];
            for (int l = 0; l < 32; l++)
                *y++ = d * sc[1] * ((q[l] >> 4) + (five && (b5->qh[l] & u2) ? 16 : 0)) - dmin * mn[1];
        }
        break;
    }
    case KN_TYPE_Q6_K: {
        const kn_block_q6_K *b = (const void *)raw;
        const uint8_t *ql = b->ql, *qh = b->qh;
        const int8_t *sc = b->scales;
        for (int n = 0; n < 256; n += 128, y += 128, ql += 64, qh += 32, sc += 8)
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                y[l] = h(b->d) * sc[is] * (((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32);
                y[l + 32] = h(b->d) * sc[is + 2] * (((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                y[l + 64] = h(b->d) * sc[is + 4] * (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                y[l + 96] = h(b->d) * sc[is + 6] * (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
            }
        break;
    }
    case KN_TYPE_IQ4_XS: {
        const kn_block_iq4_xs *b = (const void *)raw;
        for (int ib = 0; ib < 8; ib++, y += 32) {
            const int ls = ((b->scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) | (((b->scales_h >> 2 * ib) & 3) << 4);
            const float dl = h(b->d) * (ls - 32);
            for (int j = 0; j < 16; j++) {
                y[j] = dl * kn_iq4nl_values[b->qs[16 * ib + j] & 0xf];
                y[j + 16] = dl * kn_iq4nl_values[b->qs[16 * ib + j] >> 4];
            }
        }
        break;
    }
    default: /* BF16 */
        for (int j = 0; j < 1; j++) {
            uint32_t u = (uint32_t)(raw[0] | raw[1] << 8) << 16;
            memcpy(&y[j], &u, 4);
        }
        break;
    }
}

/* Where a type keeps its scale halves (d, then dmin or m), for the hand-built
 * blocks' extremes; -1 where there is none. */
static void half_fields(kn_type t, int *d_at, int *m_at)
{
    *m_at = -1;
    switch (t) {
    case KN_TYPE_Q2_K:
        *d_at = 80, *m_at = 82;
        break;
    case KN_TYPE_Q3_K:
        *d_at = 108;
        break;
    case KN_TYPE_Q6_K:
        *d_at = 208;
        break;
    case KN_TYPE_Q4_1:
    case KN_TYPE_Q5_1:
    case KN_TYPE_Q4_K:
    case KN_TYPE_Q5_K:
        *d_at = 0, *m_at = 2;
        break;
    default:
        *d_at = 0;
        break;
    }
}

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* Each type's dequantizer against the definitions above on hand-built blocks:
 * all bytes random; every scale, min and quant byte at its maximum (6-bit
 * scales and mins of 63, Q6_K's -128 and 127) with the largest and a
 * negative super-block scale; negative mins (zero-points) for Q4_1/Q5_1; all
 * zero. Plus a few values worked out by hand. */
static void test_dequant_gguf(void **state)
{
    (void)state;
    seed(40);
    for (int k = 0; k < N_NEW_TYPES; k++) {
        const kn_type t = new_types[k].t;
        const int64_t be = kn_type_block_elems(t);
        const size_t bb = kn_type_block_bytes(t);
        uint8_t raw[292];
        float got[256], want[256];
        int d_at, m_at;
        half_fields(t, &d_at, &m_at);
        for (int v = 0; v < 40; v++) {
            for (size_t i = 0; i < bb; i++)
                raw[i] = v == 0 ? 0 : v == 1 ? 0xff : (uint8_t)rnd32();
            if (t == KN_TYPE_MXFP4) {
                /* exponents: the subnormal 0 and 1, 1.0's 127, and the largest finite result's */
                const uint8_t es[] = {0, 1, 127, 253, 128};
                raw[0] = v >= 1 && v < 6 ? es[v - 1] : (uint8_t)(rnd32() % 254);
            } else if (t != KN_TYPE_BF16) {
                /* scales: finite halves; at the extremes for the first few */
                const uint16_t ds[] = {0x7bff, 0xfbff, 0x0001, 0x3c00, 0xb800};
                if (v >= 1) {
                    put16(raw + d_at, v < 6 ? ds[v - 1] : (uint16_t)(rnd32() & 0x7bff) | (rnd32() & 0x8000));
                    if (m_at >= 0) /* v even: a negative zero-point/min */
                        put16(raw + m_at, (uint16_t)(v % 2 ? 0x3800 : 0xc500));
                }
            } else if ((raw[1] & 0x7f) == 0x7f) {
                raw[1] &= 0xbf; /* no NaN/inf: compared by value */
            }
            kn_dequantize_row(t, raw, got, be);
            gguf_decode(t, raw, want);
            for (int i = 0; i < be; i++) {
                if (got[i] != want[i] && !(fabsf(got[i] - want[i]) <= 1e-6f * fabsf(want[i]))) {
                    print_error("%s block %d element %d: got %.9g want %.9g\n", kn_type_name(t), v, i,
                                (double)got[i], (double)want[i]);
                    fail();
                }
                if (v == 0)
                    assert_true(got[i] == 0.0f);
            }
        }
    }
    /* by hand: Q4_K with d = 1, dmin = 0.5, group 0 scale 1 min 2, group 5
     * scale 63 (low nibble 15 in byte 9, top bits 3 in byte 1) min 0 */
    kn_block_q4_K b4;
    float y[256];
    memset(&b4, 0, sizeof(b4));
    b4.d = 0x3c00;
    b4.dmin = 0x3800;
    b4.scales[0] = 1;
    b4.scales[4] = 2;
    b4.scales[9] = 0x0f;
    b4.scales[1] = 3 << 6;
    b4.qs[0] = 0x07;      /* element 0: 7, element 32: 0 */
    b4.qs[64 + 3] = 0xa0; /* element 160 + 3 (group 5, high nibbles of run 2): 10 */
    kn_dequantize_row(KN_TYPE_Q4_K, &b4, y, 256);
    assert_true(y[0] == 1.0f * 7 - 0.5f * 2);
    assert_true(y[1] == -1.0f);
    assert_true(y[160 + 3] == 63.0f * 10);
    assert_true(y[160] == 0.0f);
    /* Q6_K: d = 2, group 3 scale -128, element 48 = q 0 (-32): 2 * -128 * -32 */
    kn_block_q6_K b6;
    memset(&b6, 0, sizeof(b6));
    b6.d = 0x4000;
    b6.scales[3] = -128;
    kn_dequantize_row(KN_TYPE_Q6_K, &b6, y, 256);
    assert_true(y[48] == 8192.0f && y[47] == 0.0f);
    /* Q3_K: d = 1, every scale 0 (so -32), element 0 with its high bit: 0 */
    kn_block_q3_K b3;
    memset(&b3, 0, sizeof(b3));
    b3.d = 0x3c00;
    b3.hmask[0] = 1;
    b3.qs[0] = 3;
    kn_dequantize_row(KN_TYPE_Q3_K, &b3, y, 256);
    assert_true(y[0] == -32.0f * 3 && y[1] == -32.0f * -4);
    /* Q5_1 with a negative zero-point: d = 1, m = -16, element 17 = 31 */
    kn_block_q5_1 b5;
    memset(&b5, 0, sizeof(b5));
    b5.d = 0x3c00;
    b5.m = 0xcc00;
    b5.qs[1] = 0xf0;
    b5.qh[2] = 0x02;
    kn_dequantize_row(KN_TYPE_Q5_1, &b5, y, 32);
    assert_true(y[17] == 15.0f && y[1] == -16.0f);
}

/* Quantize -> dequantize: the relative RMS error of each type on uniform and
 * heavy-tailed data within its bound, quants valid for the type (the
 * dequantizer's own values again after a second round trip: requantizing a
 * row of representable values is exact up to the scales' rounding), and an
 * all-zero row exactly zero. */
static void test_quant_roundtrip_types(void **state)
{
    (void)state;
    enum { N = 8192 };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    uint8_t *q = malloc(kn_row_bytes(KN_TYPE_Q8_K, N) * 2);
    assert_non_null(x);
    assert_non_null(y);
    assert_non_null(q);
    for (int k = 0; k < N_NEW_TYPES; k++) {
        const kn_type t = new_types[k].t;
        for (int trial = 0; trial < 3; trial++) {
            seed(50 + trial);
            fill(x, N, trial == 1 ? 1e-3f : 1.0f);
            if (trial == 2) /* outliers */
                for (int i = 0; i < N; i += 97)
                    x[i] *= 20.0f;
            kn_quantize_row(t, x, q, N);
            kn_dequantize_row(t, q, y, N);
            double se = 0, ss = 0;
            for (int i = 0; i < N; i++) {
                assert_true(isfinite(y[i]));
                se += (double)(x[i] - y[i]) * (x[i] - y[i]);
                ss += (double)x[i] * x[i];
            }
            const double rel = sqrt(se / ss);
            if (trial < 2 && rel > new_types[k].rmse) {
                print_error("%s trial %d: relative RMS error %.4f over %.4f\n", kn_type_name(t), trial, rel,
                            new_types[k].rmse);
                fail();
            }
            if (trial == 2 && rel > 2.5 * new_types[k].rmse) {
                print_error("%s outliers: relative RMS error %.4f\n", kn_type_name(t), rel);
                fail();
            }
        }
        memset(x, 0, N * sizeof(float));
        kn_quantize_row(t, x, q, N);
        kn_dequantize_row(t, q, y, N);
        for (int i = 0; i < N; i++)
            assert_true(y[i] == 0.0f);
    }
    free(q);
    free(y);
    free(x);
}

/* Activations for weight type t: the rows quantized to its vec_dot_type,
 * and their values as the dot sees them (xd). */
static void make_acts(kn_type t, const float *x, int n_rows, int n, size_t xs, uint8_t *xa, float *xd)
{
    const kn_type act = kn_type_traits_of(t)->vec_dot_type;
    for (int r = 0; r < n_rows; r++) {
        if (act == KN_TYPE_F32)
            memcpy(xa + r * xs, x + (size_t)r * n, n * sizeof(float));
        else
            kn_quantize_row(act, x + (size_t)r * n, xa + r * xs, n);
        kn_dequantize_row(act, xa + r * xs, xd + (size_t)r * n, n);
    }
}

/* |w| and the size of a min's share of it, per element (the dot's terms
 * cancel where the weight is a scaled level less a min): the magnitude a
 * dot's rounding is relative to. */
static void weight_mag(kn_type t, const uint8_t *w, int n, float *wd, float *wm)
{
    const size_t bb = kn_type_block_bytes(t);
    const int64_t be = kn_type_block_elems(t);
    int d_at, m_at;
    half_fields(t, &d_at, &m_at);
    uint8_t *tmp = malloc(kn_row_bytes(t, n));
    assert_non_null(tmp);
    memcpy(tmp, w, kn_row_bytes(t, n));
    kn_dequantize_row(t, w, wd, n);
    if (m_at >= 0 && t != KN_TYPE_BF16) {
        for (int b = 0; b < n / be; b++)
            put16(tmp + b * bb + d_at, 0); /* d = 0: what is left is the min's term */
        kn_dequantize_row(t, tmp, wm, n);
    } else {
        memset(wm, 0, n * sizeof(float));
    }
    for (int i = 0; i < n; i++)
        wm[i] = fabsf(wd[i]) + 2 * fabsf(wm[i]);
    free(tmp);
}

/* Each new type's reference dot and gemm against the float dot of the
 * dequantized weights and activations. */
static void test_dot_types_ref(void **state)
{
    (void)state;
    enum { MAXN = 4096, MAXR = 3 };
    const kn_ops *ref = kn_ops_ref();
    float *x = malloc(MAXR * MAXN * sizeof(float)), *xd = malloc(MAXR * MAXN * sizeof(float));
    float *f = malloc(MAXN * sizeof(float)), *wd = malloc(MAXN * sizeof(float)), *wm = malloc(MAXN * sizeof(float));
    uint8_t *w = malloc(kn_row_bytes(KN_TYPE_F32, MAXN)), *xa = malloc(MAXR * kn_row_bytes(KN_TYPE_F32, MAXN));
    assert_true(x && xd && f && wd && wm && w && xa);
    static const int ns[] = {256, 512, 4096};
    for (int k = 0; k < N_NEW_TYPES; k++) {
        const kn_type t = new_types[k].t;
        seed(60 + t);
        for (int ni = 0; ni < 3; ni++) {
            const int n = ns[ni];
            const size_t xs = kn_row_bytes(kn_type_traits_of(t)->vec_dot_type, n);
            fill(f, n, 1.0f);
            fill(x, (size_t)MAXR * n, ni == 1 ? 30.0f : 1.0f);
            kn_quantize_row(t, f, w, n);
            weight_mag(t, w, n, wd, wm);
            make_acts(t, x, MAXR, n, xs, xa, xd);
            float got[MAXR], g1;
            ref->dot[t](w, xa, xs, MAXR, n, got);
            for (int r = 0; r < MAXR; r++) {
                double exact = 0, mag = 0;
                for (int i = 0; i < n; i++) {
                    exact += (double)wd[i] * xd[(size_t)r * n + i];
                    mag += (double)wm[i] * fabs(xd[(size_t)r * n + i]);
                }
                check_close(got[r], exact, 1e-5 * mag + 1e-30, "ref dot", kn_type_name(t), n, r);
                if (ref->gemm[t]) {
                    ref->gemm[t](w, 0, 1, xa + r * xs, xs, 1, n, &g1, 1);
                    assert_true(g1 == got[r]);
                }
            }
        }
    }
    free(xa);
    free(w);
    free(wm);
    free(wd);
    free(f);
    free(xd);
    free(x);
}

/* ---- SIMD tables against the reference -------------------------------------- */

static const int f_sizes[] = {1, 7, 8, 31, 33, 257, 4095};
static const int q_sizes[] = {32, 64, 96, 4096};

static void test_quantize_q8_0_exact(void **state)
{
    (void)state;
    const kn_ops *fast[5];
    int nf = fast_tables_or_skip(fast);
    const kn_ops *ref = kn_ops_ref();
    enum { N = 4096 };
    float *x = malloc(N * sizeof(float));
    size_t rb = kn_row_bytes(KN_TYPE_Q8_0, N);
    uint8_t *a = malloc(rb), *b = malloc(rb);
    assert_non_null(x);
    assert_non_null(a);
    assert_non_null(b);
    seed(2);
    for (int trial = 0; trial < 3; trial++) {
        if (trial == 0) {
            fill(x, N, 3.0f);
        } else {
            /* d = 1 exactly in every block, so most values are exact ties */
            for (int i = 0; i < N; i++)
                x[i] = (float)((int)(rnd32() % 253) - 126) + (trial == 1 ? 0.5f : 0.0f);
            for (int i = 0; i < N; i += 32)
                x[i] = (i / 32) % 2 ? 127.0f : -127.0f;
        }
        for (int k = 0; k < (int)(sizeof(q_sizes) / sizeof(q_sizes[0])); k++) {
            int n = q_sizes[k];
            ref->quantize_q8_0(x, a, n);
            for (int t = 0; t < nf; t++) {
                memset(b, 0xee, rb);
                fast[t]->quantize_q8_0(x, b, n);
                assert_memory_equal(a, b, kn_row_bytes(KN_TYPE_Q8_0, n));
            }
        }
    }
    free(b);
    free(a);
    free(x);
}

static void test_dot_float(void **state)
{
    (void)state;
    const kn_ops *fast[5];
    int nf = fast_tables_or_skip(fast);
    const kn_ops *ref = kn_ops_ref();
    enum { MAXN = 4095, MAXR = 5 };
    const size_t xs = MAXN + 3; /* an odd row stride */
    float *w = malloc(MAXN * sizeof(float)), *x = malloc(MAXR * xs * sizeof(float));
    uint16_t *wh = malloc(MAXN * sizeof(uint16_t));
    assert_non_null(w);
    assert_non_null(x);
    assert_non_null(wh);
    seed(3);
    fill(w, MAXN, 1.0f);
    fill(x, MAXR * xs, 2.0f);
    kn_quantize_row(KN_TYPE_F16, w, wh, MAXN);
    for (int k = 0; k < (int)(sizeof(f_sizes) / sizeof(f_sizes[0])); k++) {
        int n = f_sizes[k];
        for (int nr = 1; nr <= MAXR; nr++) {
            float want32[MAXR], want16[MAXR], got[MAXR];
            ref->dot[KN_TYPE_F32](w, x, xs * sizeof(float), nr, n, want32);
            ref->dot[KN_TYPE_F16](wh, x, xs * sizeof(float), nr, n, want16);
            for (int t = 0; t < nf; t++) {
                fast[t]->dot[KN_TYPE_F32](w, x, xs * sizeof(float), nr, n, got);
                for (int r = 0; r < nr; r++) {
                    double mag = 0;
                    for (int i = 0; i < n; i++)
                        mag += fabs((double)w[i] * x[r * xs + i]);
                    check_close(got[r], want32[r], 1e-5 * mag + 1e-30, "dot_f32", fast[t]->name, n, r);
                }
                fast[t]->dot[KN_TYPE_F16](wh, x, xs * sizeof(float), nr, n, got);
                for (int r = 0; r < nr; r++) {
                    double mag = 0;
                    for (int i = 0; i < n; i++)
                        mag += fabs((double)w[i] * x[r * xs + i]);
                    check_close(got[r], want16[r], 1e-5 * mag + 1e-30, "dot_f16", fast[t]->name, n, r);
                }
            }
        }
    }
    free(wh);
    free(x);
    free(w);
}

static void dot_quant_case(kn_type wtype)
{
    const kn_ops *fast[5];
    int nf = fast_tables_or_skip(fast);
    const kn_ops *ref = kn_ops_ref();
    enum { MAXN = 4096, MAXR = 5 };
    const size_t xs = kn_row_bytes(KN_TYPE_Q8_0, MAXN) + 6; /* rows not block aligned */
    float *w = malloc(MAXN * sizeof(float)), *x = malloc(MAXR * MAXN * sizeof(float));
    float *wd = malloc(MAXN * sizeof(float)), *xd = malloc(MAXR * MAXN * sizeof(float));
    uint8_t *wq = malloc(kn_row_bytes(wtype, MAXN)), *xq = malloc(MAXR * xs);
    assert_non_null(w);
    assert_non_null(x);
    assert_non_null(wd);
    assert_non_null(xd);
    assert_non_null(wq);
    assert_non_null(xq);
    seed(4 + wtype);
    for (int trial = 0; trial < 2; trial++) {
        fill(w, MAXN, trial ? 0.02f : 1.0f);
        fill(x, (size_t)MAXR * MAXN, trial ? 50.0f : 1.0f);
        if (trial) /* a saturating Q8_0 weight: -128 only comes from other tools */
            for (int i = 0; i < MAXN; i += 32)
                w[i] = -0.03f;
        for (int k = 0; k < (int)(sizeof(q_sizes) / sizeof(q_sizes[0])); k++) {
            int n = q_sizes[k];
            kn_quantize_row(wtype, w, wq, n);
            if (trial && wtype == KN_TYPE_Q8_0) {
                /* force a -128 into every block, as a foreign file may hold */
                kn_block_q8_0 *b = (kn_block_q8_0 *)wq;
                for (int ib = 0; ib < n / 32; ib++)
                    b[ib].qs[ib % 32] = -128;
            }
            kn_dequantize_row(wtype, wq, wd, n);
            for (int r = 0; r < MAXR; r++) {
                ref->quantize_q8_0(x + (size_t)r * MAXN, xq + r * xs, n);
                kn_dequantize_row(KN_TYPE_Q8_0, xq + r * xs, xd + (size_t)r * MAXN, n);
            }
            for (int nr = 1; nr <= MAXR; nr++) {
                float want[MAXR], got[MAXR];
                if (wtype == KN_TYPE_Q8_0)
                    ref->dot[KN_TYPE_Q8_0](wq, xq, xs, nr, n, want);
                else
                    ref->dot[KN_TYPE_Q4_0](wq, xq, xs, nr, n, want);
                for (int r = 0; r < nr; r++) {
                    /* the reference is the product of the dequantized rows */
                    double exact = 0, mag = 0;
                    for (int i = 0; i < n; i++) {
                        exact += (double)wd[i] * xd[(size_t)r * MAXN + i];
                        mag += fabs((double)wd[i] * xd[(size_t)r * MAXN + i]);
                    }
                    check_close(want[r], exact, 1e-5 * mag + 1e-30, "ref dot", "ref", n, r);
                }
                for (int t = 0; t < nf; t++) {
                    memset(got, 0xff, sizeof(got));
                    if (wtype == KN_TYPE_Q8_0)
                        fast[t]->dot[KN_TYPE_Q8_0](wq, xq, xs, nr, n, got);
                    else
                        fast[t]->dot[KN_TYPE_Q4_0](wq, xq, xs, nr, n, got);
                    for (int r = 0; r < nr; r++) {
                        double mag = 0;
                        for (int i = 0; i < n; i++)
                            mag += fabs((double)wd[i] * xd[(size_t)r * MAXN + i]);
                        check_close(got[r], want[r], 1e-5 * mag + 1e-30,
                                    wtype == KN_TYPE_Q8_0 ? "dot_q8_0" : "dot_q4_0", fast[t]->name, n, r);
                    }
                }
            }
        }
    }
    free(xq);
    free(wq);
    free(xd);
    free(wd);
    free(x);
    free(w);
}

static void test_dot_q8_0(void **state)
{
    (void)state;
    dot_quant_case(KN_TYPE_Q8_0);
}

static void test_dot_q4_0(void **state)
{
    (void)state;
    dot_quant_case(KN_TYPE_Q4_0);
}

/* The batched entry against the reference on odd sizes: every batch width
 * from 1 to 70 rows, so that every path of each table runs with every tail
 * of its groups; weight row counts that end inside a tile; lengths past one
 * segment of each path; strides off the block size; and quants at their
 * limits (Q8_0's -128, which only foreign files hold; activation rows all
 * zero or all at +-127). Also what continuous batching relies on: a row's
 * result has the same bits whatever batch it came in, those of the table's
 * gemm of that row alone. */
static void gemm_case(kn_type wtype)
{
    const kn_ops *fast[5];
    int nf = fast_tables(fast);
    const kn_ops *ref = kn_ops_ref();
    enum { MAXW = 33, MAXR = 70, MAXN = 8224 };
    /* 1056 is 33 blocks, 8224 is 257: past one segment of either path */
    const int ns[] = {32, 96, 1056, 8224};
    const int nws[] = {1, 7, 8, 9, 17, 33};
    /* strides off the block size but even: blocks hold a 16-bit scale */
    const size_t ws = kn_row_bytes(wtype, MAXN) + 6, xs = kn_row_bytes(KN_TYPE_Q8_0, MAXN) + 2;
    const size_t ys = MAXW + 2; /* a guard column after every row */
    float *f = malloc(MAXN * sizeof(float));
    uint8_t *w = malloc(MAXW * ws), *xq = malloc(MAXR * xs);
    float *want = malloc(MAXR * ys * sizeof(float)), *got = malloc(MAXR * ys * sizeof(float));
    float *alone = malloc(MAXR * ys * sizeof(float));
    float *wd = malloc((size_t)MAXW * MAXN * sizeof(float)),
          *xd = malloc((size_t)MAXR * MAXN * sizeof(float));
    double *mag = malloc(MAXR * MAXW * sizeof(double));
    uint8_t *dense = malloc(MAXW * ws), *packed = malloc(kn_pack_q8_0_bytes(MAXW, MAXN));
    float *packed_got = malloc(MAXR * ys * sizeof(float));
    assert_non_null(dense);
    assert_non_null(packed);
    assert_non_null(packed_got);
    assert_non_null(f);
    assert_non_null(w);
    assert_non_null(xq);
    assert_non_null(want);
    assert_non_null(got);
    assert_non_null(alone);
    assert_non_null(wd);
    assert_non_null(xd);
    assert_non_null(mag);
    void (*rg)(const void *, size_t, int, const void *, size_t, int, int, float *, size_t) =
        ref->gemm[wtype];
    seed(20 + wtype);
    int ran = 0;
    for (int ni = 0; ni < 4; ni++) {
        const int n = ns[ni];
        for (int o = 0; o < MAXW; o++) {
            fill(f, n, o % 3 ? 1.0f : 0.01f);
            kn_quantize_row(wtype, f, w + o * ws, n);
            if (wtype == KN_TYPE_Q8_0 && o % 5 == 4) {
                kn_block_q8_0 *b = (kn_block_q8_0 *)(w + o * ws);
                for (int ib = 0; ib < n / 32; ib++)
                    b[ib].qs[(o + ib) % 32] = -128;
            }
            kn_dequantize_row(wtype, w + o * ws, wd + (size_t)o * MAXN, n);
        }
        for (int r = 0; r < MAXR; r++) {
            if (r % 11 == 10) {
                memset(f, 0, n * sizeof(float));
            } else if (r % 11 == 9) {
                for (int i = 0; i < n; i++)
                    f[i] = rnd32() & 1 ? 1.0f : -1.0f;
            } else {
                fill(f, n, r % 2 ? 3.0f : 1.0f);
            }
            kn_quantize_row(KN_TYPE_Q8_0, f, xq + r * xs, n);
            kn_dequantize_row(KN_TYPE_Q8_0, xq + r * xs, xd + (size_t)r * MAXN, n);
        }
        for (int r = 0; r < MAXR; r++) {
            for (int o = 0; o < MAXW; o++) {
                double m = 0;
                for (int i = 0; i < n; i++)
                    m += fabs((double)wd[(size_t)o * MAXN + i] * xd[(size_t)r * MAXN + i]);
                mag[r * MAXW + o] = m;
            }
        }
        rg(w, ws, MAXW, xq, xs, MAXR, n, want, ys);
        {
            const size_t rb = kn_row_bytes(wtype, n);
            for (int o = 0; o < MAXW; o++)
                memcpy(dense + o * rb, w + o * ws, rb);
            if (wtype == KN_TYPE_Q8_0) {
                assert_int_equal(kn_pack_q8_0_bytes(MAXW, n), (size_t)3 * kn_p16_group_bytes(n / 32));
                kn_pack_q8_0(dense, MAXW, n, packed);
            } else {
                assert_int_equal(kn_pack_q4_0_bytes(MAXW, n), (size_t)3 * kn_p16_q4_group_bytes(n / 32));
                kn_pack_q4_0(dense, MAXW, n, packed);
            }
        }
        /* the reference gemm is the reference dot */
        for (int r = 0; r < MAXR; r += 13) {
            for (int o = 0; o < MAXW; o += 5) {
                float d;
                if (wtype == KN_TYPE_Q8_0)
                    ref->dot[KN_TYPE_Q8_0](w + o * ws, xq + r * xs, 0, 1, n, &d);
                else
                    ref->dot[KN_TYPE_Q4_0](w + o * ws, xq + r * xs, 0, 1, n, &d);
                assert_true(want[r * ys + o] == d);
            }
        }
        for (int t = 0; t < nf; t++) {
            void (*g)(const void *, size_t, int, const void *, size_t, int, int, float *, size_t) =
                fast[t]->gemm[wtype];
            const char *what = wtype == KN_TYPE_Q8_0 ? "gemm_q8_0" : "gemm_q4_0";
            if (g == NULL)
                continue;
            ran++;
            for (int r = 0; r < MAXR; r++)
                g(w, ws, MAXW, xq + r * xs, xs, 1, n, alone + r * ys, ys);
            for (int nr = 1; nr <= MAXR; nr++) {
                if (n > 1056 && nr > 9 && nr % 8 != 1 && nr != MAXR)
                    continue; /* the longest rows: the widths that reach new tails */
                for (int wi = 0; wi < 2; wi++) {
                    const int n_w = wi ? nws[nr % 6] : MAXW;
                    for (size_t i = 0; i < MAXR * ys; i++)
                        got[i] = -7.0f;
                    g(w, ws, n_w, xq, xs, nr, n, got, ys);
                    for (int r = 0; r < MAXR; r++) {
                        for (int o = 0; o < (int)ys; o++) {
                            const float v = got[r * ys + o];
                            if (r >= nr || o >= n_w) { /* outside the output: untouched */
                                assert_true(v == -7.0f);
                                continue;
                            }
                            check_close(v, want[r * ys + o], 1e-5 * mag[r * MAXW + o] + 1e-30, what,
                                        fast[t]->name, n, r * 100 + o);
                            if (bits_of(v) != bits_of(alone[r * ys + o])) {
                                print_error("%s [%s] n=%d: row %d of %d, column %d of %d: %.9g, alone %.9g\n",
                                            what, fast[t]->name, n, r, nr, o, n_w, (double)v,
                                            (double)alone[r * ys + o]);
                                fail();
                            }
                        }
                    }
                    void (*gp)(const void *, int, const void *, size_t, int, int, float *, size_t) =
                        wtype == KN_TYPE_Q8_0 ? fast[t]->gemm_q8_0_p16 : fast[t]->gemm_q4_0_p16;
                    if (gp == NULL)
                        continue;
                    /* the packed rows: the same bits, the same cells untouched */
                    for (size_t i = 0; i < MAXR * ys; i++)
                        packed_got[i] = -7.0f;
                    gp(packed, n_w, xq, xs, nr, n, packed_got, ys);
                    for (size_t i = 0; i < MAXR * ys; i++)
                        if (bits_of(packed_got[i]) != bits_of(got[i])) {
                            print_error("%s_p16 [%s] n=%d rows %d n_w %d: cell %zu %.9g, unpacked %.9g\n",
                                        what, fast[t]->name, n, nr, n_w, i, (double)packed_got[i],
                                        (double)got[i]);
                            fail();
                        }
                }
            }
        }
    }
    free(packed_got);
    free(packed);
    free(dense);
    free(mag);
    free(xd);
    free(wd);
    free(alone);
    free(got);
    free(want);
    free(xq);
    free(w);
    free(f);
    if (ran == 0)
        skip();
}

static void test_gemm_q8_0(void **state)
{
    (void)state;
    gemm_case(KN_TYPE_Q8_0);
}

static void test_gemm_q4_0(void **state)
{
    (void)state;
    gemm_case(KN_TYPE_Q4_0);
}

/* Every table's activation quantizers for the new formats, bit for bit the
 * reference's: Q8_K (its scale, quants and group sums) and BF16, on odd
 * data (ties, all zero, a single spike, huge and tiny values). */
static void test_quantize_new_acts_exact(void **state)
{
    (void)state;
    const kn_ops *fast[5];
    int nf = fast_tables_or_skip(fast);
    const kn_ops *ref = kn_ops_ref();
    enum { N = 1024 };
    float x[N];
    uint8_t a[N * 2], b[N * 2];
    for (int trial = 0; trial < 6; trial++) {
        seed(70 + trial);
        fill(x, N, trial == 3 ? 1e30f : trial == 4 ? 1e-30f : 3.0f);
        if (trial == 1)
            memset(x, 0, sizeof(x));
        if (trial == 2)
            for (int i = 0; i < N; i++)
                x[i] = (float)((int)(x[i] * 4)) * 0.5f; /* ties at half steps */
        if (trial == 5)
            x[300] = -7.0f;
        const kn_type acts[] = {KN_TYPE_Q8_K, KN_TYPE_BF16};
        for (int k = 0; k < 2; k++) {
            const size_t rb = kn_row_bytes(acts[k], N);
            ref->quantize[acts[k]](x, a, N);
            for (int t = 0; t < nf; t++) {
                memset(b, 0x5a, sizeof(b));
                fast[t]->quantize[acts[k]](x, b, N);
                if (memcmp(a, b, rb) != 0) {
                    print_error("quantize %s [%s] trial %d differs\n", kn_type_name(acts[k]), fast[t]->name,
                                trial);
                    fail();
                }
            }
        }
    }
}

/* Each table's gemm and dot of the types beyond F32, Q8_0 and Q4_0 against
 * the reference, on random data with odd sizes: weight row counts that end
 * inside every tile, batches from 1 to 70 rows, row lengths of one block to
 * many, strides off the row size. Also what continuous batching relies on:
 * a row's result has the same bits whatever batch it came in (those of the
 * table's gemm of that row alone). */
static void gemm_types_case(kn_type t)
{
    const kn_ops *fast[5];
    int nf = fast_tables_or_skip(fast);
    const kn_ops *ref = kn_ops_ref();
    enum { MAXW = 19, MAXR = 70 };
    const kn_type act = kn_type_traits_of(t)->vec_dot_type;
    const int64_t be = kn_type_block_elems(t);
    const int ns_q[] = {1, 3, 17}; /* blocks of 32 or 256 */
    const int ns_f[] = {7, 33, 1001};
    const int maxn = be == 1 ? 1001 : (int)be * 17;
    const size_t ws = kn_row_bytes(t, maxn) + 4, xs = kn_row_bytes(act, maxn) + 4;
    uint8_t *w = malloc(MAXW * ws), *xa = malloc(MAXR * xs);
    float *f = malloc(maxn * sizeof(float)), *xr = malloc((size_t)MAXR * maxn * sizeof(float));
    float *wd = malloc((size_t)MAXW * maxn * sizeof(float)), *wm = malloc((size_t)MAXW * maxn * sizeof(float));
    float *xd = malloc((size_t)MAXR * maxn * sizeof(float));
    float *want = malloc(MAXR * MAXW * sizeof(float)), *got = malloc(MAXR * MAXW * sizeof(float));
    float *alone = malloc(MAXR * MAXW * sizeof(float));
    double *mag = malloc(MAXR * MAXW * sizeof(double));
    assert_true(w && xa && f && xr && wd && wm && xd && want && got && alone && mag);
    seed(80 + t);
    for (int ni = 0; ni < 3; ni++) {
        const int n = be == 1 ? ns_f[ni] : (int)be * ns_q[ni];
        for (int o = 0; o < MAXW; o++) {
            fill(f, n, o % 3 ? 1.0f : 0.01f);
            kn_quantize_row(t, f, w + o * ws, n);
            weight_mag(t, w + o * ws, n, wd + (size_t)o * maxn, wm + (size_t)o * maxn);
        }
        for (int r = 0; r < MAXR; r++) {
            float *xrow = xr + (size_t)r * maxn;
            if (r % 11 == 10)
                memset(xrow, 0, n * sizeof(float));
            else
                fill(xrow, n, r % 2 ? 3.0f : 1.0f);
            if (act == KN_TYPE_F32)
                memcpy(xa + r * xs, xrow, n * sizeof(float));
            else
                kn_quantize_row(act, xrow, xa + r * xs, n);
            kn_dequantize_row(act == KN_TYPE_F32 ? KN_TYPE_F32 : act, xa + r * xs, xd + (size_t)r * maxn, n);
        }
        for (int r = 0; r < MAXR; r++)
            for (int o = 0; o < MAXW; o++) {
                double m = 0;
                for (int i = 0; i < n; i++)
                    m += (double)wm[(size_t)o * maxn + i] * fabs(xd[(size_t)r * maxn + i]);
                mag[r * MAXW + o] = m;
                ref->dot[t](w + o * ws, xa + r * xs, xs, 1, n, &want[r * MAXW + o]);
            }
        for (int k = 0; k < nf; k++) {
            kn_gemm_fn g = fast[k]->gemm[t];
            if (g == NULL || g == ref->gemm[t])
                continue;
            for (int r = 0; r < MAXR; r++)
                g(w, ws, MAXW, xa + r * xs, xs, 1, n, alone + r * MAXW, MAXW);
            for (int nr = 1; nr <= MAXR; nr += nr < 10 ? 1 : 7) {
                const int n_w = nr % 2 ? MAXW : 1 + nr % MAXW;
                for (int i = 0; i < MAXR * MAXW; i++)
                    got[i] = -7.0f;
                g(w, ws, n_w, xa, xs, nr, n, got, MAXW);
                for (int r = 0; r < MAXR; r++)
                    for (int o = 0; o < MAXW; o++) {
                        const float v = got[r * MAXW + o];
                        if (r >= nr || o >= n_w) {
                            assert_true(v == -7.0f);
                            continue;
                        }
                        check_close(v, want[r * MAXW + o], 2e-6 * mag[r * MAXW + o] + 1e-30, "gemm",
                                    fast[k]->name, n, r * 100 + o);
                        if (bits_of(v) != bits_of(alone[r * MAXW + o])) {
                            print_error("%s [%s] n=%d: row %d of %d, column %d: %.9g, alone %.9g\n",
                                        kn_type_name(t), fast[k]->name, n, r, nr, o, (double)v,
                                        (double)alone[r * MAXW + o]);
                            fail();
                        }
                    }
            }
            /* the dot entry: one weight row against a few activation rows */
            float d[5];
            fast[k]->dot[t](w, xa, xs, 5, n, d);
            for (int r = 0; r < 5; r++)
                check_close(d[r], want[r * MAXW], 2e-6 * mag[r * MAXW] + 1e-30, "dot", fast[k]->name, n, r);
        }
    }
    free(mag);
    free(alone);
    free(got);
    free(want);
    free(xd);
    free(wm);
    free(wd);
    free(xr);
    free(f);
    free(xa);
    free(w);
}

static void test_gemm_types(void **state)
{
    (void)state;
    for (int k = 0; k < N_NEW_TYPES; k++)
        gemm_types_case(new_types[k].t);
    gemm_types_case(KN_TYPE_F16);
}

/* The 32-element types' gemms on rows long enough that the activation
 * terms they compute once per call come in chunks of rows (131 blocks) or
 * no longer fit their table at all (4097 blocks): against the reference
 * dot (Q4_1 and Q5_1 bit for bit), and each row's bits those of its row
 * alone. */
static void test_gemm_legacy_long_rows(void **state)
{
    (void)state;
    const kn_ops *fast[5];
    int nf = fast_tables_or_skip(fast);
    const kn_type types[] = {KN_TYPE_Q4_1, KN_TYPE_Q5_1, KN_TYPE_Q5_0, KN_TYPE_IQ4_NL};
    const int nbs[] = {131, 4097}, nrs[] = {70, 3};
    enum { NW = 3, MAXR = 70 };
    for (int ti = 0; ti < 4; ti++)
        for (int ni = 0; ni < 2; ni++) {
            const kn_type t = types[ti];
            const int n = 32 * nbs[ni], nr = nrs[ni];
            const size_t ws = kn_row_bytes(t, n), xs = kn_row_bytes(KN_TYPE_Q8_0, n) + 2;
            uint8_t *w = malloc(NW * ws), *xa = malloc((size_t)nr * xs);
            float *f = malloc((size_t)n * sizeof(float)), *want = malloc(MAXR * NW * sizeof(float));
            float *got = malloc(MAXR * NW * sizeof(float)), *alone = malloc(MAXR * NW * sizeof(float));
            float *wd = malloc((size_t)n * sizeof(float)), *wm = malloc((size_t)NW * n * sizeof(float));
            double mag[MAXR * NW];
            assert_true(w && xa && f && want && got && alone && wd && wm);
            seed(900 + t);
            for (int o = 0; o < NW; o++) {
                fill(f, n, 1.0f);
                kn_quantize_row(t, f, w + o * ws, n);
                weight_mag(t, w + o * ws, n, wd, wm + (size_t)o * n);
            }
            for (int r = 0; r < nr; r++) {
                fill(f, n, 2.0f);
                kn_quantize_row(KN_TYPE_Q8_0, f, xa + r * xs, n);
                kn_dequantize_row(KN_TYPE_Q8_0, xa + r * xs, f, n);
                for (int o = 0; o < NW; o++) {
                    kn_ops_ref()->dot[t](w + o * ws, xa + r * xs, xs, 1, n, &want[r * NW + o]);
                    mag[r * NW + o] = 0;
                    for (int i = 0; i < n; i++)
                        mag[r * NW + o] += (double)wm[(size_t)o * n + i] * fabs(f[i]);
                }
            }
            for (int k = 0; k < nf; k++) {
                kn_gemm_fn g = fast[k]->gemm[t];
                if (g == NULL)
                    continue;
                g(w, ws, NW, xa, xs, nr, n, got, NW);
                for (int r = 0; r < nr; r++) {
                    g(w, ws, NW, xa + r * xs, xs, 1, n, alone + r * NW, NW);
                    for (int o = 0; o < NW; o++) {
                        check_close(got[r * NW + o], want[r * NW + o], 1e-5 * mag[r * NW + o] + 1e-30, "gemm",
                                    fast[k]->name, n, r * 100 + o);
                        assert_true(bits_of(got[r * NW + o]) == bits_of(alone[r * NW + o]));
                        /* Q4_1's and Q5_1's take the reference's steps */
                        if (t == KN_TYPE_Q4_1 || t == KN_TYPE_Q5_1)
                            assert_true(bits_of(got[r * NW + o]) == bits_of(want[r * NW + o]));
                    }
                }
            }
            free(wm);
            free(wd);
            free(alone);
            free(got);
            free(want);
            free(f);
            free(xa);
            free(w);
        }
}

/* Every quantized type's packed gemm (kn_pack, gemm_packed) against the
 * reference dot, bit for bit: row counts that end inside a 16-row group,
 * batches of 1 to 70 rows (every chunking of the activation rows), rows of
 * one block to past a segment of the activations' sums, weights with
 * all-zero rows and extreme scales, activations with zero rows; cells
 * outside the output untouched. */
static void packed_case(const kn_ops *ops, kn_type t)
{
    enum { MAXW = 37, MAXR = 70 };
    const kn_ops *ref = kn_ops_ref();
    const kn_type act = kn_type_traits_of(t)->vec_dot_type;
    const int64_t be = kn_type_block_elems(t);
    const int nbs[] = {1, 3, be == 32 ? 131 : 35};
    const int maxn = (int)be * nbs[2];
    const size_t ws = kn_row_bytes(t, maxn), xs = kn_row_bytes(act, maxn) + 4;
    const size_t ys = MAXW + 3;
    uint8_t *w = malloc(MAXW * ws), *xa = malloc(MAXR * xs), *packed = malloc(kn_pack_bytes(t, MAXW, maxn));
    float *f = malloc(maxn * sizeof(float)), *want = malloc(MAXR * ys * sizeof(float));
    float *got = malloc(MAXR * ys * sizeof(float));
    assert_true(w && xa && packed && f && want && got);
    seed(110 + t);
    for (int ni = 0; ni < 3; ni++) {
        const int n = (int)be * nbs[ni];
        const size_t rb = kn_row_bytes(t, n);
        for (int o = 0; o < MAXW; o++) {
            if (o % 9 == 8)
                memset(f, 0, n * sizeof(float));
            else
                fill(f, n, o % 7 == 3 ? 3e4f : o % 3 ? 1.0f : 1e-3f);
            kn_quantize_row(t, f, w + o * rb, n);
        }
        if (t != KN_TYPE_Q8_0 && t != KN_TYPE_Q4_0) /* those have their own layout's test */
            assert_int_equal(kn_pack_bytes(t, MAXW, n) % (3 * 64), 0);
        kn_pack(t, w, MAXW, n, packed);
        for (int r = 0; r < MAXR; r++) {
            if (r % 11 == 10)
                memset(f, 0, n * sizeof(float));
            else
                fill(f, n, r % 2 ? 3.0f : 1.0f);
            kn_quantize_row(act, f, xa + r * xs, n);
            for (int o = 0; o < MAXW; o++)
                ref->dot[t](w + o * rb, xa + r * xs, xs, 1, n, &want[r * ys + o]);
        }
        for (int nr = 1; nr <= MAXR; nr += nr < 20 ? 1 : 7) {
            const int n_w = nr % 3 == 0 ? MAXW : nr % 3 == 1 ? 1 + nr % 16 : 16 + nr % 21;
            for (size_t i = 0; i < MAXR * ys; i++)
                got[i] = -7.0f;
            ops->gemm_packed[t](packed, n_w, xa, xs, nr, n, got, ys);
            for (int r = 0; r < MAXR; r++)
                for (int o = 0; o < (int)ys; o++) {
                    const float v = got[r * ys + o];
                    if (r >= nr || o >= n_w) {
                        assert_true(v == -7.0f);
                        continue;
                    }
                    if (bits_of(v) != bits_of(want[r * ys + o])) {
                        print_error("%s packed [%s] n=%d rows %d n_w %d: row %d column %d: %.9g, reference %.9g\n",
                                    kn_type_name(t), ops->name, n, nr, n_w, r, o, (double)v,
                                    (double)want[r * ys + o]);
                        fail();
                    }
                }
        }
    }
    free(got);
    free(want);
    free(f);
    free(packed);
    free(xa);
    free(w);
}

static void test_gemm_packed(void **state)
{
    (void)state;
    const kn_ops *fast[5];
    const int nf = fast_tables(fast);
    int ran = 0;
    for (int k = 0; k < nf; k++)
        for (uint32_t t = 0; t < KN_TYPE_COUNT; t++)
            if (fast[k]->gemm_packed[t] != NULL) {
                packed_case(fast[k], (kn_type)t);
                ran++;
            }
    /* the generic entry knows every quantized type, and no float one */
    for (uint32_t t = 0; t < KN_TYPE_COUNT; t++) {
        const kn_type_traits *tt = kn_type_traits_of(t);
        if (tt == NULL || t == KN_TYPE_Q8_K)
            continue;
        assert_true((kn_pack_bytes((kn_type)t, 17, 512) > 0) == (tt->block_elems > 1));
        if (tt->block_elems > 1) {
            assert_int_equal(kn_pack_bytes((kn_type)t, 17, 512), 2 * kn_pack_bytes((kn_type)t, 16, 512));
            assert_int_equal(kn_pack_bytes((kn_type)t, 17, 512 + 16), 0);
            assert_non_null(kn_type_name(kn_packed_type((kn_type)t)));
        }
    }
    if (ran == 0)
        skip();
}

/* The 32-element types' packed gemms where their integer sums are nearest
 * the int16 steps' limits: every quant at the largest magnitude its type
 * holds (Q5's 31, IQ4_NL's -127 and 113, MXFP4's -12 and 12; Q4_1's 15),
 * against activation blocks of +127 throughout, -127 throughout and the two
 * alternating, and random ones; bit for bit against the reference dot. */
static void test_gemm_packed_limits(void **state)
{
    (void)state;
    enum { NW = 19, NR = 9, NB = 3, N = 32 * NB };
    static const kn_type types[] = {KN_TYPE_Q4_1, KN_TYPE_Q5_0, KN_TYPE_Q5_1, KN_TYPE_IQ4_NL, KN_TYPE_MXFP4};
    /* quant bytes: index 15 twice, 0 twice, 7 twice, mixed */
    static const uint8_t qbytes[] = {0xff, 0x00, 0x77, 0xf0, 0x0f};
    const kn_ops *fast[5], *ref = kn_ops_ref();
    const int nf = fast_tables_or_skip(fast);
    const size_t xs = (size_t)NB * sizeof(kn_block_q8_0), ys = NW + 1;
    kn_block_q8_0 x[NR * NB];
    float want[NR * (NW + 1)], got[NR * (NW + 1)];
    seed(777);
    for (int r = 0; r < NR; r++)
        for (int b = 0; b < NB; b++) {
            kn_block_q8_0 *xb = &x[r * NB + b];
            xb->d = r < 6 ? 0x3c00 : (uint16_t)(rnd32() & 0x7bff);
            for (int i = 0; i < 32; i++) {
                const int alt = i % 2 ? 127 : -127;
                xb->qs[i] = (int8_t)(r % 3 == 0 ? 127 : r % 3 == 1 ? -127 : r < 6 ? alt : (int)(rnd32() % 255) - 127);
            }
        }
    int ran = 0;
    for (int ti = 0; ti < (int)(sizeof(types) / sizeof(types[0])); ti++) {
        const kn_type t = types[ti];
        const size_t bb = kn_type_block_bytes(t), ws = NB * bb;
        uint8_t *w = malloc(NW * ws), *packed = malloc(kn_pack_bytes(t, NW, N));
        assert_true(w && packed);
        for (int o = 0; o < NW; o++)
            for (int b = 0; b < NB; b++) {
                uint8_t *blk = w + o * ws + b * bb;
                for (size_t i = 0; i < bb; i++)
                    blk[i] = qbytes[(o + b) % 5];
                int d_at, m_at;
                half_fields(t, &d_at, &m_at);
                if (t == KN_TYPE_MXFP4)
                    blk[0] = (uint8_t)(120 + o % 9); /* the exponent */
                else
                    put16(blk + d_at, o % 4 ? 0x3c00 : 0xb800);
                if (m_at >= 0)
                    put16(blk + m_at, o % 2 ? 0xcc00 : 0x4400);
            }
        for (int r = 0; r < NR; r++)
            for (int o = 0; o < NW; o++)
                ref->dot[t](w + o * ws, (const char *)x + r * xs, xs, 1, N, &want[r * ys + o]);
        kn_pack(t, w, NW, N, packed);
        for (int k = 0; k < nf; k++) {
            if (fast[k]->gemm_packed[t] == NULL)
                continue;
            for (int nr = 1; nr <= NR; nr += 4) {
                fast[k]->gemm_packed[t](packed, NW, x, xs, nr, N, got, ys);
                for (int r = 0; r < nr; r++)
                    for (int o = 0; o < NW; o++)
                        if (bits_of(got[r * ys + o]) != bits_of(want[r * ys + o])) {
                            print_error("%s packed limits [%s] rows %d: row %d column %d: %.9g, reference %.9g\n",
                                        kn_type_name(t), fast[k]->name, nr, r, o, (double)got[r * ys + o],
                                        (double)want[r * ys + o]);
                            fail();
                        }
            }
            ran++;
        }
        free(packed);
        free(w);
    }
    if (ran == 0)
        skip();
}

/* MXFP4's exponent covers 2^-128..2^127 (kn_e8m0_half), past any half:
 * blocks with every exponent, the subnormal 0 and 1 and the largest
 * included, against activation blocks whose scales run from subnormal
 * halves to 2^15, so that products underflow to subnormals and zero and
 * overflow to infinities. The packed gemm gives the reference's bits (two
 * NaNs, from infinities of both signs, count as equal); the AVX2 dot and
 * gemm, which sum in another order, are within a rounding of the
 * magnitudes wherever the reference's sum stays far from overflow. */
static bool mxfp4_same(float a, float b)
{
    return bits_of(a) == bits_of(b) || (isnan(a) && isnan(b));
}

static void mxfp4_extremes_case(int nb, int *n_checked)
{
    enum { NW = 19, NR = 11 };
    static const uint8_t special[] = {0, 1, 2, 3, 100, 126, 127, 128, 129, 200, 253, 254, 255};
    const kn_ops *ref = kn_ops_ref(), *fast[5];
    const int nf = fast_tables(fast), n = 32 * nb;
    const size_t ws = (size_t)nb * sizeof(kn_block_mxfp4), xs = (size_t)nb * sizeof(kn_block_q8_0), ys = NW + 2;
    kn_block_mxfp4 *w = malloc(NW * ws);
    kn_block_q8_0 *x = malloc(NR * xs);
    uint8_t *packed = malloc(kn_pack_bytes(KN_TYPE_MXFP4, NW, n));
    float *want = malloc(NR * ys * sizeof(float)), *got = malloc(NR * ys * sizeof(float));
    double *bound = malloc(NR * ys * sizeof(double));
    assert_true(w && x && packed && want && got && bound);
    for (int o = 0; o < NW; o++)
        for (int b = 0; b < nb; b++) {
            kn_block_mxfp4 *blk = w + (size_t)o * nb + b;
            /* rows 0-12 one special exponent throughout, the rest any */
            blk->e = o < (int)sizeof(special) ? special[o] : (uint8_t)rnd32();
            for (int i = 0; i < 16; i++)
                blk->qs[i] = o == 5 ? 0 : (uint8_t)rnd32();
        }
    for (int r = 0; r < NR; r++)
        for (int b = 0; b < nb; b++) {
            kn_block_q8_0 *blk = x + (size_t)r * nb + b;
            /* exponent fields 0 (subnormal) .. 29 (2^14), any mantissa */
            blk->d = (uint16_t)((rnd32() % 30) << 10 | (rnd32() & 0x3ff));
            for (int i = 0; i < 32; i++)
                blk->qs[i] = (int8_t)(r == 3 ? 0 : (int)(rnd32() % 255) - 127);
        }
    for (int r = 0; r < NR; r++)
        for (int o = 0; o < NW; o++) {
            ref->dot[KN_TYPE_MXFP4](w + (size_t)o * nb, x + (size_t)r * nb, xs, 1, n, &want[r * ys + o]);
            double s = 0;
            for (int b = 0; b < nb; b++) {
                const kn_block_mxfp4 *wb = w + (size_t)o * nb + b;
                const kn_block_q8_0 *xb = x + (size_t)r * nb + b;
                int sumi = 0;
                for (int i = 0; i < 32; i++)
                    sumi += abs(kn_mxfp4_values[i < 16 ? wb->qs[i] & 0xf : wb->qs[i - 16] >> 4] * xb->qs[i]);
                const float dd = kn_e8m0_half(wb->e) * kn_fp16_to_fp32(xb->d); /* as both round it */
                s += isinf(dd) ? INFINITY : sumi * (double)dd;
            }
            bound[r * ys + o] = s;
        }
    kn_pack(KN_TYPE_MXFP4, w, NW, n, packed);
    for (int k = 0; k < nf; k++) {
        const kn_ops *ops = fast[k];
        if (ops->gemm_packed[KN_TYPE_MXFP4] != NULL) {
            for (int nr = 1; nr <= NR; nr += 3) {
                for (size_t i = 0; i < NR * ys; i++)
                    got[i] = -7.0f;
                ops->gemm_packed[KN_TYPE_MXFP4](packed, NW, x, xs, nr, n, got, ys);
                for (int r = 0; r < NR; r++)
                    for (int o = 0; o < (int)ys; o++) {
                        const float v = got[r * ys + o];
                        if (r >= nr || o >= NW) {
                            assert_true(v == -7.0f);
                            continue;
                        }
                        if (!mxfp4_same(v, want[r * ys + o])) {
                            print_error("mxfp4 extremes packed [%s] nb=%d rows %d: row %d column %d (e %d): "
                                        "%.9g, reference %.9g\n",
                                        ops->name, nb, nr, r, o, w[(size_t)o * nb].e, (double)v,
                                        (double)want[r * ys + o]);
                            fail();
                        }
                        (*n_checked)++;
                    }
            }
        }
        /* the dot (decode) and the unpacked gemm */
        for (int o = 0; o < NW; o++) {
            float d[NR];
            ops->dot[KN_TYPE_MXFP4](w + (size_t)o * nb, x, xs, NR, n, d);
            ops->gemm[KN_TYPE_MXFP4](w + (size_t)o * nb, ws, 1, x, xs, NR, n, got + o, ys);
            for (int r = 0; r < NR; r++) {
                const double b = bound[r * ys + o], want_v = want[r * ys + o];
                for (int which = 0; which < 2; which++) {
                    const float v = which ? got[r * ys + o] : d[r];
                    /* near overflow another order may round to infinity */
                    if (!mxfp4_same(v, want[r * ys + o]) && b <= 1e37 && !(fabs(v - want_v) <= 1e-5 * b + 1e-40)) {
                        print_error("mxfp4 extremes %s [%s] nb=%d: row %d column %d (e %d): %.9g, reference %.9g\n",
                                    which ? "gemm" : "dot", ops->name, nb, r, o, w[(size_t)o * nb].e, (double)v,
                                    want_v);
                        fail();
                    }
                    (*n_checked)++;
                }
            }
        }
    }
    free(bound);
    free(got);
    free(want);
    free(packed);
    free(x);
    free(w);
}

static void test_mxfp4_extremes(void **state)
{
    (void)state;
    const kn_ops *fast[5];
    fast_tables_or_skip(fast);
    /* the exponent bytes as the reference reads them: both subnormals, the
     * normal range's ends */
    assert_true(kn_e8m0_half(0) == ldexpf(1.0f, -128) && kn_e8m0_half(1) == ldexpf(1.0f, -127));
    assert_true(kn_e8m0_half(2) == ldexpf(1.0f, -126) && kn_e8m0_half(255) == ldexpf(1.0f, 127));
    seed(4242);
    int checked = 0;
    const int nbs[] = {1, 2, 5, 33};
    for (int i = 0; i < 4; i++)
        mxfp4_extremes_case(nbs[i], &checked);
    assert_true(checked > 0);
}

/* kn_matmul on every type, through a context of each backend and two
 * threads, against the reference dots. */
static void test_matmul_types(void **state)
{
    (void)state;
    enum { N_OUT = 37, N_IN = 512, ROWS = 21 };
    const kn_backend backends[] = {KN_BACKEND_REF, KN_BACKEND_AUTO};
    float *x = malloc(ROWS * N_IN * sizeof(float)), *f = malloc(N_IN * sizeof(float));
    float *y = malloc(ROWS * N_OUT * sizeof(float)), *y1 = malloc(N_OUT * sizeof(float));
    uint8_t *w = malloc(N_OUT * kn_row_bytes(KN_TYPE_F32, N_IN));
    uint8_t *xa = malloc(kn_row_bytes(KN_TYPE_F32, N_IN));
    float *wd = malloc(N_IN * sizeof(float)), *wm = malloc(N_IN * sizeof(float)), *xd = malloc(N_IN * sizeof(float));
    assert_true(x && f && y && y1 && w && xa && wd && wm && xd);
    seed(90);
    fill(x, ROWS * N_IN, 1.0f);
    for (int b = 0; b < 2; b++) {
        kn_ctx *ctx = kn_ctx_new(2, backends[b]);
        assert_non_null(ctx);
        for (int k = 0; k <= N_NEW_TYPES; k++) {
            const kn_type t = k < N_NEW_TYPES ? new_types[k].t : KN_TYPE_F16;
            const size_t rb = kn_row_bytes(t, N_IN);
            const kn_type act = kn_type_traits_of(t)->vec_dot_type;
            for (int o = 0; o < N_OUT; o++) {
                fill(f, N_IN, 1.0f);
                kn_quantize_row(t, f, w + o * rb, N_IN);
            }
            assert_int_equal(kn_matmul(ctx, w, t, N_OUT, N_IN, x, ROWS, y), 0);
            for (int r = 0; r < ROWS; r++) {
                if (act == KN_TYPE_F32)
                    memcpy(xa, x + r * N_IN, N_IN * sizeof(float));
                else
                    kn_quantize_row(act, x + r * N_IN, xa, N_IN);
                kn_dequantize_row(act, xa, xd, N_IN);
                for (int o = 0; o < N_OUT; o++) {
                    float want;
                    kn_ops_ref()->dot[t](w + o * rb, xa, 0, 1, N_IN, &want);
                    weight_mag(t, w + o * rb, N_IN, wd, wm);
                    double mag = 0;
                    for (int i = 0; i < N_IN; i++)
                        mag += (double)wm[i] * fabs(xd[i]);
                    check_close(y[r * N_OUT + o], want, 2e-6 * mag + 1e-30, "matmul", kn_type_name(t), N_IN, r);
                }
                /* the row alone: the same bits */
                assert_int_equal(kn_matmul(ctx, w, t, N_OUT, N_IN, x + r * N_IN, 1, y1), 0);
                assert_memory_equal(y1, y + r * N_OUT, N_OUT * sizeof(float));
            }
        }
        kn_ctx_free(ctx);
    }
    free(xd);
    free(wm);
    free(wd);
    free(xa);
    free(w);
    free(y1);
    free(y);
    free(f);
    free(x);
}

static void test_elementwise(void **state)
{
    (void)state;
    const kn_ops *fast[5];
    int nf = fast_tables_or_skip(fast);
    const kn_ops *ref = kn_ops_ref();
    enum { MAXN = 4095 };
    float *x = malloc(MAXN * sizeof(float)), *g = malloc(MAXN * sizeof(float));
    float *a = malloc(MAXN * sizeof(float)), *b = malloc(MAXN * sizeof(float));
    float *u = malloc(MAXN * sizeof(float));
    assert_non_null(x);
    assert_non_null(g);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(u);
    seed(5);
    for (int k = 0; k < (int)(sizeof(f_sizes) / sizeof(f_sizes[0])); k++) {
        int n = f_sizes[k];
        for (int t = 0; t < nf; t++) {
            const char *nm = fast[t]->name;
            /* rmsnorm, out of place and in place */
            fill(x, n, 3.0f);
            fill(g, n, 1.5f);
            ref->rmsnorm(a, x, g, n, 1e-5f);
            fast[t]->rmsnorm(b, x, g, n, 1e-5f);
            for (int i = 0; i < n; i++)
                check_close(b[i], a[i], 1e-5 * fabs(a[i]) + 1e-6, "rmsnorm", nm, n, i);
            memcpy(b, x, n * sizeof(float));
            fast[t]->rmsnorm(b, b, g, n, 1e-5f);
            for (int i = 0; i < n; i++)
                check_close(b[i], a[i], 1e-5 * fabs(a[i]) + 1e-6, "rmsnorm in place", nm, n, i);

            /* softmax over a wide range, with masked (-inf) entries */
            fill(x, n, 40.0f);
            for (int i = 3; i < n; i += 11)
                x[i] = -INFINITY;
            x[0] = 10.0f; /* at least one finite entry */
            memcpy(a, x, n * sizeof(float));
            memcpy(b, x, n * sizeof(float));
            ref->softmax(a, n);
            fast[t]->softmax(b, n);
            double sum = 0;
            for (int i = 0; i < n; i++) {
                check_close(b[i], a[i], 1e-5 * a[i] + 1e-7, "softmax", nm, n, i);
                sum += b[i];
            }
            assert_true(fabs(sum - 1.0) < 1e-4);

            /* far below the maximum (a low temperature, masked tokens): 0 or
             * a normal float, never a subnormal, which costs a microcode
             * assist where it is made */
            fill(x, n, 100.0f);
            for (int i = 0; i < n; i++)
                x[i] -= 150.0f;
            x[0] = 0.0f;
            memcpy(a, x, n * sizeof(float));
            memcpy(b, x, n * sizeof(float));
            ref->softmax(a, n);
            fast[t]->softmax(b, n);
            for (int i = 0; i < n; i++) {
                if (fpclassify(b[i]) == FP_SUBNORMAL)
                    fail_msg("softmax %s n=%d [%d]: subnormal %g from %g", nm, n, i, b[i], x[i]);
                check_close(b[i], a[i], 1e-5 * a[i] + 1e-37, "softmax far", nm, n, i);
            }

            /* silu(gate) * up, including saturating gates */
            fill(x, n, 12.0f);
            if (n > 4) {
                x[1] = -100.0f;
                x[2] = 100.0f;
                x[3] = -88.5f;
                x[4] = 0.0f;
            }
            fill(u, n, 2.0f);
            memcpy(a, x, n * sizeof(float));
            memcpy(b, x, n * sizeof(float));
            ref->silu_mul(a, u, n);
            fast[t]->silu_mul(b, u, n);
            for (int i = 0; i < n; i++)
                check_close(b[i], a[i], 2e-6 * fabs(a[i]) + 1e-30, "silu_mul", nm, n, i);
        }
    }
    free(u);
    free(b);
    free(a);
    free(g);
    free(x);
}

/* kv_accum's result (acc0 plus the rows v, as floats, weighted by w)
 * against the reference's, to a tolerance scaled by the terms' sizes. */
static void check_kv_accum(const char *what, const char *table, const float *got, const float *want,
                           const float *acc0, const float *w, const float *v, int n, int hd)
{
    for (int i = 0; i < hd; i++) {
        double mag = fabs(acc0[i]);
        for (int r = 0; r < n; r++)
            mag += fabs((double)w[r] * v[(size_t)r * hd + i]);
        check_close(got[i], want[i], 1e-5 * mag + 1e-30, what, table, hd, i);
    }
}

/* The two-row KV ops (two query rows over the same K, two weight rows over
 * the same V), on random data of odd widths and row counts: bit for bit
 * what the one-row ops give each row (the scores a row gets must not
 * depend on the rows it is computed beside: the prefix cache's answers are
 * those of a whole prompt's), and so within the reference's tolerance. */
static void test_kv_ops_two_rows(void **state)
{
    (void)state;
    const kn_ops *fast[5];
    int nf = fast_tables_or_skip(fast);
    const kn_ops *ref = kn_ops_ref();
    enum { MAXR = 40, MAXHD = 136, PAD = 3 };
    const int hds[] = {1, 7, 8, 13, 31, 32, 40, 64, 65, 72, 100, 128, 136},
              rows[] = {1, 3, 4, 7, 8, 9, 12, 16, 17, 40};
    uint16_t *kv = malloc((size_t)MAXR * (MAXHD + PAD) * sizeof(uint16_t));
    float *q = malloc(2 * MAXHD * sizeof(float)), *w = malloc(2 * MAXR * sizeof(float));
    float *one = malloc(2 * MAXHD * sizeof(float)), *two = malloc(2 * MAXHD * sizeof(float));
    float *want = malloc(MAXHD * sizeof(float)), *acc0 = malloc(2 * MAXHD * sizeof(float));
    float *vf = malloc((size_t)MAXR * MAXHD * sizeof(float));
    assert_true(kv && q && w && one && two && want && acc0 && vf);
    seed(23);
    int tested = 0;
    for (int hi = 0; hi < (int)(sizeof(hds) / sizeof(hds[0])); hi++)
        for (int ri = 0; ri < (int)(sizeof(rows) / sizeof(rows[0])); ri++) {
            const int hd = hds[hi], n = rows[ri];
            const size_t stride = (size_t)hd + (size_t)(ri % 2) * PAD;
            for (size_t i = 0; i < (size_t)n * stride; i++)
                kv[i] = kn_fp32_to_fp16(frand() * 4.0f);
            for (int r = 0; r < n; r++)
                kn_dequantize_row(KN_TYPE_F16, kv + (size_t)r * stride, vf + (size_t)r * hd, hd);
            fill(q, 2 * (size_t)hd, 3.0f);
            fill(w, 2 * (size_t)n, 1.0f);
            fill(acc0, 2 * (size_t)hd, 2.0f);
            for (int t = 0; t < nf; t++) {
                const kn_ops *o = fast[t];
                if (!o->kv_scores2 || !o->kv_accum2)
                    continue;
                tested++;
                o->kv_scores(q, kv, stride, n, hd, 0.125f, one);
                o->kv_scores(q + hd, kv, stride, n, hd, 0.125f, one + n);
                o->kv_scores2(q, q + hd, kv, stride, n, hd, 0.125f, two, two + n);
                assert_memory_equal(one, two, 2 * (size_t)n * sizeof(float));
                for (int k = 0; k < 2; k++) {
                    ref->kv_scores(q + (size_t)k * hd, kv, stride, n, hd, 0.125f, want);
                    for (int r = 0; r < n; r++) {
                        double mag = 0;
                        for (int i = 0; i < hd; i++)
                            mag += fabs((double)q[(size_t)k * hd + i] * vf[(size_t)r * hd + i]);
                        check_close(two[(size_t)k * n + r], want[r], 1e-5 * mag + 1e-30, "kv_scores2",
                                    o->name, hd, r);
                    }
                }
                memcpy(one, acc0, 2 * (size_t)hd * sizeof(float));
                memcpy(two, acc0, 2 * (size_t)hd * sizeof(float));
                o->kv_accum(one, w, kv, stride, n, hd);
                o->kv_accum(one + hd, w + n, kv, stride, n, hd);
                o->kv_accum2(two, two + hd, w, w + n, kv, stride, n, hd);
                assert_memory_equal(one, two, 2 * (size_t)hd * sizeof(float));
                for (int k = 0; k < 2; k++) {
                    memcpy(want, acc0 + (size_t)k * hd, (size_t)hd * sizeof(float));
                    ref->kv_accum(want, w + (size_t)k * n, kv, stride, n, hd);
                    check_kv_accum("kv_accum2", o->name, two + (size_t)k * hd, want, acc0 + (size_t)k * hd,
                                   w + (size_t)k * n, vf, n, hd);
                }
            }
        }
    free(vf);
    free(acc0);
    free(want);
    free(two);
    free(one);
    free(w);
    free(q);
    free(kv);
    if (!tested)
        skip();
}

/* The KV cache ops: scores and weighted sums over strided half rows of
 * every width (vector multiples and tails), weighted sums over Q8_0 rows,
 * and the float-to-half store, bit for bit, over random bit patterns from
 * subnormal to overflow. */
static void test_kv_ops(void **state)
{
    (void)state;
    const kn_ops *fast[5];
    int nf = fast_tables_or_skip(fast);
    const kn_ops *ref = kn_ops_ref();
    enum { MAXR = 40, MAXHD = 136, STRIDE_PAD = 5 };
    const int hds[] = {1, 7, 8, 31, 64, 65, 128, 136}, rows[] = {1, 7, 8, 9, 16, 17, 40};
    uint16_t *kv = malloc((size_t)MAXR * (MAXHD + STRIDE_PAD) * sizeof(uint16_t));
    float *q = malloc(MAXHD * sizeof(float)), *w = malloc(MAXR * sizeof(float));
    float *want = malloc(MAXHD * sizeof(float)), *got = malloc(MAXHD * sizeof(float));
    float *acc0 = malloc(MAXHD * sizeof(float)), *vf = malloc((size_t)MAXR * MAXHD * sizeof(float));
    assert_non_null(vf);
    assert_non_null(kv);
    assert_non_null(q);
    assert_non_null(w);
    assert_non_null(want);
    assert_non_null(got);
    assert_non_null(acc0);
    seed(21);
    for (int hi = 0; hi < (int)(sizeof(hds) / sizeof(hds[0])); hi++) {
        for (int ri = 0; ri < (int)(sizeof(rows) / sizeof(rows[0])); ri++) {
            const int hd = hds[hi], n = rows[ri];
            const size_t stride = (size_t)hd + (size_t)(ri % 2) * STRIDE_PAD;
            for (size_t i = 0; i < (size_t)n * stride; i++)
                kv[i] = kn_fp32_to_fp16(frand() * 4.0f);
            for (int r = 0; r < n; r++)
                kn_dequantize_row(KN_TYPE_F16, kv + (size_t)r * stride, vf + (size_t)r * hd, hd);
            fill(q, hd, 3.0f);
            fill(w, n, 1.0f);
            fill(acc0, hd, 2.0f);
            for (int t = 0; t < nf; t++) {
                const char *nm = fast[t]->name;
                ref->kv_scores(q, kv, stride, n, hd, 0.125f, want);
                fast[t]->kv_scores(q, kv, stride, n, hd, 0.125f, got);
                for (int r = 0; r < n; r++) {
                    double mag = 0;
                    for (int i = 0; i < hd; i++)
                        mag += fabs((double)q[i] * kn_fp16_to_fp32(kv[(size_t)r * stride + i]));
                    check_close(got[r], want[r], 1e-5 * mag + 1e-30, "kv_scores", nm, hd, r);
                }
                memcpy(want, acc0, (size_t)hd * sizeof(float));
                memcpy(got, acc0, (size_t)hd * sizeof(float));
                ref->kv_accum(want, w, kv, stride, n, hd);
                fast[t]->kv_accum(got, w, kv, stride, n, hd);
                check_kv_accum("kv_accum", nm, got, want, acc0, w, vf, n, hd);
            }
        }
    }

    /* kv_accum over Q8_0 rows, strides with and without padding */
    const int qhds[] = {32, 64, 96, 128};
    kn_block_q8_0 *qkv = malloc((size_t)MAXR * (MAXHD / KN_QK8_0 + 1) * sizeof(kn_block_q8_0));
    assert_non_null(qkv);
    for (int hi = 0; hi < (int)(sizeof(qhds) / sizeof(qhds[0])); hi++) {
        for (int ri = 0; ri < (int)(sizeof(rows) / sizeof(rows[0])); ri++) {
            const int hd = qhds[hi], n = rows[ri];
            const size_t stride = kn_row_bytes(KN_TYPE_Q8_0, hd) + (size_t)(ri % 2) * 6; /* bytes */
            for (int r = 0; r < n; r++) {
                fill(vf, hd, 4.0f);
                kn_quantize_row(KN_TYPE_Q8_0, vf, (char *)qkv + (size_t)r * stride, hd);
            }
            for (int r = 0; r < n; r++)
                kn_dequantize_row(KN_TYPE_Q8_0, (char *)qkv + (size_t)r * stride, vf + (size_t)r * hd, hd);
            fill(w, n, 1.0f);
            fill(acc0, hd, 2.0f);
            for (int t = 0; t < nf; t++) {
                memcpy(want, acc0, (size_t)hd * sizeof(float));
                memcpy(got, acc0, (size_t)hd * sizeof(float));
                ref->kv_accum_q8_0(want, w, qkv, stride, n, hd);
                fast[t]->kv_accum_q8_0(got, w, qkv, stride, n, hd);
                check_kv_accum("kv_accum_q8_0", fast[t]->name, got, want, acc0, w, vf, n, hd);
            }
        }
    }
    free(qkv);

    enum { NF = 4099 };
    float *x = malloc(NF * sizeof(float));
    uint16_t *hw = malloc(NF * sizeof(uint16_t)), *hg = malloc(NF * sizeof(uint16_t));
    assert_non_null(x);
    assert_non_null(hw);
    assert_non_null(hg);
    for (int rep = 0; rep < 64; rep++) {
        for (int i = 0; i < NF; i++) {
            /* exponents 2^-30 .. 2^17: zero, subnormal, normal, overflow */
            uint32_t e = 97 + rnd32() % 48, u = (rnd32() & 0x807fffffu) | (e << 23);
            x[i] = f32_of(u);
        }
        x[0] = INFINITY;
        x[1] = -0.0f;
        x[2] = 65519.996f; /* rounds down to the largest half */
        x[3] = 65520.0f;   /* the tie, rounds up to infinity */
        for (int t = 0; t < nf; t++) {
            const int n = NF - rep % 9; /* tails of every length */
            ref->to_f16(x, hw, n);
            fast[t]->to_f16(x, hg, n);
            for (int i = 0; i < n; i++)
                if (hg[i] != hw[i]) {
                    print_error("to_f16 [%s] %.9g: got %04x want %04x\n", fast[t]->name, (double)x[i], hg[i],
                                hw[i]);
                    fail();
                }
        }
    }
    free(hg);
    free(hw);
    free(x);
    free(vf);
    free(acc0);
    free(got);
    free(want);
    free(w);
    free(q);
    free(kv);
}

/* ---- context operations ----------------------------------------------------- */

static void test_matmul(void **state)
{
    (void)state;
    const kn_backend fast_backends[] = {KN_BACKEND_AVX2, KN_BACKEND_AVXVNNI, KN_BACKEND_AVX512VNNI,
                                        KN_BACKEND_AMX};
    const kn_type types[] = {KN_TYPE_F32, KN_TYPE_F16, KN_TYPE_Q8_0, KN_TYPE_Q4_0};
    const int rows[] = {1, 2, 3, 4, 5, 7, 8, 13, 33, 64, 65};
    enum { N_ROWS = sizeof(rows) / sizeof(rows[0]) };
    /* 1056: 33 blocks, more than one segment of the batched kernels */
    const int n_out = 37, n_in_q = 1056, n_in_f = 77;
    kn_ctx *ref = kn_ctx_new(1, KN_BACKEND_REF);
    assert_non_null(ref);
    float *w = malloc((size_t)n_out * n_in_q * sizeof(float));
    float *x = malloc((size_t)65 * n_in_q * sizeof(float));
    void *wq = malloc((size_t)n_out * n_in_q * sizeof(float));
    float *yr = malloc((size_t)65 * n_out * sizeof(float)), *yf = malloc((size_t)65 * n_out * sizeof(float));
    float *y1 = malloc((size_t)n_out * sizeof(float));
    float *wd = malloc((size_t)n_out * n_in_q * sizeof(float));
    assert_non_null(w);
    assert_non_null(x);
    assert_non_null(wq);
    assert_non_null(yr);
    assert_non_null(yf);
    assert_non_null(y1);
    assert_non_null(wd);
    seed(6);
    fill(w, (size_t)n_out * n_in_q, 1.0f);
    fill(x, (size_t)65 * n_in_q, 1.0f);
    int ran = 0;
    for (int bi = 0; bi < 4; bi++) {
        for (int nt = 1; nt <= 3; nt += 2) {
            kn_ctx *ctx = kn_ctx_new(nt, fast_backends[bi]);
            if (ctx == NULL)
                continue;
            ran++;
            assert_int_equal(kn_ctx_threads(ctx), nt);
            for (int ti = 0; ti < 4; ti++) {
                kn_type t = types[ti];
                int n_in = (t == KN_TYPE_F32 || t == KN_TYPE_F16) ? n_in_f : n_in_q;
                size_t rb = kn_row_bytes(t, n_in);
                for (int o = 0; o < n_out; o++) {
                    kn_quantize_row(t, w + (size_t)o * n_in, (char *)wq + o * rb, n_in);
                    kn_dequantize_row(t, (char *)wq + o * rb, wd + (size_t)o * n_in, n_in);
                }
                for (int ri = 0; ri < N_ROWS; ri++) {
                    int nr = rows[ri];
                    memset(yf, 0xff, (size_t)nr * n_out * sizeof(float));
                    assert_int_equal(kn_matmul(ref, wq, t, n_out, n_in, x, nr, yr), 0);
                    assert_int_equal(kn_matmul(ctx, wq, t, n_out, n_in, x, nr, yf), 0);
                    for (int r = 0; r < nr; r++) {
                        for (int o = 0; o < n_out; o++) {
                            double mag = 0;
                            for (int i = 0; i < n_in; i++)
                                mag += fabs((double)wd[(size_t)o * n_in + i] * x[(size_t)r * n_in + i]);
                            check_close(yf[(size_t)r * n_out + o], yr[(size_t)r * n_out + o], 1e-5 * mag,
                                        kn_type_name(t), kn_ctx_ops(ctx)->name, nr, r * n_out + o);
                        }
                    }
                    /* three products of one input in one call: the bits of
                     * three calls (outputs of 37, 20 and 1 rows) */
                    float *ym = malloc((size_t)nr * (n_out + 20 + 1) * sizeof(float));
                    float *ys = malloc((size_t)nr * n_out * sizeof(float));
                    assert_non_null(ym);
                    assert_non_null(ys);
                    const kn_mm_out outs[3] = {{wq, n_out, ym},
                                               {(char *)wq + 5 * rb, 20, ym + (size_t)nr * n_out},
                                               {(char *)wq + 30 * rb, 1, ym + (size_t)nr * (n_out + 20)}};
                    assert_int_equal(kn_matmul_n(ctx, t, n_in, x, nr, outs, 3), 0);
                    for (int k = 0; k < 3; k++) {
                        assert_int_equal(kn_matmul(ctx, outs[k].w, t, outs[k].n_out, n_in, x, nr, ys), 0);
                        assert_memory_equal(outs[k].y, ys, (size_t)nr * outs[k].n_out * sizeof(float));
                    }
                    free(ys);
                    free(ym);
                    const bool q8 = t == KN_TYPE_Q8_0;
                    if ((q8 && kn_ctx_ops(ctx)->gemm_q8_0_p16 != NULL) ||
                        (t == KN_TYPE_Q4_0 && kn_ctx_ops(ctx)->gemm_q4_0_p16 != NULL)) {
                        /* packed, through the context's chunking and threads:
                         * the bits of the unpacked matmul */
                        void *wp =
                            malloc(q8 ? kn_pack_q8_0_bytes(n_out, n_in) : kn_pack_q4_0_bytes(n_out, n_in));
                        float *yp = malloc((size_t)nr * n_out * sizeof(float));
                        assert_non_null(wp);
                        assert_non_null(yp);
                        if (q8)
                            kn_pack_q8_0(wq, n_out, n_in, wp);
                        else
                            kn_pack_q4_0(wq, n_out, n_in, wp);
                        const kn_mm_out po = {wp, n_out, yp};
                        assert_int_equal(
                            kn_matmul_n(ctx, q8 ? KN_TYPE_Q8_0_P16 : KN_TYPE_Q4_0_P16, n_in, x, nr, &po, 1),
                            0);
                        assert_memory_equal(yp, yf, (size_t)nr * n_out * sizeof(float));
                        free(yp);
                        free(wp);
                    }
                    /* a row's result does not depend on the batch: the same
                     * bits as the row alone, whatever the threads did (F32
                     * and F16 too, so batched greedy decoding of a float
                     * model equals the sequence alone) */
                    for (int r = 0; r < nr; r += 1 + nr / 8) {
                        assert_int_equal(kn_matmul(ctx, wq, t, n_out, n_in, x + (size_t)r * n_in, 1, y1), 0);
                        assert_memory_equal(y1, yf + (size_t)r * n_out, (size_t)n_out * sizeof(float));
                    }
                }
            }
            /* bad input changes nothing and says why */
            assert_int_equal(kn_matmul(ctx, wq, KN_TYPE_Q8_0, n_out, 33, x, 1, yf), -EINVAL);
            assert_int_equal(kn_matmul(ctx, wq, (kn_type)4, n_out, 32, x, 1, yf), -EINVAL); /* no type 4 */
            assert_int_equal(kn_matmul(ctx, wq, KN_TYPE_Q8_0, n_out, 32, x, 0, yf), 0);
            const kn_mm_out five[5] = {{wq, 1, yf}, {wq, 1, yf}, {wq, 1, yf}, {wq, 1, yf}, {wq, 1, yf}};
            assert_int_equal(kn_matmul_n(ctx, KN_TYPE_Q8_0, 32, x, 1, five, 5), -EINVAL);
            assert_int_equal(kn_matmul_n(ctx, KN_TYPE_Q8_0, 32, x, 1, five, 0), -EINVAL);
            if (kn_ctx_ops(ctx)->gemm_q8_0_p16 == NULL) /* packed rows need the packed gemm */
                assert_int_equal(kn_matmul_n(ctx, KN_TYPE_Q8_0_P16, 32, x, 1, five, 1), -EINVAL);
            kn_ctx_free(ctx);
        }
    }
    free(wd);
    free(y1);
    free(yf);
    free(yr);
    free(wq);
    free(x);
    free(w);
    kn_ctx_free(ref);
    if (ran == 0)
        skip();
}

/* RoPE as the header defines it, in double: a base, a linear scale and
 * per-pair frequency factors (Llama 3.1's rope_freqs). */
static void rope_naive(float *x, int n_rows, const int32_t *pos, int n_heads, int head_dim, int rope_dim,
                       float base, float scale, const float *factors, bool neox)
{
    for (int r = 0; r < n_rows; r++)
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((size_t)r * n_heads + h) * head_dim;
            for (int i = 0; i < rope_dim / 2; i++) {
                double th = pos[r] * pow(base, -2.0 * i / rope_dim) / scale / (factors ? factors[i] : 1.0);
                int a = neox ? i : 2 * i, b = neox ? i + rope_dim / 2 : 2 * i + 1;
                double x0 = v[a], x1 = v[b];
                v[a] = (float)(x0 * cos(th) - x1 * sin(th));
                v[b] = (float)(x0 * sin(th) + x1 * cos(th));
            }
        }
}

static void test_rope(void **state)
{
    (void)state;
    enum { ROWS = 7, HEADS = 3, HD = 64 };
    const int dims[] = {64, 32};
    int32_t pos[ROWS];
    float *x = malloc(ROWS * HEADS * HD * sizeof(float));
    float *a = malloc(ROWS * HEADS * HD * sizeof(float)), *b = malloc(ROWS * HEADS * HD * sizeof(float));
    assert_non_null(x);
    assert_non_null(a);
    assert_non_null(b);
    kn_ctx *ctx = kn_ctx_new(2, KN_BACKEND_AUTO);
    assert_non_null(ctx);
    seed(7);
    /* inv_freq per rope_dim: plain, and scaled by 4 with random factors in [1, 8] */
    static double inv[2][2][HD / 2];
    float factors[HD / 2];
    for (int i = 0; i < HD / 2; i++)
        factors[i] = 1.0f + 7.0f * (float)(rnd32() % 1000) / 999.0f;
    for (int di = 0; di < 2; di++) {
        kn_rope_inv_freq(inv[di][0], dims[di], 10000.0f, 1.0f, NULL);
        kn_rope_inv_freq(inv[di][1], dims[di], 10000.0f, 4.0f, factors);
    }
    for (int neox = 0; neox < 2; neox++) {
        for (int di = 0; di < 2; di++) {
            for (int fv = 0; fv < 2; fv++) {
                for (int rep = 0; rep < 2; rep++) {
                    /* the same array refilled: the context's angle cache must see it */
                    for (int r = 0; r < ROWS; r++)
                        pos[r] = (int32_t)(rnd32() % 5000);
                    pos[0] = 0;
                    fill(x, ROWS * HEADS * HD, 1.0f);
                    memcpy(a, x, ROWS * HEADS * HD * sizeof(float));
                    memcpy(b, x, ROWS * HEADS * HD * sizeof(float));
                    kn_rope_ref(a, ROWS, pos, HEADS, HD, dims[di], inv[di][fv], neox);
                    kn_rope(ctx, b, ROWS, pos, HEADS, HD, dims[di], inv[di][fv], neox);
                    rope_naive(x, ROWS, pos, HEADS, HD, dims[di], 10000.0f, fv ? 4.0f : 1.0f,
                               fv ? factors : NULL, neox);
                    for (int i = 0; i < ROWS * HEADS * HD; i++) {
                        check_close(b[i], a[i], 1e-6, "rope vs ref", neox ? "neox" : "llama", dims[di], i);
                        check_close(a[i], x[i], 2e-6, "rope_ref vs naive", neox ? "neox" : "llama", dims[di],
                                    i);
                    }
                }
            }
        }
    }
    /* unrotated tail of a partial rope_dim keeps its exact bits */
    for (int r = 0; r < ROWS; r++)
        pos[r] = r * 100 + 3;
    fill(x, ROWS * HEADS * HD, 1.0f);
    memcpy(b, x, ROWS * HEADS * HD * sizeof(float));
    kn_rope(ctx, b, ROWS, pos, HEADS, HD, 32, inv[1][0], true);
    for (int r = 0; r < ROWS; r++)
        for (int h = 0; h < HEADS; h++)
            for (int i = 32; i < HD; i++) {
                size_t k = ((size_t)r * HEADS + h) * HD + i;
                assert_true(bits_of(b[k]) == bits_of(x[k]));
            }
    kn_ctx_free(ctx);
    free(b);
    free(a);
    free(x);
}

/* One head's K or V row of a paged cache as floats. */
static void kv_row(const kn_attn_seq *s, size_t off, int g, int p, int hd, float *dst)
{
    const size_t rw = kn_kv_row_units(s->kv_type, hd);
    const uint16_t *r = s->blocks[p / s->block_tokens] + off + ((size_t)g * s->block_tokens + p % s->block_tokens) * rw;
    kn_dequantize_row(s->kv_type, r, dst, hd);
}

/* Naive causal GQA attention over the paged cache, in double. Over a Q8_0
 * cache the query is rounded through Q8_0 first, as the kernel's is. */
static void attention_naive(const kn_attn_seq *s, int n_head, int n_kv_head, int hd, float scale, float *out)
{
    const int group = n_head / n_kv_head;
    float *row = malloc((size_t)hd * sizeof(float)), *qr = malloc((size_t)hd * sizeof(float));
    kn_block_q8_0 *qq = malloc((size_t)(hd / KN_QK8_0 + 1) * sizeof(kn_block_q8_0));
    assert_non_null(row);
    assert_non_null(qr);
    assert_non_null(qq);
    for (int j = 0; j < s->n_q; j++) {
        const int n_ctx = s->pos0 + j + 1;
        for (int h = 0; h < n_head; h++) {
            const float *q = s->q + ((size_t)j * n_head + h) * hd;
            memcpy(qr, q, (size_t)hd * sizeof(float));
            if (s->kv_type == KN_TYPE_Q8_0) {
                kn_quantize_row(KN_TYPE_Q8_0, q, qq, hd);
                kn_dequantize_row(KN_TYPE_Q8_0, qq, qr, hd);
            }
            double *sc = malloc((size_t)n_ctx * sizeof(double)), mx = -INFINITY, sum = 0;
            double *o = calloc((size_t)hd, sizeof(double));
            assert_non_null(sc);
            assert_non_null(o);
            for (int p = 0; p < n_ctx; p++) {
                kv_row(s, s->k_off, h / group, p, hd, row);
                double d = 0;
                for (int i = 0; i < hd; i++)
                    d += (double)qr[i] * row[i];
                sc[p] = d * scale;
                mx = sc[p] > mx ? sc[p] : mx;
            }
            for (int p = 0; p < n_ctx; p++)
                sum += (sc[p] = exp(sc[p] - mx));
            for (int p = 0; p < n_ctx; p++) {
                kv_row(s, s->v_off, h / group, p, hd, row);
                for (int i = 0; i < hd; i++)
                    o[i] += sc[p] / sum * row[i];
            }
            for (int i = 0; i < hd; i++)
                out[((size_t)j * n_head + h) * hd + i] = (float)o[i];
            free(o);
            free(sc);
        }
    }
    free(qq);
    free(qr);
    free(row);
}

/* Random K and V rows into every block, stored as kv_type. */
static void fill_kv_blocks(uint16_t **blocks, int n_blocks, size_t blk_units, kn_type kv_type, int hd)
{
    const size_t rw = kn_kv_row_units(kv_type, hd);
    float *x = malloc((size_t)hd * sizeof(float));
    assert_non_null(x);
    for (int i = 0; i < n_blocks; i++)
        for (size_t r = 0; r < blk_units / rw; r++) {
            fill(x, (size_t)hd, 1.0f);
            kn_quantize_row(kv_type, x, blocks[i] + r * rw, hd);
        }
    free(x);
}

static void attention_case(kn_type kv_type, const int HD)
{
    enum { NH = 8, NKV = 2, BT = 16, NBLK = 12, NSEQ = 3 };
    const size_t kv_units = NKV * kn_kv_row_units(kv_type, HD);
    const size_t blk_elems = (size_t)BT * kv_units * 2; /* K rows then V rows */
    uint16_t *blocks[NBLK];
    seed(8);
    for (int i = 0; i < NBLK; i++) {
        blocks[i] = malloc(blk_elems * sizeof(uint16_t));
        assert_non_null(blocks[i]);
    }
    fill_kv_blocks(blocks, NBLK, blk_elems, kv_type, HD);
    /* block tables in scrambled order; pos0 > 0 and spans crossing blocks */
    uint16_t *table[NSEQ][4] = {
        {blocks[7], blocks[2], blocks[9], blocks[0]},
        {blocks[5], blocks[11], blocks[1], blocks[3]},
        {blocks[4], blocks[8], blocks[6], blocks[10]},
    };
    const int n_q[NSEQ] = {1, 5, 20}, pos0[NSEQ] = {40, 13, 0};
    kn_attn_seq seqs[NSEQ];
    float *q[NSEQ], *out[NSEQ], *want[NSEQ];
    for (int s = 0; s < NSEQ; s++) {
        size_t nf = (size_t)n_q[s] * NH * HD;
        q[s] = malloc(nf * sizeof(float));
        out[s] = malloc(nf * sizeof(float));
        want[s] = malloc(nf * sizeof(float));
        assert_non_null(q[s]);
        assert_non_null(out[s]);
        assert_non_null(want[s]);
        fill(q[s], nf, 2.0f);
        seqs[s] = (kn_attn_seq){.q = q[s],
                                .out = out[s],
                                .n_q = n_q[s],
                                .pos0 = pos0[s],
                                .blocks = table[s],
                                .k_off = 0,
                                .v_off = (size_t)BT * kv_units,
                                .block_tokens = BT,
                                .kv_type = kv_type};
    }
    const float scale = 1.0f / sqrtf((float)HD);
    for (int s = 0; s < NSEQ; s++)
        attention_naive(&seqs[s], NH, NKV, HD, scale, want[s]);

    const kn_backend backends[] = {KN_BACKEND_REF, KN_BACKEND_AVX2, KN_BACKEND_AVXVNNI,
                                   KN_BACKEND_AVX512VNNI, KN_BACKEND_AMX};
    for (int bi = 0; bi < 5; bi++) {
        for (int nt = 1; nt <= 3; nt += 2) {
            kn_ctx *ctx = kn_ctx_new(nt, backends[bi]);
            if (ctx == NULL)
                continue;
            for (int rep = 0; rep < 2; rep++) { /* the second run reuses the scratch */
                for (int s = 0; s < NSEQ; s++)
                    memset(out[s], 0xff, (size_t)n_q[s] * NH * HD * sizeof(float));
                assert_int_equal(kn_attention(ctx, seqs, NSEQ, NH, NKV, HD, scale), 0);
                for (int s = 0; s < NSEQ; s++)
                    for (int i = 0; i < n_q[s] * NH * HD; i++)
                        check_close(out[s][i], want[s][i], 2e-5, "attention", kn_ctx_ops(ctx)->name, s, i);
            }
            /* Any number of query rows an item takes together gives the
             * same bits (one: the one-row kernels only; the two-row ones
             * pair rows within an item). */
            float *first = malloc((size_t)n_q[2] * NH * HD * sizeof(float));
            assert_non_null(first);
            memcpy(first, out[2], (size_t)n_q[2] * NH * HD * sizeof(float));
            for (int tile = 1; tile <= 32; tile *= 2) {
                const kn_attn_params ap = {
                    .n_head = NH, .n_kv_head = NKV, .head_dim = HD, .scale = scale, .tile = tile};
                memset(out[2], 0xff, (size_t)n_q[2] * NH * HD * sizeof(float));
                assert_int_equal(kn_attention_ex(ctx, seqs, NSEQ, &ap), 0);
                assert_memory_equal(first, out[2], (size_t)n_q[2] * NH * HD * sizeof(float));
            }
            free(first);
            /* One decode row alone: its KV heads are split between items. */
            memset(out[0], 0xff, (size_t)n_q[0] * NH * HD * sizeof(float));
            assert_int_equal(kn_attention(ctx, seqs, 1, NH, NKV, HD, scale), 0);
            for (int i = 0; i < n_q[0] * NH * HD; i++)
                check_close(out[0][i], want[0][i], 2e-5, "attention alone", kn_ctx_ops(ctx)->name, 0, i);
            assert_int_equal(kn_attention(ctx, seqs, NSEQ, 8, 3, HD, scale), -EINVAL);
            assert_int_equal(kn_attention(ctx, seqs, 0, NH, NKV, HD, scale), 0);
            /* Q8_0 rows need a head size that is a multiple of 32 */
            if (kv_type == KN_TYPE_Q8_0)
                assert_int_equal(kn_attention(ctx, seqs, NSEQ, NH / 2, NKV / 2, HD * 2 - 16, scale), -EINVAL);
            kn_ctx_free(ctx);
        }
    }
    for (int s = 0; s < NSEQ; s++) {
        free(want[s]);
        free(out[s]);
        free(q[s]);
    }
    for (int i = 0; i < NBLK; i++)
        free(blocks[i]);
}

static void test_attention(void **state)
{
    (void)state;
    attention_case(KN_TYPE_F16, 32);
    attention_case(KN_TYPE_F16, 72);
    attention_case(KN_TYPE_F16, 20);
    /* Q8_0 rows of one, two and four blocks */
    attention_case(KN_TYPE_Q8_0, 32);
    attention_case(KN_TYPE_Q8_0, 64);
    attention_case(KN_TYPE_Q8_0, 128);
}

/* A context long enough that one item's scores for all its heads would
 * pass the per-thread scratch bound: the heads are split further, and the
 * result is still the naive one. The block table cycles over a few blocks. */
static void test_attention_long(void **state)
{
    (void)state;
    enum { NH = 8, NKV = 4, HD = 32, BT = 16, NBLK = 12, NQ = 4, POS0 = 32800 };
    const int kv_dim = NKV * HD, n_tab = (POS0 + NQ + BT - 1) / BT;
    const size_t blk_elems = (size_t)BT * kv_dim * 2;
    uint16_t *blocks[NBLK], **table = malloc((size_t)n_tab * sizeof(*table));
    float *q = malloc((size_t)NQ * NH * HD * sizeof(float)), *out = malloc((size_t)NQ * NH * HD * sizeof(float));
    float *want = malloc((size_t)NQ * NH * HD * sizeof(float));
    assert_non_null(table);
    assert_non_null(q);
    assert_non_null(out);
    assert_non_null(want);
    seed(9);
    for (int i = 0; i < NBLK; i++) {
        blocks[i] = malloc(blk_elems * sizeof(uint16_t));
        assert_non_null(blocks[i]);
        for (size_t e = 0; e < blk_elems; e++)
            blocks[i][e] = kn_fp32_to_fp16(frand());
    }
    for (int i = 0; i < n_tab; i++)
        table[i] = blocks[(i * 5) % NBLK];
    fill(q, (size_t)NQ * NH * HD, 2.0f);
    const kn_attn_seq seq = {.q = q, .out = out, .n_q = NQ, .pos0 = POS0, .blocks = table, .k_off = 0,
                             .v_off = (size_t)BT * kv_dim, .block_tokens = BT,
                             .kv_type = KN_TYPE_F16};
    const float scale = 1.0f / sqrtf((float)HD);
    attention_naive(&seq, NH, NKV, HD, scale, want);
    /* one thread: NQ rows are enough that the heads would not be split for
     * the thread count alone */
    kn_ctx *ctx = kn_ctx_new(1, KN_BACKEND_AUTO);
    assert_non_null(ctx);
    memset(out, 0xff, (size_t)NQ * NH * HD * sizeof(float));
    assert_int_equal(kn_attention(ctx, &seq, 1, NH, NKV, HD, scale), 0);
    for (int i = 0; i < NQ * NH * HD; i++)
        check_close(out[i], want[i], 2e-5, "attention long", kn_ctx_ops(ctx)->name, 0, i);
    /* a position too close to INT32_MAX for the block walk is refused */
    const kn_attn_seq far = {.q = q, .out = out, .n_q = 1, .pos0 = INT32_MAX - 8, .blocks = table,
                             .v_off = (size_t)BT * kv_dim, .block_tokens = BT,
                             .kv_type = KN_TYPE_F16};
    assert_int_equal(kn_attention(ctx, &far, 1, NH, NKV, HD, scale), -EINVAL);
    kn_ctx_free(ctx);
    for (int i = 0; i < NBLK; i++)
        free(blocks[i]);
    free(want);
    free(out);
    free(q);
    free(table);
}

typedef struct visit {
    atomic_int *count;
} visit;

static void visit_fn(void *arg, int i)
{
    visit *v = arg;
    atomic_fetch_add(&v->count[i], 1);
}

static void test_parallel_for(void **state)
{
    (void)state;
    enum { MAXN = 1000 };
    static atomic_int count[MAXN];
    const int sizes[] = {0, 1, 2, 7, 64, MAXN};
    const int threads[] = {1, 2, 4};
    for (int ti = 0; ti < 3; ti++) {
        kn_ctx *ctx = kn_ctx_new(threads[ti], KN_BACKEND_REF);
        assert_non_null(ctx);
        assert_int_equal(kn_ctx_threads(ctx), threads[ti]);
        assert_ptr_equal(kn_ctx_ops(ctx), kn_ops_ref());
        for (int rep = 0; rep < 50; rep++) {
            int n = sizes[rep % 6];
            for (int i = 0; i < MAXN; i++)
                atomic_store(&count[i], 0);
            visit v = {count};
            kn_parallel_for(ctx, n, visit_fn, &v);
            for (int i = 0; i < MAXN; i++)
                assert_int_equal(atomic_load(&count[i]), i < n ? 1 : 0);
            if (rep % 10 == 9) /* let the workers fall asleep, then wake them */
                usleep(3000);
        }
        /* many tiny jobs back to back: workers often arrive after their
         * job is done, and must then claim nothing of the next one */
        for (int rep = 0; rep < 3000; rep++) {
            int n = 2 + rep % 3;
            for (int i = 0; i < n; i++)
                atomic_store(&count[i], 0);
            visit v = {count};
            kn_parallel_for(ctx, n, visit_fn, &v);
            for (int i = 0; i < n; i++)
                assert_int_equal(atomic_load(&count[i]), 1);
        }
        kn_ctx_free(ctx);
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    kn_ctx *ctx = kn_ctx_new(0, KN_BACKEND_AUTO);
    assert_non_null(ctx);
    assert_int_equal(kn_ctx_threads(ctx), cpus > 256 ? 256 : cpus);
    assert_ptr_equal(kn_ctx_ops(ctx), kn_ops_best());
    kn_ctx_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp16_known),
        cmocka_unit_test(test_fp16_exhaustive),
        cmocka_unit_test(test_types),
        cmocka_unit_test(test_quant_known_q8_0),
        cmocka_unit_test(test_quant_known_q4_0),
        cmocka_unit_test(test_quant_roundtrip),
        cmocka_unit_test(test_types_traits),
        cmocka_unit_test(test_dequant_gguf),
        cmocka_unit_test(test_quant_roundtrip_types),
        cmocka_unit_test(test_dot_types_ref),
        cmocka_unit_test(test_quantize_q8_0_exact),
        cmocka_unit_test(test_dot_float),
        cmocka_unit_test(test_dot_q8_0),
        cmocka_unit_test(test_dot_q4_0),
        cmocka_unit_test(test_gemm_q8_0),
        cmocka_unit_test(test_gemm_q4_0),
        cmocka_unit_test(test_quantize_new_acts_exact),
        cmocka_unit_test(test_gemm_types),
        cmocka_unit_test(test_gemm_legacy_long_rows),
        cmocka_unit_test(test_matmul_types),
        cmocka_unit_test(test_gemm_packed),
        cmocka_unit_test(test_gemm_packed_limits),
        cmocka_unit_test(test_mxfp4_extremes),
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_kv_ops),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_kv_ops_two_rows),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_long),
        cmocka_unit_test(test_parallel_for),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
