/*
 * RPC: workers, calls and futures, remote objects and RRefs (docs/rpc.md has
 * the protocol). Everything here runs on the transport directly, with the
 * immediate classes RPC_REQUEST (calls and RRef control messages) and
 * RPC_REPLY.
 *
 * Locking: all RPC state is guarded by the comm lock, the one that guards the
 * transport, since every change of it either sends or comes from a message.
 * Messages arrive under it (on whichever thread progresses); handlers and
 * callbacks run on the pool without it. A message to this worker itself is
 * handled at once, in place of a send.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tern/clock.h>
#include <tern/imm.h>
#include <tern/pool.h>
#include <tern/prof.h>
#include <tern/store.h>

#include "core/bytes.h"
#include "core/context.h"
#include "core/error.h"
#include "core/hash.h"
#include "core/log.h"
#include "p2p/comm.h"
#include "prof/prof.h"
#include "rpc/rpc_int.h"

#define MAX_TENSORS 64
#define MAX_RREFS 64
#define MAX_CBS 8
#define HDR 64           /* bytes of every message's header */
#define RREF_WIRE 32     /* bytes of an RRef argument */
#define TENSOR_HDR 16    /* bytes before a tensor's descriptor */
#define RNDV_WIRE 16     /* raddr, rkey length, pad; then the key */
#define MAX_BLOB ((size_t)512 << 10)
#define MAX_ERROR 1024
/* A tensor the network declares larger than this is refused before any
 * allocation. */
#define MAX_TENSOR_BYTES ((uint64_t)1 << 40)

enum msg_type {
    M_CALL = 1,  /* run a function (or a method: target names the RRef); reply */
    M_REMOTE,    /* run a function or constructor into a new RRef; no reply */
    M_TO_HERE,   /* send the value of RRef target; reply */
    M_REPLY,     /* status, error text, value */
    M_FORK,      /* a user got RRef target's fork aux1 from parent aux2 (fork aux3) */
    M_ACCEPT,    /* the owner registered fork aux1, child of the receiver's fork aux3 */
    M_DELETE,    /* a user dropped fork aux1 of RRef target */
    M_RELEASE,   /* the caller has pulled call id's results: free them */
    M_PULLED,    /* the target has pulled call id's arguments: they are free */
    M_TYPE_MAX
};

/* Header (little-endian):
 *  0 u8 type  1 u8 flags  2 u16 name/error length  4 u32 ntensors
 *  8 u64 call id  16 u64 target RRef  24 u64 aux1  32 u64 aux2  40 u64 aux3
 * 48 u32 nrrefs  52 u32 blob length  56 i32 status  60 u32 profiler events length
 * then the name (or error text), padded to 8; RRefs; tensors; blob; then, in a
 * reply to a profiled call, the handler's profiler events (prof/record.c).
 * Flags: the prof bit and config that go into the message's immediate (the
 * target reads them there, not here). */
#define F_PROF 0x08u
#define F_PROF_CFG 0x07u

/* RRef argument flags */
#define RA_REGISTERED 1u /* the sender is the owner and registered the fork */
#define RA_CHILD 2u      /* the receiver must register it with the owner */

/* Tensor modes */
#define T_INLINE 0u
#define T_RNDV 1u

typedef enum owner_state { O_PENDING, O_READY, O_FAILED } owner_state_t;

typedef struct fork_ent {
    uint64_t fork;
    int holder;
} fork_ent_t;

typedef struct tern_rpc_call call_t;

/* A result tensor of a call: its memory is the call's unless borrowed (to_here
 * answers from the owner's value). */
typedef struct result {
    tern_tensor_t t;
    tern_mr_t *mr;
    bool borrowed;
} result_t;

/* What an RRef points at, on its owner. */
typedef struct owner {
    uint64_t id;
    UT_hash_handle hh;
    owner_state_t state;
    bool created;     /* its REMOTE (or tern_rref_local) has arrived */
    tern_status_t status;
    char *error;
    const tern__rpc_entry_t *cls; /* an object: its class */
    void *obj;
    /* a value */
    tern_tensor_t *tensors;
    size_t ntensors;
    void **bufs;
    size_t nbufs;
    void *blob;
    size_t blob_len;
    tern_rref_t **rrefs; /* [nrrefs] the value's RRefs: handles of this worker */
    size_t nrrefs;
    fork_ent_t *forks;
    size_t nforks, capf;
    int busy;         /* calls using it now */
    call_t *waiters;  /* calls waiting for it to be ready */
} owner_t;

typedef struct rpc rpc_t;

struct tern_rref {
    rpc_t *rpc;
    int owner;
    uint64_t id, fork;
    atomic_int refs;
    int children;     /* forks passed on, not yet accepted by the owner (under lock) */
    bool dropped;     /* refs reached 0 while children were pending */
};

/* A fork this worker passed on, until the owner accepts it. */
typedef struct child {
    struct child *next;
    uint64_t fork;
    int to;
    tern_rref_t *parent;
} child_t;

struct tern_future {
    rpc_t *rpc;
    atomic_int done;
    atomic_int refs;  /* the user, the table while in flight, a pending callback run */
    tern_status_t status;
    char *error;
    tern_rpc_value_t value;
    tern_tensor_t *tensors;
    void *msg;        /* the reply (inline payloads and blob point into it) */
    void **bufs;      /* pulled payloads */
    tern_mr_t **mrs;
    size_t nbufs;
    tern_rref_t **rrefs; /* [value.nrrefs] the result's RRefs: the future's handles */
    int gets;         /* pulls in flight */
    /* in flight */
    uint64_t call_id;
    UT_hash_handle hh;
    int target;
    bool timed, receiving;
    bool late;        /* its deadline passed while the target may still read its arguments */
    uint64_t deadline;
    int64_t timeout_ns;
    char what[2 * TERN_RPC_NAME_MAX + 32]; /* "rpc 'add' to worker1", for errors */
    tern__prof_op_t prof;         /* profiled: from issue to completion */
    uint8_t *prof_events;         /* the reply's events, filed at completion */
    size_t prof_events_len;
    uint64_t prof_bytes;
    tern_mr_t **arg_mrs;          /* [narg_mrs] registered arguments, until completion */
    void **arg_tmp;               /* strided arguments gathered for the pull */
    size_t narg_mrs;
    struct {
        tern_future_cb cb;
        void *arg;
    } cbs[MAX_CBS];
    int ncbs;
};

struct tern_rpc_call {
    rpc_t *rpc;
    uint8_t type;
    int caller;
    uint64_t call_id;
    const tern__rpc_entry_t *entry;
    owner_t *self;       /* the RRef a method or to_here runs on (busy held) */
    owner_t *made;       /* M_REMOTE: the RRef it fills (busy held) */
    char name[2 * TERN_RPC_NAME_MAX + 2];
    void *msg;           /* the request (inline payloads and blob point into it) */
    tern_tensor_t *args;  /* [value.ntensors] */
    tern_rpc_value_t value;
    void **bufs;          /* [nbufs] pulled arguments, and their registrations */
    tern_mr_t **mrs;
    size_t nbufs;
    int gets;
    tern_status_t get_status;
    tern_rref_t **rrefs;  /* [nrrefs] */
    size_t nrrefs;
    /* results: each apart, so a tensor handed to the handler stays put */
    result_t **res;
    size_t nres, capres;
    void *res_blob;
    size_t res_blob_len;
    tern_rref_t **res_rrefs; /* [nres_rrefs] handles the result passes on */
    size_t nres_rrefs;
    char *error;
    bool deferred;
    bool in_handler;           /* its handler runs now (under lock) */
    bool complete_early;       /* completed (deferred) before its handler returned */
    tern_status_t early_status;
    tern__prof_capture_t *prof; /* the caller profiles this call */
    call_t *next;
};

struct rpc {
    tern_ctx_t *ctx;
    tern__comm_t *comm;
    tern_pool_t *pool;
    int rank, world;
    char (*names)[TERN_RPC_NAME_MAX + 1];
    int64_t timeout_ns;
    unsigned threads, window;
    size_t eager_limit, max_send;
    bool closed;
    bool agreed; /* closed by a graceful shutdown every worker agreed on */
    /* calls out */
    tern_future_t *inflight;   /* by call id */
    unsigned *window_used;     /* [world] */
    uint64_t next_call;
    unsigned timers;
    uint64_t next_check;       /* the clock time of the next deadline scan */
    /* calls in */
    unsigned running;          /* handlers on the pool now */
    call_t *backlog_head, *backlog_tail;
    call_t *held;              /* replied with pulled results: until M_RELEASE */
    unsigned tasks;            /* pool tasks that name rpc (handlers, callbacks) */
    unsigned deferred;         /* calls deferred and not yet complete */
    unsigned pulling;          /* calls and futures with pulls in flight */
    /* RRefs */
    owner_t *owned;
    bool owned_iter; /* a loop walks `owned`: freed values' RRefs wait in doomed */
    tern_rref_t **doomed;
    size_t ndoomed, capdoomed;
    child_t *children;
    uint64_t next_id;
    /* graceful shutdown: messages sent and received */
    uint64_t sent, handled;
};

/* ---- small helpers ---- */

static rpc_t *rpc_of(tern_ctx_t *ctx)
{
    tern__comm_t *comm = tern__comm(ctx);
    return comm != NULL ? comm->rpc_state : NULL;
}

static tern_status_t live(tern_ctx_t *ctx, rpc_t **out, const char *who)
{
    rpc_t *rpc = rpc_of(ctx);
    if (rpc == NULL)
        return tern__error(TERN_ERR_CLOSED, "%s: tern_rpc_init has not been called", who);
    if (rpc->closed)
        return tern__error(TERN_ERR_CLOSED, "%s: RPC is shut down", who);
    *out = rpc;
    return TERN_OK;
}

static size_t pad8(size_t n)
{
    return (n + 7) & ~(size_t)7;
}

/* Payload memory: cache-line aligned, whole lines (aligned_alloc's rule), never NULL for 0. */
static void *alloc64(size_t n)
{
    if (tern__prof_recording())
        tern__prof_alloc((int64_t)n);
    return aligned_alloc(64, n == 0 ? 64 : (n + 63) & ~(size_t)63);
}

/* Bytes the tensors hold, for the profiler's events. */
static uint64_t tensors_bytes(const tern_tensor_t *t, size_t n)
{
    uint64_t bytes = 0;
    for (size_t i = 0; t != NULL && i < n; i++) {
        size_t nb = 0;
        if (tern_tensor_nbytes(&t[i], &nb) == TERN_OK)
            bytes += nb;
    }
    return bytes;
}

static char *dup_printf(const char *fmt, ...) TERN_PRINTF(1, 2);
static char *dup_printf(const char *fmt, ...)
{
    char buf[MAX_ERROR];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    return strdup(buf);
}

/* A new id, unique across workers: the rank above 40 bits of a counter. */
static uint64_t new_id(rpc_t *rpc)
{
    return (uint64_t)rpc->rank << 40 | (++rpc->next_id & (((uint64_t)1 << 40) - 1));
}

static const char *wname(const rpc_t *rpc, int r)
{
    return r >= 0 && r < rpc->world ? rpc->names[r] : "?";
}

static tern_status_t resolve(rpc_t *rpc, const char *to, int *rank)
{
    if (to == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "no worker named");
    for (int r = 0; r < rpc->world; r++)
        if (strcmp(rpc->names[r], to) == 0) {
            *rank = r;
            return TERN_OK;
        }
    return tern__error(TERN_ERR_NOT_FOUND, "no worker is named '%s'", to);
}

/* ---- messages ---- */

typedef struct hdr {
    uint8_t type, flags;
    uint16_t text_len;
    uint32_t ntensors;
    uint64_t call_id, target, aux1, aux2, aux3;
    uint32_t nrrefs, blob_len;
    int32_t status;
    uint32_t events_len;
} hdr_t;

static void put_hdr(uint8_t *p, const hdr_t *h)
{
    memset(p, 0, HDR);
    p[0] = h->type;
    p[1] = h->flags;
    tern__put_le16(p + 2, h->text_len);
    tern__put_le32(p + 4, h->ntensors);
    tern__put_le64(p + 8, h->call_id);
    tern__put_le64(p + 16, h->target);
    tern__put_le64(p + 24, h->aux1);
    tern__put_le64(p + 32, h->aux2);
    tern__put_le64(p + 40, h->aux3);
    tern__put_le32(p + 48, h->nrrefs);
    tern__put_le32(p + 52, h->blob_len);
    tern__put_le32(p + 56, (uint32_t)h->status);
    tern__put_le32(p + 60, h->events_len);
}

static void get_hdr(const uint8_t *p, hdr_t *h)
{
    h->type = p[0];
    h->flags = p[1];
    h->text_len = tern__get_le16(p + 2);
    h->ntensors = tern__get_le32(p + 4);
    h->call_id = tern__get_le64(p + 8);
    h->target = tern__get_le64(p + 16);
    h->aux1 = tern__get_le64(p + 24);
    h->aux2 = tern__get_le64(p + 32);
    h->aux3 = tern__get_le64(p + 40);
    h->nrrefs = tern__get_le32(p + 48);
    h->blob_len = tern__get_le32(p + 52);
    h->status = (int32_t)tern__get_le32(p + 56);
    h->events_len = tern__get_le32(p + 60);
}

static void handle_msg(rpc_t *rpc, int src, uint32_t imm, const void *data, size_t len);

static void free_on_send(void *arg, tern_status_t status)
{
    (void)status;
    free(arg);
}

static _Atomic(tern__rpc_send_hook_fn) send_hook;
static void *send_hook_arg;

void tern__rpc_set_send_hook(tern__rpc_send_hook_fn fn, void *arg)
{
    if (fn != NULL)
        send_hook_arg = arg;
    atomic_store_explicit(&send_hook, fn, memory_order_release);
}

/*
 * Send buf[0..len) (malloc'd; this takes it) to rank dst (lock held), counted
 * for graceful shutdown's balance. To this worker itself the message is
 * handled here and now.
 */
static tern_status_t send_msg(rpc_t *rpc, int dst, uint8_t *buf, size_t len)
{
    tern_imm_class_t cls = buf[0] == M_REPLY ? TERN_IMM_RPC_REPLY : TERN_IMM_RPC_REQUEST;
    uint32_t imm = tern_imm_make(cls, (buf[1] & F_PROF) != 0, buf[1] & F_PROF_CFG,
                                 (uint32_t)tern__get_le64(buf + 8));
    tern__rpc_send_hook_fn hook = atomic_load_explicit(&send_hook, memory_order_acquire);
    if (hook != NULL) {
        uint8_t *out = hook(send_hook_arg, dst, buf, &len);
        if (out != buf) {
            free(buf);
            buf = out;
        }
    }
    rpc->sent++;
    if (dst == rpc->rank) {
        handle_msg(rpc, dst, imm, buf, len);
        free(buf);
        return TERN_OK;
    }
    tern_ep_t *ep;
    tern_status_t st = tern__comm_ep(rpc->comm, dst, &ep);
    if (st == TERN_OK) {
        tern_op_params_t op = {.field_mask = TERN_OP_PARAM_CB, .cb = free_on_send, .cb_arg = buf};
        st = tern_ep_send(ep, imm, buf, len, &op);
    }
    if (cls == TERN_IMM_RPC_REQUEST && (st == TERN_OK || st == TERN_INPROGRESS))
        tern__comm_kick(rpc->comm); /* its reply is background work */
    if (st == TERN_INPROGRESS)
        return TERN_OK; /* free_on_send frees it */
    free(buf);
    if (st != TERN_OK)
        rpc->sent--;
    return st;
}

/* A message of header only. */
static tern_status_t send_ctl(rpc_t *rpc, int dst, const hdr_t *h)
{
    uint8_t *buf = malloc(HDR);
    if (buf == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "rpc: out of memory");
    put_hdr(buf, h);
    return send_msg(rpc, dst, buf, HDR);
}

/* ---- owners ---- */

static owner_t *owner_find(rpc_t *rpc, uint64_t id)
{
    owner_t *o = NULL;
    HASH_FIND(hh, rpc->owned, &id, sizeof(id), o);
    return o;
}

static void owner_free_value(owner_t *o)
{
    for (size_t i = 0; i < o->nbufs; i++)
        free(o->bufs[i]);
    free(o->bufs);
    free(o->tensors);
    free(o->blob);
    o->bufs = NULL;
    o->tensors = NULL;
    o->blob = NULL;
    o->nbufs = o->ntensors = o->blob_len = 0;
}

static void rref_drop_locked(rpc_t *rpc, tern_rref_t *r);

/* Release the RRefs of freed values that waited for a loop over `owned` to
 * end (lock held). */
static void doomed_drain(rpc_t *rpc)
{
    while (rpc->ndoomed > 0)
        rref_drop_locked(rpc, rpc->doomed[--rpc->ndoomed]);
}

/* A freed value's RRefs go (lock held). Releasing one may free another owner
 * at once (a DELETE to this worker is handled inline), which a loop walking
 * `owned` must not see under its feet: then they wait in doomed. */
static void owner_drop_rrefs(rpc_t *rpc, owner_t *o)
{
    for (size_t i = 0; i < o->nrrefs; i++) {
        if (!rpc->owned_iter) {
            rref_drop_locked(rpc, o->rrefs[i]);
            continue;
        }
        if (rpc->ndoomed == rpc->capdoomed) {
            size_t cap = rpc->capdoomed ? rpc->capdoomed * 2 : 16;
            tern_rref_t **d = realloc(rpc->doomed, cap * sizeof(*d));
            if (d == NULL) {
                tern_error("rpc: out of memory: RRef %#llx is not released (its owner keeps it)",
                           (unsigned long long)o->rrefs[i]->id);
                continue;
            }
            rpc->doomed = d;
            rpc->capdoomed = cap;
        }
        rpc->doomed[rpc->ndoomed++] = o->rrefs[i];
    }
    free(o->rrefs);
    o->rrefs = NULL;
    o->nrrefs = 0;
}

/* Free o if nothing names it any more (lock held). The destructor runs here:
 * object destructors must not call back into RPC. */
static void owner_maybe_free(rpc_t *rpc, owner_t *o)
{
    if (o->nforks != 0 || o->busy != 0 || o->waiters != NULL)
        return;
    HASH_DEL(rpc->owned, o);
    owner_drop_rrefs(rpc, o);
    if (o->cls != NULL && o->obj != NULL && o->cls->dtor != NULL)
        o->cls->dtor(o->obj);
    owner_free_value(o);
    free(o->forks);
    free(o->error);
    free(o);
}

static tern_status_t owner_add_fork(owner_t *o, uint64_t fork, int holder)
{
    if (o->nforks == o->capf) {
        size_t cap = o->capf ? o->capf * 2 : 4;
        fork_ent_t *f = realloc(o->forks, cap * sizeof(*f));
        if (f == NULL)
            return tern__error(TERN_ERR_NO_MEMORY, "rpc: out of memory");
        o->forks = f;
        o->capf = cap;
    }
    o->forks[o->nforks++] = (fork_ent_t){fork, holder};
    return TERN_OK;
}

static void owner_drop_fork(rpc_t *rpc, owner_t *o, uint64_t fork)
{
    for (size_t i = 0; i < o->nforks; i++)
        if (o->forks[i].fork == fork) {
            o->forks[i] = o->forks[--o->nforks];
            owner_maybe_free(rpc, o);
            return;
        }
    tern_warn("rpc: RRef %#llx has no fork %#llx to drop", (unsigned long long)o->id,
              (unsigned long long)fork);
}

static owner_t *owner_new(rpc_t *rpc, uint64_t id)
{
    owner_t *o = calloc(1, sizeof(*o));
    if (o == NULL)
        return NULL;
    o->id = id;
    o->state = O_PENDING;
    tern__hash_oom = false;
    HASH_ADD(hh, rpc->owned, id, sizeof(o->id), o);
    if (tern__hash_oom) {
        free(o);
        return NULL;
    }
    return o;
}

/*
 * The owner of id, made in advance if its REMOTE has not arrived yet: a worker
 * given the RRef by a third may reach the owner first (different
 * connections, no order between them), with a FORK or a call that must then
 * wait for the creation, as PyTorch's getOrCreateOwnerRRef does.
 */
static owner_t *owner_get(rpc_t *rpc, uint64_t id)
{
    owner_t *o = owner_find(rpc, id);
    return o != NULL ? o : owner_new(rpc, id);
}

/* ---- RRef handles ---- */

static tern_rref_t *rref_new(rpc_t *rpc, int owner, uint64_t id, uint64_t fork)
{
    tern_rref_t *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return NULL;
    r->rpc = rpc;
    r->owner = owner;
    r->id = id;
    r->fork = fork;
    atomic_init(&r->refs, 1);
    return r;
}

/* The last handle is gone and no child is pending: tell the owner (lock
 * held). After a graceful shutdown every owner has destroyed its objects,
 * and this worker's own are gone once it is closed; but a worker closed
 * alone (tern_rpc_shutdown(ctx, 0)) still tells the others, which may go on
 * for long and would keep the object for ever. */
static void rref_finish(rpc_t *rpc, tern_rref_t *r)
{
    if (!rpc->agreed && !(rpc->closed && r->owner == rpc->rank)) {
        hdr_t h = {.type = M_DELETE, .target = r->id, .aux1 = r->fork};
        tern_status_t st = send_ctl(rpc, r->owner, &h);
        if (st != TERN_OK && rpc->comm->peer_failed[r->owner] == TERN_OK)
            tern_warn("rpc: cannot release RRef %#llx on %s: %s", (unsigned long long)r->id,
                      wname(rpc, r->owner), tern_last_error());
    }
    free(r);
}

static void rref_drop_locked(rpc_t *rpc, tern_rref_t *r)
{
    if (atomic_fetch_sub(&r->refs, 1) != 1)
        return;
    if (r->children > 0) {
        r->dropped = true;
        return;
    }
    rref_finish(rpc, r);
}

static void child_accepted(rpc_t *rpc, child_t *c)
{
    tern_rref_t *r = c->parent;
    free(c);
    if (--r->children == 0 && r->dropped)
        rref_finish(rpc, r);
}

/*
 * RRefs going out in one message (a call's arguments or a call's result) to
 * rank dst: a fork each for the receiver, by the cases of docs/rpc.md. The
 * sender that owns one registers the receiver's fork now; one that does not
 * makes a child its own fork waits for (rrefs_commit lists them, right
 * before the send). Lock held throughout.
 */
typedef struct rref_out {
    uint8_t wire[MAX_RREFS][RREF_WIRE];
    child_t *kids[MAX_RREFS];
    owner_t *reg_owner[MAX_RREFS];
    uint64_t reg_fork[MAX_RREFS];
    size_t n;
} rref_out_t;

static void rrefs_undo(rpc_t *rpc, rref_out_t *out)
{
    for (size_t i = 0; i < out->n; i++) {
        free(out->kids[i]);
        out->kids[i] = NULL;
        if (out->reg_owner[i] != NULL)
            owner_drop_fork(rpc, out->reg_owner[i], out->reg_fork[i]);
        out->reg_owner[i] = NULL;
    }
    out->n = 0;
}

static tern_status_t rrefs_pack(rpc_t *rpc, int dst, tern_rref_t *const *rrefs, size_t n,
                                const char *what, rref_out_t *out)
{
    tern_status_t st = TERN_OK;
    out->n = 0;
    for (size_t i = 0; i < n; i++) {
        tern_rref_t *r = rrefs[i];
        uint64_t fork = new_id(rpc);
        uint32_t flags;
        out->kids[i] = NULL;
        out->reg_owner[i] = NULL;
        if (r == NULL || r->rpc != rpc) {
            st = tern__error(TERN_ERR_INVALID_PARAM, "%s RRef %zu is not of this worker", what, i);
            break;
        }
        if (rpc->comm->peer_failed[r->owner] != TERN_OK) {
            /* Its object is gone, and a child of it would wait for ever. */
            st = tern__error(TERN_ERR_PEER_LOST, "%s RRef %zu: its owner %s (rank %d) was lost",
                             what, i, wname(rpc, r->owner), r->owner);
            break;
        }
        if (r->owner == rpc->rank) {
            owner_t *o = owner_find(rpc, r->id);
            if (o == NULL) {
                st = tern__error(TERN_ERR_NOT_FOUND, "%s RRef %zu is gone", what, i);
                break;
            }
            if ((st = owner_add_fork(o, fork, dst)) != TERN_OK)
                break;
            out->reg_owner[i] = o;
            out->reg_fork[i] = fork;
            flags = RA_REGISTERED;
        } else {
            child_t *k = calloc(1, sizeof(*k));
            if (k == NULL) {
                st = tern__error(TERN_ERR_NO_MEMORY, "rpc: out of memory");
                break;
            }
            k->fork = fork;
            k->to = dst;
            k->parent = r;
            out->kids[i] = k;
            flags = RA_CHILD;
        }
        out->n = i + 1;
        uint8_t *w = out->wire[i];
        memset(w, 0, RREF_WIRE);
        tern__put_le32(w, (uint32_t)r->owner);
        tern__put_le32(w + 4, flags);
        tern__put_le64(w + 8, r->id);
        tern__put_le64(w + 16, fork);
        tern__put_le32(w + 24, (uint32_t)rpc->rank);
    }
    if (st != TERN_OK)
        rrefs_undo(rpc, out);
    return st;
}

/* The children are listed before the send: to this worker itself the
 * acceptance comes back inside it. */
static void rrefs_commit(rpc_t *rpc, rref_out_t *out)
{
    for (size_t i = 0; i < out->n; i++)
        if (out->kids[i] != NULL) {
            out->kids[i]->next = rpc->children;
            rpc->children = out->kids[i];
            out->kids[i]->parent->children++;
        }
}

/* The send failed after rrefs_commit: nothing went out, undo it all. */
static void rrefs_uncommit(rpc_t *rpc, rref_out_t *out)
{
    for (size_t i = 0; i < out->n; i++)
        if (out->kids[i] != NULL) {
            for (child_t **pp = &rpc->children; *pp != NULL; pp = &(*pp)->next)
                if (*pp == out->kids[i]) {
                    *pp = out->kids[i]->next;
                    child_accepted(rpc, out->kids[i]);
                    break;
                }
            out->kids[i] = NULL;
        }
    rrefs_undo(rpc, out);
}

/* ---- futures ---- */

/* The RRef handles of f's result go (lock held). */
static void future_drop_rrefs(rpc_t *rpc, tern_future_t *f)
{
    for (size_t i = 0; i < f->value.nrrefs; i++)
        rref_drop_locked(rpc, f->rrefs[i]);
    free(f->rrefs);
    f->rrefs = NULL;
    f->value.rrefs = NULL;
    f->value.nrrefs = 0;
}

/* Drop a reference to f; locked says whether this thread holds the lock
 * (a result's RRefs are released under it). */
static void future_unref(tern_future_t *f, bool locked)
{
    if (atomic_fetch_sub(&f->refs, 1) != 1)
        return;
    if (f->value.nrrefs > 0) {
        if (!locked)
            tern__comm_lock(f->rpc->comm);
        future_drop_rrefs(f->rpc, f);
        if (!locked)
            tern__comm_unlock(f->rpc->comm);
    }
    for (size_t i = 0; i < f->nbufs; i++)
        free(f->bufs[i]);
    free(f->bufs);
    free(f->mrs);
    free(f->arg_mrs);
    free(f->arg_tmp);
    free(f->tensors);
    free(f->msg);
    free(f->error);
    free(f);
}

static void run_callbacks(void *arg)
{
    tern_future_t *f = arg;
    rpc_t *rpc = f->rpc;
    for (int i = 0; i < f->ncbs; i++)
        f->cbs[i].cb(f, f->cbs[i].arg);
    tern__comm_lock(rpc->comm);
    rpc->tasks--;
    tern__comm_unlock(rpc->comm);
    future_unref(f, false);
}

/* The target has the arguments (or cannot read them any more): let them go. */
static void future_free_args(tern_future_t *f)
{
    for (size_t i = 0; i < f->narg_mrs; i++) {
        tern_mr_dereg(f->arg_mrs[i]);
        free(f->arg_tmp[i]);
    }
    f->narg_mrs = 0;
}

/* Finish f (lock held): out of the table, arguments released, callbacks queued. */
static void future_complete(rpc_t *rpc, tern_future_t *f, tern_status_t st, char *error)
{
    HASH_DEL(rpc->inflight, f);
    rpc->window_used[f->target]--; /* every call out holds a window place */
    if (f->timed) {
        rpc->timers--;
        atomic_fetch_sub(&rpc->comm->rpc_timers, 1);
    }
    future_free_args(f);
    f->status = st;
    f->error = error;
    if (st != TERN_OK && f->error == NULL)
        f->error = strdup(tern_strerror(st));
    if (st == TERN_OK)
        f->value.tensors = f->tensors;
    else
        future_drop_rrefs(rpc, f); /* no value to read them from: the owners may free */
    if (f->prof.name != NULL) {
        /* Filed before done: a caller that stops the profiler after its wait
         * finds the call. */
        uint64_t bytes = f->prof_bytes;
        if (st == TERN_OK)
            bytes += tensors_bytes(f->tensors, f->value.ntensors);
        tern__prof_op_end(&f->prof, bytes, f->prof_events, f->prof_events_len);
        free(f->prof_events);
        f->prof_events = NULL;
    }
    atomic_store_explicit(&f->done, 1, memory_order_release);
    if (f->ncbs > 0) {
        /* The table's reference passes to the callbacks' run. */
        rpc->tasks++;
        if (tern_pool_submit(rpc->pool, run_callbacks, f) == TERN_OK)
            return;
        rpc->tasks--;
        tern_error("rpc: cannot queue the callbacks of %s: %s; they do not run", f->what,
                   tern_last_error());
    }
    future_unref(f, true);
}

static void future_time_out(rpc_t *rpc, tern_future_t *f)
{
    future_complete(rpc, f, TERN_ERR_TIMEOUT,
                    dup_printf("%s timed out after %lld ms", f->what,
                               (long long)(f->timeout_ns / 1000000)));
}

/* ---- encoding values ---- */

/* What one tensor of a value needs on the wire. */
typedef struct tplan {
    const tern_tensor_t *t;
    size_t desc_len, nbytes;
    bool rndv;
    tern_mr_t *mr;
    void *tmp; /* a strided tensor gathered for the pull */
    uint8_t rkey[TERN_RKEY_MAX];
    size_t rkey_len;
} tplan_t;

/*
 * Plan tensors[0..n) for a message to dst whose other parts take fixed bytes:
 * small ones inline while the message stays under the transport's limit,
 * others registered for the receiver to pull (lock held). Adds to *size.
 */
static tern_status_t plan_tensors(rpc_t *rpc, int dst, const tern_tensor_t *ts, size_t n,
                                  tplan_t *plan, size_t *size)
{
    tern_status_t st;
    for (size_t i = 0; i < n; i++) {
        tplan_t *p = &plan[i];
        memset(p, 0, sizeof(*p));
        p->t = &ts[i];
        if (ts[i].device.type != TERN_DEVICE_CPU)
            return tern__error(TERN_ERR_UNSUPPORTED, "tensor %zu is not on the CPU", i);
        if ((st = tern_tensor_validate(&ts[i])) != TERN_OK ||
            (st = tern_tensor_nbytes(&ts[i], &p->nbytes)) != TERN_OK)
            return st;
        p->desc_len = tern_tensor_wire_desc_size(ts[i].ndim);
        *size += TENSOR_HDR + pad8(p->desc_len);
        bool small = p->nbytes <= rpc->eager_limit && *size + pad8(p->nbytes) <= rpc->max_send;
        if (small || dst == rpc->rank) {
            *size += pad8(p->nbytes);
            continue;
        }
        p->rndv = true;
        void *src = ts[i].data;
        if (!tern_tensor_is_contiguous(&ts[i])) {
            if ((p->tmp = malloc(p->nbytes)) == NULL)
                return tern__error(TERN_ERR_NO_MEMORY, "rpc: out of memory");
            if ((st = tern_tensor_gather(&ts[i], p->tmp, p->nbytes)) != TERN_OK)
                return st;
            src = p->tmp;
        }
        tern_mr_params_t mp = {.field_mask = TERN_MR_PARAM_ACCESS,
                               .access = TERN_ACCESS_LOCAL | TERN_ACCESS_REMOTE_READ};
        if ((st = tern_mr_reg(rpc->comm->tp, src, p->nbytes, &mp, &p->mr)) != TERN_OK)
            return st;
        p->rkey_len = sizeof(p->rkey);
        if ((st = tern_mr_pack(p->mr, p->rkey, &p->rkey_len)) != TERN_OK)
            return st;
        *size += RNDV_WIRE + pad8(p->rkey_len);
    }
    return TERN_OK;
}

static void plan_undo(tplan_t *plan, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        tern_mr_dereg(plan[i].mr);
        free(plan[i].tmp);
        plan[i].mr = NULL;
        plan[i].tmp = NULL;
    }
}

/* Write planned tensors at p; returns the end. */
static uint8_t *put_tensors(uint8_t *p, const tplan_t *plan, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const tplan_t *t = &plan[i];
        size_t got;
        memset(p, 0, TENSOR_HDR);
        tern__put_le32(p, t->rndv ? T_RNDV : T_INLINE);
        tern__put_le32(p + 4, (uint32_t)t->desc_len);
        tern__put_le64(p + 8, t->nbytes);
        p += TENSOR_HDR;
        memset(p, 0, pad8(t->desc_len));
        tern_tensor_encode_desc(t->t, p, t->desc_len, &got);
        p += pad8(t->desc_len);
        if (!t->rndv) {
            memset(p + t->nbytes, 0, pad8(t->nbytes) - t->nbytes);
            if (t->nbytes > 0)
                tern_tensor_gather(t->t, p, t->nbytes);
            p += pad8(t->nbytes);
        } else {
            memset(p, 0, RNDV_WIRE + pad8(t->rkey_len));
            tern__put_le64(p, (uint64_t)(uintptr_t)tern_mr_addr(t->mr));
            tern__put_le32(p + 8, (uint32_t)t->rkey_len);
            memcpy(p + RNDV_WIRE, t->rkey, t->rkey_len);
            p += RNDV_WIRE + pad8(t->rkey_len);
        }
    }
    return p;
}

/* ---- decoding values ---- */

/* Where a decoded tensor's payload is: inline (data set) or to pull. */
typedef struct tin {
    tern_tensor_t t;
    size_t nbytes;
    bool rndv;
    uint64_t raddr;
    const uint8_t *rkey;
    size_t rkey_len;
} tin_t;

/* Parse n tensors at *pp within end, checking every length. */
static tern_status_t get_tensors(const uint8_t **pp, const uint8_t *end, size_t n, tin_t *out)
{
    const uint8_t *p = *pp;
    tern_status_t st;
    for (size_t i = 0; i < n; i++) {
        tin_t *t = &out[i];
        if ((size_t)(end - p) < TENSOR_HDR)
            return tern__error(TERN_ERR_PROTOCOL, "tensor %zu: message cut short", i);
        uint32_t mode = tern__get_le32(p), desc_len = tern__get_le32(p + 4);
        uint64_t nbytes = tern__get_le64(p + 8);
        p += TENSOR_HDR;
        if (mode > T_RNDV || desc_len > TERN_TENSOR_WIRE_DESC_MAX ||
            (size_t)(end - p) < pad8(desc_len))
            return tern__error(TERN_ERR_PROTOCOL, "tensor %zu: bad header", i);
        if ((st = tern_tensor_decode_desc(p, desc_len, &t->t, NULL)) != TERN_OK)
            return tern__error(TERN_ERR_PROTOCOL, "tensor %zu: %s", i, tern_last_error());
        p += pad8(desc_len);
        size_t want;
        if (tern_tensor_nbytes(&t->t, &want) != TERN_OK || want != nbytes ||
            nbytes > MAX_TENSOR_BYTES || t->t.device.type != TERN_DEVICE_CPU)
            return tern__error(TERN_ERR_PROTOCOL, "tensor %zu: payload size or device disagrees "
                                                  "with its descriptor",
                               i);
        t->nbytes = nbytes;
        t->rndv = mode == T_RNDV;
        if (!t->rndv) {
            if ((uint64_t)(end - p) < pad8(nbytes))
                return tern__error(TERN_ERR_PROTOCOL, "tensor %zu: payload cut short", i);
            t->t.data = (void *)p;
            p += pad8(nbytes);
        } else {
            if ((size_t)(end - p) < RNDV_WIRE)
                return tern__error(TERN_ERR_PROTOCOL, "tensor %zu: key cut short", i);
            t->raddr = tern__get_le64(p);
            t->rkey_len = tern__get_le32(p + 8);
            if (t->rkey_len > TERN_RKEY_MAX || (size_t)(end - p - RNDV_WIRE) < pad8(t->rkey_len))
                return tern__error(TERN_ERR_PROTOCOL, "tensor %zu: bad key", i);
            t->rkey = p + RNDV_WIRE;
            p += RNDV_WIRE + pad8(t->rkey_len);
        }
    }
    *pp = p;
    return TERN_OK;
}

/* The blob ends the message, to its last byte: a message longer than its
 * parts is as malformed as a shorter one. */
static tern_status_t check_blob(const uint8_t *p, const uint8_t *end, uint32_t blob_len)
{
    size_t left = (size_t)(end - p);
    if (left < blob_len)
        return tern__error(TERN_ERR_PROTOCOL, "blob of %u bytes: message cut short", blob_len);
    if (left > blob_len)
        return tern__error(TERN_ERR_PROTOCOL, "%zu bytes past the end of the message's parts",
                           left - blob_len);
    return TERN_OK;
}

/* Something pulled for a call or a future. */
typedef struct pull {
    rpc_t *rpc;
    tern_rkey_t *rkey;
    call_t *call;       /* one of these two */
    tern_future_t *fut;
} pull_t;

static void call_pulled(rpc_t *rpc, call_t *c);
static void future_pulled(rpc_t *rpc, tern_future_t *f);

static void on_pull(void *arg, tern_status_t status)
{
    pull_t *p = arg;
    rpc_t *rpc = p->rpc;
    tern_rkey_release(p->rkey);
    if (p->call != NULL) {
        if (status != TERN_OK && p->call->get_status == TERN_OK)
            p->call->get_status = status;
        if (--p->call->gets == 0)
            call_pulled(rpc, p->call);
    } else {
        if (status != TERN_OK && p->fut->status == TERN_OK)
            p->fut->status = status;
        if (--p->fut->gets == 0)
            future_pulled(rpc, p->fut);
    }
    free(p);
}

/*
 * Start pulling t's payload from src into a new buffer (lock held): *buf and
 * *mr are set for the caller to free; the pull's completion counts down
 * *gets. t->t.data points at the buffer. A get may complete as it is posted
 * (the ucx provider's cma path): then *gets is as before and TERN_OK is
 * returned, and the caller, which knows a pull happened, still owes the peer
 * its M_PULLED or M_RELEASE.
 */
static tern_status_t start_pull(rpc_t *rpc, int src, tin_t *t, void **buf, tern_mr_t **mr,
                                call_t *c, tern_future_t *f, int *gets)
{
    tern_ep_t *ep;
    tern_status_t st = tern__comm_ep(rpc->comm, src, &ep);
    if (st != TERN_OK)
        return st;
    if ((*buf = alloc64(t->nbytes)) == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "rpc: cannot allocate %zu bytes", t->nbytes);
    t->t.data = *buf;
    tern_mr_params_t mp = {.field_mask = TERN_MR_PARAM_ACCESS, .access = TERN_ACCESS_LOCAL};
    if ((st = tern_mr_reg(rpc->comm->tp, *buf, t->nbytes, &mp, mr)) != TERN_OK)
        return st;
    pull_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "rpc: out of memory");
    p->rpc = rpc;
    p->call = c;
    p->fut = f;
    if ((st = tern_rkey_unpack(ep, t->rkey, t->rkey_len, &p->rkey)) != TERN_OK) {
        free(p);
        return st;
    }
    tern_op_params_t op = {.field_mask = TERN_OP_PARAM_CB | TERN_OP_PARAM_MR,
                           .cb = on_pull,
                           .cb_arg = p,
                           .mr = *mr};
    (*gets)++;
    st = tern_ep_get(ep, *buf, t->nbytes, t->raddr, p->rkey, &op);
    if (st == TERN_INPROGRESS)
        return TERN_OK;
    (*gets)--;
    tern_rkey_release(p->rkey);
    free(p);
    return st; /* TERN_OK: done already */
}

/* ---- calls in ---- */

static void results_clear(call_t *c)
{
    for (size_t i = 0; i < c->nres; i++) {
        tern_mr_dereg(c->res[i]->mr);
        if (!c->res[i]->borrowed)
            free(c->res[i]->t.data);
        free(c->res[i]);
    }
    c->nres = 0;
}

/* Room for one more result; NULL when out of memory or over the limit. */
static result_t *result_add(call_t *c)
{
    if (c->nres == MAX_TENSORS)
        return NULL;
    if (c->nres == c->capres) {
        size_t cap = c->capres ? c->capres * 2 : 2;
        result_t **n = realloc(c->res, cap * sizeof(*n));
        if (n == NULL)
            return NULL;
        c->res = n;
        c->capres = cap;
    }
    result_t *r = calloc(1, sizeof(*r));
    if (r != NULL)
        c->res[c->nres++] = r;
    return r;
}

static void call_free(rpc_t *rpc, call_t *c)
{
    for (size_t i = 0; i < c->nbufs; i++) {
        tern_mr_dereg(c->mrs[i]);
        free(c->bufs[i]);
    }
    for (size_t i = 0; i < c->nrrefs; i++)
        rref_drop_locked(rpc, c->rrefs[i]);
    for (size_t i = 0; i < c->nres_rrefs; i++)
        rref_drop_locked(rpc, c->res_rrefs[i]);
    free(c->res_rrefs);
    results_clear(c);
    free(c->res);
    free(c->bufs);
    free(c->mrs);
    free(c->rrefs);
    free(c->args);
    if (c->self != NULL) {
        c->self->busy--;
        owner_maybe_free(rpc, c->self);
    }
    if (c->made != NULL) {
        c->made->busy--;
        owner_maybe_free(rpc, c->made);
    }
    free(c->res_blob);
    free(c->error);
    free(c->msg);
    tern__prof_capture_put(c->prof);
    free(c);
}

static void run_call(void *arg);

/* Queue a ready call to run on the pool, or behind the running ones. */
static void dispatch(rpc_t *rpc, call_t *c);

static void reply(rpc_t *rpc, call_t *c, tern_status_t st);

/*
 * Find what c runs: fn itself, or for a call on an object of class C, "C.fn"
 * ("C.to_here" for to_here). A to_here on a value runs nothing (entry NULL).
 */
static tern_status_t resolve_fn(call_t *c, char *why, size_t size)
{
    const owner_t *o = c->self;
    const char *fn = c->type == M_TO_HERE ? "to_here" : c->name;
    char full[2 * TERN_RPC_NAME_MAX + 2];
    if (c->type == M_TO_HERE && o->cls == NULL)
        return TERN_OK;
    if (o != NULL && o->cls != NULL)
        snprintf(full, sizeof(full), "%.63s.%.63s", o->cls->name, fn);
    else
        snprintf(full, sizeof(full), "%.63s", fn);
    snprintf(c->name, sizeof(c->name), "%s", full);
    c->entry = tern__rpc_lookup(full, strlen(full));
    if (c->entry == NULL) {
        snprintf(why, size, "%s: no such function", full);
        return c->type == M_TO_HERE ? TERN_ERR_UNSUPPORTED : TERN_ERR_NOT_FOUND;
    }
    if (c->entry->ctor != NULL && (c->type != M_REMOTE || o != NULL)) {
        snprintf(why, size, "%s: a class, not a function", full);
        return TERN_ERR_NOT_FOUND;
    }
    if (c->entry->ctor != NULL)
        c->made->cls = c->entry;
    return TERN_OK;
}

/* The owner c runs on is ready, failed, or c needs nothing (lock held). */
static void call_ready(rpc_t *rpc, call_t *c)
{
    owner_t *o = c->self;
    if (o != NULL && o->state == O_PENDING) {
        c->next = o->waiters;
        o->waiters = c;
        return;
    }
    if (o != NULL && o->state == O_FAILED) {
        c->error = dup_printf("%s", o->error ? o->error : tern_strerror(o->status));
        reply(rpc, c, o->status);
        return;
    }
    if (o != NULL) {
        char why[MAX_ERROR];
        tern_status_t st = resolve_fn(c, why, sizeof(why));
        if (st != TERN_OK) {
            c->error = strdup(why);
            reply(rpc, c, st);
            return;
        }
    }
    if (o != NULL && c->entry == NULL) {
        /* to_here on a value: answer from the owner's memory, no handler */
        for (size_t i = 0; i < o->ntensors; i++) {
            result_t *r = result_add(c);
            if (r == NULL) {
                c->error = dup_printf("out of memory");
                reply(rpc, c, TERN_ERR_NO_MEMORY);
                return;
            }
            r->t = o->tensors[i];
            r->borrowed = true;
        }
        if (o->blob_len > 0 && (c->res_blob = malloc(o->blob_len)) != NULL) {
            memcpy(c->res_blob, o->blob, o->blob_len);
            c->res_blob_len = o->blob_len;
        }
        if (o->nrrefs > 0) {
            /* the reply gives the caller a fork of each (reply: rrefs_pack) */
            if ((c->res_rrefs = malloc(o->nrrefs * sizeof(*c->res_rrefs))) == NULL) {
                c->error = dup_printf("out of memory");
                reply(rpc, c, TERN_ERR_NO_MEMORY);
                return;
            }
            for (size_t i = 0; i < o->nrrefs; i++) {
                atomic_fetch_add(&o->rrefs[i]->refs, 1);
                c->res_rrefs[c->nres_rrefs++] = o->rrefs[i];
            }
        }
        reply(rpc, c, TERN_OK);
        return;
    }
    if (o != NULL && o->cls == NULL) {
        /* a function on a value: the value's tensors come first */
        size_t n = c->value.ntensors;
        if (o->ntensors + n > 2 * MAX_TENSORS) {
            c->error = dup_printf("%s: too many tensors", c->name);
            reply(rpc, c, TERN_ERR_OUT_OF_RANGE);
            return;
        }
        tern_tensor_t *all = malloc((o->ntensors + n + 1) * sizeof(*all));
        if (all == NULL) {
            c->error = dup_printf("out of memory");
            reply(rpc, c, TERN_ERR_NO_MEMORY);
            return;
        }
        memcpy(all, o->tensors, o->ntensors * sizeof(*all));
        if (n > 0)
            memcpy(all + o->ntensors, c->args, n * sizeof(*all));
        free(c->args);
        c->args = all;
        c->value.ntensors = n + o->ntensors;
        c->value.tensors = c->args;
    }
    dispatch(rpc, c);
}

static void call_pulled(rpc_t *rpc, call_t *c)
{
    rpc->pulling--;
    /* The caller may let its arguments go now (and fail a late call). */
    hdr_t h = {.type = M_PULLED, .call_id = c->call_id};
    send_ctl(rpc, c->caller, &h);
    if (c->get_status != TERN_OK) {
        if (c->error == NULL)
            c->error = dup_printf("pulling the arguments from %s: %s", wname(rpc, c->caller),
                                  tern_strerror(c->get_status));
        reply(rpc, c, c->get_status);
        return;
    }
    call_ready(rpc, c);
}

static void dispatch(rpc_t *rpc, call_t *c)
{
    if (rpc->running >= rpc->threads) {
        c->next = NULL;
        if (rpc->backlog_tail != NULL)
            rpc->backlog_tail->next = c;
        else
            rpc->backlog_head = c;
        rpc->backlog_tail = c;
        return;
    }
    rpc->running++;
    rpc->tasks++;
    c->in_handler = true;
    if (tern_pool_submit(rpc->pool, run_call, c) != TERN_OK) {
        rpc->running--;
        rpc->tasks--;
        c->in_handler = false;
        c->error = dup_printf("%s: cannot queue the handler: %s", c->name, tern_last_error());
        reply(rpc, c, TERN_ERR_NO_RESOURCE);
    }
}

/*
 * An RRef argument this worker will not take (its request was refused, or
 * taking it failed before anything was recorded): settle its fork as if it
 * were taken and dropped at once (lock held). Its sender's child then hears
 * the owner's ACCEPT and the owner forgets the fork: left alone, the sender
 * would keep its own fork, and so the object, alive, and its graceful
 * shutdown would wait for the ACCEPT for ever. Only messages: a refusal may
 * come after this worker's owners are torn down. A record that names no
 * rank cannot be settled.
 */
/* The owner has fork of RRef id: its parent, waiting on it, may let go. */
static void send_accept(rpc_t *rpc, int parent, uint64_t id, uint64_t fork)
{
    hdr_t h = {.type = M_ACCEPT, .target = id, .aux1 = fork};
    send_ctl(rpc, parent, &h);
}

static void settle_rref(rpc_t *rpc, const uint8_t *p)
{
    int owner = (int)tern__get_le32(p);
    uint32_t flags = tern__get_le32(p + 4);
    uint64_t id = tern__get_le64(p + 8), fork = tern__get_le64(p + 16);
    int parent = (int)tern__get_le32(p + 24);
    if (owner < 0 || owner >= rpc->world || parent < 0 || parent >= rpc->world)
        return;
    hdr_t del = {.type = M_DELETE, .target = id, .aux1 = fork};
    if (flags & RA_REGISTERED) { /* the owner recorded the fork for this worker */
        send_ctl(rpc, owner, &del);
    } else if (!(flags & RA_CHILD)) {
        return; /* nobody waits on it */
    } else if (owner == rpc->rank) {
        send_accept(rpc, parent, id, fork);
    } else {
        /* The owner accepts the fork to the parent, then drops it: the two
         * go on one connection, in order. */
        hdr_t h = {.type = M_FORK, .target = id, .aux1 = fork, .aux2 = (uint64_t)parent};
        if (send_ctl(rpc, owner, &h) == TERN_OK)
            send_ctl(rpc, owner, &del);
    }
}

static void settle_rrefs(rpc_t *rpc, const uint8_t *p, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++, p += RREF_WIRE)
        settle_rref(rpc, p);
}

/* Parse one RRef argument and take its fork (lock held). A failure leaves
 * the fork settled where this worker could record nothing. */
static tern_status_t take_rref(rpc_t *rpc, const uint8_t *p, tern_rref_t **out)
{
    int owner = (int)tern__get_le32(p);
    uint32_t flags = tern__get_le32(p + 4);
    uint64_t id = tern__get_le64(p + 8), fork = tern__get_le64(p + 16);
    int parent = (int)tern__get_le32(p + 24);
    if (owner < 0 || owner >= rpc->world || parent < 0 || parent >= rpc->world)
        return tern__error(TERN_ERR_PROTOCOL, "RRef argument names rank %d", owner);
    tern_rref_t *r = rref_new(rpc, owner, id, fork);
    if (r == NULL) {
        settle_rref(rpc, p);
        return tern__error(TERN_ERR_NO_MEMORY, "rpc: out of memory");
    }
    if (owner == rpc->rank && rpc->closed) {
        /* Its owners are torn down: nothing to record (rref_finish sends
         * nothing for it either), but a sender's child still waits. */
        if (flags & RA_CHILD)
            send_accept(rpc, parent, id, fork);
    } else if (owner == rpc->rank) {
        owner_t *o = owner_get(rpc, id);
        if (o == NULL ||
            (!(flags & RA_REGISTERED) && owner_add_fork(o, fork, rpc->rank) != TERN_OK)) {
            free(r);
            settle_rref(rpc, p);
            return tern__error(TERN_ERR_NO_MEMORY, "rpc: out of memory");
        }
        if (flags & RA_CHILD)
            send_accept(rpc, parent, id, fork);
    } else if (flags & RA_CHILD) {
        /* Not settled on a failure: the owner is out of reach. */
        hdr_t h = {.type = M_FORK, .target = id, .aux1 = fork, .aux2 = (uint64_t)parent};
        tern_status_t st = send_ctl(rpc, owner, &h);
        if (st != TERN_OK) {
            free(r);
            return st;
        }
    }
    *out = r;
    return TERN_OK;
}

/* Take n RRefs of a message starting at p (lock held; the caller checked that
 * they fit) into *out, NULL for none. On an error those taken are released
 * and those not reached settled. */
static tern_status_t take_rrefs(rpc_t *rpc, const uint8_t *p, uint32_t n, tern_rref_t ***out)
{
    *out = NULL;
    if (n == 0)
        return TERN_OK;
    tern_rref_t **rs = calloc(n, sizeof(*rs));
    if (rs == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "rpc: out of memory");
    for (uint32_t i = 0; i < n; i++, p += RREF_WIRE) {
        tern_status_t st = take_rref(rpc, p, &rs[i]);
        if (st != TERN_OK) {
            char why[MAX_ERROR];
            snprintf(why, sizeof(why), "%s", tern_last_error());
            settle_rrefs(rpc, p + RREF_WIRE, n - i - 1);
            for (uint32_t k = 0; k < i; k++)
                rref_drop_locked(rpc, rs[k]);
            free(rs);
            return tern__error(st, "RRef %u: %s", i, why);
        }
    }
    *out = rs;
    return TERN_OK;
}

/* Fail a request that cannot run: reply with the error if it wants one. */
static void refuse(rpc_t *rpc, int src, const hdr_t *h, tern_status_t st, const char *why)
{
    tern_warn("rpc: refused a request from %s: %s", wname(rpc, src), why);
    call_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return;
    c->rpc = rpc;
    c->type = h->type;
    c->caller = src;
    c->call_id = h->call_id;
    c->error = strdup(why);
    reply(rpc, c, st);
}

static void handle_request(rpc_t *rpc, int src, uint32_t imm, const hdr_t *h,
                           const uint8_t *data, size_t len)
{
    tern_status_t st = TERN_OK;
    const uint8_t *end = data + len, *p = data + HDR;
    char why[MAX_ERROR];
    call_t *c = NULL;
    tin_t *tin = NULL;
    const uint8_t *rrefs_at = NULL; /* RRef arguments neither taken nor settled */

    if (h->text_len > TERN_RPC_NAME_MAX || h->ntensors > MAX_TENSORS ||
        h->nrrefs > MAX_RREFS || h->blob_len > MAX_BLOB ||
        (size_t)(end - p) < pad8(h->text_len) + (size_t)h->nrrefs * RREF_WIRE) {
        st = TERN_ERR_PROTOCOL;
        snprintf(why, sizeof(why), "malformed request (counts or lengths out of range)");
        goto fail;
    }
    /* From here the RRef arguments are readable: a refusal settles them. */
    rrefs_at = p + pad8(h->text_len);
    if ((c = calloc(1, sizeof(*c))) == NULL) {
        st = TERN_ERR_NO_MEMORY;
        snprintf(why, sizeof(why), "out of memory");
        goto fail;
    }
    c->rpc = rpc;
    c->type = h->type;
    c->caller = src;
    c->call_id = h->call_id;
    /* The caller profiles: so does this call's handler, whatever this
     * worker's own profiler does. */
    if (tern_imm_prof(imm))
        c->prof = tern__prof_capture_new(tern_imm_prof_cfg(imm));
    memcpy(c->name, p, h->text_len);
    p += pad8(h->text_len);
    if (rpc->closed) {
        st = TERN_ERR_CLOSED;
        snprintf(why, sizeof(why), "%s is shut down", rpc->names[rpc->rank]);
        goto fail;
    }
    /* The RRef it fills, first: whatever fails from here on is recorded in it. */
    if (h->type == M_REMOTE) {
        owner_t *o = owner_get(rpc, h->aux1);
        if (o != NULL && o->created)
            o = NULL; /* the id is taken: refuse, keep the other */
        if (o == NULL || owner_add_fork(o, h->aux2, src) != TERN_OK) {
            st = TERN_ERR_NO_MEMORY;
            snprintf(why, sizeof(why), "cannot create RRef %#llx", (unsigned long long)h->aux1);
            if (o != NULL)
                owner_maybe_free(rpc, o);
            goto fail;
        }
        o->created = true;
        o->busy++;
        c->made = o;
    }
    /* The RRef arguments before anything that can refuse the call (an
     * unknown function, say): the call then drops them as it ends, which
     * settles them with their owners. */
    st = take_rrefs(rpc, p, h->nrrefs, &c->rrefs);
    rrefs_at = NULL; /* taken, or released and settled */
    if (st != TERN_OK) {
        snprintf(why, sizeof(why), "arguments: %s", tern_last_error());
        goto fail;
    }
    c->nrrefs = h->nrrefs;
    p += (size_t)h->nrrefs * RREF_WIRE;
    c->value.rrefs = c->rrefs;
    c->value.nrrefs = c->nrrefs;

    /* What it runs on, and what it runs. */
    if (h->target != 0) {
        if ((c->self = owner_get(rpc, h->target)) == NULL) {
            st = TERN_ERR_NO_MEMORY;
            snprintf(why, sizeof(why), "out of memory");
            goto fail;
        }
        c->self->busy++;
    } else if (h->type == M_TO_HERE) {
        st = TERN_ERR_PROTOCOL;
        snprintf(why, sizeof(why), "to_here names no RRef");
        goto fail;
    }
    /* A plain function now; a method once its object is ready (call_ready). */
    if (c->self == NULL && (st = resolve_fn(c, why, sizeof(why))) != TERN_OK)
        goto fail;

    /* The arguments. */
    if (h->ntensors && ((c->args = calloc(h->ntensors, sizeof(*c->args))) == NULL ||
                        (c->bufs = calloc(h->ntensors, sizeof(*c->bufs))) == NULL ||
                        (c->mrs = calloc(h->ntensors, sizeof(*c->mrs))) == NULL)) {
        st = TERN_ERR_NO_MEMORY;
        snprintf(why, sizeof(why), "out of memory");
        goto fail;
    }
    /* Inline payloads and the blob stay in a copy of the message. */
    bool keep = h->ntensors > 0 || h->blob_len > 0;
    if (keep && (c->msg = malloc(len)) == NULL) {
        st = TERN_ERR_NO_MEMORY;
        snprintf(why, sizeof(why), "out of memory");
        goto fail;
    }
    if (keep)
        memcpy(c->msg, data, len);
    else
        c->msg = NULL;
    const uint8_t *base = keep ? c->msg : data;
    const uint8_t *q = base + (p - data), *qend = base + len;
    if (h->ntensors > 0 && (tin = calloc(h->ntensors, sizeof(*tin))) == NULL) {
        st = TERN_ERR_NO_MEMORY;
        snprintf(why, sizeof(why), "out of memory");
        goto fail;
    }
    if (get_tensors(&q, qend, h->ntensors, tin) != TERN_OK ||
        check_blob(q, qend, h->blob_len) != TERN_OK) {
        st = TERN_ERR_PROTOCOL;
        snprintf(why, sizeof(why), "malformed request: %s", tern_last_error());
        goto fail;
    }
    c->value.blob = h->blob_len ? q : NULL;
    c->value.blob_len = h->blob_len;
    for (uint32_t i = 0; i < h->ntensors; i++) {
        if (tin[i].rndv) {
            st = start_pull(rpc, src, &tin[i], &c->bufs[c->nbufs], &c->mrs[c->nbufs], c, NULL,
                            &c->gets);
            c->nbufs++;
            if (st != TERN_OK) {
                snprintf(why, sizeof(why), "pulling argument %u: %s", i, tern_last_error());
                goto fail;
            }
        }
        c->args[i] = tin[i].t;
    }
    free(tin);
    tin = NULL;
    c->value.tensors = c->args;
    c->value.ntensors = h->ntensors;
    if (c->nbufs > 0) { /* an argument came by rendezvous: the caller hears M_PULLED */
        rpc->pulling++;
        if (c->gets == 0)
            call_pulled(rpc, c); /* every pull completed as it was posted */
        return;                  /* else call_pulled goes on */
    }
    call_ready(rpc, c);
    return;

fail:
    free(tin);
    if (rrefs_at != NULL)
        settle_rrefs(rpc, rrefs_at, h->nrrefs);
    if (c == NULL) {
        refuse(rpc, src, h, st, why);
        return;
    }
    if (c->error == NULL)
        c->error = strdup(why);
    if (c->nbufs > 0) {
        /* pulls already started finish first, then fail the call */
        if (c->get_status == TERN_OK)
            c->get_status = st;
        rpc->pulling++;
        if (c->gets == 0)
            call_pulled(rpc, c);
        return;
    }
    reply(rpc, c, st);
}

/* ---- replies ---- */

/* Wake the calls waiting for o (lock held). */
static void owner_settle(rpc_t *rpc, owner_t *o)
{
    call_t *w = o->waiters;
    o->waiters = NULL;
    while (w != NULL) {
        call_t *next = w->next;
        call_ready(rpc, w);
        w = next;
    }
}

/*
 * A call is over (lock held): an M_REMOTE fills its RRef; the others send the
 * reply. Results over the eager limit stay registered until the caller's
 * M_RELEASE.
 */
static void reply(rpc_t *rpc, call_t *c, tern_status_t st)
{
    if (c->type == M_REMOTE && c->made != NULL) {
        owner_t *o = c->made;
        if (st == TERN_OK && o->cls != NULL) {
            o->state = O_READY;
        } else if (st == TERN_OK) {
            o->tensors = calloc(c->nres ? c->nres : 1, sizeof(*o->tensors));
            o->bufs = calloc(c->nres ? c->nres : 1, sizeof(*o->bufs));
            if (o->tensors == NULL || o->bufs == NULL) {
                st = TERN_ERR_NO_MEMORY;
            } else {
                for (size_t i = 0; i < c->nres; i++) {
                    /* a handler's results: never borrowed (only to_here borrows) */
                    o->tensors[i] = c->res[i]->t;
                    o->bufs[i] = c->res[i]->t.data;
                    c->res[i]->t.data = NULL;
                }
                o->ntensors = o->nbufs = c->nres;
                results_clear(c);
                o->blob = c->res_blob;
                o->blob_len = c->res_blob_len;
                c->res_blob = NULL;
                /* RRefs in the value: the call's handles become the value's */
                o->rrefs = c->res_rrefs;
                o->nrrefs = c->nres_rrefs;
                c->res_rrefs = NULL;
                c->nres_rrefs = 0;
                o->state = O_READY;
            }
        }
        if (st != TERN_OK) {
            o->state = O_FAILED;
            o->status = st;
            /* Every reply that passes this on is prefixed with this
             * worker's name already; the function's name, unless the
             * error starts with it (an unknown function). */
            const char *why = c->error ? c->error : tern_strerror(st);
            size_t nl = strlen(c->name);
            if (strncmp(why, c->name, nl) == 0 && why[nl] == ':')
                o->error = strdup(why);
            else
                o->error = dup_printf("%s: %s", c->name, why);
        }
        owner_settle(rpc, o);
        /* the caller hears only the status: it releases the arguments */
        results_clear(c);
        c->res_blob_len = 0;
    }
    if (c->type == M_REMOTE && c->made == NULL) {
        tern_warn("rpc: remote from %s failed: %s", wname(rpc, c->caller),
                  c->error ? c->error : tern_strerror(st));
    }

    tplan_t plan[MAX_TENSORS];
    rref_out_t ro;
    char text[MAX_ERROR];
    size_t text_len = 0, size = HDR;
    ro.n = 0;
    if (st == TERN_OK && c->type != M_REMOTE && c->nres_rrefs > 0 &&
        (st = rrefs_pack(rpc, c->caller, c->res_rrefs, c->nres_rrefs, "result", &ro)) != TERN_OK) {
        free(c->error);
        c->error = dup_printf("cannot send the result: %s", tern_last_error());
    }
    if (st != TERN_OK) {
        /* "worker1: add: <why>", without repeating a name the handler gave */
        const char *why = c->error ? c->error : tern_strerror(st);
        size_t n = strlen(c->name);
        bool named = n == 0 || (strncmp(why, c->name, n) == 0 && why[n] == ':');
        snprintf(text, sizeof(text), "%s: %s%s%s", rpc->names[rpc->rank], named ? "" : c->name,
                 named ? "" : ": ", why);
        text_len = strlen(text);
        results_clear(c);
    }
    size += pad8(text_len);
    size_t blob_len = st == TERN_OK ? c->res_blob_len : 0;
    tern_tensor_t res[MAX_TENSORS];
    for (size_t i = 0; i < c->nres; i++)
        res[i] = c->res[i]->t;
    size += ro.n * RREF_WIRE;
    tern_status_t est = plan_tensors(rpc, c->caller, res, c->nres, plan, &size);
    if (est != TERN_OK) {
        plan_undo(plan, c->nres);
        rrefs_undo(rpc, &ro);
        snprintf(text, sizeof(text), "%s: %s: cannot send the result: %s", rpc->names[rpc->rank],
                 c->name, tern_last_error());
        text_len = strlen(text);
        st = est;
        results_clear(c);
        blob_len = 0;
        size = HDR + pad8(text_len);
    }
    size += blob_len;
    /* The handler's events, as many as the message has room for (the rest
     * are counted as dropped in them). */
    size_t ev_len = 0;
    if (c->prof != NULL) {
        ev_len = tern__prof_capture_size(c->prof);
        size_t room = c->caller == rpc->rank ? ev_len
                      : rpc->max_send > size  ? rpc->max_send - size
                                              : 0;
        if (ev_len > room)
            ev_len = room;
    }
    size += ev_len;
    uint8_t *buf = size <= rpc->max_send || c->caller == rpc->rank ? malloc(size) : NULL;
    if (buf == NULL) {
        plan_undo(plan, c->nres);
        rrefs_undo(rpc, &ro);
        tern_error("rpc: cannot reply to %s's call of %s (%zu bytes)", wname(rpc, c->caller),
                   c->name, size);
        call_free(rpc, c);
        return;
    }
    hdr_t h = {.type = M_REPLY,
               .text_len = (uint16_t)text_len,
               .ntensors = (uint32_t)c->nres,
               .call_id = c->call_id,
               .nrrefs = (uint32_t)ro.n,
               .blob_len = (uint32_t)blob_len,
               .status = st};
    if (ev_len > 0) {
        /* Fewer bytes than the room when records were dropped: the events
         * must still end the message, where the caller looks for them. */
        size_t wrote = tern__prof_capture_encode(c->prof, buf + size - ev_len, ev_len);
        size -= ev_len - wrote;
        h.events_len = (uint32_t)wrote;
        h.flags = F_PROF;
    }
    put_hdr(buf, &h);
    uint8_t *p = buf + HDR;
    memcpy(p, text, text_len);
    memset(p + text_len, 0, pad8(text_len) - text_len);
    p += pad8(text_len);
    for (size_t i = 0; i < ro.n; i++, p += RREF_WIRE)
        memcpy(p, ro.wire[i], RREF_WIRE);
    p = put_tensors(p, plan, c->nres);
    if (blob_len > 0)
        memcpy(p, c->res_blob, blob_len);
    bool held = false;
    for (size_t i = 0; i < c->nres; i++) {
        c->res[i]->mr = plan[i].mr;
        held |= plan[i].rndv;
        free(plan[i].tmp); /* results are contiguous: never set */
    }
    int caller = c->caller;
    if (held) {
        c->next = rpc->held;
        rpc->held = c;
    }
    rrefs_commit(rpc, &ro);
    tern_status_t sst = send_msg(rpc, caller, buf, size);
    if (sst != TERN_OK && rpc->comm->peer_failed[caller] == TERN_OK)
        tern_warn("rpc: cannot reply to %s: %s", wname(rpc, caller), tern_last_error());
    if (sst != TERN_OK)
        rrefs_uncommit(rpc, &ro); /* the caller got no fork: none may stay */
    if (held && sst != TERN_OK) {
        for (call_t **pp = &rpc->held; *pp != NULL; pp = &(*pp)->next)
            if (*pp == c) {
                *pp = c->next;
                break;
            }
        held = false;
    }
    if (!held)
        call_free(rpc, c);
}

/* The worker whose handler this thread is running, if any. */
static _Thread_local rpc_t *tl_handler;

/* Start queued calls while there is room (lock held). */
static void backlog_drain(rpc_t *rpc)
{
    while (rpc->backlog_head != NULL && rpc->running < rpc->threads) {
        call_t *n = rpc->backlog_head;
        rpc->backlog_head = n->next;
        if (rpc->backlog_head == NULL)
            rpc->backlog_tail = NULL;
        dispatch(rpc, n);
    }
}

/*
 * A handler about to block (on a nested call, or for window room) stops
 * counting against `threads` while it waits, so the calls queued behind it
 * reach the pool, where its own wait runs them (tern__comm_wait): a handler
 * that waits for its own worker does not deadlock it. Returns whether it did.
 */
static bool handler_block(rpc_t *rpc)
{
    if (tl_handler != rpc)
        return false;
    tern__comm_lock(rpc->comm);
    rpc->running--;
    backlog_drain(rpc);
    tern__comm_unlock(rpc->comm);
    return true;
}

static void handler_unblock(rpc_t *rpc, bool blocked)
{
    if (!blocked)
        return;
    tern__comm_lock(rpc->comm);
    rpc->running++;
    tern__comm_unlock(rpc->comm);
}

static void run_call(void *arg)
{
    call_t *c = arg;
    rpc_t *rpc = c->rpc;
    tern_status_t st;
    rpc_t *outer = tl_handler; /* a wait may run another handler inside this one */
    tl_handler = rpc;
    tern__prof_capture_t *outer_cap = tern__prof_capture_enter(c->prof);
    int64_t t0 = c->prof != NULL ? tern_prof_clock_ns() : 0, m0 = tern__prof_mem_now();
    if (c->entry->ctor != NULL)
        st = c->entry->ctor(c, &c->made->obj);
    else
        st = c->entry->fn(c);
    if (c->prof != NULL) {
        char shapes[512] = "";
        if (tern__prof_flags() & TERN_PROF_SHAPES)
            tern__prof_shapes(shapes, sizeof(shapes), c->args, c->value.ntensors);
        tern__prof_capture_handler(c->prof, c->name, t0, tern_prof_clock_ns(),
                                   tern__prof_mem_now() - m0, shapes);
    }
    tern__prof_capture_enter(outer_cap);
    tl_handler = outer;
    if (st != TERN_OK && c->error == NULL && !c->deferred)
        c->error = strdup(tern_last_error());
    tern__comm_lock(rpc->comm);
    rpc->running--;
    rpc->tasks--;
    backlog_drain(rpc);
    c->in_handler = false;
    if (c->deferred && c->complete_early)
        reply(rpc, c, c->early_status);
    else if (c->deferred)
        rpc->deferred++;
    else
        reply(rpc, c, st);
    tern__comm_unlock(rpc->comm);
}

static void future_pulled(rpc_t *rpc, tern_future_t *f)
{
    rpc->pulling--;
    hdr_t h = {.type = M_RELEASE, .call_id = f->call_id};
    send_ctl(rpc, f->target, &h);
    tern_status_t st = f->status;
    char *err = st != TERN_OK ? dup_printf("%s: pulling the result: %s", f->what,
                                           tern_strerror(st))
                              : NULL;
    f->status = TERN_OK;
    future_complete(rpc, f, st, err);
}

/*
 * Take the RRefs of a reply of len bytes (lock held) into *out (NULL for
 * none): each is a fork for this worker, which the owner must hear about
 * even when nobody reads the reply. A malformed list takes none.
 */
static tern_status_t take_reply_rrefs(rpc_t *rpc, const hdr_t *h, const uint8_t *data, size_t len,
                                      tern_rref_t ***out)
{
    *out = NULL;
    if (h->nrrefs > MAX_RREFS || len - HDR < pad8(h->text_len) + (size_t)h->nrrefs * RREF_WIRE)
        return tern__error(TERN_ERR_PROTOCOL, "%u RRefs do not fit", h->nrrefs);
    return take_rrefs(rpc, data + HDR + pad8(h->text_len), h->nrrefs, out);
}

/* A reply h from target whose results nobody will pull (lock held): the
 * target may hold them for the caller, and would keep them, and its shutdown
 * wait for them, for ever. */
static void release_unread(rpc_t *rpc, int target, const hdr_t *h)
{
    if (h->ntensors > 0) {
        hdr_t rel = {.type = M_RELEASE, .call_id = h->call_id};
        send_ctl(rpc, target, &rel);
    }
}

/* Fail f for a reply it cannot read (lock held). */
static void reply_malformed(rpc_t *rpc, tern_future_t *f, const hdr_t *h, tern_status_t st,
                            char *error)
{
    release_unread(rpc, f->target, h);
    future_complete(rpc, f, st, error);
}

static void handle_reply(rpc_t *rpc, int src, const hdr_t *h, const uint8_t *data, size_t len)
{
    tern_future_t *f = NULL;
    tern_rref_t **rrefs;
    HASH_FIND(hh, rpc->inflight, &h->call_id, sizeof(h->call_id), f);
    if (f != NULL && f->target == src && f->late) {
        future_time_out(rpc, f); /* its deadline passed: the reply is dropped */
        f = NULL;
    }
    if (f == NULL || f->target != src || f->receiving) {
        /* A late reply (the call timed out): its pulled results must still
         * be released, and its RRefs too. */
        size_t body = h->events_len <= len - HDR ? len - h->events_len : len;
        if (take_reply_rrefs(rpc, h, data, body, &rrefs) == TERN_OK && rrefs != NULL) {
            for (uint32_t i = 0; i < h->nrrefs; i++)
                rref_drop_locked(rpc, rrefs[i]);
            free(rrefs);
        } else if (rrefs == NULL && h->nrrefs > 0) {
            tern_warn("rpc: a late reply from %s has RRefs it cannot give back: %s",
                      wname(rpc, src), tern_last_error());
        }
        release_unread(rpc, src, h);
        return;
    }
    /* The target's profiler events ride at the end. */
    if (h->events_len > 0) {
        if (h->events_len > len - HDR) {
            reply_malformed(rpc, f, h, TERN_ERR_PROTOCOL,
                            dup_printf("%s: malformed reply (events)", f->what));
            return;
        }
        len -= h->events_len;
        if (f->prof.name != NULL && (f->prof_events = malloc(h->events_len)) != NULL) {
            memcpy(f->prof_events, data + len, h->events_len);
            f->prof_events_len = h->events_len;
        }
    }
    const uint8_t *end = data + len, *p = data + HDR;
    tern_status_t st = TERN_OK;
    if (h->ntensors > MAX_TENSORS || h->blob_len > MAX_BLOB ||
        (size_t)(end - p) < pad8(h->text_len)) {
        reply_malformed(rpc, f, h, TERN_ERR_PROTOCOL, dup_printf("%s: malformed reply", f->what));
        return;
    }
    /* The RRefs first: whatever happens to the future from here, the owners
     * hear of these forks (future_complete drops them on an error). */
    if ((st = take_reply_rrefs(rpc, h, data, len, &rrefs)) != TERN_OK) {
        reply_malformed(rpc, f, h, st,
                        dup_printf("%s: the result's RRefs: %s", f->what, tern_last_error()));
        return;
    }
    f->rrefs = rrefs;
    f->value.rrefs = rrefs;
    f->value.nrrefs = rrefs != NULL ? h->nrrefs : 0;
    if (h->status != TERN_OK && !tern__status_is_error(h->status)) {
        reply_malformed(rpc, f, h, TERN_ERR_PROTOCOL,
                        dup_printf("%s: malformed reply (status %d)", f->what, (int)h->status));
        return;
    }
    if (h->status != TERN_OK) {
        future_complete(rpc, f, (tern_status_t)h->status,
                        strndup((const char *)p, h->text_len));
        return;
    }
    p += pad8(h->text_len) + (size_t)f->value.nrrefs * RREF_WIRE;
    tin_t tin[MAX_TENSORS];
    if (h->ntensors == 0 && h->blob_len == 0) {
        if (check_blob(p, end, 0) != TERN_OK)
            future_complete(rpc, f, TERN_ERR_PROTOCOL,
                            dup_printf("%s: malformed reply: %s", f->what, tern_last_error()));
        else
            future_complete(rpc, f, TERN_OK, NULL); /* nothing to keep */
        return;
    }
    if ((f->msg = malloc(len)) == NULL) {
        future_complete(rpc, f, TERN_ERR_NO_MEMORY, NULL);
        return;
    }
    memcpy(f->msg, data, len);
    const uint8_t *q = (const uint8_t *)f->msg + (p - data), *qend = (const uint8_t *)f->msg + len;
    if (get_tensors(&q, qend, h->ntensors, tin) != TERN_OK ||
        check_blob(q, qend, h->blob_len) != TERN_OK) {
        reply_malformed(rpc, f, h, TERN_ERR_PROTOCOL,
                        dup_printf("%s: malformed reply: %s", f->what, tern_last_error()));
        return;
    }
    f->value.blob = h->blob_len ? q : NULL;
    f->value.blob_len = h->blob_len;
    f->value.ntensors = h->ntensors;
    f->tensors = calloc(h->ntensors ? h->ntensors : 1, sizeof(*f->tensors));
    f->bufs = calloc(h->ntensors ? h->ntensors : 1, sizeof(*f->bufs));
    f->mrs = calloc(h->ntensors ? h->ntensors : 1, sizeof(*f->mrs));
    if (f->tensors == NULL || f->bufs == NULL || f->mrs == NULL) {
        future_complete(rpc, f, TERN_ERR_NO_MEMORY, NULL);
        return;
    }
    f->receiving = true;
    f->status = TERN_OK;
    for (uint32_t i = 0; i < h->ntensors && st == TERN_OK; i++) {
        if (tin[i].rndv) {
            st = start_pull(rpc, src, &tin[i], &f->bufs[f->nbufs], &f->mrs[f->nbufs], NULL, f,
                            &f->gets);
            f->nbufs++;
        }
        f->tensors[i] = tin[i].t;
    }
    if (st != TERN_OK)
        f->status = st;
    if (f->gets > 0) {
        rpc->pulling++;
        return;
    }
    if (st != TERN_OK || f->nbufs > 0) {
        /* No pull in flight: release whatever the target holds for us. */
        rpc->pulling++;
        future_pulled(rpc, f);
        return;
    }
    future_complete(rpc, f, TERN_OK, NULL);
}

/* ---- control messages ---- */

static void handle_ctl(rpc_t *rpc, int src, const hdr_t *h)
{
    switch (h->type) {
    case M_FORK: {
        if (h->aux2 >= (uint64_t)rpc->world) {
            tern_warn("rpc: fork from %s names rank %llu", wname(rpc, src),
                      (unsigned long long)h->aux2);
            return;
        }
        if (rpc->closed) { /* the object is gone: accept, record nothing */
            send_accept(rpc, (int)h->aux2, h->target, h->aux1);
            return;
        }
        owner_t *o = owner_get(rpc, h->target);
        if (o == NULL) {
            tern_error("rpc: out of memory for a fork of RRef %#llx",
                       (unsigned long long)h->target);
            return;
        }
        if (owner_add_fork(o, h->aux1, src) != TERN_OK)
            tern_error("rpc: cannot record a fork of RRef %#llx: the object may be freed early",
                       (unsigned long long)h->target);
        send_accept(rpc, (int)h->aux2, h->target, h->aux1);
        return;
    }
    case M_ACCEPT:
        for (child_t **pp = &rpc->children; *pp != NULL; pp = &(*pp)->next)
            if ((*pp)->fork == h->aux1) {
                child_t *c = *pp;
                *pp = c->next;
                child_accepted(rpc, c);
                return;
            }
        tern_warn("rpc: acceptance of an unknown fork from %s", wname(rpc, src));
        return;
    case M_DELETE: {
        owner_t *o = owner_find(rpc, h->target);
        if (o != NULL)
            owner_drop_fork(rpc, o, h->aux1);
        return;
    }
    case M_PULLED: {
        tern_future_t *f = NULL;
        HASH_FIND(hh, rpc->inflight, &h->call_id, sizeof(h->call_id), f);
        if (f == NULL || f->target != src)
            return;
        future_free_args(f);
        if (f->late)
            future_time_out(rpc, f);
        return;
    }
    case M_RELEASE:
        for (call_t **pp = &rpc->held; *pp != NULL; pp = &(*pp)->next)
            if ((*pp)->caller == src && (*pp)->call_id == h->call_id) {
                call_t *c = *pp;
                *pp = c->next;
                call_free(rpc, c);
                return;
            }
        return;
    default:
        return;
    }
}

static void handle_msg(rpc_t *rpc, int src, uint32_t imm, const void *data, size_t len)
{
    hdr_t h;
    rpc->handled++; /* graceful shutdown balances messages sent and received */
    if (len < HDR) {
        tern_warn("rpc: dropped a %zu-byte message from %s: shorter than a header", len,
                  wname(rpc, src));
        return;
    }
    get_hdr(data, &h);
    bool is_reply = tern_imm_class(imm) == TERN_IMM_RPC_REPLY;
    if (h.type == 0 || h.type >= M_TYPE_MAX || is_reply != (h.type == M_REPLY)) {
        tern_warn("rpc: dropped a message of unknown type %u from %s (imm %#x, %zu bytes)", h.type, wname(rpc, src), imm, len);
        return;
    }
    switch (h.type) {
    case M_CALL:
    case M_REMOTE:
    case M_TO_HERE:
        handle_request(rpc, src, imm, &h, data, len);
        return;
    case M_REPLY:
        handle_reply(rpc, src, &h, data, len);
        return;
    default:
        handle_ctl(rpc, src, &h);
        return;
    }
}

static void on_message(tern__comm_t *comm, const tern_event_t *ev, void *arg)
{
    rpc_t *rpc = arg;
    (void)comm;
    if (ev->type != TERN_EVENT_RECV || ev->src >= (uint32_t)rpc->world) {
        tern_warn("rpc: unexpected transport event %d from rank %u", ev->type, ev->src);
        return;
    }
    handle_msg(rpc, (int)ev->src, ev->imm, ev->data, ev->len);
}

/* ---- calls out ---- */

/* Wait (lock NOT held) until a call to dst fits in the window, or until
 * deadline (a clock time; 0: none) passes: the wait is part of the call's
 * timeout. Nested calls that come back to a worker whose window is full of
 * their own ancestors would otherwise wait for each other for ever. */
static tern_status_t window_wait(rpc_t *rpc, int dst, uint64_t deadline)
{
    tern__comm_t *comm = rpc->comm;
    atomic_int never = 0;
    bool blocked = false;
    tern_status_t st = TERN_OK;
    for (;;) {
        tern__comm_lock(comm);
        bool fits = rpc->window_used[dst] < rpc->window || rpc->closed ||
                    comm->peer_failed[dst] != TERN_OK;
        tern__comm_unlock(comm);
        if (fits)
            break;
        if (deadline != 0 && tern_clock_ns() >= deadline) {
            st = TERN_ERR_TIMEOUT;
            break;
        }
        if (!blocked)
            blocked = handler_block(rpc);
        tern__comm_wait(comm, &never, 0);
    }
    handler_unblock(rpc, blocked);
    return st;
}

/* Encode and send one request (lock held); f, its future, goes in the table. */
static tern_status_t send_request(rpc_t *rpc, int dst, const hdr_t *h0, const char *name,
                                  const tern_rpc_args_t *args, tern_future_t *f)
{
    static const tern_rpc_args_t none = {0};
    tplan_t plan[MAX_TENSORS];
    rref_out_t ro;
    size_t name_len = name ? strlen(name) : 0, size = HDR, planned = 0;
    tern_status_t st = TERN_OK;
    ro.n = 0;
    if (args == NULL)
        args = &none;
    if (args->ntensors > MAX_TENSORS || args->nrrefs > MAX_RREFS)
        return tern__error(TERN_ERR_OUT_OF_RANGE, "at most %d tensors and %d RRefs per call",
                           MAX_TENSORS, MAX_RREFS);
    if ((args->ntensors && args->tensors == NULL) || (args->nrrefs && args->rrefs == NULL) ||
        (args->blob_len && args->blob == NULL))
        return tern__error(TERN_ERR_INVALID_PARAM, "args: a count without its array");
    if (args->blob_len > MAX_BLOB)
        return tern__error(TERN_ERR_OUT_OF_RANGE, "blob of %zu bytes: at most %zu (send tensors)",
                           args->blob_len, MAX_BLOB);
    size += pad8(name_len) + args->nrrefs * RREF_WIRE;
    if ((st = rrefs_pack(rpc, dst, args->rrefs, args->nrrefs, "argument", &ro)) != TERN_OK)
        return st;
    st = plan_tensors(rpc, dst, args->tensors, args->ntensors, plan, &size);
    planned = args->ntensors;
    if (st != TERN_OK)
        goto undo;
    size += args->blob_len;
    if (size > rpc->max_send && dst != rpc->rank) {
        st = tern__error(TERN_ERR_OUT_OF_RANGE, "request of %zu bytes: the transport sends at "
                                                "most %zu",
                         size, rpc->max_send);
        goto undo;
    }
    uint8_t *buf = malloc(size);
    if (buf == NULL) {
        st = tern__error(TERN_ERR_NO_MEMORY, "rpc: out of memory");
        goto undo;
    }
    hdr_t h = *h0;
    h.text_len = (uint16_t)name_len;
    h.ntensors = (uint32_t)args->ntensors;
    h.nrrefs = (uint32_t)args->nrrefs;
    h.blob_len = (uint32_t)args->blob_len;
    put_hdr(buf, &h);
    uint8_t *p = buf + HDR;
    memcpy(p, name, name_len);
    memset(p + name_len, 0, pad8(name_len) - name_len);
    p += pad8(name_len);
    for (size_t i = 0; i < args->nrrefs; i++, p += RREF_WIRE)
        memcpy(p, ro.wire[i], RREF_WIRE);
    p = put_tensors(p, plan, args->ntensors);
    if (args->blob_len)
        memcpy(p, args->blob, args->blob_len);
    size_t nrndv = 0;
    for (size_t i = 0; i < args->ntensors; i++)
        nrndv += plan[i].rndv;
    if (nrndv > 0 && ((f->arg_mrs = calloc(nrndv, sizeof(*f->arg_mrs))) == NULL ||
                      (f->arg_tmp = calloc(nrndv, sizeof(*f->arg_tmp))) == NULL)) {
        free(buf);
        st = tern__error(TERN_ERR_NO_MEMORY, "rpc: out of memory");
        goto undo;
    }
    rrefs_commit(rpc, &ro);
    for (size_t i = 0; i < args->ntensors; i++)
        if (plan[i].rndv) {
            f->arg_mrs[f->narg_mrs] = plan[i].mr;
            f->arg_tmp[f->narg_mrs++] = plan[i].tmp;
        }
    tern__hash_oom = false;
    HASH_ADD(hh, rpc->inflight, call_id, sizeof(f->call_id), f);
    if (tern__hash_oom) {
        free(buf);
        st = tern__error(TERN_ERR_NO_MEMORY, "rpc: out of memory");
        f->narg_mrs = 0;
        goto undo_kids;
    }
    if ((st = send_msg(rpc, dst, buf, size)) != TERN_OK) {
        HASH_DEL(rpc->inflight, f);
        f->narg_mrs = 0;
        goto undo_kids;
    }
    return TERN_OK;

undo_kids:
    rrefs_uncommit(rpc, &ro);
undo:
    plan_undo(plan, planned);
    rrefs_undo(rpc, &ro);
    return st;
}

static tern_future_t *future_new(rpc_t *rpc)
{
    tern_future_t *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return NULL;
    f->rpc = rpc;
    atomic_init(&f->refs, 2); /* the user and the table */
    return f;
}

/* What the profiler calls the call being issued on this thread: the sync
 * wrappers say so, as PyTorch names rpc_sync and rpc_async apart. */
static _Thread_local const char *tl_call_label;

/* Issue a request with a reply: M_CALL or M_TO_HERE. */
static tern_status_t call_out(rpc_t *rpc, int dst, uint8_t type, uint64_t target,
                              uint64_t aux1, uint64_t aux2, const char *fn,
                              const tern_rpc_args_t *args, int64_t timeout_ns,
                              tern_future_t **out)
{
    tern__comm_t *comm = rpc->comm;
    if (timeout_ns == TERN_RPC_TIMEOUT_DEFAULT)
        timeout_ns = rpc->timeout_ns;
    char what[sizeof(((tern_future_t *)0)->what)];
    snprintf(what, sizeof(what), "%s '%s' on %s",
             type == M_TO_HERE  ? "to_here"
             : type == M_REMOTE ? "remote"
             : target           ? "RRef call"
                                : "rpc",
             fn, wname(rpc, dst));
    uint64_t start = timeout_ns > 0 ? tern_clock_ns() : 0;
    if (window_wait(rpc, dst, timeout_ns > 0 ? start + (uint64_t)timeout_ns : 0) != TERN_OK)
        return tern__error(TERN_ERR_TIMEOUT,
                           "%s: no room after %lld ms (%u calls in flight to it, TERN_RPC_WINDOW)",
                           what, (long long)(timeout_ns / 1000000), rpc->window);
    tern_future_t *f = future_new(rpc);
    tern_status_t st = TERN_OK;
    if (f == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "rpc: out of memory");
    f->target = dst;
    memcpy(f->what, what, sizeof(what));
    /* Before the lock: the first profiled call to a peer measures its clock. */
    const char *label = tl_call_label ? tl_call_label : type == M_REMOTE ? "remote" : "rpc_async";
    tl_call_label = NULL;
    char *pname = NULL;
    if (tern__prof_recording()) {
        const char *parts[] = {label, "#", fn, "(", wname(rpc, rpc->rank), " -> ", wname(rpc, dst),
                               ")"};
        pname = tern__prof_concat(parts, 8);
    }
    tern__prof_op_begin_named(&f->prof, comm, dst, TERN_PROF_KIND_RPC, pname);
    uint8_t flags = 0;
    if (f->prof.name != NULL) {
        flags = (uint8_t)(F_PROF | (tern__prof_flags() & F_PROF_CFG));
        if (args != NULL)
            f->prof_bytes = args->blob_len + tensors_bytes(args->tensors, args->ntensors);
    }
    tern__comm_lock(comm);
    if (rpc->closed) {
        st = tern__error(TERN_ERR_CLOSED, "%s: RPC is shut down", f->what);
        goto out;
    }
    if (comm->peer_failed[dst] != TERN_OK) {
        st = tern__error(TERN_ERR_PEER_LOST, "%s: %s was lost", f->what, wname(rpc, dst));
        goto out;
    }
    f->call_id = ++rpc->next_call;
    rpc->window_used[dst]++;
    if (timeout_ns > 0) {
        f->timed = true;
        f->timeout_ns = timeout_ns;
        f->deadline = start + (uint64_t)timeout_ns;
        rpc->timers++;
        atomic_fetch_add(&comm->rpc_timers, 1);
    }
    hdr_t h = {.type = type,
               .flags = flags,
               .call_id = f->call_id,
               .target = target,
               .aux1 = aux1,
               .aux2 = aux2};
    st = send_request(rpc, dst, &h, type == M_TO_HERE ? "" : fn, args, f);
    if (st != TERN_OK) {
        rpc->window_used[dst]--;
        if (f->timed) {
            rpc->timers--;
            atomic_fetch_sub(&comm->rpc_timers, 1);
        }
        tern__error(st, "%s: %s", f->what, tern_last_error());
    }
out:
    tern__comm_unlock(comm);
    if (st != TERN_OK) {
        tern__prof_op_drop(&f->prof);
        free(f->arg_mrs);
        free(f->arg_tmp);
        free(f);
        return st;
    }
    *out = f;
    return TERN_OK;
}

static tern_status_t check_fn(const char *fn)
{
    if (fn == NULL || !tern__rpc_name_ok(fn, strlen(fn), true))
        return tern__error(TERN_ERR_INVALID_PARAM, "bad function name '%s'", fn ? fn : "(null)");
    return TERN_OK;
}

tern_status_t tern_rpc_async(tern_ctx_t *ctx, const char *to, const char *fn,
                             const tern_rpc_args_t *args, int64_t timeout_ns,
                             tern_future_t **future)
{
    rpc_t *rpc = NULL;
    int dst = -1;
    tern_status_t st;
    if (future == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_rpc_async: NULL future");
    if ((st = live(ctx, &rpc, "tern_rpc_async")) != TERN_OK || (st = check_fn(fn)) != TERN_OK ||
        (st = resolve(rpc, to, &dst)) != TERN_OK)
        return st;
    return call_out(rpc, dst, M_CALL, 0, 0, 0, fn, args, timeout_ns, future);
}

/* Wait for f and hand it out as a result, or free it and return its error. */
static tern_status_t settle(tern_future_t *f, tern_future_t **result)
{
    tern_status_t st = tern_future_wait(f, -1);
    if (st != TERN_OK) {
        tern__error(st, "%s", f->error ? f->error : tern_strerror(st));
        tern_future_free(f);
        *result = NULL;
        return st;
    }
    *result = f;
    return TERN_OK;
}

tern_status_t tern_rpc_sync(tern_ctx_t *ctx, const char *to, const char *fn,
                            const tern_rpc_args_t *args, int64_t timeout_ns,
                            tern_future_t **result)
{
    tern_future_t *f;
    if (result == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_rpc_sync: NULL result");
    *result = NULL;
    tl_call_label = "rpc_sync";
    tern_status_t st = tern_rpc_async(ctx, to, fn, args, timeout_ns, &f);
    tl_call_label = NULL;
    return st != TERN_OK ? st : settle(f, result);
}

/* ---- futures: the user's side ---- */

tern_status_t tern_future_wait(tern_future_t *f, int64_t timeout_ns)
{
    if (f == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_future_wait: NULL future");
    if (!atomic_load_explicit(&f->done, memory_order_acquire)) {
        bool blocked = handler_block(f->rpc);
        bool done = tern__comm_wait(f->rpc->comm, &f->done, timeout_ns);
        handler_unblock(f->rpc, blocked);
        if (!done)
            return tern__error(TERN_ERR_TIMEOUT, "%s: still pending after %lld ms", f->what,
                               (long long)(timeout_ns / 1000000));
    }
    if (f->status != TERN_OK)
        return tern__error(f->status, "%s", f->error ? f->error : tern_strerror(f->status));
    return TERN_OK;
}

int tern_future_test(tern_future_t *f)
{
    if (f == NULL)
        return 0;
    if (!atomic_load_explicit(&f->done, memory_order_acquire))
        tern__comm_wait(f->rpc->comm, &f->done, 0);
    return atomic_load_explicit(&f->done, memory_order_acquire);
}

tern_status_t tern_future_wait_all(tern_future_t *const *fs, size_t n, int64_t timeout_ns)
{
    if (fs == NULL && n > 0)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_future_wait_all: NULL array");
    uint64_t start = tern_clock_ns();
    tern_status_t first = TERN_OK;
    for (size_t i = 0; i < n; i++) {
        int64_t left = -1;
        if (timeout_ns >= 0) {
            uint64_t used = tern_clock_ns() - start;
            left = used >= (uint64_t)timeout_ns ? 0 : timeout_ns - (int64_t)used;
        }
        tern_status_t st = tern_future_wait(fs[i], left);
        if (st == TERN_ERR_TIMEOUT && fs[i] != NULL && !atomic_load(&fs[i]->done))
            return st;
        if (st != TERN_OK && first == TERN_OK)
            first = st;
    }
    for (size_t i = 0; i < n && first != TERN_OK; i++)
        if (fs[i]->status != TERN_OK) {
            tern__error(first, "%s", fs[i]->error ? fs[i]->error : tern_strerror(first));
            break;
        }
    return first;
}

tern_status_t tern_future_status(const tern_future_t *f)
{
    if (f == NULL)
        return TERN_ERR_INVALID_PARAM;
    if (!atomic_load_explicit(&f->done, memory_order_acquire))
        return TERN_ERR_NO_RESOURCE;
    return f->status;
}

const char *tern_future_error(const tern_future_t *f)
{
    if (f == NULL || !atomic_load_explicit(&f->done, memory_order_acquire) || f->error == NULL)
        return "";
    return f->error;
}

const tern_rpc_value_t *tern_future_value(const tern_future_t *f)
{
    if (f == NULL || !atomic_load_explicit(&f->done, memory_order_acquire) || f->status != TERN_OK)
        return NULL;
    return &f->value;
}

tern_status_t tern_future_then(tern_future_t *f, tern_future_cb cb, void *arg)
{
    if (f == NULL || cb == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_future_then: NULL %s",
                           f == NULL ? "future" : "callback");
    tern__comm_t *comm = f->rpc->comm;
    tern__comm_lock(comm);
    bool done = atomic_load(&f->done);
    if (!done) {
        if (f->ncbs == MAX_CBS) {
            tern__comm_unlock(comm);
            return tern__error(TERN_ERR_OUT_OF_RANGE, "at most %d callbacks per future", MAX_CBS);
        }
        f->cbs[f->ncbs].cb = cb;
        f->cbs[f->ncbs++].arg = arg;
    }
    tern__comm_unlock(comm);
    if (done)
        cb(f, arg);
    return TERN_OK;
}

void tern_future_free(tern_future_t *f)
{
    if (f != NULL)
        future_unref(f, false);
}

/* ---- timeouts and lost peers ---- */

static void rpc_poll(tern__comm_t *comm)
{
    if (!tern__comm_trylock(comm))
        return;
    rpc_t *rpc = comm->rpc_state;
    uint64_t now = tern_clock_ns();
    if (rpc == NULL || now < rpc->next_check) {
        tern__comm_unlock(comm);
        return;
    }
    rpc->next_check = now + 1000000; /* a scan per millisecond at most */
    tern_future_t *f, *tmp;
    HASH_ITER(hh, rpc->inflight, f, tmp)
    {
        if (!f->timed || f->receiving || f->late || now < f->deadline)
            continue;
        /* Arguments the target may be reading must outlive its read (as any
         * RDMA buffer must): such a call fails once the target says it has
         * them (M_PULLED), replies, or is lost, whichever comes first. */
        if (f->narg_mrs > 0)
            f->late = true;
        else
            future_time_out(rpc, f);
    }
    tern__comm_unlock(comm);
}

static void rpc_peer_lost(tern__comm_t *comm, int peer)
{
    rpc_t *rpc = comm->rpc_state;
    if (rpc == NULL)
        return;
    tern_future_t *f, *tmp;
    HASH_ITER(hh, rpc->inflight, f, tmp)
    {
        if (f->target == peer && f->gets == 0)
            future_complete(rpc, f, TERN_ERR_PEER_LOST,
                            dup_printf("%s: %s (rank %d) was lost", f->what, wname(rpc, peer),
                                       peer));
    }
    owner_t *o, *otmp;
    rpc->owned_iter = true;
    HASH_ITER(hh, rpc->owned, o, otmp)
    {
        for (size_t i = 0; i < o->nforks;)
            if (o->forks[i].holder == peer)
                o->forks[i] = o->forks[--o->nforks];
            else
                i++;
        owner_maybe_free(rpc, o);
    }
    rpc->owned_iter = false;
    doomed_drain(rpc);
    /* Children nobody will accept: passed to the lost peer, or of an RRef
     * the lost peer owned (whose FORK went nowhere). */
    for (child_t **pp = &rpc->children; *pp != NULL;) {
        child_t *c = *pp;
        if (c->to == peer || c->parent->owner == peer) {
            *pp = c->next;
            child_accepted(rpc, c);
        } else {
            pp = &c->next;
        }
    }
    for (call_t **pp = &rpc->held; *pp != NULL;) {
        call_t *c = *pp;
        if (c->caller == peer) {
            *pp = c->next;
            call_free(rpc, c);
        } else {
            pp = &c->next;
        }
    }
}

/* ---- handlers' side ---- */

const tern_rpc_value_t *tern_rpc_call_args(const tern_rpc_call_t *c)
{
    return c != NULL ? &c->value : NULL;
}

int tern_rpc_call_caller(const tern_rpc_call_t *c)
{
    return c != NULL ? c->caller : -1;
}

tern_ctx_t *tern_rpc_call_ctx(const tern_rpc_call_t *c)
{
    return c != NULL ? c->rpc->ctx : NULL;
}

void *tern_rpc_call_self(const tern_rpc_call_t *c)
{
    return c != NULL && c->self != NULL ? c->self->obj : NULL;
}

const char *tern_rpc_call_name(const tern_rpc_call_t *c)
{
    return c != NULL ? c->name : "";
}

size_t tern_rpc_call_nrrefs(const tern_rpc_call_t *c)
{
    return c != NULL ? c->nrrefs : 0;
}

tern_rref_t *tern_rpc_call_rref(const tern_rpc_call_t *c, size_t i)
{
    return c != NULL && i < c->nrrefs ? c->rrefs[i] : NULL;
}

tern_status_t tern_rpc_call_alloc_tensor(tern_rpc_call_t *c, tern_dtype_t dtype, int32_t ndim,
                                         const int64_t *shape, tern_tensor_t **out)
{
    tern_tensor_t t;
    size_t nbytes;
    tern_status_t st;
    if (c == NULL || out == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_rpc_call_alloc_tensor: NULL argument");
    if (c->nres == MAX_TENSORS)
        return tern__error(TERN_ERR_OUT_OF_RANGE, "at most %d result tensors", MAX_TENSORS);
    if ((st = tern_tensor_init(&t, NULL, dtype, ndim, shape, tern_device_cpu())) != TERN_OK ||
        (st = tern_tensor_nbytes(&t, &nbytes)) != TERN_OK)
        return st;
    if (nbytes > MAX_TENSOR_BYTES)
        return tern__error(TERN_ERR_OUT_OF_RANGE, "result of %zu bytes", nbytes);
    if ((t.data = alloc64(nbytes)) == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "cannot allocate a %zu-byte result", nbytes);
    result_t *r = result_add(c);
    if (r == NULL) {
        free(t.data);
        return tern__error(c->nres == MAX_TENSORS ? TERN_ERR_OUT_OF_RANGE : TERN_ERR_NO_MEMORY,
                           "cannot add result %zu (at most %d)", c->nres, MAX_TENSORS);
    }
    r->t = t;
    *out = &r->t;
    return TERN_OK;
}

tern_status_t tern_rpc_call_return_tensor(tern_rpc_call_t *c, const tern_tensor_t *t)
{
    tern_tensor_t *out;
    size_t nbytes;
    tern_status_t st;
    if (t == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_rpc_call_return_tensor: NULL tensor");
    if ((st = tern_tensor_validate(t)) != TERN_OK || (st = tern_tensor_nbytes(t, &nbytes)) != TERN_OK)
        return st;
    if (t->device.type != TERN_DEVICE_CPU)
        return tern__error(TERN_ERR_UNSUPPORTED, "result tensor is not on the CPU");
    if ((st = tern_rpc_call_alloc_tensor(c, t->dtype, t->ndim, t->shape, &out)) != TERN_OK)
        return st;
    if (nbytes > 0 && (st = tern_tensor_gather(t, out->data, nbytes)) != TERN_OK) {
        c->nres--;
        free(c->res[c->nres]->t.data);
        free(c->res[c->nres]);
        return st;
    }
    return TERN_OK;
}

tern_status_t tern_rpc_call_return_arg(tern_rpc_call_t *c, size_t i)
{
    if (c == NULL || i >= c->value.ntensors)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_rpc_call_return_arg: no argument %zu", i);
    const tern_tensor_t *t = &c->value.tensors[i];
    for (size_t j = 0; j < c->nbufs; j++) {
        if (c->bufs[j] == NULL || c->bufs[j] != t->data)
            continue;
        /* pulled into a buffer of the call's own: hand that over */
        result_t *r = result_add(c);
        if (r == NULL)
            return tern__error(TERN_ERR_NO_MEMORY, "cannot add a result");
        r->t = *t;
        tern_mr_dereg(c->mrs[j]);
        c->mrs[j] = NULL;
        c->bufs[j] = NULL;
        return TERN_OK;
    }
    return tern_rpc_call_return_tensor(c, t); /* inline, or a value's: a copy */
}

tern_status_t tern_rpc_call_return_rref(tern_rpc_call_t *c, tern_rref_t *r)
{
    if (c == NULL || r == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_rpc_call_return_rref: NULL argument");
    if (r->rpc != c->rpc)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_rpc_call_return_rref: the RRef is not "
                                                   "of this worker");
    if (c->nres_rrefs == MAX_RREFS)
        return tern__error(TERN_ERR_OUT_OF_RANGE, "at most %d result RRefs", MAX_RREFS);
    tern_rref_t **n = realloc(c->res_rrefs, (c->nres_rrefs + 1) * sizeof(*n));
    if (n == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "rpc: out of memory");
    c->res_rrefs = n;
    /* A handle of the call's own: the handler may release its own at once. */
    atomic_fetch_add(&r->refs, 1);
    c->res_rrefs[c->nres_rrefs++] = r;
    return TERN_OK;
}

tern_status_t tern_rpc_call_return_blob(tern_rpc_call_t *c, const void *blob, size_t len)
{
    if (c == NULL || (blob == NULL && len > 0))
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_rpc_call_return_blob: NULL argument");
    if (len > MAX_BLOB)
        return tern__error(TERN_ERR_OUT_OF_RANGE, "blob of %zu bytes: at most %zu", len, MAX_BLOB);
    void *copy = len ? malloc(len) : NULL;
    if (len && copy == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "rpc: out of memory");
    if (len)
        memcpy(copy, blob, len);
    free(c->res_blob);
    c->res_blob = copy;
    c->res_blob_len = len;
    return TERN_OK;
}

tern_status_t tern_rpc_call_fail(tern_rpc_call_t *c, tern_status_t status, const char *fmt, ...)
{
    char buf[MAX_ERROR];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (c != NULL) {
        free(c->error);
        c->error = strdup(buf);
    }
    return tern__error(status, "%s", buf);
}

void tern_rpc_call_defer(tern_rpc_call_t *c)
{
    if (c != NULL)
        c->deferred = true;
}

void tern_rpc_call_complete(tern_rpc_call_t *c, tern_status_t status)
{
    if (c == NULL || !c->deferred)
        return;
    rpc_t *rpc = c->rpc;
    if (status != TERN_OK && c->error == NULL)
        c->error = strdup(tern_last_error());
    tern__comm_lock(rpc->comm);
    if (c->in_handler) {
        c->complete_early = true;
        c->early_status = status;
    } else {
        rpc->deferred--;
        reply(rpc, c, status);
    }
    tern__comm_unlock(rpc->comm);
}

/* ---- RRefs: the user's side ---- */

/* M_REMOTE: the owner-to-be creates RRef id with our fork; its reply only
 * releases the arguments, so its future is ours alone. */
static tern_status_t remote_out(rpc_t *rpc, int dst, uint64_t target, const char *fn,
                                const tern_rpc_args_t *args, int64_t timeout_ns,
                                tern_rref_t **rref)
{
    tern__comm_lock(rpc->comm);
    uint64_t id = new_id(rpc), fork = new_id(rpc);
    tern__comm_unlock(rpc->comm);
    tern_rref_t *r = rref_new(rpc, dst, id, fork);
    if (r == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "rpc: out of memory");
    tern_future_t *f;
    tern_status_t st = call_out(rpc, dst, M_REMOTE, target, id, fork, fn, args, timeout_ns, &f);
    if (st != TERN_OK) {
        free(r);
        return st;
    }
    future_unref(f, false);
    *rref = r;
    return TERN_OK;
}

tern_status_t tern_remote(tern_ctx_t *ctx, const char *to, const char *fn,
                          const tern_rpc_args_t *args, int64_t timeout_ns, tern_rref_t **rref)
{
    rpc_t *rpc = NULL;
    int dst = -1;
    tern_status_t st;
    if (rref == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_remote: NULL rref");
    if ((st = live(ctx, &rpc, "tern_remote")) != TERN_OK || (st = check_fn(fn)) != TERN_OK ||
        (st = resolve(rpc, to, &dst)) != TERN_OK)
        return st;
    return remote_out(rpc, dst, 0, fn, args, timeout_ns, rref);
}

tern_status_t tern_rref_local(tern_ctx_t *ctx, const tern_rpc_args_t *value, tern_rref_t **rref)
{
    static const tern_rpc_args_t none = {0};
    rpc_t *rpc = NULL;
    tern_status_t st;
    if (rref == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_rref_local: NULL rref");
    if ((st = live(ctx, &rpc, "tern_rref_local")) != TERN_OK)
        return st;
    if (value == NULL)
        value = &none;
    if (value->ntensors > MAX_TENSORS || value->blob_len > MAX_BLOB || value->nrrefs > 0 ||
        (value->ntensors && value->tensors == NULL) || (value->blob_len && value->blob == NULL))
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_rref_local: at most %d tensors, a blob "
                                                   "of at most %zu bytes, no RRefs",
                           MAX_TENSORS, MAX_BLOB);
    owner_t tmp = {0};
    size_t n = value->ntensors;
    tmp.tensors = calloc(n ? n : 1, sizeof(*tmp.tensors));
    tmp.bufs = calloc(n ? n : 1, sizeof(*tmp.bufs));
    if (tmp.tensors == NULL || tmp.bufs == NULL)
        goto nomem;
    for (size_t i = 0; i < n; i++) {
        const tern_tensor_t *t = &value->tensors[i];
        size_t nbytes;
        if (t->device.type != TERN_DEVICE_CPU) {
            st = tern__error(TERN_ERR_UNSUPPORTED, "tern_rref_local: tensor %zu is not on the CPU", i);
            goto fail;
        }
        if ((st = tern_tensor_validate(t)) != TERN_OK ||
            (st = tern_tensor_nbytes(t, &nbytes)) != TERN_OK ||
            (st = tern_tensor_init(&tmp.tensors[i], NULL, t->dtype, t->ndim, t->shape,
                                   t->device)) != TERN_OK)
            goto fail;
        if ((tmp.bufs[i] = alloc64(nbytes)) == NULL)
            goto nomem;
        tmp.nbufs = i + 1;
        tmp.tensors[i].data = tmp.bufs[i];
        if (nbytes > 0 && (st = tern_tensor_gather(t, tmp.bufs[i], nbytes)) != TERN_OK)
            goto fail;
    }
    tmp.ntensors = n;
    if (value->blob_len > 0) {
        if ((tmp.blob = malloc(value->blob_len)) == NULL)
            goto nomem;
        memcpy(tmp.blob, value->blob, value->blob_len);
        tmp.blob_len = value->blob_len;
    }
    tern__comm_lock(rpc->comm);
    uint64_t id = new_id(rpc), fork = new_id(rpc);
    owner_t *o = owner_new(rpc, id);
    tern_rref_t *r = o != NULL ? rref_new(rpc, rpc->rank, id, fork) : NULL;
    if (r == NULL || owner_add_fork(o, fork, rpc->rank) != TERN_OK) {
        if (o != NULL)
            owner_maybe_free(rpc, o);
        free(r);
        tern__comm_unlock(rpc->comm);
        goto nomem;
    }
    o->tensors = tmp.tensors;
    o->bufs = tmp.bufs;
    o->nbufs = tmp.nbufs;
    o->ntensors = tmp.ntensors;
    o->blob = tmp.blob;
    o->blob_len = tmp.blob_len;
    o->state = O_READY;
    o->created = true;
    tern__comm_unlock(rpc->comm);
    *rref = r;
    return TERN_OK;
nomem:
    st = tern__error(TERN_ERR_NO_MEMORY, "tern_rref_local: out of memory");
fail:
    owner_free_value(&tmp);
    return st;
}

static tern_status_t rref_live(tern_rref_t *r, rpc_t **out, const char *who)
{
    if (r == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "%s: NULL RRef", who);
    if (r->rpc->closed)
        return tern__error(TERN_ERR_CLOSED, "%s: RPC is shut down", who);
    *out = r->rpc;
    return TERN_OK;
}

tern_status_t tern_rref_to_here(tern_rref_t *r, int64_t timeout_ns, tern_future_t **value)
{
    rpc_t *rpc = NULL;
    tern_future_t *f;
    tern_status_t st;
    if (value == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_rref_to_here: NULL value");
    *value = NULL;
    if ((st = rref_live(r, &rpc, "tern_rref_to_here")) != TERN_OK)
        return st;
    tl_call_label = "rpc_sync";
    st = call_out(rpc, r->owner, M_TO_HERE, r->id, 0, 0, "to_here", NULL, timeout_ns, &f);
    tl_call_label = NULL;
    return st != TERN_OK ? st : settle(f, value);
}

static tern_status_t check_method(const char *method)
{
    if (method == NULL || !tern__rpc_name_ok(method, strlen(method), false))
        return tern__error(TERN_ERR_INVALID_PARAM, "bad method name '%s'",
                           method ? method : "(null)");
    return TERN_OK;
}

tern_status_t tern_rref_rpc_async(tern_rref_t *r, const char *method, const tern_rpc_args_t *args,
                                  int64_t timeout_ns, tern_future_t **future)
{
    rpc_t *rpc = NULL;
    tern_status_t st;
    if (future == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_rref_rpc_async: NULL future");
    if ((st = rref_live(r, &rpc, "tern_rref_rpc_async")) != TERN_OK ||
        (st = check_method(method)) != TERN_OK)
        return st;
    return call_out(rpc, r->owner, M_CALL, r->id, 0, 0, method, args, timeout_ns, future);
}

tern_status_t tern_rref_rpc_sync(tern_rref_t *r, const char *method, const tern_rpc_args_t *args,
                                 int64_t timeout_ns, tern_future_t **result)
{
    tern_future_t *f;
    if (result == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_rref_rpc_sync: NULL result");
    *result = NULL;
    tl_call_label = "rpc_sync";
    tern_status_t st = tern_rref_rpc_async(r, method, args, timeout_ns, &f);
    tl_call_label = NULL;
    return st != TERN_OK ? st : settle(f, result);
}

tern_status_t tern_rref_remote(tern_rref_t *r, const char *method, const tern_rpc_args_t *args,
                               int64_t timeout_ns, tern_rref_t **out)
{
    rpc_t *rpc = NULL;
    tern_status_t st;
    if (out == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_rref_remote: NULL out");
    if ((st = rref_live(r, &rpc, "tern_rref_remote")) != TERN_OK ||
        (st = check_method(method)) != TERN_OK)
        return st;
    return remote_out(rpc, r->owner, r->id, method, args, timeout_ns, out);
}

int tern_rref_owner(const tern_rref_t *r)
{
    return r != NULL ? r->owner : -1;
}

int tern_rref_is_owner(const tern_rref_t *r)
{
    return r != NULL && r->owner == r->rpc->rank;
}

tern_status_t tern_rref_dup(tern_rref_t *r, tern_rref_t **out)
{
    if (r == NULL || out == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_rref_dup: NULL argument");
    atomic_fetch_add(&r->refs, 1);
    *out = r;
    return TERN_OK;
}

void tern_rref_release(tern_rref_t *r)
{
    if (r == NULL)
        return;
    rpc_t *rpc = r->rpc;
    tern__comm_lock(rpc->comm);
    rref_drop_locked(rpc, r);
    tern__comm_unlock(rpc->comm);
}

size_t tern_rpc_owned_count(tern_ctx_t *ctx)
{
    rpc_t *rpc = rpc_of(ctx);
    if (rpc == NULL)
        return 0;
    tern__comm_lock(rpc->comm);
    size_t n = HASH_COUNT(rpc->owned);
    tern__comm_unlock(rpc->comm);
    return n;
}

/* ---- workers ---- */

tern_status_t tern_rpc_worker_rank(tern_ctx_t *ctx, const char *name, int *rank)
{
    rpc_t *rpc = NULL;
    tern_status_t st;
    if (rank == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_rpc_worker_rank: NULL rank");
    if ((st = live(ctx, &rpc, "tern_rpc_worker_rank")) != TERN_OK)
        return st;
    return resolve(rpc, name, rank);
}

tern_status_t tern_rpc_worker_name(tern_ctx_t *ctx, int rank, char *buf, size_t cap)
{
    rpc_t *rpc = NULL;
    tern_status_t st;
    if ((st = live(ctx, &rpc, "tern_rpc_worker_name")) != TERN_OK)
        return st;
    if (rank == -1)
        rank = rpc->rank;
    if (rank < 0 || rank >= rpc->world)
        return tern__error(TERN_ERR_NOT_FOUND, "no worker has rank %d (world of %d)", rank,
                           rpc->world);
    if (buf == NULL || cap <= strlen(rpc->names[rank]))
        return tern__error(TERN_ERR_TRUNCATED, "name '%s' needs %zu bytes", rpc->names[rank],
                           strlen(rpc->names[rank]) + 1);
    strcpy(buf, rpc->names[rank]);
    return TERN_OK;
}

static void rpc_free(rpc_t *rpc)
{
    if (rpc == NULL)
        return;
    free(rpc->names);
    free(rpc->window_used);
    free(rpc->doomed);
    free(rpc);
}

/* Every pool task that names rpc has finished (lock NOT held). */
static void wait_tasks(rpc_t *rpc)
{
    atomic_int never = 0;
    for (;;) {
        tern__comm_lock(rpc->comm);
        bool idle = rpc->tasks == 0 && rpc->pulling == 0;
        tern__comm_unlock(rpc->comm);
        if (idle)
            return;
        tern__comm_wait(rpc->comm, &never, 1000000);
    }
}

/* Tear down what RPC holds, after the last handler (lock held). */
static void teardown_locked(rpc_t *rpc, tern_status_t why)
{
    tern_future_t *f, *ftmp;
    HASH_ITER(hh, rpc->inflight, f, ftmp)
    {
        future_complete(rpc, f, why, dup_printf("%s: RPC was shut down", f->what));
    }
    /* Calls that will not run: queued behind the running ones, and waiting
     * on an object (taken off every owner before any is answered: answering
     * one lets go of the owners it holds, which may free them, and no loop
     * may walk `owned` then). Their callers hear TERN_ERR_CLOSED now rather
     * than at their timeout. */
    call_t *refused = rpc->backlog_head;
    rpc->backlog_head = rpc->backlog_tail = NULL;
    owner_t *o, *otmp;
    HASH_ITER(hh, rpc->owned, o, otmp)
    {
        o->nforks = 0;
        while (o->waiters != NULL) {
            call_t *w = o->waiters;
            o->waiters = w->next;
            w->next = refused;
            refused = w;
        }
    }
    while (refused != NULL) {
        call_t *c = refused;
        refused = c->next;
        free(c->error);
        c->error = dup_printf("%s is shut down", rpc->names[rpc->rank]);
        reply(rpc, c, why);
    }
    while (rpc->held != NULL) {
        call_t *c = rpc->held;
        rpc->held = c->next;
        call_free(rpc, c);
    }
    while (rpc->children != NULL) {
        child_t *c = rpc->children;
        rpc->children = c->next;
        child_accepted(rpc, c);
    }
    /* What no call holds goes; a deferred call's object when it completes. */
    rpc->owned_iter = true;
    HASH_ITER(hh, rpc->owned, o, otmp)
    {
        owner_maybe_free(rpc, o);
    }
    rpc->owned_iter = false;
    doomed_drain(rpc);
}

static void rpc_fini(tern__comm_t *comm)
{
    rpc_t *rpc = comm->rpc_state;
    if (rpc == NULL)
        return;
    if (!rpc->closed)
        tern_rpc_shutdown(rpc->ctx, 0);
    wait_tasks(rpc);
    tern__comm_lock(comm);
    tern__comm_set_handler(comm, TERN_IMM_RPC_REQUEST, NULL, NULL);
    tern__comm_set_handler(comm, TERN_IMM_RPC_REPLY, NULL, NULL);
    atomic_store_explicit(&comm->rpc_poll, NULL, memory_order_release);
    comm->rpc_peer_lost = NULL;
    comm->rpc_fini = NULL;
    comm->rpc_state = NULL;
    tern__comm_unlock(comm);
    rpc_free(rpc);
}

/* Wait (lock NOT held) until this worker has nothing in flight. It may serve
 * others for a long time; every TERN_TIMEOUT it says what it waits for. */
static void wait_quiet(rpc_t *rpc)
{
    atomic_int never = 0;
    uint64_t next_note = tern_clock_ns() + (uint64_t)tern__ctx_timeout(rpc->ctx);
    for (;;) {
        if (tern_clock_ns() > next_note) {
            tern__comm_lock(rpc->comm);
            tern_warn("rpc: shutdown still waits: %u calls out, %u handlers, %u deferred, %u "
                      "pulls, %s, %s",
                      HASH_COUNT(rpc->inflight), rpc->running, rpc->deferred, rpc->pulling,
                      rpc->children ? "forks not yet accepted" : "no forks pending",
                      rpc->held ? "results not yet pulled" : "no results held");
            tern__comm_unlock(rpc->comm);
            next_note = tern_clock_ns() + (uint64_t)tern__ctx_timeout(rpc->ctx);
        }
        tern__comm_lock(rpc->comm);
        bool quiet = rpc->inflight == NULL && rpc->running == 0 && rpc->backlog_head == NULL &&
                     rpc->tasks == 0 && rpc->deferred == 0 && rpc->pulling == 0 &&
                     rpc->children == NULL && rpc->held == NULL;
        tern__comm_unlock(rpc->comm);
        if (quiet)
            return;
        tern__comm_wait(rpc->comm, &never, 1000000);
    }
}

/*
 * Meet every worker at round's barrier, for as long as it takes (a worker may
 * shut down while others still work for minutes, as with rpc.shutdown()), but
 * not for a worker that is lost.
 */
static tern_status_t shutdown_barrier(rpc_t *rpc, tern_store_t *store, unsigned round)
{
    char key[96], go[96];
    int64_t n;
    tern_status_t st;
    snprintf(key, sizeof(key), "tern/rpc/shutdown/%u/arrived", round);
    snprintf(go, sizeof(go), "tern/rpc/shutdown/%u/go", round);
    if ((st = tern_store_add(store, key, 1, &n)) != TERN_OK)
        return st;
    if (n == rpc->world && (st = tern_store_set(store, go, "1", 1)) != TERN_OK)
        return st;
    const char *keys[1] = {go};
    for (;;) {
        st = tern_store_wait(store, keys, 1, 100 * 1000000ll);
        if (st != TERN_ERR_TIMEOUT)
            return st;
        for (int r = 0; r < rpc->world; r++)
            if (rpc->comm->peer_failed[r] != TERN_OK)
                return tern__error(TERN_ERR_PEER_LOST, "rpc shutdown: %s (rank %d) was lost",
                                   wname(rpc, r), r);
    }
}

tern_status_t tern_rpc_shutdown(tern_ctx_t *ctx, int graceful)
{
    rpc_t *rpc = NULL;
    tern_status_t st = live(ctx, &rpc, "tern_rpc_shutdown");
    if (st != TERN_OK)
        return st;
    if (tern_pool_in_worker(rpc->pool))
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_rpc_shutdown: called from a handler or "
                                                   "callback");
    if (graceful) {
        /* Rounds until every worker was quiet and the messages sent and
         * received balance, the same in two rounds running (no message moved
         * in between): the four-counter test of termination detection. */
        tern_store_t *store = tern_ctx_store(ctx);
        int64_t prev = -1;
        for (unsigned round = 0;; round++) {
            char key[96];
            int64_t sent, got;
            wait_quiet(rpc);
            tern__comm_lock(rpc->comm);
            int64_t s = (int64_t)rpc->sent, h = (int64_t)rpc->handled;
            tern__comm_unlock(rpc->comm);
            snprintf(key, sizeof(key), "tern/rpc/shutdown/%u/sent", round);
            if ((st = tern_store_add(store, key, s, NULL)) != TERN_OK)
                break;
            snprintf(key, sizeof(key), "tern/rpc/shutdown/%u/received", round);
            if ((st = tern_store_add(store, key, h, NULL)) != TERN_OK)
                break;
            if ((st = shutdown_barrier(rpc, store, round)) != TERN_OK)
                break;
            snprintf(key, sizeof(key), "tern/rpc/shutdown/%u/sent", round);
            if ((st = tern_store_add(store, key, 0, &sent)) != TERN_OK)
                break;
            snprintf(key, sizeof(key), "tern/rpc/shutdown/%u/received", round);
            if ((st = tern_store_add(store, key, 0, &got)) != TERN_OK)
                break;
            if (sent == got && sent == prev)
                break;
            prev = sent == got ? sent : -1;
        }
        if (st != TERN_OK)
            tern_warn("rpc: graceful shutdown could not agree with the others (%s); shutting "
                      "down here",
                      tern_last_error());
    }
    tern__comm_lock(rpc->comm);
    rpc->closed = true;
    rpc->agreed = graceful && st == TERN_OK;
    tern__comm_unlock(rpc->comm);
    wait_tasks(rpc);
    tern__comm_lock(rpc->comm);
    teardown_locked(rpc, TERN_ERR_CLOSED);
    tern__comm_unlock(rpc->comm);
    return st;
}

tern_status_t tern_rpc_init(tern_ctx_t *ctx, const char *name, const tern_rpc_options_t *opts)
{
    tern__comm_t *comm = tern__comm(ctx);
    tern_status_t st;
    char self[TERN_RPC_NAME_MAX + 1];
    if (comm == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_rpc_init: no context");
    if (comm->rpc_state != NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_rpc_init: already called on this "
                                                   "context");
    if ((st = tern__rpc_builtins()) != TERN_OK)
        return st;
    /* A bad name is published all the same, so every rank fails, not only
     * the one that chose it. */
    if (name == NULL)
        snprintf(self, sizeof(self), "worker%u", tern_ctx_rank(ctx));
    else
        snprintf(self, sizeof(self), "%s",
                 name[0] && strlen(name) <= TERN_RPC_NAME_MAX ? name : "?");
    const tern__config_t *cfg = tern__ctx_config(ctx);
    uint64_t m = opts != NULL ? opts->field_mask : 0;
    tern_pool_t *pool = tern_ctx_pool(ctx);
    unsigned pool_size = tern_pool_size(pool);
    rpc_t *rpc = calloc(1, sizeof(*rpc));
    if (rpc == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "tern_rpc_init: out of memory");
    rpc->ctx = ctx;
    rpc->comm = comm;
    rpc->pool = pool;
    rpc->rank = (int)tern_ctx_rank(ctx);
    rpc->world = (int)tern_ctx_world_size(ctx);
    rpc->timeout_ns = (m & TERN_RPC_OPT_TIMEOUT) ? opts->timeout_ns : cfg->rpc_timeout_ns;
    if (rpc->timeout_ns == 0)
        rpc->timeout_ns = -1;
    rpc->threads = (m & TERN_RPC_OPT_THREADS) ? opts->threads : pool_size;
    rpc->window = (m & TERN_RPC_OPT_WINDOW) ? opts->window : (unsigned)cfg->rpc_window;
    rpc->eager_limit = comm->eager_limit;
    rpc->max_send = comm->attr.max_send;
    if (rpc->threads == 0 || rpc->threads > pool_size || rpc->window == 0) {
        st = tern__error(TERN_ERR_INVALID_PARAM, "tern_rpc_init: threads must be 1..%u (the "
                                                 "pool's size), window at least 1",
                         pool_size);
        goto fail;
    }
    rpc->names = calloc((size_t)rpc->world, sizeof(*rpc->names));
    rpc->window_used = calloc((size_t)rpc->world, sizeof(*rpc->window_used));
    if (rpc->names == NULL || rpc->window_used == NULL) {
        st = tern__error(TERN_ERR_NO_MEMORY, "tern_rpc_init: out of memory");
        goto fail;
    }
    /* Names through the store: everyone publishes, meets, then reads all. */
    tern_store_t *store = tern_ctx_store(ctx);
    char key[64];
    snprintf(key, sizeof(key), "tern/rpc/name/%d", rpc->rank);
    if ((st = tern_store_set(store, key, self, strlen(self))) != TERN_OK ||
        (st = tern_store_barrier(store, "tern/rpc/init", (unsigned)rpc->world,
                                 tern__ctx_timeout(ctx))) != TERN_OK)
        goto fail;
    for (int r = 0; r < rpc->world; r++) {
        void *v;
        size_t len;
        snprintf(key, sizeof(key), "tern/rpc/name/%d", r);
        if ((st = tern_store_get(store, key, &v, &len, tern__ctx_timeout(ctx))) != TERN_OK)
            goto fail;
        bool ok = tern__rpc_name_ok(v, len, true);
        if (ok)
            memcpy(rpc->names[r], v, len);
        else
            st = tern__error(TERN_ERR_INVALID_PARAM, "tern_rpc_init: rank %d chose a bad worker "
                                                     "name '%.*s' (letters, digits, '_', '-', "
                                                     "one inner '.'; 1 to %d characters)",
                             r, (int)(len < 64 ? len : 64), (const char *)v, TERN_RPC_NAME_MAX);
        free(v);
        if (!ok)
            goto fail;
    }
    for (int r = 0; r < rpc->world; r++)
        for (int q = 0; q < r; q++)
            if (strcmp(rpc->names[r], rpc->names[q]) == 0) {
                st = tern__error(TERN_ERR_MISMATCH, "tern_rpc_init: ranks %d and %d are both "
                                                    "named '%s'",
                                 q, r, rpc->names[r]);
                goto fail;
            }
    /* Every rank installs its handlers before any call can reach it. */
    tern__comm_lock(comm);
    comm->rpc_state = rpc;
    atomic_store_explicit(&comm->rpc_poll, rpc_poll, memory_order_release);
    comm->rpc_peer_lost = rpc_peer_lost;
    comm->rpc_fini = rpc_fini;
    tern__comm_set_handler(comm, TERN_IMM_RPC_REQUEST, on_message, rpc);
    tern__comm_set_handler(comm, TERN_IMM_RPC_REPLY, on_message, rpc);
    tern__comm_unlock(comm);
    if ((st = tern_store_barrier(store, "tern/rpc/ready", (unsigned)rpc->world,
                                 tern__ctx_timeout(ctx))) != TERN_OK) {
        rpc_fini(comm);
        return st;
    }
    return TERN_OK;
fail:
    rpc_free(rpc);
    return st;
}
