/* The log sink and level, shared by every context in the process. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

#include "core/config.h"
#include "core/log.h"

/* Starts at warn; the first tern_init() (or an explicit set) applies TERN_LOG. */
_Atomic int tern__log_level = TERN_LOG_WARN;

static pthread_mutex_t sink_lock = PTHREAD_MUTEX_INITIALIZER;
static tern_log_sink_fn sink_fn;
static void *sink_arg;
static _Thread_local int log_rank = -1;

static const char *const level_names[] = {"error", "warn", "info", "debug", "trace"};

const char *tern_log_level_name(tern_log_level_t level)
{
    if ((unsigned)level < sizeof(level_names) / sizeof(level_names[0]))
        return level_names[level];
    return "?";
}

void tern_log_set_level(tern_log_level_t level)
{
    /* Compared as int: the enum's type may be unsigned, which would make a
     * negative level look like a very verbose one. */
    int v = (int)level;
    if (v < TERN_LOG_ERROR)
        v = TERN_LOG_ERROR;
    if (v > TERN_LOG_TRACE)
        v = TERN_LOG_TRACE;
    atomic_store(&tern__log_level, v);
}

tern_log_level_t tern_log_get_level(void)
{
    return (tern_log_level_t)atomic_load(&tern__log_level);
}

void tern_log_set_sink(tern_log_sink_fn sink, void *arg)
{
    pthread_mutex_lock(&sink_lock);
    sink_fn = sink;
    sink_arg = arg;
    pthread_mutex_unlock(&sink_lock);
}

void tern__log_set_rank(int rank)
{
    log_rank = rank;
}

int tern__log_rank(void)
{
    return log_rank;
}

void tern__log(tern_log_level_t level, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);

    pthread_mutex_lock(&sink_lock);
    if (sink_fn != NULL) {
        sink_fn(level, log_rank, msg, sink_arg);
    } else if (log_rank >= 0) {
        fprintf(stderr, "[tern %d %s] %s\n", log_rank, tern_log_level_name(level), msg);
    } else {
        fprintf(stderr, "[tern %s] %s\n", tern_log_level_name(level), msg);
    }
    pthread_mutex_unlock(&sink_lock);
}
