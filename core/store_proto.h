/*
 * The store's wire protocol. Every integer is big-endian.
 *
 * request : magic u32 | op u8 | version u8 | nkeys u16 | body_len u32 | 0 u32 | arg i64
 *           body = nkeys x (len u32, key bytes) then, for SET, the value bytes
 * response: magic u32 | status i32 | body_len u32 | 0 u32 | value i64
 *           body = the value (GET) or the error detail (status < 0)
 *
 * HELLO and HELLO_AUX carry one key, "job:" and the client's job token
 * (tern__store_job), which must be the server's: two jobs that meet on one
 * port are refused, not merged.
 * arg: HELLO and HELLO_AUX rank << 32 | world_size; GET/WAIT timeout in ns;
 * ADD delta.
 * value: ADD the new total; CHECK 1 if the key exists.
 * A client has at most one request outstanding. The first request on a
 * connection must be HELLO, or HELLO_AUX: a further connection of a rank
 * whose HELLO connection is open (tern__store_connect_aux), which is not a
 * member of the job (no duplicate-rank refusal; shutdown does not wait for
 * it). Anything malformed closes the connection.
 */
#ifndef TERN_CORE_STORE_PROTO_H
#define TERN_CORE_STORE_PROTO_H

#include <stdint.h>
#include <string.h>

#include "core/bytes.h"

#include <tern/store.h>

#define TERN__STORE_MAGIC 0x5445524eu /* "TERN" */
#define TERN__STORE_VERSION 2         /* 2: HELLO carries the job token */
#define TERN__STORE_HDR_SIZE 24
#define TERN__STORE_MAX_KEYS 1024u
/* Bounds what a peer can make the other side allocate for one message. */
#define TERN__STORE_BODY_MAX \
    ((uint32_t)TERN_STORE_VALUE_MAX + TERN__STORE_MAX_KEYS * (4u + TERN_STORE_KEY_MAX))

enum tern__store_op {
    TERN__STORE_HELLO = 1,
    TERN__STORE_SET = 2,
    TERN__STORE_GET = 3,
    TERN__STORE_ADD = 4,
    TERN__STORE_WAIT = 5,
    TERN__STORE_CHECK = 6,
    TERN__STORE_HELLO_AUX = 7,
};

#endif
