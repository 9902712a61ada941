/* kernels: the execution context. Holds the backend table, a persistent
 * thread pool and the scratch the batched operations need, and implements the
 * batched operations (matmul, RMSNorm, SiLU-gate, RoPE, paged attention) on
 * top of the per-row functions of the table.
 *
 * A decode step issues about a hundred small parallel jobs per token, so the
 * pool is built for dispatch latency: workers stay alive, spin briefly on a
 * generation counter after each job (the next one usually follows within
 * microseconds) and only then sleep on a condition variable; work items are
 * handed out with one atomic counter; the calling thread works too.
 *
 * A context serves one caller at a time. Scratch grows only when a request
 * needs more than any before, so the steady state never allocates. */
#include "kernels/kn.h"
#include "kernels/kn_glu.h"
#include "kernels/quant_blocks.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KN_CACHE_LINE 64
#define KN_MAX_THREADS 256
/* Pause iterations a worker spins before it sleeps (roughly 0.1 ms): long
 * enough to cover the serial gaps between the jobs of one decode step. */
#define KN_SPIN_WORKER (1 << 12)
#define KN_SPIN_YIELD_EVERY 256
/* Pause iterations the caller spins on stragglers before yielding the CPU. */
#define KN_SPIN_CALLER (1 << 10)
/* Elementwise work below this many elements runs on the calling thread:
 * waking the pool would cost more than it saves. */
#define KN_PAR_MIN_ELEMS (1 << 15)
/* Attention scores a thread keeps at once, unless one KV head's group needs
 * more (see kn_attention). */
#define KN_ATTN_SCRATCH_FLOATS (1 << 18)

typedef void (*kn_job_fn)(void *arg, int i, int tid);

/* Atomics because a worker that wakes late may read a slot while the caller
 * rewrites it; it never uses what it read then (see run_items). */
typedef struct kn_job {
    _Atomic(kn_job_fn) fn;
    _Atomic(void *) arg;
    atomic_int n;
} kn_job;

typedef struct kn_worker {
    kn_ctx *ctx;
    int tid;
    pthread_t thread;
} kn_worker;

struct kn_ctx {
    const kn_ops *ops;
    int n_threads;
    int n_started; /* worker threads running (n_threads - 1 once built) */
    kn_worker *workers;

    /* Two job slots, used by alternate generations (see the pool below). */
    kn_job jobs[2];
    uint32_t gen; /* the caller's last generation */

    /* Each hot atomic on its own line so spinning readers do not slow the
     * writers of the others. */
    alignas(KN_CACHE_LINE) _Atomic uint64_t ctl;
    alignas(KN_CACHE_LINE) atomic_uint done;
    alignas(KN_CACHE_LINE) atomic_int n_sleeping;
    atomic_bool stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;

    /* scratch */
    void *q8; /* activations in a weight type's vec_dot_type */
    size_t q8_cap;
    float *rope_cs; /* cos/sin per (row, pair), valid for the key below */
    size_t rope_cs_cap;
    int32_t *rope_pos;
    size_t rope_pos_cap;
    int rope_rows, rope_dim;
    const double *rope_inv;
    bool rope_valid;
    float **score; /* per-thread attention scores */
    size_t *score_cap;
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Grows a 64-byte aligned buffer to at least `need` bytes; contents are not
 * kept. Returns 0 or -ENOMEM (the old buffer stays valid then). */
static int scratch_reserve(void **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    /* round up so a slowly growing demand does not reallocate every call */
    size_t sz = need + need / 4;
    sz = (sz + KN_CACHE_LINE - 1) & ~(size_t)(KN_CACHE_LINE - 1);
    if (sz < need)
        return -ENOMEM;
    void *p = aligned_alloc(KN_CACHE_LINE, sz);
    if (p == NULL)
        return -ENOMEM;
    free(*buf);
    *buf = p;
    *cap = sz;
    return 0;
}

/* ---- thread pool -------------------------------------------------------------
 * `ctl` packs the job generation (high 32 bits) and the next item index (low
 * 32 bits). A thread claims an item with a compare-and-swap that only
 * succeeds while the generation is the one it read, so a worker that wakes
 * late, after its job is finished or replaced, claims nothing. The caller
 * waits for its items, not for the workers: a worker that the OS does not
 * schedule in time costs nothing. The job's description alternates between
 * two slots, so the one a late worker may still read is not the one being
 * written; whatever such a worker reads, its claim fails. */

static void run_items(kn_ctx *ctx, uint64_t v, int tid)
{
    const uint32_t g = (uint32_t)(v >> 32);
    const kn_job *job = &ctx->jobs[g & 1];
    /* Acquire: if these are already the next-but-one job's values, the
     * caller published the next generation before writing them, so the
     * compare-and-swap below is then bound to see it and fail. */
    const kn_job_fn fn = atomic_load_explicit(&job->fn, memory_order_acquire);
    void *arg = atomic_load_explicit(&job->arg, memory_order_acquire);
    const uint32_t n = (uint32_t)atomic_load_explicit(&job->n, memory_order_acquire);
    for (;;) {
        if ((uint32_t)(v >> 32) != g || (uint32_t)v >= n)
            return;
        if (atomic_compare_exchange_weak_explicit(&ctx->ctl, &v, v + 1, memory_order_acq_rel,
                                                  memory_order_acquire)) {
            fn(arg, (int)(uint32_t)v, tid);
            atomic_fetch_add_explicit(&ctx->done, 1, memory_order_release);
            v = atomic_load_explicit(&ctx->ctl, memory_order_acquire);
        }
    }
}

static void *worker_main(void *p)
{
    kn_worker *wk = p;
    kn_ctx *ctx = wk->ctx;
    uint32_t seen = 0;
    for (;;) {
        uint64_t v = atomic_load_explicit(&ctx->ctl, memory_order_acquire);
        for (int spins = 1; (uint32_t)(v >> 32) == seen && spins <= KN_SPIN_WORKER; spins++) {
            /* Give the CPU away now and then: with more runnable threads
             * than cores (a shared machine), a spinning worker could keep
             * the very thread it waits for from running. */
            if (spins % KN_SPIN_YIELD_EVERY == 0)
                sched_yield();
            else
                cpu_relax();
            v = atomic_load_explicit(&ctx->ctl, memory_order_acquire);
        }
        if ((uint32_t)(v >> 32) == seen) {
            /* Announce the sleep before the last look at `ctl`; the caller
             * publishes `ctl` before it looks at n_sleeping, so (all
             * seq_cst) one of the two sees the other and no wakeup is lost. */
            pthread_mutex_lock(&ctx->mu);
            atomic_fetch_add(&ctx->n_sleeping, 1);
            while ((uint32_t)((v = atomic_load(&ctx->ctl)) >> 32) == seen)
                pthread_cond_wait(&ctx->cv, &ctx->mu);
            atomic_fetch_sub(&ctx->n_sleeping, 1);
            pthread_mutex_unlock(&ctx->mu);
        }
        seen = (uint32_t)(v >> 32);
        if (atomic_load_explicit(&ctx->stop, memory_order_acquire))
            break;
        run_items(ctx, v, wk->tid);
    }
    return NULL;
}

/* Publishes generation g with item 0 next, and wakes sleeping workers. */
static void publish(kn_ctx *ctx, uint32_t g)
{
    atomic_store(&ctx->ctl, (uint64_t)g << 32);
    if (atomic_load(&ctx->n_sleeping) > 0) {
        pthread_mutex_lock(&ctx->mu);
        pthread_cond_broadcast(&ctx->cv);
        pthread_mutex_unlock(&ctx->mu);
    }
}

/* Runs fn(arg, i, tid) for i in [0, n); tid < n_threads names the thread so
 * a job can use per-thread scratch. */
static void pool_run(kn_ctx *ctx, int n, kn_job_fn fn, void *arg)
{
    if (n <= 0)
        return;
    if (ctx->n_started == 0 || n == 1) {
        for (int i = 0; i < n; i++)
            fn(arg, i, 0);
        return;
    }
    const uint32_t g = ctx->gen + 1;
    ctx->gen = g;
    kn_job *job = &ctx->jobs[g & 1];
    atomic_store_explicit(&job->fn, fn, memory_order_release);
    atomic_store_explicit(&job->arg, arg, memory_order_release);
    atomic_store_explicit(&job->n, n, memory_order_release);
    atomic_store_explicit(&ctx->done, 0, memory_order_relaxed);
    publish(ctx, g);
    run_items(ctx, (uint64_t)g << 32, 0);
    /* Only items claimed by workers that are still running them are left. */
    for (int spins = 0; atomic_load_explicit(&ctx->done, memory_order_acquire) != (unsigned)n; spins++) {
        if (spins < KN_SPIN_CALLER)
            cpu_relax();
        else
            sched_yield();
    }
}

static void pool_stop(kn_ctx *ctx)
{
    atomic_store_explicit(&ctx->stop, true, memory_order_release);
    publish(ctx, ++ctx->gen);
    for (int i = 0; i < ctx->n_started; i++)
        pthread_join(ctx->workers[i].thread, NULL);
    ctx->n_started = 0;
}

kn_ctx *kn_ctx_new(int n_threads, kn_backend backend)
{
    const kn_ops *ops;
    switch (backend) {
    case KN_BACKEND_AUTO:
        ops = kn_ops_best();
        break;
    case KN_BACKEND_REF:
        ops = kn_ops_ref();
        break;
    case KN_BACKEND_AVX2:
        ops = kn_ops_avx2();
        break;
    case KN_BACKEND_AVXVNNI:
        ops = kn_ops_avxvnni();
        break;
    case KN_BACKEND_AVX512VNNI:
        ops = kn_ops_avx512vnni();
        break;
    case KN_BACKEND_AMX:
        ops = kn_ops_amx();
        break;
    default:
        ops = NULL;
    }
    if (ops == NULL)
        return NULL;
    if (n_threads <= 0)
        n_threads = kn_usable_cpus();
    if (n_threads > KN_MAX_THREADS)
        n_threads = KN_MAX_THREADS;

    size_t sz = (sizeof(kn_ctx) + KN_CACHE_LINE - 1) & ~(size_t)(KN_CACHE_LINE - 1);
    kn_ctx *ctx = aligned_alloc(KN_CACHE_LINE, sz);
    if (ctx == NULL)
        return NULL;
    memset(ctx, 0, sizeof(*ctx));
    ctx->ops = ops;
    ctx->n_threads = n_threads;
    atomic_init(&ctx->ctl, 0);
    atomic_init(&ctx->done, 0);
    atomic_init(&ctx->n_sleeping, 0);
    for (int i = 0; i < 2; i++) {
        atomic_init(&ctx->jobs[i].fn, NULL);
        atomic_init(&ctx->jobs[i].arg, NULL);
        atomic_init(&ctx->jobs[i].n, 0);
    }
    atomic_init(&ctx->stop, false);

    ctx->score = calloc((size_t)n_threads, sizeof(*ctx->score));
    if (ctx->score == NULL)
        goto fail_ctx;
    ctx->score_cap = calloc((size_t)n_threads, sizeof(*ctx->score_cap));
    if (ctx->score_cap == NULL)
        goto fail_score;
    if (pthread_mutex_init(&ctx->mu, NULL) != 0)
        goto fail_score_cap;
    if (pthread_cond_init(&ctx->cv, NULL) != 0)
        goto fail_mu;
    if (n_threads > 1) {
        ctx->workers = calloc((size_t)n_threads - 1, sizeof(*ctx->workers));
        if (ctx->workers == NULL)
            goto fail_cv;
        for (int i = 0; i < n_threads - 1; i++) {
            kn_worker *wk = &ctx->workers[i];
            wk->ctx = ctx;
            wk->tid = i + 1;
            if (pthread_create(&wk->thread, NULL, worker_main, wk) != 0)
                goto fail_threads;
            ctx->n_started++;
        }
    }
    return ctx;

fail_threads:
    pool_stop(ctx);
    free(ctx->workers);
fail_cv:
    pthread_cond_destroy(&ctx->cv);
fail_mu:
    pthread_mutex_destroy(&ctx->mu);
fail_score_cap:
    free(ctx->score_cap);
fail_score:
    free(ctx->score);
fail_ctx:
    free(ctx);
    return NULL;
}

void kn_ctx_free(kn_ctx *ctx)
{
    if (ctx == NULL)
        return;
    pool_stop(ctx);
    free(ctx->workers);
    pthread_cond_destroy(&ctx->cv);
    pthread_mutex_destroy(&ctx->mu);
    for (int i = 0; i < ctx->n_threads; i++)
        free(ctx->score[i]);
    free(ctx->score);
    free(ctx->score_cap);
    free(ctx->q8);
    free(ctx->rope_cs);
    free(ctx->rope_pos);
    free(ctx);
}

int kn_ctx_threads(const kn_ctx *ctx)
{
    return ctx->n_threads;
}

const kn_ops *kn_ctx_ops(const kn_ctx *ctx)
{
    return ctx->ops;
}

typedef struct pfor_job {
    void (*fn)(void *arg, int i);
    void *arg;
} pfor_job;

static void pfor_item(void *arg, int i, int tid)
{
    (void)tid;
    pfor_job *j = arg;
    j->fn(j->arg, i);
}

/* fn must not call back into the same context: the pool runs one job at a
 * time. */
void kn_parallel_for(kn_ctx *ctx, int n, void (*fn)(void *arg, int i), void *arg)
{
    pfor_job j = {fn, arg};
    pool_run(ctx, n, pfor_item, &j);
}

/* ---- matmul --------------------------------------------------------------- */

/* Activation rows handed to one `dot` call: the AVX2 kernels reuse a loaded
 * weight block across this many rows. */
#define KN_MM_NR 4

/* A backend's gemm, when it has one, serves quantized weights at every batch
 * width, decode's single row included: the x86 ones pick their layout by
 * width and give each row the same bits whatever batch it is in. Activation
 * rows per gemm work item: their Q8_0 rows stay in L2 while the item's
 * weight rows pass over them. */
#define KN_GEMM_ROW_BLOCK 64

typedef struct mm_job {
    kn_dot_fn dot;
    const char *w;
    size_t w_row_bytes;
    int n_out, n_in, n_rows, chunk;
    const char *xa; /* the activations in the weight type's vec_dot_type */
    size_t xa_row_bytes;
    float *y;
} mm_job;

static void mm_item(void *arg, int item, int tid)
{
    (void)tid;
    const mm_job *j = arg;
    const int o0 = item * j->chunk;
    const int o1 = o0 + j->chunk < j->n_out ? o0 + j->chunk : j->n_out;
    float tmp[KN_MM_NR];
    /* Activation groups outside, weight rows inside: the chunk's weight rows
     * stay in L2 across groups, the group's activations in L1. */
    for (int r0 = 0; r0 < j->n_rows; r0 += KN_MM_NR) {
        const int nr = j->n_rows - r0 < KN_MM_NR ? j->n_rows - r0 : KN_MM_NR;
        float *y = j->y + (size_t)r0 * j->n_out;
        for (int o = o0; o < o1; o++) {
            j->dot(j->w + (size_t)o * j->w_row_bytes, j->xa + (size_t)r0 * j->xa_row_bytes, j->xa_row_bytes, nr,
                   j->n_in, tmp);
            for (int k = 0; k < nr; k++)
                y[(size_t)k * j->n_out + o] = tmp[k];
        }
    }
}

/* The gemm job of kn_matmul_n: each output's items are (activation row
 * block, weight row chunk), weight chunks varying fastest so that threads
 * share the row block in cache; the outputs' items follow one another. */
typedef struct gemm_part {
    const char *w;
    float *y;
    int n_out, chunk, n_wchunks, first; /* first: its first item */
} gemm_part;

typedef struct gemm_job {
    kn_gemm_fn gemm;
    kn_gemm_p16_fn gemm_p16; /* instead, over packed rows: w_row_bytes is then a group's bytes */
    gemm_part part[KN_MM_MAX_OUTS];
    int n_parts, n_in, n_rows;
    size_t w_row_bytes, xq_row_bytes;
    const char *xq;
} gemm_job;

static void gemm_item(void *arg, int item, int tid)
{
    (void)tid;
    const gemm_job *j = arg;
    int k = j->n_parts - 1;
    while (item < j->part[k].first)
        k--;
    const gemm_part *p = &j->part[k];
    item -= p->first;
    const int o0 = (item % p->n_wchunks) * p->chunk;
    const int r0 = (item / p->n_wchunks) * KN_GEMM_ROW_BLOCK;
    const int n_w = p->n_out - o0 < p->chunk ? p->n_out - o0 : p->chunk;
    const int nr = j->n_rows - r0 < KN_GEMM_ROW_BLOCK ? j->n_rows - r0 : KN_GEMM_ROW_BLOCK;
    const char *xq = j->xq + (size_t)r0 * j->xq_row_bytes;
    float *y = p->y + (size_t)r0 * p->n_out + o0;
    if (j->gemm_p16)
        j->gemm_p16(p->w + (size_t)(o0 / 16) * j->w_row_bytes, n_w, xq, j->xq_row_bytes, nr, j->n_in, y,
                    (size_t)p->n_out);
    else
        j->gemm(p->w + (size_t)o0 * j->w_row_bytes, j->w_row_bytes, n_w, xq, j->xq_row_bytes, nr, j->n_in, y,
                (size_t)p->n_out);
}

typedef struct quant_job {
    kn_quantize_fn quantize;
    const float *x;
    char *xq;
    int n_in;
    size_t xq_row_bytes;
} quant_job;

static void quant_item(void *arg, int r, int tid)
{
    (void)tid;
    const quant_job *j = arg;
    j->quantize(j->x + (size_t)r * j->n_in, j->xq + (size_t)r * j->xq_row_bytes, j->n_in);
}

int kn_matmul(kn_ctx *ctx, const void *w, kn_type wtype, int n_out, int n_in, const float *x, int n_rows,
              float *y)
{
    const kn_mm_out out = {w, n_out, y};
    return kn_matmul_n(ctx, wtype, n_in, x, n_rows, &out, 1);
}

/* The table's gemm over rows of a packed type; NULL if it has none. */
static kn_gemm_p16_fn packed_gemm(const kn_ops *ops, kn_type packed)
{
    const kn_type t = kn_unpacked_type(packed);
    if (t >= KN_TYPE_COUNT)
        return NULL;
    if (ops->gemm_packed[t] != NULL)
        return ops->gemm_packed[t];
    return t == KN_TYPE_Q8_0 ? ops->gemm_q8_0_p16 : t == KN_TYPE_Q4_0 ? ops->gemm_q4_0_p16 : NULL;
}

/* Quantized weights: the backend's gemm, all outputs' items in one job. */
static int matmul_gemm(kn_ctx *ctx, kn_type wtype, size_t w_row_bytes, int n_in, const char *xq,
                       size_t xq_row_bytes, int n_rows, const kn_mm_out *outs, int n_outs)
{
    gemm_job j = {.n_in = n_in, .n_rows = n_rows, .w_row_bytes = w_row_bytes, .xq_row_bytes = xq_row_bytes,
                  .xq = xq};
    if (kn_type_packed(wtype)) {
        j.gemm_p16 = packed_gemm(ctx->ops, wtype);
        j.w_row_bytes = kn_pack_bytes(kn_unpacked_type(wtype), 16, n_in);
    } else {
        j.gemm = ctx->ops->gemm[wtype];
    }
    /* Chunks of whole 16-row tiles, about eight per thread and row block
     * over all outputs, so that dynamic hand-out evens out threads that run
     * slower (shared cores); each chunk re-packs its row block's
     * activations, which costs little next to its weight rows. */
    const int row_blocks = (n_rows + KN_GEMM_ROW_BLOCK - 1) / KN_GEMM_ROW_BLOCK;
    int64_t total_out = 0;
    for (int k = 0; k < n_outs; k++)
        total_out += outs[k].n_out;
    const int per = ctx->n_threads * 8 / row_blocks;
    int64_t even = per > 1 ? (total_out + per - 1) / per : total_out;
    even = (even + 15) / 16 * 16;
    even = even < 16 ? 16 : even > 256 ? 256 : even;
    int64_t items = 0;
    for (int k = 0; k < n_outs; k++) {
        const int n_out = outs[k].n_out;
        if (n_out == 0)
            continue;
        int64_t chunk = even;
        /* keep the item count an int whatever the shape */
        while ((n_out + chunk - 1) / chunk * row_blocks > INT32_MAX / KN_MM_MAX_OUTS)
            chunk *= 2;
        const int n_wchunks = (int)((n_out + chunk - 1) / chunk);
        j.part[j.n_parts++] = (gemm_part){.w = outs[k].w, .y = outs[k].y, .n_out = n_out, .chunk = (int)chunk,
                                          .n_wchunks = n_wchunks, .first = (int)items};
        items += (int64_t)n_wchunks * row_blocks;
    }
    pool_run(ctx, (int)items, gemm_item, &j);
    return 0;
}

int kn_matmul_n(kn_ctx *ctx, kn_type wtype, int n_in, const float *x, int n_rows, const kn_mm_out *outs,
                int n_outs)
{
    const bool p16 = kn_type_packed(wtype);
    const kn_type_traits *tt = kn_type_traits_of(kn_unpacked_type(wtype));
    if (tt == NULL || (p16 ? packed_gemm(ctx->ops, wtype) == NULL : ctx->ops->dot[wtype] == NULL))
        return -EINVAL;
    if (n_in <= 0 || n_rows < 0 || n_outs < 1 || n_outs > KN_MM_MAX_OUTS)
        return -EINVAL;
    for (int k = 0; k < n_outs; k++)
        if (outs[k].n_out < 0)
            return -EINVAL;
    const size_t w_row_bytes = kn_row_bytes(kn_unpacked_type(wtype), n_in);
    if (w_row_bytes == 0 || (p16 && kn_pack_bytes(kn_unpacked_type(wtype), 16, n_in) == 0))
        return -EINVAL;
    if (n_rows == 0)
        return 0;

    /* The activations in the format the weight type's dot takes: quantized
     * once per row, every weight row of every output reusing it. */
    const kn_type act = tt->vec_dot_type;
    mm_job j = {.w_row_bytes = w_row_bytes, .n_in = n_in, .n_rows = n_rows, .xa = (const char *)x,
                .xa_row_bytes = (size_t)n_in * sizeof(float)};
    if (act != KN_TYPE_F32) {
        j.xa_row_bytes = kn_row_bytes(act, n_in);
        if (j.xa_row_bytes == 0 || ctx->ops->quantize[act] == NULL)
            return -EINVAL;
        if ((size_t)n_rows > SIZE_MAX / j.xa_row_bytes)
            return -ENOMEM;
        if (scratch_reserve(&ctx->q8, &ctx->q8_cap, (size_t)n_rows * j.xa_row_bytes) != 0)
            return -ENOMEM;
        j.xa = ctx->q8;
        quant_job qj = {ctx->ops->quantize[act], x, ctx->q8, n_in, j.xa_row_bytes};
        if ((int64_t)n_rows * n_in >= KN_PAR_MIN_ELEMS)
            pool_run(ctx, n_rows, quant_item, &qj);
        else
            for (int r = 0; r < n_rows; r++)
                quant_item(&qj, r, 0);
    }
    if (p16 || ctx->ops->gemm[wtype] != NULL)
        return matmul_gemm(ctx, wtype, w_row_bytes, n_in, j.xa, j.xa_row_bytes, n_rows, outs, n_outs);

    /* The dots, an output at a time. Several chunks per thread so dynamic
     * hand-out evens out threads that run slower (shared cores), yet each
     * chunk's weights are small enough to stay in L2 while every activation
     * group passes over them. */
    j.dot = ctx->ops->dot[wtype];
    for (int k = 0; k < n_outs; k++) {
        j.w = outs[k].w;
        j.n_out = outs[k].n_out;
        j.y = outs[k].y;
        if (j.n_out == 0)
            continue;
        const int target = ctx->n_started > 0 ? ctx->n_threads * 8 : 1;
        int chunk = (j.n_out + target - 1) / target;
        const size_t max_chunk_bytes = (size_t)512 * 1024;
        if (n_rows > KN_MM_NR && (size_t)chunk * w_row_bytes > max_chunk_bytes)
            chunk = (int)(max_chunk_bytes / w_row_bytes) > 0 ? (int)(max_chunk_bytes / w_row_bytes) : 1;
        if (chunk < 4)
            chunk = j.n_out < 4 ? j.n_out : 4;
        j.chunk = chunk;
        pool_run(ctx, (j.n_out + chunk - 1) / chunk, mm_item, &j);
    }
    return 0;
}

/* ---- row-wise elementwise ------------------------------------------------- */

typedef struct rows_job {
    const kn_ops *ops;
    float *y;
    const float *x;
    const float *g;
    int n;
    float eps;
} rows_job;

static void rmsnorm_item(void *arg, int r, int tid)
{
    (void)tid;
    const rows_job *j = arg;
    j->ops->rmsnorm(j->y + (size_t)r * j->n, j->x + (size_t)r * j->n, j->g, j->n, j->eps);
}

void kn_rmsnorm(kn_ctx *ctx, float *y, const float *x, const float *g, int n_rows, int n, float eps)
{
    rows_job j = {ctx->ops, y, x, g, n, eps};
    if ((int64_t)n_rows * n >= KN_PAR_MIN_ELEMS) {
        pool_run(ctx, n_rows, rmsnorm_item, &j);
        return;
    }
    for (int r = 0; r < n_rows; r++)
        rmsnorm_item(&j, r, 0);
}

static void silu_item(void *arg, int r, int tid)
{
    (void)tid;
    const rows_job *j = arg;
    j->ops->silu_mul(j->y + (size_t)r * j->n, j->x + (size_t)r * j->n, j->n);
}

void kn_silu_mul(kn_ctx *ctx, float *gate, const float *up, int n_rows, int n)
{
    rows_job j = {ctx->ops, gate, up, NULL, n, 0.0f};
    if ((int64_t)n_rows * n >= KN_PAR_MIN_ELEMS) {
        pool_run(ctx, n_rows, silu_item, &j);
        return;
    }
    for (int r = 0; r < n_rows; r++)
        silu_item(&j, r, 0);
}

/* GELU and gpt-oss's clamped SwiGLU: scalar here for every backend (their
 * cost is one pass over the FFN's hidden rows, small beside its matmuls). */
typedef struct glu_job {
    float *gate;
    const float *up;
    int n;
    float alpha, limit;
} glu_job;

static void gelu_item(void *arg, int r, int tid)
{
    (void)tid;
    const glu_job *j = arg;
    float *g = j->gate + (size_t)r * j->n;
    const float *u = j->up + (size_t)r * j->n;
    for (int i = 0; i < j->n; i++)
        g[i] = kn_gelu_mul_1(g[i], u[i]);
}

static void swiglu_oai_item(void *arg, int r, int tid)
{
    (void)tid;
    const glu_job *j = arg;
    float *g = j->gate + (size_t)r * j->n;
    const float *u = j->up + (size_t)r * j->n;
    for (int i = 0; i < j->n; i++)
        g[i] = kn_swiglu_oai_1(g[i], u[i], j->alpha, j->limit);
}

static void glu_run(kn_ctx *ctx, glu_job *j, int n_rows, void (*item)(void *, int, int))
{
    if ((int64_t)n_rows * j->n >= KN_PAR_MIN_ELEMS / 4) {
        pool_run(ctx, n_rows, item, j);
        return;
    }
    for (int r = 0; r < n_rows; r++)
        item(j, r, 0);
}

void kn_gelu_mul(kn_ctx *ctx, float *gate, const float *up, int n_rows, int n)
{
    glu_job j = {gate, up, n, 0.0f, 0.0f};
    glu_run(ctx, &j, n_rows, gelu_item);
}

void kn_swiglu_oai(kn_ctx *ctx, float *gate, const float *up, int n_rows, int n, float alpha, float limit)
{
    glu_job j = {gate, up, n, alpha, limit};
    glu_run(ctx, &j, n_rows, swiglu_oai_item);
}

/* ---- RoPE ------------------------------------------------------------------
 * Angles are computed in double and rounded once, in the reference and in the
 * table alike, so both rotate by the same float cos/sin and agree to the
 * last bit whatever the position. */

void kn_rope_inv_freq(double *inv_freq, int rope_dim, float base, float scale, const float *factors)
{
    for (int i = 0; i < rope_dim / 2; i++) {
        double f = pow((double)base, -2.0 * i / rope_dim);
        if (scale != 1.0f)
            f /= scale;
        if (factors)
            f /= factors[i];
        inv_freq[i] = f;
    }
}

static inline void rope_angle(int32_t pos, double inv_freq, float *c, float *s)
{
    const double theta = (double)pos * inv_freq;
    *c = (float)cos(theta);
    *s = (float)sin(theta);
}

static inline void rope_head(float *xh, const float *cs, int rope_dim, bool neox)
{
    const int half = rope_dim / 2;
    if (neox) {
        for (int i = 0; i < half; i++) {
            const float c = cs[2 * i], s = cs[2 * i + 1];
            const float x0 = xh[i], x1 = xh[i + half];
            xh[i] = x0 * c - x1 * s;
            xh[i + half] = x0 * s + x1 * c;
        }
    } else {
        for (int i = 0; i < half; i++) {
            const float c = cs[2 * i], s = cs[2 * i + 1];
            const float x0 = xh[2 * i], x1 = xh[2 * i + 1];
            xh[2 * i] = x0 * c - x1 * s;
            xh[2 * i + 1] = x0 * s + x1 * c;
        }
    }
}

static int rope_clamp_dim(int rope_dim, int head_dim)
{
    if (rope_dim > head_dim)
        rope_dim = head_dim;
    return rope_dim < 0 ? 0 : rope_dim & ~1;
}

void kn_rope_ref(float *x, int n_rows, const int32_t *pos, int n_heads, int head_dim, int rope_dim,
                 const double *inv_freq, bool neox)
{
    rope_dim = rope_clamp_dim(rope_dim, head_dim);
    const int half = rope_dim / 2;
    for (int r = 0; r < n_rows; r++) {
        for (int h = 0; h < n_heads; h++) {
            float *xh = x + ((size_t)r * n_heads + h) * head_dim;
            for (int i = 0; i < half; i++) {
                float c, s;
                rope_angle(pos[r], inv_freq[i], &c, &s);
                const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
                const float x0 = xh[a], x1 = xh[b];
                xh[a] = x0 * c - x1 * s;
                xh[b] = x0 * s + x1 * c;
            }
        }
    }
}

typedef struct rope_job {
    float *x;
    const float *cs;
    const int32_t *pos;
    int n_heads, head_dim, rope_dim;
    const double *inv_freq;
    bool neox;
} rope_job;

static void rope_table_item(void *arg, int r, int tid)
{
    (void)tid;
    const rope_job *j = arg;
    float *cs = (float *)j->cs + (size_t)r * j->rope_dim;
    for (int i = 0; i < j->rope_dim / 2; i++)
        rope_angle(j->pos[r], j->inv_freq[i], &cs[2 * i], &cs[2 * i + 1]);
}

static void rope_apply_item(void *arg, int r, int tid)
{
    (void)tid;
    const rope_job *j = arg;
    const float *cs = j->cs + (size_t)r * j->rope_dim;
    for (int h = 0; h < j->n_heads; h++)
        rope_head(j->x + ((size_t)r * j->n_heads + h) * j->head_dim, cs, j->rope_dim, j->neox);
}

void kn_rope(kn_ctx *ctx, float *x, int n_rows, const int32_t *pos, int n_heads, int head_dim, int rope_dim,
             const double *inv_freq, bool neox)
{
    rope_dim = rope_clamp_dim(rope_dim, head_dim);
    if (n_rows <= 0 || rope_dim == 0)
        return;
    const size_t cs_bytes = (size_t)n_rows * rope_dim * sizeof(float);
    const size_t pos_bytes = (size_t)n_rows * sizeof(int32_t);
    rope_job j = {x, NULL, pos, n_heads, head_dim, rope_dim, inv_freq, neox};
    /* The table depends only on the positions: Q and K of every layer in one
     * forward pass share it, so it is built once per pass. */
    bool hit = ctx->rope_valid && ctx->rope_rows == n_rows && ctx->rope_dim == rope_dim &&
               ctx->rope_inv == inv_freq && memcmp(ctx->rope_pos, pos, pos_bytes) == 0;
    if (!hit) {
        ctx->rope_valid = false;
        if (scratch_reserve((void **)&ctx->rope_cs, &ctx->rope_cs_cap, cs_bytes) != 0 ||
            scratch_reserve((void **)&ctx->rope_pos, &ctx->rope_pos_cap, pos_bytes) != 0) {
            /* out of memory: still give the right answer, just slower */
            kn_rope_ref(x, n_rows, pos, n_heads, head_dim, rope_dim, inv_freq, neox);
            return;
        }
        j.cs = ctx->rope_cs;
        if ((int64_t)n_rows * rope_dim >= 1024)
            pool_run(ctx, n_rows, rope_table_item, &j);
        else
            for (int r = 0; r < n_rows; r++)
                rope_table_item(&j, r, 0);
        memcpy(ctx->rope_pos, pos, pos_bytes);
        ctx->rope_rows = n_rows;
        ctx->rope_dim = rope_dim;
        ctx->rope_inv = inv_freq;
        ctx->rope_valid = true;
    }
    j.cs = ctx->rope_cs;
    if ((int64_t)n_rows * n_heads * head_dim >= KN_PAR_MIN_ELEMS) {
        pool_run(ctx, n_rows, rope_apply_item, &j);
        return;
    }
    for (int r = 0; r < n_rows; r++)
        rope_apply_item(&j, r, 0);
}

/* ---- attention ------------------------------------------------------------ */

typedef struct attn_job {
    kn_ctx *ctx;
    const kn_attn_seq *seqs;
    int n_seqs, n_head, n_kv_head, head_dim;
    int n_chunks, chunk_heads; /* KV heads split into n_chunks runs of chunk_heads */
    int tile;                  /* query rows an item takes (KN_ATTN_TILE, or kn_attn_params.tile) */
    size_t score_stride;       /* floats between two heads' scores */
    size_t row;                /* 16-bit units of one head's K or V row */
    size_t qq_off;             /* Q8_0 cache: the quantized queries, in floats after the scores */
    float scale, softcap;
    const float *sinks;
    int window;
} attn_job;

static inline void prefetch_span(const uint16_t *p, size_t n)
{
    for (size_t i = 0; i < n; i += 32)
        __builtin_prefetch(p + i);
}

/* Query rows an attention item takes together (a prompt's): each block of
 * K and V rows, read once from the cache, serves them all from L1, where
 * one row an item read the whole context again for every row. */
#define KN_ATTN_TILE 4

/* The first position the query at `pos` sees. */
static inline int attn_first(const attn_job *j, int pos)
{
    return j->window > 0 && pos - j->window + 1 > 0 ? pos - j->window + 1 : 0;
}

/* Positions of the block at p that row's query sees (causal, and within its
 * window): *off of them skipped at the block's start, then the count
 * returned (0: none). */
static inline int attn_run(const attn_job *j, const kn_attn_seq *sq, int row, int p, int *off)
{
    const int pos = sq->pos0 + row, n_ctx = pos + 1, bt = sq->block_tokens;
    const int lo = attn_first(j, pos);
    const int a = p > lo ? p : lo, b = n_ctx < p + bt ? n_ctx : p + bt;
    *off = a - p;
    return b > a ? b - a : 0;
}

/* Whether the row after `row` (left: rows of the tile from row on) sees
 * the same run of the block at p as row does: the two go through the
 * two-row kernels together. */
static inline bool attn_pair(const attn_job *j, const kn_attn_seq *sq, int row, int left, int p, int off,
                             int run)
{
    int off1;
    return left > 1 && attn_run(j, sq, row + 1, p, &off1) == run && off1 == off;
}

static inline void attn_softcap(const attn_job *j, float *o, int run)
{
    if (j->softcap > 0.0f)
        for (int i = 0; i < run; i++)
            o[i] = j->softcap * tanhf(o[i] / j->softcap);
}

static inline int attn_tiles(int n_q, int tile)
{
    return n_q / tile + (n_q % tile != 0);
}

/* softmax over x[0, n), with a sink logit that takes its share of the sum
 * and gives no value (NULL: none). */
static void attn_softmax(const kn_ops *ops, float *x, int n, const float *sink)
{
    if (!sink) {
        ops->softmax(x, n);
        return;
    }
    float m = *sink;
    for (int i = 0; i < n; i++)
        m = x[i] > m ? x[i] : m;
    double sum = exp((double)*sink - m);
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - m);
        sum += x[i];
    }
    const float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++)
        x[i] *= inv;
}

/* One work item is one (sequence, tile of query rows, run of KV heads). A
 * block's K (then V) rows of those heads are one contiguous span of the
 * cache, swept in order a block at a time: the prefetchers see one stream,
 * where a head at a time would be many short strided ones. Two passes,
 * scores then weighted sums, with every query head of a KV head's group,
 * and every row of the tile, reading its rows while they are in cache. A
 * row's arithmetic is what it is alone: the same bits whatever the tile.
 * Scores are kept at their absolute positions; a sliding window only
 * narrows the range each row fills and reads. */
static void attn_item(void *arg, int item, int tid)
{
    const attn_job *j = arg;
    const kn_ops *ops = j->ctx->ops;
    int s = 0;
    while (item >= attn_tiles(j->seqs[s].n_q, j->tile) * j->n_chunks) {
        item -= attn_tiles(j->seqs[s].n_q, j->tile) * j->n_chunks;
        s++;
    }
    const kn_attn_seq *sq = &j->seqs[s];
    const bool q8 = sq->kv_type == KN_TYPE_Q8_0;
    const int row0 = item / j->n_chunks * j->tile, kv0 = item % j->n_chunks * j->chunk_heads;
    const int n_rows = sq->n_q - row0 < j->tile ? sq->n_q - row0 : j->tile;
    const int kv1 = kv0 + j->chunk_heads < j->n_kv_head ? kv0 + j->chunk_heads : j->n_kv_head;
    const int group = j->n_head / j->n_kv_head, hd = j->head_dim, bt = sq->block_tokens;
    const int heads = (kv1 - kv0) * group;          /* query heads of the item, from kv0 * group */
    const int n_ctx_max = sq->pos0 + row0 + n_rows; /* the tile's last row's */
    const int p0 = attn_first(j, sq->pos0 + row0) / bt * bt; /* the first block any row sees */
    float *sc = j->ctx->score[tid];
    const size_t rw = j->row, rw_bytes = rw * sizeof(uint16_t); /* a quantized query row too */
    char *qq = (char *)(sc + j->qq_off);
/* row r's query, output, scores and quantized query of head h */
#define ATTN_Q(r, h) (sq->q + ((size_t)(row0 + (r)) * j->n_head + (size_t)(h)) * hd)
#define ATTN_OUT(r, h) (sq->out + ((size_t)(row0 + (r)) * j->n_head + (size_t)(h)) * hd)
#define ATTN_SC(r, h) (sc + ((size_t)(r)*heads + (size_t)((h)-kv0 * group)) * j->score_stride)
#define ATTN_QQ(r, h) (qq + ((size_t)(r)*heads + (size_t)((h)-kv0 * group)) * rw_bytes)
    if (q8)
        for (int r = 0; r < n_rows; r++)
            for (int h = kv0 * group; h < kv1 * group; h++)
                ops->quantize_q8_0(ATTN_Q(r, h), ATTN_QQ(r, h), hd);

    const size_t span = (size_t)(kv1 - kv0) * bt * rw; /* 16-bit units of the heads' rows in a block */
    for (int p = p0; p < n_ctx_max; p += bt) {
        const uint16_t *k = sq->blocks[p / bt] + sq->k_off;
        /* the next block lies elsewhere in the pool: no prefetcher guesses it */
        prefetch_span(p + bt < n_ctx_max ? sq->blocks[p / bt + 1] + sq->k_off + (size_t)kv0 * bt * rw
                                         : sq->blocks[p0 / bt] + sq->v_off + (size_t)kv0 * bt * rw,
                      span);
        for (int kvh = kv0; kvh < kv1; kvh++)
            for (int h = kvh * group; h < (kvh + 1) * group; h++)
                for (int r = 0; r < n_rows; r++) {
                    int off;
                    const int run = attn_run(j, sq, row0 + r, p, &off);
                    if (!run)
                        continue;
                    float *o = ATTN_SC(r, h) + p + off;
                    const uint16_t *kr = k + ((size_t)kvh * bt + off) * rw;
                    if (!q8 && ops->kv_scores2 && attn_pair(j, sq, row0 + r, n_rows - r, p, off, run)) {
                        /* the next row sees the same keys of this block */
                        ops->kv_scores2(ATTN_Q(r, h), ATTN_Q(r + 1, h), kr, rw, run, hd, j->scale, o,
                                        ATTN_SC(r + 1, h) + p + off);
                        attn_softcap(j, o, run);
                        attn_softcap(j, ATTN_SC(r + 1, h) + p + off, run);
                        r++;
                        continue;
                    }
                    if (!q8) {
                        ops->kv_scores(ATTN_Q(r, h), kr, rw, run, hd, j->scale, o);
                    } else {
                        /* K rows as a gemm's weight rows: the decode matvec's
                         * layout, eight rows' sums in one vector, where the
                         * dot reduces each */
                        if (ops->gemm[KN_TYPE_Q8_0])
                            ops->gemm[KN_TYPE_Q8_0](kr, rw_bytes, run, ATTN_QQ(r, h), rw_bytes, 1, hd, o,
                                                    (size_t)run);
                        else
                            ops->dot[KN_TYPE_Q8_0](ATTN_QQ(r, h), kr, rw_bytes, run, hd, o);
                        for (int i = 0; i < run; i++)
                            o[i] *= j->scale;
                    }
                    attn_softcap(j, o, run);
                }
    }
    /* Cleared only now, after q was read, so out may alias q. */
    for (int r = 0; r < n_rows; r++)
        for (int h = kv0 * group; h < kv1 * group; h++) {
            const int lo = attn_first(j, sq->pos0 + row0 + r);
            attn_softmax(ops, ATTN_SC(r, h) + lo, sq->pos0 + row0 + r + 1 - lo, j->sinks ? &j->sinks[h] : NULL);
            memset(ATTN_OUT(r, h), 0, (size_t)hd * sizeof(float));
        }
    for (int p = p0; p < n_ctx_max; p += bt) {
        const uint16_t *v = sq->blocks[p / bt] + sq->v_off;
        if (p + bt < n_ctx_max)
            prefetch_span(sq->blocks[p / bt + 1] + sq->v_off + (size_t)kv0 * bt * rw, span);
        for (int kvh = kv0; kvh < kv1; kvh++)
            for (int h = kvh * group; h < (kvh + 1) * group; h++)
                for (int r = 0; r < n_rows; r++) {
                    int off;
                    const int run = attn_run(j, sq, row0 + r, p, &off);
                    if (!run)
                        continue;
                    const float *w = ATTN_SC(r, h) + p + off;
                    const uint16_t *vr = v + ((size_t)kvh * bt + off) * rw;
                    if (!q8 && ops->kv_accum2 && attn_pair(j, sq, row0 + r, n_rows - r, p, off, run)) {
                        ops->kv_accum2(ATTN_OUT(r, h), ATTN_OUT(r + 1, h), w, ATTN_SC(r + 1, h) + p + off, vr,
                                       rw, run, hd);
                        r++;
                        continue;
                    }
                    if (q8)
                        ops->kv_accum_q8_0(ATTN_OUT(r, h), w, vr, rw_bytes, run, hd);
                    else
                        ops->kv_accum(ATTN_OUT(r, h), w, vr, rw, run, hd);
                }
    }
#undef ATTN_Q
#undef ATTN_OUT
#undef ATTN_SC
#undef ATTN_QQ
}

int kn_attention(kn_ctx *ctx, const kn_attn_seq *seqs, int n_seqs, int n_head, int n_kv_head, int head_dim,
                 float scale)
{
    const kn_attn_params p = {.n_head = n_head, .n_kv_head = n_kv_head, .head_dim = head_dim, .scale = scale};
    return kn_attention_ex(ctx, seqs, n_seqs, &p);
}

int kn_attention_ex(kn_ctx *ctx, const kn_attn_seq *seqs, int n_seqs, const kn_attn_params *ap)
{
    const int n_head = ap->n_head, n_kv_head = ap->n_kv_head, head_dim = ap->head_dim;
    const int max_tile = ap->tile > 0 ? ap->tile : KN_ATTN_TILE;
    if (n_seqs < 0 || ap->window < 0 || n_head <= 0 || n_kv_head <= 0 || head_dim <= 0 ||
        n_head % n_kv_head != 0 || ap->tile < 0)
        return -EINVAL;
    int64_t rows = 0;
    int max_ctx = 0;
    const size_t row = n_seqs > 0 ? kn_kv_row_units(seqs[0].kv_type, head_dim) : 0;
    for (int s = 0; s < n_seqs; s++) {
        /* one cache, one type: the row length is the job's */
        if (seqs[s].n_q < 0 || seqs[s].pos0 < 0 || seqs[s].block_tokens <= 0 || row == 0 ||
            seqs[s].kv_type != seqs[0].kv_type)
            return -EINVAL;
        if (seqs[s].n_q == 0)
            continue;
        rows += seqs[s].n_q;
        const int64_t last = (int64_t)seqs[s].pos0 + seqs[s].n_q;
        if (last > INT32_MAX - seqs[s].block_tokens) /* attn_item steps a block past the end */
            return -EINVAL;
        if (last > max_ctx)
            max_ctx = (int)last;
    }
    if (rows == 0)
        return 0;
    int64_t tiles = 0;
    int tile = 1; /* rows an item holds scores for: decode needs one */
    for (int s = 0; s < n_seqs; s++) {
        tiles += attn_tiles(seqs[s].n_q, max_tile);
        tile = seqs[s].n_q > tile ? (seqs[s].n_q < max_tile ? seqs[s].n_q : max_tile) : tile;
    }
    /* All heads in one item when there are tiles enough to keep every
     * thread busy; split the heads when there are few (decode of one
     * sequence). */
    int n_chunks = 1;
    if (tiles < 4 * (int64_t)ctx->n_threads)
        n_chunks = (int)((4 * ctx->n_threads + tiles - 1) / tiles);
    if (n_chunks > n_kv_head)
        n_chunks = n_kv_head;
    int chunk_heads = (n_kv_head + n_chunks - 1) / n_chunks;
    /* Each item keeps the scores of all its query heads: at long contexts
     * fewer KV heads an item, so the per-thread scratch stays near 1 MiB (a
     * split costs no extra reads, each item sweeping only its own heads). */
    const size_t score_stride = ((size_t)max_ctx + 15) & ~(size_t)15;
    const size_t group = (size_t)(n_head / n_kv_head);
    while (chunk_heads > 1 && score_stride * group * (size_t)chunk_heads * tile > KN_ATTN_SCRATCH_FLOATS)
        chunk_heads = (chunk_heads + 1) / 2;
    n_chunks = (n_kv_head + chunk_heads - 1) / chunk_heads;
    if (tiles * n_chunks > INT32_MAX)
        return -EINVAL;
    /* Grown here, on the calling thread, so workers never allocate. The
     * quantized queries of a Q8_0 cache follow the scores (a multiple of 16
     * floats, so they start on a cache line). */
    const size_t qq_off = score_stride * chunk_heads * group * tile;
    const size_t qq_floats =
        seqs[0].kv_type == KN_TYPE_Q8_0 ? (group * chunk_heads * tile * row * 2 + 3) / 4 : 0;
    for (int t = 0; t < ctx->n_threads; t++)
        if (scratch_reserve((void **)&ctx->score[t], &ctx->score_cap[t],
                            (qq_off + qq_floats) * sizeof(float)) != 0)
            return -ENOMEM;
    attn_job j = {.ctx = ctx,
                  .seqs = seqs,
                  .n_seqs = n_seqs,
                  .n_head = n_head,
                  .n_kv_head = n_kv_head,
                  .head_dim = head_dim,
                  .n_chunks = n_chunks,
                  .chunk_heads = chunk_heads,
                  .tile = max_tile,
                  .score_stride = score_stride,
                  .row = row,
                  .qq_off = qq_off,
                  .scale = ap->scale,
                  .softcap = ap->softcap,
                  .sinks = ap->sinks,
                  .window = ap->window};
    pool_run(ctx, (int)(tiles * n_chunks), attn_item, &j);
    return 0;
}
