/* Token replay's wire format (gateway/base/replay_wire.h): the tag lines
 * the gateway strips from a resumable event stream, whole or in pieces,
 * and x-infergate-resume, which a peer region sends. The malformed cases
 * are what the first parsers took (sscanf and strtol): an id cut at 39
 * bytes whose rest read as numbers, signs, spaces and leading zeros. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gateway/base/replay_wire.h"

static void test_resume_parse(void **state)
{
    (void)state;
    gw_replay_resume r;
    assert_int_equal(gw_replay_resume_parse("cmpl-3f 1764400000 18446744073709551615 17,0,2147483647", &r),
                     0);
    assert_string_equal(r.id, "cmpl-3f");
    assert_int_equal(r.created, 1764400000);
    assert_true(r.seed == UINT64_MAX);
    assert_int_equal(r.n_tokens, 3);
    assert_int_equal(r.tokens[0], 17);
    assert_int_equal(r.tokens[1], 0);
    assert_int_equal(r.tokens[2], INT32_MAX);
    free(r.tokens);
    /* no tokens: the run failed before its first */
    assert_int_equal(gw_replay_resume_parse("chatcmpl-kept 123 9", &r), 0);
    assert_int_equal(r.n_tokens, 0);
    assert_null(r.tokens);
    char id39[64];
    memset(id39, 'a', 39);
    strcpy(id39 + 39, " 1 2");
    assert_int_equal(gw_replay_resume_parse(id39, &r), 0);
    assert_int_equal((int)strlen(r.id), 39);
}

static void test_resume_malformed(void **state)
{
    (void)state;
    static const char *bad[] = {
        "",
        "cmpl-x",
        "cmpl-x 1",
        "cmpl-x 1 ",
        "cmpl-x 1 2 ",
        " cmpl-x 1 2",
        "cmpl-x  1 2",
        "cmpl-x 1 2 1,2,",
        "cmpl-x 1 2 ,1",
        "cmpl-x 1 2 1,,2",
        "cmpl-x 1 2 1, 2",
        "cmpl-x 1 2 +1",
        "cmpl-x 1 2 -1",
        "cmpl-x 1 2 -0",
        "cmpl-x 1 2 01",
        "cmpl-x 01 2 1",
        "cmpl-x 1 +2 1",
        "cmpl-x -1 2",
        "cmpl-x 1 2 2147483648",
        "cmpl-x 1 18446744073709551616",
        "cmpl-x 9223372036854775808 1",
        "cmpl-x 1 2 1 2",
        "cmpl-\x01 1 2",
        "cmpl-\x7f 1 2",
        "cmpl-x 1 2 1x",
        /* 40 bytes of id: sscanf's %39s cut it and read its digits as created */
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa123 456",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        gw_replay_resume r;
        if (gw_replay_resume_parse(bad[i], &r) != -EINVAL)
            fail_msg("taken: \"%s\"", bad[i]);
        assert_null(r.tokens);
        assert_int_equal(r.n_tokens, 0);
    }
}

static void test_tag(void **state)
{
    (void)state;
    char line[GW_REPLAY_TAG_MAX];
    assert_int_equal(gw_replay_tag_format(line, 42, false, false), strlen(": ig 42\n"));
    assert_string_equal(line, ": ig 42\n");
    gw_replay_tag_format(line, INT32_MAX, true, true);
    assert_string_equal(line, ": ig 2147483647 end\n\n");
    int32_t t;
    bool end;
    assert_int_equal(gw_replay_tag_parse((const uint8_t *)line, strlen(line) - 2, &t, &end), 0);
    assert_int_equal(t, INT32_MAX);
    assert_true(end);
    static const char *bad[] = {": ig ",   ": ig +5",   ": ig  5",     ": ig -1",
                                ": ig 05", ": ig 5 en", ": ig 5 end ", ": ig 2147483648",
                                ": ig 5x", ": ig 5end", ": ix 5"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (gw_replay_tag_parse((const uint8_t *)bad[i], strlen(bad[i]), &t, &end) != -EPROTO)
            fail_msg("taken: \"%s\"", bad[i]);
}

typedef struct got {
    char out[512];
    size_t n;
    int32_t toks[16];
    int n_toks;
} got;

static int pass(void *ud, const uint8_t *b, size_t len)
{
    got *g = ud;
    memcpy(g->out + g->n, b, len);
    g->n += len;
    return 0;
}

static int tag(void *ud, int32_t t, bool end)
{
    got *g = ud;
    (void)end;
    g->toks[g->n_toks++] = t;
    return 0;
}

static const gw_replay_scan_cbs cbs = {pass, tag};

#define EV(T, X) ": ig " #T "\ndata: {\"text\":\"" X "\"}\n\n"
#define DATA(X) "data: {\"text\":\"" X "\"}\n\n"

/* Fed in pieces of every size as the network may cut it: the same bytes
 * out, tags left out, whatever the cuts. */
static void test_scan_pieces(void **state)
{
    (void)state;
    static const char in[] = EV(5, "he") ": ig 9\n\n" EV(
        11, "llo") ": ig 2 end\ndata: {\"text\":\"!\"}\n\n"
                   "data: {\"error\":{\"code\":\"late\"}}\n\ndata: [DONE]\n\npartial";
    static const char want[] = DATA("he") DATA("llo") DATA("!") "data: {\"error\":{\"code\":\"late\"}}\n\n"
                                                                "data: [DONE]\n\n";
    const size_t len = sizeof(in) - 1;
    for (size_t piece = 1; piece <= len; piece++) {
        got g = {0};
        char pend[sizeof(in)];
        size_t n_pend = 0, used;
        bool end = false;
        for (size_t off = 0; off < len; off += piece) {
            size_t k = len - off < piece ? len - off : piece, seen = n_pend;
            memcpy(pend + n_pend, in + off, k);
            n_pend += k;
            assert_int_equal(gw_replay_scan((uint8_t *)pend, n_pend, seen, &end, &cbs, &g, &used), 0);
            memmove(pend, pend + used, n_pend - used);
            n_pend -= used;
        }
        assert_int_equal(g.n, sizeof(want) - 1);
        assert_memory_equal(g.out, want, g.n);
        assert_int_equal(g.n_toks, 4);
        assert_int_equal(g.toks[1], 9);
        assert_true(end);
        assert_int_equal(n_pend, strlen("partial"));
    }
}

/* Before the last token, an error event is the upstream failing: not
 * passed on, its offset given for the replay. A malformed tag: -EPROTO. */
static void test_scan_error(void **state)
{
    (void)state;
    static const char in[] = EV(5, "a") "data: {\"error\":{\"code\":\"upstream_failed\"}}\n\n" DATA("b");
    got g = {0};
    bool end = false;
    size_t used;
    assert_int_equal(gw_replay_scan((const uint8_t *)in, sizeof(in) - 1, 0, &end, &cbs, &g, &used), 1);
    assert_int_equal(used, strlen(EV(5, "a")));
    assert_int_equal(g.n, strlen(DATA("a")));
    static const char bad[] = EV(5, "a") ": ig x\ndata: {}\n\n";
    g = (got){0};
    assert_int_equal(gw_replay_scan((const uint8_t *)bad, sizeof(bad) - 1, 0, &end, &cbs, &g, &used),
                     -EPROTO);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resume_parse), cmocka_unit_test(test_resume_malformed),
        cmocka_unit_test(test_tag),          cmocka_unit_test(test_scan_pieces),
        cmocka_unit_test(test_scan_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
