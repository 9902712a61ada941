/* For the unit tests that run a scheduler over a tiny generated model
 * (test_sched, test_prefix_cache, test_mask_overlap): one model file in a
 * temporary folder, loaded, and removed again. Header-only, one model per
 * test program. */
#ifndef TESTS_MODEL_HARNESS_H
#define TESTS_MODEL_HARNESS_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "runtime/model.h"
#include "runtime/model_gen.h"

typedef struct tiny_model {
    char dir[64], path[96];
    rt_model *model;
} tiny_model;

/* dim 64, 2 layers, 4 heads of which kv_heads 2, ffn 128, ctx 512: 0, or
 * -1 with the reason on stderr. */
static inline int tiny_model_open(tiny_model *t, const char *name, int vocab, uint64_t seed, int threads)
{
    snprintf(t->dir, sizeof(t->dir), "/tmp/infergate-test-%s-XXXXXX", name);
    if (!mkdtemp(t->dir))
        return -1;
    snprintf(t->path, sizeof(t->path), "%s/m.gguf", t->dir);
    rt_gen_params p;
    rt_gen_params_default(&p);
    p.dim = 64;
    p.layers = 2;
    p.heads = 4;
    p.kv_heads = 2;
    p.ffn = 128;
    p.vocab = vocab;
    p.ctx = 512;
    p.seed = seed;
    char err[256];
    if (rt_model_gen(&p, t->path, err, sizeof(err))) {
        fprintf(stderr, "gen: %s\n", err);
        return -1;
    }
    rt_model_opts o = {.n_threads = threads};
    if (rt_model_load(t->path, &o, &t->model, err, sizeof(err))) {
        fprintf(stderr, "load: %s\n", err);
        return -1;
    }
    return 0;
}

static inline void tiny_model_close(tiny_model *t)
{
    rt_model_free(t->model);
    unlink(t->path);
    rmdir(t->dir);
}

#endif
