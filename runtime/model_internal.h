/* Internals shared by model.c (loading), kv.c (paged KV cache), forward.c
 * (the batched forward pass) and the devices (device_cpu.c, the CUDA
 * plugin's forward_cuda.c; see device.h). Not a public header: a change to
 * these structs changes RT_DEVICE_ABI. */
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

typedef struct rt_device_ops rt_device_ops;

struct rt_model {
    rt_gguf *gguf;
    rt_hparams hp;
    rt_tokenizer *tok;
    rt_weight tok_embd, output;
    float *output_norm;
    rt_layer *layers;
    double *rope_inv_freq; /* n_rot / 2: what kn_rope turns positions by */
    uint64_t weight_bytes, bytes_per_token;
    kn_ctx *kn;
    void *packed; /* matrices repacked for the CPU's packed gemms (anonymous mapping), or NULL */
    size_t packed_bytes;
    rt_act act;
    const rt_device_ops *dev; /* where the forward pass runs; set once its load succeeded */
    void *dev_state;          /* the device's own (weights and buffers on a GPU) */
};

/* On a GPU the pool is device memory of F16 elements: the same block
 * bookkeeping, with block addresses that only the device dereferences. */
struct rt_kv {
    const rt_model *model;
    int block_tokens;
    kn_type type; /* KN_TYPE_F16 or (host only) KN_TYPE_Q8_0 */
    int n_blocks;
    size_t block_elems; /* 16-bit units per block: halves, or Q8_0 blocks of 17 */
    size_t block_bytes;
    void *pool;     /* from the model's device (kv_alloc): host or device memory */
    int *free_list; /* stack of free block indices */
    int n_free;
};

struct rt_seq {
    rt_kv *kv;
    int len;
    int max_tokens;
    int n_blocks;
    uint16_t **blocks; /* capacity: ceil(max_tokens / block_tokens) */
};

/* Index of a block of kv's pool from its address (host or device). */
static inline int rt_kv_block_index(const rt_kv *kv, const uint16_t *blk)
{
    return (int)(((uintptr_t)blk - (uintptr_t)kv->pool) / kv->block_bytes);
}

void rt_act_dispose(rt_act *a);
/* Takes blocks so that seq can hold len + n positions: 0 or -ENOSPC / -E2BIG
 * (nothing taken on failure). */
int rt_seq_grow(rt_seq *s, int n);
/* Returns blocks beyond what len positions need (undo of a grow). */
void rt_seq_shrink(rt_seq *s);

/* The forward pass on the CPU kernels (forward.c), as rt_device_ops.forward. */
int rt_cpu_forward(rt_model *m, rt_batch_entry *e, int n_entries, int n_tokens, int n_out);

#endif
