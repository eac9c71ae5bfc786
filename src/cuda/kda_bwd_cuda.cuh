// Internal: device helpers of the CUDA KDA backward (kda_backward.cu) beyond the shared
// kda_cuda.cuh (gate, sigmoid): warp reductions in a fixed order, float and double, and the
// row storage of the token walk (registers, or global scratch for K too large for them).
#ifndef LS_KDA_BWD_CUDA_CUH
#define LS_KDA_BWD_CUDA_CUH

#include "cuda/cuda_common.cuh"
#include "cuda/kda_cuda.cuh"

namespace ls_kdab {

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

// The rows of the state tile a thread owns: rows warp + NW r, r < R, of one column. R > 0:
// in registers (every loop over r is unrolled, so the indices are constants). R == 0: in a
// per-block global scratch laid out [row][32] (each thread touches only its own elements, so
// no synchronisation), for K beyond what registers hold.
template <int R> struct rows {
    float x[R];
    __device__ __forceinline__ void bind(float *, int) {}
    __device__ __forceinline__ float get(int r) const { return x[r]; }
    __device__ __forceinline__ void set(int r, float v) { x[r] = v; }
};
template <> struct rows<0> {
    float *p;
    int stride;
    __device__ __forceinline__ void bind(float *base, int row_stride)
    {
        p = base;
        stride = row_stride;
    }
    __device__ __forceinline__ float get(int r) const { return p[(int64_t)r * stride]; }
    __device__ __forceinline__ void set(int r, float v) { p[(int64_t)r * stride] = v; }
};

} // namespace ls_kdab

#endif
