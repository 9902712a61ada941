/* The architecture table (see arch.h). Each row's values are llama.cpp's
 * for the family: its RoPE type, its load_hparams defaults (sliding-window
 * patterns, Gemma 3's local RoPE base) and its graph's choices (norm
 * placement, activation, expert weighting). */
#include "runtime/arch.h"

#include <stddef.h>
#include <string.h>

#define NEOX RT_ARCH_ROPE_NEOX

static const rt_arch archs[] = {
    /* llama also carries Mixtral (experts in a llama file) */
    {.name = "llama", .flags = RT_ARCH_MOE_NORM_W},
    {.name = "mistral", .flags = RT_ARCH_MOE_NORM_W},
    {.name = "mistral3", .flags = RT_ARCH_MOE_NORM_W | RT_ARCH_YARN_NO_MSCALE},
    {.name = "qwen2", .flags = NEOX},
    {.name = "qwen3", .flags = NEOX, .qk_norm = RT_QK_NORM_HEAD},
    {.name = "qwen3moe", .flags = NEOX | RT_ARCH_MOE_ONLY | RT_ARCH_MOE_NORM_W, .qk_norm = RT_QK_NORM_HEAD},
    {.name = "gemma2",
     .flags = NEOX | RT_ARCH_EMBD_SQRT | RT_ARCH_POST_NORMS | RT_ARCH_SOFTCAP | RT_ARCH_GEMMA_QSCALE,
     .act = RT_ACT_GELU,
     .swa_pattern = 2,
     .swa_default = 4096,
     .attn_softcap = 50.0f,
     .final_softcap = 30.0f},
    {.name = "gemma3",
     .flags = NEOX | RT_ARCH_EMBD_SQRT | RT_ARCH_POST_NORMS | RT_ARCH_GEMMA_QSCALE,
     .act = RT_ACT_GELU,
     .qk_norm = RT_QK_NORM_HEAD,
     .swa_pattern = 6,
     .swa_rope_base = 10000.0f},
    /* llama.cpp turns Phi-3's window off (its converters wrote it for a
     * pattern they did not record); the issue asks for it where set: every
     * layer slides by the file's window */
    {.name = "phi3", .flags = NEOX | RT_ARCH_FUSED_UP, .swa_pattern = 1},
    {.name = "gpt-oss",
     .flags = NEOX | RT_ARCH_MOE_ONLY | RT_ARCH_SINKS,
     .act = RT_ACT_SWIGLU_OAI,
     .gating = RT_GATING_SOFTMAX_TOPK,
     .swa_pattern = 2,
     .ffn_norm = "post_attention_norm"},
    {.name = "granite", .flags = RT_ARCH_GRANITE | RT_ARCH_ROPE_SWITCH | RT_ARCH_MOE_NORM_W},
    {.name = "granitemoe",
     .flags = RT_ARCH_GRANITE | RT_ARCH_ROPE_SWITCH | RT_ARCH_MOE_ONLY | RT_ARCH_MOE_NORM_W},
    {.name = "olmo2", .flags = NEOX | RT_ARCH_NO_PRE_NORM | RT_ARCH_POST_NORMS, .qk_norm = RT_QK_NORM_ROW},
    {.name = "smollm3", .no_rope_every = 4},
};

const rt_arch *rt_arch_find(const char *name)
{
    for (size_t i = 0; i < sizeof(archs) / sizeof(archs[0]); i++)
        if (strcmp(archs[i].name, name) == 0)
            return &archs[i];
    return NULL;
}

void rt_arch_names(char *buf, size_t n)
{
    if (!n)
        return;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof(archs) / sizeof(archs[0]); i++) {
        if (i)
            strncat(buf, ", ", n - strlen(buf) - 1);
        strncat(buf, archs[i].name, n - strlen(buf) - 1);
    }
}

const char *rt_arch_refusal(const char *name)
{
    if (strcmp(name, "deepseek2") == 0)
        return "DeepSeek's multi-head latent attention (deepseek2) is not supported yet";
    return NULL;
}
