/* The last step of the KDA backward, compiled once per ISA: the dq and dk rows of one
 * (sequence, qk head) hold the group's gradients w.r.t. qs = scale l2norm(q) and
 * ks = l2norm(k); turn them into gradients w.r.t. the raw q and k. */
#include <math.h>

#include "core/kda_math.h"
#include "kda/kda_backward.h"
#include "kda/kda_simd.h"

/* dx = r dxhat - r^3 x (x . dxhat) with r = 1/sqrt(|x|^2 + eps), in place on dx (holding
 * dxhat * mul on entry... after the scaling below). The products are vector dot products; r
 * and r^3 (x . dxhat) are formed in double. */
static void l2norm_backward_row(int64_t K, const float *x, float mul, double eps, float *dx)
{
    if (mul != 1.0f) ls_vscale(K, mul, dx);
    const double ss = (double)ls_vdot(K, x, x), dot = (double)ls_vdot(K, x, dx);
    const double r = ls_kda_l2norm_rsqrt(ss, eps);
    const vf vr = vf_set1((float)r), vc = vf_set1((float)(r * r * r * dot));
    int64_t i = 0;
    for (; i + VW <= K; i += VW)
        vf_store(dx + i, vf_fnmadd(vc, vf_load(x + i), vf_mul(vr, vf_load(dx + i))));
    if (i < K)
        vf_store_n(dx + i,
                   vf_fnmadd(vc, vf_load_n(x + i, K - i), vf_mul(vr, vf_load_n(dx + i, K - i))),
                   K - i);
}

void LS_ISA_FN(kda_bwd_chain_qk)(const kda_bwd *b, int64_t tok0, int64_t len, int64_t h)
{
    const kda_plan *pl = b->pl;
    const linseq_kda_problem *p = pl->p;
    const linseq_kda_grads *gr = b->gr;
    const int64_t H = p->H, K = p->K;
    for (int64_t tok = tok0; tok < tok0 + len; tok++) {
        const int64_t at = (tok * H + h) * K;
        if (gr->dq) {
            if (p->qk_l2norm)
                l2norm_backward_row(K, p->q + at, pl->scale, pl->l2norm_eps, gr->dq + at);
            else
                ls_vscale(K, pl->scale, gr->dq + at);
        }
        if (gr->dk && p->qk_l2norm)
            l2norm_backward_row(K, p->k + at, 1.0f, pl->l2norm_eps, gr->dk + at);
    }
}
