/*
 * tern_init / tern_finalize and the machinery under every request: the
 * transport, endpoints made on first use, one progress thread, and waiting.
 *
 * Progress. One mutex guards the transport and the p2p state. A thread that
 * waits on a request first progresses the transport itself, while things
 * move and for a short spin after (the lowest latency: no hand-off between
 * threads); while it does, the progress thread stays asleep so the two do
 * not fight over the cores. After the spin (TERN_POLL=blocking) the waiter
 * sleeps on the transport's fd, and the progress thread, idle, does too:
 * whichever wakes first progresses. With TERN_POLL=busy neither sleeps on
 * the fd.
 */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tern/clock.h>
#include <tern/context.h>
#include <tern/p2p.h>

#include "core/context.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "core/topology.h"
#include "p2p/comm.h"
#include "prof/prof.h"

/* How long the progress thread naps while waiters are (or just were) active:
 * in a loop of blocking calls the next wait starts within microseconds, and
 * waking the progress thread in between costs a core. Each nap in a row that
 * a waiter kept busy is twice the last, up to TERN_PROGRESS_NAP (8 ms): where
 * ranks fill the cores, every nap's end takes a core from a spinning rank for
 * a few microseconds, and at 1 ms apiece that was the p99 of a tcp ping-pong
 * (20-26 us against 9-13; docs/p2p.md). A post that may need background
 * progress cuts a long nap short (tern__comm_kick). */
#define NAP_NS (1000 * 1000)
/* How long the progress thread keeps polling after its last event before it
 * sleeps on the transport's fd. */
#define PROGRESS_SPIN_NS (100 * 1000)
/* Idle polls between two looks at the clock while waiting: reading it costs
 * 20-40 ns here, more than an idle poll of shared memory. */
#define POLLS_PER_CLOCK 32
/* Idle polls a waiter makes without letting go of the lock (wait_loop). */
#define HOLD_POLLS 32
/* Idle polls of the progress thread between two looks at the store it serves
 * (rank 0). */
#define STORE_POLLS 64

tern__comm_t *tern__comm(tern_ctx_t *ctx)
{
    return ctx ? tern__ctx_comm(ctx) : NULL;
}

static void on_event(const tern_event_t *ev, void *arg)
{
    tern__comm_t *comm = arg;
    /* Lost, unreachable (a first connection refused: its process is gone),
     * or closed on purpose (its tern_finalize: no warning): either way
     * nothing more comes from it, and what waits on it fails as lost. */
    if (ev->type == TERN_EVENT_ERROR &&
        (ev->status == TERN_ERR_PEER_LOST || ev->status == TERN_ERR_CLOSED ||
         ev->status == TERN_ERR_UNREACHABLE)) {
        if (ev->src < comm->world && comm->peer_failed[ev->src] == TERN_OK) {
            if (ev->status == TERN_ERR_CLOSED)
                tern_info("rank %u closed its connection to this one (tern_finalize)", ev->src);
            else
                tern_warn("lost rank %u (%s)", ev->src, tern_strerror(ev->status));
            comm->peer_failed[ev->src] = TERN_ERR_PEER_LOST;
            comm->nlost++;
            tern__p2p_peer_lost(comm, (int)ev->src, TERN_ERR_PEER_LOST);
            tern__prof_peer_lost((int)ev->src);
            if (comm->rpc_peer_lost != NULL)
                comm->rpc_peer_lost(comm, (int)ev->src);
        }
        return;
    }
    unsigned cls = tern_imm_class(ev->imm);
    if (cls < 16 && comm->handlers[cls] != NULL) {
        comm->handlers[cls](comm, ev, comm->handler_args[cls]);
        return;
    }
    if (ev->type == TERN_EVENT_ERROR)
        tern_warn("transport error from rank %u: %s", ev->src, tern_strerror(ev->status));
    else
        tern_warn("dropped a message of unknown class %u from rank %u", cls, ev->src);
}

void tern__comm_set_handler(tern__comm_t *comm, tern_imm_class_t cls, tern__class_fn fn, void *arg)
{
    comm->handlers[cls] = fn;
    comm->handler_args[cls] = arg;
}

static void addr_key(char *key, size_t size, int r)
{
    snprintf(key, size, "tern/transport/%d", r);
}

tern_status_t tern__comm_ep_open(tern__comm_t *comm, int r, tern_ep_t **ep)
{
    char key[64], detail[TERN__ERROR_MAX];
    void *addr = NULL;
    size_t len = 0;
    tern_status_t st;

    if (r < 0 || (unsigned)r >= comm->world)
        return tern__error(TERN_ERR_INVALID_PARAM, "rank %d is not in the world of %u", r, comm->world);
    if (comm->peer_failed[r] != TERN_OK)
        return tern__error(comm->peer_failed[r], "rank %d was lost", r);
    if (comm->eps[r] != NULL) {
        *ep = comm->eps[r];
        return TERN_OK;
    }
    /* Our own connection (see comm_open), so the lookup never waits for a
     * user's store call. And no wait for the key: every rank published its
     * address before the init barrier, and whoever we send or answer to has
     * passed it. A lookup that fails says so at once; the caller (maybe the
     * progress thread, answering a peer) reports it and goes on. */
    addr_key(key, sizeof(key), r);
    st = tern_store_get(comm->ep_store != NULL ? comm->ep_store : tern_ctx_store(comm->ctx), key,
                        &addr, &len, 0);
    if (st != TERN_OK) {
        snprintf(detail, sizeof(detail), "%s", tern_last_error());
        return tern__error(st, "no endpoint to rank %d: its address: %s", r, detail);
    }
    /* The transport's address, then the rank's p2p terms (comm_open). */
    if (len < TERN__TERMS_LEN)
        st = tern__error(TERN_ERR_PROTOCOL, "rank %d's address is %zu bytes: too short for "
                         "its p2p terms (is every rank the same tern build?)", r, len);
    else
        st = tern__p2p_terms_take(comm, r, (const uint8_t *)addr + len - TERN__TERMS_LEN);
    if (st == TERN_OK)
        st = tern_ep_create(comm->tp, (uint32_t)r, addr, len - TERN__TERMS_LEN, &comm->eps[r]);
    free(addr);
    if (st == TERN_OK)
        *ep = comm->eps[r];
    return st;
}

void tern__req_prof_end(tern_request_t *req)
{
    tern__req_prof_stamp(req, &req->prof);
    tern__prof_op_end(&req->prof, tern__req_bytes(req), NULL, 0);
}

void tern__comm_coll_poll(tern__comm_t *comm, bool check_time)
{
    if (atomic_load_explicit(&comm->coll_active, memory_order_relaxed) == 0)
        return;
    bool kicked = atomic_exchange_explicit(&comm->coll_kick, false, memory_order_acq_rel);
    tern__coll_progress_fn fn = atomic_load_explicit(&comm->coll_progress, memory_order_acquire);
    if ((kicked || check_time) && fn != NULL)
        fn(comm, check_time, false);
}

void tern__comm_coll_poll_locked(tern__comm_t *comm, bool check_time)
{
    tern__coll_progress_fn fn = atomic_load_explicit(&comm->coll_progress, memory_order_acquire);
    if (atomic_load_explicit(&comm->coll_active, memory_order_relaxed) != 0 && fn != NULL &&
        (atomic_exchange_explicit(&comm->coll_kick, false, memory_order_acq_rel) || check_time)) {
        fn(comm, check_time, true);
        return;
    }
    tern__comm_unlock(comm);
}

/* ---- progress ---- */

static void *progress_main(void *arg)
{
    tern__comm_t *comm = arg;
    int fd = tern_transport_fd(comm->tp);
    unsigned seen_waits = atomic_load(&comm->waits);

    uint64_t last_event = 0;
    unsigned idle_polls = 0;
    int store_fd = comm->store_fd;
    tern__log_set_rank((int)comm->rank);
    while (!atomic_load(&comm->stop)) {
        /* A waiter was progressing during the last nap (its heartbeat moved):
         * stay out of its way, and off comm->lock, which a waiter polls
         * under (the naps are on a lock of their own: waking on comm->lock
         * made the waiter pay a futex wake-up every nap). */
        const uint64_t first = comm->nap_max_ns < NAP_NS ? comm->nap_max_ns : NAP_NS;
        for (uint64_t nap = first;;) {
            unsigned waits = atomic_load_explicit(&comm->waits, memory_order_relaxed);
            if (atomic_load(&comm->stop) || waits == seen_waits)
                break;
            seen_waits = waits;
            struct timespec ts = tern__clock_realtime_after(nap);
            pthread_mutex_lock(&comm->idle_lock);
            /* Raised under idle_lock, before the wait lets it go: a poster
             * that lowers it signals under the same lock, so its wake-up
             * cannot come before this thread waits. */
            atomic_store_explicit(&comm->nap_long, nap > first, memory_order_relaxed);
            if (!atomic_load(&comm->stop))
                pthread_cond_timedwait(&comm->idle_cv, &comm->idle_lock, &ts);
            bool kicked = nap > first &&
                          !atomic_exchange_explicit(&comm->nap_long, false, memory_order_relaxed);
            pthread_mutex_unlock(&comm->idle_lock);
            if (comm->store_server != NULL)
                tern__store_server_serve(comm->store_server);
            nap = kicked ? first : nap < comm->nap_max_ns / 2 ? 2 * nap : comm->nap_max_ns;
        }
        if (atomic_load(&comm->stop))
            break;
        tern__comm_lock(comm);
        int n = tern_transport_progress(comm->tp);
        bool may_sleep = n == 0 && !comm->busy_poll && fd >= 0 &&
                         !atomic_load(&comm->coll_kick) && tern_transport_arm(comm->tp) == TERN_OK;
        tern__comm_unlock(comm);
        /* Collectives in flight move on here when nobody waits on them; the
         * clock check lets a stalled one time out. */
        tern__comm_coll_poll(comm, n == 0);
        bool timers = atomic_load_explicit(&comm->rpc_timers, memory_order_relaxed) != 0;
        if (n == 0 && timers) {
            tern__rpc_poll_fn poll_fn = atomic_load_explicit(&comm->rpc_poll, memory_order_acquire);
            if (poll_fn != NULL)
                poll_fn(comm);
        }
        if (n > 0) {
            last_event = tern_clock_ns();
            continue;
        }
        /* Right after traffic, keep polling a while before sleeping: the
         * next request of a caller in a loop (an RPC server's usual load)
         * then arrives without a wake-up from the kernel. */
        if (may_sleep && tern_clock_ns() - last_event < PROGRESS_SPIN_NS)
            may_sleep = false;
        if (!may_sleep) {
            /* The store waits far less often than the transport: look at it
             * now and then, not on every idle poll. */
            if (comm->store_server != NULL && ++idle_polls % STORE_POLLS == 0)
                tern__store_server_serve(comm->store_server);
            sched_yield();
            continue;
        }
        /* Wake at least every 100 ms to notice stop (and the store's parked
         * requests' deadlines). */
        struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = store_fd, .events = POLLIN}};
        poll(p, store_fd >= 0 ? 2 : 1, atomic_load(&comm->coll_active) != 0 || timers ? 10 : 100);
        if (comm->store_server != NULL)
            tern__store_server_serve(comm->store_server);
    }
    return NULL;
}

/* Wake the progress thread from a nap (the only thread on idle_cv). */
void tern__comm_wake_progress(tern__comm_t *comm)
{
    pthread_mutex_lock(&comm->idle_lock);
    pthread_cond_signal(&comm->idle_cv);
    pthread_mutex_unlock(&comm->idle_lock);
}

/* ---- init / finalize ---- */

static void comm_free(tern__comm_t *comm)
{
    if (comm == NULL)
        return;
    if (comm->thread_started) {
        atomic_store(&comm->stop, true);
        tern__comm_wake_progress(comm);
        pthread_join(comm->thread, NULL);
    }
    if (comm->coll_fini != NULL)
        comm->coll_fini(comm);
    tern__p2p_fini(comm);
    for (unsigned r = 0; comm->eps != NULL && r < comm->world; r++)
        tern_ep_destroy(comm->eps[r]);
    tern_transport_close(comm->tp);
    /* Before the context leaves the store (and rank 0 stops serving it). */
    tern_store_close(comm->ep_store);
    tern__p2p_free_caches(comm);
    pthread_cond_destroy(&comm->idle_cv);
    pthread_mutex_destroy(&comm->idle_lock);
    free(comm->eps);
    free(comm->peer_failed);
    free(comm);
}

static tern_status_t comm_open(tern_ctx_t *ctx)
{
    const tern__config_t *cfg = tern__ctx_config(ctx);
    tern__comm_t *comm = calloc(1, sizeof(*comm));
    tern_status_t st;
    char key[64];
    uint8_t addr[TERN_ADDR_MAX + TERN__TERMS_LEN];
    size_t alen = TERN_ADDR_MAX;

    if (comm == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "tern_init: no memory");
    comm->ctx = ctx;
    comm->rank = tern_ctx_rank(ctx);
    tern__prof_set_rank((int)comm->rank);
    comm->world = tern_ctx_world_size(ctx);
    comm->busy_poll = cfg->poll == 1;
    comm->spin_ns = (uint64_t)cfg->poll_spin_ns;
    if (cfg->progress_nap_ns <= 0) {
        free(comm);
        return tern__error(TERN_ERR_CONFIG, "TERN_PROGRESS_NAP must be above 0 (a nap of 0 "
                           "would keep the progress thread spinning beside every waiter)");
    }
    comm->nap_max_ns = (uint64_t)cfg->progress_nap_ns;
    /* Oversubscribed (more ranks here than cores we may run on), a waiter
     * that spins holds the core the rank it waits for needs: yield on every
     * idle poll, as Open MPI's mpi_yield_when_idle does. */
    cpu_set_t cpus;
    if (sched_getaffinity(0, sizeof(cpus), &cpus) == 0)
        comm->yield_idle = tern_ctx_local_world_size(ctx) > (unsigned)CPU_COUNT(&cpus);
    atomic_init(&comm->lock.v, 0);
    pthread_cond_init(&comm->idle_cv, NULL);
    pthread_mutex_init(&comm->idle_lock, NULL);
    comm->eps = calloc(comm->world, sizeof(*comm->eps));
    comm->peer_failed = calloc(comm->world, sizeof(*comm->peer_failed));
    if (comm->eps == NULL || comm->peer_failed == NULL) {
        st = tern__error(TERN_ERR_NO_MEMORY, "tern_init: no memory");
        goto fail;
    }
    /* The master's address tells the tcp provider which interface the other
     * ranks reach us on. */
    tern_transport_params_t tp = {
        .field_mask = TERN_TRANSPORT_PARAM_SELF_ID | TERN_TRANSPORT_PARAM_EVENT |
                      TERN_TRANSPORT_PARAM_PEER_HINT,
        .self_id = comm->rank,
        .on_event = on_event,
        .event_arg = comm,
        .peer_hint = cfg->tern_master_addr[0] ? cfg->tern_master_addr : cfg->master_addr,
    };
    if ((st = tern_transport_open(&tp, &comm->tp)) != TERN_OK)
        goto fail;
    tern_transport_query(comm->tp, &comm->attr);
    if ((st = tern__p2p_init(comm)) != TERN_OK)
        goto fail;
    if ((st = tern_transport_address(comm->tp, addr, &alen)) != TERN_OK)
        goto fail;
    /* The terms a peer needs before its first message to us (p2p.c). */
    tern__p2p_terms_pack(comm, addr + alen);
    alen += TERN__TERMS_LEN;
    addr_key(key, sizeof(key), (int)comm->rank);
    if ((st = tern_store_set(tern_ctx_store(ctx), key, addr, alen)) != TERN_OK)
        goto fail;
    /*
     * Endpoints are made on first use, under the lock, and often by the
     * progress thread answering a peer that wrote first (a PONG, a CREDIT,
     * a rendezvous read). Their address lookups get a store connection of
     * their own: on the context's, they would queue behind whatever a user
     * thread is waiting for there (a get, a wait, a barrier), with the
     * transport stalled under the lock meanwhile, and that wait may itself
     * need the answer. Opened now, while rank 0's server still has its own
     * thread to answer the hello. Only the lock's holder uses it.
     */
    if ((st = tern__store_connect_aux(tern_ctx_store(ctx), &comm->ep_store)) != TERN_OK)
        goto fail;
    /* Rank 0's store is served from here on by the progress thread, and by
     * its own store calls while they wait (the lookups' ones too): no thread
     * of its own. */
    comm->store_fd = -1;
    comm->store_server = tern__ctx_take_store_server(ctx, &comm->store_fd);
    tern__store_assist(comm->ep_store, comm->store_server);
    int rc = pthread_create(&comm->thread, NULL, progress_main, comm);
    if (rc != 0) {
        st = tern__error_errno(TERN_ERR_NO_RESOURCE, rc, "tern_init: cannot start the progress thread");
        goto fail;
    }
    comm->thread_started = true;
    tern__ctx_set_comm(ctx, comm);
    return TERN_OK;
fail:
    comm_free(comm);
    return st;
}

tern_status_t tern_init(const tern_init_params_t *params, tern_ctx_t **ctx_out)
{
    tern_ctx_t *ctx = NULL;
    tern_status_t st;
    char detail[TERN__ERROR_MAX];

    if ((st = tern__ctx_bootstrap(params, &ctx)) != TERN_OK)
        goto fail;
    if ((st = comm_open(ctx)) != TERN_OK)
        goto fail;
    /* No rank returns before every rank's address is in the store. */
    if ((st = tern_store_barrier(tern_ctx_store(ctx), "tern/init", tern_ctx_world_size(ctx),
                                 tern__ctx_timeout(ctx))) != TERN_OK)
        goto fail;
    *ctx_out = ctx;
    return TERN_OK;
fail:
    snprintf(detail, sizeof(detail), "%s", tern_last_error());
    tern_error("tern_init failed: %s (%s)", detail, tern_strerror(st));
    if (ctx != NULL) {
        comm_free(tern__comm(ctx));
        tern__ctx_teardown(ctx, false);
    }
    if (ctx_out != NULL)
        *ctx_out = NULL;
    tern__error(st, "%s", detail);
    return st;
}

tern_status_t tern_finalize(tern_ctx_t *ctx)
{
    tern_status_t st, st2;
    if (ctx == NULL)
        return TERN_OK;
    /* RPC left running is shut down here (not gracefully): its handlers must
     * be gone before the pool is. */
    tern__comm_t *comm = tern__comm(ctx);
    if (comm != NULL && comm->rpc_fini != NULL)
        comm->rpc_fini(comm);
    /* Before the barrier: stopping measures the other ranks' clocks. */
    tern__prof_ctx_finalize(ctx);
    /* Meet first: once every rank is here nobody sends any more, so closing
     * the transport loses nothing in flight. */
    st = tern_store_barrier(tern_ctx_store(ctx), "tern/finalize", tern_ctx_world_size(ctx),
                            tern__ctx_timeout(ctx));
    comm_free(comm);
    st2 = tern__ctx_teardown(ctx, true);
    return st != TERN_OK ? st : st2;
}

tern_status_t tern_ctx_transport(const tern_ctx_t *ctx, char *provider, size_t plen, char *device,
                                 size_t dlen)
{
    tern__comm_t *comm = ctx ? tern__ctx_comm(ctx) : NULL;
    if (comm == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_ctx_transport: no context");
    if (provider != NULL && plen > 0)
        snprintf(provider, plen, "%s", comm->attr.provider);
    if (device != NULL && dlen > 0)
        snprintf(device, dlen, "%s", comm->attr.device);
    return TERN_OK;
}

/* One progress call, for callers that poll rather than wait; skipped while
 * another thread holds the lock, as that one is progressing. */
static void progress_once(tern__comm_t *comm)
{
    if (tern__comm_trylock(comm)) {
        tern_transport_progress(comm->tp);
        tern__comm_unlock(comm);
    }
}

tern_status_t tern_p2p_error(tern_ctx_t *ctx, tern_p2p_error_t *err)
{
    tern__comm_t *comm = ctx ? tern__ctx_comm(ctx) : NULL;
    tern_status_t st = TERN_ERR_NOT_FOUND;
    if (comm == NULL || err == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_p2p_error: %s",
                           err == NULL ? "NULL argument" : "no context");
    progress_once(comm);
    tern__comm_lock(comm);
    if (comm->nerrors > 0) {
        *err = comm->errors[comm->errors_head];
        err->dropped = comm->errors_dropped;
        comm->errors_head = (comm->errors_head + 1) % TERN_P2P_ERRORS_KEPT;
        comm->nerrors--;
        st = TERN_OK;
    }
    tern__comm_unlock(comm);
    return st;
}

/* ---- waiting ---- */

tern_status_t tern__req_release(tern__comm_t *comm, tern_request_t *req, tern_msg_info_t *info)
{
    tern_status_t st = req->status;
    if (info != NULL)
        *info = req->info;
    req->released = true;
    if (req->ops == 0)
        tern__req_free(comm, req);
    return st;
}

/*
 * Hand a completed request's outcome to the user and release it (lock held).
 * A transport operation may still name it (one that failed early when its
 * peer was lost): then the protocol frees it when that operation ends.
 */
TERN__HOT tern_status_t req_finish(tern__comm_t *comm, tern_request_t *req, tern_msg_info_t *info)
{
    tern_status_t st = req->status;
    req_kind_t kind = req->kind;
    tern_msg_info_t got = req->info;
    if (info != NULL)
        *info = got;
    if (kind == REQ_COLL) {
        /* The collective set the detail when it failed; keep it. */
        comm->coll_free(req);
        return st;
    }
    bool exact = req->exact;
    size_t cap = req->len;
    int peer = req->peer;
    req->released = true;
    if (req->ops == 0)
        tern__req_free(comm, req);
    if (st == TERN_ERR_NO_RESOURCE && kind == REQ_SEND)
        tern__error(st, "send refused by rank %d: too many messages wait there for their "
                    "receives (its TERN_UNEXPECTED_MAX)", peer);
    else if (st != TERN_OK)
        tern__error(st, "%s %s (rank %d, tag %d, %zu bytes)", kind == REQ_SEND ? "send" : "receive",
                    tern_strerror(st), got.source, got.tag, got.len);
    else if (exact && got.len != cap)
        st = tern__p2p_short(cap, &got);
    return st;
}

tern_status_t tern_request_test(tern_request_t *req, int *done, tern_msg_info_t *info)
{
    tern__comm_t *comm;
    if (req == NULL || done == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_request_test: NULL argument");
    comm = req->comm;
    if (!atomic_load_explicit(&req->done, memory_order_acquire)) {
        progress_once(comm);
        tern__comm_coll_poll(comm, req->kind == REQ_COLL);
        if (!atomic_load_explicit(&req->done, memory_order_acquire)) {
            *done = 0;
            return TERN_OK;
        }
    }
    tern__comm_lock(comm);
    tern_status_t st = TERN_OK;
    *done = atomic_load_explicit(&req->done, memory_order_acquire);
    if (*done)
        st = req_finish(comm, req, info);
    tern__comm_unlock(comm);
    return st;
}

typedef enum wait_end { WAIT_DONE, WAIT_DONE_LOCKED, WAIT_TIMED_OUT } wait_end_t;

/* A waiter's heartbeat, which keeps the progress thread napping: as a wait
 * starts, on every poll that progressed, every POLLS_PER_CLOCK idle polls,
 * and as it ends. A plain store, not an atomic add: a locked instruction on
 * the way out of every wait cost a shared-memory message about 10 ns, and
 * the progress thread only asks whether the count moved, which two waiters
 * racing on it still make it do.
 * A waiter asleep on the fd beats only as it wakes: the progress thread then
 * polls the fd too, and whichever wakes first progresses. */
static inline void waiter_beat(tern__comm_t *comm)
{
    unsigned w = atomic_load_explicit(&comm->waits, memory_order_relaxed);
    atomic_store_explicit(&comm->waits, w + 1, memory_order_relaxed);
}

/*
 * The waiter drives progress itself, and the progress thread keeps out of the
 * way: no hand-off between threads on the path of a reply. It spins until
 * TERN_POLL_SPIN passes without progress; then (TERN_POLL=blocking) it sleeps on the
 * transport's fd, so the kernel wakes it when something arrives. The clock is read only every
 * POLLS_PER_CLOCK idle polls: most waits end before the first look. With
 * keep_lock, a wait that sees *done right after its own progress returns
 * WAIT_DONE_LOCKED with the lock still held (one round less for the caller);
 * with locked, the caller holds the lock already (it just posted what it
 * waits for), which saves another.
 * A pool worker runs queued pool tasks when idle (tern__comm_wait).
 */
static wait_end_t wait_loop(tern__comm_t *comm, atomic_int *done, int64_t timeout_ns,
                            bool keep_lock, bool locked)
{
    int fd = tern_transport_fd(comm->tp);
    tern_pool_t *pool = tern_ctx_pool(comm->ctx);
    bool helper = tern_pool_in_worker(pool);
    uint64_t start = 0, deadline = UINT64_MAX, quiet_since = 0;
    unsigned idle = 0;
    bool moved = false; /* progress since the last look at the clock */
    /* A pool worker has tasks to look at, and an oversubscribed rank gives
     * its core away, between polls. */
    const unsigned hold = helper || comm->yield_idle ? 0 : HOLD_POLLS;
    wait_end_t end = WAIT_DONE;
    waiter_beat(comm);
    while (!atomic_load_explicit(done, memory_order_acquire)) {
        if (!locked && !tern__comm_trylock(comm)) {
            /* Another waiter is progressing; it will complete ours too. A
             * pool worker runs a queued task meanwhile: it may be the very
             * handler ours waits for, and while the other thread polls on
             * (an RPC shutdown waiting for quiet, say) no lock round ever
             * comes free for this one (up to 2 s of stalls seen). */
            if (!(helper && tern__pool_run_one(pool)))
                sched_yield();
            continue;
        }
        locked = false; /* this round's hold is let go (or kept) below */
        int n = tern_transport_progress(comm->tp);
        unsigned polls = 1;
        /* Poll on under the lock while nothing happens: a lock round per
         * poll is a third of an idle poll on shared memory, and whatever
         * arrives is found that much sooner. Let go at once for another
         * thread that wants the lock, or for collectives to move. */
        for (; n == 0 && polls < hold; polls++) {
            if (atomic_load_explicit(done, memory_order_acquire) ||
                atomic_load_explicit(&comm->lock_wanted, memory_order_relaxed) ||
                atomic_load_explicit(&comm->coll_kick, memory_order_relaxed))
                break;
            n = tern_transport_progress(comm->tp);
        }
        if (atomic_load_explicit(done, memory_order_acquire)) {
            if (keep_lock) {
                end = WAIT_DONE_LOCKED; /* finish under this hold of the lock */
                break;
            }
            tern__comm_unlock(comm);
            break;
        }
        if (n > 0) {
            moved = true;
            waiter_beat(comm);
        }
        if (n > 0 || (idle += polls) < POLLS_PER_CLOCK) {
            tern__comm_coll_poll_locked(comm, false);
            if (n == 0 && helper && tern__pool_run_one(pool))
                continue;
            if (n == 0 && comm->yield_idle)
                sched_yield();
            continue;
        }
        idle = 0;
        waiter_beat(comm);
        uint64_t now = tern_clock_ns();
        if (start == 0) {
            start = now;
            if (timeout_ns >= 0)
                deadline = start + (uint64_t)timeout_ns;
        }
        /* The spin is over after TERN_POLL_SPIN without progress, not that
         * long into the wait: a collective's wait streams data for
         * milliseconds with short gaps, and sleeping in each gap once 200 us
         * had passed cost a wake-up per gap (on a VM with steal, tens to
         * hundreds of us each: a 2-rank 4 MiB all_reduce over tcp took 2-4x
         * as long). Why 10 ms and not 200 us of quiet: docs/p2p.md. */
        if (moved || quiet_since == 0)
            quiet_since = now;
        moved = false;
        if (now >= deadline) {
            tern__comm_unlock(comm);
            if (!atomic_load_explicit(done, memory_order_acquire))
                end = WAIT_TIMED_OUT;
            break;
        }
        /* Not done (checked above, and it cannot change while we hold the lock). */
        bool sleep = !comm->busy_poll && fd >= 0 && now - quiet_since > comm->spin_ns && !helper &&
                     tern_transport_arm(comm->tp) == TERN_OK;
        tern__comm_unlock(comm);
        tern__comm_coll_poll(comm, true);
        if (atomic_load_explicit(&comm->rpc_timers, memory_order_relaxed) != 0) {
            tern__rpc_poll_fn poll_fn = atomic_load_explicit(&comm->rpc_poll, memory_order_acquire);
            if (poll_fn != NULL)
                poll_fn(comm);
        }
        if (atomic_load_explicit(done, memory_order_acquire))
            break;
        if (helper && tern__pool_run_one(pool))
            continue;
        if (sleep) {
            uint64_t left = deadline - now;
            struct pollfd p = {.fd = fd, .events = POLLIN};
            /* Short naps: another waiter may complete our request without the
             * fd ever turning readable for us. */
            poll(&p, 1, left < 10000000ull ? (int)(left / 1000000) + 1 : 10);
        } else if (helper) {
            sched_yield();
        }
    }
    if (locked) { /* done before the first round */
        if (keep_lock)
            end = WAIT_DONE_LOCKED;
        else
            tern__comm_unlock(comm);
    }
    /* The progress thread stays asleep for another nap: the next wait in a
     * loop of blocking calls comes within microseconds. No wake-up call,
     * which would cost a context switch. */
    waiter_beat(comm);
    return end;
}

bool tern__comm_wait(tern__comm_t *comm, atomic_int *done, int64_t timeout_ns)
{
    return wait_loop(comm, done, timeout_ns, false, false) != WAIT_TIMED_OUT;
}

TERN__HOT tern_status_t request_wait(tern_request_t *req, int64_t timeout_ns, tern_msg_info_t *info,
                                     bool locked)
{
    tern__comm_t *comm = req->comm;
    int done = 0;
    wait_end_t end = wait_loop(comm, &req->done, timeout_ns, true, locked);
    if (end == WAIT_DONE_LOCKED) {
        tern_status_t st = req_finish(comm, req, info);
        tern__comm_unlock(comm);
        return st;
    }
    if (end == WAIT_TIMED_OUT)
        return tern__error(TERN_ERR_TIMEOUT, "request not complete after %lld ms",
                           (long long)(timeout_ns / 1000000));
    return tern_request_test(req, &done, info);
}

tern_status_t tern_request_wait(tern_request_t *req, int64_t timeout_ns, tern_msg_info_t *info)
{
    int done = 0;
    if (req == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_request_wait: NULL request");
    /* Done already (an eager send): nothing to wait for. */
    if (atomic_load_explicit(&req->done, memory_order_acquire))
        return tern_request_test(req, &done, info);
    return request_wait(req, timeout_ns, info, false);
}

tern_status_t tern__request_wait_locked(tern_request_t *req, int64_t timeout_ns,
                                        tern_msg_info_t *info)
{
    return request_wait(req, timeout_ns, info, true);
}
