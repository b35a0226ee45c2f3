/* Status names and the per-thread error detail. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"

const char *tern_strerror(tern_status_t status)
{
    switch (status) {
#define TERN__STATUS_DESC(name, value, desc) \
    case name:                               \
        return desc;
        TERN_STATUS_MAP(TERN__STATUS_DESC)
#undef TERN__STATUS_DESC
    }
    return "unknown status";
}

const char *tern_status_name(tern_status_t status)
{
    switch (status) {
#define TERN__STATUS_NAME(name, value, desc) \
    case name:                               \
        return #name;
        TERN_STATUS_MAP(TERN__STATUS_NAME)
#undef TERN__STATUS_NAME
    }
    return "TERN_UNKNOWN";
}

bool tern__status_is_error(int32_t v)
{
    switch (v) {
#define TERN__STATUS_KNOWN(name, value, desc) \
    case value:                               \
        return value < 0;
        TERN_STATUS_MAP(TERN__STATUS_KNOWN)
#undef TERN__STATUS_KNOWN
    }
    return false;
}

tern_status_t tern__status_from_wire(int32_t v)
{
    return v == TERN_OK || tern__status_is_error(v) ? (tern_status_t)v : TERN_ERR_PROTOCOL;
}

static _Thread_local char last_error[TERN__ERROR_MAX];

const char *tern_last_error(void)
{
    return last_error;
}

/* Formatted aside first: callers wrap the error before it ("%s: %s",
 * what, tern_last_error()), and vsnprintf into the buffer it reads from is
 * undefined (it garbled "RRef 0: RRef argument..." into "RRef 0: RRef 0:
 * ument..."). */
static tern_status_t record(tern_status_t status, const char *sys, const char *fmt, va_list ap)
{
    char buf[TERN__ERROR_MAX];
    int n = vsnprintf(buf, sizeof(buf), fmt, ap);
    if (sys != NULL && n >= 0 && (size_t)n < sizeof(buf))
        snprintf(buf + n, sizeof(buf) - (size_t)n, ": %s", sys);
    memcpy(last_error, buf, sizeof(buf));
    tern_debug("%s (%s)", last_error, tern_status_name(status));
    return status;
}

tern_status_t tern__error(tern_status_t status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    record(status, NULL, fmt, ap);
    va_end(ap);
    return status;
}

tern_status_t tern__error_errno(tern_status_t status, int err, const char *fmt, ...)
{
    char buf[128];
    va_list ap;
    va_start(ap, fmt);
    /* GNU strerror_r may return a static string instead of filling buf. */
    record(status, strerror_r(err, buf, sizeof(buf)), fmt, ap);
    va_end(ap);
    return status;
}

tern_status_t tern__status_from_errno(int err)
{
    switch (err) {
    case ENOMEM:
        return TERN_ERR_NO_MEMORY;
    case EAGAIN:
        return TERN_ERR_NO_RESOURCE;
    case ETIMEDOUT:
        return TERN_ERR_TIMEOUT;
    case ECONNREFUSED:
        return TERN_ERR_CONN_REFUSED;
    case EHOSTUNREACH:
    case ENETUNREACH:
        return TERN_ERR_UNREACHABLE;
    case ECONNRESET:
    case EPIPE:
        return TERN_ERR_PEER_LOST;
    case EADDRINUSE:
        return TERN_ERR_ADDR_IN_USE;
    case EINVAL:
        return TERN_ERR_INVALID_PARAM;
    case EACCES:
    case EPERM:
        return TERN_ERR_ACCESS;
    case ENOENT:
    case ENODEV:
        return TERN_ERR_NO_DEVICE;
    default:
        return TERN_ERR_IO;
    }
}
