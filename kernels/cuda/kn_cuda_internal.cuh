/* Internals shared by the .cu files of the CUDA backend: the context, the
 * error-recording checks (after ggml-cuda's CUDA_CHECK: statement, file and
 * line kept for kn_cuda_error) and small device helpers. Not a public
 * header. */
#ifndef KN_CUDA_INTERNAL_CUH
#define KN_CUDA_INTERNAL_CUH

#include "kernels/cuda/kn_cuda.h"
#include "kernels/quant_blocks.h"

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <errno.h>
#include <utility>

struct kn_cuda {
    int ordinal, sm_count, cc_major;
    cudaStream_t stream;
    cublasHandle_t blas;
    bool pdl;      /* launch kernels with programmatic dependent launch (sm_90+) */
    void *blas_ws; /* cuBLAS workspace: set explicitly so GEMMs can be captured */
    bool capturing;
    char err[512];
    /* Scratch, grown on demand (never while capturing). */
    void *x16;  /* F16 copy of GEMM activations */
    void *w16;  /* dequantized weight tile */
    void *xq;   /* Q8_0 activations when the caller brings none */
    void *part; /* attention partial results of split keys */
    size_t x16_cap, w16_cap, xq_cap, part_cap;
    uint64_t scratch_gen; /* bumped when any scratch buffer moves */
    void *stage;          /* pinned staging for weight uploads */
    size_t stage_cap;
};

/* Record a failure and map it to an errno code. */
int kn_cuda__fail(kn_cuda *c, cudaError_t e, const char *stmt, const char *file, int line);
int kn_cuda__fail_blas(kn_cuda *c, cublasStatus_t s, const char *stmt, const char *file, int line);
int kn_cuda__fail_msg(kn_cuda *c, int rc, const char *file, int line, const char *msg);
/* Grows a scratch buffer to at least need bytes (contents are not kept). */
int kn_cuda__scratch(kn_cuda *c, void **p, size_t *cap, size_t need);

#define KN_CUDA_CHECK(c, stmt)                                                                               \
    do {                                                                                                     \
        cudaError_t e_ = (stmt);                                                                             \
        if (e_ != cudaSuccess)                                                                               \
            return kn_cuda__fail((c), e_, #stmt, __FILE__, __LINE__);                                        \
    } while (0)

#define KN_CUBLAS_CHECK(c, stmt)                                                                             \
    do {                                                                                                     \
        cublasStatus_t s_ = (stmt);                                                                          \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                                     \
            return kn_cuda__fail_blas((c), s_, #stmt, __FILE__, __LINE__);                                   \
    } while (0)

/* After a kernel launch: a bad configuration shows up here, a fault in the
 * kernel at the next synchronisation. */
#define KN_CUDA_LAUNCHED(c) KN_CUDA_CHECK((c), cudaGetLastError())

#define KN_CUDA_EINVAL(c, msg) kn_cuda__fail_msg((c), -EINVAL, __FILE__, __LINE__, (msg))

/* ---- programmatic dependent launch ----
 * On sm_90 a kernel may be launched while the one before it in the stream
 * still runs (kn_cuda__launch sets the attribute when c->pdl): its blocks get
 * resident and can read what no earlier kernel writes (weights) until
 * kn_pdl_wait(), which returns once the previous kernel has finished and its
 * writes are visible. So every kernel of this backend calls kn_pdl_wait()
 * before its first read or write of activations, caches or scratch, and
 * kn_pdl_trigger() to let the next kernel launch: after the wait in most
 * kernels (kn_pdl_begin), so that one kernel at most waits ahead of them;
 * before it in the quantized matvec, whose successors stream their weights
 * early (kn_cuda_matvec.cu), so a run of matvecs may have several grids
 * resident at once (each still waits for the one before it). Weights are
 * never written by a kernel: a kernel that did would race with a matvec after
 * it. Both are no-ops before sm_90 and without the attribute. */
__device__ __forceinline__ void kn_pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void kn_pdl_trigger(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Wait for the previous kernel, then let the next one launch. */
__device__ __forceinline__ void kn_pdl_begin(void)
{
    kn_pdl_wait();
    kn_pdl_trigger();
}

/* Launches kernel k on the context's stream; errors show in
 * KN_CUDA_LAUNCHED as with <<<>>>. */
template <typename... P, typename... A>
static inline void kn_cuda__launch(const kn_cuda *c, dim3 grid, dim3 block, size_t smem, void (*k)(P...),
                                   A &&...args)
{
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cfg.attrs = at;
    cfg.numAttrs = c->pdl ? 1 : 0;
    (void)cudaLaunchKernelEx(&cfg, k, std::forward<A>(args)...);
}

static inline unsigned kn_cuda__blocks(size_t n, unsigned per_block)
{
    return (unsigned)((n + per_block - 1) / per_block);
}

#define KN_WARP 32

__device__ __forceinline__ float kn_warp_sum(float v)
{
#pragma unroll
    for (int o = KN_WARP / 2; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ int kn_warp_sum_int(int v)
{
#pragma unroll
    for (int o = KN_WARP / 2; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float kn_warp_max(float v)
{
#pragma unroll
    for (int o = KN_WARP / 2; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over a block of blockDim.x threads (a multiple of 32, at most 1024);
 * every thread gets the result. `sh` holds 32 floats. */
__device__ __forceinline__ float kn_block_sum(float v, float *sh)
{
    const int lane = threadIdx.x % KN_WARP, warp = threadIdx.x / KN_WARP;
    const int n_warps = blockDim.x / KN_WARP;
    v = kn_warp_sum(v);
    __syncthreads(); /* sh may still be read from a previous call */
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    v = lane < n_warps ? sh[lane] : 0.0f;
    return kn_warp_sum(v);
}

__device__ __forceinline__ float kn_block_max(float v, float *sh)
{
    const int lane = threadIdx.x % KN_WARP, warp = threadIdx.x / KN_WARP;
    const int n_warps = blockDim.x / KN_WARP;
    v = kn_warp_max(v);
    __syncthreads();
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    v = lane < n_warps ? sh[lane] : -INFINITY;
    return kn_warp_max(v);
}

/* Per-block metadata of Q8_0 activations (see kn_cuda_q8_bytes). */
struct kn_q8_meta {
    float d; /* F16-rounded scale */
    int s;   /* sum of the block's quants */
};
static_assert(sizeof(kn_q8_meta) == 8, "Q8 activation metadata must be 8 bytes");

/* Quantizes 32-block `blk` of activations to Q8_0, one element per lane of
 * a whole warp. The operations are the reference's (amax / 127, IEEE
 * reciprocal, roundf, F16 scale), so quants and scales are bit-identical to
 * kn_quantize_row. */
__device__ __forceinline__ void kn_q8_store_warp(float v, size_t blk, int8_t *__restrict__ q,
                                                 kn_q8_meta *__restrict__ meta)
{
    const int lane = threadIdx.x % KN_WARP;
    const float amax = kn_warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const float r = roundf(v * id);
    const int qi = r >= -128.0f && r <= 127.0f ? (int)r : 0;
    q[blk * 32 + lane] = (int8_t)qi;
    const int s = kn_warp_sum_int(qi);
    if (lane == 0) {
        kn_q8_meta m;
        m.d = __half2float(__float2half_rn(d));
        m.s = s;
        meta[blk] = m;
    }
}

/* Where the metadata of n_rows quantized rows of n starts in an activation
 * buffer (kn_cuda_q8_meta_offset), as a typed pointer. */
static inline kn_q8_meta *kn_q8_meta_of(void *d_xq, int n_rows, int n)
{
    return (kn_q8_meta *)((char *)d_xq + kn_cuda_q8_meta_offset(n_rows, n));
}

static inline const kn_q8_meta *kn_q8_meta_of(const void *d_xq, int n_rows, int n)
{
    return (const kn_q8_meta *)((const char *)d_xq + kn_cuda_q8_meta_offset(n_rows, n));
}

#endif
