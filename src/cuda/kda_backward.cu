// CUDA KDA backward: ls_cuda_kda_backward (cuda_ops.h), recurrent and chunked modes.
//
// Status: this is the exact token-recurrent form of the backward, in float32, for both modes
// (chunked mode runs it with its checkpoint interval set to the chunk size). The
// chunk-parallel tensor-core form (chunk states, mma.sync intra-chunk products, a reverse
// pass over chunk states) is the next step; this file is its reference on the device and
// the fallback for shapes it will not cover.
//
// Decomposition (Tn = B*T tokens, N sequences, HV value heads, V in tiles of 32 columns):
//   1. prep_qk   per (token, qk head), one warp: qs = scale l2norm(q), ks = l2norm(k),
//                kq = ks . qs, in float32 workspace.
//   2. prep_v    per (token, value head, decay channel): beta after the sigmoid and the
//                decay factor a = e^{g} with g after the gate.
//   3. walk      (kda_backward_walk.cu) per (sequence, value head, 32-column tile), 256
//                threads: lane l of warp w owns rows l + 32 m of the columns w + 8 c
//                (c < 4) of the K x 32 state tile (registers for K <= 256, per-block
//                global scratch above). Columns only
//                meet themselves in the recurrence, so each block runs the whole sequence
//                alone: a forward pass keeps the state every `seg` tokens (seg = 64 in
//                recurrent mode, the chunk size in chunked mode); the reverse walk rebuilds
//                one segment at a time, keeping its state every `sub` tokens in global
//                memory, then one sub-segment's states (as many as shared memory holds:
//                12 at K = 128, 5 at K = 256) in shared memory, and undoes those tokens
//                last to first (formulas at walk_token). A column's sums over the rows are
//                warp sums (the forward steps never synchronise the block); the row sums
//                over the tile's columns meet across the 8 warps in shared memory, one
//                __syncthreads per reverse token. Per token it writes dv (its columns), and
//                its tile's share of dqs, dks, dg (per row) and dbeta.
//   4. finish_qk per (token, qk head), one warp: the tile shares summed over the tiles and
//                the value heads of the group (GVA) in a fixed order, then the chain rule
//                of scale and l2norm -> dq, dk w.r.t. the raw q, k.
//   5. finish_v  per (token, value head), one warp: dbeta (sigmoid chain), dg (summed over
//                K per head; gate chain), and each token's gate contributions.
//   6. gate_a/b  dA_log, ddt_bias: partial sums over 256-token blocks in double, then a
//                second kernel sums the blocks in order. No float atomics anywhere: the
//                results are bitwise reproducible run to run.
//
// FLOPs per call (Tn HV K V state-element-tokens, E for short): three forward passes (the
// checkpoints, the segment's sub-segment starts, the sub-segment's states) ~5 E each, and the
// reverse token ~17 E: ~32 E FFMA-class flops (e.g. (B,T,H,K) = (1,8192,96,128): 0.41 TFLOP,
// ~7 ms of H200 fp32), plus ~40 Tn HV K in the other kernels. Bytes: the per-token inputs
// ~4 times (prep, three forward passes share L2, reverse), the outputs once, the tile shares
// 3 Tn HV K ceil(V/32) floats written and read, the checkpoints N HV ceil(L/seg) K V floats
// and the sub-segment starts 2 E / sub floats written and read once; the per-token states
// stay in shared memory (2 E floats of shared traffic). K > 256 (no register path) keeps a
// whole segment's states in global memory instead.
//
// Why this design: it is exact for every g <= 0 (only the forward's e^{g} <= 1 factors are
// evaluated; a token with g = -1000 multiplies by an exact 0), matches the CPU recurrent
// backward's formulas term for term (kda_recurrent_bwd_simd.c), handles any K and V, and
// every state element has one owner thread: the checkpoint and segment buffers are private
// (no synchronisation, coalesced slot order), and only the row sums need the block (one
// __syncthreads per reverse token, partials double-buffered by token parity).
#include <math.h>

#include <utility>

#include "cuda/kda_bwd_cuda.cuh"

namespace
{

using namespace ls_kdab;

constexpr int GATE_TB = 256;    // tokens per partial sum of dA_log / ddt_bias
constexpr int REC_SEGMENT = 64; // recurrent mode: tokens between checkpoints

// qs = scale l2norm(q) (or scale q), ks = l2norm(k) (or k), kq = ks . qs: one warp per row
// (token, qk head), the CPU's kda_norm_scale formula (the inverse norm formed in double).
template <typename Elem>
__global__ void __launch_bounds__(NT)
    kda_bwd_prep_qk(const float *q_in, const float *k_in, int64_t n_rows, int64_t K, bool l2,
                    float scale, float *qs, float *ks, float *kq)
{
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * NW + (threadIdx.x >> 5);
    if (row >= n_rows) return; // the whole warp
    const Elem *q = ls_in<Elem>(q_in) + row * K, *k = ls_in<Elem>(k_in) + row * K;
    float mq = scale, mk = 1.0f;
    if (l2) {
        float sq = 0.0f, sk = 0.0f;
        for (int64_t i = lane; i < K; i += 32) {
            const float x = ls_ld(q, i), y = ls_ld(k, i);
            sq = fmaf(x, x, sq);
            sk = fmaf(y, y, sk);
        }
        sq = warp_sum(sq);
        sk = warp_sum(sk);
        mq = ls_kda_l2norm_factorf(sq, scale, LS_KDA_L2NORM_EPS);
        mk = ls_kda_l2norm_factorf(sk, 1.0f, LS_KDA_L2NORM_EPS);
    }
    float dot = 0.0f;
    for (int64_t i = lane; i < K; i += 32) {
        const float x = ls_ld(q, i) * mq, y = ls_ld(k, i) * mk;
        qs[row * K + i] = x;
        ks[row * K + i] = y;
        dot = fmaf(x, y, dot);
    }
    dot = warp_sum(dot);
    if (lane == 0) kq[row] = dot;
}

// beta after the sigmoid, and a = e^{g} with g after the gate: one thread per element of
// [Tn,HV,gK] (gK = 1 without decay; then only beta).
template <typename Elem>
__global__ void __launch_bounds__(NT)
    kda_bwd_prep_v(const float *beta_in, const float *g_in, int64_t n, int64_t HV, int64_t gK,
                   bool logit, int decay, bool gate, const float *A_log, const float *dt_bias,
                   float lower_bound, float *beta, float *a)
{
    const int64_t idx = (int64_t)blockIdx.x * NT + threadIdx.x;
    if (idx >= n) return;
    const int64_t row = idx / gK, c = idx % gK, hv = row % HV;
    if (c == 0) {
        const float b = ls_ld(ls_in<Elem>(beta_in), row);
        beta[row] = logit ? ls_kda::sigmoid(b) : b;
    }
    if (decay == DECAY_NONE) return;
    float g = ls_ld(ls_in<Elem>(g_in), idx);
    if (gate)
        g = ls_kda_gatef(g, dt_bias ? dt_bias[hv * gK + c] : 0.0f, A_log ? A_log[hv] : 0.0f,
                         lower_bound);
    a[idx] = expf(g);
}

// dq, dk of one (token, qk head) per warp: the tile shares summed over the group's value
// heads and the tiles, then dx = r dxhat - r^3 x (x . dxhat) with dxhat = mul * sum and
// r = ls_kda_l2norm_rsqrt(|x|^2) (kda_bwd_chain_qk of the CPU path).
template <typename Elem>
__device__ __forceinline__ void finish_row(const float *P, const Elem *x, Elem *out, int64_t tok,
                                           int64_t h, int64_t n_tok, int64_t HV, int64_t G,
                                           int64_t K, int64_t n_tiles, bool l2, float mul, int lane)
{
    auto gsum = [&](int64_t i) {
        float s = 0.0f;
        for (int64_t g = 0; g < G; g++)
            for (int64_t t = 0; t < n_tiles; t++)
                s += P[((t * n_tok + tok) * HV + h * G + g) * K + i];
        return s * mul;
    };
    if (!l2) {
        for (int64_t i = lane; i < K; i += 32) ls_st(out, i, gsum(i));
        return;
    }
    float ss = 0.0f, dot = 0.0f;
    for (int64_t i = lane; i < K; i += 32) {
        const float xi = ls_ld(x, i);
        ss = fmaf(xi, xi, ss);
        dot = fmaf(xi, gsum(i), dot);
    }
    ss = warp_sum(ss);
    dot = warp_sum(dot);
    const double r = ls_kda_l2norm_rsqrt((double)ss, LS_KDA_L2NORM_EPS);
    const float vr = (float)r, vc = (float)(r * r * r * (double)dot);
    for (int64_t i = lane; i < K; i += 32) ls_st(out, i, fmaf(-vc, ls_ld(x, i), vr * gsum(i)));
}

template <typename Elem>
__global__ void __launch_bounds__(NT)
    kda_bwd_finish_qk(const float *p_dq, const float *p_dk, const float *q_in, const float *k_in,
                      float *dq, float *dk, int64_t n_tok, int64_t H, int64_t HV, int64_t K,
                      int64_t n_tiles, bool l2, float scale)
{
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * NW + (threadIdx.x >> 5);
    if (row >= n_tok * H) return;
    const int64_t tok = row / H, h = row % H, G = HV / H;
    if (dq)
        finish_row<Elem>(p_dq, ls_in<Elem>(q_in) + row * K, ls_out<Elem>(dq) + row * K, tok, h,
                         n_tok, HV, G, K, n_tiles, l2, scale, lane);
    if (dk)
        finish_row<Elem>(p_dk, ls_in<Elem>(k_in) + row * K, ls_out<Elem>(dk) + row * K, tok, h,
                         n_tok, HV, G, K, n_tiles, l2, 1.0f, lane);
}

struct finish_v_args {
    const float *p_dg, *p_db;
    const float *beta_in, *g_in, *A_log, *dt_bias;
    float *dbeta, *dg; // Elem
    float *dgr;        // [Tn,HV,gK] gradient w.r.t. the raw gate input (gate sums)
    double *dal;       // [Tn,HV] the token's dA_log contribution
    int64_t n_tok, HV, K, gK, n_tiles;
    int decay;
    bool logit, gate;
    float lower_bound;
};

// dbeta and dg of one (token, value head) per warp, with the in-kernel options' chain rules
// (kda_bwd_emit of the CPU path).
template <typename Elem>
__global__ void __launch_bounds__(NT) kda_bwd_finish_v(const finish_v_args A)
{
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * NW + (threadIdx.x >> 5);
    if (row >= A.n_tok * A.HV) return;
    const int64_t hv = row % A.HV, K = A.K, per_tile = A.n_tok * A.HV;
    if (A.dbeta && lane == 0) {
        float d = 0.0f;
        for (int64_t t = 0; t < A.n_tiles; t++) d += A.p_db[t * per_tile + row];
        if (A.logit) {
            const float s = ls_kda::sigmoid(ls_ld(ls_in<Elem>(A.beta_in), row));
            d *= s * (1.0f - s);
        }
        ls_st(ls_out<Elem>(A.dbeta), row, d);
    }
    if (A.decay == DECAY_NONE || !A.p_dg) return;
    auto tiles = [&](int64_t i) {
        float s = 0.0f;
        for (int64_t t = 0; t < A.n_tiles; t++) s += A.p_dg[(t * per_tile + row) * K + i];
        return s;
    };
    const float a_log = A.A_log ? A.A_log[hv] : 0.0f;
    double al = 0.0;
    // One value per channel, or the sum over K per head (handled by lane 0).
    auto emit = [&](int64_t c, float d) {
        const int64_t at = row * A.gK + c;
        if (A.gate) {
            const float bias = A.dt_bias ? A.dt_bias[hv * A.gK + c] : 0.0f;
            float d_raw, d_alog;
            ls_kda_gate_gradf(ls_ld(ls_in<Elem>(A.g_in), at), bias, a_log, A.lower_bound, &d_raw,
                              &d_alog);
            al += (double)(d * d_alog);
            d *= d_raw;
            if (A.dgr) A.dgr[at] = d;
        }
        if (A.dg) ls_st(ls_out<Elem>(A.dg), at, d);
    };
    if (A.decay == DECAY_CHANNEL) {
        for (int64_t i = lane; i < K; i += 32) emit(i, tiles(i));
    } else {
        float d = 0.0f;
        for (int64_t i = lane; i < K; i += 32) d += tiles(i);
        d = warp_sum(d);
        if (lane == 0) emit(0, d);
    }
    if (A.dal) {
        al = warp_sum(al);
        if (lane == 0) A.dal[row] = al;
    }
}

// dA_log and ddt_bias, pass 1: block (b, hv) sums tokens [b GATE_TB, (b+1) GATE_TB) in
// double, column c < gK of ddt_bias or c == gK for dA_log.
__global__ void __launch_bounds__(NT)
    kda_bwd_gate_a(const float *dgr, const double *dal, int64_t n_tok, int64_t HV, int64_t gK,
                   double *part)
{
    const int64_t b = blockIdx.x / HV, hv = blockIdx.x % HV;
    const int64_t t0 = b * GATE_TB, t1 = t0 + GATE_TB < n_tok ? t0 + GATE_TB : n_tok;
    for (int64_t c = threadIdx.x; c <= gK; c += NT) {
        double s = 0.0;
        for (int64_t t = t0; t < t1; t++)
            s += c < gK ? (double)dgr[(t * HV + hv) * gK + c] : dal[t * HV + hv];
        part[(b * HV + hv) * (gK + 1) + c] = s;
    }
}

// Pass 2: the blocks in order.
__global__ void __launch_bounds__(NT)
    kda_bwd_gate_b(const double *part, int64_t n_blocks, int64_t HV, int64_t gK, float *dA_log,
                   float *ddt_bias)
{
    const int64_t idx = (int64_t)blockIdx.x * NT + threadIdx.x;
    if (idx >= HV * (gK + 1)) return;
    const int64_t hv = idx / (gK + 1), c = idx % (gK + 1);
    double s = 0.0;
    for (int64_t b = 0; b < n_blocks; b++) s += part[(b * HV + hv) * (gK + 1) + c];
    if (c < gK) {
        if (ddt_bias) ddt_bias[hv * gK + c] = (float)s;
    } else if (dA_log) {
        dA_log[hv] = (float)s;
    }
}

// Carves 256-byte aligned pieces out of one workspace allocation (measure with base NULL).
struct carver {
    char *base;
    size_t off = 0;
    template <typename T> T *take(size_t count)
    {
        T *p = base ? reinterpret_cast<T *>(base + off) : nullptr;
        off += (count * sizeof(T) + 255) & ~(size_t)255;
        return p;
    }
};

struct plan {
    float *qs, *ks, *kq, *beta, *a;
    float *ckpt, *segbuf, *scratch;
    float *p_dq, *p_dk, *p_dg, *p_db;
    float *dgr;
    double *dal, *gpart;
};

template <typename Elem>
linseq_status run(const linseq_kda_problem *p, int64_t HV, float scale, const ls_cuda_call *call,
                  const void *d_o, const float *d_ht, const linseq_kda_grads *gr)
{
    const cudaStream_t st = ls_stream(call);
    const int64_t H = p->H, K = p->K, V = p->V, G = HV / H;
    const int64_t n_tok = p->B * p->T, N = call->n_seqs;
    const int decay = p->decay == LINSEQ_DECAY_PER_CHANNEL ? DECAY_CHANNEL
                      : p->decay == LINSEQ_DECAY_PER_HEAD  ? DECAY_HEAD
                                                           : DECAY_NONE;
    const int64_t gK = decay == DECAY_CHANNEL ? K : 1;
    const bool gate = decay != DECAY_NONE && p->gate_in_kernel;
    const bool want_gate = gate && (gr->dA_log || gr->ddt_bias);
    const bool want_dg = decay != DECAY_NONE && (gr->dg || want_gate);
    const int seg = call->chunk > 0 ? call->chunk : REC_SEGMENT;
    const int64_t n_tiles = (V + TILE - 1) / TILE;
    const int64_t n_blocks = N * HV * n_tiles;
    const int64_t max_segs = call->max_len > 0 ? (call->max_len + seg - 1) / seg : 1;
    const int64_t rows_needed = (K + 31) / 32; // rows per lane
    const int MR = rows_needed <= 1   ? 1
                   : rows_needed <= 2 ? 2
                   : rows_needed <= 4 ? 4
                   : rows_needed <= 8 ? 8
                                      : 0;
    const int mr = MR > 0 ? MR : (int)rows_needed;
    const size_t tf = (size_t)mr * CW * NT;
    const size_t n_share = (size_t)(n_tiles * n_tok * HV);
    // Sub-segment length: as many states as shared memory holds next to the partials (half
    // of it for MR <= 2, whose register use lets two blocks share an SM), at most seg.
    int sub = seg;
    if (MR > 0) {
        int optin = 0;
        LS_CUDA_TRY(call, cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                                 call->device));
        // two blocks must fit an SM's 228 KiB with 1 KiB reserved per block: optin / 2 less
        // 2 KiB leaves room
        const size_t budget = MR <= 2 ? (size_t)optin / 2 - 2048 : (size_t)optin;
        const size_t fixed = walk_smem(MR, 0), per_state = walk_smem(MR, 1) - fixed;
        const int64_t fit = budget > fixed ? (int64_t)((budget - fixed) / per_state) : 0;
        sub = (int)(fit < 1 ? 1 : fit < seg ? fit : seg);
    }
    const int64_t seg_states = MR > 0 ? (seg + sub - 1) / sub : seg; // see kda_bwd_walk
    const int64_t n_gate_blocks = (n_tok + GATE_TB - 1) / GATE_TB;

    auto layout = [&](char *base) {
        carver c{base};
        plan pl{};
        pl.qs = c.take<float>((size_t)(n_tok * H * K));
        pl.ks = c.take<float>((size_t)(n_tok * H * K));
        pl.kq = c.take<float>((size_t)(n_tok * H));
        pl.beta = c.take<float>((size_t)(n_tok * HV));
        pl.a = decay != DECAY_NONE ? c.take<float>((size_t)(n_tok * HV * gK)) : nullptr;
        pl.ckpt = c.take<float>((size_t)n_blocks * (size_t)max_segs * tf);
        pl.segbuf = c.take<float>((size_t)n_blocks * (size_t)seg_states * tf);
        pl.scratch = MR == 0
                         ? c.take<float>((size_t)n_blocks * (2 * tf + (size_t)red_floats(32 * mr)))
                         : nullptr;
        pl.p_dq = gr->dq ? c.take<float>(n_share * (size_t)K) : nullptr;
        pl.p_dk = gr->dk ? c.take<float>(n_share * (size_t)K) : nullptr;
        pl.p_dg = want_dg ? c.take<float>(n_share * (size_t)K) : nullptr;
        pl.p_db = gr->dbeta ? c.take<float>(n_share) : nullptr;
        pl.dgr = want_gate ? c.take<float>((size_t)(n_tok * HV * gK)) : nullptr;
        pl.dal = want_gate ? c.take<double>((size_t)(n_tok * HV)) : nullptr;
        pl.gpart = want_gate ? c.take<double>((size_t)(n_gate_blocks * HV * (gK + 1))) : nullptr;
        return std::make_pair(pl, c.off);
    };
    const size_t bytes = layout(nullptr).second;
    ls_cuda_workspace ws;
    if (linseq_status status = ws.alloc(call, bytes)) return status;
    const plan pl = layout(ws.as<char>()).first;

    if (n_tok > 0) {
        kda_bwd_prep_qk<Elem><<<ls_blocks(n_tok * H, NW), NT, 0, st>>>(
            p->q, p->k, n_tok * H, K, p->qk_l2norm, scale, pl.qs, pl.ks, pl.kq);
        LS_CUDA_LAUNCHED(call, "kda_bwd_prep_qk");
        kda_bwd_prep_v<Elem><<<ls_blocks(n_tok * HV * gK, NT), NT, 0, st>>>(
            p->beta, p->g, n_tok * HV * gK, HV, gK, p->beta_is_logit, decay, gate, p->A_log,
            p->dt_bias, p->lower_bound, pl.beta, pl.a);
        LS_CUDA_LAUNCHED(call, "kda_bwd_prep_v");
    }

    if (n_blocks > 0) {
        walk_args A{};
        A.v = p->v;
        A.d_o = d_o;
        A.dv = gr->dv;
        A.qs = pl.qs;
        A.ks = pl.ks;
        A.kq = pl.kq;
        A.beta = pl.beta;
        A.a = pl.a;
        A.h0 = p->h0;
        A.d_ht = d_ht;
        A.dh0 = gr->dh0;
        A.cu = p->cu_seqlens;
        A.T = p->T;
        A.n_tok = n_tok;
        A.H = H;
        A.HV = HV;
        A.G = G;
        A.K = K;
        A.V = V;
        A.n_tiles = n_tiles;
        A.max_segs = max_segs;
        A.decay = decay;
        A.seg = seg;
        A.sub = sub;
        A.seg_states = seg_states;
        A.mr = mr;
        A.v_first = p->state_v_first;
        A.ckpt = pl.ckpt;
        A.segbuf = pl.segbuf;
        A.scratch = pl.scratch;
        A.p_dq = pl.p_dq;
        A.p_dk = pl.p_dk;
        A.p_dg = pl.p_dg;
        A.p_db = pl.p_db;
        const linseq_status s = launch_walk(call, MR, A, n_blocks);
        if (s != LINSEQ_OK) return s;
    }

    if (n_tok > 0 && (gr->dq || gr->dk)) {
        kda_bwd_finish_qk<Elem><<<ls_blocks(n_tok * H, NW), NT, 0, st>>>(
            pl.p_dq, pl.p_dk, p->q, p->k, gr->dq, gr->dk, n_tok, H, HV, K, n_tiles, p->qk_l2norm,
            scale);
        LS_CUDA_LAUNCHED(call, "kda_bwd_finish_qk");
    }
    if (n_tok > 0 && (gr->dbeta || want_dg)) {
        finish_v_args F{};
        F.p_dg = pl.p_dg;
        F.p_db = pl.p_db;
        F.beta_in = p->beta;
        F.g_in = p->g;
        F.A_log = p->A_log;
        F.dt_bias = p->dt_bias;
        F.dbeta = gr->dbeta;
        F.dg = gr->dg;
        F.dgr = pl.dgr;
        F.dal = pl.dal;
        F.n_tok = n_tok;
        F.HV = HV;
        F.K = K;
        F.gK = gK;
        F.n_tiles = n_tiles;
        F.decay = decay;
        F.logit = p->beta_is_logit;
        F.gate = gate;
        F.lower_bound = p->lower_bound;
        kda_bwd_finish_v<Elem><<<ls_blocks(n_tok * HV, NW), NT, 0, st>>>(F);
        LS_CUDA_LAUNCHED(call, "kda_bwd_finish_v");
    }
    if (want_gate) {
        if (n_gate_blocks > 0) {
            kda_bwd_gate_a<<<(unsigned)(n_gate_blocks * HV), NT, 0, st>>>(pl.dgr, pl.dal, n_tok, HV,
                                                                          gK, pl.gpart);
            LS_CUDA_LAUNCHED(call, "kda_bwd_gate_a");
        }
        kda_bwd_gate_b<<<ls_blocks(HV * (gK + 1), NT), NT, 0, st>>>(pl.gpart, n_gate_blocks, HV, gK,
                                                                    gr->dA_log, gr->ddt_bias);
        LS_CUDA_LAUNCHED(call, "kda_bwd_gate_b");
    }
    return LINSEQ_OK;
}

} // namespace

extern "C" linseq_status ls_cuda_kda_backward(const linseq_kda_problem *p, int64_t HV, float scale,
                                              const ls_cuda_call *call, const void *d_o,
                                              const float *d_ht, const linseq_kda_grads *grads)
{
    return call->bf16 ? run<__nv_bfloat16>(p, HV, scale, call, d_o, d_ht, grads)
                      : run<float>(p, HV, scale, call, d_o, d_ht, grads);
}
