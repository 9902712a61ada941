/* Tokenizer tests: vocabularies are built with rt_gguf_writer into temp
 * files, loaded back, and checked against hand-worked ids, against naive
 * O(n^2) reference merges (SentencePiece scores, BPE ranks) on random text,
 * and for decode(encode(x)) == x on random bytes; then the metadata errors. */
#define _GNU_SOURCE /* memmem */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/gguf.h"
#include "runtime/tokenizer.h"

#define SP "\xe2\x96\x81" /* U+2581 */

static uint64_t rng_state;

static uint32_t rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

/* Writes w to a temp file, opens it, loads a tokenizer; the file is gone
 * and the GGUF freed before returning (the tokenizer must not need them). */
static int load_writer(rt_gguf_writer *w, rt_tokenizer **t, char *err, size_t err_len)
{
    char path[] = "/tmp/infergate-tok-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    char werr[256] = "";
    int rc = rt_gguf_writer_write(w, path, werr, sizeof(werr));
    if (rc != 0)
        fail_msg("gguf write: %s", werr);
    rt_gguf *g = NULL;
    rc = rt_gguf_open(path, &g, werr, sizeof(werr));
    unlink(path);
    if (rc != 0)
        fail_msg("gguf open: %s", werr);
    rt_gguf_writer_free(w);
    err[0] = '\0';
    *t = NULL;
    rc = rt_tokenizer_load(g, t, err, err_len);
    rt_gguf_free(g);
    return rc;
}

/* ---- a byte-fallback SentencePiece vocabulary ---- */

typedef struct vocab {
    char *tok[1024];
    float score[1024];
    int32_t type[1024];
    int n;
    char *merge[256]; /* BPE: "left right", in rank order */
    int n_merges;
} vocab;

static int vocab_find(const vocab *v, const char *s)
{
    for (int i = 0; i < v->n; i++)
        if (strcmp(v->tok[i], s) == 0)
            return i;
    return -1;
}

static void vocab_add(vocab *v, const char *s, float score, int32_t type)
{
    if (vocab_find(v, s) >= 0)
        return;
    assert_true(v->n < 1024);
    v->tok[v->n] = strdup(s);
    v->score[v->n] = score;
    v->type[v->n] = type;
    v->n++;
}

static void vocab_free(vocab *v)
{
    for (int i = 0; i < v->n; i++)
        free(v->tok[i]);
    for (int i = 0; i < v->n_merges; i++)
        free(v->merge[i]);
    free(v);
}

static vocab *spm_vocab(void)
{
    vocab *v = calloc(1, sizeof(*v));
    vocab_add(v, "<unk>", 0, 2);
    vocab_add(v, "<s>", 0, 3);
    vocab_add(v, "</s>", 0, 3);
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof(name), "<0x%02X>", b);
        vocab_add(v, name, 0, 6);
    }
    vocab_add(v, SP, -1000, 1);
    static const struct {
        const char *s;
        float score;
    } hand[] = {
        {SP "t", -10},    {"he", -11}, {SP "the", -5}, {SP "a", -12},       {SP "w", -13}, {"or", -14},
        {"ld", -15},      {"ll", -16}, {"el", -20},    {"lo", -25},         {SP "H", -30}, {SP "wor", -8},
        {SP "world", -3}, {"llo", -9}, {"ello", -7},   {"<|user|>", -2000}, /* typed user-defined below */
    };
    for (size_t i = 0; i < sizeof(hand) / sizeof(hand[0]); i++)
        vocab_add(v, hand[i].s, hand[i].score, i + 1 == sizeof(hand) / sizeof(hand[0]) ? 4 : 1);
    char buf[16];
    for (int c = 0; c < 26; c++) {
        snprintf(buf, sizeof(buf), "%c", 'a' + c);
        vocab_add(v, buf, -100 - 0.01f * c, 1);
        snprintf(buf, sizeof(buf), "%c", 'A' + c);
        vocab_add(v, buf, -100 - 0.01f * c, 1);
        snprintf(buf, sizeof(buf), SP "%c", 'a' + c);
        vocab_add(v, buf, -40 - 0.1f * c, 1);
    }
    for (int c = 0; c < 10; c++) {
        snprintf(buf, sizeof(buf), "%c", '0' + c);
        vocab_add(v, buf, -100, 1);
    }
    for (const char *p = ".,!?'"; *p; p++) {
        snprintf(buf, sizeof(buf), "%c", *p);
        vocab_add(v, buf, -100, 1);
    }
    /* letter pairs and some triples, all scoring below the hand-made pieces */
    for (int i = 0; i < 26; i++)
        for (int j = 0; j < 26; j++) {
            if ((i * 7 + j * 3) % 5 != 0)
                continue;
            int k = i * 26 + j;
            snprintf(buf, sizeof(buf), "%c%c", 'a' + i, 'a' + j);
            vocab_add(v, buf, -60 - (float)((k * 37) % 40) - 0.001f * k, 1);
            if (k % 3 == 0) {
                snprintf(buf, sizeof(buf), "%c%c%c", 'a' + i, 'a' + j, 'a' + (k % 26));
                vocab_add(v, buf, -55 - (float)((k * 11) % 30) - 0.001f * k, 1);
            }
        }
    return v;
}

enum {
    SPM_OK = 0,
    SPM_NO_PREFIX = 1,
    SPM_NO_TOKENS = 2,
    SPM_BAD_SCORES = 4,
    SPM_BAD_BOS = 8,
    SPM_BAD_TYPE = 16,
    SPM_NO_MODEL = 32,
    SPM_BERT = 64,
    SPM_INT_TOKENS = 128,
    SPM_BAD_EOS = 256,
};

static int spm_load(const vocab *v, int flags, rt_tokenizer **t, char *err, size_t err_len)
{
    rt_gguf_writer *w = rt_gguf_writer_new();
    assert_non_null(w);
    if (!(flags & SPM_NO_MODEL))
        assert_int_equal(
            rt_gguf_writer_add_str(w, "tokenizer.ggml.model", flags & SPM_BERT ? "bert" : "llama"), 0);
    if (flags & SPM_INT_TOKENS)
        assert_int_equal(rt_gguf_writer_add_arr_i32(w, "tokenizer.ggml.tokens", v->type, (uint64_t)v->n), 0);
    else if (!(flags & SPM_NO_TOKENS))
        assert_int_equal(rt_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->tok,
                                                    (uint64_t)v->n),
                         0);
    int32_t types[1024];
    memcpy(types, v->type, sizeof(types));
    if (flags & SPM_BAD_TYPE)
        types[10] = 9;
    assert_int_equal(rt_gguf_writer_add_arr_f32(w, "tokenizer.ggml.scores", v->score,
                                                (uint64_t)v->n - (flags & SPM_BAD_SCORES ? 1 : 0)),
                     0);
    assert_int_equal(rt_gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", types, (uint64_t)v->n), 0);
    assert_int_equal(rt_gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 0), 0);
    assert_int_equal(
        rt_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", flags & SPM_BAD_BOS ? 100000 : 1), 0);
    assert_int_equal(
        rt_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", flags & SPM_BAD_EOS ? (uint32_t)v->n : 2),
        0);
    assert_int_equal(rt_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", true), 0);
    if (flags & SPM_NO_PREFIX)
        assert_int_equal(rt_gguf_writer_add_bool(w, "tokenizer.ggml.add_space_prefix", false), 0);
    return load_writer(w, t, err, err_len);
}

static rt_tokenizer *spm_tok(const vocab *v, int flags)
{
    rt_tokenizer *t;
    char err[256];
    int rc = spm_load(v, flags, &t, err, sizeof(err));
    if (rc != 0)
        fail_msg("load: %s", err);
    return t;
}

static int id(const rt_tokenizer *t, const char *s)
{
    int32_t i = rt_tokenizer_find(t, s);
    if (i < 0)
        fail_msg("no token '%s'", s);
    return i;
}

static void expect_ids(const rt_tokenizer *t, const char *text, bool add_bos, bool special,
                       const int32_t *want, int n_want)
{
    int32_t got[256];
    int n = rt_tokenizer_encode(t, text, strlen(text), add_bos, special, got, 256);
    if (n != n_want) {
        fprintf(stderr, "'%s': got %d ids:", text, n);
        for (int i = 0; i < n && i < 256; i++)
            fprintf(stderr, " %d(%s)", got[i], rt_tokenizer_token_text(t, got[i]));
        fprintf(stderr, "\n");
        fail_msg("'%s': %d ids, want %d", text, n, n_want);
    }
    for (int i = 0; i < n; i++)
        if (got[i] != want[i])
            fail_msg("'%s': id %d is %d (%s), want %d (%s)", text, i, got[i],
                     rt_tokenizer_token_text(t, got[i]), want[i], rt_tokenizer_token_text(t, want[i]));
}

static char *roundtrip(const rt_tokenizer *t, const char *s, size_t n, bool strip, int *n_out)
{
    int cap = (int)(3 * n + 8);
    int32_t *ids = malloc((size_t)cap * sizeof(int32_t));
    int k = rt_tokenizer_encode(t, s, n, false, false, ids, cap);
    assert_true(k >= 0 && k <= cap);
    char *out = malloc(4 * n + 16);
    int m = rt_tokenizer_decode(t, ids, k, strip, out, 4 * n + 16);
    assert_true(m >= 0 && (size_t)m < 4 * n + 16);
    free(ids);
    *n_out = m;
    return out;
}

static void test_spm_known(void **state)
{
    (void)state;
    vocab *v = spm_vocab();
    rt_tokenizer *t = spm_tok(v, SPM_OK);
    assert_int_equal(rt_tokenizer_kind(t), RT_TOK_SPM);
    assert_string_equal(rt_tokenizer_kind_name(t), "llama");
    assert_int_equal(rt_tokenizer_n_vocab(t), v->n);
    assert_int_equal(rt_tokenizer_bos(t), 1);
    assert_int_equal(rt_tokenizer_eos(t), 2);
    assert_true(rt_tokenizer_add_bos_default(t));
    assert_true(rt_tokenizer_is_eog(t, 2));
    assert_false(rt_tokenizer_is_eog(t, 1));

    int32_t w1[] = {id(t, SP "the"), id(t, SP "world")};
    expect_ids(t, "the world", false, false, w1, 2);
    int32_t w2[] = {1, id(t, SP "the")};
    expect_ids(t, "the", true, false, w2, 2);
    int32_t w3[] = {id(t, SP "H"), id(t, "ello")};
    expect_ids(t, "Hello", false, false, w3, 2);
    /* é has no piece: its two UTF-8 bytes fall back to byte tokens */
    int32_t w4[] = {id(t, SP), 3 + 0xC3, 3 + 0xA9};
    expect_ids(t, "\xc3\xa9", false, false, w4, 3);
    int32_t w5[] = {id(t, SP), id(t, SP "the")};
    expect_ids(t, " the", false, false, w5, 2);
    int32_t w6[] = {1};
    expect_ids(t, "", true, false, w6, 1);
    expect_ids(t, "", false, false, NULL, 0);
    /* control text is plain text unless asked; user-defined pieces too */
    int32_t w7[] = {1, id(t, "<|user|>"), id(t, SP "the")};
    expect_ids(t, "<s><|user|>the", false, true, w7, 3);
    int32_t got[64];
    int n = rt_tokenizer_encode(t, "<s>the", 6, false, false, got, 64);
    assert_true(n > 2);
    for (int i = 0; i < n; i++)
        assert_true(got[i] != 1);
    /* a SentencePiece vocabulary's user-defined token too: the space put
     * after a special token would change the text */
    n = rt_tokenizer_encode(t, "the<|user|>the", 14, false, false, got, 64);
    for (int i = 0; i < n; i++)
        assert_true(got[i] != id(t, "<|user|>"));

    /* a short output buffer still reports the full count */
    assert_int_equal(rt_tokenizer_encode(t, "the world", 9, true, false, got, 1), 3);
    assert_int_equal(got[0], 1);
    assert_int_equal(rt_tokenizer_encode(t, "the world", 9, true, false, NULL, 0), 3);

    /* decode */
    char buf[64];
    int32_t seq[] = {1, id(t, SP "the"), id(t, SP "world"), 3 + 0xC3, 3 + 0xA9, 2};
    assert_int_equal(rt_tokenizer_decode(t, seq, 6, true, buf, sizeof(buf)), 11);
    assert_string_equal(buf, "the world\xc3\xa9");
    assert_int_equal(rt_tokenizer_decode(t, seq, 6, false, buf, sizeof(buf)), 12);
    assert_string_equal(buf, " the world\xc3\xa9");
    assert_int_equal(rt_tokenizer_decode(t, seq, 6, true, buf, 4), 11);
    assert_memory_equal(buf, "the ", 4);
    int32_t bad[] = {v->n};
    assert_int_equal(rt_tokenizer_decode(t, bad, 1, true, buf, sizeof(buf)), -EINVAL);
    size_t pl = 9;
    const char *piece = rt_tokenizer_piece(t, 3 + 0x41, &pl);
    assert_non_null(piece);
    assert_int_equal(pl, 1);
    assert_int_equal(piece[0], 'A');
    assert_non_null(rt_tokenizer_piece(t, 1, &pl));
    assert_int_equal(pl, 0);
    piece = rt_tokenizer_piece(t, id(t, SP "the"), &pl);
    assert_int_equal(pl, 4);
    assert_memory_equal(piece, " the", 4);
    assert_null(rt_tokenizer_piece(t, -1, &pl));
    assert_null(rt_tokenizer_piece(t, v->n, &pl));
    assert_string_equal(rt_tokenizer_token_text(t, 1), "<s>");
    assert_null(rt_tokenizer_token_text(t, v->n));
    assert_int_equal(rt_tokenizer_find(t, "no such piece"), -1);
    rt_tokenizer_free(t);

    /* without the space prefix */
    t = spm_tok(v, SPM_NO_PREFIX);
    int32_t w8[] = {id(t, "t"), id(t, "he"), id(t, SP "world")};
    expect_ids(t, "the world", false, false, w8, 3);
    int32_t w9[] = {id(t, SP "the")};
    assert_int_equal(rt_tokenizer_decode(t, w9, 1, true, buf, sizeof(buf)), 4); /* nothing to strip */
    /* no space to add after it: a user-defined token is split out of plain
     * text, as llama.cpp does for Gemma's ("\n\n", runs of spaces) */
    int32_t w10[] = {id(t, "t"), id(t, "he"), id(t, "<|user|>"), id(t, "t"), id(t, "he")};
    expect_ids(t, "the<|user|>the", false, false, w10, 5);
    assert_int_equal(rt_tokenizer_decode(t, w10, 5, false, buf, sizeof(buf)), 14);
    assert_string_equal(buf, "the<|user|>the");
    rt_tokenizer_free(t);
    vocab_free(v);
}

/* Naive SentencePiece: merge the best-scoring adjacent pair (leftmost on a
 * tie) until none is a piece; unknown symbols become byte tokens. */
static int spm_reference(const vocab *v, const char *text, size_t n, int32_t *out)
{
    char esc[4096];
    size_t m = 0;
    memcpy(esc, SP, 3);
    m = 3;
    for (size_t i = 0; i < n; i++) {
        if (text[i] == ' ') {
            memcpy(esc + m, SP, 3);
            m += 3;
        } else {
            esc[m++] = text[i];
        }
    }
    size_t start[4096], len[4096];
    int ns = 0;
    for (size_t p = 0; p < m;) {
        /* only ASCII and 2-byte sequences appear in the random text */
        uint8_t c = (uint8_t)esc[p];
        size_t cl = 1;
        if (c == 0xE2 && p + 2 < m && (uint8_t)esc[p + 1] == 0x96 && (uint8_t)esc[p + 2] == 0x81)
            cl = 3;
        else if ((c & 0xE0) == 0xC0 && p + 1 < m && ((uint8_t)esc[p + 1] & 0xC0) == 0x80 && c >= 0xC2)
            cl = 2;
        start[ns] = p;
        len[ns] = cl;
        ns++;
        p += cl;
    }
    for (;;) {
        int best = -1;
        float bs = 0;
        for (int i = 0; i + 1 < ns; i++) {
            char cat[64];
            size_t cl = len[i] + len[i + 1];
            if (cl >= sizeof(cat))
                continue;
            memcpy(cat, esc + start[i], cl);
            cat[cl] = '\0';
            int k = vocab_find(v, cat);
            if (k < 0 || v->type[k] != 1)
                continue;
            if (best < 0 || v->score[k] > bs) {
                best = i;
                bs = v->score[k];
            }
        }
        if (best < 0)
            break;
        len[best] += len[best + 1];
        memmove(start + best + 1, start + best + 2, (size_t)(ns - best - 2) * sizeof(size_t));
        memmove(len + best + 1, len + best + 2, (size_t)(ns - best - 2) * sizeof(size_t));
        ns--;
    }
    int k = 0;
    for (int i = 0; i < ns; i++) {
        char s[64];
        memcpy(s, esc + start[i], len[i]);
        s[len[i]] = '\0';
        int tk = vocab_find(v, s);
        if (tk >= 0 && v->type[tk] == 1) {
            out[k++] = tk;
        } else {
            for (size_t b = 0; b < len[i]; b++)
                out[k++] = 3 + (uint8_t)s[b];
        }
    }
    return k;
}

static void test_spm_reference_and_roundtrip(void **state)
{
    (void)state;
    vocab *v = spm_vocab();
    rt_tokenizer *t = spm_tok(v, SPM_OK);
    rng_state = 42;
    static const char *alphabet[] = {"a", "b", "e", "h", "l",        "o", "r", "t",        "w", "d",
                                     "H", " ", " ", "!", "\xc3\xa9", "x", "q", "\xc3\xb1", "z", "'"};
    for (int iter = 0; iter < 300; iter++) {
        char text[256];
        size_t n = 0;
        int words = (int)(rnd() % 24);
        for (int k = 0; k < words; k++) {
            const char *a = alphabet[rnd() % (sizeof(alphabet) / sizeof(alphabet[0]))];
            memcpy(text + n, a, strlen(a));
            n += strlen(a);
        }
        int32_t want[2048], got[2048];
        int nw = spm_reference(v, text, n, want);
        int ng = rt_tokenizer_encode(t, text, n, false, false, got, 2048);
        if (n == 0)
            nw = 0;
        assert_int_equal(ng, nw);
        assert_memory_equal(got, want, (size_t)ng * sizeof(int32_t));
    }
    /* decode(encode(x)) == x on arbitrary bytes, invalid UTF-8 included */
    for (int iter = 0; iter < 500; iter++) {
        char text[200];
        size_t n = rnd() % sizeof(text);
        for (size_t i = 0; i < n; i++) {
            uint32_t r = rnd() % 8;
            text[i] = r < 3 ? (char)(rnd() % 256) : r < 4 ? ' ' : (char)('a' + rnd() % 26);
        }
        if (memmem(text, n, SP, 3))
            continue;
        int m;
        char *out = roundtrip(t, text, n, true, &m);
        assert_int_equal(m, (int)n);
        assert_memory_equal(out, text, n);
        free(out);
    }
    /* a long input goes through the heap in one piece */
    size_t big = 200000;
    char *text = malloc(big);
    for (size_t i = 0; i < big; i++)
        text[i] = "the world hello \xc3\xa9"[i % 18];
    int m;
    char *out = roundtrip(t, text, big, true, &m);
    assert_int_equal(m, (int)big);
    assert_memory_equal(out, text, big);
    free(out);
    free(text);
    rt_tokenizer_free(t);
    vocab_free(v);
}

/* ---- a byte-level BPE vocabulary ---- */

static void bpe_utf8(uint8_t b, char *out)
{
    uint32_t cp = b;
    if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) {
        int n = 0;
        for (int k = 0; k < b; k++)
            if (!((k >= 0x21 && k <= 0x7E) || (k >= 0xA1 && k <= 0xAC) || k >= 0xAE))
                n++;
        cp = 256 + (uint32_t)n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

static void bpe_merge(vocab *v, const char *l, const char *r)
{
    char m[64], cat[64];
    snprintf(m, sizeof(m), "%s %s", l, r);
    snprintf(cat, sizeof(cat), "%s%s", l, r);
    v->merge[v->n_merges++] = strdup(m);
    vocab_add(v, cat, 0, 1);
}

#define G "\xc4\xa0" /* Ġ: space in the byte alphabet */
#define C "\xc4\x8a" /* Ċ: newline */

static vocab *bpe_vocab(void)
{
    vocab *v = calloc(1, sizeof(*v));
    for (int b = 0; b < 256; b++) {
        char s[4];
        bpe_utf8((uint8_t)b, s);
        vocab_add(v, s, 0, 1);
    }
    static const char *m[][2] = {
        {"1", "2"}, {"12", "3"},     {"123", "4"},  {"4", "5"}, {G, "1"},    {"l", "l"},
        {"H", "e"}, {"He", "ll"},    {"Hell", "o"}, {"o", "r"}, {G, "w"},    {G "w", "or"},
        {"l", "d"}, {G "wor", "ld"}, {"!", "!"},    {C, C},     {"!!", C C}, {"x", "y"},
        {"y", "z"}, {"z", "y"},      {"y", "x"},    {"I", "'"}, {"'", "M"},
    };
    for (size_t i = 0; i < sizeof(m) / sizeof(m[0]); i++)
        bpe_merge(v, m[i][0], m[i][1]);
    /* pseudo-random merges over a, b, c for the reference comparison */
    const char *abc[64] = {"a", "b", "c"};
    int n_abc = 3;
    uint64_t s = 7;
    for (int k = 0; k < 60 && n_abc < 64; k++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        const char *l = abc[(s >> 33) % (uint64_t)n_abc];
        const char *r = abc[(s >> 45) % (uint64_t)n_abc];
        if (strlen(l) + strlen(r) > 5)
            continue;
        char cat[16];
        snprintf(cat, sizeof(cat), "%s%s", l, r);
        bool dup = false;
        char mm[32];
        snprintf(mm, sizeof(mm), "%s %s", l, r);
        for (int i = 0; i < v->n_merges; i++)
            dup |= strcmp(v->merge[i], mm) == 0;
        if (dup)
            continue;
        bpe_merge(v, l, r);
        if (vocab_find(v, cat) >= 0) {
            bool have = false;
            for (int i = 0; i < n_abc; i++)
                have |= strcmp(abc[i], cat) == 0;
            if (!have)
                abc[n_abc++] = v->tok[vocab_find(v, cat)];
        }
    }
    vocab_add(v, "zzz", 0, 1); /* reachable only as a whole word (llama3 ignore_merges) */
    vocab_add(v, "<|begin_of_text|>", 0, 3);
    vocab_add(v, "<|end_of_text|>", 0, 3);
    vocab_add(v, "<|eot_id|>", 0, 3);
    vocab_add(v, "<|im_start|>", 0, 3);
    vocab_add(v, "<|im_end|>", 0, 3);
    vocab_add(v, "<|im_start|>x", 0, 4); /* longer special sharing a prefix */
    return v;
}

static int bpe_load_eos(const vocab *v, const char *pre, const char *extra_merge, bool no_merges,
                        const char *eos, rt_tokenizer **t, char *err, size_t err_len)
{
    rt_gguf_writer *w = rt_gguf_writer_new();
    assert_non_null(w);
    assert_int_equal(rt_gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2"), 0);
    if (pre)
        assert_int_equal(rt_gguf_writer_add_str(w, "tokenizer.ggml.pre", pre), 0);
    assert_int_equal(
        rt_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->tok, (uint64_t)v->n),
        0);
    assert_int_equal(rt_gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", v->type, (uint64_t)v->n), 0);
    if (!no_merges) {
        const char *merges[260];
        int n = 0;
        for (int i = 0; i < v->n_merges; i++)
            merges[n++] = v->merge[i];
        if (extra_merge) {
            merges[n++] = extra_merge;
            merges[n++] = "nospace";
        }
        assert_int_equal(rt_gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", merges, (uint64_t)n), 0);
    }
    assert_int_equal(rt_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id",
                                            (uint32_t)vocab_find(v, "<|begin_of_text|>")),
                     0);
    assert_int_equal(rt_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)vocab_find(v, eos)),
                     0);
    return load_writer(w, t, err, err_len);
}

static int bpe_load(const vocab *v, const char *pre, const char *extra_merge, bool no_merges,
                    rt_tokenizer **t, char *err, size_t err_len)
{
    return bpe_load_eos(v, pre, extra_merge, no_merges, "<|end_of_text|>", t, err, err_len);
}

static rt_tokenizer *bpe_tok(const vocab *v, const char *pre)
{
    rt_tokenizer *t;
    char err[256];
    int rc = bpe_load(v, pre, NULL, false, &t, err, sizeof(err));
    if (rc != 0)
        fail_msg("load: %s", err);
    return t;
}

static void test_bpe_pretokenizers(void **state)
{
    (void)state;
    vocab *v = bpe_vocab();
    const char *text = "Hello world 12345!!\n\n";

    rt_tokenizer *t = bpe_tok(v, "llama-bpe");
    assert_int_equal(rt_tokenizer_kind(t), RT_TOK_BPE);
    assert_string_equal(rt_tokenizer_kind_name(t), "gpt2");
    assert_string_equal(rt_tokenizer_pre(t), "llama3");
    assert_false(rt_tokenizer_pre_fallback(t));
    assert_true(rt_tokenizer_add_bos_default(t)); /* llama3 default */
    assert_int_equal(rt_tokenizer_merges_skipped(t), 0);
    int32_t l3[] = {id(t, "Hello"), id(t, G "world"), ' ', id(t, "123"), id(t, "45"), id(t, "!!" C C)};
    expect_ids(t, text, false, false, l3, 6);
    int32_t l3b[] = {rt_tokenizer_bos(t), id(t, "Hello")};
    expect_ids(t, "Hello", true, false, l3b, 2);
    int32_t l3c[] = {'I', id(t, "'M")}; /* contractions are caseless in llama3 */
    expect_ids(t, "I'M", false, false, l3c, 2);
    int32_t l3d[] = {id(t, "zzz")};
    expect_ids(t, "zzz", false, false, l3d, 1);
    rt_tokenizer_free(t);

    t = bpe_tok(v, "qwen2");
    assert_string_equal(rt_tokenizer_pre(t), "qwen2");
    assert_false(rt_tokenizer_add_bos_default(t));
    int32_t q2[] = {id(t, "Hello"), id(t, G "world"), ' ', '1', '2', '3', '4', '5', id(t, "!!" C C)};
    expect_ids(t, text, false, false, q2, 9);
    rt_tokenizer_free(t);

    t = bpe_tok(v, "gpt-2");
    assert_string_equal(rt_tokenizer_pre(t), "gpt2");
    int32_t g2[] = {id(t, "Hello"), id(t, G "world"), ' ', id(t, "1234"), '5', id(t, "!!"), id(t, C C)};
    expect_ids(t, text, false, false, g2, 7);
    int32_t g2b[] = {'I', '\'', 'M'}; /* case-sensitive contractions */
    expect_ids(t, "I'M", false, false, g2b, 3);
    int32_t g2c[] = {'z', 'z', 'z'}; /* no ignore_merges */
    expect_ids(t, "zzz", false, false, g2c, 3);
    /* rank order: lower rank first, leftmost on equal ranks */
    int32_t r1[] = {id(t, "xy"), 'z'};
    expect_ids(t, "xyz", false, false, r1, 2);
    int32_t r2[] = {id(t, "yz"), 'y'};
    expect_ids(t, "yzy", false, false, r2, 2);
    int32_t r3[] = {id(t, "zy"), 'x'};
    expect_ids(t, "zyx", false, false, r3, 2);
    int32_t r4[] = {id(t, "xy"), id(t, "xy")};
    expect_ids(t, "xyxy", false, false, r4, 2);
    rt_tokenizer_free(t);

    t = bpe_tok(v, "starcoder");
    assert_string_equal(rt_tokenizer_pre(t), "starcoder");
    int32_t s2[] = {' ', '1', '2'};
    expect_ids(t, " 12", false, false, s2, 3);
    rt_tokenizer_free(t);

    /* Tekken: digits one by one as Qwen2, words split where lower case
     * turns upper, a whole word that is a token skips the merges. */
    t = bpe_tok(v, "tekken");
    assert_string_equal(rt_tokenizer_pre(t), "tekken");
    assert_true(rt_tokenizer_add_bos_default(t));
    expect_ids(t, text, false, false, q2, 9);
    int32_t tk[] = {id(t, "zzz"), id(t, "Hello")};
    expect_ids(t, "zzzHello", false, false, tk, 2);
    expect_ids(t, "I'M", false, false, l3c, 2);
    rt_tokenizer_free(t);
    /* o200k (gpt-oss, GPT-4o): Tekken's case-change split, but digits by
     * threes as Llama 3, a contraction kept on its word, and the merges
     * always run */
    t = bpe_tok(v, "gpt-4o");
    assert_string_equal(rt_tokenizer_pre(t), "gpt-4o");
    assert_false(rt_tokenizer_pre_fallback(t));
    assert_false(rt_tokenizer_add_bos_default(t));
    expect_ids(t, text, false, false, l3, 6);
    int32_t o2[] = {'z', 'z', 'z', id(t, "Hello")};
    expect_ids(t, "zzzHello", false, false, o2, 4);
    int32_t o3[] = {id(t, "I'"), 'M'}; /* one piece: "I" + "'" merges first */
    expect_ids(t, "I'M", false, false, o3, 2);
    rt_tokenizer_free(t);
    t = bpe_tok(v, "llama4");
    assert_string_equal(rt_tokenizer_pre(t), "gpt-4o");
    rt_tokenizer_free(t);
    t = bpe_tok(v, "qwen2"); /* the same text is one word there */
    int32_t whole[16];
    int n = rt_tokenizer_encode(t, "zzzHello", 8, false, false, whole, 16);
    assert_true(n > 2 && whole[0] != id(t, "zzz"));
    rt_tokenizer_free(t);

    /* llama.cpp's other names for Llama 3's split; Smaug's split without
     * its merge and BOS defaults */
    t = bpe_tok(v, "falcon3");
    assert_string_equal(rt_tokenizer_pre(t), "llama3");
    assert_true(rt_tokenizer_add_bos_default(t));
    rt_tokenizer_free(t);
    t = bpe_tok(v, "smaug-bpe");
    assert_string_equal(rt_tokenizer_pre(t), "smaug");
    assert_false(rt_tokenizer_add_bos_default(t));
    expect_ids(t, "I'M", false, false, l3c, 2);
    expect_ids(t, "zzz", false, false, g2c, 3);
    rt_tokenizer_free(t);
    t = bpe_tok(v, "dbrx"); /* Phi-4's files: cl100k, split as Smaug's */
    assert_string_equal(rt_tokenizer_pre(t), "smaug");
    assert_false(rt_tokenizer_pre_fallback(t));
    expect_ids(t, "I'M", false, false, l3c, 2);
    rt_tokenizer_free(t);

    /* no pre at all is GPT-2's; an unknown one falls back to it and says so */
    t = bpe_tok(v, NULL);
    assert_string_equal(rt_tokenizer_pre(t), "gpt2");
    assert_false(rt_tokenizer_pre_fallback(t));
    rt_tokenizer_free(t);
    t = bpe_tok(v, "some-future-model");
    assert_string_equal(rt_tokenizer_pre(t), "gpt2");
    assert_true(rt_tokenizer_pre_fallback(t));
    expect_ids(t, text, false, false, g2, 7);
    rt_tokenizer_free(t);
    vocab_free(v);
}

static void test_bpe_special(void **state)
{
    (void)state;
    vocab *v = bpe_vocab();
    rt_tokenizer *t = bpe_tok(v, "llama3");
    int32_t st = id(t, "<|im_start|>"), en = id(t, "<|im_end|>"), stx = id(t, "<|im_start|>x");
    const char *text = "<|im_start|>user\nHello<|im_end|><|im_start|>x";
    int32_t want[] = {st, 'u', 's', 'e', 'r', id(t, C), id(t, "Hello"), en, stx};
    /* "user" has no merges: four byte tokens; "\n" is Ċ */
    want[5] = vocab_find(v, C);
    expect_ids(t, text, false, true, want, 9);
    /* without parse_special control text is text; the user-defined
     * "<|im_start|>x" is still its token */
    int32_t got[128];
    int n = rt_tokenizer_encode(t, text, strlen(text), false, false, got, 128);
    assert_true(n > 9);
    for (int i = 0; i < n - 1; i++)
        assert_true(got[i] != st && got[i] != en && got[i] != stx);
    assert_int_equal(got[n - 1], stx);
    char buf[128];
    int m = rt_tokenizer_decode(t, got, n, false, buf, sizeof(buf));
    assert_int_equal(m, (int)strlen(text));
    assert_string_equal(buf, text);
    /* control pieces decode to nothing; user-defined ones to their text */
    m = rt_tokenizer_decode(t, want, 9, false, buf, sizeof(buf));
    assert_string_equal(buf, "user\nHello<|im_start|>x");
    assert_int_equal(m, 23);

    assert_true(rt_tokenizer_is_eog(t, id(t, "<|end_of_text|>")));
    assert_true(rt_tokenizer_is_eog(t, id(t, "<|eot_id|>")));
    assert_true(rt_tokenizer_is_eog(t, en));
    assert_false(rt_tokenizer_is_eog(t, st));
    rt_tokenizer_free(t);
    /* Llama 3 Instruct GGUFs name <|eot_id|> as EOS: <|end_of_text|> still
     * ends generation (llama.cpp's list). */
    char err[256];
    assert_int_equal(bpe_load_eos(v, "llama3", NULL, false, "<|eot_id|>", &t, err, sizeof(err)), 0);
    assert_int_equal(rt_tokenizer_eos(t), id(t, "<|eot_id|>"));
    assert_true(rt_tokenizer_is_eog(t, id(t, "<|end_of_text|>")));
    assert_false(rt_tokenizer_is_eog(t, id(t, "Hello")));
    assert_int_equal(rt_tokenizer_bos(t), id(t, "<|begin_of_text|>"));
    rt_tokenizer_free(t);
    vocab_free(v);
}

/* gpt-oss's harmony vocabulary, as llama.cpp reads it: <|return|> and
 * <|call|> end a turn, <|end|> does not; the markers' text goes out with
 * the answer (their piece); they stay control tokens, which a message's
 * text cannot write. */
static void test_harmony_tokens(void **state)
{
    (void)state;
    vocab *v = bpe_vocab();
    static const char *const marks[] = {"<|channel|>",   "<|message|>", "<|start|>", "<|end|>",
                                        "<|constrain|>", "<|return|>",  "<|call|>"};
    for (size_t i = 0; i < sizeof(marks) / sizeof(marks[0]); i++)
        vocab_add(v, marks[i], 0, 3);
    rt_tokenizer *t = bpe_tok(v, "llama3");
    assert_true(rt_tokenizer_is_eog(t, id(t, "<|return|>")));
    assert_true(rt_tokenizer_is_eog(t, id(t, "<|call|>")));
    assert_false(rt_tokenizer_is_eog(t, id(t, "<|end|>")));
    for (size_t i = 0; i < 5; i++) {
        size_t n = 0;
        const char *p = rt_tokenizer_piece(t, id(t, marks[i]), &n);
        assert_int_equal(n, strlen(marks[i]));
        assert_memory_equal(p, marks[i], n);
    }
    size_t n = 1;
    rt_tokenizer_piece(t, id(t, "<|im_start|>"), &n);
    assert_int_equal(n, 0);
    int32_t got[64];
    int k = rt_tokenizer_encode(t, "<|channel|>", 11, false, false, got, 64);
    for (int i = 0; i < k; i++)
        assert_true(got[i] != id(t, "<|channel|>"));
    rt_tokenizer_free(t);
    vocab_free(v);
}

/* Tool-call markers that files type as control ([TOOL_CALLS], Llama 3's
 * <|python_tag|>) give their text, for the tool-call parser; other control
 * tokens none; and a message's text still cannot write them. */
static void test_tool_marker_tokens(void **state)
{
    (void)state;
    vocab *v = bpe_vocab();
    vocab_add(v, "[TOOL_CALLS]", 0, 3);
    vocab_add(v, "<|python_tag|>", 0, 3);
    rt_tokenizer *t = bpe_tok(v, "llama3");
    static const char *const marks[] = {"[TOOL_CALLS]", "<|python_tag|>"};
    for (size_t i = 0; i < 2; i++) {
        size_t n = 0;
        const char *p = rt_tokenizer_piece(t, id(t, marks[i]), &n);
        assert_int_equal(n, strlen(marks[i]));
        assert_memory_equal(p, marks[i], n);
        int32_t got[64];
        int k = rt_tokenizer_encode(t, marks[i], (int)strlen(marks[i]), false, false, got, 64);
        for (int j = 0; j < k; j++)
            assert_true(got[j] != id(t, marks[i]));
    }
    size_t n = 1;
    rt_tokenizer_piece(t, id(t, "<|im_start|>"), &n);
    assert_int_equal(n, 0);
    rt_tokenizer_free(t);
    vocab_free(v);
}

/* User-defined tokens (Qwen3's <think>) are split out of any text, a
 * client's message included, as Hugging Face's tokenizers and llama.cpp
 * do: the model that wrote one reads it back as the one token. One that
 * ends or opens a turn, typed user-defined by a careless conversion, is
 * read as control: a message cannot forge a turn with it. */
static void test_user_tokens(void **state)
{
    (void)state;
    vocab *v = bpe_vocab();
    vocab_add(v, "<think>", 0, 4);
    v->type[vocab_find(v, "<|im_start|>")] = 4;
    v->type[vocab_find(v, "<|im_end|>")] = 4;
    rt_tokenizer *t = bpe_tok(v, "llama3");
    const int32_t think = id(t, "<think>"), st = id(t, "<|im_start|>"), en = id(t, "<|im_end|>");
    const char *text = "a<think>b<|im_start|>c<|im_end|>";
    const size_t len = strlen(text);
    int32_t got[128], spans[128];
    int n = rt_tokenizer_encode(t, text, len, false, false, got, 128);
    rt_text_span whole = {0, len}, part = {0, 5}; /* "a<thi": <think> reaches out of it */
    assert_int_equal(rt_tokenizer_encode_spans(t, text, len, false, &whole, 1, spans, 128), n);
    assert_memory_equal(spans, got, (size_t)n * sizeof(int32_t));
    int found = 0;
    for (int i = 0; i < n; i++) {
        found += got[i] == think;
        assert_true(got[i] != st && got[i] != en);
    }
    assert_int_equal(found, 1);
    assert_int_equal(got[1], think);
    int m = rt_tokenizer_encode_spans(t, text, len, false, &part, 1, spans, 128);
    for (int i = 0; i < m; i++)
        assert_true(spans[i] != think);
    /* with parse_special, both turn tokens; the end one still ends
     * generation, and as control decodes to nothing */
    n = rt_tokenizer_encode(t, text, len, false, true, got, 128);
    assert_int_equal(got[n - 1], en);
    assert_true(rt_tokenizer_is_eog(t, en));
    char buf[64];
    assert_int_equal(rt_tokenizer_decode(t, &en, 1, false, buf, sizeof(buf)), 0);
    assert_int_equal(rt_tokenizer_decode(t, &think, 1, false, buf, sizeof(buf)), 7);
    rt_tokenizer_free(t);
    vocab_free(v);
}

/* A special token past 256 bytes is not matched in text (a hostile one of
 * 200 KB made a prompt of its first byte quadratic to encode); one of 256
 * is. Both still decode. */
static void test_long_special_not_matched(void **state)
{
    (void)state;
    vocab *v = bpe_vocab();
    char at_max[257], past[258];
    memset(at_max, 'b', 256);
    memset(past, 'c', 257);
    at_max[0] = past[0] = '<';
    at_max[255] = past[256] = '>';
    at_max[256] = past[257] = '\0';
    vocab_add(v, at_max, 0, 3);
    vocab_add(v, past, 0, 4);
    rt_tokenizer *t = bpe_tok(v, "llama3");
    int32_t got[1024];
    int n = rt_tokenizer_encode(t, at_max, strlen(at_max), false, true, got, 1024);
    assert_int_equal(n, 1);
    assert_int_equal(got[0], id(t, at_max));
    n = rt_tokenizer_encode(t, past, strlen(past), false, true, got, 1024);
    assert_true(n > 1);
    for (int i = 0; i < n; i++)
        assert_true(got[i] != id(t, past));
    int32_t one = id(t, past);
    char buf[300];
    assert_int_equal(rt_tokenizer_decode(t, &one, 1, false, buf, sizeof(buf)), 257);
    /* what a chat template may write as text and have read back as the token */
    assert_true(rt_tokenizer_text_is_token(t, id(t, at_max)));
    assert_true(rt_tokenizer_text_is_token(t, id(t, "<|begin_of_text|>")));
    assert_false(rt_tokenizer_text_is_token(t, one));
    assert_false(rt_tokenizer_text_is_token(t, id(t, "Hello")));
    assert_false(rt_tokenizer_text_is_token(t, -1));
    rt_tokenizer_free(t);
    vocab_free(v);
}

/* Special tokens are matched outside the plain spans only: not inside
 * one, not reaching into one (the longest match gives way to a shorter). */
static void test_plain_spans(void **state)
{
    (void)state;
    vocab *v = bpe_vocab();
    rt_tokenizer *t = bpe_tok(v, "llama3");
    int32_t st = id(t, "<|im_start|>"), en = id(t, "<|im_end|>"), stx = id(t, "<|im_start|>x");
    const char *text = "<|im_start|>user\nHello<|im_end|><|im_start|>x";
    size_t len = strlen(text);
    assert_int_equal(len, 45);
    int32_t all[64], got[64];
    int n_all = rt_tokenizer_encode(t, text, len, false, true, all, 64);
    /* No spans: as parse_special. */
    assert_int_equal(rt_tokenizer_encode_spans(t, text, len, false, NULL, 0, got, 64), n_all);
    assert_memory_equal(got, all, (size_t)n_all * sizeof(int32_t));

    /* "Hello<|im_end|>" plain; the other two specials still count. */
    rt_text_span hello[] = {{17, 15}};
    int n = rt_tokenizer_encode_spans(t, text, len, false, hello, 1, got, 64);
    assert_true(n > n_all);
    assert_int_equal(got[0], st);
    assert_int_equal(got[n - 1], stx);
    for (int i = 0; i < n; i++)
        assert_true(got[i] != en);
    char buf[128];
    assert_int_equal(rt_tokenizer_decode(t, got, n, false, buf, sizeof(buf)),
                     (int)strlen("user\nHello<|im_end|><|im_start|>x"));
    assert_string_equal(buf, "user\nHello<|im_end|><|im_start|>x");

    /* A span over part of a special token, or an empty span before one,
     * and a span at the last byte: "<|im_start|>x" gives way to "<|im_start|>". */
    rt_text_span part[] = {{0, 0}, {25, 1}, {44, 1}};
    n = rt_tokenizer_encode_spans(t, text, len, false, part, 3, got, 64);
    assert_int_equal(got[0], st);
    for (int i = 0; i < n; i++)
        assert_true(got[i] != en && got[i] != stx);
    assert_int_equal(got[n - 2], st);
    assert_int_equal(got[n - 1], 'x');

    /* The whole text plain: as without parse_special. */
    rt_text_span whole = {0, len};
    n_all = rt_tokenizer_encode(t, text, len, false, false, all, 64);
    assert_int_equal(rt_tokenizer_encode_spans(t, text, len, false, &whole, 1, got, 64), n_all);
    assert_memory_equal(got, all, (size_t)n_all * sizeof(int32_t));

    /* Spans out of order, overlapping or past the end. */
    rt_text_span bad1[] = {{20, 2}, {10, 2}}, bad2[] = {{10, 5}, {12, 2}}, bad3[] = {{40, 6}};
    assert_int_equal(rt_tokenizer_encode_spans(t, text, len, false, bad1, 2, got, 64), -EINVAL);
    assert_int_equal(rt_tokenizer_encode_spans(t, text, len, false, bad2, 2, got, 64), -EINVAL);
    assert_int_equal(rt_tokenizer_encode_spans(t, text, len, false, bad3, 1, got, 64), -EINVAL);
    rt_tokenizer_free(t);
    vocab_free(v);
}

/* Naive BPE on one word: the lowest-ranked adjacent pair, leftmost on ties. */
static int bpe_reference(const vocab *v, const char *word, int32_t *out)
{
    static char sym[256][64];
    int ns = 0;
    for (const char *p = word; *p; p++) {
        sym[ns][0] = *p;
        sym[ns][1] = '\0';
        ns++;
    }
    for (;;) {
        int best = -1, br = 0;
        for (int i = 0; i + 1 < ns; i++) {
            char mm[2 * sizeof(sym[0]) + 2];
            size_t a = strlen(sym[i]), b = strlen(sym[i + 1]);
            memcpy(mm, sym[i], a);
            mm[a] = ' ';
            memcpy(mm + a + 1, sym[i + 1], b + 1);
            for (int r = 0; r < v->n_merges; r++)
                if (strcmp(v->merge[r], mm) == 0) {
                    if (best < 0 || r < br) {
                        best = i;
                        br = r;
                    }
                    break;
                }
        }
        if (best < 0)
            break;
        size_t a = strlen(sym[best]), b = strlen(sym[best + 1]);
        assert_true(a + b < sizeof(sym[0]));
        memcpy(sym[best] + a, sym[best + 1], b + 1);
        memmove(sym + best + 1, sym + best + 2, (size_t)(ns - best - 2) * sizeof(sym[0]));
        ns--;
    }
    for (int i = 0; i < ns; i++)
        out[i] = vocab_find(v, sym[i]);
    return ns;
}

static void test_bpe_reference_and_roundtrip(void **state)
{
    (void)state;
    vocab *v = bpe_vocab();
    rt_tokenizer *t = bpe_tok(v, "gpt-2");
    rng_state = 1234;
    for (int iter = 0; iter < 400; iter++) {
        char word[64];
        int n = 1 + (int)(rnd() % 40);
        for (int i = 0; i < n; i++)
            word[i] = "abc"[rnd() % 3];
        word[n] = '\0';
        int32_t want[64], got[64];
        int nw = bpe_reference(v, word, want);
        int ng = rt_tokenizer_encode(t, word, (size_t)n, false, false, got, 64);
        assert_int_equal(ng, nw);
        assert_memory_equal(got, want, (size_t)ng * sizeof(int32_t));
    }
    rt_tokenizer_free(t);

    static const char *pres[] = {"llama3", "qwen2", "gpt-2", "starcoder", "tekken", "gpt-4o"};
    static const uint32_t ranges[][2] = {{0x20, 0x7E},       {0x09, 0x0D},     {0xA0, 0x17F},
                                         {0x370, 0x3FF},     {0x4E00, 0x4FFF}, {0x3000, 0x3000},
                                         {0x1F600, 0x1F64F}, {0x660, 0x669}};
    for (size_t p = 0; p < sizeof(pres) / sizeof(pres[0]); p++) {
        t = bpe_tok(v, pres[p]);
        rng_state = 99 + p;
        for (int iter = 0; iter < 300; iter++) {
            char text[512];
            size_t n = 0;
            int chars = (int)(rnd() % 60);
            for (int k = 0; k < chars; k++) {
                uint32_t r = rnd() % 20;
                if (r == 0) { /* a raw byte: invalid UTF-8 most of the time */
                    text[n++] = (char)(rnd() % 256);
                    continue;
                }
                const uint32_t *rg = ranges[r < 12 ? 0 : r % 8];
                uint32_t cp = rg[0] + rnd() % (rg[1] - rg[0] + 1);
                if (cp < 0x80) {
                    text[n++] = (char)cp;
                } else if (cp < 0x800) {
                    text[n++] = (char)(0xC0 | (cp >> 6));
                    text[n++] = (char)(0x80 | (cp & 0x3F));
                } else if (cp < 0x10000) {
                    text[n++] = (char)(0xE0 | (cp >> 12));
                    text[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                    text[n++] = (char)(0x80 | (cp & 0x3F));
                } else {
                    text[n++] = (char)(0xF0 | (cp >> 18));
                    text[n++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                    text[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                    text[n++] = (char)(0x80 | (cp & 0x3F));
                }
            }
            int m;
            char *out = roundtrip(t, text, n, false, &m);
            assert_int_equal(m, (int)n);
            assert_memory_equal(out, text, n);
            free(out);
        }
        /* long runs: whitespace, digits, letters */
        size_t big = 100000;
        char *text = malloc(big);
        for (size_t i = 0; i < big; i++)
            text[i] = i < big / 3 ? ' ' : i < 2 * big / 3 ? '7' : 'a';
        int m;
        char *out = roundtrip(t, text, big, false, &m);
        assert_int_equal(m, (int)big);
        assert_memory_equal(out, text, big);
        free(out);
        free(text);
        rt_tokenizer_free(t);
    }
    vocab_free(v);
}

static void expect_load_error(int rc, const char *err, const char *key)
{
    assert_int_equal(rc, -EINVAL);
    if (!strstr(err, key))
        fail_msg("error '%s' does not name %s", err, key);
}

static void test_bad_metadata(void **state)
{
    (void)state;
    vocab *v = spm_vocab();
    rt_tokenizer *t = NULL;
    char err[256];
    expect_load_error(spm_load(v, SPM_NO_TOKENS, &t, err, sizeof(err)), err, "tokenizer.ggml.tokens");
    assert_null(t);
    expect_load_error(spm_load(v, SPM_INT_TOKENS, &t, err, sizeof(err)), err, "tokenizer.ggml.tokens");
    expect_load_error(spm_load(v, SPM_BAD_SCORES, &t, err, sizeof(err)), err, "tokenizer.ggml.scores");
    expect_load_error(spm_load(v, SPM_BAD_BOS, &t, err, sizeof(err)), err, "tokenizer.ggml.bos_token_id");
    expect_load_error(spm_load(v, SPM_BAD_EOS, &t, err, sizeof(err)), err, "tokenizer.ggml.eos_token_id");
    expect_load_error(spm_load(v, SPM_BAD_TYPE, &t, err, sizeof(err)), err, "tokenizer.ggml.token_type");
    expect_load_error(spm_load(v, SPM_NO_MODEL, &t, err, sizeof(err)), err, "tokenizer.ggml.model");
    expect_load_error(spm_load(v, SPM_BERT, &t, err, sizeof(err)), err, "tokenizer.ggml.model");
    assert_null(t);
    vocab_free(v);

    v = bpe_vocab();
    expect_load_error(bpe_load(v, "llama3", NULL, true, &t, err, sizeof(err)), err, "tokenizer.ggml.merges");
    /* merges naming pieces the vocabulary lacks are skipped and counted */
    assert_int_equal(bpe_load(v, "llama3", "q QQQ", false, &t, err, sizeof(err)), 0);
    assert_int_equal(rt_tokenizer_merges_skipped(t), 2);
    rt_tokenizer_free(t);
    vocab_free(v);
}

/* A tokenizer is the same with or without the file around it, and a large
 * vocabulary goes through the hash table without collisions going wrong. */
static void test_large_vocab(void **state)
{
    (void)state;
    int n = 150000;
    char **tok = malloc((size_t)n * sizeof(char *));
    for (int b = 0; b < 256; b++) {
        char s[4];
        bpe_utf8((uint8_t)b, s);
        tok[b] = strdup(s);
    }
    for (int i = 256; i < n; i++) {
        char s[32];
        snprintf(s, sizeof(s), G "w%dx", i);
        tok[i] = strdup(s);
    }
    rt_gguf_writer *w = rt_gguf_writer_new();
    assert_int_equal(rt_gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2"), 0);
    assert_int_equal(rt_gguf_writer_add_str(w, "tokenizer.ggml.pre", "qwen2"), 0);
    assert_int_equal(
        rt_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tok, (uint64_t)n), 0);
    const char *merges[] = {G " w"};
    assert_int_equal(rt_gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", merges, 1), 0);
    rt_tokenizer *t;
    char err[256];
    int rc = load_writer(w, &t, err, sizeof(err));
    if (rc != 0)
        fail_msg("load: %s", err);
    for (int i = 0; i < n; i += 997)
        assert_int_equal(rt_tokenizer_find(t, tok[i]), i);
    for (int i = 0; i < n; i++)
        free(tok[i]);
    free(tok);
    rt_tokenizer_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spm_known),         cmocka_unit_test(test_spm_reference_and_roundtrip),
        cmocka_unit_test(test_bpe_pretokenizers), cmocka_unit_test(test_bpe_special),
        cmocka_unit_test(test_user_tokens),       cmocka_unit_test(test_long_special_not_matched),
        cmocka_unit_test(test_plain_spans),       cmocka_unit_test(test_bpe_reference_and_roundtrip),
        cmocka_unit_test(test_bad_metadata),      cmocka_unit_test(test_large_vocab),
        cmocka_unit_test(test_harmony_tokens),
        cmocka_unit_test(test_tool_marker_tokens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
