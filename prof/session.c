/*
 * Sessions: start and stop, the clock ping-pong, and the results (events on
 * one clock, self times, key_averages tables, chrome traces).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tern/clock.h>
#include <tern/context.h>
#include <tern/prof.h>

#include "core/context.h"
#include "core/error.h"
#include "core/log.h"
#include "p2p/comm.h"
#include "prof/record.h"
#include "prof/session.h"

/* How long one ping may take before the estimate gives up on the peer. */
#define PING_TIMEOUT_NS (2ll * 1000 * 1000 * 1000)

typedef struct peer_clocks {
    tern_prof_clock_t *est; /* oldest first */
    size_t n, cap;
    int64_t last_ns; /* when the last estimate was made (our clock) */
    bool failed;     /* unreachable in this session */
} peer_clocks_t;

/* Everything of the current or last session; start, stop and the result
 * functions are called from one thread at a time (prof.h). */
static struct {
    pthread_mutex_t lock; /* guards running, clocks (first contacts come from any thread) */
    bool running;
    tern_ctx_t *ctx;
    int rank, world;
    unsigned flags;
    int64_t refresh_ns;
    unsigned samples;
    int64_t t_start, t_stop;
    tern__prof_cal_t cal_start, cal_stop; /* of the ticks in session buffers */
    peer_clocks_t *clocks; /* [world] */
    /* results */
    tern_prof_event_t *events;
    size_t nevents;
    char *strings; /* one allocation for every name and shapes string */
    tern_prof_clock_t *used; /* the last estimate of each remote node */
    size_t nused;
    uint64_t dropped;
    bool job; /* the results are the job's, gathered here (job.c) */
} S = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* One estimate at a time per process: there is one ping slot. */
static pthread_mutex_t est_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_uint_fast64_t ping_seq;

/* ---- clocks ---- */

static tern_status_t estimate(tern__comm_t *comm, int peer, unsigned samples, tern_prof_clock_t *out)
{
    tern_prof_clock_t c = {.peer = peer, .min_rtt_ns = INT64_MAX};
    tern_status_t st = TERN_OK;
    if (peer == (int)comm->rank) {
        *out = (tern_prof_clock_t){.peer = peer, .samples = samples, .at_ns = tern_prof_clock_ns()};
        return TERN_OK;
    }
    pthread_mutex_lock(&est_lock);
    for (unsigned i = 0; i < samples; i++) {
        uint64_t seq = atomic_fetch_add(&ping_seq, 1) + 1;
        atomic_store(&tern__prof_ping.done, 0);
        atomic_store(&tern__prof_ping.peer, peer);
        atomic_store(&tern__prof_ping.seq, seq);
        int64_t t_send = tern_prof_clock_ns();
        if ((st = tern__p2p_ping(comm, peer, seq)) != TERN_OK)
            break;
        if (!tern__comm_wait(comm, &tern__prof_ping.done, PING_TIMEOUT_NS)) {
            st = tern__error(TERN_ERR_TIMEOUT, "prof: rank %d did not answer a clock ping in %lld ms",
                             peer, (long long)(PING_TIMEOUT_NS / 1000000));
            break;
        }
        if (atomic_load(&tern__prof_ping.done) < 0) {
            st = tern__error(TERN_ERR_PEER_LOST, "prof: rank %d was lost during a clock ping", peer);
            break;
        }
        int64_t t_recv = tern__prof_ping.t_recv, rtt = t_recv - t_send;
        c.samples++;
        if (rtt >= 0 && rtt < c.min_rtt_ns) {
            c.min_rtt_ns = rtt;
            /* Halves first: the sum of two clock readings can overflow. */
            int64_t mid = t_send / 2 + t_recv / 2 + ((t_send & 1) + (t_recv & 1)) / 2;
            c.offset_ns = tern__prof_ping.t_remote - mid;
            c.error_bound_ns = (rtt + 1) / 2;
            c.at_ns = mid;
        }
    }
    atomic_store(&tern__prof_ping.peer, -1);
    pthread_mutex_unlock(&est_lock);
    if (st == TERN_OK && c.samples == 0)
        st = tern__error(TERN_ERR_INTERNAL, "prof: no clock sample");
    if (st == TERN_OK)
        *out = c;
    return st;
}

tern_status_t tern_prof_clock_estimate(tern_ctx_t *ctx, int peer, unsigned samples,
                                       tern_prof_clock_t *out)
{
    if (ctx == NULL || out == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_prof_clock_estimate: NULL argument");
    tern__comm_t *comm = tern__comm(ctx);
    if (comm == NULL)
        return tern__error(TERN_ERR_CLOSED, "tern_prof_clock_estimate: the context is not initialized");
    if (peer < 0 || (unsigned)peer >= comm->world)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_prof_clock_estimate: rank %d is not in the "
                                                   "world of %u", peer, comm->world);
    if (samples == 0)
        samples = (unsigned)tern__ctx_config(ctx)->prof_clock_samples;
    return estimate(comm, peer, samples, out);
}

/* Estimate peer now and keep it in the session (S.lock not held). */
static tern_status_t session_estimate(tern__comm_t *comm, int peer)
{
    tern_prof_clock_t c;
    tern_status_t st = estimate(comm, peer, S.samples, &c);
    pthread_mutex_lock(&S.lock);
    peer_clocks_t *pc = &S.clocks[peer];
    if (st != TERN_OK) {
        pc->failed = true;
    } else if (pc->n < pc->cap || (pc->est = realloc(pc->est, (pc->cap = pc->cap ? 2 * pc->cap : 4) *
                                                                  sizeof(*pc->est))) != NULL) {
        pc->est[pc->n++] = c;
    } else {
        pc->n = pc->cap = 0;
    }
    pc->last_ns = tern_prof_clock_ns();
    pthread_mutex_unlock(&S.lock);
    return st;
}

/* The first profiled call to peer in this session, and each one after the
 * refresh interval: estimate its clock (on the calling thread, outside any
 * lock of the caller's). */
static void first_contact(struct tern__comm *comm, int peer)
{
    pthread_mutex_lock(&S.lock);
    bool want = S.running && peer >= 0 && peer < S.world && !S.clocks[peer].failed &&
                peer != S.rank &&
                (S.clocks[peer].n == 0 ||
                 (S.refresh_ns > 0 && tern_prof_clock_ns() - S.clocks[peer].last_ns >= S.refresh_ns));
    if (want)
        S.clocks[peer].last_ns = tern_prof_clock_ns(); /* one thread measures */
    pthread_mutex_unlock(&S.lock);
    if (want && session_estimate(comm, peer) != TERN_OK)
        tern_warn("prof: no clock estimate for rank %d: %s", peer, tern_last_error());
}

/* peer's offset at our time x: between the estimates around x, linearly
 * (clocks drift); *bound gets the larger of their bounds. */
static int64_t offset_at(const peer_clocks_t *pc, int64_t x, int64_t *bound)
{
    const tern_prof_clock_t *e = pc->est;
    if (pc->n == 1 || x <= e[0].at_ns) {
        *bound = e[0].error_bound_ns;
        return e[0].offset_ns;
    }
    for (size_t i = 1; i < pc->n; i++) {
        if (x <= e[i].at_ns) {
            const tern_prof_clock_t *a = &e[i - 1], *b = &e[i];
            *bound = a->error_bound_ns > b->error_bound_ns ? a->error_bound_ns : b->error_bound_ns;
            if (b->at_ns == a->at_ns)
                return b->offset_ns;
            double f = (double)(x - a->at_ns) / (double)(b->at_ns - a->at_ns);
            return a->offset_ns + (int64_t)((double)(b->offset_ns - a->offset_ns) * f);
        }
    }
    *bound = e[pc->n - 1].error_bound_ns;
    return e[pc->n - 1].offset_ns;
}

static void free_clocks(void);

tern_status_t tern__prof_estimate_kept(tern__comm_t *comm, int peer, tern_prof_clock_t *out)
{
    pthread_mutex_lock(&S.lock);
    if (S.clocks == NULL || S.world != (int)comm->world) {
        /* No session yet on this rank, or one on another context. */
        free_clocks();
        S.world = (int)comm->world;
        S.rank = (int)comm->rank;
        S.clocks = calloc(comm->world, sizeof(*S.clocks));
    }
    if (S.samples == 0)
        S.samples = (unsigned)tern__ctx_config(comm->ctx)->prof_clock_samples;
    pthread_mutex_unlock(&S.lock);
    if (S.clocks == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "prof: no memory for clock estimates");
    tern_status_t st = session_estimate(comm, peer);
    if (st == TERN_OK) {
        pthread_mutex_lock(&S.lock);
        const peer_clocks_t *pc = &S.clocks[peer];
        if (pc->n > 0)
            *out = pc->est[pc->n - 1];
        else
            st = tern__error(TERN_ERR_NO_MEMORY, "prof: no memory for clock estimates");
        pthread_mutex_unlock(&S.lock);
    }
    return st;
}

bool tern__prof_offset_of(int peer, int64_t x, int64_t *offset, int64_t *bound)
{
    if (S.clocks == NULL || peer < 0 || peer >= S.world || S.clocks[peer].n == 0)
        return false;
    *offset = offset_at(&S.clocks[peer], x, bound);
    return true;
}

/* ---- start / stop ---- */

static void free_results(void)
{
    free(S.events);
    free(S.strings);
    free(S.used);
    S.events = NULL;
    S.strings = NULL;
    S.used = NULL;
    S.nevents = S.nused = 0;
    S.dropped = 0;
    S.job = false;
}

static void free_clocks(void)
{
    for (int i = 0; S.clocks != NULL && i < S.world; i++)
        free(S.clocks[i].est);
    free(S.clocks);
    S.clocks = NULL;
}

static void drop_old(tern__prof_buf_t *b, void *arg)
{
    (void)arg;
    tern__prof_buf_reset(b);
}

static void session_ctx_finalize(tern_ctx_t *ctx);

tern_status_t tern_prof_start(tern_ctx_t *ctx, const tern_prof_config_t *config)
{
    if (ctx == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_prof_start: ctx is NULL");
    tern__comm_t *comm = tern__comm(ctx);
    if (comm == NULL)
        return tern__error(TERN_ERR_CLOSED, "tern_prof_start: the context is not initialized");
    const tern__config_t *cfg = tern__ctx_config(ctx);
    uint64_t m = config ? config->field_mask : 0;
    unsigned flags = (m & TERN_PROF_CFG_FLAGS) ? config->flags : 0;
    int64_t refresh = (m & TERN_PROF_CFG_CLOCK_REFRESH) ? config->clock_refresh_ns
                                                        : cfg->prof_clock_refresh_ns;
    int64_t samples = (m & TERN_PROF_CFG_CLOCK_SAMPLES) ? (int64_t)config->clock_samples
                                                        : cfg->prof_clock_samples;
    if (flags & ~(unsigned)(TERN_PROF_MEMORY | TERN_PROF_SHAPES | TERN_PROF_CUDA))
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_prof_start: unknown flags 0x%x", flags);
    if (refresh < 0 || samples < 1 || samples > 100000)
        return tern__error(TERN_ERR_INVALID_PARAM,
                           "tern_prof_start: clock refresh %" PRId64 " ns, %" PRId64 " samples",
                           refresh, samples);
    pthread_mutex_lock(&S.lock);
    if (S.running) {
        pthread_mutex_unlock(&S.lock);
        return tern__error(TERN_ERR_NO_RESOURCE, "tern_prof_start: a session is already running");
    }
    free_results();
    free_clocks();
    S.clocks = calloc(comm->world, sizeof(*S.clocks));
    if (S.clocks == NULL) {
        pthread_mutex_unlock(&S.lock);
        return tern__error(TERN_ERR_NO_MEMORY, "tern_prof_start: no memory");
    }
    S.ctx = ctx;
    tern__prof_set_fini_hook(session_ctx_finalize);
    S.rank = (int)comm->rank;
    S.world = (int)comm->world;
    S.flags = flags;
    S.refresh_ns = refresh;
    S.samples = (unsigned)samples;
    S.running = true;
    pthread_mutex_unlock(&S.lock);

    tern__prof_load_skew();
    tern__prof_each_buf(drop_old, NULL);
    atomic_store(&tern__prof_session.flags, flags);
    atomic_store(&tern__prof_session.rank, (int)comm->rank);
    atomic_store(&tern__prof_session.first_contact, first_contact);
    atomic_fetch_add(&tern__prof_session.gen, 1);
    /* Before any record: the session's ticks lie after this point. */
    tern__prof_calibrate(&S.cal_start);
    S.t_start = S.cal_start.ns;
    atomic_store(&tern__prof_on, 1);
    return TERN_OK;
}

int tern_prof_enabled(void)
{
    return atomic_load(&tern__prof_on) != 0;
}

/* Raw records gathered at stop, before they become events. */
typedef struct raw {
    tern__prof_rec_t *recs;
    size_t n, cap;
    uint64_t dropped;
    unsigned gen;
    int64_t t_stop;
    tern__prof_line_t line; /* the session's ticks to ns */
} raw_t;

static void collect(tern__prof_buf_t *b, void *arg)
{
    raw_t *raw = arg;
    if (b->gen != raw->gen)
        return;
    size_t n = atomic_load_explicit(&b->count, memory_order_acquire);
    raw->dropped += atomic_load_explicit(&b->dropped, memory_order_relaxed);
    if (raw->n + n > raw->cap) {
        size_t cap = raw->cap ? raw->cap : 256;
        while (cap < raw->n + n)
            cap *= 2;
        tern__prof_rec_t *p = realloc(raw->recs, cap * sizeof(*p));
        if (p == NULL) {
            raw->dropped += n;
            return;
        }
        raw->recs = p;
        raw->cap = cap;
    }
    for (size_t i = 0; i < n; i++) {
        tern__prof_rec_t *r = tern__prof_buf_at(b, i), *d = &raw->recs[raw->n++];
        /* Field by field: the owner may still be ending an open range, whose
         * memory count and bytes are written before its end (release). */
        int64_t end = atomic_load_explicit(&r->end, memory_order_acquire);
        bool open = end == 0;
        /* Ticks to ns, but for the remote events (ns of their node). */
        if (!(r->flags & TERN__REC_REMOTE)) {
            d->start = tern__prof_line_ns(&raw->line, r->start);
            end = open ? end : tern__prof_line_ns(&raw->line, end);
        } else {
            d->start = r->start;
        }
        d->tid = r->tid;
        d->id = r->id;
        d->parent = r->parent;
        d->seq = r->seq;
        d->peer = r->peer;
        d->node = r->node;
        d->kind = r->kind;
        d->flags = r->flags; /* takes the strings: the buffer forgets them */
        d->name = r->name;
        d->shapes = r->shapes;
        d->bytes = !open ? r->bytes : 0;
        d->mem = !open ? r->mem : 0;
        /* A range still open at stop ends there. */
        atomic_store_explicit(&d->end, !open ? end : raw->t_stop, memory_order_relaxed);
        r->flags = 0;
        r->shapes = NULL;
    }
    atomic_store_explicit(&b->count, 0, memory_order_release);
}

int tern__prof_by_start(const void *a, const void *b)
{
    const tern_prof_event_t *x = a, *y = b;
    if (x->start_ns != y->start_ns)
        return x->start_ns < y->start_ns ? -1 : 1;
    /* Enclosing first at equal starts. */
    if (x->end_ns != y->end_ns)
        return x->end_ns > y->end_ns ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int by_thread(const void *a, const void *b)
{
    const tern_prof_event_t *const *x = a, *const *y = b;
    if ((*x)->node != (*y)->node)
        return (*x)->node < (*y)->node ? -1 : 1;
    if ((*x)->thread != (*y)->thread)
        return (*x)->thread < (*y)->thread ? -1 : 1;
    return tern__prof_by_start(*x, *y);
}

/* Depth and self time and memory: children are the synchronous events
 * nested inside on the same node and thread. */
static void nest(tern_prof_event_t *ev, size_t n, const bool *async)
{
    tern_prof_event_t **order = malloc(n * sizeof(*order)), **stack = malloc(n * sizeof(*stack));
    size_t m = 0;
    if (order == NULL || stack == NULL) {
        free(order);
        free(stack);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        ev[i].self_ns = async[i] ? 0 : ev[i].end_ns - ev[i].start_ns;
        ev[i].self_mem = ev[i].mem;
        if (!async[i])
            order[m++] = &ev[i];
    }
    qsort(order, m, sizeof(*order), by_thread);
    size_t top = 0;
    for (size_t i = 0; i < m; i++) {
        tern_prof_event_t *e = order[i];
        if (i > 0 && (order[i - 1]->node != e->node || order[i - 1]->thread != e->thread))
            top = 0;
        while (top > 0 && stack[top - 1]->end_ns <= e->start_ns)
            top--;
        if (top > 0 && e->end_ns <= stack[top - 1]->end_ns) {
            stack[top - 1]->self_ns -= e->end_ns - e->start_ns;
            stack[top - 1]->self_mem -= e->mem;
        } else {
            top = 0; /* overlapping without nesting: not a child */
        }
        e->depth = (int)top;
        stack[top++] = e;
    }
    free(order);
    free(stack);
}

/* tern__prof_ctx_finalize's work (set as its hook by tern_prof_start:
 * record.c, which the runtime links, cannot call into the session). */
static void session_ctx_finalize(tern_ctx_t *ctx)
{
    pthread_mutex_lock(&S.lock);
    bool mine = S.running && S.ctx == ctx;
    pthread_mutex_unlock(&S.lock);
    if (mine) {
        tern_warn("tern_finalize: the profiler session was still running; stopped here (its "
                  "results stay readable; tern_prof_stop now reports no session)");
        if (tern_prof_stop() != TERN_OK)
            tern_warn("tern_finalize: stopping the profiler session: %s", tern_last_error());
    }
    pthread_mutex_lock(&S.lock);
    if (S.ctx == ctx)
        S.ctx = NULL;
    pthread_mutex_unlock(&S.lock);
}

tern_status_t tern_prof_stop(void)
{
    pthread_mutex_lock(&S.lock);
    if (!S.running) {
        pthread_mutex_unlock(&S.lock);
        return tern__error(TERN_ERR_CLOSED, "tern_prof_stop: no session is running");
    }
    S.running = false; /* no more first contacts */
    pthread_mutex_unlock(&S.lock);
    atomic_store(&tern__prof_on, 0);
    /* An open range ends here: at ns that its children's ticks map below. */
    tern__prof_calibrate(&S.cal_stop);
    S.t_stop = S.cal_stop.ns;

    raw_t raw = {.gen = atomic_load(&tern__prof_session.gen), .t_stop = S.t_stop};
    tern__prof_line(&raw.line, &S.cal_start, &S.cal_stop);
    tern__prof_each_buf(collect, &raw);

    /* A last estimate of every remote node seen, which also brackets the
     * session's events for interpolation. */
    tern__comm_t *comm = tern__comm(S.ctx);
    bool *seen = calloc((size_t)S.world, sizeof(bool));
    for (size_t i = 0; seen != NULL && i < raw.n; i++)
        if (raw.recs[i].node >= 0 && raw.recs[i].node < S.world && raw.recs[i].node != S.rank)
            seen[raw.recs[i].node] = true;
    for (int p = 0; seen != NULL && comm != NULL && p < S.world; p++) {
        pthread_mutex_lock(&S.lock);
        bool failed = S.clocks[p].failed;
        pthread_mutex_unlock(&S.lock);
        if (!seen[p] || failed)
            continue;
        if (session_estimate(comm, p) != TERN_OK)
            tern_warn("prof: rank %d's events stay on its own clock: %s", p, tern_last_error());
    }

    pthread_mutex_lock(&S.lock);
    /* Results: one string block, then the events. */
    size_t strsize = 0, nused = 0;
    for (size_t i = 0; i < raw.n; i++) {
        strsize += strlen(tern__prof_rec_name(&raw.recs[i])) + 1;
        strsize += (raw.recs[i].shapes ? strlen(raw.recs[i].shapes) : 0) + 1;
    }
    for (int p = 0; seen != NULL && p < S.world; p++)
        nused += seen[p] && S.clocks[p].n > 0;
    S.events = calloc(raw.n ? raw.n : 1, sizeof(*S.events));
    S.strings = malloc(strsize ? strsize : 1);
    S.used = calloc(nused ? nused : 1, sizeof(*S.used));
    bool *async = calloc(raw.n ? raw.n : 1, sizeof(bool));
    tern_status_t st = TERN_OK;
    if (S.events == NULL || S.strings == NULL || S.used == NULL || async == NULL || seen == NULL) {
        free_results();
        st = tern__error(TERN_ERR_NO_MEMORY, "tern_prof_stop: no memory for %zu events", raw.n);
    } else {
        char *s = S.strings;
        for (size_t i = 0; i < raw.n; i++) {
            tern__prof_rec_t *r = &raw.recs[i];
            tern_prof_event_t *e = &S.events[i];
            const char *name = tern__prof_rec_name(r);
            size_t nl = strlen(name) + 1;
            memcpy(s, name, nl);
            e->name = s;
            s += nl;
            const char *sh = r->shapes ? r->shapes : "";
            nl = strlen(sh) + 1;
            memcpy(s, sh, nl);
            e->shapes = s;
            s += nl;
            e->node = r->node < 0 ? S.rank : r->node;
            e->kind = r->kind;
            e->thread = r->tid;
            e->start_ns = r->start;
            e->end_ns = atomic_load_explicit(&r->end, memory_order_relaxed);
            e->bytes = r->bytes;
            e->mem = r->mem;
            e->id = r->id != 0 ? r->id : tern__prof_new_id();
            e->parent = r->parent;
            e->dir = (r->flags & TERN__REC_SEND)   ? TERN_PROF_DIR_SEND
                     : (r->flags & TERN__REC_RECV) ? TERN_PROF_DIR_RECV
                                                   : TERN_PROF_DIR_NONE;
            e->peer = e->dir != TERN_PROF_DIR_NONE || e->kind == TERN_PROF_KIND_RPC ? r->peer : -1;
            e->seq = e->dir != TERN_PROF_DIR_NONE ? r->seq : 0;
            async[i] = (r->flags & TERN__REC_ASYNC) != 0;
            if (e->node != S.rank) {
                const peer_clocks_t *pc =
                    e->node >= 0 && e->node < S.world ? &S.clocks[e->node] : NULL;
                if (pc == NULL || pc->n == 0) {
                    e->clock_error_ns = -1;
                } else {
                    int64_t bound, off = offset_at(pc, e->start_ns - pc->est[0].offset_ns, &bound);
                    e->start_ns -= off;
                    e->end_ns -= off;
                    e->clock_error_ns = bound;
                }
            }
            if (e->end_ns < e->start_ns)
                e->end_ns = e->start_ns;
            tern__prof_rec_clear(r);
        }
        S.nevents = raw.n;
        S.dropped = raw.dropped;
        nest(S.events, S.nevents, async);
        qsort(S.events, S.nevents, sizeof(*S.events), tern__prof_by_start);
        for (int p = 0; p < S.world; p++)
            if (seen[p] && S.clocks[p].n > 0)
                S.used[S.nused++] = S.clocks[p].est[S.clocks[p].n - 1];
    }
    if (raw.dropped > 0)
        tern_warn("prof: %" PRIu64 " events were dropped (a thread's buffer or a reply was full)",
                  raw.dropped);
    pthread_mutex_unlock(&S.lock);
    free(async);
    free(seen);
    free(raw.recs);
    return st;
}

tern_status_t tern__prof_results(const tern_prof_event_t **events, size_t *n, unsigned *flags,
                                 int64_t *t_start, uint64_t *dropped)
{
    if (S.running)
        return tern__error(TERN_ERR_NO_RESOURCE, "prof: this rank's session is still running; "
                                                 "call tern_prof_stop first");
    *events = S.events;
    *n = S.nevents;
    *flags = S.flags;
    *t_start = S.t_start;
    *dropped = S.dropped;
    return TERN_OK;
}

void tern__prof_install(tern_prof_event_t *events, size_t n, char *strings,
                        tern_prof_clock_t *used, size_t nused, unsigned flags, uint64_t dropped)
{
    pthread_mutex_lock(&S.lock);
    free_results();
    S.events = events;
    S.nevents = n;
    S.strings = strings;
    S.used = used;
    S.nused = nused;
    S.flags = flags;
    S.dropped = dropped;
    S.job = true;
    /* A root that never profiled itself: the trace's times count from the
     * job's first event. */
    if (S.t_start == 0 && n > 0)
        S.t_start = events[0].start_ns;
    pthread_mutex_unlock(&S.lock);
}

tern_status_t tern_prof_events(const tern_prof_event_t **events, size_t *count)
{
    if (events == NULL || count == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_prof_events: NULL argument");
    if (S.running)
        return tern__error(TERN_ERR_NO_RESOURCE, "tern_prof_events: the session is still running");
    *events = S.events;
    *count = S.nevents;
    return TERN_OK;
}

tern_status_t tern_prof_clocks(const tern_prof_clock_t **clocks, size_t *count)
{
    if (clocks == NULL || count == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_prof_clocks: NULL argument");
    if (S.running)
        return tern__error(TERN_ERR_NO_RESOURCE, "tern_prof_clocks: the session is still running");
    *clocks = S.used;
    *count = S.nused;
    return TERN_OK;
}

/* ---- key_averages ---- */

struct tern_prof_table {
    tern_prof_stat_t *rows;
    size_t n;
    int64_t self_total;
    unsigned flags; /* the session's */
    unsigned group;
};

tern_status_t tern_prof_key_averages(unsigned group, tern_prof_table_t **out)
{
    if (out == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_prof_key_averages: table is NULL");
    if (S.running)
        return tern__error(TERN_ERR_NO_RESOURCE, "tern_prof_key_averages: stop the session first");
    tern_prof_table_t *t = calloc(1, sizeof(*t));
    if (t == NULL || (S.nevents && (t->rows = calloc(S.nevents, sizeof(*t->rows))) == NULL)) {
        free(t);
        return tern__error(TERN_ERR_NO_MEMORY, "tern_prof_key_averages: no memory");
    }
    t->flags = S.flags;
    t->group = group;
    /* Few distinct keys: a linear search per event is fine for tables a
     * person reads; sessions with millions of events stay under a second. */
    for (size_t i = 0; i < S.nevents; i++) {
        const tern_prof_event_t *e = &S.events[i];
        tern_prof_stat_t *r = NULL;
        for (size_t j = t->n; j-- > 0;) {
            tern_prof_stat_t *c = &t->rows[j];
            if (c->node == e->node && strcmp(c->name, e->name) == 0 &&
                (!(group & TERN_PROF_BY_SHAPES) || strcmp(c->shapes, e->shapes) == 0)) {
                r = c;
                break;
            }
        }
        if (r == NULL) {
            r = &t->rows[t->n++];
            r->name = e->name;
            r->node = e->node;
            r->kind = e->kind;
            r->shapes = (group & TERN_PROF_BY_SHAPES) ? e->shapes : "";
        }
        r->calls++;
        r->self_ns += e->self_ns;
        r->total_ns += e->end_ns - e->start_ns;
        r->self_mem += e->self_mem;
        r->total_mem += e->mem;
        r->bytes += e->bytes;
        t->self_total += e->self_ns;
    }
    *out = t;
    return TERN_OK;
}

void tern_prof_table_free(tern_prof_table_t *t)
{
    if (t == NULL)
        return;
    free(t->rows);
    free(t);
}

size_t tern_prof_table_rows(const tern_prof_table_t *t)
{
    return t ? t->n : 0;
}

const tern_prof_stat_t *tern_prof_table_row(const tern_prof_table_t *t, size_t i)
{
    return t && i < t->n ? &t->rows[i] : NULL;
}

int64_t tern_prof_table_self_total(const tern_prof_table_t *t)
{
    return t ? t->self_total : 0;
}

static unsigned sort_key;

static int row_cmp(const void *a, const void *b)
{
    const tern_prof_stat_t *x = *(const tern_prof_stat_t *const *)a,
                           *y = *(const tern_prof_stat_t *const *)b;
    int64_t u = 0, v = 0;
    switch (sort_key) {
    case TERN_PROF_SORT_SELF_CPU:
        u = x->self_ns, v = y->self_ns;
        break;
    case TERN_PROF_SORT_CPU_TOTAL:
        u = x->total_ns, v = y->total_ns;
        break;
    case TERN_PROF_SORT_CPU_AVG:
        u = x->total_ns / (int64_t)x->calls, v = y->total_ns / (int64_t)y->calls;
        break;
    case TERN_PROF_SORT_CALLS:
        u = (int64_t)x->calls, v = (int64_t)y->calls;
        break;
    case TERN_PROF_SORT_NAME: {
        int c = strcmp(x->name, y->name);
        return c != 0 ? c : x->node - y->node;
    }
    default:
        break;
    }
    if (u != v)
        return u > v ? -1 : 1;
    return x < y ? -1 : x > y; /* stable: first seen first */
}

static void fmt_time(char *buf, size_t size, int64_t ns)
{
    if (ns >= 1000000000 || ns <= -1000000000)
        snprintf(buf, size, "%.3fs", (double)ns / 1e9);
    else if (ns >= 1000000 || ns <= -1000000)
        snprintf(buf, size, "%.3fms", (double)ns / 1e6);
    else
        snprintf(buf, size, "%.3fus", (double)ns / 1e3);
}

static void fmt_mem(char *buf, size_t size, int64_t b)
{
    double a = (double)(b < 0 ? -b : b);
    if (a >= 1024.0 * 1024 * 1024)
        snprintf(buf, size, "%.2f Gb", (double)b / (1024.0 * 1024 * 1024));
    else if (a >= 1024.0 * 1024)
        snprintf(buf, size, "%.2f Mb", (double)b / (1024.0 * 1024));
    else if (a >= 1024.0)
        snprintf(buf, size, "%.2f Kb", (double)b / 1024.0);
    else
        snprintf(buf, size, "%" PRId64 " b", b);
}

static void rule(FILE *out, int namew, int ncols)
{
    for (int i = 0; i < namew; i++)
        fputc('-', out);
    for (int c = 0; c < ncols; c++)
        fputs("  ---------------", out);
    fputc('\n', out);
}

tern_status_t tern_prof_table_print(const tern_prof_table_t *t, FILE *out,
                                    const tern_prof_print_t *o)
{
    if (t == NULL || out == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_prof_table_print: NULL argument");
    uint64_t m = o ? o->field_mask : 0;
    unsigned sort = (m & TERN_PROF_PRINT_SORT) ? o->sort : TERN_PROF_SORT_NONE;
    size_t limit = (m & TERN_PROF_PRINT_LIMIT) ? o->limit : SIZE_MAX;
    bool one_node = (m & TERN_PROF_PRINT_NODE) != 0;
    int node = one_node ? o->node : 0;
    if (sort > TERN_PROF_SORT_NAME)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_prof_table_print: unknown sort %u", sort);
    const tern_prof_stat_t **rows = malloc((t->n ? t->n : 1) * sizeof(*rows));
    if (rows == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "tern_prof_table_print: no memory");
    size_t n = 0;
    int64_t self_total = 0;
    for (size_t i = 0; i < t->n; i++) {
        if (one_node && t->rows[i].node != node)
            continue;
        rows[n++] = &t->rows[i];
        self_total += t->rows[i].self_ns;
    }
    sort_key = sort;
    qsort(rows, n, sizeof(*rows), row_cmp);
    if (n > limit)
        n = limit;
    bool mem = (t->flags & TERN_PROF_MEMORY) != 0, shapes = (t->group & TERN_PROF_BY_SHAPES) != 0;
    int namew = 4;
    for (size_t i = 0; i < n; i++) {
        int l = (int)strlen(rows[i]->name);
        if (l > namew)
            namew = l;
    }
    int ncols = 7 + (mem ? 2 : 0) + (shapes ? 1 : 0);
    rule(out, namew, ncols);
    /* The last column unpadded: no trailing blanks. */
    int nodew = mem || shapes ? 15 : 0, memw = shapes ? 15 : 0;
    fprintf(out, "%-*s  %-15s  %-15s  %-15s  %-15s  %-15s  %-15s  %-*s", namew, "Name",
            "Self CPU total %", "Self CPU total", "CPU total %", "CPU total", "CPU time avg",
            "Number of Calls", nodew, "Node ID");
    if (mem)
        fprintf(out, "  %-15s  %-*s", "Self CPU Mem", memw, "CPU Mem");
    if (shapes)
        fprintf(out, "  %s", "Input Shapes");
    fputc('\n', out);
    rule(out, namew, ncols);
    for (size_t i = 0; i < n; i++) {
        const tern_prof_stat_t *r = rows[i];
        char self[32], total[32], avg[32], sp[32], tp[32];
        fmt_time(self, sizeof(self), r->self_ns);
        fmt_time(total, sizeof(total), r->total_ns);
        fmt_time(avg, sizeof(avg), r->total_ns / (int64_t)r->calls);
        snprintf(sp, sizeof(sp), "%.2f%%",
                 self_total ? 100.0 * (double)r->self_ns / (double)self_total : 0.0);
        /* A call's span is wall time spent waiting, not CPU of this
         * process: as a share of the CPU total it would mean nothing. */
        if (r->kind == TERN_PROF_KIND_RPC || r->kind == TERN_PROF_KIND_COLL)
            snprintf(tp, sizeof(tp), "-");
        else
            snprintf(tp, sizeof(tp), "%.2f%%",
                     self_total ? 100.0 * (double)r->total_ns / (double)self_total : 0.0);
        fprintf(out, "%-*s  %-15s  %-15s  %-15s  %-15s  %-15s  %-15" PRIu64 "  %-*d", namew,
                r->name, sp, self, tp, total, avg, r->calls, nodew, r->node);
        if (mem) {
            char a[32], b[32];
            fmt_mem(a, sizeof(a), r->self_mem);
            fmt_mem(b, sizeof(b), r->total_mem);
            fprintf(out, "  %-15s  %-*s", a, memw, b);
        }
        if (shapes)
            fprintf(out, "  %s", r->shapes);
        fputc('\n', out);
    }
    rule(out, namew, ncols);
    char tot[32];
    fmt_time(tot, sizeof(tot), self_total);
    if (one_node)
        fprintf(out, "Self CPU time total (node %d): %s\n", node, tot);
    else
        fprintf(out, "Self CPU time total: %s\n", tot);
    free(rows);
    return ferror(out) ? tern__error(TERN_ERR_IO, "tern_prof_table_print: write failed") : TERN_OK;
}

/* ---- chrome trace ---- */

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static const char *kind_name(unsigned k)
{
    static const char *names[] = {"range", "rpc", "handler", "p2p", "coll", "clock"};
    return k < sizeof(names) / sizeof(names[0]) ? names[k] : "other";
}

static int ev_by_id(const void *a, const void *b)
{
    const tern_prof_event_t *x = *(const tern_prof_event_t *const *)a,
                            *y = *(const tern_prof_event_t *const *)b;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Receives by (node, peer, seq): where a send's message arrived. */
static int ev_by_msg(const void *a, const void *b)
{
    const tern_prof_event_t *x = *(const tern_prof_event_t *const *)a,
                            *y = *(const tern_prof_event_t *const *)b;
    if (x->node != y->node)
        return x->node < y->node ? -1 : 1;
    if (x->peer != y->peer)
        return x->peer < y->peer ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static const tern_prof_event_t *lookup(const tern_prof_event_t **index, size_t n,
                                       const tern_prof_event_t *key,
                                       int (*cmp)(const void *, const void *))
{
    const tern_prof_event_t *const *hit = bsearch(&key, index, n, sizeof(*index), cmp);
    return hit != NULL ? *hit : NULL;
}

/* Flow arrows from (ts0 on a) to (ts1 on b), bound to the slices there. */
static void flow(FILE *f, const char *name, const char *cat, uint64_t id, double ts0,
                 const tern_prof_event_t *a, double ts1, const tern_prof_event_t *b)
{
    fprintf(f, ",\n  {\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"s\", \"id\": %" PRIu64
               ", \"ts\": %.3f, \"pid\": %d, \"tid\": %" PRIu64 "},\n"
               "  {\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"f\", \"bp\": \"e\", "
               "\"id\": %" PRIu64 ", \"ts\": %.3f, \"pid\": %d, \"tid\": %" PRIu64 "}",
            name, cat, id, ts0, a->node, a->thread, name, cat, id, ts1, b->node, b->thread);
}

tern_status_t tern_prof_export_chrome_trace(const char *path)
{
    if (path == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_prof_export_chrome_trace: path is NULL");
    if (S.running)
        return tern__error(TERN_ERR_NO_RESOURCE, "tern_prof_export_chrome_trace: stop the session "
                                                 "first");
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return tern__error_errno(TERN_ERR_IO, errno, "tern_prof_export_chrome_trace: %s", path);
    /* Microseconds from the session's start, as the viewers expect. */
    int64_t t0 = S.t_start;
    for (size_t i = 0; i < S.nevents; i++)
        if (S.events[i].start_ns < t0)
            t0 = S.events[i].start_ns;
    fprintf(f, "{\"displayTimeUnit\": \"ns\",\n \"otherData\": {\"tern_node\": %d, \"job\": %s, "
               "\"clocks\": [",
            S.rank, S.job ? "true" : "false");
    for (size_t i = 0; i < S.nused; i++) {
        const tern_prof_clock_t *c = &S.used[i];
        fprintf(f, "%s{\"peer\": %d, \"offset_ns\": %" PRId64 ", \"error_bound_ns\": %" PRId64
                   ", \"min_rtt_ns\": %" PRId64 ", \"samples\": %u}",
                i ? ", " : "", c->peer, c->offset_ns, c->error_bound_ns, c->min_rtt_ns, c->samples);
    }
    fprintf(f, "]},\n \"traceEvents\": [\n");
    /* One process per node, named. */
    bool *named = calloc((size_t)S.world + 1, sizeof(bool));
    bool first = true;
    for (size_t i = 0; named != NULL && i < S.nevents; i++) {
        int node = S.events[i].node;
        if (node < 0 || node >= S.world || named[node])
            continue;
        named[node] = true;
        fprintf(f, "%s  {\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, "
                   "\"args\": {\"name\": \"node %d%s\"}},\n"
                   "  {\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, "
                   "\"args\": {\"sort_index\": %d}}",
                first ? "" : ",\n", node, node,
                node != S.rank ? "" : S.job ? " (root, this process)" : " (this process)", node, node);
        first = false;
    }
    free(named);
    /* Indexes for the arrows: events by id (an RPC's handler names its call),
     * receives by message. */
    const tern_prof_event_t **ids = malloc((S.nevents ? S.nevents : 1) * sizeof(*ids));
    const tern_prof_event_t **recvs = malloc((S.nevents ? S.nevents : 1) * sizeof(*recvs));
    size_t nrecvs = 0;
    for (size_t i = 0; ids != NULL && recvs != NULL && i < S.nevents; i++) {
        ids[i] = &S.events[i];
        if (S.events[i].dir == TERN_PROF_DIR_RECV && S.events[i].seq != 0)
            recvs[nrecvs++] = &S.events[i];
    }
    if (ids != NULL && recvs != NULL) {
        qsort(ids, S.nevents, sizeof(*ids), ev_by_id);
        qsort(recvs, nrecvs, sizeof(*recvs), ev_by_msg);
    }
    uint64_t nflows = 0;
    for (size_t i = 0; i < S.nevents; i++) {
        const tern_prof_event_t *e = &S.events[i];
        fprintf(f, "%s  {\"name\": ", first ? "" : ",\n");
        first = false;
        json_str(f, e->name);
        fprintf(f, ", \"cat\": \"%s\", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": %d, "
                   "\"tid\": %" PRIu64 ", \"args\": {\"bytes\": %" PRIu64 ", \"node\": %d",
                kind_name(e->kind), (double)(e->start_ns - t0) / 1e3,
                (double)(e->end_ns - e->start_ns) / 1e3, e->node, e->thread, e->bytes, e->node);
        if (e->clock_error_ns != 0)
            fprintf(f, ", \"clock_error_ns\": %" PRId64, e->clock_error_ns);
        if (S.flags & TERN_PROF_MEMORY)
            fprintf(f, ", \"mem\": %" PRId64, e->mem);
        if (e->shapes[0]) {
            fprintf(f, ", \"shapes\": ");
            json_str(f, e->shapes);
        }
        if (e->dir != TERN_PROF_DIR_NONE)
            fprintf(f, ", \"%s\": %d, \"seq\": %" PRIu64,
                    e->dir == TERN_PROF_DIR_SEND ? "to" : "from", e->peer, e->seq);
        fprintf(f, "}}");
        if (ids == NULL || recvs == NULL)
            continue;
        /* A message: from where it was posted to where it was received. */
        if (e->dir == TERN_PROF_DIR_SEND && e->seq != 0) {
            tern_prof_event_t key = {.node = e->peer, .peer = e->node, .seq = e->seq};
            const tern_prof_event_t *r = lookup(recvs, nrecvs, &key, ev_by_msg);
            if (r != NULL)
                flow(f, "message", "msg", ++nflows, (double)(e->start_ns - t0) / 1e3, e,
                     (double)(r->end_ns - t0) / 1e3 - 0.001, r);
        }
        /* The request and the reply of an RPC, between the call and the
         * handler that ran for it. */
        if (e->kind != TERN_PROF_KIND_HANDLER || e->parent == 0)
            continue;
        tern_prof_event_t key = {.id = e->parent};
        const tern_prof_event_t *call = lookup(ids, S.nevents, &key, ev_by_id);
        if (call == NULL || call->kind != TERN_PROF_KIND_RPC)
            continue;
        flow(f, "rpc request", "rpc", 2 * e->id, (double)(call->start_ns - t0) / 1e3, call,
             (double)(e->start_ns - t0) / 1e3, e);
        flow(f, "rpc reply", "rpc", 2 * e->id + 1, (double)(e->end_ns - t0) / 1e3 - 0.001, e,
             (double)(call->end_ns - t0) / 1e3, call);
    }
    free(ids);
    free(recvs);
    fprintf(f, "\n]}\n");
    int bad = ferror(f);
    if (fclose(f) != 0 || bad)
        return tern__error_errno(TERN_ERR_IO, errno, "tern_prof_export_chrome_trace: writing %s",
                                 path);
    return TERN_OK;
}
