/* A decoder-only transformer loaded from a memory-mapped GGUF file, its
 * paged KV cache, and the batched forward pass continuous batching needs:
 * one call runs a batch of sequences, each with its own number of new
 * tokens (a prefill chunk for one, one decode token for another).
 *
 * Architectures (runtime/arch.c's table): llama (also Mistral, TinyLlama
 * and Mixtral's experts), mistral, mistral3, qwen2, qwen3, qwen3moe, gemma2,
 * gemma3, phi3, gpt-oss, granite, granitemoe, olmo2, smollm3.
 * Hyper-parameters come from `<arch>.*` keys, read as llama.cpp reads them
 * (a key a family leaves at 0 is unset). Every tensor of a file is used or
 * the load fails naming it. */
#ifndef RT_MODEL_H
#define RT_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kn.h"

typedef struct rt_gguf rt_gguf;
typedef struct rt_tokenizer rt_tokenizer;
typedef struct rt_model rt_model;

/* RoPE scaling (<arch>.rope.scaling.type). */
typedef enum rt_rope_scaling {
    RT_ROPE_SCALING_NONE = 0,
    RT_ROPE_SCALING_LINEAR,   /* positions count 1 / factor each */
    RT_ROPE_SCALING_YARN,     /* YaRN: per-dimension blend of linear and none, and a magnitude factor */
    RT_ROPE_SCALING_LONGROPE, /* Phi-3: rope_factors_long / _short by the sequence's context */
} rt_rope_scaling;

typedef struct rt_hparams {
    char arch[32];
    int n_ctx_train; /* <arch>.context_length */
    int n_embd;
    int n_layer;
    int n_head;
    int n_head_kv;
    int head_dim;
    int n_ff;
    int n_vocab;
    int n_rot;            /* rotary dims per head */
    float rope_freq_base; /* default 10000 */
    float rope_scale;     /* linear RoPE scaling: positions count 1/rope_scale each (1: none) */
    float norm_eps;       /* RMSNorm epsilon */
    bool rope_neox;
    bool tied_output; /* no output.weight: the embedding matrix is reused */

    rt_rope_scaling rope_scaling;
    int n_ctx_orig;         /* rope.scaling.original_context_length (YaRN, LongRoPE) */
    float rope_attn_factor; /* rope.scaling.attn_factor: Q and K magnitude (1: none) */
    float yarn_beta_fast, yarn_beta_slow, yarn_log_mul;
    float rope_freq_base_swa; /* sliding layers' base (their scaling is none when it differs) */
    /* mixture of experts: 0 experts for a dense FFN */
    int n_expert, n_expert_used;
    int n_ff_exp;   /* expert_feed_forward_length (n_ff when absent) */
    int n_ff_shexp; /* shared expert's length, 0: none */
    /* sliding-window attention: n_swa positions (0: none) on the layers
     * the family's pattern names */
    int n_swa;
    float attn_softcap, final_softcap; /* 0: none */
    float attn_scale;                  /* of q.k, usually 1/sqrt(head_dim) */
    float embd_scale;                  /* embeddings times this (1: none) */
    float residual_scale;              /* blocks' outputs times this before the residual add (1: none) */
    float logit_scale;                 /* logits divided by this (1: none) */
} rt_hparams;

typedef struct rt_model_opts {
    int n_threads;   /* <= 0: kn_usable_cpus() */
    bool reference;  /* scalar reference kernels (numerical checks) */
    const char *device; /* "cpu" (default) or "cuda" */
} rt_model_opts;

/* 0; -EINVAL for a file that is not a usable model (err names the key or
 * tensor, and the byte offset where the GGUF reader has one, but not the
 * path, which the caller says; a file with tensor types this build does not
 * read is refused with every such type named and its tensor count); -ENOMEM;
 * -errno for I/O. With device "cuda": the weights go to the first device
 * CUDA_VISIBLE_DEVICES shows, once, and every forward pass runs there;
 * -ENODEV ("no CUDA device: ...") when there is none or the build has no
 * CUDA, -ENOSPC when the weights do not fit (err gives both sizes). */
int rt_model_load(const char *path, const rt_model_opts *opts, rt_model **out, char *err, size_t err_len);
void rt_model_free(rt_model *m);

const rt_hparams *rt_model_hparams(const rt_model *m);
const rt_tokenizer *rt_model_tokenizer(const rt_model *m);
const rt_gguf *rt_model_gguf(const rt_model *m);
/* Bytes of all weight tensors. */
uint64_t rt_model_weight_bytes(const rt_model *m);
/* Bytes the forward pass reads per decoded token (every weight matrix once,
 * plus one embedding row): the bound for batch-1 decode. */
uint64_t rt_model_bytes_per_token(const rt_model *m);
/* KV cache bytes per token of context in a kv_type cache (0: a type no
 * cache holds; rt_kv_new says which the model's device can). */
size_t rt_model_kv_bytes_per_token(const rt_model *m, kn_type kv_type);
const char *rt_model_backend_name(const rt_model *m);
int rt_model_threads(const rt_model *m);

/* Where the forward pass runs. */
typedef struct rt_device_info {
    char kind[8];         /* "cpu" or "cuda" */
    char name[256];       /* device name; "" on the CPU */
    char uuid[96];        /* GPU-... or MIG-...; "" on the CPU */
    char mig_profile[32]; /* e.g. "1g.10gb"; "" when not a MIG instance */
    uint64_t mem_total, mem_free; /* device memory in bytes (free: now); 0 on the CPU */
    uint64_t mem_weights;         /* bytes the weights take on the device */
} rt_device_info;
void rt_model_device_info(const rt_model *m, rt_device_info *out);

/* Hyper-parameters and tensor shapes of a GGUF file, checked as the loader
 * checks them, without building a model (for `model inspect`). */
int rt_hparams_from_gguf(const rt_gguf *g, rt_hparams *hp, char *err, size_t err_len);

/* ---- paged KV cache ----
 * One pool of fixed-size blocks, each holding block_tokens positions of K
 * and V for every layer (for a group of layers, in a model with
 * sliding-window layers: see rt_kv_blocks_for). A sequence grows block by
 * block and gives its blocks back when freed; the blocks of sliding layers
 * that fell out of the window go back as it grows. Not thread-safe: one
 * thread drives a model. */
typedef struct rt_kv rt_kv;
typedef struct rt_seq rt_seq;

/* Pool of as many blocks as fit in `bytes` (at least one), holding kv_type
 * elements (rt_model_kv_bytes_per_token): KN_TYPE_F16, or KN_TYPE_Q8_0 on
 * the CPU when head_dim is a multiple of 32 (half the memory, and half the
 * bytes decode attention reads, for a small loss of precision). On a CUDA
 * model the pool is device memory, and a pool that does not fit what the
 * device has free is refused with both sizes in err. */
rt_kv *rt_kv_new(const rt_model *m, size_t bytes, int block_tokens, kn_type kv_type, char *err,
                 size_t err_len);
kn_type rt_kv_type(const rt_kv *kv);
void rt_kv_free(rt_kv *kv);
int rt_kv_blocks_total(const rt_kv *kv);
int rt_kv_blocks_free(const rt_kv *kv);
int rt_kv_block_tokens(const rt_kv *kv);
size_t rt_kv_block_bytes(const rt_kv *kv);
/* Blocks a new sequence takes for its first n_tokens positions (a model
 * with sliding-window layers keeps its blocks by groups of layers: a block
 * then holds fewer layers, and a position block takes one of each group). */
int rt_kv_blocks_for(const rt_kv *kv, int n_tokens);
/* The most positions one sequence could hold in the pool alone (sliding
 * layers keeping their window only): the pool's capacity in tokens. */
int64_t rt_kv_seq_tokens_max(const rt_kv *kv);

/* A sequence that may grow to max_tokens positions (<= context length). */
rt_seq *rt_seq_new(rt_kv *kv, int max_tokens);
void rt_seq_free(rt_seq *s);
int rt_seq_len(const rt_seq *s);
/* Blocks needed to grow by n more positions. */
int rt_seq_blocks_needed(const rt_seq *s, int n);
/* Blocks the sequence holds. */
int rt_seq_blocks(const rt_seq *s);

/* ---- prefix cache (kv_prefix.c) ----
 * Full blocks a sequence computed stay findable by their tokens (and the
 * blocks before them) after it ends, shared by reference count, and are
 * taken back least recently used first when the pool has no free block.
 * Off until enabled. */
/* 0; -ENOTSUP (sliding-window layers: no sequence keeps its prefix's whole
 * KV) or -ENOMEM, with why filled: the pool works on without a cache. */
int rt_kv_prefix_enable(rt_kv *kv, char *why, size_t why_len);
bool rt_kv_prefix_on(const rt_kv *kv);
/* Blocks in the cache (held by sequences or not), and of them those no
 * sequence holds (which rt_kv_blocks_free counts as free). */
int rt_kv_blocks_cached(const rt_kv *kv);
int rt_kv_blocks_evictable(const rt_kv *kv);
/* On a new, empty sequence: takes the longest run of cached blocks that
 * holds tokens[0, n) from the start, whole blocks only. Returns the
 * positions taken (the sequence's length now; 0 with the cache off). A
 * caller that needs logits computes at least the last token: n < prompt. */
int rt_seq_reuse_prefix(rt_seq *s, const int32_t *tokens, int n);
/* The positions rt_seq_reuse_prefix would take now for tokens[0, n) on a
 * sequence of unbounded capacity, taking nothing (estimates of a queue's
 * work); 0 with the cache off. */
int rt_kv_prefix_peek(const rt_kv *kv, const int32_t *tokens, int n);
/* Puts the sequence's full blocks not yet cached into the cache, after a
 * forward pass: tokens holds its first rt_seq_len tokens. */
void rt_seq_cache_blocks(rt_seq *s, const int32_t *tokens);
/* Blocks that freeing the sequence would give back to the pool (those no
 * other sequence shares). */
int rt_seq_blocks_freeable(const rt_seq *s);

/* One entry of a batch: n_tokens new tokens of seq, at positions
 * rt_seq_len(seq) onwards. When logits is not NULL it receives n_vocab
 * floats: the logits after the last of the new tokens. */
typedef struct rt_batch_entry {
    rt_seq *seq;
    const int32_t *tokens;
    int n_tokens;
    float *logits;
} rt_batch_entry;

/* Runs one forward pass over all entries; each seq advances by its
 * n_tokens. A seq appears at most once. Returns 0; -ENOSPC when the KV pool
 * cannot hold the new positions (nothing is changed); -E2BIG when a seq
 * would pass its max_tokens; -EINVAL for a token id out of range or an empty
 * entry; -ENOMEM. */
int rt_model_forward(rt_model *m, rt_batch_entry *entries, int n_entries);

/* The experts the last CPU forward pass chose at MoE layer `layer`: for
 * each of its tokens in batch order, n_expert_used expert indices, largest
 * weight first. Valid until the next forward pass; NULL for a dense layer
 * or before any pass (for tests and tools). */
const int32_t *rt_model_expert_choices(const rt_model *m, int layer);

/* Runs fn(arg, i) for i in [0, n) on the model's CPU threads, between
 * forward passes (sampling a batch's rows); fn must not call the model. */
void rt_model_parallel_for(rt_model *m, int n, void (*fn)(void *arg, int i), void *arg);

#endif
