/* linseq_ssm1_forward and linseq_ssm1_backward: one validation of the problem for both, then
 * the fast scan (ssm1_scan.c) or its backward (ssm1_scan_bwd.c) with the active ISA's
 * kernels. */
#include "core/activation.h"
#include "core/status.h"
#include "core/validate.h"
#include "cuda/cuda_entry.h"
#include "ssm/ssm_internal.h"
#include "ssm/ssm_kernels.h"

/* The sizes, options and exec of a problem, then its input tensors appended to the argument
 * table `a` (whose fn names the entry point). Run first by both entry points, so the backward
 * accepts exactly the problems the forward accepts. */
static linseq_status check_problem(ls_args *a, const linseq_ssm1_problem *p,
                                   const linseq_exec *exec)
{
    const char *fn = a->fn;
    if (!p)
        return ls_fail(fn, LINSEQ_ERR_NULL_POINTER,
                       "problem is NULL; expected a linseq_ssm1_problem");
    linseq_status st;
    if ((st = ls_check_min(fn, "B", p->B, 1)) || (st = ls_check_min(fn, "T", p->T, 1)) ||
        (st = ls_check_min(fn, "D", p->D, 1)) || (st = ls_check_min(fn, "N", p->N, 1)))
        return st;
    if (p->G < 0)
        return ls_fail(fn, LINSEQ_ERR_INVALID_SIZE,
                       "size G = %lld; expected G >= 1 (or 0, meaning one group)", (long long)p->G);
    const int64_t G = p->G ? p->G : 1;
    if (p->D % G)
        return ls_fail(fn, LINSEQ_ERR_SHAPE_MISMATCH,
                       "G = %lld does not divide D = %lld; channel d reads group d / (D/G)",
                       (long long)G, (long long)p->D);
    if ((st = ssm_check_common(fn, exec, p->cu_seqlens, p->n_seqs))) return st;
    if (!ls_activation_valid(p->gate_activation))
        return ls_fail(fn, LINSEQ_ERR_INVALID_ENUM,
                       "gate_activation = %d; expected a linseq_activation (LINSEQ_ACT_DEFAULT .. "
                       "LINSEQ_ACT_RELU)",
                       (int)p->gate_activation);
    /* mamba's selective_scan adds delta_bias even without softplus; here dt_bias only exists
     * inside softplus(dt + dt_bias), so a bias without softplus would be silently dropped. */
    if (p->dt_bias && !p->dt_softplus)
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "dt_bias is given but dt_softplus is false; dt_bias is only applied as "
                       "softplus(dt + dt_bias): set dt_softplus or pass dt_bias = NULL");

    const int64_t B = p->B, T = p->T, D = p->D, N = p->N;
    const int64_t n_seqs = ssm_seq_count(p->cu_seqlens, p->n_seqs, B);
    const size_t te = ls_token_bytes(exec);
    ls_arg(a, "x", "B,T,D", p->x, true, LS_IN, te, 3, B, T, D);
    ls_arg(a, "dt", "B,T,D", p->dt, true, LS_IN, te, 3, B, T, D);
    ls_arg(a, "A", "D,N", p->A, true, LS_IN, sizeof(float), 2, D, N);
    ls_arg(a, "B_proj", "B,T,G,N", p->B_proj, true, LS_IN, te, 4, B, T, G, N);
    ls_arg(a, "C_proj", "B,T,G,N", p->C_proj, true, LS_IN, te, 4, B, T, G, N);
    ls_arg(a, "D_skip", "D", p->D_skip, false, LS_IN, sizeof(float), 1, D);
    ls_arg(a, "gate", "B,T,D", p->gate, false, LS_IN, te, 3, B, T, D);
    ls_arg(a, "dt_bias", "D", p->dt_bias, false, LS_IN, sizeof(float), 1, D);
    /* cu_seqlens before h0: an absurd n_seqs is reported as such, not as h0's size */
    ls_arg(a, "cu_seqlens", "n_seqs+1", p->cu_seqlens, false, LS_IN, sizeof(int64_t), 1,
           ssm_cu_entries(p->cu_seqlens, p->n_seqs));
    ls_arg(a, "h0", "N_seq,D,N", p->h0, false, LS_IN, sizeof(float), 3, n_seqs, D, N);
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

linseq_status ls_ssm1_forward_isa(const linseq_ssm1_problem *p, const linseq_exec *exec, float *y,
                                  float *hT, ls_isa isa)
{
    ls_clear_error();
    ls_args a = {.fn = "linseq_ssm1_forward"};
    linseq_status st = check_problem(&a, p, exec);
    if (st) return st;
    const int64_t n_seqs = ssm_seq_count(p->cu_seqlens, p->n_seqs, p->B);
    const size_t te = ls_token_bytes(exec);
    ls_arg(&a, "y", "B,T,D", y, true, LS_OUT, te, 3, p->B, p->T, p->D);
    ls_arg(&a, "hT", "N_seq,D,N", hT, false, LS_OUT, sizeof(float), 3, n_seqs, p->D, p->N)
        ->may_alias = p->h0;
    ls_arg_structs(&a, p, sizeof *p, NULL, 0, exec);
    if ((st = ssm_check_table(&a, exec, p->cu_seqlens, p->n_seqs, p->B, p->T))) return st;
    if (ls_on_cuda(exec)) return ls_cuda_entry_ssm1_forward(a.fn, p, exec, y, hT);

    st = ls_ssm1_scan(p, exec, ls_ssm_kernels(isa), y, hT);
    if (st == LINSEQ_ERR_OUT_OF_MEMORY)
        return ls_fail(a.fn, st, "could not allocate the scan workspace (N = %lld)",
                       (long long)p->N);
    return st;
}

linseq_status ls_ssm1_backward_isa(const linseq_ssm1_problem *p, const linseq_exec *exec,
                                   const float *d_y, const float *d_hT,
                                   const linseq_ssm1_grads *grads, ls_isa isa)
{
    ls_clear_error();
    ls_args a = {.fn = "linseq_ssm1_backward"};
    linseq_status st = check_problem(&a, p, exec);
    if (st) return st;
    if (!grads)
        return ls_fail(a.fn, LINSEQ_ERR_NULL_POINTER,
                       "grads is NULL; expected a linseq_ssm1_grads (NULL members are skipped)");
    /* A gradient of an input the problem does not have would be silently meaningless. dh0 and
     * ddt_bias are the exceptions: an absent h0 or dt_bias is a zero tensor, whose gradient is
     * well defined. */
    if (grads->dgate && !p->gate)
        return ls_fail(a.fn, LINSEQ_ERR_INVALID_VALUE,
                       "dgate is given but gate is NULL: there is no gate to differentiate; "
                       "pass dgate = NULL");
    if (grads->dD_skip && !p->D_skip)
        return ls_fail(a.fn, LINSEQ_ERR_INVALID_VALUE,
                       "dD_skip is given but D_skip is NULL: there is no skip term to "
                       "differentiate; pass dD_skip = NULL");
    if (grads->ddt_bias && !p->dt_softplus)
        return ls_fail(a.fn, LINSEQ_ERR_INVALID_VALUE,
                       "ddt_bias is given but dt_softplus is false: dt_bias only exists inside "
                       "softplus(dt + dt_bias); pass ddt_bias = NULL");

    const int64_t B = p->B, T = p->T, D = p->D, N = p->N, G = p->G ? p->G : 1;
    const int64_t n_seqs = ssm_seq_count(p->cu_seqlens, p->n_seqs, B);
    const size_t te = ls_token_bytes(exec);
    ls_arg(&a, "d_y", "B,T,D", d_y, true, LS_IN, te, 3, B, T, D);
    ls_arg(&a, "d_hT", "N_seq,D,N", d_hT, false, LS_IN, sizeof(float), 3, n_seqs, D, N);
    ls_arg(&a, "dx", "B,T,D", grads->dx, false, LS_OUT, te, 3, B, T, D);
    ls_arg(&a, "ddt", "B,T,D", grads->ddt, false, LS_OUT, te, 3, B, T, D);
    ls_arg(&a, "dA", "D,N", grads->dA, false, LS_OUT, sizeof(float), 2, D, N);
    ls_arg(&a, "dB_proj", "B,T,G,N", grads->dB_proj, false, LS_OUT, te, 4, B, T, G, N);
    ls_arg(&a, "dC_proj", "B,T,G,N", grads->dC_proj, false, LS_OUT, te, 4, B, T, G, N);
    ls_arg(&a, "dD_skip", "D", grads->dD_skip, false, LS_OUT, sizeof(float), 1, D);
    ls_arg(&a, "dgate", "B,T,D", grads->dgate, false, LS_OUT, te, 3, B, T, D);
    ls_arg(&a, "dh0", "N_seq,D,N", grads->dh0, false, LS_OUT, sizeof(float), 3, n_seqs, D, N);
    ls_arg(&a, "ddt_bias", "D", grads->ddt_bias, false, LS_OUT, sizeof(float), 1, D);
    ls_arg_structs(&a, p, sizeof *p, grads, sizeof *grads, exec);
    if ((st = ssm_check_table(&a, exec, p->cu_seqlens, p->n_seqs, p->B, p->T))) return st;
    if (ls_on_cuda(exec)) return ls_cuda_entry_ssm1_backward(a.fn, p, exec, d_y, d_hT, grads);

    st = ls_ssm1_scan_backward(p, exec, ls_ssm_kernels(isa), d_y, d_hT, grads);
    if (st == LINSEQ_ERR_OUT_OF_MEMORY)
        return ls_fail(a.fn, st,
                       "could not allocate the backward workspace (checkpoints every %d tokens "
                       "and the dB_proj/dC_proj partial sums; T = %lld, N = %lld)",
                       SSM_BWD_SEGMENT, (long long)T, (long long)N);
    return st;
}
