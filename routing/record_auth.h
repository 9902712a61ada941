/* Authentication of what gateways write to Redis for each other: a region's
 * record (its hash's plain fields, and each gateway's entry,
 * routing/instance.h) and a region's price override. Anyone who can write
 * to the Redis server could otherwise add a region that receives tenants'
 * prompts, or change one's endpoint, tags or price; with a fleet key, a
 * Redis write alone can only delete or replay what the fleet wrote.
 *
 * The proof is one more field, "auth" = "v1:" and the hex HMAC-SHA256,
 * under a fleet key, of the kind of object ("region", "price"), the
 * cluster, the region's name and every other field of the object (name
 * and value), sorted by name: the order of a Redis hash is not kept, and
 * each field counts, whether this version reads it or not. Every string
 * enters as a netstring ("LEN:BYTES,"), so no two different objects give
 * the same message. In Python:
 *
 *   ns = lambda b: b"%d:%s," % (len(b), b)
 *   msg = ns(b"infergate-record-v1") + ns(kind) + ns(cluster) + ns(region)
 *         + b"".join(ns(k) + ns(v) for k, v in sorted(fields.items()))
 *   auth = "v1:" + hmac.new(key, msg, "sha256").hexdigest()
 *
 * Two keys make a rotation without downtime: a gateway signs with the
 * first and takes either. */
#ifndef ROUTE_RECORD_AUTH_H
#define ROUTE_RECORD_AUTH_H

#include <stdbool.h>
#include <stddef.h>

#define ROUTE_AUTH_FIELD "auth"
#define ROUTE_AUTH_MAX_KEYS 2
#define ROUTE_AUTH_KEY_MIN 32   /* bytes: a key shorter than SHA-256's output is guessable sooner */
#define ROUTE_AUTH_KEY_MAX 128  /* bytes */
#define ROUTE_AUTH_VALUE_LEN 67 /* "v1:" and 64 hex digits */

typedef struct route_auth_keys {
    int n; /* 0: nothing is signed or checked */
    size_t len[ROUTE_AUTH_MAX_KEYS];
    unsigned char key[ROUTE_AUTH_MAX_KEYS][ROUTE_AUTH_KEY_MAX];
} route_auth_keys;

/* Fills k from n strings (their bytes are the keys): 0, or -EINVAL with err
 * for more than ROUTE_AUTH_MAX_KEYS keys or one outside
 * ROUTE_AUTH_KEY_MIN..ROUTE_AUTH_KEY_MAX bytes. n 0 leaves k empty. */
int route_auth_keys_set(route_auth_keys *k, const char *const *keys, int n, char *err, size_t err_len);

/* The "auth" value of an object: kind "region" or "price", its cluster and
 * region name, and its n fields (names NUL-terminated; values of lens[i]
 * bytes, or NUL-terminated where lens is NULL), in any order; a field
 * named "auth" is left out. Signed with k's first key, which must be set;
 * out gets ROUTE_AUTH_VALUE_LEN characters and a NUL. */
void route_auth_sign(const route_auth_keys *k, const char *kind, const char *cluster, const char *region,
                     const char *const *names, const char *const *values, const size_t *lens, int n,
                     char out[ROUTE_AUTH_VALUE_LEN + 1]);

/* Whether the object's "auth" field proves it under one of k's keys: 0
 * when it does (or k has no key), -ENOENT when there is no auth field,
 * -EACCES when it is malformed, repeated or proves nothing. Compared in
 * constant time. */
int route_auth_verify(const route_auth_keys *k, const char *kind, const char *cluster, const char *region,
                      const char *const *names, const char *const *values, const size_t *lens, int n);

/* Why route_auth_verify refused ("no auth field", "auth does not match
 * the fleet keys"). */
const char *route_auth_strerror(int rc);

#endif
