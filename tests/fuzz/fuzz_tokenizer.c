/* libFuzzer target for the tokenizer: arbitrary bytes are encoded with a
 * SentencePiece vocabulary (with the space prefix, and without it as Gemma's,
 * whose user-defined "\n\n" and runs of spaces are split out of any text)
 * and with byte-level BPE vocabularies (llama3,
 * qwen2 and starcoder pre-tokenizers), without parse_special, with it, and
 * with plain spans, and decoded again. The vocabularies are written once,
 * in LLVMFuzzerInitialize, with rt_gguf_writer and opened from memory with
 * rt_gguf_open_mem.
 *
 * Invariants (abort on violation):
 *  - encode never fails on any input and every id is in range; for one of
 *    the three encodings of each input (by its length), the count is the
 *    same with a buffer that holds half the ids, without BOS, and those are
 *    the first ids;
 *  - without parse_special, decode(encode(x)) == x: always for BPE; for
 *    SentencePiece (stripping the prefix space) when x has no U+2581;
 *  - with parse_special, for BPE, the pieces with control tokens replaced by
 *    their text concatenate to x;
 *  - with plain spans (drawn from the input's first bytes), for BPE, the
 *    same holds and no control token's text overlaps a span; with no spans
 *    the ids are those of parse_special.
 * Each encoding is one call (the short-buffer count a second one for one
 * of them), and ASan keeps a small quarantine: an input's frees are far
 * below it, and the default 256 MB put every allocation on fresh pages. */
#define _GNU_SOURCE /* memmem */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/gguf.h"
#include "runtime/tokenizer.h"

#define SP "\xe2\x96\x81"
#define N_TOK 5

static rt_tokenizer *g_tok[N_TOK];

/* An input frees a few MB at most (4 KB of text), so a use after free
 * within its run stays within the quarantine; ASAN_OPTIONS overrides. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "quarantine_size_mb=32";
}

static void die(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_tokenizer: %s: %s\n", what, detail);
    abort();
}

/* Writes w to a temp file, reads it back into memory and opens that. */
static rt_tokenizer *load(rt_gguf_writer *w)
{
    char path[] = "/tmp/infergate-fuzz-tok-XXXXXX";
    char err[256] = "";
    int fd = mkstemp(path);
    if (fd < 0)
        die("mkstemp", path);
    close(fd);
    if (rt_gguf_writer_write(w, path, err, sizeof(err)) != 0)
        die("write", err);
    rt_gguf_writer_free(w);
    FILE *f = fopen(path, "rb");
    if (!f)
        die("fopen", path);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc((size_t)size);
    if (!buf || fread(buf, 1, (size_t)size, f) != (size_t)size)
        die("read", path);
    fclose(f);
    unlink(path);
    rt_gguf *g = NULL;
    if (rt_gguf_open_mem(buf, (size_t)size, &g, err, sizeof(err)) != 0)
        die("open_mem", err);
    rt_tokenizer *t = NULL;
    if (rt_tokenizer_load(g, &t, err, sizeof(err)) != 0)
        die("load", err);
    rt_gguf_free(g);
    free(buf);
    return t;
}

typedef struct list {
    char *s[2048];
    float score[2048];
    int32_t type[2048];
    int n;
    char *merge[1024];
    int n_merges;
} list;

static void add(list *l, const char *s, float score, int32_t type)
{
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->s[i], s) == 0)
            return;
    l->s[l->n] = strdup(s);
    l->score[l->n] = score;
    l->type[l->n] = type;
    l->n++;
}

static void list_free(list *l)
{
    for (int i = 0; i < l->n; i++)
        free(l->s[i]);
    for (int i = 0; i < l->n_merges; i++)
        free(l->merge[i]);
    free(l);
}

static const char *const k_specials[] = {"<|im_start|>", "<|im_end|>", "<|eot_id|>", "<|begin_of_text|>",
                                         "<|im"};

static rt_tokenizer *spm(bool gemma)
{
    list *l = calloc(1, sizeof(*l));
    add(l, "<unk>", 0, 2);
    add(l, "<s>", 0, 3);
    add(l, "</s>", 0, 3);
    char buf[16];
    for (int b = 0; b < 256; b++) {
        snprintf(buf, sizeof(buf), "<0x%02X>", b);
        add(l, buf, 0, 6);
    }
    add(l, SP, -1, 1);
    add(l, SP SP, -2, 1);
    add(l, "<|user|>", 0, 4);
    if (gemma) {
        add(l, "\n\n", 0, 4);
        add(l, "  ", 0, 4);
        add(l, "   ", 0, 4);
    }
    for (size_t i = 0; i < sizeof(k_specials) / sizeof(k_specials[0]); i++)
        add(l, k_specials[i], 0, 3);
    uint64_t r = 1;
    for (int i = 0; i < 26; i++) {
        snprintf(buf, sizeof(buf), "%c", 'a' + i);
        add(l, buf, -100, 1);
        snprintf(buf, sizeof(buf), SP "%c", 'a' + i);
        add(l, buf, -50 - i, 1);
    }
    add(l, "\xc3\xa9", -90, 1);
    while (l->n < 1200) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        int len = 2 + (int)((r >> 60) % 4);
        int o = 0;
        if ((r >> 40) & 1) {
            memcpy(buf, SP, 3);
            o = 3;
        }
        for (int k = 0; k < len; k++)
            buf[o + k] = (char)('a' + ((r >> (5 * k + 3)) % 6)); /* a..f: many overlaps */
        buf[o + len] = '\0';
        add(l, buf, -(float)((r >> 20) % 1000) / 10.0f, 1);
    }
    rt_gguf_writer *w = rt_gguf_writer_new();
    if (!w || rt_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama") ||
        rt_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)l->s, (uint64_t)l->n) ||
        rt_gguf_writer_add_arr_f32(w, "tokenizer.ggml.scores", l->score, (uint64_t)l->n) ||
        rt_gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", l->type, (uint64_t)l->n) ||
        rt_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1) ||
        rt_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2) ||
        (gemma && rt_gguf_writer_add_bool(w, "tokenizer.ggml.add_space_prefix", false)))
        die("writer", "spm");
    list_free(l);
    return load(w);
}

static void byte_char(uint8_t b, char *out)
{
    uint32_t cp = b;
    if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) {
        uint32_t n = 0;
        for (int k = 0; k < b; k++)
            if (!((k >= 0x21 && k <= 0x7E) || (k >= 0xA1 && k <= 0xAC) || k >= 0xAE))
                n++;
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = '\0';
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = '\0';
    }
}

static rt_tokenizer *bpe(const char *pre)
{
    list *l = calloc(1, sizeof(*l));
    char a[8], b[8], m[32], cat[32];
    for (int i = 0; i < 256; i++) {
        byte_char((uint8_t)i, a);
        add(l, a, 0, 1);
    }
    /* merges over a few bytes, growing pieces from earlier results */
    static const uint8_t seed_bytes[] = {' ', 'a', 'b', 'c', '1', '2', '\n', 0xC3, 0xA9, 0xE4, '!'};
    uint64_t r = 3;
    int base = l->n;
    for (size_t i = 0; i < sizeof(seed_bytes); i++)
        for (size_t j = 0; j < sizeof(seed_bytes); j++) {
            byte_char(seed_bytes[i], a);
            byte_char(seed_bytes[j], b);
            snprintf(m, sizeof(m), "%s %s", a, b);
            snprintf(cat, sizeof(cat), "%s%s", a, b);
            l->merge[l->n_merges++] = strdup(m);
            add(l, cat, 0, 1);
        }
    while (l->n_merges < 600) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        const char *x = l->s[base + (int)((r >> 33) % (uint64_t)(l->n - base))];
        const char *y = l->s[base + (int)((r >> 13) % (uint64_t)(l->n - base))];
        if (strlen(x) + strlen(y) > 12)
            continue;
        snprintf(m, sizeof(m), "%s %s", x, y);
        snprintf(cat, sizeof(cat), "%s%s", x, y);
        l->merge[l->n_merges++] = strdup(m);
        add(l, cat, 0, 1);
    }
    for (size_t i = 0; i < sizeof(k_specials) / sizeof(k_specials[0]); i++)
        add(l, k_specials[i], 0, 3);
    add(l, "<tool>", 0, 4);
    add(l, "zzz", 0, 1); /* only reachable by ignore_merges */
    rt_gguf_writer *w = rt_gguf_writer_new();
    if (!w || rt_gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2") ||
        rt_gguf_writer_add_str(w, "tokenizer.ggml.pre", pre) ||
        rt_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)l->s, (uint64_t)l->n) ||
        rt_gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", l->type, (uint64_t)l->n) ||
        rt_gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", (const char *const *)l->merge,
                                   (uint64_t)l->n_merges))
        die("writer", "bpe");
    list_free(l);
    return load(w);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    g_tok[0] = spm(false);
    g_tok[1] = bpe("llama3");
    g_tok[2] = bpe("qwen2");
    g_tok[3] = bpe("starcoder");
    g_tok[4] = spm(true);
    return 0;
}

static bool overlaps(const rt_text_span *sp, int n, size_t off, size_t len)
{
    for (int i = 0; i < n; i++)
        if (sp[i].len && off < sp[i].off + sp[i].len && sp[i].off < off + len)
            return true;
    return false;
}

/* Up to 4 spans in order, their gaps and lengths from the first bytes. */
static int draw_spans(const uint8_t *data, size_t size, rt_text_span *sp)
{
    int n = 0;
    size_t at = 0;
    for (size_t i = 0; i + 1 < size && i < 8 && n < 4; i += 2) {
        size_t off = at + data[i] % 16, len = data[i + 1] % 16;
        if (off > size || len > size - off)
            break;
        sp[n++] = (rt_text_span){off, len};
        at = off + len;
    }
    return n;
}

enum mode { PLAIN, SPECIAL, SPANS };

static int encode_as(const rt_tokenizer *t, const uint8_t *data, size_t size, enum mode m, bool add_bos,
                     const rt_text_span *sp, int n_sp, int32_t *out, int max_out)
{
    const char *text = (const char *)data;
    if (m == SPANS)
        return rt_tokenizer_encode_spans(t, text, size, add_bos, sp, n_sp, out, max_out);
    return rt_tokenizer_encode(t, text, size, add_bos, m == SPECIAL, out, max_out);
}

/* One encoding with BOS, its ids in range; *n gets their count without the
 * BOS, and the ids (BOS first where the vocabulary has one) are returned,
 * malloc'ed. One call into room for 4 ids a byte (the encoder's bound),
 * again only past it. With recount, the text is encoded again without BOS
 * into an exact-size buffer that holds half the ids: the count must be the
 * same, the ids written the first ones, and a write past the buffer is
 * ASan's to see. */
static int32_t *encode(const rt_tokenizer *t, const uint8_t *data, size_t size, enum mode m,
                       const rt_text_span *sp, int n_sp, bool recount, int *n)
{
    int bos = rt_tokenizer_bos(t) >= 0, cap = 4 * (int)size + 1;
    int32_t *ids = malloc((size_t)cap * sizeof(int32_t));
    int got = encode_as(t, data, size, m, true, sp, n_sp, ids, cap);
    if (got > cap) {
        free(ids);
        cap = got;
        ids = malloc((size_t)cap * sizeof(int32_t));
        if (encode_as(t, data, size, m, true, sp, n_sp, ids, cap) != got)
            die("encode", "count changes with the buffer");
    }
    if (got < bos)
        die("encode", "failed");
    *n = got - bos;
    int32_t nv = rt_tokenizer_n_vocab(t);
    for (int i = 0; i < got; i++)
        if (ids[i] < 0 || ids[i] >= nv)
            die("encode", "id out of range");
    if (recount) {
        int half = *n / 2;
        int32_t *part = half ? malloc((size_t)half * sizeof(int32_t)) : NULL;
        if (encode_as(t, data, size, m, false, sp, n_sp, part, half) != *n)
            die("encode", "count changes with the buffer or add_bos");
        if (half && memcmp(part, ids + bos, (size_t)half * sizeof(int32_t)))
            die("encode", "a short buffer gets other ids");
        free(part);
    }
    return ids;
}

/* Without parse_special: the round trip through decode. */
static void check_plain(const rt_tokenizer *t, const uint8_t *data, size_t size, bool recount)
{
    int n;
    int32_t *ids = encode(t, data, size, PLAIN, NULL, 0, recount, &n), *body = ids + (rt_tokenizer_bos(t) >= 0);
    size_t cap = 4 * size + 64;
    char *out = malloc(cap);
    bool spm = rt_tokenizer_kind(t) == RT_TOK_SPM;
    int m = rt_tokenizer_decode(t, body, n, true, out, cap);
    if (m < 0 || (size_t)m >= cap)
        die("decode", "failed");
    bool exact = !spm || !memmem(data, size, SP, 3);
    if (exact && ((size_t)m != size || memcmp(out, data, size) != 0))
        die("round trip", spm ? "spm" : "bpe");
    free(out);
    free(ids);
}

/* The pieces of a BPE encoding, control tokens replaced by their text, are
 * the text; none of those overlaps a plain span. */
static void check_pieces(const rt_tokenizer *t, const uint8_t *data, size_t size, const int32_t *ids, int n,
                         const rt_text_span *sp, int n_sp)
{
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        size_t k = 0;
        const char *piece = rt_tokenizer_piece(t, ids[i], &k);
        if (!piece)
            die("piece", "failed");
        if (k == 0) { /* control: its text was in the input */
            piece = rt_tokenizer_token_text(t, ids[i]);
            k = strlen(piece);
            if (overlaps(sp, n_sp, o, k))
                die("encode_spans", "a special token overlaps a plain span");
        }
        if (k > size - o || memcmp(data + o, piece, k))
            die("round trip", n_sp ? "bpe with plain spans" : "bpe with specials");
        o += k;
    }
    if (o != size)
        die("round trip", "bpe pieces short of the text");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096)
        return 0;
    /* which of the three encodings is also counted with a short buffer */
    int recount = (int)(size % 3);
    rt_text_span sp[4];
    int n_sp = draw_spans(data, size, sp);
    for (int k = 0; k < N_TOK; k++) {
        const rt_tokenizer *t = g_tok[k];
        int bos = rt_tokenizer_bos(t) >= 0, n_special, n_spans;
        bool bpe = rt_tokenizer_kind(t) == RT_TOK_BPE;
        check_plain(t, data, size, recount == 0);
        int32_t *special = encode(t, data, size, SPECIAL, NULL, 0, recount == 1, &n_special);
        if (bpe)
            check_pieces(t, data, size, special + bos, n_special, NULL, 0);
        int32_t *spans = encode(t, data, size, SPANS, sp, n_sp, recount == 2, &n_spans);
        if (n_sp == 0 &&
            (n_spans != n_special || memcmp(spans, special, (size_t)(n_special + bos) * sizeof(int32_t))))
            die("encode_spans", "no spans differs from parse_special");
        if (bpe)
            check_pieces(t, data, size, spans + bos, n_spans, sp, n_sp);
        free(spans);
        free(special);
    }
    return 0;
}
