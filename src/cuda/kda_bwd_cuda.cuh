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

} // namespace ls_kdab

#endif
