/* The CUDA devices a build can use. Without CUDA support (the default build) there are none;
 * with it (make CUDA=1) the runtime is asked, and a machine without a GPU or driver has none
 * rather than an error. */
#include "linseq.h"

#ifdef LINSEQ_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

int linseq_cuda_device_count(void)
{
#ifdef LINSEQ_WITH_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky "no device" error for later calls */
        return 0;
    }
    return n;
#else
    return 0;
#endif
}
