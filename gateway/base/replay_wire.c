/* Token replay's wire format: the tag lines of a resumable event stream
 * and x-infergate-resume (see replay_wire.h). */
#include "gateway/base/replay_wire.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ERROR_EVENT "data: {\"error\""
#define ERROR_EVENT_LEN (sizeof(ERROR_EVENT) - 1)

/* An unsigned decimal of s[0..len) in the one form written (digits, no
 * leading zero but for 0 itself) that is at most max: its length, or 0. */
static size_t udec(const char *s, size_t len, uint64_t max, uint64_t *out)
{
    size_t n = 0;
    uint64_t v = 0;
    while (n < len && s[n] >= '0' && s[n] <= '9') {
        unsigned d = (unsigned)(s[n] - '0');
        if ((n == 1 && v == 0) || v > (max - d) / 10)
            return 0;
        v = v * 10 + d;
        n++;
    }
    *out = v;
    return n;
}

size_t gw_replay_tag_format(char *buf, int32_t token, bool end, bool alone)
{
    return (size_t)snprintf(buf, GW_REPLAY_TAG_MAX, GW_REPLAY_TAG "%d%s\n%s", (int)token, end ? " end" : "",
                            alone ? "\n" : "");
}

int gw_replay_tag_parse(const uint8_t *line, size_t len, int32_t *token, bool *end)
{
    if (len <= GW_REPLAY_TAG_LEN || memcmp(line, GW_REPLAY_TAG, GW_REPLAY_TAG_LEN))
        return -EPROTO;
    const char *s = (const char *)line + GW_REPLAY_TAG_LEN;
    len -= GW_REPLAY_TAG_LEN;
    uint64_t t;
    size_t n = udec(s, len, INT32_MAX, &t);
    if (!n || (n != len && (len - n != 4 || memcmp(s + n, " end", 4))))
        return -EPROTO;
    *token = (int32_t)t;
    *end = n != len;
    return 0;
}

/* The first blank line ("\n\n") at or after from in b[0..len), or NULL. */
static const uint8_t *blank_line(const uint8_t *b, size_t len, size_t from)
{
    for (const uint8_t *c = b + from; c + 1 < b + len && (c = memchr(c, '\n', (size_t)(b + len - c) - 1));
         c++)
        if (c[1] == '\n')
            return c;
    return NULL;
}

int gw_replay_scan(const uint8_t *b, size_t len, size_t seen, bool *end, const gw_replay_scan_cbs *cb,
                   void *ud, size_t *used)
{
    size_t from = 0, at = 0; /* from: what is not passed yet; at: the event being read */
    const uint8_t *blank;
    int rc;
    *used = 0;
    /* a blank line may straddle what was seen and what came since */
    while ((blank = blank_line(b, len, at ? at : seen ? seen - 1 : 0))) {
        size_t stop = (size_t)(blank - b) + 2;
        if (stop - at > GW_REPLAY_TAG_LEN && !memcmp(b + at, GW_REPLAY_TAG, GW_REPLAY_TAG_LEN)) {
            const uint8_t *nl = memchr(b + at, '\n', stop - at);
            size_t line_end = (size_t)(nl - b) + 1;
            int32_t token;
            bool last;
            if ((rc = gw_replay_tag_parse(b + at, line_end - 1 - at, &token, &last)))
                return rc;
            if (at > from && (rc = cb->pass(ud, b + from, at - from)))
                return rc;
            if ((rc = cb->tag(ud, token, last)))
                return rc;
            *end = *end || last;
            /* a tag alone (a token whose text is held back) is an event of its own */
            from = line_end == stop - 1 ? stop : line_end;
        } else if (!*end && stop - at > ERROR_EVENT_LEN && !memcmp(b + at, ERROR_EVENT, ERROR_EVENT_LEN)) {
            if (at > from && (rc = cb->pass(ud, b + from, at - from)))
                return rc;
            *used = at;
            return 1;
        }
        at = stop;
    }
    if (at > from && (rc = cb->pass(ud, b + from, at - from)))
        return rc;
    *used = at;
    return 0;
}

int gw_replay_resume_parse(const char *v, gw_replay_resume *r)
{
    memset(r, 0, sizeof(*r));
    size_t len = strlen(v), id_len = strcspn(v, " ");
    if (!id_len || id_len >= GW_REPLAY_ID_MAX || id_len == len)
        return -EINVAL;
    for (size_t i = 0; i < id_len; i++)
        if (v[i] < 0x21 || v[i] > 0x7e)
            return -EINVAL;
    const char *s = v + id_len + 1, *e = v + len;
    uint64_t created, seed;
    size_t n = udec(s, (size_t)(e - s), LONG_MAX, &created);
    if (!n || s + n == e || s[n] != ' ')
        return -EINVAL;
    s += n + 1;
    if (!(n = udec(s, (size_t)(e - s), UINT64_MAX, &seed)) || (s + n < e && (s[n] != ' ' || s + n + 1 == e)))
        return -EINVAL;
    s += n + (s + n < e);
    int cap = s < e;
    for (const char *c = s; c < e; c++)
        cap += *c == ',';
    if (cap && !(r->tokens = malloc((size_t)cap * sizeof(int32_t))))
        return -ENOMEM;
    while (s < e) { /* none: the run failed before its first token */
        uint64_t t;
        if (!(n = udec(s, (size_t)(e - s), INT32_MAX, &t)) ||
            (s + n < e && (s[n] != ',' || s + n + 1 == e))) {
            free(r->tokens);
            memset(r, 0, sizeof(*r));
            return -EINVAL;
        }
        r->tokens[r->n_tokens++] = (int32_t)t;
        s += n + (s + n < e);
    }
    memcpy(r->id, v, id_len);
    r->id[id_len] = '\0';
    r->created = (long)created;
    r->seed = seed;
    return 0;
}
