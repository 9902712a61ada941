/* `infergate key`: makes API keys for tenants. The config holds only the
 * SHA-256 of a key, so `key new` prints both: the key for the client, the
 * hash for the gateway's tenants[].keys. `key hash` hashes a key that
 * already exists. */
#include "gateway/cmd/cli.h"
#include "gateway/config/config.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#define KEY_BYTES 32 /* 256 bits from the kernel CSPRNG */
#define KEY_PREFIX "ig-"
/* Longest key `key hash -` reads from stdin. */
#define KEY_LINE_MAX 4096

static void key_usage(FILE *f)
{
    fprintf(f, "usage: infergate key new          print a new API key and its SHA-256 for the config\n"
               "       infergate key hash KEY     print the SHA-256 of an existing key\n"
               "       infergate key hash -       the same, reading the key from stdin (keeps it out of\n"
               "                                  the shell history and the process list)\n");
}

static int random_bytes(unsigned char *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom(buf + got, n - got, 0);
        if (r == -1) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        got += (size_t)r;
    }
    return 0;
}

/* base64url without padding (RFC 4648 §5): safe in headers and shells. */
static void base64url(const unsigned char *in, size_t n, char *out)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    size_t o = 0, i = 0;
    for (; i + 3 <= n; i += 3) {
        unsigned v = (unsigned)in[i] << 16 | (unsigned)in[i + 1] << 8 | in[i + 2];
        out[o++] = tab[v >> 18 & 63];
        out[o++] = tab[v >> 12 & 63];
        out[o++] = tab[v >> 6 & 63];
        out[o++] = tab[v & 63];
    }
    if (n - i == 1) {
        unsigned v = (unsigned)in[i] << 16;
        out[o++] = tab[v >> 18 & 63];
        out[o++] = tab[v >> 12 & 63];
    } else if (n - i == 2) {
        unsigned v = (unsigned)in[i] << 16 | (unsigned)in[i + 1] << 8;
        out[o++] = tab[v >> 18 & 63];
        out[o++] = tab[v >> 12 & 63];
        out[o++] = tab[v >> 6 & 63];
    }
    out[o] = '\0';
}

static int key_new(void)
{
    unsigned char raw[KEY_BYTES];
    char key[sizeof(KEY_PREFIX) + (KEY_BYTES * 4 + 2) / 3], hex[65];
    int rc = random_bytes(raw, sizeof(raw));
    if (rc) {
        fprintf(stderr, "infergate key new: getrandom: %s\n", strerror(-rc));
        return 1;
    }
    memcpy(key, KEY_PREFIX, strlen(KEY_PREFIX));
    base64url(raw, sizeof(raw), key + strlen(KEY_PREFIX));
    gw_key_hash_hex(key, hex);
    memset(raw, 0, sizeof(raw));
    if (!hex[0]) { /* a key without its hash cannot be configured */
        memset(key, 0, sizeof(key));
        fprintf(stderr, "infergate key new: SHA-256 unavailable\n");
        return 1;
    }
    printf("key:  %s\nhash: %s\n", key, hex);
    memset(key, 0, sizeof(key));
    return fflush(stdout) == 0 ? 0 : 1;
}

static int key_hash(const char *arg)
{
    char line[KEY_LINE_MAX + 2], hex[65];
    const char *key = arg;
    if (!strcmp(arg, "-")) {
        if (!fgets(line, sizeof(line), stdin)) {
            fprintf(stderr, "infergate key hash: no key on stdin\n");
            return 1;
        }
        size_t n = strcspn(line, "\r\n");
        if (n > KEY_LINE_MAX) {
            fprintf(stderr, "infergate key hash: key longer than %d bytes\n", KEY_LINE_MAX);
            return 1;
        }
        line[n] = '\0';
        key = line;
    }
    if (!*key) {
        fprintf(stderr, "infergate key hash: empty key\n");
        return 2;
    }
    gw_key_hash_hex(key, hex);
    if (!hex[0]) {
        fprintf(stderr, "infergate key hash: SHA-256 unavailable\n");
        return 1;
    }
    printf("%s\n", hex);
    memset(line, 0, sizeof(line));
    return fflush(stdout) == 0 ? 0 : 1;
}

int gw_cmd_key(int argc, char **argv)
{
    if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        key_usage(stdout);
        return 0;
    }
    if (argc == 2 && !strcmp(argv[1], "new"))
        return key_new();
    if (argc == 3 && !strcmp(argv[1], "hash"))
        return key_hash(argv[2]);
    key_usage(stderr);
    return 2;
}
