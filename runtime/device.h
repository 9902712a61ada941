/* Where a model computes: one table of functions per device, chosen once at
 * rt_model_load (as kernels/ chooses its kn_ops once per context). The CPU
 * table is part of the runtime (device_cpu.c); the CUDA one lives in a
 * plugin, libinfergate_cuda.so (forward_cuda.c and kernels/cuda), which is
 * loaded with dlopen the first time a model asks for "cuda", so that a
 * process that never does (the gateway, a CPU worker) neither needs nor
 * maps the CUDA runtime and cuBLAS.
 *
 * The plugin is the file next to the running executable (/proc/self/exe's
 * folder), or the one INFERGATE_CUDA_PLUGIN names. It exports one symbol,
 * RT_DEVICE_PLUGIN_ENTRY, returning its table; the table's abi must equal
 * RT_DEVICE_ABI and its struct sizes the runtime's, or the plugin is
 * refused. It reaches the runtime and kernel functions it calls (kn_type_name)
 * in the executable, which exports its symbols (CMake ENABLE_EXPORTS): the
 * plugin carries no copy of kernels/ or runtime/, so there is one of each
 * global (the kernel tables, the CPU list) per process.
 *
 * Internal to the runtime and its device plugins. */
#ifndef RT_DEVICE_H
#define RT_DEVICE_H

#include "runtime/model.h"

#include <stddef.h>
#include <stdint.h>

/* Bump when this table or the structs of model_internal.h change shape. */
#define RT_DEVICE_ABI 2
#define RT_DEVICE_PLUGIN_ENTRY "rt_device_plugin"
/* The CUDA plugin's file name, looked for next to the executable. */
#define RT_CUDA_PLUGIN_FILE "libinfergate_cuda.so"

typedef struct rt_device_ops {
    uint32_t abi; /* RT_DEVICE_ABI; stays the first member */
    /* sizeof(rt_model), sizeof(rt_kv), sizeof(rt_seq) as the table's code
     * was built: a plugin from another tree is refused, not trusted */
    uint32_t model_size, kv_size, seq_size;
    const char *name; /* "cpu", "cuda": rt_device_info.kind */
    bool kv_q8_0;     /* takes a Q8_0 KV cache (besides F16) */

    /* Takes over a loaded (bound) model: puts its weights where the forward
     * pass reads them and keeps its own state in m->dev_state. On failure
     * it leaves nothing behind. 0 or a negative errno code with err filled
     * (rt_model_load's list). */
    int (*load)(rt_model *m, char *err, size_t err_len);
    /* Releases what load and forward made (m->dev_state, buffers). */
    void (*free)(rt_model *m);
    /* rt_model_forward for validated entries whose sequences have already
     * grown by their n_tokens (n_tokens tokens in all, n_out of them want
     * logits); the caller advances or shrinks them after. 0, -EINVAL,
     * -ENOMEM, -EIO, -ENOTRECOVERABLE (the device is lost). */
    int (*forward)(rt_model *m, rt_batch_entry *e, int n_entries, int n_tokens, int n_out);
    /* Memory for a KV pool of `bytes`, where forward reads it; refused with
     * a reason in err (with the sizes when it does not fit). */
    int (*kv_alloc)(const rt_model *m, size_t bytes, void **out, char *err, size_t err_len);
    void (*kv_release)(const rt_model *m, void *pool, size_t bytes);
    void (*device_info)(const rt_model *m, rt_device_info *out);
} rt_device_ops;

typedef const rt_device_ops *(*rt_device_plugin_fn)(void);

/* The CPU's table (device_cpu.c). */
extern const rt_device_ops rt_device_cpu;

/* The table for device `name` ("cpu" or "cuda"), loading the CUDA plugin
 * on first use; a plugin once loaded stays for the life of the process.
 * 0; -EINVAL for another name; -ENODEV with err saying, on one line,
 * "no CUDA device: " and what is missing (this build has no plugin; the
 * plugin file or a library it needs; a plugin of another build). */
int rt_device_get(const char *name, const rt_device_ops **out, char *err, size_t err_len);

#endif
