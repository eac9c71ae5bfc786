/* The CPU's features are asked for once per process, not on every call. CPUID, the x86
 * instruction that answers, traps to the hypervisor in a virtual machine: 13 us each on one
 * VM, two per question, which made a GDN decode step at batch 1 (a 100 us kernel) a quarter
 * slower there when every call asked whether the CPU has AVX512-BF16. Every op of the catalog
 * (op_jobs.c: every call of every op, decode steps and bf16 products among them) runs three
 * times; the count of CPUID probes the library made stays at most one. */
#include <stdlib.h>

#include "op_jobs.h"
#include "simd/isa.h"
#include "testutil.h"

int main(void)
{
    job *jobs;
    const int n_jobs = jobs_make(&jobs);
    const int answer = ls_cpu_has_bf16_dot();
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < n_jobs; i++) {
            const job *j = job_at(jobs, i);
            float *out[JOB_MAX_OUT] = {0};
            for (int k = 0; k < job_outputs(j); k++) out[k] = tu_alloc(job_output_len(j, k));
            CHECK_OK(job_run(j, 1 + round % 2, out));
            for (int k = 0; k < job_outputs(j); k++) free(out[k]);
        }
        CHECK(ls_cpu_has_bf16_dot() == answer, "round %d: the answer changed", round);
    }
    CHECK(ls_cpu_probes() <= 1, "%d CPUID probes over %d calls of %d jobs; expected at most 1",
          ls_cpu_probes(), 3 * n_jobs, n_jobs);
    jobs_free(jobs, n_jobs);
    return tu_finish("cpu_probe");
}
