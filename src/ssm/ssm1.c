/* linseq_ssm1_forward: validates every argument, then runs the fast scan (ssm1_scan.c). */
#include "core/activation.h"
#include "core/status.h"
#include "core/validate.h"
#include "ssm/ssm_internal.h"

#define FN "linseq_ssm1_forward"

linseq_status linseq_ssm1_forward(const linseq_ssm1_problem *p, const linseq_exec *exec, float *y,
                                  float *hT)
{
    ls_clear_error();
    if (!p)
        return ls_fail(FN, LINSEQ_ERR_NULL_POINTER,
                       "problem is NULL; expected a linseq_ssm1_problem");
    linseq_status st;
    if ((st = ls_check_min(FN, "B", p->B, 1)) || (st = ls_check_min(FN, "T", p->T, 1)) ||
        (st = ls_check_min(FN, "D", p->D, 1)) || (st = ls_check_min(FN, "N", p->N, 1)))
        return st;
    if (p->G < 0)
        return ls_fail(FN, LINSEQ_ERR_INVALID_SIZE,
                       "size G = %lld; expected G >= 1 (or 0, meaning one group)", (long long)p->G);
    const int64_t G = p->G ? p->G : 1;
    if (p->D % G)
        return ls_fail(FN, LINSEQ_ERR_SHAPE_MISMATCH,
                       "G = %lld does not divide D = %lld; channel d reads group d / (D/G)",
                       (long long)G, (long long)p->D);
    if ((st = ssm_check_common(FN, exec, p->cu_seqlens, p->n_seqs))) return st;
    if (!ls_activation_valid(p->gate_activation))
        return ls_fail(FN, LINSEQ_ERR_INVALID_ENUM,
                       "gate_activation = %d; expected a linseq_activation (LINSEQ_ACT_DEFAULT .. "
                       "LINSEQ_ACT_RELU)",
                       (int)p->gate_activation);
    /* mamba's selective_scan adds delta_bias even without softplus; here dt_bias only exists
     * inside softplus(dt + dt_bias), so a bias without softplus would be silently dropped. */
    if (p->dt_bias && !p->dt_softplus)
        return ls_fail(FN, LINSEQ_ERR_INVALID_VALUE,
                       "dt_bias is given but dt_softplus is false; dt_bias is only applied as "
                       "softplus(dt + dt_bias): set dt_softplus or pass dt_bias = NULL");

    const int64_t B = p->B, T = p->T, D = p->D, N = p->N;
    const int64_t n_seqs = ssm_seq_count(p->cu_seqlens, p->n_seqs, B);
    ls_args a = {.fn = FN};
    ls_arg(&a, "x", "B,T,D", p->x, true, LS_IN, sizeof(float), 3, B, T, D);
    ls_arg(&a, "dt", "B,T,D", p->dt, true, LS_IN, sizeof(float), 3, B, T, D);
    ls_arg(&a, "A", "D,N", p->A, true, LS_IN, sizeof(float), 2, D, N);
    ls_arg(&a, "B_proj", "B,T,G,N", p->B_proj, true, LS_IN, sizeof(float), 4, B, T, G, N);
    ls_arg(&a, "C_proj", "B,T,G,N", p->C_proj, true, LS_IN, sizeof(float), 4, B, T, G, N);
    ls_arg(&a, "D_skip", "D", p->D_skip, false, LS_IN, sizeof(float), 1, D);
    ls_arg(&a, "gate", "B,T,D", p->gate, false, LS_IN, sizeof(float), 3, B, T, D);
    ls_arg(&a, "dt_bias", "D", p->dt_bias, false, LS_IN, sizeof(float), 1, D);
    ls_arg(&a, "h0", "N_seq,D,N", p->h0, false, LS_IN, sizeof(float), 3, n_seqs, D, N);
    ls_arg(&a, "cu_seqlens", "n_seqs+1", p->cu_seqlens, false, LS_IN, sizeof(int64_t), 1,
           ssm_cu_entries(p->cu_seqlens, p->n_seqs));
    ls_arg(&a, "y", "B,T,D", y, true, LS_OUT, sizeof(float), 3, B, T, D);
    ls_arg(&a, "hT", "N_seq,D,N", hT, false, LS_OUT, sizeof(float), 3, n_seqs, D, N)->may_alias =
        p->h0;
    if ((st = ls_args_validate(&a))) return st;
    if (p->cu_seqlens && (st = ls_check_cu_seqlens(FN, p->cu_seqlens, p->n_seqs, B, T)))
        return st;

    st = ls_ssm1_scan(p, exec, y, hT);
    if (st == LINSEQ_ERR_OUT_OF_MEMORY)
        return ls_fail(FN, st, "could not allocate the scan workspace (N = %lld)", (long long)N);
    return st;
}
