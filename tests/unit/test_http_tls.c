/* Tests of the HTTP server over TLS (gateway/http/tls.c and the ALPN choice in
 * gateway/http/server.c): a self-signed P-256 certificate made by
 * `openssl req` in a scratch directory, curl -k as the client. ALPN gives
 * h2 or http/1.1 on one port, both carry whole, uploaded and streamed
 * bodies, HTTP/1.0 streams end with close_notify, TLS 1.1 is refused by
 * the server (the client is told to offer it), and bad certificate or key
 * files fail at listen time naming the file. See http_harness.h for the
 * handler's paths. Tests needing a missing tool are skipped. */
#include "http_harness.h"

HARNESS_SETUP(setup, harness_new_tls, 0)
HARNESS_SETUP(setup_small_buffer, harness_new_tls, .max_stream_buffer = 256 << 10)
/* Short enough to wait out; too short for a real client on a busy machine
 * (it covers the handshake, then again up to the first frame). */
HARNESS_SETUP(setup_short_timeout, harness_new_tls, .header_timeout_ms = 200)

#define REQUIRE_TOOLS()                                                                                      \
    do {                                                                                                     \
        REQUIRE_TOOL("openssl");                                                                             \
        REQUIRE_TOOL("curl");                                                                                \
    } while (0)

/* ALPN: h2 when the client offers it, HTTP/1.1 when it offers only that. */
static void test_alpn(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOLS();
    char **h2 =
        curl_argv(t, "--http2", "-o", scratch(t, "b2"), "-w", "%{http_version}", url(t, "/hello"), NULL);
    assert_int_equal(run_child(t, h2, "m2"), 0);
    expect_output(t, "m2", "2");
    expect_output(t, "b2", "hello world\n");
    assert_string_equal(t->protocol, "HTTP/2");
    char **h1 =
        curl_argv(t, "--http1.1", "-o", scratch(t, "b1"), "-w", "%{http_version}", url(t, "/hello"), NULL);
    assert_int_equal(run_child(t, h1, "m1"), 0);
    expect_output(t, "m1", "1.1");
    expect_output(t, "b1", "hello world\n");
    assert_string_equal(t->protocol, "HTTP/1.1");
    /* No ALPN at all is HTTP/1.1 too. */
    char **none = curl_argv(t, "--http1.1", "--no-alpn", "-o", scratch(t, "b0"), "-w", "%{http_version}",
                            url(t, "/hello"), NULL);
    assert_int_equal(run_child(t, none, "m0"), 0);
    expect_output(t, "m0", "1.1");
    expect_finished(t, 3);
}

static void test_bodies(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOLS();
    size_t len = (1 << 20) - 1;
    uint8_t *buf = random_file(scratch(t, "in"), len);
    char data[200];
    snprintf(data, sizeof(data), "@%s", scratch(t, "in"));
    const char *protos[] = {"--http1.1", "--http2"};
    for (int i = 0; i < 2; i++) {
        char **post = curl_argv(t, protos[i], "-H", "Transfer-Encoding: chunked", "--data-binary", data, "-o",
                                scratch(t, "out"), url(t, "/echo"), NULL);
        assert_int_equal(run_child(t, post, "meta"), 0);
        size_t got_len = 0;
        char *got = slurp(scratch(t, "out"), &got_len);
        assert_int_equal(got_len, len);
        assert_memory_equal(got, buf, len);
        free(got);
        char **stream = curl_argv(t, protos[i], "-N", "-o", scratch(t, "s"), url(t, "/stream"), NULL);
        assert_int_equal(run_child(t, stream, "meta"), 0);
        expect_output(t, "s", ten_pieces);
    }
    /* HTTP/1.0: the stream ends with close_notify and the close. */
    char **old = curl_argv(t, "--http1.0", "-o", scratch(t, "s0"), url(t, "/stream"), NULL);
    assert_int_equal(run_child(t, old, "meta"), 0);
    expect_output(t, "s0", ten_pieces);
    free(buf);
    expect_finished(t, 5);
}

static void test_keep_alive(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOLS();
    char **argv = curl_argv(t, "--http1.1", "-o", "/dev/null", "-o", "/dev/null", "-w",
                            "%{http_code}:%{num_connects},", url(t, "/hello"), url(t, "/hello"), NULL);
    assert_int_equal(run_child(t, argv, "meta"), 0);
    expect_output(t, "meta", "200:1,200:0,");
}

/* on_writable paces a large stream over TLS as over cleartext. */
static void test_paced(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOLS();
    const char *protos[] = {"--http1.1", "--http2"};
    for (int i = 0; i < 2; i++) {
        char **argv = curl_argv(t, protos[i], "-o", scratch(t, "out"), url(t, "/paced"), NULL);
        expect_paced(t, argv, i + 1);
    }
}

/* The client offers TLS 1.1 only (its own floor lowered): the server
 * answers with a protocol_version alert. */
static void test_tls11_refused(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOLS();
    char **argv = curl_argv(t, "--tlsv1.1", "--tls-max", "1.1", "--ciphers", "DEFAULT:@SECLEVEL=0", "-o",
                            "/dev/null", url(t, "/hello"), NULL);
    assert_int_equal(run_child(t, argv, "meta"), 35);
    char *err = child_out(t, "meta.err");
    if (!strstr(err, "alert protocol version"))
        fail_msg("curl said: %s", err);
    free(err);
    assert_int_equal(t->n_request, 0);
    assert_true(run_until(t, no_streams, NULL));
}

/* A connection that never starts its handshake is closed after
 * header_timeout_ms; so is one that sends cleartext HTTP. */
static void test_handshake_timeout(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOLS();
    char *got = raw_exchange(t, "", 0);
    assert_string_equal(got, "");
    free(got);
    static const char req[] = "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n";
    got = raw_exchange(t, req, sizeof(req) - 1);
    assert_null(strstr(got, "hello"));
    free(got);
    assert_int_equal(t->n_request, 0);
}

/* A client resumes its session on the listener that verifies client
 * certificates (the peer listener, which applications share): without a
 * session id context OpenSSL refused every resumption there with an
 * internal_error alert. s_client offers no certificate, as an application
 * would not. */
static void test_resume_peer_listener(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOLS();
    char cert[160], key[160], err[512] = "", port[16], sess[160];
    snprintf(cert, sizeof(cert), "%s", scratch(t, "cert.pem"));
    snprintf(key, sizeof(key), "%s", scratch(t, "key.pem"));
    snprintf(sess, sizeof(sess), "%s", scratch(t, "session.pem"));
    if (gw_http_server_listen_tls_peer(t->srv, "tcp:127.0.0.1:0", cert, key, cert, NULL, 0, err, sizeof(err)))
        fail_msg("listen_tls_peer: %s", err);
    snprintf(port, sizeof(port), "127.0.0.1:%d", gw_http_server_port(t->srv));
    for (int i = 0; i < 2; i++) {
        char *argv[] = {"openssl", "s_client",    "-connect",  port,
                        "-tls1_2", "-servername", "localhost", i ? "-sess_in" : "-sess_out",
                        sess,      NULL};
        assert_int_equal(run_child(t, argv, i ? "second" : "first"), 0);
    }
    char *first = child_out(t, "first"), *second = child_out(t, "second");
    if (!strstr(first, "New, TLSv1.2") || !strstr(second, "Reused, TLSv1.2"))
        fail_msg("first: %.300s\nsecond: %.300s", first, second);
    free(first);
    free(second);
}

static void test_bad_files(void **state)
{
    tsrv *t = *state;
    REQUIRE_TOOLS();
    char cert[160], key[160], other_cert[160], other_key[160], junk[160], err[512];
    snprintf(cert, sizeof(cert), "%s", scratch(t, "cert.pem"));
    snprintf(key, sizeof(key), "%s", scratch(t, "key.pem"));
    snprintf(other_cert, sizeof(other_cert), "%s", scratch(t, "cert2.pem"));
    snprintf(other_key, sizeof(other_key), "%s", scratch(t, "key2.pem"));
    snprintf(junk, sizeof(junk), "%s", scratch(t, "junk.pem"));
    make_cert(t, other_cert, other_key);
    write_file(junk, "not a certificate\n", 18);
    const char *missing = "/tmp/infergate-no-such-dir/cert.pem";
    struct {
        const char *cert, *key, *named;
        int rc;
    } cases[] = {
        {missing, key, missing, -ENOENT}, {cert, missing, missing, -ENOENT},     {junk, key, junk, -EINVAL},
        {cert, junk, junk, -EINVAL},      {cert, other_key, other_key, -EINVAL}, /* does not match */
        {"", key, NULL, -EINVAL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        err[0] = '\0';
        int rc = gw_http_server_listen_tls(t->srv, "tcp:127.0.0.1:0", cases[i].cert, cases[i].key, err,
                                           sizeof(err));
        if (rc != cases[i].rc)
            fail_msg("case %zu: %d (%s)", i, rc, err);
        assert_true(strlen(err) > 0);
        if (cases[i].named && !strstr(err, cases[i].named))
            fail_msg("case %zu: the error does not name %s: %s", i, cases[i].named, err);
    }
    assert_non_null(strstr(err, "certificate"));
    /* A good pair on a bad spec: the spec's error, and nothing leaks. */
    assert_int_equal(
        gw_http_server_listen_tls(t->srv, "tcp:nowhere", other_cert, other_key, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "tcp:nowhere"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_alpn, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_bodies, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_keep_alive, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_paced, setup_small_buffer, harness_teardown),
        cmocka_unit_test_setup_teardown(test_tls11_refused, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_handshake_timeout, setup_short_timeout, harness_teardown),
        cmocka_unit_test_setup_teardown(test_resume_peer_listener, setup, harness_teardown),
        cmocka_unit_test_setup_teardown(test_bad_files, setup, harness_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
