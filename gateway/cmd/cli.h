/* Subcommands of the infergate binary. Each takes the arguments after its
 * own name (argv[0] is the subcommand) and returns the process exit code. */
#ifndef GW_CLI_H
#define GW_CLI_H

int gw_cmd_model(int argc, char **argv);
int gw_cmd_generate(int argc, char **argv);
int gw_cmd_worker(int argc, char **argv);
int gw_cmd_serve(int argc, char **argv);
int gw_cmd_key(int argc, char **argv);
int gw_cmd_region(int argc, char **argv);

/* The largest request body `infergate worker --max-body` takes, and so
 * the most limits.max_body_bytes may be: the supervisor starts workers
 * with it, and the gateway keeps the configured limit. */
#define GW_WORKER_MAX_BODY (1L << 30)

#endif
