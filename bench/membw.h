/* Memory read bandwidth of this machine, measured the way decode reads
 * weights: n threads each stream through their own slice of a buffer far
 * larger than the caches. Header-only so each benchmark reports its bound
 * in the same run as its own figures. */
#ifndef BENCH_MEMBW_H
#define BENCH_MEMBW_H

#include "bench/bench_util.h"

#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct membw_slice {
    const uint8_t *p;
    size_t n;
    pthread_barrier_t *start;
    double seconds;
    uint64_t sink;
} membw_slice;

__attribute__((target("avx2"))) static uint64_t membw_sum_avx2(const uint8_t *p, size_t n)
{
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(p + i + 32)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(p + i + 64)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t out[4];
    _mm256_storeu_si256((__m256i *)out, a0);
    return out[0] + out[1] + out[2] + out[3];
}

static void *membw_thread(void *arg)
{
    membw_slice *s = arg;
    pthread_barrier_wait(s->start);
    double t0 = bench_now();
    s->sink = membw_sum_avx2(s->p, s->n);
    s->seconds = bench_now() - t0;
    return NULL;
}

/* One pass of n_threads (1 to 64) over buf, 64-byte aligned and already
 * faulted in: each thread sums its own slice. Bytes per second, timed by
 * the slowest thread. */
static inline double membw_pass(const uint8_t *buf, size_t bytes, int n_threads)
{
    size_t slice = bytes / (size_t)n_threads / 128 * 128;
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)n_threads);
    membw_slice s[64];
    pthread_t th[64];
    for (int t = 0; t < n_threads; t++) {
        s[t] = (membw_slice){.p = buf + (size_t)t * slice, .n = slice, .start = &start};
        if (t > 0)
            pthread_create(&th[t], NULL, membw_thread, &s[t]);
    }
    membw_thread(&s[0]);
    double worst = s[0].seconds;
    for (int t = 1; t < n_threads; t++) {
        pthread_join(th[t], NULL);
        if (s[t].seconds > worst)
            worst = s[t].seconds;
    }
    pthread_barrier_destroy(&start);
    return (double)(slice * (size_t)n_threads) / worst;
}

/* Best of `reps` passes over `bytes`, in bytes per second; 0 on failure. */
static inline double membw_measure(int n_threads, size_t bytes, int reps)
{
    if (!__builtin_cpu_supports("avx2") || n_threads < 1 || n_threads > 64)
        return 0;
    uint8_t *buf = aligned_alloc(64, bytes);
    if (!buf)
        return 0;
    memset(buf, 1, bytes); /* fault every page in before timing */
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double bw = membw_pass(buf, bytes, n_threads);
        if (bw > best)
            best = bw;
    }
    free(buf);
    return best;
}

#endif
