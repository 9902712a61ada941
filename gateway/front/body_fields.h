/* The few JSON fields the gateway reads on its request path, without
 * building a document: `model`, the token limit and `stream` of a
 * completion request body (a strict, allocation-free scan of the whole body), and
 * usage.completion_tokens of a response as its bytes stream by (a search
 * that survives the key being split between two chunks).
 *
 * The body scan accepts every body jansson accepts as an object (with
 * JSON_REJECT_DUPLICATES) and then reads the same fields; it rejects
 * malformed JSON (grammar, bad escapes, lone surrogates, \u0000, control
 * characters and ill-formed UTF-8 in strings, nesting deeper than 2048)
 * and repeats of the fields it reads at the top level. Unlike jansson it
 * lets through duplicate keys it does not read and numbers out of range
 * elsewhere: the worker, which parses the body in full, refuses those. */
#ifndef GW_BODY_FIELDS_H
#define GW_BODY_FIELDS_H

#include <stdbool.h>
#include <stddef.h>

#define GW_BODY_MODEL_MAX 128 /* bytes of `model` kept, NUL included */

typedef struct gw_body_fields {
    bool has_model;   /* the top-level "model" is a string */
    size_t model_len; /* its length in bytes, decoded (may be >= GW_BODY_MODEL_MAX) */
    /* NUL-terminated when model_len < GW_BODY_MODEL_MAX, else its first
     * GW_BODY_MODEL_MAX - 1 bytes (possibly cut inside a UTF-8 sequence) */
    char model[GW_BODY_MODEL_MAX];
    /* max_completion_tokens when it is an integer, else max_tokens when it
     * is one, else -1 (negative values are returned as they are). A real
     * with an integral value (100.0, 1e2) counts as that integer, as the
     * worker takes it. */
    long long max_tokens;
    /* integers anywhere in a top-level "prompt" array: token ids (one
     * token each, whatever their digits' length) */
    long long prompt_ids;
    bool stream; /* the top-level "stream" is true */
} gw_body_fields;

/* Scans a request body that must be one JSON object. 0 with *out filled,
 * -EINVAL with a reason in err ("unexpected end of input at byte 12",
 * "duplicate key 'model'", ...), or -ENOMEM. */
int gw_body_fields_scan(const void *body, size_t len, gw_body_fields *out, char *err, size_t err_len);

/* Reads usage.completion_tokens from a response body (JSON or an SSE
 * stream of JSON events) fed in pieces: any key "completion_tokens" whose
 * value is an integer in 0..INT_MAX counts, the last one wins. */
typedef struct gw_usage_scan {
    int tokens;             /* -1 until one was read */
    int state;              /* 0 searching; 1 after the key; 2 in its digits */
    long long acc;          /* digits so far, saturated above INT_MAX */
    unsigned char tail[20]; /* the last bytes fed, for a key split between feeds */
    size_t tail_len;
} gw_usage_scan;

void gw_usage_scan_init(gw_usage_scan *u);
void gw_usage_scan_feed(gw_usage_scan *u, const void *data, size_t len);

#endif
