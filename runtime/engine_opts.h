/* The engine's tunable options, each stated once: its config key (a
 * workers[] entry), its `infergate worker` flag, default, range and help.
 * rt_sched_opts_default, the worker's getopt and usage, and the config's
 * workers section all read this table, so none of them states a default or
 * a bound of its own (as each of nginx's modules owns its directives in one
 * ngx_command_t array).
 *
 * An option is a whole number from min to max, or a named one: one of the
 * names name(0) .. name(max), its value the index. */
#ifndef RT_ENGINE_OPTS_H
#define RT_ENGINE_OPTS_H

#include "kernels/kn.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef enum rt_eopt {
    RT_EOPT_THREADS,
    RT_EOPT_KV_CACHE_MB,
    RT_EOPT_KV_TYPE,
    RT_EOPT_MAX_SEQS,
    RT_EOPT_MAX_BATCH_TOKENS,
    RT_EOPT_MAX_QUEUE,
    RT_EOPT_BATCH_MAX_WAIT_MS,
    RT_EOPT_PROMPT_MAX_WAIT_MS,
    RT_EOPT_CHAT_TEMPLATE,
    RT_EOPT_PREFIX_CACHE,
    RT_EOPT_N
} rt_eopt;

typedef struct rt_eopt_def {
    const char *key;  /* the config key in a workers[] entry: "max_seqs" */
    const char *flag; /* the command-line flag without its dashes: "max-seqs" */
    const char *arg;  /* the value's name in usage: "S" */
    long long dflt, min, max;
    /* A named option's names (value v: name(v), NULL past max); NULL for a
     * number. */
    const char *(*name)(int v);
    /* The default as usage says it, where the number alone would not tell
     * ("one per usable CPU"); NULL: the number or name. */
    const char *dflt_text;
    const char *help; /* one sentence; usage wraps it and adds the default */
} rt_eopt_def;

extern const rt_eopt_def rt_eopt_defs[RT_EOPT_N];

/* A named option's value for name, or -1. */
int rt_eopt_lookup(rt_eopt id, const char *name);
/* Whether a chat_template value that is no family's name is a path to a
 * Jinja file: it has a '/' or ends in ".jinja". (A bare word stays a
 * name, so a misspelt family is refused as one, not looked for as a file.) */
bool rt_eopt_is_template_path(const char *value);
/* The values option id takes, as messages say them: "1 to 4096", "f16 or
 * q8_0", "one of chatml, llama2, ...". Writes buf (truncated to len) and
 * returns it. */
const char *rt_eopt_range(rt_eopt id, char *buf, size_t len);
/* The KV element type of kv_type's value v. */
kn_type rt_eopt_kv_type(long long v);
/* Usage lines for every option: "  --flag ARG   help (default X)", wrapped
 * at 100 columns, a long list of names after it. */
void rt_eopt_usage(FILE *f);

#endif
