/* Internal: the one place that runs work items on threads (the library's own thread pool).
 *
 * Items are independent (one per sequence and head, or per channel block); each item's
 * arithmetic is the same whichever thread runs it, so results do not depend on the thread
 * count. `thread` is in [0, n_threads), unique among the threads running one call's items at
 * a time, and indexes per-thread workspace. Several callers may run calls at once. Items run
 * with subnormals flushed (core/fp_mode.h), the caller's mode restored on return. */
#ifndef LS_CORE_PARALLEL_H
#define LS_CORE_PARALLEL_H

#include <stddef.h>
#include <stdint.h>

#include "linseq.h"

typedef void (*ls_item_fn)(void *ctx, int64_t item, int thread);

void ls_parallel_for(int64_t n_items, int n_threads, ls_item_fn fn, void *ctx);

/* Equal-cost items in fixed contiguous blocks: a thread gets the same items on every
 * call, so state that persists between calls (decode) stays in that core's cache
 * instead of moving between cores. */
void ls_parallel_for_static(int64_t n_items, int n_threads, ls_item_fn fn, void *ctx);

/* count blocks of block_bytes each (per-thread or per-item workspace), 64-byte aligned, into
 * *out. The product is checked before anything is allocated: LINSEQ_ERR_SIZE_OVERFLOW when it
 * exceeds the address space, LINSEQ_ERR_OUT_OF_MEMORY when the allocation fails, each
 * recorded for fn with *out = NULL. */
linseq_status ls_alloc_blocks(const char *fn, size_t block_bytes, int64_t count, void **out);

#endif
