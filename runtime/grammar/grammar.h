/* Grammar-constrained sampling: which tokens may come next so that the
 * text stays in a language, computed fast enough to run at every step.
 *
 * A grammar is GBNF, as llama.cpp's server takes it (rules `name ::= ...`,
 * "literals", [classes] with ranges and ^, `.`, ( groups ), |, postfix
 * * + ? {m} {m,} {m,n}, # comments; `root` is the start rule), compiled to
 * byte-level rules; a JSON Schema is first written as GBNF (schema.c). The
 * vocabulary is a byte trie of the tokens' texts (rt_gvocab), built once
 * per tokenizer. A matcher follows one generation: the set of parse stacks
 * the text so far leaves (a pushdown automaton, loops as tail calls so a
 * stack does not grow with a string's length).
 *
 * Speed (as xgrammar does it): for each grammar position a token can start
 * at, the tokens are sorted once into those accepted whatever lies below
 * the position's rule on the stack, those rejected whatever it is, and the
 * few that leave the rule (a string's closing quote and what follows it),
 * which alone are tried against the real stack at each step. Those sets
 * are computed the first time a position is reached and kept with the
 * grammar, shared by every request that uses it; a matcher also keeps the
 * masks of the last states it saw, as inside a string the state repeats.
 *
 * Threads: a grammar is shared (its position cache is filled under its
 * own lock); a matcher is one request's, used by one thread at a time. */
#ifndef RT_GRAMMAR_H
#define RT_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct rt_tokenizer rt_tokenizer;
typedef struct rt_gvocab rt_gvocab;
typedef struct rt_grammar rt_grammar;
typedef struct rt_gmatch rt_gmatch;

/* The vocabulary as a trie of token texts (rt_tokenizer_piece's bytes;
 * control tokens, which have none, are never allowed by a grammar). The
 * end-of-generation tokens are allowed where the grammar may end. NULL
 * when out of memory. */
rt_gvocab *rt_gvocab_new(const rt_tokenizer *tok);
void rt_gvocab_free(rt_gvocab *v);
int32_t rt_gvocab_n(const rt_gvocab *v);

/* Bounds on what one grammar may be: a client sends it. */
#define RT_GRAMMAR_MAX_SOURCE (1u << 20) /* bytes of GBNF */
#define RT_GRAMMAR_MAX_ELEMS (1u << 20)  /* compiled elements (repetition counts expand) */

/* Compiles GBNF for vocabulary v (which must outlive it). 0, or -EINVAL
 * with err "grammar line N: why" (syntax, an undefined rule, no root, a
 * rule that can recurse without consuming, too large), -ENOMEM. The
 * grammar starts with one reference; rt_grammar_ref adds one,
 * rt_grammar_free drops one. */
int rt_grammar_new(const char *gbnf, size_t len, const rt_gvocab *v, rt_grammar **out, char *err,
                   size_t err_len);
rt_grammar *rt_grammar_ref(rt_grammar *g);
void rt_grammar_free(rt_grammar *g);

/* A matcher at the grammar's start; NULL when out of memory. */
rt_gmatch *rt_gmatch_new(rt_grammar *g);
void rt_gmatch_free(rt_gmatch *m);

/* The tokens allowed next, as bits (token t: mask[t / 32] >> (t % 32) & 1;
 * rt_gvocab_n bits), end-of-generation tokens included where the text may
 * end. 0, -ENOMEM (mask unchanged), or -E2BIG when no token may follow
 * (the vocabulary cannot write what the grammar needs): generation should
 * end. */
int rt_gmatch_mask(rt_gmatch *m, uint32_t *mask);
/* Moves past token tok. 0; -EINVAL when tok is not allowed (the matcher
 * is unchanged); -ENOMEM. An end-of-generation token is allowed only
 * where the text may end, and leaves the matcher done. */
int rt_gmatch_accept(rt_gmatch *m, int32_t tok);
/* Whether the text is complete and nothing may follow it (generation
 * must end now), and whether it may end here at all. */
bool rt_gmatch_must_end(const rt_gmatch *m);
bool rt_gmatch_can_end(const rt_gmatch *m);

/* ---- JSON Schema ---- */

typedef struct json_t json_t;

/* Writes GBNF for the JSON values a schema accepts: its rules named with
 * prefix (so that several schemas share one grammar), the value's rule
 * `<prefix>value`. What is enforced: type (and lists of types), object
 * with properties (in their order), required and additionalProperties
 * (false, true, or a schema for an object without properties), array with
 * items, prefixItems, minItems and maxItems, string with minLength,
 * maxLength, pattern (anchored ^...$, a regular subset) and format (date,
 * time, date-time, uuid, email), integer and number with minimum, maximum
 * and their exclusive forms (a number's bounds whole numbers), enum,
 * const, anyOf, oneOf, allOf of one, $ref to #/$defs/ or #/definitions/
 * (recursion too), true/false and {}. Annotations (title, description,
 * default, examples, $schema, $id, $comment, deprecated, readOnly,
 * writeOnly, strict) are ignored; any other keyword is refused: -EINVAL
 * with err naming it and where ("'minProperties' at
 * #/properties/a is not supported"). The GBNF is appended to a malloc'd
 * buffer (*out, *len; *out NULL to start). 0, -EINVAL, -ENOMEM. */
int rt_schema_gbnf(const json_t *schema, const char *prefix, char **out, size_t *len, char *err, size_t err_len);

#endif
