/* Grammar-constrained decoding against unconstrained decoding, side by
 * side in one run (issue 29's criterion: a constrained step at batch 16 at
 * most 10% slower on a 32k vocabulary, 25% on a 150k one). For each
 * vocabulary a synthetic model is generated once; the engine runs `batch`
 * completions of `tokens` tokens each at once, alternately unconstrained
 * (ignore_eos) and held to a JSON Schema grammar that never ends (an
 * endless JSON array of the schema's objects, so that every request runs
 * its full length too), `reps` times each; the median time per decode
 * step is reported. On a loaded machine that A/B is noisy, so the masking
 * alone is also timed in thread CPU time (mask, masking a logits row,
 * accept, for `batch` sequences), and its share of the free step given
 * (the masks of a step run on the compute threads, `threads` of them).
 *
 *   bench_grammar [--dir DIR] [--dim 768 --layers 12 --heads 12 --ffn 2048]
 *                 [--type f16] [--vocabs 32000,151936] [--batch 16]
 *                 [--tokens 48] [--reps 3] [--threads 2] [--overlap-masks -1|0|1]
 *
 * --overlap-masks 1 computes the masks on a thread of their own during the
 * forward pass (sched.h's overlap_masks; by default only off the CPU). */
#include "bench/bench_util.h"
#include "kernels/kn.h"
#include "runtime/engine.h"
#include "runtime/grammar/grammar.h"
#include "runtime/model_gen.h"
#include "runtime/tokenizer.h"

#include <jansson.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_REPS 15
#define MAX_BATCH 64

static int overlap_masks = -1; /* --overlap-masks */

/* What OpenAI's strict mode and Pydantic write: strings with bounds, an
 * email, an integer range, an enum, a bounded array. */
static const char k_schema[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"maxLength\":24},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},"
    "\"email\":{\"type\":\"string\",\"format\":\"email\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":12},\"maxItems\":4},"
    "\"status\":{\"enum\":[\"active\",\"inactive\",\"banned\"]}},"
    "\"required\":[\"name\",\"age\",\"email\",\"tags\",\"status\"],\"additionalProperties\":false}";

typedef struct run_state {
    int done, failed;
    long tokens;
} run_state;

static void on_event(void *arg, const rt_engine_event *e)
{
    run_state *s = arg;
    if (e->ev.kind == RT_EV_DONE) {
        s->done++;
        s->tokens += e->ev.completion_tokens;
    } else if (e->ev.kind == RT_EV_ERROR) {
        s->done++;
        s->failed++;
        fprintf(stderr, "bench_grammar: a request failed: %s\n", e->error->message);
    }
}

/* batch requests at once; the seconds until the last ends. */
static double run_batch(rt_engine *e, const char *grammar, int batch, int tokens, int rep, long *n_tokens)
{
    rt_engine_req req[MAX_BATCH];
    run_state st = {0};
    for (int i = 0; i < batch; i++) {
        json_t *b = json_pack("{s:s, s:s, s:i, s:b, s:f, s:i}", "model", rt_engine_model_name(e), "prompt",
                              "Write the records:", "max_tokens", tokens, "ignore_eos", 1, "temperature", 1.0,
                              "seed", rep * 1000 + i);
        if (grammar)
            json_object_set_new(b, "grammar", json_string(grammar));
        char *body = json_dumps(b, JSON_COMPACT);
        json_decref(b);
        rt_oai_error err;
        if (rt_engine_prepare(e, body, strlen(body), false, RT_PRIO_INTERACTIVE, 0, &req[i], &err)) {
            fprintf(stderr, "bench_grammar: prepare: %s\n", err.message);
            exit(1);
        }
        free(body);
    }
    double t0 = bench_now();
    for (int i = 0; i < batch; i++) {
        uint64_t id;
        int retry;
        rt_oai_error err;
        if (rt_engine_submit(e, &req[i], &st, &id, &err, &retry)) {
            fprintf(stderr, "bench_grammar: submit: %s\n", err.message);
            exit(1);
        }
        rt_engine_req_dispose(&req[i]);
    }
    while (st.done < batch)
        rt_engine_poll(e, 1000, on_event, &st);
    double dt = bench_now() - t0;
    if (st.failed)
        exit(1);
    *n_tokens = st.tokens;
    return dt;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The masking alone, in this thread's CPU time (what the machine's other
 * load does not inflate): `batch` matchers of the grammar each take a
 * mask, have a logits row masked with it (as the scheduler does) and accept
 * a token drawn uniformly among those allowed, for `steps` steps. Microseconds
 * per sequence per step. */
static double mask_cost(const rt_tokenizer *tok, const char *grammar, int batch, int steps)
{
    rt_gvocab *v = rt_gvocab_new(tok);
    rt_grammar *g = NULL;
    char err[256];
    if (!v || rt_grammar_new(grammar, strlen(grammar), v, &g, err, sizeof(err))) {
        fprintf(stderr, "bench_grammar: grammar: %s\n", err);
        exit(1);
    }
    int32_t n = rt_gvocab_n(v);
    uint32_t *mask = malloc(((size_t)n + 31) / 32 * sizeof(uint32_t));
    float *logits = malloc((size_t)n * sizeof(float));
    int32_t *allowed = malloc((size_t)n * sizeof(int32_t));
    rt_gmatch *m[MAX_BATCH];
    for (int i = 0; i < batch; i++)
        m[i] = rt_gmatch_new(g);
    uint64_t rng = 29;
    double cpu = 0;
    for (int s = 0; s < steps; s++)
        for (int i = 0; i < batch; i++) {
            struct timespec a, b;
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
            int rc = rt_gmatch_mask(m[i], mask);
            for (int32_t w = 0; rc == 0 && w < (n + 31) / 32; w++)
                if (mask[w] != UINT32_MAX)
                    for (int32_t t = w * 32; t < w * 32 + 32 && t < n; t++)
                        if (!((mask[w] >> (t - w * 32)) & 1))
                            logits[t] = -1e30f;
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
            cpu += (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
            int32_t k = 0;
            for (int32_t t = 0; rc == 0 && t < n; t++)
                if ((mask[t / 32] >> (t % 32)) & 1)
                    allowed[k++] = t;
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
            if (!k || rt_gmatch_accept(m[i], allowed[rng % (uint64_t)k])) {
                fprintf(stderr, "bench_grammar: the matcher refused its own mask (rc %d, %d allowed, step %d seq %d)\n", rc, k, s, i);
                exit(1);
            }
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
            cpu += (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
            if (rt_gmatch_must_end(m[i])) { /* it drew the end of generation: a new answer */
                rt_gmatch_free(m[i]);
                m[i] = rt_gmatch_new(g);
            }
        }
    for (int i = 0; i < batch; i++)
        rt_gmatch_free(m[i]);
    free(mask);
    free(logits);
    free(allowed);
    rt_grammar_free(g);
    rt_gvocab_free(v);
    return cpu * 1e6 / ((double)steps * batch);
}

static void one_vocab(const char *dir, const rt_gen_params *base, int vocab, int batch, int tokens, int reps,
                      int threads, const char *grammar)
{
    rt_gen_params gp = *base;
    gp.vocab = vocab;
    char path[512], err[512];
    snprintf(path, sizeof(path), "%s/grammar-d%d-l%d-v%d-%s.gguf", dir, gp.dim, gp.layers, vocab,
             kn_type_name(gp.type));
    struct stat sb;
    if (stat(path, &sb) && rt_model_gen(&gp, path, err, sizeof(err))) {
        fprintf(stderr, "bench_grammar: gen: %s\n", err);
        exit(1);
    }
    rt_engine_opts o;
    rt_engine_opts_default(&o);
    o.model_path = path;
    o.model.n_threads = threads;
    rt_engine *e;
    double tl = bench_now();
    if (rt_engine_load(&o, &e, err, sizeof(err))) {
        fprintf(stderr, "bench_grammar: load: %s\n", err);
        exit(1);
    }
    tl = bench_now() - tl;
    rt_sched_opts so = o.sched;
    so.overlap_masks = overlap_masks;
    so.max_seqs = batch;
    so.max_queue = batch;
    so.kv_bytes =
        (size_t)batch * (tokens + 64) * rt_model_kv_bytes_per_token(rt_engine_model(e), KN_TYPE_F16);
    if (rt_engine_start(e, &so, err, sizeof(err))) {
        fprintf(stderr, "bench_grammar: start: %s\n", err);
        exit(1);
    }
    long n;
    run_batch(e, NULL, batch, 4, 0, &n); /* warm up */
    run_batch(e, grammar, batch, 4, 0, &n);
    double a[MAX_REPS], b[MAX_REPS];
    long na = 0, nb = 0;
    for (int r = 0; r < reps; r++) {
        a[r] = run_batch(e, NULL, batch, tokens, r + 1, &na) / tokens * 1e3;
        b[r] = run_batch(e, grammar, batch, tokens, r + 1, &nb) / tokens * 1e3;
    }
    qsort(a, (size_t)reps, sizeof(double), cmp_double);
    qsort(b, (size_t)reps, sizeof(double), cmp_double);
    double ma = a[reps / 2], mb = b[reps / 2];
    double us = mask_cost(rt_engine_tokenizer(e), grammar, batch, tokens * reps);
    printf("| %6d | %5d | %7.2f (%.2f-%.2f) | %7.2f (%.2f-%.2f) | %+6.1f%% | %6.1f | %6.1f | %5.2f%% | "
           "%ld/%ld | "
           "%.0f |\n",
           vocab, batch, ma, a[0], a[reps - 1], mb, b[0], b[reps - 1], (mb / ma - 1) * 100,
           (mb - ma) * 1e3 / batch, us, us * batch / threads / (ma * 1e3) * 100, na, nb, tl * 1e3);
    fflush(stdout);
    rt_engine_free(e);
}

int main(int argc, char **argv)
{
    const char *dir = "/tmp/infergate-bench", *vocabs = "32000,151936", *type = "f16";
    rt_gen_params gp;
    rt_gen_params_default(&gp);
    gp.dim = 768;
    gp.layers = 12;
    gp.heads = 12;
    gp.kv_heads = 12;
    gp.ffn = 2048;
    gp.ctx = 2048;
    gp.seed = 29;
    int batch = 16, tokens = 48, reps = 3, threads = 2;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "usage: see the comment at the top of bench/bench_grammar.c\n");
            return 2;
        }
        if (!strcmp(argv[i], "--dir"))
            dir = v;
        else if (!strcmp(argv[i], "--dim"))
            gp.dim = atoi(v);
        else if (!strcmp(argv[i], "--layers"))
            gp.layers = atoi(v);
        else if (!strcmp(argv[i], "--heads"))
            gp.heads = gp.kv_heads = atoi(v);
        else if (!strcmp(argv[i], "--ffn"))
            gp.ffn = atoi(v);
        else if (!strcmp(argv[i], "--type"))
            type = v;
        else if (!strcmp(argv[i], "--vocabs"))
            vocabs = v;
        else if (!strcmp(argv[i], "--batch"))
            batch = atoi(v);
        else if (!strcmp(argv[i], "--tokens"))
            tokens = atoi(v);
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(v);
        else if (!strcmp(argv[i], "--threads"))
            threads = atoi(v);
        else if (!strcmp(argv[i], "--overlap-masks"))
            overlap_masks = atoi(v);
        else {
            fprintf(stderr, "bench_grammar: unknown option %s\n", argv[i]);
            return 2;
        }
        i++;
    }
    kn_type t;
    if (kn_type_from_name(type, &t) || batch < 1 || batch > MAX_BATCH || reps < 1 || reps > MAX_REPS ||
        tokens < 1) {
        fprintf(stderr, "bench_grammar: bad --type, --batch (1..%d), --reps (1..%d) or --tokens\n", MAX_BATCH,
                MAX_REPS);
        return 2;
    }
    gp.type = (uint32_t)t;
    mkdir(dir, 0755);
    /* The schema's rules, and a root that never ends: [obj, obj, ... */
    json_t *schema = json_loads(k_schema, 0, NULL);
    char *gbnf = NULL, err[256];
    size_t len = 0;
    if (!schema || rt_schema_gbnf(schema, "", &gbnf, &len, err, sizeof(err))) {
        fprintf(stderr, "bench_grammar: schema: %s\n", err);
        return 1;
    }
    json_decref(schema);
    const char root[] = "root ::= \"[\" value (\",\" ws value)*\n";
    gbnf = realloc(gbnf, len + sizeof(root));
    memcpy(gbnf + len, root, sizeof(root));
    printf("model: dim %d, %d layers, ffn %d, %s; %d threads; %d requests of %d tokens at once, %d reps\n\n",
           gp.dim, gp.layers, gp.ffn, type, threads, batch, tokens, reps);
    printf(
        "| vocab | batch | step ms, free (min-max) | step ms, grammar (min-max) | grammar cost | us/seq/step "
        "(A/B) | us/seq/step (CPU time, mask alone) | mask share of a free step | tokens free/grammar | "
        "load ms |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    for (const char *p = vocabs; *p;) {
        int v = atoi(p);
        one_vocab(dir, &gp, v, batch, tokens, reps, threads, gbnf);
        p = strchr(p, ',');
        if (!p)
            break;
        p++;
    }
    free(gbnf);
    return 0;
}
