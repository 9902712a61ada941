/* Synthetic GGUF models for tests and benchmarks: random weights of any
 * shape and type, and a byte-level SentencePiece vocabulary, in any of the
 * architectures the runtime runs (`arch`: the tensors and keys llama.cpp's
 * converter writes for the family, MoE experts as 3D ffn_*_exps tensors).
 * The F32 weights depend only on the seed, the shape and the tensor's name,
 * so the F16, Q8_0 and Q4_0 files of one seed are quantizations of the same
 * model. */
#ifndef RT_MODEL_GEN_H
#define RT_MODEL_GEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct rt_gen_params {
    int dim, layers, heads, kv_heads, ffn, vocab, ctx;
    uint32_t type; /* kn_type of the weight matrices (norms stay F32) */
    uint64_t seed;
    bool tied; /* no output.weight: reuse the embeddings */
    float rope_base;
    const char *rope_scaling;  /* rope.scaling.type ("linear"), or NULL for none */
    float rope_scaling_factor; /* > 0: rope.scaling.factor */
    const float *rope_freqs;   /* head_dim / 2 factors for rope_freqs.weight, or NULL */
    const char *chat_template; /* tokenizer.chat_template, or NULL */
    const char *arch;          /* rt_gen_arch_names(); NULL: llama ("mixtral" is llama with experts) */
    int experts, experts_used; /* > 0: experts per MoE layer and used per token (0: the arch's, 8 and 2) */
    int swa;                   /* > 0: attention.sliding_window (0: the family's usual) */
    float attn_softcap, final_softcap; /* > 0: the soft-caps of a family that has them (0: the family's) */
} rt_gen_params;

/* The --arch names, ", "-separated. */
const char *rt_gen_arch_names(void);

void rt_gen_params_default(rt_gen_params *p);
/* Writes the model to path. 0, -EINVAL (bad shape, err says which), -ENOMEM
 * or -errno from writing. */
int rt_model_gen(const rt_gen_params *p, const char *path, char *err, size_t err_len);

#endif
