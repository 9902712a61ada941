/* Tokenizer: SentencePiece-style ("llama") and byte-level BPE ("gpt2")
 * encoders and decoders built from a GGUF file's `tokenizer.ggml.*` keys.
 *
 * Both encoders follow llama.cpp (llm_tokenizer_spm, llm_tokenizer_bpe) so a
 * prompt gets the ids the model was trained on. The merge loops run on a
 * binary heap of candidate pairs, so a long input costs O(n log n). Everything
 * the tokenizer needs is copied out of the GGUF at load time: the tokenizer
 * outlives the file it came from. Encode and decode only read the tokenizer,
 * so one tokenizer serves many threads; each call allocates its own scratch. */
#define PCRE2_CODE_UNIT_WIDTH 8

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pcre2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/gguf.h"
#include "runtime/hash.h"
#include "runtime/tokenizer.h"

/* tokenizer.ggml.token_type values (llama.cpp's llama_token_type). */
enum {
    TT_UNDEFINED = 0,
    TT_NORMAL = 1,
    TT_UNKNOWN = 2,
    TT_CONTROL = 3,
    TT_USER = 4,
    TT_UNUSED = 5,
    TT_BYTE = 6,
};

#define MAX_EOG 16
#define MAX_PRE_STAGES 2
#define SPM_SPACE "\xe2\x96\x81" /* U+2581, SentencePiece's visible space */

/* Trie of special-token texts: longest match at a position in one walk.
 * A node's children are found through one hash of (parent, byte) edges:
 * searched one by one, up to 256 siblings a step let a hostile vocabulary
 * make each position of a text cost 255 x 255 steps. */
typedef struct trie_node {
    int32_t tok;
} trie_node;

typedef struct trie_edge {
    int32_t parent, child; /* child -1: a free slot */
    uint8_t byte;
} trie_edge;

struct rt_tokenizer {
    rt_tok_kind kind;
    int32_t n_vocab;
    char *text;       /* every token text, each NUL-terminated */
    size_t *text_off; /* n_vocab + 1 */
    char *piece;      /* decoded bytes of every token */
    size_t *piece_off;
    float *scores;
    uint8_t *types;
    size_t max_len; /* longest token a merge may produce */

    int32_t *ht; /* open addressing: text -> id */
    size_t ht_mask;
    uint64_t ht_key; /* rt_hash_key(), for both tables: the slots cannot be aimed at by a file */
    /* SPM: the "<0xXX>" token of each byte; BPE: the token of each byte's
     * character in the GPT-2 byte alphabet. -1 when the vocab lacks it. */
    int32_t byte_tok[256];

    int32_t bos, eos, unk, pad, eot, eom;
    int32_t eog[MAX_EOG];
    int n_eog;
    int32_t shown[16]; /* control tokens whose text is their piece (harmony's and tool calls' markers) */
    int n_shown;
    bool add_bos, add_space_prefix;

    /* BPE merges: (left id, right id) -> rank and merged id. */
    uint64_t *mg_key;
    int32_t *mg_rank;
    int32_t *mg_tok;
    size_t mg_mask;
    int64_t n_merges, merges_skipped;

    pcre2_code *re[MAX_PRE_STAGES];
    int n_re;
    bool ignore_merges, pre_fallback;
    const char *pre; /* pre-tokenizer family in use */

    trie_node *trie;
    int32_t n_trie;
    int32_t n_user; /* user-defined tokens in the trie */
    int32_t trie_root[256];
    trie_edge *edges; /* open addressing, at most half full */
    size_t edge_mask;
};

static int set_err(char *err, size_t err_len, int rc, const char *fmt, ...)
{
    if (err && err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return rc;
}

/* ---- UTF-8 ---- */

/* Length of the valid UTF-8 sequence at s (1..4), or 0 when the bytes there
 * are not one (overlong forms, surrogates and truncation included). */
static size_t utf8_valid_len(const uint8_t *s, size_t n)
{
    uint8_t c = s[0];
    if (c < 0x80)
        return 1;
    size_t len;
    uint32_t min;
    if ((c & 0xE0) == 0xC0) {
        len = 2;
        min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        len = 3;
        min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        len = 4;
        min = 0x10000;
    } else {
        return 0;
    }
    if (len > n)
        return 0;
    uint32_t cp = c & (0x7F >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
}

static uint32_t utf8_decode(const uint8_t *s, size_t len)
{
    if (len == 1)
        return s[0];
    uint32_t cp = s[0] & (0x7F >> len);
    for (size_t i = 1; i < len; i++)
        cp = (cp << 6) | (s[i] & 0x3F);
    return cp;
}

/* ---- GPT-2 byte alphabet (bytes_to_unicode) ----
 * Printable Latin-1 bytes stand for themselves; the other 68 bytes take the
 * code points 256..323 in byte order, so every byte string becomes printable
 * text that a vocabulary can hold. */

static uint32_t bpe_byte_cp(uint8_t b)
{
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)
        return b;
    if (b <= 0x20)
        return 256u + b;
    if (b <= 0xA0)
        return 256u + 33u + (b - 0x7Fu);
    return 256u + 67u; /* 0xAD */
}

/* Byte for a code point of the alphabet, or -1. */
static int bpe_cp_byte(uint32_t cp)
{
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
        return (int)cp;
    if (cp >= 256 && cp <= 288)
        return (int)(cp - 256);
    if (cp >= 289 && cp <= 322)
        return (int)(0x7F + cp - 289);
    if (cp == 323)
        return 0xAD;
    return -1;
}

/* Writes the alphabet character of byte b (1 or 2 bytes); returns its length. */
static size_t bpe_byte_utf8(uint8_t b, char *out)
{
    uint32_t cp = bpe_byte_cp(b);
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* ---- vocabulary lookup ---- */

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static inline const char *tok_text(const rt_tokenizer *t, int32_t id)
{
    return t->text + t->text_off[id];
}

static inline size_t tok_len(const rt_tokenizer *t, int32_t id)
{
    return t->text_off[id + 1] - t->text_off[id] - 1;
}

static int32_t lookup(const rt_tokenizer *t, const char *s, size_t n)
{
    for (size_t i = rt_hash_bytes(s, n, t->ht_key) & t->ht_mask;; i = (i + 1) & t->ht_mask) {
        int32_t id = t->ht[i];
        if (id < 0)
            return -1;
        if (tok_len(t, id) == n && memcmp(tok_text(t, id), s, n) == 0)
            return id;
    }
}

/* Ordinary text tokens only: encoding plain text must never produce a
 * control, unknown or unused id, whose pieces do not decode to the text. */
static int32_t lookup_text(const rt_tokenizer *t, const char *s, size_t n)
{
    if (n > t->max_len)
        return -1;
    int32_t id = lookup(t, s, n);
    if (id >= 0 && t->types[id] != TT_NORMAL && t->types[id] != TT_UNDEFINED)
        return -1;
    return id;
}

/* Later duplicates replace earlier ones, as in llama.cpp's token_to_id. */
static void ht_insert(rt_tokenizer *t, int32_t id)
{
    const char *s = tok_text(t, id);
    size_t n = tok_len(t, id);
    for (size_t i = rt_hash_bytes(s, n, t->ht_key) & t->ht_mask;; i = (i + 1) & t->ht_mask) {
        int32_t cur = t->ht[i];
        if (cur < 0 || (tok_len(t, cur) == n && memcmp(tok_text(t, cur), s, n) == 0)) {
            t->ht[i] = id;
            return;
        }
    }
}

static bool merge_find(const rt_tokenizer *t, int32_t a, int32_t b, int32_t *rank, int32_t *tok)
{
    if (!t->mg_key)
        return false;
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    for (size_t i = hash_u64(key ^ t->ht_key) & t->mg_mask;; i = (i + 1) & t->mg_mask) {
        if (t->mg_key[i] == UINT64_MAX)
            return false;
        if (t->mg_key[i] == key) {
            *rank = t->mg_rank[i];
            *tok = t->mg_tok[i];
            return true;
        }
    }
}

/* ---- pre-tokenizers (tokenizer.ggml.pre) ---- */

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define RE_LLAMA3                                                                                            \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                                             \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"      \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* Mistral's Tekken (Nemo, Small 3): words split at a lower-to-upper case
 * change, digits one by one, no contractions (its tokenizer.json's own). */
#define RE_TEKKEN                                                                                            \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"             \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}|"      \
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* OpenAI's o200k (GPT-4o, gpt-oss; Llama 4): Tekken's case-change split
 * with the contractions kept on their word, digits by threes. */
#define RE_O200K                                                                                             \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"                  \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"                                                                         \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"                  \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

typedef struct pre_family {
    const char *family;
    const char *re[MAX_PRE_STAGES]; /* applied in turn to every piece */
    bool ignore_merges;             /* a word that is itself a token skips the merges */
    bool add_bos;                   /* default when tokenizer.ggml.add_bos_token is absent */
    const char *names[12];
} pre_family;

static const pre_family k_pre[] = {
    {"llama3",
     {RE_LLAMA3, NULL},
     true,
     true,
     {"llama3", "llama-bpe", "llama-v3", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", NULL}},
    /* Smaug splits as Llama 3 but keeps GPT-2's merges and BOS defaults;
     * so does DBRX's cl100k vocabulary, which Phi-4's files name */
    {"smaug", {RE_LLAMA3, NULL}, false, false, {"smaug-bpe", "dbrx", NULL}},
    {"qwen2", {RE_QWEN2, NULL}, false, false, {"qwen2", "deepseek-r1-qwen", "megrez", NULL}},
    {"gpt2",
     {RE_GPT2, NULL},
     false,
     false,
     {"default", "gpt-2", "gpt2", "phi-2", "jina-es", "jina-de", "jina-v1-en", "jina-v2-es", "jina-v2-de",
      "jina-v2-code", "roberta-bpe", NULL}},
    /* digits alone first, then GPT-2's split inside each run of non-digits */
    {"starcoder",
     {"\\p{N}", RE_GPT2},
     false,
     false,
     {"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", NULL}},
    {"tekken", {RE_TEKKEN, NULL}, true, true, {"tekken", NULL}},
    {"gpt-4o", {RE_O200K, NULL}, false, false, {"gpt-4o", "llama4", NULL}},
};

static const pre_family *pre_lookup(rt_gguf_str name)
{
    for (size_t f = 0; f < sizeof(k_pre) / sizeof(k_pre[0]); f++)
        for (int i = 0; k_pre[f].names[i]; i++)
            if (rt_gguf_str_eq(name, k_pre[f].names[i]))
                return &k_pre[f];
    return NULL;
}

static const pre_family *pre_lookup_family(const char *family)
{
    for (size_t f = 0; f < sizeof(k_pre) / sizeof(k_pre[0]); f++)
        if (!strcmp(k_pre[f].family, family))
            return &k_pre[f];
    return NULL;
}

static int pre_compile(rt_tokenizer *t, const pre_family *f, char *err, size_t err_len)
{
    /* MATCH_INVALID_UTF: bytes that are not UTF-8 never match and never make
     * the matcher fail; the splitter passes them on as pieces of their own. */
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF;
    for (int i = 0; i < MAX_PRE_STAGES && f->re[i]; i++) {
        int ec;
        PCRE2_SIZE eo;
        t->re[i] = pcre2_compile((PCRE2_SPTR)f->re[i], PCRE2_ZERO_TERMINATED, opts, &ec, &eo, NULL);
        if (!t->re[i]) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(ec, msg, sizeof(msg));
            return set_err(err, err_len, ec == PCRE2_ERROR_NOMEMORY ? -ENOMEM : -EINVAL,
                           "tokenizer.ggml.pre: regex of '%s' does not compile at %zu: %s", f->family,
                           (size_t)eo, (const char *)msg);
        }
        t->n_re = i + 1;
        /* without JIT (not built, or no executable memory) the interpreter runs */
        (void)pcre2_jit_compile(t->re[i], PCRE2_JIT_COMPLETE);
    }
    t->pre = f->family;
    t->ignore_merges = f->ignore_merges;
    return 0;
}

/* ---- loading ---- */

/* Reads an optional token id. Absent keeps *out; -1 and 0xFFFFFFFF mean "none". */
static int read_id(const rt_gguf *g, const char *key, int32_t n_vocab, int32_t *out, char *err,
                   size_t err_len)
{
    int64_t i = rt_gguf_find_key(g, key);
    if (i < 0)
        return 0;
    int64_t v;
    if (rt_gguf_kv_i64(g, i, &v) != 0 || rt_gguf_kv_type(g, i) == RT_GGUF_BOOL)
        return set_err(err, err_len, -EINVAL, "%s: not an integer", key);
    if (v == -1 || v == (int64_t)UINT32_MAX) {
        *out = -1;
        return 0;
    }
    if (v < 0 || v >= n_vocab)
        return set_err(err, err_len, -EINVAL, "%s: token id %lld out of range (vocabulary has %d tokens)",
                       key, (long long)v, (int)n_vocab);
    *out = (int32_t)v;
    return 0;
}

static int read_bool(const rt_gguf *g, const char *key, bool *out, char *err, size_t err_len)
{
    int rc = rt_gguf_get_bool(g, key, out);
    if (rc == -ENOENT)
        return 0;
    if (rc != 0)
        return set_err(err, err_len, -EINVAL, "%s: not a bool", key);
    return 0;
}

/* Numeric array `key` of exactly n elements: index, -1 when absent, or an error. */
static int find_num_array(const rt_gguf *g, const char *key, uint64_t n, int64_t *idx, char *err,
                          size_t err_len)
{
    *idx = rt_gguf_find_key(g, key);
    if (*idx < 0)
        return 0;
    if (rt_gguf_kv_type(g, *idx) != RT_GGUF_ARRAY)
        return set_err(err, err_len, -EINVAL, "%s: not an array", key);
    rt_gguf_vtype et = rt_gguf_arr_type(g, *idx);
    if (et == RT_GGUF_STRING || et == RT_GGUF_ARRAY || et == RT_GGUF_BOOL)
        return set_err(err, err_len, -EINVAL, "%s: not an array of numbers", key);
    if (rt_gguf_arr_n(g, *idx) != n)
        return set_err(err, err_len, -EINVAL, "%s: has %llu entries, tokenizer.ggml.tokens has %llu", key,
                       (unsigned long long)rt_gguf_arr_n(g, *idx), (unsigned long long)n);
    return 0;
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* "<0xXX>" (llama.cpp writes upper case; lower case is accepted). */
static bool is_byte_token_text(const char *s, size_t n, uint8_t *b)
{
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return false;
    int hi = hex_digit(s[3]), lo = hex_digit(s[4]);
    if (hi < 0 || lo < 0)
        return false;
    *b = (uint8_t)((hi << 4) | lo);
    return true;
}

/* gpt-oss's harmony (a vocabulary with <|channel|>, <|message|>,
 * <|return|> and <|call|>), as llama.cpp reads it: a turn ends at <|return|>
 * or <|call|>, not at <|end|>, which only ends a message (the reasoning)
 * within it; and the markers' text goes out with the answer, which the
 * harmony parser (runtime/harmony.h) reads its channels and calls from.
 * They stay control tokens: a client's message cannot write them. */
static void add_eog(rt_tokenizer *t, int32_t id);

static void harmony_tokens(rt_tokenizer *t)
{
    static const char *const shown[] = {"<|channel|>", "<|message|>", "<|start|>", "<|end|>",
                                        "<|constrain|>"};
    int32_t ret = lookup(t, "<|return|>", 10), call = lookup(t, "<|call|>", 8);
    if (ret < 0 || call < 0 || lookup(t, "<|channel|>", 11) < 0 || lookup(t, "<|message|>", 11) < 0)
        return;
    add_eog(t, ret);
    add_eog(t, call);
    int32_t end = lookup(t, "<|end|>", 7);
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == end)
            t->eog[i--] = t->eog[--t->n_eog];
    for (size_t i = 0; i < sizeof(shown) / sizeof(shown[0]); i++) {
        int32_t id = lookup(t, shown[i], strlen(shown[i]));
        if (id >= 0 && t->types[id] == TT_CONTROL)
            t->shown[t->n_shown++] = id;
    }
}

/* The markers tool calls are written with (Mistral's [TOOL_CALLS], [ARGS]
 * and [CALL_ID], Llama 3's <|python_tag|>, Hermes' <tool_call>): control
 * tokens in many files, which gave no text, so that the tool-call parser
 * (runtime/toolcall.h) never saw a call the model made. Their text goes
 * out, as llama.cpp's server keeps a format's preserved tokens; they stay
 * control tokens, which a client's message cannot write. */
static void tool_marker_tokens(rt_tokenizer *t)
{
    static const char *const shown[] = {"[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "<|python_tag|>", "<tool_call>",
                                        "</tool_call>"};
    for (size_t i = 0; i < sizeof(shown) / sizeof(shown[0]); i++) {
        int32_t id = lookup(t, shown[i], strlen(shown[i]));
        if (id >= 0 && t->types[id] == TT_CONTROL && t->n_shown < (int)(sizeof(t->shown) / sizeof(t->shown[0])))
            t->shown[t->n_shown++] = id;
    }
}

/* Decoded bytes of token id into out (when not NULL); returns their count. */
static size_t make_piece(const rt_tokenizer *t, int32_t id, char *out)
{
    const char *s = tok_text(t, id);
    size_t n = tok_len(t, id);
    uint8_t b;
    for (int i = 0; i < t->n_shown; i++)
        if (t->shown[i] == id) {
            if (out)
                memcpy(out, s, n);
            return n;
        }
    switch (t->types[id]) {
    case TT_CONTROL:
    case TT_UNUSED:
        return 0;
    case TT_USER:
        if (out)
            memcpy(out, s, n);
        return n;
    case TT_UNKNOWN:
        if (t->kind == RT_TOK_SPM) {
            if (out)
                memcpy(out, "\xe2\x96\x85", 3); /* U+2585, as llama.cpp shows <unk> */
            return 3;
        }
        if (out)
            memcpy(out, s, n);
        return n;
    case TT_BYTE:
        if (is_byte_token_text(s, n, &b)) {
            if (out)
                out[0] = (char)b;
            return 1;
        }
        break;
    default:
        break;
    }
    size_t o = 0;
    if (t->kind == RT_TOK_SPM) {
        for (size_t i = 0; i < n;) {
            if (n - i >= 3 && memcmp(s + i, SPM_SPACE, 3) == 0) {
                if (out)
                    out[o] = ' ';
                o++;
                i += 3;
            } else {
                if (out)
                    out[o] = s[i];
                o++;
                i++;
            }
        }
        return o;
    }
    for (size_t i = 0; i < n;) {
        size_t cl = utf8_valid_len((const uint8_t *)s + i, n - i);
        int byte = cl ? bpe_cp_byte(utf8_decode((const uint8_t *)s + i, cl)) : -1;
        if (byte >= 0) {
            if (out)
                out[o] = (char)byte;
            o++;
            i += cl;
        } else {
            /* not of the byte alphabet: the text stands for itself */
            if (!cl)
                cl = 1;
            if (out)
                memcpy(out + o, s + i, cl);
            o += cl;
            i += cl;
        }
    }
    return o;
}

static int build_pieces(rt_tokenizer *t)
{
    size_t total = 0;
    t->piece_off = malloc(((size_t)t->n_vocab + 1) * sizeof(size_t));
    if (!t->piece_off)
        return -ENOMEM;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        t->piece_off[i] = total;
        total += make_piece(t, i, NULL);
    }
    t->piece_off[t->n_vocab] = total;
    t->piece = malloc(total ? total : 1);
    if (!t->piece)
        return -ENOMEM;
    for (int32_t i = 0; i < t->n_vocab; i++)
        make_piece(t, i, t->piece + t->piece_off[i]);
    return 0;
}

/* The slot of edge (parent, byte): its own, or the free one it would take. */
static size_t edge_slot(const rt_tokenizer *t, int32_t parent, uint8_t byte)
{
    size_t h = ((size_t)((uint32_t)parent * 0x9E3779B1u) ^ (size_t)byte * 0x85EBCA77u) & t->edge_mask;
    while (t->edges[h].child >= 0 && (t->edges[h].parent != parent || t->edges[h].byte != byte))
        h = (h + 1) & t->edge_mask;
    return h;
}

static int trie_child(const rt_tokenizer *t, int32_t node, uint8_t byte)
{
    return t->edges[edge_slot(t, node, byte)].child;
}

/* Control and user-defined tokens, matched in text only with parse_special.
 * Those longer than SPECIAL_MAX bytes are not: the match walks the trie at
 * every position of the text as far as it matches, and one hostile token
 * of 200 KB made a prompt of its first byte quadratic (20 CPU-minutes for
 * 1 MB). Real ones are tens of bytes; a longer one still decodes. */
#define SPECIAL_MAX 256

static bool special(const rt_tokenizer *t, int32_t id)
{
    return (t->types[id] == TT_CONTROL || t->types[id] == TT_USER) && tok_len(t, id) <= SPECIAL_MAX;
}

static int build_specials(rt_tokenizer *t)
{
    size_t nodes = 0;
    for (int i = 0; i < 256; i++)
        t->trie_root[i] = -1;
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (special(t, id))
            nodes += tok_len(t, id);
    if (nodes == 0)
        return 0;
    if (nodes > INT32_MAX / 2)
        return -ENOMEM;
    size_t cap = 16;
    while (cap < 2 * nodes)
        cap *= 2;
    t->trie = malloc(nodes * sizeof(trie_node));
    t->edges = malloc(cap * sizeof(trie_edge));
    if (!t->trie || !t->edges)
        return -ENOMEM;
    for (size_t i = 0; i < cap; i++)
        t->edges[i].child = -1;
    t->edge_mask = cap - 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (!special(t, id))
            continue;
        const uint8_t *s = (const uint8_t *)tok_text(t, id);
        size_t n = tok_len(t, id);
        if (n == 0)
            continue;
        int32_t node = t->trie_root[s[0]];
        if (node < 0) {
            node = t->n_trie++;
            t->trie[node] = (trie_node){-1};
            t->trie_root[s[0]] = node;
        }
        for (size_t k = 1; k < n; k++) {
            size_t h = edge_slot(t, node, s[k]);
            if (t->edges[h].child < 0) {
                int32_t c = t->n_trie++;
                t->trie[c] = (trie_node){-1};
                t->edges[h] = (trie_edge){node, c, s[k]};
            }
            node = t->edges[h].child;
        }
        if (t->trie[node].tok < 0) {
            t->trie[node].tok = id;
            t->n_user += t->types[id] == TT_USER;
        }
    }
    return 0;
}

static void add_eog(rt_tokenizer *t, int32_t id)
{
    if (id < 0 || t->n_eog == MAX_EOG)
        return;
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id)
            return;
    t->eog[t->n_eog++] = id;
}

static int load_merges(rt_tokenizer *t, const rt_gguf *g, char *err, size_t err_len)
{
    const char *key = "tokenizer.ggml.merges";
    int64_t ki = rt_gguf_find_key(g, key);
    if (ki < 0)
        return set_err(err, err_len, -EINVAL, "%s: missing (required by tokenizer model gpt2)", key);
    if (rt_gguf_kv_type(g, ki) != RT_GGUF_ARRAY || rt_gguf_arr_type(g, ki) != RT_GGUF_STRING)
        return set_err(err, err_len, -EINVAL, "%s: not an array of strings", key);
    uint64_t n = rt_gguf_arr_n(g, ki);
    if (n > INT32_MAX)
        return set_err(err, err_len, -EINVAL, "%s: %llu merges is too many", key, (unsigned long long)n);
    size_t cap = 16;
    while (cap < 2 * n)
        cap <<= 1;
    t->mg_mask = cap - 1;
    t->mg_key = malloc(cap * sizeof(uint64_t));
    t->mg_rank = malloc(cap * sizeof(int32_t));
    t->mg_tok = malloc(cap * sizeof(int32_t));
    if (!t->mg_key || !t->mg_rank || !t->mg_tok)
        return -ENOMEM;
    memset(t->mg_key, 0xFF, cap * sizeof(uint64_t));
    char *buf = NULL;
    size_t buf_cap = 0;
    for (uint64_t j = 0; j < n; j++) {
        rt_gguf_str s;
        if (rt_gguf_arr_str(g, ki, j, &s) != 0) {
            free(buf);
            return set_err(err, err_len, -EINVAL, "%s[%llu]: unreadable", key, (unsigned long long)j);
        }
        /* "left right"; the first character never splits, as in llama.cpp */
        const char *sp = s.n > 1 ? memchr(s.p + 1, ' ', s.n - 1) : NULL;
        if (!sp) {
            t->merges_skipped++;
            continue;
        }
        size_t ln = (size_t)(sp - s.p), rn = s.n - ln - 1;
        if (ln + rn > buf_cap) {
            free(buf);
            buf_cap = 2 * (ln + rn) + 64;
            buf = malloc(buf_cap);
            if (!buf)
                return -ENOMEM;
        }
        memcpy(buf, s.p, ln);
        memcpy(buf + ln, sp + 1, rn);
        int32_t a = lookup_text(t, s.p, ln), b = lookup_text(t, sp + 1, rn), m = lookup_text(t, buf, ln + rn);
        if (a < 0 || b < 0 || m < 0) {
            t->merges_skipped++;
            continue;
        }
        uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
        size_t i = hash_u64(k ^ t->ht_key) & t->mg_mask;
        while (t->mg_key[i] != UINT64_MAX && t->mg_key[i] != k)
            i = (i + 1) & t->mg_mask;
        if (t->mg_key[i] == k)
            continue; /* a repeated pair keeps its first (best) rank */
        t->mg_key[i] = k;
        t->mg_rank[i] = (int32_t)j;
        t->mg_tok[i] = m;
        t->n_merges++;
    }
    free(buf);
    return 0;
}

int rt_tokenizer_load(const rt_gguf *g, rt_tokenizer **out, char *err, size_t err_len)
{
    int rc;
    rt_gguf_str s;
    *out = NULL;
    rt_tokenizer *t = calloc(1, sizeof(*t));
    if (!t)
        return -ENOMEM;
    t->bos = t->eos = t->unk = t->pad = t->eot = t->eom = -1;
    for (int i = 0; i < 256; i++)
        t->byte_tok[i] = -1;
    t->ht_key = rt_hash_key();

    rc = rt_gguf_get_str(g, "tokenizer.ggml.model", &s);
    if (rc == -ENOENT) {
        rc = set_err(err, err_len, -EINVAL, "tokenizer.ggml.model: missing");
        goto fail;
    }
    if (rc != 0) {
        rc = set_err(err, err_len, -EINVAL, "tokenizer.ggml.model: not a string");
        goto fail;
    }
    if (rt_gguf_str_eq(s, "llama")) {
        t->kind = RT_TOK_SPM;
    } else if (rt_gguf_str_eq(s, "gpt2")) {
        t->kind = RT_TOK_BPE;
    } else {
        char shown[72];
        rc = set_err(err, err_len, -EINVAL,
                     "tokenizer.ggml.model: unsupported tokenizer '%s' (want llama or gpt2)",
                     rt_gguf_printable(shown, sizeof(shown), s));
        goto fail;
    }

    /* tokens */
    const char *key = "tokenizer.ggml.tokens";
    int64_t ki = rt_gguf_find_key(g, key);
    if (ki < 0) {
        rc = set_err(err, err_len, -EINVAL, "%s: missing", key);
        goto fail;
    }
    if (rt_gguf_kv_type(g, ki) != RT_GGUF_ARRAY || rt_gguf_arr_type(g, ki) != RT_GGUF_STRING) {
        rc = set_err(err, err_len, -EINVAL, "%s: not an array of strings", key);
        goto fail;
    }
    uint64_t n = rt_gguf_arr_n(g, ki);
    if (n == 0 || n > INT32_MAX / 2) {
        rc = set_err(err, err_len, -EINVAL, "%s: %llu tokens (want 1 to %d)", key, (unsigned long long)n,
                     INT32_MAX / 2);
        goto fail;
    }
    t->n_vocab = (int32_t)n;
    rc = -ENOMEM;
    t->text_off = malloc((n + 1) * sizeof(size_t));
    t->scores = calloc(n, sizeof(float));
    t->types = malloc(n);
    if (!t->text_off || !t->scores || !t->types)
        goto fail;
    size_t total = 0;
    for (uint64_t j = 0; j < n; j++) {
        if (rt_gguf_arr_str(g, ki, j, &s) != 0) {
            rc = set_err(err, err_len, -EINVAL, "%s[%llu]: unreadable", key, (unsigned long long)j);
            goto fail;
        }
        t->text_off[j] = total;
        total += s.n + 1;
    }
    t->text_off[n] = total;
    t->text = malloc(total);
    if (!t->text)
        goto fail;
    for (uint64_t j = 0; j < n; j++) {
        rt_gguf_arr_str(g, ki, j, &s);
        memcpy(t->text + t->text_off[j], s.p, s.n);
        t->text[t->text_off[j] + s.n] = '\0';
    }

    /* scores (SentencePiece merge priorities; absent means all equal) */
    int64_t si, ti;
    if ((rc = find_num_array(g, "tokenizer.ggml.scores", n, &si, err, err_len)) != 0 ||
        (rc = find_num_array(g, "tokenizer.ggml.token_type", n, &ti, err, err_len)) != 0)
        goto fail;
    for (uint64_t j = 0; si >= 0 && j < n; j++) {
        double v;
        if (rt_gguf_arr_f64(g, si, j, &v) != 0) {
            rc = set_err(err, err_len, -EINVAL, "tokenizer.ggml.scores[%llu]: unreadable",
                         (unsigned long long)j);
            goto fail;
        }
        /* a NaN would break the heap order; it ranks last instead */
        t->scores[j] = isnan(v) ? -INFINITY : (float)v;
    }
    for (uint64_t j = 0; j < n; j++) {
        int64_t v = TT_NORMAL;
        if (ti >= 0 && rt_gguf_arr_i64(g, ti, j, &v) != 0) {
            rc = set_err(err, err_len, -EINVAL, "tokenizer.ggml.token_type[%llu]: unreadable",
                         (unsigned long long)j);
            goto fail;
        }
        if (v < TT_UNDEFINED || v > TT_BYTE) {
            rc = set_err(err, err_len, -EINVAL, "tokenizer.ggml.token_type[%llu]: unknown type %lld",
                         (unsigned long long)j, (long long)v);
            goto fail;
        }
        t->types[j] = (uint8_t)v;
    }

    size_t cap = 16;
    while (cap < 2 * n)
        cap <<= 1;
    t->ht_mask = cap - 1;
    rc = -ENOMEM;
    t->ht = malloc(cap * sizeof(int32_t));
    if (!t->ht)
        goto fail;
    memset(t->ht, 0xFF, cap * sizeof(int32_t));
    for (int32_t id = 0; id < t->n_vocab; id++)
        ht_insert(t, id);

    /* special ids; llama.cpp's defaults for SentencePiece vocabularies */
    if (t->kind == RT_TOK_SPM) {
        if (n > 0)
            t->unk = 0;
        if (n > 1)
            t->bos = 1;
        if (n > 2)
            t->eos = 2;
    } else {
        t->eos = lookup(t, "<|endoftext|>", 13);
    }
    if ((rc = read_id(g, "tokenizer.ggml.bos_token_id", t->n_vocab, &t->bos, err, err_len)) ||
        (rc = read_id(g, "tokenizer.ggml.eos_token_id", t->n_vocab, &t->eos, err, err_len)) ||
        (rc = read_id(g, "tokenizer.ggml.unknown_token_id", t->n_vocab, &t->unk, err, err_len)) ||
        (rc = read_id(g, "tokenizer.ggml.eot_token_id", t->n_vocab, &t->eot, err, err_len)) ||
        (rc = read_id(g, "tokenizer.ggml.eom_token_id", t->n_vocab, &t->eom, err, err_len)))
        goto fail;
    /* some converted files carry a padding id past the vocabulary; it is
     * never emitted, so it is dropped rather than refused */
    if (read_id(g, "tokenizer.ggml.padding_token_id", t->n_vocab, &t->pad, NULL, 0) != 0)
        t->pad = -1;

    if (ti < 0) {
        /* no types in the file: recognise what the encoder and decoder must */
        for (int32_t id = 0; id < t->n_vocab; id++) {
            uint8_t b;
            if (t->kind == RT_TOK_SPM && is_byte_token_text(tok_text(t, id), tok_len(t, id), &b))
                t->types[id] = TT_BYTE;
        }
        if (t->bos >= 0)
            t->types[t->bos] = TT_CONTROL;
        if (t->eos >= 0)
            t->types[t->eos] = TT_CONTROL;
        if (t->unk >= 0)
            t->types[t->unk] = TT_UNKNOWN;
    }
    for (int32_t id = 0; id < t->n_vocab; id++)
        if ((t->types[id] == TT_NORMAL || t->types[id] == TT_UNDEFINED) && tok_len(t, id) > t->max_len)
            t->max_len = tok_len(t, id);

    bool add_bos_set = rt_gguf_find_key(g, "tokenizer.ggml.add_bos_token") >= 0;
    t->add_bos = t->kind == RT_TOK_SPM;
    t->add_space_prefix = t->kind == RT_TOK_SPM;
    if ((rc = read_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos, err, err_len)) != 0)
        goto fail;
    if (t->kind == RT_TOK_SPM) {
        if ((rc = read_bool(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err, err_len)) != 0)
            goto fail;
        for (int32_t id = 0; id < t->n_vocab; id++) {
            uint8_t b;
            if (t->types[id] == TT_BYTE && is_byte_token_text(tok_text(t, id), tok_len(t, id), &b) &&
                t->byte_tok[b] < 0)
                t->byte_tok[b] = id;
        }
    } else {
        for (int b = 0; b < 256; b++) {
            char ch[2];
            size_t cl = bpe_byte_utf8((uint8_t)b, ch);
            t->byte_tok[b] = lookup_text(t, ch, cl);
        }
        if ((rc = load_merges(t, g, err, err_len)) != 0)
            goto fail;
        const pre_family *f = NULL;
        rc = rt_gguf_get_str(g, "tokenizer.ggml.pre", &s);
        if (rc == 0) {
            f = pre_lookup(s);
            if (!f)
                t->pre_fallback = true;
        } else if (rc != -ENOENT) {
            rc = set_err(err, err_len, -EINVAL, "tokenizer.ggml.pre: not a string");
            goto fail;
        }
        if (!f)
            f = pre_lookup_family("gpt2");
        if ((rc = pre_compile(t, f, err, err_len)) != 0)
            goto fail;
        if (!add_bos_set)
            t->add_bos = f->add_bos;
    }

    add_eog(t, t->eos);
    add_eog(t, t->eot);
    add_eog(t, t->eom);
    /* llama.cpp's list: Llama 3 Instruct GGUFs name <|eot_id|> as EOS, and
     * the model may still end a raw completion with <|end_of_text|> */
    static const char *const eog_texts[] = {"<|eot_id|>", "<|eom_id|>",     "<|im_end|>",
                                            "<|end|>",    "<end_of_turn>",  "<|endoftext|>",
                                            "<EOT>",      "<|end_of_text|>"};
    for (size_t i = 0; i < sizeof(eog_texts) / sizeof(eog_texts[0]); i++) {
        int32_t id = lookup(t, eog_texts[i], strlen(eog_texts[i]));
        if (id >= 0 && (t->types[id] == TT_CONTROL || t->types[id] == TT_USER))
            add_eog(t, id);
    }
    /* User-defined tokens are matched inside a client's message too (see
     * rt_tokenizer_encode_spans); one that ends or opens a turn there
     * would forge one. Such a token typed user-defined is read as control,
     * as llama.cpp retypes an end-of-turn token it finds so mistyped. */
    static const char *const turn_texts[] = {"<|im_start|>", "<|start_header_id|>", "<|end_header_id|>"};
    for (int i = 0; i < t->n_eog; i++)
        if (t->types[t->eog[i]] == TT_USER)
            t->types[t->eog[i]] = TT_CONTROL;
    for (size_t i = 0; i < sizeof(turn_texts) / sizeof(turn_texts[0]); i++) {
        int32_t id = lookup(t, turn_texts[i], strlen(turn_texts[i]));
        if (id >= 0 && t->types[id] == TT_USER)
            t->types[id] = TT_CONTROL;
    }
    if (t->bos >= 0 && t->types[t->bos] == TT_USER)
        t->types[t->bos] = TT_CONTROL;

    harmony_tokens(t);
    tool_marker_tokens(t);

    rc = -ENOMEM;
    if (build_pieces(t) != 0 || build_specials(t) != 0)
        goto fail;
    *out = t;
    return 0;

fail:
    if (rc == -ENOMEM)
        set_err(err, err_len, rc, "out of memory loading the tokenizer");
    rt_tokenizer_free(t);
    return rc;
}

void rt_tokenizer_free(rt_tokenizer *t)
{
    if (!t)
        return;
    for (int i = 0; i < t->n_re; i++)
        pcre2_code_free(t->re[i]);
    free(t->trie);
    free(t->edges);
    free(t->mg_tok);
    free(t->mg_rank);
    free(t->mg_key);
    free(t->ht);
    free(t->piece);
    free(t->piece_off);
    free(t->types);
    free(t->scores);
    free(t->text);
    free(t->text_off);
    free(t);
}

/* ---- accessors ---- */

rt_tok_kind rt_tokenizer_kind(const rt_tokenizer *t)
{
    return t->kind;
}

const char *rt_tokenizer_kind_name(const rt_tokenizer *t)
{
    return t->kind == RT_TOK_SPM ? "llama" : "gpt2";
}

int32_t rt_tokenizer_n_vocab(const rt_tokenizer *t)
{
    return t->n_vocab;
}

int32_t rt_tokenizer_bos(const rt_tokenizer *t)
{
    return t->bos;
}

int32_t rt_tokenizer_eos(const rt_tokenizer *t)
{
    return t->eos;
}

bool rt_tokenizer_is_eog(const rt_tokenizer *t, int32_t tok)
{
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == tok)
            return true;
    return false;
}

bool rt_tokenizer_add_bos_default(const rt_tokenizer *t)
{
    return t->add_bos;
}

const char *rt_tokenizer_pre(const rt_tokenizer *t)
{
    return t->pre ? t->pre : "";
}

bool rt_tokenizer_pre_fallback(const rt_tokenizer *t)
{
    return t->pre_fallback;
}

int64_t rt_tokenizer_merges_skipped(const rt_tokenizer *t)
{
    return t->merges_skipped;
}

const char *rt_tokenizer_token_text(const rt_tokenizer *t, int32_t tok)
{
    if (tok < 0 || tok >= t->n_vocab)
        return NULL;
    return tok_text(t, tok);
}

bool rt_tokenizer_text_is_token(const rt_tokenizer *t, int32_t tok)
{
    if (tok < 0 || tok >= t->n_vocab || !special(t, tok) || tok_len(t, tok) == 0 ||
        strlen(tok_text(t, tok)) != tok_len(t, tok))
        return false;
    /* and no other token of the same text is the one the match gives */
    int32_t got[2];
    return rt_tokenizer_encode(t, tok_text(t, tok), tok_len(t, tok), false, true, got, 2) == 1 &&
           got[0] == tok;
}

int32_t rt_tokenizer_find(const rt_tokenizer *t, const char *text)
{
    return lookup(t, text, strlen(text));
}

/* ---- encoding ---- */

typedef struct sym {
    size_t start, n; /* bytes of the working text */
    int32_t prev, next;
    int32_t tok; /* -1 until known */
} sym;

/* Candidate merge of the symbol at `left` (low 32 bits of key) with the one
 * after it into tok. The high 32 bits order the heap (SentencePiece: higher
 * score first; BPE: lower rank first); equal ones go leftmost first, as in
 * llama.cpp. `size` is the pair's length when pushed: symbols only grow, so
 * a popped entry whose pair changed since no longer adds up and is skipped.
 * 16 bytes: on long inputs the heap is the hot, cache-missing structure. */
typedef struct bigram {
    uint64_t key;
    uint32_t size;
    int32_t tok;
} bigram;

typedef struct enc_ws {
    char *buf; /* SPM escaped fragment, or a BPE word in the byte alphabet */
    sym *syms;
    bigram *heap;
    size_t hn, hcap;
    pcre2_match_data *md;
    int32_t *out;
    size_t max_out, n_out;
} enc_ws;

static inline void emit(enc_ws *w, int32_t tok)
{
    if (w->n_out < w->max_out)
        w->out[w->n_out] = tok;
    w->n_out++;
}

static inline bool bigram_before(const bigram *a, const bigram *b)
{
    return a->key < b->key;
}

/* Maps floats to integers of the same order, higher score to smaller key. */
static inline uint32_t score_key(float f)
{
    uint32_t u;
    if (f == 0.0f)
        f = 0.0f; /* -0 ties with +0, as the float compare in llama.cpp */
    memcpy(&u, &f, sizeof(u));
    u = (u & 0x80000000u) ? ~u : u | 0x80000000u;
    return ~u;
}

static int heap_push(enc_ws *w, bigram b)
{
    if (w->hn == w->hcap) {
        size_t cap = w->hcap ? 2 * w->hcap : 64;
        bigram *h = realloc(w->heap, cap * sizeof(bigram));
        if (!h)
            return -ENOMEM;
        w->heap = h;
        w->hcap = cap;
    }
    size_t i = w->hn++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!bigram_before(&b, &w->heap[p]))
            break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = b;
    return 0;
}

static bigram heap_pop(enc_ws *w)
{
    bigram top = w->heap[0];
    bigram last = w->heap[--w->hn];
    size_t i = 0, n = w->hn;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && bigram_before(&w->heap[c + 1], &w->heap[c]))
            c++;
        if (!bigram_before(&w->heap[c], &last))
            break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n)
        w->heap[i] = last;
    return top;
}

static void emit_byte(const rt_tokenizer *t, enc_ws *w, uint8_t b)
{
    if (t->byte_tok[b] >= 0)
        emit(w, t->byte_tok[b]);
    else if (t->unk >= 0)
        emit(w, t->unk);
}

static int spm_try_add(const rt_tokenizer *t, enc_ws *w, int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return 0;
    size_t start = w->syms[l].start, size = w->syms[l].n + w->syms[r].n;
    int32_t id = lookup_text(t, w->buf + start, size);
    if (id < 0 || size > UINT32_MAX)
        return 0;
    return heap_push(w,
                     (bigram){((uint64_t)score_key(t->scores[id]) << 32) | (uint32_t)l, (uint32_t)size, id});
}

/* Pops the next live pair and merges it; false when none is left. */
static bool merge_next(enc_ws *w, int32_t *merged)
{
    while (w->hn) {
        bigram b = heap_pop(w);
        int32_t li = (int32_t)(uint32_t)b.key;
        sym *l = &w->syms[li];
        if (l->n == 0 || l->next < 0)
            continue;
        sym *r = &w->syms[l->next];
        if (l->n + r->n != b.size)
            continue;
        l->n += r->n;
        r->n = 0;
        l->tok = b.tok;
        l->next = r->next;
        if (r->next >= 0)
            w->syms[r->next].prev = li;
        *merged = li;
        return true;
    }
    return false;
}

/* One run of plain text with SentencePiece: highest-scoring pair first. */
static int spm_fragment(const rt_tokenizer *t, enc_ws *w, const char *s, size_t n, bool prefix)
{
    size_t m = 0;
    if (prefix) {
        memcpy(w->buf, SPM_SPACE, 3);
        m = 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(w->buf + m, SPM_SPACE, 3);
            m += 3;
        } else {
            w->buf[m++] = s[i];
        }
    }
    if (m == 0)
        return 0;
    int32_t ns = 0;
    for (size_t p = 0; p < m; ns++) {
        size_t cl = utf8_valid_len((const uint8_t *)w->buf + p, m - p);
        if (!cl)
            cl = 1; /* a stray byte is a symbol of its own and falls back to <0xXX> */
        w->syms[ns] = (sym){p, cl, ns - 1, ns + 1, -1};
        p += cl;
    }
    w->syms[ns - 1].next = -1;
    w->hn = 0;
    int rc;
    for (int32_t i = 1; i < ns; i++)
        if ((rc = spm_try_add(t, w, i - 1, i)) != 0)
            return rc;
    for (int32_t li; merge_next(w, &li);)
        if ((rc = spm_try_add(t, w, w->syms[li].prev, li)) != 0 ||
            (rc = spm_try_add(t, w, li, w->syms[li].next)) != 0)
            return rc;
    for (int32_t i = 0; i >= 0; i = w->syms[i].next) {
        const sym *y = &w->syms[i];
        int32_t id = y->tok >= 0 ? y->tok : lookup_text(t, w->buf + y->start, y->n);
        if (id >= 0) {
            emit(w, id);
            continue;
        }
        for (size_t k = 0; k < y->n; k++)
            emit_byte(t, w, (uint8_t)w->buf[y->start + k]);
    }
    return 0;
}

static int bpe_try_add(const rt_tokenizer *t, enc_ws *w, int32_t l, int32_t r)
{
    if (l < 0 || r < 0 || w->syms[l].tok < 0 || w->syms[r].tok < 0)
        return 0;
    int32_t rank, tok;
    if (!merge_find(t, w->syms[l].tok, w->syms[r].tok, &rank, &tok))
        return 0;
    size_t size = w->syms[l].n + w->syms[r].n;
    if (size > UINT32_MAX)
        return 0;
    return heap_push(w, (bigram){((uint64_t)(uint32_t)rank << 32) | (uint32_t)l, (uint32_t)size, tok});
}

/* One pre-tokenized word with byte-level BPE: lowest-ranked merge first.
 * Symbol i starts as byte i, so symbols index the word directly. */
static int bpe_word(const rt_tokenizer *t, enc_ws *w, const uint8_t *s, size_t n)
{
    if (n == 0)
        return 0;
    if (t->ignore_merges || n == 1) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            m += bpe_byte_utf8(s[i], w->buf + m);
        int32_t id = lookup_text(t, w->buf, m);
        if (id >= 0) {
            emit(w, id);
            return 0;
        }
    }
    for (size_t i = 0; i < n; i++)
        w->syms[i] = (sym){i, 1, (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1, t->byte_tok[s[i]]};
    w->hn = 0;
    int rc;
    for (size_t i = 1; i < n; i++)
        if ((rc = bpe_try_add(t, w, (int32_t)i - 1, (int32_t)i)) != 0)
            return rc;
    for (int32_t li; merge_next(w, &li);)
        if ((rc = bpe_try_add(t, w, w->syms[li].prev, li)) != 0 ||
            (rc = bpe_try_add(t, w, li, w->syms[li].next)) != 0)
            return rc;
    for (int32_t i = 0; i >= 0; i = w->syms[i].next) {
        if (w->syms[i].tok >= 0)
            emit(w, w->syms[i].tok);
        else if (t->unk >= 0) /* a byte the vocabulary lacks */
            emit(w, t->unk);
    }
    return 0;
}

static int bpe_split(const rt_tokenizer *t, enc_ws *w, const char *s, size_t n, int stage);

static int bpe_piece(const rt_tokenizer *t, enc_ws *w, const char *s, size_t n, int stage)
{
    if (stage + 1 < t->n_re)
        return bpe_split(t, w, s, n, stage + 1);
    return bpe_word(t, w, (const uint8_t *)s, n);
}

/* Splits s with the stage's regex; the matches and the text between them
 * (only invalid UTF-8 for our patterns) go on as pieces. Each piece is its
 * own subject, so a lookahead never sees past it (as in llama.cpp). */
static int bpe_split(const rt_tokenizer *t, enc_ws *w, const char *s, size_t n, int stage)
{
    size_t off = 0;
    int rc;
    while (off < n) {
        int mrc = pcre2_match(t->re[stage], (PCRE2_SPTR)s, n, off, 0, w->md, NULL);
        if (mrc == PCRE2_ERROR_JIT_STACKLIMIT)
            mrc = pcre2_match(t->re[stage], (PCRE2_SPTR)s, n, off, PCRE2_NO_JIT, w->md, NULL);
        if (mrc == PCRE2_ERROR_NOMATCH)
            break;
        if (mrc < 0)
            return mrc == PCRE2_ERROR_NOMEMORY ? -ENOMEM : -EINVAL;
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) {
            /* none of our patterns matches empty; step one byte if one does */
            me = ms + 1;
        }
        if (ms > off && (rc = bpe_piece(t, w, s + off, ms - off, stage)) != 0)
            return rc;
        if ((rc = bpe_piece(t, w, s + ms, me - ms, stage)) != 0)
            return rc;
        off = me;
    }
    if (off < n)
        return bpe_piece(t, w, s + off, n - off, stage);
    return 0;
}

static int encode_fragment(const rt_tokenizer *t, enc_ws *w, const char *s, size_t n, bool prev_special)
{
    if (n == 0)
        return 0;
    if (t->kind == RT_TOK_SPM)
        return spm_fragment(t, w, s, n, t->add_space_prefix && prev_special);
    return bpe_split(t, w, s, n, 0);
}

int rt_tokenizer_encode(const rt_tokenizer *t, const char *text, size_t len, bool add_bos, bool parse_special,
                        int32_t *out, int max_out)
{
    rt_text_span all = {0, len};
    return rt_tokenizer_encode_spans(t, text, len, add_bos, parse_special ? NULL : &all,
                                     parse_special ? 0 : 1, out, max_out);
}

int rt_tokenizer_encode_spans(const rt_tokenizer *t, const char *text, size_t len, bool add_bos,
                              const rt_text_span *plain, int n_plain, int32_t *out, int max_out)
{
    /* ids per byte: 3 for a space escaped to U+2581 and then byte fallback,
     * a little more where a one-byte special token brings its own U+2581;
     * 4 bounds both, so the count fits the int returned */
    if ((len && !text) || len > (size_t)(INT_MAX - 8) / 4 || n_plain < 0 || (n_plain && !plain))
        return -EINVAL;
    for (int k = 0; k < n_plain; k++)
        if (plain[k].off > len || plain[k].len > len - plain[k].off ||
            (k && plain[k].off < plain[k - 1].off + plain[k - 1].len))
            return -EINVAL;
    enc_ws w = {0};
    w.out = out;
    w.max_out = out && max_out > 0 ? (size_t)max_out : 0;
    int rc = -ENOMEM;
    w.buf = malloc(3 * len + 4);
    w.syms = malloc((len + 2) * sizeof(sym));
    if (!w.buf || !w.syms)
        goto out;
    if (t->kind == RT_TOK_BPE && !(w.md = pcre2_match_data_create(1, NULL)))
        goto out;

    if (add_bos && t->bos >= 0)
        emit(&w, t->bos);
    /* SentencePiece puts a space before the text and after every special token */
    bool prev_special = true;
    size_t frag = 0;
    int next = 0; /* the first plain span that does not end before i */
    for (size_t i = 0; t->n_trie && i < len;) {
        while (next < n_plain && (plain[next].len == 0 || plain[next].off + plain[next].len <= i))
            next++;
        /* A match lies wholly in a plain span or wholly outside them; in
         * one, only a user-defined token matches (Gemma's "\n\n", Qwen3's
         * <think>), as llama.cpp and Hugging Face split them. Not in a
         * SentencePiece vocabulary that puts a space before each fragment:
         * the space llama.cpp puts after one would change the text. */
        const bool in_plain = next < n_plain && plain[next].off <= i;
        const size_t stop = next == n_plain ? len
                            : in_plain      ? plain[next].off + plain[next].len
                                            : plain[next].off;
        if (in_plain && (!t->n_user || (t->kind == RT_TOK_SPM && t->add_space_prefix))) {
            i = stop;
            continue;
        }
        int32_t best = -1;
        size_t best_len = 0;
        int32_t node = t->trie_root[(uint8_t)text[i]];
        for (size_t j = i + 1; node >= 0; j++) {
            const int32_t tok = t->trie[node].tok;
            if (tok >= 0 && (!in_plain || t->types[tok] == TT_USER)) {
                best = tok;
                best_len = j - i;
            }
            if (j == stop)
                break;
            node = trie_child(t, node, (uint8_t)text[j]);
        }
        if (best < 0) {
            i++;
            continue;
        }
        if ((rc = encode_fragment(t, &w, text + frag, i - frag, prev_special)) != 0)
            goto out;
        emit(&w, best);
        prev_special = true;
        i += best_len;
        frag = i;
    }
    if ((rc = encode_fragment(t, &w, text + frag, len - frag, prev_special)) != 0)
        goto out;
    rc = (int)w.n_out;
out:
    pcre2_match_data_free(w.md);
    free(w.heap);
    free(w.syms);
    free(w.buf);
    return rc;
}

/* ---- decoding ---- */

const char *rt_tokenizer_piece(const rt_tokenizer *t, int32_t tok, size_t *len)
{
    if (tok < 0 || tok >= t->n_vocab)
        return NULL;
    *len = t->piece_off[tok + 1] - t->piece_off[tok];
    return t->piece + t->piece_off[tok];
}

int rt_tokenizer_decode(const rt_tokenizer *t, const int32_t *toks, int n, bool strip_leading_space,
                        char *buf, size_t cap)
{
    if (n < 0 || (n && !toks))
        return -EINVAL;
    for (int i = 0; i < n; i++)
        if (toks[i] < 0 || toks[i] >= t->n_vocab)
            return -EINVAL;
    bool strip = strip_leading_space && t->kind == RT_TOK_SPM && t->add_space_prefix;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        const char *p = t->piece + t->piece_off[toks[i]];
        size_t pl = t->piece_off[toks[i] + 1] - t->piece_off[toks[i]];
        if (strip && pl) {
            if (p[0] == ' ') {
                p++;
                pl--;
            }
            strip = false;
        }
        if (total < cap)
            memcpy(buf + total, p, cap - total < pl ? cap - total : pl);
        total += pl;
        if (total > INT_MAX)
            return -EOVERFLOW;
    }
    if (total < cap)
        buf[total] = '\0';
    return (int)total;
}
