/*
 * The environment variables tern reads. One table in core/config.c lists every
 * one, with its type, default and description; it is parsed and validated in one
 * place, and a bad value is an error naming the variable. tern-run --help-env
 * prints it.
 */
#ifndef TERN_ENV_H
#define TERN_ENV_H

#include <stdio.h>
#include <tern/defs.h>
#include <tern/status.h>

TERN_BEGIN_DECLS

typedef enum tern_env_format {
    TERN_ENV_FORMAT_TEXT = 0,     /* aligned columns for a terminal */
    TERN_ENV_FORMAT_MARKDOWN = 1, /* a table for docs/env.md and the README */
} tern_env_format_t;

/* Print the table of variables. Returns TERN_ERR_IO if writing failed. */
TERN_API tern_status_t tern_env_print(FILE *out, tern_env_format_t format);

/* Parse and validate every variable in the current environment without using
 * them. Returns TERN_ERR_CONFIG (detail in tern_last_error()) on the first bad one. */
TERN_API tern_status_t tern_env_check(void);

TERN_END_DECLS

#endif
