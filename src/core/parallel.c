/* Thread-count setting and the parallel loop over independent work items (OpenMP). */
#include "core/parallel.h"

#include <stdatomic.h>
#include <stdbool.h>

#include "core/status.h"
#include "core/validate.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* 0 = not set: use what OpenMP reports. The only global state of the library. */
static atomic_int default_threads;

linseq_status linseq_set_num_threads(int n)
{
    ls_clear_error();
    if (n < 0)
        return ls_fail("linseq_set_num_threads", LINSEQ_ERR_INVALID_VALUE,
                       "n = %d; expected n >= 0 (0 restores the default)", n);
    atomic_store(&default_threads, n);
    return LINSEQ_OK;
}

int linseq_get_num_threads(void)
{
    int n = atomic_load(&default_threads);
    if (n > 0) return n;
#ifdef _OPENMP
    return omp_get_num_procs();
#else
    return 1;
#endif
}

int ls_resolve_threads(const linseq_exec *exec, int64_t max_items, double work)
{
    const bool explicit_count = exec && exec->threads > 0;
    int64_t n = explicit_count ? exec->threads : linseq_get_num_threads();
    if (n > LS_MAX_THREADS) n = LS_MAX_THREADS;
    if (n > max_items) n = max_items;
    if (!explicit_count && (double)n * LS_MIN_WORK_PER_THREAD > work)
        n = (int64_t)(work / LS_MIN_WORK_PER_THREAD);
    return n < 1 ? 1 : (int)n;
}

/* fixed: thread t takes the t-th of n_threads contiguous, nearly equal blocks of items;
 * otherwise threads take the next item as they come free. */
static void run_items(int64_t n_items, int n_threads, ls_item_fn fn, void *ctx, bool fixed)
{
    /* a thread without an item would only be started and joined */
    if (n_threads > n_items) n_threads = (int)n_items;
#ifdef _OPENMP
    if (n_threads > 1 && n_items > 1) {
#pragma omp parallel num_threads(n_threads)
        {
            const int t = omp_get_thread_num();
            if (fixed) {
                const int64_t nt = omp_get_num_threads(), per = n_items / nt, extra = n_items % nt;
                const int64_t first = t * per + (t < extra ? t : extra);
                const int64_t count = per + (t < extra ? 1 : 0);
                for (int64_t i = first; i < first + count; i++) fn(ctx, i, t);
            } else {
#pragma omp for schedule(dynamic, 1)
                for (int64_t i = 0; i < n_items; i++) fn(ctx, i, t);
            }
        }
        return;
    }
#else
    (void)n_threads;
    (void)fixed;
#endif
    for (int64_t i = 0; i < n_items; i++) fn(ctx, i, 0);
}

void ls_parallel_for(int64_t n_items, int n_threads, ls_item_fn fn, void *ctx)
{
    run_items(n_items, n_threads, fn, ctx, false);
}

void ls_parallel_for_static(int64_t n_items, int n_threads, ls_item_fn fn, void *ctx)
{
    run_items(n_items, n_threads, fn, ctx, true);
}
