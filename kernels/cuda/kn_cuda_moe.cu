/* kernels/cuda: mixture-of-experts layers on the device — the router's
 * choice per token (the CPU's own code, kernels/kn_moe_route.h), the
 * grouping of a step's (token, slot) pairs by expert, the experts'
 * products over their groups, and the weighted sum back into each token's
 * row. Everything stays on the device: the host never learns which experts
 * a step chose, so a recorded step (CUDA graph) replays whatever they are.
 *
 * The grouped product is plain, not fast: a warp per output row of one
 * expert decodes the row a unit at a time and dots it with every row of
 * the expert's group, a few rows per pass, with F32 activations (as the
 * types kept as GGUF blocks are multiplied in kn_cuda_matvec.cu). A weight
 * row comes from device memory once per pass, and an expert no token
 * chose is not read at all. */
#include "kernels/cuda/kn_cuda_blocks.cuh"
#include "kernels/cuda/kn_cuda_internal.cuh"
#include "kernels/kn_moe_route.h"

#define MOE_WARPS 4 /* output rows a block */
#define MOE_R 4     /* group rows a pass */
#define GROUP_THREADS 256

__global__ void moe_route_kernel(const float *__restrict__ logits, int n_tokens, int n, int k, bool softmax_topk,
                                 bool norm_w, int32_t *__restrict__ pick, float *__restrict__ w)
{
    kn_pdl_begin();
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_tokens)
        return;
    kn_moe_route(logits + (size_t)t * n, n, k, softmax_topk, norm_w, pick + (size_t)t * k, w + (size_t)t * k);
}

extern "C" int kn_cuda_moe_route(kn_cuda *c, const float *d_logits, int n_tokens, int n_expert, int k,
                                 bool softmax_topk, bool norm_w, int32_t *d_pick, float *d_w)
{
    if (n_tokens < 0 || n_expert <= 0 || k <= 0 || k > n_expert)
        return KN_CUDA_EINVAL(c, "moe_route: bad shape");
    if (n_tokens == 0)
        return 0;
    kn_cuda__launch(c, kn_cuda__blocks((size_t)n_tokens, 64), 64, 0, moe_route_kernel, d_logits, n_tokens,
                    n_expert, k, softmax_topk, norm_w, d_pick, d_w);
    KN_CUDA_LAUNCHED(c);
    return 0;
}

/* One block: thread e counts expert e's pairs (and e + GROUP_THREADS ...),
 * thread 0 turns the counts into offsets, then each expert's pairs are
 * placed in pair order. Deterministic: no atomics. */
__global__ void moe_group_kernel(const int32_t *__restrict__ pick, int n_pairs, int n_expert,
                                 int32_t *__restrict__ off, int32_t *__restrict__ rows, int32_t *__restrict__ inv)
{
    kn_pdl_begin();
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) {
        int n = 0;
        for (int i = 0; i < n_pairs; i++)
            n += pick[i] == e;
        off[e + 1] = n;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        off[0] = 0;
        for (int e = 0; e < n_expert; e++)
            off[e + 1] += off[e];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) {
        int g = off[e];
        for (int i = 0; i < n_pairs; i++)
            if (pick[i] == e) {
                rows[g] = i;
                inv[i] = g++;
            }
    }
}

extern "C" int kn_cuda_moe_group(kn_cuda *c, const int32_t *d_pick, int n_pairs, int n_expert, int32_t *d_off,
                                 int32_t *d_rows, int32_t *d_inv)
{
    if (n_pairs < 0 || n_expert <= 0)
        return KN_CUDA_EINVAL(c, "moe_group: bad shape");
    kn_cuda__launch(c, 1, GROUP_THREADS, 0, moe_group_kernel, d_pick, n_pairs, n_expert, d_off, d_rows, d_inv);
    KN_CUDA_LAUNCHED(c);
    return 0;
}

/* Unit u (32 elements) of row `row` of a weight in any device layout. */
__device__ __forceinline__ void dq_any(kn_type t, const void *__restrict__ q, const __half *__restrict__ scl,
                                       size_t row, size_t row_bytes, int n_in, int u, float (&v)[32])
{
    const size_t nb = (size_t)n_in / 32;
    switch (t) {
    case KN_TYPE_F32: {
        const float *p = (const float *)q + row * n_in + 32 * (size_t)u;
#pragma unroll
        for (int l = 0; l < 32; l++)
            v[l] = p[l];
        return;
    }
    case KN_TYPE_F16: {
        const __half *p = (const __half *)q + row * n_in + 32 * (size_t)u;
#pragma unroll
        for (int l = 0; l < 32; l++)
            v[l] = __half2float(p[l]);
        return;
    }
    case KN_TYPE_Q8_0: {
        const int8_t *p = (const int8_t *)q + row * n_in + 32 * (size_t)u;
        const float d = __half2float(scl[row * nb + u]);
#pragma unroll
        for (int l = 0; l < 32; l++)
            v[l] = (float)p[l] * d;
        return;
    }
    case KN_TYPE_Q4_0: {
        const uint8_t *p = (const uint8_t *)q + row * (n_in / 2) + 16 * (size_t)u;
        const float d = __half2float(scl[row * nb + u]);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            v[j] = (float)((p[j] & 0x0f) - 8) * d;
            v[j + 16] = (float)((p[j] >> 4) - 8) * d;
        }
        return;
    }
    default:
        kn_dq_unit(t, (const uint8_t *)q + row * row_bytes, u, v);
        return;
    }
}

__global__ void __launch_bounds__(MOE_WARPS *KN_WARP)
    moe_mm_kernel(kn_type t, const void *__restrict__ q, const __half *__restrict__ scl, size_t row_bytes,
                  int n_out, int n_in, const float *__restrict__ x, int x_div, const int32_t *__restrict__ rows,
                  const int32_t *__restrict__ off, const float *__restrict__ bias, float *__restrict__ y)
{
    kn_pdl_begin();
    const int e = blockIdx.y, o = blockIdx.x * MOE_WARPS + threadIdx.x / KN_WARP, lane = threadIdx.x % KN_WARP;
    const int g0 = off[e], g1 = off[e + 1];
    if (o >= n_out || g0 == g1)
        return;
    const size_t row = (size_t)e * n_out + o;
    const int n_units = n_in / 32;
    const float b = bias ? bias[row] : 0.0f;
    for (int g = g0; g < g1; g += MOE_R) {
        const float *xr[MOE_R];
        float acc[MOE_R];
#pragma unroll
        for (int r = 0; r < MOE_R; r++) {
            const int gi = g + r;
            xr[r] = gi < g1 ? x + (size_t)(x_div > 0 ? rows[gi] / x_div : gi) * n_in : NULL;
            acc[r] = 0.0f;
        }
        for (int u = lane; u < n_units; u += KN_WARP) {
            float v[32];
            dq_any(t, q, scl, row, row_bytes, n_in, u, v);
#pragma unroll
            for (int r = 0; r < MOE_R; r++) {
                if (!xr[r])
                    continue;
                const float *xu = xr[r] + (size_t)u * 32;
                float s = 0.0f;
#pragma unroll
                for (int l = 0; l < 32; l++)
                    s += v[l] * xu[l];
                acc[r] += s;
            }
        }
#pragma unroll
        for (int r = 0; r < MOE_R; r++) {
            const float s = kn_warp_sum(acc[r]);
            if (lane == 0 && xr[r])
                y[(size_t)(g + r) * n_out + o] = s + b;
        }
    }
}

extern "C" int kn_cuda_moe_matmul(kn_cuda *c, const kn_cuda_weight *w, int n_expert, const float *d_x, int x_div,
                                  const int32_t *d_rows, const int32_t *d_off, const float *d_bias, float *d_y)
{
    if (n_expert <= 0 || w->n_out % n_expert != 0 || w->n_in % 32 != 0 || x_div < 0 || n_expert > 65535)
        return KN_CUDA_EINVAL(c, "moe_matmul: bad shape");
    const int n_out = w->n_out / n_expert;
    const size_t row_bytes = kn_cuda_raw_layout(w->type) ? kn_row_bytes(w->type, w->n_in) : 0;
    const dim3 grid(kn_cuda__blocks((size_t)n_out, MOE_WARPS), n_expert), block(MOE_WARPS * KN_WARP);
    kn_cuda__launch(c, grid, block, 0, moe_mm_kernel, w->type, (const void *)w->d_q, (const __half *)w->d_scl,
                    row_bytes, n_out, w->n_in, d_x, x_div, d_rows, d_off, d_bias, d_y);
    KN_CUDA_LAUNCHED(c);
    return 0;
}

__global__ void moe_combine_kernel(float *__restrict__ y, const float *__restrict__ ye, const float *__restrict__ w,
                                   const int32_t *__restrict__ inv, int k, int n)
{
    kn_pdl_begin();
    const size_t t = blockIdx.x;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float s = y[t * n + i];
        for (int j = 0; j < k; j++)
            s += w[t * k + j] * ye[(size_t)inv[t * k + j] * n + i];
        y[t * n + i] = s;
    }
}

extern "C" int kn_cuda_moe_combine(kn_cuda *c, float *d_y, const float *d_ye, const float *d_w,
                                   const int32_t *d_inv, int n_tokens, int k, int n)
{
    if (n_tokens < 0 || k <= 0 || n <= 0)
        return KN_CUDA_EINVAL(c, "moe_combine: bad shape");
    if (n_tokens == 0)
        return 0;
    kn_cuda__launch(c, n_tokens, 256, 0, moe_combine_kernel, d_y, d_ye, d_w, d_inv, k, n);
    KN_CUDA_LAUNCHED(c);
    return 0;
}
