/* Internals shared by the files of rpc/. */
#ifndef TERN_RPC_INT_H
#define TERN_RPC_INT_H

#include <stdbool.h>
#include <stddef.h>

#include <tern/rpc.h>

/* A registered function (fn) or class (ctor, dtor). */
typedef struct tern__rpc_entry {
    char name[TERN_RPC_NAME_MAX + 1];
    tern_rpc_fn fn;
    tern_rpc_ctor ctor;
    tern_rpc_dtor dtor;
} tern__rpc_entry_t;

/* Letters, digits, '_', '-', and with dotted one inner '.'; 1..NAME_MAX long. */
bool tern__rpc_name_ok(const char *name, size_t len, bool dotted);

/* The entry named name[0..len), or NULL. */
const tern__rpc_entry_t *tern__rpc_lookup(const char *name, size_t len);

/* Register the built-ins once (every entry point that looks names up calls it). */
tern_status_t tern__rpc_builtins(void);

#endif
