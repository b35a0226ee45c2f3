/*
 * The point-to-point protocol.
 *
 * Eager (class P2P_EAGER): header (form, tag or {cid, tag}) + payload, copied into a
 * bounce buffer at the sender (so the send completes at once, as MPI's
 * buffered eager sends do) and into the user's buffer at the receiver.
 *
 * Rendezvous (class P2P_RNDV): the sender registers its buffer and sends a
 * ready-to-send {cid, tag, len, sender request id, address, packed key}; the
 * matching receiver registers its buffer, gets the data straight into it, and
 * answers FIN {sender request id, status}, which completes the sender.
 *
 * The slot of eager and rendezvous immediates holds the low 24 bits of the
 * message's number between its two ranks (comm.h), which the receiver
 * extends to 64 bits: the profiler links each send to its receive by it.
 *
 * Offered buffers (collectives, TERN__P2P_RTR, where the transport revokes
 * keys): a receive above the collectives' eager limit registers its buffer
 * as it is posted and sends the sender RTR {as RTS, with the receive's id};
 * the send writes its data there with one put whose immediate (class
 * P2P_RNDV, slot = the receive's id) completes the receive, and the put's
 * own acknowledgement completes the send. Over tcp that is three frames
 * instead of four, and the data leaves as soon as both ends have posted
 * instead of a round trip later; an offer made while the receiver waits on
 * something else (the next level of a collective) costs nothing on the path.
 * The receive stays in the posted list meanwhile, so an eager message or an
 * RTS (a sender whose limit differs, or that stopped waiting after
 * RTR_WAIT_NS) still matches it; it then withdraws the offer (revoking the
 * key, so a put already on its way is refused) and says so with
 * RTR_CANCEL {id}. A send larger than the offer is refused with RTR_FAIL
 * {id, len, status}, which fails the receive as a truncation would. Puts in
 * flight to one peer, and reads from one, are held to the transport's
 * rx_window (the windows, below); the others wait in order.
 *
 * Control (class CONTROL, slot = kind): FIN; CREDIT {bytes}, returning eager
 * credit; NACK {tag, len, cap}, telling an eager sender its message was
 * truncated; RTR, RTR_CANCEL, RTR_FAIL (above).
 *
 * Memory bound. Each sender may have at most credit_per_peer bytes of eager
 * messages outstanding at each receiver (TERN_UNEXPECTED_MAX / world), each
 * counted as its payload plus EAGER_ENTRY (what queueing one costs, so that
 * empty messages are bounded too: they were free, and a flood of them grew
 * the queue 147 times past its bound); the receiver returns credit as it
 * consumes messages. Out of credit, messages go by rendezvous, whose
 * unexpected entry is a small header. So the unexpected queue never holds
 * more than TERN_UNEXPECTED_MAX bytes of eager messages.
 *
 * Matching. Posted receives and unexpected messages are kept in order; an
 * arrival takes the first posted receive that matches (cid, source, tag), and a
 * new receive takes the first unexpected message that matches. With the
 * transport's per-endpoint ordering this gives MPI's non-overtaking rule.
 *
 * Everything here runs under the comm lock.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "core/bytes.h"
#include "core/context.h"
#include "core/error.h"
#include "core/log.h"
#include "p2p/comm.h"
#include "prof/prof.h"
#include "tensor/host.h"

/* PING and PONG carry the profiler's clock ping-pong (prof/session.c). */
enum ctrl {
    CTRL_FIN = 1,
    CTRL_CREDIT = 2,
    CTRL_NACK = 3,
    CTRL_PING = 4,
    CTRL_PONG = 5,
    CTRL_RTR = 6,
    CTRL_RTR_CANCEL = 7,
    CTRL_RTR_FAIL = 8
};

/* An eager message: a form byte, then
 *   EAGER_SHORT: tag u16 (a point-to-point message, cid 0, tag 0..65535);
 *   EAGER_LONG:  cid u32, tag u32, and for a collective's (cid != 0) the
 *                call's signature u32 (tern_request.shape);
 * then the payload. The short form keeps an 8-byte message with the ucx
 * provider's short header in one cache line of UCX's shared-memory FIFO
 * (transport/ucx/ucx.c, SHORT_HDR_LEN). */
enum { EAGER_SHORT = 1, EAGER_LONG = 2 };
#define EAGER_SHORT_HDR 3
#define EAGER_LONG_HDR 9
#define EAGER_SIG 4
#define EAGER_HDR_MAX (EAGER_LONG_HDR + EAGER_SIG)

static inline bool eager_short(uint32_t cid, int tag)
{
    return cid == 0 && (unsigned)tag <= 0xffffu;
}

static inline size_t eager_long_hdr(uint32_t cid)
{
    return cid != 0 ? EAGER_LONG_HDR + EAGER_SIG : EAGER_LONG_HDR;
}

static inline size_t eager_hdr(uint32_t cid, int tag)
{
    return eager_short(cid, tag) ? EAGER_SHORT_HDR : eager_long_hdr(cid);
}
#define RTS_HDR 36 /* and RTR's */

/* How long a send waits for its receiver's offer before it offers its own
 * buffer instead (tern__p2p_rtr_tick). Only a receiver that expects a small
 * message (counts that differ across ranks) or lost its offer never makes
 * one; a late receiver makes it when it comes, so waiting costs it nothing. */
#define RTR_WAIT_NS (50ull * 1000 * 1000)
/* Offers kept for sends not yet posted; more from a peer gone astray are
 * dropped (the send then waits RTR_WAIT_NS and offers its own buffer). */
#define RTRS_MAX 4096

/* A receiver's offer, kept until its send is posted. */
typedef struct rtr {
    struct rtr *next;
    uint32_t cid, shape;
    int src, tag;
    size_t cap;
    uint64_t rid, raddr;
    uint32_t rkey_len;
    uint8_t rkey[TERN_RKEY_MAX];
} rtr_t;

/* A message of the protocol's own that must outlive the call that sends it.
 * Small ones (most: eager headers and payloads, control messages) are
 * recycled through a cache, as requests are. */
typedef struct bounce {
    tern__comm_t *comm;
    struct bounce *next; /* in the cache */
    size_t len, cap;
    uint8_t data[];
} bounce_t;

#define BOUNCE_SMALL 256
#define BOUNCE_CACHE_MAX 256

static bounce_t *bounce_new(tern__comm_t *comm, size_t len)
{
    bounce_t *b = NULL;
    if (len <= BOUNCE_SMALL && (b = comm->bounce_cache) != NULL) {
        comm->bounce_cache = b->next;
        comm->bounce_cached--;
    } else {
        size_t cap = len < BOUNCE_SMALL ? BOUNCE_SMALL : len;
        if ((b = malloc(sizeof(*b) + cap)) == NULL)
            return NULL;
        b->comm = comm;
        b->cap = cap;
    }
    b->len = len;
    return b;
}

static void bounce_free(bounce_t *b)
{
    tern__comm_t *comm = b->comm;
    if (b->cap != BOUNCE_SMALL || comm->bounce_cached >= BOUNCE_CACHE_MAX) {
        free(b);
        return;
    }
    b->next = comm->bounce_cache;
    comm->bounce_cache = b;
    comm->bounce_cached++;
}

/* Transport callbacks run under the comm lock (inside progress). */
static void bounce_done(void *arg, tern_status_t st)
{
    (void)st; /* a lost message shows up as the peer's loss */
    bounce_free(arg);
}

/* Send msg[0..len) to dst with imm. msg is b's data (b is consumed either
 * way: freed when the transport is done with it), or, with b NULL, a message
 * the transport copies as it posts (len <= attr.max_inline). */
static inline tern_status_t send_msg(tern__comm_t *comm, int dst, uint32_t imm, const void *msg,
                                     size_t len, bounce_t *b)
{
    tern_ep_t *ep;
    tern_status_t st = tern__comm_ep(comm, dst, &ep);
    if (st == TERN_OK) {
        tern_op_params_t op = {.field_mask = TERN_OP_PARAM_CB, .cb = bounce_done, .cb_arg = b};
        st = tern_ep_send(ep, imm, msg, len, b != NULL ? &op : NULL);
    }
    if (st == TERN_INPROGRESS)
        return TERN_OK;
    if (b != NULL)
        bounce_free(b);
    return st;
}

/* Send len bytes of b (consumed either way) to dst with imm. */
static tern_status_t send_bounce(tern__comm_t *comm, int dst, uint32_t imm, bounce_t *b)
{
    return send_msg(comm, dst, imm, b->data, b->len, b);
}

static void send_ctrl(tern__comm_t *comm, int dst, enum ctrl kind, const uint8_t *payload, size_t len)
{
    bounce_t *b = bounce_new(comm, len);
    if (b == NULL) {
        tern_error("p2p: no memory for a control message to rank %d", dst);
        return;
    }
    memcpy(b->data, payload, len);
    if (send_bounce(comm, dst, tern_imm_make(TERN_IMM_CONTROL, 0, 0, kind), b) != TERN_OK)
        tern_warn("p2p: control message %d to rank %d not sent: %s", kind, dst, tern_last_error());
}

tern_status_t tern__p2p_ping(tern__comm_t *comm, int dst, uint64_t seq)
{
    uint8_t msg[8];
    tern__put_le64(msg, seq);
    tern__comm_lock(comm);
    bounce_t *b = bounce_new(comm, sizeof(msg));
    tern_status_t st;
    if (b == NULL) {
        st = tern__error(TERN_ERR_NO_MEMORY, "p2p: no memory for a ping");
    } else {
        memcpy(b->data, msg, sizeof(msg));
        st = send_bounce(comm, dst, tern_imm_make(TERN_IMM_CONTROL, 0, 0, CTRL_PING), b);
    }
    tern__comm_unlock(comm);
    return st;
}

static void send_fin(tern__comm_t *comm, int dst, uint64_t sreq, tern_status_t st)
{
    uint8_t msg[12];
    if ((unsigned)dst < comm->world && comm->peer_failed[dst] != TERN_OK)
        return;
    tern__put_le64(msg, sreq);
    tern__put_le32(msg + 8, (uint32_t)st);
    send_ctrl(comm, dst, CTRL_FIN, msg, sizeof(msg));
}

/* The immediate of the next message to dst; *seq gets its number. */
static uint32_t msg_imm(tern__comm_t *comm, tern_imm_class_t cls, int dst, uint64_t *seq)
{
    *seq = ++comm->sent[dst];
    return tern_imm_make(cls, 0, 0, (uint32_t)*seq);
}

/* The full number of a message from src whose immediate holds its low bits.
 * Messages arrive in order, so it is the next one; the serial arithmetic only
 * keeps a stray one from moving the count far. */
static uint64_t msg_seq(tern__comm_t *comm, int src, uint32_t imm)
{
    uint64_t last = comm->arrived[src];
    uint32_t d = (tern_imm_slot(imm) - (uint32_t)(last + 1)) & TERN_IMM_SLOT_MASK;
    int64_t delta = d & (1u << (TERN_IMM_SLOT_BITS - 1)) ? (int64_t)d - (1 << TERN_IMM_SLOT_BITS)
                                                         : (int64_t)d;
    uint64_t seq = last + 1 + (uint64_t)delta;
    if (seq > last)
        comm->arrived[src] = seq;
    return seq;
}

/* What one eager message of len bytes counts against credit and the
 * unexpected queue's bound: an entry's record and the allocator's share. */
#define EAGER_ENTRY 96u
static inline size_t eager_charge(size_t len)
{
    return len + EAGER_ENTRY;
}

/* Hand src the credit of the eager bytes consumed since the last time. */
static void credit_return(tern__comm_t *comm, int src)
{
    uint8_t msg[8];
    tern__put_le64(msg, comm->consumed[src]);
    comm->consumed[src] = 0;
    send_ctrl(comm, src, CTRL_CREDIT, msg, sizeof(msg));
}

/* Count a consumed eager message of len bytes from src; hand credit back in
 * batches. */
TERN__HOT void consumed(tern__comm_t *comm, int src, size_t len)
{
    comm->consumed[src] += eager_charge(len);
    if (comm->consumed[src] >= comm->credit_per_peer / 4)
        credit_return(comm, src);
}

/* A communicator that is gone (tern__p2p_drop_cid): its id is on the list. */
static bool cid_dead(const tern__comm_t *comm, uint32_t cid)
{
    size_t lo = 0, hi = comm->ndead;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (comm->dead_cids[mid] == cid)
            return true;
        if (comm->dead_cids[mid] < cid)
            lo = mid + 1;
        else
            hi = mid;
    }
    return false;
}

static bool matches(const tern_request_t *r, uint32_t cid, int src, int tag)
{
    return r->cid == cid && (r->peer == TERN_ANY_SOURCE || r->peer == src) &&
           (r->tag == TERN_ANY_TAG || r->tag == tag);
}

/* Requests are recycled through a small cache: malloc and free cost as much
 * as the rest of a small message's handling on shared memory. */
#define REQ_CACHE_MAX 256

static tern_request_t *req_new(tern__comm_t *comm)
{
    tern_request_t *req = comm->req_cache;
    if (req != NULL) {
        comm->req_cache = req->next;
        comm->req_cached--;
        return req;
    }
    return malloc(sizeof(*req));
}

void tern__req_free(tern__comm_t *comm, tern_request_t *req)
{
    if (comm->req_cached >= REQ_CACHE_MAX) {
        free(req);
        return;
    }
    req->next = comm->req_cache;
    comm->req_cache = req;
    comm->req_cached++;
}

/* Free a request the user has released once nothing names it any more. */
static void req_maybe_free(tern_request_t *req)
{
    if (req->released && req->ops == 0)
        tern__req_free(req->comm, req);
}

/* ---- receiving ---- */

/* Tell the sender of a len-byte eager message that it did not fit in cap. */
static tern_status_t truncated(tern__comm_t *comm, size_t cap, int src, int tag, size_t len)
{
    uint8_t msg[20];
    tern__put_le32(msg, (uint32_t)tag);
    tern__put_le64(msg + 4, len);
    tern__put_le64(msg + 12, cap);
    send_ctrl(comm, src, CTRL_NACK, msg, sizeof(msg));
    return TERN_ERR_TRUNCATED;
}

/* Copy an eager payload into buf[0..cap); credit it back; tell a truncated
 * sender. Returns TERN_OK or TERN_ERR_TRUNCATED. */
TERN__HOT tern_status_t copy_eager(tern__comm_t *comm, void *buf, size_t cap, int src, int tag,
                                   const uint8_t *data, size_t len)
{
    size_t n = len < cap ? len : cap;
    if (n > 0)
        memcpy(buf, data, n);
    consumed(comm, src, len);
    return len <= cap ? TERN_OK : truncated(comm, cap, src, tag, len);
}

/* Two ends of one collective message that belong to calls that differ
 * (count, dtype, op, root or algorithm: tern__coll_t.shape). Message sizes
 * catch most of that; not a ring whose ranks cut their chunks into equal
 * segments, but different numbers of them. */
static bool shapes_differ(uint32_t a, uint32_t b)
{
    return a != 0 && b != 0 && a != b;
}

/* The error of a message whose ends' signatures differ; dir: "send" or
 * "recv", peer: the other end. */
static tern_status_t shape_mismatch(const char *dir, int peer, int tag)
{
    return tern__error(TERN_ERR_MISMATCH, "%s: rank %d's call differs from ours (tag %d)", dir,
                       peer, tag);
}

/* An eager message of another call (its signature differs) is credited back
 * and dropped; the receive fails, and the collective's ABORT tells the
 * sender, whose send completed as it was posted. */
TERN__HOT void deliver_eager(tern__comm_t *comm, tern_request_t *req, int src, int tag,
                             uint64_t seq, uint32_t shape, const uint8_t *data, size_t len)
{
    req->info = (tern_msg_info_t){.source = src, .tag = tag, .len = len};
    req->seq = seq;
    if (shapes_differ(req->shape, shape)) {
        consumed(comm, src, len);
        tern__req_complete(req, shape_mismatch("recv", src, tag));
        return;
    }
    tern__req_complete(req, copy_eager(comm, req->buf, req->len, src, tag, data, len));
}

/*
 * The windows. Data on its way from one peer to another, by puts into
 * offered buffers or by the replies to rendezvous reads, is held to the
 * transport's attr.rx_window (tcp: its socket buffer) at a time, and at least
 * one operation always goes. Past it the receiving socket fills while its
 * process is busy elsewhere, and the kernel prunes its receive queue and
 * drops segments, each a 200 ms retransmission stall: a 2-rank bibw of 4 MiB
 * messages counted 5-8 of them per run and 26,000-42,000 retransmitted
 * segments without the read window, none and about 1,000 with it (docs/perf.md).
 * A send waiting for the window holds its receiver's offer (req->offer), a
 * receive its sender's RTS (req->pend).
 */

static void start_get(tern__comm_t *comm, tern_request_t *req, const unexp_t *u);
static void start_put(tern__comm_t *comm, tern_request_t *req, const rtr_t *e);

/* The peer a waiting request moves data with. */
static int wait_peer(const tern_request_t *r)
{
    return r->pend != NULL ? r->pend->src : r->peer;
}

/* The bytes it moves: a send's, or what a read takes of its message. */
static size_t wait_len(const tern_request_t *r)
{
    if (r->pend == NULL)
        return r->len;
    return r->pend->len < r->len ? r->pend->len : r->len;
}

/* Whether len more bytes must wait for window w (0: none), with inflight
 * already on their way between us and the peer. Reads are held to our own
 * window; puts to the peer's, which its offers carry (on_offer). */
static bool window_full(size_t w, size_t inflight, size_t len)
{
    return w > 0 && inflight > 0 && inflight + len > w;
}

/* Append req to a list of requests waiting for a window. */
static void fifo_push(tern_request_t **head, tern_request_t **tail, tern_request_t *req)
{
    req->next = NULL;
    if (*tail != NULL)
        (*tail)->next = req;
    else
        *head = req;
    *tail = req;
}

/* Start the puts or reads in a window queue (head, tail) that wait for
 * peer's window w (bytes: what is in flight with each peer), in order, while
 * it has room. */
static void window_drain(tern__comm_t *comm, tern_request_t **head, tern_request_t **tail,
                         const size_t *bytes, size_t w, int peer)
{
    tern_request_t **pp = head, *prev = NULL;
    while (*pp != NULL) {
        tern_request_t *r = *pp;
        if (wait_peer(r) != peer) {
            prev = r;
            pp = &r->next;
            continue;
        }
        if (window_full(w, bytes[peer], wait_len(r)))
            return;
        *pp = r->next;
        if (*tail == r)
            *tail = prev;
        if (r->pend != NULL) {
            unexp_t *u = r->pend;
            r->pend = NULL;
            start_get(comm, r, u);
            free(u);
        } else {
            rtr_t *k = r->offer;
            r->offer = NULL;
            start_put(comm, r, k);
            free(k);
        }
        /* Starting may have drained the queue again (get_done, put_done). */
        pp = head;
        prev = NULL;
    }
}

static void get_done(void *arg, tern_status_t st)
{
    tern_request_t *req = arg;
    tern__comm_t *comm = req->comm;
    int src = req->info.source;
    bool truncated = req->info.len > req->len;
    bool open = comm->get_bytes != NULL; /* else the transport's close cancels it after fini */

    if (open)
        comm->get_bytes[src] -= req->info.len < req->len ? req->info.len : req->len;
    req->ops--;
    tern_rkey_release(req->rkey);
    tern_mr_dereg(req->mr);
    req->rkey = NULL;
    req->mr = NULL;
    if (!atomic_load(&req->done)) {
        tern_status_t fin = st != TERN_OK ? st : truncated ? TERN_ERR_TRUNCATED : TERN_OK;
        send_fin(comm, src, req->id, fin);
        req->peer_withdrew = st == TERN_ERR_ACCESS; /* the sender revoked its buffer */
        tern__req_complete(req, fin);
    }
    req_maybe_free(req);
    if (open)
        window_drain(comm, &comm->get_waits, &comm->get_waits_tail, comm->get_bytes,
                     comm->attr.rx_window, src);
}

/* The rendezvous message u matched req: read it straight into the user's
 * buffer. */
static void start_get(tern__comm_t *comm, tern_request_t *req, const unexp_t *u)
{
    tern_ep_t *ep;
    int src = u->src;
    size_t n = u->len < req->len ? u->len : req->len;
    tern_status_t st;

    req->info = (tern_msg_info_t){.source = src, .tag = u->tag, .len = u->len};
    req->seq = u->seq;
    req->id = u->sreq;
    if (shapes_differ(req->shape, u->shape)) {
        st = shape_mismatch("recv", src, u->tag);
        goto fail;
    }
    if ((st = tern__comm_ep(comm, src, &ep)) != TERN_OK)
        goto fail;
    tern_mr_params_t mp = {.field_mask = TERN_MR_PARAM_ACCESS, .access = TERN_ACCESS_LOCAL};
    if ((st = tern_mr_reg(comm->tp, req->buf, n, &mp, &req->mr)) != TERN_OK)
        goto fail;
    if ((st = tern_rkey_unpack(ep, u->rkey, u->rkey_len, &req->rkey)) != TERN_OK)
        goto fail;
    tern_op_params_t op = {.field_mask = TERN_OP_PARAM_CB | TERN_OP_PARAM_MR,
                           .cb = get_done, .cb_arg = req, .mr = req->mr};
    req->ops++;
    comm->get_bytes[src] += n;
    st = tern_ep_get(ep, req->buf, n, u->raddr, req->rkey, &op);
    if (st == TERN_OK) {
        get_done(req, TERN_OK);
        return;
    }
    if (st == TERN_INPROGRESS)
        return;
    comm->get_bytes[src] -= n;
    req->ops--;
fail:
    tern_rkey_release(req->rkey);
    tern_mr_dereg(req->mr);
    req->rkey = NULL;
    req->mr = NULL;
    send_fin(comm, src, u->sreq, st);
    tern__req_complete(req, st);
}

/* Read the rendezvous message u (taken over) into req, now or when the read
 * window from its sender has room. */
static void get_or_queue(tern__comm_t *comm, tern_request_t *req, unexp_t *u)
{
    size_t n = u->len < req->len ? u->len : req->len;
    if (window_full(comm->attr.rx_window, comm->get_bytes[u->src], n)) {
        req->pend = u;
        fifo_push(&comm->get_waits, &comm->get_waits_tail, req);
        return;
    }
    start_get(comm, req, u);
    free(u);
}

/* Unlink *pp (prev before it) from the posted list and return it. */
static tern_request_t *unlink_posted(tern__comm_t *comm, tern_request_t **pp, tern_request_t *prev)
{
    tern_request_t *r = *pp;
    *pp = r->next;
    if (comm->posted_tail == r)
        comm->posted_tail = prev;
    return r;
}

/* The first posted receive matching an arrival, unlinked. */
TERN__HOT tern_request_t *take_posted(tern__comm_t *comm, uint32_t cid, int src, int tag)
{
    tern_request_t **pp, *prev = NULL;
    for (pp = &comm->posted_head; *pp != NULL; prev = *pp, pp = &(*pp)->next)
        if (matches(*pp, cid, src, tag))
            return unlink_posted(comm, pp, prev);
    return NULL;
}

/* The posted receive from src that offered its buffer under an id whose bits
 * in mask are id's, unlinked. */
static tern_request_t *take_offered(tern__comm_t *comm, int src, uint64_t id, uint64_t mask)
{
    tern_request_t **pp, *prev = NULL;
    for (pp = &comm->posted_head; *pp != NULL; prev = *pp, pp = &(*pp)->next) {
        const tern_request_t *r = *pp;
        if (r->rtr && r->peer == src && ((r->id ^ id) & mask) == 0)
            return unlink_posted(comm, pp, prev);
    }
    return NULL;
}

/* Take back req's offer (lock held): its message came another way, or the
 * receive is withdrawn. The key dies first, so a put already on its way is
 * refused; with tell, RTR_CANCEL has the sender drop the offer if it kept
 * it. */
static void rtr_withdraw(tern__comm_t *comm, tern_request_t *req, bool tell)
{
    if (!req->rtr)
        return;
    req->rtr = false;
    tern_mr_dereg(req->mr);
    req->mr = NULL;
    if (tell && comm->peer_failed[req->peer] == TERN_OK) {
        uint8_t msg[8];
        tern__put_le64(msg, req->id);
        send_ctrl(comm, req->peer, CTRL_RTR_CANCEL, msg, sizeof(msg));
    }
}

/* An offered receive's end (lock held): its put landed (TERN_OK, len bytes,
 * the message numbered next from its sender), or the sender refused it. */
static void offered_done(tern__comm_t *comm, tern_request_t *req, size_t len, tern_status_t st)
{
    req->rtr = false;
    tern_mr_dereg(req->mr);
    req->mr = NULL;
    req->info = (tern_msg_info_t){.source = req->peer, .tag = req->tag, .len = len};
    if (st == TERN_OK)
        req->seq = ++comm->arrived[req->peer];
    tern__req_complete(req, st);
}

/* The data of an offered receive is in place (TERN_EVENT_PUT_IMM). Puts and
 * sends on one endpoint arrive in order (tcp: one stream; verbs: one RC QP),
 * so the message is the next one from its sender. */
static void on_put(tern__comm_t *comm, const tern_event_t *ev)
{
    int src = (int)ev->src;
    tern_request_t *req = take_offered(comm, src, tern_imm_slot(ev->imm), TERN_IMM_SLOT_MASK);
    if (req == NULL) {
        tern_warn("p2p: rank %d wrote %zu bytes for a receive that is not waiting (slot %u)", src,
                  ev->len, tern_imm_slot(ev->imm));
        return;
    }
    offered_done(comm, req, ev->len, TERN_OK);
}

/* The memory a queued rendezvous message holds (comm->unexpected_hdrs). */
static size_t hdr_bytes(const unexp_t *u)
{
    return u->rndv ? sizeof(*u) + u->rkey_len : 0;
}

static void append_unexp(tern__comm_t *comm, unexp_t *u)
{
    comm->unexpected_hdrs += hdr_bytes(u);
    u->next = NULL;
    if (comm->unexp_tail)
        comm->unexp_tail->next = u;
    else
        comm->unexp_head = u;
    comm->unexp_tail = u;
}

/* Reads an eager message's header; false if it is malformed. */
static bool eager_parse(const uint8_t *p, size_t n, uint32_t *cid, int *tag, uint32_t *shape,
                        size_t *hdr)
{
    if (n >= EAGER_SHORT_HDR && p[0] == EAGER_SHORT) {
        *cid = 0;
        *tag = (int)tern__get_le16(p + 1);
        *shape = 0;
        *hdr = EAGER_SHORT_HDR;
        return true;
    }
    if (n < EAGER_LONG_HDR || p[0] != EAGER_LONG)
        return false;
    *cid = tern__get_le32(p + 1);
    *tag = (int32_t)tern__get_le32(p + 5);
    *hdr = eager_long_hdr(*cid);
    if (n < *hdr)
        return false;
    *shape = *cid != 0 ? tern__get_le32(p + EAGER_LONG_HDR) : 0;
    return true;
}

static void on_eager(tern__comm_t *comm, const tern_event_t *ev, void *arg)
{
    (void)arg;
    int src = (int)ev->src, tag;
    const uint8_t *p = ev->data;
    uint32_t cid, shape;
    size_t hdr;
    if (ev->type != TERN_EVENT_RECV || ev->src >= comm->world ||
        !eager_parse(p, ev->len, &cid, &tag, &shape, &hdr)) {
        tern_warn("p2p: malformed eager message from rank %u (%zu bytes); dropped", ev->src, ev->len);
        return;
    }
    size_t len = ev->len - hdr;
    uint64_t seq = msg_seq(comm, src, ev->imm);
    tern_request_t *req = take_posted(comm, cid, src, tag);
    if (req != NULL) {
        if (req->rtr)
            rtr_withdraw(comm, req, true);
        deliver_eager(comm, req, src, tag, seq, shape, p + hdr, len);
        return;
    }
    if (cid != 0 && cid_dead(comm, cid)) {
        consumed(comm, src, len);
        return;
    }
    /* Credit bounds this; a peer that ignores it is refused rather than let
     * grow us without limit. */
    if (comm->unexpected_bytes + eager_charge(len) > comm->credit_per_peer * comm->world) {
        tern_error("p2p: rank %d sent %zu eager bytes beyond its credit; message (tag %d) dropped",
                   src, len, tag);
        return;
    }
    unexp_t *u = calloc(1, sizeof(*u));
    void *copy = len ? malloc(len) : NULL;
    if (u == NULL || (len && copy == NULL)) {
        free(u);
        free(copy);
        tern_error("p2p: no memory to queue a %zu-byte message from rank %d; dropped", len, src);
        return;
    }
    if (len)
        memcpy(copy, p + hdr, len);
    *u = (unexp_t){
        .cid = cid, .src = src, .tag = tag, .len = len, .data = copy, .seq = seq, .shape = shape};
    comm->unexpected_bytes += eager_charge(len);
    append_unexp(comm, u);
}

/* An offer of a buffer: RTS (the sender's) or RTR (the receiver's). */
typedef struct offer {
    uint32_t cid;
    int tag;
    uint64_t len, id, addr;
    uint32_t rkey_len;
    const uint8_t *rkey;
    uint64_t window; /* RTR: the receiver's rx_window */
    uint32_t shape;  /* its request's (tern_request.shape) */
} offer_t;

/* Bytes of an offer with a klen-byte key: header, key, shape, and an RTR's
 * window. */
static size_t offer_len(size_t klen, bool rtr)
{
    return RTS_HDR + klen + 4 + (rtr ? 8 : 0);
}

/* Register req's buffer with access and write the offer of it {cid, tag,
 * len, id, address, key length}, key, shape u32, and for an RTR (rtr) the
 * receiver's window u64, into a new bounce buffer (*out), under a new id. On
 * failure req->mr is NULL again. */
static tern_status_t offer_build(tern__comm_t *comm, tern_request_t *req, unsigned access,
                                 bool rtr, bounce_t **out)
{
    uint8_t key[TERN_RKEY_MAX];
    size_t klen = sizeof(key);
    tern_mr_params_t mp = {.field_mask = TERN_MR_PARAM_ACCESS, .access = access};
    tern_status_t st;
    bounce_t *b;
    if ((st = tern_mr_reg(comm->tp, req->buf, req->len, &mp, &req->mr)) != TERN_OK)
        goto fail;
    if ((st = tern_mr_pack(req->mr, key, &klen)) != TERN_OK)
        goto fail;
    if ((b = bounce_new(comm, offer_len(klen, rtr))) == NULL) {
        st = tern__error(TERN_ERR_NO_MEMORY, "p2p: no memory for an offer");
        goto fail;
    }
    req->id = ++comm->next_id;
    tern__put_le32(b->data, req->cid);
    tern__put_le32(b->data + 4, (uint32_t)req->tag);
    tern__put_le64(b->data + 8, req->len);
    tern__put_le64(b->data + 16, req->id);
    tern__put_le64(b->data + 24, (uintptr_t)req->buf);
    tern__put_le32(b->data + 32, (uint32_t)klen);
    memcpy(b->data + RTS_HDR, key, klen);
    tern__put_le32(b->data + RTS_HDR + klen, req->shape);
    if (rtr)
        tern__put_le64(b->data + RTS_HDR + klen + 4, comm->attr.rx_window);
    *out = b;
    return TERN_OK;
fail:
    tern_mr_dereg(req->mr);
    req->mr = NULL;
    return st;
}

static bool offer_decode(const tern_event_t *ev, bool rtr, offer_t *o)
{
    const uint8_t *p = ev->data;
    if (ev->type != TERN_EVENT_RECV || ev->len < RTS_HDR)
        return false;
    o->rkey_len = tern__get_le32(p + 32);
    if (o->rkey_len > TERN_RKEY_MAX || ev->len != offer_len(o->rkey_len, rtr))
        return false;
    o->shape = tern__get_le32(p + RTS_HDR + o->rkey_len);
    o->window = rtr ? tern__get_le64(p + RTS_HDR + o->rkey_len + 4) : 0;
    o->cid = tern__get_le32(p);
    o->tag = (int32_t)tern__get_le32(p + 4);
    o->len = tern__get_le64(p + 8);
    o->id = tern__get_le64(p + 16);
    o->addr = tern__get_le64(p + 24);
    o->rkey = p + RTS_HDR;
    return true;
}

/* Class P2P_RNDV: an RTS, or the put into an offered receive. */
static void on_rndv(tern__comm_t *comm, const tern_event_t *ev, void *arg)
{
    (void)arg;
    int src = (int)ev->src;
    offer_t o;
    if (ev->src < comm->world && ev->type == TERN_EVENT_PUT_IMM) {
        on_put(comm, ev);
        return;
    }
    if (ev->type == TERN_EVENT_ERROR) {
        /* Our transport refused a put into a receive that had withdrawn its
         * offer; the sender hears it from its put. */
        tern_debug("p2p: refused a put from rank %u: %s", ev->src, tern_strerror(ev->status));
        return;
    }
    if (ev->src >= comm->world || !offer_decode(ev, false, &o)) {
        tern_warn("p2p: malformed rendezvous message from rank %u (%zu bytes); dropped", ev->src,
                  ev->len);
        return;
    }
    uint64_t seq = msg_seq(comm, src, ev->imm);
    if (o.cid != 0 && cid_dead(comm, o.cid)) {
        send_fin(comm, src, o.id, TERN_ERR_CANCELED);
        return;
    }
    unexp_t *u = calloc(1, sizeof(*u) + o.rkey_len);
    if (u == NULL) {
        tern_error("p2p: no memory to take a rendezvous from rank %d", src);
        send_fin(comm, src, o.id, TERN_ERR_NO_MEMORY);
        return;
    }
    *u = (unexp_t){.cid = o.cid, .src = src, .tag = o.tag, .len = (size_t)o.len, .rndv = true,
                   .sreq = o.id, .raddr = o.addr, .rkey_len = o.rkey_len, .shape = o.shape,
                   .seq = seq};
    memcpy(u->rkey, o.rkey, o.rkey_len);
    tern_request_t *req = take_posted(comm, o.cid, src, o.tag);
    if (req != NULL) {
        rtr_withdraw(comm, req, true);
        get_or_queue(comm, req, u);
        return;
    }
    /* Credit bounds the eager payload queued here; this bounds the
     * rendezvous headers, which a sender posting sends without end would
     * otherwise grow without limit. Its send fails, saying why; the
     * messages queued before it keep their order. */
    size_t max = (size_t)tern__ctx_config(comm->ctx)->unexpected_max;
    if (comm->unexpected_hdrs + hdr_bytes(u) > max) {
        if (!comm->hdrs_full_said)
            tern_error("p2p: rendezvous messages waiting for their receives hold %zu bytes, "
                       "TERN_UNEXPECTED_MAX is %zu; rank %d's (tag %d, %" PRIu64
                       " bytes) and those after it are refused until receives take some",
                       comm->unexpected_hdrs, max, src, o.tag, o.len);
        comm->hdrs_full_said = true;
        free(u);
        send_fin(comm, src, o.id, TERN_ERR_NO_RESOURCE);
        return;
    }
    comm->hdrs_full_said = false;
    append_unexp(comm, u);
}

/* ---- the sender's side of offered buffers ---- */

static void rtr_fail(tern__comm_t *comm, int dst, uint64_t rid, size_t len, tern_status_t st)
{
    uint8_t msg[20];
    if (comm->peer_failed[dst] != TERN_OK)
        return;
    tern__put_le64(msg, rid);
    tern__put_le64(msg + 8, len);
    tern__put_le32(msg + 16, (uint32_t)st);
    send_ctrl(comm, dst, CTRL_RTR_FAIL, msg, sizeof(msg));
}

/* Put req into its receiver's offer k (taken over), now or when dst's
 * window has room. */
static void put_or_queue(tern__comm_t *comm, tern_request_t *req, rtr_t *k)
{
    if (window_full(comm->put_window[req->peer], comm->put_bytes[req->peer], req->len)) {
        req->offer = k;
        fifo_push(&comm->rtr_ready, &comm->rtr_ready_tail, req);
        return;
    }
    start_put(comm, req, k);
    free(k);
}

static void put_done(void *arg, tern_status_t st)
{
    tern_request_t *req = arg;
    tern__comm_t *comm = req->comm;
    bool open = comm->put_bytes != NULL; /* else the transport's close cancels it after fini */
    if (open)
        comm->put_bytes[req->peer] -= req->len;
    req->ops--;
    tern_rkey_release(req->rkey);
    tern_mr_dereg(req->mr);
    req->rkey = NULL;
    req->mr = NULL;
    int dst = req->peer;
    if (!atomic_load(&req->done)) {
        /* The offer was good when it came: a refusal means it was revoked. */
        req->peer_withdrew = st == TERN_ERR_ACCESS;
        tern__req_complete(req, st);
    }
    req_maybe_free(req);
    if (open)
        window_drain(comm, &comm->rtr_ready, &comm->rtr_ready_tail, comm->put_bytes,
                     comm->put_window[dst], dst);
}

/* Write a send into the buffer its receiver offered (lock held). Whatever
 * happens completes req, and a receiver that will get no data hears why. */
static void start_put(tern__comm_t *comm, tern_request_t *req, const rtr_t *e)
{
    int dst = req->peer;
    tern_ep_t *ep;
    tern_status_t st;
    if (shapes_differ(req->shape, e->shape)) {
        st = shape_mismatch("send", dst, req->tag);
        goto fail;
    }
    if (req->len > e->cap) {
        st = tern__error(TERN_ERR_TRUNCATED, "send: rank %d offered %zu bytes for %zu (tag %d)",
                         dst, e->cap, req->len, req->tag);
        goto fail;
    }
    tern_mr_params_t mp = {.field_mask = TERN_MR_PARAM_ACCESS, .access = TERN_ACCESS_LOCAL};
    if ((st = tern__comm_ep(comm, dst, &ep)) != TERN_OK ||
        (st = tern_mr_reg(comm->tp, req->buf, req->len, &mp, &req->mr)) != TERN_OK ||
        (st = tern_rkey_unpack(ep, e->rkey, e->rkey_len, &req->rkey)) != TERN_OK)
        goto fail;
    tern_op_params_t op = {.field_mask = TERN_OP_PARAM_CB | TERN_OP_PARAM_MR | TERN_OP_PARAM_IMM,
                           .cb = put_done, .cb_arg = req, .mr = req->mr,
                           .imm = tern_imm_make(TERN_IMM_P2P_RNDV, 0, 0, (uint32_t)e->rid)};
    if (req->way != TERN_WAY_AUTO) {
        op.field_mask |= TERN_OP_PARAM_WAY;
        op.way = (tern_op_way_t)req->way;
    }
    req->seq = ++comm->sent[dst];
    req->ops++;
    comm->put_bytes[dst] += req->len;
    st = tern_ep_put(ep, req->buf, req->len, e->raddr, req->rkey, &op);
    if (st == TERN_OK)
        put_done(req, TERN_OK);
    if (st == TERN_OK || st == TERN_INPROGRESS)
        return;
    comm->put_bytes[dst] -= req->len;
    req->ops--;
    comm->sent[dst]--; /* nothing went out under that number */
    req->seq = 0;
fail:
    tern_rkey_release(req->rkey);
    tern_mr_dereg(req->mr);
    req->rkey = NULL;
    req->mr = NULL;
    rtr_fail(comm, dst, e->rid, req->len, st);
    tern__req_complete(req, st);
}

/* A receiver's offer (RTR): to the send waiting for it, or kept for it. */
static void on_offer(tern__comm_t *comm, int src, const offer_t *o)
{
    /* The receiver's socket is what a put fills: its window, not ours
     * (TERN_TCP_SOCKBUF may differ between ranks). */
    if (o->window > 0 && comm->put_window[src] != (size_t)o->window) {
        tern_debug("p2p: puts to rank %d held to its window of %" PRIu64 " bytes", src,
                   o->window);
        comm->put_window[src] = (size_t)o->window;
    }
    if (o->cid != 0 && cid_dead(comm, o->cid))
        return;
    rtr_t *k = comm->nrtrs < RTRS_MAX ? malloc(sizeof(*k)) : NULL;
    if (k == NULL) {
        tern_warn("p2p: %s to keep rank %d's offer (tag %d); its send will offer its own buffer",
                  comm->nrtrs < RTRS_MAX ? "no memory" : "too many offers", src, o->tag);
        return;
    }
    *k = (rtr_t){.cid = o->cid, .shape = o->shape, .src = src, .tag = o->tag,
                 .cap = (size_t)o->len, .rid = o->id, .raddr = o->addr, .rkey_len = o->rkey_len};
    memcpy(k->rkey, o->rkey, o->rkey_len);
    for (tern_request_t **pp = &comm->rtr_waits; *pp != NULL; pp = &(*pp)->next) {
        tern_request_t *r = *pp;
        if (r->peer == src && r->cid == o->cid && r->tag == o->tag) {
            *pp = r->next;
            put_or_queue(comm, r, k);
            return;
        }
    }
    k->next = comm->rtrs;
    comm->rtrs = k;
    comm->nrtrs++;
}

/* Drop the kept offers from src (-1: all) for communicator cid (0: any; user
 * p2p makes no offers). Returns how many. */
static size_t rtrs_drop(tern__comm_t *comm, int src, uint32_t cid)
{
    size_t n = 0;
    for (rtr_t **pp = &comm->rtrs; *pp != NULL;) {
        rtr_t *k = *pp;
        if ((src >= 0 && k->src != src) || (cid != 0 && k->cid != cid)) {
            pp = &k->next;
            continue;
        }
        *pp = k->next;
        comm->nrtrs--;
        n++;
        free(k);
    }
    return n;
}

/* The kept offer from src for (cid, tag), or with by_id the one under the
 * receive's id rid, unlinked. */
static rtr_t *rtr_take(tern__comm_t *comm, int src, uint32_t cid, int tag, uint64_t rid, bool by_id)
{
    for (rtr_t **pp = &comm->rtrs; *pp != NULL; pp = &(*pp)->next) {
        rtr_t *k = *pp;
        if (k->src == src && (by_id ? k->rid == rid : k->cid == cid && k->tag == tag)) {
            *pp = k->next;
            comm->nrtrs--;
            return k;
        }
    }
    return NULL;
}

static void on_control(tern__comm_t *comm, const tern_event_t *ev, void *arg)
{
    (void)arg;
    const uint8_t *p = ev->data;
    if (ev->type == TERN_EVENT_ERROR) {
        tern_warn("p2p: rank %u refused an operation: %s", ev->src, tern_strerror(ev->status));
        return;
    }
    if (ev->src >= comm->world)
        return;
    switch (tern_imm_slot(ev->imm)) {
    case CTRL_FIN: {
        if (ev->len != 12)
            break;
        uint64_t id = tern__get_le64(p);
        tern_status_t st = tern__status_from_wire((int32_t)tern__get_le32(p + 8));
        tern_request_t **pp;
        for (pp = &comm->rndv_sends; *pp != NULL; pp = &(*pp)->next) {
            tern_request_t *r = *pp;
            if (r->id == id && r->peer == (int)ev->src) {
                *pp = r->next;
                tern_mr_dereg(r->mr);
                r->mr = NULL;
                r->peer_withdrew = st == TERN_ERR_CANCELED;
                tern__req_complete(r, st);
                req_maybe_free(r);
                return;
            }
        }
        /* Both ends of a failed collective withdraw what they posted, so a
         * receive that was canceled, or whose read was refused, may tell a
         * sender that has canceled its send already. A success for a send
         * nobody knows is a protocol error. */
        if (st != TERN_OK)
            tern_debug("p2p: FIN (%s) for send %" PRIu64 " from rank %u, no longer waiting",
                       tern_status_name(st), id, ev->src);
        else
            tern_warn("p2p: FIN for unknown send %" PRIu64 " from rank %u", id, ev->src);
        return;
    }
    case CTRL_PING: {
        /* Answer at once, with our clock as late as possible. */
        if (ev->len != 8)
            break;
        uint8_t msg[16];
        memcpy(msg, p, 8);
        tern__put_le64(msg + 8, (uint64_t)tern_prof_clock_ns());
        send_ctrl(comm, (int)ev->src, CTRL_PONG, msg, sizeof(msg));
        return;
    }
    case CTRL_PONG:
        if (ev->len != 16)
            break;
        tern__prof_clock_pong(comm, (int)ev->src, tern__get_le64(p),
                              (int64_t)tern__get_le64(p + 8));
        return;
    case CTRL_CREDIT: {
        if (ev->len != 8)
            break;
        /* A peer hands back what it consumed, never more than this rank
         * charged: more would let this rank overrun the peer's unexpected
         * queue, or overflow the count. The excess is dropped, not the
         * return: a later honest return then still counts in full. */
        uint64_t back = tern__get_le64(p);
        int64_t owed = comm->pair[ev->src].credit - comm->credits[ev->src];
        if (back > (uint64_t)owed) {
            tern_warn("p2p: rank %u handed back %" PRIu64 " bytes of eager credit, more than "
                      "the %" PRId64 " this rank charged; took %" PRId64,
                      ev->src, back, owed, owed);
            back = (uint64_t)owed;
        }
        comm->credits[ev->src] += (int64_t)back;
        return;
    }
    case CTRL_RTR: {
        offer_t o;
        if (!offer_decode(ev, true, &o))
            break;
        on_offer(comm, (int)ev->src, &o);
        return;
    }
    case CTRL_RTR_CANCEL:
        if (ev->len != 8)
            break;
        free(rtr_take(comm, (int)ev->src, 0, 0, tern__get_le64(p), true));
        return;
    case CTRL_RTR_FAIL: {
        tern_status_t st =
            ev->len == 20 ? tern__status_from_wire((int32_t)tern__get_le32(p + 16)) : TERN_OK;
        if (st == TERN_OK)
            break;
        tern_request_t *req = take_offered(comm, (int)ev->src, tern__get_le64(p), UINT64_MAX);
        if (req != NULL) {
            req->peer_withdrew = st == TERN_ERR_CANCELED; /* the send was withdrawn */
            offered_done(comm, req, (size_t)tern__get_le64(p + 8), st);
        }
        return;
    }
    case CTRL_NACK: {
        if (ev->len != 20)
            break;
        tern_p2p_error_t e = {.status = TERN_ERR_TRUNCATED,
                              .peer = (int)ev->src,
                              .tag = (int32_t)tern__get_le32(p),
                              .len = (size_t)tern__get_le64(p + 4),
                              .cap = (size_t)tern__get_le64(p + 12)};
        bool keep = comm->nerrors < TERN_P2P_ERRORS_KEPT;
        tern_warn("rank %u truncated our %zu-byte message (tag %d) to its %zu-byte buffer%s",
                  ev->src, e.len, e.tag, e.cap,
                  keep ? ""
                       : " (not kept: TERN_P2P_ERRORS_KEPT reports already wait for "
                         "tern_p2p_error)");
        if (keep)
            comm->errors[(comm->errors_head + comm->nerrors++) % TERN_P2P_ERRORS_KEPT] = e;
        else
            comm->errors_dropped++;
        return;
    }
    default:
        break;
    }
    tern_warn("p2p: malformed control message from rank %u; dropped", ev->src);
}

/* ---- posting ---- */

TERN__HOT tern_status_t check_send(tern__comm_t *comm, const void *buf, size_t len, int dst,
                                   int tag)
{
    if ((buf == NULL && len > 0) || tag < 0)
        return tern__error(TERN_ERR_INVALID_PARAM, "send: %s",
                           tag < 0 ? "tag must be 0..TERN_TAG_MAX" : "NULL argument");
    if (dst < 0 || (unsigned)dst >= comm->world)
        return tern__error(TERN_ERR_INVALID_PARAM, "send: rank %d is not in the world of %u", dst,
                           comm->world);
    return TERN_OK;
}

/* The endpoint to dst, and with it the pair's terms (eager_fits, rtr_fits),
 * before a send decides how it goes (lock held). */
TERN__HOT tern_status_t pair_open(tern__comm_t *comm, int dst)
{
    tern_ep_t *ep;
    return __builtin_expect(comm->eps[dst] != NULL, 1) ? TERN_OK : tern__comm_ep(comm, dst, &ep);
}

/* Whether a send goes eager. A collective's decides by the pair's terms, as
 * its receiver does (rtr_fits); p2p's by this rank's limit alone, since its
 * receiver takes either form. */
static bool eager_fits(const tern__comm_t *comm, uint32_t cid, size_t len, int dst)
{
    return len <= (cid == 0 ? comm->eager_limit : comm->pair[dst].coll_eager) &&
           comm->credits[dst] >= (int64_t)eager_charge(len);
}

/* Whether a message of len bytes with flags between this rank and peer goes
 * into an offered buffer; sender and receiver decide alike, by the pair's
 * terms (known once the endpoint to peer is open: both sides open it first). */
static bool rtr_fits(const tern__comm_t *comm, uint32_t cid, size_t len, unsigned flags, int peer)
{
    return (flags & TERN__P2P_RTR) && cid != 0 && comm->pair[peer].rtr &&
           len > comm->pair[peer].coll_eager;
}

/* Offer a send's buffer to its receiver (lock held): RTS, then its FIN. */
static tern_status_t send_rts(tern__comm_t *comm, tern_request_t *req)
{
    bounce_t *b;
    tern_status_t st =
        offer_build(comm, req,
                    TERN_ACCESS_LOCAL | TERN_ACCESS_REMOTE_READ | TERN_ACCESS_REMOTE_READ_HELD,
                    false, &b);
    if (st == TERN_OK)
        st = send_bounce(comm, req->peer, msg_imm(comm, TERN_IMM_P2P_RNDV, req->peer, &req->seq),
                         b);
    if (st != TERN_OK) {
        tern_mr_dereg(req->mr);
        req->mr = NULL;
        return st;
    }
    req->next = comm->rndv_sends;
    comm->rndv_sends = req;
    return TERN_OK;
}

/* Offer a receive's buffer to its sender (lock held; req is in the posted
 * list). An offer that cannot be made is no error: the sender stops waiting
 * for it after RTR_WAIT_NS. */
static void rtr_offer(tern__comm_t *comm, tern_request_t *req)
{
    bounce_t *b;
    tern_status_t st =
        offer_build(comm, req, TERN_ACCESS_LOCAL | TERN_ACCESS_REMOTE_WRITE, true, &b);
    if (st == TERN_OK)
        st = send_bounce(comm, req->peer, tern_imm_make(TERN_IMM_CONTROL, 0, 0, CTRL_RTR), b);
    if (st == TERN_OK) {
        req->rtr = true;
        return;
    }
    tern_debug("p2p: a %zu-byte receive from rank %d not offered (%s): its sender waits %llu ms",
               req->len, req->peer, tern_strerror(st), RTR_WAIT_NS / 1000000);
    tern_mr_dereg(req->mr);
    req->mr = NULL;
}

void tern__p2p_rtr_tick(tern__comm_t *comm, uint64_t now)
{
    for (tern_request_t **pp = &comm->rtr_waits; *pp != NULL;) {
        tern_request_t *r = *pp;
        if (r->since == 0)
            r->since = now;
        if (now - r->since < RTR_WAIT_NS) {
            pp = &r->next;
            continue;
        }
        *pp = r->next;
        tern_debug("p2p: rank %d offered no buffer for %llu ms (tag %d, %zu bytes): offering ours",
                   r->peer, RTR_WAIT_NS / 1000000, r->tag, r->len);
        tern_status_t st = send_rts(comm, r);
        if (st != TERN_OK)
            tern__req_complete(r, st);
    }
}

/* The eager header (its form, the tag, and in the long form the cid and a
 * collective's shape), then the payload; returns the message's length. */
TERN__HOT size_t eager_build(uint8_t *msg, uint32_t cid, int tag, uint32_t shape,
                             const void *buf, size_t len)
{
    size_t hdr;
    if (eager_short(cid, tag)) {
        msg[0] = EAGER_SHORT;
        tern__put_le16(msg + 1, (uint16_t)tag);
        hdr = EAGER_SHORT_HDR;
    } else {
        msg[0] = EAGER_LONG;
        tern__put_le32(msg + 1, cid);
        tern__put_le32(msg + 5, (uint32_t)tag);
        if (cid != 0)
            tern__put_le32(msg + EAGER_LONG_HDR, shape);
        hdr = eager_long_hdr(cid);
    }
    if (len)
        memcpy(msg + hdr, buf, len);
    return hdr + len;
}

/* Whether an eager message of len payload bytes goes by tern_ep_send_inline. */
TERN__HOT bool eager_inline(const tern__comm_t *comm, uint32_t cid, int tag, size_t len)
{
    const size_t n = eager_hdr(cid, tag) + len;
    return n <= comm->attr.max_inline && n <= BOUNCE_SMALL;
}

/* An eager send the transport copies as it posts (lock held, eager_fits,
 * eager_inline): built on the stack after the room the transport wants for
 * its own header (tern_ep_send_inline): no bounce buffer, which on shared
 * memory was a tenth of a small message's cost, and nothing for the
 * transport to gather or keep. */
TERN__HOT tern_status_t send_eager_inline(tern__comm_t *comm, uint32_t cid, const void *buf,
                                          size_t len, int dst, int tag, uint32_t shape,
                                          uint64_t *seq)
{
    uint8_t stack[TERN_INLINE_PREFIX_MAX + BOUNCE_SMALL];
    tern_ep_t *ep;
    const size_t n = eager_build(stack + comm->attr.inline_prefix, cid, tag, shape, buf, len);
    const uint32_t imm = msg_imm(comm, TERN_IMM_P2P_EAGER, dst, seq);
    tern_status_t st = tern__comm_ep(comm, dst, &ep);
    return st == TERN_OK ? tern_ep_send_inline(ep, imm, stack, n) : st;
}

/* An eager send too large for that, from a bounce buffer (lock held,
 * eager_fits). */
static tern_status_t send_eager_bounce(tern__comm_t *comm, uint32_t cid, const void *buf,
                                       size_t len, int dst, int tag, uint32_t shape, uint64_t *seq)
{
    const size_t n = eager_hdr(cid, tag) + len;
    bounce_t *b = bounce_new(comm, n);
    if (b == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "send: no memory for %zu bytes", len);
    eager_build(b->data, cid, tag, shape, buf, len);
    const uint32_t imm = msg_imm(comm, TERN_IMM_P2P_EAGER, dst, seq);
    return send_msg(comm, dst, imm, b->data, n, b);
}

/* An eager send (lock held, eager_fits): the payload is copied out, so the
 * send is complete when this returns TERN_OK, and its bytes are charged to
 * dst's credit. */
TERN__HOT tern_status_t send_eager(tern__comm_t *comm, uint32_t cid, const void *buf, size_t len,
                                   int dst, int tag, uint32_t shape, uint64_t *seq)
{
    tern_status_t st = eager_inline(comm, cid, tag, len)
                            ? send_eager_inline(comm, cid, buf, len, dst, tag, shape, seq)
                            : send_eager_bounce(comm, cid, buf, len, dst, tag, shape, seq);
    if (st == TERN_OK)
        comm->credits[dst] -= (int64_t)eager_charge(len);
    return st;
}

tern_status_t tern__p2p_isend(tern__comm_t *comm, uint32_t cid, const void *buf, size_t len,
                              int dst, int tag, tern_request_t **req_out)
{
    tern_status_t st;
    if (req_out == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "isend: NULL request pointer");
    tern__comm_lock(comm);
    st = tern__p2p_isend_locked(comm, cid, buf, len, dst, tag, 0, 0, req_out);
    tern__comm_unlock(comm);
    return st;
}

tern_status_t tern__p2p_isend_locked(tern__comm_t *comm, uint32_t cid, const void *buf, size_t len,
                                     int dst, int tag, unsigned flags, uint32_t shape,
                                     tern_request_t **req_out)
{
    tern_request_t *req;
    tern_status_t st;

    if ((st = check_send(comm, buf, len, dst, tag)) != TERN_OK ||
        (st = pair_open(comm, dst)) != TERN_OK)
        return st;
    if ((req = req_new(comm)) == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "isend: no memory");
    *req = (tern_request_t){.comm = comm, .kind = REQ_SEND, .cid = cid, .peer = dst, .tag = tag,
                            .shape = shape, .buf = (void *)buf, .len = len};
    req->info = (tern_msg_info_t){.source = dst, .tag = tag, .len = len};
    req->way = (uint8_t)TERN__P2P_WAY_OF(flags);
    if (eager_fits(comm, cid, len, dst)) {
        if ((st = send_eager(comm, cid, buf, len, dst, tag, shape, &req->seq)) != TERN_OK)
            goto fail;
        tern__req_complete(req, TERN_OK); /* the payload is ours now: the buffer is free */
    } else if (rtr_fits(comm, cid, len, flags, dst)) {
        rtr_t *k = rtr_take(comm, dst, cid, tag, 0, false);
        if (k != NULL) {
            put_or_queue(comm, req, k); /* completes req if it fails */
        } else {
            req->next = comm->rtr_waits;
            comm->rtr_waits = req;
        }
    } else if ((st = send_rts(comm, req)) != TERN_OK) {
        goto fail;
    }
    *req_out = req;
    return TERN_OK;
fail:
    tern__req_free(comm, req);
    return st;
}

/* A send that goes out eager at once, with no request (lock held): then
 * *sent is true and *seq its number; otherwise nothing is sent. The blocking
 * send and the collectives' send steps share it (TERN__HOT: the former is
 * the small-message path). */
TERN__HOT tern_status_t send_now(tern__comm_t *comm, uint32_t cid, const void *buf, size_t len,
                                 int dst, int tag, uint32_t shape, uint64_t *seq, bool *sent)
{
    tern_status_t st;

    *sent = false;
    if ((st = check_send(comm, buf, len, dst, tag)) != TERN_OK ||
        (st = pair_open(comm, dst)) != TERN_OK || !eager_fits(comm, cid, len, dst))
        return st;
    if ((st = send_eager(comm, cid, buf, len, dst, tag, shape, seq)) == TERN_OK)
        *sent = true;
    return st;
}

tern_status_t tern__p2p_send_eager_locked(tern__comm_t *comm, uint32_t cid, const void *buf,
                                          size_t len, int dst, int tag, uint32_t shape, bool *sent)
{
    uint64_t seq;
    return send_now(comm, cid, buf, len, dst, tag, shape, &seq, sent);
}

static tern_status_t check_recv(tern__comm_t *comm, void *buf, size_t cap, int src, int tag)
{
    if ((buf == NULL && cap > 0) || tag < TERN_ANY_TAG)
        return tern__error(TERN_ERR_INVALID_PARAM, "recv: %s",
                           tag < TERN_ANY_TAG ? "tag must be TERN_ANY_TAG or 0..TERN_TAG_MAX"
                                              : "NULL argument");
    if (src != TERN_ANY_SOURCE && (src < 0 || (unsigned)src >= comm->world))
        return tern__error(TERN_ERR_INVALID_PARAM, "recv: rank %d is not in the world of %u", src,
                           comm->world);
    return TERN_OK;
}

/* The first unexpected message matching (cid, src, tag) (lock held); *prev
 * is the one before it, for unlink_unexp. */
static unexp_t *find_unexp(tern__comm_t *comm, uint32_t cid, int src, int tag, unexp_t **prev)
{
    const tern_request_t probe = {.cid = cid, .peer = src, .tag = tag};
    *prev = NULL;
    for (unexp_t *e = comm->unexp_head; e != NULL; *prev = e, e = e->next)
        if (matches(&probe, e->cid, e->src, e->tag))
            return e;
    return NULL;
}

static void unlink_unexp(tern__comm_t *comm, unexp_t *u, unexp_t *prev)
{
    comm->unexpected_hdrs -= hdr_bytes(u);
    if (prev != NULL)
        prev->next = u->next;
    else
        comm->unexp_head = u->next;
    if (comm->unexp_tail == u)
        comm->unexp_tail = prev;
}

/* ---- communicators that are gone ---- */

/* Let go of a message for a dead communicator (lock held): eager bytes are
 * credited back to their sender, a rendezvous sender is told. */
static void unexp_drop(tern__comm_t *comm, unexp_t *u)
{
    if (u->rndv)
        send_fin(comm, u->src, u->sreq, TERN_ERR_CANCELED);
    else
        consumed(comm, u->src, u->len);
    free(u->data);
    free(u);
}

void tern__p2p_drop_cid(tern__comm_t *comm, uint32_t cid)
{
    size_t n = 0, bytes = 0;
    tern__comm_lock(comm);
    if (!cid_dead(comm, cid)) {
        if (comm->ndead == comm->dead_cap) {
            size_t cap = comm->dead_cap ? 2 * comm->dead_cap : 16;
            uint32_t *d = realloc(comm->dead_cids, cap * sizeof(*d));
            if (d != NULL) {
                comm->dead_cids = d;
                comm->dead_cap = cap;
            }
        }
        /* Without room, later arrivals stay queued, as before this list. */
        if (comm->ndead < comm->dead_cap) {
            size_t i = comm->ndead;
            for (; i > 0 && comm->dead_cids[i - 1] > cid; i--)
                comm->dead_cids[i] = comm->dead_cids[i - 1];
            comm->dead_cids[i] = cid;
            comm->ndead++;
        }
    }
    for (unexp_t *u = comm->unexp_head, *prev = NULL, *next; u != NULL; u = next) {
        next = u->next;
        if (u->cid != cid) {
            prev = u;
            continue;
        }
        unlink_unexp(comm, u, prev);
        if (!u->rndv)
            comm->unexpected_bytes -= eager_charge(u->len);
        n++;
        bytes += u->len;
        unexp_drop(comm, u);
    }
    n += rtrs_drop(comm, -1, cid);
    tern__comm_unlock(comm);
    if (n > 0)
        tern_debug("p2p: communicator %" PRIu32 " is gone: dropped %zu messages or offers for it "
                   "(%zu bytes)",
                   cid, n, bytes);
}

/* Post a receive (lock held) given the first matching unexpected message u
 * (NULL if none; prev before it, as find_unexp gives them): it takes u, or
 * waits in the posted list. */
TERN__HOT tern_status_t irecv_post(tern__comm_t *comm, uint32_t cid, void *buf, size_t cap, int src,
                                   int tag, unsigned flags, uint32_t shape, unexp_t *u,
                                   unexp_t *prev, tern_request_t **req_out)
{
    tern_request_t *req;
    tern_status_t st;

    /* A message that arrived before its sender was lost is still delivered
     * (an offer to read it is not: nobody is there to read from). */
    if (src != TERN_ANY_SOURCE && comm->peer_failed[src] != TERN_OK && (u == NULL || u->rndv))
        return tern__error(comm->peer_failed[src], "irecv: rank %d was lost", src);
    /* Only this rank could send it (to itself): nobody else is left. */
    if (src == TERN_ANY_SOURCE && u == NULL && comm->nlost > 0 && comm->nlost + 1 >= comm->world)
        return tern__error(TERN_ERR_PEER_LOST,
                           "irecv from any source: every other rank (%u) was lost", comm->nlost);
    /* The pair open, for its terms (rtr_fits) and so that a peer gone before
     * it ever connected is noticed (the dial fails, or fails later: lost)
     * rather than waited on for ever. */
    if (u == NULL && src != TERN_ANY_SOURCE && (st = pair_open(comm, src)) != TERN_OK)
        return tern__error(st, "irecv: no connection to rank %d: %s", src, tern_last_error());
    if ((req = req_new(comm)) == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "irecv: no memory");
    *req = (tern_request_t){.comm = comm, .kind = REQ_RECV, .cid = cid, .peer = src, .tag = tag,
                            .shape = shape, .buf = buf, .len = cap,
                            .exact = (flags & TERN__P2P_EXACT) != 0};
    if (u != NULL)
        unlink_unexp(comm, u, prev);
    if (u == NULL) {
        if (comm->posted_tail)
            comm->posted_tail->next = req;
        else
            comm->posted_head = req;
        comm->posted_tail = req;
        if (src != TERN_ANY_SOURCE && (flags & TERN__P2P_RTR) &&
            rtr_fits(comm, cid, cap, flags, src))
            rtr_offer(comm, req);
    } else if (u->rndv) {
        get_or_queue(comm, req, u);
    } else {
        comm->unexpected_bytes -= eager_charge(u->len);
        deliver_eager(comm, req, u->src, u->tag, u->seq, u->shape, u->data, u->len);
        free(u->data);
        free(u);
    }
    *req_out = req;
    return TERN_OK;
}

tern_status_t tern__p2p_irecv(tern__comm_t *comm, uint32_t cid, void *buf, size_t cap, int src,
                              int tag, unsigned flags, tern_request_t **req_out)
{
    tern_status_t st;
    if (req_out == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "irecv: NULL request pointer");
    tern__comm_lock(comm);
    st = tern__p2p_irecv_locked(comm, cid, buf, cap, src, tag, flags, 0, req_out);
    tern__comm_unlock(comm);
    return st;
}

tern_status_t tern__p2p_irecv_locked(tern__comm_t *comm, uint32_t cid, void *buf, size_t cap,
                                     int src, int tag, unsigned flags, uint32_t shape,
                                     tern_request_t **req_out)
{
    tern_status_t st = check_recv(comm, buf, cap, src, tag);
    if (st != TERN_OK)
        return st;
    unexp_t *prev, *u = find_unexp(comm, cid, src, tag, &prev);
    return irecv_post(comm, cid, buf, cap, src, tag, flags, shape, u, prev, req_out);
}

/* ---- withdrawing ---- */

/* Unlink r from a singly linked request list; true if it was there. */
static bool unlink_req(tern_request_t **head, tern_request_t **tail, tern_request_t *r)
{
    tern_request_t *prev = NULL;
    for (tern_request_t **pp = head; *pp != NULL; prev = *pp, pp = &(*pp)->next) {
        if (*pp != r)
            continue;
        *pp = r->next;
        if (tail != NULL && *tail == r)
            *tail = prev;
        return true;
    }
    return false;
}

bool tern__p2p_cancel(tern__comm_t *comm, tern_request_t *req)
{
    if (atomic_load(&req->done))
        return true;
    if (req->kind == REQ_RECV && unlink_req(&comm->posted_head, &comm->posted_tail, req)) {
        rtr_withdraw(comm, req, true);
        tern__req_complete(req, TERN_ERR_CANCELED);
        return true;
    }
    /* Matched, waiting for the read window: the sender still holds its
     * buffer for us, so it hears that nobody will read it. */
    if (req->kind == REQ_RECV && unlink_req(&comm->get_waits, &comm->get_waits_tail, req)) {
        tern_debug("p2p: receive from rank %d canceled while its read waited for the window",
                   req->pend->src);
        send_fin(comm, req->pend->src, req->pend->sreq, TERN_ERR_CANCELED);
        free(req->pend);
        req->pend = NULL;
        tern__req_complete(req, TERN_ERR_CANCELED);
        return true;
    }
    if (req->kind == REQ_SEND && unlink_req(&comm->rtr_waits, NULL, req)) {
        tern__req_complete(req, TERN_ERR_CANCELED);
        return true;
    }
    if (req->kind == REQ_SEND && unlink_req(&comm->rtr_ready, &comm->rtr_ready_tail, req)) {
        rtr_fail(comm, req->peer, req->offer->rid, req->len, TERN_ERR_CANCELED);
        free(req->offer);
        req->offer = NULL;
        tern__req_complete(req, TERN_ERR_CANCELED);
        return true;
    }
    if (req->kind == REQ_SEND && unlink_req(&comm->rndv_sends, NULL, req)) {
        tern_mr_dereg(req->mr);
        req->mr = NULL;
        tern__req_complete(req, TERN_ERR_CANCELED);
        return true;
    }
    return false;
}

/* ---- life cycle ---- */

/* Complete with why the requests with peer (-1: all) in a list of sends
 * waiting for an offer, or of puts or reads waiting for a window (tail: the
 * list's, or NULL). */
static void waits_fail(tern_request_t **head, tern_request_t **tail, int peer, tern_status_t why)
{
    tern_request_t *prev = NULL;
    for (tern_request_t **pp = head; *pp != NULL;) {
        tern_request_t *r = *pp;
        if (peer >= 0 && wait_peer(r) != peer) {
            prev = r;
            pp = &r->next;
            continue;
        }
        *pp = r->next;
        if (tail != NULL && *tail == r)
            *tail = prev;
        free(r->offer);
        free(r->pend);
        r->offer = NULL;
        r->pend = NULL;
        tern__req_complete(r, why);
        req_maybe_free(r);
    }
}

void tern__p2p_peer_lost(tern__comm_t *comm, int peer, tern_status_t why)
{
    tern_request_t **pp;
    /* Receives waiting on that rank alone can never complete; those from
     * any source fail too (as MPI's fault-tolerant ULFM reports them): the
     * message they wait for may have been the lost rank's. Posted again,
     * they wait on the others. */
    for (pp = &comm->posted_head; *pp != NULL;) {
        tern_request_t *r = *pp;
        if (r->peer == peer || r->peer == TERN_ANY_SOURCE) {
            r->info = (tern_msg_info_t){.source = peer, .tag = r->tag, .len = 0};
            *pp = r->next;
            if (comm->posted_tail == r) {
                comm->posted_tail = NULL;
                for (tern_request_t *t = comm->posted_head; t; t = t->next)
                    comm->posted_tail = t;
            }
            rtr_withdraw(comm, r, false);
            tern__req_complete(r, why);
            req_maybe_free(r);
        } else {
            pp = &r->next;
        }
    }
    /* Sends waiting for its offer, or for the put window with one, will never
     * move; its kept offers are void. */
    waits_fail(&comm->rtr_waits, NULL, peer, why);
    waits_fail(&comm->rtr_ready, &comm->rtr_ready_tail, peer, why);
    rtrs_drop(comm, peer, 0);
    /* Reads from it waiting for the window will never run. */
    waits_fail(&comm->get_waits, &comm->get_waits_tail, peer, why);
    /* Rendezvous sends to it will never see their FIN. */
    for (pp = &comm->rndv_sends; *pp != NULL;) {
        tern_request_t *r = *pp;
        if (r->peer == peer) {
            *pp = r->next;
            tern_mr_dereg(r->mr);
            r->mr = NULL;
            tern__req_complete(r, why);
            req_maybe_free(r);
        } else {
            pp = &r->next;
        }
    }
}

/* An eager limit as configured, at most what one send carries after the
 * eager header (hdr). */
static size_t eager_cap(const tern__comm_t *comm, uint64_t limit, size_t hdr)
{
    size_t most = comm->attr.max_send - hdr;
    return limit < most ? (size_t)limit : most;
}

/* Terms: magic u32 "TP2P", version u32, coll_eager_limit u64, credit_per_peer
 * u64, flags u32 (bit 0: rtr_on), 0 u32, then the collectives' settings that
 * every rank must share: TERN_COLL_SEGMENT u64, the TERN_COLL_ALGO_* choices
 * u32 (4 bits each: all_reduce, broadcast, reduce, all_gather, all_to_all),
 * 0 u32; little-endian. */
#define TERMS_MAGIC 0x50325054u
#define TERMS_VERSION 3u /* 3: eager credit counts EAGER_ENTRY a message */
#define TERMS_RTR 1u

static uint32_t coll_algos(const tern__config_t *cfg)
{
    return (uint32_t)(cfg->coll_algo_allreduce & 15) | (uint32_t)(cfg->coll_algo_broadcast & 15) << 4 |
           (uint32_t)(cfg->coll_algo_reduce & 15) << 8 | (uint32_t)(cfg->coll_algo_allgather & 15) << 12 |
           (uint32_t)(cfg->coll_algo_alltoall & 15) << 16;
}

void tern__p2p_terms_pack(const tern__comm_t *comm, uint8_t *out)
{
    const tern__config_t *cfg = tern__ctx_config(comm->ctx);
    memset(out, 0, TERN__TERMS_LEN);
    tern__put_le32(out, TERMS_MAGIC);
    tern__put_le32(out + 4, TERMS_VERSION);
    tern__put_le64(out + 8, comm->coll_eager_limit);
    tern__put_le64(out + 16, comm->credit_per_peer);
    tern__put_le32(out + 24, comm->rtr_on ? TERMS_RTR : 0);
    tern__put_le64(out + 32, cfg->coll_segment);
    tern__put_le32(out + 40, coll_algos(cfg));
}

tern_status_t tern__p2p_terms_take(tern__comm_t *comm, int r, const uint8_t *t)
{
    if (tern__get_le32(t) != TERMS_MAGIC || tern__get_le32(t + 4) != TERMS_VERSION)
        return tern__error(TERN_ERR_PROTOCOL, "rank %d's p2p terms are of another version "
                           "(is every rank the same tern build?)", r);
    uint64_t eager = tern__get_le64(t + 8), credit = tern__get_le64(t + 16);
    bool rtr = (tern__get_le32(t + 24) & TERMS_RTR) != 0;
    if (eager != comm->coll_eager_limit || credit != comm->credit_per_peer || rtr != comm->rtr_on) {
        /* Settings that differ across ranks are most often a mistake: say so
         * once, not once per peer. */
        TERN__LOG(comm->terms_told ? TERN_LOG_DEBUG : TERN_LOG_WARN,
                 "p2p: rank %d runs with other settings: TERN_COLL_EAGER_LIMIT %" PRIu64
                 " (ours %zu), eager credit %" PRIu64 " (TERN_UNEXPECTED_MAX / ranks; ours %zu), "
                 "TERN_COLL_RTR %s (ours %s); each pair uses the smaller eager limit, offered "
                 "buffers only if both ranks use them, and the receiver's credit",
                 r, eager, comm->coll_eager_limit, credit, comm->credit_per_peer,
                 rtr ? "on" : "off", comm->rtr_on ? "on" : "off");
        comm->terms_told = true;
    }
    /* These shape every collective's messages: no pair can make up for them. */
    const tern__config_t *cfg = tern__ctx_config(comm->ctx);
    uint64_t seg = tern__get_le64(t + 32);
    bool same_algos = tern__get_le32(t + 40) == coll_algos(cfg);
    if (seg != cfg->coll_segment || !same_algos) {
        TERN__LOG(comm->coll_terms_told ? TERN_LOG_DEBUG : TERN_LOG_WARN,
                  "p2p: rank %d runs with other collective settings (TERN_COLL_SEGMENT %" PRIu64
                  ", ours %" PRIu64 "; TERN_COLL_ALGO_* %s ours): collectives with it will fail "
                  "as mismatched; set these alike on every rank",
                  r, seg, cfg->coll_segment, same_algos ? "the same as" : "other than");
        comm->coll_terms_told = true;
    }
    comm->pair[r].coll_eager = eager < comm->coll_eager_limit ? (size_t)eager : comm->coll_eager_limit;
    comm->pair[r].rtr = rtr && comm->rtr_on;
    comm->credits[r] = credit > INT64_MAX ? INT64_MAX : (int64_t)credit;
    comm->pair[r].credit = comm->credits[r];
    return TERN_OK;
}

tern_status_t tern__p2p_init(tern__comm_t *comm)
{
    const tern__config_t *cfg = tern__ctx_config(comm->ctx);
    /* auto: the transport's, or the 16 KiB every provider used before it said. */
    uint64_t eager = cfg->eager_limit;
    if (eager == TERN__SIZE_AUTO)
        eager = comm->attr.eager_size ? comm->attr.eager_size : (16u << 10);
    comm->eager_limit = eager_cap(comm, eager, EAGER_LONG_HDR);
    comm->coll_eager_limit = eager_cap(comm, cfg->coll_eager_limit, EAGER_HDR_MAX);
    comm->rtr_on = cfg->coll_rtr && comm->attr.revokes_keys;
    comm->credit_per_peer = cfg->unexpected_max / comm->world;
    comm->pair = calloc(comm->world, sizeof(*comm->pair));
    comm->credits = calloc(comm->world, sizeof(*comm->credits));
    comm->consumed = calloc(comm->world, sizeof(*comm->consumed));
    comm->sent = calloc(comm->world, sizeof(*comm->sent));
    comm->arrived = calloc(comm->world, sizeof(*comm->arrived));
    comm->put_bytes = calloc(comm->world, sizeof(*comm->put_bytes));
    comm->put_window = calloc(comm->world, sizeof(*comm->put_window));
    comm->get_bytes = calloc(comm->world, sizeof(*comm->get_bytes));
    if (comm->pair == NULL || comm->credits == NULL || comm->consumed == NULL || comm->sent == NULL ||
        comm->arrived == NULL || comm->put_bytes == NULL || comm->put_window == NULL ||
        comm->get_bytes == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "p2p: no memory");
    for (unsigned r = 0; r < comm->world; r++)
        comm->put_window[r] = comm->attr.rx_window; /* until the peer's first offer */
    tern__comm_set_handler(comm, TERN_IMM_P2P_EAGER, on_eager, NULL);
    tern__comm_set_handler(comm, TERN_IMM_P2P_RNDV, on_rndv, NULL);
    tern__comm_set_handler(comm, TERN_IMM_CONTROL, on_control, NULL);
    return TERN_OK;
}

void tern__p2p_fini(tern__comm_t *comm)
{
    while (comm->unexp_head != NULL) {
        unexp_t *u = comm->unexp_head;
        comm->unexp_head = u->next;
        free(u->data);
        free(u);
    }
    comm->unexp_tail = NULL;
    /* Requests still pending are failed (their callbacks, if any, run);
     * their handles die with the comm (tern_finalize's contract, as
     * MPI_Finalize's). */
    while (comm->posted_head != NULL) {
        tern_request_t *r = comm->posted_head;
        comm->posted_head = r->next;
        r->info = (tern_msg_info_t){.source = r->peer, .tag = r->tag, .len = 0};
        rtr_withdraw(comm, r, false);
        tern__req_complete(r, TERN_ERR_CANCELED);
    }
    waits_fail(&comm->rtr_waits, NULL, -1, TERN_ERR_CANCELED);
    waits_fail(&comm->rtr_ready, &comm->rtr_ready_tail, -1, TERN_ERR_CANCELED);
    waits_fail(&comm->get_waits, &comm->get_waits_tail, -1, TERN_ERR_CANCELED);
    free(comm->get_bytes);
    comm->get_bytes = NULL;
    free(comm->put_bytes);
    comm->put_bytes = NULL;
    free(comm->put_window);
    comm->put_window = NULL;
    rtrs_drop(comm, -1, 0);
    while (comm->rndv_sends != NULL) {
        tern_request_t *r = comm->rndv_sends;
        comm->rndv_sends = r->next;
        tern_mr_dereg(r->mr);
        r->mr = NULL;
        tern__req_complete(r, TERN_ERR_CANCELED);
    }
    free(comm->dead_cids);
    comm->dead_cids = NULL;
    comm->ndead = comm->dead_cap = 0;
    free(comm->pair);
    comm->pair = NULL;
    free(comm->credits);
    free(comm->consumed);
    free(comm->sent);
    free(comm->arrived);
    comm->credits = NULL;
    comm->consumed = NULL;
    comm->sent = comm->arrived = NULL;
}

void tern__p2p_free_caches(tern__comm_t *comm)
{
    while (comm->req_cache != NULL) {
        tern_request_t *r = comm->req_cache;
        comm->req_cache = r->next;
        free(r);
    }
    comm->req_cached = 0;
    while (comm->bounce_cache != NULL) {
        bounce_t *b = comm->bounce_cache;
        comm->bounce_cache = b->next;
        free(b);
    }
    comm->bounce_cached = 0;
}

/* ---- the public calls ---- */

static tern__comm_t *comm_of(tern_ctx_t *ctx)
{
    tern__comm_t *comm = tern__comm(ctx);
    if (comm == NULL)
        tern__error(TERN_ERR_INVALID_PARAM, "p2p: the context is not initialized");
    return comm;
}

void tern__req_prof_attach(tern_request_t *req, tern__prof_op_t *op)
{
    tern__comm_t *comm = req->comm;
    tern__comm_lock(comm);
    if (atomic_load_explicit(&req->done, memory_order_acquire)) {
        tern__req_prof_stamp(req, op);
        tern__comm_unlock(comm);
        tern__prof_op_end(op, tern__req_bytes(req), NULL, 0);
        return;
    }
    req->prof = *op;
    tern__comm_unlock(comm);
}

/* The profiled op of a user's isend or irecv: attached if the post (st)
 * succeeded, else dropped. */
static void prof_attach(tern_status_t st, tern_request_t *req, tern__prof_op_t *op)
{
    if (op->name == NULL || st != TERN_OK)
        tern__prof_op_drop(op);
    else
        tern__req_prof_attach(req, op);
}

tern_status_t tern_isend(tern_ctx_t *ctx, const void *buf, size_t len, int dst, int tag,
                         tern_request_t **req)
{
    tern__comm_t *comm = comm_of(ctx);
    if (comm == NULL)
        return TERN_ERR_INVALID_PARAM;
    tern__prof_op_t op;
    tern__prof_op_begin(&op, comm, dst, TERN_PROF_KIND_P2P, "isend");
    op.dir = TERN_PROF_DIR_SEND;
    tern_status_t st = tern__p2p_isend(comm, 0, buf, len, dst, tag, req);
    if (st == TERN_OK)
        tern__comm_kick(comm);
    prof_attach(st, st == TERN_OK ? *req : NULL, &op);
    return st;
}

/* tern_irecv with flags (TERN__P2P_EXACT for a tensor's). */
static tern_status_t user_irecv(tern_ctx_t *ctx, void *buf, size_t cap, int src, int tag,
                                unsigned flags, tern_request_t **req)
{
    tern__comm_t *comm = comm_of(ctx);
    if (comm == NULL)
        return TERN_ERR_INVALID_PARAM;
    tern__prof_op_t op;
    tern__prof_op_begin(&op, comm, src, TERN_PROF_KIND_P2P, "irecv");
    op.dir = TERN_PROF_DIR_RECV;
    tern_status_t st = tern__p2p_irecv(comm, 0, buf, cap, src, tag, flags, req);
    if (st == TERN_OK)
        tern__comm_kick(comm);
    prof_attach(st, st == TERN_OK ? *req : NULL, &op);
    return st;
}

tern_status_t tern_irecv(tern_ctx_t *ctx, void *buf, size_t cap, int src, int tag,
                         tern_request_t **req)
{
    return user_irecv(ctx, buf, cap, src, tag, 0, req);
}

/*
 * Blocking calls skip the request where they can: an eager send completes as
 * it is posted, and a receive whose eager message is already here completes
 * as it is matched. That saves a request and a round of the lock per call,
 * which on shared memory is a noticeable part of a small message's latency.
 * Both are inlined, with the steps of a small message below them
 * (TERN__HOT), into tern_send and tern_recv.
 */
TERN__HOT tern_status_t p2p_send(tern__comm_t *comm, uint32_t cid, const void *buf, size_t len,
                                 int dst, int tag, uint64_t *seq)
{
    tern_request_t *req;
    bool sent;
    tern__comm_lock(comm);
    tern_status_t st = send_now(comm, cid, buf, len, dst, tag, 0, seq, &sent);
    tern__comm_unlock(comm);
    if (st != TERN_OK || sent)
        return st;
    st = tern__p2p_isend(comm, cid, buf, len, dst, tag, &req);
    if (st != TERN_OK)
        return st;
    *seq = req->seq; /* set as it was posted, by this thread */
    return tern_request_wait(req, -1, NULL);
}

TERN__HOT tern_status_t p2p_recv(tern__comm_t *comm, uint32_t cid, void *buf, size_t cap, int src,
                                 int tag, tern_msg_info_t *info, uint64_t *seq)
{
    tern_request_t *req = NULL; /* set where irecv_post succeeds */
    tern_status_t st = check_recv(comm, buf, cap, src, tag);
    if (st != TERN_OK)
        return st;
    tern__comm_lock(comm);
    unexp_t *prev, *u = find_unexp(comm, cid, src, tag, &prev);
    if (u != NULL && !u->rndv) {
        unlink_unexp(comm, u, prev);
        comm->unexpected_bytes -= eager_charge(u->len);
        st = copy_eager(comm, buf, cap, u->src, u->tag, u->data, u->len);
        tern__comm_unlock(comm);
        if (info != NULL)
            *info = (tern_msg_info_t){.source = u->src, .tag = u->tag, .len = u->len};
        *seq = u->seq;
        if (st != TERN_OK)
            tern__error(st, "receive %s (rank %d, tag %d, %zu bytes)", tern_strerror(st), u->src,
                        u->tag, u->len);
        free(u->data);
        free(u);
        return st;
    }
    if ((st = irecv_post(comm, cid, buf, cap, src, tag, 0, 0, u, prev, &req)) != TERN_OK) {
        tern__comm_unlock(comm);
        return st;
    }
    if (atomic_load_explicit(&req->done, memory_order_relaxed))
        *seq = req->seq;
    else
        req->seq_out = seq; /* the request is gone by the time wait returns */
    return tern__request_wait_locked(req, -1, info); /* lets the lock go */
}

tern_status_t tern_send(tern_ctx_t *ctx, const void *buf, size_t len, int dst, int tag)
{
    tern__comm_t *comm = comm_of(ctx);
    if (comm == NULL)
        return TERN_ERR_INVALID_PARAM;
    tern_prof_range_t r = tern__prof_begin("send", TERN_PROF_KIND_P2P);
    uint64_t seq = 0;
    tern_status_t st = p2p_send(comm, 0, buf, len, dst, tag, &seq);
    if (r != 0) {
        tern_prof_range_bytes(r, st == TERN_OK ? len : 0);
        tern__prof_range_msg(r, dst, TERN_PROF_DIR_SEND, seq);
        tern_prof_range_end(r);
    }
    return st;
}

tern_status_t tern_recv(tern_ctx_t *ctx, void *buf, size_t cap, int src, int tag,
                        tern_msg_info_t *info)
{
    tern__comm_t *comm = comm_of(ctx);
    if (comm == NULL)
        return TERN_ERR_INVALID_PARAM;
    tern_prof_range_t r = tern__prof_begin("recv", TERN_PROF_KIND_P2P);
    tern_msg_info_t mine, *got = info ? info : &mine;
    uint64_t seq = 0;
    tern_status_t st = p2p_recv(comm, 0, buf, cap, src, tag, got, &seq);
    if (r != 0) {
        tern_prof_range_bytes(r, st == TERN_OK ? got->len : 0);
        if (seq != 0)
            tern__prof_range_msg(r, got->source, TERN_PROF_DIR_RECV, seq);
        tern_prof_range_end(r);
    }
    return st;
}

/* ---- tensors ---- */

tern_status_t tern__p2p_short(size_t cap, const tern_msg_info_t *got)
{
    return tern__error(TERN_ERR_MISMATCH, "receive: the %zu-byte message from rank %d (tag %d) "
                       "does not fill the %zu-byte tensor", got->len, got->source, got->tag, cap);
}

/* t's bytes as one buffer (tern__tensor_host); name: the call. */
static tern_status_t tensor_bytes(const char *name, const tern_tensor_t *t, void **data,
                                  size_t *bytes)
{
    size_t n;
    tern_status_t st = tern__tensor_host(name, "tensor", t, data, &n);
    if (st == TERN_OK)
        *bytes = n * tern_dtype_size(t->dtype);
    return st;
}

tern_status_t tern_send_tensor(tern_ctx_t *ctx, const tern_tensor_t *t, int dst, int tag)
{
    void *d;
    size_t n;
    tern_status_t st = tensor_bytes("send_tensor", t, &d, &n);
    return st != TERN_OK ? st : tern_send(ctx, d, n, dst, tag);
}

tern_status_t tern_isend_tensor(tern_ctx_t *ctx, const tern_tensor_t *t, int dst, int tag,
                                tern_request_t **req)
{
    void *d;
    size_t n;
    tern_status_t st = tensor_bytes("isend_tensor", t, &d, &n);
    return st != TERN_OK ? st : tern_isend(ctx, d, n, dst, tag, req);
}

tern_status_t tern_recv_tensor(tern_ctx_t *ctx, tern_tensor_t *t, int src, int tag,
                               tern_msg_info_t *info)
{
    void *d;
    size_t n;
    tern_msg_info_t got = {0};
    tern_status_t st = tensor_bytes("recv_tensor", t, &d, &n);
    if (st != TERN_OK)
        return st;
    st = tern_recv(ctx, d, n, src, tag, &got);
    if (info != NULL)
        *info = got;
    return st == TERN_OK && got.len != n ? tern__p2p_short(n, &got) : st;
}

tern_status_t tern_irecv_tensor(tern_ctx_t *ctx, tern_tensor_t *t, int src, int tag,
                                tern_request_t **req)
{
    void *d;
    size_t n;
    tern_status_t st = tensor_bytes("irecv_tensor", t, &d, &n);
    return st != TERN_OK ? st : user_irecv(ctx, d, n, src, tag, TERN__P2P_EXACT, req);
}
