// Causal depthwise conv1d on CUDA: forward and backward.
//
// Decomposition. Forward: one thread per (sequence, chunk of L = max(16, W-1) tokens, VEC
// consecutive channels), consecutive threads on consecutive channels, so every token row is
// read and written coalesced; VEC = 4 (16-byte float32 or 8-byte bf16 accesses) when D % 4 ==
// 0 and the pointers allow it, else 1. For W <= 4 (the Mamba widths) W is a template
// argument: the thread keeps the W-1 previous inputs in registers and slides the window, so
// each input is read once per thread plus W-1 halo reads per chunk. Other widths use a generic
// loop (the taps are re-read from L1). The thread of chunk 0 alone reads conv_state and,
// after its outputs, writes conv_state_out in ascending order (entry i reads xs[len + i],
// len + i >= i), so an in-place update (conv_state_out == conv_state) is safe: no other
// thread reads the state, because a chunk is at least W-1 tokens long.
// Backward: a block is 32 channels (lanes) x 8 warps of consecutive chunks. A thread
// recomputes the pre-activations of its chunk plus the W-1 tokens after it, then dx, its
// chunk's dweight/dbias partial sums, and (chunk 0) dconv_state. The 8 warps' partial sums
// are added in order in shared memory and written per (sequence, 8 chunks); a last kernel adds
// those rows in order: deterministic, no atomics.
//
// Floor per forward call: read x (B T D elements), write y (B T D), weight/bias/state
// (D W + D + 2 N_seq D (W-1) floats): 2 B T D elements, 2 W B T D flops: memory-bound, the
// target is copy speed. A thread issues its chunk's 16 loads before any store (so 256 bytes
// per thread are in flight with VEC = 4: 128-thread blocks at about 140 registers, 3 per SM,
// ~100 KB in flight per SM, several times what 4.3 TB/s needs at ~600 ns latency); the W-1
// halo reloads hit L1/L2 (3/16 extra reads at W = 4). Backward: read x and d_y, write dx (3 B T D elements) plus 2 D W
// floats per 128 tokens of partial sums.
#include "cuda/ssm_common.cuh"

namespace
{

constexpr int kChunk = 16; // tokens per thread (at least W-1: see above)
constexpr int kWarps = 8;  // backward: chunks per block
constexpr int kMaxFixedW = 4;

struct ConvArgs {
    const void *x; // Elem
    const float *weight, *bias, *state;
    const int64_t *cu;
    int64_t T, D, W, L, n_chunks, n_seqs;
    int act;
    // forward
    void *y; // Elem
    float *state_out;
    // backward
    const void *dy;           // Elem
    const float *dso;         // d_conv_state_out or NULL
    void *dx;                 // Elem or NULL
    float *dstate;            // dconv_state or NULL
    float *dw_part, *db_part; // [rows][D W], [rows][D] or NULL
};

// xs[k] of the padded input of sequence seq (start, len), channels d .. d+VEC-1: the state
// (or zeros) for k < W-1, x[k - (W-1)] after; zeros past the sequence's end.
template <typename E, int VEC>
__device__ __forceinline__ void xs_at(const ConvArgs &a, int64_t seq, int64_t start, int64_t len,
                                      int64_t d, int64_t W, int64_t k, float *o)
{
    if (k < W - 1) {
#pragma unroll
        for (int c = 0; c < VEC; c++)
            o[c] = a.state ? a.state[((seq * a.D) + d + c) * (W - 1) + k] : 0.0f;
    } else if (k - (W - 1) < len) {
        ls_ld_vec<E, VEC>(static_cast<const E *>(a.x), (start + k - (W - 1)) * a.D + d, o);
    } else {
#pragma unroll
        for (int c = 0; c < VEC; c++) o[c] = 0.0f;
    }
}

// ---------------------------------------------------------------------------------------
// Forward

template <typename E, int VEC, int WT> __global__ void conv1d_fwd_kernel(const ConvArgs a)
{
    const int64_t n_dv = a.D / VEC;
    const int64_t item = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (item >= a.n_seqs * a.n_chunks * n_dv) return;
    const int64_t d = (item % n_dv) * VEC;
    const int64_t chunk = item / n_dv % a.n_chunks, seq = item / n_dv / a.n_chunks;
    int64_t start, len;
    ls_dev_seq_range(a.cu, a.T, seq, &start, &len);
    const int64_t t0 = chunk * a.L;
    if (chunk > 0 && t0 >= len) return;
    const int64_t cnt = len - t0 < a.L ? len - t0 : a.L; // 0 for an empty sequence
    E *y = static_cast<E *>(a.y);

    float bias[VEC];
#pragma unroll
    for (int c = 0; c < VEC; c++) bias[c] = a.bias ? a.bias[d + c] : 0.0f;

    if constexpr (WT > 0) {
        constexpr int W = WT;
        float w[W][VEC], win[W][VEC];
#pragma unroll
        for (int j = 0; j < W; j++)
#pragma unroll
            for (int c = 0; c < VEC; c++) w[j][c] = a.weight[(d + c) * W + j];
#pragma unroll
        for (int j = 0; j + 1 < W; j++) xs_at<E, VEC>(a, seq, start, len, d, W, t0 + j, win[j]);
        // Every load of the chunk before the first store (a store to y could alias x as far
        // as the compiler knows, which would serialise load, compute, store per token).
        float xin[kChunk][VEC];
#pragma unroll
        for (int t = 0; t < kChunk; t++) {
            if (t < cnt)
                ls_ld_vec<E, VEC>(static_cast<const E *>(a.x), (start + t0 + t) * a.D + d, xin[t]);
        }
#pragma unroll
        for (int t = 0; t < kChunk; t++) {
            if (t < cnt) {
#pragma unroll
                for (int c = 0; c < VEC; c++) win[W - 1][c] = xin[t][c];
                float out[VEC];
#pragma unroll
                for (int c = 0; c < VEC; c++) {
                    float acc = bias[c];
#pragma unroll
                    for (int j = 0; j < W; j++) acc = fmaf(w[j][c], win[j][c], acc);
                    out[c] = ls_dev_activate(a.act, acc);
                }
                ls_st_vec<E, VEC>(y, (start + t0 + t) * a.D + d, out);
#pragma unroll
                for (int j = 0; j + 1 < W; j++)
#pragma unroll
                    for (int c = 0; c < VEC; c++) win[j][c] = win[j + 1][c];
            }
        }
    } else {
        const int64_t W = a.W;
        for (int64_t t = 0; t < cnt; t++) {
            float out[VEC];
#pragma unroll
            for (int c = 0; c < VEC; c++) out[c] = bias[c];
            for (int64_t j = 0; j < W; j++) {
                float v[VEC];
                xs_at<E, VEC>(a, seq, start, len, d, W, t0 + t + j, v);
#pragma unroll
                for (int c = 0; c < VEC; c++)
                    out[c] = fmaf(a.weight[(d + c) * W + j], v[c], out[c]);
            }
#pragma unroll
            for (int c = 0; c < VEC; c++) out[c] = ls_dev_activate(a.act, out[c]);
            ls_st_vec<E, VEC>(y, (start + t0 + t) * a.D + d, out);
        }
    }

    // The new state: the last W-1 entries of xs, ascending (in place safe, see the top).
    if (chunk == 0 && a.state_out) {
        const int64_t W = WT > 0 ? WT : a.W;
        for (int64_t i = 0; i + 1 < W; i++) {
            float v[VEC];
            xs_at<E, VEC>(a, seq, start, len, d, W, len + i, v);
#pragma unroll
            for (int c = 0; c < VEC; c++) a.state_out[(seq * a.D + d + c) * (W - 1) + i] = v[c];
        }
    }
}

// ---------------------------------------------------------------------------------------
// Backward

// dL/dpre of token u (relative to the sequence; 0 past its end), recomputing pre.
template <typename E>
__device__ __forceinline__ float dpre_at(const ConvArgs &a, int64_t seq, int64_t start, int64_t len,
                                         int64_t d, int64_t u)
{
    if (u >= len) return 0.0f;
    const int64_t W = a.W;
    float pre = a.bias ? a.bias[d] : 0.0f;
    for (int64_t j = 0; j < W; j++) {
        float v;
        xs_at<E, 1>(a, seq, start, len, d, W, u + j, &v);
        pre = fmaf(a.weight[d * W + j], v, pre);
    }
    const int64_t idx = (start + u) * a.D + d;
    return ls_ld(static_cast<const E *>(a.dy), idx) * ls_dev_activate_grad(a.act, pre);
}

template <typename E, int WT> __global__ void conv1d_bwd_kernel(const ConvArgs a)
{
    constexpr int kMaxRed = (WT > 0 ? WT : 1) + 1; // dweight taps (+ dbias) reduced at once
    __shared__ float s_red[kWarps][kMaxRed][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t n_tiles = (a.D + 31) / 32, n_cb = (a.n_chunks + kWarps - 1) / kWarps;
    const int64_t blk = blockIdx.x;
    const int64_t tile = blk % n_tiles, cb = blk / n_tiles % n_cb, seq = blk / n_tiles / n_cb;
    const int64_t d = tile * 32 + lane, chunk = cb * kWarps + warp;
    const bool d_ok = d < a.D;
    int64_t start, len;
    ls_dev_seq_range(a.cu, a.T, seq, &start, &len);
    const int64_t t0 = chunk * a.L;
    // Chunk 0 always runs (dconv_state); others only inside the sequence.
    const bool active = d_ok && chunk < a.n_chunks && (chunk == 0 || t0 < len);
    const int64_t cnt = !active ? 0 : len - t0 < a.L ? (len - t0 > 0 ? len - t0 : 0) : a.L;
    const int64_t row = seq * n_cb + cb;

    if constexpr (WT > 0) {
        constexpr int W = WT, NX = kChunk + 2 * W - 2, NP = kChunk + W - 1;
        const E *dy = static_cast<const E *>(a.dy);
        float w[W], xw[NX], dp[NP];
        const float bias = a.bias && d_ok ? a.bias[d] : 0.0f;
#pragma unroll
        for (int j = 0; j < W; j++) w[j] = d_ok ? a.weight[d * W + j] : 0.0f;
#pragma unroll
        for (int k = 0; k < NX; k++) {
            xw[k] = 0.0f;
            if (active && t0 + k < len + W - 1)
                xs_at<E, 1>(a, seq, start, len, d, W, t0 + k, &xw[k]);
        }
#pragma unroll
        for (int u = 0; u < NP; u++) {
            dp[u] = 0.0f;
            if (active && t0 + u < len) {
                float pre = bias;
#pragma unroll
                for (int j = 0; j < W; j++) pre = fmaf(w[j], xw[u + j], pre);
                dp[u] = ls_ld(dy, (start + t0 + u) * a.D + d) * ls_dev_activate_grad(a.act, pre);
            }
        }
        float dw[W], db = 0.0f;
#pragma unroll
        for (int j = 0; j < W; j++) dw[j] = 0.0f;
#pragma unroll
        for (int t = 0; t < kChunk; t++) {
            if (t < cnt) {
                float g = 0.0f;
#pragma unroll
                for (int j = 0; j < W; j++) g = fmaf(w[j], dp[t + W - 1 - j], g);
                if (a.dso && t0 + t + W - 1 >= len)
                    g += a.dso[(seq * a.D + d) * (W - 1) + (t0 + t + W - 1 - len)];
                if (a.dx) ls_st(static_cast<E *>(a.dx), (start + t0 + t) * a.D + d, g);
#pragma unroll
                for (int j = 0; j < W; j++) dw[j] = fmaf(dp[t], xw[t + j], dw[j]);
                db += dp[t];
            }
        }
        if (chunk == 0 && active && a.dstate) {
#pragma unroll
            for (int k = 0; k + 1 < W; k++) {
                float g = 0.0f;
#pragma unroll
                for (int t = 0; t <= k; t++) g = fmaf(dp[t], w[k - t], g);
                if (a.dso && k >= len) g += a.dso[(seq * a.D + d) * (W - 1) + (k - len)];
                a.dstate[(seq * a.D + d) * (W - 1) + k] = g;
            }
        }
        if (a.dw_part || a.db_part) {
#pragma unroll
            for (int j = 0; j < W; j++) s_red[warp][j][lane] = dw[j];
            s_red[warp][W][lane] = db;
            __syncthreads();
            if (warp == 0 && d_ok) {
                for (int j = 0; j <= W; j++) {
                    float s = 0.0f;
                    for (int q = 0; q < kWarps; q++) s += s_red[q][j][lane];
                    if (j < W && a.dw_part) a.dw_part[row * a.D * W + d * W + j] = s;
                    if (j == W && a.db_part) a.db_part[row * a.D + d] = s;
                }
            }
        }
    } else {
        const int64_t W = a.W;
        for (int64_t t = 0; t < cnt; t++) {
            float g = 0.0f;
            for (int64_t j = 0; j < W; j++)
                g = fmaf(a.weight[d * W + j], dpre_at<E>(a, seq, start, len, d, t0 + t + W - 1 - j),
                         g);
            if (a.dso && t0 + t + W - 1 >= len)
                g += a.dso[(seq * a.D + d) * (W - 1) + (t0 + t + W - 1 - len)];
            if (a.dx) ls_st(static_cast<E *>(a.dx), (start + t0 + t) * a.D + d, g);
        }
        if (chunk == 0 && active && a.dstate) {
            for (int64_t k = 0; k + 1 < W; k++) {
                float g = 0.0f;
                for (int64_t t = 0; t <= k; t++)
                    g = fmaf(dpre_at<E>(a, seq, start, len, d, t), a.weight[d * W + k - t], g);
                if (a.dso && k >= len) g += a.dso[(seq * a.D + d) * (W - 1) + (k - len)];
                a.dstate[(seq * a.D + d) * (W - 1) + k] = g;
            }
        }
        // dweight tap by tap, then dbias (j == W): one block reduction each
        if (a.dw_part || a.db_part) {
            for (int64_t j = 0; j <= W; j++) {
                float s = 0.0f;
                for (int64_t t = 0; t < cnt; t++) {
                    const float g = dpre_at<E>(a, seq, start, len, d, t0 + t);
                    float v = 1.0f;
                    if (j < W) xs_at<E, 1>(a, seq, start, len, d, W, t0 + t + j, &v);
                    s = fmaf(g, v, s);
                }
                s_red[warp][0][lane] = s;
                __syncthreads();
                if (warp == 0 && d_ok) {
                    float r = 0.0f;
                    for (int q = 0; q < kWarps; q++) r += s_red[q][0][lane];
                    if (j < W && a.dw_part) a.dw_part[row * a.D * W + d * W + j] = r;
                    if (j == W && a.db_part) a.db_part[row * a.D + d] = r;
                }
                __syncthreads();
            }
        }
    }
}

// out[i] = sum over rows of part[row][i], rows in order.
__global__ void conv1d_sum_rows_kernel(const float *part, int64_t rows, int64_t count, float *out)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    float s = 0.0f;
    for (int64_t r = 0; r < rows; r++) s += part[r * count + i];
    out[i] = s;
}

// ---------------------------------------------------------------------------------------
// Host side

ConvArgs conv_args(const linseq_conv1d_problem *p, const ls_cuda_call *call)
{
    ConvArgs a = {};
    a.x = p->x;
    a.weight = p->weight;
    a.bias = p->bias;
    a.state = p->W > 1 ? p->conv_state : nullptr;
    a.cu = p->cu_seqlens;
    a.T = p->T;
    a.D = p->D;
    a.W = p->W;
    a.L = p->W - 1 > kChunk ? p->W - 1 : kChunk;
    const int64_t longest = call->max_len > 0 ? call->max_len : 1;
    a.n_chunks = (longest + a.L - 1) / a.L;
    a.n_seqs = call->n_seqs;
    a.act = p->activation == LINSEQ_ACT_DEFAULT ? LINSEQ_ACT_IDENTITY : p->activation;
    return a;
}

template <typename E, int VEC>
linseq_status launch_fwd_vec(const ConvArgs &a, const ls_cuda_call *call)
{
    const int64_t items = a.n_seqs * a.n_chunks * (a.D / VEC);
    const unsigned blocks = ls_blocks(items, 128);
    cudaStream_t s = ls_stream(call);
    switch (a.W) {
    case 1: conv1d_fwd_kernel<E, VEC, 1><<<blocks, 128, 0, s>>>(a); break;
    case 2: conv1d_fwd_kernel<E, VEC, 2><<<blocks, 128, 0, s>>>(a); break;
    case 3: conv1d_fwd_kernel<E, VEC, 3><<<blocks, 128, 0, s>>>(a); break;
    case 4: conv1d_fwd_kernel<E, VEC, 4><<<blocks, 128, 0, s>>>(a); break;
    default: conv1d_fwd_kernel<E, VEC, 0><<<blocks, 128, 0, s>>>(a); break;
    }
    LS_CUDA_LAUNCHED(call, "conv1d_fwd_kernel");
    return LINSEQ_OK;
}

linseq_status check_blocks(const ls_cuda_call *call, int64_t blocks)
{
    if (blocks >= INT32_MAX)
        return ls_fail(call->fn, LINSEQ_ERR_UNSUPPORTED,
                       "the problem needs %lld blocks, more than a CUDA grid holds",
                       (long long)blocks);
    return LINSEQ_OK;
}

template <typename E>
linseq_status conv1d_forward(const linseq_conv1d_problem *p, const ls_cuda_call *call, void *y,
                             float *state_out)
{
    ConvArgs a = conv_args(p, call);
    a.y = y;
    a.state_out = p->W > 1 ? state_out : nullptr;
    const size_t align = sizeof(E) * 4;
    const bool vec = p->D % 4 == 0 && p->W <= kMaxFixedW && (uintptr_t)p->x % align == 0 &&
                     (uintptr_t)y % align == 0;
    linseq_status st = check_blocks(call, (a.n_seqs * a.n_chunks * a.D + 127) / 128);
    if (st) return st;
    return vec ? launch_fwd_vec<E, 4>(a, call) : launch_fwd_vec<E, 1>(a, call);
}

template <typename E>
linseq_status conv1d_backward(const linseq_conv1d_problem *p, const ls_cuda_call *call,
                              const void *d_y, const float *dso, const linseq_conv1d_grads *gr)
{
    ConvArgs a = conv_args(p, call);
    a.dy = d_y;
    a.dso = p->W > 1 ? dso : nullptr;
    a.dx = gr->dx;
    a.dstate = p->W > 1 ? gr->dconv_state : nullptr;
    const int64_t n_tiles = (a.D + 31) / 32, n_cb = (a.n_chunks + kWarps - 1) / kWarps;
    const int64_t blocks = a.n_seqs * n_cb * n_tiles, rows = a.n_seqs * n_cb;
    linseq_status st = check_blocks(call, blocks);
    if (st) return st;
    const bool want_db = gr->dbias && p->bias;
    ls_cuda_workspace ws;
    const size_t dw_floats = gr->dweight ? (size_t)rows * (size_t)(a.D * a.W) : 0;
    const size_t db_floats = want_db ? (size_t)rows * (size_t)a.D : 0;
    if (dw_floats + db_floats) {
        if ((st = ws.alloc(call, (dw_floats + db_floats) * sizeof(float)))) return st;
        a.dw_part = gr->dweight ? ws.as<float>() : nullptr;
        a.db_part = want_db ? ws.as<float>() + dw_floats : nullptr;
    }
    cudaStream_t s = ls_stream(call);
    const unsigned nb = (unsigned)blocks, nt = 32 * kWarps;
    switch (a.W) {
    case 1: conv1d_bwd_kernel<E, 1><<<nb, nt, 0, s>>>(a); break;
    case 2: conv1d_bwd_kernel<E, 2><<<nb, nt, 0, s>>>(a); break;
    case 3: conv1d_bwd_kernel<E, 3><<<nb, nt, 0, s>>>(a); break;
    case 4: conv1d_bwd_kernel<E, 4><<<nb, nt, 0, s>>>(a); break;
    default: conv1d_bwd_kernel<E, 0><<<nb, nt, 0, s>>>(a); break;
    }
    LS_CUDA_LAUNCHED(call, "conv1d_bwd_kernel");
    if (a.dw_part) {
        conv1d_sum_rows_kernel<<<ls_blocks(a.D * a.W, 256), 256, 0, s>>>(a.dw_part, rows, a.D * a.W,
                                                                         gr->dweight);
        LS_CUDA_LAUNCHED(call, "conv1d_sum_rows_kernel");
    }
    if (a.db_part) {
        conv1d_sum_rows_kernel<<<ls_blocks(a.D, 256), 256, 0, s>>>(a.db_part, rows, a.D, gr->dbias);
        LS_CUDA_LAUNCHED(call, "conv1d_sum_rows_kernel");
    }
    return LINSEQ_OK;
}

} // namespace

extern "C" linseq_status ls_cuda_conv1d_forward(const linseq_conv1d_problem *p,
                                                const ls_cuda_call *call, void *y,
                                                float *conv_state_out)
{
    return call->bf16 ? conv1d_forward<__nv_bfloat16>(p, call, y, conv_state_out)
                      : conv1d_forward<float>(p, call, y, conv_state_out);
}

extern "C" linseq_status ls_cuda_conv1d_backward(const linseq_conv1d_problem *p,
                                                 const ls_cuda_call *call, const void *d_y,
                                                 const float *d_conv_state_out,
                                                 const linseq_conv1d_grads *grads)
{
    return call->bf16 ? conv1d_backward<__nv_bfloat16>(p, call, d_y, d_conv_state_out, grads)
                      : conv1d_backward<float>(p, call, d_y, d_conv_state_out, grads);
}
