/* Internal: the CUDA branch of each public entry point.
 *
 * An entry point validates its problem as for the CPU (sizes, options, shapes, pointer
 * alignment, aliasing: none of it reads tensor memory), with the per-token tensors sized by
 * exec->dtype, then hands a device call to the function here. It selects the device, copies
 * cu_seqlens (and decode's state_rows) to the host to check their values exactly as the CPU
 * path does, and calls the CUDA kernels (cuda_ops.h). The caller's current device is
 * restored before returning. A build without CUDA never gets here (ls_check_exec refuses the
 * device first). */
#ifndef LS_CUDA_ENTRY_H
#define LS_CUDA_ENTRY_H

#include "kda/kda_internal.h"
#include "linseq.h"

linseq_status ls_cuda_entry_kda_forward(const char *fn, const kda_plan *pl,
                                        const linseq_exec *exec, float *o, float *ht);
linseq_status ls_cuda_entry_kda_backward(const char *fn, const kda_plan *pl,
                                         const linseq_exec *exec, const float *d_o,
                                         const float *d_ht, const linseq_kda_grads *grads);
linseq_status ls_cuda_entry_kda_decode(const char *fn, const kda_plan *pl,
                                       const linseq_exec *exec, float *state,
                                       int64_t n_state_rows, const int64_t *state_rows,
                                       float *o);
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
