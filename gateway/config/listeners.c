/* The config's `listen` section (see config.h): the addresses the front
 * door binds, each optionally with TLS, client certificates and the peer
 * names those certificates must carry. Addresses are checked here, numeric
 * only, so that a bad one is a config error rather than a failed bind; and
 * without tenants (no API keys) only loopback addresses are allowed. */
#include "gateway/config/config_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

#define CFG_MAX_LISTEN 64
#define CFG_MAX_PEER_NAMES 64
#define CFG_DEFAULT_LISTEN "127.0.0.1:8080"

/* HOST:PORT (numeric IPv4), [IPv6]:PORT or unix:/abs/path. *loopback is
 * set for 127/8, ::1 and Unix sockets. NULL when valid, else why not. */
const char *gw_cfg_check_address(const char *s, bool *loopback)
{
    if (!strncmp(s, "unix:", 5)) {
        struct sockaddr_un sun;
        if (s[5] != '/')
            return "unix: needs an absolute path (unix:/run/infergate.sock)";
        if (strlen(s + 5) >= sizeof(sun.sun_path))
            return "Unix socket path too long";
        *loopback = true;
        return NULL;
    }
    char host[INET6_ADDRSTRLEN + 1];
    const char *port;
    bool v6 = s[0] == '[';
    if (v6) {
        const char *end = strchr(s, ']');
        if (!end || end[1] != ':' || (size_t)(end - s - 1) >= sizeof(host))
            return "want HOST:PORT, [IPV6]:PORT or unix:/PATH";
        memcpy(host, s + 1, (size_t)(end - s - 1));
        host[end - s - 1] = '\0';
        port = end + 2;
    } else {
        const char *colon = strrchr(s, ':');
        if (!colon || (size_t)(colon - s) >= sizeof(host))
            return "want HOST:PORT, [IPV6]:PORT or unix:/PATH";
        memcpy(host, s, (size_t)(colon - s));
        host[colon - s] = '\0';
        port = colon + 1;
    }
    size_t nd = strspn(port, "0123456789");
    if (nd == 0 || nd > 5 || port[nd] || atol(port) > 65535)
        return "port must be a number from 0 to 65535";
    if (v6) {
        struct in6_addr a;
        if (inet_pton(AF_INET6, host, &a) != 1)
            return "not a numeric IPv6 address";
        *loopback = IN6_IS_ADDR_LOOPBACK(&a);
    } else {
        struct in_addr a;
        /* Numeric only: resolving a name would block, and could change. */
        if (inet_pton(AF_INET, host, &a) != 1)
            return "HOST must be a numeric IPv4 address, or [IPv6]";
        *loopback = (ntohl(a.s_addr) >> 24) == 127;
    }
    return NULL;
}

/* listen[i].tls: cert and key, and for peers client_ca and peer_names. */
static int parse_listen_tls(cfg_parser *p, const yaml_node_t *n, const char *path, gw_listen_cfg *l)
{
    static const char *const tls_keys[] = {"cert", "key", "client_ca", "peer_names"};
    yaml_node_t *t[4];
    char kp[CFG_PATH_MAX];
    int rc = gw_cfg_map_take(p, n, path, tls_keys, 4, t);
    if (rc)
        return rc;
    if (!t[0] != !t[1])
        return gw_cfg_perr(p, n, path, "cert and key go together: give both, or neither for cleartext");
    if (t[2] && !t[0])
        return gw_cfg_perr(p, t[2], (gw_cfg_path_key(kp, path, "client_ca"), kp),
                           "client certificates need TLS: give cert and key too");
    if (t[2] && (rc = gw_cfg_str(p, t[2], (gw_cfg_path_key(kp, path, "client_ca"), kp), &l->tls_client_ca)))
        return rc;
    if (t[3]) {
        gw_cfg_path_key(kp, path, "peer_names");
        if (!t[2])
            return gw_cfg_perr(p, t[3], kp,
                               "peer names are checked on certificates from client_ca: give it too");
        if ((rc = gw_cfg_str_list(p, t[3], kp, CFG_MAX_PEER_NAMES, &l->tls_peer_names, &l->n_tls_peer_names)))
            return rc;
        /* an empty list would pin nothing; a name that is a pattern
         * (".example.com" to OpenSSL means every subdomain) would
         * take more than it names */
        if (l->n_tls_peer_names == 0)
            return gw_cfg_perr(p, t[3], kp, "give at least one name, or leave peer_names out");
        for (int i = 0; i < l->n_tls_peer_names; i++) {
            const char *nm = l->tls_peer_names[i];
            if (strlen(nm) > 253 || nm[0] == '.' || strchr(nm, '*'))
                return gw_cfg_perr(p, t[3], kp,
                                   "peer_names[%d]: a name of 1 to 253 bytes, not a pattern (no leading '.', "
                                   "no '*')",
                                   i);
        }
    }
    if (t[0] && ((rc = gw_cfg_str(p, t[0], (gw_cfg_path_key(kp, path, "cert"), kp), &l->tls_cert)) ||
                 (rc = gw_cfg_str(p, t[1], (gw_cfg_path_key(kp, path, "key"), kp), &l->tls_key))))
        return rc;
    return 0;
}

static int parse_listen_one(cfg_parser *p, const yaml_node_t *n, const char *path, gw_listen_cfg *l,
                            bool open_auth)
{
    static const char *const keys[] = {"address", "tls"};
    yaml_node_t *v[2];
    char kp[CFG_PATH_MAX];
    int rc = gw_cfg_map_take(p, n, path, keys, 2, v);
    if (rc)
        return rc;
    if (!v[0])
        return gw_cfg_perr(p, n, (gw_cfg_path_key(kp, path, "address"), kp), "required");
    gw_cfg_path_key(kp, path, "address");
    if ((rc = gw_cfg_str(p, v[0], kp, &l->address)))
        return rc;
    bool loopback = false;
    const char *why = gw_cfg_check_address(l->address, &loopback);
    if (why)
        return gw_cfg_perr(p, v[0], kp, "%s", why);
    if (!loopback && open_auth)
        return gw_cfg_perr(p, v[0], kp,
                           "not a loopback address, and no tenants are configured: without API keys the "
                           "gateway only listens on 127.0.0.1, [::1] or a Unix socket");
    if (v[1]) {
        char tp[CFG_PATH_MAX];
        gw_cfg_path_key(tp, path, "tls");
        return parse_listen_tls(p, v[1], tp, l);
    }
    return 0;
}

int gw_cfg_parse_listen(cfg_parser *p, const yaml_node_t *n, gw_config *c)
{
    int len, rc = gw_cfg_seq_take(p, n, "listen", CFG_MAX_LISTEN, &len);
    if (rc)
        return rc;
    if (len == 0)
        return gw_cfg_perr(p, n, "listen", "needs at least one address");
    if (!(c->listen = calloc((size_t)len, sizeof(*c->listen))))
        return -ENOMEM;
    for (int i = 0; i < len; i++) {
        char ip[CFG_PATH_MAX];
        yaml_node_t *it;
        gw_cfg_path_idx(ip, "listen", i);
        c->n_listen = i + 1;
        if ((rc = gw_cfg_seq_item(p, n, i, ip, &it)) ||
            (rc = parse_listen_one(p, it, ip, &c->listen[i], !c->n_tenants)))
            return rc;
        for (int j = 0; j < i; j++) {
            if (strcmp(c->listen[j].address, c->listen[i].address))
                continue;
            char ap[CFG_PATH_MAX];
            gw_cfg_path_key(ap, ip, "address");
            return gw_cfg_perr(p, it, ap, "%s is already listen[%d]", c->listen[i].address, j);
        }
    }
    return 0;
}

int gw_cfg_listen_default(gw_config *c)
{
    if (!(c->listen = calloc(1, sizeof(*c->listen))) || !(c->listen[0].address = strdup(CFG_DEFAULT_LISTEN)))
        return -ENOMEM;
    c->n_listen = 1;
    return 0;
}

void gw_cfg_listen_free(gw_config *c)
{
    for (int i = 0; i < c->n_listen; i++) {
        free(c->listen[i].address);
        free(c->listen[i].tls_cert);
        free(c->listen[i].tls_key);
        free(c->listen[i].tls_client_ca);
        gw_cfg_free_str_list(c->listen[i].tls_peer_names, c->listen[i].n_tls_peer_names);
    }
    free(c->listen);
}
