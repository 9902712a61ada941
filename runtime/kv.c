/* Paged KV cache: one pool of fixed-size blocks; sequences hold block
 * tables and grow block by block (see model.h). Layers go in groups, all
 * global or all sliding-window (model_internal.h): a block holds one
 * group's layers, a sequence one table per group, and a sliding group's
 * table gives back the blocks no query to come can see, so a long context
 * of a Gemma or gpt-oss model holds its global layers' KV and only a
 * window of the others'. Block layout, per layer of the group:
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

static int gcd(int a, int b)
{
    while (b) {
        int t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Splits the layers into groups of the same size, global ones first: the
 * largest size both kinds divide into (all layers in one group when no
 * layer slides). */
static int plan_groups(rt_kv *kv, const rt_model *m)
{
    const int n_layer = m->hp.n_layer;
    int n_local = 0;
    for (int l = 0; l < n_layer; l++)
        n_local += m->layers[l].local;
    const int n_global = n_layer - n_local;
    const int u = n_local && n_global ? gcd(n_local, n_global) : n_layer;
    kv->group_layers = u;
    kv->n_groups = n_layer / u;
    kv->n_local_groups = n_local / u;
    kv->window = n_local ? m->hp.n_swa : 0;
    kv->layer_group = malloc((size_t)n_layer * sizeof(int));
    kv->layer_slot = malloc((size_t)n_layer * sizeof(int));
    if (!kv->layer_group || !kv->layer_slot)
        return -ENOMEM;
    int gi = 0, li = 0; /* the next global and sliding layer's index in its kind */
    for (int l = 0; l < n_layer; l++) {
        const int i = m->layers[l].local ? n_global + li++ : gi++;
        kv->layer_group[l] = i / u;
        kv->layer_slot[l] = i % u;
    }
    return 0;
}

void rt_kv_layer_at(const rt_kv *kv, int l, int *group, size_t *k_off, size_t *v_off)
{
    const int bt = kv->block_tokens, n_kv = kv->model->hp.n_head_kv;
    const size_t rw = kn_kv_row_units(kv->type, kv->model->hp.head_dim);
    *group = kv->layer_group[l];
    *k_off = (size_t)kv->layer_slot[l] * 2 * bt * n_kv * rw;
    *v_off = *k_off + (size_t)bt * n_kv * rw;
}

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
    rt_kv *kv = calloc(1, sizeof(*kv));
    size_t n = 0, block_bytes = 0;
    if (!kv || plan_groups(kv, m))
        goto nomem;
    /* block_elems counts 16-bit units, as block tables address them */
    size_t block_elems = rt_model_kv_bytes_per_token(m, kv_type) / sizeof(uint16_t) / m->hp.n_layer *
                         kv->group_layers * block_tokens;
    block_bytes = block_elems * sizeof(uint16_t);
    n = bytes / block_bytes;
    if (n < 1) { /* not rounded up: the pool would be larger than asked */
        snprintf(err, err_len, "KV cache of %zu bytes holds no block: one block of %d tokens takes %zu bytes",
                 bytes, block_tokens, block_bytes);
        rt_kv_free(kv);
        return NULL;
    }
    if (n > INT32_MAX / 2) {
        snprintf(err, err_len, "KV cache of %zu bytes is too large", bytes);
        rt_kv_free(kv);
        return NULL;
    }
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
    free(kv->layer_group);
    free(kv->layer_slot);
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
    const rt_model *m = kv->model;
    int n_ctx = m->hp.n_ctx_train;
    if (max_tokens <= 0 || max_tokens > n_ctx)
        max_tokens = n_ctx;
    rt_seq *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->kv = kv;
    s->max_tokens = max_tokens;
    s->cap = (max_tokens + kv->block_tokens - 1) / kv->block_tokens;
    s->rope_long = m->rope[RT_ROPE_LONG].inv_freq && max_tokens > m->hp.n_ctx_orig;
    s->blocks = calloc((size_t)s->cap * kv->n_groups, sizeof(uint16_t *));
    if (!s->blocks) {
        free(s);
        return NULL;
    }
    return s;
}

static bool group_slides(const rt_kv *kv, int g)
{
    return g >= kv->n_groups - kv->n_local_groups;
}

static void release(rt_seq *s, int g, int b)
{
    rt_kv *kv = s->kv;
    uint16_t **e = rt_seq_table(s, g) + b;
    if (!*e)
        return;
    kv->free_list[kv->n_free++] = rt_kv_block_index(kv, *e);
    *e = NULL;
    s->n_blocks--;
}

void rt_seq_free(rt_seq *s)
{
    if (!s)
        return;
    for (int g = 0; g < s->kv->n_groups; g++)
        for (int b = 0; b < s->n_pos; b++)
            release(s, g, b);
    free(s->blocks);
    free(s);
}

int rt_seq_len(const rt_seq *s)
{
    return s->len;
}

/* Entries below this one no query from position len on can see: the
 * first position of the window of the query at len, in blocks. */
static int window_floor(const rt_seq *s)
{
    const rt_kv *kv = s->kv;
    if (!kv->n_local_groups || s->len - kv->window + 1 <= 0)
        return 0;
    int b = (s->len - kv->window + 1) / kv->block_tokens;
    return b < s->n_pos ? b : s->n_pos;
}

int rt_seq_blocks_needed(const rt_seq *s, int n)
{
    const rt_kv *kv = s->kv;
    int bt = kv->block_tokens;
    int need = (s->len + n + bt - 1) / bt;
    int grow = need > s->n_pos ? need - s->n_pos : 0;
    int freed = window_floor(s) - s->local_from;
    freed = freed > 0 ? freed * kv->n_local_groups : 0;
    int net = grow * kv->n_groups - freed;
    return net > 0 ? net : 0;
}

int rt_seq_blocks(const rt_seq *s)
{
    return s->n_blocks;
}

int rt_seq_grow(rt_seq *s, int n)
{
    if (n < 0 || s->len + n > s->max_tokens)
        return -E2BIG;
    rt_kv *kv = s->kv;
    const int bt = kv->block_tokens, need = (s->len + n + bt - 1) / bt;
    const int grow = need > s->n_pos ? need - s->n_pos : 0;
    int from = window_floor(s), freed = from > s->local_from ? (from - s->local_from) * kv->n_local_groups : 0;
    if (grow * kv->n_groups > kv->n_free + freed)
        return -ENOSPC;
    /* blocks out of every future query's window go back first */
    for (int g = kv->n_groups - kv->n_local_groups; g < kv->n_groups; g++)
        for (int b = s->local_from; b < from; b++)
            release(s, g, b);
    if (from > s->local_from)
        s->local_from = from;
    for (int b = s->n_pos; b < need; b++)
        for (int g = 0; g < kv->n_groups; g++) {
            rt_seq_table(s, g)[b] = block_addr(kv, kv->free_list[--kv->n_free]);
            s->n_blocks++;
        }
    if (need > s->n_pos)
        s->n_pos = need;
    return 0;
}

void rt_seq_shrink(rt_seq *s)
{
    rt_kv *kv = s->kv;
    int keep = (s->len + kv->block_tokens - 1) / kv->block_tokens;
    for (; s->n_pos > keep; s->n_pos--)
        for (int g = 0; g < kv->n_groups; g++)
            if (!group_slides(kv, g) || s->n_pos - 1 >= s->local_from)
                release(s, g, s->n_pos - 1);
}

int rt_kv_blocks_for(const rt_kv *kv, int n_tokens)
{
    return (n_tokens + kv->block_tokens - 1) / kv->block_tokens * kv->n_groups;
}

int64_t rt_kv_seq_tokens_max(const rt_kv *kv)
{
    const int bt = kv->block_tokens, n_global = kv->n_groups - kv->n_local_groups;
    /* every group's blocks for every position: what a prompt prefilled in
     * one step needs, windows or not */
    const int64_t plain = (int64_t)kv->n_blocks / kv->n_groups * bt;
    if (!kv->n_local_groups)
        return plain;
    if (!n_global) /* every layer slides: a window per group is all one sequence keeps */
        return INT32_MAX;
    /* decoding on, a sliding group holds its window, a block more where
     * it straddles, and the block being written */
    int64_t local = (int64_t)kv->n_local_groups * ((kv->window + bt - 1) / bt + 2);
    int64_t left = kv->n_blocks - local, windowed = left > 0 ? left / n_global * bt : 0;
    return windowed > plain ? windowed : plain;
}
