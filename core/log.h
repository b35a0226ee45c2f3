/*
 * Internal logging. tern_error()..tern_trace() check the level before formatting;
 * tern_trace() compiles out unless TERN_ENABLE_TRACE is defined, so data-path
 * trace lines cost nothing in a normal build.
 */
#ifndef TERN_CORE_LOG_H
#define TERN_CORE_LOG_H

#include <stdatomic.h>
#include <tern/log.h>

extern _Atomic int tern__log_level;

void tern__log(tern_log_level_t level, const char *fmt, ...) TERN_PRINTF(2, 3);

/* The rank shown in this thread's log prefix (-1: none). Context threads set it. */
void tern__log_set_rank(int rank);
int tern__log_rank(void);

#define TERN__LOG(level, ...)                                                     \
    do {                                                                          \
        if ((int)(level) <= atomic_load_explicit(&tern__log_level, memory_order_relaxed)) \
            tern__log((level), __VA_ARGS__);                                      \
    } while (0)

#define tern_error(...) TERN__LOG(TERN_LOG_ERROR, __VA_ARGS__)
#define tern_warn(...) TERN__LOG(TERN_LOG_WARN, __VA_ARGS__)
#define tern_info(...) TERN__LOG(TERN_LOG_INFO, __VA_ARGS__)
#define tern_debug(...) TERN__LOG(TERN_LOG_DEBUG, __VA_ARGS__)
#ifdef TERN_ENABLE_TRACE
#define tern_trace(...) TERN__LOG(TERN_LOG_TRACE, __VA_ARGS__)
#else
#define tern_trace(...) ((void)0)
#endif

#endif
