/* The server half shared by the fuzz targets of the HTTP server
 * (fuzz_h2_server.c, fuzz_http1.c): one server with small limits on a
 * libevent loop, and a handler that answers every request in one of the
 * ways the API allows, chosen by the path's second character: whole
 * (default), streamed at once (s), streamed from a later loop turn (l),
 * reset (r), more than max_stream_buffer (b), paced by on_writable (w), a
 * status with no body (n), or never (h). fz_server_run() puts each input
 * through a socketpair into a new connection (fuzz_loop.h); once the peer
 * end is closed, every stream must be closed and the connection gone. */
#ifndef FUZZ_HTTP_SERVER_H
#define FUZZ_HTTP_SERVER_H

#include "gateway/http/http_internal.h"
#include "fuzz_loop.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#define FZ_STREAM_BUFFER 16384
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
    while (f->paced < PACED_TOTAL && gw_http_pending(f->s) <= FZ_STREAM_BUFFER / 2) {
        if (gw_http_write(f->s, chunk, sizeof(chunk))) {
            gw_http_reset(f->s);
            return;
        }
        f->paced += sizeof(chunk);
    }
    if (f->paced >= PACED_TOTAL && gw_http_end(f->s))
        gw_http_reset(f->s);
}

/* The stream's state, set as its user data; NULL (the stream reset) on no
 * memory. */
static fz_stream *fz_stream_new(gw_http_stream *s)
{
    fz_stream *f = calloc(1, sizeof(*f));
    n_open++;
    if (!f) {
        gw_http_reset(s);
        return NULL;
    }
    f->s = s;
    gw_http_set_user(s, f);
    return f;
}

static void on_request(void *ud, gw_http_stream *s, const gw_http_request *req)
{
    static const gw_http_header h[] = {{"content-type", "text/plain"}, {"x-test", "1"}};
    static uint8_t big[4096];
    fz_stream *f = fz_stream_new(s);
    if (!f)
        return;
    if (!req->method || !req->path || !req->body || !req->protocol)
        abort();
    (void)gw_http_header_get(req, "content-type");
    char mode = req->path[0] == '/' ? req->path[1] : 0;
    switch (mode) {
    case 's': /* streamed at once */
        if (gw_http_begin(s, 200, h, 2) || gw_http_write(s, req->body, req->body_len) || gw_http_end(s))
            gw_http_reset(s);
        break;
    case 'l': /* streamed from a later loop turn: the data source defers first */
        if (gw_http_begin(s, 200, h, 2) || !(f->later = event_new(base, -1, 0, on_later, f)))
            gw_http_reset(s);
        else
            event_active(f->later, EV_TIMEOUT, 0);
        break;
    case 'r':
        gw_http_reset(s);
        break;
    case 'b': /* more than max_stream_buffer */
        if (gw_http_begin(s, 200, h, 2)) {
            gw_http_reset(s);
            break;
        }
        /* Nothing leaves within this call, so the bound must refuse a write
         * by then; but an HTTP/1.x answer to HEAD drops every byte
         * written, and is never refused. */
        for (size_t n = 0; gw_http_write(s, big, sizeof(big)) == 0; n += sizeof(big)) {
            if (n > 2 * FZ_STREAM_BUFFER) {
                if (strcmp(req->method, "HEAD"))
                    abort();
                break;
            }
        }
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
    case 'h': /* never: only the connection's end closes it */
        break;
    default:
        gw_http_respond(s, 200, h, 1, req->body, req->body_len);
    }
}

/* Paths starting "/x" are answered from their head (a refused upload),
 * "/X" reset there; the body that comes after is dropped. */
static void on_head(void *ud, gw_http_stream *s, const gw_http_request *req)
{
    if (!req->method || !req->path || !req->body || req->body_len || !req->protocol)
        abort();
    char mode = req->path[0] == '/' ? req->path[1] : 0;
    if (mode != 'x' && mode != 'X')
        return;
    if (!fz_stream_new(s))
        return;
    static const gw_http_header h[] = {{"content-type", "text/plain"}};
    if (mode == 'X' || gw_http_respond(s, 401, h, 1, "no", 2))
        gw_http_reset(s);
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

static void fz_server_init(void)
{
    signal(SIGPIPE, SIG_IGN);
    base = event_base_new();
    gw_http_limits l;
    gw_http_limits_default(&l);
    l.max_body = 8192;
    l.max_header_list = 4096;
    l.max_stream_buffer = FZ_STREAM_BUFFER;
    l.max_concurrent_streams = 16;
    gw_http_handler h = {
        .on_request = on_request, .on_head = on_head, .on_close = on_close, .on_writable = on_writable};
    if (!base || !(srv = gw_http_server_new(base, &l, &h, NULL)))
        abort();
}

/* One input: `prefix` (may be empty) then `data`, as a peer sends them on
 * a new connection. Aborts on anything left over once the peer is gone. */
static int fz_server_run(const void *prefix, size_t prefix_len, const uint8_t *data, size_t size)
{
    if (!base)
        fz_server_init();
    int sv[2];
    fz_socketpair(sv);
    if (gw_http_server_adopt(srv, sv[0]))
        abort();
    if (prefix_len && write(sv[1], prefix, prefix_len) != (ssize_t)prefix_len)
        abort();
    fz_feed(base, sv[1], data, size);
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

#endif
