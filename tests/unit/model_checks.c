/* The model checks the unit tests share (model_checks.h). */
#include "model_checks.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define MAX_SEQ 8
#define MAX_GEN 16

rt_model *mc_load(const char *path, const char *device, bool reference, int threads)
{
    rt_model_opts o = {.n_threads = threads, .reference = reference, .device = device};
    rt_model *m = NULL;
    char err[512];
    if (rt_model_load(path, &o, &m, err, sizeof(err)))
        fail_msg("load %s on %s: %s", path, device ? device : "cpu", err);
    return m;
}

int mc_argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

double mc_cosine(const float *a, const float *b, int n)
{
    double ab = 0, aa = 0, bb = 0;
    for (int i = 0; i < n; i++) {
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    return ab / sqrt(aa * bb);
}

static rt_kv *kv_for(rt_model *m, int tokens, int block_tokens)
{
    char err[512];
    rt_kv *kv = rt_kv_new(m, (size_t)tokens * rt_model_kv_bytes_per_token(m, KN_TYPE_F16), block_tokens, KN_TYPE_F16,
                          err, sizeof(err));
    if (!kv)
        fail_msg("rt_kv_new: %s", err);
    return kv;
}

void mc_greedy(rt_model *m, const int32_t *prompt, int n_prompt, int32_t *out, int n, float *logits_out)
{
    const int V = rt_model_hparams(m)->n_vocab;
    rt_kv *kv = kv_for(m, n_prompt + n + 16, 16);
    rt_seq *s = rt_seq_new(kv, n_prompt + n + 16);
    float *logits = malloc((size_t)V * sizeof(float));
    assert_non_null(logits);
    rt_batch_entry e = {.seq = s, .tokens = prompt, .n_tokens = n_prompt, .logits = logits};
    assert_int_equal(rt_model_forward(m, &e, 1), 0);
    for (int i = 0; i < n; i++) {
        if (logits_out)
            memcpy(logits_out + (size_t)i * V, logits, (size_t)V * sizeof(float));
        out[i] = mc_argmax(logits, V);
        e = (rt_batch_entry){.seq = s, .tokens = &out[i], .n_tokens = 1, .logits = logits};
        assert_int_equal(rt_model_forward(m, &e, 1), 0);
    }
    free(logits);
    rt_seq_free(s);
    assert_int_equal(rt_kv_blocks_free(kv), rt_kv_blocks_total(kv));
    rt_kv_free(kv);
}

void mc_batch_matches_alone(rt_model *m, const int32_t *prompt, int n_prompt, int n_seq, int n_gen,
                            const char *what)
{
    assert_true(n_seq >= 1 && n_seq <= MAX_SEQ && n_gen >= 1 && n_gen <= MAX_GEN && n_prompt >= n_seq + 2);
    const int V = rt_model_hparams(m)->n_vocab;
    rt_kv *kv = kv_for(m, 512, 8); /* small blocks: sequences cross them */
    int32_t prompts[MAX_SEQ][MAX_SEQ + 2];
    int lens[MAX_SEQ];
    for (int s = 0; s < n_seq; s++) {
        lens[s] = 3 + s;
        for (int i = 0; i < lens[s]; i++)
            prompts[s][i] = prompt[(i + s) % n_prompt];
    }
    int32_t alone[MAX_SEQ][MAX_GEN] = {{0}}, together[MAX_SEQ][MAX_GEN] = {{0}};
    float *logits = malloc((size_t)n_seq * V * sizeof(float));
    assert_non_null(logits);
    for (int s = 0; s < n_seq; s++) {
        rt_seq *seq = rt_seq_new(kv, 64);
        rt_batch_entry e = {.seq = seq, .tokens = prompts[s], .n_tokens = lens[s], .logits = logits};
        assert_int_equal(rt_model_forward(m, &e, 1), 0);
        for (int i = 0; i < n_gen; i++) {
            alone[s][i] = mc_argmax(logits, V);
            e = (rt_batch_entry){.seq = seq, .tokens = &alone[s][i], .n_tokens = 1, .logits = logits};
            assert_int_equal(rt_model_forward(m, &e, 1), 0);
        }
        rt_seq_free(seq);
    }
    rt_seq *seqs[MAX_SEQ];
    rt_batch_entry e[MAX_SEQ];
    for (int s = 0; s < n_seq; s++) {
        seqs[s] = rt_seq_new(kv, 64);
        e[s] = (rt_batch_entry){
            .seq = seqs[s], .tokens = prompts[s], .n_tokens = lens[s], .logits = logits + (size_t)s * V};
    }
    assert_int_equal(rt_model_forward(m, e, n_seq), 0);
    for (int i = 0; i < n_gen; i++) {
        for (int s = 0; s < n_seq; s++) {
            together[s][i] = mc_argmax(logits + (size_t)s * V, V);
            e[s] = (rt_batch_entry){
                .seq = seqs[s], .tokens = &together[s][i], .n_tokens = 1, .logits = logits + (size_t)s * V};
        }
        assert_int_equal(rt_model_forward(m, e, n_seq), 0);
    }
    if (memcmp(alone, together, sizeof(alone)))
        fail_msg("%s: batched tokens differ from alone", what);
    for (int s = 0; s < n_seq; s++)
        rt_seq_free(seqs[s]);
    assert_int_equal(rt_kv_blocks_free(kv), rt_kv_blocks_total(kv));
    free(logits);
    rt_kv_free(kv);
}
