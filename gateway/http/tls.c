/* TLS for the HTTP server: the OpenSSL 3 server context of a listener
 * (TLS 1.2 minimum, ALPN choosing h2 before http/1.1, certificate chain and
 * key checked when the listener starts) and the bufferevent that runs a
 * connection's handshake. The only file of the server that sees OpenSSL. */
#include "gateway/http/http_internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/util.h>
#include <openssl/err.h>
#include <openssl/sha.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

/* TLS 1.2 suites that RFC 9113 9.2.2 allows for h2: ephemeral key exchange
 * and AEAD only (Mozilla's "intermediate" list). TLS 1.3 suites are all
 * fine and keep OpenSSL's defaults. */
#define GW_TLS12_CIPHERS                                                                                     \
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:"               \
    "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305"

/* ALPN (RFC 7301): our preference wins over the client's order. A client
 * offering neither gets no ALPN answer and speaks HTTP/1.1. */
static int alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen, const unsigned char *in,
                       unsigned int inlen, void *arg)
{
    static const unsigned char *const ours[] = {(const unsigned char *)"\x02h2",
                                                (const unsigned char *)"\x08http/1.1"};
    for (size_t k = 0; k < sizeof(ours) / sizeof(ours[0]); k++) {
        for (unsigned int i = 0; i < inlen;) {
            unsigned int n = in[i];
            if (n == 0 || n > inlen - i - 1)
                return SSL_TLSEXT_ERR_NOACK; /* malformed list */
            if (n == ours[k][0] && !memcmp(in + i + 1, ours[k] + 1, n)) {
                *out = in + i + 1;
                *outlen = (unsigned char)n;
                return SSL_TLSEXT_ERR_OK;
            }
            i += 1 + n;
        }
    }
    return SSL_TLSEXT_ERR_NOACK;
}

/* The reason of the first error in OpenSSL's queue (the cause; later
 * entries say only where it surfaced), and the queue emptied. */
static const char *ssl_reason(char *buf, size_t len)
{
    unsigned long e = ERR_peek_error();
    const char *r = e ? ERR_reason_error_string(e) : NULL;
    if (r)
        snprintf(buf, len, "%s", r);
    else if (e)
        ERR_error_string_n(e, buf, len);
    else
        snprintf(buf, len, "unknown error");
    ERR_clear_error();
    return buf;
}

/* Opening the file ourselves first names the errno (missing, unreadable)
 * instead of OpenSSL's "system library" wording. */
static int check_readable(const char *path, const char *what, char *err, size_t err_len)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        int e = errno;
        snprintf(err, err_len, "%s %s: %s", what, path, strerror(e));
        return -e;
    }
    fclose(f);
    return 0;
}

/* The names a peer's certificate must carry, kept with the context (and
 * freed with it, after its last connection). */
typedef struct peer_name_list {
    int n;
    char *v[];
} peer_name_list;

static void peer_names_free(void *parent, void *ptr, CRYPTO_EX_DATA *ad, int idx, long argl, void *argp)
{
    peer_name_list *pn = ptr;
    for (int i = 0; pn && i < pn->n; i++)
        free(pn->v[i]);
    free(pn);
}

static int peer_names_index(void)
{
    static int idx = -1; /* set once, at start, on the loop's thread */
    if (idx < 0)
        idx = SSL_CTX_get_ex_new_index(0, NULL, NULL, NULL, peer_names_free);
    return idx;
}

static int set_peer_names(SSL_CTX *ctx, const char *const *names, int n)
{
    int idx = peer_names_index();
    peer_name_list *pn = idx >= 0 ? calloc(1, sizeof(*pn) + (size_t)n * sizeof(char *)) : NULL;
    if (!pn)
        return -ENOMEM;
    for (; pn->n < n; pn->n++)
        if (!(pn->v[pn->n] = strdup(names[pn->n]))) {
            peer_names_free(NULL, pn, NULL, 0, 0, NULL);
            return -ENOMEM;
        }
    if (SSL_CTX_set_ex_data(ctx, idx, pn) != 1) {
        peer_names_free(NULL, pn, NULL, 0, 0, NULL);
        return -ENOMEM;
    }
    return 0;
}

int gw_tls_ctx_new(const char *cert_file, const char *key_file, const char *client_ca,
                   const char *const *peer_names, int n_peer_names, struct ssl_ctx_st **out, char *err,
                   size_t err_len)
{
    char why[256];
    int rc;
    *out = NULL;
    if (!cert_file || !*cert_file || !key_file || !*key_file) {
        snprintf(err, err_len, "TLS needs a certificate file and a key file");
        return -EINVAL;
    }
    if ((rc = check_readable(cert_file, "certificate", err, err_len)) ||
        (rc = check_readable(key_file, "key", err, err_len)))
        return rc;
    ERR_clear_error();
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx) {
        snprintf(err, err_len, "TLS context: %s", ssl_reason(why, sizeof(why)));
        return -ENOMEM;
    }
    rc = -EINVAL;
    if (!SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) ||
        !SSL_CTX_set_cipher_list(ctx, GW_TLS12_CIPHERS)) {
        snprintf(err, err_len, "TLS context: %s", ssl_reason(why, sizeof(why)));
        goto fail;
    }
    /* Renegotiation is a DoS lever and h2 forbids it; compression is CRIME. */
    SSL_CTX_set_options(ctx,
                        SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
    /* libevent retries a blocked SSL_write from a buffer that may have
     * moved; idle connections give their record buffers back. */
    SSL_CTX_set_mode(ctx, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_RELEASE_BUFFERS);
    if (SSL_CTX_use_certificate_chain_file(ctx, cert_file) != 1) {
        snprintf(err, err_len, "certificate %s: not a usable PEM certificate chain: %s", cert_file,
                 ssl_reason(why, sizeof(why)));
        goto fail;
    }
    /* Loading the key checks it against the certificate already there. */
    if (SSL_CTX_use_PrivateKey_file(ctx, key_file, SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(ctx) != 1) {
        if (ERR_GET_REASON(ERR_peek_error()) == X509_R_KEY_VALUES_MISMATCH) {
            ERR_clear_error();
            snprintf(err, err_len, "key %s does not match certificate %s", key_file, cert_file);
        } else {
            snprintf(err, err_len, "key %s: not a usable PEM private key: %s", key_file,
                     ssl_reason(why, sizeof(why)));
        }
        goto fail;
    }
    if (client_ca) {
        /* Peers (other regions' gateways) present certificates from this CA;
         * applications on the same listener need none. A certificate that
         * is presented must verify; gw_tls_peer_verified tells which
         * connections carry one. */
        if ((rc = check_readable(client_ca, "client CA", err, err_len)))
            goto fail;
        rc = -EINVAL;
        if (SSL_CTX_load_verify_locations(ctx, client_ca, NULL) != 1) {
            snprintf(err, err_len, "client CA %s: not a usable PEM certificate: %s", client_ca,
                     ssl_reason(why, sizeof(why)));
            goto fail;
        }
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
        /* Without a session id context OpenSSL fails every resumption on a
         * context that verifies peers (an application's reconnect from its
         * session cache). Sessions and tickets are this SSL_CTX's own;
         * the context names the CA they were verified against. */
        unsigned char sid[SHA256_DIGEST_LENGTH];
        SHA256((const unsigned char *)client_ca, strlen(client_ca), sid);
        if (SSL_CTX_set_session_id_context(ctx, sid, SSL_MAX_SID_CTX_LENGTH) != 1) {
            snprintf(err, err_len, "client CA %s: %s", client_ca, ssl_reason(why, sizeof(why)));
            goto fail;
        }
        if (n_peer_names > 0 && set_peer_names(ctx, peer_names, n_peer_names)) {
            snprintf(err, err_len, "out of memory");
            rc = -ENOMEM;
            goto fail;
        }
    }
    SSL_CTX_set_alpn_select_cb(ctx, alpn_select, NULL);
    *out = ctx;
    return 0;
fail:
    SSL_CTX_free(ctx);
    return rc;
}

void gw_tls_ctx_free(struct ssl_ctx_st *ctx)
{
    SSL_CTX_free(ctx); /* connections hold their own references */
}

struct bufferevent *gw_tls_bev_new(struct event_base *base, int fd, struct ssl_ctx_st *ctx)
{
    SSL *ssl = SSL_new(ctx);
    if (!ssl) {
        ERR_clear_error();
        evutil_closesocket(fd);
        return NULL;
    }
    /* Once libevent's object exists, its failure path closes `fd` and
     * frees `ssl` (CLOSE_ON_FREE); before that it touches neither. Closing
     * again could hit a reused descriptor, so this out-of-memory path
     * rather leaks. */
    struct bufferevent *bev =
        bufferevent_openssl_socket_new(base, fd, ssl, BUFFEREVENT_SSL_ACCEPTING, BEV_OPT_CLOSE_ON_FREE);
    if (!bev)
        return NULL;
    /* A peer that closes without close_notify is an EOF, not an error:
     * the framing of HTTP says whether a message was complete. */
    bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    return bev;
}

bool gw_tls_alpn_h2(struct bufferevent *bev)
{
    SSL *ssl = bufferevent_openssl_get_ssl(bev);
    const unsigned char *p = NULL;
    unsigned int n = 0;
    if (ssl)
        SSL_get0_alpn_selected(ssl, &p, &n);
    return n == 2 && !memcmp(p, "h2", 2);
}

/* The certificate names `name`: its (first) subject CN, or a DNS SAN,
 * both without regard to case (no wildcard stands for a name; the config
 * refuses names that are patterns). */
bool gw_tls_cert_named(struct x509_st *cert, const char *name)
{
    char cn[256];
    int n = X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof(cn));
    bool named =
        (n > 0 && (size_t)n == strlen(name) && !strncasecmp(cn, name, (size_t)n)) ||
        X509_check_host(cert, name, 0, X509_CHECK_FLAG_NEVER_CHECK_SUBJECT | X509_CHECK_FLAG_NO_WILDCARDS,
                        NULL) == 1;
    ERR_clear_error();
    return named;
}

static bool peer_named(X509 *cert, const peer_name_list *pn)
{
    for (int i = 0; i < pn->n; i++)
        if (gw_tls_cert_named(cert, pn->v[i]))
            return true;
    return false;
}

bool gw_tls_peer_verified(struct bufferevent *bev)
{
    SSL *ssl = bufferevent_openssl_get_ssl(bev);
    if (!ssl)
        return false;
    X509 *peer = SSL_get0_peer_certificate(ssl);
    if (!peer || SSL_get_verify_result(ssl) != X509_V_OK)
        return false;
    const peer_name_list *pn = SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), peer_names_index());
    return !pn || peer_named(peer, pn);
}

void gw_tls_close_notify(struct bufferevent *bev)
{
    SSL *ssl = bufferevent_openssl_get_ssl(bev);
    if (ssl && !(SSL_get_shutdown(ssl) & SSL_SENT_SHUTDOWN)) {
        SSL_shutdown(ssl); /* a full socket buffer loses it: the FIN still ends the stream */
        ERR_clear_error();
    }
}
