/* The config's `workers` section (see config.h): which model each worker
 * serves under which name, on which devices, and the options the supervisor
 * passes to its `infergate worker` command. A value the worker would refuse
 * is refused here: the supervisor would otherwise restart it for ever. */
#include "gateway/config/config_internal.h"
#include "routing/region.h"
#include "runtime/engine_opts.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CFG_MAX_WORKERS 256
#define CFG_MAX_DEVICES 64

/* A worker's keys: model, name and devices place it; the rest are its
 * command's options (parse_worker_options). */
enum {
    K_MODEL,
    K_NAME,
    K_DEVICES,
    K_KV_TYPE,
    K_CHAT,
    K_PREFIX,
    K_POWER,   /* the gateway's, not the engine's: energy estimates */
    K_THREADS, /* the numbers from here on */
    K_KV,
    K_SEQS,
    K_BATCH,
    K_QUEUE,
    K_BATCH_WAIT,
    K_PROMPT_WAIT,
    K_N
};
/* The engine's options: keys, ranges and defaults from the runtime's table
 * (runtime/engine_opts.h), which the worker command's flags read too. */
static const rt_eopt opt[K_N] = {
    [K_KV_TYPE] = RT_EOPT_KV_TYPE, [K_CHAT] = RT_EOPT_CHAT_TEMPLATE, [K_PREFIX] = RT_EOPT_PREFIX_CACHE,
    [K_THREADS] = RT_EOPT_THREADS, [K_KV] = RT_EOPT_KV_CACHE_MB,
    [K_SEQS] = RT_EOPT_MAX_SEQS,   [K_BATCH] = RT_EOPT_MAX_BATCH_TOKENS,
    [K_QUEUE] = RT_EOPT_MAX_QUEUE, [K_BATCH_WAIT] = RT_EOPT_BATCH_MAX_WAIT_MS,
    [K_PROMPT_WAIT] = RT_EOPT_PROMPT_MAX_WAIT_MS};

static const char *key_of(int k)
{
    static const char *const placing[K_KV_TYPE] = {"model", "name", "devices"};
    if (k == K_POWER)
        return "power_watts";
    return k < K_KV_TYPE ? placing[k] : rt_eopt_defs[opt[k]].key;
}

/* ---- the worker command's options ---- */

/* The defaults `infergate worker` takes, which the supervisor runs with
 * these values. */
static void worker_options_default(gw_worker_cfg *w)
{
    const rt_eopt_def *d = rt_eopt_defs;
    w->threads = (int)d[RT_EOPT_THREADS].dflt;
    w->kv_cache_mb = (int)d[RT_EOPT_KV_CACHE_MB].dflt;
    w->kv_q8_0 = rt_eopt_kv_type(d[RT_EOPT_KV_TYPE].dflt) == KN_TYPE_Q8_0;
    w->max_seqs = (int)d[RT_EOPT_MAX_SEQS].dflt;
    w->max_batch_tokens = (int)d[RT_EOPT_MAX_BATCH_TOKENS].dflt;
    w->max_queue = (int)d[RT_EOPT_MAX_QUEUE].dflt;
    w->batch_max_wait_ms = (int)d[RT_EOPT_BATCH_MAX_WAIT_MS].dflt;
    w->prompt_max_wait_ms = (int)d[RT_EOPT_PROMPT_MAX_WAIT_MS].dflt;
    w->prefix_cache = d[RT_EOPT_PREFIX_CACHE].dflt != 0;
}

/* kv_type, chat_template and the numbers, after the devices (q8_0 is for
 * CPU workers only). */
static int parse_worker_options(cfg_parser *p, const yaml_node_t *n, const char *path, yaml_node_t *const *v,
                                gw_worker_cfg *w)
{
    char kp[CFG_PATH_MAX], range[512];
    int rc;
    if (v[K_KV_TYPE]) {
        char *t = NULL;
        gw_cfg_path_key(kp, path, "kv_type");
        if ((rc = gw_cfg_str(p, v[K_KV_TYPE], kp, &t)))
            return rc;
        int kv = rt_eopt_lookup(RT_EOPT_KV_TYPE, t);
        bool q8 = rt_eopt_kv_type(kv) == KN_TYPE_Q8_0;
        free(t);
        if (kv < 0)
            return gw_cfg_perr(p, v[K_KV_TYPE], kp, "%s", rt_eopt_range(RT_EOPT_KV_TYPE, range, sizeof(range)));
        /* the CUDA cache is halves only: a GPU worker would refuse to start */
        for (int i = 0; q8 && i < w->n_devices; i++)
            if (strcmp(w->devices[i], "cpu") != 0)
                return gw_cfg_perr(p, v[K_KV_TYPE], kp, "q8_0 is for CPU workers, and device %s is not one",
                                   w->devices[i]);
        w->kv_q8_0 = q8;
    }
    if (v[K_CHAT]) {
        gw_cfg_path_key(kp, path, "chat_template");
        if ((rc = gw_cfg_str(p, v[K_CHAT], kp, &w->chat_template)))
            return rc;
        bool file = rt_eopt_lookup(RT_EOPT_CHAT_TEMPLATE, w->chat_template) < 0 &&
                    rt_eopt_is_template_path(w->chat_template);
        if (!file && rt_eopt_lookup(RT_EOPT_CHAT_TEMPLATE, w->chat_template) < 0)
            return gw_cfg_perr(p, v[K_CHAT], kp, "%s; or a Jinja file's path (with a '/' or ending in .jinja)",
                               rt_eopt_range(RT_EOPT_CHAT_TEMPLATE, range, sizeof(range)));
        /* the worker parses it; a file that cannot be read is this file's error */
        if (file && access(w->chat_template, R_OK) != 0)
            return gw_cfg_perr(p, v[K_CHAT], kp, "%s: %s", w->chat_template, strerror(errno));
    }
    if (v[K_PREFIX] && (rc = gw_cfg_bool(p, v[K_PREFIX], (gw_cfg_path_key(kp, path, key_of(K_PREFIX)), kp),
                                         &w->prefix_cache)))
        return rc;
    if (v[K_POWER] && (rc = gw_cfg_num(p, v[K_POWER], (gw_cfg_path_key(kp, path, "power_watts"), kp), 1e6,
                                       &w->power_watts)))
        return rc;
    int *ints[K_N] = {
        [K_THREADS] = &w->threads,        [K_KV] = &w->kv_cache_mb,  [K_SEQS] = &w->max_seqs,
        [K_BATCH] = &w->max_batch_tokens, [K_QUEUE] = &w->max_queue, [K_BATCH_WAIT] = &w->batch_max_wait_ms,
        [K_PROMPT_WAIT] = &w->prompt_max_wait_ms};
    for (int k = K_THREADS; k < K_N; k++) {
        long long x;
        if (!v[k])
            continue;
        const rt_eopt_def *d = &rt_eopt_defs[opt[k]];
        if ((rc = gw_cfg_int(p, v[k], (gw_cfg_path_key(kp, path, key_of(k)), kp), d->min, d->max, &x)))
            return rc;
        *ints[k] = (int)x;
    }
    /* The worker refuses to start otherwise (each step must fit a token of
     * every running sequence), and the supervisor would restart it forever. */
    if (w->max_batch_tokens < w->max_seqs)
        return gw_cfg_perr(p,
                           v[K_BATCH]  ? v[K_BATCH]
                           : v[K_SEQS] ? v[K_SEQS]
                                       : n,
                           path, "max_batch_tokens (%d) must be at least max_seqs (%d)", w->max_batch_tokens,
                           w->max_seqs);
    return 0;
}

/* ---- placement: model, name, devices ---- */

static char *default_model_name(const char *model)
{
    const char *base = strrchr(model, '/');
    base = base ? base + 1 : model;
    size_t n = strlen(base);
    if (n > 5 && !strcmp(base + n - 5, ".gguf"))
        n -= 5;
    if (n == 0) /* "dir/" */
        return strdup(model);
    return strndup(base, n);
}

/* A model name travels in region records (a comma-separated list of at
 * most ROUTE_NAME_MAX - 1 bytes each), response bodies and metric labels:
 * NULL when it fits all of them, else why not. */
static const char *model_name_why(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= ROUTE_NAME_MAX)
        return "must be 1 to 63 bytes";
    for (size_t i = 0; i < n; i++)
        if (s[i] <= ' ' || s[i] >= 0x7f || strchr(",\"\\", s[i]))
            return "must be printable ASCII without spaces, commas, quotes or backslashes";
    return NULL;
}

/* What CUDA_VISIBLE_DEVICES takes (an index, a GPU or MIG UUID), or ours. */
static bool device_name_ok(const char *d)
{
    if (!strcmp(d, "cpu") || !strcmp(d, "auto") || !strncmp(d, "GPU-", 4) || !strncmp(d, "MIG-", 4))
        return true;
    return strlen(d) <= 4 && strspn(d, "0123456789") == strlen(d);
}

static int parse_model(cfg_parser *p, const yaml_node_t *n, const char *path, yaml_node_t *const *v,
                       gw_worker_cfg *w)
{
    char kp[CFG_PATH_MAX];
    int rc;
    if (!v[K_MODEL])
        return gw_cfg_perr(p, n, (gw_cfg_path_key(kp, path, "model"), kp), "required");
    if ((rc = gw_cfg_str(p, v[K_MODEL], (gw_cfg_path_key(kp, path, "model"), kp), &w->model)))
        return rc;
    if (v[K_NAME]) {
        if ((rc = gw_cfg_str(p, v[K_NAME], (gw_cfg_path_key(kp, path, "name"), kp), &w->name)))
            return rc;
    } else if (!(w->name = default_model_name(w->model))) {
        return -ENOMEM;
    }
    const char *why = model_name_why(w->name);
    if (why && v[K_NAME])
        return gw_cfg_perr(p, v[K_NAME], (gw_cfg_path_key(kp, path, "name"), kp), "%s", why);
    if (why)
        return gw_cfg_perr(p, v[K_MODEL], (gw_cfg_path_key(kp, path, "model"), kp),
                           "the model name taken from the file name, '%s', %s: set name", w->name, why);
    return 0;
}

static int default_devices(gw_worker_cfg *w)
{
    if (!(w->devices = calloc(1, sizeof(*w->devices))) || !(w->devices[0] = strdup("cpu")))
        return -ENOMEM;
    w->n_devices = 1;
    return 0;
}

static int parse_devices(cfg_parser *p, const yaml_node_t *n, const char *path, gw_worker_cfg *w)
{
    char kp[CFG_PATH_MAX];
    gw_cfg_path_key(kp, path, "devices");
    int rc = gw_cfg_str_list(p, n, kp, CFG_MAX_DEVICES, &w->devices, &w->n_devices);
    if (rc)
        return rc;
    if (w->n_devices == 0)
        return gw_cfg_perr(p, n, kp, "needs at least one device (cpu, auto, or a GPU/MIG UUID)");
    for (int i = 0; i < w->n_devices; i++) {
        char dp[CFG_PATH_MAX];
        gw_cfg_path_idx(dp, kp, i);
        const char *d = w->devices[i];
        /* Goes into CUDA_VISIBLE_DEVICES, where a comma would name two. */
        if (strpbrk(d, ", \t"))
            return gw_cfg_perr(p, n, dp, "one device per entry, without commas or spaces");
        /* anything but "cpu" becomes a GPU worker's CUDA_VISIBLE_DEVICES:
         * a typo ("CPU", "gpu") would be restarted for ever */
        if (!device_name_ok(d))
            return gw_cfg_perr(p, n, dp, "'%s' is not a device: cpu, auto, a GPU index, or a GPU-/MIG- UUID",
                               d);
        if (!strcmp(d, "auto") && w->n_devices > 1)
            return gw_cfg_perr(p, n, dp, "auto stands alone: it means every GPU found");
        /* A GPU serves one worker; the CPU may run several (each with
         * its own threads), e.g. to survive one crashing. */
        for (int j = 0; j < i && strcmp(d, "cpu"); j++)
            if (!strcmp(w->devices[j], d))
                return gw_cfg_perr(p, n, dp, "device %s is listed twice", d);
    }
    return 0;
}

/* ---- the section ---- */

static int parse_worker(cfg_parser *p, const yaml_node_t *n, const char *path, gw_worker_cfg *w)
{
    yaml_node_t *v[K_N];
    const char *keys[K_N];
    for (int k = 0; k < K_N; k++)
        keys[k] = key_of(k);
    int rc = gw_cfg_map_take(p, n, path, keys, K_N, v);
    if (rc || (rc = parse_model(p, n, path, v, w)))
        return rc;
    if ((rc = v[K_DEVICES] ? parse_devices(p, v[K_DEVICES], path, w) : default_devices(w)))
        return rc;
    return parse_worker_options(p, n, path, v, w);
}

int gw_cfg_parse_workers(cfg_parser *p, const yaml_node_t *n, gw_config *c)
{
    int len, rc = gw_cfg_seq_take(p, n, "workers", CFG_MAX_WORKERS, &len);
    if (rc)
        return rc;
    if (len == 0)
        return gw_cfg_perr(p, n, "workers", "needs at least one worker (leave the key out for the default)");
    if (!(c->workers = calloc((size_t)len, sizeof(*c->workers))))
        return -ENOMEM;
    for (int i = 0; i < len; i++) {
        char ip[CFG_PATH_MAX];
        yaml_node_t *it;
        gw_cfg_path_idx(ip, "workers", i);
        worker_options_default(&c->workers[i]);
        c->n_workers = i + 1;
        if ((rc = gw_cfg_seq_item(p, n, i, ip, &it)) || (rc = parse_worker(p, it, ip, &c->workers[i])))
            return rc;
    }
    return 0;
}

static void worker_dispose(gw_worker_cfg *w)
{
    free(w->model);
    free(w->name);
    free(w->chat_template);
    gw_cfg_free_str_list(w->devices, w->n_devices);
}

void gw_cfg_workers_free(gw_config *c)
{
    for (int i = 0; i < c->n_workers; i++)
        worker_dispose(&c->workers[i]);
    free(c->workers);
}

int gw_config_default_worker(gw_config *c, const char *demo_model)
{
    if (c->n_workers)
        return 0;
    gw_worker_cfg *w = calloc(1, sizeof(*w));
    if (!w)
        return -ENOMEM;
    worker_options_default(w);
    if (!(w->model = strdup(demo_model)) || !(w->name = default_model_name(demo_model)) ||
        default_devices(w)) {
        worker_dispose(w);
        free(w);
        return -ENOMEM;
    }
    free(c->workers);
    c->workers = w;
    c->n_workers = 1;
    return 0;
}
