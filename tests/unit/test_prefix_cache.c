/* The KV cache's prefix cache (runtime/kv_prefix.c), on a small generated
 * model: a hit, a partial hit and a miss give the logits a cold prefill
 * gives; the pool takes cached blocks back least recently used first, a
 * prefix's later blocks before its first; a block shared by 16 sequences
 * stays held until the last lets go; and through the scheduler, greedy
 * answers with the cache equal those without, a cancelled sharer leaves the
 * others' answers alone, and cached_tokens says what the cache gave. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tests/unit/model_harness.h"
#include "runtime/model.h"
#include "runtime/model_gen.h"
#include "runtime/sched.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { BT = 16, VOCAB = 512, MAXT = 256 };

static tiny_model tm;
static rt_model *model; /* tm.model */

static int setup(void **state)
{
    (void)state;
    if (tiny_model_open(&tm, "prefix", VOCAB, 7, 1))
        return -1;
    model = tm.model;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tiny_model_close(&tm);
    return 0;
}

static rt_kv *kv_new(int blocks)
{
    char err[256], why[256];
    size_t bytes = (size_t)blocks * BT * rt_model_kv_bytes_per_token(model, KN_TYPE_F16);
    rt_kv *kv = rt_kv_new(model, bytes, BT, KN_TYPE_F16, err, sizeof(err));
    assert_non_null(kv);
    assert_int_equal(rt_kv_blocks_total(kv), blocks);
    assert_int_equal(rt_kv_prefix_enable(kv, why, sizeof(why)), 0);
    return kv;
}

static void tokens_of(int32_t *t, int n, int seed)
{
    for (int i = 0; i < n; i++)
        t[i] = 1 + (int32_t)((i * 37u + (unsigned)seed * 101u) % (VOCAB - 1));
}

/* Runs tokens[len, n) through s (the last one's logits into logits, when
 * not NULL), then caches its full blocks. */
static void prefill(rt_seq *s, const int32_t *tokens, int n, float *logits)
{
    const int at = rt_seq_len(s);
    rt_batch_entry e = {.seq = s, .tokens = tokens + at, .n_tokens = n - at, .logits = logits};
    assert_int_equal(rt_model_forward(model, &e, 1), 0);
    rt_seq_cache_blocks(s, tokens);
}

static int argmax(const float *x)
{
    int b = 0;
    for (int i = 1; i < VOCAB; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

static void assert_logits_close(const float *a, const float *b)
{
    for (int i = 0; i < VOCAB; i++)
        assert_true(fabsf(a[i] - b[i]) <= 1e-3f * (1.0f + fabsf(a[i])));
    assert_int_equal(argmax(a), argmax(b));
}

/* A sequence reusing what tokens' prefix left cached, then computing the
 * rest: how much it reused, and its last logits, which must equal cold's. */
static int reuse_then_prefill(rt_kv *kv, const int32_t *t, int n, const float *cold)
{
    float logits[VOCAB];
    rt_seq *s = rt_seq_new(kv, MAXT);
    int hit = rt_seq_reuse_prefix(s, t, n - 1);
    assert_int_equal(rt_seq_len(s), hit);
    prefill(s, t, n, logits);
    if (cold)
        assert_logits_close(cold, logits);
    rt_seq_free(s);
    return hit;
}

/* 60 tokens leave 3 full blocks cached (the partial fourth is not): the
 * same prompt reuses all three, one changed at position 40 the first two,
 * one changed at position 0 none; a prompt that ends inside the cached
 * run reuses the whole blocks before its last token. */
static void test_hit_partial_miss(void **state)
{
    (void)state;
    rt_kv *kv = kv_new(64);
    int32_t t[64], u[64], v[64];
    float cold[3][VOCAB];
    tokens_of(t, 60, 1);
    memcpy(u, t, sizeof(t));
    u[40] = 3;
    memcpy(v, t, sizeof(t));
    v[0] = 3;
    /* the cold logits, each from a pool of its own */
    const int32_t *ps[3] = {t, u, v};
    for (int i = 0; i < 3; i++) {
        rt_kv *cold_kv = kv_new(64);
        rt_seq *s = rt_seq_new(cold_kv, MAXT);
        prefill(s, ps[i], 60, cold[i]);
        rt_seq_free(s);
        rt_kv_free(cold_kv);
    }

    rt_seq *a = rt_seq_new(kv, MAXT);
    assert_int_equal(rt_seq_reuse_prefix(a, t, 59), 0); /* nothing cached yet */
    prefill(a, t, 60, NULL);
    assert_int_equal(rt_kv_blocks_cached(kv), 3);
    assert_int_equal(rt_kv_blocks_evictable(kv), 0);
    rt_seq_free(a);
    assert_int_equal(rt_kv_blocks_evictable(kv), 3);
    assert_int_equal(rt_kv_blocks_free(kv), 64); /* evictable blocks count as free */

    assert_int_equal(reuse_then_prefill(kv, t, 60, cold[0]), 48);
    assert_int_equal(reuse_then_prefill(kv, u, 60, cold[1]), 32);
    assert_int_equal(reuse_then_prefill(kv, v, 60, cold[2]), 0);
    /* 40 tokens: the whole blocks before the last token */
    rt_seq *b = rt_seq_new(kv, MAXT);
    assert_int_equal(rt_seq_reuse_prefix(b, t, 39), 32);
    rt_seq_free(b);
    /* exactly 48: the last token's block is computed, not reused */
    b = rt_seq_new(kv, MAXT);
    assert_int_equal(rt_seq_reuse_prefix(b, t, 47), 32);
    rt_seq_free(b);
    /* a peek (the scheduler's estimate of a waiting prompt) says what a
     * reuse would take, and takes nothing */
    int evictable = rt_kv_blocks_evictable(kv);
    assert_int_equal(rt_kv_prefix_peek(kv, t, 59), 48);
    int32_t w[64];
    memcpy(w, t, sizeof(t));
    w[20] = 5; /* the second block differs from every one cached */
    assert_int_equal(rt_kv_prefix_peek(kv, w, 59), 16);
    w[0] = 7;
    assert_int_equal(rt_kv_prefix_peek(kv, w, 59), 0);
    assert_int_equal(rt_kv_prefix_peek(kv, t, 47), 32);
    assert_int_equal(rt_kv_blocks_evictable(kv), evictable);
    rt_kv_free(kv);
}

/* An 8-block pool: a 4-block prefix, freed, stays cached; a 7-block
 * sequence of other tokens takes the 4 free blocks, then 3 cached ones,
 * the prefix's last first; its first block survives and is reused. */
static void test_eviction_under_pressure(void **state)
{
    (void)state;
    rt_kv *kv = kv_new(8);
    int32_t t[128], o[128];
    tokens_of(t, 64, 2);
    tokens_of(o, 112, 3);
    rt_seq *a = rt_seq_new(kv, MAXT);
    prefill(a, t, 64, NULL);
    rt_seq_free(a);
    assert_int_equal(rt_kv_blocks_cached(kv), 4);
    assert_int_equal(rt_kv_blocks_evictable(kv), 4);

    rt_seq *b = rt_seq_new(kv, MAXT);
    prefill(b, o, 112, NULL);
    assert_int_equal(rt_kv_blocks_free(kv), 1);
    assert_int_equal(rt_kv_blocks_evictable(kv), 1);
    rt_seq *c = rt_seq_new(kv, MAXT);
    assert_int_equal(rt_seq_reuse_prefix(c, t, 63), 16);
    assert_int_equal(rt_kv_blocks_free(kv), 0);
    /* no room now: a grow that needs a block fails and changes nothing */
    rt_batch_entry e = {.seq = c, .tokens = t + 16, .n_tokens = 1};
    assert_int_equal(rt_model_forward(model, &e, 1), -ENOSPC);
    assert_int_equal(rt_seq_len(c), 16);
    rt_seq_free(c);
    rt_seq_free(b);
    assert_int_equal(rt_kv_blocks_free(kv), 8);
    rt_kv_free(kv);
}

/* Three cached blocks shared by 16 sequences, each computing a tail of
 * its own after them: the blocks are held (not evictable) until the last
 * sharer lets go, and a sharer's tail never changes them. */
static void test_shared_by_16(void **state)
{
    (void)state;
    rt_kv *kv = kv_new(64);
    int32_t t[64];
    float cold[VOCAB];
    tokens_of(t, 56, 4);
    rt_seq *a = rt_seq_new(kv, MAXT);
    prefill(a, t, 56, cold);
    rt_seq_free(a);

    rt_seq *s[16];
    for (int i = 0; i < 16; i++) {
        int32_t u[64];
        memcpy(u, t, sizeof(u));
        u[50] = 1 + i; /* a tail of its own */
        s[i] = rt_seq_new(kv, MAXT);
        assert_int_equal(rt_seq_reuse_prefix(s[i], u, 55), 48);
        prefill(s[i], u, 56, NULL);
    }
    assert_int_equal(rt_kv_blocks_evictable(kv), 0);
    assert_int_equal(rt_kv_blocks_free(kv), 64 - 3 - 16);
    for (int i = 0; i < 15; i++) {
        rt_seq_free(s[i]);
        assert_int_equal(rt_kv_blocks_evictable(kv), 0);
    }
    assert_int_equal(rt_kv_blocks_free(kv), 64 - 3 - 1);
    rt_seq_free(s[15]);
    assert_int_equal(rt_kv_blocks_evictable(kv), 3);
    assert_int_equal(rt_kv_blocks_free(kv), 64);
    /* the shared blocks hold what the first sequence wrote */
    assert_int_equal(reuse_then_prefill(kv, t, 56, cold), 48);
    rt_kv_free(kv);
}

/* A model with sliding-window layers gets no cache, and says why. */
static void test_windowed_model_refused(void **state)
{
    (void)state;
    char p2[128], err[256], why[256];
    snprintf(p2, sizeof(p2), "%s/w.gguf", tm.dir);
    rt_gen_params p;
    rt_gen_params_default(&p);
    p.arch = "gemma3";
    p.dim = 64;
    p.layers = 6;
    p.heads = 4;
    p.kv_heads = 2;
    p.ffn = 128;
    p.vocab = VOCAB;
    p.ctx = 512;
    p.swa = 32;
    assert_int_equal(rt_model_gen(&p, p2, err, sizeof(err)), 0);
    rt_model *m;
    rt_model_opts o = {.n_threads = 1};
    assert_int_equal(rt_model_load(p2, &o, &m, err, sizeof(err)), 0);
    rt_kv *kv = rt_kv_new(m, 1 << 20, BT, KN_TYPE_F16, err, sizeof(err));
    assert_non_null(kv);
    assert_int_equal(rt_kv_prefix_enable(kv, why, sizeof(why)), -ENOTSUP);
    assert_non_null(strstr(why, "sliding-window"));
    assert_false(rt_kv_prefix_on(kv));
    rt_kv_free(kv);
    rt_model_free(m);
    unlink(p2);
}

/* ---- through the scheduler ---- */

enum { NREQ = 17, GEN = 12 };

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t out[NREQ][GEN];
    int n_out[NREQ], cached[NREQ], error[NREQ], finals;
} seen = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void on_event(void *user, const rt_sched_event *ev)
{
    int i = (int)(intptr_t)user;
    pthread_mutex_lock(&seen.mu);
    if (ev->kind != RT_EV_ERROR && ev->token >= 0 && seen.n_out[i] < GEN &&
        !(ev->kind == RT_EV_DONE && ev->completion_tokens == seen.n_out[i]))
        seen.out[i][seen.n_out[i]++] = ev->token;
    if (ev->kind != RT_EV_TEXT) {
        seen.cached[i] = ev->cached_tokens;
        seen.error[i] = ev->kind == RT_EV_ERROR ? ev->error : 0;
        seen.finals++;
        pthread_cond_broadcast(&seen.cv);
    }
    pthread_mutex_unlock(&seen.mu);
}

static void seen_reset(void)
{
    pthread_mutex_lock(&seen.mu);
    memset(seen.out, 0, sizeof(seen.out));
    memset(seen.n_out, 0, sizeof(seen.n_out));
    seen.finals = 0;
    pthread_mutex_unlock(&seen.mu);
}

static void wait_finals(int n)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 120;
    pthread_mutex_lock(&seen.mu);
    int rc = 0;
    while (rc == 0 && seen.finals < n)
        rc = pthread_cond_timedwait(&seen.cv, &seen.mu, &ts);
    pthread_mutex_unlock(&seen.mu);
    assert_int_equal(rc, 0);
}

static rt_sched *sched_new(bool cache)
{
    rt_sched_opts o;
    rt_sched_opts_default(&o);
    assert_true(o.prefix_cache); /* on by default */
    o.prefix_cache = cache;
    o.max_seqs = NREQ;
    o.kv_bytes = (size_t)256 * BT * rt_model_kv_bytes_per_token(model, o.kv_type);
    char err[256];
    rt_sched *s = rt_sched_new(model, &o, err, sizeof(err));
    assert_non_null(s);
    rt_sched_stats st;
    rt_sched_get_stats(s, &st);
    assert_int_equal(st.prefix_cache, cache);
    return s;
}

static uint64_t submit(rt_sched *s, int i, const int32_t *prompt, int n)
{
    rt_sched_req r = {.prompt = prompt, .n_prompt = n, .max_tokens = GEN, .ignore_eos = true, .cb = on_event,
                      .user = (void *)(intptr_t)i};
    rt_sampler_params_default(&r.sampling);
    r.sampling.temperature = 0;
    uint64_t id;
    assert_int_equal(rt_sched_submit(s, &r, &id), 0);
    return id;
}

/* One prompt, then the same with more after it (a chat's next turn), on a
 * scheduler without the cache and one with: the same greedy tokens; with
 * the cache the second turn reuses the first turn's whole blocks, prompt
 * and answer (the last token it answered never went in). Then 16 requests
 * on the same prompt at once, one cancelled as they run: the 15 others
 * answer as the first did, and every block comes back. */
static void test_sched_greedy_same(void **state)
{
    (void)state;
    int32_t p1[200], p2[200];
    tokens_of(p1, 100, 5);
    int32_t ref[2][GEN];
    rt_sched *cold = sched_new(false), *warm = sched_new(true);
    for (int k = 0; k < 2; k++) {
        rt_sched *s = k ? warm : cold;
        seen_reset();
        submit(s, 0, p1, 100);
        wait_finals(1);
        assert_int_equal(seen.n_out[0], GEN);
        assert_int_equal(seen.cached[0], 0);
        /* turn 2: turn 1's prompt, its answer, 20 new tokens */
        memcpy(p2, p1, 100 * sizeof(int32_t));
        memcpy(p2 + 100, seen.out[0], GEN * sizeof(int32_t));
        tokens_of(p2 + 100 + GEN, 20, 6);
        if (k == 0)
            memcpy(ref[0], seen.out[0], sizeof(ref[0]));
        else
            assert_memory_equal(ref[0], seen.out[0], sizeof(ref[0]));
        seen_reset();
        submit(s, 1, p2, 100 + GEN + 20);
        wait_finals(1);
        assert_int_equal(seen.n_out[1], GEN);
        /* 100 prompt + 11 answer tokens were in the KV: 6 whole blocks */
        assert_int_equal(seen.cached[1], k ? 96 : 0);
        if (k == 0)
            memcpy(ref[1], seen.out[1], sizeof(ref[1]));
        else
            assert_memory_equal(ref[1], seen.out[1], sizeof(ref[1]));
    }
    rt_sched_stats st;
    rt_sched_get_stats(warm, &st);
    assert_int_equal(st.prompt_tokens_cached, 96);
    assert_int_equal(st.prompt_tokens_computed, 100 + 132 - 96);
    rt_sched_get_stats(cold, &st);
    assert_int_equal(st.prompt_tokens_cached, 0);
    rt_sched_free(cold);

    /* 16 sharers of turn 2's prompt, one cancelled while they run */
    seen_reset();
    uint64_t ids[NREQ];
    for (int i = 1; i < NREQ; i++)
        ids[i] = submit(warm, i, p2, 132);
    rt_sched_cancel(warm, ids[5]);
    wait_finals(NREQ - 1);
    for (int i = 1; i < NREQ; i++) {
        if (i == 5 && seen.error[5]) {
            assert_int_equal(seen.error[5], -ECANCELED);
            continue;
        }
        assert_int_equal(seen.error[i], 0);
        assert_int_equal(seen.cached[i], 128);
        assert_memory_equal(ref[1], seen.out[i], sizeof(ref[1]));
    }
    /* every block is free or evictable once they are done */
    for (int tries = 0; tries < 100; tries++) {
        rt_sched_get_stats(warm, &st);
        if (st.kv_blocks_free == st.kv_blocks_total && st.running == 0)
            break;
        usleep(10000);
    }
    assert_int_equal(st.kv_blocks_free, st.kv_blocks_total);
    assert_true(st.kv_blocks_cached > 0);
    assert_int_equal(st.kv_blocks_evictable, st.kv_blocks_cached);
    rt_sched_free(warm);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hit_partial_miss),
        cmocka_unit_test(test_eviction_under_pressure),
        cmocka_unit_test(test_shared_by_16),
        cmocka_unit_test(test_windowed_model_refused),
        cmocka_unit_test(test_sched_greedy_same),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
