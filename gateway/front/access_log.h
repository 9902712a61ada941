/* The access log, written by a thread of its own.
 *
 * The loop formats a line into gw_alog_file() and flushes it, as into any
 * FILE; the whole line goes into a bounded queue that the thread writes
 * out. A reader that stops reading (a stalled log shipper on the pipe of
 * stdout, a container runtime's log pipe under back-pressure) fills the
 * queue: then lines are dropped and counted (gw_alog_dropped), where a
 * blocking write on the loop stopped every connection, /healthz and the
 * Redis heartbeats with it. */
#ifndef GW_ACCESS_LOG_H
#define GW_ACCESS_LOG_H

#include <stdint.h>
#include <stdio.h>

typedef struct gw_alog gw_alog;

/* "stdout" and "stderr" are duplicated; anything else is a file opened
 * for appending, created with mode (0640 by default: lines name tenants,
 * models and paths, not for every local user). NULL with errno set when it
 * cannot be opened. */
gw_alog *gw_alog_open(const char *path, unsigned mode);
/* The stream to write a line to; fflush it after the line's '\n'. */
FILE *gw_alog_file(gw_alog *l);
/* Opens path again, created with gw_alog_open's mode (a rotated file is
 * left behind, as nginx does on its reopen signal); the lines queued
 * before go to the old one. -errno, and the old one stays in use, when it
 * cannot be opened. */
int gw_alog_reopen(gw_alog *l, const char *path);
/* Lines dropped since the start: the queue was full, or a write failed. */
uint64_t gw_alog_dropped(const gw_alog *l);
/* Writes what is queued and closes, waiting at most timeout_ms for a
 * stalled reader (then what is left is abandoned, and said on stderr). */
void gw_alog_close(gw_alog *l, int timeout_ms);

/* The path as a log may show it: the value of every query parameter whose
 * name may carry a secret ("key", "api_key", "token", "X-Api-Key",
 * "password", "sig"...: the name, percent-decoded and without regard to
 * case, contains key, token, secret, pass, pwd, auth, sig, session, cookie
 * or cred), and any value shaped like an infergate key ("ig-" and 20 or
 * more base64url characters), becomes REDACTED; a name too long to judge
 * counts as secret. A new string (free it), or NULL out of memory. */
char *gw_alog_redact_path(const char *path);

#endif
