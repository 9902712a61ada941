/* Tokenizer built from a GGUF file's `tokenizer.ggml.*` metadata.
 *
 *   model "llama": SentencePiece BPE — pieces with scores, spaces as U+2581,
 *                  an optional leading space, <0xXX> byte-fallback tokens.
 *   model "gpt2":  byte-level BPE with `tokenizer.ggml.merges`, split first by
 *                  the pre-tokenizer regex of `tokenizer.ggml.pre` (llama-3,
 *                  qwen2, starcoder, tekken, gpt-4o's o200k, or GPT-2's own)
 *                  through PCRE2.
 * Special (control) tokens such as <|im_start|> are matched as whole tokens
 * when the caller asks to parse them (chat templates do; user text must not). */
#ifndef RT_TOKENIZER_H
#define RT_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct rt_gguf rt_gguf;
typedef struct rt_tokenizer rt_tokenizer;

typedef enum rt_tok_kind {
    RT_TOK_SPM = 1,  /* "llama" */
    RT_TOK_BPE = 2,  /* "gpt2" */
} rt_tok_kind;

/* 0, -EINVAL (bad or missing metadata; err names the key), -ENOMEM. */
int rt_tokenizer_load(const rt_gguf *g, rt_tokenizer **out, char *err, size_t err_len);
void rt_tokenizer_free(rt_tokenizer *t);

rt_tok_kind rt_tokenizer_kind(const rt_tokenizer *t);
const char *rt_tokenizer_kind_name(const rt_tokenizer *t); /* "llama" / "gpt2" */
int32_t rt_tokenizer_n_vocab(const rt_tokenizer *t);
int32_t rt_tokenizer_bos(const rt_tokenizer *t); /* -1 when the model has none */
int32_t rt_tokenizer_eos(const rt_tokenizer *t);
/* Does generation end at this token (EOS, EOT, <|im_end|>, <|eot_id|>...)? */
bool rt_tokenizer_is_eog(const rt_tokenizer *t, int32_t tok);
/* Whether encode() should add BOS by default (tokenizer.ggml.add_bos_token). */
bool rt_tokenizer_add_bos_default(const rt_tokenizer *t);

/* Encodes len bytes of text. Writes at most max_out ids; returns the number
 * the full encoding has (which may exceed max_out: call again with more room)
 * or a negative error. With parse_special, control and user-defined tokens
 * written literally in the text become their ids (leftmost, then longest
 * match). Without it control tokens are plain text, and so are a
 * SentencePiece vocabulary's user-defined ones (the space it puts after a
 * special token would change the text); a BPE vocabulary's user-defined
 * tokens (Qwen3's <think>) are still split out, as Hugging Face's
 * tokenizers and llama.cpp split them.
 * A user-defined token that ends or opens a turn (<|im_end|>, <|im_start|>,
 * <|start_header_id|>...) counts as control. Never adds EOS. */
int rt_tokenizer_encode(const rt_tokenizer *t, const char *text, size_t len, bool add_bos, bool parse_special,
                        int32_t *out, int max_out);

/* Bytes [off, off + len) of a text. */
typedef struct rt_text_span {
    size_t off, len;
} rt_text_span;

/* As rt_tokenizer_encode with parse_special, except that no control token
 * is matched that overlaps one of the n_plain spans (sorted by offset, not
 * overlapping, within the text), and no user-defined token that reaches
 * out of one: what a chat template took from a client's message is
 * encoded as without parse_special, so a message cannot forge a role
 * header. Elsewhere the ids are those of rt_tokenizer_encode. -EINVAL for
 * spans out of order or out of range. */
int rt_tokenizer_encode_spans(const rt_tokenizer *t, const char *text, size_t len, bool add_bos,
                              const rt_text_span *plain, int n_plain, int32_t *out, int max_out);

/* Bytes that token `tok` contributes to the text (a byte token gives its one
 * raw byte, which may be part of a UTF-8 sequence), *len of them, not
 * NUL-terminated; they live as long as t. Control tokens give none (but
 * gpt-oss's harmony markers, <|channel|> and the like, give their text). NULL
 * for an id out of range. */
const char *rt_tokenizer_piece(const rt_tokenizer *t, int32_t tok, size_t *len);
/* Whole-sequence decode (SentencePiece drops the space the encoder added
 * before the first piece when `strip_leading_space`). Returns full length.
 * A NUL follows the text when it fits (length < cap).
 *
 * Round trip: without parse_special and without add_bos, decode(encode(x))
 * gives back x byte for byte (invalid UTF-8 included) for BPE, and for
 * SentencePiece with strip_leading_space when x has no U+2581 (which the
 * SentencePiece scheme itself reads as a space) and the vocabulary has the
 * "▁" token and the 256 byte tokens. */
int rt_tokenizer_decode(const rt_tokenizer *t, const int32_t *toks, int n, bool strip_leading_space, char *buf,
                        size_t cap);

/* Vocabulary entry as stored (for inspect and chat templates); id in range. */
const char *rt_tokenizer_token_text(const rt_tokenizer *t, int32_t tok);
/* Whether encoding with parse_special reads the token's text back as the
 * token: a control or user-defined token, its text without a NUL and at
 * most 256 bytes. A chat template may write only such a BOS as text. */
bool rt_tokenizer_text_is_token(const rt_tokenizer *t, int32_t tok);
/* Id of a token with this exact text, or -1. */
int32_t rt_tokenizer_find(const rt_tokenizer *t, const char *text);

/* BPE pre-tokenizer family in use: "llama3", "smaug", "qwen2", "gpt2",
 * "starcoder", "tekken" or "gpt-4o" ("" for SentencePiece). An absent tokenizer.ggml.pre means "gpt2"; a name
 * this build does not know also gets "gpt2", and pre_fallback() says so
 * (the ids may then differ from the model's own tokenizer: log it). */
const char *rt_tokenizer_pre(const rt_tokenizer *t);
bool rt_tokenizer_pre_fallback(const rt_tokenizer *t);
/* Merges ignored at load because a side or the result is not an ordinary
 * token of the vocabulary (llama.cpp ignores them too), or the entry has no
 * space separator. */
int64_t rt_tokenizer_merges_skipped(const rt_tokenizer *t);

#endif
