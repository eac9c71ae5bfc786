/* Internal: the CUDA backend, as the public entry points call it after validation.
 *
 * Every function here runs on a problem the entry point has already validated (sizes,
 * shapes, options, pointer alignment, aliasing, cu_seqlens and state_rows values); it only
 * enqueues kernels on the caller's stream and returns without synchronizing, except where
 * it must read something back. All tensor pointers of the problem structs, the outputs and
 * the gradients are device pointers on `call->device`.
 *
 * Element types. With call->bf16 the per-token tensors are __nv_bfloat16 (stored in the
 * `const float *` fields of the problem structs, cast back by the kernels): KDA q, k, v, beta,
 * g, o and their gradients; SSM1 x, dt, B_proj, C_proj, gate, y and their gradients; conv x,
 * y and dx. States (h0, ht, SSM1 h0/hT, conv_state), parameters (A_log, dt_bias, A, D_skip,
 * weight, bias) and their gradients are float32 always, and every kernel accumulates in
 * float32.
 *
 * Semantics are the CPU path's, exactly (include/linseq.h, README "Semantics"); tests/cuda
 * compares the two. Errors: a failed CUDA call returns LINSEQ_ERR_DEVICE through ls_fail
 * with the call and cudaGetErrorString in the message. Workspace comes from cudaMallocAsync
 * on the stream (the device's default memory pool, which the entry point keeps from
 * returning memory to the driver at every synchronize) and is freed on it before returning.
 *
 * This header is plain C so that the C entry points and the .cu files share it. */
#ifndef LS_CUDA_OPS_H
#define LS_CUDA_OPS_H

#include <stdbool.h>
#include <stdint.h>

#include "linseq.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ls_cuda_call {
    const char *fn;                 /* the public entry point, for error messages */
    int device;                     /* CUDA device ordinal */
    void *stream;                   /* cudaStream_t; NULL = the legacy default stream */
    bool bf16;                      /* per-token tensors are bf16 (see above) */
    int chunk;                      /* KDA: chunk size in chunked mode; 0 = recurrent mode */
    int64_t n_seqs;                 /* state rows: B, or the number of packed sequences */
    int64_t max_len;                /* the longest sequence (T without cu_seqlens) */
    const int64_t *cu_seqlens_host; /* a host copy of the offsets (validated), or NULL */
} ls_cuda_call;

/* KDA. HV, scale: the problem's with defaults resolved (HV = H when 0, scale = K^-0.5 when
 * 0). cu_seqlens in the problem is the caller's device pointer. */
linseq_status ls_cuda_kda_forward(const linseq_kda_problem *p, int64_t HV, float scale,
                                  const ls_cuda_call *call, void *o, float *ht);
linseq_status ls_cuda_kda_backward(const linseq_kda_problem *p, int64_t HV, float scale,
                                   const ls_cuda_call *call, const void *d_o, const float *d_ht,
                                   const linseq_kda_grads *grads);
/* state: the pool [n_rows,HV,K,V] (or V-first) updated in place; rows: device int64 [B] or
 * NULL (request b uses row b); a negative row is padding (o row zeroed, no state touched). */
linseq_status ls_cuda_kda_decode(const linseq_kda_problem *p, int64_t HV, float scale,
                                 const ls_cuda_call *call, float *state, int64_t n_rows,
                                 const int64_t *rows, void *o);

/* The standalone gate: g_raw and g per-token (bf16 with call->bf16), A_log/dt_bias float32. */
linseq_status ls_cuda_kda_gate_forward(const linseq_kda_gate_problem *p, const ls_cuda_call *call,
                                       void *g);
linseq_status ls_cuda_kda_gate_backward(const linseq_kda_gate_problem *p, const ls_cuda_call *call,
                                        const void *d_g, const linseq_kda_gate_grads *grads);

/* SSM1 (the problem as the caller gave it: G == 0 means one group). The backward checkpoints the state every 64 tokens (or
 * another fixed interval) in device memory and recomputes inside a segment: never one
 * state per token. */
linseq_status ls_cuda_ssm1_forward(const linseq_ssm1_problem *p, const ls_cuda_call *call, void *y,
                                   float *hT);
linseq_status ls_cuda_ssm1_backward(const linseq_ssm1_problem *p, const ls_cuda_call *call,
                                    const void *d_y, const float *d_hT,
                                    const linseq_ssm1_grads *grads);

/* Causal conv1d. conv_state_out may equal conv_state (decode: the update in place). */
linseq_status ls_cuda_conv1d_forward(const linseq_conv1d_problem *p, const ls_cuda_call *call,
                                     void *y, float *conv_state_out);
linseq_status ls_cuda_conv1d_backward(const linseq_conv1d_problem *p, const ls_cuda_call *call,
                                      const void *d_y, const float *d_conv_state_out,
                                      const linseq_conv1d_grads *grads);

/* A workspace free (cudaFreeAsync, in a destructor, which cannot return a status) failed with
 * this cudaError_t: the entry point reports it as LINSEQ_ERR_DEVICE when the call has no
 * earlier failure. Per thread. */
void ls_cuda_note_free_failure(int cuda_error);

#ifdef __cplusplus
}
#endif
#endif
