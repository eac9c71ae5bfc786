/* Running a loaded case on the CUDA device (`--device cuda`): the same op call as on the
 * host, on device copies of the case's inputs, with the results brought back. */
#ifndef LS_TOOLS_CASE_DEVICE_H
#define LS_TOOLS_CASE_DEVICE_H

#include <stddef.h>

#include "case.h"

/* One of the op's calls (forward or backward) with its output buffers. */
typedef linseq_status (*case_call)(const ls_case *c, const linseq_exec *exec, float *const *bufs);

/* Calls fn with a copy of c whose problem and upstream gradients point at device copies,
 * and with bufs replaced by device buffers (NaN-filled, so an element left unwritten shows);
 * then copies those back into bufs (n of them, counts[i] floats each, NULL = not requested).
 * Returns fn's status, or LINSEQ_ERR_DEVICE with err filled when the CUDA runtime fails or
 * the build has no CUDA. */
linseq_status case_call_on_device(const ls_case *c, case_call fn, const linseq_exec *exec,
                                  float *const *bufs, const size_t *counts, int n, char *err,
                                  size_t err_size);

#endif
