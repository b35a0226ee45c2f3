/*
 * What core/status.c needs from core/log.c, for the fuzzers only (this one and
 * tests/prof/fuzz_prof.c): they link a layer's few sources and status.c alone
 * (compiled with clang, apart from the main build), and a fuzzer must not
 * print a line per rejected input.
 */
#include "core/log.h"

_Atomic int tern__log_level = TERN_LOG_ERROR;

void tern__log(tern_log_level_t level, const char *fmt, ...)
{
    (void)level;
    (void)fmt;
}
