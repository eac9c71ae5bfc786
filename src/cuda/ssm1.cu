// SSM1 (Mamba1 selective scan) on CUDA: forward and backward.
//
// Decomposition. One thread owns one (sequence, channel d, run of NB states n) and walks the
// sequence token by token with its NB states in registers. A block is a tile of 32
// consecutive channels (the lanes of a warp, so every per-token load and store of x, dt, gate,
// y is one coalesced row segment) times NG warps, warp w holding states w*NB .. w*NB+NB-1.
// Splitting N over warps multiplies the parallelism by N/NB (B*D*N/NB threads: 131072 for
// B=8, D=4096, N=16) while keeping the recurrence a single dependent FMA per token and state;
// a thread has NB independent chains. Tokens go in chunks of 32, each in three steps of
// ssm1_fwd_kernel: (A) the block stages the chunk's dt (after softplus), dt*x and x in shared
// memory, each computed once per (t, d) (fwd_stage_steps), and (when the tile lies in one
// group, as in every Mamba layer) the chunk's B_t and C_t rows (fwd_stage_bc), all with
// coalesced loads issued in batches ahead of their use; (B) every thread advances its states
// through the chunk, reading B_t and C_t with 16-byte shared broadcasts (or from global memory
// when the tile straddles groups), and leaves its partial sum_n h C per token in shared memory
// (fwd_scan_chunk); (C) the block adds the NG partials in a fixed order, the skip term and the
// gate, and stores y (fwd_chunk_out). grid.x = sequence x channel tile; grid.z = slabs of
// states when N is larger than one block holds (N > 128): each slab then writes its partial
// sums to a workspace and a second kernel finishes y. When batch x channel tiles give fewer
// than 2 blocks per SM (small B and D, e.g. single-sequence prefill) and T >= 128, each
// sequence is cut into up to T/64 pieces run in parallel (see ssm1_forward: local states, an
// in-order combine, a rerun for y): twice the exponentials but ~4 blocks per SM. NB = 4 for
// N <= 32 (the N = 16 shape: 4 warps, 80 registers, 32 KiB of shared memory, 6 blocks per
// SM), 8 for N <= 64, 16 beyond.
//
// Floor per forward call (fp32; bf16 halves the per-token bytes): reads x, dt, gate
// (3 B T D elements) and B_proj, C_proj (2 B T G N), writes y (B T D), plus h0/hT (N_seq D N
// floats each): about 16 B T D bytes for the Mamba shapes (G N << D). Work: B T D N
// exponentials and 4 B T D N flops. At B=8, T=2048, D=4096, N=16 that is 1.07 GB (0.25 ms at
// 4.3 TB/s) and 1.07e9 exp2, plus 4 MUFU ops per (t, d) for softplus and silu (1.3e9 in all:
// 0.32 ms on 132 SMs at 16 MUFU ops per clock at 1.98 GHz): the scan is as
// much MUFU-bound as memory-bound, which is why this design evaluates each exp exactly once
// (a time-parallel scan over segments would need every decay twice: once for the segment's
// local state, once again to add the carried-in state to each token's output).
//
// Backward. A first pass is the forward kernel in checkpoint mode: it stores the state
// before every 64th token of each sequence (never one state per token; (B T/64 + N_seq + 1)
// D N floats) and, with a gate, dgate (which needs the pre-gate output). The backward kernel
// (same thread mapping, NB = 4, slabs of 32 states) walks each sequence's 64-token segments
// last to first: from the segment's checkpoint it keeps a state every 8 tokens in shared
// memory (thread-private slots; bwd_segment_states), then for each 8-token piece, last first,
// stages its step inputs (bwd_stage_piece), recomputes its 8 states (and loads its B_t, C_t)
// into registers and runs the adjoint recurrence dh <- (dh + C dpre) exp(A dt) backwards
// (bwd_piece_adjoint). Per-token sums over n (dx, ddt) are summed over the warps in a fixed
// order in shared memory (bwd_token_sums); the sums over the channels of a group (dB_proj,
// dC_proj) are summed over the tile's lanes in order, written per tile (bwd_bc_sums), and a
// second kernel adds the tiles in order; dA, dD_skip, ddt_bias are kept per
// sequence and summed over sequences by a last kernel. No atomics: results are bitwise
// reproducible. Backward floor: read x, dt, gate, d_y, B_proj, C_proj, write dx, ddt, dgate
// (7 B T D elements), dB_proj, dC_proj; the checkpoint pass reads the inputs once more and the
// B T D N exponentials are evaluated 3 times (checkpoints, 8-token states, piece states; the
// adjoint reuses the last); the per-tile dB/dC partial sums add 2 ceil(D/32) B T N floats
// each way. The backward kernel holds 2 blocks of 4 warps per SM at N = 16 (~220 registers,
// 62 KiB of shared memory).
#include "cuda/ssm_common.cuh"

namespace
{

constexpr int kLanes = 32;   // channels per block tile (one warp's lanes)
constexpr int kChunk = 32;   // forward: tokens staged per chunk
constexpr int kCkpt = 64;    // backward: tokens between state checkpoints
constexpr int kSub = 8;      // backward: tokens recomputed into registers at once
constexpr int kMaxWarps = 8; // warps over N per block
constexpr int kBwdNB = 4;    // backward: states per thread
constexpr float kLog2e = 1.4426950408889634f;

static_assert(kCkpt % kChunk == 0 && kCkpt % kSub == 0, "checkpoint interval");

// B_t (or C_t) at states n0 .. n0+NB-1 of one token, from element bc: the first nv real, the
// rest 0. vec: N % 4 == 0 and the pointer aligned to 4 elements, so each run of 4 states is one
// 16-byte (float32) or 8-byte (bf16) load; all lanes of a warp usually read the same address.
template <typename E, int NB>
__device__ __forceinline__ void ld_states(const E *p, int64_t bc, int nv, int vec, float *o)
{
    if (vec) {
#pragma unroll
        for (int q = 0; q < NB; q += 4) {
            if (q < nv) {
                ls_ld_vec<E, 4>(p, bc + q, o + q);
            } else {
#pragma unroll
                for (int j = q; j < q + 4; j++) o[j] = 0.0f;
            }
        }
    } else {
#pragma unroll
        for (int j = 0; j < NB; j++) o[j] = j < nv ? ls_ld(p, bc + j) : 0.0f;
    }
}

// Where one thread of the scan kernels works: state row seq (a sequence, or with pieces one
// piece of one), channel tile `tile` from channel d0 (the lane's channel d is in group g, the
// tile's first channel in g_lo), the slab of states from nbase, and the warp's states
// n0 .. n0+NB-1 of which the first nv are real. States past N (or lanes past D) run with rate
// 0, B 0, C 0: they stay 0 and add 0.
struct scan_place {
    int tid, lane, warp, nthr, nwarps, slab, nv;
    int64_t seq, tile, d0, d, g, g_lo, nbase, n0;
    bool d_ok;
};

// The place of this thread; per_slab: the states of one slab.
template <int NB>
__device__ __forceinline__ scan_place scan_place_of(int64_t n_tiles, int64_t per_slab, int64_t D,
                                                    int64_t N, int64_t cpg)
{
    scan_place p;
    p.tid = threadIdx.x;
    p.lane = p.tid & 31;
    p.warp = p.tid >> 5;
    p.nthr = blockDim.x;
    p.nwarps = p.nthr >> 5;
    p.slab = blockIdx.z;
    p.seq = blockIdx.x / n_tiles;
    p.tile = blockIdx.x % n_tiles;
    p.d0 = p.tile * kLanes;
    p.d = p.d0 + p.lane;
    p.d_ok = p.d < D;
    p.g = (p.d_ok ? p.d : D - 1) / cpg;
    p.g_lo = p.d0 / cpg;
    p.nbase = p.slab * per_slab;
    p.n0 = p.nbase + (int64_t)p.warp * NB;
    p.nv = !p.d_ok || p.n0 >= N ? 0 : N - p.n0 < NB ? (int)(N - p.n0) : NB;
    return p;
}

// ---------------------------------------------------------------------------------------
// Forward (also the backward's checkpoint pass)

struct FwdArgs {
    const void *x, *dt, *Bp, *Cp, *gate; // per-token (Elem)
    const float *A, *Dskip, *dt_bias, *h0;
    const int64_t *cu;
    int64_t T, D, N, G, cpg, BTD;
    int64_t n_tiles, n_per_slab;
    int act;
    int softplus;
    int n_slabs;
    int vec_bc;        // B_proj, C_proj loads 4 states at a time (see ld_states)
    int64_t piece_len; // > 0: state row r is piece r % pieces of sequence r / pieces (no varlen)
    int64_t pieces;
    void *y;        // Elem, or NULL (checkpoint pass)
    float *hT;      // or NULL
    float *part;    // [n_slabs][B T D] partial sum_n h C when n_slabs > 1
    float *ckpt;    // [slots][N][D] or NULL
    const void *dy; // with dgate: the checkpoint pass writes dgate
    void *dgate;
};

// The output of token idx from out = sum_n h C: the skip term, then y or dgate. z and dy:
// gate and d_y at idx, loaded by the caller when used.
template <typename E>
__device__ __forceinline__ void fwd_finish(const FwdArgs &a, float out, int64_t idx, int64_t d,
                                           float x, float z, float dy)
{
    if (a.Dskip) out = fmaf(a.Dskip[d], x, out);
    if (a.y) ls_st(static_cast<E *>(a.y), idx, a.gate ? out * ls_dev_activate(a.act, z) : out);
    if (a.dgate) ls_st(static_cast<E *>(a.dgate), idx, dy * out * ls_dev_activate_grad(a.act, z));
}

// The tokens of state row r: a sequence, or with a.piece_len one piece of one.
__device__ __forceinline__ void piece_range(const FwdArgs &a, int64_t r, int64_t *start,
                                            int64_t *len)
{
    if (a.piece_len) {
        const int64_t off = r % a.pieces * a.piece_len;
        *start = r / a.pieces * a.T + off;
        *len = a.T - off < a.piece_len ? a.T - off : a.piece_len;
    } else {
        ls_dev_seq_range(a.cu, a.T, r, start, len);
    }
}

// Per-thread batches of the block-wide loops over a chunk: kBatch loads are issued before the
// values are used or anything is stored, so their latencies overlap (the compiler may not move
// a global load past a store that might alias it).
constexpr int kBatch = 4;

// The shared memory of ssm1_fwd_kernel, carved from one dynamic block (sized in launch_fwd_nb).
struct fwd_smem {
    float *dt, *dtx, *x; // [kChunk][32] the chunk's dt after softplus, dt * x, x
    float *y;            // [nwarps][kChunk][32] the warps' partial sum_n h C
    float *B, *C;        // [kChunk][ns_pad] B_t, C_t of the tile's group (when staged)
    __device__ __forceinline__ fwd_smem(float *sm, int nwarps, int ns_pad)
    {
        dt = sm, dtx = dt + kChunk * kLanes, x = dtx + kChunk * kLanes;
        y = x + kChunk * kLanes;
        B = y + nwarps * kChunk * kLanes, C = B + kChunk * ns_pad;
    }
};

// The thread's decay rates A log2(e) and its states from h0 (0 without h0 or past nv).
template <int NB>
__device__ __forceinline__ void fwd_load_states(const FwdArgs &a, const scan_place &p,
                                                float (&rate)[NB], float (&h)[NB])
{
    const int64_t D = a.D, N = a.N, d = p.d;
#pragma unroll
    for (int j = 0; j < NB; j++) {
        const int64_t n = p.n0 + j;
        rate[j] = (j < p.nv) ? a.A[d * N + n] * kLog2e : 0.0f;
        h[j] = (j < p.nv) && a.h0 ? a.h0[(p.seq * D + d) * N + n] : 0.0f;
    }
}

// Step (A): the step inputs of the chunk's cnt tokens from tok0, once per (token, channel):
// dt after softplus, dt * x and x (0 past cnt and past D).
template <typename E>
__device__ __forceinline__ void fwd_stage_steps(const FwdArgs &a, const scan_place &p,
                                                const fwd_smem &s, int64_t tok0, int cnt)
{
    const int tid = p.tid, nthr = p.nthr;
    const int64_t D = a.D, d0 = p.d0;
    const E *x = static_cast<const E *>(a.x), *dt = static_cast<const E *>(a.dt);
    for (int base = tid; base < kChunk * kLanes; base += kBatch * nthr) {
        float xv[kBatch], dtv[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; u++) {
            const int i = base + u * nthr, k = i >> 5;
            const int64_t dd = d0 + (i & 31);
            xv[u] = dtv[u] = 0.0f;
            if (i < kChunk * kLanes && k < cnt && dd < D) {
                xv[u] = ls_ld(x, (tok0 + k) * D + dd);
                dtv[u] = ls_ld(dt, (tok0 + k) * D + dd);
            }
        }
#pragma unroll
        for (int u = 0; u < kBatch; u++) {
            const int i = base + u * nthr;
            if (i >= kChunk * kLanes) continue;
            const int64_t dd = d0 + (i & 31);
            float v = dtv[u];
            if (a.softplus && dd < D) v = ls_dev_softplus(v + (a.dt_bias ? a.dt_bias[dd] : 0.0f));
            s.dt[i] = v;
            s.dtx[i] = v * xv[u];
            s.x[i] = xv[u];
        }
    }
}

// Step (A) for a tile inside one group: the chunk's B_t and C_t rows of the group, states
// nbase .. nbase+ns-1 of the block's ns_pad (0 past ns and past cnt).
template <typename E>
__device__ __forceinline__ void fwd_stage_bc(const FwdArgs &a, const scan_place &p,
                                             const fwd_smem &s, int64_t tok0, int cnt, int ns_pad,
                                             int ns)
{
    const int tid = p.tid, nthr = p.nthr;
    const int64_t N = a.N, GN = a.G * a.N, g_lo = p.g_lo, nbase = p.nbase;
    const E *Bp = static_cast<const E *>(a.Bp), *Cp = static_cast<const E *>(a.Cp);
    const int total = kChunk * ns_pad;
    for (int base = tid; base < total; base += kBatch * nthr) {
        float bv[kBatch], cv[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; u++) {
            const int i = base + u * nthr, k = i / ns_pad, n = i % ns_pad;
            bv[u] = cv[u] = 0.0f;
            if (i < total && k < cnt && n < ns) {
                const int64_t o = (tok0 + k) * GN + g_lo * N + nbase + n;
                bv[u] = ls_ld(Bp, o);
                cv[u] = ls_ld(Cp, o);
            }
        }
#pragma unroll
        for (int u = 0; u < kBatch; u++) {
            const int i = base + u * nthr;
            if (i < total) {
                s.B[i] = bv[u];
                s.C[i] = cv[u];
            }
        }
    }
}

// Step (B): the thread's NB states through the chunk, one dependent FMA per token and state,
// B_t and C_t from shared memory when staged (16-byte broadcasts), else from global memory;
// leaves its partial sum_n h C of each token in s.y.
template <typename E, int NB>
__device__ __forceinline__ void fwd_scan_chunk(const FwdArgs &a, const scan_place &p,
                                               const fwd_smem &s, int64_t tok0, int cnt, int ns_pad,
                                               bool staged, const float (&rate)[NB], float (&h)[NB])
{
    const int lane = p.lane, warp = p.warp, nv = p.nv;
    const int64_t N = a.N, GN = a.G * a.N;
    const E *Bp = static_cast<const E *>(a.Bp), *Cp = static_cast<const E *>(a.Cp);
    const int64_t bc0 = tok0 * GN + p.g * N + p.n0;
#pragma unroll 2
    for (int k = 0; k < cnt; k++) {
        const float dtv = s.dt[k * kLanes + lane], dtx = s.dtx[k * kLanes + lane];
        float bv[NB], cv[NB];
        if (staged) {
            const float *sb = s.B + k * ns_pad + warp * NB, *sc = s.C + k * ns_pad + warp * NB;
#pragma unroll
            for (int q = 0; q < NB; q += 4) {
                const float4 b4 = *reinterpret_cast<const float4 *>(sb + q);
                const float4 c4 = *reinterpret_cast<const float4 *>(sc + q);
                bv[q] = b4.x, bv[q + 1] = b4.y, bv[q + 2] = b4.z, bv[q + 3] = b4.w;
                cv[q] = c4.x, cv[q + 1] = c4.y, cv[q + 2] = c4.z, cv[q + 3] = c4.w;
            }
        } else {
            ld_states<E, NB>(Bp, bc0 + k * GN, nv, a.vec_bc, bv);
            ld_states<E, NB>(Cp, bc0 + k * GN, nv, a.vec_bc, cv);
        }
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < NB; j++) {
            h[j] = fmaf(ls_dev_exp2(rate[j] * dtv), h[j], dtx * bv[j]);
            acc = fmaf(h[j], cv[j], acc);
        }
        s.y[(warp * kChunk + k) * kLanes + lane] = acc;
    }
}

// Step (C): per token of the chunk, the warps' partial sums added in warp order, then the
// skip term and the gate (fwd_finish), or with slabs the slab's sum into a.part.
template <typename E>
__device__ __forceinline__ void fwd_chunk_out(const FwdArgs &a, const scan_place &p,
                                              const fwd_smem &s, int64_t tok0, int cnt)
{
    const int tid = p.tid, nthr = p.nthr, nwarps = p.nwarps;
    const int64_t D = a.D, d0 = p.d0;
    const E *gate = static_cast<const E *>(a.gate), *dy = static_cast<const E *>(a.dy);
    for (int base = tid; base < cnt * kLanes; base += kBatch * nthr) {
        float zv[kBatch], dyv[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; u++) {
            const int i = base + u * nthr;
            const int64_t dd = d0 + (i & 31), idx = (tok0 + (i >> 5)) * D + dd;
            zv[u] = dyv[u] = 0.0f;
            if (i < cnt * kLanes && dd < D && a.n_slabs == 1) {
                if (gate) zv[u] = ls_ld(gate, idx);
                if (a.dgate) dyv[u] = ls_ld(dy, idx);
            }
        }
#pragma unroll
        for (int u = 0; u < kBatch; u++) {
            const int i = base + u * nthr, k = i >> 5, l = i & 31;
            const int64_t dd = d0 + l;
            if (i >= cnt * kLanes || dd >= D) continue;
            float out = 0.0f;
            for (int w = 0; w < nwarps; w++) out += s.y[(w * kChunk + k) * kLanes + l];
            const int64_t idx = (tok0 + k) * D + dd;
            if (a.n_slabs == 1)
                fwd_finish<E>(a, out, idx, dd, s.x[i], zv[u], dyv[u]);
            else if (a.part)
                a.part[p.slab * a.BTD + idx] = out;
        }
    }
}

// At most 256 threads; with 4 states per thread at most 80 registers, so that 6 blocks of 4
// warps (the N = 16 shape) fit on an SM.
template <typename E, int NB>
__global__ void __launch_bounds__(kLanes *kMaxWarps, NB == 4   ? 3
                                                     : NB == 8 ? 2
                                                               : 1) ssm1_fwd_kernel(const FwdArgs a)
{
    extern __shared__ float smem[];
    const scan_place p = scan_place_of<NB>(a.n_tiles, a.n_per_slab, a.D, a.N, a.cpg);
    const int ns_pad = p.nwarps * NB; // states per block (zero past N)
    const fwd_smem s(smem, p.nwarps, ns_pad);
    const int64_t D = a.D, N = a.N;
    const int ns = N - p.nbase < ns_pad ? (int)(N - p.nbase) : ns_pad; // real states of the block
    // A tile inside one group (always, unless groups are narrower than the tile or straddle
    // it) stages the chunk's B_t and C_t in shared memory: one coalesced pass, then every
    // warp reads them with 16-byte broadcast loads.
    const bool staged = p.g_lo == ((p.d0 + kLanes < D ? p.d0 + kLanes : D) - 1) / a.cpg;
    int64_t start, len;
    piece_range(a, p.seq, &start, &len);

    float rate[NB], h[NB];
    fwd_load_states<NB>(a, p, rate, h);
    for (int64_t c0 = 0; c0 < len; c0 += kChunk) {
        const int cnt = len - c0 < kChunk ? (int)(len - c0) : kChunk;
        const int64_t tok0 = start + c0;
        if (a.ckpt && c0 % kCkpt == 0) {
            const int64_t slot = start / kCkpt + p.seq + c0 / kCkpt;
#pragma unroll
            for (int j = 0; j < NB; j++)
                if (j < p.nv) a.ckpt[(slot * N + p.n0 + j) * D + p.d] = h[j];
        }
        fwd_stage_steps<E>(a, p, s, tok0, cnt);
        if (staged) fwd_stage_bc<E>(a, p, s, tok0, cnt, ns_pad, ns);
        __syncthreads();
        fwd_scan_chunk<E, NB>(a, p, s, tok0, cnt, ns_pad, staged, rate, h);
        __syncthreads();
        fwd_chunk_out<E>(a, p, s, tok0, cnt);
        __syncthreads();
    }
    // Each thread read only its own h0 entries, so hT == h0 is safe.
    if (a.hT) {
#pragma unroll
        for (int j = 0; j < NB; j++)
            if (j < p.nv) a.hT[(p.seq * D + p.d) * N + p.n0 + j] = h[j];
    }
}

// With slabs: out = the slabs' partial sums in order, then as fwd_finish.
template <typename E> __global__ void ssm1_fwd_finish_kernel(const FwdArgs a)
{
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= a.BTD) return;
    float out = 0.0f;
    for (int s = 0; s < a.n_slabs; s++) out += a.part[s * a.BTD + idx];
    const int64_t d = idx % a.D;
    const float z = a.gate ? ls_ld(static_cast<const E *>(a.gate), idx) : 0.0f;
    const float dy = a.dgate ? ls_ld(static_cast<const E *>(a.dy), idx) : 0.0f;
    fwd_finish<E>(a, out, idx, d, ls_ld(static_cast<const E *>(a.x), idx), z, dy);
}

// Pieces: per (piece, channel), the sum of dt (after softplus) over the piece, whose
// exp(A sum) is the piece's decay of the state it starts from.
template <typename E>
__global__ void ssm1_piece_dt_kernel(const FwdArgs a, int64_t rows, float *sum_dt)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * a.D) return;
    const int64_t r = i / a.D, d = i % a.D;
    int64_t start, len;
    piece_range(a, r, &start, &len);
    const float bias = a.dt_bias ? a.dt_bias[d] : 0.0f;
    float acc = 0.0f;
    for (int64_t t = start; t < start + len; t++) {
        float v = ls_ld(static_cast<const E *>(a.dt), t * a.D + d);
        if (a.softplus) v = ls_dev_softplus(v + bias);
        acc += v;
    }
    sum_dt[i] = acc;
}

// Pieces: per (sequence, channel, state), the state each piece starts from, walking the
// pieces in order from h0: h <- exp(A sum_dt) h + (the piece's state from zero). hloc holds
// the pieces' states from zero and is overwritten with their start states (each thread reads
// an entry before writing it). hT: the state after the last piece (read h0 first: hT == h0
// is safe).
__global__ void ssm1_piece_combine_kernel(const FwdArgs a, int64_t n_seqs, const float *sum_dt,
                                          float *hloc, float *hT)
{
    const int64_t DN = a.D * a.N;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_seqs * DN) return;
    const int64_t s = i / DN, dn = i % DN, d = dn / a.N;
    const float rate = a.A[dn] * kLog2e;
    float h = a.h0 ? a.h0[i] : 0.0f;
    for (int64_t pc = 0; pc < a.pieces; pc++) {
        const int64_t r = s * a.pieces + pc;
        const float local = hloc[r * DN + dn];
        hloc[r * DN + dn] = h;
        h = fmaf(ls_dev_exp2(rate * sum_dt[r * a.D + d]), h, local);
    }
    if (hT) hT[i] = h;
}

// ---------------------------------------------------------------------------------------
// Backward

struct BwdArgs {
    const void *x, *dt, *Bp, *Cp, *gate, *dy; // per-token (Elem)
    const float *A, *Dskip, *dt_bias, *d_hT;
    const int64_t *cu;
    int64_t T, D, N, G, cpg, BT, BTD;
    int64_t n_tiles, slots;
    int act;
    int softplus;
    int n_slabs;
    int vec_bc;
    const float *ckpt;
    void *dx, *ddt;            // Elem or NULL
    float *dh0;                // or NULL
    float *dA_part;            // [N_seq][D N] or NULL
    float *dD_part, *db_part;  // [N_seq][D] or NULL
    float *dB_part, *dC_part;  // [n_tiles][B T][slots][N] or NULL
    float *px_part, *pdt_part; // [n_slabs][B T D] when n_slabs > 1
};

// The step inputs of token idx, channel d: dt after softplus, its softplus slope, x and
// dpre = dL/d(pre-gate output).
template <typename E>
__device__ __forceinline__ void bwd_token_inputs(const BwdArgs &a, int64_t idx, int64_t d,
                                                 float *dtv, float *spg, float *xv, float *dp)
{
    float v = ls_ld(static_cast<const E *>(a.dt), idx);
    float slope = 1.0f;
    if (a.softplus) {
        const float u = v + (a.dt_bias ? a.dt_bias[d] : 0.0f);
        v = ls_dev_softplus(u);
        slope = ls_dev_softplus_grad(u);
    }
    *dtv = v;
    *spg = slope;
    *xv = ls_ld(static_cast<const E *>(a.x), idx);
    const float dyv = ls_ld(static_cast<const E *>(a.dy), idx);
    *dp = a.gate ? dyv * ls_dev_activate(a.act, ls_ld(static_cast<const E *>(a.gate), idx)) : dyv;
}

// dx and ddt of one token from the sums over n: sx = sum_n dh B, sdt = sum_n dh (A a h + B x).
template <typename E>
__device__ __forceinline__ void bwd_token_out(const BwdArgs &a, int64_t idx, int64_t d, float dtv,
                                              float spg, float dp, float sx, float sdt,
                                              float *ddt_out)
{
    const float ddt = sdt * spg;
    if (a.dx) {
        float v = dtv * sx;
        if (a.Dskip) v = fmaf(a.Dskip[d], dp, v);
        ls_st(static_cast<E *>(a.dx), idx, v);
    }
    if (a.ddt) ls_st(static_cast<E *>(a.ddt), idx, ddt);
    *ddt_out = ddt;
}

// Backward: the row stride of the dB, dC terms, padded so that the lane sums read columns
// conflict-free.
constexpr int kRow = kLanes + 1;

// The shared memory of ssm1_bwd_kernel, carved from one dynamic block (sized in
// ssm1_backward); nblk = nwarps NB states per block.
struct bwd_smem {
    float *dt, *spg, *x, *dp; // [kSub][32] the piece's dt after softplus, its slope, x, dpre
    float *px, *pdt;          // [nwarps][kSub][32] the warps' partial sums for dx, ddt
    float *cB, *cC;           // [kSub][nblk][kRow] per (token, state, lane): dB, dC terms
    float *sub;               // [kCkpt/kSub][NB][nthr] the state every kSub tokens
    __device__ __forceinline__ bwd_smem(float *sm, int nwarps, int nblk)
    {
        dt = sm, spg = dt + kSub * kLanes, x = spg + kSub * kLanes, dp = x + kSub * kLanes;
        px = dp + kSub * kLanes, pdt = px + nwarps * kSub * kLanes;
        cB = pdt + nwarps * kSub * kLanes, cC = cB + kSub * nblk * kRow;
        sub = cC + kSub * nblk * kRow;
    }
};

// The thread's A and decay rates A log2(e), dh from d_hT (0 without it), dA zeroed; 0 past nv.
template <int NB>
__device__ __forceinline__ void bwd_load_states(const BwdArgs &a, const scan_place &p,
                                                float (&A)[NB], float (&rate)[NB], float (&dh)[NB],
                                                float (&dA)[NB])
{
    const int64_t D = a.D, N = a.N, d = p.d;
#pragma unroll
    for (int j = 0; j < NB; j++) {
        const int64_t n = p.n0 + j;
        A[j] = (j < p.nv) ? a.A[d * N + n] : 0.0f;
        rate[j] = A[j] * kLog2e;
        dh[j] = (j < p.nv) && a.d_hT ? a.d_hT[(p.seq * D + d) * N + n] : 0.0f;
        dA[j] = 0.0f;
    }
}

// The state before every kSub-th token of the segment of n_sub pieces from token t_seg of
// the sequence (from start), walked from its checkpoint slot into s.sub (thread-private
// slots: no barrier needed).
template <typename E, int NB>
__device__ __forceinline__ void bwd_segment_states(const BwdArgs &a, const scan_place &p,
                                                   const bwd_smem &s, int64_t start, int64_t t_seg,
                                                   int n_sub, int64_t slot, const float (&rate)[NB])
{
    const int tid = p.tid, nthr = p.nthr, nv = p.nv;
    const int64_t D = a.D, N = a.N, GN = a.G * a.N, d = p.d, g = p.g, n0 = p.n0;
    const E *Bp = static_cast<const E *>(a.Bp);
    float h[NB];
#pragma unroll
    for (int j = 0; j < NB; j++) h[j] = (j < nv) ? a.ckpt[(slot * N + n0 + j) * D + d] : 0.0f;
    for (int sub = 0; sub < n_sub; sub++) {
#pragma unroll
        for (int j = 0; j < NB; j++) s.sub[(sub * NB + j) * nthr + tid] = h[j];
        if (sub == n_sub - 1) break;
        for (int k = 0; k < kSub; k++) {
            const int64_t t = start + t_seg + sub * kSub + k;
            float dtv = 0.0f, xv = 0.0f;
            if (p.d_ok) {
                dtv = ls_ld(static_cast<const E *>(a.dt), t * D + d);
                if (a.softplus) dtv = ls_dev_softplus(dtv + (a.dt_bias ? a.dt_bias[d] : 0.0f));
                xv = ls_ld(static_cast<const E *>(a.x), t * D + d);
            }
            const float dtx = dtv * xv;
            float bv[NB];
            ld_states<E, NB>(Bp, t * GN + g * N + n0, nv, a.vec_bc, bv);
#pragma unroll
            for (int j = 0; j < NB; j++) h[j] = fmaf(ls_dev_exp2(rate[j] * dtv), h[j], dtx * bv[j]);
        }
    }
}

// Step (A): the step inputs of the piece's cnt tokens from tok0 (0 past cnt and past D).
template <typename E>
__device__ __forceinline__ void bwd_stage_piece(const BwdArgs &a, const scan_place &p,
                                                const bwd_smem &s, int64_t tok0, int cnt)
{
    const int64_t D = a.D;
    for (int i = p.tid; i < kSub * kLanes; i += p.nthr) {
        const int k = i >> 5, l = i & 31;
        const int64_t dd = p.d0 + l;
        float dtv = 0.0f, spg = 0.0f, xv = 0.0f, dp = 0.0f;
        if (k < cnt && dd < D)
            bwd_token_inputs<E>(a, (tok0 + k) * D + dd, dd, &dtv, &spg, &xv, &dp);
        s.dt[i] = dtv;
        s.spg[i] = spg;
        s.x[i] = xv;
        s.dp[i] = dp;
    }
}

// B_t, C_t of the piece's tokens (0 past cnt), all loaded before the reverse loop's shared
// stores, past which the compiler could not move them.
template <typename E, int NB>
__device__ __forceinline__ void bwd_piece_bc(const BwdArgs &a, const scan_place &p, int64_t tok0,
                                             int cnt, float (&bk)[kSub][NB], float (&ck)[kSub][NB])
{
    const int64_t N = a.N, GN = a.G * a.N;
    const E *Bp = static_cast<const E *>(a.Bp), *Cp = static_cast<const E *>(a.Cp);
#pragma unroll
    for (int k = 0; k < kSub; k++) {
        if (k < cnt) {
            const int64_t bc = (tok0 + k) * GN + p.g * N + p.n0;
            ld_states<E, NB>(Bp, bc, p.nv, a.vec_bc, bk[k]);
            ld_states<E, NB>(Cp, bc, p.nv, a.vec_bc, ck[k]);
        } else {
#pragma unroll
            for (int j = 0; j < NB; j++) bk[k][j] = ck[k][j] = 0.0f;
        }
    }
}

// Step (B) of piece `sub`: its states into registers from s.sub, then the adjoint recurrence
// dh <- (dh + C dpre) exp(A dt) backwards over its tokens, accumulating dA; leaves the
// per-token partial sums over the warp's states (s.px, s.pdt) and the dB, dC terms (s.cB,
// s.cC).
template <typename E, int NB>
__device__ __forceinline__ void bwd_piece_adjoint(const BwdArgs &a, const scan_place &p,
                                                  const bwd_smem &s, int64_t tok0, int cnt, int sub,
                                                  const float (&A)[NB], const float (&rate)[NB],
                                                  float (&dh)[NB], float (&dA)[NB])
{
    const int tid = p.tid, lane = p.lane, warp = p.warp, nthr = p.nthr;
    const int nblk = p.nwarps * NB;
    float hs[kSub + 1][NB], bk[kSub][NB], ck[kSub][NB], ak[kSub][NB];
    bwd_piece_bc<E, NB>(a, p, tok0, cnt, bk, ck);
#pragma unroll
    for (int j = 0; j < NB; j++) hs[0][j] = s.sub[(sub * NB + j) * nthr + tid];
#pragma unroll
    for (int k = 0; k < kSub; k++) {
        const float dtv = s.dt[k * kLanes + lane]; // 0 past cnt: the state stays
        const float dtx = dtv * s.x[k * kLanes + lane];
#pragma unroll
        for (int j = 0; j < NB; j++) {
            ak[k][j] = ls_dev_exp2(rate[j] * dtv); // kept for the adjoint
            hs[k + 1][j] = fmaf(ak[k][j], hs[k][j], dtx * bk[k][j]);
        }
    }
#pragma unroll
    for (int k = kSub - 1; k >= 0; k--) {
        if (k < cnt) {
            const float dtv = s.dt[k * kLanes + lane], xv = s.x[k * kLanes + lane];
            const float dp = s.dp[k * kLanes + lane];
            float sx = 0.0f, sdt = 0.0f;
#pragma unroll
            for (int j = 0; j < NB; j++) {
                const float bv = bk[k][j], cv = ck[k][j];
                const float decay = ak[k][j];
                const float dhj = fmaf(cv, dp, dh[j]); // all of dL/dh_t
                const float ah = decay * hs[k][j];     // exp(A dt) h_{t-1}
                const int row = (k * nblk + warp * NB + j) * kRow + lane;
                s.cC[row] = dp * hs[k + 1][j];
                s.cB[row] = dhj * dtv * xv;
                sx = fmaf(dhj, bv, sx);
                sdt = fmaf(dhj, fmaf(A[j], ah, bv * xv), sdt);
                dA[j] = fmaf(dhj * dtv, ah, dA[j]);
                dh[j] = dhj * decay;
            }
            s.px[(warp * kSub + k) * kLanes + lane] = sx;
            s.pdt[(warp * kSub + k) * kLanes + lane] = sdt;
        }
    }
}

// Step (C), warp 0, lane's channel inside D: per token of the piece, last first, the warps'
// partial sums added in warp order; then dx and ddt, and the sequence's dD_skip and ddt_bias
// sums (sum_dD, sum_db), or with slabs the slab's sums into px_part, pdt_part.
template <typename E>
__device__ __forceinline__ void bwd_token_sums(const BwdArgs &a, const scan_place &p,
                                               const bwd_smem &s, int64_t tok0, int cnt,
                                               float *sum_dD, float *sum_db)
{
    const int lane = p.lane, nwarps = p.nwarps;
    const int64_t D = a.D, d = p.d;
    for (int k = cnt - 1; k >= 0; k--) {
        float sx = 0.0f, sdt = 0.0f;
        for (int w = 0; w < nwarps; w++) {
            sx += s.px[(w * kSub + k) * kLanes + lane];
            sdt += s.pdt[(w * kSub + k) * kLanes + lane];
        }
        const int64_t idx = (tok0 + k) * D + d;
        if (a.n_slabs > 1) {
            a.px_part[p.slab * a.BTD + idx] = sx;
            a.pdt_part[p.slab * a.BTD + idx] = sdt;
        } else {
            const int i = k * kLanes + lane;
            float ddt;
            bwd_token_out<E>(a, idx, d, s.dt[i], s.spg[i], s.dp[i], sx, sdt, &ddt);
            *sum_dD = fmaf(s.dp[i], s.x[i], *sum_dD);
            *sum_db += ddt;
        }
    }
}

// Step (C), dB and dC: per (token, state of the block), the terms summed over the tile's
// lanes in lane order, one sum per group the tile covers, written per tile (summed over the
// tiles by ssm1_bc_reduce_kernel).
__device__ __forceinline__ void bwd_bc_sums(const BwdArgs &a, const scan_place &p,
                                            const bwd_smem &s, int64_t tok0, int cnt, int nblk)
{
    const int64_t D = a.D, N = a.N, d0 = p.d0;
    for (int i = p.tid; i < kSub * nblk; i += p.nthr) {
        const int k = i / nblk, nl = i % nblk;
        const int64_t n = p.nbase + nl;
        if (k >= cnt || n >= N) continue;
        const int64_t t = tok0 + k;
        const float *rb = s.cB + (k * nblk + nl) * kRow;
        const float *rc = s.cC + (k * nblk + nl) * kRow;
        const int lanes = D - d0 < kLanes ? (int)(D - d0) : kLanes;
        int l = 0;
        while (l < lanes) {
            const int64_t gg = (d0 + l) / a.cpg;
            const int64_t gend = (gg + 1) * a.cpg - d0;
            const int end = gend < lanes ? (int)gend : lanes;
            float sb = 0.0f, sc = 0.0f;
            for (; l < end; l++) {
                sb += rb[l];
                sc += rc[l];
            }
            const int64_t o = ((p.tile * a.BT + t) * a.slots + (gg - p.g_lo)) * N + n;
            if (a.dB_part) a.dB_part[o] = sb;
            if (a.dC_part) a.dC_part[o] = sc;
        }
    }
}

// Walks each sequence's kCkpt-token segments last to first; in each, its kSub-token pieces
// last to first (see the top of the file).
template <typename E>
__global__ void __launch_bounds__(kLanes *kMaxWarps) ssm1_bwd_kernel(const BwdArgs a)
{
    constexpr int NB = kBwdNB;
    extern __shared__ float smem[];
    const scan_place p = scan_place_of<NB>(a.n_tiles, (int64_t)kMaxWarps * NB, a.D, a.N, a.cpg);
    const int nblk = p.nwarps * NB;
    const bwd_smem s(smem, p.nwarps, nblk);
    const int64_t D = a.D, N = a.N;
    int64_t start, len;
    ls_dev_seq_range(a.cu, a.T, p.seq, &start, &len);

    float A[NB], rate[NB], dh[NB], dA[NB];
    bwd_load_states<NB>(a, p, A, rate, dh, dA);
    float sum_dD = 0.0f, sum_db = 0.0f; // warp 0: this lane's dD_skip, ddt_bias over the sequence
    const int64_t n_seg = (len + kCkpt - 1) / kCkpt;
    for (int64_t seg = n_seg - 1; seg >= 0; seg--) {
        const int64_t t_seg = seg * kCkpt;
        const int seg_len = len - t_seg < kCkpt ? (int)(len - t_seg) : kCkpt;
        const int n_sub = (seg_len + kSub - 1) / kSub;
        const int64_t slot = start / kCkpt + p.seq + seg;
        bwd_segment_states<E, NB>(a, p, s, start, t_seg, n_sub, slot, rate);
        for (int sub = n_sub - 1; sub >= 0; sub--) {
            const int64_t tb = t_seg + sub * kSub; // first token, relative to the sequence
            const int cnt = len - tb < kSub ? (int)(len - tb) : kSub;
            const int64_t tok0 = start + tb;
            bwd_stage_piece<E>(a, p, s, tok0, cnt);
            __syncthreads();
            bwd_piece_adjoint<E, NB>(a, p, s, tok0, cnt, sub, A, rate, dh, dA);
            __syncthreads();
            if (p.warp == 0 && p.d_ok) bwd_token_sums<E>(a, p, s, tok0, cnt, &sum_dD, &sum_db);
            if (a.dB_part || a.dC_part) bwd_bc_sums(a, p, s, tok0, cnt, nblk);
            __syncthreads();
        }
    }
#pragma unroll
    for (int j = 0; j < NB; j++) {
        if (!(j < p.nv)) continue;
        const int64_t o = (p.seq * D + p.d) * N + p.n0 + j;
        if (a.dh0) a.dh0[o] = dh[j];
        if (a.dA_part) a.dA_part[o] = dA[j];
    }
    if (p.warp == 0 && p.d_ok && a.n_slabs == 1) {
        if (a.dD_part) a.dD_part[p.seq * D + p.d] = sum_dD;
        if (a.db_part) a.db_part[p.seq * D + p.d] = sum_db;
    }
}

// With slabs: per (sequence, channel), dx and ddt from the slabs' partial sums, and the
// sequence's dD_skip and ddt_bias sums, token by token in order.
template <typename E> __global__ void ssm1_bwd_finish_kernel(const BwdArgs a, int64_t n_seqs)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_seqs * a.D) return;
    const int64_t seq = i / a.D, d = i % a.D;
    int64_t start, len;
    ls_dev_seq_range(a.cu, a.T, seq, &start, &len);
    float sum_dD = 0.0f, sum_db = 0.0f;
    for (int64_t t = start + len - 1; t >= start; t--) {
        const int64_t idx = t * a.D + d;
        float sx = 0.0f, sdt = 0.0f;
        for (int s = 0; s < a.n_slabs; s++) {
            sx += a.px_part[s * a.BTD + idx];
            sdt += a.pdt_part[s * a.BTD + idx];
        }
        float dtv, spg, xv, dp, ddt;
        bwd_token_inputs<E>(a, idx, d, &dtv, &spg, &xv, &dp);
        bwd_token_out<E>(a, idx, d, dtv, spg, dp, sx, sdt, &ddt);
        sum_dD = fmaf(dp, xv, sum_dD);
        sum_db += ddt;
    }
    if (a.dD_part) a.dD_part[seq * a.D + d] = sum_dD;
    if (a.db_part) a.db_part[seq * a.D + d] = sum_db;
}

// dB_proj, dC_proj [B T][G][N]: the tiles covering each group, in tile order.
template <typename E> __global__ void ssm1_bc_reduce_kernel(const BwdArgs a, void *dB, void *dC)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t GN = a.G * a.N;
    if (i >= a.BT * GN) return;
    const int64_t t = i / GN, g = (i % GN) / a.N, n = i % a.N;
    const int64_t tile_lo = g * a.cpg / kLanes, tile_hi = ((g + 1) * a.cpg - 1) / kLanes;
    float sb = 0.0f, sc = 0.0f;
    for (int64_t tile = tile_lo; tile <= tile_hi; tile++) {
        const int64_t o = ((tile * a.BT + t) * a.slots + (g - tile * kLanes / a.cpg)) * a.N + n;
        if (dB) sb += a.dB_part[o];
        if (dC) sc += a.dC_part[o];
    }
    if (dB) ls_st(static_cast<E *>(dB), i, sb);
    if (dC) ls_st(static_cast<E *>(dC), i, sc);
}

// out[i] = sum over rows of part[row][i], rows in order.
__global__ void ssm1_sum_rows_kernel(const float *part, int64_t rows, int64_t count, float *out)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    float s = 0.0f;
    for (int64_t r = 0; r < rows; r++) s += part[r * count + i];
    out[i] = s;
}

// ---------------------------------------------------------------------------------------
// Host side

// Carves aligned pieces out of one workspace allocation (sized by a first pass with base 0).
struct Carver {
    char *base;
    size_t used = 0;
    float *take(size_t floats, bool want)
    {
        if (!want) return nullptr;
        used = (used + 255) & ~(size_t)255;
        float *p = base ? reinterpret_cast<float *>(base + used) : nullptr;
        used += floats * sizeof(float);
        return p;
    }
};

// The states per thread of the forward, and the states per slab.
int fwd_nb(int64_t N) { return N <= 4 * kMaxWarps ? 4 : N <= 8 * kMaxWarps ? 8 : 16; }

FwdArgs fwd_args(const linseq_ssm1_problem *p, const ls_cuda_call *call)
{
    FwdArgs a = {};
    a.x = p->x;
    a.dt = p->dt;
    a.Bp = p->B_proj;
    a.Cp = p->C_proj;
    a.gate = p->gate;
    a.A = p->A;
    a.Dskip = p->D_skip;
    a.dt_bias = p->dt_bias;
    a.h0 = p->h0;
    a.cu = p->cu_seqlens;
    a.T = p->T;
    a.D = p->D;
    a.N = p->N;
    a.G = p->G > 0 ? p->G : 1;
    a.cpg = p->D / a.G;
    a.BTD = p->B * p->T * p->D;
    a.n_tiles = (p->D + kLanes - 1) / kLanes;
    const int nb = fwd_nb(p->N);
    a.n_per_slab = (int64_t)nb * kMaxWarps;
    a.n_slabs = (int)((p->N + a.n_per_slab - 1) / a.n_per_slab);
    a.act = p->gate_activation == LINSEQ_ACT_DEFAULT ? LINSEQ_ACT_SILU : p->gate_activation;
    a.softplus = p->dt_softplus ? 1 : 0;
    const uintptr_t align = (call->bf16 ? 2 : 4) * 4;
    a.vec_bc =
        p->N % 4 == 0 && (uintptr_t)p->B_proj % align == 0 && (uintptr_t)p->C_proj % align == 0;
    return a;
}

template <typename E, int NB>
linseq_status launch_fwd_nb(const FwdArgs &a, const ls_cuda_call *call, int64_t n_seqs)
{
    const int64_t per_slab = a.N < a.n_per_slab ? a.N : a.n_per_slab;
    const int warps = (int)((per_slab + NB - 1) / NB);
    const dim3 grid((unsigned)(n_seqs * a.n_tiles), 1, (unsigned)a.n_slabs);
    const size_t smem =
        ((size_t)(3 + warps) * kChunk * kLanes + (size_t)2 * kChunk * warps * NB) * sizeof(float);
    if (smem > 48 * 1024)
        LS_CUDA_TRY(call,
                    cudaFuncSetAttribute(ssm1_fwd_kernel<E, NB>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    ssm1_fwd_kernel<E, NB><<<grid, warps * kLanes, smem, ls_stream(call)>>>(a);
    LS_CUDA_LAUNCHED(call, "ssm1_fwd_kernel");
    if (a.n_slabs > 1 && a.part) {
        ssm1_fwd_finish_kernel<E><<<ls_blocks(a.BTD, 256), 256, 0, ls_stream(call)>>>(a);
        LS_CUDA_LAUNCHED(call, "ssm1_fwd_finish_kernel");
    }
    return LINSEQ_OK;
}

template <typename E>
linseq_status launch_fwd(const FwdArgs &a, const ls_cuda_call *call, int64_t n_seqs)
{
    switch (fwd_nb(a.N)) {
    case 4: return launch_fwd_nb<E, 4>(a, call, n_seqs);
    case 8: return launch_fwd_nb<E, 8>(a, call, n_seqs);
    default: return launch_fwd_nb<E, 16>(a, call, n_seqs);
    }
}

// Checks that the grid fits (grid.x < 2^31, slabs < 2^16).
linseq_status check_grid(const ls_cuda_call *call, int64_t blocks, int64_t slabs)
{
    if (blocks >= INT32_MAX || slabs > 65535)
        return ls_fail(call->fn, LINSEQ_ERR_UNSUPPORTED,
                       "the problem needs %lld x %lld blocks, more than a CUDA grid holds",
                       (long long)blocks, (long long)slabs);
    return LINSEQ_OK;
}

template <typename E>
linseq_status ssm1_forward(const linseq_ssm1_problem *p, const ls_cuda_call *call, void *y,
                           float *hT)
{
    FwdArgs a = fwd_args(p, call);
    a.y = y;
    a.hT = hT;
    const int64_t n_seqs = call->n_seqs;
    linseq_status st = check_grid(call, n_seqs * a.n_tiles, a.n_slabs);
    if (st) return st;

    // Too few blocks to fill the GPU (small batch, few channels), and long sequences: split
    // each sequence into pieces run in parallel. Pass 1 runs each piece from the zero state
    // (its local end state); a small kernel combines them in order into each piece's start
    // state and hT; pass 2 reruns the pieces from those states and writes y. Twice the
    // exponentials, for up to ~4 blocks per SM instead of a few per GPU. Varlen keeps the
    // direct path.
    int64_t pieces = 1, piece_len = 0;
    const int64_t blocks = n_seqs * a.n_tiles * a.n_slabs;
    if (!p->cu_seqlens && p->T >= 4 * kChunk) {
        int sms = 0;
        if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, call->device) !=
            cudaSuccess) {
            (void)cudaGetLastError();
            sms = 0;
        }
        if (sms > 0 && blocks < 2 * (int64_t)sms) {
            const int64_t want = (4 * (int64_t)sms + blocks - 1) / blocks;
            const int64_t most = p->T / (2 * kChunk);
            const int64_t P = want < most ? want : most;
            if (P >= 2) {
                piece_len = ((p->T + P - 1) / P + kChunk - 1) / kChunk * kChunk;
                pieces = (p->T + piece_len - 1) / piece_len;
            }
        }
    }
    const int64_t rows = n_seqs * pieces;
    if (pieces > 1 && (st = check_grid(call, rows * a.n_tiles, a.n_slabs))) return st;

    ls_cuda_workspace ws;
    float *part = nullptr, *hloc = nullptr, *sum_dt = nullptr;
    for (int pass = 0; pass < 2; pass++) {
        Carver c{pass ? ws.as<char>() : nullptr};
        part = c.take((size_t)a.n_slabs * (size_t)a.BTD, a.n_slabs > 1);
        hloc = c.take((size_t)rows * (size_t)(a.D * a.N), pieces > 1);
        sum_dt = c.take((size_t)rows * (size_t)a.D, pieces > 1);
        if (!c.used) break;
        if (!pass && (st = ws.alloc(call, c.used))) return st;
    }
    a.part = part;
    if (pieces == 1) return launch_fwd<E>(a, call, n_seqs);

    FwdArgs local = a; // pass 1: each piece from zero, its end state only
    local.piece_len = piece_len;
    local.pieces = pieces;
    local.h0 = nullptr;
    local.hT = hloc;
    local.y = nullptr;
    local.part = nullptr;
    if ((st = launch_fwd<E>(local, call, rows))) return st;
    ssm1_piece_dt_kernel<E>
        <<<ls_blocks(rows * a.D, 128), 128, 0, ls_stream(call)>>>(local, rows, sum_dt);
    LS_CUDA_LAUNCHED(call, "ssm1_piece_dt_kernel");
    local.h0 = a.h0;
    ssm1_piece_combine_kernel<<<ls_blocks(n_seqs * a.D * a.N, 256), 256, 0, ls_stream(call)>>>(
        local, n_seqs, sum_dt, hloc, hT);
    LS_CUDA_LAUNCHED(call, "ssm1_piece_combine_kernel");
    FwdArgs run = a; // pass 2: each piece from its start state, y
    run.piece_len = piece_len;
    run.pieces = pieces;
    run.h0 = hloc;
    run.hT = nullptr;
    return launch_fwd<E>(run, call, rows);
}

template <typename E>
linseq_status ssm1_backward(const linseq_ssm1_problem *p, const ls_cuda_call *call, const void *d_y,
                            const float *d_hT, const linseq_ssm1_grads *gr)
{
    const int64_t n_seqs = call->n_seqs;
    FwdArgs f = fwd_args(p, call);
    BwdArgs b = {};
    b.x = p->x;
    b.dt = p->dt;
    b.Bp = p->B_proj;
    b.Cp = p->C_proj;
    b.gate = p->gate;
    b.dy = d_y;
    b.A = p->A;
    b.Dskip = p->D_skip;
    b.dt_bias = p->dt_bias;
    b.d_hT = d_hT;
    b.cu = p->cu_seqlens;
    b.T = f.T;
    b.D = f.D;
    b.N = f.N;
    b.G = f.G;
    b.cpg = f.cpg;
    b.BT = p->B * p->T;
    b.BTD = f.BTD;
    b.n_tiles = f.n_tiles;
    b.act = f.act;
    b.softplus = f.softplus;
    b.vec_bc = f.vec_bc;
    const int64_t per_slab = (int64_t)kBwdNB * kMaxWarps;
    b.n_slabs = (int)((f.N + per_slab - 1) / per_slab);
    // The most groups one tile of kLanes channels meets.
    int64_t slots = 1;
    for (int64_t t = 0; t < f.n_tiles && slots < kLanes; t++) {
        const int64_t lo = t * kLanes, hi = (lo + kLanes < f.D ? lo + kLanes : f.D) - 1;
        const int64_t s = hi / f.cpg - lo / f.cpg + 1;
        if (s > slots) slots = s;
    }
    b.slots = slots;
    linseq_status st =
        check_grid(call, n_seqs * f.n_tiles, f.n_slabs > b.n_slabs ? f.n_slabs : b.n_slabs);
    if (st) return st;

    const bool want_dgate = gr->dgate && p->gate;
    const bool want_bc = gr->dB_proj || gr->dC_proj;
    const size_t BTD = (size_t)f.BTD, DN = (size_t)(f.D * f.N);
    const size_t n_slots = (size_t)(b.BT / kCkpt + n_seqs + 1);
    const size_t bc_part = (size_t)f.n_tiles * (size_t)b.BT * (size_t)slots * (size_t)f.N;
    ls_cuda_workspace ws;
    float *ckpt, *ypart, *dA_part, *dD_part, *db_part, *dB_part, *dC_part, *px, *pdt;
    for (int pass = 0; pass < 2; pass++) {
        Carver c{pass ? ws.as<char>() : nullptr};
        ckpt = c.take(n_slots * DN, true);
        ypart = c.take((size_t)f.n_slabs * BTD, want_dgate && f.n_slabs > 1);
        dA_part = c.take((size_t)n_seqs * DN, gr->dA != nullptr);
        dD_part = c.take((size_t)n_seqs * (size_t)f.D, gr->dD_skip != nullptr);
        db_part = c.take((size_t)n_seqs * (size_t)f.D, gr->ddt_bias != nullptr);
        dB_part = c.take(bc_part, gr->dB_proj != nullptr);
        dC_part = c.take(bc_part, gr->dC_proj != nullptr);
        px = c.take((size_t)b.n_slabs * BTD, b.n_slabs > 1);
        pdt = c.take((size_t)b.n_slabs * BTD, b.n_slabs > 1);
        if (!pass && (st = ws.alloc(call, c.used))) return st;
    }

    // 1. checkpoints (and dgate, which needs the pre-gate output)
    f.ckpt = ckpt;
    f.part = ypart;
    if (want_dgate) {
        f.dy = d_y;
        f.dgate = gr->dgate;
    }
    if ((st = launch_fwd<E>(f, call, n_seqs))) return st;

    // 2. the reverse walk
    b.ckpt = ckpt;
    b.dx = gr->dx;
    b.ddt = gr->ddt;
    b.dh0 = gr->dh0;
    b.dA_part = dA_part;
    b.dD_part = dD_part;
    b.db_part = db_part;
    b.dB_part = dB_part;
    b.dC_part = dC_part;
    b.px_part = px;
    b.pdt_part = pdt;
    {
        const int64_t per = f.N < per_slab ? f.N : per_slab;
        const int warps = (int)((per + kBwdNB - 1) / kBwdNB);
        const int nthr = warps * kLanes, nblk = warps * kBwdNB;
        const size_t smem =
            sizeof(float) *
            ((size_t)4 * kSub * kLanes + (size_t)2 * warps * kSub * kLanes +
             (size_t)2 * kSub * nblk * (kLanes + 1) + (size_t)(kCkpt / kSub) * kBwdNB * nthr);
        LS_CUDA_TRY(call,
                    cudaFuncSetAttribute(ssm1_bwd_kernel<E>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        const dim3 grid((unsigned)(n_seqs * f.n_tiles), 1, (unsigned)b.n_slabs);
        ssm1_bwd_kernel<E><<<grid, nthr, smem, ls_stream(call)>>>(b);
        LS_CUDA_LAUNCHED(call, "ssm1_bwd_kernel");
    }
    if (b.n_slabs > 1 && (gr->dx || gr->ddt || gr->dD_skip || gr->ddt_bias)) {
        ssm1_bwd_finish_kernel<E>
            <<<ls_blocks(n_seqs * f.D, 128), 128, 0, ls_stream(call)>>>(b, n_seqs);
        LS_CUDA_LAUNCHED(call, "ssm1_bwd_finish_kernel");
    }

    // 3. the sums over channel tiles and over sequences
    if (want_bc) {
        ssm1_bc_reduce_kernel<E><<<ls_blocks(b.BT * f.G * f.N, 256), 256, 0, ls_stream(call)>>>(
            b, gr->dB_proj, gr->dC_proj);
        LS_CUDA_LAUNCHED(call, "ssm1_bc_reduce_kernel");
    }
    struct {
        const float *part;
        int64_t count;
        float *out;
    } sums[3] = {
        {dA_part, f.D * f.N, gr->dA}, {dD_part, f.D, gr->dD_skip}, {db_part, f.D, gr->ddt_bias}};
    for (const auto &s : sums) {
        if (!s.out) continue;
        ssm1_sum_rows_kernel<<<ls_blocks(s.count, 256), 256, 0, ls_stream(call)>>>(s.part, n_seqs,
                                                                                   s.count, s.out);
        LS_CUDA_LAUNCHED(call, "ssm1_sum_rows_kernel");
    }
    return LINSEQ_OK;
}

} // namespace

extern "C" linseq_status ls_cuda_ssm1_forward(const linseq_ssm1_problem *p,
                                              const ls_cuda_call *call, void *y, float *hT)
{
    return call->bf16 ? ssm1_forward<__nv_bfloat16>(p, call, y, hT)
                      : ssm1_forward<float>(p, call, y, hT);
}

extern "C" linseq_status ls_cuda_ssm1_backward(const linseq_ssm1_problem *p,
                                               const ls_cuda_call *call, const void *d_y,
                                               const float *d_hT, const linseq_ssm1_grads *grads)
{
    return call->bf16 ? ssm1_backward<__nv_bfloat16>(p, call, d_y, d_hT, grads)
                      : ssm1_backward<float>(p, call, d_y, d_hT, grads);
}
