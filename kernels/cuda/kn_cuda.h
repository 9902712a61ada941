/* kernels/cuda: the CUDA backend of kernels/ — the operations of a llama
 * forward step on device buffers, behind a C API with no CUDA types in it.
 *
 * One kn_cuda context owns a device, a stream, a cuBLAS handle and the
 * scratch the operations need. Every operation is enqueued on the context's
 * stream and returns at once: pointers named d_* are device memory, and a
 * result is only visible to the host after kn_cuda_download or kn_cuda_sync.
 * Nothing here allocates on a hot path unless a bigger batch than ever
 * before arrives (the *_reserve calls take that cost up front).
 *
 * Weights are uploaded once, from GGUF block layout (kernels/quant_blocks.h),
 * into a device layout that splits each Q8_0/Q4_0 row into its quants (16
 * byte aligned, so a thread reads a half block or a whole Q4_0 block with
 * one 128-bit load) and its F16 block scales. The arithmetic is the scalar
 * reference's: activations are quantized per 32-block to Q8_0 exactly as
 * kn_quantize_row does, dots are exact integer sums per block times both
 * scales, so device and reference differ only in float summation order.
 *
 * Errors: functions return 0 or a negative errno code: -ENODEV (no usable
 * device or driver), -ENOMEM (device or pinned memory), -EINVAL (bad
 * arguments), -EIO (any other CUDA or cuBLAS failure). The failing call,
 * file and line are kept and returned by kn_cuda_error. Nothing aborts on a
 * runtime failure. Not thread-safe: one thread drives one context. */
#ifndef KN_CUDA_H
#define KN_CUDA_H

#include "kernels/kn.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kn_cuda kn_cuda;

typedef struct kn_cuda_info {
    int ordinal;          /* among the devices CUDA_VISIBLE_DEVICES shows */
    char name[256];       /* e.g. "NVIDIA H100 80GB HBM3" or "... MIG 1g.10gb" */
    char uuid[96];        /* "GPU-8f0c..." or, on a MIG instance, "MIG-..." */
    char mig_profile[32]; /* "1g.10gb", or "" when not a MIG instance */
    int cc_major, cc_minor, sm_count;
    uint64_t mem_total, mem_free; /* bytes, at the time of the query */
} kn_cuda_info;

/* Devices visible to this process. 0 with *count >= 1; -ENODEV with *count
 * = 0 and err saying why (no driver, no device, CUDA_VISIBLE_DEVICES hides
 * them all). */
int kn_cuda_device_count(int *count, char *err, size_t err_len);

/* A context on device `ordinal`: stream, cuBLAS handle (with a workspace of
 * its own, so that work can be captured in graphs). 0, -ENODEV, -ENOMEM or
 * -EIO with err filled. */
int kn_cuda_new(int ordinal, kn_cuda **out, char *err, size_t err_len);
void kn_cuda_free(kn_cuda *c);
/* Name, UUID, MIG profile, memory (free memory is queried now). */
int kn_cuda_get_info(kn_cuda *c, kn_cuda_info *out);
/* "file:line: call: reason" of the first failure since the last
 * kn_cuda_clear_error (the root cause of a chain), or "". */
const char *kn_cuda_error(const kn_cuda *c);
void kn_cuda_clear_error(kn_cuda *c);
/* Programmatic dependent launch: on sm_90 and newer each kernel may launch
 * while the one before it finishes, and streams its weights in meanwhile.
 * On by default there; INFERGATE_CUDA_PDL=0 in the environment turns it off
 * for new contexts. kn_cuda_set_pdl returns whether it is now on (never on
 * a device that lacks it). Graphs keep the setting they were recorded with. */
bool kn_cuda_set_pdl(kn_cuda *c, bool on);
/* Streaming multiprocessors of the context's device. */
int kn_cuda_sm_count(const kn_cuda *c);
/* Makes the context's device current for the calling thread: a thread
 * other than the creator calls this before its first operation. */
int kn_cuda_bind_thread(kn_cuda *c);
/* Free and total memory of device `ordinal`, without touching a context
 * (safe from a thread that does not drive it, e.g. for stats). 0 or -EIO. */
int kn_cuda_mem_info(int ordinal, uint64_t *free_bytes, uint64_t *total_bytes);
/* Changes whenever the context's internal scratch moves: graphs recorded
 * before the change point at freed memory and must not be replayed. */
uint64_t kn_cuda_scratch_generation(const kn_cuda *c);

/* Parses the MIG profile out of a device name ("NVIDIA A100-SXM4-40GB MIG
 * 1g.5gb" -> "1g.5gb"); "" when the name has none. Host-only. */
void kn_cuda_mig_profile_from_name(const char *name, char *out, size_t out_len);

/* ---- memory ---- */

int kn_cuda_alloc(kn_cuda *c, size_t bytes, void **d_out);
void kn_cuda_release(kn_cuda *c, void *d_ptr);
/* Page-locked host memory, for copies that overlap compute. */
int kn_cuda_host_alloc(kn_cuda *c, size_t bytes, void **out);
void kn_cuda_host_release(kn_cuda *c, void *p);
/* Host to device, returns when the copy is done. */
int kn_cuda_upload(kn_cuda *c, void *d_dst, const void *src, size_t bytes);
/* Host to device on the stream: src must stay unchanged until the next
 * kn_cuda_sync (page-locked src makes it truly asynchronous). */
int kn_cuda_upload_async(kn_cuda *c, void *d_dst, const void *src, size_t bytes);
/* Device to host after all enqueued work: returns when dst holds the data. */
int kn_cuda_download(kn_cuda *c, void *dst, const void *d_src, size_t bytes);
/* Device to host on the stream (dst page-locked); complete at the next sync. */
int kn_cuda_download_async(kn_cuda *c, void *dst, const void *d_src, size_t bytes);
int kn_cuda_copy_d2d(kn_cuda *c, void *d_dst, const void *d_src, size_t bytes);
int kn_cuda_memset(kn_cuda *c, void *d_dst, int value, size_t bytes);
/* Waits for everything enqueued; reports asynchronous kernel failures. */
int kn_cuda_sync(kn_cuda *c);
/* After a failed step: clears what a recoverable failure (an allocation, a
 * launch refused) leaves in CUDA's last error, which the next launch would
 * otherwise read as its own, and waits for the stream. -ENOTRECOVERABLE
 * when the context is lost to a sticky error (a fault in a kernel, an ECC
 * error, a GPU reset): every call fails from then on, and only a new
 * process gets a working context. */
int kn_cuda_recover(kn_cuda *c);

/* ---- CUDA graphs: record a sequence of operations once, replay it ---- */

typedef struct kn_cuda_graph kn_cuda_graph;
/* Starts recording the operations enqueued from now on (nothing runs). */
int kn_cuda_capture_begin(kn_cuda *c);
/* Ends recording; 0 with *out set, or an error (nothing is left recording,
 * and the operations recorded did not run: run them again without a graph). */
int kn_cuda_capture_end(kn_cuda *c, kn_cuda_graph **out);
int kn_cuda_graph_launch(kn_cuda *c, kn_cuda_graph *g);
void kn_cuda_graph_free(kn_cuda_graph *g);

/* ---- weights ---- */

typedef struct kn_cuda_weight {
    kn_type type;
    int n_out, n_in;
    void *d_q;       /* F32/F16 rows as in GGUF; Q8_0: int8 quants, n_in per row;
                      * Q4_0: nibbles, n_in / 2 bytes per row, GGUF order;
                      * the other types (kn_cuda_raw_layout): the GGUF rows */
    uint16_t *d_scl; /* Q8_0/Q4_0: F16 block scales, n_out x n_in / 32; else NULL */
    uint64_t bytes;  /* device bytes of both */
} kn_cuda_weight;

/* True for the types whose device layout is their GGUF rows as they are
 * (Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K..Q6_K, IQ4_XS, BF16, MXFP4; rows a multiple of
 * 32 elements): the matvec, the GEMM's dequantization and the embedding
 * decode their blocks where they lie (kn_cuda_blocks.cuh), against F32
 * activations. */
bool kn_cuda_raw_layout(kn_type type);
/* Device bytes of a weight (0 for an unsupported type or shape). */
uint64_t kn_cuda_weight_bytes(kn_type type, int n_out, int n_in);
/* Uploads n_out rows of n_in elements in GGUF layout. 0, -EINVAL (type or
 * shape), -ENOMEM, -EIO. On failure *w holds nothing. Weights are read-only
 * from then on: matvec kernels start reading them before the kernel ahead of
 * them has finished (programmatic dependent launch). */
int kn_cuda_weight_upload(kn_cuda *c, const void *gguf_rows, kn_type type, int n_out, int n_in,
                          kn_cuda_weight *w);
void kn_cuda_weight_release(kn_cuda *c, kn_cuda_weight *w);

/* Host-side device layout of n_rows GGUF rows of a quantized type: quants
 * to q (n_in or n_in / 2 bytes per row) and scales to scl (n_in / 32 per
 * row). Exposed for the tests. Returns 0 or -EINVAL. */
int kn_cuda_repack_rows(kn_type type, const void *gguf_rows, int n_rows, int n_in, void *q, uint16_t *scl);

/* ---- activations quantized to Q8_0 ----
 * Layout of an xq buffer for n_rows rows of n (a multiple of 32): the int8
 * quants, n per row, then at kn_cuda_q8_meta_offset one (float d, int32 sum)
 * pair per block, n / 32 per row: d is the block scale rounded to F16 as
 * the reference stores it, sum the sum of the block's quants (Q4_0 dots use
 * it to take the 8 offset out after the integer dot). */
size_t kn_cuda_q8_bytes(int n_rows, int n);
size_t kn_cuda_q8_meta_offset(int n_rows, int n);
int kn_cuda_quantize_q8(kn_cuda *c, const float *d_x, int n_rows, int n, void *d_xq);

/* ---- matrix multiplication ----
 * d_y[r * n_out + o] (+)= dot(W_o, x_r) for r < n_rows.
 * Up to KN_CUDA_MMV_MAX_ROWS rows: a fused dequantize-and-dot kernel that
 * reads every weight byte once (quantized weights take the Q8_0 activations
 * d_xq, which the caller makes once for all matrices that read the same x;
 * NULL: made here in scratch). More rows: the weights are dequantized to F16
 * a tile at a time and multiplied with cublasGemmEx (F16 in, F32 out and
 * accumulation; F32 weights use an F32 GEMM). add: accumulate into d_y (the
 * residual connection). 0, -EINVAL, -ENOMEM (scratch), -EIO. */
#define KN_CUDA_MMV_MAX_ROWS 8
bool kn_cuda_matmul_wants_q8(kn_type type, int n_rows);
int kn_cuda_matmul(kn_cuda *c, const kn_cuda_weight *w, const float *d_x, const void *d_xq, int n_rows,
                   float *d_y, bool add);
/* Grows the scratch kn_cuda_matmul needs for n_rows rows of a weight of this
 * shape, so that later calls (and graph capture) allocate nothing. */
int kn_cuda_matmul_reserve(kn_cuda *c, kn_type type, int n_out, int n_in, int n_rows);

/* ---- row-wise operations (rows of n floats, contiguous) ---- */

/* y = x / rms(x) * g; y may be x. */
int kn_cuda_rmsnorm(kn_cuda *c, float *d_y, const float *d_x, const float *d_g, int n_rows, int n, float eps);
int kn_cuda_softmax(kn_cuda *c, float *d_x, int n_rows, int n);
/* gate = silu(gate) * up */
int kn_cuda_silu_mul(kn_cuda *c, float *d_gate, const float *d_up, int n_rows, int n);
/* The same, and when d_xq is not NULL the result also quantized into d_xq
 * (n a multiple of 32), bit for bit as kn_cuda_quantize_q8 would: one kernel
 * where the decode path would launch two. */
int kn_cuda_rmsnorm_q8(kn_cuda *c, float *d_y, const float *d_x, const float *d_g, int n_rows, int n, float eps,
                       void *d_xq);
int kn_cuda_silu_mul_q8(kn_cuda *c, float *d_gate, const float *d_up, int n_rows, int n, void *d_xq);
/* The FFN gates of kernels/kn_ctx.c: gate = act(gate) * up. */
typedef enum kn_cuda_act {
    KN_CUDA_ACT_SILU = 0,
    KN_CUDA_ACT_GELU,       /* tanh approximation, as kn_gelu_mul */
    KN_CUDA_ACT_SWIGLU_OAI, /* gpt-oss's clamped SwiGLU, as kn_swiglu_oai (alpha 1.702, limit 7) */
} kn_cuda_act;
/* As kn_cuda_silu_mul_q8 with the activation act. */
int kn_cuda_glu_q8(kn_cuda *c, kn_cuda_act act, float *d_gate, const float *d_up, int n_rows, int n, void *d_xq);
/* x = x * scale, then cap * tanh(x / cap) when cap > 0 (embedding and
 * residual multipliers, the logits' divisor and soft-cap). */
int kn_cuda_scale_softcap(kn_cuda *c, float *d_x, size_t n, float scale, float cap);
/* y += x, n floats */
int kn_cuda_add(kn_cuda *c, float *d_y, const float *d_x, size_t n);
/* x[r] += b for every row */
int kn_cuda_add_bias(kn_cuda *c, float *d_x, const float *d_b, int n_rows, int n);
/* dst[i] = src[rows[i]] for i < n_rows */
int kn_cuda_gather_rows(kn_cuda *c, float *d_dst, const float *d_src, const int32_t *d_rows, int n_rows,
                        int n);
/* x[t] = row tokens[t] of the embedding matrix, dequantized */
int kn_cuda_embed(kn_cuda *c, const kn_cuda_weight *emb, const int32_t *d_tokens, int n_tokens, float *d_x);

/* RoPE as kn_rope_ref: the angles of each row's position are computed once
 * per step in double (as the CPU does) into a table d_cs of n_rows x rope_dim
 * floats (cos, sin per pair), which every layer's Q and K then use. */
int kn_cuda_rope_table(kn_cuda *c, const int32_t *d_pos, int n_rows, int rope_dim, float freq_base,
                       float *d_cs);
int kn_cuda_rope(kn_cuda *c, float *d_x, const float *d_cs, int n_rows, int n_heads, int head_dim,
                 int rope_dim, bool neox);
/* The table of a RoPE given as its host-built inverse frequencies (runtime's
 * rt_rope: scaled, with rope_freqs factors, in double, rope_dim / 2 of
 * them): angle pos * inv[i] in double, cos and sin then times mscale. With
 * d_alt (per row, 0 or 1) rows whose flag is 1 turn by inv_alt and
 * mscale_alt instead (LongRoPE's long factors for some sequences). */
int kn_cuda_rope_table_freqs(kn_cuda *c, const int32_t *d_pos, const int32_t *d_alt, int n_rows, int rope_dim,
                             const double *d_inv, float mscale, const double *d_inv_alt, float mscale_alt,
                             float *d_cs);

/* RoPE of a step's Q (in place) and K, and the store of its K and V rows
 * into the cache, in one launch: the same numbers as kn_cuda_rope on d_q and
 * on a copy of d_k followed by kn_cuda_kv_store (d_k itself is not
 * changed). Layout and slots as for kn_cuda_kv_store below. */
typedef struct kn_cuda_rope_kv {
    float *d_q;
    const float *d_k, *d_v, *d_cs; /* d_cs: kn_cuda_rope_table of rope_dim */
    int n_tokens, n_head, n_kv_head, head_dim, rope_dim;
    bool neox;
    const int32_t *d_slots;
    uint16_t *d_pool;
    size_t block_elems, k_off, v_off;
    int block_tokens;
} kn_cuda_rope_kv;
int kn_cuda_rope_kv_store(kn_cuda *c, const kn_cuda_rope_kv *a);

/* ---- paged KV cache in F16 and attention ----
 * The pool is blocks of block_elems halves; within a block, one layer's K
 * rows are at k_off + slot * kv_dim and its V rows at v_off + slot * kv_dim
 * (halves; token-major, where the CPU cache is head-major). Token t of a step is stored at
 * slots[t] = block * block_tokens + slot in block. */
int kn_cuda_kv_store(kn_cuda *c, const float *d_k, const float *d_v, int n_tokens, int kv_dim,
                     const int32_t *d_slots, uint16_t *d_pool, size_t block_elems, size_t k_off, size_t v_off,
                     int block_tokens);

typedef struct kn_cuda_attn {
    const float *d_q; /* n_tokens rows of n_head * head_dim */
    float *d_out;     /* same shape; may not alias d_q */
    int n_tokens;
    const int32_t *d_pos;       /* per token: its position; it sees [0, pos] */
    const int32_t *d_tok_seq;   /* per token: its sequence */
    const int32_t *d_table_off; /* per sequence: where its block table starts in d_tables */
    const int32_t *d_tables;    /* block ids */
    const uint16_t *d_pool;
    size_t block_elems, k_off, v_off; /* halves */
    int block_tokens;
    int n_head, n_kv_head, head_dim; /* head_dim even, at most 256 */
    float scale;
    /* Optional, 0 / NULL for none: a sliding window (a token at pos sees
     * [pos - window + 1, pos]: the table entries below it are never read),
     * a soft-cap of the scaled scores (cap * tanh(s / cap)), and a logit
     * per head that takes part in every softmax without a value (sinks). */
    int window;
    float softcap;
    const float *d_sinks;
} kn_cuda_attn;

/* Causal attention of each token over its sequence's cache, prefill chunks
 * and single-token decode alike; grouped-query heads share their KV head.
 * Short batches split each sequence's keys over several blocks and combine
 * the parts (flash-decoding), so one token still fills the device. */
int kn_cuda_attention(kn_cuda *c, const kn_cuda_attn *a);
int kn_cuda_attention_reserve(kn_cuda *c, int n_tokens, int n_head, int head_dim);

/* ---- mixture of experts ----
 * A step's experts are chosen on the device, so that a recorded step stays
 * valid whatever the router picks: route, group the (token, slot) pairs by
 * expert, multiply each expert's rows together, and sum back per token. */

/* Per token: the k experts of its n router logits and their weights,
 * exactly as kernels/kn_moe_route.h (the CPU's code). n <= 256. */
int kn_cuda_moe_route(kn_cuda *c, const float *d_logits, int n_tokens, int n_expert, int k, bool softmax_topk,
                      bool norm_w, int32_t *d_pick, float *d_w);
/* The n_pairs entries of d_pick (token * k + slot) grouped by expert, in
 * pair order within an expert: d_off (n_expert + 1) where each expert's
 * group starts, d_rows[g] the pair at grouped place g, d_inv[pair] its
 * place. */
int kn_cuda_moe_group(kn_cuda *c, const int32_t *d_pick, int n_pairs, int n_expert, int32_t *d_off,
                      int32_t *d_rows, int32_t *d_inv);
/* Grouped products: w holds n_expert matrices of w->n_out / n_expert rows
 * one after the other (a 3D ffn_*_exps tensor); grouped row g, of expert e,
 * gets d_y[g] = W_e . x + d_bias[e] (d_bias optional, n_out / n_expert per
 * expert), where x is row d_rows[g] / x_div of d_x (x_div > 0: the token
 * of a pair) or row g itself (x_div 0). Each expert's weights are read for
 * its rows together; an expert no row chose is not read. F32 activations. */
int kn_cuda_moe_matmul(kn_cuda *c, const kn_cuda_weight *w, int n_expert, const float *d_x, int x_div,
                       const int32_t *d_rows, const int32_t *d_off, const float *d_bias, float *d_y);
/* d_y[t] += sum over slots j of d_w[t * k + j] * d_ye[d_inv[t * k + j]], rows of n. */
int kn_cuda_moe_combine(kn_cuda *c, float *d_y, const float *d_ye, const float *d_w, const int32_t *d_inv,
                        int n_tokens, int k, int n);

#ifdef __cplusplus
}
#endif

#endif
