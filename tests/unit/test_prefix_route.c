/* Prompt-prefix hashes and the cache-aware choice (gateway/base/prefix.h):
 * a conversation's later turn repeats its earlier chunks' hashes, anything
 * that changes the KV (model, tools, an earlier message) changes them, a
 * worker's set forgets what its pool has since overwritten, and the choice
 * weighs a hit against the queue, with sessions as the tie-breaker only. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "gateway/base/prefix.h"

static void chain(const char *body, gw_prefix_chain *c)
{
    gw_prefix_chain_of(body, strlen(body), c);
}

#define SYS "{\"role\":\"system\",\"content\":\"You are terse.\"}"
#define U1 "{\"role\":\"user\",\"content\":\"hi\"}"
#define A1 "{\"role\":\"assistant\",\"content\":\"hello\"}"
#define U2 "{\"role\":\"user\",\"content\":\"how are \\\"you\\\" [today]?\"}"

static void test_turns_share_leading_hashes(void **state)
{
    (void)state;
    gw_prefix_chain t1, t2, other;
    chain("{\"model\":\"m\",\"messages\":[" SYS "," U1 "],\"max_tokens\":4}", &t1);
    chain("{\"model\": \"m\", \"stream\": true, \"messages\": [" SYS ", " U1 ", " A1 ", " U2 "]}", &t2);
    assert_int_equal(t1.n, 2);
    assert_int_equal(t2.n, 4);
    assert_true(t1.hash[0] == t2.hash[0]);
    assert_true(t1.end[0] == t2.end[0]);
    assert_true(t1.hash[1] != t2.hash[1]); /* ", " before U1 in t2, "," in t1: raw bytes */
    chain("{\"model\":\"m\",\"messages\":[" SYS "," U1 "," A1 "," U2 "]}", &t2);
    assert_int_equal(t2.n, 4);
    for (int i = 0; i < 2; i++)
        assert_true(t1.hash[i] == t2.hash[i] && t1.end[i] == t2.end[i]);
    assert_true(t2.end[3] > t2.end[2] && t2.end[2] > t2.end[1]);
    /* another model, other tools, another first message: nothing shared */
    chain("{\"model\":\"n\",\"messages\":[" SYS "," U1 "]}", &other);
    assert_true(other.hash[0] != t1.hash[0]);
    chain("{\"model\":\"m\",\"tools\":[{\"type\":\"function\"}],\"messages\":[" SYS "," U1 "]}", &other);
    assert_true(other.hash[0] != t1.hash[0]);
    chain("{\"model\":\"m\",\"messages\":[" U1 "," U1 "]}", &other);
    assert_true(other.hash[0] != t1.hash[0] && other.hash[1] != t1.hash[1]);
    /* key order of the top level does not matter, a nested "messages" is not it */
    chain("{\"x\":{\"messages\":[1]},\"messages\":[" SYS "," U1 "],\"model\":\"m\"}", &other);
    assert_int_equal(other.n, 2);
    assert_true(other.hash[1] == t1.hash[1]);
}

static void test_prompt_chunks(void **state)
{
    (void)state;
    char a[2048], b[2048], text[1500];
    memset(text, 'x', sizeof(text) - 1);
    text[sizeof(text) - 1] = '\0';
    for (size_t i = 0; i < sizeof(text) - 1; i += 7)
        text[i] = (char)('a' + i % 26);
    snprintf(a, sizeof(a), "{\"model\":\"m\",\"prompt\":\"%.600s\"}", text);
    snprintf(b, sizeof(b), "{\"prompt\":\"%s\",\"model\":\"m\"}", text);
    gw_prefix_chain ca, cb;
    chain(a, &ca);
    chain(b, &cb);
    assert_int_equal(ca.n, 3); /* '"' + 600 bytes: 256, 256, 89 */
    assert_int_equal(cb.n, (1500 + GW_PREFIX_CHUNK - 1) / GW_PREFIX_CHUNK);
    assert_true(ca.hash[0] == cb.hash[0] && ca.hash[1] == cb.hash[1] && ca.hash[2] != cb.hash[2]);
    assert_int_equal(ca.end[1], 2 * GW_PREFIX_CHUNK);
    assert_int_equal(gw_prefix_match(&ca, NULL, 0), 0);
}

static void test_malformed_and_user(void **state)
{
    (void)state;
    const char *bad[] = {"", "[]", "{", "{\"messages\":", "{\"messages\":[{\"a\":\"b", "{\"messages\":{}}",
                         "{\"messages\":[]}", "{\"prompt\":\"\"}", "\"x\"", "{\"messages\":[1,,2]}"};
    gw_prefix_chain c;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        chain(bad[i], &c);
        assert_true(c.n <= 1);
    }
    chain("{\"messages\":[{\"a\":\"b\"}", &c); /* cut before the array closes: none */
    assert_int_equal(c.n, 0);
    chain("{\"user\":\"alice\",\"messages\":[" U1 "]}", &c);
    uint64_t alice = c.user;
    assert_true(alice != 0);
    chain("{\"messages\":[" U1 "],\"user\":\"bob\"}", &c);
    assert_true(c.user != 0 && c.user != alice);
    chain("{\"messages\":[" U1 "],\"user\":7}", &c);
    assert_true(c.user == 0);
}

static void test_match_longest(void **state)
{
    (void)state;
    gw_prefix_chain c;
    chain("{\"model\":\"m\",\"messages\":[" SYS "," U1 "," A1 "," U2 "]}", &c);
    uint64_t held[] = {c.hash[0], c.hash[2], 5, 77};
    int n = gw_prefix_sort(held, 4);
    assert_int_equal(gw_prefix_match(&c, held, n), 3);
    assert_true(gw_prefix_bytes(&c, 3) == c.end[2] && gw_prefix_bytes(&c, 0) == 0);
    uint64_t dup[] = {9, 3, 9, 3, 1};
    assert_int_equal(gw_prefix_sort(dup, 5), 3);
    assert_true(dup[0] == 1 && dup[1] == 3 && dup[2] == 9);
}

static void test_choose(void **state)
{
    (void)state;
    gw_prefix_chain c;
    chain("{\"model\":\"m\",\"messages\":[" SYS "," U1 "," A1 "," U2 "]}", &c);
    uint64_t hot[] = {c.hash[2]};
    double prompt = 1000; /* bytes, of which the first three chunks' are cached */
    double hit = gw_prefix_bytes(&c, 3);
    gw_prefix_cand cand[2] = {{NULL, 0, 0, 1.0, 0}, {hot, 1, 0, 1.0, 1}};
    double ttft, cached;
    /* equal queues: the holder */
    assert_int_equal(gw_prefix_choose(&c, prompt, cand, 2, 0, &ttft, &cached), 1);
    assert_true(cached == hit && ttft == prompt - hit);
    /* the holder's queue outweighs the prefill it saves: the idle one */
    cand[1].wait_ms = hit + 1;
    assert_int_equal(gw_prefix_choose(&c, prompt, cand, 2, 0, &ttft, &cached), 0);
    assert_true(cached == 0);
    /* a session picks among near-equal ones, the same each time, and
     * sessions spread over both */
    cand[1].wait_ms = 0;
    cand[1].n_held = 0;
    int seen[2] = {0, 0};
    for (uint64_t s = 1; s <= 64; s++) {
        int k = gw_prefix_choose(&c, prompt, cand, 2, s * 0x9e3779b97f4a7c15ull, NULL, NULL);
        assert_int_equal(gw_prefix_choose(&c, prompt, cand, 2, s * 0x9e3779b97f4a7c15ull, NULL, NULL), k);
        seen[k]++;
    }
    assert_true(seen[0] > 8 && seen[1] > 8);
    /* ...but never one that is loaded: whatever the session, the idle one */
    cand[0].wait_ms = 500;
    for (uint64_t s = 1; s <= 64; s++)
        assert_int_equal(gw_prefix_choose(&c, prompt, cand, 2, s, NULL, NULL), 1);
    /* nor over a hit that saves more than the margin (half the prompt) */
    cand[0].wait_ms = 0;
    cand[1].held = hot;
    cand[1].n_held = 1;
    cand[0].ms_per_byte = cand[1].ms_per_byte = 10;
    for (uint64_t s = 1; s <= 64; s++)
        assert_int_equal(gw_prefix_choose(&c, 2 * hit, cand, 2, s, NULL, NULL), 1);
    assert_int_equal(gw_prefix_choose(&c, prompt, cand, 0, 1, NULL, NULL), -1);
}

static void test_set(void **state)
{
    (void)state;
    gw_prefix_set s;
    assert_int_equal(gw_prefix_set_init(&s, 4), 0);
    gw_prefix_chain a, b;
    chain("{\"model\":\"m\",\"messages\":[" SYS "," U1 "]}", &a);
    chain("{\"model\":\"m\",\"messages\":[" U1 "," A1 "," U2 "]}", &b);
    gw_prefix_set_add(&s, &a);
    gw_prefix_set_age(&s, 100, 1000); /* a stamped at 100 */
    uint64_t out[8];
    assert_int_equal(gw_prefix_set_list(&s, out, 8), 2);
    assert_true(out[0] == a.hash[1] && out[1] == a.hash[0]);
    /* b's three take the capacity: a's oldest value goes */
    gw_prefix_set_add(&s, &b);
    assert_int_equal(gw_prefix_set_list(&s, out, 8), 4);
    assert_true(out[0] == b.hash[2] && out[3] == a.hash[1]);
    gw_prefix_set_age(&s, 1000, 1000); /* b stamped at 1000; a still within */
    assert_int_equal(gw_prefix_set_list(&s, out, 8), 4);
    gw_prefix_set_age(&s, 1101, 1000); /* a's KV is overwritten by now */
    assert_int_equal(gw_prefix_set_list(&s, out, 8), 3);
    /* used again: refreshed, stamped anew */
    gw_prefix_set_add(&s, &b);
    gw_prefix_set_age(&s, 5000, 1000);
    assert_int_equal(gw_prefix_set_list(&s, out, 2), 2);
    gw_prefix_set_age(&s, 6001, 1000);
    assert_int_equal(gw_prefix_set_list(&s, out, 8), 0);
    gw_prefix_set_free(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_turns_share_leading_hashes),
        cmocka_unit_test(test_prompt_chunks),
        cmocka_unit_test(test_malformed_and_user),
        cmocka_unit_test(test_match_longest),
        cmocka_unit_test(test_choose),
        cmocka_unit_test(test_set),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
