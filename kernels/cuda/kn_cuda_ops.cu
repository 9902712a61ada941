/* kernels/cuda: the row-wise and element-wise operations of a forward step —
 * RMSNorm, softmax, SiLU-gate, residual and bias adds, row gather, embedding
 * lookup, RoPE, and the store of new K/V rows into the F16 paged cache. Each
 * mirrors its scalar reference in kernels/kn_ref.c or kn_ctx.c operation for
 * operation; they are small next to the matrix products, so they are written
 * to be obviously right rather than clever. */
#include "kernels/cuda/kn_cuda_blocks.cuh"
#include "kernels/cuda/kn_cuda_internal.cuh"
#include "kernels/kn_glu.h"

#define ROW_THREADS 256

/* ---- RMSNorm, softmax: one thread block per row ---- */

/* Rows of up to V * ROW_THREADS elements stay in registers between the sum
 * of squares and the scaling, so x and g are read once with all loads in
 * flight together (a loop that reloads costs a memory latency per
 * iteration, which made this the slowest small kernel of a decode step);
 * V = 0 loops, for longer rows. Both sum in the same order. With q, the
 * result is also quantized to Q8_0, one warp per 32 elements (n % 32 == 0,
 * so each warp is whole), exactly as quantize_q8_kernel would. */
template <int V>
__global__ void rmsnorm_kernel(float *y, const float *x, const float *__restrict__ g, int n, float eps,
                               int8_t *__restrict__ q, kn_q8_meta *__restrict__ meta)
{
    kn_pdl_begin();
    __shared__ float sh[32];
    const float *xr = x + (size_t)blockIdx.x * n;
    float *yr = y + (size_t)blockIdx.x * n;
    float xv[V > 0 ? V : 1], gv[V > 0 ? V : 1];
    float ss = 0.0f;
    if (V > 0) {
#pragma unroll
        for (int v = 0; v < V; v++) {
            const int i = threadIdx.x + v * ROW_THREADS;
            xv[v] = i < n ? xr[i] : 0.0f;
            gv[v] = i < n ? g[i] : 0.0f;
        }
#pragma unroll
        for (int v = 0; v < V; v++)
            ss += xv[v] * xv[v];
    } else {
        for (int i = threadIdx.x; i < n; i += ROW_THREADS)
            ss += xr[i] * xr[i];
    }
    ss = kn_block_sum(ss, sh);
    const float scale = 1.0f / sqrtf(ss / n + eps);
    const size_t blk0 = (size_t)blockIdx.x * (n / 32);
    if (V > 0) {
#pragma unroll
        for (int v = 0; v < V; v++) {
            const int i = threadIdx.x + v * ROW_THREADS;
            if (i >= n)
                break;
            const float r = xv[v] * scale * gv[v];
            yr[i] = r;
            if (q)
                kn_q8_store_warp(r, blk0 + i / 32, q, meta);
        }
    } else {
        for (int i = threadIdx.x; i < n; i += ROW_THREADS) {
            const float r = xr[i] * scale * g[i];
            yr[i] = r;
            if (q)
                kn_q8_store_warp(r, blk0 + i / 32, q, meta);
        }
    }
}

extern "C" int kn_cuda_rmsnorm_q8(kn_cuda *c, float *d_y, const float *d_x, const float *d_g, int n_rows, int n,
                                  float eps, void *d_xq)
{
    if (n_rows < 0 || n <= 0)
        return KN_CUDA_EINVAL(c, "rmsnorm: bad shape");
    if (d_xq && n % 32 != 0)
        return KN_CUDA_EINVAL(c, "rmsnorm: Q8_0 output needs n a multiple of 32");
    if (n_rows == 0)
        return 0;
    auto k = n <= 4 * ROW_THREADS    ? rmsnorm_kernel<4>
             : n <= 8 * ROW_THREADS  ? rmsnorm_kernel<8>
             : n <= 16 * ROW_THREADS ? rmsnorm_kernel<16>
             : n <= 32 * ROW_THREADS ? rmsnorm_kernel<32>
                                     : rmsnorm_kernel<0>;
    kn_cuda__launch(c, n_rows, ROW_THREADS, 0, k, d_y, d_x, d_g, n, eps, (int8_t *)d_xq,
                    d_xq ? kn_q8_meta_of(d_xq, n_rows, n) : (kn_q8_meta *)NULL);
    KN_CUDA_LAUNCHED(c);
    return 0;
}

extern "C" int kn_cuda_rmsnorm(kn_cuda *c, float *d_y, const float *d_x, const float *d_g, int n_rows, int n,
                               float eps)
{
    return kn_cuda_rmsnorm_q8(c, d_y, d_x, d_g, n_rows, n, eps, NULL);
}

__global__ void softmax_kernel(float *x, int n)
{
    kn_pdl_begin();
    __shared__ float sh[32];
    float *xr = x + (size_t)blockIdx.x * n;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        mx = fmaxf(mx, xr[i]);
    mx = kn_block_max(mx, sh);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float e = expf(xr[i] - mx);
        xr[i] = e;
        sum += e;
    }
    sum = kn_block_sum(sum, sh);
    const float inv = 1.0f / sum;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        xr[i] *= inv;
}

extern "C" int kn_cuda_softmax(kn_cuda *c, float *d_x, int n_rows, int n)
{
    if (n_rows < 0 || n <= 0)
        return KN_CUDA_EINVAL(c, "softmax: bad shape");
    if (n_rows == 0)
        return 0;
    kn_cuda__launch(c, n_rows, ROW_THREADS, 0, softmax_kernel, d_x, n);
    KN_CUDA_LAUNCHED(c);
    return 0;
}

/* ---- element-wise ---- */

/* act(g) * u by kernels/kn_ctx.c's own definitions (kn_glu.h). */
__device__ __forceinline__ float glu(kn_cuda_act act, float g, float u)
{
    switch (act) {
    case KN_CUDA_ACT_GELU: return kn_gelu_mul_1(g, u);
    case KN_CUDA_ACT_SWIGLU_OAI: return kn_swiglu_oai_1(g, u, 1.702f, 7.0f); /* runtime/forward.c's */
    default: return g / (1.0f + expf(-g)) * u;
    }
}

/* With q, the result is also quantized to Q8_0 as in rmsnorm_kernel (the
 * blocks of 256 threads hold whole 32-blocks when n % 32 == 0). */
__global__ void silu_mul_kernel(kn_cuda_act act, float *gate, const float *__restrict__ up, size_t n,
                                int8_t *__restrict__ q, kn_q8_meta *__restrict__ meta)
{
    kn_pdl_begin();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return; /* with q, whole warps leave together */
    const float r = glu(act, gate[i], up[i]);
    gate[i] = r;
    if (q)
        kn_q8_store_warp(r, i / 32, q, meta);
}

extern "C" int kn_cuda_glu_q8(kn_cuda *c, kn_cuda_act act, float *d_gate, const float *d_up, int n_rows, int n,
                              void *d_xq)
{
    if (n_rows < 0 || n < 0)
        return KN_CUDA_EINVAL(c, "silu_mul: bad shape");
    if (d_xq && n % 32 != 0)
        return KN_CUDA_EINVAL(c, "silu_mul: Q8_0 output needs n a multiple of 32");
    const size_t total = (size_t)n_rows * n;
    if (total == 0)
        return 0;
    kn_cuda__launch(c, kn_cuda__blocks(total, 256), 256, 0, silu_mul_kernel, act, d_gate, d_up, total,
                    (int8_t *)d_xq, d_xq ? kn_q8_meta_of(d_xq, n_rows, n) : (kn_q8_meta *)NULL);
    KN_CUDA_LAUNCHED(c);
    return 0;
}

extern "C" int kn_cuda_silu_mul_q8(kn_cuda *c, float *d_gate, const float *d_up, int n_rows, int n, void *d_xq)
{
    return kn_cuda_glu_q8(c, KN_CUDA_ACT_SILU, d_gate, d_up, n_rows, n, d_xq);
}

__global__ void scale_softcap_kernel(float *x, size_t n, float scale, float cap)
{
    kn_pdl_begin();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    const float z = x[i] * scale;
    x[i] = cap > 0.0f ? cap * tanhf(z / cap) : z;
}

extern "C" int kn_cuda_scale_softcap(kn_cuda *c, float *d_x, size_t n, float scale, float cap)
{
    if (n == 0)
        return 0;
    kn_cuda__launch(c, kn_cuda__blocks(n, 256), 256, 0, scale_softcap_kernel, d_x, n, scale, cap);
    KN_CUDA_LAUNCHED(c);
    return 0;
}

extern "C" int kn_cuda_silu_mul(kn_cuda *c, float *d_gate, const float *d_up, int n_rows, int n)
{
    return kn_cuda_silu_mul_q8(c, d_gate, d_up, n_rows, n, NULL);
}

__global__ void add_kernel(float *y, const float *__restrict__ x, size_t n)
{
    kn_pdl_begin();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] += x[i];
}

extern "C" int kn_cuda_add(kn_cuda *c, float *d_y, const float *d_x, size_t n)
{
    if (n == 0)
        return 0;
    kn_cuda__launch(c, kn_cuda__blocks(n, 256), 256, 0, add_kernel, d_y, d_x, n);
    KN_CUDA_LAUNCHED(c);
    return 0;
}

__global__ void add_bias_kernel(float *x, const float *__restrict__ b, int n, size_t total)
{
    kn_pdl_begin();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total)
        x[i] += b[i % n];
}

extern "C" int kn_cuda_add_bias(kn_cuda *c, float *d_x, const float *d_b, int n_rows, int n)
{
    if (n_rows < 0 || n <= 0)
        return KN_CUDA_EINVAL(c, "add_bias: bad shape");
    const size_t total = (size_t)n_rows * n;
    if (total == 0)
        return 0;
    kn_cuda__launch(c, kn_cuda__blocks(total, 256), 256, 0, add_bias_kernel, d_x, d_b, n, total);
    KN_CUDA_LAUNCHED(c);
    return 0;
}

__global__ void gather_rows_kernel(float *__restrict__ dst, const float *__restrict__ src,
                                   const int32_t *__restrict__ rows, int n)
{
    kn_pdl_begin();
    const float *s = src + (size_t)rows[blockIdx.x] * n;
    float *d = dst + (size_t)blockIdx.x * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        d[i] = s[i];
}

extern "C" int kn_cuda_gather_rows(kn_cuda *c, float *d_dst, const float *d_src, const int32_t *d_rows,
                                   int n_rows, int n)
{
    if (n_rows < 0 || n <= 0)
        return KN_CUDA_EINVAL(c, "gather_rows: bad shape");
    if (n_rows == 0)
        return 0;
    kn_cuda__launch(c, n_rows, ROW_THREADS, 0, gather_rows_kernel, d_dst, d_src, d_rows, n);
    KN_CUDA_LAUNCHED(c);
    return 0;
}

/* ---- embedding lookup: one thread block per token, any weight type ---- */

__global__ void embed_kernel(kn_type type, const void *__restrict__ q, const __half *__restrict__ scl, int n,
                             const int32_t *__restrict__ tokens, float *__restrict__ x)
{
    kn_pdl_begin();
    const size_t row = (size_t)tokens[blockIdx.x];
    float *xr = x + (size_t)blockIdx.x * n;
    const size_t nb = (size_t)n / 32;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v;
        switch (type) {
        case KN_TYPE_F32:
            v = ((const float *)q)[row * n + i];
            break;
        case KN_TYPE_F16:
            v = __half2float(((const __half *)q)[row * n + i]);
            break;
        case KN_TYPE_Q8_0:
            v = (float)((const int8_t *)q)[row * n + i] * __half2float(scl[row * nb + i / 32]);
            break;
        default: { /* Q4_0 */
            const int j = i % 32;
            const uint8_t b = ((const uint8_t *)q)[row * (n / 2) + (size_t)(i / 32) * 16 + j % 16];
            const int nib = j < 16 ? (b & 0x0f) : (b >> 4);
            v = (float)(nib - 8) * __half2float(scl[row * nb + i / 32]);
            break;
        }
        }
        xr[i] = v;
    }
}

/* The types kept as GGUF blocks: one unit (32 elements) per thread. */
__global__ void embed_blocks_kernel(kn_type type, const uint8_t *__restrict__ w, size_t row_bytes, int n,
                                    const int32_t *__restrict__ tokens, float *__restrict__ x)
{
    kn_pdl_begin();
    const uint8_t *wr = w + (size_t)tokens[blockIdx.x] * row_bytes;
    float *xr = x + (size_t)blockIdx.x * n;
    for (int u = threadIdx.x; u < n / 32; u += blockDim.x) {
        float v[32];
        kn_dq_unit(type, wr, u, v);
#pragma unroll
        for (int l = 0; l < 32; l++)
            xr[32 * u + l] = v[l];
    }
}

extern "C" int kn_cuda_embed(kn_cuda *c, const kn_cuda_weight *emb, const int32_t *d_tokens, int n_tokens,
                             float *d_x)
{
    if (n_tokens < 0 || !emb->d_q)
        return KN_CUDA_EINVAL(c, "embed: no embedding matrix");
    if (n_tokens == 0)
        return 0;
    if (kn_cuda_raw_layout(emb->type))
        kn_cuda__launch(c, n_tokens, ROW_THREADS, 0, embed_blocks_kernel, emb->type, (const uint8_t *)emb->d_q,
                        kn_row_bytes(emb->type, emb->n_in), emb->n_in, d_tokens, d_x);
    else
        kn_cuda__launch(c, n_tokens, ROW_THREADS, 0, embed_kernel, emb->type, emb->d_q,
                        (const __half *)emb->d_scl, emb->n_in, d_tokens, d_x);
    KN_CUDA_LAUNCHED(c);
    return 0;
}

/* ---- RoPE ----
 * The angle of pair i at position p is p * base^(-2i/rope_dim), computed in
 * double and rounded once to float cos/sin, exactly as the CPU path does,
 * so both rotate by the same numbers at any position. */

/* inv NULL: the angle of pair i is p * base^(-2i/rope_dim); else the
 * host-built p * inv[i] (per row, inv_alt where alt says so), and cos and
 * sin times the RoPE's magnitude. */
__global__ void rope_table_kernel(const int32_t *__restrict__ pos, int n_rows, int rope_dim, float freq_base,
                                  const double *__restrict__ inv, float mscale, const int32_t *__restrict__ alt,
                                  const double *__restrict__ inv_alt, float mscale_alt, float *__restrict__ cs)
{
    kn_pdl_begin();
    const int half = rope_dim / 2;
    const size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= (size_t)n_rows * half)
        return;
    const size_t r = k / half;
    const int i = (int)(k % half);
    const bool use_alt = alt && inv_alt && alt[r];
    const double f = use_alt ? inv_alt[i] : inv ? inv[i] : pow((double)freq_base, -2.0 * i / rope_dim);
    const double theta = (double)pos[r] * f;
    const float m = use_alt ? mscale_alt : mscale;
    cs[r * rope_dim + 2 * i] = (float)cos(theta) * m; /* exact when m is 1 */
    cs[r * rope_dim + 2 * i + 1] = (float)sin(theta) * m;
}

static int rope_table(kn_cuda *c, const int32_t *d_pos, int n_rows, int rope_dim, float freq_base,
                      const double *d_inv, float mscale, const int32_t *d_alt, const double *d_inv_alt,
                      float mscale_alt, float *d_cs)
{
    if (n_rows < 0 || rope_dim < 0)
        return KN_CUDA_EINVAL(c, "rope_table: bad shape");
    rope_dim &= ~1;
    const size_t n = (size_t)n_rows * (rope_dim / 2);
    if (n == 0)
        return 0;
    kn_cuda__launch(c, kn_cuda__blocks(n, 128), 128, 0, rope_table_kernel, d_pos, n_rows, rope_dim, freq_base, d_inv,
                    mscale, d_alt, d_inv_alt, mscale_alt, d_cs);
    KN_CUDA_LAUNCHED(c);
    return 0;
}

extern "C" int kn_cuda_rope_table(kn_cuda *c, const int32_t *d_pos, int n_rows, int rope_dim, float freq_base,
                                  float *d_cs)
{
    return rope_table(c, d_pos, n_rows, rope_dim, freq_base, NULL, 1.0f, NULL, NULL, 1.0f, d_cs);
}

extern "C" int kn_cuda_rope_table_freqs(kn_cuda *c, const int32_t *d_pos, const int32_t *d_alt, int n_rows,
                                        int rope_dim, const double *d_inv, float mscale, const double *d_inv_alt,
                                        float mscale_alt, float *d_cs)
{
    if (!d_inv)
        return KN_CUDA_EINVAL(c, "rope_table_freqs: no frequencies");
    return rope_table(c, d_pos, n_rows, rope_dim, 0.0f, d_inv, mscale, d_alt, d_inv_alt, mscale_alt, d_cs);
}

static int rope_clamp_dim(int rope_dim, int head_dim)
{
    if (rope_dim > head_dim)
        rope_dim = head_dim;
    return rope_dim < 0 ? 0 : rope_dim & ~1;
}

/* The rotation of one pair, with the roundings spelled out so that every
 * kernel that rotates gets the same bits (contraction into FMA is otherwise
 * the compiler's choice). */
__device__ __forceinline__ float2 rope_rotate(float x0, float x1, float c, float s)
{
    return make_float2(__fmaf_rn(x0, c, -__fmul_rn(x1, s)), __fmaf_rn(x0, s, __fmul_rn(x1, c)));
}

/* Rotates pair i of one head in place; csr is the position's table row. */
__device__ __forceinline__ void rope_pair(float *xh, const float *__restrict__ csr, int i, int half,
                                          bool neox)
{
    const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    const float2 rot = rope_rotate(xh[a], xh[b], csr[2 * i], csr[2 * i + 1]);
    xh[a] = rot.x;
    xh[b] = rot.y;
}

/* One thread per rotated pair; the table row was built for the table's
 * rope_dim, which the caller passes again here. */
__global__ void rope_kernel(float *x, const float *__restrict__ cs, int n_rows, int n_heads, int head_dim,
                            int rope_dim, bool neox)
{
    kn_pdl_begin();
    const int half = rope_dim / 2;
    const size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= (size_t)n_rows * n_heads * half)
        return;
    const int i = (int)(k % half);
    const size_t rh = k / half; /* row * n_heads + head */
    rope_pair(x + rh * head_dim, cs + rh / n_heads * rope_dim, i, half, neox);
}

extern "C" int kn_cuda_rope(kn_cuda *c, float *d_x, const float *d_cs, int n_rows, int n_heads, int head_dim,
                            int rope_dim, bool neox)
{
    if (n_rows < 0 || n_heads <= 0 || head_dim <= 0)
        return KN_CUDA_EINVAL(c, "rope: bad shape");
    const int table_dim = rope_dim < 0 ? 0 : rope_dim & ~1;
    rope_dim = rope_clamp_dim(rope_dim, head_dim);
    if (rope_dim != table_dim)
        return KN_CUDA_EINVAL(c, "rope: rope_dim is larger than the head");
    const size_t n = (size_t)n_rows * n_heads * (rope_dim / 2);
    if (n == 0)
        return 0;
    kn_cuda__launch(c, kn_cuda__blocks(n, 256), 256, 0, rope_kernel, d_x, d_cs, n_rows, n_heads, head_dim,
                    rope_dim, neox);
    KN_CUDA_LAUNCHED(c);
    return 0;
}

/* ---- RoPE of Q and K and the store of new K/V rows into the F16 cache ----
 * Threads [0, n_q_pairs) rotate Q pairs in place as rope_kernel does; the
 * rest take one element of the new K and V rows each: the K element is
 * rotated from its pair (read, not written: d_k stays as it was) and both
 * are stored. kn_cuda_kv_store is the same kernel with no rotation. */
__global__ void rope_kv_kernel(kn_cuda_rope_kv a, size_t n_q_pairs, size_t total)
{
    kn_pdl_begin();
    const size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= total)
        return;
    const int hd = a.head_dim, half = a.rope_dim / 2;
    if (k < n_q_pairs) {
        const int i = (int)(k % half);
        const size_t rh = k / half; /* row * n_head + head */
        rope_pair(a.d_q + rh * hd, a.d_cs + rh / a.n_head * a.rope_dim, i, half, a.neox);
        return;
    }
    const size_t e = k - n_q_pairs;
    const int kv_dim = a.n_kv_head * hd;
    const size_t t = e / kv_dim;
    const int j = (int)(e % kv_dim), d = j % hd;
    const float *kh = a.d_k + t * kv_dim + (j - d);
    float kval = kh[d];
    if (d < a.rope_dim) {
        const int i = a.neox ? (d < half ? d : d - half) : d / 2;
        const int ia = a.neox ? i : 2 * i, ib = a.neox ? i + half : 2 * i + 1;
        const float c = a.d_cs[t * a.rope_dim + 2 * i], s = a.d_cs[t * a.rope_dim + 2 * i + 1];
        const float2 rot = rope_rotate(kh[ia], kh[ib], c, s);
        kval = d == ia ? rot.x : rot.y;
    }
    const int slot = a.d_slots[t];
    __half *blk = (__half *)a.d_pool + (size_t)(slot / a.block_tokens) * a.block_elems +
                  (size_t)(slot % a.block_tokens) * kv_dim + j;
    blk[a.k_off] = __float2half_rn(kval);
    blk[a.v_off] = __float2half_rn(a.d_v[e]);
}

extern "C" int kn_cuda_rope_kv_store(kn_cuda *c, const kn_cuda_rope_kv *a)
{
    if (a->n_tokens < 0 || a->n_head <= 0 || a->n_kv_head <= 0 || a->head_dim <= 0 || a->block_tokens <= 0)
        return KN_CUDA_EINVAL(c, "rope_kv_store: bad shape");
    const int table_dim = a->rope_dim < 0 ? 0 : a->rope_dim & ~1;
    if (rope_clamp_dim(a->rope_dim, a->head_dim) != table_dim)
        return KN_CUDA_EINVAL(c, "rope_kv_store: rope_dim is larger than the head");
    kn_cuda_rope_kv k = *a;
    k.rope_dim = table_dim;
    const size_t n_q_pairs = (size_t)a->n_tokens * a->n_head * (table_dim / 2);
    const size_t total = n_q_pairs + (size_t)a->n_tokens * a->n_kv_head * a->head_dim;
    if (total == 0)
        return 0;
    kn_cuda__launch(c, kn_cuda__blocks(total, 256), 256, 0, rope_kv_kernel, k, n_q_pairs, total);
    KN_CUDA_LAUNCHED(c);
    return 0;
}

extern "C" int kn_cuda_kv_store(kn_cuda *c, const float *d_k, const float *d_v, int n_tokens, int kv_dim,
                                const int32_t *d_slots, uint16_t *d_pool, size_t block_elems, size_t k_off,
                                size_t v_off, int block_tokens)
{
    if (kv_dim <= 0)
        return KN_CUDA_EINVAL(c, "kv_store: bad shape");
    kn_cuda_rope_kv a = {}; /* no Q, no rotation: K and V rows of one "head" of kv_dim */
    a.d_k = d_k;
    a.d_v = d_v;
    a.n_tokens = n_tokens;
    a.n_head = a.n_kv_head = 1;
    a.head_dim = kv_dim;
    a.d_slots = d_slots;
    a.d_pool = d_pool;
    a.block_elems = block_elems;
    a.k_off = k_off;
    a.v_off = v_off;
    a.block_tokens = block_tokens;
    return kn_cuda_rope_kv_store(c, &a);
}
