/* Tests of tenants: API-key authentication, model allow-lists, the request
 * and token buckets driven by a simulated clock (burst, refusal with
 * Retry-After, refill, no partial take, refund, debt past a full burst),
 * bucket state kept across a reload, and `infergate key` end to end: a new
 * key's printed hash, put in a config, authenticates that key. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "gateway/cmd/cli.h"
#include "gateway/config/config.h"
#include "gateway/front/tenant.h"


#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* SHA-256 of "k1", "k2", "k3". */
#define H_K1 "6ab9f1eb8f7d3388f4f9d586f66e99fd54080df2c446f0e58668b09c08a16dd0"
#define H_K2 "015f7e6bc5aeaf483724089e9252cc13b50951a6b69412522765cff4d780306e"
#define H_K3 "2f5052c9fd15b19a18c584d01363568198613f0c34e84409ef7938709a159ec2"

static gw_config *parse(const char *yaml)
{
    gw_config *c = NULL;
    char err[256] = "";
    int rc = gw_config_parse("t.yaml", yaml, strlen(yaml), &c, err, sizeof(err));
    if (rc)
        fail_msg("config: %d %s", rc, err);
    return c;
}

static gw_tenants *tenants(const char *yaml, const gw_tenants *prev)
{
    gw_config *c = parse(yaml);
    gw_tenants *t = gw_tenants_new(c, prev);
    assert_non_null(t);
    gw_config_free(c);
    return t;
}

static const char two_tenants[] = "tenants:\n"
                                  "  - name: acme\n"
                                  "    keys: [" H_K1 ", " H_K2 "]\n"
                                  "    admin: true\n"
                                  "  - name: beta\n"
                                  "    keys: [" H_K3 "]\n"
                                  "    models: [llama, tiny]\n";

static void test_auth(void **state)
{
    gw_tenants *t = tenants(two_tenants, NULL);
    assert_false(gw_tenants_open(t));
    gw_tenant *a = gw_tenants_auth(t, "k1");
    assert_non_null(a);
    assert_string_equal(gw_tenant_name(a), "acme");
    assert_true(gw_tenant_admin(a));
    assert_ptr_equal(gw_tenants_auth(t, "k2"), a);
    gw_tenant *b = gw_tenants_auth(t, "k3");
    assert_non_null(b);
    assert_string_equal(gw_tenant_name(b), "beta");
    assert_false(gw_tenant_admin(b));
    assert_null(gw_tenants_auth(t, "k4"));
    assert_null(gw_tenants_auth(t, "k1 "));
    assert_null(gw_tenants_auth(t, ""));
    assert_null(gw_tenants_auth(t, NULL));
    /* The configured hash itself is not a key. */
    assert_null(gw_tenants_auth(t, H_K1));

    assert_ptr_equal(gw_tenants_find(t, "acme"), a);
    assert_ptr_equal(gw_tenants_find(t, "beta"), b);
    assert_null(gw_tenants_find(t, "gamma"));
    assert_null(gw_tenants_find(t, NULL));
    assert_null(gw_tenants_find(NULL, "acme"));

    assert_true(gw_tenant_allows_model(a, "anything"));
    assert_true(gw_tenant_allows_model(a, ""));
    assert_false(gw_tenant_allows_model(a, NULL));
    assert_true(gw_tenant_allows_model(b, "llama"));
    assert_true(gw_tenant_allows_model(b, "tiny"));
    assert_false(gw_tenant_allows_model(b, "llam"));
    assert_false(gw_tenant_allows_model(b, "llama2"));
    assert_false(gw_tenant_allows_model(b, "*"));
    gw_tenants_free(t);

    /* No tenants: open, and no key authenticates. */
    gw_tenants *open = tenants("drain_grace_s: 1\n", NULL);
    assert_true(gw_tenants_open(open));
    assert_null(gw_tenants_auth(open, "k1"));
    assert_null(gw_tenants_find(open, "acme"));
    gw_tenants_free(open);
    assert_true(gw_tenants_open(NULL));
    gw_tenants_free(NULL);
    gw_tenants *none = gw_tenants_new(NULL, NULL);
    assert_true(gw_tenants_open(none));
    gw_tenants_free(none);
}

#define LIMITED(rps, tpm) "tenants:\n  - name: a\n    keys: [" H_K1 "]\n    rps: " rps "\n    tpm: " tpm "\n"

/* Many tenants and keys (found by hash, not by a walk over them): each
 * key finds its own tenant, near misses find none. */
static void test_many_keys(void **state)
{
    (void)state;
    enum { TENANTS = 400, KEYS = 5 };
    size_t cap = (size_t)TENANTS * (40 + KEYS * 70) + 64, n = 0;
    char *yaml = malloc(cap);
    assert_non_null(yaml);
    n += (size_t)snprintf(yaml + n, cap - n, "tenants:\n");
    for (int i = 0; i < TENANTS; i++) {
        n += (size_t)snprintf(yaml + n, cap - n, "  - name: t%d\n    keys: [", i);
        for (int j = 0; j < KEYS; j++) {
            char key[32], hex[65];
            snprintf(key, sizeof(key), "key-%d-%d", i, j);
            gw_key_hash_hex(key, hex);
            assert_int_equal(strlen(hex), 64);
            n += (size_t)snprintf(yaml + n, cap - n, "%s%s", hex, j + 1 < KEYS ? ", " : "]\n");
        }
    }
    gw_tenants *t = tenants(yaml, NULL);
    free(yaml);
    for (int i = 0; i < TENANTS; i++)
        for (int j = 0; j < KEYS; j++) {
            char key[32], name[16];
            snprintf(key, sizeof(key), "key-%d-%d", i, j);
            snprintf(name, sizeof(name), "t%d", i);
            gw_tenant *got = gw_tenants_auth(t, key);
            assert_non_null(got);
            assert_string_equal(gw_tenant_name(got), name);
            snprintf(key, sizeof(key), "key-%d-%d", i, j + KEYS);
            assert_null(gw_tenants_auth(t, key));
        }
    gw_tenants_free(t);
}

static void test_rps(void **state)
{
    gw_tenants *t = tenants(LIMITED("3", "0"), NULL);
    gw_tenant *a = gw_tenants_find(t, "a");
    int retry = -1;
    double now = 1000.0;
    /* A burst of rps requests, then a refusal. */
    for (int i = 0; i < 3; i++)
        assert_int_equal(gw_tenant_admit(a, now, 1e9, &retry), 0); /* tpm 0: tokens are free */
    assert_int_equal(gw_tenant_admit(a, now, 0, &retry), -EAGAIN);
    assert_int_equal(retry, 1);
    /* One request comes back every 1/3 s. */
    assert_int_equal(gw_tenant_admit(a, now + 0.30, 0, &retry), -EAGAIN);
    assert_int_equal(gw_tenant_admit(a, now + 1.0 / 3, 0, &retry), 0);
    assert_int_equal(gw_tenant_admit(a, now + 1.0 / 3, 0, &retry), -EAGAIN);
    /* A long pause refills to the burst, not beyond. */
    now += 100;
    for (int i = 0; i < 3; i++)
        assert_int_equal(gw_tenant_admit(a, now, 0, &retry), 0);
    assert_int_equal(gw_tenant_admit(a, now, 0, &retry), -EAGAIN);
    /* A clock that steps back neither refills nor breaks. */
    assert_int_equal(gw_tenant_admit(a, now - 50, 0, &retry), -EAGAIN);
    assert_int_equal(gw_tenant_admit(a, now + 0.34, 0, &retry), 0);
    gw_tenants_free(t);

    /* rps below 1 still allows one request, then waits 1/rps. */
    t = tenants(LIMITED("0.25", "0"), NULL);
    a = gw_tenants_find(t, "a");
    assert_int_equal(gw_tenant_admit(a, 5.0, 0, &retry), 0);
    assert_int_equal(gw_tenant_admit(a, 5.0, 0, NULL), -EAGAIN);
    assert_int_equal(gw_tenant_admit(a, 5.0, 0, &retry), -EAGAIN);
    assert_int_equal(retry, 4);
    assert_int_equal(gw_tenant_admit(a, 6.5, 0, &retry), -EAGAIN);
    assert_int_equal(retry, 3); /* ceil(2.5) */
    assert_int_equal(gw_tenant_admit(a, 9.0, 0, &retry), 0);
    gw_tenants_free(t);

    /* Unlimited: anything goes. */
    t = tenants(LIMITED("0", "0"), NULL);
    a = gw_tenants_find(t, "a");
    for (int i = 0; i < 1000; i++)
        assert_int_equal(gw_tenant_admit(a, 0, 1e6, &retry), 0);
    gw_tenants_free(t);
}

static void test_tpm(void **state)
{
    /* 600 tokens a minute: a burst of 600, 10 back per second. */
    gw_tenants *t = tenants(LIMITED("2", "600"), NULL);
    gw_tenant *a = gw_tenants_find(t, "a");
    int retry = -1;
    assert_int_equal(gw_tenant_admit(a, 0, 500, &retry), 0);
    /* 100 tokens left: 200 needs 10 s more. Nothing is taken on refusal. */
    assert_int_equal(gw_tenant_admit(a, 0, 200, &retry), -EAGAIN);
    assert_int_equal(retry, 10);
    /* So the request bucket still holds its second request. */
    assert_int_equal(gw_tenant_admit(a, 0, 100, &retry), 0);
    /* Both empty now: the longer wait wins (0 tokens wait 0.5 s for the
     * request bucket; 50 tokens wait 5 s). */
    assert_int_equal(gw_tenant_admit(a, 0, 0, &retry), -EAGAIN);
    assert_int_equal(retry, 1);
    assert_int_equal(gw_tenant_admit(a, 0, 50, &retry), -EAGAIN);
    assert_int_equal(retry, 5);
    assert_int_equal(gw_tenant_admit(a, 5.0, 50, &retry), 0);

    /* A refund gives back an estimate that was too high. */
    gw_tenant_refund(a, 5.0, 300);
    assert_int_equal(gw_tenant_admit(a, 5.5, 300, &retry), 0);
    assert_int_equal(gw_tenant_admit(a, 6.0, 20, &retry), -EAGAIN); /* 5 left + 5 refilled */
    assert_int_equal(retry, 1);
    /* Refunds never fill past the burst. */
    gw_tenant_refund(a, 100.0, 1e6);
    assert_int_equal(gw_tenant_admit(a, 100.0, 600, &retry), 0);
    assert_int_equal(gw_tenant_admit(a, 100.0, 1, &retry), -EAGAIN);
    /* Nonsense amounts count as zero. */
    gw_tenant_refund(a, 100.0, -5);
    gw_tenant_refund(a, 100.0, 0.0 / 0.0);
    gw_tenant_charge(a, 100.0, -5);
    gw_tenant_charge(a, 100.0, 0.0 / 0.0);
    assert_int_equal(gw_tenant_admit(a, 100.0, 1, &retry), -EAGAIN);
    /* A charge after the fact goes into debt: the next request waits for
     * it to be paid back (0 -> -100, then 10 more at 10/s: 11 s). */
    gw_tenant_charge(a, 100.0, 100);
    assert_int_equal(gw_tenant_admit(a, 100.0, 10, &retry), -EAGAIN);
    assert_int_equal(retry, 11);
    assert_int_equal(gw_tenant_admit(a, 111.0, 10, &retry), 0);
    gw_tenants_free(t);

    /* More than a whole burst: admitted when full, leaving a debt. */
    t = tenants(LIMITED("0", "600"), NULL);
    a = gw_tenants_find(t, "a");
    assert_int_equal(gw_tenant_admit(a, 0, 1000, &retry), 0);
    assert_int_equal(gw_tenant_admit(a, 0, 1, &retry), -EAGAIN);
    assert_int_equal(retry, 41); /* from -400 to 1 at 10/s */
    assert_int_equal(gw_tenant_admit(a, 30, 1000, &retry), -EAGAIN);
    assert_int_equal(retry, 70); /* a full bucket: from -100 to 600 */
    assert_int_equal(gw_tenant_admit(a, 100, 1000, &retry), 0);
    /* Negative and NaN token counts are zero. */
    gw_tenant_refund(a, 200, 1e9);
    assert_int_equal(gw_tenant_admit(a, 200, -1, &retry), 0);
    assert_int_equal(gw_tenant_admit(a, 200, 0.0 / 0.0, &retry), 0);
    assert_int_equal(gw_tenant_admit(a, 200, 600, &retry), 0);
    gw_tenants_free(t);
}

static void test_reload(void **state)
{
    gw_tenants *t1 = tenants("tenants:\n"
                             "  - name: a\n    keys: [" H_K1 "]\n    rps: 1\n    tpm: 600\n"
                             "  - name: gone\n    keys: [" H_K2 "]\n    rps: 1\n",
                             NULL);
    int retry;
    gw_tenant *a = gw_tenants_find(t1, "a");
    assert_int_equal(gw_tenant_admit(a, 10, 550, &retry), 0);
    assert_int_equal(gw_tenant_admit(a, 10, 0, &retry), -EAGAIN);

    /* a keeps its drained buckets, with a new key and a lower tpm; b is new
     * and starts full; "gone" is gone, and so is its key. */
    gw_tenants *t2 = tenants("tenants:\n"
                             "  - name: b\n    keys: [" H_K1 "]\n    rps: 1\n"
                             "  - name: a\n    keys: [" H_K3 "]\n    rps: 1\n    tpm: 60\n",
                             t1);
    gw_tenants_free(t1);
    a = gw_tenants_find(t2, "a");
    assert_ptr_equal(gw_tenants_auth(t2, "k3"), a);
    assert_string_equal(gw_tenant_name(gw_tenants_auth(t2, "k1")), "b");
    assert_null(gw_tenants_auth(t2, "k2"));
    assert_null(gw_tenants_find(t2, "gone"));
    assert_int_equal(gw_tenant_admit(a, 10, 0, &retry), -EAGAIN);
    /* One second later: the request is back; 50 tokens left fit the new 60. */
    assert_int_equal(gw_tenant_admit(a, 11, 50, &retry), 0);
    assert_int_equal(gw_tenant_admit(a, 12, 10, &retry), -EAGAIN);
    assert_int_equal(gw_tenant_admit(gw_tenants_find(t2, "b"), 12, 0, &retry), 0);

    /* Unlimited before, limited now: starts full. */
    gw_tenants *t3 = tenants("tenants:\n  - name: b\n    keys: [" H_K1 "]\n    rps: 1\n    tpm: 60\n", t2);
    gw_tenants_free(t2);
    assert_int_equal(gw_tenant_admit(gw_tenants_find(t3, "b"), 13, 60, &retry), 0);
    gw_tenants_free(t3);
}

/* ---- infergate key ---- */

/* Runs gw_cmd_key with stdout in buf (and its usage text on stderr out of
 * the test log). */
static int run_key(int argc, char **argv, char *buf, size_t cap)
{
    char path[] = "/tmp/test_tenant.XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    fflush(stdout);
    fflush(stderr);
    int saved = dup(1), saved_err = dup(2), devnull = open("/dev/null", O_WRONLY);
    assert_true(saved >= 0 && saved_err >= 0 && devnull >= 0);
    assert_true(dup2(fd, 1) >= 0 && dup2(devnull, 2) >= 0);
    int rc = gw_cmd_key(argc, argv);
    fflush(stdout);
    fflush(stderr);
    assert_true(dup2(saved, 1) >= 0 && dup2(saved_err, 2) >= 0);
    close(saved);
    close(saved_err);
    close(devnull);
    ssize_t n = pread(fd, buf, cap - 1, 0);
    assert_true(n >= 0);
    buf[n] = '\0';
    close(fd);
    return rc;
}

static void test_key_command(void **state)
{
    char out[512], key[128], hash[128], hex[65];
    char *new_argv[] = {"key", "new", NULL};
    assert_int_equal(run_key(2, new_argv, out, sizeof(out)), 0);
    assert_int_equal(sscanf(out, "key: %127s hash: %127s", key, hash), 2);
    assert_int_equal(strlen(key), 3 + 43);
    assert_memory_equal(key, "ig-", 3);
    assert_int_equal(strspn(key + 3, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"), 43);
    gw_key_hash_hex(key, hex);
    assert_string_equal(hash, hex);

    /* The printed hash, in a config, lets the printed key in. */
    char yaml[256];
    snprintf(yaml, sizeof(yaml), "tenants:\n  - name: new\n    keys: [%s]\n", hash);
    gw_tenants *t = tenants(yaml, NULL);
    assert_non_null(gw_tenants_auth(t, key));
    assert_string_equal(gw_tenant_name(gw_tenants_auth(t, key)), "new");
    gw_tenants_free(t);

    /* Two keys differ. */
    char key2[128];
    assert_int_equal(run_key(2, new_argv, out, sizeof(out)), 0);
    assert_int_equal(sscanf(out, "key: %127s", key2), 1);
    assert_string_not_equal(key, key2);

    char *hash_argv[] = {"key", "hash", "k1", NULL};
    assert_int_equal(run_key(3, hash_argv, out, sizeof(out)), 0);
    assert_string_equal(out, H_K1 "\n");

    char *bad1[] = {"key", NULL};
    char *bad2[] = {"key", "hash", NULL};
    char *bad3[] = {"key", "old", NULL};
    assert_int_equal(run_key(1, bad1, out, sizeof(out)), 2);
    assert_int_equal(run_key(2, bad2, out, sizeof(out)), 2);
    assert_int_equal(run_key(2, bad3, out, sizeof(out)), 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auth), cmocka_unit_test(test_many_keys), cmocka_unit_test(test_rps),
        cmocka_unit_test(test_tpm),  cmocka_unit_test(test_reload),    cmocka_unit_test(test_key_command),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
