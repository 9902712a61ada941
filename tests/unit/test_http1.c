/* Tests of the HTTP server's HTTP/1.x sessions (gateway/http/http1.c) and of
 * the protocol choice on a cleartext port (gateway/http/server.c): curl
 * --http1.1 and --http1.0 as child processes for what clients do (GET,
 * POST with Content-Length and chunked bodies, keep-alive, streamed
 * responses, HEAD, 413), raw sockets for what they do not (malformed
 * requests, pipelining, a head that never ends, a peer that never reads),
 * and curl --http2-prior-knowledge on the same port. See http_harness.h
 * for the handler's paths. Nothing asserts on timing. */
#include "http_harness.h"

HARNESS_SETUP(setup, harness_new_tcp, 0)
/* Small bounds so that the limit tests stay fast. */
HARNESS_SETUP(setup_small, harness_new_tcp, .max_body = 100000, .max_header_list = 4096,
              .max_stream_buffer = 256 << 10)
HARNESS_SETUP(setup_timeouts, harness_new_tcp, .header_timeout_ms = 200, .idle_timeout_ms = 300)
HARNESS_SETUP(setup_two_conns, harness_new_tcp, .max_connections = 2)
/* Four streams of /paced (64 KiB writes) fill half the server's bound
 * between them and stay within the whole: 320 + 320 + 192 + 192 KiB. */
HARNESS_SETUP(setup_held, harness_new_tcp, .max_stream_buffer = 512 << 10, .max_conn_buffer = 512 << 10,
              .max_buffer = 1 << 20)

/* ---- with curl ---- */

static void test_get(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOL("curl");
    char **argv = curl_argv(t, "--http1.1", "-o", scratch(t, "body"), "-D", scratch(t, "head"), "-w",
                            "%{http_code} %{http_version}", url(t, "/hello"), NULL);
    assert_int_equal(run_child(t, argv, "meta"), 0);
    expect_output(t, "meta", "200 1.1");
    expect_output(t, "body", "hello world\n");
    char *head = child_out(t, "head");
    expect_date_header(head);
    free(head);
    assert_string_equal(t->protocol, "HTTP/1.1");
    char want[64];
    snprintf(want, sizeof(want), "127.0.0.1:%d", t->port);
    assert_string_equal(t->authority, want);
    expect_finished(t, 1);
    assert_int_equal(gw_http_server_active_streams(t->srv), 0);
}

/* A client that shuts its side after pipelining gets every answer. */
static void test_pipelined_half_close(void **state)
{
    tsrv *t = *state;
    static const char req[] = "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n";
    int fd = raw_connect(t, 0);
    for (int i = 0; i < 5; i++)
        raw_send(fd, req, sizeof(req) - 1);
    shutdown(fd, SHUT_WR);
    char *got = raw_read_all(t, fd, 1 << 16, NULL);
    close(fd);
    int n = 0;
    for (const char *p = got; (p = strstr(p, "HTTP/1.1 200 OK\r\n")); p++)
        n++;
    assert_int_equal(n, 5);
    free(got);
    assert_true(run_until(t, no_streams, NULL));
}

/* A later minor version is served as HTTP/1.1 (RFC 9112 2.3). */
static void test_later_minor(void **state)
{
    tsrv *t = *state;
    static const char req[] = "GET /hello HTTP/1.2\r\nHost: x\r\nConnection: close\r\n\r\n";
    char *got = raw_exchange(t, req, sizeof(req) - 1);
    assert_true(!strncmp(got, "HTTP/1.1 200 ", 13));
    assert_non_null(strstr(got, "hello world\n"));
    free(got);
    assert_string_equal(t->protocol, "HTTP/1.1");
}

/* HTTP/1.1 and HTTP/2 with prior knowledge on one port. */
static void test_h2c_same_port(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOL("curl");
    char **h2 = curl_argv(t, "--http2-prior-knowledge", "-o", scratch(t, "b2"), "-w", "%{http_version}",
                          url(t, "/hello"), NULL);
    assert_int_equal(run_child(t, h2, "m2"), 0);
    expect_output(t, "m2", "2");
    expect_output(t, "b2", "hello world\n");
    assert_string_equal(t->protocol, "HTTP/2");
    char **h1 =
        curl_argv(t, "--http1.1", "-o", scratch(t, "b1"), "-w", "%{http_version}", url(t, "/hello"), NULL);
    assert_int_equal(run_child(t, h1, "m1"), 0);
    expect_output(t, "m1", "1.1");
    assert_string_equal(t->protocol, "HTTP/1.1");
    expect_finished(t, 2);
}

static void test_post(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOL("curl");
    post_echo(t, 3, "--http1.1", NULL);
    post_echo(t, (1 << 20) - 1, "--http1.1", "-H", "Expect:", NULL);
    post_echo(t, (1 << 20) - 1, "--http1.1", "-H", "Expect: 100-continue", NULL);
    post_echo(t, 5, "--http1.1", "-H", "Transfer-Encoding: chunked", NULL);
    post_echo(t, (1 << 20) - 1, "--http1.1", "-H", "Transfer-Encoding: chunked", "-H", "Expect:", NULL);
    post_echo(t, (1 << 20) - 1, "--http1.1", "-H", "Transfer-Encoding: chunked", "-H", "Expect: 100-continue",
              NULL);
    expect_finished(t, 6);
}

/* Two URLs in one curl: the second reuses the connection. */
static void test_keep_alive(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOL("curl");
    char **argv = curl_argv(t, "--http1.1", "-o", "/dev/null", "-o", "/dev/null", "-w",
                            "%{http_code}:%{num_connects},", url(t, "/hello"), url(t, "/stream"), NULL);
    assert_int_equal(run_child(t, argv, "meta"), 0);
    expect_output(t, "meta", "200:1,200:0,");
    expect_finished(t, 2);
}

static void test_streaming(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOL("curl");
    char **argv = curl_argv(t, "--http1.1", "-N", "-D", scratch(t, "head"), "-o", scratch(t, "out"),
                            url(t, "/stream"), NULL);
    assert_int_equal(run_child(t, argv, "meta"), 0);
    expect_output(t, "out", ten_pieces);
    char *head = child_out(t, "head");
    assert_non_null(strstr(head, "transfer-encoding: chunked\r\n"));
    assert_null(strstr(head, "content-length"));
    free(head);
    expect_finished(t, 1);
}

/* A stream of a length said in advance: Content-Length, not chunked; to an
 * HTTP/1.0 client the connection stays. One that ends short is cut. */
static void test_sized_stream(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOL("curl");
    const char *versions[] = {"--http1.1", "--http1.0"};
    for (int v = 0; v < 2; v++) {
        char **argv = curl_argv(t, versions[v], "-H", "Connection: keep-alive", "-D", scratch(t, "head"),
                                "-o", scratch(t, "out"), url(t, "/sized"), NULL);
        assert_int_equal(run_child(t, argv, "meta"), 0);
        expect_output(t, "out", ten_pieces);
        char *head = child_out(t, "head");
        assert_non_null(strstr(head, "content-length: 80\r\n"));
        assert_null(strstr(head, "content-length: 3"));
        assert_null(strstr(head, "transfer-encoding"));
        assert_null(strstr(head, "connection: close"));
        free(head);
    }
    char **argv = curl_argv(t, "--http1.1", "-o", scratch(t, "out"), url(t, "/sized-short"), NULL);
    assert_int_not_equal(run_child(t, argv, "meta"), 0); /* the body is cut: curl says so */
    expect_output(t, "out", ten_pieces);
    int three = 3;
    assert_true(run_until(t, closes_reach, &three));
    assert_int_equal(t->n_finished, 2);
    assert_int_equal(t->n_unfinished, 1);
    /* HEAD, on a connection the client keeps: the length said, the pieces
     * dropped, the end whole (the harness checks gw_http_end gives 0). */
    int fd = raw_connect(t, 0);
    static const char head_req[] = "HEAD /sized HTTP/1.1\r\nHost: x\r\n\r\n";
    raw_send(fd, head_req, sizeof(head_req) - 1);
    int four = 4;
    assert_true(run_until(t, closes_reach, &four));
    assert_int_equal(t->n_finished, 3);
    close(fd);
}

/* HTTP/1.0: no chunked coding; a stream ends with the connection. */
static void test_http10(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOL("curl");
    char **a =
        curl_argv(t, "--http1.0", "-D", scratch(t, "h1"), "-o", scratch(t, "b1"), url(t, "/hello"), NULL);
    assert_int_equal(run_child(t, a, "m1"), 0);
    expect_output(t, "b1", "hello world\n");
    assert_string_equal(t->protocol, "HTTP/1.0");
    char *head = child_out(t, "h1");
    assert_non_null(strstr(head, "content-length: 12\r\n"));
    assert_non_null(strstr(head, "connection: close\r\n"));
    free(head);
    char **b =
        curl_argv(t, "--http1.0", "-D", scratch(t, "h2"), "-o", scratch(t, "b2"), url(t, "/stream"), NULL);
    assert_int_equal(run_child(t, b, "m2"), 0);
    expect_output(t, "b2", ten_pieces);
    head = child_out(t, "h2");
    assert_null(strstr(head, "transfer-encoding"));
    free(head);
    /* HTTP/1.0 with keep-alive asked for, raw: both answers on one connection. */
    static const char req[] = "GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
                              "GET /hello HTTP/1.0\r\n\r\n";
    char *got = raw_exchange(t, req, sizeof(req) - 1);
    const char *second = strstr(got, "connection: keep-alive\r\n");
    assert_non_null(second);
    assert_non_null(strstr(second, "hello world\nHTTP/1.1 200 OK\r\n"));
    free(got);
    expect_finished(t, 4);
}

static void test_head(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOL("curl");
    char **argv = curl_argv(t, "--http1.1", "-I", "-o", scratch(t, "head"), url(t, "/hello"), NULL);
    assert_int_equal(run_child(t, argv, "meta"), 0);
    char *head = child_out(t, "head");
    assert_non_null(strstr(head, "HTTP/1.1 200 OK\r\n"));
    assert_non_null(strstr(head, "content-length: 12\r\n"));
    free(head);
    /* A streamed answer to HEAD has no body either; the connection goes on. */
    static const char req[] = "HEAD /stream HTTP/1.1\r\nHost: x\r\n\r\nGET /hello HTTP/1.1\r\nHost: x\r\n"
                              "Connection: close\r\n\r\n";
    char *got = raw_exchange(t, req, sizeof(req) - 1);
    assert_null(strstr(got, "piece"));
    assert_non_null(strstr(got, "\r\n\r\nHTTP/1.1 200 OK\r\n"));
    assert_non_null(strstr(got, "hello world\n"));
    free(got);
    /* Nor has a refusal of a HEAD request (here for want of a Host). */
    static const char bad[] = "HEAD /hello HTTP/1.1\r\n\r\n";
    got = raw_exchange(t, bad, sizeof(bad) - 1);
    if (strncmp(got, "HTTP/1.1 400 ", 13) || !strstr(got, "content-length: ") ||
        strcmp(strstr(got, "\r\n\r\n"), "\r\n\r\n"))
        fail_msg("HEAD refused: %s", got);
    free(got);
}

static void test_body_too_large(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOL("curl");
    static const char want[] = "{\"error\":{\"message\":\"request body larger than 100000 bytes\",\"type\":"
                               "\"invalid_request_error\",\"param\":null,\"code\":\"request_too_large\"}}";
    const char *variants[][2] = {
        {"Expect:", NULL},                         /* Content-Length, body sent */
        {"Expect: 100-continue", NULL},            /* refused before the body */
        {"Transfer-Encoding: chunked", "Expect:"}, /* chunked, over mid-way */
        {"Transfer-Encoding: chunked", "Expect: 100-continue"},
    };
    free(random_file(scratch(t, "in"), 100001));
    char data[200];
    snprintf(data, sizeof(data), "@%s", scratch(t, "in"));
    for (size_t i = 0; i < sizeof(variants) / sizeof(variants[0]); i++) {
        char **argv = curl_argv(t, "--http1.1", "--data-binary", data, "-H", variants[i][0], "-H",
                                variants[i][1] ? variants[i][1] : "X-Test: 1", "-o", scratch(t, "out"), "-w",
                                "%{http_code}", url(t, "/echo"), NULL);
        assert_int_equal(run_child(t, argv, "code"), 0);
        expect_output(t, "code", "413");
        expect_output(t, "out", want);
    }
    assert_int_equal(t->n_request, 0);
    assert_int_equal(t->n_close, 0);
    assert_true(run_until(t, no_streams, NULL));
    /* Under the bound is fine, in both framings. */
    post_echo(t, 100000, "--http1.1", "-H", "Expect:", NULL);
    post_echo(t, 100000, "--http1.1", "-H", "Transfer-Encoding: chunked", NULL);
}

static void test_reset(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOL("curl");
    char **argv = curl_argv(t, "--http1.1", "-o", "/dev/null", url(t, "/reset"), NULL);
    assert_int_equal(run_child(t, argv, "meta"), 52); /* empty reply: the connection closed */
    int one = 1;
    assert_true(run_until(t, closes_reach, &one));
    assert_int_equal(t->n_unfinished, 1);
}

/* on_writable paces a large stream: the stream never holds more than its
 * bound, and every byte arrives in order. */
static void test_paced(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOL("curl");
    const char *protos[] = {"--http1.1", "--http2-prior-knowledge"};
    for (int i = 0; i < 2; i++) {
        char **argv = curl_argv(t, protos[i], "-o", scratch(t, "out"), url(t, "/paced"), NULL);
        expect_paced(t, argv, i + 1);
    }
}

/* ---- with raw sockets ---- */

static void expect_refused(tsrv *t, const char *req, const char *status_line)
{
    char *got = raw_exchange(t, req, strlen(req));
    if (strncmp(got, status_line, strlen(status_line)))
        fail_msg("for %s\nwanted %s\ngot %s", req, status_line, got);
    assert_non_null(strstr(got, "connection: close\r\n"));
    assert_non_null(strstr(got, "\"type\":\"invalid_request_error\""));
    expect_date_header(got);
    free(got);
}

static void test_malformed(void **state)
{
    tsrv *t = *state;
    static const struct {
        const char *req, *status;
    } cases[] = {
        {"GET  / HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP/1.1 400 "},
        {"GET / HTTP/1.1 \r\nHost: x\r\n\r\n", "HTTP/1.1 400 "},
        {"GET /a b HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP/1.1 400 "},
        {"GET / HTTP/1.1\nHost: x\r\n\r\n", "HTTP/1.1 400 "},
        {"GET / HTTP/1.1\r\nHost: x\nX: y\r\n\r\n", "HTTP/1.1 400 "},
        /* bare LF throughout: no CRLF CRLF ever comes, answered at once */
        {"GET / HTTP/1.1\nHost: x\n\n", "HTTP/1.1 400 "},
        {"GET / HTTP/1.1\r\nHost: x\r\n\n", "HTTP/1.1 400 "},
        /* the last line's bare LF, then CRLF: no CRLF CRLF either */
        {"GET / HTTP/1.1\r\nHost: x\n\r\n", "HTTP/1.1 400 "},
        {"GET / HTTP/1.1\n\r\n", "HTTP/1.1 400 "},
        {"GET / HTTX/1.1\r\nHost: x\r\n\r\n", "HTTP/1.1 400 "},
        {"GET / HTTP/2.0\r\nHost: x\r\n\r\n", "HTTP/1.1 505 "},
        {"G(T / HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP/1.1 400 "},
        {"GET x HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP/1.1 400 "},
        {"GET * HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP/1.1 400 "},
        {"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", "HTTP/1.1 400 "},
        {"GET / HTTP/1.1\r\n\r\n", "HTTP/1.1 400 "},
        {"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", "HTTP/1.1 400 "},
        {"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", "HTTP/1.1 400 "},
        {"GET / HTTP/1.1\r\nHost: user@a\r\n\r\n", "HTTP/1.1 400 "},
        {"GET http://user@a/ HTTP/1.1\r\nHost: a\r\n\r\n", "HTTP/1.1 400 "},
        {"GET http:///x HTTP/1.1\r\nHost: a\r\n\r\n", "HTTP/1.1 400 "},
        {"GET / HTTP/1.1\r\nHost: x\r\nX-Folded: a\r\n b\r\n\r\n", "HTTP/1.1 400 "},
        {"GET / HTTP/1.1\r\nHost : x\r\n\r\n", "HTTP/1.1 400 "},
        {"GET / HTTP/1.1\r\nHost: x\r\n: empty\r\n\r\n", "HTTP/1.1 400 "},
        {"GET / HTTP/1.1\r\nHost: x\r\nX: a\001b\r\n\r\n", "HTTP/1.1 400 "},
        {"GET / HTTP/1.1\r\nHost: x\r\nX: a\rb\r\n\r\n", "HTTP/1.1 400 "},
        {"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
         "HTTP/1.1 400 "},
        {"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
         "HTTP/1.1 400 "},
        {"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
         "HTTP/1.1 400 "},
        /* fields that must be single, repeated: a proxy in front may read the other one */
        {"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
         "HTTP/1.1 400 "},
        {"GET / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer a\r\nauthorization: Bearer b\r\n\r\n",
         "HTTP/1.1 400 "},
        {"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: a/b\r\nContent-Type: a/b\r\nContent-Length: "
         "0\r\n\r\n",
         "HTTP/1.1 400 "},
        {"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", "HTTP/1.1 400 "},
        {"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1,1\r\n\r\nab", "HTTP/1.1 400 "},
        {"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n",
         "HTTP/1.1 413 "},
        {"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "HTTP/1.1 501 "},
        {"POST /echo HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", "HTTP/1.1 400 "},
        {"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "HTTP/1.1 400 "},
        {"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n",
         "HTTP/1.1 400 "},
        {"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3 \r\nabc\r\n",
         "HTTP/1.1 400 "},
        {"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffffff\r\n",
         "HTTP/1.1 413 "},
        /* 2^64 wraps to 0: not the last chunk, with a request smuggled after it */
        {"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000000\r\n\r\n"
         "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n",
         "HTTP/1.1 413 "},
        {"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n000020000000000000000\r\n\r\n",
         "HTTP/1.1 413 "},
        {"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nbad trailer\r\n\r\n",
         "HTTP/1.1 400 "},
        {"GET / HTTP/1.1\r\nHost: x\r\nExpect: something-else\r\n\r\n", "HTTP/1.1 417 "},
        {"GET / HTTP/1.1\r\nHost: x\r\nConnection: a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q\r\n\r\n",
         "HTTP/1.1 400 "},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        expect_refused(t, cases[i].req, cases[i].status);
    /* Headers over max_header_list (4 KiB here), and a request line that
     * alone is over it: the target is too long. */
    char big[6000];
    snprintf(big, sizeof(big), "GET / HTTP/1.1\r\nHost: x\r\nX-Big: %05000d\r\n\r\n", 0);
    expect_refused(t, big, "HTTP/1.1 431 ");
    snprintf(big, sizeof(big), "GET /%05000d HTTP/1.1\r\nHost: x\r\n\r\n", 0);
    expect_refused(t, big, "HTTP/1.1 414 ");
    assert_int_equal(t->n_request, 0);
    assert_int_equal(t->n_close, 0);
    assert_true(run_until(t, no_streams, NULL));
}

/* Pipelined requests are answered in order, one after the other; request
 * framing and the headers the application sees. */
static void test_pipelined(void **state)
{
    tsrv *t = *state;
    static const char req[] =
        "\r\n" /* an empty line before a request is ignored */
        "GET /hello HTTP/1.1\r\nHost: a.example\r\n\r\n"
        "POST /echo HTTP/1.1\r\nHost: a.example\r\nContent-Length: 5\r\n\r\nabcde"
        "POST /echo HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n"
        "3;ext=1\r\nfgh\r\n2\r\nij\r\n0\r\nX-Trailer: t\r\n\r\n"
        "GET /headers HTTP/1.1\r\nHOST: a.example\r\nConnection: keep-alive, X-Drop\r\n"
        "X-Drop: 1\r\nX-Keep: Yes \r\nTE: trailers\r\nKeep-Alive: 5\r\nUpgrade: h2c\r\n"
        "Proxy-Connection: x\r\n\r\n"
        "GET http://b.example/hello HTTP/1.1\r\nHost: a.example\r\nConnection: close\r\n\r\n"
        "GET /hello HTTP/1.1\r\nHost: never.example\r\n\r\n";
    char *got = raw_exchange(t, req, sizeof(req) - 1);
    const char *p = got;
    static const char *const in_order[] = {"HTTP/1.1 200 OK\r\n",
                                           "hello world\n",
                                           "HTTP/1.1 200 OK\r\n",
                                           "content-length: 5\r\n",
                                           "abcde",
                                           "HTTP/1.1 200 OK\r\n",
                                           "content-length: 5\r\n",
                                           "fghij",
                                           "HTTP/1.1 200 OK\r\n",
                                           "x-keep: Yes\nte: trailers\n",
                                           "HTTP/1.1 200 OK\r\n",
                                           "connection: close\r\n",
                                           "hello world\n"};
    for (size_t i = 0; i < sizeof(in_order) / sizeof(in_order[0]); i++) {
        const char *q = strstr(p, in_order[i]);
        if (!q)
            fail_msg("missing %s after %s", in_order[i], p);
        p = q + strlen(in_order[i]);
    }
    assert_null(strstr(p, "HTTP/1.1")); /* nothing after Connection: close */
    assert_null(strstr(got, "x-drop"));
    assert_null(strstr(got, "upgrade"));
    assert_null(strstr(got, "keep-alive: 5"));
    assert_null(strstr(got, "host:"));
    free(got);
    assert_int_equal(t->n_request, 5);
    assert_string_equal(t->authority, "b.example"); /* the absolute form's authority wins */
    expect_finished(t, 5);
}

/* A head that does not complete in header_timeout_ms, and a keep-alive
 * connection idle for idle_timeout_ms, are closed. */
static void test_timeouts(void **state)
{
    tsrv *t = *state;
    char *got = raw_exchange(t, "GET /hel", 8);
    assert_string_equal(got, "");
    free(got);
    got = raw_exchange(t, "", 0); /* nothing at all */
    assert_string_equal(got, "");
    free(got);
    static const char req[] = "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n";
    got = raw_exchange(t, req, sizeof(req) - 1);
    assert_non_null(strstr(got, "hello world\n"));
    free(got);
    /* A body that stops arriving gets 408, then the close. */
    static const char stalled[] = "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab";
    got = raw_exchange(t, stalled, sizeof(stalled) - 1);
    assert_true(!strncmp(got, "HTTP/1.1 408 ", 13));
    assert_non_null(strstr(got, "\"code\":\"request_timeout\"")); /* as HTTP/2 says it */
    assert_non_null(strstr(got, "connection: close\r\n"));
    free(got);
    /* h2c is held to the header timeout until its preface is in. */
    got = raw_exchange(t, "PRI * HTTP/2.0\r\n", 16);
    assert_string_equal(got, "");
    free(got);
    assert_int_equal(t->n_request, 1);
    assert_true(run_until(t, no_streams, NULL));
}

/* A peer that never reads: writes are refused past max_stream_buffer, the
 * reset closes the connection and the stream ends unfinished. */
static void test_slow_reader(void **state)
{
    tsrv *t = *state;
    int fd = raw_connect(t, 4096);
    static const char req[] = "GET /flood HTTP/1.1\r\nHost: x\r\n\r\n";
    raw_send(fd, req, sizeof(req) - 1);
    assert_true(run_until(t, flood_done, NULL));
    assert_int_equal(t->flood_enobufs, 1);
    assert_true(t->flood_pending_max <= t->lim.max_stream_buffer);
    assert_true(t->flood_pending_max + 16384 + 16 > t->lim.max_stream_buffer);
    assert_int_equal(t->n_unfinished, 1);
    assert_null(t->srv->conns);
    close(fd);
}

static bool four_requests(tsrv *t, void *arg)
{
    return t->n_request >= 4;
}

/* HTTP/1 output counts in the bytes the server holds (max_buffer), as
 * HTTP/2 streams' does: four clients that do not read hold back their
 * producers once the server holds half its bound, not a stream's bound
 * each outside it; nothing is cut, and each answer arrives whole once
 * read. */
static void test_held_bytes_bounded(void **state)
{
    tsrv *t = *state;
    static const char req[] = "GET /paced HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    int fd[4];
    for (int i = 0; i < 4; i++) {
        fd[i] = raw_connect(t, 4096);
        raw_send(fd[i], req, sizeof(req) - 1);
    }
    assert_true(run_until(t, four_requests, NULL));
    run_for(t, 200);
    assert_true(t->srv->h2_out_held > t->lim.max_buffer / 2);
    assert_true(t->srv->h2_out_held <= t->lim.max_buffer);
    assert_int_equal(t->n_unfinished, 0);
    for (int i = 0; i < 4; i++) {
        size_t len;
        char *got = raw_read_all(t, fd[i], PACED + 65536, &len);
        assert_true(len > PACED);
        assert_non_null(strstr(got, "HTTP/1.1 200"));
        free(got);
        close(fd[i]);
    }
    assert_int_equal(t->n_unfinished, 0);
    assert_int_equal(t->srv->h2_out_held, 0);
}

/* HTTP/1.0: a response cut short (the same reset) was delimited by the
 * close, so a FIN read as the whole body; the close is now a reset. */
static void test_http10_cut_is_reset(void **state)
{
    tsrv *t = *state;
    int fd = raw_connect(t, 4096);
    static const char req[] = "GET /flood HTTP/1.0\r\n\r\n";
    raw_send(fd, req, sizeof(req) - 1);
    assert_true(run_until(t, flood_done, NULL));
    assert_null(t->srv->conns);
    expect_reset(fd);
    close(fd);
}

/* The same when the cut comes from the write timeout: a client that
 * stopped reading a close-delimited body gets a reset, not a FIN. */
static void test_http10_stalled_is_reset(void **state)
{
    tsrv *t = *state;
    int fd = raw_connect(t, 4096);
    static const char req[] = "GET /paced HTTP/1.0\r\n\r\n";
    raw_send(fd, req, sizeof(req) - 1);
    int one = 1;
    assert_true(run_until(t, closes_reach, &one)); /* idle_timeout_ms 300 on the stalled writes */
    assert_int_equal(t->n_unfinished, 1);
    assert_null(t->srv->conns);
    expect_reset(fd);
    close(fd);
}

static bool conns_reach(tsrv *t, void *arg)
{
    return t->srv->n_conns >= *(size_t *)arg;
}

static bool conns_below(tsrv *t, void *arg)
{
    return t->srv->n_conns < *(size_t *)arg;
}

/* Past max_connections a new connection is closed at once. */
static void test_max_connections(void **state)
{
    tsrv *t = *state;
    int a = raw_connect(t, 0), b = raw_connect(t, 0);
    size_t two = 2;
    assert_true(run_until(t, conns_reach, &two));
    char *got = raw_exchange(t, "", 0);
    assert_string_equal(got, "");
    free(got);
    static const char req[] = "GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    raw_send(a, req, sizeof(req) - 1);
    got = raw_read_all(t, a, 4096, NULL);
    assert_non_null(strstr(got, "hello world\n"));
    free(got);
    close(a);
    assert_true(run_until(t, conns_below, &two));
    got = raw_exchange(t, req, sizeof(req) - 1); /* room again */
    assert_non_null(strstr(got, "hello world\n"));
    free(got);
    close(b);
}

/* The client's going ends its stream unfinished; freeing the server ends
 * the rest. */
static void test_client_gone(void **state)
{
    tsrv *t = *state;
    static const char req[] = "GET /hang HTTP/1.1\r\nHost: x\r\n\r\n";
    int a = raw_connect(t, 0), b = raw_connect(t, 0);
    raw_send(a, req, sizeof(req) - 1);
    raw_send(b, req, sizeof(req) - 1);
    int two = 2;
    assert_true(run_until(t, requests_reach, &two));
    close(a);
    int one = 1;
    assert_true(run_until(t, closes_reach, &one));
    assert_int_equal(t->n_unfinished, 1);
    gw_http_server_free(t->srv);
    t->srv = NULL;
    assert_int_equal(t->n_close, 2);
    assert_int_equal(t->n_unfinished, 2);
    close(b);
}

/* A client that leaves while its response is produced is seen to leave
 * though the input is at its bound with requests pipelined behind (here
 * 64 KiB against 4 KiB of head and 16 KiB of slack): the read that would
 * show its close waited for room, and the work ran on for nobody. Until
 * then the loop waits rather than spins. */
static void test_client_gone_behind_pipeline(void **state)
{
    tsrv *t = *state;
    static const char req[] = "GET /hang HTTP/1.1\r\nHost: x\r\n\r\n";
    static const char next[] = "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n";
    int fd = raw_connect(t, 0);
    raw_send(fd, req, sizeof(req) - 1);
    for (size_t sent = 0; sent < (64 << 10); sent += sizeof(next) - 1)
        raw_send(fd, next, sizeof(next) - 1);
    int one = 1;
    assert_true(run_until(t, requests_reach, &one));
    /* The input at its bound, the loop waits: it turns for the 5 ms tick,
     * not once per read callback libevent runs again and again (a spin
     * made hundreds of thousands of turns here). */
    int turns = 0;
    for (long end = now_ms() + 300; now_ms() < end; turns++)
        event_base_loop(t->base, EVLOOP_ONCE);
    if (turns > 2000)
        fail_msg("the loop turned %d times in 300 ms with nothing to do", turns);
    close(fd);
    assert_true(run_until(t, closes_reach, &one));
    assert_int_equal(t->n_unfinished, 1);
}

/* A reload that raises the head bound reaches connections already open:
 * a head over the old read bound (4 KiB and 16 KiB of slack) but within
 * the new one waited on a kept-alive connection until the header timeout. */
static void test_reload_raises_head_bound(void **state)
{
    tsrv *t = *state;
    static const char first[] = "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n";
    int fd = raw_connect(t, 0);
    raw_send(fd, first, sizeof(first) - 1);
    int one = 1;
    assert_true(run_until(t, requests_reach, &one));
    gw_http_limits l = {0};
    l.max_body = 100000;
    l.max_header_list = 128 << 10;
    l.max_stream_buffer = 256 << 10;
    gw_http_server_set_limits(t->srv, &l);
    size_t pad = 40 << 10;
    char *big = malloc(pad + 128);
    assert_non_null(big);
    int n = snprintf(big, 128, "GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Pad: ");
    memset(big + n, 'a', pad);
    memcpy(big + n + pad, "\r\n\r\n", 4);
    raw_send(fd, big, (size_t)n + pad + 4);
    free(big);
    char *got = raw_read_all(t, fd, 1 << 16, NULL);
    close(fd);
    const char *second = strstr(got, "hello world\n");
    if (!second || !strstr(second + 1, "HTTP/1.1 200 OK\r\n"))
        fail_msg("got: %s", got);
    free(got);
}

/* A request whose body is still arriving when the server starts draining
 * is answered, with connection: close, and the connection then closes. */
static void test_drain_mid_request(void **state)
{
    tsrv *t = *state;
    int fd = raw_connect(t, 0);
    static const char head[] = "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nab";
    raw_send(fd, head, sizeof(head) - 1);
    for (int i = 0; i < 20; i++) { /* the server reads the head */
        event_base_loop(t->base, EVLOOP_NONBLOCK);
        usleep(2000);
    }
    gw_http_server_drain(t->srv);
    raw_send(fd, "cde", 3);
    char *got = raw_read_all(t, fd, 1 << 16, NULL);
    close(fd);
    if (strncmp(got, "HTTP/1.1 200 ", 13) || !strstr(got, "\r\nconnection: close\r\n") ||
        !strstr(got, "\r\n\r\nabcde"))
        fail_msg("got: %s", got);
    free(got);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_get, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_later_minor, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_pipelined_half_close, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_h2c_same_port, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_post, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_keep_alive, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_streaming, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_sized_stream, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_http10, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_head, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_body_too_large, setup_small, harness_teardown),
        cmocka_unit_test_setup_teardown(test_reset, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_held_bytes_bounded, setup_held, harness_teardown),
        cmocka_unit_test_setup_teardown(test_http10_cut_is_reset, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_paced, setup_small, harness_teardown),
        cmocka_unit_test_setup_teardown(test_malformed, setup_small, harness_teardown),
        cmocka_unit_test_setup_teardown(test_pipelined, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_timeouts, setup_timeouts, harness_teardown),
        cmocka_unit_test_setup_teardown(test_http10_stalled_is_reset, setup_timeouts, harness_teardown),
        cmocka_unit_test_setup_teardown(test_slow_reader, setup_small, harness_teardown),
        cmocka_unit_test_setup_teardown(test_max_connections, setup_two_conns, harness_teardown),
        cmocka_unit_test_setup_teardown(test_client_gone, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_drain_mid_request, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_client_gone_behind_pipeline, setup_small, harness_teardown),
        cmocka_unit_test_setup_teardown(test_reload_raises_head_bound, setup_small, harness_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
