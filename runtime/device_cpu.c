/* The CPU device (see device.h): weights repacked for the CPU kernels'
 * gemms, the KV pool in host memory, and the forward pass of forward.c. */
#include "runtime/device.h"
#include "runtime/model_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* The packed layout a matrix of this type takes (KN_TYPE_F32: none): every
 * type whose gemm the CPU table has over packed rows (kn_pack). */
static kn_type packed_type(const rt_model *m, kn_type t)
{
    const kn_ops *ops = kn_ctx_ops(m->kn);
    if (t >= KN_TYPE_COUNT)
        return KN_TYPE_F32;
    bool has = ops->gemm_packed[t] != NULL || (t == KN_TYPE_Q8_0 && ops->gemm_q8_0_p16 != NULL) ||
               (t == KN_TYPE_Q4_0 && ops->gemm_q4_0_p16 != NULL);
    return has ? kn_packed_type(t) : KN_TYPE_F32;
}

static size_t packed_bytes(kn_type p, const rt_weight *w)
{
    return (kn_pack_bytes(kn_unpacked_type(p), w->n_out, w->n_in) + 63) & ~(size_t)63;
}

/* Repacks the matrices of every type the CPU table has a packed gemm for
 * into one anonymous mapping, and lets the file's copy of them go: the
 * pages of the mapping are read again only if something asks. A tied
 * output matrix is left alone, its rows being the token embeddings too. */
static int pack_weights(rt_model *m, char *err, size_t err_len)
{
    rt_weight **all;
    int n = rt_model_matrices(m, &all);
    if (n < 0) {
        snprintf(err, err_len, "out of memory");
        return -ENOMEM;
    }
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        kn_type p = packed_type(m, all[i]->type);
        if (p != KN_TYPE_F32)
            total += packed_bytes(p, all[i]);
    }
    void *p = total ? mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) : NULL;
    if (p == MAP_FAILED) {
        free(all);
        snprintf(err, err_len, "cannot map %zu bytes for the repacked weights", total);
        return -ENOMEM;
    }
    if (!p) {
        free(all);
        return 0;
    }
    madvise(p, total, MADV_HUGEPAGE); /* a hint: weights stream through the TLB every step */
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    char *at = p;
    for (int i = 0; i < n; i++) {
        rt_weight *w = all[i];
        const kn_type pt = packed_type(m, w->type);
        if (pt == KN_TYPE_F32)
            continue;
        kn_pack(w->type, w->data, w->n_out, w->n_in, at);
        uintptr_t lo = ((uintptr_t)w->data + page - 1) & ~(page - 1);
        uintptr_t hi = ((uintptr_t)w->data + w->nbytes) & ~(page - 1);
        if (hi > lo)
            madvise((void *)lo, hi - lo, MADV_DONTNEED);
        w->data = at;
        w->type = pt;
        at += packed_bytes(pt, w);
    }
    free(all);
    m->packed = p;
    m->packed_bytes = total;
    return 0;
}

static void cpu_free(rt_model *m)
{
    rt_act_dispose(&m->act);
    if (m->packed)
        munmap(m->packed, m->packed_bytes);
    m->packed = NULL;
}

static int cpu_kv_alloc(const rt_model *m, size_t bytes, void **out, char *err, size_t err_len)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    *out = NULL;
    if (p == MAP_FAILED) {
        snprintf(err, err_len, "out of memory for a KV cache of %zu bytes (%s)", bytes, strerror(errno));
        return -ENOMEM;
    }
    /* Huge pages where the kernel grants them: a decode step reads the
     * blocks of every running sequence, scattered over the pool, and on
     * 4 KiB pages each block's span crosses pages that the TLB and the
     * prefetchers lose (bench_attention: 13% less time, 16 sequences).
     * The pool is faulted in now, not as sequences first reach it: a
     * huge page's first touch clears 2 MiB and may compact memory, a
     * stall that would land in some request's step. Hints both: where
     * refused, the pool works as it is. */
    madvise(p, bytes, MADV_HUGEPAGE);
#ifdef MADV_POPULATE_WRITE
    madvise(p, bytes, MADV_POPULATE_WRITE);
#endif
    *out = p;
    return 0;
}

static void cpu_kv_release(const rt_model *m, void *pool, size_t bytes)
{
    munmap(pool, bytes);
}

static void cpu_device_info(const rt_model *m, rt_device_info *out)
{
    memset(out, 0, sizeof(*out));
    snprintf(out->kind, sizeof(out->kind), "cpu");
}

const rt_device_ops rt_device_cpu = {
    .abi = RT_DEVICE_ABI,
    .model_size = sizeof(rt_model),
    .kv_size = sizeof(rt_kv),
    .seq_size = sizeof(rt_seq),
    .name = "cpu",
    .kv_q8_0 = true,
    .load = pack_weights,
    .free = cpu_free,
    .forward = rt_cpu_forward,
    .kv_alloc = cpu_kv_alloc,
    .kv_release = cpu_kv_release,
    .device_info = cpu_device_info,
};
