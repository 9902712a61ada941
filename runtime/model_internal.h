/* Internals shared by model.c (loading), kv.c (paged KV cache), forward.c
 * (the batched forward pass) and the devices (device_cpu.c, the CUDA
 * plugin's forward_cuda.c; see device.h). Not a public header: a change to
 * these structs changes RT_DEVICE_ABI. */
#ifndef RT_MODEL_INTERNAL_H
#define RT_MODEL_INTERNAL_H

#include "kernels/kn.h"
#include "runtime/arch.h"
#include "runtime/model.h"

/* A weight matrix in the mapping: n_out rows of n_in elements. */
typedef struct rt_weight {
    const void *data;
    kn_type type;
    int n_in, n_out;
    uint64_t nbytes;
} rt_weight;

/* A layer's experts: views of the 3D ffn_*_exps tensors, one matrix each. */
typedef struct rt_experts {
    rt_weight router;                  /* ffn_gate_inp: n_expert rows */
    float *b_router;                   /* owned, optional (gpt-oss) */
    rt_weight *gate, *up, *down;       /* owned arrays of n_expert views */
    float *b_gate, *b_up, *b_down;     /* owned, n_expert rows of biases, optional (gpt-oss) */
    rt_weight sh_gate, sh_up, sh_down; /* a shared expert, all of every token's (data NULL: none) */
} rt_experts;

/* Which RoPE a layer turns Q and K by (rt_model.rope). */
enum { RT_ROPE_OFF = -1, RT_ROPE_MAIN = 0, RT_ROPE_LOCAL = 1, RT_ROPE_LONG = 2, RT_ROPE_SETS = 3 };

typedef struct rt_layer {
    rt_weight wq, wk, wv, wo, w_gate, w_up, w_down; /* w_gate..w_down: data NULL when moe */
    float *attn_norm, *ffn_norm; /* owned, n_embd; NULL where the family has none (olmo2) */
    float *bq, *bk, *bv;         /* owned, optional (qwen2) */
    /* owned and optional, as the file has them (every one it has is used) */
    float *bo, *b_gate, *b_up, *b_down;
    float *q_norm, *k_norm;               /* head_dim, or q_dim / kv_dim (RT_QK_NORM_ROW) */
    float *attn_post_norm, *ffn_post_norm; /* n_embd */
    float *sinks;                          /* n_head */
    rt_experts *moe;                       /* owned; NULL for a dense FFN */
    bool local;                            /* sliding-window attention (hp.n_swa) */
    int rope;                              /* RT_ROPE_MAIN, _LOCAL or _OFF */
} rt_layer;

/* One RoPE the layers turn by: angles pos * inv_freq[i], cos and sin then
 * times mscale (YaRN's magnitude, LongRoPE's attention factor). */
typedef struct rt_rope {
    double *inv_freq; /* owned, n_rot / 2; NULL: this set is not used */
    float mscale;
} rt_rope;

/* Activation buffers for a batch of up to `cap` tokens, grown on demand. */
typedef struct rt_act {
    int cap;
    float *x, *xb, *y, *q, *k, *v, *att, *hb, *hb2; /* y: a block's output, n_embd a row */
    int32_t *pos;
    float *moe_logits;  /* cap x n_expert router logits */
    int32_t *moe_pick;  /* cap x n_expert_used chosen experts */
    float *moe_w;       /* cap x n_expert_used their weights */
    int32_t *moe_rows;  /* rows grouped by expert: cap x n_expert_used */
    float *moe_x, *moe_h, *moe_h2, *moe_y; /* gathered rows of one expert */
    int32_t *moe_trace; /* n_layer x cap x n_expert_used: the last pass's choices */
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
    float *output_bias; /* owned, n_vocab, optional (Phi-3 files may have one) */
    rt_layer *layers;
    double *rope_inv_freq; /* n_rot / 2: what kn_rope turns positions by (rope[RT_ROPE_MAIN]'s) */
    const rt_arch *arch;
    rt_rope rope[RT_ROPE_SETS]; /* MAIN; LOCAL for sliding layers where it differs; LONG (LongRoPE) */
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
/* Layers are split into groups of the same number of layers, every group
 * all global or all sliding-window: a block holds block_tokens positions of
 * one group's layers, and a sequence has one block table per group. A
 * sliding group's table lets go of the blocks that fell out of the window
 * of every query to come. A model without sliding layers has one group of
 * all its layers: one table, blocks as before groups existed. */
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
    int n_groups, group_layers; /* groups of group_layers layers */
    int n_local_groups;         /* the sliding ones: groups [n_groups - n_local_groups, n_groups) */
    int window;                 /* hp.n_swa when there are sliding groups */
    int *layer_group, *layer_slot; /* per layer: its group, and its place in the group's block */
};

struct rt_seq {
    rt_kv *kv;
    int len;
    int max_tokens;
    int n_blocks;      /* blocks held, every group's */
    uint16_t **blocks; /* group g's table at blocks + g * cap (group 0's first: the one-group layout) */
    int cap;           /* ceil(max_tokens / block_tokens) entries per table */
    int n_pos;         /* position blocks the tables cover: entries [0, n_pos) */
    int local_from;    /* sliding tables hold entries [local_from, n_pos) */
    bool rope_long;    /* LongRoPE's long factors: max_tokens is past the original context */
};

/* Group g's table of seq s, and where layer l's K and V lie in its blocks
 * (in 16-bit units of a block). */
static inline uint16_t **rt_seq_table(const rt_seq *s, int g)
{
    return s->blocks + (size_t)g * s->cap;
}

/* Index of a block of kv's pool from its address (host or device). */
static inline int rt_kv_block_index(const rt_kv *kv, const uint16_t *blk)
{
    return (int)(((uintptr_t)blk - (uintptr_t)kv->pool) / kv->block_bytes);
}

void rt_act_dispose(rt_act *a);
/* forward.c's pieces that moe.c shares. */
int rt_grow_floats(float **p, size_t n);
int rt_matmul(rt_model *m, const rt_weight *w, const float *x, int n_rows, float *y);
int rt_matmul_shared(rt_model *m, const float *x, int n_rows, const rt_weight *const *w, float *const *y, int n);
void rt_add_rows_bias(float *x, const float *b, int n_rows, int n);
void rt_apply_act(rt_model *m, float *gate, const float *up, int T, int n);
/* y = down(act(gate(x) + b_gate) * (up(x) + b_up)) + b_down for T rows (biases
 * optional); uses act.hb and act.hb2. */
int rt_dense_ffn(rt_model *m, const rt_weight *w_gate, const rt_weight *w_up, const rt_weight *w_down,
                 const float *b_gate, const float *b_up, const float *b_down, const float *x, int T, float *y);
/* moe.c: buffers for a batch of T tokens (0 or -ENOMEM), and layer l's
 * experts over T rows of x into y. */
int rt_moe_reserve(rt_model *m, int T);
int rt_moe_ffn(rt_model *m, int l, const float *x, int T, float *y);
/* Takes blocks so that seq can hold len + n positions: 0 or -ENOSPC / -E2BIG
 * (nothing taken on failure). */
int rt_seq_grow(rt_seq *s, int n);
/* Returns blocks beyond what len positions need (undo of a grow). */
void rt_seq_shrink(rt_seq *s);

/* Where layer l's K and V rows lie: its group's table, and the offsets of
 * its K and V in a block, in 16-bit units. */
void rt_kv_layer_at(const rt_kv *kv, int l, int *group, size_t *k_off, size_t *v_off);

/* Builds r (rope_scaling.c): n_rot / 2 frequencies of base, scaled as
 * `scaling` with `factor` (linear, YaRN) and divided by `factors` (NULL:
 * none; rope_freqs.weight or LongRoPE's), and the magnitude of Q and K.
 * 0 or -ENOMEM. */
int rt_rope_build(rt_rope *r, const rt_hparams *hp, float base, rt_rope_scaling scaling, float factor,
                  const float *factors, bool yarn_no_mscale);

/* Every weight matrix of the model (experts' views included, the tied
 * output excepted), for a device to place: *out is malloc'ed, the count
 * returned, or -ENOMEM. */
int rt_model_matrices(rt_model *m, rt_weight ***out);

/* The forward pass on the CPU kernels (forward.c), as rt_device_ops.forward. */
int rt_cpu_forward(rt_model *m, rt_batch_entry *e, int n_entries, int n_tokens, int n_out);

#endif
