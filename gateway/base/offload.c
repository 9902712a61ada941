/* Work taken off an event loop (see offload.h): a job queue for one
 * thread, a queue of finished jobs for the loop, and one loop event the
 * thread makes active. */
#include "gateway/base/offload.h"

#include <event2/event.h>
#include <pthread.h>
#include <stdlib.h>

typedef struct job_queue {
    gw_offload_job *head, *tail;
} job_queue;

struct gw_offload {
    struct event *ev;
    gw_offload_work_fn work;
    gw_offload_done_fn done;
    void *ud;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stopping;
    job_queue pending[2], finished; /* under mu; pending[0] is urgent */
};

static void push(job_queue *q, gw_offload_job *j)
{
    j->next_ = NULL;
    if (q->tail)
        q->tail->next_ = j;
    else
        q->head = j;
    q->tail = j;
}

static gw_offload_job *take_all(job_queue *q)
{
    gw_offload_job *j = q->head;
    q->head = q->tail = NULL;
    return j;
}

static void deliver(gw_offload *o, gw_offload_job *j, bool ran)
{
    while (j) {
        gw_offload_job *next = j->next_;
        o->done(o->ud, j, ran);
        j = next;
    }
}

static void *run(void *arg)
{
    gw_offload *o = arg;
    pthread_mutex_lock(&o->mu);
    for (;;) {
        while (!o->stopping && !o->pending[0].head && !o->pending[1].head)
            pthread_cond_wait(&o->cv, &o->mu);
        if (o->stopping)
            break;
        job_queue *q = &o->pending[o->pending[0].head ? 0 : 1];
        gw_offload_job *j = q->head;
        q->head = j->next_;
        if (!q->head)
            q->tail = NULL;
        pthread_mutex_unlock(&o->mu);
        o->work(j);
        pthread_mutex_lock(&o->mu);
        bool was_empty = !o->finished.head;
        push(&o->finished, j);
        /* One activation per batch: the loop takes every finished job.
         * Outside mu: event_active takes the loop's lock. */
        if (was_empty) {
            pthread_mutex_unlock(&o->mu);
            event_active(o->ev, EV_READ, 0);
            pthread_mutex_lock(&o->mu);
        }
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

static void on_finished(evutil_socket_t fd, short what, void *arg)
{
    gw_offload *o = arg;
    pthread_mutex_lock(&o->mu);
    gw_offload_job *j = take_all(&o->finished);
    pthread_mutex_unlock(&o->mu);
    deliver(o, j, true);
}

gw_offload *gw_offload_new(struct event_base *base, gw_offload_work_fn work, gw_offload_done_fn done,
                           void *ud)
{
    gw_offload *o = calloc(1, sizeof(*o));
    if (!o)
        return NULL;
    o->work = work;
    o->done = done;
    o->ud = ud;
    if (!(o->ev = event_new(base, -1, 0, on_finished, o)))
        goto fail_ev;
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv, NULL);
    if (pthread_create(&o->thread, NULL, run, o))
        goto fail_thread;
    return o;
fail_thread:
    pthread_cond_destroy(&o->cv);
    pthread_mutex_destroy(&o->mu);
    event_free(o->ev);
fail_ev:
    free(o);
    return NULL;
}

void gw_offload_submit(gw_offload *o, gw_offload_job *job, bool urgent)
{
    pthread_mutex_lock(&o->mu);
    push(&o->pending[urgent ? 0 : 1], job);
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

void gw_offload_free(gw_offload *o)
{
    if (!o)
        return;
    pthread_mutex_lock(&o->mu);
    o->stopping = true;
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
    pthread_join(o->thread, NULL);
    event_free(o->ev);
    deliver(o, take_all(&o->finished), true);
    deliver(o, take_all(&o->pending[0]), false);
    deliver(o, take_all(&o->pending[1]), false);
    pthread_cond_destroy(&o->cv);
    pthread_mutex_destroy(&o->mu);
    free(o);
}
