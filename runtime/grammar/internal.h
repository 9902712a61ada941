/* The grammar engine's shared types (see grammar.h). Not for callers. */
#ifndef RT_GRAMMAR_INTERNAL_H
#define RT_GRAMMAR_INTERNAL_H

#include "runtime/grammar/grammar.h"

#include <pthread.h>
#include <stdatomic.h>

/* The vocabulary trie, flat in depth-first order: node i's subtree is
 * nodes [i, end[i]); a node is one byte below its parent. Skipping a
 * rejected prefix is i = end[i]. */
typedef struct vnode {
    uint32_t end;       /* one past the last node of this subtree */
    uint32_t tok_first; /* tokens whose text ends here: toks[tok_first, tok_first + n_tok) */
    uint16_t n_tok;
    uint16_t depth; /* 1 for a first byte */
    uint8_t byte;
} vnode;

struct rt_gvocab {
    int32_t n_vocab;
    uint32_t n_nodes;
    vnode *nodes;
    int32_t *toks;
    int32_t *eog; /* the end-of-generation tokens */
    int n_eog;
    const char **text; /* each token's bytes (the tokenizer's), and their lengths */
    uint32_t *len;
    uint16_t max_depth;
};

/* Compiled elements: each rule's alternatives are runs of CHARS and REF
 * elements, each run ended by END. */
enum { GE_END = 0, GE_CHARS, GE_REF };

typedef struct gel {
    uint8_t type;
    uint32_t arg; /* CHARS: the byte set's index; REF: the rule */
} gel;

/* What is known at a position for the tokens that start there. */
typedef struct gpos {
    uint32_t *accepted; /* a bitset of n_vocab, or NULL: see list */
    int32_t *acc_list;  /* with accepted NULL: the accepted tokens */
    uint32_t n_acc;
    int32_t *uncertain; /* leave the position's rule: tried against the real stack */
    uint32_t n_unc;
} gpos;

struct rt_grammar {
    atomic_int refs;
    const rt_gvocab *v;
    gel *el;
    uint32_t n_el;
    uint32_t (*sets)[8]; /* 256-bit byte sets */
    uint32_t n_sets;
    uint32_t *alt_off; /* rule r's alternatives start at alts[alt_off[r] .. alt_off[r + 1]) */
    uint32_t *alts;
    uint32_t n_rules, root;
    pthread_mutex_t mu;   /* over the precomputes and the dfa */
    struct gdfa *dfa;     /* the precomputes: a stack's top positions to its gpos, and their automaton (match.c) */
};

void gdfa_free(struct gdfa *d);

static inline bool set_has(const uint32_t *set, uint8_t b)
{
    return (set[b >> 5] >> (b & 31)) & 1;
}

#endif
