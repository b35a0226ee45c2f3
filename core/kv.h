/*
 * The key-value table behind both store backends: the TCP server (one thread)
 * and the in-process memory store (under its own mutex). Not thread-safe: the
 * caller serializes every call.
 */
#ifndef TERN_CORE_KV_H
#define TERN_CORE_KV_H

#include <stddef.h>
#include <stdint.h>

#include <tern/status.h>

typedef struct tern__kv tern__kv_t;

/* A table for a job of world_size ranks. NULL on allocation failure. */
tern__kv_t *tern__kv_create(unsigned world_size);
void tern__kv_destroy(tern__kv_t *kv);

/* Copy value[0..len) into key. */
tern_status_t tern__kv_set(tern__kv_t *kv, const char *key, const void *value, size_t len);

/* The stored value, or NULL if key is absent. Owned by the table: valid until the
 * next set/add of that key or destroy. */
const void *tern__kv_peek(const tern__kv_t *kv, const char *key, size_t *len);

/* Add delta to the decimal integer at key (absent = 0), store the result as
 * decimal text (as TCPStore does, so a get reads "3"). */
tern_status_t tern__kv_add(tern__kv_t *kv, const char *key, int64_t delta, int64_t *result);

/*
 * Admit rank into the job: TERN_ERR_MISMATCH (detail says why) if world_size
 * differs from the table's or rank is already in; TERN_ERR_INVALID_PARAM if rank
 * is out of range.
 */
tern_status_t tern__kv_join(tern__kv_t *kv, unsigned rank, unsigned world_size);
void tern__kv_leave(tern__kv_t *kv, unsigned rank);
/*
 * TERN_OK if rank, of a world of world_size, has joined: what a further
 * connection of that rank needs (it does not join again). Otherwise
 * TERN_ERR_MISMATCH or TERN_ERR_INVALID_PARAM, as tern__kv_join says.
 */
tern_status_t tern__kv_check_member(const tern__kv_t *kv, unsigned rank, unsigned world_size);
unsigned tern__kv_members(const tern__kv_t *kv);

/* Copy out a malloc'ed, NUL-terminated value (the store's get contract). */
tern_status_t tern__kv_copy(const void *value, size_t len, void **out, size_t *out_len);

#endif
