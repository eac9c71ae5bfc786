/* `linseq bench --contend N`: N processes that keep a processor busy beside the timing, as
 * the other work of a loaded machine does (a framework's threads, another job), so that the
 * figure for a busy machine can be reproduced by anyone with one command. */
#ifndef LS_TOOLS_CONTEND_H
#define LS_TOOLS_CONTEND_H

#include <stdbool.h>

#define CONTEND_MAX 64

/* Starts n busy processes (0 starts none); false, with none left running, when one cannot be
 * started. They end with contend_stop, or with this process if it dies first. */
bool contend_start(int n);
/* Ends them and waits for them; safe to call again. */
void contend_stop(void);
/* How many are running now. */
int contend_running(void);

#endif
