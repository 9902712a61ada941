/* The model families the runtime runs, as data: for each GGUF
 * general.architecture, the features of its forward pass and the rules
 * llama.cpp's loader applies to it (which layers slide, which norms sit
 * where, how experts are weighted). The loader (model.c) reads a file's
 * keys and tensors by these rows and records what it found in the model's
 * hparams and layers; the forward pass (forward.c, moe.c) acts on those,
 * never on an architecture's name. Adding a family is adding a row, as long
 * as its features are among these. */
#ifndef RT_ARCH_H
#define RT_ARCH_H

#include <stdbool.h>
#include <stddef.h>

/* The FFN's gate activation. */
typedef enum rt_ffn_act {
    RT_ACT_SILU = 0,   /* silu(gate) * up */
    RT_ACT_GELU,       /* gelu(gate) * up, tanh approximation (Gemma) */
    RT_ACT_SWIGLU_OAI, /* gpt-oss's clamped SwiGLU (alpha 1.702, limit 7) */
} rt_ffn_act;

/* Normalisation of Q and K before RoPE. */
typedef enum rt_qk_norm {
    RT_QK_NORM_NONE = 0,
    RT_QK_NORM_HEAD, /* RMSNorm of each head, one gain of head_dim (Qwen3, Gemma 3) */
    RT_QK_NORM_ROW,  /* RMSNorm of the whole Q (K) row, gains of q_dim (kv_dim) (OLMo 2) */
} rt_qk_norm;

/* How the router's logits become the chosen experts' weights. */
typedef enum rt_gating {
    RT_GATING_SOFTMAX = 0,  /* softmax over all experts, then the top k (renormalised if MOE_NORM_W) */
    RT_GATING_SOFTMAX_TOPK, /* the top k logits, then a softmax over those k (gpt-oss) */
} rt_gating;

enum {
    RT_ARCH_ROPE_NEOX = 1u << 0,    /* RoPE pairs (i, i + n_rot/2) */
    RT_ARCH_EMBD_SQRT = 1u << 1,    /* embeddings times sqrt(n_embd) (Gemma) */
    RT_ARCH_NO_PRE_NORM = 1u << 2,  /* no attn_norm / ffn_norm before the blocks (OLMo 2) */
    RT_ARCH_POST_NORMS = 1u << 3,   /* post_attention_norm and post_ffw_norm on the blocks' outputs */
    RT_ARCH_SOFTCAP = 1u << 4,      /* attention and final logits soft-capped (Gemma 2) */
    RT_ARCH_GEMMA_QSCALE = 1u << 5, /* query scale 1/sqrt(n_embd/n_head) in the 27B shapes, else head_dim */
    RT_ARCH_GRANITE = 1u << 6,      /* embedding, residual, attention and logit multipliers */
    RT_ARCH_MOE_NORM_W = 1u << 7,   /* the chosen experts' weights renormalised to sum to 1 */
    RT_ARCH_MOE_ONLY = 1u << 8,     /* every layer's FFN is experts: expert_count is required */
    RT_ARCH_SINKS = 1u << 9,        /* attn_sinks: a per-head logit in every softmax (gpt-oss) */
    RT_ARCH_FUSED_UP = 1u << 10,    /* ffn_up holds gate then up, no ffn_gate (Phi-3) */
    RT_ARCH_ROPE_SWITCH = 1u << 11, /* RoPE only while rope.scaling.finetuned (default true) (Granite) */
    RT_ARCH_YARN_NO_MSCALE = 1u << 12, /* YaRN without its magnitude factor on Q and K (Mistral 3) */
};

typedef struct rt_arch {
    const char *name; /* general.architecture */
    unsigned flags;
    rt_ffn_act act;
    rt_qk_norm qk_norm;
    rt_gating gating;
    /* Sliding-window layers: with a window (the file's
     * attention.sliding_window, else swa_default; 0: none), layer l slides
     * when l % swa_pattern < swa_pattern - 1 (llama.cpp's set_swa_pattern;
     * pattern 1: every layer). 0: the family has none. */
    int swa_pattern;
    int swa_default;
    float swa_rope_base; /* > 0: sliding layers turn by this base, unscaled (Gemma 3) */
    int no_rope_every;   /* n > 0: layer l has no RoPE when (l + 1) % n == 0 (SmolLM3) */
    const char *ffn_norm; /* the pre-FFN norm's tensor name in a block: "ffn_norm" unless set */
    float attn_softcap, final_softcap; /* RT_ARCH_SOFTCAP's defaults where the keys are absent */
} rt_arch;

/* The row of an architecture name, or NULL. */
const rt_arch *rt_arch_find(const char *name);
/* The names of every row, ", "-separated, for an error message. */
void rt_arch_names(char *buf, size_t n);
/* A reason this build refuses a known architecture it does not run (a later
 * issue's), or NULL. */
const char *rt_arch_refusal(const char *name);

#endif
