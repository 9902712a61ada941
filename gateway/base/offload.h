/* Work taken off an event loop: one thread runs, in order, the jobs that
 * would stall the loop (a worker's request parsing and tokenization: ~150 ms
 * for a 256 KiB prompt, during which no stream got a token), and hands each
 * back to the loop, where `done` runs. The loop never waits on the thread.
 *
 * Jobs are the caller's structs with a gw_offload_job first; the caller
 * owns them throughout. libevent must have been told to use pthreads
 * (evthread_use_pthreads): the thread makes a loop event active. */
#ifndef GW_OFFLOAD_H
#define GW_OFFLOAD_H

#include <stdbool.h>

struct event_base;

typedef struct gw_offload gw_offload;

typedef struct gw_offload_job {
    struct gw_offload_job *next_; /* the offload's own */
} gw_offload_job;

/* Runs on the offload thread. */
typedef void (*gw_offload_work_fn)(gw_offload_job *job);
/* Runs on the loop's thread (or, from gw_offload_free, on its caller's)
 * once per submitted job; `ran` says whether work ran on it. */
typedef void (*gw_offload_done_fn)(void *ud, gw_offload_job *job, bool ran);

/* NULL when out of memory or the thread cannot start. */
gw_offload *gw_offload_new(struct event_base *base, gw_offload_work_fn work, gw_offload_done_fn done,
                           void *ud);
/* Queues job; never fails (the queue is intrusive). Any thread. Jobs run
 * in order, except that an urgent one runs before every job not urgent
 * (an interactive request's prompt before a batch job's). */
void gw_offload_submit(gw_offload *o, gw_offload_job *job, bool urgent);
/* Stops the thread after the job it is running, then passes every job not
 * yet handed back to done, on the calling thread: those the thread
 * finished with ran true, then the rest, in the order they would have
 * run, with ran false. NULL is ignored. */
void gw_offload_free(gw_offload *o);

#endif
