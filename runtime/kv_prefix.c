/* Prefix cache of the paged KV cache (see model.h): full blocks of KV that
 * sequences computed stay findable by their contents, so that a request
 * whose prompt begins as an earlier one did (a chat resending its
 * conversation, an agent its system prompt) takes those blocks instead of
 * computing them again.
 *
 * A block's key is the block before it in its sequence (its pool index and
 * that block's generation, bumped each time the block is evicted) and its
 * block_tokens tokens: a chain, as vLLM's hash of (parent hash, tokens),
 * but checked exactly, so no two prompts can be made to collide and one
 * read the other's KV. The model and the KV type need no place in the key:
 * a pool holds one model's KV of one type. The table is hashed on that key
 * with the process's random hash key (hash.h).
 *
 * Blocks are shared by reference count. A block no sequence holds any more
 * goes to the free list if it is in no table, else to the tail of the LRU
 * list, where it stays findable until the pool runs out of free blocks and
 * takes the LRU head. Sequences give their blocks back last first, so a
 * conversation's shared beginning outlives its ends. Only whole blocks
 * written up to their last position are cached; a sequence writes only
 * past its length, so a cached block, shared or not, is never written.
 *
 * Models with sliding-window layers get no cache: their sliding layers'
 * blocks leave a sequence as it grows past the window, so what a sequence
 * leaves behind is not the whole KV of its prefix (caching only the blocks
 * every group still holds would cache little past the first window). */
#include "runtime/hash.h"
#include "runtime/model_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct bmeta {
    int ref;             /* sequences holding the block */
    int parent;          /* the key: the block before (-1: the first of a sequence)... */
    uint32_t parent_gen; /* ...at this generation of it... */
    uint32_t gen;        /* this block's generation: bumped when it leaves the table */
    int next;            /* in its hash bucket's chain */
    int lru_prev, lru_next;
    bool cached, in_lru;
} bmeta;

struct rt_kv_prefix {
    bmeta *m;
    int32_t *tokens; /* block_tokens per block: the key's tokens */
    int *bucket;     /* bucket_mask + 1 chain heads, -1 empty */
    uint32_t bucket_mask;
    int lru_head, lru_tail, n_lru, n_cached;
    uint64_t key;
};

static uint64_t key_hash(const rt_kv *kv, int parent, uint32_t parent_gen, const int32_t *tokens)
{
    const size_t n = (size_t)kv->block_tokens * sizeof(int32_t);
    uint64_t h = rt_hash_bytes((const char *)tokens, n, kv->prefix->key);
    return h ^ (rt_hash_bytes((const char *)&parent, sizeof(parent), h) + parent_gen);
}

int rt_kv_prefix_enable(rt_kv *kv, char *why, size_t why_len)
{
    if (kv->prefix)
        return 0;
    if (kv->n_local_groups) {
        snprintf(why, why_len,
                 "prefix cache off: the model has sliding-window layers, whose KV blocks leave a sequence as "
                 "it passes the window of %d tokens, so no sequence leaves its prefix's whole KV behind",
                 kv->window);
        return -ENOTSUP;
    }
    rt_kv_prefix *p = calloc(1, sizeof(*p));
    uint32_t nb = 1;
    while (nb < (uint32_t)kv->n_blocks && nb < (1u << 30))
        nb <<= 1;
    if (!p || !(p->m = calloc((size_t)kv->n_blocks, sizeof(bmeta))) ||
        !(p->tokens = malloc((size_t)kv->n_blocks * kv->block_tokens * sizeof(int32_t))) ||
        !(p->bucket = malloc((size_t)nb * sizeof(int)))) {
        snprintf(why, why_len, "prefix cache off: out of memory for its table of %d blocks", kv->n_blocks);
        rt_kv_prefix_free(p);
        return -ENOMEM;
    }
    memset(p->bucket, 0xff, (size_t)nb * sizeof(int));
    p->bucket_mask = nb - 1;
    p->lru_head = p->lru_tail = -1;
    p->key = rt_hash_key();
    kv->prefix = p;
    /* blocks held now (none, at start-up) are counted as held once */
    for (int i = 0; i < kv->n_blocks; i++)
        p->m[i].ref = 1;
    for (int i = 0; i < kv->n_free; i++)
        p->m[kv->free_list[i]].ref = 0;
    return 0;
}

void rt_kv_prefix_free(rt_kv_prefix *p)
{
    if (!p)
        return;
    free(p->m);
    free(p->tokens);
    free(p->bucket);
    free(p);
}

static void lru_unlink(rt_kv_prefix *p, int i)
{
    bmeta *b = &p->m[i];
    if (b->lru_prev >= 0)
        p->m[b->lru_prev].lru_next = b->lru_next;
    else
        p->lru_head = b->lru_next;
    if (b->lru_next >= 0)
        p->m[b->lru_next].lru_prev = b->lru_prev;
    else
        p->lru_tail = b->lru_prev;
    b->in_lru = false;
    p->n_lru--;
}

static void lru_push(rt_kv_prefix *p, int i)
{
    bmeta *b = &p->m[i];
    b->lru_prev = p->lru_tail;
    b->lru_next = -1;
    if (p->lru_tail >= 0)
        p->m[p->lru_tail].lru_next = i;
    else
        p->lru_head = i;
    p->lru_tail = i;
    b->in_lru = true;
    p->n_lru++;
}

/* Takes block i out of the table: its children's keys name its old
 * generation, so they can no longer be found through it. */
static void uncache(rt_kv *kv, int i)
{
    rt_kv_prefix *p = kv->prefix;
    bmeta *b = &p->m[i];
    const uint64_t h = key_hash(kv, b->parent, b->parent_gen, p->tokens + (size_t)i * kv->block_tokens);
    int *at = &p->bucket[h & p->bucket_mask];
    while (*at != i)
        at = &p->m[*at].next;
    *at = b->next;
    b->cached = false;
    b->gen++;
    p->n_cached--;
}

int rt_kv_prefix_take(rt_kv *kv)
{
    rt_kv_prefix *p = kv->prefix;
    int i;
    if (kv->n_free > 0) {
        i = kv->free_list[--kv->n_free];
    } else {
        i = p->lru_head; /* the caller counted n_free + n_lru */
        lru_unlink(p, i);
        uncache(kv, i);
    }
    p->m[i].ref = 1;
    return i;
}

void rt_kv_prefix_put(rt_kv *kv, int i)
{
    rt_kv_prefix *p = kv->prefix;
    bmeta *b = &p->m[i];
    if (--b->ref > 0)
        return;
    if (b->cached)
        lru_push(p, i);
    else
        kv->free_list[kv->n_free++] = i;
}

/* The cached block after (parent, parent_gen) holding tokens, or -1. */
static int find(const rt_kv *kv, int parent, uint32_t parent_gen, const int32_t *tokens)
{
    const rt_kv_prefix *p = kv->prefix;
    const size_t n = (size_t)kv->block_tokens;
    const uint64_t h = key_hash(kv, parent, parent_gen, tokens);
    for (int i = p->bucket[h & p->bucket_mask]; i >= 0; i = p->m[i].next) {
        const bmeta *b = &p->m[i];
        if (b->parent == parent && b->parent_gen == parent_gen &&
            !memcmp(p->tokens + (size_t)i * n, tokens, n * sizeof(int32_t)))
            return i;
    }
    return -1;
}

static uint16_t *block_at(const rt_kv *kv, int i)
{
    return (uint16_t *)((uintptr_t)kv->pool + (uintptr_t)i * kv->block_bytes);
}

int rt_seq_reuse_prefix(rt_seq *s, const int32_t *tokens, int n)
{
    rt_kv *kv = s->kv;
    rt_kv_prefix *p = kv->prefix;
    if (!p || s->len || s->n_pos)
        return 0;
    const int bt = kv->block_tokens;
    uint16_t **table = rt_seq_table(s, 0);
    int parent = -1;
    uint32_t parent_gen = 0;
    while ((s->n_pos + 1) * bt <= n && s->n_pos < s->cap) {
        const int i = find(kv, parent, parent_gen, tokens + (size_t)s->n_pos * bt);
        if (i < 0)
            break;
        bmeta *b = &p->m[i];
        if (b->ref++ == 0)
            lru_unlink(p, i);
        table[s->n_pos++] = block_at(kv, i);
        s->n_blocks++;
        parent = i;
        parent_gen = b->gen;
    }
    s->n_cached = s->n_pos;
    s->len = s->n_pos * bt;
    return s->len;
}

int rt_kv_prefix_peek(const rt_kv *kv, const int32_t *tokens, int n)
{
    const rt_kv_prefix *p = kv->prefix;
    if (!p)
        return 0;
    const int bt = kv->block_tokens;
    int parent = -1, taken = 0;
    uint32_t parent_gen = 0;
    while ((taken + 1) * bt <= n) {
        const int i = find(kv, parent, parent_gen, tokens + (size_t)taken * bt);
        if (i < 0)
            break;
        parent = i;
        parent_gen = p->m[i].gen;
        taken++;
    }
    return taken * bt;
}

void rt_seq_cache_blocks(rt_seq *s, const int32_t *tokens)
{
    rt_kv *kv = s->kv;
    rt_kv_prefix *p = kv->prefix;
    if (!p)
        return;
    const int bt = kv->block_tokens, full = s->len / bt;
    uint16_t **table = rt_seq_table(s, 0);
    for (; s->n_cached < full; s->n_cached++) {
        const int b = s->n_cached, i = rt_kv_block_index(kv, table[b]);
        const int parent = b ? rt_kv_block_index(kv, table[b - 1]) : -1;
        /* a parent out of the table (this sequence's, computed while an
         * equal block was cached) ends what can be found through it */
        if (parent >= 0 && !p->m[parent].cached)
            break;
        const uint32_t parent_gen = parent >= 0 ? p->m[parent].gen : 0;
        const int32_t *t = tokens + (size_t)b * bt;
        if (p->m[i].cached || find(kv, parent, parent_gen, t) >= 0)
            continue; /* already there (computed alongside by another sequence) */
        bmeta *m = &p->m[i];
        memcpy(p->tokens + (size_t)i * bt, t, (size_t)bt * sizeof(int32_t));
        m->parent = parent;
        m->parent_gen = parent_gen;
        const uint64_t h = key_hash(kv, parent, parent_gen, t);
        m->next = p->bucket[h & p->bucket_mask];
        p->bucket[h & p->bucket_mask] = i;
        m->cached = true;
        p->n_cached++;
    }
}

int rt_seq_blocks_freeable(const rt_seq *s)
{
    const rt_kv *kv = s->kv;
    if (!kv->prefix)
        return s->n_blocks;
    int n = 0;
    const uint16_t *const *table = (const uint16_t *const *)rt_seq_table(s, 0);
    for (int b = 0; b < s->n_pos; b++)
        n += table[b] && kv->prefix->m[rt_kv_block_index(kv, table[b])].ref == 1;
    return n;
}

bool rt_kv_prefix_on(const rt_kv *kv)
{
    return kv->prefix != NULL;
}

int rt_kv_blocks_cached(const rt_kv *kv)
{
    return kv->prefix ? kv->prefix->n_cached : 0;
}

int rt_kv_blocks_evictable(const rt_kv *kv)
{
    return kv->prefix ? kv->prefix->n_lru : 0;
}
