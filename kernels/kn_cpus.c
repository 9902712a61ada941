/* How many threads the pool may usefully run when the caller does not
 * say: the CPUs this process may run on (taskset, a container's cpuset),
 * and no more than a CPU quota allows (a container's CPU limit: in a pod
 * limited to 2 CPUs on a 64-core host, 64 spinning threads would be
 * throttled together every period, and every step would wait for them). */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "kernels/kn.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PATH_LEN 4096

/* The first line of a small file, or false. */
static bool read_line(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return false;
    bool ok = fgets(buf, (int)len, f) != NULL;
    fclose(f);
    return ok;
}

/* CPUs (quota / period) in the cgroup directory dir, or 0 for none:
 * cgroup v2's cpu.max ("max 100000" or "150000 100000"), else v1's
 * cpu.cfs_quota_us (-1: none) over cpu.cfs_period_us. */
static double dir_quota(const char *dir)
{
    char path[PATH_LEN + 32], line[128];
    long long quota = -1, period = 0;
    snprintf(path, sizeof(path), "%s/cpu.max", dir);
    if (read_line(path, line, sizeof(line))) {
        if (sscanf(line, "%lld %lld", &quota, &period) != 2)
            return 0; /* "max ...": no quota */
    } else {
        snprintf(path, sizeof(path), "%s/cpu.cfs_quota_us", dir);
        if (!read_line(path, line, sizeof(line)) || sscanf(line, "%lld", &quota) != 1)
            return 0;
        snprintf(path, sizeof(path), "%s/cpu.cfs_period_us", dir);
        if (!read_line(path, line, sizeof(line)) || sscanf(line, "%lld", &period) != 1)
            return 0;
    }
    return quota > 0 && period > 0 ? (double)quota / (double)period : 0;
}

/* The smallest quota on the way from base/path up to base: a limit set
 * on a parent (a pod's, above its container's) binds too. */
static double path_quota(const char *base, const char *path)
{
    char dir[PATH_LEN];
    if (snprintf(dir, sizeof(dir), "%s%s", base, path) >= (int)sizeof(dir))
        return 0;
    size_t keep = strlen(base);
    double best = 0;
    for (;;) {
        double q = dir_quota(dir);
        if (q > 0 && (best == 0 || q < best))
            best = q;
        char *slash = strrchr(dir, '/');
        if (!slash || (size_t)(slash - dir) < keep)
            break;
        *slash = '\0';
    }
    return best;
}

int kn_cpu_quota(const char *cgroup_root, const char *self_cgroup)
{
    FILE *f = fopen(self_cgroup, "re");
    if (!f)
        return 0;
    char line[PATH_LEN], base[PATH_LEN];
    double best = 0;
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        /* "ID:CONTROLLERS:PATH": v2 is "0::PATH", v1 names its controllers */
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2 || c2[1] != '/')
            continue;
        *c2 = '\0';
        const char *controllers = c1 + 1, *path = c2 + 1;
        if (!*controllers)
            snprintf(base, sizeof(base), "%s", cgroup_root);
        else {
            /* v1: the hierarchy with the cpu controller, mounted under its
             * controllers' names ("cpu", "cpu,cpuacct") */
            char names[256], *save = NULL;
            bool cpu = false;
            snprintf(names, sizeof(names), "%s", controllers);
            for (char *t = strtok_r(names, ",", &save); t; t = strtok_r(NULL, ",", &save))
                cpu |= !strcmp(t, "cpu");
            if (!cpu)
                continue;
            snprintf(base, sizeof(base), "%s/%s", cgroup_root, controllers);
        }
        if (!strcmp(path, "/"))
            path = "";
        double q = path_quota(base, path);
        if (q > 0 && (best == 0 || q < best))
            best = q;
    }
    fclose(f);
    /* Whole CPUs: threads past the quota are throttled, and a step waits
     * for its slowest thread. */
    return best <= 0 ? 0 : best < 1 ? 1 : (int)best;
}

int kn_usable_cpus(void)
{
    cpu_set_t set;
    long n = sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) >= 1
                 ? CPU_COUNT(&set)
                 : sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1)
        n = 1;
    int quota = kn_cpu_quota("/sys/fs/cgroup", "/proc/self/cgroup");
    return quota > 0 && quota < n ? quota : (int)n;
}
