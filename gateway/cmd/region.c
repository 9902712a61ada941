/* `infergate region`: operator commands on the fleet's shared state in
 * Redis. `region set-price` writes a region's run-time price and
 * `region set-carbon` its grid carbon intensity, and `region drain|undrain`
 * takes a region out of routing and back, which every gateway applies
 * within a second (routing/sync.h: the override key and its
 * announcement). */
#include "gateway/cmd/cli.h"
#include "gateway/base/num.h"
#include "gateway/config/config.h"
#include "routing/sync.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void region_usage(FILE *f)
{
    fprintf(f, "usage: infergate region set-price REGION --input X --output Y [options]\n"
               "       infergate region set-carbon REGION --carbon G [options]\n"
               "       infergate region drain|undrain REGION [options]\n"
               "\n"
               "Sets REGION's price per million input and output tokens, or its grid carbon intensity\n"
               "in gCO2e/kWh, for every gateway of the cluster (it overrides the figure in that\n"
               "region's config, or its carbon_source, until set again). drain stops new requests\n"
               "going to REGION, from every gateway, its own included, while what it serves finishes\n"
               "and its processes run on; undrain ends that.\n"
               "\n"
               "options:\n"
               "  --redis HOST:PORT   Redis server (default 127.0.0.1:6379; [v6addr]:PORT for IPv6)\n"
               "  --password P        Redis password (default: $INFERGATE_REDIS_PASSWORD, which keeps it\n"
               "                      out of the process list)\n"
               "  --db N              Redis database (default 0)\n"
               "  --cluster NAME      key prefix shared by the fleet (default \"default\")\n"
               "  --config FILE       take Redis, cluster and the fleet key from a gateway config (the\n"
               "                      options above override it)\n"
               "\n"
               "The figure is signed with the fleet key (redis.record_keys' first in the config, else\n"
               "$INFERGATE_RECORD_KEY): gateways ignore a figure no fleet key proves.\n");
}

/* "HOST:PORT", "[v6]:PORT" or "HOST" (port 6379). host points into buf. */
static int parse_redis_addr(const char *s, char *buf, size_t buf_len, const char **host, int *port)
{
    long p = 6379;
    size_t len = strlen(s);
    if (len == 0 || len >= buf_len)
        return -1;
    memcpy(buf, s, len + 1);
    char *colon;
    if (buf[0] == '[') {
        char *close = strchr(buf, ']');
        if (!close || close == buf + 1 || (close[1] && close[1] != ':'))
            return -1;
        *close = '\0';
        *host = buf + 1;
        colon = close[1] ? close + 1 : NULL;
    } else {
        colon = strrchr(buf, ':');
        if (colon && strchr(buf, ':') != colon)
            return -1; /* a bare IPv6 address needs brackets */
        if (colon)
            *colon = '\0';
        *host = buf;
        if (!**host)
            return -1;
    }
    if (colon && gw_parse_int(colon + 1, 1, 65535, &p))
        return -1;
    *port = (int)p;
    return 0;
}

void gw_cli_redis_init(gw_cli_redis *r)
{
    memset(r, 0, sizeof(*r));
    route_sync_opts_default(&r->o);
    r->o.password = getenv("INFERGATE_REDIS_PASSWORD");
}

int gw_cli_redis_option(gw_cli_redis *r, const char *cmd, const char *a, const char *v)
{
    long n;
    if (!strcmp(a, "--redis")) {
        if (parse_redis_addr(v, r->addr, sizeof(r->addr), &r->o.host, &r->o.port)) {
            fprintf(stderr, "%s: --redis: '%s' is not HOST:PORT\n", cmd, v);
            return -1;
        }
        r->has_redis = true;
    } else if (!strcmp(a, "--password")) {
        r->o.password = v;
        r->has_password = true;
    } else if (!strcmp(a, "--db")) {
        if (gw_parse_int(v, 0, 1000000, &n)) {
            fprintf(stderr, "%s: --db: '%s' is not a database number\n", cmd, v);
            return -1;
        }
        r->o.db = (int)n;
        r->has_db = true;
    } else if (!strcmp(a, "--cluster")) {
        r->o.cluster = v;
        r->has_cluster = true;
    } else if (!strcmp(a, "--config")) {
        r->config = v;
    } else {
        return 0;
    }
    return 1;
}

int gw_cli_redis_config(gw_cli_redis *r, const char *cmd, gw_config **cfg)
{
    char err[512];
    *cfg = NULL;
    if (!r->config)
        return 0;
    if (gw_config_load(r->config, cfg, err, sizeof(err))) {
        fprintf(stderr, "%s: %s\n", cmd, err);
        return 1;
    }
    const gw_config *c = *cfg;
    if (!r->has_redis && !c->redis.address) {
        fprintf(stderr, "%s: %s has no redis address (give --redis)\n", cmd, r->config);
        gw_config_free(*cfg);
        *cfg = NULL;
        return 1;
    }
    if (!r->has_redis) {
        r->o.host = c->redis.host;
        r->o.port = c->redis.port;
    }
    if (!r->has_password && c->redis.password)
        r->o.password = c->redis.password;
    if (!r->has_db)
        r->o.db = c->redis.db;
    if (c->redis.address)
        r->o.command_timeout_ms = c->redis.timeout_ms;
    if (!r->has_cluster)
        r->o.cluster = c->cluster;
    return 0;
}

/* What a command sets: the price, the carbon intensity, or the drain. */
typedef enum { SET_PRICE, SET_CARBON, SET_DRAIN, SET_UNDRAIN } set_kind;

static int set_figure(int argc, char **argv, set_kind kind)
{
    static const char *const names[] = {"set-price", "set-carbon", "drain", "undrain"};
    const char *cmd = names[kind];
    const bool carbon = kind == SET_CARBON;
    char cmd_name[64];
    snprintf(cmd_name, sizeof(cmd_name), "infergate region %s", cmd);
    gw_cli_redis rd;
    gw_cli_redis_init(&rd);
    const char *region = NULL;
    double input = -1, output = -1, intensity = -1;
    bool has_in = false, has_out = false, has_carbon = false;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            region_usage(stdout);
            return 0;
        }
        if (a[0] != '-') {
            if (region) {
                fprintf(stderr, "infergate region %s: one region at a time ('%s' and '%s')\n", cmd, region,
                        a);
                return 2;
            }
            region = a;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "infergate region %s: %s needs a value\n", cmd, a);
            return 2;
        }
        const char *v = argv[++i];
        long n;
        if (carbon && !strcmp(a, "--carbon")) {
            if (gw_parse_float(v, &intensity) || intensity < 0) {
                fprintf(stderr, "infergate region %s: --carbon: '%s' is not gCO2e/kWh (a number >= 0)\n", cmd,
                        v);
                return 2;
            }
            has_carbon = true;
        } else if (kind == SET_PRICE && (!strcmp(a, "--input") || !strcmp(a, "--output"))) {
            double d;
            if (gw_parse_float(v, &d) || d < 0) {
                fprintf(stderr, "infergate region %s: %s: '%s' is not a price (a number >= 0)\n", cmd, a,
                        v);
                return 2;
            }
            if (a[2] == 'i') {
                input = d;
                has_in = true;
            } else {
                output = d;
                has_out = true;
            }
        } else if ((n = gw_cli_redis_option(&rd, cmd_name, a, v)) != 0) {
            if (n < 0)
                return 2;
        } else {
            fprintf(stderr, "infergate region %s: unknown option '%s'\n\n", cmd, a);
            region_usage(stderr);
            return 2;
        }
    }
    if (!region || (kind == SET_CARBON && !has_carbon) || (kind == SET_PRICE && (!has_in || !has_out))) {
        fprintf(stderr, "infergate region %s: REGION%s are needed\n\n", cmd,
                kind == SET_CARBON ? " and --carbon" : kind == SET_PRICE ? " and --input and --output" : "");
        region_usage(stderr);
        return 2;
    }
    char err[512];
    gw_config *cfg = NULL;
    if (gw_cli_redis_config(&rd, cmd_name, &cfg))
        return 1;
    route_sync_opts o = rd.o;
    if (cfg) /* the config loader checked them */
        route_auth_keys_set(&o.auth, (const char *const *)cfg->redis.record_keys, cfg->redis.n_record_keys,
                            err, sizeof(err));
    const char *env_key = getenv("INFERGATE_RECORD_KEY");
    if (!o.auth.n && env_key && route_auth_keys_set(&o.auth, &env_key, 1, err, sizeof(err))) {
        fprintf(stderr, "infergate region %s: INFERGATE_RECORD_KEY: %s\n", cmd, err);
        gw_config_free(cfg);
        return 1;
    }
    if (!o.auth.n) {
        fprintf(stderr, "infergate region %s: no fleet key to sign the price with (give --config with "
                        "redis.record_keys, or INFERGATE_RECORD_KEY): the gateways would ignore it\n", cmd);
        gw_config_free(cfg);
        return 1;
    }
    int rc = kind == SET_CARBON  ? route_set_carbon(&o, region, intensity, err, sizeof(err))
             : kind == SET_PRICE ? route_set_price(&o, region, input, output, err, sizeof(err))
                                 : route_set_drain(&o, region, kind == SET_DRAIN, err, sizeof(err));
    memset(&o.auth, 0, sizeof(o.auth));
    if (rc) {
        fprintf(stderr, "infergate region %s: %s\n", cmd, err);
        gw_config_free(cfg);
        return 1;
    }
    if (err[0])
        fprintf(stderr, "infergate region %s: warning: %s\n", cmd, err);
    if (kind == SET_DRAIN || kind == SET_UNDRAIN)
        printf("region %s (cluster %s): %s\n", region, o.cluster,
               kind == SET_DRAIN ? "drained: no new requests go there; its streams finish"
                                 : "undrained: it takes requests again");
    else if (carbon)
        printf("region %s (cluster %s): carbon intensity %g gCO2e/kWh\n", region, o.cluster, intensity);
    else
        printf("region %s (cluster %s): input %g, output %g per million tokens\n", region, o.cluster, input,
               output);
    gw_config_free(cfg);
    return fflush(stdout) == 0 ? 0 : 1;
}

int gw_cmd_region(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        region_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "set-price") || !strcmp(argv[1], "set-carbon"))
        return set_figure(argc - 1, argv + 1, argv[1][4] == 'c' ? SET_CARBON : SET_PRICE);
    if (!strcmp(argv[1], "drain") || !strcmp(argv[1], "undrain"))
        return set_figure(argc - 1, argv + 1, argv[1][0] == 'd' ? SET_DRAIN : SET_UNDRAIN);
    fprintf(stderr, "infergate region: unknown command '%s'\n\n", argv[1]);
    region_usage(stderr);
    return 2;
}
