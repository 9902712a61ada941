/* GPU listing and worker placement: recorded `nvidia-smi -L` outputs of an
 * 8-GPU machine without MIG, a machine with one GPU in MIG mode (several
 * instances, newer and older UUID forms) next to one without, empty and
 * "No devices found" outputs, and garbage that must be refused with the
 * line named. Then the probe against stand-in nvidia-smi scripts: a
 * listing, a hang (killed at the deadline), a failure, a missing program;
 * and `devices: [auto]` expansion, which falls back to one CPU worker. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "gateway/supervisor/gpu_list.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char dgx_h100[] =
    "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-6d4f1c2a-8b0e-4f3a-9c71-2e5d8a9b0c11)\n"
    "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-0a2b4c6d-8e0f-4a1b-9c2d-3e4f5a6b7c12)\n"
    "GPU 2: NVIDIA H100 80GB HBM3 (UUID: GPU-1b3c5d7e-9f1a-4b2c-8d3e-4f5a6b7c8d13)\n"
    "GPU 3: NVIDIA H100 80GB HBM3 (UUID: GPU-2c4d6e8f-0a2b-4c3d-9e4f-5a6b7c8d9e14)\n"
    "GPU 4: NVIDIA H100 80GB HBM3 (UUID: GPU-3d5e7f9a-1b3c-4d4e-8f5a-6b7c8d9e0f15)\n"
    "GPU 5: NVIDIA H100 80GB HBM3 (UUID: GPU-4e6f8a0b-2c4d-4e5f-9a6b-7c8d9e0f1a16)\n"
    "GPU 6: NVIDIA H100 80GB HBM3 (UUID: GPU-5f7a9b1c-3d5e-4f6a-8b7c-8d9e0f1a2b17)\n"
    "GPU 7: NVIDIA H100 80GB HBM3 (UUID: GPU-6a8b0c2d-4e6f-4a7b-9c8d-9e0f1a2b3c18)\n";

/* GPU 0 in MIG mode with four instances; GPU 1 not; GPU 2 from an older
 * driver that wrote MIG-GPU-<uuid>/<gi>/<ci>; CRLF line ends on the last. */
static const char mig_mixed[] =
    "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)\n"
    "  MIG 3g.40gb     Device  0: (UUID: MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f)\n"
    "  MIG 2g.20gb     Device  1: (UUID: MIG-cba663e8-9bed-5b7e-9fa6-2d7da4b0bb0f)\n"
    "  MIG 1g.10gb     Device  2: (UUID: MIG-1d4e4a6c-1b1d-5a3f-9d2c-3e6f7a8b9c0d)\n"
    "  MIG 1g.10gb     Device  3: (UUID: MIG-7a8b9c0d-1e2f-5a3b-8c4d-5e6f7a8b9c0e)\n"
    "GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-9e3d8d2b-8a77-4d33-2b2c-524d5d5ba0d6)\n"
    "GPU 2: NVIDIA A30 (UUID: GPU-e91edf3b-b297-37c1-a2a7-7601c98f8bc5)\r\n"
    "  MIG 1g.6gb Device 0: (UUID: MIG-GPU-e91edf3b-b297-37c1-a2a7-7601c98f8bc5/7/0)\r\n";

static void test_non_mig_machine(void **state)
{
    gw_gpu_list l;
    char err[256];
    assert_int_equal(gw_gpu_list_parse(dgx_h100, strlen(dgx_h100), &l, err, sizeof(err)), 0);
    assert_int_equal(l.n_gpus, 8);
    for (int i = 0; i < 8; i++) {
        assert_int_equal(l.gpus[i].index, i);
        assert_string_equal(l.gpus[i].name, "NVIDIA H100 80GB HBM3");
        assert_int_equal(l.gpus[i].n_migs, 0);
        assert_memory_equal(l.gpus[i].uuid, "GPU-", 4);
        assert_int_equal(strlen(l.gpus[i].uuid), 40);
    }
    assert_string_equal(l.gpus[7].uuid, "GPU-6a8b0c2d-4e6f-4a7b-9c8d-9e0f1a2b3c18");

    char **devs;
    int n;
    assert_int_equal(gw_gpu_placement(&l, &devs, &n), 0);
    assert_int_equal(n, 8);
    for (int i = 0; i < 8; i++)
        assert_string_equal(devs[i], l.gpus[i].uuid);
    gw_gpu_devices_free(devs, n);
    gw_gpu_list_dispose(&l);
}

static void test_mig_machine(void **state)
{
    gw_gpu_list l;
    char err[256];
    assert_int_equal(gw_gpu_list_parse(mig_mixed, strlen(mig_mixed), &l, err, sizeof(err)), 0);
    assert_int_equal(l.n_gpus, 3);
    assert_string_equal(l.gpus[0].name, "NVIDIA A100-SXM4-80GB");
    assert_int_equal(l.gpus[0].n_migs, 4);
    assert_string_equal(l.gpus[0].migs[0].profile, "3g.40gb");
    assert_int_equal(l.gpus[0].migs[0].index, 0);
    assert_string_equal(l.gpus[0].migs[0].uuid, "MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f");
    assert_string_equal(l.gpus[0].migs[3].profile, "1g.10gb");
    assert_int_equal(l.gpus[0].migs[3].index, 3);
    assert_int_equal(l.gpus[1].n_migs, 0);
    assert_string_equal(l.gpus[2].name, "NVIDIA A30");
    assert_string_equal(l.gpus[2].uuid, "GPU-e91edf3b-b297-37c1-a2a7-7601c98f8bc5");
    assert_int_equal(l.gpus[2].n_migs, 1);
    assert_string_equal(l.gpus[2].migs[0].profile, "1g.6gb");
    assert_string_equal(l.gpus[2].migs[0].uuid, "MIG-GPU-e91edf3b-b297-37c1-a2a7-7601c98f8bc5/7/0");

    /* One worker per MIG instance of GPU 0, one for the whole GPU 1, one
     * for the instance of GPU 2; never the MIG-mode GPUs themselves. */
    char **devs;
    int n;
    assert_int_equal(gw_gpu_placement(&l, &devs, &n), 0);
    assert_int_equal(n, 6);
    assert_string_equal(devs[0], "MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f");
    assert_string_equal(devs[1], "MIG-cba663e8-9bed-5b7e-9fa6-2d7da4b0bb0f");
    assert_string_equal(devs[2], "MIG-1d4e4a6c-1b1d-5a3f-9d2c-3e6f7a8b9c0d");
    assert_string_equal(devs[3], "MIG-7a8b9c0d-1e2f-5a3b-8c4d-5e6f7a8b9c0e");
    assert_string_equal(devs[4], "GPU-9e3d8d2b-8a77-4d33-2b2c-524d5d5ba0d6");
    assert_string_equal(devs[5], "MIG-GPU-e91edf3b-b297-37c1-a2a7-7601c98f8bc5/7/0");
    for (int i = 0; i < n; i++)
        assert_true(gw_device_is_gpu(devs[i]));
    gw_gpu_devices_free(devs, n);
    gw_gpu_list_dispose(&l);
}

static void test_empty_outputs(void **state)
{
    const char *outs[] = {"", "\n\n", "No devices found.\n", "  \r\n"};
    for (size_t i = 0; i < sizeof(outs) / sizeof(outs[0]); i++) {
        gw_gpu_list l;
        char err[256];
        assert_int_equal(gw_gpu_list_parse(outs[i], strlen(outs[i]), &l, err, sizeof(err)), 0);
        assert_int_equal(l.n_gpus, 0);
        char **devs;
        int n = -1;
        assert_int_equal(gw_gpu_placement(&l, &devs, &n), 0);
        assert_int_equal(n, 0);
        gw_gpu_devices_free(devs, n);
        gw_gpu_list_dispose(&l);
    }
    assert_false(gw_device_is_gpu("cpu"));
}

static void test_garbage_refused(void **state)
{
    static const struct {
        const char *text;
        const char *where;
    } bad[] = {
        {"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
         "latest NVIDIA driver is installed and running.\n",
         "line 1"},
        {"  MIG 1g.10gb     Device  0: (UUID: MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f)\n", "before any GPU"},
        {"GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-6d4f1c2a-8b0e-4f3a-9c71-2e5d8a9b0c11)\n"
         "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-0a2b4c6d\n",
         "line 2"},
        {"GPU x: NVIDIA H100 (UUID: GPU-1)\n", "line 1"},
        {"GPU 0: (UUID: GPU-1)\n", "line 1"},
        {"GPU 0: NVIDIA H100 (UUID: )\n", "line 1"},
        {"GPU 0: A (UUID: GPU-1)\n  MIG 1g.5gb Device 0: (UUID: MIG-1) trailing\n", "line 2"},
        {"GPU 0: A (UUID: GPU-1)\n  MIG  Device 0: (UUID: MIG-1)\n", "line 2"},
        {"\x01\x02\xff\xfe garbage \x7f\n", "line 1"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        gw_gpu_list l;
        char err[256] = "";
        assert_int_equal(gw_gpu_list_parse(bad[i].text, strlen(bad[i].text), &l, err, sizeof(err)), -EINVAL);
        assert_int_equal(l.n_gpus, 0);
        assert_null(l.gpus);
        if (!strstr(err, bad[i].where))
            fail_msg("case %zu: error \"%s\" does not name \"%s\"", i, err, bad[i].where);
    }
}

/* ---- the probe, with stand-in nvidia-smi scripts ---- */

static char dir[64];

static void write_script(const char *name, const char *body, char *path, size_t n)
{
    snprintf(path, n, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "#!/bin/sh\n%s", body);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(chmod(path, 0755), 0);
}

static int setup(void **state)
{
    snprintf(dir, sizeof(dir), "/tmp/infergate-test-gpu-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    const char *names[] = {"smi-mig", "smi-hang", "smi-fail", "smi-none"};
    char path[128];
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void test_probe(void **state)
{
    char smi[128], body[2048], err[256];
    gw_gpu_list l;
    snprintf(body, sizeof(body), "[ \"$1\" = -L ] || exit 2\ncat <<'EOF'\n%sEOF\n", mig_mixed);
    write_script("smi-mig", body, smi, sizeof(smi));
    assert_int_equal(gw_gpu_list_probe(smi, 5000, &l, err, sizeof(err)), 0);
    assert_int_equal(l.n_gpus, 3);
    assert_int_equal(l.gpus[0].n_migs, 4);
    gw_gpu_list_dispose(&l);

    /* A hung nvidia-smi is killed at the deadline. */
    write_script("smi-hang", "exec sleep 30\n", smi, sizeof(smi));
    double t0 = now_s();
    assert_int_equal(gw_gpu_list_probe(smi, 300, &l, err, sizeof(err)), -ETIMEDOUT);
    assert_true(now_s() - t0 < 10.0); /* a bound that only a missed kill can break */
    assert_non_null(strstr(err, "300 ms"));

    write_script("smi-fail", "echo 'Failed to initialize NVML: Driver/library version mismatch'\nexit 9\n",
                 smi, sizeof(smi));
    assert_int_equal(gw_gpu_list_probe(smi, 5000, &l, err, sizeof(err)), -EIO);
    assert_non_null(strstr(err, "status 9"));

    /* nvidia-smi exits 6 when it finds nothing: that is an empty list. */
    write_script("smi-none", "echo 'No devices found.'\nexit 6\n", smi, sizeof(smi));
    assert_int_equal(gw_gpu_list_probe(smi, 5000, &l, err, sizeof(err)), 0);
    assert_int_equal(l.n_gpus, 0);
    gw_gpu_list_dispose(&l);

    snprintf(smi, sizeof(smi), "%s/no-such-nvidia-smi", dir);
    assert_int_equal(gw_gpu_list_probe(smi, 5000, &l, err, sizeof(err)), -ENOENT);
}

static void test_expand_auto(void **state)
{
    char smi[128], body[2048], why[512];
    char *autod[] = {"auto"}, **out;
    int n;
    snprintf(body, sizeof(body), "cat <<'EOF'\n%sEOF\n", mig_mixed);
    write_script("smi-mig", body, smi, sizeof(smi));
    assert_int_equal(gw_gpu_expand_devices(autod, 1, smi, 5000, &out, &n, why, sizeof(why)), 0);
    assert_int_equal(n, 6);
    assert_string_equal(out[4], "GPU-9e3d8d2b-8a77-4d33-2b2c-524d5d5ba0d6");
    assert_non_null(strstr(why, "3 GPUs, 5 MIG instances: 6 workers"));
    gw_gpu_devices_free(out, n);

    /* No nvidia-smi: no GPU, one CPU worker, and the log says why. */
    snprintf(smi, sizeof(smi), "%s/no-such-nvidia-smi", dir);
    assert_int_equal(gw_gpu_expand_devices(autod, 1, smi, 5000, &out, &n, why, sizeof(why)), 0);
    assert_int_equal(n, 1);
    assert_string_equal(out[0], "cpu");
    assert_non_null(strstr(why, "no GPU: one CPU worker"));
    assert_non_null(strstr(why, "no-such-nvidia-smi"));
    gw_gpu_devices_free(out, n);

    /* An empty listing falls back the same way. */
    write_script("smi-none", "echo 'No devices found.'\nexit 6\n", smi, sizeof(smi));
    assert_int_equal(gw_gpu_expand_devices(autod, 1, smi, 5000, &out, &n, why, sizeof(why)), 0);
    assert_int_equal(n, 1);
    assert_string_equal(out[0], "cpu");
    gw_gpu_devices_free(out, n);

    /* Explicit lists pass through untouched, nvidia-smi unasked. */
    char *listed[] = {"cpu", "MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f"};
    assert_int_equal(gw_gpu_expand_devices(listed, 2, smi, 5000, &out, &n, why, sizeof(why)), 0);
    assert_int_equal(n, 2);
    assert_string_equal(out[0], "cpu");
    assert_string_equal(out[1], listed[1]);
    assert_string_equal(why, "");
    assert_false(gw_device_is_gpu(out[0]));
    assert_true(gw_device_is_gpu(out[1]));
    gw_gpu_devices_free(out, n);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_non_mig_machine), cmocka_unit_test(test_mig_machine),
        cmocka_unit_test(test_empty_outputs),   cmocka_unit_test(test_garbage_refused),
        cmocka_unit_test(test_probe),           cmocka_unit_test(test_expand_auto),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
