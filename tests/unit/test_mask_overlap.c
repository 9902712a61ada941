/* Grammar masks computed on a thread of their own while the forward pass
 * runs (sched.c's masks_start: the default where the model runs off the
 * CPU) give the answers masks computed at sampling give: six seeded,
 * constrained requests at once, run with the overlap forced on and then
 * off, token for token, and the answers are in the grammar's language. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "tests/unit/model_harness.h"
#include "runtime/grammar/grammar.h"
#include "runtime/model.h"
#include "runtime/model_gen.h"
#include "runtime/sched.h"

#define N_REQ 6
#define MAX_GEN 48

static tiny_model tm;
static rt_model *model; /* tm.model */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int32_t toks[N_REQ][MAX_GEN];
static int n_toks[N_REQ], n_done;
static char text[N_REQ][1024];
static size_t text_len[N_REQ];

static void on_event(void *user, const rt_sched_event *ev)
{
    int i = (int)(intptr_t)user;
    pthread_mutex_lock(&mu);
    if (ev->kind == RT_EV_TEXT && n_toks[i] < MAX_GEN)
        toks[i][n_toks[i]++] = ev->token;
    if ((ev->kind == RT_EV_TEXT || ev->kind == RT_EV_DONE) && ev->text &&
        text_len[i] + ev->text_len < sizeof(text[i])) {
        memcpy(text[i] + text_len[i], ev->text, ev->text_len);
        text_len[i] += ev->text_len;
    }
    if (ev->kind == RT_EV_DONE || ev->kind == RT_EV_ERROR)
        n_done++;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

/* The six answers with the overlap on (1) or off (0), into out/n_out. */
static void run(rt_grammar *g, int overlap, int32_t out[N_REQ][MAX_GEN], int n_out[N_REQ])
{
    rt_sched_opts o;
    rt_sched_opts_default(&o);
    o.max_seqs = N_REQ;
    o.overlap_masks = overlap;
    char err[256];
    rt_sched *s = rt_sched_new(model, &o, err, sizeof(err));
    assert_non_null(s);
    memset(n_toks, 0, sizeof(n_toks));
    memset(text_len, 0, sizeof(text_len));
    n_done = 0;
    for (int i = 0; i < N_REQ; i++) {
        int32_t prompt[8];
        for (int k = 0; k < 8; k++)
            prompt[k] = 3 + (13 * k + 5 * i) % 200;
        rt_sched_req r = {.prompt = prompt, .n_prompt = 8, .max_tokens = MAX_GEN, .grammar = g,
                          .cb = on_event, .user = (void *)(intptr_t)i};
        rt_sampler_params_default(&r.sampling);
        r.sampling.temperature = 1;
        r.sampling.seed = 100 + (uint64_t)i;
        uint64_t id;
        assert_int_equal(rt_sched_submit(s, &r, &id), 0);
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 60;
    pthread_mutex_lock(&mu);
    while (n_done < N_REQ && pthread_cond_timedwait(&cv, &mu, &until) != ETIMEDOUT)
        ;
    int done = n_done;
    memcpy(out, toks, sizeof(toks));
    memcpy(n_out, n_toks, sizeof(n_toks));
    pthread_mutex_unlock(&mu);
    assert_int_equal(done, N_REQ);
    rt_sched_free(s);
}

static void test_overlap_same_answers(void **state)
{
    (void)state;
    const char *schema = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":0,"
                         "\"maximum\":999},\"b\":{\"enum\":[\"x\",\"yy\",\"zzz\",\"yz\"]},"
                         "\"c\":{\"type\":\"string\",\"maxLength\":6}},\"required\":[\"a\",\"b\",\"c\"],"
                         "\"additionalProperties\":false}";
    json_t *js = json_loads(schema, 0, NULL);
    assert_non_null(js);
    char *gbnf = NULL, err[256];
    size_t len = 0;
    assert_int_equal(rt_schema_gbnf(js, "", &gbnf, &len, err, sizeof(err)), 0);
    json_decref(js);
    char *full = malloc(len + 32);
    assert_non_null(full);
    memcpy(full, gbnf, len);
    len += (size_t)snprintf(full + len, 32, "root ::= value\n");
    free(gbnf);
    rt_gvocab *v = rt_gvocab_new(rt_model_tokenizer(model));
    assert_non_null(v);
    rt_grammar *g = NULL;
    assert_int_equal(rt_grammar_new(full, len, v, &g, err, sizeof(err)), 0);
    free(full);

    static int32_t on[N_REQ][MAX_GEN], off[N_REQ][MAX_GEN];
    int n_on[N_REQ], n_off[N_REQ];
    run(g, 1, on, n_on);
    char on_text[N_REQ][1024];
    memcpy(on_text, text, sizeof(text));
    run(g, 0, off, n_off);
    int longest = 0;
    for (int i = 0; i < N_REQ; i++) {
        assert_int_equal(n_on[i], n_off[i]);
        assert_memory_equal(on[i], off[i], (size_t)n_on[i] * sizeof(int32_t));
        if (n_on[i] > longest)
            longest = n_on[i];
        /* a complete answer is the schema's JSON */
        json_t *a = json_loadb(on_text[i], text_len[i], 0, NULL);
        if (n_on[i] < MAX_GEN) {
            assert_non_null(a);
            assert_true(json_is_integer(json_object_get(a, "a")));
        }
        json_decref(a);
    }
    assert_true(longest > 4); /* the grammar had a say in many steps */
    rt_grammar_free(g);
    rt_gvocab_free(v);
}

static int setup(void **state)
{
    (void)state;
    if (tiny_model_open(&tm, "mask", 512, 5, 2))
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_overlap_same_answers),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
