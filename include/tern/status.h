/*
 * Status codes. Every tern call that can fail returns tern_status_t: TERN_OK (0)
 * on success, TERN_INPROGRESS (1) for an operation that completes later, a
 * negative code on error. Error codes are grouped by how much the caller must
 * tear down:
 *   -1..-19   the operation failed; retry or drop it
 *   -20..-39  the endpoint/connection is unusable; reconnect or drop the peer
 *   -40..-59  the device or local resource is unusable
 *   -60..-79  the job is inconsistent; finalize
 * A call that takes a callback and returns an error never runs that callback.
 */
#ifndef TERN_STATUS_H
#define TERN_STATUS_H

#include <tern/defs.h>

TERN_BEGIN_DECLS

/* X(name, value, description): the one list both the enum and tern_strerror() use. */
#define TERN_STATUS_MAP(X)                                                                    \
    X(TERN_OK, 0, "success")                                                                   \
    X(TERN_INPROGRESS, 1, "operation in progress")                                             \
    X(TERN_ERR_INVALID_PARAM, -1, "invalid parameter")                                          \
    X(TERN_ERR_NO_MEMORY, -2, "out of memory")                                                  \
    X(TERN_ERR_NO_RESOURCE, -3, "resource temporarily unavailable")                             \
    X(TERN_ERR_TIMEOUT, -4, "timed out")                                                        \
    X(TERN_ERR_NOT_FOUND, -5, "not found")                                                      \
    X(TERN_ERR_UNSUPPORTED, -6, "operation not supported")                                      \
    X(TERN_ERR_CANCELED, -7, "operation canceled")                                              \
    X(TERN_ERR_TRUNCATED, -8, "message truncated")                                              \
    X(TERN_ERR_ACCESS, -9, "access denied")                                                     \
    X(TERN_ERR_OUT_OF_RANGE, -10, "out of range")                                               \
    X(TERN_ERR_CONN_REFUSED, -20, "connection refused")                                         \
    X(TERN_ERR_UNREACHABLE, -21, "peer unreachable")                                            \
    X(TERN_ERR_PEER_LOST, -22, "peer lost")                                                     \
    X(TERN_ERR_PROTOCOL, -23, "protocol error")                                                 \
    X(TERN_ERR_NO_DEVICE, -40, "no such device")                                                \
    X(TERN_ERR_IO, -41, "input/output error")                                                   \
    X(TERN_ERR_ADDR_IN_USE, -42, "address already in use")                                      \
    X(TERN_ERR_CLOSED, -60, "object is shut down")                                              \
    X(TERN_ERR_CONFIG, -61, "invalid configuration")                                            \
    X(TERN_ERR_MISMATCH, -62, "ranks disagree about the job")                                   \
    X(TERN_ERR_INTERNAL, -63, "internal error")

typedef enum tern_status {
#define TERN__STATUS_ENUM(name, value, desc) name = value,
    TERN_STATUS_MAP(TERN__STATUS_ENUM)
#undef TERN__STATUS_ENUM
} tern_status_t;

/* Short description of a status code; never NULL ("unknown status" for others). */
TERN_API const char *tern_strerror(tern_status_t status);

/* The enum name of a status code ("TERN_ERR_TIMEOUT"); "TERN_UNKNOWN" for others. */
TERN_API const char *tern_status_name(tern_status_t status);

/*
 * Detail of the last error recorded by a tern call on the calling thread: which
 * object, which value, which system call. Valid until the next failing tern call
 * on this thread; "" if none has failed. Successful calls do not clear it.
 */
TERN_API const char *tern_last_error(void);

TERN_END_DECLS

#endif
