/* Memory pressure: a KDA forward on 4 threads in a process whose address space is capped
 * (RLIMIT_AS) a little above what it already uses, with the thread pool cold (the capped call
 * is the first) and warm (an uncapped call ran first). Every run must either succeed with
 * the same bits as the uncapped single-thread run or return LINSEQ_ERR_OUT_OF_MEMORY; a run
 * that ends its process any other way (a threading runtime that exits when it cannot create
 * a thread, an abort, a crash) fails the test. Each run is a fresh child process.
 *
 * Address-space caps do not mix with sanitizers (their shadow memory is reserved up front),
 * so a sanitizer build only says so and passes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
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

enum { B = 1, T = 256, H = 8, K = 128, V = 128, THREADS = 4 };

/* What a child reports in its exit status; any other ending is a failure of the library. */
enum { RAN_OK = 40, RAN_OOM = 41, RAN_WRONG = 42, RAN_OTHER_STATUS = 43, NO_LIMIT = 44 };

static linseq_kda_problem problem;
static float *reference, *out;

static void make_problem(void)
{
    tu_rng r = {2024};
    const size_t qk = (size_t)B * T * H * K, vo = (size_t)B * T * H * V, bh = (size_t)B * T * H;
    float *q = tu_alloc(qk), *k = tu_alloc(qk), *v = tu_alloc(vo), *beta = tu_alloc(bh);
    float *g = tu_alloc(qk);
    tu_fill_normal(&r, q, qk, 1.0);
    tu_fill_normal(&r, k, qk, 1.0);
    tu_fill_normal(&r, v, vo, 1.0);
    tu_fill_uniform(&r, beta, bh, 0.1, 0.9);
    tu_fill_uniform(&r, g, qk, -0.2, -0.01);
    problem = (linseq_kda_problem){.B = B,
                                   .T = T,
                                   .H = H,
                                   .K = K,
                                   .V = V,
                                   .q = q,
                                   .k = k,
                                   .v = v,
                                   .beta = beta,
                                   .g = g,
                                   .qk_l2norm = true,
                                   .decay = LINSEQ_DECAY_PER_CHANNEL};
    reference = tu_alloc(vo);
    out = tu_alloc(vo);
}

static linseq_status forward(int threads, float *o)
{
    const linseq_exec exec = {.threads = threads};
    return linseq_kda_forward(&problem, &exec, o, NULL);
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

/* In the child: optionally a warm uncapped call, then the capped call. Never returns. */
static void child(size_t headroom, bool warm)
{
    if (warm && forward(THREADS, out) != LINSEQ_OK) _exit(RAN_OTHER_STATUS);
    const size_t now = mapped_bytes();
    const struct rlimit cap = {now + headroom, now + headroom};
    if (now == 0 || setrlimit(RLIMIT_AS, &cap) != 0) _exit(NO_LIMIT);
    memset(out, 0xFF, (size_t)B * T * H * V * sizeof(float));
    const linseq_status st = forward(THREADS, out);
    if (st == LINSEQ_ERR_OUT_OF_MEMORY) _exit(RAN_OOM);
    if (st != LINSEQ_OK) _exit(RAN_OTHER_STATUS);
    const bool same = memcmp(out, reference, (size_t)B * T * H * V * sizeof(float)) == 0;
    _exit(same ? RAN_OK : RAN_WRONG);
}

/* Why a child ended, as text. */
static const char *ending(int ws)
{
    static char text[64];
    if (WIFSIGNALED(ws)) {
        snprintf(text, sizeof text, "killed by signal %d", WTERMSIG(ws));
        return text;
    }
    switch (WEXITSTATUS(ws)) {
    case RAN_OK: return "ok";
    case RAN_OOM: return "out of memory";
    case RAN_WRONG: return "WRONG RESULT";
    case RAN_OTHER_STATUS: return "OTHER STATUS";
    case NO_LIMIT: return "NO CAP SET";
    }
    snprintf(text, sizeof text, "EXITED (%d)", WEXITSTATUS(ws));
    return text;
}

/* Runs one capped child; returns how it ended, counting a failure unless ok or OOM. */
static const char *run_capped(size_t headroom, bool warm)
{
    fflush(NULL);
    const pid_t pid = fork();
    if (pid == 0) child(headroom, warm);
    int ws = 0;
    if (pid < 0 || waitpid(pid, &ws, 0) != pid) {
        CHECK(false, "fork or waitpid failed");
        return "NOT RUN";
    }
    const bool fine = WIFEXITED(ws) && (WEXITSTATUS(ws) == RAN_OK || WEXITSTATUS(ws) == RAN_OOM);
    CHECK(fine, "headroom %zu KiB, %s pool: %s", headroom >> 10, warm ? "warm" : "cold",
          ending(ws));
    return ending(ws);
}

int main(void)
{
#ifdef UNDER_SANITIZER
    printf("  address-space caps are not run under a sanitizer\n");
    return tu_finish("test_memory_pressure");
#endif
    make_problem();
    /* single-threaded and uncapped, in this process: creates no worker before the forks */
    CHECK_OK(forward(1, reference));
    static const size_t kib[] = {0,    64,    512,   1024,  2048,  4096,  8192,
                                 9216, 12288, 16384, 20480, 24576, 32768, 65536};
    printf("  %10s  %-14s  %-14s\n", "headroom", "cold pool", "warm pool");
    for (size_t i = 0; i < sizeof kib / sizeof kib[0]; i++) {
        printf("  %7zu KiB  %-14s", kib[i], run_capped(kib[i] << 10, false));
        printf("  %-14s\n", run_capped(kib[i] << 10, true));
    }
    return tu_finish("test_memory_pressure");
}
