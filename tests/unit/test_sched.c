/* Scheduler admission, driven directly: each priority has its own queue
 * limit, interactive requests start before batch ones, and requests admitted
 * together are counted against the KV pool together.
 *
 * To make "submitted while the compute thread is busy" deterministic, a
 * gate request's callback holds the compute thread until the test has
 * submitted what it wants to land in one intake. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tests/unit/model_harness.h"
#include "gateway/base/clock.h"
#include "runtime/model.h"
#include "runtime/model_gen.h"
#include "runtime/sched.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static tiny_model tm;
static rt_model *model; /* tm.model */

/* What the callbacks saw, under mu. The gate request's gate_at-th event
 * holds the compute thread until open_gate; gate_again arms it for a later
 * event of the same request. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool gate_reached;
    int gate_at, gate_events, opens;
    int finals;
    int order[16]; /* request tags in the order their final event came */
    const char *reason[16];
    int error[16]; /* an ERROR's */
    int watch, gate_at_watch; /* the gate's events when request `watch` had its first (0: none yet) */
} seen = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

enum { GATE = 100 }; /* the tag of the gate request */

/* Fair share: requests tagged FAIR_TAG x g + k count for group g (1..3):
 * its tokens, its finals, and the tokens of every group when group g's
 * last request (of `fair.n`) ended first; and, by group, how many had a
 * first token and no final yet, at most. */
enum { FAIR_TAG = 1000 };
static struct {
    int n;
    long tokens[4], at_first_done[4];
    int done[4], open[4], most_open[4];
    bool first_done;
} fair;

static void fair_count(int tag, const rt_sched_event *ev)
{
    int g = tag / FAIR_TAG;
    if (g < 1 || g > 3)
        return;
    bool token = ev->kind == RT_EV_TEXT || (ev->kind == RT_EV_DONE && ev->completion_tokens > 0);
    fair.tokens[g] += token;
    if (token && ev->completion_tokens == 1 && ++fair.open[g] > fair.most_open[g])
        fair.most_open[g] = fair.open[g];
    if (ev->kind == RT_EV_TEXT)
        return;
    fair.open[g]--;
    if (++fair.done[g] == fair.n && !fair.first_done) {
        fair.first_done = true;
        memcpy(fair.at_first_done, fair.tokens, sizeof(fair.tokens));
    }
}

static void on_event(void *user, const rt_sched_event *ev)
{
    int tag = (int)(intptr_t)user;
    pthread_mutex_lock(&seen.mu);
    if (tag == GATE && ++seen.gate_events == seen.gate_at) {
        int opens = seen.opens;
        seen.gate_reached = true;
        pthread_cond_broadcast(&seen.cv);
        while (seen.opens == opens)
            pthread_cond_wait(&seen.cv, &seen.mu);
    }
    fair_count(tag, ev);
    if (tag == seen.watch && !seen.gate_at_watch)
        seen.gate_at_watch = seen.gate_events;
    if (ev->kind != RT_EV_TEXT) {
        if (seen.finals < 16) {
            seen.order[seen.finals] = tag;
            seen.reason[seen.finals] = ev->kind == RT_EV_DONE ? ev->finish_reason : "error";
            seen.error[seen.finals] = ev->kind == RT_EV_ERROR ? ev->error : 0;
        }
        seen.finals++;
        pthread_cond_broadcast(&seen.cv);
    }
    pthread_mutex_unlock(&seen.mu);
}

static void seen_reset(void)
{
    pthread_mutex_lock(&seen.mu);
    seen.gate_reached = false;
    seen.gate_at = 1;
    seen.gate_events = 0;
    seen.finals = 0;
    seen.watch = seen.gate_at_watch = 0;
    memset(&fair, 0, sizeof(fair));
    pthread_mutex_unlock(&seen.mu);
}

/* Waits (at most 60 s) until the gate's callback holds the compute thread,
 * or until n final events have come. */
static bool wait_seen(bool for_gate, int n)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 60;
    pthread_mutex_lock(&seen.mu);
    int rc = 0;
    while (rc == 0 && (for_gate ? !seen.gate_reached : seen.finals < n))
        rc = pthread_cond_timedwait(&seen.cv, &seen.mu, &ts);
    pthread_mutex_unlock(&seen.mu);
    return rc == 0;
}

static void open_gate(void)
{
    pthread_mutex_lock(&seen.mu);
    seen.opens++;
    pthread_cond_broadcast(&seen.cv);
    pthread_mutex_unlock(&seen.mu);
}

/* Opens the gate and holds the thread again at the gate request's
 * event number `at` (wait_seen(true, 0) waits for it). */
static void gate_again(int at)
{
    pthread_mutex_lock(&seen.mu);
    seen.gate_reached = false;
    seen.gate_at = at;
    seen.opens++;
    pthread_cond_broadcast(&seen.cv);
    pthread_mutex_unlock(&seen.mu);
}

static int submit_for(rt_sched *s, int tag, int n_prompt, int max_tokens, rt_priority prio, const char *tenant,
                      double weight)
{
    int32_t prompt[500];
    assert_true(n_prompt <= 500);
    for (int i = 0; i < n_prompt; i++)
        prompt[i] = 1 + (7 * i + tag) % 500;
    rt_sched_req r = {
        .prompt = prompt,
        .n_prompt = n_prompt,
        .max_tokens = max_tokens,
        .ignore_eos = true,
        .priority = prio,
        .tenant = tenant,
        .weight = weight,
        .cb = on_event,
        .user = (void *)(intptr_t)tag,
    };
    rt_sampler_params_default(&r.sampling);
    r.sampling.temperature = 0;
    uint64_t id;
    return rt_sched_submit(s, &r, &id);
}

static int submit(rt_sched *s, int tag, int n_prompt, int max_tokens, rt_priority prio)
{
    return submit_for(s, tag, n_prompt, max_tokens, prio, NULL, 0);
}

static int batch_max_wait_ms = -1; /* the next sched_new's, when >= 0 */
static int max_batch_tokens = -1;  /* the same */
static int prompt_max_wait_ms = -1; /* the same */

static rt_sched *sched_new(int max_seqs, int max_queue, int kv_blocks)
{
    rt_sched_opts o;
    rt_sched_opts_default(&o);
    o.max_seqs = max_seqs;
    o.max_queue = max_queue;
    if (batch_max_wait_ms >= 0)
        o.batch_max_wait_ms = batch_max_wait_ms;
    batch_max_wait_ms = -1;
    if (max_batch_tokens >= 0)
        o.max_batch_tokens = max_batch_tokens;
    max_batch_tokens = -1;
    if (prompt_max_wait_ms >= 0)
        o.prompt_max_wait_ms = prompt_max_wait_ms;
    prompt_max_wait_ms = -1;
    if (kv_blocks)
        o.kv_bytes = (size_t)kv_blocks * o.block_tokens * rt_model_kv_bytes_per_token(model, o.kv_type);
    char err[256];
    rt_sched *s = rt_sched_new(model, &o, err, sizeof(err));
    if (!s)
        fprintf(stderr, "rt_sched_new: %s\n", err);
    assert_non_null(s);
    if (kv_blocks) {
        rt_sched_stats st;
        rt_sched_get_stats(s, &st);
        assert_int_equal(st.kv_blocks_total, kv_blocks);
    }
    seen_reset();
    return s;
}

static int setup(void **state)
{
    (void)state;
    if (tiny_model_open(&tm, "sched", 512, 11, 1))
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

/* One sequence slot, a queue of one per priority. While the gate request
 * runs, a batch request queues and a second is turned away; an interactive
 * request still queues (the batch backlog is not its queue), a second is
 * turned away. When the gate ends, the interactive request starts first. */
static void test_queue_per_priority(void **state)
{
    rt_sched *s = sched_new(1, 1, 0);
    assert_int_equal(submit(s, GATE, 4, 3, RT_PRIO_INTERACTIVE), 0);
    assert_true(wait_seen(true, 0));

    assert_int_equal(submit(s, 1, 4, 2, RT_PRIO_BATCH), 0);
    assert_int_equal(submit(s, 2, 4, 2, RT_PRIO_BATCH), -EAGAIN);
    assert_int_equal(submit(s, 3, 4, 2, RT_PRIO_INTERACTIVE), 0);
    assert_int_equal(submit(s, 4, 4, 2, RT_PRIO_INTERACTIVE), -EAGAIN);
    rt_sched_stats st;
    rt_sched_get_stats(s, &st);
    assert_int_equal(st.running, 1);
    assert_int_equal(st.queued, 2);
    assert_int_equal(st.queued_batch, 1);

    open_gate();
    assert_true(wait_seen(false, 3));
    assert_int_equal(seen.order[0], GATE);
    assert_int_equal(seen.order[1], 3);
    assert_int_equal(seen.order[2], 1);
    rt_sched_get_stats(s, &st);
    assert_int_equal(st.queued, 0);
    assert_int_equal(st.queued_batch, 0);
    rt_sched_free(s);
}

/* Three slots, one running, a queue of one per priority: three interactive
 * requests fit (two will start at once, one queues), a fourth does not;
 * with the free slots spoken for, one batch request fits. Before, the two
 * free slots counted for both priorities, and three batch requests were
 * taken into a queue of one. */
static void test_free_slots_counted_once(void **state)
{
    rt_sched *s = sched_new(3, 1, 0);
    assert_int_equal(submit(s, GATE, 4, 3, RT_PRIO_INTERACTIVE), 0);
    assert_true(wait_seen(true, 0));
    for (int i = 1; i <= 3; i++)
        assert_int_equal(submit(s, i, 4, 2, RT_PRIO_INTERACTIVE), 0);
    assert_int_equal(submit(s, 4, 4, 2, RT_PRIO_INTERACTIVE), -EAGAIN);
    assert_int_equal(submit(s, 5, 4, 2, RT_PRIO_BATCH), 0);
    assert_int_equal(submit(s, 6, 4, 2, RT_PRIO_BATCH), -EAGAIN);
    open_gate();
    assert_true(wait_seen(false, 5));
    rt_sched_free(s);
}

/* A batch request that has waited batch_max_wait_ms (50 ms here) starts
 * before interactive requests that came after it. */
static void test_batch_aging(void **state)
{
    batch_max_wait_ms = 50;
    rt_sched *s = sched_new(1, 4, 0);
    assert_int_equal(submit(s, GATE, 4, 3, RT_PRIO_INTERACTIVE), 0);
    assert_true(wait_seen(true, 0));
    assert_int_equal(submit(s, 1, 4, 2, RT_PRIO_BATCH), 0);
    usleep(150 * 1000);
    assert_int_equal(submit(s, 3, 4, 2, RT_PRIO_INTERACTIVE), 0);
    assert_int_equal(submit(s, 2, 4, 2, RT_PRIO_BATCH), 0);
    assert_int_equal(submit(s, 4, 4, 2, RT_PRIO_INTERACTIVE), 0);
    open_gate();
    assert_true(wait_seen(false, 5));
    /* 1 has aged and came before 3: it starts first. 2 came after 3, so 3
     * goes next either way; whether 2 then ages before 4 starts depends on
     * this machine's speed, so the order past 3 is not checked. */
    assert_int_equal(seen.order[0], GATE);
    assert_int_equal(seen.order[1], 1);
    assert_int_equal(seen.order[2], 3);
    rt_sched_free(s);
}

/* A pool of 8 blocks of 16 tokens; four requests of 48-token prompts (3
 * blocks each) arrive in one intake. Two fit at once (3 + 3 blocks and a
 * block of headroom each); admitting all four, each measured against the
 * whole free pool, made their prefill preempt two of them. */
static void test_admission_counts_promised_blocks(void **state)
{
    rt_sched *s = sched_new(8, 8, 8);
    assert_int_equal(submit(s, GATE, 4, 1, RT_PRIO_INTERACTIVE), 0);
    assert_true(wait_seen(true, 0));
    for (int i = 0; i < 4; i++)
        assert_int_equal(submit(s, i, 48, 4, RT_PRIO_INTERACTIVE), 0);
    open_gate();
    assert_true(wait_seen(false, 5));
    for (int i = 0; i < 5; i++)
        assert_string_equal(seen.reason[i], "length");
    /* the stats are published after the step that ended the last one */
    rt_sched_stats st;
    for (int i = 0; i < 500; i++) {
        rt_sched_get_stats(s, &st);
        if (st.kv_blocks_free == 8)
            break;
        usleep(10000);
    }
    assert_int_equal(st.kv_blocks_free, 8);
    assert_int_equal(st.preemptions, 0);
    rt_sched_free(s);
}

/* A batch request's long prompt is being prefilled, a little each step
 * beside a decoding stream, when an interactive request with a short
 * prompt is admitted: its prompt goes first, so it ends long before the
 * batch prompt does. In admission order alone the batch prompt took the
 * whole budget of every step until it was done. */
static void test_interactive_prefill_first(void **state)
{
    max_batch_tokens = 8; /* with one decode: 7 prompt tokens a step */
    rt_sched *s = sched_new(4, 4, 0);
    assert_int_equal(submit(s, GATE, 4, 400, RT_PRIO_INTERACTIVE), 0);
    assert_true(wait_seen(true, 0));
    assert_int_equal(submit(s, 1, 490, 1, RT_PRIO_BATCH), 0);
    /* held again two steps on: the batch request is in and has 14 of its
     * 490 prompt tokens, ~68 steps to go */
    gate_again(3);
    assert_true(wait_seen(true, 0));
    rt_sched_stats st;
    rt_sched_get_stats(s, &st);
    assert_int_equal(st.running, 2);
    assert_int_equal(submit(s, 2, 4, 1, RT_PRIO_INTERACTIVE), 0);
    open_gate();
    assert_true(wait_seen(false, 3));
    assert_int_equal(seen.order[0], 2); /* ~70 steps before the batch prompt is done */
    assert_int_equal(seen.order[1], 1);
    rt_sched_free(s);
}

/* A chat's next turn behind another conversation's first: request 2's
 * 200-token prompt has its first 192 in the prefix cache (an earlier
 * request of the same tokens), request 1's 490 (admitted before it,
 * prefilled 7 tokens a step beside a decoding stream) has none. The short
 * one takes the budget first and has its first token ~70 steps before the
 * long one; in admission order it waited for all of the long one's. With
 * a prompt_max_wait_ms the long one has waited past (150 ms against 50),
 * or of 0 (admission order), the long one goes first: it is not starved. */
static void short_cached_prompt(int max_wait_ms, int sleep_ms, int first)
{
    max_batch_tokens = 8; /* with one decode: 7 prompt tokens a step */
    prompt_max_wait_ms = max_wait_ms;
    rt_sched *s = sched_new(4, 4, 0);
    assert_int_equal(submit(s, 2, 192, 1, RT_PRIO_INTERACTIVE), 0); /* its blocks stay cached */
    assert_true(wait_seen(false, 1));
    seen_reset();
    assert_int_equal(submit(s, GATE, 4, 400, RT_PRIO_INTERACTIVE), 0);
    assert_true(wait_seen(true, 0));
    assert_int_equal(submit(s, 1, 490, 1, RT_PRIO_INTERACTIVE), 0);
    gate_again(3); /* request 1 is in, 14 of its 490 done */
    assert_true(wait_seen(true, 0));
    usleep((useconds_t)sleep_ms * 1000);
    assert_int_equal(submit(s, 2, 200, 1, RT_PRIO_INTERACTIVE), 0); /* the same first 192 tokens */
    open_gate();
    assert_true(wait_seen(false, 2));
    assert_int_equal(seen.order[0], first);
    assert_int_equal(seen.order[1], first == 1 ? 2 : 1);
    rt_sched_stats st;
    rt_sched_get_stats(s, &st);
    assert_true(st.prompt_tokens_cached >= 192);
    rt_sched_free(s);
}

static void test_short_cached_prompt_first(void **state)
{
    short_cached_prompt(10000, 0, 2);
}

static void test_aged_long_prompt_first(void **state)
{
    short_cached_prompt(50, 150, 1);
    short_cached_prompt(0, 0, 1);
}

/* One sequence slot held by a long batch request, for run_ms: an
 * interactive request that comes then does not wait for it to end. The
 * batch request gives way (one preemption), the interactive one ends
 * first, then the batch one is recomputed and ends too. */
static void interactive_preempts_batch(int run_ms)
{
    rt_sched *s = sched_new(1, 4, 0);
    assert_int_equal(submit(s, GATE, 4, 400, RT_PRIO_BATCH), 0);
    assert_true(wait_seen(true, 0));
    usleep((useconds_t)run_ms * 1000);
    assert_int_equal(submit(s, 1, 4, 2, RT_PRIO_INTERACTIVE), 0);
    open_gate();
    assert_true(wait_seen(false, 2));
    assert_int_equal(seen.order[0], 1);
    assert_int_equal(seen.order[1], GATE);
    assert_string_equal(seen.reason[1], "length");
    rt_sched_stats st;
    rt_sched_get_stats(s, &st);
    assert_int_equal(st.preemptions, 1);
    rt_sched_free(s);
}

/* Before, the interactive request waited out all 400 of the batch
 * request's tokens. */
static void test_interactive_preempts_batch(void **state)
{
    interactive_preempts_batch(0);
}

/* An interactive request that would not fit even with every batch request
 * preempted preempts none: their work would be lost for nothing. It waits
 * for the interactive one ahead of it, and the batch one runs on. */
static void test_no_preemption_for_nothing(void **state)
{
    rt_sched *s = sched_new(4, 4, 8);
    assert_int_equal(submit(s, 1, 90, 2, RT_PRIO_INTERACTIVE), 0); /* 6 of the 8 blocks */
    assert_int_equal(submit(s, GATE, 4, 20, RT_PRIO_BATCH), 0);
    assert_true(wait_seen(true, 0));
    assert_int_equal(submit(s, 2, 60, 2, RT_PRIO_INTERACTIVE), 0); /* 4 blocks: only once 1 is done */
    open_gate();
    assert_true(wait_seen(false, 3));
    for (int i = 0; i < 3; i++)
        assert_string_equal(seen.reason[i], "length");
    assert_int_equal(seen.order[0], 1);
    rt_sched_stats st;
    rt_sched_get_stats(s, &st);
    assert_int_equal(st.preemptions, 0);
    rt_sched_free(s);
}

/* A batch request admitted for having waited batch_max_wait_ms is not the
 * one to give way when the pool runs dry as the sequences grow: the
 * youngest interactive one is. Before, the decodes' shortage preempted the
 * youngest batch request whatever its wait, and an aged one under steady
 * interactive load was preempted again each time it came back. A pool of
 * 8 blocks; three sequences of 4 + 60 tokens (4 blocks each) run short. */
static void test_aged_batch_not_preempted(void **state)
{
    batch_max_wait_ms = 50;
    rt_sched *s = sched_new(4, 4, 8);
    assert_int_equal(submit(s, GATE, 4, 60, RT_PRIO_INTERACTIVE), 0);
    assert_true(wait_seen(true, 0));
    assert_int_equal(submit(s, 1, 4, 60, RT_PRIO_BATCH), 0);
    usleep(150 * 1000); /* aged by the time it is admitted */
    assert_int_equal(submit(s, 2, 4, 60, RT_PRIO_INTERACTIVE), 0);
    open_gate();
    assert_true(wait_seen(false, 3));
    for (int i = 0; i < 3; i++)
        assert_string_equal(seen.reason[i], "length");
    assert_int_equal(seen.order[0], GATE);
    assert_int_equal(seen.order[1], 1); /* the aged batch request ran on */
    assert_int_equal(seen.order[2], 2);
    rt_sched_stats st;
    rt_sched_get_stats(s, &st);
    assert_true(st.preemptions >= 1);
    rt_sched_free(s);
}

/* A batch request admitted at once is no less the one to give way for
 * having run past batch_max_wait_ms (50 ms here): its age since it came
 * is not a wait. Read as one, the pool's shortage preempted the
 * interactive request instead, which then waited behind the batch job.
 * The gate holds the thread 150 ms before the pool runs dry. */
static void test_running_batch_still_gives_way(void **state)
{
    batch_max_wait_ms = 50;
    rt_sched *s = sched_new(4, 4, 8);
    assert_int_equal(submit(s, GATE, 4, 60, RT_PRIO_INTERACTIVE), 0);
    assert_true(wait_seen(true, 0));
    assert_int_equal(submit(s, 1, 4, 60, RT_PRIO_BATCH), 0);
    assert_int_equal(submit(s, 2, 4, 60, RT_PRIO_INTERACTIVE), 0);
    gate_again(10); /* both admitted at once; held again ten tokens on */
    assert_true(wait_seen(true, 0));
    usleep(150 * 1000);
    open_gate();
    assert_true(wait_seen(false, 3));
    for (int i = 0; i < 3; i++)
        assert_string_equal(seen.reason[i], "length");
    assert_int_equal(seen.order[0], GATE);
    assert_int_equal(seen.order[1], 2); /* the interactive request ran on */
    assert_int_equal(seen.order[2], 1);
    rt_sched_stats st;
    rt_sched_get_stats(s, &st);
    assert_true(st.preemptions >= 1);
    rt_sched_free(s);
}

/* A batch request that gives way to an interactive one waits behind it,
 * however long it had run: running is not waiting. Aged by the time since
 * it came (900 ms here, against a batch_max_wait_ms of 300), it was
 * readmitted at once ahead of the interactive request, and as "aged" could
 * not be preempted again: the interactive request waited for it to end. */
static void test_preempted_batch_stays_behind(void **state)
{
    batch_max_wait_ms = 300;
    interactive_preempts_batch(900);
}

/* Two slots, 8 tokens a step: while the gate request runs, request 1
 * (of priority prio) with a 490-token prompt and a deadline 400 ms away
 * is admitted, and the gate holds the compute thread two chunks of its
 * prompt in. */
static rt_sched *deadline_case(rt_priority prio)
{
    max_batch_tokens = 8;
    rt_sched *s = sched_new(2, 4, 0);
    assert_int_equal(submit(s, GATE, 4, 300, RT_PRIO_INTERACTIVE), 0);
    assert_true(wait_seen(true, 0));
    int32_t prompt[490];
    for (int i = 0; i < 490; i++)
        prompt[i] = 1 + (7 * i) % 500;
    rt_sched_req r = {.prompt = prompt,
                      .n_prompt = 490,
                      .max_tokens = 2,
                      .ignore_eos = true,
                      .priority = prio,
                      .cb = on_event,
                      .user = (void *)(intptr_t)1,
                      .deadline_ms = gw_epoch_ms() + 400};
    rt_sampler_params_default(&r.sampling);
    uint64_t id;
    assert_int_equal(rt_sched_submit(s, &r, &id), 0);
    gate_again(3);
    assert_true(wait_seen(true, 0));
    return s;
}

/* A request preempted while its prompt was prefilled has sent nothing:
 * its deadline still drops it (504 in the worker), instead of an answer
 * computed long after the client gave up on it. Request 1 (batch) is
 * part done when interactive request 2 takes its slot, and waits past its
 * deadline while the gate holds. */
static void test_deadline_after_preemption(void **state)
{
    rt_sched *s = deadline_case(RT_PRIO_BATCH);
    assert_int_equal(submit(s, 2, 4, 300, RT_PRIO_INTERACTIVE), 0);
    gate_again(6); /* request 2 admitted in its place */
    assert_true(wait_seen(true, 0));
    usleep(800 * 1000);
    open_gate();
    assert_true(wait_seen(false, 3));
    assert_int_equal(seen.order[0], 1);
    assert_string_equal(seen.reason[0], "error");
    rt_sched_stats st;
    rt_sched_get_stats(s, &st);
    assert_int_equal(st.preemptions, 1);
    rt_sched_free(s);
}

/* A request still prefilling its prompt when its deadline passes has sent
 * nothing either: it is dropped at the next step, not computed on for the
 * many steps a long prompt takes: here the gate holds past its deadline. */
static void test_deadline_during_prefill(void **state)
{
    rt_sched *s = deadline_case(RT_PRIO_INTERACTIVE);
    usleep(800 * 1000);
    open_gate();
    assert_true(wait_seen(false, 1));
    assert_int_equal(seen.order[0], 1);
    assert_string_equal(seen.reason[0], "error");
    rt_sched_stats st;
    rt_sched_get_stats(s, &st);
    assert_int_equal(st.preemptions, 0);
    /* every block went back: the stats are published after the step */
    assert_true(wait_seen(false, 2));
    for (int i = 0; i < 200; i++) {
        rt_sched_get_stats(s, &st);
        if (st.running == 0 && st.kv_blocks_free == st.kv_blocks_total)
            break;
        usleep(10 * 1000);
    }
    assert_int_equal(st.running, 0);
    assert_int_equal(st.kv_blocks_free, st.kv_blocks_total);
    rt_sched_free(s);
}

/* Sampling parameters are checked at submission (the sampler itself is
 * made at admission): a bias on a token past the vocabulary is -EINVAL
 * there, and no event comes. */
static void test_bad_sampling_refused(void **state)
{
    rt_sched *s = sched_new(2, 2, 0);
    int32_t prompt[] = {1, 2, 3};
    rt_sched_req r = {.prompt = prompt, .n_prompt = 3, .max_tokens = 2, .cb = on_event};
    rt_sampler_params_default(&r.sampling);
    r.sampling.n_bias = 1;
    r.sampling.bias[0].token = 512; /* the test model's vocabulary is 512 */
    r.sampling.bias[0].bias = 1.0f;
    uint64_t id;
    assert_int_equal(rt_sched_submit(s, &r, &id), -EINVAL);
    r.sampling.bias[0].token = 511;
    assert_int_equal(rt_sched_submit(s, &r, &id), 0);
    assert_true(wait_seen(false, 1));
    assert_string_equal(seen.reason[0], "length");
    rt_sched_free(s);
}

/* A resumed request (token replay) is checked at submission: its tokens
 * in the vocabulary, fewer than max_tokens; one that passes counts them as
 * generated. */
static void test_resume_checked(void **state)
{
    rt_sched *s = sched_new(2, 2, 0);
    int32_t prompt[] = {1, 2, 3}, resume[] = {4, 5, 512};
    rt_sched_req r = {.prompt = prompt, .n_prompt = 3, .max_tokens = 3, .cb = on_event,
                      .resume = resume, .n_resume = 3};
    rt_sampler_params_default(&r.sampling);
    uint64_t id;
    assert_int_equal(rt_sched_submit(s, &r, &id), -EINVAL); /* as many as max_tokens */
    r.max_tokens = 4;
    assert_int_equal(rt_sched_submit(s, &r, &id), -EINVAL); /* 512: past the vocabulary */
    resume[2] = 6;
    r.ignore_eos = true;
    assert_int_equal(rt_sched_submit(s, &r, &id), 0);
    assert_true(wait_seen(false, 1));
    assert_string_equal(seen.reason[0], "length");
    rt_sched_free(s);
}

static int resumed_calls;
static int count_resumed(void *ud, const char *text, size_t len)
{
    (void)text;
    (void)len;
    resumed_calls++;
    return ud ? -ENOMEM : 0;
}

/* Each resumed token's text goes to resumed_text at submission, once,
 * in order (the worker's parsers); an error there fails the submission. */
static void test_resume_text_each(void **state)
{
    rt_sched *s = sched_new(2, 2, 0);
    int32_t prompt[] = {1, 2, 3}, resume[] = {4, 5, 6};
    int fail;
    rt_sched_req r = {.prompt = prompt, .n_prompt = 3, .max_tokens = 5, .cb = on_event, .resume = resume,
                      .n_resume = 3, .resumed_text = count_resumed, .resumed_ud = &fail, .ignore_eos = true};
    rt_sampler_params_default(&r.sampling);
    uint64_t id;
    resumed_calls = 0;
    assert_int_equal(rt_sched_submit(s, &r, &id), -ENOMEM);
    assert_int_equal(resumed_calls, 1);
    resumed_calls = 0;
    r.resumed_ud = NULL;
    assert_int_equal(rt_sched_submit(s, &r, &id), 0);
    assert_int_equal(resumed_calls, 3);
    assert_true(wait_seen(false, 1));
    rt_sched_free(s);
}

/* A held request is left out of the batches, its sequence kept, until
 * released: a short request held finishes after a long one that was not,
 * and nothing of it comes while it is held. */
static void test_hold_pauses(void **state)
{
    rt_sched *s = sched_new(2, 2, 0);
    int32_t prompt[] = {1, 2, 3};
    /* Long enough that it cannot end in the moment between its submission
     * and the hold (with 3 tokens it sometimes did, on a loaded machine). */
    rt_sched_req r = {.prompt = prompt, .n_prompt = 3, .max_tokens = 400, .ignore_eos = true, .cb = on_event,
                      .user = (void *)(intptr_t)1};
    rt_sampler_params_default(&r.sampling);
    uint64_t held;
    assert_int_equal(rt_sched_submit(s, &r, &held), 0);
    assert_int_equal(rt_sched_hold(s, held, true), 0);
    assert_int_equal(submit(s, 2, 3, 40, RT_PRIO_INTERACTIVE), 0);
    assert_true(wait_seen(false, 1));
    usleep(100 * 1000);
    pthread_mutex_lock(&seen.mu);
    int finals = seen.finals;
    pthread_mutex_unlock(&seen.mu);
    assert_int_equal(finals, 1);
    assert_int_equal(seen.order[0], 2);
    assert_int_equal(rt_sched_hold(s, held, false), 0);
    assert_true(wait_seen(false, 2));
    assert_int_equal(seen.order[1], 1);
    assert_string_equal(seen.reason[1], "length");
    rt_sched_free(s);
}

/* Tenants a and b (weights wa, wb) each have n requests queued while the
 * gate holds the compute thread, four slots between them: until one has
 * all its requests done, each is served tokens in proportion to its
 * weight. */
static void fair_ratio(double wa, double wb, double want)
{
    enum { N = 24 };
    rt_sched *s = sched_new(4, 2 * N, 0);
    fair.n = N;
    assert_int_equal(submit(s, GATE, 4, 2, RT_PRIO_INTERACTIVE), 0);
    assert_true(wait_seen(true, 0));
    for (int k = 0; k < N; k++) {
        assert_int_equal(submit_for(s, FAIR_TAG + k, 4, 8, RT_PRIO_INTERACTIVE, "a", wa), 0);
        assert_int_equal(submit_for(s, 2 * FAIR_TAG + k, 4, 8, RT_PRIO_INTERACTIVE, "b", wb), 0);
    }
    open_gate();
    assert_true(wait_seen(false, 2 * N + 1));
    double ratio = (double)fair.at_first_done[1] / (double)fair.at_first_done[2];
    fprintf(stderr, "weights %g:%g: tokens %ld:%ld while both had work, ratio %.2f\n", wa, wb,
            fair.at_first_done[1], fair.at_first_done[2], ratio);
    assert_true(ratio > want * 0.8 && ratio < want * 1.25);
    assert_int_equal(fair.tokens[1] + fair.tokens[2], 2 * N * 8);
    rt_sched_free(s);
}

static void test_fair_equal_weights(void **state)
{
    fair_ratio(1, 1, 1);
}

static void test_fair_weights_3_to_1(void **state)
{
    fair_ratio(3, 1, 3);
}

/* Work conserving: a tenant alone takes every slot; beside a tenant with
 * one long request, it takes all the others. */
/* Tenant a's 8 requests on four slots, queued while the gate request (of
 * gate_tenant, gate_tokens long) holds the compute thread: the most of a's
 * that ran at once. */
static int most_at_once(const char *gate_tenant, int gate_tokens)
{
    rt_sched *s = sched_new(4, 16, 0);
    fair.n = 8;
    assert_int_equal(submit_for(s, GATE, 4, gate_tokens, RT_PRIO_INTERACTIVE, gate_tenant, 1), 0);
    assert_true(wait_seen(true, 0));
    for (int k = 0; k < 8; k++)
        assert_int_equal(submit_for(s, FAIR_TAG + k, 4, 6, RT_PRIO_INTERACTIVE, "a", 1), 0);
    open_gate();
    assert_true(wait_seen(false, 9));
    rt_sched_free(s);
    return fair.most_open[1];
}

static void test_fair_lone_tenant_takes_all(void **state)
{
    assert_int_equal(most_at_once("a", 2), 4);
    assert_int_equal(most_at_once("b", 40), 3);
    assert_int_equal(seen.order[8], GATE); /* b's one long request ran beside them */
}

/* Priority first: a tenant's interactive request starts before another
 * tenant's batch ones, though they came first and both tenants are new. */
static void test_fair_priority_first(void **state)
{
    rt_sched *s = sched_new(1, 4, 0);
    assert_int_equal(submit_for(s, GATE, 4, 2, RT_PRIO_INTERACTIVE, "x", 1), 0);
    assert_true(wait_seen(true, 0));
    assert_int_equal(submit_for(s, 1, 4, 2, RT_PRIO_BATCH, "b", 5), 0);
    assert_int_equal(submit_for(s, 2, 4, 2, RT_PRIO_BATCH, "b", 5), 0);
    assert_int_equal(submit_for(s, 3, 4, 2, RT_PRIO_INTERACTIVE, "a", 1), 0);
    open_gate();
    assert_true(wait_seen(false, 4));
    assert_int_equal(seen.order[1], 3);
    assert_int_equal(seen.order[2], 1);
    assert_int_equal(seen.order[3], 2);
    rt_sched_free(s);
}

/* Tenant a holds every slot with long requests; b's one request does not
 * wait for them to end: the youngest of a's gives way (one preemption), b
 * ends first, and a's all end too. */
static void test_fair_newcomer_gets_a_slot(void **state)
{
    rt_sched *s = sched_new(4, 8, 0);
    assert_int_equal(submit_for(s, GATE, 4, 60, RT_PRIO_INTERACTIVE, "a", 1), 0);
    assert_true(wait_seen(true, 0));
    for (int k = 1; k <= 3; k++)
        assert_int_equal(submit_for(s, k, 4, 60, RT_PRIO_INTERACTIVE, "a", 1), 0);
    gate_again(5); /* the three are in and decoding */
    assert_true(wait_seen(true, 0));
    rt_sched_stats st;
    rt_sched_get_stats(s, &st);
    assert_int_equal(st.running, 4);
    assert_int_equal(submit_for(s, 9, 4, 2, RT_PRIO_INTERACTIVE, "b", 1), 0);
    open_gate();
    assert_true(wait_seen(false, 5));
    assert_int_equal(seen.order[0], 9);
    for (int k = 1; k < 5; k++)
        assert_string_equal(seen.reason[k], "length");
    rt_sched_get_stats(s, &st);
    assert_int_equal(st.preemptions, 1);
    rt_sched_free(s);
}

/* Catch-up: tenant a's seven requests (of n_a, on eight slots) have decoded
 * for 60 steps when a request with a 100-token prompt comes. The steps (the
 * gate's tokens) until its first token: with seven decoding, a step's prompt
 * budget is 16 tokens (7 steps); a newcomer of tenant b, owed work, takes 23
 * more a step (3). With every slot taken and a's requests waiting, b comes
 * level with a (no credit for its absence) and is admitted first all the
 * same (served less lately), taking the slot of a's youngest: 3 steps still,
 * where it waited one more behind a's waiting request. */
static int steps_to_first_token(const char *tenant, int n_a)
{
    rt_sched *s = sched_new(8, 8, 0);
    assert_int_equal(submit_for(s, GATE, 4, 200, RT_PRIO_INTERACTIVE, "a", 1), 0);
    assert_true(wait_seen(true, 0));
    for (int k = 1; k < n_a; k++)
        assert_int_equal(submit_for(s, k, 4, 200, RT_PRIO_INTERACTIVE, "a", 1), 0);
    gate_again(60);
    assert_true(wait_seen(true, 0));
    pthread_mutex_lock(&seen.mu);
    seen.watch = 9;
    pthread_mutex_unlock(&seen.mu);
    assert_int_equal(submit_for(s, 9, 100, 2, RT_PRIO_INTERACTIVE, tenant, 1), 0);
    open_gate();
    assert_true(wait_seen(false, 1));
    assert_int_equal(seen.order[0], 9);
    rt_sched_free(s);
    return seen.gate_at_watch - 60;
}

static void test_fair_catch_up(void **state)
{
    assert_int_equal(steps_to_first_token("a", 7), 7); /* one tenant: as before */
    assert_int_equal(steps_to_first_token("b", 7), 3);
    assert_int_equal(steps_to_first_token("b", 10), 3);
}

/* A tenant name past RT_SCHED_TENANT_MAX, or a weight out of range, is
 * refused. */
static void test_fair_bad_tenant_refused(void **state)
{
    rt_sched *s = sched_new(1, 4, 0);
    char longname[RT_SCHED_TENANT_MAX + 2];
    memset(longname, 'x', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    assert_int_equal(submit_for(s, 1, 4, 2, RT_PRIO_INTERACTIVE, longname, 1), -EINVAL);
    assert_int_equal(submit_for(s, 1, 4, 2, RT_PRIO_INTERACTIVE, "a", -1), -EINVAL);
    assert_int_equal(submit_for(s, 1, 4, 2, RT_PRIO_INTERACTIVE, "a", 1e-9), -EINVAL);
    assert_int_equal(submit_for(s, 1, 4, 2, RT_PRIO_INTERACTIVE, "a", 2e6), -EINVAL);
    rt_sched_free(s);
}

/* How request `tag` ended: its finish reason, or "error" (*error set). */
static const char *ended(int tag, int *error)
{
    for (int i = 0; i < seen.finals && i < 16; i++)
        if (seen.order[i] == tag) {
            *error = seen.error[i];
            return seen.reason[i];
        }
    return "none";
}

/* The queue's fair bound: tenant a fills the queue (4) while the gate
 * request holds the only slot; a's fifth is refused, but b's requests
 * take the places of a's youngest while a, with them, still holds more
 * per weight: two here (a 4:0, then 3:1; at 2:2 b's third is refused).
 * Those two of a's end -EAGAIN, the others run. With weights, a tenant of
 * a quarter of a's weight takes none from a's 4 (4 / 1 > 1 / 0.25 is false). */
static void test_fair_queue_push_out(void **state)
{
    rt_sched *s = sched_new(1, 4, 0);
    assert_int_equal(submit_for(s, GATE, 4, 2, RT_PRIO_INTERACTIVE, "x", 1), 0);
    assert_true(wait_seen(true, 0));
    for (int k = 1; k <= 4; k++)
        assert_int_equal(submit_for(s, k, 4, 2, RT_PRIO_INTERACTIVE, "a", 1), 0);
    assert_int_equal(submit_for(s, 5, 4, 2, RT_PRIO_INTERACTIVE, "a", 1), -EAGAIN);
    assert_false(rt_sched_may_push_out(s, RT_PRIO_INTERACTIVE, "a", 1));
    assert_false(rt_sched_may_push_out(s, RT_PRIO_INTERACTIVE, "c", 0.25));
    assert_int_equal(submit_for(s, 6, 4, 2, RT_PRIO_INTERACTIVE, "c", 0.25), -EAGAIN);
    assert_true(rt_sched_may_push_out(s, RT_PRIO_INTERACTIVE, "b", 1));
    assert_false(rt_sched_may_push_out(s, RT_PRIO_BATCH, "b", 1)); /* the batch queue is its own */
    assert_int_equal(submit_for(s, 9, 4, 2, RT_PRIO_INTERACTIVE, "b", 1), 0);
    assert_int_equal(submit_for(s, 10, 4, 2, RT_PRIO_INTERACTIVE, "b", 1), 0);
    assert_int_equal(submit_for(s, 11, 4, 2, RT_PRIO_INTERACTIVE, "b", 1), -EAGAIN);
    rt_sched_stats st;
    rt_sched_get_stats(s, &st);
    assert_int_equal(st.queued, 4);
    assert_int_equal(st.pushed_out, 2);
    open_gate();
    assert_true(wait_seen(false, 7));
    int err = 0;
    for (int k = 3; k <= 4; k++) {
        assert_string_equal(ended(k, &err), "error");
        assert_int_equal(err, -EAGAIN);
    }
    const int ran[] = {GATE, 1, 2, 9, 10};
    for (size_t i = 0; i < sizeof(ran) / sizeof(ran[0]); i++)
        assert_string_equal(ended(ran[i], &err), "length");
    rt_sched_get_stats(s, &st);
    assert_int_equal(st.queued, 0);
    rt_sched_free(s);
}

/* The KV pool runs dry (8 blocks; four streams of 64 positions want 16):
 * tenant a holds three of the four sequences, b one, b's the youngest. The
 * sequences that give their blocks back are a's (the tenant holding the
 * most blocks per weight), so b's stream ends among the first two; by age
 * alone b's went first. The tenants' figures count what each was charged,
 * and no slot was taken for fair share. */
static void test_fair_kv_dry_preempts_heaviest(void **state)
{
    rt_sched *s = sched_new(4, 8, 8);
    assert_int_equal(submit_for(s, GATE, 4, 60, RT_PRIO_INTERACTIVE, "a", 1), 0);
    assert_true(wait_seen(true, 0));
    for (int k = 1; k <= 2; k++)
        assert_int_equal(submit_for(s, k, 4, 60, RT_PRIO_INTERACTIVE, "a", 1), 0);
    assert_int_equal(submit_for(s, 9, 4, 60, RT_PRIO_INTERACTIVE, "b", 1), 0);
    open_gate();
    assert_true(wait_seen(false, 4));
    assert_true(seen.order[0] == 9 || seen.order[1] == 9);
    for (int k = 0; k < 4; k++)
        assert_string_equal(seen.reason[k], "length");
    rt_sched_stats st;
    rt_sched_get_stats(s, &st);
    assert_true(st.preemptions >= 2);
    rt_sched_tenant_stats ts[RT_SCHED_TENANT_FIGS];
    int n = 0;
    for (int i = 0; i < 500; i++) { /* published after the step that ended the last one */
        n = rt_sched_tenants(s, ts, RT_SCHED_TENANT_FIGS);
        if (n == 2 && ts[0].running + ts[1].running == 0)
            break;
        usleep(10000);
    }
    assert_int_equal(n, 2);
    for (int i = 0; i < n; i++) {
        bool a = !strcmp(ts[i].name, "a");
        assert_true(a || !strcmp(ts[i].name, "b"));
        assert_true(ts[i].weight == 1 && ts[i].queued == 0 && ts[i].preempted == 0 && ts[i].pushed_out == 0);
        /* each request's prompt and answer but its last token, its recomputes not charged again */
        assert_int_equal(ts[i].tokens, (a ? 3 : 1) * (4 + 60 - 1));
    }
    rt_sched_free(s);
}

/* Past the RT_SCHED_TENANT_FIGS tenants a worker keeps figures for, none
 * of them idle: the others' figures are counted under
 * RT_SCHED_TENANT_OTHER, reported last with how many tenants it holds, and
 * nothing is left out (every queued request is in some entry). */
static void test_fair_tenants_past_the_figures(void **state)
{
    enum { N = RT_SCHED_TENANT_FIGS + 6 };
    rt_sched *s = sched_new(1, N + 4, 0);
    assert_int_equal(submit_for(s, GATE, 4, 10, RT_PRIO_INTERACTIVE, "g", 1), 0);
    assert_true(wait_seen(true, 0));
    for (int k = 0; k < N; k++) {
        char name[16];
        snprintf(name, sizeof(name), "t%d", k);
        assert_int_equal(submit_for(s, 100 + k, 4, 2, RT_PRIO_INTERACTIVE, name, 1), 0);
    }
    gate_again(4); /* steps published with every one queued behind the gate's only slot */
    assert_true(wait_seen(true, 0));
    rt_sched_tenant_stats ts[RT_SCHED_TENANT_REPORTS];
    int n = rt_sched_tenants(s, ts, RT_SCHED_TENANT_REPORTS);
    assert_int_equal(n, RT_SCHED_TENANT_REPORTS);
    assert_string_equal(ts[n - 1].name, RT_SCHED_TENANT_OTHER);
    int queued = 0;
    for (int i = 0; i < n; i++) {
        queued += ts[i].queued;
        assert_int_equal(ts[i].folded, i == n - 1 ? N + 1 - RT_SCHED_TENANT_FIGS : 0);
    }
    assert_int_equal(queued, N);
    open_gate();
    assert_true(wait_seen(false, N + 1));
    rt_sched_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_queue_per_priority),
        cmocka_unit_test(test_interactive_preempts_batch),
        cmocka_unit_test(test_no_preemption_for_nothing),
        cmocka_unit_test(test_aged_batch_not_preempted),
        cmocka_unit_test(test_running_batch_still_gives_way),
        cmocka_unit_test(test_free_slots_counted_once),
        cmocka_unit_test(test_batch_aging),
        cmocka_unit_test(test_admission_counts_promised_blocks),
        cmocka_unit_test(test_interactive_prefill_first),
        cmocka_unit_test(test_short_cached_prompt_first),
        cmocka_unit_test(test_aged_long_prompt_first),
        cmocka_unit_test(test_bad_sampling_refused),
        cmocka_unit_test(test_resume_checked),
        cmocka_unit_test(test_resume_text_each),
        cmocka_unit_test(test_preempted_batch_stays_behind),
        cmocka_unit_test(test_deadline_after_preemption),
        cmocka_unit_test(test_deadline_during_prefill),
        cmocka_unit_test(test_hold_pauses),
        cmocka_unit_test(test_fair_equal_weights),
        cmocka_unit_test(test_fair_weights_3_to_1),
        cmocka_unit_test(test_fair_lone_tenant_takes_all),
        cmocka_unit_test(test_fair_priority_first),
        cmocka_unit_test(test_fair_newcomer_gets_a_slot),
        cmocka_unit_test(test_fair_catch_up),
        cmocka_unit_test(test_fair_bad_tenant_refused),
        cmocka_unit_test(test_fair_queue_push_out),
        cmocka_unit_test(test_fair_kv_dry_preempts_heaviest),
        cmocka_unit_test(test_fair_tenants_past_the_figures),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
