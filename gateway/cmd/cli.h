/* Subcommands of the infergate binary. Each takes the arguments after its
 * own name (argv[0] is the subcommand) and returns the process exit code. */
#ifndef GW_CLI_H
#define GW_CLI_H

#include "gateway/config/config.h"
#include "routing/sync.h"

#include <stdbool.h>
#include <stddef.h>

int gw_cmd_model(int argc, char **argv);
int gw_cmd_generate(int argc, char **argv);
int gw_cmd_worker(int argc, char **argv);
int gw_cmd_serve(int argc, char **argv);
int gw_cmd_key(int argc, char **argv);
int gw_cmd_region(int argc, char **argv);
int gw_cmd_usage(int argc, char **argv);

/* region.c: the Redis options the fleet commands (region, usage) share:
 * --redis HOST:PORT ([v6]:PORT, or HOST: port 6379), --password (default
 * $INFERGATE_REDIS_PASSWORD), --db, --cluster, and --config FILE for what
 * they leave out. */
typedef struct gw_cli_redis {
    route_sync_opts o;
    char addr[300]; /* --redis's, which o.host points into */
    const char *config;
    bool has_redis, has_password, has_db, has_cluster;
} gw_cli_redis;
void gw_cli_redis_init(gw_cli_redis *r);
/* Option a with value v: 1 when it is one of them, 0 when not, -1 for a
 * bad value (said on stderr after cmd). */
int gw_cli_redis_option(gw_cli_redis *r, const char *cmd, const char *a, const char *v);
/* With --config: loads it into *cfg (the caller frees it; o points into it)
 * and fills in what the options left out. 0, or 1 when it cannot (said). */
int gw_cli_redis_config(gw_cli_redis *r, const char *cmd, gw_config **cfg);

#define GW_WORKER_MAX_BODY (1L << 30)

#endif
