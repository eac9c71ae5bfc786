/* Internal: large per-call scratch blocks that outlive their call, for the next one.
 *
 * A call that frees several MiB of workspace at its end gives it back to the OS (glibc
 * returns large blocks by unmapping or trimming them), so the next call faults every page in
 * again, the kernel zeroing each one, with the threads of the call contending for the
 * process's memory map: an SSM1 training step spent ~25% of its time there on 2 threads.
 * ls_scratch_free keeps up to LS_SCRATCH_SLOTS blocks, LS_SCRATCH_KEEP_BYTES in all, and
 * ls_scratch_alloc hands the best fitting one out again. Thread-safe; the contents of a block
 * are whatever the last holder left. */
#ifndef LS_CORE_SCRATCH_H
#define LS_CORE_SCRATCH_H

#include <stddef.h>

#define LS_SCRATCH_SLOTS 8
#define LS_SCRATCH_KEEP_BYTES ((size_t)256 << 20)

/* A block of at least `bytes` bytes, 64-byte aligned (a kept one when one fits, not more than
 * twice the size asked for), or NULL when memory is short or bytes is 0. */
void *ls_scratch_alloc(size_t bytes);

/* Gives the block back: kept for a later ls_scratch_alloc, or freed when the cache is full
 * (the smallest kept blocks make room for a larger one) or the block alone is larger than
 * LS_SCRATCH_KEEP_BYTES. NULL does nothing. */
void ls_scratch_free(void *block);

/* The bytes the cache holds now (for tests and diagnostics). */
size_t ls_scratch_kept_bytes(void);

#endif
