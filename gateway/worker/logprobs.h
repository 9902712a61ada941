/* Log-probabilities a request has been given but not yet sent: the worker
 * collects each token's from the scheduler's events and hands them to the
 * OpenAI encoder with the text they belong to (a streamed chunk, or the
 * whole response). */
#ifndef GW_LOGPROBS_H
#define GW_LOGPROBS_H

#include "runtime/openai.h"
#include "runtime/sampler.h"
#include "runtime/tokenizer.h"

typedef struct gw_lp_item {
    int index; /* the token's place among the generated ones, from 1 */
    int32_t token;
    rt_token_logprobs lp;
} gw_lp_item;

typedef struct gw_lp_list {
    gw_lp_item *v;
    int n, cap;
} gw_lp_list;

/* Appends a token's; 0 or -ENOMEM. */
int gw_lp_add(gw_lp_list *l, int index, int32_t token, const rt_token_logprobs *lp);
/* How many of the first entries are of tokens 1..upto (the scheduler's
 * lp_ready): those that may go out. */
int gw_lp_ready(const gw_lp_list *l, int upto);
/* The first n entries as the encoder takes them, each token's text its
 * bytes in the vocabulary (valid while tok lives); malloc'd, NULL when n
 * is 0 or on ENOMEM (*oom says which). */
rt_oai_logprob *gw_lp_render(const gw_lp_list *l, int n, const rt_tokenizer *tok, bool *oom);
/* Forgets the first n entries (sent). */
void gw_lp_drop(gw_lp_list *l, int n);
void gw_lp_free(gw_lp_list *l);

#endif
