/* HMAC of the objects gateways write to Redis (see record_auth.h): the
 * canonical message, signing with the first fleet key, checking against
 * each. */
#include "routing/record_auth.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DOMAIN "infergate-record-v1"
#define AUTH_PREFIX "v1:"

int route_auth_keys_set(route_auth_keys *k, const char *const *keys, int n, char *err, size_t err_len)
{
    memset(k, 0, sizeof(*k));
    if (n > ROUTE_AUTH_MAX_KEYS) {
        snprintf(err, err_len, "at most %d keys (the one signing and the one being rotated out)",
                 ROUTE_AUTH_MAX_KEYS);
        return -EINVAL;
    }
    for (int i = 0; i < n; i++) {
        size_t len = strlen(keys[i]);
        if (len < ROUTE_AUTH_KEY_MIN || len > ROUTE_AUTH_KEY_MAX) {
            snprintf(err, err_len, "key %d: %d to %d bytes (`openssl rand -hex 32` makes one)", i,
                     ROUTE_AUTH_KEY_MIN, ROUTE_AUTH_KEY_MAX);
            memset(k, 0, sizeof(*k));
            return -EINVAL;
        }
        memcpy(k->key[i], keys[i], len);
        k->len[i] = len;
    }
    k->n = n;
    return 0;
}

typedef struct field_ref {
    const char *name, *value;
    size_t vlen;
} field_ref;

static int by_name_then_value(const void *a, const void *b)
{
    const field_ref *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    if (c)
        return c;
    size_t n = x->vlen < y->vlen ? x->vlen : y->vlen;
    c = memcmp(x->value, y->value, n);
    return c ? c : (x->vlen > y->vlen) - (x->vlen < y->vlen);
}

/* Appends a netstring; out NULL only measures. */
static size_t netstring(char *out, const char *s, size_t len)
{
    char head[24];
    int h = snprintf(head, sizeof(head), "%zu:", len);
    if (out) {
        memcpy(out, head, (size_t)h);
        memcpy(out + h, s, len);
        out[h + len] = ',';
    }
    return (size_t)h + len + 1;
}

/* The message of record_auth.h, malloc'd (NULL on out of memory); fields
 * named "auth" are left out, and *n_auth says how many there were (their
 * index in *auth_at, the last one's). */
static char *message(const char *kind, const char *cluster, const char *region, const char *const *names,
                     const char *const *values, const size_t *lens, int n, size_t *len, int *n_auth,
                     int *auth_at)
{
    field_ref *f = malloc(sizeof(*f) * (size_t)(n > 0 ? n : 1));
    if (!f)
        return NULL;
    int m = 0;
    *n_auth = 0;
    for (int i = 0; i < n; i++) {
        if (!strcmp(names[i], ROUTE_AUTH_FIELD)) {
            ++*n_auth;
            *auth_at = i;
            continue;
        }
        f[m++] = (field_ref){names[i], values[i], lens ? lens[i] : strlen(values[i])};
    }
    qsort(f, (size_t)m, sizeof(*f), by_name_then_value);
    const char *head[] = {DOMAIN, kind, cluster, region};
    size_t total = 0;
    for (int i = 0; i < 4; i++)
        total += netstring(NULL, head[i], strlen(head[i]));
    for (int i = 0; i < m; i++)
        total += netstring(NULL, f[i].name, strlen(f[i].name)) + netstring(NULL, f[i].value, f[i].vlen);
    char *msg = malloc(total ? total : 1), *o = msg;
    for (int i = 0; msg && i < 4; i++)
        o += netstring(o, head[i], strlen(head[i]));
    for (int i = 0; msg && i < m; i++) {
        o += netstring(o, f[i].name, strlen(f[i].name));
        o += netstring(o, f[i].value, f[i].vlen);
    }
    free(f);
    *len = total;
    return msg;
}

/* HMAC-SHA256 of msg under key i, as "v1:" and hex. false on a library
 * failure. */
static bool mac_hex(const route_auth_keys *k, int i, const char *msg, size_t len,
                    char out[ROUTE_AUTH_VALUE_LEN + 1])
{
    unsigned char mac[32];
    size_t mac_len = 0;
    if (!EVP_Q_mac(NULL, "HMAC", NULL, "SHA256", NULL, k->key[i], k->len[i], (const unsigned char *)msg, len,
                   mac, sizeof(mac), &mac_len) ||
        mac_len != sizeof(mac))
        return false;
    static const char hex[] = "0123456789abcdef";
    memcpy(out, AUTH_PREFIX, 3);
    for (size_t j = 0; j < sizeof(mac); j++) {
        out[3 + 2 * j] = hex[mac[j] >> 4];
        out[4 + 2 * j] = hex[mac[j] & 15];
    }
    out[ROUTE_AUTH_VALUE_LEN] = '\0';
    return true;
}

void route_auth_sign(const route_auth_keys *k, const char *kind, const char *cluster, const char *region,
                     const char *const *names, const char *const *values, const size_t *lens, int n,
                     char out[ROUTE_AUTH_VALUE_LEN + 1])
{
    size_t len;
    int n_auth, at;
    char *msg = message(kind, cluster, region, names, values, lens, n, &len, &n_auth, &at);
    /* Out of memory: a value no key proves, so the record is refused by
     * its readers rather than taken unchecked. */
    if (!msg || k->n < 1 || !mac_hex(k, 0, msg, len, out))
        snprintf(out, ROUTE_AUTH_VALUE_LEN + 1, "%s", AUTH_PREFIX "unsigned");
    free(msg);
}

int route_auth_verify(const route_auth_keys *k, const char *kind, const char *cluster, const char *region,
                      const char *const *names, const char *const *values, const size_t *lens, int n)
{
    if (k->n == 0)
        return 0;
    size_t len;
    int n_auth = 0, at = -1;
    char *msg = message(kind, cluster, region, names, values, lens, n, &len, &n_auth, &at);
    if (!msg)
        return -ENOMEM;
    int rc = n_auth == 0 ? -ENOENT : -EACCES;
    size_t given = n_auth == 1 ? (lens ? lens[at] : strlen(values[at])) : 0;
    for (int i = 0; n_auth == 1 && given == ROUTE_AUTH_VALUE_LEN && i < k->n && rc; i++) {
        char want[ROUTE_AUTH_VALUE_LEN + 1];
        if (mac_hex(k, i, msg, len, want) && !CRYPTO_memcmp(want, values[at], ROUTE_AUTH_VALUE_LEN))
            rc = 0;
    }
    free(msg);
    return rc;
}

const char *route_auth_strerror(int rc)
{
    return rc == -ENOENT   ? "no auth field (not signed with a fleet key)"
           : rc == -ENOMEM ? "out of memory checking its auth field"
                           : "its auth field does not match the fleet keys";
}
