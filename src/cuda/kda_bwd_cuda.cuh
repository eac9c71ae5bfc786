// Internal: what the two sources of the CUDA KDA backward share (kda_backward.cu: the
// entry, the per-token kernels and the reductions; kda_backward_walk.cu: the token walk),
// beyond kda_cuda.cuh (gate, sigmoid): warp reductions in a fixed order, and the walk's
// constants, arguments and launcher.
#ifndef LS_KDA_BWD_CUDA_CUH
#define LS_KDA_BWD_CUDA_CUH

#include "cuda/cuda_common.cuh"
#include "cuda/kda_cuda.cuh"

namespace ls_kdab
{

// Butterfly sums over the 32 lanes: every lane gets the same bits, in a fixed order.
__device__ __forceinline__ float warp_sum(float x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ __forceinline__ double warp_sum(double x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// Four sums over the 32 lanes at once, every lane getting all four (in place): a
// reduce-scatter (lanes split the four columns by lane bits 4 and 3: 2 + 1 shuffles), three
// butterfly steps, then the four results gathered back (4 shuffles): 10 shuffles instead of
// the 20 of four butterflies. Lanes add in a fixed order, so the bits do not depend on timing.
__device__ __forceinline__ void warp_sum4(float (&v)[4])
{
    const int lane = threadIdx.x & 31;
    const bool hi = lane & 16, mid = lane & 8;
    // lanes with bit 4 clear keep columns 0 and 1, the others 2 and 3
    const float s0 = hi ? v[0] : v[2], s1 = hi ? v[1] : v[3];
    const float k0 = hi ? v[2] : v[0], k1 = hi ? v[3] : v[1];
    const float w0 = k0 + __shfl_xor_sync(0xffffffffu, s0, 16);
    const float w1 = k1 + __shfl_xor_sync(0xffffffffu, s1, 16);
    // then bit 3 picks one of the two: lane holds column 2 (bit 4) + (bit 3)
    float x = (mid ? w1 : w0) + __shfl_xor_sync(0xffffffffu, mid ? w0 : w1, 8);
    x += __shfl_xor_sync(0xffffffffu, x, 4);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    x += __shfl_xor_sync(0xffffffffu, x, 1);
#pragma unroll
    for (int c = 0; c < 4; c++) v[c] = __shfl_sync(0xffffffffu, x, (c >> 1) * 16 + (c & 1) * 8);
}

// The constants, arguments and launcher of the token walk (kda_backward_walk.cu), shared
// with the rest of the backward (kda_backward.cu).
constexpr int NW = 8;         // warps per walk block
constexpr int NT = NW * 32;   // threads per block of every kernel here
constexpr int TILE = 32;      // value columns per walk block
constexpr int CW = TILE / NW; // columns per warp in the walk
static_assert(CW == 4, "the walk sums its columns with warp_sum4");

enum { DECAY_NONE = 0, DECAY_HEAD = 1, DECAY_CHANNEL = 2 };

struct walk_args {
    const void *v, *d_o;       // Elem [Tn,HV,V]
    void *dv;                  // Elem [Tn,HV,V] or NULL
    const float *qs, *ks, *kq; // [Tn,H,K], [Tn,H,K], [Tn,H]
    const float *beta, *a;     // [Tn,HV], [Tn,HV,gK] (a NULL without decay)
    const float *h0, *d_ht;    // state layout or NULL
    float *dh0;
    const int64_t *cu; // device cu_seqlens or NULL
    int64_t T, n_tok, H, HV, G, K, V, n_tiles, max_segs;
    int decay, seg, mr; // mr: rows per lane (MR, or the dynamic count)
    int sub;            // tokens per sub-segment (states in shared memory; = seg
                        // for MR == 0, whose sub-segment lives in segbuf)
    int64_t seg_states; // states per block in segbuf
    bool v_first;
    float *ckpt, *segbuf, *scratch;
    float *p_dq, *p_dk, *p_dg, *p_db; // tile shares [n_tiles,Tn,HV,K] / [n_tiles,Tn,HV]
};

// Floats of the walk's cross-warp partials for rows padded to Kpad: two buffers (token
// parity) of [4][NW][Kpad] row sums, then two of [2][NW] scalars.
__host__ __device__ constexpr int64_t red_floats(int64_t Kpad) { return 8 * NW * Kpad + 4 * NW; }

// Shared memory of a walk block: the partials, then `sub` states (MR > 0); none for MR == 0.
inline size_t walk_smem(int MR, int sub)
{
    return MR > 0 ? ((size_t)red_floats(32 * MR) + (size_t)sub * MR * CW * NT) * sizeof(float) : 0;
}

// Launches the walk for call->bf16 and MR (1, 2, 4, 8: rows per lane in registers; 0: the
// dynamic count A.mr in global scratch) on n_blocks = N HV ceil(V/32) blocks.
linseq_status launch_walk(const ls_cuda_call *call, int MR, const walk_args &A, int64_t n_blocks);

} // namespace ls_kdab

#endif
