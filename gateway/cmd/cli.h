/* Subcommands of the infergate binary. Each takes the arguments after its
 * own name (argv[0] is the subcommand) and returns the process exit code. */
#ifndef GW_CLI_H
#define GW_CLI_H

#include <stdbool.h>
#include <stddef.h>

int gw_cmd_model(int argc, char **argv);
int gw_cmd_generate(int argc, char **argv);
int gw_cmd_worker(int argc, char **argv);
int gw_cmd_serve(int argc, char **argv);
int gw_cmd_key(int argc, char **argv);
int gw_cmd_region(int argc, char **argv);
int gw_cmd_usage(int argc, char **argv);

/* region.c: what the fleet commands (region, usage) share. A --redis
 * value "HOST:PORT", "[v6]:PORT" or "HOST" (port 6379), host pointing into
 * buf: 0, or -1 when malformed. */
struct gw_config;
struct route_sync_opts;
int gw_cli_parse_redis_addr(const char *s, char *buf, size_t buf_len, const char **host, int *port);
/* A gateway config's Redis address, password, db, timeout and cluster
 * into o, but for those the command line gave (has_*). */
void gw_cli_redis_from_config(const struct gw_config *cfg, struct route_sync_opts *o, bool has_redis,
                              bool has_password, bool has_db, bool has_cluster);

/* The largest request body `infergate worker --max-body` takes, and so
 * the most limits.max_body_bytes may be: the supervisor starts workers
 * with it, and the gateway keeps the configured limit. */
#define GW_WORKER_MAX_BODY (1L << 30)

#endif
