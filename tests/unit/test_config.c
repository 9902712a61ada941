/* Tests of the gateway config loader.
 *
 * A file with every key set is checked field by field; a file without keys
 * and gw_config_default give the documented defaults; a table of broken
 * files (unknown, duplicate and missing keys, wrong types, out-of-range
 * values, bad addresses and key hashes, YAML syntax, aliases) must each be
 * -EINVAL with an error naming "FILE:LINE: KEY: why". The multi-region
 * sections (region, cluster, redis, routing, peers, peer_tls, a listener's
 * client_ca, tenants' routing keys) get the same: a full file, defaults,
 * broken cases. Files are written to a temporary directory;
 * gw_key_hash_hex is checked on known vectors. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "gateway/config/config.h"
#include "runtime/chat.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define H_K1 "6ab9f1eb8f7d3388f4f9d586f66e99fd54080df2c446f0e58668b09c08a16dd0"
#define H_K2_UPPER "015F7E6BC5AEAF483724089E9252CC13B50951A6B69412522765CFF4D780306E"
#define H_K3 "2f5052c9fd15b19a18c584d01363568198613f0c34e84409ef7938709a159ec2"

static char tmpdir[64];

static int setup_dir(void **state)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/test_config.XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int remove_dir(void **state)
{
    char p[128];
    snprintf(p, sizeof(p), "%s/cfg.yaml", tmpdir);
    unlink(p);
    snprintf(p, sizeof(p), "%s/bad.yaml", tmpdir);
    unlink(p);
    rmdir(tmpdir);
    return 0;
}

static const char *write_file(const char *name, const char *text)
{
    static char path[128];
    snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    assert_int_equal(fclose(f), 0);
    return path;
}

/* Loads `yaml` as the file cfg.yaml; a refusal fails the test with the
 * parser's reason. */
static gw_config *load_ok(const char *yaml)
{
    const char *path = write_file("cfg.yaml", yaml);
    gw_config *c;
    char err[256] = "";
    int rc = gw_config_load(path, &c, err, sizeof(err));
    if (rc)
        fail_msg("load: %d %s", rc, err);
    return c;
}

static void hash_bytes(const char *hex, uint8_t out[32])
{
    for (int i = 0; i < 32; i++) {
        unsigned v;
        assert_int_equal(sscanf(hex + 2 * i, "%2x", &v), 1);
        out[i] = (uint8_t)v;
    }
}

/* ---- a full file ---- */

static const char full_yaml[] = "# every key of the schema\n"
                                "listen:\n"
                                "  - address: \"0.0.0.0:8443\"\n"
                                "    tls: {cert: /etc/ig/cert.pem, key: /etc/ig/key.pem}\n"
                                "  - address: \"[::1]:8080\"\n"
                                "  - address: unix:/run/infergate.sock\n"
                                "workers:\n"
                                "  - model: /models/llama-7b.Q4_0.gguf\n"
                                "    name: llama-7b\n"
                                "    devices: [GPU-aaaa, MIG-bbbb]\n"
                                "    threads: 2\n"
                                "    kv_cache_mb: 1024\n"
                                "    kv_type: f16\n"
                                "    max_seqs: 64\n"
                                "    max_batch_tokens: 2048\n"
                                "    max_queue: 128\n"
                                "    batch_max_wait_ms: 5000\n"
                                "    prompt_max_wait_ms: 0\n"
                                "    prefix_cache: false\n"
                                "  - model: /models/tiny.gguf\n"
                                "    kv_type: q8_0\n"
                                "    chat_template: llama3\n"
                                "tenants:\n"
                                "  - name: acme\n"
                                "    keys: [" H_K1 ", " H_K2_UPPER "]\n"
                                "    models: [\"*\"]\n"
                                "    rps: 10\n"
                                "    tpm: 100000\n"
                                "    admin: true\n"
                                "  - name: beta.team-2\n"
                                "    keys:\n"
                                "      - " H_K3 "\n"
                                "    models: [llama-7b, tiny]\n"
                                "    rps: 0.5\n"
                                "limits:\n"
                                "  max_body_bytes: 2097152\n"
                                "  max_header_bytes: 32768\n"
                                "  max_concurrent_streams: 100\n"
                                "  max_connections: 500\n"
                                "  header_timeout_ms: 5000\n"
                                "  idle_timeout_ms: 60000\n"
                                "  stream_buffer_bytes: 65536\n"
                                "  response_timeout_ms: 0\n"
                                "logging:\n"
                                "  access_log: /var/log/infergate/access.log\n"
                                "  access_log_mode: 0600\n"
                                "drain_grace_s: 10\n"
                                "stats_interval_ms: 100\n"
                                "worker_hang_timeout_s: 0\n"
                                "runtime_dir: /run/infergate\n";

static void test_full(void **state)
{
    gw_config *c = load_ok(full_yaml);
    char path[128];
    snprintf(path, sizeof(path), "%s/cfg.yaml", tmpdir);
    assert_string_equal(c->path, path);

    assert_int_equal(c->n_listen, 3);
    assert_string_equal(c->listen[0].address, "0.0.0.0:8443");
    assert_string_equal(c->listen[0].tls_cert, "/etc/ig/cert.pem");
    assert_string_equal(c->listen[0].tls_key, "/etc/ig/key.pem");
    assert_string_equal(c->listen[1].address, "[::1]:8080");
    assert_null(c->listen[1].tls_cert);
    assert_null(c->listen[1].tls_key);
    assert_string_equal(c->listen[2].address, "unix:/run/infergate.sock");

    assert_int_equal(c->n_workers, 2);
    const gw_worker_cfg *w = &c->workers[0];
    assert_string_equal(w->model, "/models/llama-7b.Q4_0.gguf");
    assert_string_equal(w->name, "llama-7b");
    assert_int_equal(w->n_devices, 2);
    assert_string_equal(w->devices[0], "GPU-aaaa");
    assert_string_equal(w->devices[1], "MIG-bbbb");
    assert_int_equal(w->threads, 2);
    assert_int_equal(w->kv_cache_mb, 1024);
    assert_false(w->kv_q8_0);
    assert_int_equal(w->max_seqs, 64);
    assert_int_equal(w->max_batch_tokens, 2048);
    assert_int_equal(w->max_queue, 128);
    assert_int_equal(w->batch_max_wait_ms, 5000);
    assert_int_equal(w->prompt_max_wait_ms, 0);
    assert_false(w->prefix_cache);
    w = &c->workers[1];
    assert_string_equal(w->model, "/models/tiny.gguf");
    assert_string_equal(w->name, "tiny");
    assert_int_equal(w->n_devices, 1);
    assert_string_equal(w->devices[0], "cpu");
    assert_int_equal(w->threads, 0);
    assert_int_equal(w->kv_cache_mb, 256);
    assert_true(w->kv_q8_0);
    assert_string_equal(w->chat_template, "llama3");
    assert_null(c->workers[0].chat_template);
    assert_int_equal(w->max_seqs, 32);
    assert_int_equal(w->max_batch_tokens, 512);
    assert_int_equal(w->max_queue, 64);
    assert_int_equal(w->batch_max_wait_ms, 30000);
    assert_int_equal(w->prompt_max_wait_ms, 10000);
    assert_true(w->prefix_cache); /* on by default */

    assert_int_equal(c->n_tenants, 2);
    const gw_tenant_cfg *t = &c->tenants[0];
    uint8_t h[32];
    assert_string_equal(t->name, "acme");
    assert_int_equal(t->n_keys, 2);
    hash_bytes(H_K1, h);
    assert_memory_equal(t->key_hashes[0], h, 32);
    hash_bytes(H_K2_UPPER, h);
    assert_memory_equal(t->key_hashes[1], h, 32);
    assert_int_equal(t->n_models, 1);
    assert_string_equal(t->models[0], "*");
    assert_true(t->rps == 10.0);
    assert_true(t->tpm == 100000.0);
    assert_true(t->admin);
    t = &c->tenants[1];
    assert_string_equal(t->name, "beta.team-2");
    assert_int_equal(t->n_keys, 1);
    hash_bytes(H_K3, h);
    assert_memory_equal(t->key_hashes[0], h, 32);
    assert_int_equal(t->n_models, 2);
    assert_string_equal(t->models[0], "llama-7b");
    assert_string_equal(t->models[1], "tiny");
    assert_true(t->rps == 0.5);
    assert_true(t->tpm == 0);
    assert_false(t->admin);

    assert_int_equal(c->limits.max_body_bytes, 2097152);
    assert_int_equal(c->limits.max_header_bytes, 32768);
    assert_int_equal(c->limits.max_concurrent_streams, 100);
    assert_int_equal(c->limits.max_connections, 500);
    assert_int_equal(c->limits.header_timeout_ms, 5000);
    assert_int_equal(c->limits.idle_timeout_ms, 60000);
    assert_int_equal(c->limits.stream_buffer_bytes, 65536);
    assert_int_equal(c->limits.response_timeout_ms, 0);
    assert_string_equal(c->access_log, "/var/log/infergate/access.log");
    assert_int_equal(c->access_log_mode, 0600);
    assert_int_equal(c->drain_grace_s, 10);
    assert_int_equal(c->stats_interval_ms, 100);
    assert_int_equal(c->worker_hang_timeout_s, 0);
    assert_string_equal(c->runtime_dir, "/run/infergate");
    gw_config_free(c);
}

/* ---- defaults ---- */

static void check_default_limits(const gw_config *c)
{
    assert_int_equal(c->limits.max_body_bytes, 1048576);
    assert_int_equal(c->limits.max_header_bytes, 65536);
    assert_int_equal(c->limits.max_concurrent_streams, 256);
    assert_int_equal(c->limits.max_connections, 10000);
    assert_int_equal(c->limits.header_timeout_ms, 10000);
    assert_int_equal(c->limits.idle_timeout_ms, 120000);
    assert_int_equal(c->limits.stream_buffer_bytes, 1048576);
    assert_int_equal(c->limits.response_timeout_ms, 600000);
    assert_string_equal(c->access_log, "stdout");
    assert_int_equal(c->access_log_mode, 0640);
    assert_int_equal(c->drain_grace_s, 30);
    assert_int_equal(c->stats_interval_ms, 250);
    assert_int_equal(c->worker_hang_timeout_s, 30);
    assert_null(c->runtime_dir);
    assert_int_equal(c->n_listen, 1);
    assert_string_equal(c->listen[0].address, "127.0.0.1:8080");
    assert_null(c->listen[0].tls_cert);
    assert_null(c->listen[0].tls_client_ca);
    assert_int_equal(c->n_tenants, 0);
    /* No region: a single gateway. */
    assert_null(c->region.name);
    assert_null(c->region.endpoint);
    assert_int_equal(c->region.n_tags, 0);
    assert_string_equal(c->cluster, "default");
    assert_null(c->redis.address);
    assert_int_equal(c->n_peers, 0);
    assert_null(c->peer_tls.ca);
    assert_null(c->peer_tls.cert);
    assert_int_equal(c->routing.policy, GW_POLICY_LATENCY);
    assert_true(c->routing.slo_ms == 500);
    assert_int_equal(c->routing.heartbeat_ms, 1000);
    assert_int_equal(c->routing.stale_after_ms, 3000);
    assert_int_equal(c->routing.eject_after, 3);
    assert_int_equal(c->routing.eject_base_ms, 1000);
    assert_int_equal(c->routing.eject_max_ms, 30000);
    assert_int_equal(c->routing.ping_interval_ms, 250);
    assert_true(c->routing.retry_budget == 0.2);
    assert_true(c->routing.spread);
    assert_true(c->routing.replay);
    assert_int_equal(c->routing.replay_max, 2);
    assert_false(c->routing.hedge);
    assert_int_equal(c->routing.hedge_max_tokens, 64);
    assert_int_equal(c->routing.hedge_delay_ms, 0);
    assert_true(c->routing.hedge_share == 0.05);
    assert_int_equal(c->routing.health_check_ms, 0); /* off */
    assert_int_equal(c->routing.health_check_timeout_ms, 5000);
    assert_int_equal(c->routing.health_check_failures, 2);
    assert_int_equal(c->routing.health_check_successes, 2);
}

static void check_default_worker(const gw_worker_cfg *w, const char *model, const char *name)
{
    assert_string_equal(w->model, model);
    assert_string_equal(w->name, name);
    assert_int_equal(w->n_devices, 1);
    assert_string_equal(w->devices[0], "cpu");
    assert_int_equal(w->threads, 0);
    assert_int_equal(w->kv_cache_mb, 256);
    assert_int_equal(w->max_seqs, 32);
    assert_int_equal(w->max_batch_tokens, 512);
    assert_int_equal(w->max_queue, 64);
    assert_int_equal(w->batch_max_wait_ms, 30000);
    assert_int_equal(w->prompt_max_wait_ms, 10000);
}

static void test_defaults(void **state)
{
    static const char *const empties[] = {"", "# only a comment\n", "---\n", "~\n"};
    for (size_t i = 0; i < sizeof(empties) / sizeof(*empties); i++) {
        gw_config *c = load_ok(empties[i]);
        check_default_limits(c);
        assert_int_equal(c->n_workers, 0);
        assert_int_equal(gw_config_default_worker(c, "/srv/models/demo_model.gguf"), 0);
        assert_int_equal(c->n_workers, 1);
        check_default_worker(&c->workers[0], "/srv/models/demo_model.gguf", "demo_model");
        /* A config with workers keeps them. */
        assert_int_equal(gw_config_default_worker(c, "/other.gguf"), 0);
        assert_int_equal(c->n_workers, 1);
        gw_config_free(c);
    }

    gw_config *c;
    assert_int_equal(gw_config_default("models/demo_model.gguf", &c), 0);
    assert_null(c->path);
    check_default_limits(c);
    assert_int_equal(c->n_workers, 1);
    check_default_worker(&c->workers[0], "models/demo_model.gguf", "demo_model");
    gw_config_free(c);
    /* A name without the .gguf suffix is the file name as is. */
    assert_int_equal(gw_config_default("/m/tiny.bin", &c), 0);
    assert_string_equal(c->workers[0].name, "tiny.bin");
    gw_config_free(c);

    /* Tenant defaults: every model, unlimited, not admin. */
    c = load_ok("tenants:\n  - name: a\n    keys: [" H_K1 "]\n");
    assert_int_equal(c->n_tenants, 1);
    assert_int_equal(c->tenants[0].n_models, 1);
    assert_string_equal(c->tenants[0].models[0], "*");
    assert_true(c->tenants[0].rps == 0 && c->tenants[0].tpm == 0);
    assert_false(c->tenants[0].admin);
    assert_int_equal(c->tenants[0].n_residency, 0);
    assert_int_equal(c->tenants[0].policy, GW_POLICY_DEFAULT);
    assert_true(c->tenants[0].slo_ms == 0 && c->tenants[0].max_price == 0);
    assert_true(c->tenants[0].budget_daily == 0 && c->tenants[0].budget_monthly == 0);
    assert_false(c->tenants[0].batch_only);
    assert_true(c->tenants[0].weight == 1);
    gw_config_free(c);

    /* A region alone: no Redis, no peers, price 0; stale_after follows heartbeat_ms. */
    c = load_ok("region: {name: solo}\nrouting: {heartbeat_ms: 200}\n");
    assert_string_equal(c->region.name, "solo");
    assert_null(c->region.endpoint);
    assert_null(c->region.gpu);
    assert_true(c->region.price_in == 0 && c->region.price_out == 0);
    assert_null(c->redis.address);
    assert_int_equal(c->routing.heartbeat_ms, 200);
    assert_int_equal(c->routing.stale_after_ms, 600);
    gw_config_free(c);

    /* Hedging needs no region: local workers hedge among themselves. */
    c = load_ok("routing: {hedge: true, hedge_max_tokens: 32, hedge_delay_ms: 150, hedge_share: 0.5}\n");
    assert_true(c->routing.hedge);
    assert_int_equal(c->routing.hedge_max_tokens, 32);
    assert_int_equal(c->routing.hedge_delay_ms, 150);
    assert_true(c->routing.hedge_share == 0.5);
    gw_config_free(c);
}

/* ---- the multi-region sections ---- */

static const char routing_yaml[] =
    "listen:\n"
    "  - address: \"0.0.0.0:8443\"\n"
    "    tls: {cert: /c.pem, key: /k.pem, client_ca: /peers-ca.pem, peer_names: [us-east, "
    "gw.ap.example]}\n"
    "  - address: \"127.0.0.1:8080\"\n"
    "tenants:\n"
    "  - name: acme\n"
    "    keys: [" H_K1 "]\n"
    "    residency: [eu, gdpr]\n"
    "    policy: cost\n"
    "    slo_ms: 120.5\n"
    "    max_price: 2.5\n"
    "    priority: batch\n"
    "    weight: 2.5\n"
    "    budget: {daily: 5, monthly: 100.5}\n"
    "region:\n"
    "  name: eu-west.1\n"
    "  endpoint: \"tls:10.0.0.5:8443\"\n"
    "  tags: [eu, gdpr]\n"
    "  price: {input: 0.5, output: 1.25}\n"
    "  gpu: H100 80GB\n"
    "cluster: prod_2\n"
    "redis:\n"
    "  address: \"[::1]:6380\"\n"
    "  password: s3cret\n"
    "  db: 3\n"
    "  timeout_ms: 2500\n"
    "  record_keys: [\"fleet-key-0123456789abcdef-0123456789\", \"old-fleet-key-0123456789abcdef-012345\"]\n"
    "routing:\n"
    "  policy: cost\n"
    "  slo_ms: 80\n"
    "  heartbeat_ms: 500\n"
    "  stale_after_ms: 2000\n"
    "  eject_after: 5\n"
    "  eject_base_ms: 250\n"
    "  eject_max_ms: 8000\n"
    "  ping_interval_ms: 300\n"
    "  retry_budget: 0.1\n"
    "  spread: false\n"
    "  health_check_ms: 2000\n"
    "  health_check_timeout_ms: 700\n"
    "  health_check_failures: 3\n"
    "  health_check_successes: 4\n"
    "peers:\n"
    "  - name: us-east\n"
    "    endpoint: \"tcp:localhost:9443\"\n"
    "  - name: ap-south\n"
    "    endpoint: \"tls:[fd00::5]:8443\"\n"
    "peer_tls: {ca: /ca.pem, cert: /peer.pem, key: /peer.key}\n";

#define FLEET_KEY "0123456789abcdef0123456789abcdef"

static void test_routing_full(void **state)
{
    gw_config *c = load_ok(routing_yaml);
    assert_string_equal(c->listen[0].tls_client_ca, "/peers-ca.pem");
    assert_int_equal(c->listen[0].n_tls_peer_names, 2);
    assert_string_equal(c->listen[0].tls_peer_names[1], "gw.ap.example");
    assert_null(c->listen[1].tls_client_ca);
    assert_int_equal(c->listen[1].n_tls_peer_names, 0);
    const gw_tenant_cfg *t = &c->tenants[0];
    assert_int_equal(t->n_residency, 2);
    assert_string_equal(t->residency[0], "eu");
    assert_string_equal(t->residency[1], "gdpr");
    assert_int_equal(t->policy, GW_POLICY_COST);
    assert_true(t->slo_ms == 120.5);
    assert_true(t->max_price == 2.5);
    assert_true(t->weight == 2.5);
    assert_true(t->budget_daily == 5 && t->budget_monthly == 100.5);
    assert_true(t->batch_only);

    assert_string_equal(c->region.name, "eu-west.1");
    assert_string_equal(c->region.endpoint, "tls:10.0.0.5:8443");
    assert_int_equal(c->region.n_tags, 2);
    assert_string_equal(c->region.tags[0], "eu");
    assert_string_equal(c->region.tags[1], "gdpr");
    assert_true(c->region.price_in == 0.5 && c->region.price_out == 1.25);
    assert_string_equal(c->region.gpu, "H100 80GB");
    assert_string_equal(c->cluster, "prod_2");
    assert_string_equal(c->redis.address, "[::1]:6380");
    assert_string_equal(c->redis.host, "::1");
    assert_int_equal(c->redis.port, 6380);
    assert_string_equal(c->redis.password, "s3cret");
    assert_int_equal(c->redis.db, 3);
    assert_int_equal(c->redis.timeout_ms, 2500);
    assert_int_equal(c->redis.n_record_keys, 2);
    assert_string_equal(c->redis.record_keys[1], "old-fleet-key-0123456789abcdef-012345");
    assert_int_equal(c->routing.policy, GW_POLICY_COST);
    assert_true(c->routing.slo_ms == 80);
    assert_int_equal(c->routing.heartbeat_ms, 500);
    assert_int_equal(c->routing.stale_after_ms, 2000);
    assert_int_equal(c->routing.eject_after, 5);
    assert_int_equal(c->routing.eject_base_ms, 250);
    assert_int_equal(c->routing.eject_max_ms, 8000);
    assert_int_equal(c->routing.ping_interval_ms, 300);
    assert_true(c->routing.retry_budget == 0.1);
    assert_false(c->routing.spread);
    assert_int_equal(c->routing.health_check_ms, 2000);
    assert_int_equal(c->routing.health_check_timeout_ms, 700);
    assert_int_equal(c->routing.health_check_failures, 3);
    assert_int_equal(c->routing.health_check_successes, 4);
    assert_int_equal(c->n_peers, 2);
    assert_string_equal(c->peers[0].name, "us-east");
    assert_string_equal(c->peers[0].endpoint, "tcp:localhost:9443");
    assert_string_equal(c->peers[1].name, "ap-south");
    assert_string_equal(c->peers[1].endpoint, "tls:[fd00::5]:8443");
    assert_string_equal(c->peer_tls.ca, "/ca.pem");
    assert_string_equal(c->peer_tls.cert, "/peer.pem");
    assert_string_equal(c->peer_tls.key, "/peer.key");
    gw_config_free(c);

    /* Redis on localhost; peer_tls with a CA only. */
    c = load_ok("region: {name: r}\nredis: {address: \"localhost:6379\", record_keys: [" FLEET_KEY "]}\n"
                "peer_tls: {ca: /ca}\n");
    assert_string_equal(c->redis.host, "localhost");
    assert_int_equal(c->redis.port, 6379);
    assert_null(c->redis.password);
    assert_int_equal(c->redis.timeout_ms, 500);
    assert_int_equal(c->redis.db, 0);
    assert_string_equal(c->peer_tls.ca, "/ca");
    assert_null(c->peer_tls.cert);
    gw_config_free(c);
}

/* ---- broken files ---- */

#define PW10 "xxxxxxxxxx"
#define PW300                                                                                                \
    PW10 PW10 PW10 PW10 PW10 PW10 PW10 PW10 PW10 PW10 PW10 PW10 PW10 PW10 PW10 PW10 PW10 PW10 PW10 PW10 PW10 \
        PW10 PW10 PW10 PW10 PW10 PW10 PW10 PW10 PW10
#define TEN_A "tenants:\n  - name: a\n    keys: [" H_K1 "]\n"

static const struct {
    const char *yaml, *want;
} broken[] = {
    {TEN_A "  - name: b\n    keys: [" H_K3 "]\n    rpss: 3\n", "bad.yaml:6: tenants[1].rpss: unknown key"},
    {"listne:\n  - address: 127.0.0.1:1\n", "bad.yaml:1: listne: unknown key"},
    {"listen:\n  - address: 127.0.0.1:1\n    tls: {cert: /c, key: /k, ca: /a}\n",
     "bad.yaml:3: listen[0].tls.ca: unknown key"},
    {"workers:\n  - name: x\n", "bad.yaml:2: workers[0].model: required"},
    {"workers:\n  - model: /m.gguf\n  - model: /n.gguf\n    thread: 2\n",
     "bad.yaml:4: workers[1].thread: unknown key"},
    {"workers: []\n", "bad.yaml:1: workers: needs at least one worker"},
    {"workers:\n  - model: /m.gguf\n    power_watts: -1\n", "bad.yaml:3: workers[0].power_watts: must be a number from 0"},
    {"workers:\n  - model: /m.gguf\n    name: \"a,b\"\n",
     "bad.yaml:3: workers[0].name: must be printable ASCII without spaces, commas, quotes or backslashes"},
    {"workers:\n  - model: /m.gguf\n    name: \"\"\n", "bad.yaml:3: workers[0].name: must not be empty"},
    {"logging: {access_log: ''}\n", "bad.yaml:1: logging.access_log: must not be empty"},
    {"logging: {access_log_mode: \"0666\"}\n", "bad.yaml:1: logging.access_log_mode: 0666 lets every local user write to the log"},
    {"logging: {access_log_mode: 640x}\n", "bad.yaml:1: logging.access_log_mode: must be an octal mode such as \"0640\""},
    {"logging: {access_log_mode: 0800}\n", "bad.yaml:1: logging.access_log_mode: must be an octal mode such as \"0640\""},
    {"listen: [{address: \"127.0.0.1:1\", tls: {cert: '', key: ''}}]\n",
     "bad.yaml:1: listen[0].tls.cert: must not be empty"},
    {"workers:\n  - model: /m.gguf\n    devices: [CPU]\n",
     "bad.yaml:3: workers[0].devices[0]: 'CPU' is not a device: cpu, auto, a GPU index, or a GPU-/MIG- UUID"},
    {"workers:\n  - model: /m.gguf\n    devices: [cuda]\n", "workers[0].devices[0]: 'cuda' is not a device"},
    {"workers:\n  - model: /m.gguf\n    threads: 010\n",
     "bad.yaml:3: workers[0].threads: must be a whole number without leading zeros"},
    {"region: {name: a}\nredis: {address: \"127.0.0.1:6379\", password: !env REDIS_PW}\n",
     "bad.yaml:2: redis.password: YAML tags (!env) are not supported"},
    {"region: {name: a}\nredis: {address: \"127.0.0.1:6379\", password: " PW300 "}\n",
     "bad.yaml:2: redis.password: at most 255 bytes"},
    {"drain_grace_s: 5\nlogging:\n  access_log: \"a\xff\"\n",
     "bad.yaml:3: YAML syntax error: invalid leading UTF-8 octet (byte"},
    {"workers:\n  - model: "
     "/models/a-file-name-that-is-much-too-long-to-be-a-model-id-in-a-region-record.gguf\n",
     "bad.yaml:2: workers[0].model: the model name taken from the file name, "
     "'a-file-name-that-is-much-too-long-to-be-a-model-id-in-a-region-record', must be 1 to 63 bytes: set "
     "name"},
    {"region: {name: eu}\nworkers:\n  - {model: /m.gguf, name: m0}\n  - {model: /m.gguf, name: m1}\n  - "
     "{model: /m.gguf, name: m2}\n  - {model: /m.gguf, name: m3}\n  - {model: /m.gguf, name: m4}\n  - "
     "{model: /m.gguf, name: m5}\n  - {model: /m.gguf, name: m6}\n  - {model: /m.gguf, name: m7}\n  - "
     "{model: /m.gguf, name: m8}\n  - {model: /m.gguf, name: m9}\n  - {model: /m.gguf, name: m10}\n  - "
     "{model: /m.gguf, name: m11}\n  - {model: /m.gguf, name: m12}\n  - {model: /m.gguf, name: m13}\n  - "
     "{model: /m.gguf, name: m14}\n  - {model: /m.gguf, name: m15}\n  - {model: /m.gguf, name: m16}\n",
     "bad.yaml:1: region: the workers serve 17 models; a region serves at most 16"},
    {"workers:\n  - model: /m.gguf\n    threads: 2000\n",
     "bad.yaml:3: workers[0].threads: must be a whole number from 0 to 1024"},
    {"workers:\n  - model: /m.gguf\n    prompt_max_wait_ms: -1\n",
     "bad.yaml:3: workers[0].prompt_max_wait_ms: must be a whole number from 0 to 86400000"},
    {"workers:\n  - model: /m.gguf\n    max_seqs: 0\n",
     "bad.yaml:3: workers[0].max_seqs: must be a whole number from 1"},
    {"workers:\n  - model: /m.gguf\n    max_seqs: 1024\n",
     "bad.yaml:3: workers[0]: max_batch_tokens (512) must be at least max_seqs (1024)"},
    {"workers:\n  - model: /m.gguf\n    kv_type: q4_0\n", "bad.yaml:3: workers[0].kv_type: f16 or q8_0"},
    {"workers:\n  - model: /m.gguf\n    chat_template: \"{{ messages }}\"\n",
     "bad.yaml:3: workers[0].chat_template: one of " RT_CHAT_KIND_NAMES},
    {"workers:\n  - model: /m.gguf\n    chat_template: /nonexistent/chat.jinja\n",
     "bad.yaml:3: workers[0].chat_template: /nonexistent/chat.jinja: No such file"},
    {"workers:\n  - model: /m.gguf\n    devices: [cpu, GPU-1]\n    kv_type: q8_0\n",
     "bad.yaml:4: workers[0].kv_type: q8_0 is for CPU workers, and device GPU-1 is not one"},
    {"workers:\n  - model: [a]\n", "bad.yaml:2: workers[0].model: must be a string, not a list"},
    {"workers:\n  - model: /m.gguf\n    devices: [GPU-1, cpu, GPU-1]\n",
     "bad.yaml:3: workers[0].devices[2]: device GPU-1 is listed twice"},
    {"workers:\n  - model: /m.gguf\n    devices: [auto, GPU-1]\n",
     "workers[0].devices[0]: auto stands alone"},
    {"workers:\n  - model: /m.gguf\n    devices: [\"GPU-1,GPU-2\"]\n",
     "workers[0].devices[0]: one device per entry"},
    {"workers:\n  - model: /m.gguf\n    devices: []\n", "bad.yaml:3: workers[0].devices: needs at least one"},
    {"workers:\n  model: /m.gguf\n", "bad.yaml:2: workers: must be a list, not a map"},
    {"limits:\n  max_body_bytes: \"10\"\n",
     "bad.yaml:2: limits.max_body_bytes: must be a whole number, not a quoted string"},
    {"limits:\n  max_body_bytes: 10k\n",
     "bad.yaml:2: limits.max_body_bytes: must be a whole number from 1 to"},
    {"limits:\n  max_concurrent_streams: 1.5\n",
     "bad.yaml:2: limits.max_concurrent_streams: must be a whole number"},
    {"limits:\n  max_connections: -5\n", "bad.yaml:2: limits.max_connections: must be a whole number from 1"},
    {"limits:\n  header_timeout_ms:\n",
     "bad.yaml:2: limits.header_timeout_ms: must be a whole number, not empty"},
    {"limits: [1, 2]\n", "bad.yaml:1: limits: must be a map, not a list"},
    {"limits:\n  response_timeout_ms: -1\n",
     "bad.yaml:2: limits.response_timeout_ms: must be a whole number from 0 to 86400000"},
    {"listen: {address: 127.0.0.1:80}\n", "bad.yaml:1: listen: must be a list, not a map"},
    {"listen: []\n", "bad.yaml:1: listen: needs at least one address"},
    {"listen:\n  - tls: {cert: /c, key: /k}\n", "bad.yaml:2: listen[0].address: required"},
    {"listen:\n  - address: 127.0.0.1:70000\n", "bad.yaml:2: listen[0].address: port must be a number"},
    {"listen:\n  - address: \"127.0.0.1:\"\n", "bad.yaml:2: listen[0].address: port must be a number"},
    {"listen:\n  - address: localhost:80\n", "bad.yaml:2: listen[0].address: HOST must be a numeric IPv4"},
    {"listen:\n  - address: 127.0.0.1\n", "bad.yaml:2: listen[0].address: want HOST:PORT"},
    {"listen:\n  - address: \"[::1:80\"\n", "bad.yaml:2: listen[0].address: want HOST:PORT"},
    {"listen:\n  - address: \"[fe80::zz]:80\"\n", "bad.yaml:2: listen[0].address: not a numeric IPv6"},
    {"listen:\n  - address: unix:relative.sock\n",
     "bad.yaml:2: listen[0].address: unix: needs an absolute path"},
    {"listen:\n  - address: 0.0.0.0:80\n", "bad.yaml:2: listen[0].address: not a loopback address"},
    {"listen:\n  - address: \"[::]:80\"\n", "bad.yaml:2: listen[0].address: not a loopback address"},
    {"listen:\n  - address: 127.0.0.1:1\n  - address: 127.0.0.1:1\n",
     "bad.yaml:3: listen[1].address: 127.0.0.1:1 is already listen[0]"},
    {"listen:\n  - address: 127.0.0.1:80\n    tls: {cert: /c.pem}\n",
     "bad.yaml:3: listen[0].tls: cert and key go together"},
    {"listen:\n  - address: 127.0.0.1:80\n    tls:\n      key: /k.pem\n",
     "bad.yaml:4: listen[0].tls: cert and key go together"},
    {"listen:\n  - address: 127.0.0.1:80\n    tls:\n", "bad.yaml:3: listen[0].tls: must be a map, not empty"},
    {"drain_grace_s: 1\ndrain_grace_s: 2\n", "bad.yaml:2: drain_grace_s: duplicate key"},
    {"drain_grace_s: 1e3\n", "bad.yaml:1: drain_grace_s: must be a whole number"},
    {"stats_interval_ms: 0\n", "bad.yaml:1: stats_interval_ms: must be a whole number from 10"},
    {"worker_hang_timeout_s: -1\n",
     "bad.yaml:1: worker_hang_timeout_s: must be a whole number from 0 to 86400"},
    {"runtime_dir: run/ig\n", "bad.yaml:1: runtime_dir: must be an absolute path"},
    {"runtime_dir: "
     "/tmp/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n",
     "bad.yaml:1: runtime_dir: longer than 80 bytes"},
    {"logging:\n  access_log: [a]\n", "bad.yaml:2: logging.access_log: must be a string, not a list"},
    {"logging:\n  acces_log: off\n", "bad.yaml:2: logging.acces_log: unknown key"},
    {"tenants:\n  - name: a\n    keys: [abc]\n", "bad.yaml:3: tenants[0].keys[0]: must be a SHA-256 hash"},
    {"tenants:\n  - name: a\n    keys: [" H_K1 "0]\n",
     "bad.yaml:3: tenants[0].keys[0]: must be a SHA-256 hash"},
    {"tenants:\n  - name: a\n    keys: [ig-AAAA]\n",
     "bad.yaml:3: tenants[0].keys[0]: this is a key, not its hash"},
    {"tenants:\n  - name: a\n    keys: []\n", "bad.yaml:3: tenants[0].keys: needs at least one key hash"},
    {"tenants:\n  - name: a\n    keys: " H_K1 "\n",
     "bad.yaml:3: tenants[0].keys: must be a list, not a plain value"},
    {"tenants:\n  - name: a\n", "bad.yaml:2: tenants[0].keys: required"},
    {"tenants:\n  - keys: [" H_K1 "]\n", "bad.yaml:2: tenants[0].name: required"},
    {"tenants:\n  - name: a b\n    keys: [" H_K1 "]\n",
     "bad.yaml:2: tenants[0].name: must be 1 to 64 characters"},
    {"tenants:\n  - name: \"-\"\n    keys: [" H_K1 "]\n",
     "bad.yaml:2: tenants[0].name: must be 1 to 64 characters"},
    {TEN_A "  - name: a\n    keys: [" H_K3 "]\n",
     "bad.yaml:4: tenants[1].name: tenant a is already tenants[0]"},
    {TEN_A "  - name: b\n    keys: [" H_K3 ", " H_K1 "]\n",
     "bad.yaml:5: tenants[1].keys[1]: the same key hash is already tenants[0].keys[0]"},
    {TEN_A "    rps: -1\n", "bad.yaml:4: tenants[0].rps: must be a number from 0"},
    {TEN_A "    rps: .inf\n", "bad.yaml:4: tenants[0].rps: must be a number from 0"},
    {TEN_A "    tpm: \"100\"\n", "bad.yaml:4: tenants[0].tpm: must be a number, not a quoted string"},
    {TEN_A "    tpm: 0x10\n", "bad.yaml:4: tenants[0].tpm: must be a number from 0"},
    {TEN_A "    admin: yes\n", "bad.yaml:4: tenants[0].admin: must be true or false"},
    {TEN_A "    models: \"*\"\n", "bad.yaml:4: tenants[0].models: must be a list, not a quoted string"},
    {TEN_A "    models: [[a]]\n", "bad.yaml:4: tenants[0].models[0]: must be a string, not a list"},
    {"tenants: {name: a}\n", "bad.yaml:1: tenants: must be a list, not a map"},
    {"tenants:\n  - &t\n    name: a\n    keys: [" H_K1 "]\n  - *t\n",
     "tenants[1]: YAML aliases (*name) are not supported"},
    {"listen: &l [*l]\n", "YAML aliases (*name) are not supported"},
    {"- a\n- b\n", "bad.yaml:1: (top level): must be a map of settings, not a list"},
    {"just text\n", "bad.yaml:1: (top level): must be a map of settings"},
    {"[1, 2]: x\n", "bad.yaml:1: (top level): keys must be plain names, not a list"},
    {"drain_grace_s: 1\n---\ndrain_grace_s: 2\n",
     "bad.yaml:3: (top level): only one YAML document is allowed"},
    {"listen:\n  - address: [\n", "bad.yaml:3: YAML syntax error: "},
    {"a: b: c\n", "bad.yaml:1: YAML syntax error: mapping values are not allowed in this context"},
    {"listen:\n\t- address: 127.0.0.1:1\n", "bad.yaml:2: YAML syntax error: "},
    {"drain_grace_s: \"\\x01\"\n", "bad.yaml:1: drain_grace_s: must be a whole number, not a quoted string"},
    {"logging:\n  access_log: \"a\\tb\"\n",
     "bad.yaml:2: logging.access_log: control characters are not allowed"},
    /* multi-region */
    {"listen:\n  - address: 127.0.0.1:80\n    tls: {client_ca: /ca.pem}\n",
     "bad.yaml:3: listen[0].tls.client_ca: client certificates need TLS"},
    {"listen:\n  - address: 127.0.0.1:80\n    tls: {cert: /c, key: /k, client_ca: [a]}\n",
     "bad.yaml:3: listen[0].tls.client_ca: must be a string, not a list"},
    {"listen:\n  - address: 127.0.0.1:80\n    tls: {cert: /c, key: /k, peer_names: [a]}\n",
     "bad.yaml:3: listen[0].tls.peer_names: peer names are checked on certificates from client_ca"},
    {"listen:\n  - address: 127.0.0.1:80\n    tls: {cert: /c, key: /k, client_ca: /ca, peer_names: [\"\"]}\n",
     "bad.yaml:3: listen[0].tls.peer_names[0]: must not be empty"},
    {"listen:\n  - address: 127.0.0.1:80\n    tls: {cert: /c, key: /k, client_ca: /ca, peer_names: [a, "
     ".b.example]}\n",
     "bad.yaml:3: listen[0].tls.peer_names: peer_names[1]: a name of 1 to 253 bytes, not a pattern"},
    {"listen:\n  - address: 127.0.0.1:80\n    tls: {cert: /c, key: /k, client_ca: /ca, peer_names: "
     "[\"*.b\"]}\n",
     "bad.yaml:3: listen[0].tls.peer_names: peer_names[0]: a name of 1 to 253 bytes, not a pattern"},
    {"listen:\n  - address: 127.0.0.1:80\n    tls: {cert: /c, key: /k, client_ca: /ca, peer_names: []}\n",
     "bad.yaml:3: listen[0].tls.peer_names: give at least one name"},
    {"listen:\n  - address: 127.0.0.1:80\n    tls: {cert: /c, key: /k, client_ca: /ca, peer_names: a}\n",
     "bad.yaml:3: listen[0].tls.peer_names: must be a list"},
    {"region:\n  endpoint: \"tls:10.0.0.1:1\"\n", "bad.yaml:2: region.name: required"},
    {"region: {name: \"eu west\"}\n", "bad.yaml:1: region.name: must be 1 to 63 characters"},
    {"region: {name: eu, zone: a}\n", "bad.yaml:1: region.zone: unknown key"},
    {"region: eu\n", "bad.yaml:1: region: must be a map, not a plain value"},
    {"region:\n  name: eu\n  endpoint: \"10.0.0.1:8443\"\n",
     "bad.yaml:3: region.endpoint: must be tls:HOST:PORT or tcp:HOST:PORT"},
    {"region:\n  name: eu\n  endpoint: \"unix:/run/ig.sock\"\n", "region.endpoint: must be tls:HOST:PORT"},
    {"region:\n  name: eu\n  endpoint: \"tls:gw.example.com:8443\"\n",
     "bad.yaml:3: region.endpoint: HOST must be a numeric IPv4 address, [IPv6] or localhost"},
    {"region:\n  name: eu\n  endpoint: \"tcp:10.0.0.1:0\"\n",
     "bad.yaml:3: region.endpoint: port must be a number from 1 to 65535"},
    {"region:\n  name: eu\n  endpoint: \"tcp:10.0.0.1\"\n", "bad.yaml:3: region.endpoint: want HOST:PORT"},
    {"region:\n  name: eu\n  endpoint: \"tls:[fe80::zz]:1\"\n",
     "region.endpoint: not a numeric IPv6 address"},
    {"region:\n  name: eu\n  endpoint: \"tls:[::1:1\"\n", "region.endpoint: want HOST:PORT or [IPV6]:PORT"},
    {"region:\n  name: eu\n  tags: [eu, \"g,dpr\"]\n",
     "bad.yaml:3: region.tags[1]: a tag is 1 to 31 characters from A-Z a-z 0-9 . _ -"},
    {"region:\n  name: eu\n  tags:\n    - eu\n    - eu\n",
     "bad.yaml:5: region.tags[1]: tag eu is listed twice"},
    {"region:\n  name: eu\n  tags: [a, b, c, d, e, f, g, h, i]\n",
     "bad.yaml:3: region.tags: too many entries (at most 8)"},
    {"region:\n  name: eu\n  tags: [aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa]\n", "region.tags[0]: a tag is 1 to 31"},
    {"region:\n  name: eu\n  price: {input: -1}\n",
     "bad.yaml:3: region.price.input: must be a number from 0"},
    {"region:\n  name: eu\n  price: {output: \"2\"}\n",
     "bad.yaml:3: region.price.output: must be a number, not a quoted string"},
    {"region:\n  name: eu\n  price: {out: 2}\n", "bad.yaml:3: region.price.out: unknown key"},
    {"region:\n  name: eu\n  gpu: "
     "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n",
     "bad.yaml:3: region.gpu: longer than 63 bytes"},
    {"cluster: \"a:b\"\n", "bad.yaml:1: cluster: must be 1 to 63 characters"},
    {"cluster: [a]\n", "bad.yaml:1: cluster: must be a string, not a list"},
    {"redis: {address: \"127.0.0.1:6379\"}\n", "bad.yaml:1: redis: needs a region section"},
    {"region: {name: eu}\nredis: {password: x}\n", "bad.yaml:2: redis.address: required"},
    {"region: {name: eu}\nredis: {address: \"127.0.0.1:6379\", timeout_ms: 5}\n",
     "bad.yaml:2: redis.timeout_ms: must be a whole number from 10"},
    {"region: {name: eu}\nredis: {address: \"redis.local:6379\"}\n",
     "bad.yaml:2: redis.address: HOST must be a numeric IPv4 address, [IPv6] or localhost"},
    {"region: {name: eu}\nredis: {address: \"127.0.0.1\"}\n", "bad.yaml:2: redis.address: want HOST:PORT"},
    {"region: {name: eu}\nredis: {address: \"127.0.0.1:6379\", db: -1}\n",
     "bad.yaml:2: redis.db: must be a whole number from 0 to 65535"},
    {"region: {name: eu}\nredis: {address: \"127.0.0.1:6379\"}\n",
     "bad.yaml:2: redis.record_keys: required: the fleet key that signs and proves the region records"},
    {"region: {name: eu}\nredis: {address: \"127.0.0.1:6379\", record_keys: [short]}\n",
     "bad.yaml:2: redis.record_keys: key 0: 32 to 128 bytes"},
    {"region: {name: eu}\nredis: {address: \"127.0.0.1:6379\", record_keys: []}\n",
     "bad.yaml:2: redis.record_keys: give one key (two while rotating)"},
    {"region: {name: eu}\nredis: {address: \"127.0.0.1:6379\", record_keys: [a, b, c]}\n",
     "bad.yaml:2: redis.record_keys: too many entries (at most 2)"},
    {"region: {name: eu}\nredis: {address: \"127.0.0.1:6379\", user: x}\n",
     "bad.yaml:2: redis.user: unknown key"},
    {"routing: {policy: fastest}\n", "bad.yaml:1: routing.policy: must be latency, cost, carbon or primary"},
    {"routing: {policy: primary}\n", "bad.yaml:1: routing.policy: primary needs routing.primary"},
    {"routing: {primary: [a, a]}\n", "bad.yaml:1: routing.primary[1]: region a is listed twice"},
    {"routing: {primary: []}\n", "bad.yaml:1: routing.primary: give at least one region name"},
    {"routing: {primary: [a], primary_return: 0}\n", "bad.yaml:1: routing.primary_return: must be more than 0"},
    {"routing: {primary_return: 1.5}\n", "bad.yaml:1: routing.primary_return: must be a number from 0 to 1"},
    {"region: {name: eu, carbon: -3}\n", "bad.yaml:1: region.carbon: must be a number from 0"},
    {"region: {name: eu, carbon_source: \"https://x/c\"}\n",
     "bad.yaml:1: region.carbon_source: only http:// URLs (or a file path) are polled"},
    {"region: {name: eu, carbon_source: \"http://grid.example:80/c\"}\n",
     "bad.yaml:1: region.carbon_source: HOST must be a numeric IPv4 address"},
    {"region: {name: eu, carbon_poll_ms: 10}\n", "bad.yaml:1: region.carbon_poll_ms: must be a whole number from 1000"},
    {"routing: {slo_ms: -5}\n", "bad.yaml:1: routing.slo_ms: must be a number from 0"},
    {"routing: {heartbeat_ms: 10}\n",
     "bad.yaml:1: routing.heartbeat_ms: must be a whole number from 50 to 60000"},
    {"routing: {heartbeat_ms: 1000, stale_after_ms: 500}\n",
     "bad.yaml:1: routing.stale_after_ms: not more than twice heartbeat_ms (1000)"},
    {"routing: {heartbeat_ms: 1000, stale_after_ms: 2000}\n",
     "bad.yaml:1: routing.stale_after_ms: not more than twice heartbeat_ms (1000)"},
    {"routing:\n  eject_base_ms: 5000\n  eject_max_ms: 1000\n",
     "bad.yaml:3: routing.eject_max_ms: eject_max_ms (1000) is less than eject_base_ms (5000)"},
    {"routing:\n  eject_base_ms: 60000\n",
     "bad.yaml:2: routing.eject_base_ms: eject_max_ms (30000) is less than eject_base_ms (60000)"},
    {"routing: {eject_after: 1.5}\n", "bad.yaml:1: routing.eject_after: must be a whole number"},
    {"routing: {ping_interval_ms: 0}\n",
     "bad.yaml:1: routing.ping_interval_ms: must be a whole number from 50"},
    {"routing: {retry_budget: 1.5}\n", "bad.yaml:1: routing.retry_budget: must be a number from 0 to 1"},
    {"routing: {retry: 1}\n", "bad.yaml:1: routing.retry: unknown key"},
    {"routing: {replay_max: 17}\n", "bad.yaml:1: routing.replay_max: must be a whole number from 0 to 16"},
    {"routing: {replay: maybe}\n", "bad.yaml:1: routing.replay: must be true or false"},
    {"routing: {hedge: 1}\n", "bad.yaml:1: routing.hedge: must be true or false"},
    {"routing: {hedge_max_tokens: 0}\n",
     "bad.yaml:1: routing.hedge_max_tokens: must be a whole number from 1 to 1000000"},
    {"routing: {hedge_delay_ms: -1}\n", "bad.yaml:1: routing.hedge_delay_ms: must be a whole number from 0"},
    {"routing: {hedge_share: 1.5}\n", "bad.yaml:1: routing.hedge_share: must be a number from 0 to 1"},
    {"routing: {health_check_ms: 50}\n",
     "bad.yaml:1: routing.health_check_ms: must be 0 (off) or from 100 to 3600000"},
    {"routing: {health_check_ms: -1}\n",
     "bad.yaml:1: routing.health_check_ms: must be a whole number from 0 to 3600000"},
    {"routing: {health_check_timeout_ms: 10}\n",
     "bad.yaml:1: routing.health_check_timeout_ms: must be a whole number from 50 to 600000"},
    {"routing: {health_check_failures: 0}\n",
     "bad.yaml:1: routing.health_check_failures: must be a whole number from 1 to 100"},
    {"routing: {health_check_successes: 101}\n",
     "bad.yaml:1: routing.health_check_successes: must be a whole number from 1 to 100"},
    {"routing: {health_check: 1}\n", "bad.yaml:1: routing.health_check: unknown key"},
    {"peers:\n  - {name: us, endpoint: \"tcp:127.0.0.1:1\"}\n", "bad.yaml:2: peers: needs a region section"},
    {"region: {name: eu}\npeers:\n  - {name: us}\n", "bad.yaml:3: peers[0].endpoint: required"},
    {"region: {name: eu}\npeers:\n  - {endpoint: \"tcp:127.0.0.1:1\"}\n",
     "bad.yaml:3: peers[0].name: required"},
    {"region: {name: eu}\npeers:\n  - {name: eu, endpoint: \"tcp:127.0.0.1:1\"}\n",
     "bad.yaml:3: peers[0].name: eu is this gateway's own region"},
    {"region: {name: eu}\npeers:\n  - {name: us, endpoint: \"tcp:127.0.0.1:1\"}\n"
     "  - {name: us, endpoint: \"tcp:127.0.0.1:2\"}\n",
     "bad.yaml:4: peers[1].name: peer us is already peers[0]"},
    {"region: {name: eu}\npeers:\n  - {name: us, endpoint: \"h2c:127.0.0.1:1\"}\n",
     "bad.yaml:3: peers[0].endpoint: must be tls:HOST:PORT or tcp:HOST:PORT"},
    {"region: {name: eu}\npeers: {name: us}\n", "bad.yaml:2: peers: must be a list, not a map"},
    {"peer_tls: {cert: /c.pem}\n", "bad.yaml:1: peer_tls: cert and key go together"},
    {"peer_tls: {}\n", "bad.yaml:1: peer_tls: give ca, or cert and key, or all three"},
    {"peer_tls: {ca: /a, crt: /c}\n", "bad.yaml:1: peer_tls.crt: unknown key"},
    {TEN_A "    residency: eu\n", "bad.yaml:4: tenants[0].residency: must be a list, not a plain value"},
    {TEN_A "    residency: [\"e u\"]\n", "bad.yaml:4: tenants[0].residency[0]: a tag is 1 to 31"},
    {TEN_A "    models: [llama, \"\"]\n", "bad.yaml:4: tenants[0].models[1]: must not be empty"},
    {TEN_A "    residency: [eu]\n", "bad.yaml:4: tenants[0].residency: residency needs a region section: its "
                                    "tags say where this gateway may serve"},
    {TEN_A "    policy: cheapest\n", "bad.yaml:4: tenants[0].policy: must be latency, cost, carbon or primary"},
    {TEN_A "    allow_policies: [carbon, carbon]\n", "bad.yaml:4: tenants[0].allow_policies[1]: carbon is listed twice"},
    {TEN_A "    allow_policies: [green]\n", "bad.yaml:4: tenants[0].allow_policies[0]: must be latency, cost"},
    {TEN_A "    allow_policies: [primary]\n", "bad.yaml:2: tenants: tenant a may use policy primary, and neither"},
    {TEN_A "    slo_ms: fast\n", "bad.yaml:4: tenants[0].slo_ms: must be a number from 0"},
    {TEN_A "    max_price: -1\n", "bad.yaml:4: tenants[0].max_price: must be a number from 0"},
    {TEN_A "    priority: urgent\n", "bad.yaml:4: tenants[0].priority: must be interactive or batch"},
    {TEN_A "    weight: 0\n", "bad.yaml:4: tenants[0].weight: must be a number from 0.001 to 1e+06"},
    {TEN_A "    weight: 2000000\n", "bad.yaml:4: tenants[0].weight: must be a number from 0.001 to 1e+06"},
    {TEN_A "    weight: heavy\n", "bad.yaml:4: tenants[0].weight: must be a number"},
    {TEN_A "    budget: {daily: 5}\n", "bad.yaml:4: tenants[0].budget: a budget needs a region section: its "
                                       "price is what requests cost"},
    {"region: {name: eu}\n" TEN_A "    budget: {}\n",
     "bad.yaml:5: tenants[0].budget: needs daily, monthly or both"},
    {"region: {name: eu}\n" TEN_A "    budget: 5\n", "bad.yaml:5: tenants[0].budget: must be a map"},
    {"region: {name: eu}\n" TEN_A "    budget: {daily: 0}\n",
     "bad.yaml:5: tenants[0].budget.daily: must be a number > 0 (leave it out for no budget)"},
    {"region: {name: eu}\n" TEN_A "    budget: {monthly: -2}\n",
     "bad.yaml:5: tenants[0].budget.monthly: must be a number from 0"},
    {"region: {name: eu}\n" TEN_A "    budget: {weekly: 3}\n",
     "bad.yaml:5: tenants[0].budget.weekly: unknown key"},
};

static void test_broken(void **state)
{
    int failed = 0;
    for (size_t i = 0; i < sizeof(broken) / sizeof(*broken); i++) {
        const char *path = write_file("bad.yaml", broken[i].yaml);
        gw_config *c = (gw_config *)1;
        char err[512] = "";
        int rc = gw_config_load(path, &c, err, sizeof(err));
        /* The error starts with the file name as given. */
        if (rc != -EINVAL || c != NULL || !strstr(err, broken[i].want) || strncmp(err, path, strlen(path))) {
            print_error("case %zu: rc %d, err \"%s\", want \"%s\"\n", i, rc, err, broken[i].want);
            failed++;
        }
    }
    assert_int_equal(failed, 0);
}

static void test_file_errors(void **state)
{
    gw_config *c = (gw_config *)1;
    char err[256] = "", path[128];
    snprintf(path, sizeof(path), "%s/missing.yaml", tmpdir);
    assert_int_equal(gw_config_load(path, &c, err, sizeof(err)), -ENOENT);
    assert_null(c);
    assert_non_null(strstr(err, "missing.yaml: No such file"));
    assert_int_equal(gw_config_load(tmpdir, &c, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "not a regular file"));
    /* A NULL err is allowed. */
    assert_int_equal(gw_config_load(path, &c, NULL, 0), -ENOENT);
}

static void test_parse_mem(void **state)
{
    gw_config *c;
    char err[256];
    /* Not NUL-terminated: only len bytes are read. */
    static const char text[] = "drain_grace_s: 7\nstats_interval_ms: 1x";
    assert_int_equal(gw_config_parse("mem.yaml", text, 16, &c, err, sizeof(err)), 0);
    assert_int_equal(c->drain_grace_s, 7);
    assert_string_equal(c->path, "mem.yaml");
    gw_config_free(c);
    assert_int_equal(gw_config_parse("mem.yaml", text, sizeof(text) - 1, &c, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "mem.yaml:2: stats_interval_ms: must be a whole number"));
    /* A short err buffer is truncated, not overrun. */
    char small[8];
    assert_int_equal(gw_config_parse("mem.yaml", text, sizeof(text) - 1, &c, small, sizeof(small)), -EINVAL);
    assert_int_equal(strlen(small), 7);
    gw_config_free(NULL);
}

static void test_key_hash(void **state)
{
    char hex[65];
    gw_key_hash_hex("abc", hex);
    assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    gw_key_hash_hex("", hex);
    assert_string_equal(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    gw_key_hash_hex("k1", hex);
    assert_string_equal(hex, H_K1);
}

/* What SIGHUP cannot apply is named, section by section; what it applies
 * (tenants, limits, routing policy and SLO, retry budget, drain grace) is
 * not. */
static void test_restart_diff(void **state)
{
    static const char base[] = "workers:\n  - {model: /m.gguf, max_seqs: 8}\n"
                               "region: {name: eu, tags: [eu]}\n"
                               "routing: {policy: latency, heartbeat_ms: 1000}\n"
                               "drain_grace_s: 30\n";
    gw_config *a = load_ok(base);
    char out[256];
    gw_config *b = load_ok("workers:\n  - {model: /m.gguf, max_seqs: 8}\n"
                           "region: {name: eu, tags: [eu]}\n"
                           "routing: {policy: cost, slo_ms: 900, heartbeat_ms: 1000, retry_budget: 0.5}\n"
                           "drain_grace_s: 5\nlimits: {idle_timeout_ms: 1000}\n");
    assert_int_equal(gw_config_restart_diff(a, b, out, sizeof(out)), 0);
    assert_string_equal(out, "");
    gw_config_free(b);
    b = load_ok("workers:\n  - {model: /m.gguf, max_seqs: 9}\n"
                "region: {name: eu, tags: [eu, gdpr]}\n"
                "routing: {policy: latency, heartbeat_ms: 500}\n"
                "stats_interval_ms: 100\n");
    assert_int_equal(gw_config_restart_diff(a, b, out, sizeof(out)), 4);
    assert_string_equal(
        out, "workers, region, routing (heartbeat_ms, stale_after_ms, ejection, ping_interval_ms), "
             "stats_interval_ms");
    /* A short buffer is cut, the count is whole. */
    assert_int_equal(gw_config_restart_diff(a, b, out, 10), 4);
    assert_string_equal(out, "workers, ");
    gw_config_free(b);
    /* the worker takes it as a flag: a change restarts it */
    b = load_ok("workers:\n  - {model: /m.gguf, max_seqs: 8, prompt_max_wait_ms: 0}\n"
                "region: {name: eu, tags: [eu]}\n"
                "routing: {policy: latency, heartbeat_ms: 1000}\n"
                "drain_grace_s: 30\n");
    assert_int_equal(gw_config_restart_diff(a, b, out, sizeof(out)), 1);
    assert_string_equal(out, "workers");
    gw_config_free(b);
    gw_config_free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full),         cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_broken),       cmocka_unit_test(test_file_errors),
        cmocka_unit_test(test_parse_mem),    cmocka_unit_test(test_key_hash),
        cmocka_unit_test(test_routing_full), cmocka_unit_test(test_restart_diff),
    };
    return cmocka_run_group_tests(tests, setup_dir, remove_dir);
}
