/* Run-time choice of the kernels' instruction set (see isa.h). */
#include "simd/isa.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "linseq.h"

static int cpu_supports(ls_isa isa)
{
#if LS_HAVE_X86_KERNELS && (defined(__GNUC__) || defined(__clang__))
    /* __builtin_cpu_supports also checks that the OS saves the wide registers (XCR0). */
    __builtin_cpu_init();
    switch (isa) {
    case LS_ISA_AVX512:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("fma");
    case LS_ISA_AVX2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    default: return 1;
    }
#else
    return isa == LS_ISA_SCALAR;
#endif
}

int ls_isa_available(ls_isa isa)
{
    if ((unsigned)isa >= LS_ISA_COUNT) return 0;
    return cpu_supports(isa);
}

const char *ls_isa_name(ls_isa isa)
{
    switch (isa) {
    case LS_ISA_AVX512: return "avx512";
    case LS_ISA_AVX2: return "avx2";
    default: return "scalar";
    }
}

/* -1 until decided; the decision is a pure function of the CPU and the environment, so two
 * threads racing to make it store the same value. */
static atomic_int active = -1;

ls_isa ls_isa_active(void)
{
    int isa = atomic_load_explicit(&active, memory_order_acquire);
    if (isa >= 0) return (ls_isa)isa;
    isa = LS_ISA_SCALAR;
    for (int i = LS_ISA_COUNT - 1; i >= 0; i--)
        if (cpu_supports((ls_isa)i)) {
            isa = i;
            break;
        }
    const char *want = getenv("LINSEQ_ISA");
    if (want) {
        for (int i = 0; i < LS_ISA_COUNT; i++)
            if (strcmp(want, ls_isa_name((ls_isa)i)) == 0 && i < isa) isa = i;
    }
    atomic_store_explicit(&active, isa, memory_order_release);
    return (ls_isa)isa;
}

const char *linseq_isa(void) { return ls_isa_name(ls_isa_active()); }
