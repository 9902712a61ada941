/* `infergate serve`'s process: the front door of one region, from start to
 * stop (the command line is gateway/cmd/serve.c's). */
#ifndef GW_SERVE_H
#define GW_SERVE_H

/* Runs the gateway until it has drained (SIGTERM or SIGINT; a second one
 * stops it at once). config: the config file, NULL for the built-in
 * default (127.0.0.1:8080, a synthetic demo model, no keys); listen, when
 * given, replaces the first listener's address, at reloads too. Says on
 * stderr what goes wrong. Returns the exit status: 0 once drained, 1 when
 * it cannot start. Sets SIGPIPE to be ignored. */
int gw_serve_run(const char *config, const char *listen);

#endif
