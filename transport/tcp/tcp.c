/*
 * The tcp provider: RDMA reliable-connection semantics emulated over TCP.
 *
 * Two peers share one connection, used both ways, as an RC queue pair is:
 * each side's requests (SEND, PUT, GET) and its replies to the other's
 * (PUT_ACK, GET_DATA) go on the same socket, replies in request order because
 * a side handles one connection's requests in order. Sharing is what makes a
 * ping-pong fast over TCP: the reply carries the ACK of the request, where two
 * one-way connections cost a separate ACK segment on every message.
 *
 * An endpoint adopts the connection its peer already opened (HELLO seen) and
 * opens one only when there is none. When both sides open one at once, the
 * connection opened by the lower id wins: the higher side sends SWITCH as the
 * last frame of its own connection and holds (plugs) what it sends on the
 * winner until the lower side answers SWITCH_ACK, which it does only after
 * handling everything before the SWITCH. So no frame overtakes another, and
 * then the losing connection is closed.
 *
 * Data moves without extra copies where it is large: payloads are written with
 * writev straight from the user's buffer (or, for GET_DATA, from the registered
 * region), and a PUT's payload is read straight into the target region once its
 * key, bounds and access have been checked; a refused PUT's payload is read into
 * a scratch buffer and dropped, so the stream stays in step and the connection
 * usable. Small frames go through a 64 KiB receive buffer to save system calls.
 *
 * Frame: a 56-byte little-endian header, then `payload` bytes.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <inttypes.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <tern/clock.h>

#include "core/hash.h"

#include "core/bytes.h"
#include "core/error.h"
#include "core/log.h"
#include "transport/provider.h"

#define HDR_SIZE 56
#define RXBUF_SIZE (64u << 10)
#define MAX_SEND (1u << 20)          /* eager limit of tern_ep_send */
#define TCP_INLINE 256u              /* attr.max_inline: a queued SEND this small is copied */
/* attr.eager_size. A rendezvous costs two more trips through both kernels
 * (ready-to-send, then the read's request) before the payload moves, about
 * 15 us on loopback here; an eager message up to this size costs the
 * receiver one copy of a few us instead, and still fits the receive buffer
 * with its headers and one write of a segment (docs/p2p.md, "The eager
 * limit"). Above 48 KiB the copies caught up with the trips on a host where
 * copying was slow. */
#define TCP_EAGER_SIZE (48u << 10)
#define HELLO_LEN 20u                /* F_HELLO's payload */
#define TX_TAIL_MIN (8u << 10)       /* a frame's last write takes a tail shorter than this along */
#define MAX_PUT ((size_t)1 << 40)    /* a single put or get */
#define ADDR_MAGIC 0x54544350u       /* "TTCP" */
#define ADDR_VERSION 1
#define KEY_MAGIC 0x544b4559u        /* "TKEY" */
#define KEY_SIZE 32
#define READS_PER_CALL 16            /* socket reads per connection per progress call */
#define PIPE_SIZE (1 << 20)          /* splice_payload()'s pipe: the unprivileged maximum */

enum frame_type {
    F_HELLO = 1,   /* payload: magic u32, version u8, 3 zero, self_id u32, instance u64 */
    F_BYE = 2,     /* graceful close: the other side hears TERN_ERR_CLOSED, not a loss */
    F_SEND = 3,    /* imm, payload */
    F_PUT = 4,     /* op_id, key, raddr, size, flags(IMM), imm, payload = size bytes */
    F_PUT_ACK = 5, /* op_id, status */
    F_GET = 6,     /* op_id, key, raddr, size */
    F_GET_DATA = 7, /* op_id, status, payload = size bytes when status is OK */
    F_SWITCH = 8,   /* the last frame of a losing connection (see above) */
    F_SWITCH_ACK = 9 /* everything before the SWITCH is handled */
};
#define FLAG_IMM 1u
#define FLAG_SPLICED 2u /* F_PUT, F_GET_DATA: the payload left by splice (a hint for zc_stats_t) */

/*
 * Splice or copy, measured. Which costs less moves with the host: on one VM
 * splicing took a 4 MiB stream from 4.3 to 7.5 GB/s, on another copying won,
 * 6.5 against 5 (docs/perf.md, "Splice or copy, measured"). So with
 * TERN_TCP_ZCOPY_MODE=auto a transport times its own socket calls: the CPU
 * they take per payload byte written each way and, once it has read payloads
 * of both kinds, per byte read of each (a spliced payload reaches its reader
 * as 4 KiB fragments, each with its own cost). Its reads stand for what its
 * peers pay to read what it writes, so a rank that both sends and receives
 * weighs both ends, and one that only sends weighs its own. Time spent
 * waiting for a full socket is outside the calls and not counted.
 */
enum { ZC_COPY, ZC_SPLICE };
#define ZC_SEED (4u << 20)        /* bytes a way must have moved before its cost counts */
#define ZC_WINDOW (64u << 20)     /* past this the sums halve: recent payloads weigh most */
#define ZC_TRY_MIN (8u << 20)     /* bytes between tries of the other way, at first... */
#define ZC_TRY_MAX (1ull << 30)   /* ...doubling to this while the choice holds */
#define ZC_CALL_SLACK_NS 50000.0  /* see zc_add */

typedef struct zc_cost {
    double ns, bytes; /* recent sums */
} zc_cost_t;

typedef struct zc_stats {
    zc_cost_t send[2], recv[2];
    uint64_t since_try; /* bytes written the cheaper way since the other was tried */
    uint64_t try_gap;   /* bytes between tries */
    int best;           /* the cheaper way at the last pick */
    double picked[2];   /* what a byte cost each way then */
} zc_stats_t;

typedef struct frame {
    uint8_t type, flags;
    int32_t status;
    uint32_t imm;
    uint64_t op_id, key, raddr, size, payload;
} frame_t;

static void frame_encode(const frame_t *f, uint8_t *h)
{
    memset(h, 0, HDR_SIZE);
    h[0] = f->type;
    h[1] = f->flags;
    tern__put_le32(h + 4, (uint32_t)f->status);
    tern__put_le32(h + 8, f->imm);
    tern__put_le64(h + 16, f->op_id);
    tern__put_le64(h + 24, f->key);
    tern__put_le64(h + 32, f->raddr);
    tern__put_le64(h + 40, f->size);
    tern__put_le64(h + 48, f->payload);
}

static void frame_decode(const uint8_t *h, frame_t *f)
{
    f->type = h[0];
    f->flags = h[1];
    f->status = tern__status_from_wire((int32_t)tern__get_le32(h + 4));
    f->imm = tern__get_le32(h + 8);
    f->op_id = tern__get_le64(h + 16);
    f->key = tern__get_le64(h + 24);
    f->raddr = tern__get_le64(h + 32);
    f->size = tern__get_le64(h + 40);
    f->payload = tern__get_le64(h + 48);
}

struct tcp_mr;

/* Something to write: a header and up to one payload, with what to do when it
 * is out (complete a send) or answered (a put or get, moved to the pending
 * queue). */
typedef struct txreq {
    struct txreq *next;
    uint8_t hdr[HDR_SIZE];
    struct iovec iov[2];
    int iovcnt;
    uint8_t type;
    uint64_t op_id;
    tern__comp_t comp;
    void *get_buf;       /* F_GET: where the data goes */
    uint64_t get_size;
    struct tcp_mr *pin;  /* F_GET_DATA: the region being read, kept alive */
    void *copy;          /* F_GET_DATA whose region was unregistered mid-reply: the rest */
    tern_status_t status; /* queued for completion (tcp_tp_t.done): the outcome */
    bool zcopy;          /* the payload goes by splice_payload() */
    bool zc_undecided;   /* eligible to be spliced: decided as its header goes (tx_some) */
    bool zc_timed;       /* TERN_TCP_ZCOPY_MODE=auto: its writes feed zc_stats_t */
    uint8_t way;         /* F_PUT: the caller's tern_op_way_t, honoured in auto mode */
    uint8_t small[];     /* a small payload owned by the request: HELLO, an inline SEND */
} txreq_t;

typedef enum conn_state { C_CONNECTING, C_OPEN, C_DEAD } conn_state_t;

typedef enum rx_state { RX_HDR, RX_PAYLOAD } rx_state_t;

typedef struct conn {
    struct conn *next;
    struct tcp_tp *tp;
    struct tcp_ep *ep; /* the endpoint using it; NULL until one adopts it, or once retired */
    int fd;
    conn_state_t state;
    bool incoming;  /* accepted, not dialed */
    bool hello_seen;
    bool bye_seen;
    bool want_out;
    bool retired;  /* a losing connection: never adopted, closed once drained */
    uint64_t nread; /* bytes read from the socket, ever */
    bool plugged;  /* the winner at the switching side: nothing sent until SWITCH_ACK */
    struct conn *successor; /* retired at the switching side: the winner it plugs */
    uint32_t peer; /* outgoing: the endpoint's peer; incoming: from HELLO */
    uint64_t peer_instance; /* incoming: from HELLO */
    size_t write_max;      /* the most one write or splice hands the socket (write_cap); 0: not yet known */
    int pipe[2];           /* splice_payload()'s, made on first use; -1 until then */
    size_t in_pipe;        /* payload bytes in the pipe, not yet in the socket */
    /* transmit */
    txreq_t *tx_head, *tx_tail;
    txreq_t *pend_head, *pend_tail; /* puts and gets awaiting their reply, in order */
    /* receive */
    uint8_t *rxbuf;
    size_t rx_off, rx_len; /* unconsumed bytes are rxbuf[rx_off..rx_len) */
    rx_state_t rx_state;
    frame_t cur;
    uint8_t *dst;          /* where the current payload goes; NULL: scratch */
    uint64_t got;          /* payload bytes received */
    uint8_t *big;          /* F_SEND payloads that do not fit rxbuf */
    size_t big_cap;
    bool drained;          /* the last read left the socket empty: wait for epoll */
    uint8_t hello[HELLO_LEN];     /* an incoming HELLO's payload (enum frame_type) */
    bool refused;          /* current PUT failed its checks */
    tern_status_t refusal;
    struct tcp_mr *cur_mr; /* current PUT's region, pinned */
    txreq_t *cur_op;       /* current GET_DATA's request */
    txreq_t *keep;         /* spliced replies' copies: their pages may be the socket's until close */
    tern_status_t tell;    /* failed outside progress: the event the next progress raises */
} conn_t;

typedef struct tcp_ep {
    tern_ep_t base;
    struct tcp_ep *next;
    conn_t *conn;
    uint64_t peer_instance; /* from the address: which incarnation of the peer */
    tern_status_t failed; /* sticky once the connection is lost */
    bool destroying;      /* in tcp_ep_destroy: a second destroy (from a callback) is a no-op */
} tcp_ep_t;

typedef struct tcp_mr {
    tern_mr_t base;
    UT_hash_handle hh;
    uint64_t key;
    unsigned pins;  /* remote operations in flight on it */
    bool revoked;   /* unregistered while pinned: free at the last unpin */
} tcp_mr_t;

typedef struct tcp_rkey {
    tern_rkey_t base;
    uint64_t key;
} tcp_rkey_t;

typedef struct tcp_tp {
    tern_transport_t base;
    int lfd, epfd;
    int busy_poll;
    size_t sockbuf;
    uint64_t instance;
    uint64_t next_key, next_op;
    uint8_t addr[64];
    size_t addr_len;
    conn_t *conns;
    tcp_ep_t *eps;
    tcp_mr_t *keys; /* uthash on key */
    uint8_t *scratch; /* refused PUT payloads are drained here */
    int events;     /* events delivered in this progress call */
    struct conn *hot; /* whose data the last epoll round handled (tcp_progress) */
    int hot_streak;   /* progress calls in a row served by hot alone */
    size_t zcopy_min; /* payloads this large go by splice_payload(); 0: never */
    bool zcopy_auto;  /* ...or by a copy, whichever zc measured to cost less */
    zc_stats_t zc;
    size_t write_max; /* TERN_TCP_WRITE_MAX; 0: no limit */
    /* Completions wait here for the end of the call that produced them
     * (drain_done): a user callback never runs inside a post, nor in the
     * middle of a connection's frame handling, which it might free. */
    txreq_t *done_head, *done_tail;
    int in_progress; /* inside tcp_progress: a destroyed endpoint's connection is reaped after */
    bool tell_pending; /* a connection failed outside progress: its event waits (conn_t.tell) */
} tcp_tp_t;

static inline tcp_tp_t *to_tcp_tp(tern_transport_t *tp)
{
    return (tcp_tp_t *)tp;
}

static inline tcp_ep_t *to_tcp_ep(tern_ep_t *ep)
{
    return (tcp_ep_t *)ep;
}

static inline tcp_mr_t *to_tcp_mr(tern_mr_t *mr)
{
    return (tcp_mr_t *)mr;
}

static inline tcp_rkey_t *to_tcp_rkey(tern_rkey_t *rkey)
{
    return (tcp_rkey_t *)rkey;
}

/* Append r to the queue *head..*tail (a connection's transmit or pending
 * queue, the transport's completions). */
static void txq_append(txreq_t **head, txreq_t **tail, txreq_t *r)
{
    r->next = NULL;
    if (*tail)
        (*tail)->next = r;
    else
        *head = r;
    *tail = r;
}

/* Queue r's completion with st (r is freed once it has run). */
static void comp_defer(tcp_tp_t *t, txreq_t *r, tern_status_t st)
{
    r->status = st;
    txq_append(&t->done_head, &t->done_tail, r);
}

/* Run the queued completions, in the order they were reached. A callback may
 * post (its completion joins the queue and runs in this loop) or destroy an
 * endpoint. Returns how many ran. */
static int drain_done(tcp_tp_t *t)
{
    int n = 0;
    while (t->done_head != NULL) {
        txreq_t *r = t->done_head;
        t->done_head = r->next;
        if (t->done_head == NULL)
            t->done_tail = NULL;
        tern__comp_call(&r->comp, r->status);
        free(r);
        n++;
    }
    return n;
}

static void event(tcp_tp_t *t, tern_event_type_t type, uint32_t src, uint32_t imm, const void *data,
                  size_t len, tern_status_t st)
{
    tern_event_t ev = {.type = type, .src = src, .imm = imm, .data = data, .len = len, .status = st};
    t->events++;
    tern__tp_event(&t->base, &ev);
}

/* ---- registrations seen from the network ---- */

static void mr_unpin(tcp_tp_t *t, tcp_mr_t *mr)
{
    (void)t;
    if (mr != NULL && --mr->pins == 0 && mr->revoked)
        free(mr);
}

/*
 * Check a peer's request against our registrations before touching memory.
 * On success the region is pinned (until the request is done) and *ptr is
 * where raddr lies.
 */
static tern_status_t check_remote(tcp_tp_t *t, uint64_t key, uint64_t raddr, uint64_t size,
                                  unsigned need, tcp_mr_t **mr_out, uint8_t **ptr)
{
    tcp_mr_t *mr;
    HASH_FIND(hh, t->keys, &key, sizeof(key), mr);
    if (mr == NULL)
        return TERN_ERR_ACCESS; /* unknown or revoked key */
    uint64_t base = (uintptr_t)mr->base.addr, len = mr->base.len;
    if (!tern__range_within(base, len, raddr, size))
        return TERN_ERR_ACCESS; /* out of bounds: the header promises ACCESS for every refusal */
    if (!(mr->base.access & need))
        return TERN_ERR_ACCESS;
    mr->pins++;
    *mr_out = mr;
    *ptr = (uint8_t *)mr->base.addr + (raddr - base);
    return TERN_OK;
}

/* ---- sending ---- */

static void conn_fail(conn_t *c, tern_status_t why);
static void send_bye(conn_t *c);

/* writev without SIGPIPE: a peer that went away must be an error, not the end
 * of the process. */
static ssize_t send_iov(int fd, struct iovec *iov, int iovcnt, int flags)
{
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)iovcnt};
    return sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT | flags);
}

/*
 * The most bytes one write or splice hands c's socket: TERN_TCP_WRITE_MAX,
 * rounded down to whole segments of the connection (TCP_MAXSEG, at least
 * one). A write holds the socket's lock while the kernel copies it in and
 * pushes its segments out only as it ends (or half a window in); a write of
 * a segment or a few goes out at once and lets the lock go, so the peer
 * copies one segment out while this end copies the next in: a quarter off a
 * 2-rank 4 MiB all_reduce on loopback, where a segment is 65,483 bytes
 * (docs/perf.md, "Writes of one segment"). Known once the connection is up
 * (the caller checks).
 */
static size_t write_cap(conn_t *c)
{
    if (c->write_max == 0) {
        size_t cap = c->tp->write_max;
        int mss = 0;
        socklen_t l = sizeof(mss);
        if (cap == 0)
            cap = SIZE_MAX;
        else if (getsockopt(c->fd, IPPROTO_TCP, TCP_MAXSEG, &mss, &l) == 0 && mss > 0)
            cap = cap < (size_t)mss ? (size_t)mss : cap - cap % (size_t)mss;
        c->write_max = cap;
    }
    return c->write_max;
}

/* How many of a frame's left bytes one call hands c's socket: write_cap,
 * or all of them where what would stay behind is under
 * TX_TAIL_MIN. A short tail left alone costs a call and a segment of its own
 * for bytes that stream nothing: every 64 KiB put wrote 65,483 bytes, then
 * 109 (docs/perf.md, "Thirtieth look"). */
static size_t write_take(conn_t *c, size_t left)
{
    const size_t cap = write_cap(c);
    return left > cap && left - cap < TX_TAIL_MIN ? left : cap;
}

/* The front of iov[0..iovcnt), at most max bytes of it, into out (which has
 * room for iovcnt entries); *len gets its bytes. Returns its entry count. */
static int iov_front(struct iovec *out, const struct iovec *iov, int iovcnt, size_t max,
                     size_t *len)
{
    int n = 0;
    *len = 0;
    for (int i = 0; i < iovcnt && *len < max; i++) {
        out[n] = iov[i];
        if (out[n].iov_len > max - *len)
            out[n].iov_len = max - *len;
        *len += out[n++].iov_len;
    }
    return n;
}

static void iov_advance(struct iovec *iov, int iovcnt, size_t n)
{
    for (int i = 0; i < iovcnt && n > 0; i++) {
        size_t take = n < iov[i].iov_len ? n : iov[i].iov_len;
        iov[i].iov_base = (uint8_t *)iov[i].iov_base + take;
        iov[i].iov_len -= take;
        n -= take;
    }
}

static void set_want_out(conn_t *c, bool want)
{
    if (c->want_out == want || c->state == C_DEAD)
        return;
    c->want_out = want;
    struct epoll_event ev = {.events = EPOLLIN | (want ? EPOLLOUT : 0), .data.ptr = c};
    epoll_ctl(c->tp->epfd, EPOLL_CTL_MOD, c->fd, &ev);
}

/* Only payloads whose completion waits for the peer may go by reference
 * (see splice_payload): a SEND completes as soon as the socket has it. */
static bool zcopy_eligible(const tcp_tp_t *t, uint8_t type, uint64_t len)
{
    return (type == F_PUT || type == F_GET_DATA) && t->zcopy_min > 0 && len >= t->zcopy_min;
}

static bool zc_known(const zc_cost_t *c)
{
    return c->bytes >= ZC_SEED;
}

/*
 * One socket call's time for n payload bytes. A call the scheduler or the
 * hypervisor took the core from would count milliseconds for a few
 * microseconds of work, so once a way's cost is known a call counts for at
 * most four times it plus ZC_CALL_SLACK_NS: an outlier moves the estimate
 * without swamping it, and a real change still shows within a few calls.
 */
static void zc_add(zc_cost_t *c, uint64_t ns, size_t n)
{
    double d = (double)ns;
    if (zc_known(c)) {
        double cap = 4.0 * c->ns / c->bytes * (double)n + ZC_CALL_SLACK_NS;
        if (d > cap)
            d = cap;
    }
    c->ns += d;
    c->bytes += (double)n;
    if (c->bytes > ZC_WINDOW) {
        c->ns /= 2;
        c->bytes /= 2;
    }
}

/* ns a byte of c's sums; 0 before any */
static double zc_rate(const zc_cost_t *c)
{
    return c->bytes > 0 ? c->ns / c->bytes : 0.0;
}

/* What a byte costs one way: writing it, plus reading it once both kinds have
 * been read here. */
static double zc_cost(const zc_stats_t *z, int way)
{
    double cost = z->send[way].ns / z->send[way].bytes;
    if (zc_known(&z->recv[ZC_COPY]) && zc_known(&z->recv[ZC_SPLICE]))
        cost += z->recv[way].ns / z->recv[way].bytes;
    return cost;
}

/*
 * Whether an eligible payload of len bytes is spliced. Until both ways are
 * measured they take turns, the one with fewer bytes timed going next; then
 * the cheaper one goes, and the other is tried again with one payload after
 * try_gap bytes, a gap that doubles while the choice holds (at 1 GiB under
 * 1 % of the bytes) and shrinks back when it flips.
 * The first choice is the one that tends to stay, so it is made on ZC_SEED
 * bytes each way, taken in turns through the job's first calls: made on one
 * 1 MiB payload each way, splice first, it set both ranks of one 2-rank
 * 1 MiB all_reduce run in ten to splicing every payload, 290 us a call
 * against 220 copied (docs/perf.md, "Twenty-sixth look").
 */
static bool zc_pick(tcp_tp_t *t, size_t len)
{
    zc_stats_t *z = &t->zc;
    if (!t->zcopy_auto)
        return true;
    if (!zc_known(&z->send[ZC_SPLICE]) || !zc_known(&z->send[ZC_COPY]))
        return z->send[ZC_SPLICE].bytes <= z->send[ZC_COPY].bytes;
    /* The other way must be cheaper by a sixteenth to take over: two ways
     * that cost the same would otherwise swap at every wobble, each swap
     * bringing the tries back to ZC_TRY_MIN. */
    const double cost[2] = {zc_cost(z, ZC_COPY), zc_cost(z, ZC_SPLICE)};
    const int other = !z->best;
    z->picked[ZC_COPY] = cost[ZC_COPY];
    z->picked[ZC_SPLICE] = cost[ZC_SPLICE];
    const int best = cost[other] * 17 < cost[z->best] * 16 ? other : z->best;
    if (best != z->best || z->try_gap == 0) {
        tern_debug("tcp: payloads of %zu bytes and up now %s (%.3f ns a byte spliced, %.3f "
                   "copied; written %.3f/%.3f, read %.3f/%.3f)",
                   t->zcopy_min, best == ZC_SPLICE ? "spliced" : "copied", cost[ZC_SPLICE],
                   cost[ZC_COPY], zc_rate(&z->send[ZC_SPLICE]), zc_rate(&z->send[ZC_COPY]),
                   zc_rate(&z->recv[ZC_SPLICE]), zc_rate(&z->recv[ZC_COPY]));
        z->best = best;
        z->try_gap = ZC_TRY_MIN;
        z->since_try = 0;
    }
    if (z->since_try >= z->try_gap) {
        z->since_try = 0;
        if (z->try_gap < ZC_TRY_MAX)
            z->try_gap *= 2;
        return best == ZC_COPY;
    }
    z->since_try += len;
    return best == ZC_SPLICE;
}

/* How r's payload goes is decided as its header leaves, not as it is queued:
 * a window of payloads queued at once would otherwise all be decided on what
 * was known before any of them was written. */
static void choose_zcopy(tcp_tp_t *t, txreq_t *r, size_t len)
{
    r->zc_undecided = zcopy_eligible(t, r->type, len);
}

/* r's header is about to leave: splice or copy, and say which in it (a
 * reply refused since it was queued has no payload left to decide on). */
static void decide_zcopy(tcp_tp_t *t, txreq_t *r)
{
    r->zc_undecided = false;
    if (r->iovcnt < 2)
        return;
    /* The caller's way stands over the measure in auto mode (zcopy_auto;
     * TERN_TCP_ZCOPY_MODE=always is the operator's word), and is timed like
     * any payload so that the sums stay current. */
    r->zcopy = t->zcopy_auto && r->way != TERN_WAY_AUTO ? r->way == TERN_WAY_REF
                                                        : zc_pick(t, r->iov[1].iov_len);
    r->zc_timed = t->zcopy_auto;
    if (r->zcopy)
        r->hdr[1] |= FLAG_SPLICED;
}

/* Tests only: what TERN_TCP_ZCOPY_MODE=auto has measured on tp: bytes timed
 * written and read each way (ZC_COPY, ZC_SPLICE), what a byte cost each way
 * at the last pick, and whether that pick was to splice. */
void tern__tcp_zcopy_stats(tern_transport_t *tp, double written[2], double read[2],
                           double cost[2], bool *splicing);

void tern__tcp_zcopy_stats(tern_transport_t *tp, double written[2], double read[2],
                           double cost[2], bool *splicing)
{
    const zc_stats_t *z = &to_tcp_tp(tp)->zc;
    for (int w = ZC_COPY; w <= ZC_SPLICE; w++) {
        written[w] = z->send[w].bytes;
        read[w] = z->recv[w].bytes;
        cost[w] = z->picked[w];
    }
    *splicing = z->best == ZC_SPLICE;
}

/* A request fully written: a send is done; a put or get now awaits its reply. */
static void tx_done(conn_t *c, txreq_t *r)
{
    if (r->type == F_PUT || r->type == F_GET) {
        txq_append(&c->pend_head, &c->pend_tail, r);
        return;
    }
    if (r->type == F_GET_DATA) {
        mr_unpin(c->tp, r->pin);
        if (r->copy != NULL && r->zcopy) {
            r->next = c->keep; /* its pages may still be the socket's: kept until close */
            c->keep = r;
            return;
        }
        free(r->copy);
        free(r);
        return;
    }
    comp_defer(c->tp, r, TERN_OK);
}

/*
 * The payload of r by reference: vmsplice pins its pages into c's pipe and
 * splice hands them to the socket, so the kernel never copies it on this side
 * (a copy is most of what a TCP sender spends). The pages are read until the
 * peer has taken the data, which is safe where tern uses it: a put completes
 * only on the target's ack, and a get reads memory its owner keeps stable
 * until the getter says it is done, as with RDMA. The pipe is emptied before
 * the next frame goes out, so the stream stays in order.
 * Returns 1 when all of it is out, 0 when the socket is full, -1 when the
 * connection failed, 2 when splicing is not possible (copy the rest instead).
 */
static int splice_payload(conn_t *c, txreq_t *r)
{
    struct iovec *v = &r->iov[1];
    if (c->pipe[0] < 0) {
        if (pipe2(c->pipe, O_NONBLOCK | O_CLOEXEC) != 0) {
            c->pipe[0] = c->pipe[1] = -1;
            return 2;
        }
        /* A bigger pipe: fewer calls per payload; the default size also works. */
        (void)fcntl(c->pipe[1], F_SETPIPE_SZ, PIPE_SIZE);
    }
    for (;;) {
        if (c->in_pipe == 0) {
            if (v->iov_len == 0)
                return 1;
            ssize_t n = vmsplice(c->pipe[1], v, 1, SPLICE_F_NONBLOCK);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) {
                tern_info("tcp: vmsplice unavailable (%s); payloads will be copied",
                          n < 0 ? strerror(errno) : "no progress");
                c->tp->zcopy_min = 0;
                return 2;
            }
            iov_advance(v, 1, (size_t)n);
            c->in_pipe = (size_t)n;
        }
        const size_t most = write_take(c, c->in_pipe + v->iov_len);
        ssize_t n = splice(c->pipe[0], NULL, c->fd, NULL, c->in_pipe < most ? c->in_pipe : most,
                           SPLICE_F_NONBLOCK | SPLICE_F_MOVE | (v->iov_len > 0 ? SPLICE_F_MORE : 0));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (n <= 0)
            return -1;
        c->in_pipe -= (size_t)n;
    }
}

/*
 * splice has no MSG_NOSIGNAL: a peer that went away would raise SIGPIPE and
 * end the process. So SIGPIPE is blocked in this thread around the calls, and
 * one raised by them is taken back before it is unblocked (one that was
 * already pending is left alone).
 */
static int splice_payload_nosignal(conn_t *c, txreq_t *r)
{
    sigset_t pipe_set, old, pending;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
    bool was_pending = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE);
    int ret = splice_payload(c, r);
    if (ret < 0 && errno == EPIPE && !was_pending) {
        int err = errno;
        struct timespec zero = {0, 0};
        while (sigtimedwait(&pipe_set, NULL, &zero) < 0 && errno == EINTR)
            ;
        errno = err;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return ret;
}

/* Write what the socket takes of r: 1 when all of it is out, 0 when the socket
 * is full, -1 when the connection failed. */
static int tx_some(conn_t *c, txreq_t *r)
{
    if (r->zc_undecided)
        decide_zcopy(c->tp, r);
    for (;;) {
        /* zcopy: the header alone (MSG_MORE: it leaves with the payload), then
         * the payload by splice_payload. */
        int cnt = r->zcopy ? 1 : r->iovcnt;
        if (r->iov[0].iov_len > 0 || (cnt > 1 && r->iov[1].iov_len > 0)) {
            struct iovec part[2];
            size_t want;
            int pc = iov_front(part, r->iov, cnt,
                               write_take(c, r->iov[0].iov_len + (cnt > 1 ? r->iov[1].iov_len : 0)),
                               &want);
            const bool timed = r->zc_timed && !r->zcopy;
            const uint64_t t0 = timed ? tern_clock_ns() : 0;
            ssize_t n = send_iov(c->fd, part, pc, r->zcopy ? MSG_MORE : 0);
            if (timed)
                zc_add(&c->tp->zc.send[ZC_COPY], tern_clock_ns() - t0, n > 0 ? (size_t)n : 0);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0)
                return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
            iov_advance(r->iov, cnt, (size_t)n);
            if ((size_t)n < want)
                return 0; /* a short write: the socket is full */
            continue;     /* the rest, or on to the payload's splice */
        }
        if (!r->zcopy)
            return 1;
        const size_t left = r->iov[1].iov_len + c->in_pipe;
        const uint64_t t0 = r->zc_timed ? tern_clock_ns() : 0;
        int z = splice_payload_nosignal(c, r);
        if (r->zc_timed)
            zc_add(&c->tp->zc.send[ZC_SPLICE], tern_clock_ns() - t0,
                   left - (r->iov[1].iov_len + c->in_pipe));
        if (z != 2)
            return z;
        r->zcopy = false; /* copy the rest */
    }
}

/* Write as much of the queue as the socket takes. Returns false if the
 * connection failed (it is then marked dead). */
static bool flush_tx(conn_t *c)
{
    if (c->state != C_OPEN)
        return c->state != C_DEAD;
    if (c->plugged)
        return true;
    while (c->tx_head != NULL) {
        txreq_t *r = c->tx_head;
        int done = tx_some(c, r);
        if (done < 0) {
            conn_fail(c, TERN_ERR_PEER_LOST);
            return false;
        }
        if (done == 0)
            break;
        c->tx_head = r->next;
        if (c->tx_head == NULL)
            c->tx_tail = NULL;
        tx_done(c, r);
    }
    set_want_out(c, c->tx_head != NULL);
    return true;
}

/* A SEND of up to TCP_INLINE bytes is copied into its request (attr.max_inline);
 * room is made for HELLO's own payload too. */
static txreq_t *txreq_new(const frame_t *f, const void *payload, size_t len)
{
    const bool copy = f->type == F_SEND && len <= TCP_INLINE;
    txreq_t *r = calloc(1, sizeof(*r) + (copy ? len : f->type == F_HELLO ? HELLO_LEN : 0));
    if (r == NULL)
        return NULL;
    frame_encode(f, r->hdr);
    r->type = f->type;
    r->op_id = f->op_id;
    r->iov[0] = (struct iovec){r->hdr, HDR_SIZE};
    r->iovcnt = 1;
    if (copy && len > 0) {
        memcpy(r->small, payload, len);
        payload = r->small;
    }
    if (len > 0)
        r->iov[r->iovcnt++] = (struct iovec){(void *)payload, len};
    return r;
}

static void enqueue(conn_t *c, txreq_t *r)
{
    txq_append(&c->tx_head, &c->tx_tail, r);
}

/*
 * Post a frame on c. When nothing is queued and the socket takes it whole, a
 * SEND completes here (TERN_OK, no allocation); otherwise it is queued and
 * completes later (TERN_INPROGRESS). PUT and GET always complete later.
 */
static tern_status_t post(conn_t *c, const frame_t *f, const void *payload, size_t len,
                          const tern_op_params_t *params, void *get_buf)
{
    if (f->type == F_SEND && c->state == C_OPEN && c->tx_head == NULL && !c->plugged &&
        HDR_SIZE + len <= write_cap(c)) {
        uint8_t hdr[HDR_SIZE];
        struct iovec iov[2] = {{hdr, HDR_SIZE}, {(void *)payload, len}};
        frame_encode(f, hdr);
        ssize_t n;
        do {
            n = send_iov(c->fd, iov, len > 0 ? 2 : 1, 0);
        } while (n < 0 && errno == EINTR);
        if (n == (ssize_t)(HDR_SIZE + len))
            return TERN_OK;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            int err = errno;
            conn_fail(c, TERN_ERR_PEER_LOST);
            return tern__error(TERN_ERR_PEER_LOST, "tcp: send to peer %u failed: %s", c->peer,
                               strerror(err));
        }
        /* Partly written: queue the rest, keeping the stream in step. */
        txreq_t *r = txreq_new(f, payload, len);
        if (r == NULL) {
            /* Half a frame is on the wire and we cannot remember the rest. */
            conn_fail(c, TERN_ERR_NO_MEMORY);
            return tern__error(TERN_ERR_NO_MEMORY, "tcp: no memory to queue a send");
        }
        r->comp = tern__comp_of(params);
        iov_advance(r->iov, r->iovcnt, n > 0 ? (size_t)n : 0);
        enqueue(c, r);
        set_want_out(c, true);
        return TERN_INPROGRESS;
    }
    txreq_t *r = txreq_new(f, payload, len);
    if (r == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "tcp: no memory to queue a request");
    r->comp = tern__comp_of(params);
    choose_zcopy(c->tp, r, len);
    if (f->type == F_PUT && (params->field_mask & TERN_OP_PARAM_WAY))
        r->way = (uint8_t)params->way;
    r->get_buf = get_buf;
    r->get_size = f->type == F_GET ? f->size : 0;
    enqueue(c, r);
    flush_tx(c); /* on failure, conn_fail has queued r's completion with the error */
    return TERN_INPROGRESS;
}

/* ---- connections ---- */

static void free_txq(txreq_t *r, tern_status_t st, tcp_tp_t *t)
{
    while (r != NULL) {
        txreq_t *next = r->next;
        if (r->type == F_SEND || r->type == F_PUT || r->type == F_GET) {
            comp_defer(t, r, st);
        } else {
            if (r->type == F_GET_DATA)
                mr_unpin(t, r->pin);
            free(r->copy);
            free(r);
        }
        r = next;
    }
}

/* The connection is lost or closed: fail what is queued, tell the user once,
 * and leave the socket for conn_reap(). */
static void conn_fail(conn_t *c, tern_status_t why)
{
    tcp_tp_t *t = c->tp;
    if (c->state == C_DEAD)
        return;
    c->state = C_DEAD;
    epoll_ctl(t->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    /* The socket stays open until the connection is freed (with its
     * endpoint); the peer must hear now that nothing more will come or be
     * answered here, or its operations would wait for ever. */
    shutdown(c->fd, SHUT_RDWR);
    if (c->ep != NULL)
        c->ep->failed = why;
    txreq_t *tx = c->tx_head, *pend = c->pend_head;
    c->tx_head = c->tx_tail = c->pend_head = c->pend_tail = NULL;
    free_txq(tx, why, t);
    free_txq(pend, why, t);
    if (c->cur_mr != NULL) {
        mr_unpin(t, c->cur_mr);
        c->cur_mr = NULL;
    }
    if (c->cur_op != NULL) { /* a get whose reply was arriving */
        comp_defer(t, c->cur_op, why);
        c->cur_op = NULL;
    }
    /* CANCELED is our own teardown or the peer's goodbye: nothing to report.
     * A protocol violation on a connection no endpoint has adopted may be a
     * stranger's (hello_refusal): the warning is all it gets. */
    bool tell = why != TERN_ERR_CANCELED &&
                (c->ep != NULL || (c->hello_seen && why != TERN_ERR_PROTOCOL));
    if (tell) {
        tern_debug("tcp: connection %s peer %u lost (%s)", c->incoming ? "from" : "to", c->peer,
                   tern_strerror(why));
        if (t->in_progress > 0) {
            event(t, TERN_EVENT_ERROR, c->peer, 0, NULL, 0, why);
        } else {
            /* Failed in a post or a dereg: callbacks run in progress only
             * (one that destroyed this endpoint here would free c under us). */
            c->tell = why;
            t->tell_pending = true;
        }
    }
    /* The winner waits for this one's SWITCH_ACK, which will never come. */
    if (c->successor != NULL && c->successor->plugged) {
        conn_t *next = c->successor;
        c->successor = NULL;
        conn_fail(next, why);
    }
}

static void conn_free(conn_t *c)
{
    if (c->state != C_DEAD)
        conn_fail(c, TERN_ERR_CANCELED);
    if (c->tp->hot == c)
        c->tp->hot = NULL;
    for (conn_t *o = c->tp->conns; o != NULL; o = o->next)
        if (o->successor == c)
            o->successor = NULL;
    close(c->fd);
    if (c->pipe[0] >= 0) {
        close(c->pipe[0]);
        close(c->pipe[1]);
    }
    while (c->keep != NULL) {
        txreq_t *r = c->keep;
        c->keep = r->next;
        free(r->copy);
        free(r);
    }
    free(c->rxbuf);
    free(c->big);
    free(c);
}

/* Unlink and free dead connections no endpoint owns (an owned one dies with its ep). */
static void conn_reap(tcp_tp_t *t)
{
    conn_t **pp = &t->conns;
    while (*pp != NULL) {
        conn_t *c = *pp;
        if (c->state == C_DEAD && c->ep == NULL) {
            *pp = c->next;
            conn_free(c);
        } else {
            pp = &c->next;
        }
    }
}

static void tune(tcp_tp_t *t, int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (t->sockbuf > 0) {
        int sz = t->sockbuf > (size_t)INT32_MAX ? INT32_MAX : (int)t->sockbuf;
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
    }
}

static conn_t *conn_new(tcp_tp_t *t, int fd, bool incoming)
{
    conn_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->rxbuf = malloc(RXBUF_SIZE);
    if (c->rxbuf == NULL) {
        free(c);
        return NULL;
    }
    c->tp = t;
    c->fd = fd;
    c->pipe[0] = c->pipe[1] = -1;
    c->incoming = incoming;
    c->state = incoming ? C_OPEN : C_CONNECTING;
    struct epoll_event ev = {.events = EPOLLIN | (incoming ? 0 : EPOLLOUT), .data.ptr = c};
    c->want_out = !incoming;
    if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        free(c->rxbuf);
        free(c);
        return NULL;
    }
    c->next = t->conns;
    t->conns = c;
    return c;
}

/* ---- receiving ---- */

/*
 * What a recv that returned r <= 0 means: 1 to retry (interrupted), 0 to stop
 * until epoll reports more, -1 when the connection ended (it is failed: after
 * a BYE the peer closed on purpose, otherwise it is lost).
 */
static int recv_end(conn_t *c, ssize_t r)
{
    if (r == 0) {
        /* After a BYE on its endpoint's connection the peer closed that
         * endpoint (tern_finalize): nothing more will come, so whatever
         * waits on it here must hear so, as TERN_ERR_CLOSED (an orderly
         * end, not an error to log). A retired connection's BYE (a switch)
         * has no endpoint and says nothing. */
        bool ended = c->bye_seen && c->ep != NULL && c->ep->conn == c;
        uint32_t peer = c->peer;
        conn_fail(c, c->bye_seen ? TERN_ERR_CANCELED : TERN_ERR_PEER_LOST);
        if (ended)
            event(c->tp, TERN_EVENT_ERROR, peer, 0, NULL, 0, TERN_ERR_CLOSED);
        return -1;
    }
    if (errno == EINTR)
        return 1;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
        return 0;
    conn_fail(c, TERN_ERR_PEER_LOST);
    return -1;
}

/* Take up to n buffered bytes into dst (NULL: discard); returns how many. */
static size_t take_buffered(conn_t *c, uint8_t *dst, size_t n)
{
    size_t avail = c->rx_len - c->rx_off;
    if (n > avail)
        n = avail;
    if (dst != NULL && n > 0)
        memcpy(dst, c->rxbuf + c->rx_off, n);
    c->rx_off += n;
    return n;
}

/* Reply to a PUT: the ack, and the target-side event. */
static void finish_put(conn_t *c)
{
    tcp_tp_t *t = c->tp;
    frame_t ack = {.type = F_PUT_ACK, .op_id = c->cur.op_id,
                   .status = c->refused ? c->refusal : TERN_OK};
    txreq_t *r = txreq_new(&ack, NULL, 0);
    if (r == NULL) {
        conn_fail(c, TERN_ERR_NO_MEMORY);
        return;
    }
    enqueue(c, r);
    if (c->refused)
        event(t, TERN_EVENT_ERROR, c->peer, (c->cur.flags & FLAG_IMM) ? c->cur.imm : 0, NULL, 0,
              c->refusal);
    else if (c->cur.flags & FLAG_IMM)
        event(t, TERN_EVENT_PUT_IMM, c->peer, c->cur.imm, NULL, (size_t)c->cur.size, TERN_OK);
    mr_unpin(t, c->cur_mr);
    c->cur_mr = NULL;
    flush_tx(c);
}

/* A complete payload has arrived for c->cur. */
static void payload_done(conn_t *c)
{
    tcp_tp_t *t = c->tp;
    switch (c->cur.type) {
    case F_SEND:
        event(t, TERN_EVENT_RECV, c->peer, c->cur.imm, c->dst, (size_t)c->cur.payload, TERN_OK);
        break;
    case F_PUT:
        finish_put(c);
        break;
    case F_GET_DATA: {
        txreq_t *r = c->cur_op;
        c->cur_op = NULL;
        comp_defer(t, r, c->cur.status == TERN_OK ? TERN_OK : (tern_status_t)c->cur.status);
        break;
    }
    default:
        break;
    }
    c->rx_state = RX_HDR;
}

/* The reply at the head of the pending queue, checked against what arrived. */
static txreq_t *pop_pending(conn_t *c, uint8_t want_type)
{
    txreq_t *r = c->pend_head;
    if (r == NULL || r->type != want_type || r->op_id != c->cur.op_id)
        return NULL;
    c->pend_head = r->next;
    if (c->pend_head == NULL)
        c->pend_tail = NULL;
    return r;
}

/* ---- one connection per pair (see the file comment) ---- */

static tcp_ep_t *ep_of_peer(tcp_tp_t *t, uint32_t peer)
{
    for (tcp_ep_t *ep = t->eps; ep != NULL; ep = ep->next)
        if (ep->base.peer == peer)
            return ep;
    return NULL;
}

/* "host:port" of an IPv4 or IPv6 socket address, "?" for anything else. */
static void addr_text(const struct sockaddr_storage *ss, char *buf, size_t len)
{
    char host[INET6_ADDRSTRLEN];

    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &s4->sin_addr, host, sizeof(host));
        snprintf(buf, len, "%s:%u", host, ntohs(s4->sin_port));
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &s6->sin6_addr, host, sizeof(host));
        snprintf(buf, len, "%s:%u", host, ntohs(s6->sin6_port));
    } else {
        snprintf(buf, len, "?");
    }
}

/* Who is at the other end of c, for a log line: "peer N" once known, else
 * the address it connected from. */
static const char *conn_who(const conn_t *c, char *buf, size_t len)
{
    struct sockaddr_storage ss = {0};
    socklen_t sl = sizeof(ss);
    char where[INET6_ADDRSTRLEN + 8];

    if (!c->incoming || c->hello_seen) {
        snprintf(buf, len, "peer %u", c->peer);
        return buf;
    }
    if (getpeername(c->fd, (struct sockaddr *)&ss, &sl) != 0)
        ss.ss_family = AF_UNSPEC;
    addr_text(&ss, where, sizeof(where));
    snprintf(buf, len, "an unidentified connection from %s", where);
    return buf;
}

/*
 * Anyone can connect to the listener: a port scanner, a health check, a rank
 * of another job (or of an earlier run) dialing an address that is now ours.
 * Its HELLO must be a tern tcp peer's of this protocol version and, where we
 * have an endpoint for the id it claims (our own id included: a transport may
 * have an endpoint to itself), come from the process that endpoint's address
 * named (the instance). Otherwise nothing it sent is delivered: the
 * connection is closed with a warning and no event, so no rank is taken for
 * lost or heard from on a stranger's word.
 */
static const char *hello_refusal(const conn_t *c, uint32_t peer, uint64_t instance)
{
    const tcp_ep_t *ep = ep_of_peer(c->tp, peer);

    if (tern__get_le32(c->hello) != ADDR_MAGIC || c->hello[4] != ADDR_VERSION ||
        c->hello[5] != 0 || c->hello[6] != 0 || c->hello[7] != 0)
        return "its HELLO is not a tern tcp provider's of this version";
    if (ep != NULL && ep->peer_instance != instance)
        return "it claims a peer id whose endpoint names another process "
               "(another job, or an earlier run of this one)";
    return NULL;
}

/*
 * A HELLO arrived on incoming c: check it (hello_refusal), then, if we opened
 * a connection to the same peer at the same time and the peer's id is lower,
 * its connection wins: retire ours behind a SWITCH and plug c until the
 * answer. Returns false when c was refused (and is closed).
 */
static bool hello_arrived(conn_t *c)
{
    tcp_tp_t *t = c->tp;
    uint32_t peer = tern__get_le32(c->hello + 8);
    uint64_t instance = tern__get_le64(c->hello + 12);
    const char *why = hello_refusal(c, peer, instance);
    char who[96];

    if (why != NULL) {
        tern_warn("tcp: refused %s claiming id %u: %s; closed", conn_who(c, who, sizeof(who)),
                  peer, why);
        conn_fail(c, TERN_ERR_PROTOCOL);
        return false;
    }
    c->peer = peer;
    c->peer_instance = instance;
    c->hello_seen = true;
    c->rx_state = RX_HDR;
    tcp_ep_t *ep = ep_of_peer(t, c->peer);
    if (ep == NULL || c->peer >= t->base.self_id || ep->conn == c || ep->conn->incoming ||
        ep->conn->state == C_DEAD || ep->peer_instance != c->peer_instance)
        return true; /* no crossing, or ours wins and the peer switches */
    conn_t *old = ep->conn;
    frame_t f = {.type = F_SWITCH};
    txreq_t *r = txreq_new(&f, NULL, 0);
    if (r == NULL) {
        tern_warn("tcp: no memory to switch connections with peer %u; keeping two", c->peer);
        return true;
    }
    enqueue(old, r);
    old->ep = NULL;
    old->retired = true;
    old->successor = c;
    ep->conn = c;
    c->ep = ep;
    c->plugged = true;
    flush_tx(old);
    return c->state != C_DEAD;
}

/* The peer has handled everything sent on retired c: unplug the winner and
 * close c (no replies are owed on it: SWITCH_ACK came after them). */
static void switch_done(conn_t *c)
{
    conn_t *next = c->successor;
    c->successor = NULL;
    if (next != NULL && next->plugged) {
        next->plugged = false;
        flush_tx(next);
    }
    send_bye(c);
    conn_fail(c, TERN_ERR_CANCELED);
}

/*
 * A header has arrived: check it and decide where its payload goes. Returns
 * false on a protocol violation (the connection is then failed).
 */
static bool header_arrived(conn_t *c)
{
    tcp_tp_t *t = c->tp;
    frame_t *f = &c->cur;
    c->got = 0;
    c->dst = NULL;
    c->refused = false;

    if (c->incoming && !c->hello_seen && f->type != F_HELLO)
        goto bad;
    switch (f->type) {
    case F_HELLO:
        if (!c->incoming || c->hello_seen || f->payload != HELLO_LEN)
            goto bad;
        c->dst = c->hello;
        break;
    case F_BYE:
        if (f->payload != 0)
            goto bad;
        c->bye_seen = true;
        break;
    case F_SEND:
        if (f->payload > MAX_SEND)
            goto bad;
        if (f->payload > RXBUF_SIZE - 0) {
            if (c->big_cap < f->payload) {
                uint8_t *p = realloc(c->big, (size_t)f->payload);
                if (p == NULL) {
                    tern_warn("tcp: no memory for a %" PRIu64 "-byte message from peer %u",
                              f->payload, c->peer);
                    conn_fail(c, TERN_ERR_NO_MEMORY);
                    return false;
                }
                c->big = p;
                c->big_cap = (size_t)f->payload;
            }
            c->dst = c->big;
        } else {
            c->dst = NULL; /* decided in rx_payload: in place in rxbuf if it fits */
        }
        break;
    case F_PUT: {
        if (f->payload != f->size || f->size > MAX_PUT)
            goto bad;
        tern_status_t st = check_remote(t, f->key, f->raddr, f->size, TERN_ACCESS_REMOTE_WRITE,
                                        &c->cur_mr, &c->dst);
        if (st != TERN_OK) {
            c->refused = true;
            c->refusal = st;
            c->dst = NULL;
            tern_debug("tcp: refused a %" PRIu64 "-byte put from peer %u at %#" PRIx64 ": %s",
                       f->size, c->peer, f->raddr, tern_strerror(st));
        }
        break;
    }
    case F_GET: {
        tcp_mr_t *mr = NULL;
        uint8_t *src = NULL;
        if (f->payload != 0 || f->size > MAX_PUT)
            goto bad;
        tern_status_t st = check_remote(t, f->key, f->raddr, f->size, TERN_ACCESS_REMOTE_READ, &mr,
                                        &src);
        frame_t reply = {.type = F_GET_DATA, .op_id = f->op_id, .status = st,
                         .size = st == TERN_OK ? f->size : 0,
                         .payload = st == TERN_OK ? f->size : 0};
        txreq_t *r = txreq_new(&reply, src, st == TERN_OK ? (size_t)f->size : 0);
        if (r == NULL) {
            mr_unpin(t, mr);
            conn_fail(c, TERN_ERR_NO_MEMORY);
            return false;
        }
        r->type = F_GET_DATA;
        r->pin = mr;
        /* A reply goes by reference only from memory its owner holds for
         * the reader (TERN_ACCESS_REMOTE_READ_HELD), unless splicing is
         * forced (docs/transport.md: what a dereg then cannot take back). */
        if (st == TERN_OK && (!t->zcopy_auto || (mr->base.access & TERN_ACCESS_REMOTE_READ_HELD)))
            choose_zcopy(t, r, (size_t)f->size);
        enqueue(c, r);
        if (st != TERN_OK)
            event(t, TERN_EVENT_ERROR, c->peer, 0, NULL, 0, st);
        c->rx_state = RX_HDR;
        return flush_tx(c);
    }
    case F_PUT_ACK: {
        txreq_t *r;
        if (f->payload != 0 || (r = pop_pending(c, F_PUT)) == NULL)
            goto bad;
        comp_defer(t, r, (tern_status_t)f->status);
        c->rx_state = RX_HDR;
        return true;
    }
    case F_GET_DATA: {
        txreq_t *r;
        if ((r = pop_pending(c, F_GET)) == NULL)
            goto bad;
        if (f->status == TERN_OK ? f->payload != r->get_size : f->payload != 0) {
            comp_defer(t, r, TERN_ERR_PROTOCOL);
            goto bad;
        }
        c->cur_op = r;
        c->dst = r->get_buf;
        break;
    }
    case F_SWITCH: {
        /* The peer's last frame here: everything before it is handled. */
        frame_t ack = {.type = F_SWITCH_ACK};
        txreq_t *r;
        if (!c->incoming || c->ep != NULL || c->retired || f->payload != 0)
            goto bad;
        if ((r = txreq_new(&ack, NULL, 0)) == NULL) {
            conn_fail(c, TERN_ERR_NO_MEMORY);
            return false;
        }
        c->retired = true;
        enqueue(c, r);
        c->rx_state = RX_HDR;
        return flush_tx(c);
    }
    case F_SWITCH_ACK:
        if (!c->retired || c->incoming || f->payload != 0 || c->pend_head != NULL)
            goto bad;
        switch_done(c);
        return false; /* c is closed */
    default:
        goto bad;
    }
    c->rx_state = RX_PAYLOAD;
    return true;
bad: {
    char who[96];
    tern_warn("tcp: protocol violation from %s (frame type %u, %" PRIu64
              " payload bytes); closing the connection",
              conn_who(c, who, sizeof(who)), f->type, f->payload);
}
    conn_fail(c, TERN_ERR_PROTOCOL);
    return false;
}

/*
 * Move payload bytes for the current frame: from the buffer first, then
 * straight from the socket into the destination when it is large. Returns
 * 1 when the payload is complete, 0 when more must arrive, -1 on failure.
 */
static int rx_payload(conn_t *c)
{
    frame_t *f = &c->cur;
    uint64_t need = f->payload - c->got;

    /* A small SEND wholly in the buffer is delivered in place. */
    if (f->type == F_SEND && c->dst == NULL && f->payload <= RXBUF_SIZE) {
        if (c->rx_len - c->rx_off >= f->payload) {
            c->dst = c->rxbuf + c->rx_off;
            c->rx_off += (size_t)f->payload;
            c->got = f->payload;
            return 1;
        }
        /* Make room so the whole payload lands contiguously in the buffer. */
        if (c->rx_off > 0) {
            memmove(c->rxbuf, c->rxbuf + c->rx_off, c->rx_len - c->rx_off);
            c->rx_len -= c->rx_off;
            c->rx_off = 0;
        }
        return 0;
    }
    /* A region unregistered while a put into it is arriving takes no more of
     * it: the rest is read and dropped, and the put refused. Its owner may
     * free the memory as soon as tern_mr_dereg returns. */
    if (f->type == F_PUT && c->dst != NULL && c->cur_mr != NULL && c->cur_mr->revoked) {
        tern_debug("tcp: a %" PRIu64 "-byte put from peer %u lost its region after %" PRIu64
                   " bytes; the rest is dropped",
                   f->size, c->peer, c->got);
        c->dst = NULL;
        c->refused = true;
        c->refusal = TERN_ERR_ACCESS;
    }
    uint8_t *dst = c->dst != NULL ? c->dst + c->got : NULL;
    size_t n = take_buffered(c, dst, need > SIZE_MAX ? SIZE_MAX : (size_t)need);
    c->got += n;
    need -= n;
    while (need > 0) {
        /* The buffer is empty: read straight into the destination. */
        uint8_t *to = c->dst != NULL ? c->dst + c->got : c->tp->scratch;
        size_t want = need;
        if (c->dst == NULL && want > RXBUF_SIZE)
            want = RXBUF_SIZE;
        const bool timed = c->tp->zcopy_auto && c->dst != NULL &&
                           zcopy_eligible(c->tp, f->type, f->payload);
        const uint64_t t0 = timed ? tern_clock_ns() : 0;
        ssize_t r = recv(c->fd, to, want, MSG_DONTWAIT);
        if (timed)
            zc_add(&c->tp->zc.recv[(f->flags & FLAG_SPLICED) ? ZC_SPLICE : ZC_COPY],
                   tern_clock_ns() - t0, r > 0 ? (size_t)r : 0);
        if (r > 0) {
            c->nread += (uint64_t)r;
            c->got += (uint64_t)r;
            need -= (uint64_t)r;
            /* A short read emptied the socket (see fill): wait for epoll
             * rather than ask again. A payload streaming in a segment at a
             * time otherwise cost two more recv calls per segment that
             * could only say EAGAIN, here and in on_readable's fill. */
            if ((size_t)r < want) {
                c->drained = true;
                return 0;
            }
            continue;
        }
        int end = recv_end(c, r);
        if (end <= 0)
            return end;
    }
    return 1;
}

/* Refill the receive buffer. Returns bytes read, 0 when none, -1 when the
 * connection ended. */
static ssize_t fill(conn_t *c)
{
    if (c->rx_off == c->rx_len)
        c->rx_off = c->rx_len = 0;
    if (c->rx_len == RXBUF_SIZE) {
        memmove(c->rxbuf, c->rxbuf + c->rx_off, c->rx_len - c->rx_off);
        c->rx_len -= c->rx_off;
        c->rx_off = 0;
    }
    for (;;) {
        size_t space = RXBUF_SIZE - c->rx_len;
        ssize_t n = recv(c->fd, c->rxbuf + c->rx_len, space, MSG_DONTWAIT);
        if (n > 0) {
            c->nread += (uint64_t)n;
            c->rx_len += (size_t)n;
            /* A short read emptied the socket: another recv now would only
             * say EAGAIN; level-triggered epoll reports what comes next. */
            c->drained = (size_t)n < space;
            return n;
        }
        int end = recv_end(c, n);
        if (end <= 0)
            return end;
    }
}

/*
 * Handle every frame buffered for c, reading the socket at most READS_PER_CALL
 * times so that one busy peer cannot starve the others; whatever is still in
 * the socket keeps it readable for the next progress call (level-triggered).
 * Frames already in the buffer are always handled: nothing would wake us for
 * them.
 */
static void on_readable(conn_t *c)
{
    int reads = 0;
    while (c->state != C_DEAD) {
        if (c->rx_state == RX_HDR) {
            if (c->rx_len - c->rx_off < HDR_SIZE) {
                if (c->rx_off > 0 && RXBUF_SIZE - c->rx_off < HDR_SIZE) {
                    memmove(c->rxbuf, c->rxbuf + c->rx_off, c->rx_len - c->rx_off);
                    c->rx_len -= c->rx_off;
                    c->rx_off = 0;
                }
                if (c->drained || reads++ == READS_PER_CALL || fill(c) <= 0) {
                    c->drained = false;
                    return;
                }
                continue;
            }
            frame_decode(c->rxbuf + c->rx_off, &c->cur);
            c->rx_off += HDR_SIZE;
            if (!header_arrived(c))
                return;
            if (c->rx_state == RX_HDR)
                continue;
        }
        int r = rx_payload(c);
        if (r < 0)
            return;
        if (r == 0) {
            if (c->drained || reads++ == READS_PER_CALL || fill(c) <= 0) {
                c->drained = false;
                return;
            }
            continue;
        }
        if (c->cur.type == F_HELLO) {
            if (!hello_arrived(c))
                return;
        } else {
            payload_done(c);
        }
    }
}

static void on_connected(conn_t *c)
{
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
        err = errno;
    if (err != 0) {
        tern_warn("tcp: cannot connect to peer %u: %s", c->peer, strerror(err));
        conn_fail(c, TERN_ERR_UNREACHABLE);
        return;
    }
    c->state = C_OPEN;
    flush_tx(c);
}

static void on_accept(tcp_tp_t *t)
{
    for (;;) {
        int fd = accept4(t->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                tern_warn("tcp: accept: %s", strerror(errno));
            return;
        }
        tune(t, fd);
        if (conn_new(t, fd, true) == NULL) {
            tern_warn("tcp: no memory for an incoming connection");
            close(fd);
        }
    }
}

/* Progress calls in a row that the hot connection may serve alone. */
#define HOT_MAX 4

/*
 * The hot connection (the one whose data the last epoll round handled) is
 * read first, without asking epoll: a waiter on one peer (a ping-pong's
 * reply, the next part of a stream) then finds its message with one system
 * call instead of two. When it has nothing, or has served HOT_MAX calls in a
 * row, or has something to write, the call goes through epoll_wait, so other
 * connections, the listener and EPOLLOUT wait at most HOT_MAX - 1 calls.
 * (Leaving out epoll_wait on idle polls too gained 2-3 % on a 2-rank
 * ping-pong but cost an oversubscribed 4-rank 8 B all_reduce 30-50 %: a
 * message from another peer then waited up to three yields of the core.)
 */
/* Raise the loss events of connections that failed outside progress. */
static void tell_losses(tcp_tp_t *t)
{
    t->tell_pending = false;
    for (conn_t *c = t->conns; c != NULL; c = c->next) {
        if (c->tell != TERN_OK) {
            tern_status_t why = c->tell;
            c->tell = TERN_OK;
            event(t, TERN_EVENT_ERROR, c->peer, 0, NULL, 0, why);
        }
    }
}

/* The end of a progress call: completions run, then connections that died in
 * it, or whose endpoint a callback destroyed, are freed. */
static int progress_end(tcp_tp_t *t, int handled)
{
    handled += drain_done(t);
    t->in_progress--;
    conn_reap(t);
    return handled;
}

static int tcp_progress(tern_transport_t *tp)
{
    tcp_tp_t *t = to_tcp_tp(tp);
    struct epoll_event evs[64];
    conn_t *h = t->hot;
    t->events = 0;
    t->in_progress++;
    if (t->tell_pending)
        tell_losses(t);
    if (h != NULL && t->hot_streak < HOT_MAX && h->state == C_OPEN && h->tx_head == NULL) {
        uint64_t before = h->nread;
        on_readable(h);
        if (h->nread != before || t->events > 0) {
            t->hot_streak++;
            return progress_end(t, t->events > 0 ? t->events : 1);
        }
    }
    t->hot_streak = 0;
    int n = epoll_wait(t->epfd, evs, 64, 0);
    for (int i = 0; i < n; i++) {
        conn_t *c = evs[i].data.ptr;
        if (c == NULL) {
            on_accept(t);
            continue;
        }
        if (c->state == C_DEAD)
            continue;
        if (c->state == C_CONNECTING) {
            if (evs[i].events & (EPOLLOUT | EPOLLERR | EPOLLHUP))
                on_connected(c);
            continue;
        }
        if (evs[i].events & EPOLLOUT)
            flush_tx(c);
        if (c->state != C_DEAD && (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))) {
            on_readable(c);
            t->hot = c;
        }
    }
    return progress_end(t, n > 0 ? n + t->events : t->events);
}

static int tcp_fd(const tern_transport_t *tp)
{
    const tcp_tp_t *t = (const tcp_tp_t *)tp;
    return t->busy_poll ? -1 : t->epfd;
}

static tern_status_t tcp_arm(tern_transport_t *tp)
{
    /* epoll is level-triggered: anything pending keeps the fd readable.
     * Completions queued outside progress (a post that failed, a send
     * finished by a later post's flush) wake nothing: progress first. */
    const tcp_tp_t *t = to_tcp_tp(tp);
    return t->done_head != NULL || t->tell_pending ? TERN_ERR_NO_RESOURCE : TERN_OK;
}

/* ---- addresses ---- */

/* The local address to listen on and advertise (see the file comment of
 * provider.h for device and peer_hint). */
static tern_status_t pick_address(const tern__tp_config_t *cfg, struct sockaddr_storage *ss,
                                  socklen_t *len)
{
    memset(ss, 0, sizeof(*ss));
    if (cfg->device != NULL) {
        struct ifaddrs *ifs, *i;
        /* A literal address first, then an interface name. */
        struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
        if (inet_pton(AF_INET, cfg->device, &s4->sin_addr) == 1) {
            s4->sin_family = AF_INET;
            *len = sizeof(*s4);
            return TERN_OK;
        }
        if (inet_pton(AF_INET6, cfg->device, &s6->sin6_addr) == 1) {
            s6->sin6_family = AF_INET6;
            *len = sizeof(*s6);
            return TERN_OK;
        }
        if (getifaddrs(&ifs) != 0)
            return tern__error_errno(TERN_ERR_IO, errno, "tcp: getifaddrs");
        for (i = ifs; i != NULL; i = i->ifa_next) {
            if (i->ifa_addr == NULL || strcmp(i->ifa_name, cfg->device) != 0 ||
                !(i->ifa_flags & IFF_UP))
                continue;
            if (i->ifa_addr->sa_family == AF_INET) {
                memcpy(ss, i->ifa_addr, sizeof(struct sockaddr_in));
                *len = sizeof(struct sockaddr_in);
                break;
            }
        }
        freeifaddrs(ifs);
        if (i == NULL)
            return tern__error(TERN_ERR_NO_DEVICE,
                               "tcp: device '%s' is neither an address nor an up IPv4 interface",
                               cfg->device);
        return TERN_OK;
    }
    if (cfg->peer_hint != NULL && cfg->peer_hint[0] != '\0') {
        /* The address the kernel would send from to reach the hint: connecting
         * a UDP socket sends nothing, it only routes. */
        struct addrinfo hints = {.ai_socktype = SOCK_DGRAM}, *res = NULL;
        if (getaddrinfo(cfg->peer_hint, "9", &hints, &res) == 0) {
            int fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
            *len = sizeof(*ss);
            bool ok = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
                      getsockname(fd, (struct sockaddr *)ss, len) == 0;
            if (fd >= 0)
                close(fd);
            freeaddrinfo(res);
            if (ok) {
                /* Keep the address, not the UDP socket's port: we listen on a
                 * port of our own choosing (0: any free one). */
                if (ss->ss_family == AF_INET)
                    ((struct sockaddr_in *)ss)->sin_port = 0;
                else
                    ((struct sockaddr_in6 *)ss)->sin6_port = 0;
                return TERN_OK;
            }
        }
        tern_info("tcp: no route to %s; advertising 127.0.0.1", cfg->peer_hint);
    }
    struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
    s4->sin_family = AF_INET;
    s4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    *len = sizeof(*s4);
    return TERN_OK;
}

/* address blob: magic u32 | version u8 | family u8 | port u16 | instance u64 | self_id u32 |
 * ip (4 or 16 bytes); integers little-endian, port and ip in network order. */
static void build_address(tcp_tp_t *t, const struct sockaddr_storage *ss)
{
    uint8_t *p = t->addr;
    tern__put_le32(p, ADDR_MAGIC);
    p[4] = ADDR_VERSION;
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)ss;
        p[5] = 4;
        memcpy(p + 6, &s4->sin_port, 2);
        memcpy(p + 20, &s4->sin_addr, 4);
        t->addr_len = 24;
    } else {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ss;
        p[5] = 6;
        memcpy(p + 6, &s6->sin6_port, 2);
        memcpy(p + 20, &s6->sin6_addr, 16);
        t->addr_len = 36;
    }
    tern__put_le64(p + 8, t->instance);
    tern__put_le32(p + 16, t->base.self_id);
}

static tern_status_t parse_address(const void *buf, size_t len, struct sockaddr_storage *ss,
                                   socklen_t *sslen)
{
    const uint8_t *p = buf;
    if (len < 24)
        return tern__error(TERN_ERR_INVALID_PARAM, "tcp: address of %zu bytes is too short", len);
    if (tern__get_le32(p) != ADDR_MAGIC || p[4] != ADDR_VERSION)
        return tern__error(TERN_ERR_INVALID_PARAM,
                           "tcp: not a tcp provider address (another provider's, or another version)");
    memset(ss, 0, sizeof(*ss));
    if (p[5] == 4 && len == 24) {
        struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
        s4->sin_family = AF_INET;
        memcpy(&s4->sin_port, p + 6, 2);
        memcpy(&s4->sin_addr, p + 20, 4);
        *sslen = sizeof(*s4);
    } else if (p[5] == 6 && len == 36) {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
        s6->sin6_family = AF_INET6;
        memcpy(&s6->sin6_port, p + 6, 2);
        memcpy(&s6->sin6_addr, p + 20, 16);
        *sslen = sizeof(*s6);
    } else {
        return tern__error(TERN_ERR_INVALID_PARAM, "tcp: bad address family %u for %zu bytes", p[5],
                           len);
    }
    return TERN_OK;
}

static tern_status_t tcp_address(const tern_transport_t *tp, void *buf, size_t *len)
{
    const tcp_tp_t *t = (const tcp_tp_t *)tp;
    size_t cap = *len;
    *len = t->addr_len;
    if (cap < t->addr_len)
        return tern__error(TERN_ERR_TRUNCATED, "tcp: address needs %zu bytes, buffer has %zu",
                           t->addr_len, cap);
    memcpy(buf, t->addr, t->addr_len);
    return TERN_OK;
}

/* ---- open / close ---- */

static void tcp_close(tern_transport_t *tp)
{
    tcp_tp_t *t = to_tcp_tp(tp);
    tcp_mr_t *mr, *tmp;
    while (t->eps != NULL)
        tern_ep_destroy(&t->eps->base);
    while (t->conns != NULL) {
        conn_t *c = t->conns;
        t->conns = c->next;
        send_bye(c);
        conn_free(c);
    }
    drain_done(t);
    /* No connection is left to name a region: release the user's leftovers
     * (removing them from the key table), then anything still pinned. */
    tern__tp_release_mrs(tp);
    HASH_ITER(hh, t->keys, mr, tmp) {
        HASH_DEL(t->keys, mr);
        free(mr);
    }
    if (t->lfd >= 0)
        close(t->lfd);
    if (t->epfd >= 0)
        close(t->epfd);
    free(t->scratch);
    free(t);
}

static tern_status_t tcp_open(const tern__tp_config_t *cfg, tern_transport_t **tp_out)
{
    tcp_tp_t *t = calloc(1, sizeof(*t));
    struct sockaddr_storage ss;
    socklen_t sslen = 0;
    tern_status_t st;

    if (t == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "tcp: no memory");
    t->lfd = t->epfd = -1;
    t->base.self_id = cfg->self_id;
    t->busy_poll = cfg->busy_poll;
    t->sockbuf = cfg->tcp_sockbuf;
    t->zcopy_min = cfg->tcp_zcopy;
    t->zcopy_auto = cfg->tcp_zcopy_auto;
    t->write_max = cfg->tcp_write_max;
    t->next_key = 1;
    t->next_op = 1;
    if (getrandom(&t->instance, sizeof(t->instance), GRND_NONBLOCK) != sizeof(t->instance))
        t->instance = (uint64_t)getpid() << 32 ^ (uintptr_t)t;
    t->scratch = malloc(RXBUF_SIZE);
    if (t->scratch == NULL) {
        st = tern__error(TERN_ERR_NO_MEMORY, "tcp: no memory");
        goto fail;
    }
    if ((st = pick_address(cfg, &ss, &sslen)) != TERN_OK)
        goto fail;
    t->lfd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (t->lfd < 0 || bind(t->lfd, (struct sockaddr *)&ss, sslen) != 0 ||
        listen(t->lfd, 1024) != 0 || getsockname(t->lfd, (struct sockaddr *)&ss, &sslen) != 0) {
        st = tern__error_errno(TERN_ERR_NO_DEVICE, errno, "tcp: cannot listen on the chosen address");
        goto fail;
    }
    t->epfd = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    if (t->epfd < 0 || epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->lfd, &ev) != 0) {
        st = tern__error_errno(TERN_ERR_IO, errno, "tcp: epoll");
        goto fail;
    }
    build_address(t, &ss);
    addr_text(&ss, t->base.attr.device, sizeof(t->base.attr.device));
    t->base.attr.max_send = MAX_SEND;
    t->base.attr.max_inline = TCP_INLINE;
    t->base.attr.max_put = MAX_PUT;
    t->base.attr.eager_size = TCP_EAGER_SIZE;
    t->base.attr.revokes_keys = 1;
    t->base.attr.put_way_min = t->zcopy_auto ? t->zcopy_min : 0;
    /* What the socket holds as configured; autotuned sockets (TERN_TCP_SOCKBUF
     * 0) start smaller, so the default's size bounds them too. */
    t->base.attr.rx_window = t->sockbuf > 0 ? t->sockbuf : (size_t)4 << 20;
    t->base.attr.addr_len = t->addr_len;
    *tp_out = &t->base;
    return TERN_OK;
fail:
    tcp_close(&t->base);
    return st;
}

/* ---- endpoints ---- */

/* Whether c is an open connection whose HELLO claimed peer and that no
 * endpoint has taken (yet). */
static bool unadopted_from(const conn_t *c, uint32_t peer)
{
    return c->incoming && c->hello_seen && c->ep == NULL && !c->retired && c->state == C_OPEN &&
           c->peer == peer;
}

/* The peer's open connection to us, if it opened one first (HELLO seen). */
static conn_t *adoptable(tcp_tp_t *t, uint32_t peer, uint64_t instance)
{
    for (conn_t *c = t->conns; c != NULL; c = c->next)
        if (unadopted_from(c, peer) && !c->bye_seen && c->peer != t->base.self_id &&
            c->peer_instance == instance)
            return c;
    return NULL;
}

/* A new connection to the peer, with our HELLO queued ahead of anything else. */
static tern_status_t dial(tcp_tp_t *t, uint32_t peer, const struct sockaddr_storage *ss,
                          socklen_t sslen, conn_t **out)
{
    int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return tern__error_errno(TERN_ERR_NO_RESOURCE, errno, "tcp: socket");
    tune(t, fd);
    if (connect(fd, (const struct sockaddr *)ss, sslen) != 0 && errno != EINPROGRESS) {
        int err = errno;
        close(fd);
        return tern__error_errno(TERN_ERR_UNREACHABLE, err, "tcp: connect to peer %u", peer);
    }
    frame_t f = {.type = F_HELLO, .payload = HELLO_LEN};
    txreq_t *r = txreq_new(&f, NULL, 0);
    conn_t *c = r != NULL ? conn_new(t, fd, false) : NULL;
    if (c == NULL) {
        free(r);
        close(fd);
        return tern__error(TERN_ERR_NO_MEMORY, "tcp: no memory for a connection");
    }
    c->peer = peer;
    /* The address's magic and version: one protocol, and a stranger (another
     * program, another tern build) is told apart before it is heard. */
    tern__put_le32(r->small, ADDR_MAGIC);
    r->small[4] = ADDR_VERSION;
    tern__put_le32(r->small + 8, t->base.self_id);
    tern__put_le64(r->small + 12, t->instance);
    r->iov[1] = (struct iovec){r->small, HELLO_LEN};
    r->iovcnt = 2;
    enqueue(c, r);
    *out = c;
    return TERN_OK;
}

static tern_status_t tcp_ep_create(tern_transport_t *tp, uint32_t peer, const void *addr,
                                   size_t len, tern_ep_t **ep_out)
{
    tcp_tp_t *t = to_tcp_tp(tp);
    struct sockaddr_storage ss;
    socklen_t sslen = 0;
    tern_status_t st = parse_address(addr, len, &ss, &sslen);
    if (st != TERN_OK)
        return st;
    uint64_t instance = tern__get_le64((const uint8_t *)addr + 8);
    tcp_ep_t *ep = calloc(1, sizeof(*ep));
    if (ep == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "tcp: no memory for an endpoint");
    conn_t *c = adoptable(t, peer, instance);
    if (c == NULL && (st = dial(t, peer, &ss, sslen, &c)) != TERN_OK) {
        free(ep);
        return st;
    }
    ep->base.tp = tp;
    ep->base.peer = peer;
    ep->peer_instance = instance;
    ep->conn = c;
    c->ep = ep;
    ep->next = t->eps;
    t->eps = ep;
    /* A connection that claimed this id before the endpoint said which
     * process has it, and is another (hello_refusal): heard no longer. */
    for (conn_t *o = t->conns; o != NULL; o = o->next)
        if (unadopted_from(o, peer) && o->peer_instance != instance) {
            tern_warn("tcp: closed a connection that claimed to be peer %u: the endpoint made "
                      "for that id names another process (another job, or an earlier run)",
                      peer);
            conn_fail(o, TERN_ERR_PROTOCOL);
        }
    *ep_out = &ep->base;
    return TERN_OK;
}

/* Say goodbye on c without blocking: a peer that sees BYE before EOF knows the
 * close was meant and raises no error. */
static void send_bye(conn_t *c)
{
    uint8_t hdr[HDR_SIZE];
    frame_t f = {.type = F_BYE};
    /* Mid-frame a BYE would corrupt the stream. A plugged winner has
     * written nothing yet (it was an incoming connection, silent until the
     * peer's HELLO plugged it): its BYE may go ahead of its queue. */
    if (c->state != C_OPEN || (c->tx_head != NULL && !c->plugged))
        return;
    frame_encode(&f, hdr);
    if (send(c->fd, hdr, HDR_SIZE, MSG_NOSIGNAL | MSG_DONTWAIT) != HDR_SIZE)
        tern_debug("tcp: could not say goodbye to peer %u", c->peer);
}

/*
 * Operations in flight complete with TERN_ERR_CANCELED before this returns.
 * Their callbacks, and event callbacks, may destroy endpoints, this one
 * included (a second destroy of it is a no-op). Inside progress the
 * connection is only failed and detached here: the frame handling that ran
 * the callback still holds it, and the end of the progress call frees it.
 */
static void tcp_ep_destroy(tern_ep_t *base)
{
    tcp_ep_t *ep = to_tcp_ep(base), **pp;
    tcp_tp_t *t = to_tcp_tp(base->tp);
    conn_t *c = ep->conn, **cp;

    if (ep->destroying)
        return;
    ep->destroying = true;
    for (pp = &t->eps; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == ep) {
            *pp = ep->next;
            break;
        }
    }
    /* Goodbye first: failing a switch's retired connection below fails
     * its plugged winner too, and the peer would hear a loss. */
    send_bye(c);
    /* The losing connection of a crossed connect may still carry this
     * endpoint's earlier gets and puts (it is retired, not yet drained):
     * they are canceled too, not answered into freed buffers later. */
    for (conn_t *o = t->conns; o != NULL; o = o->next) {
        if (o->successor == c) {
            send_bye(o); /* or its end of o hears a loss */
            conn_fail(o, TERN_ERR_CANCELED);
        }
    }
    if (t->in_progress > 0) {
        conn_fail(c, TERN_ERR_CANCELED);
        c->ep = NULL; /* conn_reap frees it */
    } else {
        for (cp = &t->conns; *cp != NULL; cp = &(*cp)->next) {
            if (*cp == c) {
                *cp = c->next;
                break;
            }
        }
        conn_free(c); /* fails what is in flight with TERN_ERR_CANCELED */
        conn_reap(t);
    }
    drain_done(t);
    free(ep);
}

/* ---- operations ---- */

static tern_status_t ep_usable(tcp_ep_t *ep)
{
    if (ep->failed != TERN_OK)
        return tern__error(ep->failed, "tcp: the connection to peer %u is gone (%s)", ep->base.peer,
                           tern_strerror(ep->failed));
    return TERN_OK;
}

static tern_status_t tcp_send(tern_ep_t *base, uint32_t imm, const void *buf, size_t len,
                              const tern_op_params_t *params)
{
    tcp_ep_t *ep = to_tcp_ep(base);
    tern_status_t st = ep_usable(ep);
    if (st != TERN_OK)
        return st;
    frame_t f = {.type = F_SEND, .imm = imm, .payload = len};
    return post(ep->conn, &f, buf, len, params, NULL);
}

static tern_status_t tcp_put(tern_ep_t *base, const void *buf, size_t len, uint64_t raddr,
                             tern_rkey_t *rkey, const tern_op_params_t *params)
{
    tcp_ep_t *ep = to_tcp_ep(base);
    tern_status_t st = ep_usable(ep);
    if (st != TERN_OK)
        return st;
    tcp_tp_t *t = to_tcp_tp(base->tp);
    frame_t f = {.type = F_PUT, .op_id = t->next_op++, .key = to_tcp_rkey(rkey)->key,
                 .raddr = raddr, .size = len, .payload = len};
    if (params->field_mask & TERN_OP_PARAM_IMM) {
        f.flags |= FLAG_IMM;
        f.imm = params->imm;
    }
    return post(ep->conn, &f, buf, len, params, NULL);
}

static tern_status_t tcp_get(tern_ep_t *base, void *buf, size_t len, uint64_t raddr,
                             tern_rkey_t *rkey, const tern_op_params_t *params)
{
    tcp_ep_t *ep = to_tcp_ep(base);
    tern_status_t st = ep_usable(ep);
    if (st != TERN_OK)
        return st;
    tcp_tp_t *t = to_tcp_tp(base->tp);
    frame_t f = {.type = F_GET, .op_id = t->next_op++, .key = to_tcp_rkey(rkey)->key,
                 .raddr = raddr, .size = len};
    return post(ep->conn, &f, NULL, 0, params, buf);
}

/* ---- registration ---- */

static tern_status_t tcp_mr_reg(tern_transport_t *tp, void *addr, size_t len,
                                const tern_mr_params_t *params, tern_mr_t **mr_out)
{
    tcp_tp_t *t = to_tcp_tp(tp);
    (void)addr;
    (void)len;
    if (params->mem_type != TERN_MEM_HOST)
        return tern__error(TERN_ERR_UNSUPPORTED,
                           "tcp: CUDA memory is staged by the layers above; register host memory");
    tcp_mr_t *mr = calloc(1, sizeof(*mr));
    if (mr == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "tcp: no memory for a registration");
    /* Keys never repeat within a transport, so a revoked key stays revoked. */
    mr->key = t->next_key++;
    tern__hash_oom = false;
    HASH_ADD(hh, t->keys, key, sizeof(mr->key), mr);
    if (tern__hash_oom) {
        free(mr);
        return tern__error(TERN_ERR_NO_MEMORY, "tcp: no memory to index a registration");
    }
    *mr_out = &mr->base;
    return TERN_OK;
}

/*
 * Replies to peers' gets that still read mr, whose owner may free it once
 * tern_mr_dereg returns. One not yet started becomes a refusal: the getter
 * hears TERN_ERR_ACCESS, as a get posted after the dereg would. One under way
 * has promised its bytes in a header already sent: what it has yet to hand
 * the socket is copied now, so the region is not read after the dereg. (With
 * TERN_TCP_ZCOPY what splice already handed the kernel, in the pipe and the
 * socket's buffer, is the region's pages by reference: docs/transport.md.) A
 * copy that cannot be made fails the connection.
 */
static void revoke_replies(tcp_tp_t *t, tcp_mr_t *mr)
{
    for (conn_t *c = t->conns; c != NULL && mr->pins > 0; c = c->next) {
        for (txreq_t *r = c->tx_head; r != NULL; r = r->next) {
            if (r->type != F_GET_DATA || r->pin != mr)
                continue;
            if (r->iov[0].iov_len == HDR_SIZE) {
                frame_t f;
                frame_decode(r->hdr, &f);
                f.status = TERN_ERR_ACCESS;
                f.size = f.payload = 0;
                frame_encode(&f, r->hdr);
                r->iovcnt = 1;
                r->zcopy = false;
            } else if (r->iovcnt > 1 && r->iov[1].iov_len > 0) {
                r->copy = malloc(r->iov[1].iov_len);
                if (r->copy == NULL) {
                    tern_warn("tcp: no memory to finish a reply from an unregistered region; "
                              "closing the connection to peer %u",
                              c->peer);
                    conn_fail(c, TERN_ERR_NO_MEMORY);
                    break; /* its queue is gone, and with it the pins */
                }
                memcpy(r->copy, r->iov[1].iov_base, r->iov[1].iov_len);
                r->iov[1].iov_base = r->copy;
            }
            r->pin = NULL;
            mr_unpin(t, mr);
        }
    }
}

static void tcp_mr_dereg(tern_mr_t *base)
{
    tcp_mr_t *mr = to_tcp_mr(base);
    tcp_tp_t *t = to_tcp_tp(base->tp);
    HASH_DEL(t->keys, mr);
    revoke_replies(t, mr);
    if (mr->pins > 0)
        mr->revoked = true; /* a GET_DATA still reads it: freed at the last unpin */
    else
        free(mr);
}

/* key: magic u32 | access u32 | key u64 | addr u64 | len u64, little-endian */
static tern_status_t tcp_mr_pack(const tern_mr_t *base, void *buf, size_t *len)
{
    const tcp_mr_t *mr = (const tcp_mr_t *)base;
    uint8_t *p = buf;
    if (*len < KEY_SIZE) {
        *len = KEY_SIZE;
        return tern__error(TERN_ERR_TRUNCATED, "tcp: a key needs %d bytes", KEY_SIZE);
    }
    tern__put_le32(p, KEY_MAGIC);
    tern__put_le32(p + 4, base->access);
    tern__put_le64(p + 8, mr->key);
    tern__put_le64(p + 16, (uintptr_t)base->addr);
    tern__put_le64(p + 24, base->len);
    *len = KEY_SIZE;
    return TERN_OK;
}

static tern_status_t tcp_rkey_unpack(tern_ep_t *ep, const void *buf, size_t len,
                                     tern_rkey_t **rkey_out)
{
    const uint8_t *p = buf;
    if (len != KEY_SIZE)
        return tern__error(TERN_ERR_INVALID_PARAM, "tcp: a key is %d bytes, not %zu", KEY_SIZE, len);
    if (tern__get_le32(p) != KEY_MAGIC)
        return tern__error(TERN_ERR_INVALID_PARAM, "tcp: not a tcp provider key");
    tcp_rkey_t *rk = calloc(1, sizeof(*rk));
    if (rk == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "tcp: no memory for a key");
    rk->base.ep = ep;
    rk->base.addr = tern__get_le64(p + 16);
    rk->base.len = (size_t)tern__get_le64(p + 24);
    rk->key = tern__get_le64(p + 8);
    *rkey_out = &rk->base;
    return TERN_OK;
}

static void tcp_rkey_release(tern_rkey_t *rkey)
{
    free(rkey);
}

const tern__tp_ops_t tern__tcp_ops = {
    .name = "tcp",
    .open = tcp_open,
    .close = tcp_close,
    .address = tcp_address,
    .progress = tcp_progress,
    .fd = tcp_fd,
    .arm = tcp_arm,
    .ep_create = tcp_ep_create,
    .ep_destroy = tcp_ep_destroy,
    .send = tcp_send,
    .put = tcp_put,
    .get = tcp_get,
    .mr_reg = tcp_mr_reg,
    .mr_dereg = tcp_mr_dereg,
    .mr_pack = tcp_mr_pack,
    .rkey_unpack = tcp_rkey_unpack,
    .rkey_release = tcp_rkey_release,
};
