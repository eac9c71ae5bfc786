// The standalone KDA gate on the GPU, forward and backward.
//
//     default:      g = -exp(A_log[h]) softplus(g_raw + dt_bias)
//     lower bound:  g = lower_bound sigmoid(exp(A_log[h]) (g_raw + dt_bias))
//
// Decomposition. Forward: one thread per element of g (N = B*T*H*gK elements, gK = K per
// channel or 1 per head). Backward: dg_raw elementwise; ddt_bias[h,i] = sum over the B*T rows
// of dg_raw, dA_log[h] = sum over the rows and the gK channels of d_g * dg/dA_log. The sums
// run in two passes with no atomics, so every run gives the same bits: pass 1 gives each
// block of ROWS rows and 32 columns its partial column sums (in double); pass 2, one CTA per
// head, adds the partials of each column in block order, then the columns of the head.
//
// Floor. Forward reads N and writes N elements (bf16: 4N bytes, f32: 8N) with ~20 flops each:
// memory-bound, one pass. Backward reads 2N, writes N and (N / ROWS) * 16 bytes of partials:
// also memory-bound; the partial sums cost 1/ROWS of the traffic.
#include "cuda/kda_cuda.cuh"

namespace
{

using namespace ls_kda;

constexpr int GATE_THREADS = 256;

template <typename Elem>
__global__ void __launch_bounds__(GATE_THREADS)
    gate_forward_kernel(const Elem *__restrict__ g_raw, const float *__restrict__ A_log,
                        const float *__restrict__ dt_bias, float lower_bound, int64_t H, int64_t gK,
                        int64_t n, Elem *__restrict__ g)
{
    for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t col = idx % (H * gK), h = col / gK;
        const float bias = dt_bias ? dt_bias[col] : 0.0f;
        const float a_log = A_log ? A_log[h] : 0.0f;
        ls_st(g, idx, ls_kda_gatef(ls_ld(g_raw, idx), bias, a_log, lower_bound));
    }
}

// Pass 1: block (column tile x, row block y). Thread (warp w, lane l) takes column
// x*32 + l and rows y*ROWS + w, + NW, ...; the warps' sums are then added in warp order.
constexpr int BWD_ROWS = 256;
constexpr int BWD_WARPS = GATE_THREADS / 32;

template <typename Elem>
__global__ void __launch_bounds__(GATE_THREADS)
    gate_backward_partial_kernel(const Elem *__restrict__ g_raw, const Elem *__restrict__ d_g,
                                 const float *__restrict__ A_log, const float *__restrict__ dt_bias,
                                 float lower_bound, int64_t rows, int64_t H, int64_t gK,
                                 Elem *__restrict__ dg_raw, double *__restrict__ partial_bias,
                                 double *__restrict__ partial_alog)
{
    __shared__ double s_bias[BWD_WARPS][32], s_alog[BWD_WARPS][32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t cols = H * gK, col = blockIdx.x * 32 + lane;
    double sum_bias = 0.0, sum_alog = 0.0;
    if (col < cols) {
        const int64_t h = col / gK;
        const float bias = dt_bias ? dt_bias[col] : 0.0f, a_log = A_log ? A_log[h] : 0.0f;
        const int64_t r0 = (int64_t)blockIdx.y * BWD_ROWS;
        const int64_t r1 = r0 + BWD_ROWS < rows ? r0 + BWD_ROWS : rows;
        for (int64_t r = r0 + w; r < r1; r += BWD_WARPS) {
            const int64_t at = r * cols + col;
            float d_raw, d_alog;
            ls_kda_gate_gradf(ls_ld(g_raw, at), bias, a_log, lower_bound, &d_raw, &d_alog);
            const float dg = ls_ld(d_g, at);
            const float d = dg * d_raw;
            if (dg_raw) ls_st(dg_raw, at, d);
            sum_bias += (double)d;
            sum_alog += (double)(dg * d_alog);
        }
    }
    s_bias[w][lane] = sum_bias;
    s_alog[w][lane] = sum_alog;
    __syncthreads();
    if (w == 0 && col < cols) {
        double b = 0.0, a = 0.0;
        for (int i = 0; i < BWD_WARPS; i++) {
            b += s_bias[i][lane];
            a += s_alog[i][lane];
        }
        partial_bias[(int64_t)blockIdx.y * cols + col] = b;
        partial_alog[(int64_t)blockIdx.y * cols + col] = a;
    }
}

// Pass 2: one CTA per head; thread i takes the columns i, i + blockDim, ... of the head.
__global__ void __launch_bounds__(GATE_THREADS)
    gate_backward_reduce_kernel(const double *__restrict__ partial_bias,
                                const double *__restrict__ partial_alog, int64_t n_blocks,
                                int64_t H, int64_t gK, float *__restrict__ ddt_bias,
                                float *__restrict__ dA_log)
{
    __shared__ double s_alog[GATE_THREADS];
    const int64_t h = blockIdx.x, cols = H * gK;
    double alog = 0.0;
    for (int64_t i = threadIdx.x; i < gK; i += blockDim.x) {
        const int64_t col = h * gK + i;
        double b = 0.0, a = 0.0;
        for (int64_t y = 0; y < n_blocks; y++) {
            b += partial_bias[y * cols + col];
            a += partial_alog[y * cols + col];
        }
        if (ddt_bias) ddt_bias[col] = (float)b;
        alog += a;
    }
    s_alog[threadIdx.x] = alog;
    __syncthreads();
    if (threadIdx.x == 0 && dA_log) {
        double a = 0.0;
        for (int i = 0; i < GATE_THREADS; i++) a += s_alog[i];
        dA_log[h] = (float)a;
    }
}

unsigned grid_for(int64_t n)
{
    const int64_t blocks = (n + GATE_THREADS - 1) / GATE_THREADS;
    return (unsigned)(blocks < 65536 * 8 ? (blocks > 0 ? blocks : 1) : 65536 * 8);
}

template <typename Elem>
linseq_status gate_forward(const linseq_kda_gate_problem *p, const ls_cuda_call *call, void *g)
{
    const int64_t gK = p->decay == LINSEQ_DECAY_PER_CHANNEL ? p->K : 1;
    const int64_t n = p->B * p->T * p->H * gK;
    gate_forward_kernel<Elem><<<grid_for(n), GATE_THREADS, 0, ls_stream(call)>>>(
        ls_in<Elem>(p->g_raw), p->A_log, p->dt_bias, p->lower_bound, p->H, gK, n, ls_out<Elem>(g));
    LS_CUDA_LAUNCHED(call, "gate_forward_kernel");
    return LINSEQ_OK;
}

template <typename Elem>
linseq_status gate_backward(const linseq_kda_gate_problem *p, const ls_cuda_call *call,
                            const void *d_g, const linseq_kda_gate_grads *grads)
{
    const int64_t gK = p->decay == LINSEQ_DECAY_PER_CHANNEL ? p->K : 1;
    const int64_t rows = p->B * p->T, cols = p->H * gK;
    const int64_t n_blocks = (rows + BWD_ROWS - 1) / BWD_ROWS;
    const bool sums = grads->ddt_bias || grads->dA_log;
    if (!grads->dg_raw && !sums) return LINSEQ_OK;
    if (n_blocks > 65535)
        return ls_fail(call->fn, LINSEQ_ERR_UNSUPPORTED,
                       "B*T = %lld rows: the CUDA gate backward takes at most %lld",
                       (long long)rows, (long long)65535 * BWD_ROWS);
    ls_cuda_workspace ws;
    if (linseq_status st = ws.alloc(call, (size_t)(2 * n_blocks * cols) * sizeof(double)))
        return st;
    double *pb = ws.as<double>(), *pa = pb + n_blocks * cols;
    const dim3 grid(ls_blocks(cols, 32), (unsigned)n_blocks);
    gate_backward_partial_kernel<Elem><<<grid, GATE_THREADS, 0, ls_stream(call)>>>(
        ls_in<Elem>(p->g_raw), reinterpret_cast<const Elem *>(d_g), p->A_log, p->dt_bias,
        p->lower_bound, rows, p->H, gK, reinterpret_cast<Elem *>(grads->dg_raw), pb, pa);
    LS_CUDA_LAUNCHED(call, "gate_backward_partial_kernel");
    if (sums) {
        gate_backward_reduce_kernel<<<(unsigned)p->H, GATE_THREADS, 0, ls_stream(call)>>>(
            pb, pa, n_blocks, p->H, gK, grads->ddt_bias, grads->dA_log);
        LS_CUDA_LAUNCHED(call, "gate_backward_reduce_kernel");
    }
    return LINSEQ_OK;
}

} // namespace

extern "C" linseq_status ls_cuda_kda_gate_forward(const linseq_kda_gate_problem *p,
                                                  const ls_cuda_call *call, void *g)
{
    return call->bf16 ? gate_forward<__nv_bfloat16>(p, call, g) : gate_forward<float>(p, call, g);
}

extern "C" linseq_status ls_cuda_kda_gate_backward(const linseq_kda_gate_problem *p,
                                                   const ls_cuda_call *call, const void *d_g,
                                                   const linseq_kda_gate_grads *grads)
{
    return call->bf16 ? gate_backward<__nv_bfloat16>(p, call, d_g, grads)
                      : gate_backward<float>(p, call, d_g, grads);
}
