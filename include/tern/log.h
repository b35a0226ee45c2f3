/*
 * Logging. tern logs to stderr, one line per message, prefixed with the rank of
 * the context the logging thread works for and the level:
 *     [tern 3 warn] store: get("addr/7") timed out after 30000 ms
 * The level comes from TERN_LOG (error|warn|info|debug|trace, default warn).
 * Level and sink are per process, because stderr is.
 */
#ifndef TERN_LOG_H
#define TERN_LOG_H

#include <tern/defs.h>

TERN_BEGIN_DECLS

typedef enum tern_log_level {
    TERN_LOG_ERROR = 0,
    TERN_LOG_WARN = 1,
    TERN_LOG_INFO = 2,
    TERN_LOG_DEBUG = 3,
    TERN_LOG_TRACE = 4,
} tern_log_level_t;

/* rank is -1 for a thread not working for any context. msg has no newline. */
typedef void (*tern_log_sink_fn)(tern_log_level_t level, int rank, const char *msg, void *arg);

TERN_API void tern_log_set_level(tern_log_level_t level);
TERN_API tern_log_level_t tern_log_get_level(void);
TERN_API const char *tern_log_level_name(tern_log_level_t level);

/* Replace the sink (NULL restores stderr). Safe from any thread; messages being
 * written concurrently may still reach the previous sink. */
TERN_API void tern_log_set_sink(tern_log_sink_fn sink, void *arg);

TERN_END_DECLS

#endif
