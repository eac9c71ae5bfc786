// CUDA KDA backward, the token walk (kda_bwd_walk): per (sequence, value head, 32-column
// tile), the forward recomputation with checkpoints and the reverse walk that produces dv,
// dh0 and each tile's share of dq, dk, dg and dbeta. The decomposition of the whole backward,
// its FLOPs and bytes and the reasons for this design are at the top of kda_backward.cu. The
// walk does ~32 Tn HV K V of the flops (all but ~40 Tn HV K) and all of the state traffic:
// checkpoints N HV ceil(L/seg) K V floats, sub-segment starts 2 Tn HV K V / sub floats, and
// the sub-segment's states in shared memory.
#include "cuda/kda_bwd_cuda.cuh"

namespace ls_kdab
{

__device__ __forceinline__ float row_decay(const walk_args &A, int64_t tok, int64_t hv, int64_t i)
{
    if (A.decay == DECAY_NONE) return 1.0f;
    if (A.decay == DECAY_HEAD) return A.a[tok * A.HV + hv];
    return A.a[(tok * A.HV + hv) * A.K + i];
}

// The state elements a thread owns: rows lane + 32 m (m < MR) of the columns
// warp + NW c (c < CW) of its tile. MR > 0: registers (all loops over m and c unrolled);
// MR == 0: the block's global scratch in slot order, element (m, c) at (m CW + c) NT + tid,
// so a warp's accesses are coalesced.
template <int MR> struct tile_elems {
    float x[MR][CW];
    __device__ __forceinline__ void bind(float *) {}
    __device__ __forceinline__ float get(int m, int c) const { return x[m][c]; }
    __device__ __forceinline__ void set(int m, int c, float v) { x[m][c] = v; }
};
template <> struct tile_elems<0> {
    float *p;
    __device__ __forceinline__ void bind(float *base) { p = base; }
    __device__ __forceinline__ float get(int m, int c) const
    {
        return p[(int64_t)(m * CW + c) * NT];
    }
    __device__ __forceinline__ void set(int m, int c, float v)
    {
        p[(int64_t)(m * CW + c) * NT] = v;
    }
};

// A token's row data for the lane's rows (0 beyond K, so padded rows stay exactly 0):
// the decay a, ks and qs. MR > 0: loaded once into registers; MR == 0: read when used.
template <int MR> struct row_data {
    float a[MR], k[MR], q[MR];
    __device__ __forceinline__ void load(const walk_args &A, int64_t tok, int64_t hv, int64_t h,
                                         int lane, bool with_q)
    {
        const float *ks = A.ks + (tok * A.H + h) * A.K, *qs = A.qs + (tok * A.H + h) * A.K;
#pragma unroll
        for (int m = 0; m < MR; m++) {
            const int64_t i = lane + 32 * m;
            const bool ok = i < A.K;
            a[m] = ok ? row_decay(A, tok, hv, i) : 0.0f;
            k[m] = ok ? ks[i] : 0.0f;
            q[m] = ok && with_q ? qs[i] : 0.0f;
        }
    }
    __device__ __forceinline__ float A_(int m) const { return a[m]; }
    __device__ __forceinline__ float K_(int m) const { return k[m]; }
    __device__ __forceinline__ float Q_(int m) const { return q[m]; }
};
template <> struct row_data<0> {
    const walk_args *P;
    const float *ks, *qs;
    int64_t tok, hv;
    int lane;
    __device__ __forceinline__ void load(const walk_args &A, int64_t tok_, int64_t hv_, int64_t h,
                                         int lane_, bool)
    {
        P = &A;
        tok = tok_;
        hv = hv_;
        lane = lane_;
        ks = A.ks + (tok * A.H + h) * A.K;
        qs = A.qs + (tok * A.H + h) * A.K;
    }
    __device__ __forceinline__ float A_(int m) const
    {
        const int64_t i = lane + 32 * m;
        return i < P->K ? row_decay(*P, tok, hv, i) : 0.0f;
    }
    __device__ __forceinline__ float K_(int m) const
    {
        const int64_t i = lane + 32 * m;
        return i < P->K ? ks[i] : 0.0f;
    }
    __device__ __forceinline__ float Q_(int m) const
    {
        const int64_t i = lane + 32 * m;
        return i < P->K ? qs[i] : 0.0f;
    }
};

// One forward token on the thread's elements: pred = S^T (a k) (each column's sum over the
// rows is the warp's own: lanes hold rows), u = beta (v - pred), S <- diag(a) S + k u^T.
// No block synchronisation.
template <typename Elem, int MR>
__device__ __forceinline__ void walk_step(const walk_args &A, tile_elems<MR> &S, int64_t tok,
                                          int64_t hv, int64_t h, const int64_t *jc, int lane,
                                          int mr)
{
    row_data<MR> rd;
    rd.load(A, tok, hv, h, lane, false);
    float part[CW];
#pragma unroll
    for (int c = 0; c < CW; c++) part[c] = 0.0f;
#pragma unroll
    for (int m = 0; m < (MR > 0 ? MR : mr); m++) {
        const float ak = rd.A_(m) * rd.K_(m);
#pragma unroll
        for (int c = 0; c < CW; c++) part[c] = fmaf(ak, S.get(m, c), part[c]);
    }
    const float beta = A.beta[tok * A.HV + hv];
    warp_sum4(part); // now pred
    float u[CW];
#pragma unroll
    for (int c = 0; c < CW; c++) {
        const float pred = part[c];
        const bool jok = jc[c] < A.V;
        const float vj =
            jok ? ls_ld(ls_in<Elem>((const float *)A.v), (tok * A.HV + hv) * A.V + jc[c]) : 0.0f;
        u[c] = jok ? beta * (vj - pred) : 0.0f;
    }
#pragma unroll
    for (int m = 0; m < (MR > 0 ? MR : mr); m++) {
        const float a = rd.A_(m), k = rd.K_(m);
#pragma unroll
        for (int c = 0; c < CW; c++) S.set(m, c, fmaf(k, u[c], a * S.get(m, c)));
    }
}

// Undoes token tok: dS holds dL/dS_t (o's share not yet in) and becomes dL/dS_{t-1}.
// With S = S_{t-1} (sp: the segment buffer's copy), a the decays, pred = S^T (a k),
// u = beta (v - pred), o = S_t^T qs:
//     du = dS^T k + (k . qs) do,  dv = beta du,  dbeta = du . (v - pred),  dpred = -beta du
//     dqs_i = a_i (S_i . do) + k_i (u . do)
//     dks_i = dS_i . u + qs_i (u . do) + a_i (S_i . dpred)
//     dS'_i = dS_i + qs_i do + k_i dpred,  dg_i = a_i (S_i . dS'_i),  dS_{t-1,i} = a_i dS'_i
// Column sums (du, pred) are warp sums; the row sums over the tile's columns meet across
// the warps in `red` (one __syncthreads, buffers alternating with the token parity), and
// the finish kernels add the tiles.
template <typename Elem, int MR>
__device__ __forceinline__ void walk_token(const walk_args &A, tile_elems<MR> &dS, const float *sp,
                                           float *red, int64_t Kpad, int &buf, int64_t tok,
                                           int64_t hv, int64_t h, int64_t tile, const int64_t *jc,
                                           int warp, int lane, int mr)
{
    tile_elems<MR> Sp;
    if constexpr (MR == 0) {
        Sp.bind(const_cast<float *>(sp));
    } else {
#pragma unroll
        for (int m = 0; m < MR; m++)
#pragma unroll
            for (int c = 0; c < CW; c++) Sp.set(m, c, sp[(m * CW + c) * NT]);
    }
    row_data<MR> rd;
    rd.load(A, tok, hv, h, lane, true);
    const int64_t HV = A.HV, V = A.V;
    float pp[CW], pd[CW];
#pragma unroll
    for (int c = 0; c < CW; c++) pp[c] = pd[c] = 0.0f;
#pragma unroll
    for (int m = 0; m < (MR > 0 ? MR : mr); m++) {
        const float k = rd.K_(m), ak = rd.A_(m) * k;
#pragma unroll
        for (int c = 0; c < CW; c++) {
            pp[c] = fmaf(ak, Sp.get(m, c), pp[c]);
            pd[c] = fmaf(k, dS.get(m, c), pd[c]);
        }
    }
    const float beta = A.beta[tok * HV + hv], kq = A.kq[tok * A.H + h];
    float u[CW], dov[CW], dp[CW], udo = 0.0f, db = 0.0f;
    warp_sum4(pp); // now pred
    warp_sum4(pd); // now dS^T k
#pragma unroll
    for (int c = 0; c < CW; c++) {
        const bool jok = jc[c] < V;
        const int64_t at = (tok * HV + hv) * V + jc[c];
        const float pred = pp[c];
        float du = pd[c];
        dov[c] = jok ? ls_ld(ls_in<Elem>((const float *)A.d_o), at) : 0.0f;
        const float vj = jok ? ls_ld(ls_in<Elem>((const float *)A.v), at) : 0.0f;
        const float resid = jok ? vj - pred : 0.0f;
        u[c] = beta * resid;
        du = jok ? fmaf(kq, dov[c], du) : 0.0f;
        if (A.dv && jok && lane == 0) ls_st(ls_out<Elem>(A.dv), at, beta * du);
        dp[c] = -beta * du;
        udo = fmaf(u[c], dov[c], udo);
        db = fmaf(du, resid, db);
    }
    float *rb = red + (int64_t)buf * 4 * NW * Kpad; // [4][NW][Kpad]
    float *rs = red + 8 * NW * Kpad + buf * 2 * NW; // [2][NW]
#pragma unroll
    for (int m = 0; m < (MR > 0 ? MR : mr); m++) {
        const float a = rd.A_(m), q = rd.Q_(m), k = rd.K_(m);
        float sdo = 0.0f, dsu = 0.0f, sdp = 0.0f, sds = 0.0f;
#pragma unroll
        for (int c = 0; c < CW; c++) {
            const float s = Sp.get(m, c), ds = dS.get(m, c);
            const float dsd = fmaf(k, dp[c], fmaf(q, dov[c], ds)); // dS'
            sdo = fmaf(s, dov[c], sdo);
            dsu = fmaf(ds, u[c], dsu);
            sdp = fmaf(s, dp[c], sdp);
            sds = fmaf(s, dsd, sds);
            dS.set(m, c, a * dsd);
        }
        const int64_t r = lane + 32 * m;
        rb[(0 * NW + warp) * Kpad + r] = sdo;
        rb[(1 * NW + warp) * Kpad + r] = dsu;
        rb[(2 * NW + warp) * Kpad + r] = sdp;
        rb[(3 * NW + warp) * Kpad + r] = sds;
    }
    if (lane == 0) {
        rs[warp] = udo;
        rs[NW + warp] = db;
    }
    __syncthreads();
    float udo_t = 0.0f;
#pragma unroll
    for (int w = 0; w < NW; w++) udo_t += rs[w];
    if (A.p_db && threadIdx.x == 0) {
        float d = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; w++) d += rs[NW + w];
        A.p_db[(tile * A.n_tok + tok) * HV + hv] = d;
    }
    const int64_t K = A.K, pbase = ((tile * A.n_tok + tok) * HV + hv) * K;
    const float *qs = A.qs + (tok * A.H + h) * K, *ks = A.ks + (tok * A.H + h) * K;
    for (int64_t i = threadIdx.x; i < K; i += NT) {
        float sdo = 0.0f, dsu = 0.0f, sdp = 0.0f, sds = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; w++) {
            sdo += rb[(0 * NW + w) * Kpad + i];
            dsu += rb[(1 * NW + w) * Kpad + i];
            sdp += rb[(2 * NW + w) * Kpad + i];
            sds += rb[(3 * NW + w) * Kpad + i];
        }
        const float a = row_decay(A, tok, hv, i), q = qs[i], k = ks[i];
        if (A.p_dq) A.p_dq[pbase + i] = fmaf(k, udo_t, a * sdo);
        if (A.p_dk) A.p_dk[pbase + i] = dsu + q * udo_t + a * sdp;
        if (A.p_dg) A.p_dg[pbase + i] = a * sds;
    }
    buf ^= 1;
}

// K <= 64 (MR <= 2) fits two blocks per SM (<= 128 registers, half the shared memory each);
// at K = 128 the 128-register cap would spill, so one block of 8 warps.
template <typename Elem, int MR>
__global__ void __launch_bounds__(NT, (MR > 0 && MR <= 2) ? 2 : 1) kda_bwd_walk(const walk_args A)
{
    extern __shared__ float dyn_smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t bid = blockIdx.x;
    const int64_t tile = bid % A.n_tiles, nh = bid / A.n_tiles;
    const int64_t hv = nh % A.HV, n = nh / A.HV, h = hv / A.G;
    int64_t start, len;
    if (A.cu) {
        start = A.cu[n];
        len = A.cu[n + 1] - start;
    } else {
        start = n * A.T;
        len = A.T;
    }
    const int64_t K = A.K, V = A.V;
    const int mr = MR > 0 ? MR : A.mr;
    const int64_t Kpad = 32 * (int64_t)mr;
    const int64_t tf = (int64_t)mr * CW * NT; // floats of one state tile
    int64_t jc[CW];
#pragma unroll
    for (int c = 0; c < CW; c++) jc[c] = tile * TILE + warp + NW * c;
    float *ckpt = A.ckpt + bid * A.max_segs * tf + threadIdx.x;
    float *segb = A.segbuf + bid * A.seg_states * tf + threadIdx.x;
    float *red = dyn_smem;
    // the states of one sub-segment: shared memory after the partials (MR > 0), or segbuf
    float *subb = MR > 0 ? dyn_smem + red_floats(Kpad) + threadIdx.x : segb;
    tile_elems<MR> S, dS;
    if constexpr (MR == 0) {
        float *sc = A.scratch + bid * (2 * tf + red_floats(Kpad));
        S.bind(sc + threadIdx.x);
        dS.bind(sc + tf + threadIdx.x);
        red = sc + 2 * tf;
    }
    const int64_t srow = (n * A.HV + hv) * K * V;
    auto state_at = [&](int64_t i, int64_t j) {
        return srow + (A.v_first ? j * K + i : i * V + j);
    };

#pragma unroll
    for (int m = 0; m < (MR > 0 ? MR : mr); m++)
#pragma unroll
        for (int c = 0; c < CW; c++) {
            const int64_t i = lane + 32 * m;
            S.set(m, c, A.h0 && i < K && jc[c] < V ? A.h0[state_at(i, jc[c])] : 0.0f);
        }

    // forward: the state before every segment
    const int seg = A.seg;
    const int64_t n_seg = (len + seg - 1) / seg;
    for (int64_t s = 0; s < n_seg; s++) {
#pragma unroll
        for (int m = 0; m < (MR > 0 ? MR : mr); m++)
#pragma unroll
            for (int c = 0; c < CW; c++) ckpt[s * tf + (m * CW + c) * NT] = S.get(m, c);
        if (s + 1 < n_seg)
            for (int64_t t = s * seg; t < (s + 1) * seg; t++)
                walk_step<Elem, MR>(A, S, start + t, hv, h, jc, lane, mr);
    }

    // reverse: rebuild each segment's states, then undo its tokens last to first
#pragma unroll
    for (int m = 0; m < (MR > 0 ? MR : mr); m++)
#pragma unroll
        for (int c = 0; c < CW; c++) {
            const int64_t i = lane + 32 * m;
            dS.set(m, c, A.d_ht && i < K && jc[c] < V ? A.d_ht[state_at(i, jc[c])] : 0.0f);
        }
    // Two levels inside a segment: its states every `sub` tokens go to segbuf (global, one
    // per sub-segment), then each sub-segment's states, last sub-segment first, to shared
    // memory, where the reverse tokens read them. The last sub-segment starts where the
    // first level stopped, so it needs no stored copy.
    auto store_tile = [&](float *dst) {
#pragma unroll
        for (int m = 0; m < (MR > 0 ? MR : mr); m++)
#pragma unroll
            for (int c = 0; c < CW; c++) dst[(m * CW + c) * NT] = S.get(m, c);
    };
    auto load_tile = [&](const float *src) {
#pragma unroll
        for (int m = 0; m < (MR > 0 ? MR : mr); m++)
#pragma unroll
            for (int c = 0; c < CW; c++) S.set(m, c, src[(m * CW + c) * NT]);
    };
    const int sub = A.sub;
    int buf = 0;
    for (int64_t s = n_seg - 1; s >= 0; s--) {
        const int64_t t0 = s * seg, cnt = len - t0 < seg ? len - t0 : seg;
        const int64_t n_sub = (cnt + sub - 1) / sub;
        load_tile(ckpt + s * tf);
        for (int64_t t = 0; t < (n_sub - 1) * sub; t++) {
            if (t % sub == 0) store_tile(segb + (t / sub) * tf);
            walk_step<Elem, MR>(A, S, start + t0 + t, hv, h, jc, lane, mr);
        }
        for (int64_t b = n_sub - 1; b >= 0; b--) {
            if (b < n_sub - 1) load_tile(segb + b * tf);
            const int64_t u0 = t0 + b * sub, ucnt = cnt - b * sub < sub ? cnt - b * sub : sub;
            for (int64_t t = 0; t < ucnt; t++) {
                store_tile(subb + t * tf);
                if (t + 1 < ucnt) walk_step<Elem, MR>(A, S, start + u0 + t, hv, h, jc, lane, mr);
            }
            for (int64_t t = ucnt - 1; t >= 0; t--)
                walk_token<Elem, MR>(A, dS, subb + t * tf, red, Kpad, buf, start + u0 + t, hv, h,
                                     tile, jc, warp, lane, mr);
        }
    }

    if (A.dh0) {
#pragma unroll
        for (int m = 0; m < (MR > 0 ? MR : mr); m++)
#pragma unroll
            for (int c = 0; c < CW; c++) {
                const int64_t i = lane + 32 * m;
                if (i < K && jc[c] < V) A.dh0[state_at(i, jc[c])] = dS.get(m, c);
            }
    }
}

template <typename Elem, int MR>
linseq_status launch_walk_t(const ls_cuda_call *call, const walk_args &A, int64_t n_blocks)
{
    // MR > 0: the cross-warp partials and a sub-segment's states in dynamic shared memory
    // (above the default 48 KiB); MR == 0: both in global memory.
    const size_t smem = walk_smem(MR, A.sub);
    if (smem > 48 * 1024)
        LS_CUDA_TRY(call,
                    cudaFuncSetAttribute(kda_bwd_walk<Elem, MR>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kda_bwd_walk<Elem, MR><<<(unsigned)n_blocks, NT, smem, ls_stream(call)>>>(A);
    LS_CUDA_LAUNCHED(call, "kda_bwd_walk");
    return LINSEQ_OK;
}

linseq_status launch_walk(const ls_cuda_call *call, int MR, const walk_args &A, int64_t n_blocks)
{
    if (call->bf16) {
        switch (MR) {
        case 1: return launch_walk_t<__nv_bfloat16, 1>(call, A, n_blocks);
        case 2: return launch_walk_t<__nv_bfloat16, 2>(call, A, n_blocks);
        case 4: return launch_walk_t<__nv_bfloat16, 4>(call, A, n_blocks);
        case 8: return launch_walk_t<__nv_bfloat16, 8>(call, A, n_blocks);
        default: return launch_walk_t<__nv_bfloat16, 0>(call, A, n_blocks);
        }
    }
    switch (MR) {
    case 1: return launch_walk_t<float, 1>(call, A, n_blocks);
    case 2: return launch_walk_t<float, 2>(call, A, n_blocks);
    case 4: return launch_walk_t<float, 4>(call, A, n_blocks);
    case 8: return launch_walk_t<float, 8>(call, A, n_blocks);
    default: return launch_walk_t<float, 0>(call, A, n_blocks);
    }
}

} // namespace ls_kdab
