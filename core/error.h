/*
 * Recording errors. The function that first detects an error calls tern__error()
 * once with the exact cause; callers only propagate the status. The detail goes
 * to the thread's tern_last_error() buffer and to the debug log.
 */
#ifndef TERN_CORE_ERROR_H
#define TERN_CORE_ERROR_H

#include <stdbool.h>
#include <stdint.h>

#include <tern/defs.h>
#include <tern/status.h>

#define TERN__ERROR_MAX 512

/* Records the formatted detail and returns status, so: return tern__error(...). */
tern_status_t tern__error(tern_status_t status, const char *fmt, ...) TERN_PRINTF(2, 3);

/* As tern__error(), with ": <strerror(err)>" appended. */
tern_status_t tern__error_errno(tern_status_t status, int err, const char *fmt, ...)
    TERN_PRINTF(3, 4);

/* Whether v, read from the network, is one of the error codes (not TERN_OK,
 * not TERN_INPROGRESS, not a number the map lacks). */
bool tern__status_is_error(int32_t v);

/* A status another process sent: v when it is TERN_OK or one of the error
 * codes, else TERN_ERR_PROTOCOL, so that no caller is handed
 * TERN_INPROGRESS or a number tern_strerror does not know. */
tern_status_t tern__status_from_wire(int32_t v);

/* The status that best describes a system call's errno. */
tern_status_t tern__status_from_errno(int err);

#endif
