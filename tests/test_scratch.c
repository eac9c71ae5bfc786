/* The scratch-block cache (src/core/scratch.h): a freed block comes back to the next request
 * it fits, aligned and with its whole size usable; no block is ever held by two callers at
 * once, also when threads allocate and free concurrently while another releases the cache and
 * changes its limit; the cache keeps no block that is too large or that would push it past its
 * byte limit. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "core/scratch.h"
#include "testutil.h"

#define MIB ((size_t)1 << 20)

static void reuse(void)
{
    void *a = ls_scratch_alloc(3 * MIB);
    CHECK(a && (uintptr_t)a % 64 == 0, "a 3 MiB block, 64-byte aligned");
    memset(a, 0x5a, 3 * MIB); /* every byte asked for is usable (ASan/valgrind check it) */
    const size_t before = ls_scratch_kept_bytes();
    ls_scratch_free(a);
    CHECK(ls_scratch_kept_bytes() >= before + 3 * MIB, "the freed block is kept (%zu -> %zu)",
          before, ls_scratch_kept_bytes());
    void *b = ls_scratch_alloc(3 * MIB);
    CHECK(b == a, "the freed block serves the next request of its size");
    /* a request less than half the kept block's size takes a new one (no waste) */
    void *small = ls_scratch_alloc(MIB);
    CHECK(small && small != b, "a 1 MiB request gets its own block while b is held");
    ls_scratch_free(small);
    ls_scratch_free(b);
    void *c = ls_scratch_alloc(MIB);
    CHECK(c == small, "the best fitting kept block is handed out (the 1 MiB one)");
    void *d = ls_scratch_alloc(3 * MIB);
    CHECK(d == a, "and the 3 MiB one to the 3 MiB request");
    ls_scratch_free(c);
    ls_scratch_free(d);
    CHECK(ls_scratch_alloc(0) == NULL, "0 bytes: NULL");
    ls_scratch_free(NULL);
}

static void limits(void)
{
    /* a block over the byte limit is freed, not kept */
    const size_t before = ls_scratch_kept_bytes();
    void *huge = ls_scratch_alloc(LS_SCRATCH_KEEP_BYTES + 64);
    CHECK(huge != NULL, "a block over the limit can still be allocated");
    ls_scratch_free(huge);
    CHECK(ls_scratch_kept_bytes() == before, "a block over the limit is not kept (%zu -> %zu)",
          before, ls_scratch_kept_bytes());
    /* more blocks than slots: all are given back, at most LS_SCRATCH_SLOTS kept; asking for
     * them again takes the kept ones (the cache's byte count says so: addresses cannot, as a
     * fresh allocation may land where a freed block was) */
    void *blocks[LS_SCRATCH_SLOTS + 4];
    for (int i = 0; i < LS_SCRATCH_SLOTS + 4; i++) blocks[i] = ls_scratch_alloc(2 * MIB);
    for (int i = 0; i < LS_SCRATCH_SLOTS + 4; i++) ls_scratch_free(blocks[i]);
    const size_t kept = ls_scratch_kept_bytes();
    /* (reuse() left a 3 MiB block in the cache, the largest size so far) */
    CHECK(kept <= (size_t)LS_SCRATCH_SLOTS * (3 * MIB + 64) && kept >= 2 * MIB,
          "between one and %d blocks kept (%zu bytes)", LS_SCRATCH_SLOTS, kept);
    for (int i = 0; i < LS_SCRATCH_SLOTS + 4; i++) blocks[i] = ls_scratch_alloc(2 * MIB);
    CHECK(ls_scratch_kept_bytes() < kept, "the 2 MiB requests took kept blocks (%zu -> %zu)", kept,
          ls_scratch_kept_bytes());
    for (int i = 0; i < LS_SCRATCH_SLOTS + 4; i++) ls_scratch_free(blocks[i]);
}

/* Threads that each hold a block, stamp it with their own byte, check the stamp after a pause,
 * and give it back: a block handed to two holders at once shows the other's stamp. */
enum { THREADS = 4, ROUNDS = 200 };
static int clashes;
static pthread_mutex_t clash_lock = PTHREAD_MUTEX_INITIALIZER;

static void *stamp_blocks(void *arg)
{
    const unsigned char mine = (unsigned char)(uintptr_t)arg;
    for (int r = 0; r < ROUNDS; r++) {
        const size_t bytes = (size_t)(1 + (r + mine) % 3) * 256 * 1024;
        unsigned char *b = ls_scratch_alloc(bytes);
        if (!b) continue;
        memset(b, mine, bytes);
        for (volatile int spin = 0; spin < 1000; spin++) {
        }
        size_t wrong = 0;
        for (size_t i = 0; i < bytes; i += 4096) wrong += b[i] != mine || b[bytes - 1] != mine;
        ls_scratch_free(b);
        if (wrong) {
            pthread_mutex_lock(&clash_lock);
            clashes++;
            pthread_mutex_unlock(&clash_lock);
        }
    }
    return NULL;
}

/* Releases the cache and changes its limit while the stamping threads run. */
static atomic_int stamping;
static void *shrink_cache(void *arg)
{
    (void)arg;
    for (size_t r = 0; stamping; r++) {
        if (r % 2)
            linseq_workspace_release();
        else
            linseq_workspace_set_limit(r % 4 ? 0 : (size_t)1 << 20);
    }
    linseq_workspace_set_limit(LS_SCRATCH_KEEP_BYTES);
    return NULL;
}

static void concurrent(void)
{
    pthread_t t[THREADS], shrinker;
    stamping = 1;
    pthread_create(&shrinker, NULL, shrink_cache, NULL);
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, stamp_blocks, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    stamping = 0;
    pthread_join(shrinker, NULL);
    CHECK(clashes == 0, "%d blocks were held by two threads at once", clashes);
}

int main(void)
{
    reuse();
    limits();
    concurrent();
    return tu_finish("test_scratch");
}
