/* Internal: the CUDA branch of each public entry point.
 *
 * An entry point validates its problem as for the CPU (sizes, options, shapes, pointer
 * alignment, aliasing: none of it reads tensor memory), with the per-token tensors sized by
 * exec->dtype, then hands a device call to the function here. It selects the device, copies
 * cu_seqlens to the host to check its values exactly as the CPU path does (core/validate.h),
 * and calls the CUDA kernels (cuda_ops.h). The caller's current device is restored before
 * returning. A build without CUDA never gets here (ls_check_exec refuses the device first).
 *
 * The backend is a leaf: it takes the public structs and plain values, and calls nothing of
 * the op layers (kda/, ssm/). An op that must check device data with its own rules (decode's
 * state_rows) reads it with ls_cuda_entry_copy_i64 and checks the host copy itself. */
#ifndef LS_CUDA_ENTRY_H
#define LS_CUDA_ENTRY_H

#include <stdint.h>

#include "linseq.h"

/* A validated KDA problem with its defaults resolved, as the entry point planned it. */
typedef struct ls_cuda_kda_args {
    const linseq_kda_problem *p;
    int64_t HV;  /* value heads: p->HV, or H when 0 */
    float scale; /* p->scale, or K^-0.5 when 0 */
    int chunk;   /* chunk size in chunked mode, 0 in recurrent mode */
} ls_cuda_kda_args;

/* n int64 values of device memory (on exec's device, ordered after the work already on
 * exec's stream) into a new host array *host that the caller frees; name is the argument
 * for error messages. */
linseq_status ls_cuda_entry_copy_i64(const char *fn, const linseq_exec *exec, const char *name,
                                     const int64_t *device_values, int64_t n, int64_t **host);

linseq_status ls_cuda_entry_kda_forward(const char *fn, const ls_cuda_kda_args *kda,
                                        const linseq_exec *exec, float *o, float *ht);
linseq_status ls_cuda_entry_kda_backward(const char *fn, const ls_cuda_kda_args *kda,
                                         const linseq_exec *exec, const float *d_o,
                                         const float *d_ht, const linseq_kda_grads *grads);
/* state_rows (device memory, or NULL) must already be checked by the caller. */
linseq_status ls_cuda_entry_kda_decode(const char *fn, const ls_cuda_kda_args *kda,
                                       const linseq_exec *exec, float *state, int64_t n_state_rows,
                                       const int64_t *state_rows, float *o);
linseq_status ls_cuda_entry_kda_gate_forward(const char *fn, const linseq_kda_gate_problem *p,
                                             const linseq_exec *exec, float *g);
linseq_status ls_cuda_entry_kda_gate_backward(const char *fn, const linseq_kda_gate_problem *p,
                                              const linseq_exec *exec, const float *d_g,
                                              const linseq_kda_gate_grads *grads);
linseq_status ls_cuda_entry_ssm1_forward(const char *fn, const linseq_ssm1_problem *p,
                                         const linseq_exec *exec, float *y, float *hT);
linseq_status ls_cuda_entry_ssm1_backward(const char *fn, const linseq_ssm1_problem *p,
                                          const linseq_exec *exec, const float *d_y,
                                          const float *d_hT, const linseq_ssm1_grads *grads);
linseq_status ls_cuda_entry_conv1d_forward(const char *fn, const linseq_conv1d_problem *p,
                                           const linseq_exec *exec, float *y,
                                           float *conv_state_out);
linseq_status ls_cuda_entry_conv1d_backward(const char *fn, const linseq_conv1d_problem *p,
                                            const linseq_exec *exec, const float *d_y,
                                            const float *d_conv_state_out,
                                            const linseq_conv1d_grads *grads);

#endif
