/*
 * The bootstrap key-value store. Rank 0 serves it on MASTER_ADDR:MASTER_PORT;
 * every rank (rank 0 included) is a client. Ranks publish their transport
 * addresses in it and meet at barriers, as torch.distributed's TCPStore.
 *
 * A store handle may be used from several threads: requests are serialized, so
 * a blocking get holds up the others until it returns.
 */
#ifndef TERN_STORE_H
#define TERN_STORE_H

#include <stddef.h>
#include <stdint.h>

#include <tern/defs.h>
#include <tern/status.h>

TERN_BEGIN_DECLS

typedef struct tern_store tern_store_t;
typedef struct tern_store_server tern_store_server_t;

/* Timeouts are in nanoseconds; TERN_TIMEOUT_DEFAULT takes the store's default
 * (TERN_TIMEOUT, or what it was created with). */
#define TERN_TIMEOUT_DEFAULT ((int64_t)-1)

#define TERN_STORE_KEY_MAX 4096u            /* bytes in a key */
#define TERN_STORE_VALUE_MAX (64u << 20)    /* bytes in a value */

/*
 * Serve a store for world_size ranks on host:port (port 0 picks a free one; host
 * NULL or "" listens on every interface). Errors: TERN_ERR_ADDR_IN_USE when the
 * port is taken (detail names it), TERN_ERR_UNREACHABLE when host does not
 * resolve, TERN_ERR_IO. The server runs on one thread of its own until stopped.
 */
TERN_API tern_status_t tern_store_server_start(const char *host, unsigned port, unsigned world_size,
                                               tern_store_server_t **server_out);

/* The port the server listens on (the chosen one when started with port 0). */
TERN_API unsigned tern_store_server_port(const tern_store_server_t *server);

/*
 * Wait until no client is connected, up to timeout_ns, then stop the server and
 * free it. Pending requests are failed. NULL is a no-op. Returns TERN_ERR_TIMEOUT
 * if clients were still connected (the server is stopped all the same).
 */
TERN_API tern_status_t tern_store_server_stop(tern_store_server_t *server, int64_t timeout_ns);

/*
 * Connect to the store at host:port as rank of world_size, retrying until
 * connect_timeout_ns. Errors: TERN_ERR_UNREACHABLE (nothing answered in time;
 * detail has the last cause), TERN_ERR_MISMATCH (the server serves another
 * world size, or this rank is already connected), TERN_ERR_INVALID_PARAM.
 * timeout_ns is the default for blocking calls on this handle.
 */
TERN_API tern_status_t tern_store_connect(const char *host, unsigned port, unsigned rank,
                                          unsigned world_size, int64_t connect_timeout_ns,
                                          int64_t timeout_ns, tern_store_t **store_out);

/*
 * An in-process store for world_size ranks that are threads of this process (as
 * Gloo's HashStore): tern_init() of each thread is given the same handle through
 * tern_init_params_t.store. The creator owns it and closes it after every
 * context using it is finalized.
 */
TERN_API tern_status_t tern_store_memory_create(unsigned world_size, int64_t timeout_ns,
                                                tern_store_t **store_out);

/* Close a handle (disconnecting from the server). NULL is a no-op. */
TERN_API void tern_store_close(tern_store_t *store);

/* Set key to a copy of value[0..len). Overwrites; wakes every waiter on key. */
TERN_API tern_status_t tern_store_set(tern_store_t *store, const char *key, const void *value,
                                      size_t len);

/*
 * Wait until key exists, then return a malloc'ed copy of its value in *value
 * (NUL-terminated after len bytes for convenience; the caller frees it) and its
 * length in *len. TERN_ERR_TIMEOUT if key does not appear within timeout_ns.
 */
TERN_API tern_status_t tern_store_get(tern_store_t *store, const char *key, void **value,
                                      size_t *len, int64_t timeout_ns);

/*
 * Atomically add delta to the integer stored at key (a missing key counts as 0)
 * and return the new value in *result (may be NULL). TERN_ERR_INVALID_PARAM if
 * key holds something that is not an integer.
 */
TERN_API tern_status_t tern_store_add(tern_store_t *store, const char *key, int64_t delta,
                                      int64_t *result);

/* Wait until every one of keys[0..nkeys) exists. TERN_ERR_TIMEOUT otherwise. */
TERN_API tern_status_t tern_store_wait(tern_store_t *store, const char *const *keys, size_t nkeys,
                                       int64_t timeout_ns);

/* Non-blocking: *exists = 1 if key is set. */
TERN_API tern_status_t tern_store_check(tern_store_t *store, const char *key, int *exists);

/*
 * Return when nranks callers have entered the barrier called name. The same name
 * can be reused for successive barriers among the same nranks.
 */
TERN_API tern_status_t tern_store_barrier(tern_store_t *store, const char *name, unsigned nranks,
                                          int64_t timeout_ns);

TERN_END_DECLS

#endif
