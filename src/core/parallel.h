/* Internal: the one place that runs work items on threads.
 *
 * Items are independent (one per sequence and head, or per channel block); each item's
 * arithmetic is the same whichever thread runs it, so results do not depend on the thread
 * count. `thread` is in [0, n_threads) and indexes per-thread workspace. */
#ifndef LS_CORE_PARALLEL_H
#define LS_CORE_PARALLEL_H

#include <stdint.h>

typedef void (*ls_item_fn)(void *ctx, int64_t item, int thread);

void ls_parallel_for(int64_t n_items, int n_threads, ls_item_fn fn, void *ctx);

/* Equal-cost items in fixed contiguous blocks: a thread gets the same items on every
 * call, so state that persists between calls (decode) stays in that core's cache
 * instead of moving between cores. */
void ls_parallel_for_static(int64_t n_items, int n_threads, ls_item_fn fn, void *ctx);

#endif
