/* kernels: the quantized math of a llama-family forward pass, behind one
 * function table per backend (scalar reference, AVX2/FMA, later CUDA).
 *
 * Types follow ggml's numbering so GGUF tensor types map one to one. The
 * scalar reference (`kn_ops_ref`) is the oracle every faster path is tested
 * against. Nothing here knows about requests or models; nothing on a hot path
 * allocates (scratch lives in kn_ctx and grows only when a bigger batch than
 * ever before arrives). */
#ifndef KN_H
#define KN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus /* the CUDA kernels (kernels/cuda) call a few of these */
extern "C" {
#endif

typedef enum kn_type {
    KN_TYPE_F32 = 0,
    KN_TYPE_F16 = 1,
    KN_TYPE_Q4_0 = 2,
    KN_TYPE_Q4_1 = 3,
    KN_TYPE_Q5_0 = 6,
    KN_TYPE_Q5_1 = 7,
    KN_TYPE_Q8_0 = 8,
    KN_TYPE_Q2_K = 10,
    KN_TYPE_Q3_K = 11,
    KN_TYPE_Q4_K = 12,
    KN_TYPE_Q5_K = 13,
    KN_TYPE_Q6_K = 14,
    KN_TYPE_Q8_K = 15, /* the K-quants' activations; never a weight */
    KN_TYPE_IQ4_NL = 20,
    KN_TYPE_IQ4_XS = 23,
    KN_TYPE_BF16 = 30,
    KN_TYPE_MXFP4 = 39, /* OCP microscaling FP4: gpt-oss's experts */
} kn_type;
/* One past the largest number above: the size of per-type tables. */
#define KN_TYPE_COUNT 40

/* A weight type repacked in memory for a backend's packed gemm
 * (kn_ops.gemm_packed, kn_pack): the file type with this bit set. Never in
 * a file, so neither kn_type_supported nor kn_row_bytes knows one, and
 * outside the enum so that switches over file types need not name them.
 * KN_TYPE_Q8_0_P16 and KN_TYPE_Q4_0_P16 are two of them, named for the
 * gemms that came first (kn_pack_q8_0, kn_pack_q4_0). */
#define KN_TYPE_PACKED_BIT 0x100
#define KN_TYPE_Q8_0_P16 ((kn_type)0x108)
#define KN_TYPE_Q4_0_P16 ((kn_type)0x102)
static inline kn_type kn_packed_type(kn_type t)
{
    return (kn_type)(KN_TYPE_PACKED_BIT | (unsigned)t);
}
static inline bool kn_type_packed(kn_type t)
{
    return ((unsigned)t & ~0xffu) == KN_TYPE_PACKED_BIT;
}
/* The file type a packed one was made from; any other as it is. */
static inline kn_type kn_unpacked_type(kn_type t)
{
    return kn_type_packed(t) ? (kn_type)(t & 0xff) : t;
}

/* What a tensor type is, as ggml's type traits are: its block, the format
 * its dot and gemm take the activations in, and its reference conversions.
 * Callers look a type up here instead of naming types one by one. */
typedef struct kn_type_traits {
    const char *name;    /* ggml's: "f32", "q4_0", "q4_K", "iq4_xs", "bf16" ... */
    int64_t block_elems; /* 1 for the float types */
    size_t block_bytes;
    /* The activations' format for a weight of this type: Q8_0 for the
     * 32-element types (Q4_1 and Q5_1 too: where ggml takes Q8_1, whose
     * block carries d * sum(q) rounded to a half, the dots here take the
     * exact integer sum of the Q8_0 block's quants instead), Q8_K for the
     * K-quants and IQ4_XS, F32 for F32 and F16 weights, BF16 for BF16. */
    kn_type vec_dot_type;
    /* Reference conversions of n elements (n a multiple of block_elems).
     * quantize_row is ggml's reference quantizer without an importance
     * matrix (llama.cpp's quantize tool's choice then). */
    void (*dequantize_row)(const void *x, float *y, int64_t n);
    void (*quantize_row)(const float *x, void *y, int64_t n);
} kn_type_traits;

/* The traits of a ggml type number this build knows, or NULL. */
const kn_type_traits *kn_type_traits_of(uint32_t type);

/* True for the tensor types the runtime loads from a model file: every type
 * kn_type_traits_of knows but Q8_K (activations only, never a weight). */
bool kn_type_supported(uint32_t type);
/* ggml's enum name of any type number ggml has given ("IQ2_XXS", "Q4_K",
 * "MXFP4"; removed ones too), whether this build knows the type or not; NULL
 * for a number ggml never gave (as of Q2_0 = 42). For messages. */
const char *kn_ggml_type_name(uint32_t type);
/* ggml's name of a type kn_type_traits_of knows ("q8_0", "q4_K"), or NULL. */
const char *kn_type_name(uint32_t type);
/* Parses a name as above, case aside ("Q4_K" too); returns 0 or -1. */
int kn_type_from_name(const char *name, kn_type *out);
/* Elements per block (1 for F32/F16/BF16, 32 for Q8_0, 256 for Q4_K); 0 if
 * unknown. */
int64_t kn_type_block_elems(uint32_t type);
/* Bytes per block; 0 if unknown. */
size_t kn_type_block_bytes(uint32_t type);
/* Bytes of a row of n elements; 0 if unknown or n is not a multiple of
 * the block size. */
size_t kn_row_bytes(uint32_t type, int64_t n);

float kn_fp16_to_fp32(uint16_t h);
uint16_t kn_fp32_to_fp16(float f); /* round to nearest even */
/* bfloat16: the top half of a float. The conversion rounds to nearest even
 * and keeps a NaN a (quiet) NaN, as ggml's does. */
static inline float kn_bf16_to_fp32(uint16_t h)
{
    union {
        uint32_t u;
        float f;
    } v = {.u = (uint32_t)h << 16};
    return v.f;
}
uint16_t kn_fp32_to_bf16(float f);

/* Q8_0 repacked for a backend's gemm_q8_0_p16. Rows go in groups of 16 (the
 * last padded with zero rows). A group holds first its n_in / 32 blocks'
 * scales, 16 halves a block, the run padded to whole cache lines, then their
 * quants: for each of a block's 8 quads, the 16 rows' 4 quants. One 64-byte
 * vector of a quad is a multiply-add of 16 rows against one broadcast dword
 * of activations, and a block's 8 quads are the B tile of an AMX int8
 * product as they lie. With the scales apart, every block's quants start
 * on a cache line where the group does (a tile load across lines cost the
 * AMX gemm 12%). Same bytes as the rows it packs when n_in / 32 is even. */
#define KN_P16_SCALE_BYTES 32  /* a block's 16 scales */
#define KN_P16_QUANT_BYTES 512 /* a block's 16 x 32 quants */
/* Q4_0 the same way, a block's quants being 4 quads of 16 rows' 4 bytes:
 * byte i of a Q4_0 block holds quants i (low nibble) and i + 16, so a quad's
 * low nibbles go with the activations' dword k and its high ones with dword
 * k + 4. */
#define KN_P16_Q4_QUANT_BYTES 256
/* Where a group of nb blocks has its quants, and its size. */
static inline size_t kn_p16_quants_at(int nb)
{
    return ((size_t)nb * KN_P16_SCALE_BYTES + 63) & ~(size_t)63;
}
static inline size_t kn_p16_group_bytes(int nb)
{
    return kn_p16_quants_at(nb) + (size_t)nb * KN_P16_QUANT_BYTES;
}
static inline size_t kn_p16_q4_group_bytes(int nb)
{
    return kn_p16_quants_at(nb) + (size_t)nb * KN_P16_Q4_QUANT_BYTES;
}
size_t kn_pack_q8_0_bytes(int n_out, int n_in);
void kn_pack_q8_0(const void *w, int n_out, int n_in, void *dst);
size_t kn_pack_q4_0_bytes(int n_out, int n_in);
void kn_pack_q4_0(const void *w, int n_out, int n_in, void *dst);

/* Every quantized weight type's packed layout, the generic entry: what a
 * model does at load for each matrix of type t whose CPU table has
 * gemm_packed[t]:
 *     dst = (n_out x n_in matrix, kn_pack_bytes(t, n_out, n_in) bytes);
 *     kn_pack(t, w, n_out, n_in, dst); then kn_matmul with kn_packed_type(t).
 * Rows go in groups of 16 (the last padded with zero rows), a group being
 * kn_pack_bytes(t, 16, n_in) bytes, a multiple of 64: the 16 rows' blocks
 * interleaved so that a 64-byte vector holds 4 quants of each of the 16
 * rows, with their scales unpacked to bytes or halves beside them (the
 * layouts are described in kn_pack.c). Q8_0 and Q4_0 as kn_pack_q8_0 and
 * kn_pack_q4_0. kn_pack_bytes is 0 for a type without a packed layout (the
 * float types) or sizes that are not whole blocks. */
size_t kn_pack_bytes(kn_type t, int n_out, int n_in);
void kn_pack(kn_type t, const void *w, int n_out, int n_in, void *dst);

/* Reference quantization of n elements (n a multiple of the block size),
 * through the type's traits; nothing for an unknown type. */
void kn_quantize_row(kn_type type, const float *x, void *y, int64_t n);
void kn_dequantize_row(kn_type type, const void *x, float *y, int64_t n);

/* ---- backend function table ---------------------------------------------
 * Row dot products of one weight row with activations, per weight type. The
 * activations come in the type's vec_dot_type (kn_type_traits): quantized
 * ones are first quantized (`quantize`), then dotted in integers per block
 * as ggml does, and the scalar reference does exactly the same arithmetic,
 * so fast and reference agree up to float summation order (or bit for bit,
 * where a fast path says so). n is always a multiple of the weight type's
 * block, any size for the float types; quantized rows start 2-byte aligned
 * (Q8_K activation rows 4-byte aligned: a block begins with its float). */
typedef void (*kn_quantize_fn)(const float *x, void *y, int n);
/* out[r] = dot(w, x_r) for r in [0, nr): one weight row against nr
 * activation rows, so a wide path can reuse the loaded weights. x_r is at
 * x + r * x_stride bytes. */
typedef void (*kn_dot_fn)(const void *w, const void *x, size_t x_stride, int nr, int n, float *out);
/* y[r * y_stride + o] = dot(w_o, x_r) for n_w weight rows (w_o at w + o *
 * w_stride bytes) and nr activation rows (x_r at x + r * x_stride bytes). */
typedef void (*kn_gemm_fn)(const void *w, size_t w_stride, int n_w, const void *x, size_t x_stride, int nr,
                           int n, float *y, size_t y_stride);
typedef void (*kn_gemm_p16_fn)(const void *w, int n_w, const void *xq, size_t xq_stride, int nr, int n,
                               float *y, size_t y_stride);

typedef struct kn_ops {
    const char *name;
    /* quantize[KN_TYPE_Q8_0], which the KV cache and attention use too. */
    kn_quantize_fn quantize_q8_0;
    /* Indexed by an activation type (a vec_dot_type): float rows into it.
     * Every table has Q8_0, Q8_K and BF16 (F32 activations need none). */
    kn_quantize_fn quantize[KN_TYPE_COUNT];
    /* Indexed by weight type: every table has a dot for every type
     * kn_type_traits_of knows (Q8_K aside, never a weight). */
    kn_dot_fn dot[KN_TYPE_COUNT];
    /* Optional, indexed by weight type (NULL: kn_matmul uses the dots):
     * when present, kn_matmul sends every matmul of the type here, from
     * decode's one row to prefill's many: a SIMD backend works on several
     * weight rows and activation rows at once, which the one-weight-row dots
     * cannot. Same arithmetic as the reference dots, and in the x86 backends
     * the same float rounding too for the types whose gemm says so (Q8_0,
     * Q4_0 and the others noted there), so a row's result has the same bits
     * whatever batch it is computed in. */
    kn_gemm_fn gemm[KN_TYPE_COUNT];
    /* y = x / rms(x) * g; y may alias x. */
    void (*rmsnorm)(float *y, const float *x, const float *g, int n, float eps);
    /* x = softmax(x) in place, numerically stable. */
    void (*softmax)(float *x, int n);
    /* gate = silu(gate) * up. */
    void (*silu_mul)(float *gate, const float *up, int n);
    /* The pieces of attention over an F16 KV cache; rows r < n of hd halves
     * at k + r * stride. kv_scores: out[r] = scale * dot(q, k_r).
     * kv_accum: acc[i] += sum_r w[r] * v_r[i]. */
    void (*kv_scores)(const float *q, const uint16_t *k, size_t stride, int n, int hd, float scale, float *out);
    void (*kv_accum)(float *acc, const float *w, const uint16_t *v, size_t stride, int n, int hd);
    /* Optional (NULL: the one-row calls twice): the same for two query rows
     * over the same K (V) rows, each row converted once for both, every
     * result bit for bit what the one-row call gives. Prompt rows over a
     * long cached context spent most of a step there, each converting the
     * K and V rows again. */
    void (*kv_scores2)(const float *q0, const float *q1, const uint16_t *k, size_t stride, int n, int hd,
                       float scale, float *out0, float *out1);
    void (*kv_accum2)(float *acc0, float *acc1, const float *w0, const float *w1, const uint16_t *v,
                      size_t stride, int n, int hd);
    /* kv_accum over a Q8_0 cache: rows of hd / 32 blocks, stride in bytes.
     * (A Q8_0 cache's scores are the quantized query against the K rows,
     * through gemm[KN_TYPE_Q8_0], or dot[KN_TYPE_Q8_0] in a table without
     * it.) */
    void (*kv_accum_q8_0)(float *acc, const float *w, const void *v, size_t stride, int n, int hd);
    /* y = x as IEEE halves, rounded to nearest even (kn_fp32_to_fp16). */
    void (*to_f16)(const float *x, uint16_t *y, int n);
    /* Optional: gemm[KN_TYPE_Q8_0] over rows packed by kn_pack_q8_0 (w at
     * the first of the n_w rows' groups), bit for bit the same results. A
     * model whose table has it packs its Q8_0 matrices once at load. */
    kn_gemm_p16_fn gemm_q8_0_p16;
    /* Optional: gemm[KN_TYPE_Q4_0] over rows packed by kn_pack_q4_0, the
     * same way. */
    kn_gemm_p16_fn gemm_q4_0_p16;
    /* Optional, indexed by weight (file) type: the gemm over rows packed by
     * kn_pack(t) (w at the first of the n_w rows' groups); where present, a
     * model packs its matrices of that type at load and multiplies with
     * kn_packed_type(t). [KN_TYPE_Q8_0] and [KN_TYPE_Q4_0] are the two
     * entries above. The others give every row the bits of the reference
     * dot (kn_ops_ref) whatever its batch. */
    kn_gemm_p16_fn gemm_packed[KN_TYPE_COUNT];
} kn_ops;

const kn_ops *kn_ops_ref(void);
/* The AVX2/FMA table when the CPU has AVX2, FMA and F16C, else NULL. */
const kn_ops *kn_ops_avx2(void);
/* The AVX2 table with its quantized dots on AVX-VNNI (vpdpbusd) when the CPU
 * also has AVX-VNNI, else NULL. */
const kn_ops *kn_ops_avxvnni(void);
/* The AVX2 (or AVX-VNNI) table with its quantized gemm on 512-bit vectors
 * when the CPU has AVX-512 F/BW/VL/VNNI and the OS saves the 512-bit state,
 * else NULL. Same results, bit for bit, as the other tables' gemm. */
const kn_ops *kn_ops_avx512vnni(void);
/* The AVX-512 VNNI table with its packed Q8_0 gemm on AMX tiles when the
 * CPU has AMX-INT8 and the kernel grants this process the tile state, else
 * NULL. Same results, bit for bit. */
const kn_ops *kn_ops_amx(void);
/* The fastest table this CPU runs. */
const kn_ops *kn_ops_best(void);

/* ---- execution context: backend table + thread pool + scratch ------------ */
typedef struct kn_ctx kn_ctx;

typedef enum kn_backend {
    KN_BACKEND_AUTO = 0, /* fastest for this CPU */
    KN_BACKEND_REF,      /* scalar reference, for checks */
    KN_BACKEND_AVX2,
    KN_BACKEND_AVXVNNI,
    KN_BACKEND_AVX512VNNI,
    KN_BACKEND_AMX,
} kn_backend;

/* n_threads <= 0 means kn_usable_cpus(). Returns NULL on failure (out of
 * memory, threads, or the backend not runnable here). */
kn_ctx *kn_ctx_new(int n_threads, kn_backend backend);
/* The CPUs this process may run on (its affinity: taskset, a cpuset), and
 * no more than its CPU quota's whole CPUs (a container's CPU limit). */
int kn_usable_cpus(void);
/* The CPU quota of the cgroups listed in self_cgroup (/proc/self/cgroup's
 * format), looked up under cgroup_root (/sys/fs/cgroup): v2's cpu.max or
 * v1's cpu.cfs_quota_us / cpu.cfs_period_us, the smallest on the way up
 * to the root, in whole CPUs (at least 1); 0 when there is none. */
int kn_cpu_quota(const char *cgroup_root, const char *self_cgroup);
void kn_ctx_free(kn_ctx *ctx);
int kn_ctx_threads(const kn_ctx *ctx);
const kn_ops *kn_ctx_ops(const kn_ctx *ctx);

/* Runs fn(arg, i) for i in [0, n) over the pool's threads; returns when all
 * are done. The calling thread works too. */
void kn_parallel_for(kn_ctx *ctx, int n, void (*fn)(void *arg, int i), void *arg);

/* y[r * n_out + o] = sum_i W[o][i] * x[r * n_in + i] for r < n_rows.
 * W is n_out rows of n_in elements of wtype in GGUF layout (row o starts at
 * w + o * kn_row_bytes(wtype, n_in)). Returns 0, or -ENOMEM when scratch for
 * a batch larger than any before cannot be had, -EINVAL for a bad type/size. */
int kn_matmul(kn_ctx *ctx, const void *w, kn_type wtype, int n_out, int n_in, const float *x, int n_rows,
              float *y);

/* Several products of one input: y_k[r * n_out_k + o] = sum_i W_k[o][i] *
 * x[r * n_in + i] for k < n_outs (at most KN_MM_MAX_OUTS), every W_k of
 * wtype. The input is quantized once and the weights' rows all go to the
 * threads as one job: cheaper than n_outs kn_matmul calls at a small batch
 * (Q, K and V; gate and up). Same results, bit for bit, as those calls. */
#define KN_MM_MAX_OUTS 4
typedef struct kn_mm_out {
    const void *w;
    int n_out;
    float *y;
} kn_mm_out;
int kn_matmul_n(kn_ctx *ctx, kn_type wtype, int n_in, const float *x, int n_rows, const kn_mm_out *outs,
                int n_outs);

/* Row-wise RMSNorm of n_rows rows of n elements; y may alias x. */
void kn_rmsnorm(kn_ctx *ctx, float *y, const float *x, const float *g, int n_rows, int n, float eps);
/* Row-wise gate = silu(gate) * up. */
void kn_silu_mul(kn_ctx *ctx, float *gate, const float *up, int n_rows, int n);
/* Row-wise gate = gelu(gate) * up, GELU in the tanh approximation ggml uses
 * (computed in float, where ggml's CPU path looks it up in a half-precision
 * table). Scalar in every backend: fast and reference agree bit for bit. */
void kn_gelu_mul(kn_ctx *ctx, float *gate, const float *up, int n_rows, int n);
/* Row-wise clamped SwiGLU of gpt-oss, as ggml's swiglu_oai: g = min(gate,
 * limit), u = clamp(up, -limit, limit), gate = g * sigmoid(alpha * g) *
 * (u + 1). Scalar in every backend. */
void kn_swiglu_oai(kn_ctx *ctx, float *gate, const float *up, int n_rows, int n, float alpha, float limit);

/* Rotary position embedding, in place, on n_rows rows of n_heads * head_dim.
 * Row r is at position pos[r]. Only the first rope_dim elements of each head
 * rotate. neox=false pairs (2i, 2i+1) (llama); neox=true pairs (i, i+rope_dim/2)
 * (GPT-NeoX, Qwen2). theta_i = pos * inv_freq[i], i < rope_dim / 2: the
 * model gives base^(-2i/rope_dim), divided by its file's frequency factors
 * and linear scaling (kn_rope_inv_freq). inv_freq must stay unchanged while
 * ctx may use it: kn_rope keeps its table of angles per (pointer, positions). */
void kn_rope(kn_ctx *ctx, float *x, int n_rows, const int32_t *pos, int n_heads, int head_dim, int rope_dim,
             const double *inv_freq, bool neox);
void kn_rope_ref(float *x, int n_rows, const int32_t *pos, int n_heads, int head_dim, int rope_dim,
                 const double *inv_freq, bool neox);
/* inv_freq[i] = base^(-2i/rope_dim) / scale / (factors ? factors[i] : 1) for
 * i < rope_dim / 2. */
void kn_rope_inv_freq(double *inv_freq, int rope_dim, float base, float scale, const float *factors);

/* Causal attention of one sequence's new tokens over its paged KV cache.
 * Query row j (at q + j * n_head * head_dim) sits at position pos0 + j and
 * sees positions [0, pos0 + j]. A block holds its K rows head by head: KV
 * head g's K row of position p is at blocks[p / block_tokens] + k_off +
 * (g * block_tokens + p % block_tokens) * row, V likewise with v_off, where
 * row is kn_kv_row_units(kv_type, head_dim). Head h reads KV head
 * h / (n_head / n_kv_head) (grouped-query attention).
 *
 * kv_type is KN_TYPE_F16 (IEEE halves) or KN_TYPE_Q8_0 (head_dim a multiple
 * of 32; half the bytes, which decode attention is bound by; the query is
 * quantized to Q8_0 for the scores, as ggml does for a quantized K). */
typedef struct kn_attn_seq {
    const float *q;
    float *out; /* n_q rows of n_head * head_dim; may alias q */
    int n_q;
    int pos0;
    uint16_t *const *blocks;
    size_t k_off, v_off; /* in 16-bit units, like row */
    int block_tokens;
    kn_type kv_type;
} kn_attn_seq;

/* 16-bit units of one head's K or V row of a kv_type cache: head_dim for
 * F16, 17 per 32 elements (a 34-byte block) for Q8_0; 0 if unsupported. */
size_t kn_kv_row_units(kn_type kv_type, int head_dim);

/* Returns 0 or -ENOMEM (score scratch for a longer context than before). */
int kn_attention(kn_ctx *ctx, const kn_attn_seq *seqs, int n_seqs, int n_head, int n_kv_head, int head_dim,
                 float scale);

/* The same with the variations of newer model families, every one off when
 * zero or NULL:
 *   softcap > 0: each (scaled) score s becomes softcap * tanh(s / softcap)
 *                before the softmax (Gemma 2);
 *   sinks:       one logit per query head that joins its softmax without a
 *                value row (gpt-oss's attention sinks): the weights then sum
 *                to less than one;
 *   window > 0:  the query at position p sees keys p - window + 1 .. p only
 *                (sliding-window layers); blocks wholly before the first
 *                row's window are never read, so a cache may have handed
 *                them back (their table entries are then not dereferenced). */
typedef struct kn_attn_params {
    int n_head, n_kv_head, head_dim;
    float scale;
    float softcap;
    const float *sinks;
    int window;
    /* Query rows of a sequence one work item takes together, each K and V
     * block read once for them all (0: the default). The same results
     * whatever it is; for benchmarks and tests. */
    int tile;
} kn_attn_params;
int kn_attention_ex(kn_ctx *ctx, const kn_attn_seq *seqs, int n_seqs, const kn_attn_params *p);

#ifdef __cplusplus
}
#endif

#endif
