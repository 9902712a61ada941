/* GPUs and MIG instances of this machine, as `nvidia-smi -L` lists them,
 * and where `devices: [auto]` puts workers: one per MIG instance on a GPU
 * with MIG on, one per GPU with MIG off, one CPU worker when there is no
 * GPU at all. The parser takes recorded outputs, so placement is tested
 * without a GPU. */
#ifndef GW_GPU_LIST_H
#define GW_GPU_LIST_H

#include <stdbool.h>
#include <stddef.h>

typedef struct gw_mig {
    int index;        /* "Device N" */
    char profile[32]; /* "1g.10gb" */
    char uuid[128];   /* "MIG-..." (or "MIG-GPU-.../g/c" from older drivers) */
} gw_mig;

typedef struct gw_gpu {
    int index;
    char name[128];
    char uuid[128]; /* "GPU-..." */
    gw_mig *migs;   /* instances listed under it; none: MIG off (or no instance made) */
    int n_migs;
} gw_gpu;

typedef struct gw_gpu_list {
    gw_gpu *gpus;
    int n_gpus;
} gw_gpu_list;

/* Parses `nvidia-smi -L` output (empty output and "No devices found" are no
 * GPUs). 0; -EINVAL with err naming the line that is not a GPU or MIG line;
 * -ENOMEM. *out is empty on failure. */
int gw_gpu_list_parse(const char *text, size_t len, gw_gpu_list *out, char *err, size_t err_len);
void gw_gpu_list_dispose(gw_gpu_list *l);

/* Worker devices for the list: MIG UUIDs of MIG GPUs, GPU UUIDs of the
 * others, in listing order. *devices is malloc'd strings (free with
 * gw_gpu_devices_free); *n may be 0. 0 or -ENOMEM. */
int gw_gpu_placement(const gw_gpu_list *l, char ***devices, int *n);
void gw_gpu_devices_free(char **devices, int n);

/* Runs `nvidia_smi -L` (NULL: "nvidia-smi" from PATH), waiting at most
 * timeout_ms, reading at most 1 MiB. 0 with the list; -ENOENT when the
 * program is not there; -ETIMEDOUT (the child is killed); -EIO when it
 * fails (exit status in err); -EINVAL for output it cannot parse. */
int gw_gpu_list_probe(const char *nvidia_smi, int timeout_ms, gw_gpu_list *out, char *err, size_t err_len);

/* Expands a worker's device list: "auto" becomes the placement of the
 * probed GPUs, or {"cpu"} when there are none (why, when not NULL, says
 * what was found, for the log); other lists are copied. 0 or -ENOMEM. */
int gw_gpu_expand_devices(char *const *devices, int n_devices, const char *nvidia_smi, int timeout_ms,
                          char ***out, int *n_out, char *why, size_t why_len);

/* True for a device that is a GPU or MIG instance rather than "cpu". */
bool gw_device_is_gpu(const char *device);

#endif
