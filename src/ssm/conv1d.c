/* linseq_conv1d_forward and linseq_conv1d_backward: one validation of the problem for both;
 * the forward driver (its kernel is conv1d_simd.c, the backward's conv1d_bwd.c and
 * conv1d_bwd_simd.c).
 *
 * A forward work item is (sequence, span of channels, chunk of tokens). Every item runs the same
 * arithmetic whichever thread takes it, so the result does not depend on the thread count. */
#include <stdlib.h>

#include "core/activation.h"
#include "core/parallel.h"
#include "core/status.h"
#include "core/validate.h"
#include "cuda/cuda_entry.h"
#include "ssm/ssm_internal.h"
#include "ssm/ssm_kernels.h"

linseq_status ls_conv1d_scan(const linseq_conv1d_problem *p, const linseq_exec *exec,
                             const ssm_kernels *kern, float *y, float *state_out)
{
    conv1d_plan pl = {.p = p, .y = y, .state_out = state_out, .act = conv1d_activation(p)};
    const int64_t n_seqs = ssm_seq_count(p->cu_seqlens, p->n_seqs, p->B);
    const int64_t longest = ls_longest_sequence(p->cu_seqlens, n_seqs, p->T);
    pl.n_blocks = (p->D + CONV1D_SPAN - 1) / CONV1D_SPAN;
    pl.chunk = p->W - 1 > CONV1D_CHUNK ? p->W - 1 : CONV1D_CHUNK;
    pl.n_chunks = longest > pl.chunk ? (longest + pl.chunk - 1) / pl.chunk : 1;
    int64_t n_items;
    if (!ls_mul_ok(&n_items, 3, n_seqs, pl.n_blocks, pl.n_chunks)) return LINSEQ_ERR_OUT_OF_MEMORY;
    const int n_threads = ls_resolve_threads(
        exec, n_items, 2.0 * (double)p->B * (double)p->T * (double)p->D * (double)p->W);

    /* Whole rows of CONV1D_SPAN floats: every thread's part is a multiple of 64 bytes, so
     * threads never share a cache line. */
    int64_t total_bytes;
    if (p->W > INT64_MAX / CONV1D_SPAN / 2) return LINSEQ_ERR_OUT_OF_MEMORY;
    const int64_t thread_floats = CONV1D_FWD_FLOATS(p->W);
    if (!ls_mul_ok(&total_bytes, 3, thread_floats, (int64_t)n_threads, (int64_t)sizeof(float)))
        return LINSEQ_ERR_OUT_OF_MEMORY;
    pl.thread_floats = (size_t)thread_floats;
    pl.workspace = aligned_alloc(64, (size_t)total_bytes);
    if (!pl.workspace) return LINSEQ_ERR_OUT_OF_MEMORY;

    ls_parallel_for(n_items, n_threads, kern->conv1d_item, &pl);
    free(pl.workspace);
    return LINSEQ_OK;
}

/* The sizes, options and exec of a problem, then its input tensors appended to the argument
 * table `a` (whose fn names the entry point). Run first by both entry points, so the backward
 * accepts exactly the problems the forward accepts. */
static linseq_status check_problem(ls_args *a, const linseq_conv1d_problem *p,
                                   const linseq_exec *exec)
{
    const char *fn = a->fn;
    if (!p)
        return ls_fail(fn, LINSEQ_ERR_NULL_POINTER,
                       "problem is NULL; expected a linseq_conv1d_problem");
    linseq_status st;
    if ((st = ls_check_min(fn, "B", p->B, 1)) || (st = ls_check_min(fn, "T", p->T, 1)) ||
        (st = ls_check_min(fn, "D", p->D, 1)) || (st = ls_check_min(fn, "W", p->W, 1)))
        return st;
    if ((st = ssm_check_common(fn, exec, p->cu_seqlens, p->n_seqs))) return st;
    if (!ls_activation_valid(p->activation))
        return ls_fail(fn, LINSEQ_ERR_INVALID_ENUM,
                       "activation = %d; expected a linseq_activation (LINSEQ_ACT_DEFAULT .. "
                       "LINSEQ_ACT_RELU)",
                       (int)p->activation);

    const int64_t B = p->B, T = p->T, D = p->D, W = p->W;
    const int64_t n_seqs = ssm_seq_count(p->cu_seqlens, p->n_seqs, B);
    const size_t te = ls_token_bytes(exec);
    ls_arg(a, "x", "B,T,D", p->x, true, LS_IN, te, 3, B, T, D);
    ls_arg(a, "weight", "D,W", p->weight, true, LS_IN, sizeof(float), 2, D, W);
    ls_arg(a, "bias", "D", p->bias, false, LS_IN, sizeof(float), 1, D);
    ls_arg(a, "cu_seqlens", "n_seqs+1", p->cu_seqlens, false, LS_IN, sizeof(int64_t), 1,
           ssm_cu_entries(p->cu_seqlens, p->n_seqs));
    /* With W == 1 there is no state: the state pointers are neither read nor written. */
    if (W > 1)
        ls_arg(a, "conv_state", "N_seq,D,W-1", p->conv_state, false, LS_IN, sizeof(float), 3,
               n_seqs, D, W - 1);
    return LINSEQ_OK;
}

linseq_status linseq_conv1d_forward(const linseq_conv1d_problem *p, const linseq_exec *exec,
                                    float *y, float *conv_state_out)
{
    ls_isa isa;
    linseq_status st = ls_isa_resolve("linseq_conv1d_forward", &isa);
    return st ? st : ls_conv1d_forward_isa(p, exec, y, conv_state_out, isa);
}

linseq_status linseq_conv1d_backward(const linseq_conv1d_problem *p, const linseq_exec *exec,
                                     const float *d_y, const float *d_conv_state_out,
                                     const linseq_conv1d_grads *grads)
{
    ls_isa isa;
    linseq_status st = ls_isa_resolve("linseq_conv1d_backward", &isa);
    return st ? st : ls_conv1d_backward_isa(p, exec, d_y, d_conv_state_out, grads, isa);
}

linseq_status ls_conv1d_forward_isa(const linseq_conv1d_problem *p, const linseq_exec *exec,
                                    float *y, float *conv_state_out, ls_isa isa)
{
    ls_clear_error();
    ls_args a = {.fn = "linseq_conv1d_forward"};
    linseq_status st = check_problem(&a, p, exec);
    if (st) return st;
    const int64_t n_seqs = ssm_seq_count(p->cu_seqlens, p->n_seqs, p->B), W = p->W;
    const size_t te = ls_token_bytes(exec);
    ls_arg(&a, "y", "B,T,D", y, true, LS_OUT, te, 3, p->B, p->T, p->D);
    if (W > 1)
        ls_arg(&a, "conv_state_out", "N_seq,D,W-1", conv_state_out, false, LS_OUT, sizeof(float), 3,
               n_seqs, p->D, W - 1)
            ->may_alias = p->conv_state;
    ls_arg_structs(&a, p, sizeof *p, NULL, 0, exec);
    if ((st = ssm_check_table(&a, exec, p->cu_seqlens, p->n_seqs, p->B, p->T))) return st;
    if (ls_on_cuda(exec))
        return ls_cuda_entry_conv1d_forward(a.fn, p, exec, y, W > 1 ? conv_state_out : NULL);

    st = ls_conv1d_scan(p, exec, ls_ssm_kernels(isa), y, W > 1 ? conv_state_out : NULL);
    if (st == LINSEQ_ERR_OUT_OF_MEMORY)
        return ls_fail(a.fn, st, "could not allocate the workspace (W = %lld)", (long long)W);
    return st;
}

linseq_status ls_conv1d_backward_isa(const linseq_conv1d_problem *p, const linseq_exec *exec,
                                     const float *d_y, const float *d_conv_state_out,
                                     const linseq_conv1d_grads *grads, ls_isa isa)
{
    ls_clear_error();
    ls_args a = {.fn = "linseq_conv1d_backward"};
    linseq_status st = check_problem(&a, p, exec);
    if (st) return st;
    if (!grads)
        return ls_fail(a.fn, LINSEQ_ERR_NULL_POINTER,
                       "grads is NULL; expected a linseq_conv1d_grads (NULL members are skipped)");
    /* A bias gradient without a bias would be silently meaningless; dconv_state is allowed
     * without conv_state (the gradient at the zero state). */
    if (grads->dbias && !p->bias)
        return ls_fail(a.fn, LINSEQ_ERR_INVALID_VALUE,
                       "dbias is given but bias is NULL: there is no bias to differentiate; "
                       "pass dbias = NULL");

    const int64_t B = p->B, T = p->T, D = p->D, W = p->W;
    const int64_t n_seqs = ssm_seq_count(p->cu_seqlens, p->n_seqs, B);
    const size_t te = ls_token_bytes(exec);
    ls_arg(&a, "d_y", "B,T,D", d_y, true, LS_IN, te, 3, B, T, D);
    if (W > 1)
        ls_arg(&a, "d_conv_state_out", "N_seq,D,W-1", d_conv_state_out, false, LS_IN, sizeof(float),
               3, n_seqs, D, W - 1);
    ls_arg(&a, "dx", "B,T,D", grads->dx, false, LS_OUT, te, 3, B, T, D);
    ls_arg(&a, "dweight", "D,W", grads->dweight, false, LS_OUT, sizeof(float), 2, D, W);
    ls_arg(&a, "dbias", "D", grads->dbias, false, LS_OUT, sizeof(float), 1, D);
    if (W > 1)
        ls_arg(&a, "dconv_state", "N_seq,D,W-1", grads->dconv_state, false, LS_OUT, sizeof(float),
               3, n_seqs, D, W - 1);
    ls_arg_structs(&a, p, sizeof *p, grads, sizeof *grads, exec);
    if ((st = ssm_check_table(&a, exec, p->cu_seqlens, p->n_seqs, p->B, p->T))) return st;

    /* With W == 1 the state gradients do not exist: the kernel never sees their pointers. */
    linseq_conv1d_grads used = *grads;
    if (W == 1) used.dconv_state = NULL;
    if (ls_on_cuda(exec))
        return ls_cuda_entry_conv1d_backward(a.fn, p, exec, d_y, W > 1 ? d_conv_state_out : NULL,
                                             &used);
    st = ls_conv1d_scan_backward(p, exec, ls_ssm_kernels(isa), d_y, W > 1 ? d_conv_state_out : NULL,
                                 &used);
    if (st == LINSEQ_ERR_OUT_OF_MEMORY)
        return ls_fail(a.fn, st, "could not allocate the workspace (W = %lld)", (long long)W);
    return st;
}
