/* Busy processes beside a benchmark (contend.h). */
#define _GNU_SOURCE /* prctl */
#include "contend.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

static pid_t busy[CONTEND_MAX];
static int n_busy;

/* A child's whole life: spin until killed, and never outlive the benchmark. */
static _Noreturn void spin_forever(pid_t parent)
{
#ifdef __linux__
    prctl(PR_SET_PDEATHSIG, SIGKILL);
#endif
    if (getppid() != parent) _exit(0); /* the parent died before the line above */
    for (volatile uint64_t n = 0;; n++) {
    }
}

void contend_stop(void)
{
    for (int i = 0; i < n_busy; i++) kill(busy[i], SIGKILL);
    for (int i = 0; i < n_busy; i++) waitpid(busy[i], NULL, 0);
    n_busy = 0;
}

bool contend_start(int n)
{
    static bool registered;
    if (!registered) registered = atexit(contend_stop) == 0;
    const pid_t self = getpid();
    fflush(stdout);
    fflush(stderr);
    for (int i = 0; i < n && n_busy < CONTEND_MAX; i++) {
        const pid_t pid = fork();
        if (pid < 0) {
            contend_stop();
            return false;
        }
        if (pid == 0) spin_forever(self);
        busy[n_busy++] = pid;
    }
    return true;
}

int contend_running(void) { return n_busy; }
