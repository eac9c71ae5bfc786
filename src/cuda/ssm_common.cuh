// Internal: what the CUDA SSM1 scan and causal conv1d share: the activations and softplus of
// core/activation.h on the device (the same formulas, in float), sequence ranges, and small
// launch helpers.
#ifndef LS_CUDA_SSM_COMMON_CUH
#define LS_CUDA_SSM_COMMON_CUH

#include <string.h>

#include "core/activation.h"
#include "cuda/cuda_common.cuh"

// The CPU's formulas (core/activation.h), under the names the SSM kernels use.
__device__ __forceinline__ float ls_dev_softplus(float x) { return ls_softplusf(x); }
__device__ __forceinline__ float ls_dev_softplus_grad(float x) { return ls_softplus_gradf(x); }

// act resolved (never LINSEQ_ACT_DEFAULT); the argument is uniform across a launch.
__device__ __forceinline__ float ls_dev_activate(int act, float z)
{
    return ls_activate((linseq_activation)act, z);
}

// f'(z) of ls_dev_activate; relu'(0) = 0 as torch.
__device__ __forceinline__ float ls_dev_activate_grad(int act, float z)
{
    return ls_activate_gradf((linseq_activation)act, z);
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

// VEC (1 or 4) consecutive per-token elements from index i, widened to float: one 16-byte
// (float32) or 8-byte (bf16) access for VEC = 4, so i must be a multiple of 4 and the
// pointer aligned to 4 elements.
template <typename E, int VEC>
__device__ __forceinline__ void ls_ld_vec(const E *p, int64_t i, float *o)
{
    if constexpr (VEC == 1) {
        o[0] = ls_ld(p, i);
    } else if constexpr (sizeof(E) == 4) {
        const float4 v = __ldg(reinterpret_cast<const float4 *>(p + i));
        o[0] = v.x;
        o[1] = v.y;
        o[2] = v.z;
        o[3] = v.w;
    } else {
        const uint2 v = __ldg(reinterpret_cast<const uint2 *>(p + i));
        __nv_bfloat162 lo, hi;
        memcpy(&lo, &v.x, 4);
        memcpy(&hi, &v.y, 4);
        o[0] = __low2float(lo);
        o[1] = __high2float(lo);
        o[2] = __low2float(hi);
        o[3] = __high2float(hi);
    }
}

// The store twin of ls_ld_vec (round to nearest even for bf16).
template <typename E, int VEC>
__device__ __forceinline__ void ls_st_vec(E *p, int64_t i, const float *v)
{
    if constexpr (VEC == 1) {
        ls_st(p, i, v[0]);
    } else if constexpr (sizeof(E) == 4) {
        *reinterpret_cast<float4 *>(p + i) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
        const __nv_bfloat162 lo = __floats2bfloat162_rn(v[0], v[1]);
        const __nv_bfloat162 hi = __floats2bfloat162_rn(v[2], v[3]);
        uint2 u;
        memcpy(&u.x, &lo, 4);
        memcpy(&u.y, &hi, 4);
        *reinterpret_cast<uint2 *>(p + i) = u;
    }
}

#endif
