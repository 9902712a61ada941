/* The worker supervisor against workers that misbehave on demand. The
 * supervisor runs `EXE worker ... --listen unix:PATH`; here EXE is this
 * test binary, which then plays a fault-injecting worker (fake_worker,
 * below): a real HTTP/2 server (gateway/http) that answers
 * /internal/stats, but leaves one stats request unanswered, or exits at
 * once the first time it starts — faults a real worker cannot be made to
 * show on demand. */
#include "gateway/config/config.h"
#include "gateway/http/http.h"
#include "gateway/supervisor/supervisor.h"
#include "gateway/upstream/upstream.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

typedef struct tsup {
    struct event_base *base;
    struct event *tick;
    char dir[64];
    int n_close;
    gw_config *cfg;
    gw_upstream_pool *pool;
    gw_supervisor *sup;
} tsup;

#define HARNESS_CTX tsup
#include "loop_harness.h"

/* ---- the fault-injecting worker (this binary run as `... worker`) ---- */

typedef struct fake {
    const char *mode; /* FAKE_WORKER: "hang-second", "hang-after-first" or "exit-first" */
    int requests;     /* stats requests seen */
    int reset;        /* streams closed before their answer */
} fake;

static void fake_request(void *ud, gw_http_stream *s, const gw_http_request *req)
{
    fake *f = ud;
    if (strcmp(req->path, "/internal/stats") != 0) {
        gw_http_respond(s, 404, NULL, 0, NULL, 0);
        return;
    }
    if (++f->requests == 2 && !strcmp(f->mode, "hang-second"))
        return; /* read, never answered */
    if (f->requests >= 2 && !strcmp(f->mode, "hang-after-first"))
        return; /* a wedged worker whose loop still reads */
    /* running counts the requests seen and queued the ones given up, so
     * the test sees which request an answer came from. */
    char body[256];
    int n =
        snprintf(body, sizeof(body),
                 "{\"queued\":%d,\"running\":%d,\"max_seqs\":4,\"kv_blocks_free\":8,\"kv_blocks_total\":8}",
                 f->reset, f->requests);
    gw_http_header h = {"content-type", "application/json"};
    gw_http_respond(s, 200, &h, 1, body, (size_t)n);
}

static void fake_close(void *ud, gw_http_stream *s, void *stream_ud, bool finished)
{
    if (!finished)
        ((fake *)ud)->reset++;
}

static int fake_worker(int argc, char **argv)
{
    const char *listen = NULL, *marker = getenv("FAKE_WORKER_MARKER");
    for (int i = 2; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--listen"))
            listen = argv[i + 1];
    fake f = {.mode = getenv("FAKE_WORKER") ? getenv("FAKE_WORKER") : ""};
    if (!listen)
        return 2;
    if (!strcmp(f.mode, "exit-first") && marker) {
        int fd = open(marker, O_CREAT | O_EXCL | O_WRONLY, 0600);
        if (fd >= 0) {
            close(fd);
            return 3;
        }
    }
    signal(SIGPIPE, SIG_IGN);
    struct event_base *base = event_base_new();
    gw_http_handler h = {.on_request = fake_request, .on_close = fake_close};
    gw_http_server *srv = base ? gw_http_server_new(base, NULL, &h, &f) : NULL;
    char err[256];
    if (!srv || gw_http_server_listen(srv, listen, err, sizeof(err))) {
        fprintf(stderr, "fake worker: cannot listen on %s\n", listen);
        return 1;
    }
    event_base_dispatch(base); /* until the supervisor's SIGTERM */
    return 0;
}

/* ---- the supervisor under test ---- */

static char self_exe[4096];

/* `settings`: top-level YAML lines added to the configuration. */
static void sup_open(tsup *t, const char *mode, const char *settings)
{
    loop_open(t, "ig-sup");
    char marker[128], yaml[1024];
    snprintf(marker, sizeof(marker), "%s/exited", t->dir);
    setenv("FAKE_WORKER", mode, 1);
    setenv("FAKE_WORKER_MARKER", marker, 1);
    int n = snprintf(yaml, sizeof(yaml),
                     "runtime_dir: \"%s/run\"\n"
                     "%s"
                     "workers:\n"
                     "  - model: \"%s/none.gguf\"\n"
                     "    name: m\n"
                     "    devices: [cpu]\n",
                     t->dir, settings ? settings : "stats_interval_ms: 50\n", t->dir);
    char err[512];
    assert_int_equal(gw_config_parse("test", yaml, (size_t)n, &t->cfg, err, sizeof(err)), 0);
    gw_upstream_opts o;
    gw_upstream_opts_default(&o);
    t->pool = gw_upstream_pool_new(t->base, &o, err, sizeof(err));
    assert_non_null(t->pool);
    t->sup = gw_supervisor_new(t->base, t->pool, t->cfg, self_exe, err, sizeof(err));
    assert_non_null(t->sup);
    assert_int_equal(gw_supervisor_start(t->sup, err, sizeof(err)), 0);
}

static void sup_close(tsup *t)
{
    gw_supervisor_stop(t->sup);
    gw_supervisor_wait(t->sup, 5, NULL);
    gw_supervisor_free(t->sup);
    gw_upstream_pool_free(t->pool);
    gw_config_free(t->cfg);
    loop_close(t);
}

static bool ready_with(tsup *t, void *arg)
{
    const gw_worker_info *w = gw_supervisor_worker(t->sup, 0);
    return w->ready && w->running >= *(int *)arg;
}

static bool reset_seen(tsup *t, void *arg)
{
    return gw_supervisor_worker(t->sup, 0)->queued >= 1;
}

static bool restarted(tsup *t, void *arg)
{
    return gw_supervisor_worker(t->sup, 0)->restarts >= 1;
}

static bool not_ready(tsup *t, void *arg)
{
    return !gw_supervisor_worker(t->sup, 0)->ready;
}

/* The second stats request is never answered. Before the fix the
 * supervisor waited on it for good and the worker stayed unready; now it
 * resets it after STALE_S and asks again. */
static void test_unanswered_stats_request_is_retried(void **state)
{
    tsup t = {0};
    sup_open(&t, "hang-second", NULL);
    int first = 1, third = 3;
    assert_true(run_until(&t, ready_with, &first));
    assert_true(run_until(&t, not_ready, NULL));
    assert_true(run_until(&t, ready_with, &third));
    /* The hung request was reset, not left open on the worker (a later
     * answer says so: the reset may reach it after the next request). */
    assert_true(run_until(&t, reset_seen, NULL));
    const gw_worker_info *w = gw_supervisor_worker(t.sup, 0);
    assert_int_equal(w->queued, 1);
    assert_int_equal(w->restarts, 0);
    sup_close(&t);
}

/* A worker that exits at start is restarted after a back-off and then
 * becomes ready. */
static void test_exited_worker_is_restarted(void **state)
{
    tsup t = {0};
    sup_open(&t, "exit-first", NULL);
    int one = 1;
    assert_true(run_until(&t, ready_with, &one));
    const gw_worker_info *w = gw_supervisor_worker(t.sup, 0);
    assert_int_equal(w->restarts, 1);
    assert_true(w->pid > 0);
    sup_close(&t);
}

/* A worker that stops answering stats is killed after
 * worker_hang_timeout_s and started again. */
static void test_wedged_worker_is_killed(void **state)
{
    tsup t = {0};
    sup_open(&t, "hang-after-first", "stats_interval_ms: 50\nworker_hang_timeout_s: 1\n");
    int one = 1;
    assert_true(run_until(&t, ready_with, &one));
    assert_true(run_until(&t, restarted, NULL));
    sup_close(&t);
}

/* Asked less often than the hang timeout, a worker that answers every
 * question is not taken for wedged: the timeout counts from a question,
 * not from the last answer. */
static void test_slow_stats_interval_is_not_a_hang(void **state)
{
    tsup t = {0};
    sup_open(&t, "", "stats_interval_ms: 1500\nworker_hang_timeout_s: 1\n");
    int one = 1, three = 3;
    assert_true(run_until(&t, ready_with, &one));
    assert_true(run_until(&t, ready_with, &three));
    assert_int_equal(gw_supervisor_worker(t.sup, 0)->restarts, 0);
    sup_close(&t);
}

/* Two gateways cannot share a runtime_dir: the second is refused at
 * start, and the first's workers keep their sockets. */
static void test_runtime_dir_is_held(void **state)
{
    tsup t = {0};
    sup_open(&t, "", NULL);
    int one = 1;
    assert_true(run_until(&t, ready_with, &one));
    char err[512] = "";
    assert_null(gw_supervisor_new(t.base, t.pool, t.cfg, self_exe, err, sizeof(err)));
    assert_non_null(strstr(err, "in use by another infergate serve"));
    int two = 2;
    assert_true(run_until(&t, ready_with, &two));
    sup_close(&t);
}

/* A runtime_dir another user or group may write to is refused, its mode
 * named; a lock file that is a symbolic link is not followed. */
static void test_runtime_dir_must_be_private(void **state)
{
    tsup t = {0};
    loop_open(&t, "ig-sup");
    char yaml[512], run[128], lock[160], target[160], err[512];
    snprintf(run, sizeof(run), "%s/run", t.dir);
    int n = snprintf(yaml, sizeof(yaml), "runtime_dir: \"%s\"\nworkers: [{model: \"%s/none.gguf\", name: m}]\n", run,
                     t.dir);
    assert_int_equal(gw_config_parse("test", yaml, (size_t)n, &t.cfg, err, sizeof(err)), 0);
    gw_upstream_opts o;
    gw_upstream_opts_default(&o);
    t.pool = gw_upstream_pool_new(t.base, &o, err, sizeof(err));
    assert_non_null(t.pool);
    assert_int_equal(mkdir(run, 0700), 0);
    static const struct {
        mode_t mode;
        const char *said;
    } modes[] = {{0777, "has mode 0777: every local user may write"},
                 {01777, "has mode 1777: every local user may write"},
                 {0770, "has mode 0770: its group may write"}};
    for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
        assert_int_equal(chmod(run, modes[i].mode), 0);
        err[0] = '\0';
        assert_null(gw_supervisor_new(t.base, t.pool, t.cfg, self_exe, err, sizeof(err)));
        assert_non_null(strstr(err, modes[i].said));
    }
    /* private again, but the lock is a link to a file elsewhere */
    assert_int_equal(chmod(run, 0750), 0);
    snprintf(lock, sizeof(lock), "%s/gateway.lock", run);
    snprintf(target, sizeof(target), "%s/elsewhere", t.dir);
    assert_int_equal(symlink(target, lock), 0);
    err[0] = '\0';
    assert_null(gw_supervisor_new(t.base, t.pool, t.cfg, self_exe, err, sizeof(err)));
    assert_non_null(strstr(err, "(it is a symbolic link)"));
    assert_int_equal(access(target, F_OK), -1);
    assert_int_equal(unlink(lock), 0);
    gw_supervisor *sup = gw_supervisor_new(t.base, t.pool, t.cfg, self_exe, err, sizeof(err));
    assert_non_null(sup);
    gw_supervisor_free(sup);
    gw_upstream_pool_free(t.pool);
    gw_config_free(t.cfg);
    loop_close(&t);
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "worker"))
        return fake_worker(argc, argv);
    ssize_t n = readlink("/proc/self/exe", self_exe, sizeof(self_exe) - 1);
    if (n <= 0)
        return 1;
    self_exe[n] = '\0';
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unanswered_stats_request_is_retried),
        cmocka_unit_test(test_exited_worker_is_restarted),
        cmocka_unit_test(test_wedged_worker_is_killed),
        cmocka_unit_test(test_slow_stats_interval_is_not_a_hang),
        cmocka_unit_test(test_runtime_dir_is_held),
        cmocka_unit_test(test_runtime_dir_must_be_private),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
