/* linseq_ssm1_forward and linseq_ssm1_backward (and their training forms, which keep and
 * read the backward's checkpoints: ssm1_saved.c): one validation of the problem for all, then
 * the fast scan (ssm1_scan.c) or its backward (ssm1_scan_bwd.c) with the active ISA's
 * kernels. */
#include <stdlib.h>

#include "core/activation.h"
#include "core/status.h"
#include "core/validate.h"
#include "cuda/cuda_entry.h"
#include "optable/check.h"
#include "ssm/ssm1_op.h"
#include "ssm/ssm_internal.h"
#include "ssm/ssm_kernels.h"

/* The problem as op (SSM1's scan or its segment summary) describes it, then SSM1's own rules,
 * then its input tensors appended to the argument table `a` (whose fn names the entry point).
 * Run first by every entry point, so the backward accepts exactly the problems the forward
 * accepts. */
static linseq_status check_problem(ls_args *a, const ls_op *op, const linseq_ssm1_problem *p,
                                   const linseq_exec *exec)
{
    const char *fn = a->fn;
    linseq_status st = ls_op_check_problem(fn, op, p, exec, false);
    if (st) return st;
    const int64_t G = p->G ? p->G : 1;
    if (p->D % G)
        return ls_fail(fn, LINSEQ_ERR_SHAPE_MISMATCH,
                       "G = %lld does not divide D = %lld; channel d reads group d / (D/G)",
                       (long long)G, (long long)p->D);
    /* mamba's selective_scan adds delta_bias even without softplus; here dt_bias only exists
     * inside softplus(dt + dt_bias), so a bias without softplus would be silently dropped. */
    if (p->dt_bias && !p->dt_softplus)
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "dt_bias is given but dt_softplus is false; dt_bias is only applied as "
                       "softplus(dt + dt_bias): set dt_softplus or pass dt_bias = NULL");
    return ls_op_add_tensors(a, op, p, LS_ROLE_INPUT, p, ls_token_bytes(exec));
}

/* The CUDA kernels read and write the token-major layout only. */
static linseq_status check_cuda_layout(const char *fn, const linseq_ssm1_problem *p)
{
    static const char *const names[] = {"x_strides", "dt_strides", "gate_strides", "B_strides",
                                        "C_strides"};
    const linseq_strides s[] = {p->x_strides, p->dt_strides, p->gate_strides, p->B_strides,
                                p->C_strides};
    if (p->channel_first)
        return ls_fail(fn, LINSEQ_ERR_UNSUPPORTED,
                       "channel_first is set; the CUDA backend takes the token-major layout "
                       "[B,T,D] only (run on the CPU, or pass channel_first = false)");
    for (int i = 0; i < 5; i++)
        if (!ssm_strides_zero(s[i]))
            return ls_fail(fn, LINSEQ_ERR_UNSUPPORTED,
                           "%s is set; the CUDA backend takes dense inputs only (all strides "
                           "zero)",
                           names[i]);
    return LINSEQ_OK;
}

linseq_status linseq_ssm1_forward(const linseq_ssm1_problem *p, const linseq_exec *exec, float *y,
                                  float *hT)
{
    ls_isa isa;
    linseq_status st = ls_isa_resolve("linseq_ssm1_forward", &isa);
    return st ? st : ls_ssm1_forward_isa(p, exec, y, hT, isa);
}

linseq_status linseq_ssm1_backward(const linseq_ssm1_problem *p, const linseq_exec *exec,
                                   const float *d_y, const float *d_hT,
                                   const linseq_ssm1_grads *grads)
{
    ls_isa isa;
    linseq_status st = ls_isa_resolve("linseq_ssm1_backward", &isa);
    return st ? st : ls_ssm1_backward_isa(p, exec, d_y, d_hT, grads, isa);
}

/* The saved training block lives in host memory and feeds the CPU backward. */
static linseq_status check_saved_exec(const char *fn, const linseq_exec *exec)
{
    if (!ls_on_cuda(exec)) return LINSEQ_OK;
    return ls_fail(fn, LINSEQ_ERR_UNSUPPORTED,
                   "the saved training block is CPU-only; on CUDA call linseq_ssm1_forward and "
                   "linseq_ssm1_backward");
}

/* The forward, and with saved != NULL the training forward that also fills saved. */
static linseq_status forward_impl(const char *fn, const linseq_ssm1_problem *p,
                                  const linseq_exec *exec, float *y, float *hT, void *saved,
                                  size_t saved_bytes, ls_isa isa)
{
    ls_clear_error();
    ls_args a = {.fn = fn};
    linseq_status st = check_problem(&a, &ls_op_ssm1, p, exec);
    if (st || (saved && (st = check_saved_exec(fn, exec)))) return st;
    float *const out[] = {y, hT};
    if ((st = ls_op_add_tensors(&a, &ls_op_ssm1, p, LS_ROLE_OUTPUT, out, ls_token_bytes(exec))))
        return st;
    /* a byte buffer that holds floats after its header */
    if (saved)
        ls_arg(&a, "saved", "saved_bytes", saved, true, LS_OUT, 1, 1, (int64_t)saved_bytes)->align =
            sizeof(float);
    ls_arg_structs(&a, p, sizeof *p, NULL, 0, exec);
    if ((st = ssm_check_table(&a, exec, p->cu_seqlens, p->n_seqs, p->B, p->T))) return st;
    if (ls_on_cuda(exec))
        return (st = check_cuda_layout(a.fn, p)) ? st
                                                 : ls_cuda_entry_ssm1_forward(a.fn, p, exec, y, hT);

    int64_t *first = NULL;
    if (saved && (st = ls_ssm1_saved_layout(fn, p, NULL, saved_bytes, &first))) return st;
    float *states =
        saved ? (float *)(void *)((unsigned char *)saved + SSM1_SAVED_HEADER_BYTES) : NULL;
    st = ls_ssm1_scan_train(p, exec, ls_ssm_kernels(isa), y, hT, states, first);
    free(first);
    if (st == LINSEQ_ERR_OUT_OF_MEMORY)
        return ls_fail(a.fn, st, "could not allocate the scan workspace (N = %lld)",
                       (long long)p->N);
    if (!st && saved) ls_ssm1_saved_write_header(p, saved);
    return st;
}

linseq_status ls_ssm1_forward_isa(const linseq_ssm1_problem *p, const linseq_exec *exec, float *y,
                                  float *hT, ls_isa isa)
{
    return forward_impl("linseq_ssm1_forward", p, exec, y, hT, NULL, 0, isa);
}

linseq_status ls_ssm1_forward_train_isa(const linseq_ssm1_problem *p, const linseq_exec *exec,
                                        float *y, float *hT, void *saved, size_t saved_bytes,
                                        ls_isa isa)
{
    static const char fn[] = "linseq_ssm1_forward_train";
    if (!saved) {
        ls_clear_error();
        return ls_fail(fn, LINSEQ_ERR_NULL_POINTER,
                       "argument 'saved' is NULL; expected linseq_ssm1_saved_size bytes");
    }
    return forward_impl(fn, p, exec, y, hT, saved, saved_bytes, isa);
}

linseq_status linseq_ssm1_forward_train(const linseq_ssm1_problem *p, const linseq_exec *exec,
                                        float *y, float *hT, void *saved, size_t saved_bytes)
{
    ls_isa isa;
    linseq_status st = ls_isa_resolve("linseq_ssm1_forward_train", &isa);
    return st ? st : ls_ssm1_forward_train_isa(p, exec, y, hT, saved, saved_bytes, isa);
}

linseq_status linseq_ssm1_saved_size(const linseq_ssm1_problem *p, const linseq_exec *exec,
                                     size_t *bytes)
{
    ls_clear_error();
    /* only the sizes and the sequence offsets matter: the tensors may not exist yet */
    ls_args sizes = {.fn = "linseq_ssm1_saved_size"};
    ls_isa isa; /* the size does not depend on it, but a bad LINSEQ_ISA is refused everywhere */
    linseq_status st = ls_isa_resolve(sizes.fn, &isa);
    if (st) return st;
    st = check_problem(&sizes, &ls_op_ssm1, p, exec);
    if (st || (st = check_saved_exec(sizes.fn, exec))) return st;
    if (!bytes) return ls_fail(sizes.fn, LINSEQ_ERR_NULL_POINTER, "argument 'bytes' is NULL");
    ls_args a = {.fn = sizes.fn};
    ls_op_add_cu_seqlens(&a, &ls_op_ssm1, p);
    if ((st = ssm_check_table(&a, exec, p->cu_seqlens, p->n_seqs, p->B, p->T))) return st;
    return ls_ssm1_saved_size_of(a.fn, p, bytes);
}

/* A gradient of an input the problem does not have would be silently meaningless. dh0 and
 * ddt_bias are the exceptions: an absent h0 or dt_bias is a zero tensor, whose gradient is
 * well defined (but dt_bias exists only inside the softplus). */
linseq_status ssm1_check_option_grads(const char *fn, const linseq_ssm1_problem *p,
                                      const linseq_ssm1_grads *g)
{
    if (g->dgate && !p->gate)
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "dgate is given but gate is NULL: there is no gate to differentiate; "
                       "pass dgate = NULL");
    if (g->dD_skip && !p->D_skip)
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "dD_skip is given but D_skip is NULL: there is no skip term to "
                       "differentiate; pass dD_skip = NULL");
    if (g->ddt_bias && !p->dt_softplus)
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "ddt_bias is given but dt_softplus is false: dt_bias only exists inside "
                       "softplus(dt + dt_bias); pass ddt_bias = NULL");
    return LINSEQ_OK;
}

/* The backward; with saved (from linseq_ssm1_forward_train) it skips the checkpoint pass. */
static linseq_status backward_impl(const char *fn, const linseq_ssm1_problem *p,
                                   const linseq_exec *exec, const void *saved, size_t saved_bytes,
                                   const float *d_y, const float *d_hT,
                                   const linseq_ssm1_grads *grads, ls_isa isa)
{
    ls_clear_error();
    ls_args a = {.fn = fn};
    linseq_status st = check_problem(&a, &ls_op_ssm1, p, exec);
    if (st || (saved && (st = check_saved_exec(fn, exec)))) return st;
    if (!grads)
        return ls_fail(a.fn, LINSEQ_ERR_NULL_POINTER,
                       "grads is NULL; expected a linseq_ssm1_grads (NULL members are skipped)");
    if ((st = ssm1_check_option_grads(a.fn, p, grads))) return st;

    const int64_t T = p->T, N = p->N;
    const size_t te = ls_token_bytes(exec);
    const float *const up[] = {d_y, d_hT};
    if ((st = ls_op_add_tensors(&a, &ls_op_ssm1, p, LS_ROLE_UPSTREAM, up, te)) ||
        (st = ls_op_add_tensors(&a, &ls_op_ssm1, p, LS_ROLE_GRAD, grads, te)))
        return st;
    /* a byte buffer that holds floats after its header */
    if (saved)
        ls_arg(&a, "saved", "saved_bytes", saved, true, LS_IN, 1, 1, (int64_t)saved_bytes)->align =
            sizeof(float);
    ls_arg_structs(&a, p, sizeof *p, grads, sizeof *grads, exec);
    if ((st = ssm_check_table(&a, exec, p->cu_seqlens, p->n_seqs, p->B, p->T))) return st;
    if (ls_on_cuda(exec))
        return (st = check_cuda_layout(a.fn, p))
                   ? st
                   : ls_cuda_entry_ssm1_backward(a.fn, p, exec, d_y, d_hT, grads);

    if (saved) {
        int64_t *first;
        if ((st = ls_ssm1_saved_layout(fn, p, saved, saved_bytes, &first))) return st;
        const float *states =
            (const float *)(const void *)((const unsigned char *)saved + SSM1_SAVED_HEADER_BYTES);
        st = ls_ssm1_scan_backward_saved(p, exec, ls_ssm_kernels(isa), states, first, d_y, d_hT,
                                         grads);
        free(first);
    } else {
        st = ls_ssm1_scan_backward(p, exec, ls_ssm_kernels(isa), d_y, d_hT, grads);
    }
    if (st == LINSEQ_ERR_OUT_OF_MEMORY)
        return ls_fail(a.fn, st,
                       "could not allocate the backward workspace (checkpoints every %d tokens "
                       "and the dB_proj/dC_proj partial sums; T = %lld, N = %lld)",
                       SSM_BWD_SEGMENT, (long long)T, (long long)N);
    return st;
}

linseq_status ls_ssm1_backward_isa(const linseq_ssm1_problem *p, const linseq_exec *exec,
                                   const float *d_y, const float *d_hT,
                                   const linseq_ssm1_grads *grads, ls_isa isa)
{
    return backward_impl("linseq_ssm1_backward", p, exec, NULL, 0, d_y, d_hT, grads, isa);
}

linseq_status ls_ssm1_backward_saved_isa(const linseq_ssm1_problem *p, const linseq_exec *exec,
                                         const void *saved, size_t saved_bytes, const float *d_y,
                                         const float *d_hT, const linseq_ssm1_grads *grads,
                                         ls_isa isa)
{
    static const char fn[] = "linseq_ssm1_backward_saved";
    if (!saved) {
        ls_clear_error();
        return ls_fail(fn, LINSEQ_ERR_NULL_POINTER,
                       "argument 'saved' is NULL; expected what linseq_ssm1_forward_train wrote");
    }
    return backward_impl(fn, p, exec, saved, saved_bytes, d_y, d_hT, grads, isa);
}

linseq_status linseq_ssm1_backward_saved(const linseq_ssm1_problem *p, const linseq_exec *exec,
                                         const void *saved, size_t saved_bytes, const float *d_y,
                                         const float *d_hT, const linseq_ssm1_grads *grads)
{
    ls_isa isa;
    linseq_status st = ls_isa_resolve("linseq_ssm1_backward_saved", &isa);
    return st ? st : ls_ssm1_backward_saved_isa(p, exec, saved, saved_bytes, d_y, d_hT, grads, isa);
}

linseq_status ls_ssm1_decode_isa(const linseq_ssm1_problem *p, const linseq_exec *exec,
                                 float *state, int64_t n_state_rows, const int64_t *state_rows,
                                 float *y, ls_isa isa)
{
    ls_clear_error();
    ls_args a = {.fn = "linseq_ssm1_decode"};
    linseq_status st = check_problem(&a, &ls_op_ssm1, p, exec);
    if (st) return st;
    float *const out[] = {y, NULL}; /* the state is the pool's */
    if ((st = ls_op_add_decode(&a, &ls_op_ssm1, p, state, n_state_rows, state_rows, out,
                               ls_token_bytes(exec))))
        return st;
    ls_arg_structs(&a, p, sizeof *p, NULL, 0, exec);
    if ((st = ssm_check_table(&a, exec, NULL, 0, p->B, p->T))) return st;
    if (ls_on_cuda(exec))
        return ls_fail(a.fn, LINSEQ_ERR_UNSUPPORTED,
                       "exec->device is CUDA; linseq_ssm1_decode runs on the CPU only (on CUDA, "
                       "run linseq_ssm1_forward with h0 == hT on consecutive rows)");
    if ((st = ls_op_check_decode_rows(a.fn, &ls_op_ssm1, p, n_state_rows, state_rows))) return st;
    st = ls_ssm1_scan_pool(p, exec, ls_ssm_kernels(isa), y, state, state_rows);
    if (st == LINSEQ_ERR_OUT_OF_MEMORY)
        return ls_fail(a.fn, st, "could not allocate the scan workspace (N = %lld)",
                       (long long)p->N);
    return st;
}

linseq_status linseq_ssm1_decode(const linseq_ssm1_problem *p, const linseq_exec *exec,
                                 float *state, int64_t n_state_rows, const int64_t *state_rows,
                                 float *y)
{
    ls_isa isa;
    linseq_status st = ls_isa_resolve("linseq_ssm1_decode", &isa);
    return st ? st : ls_ssm1_decode_isa(p, exec, state, n_state_rows, state_rows, y, isa);
}

linseq_status ssm1_check_problem(ls_args *a, const ls_op *op, const linseq_ssm1_problem *p,
                                 const linseq_exec *exec)
{
    return check_problem(a, op, p, exec);
}
