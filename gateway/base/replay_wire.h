/* Token replay's wire format (issue 32), both sides of it: the worker
 * writes it (gateway/worker/worker.c), the gateway reads it
 * (gateway/front/replay.c), a peer region's gateway passes it on.
 *
 * - A tag line opens each event of a streamed answer that can be resumed:
 *   ": ig TOKEN\n", or ": ig TOKEN end\n" on the answer's last token; a
 *   token whose text is held back gets an event of its own (the tag line
 *   and a blank line). SSE clients ignore comment lines, but the gateway
 *   strips them all the same.
 * - x-infergate-resume: "ID CREATED SEED[ T1,T2,...]", the run a resumed
 *   request continues (its answer's id and created, its sampler's seed)
 *   and the tokens already delivered.
 *
 * Both come from outside the reading process (a peer region's gateway,
 * over verified TLS, for the gateway; a gateway for a worker), so their
 * parsers take any bytes. Numbers are written in one form only (decimal,
 * no sign, no leading zero): a header that parses formats back to the same
 * bytes. */
#ifndef GW_REPLAY_WIRE_H
#define GW_REPLAY_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GW_REPLAY_TAG ": ig "
#define GW_REPLAY_TAG_LEN (sizeof(GW_REPLAY_TAG) - 1)
#define GW_REPLAY_TAG_MAX 32 /* bytes of a formatted tag, its NUL included */
#define GW_REPLAY_ID_MAX 40  /* an answer's id, its NUL included */

/* The tag for token, into buf (GW_REPLAY_TAG_MAX bytes): its line, and a
 * blank line after it when alone (no text goes out in its event). Returns
 * its length. */
size_t gw_replay_tag_format(char *buf, int32_t token, bool end, bool alone);

/* One tag line, without its newline (GW_REPLAY_TAG included): 0 with the
 * token and whether it is the last, or -EPROTO. */
int gw_replay_tag_parse(const uint8_t *line, size_t len, int32_t *token, bool *end);

/* Where the event stream's reader puts what it reads. A callback returning
 * nonzero stops the scan, which returns that value. */
typedef struct gw_replay_scan_cbs {
    int (*pass)(void *ud, const uint8_t *b, size_t len); /* bytes for the client, in order */
    int (*tag)(void *ud, int32_t token, bool end);       /* a token delivered with them */
} gw_replay_scan_cbs;

/* Reads the whole events of b[0..len) (each ends with a blank line): their
 * bytes go to cb->pass, tag lines left out and given to cb->tag. seen:
 * bytes at the start of b already read by the previous call, known to hold
 * no whole event (only a speed-up: 0 is always right). *end is set once a
 * last token's tag is read; until then an error event ("data: {\"error\"")
 * is the upstream failing in-band: it is not passed, and 1 is returned
 * with *used at its start. Else returns 0, -EPROTO for a malformed tag, or
 * a callback's value; *used: the bytes of whole events read. */
int gw_replay_scan(const uint8_t *b, size_t len, size_t seen, bool *end, const gw_replay_scan_cbs *cb,
                   void *ud, size_t *used);

/* A parsed x-infergate-resume; tokens is the caller's to free (NULL when
 * there are none). */
typedef struct gw_replay_resume {
    char id[GW_REPLAY_ID_MAX];
    long created;
    uint64_t seed;
    int32_t *tokens;
    int n_tokens;
} gw_replay_resume;

/* Parses v: 0, -EINVAL (malformed: an id of 1 to GW_REPLAY_ID_MAX - 1
 * visible ASCII bytes, created and seed as unsigned decimals that fit,
 * each token one from 0 to INT32_MAX, single spaces and commas), or
 * -ENOMEM. r is left empty on failure. */
int gw_replay_resume_parse(const char *v, gw_replay_resume *r);

#endif
