/* Internals shared by the files of rpc/. */
#ifndef TERN_RPC_INT_H
#define TERN_RPC_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

/*
 * For tests of the receiving side (tests/rpc/rpc_malformed.c): fn sees each
 * message this process's RPC layer sends, encoded, just before it goes, and
 * returns what goes in its place: buf, changed in place, or a malloc'd
 * replacement (buf is then freed here), with *len set to its length. The
 * immediate is made from the message as it was encoded, so a changed type
 * also tests the check of the two against each other. NULL removes the hook.
 * Set it while this process sends nothing; fn runs with the comm lock held.
 */
typedef uint8_t *(*tern__rpc_send_hook_fn)(void *arg, int dst, uint8_t *buf, size_t *len);
void tern__rpc_set_send_hook(tern__rpc_send_hook_fn fn, void *arg);

#endif
