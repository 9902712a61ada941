/* The process-wide key of runtime/hash.h. */
#include "runtime/hash.h"

#include <pthread.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

static uint64_t g_key;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void draw_key(void)
{
    uint64_t k;
    if (getrandom(&k, sizeof(k), 0) != (ssize_t)sizeof(k)) {
        /* No entropy at all is rare enough (getrandom blocks until the pool
         * is ready); the clock and pid still keep the key from being known
         * ahead of the run. */
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        k = ((uint64_t)ts.tv_nsec << 32) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 16);
    }
    g_key = k;
}

uint64_t rt_hash_key(void)
{
    pthread_once(&g_once, draw_key);
    return g_key;
}
