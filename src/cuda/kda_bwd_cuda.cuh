// Internal: device helpers of the CUDA KDA backward (kda_backward.cu) beyond the shared
// kda_cuda.cuh (gate, sigmoid): warp reductions in a fixed order, float and double.
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

} // namespace ls_kdab

#endif
