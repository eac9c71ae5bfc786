/* Internal: what the SSM1 and conv1d kernels need on top of simd/vec.h. Include only from
 * sources compiled once per ISA (*_simd.c).
 *
 *   vf_act, vf_act_grad   the activations of linseq_activation and their derivatives, in vector
 *                         form. Not bit-identical to core/activation.h's scalar ones (vf_exp and
 *                         the sigmoid are within a few ulp, see vec.h); every kernel of both ops
 *                         (forward, backward, decode) uses these, so they agree with each other.
 *                         gelu_tanh uses 0.5 (1 + tanh(u)) = sigmoid(2u): the same function, no
 *                         vector tanh needed, and no cancellation for large |u|.
 *   vf_softplus_grad      d softplus / dx with vf_softplus's threshold (slope 1 above
 *                         LS_SOFTPLUS_THRESHOLD).
 *   vf_act_and_grad       both of the same z, sharing the sigmoid.
 *   vf_load_part, vf_store_part   a vector of a row whose valid prefix may be shorter.
 *   ls_transpose_copy     VW x VW blocks through vf_transpose_regs, to move [channel][state]
 *                         rows (h0, A, hT, weight, conv state) to and from the kernels' tiles.
 *   ls_prefetch_*         software prefetches of per-token rows (strided over D).
 * STRIPS is the number of vectors in a block of SSM_LANES channels. */
#ifndef LS_SSM_VEC_H
#define LS_SSM_VEC_H

#include "linseq.h"
#include "simd/vec.h"
#include "ssm/ssm_internal.h"

#if defined(__GNUC__) || defined(__clang__)
#define LS_INLINE static inline __attribute__((always_inline))
#else
#define LS_INLINE static inline
#endif

static inline vf vf_gelu_tanh(vf z)
{
    const vf u2 = vf_mul(vf_set1(2.0f * 0.7978845608028654f),
                         vf_fmadd(vf_mul(vf_set1(0.044715f), vf_mul(z, z)), z, z));
    return vf_mul(z, vf_sigmoid(u2));
}

/* act resolved (not LINSEQ_ACT_DEFAULT); the switch is on a loop-invariant value. */
LS_INLINE vf vf_act(linseq_activation act, vf z)
{
    switch (act) {
    case LINSEQ_ACT_SILU: return vf_silu(z);
    case LINSEQ_ACT_SIGMOID: return vf_sigmoid(z);
    case LINSEQ_ACT_GELU_TANH: return vf_gelu_tanh(z);
    case LINSEQ_ACT_RELU: return vf_max(vf_zero(), z); /* NaN passes through */
    default: return z;
    }
}

LS_INLINE vf vf_act_grad(linseq_activation act, vf z)
{
    const vf one = vf_set1(1.0f);
    switch (act) {
    case LINSEQ_ACT_SILU: {
        const vf s = vf_sigmoid(z);
        return vf_mul(s, vf_fmadd(z, vf_sub(one, s), one));
    }
    case LINSEQ_ACT_SIGMOID: {
        const vf s = vf_sigmoid(z);
        return vf_mul(s, vf_sub(one, s));
    }
    case LINSEQ_ACT_GELU_TANH: {
        /* d/dz z s(2u) = s + z s (1 - s) 2u', u = k (z + c z^3), u' = k (1 + 3c z^2) */
        const float k2 = 2.0f * 0.7978845608028654f, c = 0.044715f;
        const vf z2 = vf_mul(z, z);
        const vf s = vf_sigmoid(vf_mul(vf_set1(k2), vf_fmadd(vf_mul(vf_set1(c), z2), z, z)));
        const vf du = vf_mul(vf_set1(k2), vf_fmadd(vf_set1(3.0f * c), z2, one));
        return vf_fmadd(vf_mul(z, vf_mul(s, vf_sub(one, s))), du, s);
    }
    case LINSEQ_ACT_RELU:
        /* 1 above 0, 0 at and below it, NaN kept (vf_max returns its second operand then). */
        return vf_select_gt(z, vf_zero(), one, vf_max(vf_zero(), z));
    default: return one;
    }
}

LS_INLINE vf vf_softplus_grad(vf x)
{
    return vf_select_gt(x, vf_set1(LS_SOFTPLUS_THRESHOLD), vf_set1(1.0f), vf_sigmoid(x));
}

/* vf_act and vf_act_grad of the same z, bitwise: each case calls what the two do, in one basic
 * block, so that the compiler computes their common sigmoid once. */
LS_INLINE void vf_act_and_grad(linseq_activation act, vf z, vf *f, vf *slope)
{
    switch (act) {
    case LINSEQ_ACT_SILU:
        *f = vf_act(LINSEQ_ACT_SILU, z);
        *slope = vf_act_grad(LINSEQ_ACT_SILU, z);
        return;
    case LINSEQ_ACT_SIGMOID:
        *f = vf_act(LINSEQ_ACT_SIGMOID, z);
        *slope = vf_act_grad(LINSEQ_ACT_SIGMOID, z);
        return;
    case LINSEQ_ACT_GELU_TANH:
        *f = vf_act(LINSEQ_ACT_GELU_TANH, z);
        *slope = vf_act_grad(LINSEQ_ACT_GELU_TANH, z);
        return;
    case LINSEQ_ACT_RELU:
        *f = vf_act(LINSEQ_ACT_RELU, z);
        *slope = vf_act_grad(LINSEQ_ACT_RELU, z);
        return;
    default:
        *f = z;
        *slope = vf_set1(1.0f);
        return;
    }
}

/* A block of SSM_LANES channels is STRIPS vectors wide (lanes are channels in every kernel). */
#define STRIPS (SSM_LANES / VW)

/* Full unrolling of the strip loops keeps per-strip values in registers; the one-lane build
 * has 64 strips, which stay a loop. */
#if VW > 1
#define LS_UNROLL_STRIPS _Pragma("GCC unroll 16")
#else
#define LS_UNROLL_STRIPS _Pragma("GCC unroll 4")
#endif

/* Loads of a row of lanes whose valid prefix is `valid` lanes long (any value, negative and
 * past VW included): full vectors load directly, the ragged edge of a block masked. */
LS_INLINE vf vf_load_part(const float *p, int64_t valid)
{
    if (valid >= VW) return vf_load(p);
    return vf_load_n(p, valid > 0 ? valid : 0);
}

LS_INLINE void vf_store_part(float *p, vf v, int64_t valid)
{
    if (valid >= VW)
        vf_store(p, v);
    else if (valid > 0)
        vf_store_n(p, v, valid);
}

/* Prefetches of the n floats from p (a block's row: n <= SSM_LANES, never past the array, so
 * that no pointer leaves its object), or of a whole block's row: the kernels walk
 * tokens at a stride of D floats (16 KiB at D = 4096), which the hardware prefetchers do not
 * follow, and per-token arrays larger than the caches come from memory: a kernel asks for the
 * rows it will read or write a few tokens later. Without this, every store to such a row
 * first waits for the line to be read from memory, and the store queue fills. */
LS_INLINE void ls_prefetch_floats(const float *p, int64_t n)
{
#if defined(__GNUC__) || defined(__clang__)
    for (int64_t i = 0; i < n; i += 16) __builtin_prefetch(p + i, 0, 3);
#else
    (void)p, (void)n;
#endif
}

LS_INLINE void ls_prefetch_floats_for_write(float *p, int64_t n)
{
#if defined(__GNUC__) || defined(__clang__)
    for (int64_t i = 0; i < n; i += 16) __builtin_prefetch(p + i, 1, 3);
#else
    (void)p, (void)n;
#endif
}

LS_INLINE void ls_prefetch_row(const float *p) { ls_prefetch_floats(p, SSM_LANES); }
LS_INLINE void ls_prefetch_row_for_write(float *p) { ls_prefetch_floats_for_write(p, SSM_LANES); }

/* dst[n * dst_stride + l] = src[l * src_stride + n] for l < rows, n < cols: [rows][cols] to
 * [cols][rows], in VW x VW register transposes where whole ones fit. */
static inline void ls_transpose_copy(float *restrict dst, int64_t dst_stride,
                                     const float *restrict src, int64_t src_stride, int64_t rows,
                                     int64_t cols)
{
    int64_t l0 = 0;
    for (; l0 + VW <= rows; l0 += VW) {
        int64_t n0 = 0;
        for (; n0 + VW <= cols; n0 += VW) {
            /* Pointers stepped by the strides: sixteen row addresses would not fit in registers */
            vf r[VW];
            const float *in = src + l0 * src_stride + n0;
            _Pragma("GCC unroll 16") for (int i = 0; i < VW; i++, in += src_stride) r[i] =
                vf_load(in);
            vf_transpose_regs(r);
            float *out = dst + n0 * dst_stride + l0;
            _Pragma("GCC unroll 16") for (int i = 0; i < VW; i++, out += dst_stride)
                vf_store(out, r[i]);
        }
        for (; n0 < cols; n0++)
            for (int64_t l = l0; l < l0 + VW; l++)
                dst[n0 * dst_stride + l] = src[l * src_stride + n0];
    }
    for (; l0 < rows; l0++) {
        float *d = dst + l0;
        const float *s = src + l0 * src_stride;
        for (int64_t n = 0; n < cols; n++, d += dst_stride) *d = s[n];
    }
}

#endif
