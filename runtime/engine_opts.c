/* The table of the engine's options (see engine_opts.h). */
#include "runtime/engine_opts.h"

#include "runtime/chat.h"

#include <string.h>

static const char *kv_type_name(int v)
{
    static const char *const names[] = {"f16", "q8_0"};
    return v >= 0 && v < 2 ? names[v] : NULL;
}

static const char *bool_name(int v)
{
    static const char *const names[] = {"false", "true"};
    return v >= 0 && v < 2 ? names[v] : NULL;
}

static const char *chat_name(int v)
{
    return v >= 0 && v < RT_CHAT_N_KINDS ? rt_chat_kind_name((rt_chat_kind)v) : NULL;
}

const rt_eopt_def rt_eopt_defs[RT_EOPT_N] = {
    [RT_EOPT_THREADS] = {"threads", "threads", "N", 0, 0, 1024, NULL, "one per usable CPU",
                         "compute threads"},
    [RT_EOPT_KV_CACHE_MB] = {"kv_cache_mb", "kv-cache-mb", "M", 256, 1, 1 << 20, NULL, NULL, "KV cache pool"},
    [RT_EOPT_KV_TYPE] = {"kv_type", "kv-type", "f16|q8_0", 0, 0, 1, kv_type_name, NULL,
                         "KV cache elements; q8_0 (CPU only): half the memory and half the bytes decode "
                         "attention reads, slightly less precise"},
    [RT_EOPT_MAX_SEQS] = {"max_seqs", "max-seqs", "S", 32, 1, 4096, NULL, NULL, "sequences decoded together"},
    [RT_EOPT_MAX_BATCH_TOKENS] = {"max_batch_tokens", "max-batch-tokens", "T", 512, 1, 1 << 20, NULL, NULL,
                                  "tokens per forward pass, prefill chunks included"},
    [RT_EOPT_MAX_QUEUE] = {"max_queue", "max-queue", "Q", 64, 0, 1 << 20, NULL, NULL,
                           "requests of a priority waiting; past it 429"},
    [RT_EOPT_BATCH_MAX_WAIT_MS] = {"batch_max_wait_ms", "batch-max-wait-ms", "MS", 30000, 0, 86400000, NULL,
                                   NULL,
                                   "a batch request waiting this long starts in turn with interactive ones, "
                                   "oldest first"},
    [RT_EOPT_PROMPT_MAX_WAIT_MS] =
        {"prompt_max_wait_ms", "prompt-max-wait-ms", "MS", 10000, 0, 86400000, NULL, NULL,
         "within a tenant and priority the prompt with the fewest tokens left is computed first, letting "
         "cached chat turns through sooner, but one whose first token has waited this long goes first, in "
         "arrival order (0: arrival order always)"},
    [RT_EOPT_CHAT_TEMPLATE] = {"chat_template", "chat-template", "NAME|FILE", -1, 0, RT_CHAT_N_KINDS - 1,
                               chat_name, "the model's template",
                               "render chats as this built-in family, or through this file of Jinja (a path "
                               "with a '/' or ending in .jinja), not through the model's own template"},
    [RT_EOPT_PREFIX_CACHE] = {"prefix_cache", "prefix-cache", "BOOL", 1, 0, 1, bool_name, NULL,
                              "true or false: keep the KV of full blocks of earlier prompts and answers, and reuse it for a "
                              "prompt that begins the same (not for models with sliding-window layers)"},
};

int rt_eopt_lookup(rt_eopt id, const char *name)
{
    const rt_eopt_def *d = &rt_eopt_defs[id];
    for (int v = 0; d->name && v <= d->max; v++)
        if (!strcmp(d->name(v), name))
            return v;
    return -1;
}

bool rt_eopt_is_template_path(const char *value)
{
    size_t n = strlen(value);
    return strchr(value, '/') || (n > 6 && !strcmp(value + n - 6, ".jinja"));
}

const char *rt_eopt_range(rt_eopt id, char *buf, size_t len)
{
    const rt_eopt_def *d = &rt_eopt_defs[id];
    if (!d->name) {
        snprintf(buf, len, "%lld to %lld", d->min, d->max);
        return buf;
    }
    size_t at = (size_t)snprintf(buf, len, "%s", d->max > 1 ? "one of " : "");
    for (int v = 0; v <= d->max && at < len; v++)
        at += (size_t)snprintf(buf + at, len - at, "%s%s",
                               v == 0       ? ""
                               : d->max > 1 ? ", "
                                            : " or ",
                               d->name(v));
    return buf;
}

kn_type rt_eopt_kv_type(long long v)
{
    return v == 1 ? KN_TYPE_Q8_0 : KN_TYPE_F16;
}

/* Writes text from column 25 on, wrapped at words to end by column 100. */
static void usage_wrapped(FILE *f, const char *text)
{
    enum { INDENT = 25, WIDTH = 100 - INDENT };
    int col = 0;
    for (const char *p = text; *p;) {
        size_t n = strcspn(p, " ");
        if (col > 0 && col + 1 + (int)n > WIDTH) {
            fprintf(f, "\n%*s", INDENT, "");
            col = 0;
        } else if (col > 0) {
            fputc(' ', f);
            col++;
        }
        fprintf(f, "%.*s", (int)n, p);
        col += (int)n;
        p += n + (p[n] == ' ');
    }
    fputc('\n', f);
}

void rt_eopt_usage(FILE *f)
{
    for (int id = 0; id < RT_EOPT_N; id++) {
        const rt_eopt_def *d = &rt_eopt_defs[id];
        char flag[64], text[1024];
        snprintf(flag, sizeof(flag), "--%s %s", d->flag, d->arg);
        int n;
        if (d->dflt_text)
            n = snprintf(text, sizeof(text), "%s (default: %s)", d->help, d->dflt_text);
        else if (d->name)
            n = snprintf(text, sizeof(text), "%s (default %s)", d->help, d->name((int)d->dflt));
        else
            n = snprintf(text, sizeof(text), "%s (default %lld)", d->help, d->dflt);
        /* a short list of names is in the flag's argument already */
        if (d->name && d->max > 1 && n > 0 && (size_t)n < sizeof(text)) {
            char range[512];
            snprintf(text + n, sizeof(text) - (size_t)n, "; %s",
                     rt_eopt_range((rt_eopt)id, range, sizeof(range)));
        }
        fprintf(f, "  %-22s ", flag);
        usage_wrapped(f, text);
    }
}
