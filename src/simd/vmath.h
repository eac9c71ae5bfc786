/* Internal: the vector math of vec.h over arrays, one version per ISA, for the code that is
 * not itself compiled per ISA (entry points, references' checks, tests). y may equal x. */
#ifndef LS_SIMD_VMATH_H
#define LS_SIMD_VMATH_H

#include <stdint.h>

#include "simd/isa.h"

typedef void (*ls_vmath_fn)(int64_t n, const float *x, float *y);

LS_ISA_DECLARE(void, ls_vexp_n, (int64_t n, const float *x, float *y));
LS_ISA_DECLARE(void, ls_vsigmoid_n, (int64_t n, const float *x, float *y));
LS_ISA_DECLARE(void, ls_vsoftplus_n, (int64_t n, const float *x, float *y));
LS_ISA_DECLARE(void, ls_vsilu_n, (int64_t n, const float *x, float *y));
LS_ISA_DECLARE(void, ls_vlog1p01_n, (int64_t n, const float *x, float *y));
LS_ISA_DECLARE(void, ls_vrsqrt_n, (int64_t n, const float *x, float *y));

/* out[i] = sum of in[i*VW .. i*VW+VW) for i < VW (vf_hsum_lanes), out has VW floats;
 * returns VW. For the tests of the reduction primitive. */
LS_ISA_DECLARE(int, ls_vhsum_lanes_n, (const float *in, float *out));

/* dst = src^T for a rows x cols row-major block (ls_transpose), for its tests. */
LS_ISA_DECLARE(void, ls_transpose_n,
               (int64_t rows, int64_t cols, const float *src, int64_t lds, float *dst,
                int64_t ldd));

#endif
