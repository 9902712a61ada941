/* kernels/cuda: decode matrix-vector products for a few activation rows —
 * the bandwidth-bound half of a forward step. One warp owns one output row
 * and walks it with 128-bit loads, so a warp reads 512 contiguous weight
 * bytes per step and every weight byte is read once, whatever the number of
 * activation rows (up to KN_CUDA_MMV_MAX_ROWS, a template parameter so the
 * accumulators stay in registers). Quantized weights meet Q8_0 activations
 * in __dp4a integer dots, one exact integer sum per 32-block, as the scalar
 * reference computes them; F16/F32 weights take the F32 activations. */
#include "kernels/cuda/kn_cuda_internal.cuh"

#define MMV_WARPS 4  /* output rows per thread block */
#define MMV_UNROLL 4 /* 16-byte loads a lane has in flight */

/* ---- activations to Q8_0 ----------------------------------------------------
 * One warp per 32-block, one element per lane. The operations are the
 * reference's (amax / 127, IEEE reciprocal, roundf, F16 scale), so the
 * quants and scales are bit-identical to kn_quantize_row. */
__global__ void quantize_q8_kernel(const float *__restrict__ x, size_t n_blocks, int8_t *__restrict__ q,
                                   kn_q8_meta *__restrict__ meta)
{
    const size_t blk = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / KN_WARP;
    const int lane = threadIdx.x % KN_WARP;
    if (blk >= n_blocks)
        return; /* whole warps leave together */
    const float v = x[blk * 32 + lane];
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

extern "C" int kn_cuda_quantize_q8(kn_cuda *c, const float *d_x, int n_rows, int n, void *d_xq)
{
    if (n_rows < 0 || n <= 0 || n % 32 != 0)
        return KN_CUDA_EINVAL(c, "quantize_q8: n must be a positive multiple of 32");
    const size_t n_blocks = (size_t)n_rows * (n / 32);
    if (n_blocks == 0)
        return 0;
    int8_t *q = (int8_t *)d_xq;
    kn_q8_meta *meta = (kn_q8_meta *)((char *)d_xq + kn_cuda_q8_meta_offset(n_rows, n));
    quantize_q8_kernel<<<kn_cuda__blocks(n_blocks * KN_WARP, 256), 256, 0, c->stream>>>(d_x, n_blocks, q,
                                                                                        meta);
    KN_CUDA_LAUNCHED(c);
    return 0;
}

/* ---- shared tail: reduce each row's lane sums, lane 0 writes ---- */

template <int R>
__device__ __forceinline__ void mmv_store(float (&acc)[R], float *__restrict__ y, int n_out, int o, bool add)
{
    const int lane = threadIdx.x % KN_WARP;
#pragma unroll
    for (int r = 0; r < R; r++) {
        const float v = kn_warp_sum(acc[r]);
        if (lane == 0) {
            float *p = y + (size_t)r * n_out + o;
            *p = add ? *p + v : v;
        }
    }
}

/* ---- Q8_0 x Q8_0 ----
 * A lane reads 16 quants (half a block) per load; the two lanes holding one
 * block add their integer sums with a shuffle so the block is scaled once,
 * as in the reference. */
template <int R>
__global__ void __launch_bounds__(MMV_WARPS *KN_WARP)
    mmv_q8_0_kernel(const int8_t *__restrict__ wq, const __half *__restrict__ wd, int n_out, int n_in,
                    const int8_t *__restrict__ xq, const kn_q8_meta *__restrict__ xm, float *__restrict__ y,
                    bool add)
{
    const int o = blockIdx.x * MMV_WARPS + threadIdx.x / KN_WARP;
    const int lane = threadIdx.x % KN_WARP;
    if (o >= n_out)
        return;
    const int nb = n_in / 32, n_chunks = n_in / 16;
    const int4 *w = (const int4 *)(wq + (size_t)o * n_in);
    const __half *d = wd + (size_t)o * nb;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        acc[r] = 0.0f;
    for (int c0 = 0; c0 < n_chunks; c0 += KN_WARP * MMV_UNROLL) {
        int4 wv[MMV_UNROLL];
        float dw[MMV_UNROLL];
        /* All loads of the step first: they are what keeps HBM busy. */
#pragma unroll
        for (int u = 0; u < MMV_UNROLL; u++) {
            const int ch = c0 + u * KN_WARP + lane;
            wv[u] = ch < n_chunks ? __ldcs(w + ch) : make_int4(0, 0, 0, 0);
            dw[u] = ch < n_chunks ? __half2float(d[ch / 2]) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < MMV_UNROLL; u++) {
            const int ch = c0 + u * KN_WARP + lane;
            if (c0 + u * KN_WARP >= n_chunks)
                break; /* uniform across the warp */
            const bool ok = ch < n_chunks;
#pragma unroll
            for (int r = 0; r < R; r++) {
                int s = 0;
                if (ok) {
                    const int4 xv = __ldg((const int4 *)(xq + (size_t)r * n_in) + ch);
                    s = __dp4a(wv[u].x, xv.x, s);
                    s = __dp4a(wv[u].y, xv.y, s);
                    s = __dp4a(wv[u].z, xv.z, s);
                    s = __dp4a(wv[u].w, xv.w, s);
                }
                s += __shfl_xor_sync(0xffffffffu, s, 1);
                if (ok && (lane & 1) == 0)
                    acc[r] += (float)s * (dw[u] * xm[(size_t)r * nb + ch / 2].d);
            }
        }
    }
    mmv_store<R>(acc, y, n_out, o, add);
}

/* ---- Q4_0 x Q8_0 ----
 * A lane reads one whole block (16 bytes of nibbles) per load. Low nibbles
 * are elements 0..15, high nibbles 16..31; the dot runs on the raw 0..15
 * values and 8 * sum(x quants) comes off afterwards, which equals the
 * reference's sum of (q - 8) * x exactly. */
template <int R>
__global__ void __launch_bounds__(MMV_WARPS *KN_WARP)
    mmv_q4_0_kernel(const uint8_t *__restrict__ wq, const __half *__restrict__ wd, int n_out, int n_in,
                    const int8_t *__restrict__ xq, const kn_q8_meta *__restrict__ xm, float *__restrict__ y,
                    bool add)
{
    const int o = blockIdx.x * MMV_WARPS + threadIdx.x / KN_WARP;
    const int lane = threadIdx.x % KN_WARP;
    if (o >= n_out)
        return;
    const int nb = n_in / 32;
    const int4 *w = (const int4 *)(wq + (size_t)o * (n_in / 2));
    const __half *d = wd + (size_t)o * nb;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        acc[r] = 0.0f;
    for (int b0 = 0; b0 < nb; b0 += KN_WARP * MMV_UNROLL) {
        int4 wv[MMV_UNROLL];
        float dw[MMV_UNROLL];
#pragma unroll
        for (int u = 0; u < MMV_UNROLL; u++) {
            const int b = b0 + u * KN_WARP + lane;
            wv[u] = b < nb ? __ldcs(w + b) : make_int4(0, 0, 0, 0);
            dw[u] = b < nb ? __half2float(d[b]) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < MMV_UNROLL; u++) {
            const int b = b0 + u * KN_WARP + lane;
            if (b >= nb)
                break; /* lanes past the row end drop out; no shuffles below */
            const int lo0 = wv[u].x & 0x0f0f0f0f, hi0 = (wv[u].x >> 4) & 0x0f0f0f0f;
            const int lo1 = wv[u].y & 0x0f0f0f0f, hi1 = (wv[u].y >> 4) & 0x0f0f0f0f;
            const int lo2 = wv[u].z & 0x0f0f0f0f, hi2 = (wv[u].z >> 4) & 0x0f0f0f0f;
            const int lo3 = wv[u].w & 0x0f0f0f0f, hi3 = (wv[u].w >> 4) & 0x0f0f0f0f;
#pragma unroll
            for (int r = 0; r < R; r++) {
                const int4 *xr = (const int4 *)(xq + (size_t)r * n_in) + 2 * b;
                const int4 x0 = __ldg(xr), x1 = __ldg(xr + 1);
                const kn_q8_meta m = xm[(size_t)r * nb + b];
                int s = __dp4a(lo0, x0.x, 0);
                s = __dp4a(lo1, x0.y, s);
                s = __dp4a(lo2, x0.z, s);
                s = __dp4a(lo3, x0.w, s);
                s = __dp4a(hi0, x1.x, s);
                s = __dp4a(hi1, x1.y, s);
                s = __dp4a(hi2, x1.z, s);
                s = __dp4a(hi3, x1.w, s);
                s -= 8 * m.s;
                acc[r] += (float)s * (dw[u] * m.d);
            }
        }
    }
    mmv_store<R>(acc, y, n_out, o, add);
}

/* ---- F16 and F32 weights x F32 activations ----
 * VEC: rows are 16-byte aligned (n_in a multiple of 8 halves / 4 floats)
 * and read with 128-bit loads; otherwise one element per lane per step. */
template <int R, bool VEC>
__global__ void __launch_bounds__(MMV_WARPS *KN_WARP)
    mmv_f16_kernel(const __half *__restrict__ w, int n_out, int n_in, const float *__restrict__ x,
                   float *__restrict__ y, bool add)
{
    const int o = blockIdx.x * MMV_WARPS + threadIdx.x / KN_WARP;
    const int lane = threadIdx.x % KN_WARP;
    if (o >= n_out)
        return;
    const __half *wr = w + (size_t)o * n_in;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        acc[r] = 0.0f;
    if (VEC) {
        const int n_chunks = n_in / 8;
        for (int ch = lane; ch < n_chunks; ch += KN_WARP) {
            const int4 raw = __ldcs((const int4 *)wr + ch);
            const __half2 *h = (const __half2 *)&raw;
            float2 wf[4];
#pragma unroll
            for (int k = 0; k < 4; k++)
                wf[k] = __half22float2(h[k]);
#pragma unroll
            for (int r = 0; r < R; r++) {
                const float4 *xr = (const float4 *)(x + (size_t)r * n_in) + 2 * ch;
                const float4 a = __ldg(xr), b = __ldg(xr + 1);
                acc[r] += wf[0].x * a.x + wf[0].y * a.y + wf[1].x * a.z + wf[1].y * a.w + wf[2].x * b.x +
                          wf[2].y * b.y + wf[3].x * b.z + wf[3].y * b.w;
            }
        }
    } else {
        for (int i = lane; i < n_in; i += KN_WARP) {
            const float wf = __half2float(wr[i]);
#pragma unroll
            for (int r = 0; r < R; r++)
                acc[r] += wf * __ldg(x + (size_t)r * n_in + i);
        }
    }
    mmv_store<R>(acc, y, n_out, o, add);
}

template <int R, bool VEC>
__global__ void __launch_bounds__(MMV_WARPS *KN_WARP)
    mmv_f32_kernel(const float *__restrict__ w, int n_out, int n_in, const float *__restrict__ x,
                   float *__restrict__ y, bool add)
{
    const int o = blockIdx.x * MMV_WARPS + threadIdx.x / KN_WARP;
    const int lane = threadIdx.x % KN_WARP;
    if (o >= n_out)
        return;
    const float *wr = w + (size_t)o * n_in;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        acc[r] = 0.0f;
    if (VEC) {
        const int n_chunks = n_in / 4;
        for (int ch = lane; ch < n_chunks; ch += KN_WARP) {
            const float4 wv = __ldcs((const float4 *)wr + ch);
#pragma unroll
            for (int r = 0; r < R; r++) {
                const float4 a = __ldg((const float4 *)(x + (size_t)r * n_in) + ch);
                acc[r] += wv.x * a.x + wv.y * a.y + wv.z * a.z + wv.w * a.w;
            }
        }
    } else {
        for (int i = lane; i < n_in; i += KN_WARP) {
            const float wf = __ldcs(wr + i);
#pragma unroll
            for (int r = 0; r < R; r++)
                acc[r] += wf * __ldg(x + (size_t)r * n_in + i);
        }
    }
    mmv_store<R>(acc, y, n_out, o, add);
}

/* ---- dispatch ---- */

template <int R>
static void mmv_launch(kn_cuda *c, const kn_cuda_weight *w, const float *x, const void *xq, float *y,
                       bool add)
{
    const dim3 grid(kn_cuda__blocks((size_t)w->n_out, MMV_WARPS)), block(MMV_WARPS * KN_WARP);
    const int n_out = w->n_out, n_in = w->n_in;
    switch (w->type) {
    case KN_TYPE_Q8_0:
    case KN_TYPE_Q4_0: {
        const int8_t *q = (const int8_t *)xq;
        const kn_q8_meta *m = (const kn_q8_meta *)((const char *)xq + kn_cuda_q8_meta_offset(R, n_in));
        if (w->type == KN_TYPE_Q8_0)
            mmv_q8_0_kernel<R><<<grid, block, 0, c->stream>>>(
                (const int8_t *)w->d_q, (const __half *)w->d_scl, n_out, n_in, q, m, y, add);
        else
            mmv_q4_0_kernel<R><<<grid, block, 0, c->stream>>>(
                (const uint8_t *)w->d_q, (const __half *)w->d_scl, n_out, n_in, q, m, y, add);
        break;
    }
    case KN_TYPE_F16:
        if (n_in % 8 == 0)
            mmv_f16_kernel<R, true>
                <<<grid, block, 0, c->stream>>>((const __half *)w->d_q, n_out, n_in, x, y, add);
        else
            mmv_f16_kernel<R, false>
                <<<grid, block, 0, c->stream>>>((const __half *)w->d_q, n_out, n_in, x, y, add);
        break;
    case KN_TYPE_F32:
        if (n_in % 4 == 0)
            mmv_f32_kernel<R, true>
                <<<grid, block, 0, c->stream>>>((const float *)w->d_q, n_out, n_in, x, y, add);
        else
            mmv_f32_kernel<R, false>
                <<<grid, block, 0, c->stream>>>((const float *)w->d_q, n_out, n_in, x, y, add);
        break;
    }
}

/* Called by kn_cuda_matmul for 1..KN_CUDA_MMV_MAX_ROWS rows; xq holds
 * exactly n_rows quantized rows (its metadata offset depends on it). */
int kn_cuda__mmv(kn_cuda *c, const kn_cuda_weight *w, const float *d_x, const void *d_xq, int n_rows,
                 float *d_y, bool add)
{
    static_assert(KN_CUDA_MMV_MAX_ROWS == 8, "mmv_launch is instantiated for 1..8 rows");
    switch (n_rows) {
    case 1:
        mmv_launch<1>(c, w, d_x, d_xq, d_y, add);
        break;
    case 2:
        mmv_launch<2>(c, w, d_x, d_xq, d_y, add);
        break;
    case 3:
        mmv_launch<3>(c, w, d_x, d_xq, d_y, add);
        break;
    case 4:
        mmv_launch<4>(c, w, d_x, d_xq, d_y, add);
        break;
    case 5:
        mmv_launch<5>(c, w, d_x, d_xq, d_y, add);
        break;
    case 6:
        mmv_launch<6>(c, w, d_x, d_xq, d_y, add);
        break;
    case 7:
        mmv_launch<7>(c, w, d_x, d_xq, d_y, add);
        break;
    case 8:
        mmv_launch<8>(c, w, d_x, d_xq, d_y, add);
        break;
    default:
        return KN_CUDA_EINVAL(c, "mmv: row count out of range");
    }
    KN_CUDA_LAUNCHED(c);
    return 0;
}
