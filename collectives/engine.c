/*
 * The schedule engine (coll.h has the model).
 *
 * A collective is advanced by one thread at a time (its busy flag), with the
 * comm lock NOT held, so reductions never block the transport: whoever
 * progresses the transport (a waiter, tern_request_test, or the progress
 * thread) picks up the collectives a completion kicked and moves them on.
 *
 * Failure. The first step that fails (a lost peer, a size that does not match,
 * no progress for the timeout) marks the collective failing: nothing new is
 * started, what is posted is withdrawn (tern__p2p_cancel), and the collective
 * finishes once nothing it posted is still out, because a receive whose data
 * is being read may still write into its buffer. The group is then broken.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tern/clock.h>

#include "collectives/coll.h"
#include "core/bytes.h"
#include "core/context.h"
#include "core/error.h"
#include "core/log.h"
#include "tensor/reduce.h"

/* Collectives one progress call advances at most; more are kicked again,
 * and each pass starts one further along the list, so that none waits on
 * newer ones to finish (a call behind 16 newer ones was not advanced, nor its
 * timeout checked, until one of them ended). */
#define PICK_MAX 16

/* ---- building ---- */

/* What a kept call may keep: a small all_reduce's few steps and bytes, and
 * a ring's receive slots at the default segment (8 x 512 KiB), which would
 * otherwise be fresh pages on every call. */
#define SPARE_STEPS_MAX 1024
#define SPARE_SCRATCH_MAX (4u << 20)

tern__coll_t *tern__coll_new(tern_group_t *g, const char *op_name, tern_dtype_t dtype,
                             tern_reduce_op_t op)
{
    coll_state_t *cs = g->comm->coll_state; /* made with the group */
    tern__coll_t *c = atomic_exchange_explicit(&cs->spare, NULL, memory_order_acquire);
    if (c != NULL) {
        step_t *steps = c->steps;
        size_t cap = c->cap, kept_cap = c->scratch_cap;
        void *kept = c->scratch;
        memset(c, 0, offsetof(tern__coll_t, detail));
        c->steps = steps;
        c->cap = cap;
        c->kept = kept;
        c->kept_cap = kept_cap;
    } else if ((c = calloc(1, sizeof(*c))) == NULL) {
        tern__error(TERN_ERR_NO_MEMORY, "%s: no memory", op_name);
        return NULL;
    }
    c->req.comm = g->comm;
    c->req.kind = REQ_COLL;
    c->req.coll = c;
    c->req.peer = -1;
    c->g = g;
    c->op_name = op_name;
    c->seq = g->seq++;
    c->dtype = dtype;
    c->op = op;
    c->es = tern_dtype_size(dtype);
    c->kernel = tern__reduce_kernel(op, dtype);
    c->detail[0] = c->reported_detail[0] = '\0';
    c->timeout_ns = tern__ctx_timeout(g->ctx);
    atomic_flag_clear(&c->busy);
    return c;
}

/* A discarded call's kept block has moved to scratch (tern__coll_discard):
 * steps and scratch are all it holds. */
static void coll_free(tern__coll_t *c)
{
    free(c->steps);
    free(c->scratch);
    free(c);
}

void tern__coll_discard(tern__coll_t *c)
{
    if (c == NULL)
        return;
    /* Through the request's comm, not the group: a world group is gone once
     * the context's collectives are torn down, and so is the state (NULL). */
    coll_state_t *cs = c->req.comm->coll_state;
    tern__coll_t *none = NULL;
    /* A call that asked for scratch took the kept block or freed it
     * (tern__coll_scratch); one that asked for none keeps it for the next. */
    if (c->scratch == NULL) {
        c->scratch = c->kept;
        c->scratch_cap = c->kept_cap;
        c->kept = NULL;
    }
    if (c->scratch_cap > SPARE_SCRATCH_MAX) {
        free(c->scratch);
        c->scratch = NULL;
        c->scratch_cap = 0;
    }
    if (cs == NULL || c->cap > SPARE_STEPS_MAX ||
        !atomic_compare_exchange_strong_explicit(&cs->spare, &none, c, memory_order_release,
                                                 memory_order_relaxed))
        coll_free(c);
}

void tern__coll_free_spare(coll_state_t *cs)
{
    tern__coll_t *c = atomic_exchange(&cs->spare, NULL);
    if (c != NULL)
        coll_free(c);
}

void *tern__coll_scratch(tern__coll_t *c, size_t bytes)
{
    /* One block per call: the builders carve it up themselves. */
    if (c->scratch != NULL || bytes == 0)
        return c->scratch;
    if (c->kept != NULL && c->kept_cap >= bytes) {
        c->scratch = c->kept;
        c->scratch_cap = c->kept_cap;
        c->kept = NULL;
        return c->scratch;
    }
    free(c->kept);
    c->kept = NULL;
    if ((c->scratch = malloc(bytes)) == NULL)
        c->oom = true;
    else
        c->scratch_cap = bytes;
    return c->scratch;
}

/* Append a step, filled in place (building one on the stack and copying it
 * in cost more than the rest of appending it); its index, or -1 once out of
 * memory. */
static int add_step(tern__coll_t *c, uint8_t kind, int peer, uint32_t tag, void *dst,
                    const void *a, const void *b, size_t n, int dep0, int dep1)
{
    if (c->oom)
        return -1;
    if (c->nsteps == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 16;
        step_t *grown = realloc(c->steps, cap * sizeof(*grown));
        if (grown == NULL) {
            c->oom = true;
            return -1;
        }
        c->steps = grown;
        c->cap = cap;
    }
    c->steps[c->nsteps] = (step_t){.kind = kind, .state = STEP_IDLE, .peer = peer, .tag = tag,
                                   .dst = dst, .a = a, .b = b, .n = n, .dep = {dep0, dep1}};
    return (int)c->nsteps++;
}

int tern__coll_send(tern__coll_t *c, int peer, uint32_t tag, const void *buf, size_t bytes,
                    int dep0, int dep1)
{
    return add_step(c, STEP_SEND, peer, tag, NULL, buf, NULL, bytes, dep0, dep1);
}

int tern__coll_recv(tern__coll_t *c, int peer, uint32_t tag, void *buf, size_t bytes, int dep0,
                    int dep1)
{
    return add_step(c, STEP_RECV, peer, tag, buf, NULL, NULL, bytes, dep0, dep1);
}

int tern__coll_reduce(tern__coll_t *c, void *dst, const void *a, const void *b, size_t count,
                      int dep0, int dep1)
{
    return add_step(c, STEP_REDUCE, 0, 0, dst, a, b, count, dep0, dep1);
}

int tern__coll_copy(tern__coll_t *c, void *dst, const void *src, size_t bytes, int dep0, int dep1)
{
    return add_step(c, STEP_COPY, 0, 0, dst, src, NULL, bytes, dep0, dep1);
}

int tern__coll_scale(tern__coll_t *c, void *buf, size_t count, int dep0, int dep1)
{
    return add_step(c, STEP_SCALE, 0, 0, buf, NULL, NULL, count, dep0, dep1);
}

/* ---- running ---- */

static uint32_t wire_tag(const tern__coll_t *c, const step_t *s)
{
    /* 16 bits of sequence, 15 of step: within TERN_TAG_MAX. Tags repeat only
     * 32768 steps apart between one pair in one call, and the schedules never
     * have that many messages between a pair in flight at once. */
    return (c->seq & 0xffffu) << 15 | (s->tag & 0x7fffu);
}

/* ---- telling the others ----
 *
 * A rank that sees a call fail tells every other member at once (ABORT:
 * class COLL, slot 1; payload cid u32, seq u32, status i32, text), so that
 * ranks waiting on it, or on ranks waiting on it, fail now with the first
 * cause instead of timing out one after another with less to say. Receivers
 * never pass it on.
 *
 * The group's rank 0 sends each choice of the puts' way (WAY: class COLL,
 * slot 2; payload cid u32, signature u32, from u64, try_at u64, gap u32, way
 * u32; way.h) to the other members, who take it at the same call.
 */
#define MSG_ABORT 1u
#define ABORT_HDR 12u
#define MSG_WAY 2u
#define WAY_LEN 32u

static void notice_sent(void *arg, tern_status_t st)
{
    (void)st;
    free(arg);
}

/* The other members of g get a copy of msg (len bytes) on the collectives'
 * class, in slot `slot`; members lost or not reachable are skipped (lock
 * held). */
static void tell_members(tern_group_t *g, uint32_t slot, const uint8_t *msg, size_t len)
{
    tern__comm_t *comm = g->comm;
    for (int r = 0; r < g->size; r++) {
        int w = g->world[r];
        tern_ep_t *ep;
        if (r == g->rank || comm->peer_failed[w] != TERN_OK || tern__comm_ep(comm, w, &ep) != TERN_OK)
            continue;
        uint8_t *m = malloc(len);
        if (m == NULL)
            return; /* ABORT: they time out instead; WAY: they keep the way they have */
        memcpy(m, msg, len);
        tern_op_params_t op = {.field_mask = TERN_OP_PARAM_CB, .cb = notice_sent, .cb_arg = m};
        if (tern_ep_send(ep, tern_imm_make(TERN_IMM_COLL, 0, 0, slot), m, len, &op) !=
            TERN_INPROGRESS)
            free(m);
    }
}

/* Lock held. */
static void send_abort(tern__coll_t *c)
{
    uint8_t m[ABORT_HDR + sizeof(c->detail)];
    size_t tlen = strnlen(c->detail, sizeof(c->detail) - 1);
    tern__put_le32(m, c->g->cid);
    tern__put_le32(m + 4, c->seq);
    tern__put_le32(m + 8, (uint32_t)c->failing);
    memcpy(m + ABORT_HDR, c->detail, tlen);
    tell_members(c->g, MSG_ABORT, m, ABORT_HDR + tlen);
}

/* Rank 0's choice in w->plan to the other members (lock held). */
static void send_way(tern_group_t *g, const tern__way_t *w)
{
    uint8_t m[WAY_LEN];
    tern__put_le32(m, g->cid);
    tern__put_le32(m + 4, w->shape);
    tern__put_le64(m + 8, w->plan.from);
    tern__put_le64(m + 16, w->plan.try_at);
    tern__put_le32(m + 24, (uint32_t)w->plan.gap);
    tern__put_le32(m + 28, (uint32_t)w->plan.best);
    tell_members(g, MSG_WAY, m, WAY_LEN);
}

/* The slot g times calls of signature shape in (lock held), or NULL: none
 * yet, or dropped for another. */
static tern__way_t *way_find(tern_group_t *g, uint32_t shape)
{
    for (int i = 0; i < TERN__WAY_SLOTS; i++)
        if (shape != 0 && g->ways[i].shape == shape) /* 0 marks a free slot */
            return &g->ways[i];
    return NULL;
}

/* A WAY from the group's rank 0 (lock held). A slot this member does not
 * have (dropped, or its calls not started yet) takes no plan: it copies
 * until the next one, which comes within TERN__WAY_GAP_MAX calls. */
static void on_way(coll_state_t *cs, const tern_event_t *ev)
{
    const uint8_t *p = ev->data;
    uint32_t cid = tern__get_le32(p), shape = tern__get_le32(p + 4);
    tern__way_plan_t plan = {.from = tern__get_le64(p + 8),
                             .try_at = tern__get_le64(p + 16),
                             .gap = tern__get_le32(p + 24),
                             .best = (tern_op_way_t)tern__get_le32(p + 28)};
    tern_group_t *g = cs->world->cid == cid ? cs->world : NULL;
    for (tern_group_t *x = cs->groups; g == NULL && x != NULL; x = x->next_live)
        if (x->cid == cid)
            g = x;
    if (g == NULL) { /* destroyed here after its last call */
        tern_debug("collectives: a choice of way from rank %u for group %" PRIu32
                   ", which this rank no longer has", ev->src, cid);
        return;
    }
    if (g->rank <= 0 || g->world[0] != (int)ev->src) {
        tern_warn("collectives: dropped a choice of way from rank %u for group %" PRIu32
                  ", which it does not lead here", ev->src, cid);
        return;
    }
    tern__way_t *w = way_find(g, shape);
    if (w != NULL && !tern__way_follow(w, &plan))
        tern_warn("collectives: dropped a malformed choice of way from rank %u", ev->src);
}

void tern__coll_on_message(tern__comm_t *comm, const tern_event_t *ev, void *arg)
{
    coll_state_t *cs = arg;
    const uint8_t *p = ev->data;
    if (ev->type == TERN_EVENT_RECV && tern_imm_slot(ev->imm) == MSG_WAY && ev->len == WAY_LEN) {
        on_way(cs, ev);
        return;
    }
    if (ev->type != TERN_EVENT_RECV || tern_imm_slot(ev->imm) != MSG_ABORT || ev->len < ABORT_HDR) {
        if (ev->type == TERN_EVENT_RECV)
            tern_warn("collectives: dropped a malformed message from rank %u", ev->src);
        return;
    }
    uint32_t cid = tern__get_le32(p), seq = tern__get_le32(p + 4);
    tern_status_t st = tern__status_from_wire((int32_t)tern__get_le32(p + 8));
    if (st == TERN_OK) /* an abort without an error */
        st = TERN_ERR_PROTOCOL;
    char text[200];
    int tl = (int)(ev->len - ABORT_HDR < 150 ? ev->len - ABORT_HDR : 150);
    snprintf(text, sizeof(text), "rank %u reported: %.*s", ev->src, tl, (const char *)p + ABORT_HDR);
    for (tern__coll_t *c = cs->active; c != NULL; c = c->next) {
        if (c->g->cid == cid && c->seq == seq) {
            if (atomic_load(&c->reported) == TERN_OK) {
                snprintf(c->reported_detail, sizeof(c->reported_detail), "%s", text);
                atomic_store(&c->reported, (int)st);
            }
            atomic_store(&comm->coll_kick, true);
            return;
        }
    }
    /* Not in flight here: this rank may not have reached the call yet. */
    abort_note_t *n = &cs->notes[cs->nnotes++ % ABORT_NOTES];
    *n = (abort_note_t){.cid = cid, .seq = seq, .status = st};
    snprintf(n->detail, sizeof(n->detail), "%s", text);
}

static void fail_as(tern__coll_t *c, tern_status_t st, bool tell, const char *why)
{
    if (c->failing != TERN_OK)
        return;
    c->failing = st;
    snprintf(c->detail, sizeof(c->detail), "%s #%" PRIu32 " on group %" PRIu32 " failed: %s",
             c->op_name, c->seq, c->g->cid, why);
    tern_warn("%s", c->detail);

    tern__comm_t *comm = c->g->comm;
    tern__comm_lock(comm);
    if (tell)
        send_abort(c);
    for (size_t i = c->first; i < c->nsteps; i++) {
        step_t *s = &c->steps[i];
        if (s->state == STEP_POSTED)
            tern__p2p_cancel(comm, s->req);
    }
    tern__comm_unlock(comm);
}

static void fail(tern__coll_t *c, tern_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void fail(tern__coll_t *c, tern_status_t st, const char *fmt, ...)
{
    char why[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    fail_as(c, st, true, why);
}

static bool ready(const tern__coll_t *c, const step_t *s)
{
    for (int k = 0; k < 2; k++)
        if (s->dep[k] >= 0 && c->steps[s->dep[k]].state != STEP_DONE)
            return false;
    return true;
}

static const char *step_verb(const step_t *s)
{
    return s->kind == STEP_SEND ? "sending to" : "receiving from";
}

/*
 * The comm lock as the engine holds it. A run of posts and reaps shares one
 * hold (a small all_reduce took the lock eight times, a tenth of its time);
 * local steps (a reduction may take milliseconds: the transport must move
 * meanwhile), failure reports and the profiler run without it.
 */
typedef struct hold {
    tern__comm_t *comm;
    bool held;
} hold_t;

static void hold_take(hold_t *h)
{
    if (!h->held) {
        tern__comm_lock(h->comm);
        h->held = true;
    }
}

static void hold_drop(hold_t *h)
{
    if (h->held) {
        tern__comm_unlock(h->comm);
        h->held = false;
    }
}

/* A local step on this many bytes keeps the hold: it is over in well under
 * a microsecond, less than letting go and taking the lock again. */
#define HOLD_LOCAL_MAX 4096

static void hold_drop_for(hold_t *h, size_t bytes)
{
    if (bytes > HOLD_LOCAL_MAX)
        hold_drop(h);
}

/* A posted step's request completed: take its outcome. */
static void reap(tern__coll_t *c, step_t *s, hold_t *h)
{
    tern_msg_info_t info;
    tern_status_t st;

    hold_take(h);
    bool withdrew = s->req->peer_withdrew;
    st = tern__req_release(h->comm, s->req, &info);
    s->req = NULL;
    s->state = STEP_DONE;
    int w = c->g->world[s->peer];
    if (st == TERN_OK && (s->kind != STEP_RECV || info.len == s->n))
        return;
    hold_drop(h);
    if (st == TERN_ERR_CANCELED && c->failing != TERN_OK)
        return;
    if (withdrew && c->failing == TERN_OK) {
        /* w's call failed and took back its end (a refused put or read, a
         * CANCELED FIN or RTR_FAIL). Why is on its way: w's ABORT, sent before it
         * withdrew, or the one that failed w, which went to every member;
         * over tcp the second can lose the race against the refusal. The
         * refusal itself ("access denied") says nothing of the cause, so
         * wait for the report (advance), a while at most. */
        if (c->withdrew == 0) {
            tern_debug("%s #%" PRIu32 " on group %" PRIu32 ": rank %d withdrew its end (%s); "
                       "waiting for the report of why", c->op_name, c->seq, c->g->cid, w,
                       tern_status_name(st));
            c->withdrew = w + 1;
            c->withdrew_at = tern_clock_ns();
        }
        return;
    }
    if (s->kind == STEP_RECV && (st == TERN_ERR_TRUNCATED || (st == TERN_OK && info.len != s->n))) {
        fail(c, TERN_ERR_MISMATCH,
             "rank %d sent %zu bytes where %zu were expected (do counts, dtypes or "
             "TERN_COLL_* settings differ across ranks?)",
             w, info.len, s->n);
        return;
    }
    if (st == TERN_ERR_TRUNCATED) {
        fail(c, TERN_ERR_MISMATCH, "rank %d expected fewer than the %zu bytes sent to it (do "
             "counts or dtypes differ across ranks?)", w, s->n);
        return;
    }
    if (st == TERN_ERR_MISMATCH) {
        fail(c, TERN_ERR_MISMATCH, "rank %d called it with another count, dtype, op, root or "
             "algorithm (its end of a %zu-byte message carries another signature)", w, s->n);
        return;
    }
    if (st != TERN_OK)
        fail(c, st, "%s rank %d: %s", step_verb(s), w, tern_strerror(st));
}

/* A profiled collective's messages are events of their own, children of
 * the collective's, from post to completion: the job trace links each to its
 * other end. op was begun before the post; the request ends it. */
static void prof_step(tern__coll_t *c, step_t *s, tern__prof_op_t *op)
{
    op->parent = c->req.prof.id;
    op->dir = s->kind == STEP_SEND ? TERN_PROF_DIR_SEND : TERN_PROF_DIR_RECV;
    tern__req_prof_attach(s->req, op);
}

/* Start a step whose inputs are ready. */
static void launch(tern__coll_t *c, step_t *s, hold_t *h)
{
    tern__comm_t *comm = c->g->comm;
    tern_status_t st = TERN_OK;
    tern__prof_op_t op;
    int w;

    switch ((step_kind_t)s->kind) {
    case STEP_SEND:
    case STEP_RECV:
        w = c->g->world[s->peer];
        memset(&op, 0, sizeof(op));
        if (c->req.prof.name != NULL) {
            hold_drop(h);
            tern__prof_op_begin(&op, comm, w, TERN_PROF_KIND_P2P, "%s %s", c->op_name,
                                s->kind == STEP_SEND ? "send" : "recv");
        }
        hold_take(h);
        /* An eager send is over as it is posted: no request to make and
         * reap, unless profiled (its event rides on the request). */
        bool sent = false;
        if (s->kind == STEP_SEND && op.name == NULL)
            st = tern__p2p_send_eager_locked(comm, c->g->cid, s->a, s->n, w, (int)wire_tag(c, s),
                                             c->shape, &sent);
        if (st == TERN_OK && sent) {
            s->state = STEP_DONE;
            return;
        }
        if (st == TERN_OK && s->kind == STEP_SEND)
            st = tern__p2p_isend_locked(comm, c->g->cid, s->a, s->n, w, (int)wire_tag(c, s),
                                        TERN__P2P_RTR | TERN__P2P_WAY(c->way), c->shape, &s->req);
        else if (st == TERN_OK)
            st = tern__p2p_irecv_locked(comm, c->g->cid, s->dst, s->n, w, (int)wire_tag(c, s),
                                        TERN__P2P_RTR, c->shape, &s->req);
        if (st != TERN_OK) {
            hold_drop(h);
            tern__prof_op_drop(&op);
            s->state = STEP_DONE;
            fail(c, st, "%s rank %d: %s", step_verb(s), w, tern_last_error());
            return;
        }
        if (op.name != NULL) {
            hold_drop(h);
            prof_step(c, s, &op);
            hold_take(h);
        }
        s->state = STEP_POSTED;
        if (atomic_load_explicit(&s->req->done, memory_order_acquire))
            reap(c, s, h);
        return;
    case STEP_REDUCE:
        hold_drop_for(h, s->n * c->es);
        /* The call's buffers were checked as it was made and the steps cut
         * them on element boundaries: below the pool's threshold, the kernel
         * alone (tern__reduce_par's checks cost more than a few elements). */
        if (c->kernel != NULL && s->n * c->es < TERN__REDUCE_PAR_MIN_BYTES)
            c->kernel(s->dst, s->a, s->b, s->n);
        else
            st = tern__reduce_par(tern_ctx_pool(c->g->ctx), c->op, c->dtype, s->dst, s->a, s->b,
                                  s->n);
        break;
    case STEP_COPY:
        hold_drop_for(h, s->n);
        if (s->n > 0 && s->dst != s->a)
            memcpy(s->dst, s->a, s->n);
        break;
    case STEP_SCALE:
        hold_drop_for(h, s->n * c->es);
        st = tern__reduce_scale(c->dtype, s->dst, s->n, (uint64_t)c->g->size);
        break;
    }
    s->state = STEP_DONE;
    if (st != TERN_OK) {
        hold_drop(h);
        fail(c, st, "local step: %s", tern_last_error());
    }
}

/* Peers of posted steps that have not answered, for the timeout's message. */
static void describe_pending(const tern__coll_t *c, char *buf, size_t size)
{
    size_t used = 0;
    int listed = 0;
    buf[0] = '\0';
    for (size_t i = c->first; i < c->nsteps && used + 32 < size; i++) {
        const step_t *s = &c->steps[i];
        if (s->state != STEP_POSTED)
            continue;
        int w = c->g->world[s->peer];
        bool seen = false;
        for (size_t j = c->first; j < i && !seen; j++)
            seen = c->steps[j].state == STEP_POSTED && c->g->world[c->steps[j].peer] == w;
        if (seen)
            continue;
        used += (size_t)snprintf(buf + used, size - used, "%s%d", listed++ ? ", " : "", w);
    }
}

/* Fail if a rank this call still has to send to or hear from is known lost,
 * or nothing moved for the timeout. A lost member this rank is done with
 * does not fail the call: its data already arrived, and the ranks that still
 * need it fail and send ABORT. */
static void check_health(tern__coll_t *c, uint64_t now)
{
    tern__comm_t *comm = c->g->comm;
    bool any_lost = false;
    for (int r = 0; r < c->g->size && !any_lost; r++)
        any_lost = comm->peer_failed[c->g->world[r]] != TERN_OK;
    for (size_t i = c->first; any_lost && i < c->nsteps; i++) {
        const step_t *s = &c->steps[i];
        if (s->state == STEP_DONE || (s->kind != STEP_SEND && s->kind != STEP_RECV))
            continue;
        int w = c->g->world[s->peer];
        if (comm->peer_failed[w] != TERN_OK) {
            fail(c, comm->peer_failed[w], "rank %d was lost", w);
            return;
        }
    }
    if (c->timeout_ns >= 0 && now - c->last_move > (uint64_t)c->timeout_ns) {
        char peers[128];
        describe_pending(c, peers, sizeof(peers));
        fail(c, TERN_ERR_TIMEOUT, "no progress for %lld ms; waiting on rank(s) %s",
             (long long)(c->timeout_ns / 1000000), peers[0] ? peers : "(none posted)");
    }
}

/* The collectives state (lock held). It exists once any group does, so a
 * collective in flight never makes it: no lock round of tern__coll_state's
 * own, three of which were a tenth of a small all_reduce. */
static coll_state_t *state_locked(tern__comm_t *comm)
{
    return comm->coll_state;
}

/* Hand the outcome to the waiter. After this, c belongs to whoever waits. */
static void finish(tern__coll_t *c, hold_t *h)
{
    tern__comm_t *comm = c->g->comm;
    hold_take(h);
    coll_state_t *cs = state_locked(comm);
    for (tern__coll_t **pp = &cs->active; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    }
    atomic_fetch_sub(&comm->coll_active, 1);
    /* Timed only while its slot still holds its signature. */
    if (c->way_slot != NULL && c->failing == TERN_OK && c->way_slot->shape == c->shape)
        tern__way_took(c->way_slot, c->way_i, c->way, tern_clock_ns() - c->way_t0);
    if (c->failing != TERN_OK && c->g->broken == TERN_OK) {
        c->g->broken = c->failing;
        snprintf(c->g->broken_detail, sizeof(c->g->broken_detail), "%s", c->detail);
    }
    atomic_flag_clear(&c->busy);
    tern__req_complete(&c->req, c->failing);
    hold_drop(h);
}

/* How long a call whose peer withdrew waits for the report of why: the
 * report is a message behind, so a second is plenty; TERN_TIMEOUT if
 * shorter. */
#define WITHDRAW_WAIT_NS 1000000000ll

static uint64_t withdraw_wait(const tern__coll_t *c)
{
    int64_t t = c->timeout_ns >= 0 && c->timeout_ns < WITHDRAW_WAIT_NS ? c->timeout_ns
                                                                        : WITHDRAW_WAIT_NS;
    return (uint64_t)t;
}

/* Move c on as far as it goes (busy held), with h, held or not, as the
 * caller's hold of the lock; it may come back either way. Returns true once c
 * finished, after which c must not be touched. */
static bool advance(tern__coll_t *c, bool check_time, hold_t *h)
{
    bool moved, any = false;
    if (c->failing == TERN_OK && atomic_load_explicit(&c->reported, memory_order_relaxed) != TERN_OK) {
        char why[200], peers[64] = "";
        hold_take(h);
        snprintf(why, sizeof(why), "%s", c->reported_detail);
        tern_status_t st = (tern_status_t)atomic_load(&c->reported);
        /* A timeout reported by a rank that waits on us, or on a rank we
         * wait on, names no rank this one waits on; the ranks that wait on
         * one that stopped calling would otherwise pass on whoever timed out
         * first, and none would name it (docs/collectives.md, "Failures"). */
        if (st == TERN_ERR_TIMEOUT)
            describe_pending(c, peers, sizeof(peers));
        hold_drop(h);
        if (peers[0] != '\0') {
            size_t used = strlen(why);
            snprintf(why + used, sizeof(why) - used, "; this rank waits on rank(s) %s", peers);
        }
        fail_as(c, st, false, why);
    }
    do {
        moved = false;
        for (size_t i = c->first; i < c->nsteps; i++) {
            step_t *s = &c->steps[i];
            if (s->state == STEP_POSTED) {
                if (!atomic_load_explicit(&s->req->done, memory_order_acquire))
                    continue;
                reap(c, s, h);
                moved = true;
            } else if (s->state == STEP_IDLE && c->failing == TERN_OK && c->withdrew == 0 &&
                       ready(c, s)) {
                launch(c, s, h);
                moved = true;
            }
            if (s->state == STEP_DONE && i == c->first)
                c->first++;
        }
        any |= moved;
    } while (moved);

    bool outstanding = false;
    for (size_t i = c->first; i < c->nsteps && !outstanding; i++)
        outstanding = c->steps[i].state == STEP_POSTED;
    if ((c->failing == TERN_OK && c->withdrew == 0 && c->first == c->nsteps) ||
        (c->failing != TERN_OK && !outstanding)) {
        finish(c, h);
        return true;
    }
    c->moved |= any;
    if (check_time) {
        hold_drop(h); /* check_health may fail c, which takes the lock */
        uint64_t now = tern_clock_ns();
        if (c->moved || c->last_move == 0) {
            c->last_move = now;
            c->moved = false;
        } else if (c->failing == TERN_OK) {
            check_health(c, now);
        }
        const uint64_t wait = withdraw_wait(c);
        if (c->failing == TERN_OK && c->withdrew != 0 && now - c->withdrew_at > wait)
            fail(c, TERN_ERR_CANCELED,
                 "rank %d withdrew its end of a message (its call failed there); no report of "
                 "why reached this rank in %lld ms", c->withdrew - 1, (long long)(wait / 1000000));
        if (c->failing != TERN_OK && !outstanding) {
            finish(c, h);
            return true;
        }
    }
    return false;
}

/* Let go of c after advancing it (c not finished). The flag is cleared
 * before missed is read, and a pass that finds c taken sets missed before
 * trying c again: sequentially consistent, one of the two sees the other, so
 * a completion is never left with no one to move its collective on. */
static void let_go(tern__comm_t *comm, tern__coll_t *c)
{
    coll_state_t *cs = comm->coll_state;
    atomic_flag_clear(&c->busy);
    if (atomic_load(&cs->missed) && atomic_exchange(&cs->missed, false))
        atomic_store(&comm->coll_kick, true);
}

static void progress_hook(tern__comm_t *comm, bool check_time, bool locked)
{
    tern__coll_t *pick[PICK_MAX];
    size_t n = 0;
    bool more = false;

    hold_t h = {.comm = comm, .held = locked};
    hold_take(&h);
    if (check_time && comm->rtr_waits != NULL)
        tern__p2p_rtr_tick(comm, tern_clock_ns());
    coll_state_t *cs = state_locked(comm);
    /* coll_active counts the list: both change together under the lock. */
    size_t total = atomic_load_explicit(&comm->coll_active, memory_order_relaxed), start = 0;
    if (total > PICK_MAX) { /* more than one pass takes: from the turn's place on, round */
        start = cs->turn++ % total;
        more = true;
    }
    for (int round = 0; round < 2 && n < PICK_MAX; round++) {
        size_t i = 0;
        for (tern__coll_t *c = cs->active; c != NULL && n < PICK_MAX; c = c->next, i++) {
            if ((i >= start) != (round == 0))
                continue;
            /* Taken under the lock: a collective in the list is not
             * finished, so not freed, and once busy is ours it cannot finish
             * under us. */
            if (!atomic_flag_test_and_set(&c->busy)) {
                pick[n++] = c;
            } else {
                atomic_store(&cs->missed, true);
                if (!atomic_flag_test_and_set(&c->busy)) /* its owner let go meanwhile */
                    pick[n++] = c;
            }
        }
    }
    for (size_t i = 0; i < n; i++)
        if (!advance(pick[i], check_time, &h))
            let_go(comm, pick[i]);
    hold_drop(&h);
    if (more)
        atomic_store(&comm->coll_kick, true);
}

static void free_hook(tern_request_t *req)
{
    tern__coll_t *c = req->coll;
    if (req->status != TERN_OK)
        tern__error(req->status, "%s", c->detail);
    tern__coll_discard(c);
}

void tern__coll_install_hooks(tern__comm_t *comm)
{
    atomic_store_explicit(&comm->coll_progress, progress_hook, memory_order_release);
    comm->coll_free = free_hook;
}

/* The slot of c's signature on its group (lock held), or the one used
 * longest ago, made over: every member makes the same calls in the same
 * order, so they keep and drop the same slots. */
static tern__way_t *way_slot(tern_group_t *g, uint32_t shape)
{
    tern__way_t *old = way_find(g, shape);
    if (old != NULL)
        return old;
    old = &g->ways[0]; /* a free slot was never used: used 0 */
    for (int i = 1; i < TERN__WAY_SLOTS; i++)
        if (g->ways[i].used < old->used)
            old = &g->ways[i];
    *old = (tern__way_t){.shape = shape};
    return old;
}

/* c's way by its signature's call count (lock held), and its start. */
static void way_begin(tern__coll_t *c)
{
    tern__way_t *w = way_slot(c->g, c->shape);
    w->used = (uint64_t)c->seq + 1;
    c->way_slot = w;
    c->way_i = w->calls++;
    bool chose;
    c->way = tern__way_pick(w, c->way_i, c->g->rank == 0, &chose);
    if (chose)
        send_way(c->g, w);
    c->way_t0 = tern_clock_ns();
}

tern_status_t tern__coll_start(tern__coll_t *c, tern_request_t **req)
{
    tern__comm_t *comm = c->g->comm;
    coll_state_t *cs;

    if (c->oom) {
        tern_status_t st = tern__error(TERN_ERR_NO_MEMORY, "%s: no memory for its schedule",
                                       c->op_name);
        tern__coll_discard(c);
        return st;
    }
    /* Profiled from here to the request's completion (outside the lock: a
     * profiler op may measure clocks). */
    if (tern__prof_recording()) /* else c->req.prof stays as tern__coll_new cleared it */
        tern__prof_op_begin(&c->req.prof, comm, -1, TERN_PROF_KIND_COLL, "%s", c->op_name);
    atomic_flag_test_and_set(&c->busy);
    hold_t h = {.comm = comm};
    hold_take(&h);
    cs = state_locked(comm);
    for (unsigned i = 0; i < ABORT_NOTES && i < cs->nnotes; i++) {
        abort_note_t *n = &cs->notes[i];
        if (n->cid == c->g->cid && n->seq == c->seq && n->status != TERN_OK) {
            snprintf(c->reported_detail, sizeof(c->reported_detail), "%s", n->detail);
            atomic_store(&c->reported, (int)n->status);
            n->status = TERN_OK;
        }
    }
    if (c->way_on)
        way_begin(c);
    c->next = cs->active;
    cs->active = c;
    atomic_fetch_add(&comm->coll_active, 1);
    /* The first posts go out in this hold of the lock, and a blocking call
     * waits from it. */
    if (!advance(c, false, &h))
        let_go(comm, c);
    if (req != NULL) {
        hold_drop(&h);
        tern__comm_kick(comm);
        *req = &c->req;
        return TERN_OK;
    }
    if (h.held)
        return tern__request_wait_locked(&c->req, -1, NULL);
    return tern_request_wait(&c->req, -1, NULL);
}
