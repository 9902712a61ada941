/* The engine's state, shared by engine.c (life, admission, events) and
 * engine_prompt.c (the prompt path). Not for callers: see engine.h. */
#ifndef RT_ENGINE_INTERNAL_H
#define RT_ENGINE_INTERNAL_H

#include "runtime/chat.h"
#include "runtime/engine.h"
#include "runtime/grammar/grammar.h"
#include "runtime/jinja/jinja.h"
#include "runtime/reasoning.h"
#include "runtime/toolcall.h"

#include <pthread.h>
#include <stdatomic.h>

#define RT_ENGINE_WARNING_MAX 512
#define RT_ENGINE_GRAMMARS 16

typedef struct rt_engine_qev rt_engine_qev;

struct rt_engine {
    /* set at load, never changed: what the prompt path reads */
    rt_model *model;
    const rt_tokenizer *tok;
    char *model_name;
    long created;
    /* The Jinja templates chats render through: the model's (or the
     * file's), and its tool_use one for requests with tools (either NULL:
     * the other; both: the family renderer of chat_kind). */
    rt_jinja *tmpl, *tmpl_tools;
    char *tmpl_file; /* the file tmpl came from, or NULL: the model's */
    /* The family: what chats render as without a Jinja template, and
     * what ends a turn either way. */
    rt_chat_kind chat_kind;
    bool chat_forced; /* by the options, not the model's template */
    bool tmpl_present, tmpl_recognised;
    const char *bos_text; /* the tokenizer's, "" when the model has no BOS */
    const char *eos_text; /* the same for EOS: a template's eos_token */
    /* rt_chat_turn_end's text where no token of it ends generation: a
     * chat's implicit stop string; NULL where the model ends turns itself */
    const char *turn_stop;
    /* Constrained sampling: the vocabulary's trie every request's grammar
     * is compiled against, and the format the model writes tool calls in */
    rt_gvocab *gvocab;
    rt_tc_format tc_format;
    bool thinks; /* its template writes <think> blocks: chats' reasoning is split out */
    /* The grammars compiled last, by their GBNF text: requests with the
     * same schema share one, and with it the masks it has worked out (a
     * grammar's first steps cost ~100x its later ones). Under gmu; any
     * thread. */
    pthread_mutex_t gmu;
    struct {
        char *gbnf;
        rt_grammar *g;
        uint64_t used;
    } grammars[RT_ENGINE_GRAMMARS];
    uint64_t grammar_clock;
    char warnings[4][RT_ENGINE_WARNING_MAX];
    int n_warnings;
    _Atomic uint64_t next_seed; /* for requests that name none; the sampler mixes it */

    /* owner thread */
    rt_sched *sched;
    uint64_t next_cid;
    int admitted[2]; /* admitted, not yet submitted, by rt_priority */

    /* events from the compute thread, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    rt_engine_qev *head, *tail;
    void (*wake)(void *arg);
    void *wake_arg;
};

/* The grammar of GBNF text src (a reference in *out), compiled or found
 * among the last ones: as rt_grammar_new. */
int rt_engine_grammar(rt_engine *e, const char *src, size_t len, rt_grammar **out, char *err, size_t err_len);
void rt_engine_grammars_free(rt_engine *e);

/* "the request's deadline passed before it could start", 504. */
void rt_engine_error_deadline(rt_oai_error *err);
/* The scheduler's rule, applied before it sees the request. */
bool rt_engine_deadline_passed(int64_t deadline_ms);

#endif
