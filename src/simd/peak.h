/* Internal: the two kernels `linseq bench peak` times to find what the machine can do, so
 * that the benchmarks can report a fraction of it. They are compiled per ISA like the
 * library's hot kernels (peak_simd.c), so the peak is measured with the same instructions,
 * and picked with LS_ISA_PICK(ls_isa_active(), ...). */
#ifndef LS_SIMD_PEAK_H
#define LS_SIMD_PEAK_H

#include <stdint.h>

#include "simd/isa.h"

/* iters rounds of independent vector FMA chains (acc = acc * mul + add) in registers; returns
 * the floating-point operations performed, an FMA counted as 2. mul slightly below 1 and a
 * small add keep the accumulators normal and finite for any iters. */
LS_ISA_DECLARE(double, ls_peak_fma, (int64_t iters, float mul, float add));

/* a[i] = b[i] + s * c[i] for i < n: the STREAM triad. */
LS_ISA_DECLARE(void, ls_peak_triad, (int64_t n, float *a, const float *b, const float *c, float s));

#endif
