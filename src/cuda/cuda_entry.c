/* The CUDA branch of each public entry point (cuda_entry.h): device selection, the host copy
 * and check of cu_seqlens, then the kernels of cuda_ops.h. */
#include "cuda/cuda_entry.h"

#include <stdlib.h>

#include "core/status.h"
#include "core/validate.h"

#ifdef LINSEQ_WITH_CUDA

#include <cuda_runtime_api.h>
#include <stdatomic.h>

#include "cuda/cuda_ops.h"

/* The first failed workspace free of this thread's call in progress (cudaSuccess: none). */
static _Thread_local cudaError_t free_failure = cudaSuccess;

void ls_cuda_note_free_failure(int cuda_error)
{
    if (free_failure == cudaSuccess) free_failure = (cudaError_t)cuda_error;
}

/* Workspace comes from cudaMallocAsync on the device's default memory pool, whose release
 * threshold (0 by default) hands its memory back to the driver at every synchronize, so each
 * call would map its workspace anew. Raising the threshold once per device keeps the memory in
 * the pool for the next call (a caller may trim it, or set the threshold back after the first
 * call: it is not set again). A bit per device ordinal below 64 says it is done; two threads
 * racing both set the same value. Ordinals from 64 on set it at every call. */
static linseq_status keep_pool_memory(const char *fn, int device)
{
    static atomic_uint_least64_t kept;
    const uint_least64_t bit = device < 64 ? (uint_least64_t)1 << device : 0;
    if (bit && (atomic_load(&kept) & bit)) return LINSEQ_OK;
    cudaMemPool_t pool;
    uint64_t threshold = UINT64_MAX;
    cudaError_t err = cudaDeviceGetDefaultMemPool(&pool, device);
    if (err == cudaSuccess)
        err = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return ls_fail(fn, LINSEQ_ERR_DEVICE,
                       "raising the release threshold of CUDA device %d's default memory pool "
                       "failed: %s",
                       device, cudaGetErrorString(err));
    }
    atomic_fetch_or(&kept, bit);
    return LINSEQ_OK;
}

/* A device call in progress: the call descriptor, the caller's device to restore, and the
 * host copy of cu_seqlens. */
typedef struct {
    ls_cuda_call call;
    int previous_device;
    int64_t *cu_host;
} device_call;

static linseq_status begin(device_call *dc, const char *fn, const linseq_exec *exec)
{
    *dc = (device_call){.previous_device = -1};
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || exec->device_index >= count) {
        (void)cudaGetLastError();
        return ls_fail(fn, err != cudaSuccess ? LINSEQ_ERR_DEVICE : LINSEQ_ERR_INVALID_VALUE,
                       "exec->device_index = %d, but %d CUDA devices are available (%s)",
                       exec->device_index, err != cudaSuccess ? 0 : count,
                       err != cudaSuccess ? cudaGetErrorString(err) : "no such device");
    }
    if ((err = cudaGetDevice(&dc->previous_device)) != cudaSuccess ||
        (err = cudaSetDevice(exec->device_index)) != cudaSuccess)
        return ls_fail(fn, LINSEQ_ERR_DEVICE, "selecting CUDA device %d failed: %s",
                       exec->device_index, cudaGetErrorString(err));
    linseq_status st = keep_pool_memory(fn, exec->device_index);
    if (st) return st;
    dc->call.fn = fn;
    dc->call.device = exec->device_index;
    dc->call.stream = exec->stream;
    dc->call.bf16 = exec->dtype == LINSEQ_DTYPE_BF16;
    return LINSEQ_OK;
}

/* Ends the call: a failed workspace free or a failed restore of the caller's device is
 * LINSEQ_ERR_DEVICE, unless the call has already failed (that failure is the one to report). */
static linseq_status finish(device_call *dc, linseq_status st, const char *fn)
{
    free(dc->cu_host);
    const cudaError_t freed = free_failure;
    free_failure = cudaSuccess;
    if (!st && freed != cudaSuccess)
        st = ls_fail(fn, LINSEQ_ERR_DEVICE, "freeing device workspace failed: %s",
                     cudaGetErrorString(freed));
    if (dc->previous_device >= 0) {
        const cudaError_t err = cudaSetDevice(dc->previous_device);
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            if (!st)
                st = ls_fail(fn, LINSEQ_ERR_DEVICE,
                             "restoring the caller's CUDA device %d failed: %s",
                             dc->previous_device, cudaGetErrorString(err));
        }
    }
    return st;
}

/* n int64 values of device memory into a new host array, waiting on the call's stream so
 * that values an earlier kernel on it writes are seen. */
static linseq_status fetch_i64(const device_call *dc, const char *name, const int64_t *dev,
                               int64_t n, int64_t **host)
{
    *host = malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    if (!*host)
        return ls_fail(dc->call.fn, LINSEQ_ERR_OUT_OF_MEMORY, "cannot copy %s to the host", name);
    cudaStream_t s = (cudaStream_t)dc->call.stream;
    cudaError_t err =
        cudaMemcpyAsync(*host, dev, (size_t)n * sizeof(int64_t), cudaMemcpyDeviceToHost, s);
    if (err == cudaSuccess) err = cudaStreamSynchronize(s);
    if (err != cudaSuccess) {
        free(*host);
        *host = NULL;
        return ls_fail(dc->call.fn, LINSEQ_ERR_DEVICE,
                       "reading %s from the device failed: %s (it must be device memory of "
                       "device %d)",
                       name, cudaGetErrorString(err), dc->call.device);
    }
    return LINSEQ_OK;
}

/* cu_seqlens (device) to the host, checked, and the call's sequence plan from it. */
static linseq_status plan_sequences(device_call *dc, const int64_t *cu, int64_t n_seqs, int64_t B,
                                    int64_t T)
{
    linseq_status st;
    if (cu) {
        if ((st = fetch_i64(dc, "cu_seqlens", cu, n_seqs + 1, &dc->cu_host))) return st;
        if ((st = ls_check_cu_seqlens(dc->call.fn, dc->cu_host, n_seqs, B, T))) return st;
    }
    dc->call.n_seqs = cu ? n_seqs : B;
    dc->call.max_len = ls_longest_sequence(dc->cu_host, n_seqs, T);
    dc->call.cu_seqlens_host = dc->cu_host;
    return LINSEQ_OK;
}

linseq_status ls_cuda_entry_copy_i64(const char *fn, const linseq_exec *exec, const char *name,
                                     const int64_t *device_values, int64_t n, int64_t **host)
{
    device_call dc;
    *host = NULL;
    linseq_status st = begin(&dc, fn, exec);
    if (!st) st = fetch_i64(&dc, name, device_values, n, host);
    return finish(&dc, st, fn);
}

linseq_status ls_cuda_entry_kda_forward(const char *fn, const ls_cuda_kda_args *kda,
                                        const linseq_exec *exec, float *o, float *ht)
{
    device_call dc;
    linseq_status st = begin(&dc, fn, exec);
    const linseq_kda_problem *p = kda->p;
    if (!st) st = plan_sequences(&dc, p->cu_seqlens, p->n_seqs, p->B, p->T);
    dc.call.chunk = kda->chunk;
    if (!st) st = ls_cuda_kda_forward(p, kda->HV, kda->scale, &dc.call, o, ht);
    return finish(&dc, st, fn);
}

linseq_status ls_cuda_entry_kda_backward(const char *fn, const ls_cuda_kda_args *kda,
                                         const linseq_exec *exec, const float *d_o,
                                         const float *d_ht, const linseq_kda_grads *grads)
{
    device_call dc;
    linseq_status st = begin(&dc, fn, exec);
    const linseq_kda_problem *p = kda->p;
    if (!st) st = plan_sequences(&dc, p->cu_seqlens, p->n_seqs, p->B, p->T);
    dc.call.chunk = kda->chunk;
    if (!st) st = ls_cuda_kda_backward(p, kda->HV, kda->scale, &dc.call, d_o, d_ht, grads);
    return finish(&dc, st, fn);
}

linseq_status ls_cuda_entry_kda_decode(const char *fn, const ls_cuda_kda_args *kda,
                                       const linseq_exec *exec, float *state, int64_t n_state_rows,
                                       const int64_t *state_rows, float *o)
{
    device_call dc;
    linseq_status st = begin(&dc, fn, exec);
    const linseq_kda_problem *p = kda->p;
    dc.call.n_seqs = p->B;
    dc.call.max_len = 1;
    if (!st)
        st = ls_cuda_kda_decode(p, kda->HV, kda->scale, &dc.call, state, n_state_rows, state_rows,
                                o);
    return finish(&dc, st, fn);
}

linseq_status ls_cuda_entry_kda_gate_forward(const char *fn, const linseq_kda_gate_problem *p,
                                             const linseq_exec *exec, float *g)
{
    device_call dc;
    linseq_status st = begin(&dc, fn, exec);
    if (!st) st = ls_cuda_kda_gate_forward(p, &dc.call, g);
    return finish(&dc, st, fn);
}

linseq_status ls_cuda_entry_kda_gate_backward(const char *fn, const linseq_kda_gate_problem *p,
                                              const linseq_exec *exec, const float *d_g,
                                              const linseq_kda_gate_grads *grads)
{
    device_call dc;
    linseq_status st = begin(&dc, fn, exec);
    if (!st) st = ls_cuda_kda_gate_backward(p, &dc.call, d_g, grads);
    return finish(&dc, st, fn);
}

linseq_status ls_cuda_entry_ssm1_forward(const char *fn, const linseq_ssm1_problem *p,
                                         const linseq_exec *exec, float *y, float *hT)
{
    device_call dc;
    linseq_status st = begin(&dc, fn, exec);
    if (!st) st = plan_sequences(&dc, p->cu_seqlens, p->n_seqs, p->B, p->T);
    if (!st) st = ls_cuda_ssm1_forward(p, &dc.call, y, hT);
    return finish(&dc, st, fn);
}

linseq_status ls_cuda_entry_ssm1_backward(const char *fn, const linseq_ssm1_problem *p,
                                          const linseq_exec *exec, const float *d_y,
                                          const float *d_hT, const linseq_ssm1_grads *grads)
{
    device_call dc;
    linseq_status st = begin(&dc, fn, exec);
    if (!st) st = plan_sequences(&dc, p->cu_seqlens, p->n_seqs, p->B, p->T);
    if (!st) st = ls_cuda_ssm1_backward(p, &dc.call, d_y, d_hT, grads);
    return finish(&dc, st, fn);
}

linseq_status ls_cuda_entry_conv1d_forward(const char *fn, const linseq_conv1d_problem *p,
                                           const linseq_exec *exec, float *y, float *conv_state_out)
{
    device_call dc;
    linseq_status st = begin(&dc, fn, exec);
    if (!st) st = plan_sequences(&dc, p->cu_seqlens, p->n_seqs, p->B, p->T);
    if (!st) st = ls_cuda_conv1d_forward(p, &dc.call, y, conv_state_out);
    return finish(&dc, st, fn);
}

linseq_status ls_cuda_entry_conv1d_backward(const char *fn, const linseq_conv1d_problem *p,
                                            const linseq_exec *exec, const float *d_y,
                                            const float *d_conv_state_out,
                                            const linseq_conv1d_grads *grads)
{
    device_call dc;
    linseq_status st = begin(&dc, fn, exec);
    if (!st) st = plan_sequences(&dc, p->cu_seqlens, p->n_seqs, p->B, p->T);
    if (!st) st = ls_cuda_conv1d_backward(p, &dc.call, d_y, d_conv_state_out, grads);
    return finish(&dc, st, fn);
}

#else /* a build without CUDA: ls_check_exec has already refused the device */

static linseq_status no_cuda(const char *fn)
{
    return ls_fail(fn, LINSEQ_ERR_UNSUPPORTED, "this build of linseq has no CUDA support");
}

linseq_status ls_cuda_entry_copy_i64(const char *fn, const linseq_exec *exec, const char *name,
                                     const int64_t *device_values, int64_t n, int64_t **host)
{
    (void)exec, (void)name, (void)device_values, (void)n;
    *host = NULL;
    return no_cuda(fn);
}

linseq_status ls_cuda_entry_kda_forward(const char *fn, const ls_cuda_kda_args *kda,
                                        const linseq_exec *exec, float *o, float *ht)
{
    (void)kda, (void)exec, (void)o, (void)ht;
    return no_cuda(fn);
}

linseq_status ls_cuda_entry_kda_backward(const char *fn, const ls_cuda_kda_args *kda,
                                         const linseq_exec *exec, const float *d_o,
                                         const float *d_ht, const linseq_kda_grads *grads)
{
    (void)kda, (void)exec, (void)d_o, (void)d_ht, (void)grads;
    return no_cuda(fn);
}

linseq_status ls_cuda_entry_kda_decode(const char *fn, const ls_cuda_kda_args *kda,
                                       const linseq_exec *exec, float *state, int64_t n_state_rows,
                                       const int64_t *state_rows, float *o)
{
    (void)kda, (void)exec, (void)state, (void)n_state_rows, (void)state_rows, (void)o;
    return no_cuda(fn);
}

linseq_status ls_cuda_entry_kda_gate_forward(const char *fn, const linseq_kda_gate_problem *p,
                                             const linseq_exec *exec, float *g)
{
    (void)p, (void)exec, (void)g;
    return no_cuda(fn);
}

linseq_status ls_cuda_entry_kda_gate_backward(const char *fn, const linseq_kda_gate_problem *p,
                                              const linseq_exec *exec, const float *d_g,
                                              const linseq_kda_gate_grads *grads)
{
    (void)p, (void)exec, (void)d_g, (void)grads;
    return no_cuda(fn);
}

linseq_status ls_cuda_entry_ssm1_forward(const char *fn, const linseq_ssm1_problem *p,
                                         const linseq_exec *exec, float *y, float *hT)
{
    (void)p, (void)exec, (void)y, (void)hT;
    return no_cuda(fn);
}

linseq_status ls_cuda_entry_ssm1_backward(const char *fn, const linseq_ssm1_problem *p,
                                          const linseq_exec *exec, const float *d_y,
                                          const float *d_hT, const linseq_ssm1_grads *grads)
{
    (void)p, (void)exec, (void)d_y, (void)d_hT, (void)grads;
    return no_cuda(fn);
}

linseq_status ls_cuda_entry_conv1d_forward(const char *fn, const linseq_conv1d_problem *p,
                                           const linseq_exec *exec, float *y, float *conv_state_out)
{
    (void)p, (void)exec, (void)y, (void)conv_state_out;
    return no_cuda(fn);
}

linseq_status ls_cuda_entry_conv1d_backward(const char *fn, const linseq_conv1d_problem *p,
                                            const linseq_exec *exec, const float *d_y,
                                            const float *d_conv_state_out,
                                            const linseq_conv1d_grads *grads)
{
    (void)p, (void)exec, (void)d_y, (void)d_conv_state_out, (void)grads;
    return no_cuda(fn);
}

#endif
