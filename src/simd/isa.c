/* Run-time choice of the kernels' instruction set (see isa.h). */
#include "simd/isa.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include "core/status.h"

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

/* CPUID traps to the hypervisor in a virtual machine (13 us each on one VM, two per
 * question), so the answer is asked for once per process, not on every call that uses it. */
static atomic_int cpuid_probes;
static int has_bf16_dot;
static pthread_once_t bf16_dot_once = PTHREAD_ONCE_INIT;

int ls_cpu_probes(void) { return atomic_load(&cpuid_probes); }

static void probe_bf16_dot(void)
{
#if LS_HAVE_X86_KERNELS && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    /* CPUID leaf 7, subleaf 1: EAX bit 5 is AVX512_BF16 (the OS state is that of AVX-512) */
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!cpu_supports(LS_ISA_AVX512)) return;
    atomic_fetch_add(&cpuid_probes, 1);
    if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) has_bf16_dot = (eax >> 5) & 1u;
#endif
}

int ls_cpu_has_bf16_dot(void)
{
    pthread_once(&bf16_dot_once, probe_bf16_dot);
    return has_bf16_dot;
}

const char *ls_isa_name(ls_isa isa)
{
    switch (isa) {
    case LS_ISA_AVX512: return "avx512";
    case LS_ISA_AVX2: return "avx2";
    default: return "scalar";
    }
}

/* The decision, made once per process: a pure function of the CPU and the environment. */
static struct {
    ls_isa isa;           /* what runs; the best the CPU supports when LINSEQ_ISA is bad */
    linseq_status status; /* LINSEQ_OK, or why LINSEQ_ISA names nothing this CPU runs */
    char message[256];
} choice;
static pthread_once_t choice_once = PTHREAD_ONCE_INIT;

/* "scalar, avx2, avx512": the names this CPU runs, for the error message. */
static void list_available(char *out, size_t size)
{
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < LS_ISA_COUNT && used < size; i++)
        if (cpu_supports((ls_isa)i))
            used += (size_t)snprintf(out + used, size - used, "%s%s", used ? ", " : "",
                                     ls_isa_name((ls_isa)i));
}

static void decide(void)
{
    choice.isa = LS_ISA_SCALAR;
    for (int i = LS_ISA_COUNT - 1; i >= 0; i--)
        if (cpu_supports((ls_isa)i)) {
            choice.isa = (ls_isa)i;
            break;
        }
    choice.status = LINSEQ_OK;
    const char *want = getenv("LINSEQ_ISA");
    if (!want || !want[0]) return; /* unset or empty: the best */
    char valid[64];
    list_available(valid, sizeof valid);
    for (int i = 0; i < LS_ISA_COUNT; i++) {
        if (strcasecmp(want, ls_isa_name((ls_isa)i)) != 0) continue;
        if (cpu_supports((ls_isa)i)) {
            choice.isa = (ls_isa)i;
            return;
        }
        choice.status = LINSEQ_ERR_UNSUPPORTED;
        snprintf(choice.message, sizeof choice.message,
                 "the environment variable LINSEQ_ISA = \"%.32s\" names an instruction set "
                 "this CPU cannot run; expected one of: %s (or unset for the best)",
                 want, valid);
        return;
    }
    choice.status = LINSEQ_ERR_INVALID_VALUE;
    snprintf(choice.message, sizeof choice.message,
             "the environment variable LINSEQ_ISA = \"%.32s\" names no instruction set; "
             "expected one of: %s (any case; or unset for the best)",
             want, valid);
}

ls_isa ls_isa_active(void)
{
    pthread_once(&choice_once, decide);
    return choice.isa;
}

linseq_status ls_isa_resolve(const char *fn, ls_isa *isa)
{
    pthread_once(&choice_once, decide);
    *isa = choice.isa;
    if (choice.status) return ls_fail(fn, choice.status, "%s", choice.message);
    return LINSEQ_OK;
}

const char *linseq_isa(void)
{
    ls_clear_error();
    ls_isa isa;
    if (ls_isa_resolve("linseq_isa", &isa)) return "invalid";
    return ls_isa_name(isa);
}
