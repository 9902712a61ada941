/* Synthetic llama-family GGUF models for tests and benchmarks: random
 * weights of any shape and type, and a byte-level SentencePiece vocabulary.
 * The F32 weights depend only on the seed and the shape, so the F16, Q8_0
 * and Q4_0 files of one seed are quantizations of the same model. */
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
} rt_gen_params;

void rt_gen_params_default(rt_gen_params *p);
/* Writes the model to path. 0, -EINVAL (bad shape, err says which), -ENOMEM
 * or -errno from writing. */
int rt_model_gen(const rt_gen_params *p, const char *path, char *err, size_t err_len);

#endif
