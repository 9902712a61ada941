/* Quantizing a GGUF model file (`infergate model quantize`): llama.cpp's
 * file types (llama_ftype) by their quantize tool's names, the type its
 * rules give each tensor in such a file, and the conversion of a file with
 * F32, F16 or BF16 weights into one.
 *
 * The rules are llama.cpp's llama_tensor_get_type without an importance
 * matrix, for the architectures the runtime reads: a mixture keeps
 * the output matrix at Q6_K (Q8_0 where its rows are not whole blocks of
 * the file's type), bumps attn_v and ffn_down in the layers its rule picks
 * (Q4_K_M: Q6_K in the first and last eighth and every third layer between),
 * and leaves 1-D tensors, norms and MoE routers as they are; with 8 experts
 * attn_k and attn_v go to Q8_0 and attn_output to Q5_K in the small mixtures;
 * MXFP4_MOE puts the experts' 3-D tensors in MXFP4 and every other matrix in
 * Q8_0 (gpt-oss's downloads); a type whose block does not
 * divide a tensor's rows falls back as llama.cpp's does (Q4_K to Q5_0, Q5_K
 * to Q5_1, Q6_K to Q8_0, Q2_K and Q3_K to Q4_0, IQ4_XS to IQ4_NL, then F16).
 * The quantizers are the kernels' reference ones (kn_quantize_row), ggml's
 * algorithms, so a tensor comes out as llama.cpp's tool writes it. */
#ifndef RT_QUANTIZE_H
#define RT_QUANTIZE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kn.h"

/* llama.cpp's llama_ftype numbers of the mixtures this build writes; the
 * number goes in general.file_type. */
typedef enum rt_ftype {
    RT_FTYPE_F32 = 0,
    RT_FTYPE_F16 = 1,
    RT_FTYPE_Q4_0 = 2,
    RT_FTYPE_Q4_1 = 3,
    RT_FTYPE_Q8_0 = 7,
    RT_FTYPE_Q5_0 = 8,
    RT_FTYPE_Q5_1 = 9,
    RT_FTYPE_Q2_K = 10,
    RT_FTYPE_Q3_K_S = 11,
    RT_FTYPE_Q3_K_M = 12,
    RT_FTYPE_Q3_K_L = 13,
    RT_FTYPE_Q4_K_S = 14,
    RT_FTYPE_Q4_K_M = 15,
    RT_FTYPE_Q5_K_S = 16,
    RT_FTYPE_Q5_K_M = 17,
    RT_FTYPE_Q6_K = 18,
    RT_FTYPE_IQ4_NL = 25,
    RT_FTYPE_IQ4_XS = 30,
    RT_FTYPE_BF16 = 32,
    RT_FTYPE_MXFP4_MOE = 38,
} rt_ftype;

/* Parses a name of llama.cpp's quantize tool, case aside ("Q4_K_M", "q8_0",
 * and its aliases Q3_K, Q4_K, Q5_K for the _M mixtures): 0 or -1. */
int rt_ftype_from_name(const char *name, rt_ftype *out);
/* "Q4_K_M" ...; NULL for a number this build does not write. */
const char *rt_ftype_name(rt_ftype ft);
/* The names, comma-separated, for usage messages. */
const char *rt_ftype_names(void);
/* The type most of a file of this ftype is in (Q4_K for Q4_K_M). */
kn_type rt_ftype_base_type(rt_ftype ft);
/* The ftype whose base type is t, as a file of t throughout is labelled
 * (the _M mixture for a K-quant of three); -1 for none. */
int rt_ftype_of_type(kn_type t);

/* What the rules read of the model besides a tensor's own name and shape. */
typedef struct rt_quant_model {
    int n_layer;     /* <arch>.block_count */
    int n_gqa;       /* head_count / head_count_kv (1 if absent) */
    int n_expert;    /* <arch>.expert_count (0: a dense model) */
    bool has_output; /* an output.weight, else the embeddings are the output too */
    bool llama_70b;  /* llama with 80 layers and grouped-query attention */
} rt_quant_model;

/* The type tensor `name` of shape ne (n_dims dims, of type src) gets in a
 * file of ft: src itself where llama.cpp quantizes nothing (1-D tensors,
 * norms, names not ending "weight"); ft's base type throughout when pure,
 * else the mixture's rules; then the block-size fallbacks. Returns the type,
 * or -1 when no type fits its rows (llama.cpp refuses those too). */
int rt_quant_tensor_type(const rt_quant_model *qm, rt_ftype ft, bool pure, const char *name, uint32_t n_dims,
                         const int64_t *ne, kn_type src);

typedef struct rt_quant_opts {
    rt_ftype ftype;
    bool pure;     /* ftype's base type for every matrix (but the fallbacks) */
    int n_threads; /* <= 0: kn_usable_cpus() */
    /* Called before each tensor (i of n, its name and types) and once at
     * the end with i == n and name NULL; may be NULL. */
    void (*progress)(void *arg, int64_t i, int64_t n, const char *name, kn_type from, kn_type to);
    void *progress_arg;
} rt_quant_opts;

typedef struct rt_quant_stats {
    uint64_t bytes_in, bytes_out; /* tensor data */
    int64_t n_tensors, n_quantized, n_fallback;
} rt_quant_stats;

/* Writes `out`: `in`'s metadata, all of it (general.file_type set to the
 * ftype, general.quantization_version to 2), and its tensors in their order,
 * each converted to the type rt_quant_tensor_type gives it (one already of
 * that type copied as it is). Weights to quantize must be F32, F16 or BF16.
 * Holds the output's tensors in memory until the file is written. 0;
 * -EINVAL (err names the tensor), -ENOMEM, -errno from reading or writing;
 * err begins with the path it concerns. stats may be NULL. */
int rt_quantize_file(const char *in, const char *out, const rt_quant_opts *o, rt_quant_stats *stats,
                     char *err, size_t err_len);

#endif
