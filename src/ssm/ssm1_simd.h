/* Internal: the SSM1 step arithmetic shared by the forward and backward kernels (included by
 * ssm1_scan_simd.c and ssm1_scan_bwd_simd.c only). The forward, the backward's checkpoint pass
 * and its segment recompute all call these, so the states they produce are the same bits.
 *
 * Lanes are channels: a block of SSM_LANES channels is STRIPS vectors wide, and its state
 * tile is state-major, [N][SSM_LANES], so one state row is STRIPS whole vectors. */
#ifndef LS_SSM1_SIMD_H
#define LS_SSM1_SIMD_H

#include "ssm/ssm_internal.h"
#include "ssm/ssm_vec.h"

/* dt after softplus(dt + dt_bias) (when asked; dt_bias NULL adds zero, which changes no bit
 * of softplus) for the lanes of strip s, the first `valid` of them real. */
LS_INLINE vf ssm1_step_dt(const linseq_ssm1_problem *p, const float *dt_row, int64_t d,
                          int64_t valid)
{
    vf dt = vf_load_part(dt_row, valid);
    if (p->dt_softplus)
        dt = vf_softplus(vf_add(dt, p->dt_bias ? vf_load_part(p->dt_bias + d, valid) : vf_zero()));
    return dt;
}

/* exp(A dt): the decay of one state row over one token. */
LS_INLINE vf ssm1_decay(vf rate, vf dt) { return vf_exp(vf_mul(rate, dt)); }

/* h_t = a_t h_{t-1} + (dt x) B_t */
LS_INLINE vf ssm1_update(vf decay, vf h_prev, vf dtx, vf b)
{
    return vf_fmadd(decay, h_prev, vf_mul(dtx, b));
}

/* The output before the gate: out = sum_n h C (n ascending, one fma each, from 0), then
 * D x: the backward recomputes it for dgate in the same order. */
LS_INLINE vf ssm1_skip(vf out, const float *D_skip, vf x, int64_t valid)
{
    return D_skip ? vf_fmadd(vf_load_part(D_skip, valid), x, out) : out;
}

#endif
