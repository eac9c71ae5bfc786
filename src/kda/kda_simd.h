/* Internal: per-ISA inline helpers of the KDA kernels (include from *_simd.c files after
 * simd/vec.h): the in-kernel gate, the loading of one token with its in-kernel options, and
 * the access to per-token tensors in either storage type (float32, or bf16 widened on load
 * and rounded on store: simd/bf16.h). */
#ifndef LS_KDA_SIMD_H
#define LS_KDA_SIMD_H

#include <math.h>
#include <string.h>

#include "core/kda_math.h"
#include "kda/kda_internal.h"
#include "simd/bf16.h"
#include "simd/gemm.h"
#include "simd/vec.h"

/* The n values at element offset `at` of a per-token tensor as floats: in place for float32;
 * widened (exactly) into tmp for bf16, so the arithmetic that follows sees the same floats
 * as the float32 path run on the widened values. */
static inline const float *kda_token_span(const kda_plan *pl, const float *base, int64_t at,
                                          int64_t n, float *tmp)
{
    if (!pl->bf16) return base + at;
    ls_widen_bf16(n, (const uint16_t *)(const void *)base + at, tmp);
    return tmp;
}

/* The w <= VW values at element offset `at` of a per-token tensor as one vector (widened
 * from bf16 in the register). */
static inline vf kda_token_vec(const kda_plan *pl, const float *base, int64_t at, int64_t w)
{
    if (pl->bf16) {
        const uint16_t *h = (const uint16_t *)(const void *)base + at;
        return w == VW ? vf_load_bf16(h) : vf_load_bf16_n(h, w);
    }
    return w == VW ? vf_load(base + at) : vf_load_n(base + at, w);
}

static inline float kda_token_value(const kda_plan *pl, const float *base, int64_t at)
{
    return pl->bf16 ? ls_bf16_to_f32(((const uint16_t *)(const void *)base)[at]) : base[at];
}

/* The n floats of src, rounded once, into a bf16 per-token output at element offset `at`
 * (float32 outputs are written where they lie and never pass through here). */
static inline void kda_token_store_bf16(float *base, int64_t at, int64_t n, const float *src)
{
    ls_round_bf16(n, src, (uint16_t *)(void *)base + at);
}

/* ls_kda_gatef (core/kda_math.h) on one vector, in the same order of operations:
 * -exp(A_log) softplus(raw + bias), or lower_bound sigmoid(exp(A_log) (raw + bias)). The
 * standalone gate op runs this same function, so both agree bit for bit on one ISA. */
static inline vf kda_gate_vec(vf raw, vf bias, float a_log, float lower_bound)
{
    const vf x = vf_add(raw, bias);
    if (lower_bound == 0.0f) return vf_mul(vf_set1(-expf(a_log)), vf_softplus(x));
    return vf_mul(vf_set1(lower_bound), vf_sigmoid(vf_mul(vf_set1(expf(a_log)), x)));
}

/* out[0..n) = gate(raw[i] + bias[i]) (bias NULL: zeros). */
static inline void kda_gate_row(int64_t n, const float *raw, const float *bias, float a_log,
                                float lower_bound, float *out)
{
    int64_t i = 0;
    for (; i + VW <= n; i += VW) {
        const vf b = bias ? vf_load(bias + i) : vf_zero();
        vf_store(out + i, kda_gate_vec(vf_load(raw + i), b, a_log, lower_bound));
    }
    if (i < n) {
        const vf b = bias ? vf_load_n(bias + i, n - i) : vf_zero();
        vf_store_n(out + i, kda_gate_vec(vf_load_n(raw + i, n - i), b, a_log, lower_bound), n - i);
    }
}

/* y[0..n) = x * s */
static inline void kda_vmul(int64_t n, const float *x, const float *s, float *y)
{
    int64_t i = 0;
    for (; i + VW <= n; i += VW) vf_store(y + i, vf_mul(vf_load(x + i), vf_load(s + i)));
    if (i < n) vf_store_n(y + i, vf_mul(vf_load_n(x + i, n - i), vf_load_n(s + i, n - i)), n - i);
}

/* a[0..n) = e^{g} with every g raised to floor first (NaN stays NaN). The same pass keeps,
 * per lane, a g > 0 when there is one (an ordered compare: a NaN is not one) and tells the
 * plan's watcher: a growth where the contract is a decay (g <= 0), which overflows the state
 * or the chunked form's factors to inf and the outputs to NaN. */
static inline void kda_decay_row(const kda_plan *pl, int64_t n, const float *g, float floor,
                                 float *a)
{
    vf top = vf_zero();
    int64_t i = 0;
    for (; i + VW <= n; i += VW) {
        const vf x = vf_load(g + i);
        top = vf_select_gt(x, vf_zero(), x, top);
        vf_store(a + i, vf_exp(vf_max(vf_set1(floor), x)));
    }
    if (i < n) {
        const vf x = vf_load_n(g + i, n - i);
        top = vf_select_gt(x, vf_zero(), x, top);
        vf_store_n(a + i, vf_exp(vf_max(vf_set1(floor), x)), n - i);
    }
    float lanes[VW];
    vf_store(lanes, top);
    bool positive = false;
    for (int l = 0; l < VW; l++) positive |= lanes[l] > 0.0f;
    if (positive && pl->positive_g) atomic_store_explicit(pl->positive_g, 1, memory_order_relaxed);
}

/* a[0..K) = the per-token decay of every key row: e^{g} per channel, one e^{g} broadcast per
 * head, 1 without decay (the recurrent kernels; no floor needed, e^{g} is exact there). */
static inline void kda_row_decays(const kda_plan *pl, const float *g, float *a)
{
    const int64_t K = pl->p->K;
    if (pl->p->decay == LINSEQ_DECAY_PER_CHANNEL) {
        kda_decay_row(pl, K, g, -INFINITY, a);
        return;
    }
    float e = 1.0f;
    if (pl->p->decay == LINSEQ_DECAY_PER_HEAD) kda_decay_row(pl, 1, g, -INFINITY, &e);
    for (int64_t i = 0; i < K; i++) a[i] = e;
}

/* out = x * r * scale with r = 1/sqrt(|x|^2 + eps) (l2norm, ls_kda_l2norm_factorf) or
 * out = x * scale. */
static inline void kda_norm_scale(int64_t n, const float *x, bool l2norm, float scale, double eps,
                                  float *out)
{
    const float mul = l2norm ? ls_kda_l2norm_factorf(ls_vdot(n, x, x), scale, eps) : scale;
    const vf m = vf_set1(mul);
    int64_t i = 0;
    for (; i + VW <= n; i += VW) vf_store(out + i, vf_mul(vf_load(x + i), m));
    if (i < n) vf_store_n(out + i, vf_mul(vf_load_n(x + i, n - i), m), n - i);
}

/* One token of value head hv after the in-kernel options: qs = scale * l2norm(q), ks =
 * l2norm(k) (or q * scale, k), *beta after the sigmoid when beta is a logit (1 without beta), g[gK] the log
 * decay after the gate (0 without decay). tok is a flattened token index. */
static inline void kda_load_token_v(const kda_plan *pl, int64_t tok, int64_t hv, float *qs,
                                    float *ks, float *beta, float *g)
{
    const linseq_kda_problem *p = pl->p;
    const int64_t K = p->K, H = p->H, HV = pl->HV, h = hv / pl->group;
    /* bf16 rows are widened into the outputs and scaled there in place */
    kda_norm_scale(K, kda_token_span(pl, p->q, (tok * H + h) * K, K, qs), p->qk_l2norm, pl->scale,
                   pl->l2norm_eps, qs);
    kda_norm_scale(K, kda_token_span(pl, p->k, (tok * H + h) * K, K, ks), p->qk_l2norm, 1.0f,
                   pl->l2norm_eps, ks);
    const float b = p->beta ? kda_token_value(pl, p->beta, tok * HV + hv) : 1.0f;
    *beta = p->beta_is_logit ? ls_sigmoidf(b) : b;
    if (p->decay == LINSEQ_DECAY_NONE) {
        g[0] = 0.0f;
        return;
    }
    const int64_t gK = pl->gK;
    const float *graw = kda_token_span(pl, p->g, (tok * HV + hv) * gK, gK, g);
    if (!p->gate_in_kernel) {
        if (graw != g) memcpy(g, graw, (size_t)gK * sizeof *g);
        return;
    }
    kda_gate_row(gK, graw, p->dt_bias ? p->dt_bias + hv * gK : NULL, p->A_log ? p->A_log[hv] : 0.0f,
                 p->lower_bound, g);
}

/* Triangular substitution inside one row block of X [rows, ld], columns [0, n): the rows
 * r = first, first+step, ... up to (not including) end take in turn
 *     X_r += sum_c coef[r*coef_r + c*coef_c] X_c
 * over the rows c visited before r (step = +1: forward, -1: backward substitution). The row
 * is held in registers a column block at a time across all its terms: updating it in memory
 * once per term made every step wait for the previous store. */
enum { KDA_SUBST_COLS = 4 };

static inline void kda_substitute_rows(float *X, int64_t ld, int64_t n, int64_t first, int64_t end,
                                       const float *coef, int64_t coef_r, int64_t coef_c)
{
    const int64_t step = end >= first ? 1 : -1;
    for (int64_t j = 0; j < n; j += KDA_SUBST_COLS * VW) {
        const int64_t width = n - j < KDA_SUBST_COLS * VW ? n - j : KDA_SUBST_COLS * VW;
        const int nv = (int)((width + VW - 1) / VW);
        const int64_t w_last = width - (int64_t)(nv - 1) * VW;
        if (nv == KDA_SUBST_COLS && w_last == VW) {
            for (int64_t r = first + step; r != end; r += step) {
                float *row = X + r * ld + j;
                vf acc[KDA_SUBST_COLS];
#pragma GCC unroll 4
                for (int v = 0; v < KDA_SUBST_COLS; v++) acc[v] = vf_load(row + v * VW);
                for (int64_t c = first; c != r; c += step) {
                    const vf f = vf_set1(coef[r * coef_r + c * coef_c]);
                    const float *src = X + c * ld + j;
#pragma GCC unroll 4
                    for (int v = 0; v < KDA_SUBST_COLS; v++)
                        acc[v] = vf_fmadd(f, vf_load(src + v * VW), acc[v]);
                }
#pragma GCC unroll 4
                for (int v = 0; v < KDA_SUBST_COLS; v++) vf_store(row + v * VW, acc[v]);
            }
        } else {
            for (int64_t r = first + step; r != end; r += step) {
                float *row = X + r * ld + j;
                vf acc[KDA_SUBST_COLS];
                for (int v = 0; v < nv; v++)
                    acc[v] = v == nv - 1 ? vf_load_n(row + v * VW, w_last) : vf_load(row + v * VW);
                for (int64_t c = first; c != r; c += step) {
                    const vf f = vf_set1(coef[r * coef_r + c * coef_c]);
                    const float *src = X + c * ld + j;
                    for (int v = 0; v < nv; v++) {
                        const vf x =
                            v == nv - 1 ? vf_load_n(src + v * VW, w_last) : vf_load(src + v * VW);
                        acc[v] = vf_fmadd(f, x, acc[v]);
                    }
                }
                for (int v = 0; v < nv; v++) {
                    if (v == nv - 1)
                        vf_store_n(row + v * VW, acc[v], w_last);
                    else
                        vf_store(row + v * VW, acc[v]);
                }
            }
        }
    }
}

/* The diagonal block of a product with a triangular factor, over the columns [0, n) of Y:
 *     Y_i += sum_j coef[i*coef_r + j*coef_c] X_j,   j in [first, i] (lower) or [i, end) (upper)
 * for the rows i in [first, end), j increasing. Only the triangle is visited: a product that
 * ran over the whole block with zeros in the other triangle would turn one token's NaN or Inf
 * into 0 * NaN = NaN in the tokens that do not depend on it. */
static inline void kda_triangle_rows(float *Y, int64_t ldy, const float *X, int64_t ldx, int64_t n,
                                     int64_t first, int64_t end, const float *coef, int64_t coef_r,
                                     int64_t coef_c, bool upper)
{
    for (int64_t j = 0; j < n; j += KDA_SUBST_COLS * VW) {
        const int64_t width = n - j < KDA_SUBST_COLS * VW ? n - j : KDA_SUBST_COLS * VW;
        const int nv = (int)((width + VW - 1) / VW);
        const int64_t w_last = width - (int64_t)(nv - 1) * VW;
        for (int64_t i = first; i < end; i++) {
            float *row = Y + i * ldy + j;
            const int64_t lo = upper ? i : first, hi = upper ? end : i + 1;
            vf acc[KDA_SUBST_COLS];
            if (nv == KDA_SUBST_COLS && w_last == VW) {
#pragma GCC unroll 4
                for (int v = 0; v < KDA_SUBST_COLS; v++) acc[v] = vf_load(row + v * VW);
                for (int64_t c = lo; c < hi; c++) {
                    const vf f = vf_set1(coef[i * coef_r + c * coef_c]);
                    const float *src = X + c * ldx + j;
#pragma GCC unroll 4
                    for (int v = 0; v < KDA_SUBST_COLS; v++)
                        acc[v] = vf_fmadd(f, vf_load(src + v * VW), acc[v]);
                }
#pragma GCC unroll 4
                for (int v = 0; v < KDA_SUBST_COLS; v++) vf_store(row + v * VW, acc[v]);
                continue;
            }
            for (int v = 0; v < nv; v++)
                acc[v] = v == nv - 1 ? vf_load_n(row + v * VW, w_last) : vf_load(row + v * VW);
            for (int64_t c = lo; c < hi; c++) {
                const vf f = vf_set1(coef[i * coef_r + c * coef_c]);
                const float *src = X + c * ldx + j;
                for (int v = 0; v < nv; v++) {
                    const vf x =
                        v == nv - 1 ? vf_load_n(src + v * VW, w_last) : vf_load(src + v * VW);
                    acc[v] = vf_fmadd(f, x, acc[v]);
                }
            }
            for (int v = 0; v < nv; v++) {
                if (v == nv - 1)
                    vf_store_n(row + v * VW, acc[v], w_last);
                else
                    vf_store(row + v * VW, acc[v]);
            }
        }
    }
}

#endif
