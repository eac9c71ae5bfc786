/* Internal: the instruction sets linseq has kernels for, and which one runs.
 *
 * Hot kernels are written once against the small vector layer of vec.h and compiled once per
 * ISA (the Makefile builds each such source with -DLS_ISA=<n> and that ISA's -m flags); their
 * functions get the ISA as a name suffix through LS_ISA_FN. Each op family gathers its
 * kernels of one ISA in a const table of function pointers (kda/kda_kernels.h,
 * ssm/ssm_kernels.h); an entry point resolves the ISA once per call into its family's table
 * and calls through it. So one build runs on any x86-64 and builds elsewhere with the portable
 * version only. */
#ifndef LS_SIMD_ISA_H
#define LS_SIMD_ISA_H

#include "linseq.h"

typedef enum ls_isa {
    LS_ISA_SCALAR = 0, /* portable C, one lane */
    LS_ISA_AVX2 = 1,   /* AVX2 + FMA, 8 lanes */
    LS_ISA_AVX512 = 2, /* AVX-512 F/VL/BW/DQ, 16 lanes */
    LS_ISA_COUNT = 3
} ls_isa;

/* The ISA the kernels use: the best the CPU and OS support, or the one the environment
 * variable LINSEQ_ISA names (scalar, avx2 or avx512, any case; unset or empty: the best).
 * Decided once per process, thread-safe. When LINSEQ_ISA names no ISA this CPU runs, this is
 * the best one and ls_isa_resolve fails. */
ls_isa ls_isa_active(void);

/* What an entry point calls first: *isa = ls_isa_active() and LINSEQ_OK, or, when LINSEQ_ISA
 * names no ISA (LINSEQ_ERR_INVALID_VALUE) or one this CPU cannot run
 * (LINSEQ_ERR_UNSUPPORTED), that status with a message naming fn, the variable, its value and
 * the valid values. */
linseq_status ls_isa_resolve(const char *fn, ls_isa *isa);

/* Whether this build has kernels for isa and the CPU can run them (for tests and benches). */
int ls_isa_available(ls_isa isa);

const char *ls_isa_name(ls_isa isa);

/* Whether the CPU runs the AVX-512 kernels and has AVX512-BF16 (vdpbf16ps), which their
 * bf16-operand products use when it is there (simd/gemm_bf16.h). */
int ls_cpu_has_bf16_dot(void);

/* How many times this process has executed CPUID for the library (the test of the rule that
 * the CPU is asked once: in a virtual machine each CPUID traps to the hypervisor). */
int ls_cpu_probes(void);

#ifndef LS_ISA
#define LS_ISA 0
#endif
#if LS_ISA == 2
#define LS_ISA_FN(name) name##_avx512
#elif LS_ISA == 1
#define LS_ISA_FN(name) name##_avx2
#else
#define LS_ISA_FN(name) name##_scalar
#endif

/* Declares name_scalar, name_avx2 and name_avx512 with one signature. The op families gather
 * theirs in kernel tables; LS_ISA_PICK below is for a lone function (the bench's peak probes).
 * LS_HAVE_X86_KERNELS says whether the avx2 and avx512 ones are compiled at all. */
#define LS_ISA_DECLARE(ret, name, params)                                                          \
    ret name##_scalar params;                                                                      \
    ret name##_avx2 params;                                                                        \
    ret name##_avx512 params

#if defined(__x86_64__) || defined(_M_X64)
#define LS_HAVE_X86_KERNELS 1
#define LS_ISA_PICK(isa, name)                                                                     \
    ((isa) == LS_ISA_AVX512 ? name##_avx512 : (isa) == LS_ISA_AVX2 ? name##_avx2 : name##_scalar)
#else
#define LS_HAVE_X86_KERNELS 0
#define LS_ISA_PICK(isa, name) ((void)(isa), name##_scalar)
#endif

#endif
