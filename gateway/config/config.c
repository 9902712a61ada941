/* Gateway configuration (see config.h): the entry points. The YAML file is
 * loaded with libyaml's document API, then walked against the schema. The
 * walk is strict — unknown keys, duplicate keys, wrong types and
 * out-of-range values are errors — because a misspelt limit that silently
 * keeps its default is worse than a gateway that refuses to start. Nothing
 * is returned unless the whole file is valid.
 *
 * The walk, by file: walk.c (typed access to the YAML nodes, "FILE:LINE:
 * KEY: why" errors), root.c (the top-level keys, limits, logging),
 * listeners.c, workers.c, tenants.c, routing.c (region, Redis, routing,
 * peers); diff.c says what a reload cannot change. */
#include "gateway/config/config.h"
#include "gateway/config/config_internal.h"

#include <yaml.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* A config file is written by hand; anything this big is a mistake. */
#define CFG_MAX_FILE (16u << 20)

static gw_config *config_new(void)
{
    gw_config *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    if (gw_cfg_root_init(c) || gw_cfg_routing_init(c)) {
        gw_config_free(c);
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
    if (root && gw_cfg_is_null(root))
        root = NULL; /* a file of comments only: all defaults */
    if (root)
        p.used[root - doc.nodes.start] = 1;
    if (root && root->type != YAML_MAPPING_NODE) {
        rc = gw_cfg_perr(&p, root, "", "must be a map of settings, not %s", gw_cfg_node_kind(root));
        goto out_doc;
    }
    rc = gw_cfg_parse_root(&p, root, c);

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

int gw_config_default(const char *demo_model, gw_config **out)
{
    *out = NULL;
    gw_config *c = config_new();
    if (!c)
        return -ENOMEM;
    if (gw_cfg_listen_default(c) || gw_config_default_worker(c, demo_model)) {
        gw_config_free(c);
        return -ENOMEM;
    }
    *out = c;
    return 0;
}

void gw_config_free(gw_config *c)
{
    if (!c)
        return;
    gw_cfg_listen_free(c);
    gw_cfg_workers_free(c);
    gw_cfg_tenants_free(c);
    free(c->access_log);
    free(c->runtime_dir);
    gw_cfg_routing_free(c);
    free(c->path);
    free(c);
}
