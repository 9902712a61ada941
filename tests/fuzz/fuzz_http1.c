/* libFuzzer target for the HTTP/1.x server session: the input is what a
 * client sends on a cleartext connection (request heads, bodies in both
 * framings, pipelined requests, garbage; an input that starts with the
 * HTTP/2 preface goes to the HTTP/2 session instead, as on a real port).
 * It goes through a socketpair into a real server connection on a
 * libevent loop, with a handler that answers every request in one of the
 * ways the API allows, chosen by the path's second character: whole
 * (default), streamed at once (s), streamed from a later loop turn (l),
 * reset (r), more than max_stream_buffer (b), paced by on_writable (w), or
 * never (h). The loop runs until the connection is quiet, the peer end is
 * closed, and then every stream must be closed and the connection gone.
 *
 * Build: cmake -B build-fuzz -DCMAKE_C_COMPILER=clang -DINFERGATE_FUZZ=ON
 *        && cmake --build build-fuzz --target fuzz_http1
 * Run:   ./build-fuzz/fuzz_http1 -dict=tests/fuzz/http1.dict -max_total_time=180 \
 *            CORPUS_DIR tests/fuzz/corpus_http1 */
#include "gateway/http_internal.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

#define PACED_TOTAL (64 * 1024)

static struct event_base *base;
static gw_http_server *srv;
static size_t n_open; /* on_request minus on_close */

typedef struct fz_stream {
    gw_http_stream *s;
    struct event *later;
    size_t paced;
} fz_stream;

static void on_later(evutil_socket_t fd, short what, void *arg)
{
    fz_stream *f = arg;
    static const char piece[] = "data: {\"token\":\"x\"}\n\n";
    if (gw_http_write(f->s, piece, sizeof(piece) - 1) == 0)
        gw_http_end(f->s);
    else
        gw_http_reset(f->s);
}

static void paced_write(fz_stream *f)
{
    static uint8_t chunk[4096];
    while (f->paced < PACED_TOTAL && gw_http_pending(f->s) <= 16384 / 2) {
        if (gw_http_write(f->s, chunk, sizeof(chunk))) {
            gw_http_reset(f->s);
            return;
        }
        f->paced += sizeof(chunk);
    }
    if (f->paced >= PACED_TOTAL && gw_http_end(f->s))
        gw_http_reset(f->s);
}

static void on_request(void *ud, gw_http_stream *s, const gw_http_request *req)
{
    static const gw_http_header h[] = {{"content-type", "text/plain"}, {"x-test", "1"}};
    static uint8_t big[4096];
    fz_stream *f = calloc(1, sizeof(*f));
    n_open++;
    if (!f) {
        gw_http_reset(s);
        return;
    }
    f->s = s;
    gw_http_set_user(s, f);
    if (!req->method || !req->path || !req->body || !req->protocol)
        abort();
    (void)gw_http_header_get(req, "content-type");
    char mode = req->path[0] == '/' ? req->path[1] : 0;
    switch (mode) {
    case 's':
        if (gw_http_begin(s, 200, h, 2) || gw_http_write(s, req->body, req->body_len) || gw_http_end(s))
            gw_http_reset(s);
        break;
    case 'l':
        if (gw_http_begin(s, 200, h, 2) || !(f->later = event_new(base, -1, 0, on_later, f)))
            gw_http_reset(s);
        else
            event_active(f->later, EV_TIMEOUT, 0);
        break;
    case 'r':
        gw_http_reset(s);
        break;
    case 'b':
        if (gw_http_begin(s, 200, h, 2)) {
            gw_http_reset(s);
            break;
        }
        while (gw_http_write(s, big, sizeof(big)) == 0)
            ;
        gw_http_reset(s);
        break;
    case 'w':
        if (gw_http_begin(s, 200, h, 2))
            gw_http_reset(s);
        else
            paced_write(f);
        break;
    case 'n': /* a status with no body: what is written is dropped */
        if (gw_http_begin(s, 204, h, 1) || gw_http_write(s, "x", 1) || gw_http_end(s))
            gw_http_reset(s);
        break;
    case 'h':
        break;
    default:
        gw_http_respond(s, 200, h, 1, req->body, req->body_len);
    }
}

static void on_writable(void *ud, gw_http_stream *s, void *stream_ud)
{
    fz_stream *f = stream_ud;
    if (!f || f->s != s)
        abort();
    if (f->paced)
        paced_write(f);
}

static void on_close(void *ud, gw_http_stream *s, void *stream_ud, bool finished)
{
    fz_stream *f = stream_ud;
    if (!f || f->s != s)
        abort();
    if (f->later)
        event_free(f->later);
    free(f);
    n_open--;
}

static void init(void)
{
    signal(SIGPIPE, SIG_IGN);
    base = event_base_new();
    gw_http_limits l;
    gw_http_limits_default(&l);
    l.max_body = 8192;
    l.max_header_list = 4096;
    l.max_stream_buffer = 16384;
    l.max_concurrent_streams = 16;
    gw_http_handler h = {.on_request = on_request, .on_close = on_close, .on_writable = on_writable};
    if (!base || !(srv = gw_http_server_new(base, &l, &h, NULL)))
        abort();
}

/* Reads what the server sent; true if anything came. */
static bool drain(int fd)
{
    static uint8_t buf[65536];
    bool any = false;
    while (read(fd, buf, sizeof(buf)) > 0)
        any = true;
    return any;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!base)
        init();
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == -1)
        abort();
    if (gw_http_server_adopt(srv, sv[0]))
        abort();
    size_t off = 0;
    int quiet = 0;
    for (int turn = 0; turn < 1000 && (off < size || quiet < 2); turn++) {
        if (off < size) {
            ssize_t w = write(sv[1], data + off, size - off);
            if (w > 0)
                off += (size_t)w;
            else if (errno != EAGAIN)
                break; /* the server closed: the rest is moot */
        }
        event_base_loop(base, EVLOOP_NONBLOCK);
        quiet = drain(sv[1]) ? 0 : quiet + 1;
    }
    close(sv[1]);
    for (int turn = 0; turn < 100 && srv->conns; turn++)
        event_base_loop(base, EVLOOP_NONBLOCK);
    /* The peer is gone: its connection, and every stream, must be too. */
    if (srv->conns || n_open || gw_http_server_active_streams(srv)) {
        fprintf(stderr, "leftover: conns %zu, app streams %zu, streams %zu\n", srv->n_conns, n_open,
                gw_http_server_active_streams(srv));
        abort();
    }
    return 0;
}
