/*
 * Remote procedure calls, remote objects and RRefs: what torch.distributed.rpc
 * is to Python programs, in C (docs/rpc.md).
 *
 * Every rank of a context that calls tern_rpc_init() becomes a worker with a
 * unique name. A worker calls named functions on another (tern_rpc_sync,
 * tern_rpc_async), creates objects there (tern_remote) and holds references to
 * them (tern_rref_t), which it may pass to a third worker in a call. Functions
 * are C functions registered under the same name on every worker before
 * tern_rpc_init(). Arguments and results are tensors (CPU, any dtype and
 * shape; strided ones are sent contiguous) plus one small byte blob.
 *
 * Small calls travel inside one transport message. A tensor over the eager
 * limit stays where it is: its memory is registered and the other side pulls
 * it with a transport get straight into the tensor it hands to the handler (or
 * to the caller, for results). So a caller's argument tensors must stay
 * untouched until its future completes.
 *
 * Handlers run on the context's worker pool, never on the progress thread. A
 * handler may issue RPCs of its own; it should not block on them but defer its
 * reply (tern_rpc_call_defer) and finish from a callback (tern_future_then).
 * If it does block, its wait runs other queued work, so a full pool does not
 * deadlock while work is queued.
 *
 * Threading: every function may be called from any thread, handlers and
 * callbacks included, between tern_rpc_init() and tern_rpc_shutdown().
 */
#ifndef TERN_RPC_H
#define TERN_RPC_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <tern/context.h>
#include <tern/defs.h>
#include <tern/status.h>
#include <tern/tensor.h>

TERN_BEGIN_DECLS

typedef struct tern_future tern_future_t;
typedef struct tern_rref tern_rref_t;
typedef struct tern_rpc_call tern_rpc_call_t;

/* Longest worker, function or class name, without the terminating NUL. */
#define TERN_RPC_NAME_MAX 63

/* ---- workers ---- */

enum tern_rpc_option_field {
    TERN_RPC_OPT_TIMEOUT = 1u << 0,
    TERN_RPC_OPT_THREADS = 1u << 1,
    TERN_RPC_OPT_WINDOW = 1u << 2,
};

/* Fields are read only where their bit is set; the others take the
 * environment, then the default in brackets. */
typedef struct tern_rpc_options {
    uint64_t field_mask;
    int64_t timeout_ns; /* [TERN_RPC_TIMEOUT, 60 s] a call's timeout when it names none;
                           negative: none */
    unsigned threads;   /* [the pool's size] handlers running at once on this worker
                           (1 .. pool size; the pool itself is sized by tern_init) */
    unsigned window;    /* [TERN_RPC_WINDOW, 256] calls in flight to one worker; a call
                           beyond it waits for one to finish (back-pressure) */
} tern_rpc_options_t;

/*
 * Make this rank a worker named name (NULL: "worker<rank>"; letters, digits,
 * '_', '-' and at most one '.' inside, at most TERN_RPC_NAME_MAX). Collective
 * over the context's world: returns once every rank has a name, and fails on
 * every rank with TERN_ERR_MISMATCH if two chose the same one, or
 * TERN_ERR_INVALID_PARAM if one chose a bad one. A bad option fails at once,
 * on that rank only. Register functions and classes before.
 */
TERN_API tern_status_t tern_rpc_init(tern_ctx_t *ctx, const char *name,
                                     const tern_rpc_options_t *options);

/*
 * Stop being a worker. graceful (collective over every worker, as
 * rpc.shutdown()): wait until every worker has no call in flight, no handler
 * running or queued and no message unanswered, then tear down; objects this
 * worker still owns are destroyed. Not graceful (this rank alone): fail every
 * call still in flight with TERN_ERR_CLOSED and tear down; the others see this
 * worker's calls fail, those queued or waiting for an object here with
 * TERN_ERR_CLOSED at once. Futures and RRefs the user still holds must be freed
 * or released afterwards as usual (every operation on them fails with
 * TERN_ERR_CLOSED; releasing an RRef still tells its owner, which may go on
 * working). Must not be called from a handler or callback.
 */
TERN_API tern_status_t tern_rpc_shutdown(tern_ctx_t *ctx, int graceful);

/* The rank of worker name: TERN_ERR_NOT_FOUND if no worker has it. */
TERN_API tern_status_t tern_rpc_worker_rank(tern_ctx_t *ctx, const char *name, int *rank);

/* Copy the name of rank's worker (NULL for rank -1: this one) into buf[0..cap). */
TERN_API tern_status_t tern_rpc_worker_name(tern_ctx_t *ctx, int rank, char *buf, size_t cap);

/* ---- values: what calls take and return ---- */

/* What a call sends: tensors (CPU; kept untouched until the future completes),
 * a blob of bytes, and RRefs. Any part may be empty; NULL args is all empty. */
typedef struct tern_rpc_args {
    const tern_tensor_t *tensors;
    size_t ntensors;
    const void *blob;
    size_t blob_len;
    tern_rref_t *const *rrefs;
    size_t nrrefs;
} tern_rpc_args_t;

/* A value received: a call's arguments (in a handler) or its result (in a
 * future). Contiguous CPU tensors whose memory belongs to the call or future,
 * each payload aligned to at least 8 bytes (64 when it was pulled). The
 * RRefs are borrowed as well: valid while the call runs (arguments; the same
 * as tern_rpc_call_rref) or until the future is freed (results);
 * tern_rref_dup() one to keep it longer. */
typedef struct tern_rpc_value {
    const tern_tensor_t *tensors;
    size_t ntensors;
    const void *blob;
    size_t blob_len;
    tern_rref_t *const *rrefs;
    size_t nrrefs;
} tern_rpc_value_t;

/* ---- calls and futures ---- */

/* timeout_ns of a call: > 0 that many ns; 0 the worker's default; < 0 none. */
#define TERN_RPC_TIMEOUT_DEFAULT 0

/*
 * Run function fn on worker to (a name) with args, and return a future at once.
 * The future completes with the function's result, or with an error: the
 * handler's status and message (prefixed with the target's name), the target
 * being lost (TERN_ERR_PEER_LOST), the timeout (TERN_ERR_TIMEOUT; a reply
 * arriving later is dropped), or shutdown (TERN_ERR_CLOSED). A call beyond
 * the window waits here for room, and that wait is part of its timeout.
 * Errors returned here (nothing was sent): TERN_ERR_INVALID_PARAM,
 * TERN_ERR_NOT_FOUND (no such worker), TERN_ERR_CLOSED, TERN_ERR_UNSUPPORTED
 * (a CUDA tensor), TERN_ERR_PEER_LOST (the target, or an RRef argument's
 * owner, was lost), TERN_ERR_TIMEOUT (no room in the window in time).
 */
TERN_API tern_status_t tern_rpc_async(tern_ctx_t *ctx, const char *to, const char *fn,
                                      const tern_rpc_args_t *args, int64_t timeout_ns,
                                      tern_future_t **future);

/* tern_rpc_async, then wait. Returns the call's status; on TERN_OK *result is
 * the completed future holding the value (free it), else *result is NULL. */
TERN_API tern_status_t tern_rpc_sync(tern_ctx_t *ctx, const char *to, const char *fn,
                                     const tern_rpc_args_t *args, int64_t timeout_ns,
                                     tern_future_t **result);

/*
 * Wait up to timeout_ns (< 0: for ever) for the future. Returns its status once
 * complete; TERN_ERR_TIMEOUT if the wait ran out first (the future is still
 * pending: tern_future_test tells the two timeouts apart).
 */
TERN_API tern_status_t tern_future_wait(tern_future_t *future, int64_t timeout_ns);

/* 1 if complete, else 0 (it also moves progress along). */
TERN_API int tern_future_test(tern_future_t *future);

/* Wait for all n futures (up to timeout_ns in all); the first error among them
 * in array order, or TERN_OK. */
TERN_API tern_status_t tern_future_wait_all(tern_future_t *const *futures, size_t n,
                                            int64_t timeout_ns);

/* A complete future's status (TERN_ERR_NO_RESOURCE while pending) and error
 * message ("" on success). */
TERN_API tern_status_t tern_future_status(const tern_future_t *future);
TERN_API const char *tern_future_error(const tern_future_t *future);

/* A future that completed with TERN_OK: its value, valid until it is freed.
 * NULL otherwise. */
TERN_API const tern_rpc_value_t *tern_future_value(const tern_future_t *future);

/*
 * Call cb(future, arg) once the future completes: on the worker pool, or at
 * once on this thread if it already has. At most 8 callbacks per future. The
 * callback may read the future but not free it; it may call any RPC function.
 */
typedef void (*tern_future_cb)(tern_future_t *future, void *arg);
TERN_API tern_status_t tern_future_then(tern_future_t *future, tern_future_cb cb, void *arg);

/* Free a future. A pending one is detached: its call goes on, its result is
 * dropped on arrival, its callbacks still run (before the memory goes). NULL
 * is a no-op. */
TERN_API void tern_future_free(tern_future_t *future);

/* ---- functions and handlers ---- */

/*
 * A function a worker runs for its callers. It reads its arguments from call,
 * adds results (tern_rpc_call_alloc_tensor / _return_*), and returns TERN_OK or
 * an error; for an error the caller's future gets the status and the message
 * of tern_rpc_call_fail() (or, failing that, this thread's tern_last_error()).
 */
typedef tern_status_t (*tern_rpc_fn)(tern_rpc_call_t *call);

/* A class of remote objects: ctor builds *obj from the call's arguments; dtor
 * frees it when the last RRef to it is gone. Methods are functions registered
 * as "Class.method", which find the object in tern_rpc_call_self(). */
typedef tern_status_t (*tern_rpc_ctor)(tern_rpc_call_t *call, void **obj);
typedef void (*tern_rpc_dtor)(void *obj);

/*
 * Register a function or a class, process-wide, on every worker, before
 * tern_rpc_init(). Names as worker names, plus one '.' for methods.
 * TERN_ERR_INVALID_PARAM for a bad name, TERN_ERR_MISMATCH for a name already
 * taken by something else (registering the same thing twice is fine).
 * Built in on every worker: add, sub, mul, div (elementwise, same dtype and
 * shape), matmul (2-d), relu, sum (all elements, one scalar out), and sleep_ms
 * (the blob holds a decimal count of milliseconds; returns nothing).
 */
TERN_API tern_status_t tern_rpc_register(const char *name, tern_rpc_fn fn);
TERN_API tern_status_t tern_rpc_register_class(const char *name, tern_rpc_ctor ctor,
                                               tern_rpc_dtor dtor);

/* In a handler: the arguments, the caller's rank, this worker's context, the
 * object a method was called on (NULL for a plain function). */
TERN_API const tern_rpc_value_t *tern_rpc_call_args(const tern_rpc_call_t *call);
TERN_API int tern_rpc_call_caller(const tern_rpc_call_t *call);
TERN_API tern_ctx_t *tern_rpc_call_ctx(const tern_rpc_call_t *call);
TERN_API void *tern_rpc_call_self(const tern_rpc_call_t *call);
TERN_API const char *tern_rpc_call_name(const tern_rpc_call_t *call);

/* The RRefs passed as arguments: borrowed for the handler's run (or until a
 * deferred call completes); tern_rref_dup() one to keep it longer. */
TERN_API size_t tern_rpc_call_nrrefs(const tern_rpc_call_t *call);
TERN_API tern_rref_t *tern_rpc_call_rref(const tern_rpc_call_t *call, size_t i);

/*
 * Results. alloc_tensor appends a contiguous CPU result tensor whose memory
 * the call owns and sends as it is (write the result straight into it: no
 * copy); its payload is 64-byte aligned, shape may be NULL when ndim is 0.
 * return_tensor appends a copy of t. return_blob sets the blob (a copy).
 * Errors: TERN_ERR_INVALID_PARAM, TERN_ERR_NO_MEMORY, TERN_ERR_OUT_OF_RANGE (over
 * 64 tensors).
 */
TERN_API tern_status_t tern_rpc_call_alloc_tensor(tern_rpc_call_t *call, tern_dtype_t dtype,
                                                  int32_t ndim, const int64_t *shape,
                                                  tern_tensor_t **out);
TERN_API tern_status_t tern_rpc_call_return_tensor(tern_rpc_call_t *call, const tern_tensor_t *t);
TERN_API tern_status_t tern_rpc_call_return_blob(tern_rpc_call_t *call, const void *blob,
                                                 size_t len);
/* Append an RRef to the result, as a Python function returns RRefs (the
 * pipeline seed's parameter_rrefs): the caller's future gets a handle of its
 * own (tern_future_value()->rrefs), by the fork protocol of docs/rpc.md. rref
 * may be owned here (tern_rref_local, an argument's, one from tern_remote) or
 * anywhere else; the call keeps its own handle until the reply is out, so the
 * handler may release its own at once. In a function run by tern_remote the
 * RRefs become part of the new RRef's value, held by its owner until the
 * value is freed; tern_rref_to_here hands each caller RRefs of its own.
 * Errors: TERN_ERR_INVALID_PARAM (NULL, or another worker's RRef),
 * TERN_ERR_OUT_OF_RANGE (over 64 RRefs), TERN_ERR_NO_MEMORY. */
TERN_API tern_status_t tern_rpc_call_return_rref(tern_rpc_call_t *call, tern_rref_t *rref);
/* Append argument tensor i as a result: without a copy when it was pulled
 * (over the eager limit; the argument stays readable until the call ends),
 * else as return_tensor. An echo of large tensors moves no byte twice. */
TERN_API tern_status_t tern_rpc_call_return_arg(tern_rpc_call_t *call, size_t i);

/* Record the error message the caller will see and return status, so a
 * handler ends with: return tern_rpc_call_fail(call, TERN_ERR_..., "..."). */
TERN_API tern_status_t tern_rpc_call_fail(tern_rpc_call_t *call, tern_status_t status,
                                          const char *fmt, ...) TERN_PRINTF(3, 4);

/*
 * Reply later: after tern_rpc_call_defer(call) the handler's return value is
 * ignored and the call stays open (its arguments and RRefs remain valid) until
 * tern_rpc_call_complete(call, status) is called, from any thread, exactly
 * once. That is how a handler waits for its own RPCs without holding a pool
 * thread: defer, then complete from the futures' callback.
 */
TERN_API void tern_rpc_call_defer(tern_rpc_call_t *call);
TERN_API void tern_rpc_call_complete(tern_rpc_call_t *call, tern_status_t status);

/* ---- remote objects and RRefs ---- */

/*
 * As rpc.remote: on worker to, run fn (a function: the RRef holds its result)
 * or construct an object (fn names a class: the RRef holds the object), and
 * return an RRef to it at once. Failures show on use (to_here, method calls).
 */
TERN_API tern_status_t tern_remote(tern_ctx_t *ctx, const char *to, const char *fn,
                                   const tern_rpc_args_t *args, int64_t timeout_ns,
                                   tern_rref_t **rref);

/* An RRef owned by this worker holding a copy of value's tensors and blob (as
 * RRef(x) in PyTorch), to pass to others. */
TERN_API tern_status_t tern_rref_local(tern_ctx_t *ctx, const tern_rpc_args_t *value,
                                       tern_rref_t **rref);

/*
 * Fetch the value an RRef holds (its tensors, blob and RRefs) into *value, a
 * completed future to free. An RRef to an object has a value only if its class has a
 * "to_here" method (TERN_ERR_UNSUPPORTED otherwise), which then runs.
 */
TERN_API tern_status_t tern_rref_to_here(tern_rref_t *rref, int64_t timeout_ns,
                                         tern_future_t **value);

/*
 * Call method on the RRef's owner, as RRef.rpc_sync()/rpc_async()/remote().
 * A call that reaches the owner before the object exists waits there for it
 * (so one on an RRef already released waits for its timeout):
 * for an object of class C, the function "C.method" runs with the object as
 * tern_rpc_call_self(); for a value, the function "method" runs with the
 * value's tensors before args' own (so rpc_sync(x_rref, "add", y) is x + y).
 */
TERN_API tern_status_t tern_rref_rpc_sync(tern_rref_t *rref, const char *method,
                                          const tern_rpc_args_t *args, int64_t timeout_ns,
                                          tern_future_t **result);
TERN_API tern_status_t tern_rref_rpc_async(tern_rref_t *rref, const char *method,
                                           const tern_rpc_args_t *args, int64_t timeout_ns,
                                           tern_future_t **future);
TERN_API tern_status_t tern_rref_remote(tern_rref_t *rref, const char *method,
                                        const tern_rpc_args_t *args, int64_t timeout_ns,
                                        tern_rref_t **out);

/* The owner's rank, and whether that is this worker. */
TERN_API int tern_rref_owner(const tern_rref_t *rref);
TERN_API int tern_rref_is_owner(const tern_rref_t *rref);

/* Another handle to the same remote object (counted); release each. */
TERN_API tern_status_t tern_rref_dup(tern_rref_t *rref, tern_rref_t **out);

/* Drop a handle. When no worker holds one any more the owner frees the object.
 * NULL is a no-op. Release handles (and free futures) before tern_finalize. */
TERN_API void tern_rref_release(tern_rref_t *rref);

/* Objects and values this worker owns for RRefs still alive somewhere. */
TERN_API size_t tern_rpc_owned_count(tern_ctx_t *ctx);

TERN_END_DECLS

#endif
