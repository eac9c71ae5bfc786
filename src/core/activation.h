/* Internal: scalar activations and softplus, shared by the gate, SSM1 and conv so that an
 * in-kernel option and the standalone op compute bit-identical values. */
#ifndef LS_CORE_ACTIVATION_H
#define LS_CORE_ACTIVATION_H

#include <math.h>

#include "linseq.h"

/* The float functions are compiled for CUDA kernels too (nvcc defines __CUDACC__), so the
 * device evaluates the very formulas the CPU does. */
#ifdef __CUDACC__
#define LS_HOST_DEVICE __host__ __device__
#else
#define LS_HOST_DEVICE
#endif

/* softplus(x) is x itself above this (its slope exactly 1), as torch.nn.functional.softplus
 * and mamba: log1p(exp(x)) rounds to x there in float32 anyway, and exp would overflow far
 * above. Every softplus, scalar or vector, CPU or CUDA, uses it. */
#define LS_SOFTPLUS_THRESHOLD 20.0f

static inline LS_HOST_DEVICE float ls_sigmoidf(float z)
{
    /* Two branches so that exp never overflows. */
    if (z >= 0.0f) return 1.0f / (1.0f + expf(-z));
    float e = expf(z);
    return e / (1.0f + e);
}

/* log(1 + e^x), returning x above LS_SOFTPLUS_THRESHOLD. */
static inline LS_HOST_DEVICE float ls_softplusf(float x)
{
    return x > LS_SOFTPLUS_THRESHOLD ? x : log1pf(expf(x));
}

static inline LS_HOST_DEVICE float ls_gelu_tanhf(float z)
{
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * z * (1.0f + tanhf(k * (z + 0.044715f * z * z * z)));
}

/* act must be resolved (not LINSEQ_ACT_DEFAULT). */
static inline LS_HOST_DEVICE float ls_activate(linseq_activation act, float z)
{
    switch (act) {
    case LINSEQ_ACT_SILU: return z * ls_sigmoidf(z);
    case LINSEQ_ACT_SIGMOID: return ls_sigmoidf(z);
    case LINSEQ_ACT_GELU_TANH: return ls_gelu_tanhf(z);
    case LINSEQ_ACT_RELU: return z > 0.0f ? z : (z == z ? 0.0f : z);
    default: return z;
    }
}

/* d softplus / dx, matching the threshold of ls_softplusf (slope exactly 1 above it). */
static inline LS_HOST_DEVICE float ls_softplus_gradf(float x)
{
    return x > LS_SOFTPLUS_THRESHOLD ? 1.0f : ls_sigmoidf(x);
}

/* f'(z) of ls_activate (act resolved). relu'(0) = 0, as torch. */
static inline LS_HOST_DEVICE float ls_activate_gradf(linseq_activation act, float z)
{
    switch (act) {
    case LINSEQ_ACT_SILU: {
        const float s = ls_sigmoidf(z);
        return s * (1.0f + z * (1.0f - s));
    }
    case LINSEQ_ACT_SIGMOID: {
        const float s = ls_sigmoidf(z);
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

/* Double-precision twins for the scalar references. */
static inline double ls_sigmoid(double z)
{
    if (z >= 0.0) return 1.0 / (1.0 + exp(-z));
    double e = exp(z);
    return e / (1.0 + e);
}
static inline double ls_softplus(double x)
{
    return x > (double)LS_SOFTPLUS_THRESHOLD ? x : log1p(exp(x));
}
static inline double ls_activate_ref(linseq_activation act, double z)
{
    switch (act) {
    case LINSEQ_ACT_SILU: return z * ls_sigmoid(z);
    case LINSEQ_ACT_SIGMOID: return ls_sigmoid(z);
    case LINSEQ_ACT_GELU_TANH:
        return 0.5 * z * (1.0 + tanh(0.7978845608028654 * (z + 0.044715 * z * z * z)));
    case LINSEQ_ACT_RELU: return z > 0.0 ? z : (z == z ? 0.0 : z);
    default: return z;
    }
}

static inline double ls_softplus_grad(double x)
{
    return x > (double)LS_SOFTPLUS_THRESHOLD ? 1.0 : ls_sigmoid(x);
}

static inline double ls_activate_grad_ref(linseq_activation act, double z)
{
    switch (act) {
    case LINSEQ_ACT_SILU: {
        const double s = ls_sigmoid(z);
        return s * (1.0 + z * (1.0 - s));
    }
    case LINSEQ_ACT_SIGMOID: {
        const double s = ls_sigmoid(z);
        return s * (1.0 - s);
    }
    case LINSEQ_ACT_GELU_TANH: {
        const double k = 0.7978845608028654;
        const double th = tanh(k * (z + 0.044715 * z * z * z));
        return 0.5 * (1.0 + th) + 0.5 * z * (1.0 - th * th) * k * (1.0 + 3.0 * 0.044715 * z * z);
    }
    case LINSEQ_ACT_RELU: return z > 0.0 ? 1.0 : (z == z ? 0.0 : z);
    default: return 1.0;
    }
}

static inline bool ls_activation_valid(linseq_activation act)
{
    return (unsigned)act <= (unsigned)LINSEQ_ACT_RELU;
}

#endif
