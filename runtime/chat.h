/* Chat templates: turn OpenAI chat messages into a prompt string.
 *
 * Models carry a Jinja template in `tokenizer.chat_template`; we do not run
 * Jinja. Instead the template text is recognised (as llama.cpp does) as one
 * of the families below by marker substrings, and each family is rendered by
 * C code. A model with no template, or one we do not recognise, gets the
 * documented fallback: ChatML (`<|im_start|>role\ncontent<|im_end|>\n`...,
 * then `<|im_start|>assistant\n`). */
#ifndef RT_CHAT_H
#define RT_CHAT_H

#include "runtime/tokenizer.h"

#include <stdbool.h>
#include <stddef.h>

typedef enum rt_chat_kind {
    RT_CHAT_CHATML = 0,        /* also the fallback */
    RT_CHAT_LLAMA2,            /* [INST] <<SYS>> ... <</SYS>> ... [/INST] */
    RT_CHAT_LLAMA3,            /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
    RT_CHAT_MISTRAL,           /* [INST] ... [/INST], system folded into the first user turn (v0.1) */
    RT_CHAT_ZEPHYR,            /* <|role|>\ncontent</s>\n (Zephyr, TinyLlama-Chat) */
    RT_CHAT_MISTRAL_V1,        /* " [INST] ... [/INST]" (Mistral-Instruct v0.2's later template) */
    RT_CHAT_MISTRAL_V3,        /* "[INST] ...[/INST]", system in the last user turn (v0.3) */
    RT_CHAT_MISTRAL_V3_TEKKEN, /* "[INST]...[/INST]...</s>" (Mistral-Nemo) */
    RT_CHAT_MISTRAL_V7,        /* "[SYSTEM_PROMPT] ...[/SYSTEM_PROMPT][INST] ...[/INST]" (Large-2411) */
    RT_CHAT_MISTRAL_V7_TEKKEN, /* the same without the spaces (Small 3, 3.1) */
    RT_CHAT_LLAMA31,           /* Llama-3 after a system turn "Cutting Knowledge Date: ..." (3.1, 3.3) */
    RT_CHAT_LLAMA32,           /* the same, dated today (3.2) */
    RT_CHAT_QWEN3,             /* ChatML, assistant turns before the last user turn without their reasoning */
    RT_CHAT_QWEN3_THINKING,    /* the same, the answer opened with <think> (Qwen3 Thinking-2507) */
    RT_CHAT_N_KINDS
} rt_chat_kind;

typedef struct rt_chat_msg {
    const char *role; /* "system", "user", "assistant" (others rejected by the parser) */
    const char *content;
} rt_chat_msg;

/* Recognises a template; tmpl may be NULL (-> fallback). `recognised` is set
 * false when the fallback was used for a template that was present. */
rt_chat_kind rt_chat_detect(const char *tmpl, size_t len, bool *recognised);
/* The families' names (llama.cpp's), in rt_chat_kind order, for messages. */
#define RT_CHAT_KIND_NAMES                                                                                   \
    "chatml, llama2, llama3, mistral, zephyr, mistral-v1, mistral-v3, mistral-v3-tekken, mistral-v7, "       \
    "mistral-v7-tekken, llama3.1, llama3.2, qwen3, qwen3-thinking"
const char *rt_chat_kind_name(rt_chat_kind k);
/* The family of one of those names, or -1: how a config or the worker's
 * --chat-template overrides the model's own template. */
int rt_chat_kind_from_name(const char *name);

/* The text that ends an assistant turn in family k's prompts (ChatML's
 * <|im_end|>, Llama-3's <|eot_id|>; "</s>" for the families that end it
 * with EOS). A model whose vocabulary has no token of that text that ends
 * generation (a base model rendered as ChatML) gets it as a stop string. */
const char *rt_chat_turn_end(rt_chat_kind k);

/* What a request may ask of the template (vLLM's chat_template_kwargs). */
typedef struct rt_chat_opts {
    /* enable_thinking false: Qwen3's answer opens with an empty think
     * block, so the model answers without reasoning first (other
     * families, Qwen3's thinking-only models included, have no such
     * switch and ignore it) */
    bool no_thinking;
} rt_chat_opts;

/* Renders messages into a NUL-terminated prompt (malloc'd, *out), ending
 * with the assistant turn's opening so generation continues as the
 * assistant; opts may be NULL (the defaults). bos is the BOS token text (e.g. "<s>") where the family writes
 * it into the text. When content is not NULL, *content gets the spans of the prompt the messages' content
 * went to (malloc'd, *n_content of them, in order; NULL when none): the caller encodes with
 * rt_tokenizer_encode_spans, so special tokens written by the template
 * count and those written in a message do not, and without adding another
 * BOS. Returns 0, -EINVAL (no messages, or a role the family cannot place,
 * with err filled), -ENOMEM. */
int rt_chat_render(rt_chat_kind k, const rt_chat_msg *msgs, int n, const char *bos, const rt_chat_opts *opts,
                   char **out, rt_text_span **content, int *n_content, char *err, size_t err_len);

#endif
