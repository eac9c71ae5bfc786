/* Internal: recording a failure with a message that names the argument at fault. */
#ifndef LS_CORE_STATUS_H
#define LS_CORE_STATUS_H

#include "linseq.h"

/* Sets the thread's last-error message to "fn: <formatted text>" and returns status. */
linseq_status ls_fail(const char *fn, linseq_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Every entry point starts by clearing the message so a success leaves "". */
void ls_clear_error(void);

#endif
