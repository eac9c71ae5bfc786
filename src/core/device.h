/* Internal: what an entry point needs to know about where its call runs. */
#ifndef LS_CORE_DEVICE_H
#define LS_CORE_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

#include "linseq.h"

/* exec names the CUDA device (its pointers are device memory). */
static inline bool ls_on_cuda(const linseq_exec *exec)
{
    return exec && exec->device == LINSEQ_DEVICE_CUDA;
}

/* Bytes per element of the per-token tensors: 2 with LINSEQ_DTYPE_BF16, else 4. */
static inline size_t ls_token_bytes(const linseq_exec *exec)
{
    return exec && exec->dtype == LINSEQ_DTYPE_BF16 ? 2 : 4;
}

#endif
