/* kernels/cuda: kn_cuda_matmul — the choice between the decode matvec and
 * the prefill GEMM, and the GEMM itself. Many rows make the product
 * compute-bound: quantized weights are dequantized to F16 a tile of rows at
 * a time (a bandwidth-bound pass that costs a fraction of the GEMM at
 * prefill sizes) and multiplied with cublasGemmEx on tensor cores, F16
 * inputs with F32 accumulation and output. */
#include "kernels/cuda/kn_cuda_blocks.cuh"
#include "kernels/cuda/kn_cuda_internal.cuh"

int kn_cuda__mmv(kn_cuda *c, const kn_cuda_weight *w, const float *d_x, const void *d_xq, int n_rows,
                 float *d_y, bool add);

/* Halves of dequantized weights per tile: bounds the scratch at 32 MiB
 * while keeping each GEMM large enough to fill the device. */
#define DQ_TILE_ELEMS ((size_t)1 << 24)

static int tile_rows(const kn_cuda_weight *w)
{
    size_t rows = DQ_TILE_ELEMS / (size_t)w->n_in;
    rows = rows >= 128 ? rows / 128 * 128 : 128; /* whole GEMM tiles */
    return rows > (size_t)w->n_out ? w->n_out : (int)rows;
}

__global__ void f32_to_f16_kernel(const float *__restrict__ x, __half *__restrict__ y, size_t n)
{
    kn_pdl_begin();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = __float2half_rn(x[i]);
}

/* 16 quants (half a block) per thread, 128-bit load, 2 x 128-bit stores. */
__global__ void dequant_q8_0_f16_kernel(const int8_t *__restrict__ q, const __half *__restrict__ d,
                                        __half *__restrict__ out, size_t n_chunks)
{
    kn_pdl_begin();
    const size_t ch = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= n_chunks)
        return;
    const int4 raw = __ldcs((const int4 *)q + ch);
    const int8_t *b = (const int8_t *)&raw;
    const float s = __half2float(d[ch / 2]);
    __align__(16) __half h[16];
#pragma unroll
    for (int k = 0; k < 16; k++)
        h[k] = __float2half_rn((float)b[k] * s);
    int4 *o = (int4 *)(out + ch * 16);
    o[0] = *(const int4 *)&h[0];
    o[1] = *(const int4 *)&h[8];
}

/* One block (16 bytes of nibbles) per thread -> 32 halves. */
__global__ void dequant_q4_0_f16_kernel(const uint8_t *__restrict__ q, const __half *__restrict__ d,
                                        __half *__restrict__ out, size_t n_blocks)
{
    kn_pdl_begin();
    const size_t blk = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (blk >= n_blocks)
        return;
    const int4 raw = __ldcs((const int4 *)q + blk);
    const uint8_t *b = (const uint8_t *)&raw;
    const float s = __half2float(d[blk]);
    __align__(16) __half h[32];
#pragma unroll
    for (int k = 0; k < 16; k++) {
        h[k] = __float2half_rn((float)((b[k] & 0x0f) - 8) * s);
        h[k + 16] = __float2half_rn((float)((b[k] >> 4) - 8) * s);
    }
    int4 *o = (int4 *)(out + blk * 32);
#pragma unroll
    for (int k = 0; k < 4; k++)
        o[k] = *(const int4 *)&h[8 * k];
}

/* One unit (32 elements) of a type kept as GGUF blocks per thread -> 32
 * halves, four 128-bit stores. */
__global__ void dequant_blocks_f16_kernel(kn_type t, const uint8_t *__restrict__ w, size_t row_bytes,
                                          int units_per_row, __half *__restrict__ out, size_t n_units)
{
    kn_pdl_begin();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_units)
        return;
    float v[32];
    kn_dq_unit(t, w + i / units_per_row * row_bytes, (int)(i % units_per_row), v);
    __align__(16) __half h[32];
#pragma unroll
    for (int k = 0; k < 32; k++)
        h[k] = __float2half_rn(v[k]);
    int4 *o = (int4 *)(out + i * 32);
#pragma unroll
    for (int k = 0; k < 4; k++)
        o[k] = *(const int4 *)&h[8 * k];
}

static int dequant_tile(kn_cuda *c, const kn_cuda_weight *w, int o0, int rows, __half *out)
{
    const size_t nb = (size_t)w->n_in / 32;
    if (kn_cuda_raw_layout(w->type)) {
        const size_t row_bytes = kn_row_bytes(w->type, w->n_in), n_units = (size_t)rows * nb;
        kn_cuda__launch(c, kn_cuda__blocks(n_units, 256), 256, 0, dequant_blocks_f16_kernel, w->type,
                        (const uint8_t *)w->d_q + (size_t)o0 * row_bytes, row_bytes, (int)nb, out, n_units);
        KN_CUDA_LAUNCHED(c);
        return 0;
    }
    const __half *scl = (const __half *)w->d_scl + (size_t)o0 * nb;
    if (w->type == KN_TYPE_Q8_0) {
        const size_t n_chunks = (size_t)rows * w->n_in / 16;
        kn_cuda__launch(c, kn_cuda__blocks(n_chunks, 256), 256, 0, dequant_q8_0_f16_kernel,
                        (const int8_t *)w->d_q + (size_t)o0 * w->n_in, scl, out, n_chunks);
    } else {
        const size_t n_blocks = (size_t)rows * nb;
        kn_cuda__launch(c, kn_cuda__blocks(n_blocks, 256), 256, 0, dequant_q4_0_f16_kernel,
                        (const uint8_t *)w->d_q + (size_t)o0 * (w->n_in / 2), scl, out, n_blocks);
    }
    KN_CUDA_LAUNCHED(c);
    return 0;
}

/* Row-major y[n_rows][n_out] = x[n_rows][n_in] . W[n_out][n_in]^T is, in
 * cuBLAS's column-major terms, Y (n_out x n_rows) = W^T . X with W read
 * transposed (lda = n_in) and X as is (ldb = n_in). */
static int gemm(kn_cuda *c, const void *a, cudaDataType at, int m, int n, int k, const void *b,
                cudaDataType bt, float *y, int ldc, bool add)
{
    const float alpha = 1.0f, beta = add ? 1.0f : 0.0f;
    KN_CUBLAS_CHECK(c, cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, a, at, k, b, bt, k,
                                    &beta, y, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return 0;
}

static bool quantized(kn_type t)
{
    return t == KN_TYPE_Q8_0 || t == KN_TYPE_Q4_0;
}

/* Weights the GEMM dequantizes to F16 a tile at a time. */
static bool tiled(kn_type t)
{
    return quantized(t) || kn_cuda_raw_layout(t);
}

extern "C" int kn_cuda_matmul_reserve(kn_cuda *c, kn_type type, int n_out, int n_in, int n_rows)
{
    if (n_rows <= 0)
        return 0;
    if (n_rows <= KN_CUDA_MMV_MAX_ROWS)
        return quantized(type) ? kn_cuda__scratch(c, &c->xq, &c->xq_cap, kn_cuda_q8_bytes(n_rows, n_in)) : 0;
    if (type == KN_TYPE_F32)
        return 0;
    int rc = kn_cuda__scratch(c, &c->x16, &c->x16_cap, (size_t)n_rows * n_in * sizeof(__half));
    if (rc || !tiled(type))
        return rc;
    kn_cuda_weight shape = {type, n_out, n_in, NULL, NULL, 0};
    return kn_cuda__scratch(c, &c->w16, &c->w16_cap, (size_t)tile_rows(&shape) * n_in * sizeof(__half));
}

extern "C" int kn_cuda_matmul(kn_cuda *c, const kn_cuda_weight *w, const float *d_x, const void *d_xq,
                              int n_rows, float *d_y, bool add)
{
    if (n_rows < 0 || !w->d_q)
        return KN_CUDA_EINVAL(c, "matmul: no weights or a negative row count");
    if (n_rows == 0)
        return 0;
    int rc = kn_cuda_matmul_reserve(c, w->type, w->n_out, w->n_in, n_rows);
    if (rc)
        return rc;
    if (n_rows <= KN_CUDA_MMV_MAX_ROWS) {
        if (quantized(w->type) && !d_xq) {
            if ((rc = kn_cuda_quantize_q8(c, d_x, n_rows, w->n_in, c->xq)))
                return rc;
            d_xq = c->xq;
        }
        return kn_cuda__mmv(c, w, d_x, d_xq, n_rows, d_y, add);
    }
    if (w->type == KN_TYPE_F32)
        return gemm(c, w->d_q, CUDA_R_32F, w->n_out, n_rows, w->n_in, d_x, CUDA_R_32F, d_y, w->n_out, add);

    const size_t nx = (size_t)n_rows * w->n_in;
    __half *x16 = (__half *)c->x16;
    kn_cuda__launch(c, kn_cuda__blocks(nx, 256), 256, 0, f32_to_f16_kernel, d_x, x16, nx);
    KN_CUDA_LAUNCHED(c);
    if (w->type == KN_TYPE_F16)
        return gemm(c, w->d_q, CUDA_R_16F, w->n_out, n_rows, w->n_in, x16, CUDA_R_16F, d_y, w->n_out, add);

    const int step = tile_rows(w);
    for (int o0 = 0; o0 < w->n_out; o0 += step) {
        const int rows = w->n_out - o0 < step ? w->n_out - o0 : step;
        if ((rc = dequant_tile(c, w, o0, rows, (__half *)c->w16)))
            return rc;
        if ((rc = gemm(c, c->w16, CUDA_R_16F, rows, n_rows, w->n_in, x16, CUDA_R_16F, d_y + o0, w->n_out,
                       add)))
            return rc;
    }
    return 0;
}
