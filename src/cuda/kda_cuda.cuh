// Internal: what the CUDA KDA kernels share (kda_forward.cu, kda_decode.cu, kda_gate.cu, and
// the backward if it wants them): the in-kernel options' scalar functions with the CPU path's
// formulas (core/activation.h, kda/kda_simd.h), and the intra-chunk builder of the chunked
// forward (its workspace layout and its launcher, defined in kda_forward.cu).
//
// The signatures here are stable: the backward may include this header.
#ifndef LS_KDA_CUDA_CUH
#define LS_KDA_CUDA_CUH

#include "cuda/cuda_common.cuh"

namespace ls_kda {

// Per-token log decays below this are raised to it before any chunk computation (the CPU's
// KDA_LOG_DECAY_FLOOR): e^-110 is an exact float32 zero in every product with factors <= 1.
constexpr float LOG_DECAY_FLOOR = -110.0f;

// The same branches as ls_sigmoidf / ls_softplusf / ls_softplus_gradf: exp never overflows,
// softplus is x above 20 and its slope exactly 1 there.
__device__ __forceinline__ float sigmoid(float z)
{
    if (z >= 0.0f) return 1.0f / (1.0f + expf(-z));
    const float e = expf(z);
    return e / (1.0f + e);
}
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
__device__ __forceinline__ float softplus_grad(float x) { return x > 20.0f ? 1.0f : sigmoid(x); }

// The decay after the gate: -exp(A_log) softplus(raw + bias), or
// lower_bound sigmoid(exp(A_log) (raw + bias)).
__device__ __forceinline__ float gate(float raw, float bias, float a_log, float lower_bound)
{
    const float x = raw + bias;
    if (lower_bound == 0.0f) return -expf(a_log) * softplus(x);
    return lower_bound * sigmoid(expf(a_log) * x);
}

// dg/draw (== dg/ddt_bias) and dg/dA_log of gate().
__device__ __forceinline__ void gate_grad(float raw, float bias, float a_log, float lower_bound,
                                          float *d_raw, float *d_alog)
{
    const float x = raw + bias, e = expf(a_log);
    if (lower_bound == 0.0f) {
        *d_raw = -e * softplus_grad(x);
        *d_alog = -e * softplus(x);
    } else {
        const float s = sigmoid(e * x), ds = lower_bound * s * (1.0f - s);
        *d_raw = ds * e;
        *d_alog = ds * (e * x);
    }
}

// The factor a q or k row is multiplied by: scale / sqrt(|x|^2 + 1e-6) with the l2 norm (the
// root taken in double, as the CPU's kda_norm_scale), scale without.
__device__ __forceinline__ float norm_factor(float sumsq, bool l2norm, float scale)
{
    if (!l2norm) return scale;
    return (float)(1.0 / sqrt((double)sumsq + 1e-6)) * scale;
}

// The log decay of one (token, value head, channel) as the recurrence sees it: g itself, or
// the gate of the raw input (decay NONE: 0). gK = K (per channel) or 1 (per head); i < gK.
template <typename Elem>
__device__ __forceinline__ float log_decay(const linseq_kda_problem &p, const Elem *g,
                                           int64_t tok, int64_t HV, int64_t hv, int64_t gK,
                                           int64_t i)
{
    if (p.decay == LINSEQ_DECAY_NONE) return 0.0f;
    const float raw = ls_ld(g, (tok * HV + hv) * gK + i);
    if (!p.gate_in_kernel) return raw;
    const float bias = p.dt_bias ? p.dt_bias[hv * gK + i] : 0.0f;
    return gate(raw, bias, p.A_log ? p.A_log[hv] : 0.0f, p.lower_bound);
}

// Butterfly sum over the 32 lanes: every lane gets the same bits, in a fixed order.
__device__ __forceinline__ float warp_sum(float x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// ---------------------------------------------------------------------------------------
// The intra-chunk builder of the chunked forward (one CTA per (chunk, value head)).
//
// For chunk c of the flattened chunk list (sequence by sequence, ceil(len/C) chunks each)
// and value head hv, item = c * HV + hv owns these float32 blocks (Kp = K rounded up to 4,
// rows r < Lc written, rows past the chunk's end undefined):
//     Aqk  [C][C]   sum_d qs_r k_c e^{G_r - G_c}           c <= r (diagonal included)
//     Tinv [C][C]   (I + diag(beta) Akk)^{-1}, unit lower   c <= r
//     qg   [C][Kp]  qs_r e^{G_r}          (qs = scale * l2norm(q), ks = l2norm(k))
//     kbg  [C][Kp]  beta_r ks_r e^{G_r}
//     kd   [C][Kp]  ks_r e^{G_last - G_r}
//     beta [C]      beta after the optional sigmoid
//     dlast[Kp]     e^{G_last}
// with G_r the in-chunk cumulative log decay (per channel, or per head broadcast over K) of
// the floored decays. Every factor is a product of per-token decays e^{g} <= 1 (no exponent
// of a difference of sums), so g = -inf .. 0 is exact. The chunk then is
//     vnew = Tinv (diag(beta) V - kbg S0),  O = qg S0 + Aqk vnew,
//     S_C  = diag(dlast) S0 + kd^T vnew.
// chunks: int64 [n_chunks][2] = {first token (flattened), length}.
struct chunk_ws {
    int C;           // chunk size
    int64_t Kp;      // K rounded up to a multiple of 4
    int64_t n_chunks;
    const int64_t *chunks; // device [n_chunks][2]
    float *base;     // device, n_chunks * HV * item_floats()
    __host__ __device__ int64_t item_floats() const
    {
        return 2 * (int64_t)C * C + 3 * (int64_t)C * Kp + C + Kp;
    }
    __host__ __device__ float *item(int64_t chunk, int64_t HV, int64_t hv) const
    {
        return base + (chunk * HV + hv) * item_floats();
    }
    __host__ __device__ static float *Aqk(float *it, int C, int64_t) { return it; }
    __host__ __device__ static float *Tinv(float *it, int C, int64_t) { return it + (int64_t)C * C; }
    __host__ __device__ static float *qg(float *it, int C, int64_t) { return it + 2 * (int64_t)C * C; }
    __host__ __device__ static float *kbg(float *it, int C, int64_t Kp)
    {
        return it + 2 * (int64_t)C * C + (int64_t)C * Kp;
    }
    __host__ __device__ static float *kd(float *it, int C, int64_t Kp)
    {
        return it + 2 * (int64_t)C * C + 2 * (int64_t)C * Kp;
    }
    __host__ __device__ static float *beta(float *it, int C, int64_t Kp)
    {
        return it + 2 * (int64_t)C * C + 3 * (int64_t)C * Kp;
    }
    __host__ __device__ static float *dlast(float *it, int C, int64_t Kp)
    {
        return it + 2 * (int64_t)C * C + 3 * (int64_t)C * Kp + C;
    }
};

// Enqueues the builder on the call's stream for every (chunk, value head) of ws (which the
// caller allocated and whose chunk list it filled). K <= 256.
linseq_status chunk_prepare(const linseq_kda_problem *p, int64_t HV, float scale,
                            const ls_cuda_call *call, const chunk_ws &ws);

} // namespace ls_kda

#endif
