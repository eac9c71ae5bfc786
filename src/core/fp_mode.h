/* Internal: the floating-point mode the kernels run in, whatever the caller's: round to
 * nearest even, every exception masked, and subnormal floats (below 2^-126 in magnitude)
 * flushed to zero where an operation would produce one and read as zero where an operand is
 * one (x86's MXCSR with FTZ and DAZ set), on every thread of a call, for the duration of its
 * work items (core/parallel.c: all of a kernel's arithmetic; what an entry point sums after
 * them, in double, runs in the caller's mode): the caller's mode and its exception flags are
 * restored before the call returns.
 *
 * Why: decays multiply down through the subnormal range (a chunk's e^{G_r - G_c}, a state
 * forgetting), and on CPUs that handle a subnormal operand or result in microcode (Intel's)
 * every such operation costs about a hundred cycles: a GDN prefill with decays of e^-1 to
 * e^-16 per token ran 6x slower than with them flushed. The values flushed are below 2^-126,
 * far below float32's rounding of the results of order one they are summed into. One mode on
 * every thread, whatever the caller set, keeps results independent of the thread count and
 * of the caller's rounding mode. */
#ifndef LS_CORE_FP_MODE_H
#define LS_CORE_FP_MODE_H

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>

/* FTZ (0x8000), the six exception masks (0x1f80: also round to nearest, the 0 in bits
 * 13-14), DAZ (0x0040); no exception flag set */
enum { LS_MXCSR_KERNELS = 0x8000 | 0x1f80 | 0x0040 };

/* Sets the kernels' mode on this thread; returns what to restore. */
static inline unsigned ls_fp_mode_enter(void)
{
    const unsigned saved = _mm_getcsr();
    _mm_setcsr(LS_MXCSR_KERNELS);
    return saved;
}

static inline void ls_fp_mode_leave(unsigned saved) { _mm_setcsr(saved); }

#else /* elsewhere the kernels run in the caller's mode */

static inline unsigned ls_fp_mode_enter(void) { return 0; }
static inline void ls_fp_mode_leave(unsigned saved) { (void)saved; }

#endif

#endif
