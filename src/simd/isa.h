/* Internal: the instruction sets linseq has kernels for, and which one runs.
 *
 * Hot kernels are written once against the small vector layer of vec.h and compiled once per
 * ISA (the Makefile builds each such source with -DLS_ISA=<n> and that ISA's -m flags); their
 * functions get the ISA as a name suffix through LS_ISA_FN, and a dispatcher picks one at run
 * time. So one build runs on any x86-64 and builds elsewhere with the portable version only. */
#ifndef LS_SIMD_ISA_H
#define LS_SIMD_ISA_H

typedef enum ls_isa {
    LS_ISA_SCALAR = 0,  /* portable C, one lane                                          */
    LS_ISA_AVX2 = 1,    /* AVX2 + FMA, 8 lanes                                           */
    LS_ISA_AVX512 = 2,  /* AVX-512 F/VL/BW/DQ, 16 lanes                                  */
    LS_ISA_COUNT = 3
} ls_isa;

/* The ISA the kernels use: the best the CPU and OS support, lowered (never raised) by the
 * environment variable LINSEQ_ISA=scalar|avx2|avx512. Decided once, thread-safe. */
ls_isa ls_isa_active(void);

/* Whether this build has kernels for isa and the CPU can run them (for tests and benches). */
int ls_isa_available(ls_isa isa);

const char *ls_isa_name(ls_isa isa);

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

/* Declares name_scalar, name_avx2 and name_avx512 with one signature, and how to pick one. */
#define LS_ISA_DECLARE(ret, name, params)                                                   \
    ret name##_scalar params;                                                              \
    ret name##_avx2 params;                                                                \
    ret name##_avx512 params

#if defined(__x86_64__) || defined(_M_X64)
#define LS_HAVE_X86_KERNELS 1
#define LS_ISA_PICK(isa, name)                                                             \
    ((isa) == LS_ISA_AVX512 ? name##_avx512 : (isa) == LS_ISA_AVX2 ? name##_avx2 : name##_scalar)
#else
#define LS_HAVE_X86_KERNELS 0
#define LS_ISA_PICK(isa, name) ((void)(isa), name##_scalar)
#endif

#endif
