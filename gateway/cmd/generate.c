/* `infergate generate`: one prompt, offline, with timing — the quickest
 * check that a model loads and computes, and the hook for comparing
 * numerics with other engines (--prompt-tokens, --show-tokens,
 * --dump-logits). */
#include "gateway/cmd/cli.h"
#include "gateway/base/clock.h"
#include "gateway/base/num.h"

#include "runtime/model.h"
#include "runtime/sampler.h"
#include "runtime/tokenizer.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_STOPS 16
#define PREFILL_CHUNK 512

typedef struct gen_args {
    const char *model, *prompt, *prompt_tokens, *dump_logits, *device;
    long n_predict, threads;
    bool show_tokens, ignore_eos, reference;
    rt_sampler_params sp;
    const char *stops[MAX_STOPS];
    int n_stops;
} gen_args;

static void usage(FILE *f)
{
    fprintf(f, "usage: infergate generate --model FILE (--prompt TEXT | --prompt-tokens 1,15,27) [options]\n"
               "  -n, --n-predict N        tokens to generate (default 64)\n"
               "  --temp T                 temperature, 0 = greedy (default 0)\n"
               "  --top-k K, --top-p P, --min-p P\n"
               "  --seed N                 sampling seed (default 0)\n"
               "  --presence-penalty X, --frequency-penalty X\n"
               "  --stop STR               stop string (repeatable, up to 16)\n"
               "  --threads N              compute threads (default: one per usable CPU)\n"
               "  --reference              scalar reference kernels (slow; for checks)\n"
               "  --device cpu|cuda        where the model runs (default cpu)\n"
               "  --prompt-tokens LIST     prompt as token ids, no tokenizer, BOS only if listed\n"
               "  --show-tokens            print the generated token ids\n"
               "  --dump-logits FILE       write the logits of the last prompt position, one per line\n"
               "  --ignore-eos             keep generating past end-of-generation tokens\n");
}

static int parse_args(int argc, char **argv, gen_args *a)
{
    enum { O_TEMP = 256, O_TOPK, O_TOPP, O_MINP, O_SEED, O_PP, O_FP, O_STOP, O_THREADS, O_REF, O_PT, O_SHOW,
           O_DUMP, O_IGN, O_DEVICE };
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},    {"prompt", required_argument, 0, 'p'},
        {"n-predict", required_argument, 0, 'n'}, {"temp", required_argument, 0, O_TEMP},
        {"top-k", required_argument, 0, O_TOPK}, {"top-p", required_argument, 0, O_TOPP},
        {"min-p", required_argument, 0, O_MINP}, {"seed", required_argument, 0, O_SEED},
        {"presence-penalty", required_argument, 0, O_PP}, {"frequency-penalty", required_argument, 0, O_FP},
        {"stop", required_argument, 0, O_STOP}, {"threads", required_argument, 0, O_THREADS},
        {"reference", no_argument, 0, O_REF},    {"prompt-tokens", required_argument, 0, O_PT},
        {"show-tokens", no_argument, 0, O_SHOW}, {"dump-logits", required_argument, 0, O_DUMP},
        {"ignore-eos", no_argument, 0, O_IGN},   {"device", required_argument, 0, O_DEVICE},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    memset(a, 0, sizeof(*a));
    a->n_predict = 64;
    rt_sampler_params_default(&a->sp);
    a->sp.temperature = 0.0f;
    optind = 1;
    int c;
    double d;
    long v;
    while ((c = getopt_long(argc, argv, "m:p:n:h", opts, NULL)) != -1) {
        const char *bad = NULL;
        switch (c) {
        case 'm': a->model = optarg; break;
        case 'p': a->prompt = optarg; break;
        case 'n':
            if (gw_parse_int(optarg, 0, 1 << 24, &a->n_predict))
                bad = "-n must be a whole number";
            break;
        case O_TEMP:
            if (gw_parse_float(optarg, &d) || d < 0)
                bad = "--temp must be a number >= 0";
            a->sp.temperature = (float)d;
            break;
        case O_TOPK:
            if (gw_parse_int(optarg, 0, 1 << 24, &v))
                bad = "--top-k must be a whole number >= 0";
            a->sp.top_k = (int)v;
            break;
        case O_TOPP:
            if (gw_parse_float(optarg, &d) || d <= 0 || d > 1)
                bad = "--top-p must be in (0, 1]";
            a->sp.top_p = (float)d;
            break;
        case O_MINP:
            if (gw_parse_float(optarg, &d) || d < 0 || d > 1)
                bad = "--min-p must be in [0, 1]";
            a->sp.min_p = (float)d;
            break;
        case O_SEED:
            if (gw_parse_u64(optarg, &a->sp.seed))
                bad = "--seed must be a whole number from 0 to 2^64 - 1";
            break;
        case O_PP:
            if (gw_parse_float(optarg, &d) || d < -2 || d > 2)
                bad = "--presence-penalty must be in [-2, 2]";
            a->sp.presence_penalty = (float)d;
            break;
        case O_FP:
            if (gw_parse_float(optarg, &d) || d < -2 || d > 2)
                bad = "--frequency-penalty must be in [-2, 2]";
            a->sp.frequency_penalty = (float)d;
            break;
        case O_STOP:
            if (a->n_stops == MAX_STOPS || !*optarg)
                bad = "--stop takes a non-empty string, at most 16 times";
            else
                a->stops[a->n_stops++] = optarg;
            break;
        case O_THREADS:
            if (gw_parse_int(optarg, 1, 1024, &a->threads))
                bad = "--threads must be from 1 to 1024";
            break;
        case O_REF: a->reference = true; break;
        case O_PT: a->prompt_tokens = optarg; break;
        case O_SHOW: a->show_tokens = true; break;
        case O_DUMP: a->dump_logits = optarg; break;
        case O_IGN: a->ignore_eos = true; break;
        case O_DEVICE:
            a->device = optarg;
            if (strcmp(optarg, "cpu") && strcmp(optarg, "cuda"))
                bad = "--device must be cpu or cuda";
            break;
        case 'h': usage(stdout); return 1;
        default: usage(stderr); return -1;
        }
        if (bad) {
            fprintf(stderr, "generate: %s (got '%s')\n", bad, optarg);
            return -1;
        }
    }
    if (!a->model || (!a->prompt == !a->prompt_tokens) || optind != argc) {
        usage(stderr);
        return -1;
    }
    return 0;
}

/* "1,15,27" -> ids; returns the count or -1. */
static int parse_token_list(const char *s, int32_t n_vocab, int32_t **out)
{
    int cap = 16, n = 0;
    int32_t *ids = malloc((size_t)cap * sizeof(int32_t));
    if (!ids)
        return -1;
    while (*s) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (errno || end == s || v < 0 || v >= n_vocab || (*end && *end != ','))
            goto bad;
        if (n == cap) {
            int32_t *np = realloc(ids, (size_t)(cap *= 2) * sizeof(int32_t));
            if (!np)
                goto bad;
            ids = np;
        }
        ids[n++] = (int32_t)v;
        s = *end ? end + 1 : end;
    }
    if (n == 0)
        goto bad;
    *out = ids;
    return n;
bad:
    free(ids);
    return -1;
}

static int dump_logits(const char *path, const float *logits, int n)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -errno;
    for (int i = 0; i < n; i++)
        fprintf(f, "%.9g\n", logits[i]);
    return fclose(f) ? -errno : 0;
}

static void emit(rt_stop *stop, bool final)
{
    size_t n;
    const char *p = rt_stop_take(stop, final, &n);
    fwrite(p, 1, n, stdout);
    fflush(stdout);
}

int gw_cmd_generate(int argc, char **argv)
{
    gen_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc > 0 ? 0 : 2;

    char err[512];
    rt_model *m = NULL;
    rt_kv *kv = NULL;
    rt_seq *seq = NULL;
    rt_sampler *smp = NULL;
    rt_stop *stop = NULL;
    int32_t *prompt = NULL, *generated = NULL;
    float *logits = NULL;
    int status = 1;

    rt_model_opts mo = {.n_threads = (int)a.threads, .reference = a.reference, .device = a.device};
    if ((rc = rt_model_load(a.model, &mo, &m, err, sizeof(err)))) {
        fprintf(stderr, "generate: %s: %s\n", a.model, err);
        return 1;
    }
    const rt_hparams *hp = rt_model_hparams(m);
    const rt_tokenizer *tok = rt_model_tokenizer(m);
    int n_prompt;
    if (a.prompt_tokens) {
        if ((n_prompt = parse_token_list(a.prompt_tokens, hp->n_vocab, &prompt)) < 0) {
            fprintf(stderr, "generate: --prompt-tokens must be comma-separated ids below %d\n", hp->n_vocab);
            goto out;
        }
    } else {
        size_t len = strlen(a.prompt);
        bool bos = rt_tokenizer_add_bos_default(tok);
        n_prompt = rt_tokenizer_encode(tok, a.prompt, len, bos, false, NULL, 0);
        if (n_prompt <= 0 || !(prompt = malloc((size_t)n_prompt * sizeof(int32_t))) ||
            rt_tokenizer_encode(tok, a.prompt, len, bos, false, prompt, n_prompt) != n_prompt) {
            fprintf(stderr, "generate: the prompt encodes to no tokens\n");
            goto out;
        }
    }
    long total = n_prompt + a.n_predict;
    if (total > hp->n_ctx_train) {
        fprintf(stderr, "generate: prompt (%d tokens) + n (%ld) exceeds the context length %d\n", n_prompt,
                a.n_predict, hp->n_ctx_train);
        goto out;
    }
    kv = rt_kv_new(m, (size_t)(total + 15) / 16 * 16 * rt_model_kv_bytes_per_token(m, KN_TYPE_F16), 16,
                   KN_TYPE_F16, err, sizeof(err));
    if (!kv) {
        fprintf(stderr, "generate: %s\n", err);
        goto out;
    }
    seq = rt_seq_new(kv, (int)total);
    smp = rt_sampler_new(&a.sp, hp->n_vocab);
    stop = rt_stop_new(a.stops, a.n_stops);
    logits = malloc((size_t)hp->n_vocab * sizeof(float));
    generated = malloc(((size_t)a.n_predict + 1) * sizeof(int32_t));
    if (!seq || !smp || !stop || !logits || !generated) {
        fprintf(stderr, "generate: out of memory\n");
        goto out;
    }

    double t0 = gw_mono_s();
    for (int i = 0; i < n_prompt; i += PREFILL_CHUNK) {
        int n = n_prompt - i < PREFILL_CHUNK ? n_prompt - i : PREFILL_CHUNK;
        rt_batch_entry e = {.seq = seq, .tokens = prompt + i, .n_tokens = n,
                            .logits = i + n == n_prompt ? logits : NULL};
        if ((rc = rt_model_forward(m, &e, 1))) {
            fprintf(stderr, "generate: forward pass failed: %s\n", strerror(-rc));
            goto out;
        }
    }
    double t_prefill = gw_mono_s() - t0;
    if (a.dump_logits && (rc = dump_logits(a.dump_logits, logits, hp->n_vocab))) {
        fprintf(stderr, "generate: %s: %s\n", a.dump_logits, strerror(-rc));
        goto out;
    }

    int n_gen = 0;
    bool stopped = false;
    t0 = gw_mono_s();
    while (n_gen < a.n_predict) {
        int32_t t = rt_sampler_sample(smp, logits);
        rt_sampler_accept(smp, t);
        generated[n_gen++] = t;
        if (!a.ignore_eos && rt_tokenizer_is_eog(tok, t))
            break;
        size_t n = 0;
        const char *piece = rt_tokenizer_piece(tok, t, &n);
        if (piece && n > 0 && rt_stop_feed(stop, piece, n)) {
            stopped = true;
            break;
        }
        emit(stop, false);
        if (n_gen == a.n_predict)
            break;
        rt_batch_entry e = {.seq = seq, .tokens = &t, .n_tokens = 1, .logits = logits};
        if ((rc = rt_model_forward(m, &e, 1))) {
            fprintf(stderr, "generate: forward pass failed: %s\n", strerror(-rc));
            goto out;
        }
    }
    double t_decode = gw_mono_s() - t0;
    emit(stop, !stopped);
    printf("\n");
    if (a.show_tokens) {
        printf("tokens:");
        for (int i = 0; i < n_gen; i++)
            printf("%s%d", i ? "," : " ", generated[i]);
        printf("\n");
    }
    /* The last sampled token is never run through the model. */
    int n_decoded = n_gen > 1 ? n_gen - 1 : 0;
    fprintf(stderr, "prefill: %d tokens in %.3f s (%.1f tokens/s)\n", n_prompt, t_prefill,
            n_prompt / (t_prefill > 0 ? t_prefill : 1e-9));
    fprintf(stderr, "decode:  %d tokens in %.3f s (%.1f tokens/s), %d threads, %s kernels\n", n_decoded, t_decode,
            n_decoded / (t_decode > 0 ? t_decode : 1e-9), rt_model_threads(m), rt_model_backend_name(m));
    status = 0;
out:
    free(generated);
    free(logits);
    free(prompt);
    rt_stop_free(stop);
    rt_sampler_free(smp);
    rt_seq_free(seq);
    rt_kv_free(kv);
    rt_model_free(m);
    return status;
}
