/* The array forms of vec.h's vector math; compiled once per ISA. */
#include "simd/gemm.h"
#include "simd/vec.h"
#include "simd/vmath.h"

#define ARRAY_FORM(name, op)                                                                       \
    void LS_ISA_FN(name)(int64_t n, const float *x, float *y)                                      \
    {                                                                                              \
        int64_t i = 0;                                                                             \
        for (; i + VW <= n; i += VW) vf_store(y + i, op(vf_load(x + i)));                          \
        if (i < n) vf_store_n(y + i, op(vf_load_n(x + i, n - i)), n - i);                          \
    }

ARRAY_FORM(ls_vexp_n, vf_exp)
ARRAY_FORM(ls_vsigmoid_n, vf_sigmoid)
ARRAY_FORM(ls_vsoftplus_n, vf_softplus)
ARRAY_FORM(ls_vsilu_n, vf_silu)
ARRAY_FORM(ls_vlog1p01_n, vf_log1p01)
ARRAY_FORM(ls_vrsqrt_n, vf_rsqrt)

int LS_ISA_FN(ls_vhsum_lanes_n)(const float *in, float *out)
{
    vf a[VW];
    for (int i = 0; i < VW; i++) a[i] = vf_load(in + i * VW);
    vf_store(out, vf_hsum_lanes(a));
    return VW;
}

void LS_ISA_FN(ls_transpose_n)(int64_t rows, int64_t cols, const float *src, int64_t lds,
                               float *dst, int64_t ldd)
{
    ls_transpose(rows, cols, src, lds, dst, ldd);
}
