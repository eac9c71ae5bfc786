/* case_call_on_device (case_device.h). The problem structs point into the case's input
 * arrays, so a device run is a copy of each input, the problem's pointers moved to those
 * copies field by field, and device output buffers. */
#include "case_device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optable/optable.h"

#ifdef LINSEQ_WITH_CUDA

#include <cuda_runtime_api.h>

#define DEV_TRY(expr)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            snprintf(err, err_size, "%s failed: %s", #expr, cudaGetErrorString(e_));               \
            st = LINSEQ_ERR_DEVICE;                                                                \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

typedef struct {
    const ls_case *c;
    void *dev[CASE_MAX_TENSORS]; /* the copy of c->inputs[i] */
} mirror;

/* The device copy of a host pointer into one of the case's inputs (NULL stays NULL). */
static const void *moved(const mirror *m, const void *host)
{
    if (!host) return NULL;
    for (int i = 0; i < m->c->n_inputs; i++)
        if (m->c->inputs[i].arr.data == host) return m->dev[i];
    return host; /* not an input: never happens for a loaded case */
}

#define MOVE(field) (field) = moved(&m, (field))

linseq_status case_call_on_device(const ls_case *c, case_call fn, const linseq_exec *exec,
                                  float *const *bufs, const size_t *counts, int n, char *err,
                                  size_t err_size)
{
    linseq_status st = LINSEQ_OK;
    mirror m = {.c = c};
    float *dbufs[CASE_MAX_TENSORS] = {0};
    ls_case dc = *c;
    dc.problem = NULL; /* its own copy below; freed at done */
    if (exec && exec->device_index > 0) DEV_TRY(cudaSetDevice(exec->device_index));
    for (int i = 0; i < c->n_inputs; i++) {
        const npy_array *a = &c->inputs[i].arr;
        const size_t bytes = a->count * (a->dtype == NPY_I64 ? 8 : 4);
        DEV_TRY(cudaMalloc(&m.dev[i], bytes ? bytes : 1));
        if (bytes) DEV_TRY(cudaMemcpy(m.dev[i], a->data, bytes, cudaMemcpyHostToDevice));
    }
    /* The device copy's problem: the same fields, every tensor moved to its device copy. */
    if (!(dc.problem = malloc(c->op->problem_size))) {
        snprintf(err, err_size, "out of memory");
        st = LINSEQ_ERR_OUT_OF_MEMORY;
        goto done;
    }
    memcpy(dc.problem, c->problem, c->op->problem_size);
    for (int i = 0; i < c->op->n_tensors; i++) {
        const ls_tensor_desc *t = &c->op->tensors[i];
        if (t->role == LS_ROLE_INPUT)
            ls_tensor_set(t, dc.problem, moved(&m, ls_tensor_get(t, dc.problem)));
    }
    if (c->op->varlen) {
        const void *cu = moved(&m, ls_op_cu_seqlens(c->op, dc.problem));
        memcpy((char *)dc.problem + c->op->cu_seqlens_offset, &cu, sizeof cu);
    }
    for (int i = 0; i < CASE_MAX_TENSORS; i++) MOVE(dc.upstream[i]);
    for (int i = 0; i < n; i++) {
        if (!bufs[i]) continue;
        DEV_TRY(cudaMalloc((void **)&dbufs[i], counts[i] ? counts[i] * 4 : 1));
        DEV_TRY(cudaMemset(dbufs[i], 0xff, counts[i] * 4));
    }
    linseq_exec ex = exec ? *exec : (linseq_exec){0};
    ex.device = LINSEQ_DEVICE_CUDA;
    st = fn(&dc, &ex, dbufs);
    if (st != LINSEQ_OK) goto done;
    DEV_TRY(cudaDeviceSynchronize());
    for (int i = 0; i < n; i++)
        if (bufs[i] && counts[i])
            DEV_TRY(cudaMemcpy(bufs[i], dbufs[i], counts[i] * 4, cudaMemcpyDeviceToHost));
done:
    free(dc.problem);
    for (int i = 0; i < n; i++) cudaFree(dbufs[i]);
    for (int i = 0; i < c->n_inputs; i++) cudaFree(m.dev[i]);
    return st;
}

#else

linseq_status case_call_on_device(const ls_case *c, case_call fn, const linseq_exec *exec,
                                  float *const *bufs, const size_t *counts, int n, char *err,
                                  size_t err_size)
{
    (void)c, (void)fn, (void)exec, (void)bufs, (void)counts, (void)n;
    snprintf(err, err_size, "--device cuda: this build has no CUDA support (make CUDA=1)");
    return LINSEQ_ERR_UNSUPPORTED;
}

#endif
