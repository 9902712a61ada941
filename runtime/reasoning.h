/* A reasoning model's thinking, split from its answer: the text inside
 * <think>...</think> (Qwen3, QwQ, DeepSeek-R1 and its distills) goes to
 * the response's reasoning_content, what follows to content, as vLLM's
 * reasoning parsers give them. The answer may open the block itself, or
 * start inside it where the template's generation prompt opened it
 * (DeepSeek-R1's, Qwen3-Thinking's). Not done: gpt-oss's harmony channels.
 *
 * Threads: a splitter is one request's. */
#ifndef RT_REASONING_H
#define RT_REASONING_H

#include <stdbool.h>
#include <stddef.h>

/* Whether a chat template's text writes <think> blocks. */
bool rt_think_template(const char *tmpl, size_t len);
/* Whether a rendered prompt leaves the answer inside a <think> block (its
 * last marker opens one). */
bool rt_think_open(const char *prompt, size_t len);

typedef struct rt_think rt_think;

/* A splitter for an answer that starts inside the block (open) or may
 * open one at its start; NULL when out of memory. */
rt_think *rt_think_new(bool open);
void rt_think_free(rt_think *t);

/* Feeds the next piece of the answer (final: it ends with it): the
 * reasoning and the content that may go out now (owned by t, valid until
 * the next call); text that may be a marker's start is held back. 0, or
 * -ENOMEM (t is then unusable). */
int rt_think_feed(rt_think *t, const char *text, size_t len, bool final, const char **reasoning,
                  size_t *reasoning_len, const char **content, size_t *content_len);

#endif
