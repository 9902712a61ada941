/* Closed-loop streaming load for bench_serve.py: C clients, each sending a
 * streamed completion (a prompt of P random token ids, G new tokens,
 * ignore_eos) and its next one when the last ends, over HTTP/2 (h2c) on a
 * few connections to a worker's unix socket. Round 0 of every client is a
 * warm-up; the next R are measured. Prints one JSON object: generated
 * tokens, errors (a request counts when it answered 200 and ended with
 * data: [DONE] on a stream closed without error), the measured wall time,
 * and p50/p99 time-to-first-token (request submitted -> first token event)
 * and time-per-output-token (gaps between one stream's token events), in
 * ms.
 *
 *   bench_loadgen --unix PATH --clients C --rounds R [--prompt P] [--gen G]
 *                 [--vocab V] [--model NAME] [--conns K] [--timeout-s S]
 *                 [--temperature T] [--top-p P]
 *
 * Greedy (temperature 0) unless --temperature says otherwise: T 1 and top_p
 * 1 are what an OpenAI SDK request sends when it names neither.
 *
 * C, not Python: on a 2-core machine the load generator shares the CPU the
 * server is measured with, and httpx took a tenth of a core at 16 clients
 * where this takes a few hundredths of that. */
#include "bench/bench_util.h"

#include <errno.h>
#include <event2/bufferevent.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <jansson.h>
#include <nghttp2/nghttp2.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>

#define MAX_CONNS 4

typedef struct conn conn;

typedef struct client {
    int id, round;
    conn *c;
    char *body;
    size_t body_len, body_off;
    double t0;
    double *stamps;
    int n_stamps, cap_stamps;
    int status;
    bool bad;  /* a line that is not the event we expect, or a reset stream */
    bool done; /* data: [DONE] seen */
    char *line;
    size_t line_len, line_cap;
} client;

struct conn {
    struct bufferevent *bev;
    nghttp2_session *ng;
};

typedef struct run {
    struct event_base *base;
    int clients, rounds, prompt, gen, vocab;
    double temperature, top_p;
    const char *model;
    int running;
    long tokens, errors;
    double first_start, last_end;
    double *ttft, *tpot;
    size_t n_ttft, n_tpot, cap_tpot;
    bool failed;
} run;

static run R;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n);
    if (!q) {
        fprintf(stderr, "bench_loadgen: out of memory\n");
        exit(1);
    }
    return q;
}

/* The request body of client k's round: token 1, then random ids. */
static void make_body(client *k)
{
    uint64_t s = (uint64_t)(1000 * R.clients + k->id) * 1000003u + (uint64_t)k->round;
    size_t cap = 160 + (size_t)R.prompt * 12 + strlen(R.model);
    k->body = xrealloc(k->body, cap);
    size_t n = (size_t)snprintf(k->body, cap, "{\"model\":\"%s\",\"prompt\":[1", R.model);
    for (int i = 1; i < R.prompt; i++)
        n += (size_t)snprintf(k->body + n, cap - n, ",%d", 3 + (int)(splitmix(&s) % (uint64_t)(R.vocab - 3)));
    n += (size_t)snprintf(k->body + n, cap - n,
                          "],\"max_tokens\":%d,\"temperature\":%g,\"top_p\":%g,\"stream\":true,"
                          "\"ignore_eos\":true}",
                          R.gen, R.temperature, R.top_p);
    k->body_len = n;
    k->body_off = 0;
}

static ssize_t read_body(nghttp2_session *s, int32_t sid, uint8_t *buf, size_t len, uint32_t *flags,
                               nghttp2_data_source *src, void *ud)
{
    (void)s, (void)sid, (void)ud;
    client *k = src->ptr;
    size_t n = k->body_len - k->body_off < len ? k->body_len - k->body_off : len;
    memcpy(buf, k->body + k->body_off, n);
    k->body_off += n;
    if (k->body_off == k->body_len)
        *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

static void flush(conn *c)
{
    if (nghttp2_session_send(c->ng) != 0) {
        fprintf(stderr, "bench_loadgen: nghttp2_session_send failed\n");
        R.failed = true;
        event_base_loopbreak(R.base);
    }
}

static void submit(client *k)
{
    char len[24];
    snprintf(len, sizeof(len), "%zu", k->body_len);
    const nghttp2_nv hdrs[] = {
        {(uint8_t *)":method", (uint8_t *)"POST", 7, 4, NGHTTP2_NV_FLAG_NONE},
        {(uint8_t *)":scheme", (uint8_t *)"http", 7, 4, NGHTTP2_NV_FLAG_NONE},
        {(uint8_t *)":authority", (uint8_t *)"localhost", 10, 9, NGHTTP2_NV_FLAG_NONE},
        {(uint8_t *)":path", (uint8_t *)"/v1/completions", 5, 15, NGHTTP2_NV_FLAG_NONE},
        {(uint8_t *)"content-type", (uint8_t *)"application/json", 12, 16, NGHTTP2_NV_FLAG_NONE},
        {(uint8_t *)"content-length", (uint8_t *)len, 14, strlen(len), NGHTTP2_NV_FLAG_NONE},
    };
    nghttp2_data_provider dp = {.source.ptr = k, .read_callback = read_body};
    k->n_stamps = 0;
    k->status = 0;
    k->bad = false;
    k->done = false;
    k->line_len = 0;
    k->t0 = now();
    if (nghttp2_submit_request(k->c->ng, NULL, hdrs, sizeof(hdrs) / sizeof(hdrs[0]), &dp, k) < 0) {
        fprintf(stderr, "bench_loadgen: nghttp2_submit_request failed\n");
        R.failed = true;
        event_base_loopbreak(R.base);
    }
}

/* One SSE line: a token event is a chunk whose choice has no finish_reason. */
static void on_line(client *k, const char *line, size_t n, double t)
{
    if (n < 6 || memcmp(line, "data: ", 6) != 0)
        return;
    if (n == 12 && memcmp(line + 6, "[DONE]", 6) == 0) {
        k->done = true;
        return;
    }
    json_error_t err;
    /* A token may be a NUL byte: "\u0000" is valid JSON. */
    json_t *ev = json_loadb(line + 6, n - 6, JSON_ALLOW_NUL, &err);
    if (!ev) {
        k->bad = true;
        return;
    }
    json_t *ch = json_array_get(json_object_get(ev, "choices"), 0);
    if (ch && json_is_null(json_object_get(ch, "finish_reason"))) {
        if (k->n_stamps == k->cap_stamps) {
            k->cap_stamps = k->cap_stamps ? 2 * k->cap_stamps : 256;
            k->stamps = xrealloc(k->stamps, (size_t)k->cap_stamps * sizeof(double));
        }
        k->stamps[k->n_stamps++] = t;
    }
    json_decref(ev);
}

static int on_data(nghttp2_session *s, uint8_t flags, int32_t sid, const uint8_t *data, size_t len, void *ud)
{
    (void)flags, (void)ud;
    client *k = nghttp2_session_get_stream_user_data(s, sid);
    if (!k)
        return 0;
    const double t = now();
    for (size_t i = 0; i < len; i++) {
        if (data[i] == '\n') {
            on_line(k, k->line, k->line_len, t);
            k->line_len = 0;
            continue;
        }
        if (k->line_len + 1 > k->line_cap) {
            k->line_cap = k->line_cap ? 2 * k->line_cap : 1024;
            k->line = xrealloc(k->line, k->line_cap);
        }
        k->line[k->line_len++] = (char)data[i];
    }
    return 0;
}

static int on_header(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *name, size_t nlen,
                     const uint8_t *value, size_t vlen, uint8_t flags, void *ud)
{
    (void)flags, (void)ud, (void)vlen;
    client *k = nghttp2_session_get_stream_user_data(s, f->hd.stream_id);
    if (k && f->hd.type == NGHTTP2_HEADERS && nlen == 7 && memcmp(name, ":status", 7) == 0)
        k->status = atoi((const char *)value);
    return 0;
}

static bool succeeded(const client *k)
{
    return k->status == 200 && !k->bad && k->done && k->n_stamps > 0;
}

static void record(client *k, double t_end)
{
    if (!succeeded(k)) {
        R.errors++;
        return;
    }
    R.ttft[R.n_ttft++] = k->stamps[0] - k->t0;
    if (R.n_tpot + (size_t)k->n_stamps > R.cap_tpot) {
        R.cap_tpot = 2 * (R.n_tpot + (size_t)k->n_stamps);
        R.tpot = xrealloc(R.tpot, R.cap_tpot * sizeof(double));
    }
    for (int i = 1; i < k->n_stamps; i++)
        R.tpot[R.n_tpot++] = k->stamps[i] - k->stamps[i - 1];
    R.tokens += R.gen;
    R.first_start = k->t0 < R.first_start ? k->t0 : R.first_start;
    R.last_end = t_end > R.last_end ? t_end : R.last_end;
}

static int on_close(nghttp2_session *s, int32_t sid, uint32_t code, void *ud)
{
    (void)ud;
    client *k = nghttp2_session_get_stream_user_data(s, sid);
    if (!k)
        return 0;
    if (k->line_len)
        on_line(k, k->line, k->line_len, now());
    if (code != NGHTTP2_NO_ERROR)
        k->bad = true; /* reset: whatever came is not a whole answer */
    if (k->round > 0)
        record(k, now());
    else if (!succeeded(k))
        R.errors++; /* a failed warm-up counts too */
    if (++k->round <= R.rounds) {
        make_body(k);
        submit(k);
    } else if (--R.running == 0) {
        event_base_loopbreak(R.base);
    }
    return 0;
}

static ssize_t on_send(nghttp2_session *s, const uint8_t *data, size_t len, int flags, void *ud)
{
    (void)s, (void)flags;
    conn *c = ud;
    if (bufferevent_write(c->bev, data, len) != 0)
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    return (ssize_t)len;
}

static void on_read(struct bufferevent *bev, void *arg)
{
    conn *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    size_t n = evbuffer_get_length(in);
    const uint8_t *p = evbuffer_pullup(in, (ssize_t)n);
    if (nghttp2_session_mem_recv(c->ng, p, n) < 0) {
        fprintf(stderr, "bench_loadgen: bad HTTP/2 from the server\n");
        R.failed = true;
        event_base_loopbreak(R.base);
        return;
    }
    evbuffer_drain(in, n);
    flush(c);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    (void)bev, (void)arg;
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
        fprintf(stderr, "bench_loadgen: connection %s\n", what & BEV_EVENT_EOF ? "closed" : "failed");
        R.failed = true;
        event_base_loopbreak(R.base);
    }
}

static void on_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what, (void)arg;
    fprintf(stderr, "bench_loadgen: timed out with %d clients still running\n", R.running);
    R.failed = true;
    event_base_loopbreak(R.base);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The p-th percentile in ms, as JSON (null with no samples): linear
 * interpolation between closest ranks, as bench_serve.py's pct(). */
static const char *pct_ms(double *v, size_t n, double p, char *buf, size_t len)
{
    if (n == 0)
        return "null";
    qsort(v, n, sizeof(double), cmp_double);
    double k = (double)(n - 1) * p / 100.0;
    size_t lo = (size_t)k, hi = lo + 1 < n ? lo + 1 : n - 1;
    snprintf(buf, len, "%.3f", (v[lo] + (v[hi] - v[lo]) * (k - (double)lo)) * 1e3);
    return buf;
}

static const char *arg_str(int argc, char **argv, const char *name, const char *dflt)
{
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0)
            return argv[i + 1];
    return dflt;
}

int main(int argc, char **argv)
{
    const char *path = arg_str(argc, argv, "--unix", NULL);
    R.clients = bench_arg_int(argc, argv, "--clients", 1);
    R.rounds = bench_arg_int(argc, argv, "--rounds", 3);
    R.prompt = bench_arg_int(argc, argv, "--prompt", 128);
    R.gen = bench_arg_int(argc, argv, "--gen", 128);
    R.vocab = bench_arg_int(argc, argv, "--vocab", 32000);
    R.model = arg_str(argc, argv, "--model", "m");
    int n_conns = bench_arg_int(argc, argv, "--conns", MAX_CONNS), timeout_s = bench_arg_int(argc, argv, "--timeout-s", 900);
    R.temperature = atof(arg_str(argc, argv, "--temperature", "0"));
    R.top_p = atof(arg_str(argc, argv, "--top-p", "1"));
    if (!path || !(R.temperature >= 0 && R.temperature <= 2) || !(R.top_p > 0 && R.top_p <= 1) ||
        strlen(path) >= sizeof(((struct sockaddr_un *)0)->sun_path) || R.clients < 1 || R.rounds < 1 ||
        R.prompt < 1 || R.gen < 1 || R.vocab < 4 || n_conns < 1 || timeout_s < 1) {
        fprintf(stderr, "usage: bench_loadgen --unix PATH --clients C --rounds R [--prompt P] [--gen G] "
                        "[--vocab V] [--model NAME] [--conns K] [--timeout-s S] [--temperature 0..2] "
                        "[--top-p (0,1]]\n");
        return 2;
    }
    /* The name goes into the JSON body as it is. */
    for (const char *c = R.model; *c; c++)
        if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20) {
            fprintf(stderr, "bench_loadgen: --model: no quotes, backslashes or control characters\n");
            return 2;
        }
    n_conns = n_conns > R.clients ? R.clients : n_conns;
    n_conns = n_conns > MAX_CONNS ? MAX_CONNS : n_conns;
    R.base = event_base_new();
    R.running = R.clients;
    R.first_start = 1e300;
    R.ttft = calloc((size_t)R.clients * R.rounds, sizeof(double));
    client *ks = calloc((size_t)R.clients, sizeof(client));
    conn cs[MAX_CONNS];
    if (!R.base || !R.ttft || !ks) {
        fprintf(stderr, "bench_loadgen: out of memory\n");
        return 1;
    }

    nghttp2_session_callbacks *cb;
    if (nghttp2_session_callbacks_new(&cb) != 0) {
        fprintf(stderr, "bench_loadgen: out of memory\n");
        return 1;
    }
    nghttp2_session_callbacks_set_send_callback(cb, on_send);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data);
    nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_close);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    strcpy(sa.sun_path, path);
    for (int i = 0; i < n_conns; i++) {
        conn *c = &cs[i];
        c->bev = bufferevent_socket_new(R.base, -1, BEV_OPT_CLOSE_ON_FREE);
        if (!c->bev || bufferevent_socket_connect(c->bev, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
            fprintf(stderr, "bench_loadgen: cannot connect to %s: %s\n", path, strerror(errno));
            return 1;
        }
        bufferevent_setcb(c->bev, on_read, NULL, on_event, c);
        bufferevent_enable(c->bev, EV_READ | EV_WRITE);
        if (nghttp2_session_client_new(&c->ng, cb, c) != 0 ||
            nghttp2_submit_settings(c->ng, NGHTTP2_FLAG_NONE, NULL, 0) != 0) {
            fprintf(stderr, "bench_loadgen: cannot start an HTTP/2 session\n");
            return 1;
        }
    }
    nghttp2_session_callbacks_del(cb);
    for (int i = 0; i < R.clients; i++) {
        ks[i].id = i;
        ks[i].c = &cs[i % n_conns];
        make_body(&ks[i]);
        submit(&ks[i]);
    }
    for (int i = 0; i < n_conns; i++)
        flush(&cs[i]);
    struct event *tev = evtimer_new(R.base, on_timeout, NULL);
    struct timeval tv = {.tv_sec = timeout_s};
    evtimer_add(tev, &tv);
    event_base_dispatch(R.base);
    event_free(tev);

    char p[4][32];
    printf("{\"clients\":%d,\"tokens\":%ld,\"errors\":%ld,\"failed\":%s,\"wall_s\":%.6f,\"ttft_p50_ms\":%s,"
           "\"ttft_p99_ms\":%s,\"tpot_p50_ms\":%s,\"tpot_p99_ms\":%s}\n",
           R.clients, R.tokens, R.errors, R.failed ? "true" : "false", R.tokens ? R.last_end - R.first_start : 0.0,
           pct_ms(R.ttft, R.n_ttft, 50, p[0], sizeof(p[0])), pct_ms(R.ttft, R.n_ttft, 99, p[1], sizeof(p[1])),
           pct_ms(R.tpot, R.n_tpot, 50, p[2], sizeof(p[2])), pct_ms(R.tpot, R.n_tpot, 99, p[3], sizeof(p[3])));
    for (int i = 0; i < n_conns; i++) {
        nghttp2_session_del(cs[i].ng);
        bufferevent_free(cs[i].bev);
    }
    for (int i = 0; i < R.clients; i++) {
        free(ks[i].body);
        free(ks[i].stamps);
        free(ks[i].line);
    }
    free(ks);
    free(R.ttft);
    free(R.tpot);
    event_base_free(R.base);
    return R.failed ? 1 : 0;
}
