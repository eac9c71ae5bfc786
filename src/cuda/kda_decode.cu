// KDA single-step decode on the GPU: one token for each of B requests, whose states live in a
// pool of rows [n_rows, HV, K, V] (or V-first [n_rows, HV, V, K]) updated in place.
//
// Decomposition: one launch for all requests; one CTA of 128 threads per (request, value head,
// tile of 32 state columns), the recurrent kernel of kda_cuda.cuh with one token. The CTA
// reads its K x 32 tile of the state once into registers, reduces pred = (a k)^T S and
// o_pre = (a q)^T S, and writes the updated tile once. The thread layout follows the pool's
// layout so both the read and the write of the state are coalesced 128-byte warp accesses:
// K-major rows put the 32 lanes on 32 consecutive columns, V-first rows put them on 32
// consecutive key channels. A negative row is a padding request: its o row is zeroed and no
// state is read or written. Rows nobody names are never touched.
//
// Floor per call: 8 B HV K V bytes of state traffic (read + write, float32) plus the token's
// q, k, v, g, beta and o, against ~6 B HV K V flops: about 0.75 flop per byte, so decode is
// memory-bound by two orders of magnitude on an H100/H200 (~3.3-4.8 TB/s); the design goal
// is one read and one write of each state element, which this does.
#include "cuda/kda_cuda.cuh"

namespace
{

template <typename Elem>
linseq_status decode(const linseq_kda_problem *p, int64_t HV, float scale, const ls_cuda_call *call,
                     float *state, const int64_t *rows, void *o)
{
    ls_kda::rec_params P{};
    P.p = *p;
    P.HV = HV;
    P.group = HV / p->H;
    P.gK = p->decay == LINSEQ_DECAY_PER_CHANNEL ? p->K : 1;
    P.scale = scale;
    P.cu = nullptr;
    P.state_in = state;
    P.state_out = state;
    P.rows = rows;
    P.decode = true;
    P.o = o;
    return ls_kda::launch_recurrent<Elem>(P, p->B, call);
}

} // namespace

extern "C" linseq_status ls_cuda_kda_decode(const linseq_kda_problem *p, int64_t HV, float scale,
                                            const ls_cuda_call *call, float *state, int64_t n_rows,
                                            const int64_t *rows, void *o)
{
    (void)n_rows; // the entry point has checked every row against it
    return call->bf16 ? decode<__nv_bfloat16>(p, HV, scale, call, state, rows, o)
                      : decode<float>(p, HV, scale, call, state, rows, o);
}
