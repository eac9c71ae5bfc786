/* Thread-count setting and the parallel loop over independent work items, run by the
 * library's own pool of worker threads (no OpenMP).
 *
 * A call's caller always works on its own items, and pool workers join it while unclaimed
 * items remain. Items are claimed atomically, so a worker that the OS has not scheduled yet
 * (another process holds its core) holds nothing up: whoever is running takes its items, and
 * the caller waits only for workers that are inside an item. A worker that cannot be created
 * (memory pressure) is not an error either: the call runs with the threads it has, down to
 * the caller alone. Idle workers spin briefly, then sleep on a condition variable. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "core/parallel.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "core/fp_mode.h"
#include "core/status.h"
#include "core/validate.h"

/* 0 = not set: one thread per processor. The only setting of the library. */
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

/* The processors this process may run on (its affinity mask). */
static int processor_count(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > LS_MAX_THREADS ? LS_MAX_THREADS : (int)n;
}

int linseq_get_num_threads(void)
{
    const int n = atomic_load(&default_threads);
    return n > 0 ? n : processor_count();
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

linseq_status ls_alloc_blocks(const char *fn, size_t block_bytes, int64_t count, void **out)
{
    *out = NULL;
    int64_t bytes;
    if (block_bytes > (size_t)PTRDIFF_MAX || !ls_mul_ok(&bytes, 2, (int64_t)block_bytes, count) ||
        bytes > (int64_t)PTRDIFF_MAX - 63)
        return ls_fail(fn, LINSEQ_ERR_SIZE_OVERFLOW,
                       "the workspace (%lld x %zu bytes) is larger than the address space",
                       (long long)count, block_bytes);
    /* aligned_alloc wants a whole number of alignments, and NULL is its answer to 0 */
    const size_t size = bytes ? ((size_t)bytes + 63) & ~(size_t)63 : 64;
    *out = aligned_alloc(64, size);
    if (!*out)
        return ls_fail(fn, LINSEQ_ERR_OUT_OF_MEMORY,
                       "cannot allocate %zu bytes of workspace (%lld x %zu bytes)", size,
                       (long long)count, block_bytes);
    return LINSEQ_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* One call's work: its items and who runs them                                              */
/* ---------------------------------------------------------------------------------------- */

typedef struct job {
    ls_item_fn fn;
    void *ctx;
    int64_t n_items;
    int n_threads; /* executors at most; with fixed, also the number of blocks */
    bool fixed;
    atomic_int_fast64_t next_item;           /* dynamic: the next unclaimed item */
    atomic_int blocks_claimed;               /* fixed: blocks taken so far */
    atomic_bool block_taken[LS_MAX_THREADS]; /* fixed: block b has been taken */
    /* guarded by the pool's lock */
    unsigned char slot_used[LS_MAX_THREADS]; /* executor index t is in use */
    int joined;                              /* executors so far, the caller included */
    atomic_int running;                      /* workers inside the job (read unlocked to spin) */
    pthread_cond_t workers_left;             /* signalled when running drops to 0 */
    struct job *next_job;                    /* the pool's list of open jobs */
} job;

static bool job_has_work(job *j)
{
    return j->fixed ? atomic_load(&j->blocks_claimed) < j->n_threads
                    : atomic_load(&j->next_item) < j->n_items;
}

/* Block b of the fixed split: the b-th of n_threads contiguous, nearly equal ranges. */
static void run_block(const job *j, int b, int t)
{
    const int64_t per = j->n_items / j->n_threads, extra = j->n_items % j->n_threads;
    const int64_t first = b * per + (b < extra ? b : extra), count = per + (b < extra ? 1 : 0);
    for (int64_t i = first; i < first + count; i++) j->fn(j->ctx, i, t);
}

/* Executor t runs items until none is left to claim. Fixed: block t first (the same items
 * as on the last call, so their data is in this core's cache), then any block whose owner
 * has not started it. */
static void run_share(job *j, int t)
{
    if (!j->fixed) {
        for (int64_t i; (i = atomic_fetch_add(&j->next_item, 1)) < j->n_items;) j->fn(j->ctx, i, t);
        return;
    }
    for (int k = 0; k < j->n_threads; k++) {
        const int b = (t + k) % j->n_threads;
        if (atomic_load_explicit(&j->block_taken[b], memory_order_relaxed) ||
            atomic_exchange(&j->block_taken[b], true))
            continue;
        atomic_fetch_add(&j->blocks_claimed, 1);
        run_block(j, b, t);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* The pool                                                                                  */
/* ---------------------------------------------------------------------------------------- */

/* How long an idle thread polls before it sleeps: longer than the gap between the calls of
 * a decode loop, far shorter than a scheduler tick. A build may set it (-DLS_SPIN_NS=0: sleep
 * at once) to measure what the polling costs a framework that shares the cores. */
#ifndef LS_SPIN_NS
#define LS_SPIN_NS 50000
#endif
#define SPIN_NS ((int64_t)LS_SPIN_NS)

static struct {
    pthread_mutex_t lock;
    pthread_cond_t work; /* idle workers sleep here */
    job *jobs;           /* open jobs */
    int n_workers;       /* created; worker w (1-based) prefers executor index w */
    int sleeping;
    bool stopping;
    atomic_uint posted; /* bumped at every new job: what spinning workers watch */
    pthread_t threads[LS_MAX_THREADS];
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .work = PTHREAD_COND_INITIALIZER};

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Polls until *word != value or SPIN_NS have passed; returns whether it changed. */
static bool spin_while_equal(const atomic_uint *word, unsigned value)
{
    const int64_t end = now_ns() + SPIN_NS;
    for (int n = 1;; n++) {
        if (atomic_load(word) != value) return true;
        cpu_relax();
        if (n % 64 == 0 && now_ns() > end) return false;
    }
}

/* Under the lock: the executor index for worker w (w if free, else the lowest free one). */
static int join_job(job *j, int w)
{
    int t = w < j->n_threads && !j->slot_used[w] ? w : 1;
    while (j->slot_used[t]) t++;
    j->slot_used[t] = 1;
    j->joined++;
    atomic_fetch_add(&j->running, 1);
    return t;
}

static job *open_job(void)
{
    for (job *j = pool.jobs; j; j = j->next_job)
        if (j->joined < j->n_threads && job_has_work(j)) return j;
    return NULL;
}

/* A name that `top -H` and /proc/<pid>/task/<tid>/comm show, so that the CPU time of the
 * pool's threads can be told apart from the host framework's threads. */
static void name_this_worker(void)
{
#if defined(__GLIBC__)
    pthread_setname_np(pthread_self(), "linseq-worker");
#endif
}

static void *worker_main(void *arg)
{
    const int w = (int)(intptr_t)arg;
    name_this_worker();
    pthread_mutex_lock(&pool.lock);
    for (;;) {
        job *j = open_job();
        if (j) {
            const int t = join_job(j, w);
            pthread_mutex_unlock(&pool.lock);
            const unsigned mode = ls_fp_mode_enter();
            run_share(j, t);
            ls_fp_mode_leave(mode);
            pthread_mutex_lock(&pool.lock);
            /* the last one out tells the caller, still under the lock: once it has the lock
             * again the job may be gone, and nothing touches it after */
            if (atomic_fetch_sub(&j->running, 1) == 1) pthread_cond_signal(&j->workers_left);
            continue;
        }
        if (pool.stopping) break;
        const unsigned seen = atomic_load(&pool.posted);
        pthread_mutex_unlock(&pool.lock);
        const bool posted = spin_while_equal(&pool.posted, seen);
        pthread_mutex_lock(&pool.lock);
        /* jobs are posted under the lock, so checking again here loses no wake-up */
        if (posted || atomic_load(&pool.posted) != seen || pool.stopping) continue;
        pool.sleeping++;
        pthread_cond_wait(&pool.work, &pool.lock);
        pool.sleeping--;
    }
    pthread_mutex_unlock(&pool.lock);
    return NULL;
}

/* A forked child has only the thread that forked: it starts with an empty pool. */
static void pool_after_fork_in_child(void)
{
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.work, NULL);
    pool.jobs = NULL;
    pool.n_workers = pool.sleeping = 0;
}

static void pool_register_fork_handler(void)
{
    pthread_atfork(NULL, NULL, pool_after_fork_in_child);
}

/* Under the lock: at least `want` workers, or as many as the system lets us create. */
static void ensure_workers(int want)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, pool_register_fork_handler);
    while (pool.n_workers < want && !pool.stopping) {
        const int w = pool.n_workers + 1;
        if (pthread_create(&pool.threads[w - 1], NULL, worker_main, (void *)(intptr_t)w) != 0)
            break; /* not fatal: the call runs with the threads it has */
        pool.n_workers++;
    }
}

/* Workers leave with the library: at exit, or when a dlopen'ed copy is unloaded. */
__attribute__((destructor)) static void pool_stop(void)
{
    pthread_mutex_lock(&pool.lock);
    pool.stopping = true;
    pthread_cond_broadcast(&pool.work);
    const int n = pool.n_workers;
    pthread_mutex_unlock(&pool.lock);
    for (int i = 0; i < n; i++) pthread_join(pool.threads[i], NULL);
    pthread_mutex_lock(&pool.lock);
    pool.n_workers = 0;
    pthread_mutex_unlock(&pool.lock);
}

/* Opens j to the workers; the caller is executor 0. Returns false when there are none. */
static bool post_job(job *j)
{
    pthread_mutex_lock(&pool.lock);
    ensure_workers(j->n_threads - 1);
    if (pool.n_workers == 0) {
        pthread_mutex_unlock(&pool.lock);
        return false;
    }
    j->slot_used[0] = 1;
    j->joined = 1;
    j->next_job = pool.jobs;
    pool.jobs = j;
    atomic_fetch_add(&pool.posted, 1);
    for (int i = 0; i < j->n_threads - 1 && i < pool.sleeping; i++) pthread_cond_signal(&pool.work);
    pthread_mutex_unlock(&pool.lock);
    return true;
}

/* Closes j to new workers, then waits (spinning briefly, then blocking) for those inside. */
static void finish_job(job *j)
{
    pthread_mutex_lock(&pool.lock);
    job **at = &pool.jobs;
    while (*at != j) at = &(*at)->next_job;
    *at = j->next_job;
    pthread_mutex_unlock(&pool.lock);
    const int64_t end = now_ns() + SPIN_NS;
    for (int n = 1; atomic_load(&j->running) > 0; n++) {
        cpu_relax();
        if (n % 64 == 0 && now_ns() > end) break;
    }
    pthread_mutex_lock(&pool.lock);
    while (atomic_load(&j->running) > 0) pthread_cond_wait(&j->workers_left, &pool.lock);
    pthread_mutex_unlock(&pool.lock);
}

static void run_items(int64_t n_items, int n_threads, ls_item_fn fn, void *ctx, bool fixed)
{
    /* a thread without an item would only be woken and waited for */
    if (n_threads > n_items) n_threads = (int)n_items;
    if (n_threads > LS_MAX_THREADS) n_threads = LS_MAX_THREADS;
    const unsigned mode = ls_fp_mode_enter(); /* core/fp_mode.h; the caller's back below */
    if (n_threads <= 1) {
        for (int64_t i = 0; i < n_items; i++) fn(ctx, i, 0);
        ls_fp_mode_leave(mode);
        return;
    }
    job j = {.fn = fn, .ctx = ctx, .n_items = n_items, .n_threads = n_threads, .fixed = fixed};
    pthread_cond_init(&j.workers_left, NULL);
    const bool shared = post_job(&j);
    run_share(&j, 0);
    ls_fp_mode_leave(mode);
    if (shared) finish_job(&j);
    pthread_cond_destroy(&j.workers_left);
}

void ls_parallel_for(int64_t n_items, int n_threads, ls_item_fn fn, void *ctx)
{
    run_items(n_items, n_threads, fn, ctx, false);
}

void ls_parallel_for_static(int64_t n_items, int n_threads, ls_item_fn fn, void *ctx)
{
    run_items(n_items, n_threads, fn, ctx, true);
}
