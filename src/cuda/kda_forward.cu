// KDA forward on the GPU: chunked mode (the WY form) and recurrent mode.
//
// Chunked mode, per chunk of C tokens with start state S0 [K,V] (kda_cuda.cuh, chunk_ws):
//     vnew = Tinv (diag(beta) V - kbg S0),  O = qg S0 + Aqk vnew,
//     S_C  = diag(dlast) S0 + kd^T vnew.
// Two kernels, split like fla's chunk_kda so that all the work that does not need the state
// runs in parallel over chunks:
//   1. chunk_prep_kernel, one CTA per (chunk, value head), all chunks at once: the row norms,
//      the in-kernel gate and sigmoid, the decay factors, Aqk and Akk (sub-chunk blocks), the
//      inverse Tinv = (I + diag(beta) Akk)^{-1} by forward substitution, and qg, kbg, kd, dlast,
//      written to a float32 workspace.
//   2. chunk_state_kernel, one CTA per (sequence, value head, 32 state columns), sequential
//      over the chunks of its sequence with the K x 32 state tile in shared memory (float32,
//      double-buffered): the three products with S0, the two triangular ones, the output;
//      or, for bf16 at chunk 64, chunk_state_mma_kernel (64- or 32-column tiles, the state in
//      the tensor-core accumulator registers). Both prefetch the next chunk's workspace block
//      into L2 while the current one computes.
// Every decay factor is a product of per-token decays e^{g} <= 1 (exactly the CPU's
// construction, kda_chunk_simd.c): off-diagonal 16 x 16 blocks factor through the first row
// of the row block and the last row of the column block, diagonal blocks run their products
// element by element, and g is first raised to -110. No exponent evaluated is positive, so the
// chunk is exact for every g <= 0 down to -inf.
//
// Floor per call (N = B*T tokens, C = chunk, HV value heads, multiply-adds):
//     prep:  N HV C K                    the scores Aqk, Akk (lower triangles, K each)
//            N HV C^2 / 6                the inverse, small
//     state: N HV V (3 K + C)            kbg S0, qg S0, kd^T vnew, Tinv R, Aqk vnew
// e.g. (B,T,HV,K=V) = (1,8192,96,128), C = 64: prep ~6.4 G, state ~45 G multiply-adds,
// ~100 GFLOP in all. Bytes: the inputs (bf16: q, k, v, g ~1 KB per token and head), o, and
// the float32 workspace (2 C^2 + 3 C K floats per chunk, ~0.8 KB per token and head, written
// once and read V/BV times, mostly from L2: the V tiles of a head run side by side). At
// ~1 PFLOP/s of bf16 tensor cores and ~4.8 TB/s the state products take ~0.1 ms and the
// workspace traffic ~0.3 ms, so the state kernel is bound by its chunk-to-chunk latency
// (B HV V / BV CTAs, each walking T / C chunks), which the split keeps short: everything
// that does not need the state is in the parallel kernel. The prep kernel's ~13 GFLOP of
// float32 FFMA (~0.2-0.4 ms at the H200's 67 TFLOP/s with its shared-memory traffic) is the
// next cost to measure.
//
// Arithmetic. float32 tensors: every product in float32 FFMA (the tests hold the GPU to 1e-5
// of the CPU, which TF32 tensor cores cannot meet). bf16 tensors with chunk 64: the five state
// products run on mma.sync m16n8k16 (bf16 operands: the workspace matrices, the state and
// the chunk's deltas are rounded to bf16 as operands; float32 accumulation; the state itself
// stays float32 in registers across chunks), chunk_state_mma_kernel. Other chunk sizes with
// bf16 use the FFMA state kernel. The prep kernel is FFMA for both (its exactness for
// g -> -inf needs the element-wise diagonal blocks anyway).
//
// Recurrent mode: recurrent_kernel of kda_cuda.cuh, one CTA per (sequence, value head, 32
// state columns), the state tile in registers, one pass over the tokens.
#include <stdlib.h>

#include "cuda/kda_cuda.cuh"

namespace ls_kda
{

namespace
{

// A hint: fetch the 128-byte line at p into L2 (no register written, no fault semantics
// beyond a plain load's; p must be a valid global address).
__device__ __forceinline__ void prefetch_l2(const void *p)
{
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// The next chunk's workspace block into L2 while this chunk computes: the state kernels walk
// their chunks one after the other, and each chunk's block is otherwise first read from HBM
// on the critical path.
__device__ __forceinline__ void prefetch_item(const chunk_ws &ws, int64_t chunk, int64_t HV,
                                              int64_t hv, int tid, int threads)
{
    const char *base = reinterpret_cast<const char *>(ws.item(chunk, HV, hv));
    const int64_t bytes = ws.item_floats() * (int64_t)sizeof(float);
    for (int64_t off = (int64_t)tid * 128; off < bytes; off += (int64_t)threads * 128)
        prefetch_l2(base + off);
}

constexpr int PREP_THREADS = 256;
constexpr int STATE_THREADS = 256;
constexpr int STATE_WARPS = STATE_THREADS / 32;
constexpr int STATE_BV = 32;

template <int C> struct prep_shape {
    static constexpr int NS = C / 16;                   // 16-row sub-chunks
    static constexpr int DK = C >= 128 ? 16 : 32;       // channels per pass
    static constexpr int LD = DK + 1;                   // row stride of the per-pass tiles
    static constexpr int CL = C + 1;                    // row stride of the score accumulators
    static constexpr int DSPLIT = 2;                    // threads per column of a diagonal block
    static constexpr int NDIAG = NS * 16 * DSPLIT;      // diagonal tasks: (block, column, share)
    static constexpr int NOFF = NS * (NS - 1) / 2 * 16; // off-diagonal 4 x 4 tiles
    static constexpr size_t floats =
        3 * C + 6 * (size_t)C * LD + NS * DK + NS * NS * DK + 2 * (size_t)C * CL;
};

// The shared memory of chunk_prep_kernel, carved from one dynamic block (prep_shape::floats).
template <int C> struct prep_smem {
    using sh = prep_shape<C>;
    float *rq, *rk, *rb; // [C] row factors of q and k, beta
    float *qs, *ks, *sa; // [C][LD] the pass's scaled q and k, decay factors
    float *qx, *kx, *ky; // [C][LD] scaled within the sub-chunk (see step 2)
    float *tot, *mid;    // [NS][DK] sub-chunk totals, [NS][NS][DK] middle factors
    float *accq, *acck;  // [C][CL] the score accumulators
    __device__ __forceinline__ explicit prep_smem(float *sm)
    {
        rq = sm, rk = rq + C, rb = rk + C;
        qs = rb + C, ks = qs + C * sh::LD, sa = ks + C * sh::LD;
        qx = sa + C * sh::LD, kx = qx + C * sh::LD, ky = kx + C * sh::LD;
        tot = ky + C * sh::LD, mid = tot + sh::NS * sh::DK;
        accq = mid + sh::NS * sh::NS * sh::DK, acck = accq + C * sh::CL;
    }
};

// What one prep CTA works on: chunk `chunk` (Lc tokens from tok0) of value head hv.
struct prep_item {
    int64_t chunk, hv, h, tok0, Lc;
};

// Row factors: scale / |q|, 1 / |k| (or scale, 1) and beta, one warp per row; zero past Lc.
template <typename Elem, int C>
__device__ __forceinline__ void prep_row_factors(const linseq_kda_problem &p, int64_t HV,
                                                 float scale, const prep_item &it,
                                                 const prep_smem<C> &s)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t K = p.K, H = p.H;
    const Elem *q = ls_in<Elem>(p.q), *k = ls_in<Elem>(p.k), *beta = ls_in<Elem>(p.beta);
    for (int r = warp; r < C; r += PREP_THREADS / 32) {
        float fq = 0.0f, fk = 0.0f, b = 0.0f;
        if (r < it.Lc) {
            const int64_t at = ((it.tok0 + r) * H + it.h) * K;
            float sq = 0.0f, sk = 0.0f;
            for (int64_t i = lane; i < K; i += 32) {
                const float x = ls_ld(q, at + i), y = ls_ld(k, at + i);
                sq = fmaf(x, x, sq);
                sk = fmaf(y, y, sk);
            }
            fq = norm_factor(warp_sum(sq), p.qk_l2norm, scale);
            fk = norm_factor(warp_sum(sk), p.qk_l2norm, 1.0f);
            const float bt = ls_ld(beta, (it.tok0 + r) * HV + it.hv);
            b = p.beta_is_logit ? sigmoid(bt) : bt;
        }
        if (lane == 0) {
            s.rq[r] = fq;
            s.rk[r] = fk;
            s.rb[r] = b;
        }
    }
}

// Step 1 of a pass: its channels [d0, d0 + DK) of every row: scaled q and k, decay factors
// of the floored log decays (padding: 0, 0, 1).
template <typename Elem, int C>
__device__ __forceinline__ void prep_load_pass(const linseq_kda_problem &p, int64_t HV, int64_t gK,
                                               const prep_item &it, int64_t d0,
                                               const prep_smem<C> &s)
{
    constexpr int DK = prep_shape<C>::DK, LD = prep_shape<C>::LD;
    const int64_t K = p.K, H = p.H;
    const Elem *q = ls_in<Elem>(p.q), *k = ls_in<Elem>(p.k), *g = ls_in<Elem>(p.g);
    for (int idx = threadIdx.x; idx < C * DK; idx += PREP_THREADS) {
        const int r = idx / DK, dd = idx % DK;
        const int64_t d = d0 + dd;
        float xq = 0.0f, xk = 0.0f, av = 1.0f;
        if (r < it.Lc && d < K) {
            const int64_t tok = it.tok0 + r, at = (tok * H + it.h) * K + d;
            xq = ls_ld(q, at) * s.rq[r];
            xk = ls_ld(k, at) * s.rk[r];
            float gl = log_decay(p, g, tok, HV, it.hv, gK, gK == 1 ? 0 : d);
            gl = gl < LOG_DECAY_FLOOR ? LOG_DECAY_FLOOR : gl; // NaN stays NaN
            av = expf(gl);
        }
        s.qs[r * LD + dd] = xq;
        s.ks[r * LD + dd] = xk;
        s.sa[r * LD + dd] = av;
    }
}

// Step 2: inside each sub-chunk, rows scaled down from its first row (qx, kx), columns scaled
// to its last row (ky), and its total decay.
template <int C> __device__ __forceinline__ void prep_subchunk_factors(const prep_smem<C> &s)
{
    constexpr int NS = prep_shape<C>::NS, DK = prep_shape<C>::DK, LD = prep_shape<C>::LD;
    for (int t = threadIdx.x; t < NS * DK; t += PREP_THREADS) {
        const int i = t / DK, dd = t % DK, n = i * 16;
        float x = 1.0f;
        for (int rr = 0; rr < 16; rr++) {
            const int r = n + rr;
            if (rr) x *= s.sa[r * LD + dd];
            s.qx[r * LD + dd] = s.qs[r * LD + dd] * x;
            s.kx[r * LD + dd] = s.ks[r * LD + dd] * x;
        }
        s.tot[i * DK + dd] = s.sa[n * LD + dd] * x;
        float y = 1.0f;
        for (int rr = 15; rr >= 0; rr--) {
            const int c = n + rr;
            if (rr < 15) y *= s.sa[(c + 1) * LD + dd];
            s.ky[c * LD + dd] = s.ks[c * LD + dd] * y;
        }
    }
}

// Step 3: across sub-chunks, e^{G_r} and e^{G_last - G_r} into qg, kbg, kd, dlast of the
// workspace item, and the middle factors e^{G_n(i) - G_e(j)} of the off-diagonal blocks.
template <int C>
__device__ __forceinline__ void prep_chunk_decays(float *item, int64_t Kp, int64_t d0,
                                                  const prep_smem<C> &s)
{
    constexpr int NS = prep_shape<C>::NS, DK = prep_shape<C>::DK, LD = prep_shape<C>::LD;
    float *o_qg = chunk_ws::qg(item, C, Kp), *o_kbg = chunk_ws::kbg(item, C, Kp);
    float *o_kd = chunk_ws::kd(item, C, Kp), *o_dlast = chunk_ws::dlast(item, C, Kp);
    for (int t = threadIdx.x; t < NS * DK; t += PREP_THREADS) {
        const int i = t / DK, dd = t % DK, n = i * 16;
        const int64_t d = d0 + dd;
        float pre = 1.0f, post = 1.0f;
        for (int j = 0; j < i; j++) pre *= s.tot[j * DK + dd];
        for (int j = NS - 1; j > i; j--) post *= s.tot[j * DK + dd];
        if (d < Kp) {
            const float base = pre * s.sa[n * LD + dd];
            float x = 1.0f;
            for (int rr = 0; rr < 16; rr++) {
                const int r = n + rr;
                if (rr) x *= s.sa[r * LD + dd];
                const float eg = base * x;
                o_qg[r * Kp + d] = s.qs[r * LD + dd] * eg;
                o_kbg[r * Kp + d] = s.rb[r] * (s.ks[r * LD + dd] * eg);
            }
            if (i == NS - 1) o_dlast[d] = base * x;
            float y = 1.0f;
            for (int rr = 15; rr >= 0; rr--) {
                const int c = n + rr;
                if (rr < 15) y *= s.sa[(c + 1) * LD + dd];
                o_kd[c * Kp + d] = s.ks[c * LD + dd] * (y * post);
            }
        }
        float m = s.sa[n * LD + dd];
        for (int j = i - 1; j >= 0; j--) {
            s.mid[(i * NS + j) * DK + dd] = m;
            if (j) m *= s.tot[j * DK + dd];
        }
    }
}

// Step 4, diagonal task t < NDIAG: the pass's share of column c of diagonal block i,
// element by element (DSPLIT threads per column, each taking every DSPLIT-th channel, summed
// by shuffles; whole warps take this path as NDIAG is a multiple of 32).
template <int C> __device__ __forceinline__ void prep_diag_scores(int t, const prep_smem<C> &s)
{
    constexpr int DK = prep_shape<C>::DK, LD = prep_shape<C>::LD, CL = prep_shape<C>::CL;
    constexpr int DS = prep_shape<C>::DSPLIT;
    const int i = t / (16 * DS), cc = (t / DS) % 16, qd = t % DS;
    const int n = i * 16, c = n + cc;
    float aq[16], ak[16];
#pragma unroll
    for (int rr = 0; rr < 16; rr++) aq[rr] = ak[rr] = 0.0f;
    for (int dd = qd; dd < DK; dd += DS) {
        const float kc = s.ks[c * LD + dd];
        float f = 1.0f;
#pragma unroll
        for (int rr = 0; rr < 16; rr++) {
            if (rr >= cc) {
                const int r = n + rr;
                if (rr > cc) f *= s.sa[r * LD + dd];
                const float kf = kc * f;
                aq[rr] = fmaf(s.qs[r * LD + dd], kf, aq[rr]);
                ak[rr] = fmaf(s.ks[r * LD + dd], kf, ak[rr]);
            }
        }
    }
#pragma unroll
    for (int x = 1; x < DS; x <<= 1)
#pragma unroll
        for (int rr = 0; rr < 16; rr++) {
            aq[rr] += __shfl_xor_sync(0xffffffffu, aq[rr], x);
            ak[rr] += __shfl_xor_sync(0xffffffffu, ak[rr], x);
        }
    if (qd == 0) {
#pragma unroll
        for (int rr = 0; rr < 16; rr++) {
            if (rr >= cc) s.accq[(n + rr) * CL + c] += aq[rr];
            if (rr > cc) s.acck[(n + rr) * CL + c] += ak[rr];
        }
    }
}

// Step 4, off-diagonal task u: one 4 x 4 register tile of block (i, j), i > j, as the
// factored product (rows scaled from their sub-chunk's first row, columns to their last,
// the middle factor between).
template <int C> __device__ __forceinline__ void prep_offdiag_scores(int u, const prep_smem<C> &s)
{
    constexpr int NS = prep_shape<C>::NS, DK = prep_shape<C>::DK, LD = prep_shape<C>::LD;
    constexpr int CL = prep_shape<C>::CL;
    const int pair = u / 16, tile = u % 16;
    int i = 1;
    while ((i + 1) * i / 2 <= pair) i++;
    const int j = pair - i * (i - 1) / 2;
    const int r0 = i * 16 + (tile / 4) * 4, c0 = j * 16 + (tile % 4) * 4;
    const float *md = s.mid + (i * NS + j) * DK;
    float aq[4][4], ak[4][4];
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 4; b++) aq[a][b] = ak[a][b] = 0.0f;
    for (int dd = 0; dd < DK; dd++) {
        const float m = md[dd];
        float z[4];
#pragma unroll
        for (int b = 0; b < 4; b++) z[b] = m * s.ky[(c0 + b) * LD + dd];
#pragma unroll
        for (int a = 0; a < 4; a++) {
            const float xq = s.qx[(r0 + a) * LD + dd], xk = s.kx[(r0 + a) * LD + dd];
#pragma unroll
            for (int b = 0; b < 4; b++) {
                aq[a][b] = fmaf(xq, z[b], aq[a][b]);
                ak[a][b] = fmaf(xk, z[b], ak[a][b]);
            }
        }
    }
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 4; b++) {
            s.accq[(r0 + a) * CL + c0 + b] += aq[a][b];
            s.acck[(r0 + a) * CL + c0 + b] += ak[a][b];
        }
}

// Aqk out of the accumulators, then Tinv = (I - M)^{-1} with M = -diag(beta) Akk strictly
// lower, one column per thread: x_col = 1, x_r = -beta_r sum_{col <= c < r} Akk[r][c] x_c
// (into accq, free once Aqk is out), then Tinv and beta out.
template <int C>
__device__ __forceinline__ void prep_invert(float *item, int64_t Kp, const prep_smem<C> &s)
{
    constexpr int CL = prep_shape<C>::CL;
    const int tid = threadIdx.x;
    float *o_aqk = chunk_ws::Aqk(item, C, Kp), *o_t = chunk_ws::Tinv(item, C, Kp);
    for (int idx = tid; idx < C * C; idx += PREP_THREADS) {
        const int r = idx / C, c = idx % C;
        o_aqk[idx] = c <= r ? s.accq[r * CL + c] : 0.0f;
    }
    __syncthreads();
    if (tid < C) {
        const int col = tid;
        s.accq[col * CL + col] = 1.0f;
        for (int r = col + 1; r < C; r++) {
            float s0 = 0.0f, s1 = 0.0f;
            int c = col;
            for (; c + 1 < r; c += 2) {
                s0 = fmaf(s.acck[r * CL + c], s.accq[c * CL + col], s0);
                s1 = fmaf(s.acck[r * CL + c + 1], s.accq[(c + 1) * CL + col], s1);
            }
            if (c < r) s0 = fmaf(s.acck[r * CL + c], s.accq[c * CL + col], s0);
            s.accq[r * CL + col] = -s.rb[r] * (s0 + s1);
        }
    }
    __syncthreads();
    for (int idx = tid; idx < C * C; idx += PREP_THREADS) {
        const int r = idx / C, c = idx % C;
        o_t[idx] = c <= r ? s.accq[r * CL + c] : 0.0f;
    }
    float *o_beta = chunk_ws::beta(item, C, Kp);
    for (int r = tid; r < C; r += PREP_THREADS) o_beta[r] = s.rb[r];
}

// Builds one (chunk, value head): see chunk_ws in kda_cuda.cuh. The chunk is padded to C rows
// with q = k = 0, beta = 0 and decay factor 1, which leaves every product of the real rows
// unchanged; rows past the chunk's end come out zero (Tinv: identity rows). The channels go
// in passes of DK, each adding its share of every score; at C = 64 all score tasks of a
// pass fit one round of the block.
template <typename Elem, int C>
__global__ void __launch_bounds__(PREP_THREADS)
    chunk_prep_kernel(const linseq_kda_problem p, int64_t HV, int64_t group, int64_t gK,
                      float scale, const chunk_ws ws)
{
    using sh = prep_shape<C>;
    extern __shared__ float sm[];
    const prep_smem<C> s(sm);
    prep_item it;
    it.chunk = blockIdx.x / HV;
    it.hv = blockIdx.x % HV;
    it.h = it.hv / group;
    it.tok0 = ws.chunks[2 * it.chunk];
    it.Lc = ws.chunks[2 * it.chunk + 1];

    prep_row_factors<Elem, C>(p, HV, scale, it, s);
    for (int i = threadIdx.x; i < C * sh::CL; i += PREP_THREADS) s.accq[i] = s.acck[i] = 0.0f;
    __syncthreads();

    float *item = ws.item(it.chunk, HV, it.hv);
    for (int64_t d0 = 0; d0 < ws.Kp; d0 += sh::DK) {
        prep_load_pass<Elem, C>(p, HV, gK, it, d0, s);
        __syncthreads();
        prep_subchunk_factors<C>(s);
        __syncthreads();
        prep_chunk_decays<C>(item, ws.Kp, d0, s);
        __syncthreads();
        for (int t = threadIdx.x; t < sh::NDIAG + sh::NOFF; t += PREP_THREADS) {
            if (t < sh::NDIAG)
                prep_diag_scores<C>(t, s);
            else
                prep_offdiag_scores<C>(t - sh::NDIAG, s);
        }
        __syncthreads();
    }
    prep_invert<C>(item, ws.Kp, s);
}

// acc[m] = row r = warp + STATE_WARPS m of M [C][Kp] times column `lane` of the state tile S
// [Kp][STATE_BV]: sum_d M[r][d] S[d][lane] in order of d, 0 for rows r >= Lc. The products
// with S0 of chunk_state_kernel (kbg S0 and qg S0).
template <int RPT>
__device__ __forceinline__ void rows_times_state(const float *M, const float *S, int64_t Kp, int Lc,
                                                 int warp, int lane, float (&acc)[RPT])
{
#pragma unroll
    for (int m = 0; m < RPT; m++) acc[m] = 0.0f;
    for (int64_t d = 0; d < Kp; d += 4) {
        const float s0 = S[d * STATE_BV + lane], s1 = S[(d + 1) * STATE_BV + lane];
        const float s2 = S[(d + 2) * STATE_BV + lane], s3 = S[(d + 3) * STATE_BV + lane];
#pragma unroll
        for (int m = 0; m < RPT; m++) {
            const int r = warp + STATE_WARPS * m;
            if (r < Lc) {
                const float4 mv = __ldg(reinterpret_cast<const float4 *>(M + r * Kp + d));
                acc[m] = fmaf(mv.x, s0, acc[m]);
                acc[m] = fmaf(mv.y, s1, acc[m]);
                acc[m] = fmaf(mv.z, s2, acc[m]);
                acc[m] = fmaf(mv.w, s3, acc[m]);
            }
        }
    }
}

// One (sequence, value head, 32 columns): lane = column, warp w takes the rows w + 8m of each
// chunk product. seqs: int64 [n][3] = {first token, length, first chunk}.
template <typename Elem, int C>
__global__ void __launch_bounds__(STATE_THREADS, 2)
    chunk_state_kernel(const linseq_kda_problem p, int64_t HV, const chunk_ws ws,
                       const int64_t *__restrict__ seqs, const float *h0, float *ht, void *o_)
{
    constexpr int RPT = C / STATE_WARPS; // rows per thread
    extern __shared__ float sm[];
    const int64_t K = p.K, V = p.V, Kp = ws.Kp;
    // the state tile, double-buffered: Sbuf(cur) [Kp][32] is S0 of the chunk in progress
    float *R = sm + 2 * Kp * STATE_BV, *VN = R + C * STATE_BV;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t n = blockIdx.x / HV, hv = blockIdx.x % HV;
    const int64_t j = (int64_t)blockIdx.y * STATE_BV + lane;
    const int64_t tok0 = seqs[3 * n], len = seqs[3 * n + 1], chunk0 = seqs[3 * n + 2];
    const Elem *v = ls_in<Elem>(p.v);
    Elem *o = ls_out<Elem>(o_);
    const bool vf = p.state_v_first;
    const int64_t slot = (n * HV + hv) * K * V;

    for (int64_t d = warp; d < Kp; d += STATE_WARPS)
        sm[d * STATE_BV + lane] =
            h0 && d < K && j < V ? h0[slot + (vf ? j * K + d : d * V + j)] : 0.0f;
    __syncthreads();

    int cur = 0;
    for (int64_t ci = 0; ci * C < len; ci++) {
        const int64_t first = tok0 + ci * C;
        const int Lc = (int)(len - ci * C < C ? len - ci * C : C);
        float *item = ws.item(chunk0 + ci, HV, hv);
        const float *qg = chunk_ws::qg(item, C, Kp);
        const float *kbg = chunk_ws::kbg(item, C, Kp);
        const float *kd = chunk_ws::kd(item, C, Kp);
        const float *Aqk = chunk_ws::Aqk(item, C, Kp);
        const float *Tinv = chunk_ws::Tinv(item, C, Kp);
        const float *bet = chunk_ws::beta(item, C, Kp);
        const float *dlast = chunk_ws::dlast(item, C, Kp);
        const float *S = sm + cur * Kp * STATE_BV;
        float *Sn = sm + (cur ^ 1) * Kp * STATE_BV;
        if ((ci + 1) * C < len) prefetch_item(ws, chunk0 + ci + 1, HV, hv, tid, STATE_THREADS);

        // 1. R = diag(beta) V - kbg S0
        float acc[RPT];
        rows_times_state<RPT>(kbg, S, Kp, Lc, warp, lane, acc);
#pragma unroll
        for (int m = 0; m < RPT; m++) {
            const int r = warp + STATE_WARPS * m;
            if (r < Lc) {
                const float vv = j < V ? ls_ld(v, ((first + r) * HV + hv) * V + j) : 0.0f;
                R[r * STATE_BV + lane] = fmaf(bet[r], vv, -acc[m]);
            }
        }
        __syncthreads();
        // 2. vnew = Tinv R (unit lower triangular)
#pragma unroll
        for (int m = 0; m < RPT; m++) {
            const int r = warp + STATE_WARPS * m;
            if (r < Lc) {
                float a = 0.0f;
                for (int c = 0; c <= r; c++) a = fmaf(Tinv[r * C + c], R[c * STATE_BV + lane], a);
                VN[r * STATE_BV + lane] = a;
            }
        }
        __syncthreads();
        // 3. o = qg S0 + Aqk vnew (lower triangle, diagonal included)
        rows_times_state<RPT>(qg, S, Kp, Lc, warp, lane, acc);
#pragma unroll
        for (int m = 0; m < RPT; m++) {
            const int r = warp + STATE_WARPS * m;
            if (r < Lc) {
                float a = acc[m];
                for (int c = 0; c <= r; c++) a = fmaf(Aqk[r * C + c], VN[c * STATE_BV + lane], a);
                if (j < V) ls_st(o, ((first + r) * HV + hv) * V + j, a);
            }
        }
        // 4. S_C = diag(dlast) S0 + kd^T vnew, into the other buffer (S0 is still read above)
        for (int64_t gq = warp; gq < Kp / 4; gq += STATE_WARPS) {
            const int64_t d = 4 * gq;
            float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
            for (int r = 0; r < Lc; r++) {
                const float vn = VN[r * STATE_BV + lane];
                const float4 kv = __ldg(reinterpret_cast<const float4 *>(kd + r * Kp + d));
                a0 = fmaf(kv.x, vn, a0);
                a1 = fmaf(kv.y, vn, a1);
                a2 = fmaf(kv.z, vn, a2);
                a3 = fmaf(kv.w, vn, a3);
            }
            const float4 dl = __ldg(reinterpret_cast<const float4 *>(dlast + d));
            Sn[d * STATE_BV + lane] = fmaf(dl.x, S[d * STATE_BV + lane], a0);
            Sn[(d + 1) * STATE_BV + lane] = fmaf(dl.y, S[(d + 1) * STATE_BV + lane], a1);
            Sn[(d + 2) * STATE_BV + lane] = fmaf(dl.z, S[(d + 2) * STATE_BV + lane], a2);
            Sn[(d + 3) * STATE_BV + lane] = fmaf(dl.w, S[(d + 3) * STATE_BV + lane], a3);
        }
        __syncthreads();
        cur ^= 1;
    }
    if (ht) {
        const float *S = sm + cur * Kp * STATE_BV;
        for (int64_t d = warp; d < K; d += STATE_WARPS)
            if (j < V) ht[slot + (vf ? j * K + d : d * V + j)] = S[d * STATE_BV + lane];
    }
}

// ---------------------------------------------------------------------------------------
// bf16 tensor cores for the state kernel (chunk 64): the same chunk algebra as
// chunk_state_kernel with the five products on mma.sync m16n8k16 (bf16 operands, float32
// accumulation). The state itself stays float32 in the accumulator registers of the kernel
// for the whole sequence (warp w owns key rows [w K/4, (w+1) K/4) of the tile); each chunk
// reads it as bf16 for the products with kbg and qg, as fla does.

// D += A B for one m16n8k16 tile: a = the four 32-bit registers of the 16 x 16 row-major A
// fragment, b = the two of the 16 x 8 column-major B fragment.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The A fragment of rows [r0, r0+16) and columns [k0, k0+16) of a row-major bf16 tile with
// row stride ld; lane = 4 g + t holds (g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..).
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const __nv_bfloat16 *A, int ld, int r0,
                                       int k0, int g, int t)
{
    const __nv_bfloat16 *p = A + (r0 + g) * ld + k0 + 2 * t;
    a[0] = *reinterpret_cast<const uint32_t *>(p);
    a[1] = *reinterpret_cast<const uint32_t *>(p + 8 * ld);
    a[2] = *reinterpret_cast<const uint32_t *>(p + 8);
    a[3] = *reinterpret_cast<const uint32_t *>(p + 8 * ld + 8);
}

// The B fragment of columns [n0, n0+8) and rows [k0, k0+16) of B, stored transposed ([n][k],
// row stride ld): lane = 4 g + t holds (k = 2t..2t+1, n = g) and (k = 2t+8.., n = g).
__device__ __forceinline__ void load_b(uint32_t (&b)[2], const __nv_bfloat16 *Bt, int ld, int n0,
                                       int k0, int g, int t)
{
    const __nv_bfloat16 *p = Bt + (n0 + g) * ld + k0 + 2 * t;
    b[0] = *reinterpret_cast<const uint32_t *>(p);
    b[1] = *reinterpret_cast<const uint32_t *>(p + 8);
}

// Four floats to four consecutive bf16 (8-byte aligned destination).
__device__ __forceinline__ void store4(__nv_bfloat16 *dst, float4 x)
{
    const __nv_bfloat162 lo = __floats2bfloat162_rn(x.x, x.y), hi = __floats2bfloat162_rn(x.z, x.w);
    uint2 u;
    u.x = *reinterpret_cast<const uint32_t *>(&lo);
    u.y = *reinterpret_cast<const uint32_t *>(&hi);
    *reinterpret_cast<uint2 *>(dst) = u;
}

constexpr int MMA_THREADS = 128;
constexpr int MMA_C = 64;

template <int KT, int BV> struct mma_shape {
    static constexpr int LDK = KT + 8;    // row stride (bf16) of [.][KT] tiles: conflict-free
    static constexpr int LDC = MMA_C + 8; // row stride (bf16) of [.][C] tiles
    static constexpr size_t halves = 2 * (size_t)MMA_C * LDK   // kbg, qg
                                     + (size_t)KT * LDC        // kd^T
                                     + 2 * (size_t)MMA_C * LDC // Tinv, Aqk
                                     + (size_t)BV * LDK        // S^T
                                     + 2 * (size_t)BV * LDC;   // R^T, vnew^T
    static constexpr size_t bytes = 2 * halves + 4 * (MMA_C + KT);
};

// The shared memory of chunk_state_mma_kernel (mma_shape::bytes): the chunk's matrices as bf16
// tiles, the state's bf16 copy, and beta and dlast in float.
template <int KT, int BV> struct mma_smem {
    __nv_bfloat16 *kbg, *qg; // [C][LDK]
    __nv_bfloat16 *kdT;      // [KT][LDC] kd transposed
    __nv_bfloat16 *T, *A;    // [C][LDC] Tinv, Aqk
    __nv_bfloat16 *S;        // [BV][LDK] the state transposed
    __nv_bfloat16 *R, *VN;   // [BV][LDC] R and vnew transposed
    float *beta, *dl;        // [C], [KT]
    __device__ __forceinline__ explicit mma_smem(float *sm)
    {
        using sh = mma_shape<KT, BV>;
        kbg = reinterpret_cast<__nv_bfloat16 *>(sm);
        qg = kbg + MMA_C * sh::LDK, kdT = qg + MMA_C * sh::LDK, T = kdT + KT * sh::LDC;
        A = T + MMA_C * sh::LDC, S = A + MMA_C * sh::LDC, R = S + BV * sh::LDK;
        VN = R + BV * sh::LDC;
        beta = reinterpret_cast<float *>(VN + BV * sh::LDC), dl = beta + MMA_C;
    }
};

// The element e of accumulator fragment (mt, nt) of lane 4 g + t in warp w: key row (of the
// state) or row (of a chunk product) and column within the tile.
template <int KT> __device__ __forceinline__ int mma_state_row(int warp, int mt, int g, int e)
{
    return warp * (KT / 4) + mt * 16 + g + 8 * (e >> 1);
}
__device__ __forceinline__ int mma_col(int nt, int t, int e) { return nt * 8 + 2 * t + (e & 1); }

template <int NT> __device__ __forceinline__ void mma_zero(float (&acc)[NT][4])
{
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[nt][e] = 0.0f;
}

// acc += A[r0 .. r0+16][k0 .. k1) B[k0 .. k1][0 .. 8 NT), A row-major with row stride lda, B
// stored transposed with row stride ldb, in steps of 16 along k.
template <int NT>
__device__ __forceinline__ void mma_product(float (&acc)[NT][4], const __nv_bfloat16 *A, int lda,
                                            int r0, const __nv_bfloat16 *Bt, int ldb, int k0,
                                            int k1, int g, int t)
{
#pragma unroll 4
    for (int k = k0; k < k1; k += 16) {
        uint32_t a[4];
        load_a(a, A, lda, r0, k, g, t);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            uint32_t b[2];
            load_b(b, Bt, ldb, nt * 8, k, g, t);
            mma_bf16(acc[nt], a, b);
        }
    }
}

// The state tile from h0 (zeros without it or past K, V) into the accumulator registers.
template <int KT, int BV>
__device__ __forceinline__ void mma_load_state(float (&S)[KT / 64][BV / 8][4], const float *h0,
                                               int64_t slot, int64_t K, int64_t V, int64_t j0,
                                               bool vf, int warp, int g, int t)
{
#pragma unroll
    for (int mt = 0; mt < KT / 64; mt++)
#pragma unroll
        for (int nt = 0; nt < BV / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int64_t d = mma_state_row<KT>(warp, mt, g, e), j = j0 + mma_col(nt, t, e);
                S[mt][nt][e] = 0.0f;
                if (h0 && d < K && j < V) S[mt][nt][e] = h0[slot + (vf ? j * K + d : d * V + j)];
            }
}

template <int KT, int BV>
__device__ __forceinline__ void mma_store_state(const float (&S)[KT / 64][BV / 8][4], float *ht,
                                                int64_t slot, int64_t K, int64_t V, int64_t j0,
                                                bool vf, int warp, int g, int t)
{
#pragma unroll
    for (int mt = 0; mt < KT / 64; mt++)
#pragma unroll
        for (int nt = 0; nt < BV / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int64_t d = mma_state_row<KT>(warp, mt, g, e), j = j0 + mma_col(nt, t, e);
                if (d < K && j < V) ht[slot + (vf ? j * K + d : d * V + j)] = S[mt][nt][e];
            }
}

// The chunk's workspace item as bf16 tiles (every row of the item is written, zeros past the
// chunk's end), and the state's bf16 copy (16-byte loads: rows of Kp or C floats, Kp a
// multiple of 4, item 16-byte aligned).
template <int KT, int BV>
__device__ __forceinline__ void mma_stage_chunk(float *item, int64_t Kp,
                                                const float (&S)[KT / 64][BV / 8][4],
                                                const mma_smem<KT, BV> &s, int warp, int g, int t)
{
    constexpr int C = MMA_C, LDK = mma_shape<KT, BV>::LDK, LDC = mma_shape<KT, BV>::LDC;
    const int tid = threadIdx.x;
    const float *qg = chunk_ws::qg(item, C, Kp), *kbg = chunk_ws::kbg(item, C, Kp);
    const float *kd = chunk_ws::kd(item, C, Kp), *Aqk = chunk_ws::Aqk(item, C, Kp);
    const float *Tinv = chunk_ws::Tinv(item, C, Kp), *bet = chunk_ws::beta(item, C, Kp);
    const float *dlast = chunk_ws::dlast(item, C, Kp);
    // Each warp takes 16 rows x 2 groups of 4 columns (lane = 2 (r % 16) + group), so its kd^T
    // stores hit distinct banks: element (d, r) is 32-bit word (d LDC + r) / 2 = 36 d + r / 2,
    // whose bank is (4 d + r / 2) mod 32; the two groups of a warp differ by 4 in d (16 banks)
    // and its 16 rows span 8 words, so the 32 lanes' stores cover 16 distinct words in 16
    // banks, two lanes to a word. (A lane per group of 4 columns of one row, the obvious order,
    // puts lane l on bank 16 l + const: 16 lanes to a bank.) The 8-byte kbg and qg stores of
    // each half warp (8 rows x 2 groups: banks 4 r + 2 group + {0, 1}) stay conflict-free, and
    // each row's two groups read 32 contiguous bytes of global memory.
    static_assert(C % 16 == 0 && KT % 8 == 0 && MMA_THREADS % 32 == 0, "the warp layout below");
    for (int idx = tid; idx < C * KT / 4; idx += MMA_THREADS) {
        const int lane = idx % 32, batch = idx / 32; // batch: the warp-wide step
        const int r = 16 * (batch % (C / 16)) + lane / 2;
        const int d = 8 * (batch / (C / 16)) + 4 * (lane % 2);
        float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b = a, c = a;
        if (d < Kp) {
            a = __ldg(reinterpret_cast<const float4 *>(kbg + r * Kp + d));
            b = __ldg(reinterpret_cast<const float4 *>(qg + r * Kp + d));
            c = __ldg(reinterpret_cast<const float4 *>(kd + r * Kp + d));
        }
        store4(s.kbg + r * LDK + d, a);
        store4(s.qg + r * LDK + d, b);
        s.kdT[d * LDC + r] = __float2bfloat16_rn(c.x);
        s.kdT[(d + 1) * LDC + r] = __float2bfloat16_rn(c.y);
        s.kdT[(d + 2) * LDC + r] = __float2bfloat16_rn(c.z);
        s.kdT[(d + 3) * LDC + r] = __float2bfloat16_rn(c.w);
    }
    for (int idx = tid; idx < C * C / 4; idx += MMA_THREADS) {
        const int r = idx / (C / 4), c = 4 * (idx % (C / 4));
        store4(s.T + r * LDC + c, __ldg(reinterpret_cast<const float4 *>(Tinv + r * C + c)));
        store4(s.A + r * LDC + c, __ldg(reinterpret_cast<const float4 *>(Aqk + r * C + c)));
    }
    for (int r = tid; r < C; r += MMA_THREADS) s.beta[r] = bet[r];
    for (int d = tid; d < KT; d += MMA_THREADS) s.dl[d] = d < Kp ? dlast[d] : 0.0f;
#pragma unroll
    for (int mt = 0; mt < KT / 64; mt++)
#pragma unroll
        for (int nt = 0; nt < BV / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                s.S[mma_col(nt, t, e) * LDK + mma_state_row<KT>(warp, mt, g, e)] =
                    __float2bfloat16_rn(S[mt][nt][e]);
}

// One (sequence, value head, BV columns) over its chunks of 64; 4 warps, warp w computing
// rows [16 w, 16 w + 16) of the chunk products and key rows [w KT/4, (w+1) KT/4) of S.
template <int KT, int BV>
__global__ void __launch_bounds__(MMA_THREADS, 1)
    chunk_state_mma_kernel(const linseq_kda_problem p, int64_t HV, const chunk_ws ws,
                           const int64_t *__restrict__ seqs, const float *h0, float *ht, void *o_)
{
    using sh = mma_shape<KT, BV>;
    constexpr int C = MMA_C, LDK = sh::LDK, LDC = sh::LDC;
    constexpr int NT = BV / 8;  // n tiles
    constexpr int MT = KT / 64; // m tiles of S per warp
    extern __shared__ float sm[];
    const mma_smem<KT, BV> s(sm);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int r0 = 16 * warp;
    const int64_t K = p.K, V = p.V, Kp = ws.Kp;
    const int64_t n = blockIdx.x / HV, hv = blockIdx.x % HV, j0 = (int64_t)blockIdx.y * BV;
    const int64_t tok0 = seqs[3 * n], len = seqs[3 * n + 1], chunk0 = seqs[3 * n + 2];
    const __nv_bfloat16 *v = ls_in<__nv_bfloat16>(p.v);
    __nv_bfloat16 *o = ls_out<__nv_bfloat16>(o_);
    const int64_t slot = (n * HV + hv) * K * V;

    float S[MT][NT][4];
    mma_load_state<KT, BV>(S, h0, slot, K, V, j0, p.state_v_first, warp, g, t);
    for (int64_t ci = 0; ci * C < len; ci++) {
        const int64_t first = tok0 + ci * C;
        const int Lc = (int)(len - ci * C < C ? len - ci * C : C);
        if ((ci + 1) * C < len) prefetch_item(ws, chunk0 + ci + 1, HV, hv, tid, MMA_THREADS);
        mma_stage_chunk<KT, BV>(ws.item(chunk0 + ci, HV, hv), Kp, S, s, warp, g, t);
        __syncthreads();

        // 1. R = diag(beta) V - kbg S0, stored transposed as the B operand of step 2
        float acc[NT][4];
        mma_zero<NT>(acc);
        mma_product<NT>(acc, s.kbg, LDK, r0, s.S, LDK, 0, KT, g, t);
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = r0 + g + 8 * (e >> 1), jj = mma_col(nt, t, e);
                const int64_t j = j0 + jj;
                const float vv = r < Lc && j < V ? ls_ld(v, ((first + r) * HV + hv) * V + j) : 0.0f;
                s.R[jj * LDC + r] = __float2bfloat16_rn(fmaf(s.beta[r], vv, -acc[nt][e]));
            }
        __syncthreads();
        // 2. vnew = Tinv R: the blocks of Tinv right of the diagonal are zero
        mma_zero<NT>(acc);
        mma_product<NT>(acc, s.T, LDC, r0, s.R, LDC, 0, 16 * (warp + 1), g, t);
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                s.VN[mma_col(nt, t, e) * LDC + r0 + g + 8 * (e >> 1)] =
                    __float2bfloat16_rn(acc[nt][e]);
        __syncthreads();
        // 3. O = qg S0 + Aqk vnew
        mma_zero<NT>(acc);
        mma_product<NT>(acc, s.qg, LDK, r0, s.S, LDK, 0, KT, g, t);
        mma_product<NT>(acc, s.A, LDC, r0, s.VN, LDC, 0, 16 * (warp + 1), g, t);
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = r0 + g + 8 * (e >> 1);
                const int64_t j = j0 + mma_col(nt, t, e);
                if (r < Lc && j < V) ls_st(o, ((first + r) * HV + hv) * V + j, acc[nt][e]);
            }
            // 4. S_C = diag(dlast) S0 + kd^T vnew (registers only: no barrier against step 3)
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            const int dr = warp * (KT / 4) + mt * 16;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) S[mt][nt][e] *= s.dl[dr + g + 8 * (e >> 1)];
            mma_product<NT>(S[mt], s.kdT, LDC, dr, s.VN, LDC, 0, C, g, t);
        }
        __syncthreads();
    }
    if (ht) mma_store_state<KT, BV>(S, ht, slot, K, V, j0, p.state_v_first, warp, g, t);
}

template <int KT, int BV>
linseq_status launch_state_mma(const linseq_kda_problem *p, int64_t HV, const ls_cuda_call *call,
                               const chunk_ws &ws, const int64_t *seqs, void *o, float *ht)
{
    const size_t bytes = mma_shape<KT, BV>::bytes;
    LS_CUDA_TRY(call,
                cudaFuncSetAttribute(chunk_state_mma_kernel<KT, BV>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    const dim3 grid((unsigned)(call->n_seqs * HV), ls_blocks(p->V, BV));
    chunk_state_mma_kernel<KT, BV>
        <<<grid, MMA_THREADS, bytes, ls_stream(call)>>>(*p, HV, ws, seqs, p->h0, ht, o);
    LS_CUDA_LAUNCHED(call, "chunk_state_mma_kernel");
    return LINSEQ_OK;
}

// The state tile width for key tiles of KT: 32 columns when their grid fits in one wave (every
// CTA resident at once, by the occupancy the runtime computes for this kernel, its shared
// memory and registers), else 64, whose grid is half as large and re-reads the chunk matrices
// half as often. Each CTA walks its sequence alone, so with 32-column tiles in one wave every
// SM has work; when they would take two waves, 64-column tiles in one (or in fewer CTAs)
// finish first.
template <int KT>
linseq_status launch_state_mma_fitted(const linseq_kda_problem *p, int64_t HV,
                                      const ls_cuda_call *call, const chunk_ws &ws,
                                      const int64_t *seqs, void *o, float *ht)
{
    int sms = 0, per_sm = 0;
    LS_CUDA_TRY(call, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, call->device));
    const size_t bytes = mma_shape<KT, 32>::bytes;
    LS_CUDA_TRY(call,
                cudaFuncSetAttribute(chunk_state_mma_kernel<KT, 32>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    LS_CUDA_TRY(call, cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                          &per_sm, chunk_state_mma_kernel<KT, 32>, MMA_THREADS, bytes));
    const int64_t narrow_ctas = call->n_seqs * HV * ((p->V + 31) / 32);
    if (narrow_ctas <= (int64_t)per_sm * sms)
        return launch_state_mma<KT, 32>(p, HV, call, ws, seqs, o, ht);
    return launch_state_mma<KT, 64>(p, HV, call, ws, seqs, o, ht);
}

template <typename Elem, int C>
linseq_status launch_chunked(const linseq_kda_problem *p, int64_t HV, float scale,
                             const ls_cuda_call *call, const chunk_ws &ws, const int64_t *seqs,
                             void *o, float *ht)
{
    cudaStream_t s = ls_stream(call);
    const int64_t gK = p->decay == LINSEQ_DECAY_PER_CHANNEL ? p->K : 1;
    if (ws.n_chunks > 0) {
        const size_t prep_bytes = prep_shape<C>::floats * sizeof(float);
        LS_CUDA_TRY(call, cudaFuncSetAttribute(chunk_prep_kernel<Elem, C>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)prep_bytes));
        chunk_prep_kernel<Elem, C><<<(unsigned)(ws.n_chunks * HV), PREP_THREADS, prep_bytes, s>>>(
            *p, HV, HV / p->H, gK, scale, ws);
        LS_CUDA_LAUNCHED(call, "chunk_prep_kernel");
    }
    if (sizeof(Elem) == 2 && C == MMA_C) { // bf16: the state products on tensor cores
        if (p->K <= 64) return launch_state_mma_fitted<64>(p, HV, call, ws, seqs, o, ht);
        if (p->K <= 128) return launch_state_mma_fitted<128>(p, HV, call, ws, seqs, o, ht);
        return launch_state_mma<256, 32>(p, HV, call, ws, seqs, o, ht);
    }
    const size_t state_bytes = (size_t)(2 * ws.Kp + 2 * C) * STATE_BV * sizeof(float);
    LS_CUDA_TRY(call, cudaFuncSetAttribute(chunk_state_kernel<Elem, C>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)state_bytes));
    const dim3 grid((unsigned)(call->n_seqs * HV), ls_blocks(p->V, STATE_BV));
    chunk_state_kernel<Elem, C>
        <<<grid, STATE_THREADS, state_bytes, s>>>(*p, HV, ws, seqs, p->h0, ht, o);
    LS_CUDA_LAUNCHED(call, "chunk_state_kernel");
    return LINSEQ_OK;
}

template <typename Elem>
linseq_status forward(const linseq_kda_problem *p, int64_t HV, float scale,
                      const ls_cuda_call *call, void *o, float *ht)
{
    const int64_t n_seqs = call->n_seqs;
    if (p->K > 256)
        return ls_fail(call->fn, LINSEQ_ERR_UNSUPPORTED,
                       "K = %lld: the CUDA KDA kernels take K <= 256", (long long)p->K);
    if (n_seqs * HV > 0x7fffffffLL || (p->V + STATE_BV - 1) / STATE_BV > 65535)
        return ls_fail(call->fn, LINSEQ_ERR_UNSUPPORTED,
                       "%lld sequences x %lld value heads, V = %lld: beyond the CUDA grid",
                       (long long)n_seqs, (long long)HV, (long long)p->V);
    if (call->chunk == 0) {
        rec_params P{};
        P.p = *p;
        P.HV = HV;
        P.group = HV / p->H;
        P.gK = p->decay == LINSEQ_DECAY_PER_CHANNEL ? p->K : 1;
        P.scale = scale;
        P.cu = p->cu_seqlens;
        P.state_in = p->h0;
        P.state_out = ht;
        P.rows = nullptr;
        P.decode = false;
        P.o = o;
        return launch_recurrent<Elem>(P, n_seqs, call);
    }

    const int C = call->chunk;
    const int64_t *cu = call->cu_seqlens_host;
    // the chunk list and the sequence table, built on the host
    int64_t n_chunks = 0;
    for (int64_t n = 0; n < n_seqs; n++) {
        const int64_t len = cu ? cu[n + 1] - cu[n] : p->T;
        n_chunks += (len + C - 1) / C;
    }
    if (n_chunks * HV > 0x7fffffffLL)
        return ls_fail(call->fn, LINSEQ_ERR_UNSUPPORTED,
                       "%lld chunks x %lld value heads: beyond the CUDA grid", (long long)n_chunks,
                       (long long)HV);
    const size_t table = (size_t)(2 * n_chunks + 3 * n_seqs);
    int64_t *host = (int64_t *)malloc(table * sizeof(int64_t));
    if (!host)
        return ls_fail(call->fn, LINSEQ_ERR_OUT_OF_MEMORY, "cannot allocate the chunk table");
    int64_t *hc = host, *hs = host + 2 * n_chunks, c = 0;
    for (int64_t n = 0; n < n_seqs; n++) {
        const int64_t start = cu ? cu[n] : n * p->T, len = cu ? cu[n + 1] - cu[n] : p->T;
        hs[3 * n] = start;
        hs[3 * n + 1] = len;
        hs[3 * n + 2] = c;
        for (int64_t t = 0; t < len; t += C, c++) {
            hc[2 * c] = start + t;
            hc[2 * c + 1] = len - t < C ? len - t : C;
        }
    }

    chunk_ws ws{};
    ws.C = C;
    ws.Kp = (p->K + 3) / 4 * 4;
    ws.n_chunks = n_chunks;
    const size_t table_bytes = (table * sizeof(int64_t) + 255) / 256 * 256;
    const size_t ws_bytes = (size_t)(n_chunks * HV) * (size_t)ws.item_floats() * sizeof(float);
    ls_cuda_workspace mem;
    linseq_status st = mem.alloc(call, table_bytes + ws_bytes);
    cudaError_t err = cudaSuccess;
    if (!st)
        err = cudaMemcpyAsync(mem.ptr, host, table * sizeof(int64_t), cudaMemcpyHostToDevice,
                              ls_stream(call));
    free(host); // a pageable copy is staged before cudaMemcpyAsync returns
    if (st) return st;
    if (err != cudaSuccess)
        return ls_fail(call->fn, LINSEQ_ERR_DEVICE, "copying the chunk table to the device: %s",
                       cudaGetErrorString(err));
    ws.chunks = mem.as<int64_t>();
    ws.base = reinterpret_cast<float *>(mem.as<unsigned char>() + table_bytes);
    const int64_t *seqs = mem.as<int64_t>() + 2 * n_chunks;

    switch (C) {
    case 16: return launch_chunked<Elem, 16>(p, HV, scale, call, ws, seqs, o, ht);
    case 32: return launch_chunked<Elem, 32>(p, HV, scale, call, ws, seqs, o, ht);
    case 64: return launch_chunked<Elem, 64>(p, HV, scale, call, ws, seqs, o, ht);
    case 128: return launch_chunked<Elem, 128>(p, HV, scale, call, ws, seqs, o, ht);
    default:
        return ls_fail(call->fn, LINSEQ_ERR_INVALID_VALUE,
                       "chunk size %d; the CUDA kernels take 16, 32, 64 or 128", C);
    }
}

} // namespace

linseq_status chunk_prepare(const linseq_kda_problem *p, int64_t HV, float scale,
                            const ls_cuda_call *call, const chunk_ws &ws)
{
    if (ws.n_chunks <= 0) return LINSEQ_OK;
    const int64_t gK = p->decay == LINSEQ_DECAY_PER_CHANNEL ? p->K : 1;
    cudaStream_t s = ls_stream(call);
#define LS_PREP(Elem, CC)                                                                          \
    do {                                                                                           \
        const size_t bytes = prep_shape<CC>::floats * sizeof(float);                               \
        LS_CUDA_TRY(call, cudaFuncSetAttribute(chunk_prep_kernel<Elem, CC>,                        \
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,        \
                                               (int)bytes));                                       \
        chunk_prep_kernel<Elem, CC><<<(unsigned)(ws.n_chunks * HV), PREP_THREADS, bytes, s>>>(     \
            *p, HV, HV / p->H, gK, scale, ws);                                                     \
    } while (0)
#define LS_PREP_C(Elem)                                                                            \
    do {                                                                                           \
        switch (ws.C) {                                                                            \
        case 16: LS_PREP(Elem, 16); break;                                                         \
        case 32: LS_PREP(Elem, 32); break;                                                         \
        case 64: LS_PREP(Elem, 64); break;                                                         \
        case 128: LS_PREP(Elem, 128); break;                                                       \
        default: return ls_fail(call->fn, LINSEQ_ERR_INVALID_VALUE, "chunk size %d", ws.C);        \
        }                                                                                          \
    } while (0)
    if (call->bf16)
        LS_PREP_C(__nv_bfloat16);
    else
        LS_PREP_C(float);
#undef LS_PREP_C
#undef LS_PREP
    LS_CUDA_LAUNCHED(call, "chunk_prep_kernel");
    return LINSEQ_OK;
}

} // namespace ls_kda

extern "C" linseq_status ls_cuda_kda_forward(const linseq_kda_problem *p, int64_t HV, float scale,
                                             const ls_cuda_call *call, void *o, float *ht)
{
    return call->bf16 ? ls_kda::forward<__nv_bfloat16>(p, HV, scale, call, o, ht)
                      : ls_kda::forward<float>(p, HV, scale, call, o, ht);
}
