/* GPU and MIG listing from `nvidia-smi -L`, and worker placement (see
 * gpu_list.h). The two line shapes:
 *
 *   GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-4b2f...)
 *     MIG 1g.10gb     Device  0: (UUID: MIG-8d7e...)
 *
 * A GPU with MIG on lists its instances under it; one with MIG on but no
 * instance made lists none, and CUDA cannot use it either way. */
#define _GNU_SOURCE /* memmem, pipe2 */
#include "gateway/supervisor/gpu_list.h"
#include "gateway/base/clock.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PROBE_MAX_OUTPUT (1u << 20)

extern char **environ;

void gw_gpu_list_dispose(gw_gpu_list *l)
{
    for (int i = 0; i < l->n_gpus; i++)
        free(l->gpus[i].migs);
    free(l->gpus);
    l->gpus = NULL;
    l->n_gpus = 0;
}

static const char *skip_spaces(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t'))
        p++;
    return p;
}

/* Reads a decimal index; NULL if there is none. */
static const char *read_index(const char *p, const char *end, int *out)
{
    long v = 0;
    const char *s = p;
    while (p < end && isdigit((unsigned char)*p) && v < 1000000)
        v = v * 10 + (*p++ - '0');
    if (p == s)
        return NULL;
    *out = (int)v;
    return p;
}

/* "... (UUID: X)" at the end of [p, end): copies X; NULL when absent. */
static const char *uuid_suffix(const char *p, const char *end, char *uuid, size_t n)
{
    static const char tag[] = "(UUID: ";
    const char *found = NULL;
    for (const char *q = p; q + sizeof(tag) - 1 <= end; q++)
        if (!memcmp(q, tag, sizeof(tag) - 1))
            found = q; /* the last one: a name could hold parentheses */
    if (!found || end[-1] != ')')
        return NULL;
    const char *u = found + sizeof(tag) - 1;
    size_t len = (size_t)(end - 1 - u);
    if (len == 0 || len >= n)
        return NULL;
    for (size_t i = 0; i < len; i++)
        if (isspace((unsigned char)u[i]))
            return NULL;
    memcpy(uuid, u, len);
    uuid[len] = '\0';
    return found;
}

static int parse_gpu(const char *p, const char *end, gw_gpu *g)
{
    memset(g, 0, sizeof(*g));
    if (end - p < 4 || memcmp(p, "GPU ", 4))
        return -1;
    if (!(p = read_index(p + 4, end, &g->index)) || p + 2 > end || p[0] != ':' || p[1] != ' ')
        return -1;
    p += 2;
    const char *tail = uuid_suffix(p, end, g->uuid, sizeof(g->uuid));
    if (!tail)
        return -1;
    while (tail > p && tail[-1] == ' ')
        tail--;
    size_t nl = (size_t)(tail - p);
    if (nl == 0)
        return -1;
    if (nl >= sizeof(g->name))
        nl = sizeof(g->name) - 1;
    memcpy(g->name, p, nl);
    g->name[nl] = '\0';
    return 0;
}

static int parse_mig(const char *p, const char *end, gw_mig *m)
{
    memset(m, 0, sizeof(*m));
    if (end - p < 4 || memcmp(p, "MIG ", 4))
        return -1;
    p = skip_spaces(p + 4, end);
    const char *prof = p;
    while (p < end && *p != ' ' && *p != '\t')
        p++;
    size_t pl = (size_t)(p - prof);
    if (pl == 0 || pl >= sizeof(m->profile))
        return -1;
    memcpy(m->profile, prof, pl);
    m->profile[pl] = '\0';
    p = skip_spaces(p, end);
    if (end - p < 6 || memcmp(p, "Device", 6))
        return -1;
    p = skip_spaces(p + 6, end);
    if (!(p = read_index(p, end, &m->index)) || p >= end || *p != ':')
        return -1;
    p = skip_spaces(p + 1, end);
    const char *tag = uuid_suffix(p, end, m->uuid, sizeof(m->uuid));
    return tag == p ? 0 : -1; /* nothing but the UUID after "Device N:" */
}

int gw_gpu_list_parse(const char *text, size_t len, gw_gpu_list *out, char *err, size_t err_len)
{
    memset(out, 0, sizeof(*out));
    const char *p = text, *end = text + len;
    int line_no = 0, cap = 0;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end, *next = nl ? nl + 1 : end;
        line_no++;
        while (le > p && (le[-1] == '\r' || le[-1] == ' ' || le[-1] == '\t'))
            le--;
        const char *s = skip_spaces(p, le);
        p = next;
        if (s == le)
            continue;
        if (le - s >= 16 && !memcmp(s, "No devices found", 16))
            continue;
        gw_gpu g;
        gw_mig m;
        if (parse_gpu(s, le, &g) == 0) {
            if (out->n_gpus == cap) {
                int ncap = cap ? cap * 2 : 8;
                gw_gpu *ng = realloc(out->gpus, (size_t)ncap * sizeof(*ng));
                if (!ng)
                    goto nomem;
                out->gpus = ng;
                cap = ncap;
            }
            out->gpus[out->n_gpus++] = g;
        } else if (parse_mig(s, le, &m) == 0) {
            if (out->n_gpus == 0) {
                snprintf(err, err_len, "nvidia-smi -L line %d: a MIG instance before any GPU", line_no);
                gw_gpu_list_dispose(out);
                return -EINVAL;
            }
            gw_gpu *last = &out->gpus[out->n_gpus - 1];
            gw_mig *nm = realloc(last->migs, (size_t)(last->n_migs + 1) * sizeof(*nm));
            if (!nm)
                goto nomem;
            last->migs = nm;
            last->migs[last->n_migs++] = m;
        } else {
            int n = (int)(le - s) > 80 ? 80 : (int)(le - s);
            char shown[81];
            for (int i = 0; i < n; i++)
                shown[i] = isprint((unsigned char)s[i]) ? s[i] : '?';
            shown[n] = '\0';
            snprintf(err, err_len, "nvidia-smi -L line %d is neither a GPU nor a MIG line: \"%s\"", line_no,
                     shown);
            gw_gpu_list_dispose(out);
            return -EINVAL;
        }
    }
    return 0;
nomem:
    snprintf(err, err_len, "out of memory");
    gw_gpu_list_dispose(out);
    return -ENOMEM;
}

void gw_gpu_devices_free(char **devices, int n)
{
    if (!devices)
        return;
    for (int i = 0; i < n; i++)
        free(devices[i]);
    free(devices);
}

int gw_gpu_placement(const gw_gpu_list *l, char ***devices, int *n)
{
    int total = 0;
    for (int i = 0; i < l->n_gpus; i++)
        total += l->gpus[i].n_migs ? l->gpus[i].n_migs : 1;
    char **d = calloc((size_t)(total ? total : 1), sizeof(*d));
    if (!d)
        return -ENOMEM;
    int k = 0;
    for (int i = 0; i < l->n_gpus; i++) {
        const gw_gpu *g = &l->gpus[i];
        /* MIG on: the instances are the devices; the GPU itself cannot be
         * used by CUDA as a whole. */
        for (int j = 0; j < g->n_migs; j++)
            if (!(d[k++] = strdup(g->migs[j].uuid)))
                goto nomem;
        if (g->n_migs == 0 && !(d[k++] = strdup(g->uuid)))
            goto nomem;
    }
    *devices = d;
    *n = total;
    return 0;
nomem:
    gw_gpu_devices_free(d, k);
    return -ENOMEM;
}

int gw_gpu_list_probe(const char *nvidia_smi, int timeout_ms, gw_gpu_list *out, char *err, size_t err_len)
{
    memset(out, 0, sizeof(*out));
    const char *prog = nvidia_smi ? nvidia_smi : "nvidia-smi";
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) == -1) {
        snprintf(err, err_len, "pipe: %s", strerror(errno));
        return -errno;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    char *const argv[] = {(char *)prog, (char *)"-L", NULL};
    pid_t pid;
    int rc = posix_spawnp(&pid, prog, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (rc != 0) {
        close(fds[0]);
        snprintf(err, err_len, "cannot run %s: %s", prog, strerror(rc));
        return rc == ENOENT ? -ENOENT : -rc;
    }

    char *buf = malloc(PROBE_MAX_OUTPUT);
    size_t len = 0;
    bool timed_out = false;
    double deadline = 1e3 * gw_mono_s() + (timeout_ms > 0 ? timeout_ms : 1);
    if (!buf) {
        rc = -ENOMEM;
        snprintf(err, err_len, "out of memory");
    }
    while (buf) {
        double left = deadline - 1e3 * gw_mono_s();
        if (left <= 0) {
            timed_out = true;
            break;
        }
        struct pollfd pf = {fds[0], POLLIN, 0};
        int pr = poll(&pf, 1, (int)left + 1);
        if (pr == -1 && errno == EINTR)
            continue;
        if (pr == 0)
            continue; /* the deadline check above ends it */
        if (pr == -1)
            break;
        ssize_t r = read(fds[0], buf + len, PROBE_MAX_OUTPUT - len);
        if (r == -1 && errno == EINTR)
            continue;
        if (r <= 0)
            break; /* end of output (or an error: parse what came) */
        len += (size_t)r;
        if (len == PROBE_MAX_OUTPUT)
            break;
    }
    close(fds[0]);

    /* The output is complete (or given up on): now the child itself, within
     * the same deadline. */
    int status = 0;
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid || (w == -1 && errno != EINTR))
            break;
        if (timed_out || 1e3 * gw_mono_s() > deadline) {
            timed_out = true;
            kill(pid, SIGKILL);
            while (waitpid(pid, &status, 0) == -1 && errno == EINTR)
                ;
            break;
        }
        nanosleep(&(struct timespec){0, 5000000}, NULL);
    }
    if (!buf)
        return rc;
    if (timed_out) {
        free(buf);
        snprintf(err, err_len, "%s -L did not finish within %d ms", prog, timeout_ms);
        return -ETIMEDOUT;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        /* "No devices found" exits non-zero: that is an answer, not a failure. */
        bool none = len >= 16 && memmem(buf, len, "No devices found", 16);
        if (!none) {
            free(buf);
            if (WIFEXITED(status))
                snprintf(err, err_len, "%s -L exited with status %d", prog, WEXITSTATUS(status));
            else
                snprintf(err, err_len, "%s -L was killed by signal %d", prog, WTERMSIG(status));
            return -EIO;
        }
        len = 0;
    }
    rc = gw_gpu_list_parse(buf, len, out, err, err_len);
    free(buf);
    return rc;
}

bool gw_device_is_gpu(const char *device)
{
    return device && strcmp(device, "cpu") != 0;
}

int gw_gpu_expand_devices(char *const *devices, int n_devices, const char *nvidia_smi, int timeout_ms,
                          char ***out, int *n_out, char *why, size_t why_len)
{
    *out = NULL;
    *n_out = 0;
    if (why && why_len)
        why[0] = '\0';
    if (n_devices == 1 && !strcmp(devices[0], "auto")) {
        gw_gpu_list l;
        char perr[256];
        int rc = gw_gpu_list_probe(nvidia_smi, timeout_ms, &l, perr, sizeof(perr));
        if (rc == -ENOMEM)
            return rc;
        if (rc == 0) {
            int migs = 0;
            for (int i = 0; i < l.n_gpus; i++)
                migs += l.gpus[i].n_migs;
            rc = gw_gpu_placement(&l, out, n_out);
            if (why)
                snprintf(why, why_len, "%d GPU%s, %d MIG instance%s: %d worker%s", l.n_gpus,
                         l.n_gpus == 1 ? "" : "s", migs, migs == 1 ? "" : "s", *n_out,
                         *n_out == 1 ? "" : "s");
            gw_gpu_list_dispose(&l);
            if (rc)
                return rc;
            if (*n_out > 0)
                return 0;
            gw_gpu_devices_free(*out, 0);
            *out = NULL;
        } else if (why) {
            snprintf(why, why_len, "%s", perr);
        }
        if (why) {
            size_t used = strlen(why);
            snprintf(why + used, why_len - used, "%sno GPU: one CPU worker", used ? "; " : "");
        }
        char **d = calloc(1, sizeof(*d));
        if (!d || !(d[0] = strdup("cpu"))) {
            free(d);
            return -ENOMEM;
        }
        *out = d;
        *n_out = 1;
        return 0;
    }
    char **d = calloc((size_t)(n_devices > 0 ? n_devices : 1), sizeof(*d));
    if (!d)
        return -ENOMEM;
    for (int i = 0; i < n_devices; i++) {
        if (!(d[i] = strdup(devices[i]))) {
            gw_gpu_devices_free(d, i);
            return -ENOMEM;
        }
    }
    *out = d;
    *n_out = n_devices;
    return 0;
}
