/* gateway: the access log's writer thread (see access_log.h).
 *
 * The FILE the loop writes to is a cookie stream: stdio hands its buffer
 * over at each fflush, a line is gathered whole (a line longer than the
 * stream's buffer arrives in pieces) and only then queued, so a line is
 * written or dropped entire. Two buffers: the loop fills one while the
 * thread writes the other. The thread never holds the lock across a
 * write, so the loop never waits on the log's reader. */
#define _GNU_SOURCE /* fopencookie, pthread_timedjoin_np */
#include "gateway/front/access_log.h"
#include "gateway/base/url.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define ALOG_QUEUE_BYTES (1u << 20) /* each of the two buffers */
#define ALOG_LINE_MAX ALOG_QUEUE_BYTES

struct gw_alog {
    FILE *f;
    /* the line being gathered: the loop's alone */
    char *line;
    size_t line_len, line_cap;
    bool line_over; /* past ALOG_LINE_MAX: dropped at its '\n' */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    char *pend, *out; /* filled by the loop, written by the thread */
    size_t pend_len;
    int fd, next_fd;  /* next_fd: a reopened file, taken up by the thread */
    size_t switch_at; /* with next_fd: pend's bytes before it go to fd */
    bool stop;
    bool abandoned, exited; /* close gave up on the thread, which frees l */
    pthread_t thread;
    atomic_uint_fast64_t dropped;
    unsigned mode; /* a file's, when created */
};

static int open_fd(const char *path, unsigned mode)
{
    if (!strcmp(path, "stdout") || !strcmp(path, "stderr"))
        return fcntl(!strcmp(path, "stdout") ? 1 : 2, F_DUPFD_CLOEXEC, 3);
    return open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, (mode_t)mode);
}

static uint64_t count_lines(const char *p, size_t n)
{
    uint64_t c = 0;
    for (const char *e = p + n; (p = memchr(p, '\n', (size_t)(e - p))) != NULL; p++)
        c++;
    return c;
}

/* Writes one run of whole lines, or counts them as dropped on an error
 * (the reader closed the pipe, the disk is full). */
static void write_run(gw_alog *l, int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            atomic_fetch_add(&l->dropped, count_lines(p, n));
            return;
        }
        p += w;
        n -= (size_t)w;
    }
}

/* Whole lines, at most PIPE_BUF bytes a write (a longer line alone): on a
 * pipe or socket shared with stderr (2>&1, the journal's stream), a write
 * that size is atomic, so the gateway's and the workers' messages land
 * between lines, never inside one. */
static void write_lines(gw_alog *l, int fd, const char *p, size_t n)
{
    while (n > 0) {
        size_t run = 0;
        for (;;) {
            const char *nl = memchr(p + run, '\n', n - run);
            size_t end = nl ? (size_t)(nl - p) + 1 : n;
            if (run > 0 && end > PIPE_BUF)
                break;
            run = end;
            if (run >= PIPE_BUF || run == n)
                break;
        }
        write_run(l, fd, p, run);
        p += run;
        n -= run;
    }
}

static void release(gw_alog *l)
{
    close(l->fd);
    if (l->next_fd >= 0)
        close(l->next_fd);
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
    free(l->line);
    free(l->pend);
    free(l->out);
    free(l);
}

static void *writer(void *arg)
{
    gw_alog *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->pend_len && l->next_fd < 0 && !l->stop)
            pthread_cond_wait(&l->cv, &l->mu);
        if (!l->pend_len && l->next_fd < 0)
            break; /* stopped, all written */
        char *buf = l->pend;
        size_t n = l->pend_len, at = l->next_fd >= 0 ? l->switch_at : n;
        int old = l->fd, fd = l->next_fd >= 0 ? l->next_fd : old;
        l->pend = l->out;
        l->out = buf;
        l->pend_len = 0;
        l->fd = fd;
        l->next_fd = -1;
        pthread_mutex_unlock(&l->mu);
        /* what was queued before a reopen goes to the file it was
         * written for */
        write_lines(l, old, buf, at);
        if (fd != old)
            close(old);
        write_lines(l, fd, buf + at, n - at);
        pthread_mutex_lock(&l->mu);
    }
    l->exited = true;
    bool abandoned = l->abandoned;
    pthread_mutex_unlock(&l->mu);
    if (abandoned)
        release(l);
    return NULL;
}

static void queue_line(gw_alog *l, const char *p, size_t n)
{
    pthread_mutex_lock(&l->mu);
    bool fits = l->pend_len + n <= ALOG_QUEUE_BYTES;
    if (fits) {
        memcpy(l->pend + l->pend_len, p, n);
        l->pend_len += n;
        pthread_cond_signal(&l->cv);
    }
    pthread_mutex_unlock(&l->mu);
    if (!fits)
        atomic_fetch_add(&l->dropped, 1);
}

static bool line_add(gw_alog *l, const char *p, size_t n)
{
    if (l->line_over || l->line_len + n > ALOG_LINE_MAX) {
        l->line_over = true;
        return true;
    }
    if (l->line_len + n > l->line_cap) {
        size_t cap = l->line_cap ? l->line_cap : 4096;
        while (cap < l->line_len + n)
            cap *= 2;
        char *b = realloc(l->line, cap);
        if (!b)
            return false;
        l->line = b;
        l->line_cap = cap;
    }
    memcpy(l->line + l->line_len, p, n);
    l->line_len += n;
    return true;
}

static ssize_t cookie_write(void *c, const char *buf, size_t size)
{
    gw_alog *l = c;
    for (size_t at = 0; at < size;) {
        const char *nl = memchr(buf + at, '\n', size - at);
        size_t n = nl ? (size_t)(nl - (buf + at)) + 1 : size - at;
        /* a whole line needs no gathering (the usual case) */
        if (nl && !l->line_len && !l->line_over) {
            queue_line(l, buf + at, n);
        } else {
            if (!line_add(l, buf + at, n))
                l->line_over = true; /* out of memory: this line is lost */
            if (nl && l->line_over)
                atomic_fetch_add(&l->dropped, 1);
            else if (nl)
                queue_line(l, l->line, l->line_len);
        }
        if (nl) {
            l->line_len = 0;
            l->line_over = false;
        }
        at += n;
    }
    return (ssize_t)size; /* never an error: the stream must stay usable */
}

gw_alog *gw_alog_open(const char *path, unsigned mode)
{
    gw_alog *l = calloc(1, sizeof(*l));
    if (!l)
        return NULL;
    l->fd = l->next_fd = -1;
    l->mode = mode;
    int e = ENOMEM;
    if (!(l->pend = malloc(ALOG_QUEUE_BYTES)) || !(l->out = malloc(ALOG_QUEUE_BYTES)))
        goto fail;
    if ((l->fd = open_fd(path, mode)) < 0) {
        e = errno;
        goto fail;
    }
    static const cookie_io_functions_t io = {.write = cookie_write};
    if (!(l->f = fopencookie(l, "w", io)))
        goto fail;
    setvbuf(l->f, NULL, _IOFBF, 1 << 16);
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    /* Signals go to the loop's thread (serve.c blocks them there while it
     * stops, counting on them to wait), never to this one. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    e = pthread_create(&l->thread, NULL, writer, l);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (e) {
        pthread_cond_destroy(&l->cv);
        pthread_mutex_destroy(&l->mu);
        fclose(l->f);
        goto fail;
    }
    return l;
fail:
    if (l->fd >= 0)
        close(l->fd);
    free(l->pend);
    free(l->out);
    free(l);
    errno = e;
    return NULL;
}

FILE *gw_alog_file(gw_alog *l)
{
    return l->f;
}

int gw_alog_reopen(gw_alog *l, const char *path)
{
    int fd = open_fd(path, l->mode);
    if (fd < 0)
        return -errno;
    pthread_mutex_lock(&l->mu);
    if (l->next_fd >= 0)
        close(l->next_fd); /* two reopens before the thread took the first */
    else
        l->switch_at = l->pend_len;
    l->next_fd = fd;
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
    return 0;
}

uint64_t gw_alog_dropped(const gw_alog *l)
{
    return atomic_load(&((gw_alog *)l)->dropped);
}

void gw_alog_close(gw_alog *l, int timeout_ms)
{
    if (!l)
        return;
    fclose(l->f);
    pthread_mutex_lock(&l->mu);
    l->stop = true;
    size_t left = l->pend_len;
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
    if (until.tv_nsec >= 1000000000) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000;
    }
    if (pthread_timedjoin_np(l->thread, NULL, &until) != 0) {
        /* blocked in a write to a reader that stopped: left to finish (or
         * to end with the process), and to free l; once the lock is let
         * go, l may be gone */
        pthread_mutex_lock(&l->mu);
        bool exited = l->exited;
        if (!exited) {
            pthread_detach(l->thread);
            l->abandoned = true;
        }
        pthread_mutex_unlock(&l->mu);
        if (!exited) {
            fprintf(stderr,
                    "infergate: access log: its reader has stopped reading; about %zu bytes not written\n",
                    left);
            return;
        }
        pthread_join(l->thread, NULL); /* ended just past the deadline */
    }
    release(l);
}

/* ---- what a line may show ---- */

/* A parameter name that may carry a secret. Decoded until no escape is
 * left (a name encoded twice, "%256bey", reads "key" to whatever decodes it
 * twice), at most a few times. */
static bool secret_name(const char *s, size_t n)
{
    static const char *const words[] = {"key",  "token",   "secret", "pass",   "pwd",
                                        "auth", "sig",     "session", "cookie", "cred"};
    char buf[256];
    if (n >= sizeof(buf))
        return true;
    memcpy(buf, s, n);
    for (int round = 0; round < 4; round++) {
        size_t m = (size_t)gw_url_decode(buf, n, buf, n);
        if (m == n) /* nothing was decoded: no escape is left */
            break;
        n = m;
    }
    if (memchr(buf, '\0', n)) /* "k%00ey": what reads it may skip the NUL */
        return true;
    buf[n] = '\0';
    for (size_t i = 0; i < n; i++)
        buf[i] = (char)(buf[i] >= 'A' && buf[i] <= 'Z' ? buf[i] + 32 : buf[i]);
    for (size_t w = 0; w < sizeof(words) / sizeof(words[0]); w++)
        if (strstr(buf, words[w]))
            return true;
    return false;
}

/* A key as `infergate key` makes them ("ig-" and base64url): a key under a
 * name no list foresaw. */
static bool key_shaped(const char *s, size_t n)
{
    if (n < 23 || strncmp(s, "ig-", 3))
        return false;
    size_t run = 0;
    for (size_t i = 3; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-' || c == '_')
            run++;
        else
            break;
    }
    return run >= 20;
}

char *gw_alog_redact_path(const char *path)
{
    size_t len = strlen(path), params = 1;
    const char *q = strchr(path, '?');
    for (const char *c = q; c && *c; c++)
        params += *c == '&' || *c == ';';
    static const char red[] = "REDACTED";
    char *out = malloc(len + params * (sizeof(red) - 1) + 1);
    if (!out)
        return NULL;
    size_t o = q ? (size_t)(q + 1 - path) : len;
    memcpy(out, path, o);
    for (const char *p = q ? q + 1 : NULL; p && *p;) {
        size_t n = strcspn(p, "&;");
        const char *eq = memchr(p, '=', n);
        size_t name_n = eq ? (size_t)(eq - p) : n;
        if (key_shaped(p, name_n)) { /* a bare key: "?ig-..." */
            memcpy(out + o, red, sizeof(red) - 1);
            o += sizeof(red) - 1;
        } else {
            memcpy(out + o, p, name_n + (eq != NULL));
            o += name_n + (eq != NULL);
            const char *v = eq ? eq + 1 : p + n;
            size_t vn = (size_t)(p + n - v);
            if (eq && (secret_name(p, name_n) || key_shaped(v, vn))) {
                memcpy(out + o, red, sizeof(red) - 1);
                o += sizeof(red) - 1;
            } else {
                memcpy(out + o, v, vn);
                o += vn;
            }
        }
        p += n;
        if (*p)
            out[o++] = *p++;
    }
    out[o] = '\0';
    return out;
}
