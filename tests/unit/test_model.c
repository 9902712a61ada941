/* Model forward pass: fast kernels against the scalar reference, quantized
 * models against their F32 original, batched against alone, chunked prefill
 * against one-shot, KV exhaustion, and load errors that name the key. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kernels/kn.h"
#include "runtime/gguf.h"
#include "runtime/model.h"
#include "runtime/model_gen.h"
#include "model_checks.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[64];
static char path_f32[96], path_f16[96], path_q8[96], path_q4[96];

static const int32_t prompt[] = {1, 300, 301, 450, 17, 99, 260, 302, 303, 511, 42, 277, 310};
#define N_PROMPT ((int)(sizeof(prompt) / sizeof(prompt[0])))

/* The shape every model of these tests has (head_dim 32). */
static void small_params(rt_gen_params *p, uint32_t type)
{
    rt_gen_params_default(p);
    p->dim = 128;
    p->layers = 3;
    p->heads = 4;
    p->kv_heads = 2;
    p->ffn = 320;
    p->vocab = 512;
    p->ctx = 256;
    p->type = type;
    p->seed = 7;
}

static void gen(const char *path, uint32_t type)
{
    rt_gen_params p;
    small_params(&p, type);
    char err[256];
    int rc = rt_model_gen(&p, path, err, sizeof(err));
    if (rc)
        fprintf(stderr, "gen %s: %s\n", path, err);
    assert_int_equal(rc, 0);
}

static int setup(void **state)
{
    snprintf(dir, sizeof(dir), "/tmp/infergate-test-model-XXXXXX");
    if (!mkdtemp(dir))
        return -1;
    snprintf(path_f32, sizeof(path_f32), "%s/f32.gguf", dir);
    snprintf(path_f16, sizeof(path_f16), "%s/f16.gguf", dir);
    snprintf(path_q8, sizeof(path_q8), "%s/q8.gguf", dir);
    snprintf(path_q4, sizeof(path_q4), "%s/q4.gguf", dir);
    gen(path_f32, KN_TYPE_F32);
    gen(path_f16, KN_TYPE_F16);
    gen(path_q8, KN_TYPE_Q8_0);
    gen(path_q4, KN_TYPE_Q4_0);
    return 0;
}

static int teardown(void **state)
{
    unlink(path_f32);
    unlink(path_f16);
    unlink(path_q8);
    unlink(path_q4);
    rmdir(dir);
    return 0;
}

static rt_model *load(const char *path, bool reference, int threads)
{
    return mc_load(path, NULL, reference, threads);
}

/* Logits after the prompt, prefilled in chunks of `chunk` tokens, over a
 * kv_type cache. */
static float *prompt_logits_kv(rt_model *m, int chunk, kn_type kv_type)
{
    const rt_hparams *hp = rt_model_hparams(m);
    char err[128];
    rt_kv *kv = rt_kv_new(m, 64 * rt_model_kv_bytes_per_token(m, kv_type), 16, kv_type, err, sizeof(err));
    assert_non_null(kv);
    assert_int_equal(rt_kv_blocks_total(kv), 4);
    rt_seq *s = rt_seq_new(kv, 64);
    float *logits = malloc((size_t)hp->n_vocab * sizeof(float));
    for (int i = 0; i < N_PROMPT; i += chunk) {
        int n = N_PROMPT - i < chunk ? N_PROMPT - i : chunk;
        rt_batch_entry e = {.seq = s, .tokens = prompt + i, .n_tokens = n, .logits = logits};
        assert_int_equal(rt_model_forward(m, &e, 1), 0);
    }
    assert_int_equal(rt_seq_len(s), N_PROMPT);
    rt_seq_free(s);
    assert_int_equal(rt_kv_blocks_free(kv), rt_kv_blocks_total(kv));
    rt_kv_free(kv);
    return logits;
}

static float *prompt_logits(rt_model *m, int chunk)
{
    return prompt_logits_kv(m, chunk, KN_TYPE_F16);
}

static void test_fast_matches_reference(void **state)
{
    const char *paths[] = {path_f32, path_f16, path_q8, path_q4};
    for (int k = 0; k < 4; k++) {
        rt_model *ref = load(paths[k], true, 1);
        rt_model *fast = load(paths[k], false, 2);
        int n = rt_model_hparams(ref)->n_vocab;
        float *a = prompt_logits(ref, N_PROMPT);
        float *b = prompt_logits(fast, N_PROMPT);
        float maxabs = 0, maxdiff = 0;
        for (int i = 0; i < n; i++) {
            maxabs = fmaxf(maxabs, fabsf(a[i]));
            maxdiff = fmaxf(maxdiff, fabsf(a[i] - b[i]));
        }
        printf("# %s: %s vs %s: max |diff| %.3g of max |logit| %.3g\n", paths[k], rt_model_backend_name(fast),
               rt_model_backend_name(ref), maxdiff, maxabs);
        assert_true(maxdiff <= 1e-4f * maxabs);
        free(a);
        free(b);
        rt_model_free(ref);
        rt_model_free(fast);
    }
}

static void test_quantized_close_to_f32(void **state)
{
    rt_model *f32 = load(path_f32, false, 2);
    int n = rt_model_hparams(f32)->n_vocab;
    float *base = prompt_logits(f32, N_PROMPT);
    const char *paths[] = {path_f16, path_q8, path_q4};
    const double min_cos[] = {0.99999, 0.999, 0.99};
    for (int k = 0; k < 3; k++) {
        rt_model *q = load(paths[k], false, 2);
        float *l = prompt_logits(q, N_PROMPT);
        double c = mc_cosine(base, l, n);
        printf("# %s: cosine to f32 logits %.6f (need >= %g)\n", paths[k], c, min_cos[k]);
        assert_true(c >= min_cos[k]);
        free(l);
        rt_model_free(q);
    }
    free(base);

    int32_t a[16], b[16];
    mc_greedy(f32, prompt, N_PROMPT, a, 16, NULL);
    rt_model *q8 = load(path_q8, false, 2);
    mc_greedy(q8, prompt, N_PROMPT, b, 16, NULL);
    assert_memory_equal(a, b, sizeof(a));
    rt_model_free(q8);
    rt_model_free(f32);
}

/* A prompt fed in chunks gives the logits it gives whole. Q8_0's gemm has
 * the same bits whatever the batch, so there they are equal; F32's dots sum
 * in an order that depends on the batch, and a last-bit difference in K or
 * V can round to a neighbouring half in the cache, hence the tolerance. */
static void test_chunked_prefill_matches(void **state)
{
    const char *paths[] = {path_q8, path_f32};
    for (int k = 0; k < 2; k++) {
        rt_model *m = load(paths[k], false, 2);
        int n = rt_model_hparams(m)->n_vocab;
        float *whole = prompt_logits(m, N_PROMPT);
        int chunks[] = {1, 4, 5};
        float maxdiff = 0;
        for (int c = 0; c < 3; c++) {
            float *l = prompt_logits(m, chunks[c]);
            for (int i = 0; i < n; i++)
                maxdiff = fmaxf(maxdiff, fabsf(l[i] - whole[i]) / (1 + fabsf(whole[i])));
            free(l);
        }
        printf("# %s: chunked vs whole prefill: max relative diff %.3g\n", paths[k], maxdiff);
        assert_true(k == 0 ? maxdiff == 0 : maxdiff <= 1e-3f);
        free(whole);
        rt_model_free(m);
    }
}

/* A Q8_0 KV cache: close to the F16 cache's logits, the fast kernels close
 * to the reference's, and chunked prefill bit for bit the whole prefill
 * (K and V rows are quantized one by one, the same whatever the batch). */
static void test_kv_q8_0(void **state)
{
    const char *paths[] = {path_q8, path_f32};
    for (int k = 0; k < 2; k++) {
        rt_model *m = load(paths[k], false, 2), *ref = load(paths[k], true, 1);
        int n = rt_model_hparams(m)->n_vocab;
        float *f16 = prompt_logits_kv(m, N_PROMPT, KN_TYPE_F16);
        float *whole = prompt_logits_kv(m, N_PROMPT, KN_TYPE_Q8_0);
        float *slow = prompt_logits_kv(ref, N_PROMPT, KN_TYPE_Q8_0);
        double c = mc_cosine(f16, whole, n);
        float maxabs = 0, maxref = 0, maxchunk = 0;
        for (int i = 0; i < n; i++) {
            maxabs = fmaxf(maxabs, fabsf(slow[i]));
            maxref = fmaxf(maxref, fabsf(whole[i] - slow[i]));
        }
        const int chunks[] = {1, 4, 5};
        for (int ci = 0; ci < 3; ci++) {
            float *l = prompt_logits_kv(m, chunks[ci], KN_TYPE_Q8_0);
            for (int i = 0; i < n; i++)
                maxchunk = fmaxf(maxchunk, fabsf(l[i] - whole[i]));
            free(l);
        }
        printf("# %s, q8_0 KV: cosine to f16 KV %.6f; %s vs ref max |diff| %.3g of %.3g; chunked vs whole %.3g\n",
               paths[k], c, rt_model_backend_name(m), maxref, maxabs, maxchunk);
        assert_true(c >= 0.999);
        assert_true(maxref <= 1e-4f * maxabs);
        if (k == 0)
            assert_true(maxchunk == 0);
        else
            assert_true(maxchunk <= 1e-3f * maxabs);
        free(slow);
        free(whole);
        free(f16);
        rt_model_free(ref);
        rt_model_free(m);
    }

    /* A cache holds f16 or q8_0, nothing else. */
    rt_model *m = load(path_q8, false, 1);
    char err[128] = "";
    assert_null(rt_kv_new(m, 1 << 20, 16, KN_TYPE_Q4_0, err, sizeof(err)));
    assert_non_null(strstr(err, "f16 or q8_0"));
    /* A pool smaller than one block is refused, not rounded up to one. */
    size_t block = 16 * rt_model_kv_bytes_per_token(m, KN_TYPE_F16);
    assert_null(rt_kv_new(m, block - 1, 16, KN_TYPE_F16, err, sizeof(err)));
    assert_non_null(strstr(err, "holds no block"));
    rt_kv *one = rt_kv_new(m, block, 16, KN_TYPE_F16, err, sizeof(err));
    assert_non_null(one);
    assert_int_equal(rt_kv_blocks_total(one), 1);
    rt_kv_free(one);
    assert_int_equal(rt_model_kv_bytes_per_token(m, KN_TYPE_Q8_0) * 32,
                     rt_model_kv_bytes_per_token(m, KN_TYPE_F16) * 17);
    rt_model_free(m);
}

/* Eight sequences with different prompts and lengths, run as one batch
 * per step (prefill of all, then one decode token each), give the same
 * greedy tokens as each sequence alone. */
static void test_batch_matches_alone(void **state)
{
    (void)state;
    rt_model *m = load(path_q8, false, 2);
    mc_batch_matches_alone(m, prompt, N_PROMPT, 8, 12, "q8_0");
    rt_model_free(m);
}

static void test_kv_exhaustion(void **state)
{
    rt_model *m = load(path_q8, false, 1);
    char err[128];
    rt_kv *kv =
        rt_kv_new(m, 2 * 16 * rt_model_kv_bytes_per_token(m, KN_TYPE_F16), 16, KN_TYPE_F16, err, sizeof(err));
    assert_int_equal(rt_kv_blocks_total(kv), 2);
    rt_seq *a = rt_seq_new(kv, 64), *b = rt_seq_new(kv, 64);
    int32_t toks[20];
    for (int i = 0; i < 20; i++)
        toks[i] = prompt[i % N_PROMPT];
    rt_batch_entry e = {.seq = a, .tokens = toks, .n_tokens = 20};
    assert_int_equal(rt_model_forward(m, &e, 1), 0); /* two blocks */
    assert_int_equal(rt_kv_blocks_free(kv), 0);
    e = (rt_batch_entry){.seq = b, .tokens = toks, .n_tokens = 1};
    assert_int_equal(rt_model_forward(m, &e, 1), -ENOSPC);
    assert_int_equal(rt_seq_len(b), 0);
    rt_seq_free(a);
    assert_int_equal(rt_kv_blocks_free(kv), 2);
    assert_int_equal(rt_model_forward(m, &e, 1), 0);
    /* Past max_tokens: refused, nothing taken. */
    rt_seq *c = rt_seq_new(kv, 4);
    e = (rt_batch_entry){.seq = c, .tokens = toks, .n_tokens = 5};
    assert_int_equal(rt_model_forward(m, &e, 1), -E2BIG);
    /* A bad token id is refused before anything runs. */
    int32_t bad = 100000;
    e = (rt_batch_entry){.seq = c, .tokens = &bad, .n_tokens = 1};
    assert_int_equal(rt_model_forward(m, &e, 1), -EINVAL);
    rt_seq_free(b);
    rt_seq_free(c);
    rt_kv_free(kv);
    rt_model_free(m);
}

static void test_missing_key_named(void **state)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/bad.gguf", dir);
    rt_gguf_writer *w = rt_gguf_writer_new();
    rt_gguf_writer_add_str(w, "general.architecture", "llama");
    rt_gguf_writer_add_u32(w, "llama.context_length", 128);
    rt_gguf_writer_add_u32(w, "llama.embedding_length", 64);
    rt_gguf_writer_add_u32(w, "llama.feed_forward_length", 128);
    rt_gguf_writer_add_u32(w, "llama.attention.head_count", 4);
    char err[256];
    assert_int_equal(rt_gguf_writer_write(w, path, err, sizeof(err)), 0);
    rt_gguf_writer_free(w);
    rt_model *m = NULL;
    assert_int_equal(rt_model_load(path, NULL, &m, err, sizeof(err)), -EINVAL);
    assert_null(m);
    assert_non_null(strstr(err, "llama.block_count"));

    w = rt_gguf_writer_new();
    rt_gguf_writer_add_str(w, "general.architecture", "gptj");
    assert_int_equal(rt_gguf_writer_write(w, path, err, sizeof(err)), 0);
    rt_gguf_writer_free(w);
    assert_int_equal(rt_model_load(path, NULL, &m, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "gptj"));
    unlink(path);
}

/* RoPE frequency factors (rope_freqs.weight, Llama 3.1 and later) and
 * linear scaling turn the positions: factors of 1 change nothing; factors
 * of 4 are linear scaling by 4, bit for bit; either differs from none.
 * Before, both were ignored and such files gave the unscaled logits.
 * Scalings other than none, linear, yarn and longrope are refused, naming
 * the key, and so is a model with factors on cuda (whose angle table does
 * not take them yet). */
static void test_rope_scaling(void **state)
{
    (void)state;
    float ones[16], fours[16];
    for (int i = 0; i < 16; i++) {
        ones[i] = 1.0f;
        fours[i] = 4.0f;
    }
    const struct {
        const char *scaling;
        float factor;
        const float *freqs;
        const char *refused; /* in the load error, or NULL */
        float base;          /* rope.freq_base; 0: the generator's */
    } cases[] = {
        {NULL, 0, NULL, NULL, 0},
        {NULL, 0, ones, NULL, 0},
        {NULL, 0, fours, NULL, 0},
        {"linear", 4, NULL, NULL, 0},
        {"none", 0, NULL, NULL, 0},
        {"dynamic", 4, NULL, "llama.rope.scaling.type = \"dynamic\"", 0}, /* yarn runs since issue 28 */
        {"linear", 0, NULL, "missing required key llama.rope.scaling.factor", 0},
        {NULL, 4, NULL, NULL, 0},   /* a factor without a type is linear */
        {"none", 4, NULL, NULL, 0}, /* none is none, whatever the factor */
        /* it passed "positive" and every logit came out 0 */
        {NULL, 0, NULL, "llama.rope.freq_base must be a positive number", INFINITY},
    };
    enum { N_CASES = sizeof(cases) / sizeof(cases[0]) };
    float *logits[N_CASES] = {0};
    for (int k = 0; k < N_CASES; k++) {
        char path[128], err[256] = "";
        snprintf(path, sizeof(path), "%s/rope%d.gguf", dir, k);
        rt_gen_params p;
        small_params(&p, KN_TYPE_F32); /* head_dim 32: 16 factors */
        p.rope_scaling = cases[k].scaling;
        if (cases[k].base != 0)
            p.rope_base = cases[k].base;
        p.rope_scaling_factor = cases[k].factor;
        p.rope_freqs = cases[k].freqs;
        assert_int_equal(rt_model_gen(&p, path, err, sizeof(err)), 0);
        rt_model_opts o = {.n_threads = 1};
        rt_model *m = NULL;
        int rc = rt_model_load(path, &o, &m, err, sizeof(err));
        if (cases[k].refused) {
            assert_int_equal(rc, -EINVAL);
            if (!strstr(err, cases[k].refused))
                fail_msg("case %d: %s", k, err);
            continue;
        }
        if (rc)
            fail_msg("case %d: %s", k, err);
        logits[k] = prompt_logits(m, N_PROMPT);
        rt_model_free(m);
        if (cases[k].freqs) { /* the CUDA plugin turns by the same tables (issue 28) */
            o.device = "cuda";
            rc = rt_model_load(path, &o, &m, err, sizeof(err));
            if (rc == 0)
                rt_model_free(m);
            else if (strstr(err, "not supported on cuda yet"))
                fail_msg("case %d: %s", k, err);
        }
    }
    size_t bytes = 512 * sizeof(float);
    assert_memory_equal(logits[1], logits[0], bytes); /* factors of 1 */
    assert_memory_equal(logits[4], logits[0], bytes); /* "none" */
    assert_memory_equal(logits[2], logits[3], bytes); /* factors of 4 = linear 4 */
    assert_memory_not_equal(logits[2], logits[0], bytes);
    assert_memory_equal(logits[7], logits[3], bytes);
    assert_memory_equal(logits[8], logits[0], bytes);
    for (int k = 0; k < N_CASES; k++)
        free(logits[k]);
}

/* What the CUDA plugin does not run is refused by name before any device
 * is looked for: here, heads wider than its attention kernel's 256. */
static void test_cuda_gap_named(void **state)
{
    (void)state;
    char path[128], err[256] = "";
    snprintf(path, sizeof(path), "%s/wide_heads.gguf", dir);
    rt_gen_params p;
    small_params(&p, KN_TYPE_F32);
    p.dim = 512;
    p.heads = 1;
    p.kv_heads = 1;
    assert_int_equal(rt_model_gen(&p, path, err, sizeof(err)), 0);
    rt_model_opts o = {.n_threads = 1, .device = "cuda"};
    rt_model *m = NULL;
    assert_int_equal(rt_model_load(path, &o, &m, err, sizeof(err)), -EINVAL);
    if (!strstr(err, "attention heads wider than 256 dimensions: not supported on cuda yet"))
        fail_msg("%s", err);
}

/* A dense MXFP4 matrix is refused on CUDA (its prefill GEMM would take the
 * weights as F16, which cannot hold MXFP4's scales); experts may be MXFP4. */
static void test_cuda_gap_dense_mxfp4(void **state)
{
    (void)state;
    char path[128], err[256] = "";
    snprintf(path, sizeof(path), "%s/dense_mxfp4.gguf", dir);
    rt_gen_params p;
    small_params(&p, KN_TYPE_MXFP4);
    assert_int_equal(rt_model_gen(&p, path, err, sizeof(err)), 0);
    rt_model_opts o = {.n_threads = 1, .device = "cuda"};
    rt_model *m = NULL;
    assert_int_equal(rt_model_load(path, &o, &m, err, sizeof(err)), -EINVAL);
    if (!strstr(err, "MXFP4 matrices outside the experts") || !strstr(err, "not supported on cuda yet"))
        fail_msg("%s", err);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rope_scaling),
        cmocka_unit_test(test_cuda_gap_named),
        cmocka_unit_test(test_cuda_gap_dense_mxfp4),
        cmocka_unit_test(test_fast_matches_reference),
        cmocka_unit_test(test_quantized_close_to_f32),
        cmocka_unit_test(test_chunked_prefill_matches),
        cmocka_unit_test(test_kv_q8_0),
        cmocka_unit_test(test_batch_matches_alone),
        cmocka_unit_test(test_kv_exhaustion),
        cmocka_unit_test(test_missing_key_named),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
