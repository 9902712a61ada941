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
 * for appending. NULL with errno set when it cannot be opened. */
gw_alog *gw_alog_open(const char *path);
/* The stream to write a line to; fflush it after the line's '\n'. */
FILE *gw_alog_file(gw_alog *l);
/* Opens path again (a rotated file is left behind, as nginx does on its
 * reopen signal); the lines queued before go to the old one. -errno, and
 * the old one stays in use, when it cannot be opened. */
int gw_alog_reopen(gw_alog *l, const char *path);
/* Lines dropped since the start: the queue was full, or a write failed. */
uint64_t gw_alog_dropped(const gw_alog *l);
/* Writes what is queued and closes, waiting at most timeout_ms for a
 * stalled reader (then what is left is abandoned, and said on stderr). */
void gw_alog_close(gw_alog *l, int timeout_ms);

#endif
