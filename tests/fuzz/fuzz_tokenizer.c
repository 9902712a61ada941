/* libFuzzer target for the tokenizer: arbitrary bytes are encoded with a
 * SentencePiece vocabulary and with byte-level BPE vocabularies (llama3,
 * qwen2 and starcoder pre-tokenizers), with and without parse_special, and
 * decoded again. The vocabularies are written once with rt_gguf_writer and
 * opened from memory with rt_gguf_open_mem.
 *
 * Invariants (abort on violation):
 *  - encode never fails on any input, every id is in range, and the count is
 *    the same whether or not the output buffer was big enough;
 *  - without parse_special, decode(encode(x)) == x: always for BPE; for
 *    SentencePiece (stripping the prefix space) when x has no U+2581;
 *  - with parse_special, for BPE, the pieces with control tokens replaced by
 *    their text concatenate to x;
 *  - with plain spans (drawn from the input's first bytes), for BPE, the
 *    same holds and no control token's text overlaps a span; with no spans
 *    the ids are those of parse_special. */
#define _GNU_SOURCE /* memmem */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/gguf.h"
#include "runtime/tokenizer.h"

#define SP "\xe2\x96\x81"
#define N_TOK 4

static rt_tokenizer *g_tok[N_TOK];

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

static rt_tokenizer *spm(void)
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
        rt_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2))
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
    g_tok[0] = spm();
    g_tok[1] = bpe("llama3");
    g_tok[2] = bpe("qwen2");
    g_tok[3] = bpe("starcoder");
    return 0;
}

static void check(const rt_tokenizer *t, const uint8_t *data, size_t size, bool special)
{
    const char *text = (const char *)data;
    int n = rt_tokenizer_encode(t, text, size, false, special, NULL, 0);
    if (n < 0)
        die("encode", "failed");
    int32_t *ids = malloc(((size_t)n + 1) * sizeof(int32_t));
    int n2 = rt_tokenizer_encode(t, text, size, true, special, ids, n + 1);
    int bos = rt_tokenizer_bos(t) >= 0;
    if (n2 != n + bos)
        die("encode", "count changes with the buffer or add_bos");
    int32_t *body = ids + bos;
    int32_t nv = rt_tokenizer_n_vocab(t);
    for (int i = 0; i < n; i++)
        if (body[i] < 0 || body[i] >= nv)
            die("encode", "id out of range");
    size_t cap = 4 * size + 64;
    char *out = malloc(cap);
    bool spm = rt_tokenizer_kind(t) == RT_TOK_SPM;
    if (!special) {
        int m = rt_tokenizer_decode(t, body, n, true, out, cap);
        if (m < 0 || (size_t)m >= cap)
            die("decode", "failed");
        bool exact = !spm || !memmem(text, size, SP, 3);
        if (exact && ((size_t)m != size || memcmp(out, text, size) != 0))
            die("round trip", spm ? "spm" : "bpe");
    } else if (!spm) {
        size_t o = 0;
        for (int i = 0; i < n; i++) {
            size_t k = 0;
            const char *piece = rt_tokenizer_piece(t, body[i], &k);
            if (!piece || k > cap - o)
                die("piece", "failed");
            memcpy(out + o, piece, k);
            if (k == 0) { /* control: its text was in the input */
                const char *s = rt_tokenizer_token_text(t, body[i]);
                size_t sl = strlen(s);
                if (sl > cap - o)
                    die("piece", "overflow");
                memcpy(out + o, s, sl);
                k = sl;
            }
            o += k;
        }
        if (o != size || memcmp(out, text, size) != 0)
            die("round trip", "bpe with specials");
    }
    free(out);
    free(ids);
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

static void check_spans(const rt_tokenizer *t, const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    rt_text_span sp[4];
    int n_sp = draw_spans(data, size, sp);
    int n = rt_tokenizer_encode_spans(t, text, size, false, sp, n_sp, NULL, 0);
    if (n < 0)
        die("encode_spans", "failed");
    int32_t *ids = malloc(((size_t)n + 1) * sizeof(int32_t));
    if (rt_tokenizer_encode_spans(t, text, size, false, sp, n_sp, ids, n + 1) != n)
        die("encode_spans", "count changes with the buffer");
    if (n_sp == 0) {
        int32_t *ref = malloc(((size_t)n + 1) * sizeof(int32_t));
        if (rt_tokenizer_encode(t, text, size, false, true, ref, n + 1) != n ||
            memcmp(ref, ids, (size_t)n * sizeof(int32_t)))
            die("encode_spans", "no spans differs from parse_special");
        free(ref);
    }
    if (rt_tokenizer_kind(t) == RT_TOK_BPE) {
        size_t o = 0;
        for (int i = 0; i < n; i++) {
            size_t k = 0;
            const char *piece = rt_tokenizer_piece(t, ids[i], &k);
            if (!piece)
                die("piece", "failed");
            if (k == 0) {
                piece = rt_tokenizer_token_text(t, ids[i]);
                k = strlen(piece);
                if (overlaps(sp, n_sp, o, k))
                    die("encode_spans", "a special token overlaps a plain span");
            }
            if (k > size - o || memcmp(text + o, piece, k))
                die("round trip", "bpe with plain spans");
            o += k;
        }
        if (o != size)
            die("round trip", "bpe with plain spans: short");
    }
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096)
        return 0;
    for (int k = 0; k < N_TOK; k++) {
        check(g_tok[k], data, size, false);
        check(g_tok[k], data, size, true);
        check_spans(g_tok[k], data, size);
    }
    return 0;
}
