/* Prompt-prefix hashes for cache-aware routing (issue 30): the one
 * function that both sides of a worker's prefix cache use on the same
 * bytes. The gateway does not tokenize, so it cannot name the KV blocks a
 * worker holds; instead a request body is cut into chunks where a later
 * request of the same conversation repeats it — one chunk per element of
 * `messages` (a chat resends its earlier turns), or 256-byte pieces of a
 * `prompt` — and hashed as a chain (chunk i's hash covers chunks 0..i, and
 * the model and `tools`, which change every token's KV). A worker hashes
 * the bodies it is sent (the gateway forwards them byte for byte) and
 * reports the chain values it still holds; the gateway looks its request's
 * chain up in each report, longest first, and weighs the prefill a hit
 * saves against the worker's queue (gw_prefix_choose).
 *
 * Raw bytes, not a canonical form: a client resends a conversation's
 * earlier messages as it sent them (the same serializer, the same
 * objects); one that re-spaces them only loses the routing hint, never
 * correctness (the worker's cache checks tokens exactly). The hash is not
 * keyed: regions compare their chains, and a forged collision only steers
 * a request to another healthy worker. Little-endian word loads, written
 * out, so that every machine computes the same values. */
#ifndef GW_PREFIX_H
#define GW_PREFIX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GW_PREFIX_MAX 64           /* chunks hashed per body: a longer conversation's first 64 */
#define GW_PREFIX_CHUNK 256        /* bytes per chunk of a `prompt` */
#define GW_PREFIX_BYTES_PER_TOKEN 4 /* assumed of a worker that has measured none yet */
#define GW_PREFIX_RECENT 64        /* a worker's most recent hashes: what its region's record carries */

typedef struct gw_prefix_chain {
    int n;                        /* chunks hashed; 0: no messages or prompt found */
    uint64_t hash[GW_PREFIX_MAX]; /* hash[i]: the model, tools and chunks 0..i */
    uint32_t end[GW_PREFIX_MAX];  /* body bytes chunks 0..i span (the first chunk's start is 0) */
    uint64_t user;                /* hash of the top-level "user" string; 0: none */
} gw_prefix_chain;

/* 64-bit hash of bytes, continuing from seed; never 0. */
uint64_t gw_prefix_hash(uint64_t seed, const void *data, size_t len);

/* Hashes a request body (any bytes: a body that is not a JSON object, or
 * has neither messages nor prompt, gives n = 0; no allocation, never reads
 * past len). */
void gw_prefix_chain_of(const void *body, size_t len, gw_prefix_chain *out);

/* Chunks of c a holder has: i + 1 for the largest i whose hash[i] is in
 * held (sorted ascending, n entries), else 0. */
int gw_prefix_match(const gw_prefix_chain *c, const uint64_t *held, int n);

/* Body bytes a match of `chunks` covers; c->end[c->n - 1] for the whole
 * chain (0 for none). Prefill is priced by these bytes, at a worker's
 * ms per prompt byte: the gateway does not tokenize, and the worker
 * measures how many of them make a token. */
double gw_prefix_bytes(const gw_prefix_chain *c, int chunks);

/* ---- the choice: expected time to first token ---- */

typedef struct gw_prefix_cand {
    const uint64_t *held; /* sorted ascending */
    int n_held;
    double wait_ms;     /* before this request's prefill would start (its queue) */
    double ms_per_byte; /* its prefill rate, per byte of chunks (gw_prefix_bytes) */
    uint32_t id;         /* stable across requests (a worker's index, a region's name hash) */
} gw_prefix_cand;

/* Candidates whose expected TTFT is within this of the best are near-equal:
 * the session's consistent hash picks among them. */
#define GW_PREFIX_NEAR_FRAC 0.25
#define GW_PREFIX_NEAR_MS 25.0

/* The candidate with the least expected time to first token: wait_ms plus
 * the prefill of the prompt_bytes its cache does not hold. Among the
 * near-equal ones (within GW_PREFIX_NEAR_FRAC + GW_PREFIX_NEAR_MS of the
 * best), a session (non-zero) goes to the one its rendezvous hash with
 * the candidates' ids ranks first, so that its requests stay together
 * while nothing else tells them apart; without one, the best (the first of
 * equals). c may be NULL (nothing cached anywhere). Returns an index into
 * cand, -1 when n is 0; *ttft_ms (may be NULL) gets the chosen one's
 * estimate and *cached_bytes (may be NULL) the bytes its cache holds. */
int gw_prefix_choose(const gw_prefix_chain *c, double prompt_bytes, const gw_prefix_cand *cand, int n,
                     uint64_t session, double *ttft_ms, double *cached_bytes);

/* ---- what a worker holds ---- */

/* Chain values of the prompts a worker served, dropped when it has
 * written more KV since their last use than its pool holds (by then its
 * prefix cache, LRU too, has most likely evicted them), and when more
 * distinct values than the set's capacity arrive (least recently used
 * first). Single-threaded. */
typedef struct gw_prefix_set {
    struct gw_prefix_entry *e;
    int n, cap;
    uint64_t clock; /* use order */
} gw_prefix_set;

/* 0 or -ENOMEM. */
int gw_prefix_set_init(gw_prefix_set *s, int cap);
void gw_prefix_set_free(gw_prefix_set *s);
/* Every chain value of c, as used now (its KV position to be stamped by
 * the next gw_prefix_set_age). */
void gw_prefix_set_add(gw_prefix_set *s, const gw_prefix_chain *c);
/* work: KV tokens the worker has written since it started (prompt tokens
 * computed plus tokens generated); keep: tokens its pool holds. Stamps
 * the values added since the last call with work and drops those last used
 * more than keep tokens of work ago. */
void gw_prefix_set_age(gw_prefix_set *s, double work, double keep);
/* Up to max values, most recently used first. Returns the count. */
int gw_prefix_set_list(const gw_prefix_set *s, uint64_t *out, int max);

/* Sorts values ascending and drops repeats (for gw_prefix_match). Returns
 * the count kept. */
int gw_prefix_sort(uint64_t *v, int n);

#endif
