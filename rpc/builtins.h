/*
 * The functions built in on every RPC worker: add, sub, mul, div, matmul,
 * relu, sum and sleep_ms (semantics in rpc/builtins.c and tern/rpc.h). They
 * are plain handlers over the public handler API and keep no state.
 */
#ifndef TERN_RPC_BUILTINS_H
#define TERN_RPC_BUILTINS_H

#include <tern/status.h>

/*
 * Register the built-in functions with tern_rpc_register(), process-wide.
 * Called once by the registry, which must not hold a lock that
 * tern_rpc_register() takes. Registering twice is harmless (the same function
 * under the same name). Tries every name, so one taken by the application
 * (TERN_ERR_MISMATCH) leaves the others registered; returns the first error
 * tern_rpc_register() gave, else TERN_OK. Does not block.
 */
tern_status_t tern__rpc_register_builtins(void);

#endif
