/* The Jinja lexer's tokens (see lex.c), for the parser. */
#ifndef RT_JINJA_LEX_H
#define RT_JINJA_LEX_H

#include "runtime/jinja/internal.h"

#include <errno.h>

typedef enum jn_tok_type {
    JT_EOF,
    JT_DATA,
    JT_VAR_BEGIN,
    JT_VAR_END,
    JT_BLOCK_BEGIN,
    JT_BLOCK_END,
    JT_NAME,
    JT_STRING, /* p, len: the value, escapes applied */
    JT_INT,
    JT_FLOAT,
    JT_OP,
} jn_tok_type;

typedef struct jn_tok {
    jn_tok_type type;
    int line;
    const char *p;
    size_t len;
    int64_t i;
    double f;
} jn_tok;

typedef struct jn_lexer {
    const char *src; /* normalised: \n newlines, no trailing one */
    size_t len;
    jn_arena *arena;
    char *err;
    size_t err_len;
    int line;
    bool line_starting;
    jn_tok *toks;
    int n, cap;
} jn_lexer;

/* Fills lx->toks, ending with JT_EOF; jumps through the arena's fail on an
 * error, with err "template line N: why". */
void jn_lex(jn_lexer *lx);

#endif
