/* Internals shared by model.c (loading), kv.c (paged KV cache) and
 * forward.c (the batched forward pass). Not a public header. */
#ifndef RT_MODEL_INTERNAL_H
#define RT_MODEL_INTERNAL_H

#include "kernels/kn.h"
#include "runtime/model.h"

/* A weight matrix in the mapping: n_out rows of n_in elements. */
typedef struct rt_weight {
    const void *data;
    kn_type type;
    int n_in, n_out;
    uint64_t nbytes;
} rt_weight;

typedef struct rt_layer {
    rt_weight wq, wk, wv, wo, w_gate, w_up, w_down;
    float *attn_norm, *ffn_norm; /* owned, n_embd */
    float *bq, *bk, *bv;         /* owned, optional (qwen2) */
} rt_layer;

/* Activation buffers for a batch of up to `cap` tokens, grown on demand. */
typedef struct rt_act {
    int cap;
    float *x, *xb, *q, *k, *v, *att, *hb, *hb2;
    int32_t *pos;
    int n_out_cap;
    float *out_x;      /* rows that need logits */
    float *out_logits; /* n_out_cap x n_vocab */
    int n_attn_cap;
    kn_attn_seq *attn;
} rt_act;

struct rt_model {
    rt_gguf *gguf;
    rt_hparams hp;
    rt_tokenizer *tok;
    rt_weight tok_embd, output;
    float *output_norm;
    rt_layer *layers;
    uint64_t weight_bytes, bytes_per_token;
    kn_ctx *kn;
    rt_act act;
};

struct rt_kv {
    const rt_model *model;
    int block_tokens;
    int n_blocks;
    size_t block_floats;
    float *pool;
    int *free_list; /* stack of free block indices */
    int n_free;
};

struct rt_seq {
    rt_kv *kv;
    int len;
    int max_tokens;
    int n_blocks;
    float **blocks; /* capacity: ceil(max_tokens / block_tokens) */
};

void rt_act_dispose(rt_act *a);
/* Takes blocks so that seq can hold len + n positions: 0 or -ENOSPC / -E2BIG
 * (nothing taken on failure). */
int rt_seq_grow(rt_seq *s, int n);
/* Returns blocks beyond what len positions need (undo of a grow). */
void rt_seq_shrink(rt_seq *s);

#endif
