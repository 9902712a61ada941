/* What the config loader's files share (see config.c for which does what):
 * the YAML walker (walk.c), strict typed getters that report
 * "FILE:LINE: KEY: why" and return -EINVAL (or -ENOMEM), and each section's
 * parse, defaults and free. Not for use outside the config module. */
#ifndef GW_CONFIG_INTERNAL_H
#define GW_CONFIG_INTERNAL_H

#include "gateway/config/config.h"

#include <yaml.h>

#define CFG_PATH_MAX 256

typedef struct cfg_parser {
    const char *file;
    yaml_document_t *doc;
    unsigned char *used; /* per node: visited once already (an alias) */
    char *err;
    size_t err_len;
} cfg_parser;

/* Fills p->err for node n (its line) and key path; returns -EINVAL. */
int gw_cfg_perr(cfg_parser *p, const yaml_node_t *n, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Key paths for messages, CFG_PATH_MAX bytes, cut short when deep. */
void gw_cfg_path_key(char *out, const char *parent, const char *key);
void gw_cfg_path_idx(char *out, const char *parent, int i);

/* A map with exactly the given keys allowed: vals[k] is keys[k]'s value
 * node or NULL. Unknown and repeated keys are errors. */
int gw_cfg_map_take(cfg_parser *p, const yaml_node_t *map, const char *path, const char *const *keys,
                    int n_keys, yaml_node_t **vals);
int gw_cfg_seq_take(cfg_parser *p, const yaml_node_t *n, const char *path, int max, int *count);
int gw_cfg_seq_item(cfg_parser *p, const yaml_node_t *seq, int i, const char *path, yaml_node_t **out);

/* Scalars. Strings: non-empty, no control characters, replacing *out.
 * Numbers: plain (unquoted) decimal, 0 to max. */
int gw_cfg_str(cfg_parser *p, const yaml_node_t *n, const char *path, char **out);
int gw_cfg_int(cfg_parser *p, const yaml_node_t *n, const char *path, long long min, long long max,
               long long *out);
int gw_cfg_num(cfg_parser *p, const yaml_node_t *n, const char *path, double max, double *out);
int gw_cfg_bool(cfg_parser *p, const yaml_node_t *n, const char *path, bool *out);
int gw_cfg_str_list(cfg_parser *p, const yaml_node_t *n, const char *path, int max, char ***out, int *count);
void gw_cfg_free_str_list(char **v, int n);

/* A plain empty scalar (null, ~ or nothing), and a node's kind in words
 * ("a map", "a quoted string"), for messages. */
bool gw_cfg_is_null(const yaml_node_t *n);
const char *gw_cfg_node_kind(const yaml_node_t *n);
/* The value node of key in a map already taken (for an error's line), or
 * the map itself when key is absent. */
const yaml_node_t *gw_cfg_map_value(cfg_parser *p, const yaml_node_t *map, const char *key);

/* ---- the sections: each parse fills c (the caller frees it on error) ---- */

/* root.c: the top-level map (root NULL: an empty file), after
 * gw_cfg_root_init set the defaults of limits, logging and the scalars
 * (0 or -ENOMEM). */
int gw_cfg_root_init(gw_config *c);
int gw_cfg_parse_root(cfg_parser *p, const yaml_node_t *root, gw_config *c);

/* listeners.c. HOST:PORT (numeric IPv4), [IPv6]:PORT or unix:/abs/path;
 * NULL when valid (loopback set), else why not. */
const char *gw_cfg_check_address(const char *s, bool *loopback);
/* Without tenants, every address must be loopback: parse tenants first. */
int gw_cfg_parse_listen(cfg_parser *p, const yaml_node_t *n, gw_config *c);
/* The one listener of a config without `listen`. 0 or -ENOMEM. */
int gw_cfg_listen_default(gw_config *c);
void gw_cfg_listen_free(gw_config *c);

/* workers.c (gw_config_default_worker, of config.h, too) */
int gw_cfg_parse_workers(cfg_parser *p, const yaml_node_t *n, gw_config *c);
void gw_cfg_workers_free(gw_config *c);

/* tenants.c (gw_key_hash_hex, of config.h, too) */
int gw_cfg_parse_tenants(cfg_parser *p, const yaml_node_t *n, gw_config *c);
void gw_cfg_tenants_free(gw_config *c);

/* ---- routing.c ---- */

/* Sets the routing defaults of a new config. 0 or -ENOMEM. */
int gw_cfg_routing_init(gw_config *c);
/* The top-level routing sections (each NULL when absent), after tenants
 * and listeners are parsed. */
int gw_cfg_parse_routing(cfg_parser *p, const yaml_node_t *region, const yaml_node_t *cluster,
                         const yaml_node_t *redis, const yaml_node_t *routing, const yaml_node_t *peers,
                         const yaml_node_t *peer_tls, gw_config *c);
/* tenants[i].residency / policy: the same rules as region tags and
 * routing.policy. */
int gw_cfg_tags(cfg_parser *p, const yaml_node_t *n, const char *path, char ***out, int *count);
int gw_cfg_policy(cfg_parser *p, const yaml_node_t *n, const char *path, gw_route_policy *out);
/* Region names (policy primary's list): 1 to ROUTE_MAX_PRIMARY, none twice. */
int gw_cfg_region_list(cfg_parser *p, const yaml_node_t *n, const char *path, char ***out, int *count);
void gw_cfg_routing_free(gw_config *c);

#endif
