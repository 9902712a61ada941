/* gpt-oss's harmony format, read out of the model's answer: its messages
 * are `<|channel|>C [to=R] [<|constrain|>json]<|message|>BODY` ended by
 * <|end|>, <|call|> or <|return|>, the next one opened by
 * `<|start|>assistant`. The analysis channel (and a message to a built-in
 * tool such as browser.*) is reasoning, the final channel (and commentary
 * to no one, a preamble) is content, and a message to=functions.NAME is a
 * call of NAME with BODY as its arguments, as vLLM's harmony parser reads
 * them. An answer that does not open with a harmony header is all content.
 *
 * The markers are control tokens in gpt-oss's vocabulary: the engine lets
 * their text out for a harmony model (rt_tokenizer_keep_text), else this
 * sees none of them. A call's arguments are its body as written when that
 * is JSON, else {} (cut short). Threads: a parser is one request's. */
#ifndef RT_HARMONY_H
#define RT_HARMONY_H

#include "runtime/toolcall.h"

#include <stdbool.h>
#include <stddef.h>

/* Whether a chat template's text writes harmony messages. */
bool rt_harmony_template(const char *tmpl, size_t len);

typedef struct rt_harmony rt_harmony;

/* NULL when out of memory. */
rt_harmony *rt_harmony_new(void);
void rt_harmony_free(rt_harmony *h);

/* Feeds the next piece of the answer (final: it ends with it): the
 * reasoning and the content that may go out now (owned by h, valid until
 * the next call); text that may be a marker's start is held back, and the
 * headers are dropped. Calls it completes are appended to h's. 0, or
 * -ENOMEM (h is then unusable). */
int rt_harmony_feed(rt_harmony *h, const char *text, size_t len, bool final, const char **reasoning,
                    size_t *reasoning_len, const char **content, size_t *content_len);
int rt_harmony_n_calls(const rt_harmony *h);
/* The i-th call (0 <= i < rt_harmony_n_calls), valid while h lives. */
const rt_tc_call *rt_harmony_call_at(const rt_harmony *h, int i);
/* The call being written: its name and its arguments so far (whitespace
 * around them held back); valid until the next feed. A call whose body is
 * JSON ends with arguments that begin with every such text. */
bool rt_harmony_pending(const rt_harmony *h, const char **name, const char **args, size_t *len);

#endif
