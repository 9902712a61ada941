/* The config's `tenants` section (see config.h): who may call the gateway,
 * with which API keys (held as SHA-256 hashes, never the keys), which
 * models, rate limits, residency and routing preferences. Names and key
 * hashes identify a tenant, so each must be unique across the section. */
#include "gateway/config/config_internal.h"

#include <openssl/evp.h>

#include <errno.h>
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CFG_MAX_TENANTS 65536
#define CFG_MAX_KEYS 64
#define CFG_MAX_MODELS 256

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
    if (n->type != YAML_SCALAR_NODE || gw_cfg_is_null(n))
        return gw_cfg_perr(p, n, path, "must be a string, not %s", gw_cfg_node_kind(n));
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

static int parse_key_hashes(cfg_parser *p, const yaml_node_t *n, const char *path, gw_tenant_cfg *t)
{
    int len, rc = gw_cfg_seq_take(p, n, path, CFG_MAX_KEYS, &len);
    if (rc)
        return rc;
    if (len == 0)
        return gw_cfg_perr(p, n, path, "needs at least one key hash");
    if (!(t->key_hashes = calloc((size_t)len, sizeof(*t->key_hashes))))
        return -ENOMEM;
    for (int i = 0; i < len; i++) {
        char ip[CFG_PATH_MAX];
        yaml_node_t *it;
        gw_cfg_path_idx(ip, path, i);
        if ((rc = gw_cfg_seq_item(p, n, i, ip, &it)) || (rc = parse_key_hash(p, it, ip, t->key_hashes[i])))
            return rc;
        t->n_keys = i + 1;
    }
    return 0;
}

/* "-" alone is the metrics' and the log's name for no tenant. */
static bool valid_tenant_name(const char *s)
{
    size_t n = strlen(s);
    return n >= 1 && n <= GW_TENANT_NAME_MAX && strcmp(s, "-") != 0 &&
           strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") == n;
}

/* budget: {daily: X, monthly: Y}, in the regions' prices' currency; either
 * may be left out (no bound for that period), not both: an empty budget
 * is more likely a mistake than a wish. */
static int parse_budget(cfg_parser *p, const yaml_node_t *n, const char *path, gw_tenant_cfg *t)
{
    static const char *const keys[] = {"daily", "monthly"};
    double *out[] = {&t->budget_daily, &t->budget_monthly};
    yaml_node_t *v[2];
    char kp[CFG_PATH_MAX];
    int rc = gw_cfg_map_take(p, n, path, keys, 2, v);
    if (rc)
        return rc;
    if (!v[0] && !v[1])
        return gw_cfg_perr(p, n, path, "needs daily, monthly or both");
    for (int k = 0; k < 2; k++) {
        if (!v[k])
            continue;
        if ((rc = gw_cfg_num(p, v[k], (gw_cfg_path_key(kp, path, keys[k]), kp), 1e12, out[k])))
            return rc;
        if (!(*out[k] > 0))
            return gw_cfg_perr(p, v[k], kp, "must be a number > 0 (leave it out for no budget)");
    }
    return 0;
}

/* allow_policies: the x-infergate-policy values this tenant's requests may
 * give, each a policy name, none twice. */
static int parse_allow_policies(cfg_parser *p, const yaml_node_t *n, const char *path, gw_tenant_cfg *t)
{
    int len, rc = gw_cfg_seq_take(p, n, path, 4, &len);
    for (int i = 0; !rc && i < len; i++) {
        char ip[CFG_PATH_MAX];
        yaml_node_t *it;
        gw_route_policy pol;
        gw_cfg_path_idx(ip, path, i);
        if ((rc = gw_cfg_seq_item(p, n, i, ip, &it)) || (rc = gw_cfg_policy(p, it, ip, &pol)))
            return rc;
        if (t->allow_policies & (1u << pol))
            return gw_cfg_perr(p, it, ip, "%s is listed twice", gw_policy_name(pol));
        t->allow_policies |= 1u << pol;
    }
    return rc;
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
        K_WEIGHT,
        K_BUDGET,
        K_PRIMARY,
        K_ALLOW,
        K_N
    };
    static const char *const keys[K_N] = {"name",     "keys",     "models",  "rps",          "tpm",
                                          "admin",    "residency", "policy", "slo_ms",       "max_price",
                                          "priority", "weight",   "budget",  "primary",      "allow_policies"};
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
    if ((rc = parse_key_hashes(p, v[K_KEYS], (gw_cfg_path_key(kp, path, "keys"), kp), t)))
        return rc;
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
        if (rc)
            return rc;
    }
    t->weight = 1;
    if (!rc && v[K_WEIGHT]) {
        gw_cfg_path_key(kp, path, "weight");
        if ((rc = gw_cfg_num(p, v[K_WEIGHT], kp, DBL_MAX, &t->weight)))
            return rc;
        if (t->weight < GW_TENANT_WEIGHT_MIN || t->weight > GW_TENANT_WEIGHT_MAX)
            rc = gw_cfg_perr(p, v[K_WEIGHT], kp, "must be a number from %g to %g", GW_TENANT_WEIGHT_MIN,
                             GW_TENANT_WEIGHT_MAX);
    }
    if (!rc && v[K_BUDGET])
        rc = parse_budget(p, v[K_BUDGET], (gw_cfg_path_key(kp, path, "budget"), kp), t);
    if (!rc && v[K_PRIMARY])
        rc = gw_cfg_region_list(p, v[K_PRIMARY], (gw_cfg_path_key(kp, path, "primary"), kp), &t->primary,
                                &t->n_primary);
    if (!rc && v[K_ALLOW])
        rc = parse_allow_policies(p, v[K_ALLOW], (gw_cfg_path_key(kp, path, "allow_policies"), kp), t);
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
        rc = gw_cfg_perr(p, gw_cfg_map_value(p, t, "name"), ip, "tenant %s is already tenants[%d]",
                         nr[i].name, nr[i - 1].tenant);
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
        const yaml_node_t *keys = gw_cfg_map_value(p, t, "keys");
        snprintf(ip, sizeof(ip), "tenants[%d].keys[%d]", kr[i].tenant, kr[i].key);
        rc =
            gw_cfg_perr(p, yaml_document_get_node(p->doc, keys->data.sequence.items.start[kr[i].key]), ip,
                        "the same key hash is already tenants[%d].keys[%d]", kr[i - 1].tenant, kr[i - 1].key);
    }
    free(kr);
    return rc;
}

int gw_cfg_parse_tenants(cfg_parser *p, const yaml_node_t *n, gw_config *c)
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

void gw_cfg_tenants_free(gw_config *c)
{
    for (int i = 0; i < c->n_tenants; i++) {
        free(c->tenants[i].name);
        free(c->tenants[i].key_hashes);
        gw_cfg_free_str_list(c->tenants[i].models, c->tenants[i].n_models);
        gw_cfg_free_str_list(c->tenants[i].residency, c->tenants[i].n_residency);
        gw_cfg_free_str_list(c->tenants[i].primary, c->tenants[i].n_primary);
    }
    free(c->tenants);
}

/* The hash a tenant's keys list holds. */
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
