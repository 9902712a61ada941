/* Gateway configuration (see config.h): the YAML file is loaded with
 * libyaml's document API, then walked against the schema. The walk is
 * strict — unknown keys, duplicate keys, wrong types and out-of-range values
 * are errors — because a misspelt limit that silently keeps its default is
 * worse than a gateway that refuses to start. Nothing is returned unless the
 * whole file is valid. */
#include "gateway/config/config.h"
#include "gateway/cmd/cli.h"
#include "gateway/config/config_internal.h"
#include "runtime/engine_opts.h"
#include "routing/region.h"

#include <yaml.h>

#include <openssl/evp.h>

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>

/* A config file is written by hand; anything this big is a mistake. */
#define CFG_MAX_FILE (16u << 20)
#define CFG_MAX_LISTEN 64
#define CFG_MAX_PEER_NAMES 64
#define CFG_MAX_WORKERS 256
#define CFG_MAX_DEVICES 64
#define CFG_MAX_TENANTS 65536
#define CFG_MAX_KEYS 64
#define CFG_MAX_MODELS 256
/* Leaves room in sun_path (108 bytes) for the worker socket names. */
#define CFG_RUNTIME_DIR_MAX 80

/* ---- errors and paths ---- */

int gw_cfg_perr(cfg_parser *p, const yaml_node_t *n, const char *path, const char *fmt, ...)
{
    char why[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    snprintf(p->err, p->err_len, "%s:%lu: %s: %s", p->file, n ? (unsigned long)n->start_mark.line + 1 : 1ul,
             path && *path ? path : "(top level)", why);
    return -EINVAL;
}

/* Key paths are for messages: a deep path is cut short, never overrun. */
void gw_cfg_path_key(char *out, const char *parent, const char *key)
{
    int n = *parent ? snprintf(out, CFG_PATH_MAX, "%s.%.64s", parent, key)
                    : snprintf(out, CFG_PATH_MAX, "%.64s", key);
    if (n >= CFG_PATH_MAX)
        out[CFG_PATH_MAX - 1] = '\0';
}

void gw_cfg_path_idx(char *out, const char *parent, int i)
{
    if (snprintf(out, CFG_PATH_MAX, "%s[%d]", parent, i) >= CFG_PATH_MAX)
        out[CFG_PATH_MAX - 1] = '\0';
}

/* ---- node access ---- */

/* The node at `index`, visited at most once: the schema is a tree, and
 * refusing aliases keeps a small file from expanding into a huge config (or
 * a cycle, which libyaml's loader can build from `&a [*a]`). */
static int node_take(cfg_parser *p, int index, const yaml_node_t *parent, const char *path, yaml_node_t **out)
{
    yaml_node_t *n = yaml_document_get_node(p->doc, index);
    if (!n)
        return gw_cfg_perr(p, parent, path, "missing node");
    size_t i = (size_t)(n - p->doc->nodes.start);
    if (p->used[i])
        return gw_cfg_perr(p, parent, path, "YAML aliases (*name) are not supported");
    /* libyaml gives untagged nodes the core tags; any other (!env NAME,
     * say) would be taken for its plain text */
    if (n->tag && strncmp((const char *)n->tag, "tag:yaml.org,2002:", 18))
        return gw_cfg_perr(p, n, path, "YAML tags (%s) are not supported", (const char *)n->tag);
    p->used[i] = 1;
    *out = n;
    return 0;
}

static bool is_null(const yaml_node_t *n)
{
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    const char *v = (const char *)n->data.scalar.value;
    return !strcmp(v, "") || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") ||
           !strcmp(v, "NULL");
}

static const char *node_kind(const yaml_node_t *n)
{
    if (n->type == YAML_MAPPING_NODE)
        return "a map";
    if (n->type == YAML_SEQUENCE_NODE)
        return "a list";
    if (is_null(n))
        return "empty";
    return n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE ? "a plain value" : "a quoted string";
}

/* A map with the given keys: vals[k] is the value of keys[k], or NULL.
 * Unknown and repeated keys are errors at the key's own line. */
int gw_cfg_map_take(cfg_parser *p, const yaml_node_t *map, const char *path, const char *const *keys,
                    int n_keys, yaml_node_t **vals)
{
    if (map->type != YAML_MAPPING_NODE)
        return gw_cfg_perr(p, map, path, "must be a map, not %s", node_kind(map));
    for (int k = 0; k < n_keys; k++)
        vals[k] = NULL;
    for (yaml_node_pair_t *pr = map->data.mapping.pairs.start; pr < map->data.mapping.pairs.top; pr++) {
        yaml_node_t *kn, *vn;
        int rc = node_take(p, pr->key, map, path, &kn);
        if (rc)
            return rc;
        if (kn->type != YAML_SCALAR_NODE)
            return gw_cfg_perr(p, kn, path, "keys must be plain names, not %s", node_kind(kn));
        const char *name = (const char *)kn->data.scalar.value;
        char kpath[CFG_PATH_MAX];
        gw_cfg_path_key(kpath, path, name);
        int k = 0;
        while (k < n_keys && (strlen(keys[k]) != kn->data.scalar.length || strcmp(keys[k], name)))
            k++;
        if (k == n_keys)
            return gw_cfg_perr(p, kn, kpath, "unknown key");
        if (vals[k])
            return gw_cfg_perr(p, kn, kpath, "duplicate key");
        if ((rc = node_take(p, pr->value, kn, kpath, &vn)))
            return rc;
        vals[k] = vn;
    }
    return 0;
}

int gw_cfg_seq_take(cfg_parser *p, const yaml_node_t *n, const char *path, int max, int *count)
{
    if (n->type != YAML_SEQUENCE_NODE)
        return gw_cfg_perr(p, n, path, "must be a list, not %s", node_kind(n));
    ptrdiff_t len = n->data.sequence.items.top - n->data.sequence.items.start;
    if (len > max)
        return gw_cfg_perr(p, n, path, "too many entries (at most %d)", max);
    *count = (int)len;
    return 0;
}

int gw_cfg_seq_item(cfg_parser *p, const yaml_node_t *seq, int i, const char *path, yaml_node_t **out)
{
    return node_take(p, seq->data.sequence.items.start[i], seq, path, out);
}

/* A non-empty string without control characters. */
int gw_cfg_str(cfg_parser *p, const yaml_node_t *n, const char *path, char **out)
{
    if (n->type != YAML_SCALAR_NODE || is_null(n))
        return gw_cfg_perr(p, n, path, "must be a string, not %s", node_kind(n));
    const unsigned char *v = n->data.scalar.value;
    size_t len = n->data.scalar.length;
    /* a quoted '' names no file, no device and no password */
    if (len == 0)
        return gw_cfg_perr(p, n, path, "must not be empty");
    for (size_t i = 0; i < len; i++)
        if (v[i] < 0x20 || v[i] == 0x7f)
            return gw_cfg_perr(p, n, path, "control characters are not allowed");
    char *s = malloc(len + 1);
    if (!s)
        return -ENOMEM;
    memcpy(s, v, len);
    s[len] = '\0';
    free(*out);
    *out = s;
    return 0;
}

/* Numbers are plain scalars: a quoted "10" is a string in YAML, and taking
 * it as a number would hide a templating mistake. */
static int plain_scalar(cfg_parser *p, const yaml_node_t *n, const char *path, const char *want)
{
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE || is_null(n))
        return gw_cfg_perr(p, n, path, "must be %s, not %s", want, node_kind(n));
    return 0;
}

int gw_cfg_int(cfg_parser *p, const yaml_node_t *n, const char *path, long long min, long long max,
               long long *out)
{
    int rc = plain_scalar(p, n, path, "a whole number");
    if (rc)
        return rc;
    const char *v = (const char *)n->data.scalar.value;
    const char *d = v + (*v == '-');
    bool digits = *d != '\0';
    for (const char *c = d; *c; c++)
        digits = digits && *c >= '0' && *c <= '9';
    /* YAML 1.1 reads 010 as octal 8, YAML 1.2 as 10: neither is assumed */
    if (digits && d[0] == '0' && d[1] != '\0')
        return gw_cfg_perr(p, n, path, "must be a whole number without leading zeros");
    char *end;
    errno = 0;
    long long x = digits ? strtoll(v, &end, 10) : 0;
    if (!digits || errno || *end || x < min || x > max)
        return gw_cfg_perr(p, n, path, "must be a whole number from %lld to %lld", min, max);
    *out = x;
    return 0;
}

int gw_cfg_num(cfg_parser *p, const yaml_node_t *n, const char *path, double max, double *out)
{
    int rc = plain_scalar(p, n, path, "a number");
    if (rc)
        return rc;
    const char *v = (const char *)n->data.scalar.value;
    /* strtod also takes hex, "inf" and "nan"; a config value is decimal. */
    bool ok = strspn(v, "0123456789.eE+-") == strlen(v);
    char *end;
    errno = 0;
    double x = ok ? strtod(v, &end) : 0;
    if (!ok || errno || *end || !isfinite(x) || x < 0 || x > max)
        return gw_cfg_perr(p, n, path, "must be a number from 0 to %g", max);
    *out = x;
    return 0;
}

int gw_cfg_bool(cfg_parser *p, const yaml_node_t *n, const char *path, bool *out)
{
    int rc = plain_scalar(p, n, path, "true or false");
    if (rc)
        return rc;
    const char *v = (const char *)n->data.scalar.value;
    if (!strcmp(v, "true") || !strcmp(v, "True") || !strcmp(v, "TRUE"))
        *out = true;
    else if (!strcmp(v, "false") || !strcmp(v, "False") || !strcmp(v, "FALSE"))
        *out = false;
    else
        return gw_cfg_perr(p, n, path, "must be true or false");
    return 0;
}

/* A list of strings (each checked by gw_cfg_str). */
int gw_cfg_str_list(cfg_parser *p, const yaml_node_t *n, const char *path, int max, char ***out, int *count)
{
    int len, rc = gw_cfg_seq_take(p, n, path, max, &len);
    if (rc)
        return rc;
    char **v = calloc(len ? (size_t)len : 1, sizeof(*v));
    if (!v)
        return -ENOMEM;
    *out = v;
    *count = 0;
    for (int i = 0; i < len; i++) {
        char ipath[CFG_PATH_MAX];
        yaml_node_t *it;
        gw_cfg_path_idx(ipath, path, i);
        if ((rc = gw_cfg_seq_item(p, n, i, ipath, &it)) || (rc = gw_cfg_str(p, it, ipath, &v[i])))
            return rc;
        *count = i + 1;
    }
    return 0;
}

void gw_cfg_free_str_list(char **v, int n)
{
    for (int i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

/* ---- listen ---- */

/* HOST:PORT (numeric IPv4), [IPv6]:PORT or unix:/abs/path. *loopback is
 * set for 127/8, ::1 and Unix sockets. NULL when valid, else why not. */
const char *gw_cfg_check_address(const char *s, bool *loopback)
{
    if (!strncmp(s, "unix:", 5)) {
        struct sockaddr_un sun;
        if (s[5] != '/')
            return "unix: needs an absolute path (unix:/run/infergate.sock)";
        if (strlen(s + 5) >= sizeof(sun.sun_path))
            return "Unix socket path too long";
        *loopback = true;
        return NULL;
    }
    char host[INET6_ADDRSTRLEN + 1];
    const char *port;
    bool v6 = s[0] == '[';
    if (v6) {
        const char *end = strchr(s, ']');
        if (!end || end[1] != ':' || (size_t)(end - s - 1) >= sizeof(host))
            return "want HOST:PORT, [IPV6]:PORT or unix:/PATH";
        memcpy(host, s + 1, (size_t)(end - s - 1));
        host[end - s - 1] = '\0';
        port = end + 2;
    } else {
        const char *colon = strrchr(s, ':');
        if (!colon || (size_t)(colon - s) >= sizeof(host))
            return "want HOST:PORT, [IPV6]:PORT or unix:/PATH";
        memcpy(host, s, (size_t)(colon - s));
        host[colon - s] = '\0';
        port = colon + 1;
    }
    size_t nd = strspn(port, "0123456789");
    if (nd == 0 || nd > 5 || port[nd] || atol(port) > 65535)
        return "port must be a number from 0 to 65535";
    if (v6) {
        struct in6_addr a;
        if (inet_pton(AF_INET6, host, &a) != 1)
            return "not a numeric IPv6 address";
        *loopback = IN6_IS_ADDR_LOOPBACK(&a);
    } else {
        struct in_addr a;
        /* Numeric only: resolving a name would block, and could change. */
        if (inet_pton(AF_INET, host, &a) != 1)
            return "HOST must be a numeric IPv4 address, or [IPv6]";
        *loopback = (ntohl(a.s_addr) >> 24) == 127;
    }
    return NULL;
}

static int parse_listen_one(cfg_parser *p, const yaml_node_t *n, const char *path, gw_listen_cfg *l,
                            bool open_auth)
{
    static const char *const keys[] = {"address", "tls"};
    static const char *const tls_keys[] = {"cert", "key", "client_ca", "peer_names"};
    yaml_node_t *v[2], *t[4];
    char kp[CFG_PATH_MAX];
    int rc = gw_cfg_map_take(p, n, path, keys, 2, v);
    if (rc)
        return rc;
    if (!v[0])
        return gw_cfg_perr(p, n, (gw_cfg_path_key(kp, path, "address"), kp), "required");
    gw_cfg_path_key(kp, path, "address");
    if ((rc = gw_cfg_str(p, v[0], kp, &l->address)))
        return rc;
    bool loopback = false;
    const char *why = gw_cfg_check_address(l->address, &loopback);
    if (why)
        return gw_cfg_perr(p, v[0], kp, "%s", why);
    if (!loopback && open_auth)
        return gw_cfg_perr(p, v[0], kp,
                           "not a loopback address, and no tenants are configured: without API keys the "
                           "gateway only listens on 127.0.0.1, [::1] or a Unix socket");
    if (v[1]) {
        char tp[CFG_PATH_MAX];
        gw_cfg_path_key(tp, path, "tls");
        if ((rc = gw_cfg_map_take(p, v[1], tp, tls_keys, 4, t)))
            return rc;
        if (!t[0] != !t[1])
            return gw_cfg_perr(p, v[1], tp, "cert and key go together: give both, or neither for cleartext");
        if (t[2] && !t[0])
            return gw_cfg_perr(p, t[2], (gw_cfg_path_key(kp, tp, "client_ca"), kp),
                               "client certificates need TLS: give cert and key too");
        if (t[2] && (rc = gw_cfg_str(p, t[2], (gw_cfg_path_key(kp, tp, "client_ca"), kp), &l->tls_client_ca)))
            return rc;
        if (t[3]) {
            gw_cfg_path_key(kp, tp, "peer_names");
            if (!t[2])
                return gw_cfg_perr(p, t[3], kp,
                                   "peer names are checked on certificates from client_ca: give it too");
            if ((rc = gw_cfg_str_list(p, t[3], kp, CFG_MAX_PEER_NAMES, &l->tls_peer_names,
                                      &l->n_tls_peer_names)))
                return rc;
            /* an empty list would pin nothing; a name that is a pattern
             * (".example.com" to OpenSSL means every subdomain) would
             * take more than it names */
            if (l->n_tls_peer_names == 0)
                return gw_cfg_perr(p, t[3], kp, "give at least one name, or leave peer_names out");
            for (int i = 0; i < l->n_tls_peer_names; i++) {
                const char *nm = l->tls_peer_names[i];
                if (strlen(nm) > 253 || nm[0] == '.' || strchr(nm, '*'))
                    return gw_cfg_perr(
                        p, t[3], kp,
                        "peer_names[%d]: a name of 1 to 253 bytes, not a pattern (no leading '.', "
                        "no '*')",
                        i);
            }
        }
        if (t[0] && ((rc = gw_cfg_str(p, t[0], (gw_cfg_path_key(kp, tp, "cert"), kp), &l->tls_cert)) ||
                     (rc = gw_cfg_str(p, t[1], (gw_cfg_path_key(kp, tp, "key"), kp), &l->tls_key))))
            return rc;
    }
    return 0;
}

static int parse_listen(cfg_parser *p, const yaml_node_t *n, gw_config *c)
{
    int len, rc = gw_cfg_seq_take(p, n, "listen", CFG_MAX_LISTEN, &len);
    if (rc)
        return rc;
    if (len == 0)
        return gw_cfg_perr(p, n, "listen", "needs at least one address");
    if (!(c->listen = calloc((size_t)len, sizeof(*c->listen))))
        return -ENOMEM;
    for (int i = 0; i < len; i++) {
        char ip[CFG_PATH_MAX];
        yaml_node_t *it;
        gw_cfg_path_idx(ip, "listen", i);
        c->n_listen = i + 1;
        if ((rc = gw_cfg_seq_item(p, n, i, ip, &it)) ||
            (rc = parse_listen_one(p, it, ip, &c->listen[i], !c->n_tenants)))
            return rc;
        for (int j = 0; j < i; j++) {
            if (strcmp(c->listen[j].address, c->listen[i].address))
                continue;
            char ap[CFG_PATH_MAX];
            gw_cfg_path_key(ap, ip, "address");
            return gw_cfg_perr(p, it, ap, "%s is already listen[%d]", c->listen[i].address, j);
        }
    }
    return 0;
}

/* ---- workers ---- */

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

static int parse_worker(cfg_parser *p, const yaml_node_t *n, const char *path, gw_worker_cfg *w)
{
    enum {
        K_MODEL,
        K_NAME,
        K_DEVICES,
        K_KV_TYPE,
        K_CHAT,
        K_THREADS, /* the numbers from here on */
        K_KV,
        K_SEQS,
        K_BATCH,
        K_QUEUE,
        K_BATCH_WAIT,
        K_N
    };
    /* The engine's options: keys, ranges and defaults from the runtime's
     * table, which the worker command's flags read too. */
    static const rt_eopt opt[K_N] = {
        [K_KV_TYPE] = RT_EOPT_KV_TYPE, [K_CHAT] = RT_EOPT_CHAT_TEMPLATE,
        [K_THREADS] = RT_EOPT_THREADS, [K_KV] = RT_EOPT_KV_CACHE_MB,
        [K_SEQS] = RT_EOPT_MAX_SEQS,   [K_BATCH] = RT_EOPT_MAX_BATCH_TOKENS,
        [K_QUEUE] = RT_EOPT_MAX_QUEUE, [K_BATCH_WAIT] = RT_EOPT_BATCH_MAX_WAIT_MS};
    const char *keys[K_N] = {"model", "name", "devices"};
    for (int k = K_KV_TYPE; k < K_N; k++)
        keys[k] = rt_eopt_defs[opt[k]].key;
    char range[512];
    yaml_node_t *v[K_N];
    char kp[CFG_PATH_MAX];
    int rc = gw_cfg_map_take(p, n, path, keys, K_N, v);
    if (rc)
        return rc;
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
    if (v[K_DEVICES]) {
        gw_cfg_path_key(kp, path, "devices");
        if ((rc = gw_cfg_str_list(p, v[K_DEVICES], kp, CFG_MAX_DEVICES, &w->devices, &w->n_devices)))
            return rc;
        if (w->n_devices == 0)
            return gw_cfg_perr(p, v[K_DEVICES], kp,
                               "needs at least one device (cpu, auto, or a GPU/MIG UUID)");
        for (int i = 0; i < w->n_devices; i++) {
            char dp[CFG_PATH_MAX];
            gw_cfg_path_idx(dp, kp, i);
            const char *d = w->devices[i];
            /* Goes into CUDA_VISIBLE_DEVICES, where a comma would name two. */
            if (strpbrk(d, ", \t"))
                return gw_cfg_perr(p, v[K_DEVICES], dp, "one device per entry, without commas or spaces");
            /* anything but "cpu" becomes a GPU worker's CUDA_VISIBLE_DEVICES:
             * a typo ("CPU", "gpu") would be restarted for ever */
            if (!device_name_ok(d))
                return gw_cfg_perr(p, v[K_DEVICES], dp,
                                   "'%s' is not a device: cpu, auto, a GPU index, or a GPU-/MIG- UUID", d);
            if (!strcmp(d, "auto") && w->n_devices > 1)
                return gw_cfg_perr(p, v[K_DEVICES], dp, "auto stands alone: it means every GPU found");
            /* A GPU serves one worker; the CPU may run several (each with
             * its own threads), e.g. to survive one crashing. */
            for (int j = 0; j < i && strcmp(d, "cpu"); j++)
                if (!strcmp(w->devices[j], d))
                    return gw_cfg_perr(p, v[K_DEVICES], dp, "device %s is listed twice", d);
        }
    } else {
        if (!(w->devices = calloc(1, sizeof(*w->devices))) || !(w->devices[0] = strdup("cpu")))
            return -ENOMEM;
        w->n_devices = 1;
    }
    if (v[K_KV_TYPE]) {
        char *t = NULL;
        gw_cfg_path_key(kp, path, "kv_type");
        if ((rc = gw_cfg_str(p, v[K_KV_TYPE], kp, &t)))
            return rc;
        int kv = rt_eopt_lookup(RT_EOPT_KV_TYPE, t);
        bool q8 = rt_eopt_kv_type(kv) == KN_TYPE_Q8_0;
        free(t);
        if (kv < 0)
            return gw_cfg_perr(p, v[K_KV_TYPE], kp, "%s",
                               rt_eopt_range(RT_EOPT_KV_TYPE, range, sizeof(range)));
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
        if (rt_eopt_lookup(RT_EOPT_CHAT_TEMPLATE, w->chat_template) < 0)
            return gw_cfg_perr(p, v[K_CHAT], kp, "%s",
                               rt_eopt_range(RT_EOPT_CHAT_TEMPLATE, range, sizeof(range)));
    }
    int *ints[K_N] = {
        [K_THREADS] = &w->threads,        [K_KV] = &w->kv_cache_mb,  [K_SEQS] = &w->max_seqs,
        [K_BATCH] = &w->max_batch_tokens, [K_QUEUE] = &w->max_queue, [K_BATCH_WAIT] = &w->batch_max_wait_ms};
    for (int k = K_THREADS; k < K_N; k++) {
        long long x;
        if (!v[k])
            continue;
        const rt_eopt_def *d = &rt_eopt_defs[opt[k]];
        if ((rc = gw_cfg_int(p, v[k], (gw_cfg_path_key(kp, path, keys[k]), kp), d->min, d->max, &x)))
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

static void worker_defaults(gw_worker_cfg *w)
{
    const rt_eopt_def *d = rt_eopt_defs;
    w->threads = (int)d[RT_EOPT_THREADS].dflt;
    w->kv_cache_mb = (int)d[RT_EOPT_KV_CACHE_MB].dflt;
    w->kv_q8_0 = rt_eopt_kv_type(d[RT_EOPT_KV_TYPE].dflt) == KN_TYPE_Q8_0;
    w->max_seqs = (int)d[RT_EOPT_MAX_SEQS].dflt;
    w->max_batch_tokens = (int)d[RT_EOPT_MAX_BATCH_TOKENS].dflt;
    w->max_queue = (int)d[RT_EOPT_MAX_QUEUE].dflt;
    w->batch_max_wait_ms = (int)d[RT_EOPT_BATCH_MAX_WAIT_MS].dflt;
}

static int parse_workers(cfg_parser *p, const yaml_node_t *n, gw_config *c)
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
        worker_defaults(&c->workers[i]);
        c->n_workers = i + 1;
        if ((rc = gw_cfg_seq_item(p, n, i, ip, &it)) || (rc = parse_worker(p, it, ip, &c->workers[i])))
            return rc;
    }
    return 0;
}

/* ---- tenants ---- */

static int hexval(int ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

static int parse_key_hash(cfg_parser *p, const yaml_node_t *n, const char *path, uint8_t out[32])
{
    if (n->type != YAML_SCALAR_NODE || is_null(n))
        return gw_cfg_perr(p, n, path, "must be a string, not %s", node_kind(n));
    const char *v = (const char *)n->data.scalar.value;
    /* Never echo the value: it may be a secret pasted in the wrong place. */
    if (!strncmp(v, "ig-", 3))
        return gw_cfg_perr(p, n, path,
                           "this is a key, not its hash: put the output of `infergate key hash KEY` here");
    bool ok = n->data.scalar.length == 64;
    for (int i = 0; ok && i < 32; i++) {
        int hi = hexval(v[2 * i]), lo = hexval(v[2 * i + 1]);
        ok = hi >= 0 && lo >= 0;
        out[i] = (uint8_t)(ok ? hi << 4 | lo : 0);
    }
    if (!ok)
        return gw_cfg_perr(p, n, path,
                           "must be a SHA-256 hash: 64 hex characters (`infergate key new` prints one)");
    return 0;
}

/* "-" alone is the metrics' and the log's name for no tenant. */
static bool valid_tenant_name(const char *s)
{
    size_t n = strlen(s);
    return n >= 1 && n <= GW_TENANT_NAME_MAX && strcmp(s, "-") != 0 &&
           strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") == n;
}

static int parse_tenant(cfg_parser *p, const yaml_node_t *n, const char *path, gw_tenant_cfg *t)
{
    enum {
        K_NAME,
        K_KEYS,
        K_MODELS,
        K_RPS,
        K_TPM,
        K_ADMIN,
        K_RESIDENCY,
        K_POLICY,
        K_SLO,
        K_PRICE,
        K_PRIO,
        K_N
    };
    static const char *const keys[K_N] = {"name",      "keys",   "models", "rps",       "tpm",     "admin",
                                          "residency", "policy", "slo_ms", "max_price", "priority"};
    yaml_node_t *v[K_N];
    char kp[CFG_PATH_MAX];
    int rc = gw_cfg_map_take(p, n, path, keys, K_N, v);
    if (rc)
        return rc;
    for (int k = K_NAME; k <= K_KEYS; k++)
        if (!v[k])
            return gw_cfg_perr(p, n, (gw_cfg_path_key(kp, path, keys[k]), kp), "required");
    gw_cfg_path_key(kp, path, "name");
    if ((rc = gw_cfg_str(p, v[K_NAME], kp, &t->name)))
        return rc;
    if (!valid_tenant_name(t->name))
        return gw_cfg_perr(p, v[K_NAME], kp,
                           "must be 1 to %d characters from A-Z a-z 0-9 . _ - (not '-' alone: no tenant)",
                           GW_TENANT_NAME_MAX);

    int len;
    gw_cfg_path_key(kp, path, "keys");
    if ((rc = gw_cfg_seq_take(p, v[K_KEYS], kp, CFG_MAX_KEYS, &len)))
        return rc;
    if (len == 0)
        return gw_cfg_perr(p, v[K_KEYS], kp, "needs at least one key hash");
    if (!(t->key_hashes = calloc((size_t)len, sizeof(*t->key_hashes))))
        return -ENOMEM;
    for (int i = 0; i < len; i++) {
        char ip[CFG_PATH_MAX];
        yaml_node_t *it;
        gw_cfg_path_idx(ip, kp, i);
        if ((rc = gw_cfg_seq_item(p, v[K_KEYS], i, ip, &it)) ||
            (rc = parse_key_hash(p, it, ip, t->key_hashes[i])))
            return rc;
        t->n_keys = i + 1;
    }

    if (v[K_MODELS]) {
        gw_cfg_path_key(kp, path, "models");
        if ((rc = gw_cfg_str_list(p, v[K_MODELS], kp, CFG_MAX_MODELS, &t->models, &t->n_models)))
            return rc;
    } else {
        if (!(t->models = calloc(1, sizeof(*t->models))) || !(t->models[0] = strdup("*")))
            return -ENOMEM;
        t->n_models = 1;
    }
    if (v[K_RPS] && (rc = gw_cfg_num(p, v[K_RPS], (gw_cfg_path_key(kp, path, "rps"), kp), 1e9, &t->rps)))
        return rc;
    if (v[K_TPM] && (rc = gw_cfg_num(p, v[K_TPM], (gw_cfg_path_key(kp, path, "tpm"), kp), 1e12, &t->tpm)))
        return rc;
    if (v[K_ADMIN] && (rc = gw_cfg_bool(p, v[K_ADMIN], (gw_cfg_path_key(kp, path, "admin"), kp), &t->admin)))
        return rc;
    if (v[K_RESIDENCY] && (rc = gw_cfg_tags(p, v[K_RESIDENCY], (gw_cfg_path_key(kp, path, "residency"), kp),
                                            &t->residency, &t->n_residency)))
        return rc;
    if (v[K_POLICY] &&
        (rc = gw_cfg_policy(p, v[K_POLICY], (gw_cfg_path_key(kp, path, "policy"), kp), &t->policy)))
        return rc;
    if (v[K_SLO] &&
        (rc = gw_cfg_num(p, v[K_SLO], (gw_cfg_path_key(kp, path, "slo_ms"), kp), 3600000, &t->slo_ms)))
        return rc;
    if (v[K_PRICE] &&
        (rc = gw_cfg_num(p, v[K_PRICE], (gw_cfg_path_key(kp, path, "max_price"), kp), 1e9, &t->max_price)))
        return rc;
    if (v[K_PRIO]) {
        char *s = NULL;
        gw_cfg_path_key(kp, path, "priority");
        if ((rc = gw_cfg_str(p, v[K_PRIO], kp, &s)))
            return rc;
        t->batch_only = !strcmp(s, "batch");
        if (!t->batch_only && strcmp(s, "interactive"))
            rc = gw_cfg_perr(p, v[K_PRIO], kp, "must be interactive or batch");
        free(s);
    }
    return rc;
}

typedef struct key_ref {
    const uint8_t *hash;
    int tenant, key;
} key_ref;

typedef struct name_ref {
    const char *name;
    int tenant;
} name_ref;

static int key_ref_cmp(const void *a, const void *b)
{
    const key_ref *x = a, *y = b;
    int d = memcmp(x->hash, y->hash, 32);
    if (d)
        return d;
    return x->tenant != y->tenant ? x->tenant - y->tenant : x->key - y->key;
}

static int name_ref_cmp(const void *a, const void *b)
{
    const name_ref *x = a, *y = b;
    int d = strcmp(x->name, y->name);
    return d ? d : x->tenant - y->tenant;
}

/* The value node of `key` in an already validated map (for error lines). */
static const yaml_node_t *map_value(cfg_parser *p, const yaml_node_t *map, const char *key)
{
    for (yaml_node_pair_t *pr = map->data.mapping.pairs.start; pr < map->data.mapping.pairs.top; pr++) {
        yaml_node_t *k = yaml_document_get_node(p->doc, pr->key);
        if (k && k->type == YAML_SCALAR_NODE && !strcmp((const char *)k->data.scalar.value, key))
            return yaml_document_get_node(p->doc, pr->value);
    }
    return map;
}

/* Names and keys identify a tenant, so each must be unique; sorting keeps
 * the check fast for large tenant lists. */
static int check_tenants_unique(cfg_parser *p, const yaml_node_t *seq, gw_config *c)
{
    int rc = 0;
    name_ref *nr = malloc((c->n_tenants ? (size_t)c->n_tenants : 1) * sizeof(*nr));
    if (!nr)
        return -ENOMEM;
    for (int i = 0; i < c->n_tenants; i++)
        nr[i] = (name_ref){c->tenants[i].name, i};
    qsort(nr, (size_t)c->n_tenants, sizeof(*nr), name_ref_cmp);
    for (int i = 1; i < c->n_tenants && !rc; i++) {
        if (strcmp(nr[i].name, nr[i - 1].name))
            continue;
        char ip[CFG_PATH_MAX];
        const yaml_node_t *t = yaml_document_get_node(p->doc, seq->data.sequence.items.start[nr[i].tenant]);
        snprintf(ip, sizeof(ip), "tenants[%d].name", nr[i].tenant);
        rc = gw_cfg_perr(p, map_value(p, t, "name"), ip, "tenant %s is already tenants[%d]", nr[i].name,
                         nr[i - 1].tenant);
    }
    free(nr);
    if (rc)
        return rc;

    size_t total = 0, k = 0;
    for (int i = 0; i < c->n_tenants; i++)
        total += (size_t)c->tenants[i].n_keys;
    key_ref *kr = malloc((total ? total : 1) * sizeof(*kr));
    if (!kr)
        return -ENOMEM;
    for (int i = 0; i < c->n_tenants; i++)
        for (int j = 0; j < c->tenants[i].n_keys; j++)
            kr[k++] = (key_ref){c->tenants[i].key_hashes[j], i, j};
    qsort(kr, total, sizeof(*kr), key_ref_cmp);
    for (size_t i = 1; i < total && !rc; i++) {
        if (memcmp(kr[i].hash, kr[i - 1].hash, 32))
            continue;
        char ip[CFG_PATH_MAX];
        const yaml_node_t *t = yaml_document_get_node(p->doc, seq->data.sequence.items.start[kr[i].tenant]);
        const yaml_node_t *keys = map_value(p, t, "keys");
        snprintf(ip, sizeof(ip), "tenants[%d].keys[%d]", kr[i].tenant, kr[i].key);
        rc =
            gw_cfg_perr(p, yaml_document_get_node(p->doc, keys->data.sequence.items.start[kr[i].key]), ip,
                        "the same key hash is already tenants[%d].keys[%d]", kr[i - 1].tenant, kr[i - 1].key);
    }
    free(kr);
    return rc;
}

static int parse_tenants(cfg_parser *p, const yaml_node_t *n, gw_config *c)
{
    int len, rc = gw_cfg_seq_take(p, n, "tenants", CFG_MAX_TENANTS, &len);
    if (rc)
        return rc;
    if (len && !(c->tenants = calloc((size_t)len, sizeof(*c->tenants))))
        return -ENOMEM;
    for (int i = 0; i < len; i++) {
        char ip[CFG_PATH_MAX];
        yaml_node_t *it;
        gw_cfg_path_idx(ip, "tenants", i);
        c->n_tenants = i + 1;
        if ((rc = gw_cfg_seq_item(p, n, i, ip, &it)) || (rc = parse_tenant(p, it, ip, &c->tenants[i])))
            return rc;
    }
    return check_tenants_unique(p, n, c);
}

/* ---- limits, logging, scalars ---- */

static void limits_defaults(gw_limits_cfg *l)
{
    l->max_body_bytes = 1048576;
    l->max_header_bytes = 65536;
    l->max_concurrent_streams = 256;
    l->max_connections = 10000;
    l->header_timeout_ms = 10000;
    l->idle_timeout_ms = 120000;
    l->stream_buffer_bytes = 1048576;
    l->response_timeout_ms = 600000;
}

static int parse_limits(cfg_parser *p, const yaml_node_t *n, gw_limits_cfg *l)
{
    enum { K_BODY, K_HDR, K_STREAMS, K_CONNS, K_HDR_TO, K_IDLE_TO, K_BUF, K_RESP_TO, K_N };
    static const char *const keys[K_N] = {
        "max_body_bytes",    "max_header_bytes", "max_concurrent_streams", "max_connections",
        "header_timeout_ms", "idle_timeout_ms",  "stream_buffer_bytes",    "response_timeout_ms"};
    static const long long lo[K_N] = {1, 1024, 1, 1, 1, 1, 4096, 0};
    static const long long hi[K_N] = {GW_WORKER_MAX_BODY, 1 << 24,  INT_MAX,   INT_MAX,
                                      86400000,           86400000, 1LL << 30, 86400000};
    yaml_node_t *v[K_N];
    int rc = gw_cfg_map_take(p, n, "limits", keys, K_N, v);
    if (rc)
        return rc;
    for (int k = 0; k < K_N; k++) {
        char kp[CFG_PATH_MAX];
        long long x;
        if (!v[k])
            continue;
        if ((rc = gw_cfg_int(p, v[k], (gw_cfg_path_key(kp, "limits", keys[k]), kp), lo[k], hi[k], &x)))
            return rc;
        switch (k) {
        case K_BODY:
            l->max_body_bytes = (size_t)x;
            break;
        case K_HDR:
            l->max_header_bytes = (size_t)x;
            break;
        case K_STREAMS:
            l->max_concurrent_streams = (uint32_t)x;
            break;
        case K_CONNS:
            l->max_connections = (int)x;
            break;
        case K_HDR_TO:
            l->header_timeout_ms = (int)x;
            break;
        case K_IDLE_TO:
            l->idle_timeout_ms = (int)x;
            break;
        case K_BUF:
            l->stream_buffer_bytes = (size_t)x;
            break;
        case K_RESP_TO:
            l->response_timeout_ms = (int)x;
            break;
        }
    }
    return 0;
}

static int parse_logging(cfg_parser *p, const yaml_node_t *n, gw_config *c)
{
    static const char *const keys[] = {"access_log"};
    yaml_node_t *v[1];
    int rc = gw_cfg_map_take(p, n, "logging", keys, 1, v);
    if (rc || !v[0])
        return rc;
    return gw_cfg_str(p, v[0], "logging.access_log", &c->access_log);
}

static int parse_root(cfg_parser *p, const yaml_node_t *root, gw_config *c)
{
    enum {
        K_LISTEN,
        K_WORKERS,
        K_TENANTS,
        K_LIMITS,
        K_LOGGING,
        K_DRAIN,
        K_STATS,
        K_HANG,
        K_RUNDIR,
        K_REGION,
        K_CLUSTER,
        K_REDIS,
        K_ROUTING,
        K_PEERS,
        K_PEER_TLS,
        K_N
    };
    static const char *const keys[K_N] = {
        "listen",      "workers",       "tenants",           "limits",
        "logging",     "drain_grace_s", "stats_interval_ms", "worker_hang_timeout_s",
        "runtime_dir", "region",        "cluster",           "redis",
        "routing",     "peers",         "peer_tls"};
    yaml_node_t *v[K_N] = {0};
    int rc;
    long long x;
    if (root && (rc = gw_cfg_map_take(p, root, "", keys, K_N, v)))
        return rc;
    /* Tenants first: whether the listeners may leave loopback depends on them. */
    if (v[K_TENANTS] && (rc = parse_tenants(p, v[K_TENANTS], c)))
        return rc;
    if (v[K_LISTEN]) {
        if ((rc = parse_listen(p, v[K_LISTEN], c)))
            return rc;
    } else {
        if (!(c->listen = calloc(1, sizeof(*c->listen))) ||
            !(c->listen[0].address = strdup("127.0.0.1:8080")))
            return -ENOMEM;
        c->n_listen = 1;
    }
    if (v[K_WORKERS] && (rc = parse_workers(p, v[K_WORKERS], c)))
        return rc;
    if (v[K_LIMITS] && (rc = parse_limits(p, v[K_LIMITS], &c->limits)))
        return rc;
    if (v[K_LOGGING] && (rc = parse_logging(p, v[K_LOGGING], c)))
        return rc;
    if (!c->access_log && !(c->access_log = strdup("stdout")))
        return -ENOMEM;
    if (v[K_DRAIN]) {
        if ((rc = gw_cfg_int(p, v[K_DRAIN], "drain_grace_s", 0, 86400, &x)))
            return rc;
        c->drain_grace_s = (int)x;
    }
    if (v[K_STATS]) {
        if ((rc = gw_cfg_int(p, v[K_STATS], "stats_interval_ms", 10, 60000, &x)))
            return rc;
        c->stats_interval_ms = (int)x;
    }
    if (v[K_HANG]) {
        if ((rc = gw_cfg_int(p, v[K_HANG], "worker_hang_timeout_s", 0, 86400, &x)))
            return rc;
        c->worker_hang_timeout_s = (int)x;
    }
    if (v[K_RUNDIR]) {
        if ((rc = gw_cfg_str(p, v[K_RUNDIR], "runtime_dir", &c->runtime_dir)))
            return rc;
        if (c->runtime_dir[0] != '/')
            return gw_cfg_perr(p, v[K_RUNDIR], "runtime_dir", "must be an absolute path");
        if (strlen(c->runtime_dir) > CFG_RUNTIME_DIR_MAX)
            return gw_cfg_perr(
                p, v[K_RUNDIR], "runtime_dir",
                "longer than %d bytes: worker socket paths would not fit a Unix socket address",
                CFG_RUNTIME_DIR_MAX);
    }
    /* Without a region this gateway has no tags to hold a tenant's
     * requests to: they would be served here whatever it asked. */
    for (int i = 0; !v[K_REGION] && i < c->n_tenants; i++)
        if (c->tenants[i].n_residency > 0) {
            char tp[CFG_PATH_MAX], rp[CFG_PATH_MAX];
            gw_cfg_path_idx(tp, "tenants", i);
            gw_cfg_path_key(rp, tp, "residency");
            const yaml_node_t *item =
                yaml_document_get_node(p->doc, v[K_TENANTS]->data.sequence.items.start[i]);
            return gw_cfg_perr(p, map_value(p, item, "residency"), rp,
                               "residency needs a region section: its tags say where this gateway may serve");
        }
    return gw_cfg_parse_routing(p, v[K_REGION], v[K_CLUSTER], v[K_REDIS], v[K_ROUTING], v[K_PEERS],
                                v[K_PEER_TLS], c);
}

/* ---- entry points ---- */

static gw_config *config_new(void)
{
    gw_config *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    limits_defaults(&c->limits);
    c->drain_grace_s = 30;
    c->stats_interval_ms = 250;
    c->worker_hang_timeout_s = 30;
    if (gw_cfg_routing_init(c)) {
        free(c);
        return NULL;
    }
    return c;
}

static int syntax_error(cfg_parser *p, const yaml_parser_t *yp, const char *text, size_t len)
{
    if (yp->error == YAML_MEMORY_ERROR)
        return -ENOMEM;
    const yaml_mark_t *m = yp->problem ? &yp->problem_mark : &yp->context_mark;
    /* the reader (bad UTF-8, control characters) leaves the marks at zero
     * and says where by byte offset */
    if (yp->error == YAML_READER_ERROR) {
        size_t off = yp->problem_offset < len ? yp->problem_offset : len;
        unsigned long line = 1;
        for (size_t i = 0; i < off; i++)
            line += text[i] == '\n';
        snprintf(p->err, p->err_len, "%s:%lu: YAML syntax error: %s (byte %zu)", p->file, line,
                 yp->problem ? yp->problem : "unreadable text", yp->problem_offset);
        return -EINVAL;
    }
    if (yp->context)
        snprintf(p->err, p->err_len, "%s:%lu: YAML syntax error: %s (%s at line %lu)", p->file,
                 (unsigned long)m->line + 1, yp->problem ? yp->problem : "invalid YAML", yp->context,
                 (unsigned long)yp->context_mark.line + 1);
    else
        snprintf(p->err, p->err_len, "%s:%lu: YAML syntax error: %s", p->file, (unsigned long)m->line + 1,
                 yp->problem ? yp->problem : "invalid YAML");
    return -EINVAL;
}

int gw_config_parse(const char *name, const char *text, size_t len, gw_config **out, char *err,
                    size_t err_len)
{
    char dummy[1];
    if (!err || !err_len) {
        err = dummy;
        err_len = sizeof(dummy);
    }
    err[0] = '\0';
    *out = NULL;
    cfg_parser p = {.file = name ? name : "(config)", .err = err, .err_len = err_len};
    yaml_parser_t yp;
    yaml_document_t doc, extra;
    gw_config *c = NULL;
    int rc;
    if (!yaml_parser_initialize(&yp))
        return -ENOMEM;
    yaml_parser_set_input_string(&yp, (const unsigned char *)text, len);
    if (!yaml_parser_load(&yp, &doc)) {
        rc = syntax_error(&p, &yp, text, len);
        goto out_parser;
    }
    p.doc = &doc;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root) {
        /* A second document would be ignored silently otherwise. */
        if (!yaml_parser_load(&yp, &extra)) {
            rc = syntax_error(&p, &yp, text, len);
            goto out_doc;
        }
        yaml_node_t *r2 = yaml_document_get_root_node(&extra);
        if (r2)
            gw_cfg_perr(&p, r2, "", "only one YAML document is allowed");
        yaml_document_delete(&extra);
        if (r2) {
            rc = -EINVAL;
            goto out_doc;
        }
    }
    size_t n_nodes = (size_t)(doc.nodes.top - doc.nodes.start);
    if (!(p.used = calloc(n_nodes ? n_nodes : 1, 1)) || !(c = config_new())) {
        rc = -ENOMEM;
        goto out_doc;
    }
    if (!(c->path = strdup(p.file))) {
        rc = -ENOMEM;
        goto out_doc;
    }
    if (root && is_null(root))
        root = NULL; /* a file of comments only: all defaults */
    if (root)
        p.used[root - doc.nodes.start] = 1;
    if (root && root->type != YAML_MAPPING_NODE) {
        rc = gw_cfg_perr(&p, root, "", "must be a map of settings, not %s", node_kind(root));
        goto out_doc;
    }
    rc = parse_root(&p, root, c);

out_doc:
    yaml_document_delete(&doc);
out_parser:
    yaml_parser_delete(&yp);
    free(p.used);
    if (rc == -ENOMEM)
        snprintf(err, err_len, "%s: out of memory", p.file);
    if (rc) {
        gw_config_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

int gw_config_load(const char *path, gw_config **out, char *err, size_t err_len)
{
    char dummy[1];
    if (!err || !err_len) {
        err = dummy;
        err_len = sizeof(dummy);
    }
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        snprintf(err, err_len, "%s: %s", path, strerror(e));
        return -e;
    }
    struct stat st;
    char *buf = NULL;
    int rc;
    if (fstat(fileno(f), &st) == -1) {
        rc = -errno;
        snprintf(err, err_len, "%s: %s", path, strerror(-rc));
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = -EINVAL;
        snprintf(err, err_len, "%s: not a regular file", path);
        goto out;
    }
    if (st.st_size > CFG_MAX_FILE) {
        rc = -EFBIG;
        snprintf(err, err_len, "%s: larger than %u MiB; not a config file?", path, CFG_MAX_FILE >> 20);
        goto out;
    }
    size_t size = (size_t)st.st_size, got = 0;
    if (!(buf = malloc(size + 1))) {
        rc = -ENOMEM;
        snprintf(err, err_len, "%s: out of memory", path);
        goto out;
    }
    while (got < size) {
        size_t r = fread(buf + got, 1, size - got, f);
        if (r == 0)
            break;
        got += r;
    }
    if (ferror(f)) {
        rc = -EIO;
        snprintf(err, err_len, "%s: read error", path);
        goto out;
    }
    rc = gw_config_parse(path, buf, got, out, err, err_len);
out:
    free(buf);
    fclose(f);
    return rc;
}

int gw_config_default_worker(gw_config *c, const char *demo_model)
{
    if (c->n_workers)
        return 0;
    gw_worker_cfg *w = calloc(1, sizeof(*w));
    if (!w)
        return -ENOMEM;
    worker_defaults(w);
    w->n_devices = 1;
    if (!(w->model = strdup(demo_model)) || !(w->name = default_model_name(demo_model)) ||
        !(w->devices = calloc(1, sizeof(*w->devices))) || !(w->devices[0] = strdup("cpu"))) {
        if (w->devices)
            free(w->devices[0]);
        free(w->devices);
        free(w->name);
        free(w->model);
        free(w);
        return -ENOMEM;
    }
    free(c->workers);
    c->workers = w;
    c->n_workers = 1;
    return 0;
}

int gw_config_default(const char *demo_model, gw_config **out)
{
    *out = NULL;
    gw_config *c = config_new();
    if (!c)
        return -ENOMEM;
    if (!(c->listen = calloc(1, sizeof(*c->listen))))
        goto nomem;
    c->n_listen = 1;
    if (!(c->listen[0].address = strdup("127.0.0.1:8080")) || gw_config_default_worker(c, demo_model) ||
        !(c->access_log = strdup("stdout")))
        goto nomem;
    *out = c;
    return 0;
nomem:
    gw_config_free(c);
    return -ENOMEM;
}

void gw_config_free(gw_config *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->n_listen; i++) {
        free(c->listen[i].address);
        free(c->listen[i].tls_cert);
        free(c->listen[i].tls_key);
        free(c->listen[i].tls_client_ca);
        gw_cfg_free_str_list(c->listen[i].tls_peer_names, c->listen[i].n_tls_peer_names);
    }
    free(c->listen);
    for (int i = 0; i < c->n_workers; i++) {
        free(c->workers[i].model);
        free(c->workers[i].name);
        free(c->workers[i].chat_template);
        gw_cfg_free_str_list(c->workers[i].devices, c->workers[i].n_devices);
    }
    free(c->workers);
    for (int i = 0; i < c->n_tenants; i++) {
        free(c->tenants[i].name);
        free(c->tenants[i].key_hashes);
        gw_cfg_free_str_list(c->tenants[i].models, c->tenants[i].n_models);
        gw_cfg_free_str_list(c->tenants[i].residency, c->tenants[i].n_residency);
    }
    free(c->tenants);
    free(c->access_log);
    free(c->runtime_dir);
    gw_cfg_routing_free(c);
    free(c->path);
    free(c);
}

void gw_key_hash_hex(const char *key, char hex[65])
{
    static const char digits[] = "0123456789abcdef";
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int md_len = 0;
    if (!EVP_Digest(key, strlen(key), md, &md_len, EVP_sha256(), NULL) || md_len != 32) {
        /* Only on a broken libcrypto; an empty hash matches no config. */
        hex[0] = '\0';
        return;
    }
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[md[i] >> 4];
        hex[2 * i + 1] = digits[md[i] & 15];
    }
    hex[64] = '\0';
}
