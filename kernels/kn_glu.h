/* The FFN gates the CPU (kernels/kn_ctx.c) and the CUDA kernels
 * (kernels/cuda/kn_cuda_ops.cu) both compute, one element at a time, from
 * this one definition: plain C that nvcc compiles for the device too. */
#ifndef KN_GLU_H
#define KN_GLU_H

#include <math.h>

#ifdef __CUDACC__
#define KN_GLU_HD __host__ __device__
#else
#define KN_GLU_HD
#endif

/* gelu(g) * u, tanh approximation (Gemma) */
static inline KN_GLU_HD float kn_gelu_mul_1(float g, float u)
{
    const float c = 0.79788456080286535588f; /* sqrt(2 / pi) */
    return 0.5f * g * (1.0f + tanhf(c * g * (1.0f + 0.044715f * g * g))) * u;
}

/* gpt-oss's clamped SwiGLU: the gate clamped above, up on both sides */
static inline KN_GLU_HD float kn_swiglu_oai_1(float g, float u, float alpha, float limit)
{
    const float x = g < limit ? g : limit;
    const float y = u < -limit ? -limit : u > limit ? limit : u;
    return x / (1.0f + expf(-alpha * x)) * (y + 1.0f);
}

#endif
