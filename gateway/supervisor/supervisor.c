/* Worker supervisor (see supervisor.h). Children are reaped from a SIGCHLD
 * event on the loop; stats are read with GET /internal/stats over the
 * upstream pool every stats_interval_ms. */
#define _GNU_SOURCE /* close_range */
#include "gateway/supervisor/supervisor.h"
#include "gateway/base/clock.h"
#include "gateway/base/prefix.h"

#include "gateway/cmd/cli.h"
#include "gateway/config/config.h"
#include "gateway/supervisor/gpu_list.h"
#include "gateway/upstream/upstream.h"

#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 10000
#define STABLE_S 30.0   /* up this long: the back-off starts over */
/* No stats this long (or 3 intervals, if longer): not ready; a stats
 * request this old is given up. */
#define STALE_S 3.0
#define STATS_MAX 65536 /* bytes of a stats answer we read */
#define PREFIXES_MAX 1024 /* prefix hashes of a worker's stats taken */
/* Prefill rate assumed of a worker that has measured none yet (ms/byte). */
#define DEFAULT_MS_PER_BYTE 0.25
#define PROBE_MS 5000   /* nvidia-smi -L for devices: auto */

typedef struct sworker {
    gw_worker_info info;
    const gw_worker_cfg *cfg;
    char *device, *sock_path, *target;
    gw_supervisor *sup;
    double started_at, last_stats, stats_sent;
    double asked_at; /* the first stats request since the last answer; 0: none */
    int backoff_ms;
    struct event *respawn;
    gw_upstream_req *stats_req;
    char *stats_buf;
    size_t stats_len;
    int stats_status;
    int picked;       /* requests sent since the last stats */
    double picked_ms; /* their prefill, as expected when they were sent (cache-aware picks) */
    bool hang_killed; /* SIGKILLed for answering no stats */
    bool stats_ready; /* stats answered recently: ready unless its health checks say down */
    uint64_t *prefixes; /* info.prefixes' storage (PREFIXES_MAX) */
    gw_worker_tenant *tenants; /* info.tenants' (GW_WORKER_TENANTS) */
} sworker;

struct gw_supervisor {
    struct event_base *base;
    gw_upstream_pool *pool;
    const gw_config *cfg;
    char *exe, *runtime_dir;
    int exe_fd;  /* this process's image: what workers run */
    int lock_fd; /* holds runtime_dir (a configured one) for this gateway */
    bool own_runtime_dir, stopping;
    char ***devs; /* per worker config: its devices, "auto" expanded */
    int *n_devs;
    sworker *w;
    int n;
    gw_prefix_cand *cand; /* gw_supervisor_pick_for's scratch: n entries, and their workers */
    int *cand_idx;
    struct event *sigchld, *tick;
    void (*on_ready_change)(void *ud);
    void *on_ready_ud;
    void (*on_stats)(void *ud);
    void *on_stats_ud;
};

void gw_supervisor_on_ready_change(gw_supervisor *s, void (*fn)(void *ud), void *ud)
{
    s->on_ready_change = fn;
    s->on_ready_ud = ud;
}

void gw_supervisor_on_stats(gw_supervisor *s, void (*fn)(void *ud), void *ud)
{
    s->on_stats = fn;
    s->on_stats_ud = ud;
}

/* Ready: its stats say so, and its health checks do not say down. */
static void update_ready(sworker *w)
{
    bool was = w->info.ready;
    w->info.ready = w->stats_ready && !w->info.check_down;
    if (was != w->info.ready && w->sup->on_ready_change)
        w->sup->on_ready_change(w->sup->on_ready_ud);
}

static void set_ready(sworker *w, bool ready)
{
    w->stats_ready = ready;
    update_ready(w);
}

void gw_supervisor_set_check_down(gw_supervisor *s, int i, bool down)
{
    if (i < 0 || i >= s->n)
        return;
    s->w[i].info.check_down = down;
    update_ready(&s->w[i]);
}

/* The stats interval, and how long a worker may go without answering. */
static double stale_s(const gw_supervisor *s)
{
    double every = s->cfg->stats_interval_ms > 0 ? s->cfg->stats_interval_ms / 1000.0 : 0.25;
    return 3 * every > STALE_S ? 3 * every : STALE_S;
}

static void log_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void log_line(const char *fmt, ...)
{
    /* One write: stderr is unbuffered and shared with the workers. */
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line + 12, sizeof(line) - 13, fmt, ap);
    va_end(ap);
    memcpy(line, "supervisor: ", 12);
    n = n < 0 ? 0 : n > (int)sizeof(line) - 14 ? (int)sizeof(line) - 14 : n;
    line[12 + n] = '\n';
    fwrite(line, 1, (size_t)(12 + n + 1), stderr);
}

/* ---- spawning ---- */

static int spawn(sworker *w)
{
    gw_supervisor *s = w->sup;
    const gw_worker_cfg *c = w->cfg;
    char threads[16], kv[16], seqs[16], batch[16], queue[16], batch_wait[16], prompt_wait[16], grace[16],
        body[24], listen[600];
    snprintf(threads, sizeof(threads), "%d", c->threads);
    snprintf(kv, sizeof(kv), "%d", c->kv_cache_mb);
    snprintf(seqs, sizeof(seqs), "%d", c->max_seqs);
    snprintf(batch, sizeof(batch), "%d", c->max_batch_tokens);
    snprintf(queue, sizeof(queue), "%d", c->max_queue);
    snprintf(batch_wait, sizeof(batch_wait), "%d", c->batch_max_wait_ms);
    snprintf(prompt_wait, sizeof(prompt_wait), "%d", c->prompt_max_wait_ms);
    snprintf(grace, sizeof(grace), "%d", s->cfg->drain_grace_s);
    /* A body the gateway takes must not be refused by the worker it goes
     * to (whose own default is 1 MiB). The gateway keeps the configured
     * limit; workers take the most any configuration may set, so that a
     * reload raising it needs no restart of theirs. */
    snprintf(body, sizeof(body), "%ld", (long)GW_WORKER_MAX_BODY);
    snprintf(listen, sizeof(listen), "unix:%s", w->sock_path);
    const char *argv[40]; /* 35 at most, below */
    int a = 0;
    argv[a++] = s->exe;
    argv[a++] = "worker";
    argv[a++] = "--model";
    argv[a++] = c->model;
    argv[a++] = "--model-name";
    argv[a++] = c->name;
    argv[a++] = "--listen";
    argv[a++] = listen;
    if (c->threads > 0) {
        argv[a++] = "--threads";
        argv[a++] = threads;
    }
    argv[a++] = "--kv-cache-mb";
    argv[a++] = kv;
    argv[a++] = "--max-seqs";
    argv[a++] = seqs;
    argv[a++] = "--max-batch-tokens";
    argv[a++] = batch;
    argv[a++] = "--max-queue";
    argv[a++] = queue;
    argv[a++] = "--batch-max-wait-ms";
    argv[a++] = batch_wait;
    argv[a++] = "--prompt-max-wait-ms";
    argv[a++] = prompt_wait;
    argv[a++] = "--drain-grace-s";
    argv[a++] = grace;
    argv[a++] = "--max-body";
    argv[a++] = body;
    if (c->kv_q8_0) {
        argv[a++] = "--kv-type";
        argv[a++] = "q8_0";
    }
    if (!c->prefix_cache) {
        argv[a++] = "--prefix-cache";
        argv[a++] = "false";
    }
    if (c->chat_template) {
        argv[a++] = "--chat-template";
        argv[a++] = c->chat_template;
    }
    /* CUDA_VISIBLE_DEVICES (below) shows the worker just this GPU or MIG slice. */
    if (gw_device_is_gpu(w->device)) {
        argv[a++] = "--device";
        argv[a++] = "cuda";
    }
    argv[a] = NULL;

    /* Signals wait until the child has its own dispositions: the loop's
     * handlers it inherits would write into the gateway's signal pipe (a
     * SIGTERM meant for the child would drain the gateway). */
    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &old);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == -1) {
        int e = errno;
        sigprocmask(SIG_SETMASK, &old, NULL);
        return -e;
    }
    if (pid == 0) {
        static const int caught[] = {SIGTERM, SIGINT, SIGCHLD, SIGPIPE};
        for (size_t i = 0; i < sizeof(caught) / sizeof(caught[0]); i++)
            signal(caught[i], SIG_DFL);
        /* The gateway's reload signal is nothing to a worker (`pkill -HUP
         * infergate` reaches both), loading its model included: ignored
         * across exec. */
        signal(SIGHUP, SIG_IGN);
        /* A worker must not outlive its gateway, even one that died
         * before this line. Its own process group: a terminal's Ctrl-C is
         * the gateway's to pass on, after its drain. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(1);
        setpgid(0, 0);
        /* Nothing of the gateway's (sockets, the access log, Redis
         * connections) goes with it. */
        if (s->exe_fd > 3)
            close_range(3, (unsigned)s->exe_fd - 1, 0);
        close_range((unsigned)s->exe_fd + 1, ~0U, 0);
        if (strcmp(w->device, "cpu") != 0) {
            /* A GPU index means nvidia-smi's (and NVML's) numbering, which
             * is PCI order; CUDA's own default puts the fastest first. */
            setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 1);
            setenv("CUDA_VISIBLE_DEVICES", w->device, 1);
        } else
            unsetenv("CUDA_VISIBLE_DEVICES");
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        fexecve(s->exe_fd, (char *const *)argv, environ); /* the fd is close-on-exec */
        fprintf(stderr, "supervisor: exec %s: %s\n", s->exe, strerror(errno));
        _exit(127);
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    /* Only this process may answer on its socket: another that took the
     * socket's name is never called ready, nor sent a prompt. */
    if (gw_upstream_expect_pid(s->pool, w->target, (int)pid))
        log_line("worker %d: out of memory noting its pid: its socket's peer goes unchecked", w->info.index);
    w->info.pid = pid;
    w->info.ready = w->stats_ready = false;
    w->info.answered = w->info.check_down = false; /* a new process: its checks start over */
    w->info.tokens_generated = 0;
    w->started_at = gw_mono_s();
    w->last_stats = 0;
    w->asked_at = 0;
    w->hang_killed = false;
    log_line("worker %d (model %s, device %s) started: pid %d, socket %s", w->info.index, c->name, w->device,
             (int)pid, w->sock_path);
    return 0;
}

/* The wait before the next start after a failed one: doubling, within
 * BACKOFF_MIN_MS..BACKOFF_MAX_MS. */
static int next_backoff(int ms)
{
    return ms < BACKOFF_MIN_MS ? BACKOFF_MIN_MS : ms * 2 < BACKOFF_MAX_MS ? ms * 2 : BACKOFF_MAX_MS;
}

static void on_respawn(evutil_socket_t fd, short what, void *arg)
{
    sworker *w = arg;
    if (w->sup->stopping || w->info.pid)
        return;
    int rc = spawn(w);
    if (rc) {
        log_line("worker %d: cannot start: %s; retrying in %d ms", w->info.index, strerror(-rc), w->backoff_ms);
        struct timeval tv = {w->backoff_ms / 1000, (w->backoff_ms % 1000) * 1000};
        event_add(w->respawn, &tv);
        w->backoff_ms = next_backoff(w->backoff_ms);
    }
}

static void describe_status(int status, char *buf, size_t n)
{
    if (WIFEXITED(status))
        snprintf(buf, n, "exited with status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, n, "was killed by signal %d (%s)%s", WTERMSIG(status), strsignal(WTERMSIG(status)),
                 WCOREDUMP(status) ? ", core dumped" : "");
    else
        snprintf(buf, n, "ended with wait status %d", status);
}

static void on_sigchld(evutil_socket_t fd, short what, void *arg)
{
    gw_supervisor *s = arg;
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int i = 0; i < s->n; i++) {
            sworker *w = &s->w[i];
            if (w->info.pid != pid)
                continue;
            char why[128];
            describe_status(status, why, sizeof(why));
            w->info.pid = 0;
            set_ready(w, false);
            if (s->stopping) {
                log_line("worker %d (pid %d) %s", i, (int)pid, why);
                break;
            }
            double up = gw_mono_s() - w->started_at;
            w->backoff_ms = up > STABLE_S ? BACKOFF_MIN_MS : next_backoff(w->backoff_ms);
            w->info.restarts++;
            log_line("worker %d (model %s, device %s, pid %d) %s after %.1f s; restarting in %d ms", i,
                     w->cfg->name, w->device, (int)pid, why, up, w->backoff_ms);
            struct timeval tv = {w->backoff_ms / 1000, (w->backoff_ms % 1000) * 1000};
            event_add(w->respawn, &tv);
            break;
        }
    }
}

/* ---- stats ---- */

/* The worker's prefix hashes (16 hex digits each), sorted for lookup;
 * entries that do not parse are left out. */
static void take_prefixes(sworker *w, json_t *a)
{
    int n = 0;
    if (!w->prefixes) /* the sorted set, then the recent ones in order */
        w->prefixes = malloc((PREFIXES_MAX + GW_PREFIX_RECENT) * sizeof(*w->prefixes));
    uint64_t *recent = w->prefixes ? w->prefixes + PREFIXES_MAX : NULL;
    for (size_t k = 0; w->prefixes && k < json_array_size(a) && n < PREFIXES_MAX; k++) {
        const char *hex = json_string_value(json_array_get(a, k));
        char *end;
        if (hex && strlen(hex) == 16) {
            w->prefixes[n] = strtoull(hex, &end, 16);
            if (!*end && n < GW_PREFIX_RECENT)
                recent[n] = w->prefixes[n];
            n += !*end;
        }
    }
    w->info.recent = recent;
    w->info.n_recent = n < GW_PREFIX_RECENT ? n : GW_PREFIX_RECENT;
    w->info.n_prefixes = gw_prefix_sort(w->prefixes, n);
    w->info.prefixes = w->prefixes;
}

/* The stats' "tenants": entries with a name that fits, GW_WORKER_TENANTS at most. */
static void take_tenants(sworker *w, json_t *a)
{
    w->info.n_tenants = 0;
    if (!json_is_array(a) || (!w->tenants && !(w->tenants = calloc(GW_WORKER_TENANTS, sizeof(*w->tenants)))))
        return;
    for (size_t i = 0; i < json_array_size(a); i++) {
        json_t *e = json_array_get(a, i);
        const char *name = json_string_value(json_object_get(e, "name"));
        if (!name || strlen(name) >= sizeof(w->tenants[0].name) || w->info.n_tenants == GW_WORKER_TENANTS)
            continue;
        gw_worker_tenant *t = &w->tenants[w->info.n_tenants++];
        snprintf(t->name, sizeof(t->name), "%s", name);
        t->weight = json_number_value(json_object_get(e, "weight"));
        t->running = (int)json_integer_value(json_object_get(e, "running"));
        t->queued = (int)json_integer_value(json_object_get(e, "queued"));
        t->tokens = (double)json_integer_value(json_object_get(e, "tokens"));
        t->preempted = (double)json_integer_value(json_object_get(e, "preempted"));
        t->pushed_out = (double)json_integer_value(json_object_get(e, "pushed_out"));
        t->folded = (int)json_integer_value(json_object_get(e, "folded"));
    }
    w->info.tenants = w->tenants;
}

static void stats_done(sworker *w)
{
    w->stats_req = NULL;
    json_error_t jerr;
    json_t *o = w->stats_status == 200 ? json_loadb(w->stats_buf, w->stats_len, 0, &jerr) : NULL;
    free(w->stats_buf);
    w->stats_buf = NULL;
    w->stats_len = 0;
    if (!o)
        return;
    gw_worker_info *i = &w->info;
    i->queued = (int)json_integer_value(json_object_get(o, "queued"));
    i->running = (int)json_integer_value(json_object_get(o, "running"));
    i->max_seqs = (int)json_integer_value(json_object_get(o, "max_seqs"));
    i->kv_blocks_free = (int)json_integer_value(json_object_get(o, "kv_blocks_free"));
    i->kv_blocks_total = (int)json_integer_value(json_object_get(o, "kv_blocks_total"));
    i->ttft_ewma_ms = json_number_value(json_object_get(o, "ttft_ewma_ms"));
    i->tpot_ewma_ms = json_number_value(json_object_get(o, "tpot_ewma_ms"));
    i->prefill_ewma_ms = json_number_value(json_object_get(o, "prefill_ewma_ms"));
    i->tokens_per_s = json_number_value(json_object_get(o, "tokens_per_s"));
    i->est_ttft_ms = json_number_value(json_object_get(o, "est_ttft_ms"));
    i->prefill_tokens_per_s = json_number_value(json_object_get(o, "prefill_tokens_per_s"));
    const char *cls = json_string_value(json_object_get(o, "rate_class"));
    snprintf(i->rate_class, sizeof(i->rate_class), "%s", cls ? cls : "");
    i->prompt_tokens_ahead = (int)json_integer_value(json_object_get(o, "prompt_tokens_ahead"));
    i->prompt_tokens_computed = (double)json_integer_value(json_object_get(o, "prompt_tokens_computed"));
    i->prompt_tokens_cached = (double)json_integer_value(json_object_get(o, "prompt_tokens_cached"));
    i->kv_blocks_cached = (int)json_integer_value(json_object_get(o, "kv_blocks_cached"));
    i->est_prompt_tokens = (int)json_integer_value(json_object_get(o, "est_prompt_tokens"));
    i->prompt_bytes_per_token = json_number_value(json_object_get(o, "prompt_bytes_per_token"));
    i->tokens_generated = (double)json_integer_value(json_object_get(o, "tokens_generated"));
    i->answered = i->pid != 0;
    take_prefixes(w, json_object_get(o, "prefix_hashes"));
    take_tenants(w, json_object_get(o, "tenants"));
    json_decref(o);
    if (!w->stats_ready)
        log_line("worker %d (model %s, device %s, pid %d) is ready", i->index, w->cfg->name, w->device,
                 (int)i->pid);
    w->last_stats = gw_mono_s();
    w->asked_at = 0;
    w->picked = 0;
    w->picked_ms = 0;
    set_ready(w, i->pid != 0); /* last: the record it may refresh reads the figures above */
    if (w->sup->on_stats)
        w->sup->on_stats(w->sup->on_stats_ud);
}

static void st_response(void *ud, int status, const gw_http_header *h, size_t n)
{
    ((sworker *)ud)->stats_status = status;
}

static void st_data(void *ud, const uint8_t *data, size_t len)
{
    sworker *w = ud;
    gw_upstream_consume(w->stats_req, len);
    if (w->stats_len + len > STATS_MAX)
        return;
    char *p = realloc(w->stats_buf, w->stats_len + len);
    if (!p)
        return;
    memcpy(p + w->stats_len, data, len);
    w->stats_buf = p;
    w->stats_len += len;
}

static void st_end(void *ud)
{
    stats_done(ud);
}

static void st_error(void *ud, gw_upstream_error e, bool responded)
{
    sworker *w = ud;
    w->stats_status = 0;
    stats_done(w);
}

static const gw_upstream_cbs stats_cbs = {st_response, st_data, st_end, st_error, NULL};

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    gw_supervisor *s = arg;
    double now = gw_mono_s();
    int hang = s->cfg->worker_hang_timeout_s;
    for (int i = 0; i < s->n; i++) {
        sworker *w = &s->w[i];
        /* Its loop answers stats whatever its compute threads do: one that
         * has answered and then stopped is wedged (a stuck GPU call, a
         * deadlock) and holds its requests and its device for nothing.
         * Killed, it is restarted as after a crash. The time counts from
         * the first question it left unanswered, not from its last answer:
         * with stats_interval_ms past the timeout, it had not been asked. */
        if (hang > 0 && w->info.pid && w->last_stats > 0 && w->asked_at > 0 && !w->hang_killed &&
            !s->stopping && now - w->asked_at > hang) {
            log_line("worker %d (pid %d) has answered no stats request for %.0f s (worker_hang_timeout_s): "
                     "SIGKILL "
                     "to restart it",
                     i, (int)w->info.pid, now - w->asked_at);
            kill(w->info.pid, SIGKILL);
            w->hang_killed = true;
        }
        if (w->stats_ready && now - w->last_stats > stale_s(s)) {
            log_line("worker %d (pid %d) has not answered stats for %.1f s: not ready", i, (int)w->info.pid,
                     now - w->last_stats);
            set_ready(w, false);
        }
        /* A worker that reads the request but never answers it (a wedged
         * loop that came back, a lost stream) must not leave it unready for
         * good: give the request up and ask again. */
        if (w->stats_req && now - w->stats_sent > stale_s(s)) {
            log_line("worker %d (pid %d): stats request unanswered for %.1f s; asking again", i,
                     (int)w->info.pid, now - w->stats_sent);
            gw_upstream_cancel(w->stats_req);
            w->stats_req = NULL;
            free(w->stats_buf);
            w->stats_buf = NULL;
            w->stats_len = 0;
        }
        if (!w->info.pid || w->stats_req)
            continue;
        w->stats_status = 0;
        w->stats_sent = now;
        if (!w->asked_at)
            w->asked_at = now;
        w->stats_req = gw_upstream_send(s->pool, w->target, "GET", "/internal/stats", "localhost", NULL, 0, NULL, 0,
                                        &stats_cbs, w);
    }
}

/* ---- setup ---- */

/* Whoever may write to runtime_dir may put a socket of their own where a
 * worker's was, and be sent prompts: it must be this user's, and no one
 * else may write to it (its group neither). dfd: the directory, opened. */
static int check_runtime_dir(const char *dir, int dfd, char *err, size_t err_len)
{
    struct stat st;
    if (fstat(dfd, &st) == -1) {
        int e = errno;
        snprintf(err, err_len, "runtime_dir %s: %s", dir, strerror(e));
        return -e;
    }
    if (st.st_uid != geteuid()) {
        snprintf(err, err_len,
                 "runtime_dir %s belongs to uid %u, not to this gateway's user (uid %u): another user could "
                 "replace worker sockets there; give it one of its own",
                 dir, (unsigned)st.st_uid, (unsigned)geteuid());
        return -EPERM;
    }
    if (st.st_mode & 0022) {
        snprintf(err, err_len,
                 "runtime_dir %s has mode %04o: %s may write to it and replace worker sockets; "
                 "chmod go-w it (0700 is best)",
                 dir, (unsigned)(st.st_mode & 07777), st.st_mode & 0002 ? "every local user" : "its group");
        return -EPERM;
    }
    return 0;
}

static int make_runtime_dir(gw_supervisor *s, char *err, size_t err_len)
{
    if (s->cfg->runtime_dir) {
        s->runtime_dir = strdup(s->cfg->runtime_dir);
        if (!s->runtime_dir)
            return -ENOMEM;
        if (mkdir(s->runtime_dir, 0700) == -1 && errno != EEXIST) {
            int e = errno;
            snprintf(err, err_len, "runtime_dir %s: %s", s->runtime_dir, strerror(e));
            return -e;
        }
        int dfd = open(s->runtime_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), rc;
        if (dfd == -1) {
            int e = errno;
            snprintf(err, err_len, "runtime_dir %s: %s", s->runtime_dir, strerror(e));
            return -e;
        }
        if ((rc = check_runtime_dir(s->runtime_dir, dfd, err, err_len))) {
            close(dfd);
            return rc;
        }
        /* Worker sockets are named by index: a second gateway on the same
         * directory would take the first's, and remove them as it stops.
         * The lock is opened in the directory just checked, never through
         * a link to a file elsewhere. */
        s->lock_fd = openat(dfd, "gateway.lock", O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        int e = s->lock_fd == -1 ? errno : 0;
        close(dfd);
        if (s->lock_fd == -1 || flock(s->lock_fd, LOCK_EX | LOCK_NB) == -1) {
            e = e ? e : errno;
            if (e == EWOULDBLOCK)
                snprintf(err, err_len,
                         "runtime_dir %s is in use by another infergate serve: give each its own",
                         s->runtime_dir);
            else
                snprintf(err, err_len, "runtime_dir %s: cannot lock %s/gateway.lock: %s%s", s->runtime_dir,
                         s->runtime_dir, strerror(e), e == ELOOP ? " (it is a symbolic link)" : "");
            return -e;
        }
        return 0;
    }
    char tmpl[] = "/tmp/infergate-XXXXXX";
    if (!mkdtemp(tmpl)) {
        int e = errno;
        snprintf(err, err_len, "cannot make a runtime directory under /tmp: %s", strerror(e));
        return -e;
    }
    s->own_runtime_dir = true;
    s->runtime_dir = strdup(tmpl);
    return s->runtime_dir ? 0 : -ENOMEM;
}

gw_supervisor *gw_supervisor_new(struct event_base *base, gw_upstream_pool *pool, const gw_config *c,
                                 const char *exe, char *err, size_t err_len)
{
    gw_supervisor *s = calloc(1, sizeof(*s));
    if (!s)
        goto nomem;
    s->base = base;
    s->pool = pool;
    s->cfg = c;
    s->lock_fd = -1;
    /* At 3 or above: the child keeps it open past its close_range of
     * everything from 3 on, and never in place of stdin, stdout or stderr. */
    int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    s->exe_fd = fd >= 3 || fd == -1 ? fd : fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (fd >= 0 && fd < 3)
        close(fd);
    if (s->exe_fd == -1) {
        snprintf(err, err_len, "cannot open my own binary (/proc/self/exe): %s", strerror(errno));
        free(s);
        return NULL;
    }
    if (!(s->exe = strdup(exe)))
        goto nomem;
    if (make_runtime_dir(s, err, err_len))
        goto fail;
    /* devices: [auto] becomes one worker per GPU or MIG instance found. */
    int n = 0;
    if (!(s->devs = calloc((size_t)(c->n_workers ? c->n_workers : 1), sizeof(*s->devs))) ||
        !(s->n_devs = calloc((size_t)(c->n_workers ? c->n_workers : 1), sizeof(*s->n_devs))))
        goto nomem;
    for (int i = 0; i < c->n_workers; i++) {
        char why[512];
        if (gw_gpu_expand_devices(c->workers[i].devices, c->workers[i].n_devices, NULL, PROBE_MS, &s->devs[i],
                                  &s->n_devs[i], why, sizeof(why)))
            goto nomem;
        if (why[0])
            log_line("model %s, devices auto: %s", c->workers[i].name, why);
        n += s->n_devs[i];
    }
    s->w = calloc((size_t)(n ? n : 1), sizeof(sworker));
    s->cand = calloc((size_t)(n ? n : 1), sizeof(*s->cand));
    s->cand_idx = calloc((size_t)(n ? n : 1), sizeof(*s->cand_idx));
    if (!s->w || !s->cand || !s->cand_idx)
        goto nomem;
    for (int i = 0; i < c->n_workers; i++) {
        for (int d = 0; d < s->n_devs[i]; d++) {
            sworker *w = &s->w[s->n];
            char path[512];
            snprintf(path, sizeof(path), "%s/worker-%d.sock", s->runtime_dir, s->n);
            w->sup = s;
            w->cfg = &c->workers[i];
            w->device = strdup(s->devs[i][d]);
            w->sock_path = strdup(path);
            size_t tl = strlen(path) + 6;
            w->target = malloc(tl);
            w->respawn = evtimer_new(base, on_respawn, w);
            if (!w->device || !w->sock_path || !w->target || !w->respawn)
                goto nomem;
            snprintf(w->target, tl, "unix:%s", path);
            w->info = (gw_worker_info){.index = s->n, .model = w->cfg->name, .device = w->device,
                                       .target = w->target, .max_seqs = w->cfg->max_seqs};
            s->n++;
        }
    }
    s->sigchld = evsignal_new(base, SIGCHLD, on_sigchld, s);
    s->tick = event_new(base, -1, EV_PERSIST, on_tick, s);
    if (!s->sigchld || !s->tick || event_add(s->sigchld, NULL))
        goto nomem;
    int ms = c->stats_interval_ms > 0 ? c->stats_interval_ms : 250;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    if (event_add(s->tick, &tv))
        goto nomem;
    return s;
nomem:
    snprintf(err, err_len, "out of memory");
fail:
    gw_supervisor_free(s);
    return NULL;
}

int gw_supervisor_start(gw_supervisor *s, char *err, size_t err_len)
{
    for (int i = 0; i < s->n; i++) {
        int rc = spawn(&s->w[i]);
        if (rc) {
            snprintf(err, err_len, "cannot start worker %d: %s", i, strerror(-rc));
            return rc;
        }
    }
    return 0;
}

void gw_supervisor_drain(gw_supervisor *s)
{
    s->stopping = true;
}

void gw_supervisor_stop(gw_supervisor *s)
{
    s->stopping = true;
    if (s->tick)
        event_del(s->tick);
    for (int i = 0; i < s->n; i++) {
        sworker *w = &s->w[i];
        if (w->stats_req)
            gw_upstream_cancel(w->stats_req);
        w->stats_req = NULL;
        if (w->respawn)
            event_del(w->respawn);
        if (w->info.pid)
            kill(w->info.pid, SIGTERM);
    }
}

void gw_supervisor_wait(gw_supervisor *s, int grace_s, volatile sig_atomic_t *hurry)
{
    double deadline = gw_mono_s() + grace_s, allowed = grace_s;
    bool hurried = false;
    int kills = 0;
    for (;;) {
        if (hurry && *hurry && !hurried) {
            hurried = true;
            if (gw_mono_s() + 1 < deadline) {
                deadline = gw_mono_s() + 1;
                allowed = 1;
            }
        }
        int alive = 0;
        for (int i = 0; i < s->n; i++) {
            sworker *w = &s->w[i];
            if (!w->info.pid)
                continue;
            int status = 0;
            pid_t r = waitpid(w->info.pid, &status, WNOHANG);
            if (r == w->info.pid || (r == -1 && errno == ECHILD)) {
                char why[128] = "was already reaped";
                if (r == w->info.pid)
                    describe_status(status, why, sizeof(why));
                log_line("worker %d (pid %d) %s", i, (int)w->info.pid, why);
                w->info.pid = 0;
            } else {
                alive++;
            }
        }
        if (!alive)
            break;
        if (gw_mono_s() > deadline) {
            /* Still there 10 s after a SIGKILL (sent twice): asleep in a driver call that
             * cannot be interrupted. Waiting on would hang the stop for
             * good (systemd would record a failure); init reaps it later. */
            if (kills == 2) {
                for (int i = 0; i < s->n; i++)
                    if (s->w[i].info.pid)
                        log_line("worker %d (pid %d) cannot be reaped (stuck in the kernel?): leaving it", i,
                                 (int)s->w[i].info.pid);
                break;
            }
            for (int i = 0; i < s->n; i++)
                if (s->w[i].info.pid) {
                    if (kills == 0)
                        log_line("worker %d (pid %d) did not stop within %.0f s: SIGKILL", i,
                                 (int)s->w[i].info.pid, allowed);
                    kill(s->w[i].info.pid, SIGKILL);
                }
            kills++;
            deadline = gw_mono_s() + 5;
        }
        nanosleep(&(struct timespec){0, 20000000}, NULL);
    }
}

void gw_supervisor_free(gw_supervisor *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n; i++) {
        sworker *w = &s->w[i];
        if (w->info.pid)
            kill(w->info.pid, SIGKILL);
        if (w->stats_req)
            gw_upstream_cancel(w->stats_req);
        if (w->respawn)
            event_free(w->respawn);
        if (w->sock_path)
            unlink(w->sock_path);
        free(w->stats_buf);
        free(w->prefixes);
        free(w->tenants);
        free(w->device);
        free(w->sock_path);
        free(w->target);
    }
    if (s->sigchld)
        event_free(s->sigchld);
    if (s->tick)
        event_free(s->tick);
    if (s->own_runtime_dir && s->runtime_dir)
        rmdir(s->runtime_dir);
    for (int i = 0; s->devs && s->n_devs && i < s->cfg->n_workers; i++)
        gw_gpu_devices_free(s->devs[i], s->n_devs[i]);
    free(s->devs);
    free(s->n_devs);
    free(s->runtime_dir);
    free(s->exe);
    close(s->exe_fd);
    if (s->lock_fd >= 0)
        close(s->lock_fd);
    free(s->w);
    free(s->cand);
    free(s->cand_idx);
    free(s);
}

int gw_supervisor_count(const gw_supervisor *s)
{
    return s->n;
}

const gw_worker_info *gw_supervisor_worker(const gw_supervisor *s, int i)
{
    return &s->w[i].info;
}

int gw_supervisor_ready_count(const gw_supervisor *s)
{
    int n = 0;
    for (int i = 0; i < s->n; i++)
        n += s->w[i].info.ready;
    return n;
}

bool gw_supervisor_serves(const gw_supervisor *s, const char *model)
{
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->w[i].cfg->name, model))
            return true;
    return false;
}

static int pick(gw_supervisor *s, const char *model, int exclude, int min_kv_blocks)
{
    int best = -1;
    double best_load = 0;
    for (int i = 0; i < s->n; i++) {
        const sworker *w = &s->w[i];
        if (i == exclude || !w->info.ready || strcmp(w->cfg->name, model) ||
            w->info.kv_blocks_total < min_kv_blocks)
            continue;
        int slots = w->info.max_seqs > 0 ? w->info.max_seqs : 1;
        /* A waiting request weighs a whole batch: it waits for a slot.
         * Requests sent since the last stats most likely run at once. */
        double load = (double)w->info.queued + (double)(w->info.running + w->picked) / slots;
        if (best < 0 || load < best_load) {
            best = i;
            best_load = load;
        }
    }
    if (best >= 0) {
        s->w[best].picked++;
        s->w[best].picked_ms += s->w[best].info.prefill_ewma_ms;
    }
    return best;
}

int gw_supervisor_pick(gw_supervisor *s, const char *model, int exclude)
{
    return pick(s, model, exclude, 0);
}

static bool eligible(const sworker *w, const char *model)
{
    return w->info.ready && !strcmp(w->cfg->name, model);
}

double gw_supervisor_ms_per_byte(const gw_worker_info *w)
{
    if (!(w->prefill_tokens_per_s > 0))
        return 0;
    double bpt = w->prompt_bytes_per_token > 0 ? w->prompt_bytes_per_token : GW_PREFIX_BYTES_PER_TOKEN;
    return 1000.0 / w->prefill_tokens_per_s / bpt;
}

/* Prefill ms per prompt byte: the mean of those measured by the workers of
 * its class (its own included), else of all its siblings, else a guess
 * (all alike, so that it decides nothing). Pooled because one worker's
 * figure is taken under whatever else ran then and stays until it runs a
 * prompt again: two workers of one model on one CPU read 611 and 1147
 * tokens/s, and sessions moved between them (test_worker_affinity). */
static double ms_per_byte(const gw_supervisor *s, const sworker *w, const char *model)
{
    double sum = 0, like = 0;
    int n = 0, n_like = 0;
    for (int i = 0; i < s->n; i++) {
        const sworker *o = &s->w[i];
        double x = o == w || eligible(o, model) ? gw_supervisor_ms_per_byte(&o->info) : 0;
        if (!(x > 0))
            continue;
        sum += x;
        n++;
        if (!strcmp(o->info.rate_class, w->info.rate_class)) {
            like += x;
            n_like++;
        }
    }
    return n_like ? like / n_like : n ? sum / n : DEFAULT_MS_PER_BYTE;
}

/* How long a request joining now waits before its own prefill: the
 * worker's TTFT estimate less the prefill of the prompt it was made for,
 * and the prefill of the requests sent to it since its last stats (as
 * expected when sent: a turn whose prefix was there weighs its new part
 * only; one sent by the least-loaded rule, a typical prefill). */
static double wait_ms(const sworker *w, double mpb, double prompt_bytes)
{
    const gw_worker_info *i = &w->info;
    if (i->queued == 0 && i->running == 0) /* idle: what the estimate says past its prefill is noise */
        return w->picked_ms;
    double bpt = i->prompt_bytes_per_token > 0 ? i->prompt_bytes_per_token : GW_PREFIX_BYTES_PER_TOKEN;
    double own = i->est_prompt_tokens > 0 ? i->est_prompt_tokens * bpt * mpb : 0;
    double wait = i->est_ttft_ms > own ? i->est_ttft_ms - own : 0;
    if (i->est_ttft_ms <= 0) /* no step run yet: by the counts */
        wait = i->queued * (i->prefill_ewma_ms > 0 ? i->prefill_ewma_ms : prompt_bytes * mpb);
    return wait + w->picked_ms;
}

int gw_supervisor_pick_for(gw_supervisor *s, const char *model, int exclude, const gw_prefix_chain *chain,
                           double prompt_bytes, uint64_t session, double *cached_bytes)
{
    if (cached_bytes)
        *cached_bytes = 0;
    gw_prefix_cand *cand = s->cand;
    int *idx = s->cand_idx, n = 0;
    bool hit = false;
    for (int i = 0; i < s->n; i++) {
        const sworker *w = &s->w[i];
        if (i == exclude || !eligible(w, model))
            continue;
        double mpb = ms_per_byte(s, w, model);
        cand[n] = (gw_prefix_cand){w->info.prefixes, w->info.n_prefixes, wait_ms(w, mpb, prompt_bytes), mpb,
                                   (uint32_t)i};
        hit |= gw_prefix_match(chain, w->info.prefixes, w->info.n_prefixes) > 0;
        idx[n++] = i;
    }
    if (!hit && !session)
        return pick(s, model, exclude, 0);
    double ttft, cached;
    int k = gw_prefix_choose(chain, prompt_bytes, cand, n, session, &ttft, &cached);
    if (k < 0)
        return -1;
    sworker *w = &s->w[idx[k]];
    w->picked++;
    w->picked_ms += (prompt_bytes > cached ? prompt_bytes - cached : 0) * cand[k].ms_per_byte;
    if (cached_bytes)
        *cached_bytes = cached;
    return idx[k];
}

int gw_supervisor_pick_larger(gw_supervisor *s, const char *model, int than)
{
    if (than < 0 || than >= s->n)
        return -1;
    return pick(s, model, than, s->w[than].info.kv_blocks_total + 1);
}
