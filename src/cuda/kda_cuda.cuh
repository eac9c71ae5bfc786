// Internal: what the CUDA KDA kernels share (kda_forward.cu, kda_decode.cu, kda_gate.cu, and
// the backward if it wants them): the in-kernel options' scalar functions, which are the CPU
// path's own (core/activation.h, core/kda_math.h), and the intra-chunk builder of the chunked
// forward (its workspace layout and its launcher, defined in kda_forward.cu).
//
// The signatures here are stable: the backward may include this header.
#ifndef LS_KDA_CUDA_CUH
#define LS_KDA_CUDA_CUH

#include "core/activation.h"
#include "core/kda_math.h"
#include "cuda/cuda_common.cuh"

namespace ls_kda
{

// Per-token log decays below this are raised to it before any chunk computation (the CPU's
// floor, core/kda_math.h).
constexpr float LOG_DECAY_FLOOR = LS_KDA_LOG_DECAY_FLOOR;

// The CPU's sigmoid (core/activation.h): exp never overflows.
__device__ __forceinline__ float sigmoid(float z) { return ls_sigmoidf(z); }

// The factor a q or k row is multiplied by: ls_kda_l2norm_factorf with the l2 norm (as the
// CPU's kda_norm_scale), scale without.
__device__ __forceinline__ float norm_factor(float sumsq, bool l2norm, float scale)
{
    return l2norm ? ls_kda_l2norm_factorf(sumsq, scale, LS_KDA_L2NORM_EPS) : scale;
}

// The log decay of one (token, value head, channel) as the recurrence sees it: g itself, or
// the gate of the raw input (decay NONE: 0). gK = K (per channel) or 1 (per head); i < gK.
template <typename Elem>
__device__ __forceinline__ float log_decay(const linseq_kda_problem &p, const Elem *g, int64_t tok,
                                           int64_t HV, int64_t hv, int64_t gK, int64_t i)
{
    if (p.decay == LINSEQ_DECAY_NONE) return 0.0f;
    const float raw = ls_ld(g, (tok * HV + hv) * gK + i);
    if (!p.gate_in_kernel) return raw;
    const float bias = p.dt_bias ? p.dt_bias[hv * gK + i] : 0.0f;
    return ls_kda_gatef(raw, bias, p.A_log ? p.A_log[hv] : 0.0f, p.lower_bound);
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
    int C;      // chunk size
    int64_t Kp; // K rounded up to a multiple of 4
    int64_t n_chunks;
    const int64_t *chunks; // device [n_chunks][2]
    float *base;           // device, n_chunks * HV * item_floats()
    __host__ __device__ int64_t item_floats() const
    {
        return 2 * (int64_t)C * C + 3 * (int64_t)C * Kp + C + Kp;
    }
    __host__ __device__ float *item(int64_t chunk, int64_t HV, int64_t hv) const
    {
        return base + (chunk * HV + hv) * item_floats();
    }
    __host__ __device__ static float *Aqk(float *it, int C, int64_t) { return it; }
    __host__ __device__ static float *Tinv(float *it, int C, int64_t)
    {
        return it + (int64_t)C * C;
    }
    __host__ __device__ static float *qg(float *it, int C, int64_t)
    {
        return it + 2 * (int64_t)C * C;
    }
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

// ---------------------------------------------------------------------------------------
// The token-by-token kernel: recurrent-mode forward and decode (kda_forward.cu,
// kda_decode.cu). One CTA of REC_THREADS per (sequence or request, value head, tile of
// REC_BV state columns); the tile of the state, K x REC_BV float32, lives in registers for the
// whole sequence, and each token is
//     pred = (a * ks)^T S,  o_pre = (a * qs)^T S,  u = beta (v - pred),
//     o = o_pre + (qs . ks) u,  S <- diag(a) S + ks u^T            (a = e^{g})
// as the CPU's kda_recurrent_item. Two thread layouts, chosen to match the stored state so its
// loads and stores are coalesced: K-major ([K][V] rows: lane = column, warps split K) and
// V-first ([V][K] rows: lane = key channel, warps split the columns).
constexpr int REC_THREADS = 128;
constexpr int REC_BV = 32;
constexpr int REC_WARPS = REC_THREADS / 32;

struct rec_params {
    linseq_kda_problem p; // pointers are device pointers; per-token ones are Elem
    int64_t HV, group, gK;
    float scale;
    const int64_t *cu;     // device cu_seqlens (forward varlen) or NULL
    const float *state_in; // h0 / the pool, or NULL (zeros)
    float *state_out;      // ht / the pool, or NULL; may equal state_in
    const int64_t *rows;   // decode: request -> state row (NULL: row = request); < 0: padding
    bool decode;
    void *o;
};

// (min blocks 1: without it ptxas for sm_80 caps KMAX = 256 V-first at 168 registers and
// spills)
template <typename Elem, int KMAX, bool VF>
__global__ void __launch_bounds__(REC_THREADS, 1) recurrent_kernel(const rec_params P)
{
    constexpr int E = KMAX / 4;             // state values per thread
    constexpr int RPL = KMAX / 32;          // VF: key rows per lane
    constexpr int CPW = REC_BV / REC_WARPS; // VF: columns per warp
    __shared__ float s_q[2][KMAX], s_k[2][KMAX], s_a[2][KMAX];
    __shared__ float s_red[2][2][REC_WARPS][32];

    const linseq_kda_problem &p = P.p;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t K = p.K, V = p.V, HV = P.HV, H = p.H;
    const int64_t n = blockIdx.x / HV, hv = blockIdx.x % HV, h = hv / P.group;
    const int64_t j0 = (int64_t)blockIdx.y * REC_BV;
    const Elem *q = ls_in<Elem>(p.q), *k = ls_in<Elem>(p.k), *v = ls_in<Elem>(p.v);
    const Elem *beta = ls_in<Elem>(p.beta), *g = ls_in<Elem>(p.g);
    Elem *o = ls_out<Elem>(P.o);

    int64_t tok0, len, row = n;
    if (P.decode) {
        tok0 = n;
        len = 1;
        if (P.rows) row = P.rows[n];
    } else if (P.cu) {
        tok0 = P.cu[n];
        len = P.cu[n + 1] - tok0;
    } else {
        tok0 = n * p.T;
        len = p.T;
    }
    if (row < 0) { // a padding request: its o row is zero, no state is touched
        for (int64_t j = j0 + threadIdx.x; j < j0 + REC_BV && j < V; j += REC_THREADS)
            ls_st(o, (tok0 * HV + hv) * V + j, 0.0f);
        return;
    }

    // the element of the state tile value e of this thread holds: key row, column
    auto row_of = [&](int e) -> int64_t { return VF ? lane + 32 * (e % RPL) : w + REC_WARPS * e; };
    auto col_of = [&](int e) -> int64_t { return VF ? j0 + w * CPW + e / RPL : j0 + lane; };
    const int64_t slot = (row * HV + hv) * K * V;
    float S[E];
#pragma unroll
    for (int e = 0; e < E; e++) {
        const int64_t i = row_of(e), j = col_of(e);
        S[e] = 0.0f;
        if (P.state_in && i < K && j < V) S[e] = P.state_in[slot + (VF ? j * K + i : i * V + j)];
    }
    // channels past K stay zero in both buffers: their rows of S stay zero
    for (int i = threadIdx.x; i < 2 * KMAX; i += REC_THREADS) {
        const int b = i / KMAX, c = i % KMAX;
        if (c >= K) s_q[b][c] = s_k[b][c] = s_a[b][c] = 0.0f;
    }

    for (int64_t t = 0; t < len; t++) {
        const int buf = (int)(t & 1);
        const int64_t tok = tok0 + t;
        for (int64_t i = threadIdx.x; i < K; i += REC_THREADS) {
            s_q[buf][i] = ls_ld(q, (tok * H + h) * K + i);
            s_k[buf][i] = ls_ld(k, (tok * H + h) * K + i);
            s_a[buf][i] = expf(log_decay(p, g, tok, HV, hv, P.gK, P.gK == 1 ? 0 : i));
        }
        __syncthreads();
        // every warp forms the row norms itself (same bits in every warp, no extra barrier)
        float ssq = 0.0f, ssk = 0.0f, sqk = 0.0f;
        for (int64_t i = lane; i < K; i += 32) {
            const float x = s_q[buf][i], y = s_k[buf][i];
            ssq = fmaf(x, x, ssq);
            ssk = fmaf(y, y, ssk);
            sqk = fmaf(x, y, sqk);
        }
        ssq = warp_sum(ssq);
        ssk = warp_sum(ssk);
        sqk = warp_sum(sqk);
        const float mq = norm_factor(ssq, p.qk_l2norm, P.scale);
        const float mk = norm_factor(ssk, p.qk_l2norm, 1.0f);
        const float qk = (sqk * mq) * mk;
        const float bt = ls_ld(beta, tok * HV + hv);
        const float b = p.beta_is_logit ? sigmoid(bt) : bt;

        if (!VF) {
            float pp = 0.0f, po = 0.0f;
#pragma unroll
            for (int e = 0; e < E; e++) {
                const int i = (int)row_of(e);
                const float a = s_a[buf][i];
                pp = fmaf(a * (s_k[buf][i] * mk), S[e], pp);
                po = fmaf(a * (s_q[buf][i] * mq), S[e], po);
            }
            s_red[buf][0][w][lane] = pp;
            s_red[buf][1][w][lane] = po;
            __syncthreads();
            float pred = 0.0f, opre = 0.0f;
#pragma unroll
            for (int x = 0; x < REC_WARPS; x++) {
                pred += s_red[buf][0][x][lane];
                opre += s_red[buf][1][x][lane];
            }
            const int64_t j = j0 + lane;
            const float vj = j < V ? ls_ld(v, (tok * HV + hv) * V + j) : 0.0f;
            const float u = b * (vj - pred);
            if (w == 0 && j < V && o) ls_st(o, (tok * HV + hv) * V + j, fmaf(qk, u, opre));
#pragma unroll
            for (int e = 0; e < E; e++) {
                const int i = (int)row_of(e);
                S[e] = fmaf(s_k[buf][i] * mk, u, s_a[buf][i] * S[e]);
            }
        } else {
#pragma unroll
            for (int c = 0; c < CPW; c++) {
                float pp = 0.0f, po = 0.0f;
#pragma unroll
                for (int r = 0; r < RPL; r++) {
                    const int i = lane + 32 * r;
                    const float a = s_a[buf][i];
                    pp = fmaf(a * (s_k[buf][i] * mk), S[c * RPL + r], pp);
                    po = fmaf(a * (s_q[buf][i] * mq), S[c * RPL + r], po);
                }
                const float pred = warp_sum(pp), opre = warp_sum(po);
                const int64_t j = j0 + w * CPW + c;
                const float vj = j < V ? ls_ld(v, (tok * HV + hv) * V + j) : 0.0f;
                const float u = b * (vj - pred);
                if (lane == c && j < V && o) ls_st(o, (tok * HV + hv) * V + j, fmaf(qk, u, opre));
#pragma unroll
                for (int r = 0; r < RPL; r++) {
                    const int i = lane + 32 * r;
                    S[c * RPL + r] = fmaf(s_k[buf][i] * mk, u, s_a[buf][i] * S[c * RPL + r]);
                }
            }
        }
    }
    if (P.state_out) {
#pragma unroll
        for (int e = 0; e < E; e++) {
            const int64_t i = row_of(e), j = col_of(e);
            if (i < K && j < V) P.state_out[slot + (VF ? j * K + i : i * V + j)] = S[e];
        }
    }
}

// Launches recurrent_kernel over n_items (sequences or requests) x HV x V tiles. K <= 256.
template <typename Elem>
inline linseq_status launch_recurrent(const rec_params &P, int64_t n_items,
                                      const ls_cuda_call *call)
{
    const int64_t K = P.p.K;
    if (K > 256)
        return ls_fail(call->fn, LINSEQ_ERR_UNSUPPORTED,
                       "K = %lld: the CUDA KDA kernels take K <= 256", (long long)K);
    if (n_items * P.HV > 0x7fffffffLL)
        return ls_fail(call->fn, LINSEQ_ERR_UNSUPPORTED,
                       "%lld (sequence, value head) pairs: more than the CUDA grid holds",
                       (long long)(n_items * P.HV));
    const dim3 grid((unsigned)(n_items * P.HV), ls_blocks(P.p.V, REC_BV));
    if (grid.y > 65535)
        return ls_fail(call->fn, LINSEQ_ERR_UNSUPPORTED,
                       "V = %lld is too large for the CUDA "
                       "KDA kernels",
                       (long long)P.p.V);
    const bool vf = P.p.state_v_first;
    cudaStream_t s = ls_stream(call);
#define LS_REC_LAUNCH(KM)                                                                          \
    do {                                                                                           \
        if (vf)                                                                                    \
            recurrent_kernel<Elem, KM, true><<<grid, REC_THREADS, 0, s>>>(P);                      \
        else                                                                                       \
            recurrent_kernel<Elem, KM, false><<<grid, REC_THREADS, 0, s>>>(P);                     \
    } while (0)
    if (K <= 32)
        LS_REC_LAUNCH(32);
    else if (K <= 64)
        LS_REC_LAUNCH(64);
    else if (K <= 128)
        LS_REC_LAUNCH(128);
    else
        LS_REC_LAUNCH(256);
#undef LS_REC_LAUNCH
    LS_CUDA_LAUNCHED(call, "recurrent_kernel");
    return LINSEQ_OK;
}

} // namespace ls_kda

#endif
