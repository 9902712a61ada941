/* Finds a device's table (see device.h): the CPU's, or the CUDA plugin's,
 * loaded once per process with dlopen. */
#include "runtime/device.h"
#include "runtime/model_internal.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* 1 when this build made the plugin (CMake sets it): a build without one
 * does not pick up a stale file left next to the binary by an earlier one. */
#ifndef RT_CUDA_PLUGIN_BUILT
#define RT_CUDA_PLUGIN_BUILT 0
#endif

static pthread_mutex_t plugin_lock = PTHREAD_MUTEX_INITIALIZER;
static const rt_device_ops *cuda_ops; /* once loaded, for good */

/* INFERGATE_CUDA_PLUGIN, or RT_CUDA_PLUGIN_FILE in the executable's folder.
 * 0, or -ENODEV with err filled. */
static int plugin_path(char *path, size_t len, char *err, size_t err_len)
{
    const char *env = getenv("INFERGATE_CUDA_PLUGIN");
    if (env && env[0]) {
        snprintf(path, len, "%s", env);
        return 0;
    }
    if (!RT_CUDA_PLUGIN_BUILT) {
        snprintf(err, err_len,
                 "no CUDA device: this build has no CUDA plugin (configure with "
                 "-DINFERGATE_CUDA=ON on a machine with nvcc and cuBLAS)");
        return -ENODEV;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0) {
        snprintf(err, err_len, "no CUDA device: cannot find the CUDA plugin: /proc/self/exe: %s",
                 strerror(errno));
        return -ENODEV;
    }
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash)
        *slash = '\0';
    if ((size_t)snprintf(path, len, "%s/%s", slash ? exe : ".", RT_CUDA_PLUGIN_FILE) >= len) {
        snprintf(err, err_len, "no CUDA device: the CUDA plugin's path is too long");
        return -ENODEV;
    }
    return 0;
}

/* A table the runtime can use: this ABI and the struct shapes it was built
 * with. NULL when it is, or the reason. */
static const char *ops_mismatch(const rt_device_ops *ops)
{
    if (!ops || ops->abi != RT_DEVICE_ABI)
        return "its device ABI differs from this binary's";
    if (ops->model_size != sizeof(rt_model) || ops->kv_size != sizeof(rt_kv) ||
        ops->seq_size != sizeof(rt_seq))
        return "it was built from another source tree than this binary";
    return NULL;
}

static int plugin_load(char *err, size_t err_len)
{
    char path[PATH_MAX];
    int rc = plugin_path(path, sizeof(path), err, err_len);
    if (rc)
        return rc;
    /* RTLD_NOW: a library or symbol the plugin lacks is said here, at load,
     * not as a crash at its first call. dlerror names the missing file. */
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(err, err_len, "no CUDA device: cannot load the CUDA plugin: %s", dlerror());
        return -ENODEV;
    }
    rt_device_plugin_fn entry = (rt_device_plugin_fn)dlsym(h, RT_DEVICE_PLUGIN_ENTRY);
    const rt_device_ops *ops = entry ? entry() : NULL;
    const char *why = entry ? ops_mismatch(ops) : "it has no " RT_DEVICE_PLUGIN_ENTRY " symbol";
    if (why) {
        snprintf(err, err_len, "no CUDA device: the CUDA plugin %s does not fit: %s", path, why);
        dlclose(h);
        return -ENODEV;
    }
    cuda_ops = ops; /* h stays open: the table and its code live there */
    return 0;
}

int rt_device_get(const char *name, const rt_device_ops **out, char *err, size_t err_len)
{
    *out = NULL;
    if (!strcmp(name, "cpu")) {
        *out = &rt_device_cpu;
        return 0;
    }
    if (strcmp(name, "cuda")) {
        snprintf(err, err_len, "device \"%s\" is neither cpu nor cuda", name);
        return -EINVAL;
    }
    pthread_mutex_lock(&plugin_lock);
    int rc = cuda_ops ? 0 : plugin_load(err, err_len);
    *out = cuda_ops;
    pthread_mutex_unlock(&plugin_lock);
    return rc;
}
