/*
 * The communication state of a context (p2p/runtime.c) and the p2p protocol
 * (p2p/p2p.c). One mutex guards the transport and every piece of p2p state:
 * whoever holds it may progress the transport, and transport events (which
 * run the protocol) arrive under it.
 */
#ifndef TERN_P2P_COMM_H
#define TERN_P2P_COMM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <tern/imm.h>
#include <tern/p2p.h>
#include <tern/store.h>
#include <tern/transport.h>

#include "core/lock.h"
#include "prof/prof.h"

typedef struct tern__comm tern__comm_t;

/* The hooks the progress thread calls outside the lock (struct tern__comm). */
typedef void (*tern__coll_progress_fn)(tern__comm_t *comm, bool check_time, bool locked);
typedef void (*tern__rpc_poll_fn)(tern__comm_t *comm);

/* A handler for one immediate class, called under the comm lock. */
typedef void (*tern__class_fn)(tern__comm_t *comm, const tern_event_t *ev, void *arg);

/* REQ_COLL: a collective (collectives/), whose request is embedded in its
 * state and finished through the comm's coll hooks. */
typedef enum req_kind { REQ_SEND = 1, REQ_RECV = 2, REQ_COLL = 3 } req_kind_t;

struct tern_request {
    tern__comm_t *comm;
    req_kind_t kind;
    atomic_int done;
    tern_status_t status;
    tern_msg_info_t info;
    struct tern_request *next; /* in the posted-receive list or the rendezvous-send list */
    uint32_t cid;              /* communicator id: 0 for user p2p, groups use others */
    int peer;                  /* send: destination; recv: source or TERN_ANY_SOURCE */
    int tag;
    uint32_t shape;            /* a collective's call signature (0: none): ends that differ fail */
    void *buf;
    size_t len;                /* send: bytes; recv: capacity */
    /* rendezvous */
    bool rtr;                  /* recv: its buffer is offered to the sender (p2p.c) */
    uint64_t since;            /* send: when it began waiting for an offer (0: not yet seen) */
    struct rtr *offer;         /* send: its receiver's offer, while it waits for the put window */
    struct unexp *pend;        /* recv: its matched RTS, while it waits for the read window */
    uint64_t id;
    tern_mr_t *mr;
    tern_rkey_t *rkey;
    int ops;                   /* transport operations in flight that name this request */
    /* It failed because its peer withdrew its end: the receiver revoked the
     * offer our put wrote into, the sender revoked the buffer our read came
     * for (both refused with TERN_ERR_ACCESS), or a FIN or RTR_FAIL said
     * CANCELED. In a collective that means the peer's call failed, and its
     * ABORT, or the one that made it fail, is on its way
     * (collectives/engine.c). */
    bool peer_withdrew;
    bool released;             /* the user has waited on it: free once ops is 0 */
    bool exact;                /* recv: a tensor's (TERN__P2P_EXACT): a shorter message fails it */
    uint8_t way;               /* send: its put's tern_op_way_t (TERN__P2P_WAY) */
    void *coll;                /* REQ_COLL: the collective's state */
    uint64_t seq;              /* the message's number between its two ranks (0: none yet) */
    uint64_t *seq_out;         /* a blocking receive's: gets seq at completion */
    tern__prof_op_t prof;      /* profiled: from post to completion */
};

/* A profiled op (begun before the post) for req, which ends it at completion
 * (tern__req_complete); one that completed as it was posted (an eager send, a
 * matched receive) ends here. Takes the lock. */
void tern__req_prof_attach(tern_request_t *req, tern__prof_op_t *op);

/* The bytes a request moves, as its profiler event reports them. */
static inline size_t tern__req_bytes(const tern_request_t *req)
{
    return req->kind == REQ_RECV ? req->info.len : req->len;
}

/* A message that arrived before its receive was posted. */
typedef struct unexp {
    struct unexp *next;
    uint32_t cid;
    int src, tag;
    size_t len;
    void *data;        /* eager: a copy of the payload */
    bool rndv;
    uint64_t sreq;     /* rendezvous: the sender's request id */
    uint64_t raddr;
    uint32_t rkey_len;
    uint32_t shape;    /* rendezvous: the sender's (tern_request.shape) */
    uint64_t seq;
    uint8_t rkey[];    /* rendezvous: rkey_len bytes */
} unexp_t;

struct tern__comm {
    tern_ctx_t *ctx;
    unsigned rank, world;
    tern_transport_t *tp;
    tern_transport_attr_t attr;
    tern__lock_t lock;        /* core/lock.h: inlined, the hot path takes it twice a message */
    pthread_cond_t idle_cv;   /* the progress thread sleeps on it while a waiter spins */
    pthread_mutex_t idle_lock; /* idle_cv's */
    pthread_t thread;
    bool thread_started;
    /* rank 0: the store server the progress thread serves, and its fd */
    tern_store_server_t *store_server;
    int store_fd;
    atomic_bool stop;
    atomic_uint waits; /* waiters' heartbeat (runtime.c): the progress thread naps while it moves */
    atomic_bool nap_long;     /* the progress thread is in a nap past its first: a post cuts it short */
    atomic_int lock_wanted;   /* threads blocked in tern__comm_lock: a waiter lets go */
    bool busy_poll;
    uint64_t spin_ns;         /* TERN_POLL_SPIN: idle polling before a waiter sleeps */
    uint64_t nap_max_ns;      /* TERN_PROGRESS_NAP: the progress thread's longest nap */
    bool yield_idle;          /* more local ranks than cores: give the core away when idle */
    tern_ep_t **eps;          /* [world], created on first use */
    /* the endpoint lookups' own store connection (runtime.c, comm_open);
     * NULL where the context's store is in memory. Used under lock only. */
    tern_store_t *ep_store;
    tern__class_fn handlers[16];
    void *handler_args[16];
    tern_status_t *peer_failed; /* [world]: sticky once a peer is lost */
    unsigned nlost;             /* peers lost so far (under the lock) */
    /* p2p */
    size_t eager_limit;
    size_t coll_eager_limit; /* the same for messages of communicators other than 0 */
    size_t credit_per_peer;
    /* [world] what this rank and each peer agreed (tern__p2p_terms_take, as
     * the endpoint opens; zero until then, which sends by rendezvous, safe
     * whatever the peer expects): both ends of a pair decide alike whether a
     * collective's message goes eager, into an offered buffer or by RTS,
     * whatever each rank's TERN_COLL_EAGER_LIMIT and TERN_COLL_RTR say. */
    struct tern__pair {
        size_t coll_eager; /* the smaller of the two ranks' coll_eager_limit */
        bool rtr;          /* both offer */
        int64_t credit;    /* the peer's credit_per_peer: credits[] starts there */
    } *pair;
    bool terms_told;          /* a peer's differing terms were logged at warn level */
    bool coll_terms_told;     /* a peer's differing collective settings were too */
    int64_t *credits;         /* [world] eager bytes this rank may still send to each peer
                               * (from the peer's own credit_per_peer, as the endpoint opens) */
    size_t *consumed;         /* [world] eager bytes from each peer consumed, not yet returned */
    /* Messages (eager or rendezvous, any cid) numbered per pair of ranks from
     * 1, the number's low bits in the immediate's slot: the profiler links a
     * send to its receive by (sender, receiver, number). */
    uint64_t *sent;           /* [world] the last number sent to each peer */
    uint64_t *arrived;        /* [world] the highest number from each peer */
    size_t unexpected_bytes;
    /* Eager sends a receiver truncated (its NACK), kept for tern_p2p_error:
     * a ring of the oldest TERN_P2P_ERRORS_KEPT, and a count of the rest. */
    tern_p2p_error_t errors[TERN_P2P_ERRORS_KEPT];
    unsigned errors_head, nerrors;
    uint64_t errors_dropped;
    /* The rendezvous messages waiting for their receives: an unexp_t and
     * its key each, held to TERN_UNEXPECTED_MAX bytes too, past which a
     * sender's RTS is refused (FIN with TERN_ERR_NO_RESOURCE). */
    size_t unexpected_hdrs;
    bool hdrs_full_said;      /* the refusal was logged since the queue last had room */
    /* Communicators destroyed (tern__p2p_drop_cid), sorted: what still comes
     * for them (a failed collective's last messages) is dropped on arrival. */
    uint32_t *dead_cids;
    size_t ndead, dead_cap;
    tern_request_t *posted_head, *posted_tail;
    unexp_t *unexp_head, *unexp_tail;
    tern_request_t *rndv_sends; /* sends waiting for their FIN */
    /* Offered receive buffers (p2p.c, TERN__P2P_RTR): on for collectives
     * where the transport revokes keys; sends waiting for their receiver's
     * offer; offers that came before their send. rtr_on: this rank's side
     * (a pair uses them where both ranks have it on: pair[].rtr). */
    bool rtr_on;
    tern_request_t *rtr_waits;
    tern_request_t *rtr_ready, *rtr_ready_tail; /* offered, waiting for the put window */
    size_t *put_bytes;        /* [world] bytes of puts into offered buffers in flight */
    size_t *put_window;       /* [world] the peer's rx_window, from its offers */
    tern_request_t *get_waits, *get_waits_tail; /* matched, waiting for the read window */
    size_t *get_bytes;        /* [world] bytes of rendezvous reads in flight from each peer */
    struct rtr *rtrs;
    unsigned nrtrs;
    uint64_t next_id;
    tern_request_t *req_cache; /* free requests for reuse (p2p.c) */
    unsigned req_cached;
    struct bounce *bounce_cache; /* free small bounce buffers for reuse (p2p.c) */
    unsigned bounce_cached;
    /* Collectives sit above p2p and hook in here (a call upward would be an
     * undefined symbol for p2p's own tests). coll_active counts collectives in
     * flight; while it is nonzero every request completion sets coll_kick, and
     * whoever progresses the transport then runs coll_progress to move them
     * on: with locked, the caller holds the lock and hands it over (it comes
     * back released); else the lock is not held. coll_free releases a
     * finished REQ_COLL request (lock held); coll_fini runs before p2p's own
     * teardown. */
    void *coll_state;
    atomic_uint coll_active;
    atomic_bool coll_kick;
    /* Installed (release, under the lock) while the progress thread may
     * read it outside the lock (acquire), like rpc_poll below. */
    _Atomic(tern__coll_progress_fn) coll_progress;
    void (*coll_free)(tern_request_t *req);
    void (*coll_fini)(tern__comm_t *comm);
    /* RPC (rpc/) hooks in the same way. rpc_timers counts calls with a
     * deadline: while nonzero the progress thread wakes often enough to run
     * rpc_poll (lock NOT held), which fails the late ones. rpc_peer_lost runs
     * (lock held) when a peer is lost; rpc_fini before p2p's teardown. */
    void *rpc_state;
    atomic_uint rpc_timers;
    _Atomic(tern__rpc_poll_fn) rpc_poll;
    void (*rpc_peer_lost)(tern__comm_t *comm, int peer);
    void (*rpc_fini)(tern__comm_t *comm);
};

/* The comm of a context (after tern_init). */
tern__comm_t *tern__comm(tern_ctx_t *ctx);

/* A step of a small message's path, inlined into its caller whatever the
 * compiler's size heuristics say: on shared memory the calls themselves
 * (prologues, epilogues, argument moves) were a fifth of tern's instructions
 * per message (docs/perf.md). */
#define TERN__HOT static inline __attribute__((always_inline))

/* comm->lock, through these only. */
static inline bool tern__comm_trylock(tern__comm_t *comm)
{
    return tern__lock_try(&comm->lock);
}
static inline void tern__comm_unlock(tern__comm_t *comm)
{
    tern__lock_give(&comm->lock);
}

/* Take comm->lock (every user of it but the wait loop, which holds it across
 * idle polls: a thread that finds it taken says so, and the waiter lets go
 * within one poll). */
static inline void tern__comm_lock(tern__comm_t *comm)
{
    if (tern__comm_trylock(comm))
        return;
    atomic_fetch_add_explicit(&comm->lock_wanted, 1, memory_order_relaxed);
    tern__lock_take(&comm->lock);
    atomic_fetch_sub_explicit(&comm->lock_wanted, 1, memory_order_relaxed);
}

/* Work posted that the caller need not wait on at once (a non-blocking p2p
 * call, collective or RPC request): should the progress thread be in one of
 * its longer naps (runtime.c, progress_main), wake it, since the caller may
 * now go off and compute while that work needs moving. Only the first post
 * of a nap pays the wake-up; the rest find the flag down. */
void tern__comm_wake_progress(tern__comm_t *comm);
static inline void tern__comm_kick(tern__comm_t *comm)
{
    if (atomic_load_explicit(&comm->nap_long, memory_order_relaxed) &&
        atomic_exchange_explicit(&comm->nap_long, false, memory_order_relaxed))
        tern__comm_wake_progress(comm);
}

/* The endpoint to rank r, created (address from the store) on first use.
 * Called with the lock held. The first time it makes a round trip to the
 * store on a connection of its own, which no user call holds; the address is
 * there already (published before the init barrier), so it does not wait for
 * it. A failed lookup (the store lost) is an error returned at once. */
tern_status_t tern__comm_ep_open(tern__comm_t *comm, int r, tern_ep_t **ep);
static inline tern_status_t tern__comm_ep(tern__comm_t *comm, int r, tern_ep_t **ep)
{
    /* On every message's path: the common case without a call. */
    if ((unsigned)r < comm->world && comm->eps[r] != NULL && comm->peer_failed[r] == TERN_OK) {
        *ep = comm->eps[r];
        return TERN_OK;
    }
    return tern__comm_ep_open(comm, r, ep);
}

/* Route events of an immediate class to fn. */
void tern__comm_set_handler(tern__comm_t *comm, tern_imm_class_t cls, tern__class_fn fn, void *arg);

/* Return a request nobody names any more to the cache (lock held). */
void tern__req_free(tern__comm_t *comm, tern_request_t *req);

/* A completed request's message on its profiled op: its number, and for a
 * receive the rank it came from (any source: the one that sent it). */
static inline void tern__req_prof_stamp(const tern_request_t *req, tern__prof_op_t *op)
{
    op->seq = req->seq;
    if (req->kind == REQ_RECV)
        op->peer = req->info.source;
}

/* A profiled request's event ends (tern__req_complete). */
void tern__req_prof_end(tern_request_t *req);

/* Mark req complete (lock held) and wake its waiter. Inline: every matched
 * small receive ends here. */
static inline void tern__req_complete(tern_request_t *req, tern_status_t status)
{
    req->status = status;
    if (req->seq_out != NULL)
        *req->seq_out = req->seq;
    if (req->prof.name != NULL) /* filed before done, as RPCs are */
        tern__req_prof_end(req);
    atomic_store_explicit(&req->done, 1, memory_order_release);
    if (atomic_load_explicit(&req->comm->coll_active, memory_order_relaxed) != 0)
        atomic_store_explicit(&req->comm->coll_kick, true, memory_order_relaxed);
}

/* Release an internal request the caller will not wait on through
 * tern_request_wait (lock held): returns its status and info, and frees it
 * once no transport operation names it. */
tern_status_t tern__req_release(tern__comm_t *comm, tern_request_t *req, tern_msg_info_t *info);

/*
 * Progress the transport until *done is set or timeout_ns (< 0: never) has
 * passed, as tern_request_wait() does; returns whether *done was set. When
 * the caller is one of the context pool's workers, an idle wait runs queued
 * pool tasks (tern__pool_run_one), so a handler waiting on work queued behind
 * it does not deadlock the pool.
 */
bool tern__comm_wait(tern__comm_t *comm, atomic_int *done, int64_t timeout_ns);
/* tern_request_wait entered with comm->lock held (just posted); returns with
 * it released. */
tern_status_t tern__request_wait_locked(tern_request_t *req, int64_t timeout_ns,
                                        tern_msg_info_t *info);

/* Run the collectives' progress hook if a completion asked for it (lock NOT
 * held); check_time also lets them look at their deadlines. */
void tern__comm_coll_poll(tern__comm_t *comm, bool check_time);
/* The same from a holder of the lock, which it lets go either way: a waiter
 * whose progress just completed a collective's receive moves the collective
 * on in the same hold. */
void tern__comm_coll_poll_locked(tern__comm_t *comm, bool check_time);

/* p2p.c: the protocol */
tern_status_t tern__p2p_init(tern__comm_t *comm);
void tern__p2p_fini(tern__comm_t *comm);
/* This rank's terms, as published after its transport address (TERN__TERMS_LEN
 * bytes), and a peer's, taken as its endpoint opens: what the pair agrees
 * (comm->pair) and the credit the peer gives us. */
#define TERN__TERMS_LEN 48
void tern__p2p_terms_pack(const tern__comm_t *comm, uint8_t *out);
tern_status_t tern__p2p_terms_take(tern__comm_t *comm, int r, const uint8_t *terms);
/* Free the recycled requests and bounce buffers: after the transport is
 * closed, whose last callbacks may still return some. */
void tern__p2p_free_caches(tern__comm_t *comm);
void tern__p2p_peer_lost(tern__comm_t *comm, int peer, tern_status_t why);

/* Send the profiler's clock PING (seq) to dst; its PONG goes to
 * tern__prof_clock_pong. Takes the lock. */
tern_status_t tern__p2p_ping(tern__comm_t *comm, int dst, uint64_t seq);
tern_status_t tern__p2p_isend(tern__comm_t *comm, uint32_t cid, const void *buf, size_t len,
                              int dst, int tag, tern_request_t **req);
tern_status_t tern__p2p_irecv(tern__comm_t *comm, uint32_t cid, void *buf, size_t cap, int src,
                              int tag, unsigned flags, tern_request_t **req);
/* The peer posts the other end of this message with the flag too, and
 * names no wildcard: a receive above the collectives' eager limit offers its
 * buffer as it is posted, and the send writes into it (p2p.c). */
#define TERN__P2P_RTR 1u
/* A send's put goes the tern_op_way_t way in these two bits, where the
 * transport takes a way (attr.put_way_min); TERN_WAY_AUTO (0): its own
 * choice. */
#define TERN__P2P_WAY_SHIFT 2
#define TERN__P2P_WAY(way) ((unsigned)(way) << TERN__P2P_WAY_SHIFT)
#define TERN__P2P_WAY_OF(flags) (((flags) >> TERN__P2P_WAY_SHIFT) & 3u)
/* A receive into a tensor: only a message of exactly its capacity fills it;
 * a shorter one completes it with TERN_ERR_MISMATCH (tern__p2p_short). */
#define TERN__P2P_EXACT 2u
/* The same with the lock held (req not NULL): a collective posts a run of
 * them, and reaps what completed, in one hold of the lock. flags:
 * TERN__P2P_RTR or 0, and for a send TERN__P2P_WAY(way). shape: the
 * call's signature (0: none); a message whose two ends carry different ones
 * fails with TERN_ERR_MISMATCH (a rendezvous at both ends, an eager message
 * at the receiver). */
tern_status_t tern__p2p_isend_locked(tern__comm_t *comm, uint32_t cid, const void *buf,
                                     size_t len, int dst, int tag, unsigned flags, uint32_t shape,
                                     tern_request_t **req);
tern_status_t tern__p2p_irecv_locked(tern__comm_t *comm, uint32_t cid, void *buf, size_t cap,
                                     int src, int tag, unsigned flags, uint32_t shape,
                                     tern_request_t **req);
/* The send of tern__p2p_isend_locked where it would complete as it is
 * posted, with no request: a message under the eager limit that the peer's
 * credit admits goes out and *sent is true. Otherwise nothing is sent and
 * *sent is false (post the request). Errors as tern__p2p_isend_locked's. */
tern_status_t tern__p2p_send_eager_locked(tern__comm_t *comm, uint32_t cid, const void *buf,
                                          size_t len, int dst, int tag, uint32_t shape,
                                          bool *sent);
/* Sends that waited RTR_WAIT_NS for their receiver's offer go by the
 * sender's offer instead (lock held): a receiver expecting fewer bytes, or
 * one whose offer was refused, then hears of the send all the same. */
void tern__p2p_rtr_tick(tern__comm_t *comm, uint64_t now);
/* Withdraw an incomplete request (lock held): a posted receive leaves the
 * posted list, a rendezvous send stops offering its buffer (a later read by
 * the peer fails on the dead key); either completes with TERN_ERR_CANCELED.
 * Returns false if it cannot be withdrawn (a receive whose data is being
 * read): it will complete by itself. */
bool tern__p2p_cancel(tern__comm_t *comm, tern_request_t *req);
/* A communicator is gone (a group destroyed; takes the lock): the messages
 * queued for it and the offers kept for it are dropped, eager bytes credited
 * back and rendezvous senders told (FIN, TERN_ERR_CANCELED), and so is what
 * comes for it later. Only a failed call leaves any. */
void tern__p2p_drop_cid(tern__comm_t *comm, uint32_t cid);
/* The error of a tensor's receive (cap bytes) that got a shorter message
 * (got): TERN_ERR_MISMATCH, recorded with both sizes. */
tern_status_t tern__p2p_short(size_t cap, const tern_msg_info_t *got);

#endif
