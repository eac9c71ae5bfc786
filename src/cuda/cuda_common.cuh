// Internal: what every CUDA source of linseq shares: error reporting into linseq's status
// and message, the element types (float32 or bf16 per-token tensors, float32 accumulation),
// and stream-ordered workspace.
#ifndef LS_CUDA_COMMON_CUH
#define LS_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "core/status.h"
}
#include "cuda/cuda_ops.h"

// Evaluates a CUDA runtime call; on failure returns LINSEQ_ERR_DEVICE from the enclosing
// function with "<fn>: <call> failed: <reason>" as the thread's message.
#define LS_CUDA_TRY(call, expr)                                                                    \
    do {                                                                                           \
        cudaError_t ls_err_ = (expr);                                                              \
        if (ls_err_ != cudaSuccess)                                                                \
            return ls_fail((call)->fn, LINSEQ_ERR_DEVICE, "%s failed: %s", #expr,                  \
                           cudaGetErrorString(ls_err_));                                           \
    } while (0)

// After a kernel launch: a bad configuration shows up here, not as a status of the launch.
#define LS_CUDA_LAUNCHED(call, kernel_name)                                                        \
    do {                                                                                           \
        cudaError_t ls_err_ = cudaGetLastError();                                                  \
        if (ls_err_ != cudaSuccess)                                                                \
            return ls_fail((call)->fn, LINSEQ_ERR_DEVICE, "launch of %s failed: %s", kernel_name,  \
                           cudaGetErrorString(ls_err_));                                           \
    } while (0)

static inline cudaStream_t ls_stream(const ls_cuda_call *call)
{
    return (cudaStream_t)call->stream;
}

// Element access for the per-token tensors: Elem is float or __nv_bfloat16; loads widen to
// float, stores round to nearest even.
__device__ __forceinline__ float ls_ld(const float *p, int64_t i) { return p[i]; }
__device__ __forceinline__ float ls_ld(const __nv_bfloat16 *p, int64_t i)
{
    return __bfloat162float(p[i]);
}
__device__ __forceinline__ void ls_st(float *p, int64_t i, float x) { p[i] = x; }
__device__ __forceinline__ void ls_st(__nv_bfloat16 *p, int64_t i, float x)
{
    p[i] = __float2bfloat16_rn(x);
}

// A typed view of a per-token pointer from a problem struct (stored as const float *).
template <typename Elem> __host__ __device__ __forceinline__ const Elem *ls_in(const float *p)
{
    return reinterpret_cast<const Elem *>(p);
}
template <typename Elem> __host__ __device__ __forceinline__ Elem *ls_out(void *p)
{
    return reinterpret_cast<Elem *>(p);
}

// Stream-ordered workspace: allocated on the call's stream, freed on it when the owner goes
// out of scope, so kernels enqueued before the free still see it. Every device allocation of
// the backend goes through alloc().
struct ls_cuda_workspace {
    void *ptr = nullptr;
    cudaStream_t stream = nullptr;
    ls_cuda_workspace() = default;
    ls_cuda_workspace(const ls_cuda_workspace &) = delete;
    ls_cuda_workspace &operator=(const ls_cuda_workspace &) = delete;
    // bytes (at least 1) on the call's stream. A device out of memory is
    // LINSEQ_ERR_OUT_OF_MEMORY, as on the CPU; any other failure LINSEQ_ERR_DEVICE. The
    // failure is cleared from the runtime so that a later launch check does not report it.
    linseq_status alloc(const ls_cuda_call *call, size_t bytes)
    {
        stream = ls_stream(call);
        const cudaError_t err = cudaMallocAsync(&ptr, bytes ? bytes : 1, stream);
        if (err == cudaSuccess) return LINSEQ_OK;
        ptr = nullptr;
        (void)cudaGetLastError();
        return ls_fail(
            call->fn,
            err == cudaErrorMemoryAllocation ? LINSEQ_ERR_OUT_OF_MEMORY : LINSEQ_ERR_DEVICE,
            "could not allocate %zu bytes of device workspace: %s", bytes, cudaGetErrorString(err));
    }
    // A failed free is cleared from the runtime (so a later launch check does not report it)
    // and left for the entry point to report.
    ~ls_cuda_workspace()
    {
        if (!ptr) return;
        const cudaError_t err = cudaFreeAsync(ptr, stream);
        if (err == cudaSuccess) return;
        (void)cudaGetLastError();
        ls_cuda_note_free_failure((int)err);
    }
    template <typename T> T *as() const { return static_cast<T *>(ptr); }
};

static inline unsigned ls_blocks(int64_t n, int per_block)
{
    return (unsigned)((n + per_block - 1) / per_block);
}

#endif
