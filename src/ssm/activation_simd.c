/* The SSM1 and conv1d kernels' activations over arrays, compiled once per ISA: the tests
 * compare an in-kernel option with the same math applied outside through these, which run the
 * very vector forms (ssm_vec.h) the kernels inline. */
#include "ssm/ssm_kernels.h"
#include "ssm/ssm_vec.h"

LS_INLINE vf apply(ls_ssm_vfn fn, linseq_activation act, vf x)
{
    switch (fn) {
    case LS_SSM_VACT: return vf_act(act, x);
    case LS_SSM_VACT_GRAD: return vf_act_grad(act, x);
    case LS_SSM_VSOFTPLUS: return vf_softplus(x);
    default: return vf_softplus_grad(x);
    }
}

void LS_ISA_FN(ls_ssm_vmath_n)(ls_ssm_vfn fn, linseq_activation act, int64_t n, const float *x,
                               float *y)
{
    for (int64_t i = 0; i < n; i += VW)
        vf_store_part(y + i, apply(fn, act, vf_load_part(x + i, n - i)), n - i);
}
