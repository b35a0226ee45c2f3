/*
 * Collectives: groups, the schedule engine and the algorithms.
 *
 * Every collective is compiled, when it is called, into a schedule: a list of
 * steps (send to a group rank, receive from one, reduce, copy, scale), each
 * with at most two steps it must wait for. The list is in an order where every
 * step comes after the steps it waits for, so the engine runs it by scanning
 * forward: it posts sends and receives (tern__p2p_isend/irecv on the group's
 * communicator id) as soon as their inputs are ready and runs local steps as
 * their inputs arrive. That gives pipelining for free (segment s of a ring
 * step goes out while segment s+1 of the previous step is still being
 * reduced) and lets non-blocking collectives progress from whichever thread
 * progresses the transport.
 *
 * Messages are matched on (group cid, source, tag) where the tag is
 * (sequence number of the call on the group, step number), so calls that
 * overlap, and groups that overlap, never mix.
 */
#ifndef TERN_COLLECTIVES_COLL_H
#define TERN_COLLECTIVES_COLL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tern/coll.h>

#include "collectives/way.h"
#include "p2p/comm.h"
#include "tensor/reduce.h"

/* Call signatures a group times the puts' way for at once (way.h); the one
 * used longest ago gives its slot to a new one. */
#define TERN__WAY_SLOTS 8

typedef enum step_kind {
    STEP_SEND = 1,
    STEP_RECV,
    STEP_REDUCE, /* dst = a op b, count elements */
    STEP_COPY,   /* dst <- a, n bytes */
    STEP_SCALE,  /* dst /= group size (AVG), count elements */
} step_kind_t;

typedef enum step_state { STEP_IDLE = 0, STEP_POSTED, STEP_DONE } step_state_t;

typedef struct step {
    uint8_t kind;
    uint8_t state;
    int peer;        /* group rank (send/recv) */
    uint32_t tag;    /* the step's tag within the call (send/recv) */
    void *dst;
    const void *a, *b;
    size_t n;        /* bytes for send/recv/copy, elements for reduce/scale */
    int32_t dep[2];  /* indices of steps this one waits for; -1: none */
    tern_request_t *req;
} step_t;

struct tern_group {
    tern_ctx_t *ctx;
    tern__comm_t *comm;  /* NULL once its context is finalized */
    struct tern_group *next_live; /* coll_state_t.groups, under the comm lock */
    uint32_t cid;        /* communicator id of its messages (0 is user p2p) */
    int size, rank;      /* rank -1: not a member */
    int *world;          /* [size] world rank of each group rank */
    uint32_t seq;        /* calls made on it */
    tern_status_t broken; /* sticky failure (TERN_OK while healthy) */
    char broken_detail[256];
    bool is_world;
    tern__way_t ways[TERN__WAY_SLOTS]; /* under the comm lock (engine.c) */
};

typedef struct tern__coll {
    tern_request_t req;  /* what the user waits on (kind REQ_COLL); first member */
    tern_group_t *g;
    const char *op_name; /* "all_reduce" */
    uint32_t shape;      /* the call's signature, in its rendezvous messages (api.c) */
    uint32_t seq;
    tern_dtype_t dtype;
    tern_reduce_op_t op;
    step_t *steps;
    size_t nsteps, cap, first;
    void *scratch;
    size_t scratch_cap;  /* bytes of the block scratch points to */
    void *kept;          /* a recycled call's scratch block, until tern__coll_scratch takes it */
    size_t kept_cap;
    bool oom;
    atomic_flag busy;    /* one thread advances it at a time */
    tern_status_t failing; /* set once it failed: withdraw what is posted, then finish */
    /* When a step last finished, as the first idle look at the clock after it
     * saw it (0: not looked yet): reading the clock as steps finish cost a
     * tenth of a small all_reduce, and the timeout is milliseconds. */
    uint64_t last_move;
    bool moved;          /* steps finished since the last look */
    int64_t timeout_ns;
    atomic_int reported;      /* a peer's ABORT for this call arrived: its status (detail under the lock) */
    /* A peer withdrew its end of one of our messages (its call failed):
     * its world rank + 1 (0: none) and when we saw it. The call waits for
     * the ABORT that says why (engine.c, reap). */
    int withdrew;
    uint64_t withdrew_at;
    struct tern__coll *next; /* in the group state's list of collectives in flight */
    size_t es;           /* bytes of one element of dtype */
    tern__reduce_fn kernel; /* op on dtype, for steps too small for the pool */
    /* The puts' way, where the transport takes one (attr.put_way_min): on
     * for calls that big and alike on every member (api.c), then their
     * signature's slot, this call's number in it, its way and its start. */
    bool way_on;
    tern__way_t *way_slot;
    uint64_t way_i;
    tern_op_way_t way;
    uint64_t way_t0;
    /* Last, so that a new call clears only what comes before them: zeroing
     * the whole was a twentieth of a small all_reduce. Empty until set. */
    char detail[256];         /* why it failed */
    char reported_detail[200]; /* a peer's ABORT: why (under the lock) */
} tern__coll_t;

/* A peer's report that call seq on group cid failed, for a call this rank
 * has not started yet. */
typedef struct abort_note {
    uint32_t cid, seq;
    tern_status_t status;
    char detail[200];
} abort_note_t;

#define ABORT_NOTES 16

/* The collectives state of a comm: the world group and what is in flight. */
typedef struct coll_state {
    tern_group_t *world;
    tern_group_t *groups; /* made by tern_group_create, not yet destroyed */
    uint32_t next_cid;
    tern__coll_t *active; /* collectives in flight, under the comm lock */
    unsigned turn;        /* where the next progress pass starts in active, when more than
                             PICK_MAX are in flight (under the comm lock) */
    abort_note_t notes[ABORT_NOTES]; /* under the comm lock; ring, oldest overwritten */
    unsigned nnotes;
    /* A finished call kept for the next, its step array and scratch with it:
     * a small all_reduce spent a tenth of its time in malloc and free. */
    _Atomic(struct tern__coll *) spare;
    /* Set by a progress pass that found a collective taken by another
     * thread: the kick it ran on is spent, and what it announced may have
     * landed after the owner's last look, so the owner kicks again when it
     * lets go. Here and not in the collective, which may be freed as soon
     * as its busy flag is clear. */
    atomic_bool missed;
} coll_state_t;

/* Route ABORT messages (class COLL) to the engine. */
void tern__coll_on_message(tern__comm_t *comm, const tern_event_t *ev, void *arg);

/* ---- engine.c ---- */

/* A new schedule for a call on g (g healthy and this rank a member). */
tern__coll_t *tern__coll_new(tern_group_t *g, const char *op_name, tern_dtype_t dtype,
                             tern_reduce_op_t op);
/* Free c, or keep it (its buffers within SPARE_*_MAX) for the next call. */
void tern__coll_discard(tern__coll_t *c);
/* Free the kept call (the state's teardown). */
void tern__coll_free_spare(coll_state_t *cs);
/* Scratch memory of the call, freed with it (NULL: out of memory, noted). */
void *tern__coll_scratch(tern__coll_t *c, size_t bytes);

/* Append a step; returns its index (>= 0), or -1 once out of memory. Deps
 * are indices of earlier steps, or -1. */
int tern__coll_send(tern__coll_t *c, int peer, uint32_t tag, const void *buf, size_t bytes,
                    int dep0, int dep1);
int tern__coll_recv(tern__coll_t *c, int peer, uint32_t tag, void *buf, size_t bytes, int dep0,
                    int dep1);
int tern__coll_reduce(tern__coll_t *c, void *dst, const void *a, const void *b, size_t count,
                      int dep0, int dep1);
int tern__coll_copy(tern__coll_t *c, void *dst, const void *src, size_t bytes, int dep0, int dep1);
int tern__coll_scale(tern__coll_t *c, void *buf, size_t count, int dep0, int dep1);

/* Start the schedule; with req NULL wait for it and return its outcome. */
tern_status_t tern__coll_start(tern__coll_t *c, tern_request_t **req);

/* Point the comm's collective hooks at the engine. */
void tern__coll_install_hooks(tern__comm_t *comm);

/* The collectives state of a comm, made (hooks installed) on first use;
 * NULL only when out of memory (group.c). */
coll_state_t *tern__coll_state(tern__comm_t *comm);

/* ---- algos.c: schedule builders. Buffers are checked by the caller. ---- */

typedef enum allreduce_algo { AR_AUTO = 0, AR_RING, AR_RD, AR_RAB } allreduce_algo_t;
typedef enum bcast_algo { BC_AUTO = 0, BC_BINOMIAL, BC_CHAIN } bcast_algo_t;
typedef enum allgather_algo { AG_AUTO = 0, AG_RING, AG_BRUCK } allgather_algo_t;
typedef enum alltoall_algo { A2A_AUTO = 0, A2A_PAIRWISE, A2A_LINEAR } alltoall_algo_t;

void tern__build_allreduce(tern__coll_t *c, const void *sbuf, void *rbuf, size_t count, int algo,
                           size_t seg);
void tern__build_bcast(tern__coll_t *c, void *buf, size_t bytes, int root, int algo, size_t seg);
void tern__build_reduce(tern__coll_t *c, const void *sbuf, void *rbuf, size_t count, int root,
                        int algo, size_t seg);
/* blocks[r] = {displacement, count} in elements; own block from sbuf. */
void tern__build_allgatherv(tern__coll_t *c, const void *sbuf, void *rbuf, const size_t *counts,
                            const size_t *displs, int algo);
void tern__build_gatherv(tern__coll_t *c, const void *sbuf, size_t scount, void *rbuf,
                         const size_t *counts, const size_t *displs, int root);
void tern__build_scatterv(tern__coll_t *c, const void *sbuf, const size_t *counts,
                          const size_t *displs, void *rbuf, size_t rcount, int root);
void tern__build_reduce_scatter(tern__coll_t *c, const void *sbuf, void *rbuf, size_t count,
                                size_t seg);
void tern__build_alltoallv(tern__coll_t *c, const void *sbuf, const size_t *scounts,
                           const size_t *sdispls, void *rbuf, const size_t *rcounts,
                           const size_t *rdispls, int algo);
void tern__build_barrier(tern__coll_t *c);

#endif
