/* Listeners of the HTTP server: "unix:/path" and "tcp:HOST:PORT" specs
 * parsed into listening sockets, cleartext or with a TLS context, each
 * accepted connection handed to gw_conn_adopt unless the server holds
 * max_connections already. Sockets are made here (not by
 * evconnlistener_new_bind) so that a failure names the exact errno. */
#include "gateway/http/http_internal.h"
#include "gateway/base/clock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>

/* Pause after accept fails for lack of descriptors or memory: retrying at
 * once would spin the loop. */
#define GW_ACCEPT_RETRY_MS 100

static void on_accept(struct evconnlistener *evl, evutil_socket_t fd, struct sockaddr *sa, int salen,
                      void *arg)
{
    gw_listener *l = arg;
    /* Refused at once: a full server that let connections queue would
     * only hold them until they time out. */
    if (l->srv->n_conns >= l->srv->limits.max_connections) {
        evutil_closesocket(fd);
        return;
    }
    gw_conn_adopt(l->srv, fd, l->tls); /* on failure the peer sees the close */
}

static void on_retry(evutil_socket_t fd, short what, void *arg)
{
    gw_listener *l = arg;
    evconnlistener_enable(l->evl);
}

static void on_accept_error(struct evconnlistener *evl, void *arg)
{
    gw_listener *l = arg;
    int e = EVUTIL_SOCKET_ERROR();
    if (e != EMFILE && e != ENFILE && e != ENOBUFS && e != ENOMEM)
        return;
    /* Said at most every 10 s: out of descriptors, clients wait in the
     * backlog and nothing else would tell why. */
    int64_t now_ms = gw_mono_coarse_ms();
    if (!l->srv->accept_err_logged || now_ms - l->srv->accept_err_logged >= 10000) {
        l->srv->accept_err_logged = now_ms ? now_ms : 1;
        fprintf(stderr, "http: cannot accept: %s; accepting again in %d ms (max_connections, ulimit -n)\n",
                strerror(e), GW_ACCEPT_RETRY_MS);
    }
    struct timeval tv = {0, GW_ACCEPT_RETRY_MS * 1000};
    evconnlistener_disable(evl);
    if (event_add(l->retry_ev, &tv))
        evconnlistener_enable(evl);
}

static int fail(char *err, size_t err_len, int rc, const char *spec, const char *what)
{
    snprintf(err, err_len, "%s: %s", spec, what);
    return rc;
}

static int fail_errno(char *err, size_t err_len, int e, const char *spec, const char *what)
{
    snprintf(err, err_len, "%s: %s: %s", spec, what, strerror(e));
    return -e;
}

/* Wraps a bound socket; takes `fd` in every case, `tls` on success. */
static int listener_start(gw_http_server *srv, int fd, struct ssl_ctx_st *tls, const char *unix_path,
                          int port, const char *spec, char *err, size_t err_len)
{
    gw_listener *l = calloc(1, sizeof(*l));
    if (!l || (unix_path && !(l->unix_path = strdup(unix_path))))
        goto nomem;
    l->srv = srv;
    l->tls = tls;
    l->port = port;
    l->index = srv->n_listeners_added;
    struct stat st;
    if (unix_path && stat(unix_path, &st) == 0) {
        l->unix_dev = (unsigned long long)st.st_dev;
        l->unix_ino = (unsigned long long)st.st_ino;
    }
    if (!(l->retry_ev = evtimer_new(srv->base, on_retry, l)))
        goto nomem;
    l->evl =
        evconnlistener_new(srv->base, on_accept, l, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, 0, fd);
    if (!l->evl)
        goto nomem;
    evconnlistener_set_error_cb(l->evl, on_accept_error);
    l->next = srv->listeners;
    srv->listeners = l;
    srv->n_listeners_added++;
    if (port >= 0)
        srv->port = port;
    return 0;
nomem:
    if (l) {
        if (l->retry_ev)
            event_free(l->retry_ev);
        free(l->unix_path);
        free(l);
    }
    close(fd);
    return fail(err, err_len, -ENOMEM, spec, "out of memory");
}

static int listen_tcp(gw_http_server *srv, const char *spec, const char *addr, struct ssl_ctx_st *tls,
                      char *err, size_t err_len)
{
    char host[INET6_ADDRSTRLEN + 1];
    const char *port_s;
    bool v6 = addr[0] == '[';
    if (v6) {
        const char *end = strchr(addr, ']');
        if (!end || end[1] != ':' || (size_t)(end - addr - 1) >= sizeof(host))
            return fail(err, err_len, -EINVAL, spec, "expected tcp:[IPV6]:PORT");
        memcpy(host, addr + 1, (size_t)(end - addr - 1));
        host[end - addr - 1] = '\0';
        port_s = end + 2;
    } else {
        const char *colon = strrchr(addr, ':');
        if (!colon || (size_t)(colon - addr) >= sizeof(host))
            return fail(err, err_len, -EINVAL, spec, "expected tcp:HOST:PORT");
        memcpy(host, addr, (size_t)(colon - addr));
        host[colon - addr] = '\0';
        port_s = colon + 1;
    }
    char *endp;
    errno = 0;
    long port = strtol(port_s, &endp, 10);
    if (!*port_s || *endp || errno || port < 0 || port > 65535 || port_s[0] == '-' || port_s[0] == '+')
        return fail(err, err_len, -EINVAL, spec, "port must be a number from 0 to 65535");

    struct sockaddr_storage ss = {0};
    socklen_t sl;
    if (v6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)port);
        if (inet_pton(AF_INET6, host, &a->sin6_addr) != 1)
            return fail(err, err_len, -EINVAL, spec, "not a numeric IPv6 address");
        sl = sizeof(*a);
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)port);
        /* Numeric only: resolving a name here would block the loop. */
        if (inet_pton(AF_INET, host, &a->sin_addr) != 1)
            return fail(err, err_len, -EINVAL, spec, "HOST must be a numeric IPv4 address or [IPv6]");
        sl = sizeof(*a);
    }
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd == -1)
        return fail_errno(err, err_len, errno, spec, "socket");
    int one = 1, e;
    /* [::]:P takes IPv6 only, as nginx's does: dual-stack (the kernel's
     * default here) made a config listening on both 0.0.0.0:P and [::]:P
     * fail with EADDRINUSE on whichever came second. A v4-mapped address
     * ([::ffff:a.b.c.d]) is IPv4 by definition and cannot be bound so. */
    bool v6only = ss.ss_family == AF_INET6 && !IN6_IS_ADDR_V4MAPPED(&((struct sockaddr_in6 *)&ss)->sin6_addr);
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == -1 ||
        (v6only && setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one)) == -1) ||
        bind(fd, (struct sockaddr *)&ss, sl) == -1 || listen(fd, SOMAXCONN) == -1) {
        e = errno;
        close(fd);
        return fail_errno(err, err_len, e, spec, "bind");
    }
    sl = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == -1) {
        e = errno;
        close(fd);
        return fail_errno(err, err_len, e, spec, "getsockname");
    }
    int bound = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    return listener_start(srv, fd, tls, NULL, bound, spec, err, err_len);
}

/* A socket file nobody accepts on is stale (a crashed server's); one that
 * answers belongs to a live server and stays. */
static int unix_clear_stale(const char *spec, const struct sockaddr_un *sun, char *err, size_t err_len)
{
    struct stat st;
    if (lstat(sun->sun_path, &st) == -1)
        return errno == ENOENT ? 0 : fail_errno(err, err_len, errno, spec, "stat");
    if (!S_ISSOCK(st.st_mode))
        return fail(err, err_len, -EEXIST, spec, "exists and is not a socket");
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd == -1)
        return fail_errno(err, err_len, errno, spec, "socket");
    int rc = connect(fd, (const struct sockaddr *)sun, sizeof(*sun));
    int e = errno;
    close(fd);
    if (rc == 0 || e == EAGAIN)
        return fail(err, err_len, -EADDRINUSE, spec, "another server is listening there");
    if (e != ECONNREFUSED)
        return fail_errno(err, err_len, e, spec, "probing the existing socket");
    if (unlink(sun->sun_path) == -1 && errno != ENOENT)
        return fail_errno(err, err_len, errno, spec, "removing the stale socket");
    return 0;
}

/* chmod 0660 on the socket just bound, never through a symbolic link put
 * in its place since (bind itself never follows one): the mode would go
 * to the file it names. Without /proc, glibc cannot change a mode without
 * following links: then a path that is no link is changed as it is. */
static int chmod_socket(const char *path)
{
    if (fchmodat(AT_FDCWD, path, 0660, AT_SYMLINK_NOFOLLOW) == 0)
        return 0;
    struct stat st;
    if (errno != EOPNOTSUPP || lstat(path, &st) == -1)
        return -1;
    if (!S_ISSOCK(st.st_mode)) {
        errno = EEXIST;
        return -1;
    }
    return chmod(path, 0660);
}

static int listen_unix(gw_http_server *srv, const char *spec, const char *path, struct ssl_ctx_st *tls,
                       char *err, size_t err_len)
{
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    if (!*path)
        return fail(err, err_len, -EINVAL, spec, "expected unix:/path");
    if (strlen(path) >= sizeof(sun.sun_path))
        return fail(err, err_len, -ENAMETOOLONG, spec, "path too long for a Unix socket");
    memcpy(sun.sun_path, path, strlen(path) + 1);
    int rc = unix_clear_stale(spec, &sun, err, err_len);
    if (rc)
        return rc;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), e;
    if (fd == -1)
        return fail_errno(err, err_len, errno, spec, "socket");
    if (bind(fd, (struct sockaddr *)&sun, sizeof(sun)) == -1) {
        e = errno;
        close(fd);
        return fail_errno(err, err_len, e, spec, "bind");
    }
    /* The gateway and its workers share a user or a group. */
    if (chmod_socket(path) == -1 || listen(fd, SOMAXCONN) == -1) {
        e = errno;
        close(fd);
        unlink(path);
        return fail_errno(err, err_len, e, spec, "listen");
    }
    return listener_start(srv, fd, tls, path, -1, spec, err, err_len);
}

int gw_listener_add(gw_http_server *srv, const char *spec, struct ssl_ctx_st *tls, char *err, size_t err_len)
{
    int rc;
    if (!strncmp(spec, "unix:", 5))
        rc = listen_unix(srv, spec, spec + 5, tls, err, err_len);
    else if (!strncmp(spec, "tcp:", 4))
        rc = listen_tcp(srv, spec, spec + 4, tls, err, err_len);
    else
        rc = fail(err, err_len, -EINVAL, spec, "expected unix:/path or tcp:HOST:PORT");
    if (rc && tls)
        gw_tls_ctx_free(tls);
    return rc;
}

void gw_listener_free_all(gw_http_server *srv)
{
    gw_listener *l;
    while ((l = srv->listeners)) {
        srv->listeners = l->next;
        evconnlistener_free(l->evl);
        event_free(l->retry_ev);
        /* Only our own socket file: a newer server may have replaced it. */
        struct stat st;
        if (l->unix_path && lstat(l->unix_path, &st) == 0 && (unsigned long long)st.st_dev == l->unix_dev &&
            (unsigned long long)st.st_ino == l->unix_ino)
            unlink(l->unix_path);
        free(l->unix_path);
        if (l->tls)
            gw_tls_ctx_free(l->tls);
        free(l);
    }
    srv->port = 0;
}
