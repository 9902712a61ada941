/* libFuzzer target for token replay's wire format
 * (gateway/base/replay_wire.c): the gateway's reader of a resumable event
 * stream (its tag lines stripped) and x-infergate-resume's parser. Both
 * read a peer region's bytes.
 *
 * The first byte chooses: even, the rest is an x-infergate-resume value
 * (up to a NUL), which, taken, formats back to itself (one form of each
 * number) with an id of 1 to 39 visible bytes and tokens from 0 to
 * INT32_MAX. Odd, the rest after a second byte is an event stream, read
 * whole and then in pieces of that byte's size (1 to 256) as it arrives
 * from the network: both give the same bytes, tokens and result, and the
 * bytes left out are tag lines at the start of events and nothing else;
 * every tag formats back to what was read. Violations are __builtin_trap
 * so the fuzzer keeps them. */
#include "gateway/base/replay_wire.h"

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_CHECK(cond)                                                                                     \
    do {                                                                                                     \
        if (!(cond))                                                                                         \
            __builtin_trap();                                                                                \
    } while (0)

static void resume(const uint8_t *data, size_t size)
{
    char *v = malloc(size + 1);
    memcpy(v, data, size);
    v[size] = '\0';
    gw_replay_resume r;
    int rc = gw_replay_resume_parse(v, &r);
    FUZZ_CHECK(rc == 0 || rc == -EINVAL);
    if (rc) {
        FUZZ_CHECK(!r.tokens && !r.n_tokens);
        free(v);
        return;
    }
    size_t id_len = strlen(r.id);
    FUZZ_CHECK(id_len > 0 && id_len < GW_REPLAY_ID_MAX && r.created >= 0 && r.n_tokens >= 0);
    size_t cap = 128 + (size_t)r.n_tokens * 12, k;
    char *again = malloc(cap);
    k = (size_t)snprintf(again, cap, "%s %ld %llu", r.id, r.created, (unsigned long long)r.seed);
    for (int i = 0; i < r.n_tokens; i++) {
        FUZZ_CHECK(r.tokens[i] >= 0);
        k += (size_t)snprintf(again + k, cap - k, "%c%d", i ? ',' : ' ', (int)r.tokens[i]);
    }
    FUZZ_CHECK(!strcmp(again, v));
    free(again);
    free(r.tokens);
    free(v);
}

/* What one read gave: the bytes passed, where they lay, and the tokens. */
typedef struct sink {
    const uint8_t *base; /* the whole read's buffer: passes lie within it */
    uint8_t *out;
    size_t n_out;
    size_t *ranges; /* whole read: each pass's start and end in base */
    size_t n_ranges;
    int32_t *tokens;
    bool *ends;
    size_t n_tokens;
} sink;

static int on_pass(void *ud, const uint8_t *b, size_t len)
{
    sink *s = ud;
    FUZZ_CHECK(len > 0);
    memcpy(s->out + s->n_out, b, len);
    s->n_out += len;
    if (s->ranges) {
        s->ranges[s->n_ranges++] = (size_t)(b - s->base);
        s->ranges[s->n_ranges++] = (size_t)(b - s->base) + len;
    }
    return 0;
}

static int on_tag(void *ud, int32_t token, bool end)
{
    sink *s = ud;
    char line[GW_REPLAY_TAG_MAX];
    size_t n = gw_replay_tag_format(line, token, end, false);
    int32_t t2;
    bool e2;
    FUZZ_CHECK(n < sizeof(line) && gw_replay_tag_parse((const uint8_t *)line, n - 1, &t2, &e2) == 0 &&
               t2 == token && e2 == end && token >= 0);
    s->tokens[s->n_tokens] = token;
    s->ends[s->n_tokens++] = end;
    return 0;
}

static sink sink_new(const uint8_t *base, size_t size, bool ranges)
{
    sink s = {.base = base};
    s.out = malloc(size + 1);
    s.ranges = ranges ? malloc((size + 1) * 2 * sizeof(size_t)) : NULL;
    s.tokens = malloc((size / 6 + 1) * sizeof(int32_t));
    s.ends = malloc((size / 6 + 1) * sizeof(bool));
    return s;
}

static void sink_free(sink *s)
{
    free(s->out);
    free(s->ranges);
    free(s->tokens);
    free(s->ends);
}

/* b[from..to) holds tag lines only (each with a blank line after it when
 * alone), the first at an event's start: their count. */
static size_t tag_lines(const uint8_t *b, size_t from, size_t to)
{
    size_t n = 0;
    FUZZ_CHECK(from == 0 || from == to || (from >= 2 && b[from - 1] == '\n' && b[from - 2] == '\n'));
    while (from < to) {
        const uint8_t *nl = memchr(b + from, '\n', to - from);
        int32_t t;
        bool e;
        FUZZ_CHECK(nl && gw_replay_tag_parse(b + from, (size_t)(nl - b) - from, &t, &e) == 0);
        from = (size_t)(nl - b) + 1;
        if (from < to && b[from] == '\n')
            from++;
        n++;
    }
    return n;
}

static void stream(const uint8_t *b, size_t size, size_t piece)
{
    static const gw_replay_scan_cbs cbs = {on_pass, on_tag};
    /* whole */
    sink w = sink_new(b, size, true);
    bool end_w = false;
    size_t used_w;
    int rc_w = gw_replay_scan(b, size, 0, &end_w, &cbs, &w, &used_w);
    FUZZ_CHECK(rc_w == 0 || rc_w == 1 || rc_w == -EPROTO);
    FUZZ_CHECK(used_w <= size &&
               (used_w == 0 || (used_w >= 2 && b[used_w - 1] == '\n' && b[used_w - 2] == '\n')));
    if (rc_w == 1)
        FUZZ_CHECK(!end_w && size - used_w > 14 && !memcmp(b + used_w, "data: {\"error\"", 14));
    if (rc_w >= 0) { /* the passes cover the events read but for their tag lines */
        size_t at = 0, tags = 0;
        for (size_t i = 0; i < w.n_ranges; i += 2) {
            FUZZ_CHECK(w.ranges[i] >= at && w.ranges[i + 1] <= used_w);
            tags += tag_lines(b, at, w.ranges[i]);
            at = w.ranges[i + 1];
        }
        tags += tag_lines(b, at, used_w);
        FUZZ_CHECK(tags == w.n_tokens);
    }
    /* in pieces, as gateway/front/replay.c keeps what is not whole yet */
    sink c = sink_new(b, size, false);
    uint8_t *pend = malloc(size + 1);
    size_t n_pend = 0, off = 0;
    bool end_c = false;
    int rc_c = 0;
    while (off < size && rc_c == 0) {
        size_t k = size - off < piece ? size - off : piece, seen = n_pend, used;
        memcpy(pend + n_pend, b + off, k);
        n_pend += k;
        off += k;
        rc_c = gw_replay_scan(pend, n_pend, seen, &end_c, &cbs, &c, &used);
        memmove(pend, pend + used, n_pend - used);
        n_pend -= used;
    }
    FUZZ_CHECK(rc_c == rc_w && end_c == end_w && c.n_tokens == w.n_tokens);
    FUZZ_CHECK(!memcmp(c.tokens, w.tokens, w.n_tokens * sizeof(int32_t)) &&
               !memcmp(c.ends, w.ends, w.n_tokens * sizeof(bool)));
    if (rc_w >= 0)
        FUZZ_CHECK(c.n_out == w.n_out && !memcmp(c.out, w.out, w.n_out));
    if (rc_w == 0)
        FUZZ_CHECK(n_pend == size - used_w);
    free(pend);
    sink_free(&c);
    sink_free(&w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    if (!(data[0] & 1))
        resume(data + 1, size - 1);
    else
        stream(data + 2, size - 2, (size_t)data[1] + 1);
    return 0;
}
