/* The architectures beyond llama (runtime/arch.c), each on a synthetic file
 * of `model gen --arch`: the fast kernels' logits against the scalar
 * reference's, chunked prefill against whole, eight sequences batched
 * against each alone, and for mixtures of experts the reference's choice
 * of experts for every token. Then what is particular to a family: sliding
 * windows (and the KV blocks they give back), Phi-3's long RoPE factors,
 * and the loader's refusals (an unused tensor, deepseek2). */
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

static const int32_t prompt[] = {1, 300, 301, 450, 17, 99, 260, 302, 303, 511, 42, 277, 310, 288, 401, 12, 77};
#define N_PROMPT ((int)(sizeof(prompt) / sizeof(prompt[0])))

static const char *const archs[] = {"qwen3",   "qwen3moe", "mixtral", "gemma2", "gemma3",  "phi3",    "gpt-oss",
                                    "granite", "granitemoe", "olmo2", "smollm3", "mistral3", "qwen2"};
#define N_ARCHS ((int)(sizeof(archs) / sizeof(archs[0])))

/* head_dim 32, windows of 8 where a family slides (so the 17-token prompt
 * crosses them), 4 experts of which 2 are used. */
static void small_params(rt_gen_params *p, const char *arch, uint32_t type)
{
    rt_gen_params_default(p);
    p->arch = arch;
    p->dim = 128;
    p->layers = 4;
    p->heads = 4;
    p->kv_heads = 2;
    p->ffn = 128;
    p->vocab = 512;
    p->ctx = 256;
    p->type = type;
    p->seed = 11;
    const bool moe = !strcmp(arch, "mixtral") || !strcmp(arch, "qwen3moe") || !strcmp(arch, "gpt-oss") ||
                     !strcmp(arch, "granitemoe");
    p->experts = moe ? 4 : 0;
    p->experts_used = moe ? 2 : 0;
    p->swa = 8;
}

static void path_of(char *out, size_t n, const char *arch, uint32_t type)
{
    snprintf(out, n, "%s/%s-%s.gguf", dir, arch, kn_type_name(type));
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/infergate-test-arch-XXXXXX");
    if (!mkdtemp(dir))
        return -1;
    const uint32_t types[] = {KN_TYPE_Q8_0, KN_TYPE_F32};
    for (int a = 0; a < N_ARCHS; a++)
        for (int t = 0; t < 2; t++) {
            rt_gen_params p;
            small_params(&p, archs[a], types[t]);
            char path[128], err[256];
            path_of(path, sizeof(path), archs[a], types[t]);
            if (rt_model_gen(&p, path, err, sizeof(err))) {
                fprintf(stderr, "gen %s: %s\n", path, err);
                return -1;
            }
        }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static rt_model *load(const char *path, bool reference, int threads)
{
    return mc_load(path, NULL, reference, threads);
}

static rt_model *load_arch(const char *arch, uint32_t type, bool reference, int threads)
{
    char path[128];
    path_of(path, sizeof(path), arch, type);
    return load(path, reference, threads);
}

/* Logits after the prompt, prefilled in chunks of `chunk`; *choices (when
 * not NULL) receives layer 0's experts for every prompt token, gathered
 * over the chunks. */
static float *prompt_logits(rt_model *m, int chunk, int32_t *choices)
{
    const rt_hparams *hp = rt_model_hparams(m);
    char err[128];
    rt_kv *kv = rt_kv_new(m, 64 * rt_model_kv_bytes_per_token(m, KN_TYPE_F16), 16, KN_TYPE_F16, err, sizeof(err));
    if (!kv)
        fail_msg("kv: %s", err);
    rt_seq *s = rt_seq_new(kv, 64);
    float *logits = malloc((size_t)hp->n_vocab * sizeof(float));
    for (int i = 0; i < N_PROMPT; i += chunk) {
        int n = N_PROMPT - i < chunk ? N_PROMPT - i : chunk;
        rt_batch_entry e = {.seq = s, .tokens = prompt + i, .n_tokens = n, .logits = logits};
        assert_int_equal(rt_model_forward(m, &e, 1), 0);
        if (choices) {
            const int32_t *c = rt_model_expert_choices(m, 0);
            assert_non_null(c);
            memcpy(choices + (size_t)i * hp->n_expert_used, c, (size_t)n * hp->n_expert_used * sizeof(int32_t));
        }
    }
    rt_seq_free(s);
    assert_int_equal(rt_kv_blocks_free(kv), rt_kv_blocks_total(kv));
    rt_kv_free(kv);
    return logits;
}

static void test_fast_matches_reference(void **state)
{
    (void)state;
    const uint32_t types[] = {KN_TYPE_Q8_0, KN_TYPE_F32};
    for (int a = 0; a < N_ARCHS; a++)
        for (int t = 0; t < 2; t++) {
            rt_model *ref = load_arch(archs[a], types[t], true, 1), *fast = load_arch(archs[a], types[t], false, 2);
            const rt_hparams *hp = rt_model_hparams(ref);
            int V = hp->n_vocab, k = hp->n_expert_used;
            int32_t *ca = k ? calloc((size_t)N_PROMPT * k, sizeof(int32_t)) : NULL;
            int32_t *cb = k ? calloc((size_t)N_PROMPT * k, sizeof(int32_t)) : NULL;
            float *x = prompt_logits(ref, N_PROMPT, ca), *y = prompt_logits(fast, N_PROMPT, cb);
            float maxabs = 0, maxdiff = 0;
            double xy = 0, xx = 0, yy = 0;
            for (int i = 0; i < V; i++) {
                assert_true(isfinite(y[i]));
                maxabs = fmaxf(maxabs, fabsf(x[i]));
                maxdiff = fmaxf(maxdiff, fabsf(x[i] - y[i]));
                xy += (double)x[i] * y[i];
                xx += (double)x[i] * x[i];
                yy += (double)y[i] * y[i];
            }
            const double cos = xy / sqrt(xx * yy);
            printf("# %-10s %-4s: %s vs reference: max |diff| %.3g of max |logit| %.3g, cosine %.7f%s\n", archs[a],
                   kn_type_name(types[t]), rt_model_backend_name(fast), maxdiff, maxabs, cos,
                   k ? ", expert choices equal" : "");
            assert_true(maxabs > 0.1f);
            /* F32 weights: no quantized activations, the sums' order is
             * the only difference. Q8_0: the same, but attention's float
             * sums differ in their last bits between the backends, and a
             * last bit can flip one activation's Q8_0 rounding in the next
             * matmul (a step of 1/127 of its block's largest); a family
             * without a norm before its matmuls (OLMo 2) carries such a
             * flip on. Most files show none at all. */
            if (types[t] == KN_TYPE_F32 || maxdiff > 1e-4f * maxabs) {
                assert_true(types[t] != KN_TYPE_F32 || maxdiff <= 1e-4f * maxabs);
                assert_true(cos >= 0.999);
                assert_int_equal(mc_argmax(x, V), mc_argmax(y, V));
            }
            if (k)
                assert_memory_equal(ca, cb, (size_t)N_PROMPT * k * sizeof(int32_t));
            free(ca);
            free(cb);
            free(x);
            free(y);
            rt_model_free(ref);
            rt_model_free(fast);
        }
}

/* Q8_0's gemm has the same bits whatever the batch, and every other step
 * is per row: chunks give the whole prompt's logits exactly. */
static void test_chunked_prefill_matches(void **state)
{
    (void)state;
    for (int a = 0; a < N_ARCHS; a++) {
        rt_model *m = load_arch(archs[a], KN_TYPE_Q8_0, false, 2);
        int V = rt_model_hparams(m)->n_vocab;
        float *whole = prompt_logits(m, N_PROMPT, NULL);
        const int chunks[] = {1, 4, 5};
        float maxdiff = 0;
        for (int c = 0; c < 3; c++) {
            float *l = prompt_logits(m, chunks[c], NULL);
            for (int i = 0; i < V; i++)
                maxdiff = fmaxf(maxdiff, fabsf(l[i] - whole[i]));
            free(l);
        }
        printf("# %-10s chunked vs whole prefill: max |diff| %.3g\n", archs[a], maxdiff);
        assert_true(maxdiff == 0);
        free(whole);
        rt_model_free(m);
    }
}

/* Eight sequences of different prompts and lengths as one batch per step
 * give each one's greedy tokens alone. */
static void test_batch_matches_alone(void **state)
{
    (void)state;
    for (int a = 0; a < N_ARCHS; a++) {
        rt_model *m = load_arch(archs[a], KN_TYPE_Q8_0, false, 2);
        mc_batch_matches_alone(m, prompt, N_PROMPT, 8, 10, archs[a]);
        printf("# %-10s 8 sequences batched = each alone\n", archs[a]);
        rt_model_free(m);
    }
}

/* gpt-oss's MXFP4 experts (its quantized files' type for them) through the
 * fast tables' kernels, the packed prefill gemm where the CPU has one,
 * give the scalar reference's greedy tokens: a prompt prefilled whole,
 * then one token a step. */
static void test_gpt_oss_mxfp4_greedy(void **state)
{
    (void)state;
    enum { N_GEN = 24 };
    char path[128], err[256];
    path_of(path, sizeof(path), "gpt-oss", KN_TYPE_Q8_0);
    rt_gguf *g = NULL;
    assert_int_equal(rt_gguf_open(path, &g, err, sizeof(err)), 0);
    const rt_gguf_tensor *gate = rt_gguf_find_tensor(g, "blk.0.ffn_gate_exps.weight");
    assert_non_null(gate);
    assert_int_equal(gate->type, KN_TYPE_MXFP4);
    rt_gguf_free(g);
    int32_t toks[2][N_GEN];
    const char *backend = NULL;
    for (int k = 0; k < 2; k++) {
        rt_model *m = load(path, k == 0, 2);
        if (k == 1)
            backend = rt_model_backend_name(m);
        mc_greedy(m, prompt, N_PROMPT, toks[k], N_GEN, NULL);
        rt_model_free(m);
    }
    const kn_ops *best = kn_ops_best();
    printf("# gpt-oss MXFP4 experts: %d greedy tokens on %s (%s) = the reference's\n", N_GEN, backend,
           best->gemm_packed[KN_TYPE_MXFP4] ? "packed MXFP4 gemm" : "MXFP4 dots");
    assert_memory_equal(toks[0], toks[1], sizeof(toks[0]));
    int changes = 0; /* not one token repeated: the experts' products decide them */
    for (int i = 1; i < N_GEN; i++)
        changes += toks[0][i] != toks[0][i - 1];
    assert_true(changes >= N_GEN / 4);
}

/* Sliding-window layers keep their window only: a Gemma-2-shaped model
 * (every other layer slides, window 8) decoding 4k positions holds the
 * global layers' blocks for all of them and a few of the others', and the
 * logits of its last position are those of a fresh prefill of the whole
 * sequence, which had every block still (blocks given back are never
 * read). Gemma 3 (five of six layers slide) likewise. */
static void test_window_blocks(void **state)
{
    (void)state;
    enum { N_CTX = 4096, BT = 16 };
    const char *fams[] = {"gemma2", "gemma3", "gpt-oss"};
    for (int f = 0; f < 3; f++) {
        char path[128], err[256];
        snprintf(path, sizeof(path), "%s/%s-long.gguf", dir, fams[f]);
        rt_gen_params p;
        small_params(&p, fams[f], KN_TYPE_Q8_0);
        p.ctx = N_CTX;
        p.layers = 6;
        assert_int_equal(rt_model_gen(&p, path, err, sizeof(err)), 0);
        rt_model *m = load(path, false, 2);
        const rt_hparams *hp = rt_model_hparams(m);
        const int V = hp->n_vocab;
        int32_t *toks = malloc(N_CTX * sizeof(int32_t));
        for (int i = 0; i < N_CTX; i++)
            toks[i] = 3 + (i * 7919) % (V - 3);
        rt_kv *kv = rt_kv_new(m, (size_t)(N_CTX + 64) * rt_model_kv_bytes_per_token(m, KN_TYPE_F16), BT, KN_TYPE_F16,
                              err, sizeof(err));
        assert_non_null(kv);
        const int total = rt_kv_blocks_total(kv);
        rt_seq *s = rt_seq_new(kv, N_CTX);
        float *a = malloc((size_t)V * sizeof(float)), *b = malloc((size_t)V * sizeof(float));
        /* a prompt of 64, chunks of 40 (the scheduler's chunked prefill,
         * not aligned to the blocks), then one position a step for the last
         * 128: one position a step all along takes minutes under ASan */
        rt_batch_entry e = {.seq = s, .tokens = toks, .n_tokens = 64, .logits = NULL};
        assert_int_equal(rt_model_forward(m, &e, 1), 0);
        for (int i = 64, n; i < N_CTX; i += n) {
            n = i < N_CTX - 128 ? (N_CTX - 128 - i < 40 ? N_CTX - 128 - i : 40) : 1;
            e = (rt_batch_entry){.seq = s, .tokens = toks + i, .n_tokens = n, .logits = i + n == N_CTX ? a : NULL};
            assert_int_equal(rt_model_forward(m, &e, 1), 0);
        }
        const int held = rt_seq_blocks(s), in_use = total - rt_kv_blocks_free(kv);
        assert_int_equal(held, in_use);
        /* every layer's blocks, had none been given back */
        const int all = rt_kv_blocks_for(kv, N_CTX);
        int n_local = 0;
        for (int l = 0; l < hp->n_layer; l++)
            n_local += strcmp(fams[f], "gemma3") ? l % 2 == 0 : l % 6 < 5;
        const int global = all / hp->n_layer * (hp->n_layer - n_local);
        printf("# %-8s %d of %d layers sliding (window %d): %d tokens hold %d blocks of %zu bytes, %.1f%% of the %d "
               "without windows; the global layers' alone are %d\n",
               fams[f], n_local, hp->n_layer, hp->n_swa, N_CTX, held, rt_kv_block_bytes(kv), 100.0 * held / all, all,
               global);
        assert_true(held <= global + n_local * 3);
        rt_seq_free(s);
        assert_int_equal(rt_kv_blocks_free(kv), total);

        /* the whole sequence at once: nothing given back before it ends */
        s = rt_seq_new(kv, N_CTX);
        e = (rt_batch_entry){.seq = s, .tokens = toks, .n_tokens = N_CTX, .logits = b};
        assert_int_equal(rt_model_forward(m, &e, 1), 0);
        float maxdiff = 0;
        for (int i = 0; i < V; i++)
            maxdiff = fmaxf(maxdiff, fabsf(a[i] - b[i]));
        printf("# %-8s chunks then one by one vs whole prefill at %d: max |diff| %.3g\n", fams[f], N_CTX, maxdiff);
        assert_true(maxdiff == 0);
        rt_seq_free(s);
        free(a);
        free(b);
        free(toks);
        rt_kv_free(kv);
        rt_model_free(m);
    }
}

/* A window wider than the context is no window; a narrower one changes
 * the logits once the prompt is longer than it. */
static void test_window_semantics(void **state)
{
    (void)state;
    float *l[3];
    const int windows[] = {1000, 17, 8};
    for (int w = 0; w < 3; w++) {
        char path[128], err[256];
        snprintf(path, sizeof(path), "%s/gemma2-w%d.gguf", dir, windows[w]);
        rt_gen_params p;
        small_params(&p, "gemma2", KN_TYPE_Q8_0);
        p.swa = windows[w];
        assert_int_equal(rt_model_gen(&p, path, err, sizeof(err)), 0);
        rt_model *m = load(path, false, 2);
        l[w] = prompt_logits(m, N_PROMPT, NULL);
        rt_model_free(m);
    }
    assert_memory_equal(l[0], l[1], 512 * sizeof(float)); /* 17 positions: a window of 17 sees them all */
    assert_memory_not_equal(l[0], l[2], 512 * sizeof(float));
    for (int w = 0; w < 3; w++)
        free(l[w]);
}

/* The loader: a tensor the forward pass would not read fails the load
 * naming it (it was dropped without a word); deepseek2 is refused by
 * name; an unknown RoPE scaling is refused. */
static void test_refusals(void **state)
{
    (void)state;
    char path[128], err[256];
    snprintf(path, sizeof(path), "%s/bad.gguf", dir);
    rt_model *m = NULL;
    rt_gguf_writer *w = rt_gguf_writer_new();
    rt_gguf_writer_add_str(w, "general.architecture", "deepseek2");
    assert_int_equal(rt_gguf_writer_write(w, path, err, sizeof(err)), 0);
    rt_gguf_writer_free(w);
    assert_int_equal(rt_model_load(path, NULL, &m, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "deepseek2"));
    assert_non_null(strstr(err, "latent attention"));

    /* a generated file with one more tensor, a .scale the forward pass
     * does not know */
    rt_gguf *g = NULL;
    char src[128];
    path_of(src, sizeof(src), "smollm3", KN_TYPE_F32);
    assert_int_equal(rt_gguf_open(src, &g, err, sizeof(err)), 0);
    w = rt_gguf_writer_new();
    for (int64_t i = 0; i < rt_gguf_n_kv(g); i++) {
        rt_gguf_str k = rt_gguf_key_name(g, i);
        char key[128];
        snprintf(key, sizeof(key), "%.*s", (int)k.n, k.p);
        rt_gguf_vtype t = rt_gguf_kv_type(g, i);
        if (t == RT_GGUF_STRING) {
            rt_gguf_str v;
            rt_gguf_kv_str(g, i, &v);
            char *c = strndup(v.p, v.n);
            rt_gguf_writer_add_str(w, key, c);
            free(c);
        } else if (t == RT_GGUF_ARRAY && rt_gguf_arr_type(g, i) == RT_GGUF_STRING) {
            uint64_t n = rt_gguf_arr_n(g, i);
            char **v = calloc(n, sizeof(char *));
            for (uint64_t j = 0; j < n; j++) {
                rt_gguf_str e;
                rt_gguf_arr_str(g, i, j, &e);
                v[j] = strndup(e.p, e.n);
            }
            rt_gguf_writer_add_arr_str(w, key, (const char *const *)v, n);
            for (uint64_t j = 0; j < n; j++)
                free(v[j]);
            free(v);
        } else if (t == RT_GGUF_ARRAY) {
            uint64_t n = rt_gguf_arr_n(g, i);
            if (rt_gguf_arr_type(g, i) == RT_GGUF_FLOAT32) {
                float *v = malloc(n * sizeof(float));
                for (uint64_t j = 0; j < n; j++) {
                    double d;
                    rt_gguf_arr_f64(g, i, j, &d);
                    v[j] = (float)d;
                }
                rt_gguf_writer_add_arr_f32(w, key, v, n);
                free(v);
            } else {
                int32_t *v = malloc(n * sizeof(int32_t));
                for (uint64_t j = 0; j < n; j++) {
                    int64_t d;
                    rt_gguf_arr_i64(g, i, j, &d);
                    v[j] = (int32_t)d;
                }
                rt_gguf_writer_add_arr_i32(w, key, v, n);
                free(v);
            }
        } else if (t == RT_GGUF_FLOAT32) {
            double d;
            rt_gguf_kv_f64(g, i, &d);
            rt_gguf_writer_add_f32(w, key, (float)d);
        } else if (t == RT_GGUF_BOOL) {
            int64_t d;
            rt_gguf_kv_i64(g, i, &d);
            rt_gguf_writer_add_bool(w, key, d != 0);
        } else {
            int64_t d;
            rt_gguf_kv_i64(g, i, &d);
            rt_gguf_writer_add_u32(w, key, (uint32_t)d);
        }
    }
    for (int64_t i = 0; i < rt_gguf_n_tensors(g); i++) {
        const rt_gguf_tensor *t = rt_gguf_tensor_at(g, i);
        char name[128];
        snprintf(name, sizeof(name), "%.*s", (int)t->name.n, t->name.p);
        assert_int_equal(rt_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data, t->nbytes), 0);
    }
    static float scale[128];
    int64_t ne[1] = {128};
    rt_gguf_writer_add_tensor(w, "blk.1.attn_q.scale", KN_TYPE_F32, 1, ne, scale, sizeof(scale));
    assert_int_equal(rt_gguf_writer_write(w, path, err, sizeof(err)), 0);
    rt_gguf_writer_free(w);
    rt_gguf_free(g);
    assert_int_equal(rt_model_load(path, NULL, &m, err, sizeof(err)), -EINVAL);
    printf("# %s\n", err);
    assert_non_null(strstr(err, "tensor blk.1.attn_q.scale is not used"));
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fast_matches_reference),
        cmocka_unit_test(test_chunked_prefill_matches),
        cmocka_unit_test(test_batch_matches_alone),
        cmocka_unit_test(test_gpt_oss_mxfp4_greedy),
        cmocka_unit_test(test_window_blocks),
        cmocka_unit_test(test_window_semantics),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
