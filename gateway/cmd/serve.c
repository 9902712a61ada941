/* `infergate serve`: its command line. Runs the gateway of one region
 * (gateway/front/serve.h), or with --check reads a config and the files it
 * names and says what is wrong, before a restart or a SIGHUP. */
#include "gateway/cmd/cli.h"
#include "gateway/config/config.h"
#include "gateway/front/serve.h"

#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: infergate serve [--config FILE] [--listen HOST:PORT]\n"
               "       infergate serve --check --config FILE\n"
               "Runs the gateway of one region. Without --config: 127.0.0.1:8080, one CPU worker on a\n"
               "synthetic demo model (random weights), no API keys. See README.md for the config.\n"
               "--check reads the config and the files it names and says what is wrong (exit 1) or\n"
               "that nothing is (exit 0): before a restart or a SIGHUP.\n");
}

/* --check: the config parses and the files it names can be read. */
static bool readable(const char *config, const char *what, const char *file)
{
    if (!file || access(file, R_OK) == 0)
        return true;
    fprintf(stderr, "infergate: %s: %s %s: %s\n", config, what, file, strerror(errno));
    return false;
}

static int check_config(const char *path)
{
    gw_config *c;
    char err[1024];
    if (gw_config_load(path, &c, err, sizeof(err))) {
        fprintf(stderr, "infergate: %s\n", err);
        return 1;
    }
    bool bad = false;
    for (int i = 0; i < c->n_workers; i++)
        bad |= !readable(path, "workers[].model", c->workers[i].model);
    for (int i = 0; i < c->n_listen; i++) {
        const gw_listen_cfg *l = &c->listen[i];
        bad |= !readable(path, "listen[].tls.cert", l->tls_cert);
        bad |= !readable(path, "listen[].tls.key", l->tls_key);
        bad |= !readable(path, "listen[].tls.client_ca", l->tls_client_ca);
    }
    bad |= !readable(path, "peer_tls.ca", c->peer_tls.ca);
    bad |= !readable(path, "peer_tls.cert", c->peer_tls.cert);
    bad |= !readable(path, "peer_tls.key", c->peer_tls.key);
    if (!bad)
        printf("infergate: %s is valid: %d listeners, %d workers, %d tenants%s\n", path, c->n_listen,
               c->n_workers, c->n_tenants, c->region.name ? ", region settings included" : "");
    gw_config_free(c);
    return bad;
}

int gw_cmd_serve(int argc, char **argv)
{
    static const struct option opts[] = {{"config", required_argument, 0, 'c'},
                                         {"listen", required_argument, 0, 'l'},
                                         {"check", no_argument, 0, 'k'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *config = NULL, *listen = NULL;
    bool check = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "c:l:h", opts, NULL)) != -1) {
        if (c == 'c' || c == 'l') {
            *(c == 'c' ? &config : &listen) = optarg;
            continue;
        }
        if (c == 'k') {
            check = true;
            continue;
        }
        usage(c == 'h' ? stdout : stderr);
        return c == 'h' ? 0 : 2;
    }
    if (optind != argc || (check && !config)) {
        usage(stderr);
        return 2;
    }
    if (check)
        return check_config(config);
    return gw_serve_run(config, listen);
}
