/* Internal: a state row between a serving engine's pool type and float32, one implementation
 * per ISA (bf16 through simd/bf16.h's vector loads and rounding stores; float32 copied; IEEE
 * half element by element as core/state_rows.h does it). The bits are core/state_rows.h's on
 * every ISA: widening is exact, narrowing rounds once to nearest even. */
#ifndef LS_SIMD_STATE_ROWS_H
#define LS_SIMD_STATE_ROWS_H

#include <stdint.h>

#include "linseq.h"
#include "simd/isa.h"

typedef void (*ls_state_widen_fn)(linseq_pool_dtype dtype, const void *from, float *to, int64_t n);
typedef void (*ls_state_narrow_fn)(linseq_pool_dtype dtype, const float *from, void *to, int64_t n);

LS_ISA_DECLARE(void, ls_state_widen_isa,
               (linseq_pool_dtype dtype, const void *from, float *to, int64_t n));
LS_ISA_DECLARE(void, ls_state_narrow_isa,
               (linseq_pool_dtype dtype, const float *from, void *to, int64_t n));

#endif
