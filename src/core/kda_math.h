/* Internal: the scalar math of KDA that the CPU kernels, the double reference and the CUDA
 * kernels share: the gate and its gradient, the l2norm of q and k, the floor of the log
 * decay. Each formula is written once here, so the device evaluates the very operations the
 * CPU does (the vector gate of kda_simd.h follows the same order of operations). */
#ifndef LS_CORE_KDA_MATH_H
#define LS_CORE_KDA_MATH_H

#include <math.h>

#include "core/activation.h"

/* Added to |x|^2 before the root of the q/k l2norm, x / sqrt(|x|^2 + eps), unless the problem
 * sets its own (l2norm_eps, as the float32 value it holds). */
#define LS_KDA_L2NORM_EPS 1e-6

static inline LS_HOST_DEVICE double ls_kda_l2norm_eps(float option)
{
    return option > 0.0f ? (double)option : LS_KDA_L2NORM_EPS;
}

/* The log decay every chunked computation sees: g raised to this floor (NaN stays NaN).
 * e^-110 is an exact float32 zero in every product with factors <= 1, so nothing below it
 * changes a result, and the floor keeps the chunk's factored products away from 0 * inf. */
#define LS_KDA_LOG_DECAY_FLOOR (-110.0f)

/* 1 / sqrt(|x|^2 + eps) of the l2norm, the root always taken in double (sumsq: |x|^2). */
static inline LS_HOST_DEVICE double ls_kda_l2norm_rsqrt(double sumsq, double eps)
{
    return 1.0 / sqrt(sumsq + eps);
}

/* The factor a q or k row is multiplied by with the l2norm: scale / sqrt(|x|^2 + eps),
 * rounded to float before the scale as every kernel does. */
static inline LS_HOST_DEVICE float ls_kda_l2norm_factorf(float sumsq, float scale, double eps)
{
    return (float)ls_kda_l2norm_rsqrt((double)sumsq, eps) * scale;
}

/* The decay after the in-kernel gate: -exp(A_log) softplus(raw + bias), or, with a lower
 * bound, lower_bound sigmoid(exp(A_log) (raw + bias)). */
static inline LS_HOST_DEVICE float ls_kda_gatef(float raw, float bias, float a_log,
                                                float lower_bound)
{
    const float x = raw + bias;
    if (lower_bound == 0.0f) return -expf(a_log) * ls_softplusf(x);
    return lower_bound * ls_sigmoidf(expf(a_log) * x);
}

/* dg/draw (== dg/ddt_bias) and dg/dA_log of ls_kda_gatef. */
static inline LS_HOST_DEVICE void ls_kda_gate_gradf(float raw, float bias, float a_log,
                                                    float lower_bound, float *d_raw, float *d_alog)
{
    const float x = raw + bias, e = expf(a_log);
    if (lower_bound == 0.0f) {
        *d_raw = -e * ls_softplus_gradf(x);
        *d_alog = -e * ls_softplusf(x);
    } else {
        const float s = ls_sigmoidf(e * x), ds = lower_bound * s * (1.0f - s);
        *d_raw = ds * e;
        *d_alog = ds * (e * x);
    }
}

/* Double-precision twins for the reference. */
static inline double ls_kda_gate(double raw, double bias, double a_log, double lower_bound)
{
    if (lower_bound == 0.0) return -exp(a_log) * ls_softplus(raw + bias);
    return lower_bound * ls_sigmoid(exp(a_log) * (raw + bias));
}

static inline void ls_kda_gate_grad(double raw, double bias, double a_log, double lower_bound,
                                    double *d_raw, double *d_alog)
{
    const double x = raw + bias, e = exp(a_log);
    if (lower_bound == 0.0) {
        *d_raw = -e * ls_softplus_grad(x);
        *d_alog = -e * ls_softplus(x);
    } else {
        const double s = ls_sigmoid(e * x), ds = lower_bound * s * (1.0 - s);
        *d_raw = ds * e;
        *d_alog = ds * e * x;
    }
}

#endif
