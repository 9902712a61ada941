/* Sampling the next token from logits, and stop-string matching.
 *
 * Order of operations (as llama.cpp and vLLM): logit bias, penalties
 * (presence, frequency over the tokens generated so far) -> temperature 0
 * (or top_p 0) means greedy
 * -> top-k -> softmax with temperature -> top-p -> min-p -> draw with a
 * seeded PRNG. Same seed and same logits give the same tokens. */
#ifndef RT_SAMPLER_H
#define RT_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RT_SAMPLER_MAX_BIAS 300 /* tokens in one logit_bias */

typedef struct rt_sampler_bias {
    int32_t token;
    float bias; /* added to the token's logit, -100..100 */
} rt_sampler_bias;

typedef struct rt_sampler_params {
    float temperature; /* 0 = greedy */
    int top_k;         /* 0 = off */
    float top_p;       /* 1 = off */
    float min_p;       /* 0 = off */
    uint64_t seed;
    float presence_penalty;  /* OpenAI semantics: subtract once if seen */
    float frequency_penalty; /* subtract count * penalty */
    int n_bias;              /* logit_bias: tokens must be < n_vocab */
    rt_sampler_bias bias[RT_SAMPLER_MAX_BIAS];
} rt_sampler_params;

void rt_sampler_params_default(rt_sampler_params *p); /* greedy-safe defaults: temp 1, top_p 1 */

typedef struct rt_sampler rt_sampler;

/* NULL when p fails rt_sampler_params_ok, or out of memory. */
rt_sampler *rt_sampler_new(const rt_sampler_params *p, int32_t n_vocab);
/* Whether rt_sampler_new takes p: logit_bias within its bound, on tokens
 * below n_vocab, with finite biases (the other knobs are clamped). */
bool rt_sampler_params_ok(const rt_sampler_params *p, int32_t n_vocab);
void rt_sampler_free(rt_sampler *s);
/* Picks a token; `logits` (n_vocab) may be modified. */
int32_t rt_sampler_sample(rt_sampler *s, float *logits);
/* Records a generated token (for the penalties). */
void rt_sampler_accept(rt_sampler *s, int32_t tok);
/* Puts a fresh sampler where one that had generated toks[0..n) would be:
 * the penalties' counts, and the generator past the n draws it made (one
 * per token, none when greedy). A request resumed on another worker (the
 * gateway's token replay) so draws what an unbroken run would have. */
void rt_sampler_resume(rt_sampler *s, const int32_t *toks, int n);

/* Log-probabilities of one step under the model's own distribution: the
 * raw logits, before bias, penalties and temperature (as vLLM reports
 * them by default). */
#define RT_MAX_TOP_LOGPROBS 20 /* OpenAI's top_logprobs bound */

typedef struct rt_token_logprobs {
    float logprob; /* of the token chosen; -inf when it had no chance */
    int n_top;
    int32_t top[RT_MAX_TOP_LOGPROBS]; /* the likeliest tokens, best first (lower id on ties) */
    float top_logprob[RT_MAX_TOP_LOGPROBS];
} rt_token_logprobs;

/* Fills *out from logits[0..n) (NaN counts as -inf) for the token chosen
 * and the k likeliest (k clamped to 0..RT_MAX_TOP_LOGPROBS and to n). The
 * row is spent: its values are overwritten. */
void rt_logprobs(float *logits, int32_t n, int32_t chosen, int k, rt_token_logprobs *out);

/* Stop strings over streamed text. Feed decoded bytes; the matcher holds
 * back a tail that could still become a stop string and tells how much is
 * safe to emit. */
typedef struct rt_stop rt_stop;

/* Up to 16 stop strings; NULL-free array; empty strings are ignored.
 * Returns NULL on ENOMEM or for n outside 0..16. Every chunk that take()
 * gives out ends on a UTF-8 character boundary: an incomplete sequence at
 * the end is held until it completes (or until `final`). */
rt_stop *rt_stop_new(const char *const *stops, int n);
void rt_stop_free(rt_stop *s);
/* Appends bytes. Returns true when a stop string matched; then the text
 * before the match is the final output. */
bool rt_stop_feed(rt_stop *s, const char *bytes, size_t n);
/* Text that may be sent now (advances the emitted mark): pointer and length
 * into the matcher's buffer, valid until the next feed. With `final`, also
 * releases the held-back tail (end of generation without a match). */
const char *rt_stop_take(rt_stop *s, bool final, size_t *len);
/* 0, or -ENOMEM when a feed could not grow the buffer: that feed returned
 * true (generation ends with the text held so far), not a real match. */
int rt_stop_error(const rt_stop *s);
/* After a stop string matched: the bytes fed from its start on (the stop
 * string and whatever the same feed brought after it); else 0. */
size_t rt_stop_tail_len(const rt_stop *s);

#endif
