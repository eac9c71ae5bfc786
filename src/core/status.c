/* Status strings and the per-thread error message that names the failing argument. */
#include "core/status.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_error[1024];

const char *linseq_status_string(linseq_status status)
{
    switch (status) {
    case LINSEQ_OK: return "LINSEQ_OK: success";
    case LINSEQ_ERR_NULL_POINTER: return "LINSEQ_ERR_NULL_POINTER: a required pointer is NULL";
    case LINSEQ_ERR_INVALID_SIZE: return "LINSEQ_ERR_INVALID_SIZE: a size is out of its range";
    case LINSEQ_ERR_SIZE_OVERFLOW:
        return "LINSEQ_ERR_SIZE_OVERFLOW: a tensor's byte size overflows";
    case LINSEQ_ERR_SHAPE_MISMATCH: return "LINSEQ_ERR_SHAPE_MISMATCH: sizes are inconsistent";
    case LINSEQ_ERR_INVALID_CU_SEQLENS:
        return "LINSEQ_ERR_INVALID_CU_SEQLENS: bad sequence offsets";
    case LINSEQ_ERR_INVALID_ENUM: return "LINSEQ_ERR_INVALID_ENUM: unknown enum value";
    case LINSEQ_ERR_INVALID_VALUE: return "LINSEQ_ERR_INVALID_VALUE: an option is out of range";
    case LINSEQ_ERR_ALIASING: return "LINSEQ_ERR_ALIASING: an output overlaps another buffer";
    case LINSEQ_ERR_UNSUPPORTED: return "LINSEQ_ERR_UNSUPPORTED: not supported by this build";
    case LINSEQ_ERR_OUT_OF_MEMORY: return "LINSEQ_ERR_OUT_OF_MEMORY: workspace allocation failed";
    case LINSEQ_ERR_DEVICE: return "LINSEQ_ERR_DEVICE: a CUDA call failed";
    }
    return "unknown linseq_status";
}

const char *linseq_last_error(void) { return last_error; }

const char *linseq_version(void)
{
#define LS_STR2(x) #x
#define LS_STR(x) LS_STR2(x)
    return LS_STR(LINSEQ_VERSION_MAJOR) "." LS_STR(LINSEQ_VERSION_MINOR) "." LS_STR(
        LINSEQ_VERSION_PATCH);
}

void ls_clear_error(void) { last_error[0] = '\0'; }

linseq_status ls_fail(const char *fn, linseq_status status, const char *fmt, ...)
{
    int n = snprintf(last_error, sizeof last_error, "%s: ", fn);
    if (n < 0 || (size_t)n >= sizeof last_error) return status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error + n, sizeof last_error - (size_t)n, fmt, ap);
    va_end(ap);
    return status;
}
