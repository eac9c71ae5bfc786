/* Large per-call scratch blocks kept for the next call (scratch.h). */
#include "core/scratch.h"

#include <pthread.h>

#include "linseq.h"
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

/* Each block starts with this many bytes holding its usable size, so that the returned
 * pointer stays 64-byte aligned. */
#define HEADER 64

/* The allocation's own start, not the pointer handed out: so that a leak checker sees the
 * kept blocks as reachable at exit rather than as possibly lost. */
typedef struct kept_block {
    char *base; /* NULL: an empty slot */
    size_t bytes;
} kept_block;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static kept_block kept[LS_SCRATCH_SLOTS];
static size_t kept_bytes;
static size_t limit_bytes = LS_SCRATCH_KEEP_BYTES; /* linseq_workspace_set_limit */

/* fork() copies the cache, and a child must not inherit the lock held by another thread. */
static void before_fork(void) { pthread_mutex_lock(&lock); }
static void after_fork(void) { pthread_mutex_unlock(&lock); }
static void register_fork_handlers(void) { pthread_atfork(before_fork, after_fork, after_fork); }
static pthread_once_t fork_handlers_once = PTHREAD_ONCE_INIT;

static size_t size_of(const void *block) { return *(const size_t *)((const char *)block - HEADER); }

void *ls_scratch_alloc(size_t bytes)
{
    if (bytes == 0 || bytes > SIZE_MAX - 2 * HEADER) return NULL;
    const size_t want = (bytes + HEADER - 1) / HEADER * HEADER;
    pthread_once(&fork_handlers_once, register_fork_handlers);
    pthread_mutex_lock(&lock);
    int best = -1;
    for (int i = 0; i < LS_SCRATCH_SLOTS; i++)
        if (kept[i].base && kept[i].bytes >= want && kept[i].bytes / 2 <= want &&
            (best < 0 || kept[i].bytes < kept[best].bytes))
            best = i;
    char *base = NULL;
    if (best >= 0) {
        base = kept[best].base;
        kept_bytes -= kept[best].bytes;
        kept[best].base = NULL;
    }
    pthread_mutex_unlock(&lock);
    if (base) return base + HEADER;

    base = aligned_alloc(64, HEADER + want);
    /* The kept blocks hold address space and memory a fresh allocation may need: under a
     * memory cap they would make every later call fail that fits a fresh process. Give them
     * all back and try once more. */
    if (!base && ls_scratch_release() > 0) base = aligned_alloc(64, HEADER + want);
    if (!base) return NULL;
    *(size_t *)base = want;
    return base + HEADER;
}

/* The slot of the smallest kept block smaller than `bytes`, or -1. */
static int smallest_below(size_t bytes)
{
    int found = -1;
    for (int i = 0; i < LS_SCRATCH_SLOTS; i++)
        if (kept[i].base && kept[i].bytes < bytes &&
            (found < 0 || kept[i].bytes < kept[found].bytes))
            found = i;
    return found;
}

static int empty_slot(void)
{
    for (int i = 0; i < LS_SCRATCH_SLOTS; i++)
        if (!kept[i].base) return i;
    return -1;
}

void ls_scratch_free(void *block)
{
    if (!block) return;
    char *base = (char *)block - HEADER;
    const size_t bytes = size_of(block);
    char *evicted[LS_SCRATCH_SLOTS];
    int n_evicted = 0;
    bool keep = false;
    pthread_once(&fork_handlers_once, register_fork_handlers);
    pthread_mutex_lock(&lock);
    if (bytes <= limit_bytes) {
        /* room by evicting smaller blocks, smallest first: a large block is the costlier
         * one to fault in again */
        for (int i; (kept_bytes + bytes > limit_bytes || empty_slot() < 0) &&
                    (i = smallest_below(bytes)) >= 0;) {
            evicted[n_evicted++] = kept[i].base;
            kept_bytes -= kept[i].bytes;
            kept[i].base = NULL;
        }
        const int slot = empty_slot();
        keep = slot >= 0 && kept_bytes + bytes <= limit_bytes;
        if (keep) {
            kept[slot] = (kept_block){base, bytes};
            kept_bytes += bytes;
        }
    }
    pthread_mutex_unlock(&lock);
    for (int i = 0; i < n_evicted; i++) free(evicted[i]);
    if (!keep) free(base);
}

void ls_scratch_discard(void *block)
{
    if (block) free((char *)block - HEADER);
}

/* Takes out of the cache, under the lock, the blocks that push it past `keep` bytes (all of
 * them for 0), largest first, and frees them outside it; returns the bytes freed. */
static size_t shrink_to(size_t keep, bool set_limit, size_t *old_limit)
{
    char *freed[LS_SCRATCH_SLOTS];
    int n_freed = 0;
    size_t bytes = 0;
    pthread_once(&fork_handlers_once, register_fork_handlers);
    pthread_mutex_lock(&lock);
    if (set_limit) {
        *old_limit = limit_bytes;
        limit_bytes = keep;
    }
    while (kept_bytes > keep) {
        int largest = -1;
        for (int i = 0; i < LS_SCRATCH_SLOTS; i++)
            if (kept[i].base && (largest < 0 || kept[i].bytes > kept[largest].bytes)) largest = i;
        freed[n_freed++] = kept[largest].base;
        bytes += kept[largest].bytes;
        kept_bytes -= kept[largest].bytes;
        kept[largest].base = NULL;
    }
    pthread_mutex_unlock(&lock);
    for (int i = 0; i < n_freed; i++) free(freed[i]);
    return bytes;
}

size_t ls_scratch_release(void) { return shrink_to(0, false, NULL); }

size_t ls_scratch_kept_bytes(void)
{
    pthread_once(&fork_handlers_once, register_fork_handlers);
    pthread_mutex_lock(&lock);
    const size_t bytes = kept_bytes;
    pthread_mutex_unlock(&lock);
    return bytes;
}

size_t linseq_workspace_release(void) { return ls_scratch_release(); }

size_t linseq_workspace_set_limit(size_t bytes)
{
    size_t old = 0;
    shrink_to(bytes, true, &old);
    return old;
}

size_t linseq_workspace_kept_bytes(void) { return ls_scratch_kept_bytes(); }
