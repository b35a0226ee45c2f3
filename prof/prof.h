/*
 * The profiler's internals, for the layers that record into it (p2p,
 * collectives, rpc). include/tern/prof.h is the user's side.
 */
#ifndef TERN_PROF_PROF_H
#define TERN_PROF_PROF_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tern/prof.h>

struct tern__comm;

/* A session is running in this process. */
extern atomic_int tern__prof_on;

/* Events of one profiled RPC handler, on the target: whatever the threads
 * running it record goes here and travels back with the reply. */
typedef struct tern__prof_capture tern__prof_capture_t;
extern _Thread_local tern__prof_capture_t *tern__prof_tl_capture;

/* Whether this thread records now: a session, or a profiled handler. */
static inline bool tern__prof_recording(void)
{
    /* acquire: what start wrote before turning it on is seen after */
    return atomic_load_explicit(&tern__prof_on, memory_order_acquire) != 0 ||
           tern__prof_tl_capture != NULL;
}

/* The prof bit and config for an RPC's immediate issued now (0: none). */
uint32_t tern__prof_imm_bits(void);

/* The config bits (tern_prof_flag) in force on this thread. */
unsigned tern__prof_flags(void);

/* A range of one of tern's own kinds (tern_prof_kind); 0 when not recording.
 * The check is inline: every blocking send and receive makes it, and a call
 * into the recorder just to learn that it is off was a measurable part of a
 * shared-memory message's instructions (docs/perf.md). */
tern_prof_range_t tern__prof_begin_on(const char *name, unsigned kind);
static inline tern_prof_range_t tern__prof_begin(const char *name, unsigned kind)
{
    return tern__prof_recording() ? tern__prof_begin_on(name, kind) : 0;
}

/* Mark a range as one end of a message (tern_prof_event_t's peer, dir, seq). */
void tern__prof_range_msg(tern_prof_range_t range, int peer, unsigned dir, uint64_t seq);

/* Count bytes tern allocates for the ranges open on this thread (when
 * memory is profiled), and the running count. */
void tern__prof_alloc(int64_t bytes);
int64_t tern__prof_mem_now(void);

/*
 * An operation that completes on another thread than the one that started
 * it (an RPC, from issue to completion). Lives inside the object it times.
 */
typedef struct tern__prof_op {
    char *name; /* NULL: not profiled */
    int64_t start;
    uint64_t id;
    uint64_t tid;
    tern__prof_capture_t *capture; /* issued inside a profiled handler */
    uint64_t parent; /* the event it belongs to (a collective's messages) */
    uint64_t seq;    /* a message's number (tern_prof_event_t.seq) */
    int peer;
    unsigned kind;
    unsigned dir;    /* tern_prof_dir */
    unsigned gen;    /* the session it started in: filed only into that one */
} tern__prof_op_t;

/* Start op if this thread records (name from fmt); it ends by
 * tern__prof_op_end or tern__prof_op_drop. The first time a session talks to
 * peer, this estimates peer's clock (and again every refresh interval). */
void tern__prof_op_begin(tern__prof_op_t *op, struct tern__comm *comm, int peer, unsigned kind,
                         const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* As tern__prof_op_begin, with a name already made (malloc'ed; taken over,
 * NULL: not profiled). Formatting costs a profiled RPC more than the rest
 * of its recording, so RPCs build their names with tern__prof_concat. */
void tern__prof_op_begin_named(tern__prof_op_t *op, struct tern__comm *comm, int peer,
                               unsigned kind, char *name);
/* parts[0..n) (n <= 16) joined into a new malloc'ed string, or NULL. */
char *tern__prof_concat(const char *const *parts, size_t n);

/* File op's event, ending now, with the remote events of its reply (wire
 * form, may be NULL): named "<op>#remote_op: <name>", children of op. */
void tern__prof_op_end(tern__prof_op_t *op, uint64_t bytes, const uint8_t *events, size_t len);
void tern__prof_op_drop(tern__prof_op_t *op);

/* ---- the target's side ---- */

/* A capture for a request that came with prof bits (cfg: the imm's cfg). */
tern__prof_capture_t *tern__prof_capture_new(unsigned cfg);
void tern__prof_capture_put(tern__prof_capture_t *cap);
/* Make cap this thread's (NULL: none); returns the one it replaces. */
tern__prof_capture_t *tern__prof_capture_enter(tern__prof_capture_t *cap);
/* Record the handler's own event into cap. */
void tern__prof_capture_handler(tern__prof_capture_t *cap, const char *name, int64_t start,
                                int64_t end, int64_t mem, const char *shapes);
/* Wire size of cap's events, and write them (at most room bytes; events
 * that do not fit are counted as dropped). Returns the bytes written. */
size_t tern__prof_capture_size(tern__prof_capture_t *cap);
size_t tern__prof_capture_encode(tern__prof_capture_t *cap, uint8_t *buf, size_t room);

/* Tensor shapes as "[[3, 3], [3]]" into buf. */
void tern__prof_shapes(char *buf, size_t size, const void *tensors, size_t n);

/* ---- clocks (p2p control messages carry the ping-pong) ---- */

/* A PONG arrived from src: our ping seq, and the peer's clock when it answered. */
void tern__prof_clock_pong(struct tern__comm *comm, int src, uint64_t seq, int64_t t_remote);

/* The rank a PING's answer and a capture's events carry (set by tern_init). */
void tern__prof_set_rank(int rank);

/* A peer was lost: a ping waiting on it gives up. */
void tern__prof_peer_lost(int peer);

/* tern_finalize of ctx: a session still running on it is stopped (with a
 * warning; its results stay readable) and forgets ctx, which is about to be
 * freed. */
void tern__prof_ctx_finalize(tern_ctx_t *ctx);
void tern__prof_set_fini_hook(void (*fn)(tern_ctx_t *ctx));

#endif
