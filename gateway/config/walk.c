/* The config loader's YAML walker (see config_internal.h): errors that name
 * file, line and key path, and strict typed access to the document's nodes.
 * Every node is taken at most once and must carry a core tag, so aliases and
 * custom tags are refused here, once, for every section. */
#include "gateway/config/config_internal.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

bool gw_cfg_is_null(const yaml_node_t *n)
{
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    const char *v = (const char *)n->data.scalar.value;
    return !strcmp(v, "") || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") ||
           !strcmp(v, "NULL");
}

const char *gw_cfg_node_kind(const yaml_node_t *n)
{
    if (n->type == YAML_MAPPING_NODE)
        return "a map";
    if (n->type == YAML_SEQUENCE_NODE)
        return "a list";
    if (gw_cfg_is_null(n))
        return "empty";
    return n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE ? "a plain value" : "a quoted string";
}

/* A map with the given keys: vals[k] is the value of keys[k], or NULL.
 * Unknown and repeated keys are errors at the key's own line. */
int gw_cfg_map_take(cfg_parser *p, const yaml_node_t *map, const char *path, const char *const *keys,
                    int n_keys, yaml_node_t **vals)
{
    if (map->type != YAML_MAPPING_NODE)
        return gw_cfg_perr(p, map, path, "must be a map, not %s", gw_cfg_node_kind(map));
    for (int k = 0; k < n_keys; k++)
        vals[k] = NULL;
    for (yaml_node_pair_t *pr = map->data.mapping.pairs.start; pr < map->data.mapping.pairs.top; pr++) {
        yaml_node_t *kn, *vn;
        int rc = node_take(p, pr->key, map, path, &kn);
        if (rc)
            return rc;
        if (kn->type != YAML_SCALAR_NODE)
            return gw_cfg_perr(p, kn, path, "keys must be plain names, not %s", gw_cfg_node_kind(kn));
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

/* The value node of `key` in an already validated map (for error lines). */
const yaml_node_t *gw_cfg_map_value(cfg_parser *p, const yaml_node_t *map, const char *key)
{
    for (yaml_node_pair_t *pr = map->data.mapping.pairs.start; pr < map->data.mapping.pairs.top; pr++) {
        yaml_node_t *k = yaml_document_get_node(p->doc, pr->key);
        if (k && k->type == YAML_SCALAR_NODE && !strcmp((const char *)k->data.scalar.value, key))
            return yaml_document_get_node(p->doc, pr->value);
    }
    return map;
}

int gw_cfg_seq_take(cfg_parser *p, const yaml_node_t *n, const char *path, int max, int *count)
{
    if (n->type != YAML_SEQUENCE_NODE)
        return gw_cfg_perr(p, n, path, "must be a list, not %s", gw_cfg_node_kind(n));
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

/* ---- scalars ---- */

/* A non-empty string without control characters. */
int gw_cfg_str(cfg_parser *p, const yaml_node_t *n, const char *path, char **out)
{
    if (n->type != YAML_SCALAR_NODE || gw_cfg_is_null(n))
        return gw_cfg_perr(p, n, path, "must be a string, not %s", gw_cfg_node_kind(n));
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
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE || gw_cfg_is_null(n))
        return gw_cfg_perr(p, n, path, "must be %s, not %s", want, gw_cfg_node_kind(n));
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
