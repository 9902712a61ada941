/* kernels/cuda: decode matrix-vector products for a few activation rows —
 * the bandwidth-bound half of a forward step. A warp owns one output row (two
 * for quantized weights) and walks it with 128-bit loads, so a warp reads 512
 * contiguous weight bytes per load and every weight byte is read once,
 * whatever the number of activation rows (up to KN_CUDA_MMV_MAX_ROWS, a
 * template parameter so the accumulators stay in registers). Quantized
 * weights meet Q8_0 activations in __dp4a integer dots, one exact integer sum
 * per 32-block, as the scalar reference computes them; F16/F32 weights take
 * the F32 activations. */
#include "kernels/cuda/kn_cuda_blocks.cuh"
#include "kernels/cuda/kn_cuda_internal.cuh"

#define MMV_WARPS 4 /* warps per thread block */

/* ---- activations to Q8_0: one warp per 32-block ---- */

__global__ void quantize_q8_kernel(const float *__restrict__ x, size_t n_blocks, int8_t *__restrict__ q,
                                   kn_q8_meta *__restrict__ meta)
{
    kn_pdl_begin();
    const size_t blk = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / KN_WARP;
    if (blk >= n_blocks)
        return; /* whole warps leave together */
    kn_q8_store_warp(x[blk * 32 + threadIdx.x % KN_WARP], blk, q, meta);
}

extern "C" int kn_cuda_quantize_q8(kn_cuda *c, const float *d_x, int n_rows, int n, void *d_xq)
{
    if (n_rows < 0 || n <= 0 || n % 32 != 0)
        return KN_CUDA_EINVAL(c, "quantize_q8: n must be a positive multiple of 32");
    const size_t n_blocks = (size_t)n_rows * (n / 32);
    if (n_blocks == 0)
        return 0;
    kn_cuda__launch(c, kn_cuda__blocks(n_blocks * KN_WARP, 256), 256, 0, quantize_q8_kernel, d_x, n_blocks,
                    (int8_t *)d_xq, kn_q8_meta_of(d_xq, n_rows, n));
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

/* ---- Q8_0 and Q4_0 weights x Q8_0 activations ----
 * A lane's unit is one 16-byte load: half a Q8_0 block (16 quants) or a
 * whole Q4_0 block (32 nibbles). A warp owns MMV_NR output rows and walks
 * them together, U units per lane per row and step.
 *
 * Q8_0: the two lanes holding one block add their integer sums with a
 * shuffle so the block is scaled once, as in the reference.
 * Q4_0: low nibbles are elements 0..15, high nibbles 16..31; the dot runs on
 * the raw 0..15 values and 8 * sum(x quants) comes off afterwards, which
 * equals the reference's sum of (q - 8) * x exactly.
 *
 * Weights are the one input no earlier kernel writes, so the first step's
 * loads are issued before kn_pdl_wait() and stream in while the previous
 * kernel finishes; and the next kernel may launch as soon as every block of
 * this one has started (the trigger comes first here, unlike kn_pdl_begin),
 * so that a chain of products keeps HBM busy across kernel boundaries. On an
 * H100 that takes a 4096 x 4096 Q8_0 product from 68% to 85% of the copy
 * bandwidth and Q4_0 from 61% to 81% (bench/RESULTS.md). Loading step k+1
 * before the dots of step k, or capping registers for occupancy, measured
 * slower. */
#define MMV_NR 2 /* output rows per warp */

template <bool Q4, int U>
__device__ __forceinline__ void mmv_load(const int4 *const (&w)[MMV_NR], const __half *const (&d)[MMV_NR],
                                         int n_units, int u0, int lane, int4 (&wv)[MMV_NR][U],
                                         float (&dw)[MMV_NR][U])
{
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int k = u0 + u * KN_WARP + lane;
#pragma unroll
        for (int j = 0; j < MMV_NR; j++) {
            wv[j][u] = k < n_units ? __ldcs(w[j] + k) : make_int4(0, 0, 0, 0);
            dw[j][u] = k < n_units ? __half2float(d[j][Q4 ? k : k / 2]) : 0.0f;
        }
    }
}

/* Adds the dots of one step (units u0 + u * 32 + lane) to acc. */
template <int R, bool Q4, int U>
__device__ __forceinline__ void mmv_dots(const int4 (&wv)[MMV_NR][U], const float (&dw)[MMV_NR][U], int n_in,
                                         int n_units, int u0, int lane, const int8_t *__restrict__ xq,
                                         const kn_q8_meta *__restrict__ xm, float (&acc)[MMV_NR][R])
{
    const int nb = n_in / 32;
#pragma unroll
    for (int u = 0; u < U; u++) {
        if (u0 + u * KN_WARP >= n_units)
            break; /* uniform across the warp */
        const int k = u0 + u * KN_WARP + lane;
        const bool ok = k < n_units;
        if (Q4) {
            if (!ok)
                break; /* lanes past the row end drop out; no shuffles below */
#pragma unroll
            for (int r = 0; r < R; r++) {
                const int4 *xr = (const int4 *)(xq + (size_t)r * n_in) + 2 * k;
                const int4 x0 = __ldg(xr), x1 = __ldg(xr + 1);
                const kn_q8_meta m = xm[(size_t)r * nb + k];
#pragma unroll
                for (int j = 0; j < MMV_NR; j++) {
                    const int4 q = wv[j][u];
                    int s = __dp4a(q.x & 0x0f0f0f0f, x0.x, 0);
                    s = __dp4a(q.y & 0x0f0f0f0f, x0.y, s);
                    s = __dp4a(q.z & 0x0f0f0f0f, x0.z, s);
                    s = __dp4a(q.w & 0x0f0f0f0f, x0.w, s);
                    s = __dp4a((q.x >> 4) & 0x0f0f0f0f, x1.x, s);
                    s = __dp4a((q.y >> 4) & 0x0f0f0f0f, x1.y, s);
                    s = __dp4a((q.z >> 4) & 0x0f0f0f0f, x1.z, s);
                    s = __dp4a((q.w >> 4) & 0x0f0f0f0f, x1.w, s);
                    s -= 8 * m.s;
                    acc[j][r] += (float)s * (dw[j][u] * m.d);
                }
            }
        } else {
#pragma unroll
            for (int r = 0; r < R; r++) {
                const int4 xv = ok ? __ldg((const int4 *)(xq + (size_t)r * n_in) + k) : make_int4(0, 0, 0, 0);
                const float xd = ok ? xm[(size_t)r * nb + k / 2].d : 0.0f;
#pragma unroll
                for (int j = 0; j < MMV_NR; j++) {
                    int s = __dp4a(wv[j][u].x, xv.x, 0);
                    s = __dp4a(wv[j][u].y, xv.y, s);
                    s = __dp4a(wv[j][u].z, xv.z, s);
                    s = __dp4a(wv[j][u].w, xv.w, s);
                    s += __shfl_xor_sync(0xffffffffu, s, 1);
                    if ((lane & 1) == 0)
                        acc[j][r] += (float)s * (dw[j][u] * xd);
                }
            }
        }
    }
}

template <int R, bool Q4, int U>
__global__ void __launch_bounds__(MMV_WARPS *KN_WARP)
    mmv_quant_kernel(const uint8_t *__restrict__ wq, const __half *__restrict__ wd, int n_out, int n_in,
                     const int8_t *__restrict__ xq, const kn_q8_meta *__restrict__ xm, float *__restrict__ y,
                     bool add)
{
    const int o0 = (blockIdx.x * MMV_WARPS + threadIdx.x / KN_WARP) * MMV_NR;
    const int lane = threadIdx.x % KN_WARP;
    if (o0 >= n_out)
        return;
    const int nb = n_in / 32, n_units = Q4 ? nb : n_in / 16;
    const size_t row_bytes = Q4 ? (size_t)n_in / 2 : (size_t)n_in;
    const int4 *w[MMV_NR];
    const __half *d[MMV_NR];
#pragma unroll
    for (int j = 0; j < MMV_NR; j++) {
        const int o = min(o0 + j, n_out - 1); /* rows past the end read the last again; not stored */
        w[j] = (const int4 *)(wq + (size_t)o * row_bytes);
        d[j] = wd + (size_t)o * nb;
    }
    int4 wv[MMV_NR][U];
    float dw[MMV_NR][U];
    kn_pdl_trigger();
    mmv_load<Q4, U>(w, d, n_units, 0, lane, wv, dw);
    kn_pdl_wait();
    float acc[MMV_NR][R];
#pragma unroll
    for (int j = 0; j < MMV_NR; j++)
#pragma unroll
        for (int r = 0; r < R; r++)
            acc[j][r] = 0.0f;
    const int step = KN_WARP * U;
    for (int u0 = 0; u0 < n_units; u0 += step) {
        mmv_dots<R, Q4, U>(wv, dw, n_in, n_units, u0, lane, xq, xm, acc);
        if (u0 + step < n_units)
            mmv_load<Q4, U>(w, d, n_units, u0 + step, lane, wv, dw);
    }
#pragma unroll
    for (int j = 0; j < MMV_NR; j++)
        if (o0 + j < n_out)
            mmv_store<R>(acc[j], y, n_out, o0 + j, add);
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
    kn_pdl_begin();
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
    kn_pdl_begin();
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

/* ---- the types kept as GGUF blocks x F32 activations ----
 * A warp owns one output row; each lane decodes a unit (32 elements: a
 * block, or an eighth of a super-block) at a time into registers
 * (kn_dq_unit) and dots it with the activation rows, read as float4. The
 * lanes of a warp take consecutive units, so a step reads a contiguous run
 * of the row. Weights stream in before kn_pdl_wait, as in the quantized
 * kernel above. */
template <int R>
__global__ void __launch_bounds__(MMV_WARPS *KN_WARP)
    mmv_blocks_kernel(kn_type t, const uint8_t *__restrict__ w, size_t row_bytes, int n_out, int n_in,
                      const float *__restrict__ x, float *__restrict__ y, bool add)
{
    const int o = blockIdx.x * MMV_WARPS + threadIdx.x / KN_WARP;
    const int lane = threadIdx.x % KN_WARP;
    if (o >= n_out)
        return;
    kn_pdl_trigger();
    const uint8_t *wr = w + (size_t)o * row_bytes;
    const int n_units = n_in / 32;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        acc[r] = 0.0f;
    float v[32];
    if (lane < n_units)
        kn_dq_unit(t, wr, lane, v);
    kn_pdl_wait(); /* the activations are the previous kernel's */
    for (int u = lane; u < n_units; u += KN_WARP) {
        if (u != lane)
            kn_dq_unit(t, wr, u, v);
#pragma unroll
        for (int r = 0; r < R; r++) {
            const float4 *xr = (const float4 *)(x + (size_t)r * n_in + (size_t)u * 32);
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const float4 a = __ldg(xr + k);
                s += v[4 * k] * a.x + v[4 * k + 1] * a.y + v[4 * k + 2] * a.z + v[4 * k + 3] * a.w;
            }
            acc[r] += s;
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
        /* Rows of at least 256 loads take 8 loads per lane and row (more
         * bytes in flight); more activation rows than 2 would make that
         * too many registers. */
        const bool q4 = w->type == KN_TYPE_Q4_0;
        const bool long_rows = (q4 ? n_in / 32 : n_in / 16) >= 8 * KN_WARP;
        constexpr int U_LONG = R <= 2 ? 8 : 4;
        auto k = q4 ? (long_rows ? mmv_quant_kernel<R, true, U_LONG> : mmv_quant_kernel<R, true, 4>)
                    : (long_rows ? mmv_quant_kernel<R, false, U_LONG> : mmv_quant_kernel<R, false, 4>);
        kn_cuda__launch(c, kn_cuda__blocks((size_t)n_out, MMV_WARPS * MMV_NR), block, 0, k,
                        (const uint8_t *)w->d_q, (const __half *)w->d_scl, n_out, n_in, (const int8_t *)xq,
                        kn_q8_meta_of(xq, R, n_in), y, add);
        break;
    }
    case KN_TYPE_F16:
        if (n_in % 8 == 0)
            kn_cuda__launch(c, grid, block, 0, mmv_f16_kernel<R, true>, (const __half *)w->d_q, n_out, n_in,
                            x, y, add);
        else
            kn_cuda__launch(c, grid, block, 0, mmv_f16_kernel<R, false>, (const __half *)w->d_q, n_out, n_in,
                            x, y, add);
        break;
    case KN_TYPE_F32:
        if (n_in % 4 == 0)
            kn_cuda__launch(c, grid, block, 0, mmv_f32_kernel<R, true>, (const float *)w->d_q, n_out, n_in, x,
                            y, add);
        else
            kn_cuda__launch(c, grid, block, 0, mmv_f32_kernel<R, false>, (const float *)w->d_q, n_out, n_in,
                            x, y, add);
        break;
    default:
        /* kn_cuda_weight_upload refuses a type with no device layout */
        if (kn_cuda_raw_layout(w->type))
            kn_cuda__launch(c, grid, block, 0, mmv_blocks_kernel<R>, w->type, (const uint8_t *)w->d_q,
                            kn_row_bytes(w->type, n_in), n_out, n_in, x, y, add);
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
