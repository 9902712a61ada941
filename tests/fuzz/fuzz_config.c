/* libFuzzer target for the gateway config loader (gw_config_parse, the
 * in-memory twin of gw_config_load) and the tenant table built from it.
 *
 * A rejection must be -EINVAL (or -ENOMEM) with an error that starts with
 * the file name and leaves nothing to free. An accepted config must respect
 * every range and rule the loader promises (at least one listen address,
 * tls cert and key together, loopback-only without tenants, worker limits,
 * tenants with keys, non-negative rates); its tenant table must build, and
 * the input itself, tried as a bearer key, must authenticate at most one
 * tenant. Violations are __builtin_trap so the fuzzer keeps them. */
#include "gateway/config/config.h"
#include "gateway/front/tenant.h"

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_CHECK(cond)                                                                                     \
    do {                                                                                                     \
        if (!(cond))                                                                                         \
            __builtin_trap();                                                                                \
    } while (0)

#define FUZZ_NAME "fuzz.yaml"

static void check_str(const char *s)
{
    FUZZ_CHECK(s != NULL && s[0] != '\0');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        FUZZ_CHECK(*p >= 0x20 && *p != 0x7f);
}

static void check_config(const gw_config *c)
{
    FUZZ_CHECK(c->path && !strcmp(c->path, FUZZ_NAME));
    FUZZ_CHECK(c->n_listen >= 1 && c->listen);
    for (int i = 0; i < c->n_listen; i++) {
        const gw_listen_cfg *l = &c->listen[i];
        check_str(l->address);
        FUZZ_CHECK(!l->tls_cert == !l->tls_key);
        if (l->tls_cert) {
            check_str(l->tls_cert);
            check_str(l->tls_key);
        }
        bool unix_sock = !strncmp(l->address, "unix:/", 6);
        FUZZ_CHECK(unix_sock || strchr(l->address, ':'));
        if (c->n_tenants == 0)
            FUZZ_CHECK(unix_sock || !strncmp(l->address, "127.", 4) || !strncmp(l->address, "[", 1));
        for (int j = 0; j < i; j++)
            FUZZ_CHECK(strcmp(c->listen[j].address, l->address) != 0);
    }
    FUZZ_CHECK(c->n_workers >= 0);
    for (int i = 0; i < c->n_workers; i++) {
        const gw_worker_cfg *w = &c->workers[i];
        check_str(w->model);
        check_str(w->name);
        FUZZ_CHECK(w->n_devices >= 1);
        for (int d = 0; d < w->n_devices; d++)
            check_str(w->devices[d]);
        FUZZ_CHECK(w->threads >= 0 && w->threads <= 1024);
        FUZZ_CHECK(w->kv_cache_mb >= 1 && w->max_seqs >= 1 && w->max_batch_tokens >= 1 && w->max_queue >= 0);
    }
    for (int i = 0; i < c->n_tenants; i++) {
        const gw_tenant_cfg *t = &c->tenants[i];
        check_str(t->name);
        FUZZ_CHECK(t->n_keys >= 1 && t->key_hashes);
        FUZZ_CHECK(t->n_models >= 0);
        for (int m = 0; m < t->n_models; m++)
            check_str(t->models[m]);
        FUZZ_CHECK(t->rps >= 0 && t->tpm >= 0);
        for (int j = 0; j < i; j++)
            FUZZ_CHECK(strcmp(c->tenants[j].name, t->name) != 0);
    }
    const gw_limits_cfg *lim = &c->limits;
    FUZZ_CHECK(lim->max_body_bytes >= 1 && lim->max_header_bytes >= 1 && lim->stream_buffer_bytes >= 1);
    FUZZ_CHECK(lim->max_concurrent_streams >= 1 && lim->max_connections >= 1);
    FUZZ_CHECK(lim->header_timeout_ms >= 1 && lim->idle_timeout_ms >= 1);
    check_str(c->access_log);
    FUZZ_CHECK(c->drain_grace_s >= 0 && c->stats_interval_ms >= 10);
    FUZZ_CHECK(!c->runtime_dir || c->runtime_dir[0] == '/');
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gw_config *c = (gw_config *)1;
    char err[512];
    int rc = gw_config_parse(FUZZ_NAME, (const char *)data, size, &c, err, sizeof(err));
    if (rc) {
        FUZZ_CHECK(rc == -EINVAL || rc == -ENOMEM);
        FUZZ_CHECK(c == NULL);
        FUZZ_CHECK(!strncmp(err, FUZZ_NAME, strlen(FUZZ_NAME)));
        return 0;
    }
    check_config(c);
    gw_tenants *t = gw_tenants_new(c, NULL);
    FUZZ_CHECK(t != NULL);
    FUZZ_CHECK(gw_tenants_open(t) == (c->n_tenants == 0));
    char *key = malloc(size + 1);
    if (key) {
        memcpy(key, data, size);
        key[size] = '\0';
        gw_tenant *a = gw_tenants_auth(t, key);
        if (a)
            FUZZ_CHECK(gw_tenants_find(t, gw_tenant_name(a)) == a);
        free(key);
    }
    /* A reload onto itself keeps every tenant. */
    gw_tenants *t2 = gw_tenants_new(c, t);
    FUZZ_CHECK(t2 != NULL);
    for (int i = 0; i < c->n_tenants; i++)
        FUZZ_CHECK(gw_tenants_find(t2, c->tenants[i].name) != NULL);
    gw_tenants_free(t2);
    gw_tenants_free(t);
    gw_config_free(c);
    return 0;
}
