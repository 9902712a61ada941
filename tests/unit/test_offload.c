/* gw_offload: jobs run off the loop's thread, come back on it in order
 * (urgent ones first), and every job submitted comes back exactly once,
 * also when the offload is freed with jobs still queued. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "gateway/base/offload.h"

#include <event2/event.h>
#include <event2/thread.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdbool.h>
#include <time.h>

#define N_JOBS 200

typedef struct job {
    gw_offload_job base; /* first */
    int n;
    long result;
    pthread_t ran_on;
    bool slow;
    sem_t *started, *release; /* a gate: says it runs, then waits */
} job;

typedef struct fixture {
    struct event_base *base;
    pthread_t loop_thread;
    int order[N_JOBS];
    int n_done, n_ran;
    bool off_loop, on_loop;
} fixture;

static void work(gw_offload_job *j_)
{
    job *j = (job *)j_;
    j->ran_on = pthread_self();
    if (j->started) {
        sem_post(j->started);
        sem_wait(j->release);
    }
    if (j->slow)
        nanosleep(&(struct timespec){0, 20 * 1000000}, NULL);
    long x = 0;
    for (int i = 0; i <= j->n; i++)
        x += (long)i * i;
    j->result = x;
}

static void done(void *ud, gw_offload_job *j_, bool ran)
{
    fixture *f = ud;
    job *j = (job *)j_;
    if (f->n_done < N_JOBS)
        f->order[f->n_done] = j->n;
    f->n_done++;
    f->on_loop &= pthread_equal(pthread_self(), f->loop_thread) != 0;
    if (ran) {
        f->n_ran++;
        f->off_loop &= pthread_equal(j->ran_on, f->loop_thread) == 0;
        long want = (long)j->n * (j->n + 1) * (2 * j->n + 1) / 6;
        assert_int_equal(j->result, want);
    }
    if (f->n_done == N_JOBS)
        event_base_loopbreak(f->base);
}

static void on_timeout(evutil_socket_t fd, short what, void *arg)
{
    event_base_loopbreak(arg);
}

/* Turns the loop until every job came back (done breaks it), 30 s at most. */
static void run_loop(fixture *f)
{
    struct event *t = evtimer_new(f->base, on_timeout, f->base);
    struct timeval limit = {30, 0};
    evtimer_add(t, &limit);
    event_base_dispatch(f->base);
    event_free(t);
}

static void test_jobs_come_back_in_order(void **state)
{
    fixture f = {.base = event_base_new(), .loop_thread = pthread_self(), .off_loop = true, .on_loop = true};
    assert_non_null(f.base);
    gw_offload *o = gw_offload_new(f.base, work, done, &f);
    assert_non_null(o);
    static job jobs[N_JOBS];
    for (int i = 0; i < N_JOBS; i++) {
        jobs[i] = (job){.n = i};
        gw_offload_submit(o, &jobs[i].base, false);
    }
    run_loop(&f);
    assert_int_equal(f.n_done, N_JOBS);
    assert_int_equal(f.n_ran, N_JOBS);
    assert_true(f.off_loop);
    assert_true(f.on_loop);
    for (int i = 0; i < N_JOBS; i++)
        assert_int_equal(f.order[i], i);
    gw_offload_free(o);
    assert_int_equal(f.n_done, N_JOBS);
    event_base_free(f.base);
}

/* Freed at once with slow jobs queued: each comes back once, in order, the
 * ones never run with ran false. */
static void test_free_hands_back_every_job(void **state)
{
    fixture f = {.base = event_base_new(), .loop_thread = pthread_self(), .off_loop = true, .on_loop = true};
    gw_offload *o = gw_offload_new(f.base, work, done, &f);
    assert_non_null(o);
    static job jobs[N_JOBS];
    for (int i = 0; i < N_JOBS; i++) {
        jobs[i] = (job){.n = i, .slow = true};
        gw_offload_submit(o, &jobs[i].base, false);
    }
    gw_offload_free(o); /* the loop never ran: nothing came back before */
    assert_int_equal(f.n_done, N_JOBS);
    assert_true(f.n_ran < N_JOBS);
    assert_true(f.on_loop);
    for (int i = 0; i < N_JOBS; i++)
        assert_int_equal(f.order[i], i);
    event_base_free(f.base);
}

/* With the thread held by a gate job, the odd jobs are submitted urgent:
 * they run (and come back) before every even one, each lane in order. */
static void test_urgent_jobs_go_first(void **state)
{
    fixture f = {.base = event_base_new(), .loop_thread = pthread_self(), .off_loop = true, .on_loop = true};
    gw_offload *o = gw_offload_new(f.base, work, done, &f);
    assert_non_null(o);
    sem_t started, release;
    sem_init(&started, 0, 0);
    sem_init(&release, 0, 0);
    static job jobs[N_JOBS];
    jobs[0] = (job){.n = 0, .started = &started, .release = &release};
    gw_offload_submit(o, &jobs[0].base, false);
    sem_wait(&started);
    for (int i = 1; i < N_JOBS; i++) {
        jobs[i] = (job){.n = i};
        gw_offload_submit(o, &jobs[i].base, i % 2 == 1);
    }
    sem_post(&release);
    run_loop(&f);
    assert_int_equal(f.n_done, N_JOBS);
    int want = 0, k = 0;
    assert_int_equal(f.order[k++], want);
    for (want = 1; want < N_JOBS; want += 2)
        assert_int_equal(f.order[k++], want);
    for (want = 2; want < N_JOBS; want += 2)
        assert_int_equal(f.order[k++], want);
    gw_offload_free(o);
    sem_destroy(&started);
    sem_destroy(&release);
    event_base_free(f.base);
}

int main(void)
{
    evthread_use_pthreads();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jobs_come_back_in_order),
        cmocka_unit_test(test_free_hands_back_every_job),
        cmocka_unit_test(test_urgent_jobs_go_first),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
