/* kernels/cuda: the context — device selection and query, the stream and
 * cuBLAS handle, error recording, memory, graphs and weight upload. */
#include "kernels/cuda/kn_cuda_internal.cuh"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLAS_WS_BYTES (32u << 20)
#define STAGE_BYTES (16u << 20)

/* ---- errors ---- */

static int map_cuda_error(cudaError_t e)
{
    switch (e) {
    case cudaErrorMemoryAllocation:
        return -ENOMEM;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorNoKernelImageForDevice:
        return -ENODEV;
    case cudaErrorInvalidValue:
        return -EINVAL;
    default:
        return -EIO;
    }
}

int kn_cuda__fail(kn_cuda *c, cudaError_t e, const char *stmt, const char *file, int line)
{
    /* A failed allocation also sets CUDA's last error, which the next
     * launch's check (KN_CUDA_LAUNCHED) would take for its own: read it
     * off here (a sticky error stays, as it must). */
    (void)cudaGetLastError();
    /* Only the first failure of a chain is worth reading. */
    if (c && c->err[0] == '\0')
        snprintf(c->err, sizeof(c->err), "%s:%d: %s: %s (%s)", file, line, stmt, cudaGetErrorString(e),
                 cudaGetErrorName(e));
    return map_cuda_error(e);
}

int kn_cuda__fail_blas(kn_cuda *c, cublasStatus_t s, const char *stmt, const char *file, int line)
{
    if (c && c->err[0] == '\0')
        snprintf(c->err, sizeof(c->err), "%s:%d: %s: %s", file, line, stmt, cublasGetStatusString(s));
    return s == CUBLAS_STATUS_ALLOC_FAILED ? -ENOMEM : s == CUBLAS_STATUS_INVALID_VALUE ? -EINVAL : -EIO;
}

int kn_cuda__fail_msg(kn_cuda *c, int rc, const char *file, int line, const char *msg)
{
    if (c && c->err[0] == '\0')
        snprintf(c->err, sizeof(c->err), "%s:%d: %s", file, line, msg);
    return rc;
}

extern "C" const char *kn_cuda_error(const kn_cuda *c)
{
    return c ? c->err : "";
}

extern "C" void kn_cuda_clear_error(kn_cuda *c)
{
    c->err[0] = '\0';
}

int kn_cuda__scratch(kn_cuda *c, void **p, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    /* cudaMalloc cannot be recorded in a graph: reserve before capturing. */
    if (c->capturing)
        return kn_cuda__fail_msg(c, -EINVAL, __FILE__, __LINE__,
                                 "scratch must grow, but a graph is being captured");
    /* Round up so a slowly growing batch does not reallocate every step. */
    size_t n = need + need / 4;
    if (*p) {
        KN_CUDA_CHECK(c, cudaStreamSynchronize(c->stream));
        cudaFree(*p);
        *p = NULL;
        *cap = 0;
    }
    c->scratch_gen++;
    KN_CUDA_CHECK(c, cudaMalloc(p, n));
    *cap = n;
    return 0;
}

/* ---- devices ---- */

extern "C" int kn_cuda_device_count(int *count, char *err, size_t err_len)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    *count = 0;
    if (e != cudaSuccess) {
        cudaGetLastError(); /* not sticky: clear it */
        /* The runtime says "driver version is insufficient" also when
         * there is no driver at all: name the library that is missing. */
        void *drv = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
        if (!drv) {
            snprintf(err, err_len, "the NVIDIA driver is missing (%s)", dlerror());
            return -ENODEV;
        }
        dlclose(drv);
        snprintf(err, err_len, "cudaGetDeviceCount: %s", cudaGetErrorString(e));
        return -ENODEV;
    }
    if (n <= 0) {
        snprintf(err, err_len, "the CUDA runtime sees no device (CUDA_VISIBLE_DEVICES=%s)",
                 getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "unset");
        return -ENODEV;
    }
    *count = n;
    return 0;
}

extern "C" int kn_cuda_new(int ordinal, kn_cuda **out, char *err, size_t err_len)
{
    *out = NULL;
    int n, rc = kn_cuda_device_count(&n, err, err_len);
    if (rc)
        return rc;
    if (ordinal < 0 || ordinal >= n) {
        snprintf(err, err_len, "CUDA device %d does not exist (%d visible)", ordinal, n);
        return -ENODEV;
    }
    kn_cuda *c = (kn_cuda *)calloc(1, sizeof(*c));
    if (!c) {
        snprintf(err, err_len, "out of memory");
        return -ENOMEM;
    }
    c->ordinal = ordinal;
    cudaDeviceProp prop;
#define STEP(call)                                                                                           \
    do {                                                                                                     \
        cudaError_t e_ = (call);                                                                             \
        if (e_ != cudaSuccess) {                                                                             \
            rc = kn_cuda__fail(c, e_, #call, __FILE__, __LINE__);                                            \
            goto fail;                                                                                       \
        }                                                                                                    \
    } while (0)
    STEP(cudaSetDevice(ordinal));
    STEP(cudaGetDeviceProperties(&prop, ordinal));
    /* The fat binary holds sm_80 and sm_90 code and compute_90 PTX: older
     * devices have nothing they can run. */
    if (prop.major < 8) {
        snprintf(c->err, sizeof(c->err),
                 "device %d (%s) has compute capability %d.%d; this build needs 8.0 or newer", ordinal,
                 prop.name, prop.major, prop.minor);
        rc = -ENODEV;
        goto fail;
    }
    c->sm_count = prop.multiProcessorCount;
    c->cc_major = prop.major;
    {
        const char *pdl = getenv("INFERGATE_CUDA_PDL");
        kn_cuda_set_pdl(c, !(pdl && !strcmp(pdl, "0")));
    }
    STEP(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    STEP(cudaMalloc(&c->blas_ws, BLAS_WS_BYTES));
    {
        cublasStatus_t s = cublasCreate(&c->blas);
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasSetStream(c->blas, c->stream);
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasSetWorkspace(c->blas, c->blas_ws, BLAS_WS_BYTES);
        if (s != CUBLAS_STATUS_SUCCESS) {
            rc = kn_cuda__fail_blas(c, s, "cublasCreate/SetStream/SetWorkspace", __FILE__, __LINE__);
            goto fail;
        }
    }
#undef STEP
    *out = c;
    return 0;
fail:
    snprintf(err, err_len, "%s", c->err);
    kn_cuda_free(c);
    return rc;
}

extern "C" void kn_cuda_free(kn_cuda *c)
{
    if (!c)
        return;
    cudaSetDevice(c->ordinal);
    if (c->stream)
        cudaStreamSynchronize(c->stream);
    if (c->blas)
        cublasDestroy(c->blas);
    cudaFree(c->blas_ws);
    cudaFree(c->x16);
    cudaFree(c->w16);
    cudaFree(c->xq);
    cudaFree(c->part);
    if (c->stage)
        cudaFreeHost(c->stage);
    if (c->stream)
        cudaStreamDestroy(c->stream);
    free(c);
}

extern "C" bool kn_cuda_set_pdl(kn_cuda *c, bool on)
{
    c->pdl = on && c->cc_major >= 9;
    return c->pdl;
}

extern "C" int kn_cuda_sm_count(const kn_cuda *c)
{
    return c->sm_count;
}

extern "C" int kn_cuda_bind_thread(kn_cuda *c)
{
    KN_CUDA_CHECK(c, cudaSetDevice(c->ordinal));
    return 0;
}

extern "C" int kn_cuda_mem_info(int ordinal, uint64_t *free_bytes, uint64_t *total_bytes)
{
    size_t f = 0, t = 0;
    *free_bytes = *total_bytes = 0;
    if (cudaSetDevice(ordinal) != cudaSuccess || cudaMemGetInfo(&f, &t) != cudaSuccess) {
        cudaGetLastError();
        return -EIO;
    }
    *free_bytes = f;
    *total_bytes = t;
    return 0;
}

extern "C" uint64_t kn_cuda_scratch_generation(const kn_cuda *c)
{
    return c->scratch_gen;
}

static void format_uuid(const cudaUUID_t *u, const char *prefix, char *out, size_t n)
{
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, n, "%s-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", prefix, b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

extern "C" int kn_cuda_get_info(kn_cuda *c, kn_cuda_info *out)
{
    memset(out, 0, sizeof(*out));
    cudaDeviceProp prop;
    KN_CUDA_CHECK(c, cudaSetDevice(c->ordinal));
    KN_CUDA_CHECK(c, cudaGetDeviceProperties(&prop, c->ordinal));
    size_t free_b = 0, total_b = 0;
    KN_CUDA_CHECK(c, cudaMemGetInfo(&free_b, &total_b));
    out->ordinal = c->ordinal;
    snprintf(out->name, sizeof(out->name), "%s", prop.name);
    kn_cuda_mig_profile_from_name(prop.name, out->mig_profile, sizeof(out->mig_profile));
    /* The supervisor names a MIG instance by its UUID: report that one
     * verbatim when it is the only device this process was given. */
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    if (vis && !strncmp(vis, "MIG-", 4) && !strchr(vis, ','))
        snprintf(out->uuid, sizeof(out->uuid), "%s", vis);
    else
        format_uuid(&prop.uuid, out->mig_profile[0] ? "MIG" : "GPU", out->uuid, sizeof(out->uuid));
    out->cc_major = prop.major;
    out->cc_minor = prop.minor;
    out->sm_count = prop.multiProcessorCount;
    out->mem_total = total_b;
    out->mem_free = free_b;
    return 0;
}

/* ---- memory ---- */

extern "C" int kn_cuda_alloc(kn_cuda *c, size_t bytes, void **d_out)
{
    *d_out = NULL;
    KN_CUDA_CHECK(c, cudaMalloc(d_out, bytes ? bytes : 1));
    return 0;
}

extern "C" void kn_cuda_release(kn_cuda *c, void *d_ptr)
{
    if (d_ptr)
        cudaFree(d_ptr);
}

extern "C" int kn_cuda_host_alloc(kn_cuda *c, size_t bytes, void **out)
{
    *out = NULL;
    KN_CUDA_CHECK(c, cudaHostAlloc(out, bytes ? bytes : 1, cudaHostAllocDefault));
    return 0;
}

extern "C" void kn_cuda_host_release(kn_cuda *c, void *p)
{
    if (p)
        cudaFreeHost(p);
}

/* Copies go on the context's stream: it does not synchronise with the
 * legacy default stream, so a plain cudaMemcpy could race its kernels. */
extern "C" int kn_cuda_upload_async(kn_cuda *c, void *d_dst, const void *src, size_t bytes)
{
    if (bytes)
        KN_CUDA_CHECK(c, cudaMemcpyAsync(d_dst, src, bytes, cudaMemcpyHostToDevice, c->stream));
    return 0;
}

extern "C" int kn_cuda_upload(kn_cuda *c, void *d_dst, const void *src, size_t bytes)
{
    int rc = kn_cuda_upload_async(c, d_dst, src, bytes);
    return rc ? rc : kn_cuda_sync(c);
}

extern "C" int kn_cuda_download_async(kn_cuda *c, void *dst, const void *d_src, size_t bytes)
{
    if (bytes)
        KN_CUDA_CHECK(c, cudaMemcpyAsync(dst, d_src, bytes, cudaMemcpyDeviceToHost, c->stream));
    return 0;
}

extern "C" int kn_cuda_download(kn_cuda *c, void *dst, const void *d_src, size_t bytes)
{
    int rc = kn_cuda_download_async(c, dst, d_src, bytes);
    return rc ? rc : kn_cuda_sync(c);
}

extern "C" int kn_cuda_copy_d2d(kn_cuda *c, void *d_dst, const void *d_src, size_t bytes)
{
    if (bytes)
        KN_CUDA_CHECK(c, cudaMemcpyAsync(d_dst, d_src, bytes, cudaMemcpyDeviceToDevice, c->stream));
    return 0;
}

extern "C" int kn_cuda_memset(kn_cuda *c, void *d_dst, int value, size_t bytes)
{
    if (bytes)
        KN_CUDA_CHECK(c, cudaMemsetAsync(d_dst, value, bytes, c->stream));
    return 0;
}

extern "C" int kn_cuda_sync(kn_cuda *c)
{
    KN_CUDA_CHECK(c, cudaStreamSynchronize(c->stream));
    return 0;
}

extern "C" int kn_cuda_recover(kn_cuda *c)
{
    /* a sticky error is not cleared by the read: it comes back below */
    (void)cudaGetLastError();
    cudaError_t e = cudaStreamSynchronize(c->stream);
    if (e == cudaSuccess)
        e = cudaGetLastError();
    if (e == cudaSuccess)
        return 0;
    kn_cuda__fail(c, e, "cudaStreamSynchronize (after a failed step)", __FILE__, __LINE__);
    return -ENOTRECOVERABLE;
}

/* ---- graphs ---- */

struct kn_cuda_graph {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
};

extern "C" int kn_cuda_capture_begin(kn_cuda *c)
{
    if (c->capturing)
        return KN_CUDA_EINVAL(c, "a capture is already under way");
    /* Thread-local: other threads' CUDA calls (another model in the same
     * process) neither break nor join this capture. */
    KN_CUDA_CHECK(c, cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
    c->capturing = true;
    return 0;
}

extern "C" int kn_cuda_capture_end(kn_cuda *c, kn_cuda_graph **out)
{
    *out = NULL;
    if (!c->capturing)
        return KN_CUDA_EINVAL(c, "no capture is under way");
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    c->capturing = false;
    if (e != cudaSuccess) {
        if (g)
            cudaGraphDestroy(g);
        cudaGetLastError();
        return kn_cuda__fail(c, e, "cudaStreamEndCapture", __FILE__, __LINE__);
    }
    kn_cuda_graph *kg = (kn_cuda_graph *)calloc(1, sizeof(*kg));
    if (!kg) {
        cudaGraphDestroy(g);
        return -ENOMEM;
    }
    kg->graph = g;
    e = cudaGraphInstantiate(&kg->exec, g, 0);
    if (e != cudaSuccess) {
        cudaGraphDestroy(g);
        free(kg);
        return kn_cuda__fail(c, e, "cudaGraphInstantiate", __FILE__, __LINE__);
    }
    *out = kg;
    return 0;
}

extern "C" int kn_cuda_graph_launch(kn_cuda *c, kn_cuda_graph *g)
{
    KN_CUDA_CHECK(c, cudaGraphLaunch(g->exec, c->stream));
    return 0;
}

extern "C" void kn_cuda_graph_free(kn_cuda_graph *g)
{
    if (!g)
        return;
    cudaGraphExecDestroy(g->exec);
    cudaGraphDestroy(g->graph);
    free(g);
}

/* ---- weights ---- */

static int stage_reserve(kn_cuda *c, size_t need)
{
    if (need <= c->stage_cap)
        return 0;
    if (c->stage) {
        cudaFreeHost(c->stage);
        c->stage = NULL;
        c->stage_cap = 0;
    }
    KN_CUDA_CHECK(c, cudaHostAlloc(&c->stage, need, cudaHostAllocDefault));
    c->stage_cap = need;
    return 0;
}

extern "C" int kn_cuda_weight_upload(kn_cuda *c, const void *gguf_rows, kn_type type, int n_out, int n_in,
                                     kn_cuda_weight *w)
{
    memset(w, 0, sizeof(*w));
    const uint64_t bytes = kn_cuda_weight_bytes(type, n_out, n_in);
    if (bytes == 0 || bytes > SIZE_MAX)
        return KN_CUDA_EINVAL(c, "weight type or shape has no device layout");
    void *d = NULL;
    KN_CUDA_CHECK(c, cudaMalloc(&d, (size_t)bytes));
    int rc = 0;
    if (type == KN_TYPE_F32 || type == KN_TYPE_F16 || kn_cuda_raw_layout(type)) {
        rc = kn_cuda_upload(c, d, gguf_rows, (size_t)bytes);
    } else {
        const size_t nb = (size_t)n_in / 32;
        const size_t q_row = type == KN_TYPE_Q8_0 ? (size_t)n_in : (size_t)n_in / 2;
        const size_t g_row = nb * (type == KN_TYPE_Q8_0 ? sizeof(kn_block_q8_0) : sizeof(kn_block_q4_0));
        const size_t scl_off = (size_t)bytes - (size_t)n_out * nb * 2;
        const size_t per_row = q_row + nb * 2;
        size_t rows = STAGE_BYTES / per_row;
        if (rows < 1)
            rows = 1;
        if (rows > (size_t)n_out)
            rows = (size_t)n_out;
        if ((rc = stage_reserve(c, rows * per_row)) == 0) {
            for (size_t r0 = 0; r0 < (size_t)n_out && rc == 0; r0 += rows) {
                const size_t n = (size_t)n_out - r0 < rows ? (size_t)n_out - r0 : rows;
                uint8_t *q = (uint8_t *)c->stage;
                uint16_t *scl = (uint16_t *)(q + n * q_row); /* q_row is even: aligned */
                kn_cuda_repack_rows(type, (const char *)gguf_rows + r0 * g_row, (int)n, n_in, q, scl);
                rc = kn_cuda_upload_async(c, (char *)d + r0 * q_row, q, n * q_row);
                if (rc == 0)
                    rc = kn_cuda_upload_async(c, (char *)d + scl_off + r0 * nb * 2, scl, n * nb * 2);
                if (rc == 0)
                    rc = kn_cuda_sync(c); /* the stage is refilled next */
            }
        }
        w->d_scl = (uint16_t *)((char *)d + scl_off);
    }
    if (rc) {
        cudaFree(d);
        memset(w, 0, sizeof(*w));
        return rc;
    }
    w->type = type;
    w->n_out = n_out;
    w->n_in = n_in;
    w->d_q = d;
    w->bytes = bytes;
    return 0;
}

extern "C" void kn_cuda_weight_release(kn_cuda *c, kn_cuda_weight *w)
{
    if (w->d_q)
        cudaFree(w->d_q);
    memset(w, 0, sizeof(*w));
}
