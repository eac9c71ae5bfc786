// Internal: what the CUDA SSM1 scan and causal conv1d share: the activations and softplus of
// core/activation.h on the device (the same formulas, in float), sequence ranges, and small
// launch helpers.
#ifndef LS_CUDA_SSM_COMMON_CUH
#define LS_CUDA_SSM_COMMON_CUH

#include "cuda/cuda_common.cuh"

// Two branches so that exp never overflows (as ls_sigmoidf).
__device__ __forceinline__ float ls_dev_sigmoid(float z)
{
    if (z >= 0.0f) return 1.0f / (1.0f + expf(-z));
    const float e = expf(z);
    return e / (1.0f + e);
}

// log(1 + e^x), x above 20 (torch's and mamba's threshold).
__device__ __forceinline__ float ls_dev_softplus(float x)
{
    return x > 20.0f ? x : log1pf(expf(x));
}

__device__ __forceinline__ float ls_dev_softplus_grad(float x)
{
    return x > 20.0f ? 1.0f : ls_dev_sigmoid(x);
}

// act resolved (never LINSEQ_ACT_DEFAULT); the argument is uniform across a launch.
__device__ __forceinline__ float ls_dev_activate(int act, float z)
{
    switch (act) {
    case LINSEQ_ACT_SILU: return z * ls_dev_sigmoid(z);
    case LINSEQ_ACT_SIGMOID: return ls_dev_sigmoid(z);
    case LINSEQ_ACT_GELU_TANH: {
        const float k = 0.7978845608028654f;
        return 0.5f * z * (1.0f + tanhf(k * (z + 0.044715f * z * z * z)));
    }
    case LINSEQ_ACT_RELU: return z > 0.0f ? z : (z == z ? 0.0f : z);
    default: return z;
    }
}

// f'(z) of ls_dev_activate; relu'(0) = 0 as torch.
__device__ __forceinline__ float ls_dev_activate_grad(int act, float z)
{
    switch (act) {
    case LINSEQ_ACT_SILU: {
        const float s = ls_dev_sigmoid(z);
        return s * (1.0f + z * (1.0f - s));
    }
    case LINSEQ_ACT_SIGMOID: {
        const float s = ls_dev_sigmoid(z);
        return s * (1.0f - s);
    }
    case LINSEQ_ACT_GELU_TANH: {
        const float k = 0.7978845608028654f;
        const float th = tanhf(k * (z + 0.044715f * z * z * z));
        return 0.5f * (1.0f + th) +
               0.5f * z * (1.0f - th * th) * k * (1.0f + 3.0f * 0.044715f * z * z);
    }
    case LINSEQ_ACT_RELU: return z > 0.0f ? 1.0f : (z == z ? 0.0f : z);
    default: return 1.0f;
    }
}

// 2^x with the hardware approximation (relative error about 2^-22): the SSM decay
// exp(A dt) is evaluated as 2^((A log2 e) dt), one multiply and one MUFU op per state.
__device__ __forceinline__ float ls_dev_exp2(float x)
{
    float r;
    asm("ex2.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

// Tokens [*start, *start + *len) of sequence s in the flattened [B*T] time axis; cu is the
// device copy of cu_seqlens or NULL.
__device__ __forceinline__ void ls_dev_seq_range(const int64_t *cu, int64_t T, int64_t s,
                                                 int64_t *start, int64_t *len)
{
    if (cu) {
        *start = cu[s];
        *len = cu[s + 1] - cu[s];
    } else {
        *start = s * T;
        *len = T;
    }
}

#endif
