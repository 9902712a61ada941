/* Paged KV cache: one pool of fixed-size blocks; sequences hold block
 * tables and grow block by block (see model.h). Block layout, per layer:
 * K then V, as IEEE halves or Q8_0 rows. In host memory each is
 * [n_kv_head][block_tokens][row] (kn_attention: a run of heads is one
 * contiguous span); in device memory, for a CUDA model, halves as
 * [block_tokens][kv_dim]. Halves, not floats, on the host too, and Q8_0 on
 * request: decode attention reads a sequence's whole cache for every token,
 * and at a batch of long sequences that read outweighs the weights'. */
#include "runtime/device.h"
#include "runtime/model_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

rt_kv *rt_kv_new(const rt_model *m, size_t bytes, int block_tokens, kn_type kv_type, char *err,
                 size_t err_len)
{
    if (block_tokens <= 0 || block_tokens > 4096) {
        snprintf(err, err_len, "KV block size %d is out of range (1..4096 tokens)", block_tokens);
        return NULL;
    }
    if (kv_type != KN_TYPE_F16 && kv_type != KN_TYPE_Q8_0) {
        snprintf(err, err_len, "a KV cache holds f16 or q8_0, not %s",
                 kn_type_name(kv_type) ? kn_type_name(kv_type) : "this type");
        return NULL;
    }
    if (kv_type == KN_TYPE_Q8_0 && !m->dev->kv_q8_0) {
        snprintf(err, err_len, "a q8_0 KV cache is for CPU workers; a CUDA worker keeps f16");
        return NULL;
    }
    if (kn_kv_row_units(kv_type, m->hp.head_dim) == 0) {
        snprintf(err, err_len, "a q8_0 KV cache needs a head size that is a multiple of 32, not %d",
                 m->hp.head_dim);
        return NULL;
    }
    /* block_elems counts 16-bit units, as block tables address them */
    size_t block_elems = rt_model_kv_bytes_per_token(m, kv_type) / sizeof(uint16_t) * block_tokens;
    size_t block_bytes = block_elems * sizeof(uint16_t);
    size_t n = bytes / block_bytes;
    if (n < 1) { /* not rounded up: the pool would be larger than asked */
        snprintf(err, err_len, "KV cache of %zu bytes holds no block: one block of %d tokens takes %zu bytes",
                 bytes, block_tokens, block_bytes);
        return NULL;
    }
    if (n > INT32_MAX / 2) {
        snprintf(err, err_len, "KV cache of %zu bytes is too large", bytes);
        return NULL;
    }
    rt_kv *kv = calloc(1, sizeof(*kv));
    if (!kv)
        goto nomem;
    kv->model = m;
    kv->block_tokens = block_tokens;
    kv->type = kv_type;
    kv->n_blocks = (int)n;
    kv->block_elems = block_elems;
    kv->block_bytes = block_bytes;
    if (m->dev->kv_alloc(m, n * block_bytes, &kv->pool, err, err_len)) {
        rt_kv_free(kv);
        return NULL;
    }
    kv->free_list = malloc(n * sizeof(int));
    if (!kv->free_list)
        goto nomem;
    /* Hand out low blocks first so a lightly used pool stays compact. */
    for (size_t i = 0; i < n; i++)
        kv->free_list[i] = (int)(n - 1 - i);
    kv->n_free = (int)n;
    return kv;
nomem:
    snprintf(err, err_len, "out of memory for a KV cache of %zu blocks of %zu bytes", n, block_bytes);
    rt_kv_free(kv);
    return NULL;
}

void rt_kv_free(rt_kv *kv)
{
    if (!kv)
        return;
    if (kv->pool)
        kv->model->dev->kv_release(kv->model, kv->pool, (size_t)kv->n_blocks * kv->block_bytes);
    free(kv->free_list);
    free(kv);
}

int rt_kv_blocks_total(const rt_kv *kv)
{
    return kv->n_blocks;
}

int rt_kv_blocks_free(const rt_kv *kv)
{
    return kv->n_free;
}

kn_type rt_kv_type(const rt_kv *kv)
{
    return kv->type;
}

int rt_kv_block_tokens(const rt_kv *kv)
{
    return kv->block_tokens;
}

size_t rt_kv_block_bytes(const rt_kv *kv)
{
    return kv->block_bytes;
}

/* Address of block i: plain integer arithmetic, since a device pool's
 * addresses are not host objects. */
static uint16_t *block_addr(const rt_kv *kv, int i)
{
    return (uint16_t *)((uintptr_t)kv->pool + (uintptr_t)i * kv->block_bytes);
}

rt_seq *rt_seq_new(rt_kv *kv, int max_tokens)
{
    int n_ctx = kv->model->hp.n_ctx_train;
    if (max_tokens <= 0 || max_tokens > n_ctx)
        max_tokens = n_ctx;
    rt_seq *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->kv = kv;
    s->max_tokens = max_tokens;
    s->blocks = calloc((size_t)(max_tokens + kv->block_tokens - 1) / kv->block_tokens, sizeof(uint16_t *));
    if (!s->blocks) {
        free(s);
        return NULL;
    }
    return s;
}

void rt_seq_free(rt_seq *s)
{
    if (!s)
        return;
    rt_kv *kv = s->kv;
    for (int i = 0; i < s->n_blocks; i++)
        kv->free_list[kv->n_free++] = rt_kv_block_index(kv, s->blocks[i]);
    free(s->blocks);
    free(s);
}

int rt_seq_len(const rt_seq *s)
{
    return s->len;
}

int rt_seq_blocks_needed(const rt_seq *s, int n)
{
    int bt = s->kv->block_tokens;
    int need = (s->len + n + bt - 1) / bt;
    return need > s->n_blocks ? need - s->n_blocks : 0;
}

int rt_seq_blocks(const rt_seq *s)
{
    return s->n_blocks;
}

int rt_seq_grow(rt_seq *s, int n)
{
    if (n < 0 || s->len + n > s->max_tokens)
        return -E2BIG;
    int need = rt_seq_blocks_needed(s, n);
    rt_kv *kv = s->kv;
    if (need > kv->n_free)
        return -ENOSPC;
    for (int i = 0; i < need; i++)
        s->blocks[s->n_blocks++] = block_addr(kv, kv->free_list[--kv->n_free]);
    return 0;
}

void rt_seq_shrink(rt_seq *s)
{
    rt_kv *kv = s->kv;
    int keep = (s->len + kv->block_tokens - 1) / kv->block_tokens;
    while (s->n_blocks > keep)
        kv->free_list[kv->n_free++] = rt_kv_block_index(kv, s->blocks[--s->n_blocks]);
}
