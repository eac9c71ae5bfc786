/* Internal: large per-call scratch blocks that outlive their call, for the next one.
 *
 * A call that frees several MiB of workspace at its end gives it back to the OS (glibc
 * returns large blocks by unmapping or trimming them), so the next call faults every page in
 * again, the kernel zeroing each one, with the threads of the call contending for the
 * process's memory map: an SSM1 training step spent ~25% of its time there on 2 threads.
 * ls_scratch_free keeps up to LS_SCRATCH_SLOTS blocks, LS_SCRATCH_KEEP_BYTES in all (or the
 * limit set by linseq_workspace_set_limit; 0 keeps nothing), and ls_scratch_alloc hands the
 * best fitting one out again. When a fresh allocation fails, every kept block is freed and
 * the allocation tried once more, so the cache never turns a call that fits in memory into
 * LINSEQ_ERR_OUT_OF_MEMORY; a call that fails gives its blocks back with ls_scratch_discard.
 * linseq_workspace_release frees them all. Thread-safe; the contents of a block are whatever
 * the last holder left. */
#ifndef LS_CORE_SCRATCH_H
#define LS_CORE_SCRATCH_H

#include <stddef.h>

#define LS_SCRATCH_SLOTS 8
#define LS_SCRATCH_KEEP_BYTES ((size_t)256 << 20)

/* A block of at least `bytes` bytes, 64-byte aligned (a kept one when one fits, not more than
 * twice the size asked for), or NULL when memory is short (even with every kept block freed)
 * or bytes is 0. */
void *ls_scratch_alloc(size_t bytes);

/* Gives the block back: kept for a later ls_scratch_alloc, or freed when the cache is full
 * (the smallest kept blocks make room for a larger one) or the block alone is larger than the
 * limit. NULL does nothing. */
void ls_scratch_free(void *block);

/* Frees the block without keeping it: the blocks of a call that failed (its memory is what a
 * caller short of memory needs back). NULL does nothing. */
void ls_scratch_discard(void *block);

/* Frees every kept block; returns the bytes freed. */
size_t ls_scratch_release(void);

/* The bytes the cache holds now (for tests and diagnostics). */
size_t ls_scratch_kept_bytes(void);

#endif
