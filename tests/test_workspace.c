/* The workspace cache through the public API (linseq_workspace_*): an SSM1 backward leaves
 * its blocks in the cache; linseq_workspace_release gives them back (the cache's count and the
 * process's address space both drop); linseq_workspace_set_limit bounds what is kept (0:
 * nothing) without changing a bit of the results. Under an address-space cap (RLIMIT_AS, in a
 * forked child) the kept blocks never make a later call fail that fits without them, and a
 * call that fails for memory keeps none of its blocks.
 *
 * Address-space caps do not mix with sanitizers (their shadow memory is reserved up front),
 * so a sanitizer build runs only the uncapped part. Every call runs on one thread, so that
 * no worker thread's stack is mapped under a cap. */
#include <stdio.h>
#include <stdlib.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) ||                         \
    __has_feature(memory_sanitizer)
#define UNDER_SANITIZER 1
#endif
#endif

#define MIB ((size_t)1 << 20)

enum { D = 128, N = 64, BIG_T = 16384, SMALL_T = 2048 };

/* One SSM1 backward's problem, inputs and gradients at T tokens. */
typedef struct {
    linseq_ssm1_problem p;
    float *d_y;
    linseq_ssm1_grads g;
    size_t n_tok, n_bc;
} ssm_call;

static void make_call(ssm_call *c, int64_t T, uint64_t seed)
{
    tu_rng r = {seed};
    c->n_tok = (size_t)T * D;
    c->n_bc = (size_t)T * N;
    float *x = tu_alloc(c->n_tok), *dt = tu_alloc(c->n_tok), *A = tu_alloc((size_t)D * N);
    float *Bp = tu_alloc(c->n_bc), *Cp = tu_alloc(c->n_bc);
    tu_fill_normal(&r, x, c->n_tok, 1.0);
    tu_fill_uniform(&r, dt, c->n_tok, 0.01, 0.1);
    tu_fill_uniform(&r, A, (size_t)D * N, -2.0, -0.1);
    tu_fill_normal(&r, Bp, c->n_bc, 1.0);
    tu_fill_normal(&r, Cp, c->n_bc, 1.0);
    c->p = (linseq_ssm1_problem){.B = 1,
                                 .T = T,
                                 .D = D,
                                 .N = N,
                                 .G = 1,
                                 .x = x,
                                 .dt = dt,
                                 .A = A,
                                 .B_proj = Bp,
                                 .C_proj = Cp};
    c->d_y = tu_alloc(c->n_tok);
    tu_fill_normal(&r, c->d_y, c->n_tok, 1.0);
    c->g = (linseq_ssm1_grads){.dx = tu_alloc(c->n_tok),
                               .ddt = tu_alloc(c->n_tok),
                               .dA = tu_alloc((size_t)D * N),
                               .dB_proj = tu_alloc(c->n_bc),
                               .dC_proj = tu_alloc(c->n_bc)};
}

static linseq_status backward(const ssm_call *c)
{
    const linseq_exec exec = {.threads = 1};
    return linseq_ssm1_backward(&c->p, &exec, c->d_y, NULL, &c->g);
}

/* The gradients of c, copied into one buffer (dx, ddt, dA, dB_proj, dC_proj). */
static float *grads_copy(const ssm_call *c)
{
    const size_t parts[] = {c->n_tok, c->n_tok, (size_t)D * N, c->n_bc, c->n_bc};
    float *const from[] = {c->g.dx, c->g.ddt, c->g.dA, c->g.dB_proj, c->g.dC_proj};
    size_t total = 0;
    for (int i = 0; i < 5; i++) total += parts[i];
    float *out = tu_alloc(total), *at = out;
    for (int i = 0; i < 5; i++) {
        memcpy(at, from[i], parts[i] * sizeof(float));
        at += parts[i];
    }
    return out;
}

/* Whether c's gradients have the bits of ref (a grads_copy); allocates nothing, as it runs
 * under a cap. */
static bool same_grads(const ssm_call *c, const float *ref)
{
    const size_t parts[] = {c->n_tok, c->n_tok, (size_t)D * N, c->n_bc, c->n_bc};
    float *const from[] = {c->g.dx, c->g.ddt, c->g.dA, c->g.dB_proj, c->g.dC_proj};
    bool same = true;
    for (int i = 0; i < 5; i++) {
        same = same && tu_same_bits(from[i], ref, parts[i]);
        ref += parts[i];
    }
    return same;
}

/* The address space this process maps now, in bytes (Linux), or 0 when unknown. */
static size_t mapped_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    if (!f) return 0;
    if (fscanf(f, "%lu", &pages) != 1) pages = 0;
    fclose(f);
    return (size_t)pages * (size_t)sysconf(_SC_PAGESIZE);
}

static ssm_call big, small;
static float *big_ref, *small_ref;

/* Release and limit, uncapped, in this process. */
static void release_and_limit(void)
{
    linseq_workspace_release();
    CHECK(linseq_workspace_kept_bytes() == 0, "nothing kept after a release (%zu bytes)",
          linseq_workspace_kept_bytes());
    CHECK_OK(backward(&big));
    big_ref = grads_copy(&big);
    const size_t kept = linseq_workspace_kept_bytes();
    CHECK(kept >= 4 * MIB, "an SSM1 backward keeps its workspace (%zu bytes)", kept);
    const size_t mapped = mapped_bytes();
    CHECK(linseq_workspace_release() == kept, "the release frees what was kept");
    CHECK(linseq_workspace_kept_bytes() == 0, "nothing kept after the release (%zu bytes)",
          linseq_workspace_kept_bytes());
    /* (a sanitizer keeps freed memory in its quarantine, mapped) */
#ifndef UNDER_SANITIZER
    CHECK(mapped == 0 || mapped_bytes() + kept / 2 <= mapped,
          "the release gives the address space back (%zu -> %zu bytes mapped, %zu kept)", mapped,
          mapped_bytes(), kept);
#else
    (void)mapped;
#endif

    /* limit 0: nothing kept, the same bits */
    const size_t old = linseq_workspace_set_limit(0);
    CHECK(old == (size_t)256 << 20, "the default limit is 256 MiB (%zu)", old);
    CHECK_OK(backward(&big));
    CHECK(linseq_workspace_kept_bytes() == 0, "limit 0 keeps nothing (%zu bytes)",
          linseq_workspace_kept_bytes());
    CHECK(same_grads(&big, big_ref), "the gradients do not depend on the limit");
    /* a limit below one call's blocks: at most the limit kept */
    CHECK(linseq_workspace_set_limit(kept / 2) == 0, "set_limit returns the previous limit");
    CHECK_OK(backward(&big));
    CHECK(linseq_workspace_kept_bytes() <= kept / 2, "the limit %zu is respected (%zu kept)",
          kept / 2, linseq_workspace_kept_bytes());
    /* lowering the limit frees what is over it at once */
    linseq_workspace_set_limit(old);
    CHECK_OK(backward(&big));
    CHECK(linseq_workspace_kept_bytes() > kept / 2,
          "the default limit keeps more again (%zu of %zu)", linseq_workspace_kept_bytes(), kept);
    linseq_workspace_set_limit(MIB);
    CHECK(linseq_workspace_kept_bytes() <= MIB, "a lower limit frees the blocks over it (%zu)",
          linseq_workspace_kept_bytes());
    linseq_workspace_set_limit(old);
    CHECK_OK(backward(&big));
    CHECK(same_grads(&big, big_ref), "the gradients from reused blocks are the same bits");
}

enum { RAN_OK = 40, RAN_OOM = 41, RAN_WRONG = 42, RAN_OTHER = 43, NO_LIMIT = 44, KEPT = 45 };

static void cap_at(size_t bytes)
{
    const struct rlimit cap = {bytes, bytes};
    if (setrlimit(RLIMIT_AS, &cap) != 0) _exit(NO_LIMIT);
}

/* After a large backward fills the cache, cap the address space at what the process maps
 * without the cache's blocks plus `headroom`, enough for a smaller call's own blocks: the
 * smaller call must run. */
static void child_after_large(size_t headroom)
{
    if (backward(&big) != LINSEQ_OK) _exit(RAN_OTHER);
    const size_t kept = linseq_workspace_kept_bytes(), now = mapped_bytes();
    if (now == 0 || kept <= headroom) _exit(NO_LIMIT);
    cap_at(now - kept + headroom);
    const linseq_status st = backward(&small);
    if (st == LINSEQ_ERR_OUT_OF_MEMORY) _exit(RAN_OOM);
    if (st != LINSEQ_OK) _exit(RAN_OTHER);
    _exit(same_grads(&small, small_ref) ? RAN_OK : RAN_WRONG);
}

/* A large backward under a cap too tight for it: out of memory or fine, and the cache keeps
 * nothing of a call that failed. */
static void child_failing(size_t headroom)
{
    linseq_workspace_release();
    const size_t now = mapped_bytes();
    if (now == 0) _exit(NO_LIMIT);
    cap_at(now + headroom);
    const linseq_status st = backward(&big);
    if (st == LINSEQ_OK) _exit(same_grads(&big, big_ref) ? RAN_OK : RAN_WRONG);
    if (st != LINSEQ_ERR_OUT_OF_MEMORY) _exit(RAN_OTHER);
    _exit(linseq_workspace_kept_bytes() == 0 ? RAN_OOM : KEPT);
}

static int run_child(void (*fn)(size_t), size_t headroom)
{
    fflush(NULL);
    const pid_t pid = fork();
    if (pid == 0) fn(headroom);
    int ws = 0;
    if (pid < 0 || waitpid(pid, &ws, 0) != pid) return -1;
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
}

static void capped(void)
{
    linseq_workspace_release();
    CHECK_OK(backward(&small));
    small_ref = grads_copy(&small);
    linseq_workspace_release();
    /* the smaller call's blocks fit in 8 MiB, the larger call keeps more than 16 MiB */
    const int after = run_child(child_after_large, 8 * MIB);
    CHECK(after == RAN_OK,
          "a call that fits without the cache ran out of memory after a larger one (child "
          "ended %d; %d = out of memory)",
          after, RAN_OOM);
    int failed = 0;
    for (size_t headroom = MIB; headroom <= 32 * MIB; headroom += MIB) {
        const int end = run_child(child_failing, headroom);
        CHECK(end == RAN_OK || end == RAN_OOM,
              "headroom %zu MiB: child ended %d (%d: a failed call's blocks were kept)",
              headroom / MIB, end, KEPT);
        failed += end == RAN_OOM;
    }
    CHECK(failed > 0, "no cap made the large call fail: the test checks nothing");
}

int main(void)
{
#ifdef __GLIBC__
    /* every large block its own mapping, given back when freed: glibc otherwise raises its
     * threshold after the first large free and serves later blocks from heap it keeps, which
     * a cap on the address space cannot see */
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
#endif
    make_call(&big, BIG_T, 7);
    make_call(&small, SMALL_T, 8);
    release_and_limit();
#ifdef UNDER_SANITIZER
    printf("  address-space caps are not run under a sanitizer\n");
    (void)capped;
#else
    capped();
#endif
    free(big_ref);
    free(small_ref);
    return tu_finish("test_workspace");
}
