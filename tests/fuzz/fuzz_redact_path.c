/* libFuzzer target for the access log's path redaction
 * (gateway/front/access_log.c, gw_alog_redact_path): every client chooses
 * the path it sends, and every request's path goes through it.
 *
 * The input is a path (up to its first NUL). The redacted path keeps
 * everything before the query as sent, and as many parameters as the
 * query had; a parameter named "key" in any case is never shown with its
 * value. Violations are __builtin_trap so the fuzzer keeps them. */
#include "gateway/front/access_log.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define FUZZ_CHECK(cond)                                                                                     \
    do {                                                                                                     \
        if (!(cond))                                                                                         \
            __builtin_trap();                                                                                \
    } while (0)

static size_t separators(const char *q)
{
    size_t n = 0;
    for (; q && *q; q++)
        n += *q == '&' || *q == ';';
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *path = malloc(size + 1);
    if (!path)
        return 0;
    memcpy(path, data, size);
    path[size] = '\0';
    char *red = gw_alog_redact_path(path);
    FUZZ_CHECK(red);
    const char *q = strchr(path, '?'), *rq = strchr(red, '?');
    size_t head = q ? (size_t)(q - path) : strlen(path);
    FUZZ_CHECK(!strncmp(path, red, head) && (q ? rq == red + head : !strcmp(path, red)));
    FUZZ_CHECK(separators(q) == separators(rq));
    /* no "key=" parameter keeps a value */
    for (const char *p = rq ? rq + 1 : NULL; p && *p;) {
        size_t n = strcspn(p, "&;");
        if (n >= 4 && !strncasecmp(p, "key=", 4))
            FUZZ_CHECK(n == 12 && !strncmp(p + 4, "REDACTED", 8));
        p += n + (p[n] != '\0');
    }
    free(red);
    free(path);
    return 0;
}
