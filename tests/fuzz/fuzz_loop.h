/* The socketpair driving shared by the fuzz targets that play one end of a
 * real connection (fuzz_http_server.h for fuzz_h2_server.c and
 * fuzz_http1.c; fuzz_upstream.c): the code under test owns one end of a
 * nonblocking socketpair on a libevent loop, the target writes the input
 * into the other end while turning the loop and drops whatever comes back.
 * Everything runs in the fuzzer's thread and every loop is bounded. */
#ifndef FUZZ_LOOP_H
#define FUZZ_LOOP_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

/* A nonblocking socketpair; aborts on failure (nothing to fuzz without). */
static inline void fz_socketpair(int sv[2])
{
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == -1)
        abort();
}

/* Reads and drops what the other end sent; true if anything came. */
static inline bool fz_drain(int fd)
{
    static uint8_t buf[65536];
    bool any = false;
    while (read(fd, buf, sizeof(buf)) > 0)
        any = true;
    return any;
}

/* Writes data into fd as the other end reads it, turning base, until all
 * of it is written and two turns in a row brought nothing back, or the
 * other end closed (then the rest is moot). At most 1000 turns: an input
 * that keeps both ends talking does not hang the fuzzer. */
static inline void fz_feed(struct event_base *base, int fd, const uint8_t *data, size_t size)
{
    size_t off = 0;
    int quiet = 0;
    for (int turn = 0; turn < 1000 && (off < size || quiet < 2); turn++) {
        if (off < size) {
            ssize_t w = write(fd, data + off, size - off);
            if (w > 0)
                off += (size_t)w;
            else if (errno != EAGAIN)
                break;
        }
        event_base_loop(base, EVLOOP_NONBLOCK);
        quiet = fz_drain(fd) ? 0 : quiet + 1;
    }
}

#endif
