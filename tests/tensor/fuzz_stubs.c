/*
 * What core/status.c needs from core/log.c, for the fuzzer only: it links the
 * tensor sources and status.c alone (compiled with clang, apart from the main
 * build), and a fuzzer must not print a line per rejected input.
 */
#include "core/log.h"

_Atomic int tern__log_level = TERN_LOG_ERROR;

void tern__log(tern_log_level_t level, const char *fmt, ...)
{
    (void)level;
    (void)fmt;
}
