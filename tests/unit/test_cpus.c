/* Tests of the kernel pool's CPU quota lookup (kernels/kn_cpus.c) on cgroup
 * trees made in a temporary directory, as /sys/fs/cgroup and
 * /proc/self/cgroup lay them out: v2 (cpu.max, a limit on a parent
 * binding), v1 (cfs_quota_us over cfs_period_us, under the hierarchy with
 * the cpu controller, "cpu,cpuacct" included), a path the mount does not
 * show (a container without a cgroup namespace sees its own at the root),
 * no quota, unreadable values. A real cgroup is tried in test_worker. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "kernels/kn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[64];

static void put(const char *rel, const char *text)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", root, rel);
    /* its directories first */
    for (char *p = path + strlen(root) + 1; (p = strchr(p, '/')); p++) {
        *p = '\0';
        mkdir(path, 0755);
        *p = '/';
    }
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int quota(const char *self)
{
    put("self", self);
    char sys[128], self_path[128];
    snprintf(sys, sizeof(sys), "%s/sys", root);
    snprintf(self_path, sizeof(self_path), "%s/self", root);
    return kn_cpu_quota(sys, self_path);
}

static int setup(void **state)
{
    snprintf(root, sizeof(root), "/tmp/test_cpus.XXXXXX");
    return mkdtemp(root) ? 0 : -1;
}

static int teardown(void **state)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_v2(void **state)
{
    put("sys/cpu.max", "max 100000\n");
    put("sys/pod/cpu.max", "250000 100000\n");
    put("sys/pod/ctr/cpu.max", "max 100000\n");
    assert_int_equal(quota("0::/pod/ctr\n"), 2); /* the pod's 2.5, in whole CPUs */
    put("sys/pod/ctr/cpu.max", "50000 100000\n");
    assert_int_equal(quota("0::/pod/ctr\n"), 1); /* half a CPU: still one thread */
    assert_int_equal(quota("0::/\n"), 0);
    /* not shown under the mount: the root's own file stands */
    put("sys/cpu.max", "400000 100000\n");
    assert_int_equal(quota("0::/elsewhere/x\n"), 4);
}

static void test_v1(void **state)
{
    put("sys/cpu,cpuacct/k/p/cpu.cfs_quota_us", "300000\n");
    put("sys/cpu,cpuacct/k/p/cpu.cfs_period_us", "100000\n");
    put("sys/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
    put("sys/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
    put("sys/memory/k/p/cpu.cfs_quota_us", "100000\n"); /* not the cpu hierarchy */
    put("sys/memory/k/p/cpu.cfs_period_us", "100000\n");
    assert_int_equal(quota("7:memory:/k/p\n4:cpu,cpuacct:/k/p\n0::/\n"), 3);
    assert_int_equal(quota("4:cpuacct,cpu:/\n"), 0);
    assert_int_equal(quota("4:cpuset:/k/p\n"), 0);
}

static void test_unreadable(void **state)
{
    put("sys/a/cpu.max", "lots 100000\n");
    assert_int_equal(quota("0::/a\n"), 0);
    put("sys/a/cpu.max", "100000 0\n");
    assert_int_equal(quota("0::/a\n"), 0);
    put("sys/cpu/cpu.cfs_quota_us", "100000\n"); /* no period */
    assert_int_equal(quota("2:cpu:/\n"), 0);
    assert_int_equal(quota("garbage\n::\n0:\n"), 0);
    char sys[128];
    snprintf(sys, sizeof(sys), "%s/sys", root);
    assert_int_equal(kn_cpu_quota(sys, "/nonexistent/cgroup"), 0);
    /* this process, whatever its machine: never more than it may run on */
    int n = kn_usable_cpus();
    assert_true(n >= 1 && n <= sysconf(_SC_NPROCESSORS_ONLN));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_v2, setup, teardown),
        cmocka_unit_test_setup_teardown(test_v1, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unreadable, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
