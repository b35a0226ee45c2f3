/*
 * The "ucx" provider: tern's transport over UCP (UCX's protocol layer), so that
 * whatever fabric UCX drives (InfiniBand, RoCE, shared memory, TCP) carries
 * tern's sends, puts and gets. docs/transport-ucx.md is the long form.
 *
 *   open      ucp_config_read (UCX_* variables, notably UCX_TLS, are honoured),
 *             ucp_init with AM + RMA (+ WAKEUP unless busy-polling), one worker
 *             in UCS_THREAD_MODE_SERIALIZED: tern serializes every call, but not
 *             always on the thread that opened the transport (p2p opens it,
 *             then its progress thread drives it), which SINGLE would forbid.
 *   address   a tern header (magic, version, self_id, checksum) + the worker address
 *   ep        ucp_ep_create with UCP_ERR_HANDLING_MODE_PEER where the transports
 *             can detect peer failure, UCP_ERR_HANDLING_MODE_NONE where they
 *             cannot (shared memory in UCX 1.13)
 *   send      ucp_am_send_nbx on one AM id; the AM header carries the sender's
 *             self_id, the immediate, and a per-endpoint sequence number (a
 *             small payload rides after it in the AM's data: am_post)
 *   put       ucp_put_nbx + ucp_ep_flush_nbx: a put completes once the data is
 *             at the target, as an RC write completes once acknowledged; over
 *             UCX's tcp, MSG_PUT chunks the target's tern checks, places and
 *             acknowledges (serve_put)
 *   put+imm   the above, then a notify AM: the target raises TERN_EVENT_PUT_IMM
 *             only after the data is in place; the endpoint's later AMs wait
 *             for the notify's seq (ep_release), so events keep posting order
 *   get       ucp_get_nbx; over UCX's tcp, which would emulate it, a MSG_GET
 *             that the target's tern answers (serve_get)
 *             (a peer process on this host, TERN_UCX_CMA bytes and more:
 *             process_vm_readv/writev for get and put, one copy; see cma_copy)
 *   mr        ucp_mem_map of the caller's range + ucp_rkey_pack behind a tern header
 *             (base, length, access, registration id, checksum)
 *
 * UCP checks neither bounds nor access of a remote key, so the initiator checks
 * them from the key's header before issuing; a refusal fails the operation
 * with TERN_ERR_ACCESS and a small AM tells the target, which raises
 * TERN_EVENT_ERROR. A key its owner has since unregistered cannot be checked
 * by anyone (see ucx_put).
 *
 * Ordering. Every AM carries (sender conn id, seq). The receiver keeps one
 * stream per (src, conn) and delivers its events strictly in seq order, so a
 * message that arrives by rendezvous (received with ucp_am_recv_data_nbx into
 * a buffer) holds back later ones from the same endpoint until it has landed,
 * and UCX's own ordering (which is not promised for multi-fragment AMs) does
 * not matter.
 *
 * Callbacks. Nothing user-visible runs inside a UCX callback: UCX callbacks
 * only record (an op's request finished, a message arrived, an endpoint
 * failed), and ucx_progress() delivers completions and events after
 * ucp_worker_progress() returns. The internal progress done while an endpoint
 * or the transport is being torn down (bounded waits) therefore never runs a
 * user callback other than the CANCELED completions the teardown promises.
 *
 * Teardown. Destroying an endpoint sends a BYE listing the sequence numbers
 * it is canceling (an AM, or on the notice channel below), then closes the UCP
 * endpoint (force with PEER error handling, flush without), waiting a bounded
 * time for UCX to let go of the operations' buffers; the operations in flight
 * complete with TERN_ERR_CANCELED, before the endpoint is freed (a callback
 * may destroy it again: a no-op). The peer drops the canceled messages and
 * reports TERN_ERR_PEER_LOST for its endpoint to us; on the notice channel it
 * answers with where its delivery stopped, and the sender completes what the
 * peer had delivered as sent: a send completed as canceled is never
 * delivered. An op UCX still holds outlives its completion (op_detach).
 *
 * Peer failure. With UCP_ERR_HANDLING_MODE_PEER, UCX reports it (ep_err_cb).
 * Shared memory in UCX 1.13 cannot, so those endpoints (peers on this host)
 * also hold a "notice channel": a unix socket to the peer's listener, which
 * carries the BYE and whose hang-up means the peer's transport or process is
 * gone.
 */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <ucp/api/ucp.h>
#include <ucs/debug/log_def.h>

#include <tern/build_config.h>
#include <tern/clock.h>

#include "core/bytes.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/hash.h"
#include "core/log.h"
#include "transport/provider.h"
#include "transport/ucx/seq.h"

/* ---- limits and wire constants ---- */

#define AM_ID 0x7e /* the one UCP AM id tern uses on its own worker */

/* Largest send. UCP itself switches to rendezvous well below this (tens of KiB
 * on tcp and shared memory), so a send this size is already zero-copy at the
 * sender; above it the layers above use put/get rendezvous of their own. */
#define MAX_SEND ((size_t)1 << 20)
/* attr.eager_size. On shared memory a rendezvous's get is one copy (CMA, or
 * the target's through the FIFO) where an eager message is copied through
 * the FIFO at both ends: 48 KiB eager took longer than 16 KiB and rendezvous
 * above it, in latency and in bandwidth (docs/p2p.md, "The eager limit").
 * Over UCX's tcp a larger size shortens mid-size latency, but one provider
 * may reach peers both ways. */
#define UCX_EAGER_SIZE (16u << 10)
/* UCP puts no limit on a put or get; this cap only keeps offset arithmetic far
 * from overflow. */
#define MAX_PUT ((size_t)1 << 40)

#define WIRE_VERSION 8 /* 3: BYE and notice datagrams list canceled seqs as ranges; 4: served
                          gets; 5: served puts; 6: a get reply's status trailer; 7: replies
                          in pieces (MSGF_FRAG); 8: a key's access word may carry
                          TERN_ACCESS_REMOTE_READ_HELD */
#define ADDR_MAGIC 0x58435554u /* "TUCX" little-endian */
#define RKEY_MAGIC 0x4b435554u /* "TUCK" */
#define ADDR_HDR_LEN 40u
#define ADDR_F_NOTICE 1u /* the address names a notice listener (pid, key) */
#define RKEY_HDR_LEN 40u
#define RKEY_F_HOST (1u << 16) /* in the key's access word: the region is host memory */
#define MSG_HDR_LEN 32u
/* A MSG_GET's or MSG_PUT's header: the message header, then u64 raddr, u32
 * registration id, u32 the put's immediate (0 for a get). */
#define GET_HDR_LEN 48u
/* The short header of a tern_ep_send_inline (ucx_send_inline): a send with
 * no flags, its seq cut to 24 bits and no len (the AM's length gives it).
 * UCX's shared-memory FIFO element holds 28 bytes of its own and UCP's AM 8
 * before our bytes, so a 64-byte cache line has room for 28 of them: a small
 * message that fits there crosses between the cores as one line, not two
 * (docs/perf.md, "tenth look"). The receiver extends the seq from its stream's
 * next one, which is right while fewer than 2^23 messages of one stream are
 * out of order there. */
#define SHORT_HDR_LEN 16u
#define WIRE_SHORT (0x80u | WIRE_VERSION)
_Static_assert(SHORT_HDR_LEN <= TERN_INLINE_PREFIX_MAX, "the header is the inline sends' prefix");
/* A message whose payload is at most this travels as one contiguous AM
 * payload, header first, instead of header and payload apart (am_post). */
#define MSG_INLINE 224u

/* Bounded waits of teardown: never hang on a peer that does not answer. */
#define BYE_WAIT_NS (250ull * 1000 * 1000)
#define CLOSE_WAIT_NS (1000ull * 1000 * 1000)
#define ORPHAN_WAIT_NS (250ull * 1000 * 1000)
/* Progress calls in a row with nothing done: UCX's worker has no local work left. */
#define CLOSE_IDLE_POLLS 1000u
/* How long a closing transport waits for the HELLO of a notice channel it
 * accepts (or accepted) without one (notice_gone). */
#define HELLO_WAIT_NS (20ull * 1000 * 1000)

/* Look at the notice sockets at least this often, by the coarse clock: a
 * precise read on every progress call cost a quarter of a small message's
 * round trip on shared memory. */
#define NOTICE_POLL_NS (1000ull * 1000)
#define NOTICE_HDR_LEN 20u
/* Canceled seqs travel as ranges (u32 first, u32 count): the sends a
 * teardown cancels are mostly one run. A datagram holds this many; a longer
 * list goes in several (NOTICE_CANCEL, then the BYE), never cut short. */
#define NOTICE_MAX_RANGES 2048u
#define RANGE_LEN 8u
#define PROGRESS_ROUNDS 16    /* ucp_worker_progress rounds per tern progress call at most */
#define OP_CACHE_MAX 256
/* Received entries are recycled too, and small payloads are copied into the
 * entry: malloc and free cost as much as the rest of a small message's
 * delivery on shared memory. */
#define ENTRY_CACHE_MAX 256
#define ENTRY_INLINE 256
/* The fast lane (see am_cb): small sends that arrive in order, delivered by
 * the same progress call without an entry in their stream. */
#define FAST_SLOTS 32
#define FAST_INLINE 192

enum msg_type {
    MSG_SEND = 1,    /* a tern_ep_send: payload = the data */
    MSG_PUT_IMM = 2, /* a put with immediate landed: len = its bytes */
    MSG_ACCESS = 3,  /* the sender refused a put/get on our region: imm, len */
    MSG_BYE = 4,     /* the sender destroyed its endpoint: payload = canceled seq ranges */
    /* Served gets (see serve_get), outside the streams (no seq): */
    MSG_GET = 5,       /* read len bytes at raddr of registration reg_id; imm = token */
    MSG_GET_REPLY = 6, /* imm = the get's token, u32 at 20 = tern status (a refusal: no
                          payload); else payload = the bytes, then a u32 status trailer
                          (REPLY_TRAILER_LEN: TERN_ERR_ACCESS when the region went while
                          the reply was read, its bytes from then on zeros). With
                          MSGF_FRAG one piece: len its bytes, u64 at 8 their offset */
    /* Served puts (see serve_put), likewise: */
    MSG_PUT = 7,     /* write the payload at raddr of registration reg_id; imm = token;
                        MSGF_IMM: the put carries an immediate (u32 at 44) */
    MSG_PUT_ACK = 8, /* imm = the put's token, u32 at 20 = tern status, len = the chunk's bytes */
};

/* Datagrams on a notice channel: u8 type, u8 version, u16 0, u32 src, u32 conn,
 * u32 seq, u32 n, then n canceled seq ranges (u32 first, u32 count). */
enum notice_type {
    NOTICE_HELLO = 1,  /* first on a channel: which peer endpoint it belongs to */
    NOTICE_BYE = 2,    /* the endpoint is destroyed; its next seq and canceled ranges */
    NOTICE_CANCEL = 3, /* more canceled ranges, ahead of the BYE */
    NOTICE_GONE = 5,   /* the other way, as the listener's transport closes on purpose;
                          seq = GONE_PARKED when its UCX worker is left in place */
    NOTICE_ACK = 4,    /* the other way, answering a BYE: seq = the first seq not
                          delivered when its cancels took effect */
};

/* A NOTICE_GONE's seq: the closing transport parked its UCX worker (ucx_close),
 * so nothing queued for it will ever be read. */
#define GONE_PARKED 1u

enum msg_flag {
    MSGF_IMM = 1u << 0, /* MSG_ACCESS, MSG_PUT: the put carries an immediate */
    MSGF_GET = 1u << 1, /* MSG_ACCESS: the refused operation was a get */
    MSGF_FRAG = 1u << 2, /* MSG_GET: answer in pieces of SHM_FRAG; MSG_GET_REPLY: a piece */
};

/* ---- little helpers ---- */

typedef struct link {
    struct link *prev, *next;
} link_t;

#define link_entry(ptr, type, member) ((type *)(void *)((char *)(ptr)-offsetof(type, member)))

static void link_init(link_t *l)
{
    l->prev = l->next = l;
}

static bool link_empty(const link_t *head)
{
    return head->next == head;
}

static void link_add_tail(link_t *head, link_t *l)
{
    l->prev = head->prev;
    l->next = head;
    head->prev->next = l;
    head->prev = l;
}

static void link_add_before(link_t *at, link_t *l)
{
    link_add_tail(at, l);
}

/* Safe on an unlinked (self-linked) node. */
static void link_del(link_t *l)
{
    l->prev->next = l->next;
    l->next->prev = l->prev;
    l->prev = l->next = l;
}

/* The address blob:
 *   0 u32 magic  4 u16 version  6 u16 header length (40)  8 u32 self_id
 *  12 u32 UCX address length  16 u32 checksum  20 u32 flags (ADDR_F_NOTICE)
 *  24 u32 pid  28 u32 0  32 u64 notice key  40.. the UCX worker address
 * The checksum (FNV-1a) covers everything but itself: it catches a blob
 * damaged on its way through the store before UCX, which does not validate
 * what it unpacks, ever sees it. */
static uint32_t addr_checksum(const uint8_t *a, size_t ulen)
{
    uint32_t h = tern__fnv1a(TERN__FNV_SEED, a, 16);
    h = tern__fnv1a(h, a + 20, 20);
    return tern__fnv1a(h, a + 40, ulen);
}

/* seq a comes before seq b, modulo 2^32. */
static bool seq_before(uint32_t a, uint32_t b)
{
    return (int32_t)(a - b) < 0;
}

/* ---- objects ---- */

typedef struct ucx_tp ucx_tp_t;
typedef struct ucx_ep ucx_ep_t;

enum op_kind { OP_SEND, OP_PUT, OP_PUT_IMM, OP_GET, OP_CTRL };

/* What an event on the transport's epoll fd points at. */
typedef struct watch {
    enum { WATCH_UCX, WATCH_LISTENER, WATCH_CONN, WATCH_EP, WATCH_TIMER } kind;
} watch_t;

/*
 * One posted operation. Lives from post to completion: on its endpoint's ops
 * list, and on the transport's done queue once all its UCX requests have
 * finished (pending == 0) until progress completes it. An op given up on
 * (canceled or failed by teardown or peer loss) while UCX still holds a
 * request of it is completed for the user but not freed: UCX may still read
 * its header and the small payload copied after it (a send queued behind a
 * full FIFO is packed only when it goes out). It waits on tp->detached until
 * UCX calls back for its last request, or until the worker is gone (tp_fini).
 */
typedef struct ucx_op {
    link_t link;  /* ep->ops */
    link_t dlink; /* tp->done */
    ucx_tp_t *tp;
    ucx_ep_t *ep;
    tern__comp_t comp;
    enum op_kind kind;
    unsigned pending;     /* UCX requests outstanding (+1 while posting) */
    void *reqs[2];        /* those requests (put + flush at most) */
    ucs_status_t ustatus; /* the first error a request finished with */
    tern_status_t fail;   /* a status decided by tern (overrides ustatus) */
    bool in_done, canceled, has_seq;
    bool detached; /* completed for the user; on tp->detached until UCX lets go */
    bool listed;   /* teardown: its seq is in the BYE's cancel list */
    bool sent;     /* teardown: the peer has it, or will: it completes as sent */
    /* Ordering behind a put with immediate (ep_release): */
    bool blocking;     /* OP_PUT_IMM whose notify has not taken its seq yet */
    bool notify_ready; /* blocking, its flush done: the notify waits for an earlier one */
    bool held;         /* an AM not posted yet: a blocking op is ahead of it */
    ucs_memory_type_t hold_mt;
    const void *hold_buf; /* held: its payload (in hdr when small, else the caller's) */
    size_t hold_len;
    int stage;    /* OP_PUT_IMM: 0 put + flush, 1 notify */
    uint32_t seq; /* the AM's sequence number when has_seq */
    uint32_t imm;
    uint64_t len;
    /* A served get or put (served_takes): */
    bool awaiting;     /* in tp->awaited: its replies have not all arrived (not UCX requests) */
    bool recv_cb_ran;  /* the reply's rendezvous receive called back */
    uint32_t token;    /* names it in the replies */
    unsigned acks_due; /* a served put: its chunks not acknowledged yet */
    unsigned nx;       /* a served put: its chunks, whose sends are xreqs, headers xhdrs */
    void **xreqs;      /* one block with xhdrs, freed with the op */
    uint8_t *xhdrs;
    void *lbuf;          /* where the reply goes */
    uint64_t got;        /* a get answered in pieces (MSGF_FRAG): the bytes in so far */
    ucp_dt_iov_t riov[2]; /* a rendezvous reply's receive: lbuf, then rtrailer */
    uint8_t rtrailer[4];
    UT_hash_handle hh;   /* tp->awaited, by token */
    void *payload; /* owned AM payload (BYE) */
    struct ucx_op *cache_next;
    /* The AM header, and after it a small payload's copy: both must outlive
     * the send. Not zeroed by op_new. */
    uint8_t hdr[MSG_HDR_LEN + MSG_INLINE];
} ucx_op_t;

struct ucx_ep {
    tern_ep_t base;
    ucx_tp_t *tp;
    ucp_ep_h uep;       /* NULL once closed (or being closed) */
    void *close_req;    /* the close request while it runs */
    struct ucx_op *bye; /* the BYE while teardown waits for it */
    link_t link;        /* tp->eps, or tp->zombie_eps */
    link_t lost_link;   /* tp->lost while the loss waits to be handled, then tp->linger */
    link_t ops;         /* ucx_op_t in post order */
    link_t rkeys;       /* ucx_rkey_t unpacked on it */
    uint32_t conn;      /* names this endpoint's stream at the peer */
    uint32_t tx_seq;    /* next AM sequence number */
    unsigned nblock;    /* puts with immediate whose notify has not taken its seq (op->blocking) */
    bool peer_mode;     /* UCP_ERR_HANDLING_MODE_PEER: force close is allowed */
    bool lost, destroying, zombie;
    bool bye_notice;       /* teardown: the BYE went by the notice channel */
    bool ack_wait, acked;  /* teardown: our BYE listed cancels; the peer's answer came */
    uint32_t ack_seq;      /* acked: the peer delivered our seqs before this one, no later */
    uint64_t linger_until; /* lost: its puts/gets may finish until then */
    int nfd;               /* our notice channel to the peer's listener, or -1 */
    ucp_rkey_h *zukeys;    /* a zombie's UCX keys, destroyed when its close is done */
    size_t nzukeys;
    watch_t nwatch;
    pid_t cma_pid; /* the peer process, for puts and gets by cma_copy; 0: through UCX */
    ucs_status_t lost_status;
    bool peer_closed; /* lost because the peer closed on purpose (its BYE): TERN_ERR_CLOSED */
};

/* A UCX map kept after its registration went ("Keeping maps", at ucx_mr_reg). */
typedef struct memh_slot {
    void *addr;
    size_t len;
    unsigned prot;
    ucp_mem_h memh; /* NULL: a free slot */
    void *rkey_buf;
    size_t rkey_len;
    unsigned refs;  /* registrations using it now */
    uint64_t used;  /* tp->memh_tick at its last release: the oldest idle one goes first */
} memh_slot_t;

#define MEMH_SLOTS 16

typedef struct ucx_mr {
    tern_mr_t base;
    ucp_mem_h memh; /* NULL for an empty region */
    void *rkey_buf; /* ucp_rkey_pack's, NULL for an empty region */
    size_t rkey_len;
    memh_slot_t *slot; /* memh and rkey_buf belong to this kept map, not to the registration */
    uint32_t id;
    ucx_tp_t *tp;
    UT_hash_handle hh; /* tp->mr_by_id */
    link_t replies;    /* get_reply_t still reading the region (served gets) */
} ucx_mr_t;

typedef struct ucx_rkey {
    tern_rkey_t base;
    ucp_rkey_h ukey; /* NULL for an empty region */
    unsigned access;
    bool host; /* the region is host memory: cma_copy may reach it */
    uint32_t reg_id;
    link_t link; /* ep->rkeys */
} ucx_rkey_t;

typedef struct ucx_stream ucx_stream_t;

/* One arrived message, waiting for its turn in its stream. */
typedef struct ucx_entry {
    link_t link; /* stream->entries (sorted by seq), or tp->orphan_entries */
    ucx_stream_t *stream;
    ucx_tp_t *tp;
    uint8_t type;
    uint16_t flags;
    bool ready;   /* complete: can be delivered when its turn comes */
    bool dropped; /* deliver nothing (canceled by the sender, failed) */
    bool in_stream;
    uint32_t seq, src, imm;
    uint64_t len;
    tern_status_t status; /* a TERN_EVENT_ERROR to raise in its place, or TERN_OK */
    void *data;           /* the payload */
    void *desc;           /* a UCX descriptor held (ucp_am_data_release) */
    void *buf;            /* malloc'd: a rendezvous target or a copy */
    void *req;            /* the rendezvous receive while it runs */
    struct ucx_entry *cache_next;
    uint8_t small[ENTRY_INLINE]; /* a small payload's copy: no malloc */
} ucx_entry_t;

/* An in-order small send waiting in the fast lane for the end of
 * ucp_worker_progress. */
typedef struct fast_msg {
    uint32_t src, imm, len;
    uint8_t data[FAST_INLINE];
} fast_msg_t;

/* A peer endpoint's notice channel to us, accepted on our listener. */
typedef struct notice_conn {
    watch_t watch;
    link_t link; /* tp->notice_conns */
    int fd;
    uint32_t src, conn;
    bool hello, bye;
} notice_conn_t;

/* The messages of one peer endpoint to us, delivered in its seq order. */
struct ucx_stream {
    ucx_stream_t *hnext;
    link_t entries;
    link_t dirty_link; /* tp->dirty when it may have something to deliver */
    uint32_t src, conn, expected;
    uint32_t *canceled; /* seq ranges the peer's BYE listed: first, count pairs */
    size_t ncanceled;   /* ranges */
    bool closed; /* ended (BYE delivered, or dead): later arrivals are stale */
    bool dead;   /* its notice channel hung up without a BYE: nothing more will come */
    bool bye;    /* its BYE arrived: the peer closed its endpoint on purpose */
};

struct ucx_tp {
    tern_transport_t base;
    ucp_context_h ctx;
    ucp_worker_h worker;
    int efd;  /* UCX's wakeup fd, or -1 when busy-polling */
    int epfd; /* epoll over efd and the notice sockets: what tern_transport_fd gives */
    int lfd;  /* the notice listener, or -1 */
    int tfd;  /* a timerfd in epfd: wakes a sleeper when a lost peer's linger ends, or -1 */
    watch_t ucx_watch, lwatch, twatch;
    link_t notice_conns;
    uint64_t notice_key, notice_next;
    bool notice_due;  /* look at the notice sockets on the next progress */
    bool timer_set;   /* tfd is armed (linger_timer_arm) */
    bool closing;     /* ucx_close has freed the streams: arrivals are dropped */
    bool peer_mode;   /* try UCP_ERR_HANDLING_MODE_PEER (cleared once it fails) */
    bool in_progress; /* ucx_progress is running (a callback must not re-enter it) */
    bool peer_unread; /* a peer will never read what UCX queued for it: it parked its
                         worker (NOTICE_GONE) or died (a notice channel hung up unannounced) */
    size_t cma_min;   /* TERN_UCX_CMA: puts and gets this large to same-host peers by cma_copy */
    uint8_t *addr;
    size_t addr_len;
    link_t eps, zombie_eps, lost, linger, done, orphan_entries, dirty;
    link_t detached; /* ucx_op_t completed for the user whose requests UCX still holds */
    ucx_stream_t **buckets;
    size_t nbuckets, nstreams;
    ucx_stream_t *last_stream; /* the one found last: most arrivals come from it again */
    ucx_op_t *op_cache;
    unsigned nop_cache;
    struct ucx_entry *entry_cache;
    unsigned nentry_cache;
    uint32_t conn_nonce, next_conn, next_reg_id;
    bool served_rma; /* UCX would emulate RMA here: tern serves it (served_takes) */
    bool memh_keep;  /* and no transport pins what it maps: maps may be kept (ucx_mr_reg) */
    memh_slot_t memh_slots[MEMH_SLOTS];
    uint64_t memh_tick;
    uint32_t next_token;
    struct ucx_op *awaited;  /* served gets and puts awaiting replies, by token */
    struct ucx_mr *mr_by_id; /* our registrations, for the gets we serve */
    ucp_datatype_t reply_dt; /* a served get's reply payload, read as it goes (reply_pack) */
    bool has_reply_dt;
    int hello_errno; /* tests: the next notice HELLO fails with it (tern__ucx_fail_next_hello) */
    link_t refusals;         /* gets and puts we refused, raised as events by drain */
    uint32_t refused_src, refused_token; /* the put refused last: its chunks raise one event */
    bool refused_any;
    uint64_t rndv_recvs;
    unsigned fast_head, nfast;
    fast_msg_t fast[FAST_SLOTS];
};

static ucx_tp_t *to_ucx_tp(const tern_transport_t *tp)
{
    return (ucx_tp_t *)(void *)tp;
}

static ucx_ep_t *to_ucx_ep(tern_ep_t *ep)
{
    return (ucx_ep_t *)(void *)ep;
}

static ucx_mr_t *to_ucx_mr(const tern_mr_t *mr)
{
    return (ucx_mr_t *)(void *)mr;
}

static ucx_rkey_t *to_ucx_rkey(tern_rkey_t *rkey)
{
    return (ucx_rkey_t *)(void *)rkey;
}

/* Tests only: how many sends this transport received by rendezvous. */
uint64_t tern__ucx_rndv_count(const tern_transport_t *tp);

uint64_t tern__ucx_rndv_count(const tern_transport_t *tp)
{
    return to_ucx_tp(tp)->rndv_recvs;
}

/* Tests only: whether closing tp will park its UCX worker (ucx_close). */
int tern__ucx_parks_at_close(tern_transport_t *tp);

int tern__ucx_parks_at_close(tern_transport_t *tp)
{
    return to_ucx_tp(tp)->peer_unread || !link_empty(&to_ucx_tp(tp)->zombie_eps);
}

/* Whether a host-memory put or get of len bytes on ep goes by cma_copy. */
static bool cma_takes(const ucx_ep_t *ep, size_t len)
{
    return ep->cma_pid > 0 && len >= ep->tp->cma_min;
}

/* Tests only: whether host-memory gets and puts of len bytes on this
 * endpoint are served by the target's tern (serve_get, serve_put), not left
 * to UCX or copied by cma_copy. */
int tern__ucx_serves_rma(tern_ep_t *ep, size_t len);

int tern__ucx_serves_rma(tern_ep_t *ep, size_t len)
{
    const ucx_ep_t *uep = to_ucx_ep(ep);

    return uep->tp->served_rma && !cma_takes(uep, len);
}

/* Tests only: the next notice channel tp opens fails its HELLO with err, as
 * a channel to a peer that went right after the connect does. */
void tern__ucx_fail_next_hello(tern_transport_t *tp, int err);

void tern__ucx_fail_next_hello(tern_transport_t *tp, int err)
{
    to_ucx_tp(tp)->hello_errno = err;
}

/* Tests only: how many UCX maps tp keeps (ucx_mr_reg's "Keeping maps"), and
 * in *in_use how many of them registrations hold now; -1 where it keeps
 * none by design (a transport that pins what it maps). */
int tern__ucx_kept_maps(tern_transport_t *tp, unsigned *in_use);

int tern__ucx_kept_maps(tern_transport_t *btp, unsigned *in_use)
{
    const ucx_tp_t *tp = to_ucx_tp(btp);
    int kept = 0;

    *in_use = 0;
    if (!tp->memh_keep)
        return -1;
    for (unsigned i = 0; i < MEMH_SLOTS; i++) {
        kept += tp->memh_slots[i].memh != NULL;
        *in_use += tp->memh_slots[i].refs > 0;
    }
    return kept;
}

/* ---- status ---- */

/* The one conversion of UCX's status to tern's. */
static tern_status_t status_of(ucs_status_t st)
{
    switch (st) {
    case UCS_OK:
        return TERN_OK;
    case UCS_INPROGRESS:
        return TERN_INPROGRESS;
    case UCS_ERR_NO_MEMORY:
        return TERN_ERR_NO_MEMORY;
    case UCS_ERR_NO_RESOURCE:
    case UCS_ERR_BUSY:
        return TERN_ERR_NO_RESOURCE;
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
    case UCS_ERR_ALREADY_EXISTS:
        return TERN_ERR_INVALID_PARAM;
    case UCS_ERR_NO_MESSAGE:
    case UCS_ERR_NO_ELEM:
        return TERN_ERR_NOT_FOUND;
    case UCS_ERR_NOT_IMPLEMENTED:
    case UCS_ERR_UNSUPPORTED:
        return TERN_ERR_UNSUPPORTED;
    case UCS_ERR_MESSAGE_TRUNCATED:
    case UCS_ERR_BUFFER_TOO_SMALL:
        return TERN_ERR_TRUNCATED;
    case UCS_ERR_CANCELED:
        return TERN_ERR_CANCELED;
    case UCS_ERR_TIMED_OUT:
        return TERN_ERR_TIMEOUT;
    case UCS_ERR_OUT_OF_RANGE:
    case UCS_ERR_EXCEEDS_LIMIT:
        return TERN_ERR_OUT_OF_RANGE;
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_SOME_CONNECTS_FAILED:
        return TERN_ERR_UNREACHABLE;
    case UCS_ERR_REJECTED:
        return TERN_ERR_CONN_REFUSED;
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_CONNECTION_RESET:
        return TERN_ERR_PEER_LOST;
    case UCS_ERR_NO_DEVICE:
        return TERN_ERR_NO_DEVICE;
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_SHMEM_SEGMENT:
    case UCS_ERR_NO_PROGRESS:
        return TERN_ERR_IO;
    default:
        if (UCS_IS_ENDPOINT_ERROR(st))
            return TERN_ERR_PEER_LOST;
        if (UCS_IS_LINK_ERROR(st))
            return TERN_ERR_IO;
        return TERN_ERR_INTERNAL;
    }
}

/* ---- operations: allocation and completion ---- */

/* An op from the cache (or malloc), not yet initialized. */
static ucx_op_t *op_alloc(ucx_tp_t *tp)
{
    ucx_op_t *op = tp->op_cache;

    if (op != NULL) {
        tp->op_cache = op->cache_next;
        tp->nop_cache--;
        return op;
    }
    return malloc(sizeof(*op));
}

/* Give an op back to the cache (or free it); it is on no list. */
static void op_recycle(ucx_tp_t *tp, ucx_op_t *op)
{
    if (tp->nop_cache < OP_CACHE_MAX) {
        op->cache_next = tp->op_cache;
        tp->op_cache = op;
        tp->nop_cache++;
    } else {
        free(op);
    }
}

/* Initialize every field of op but its header (which may be filled already). */
static void op_init(ucx_op_t *op, ucx_tp_t *tp, ucx_ep_t *ep, enum op_kind kind,
                    const tern_op_params_t *params)
{
    memset(op, 0, offsetof(ucx_op_t, hdr));
    op->tp = tp;
    op->ep = ep;
    op->kind = kind;
    op->comp = tern__comp_of(params);
    link_init(&op->link);
    link_init(&op->dlink);
}

static ucx_op_t *op_new(ucx_tp_t *tp, ucx_ep_t *ep, enum op_kind kind,
                        const tern_op_params_t *params)
{
    ucx_op_t *op = op_alloc(tp);

    if (op != NULL)
        op_init(op, tp, ep, kind, params);
    return op;
}

/* A served get or put no longer awaits replies: those that come are dropped. */
static void get_unlist(ucx_op_t *op)
{
    if (op->awaiting)
        HASH_DEL(op->tp->awaited, op);
    op->awaiting = false;
}

/* Unlink op from every list and recycle it. */
static void op_free(ucx_op_t *op)
{
    ucx_tp_t *tp = op->tp;

    get_unlist(op);
    link_del(&op->link);
    link_del(&op->dlink);
    free(op->payload);
    op->payload = NULL;
    free(op->xreqs);
    op->xreqs = NULL;
    op_recycle(tp, op);
}

/* All of an op's UCX requests have finished: queue it for progress. */
static void op_settle(ucx_op_t *op)
{
    op->in_done = true;
    link_add_tail(&op->tp->done, &op->dlink);
}

/* op's last UCX request has finished and no reply is awaited: queue it for
 * progress (once), or free it if its completion ran already. */
static void op_maybe_settle(ucx_op_t *op)
{
    if (op->pending > 0 || op->awaiting || op->in_done)
        return;
    if (op->detached)
        op_free(op); /* its completion ran already: UCX was the last to hold it */
    else
        op_settle(op);
}

/* One of op's UCX requests finished. */
static void op_request_done(ucx_op_t *op, void *request, ucs_status_t status)
{
    ucp_request_free(request);
    for (int i = 0; i < 2; i++)
        if (op->reqs[i] == request)
            op->reqs[i] = NULL;
    for (unsigned i = 0; i < op->nx; i++)
        if (op->xreqs[i] == request)
            op->xreqs[i] = NULL;
    if (status != UCS_OK && op->ustatus == UCS_OK)
        op->ustatus = status;
    if (status != UCS_OK)
        get_unlist(op); /* a get request that failed: no reply will come */
    op->pending--;
    op_maybe_settle(op);
}

/* UCX's callback for every request an op posts (send, put, get, flush). Runs
 * inside ucp_worker_progress (or a close): records only. */
static void op_request_cb(void *request, ucs_status_t status, void *arg)
{
    op_request_done(arg, request, status);
}

static ucp_request_param_t op_param(ucx_op_t *op)
{
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = op_request_cb,
        .user_data = op,
    };
    return p;
}

/* The memory type of an operation's local buffer, from its registration. */
static ucs_memory_type_t mem_type_of(const tern_op_params_t *params)
{
    if (params != NULL && (params->field_mask & TERN_OP_PARAM_MR) && params->mr != NULL &&
        params->mr->mem_type == TERN_MEM_CUDA)
        return UCS_MEMORY_TYPE_CUDA;
    return UCS_MEMORY_TYPE_HOST;
}

/* Account for what a UCX nbx call returned: NULL (done at once), a request
 * (one more pending) or an error (recorded). */
static void op_track(ucx_op_t *op, ucs_status_ptr_t sp)
{
    if (sp == NULL)
        return;
    if (UCS_PTR_IS_ERR(sp)) {
        if (op->ustatus == UCS_OK)
            op->ustatus = UCS_PTR_STATUS(sp);
        return;
    }
    op->reqs[op->reqs[0] == NULL ? 0 : 1] = sp;
    op->pending++;
}

/* Give op up while UCX still holds requests of it: its completion may run,
 * but its memory stays (UCX may still pack its header and inline payload)
 * until op_request_cb sees the last request finish, or tp_fini, once the
 * worker can no longer touch it. */
static void op_detach(ucx_op_t *op)
{
    get_unlist(op);
    link_del(&op->link);
    link_del(&op->dlink);
    op->in_done = false;
    op->detached = true;
    op->ep = NULL;
    link_add_tail(&op->tp->detached, &op->link);
}

/* The status op finishes with. */
static tern_status_t op_status(const ucx_op_t *op)
{
    if (op->canceled)
        return TERN_ERR_CANCELED;
    if (op->fail != TERN_OK)
        return op->fail;
    if (op->ustatus == UCS_OK)
        return TERN_OK;
    if (op->ep != NULL && op->ep->lost)
        return TERN_ERR_PEER_LOST; /* whatever UCX called it (canceled by the purge, reset) */
    return status_of(op->ustatus);
}

/* Write an AM header (the u32 at 20 is 0; a get reply puts its status there). */
static void hdr_fill(uint8_t *h, uint8_t type, uint16_t flags, uint32_t src, uint32_t conn,
                     uint32_t seq, uint32_t imm, uint64_t len)
{
    h[0] = WIRE_VERSION;
    h[1] = type;
    tern__put_le16(h + 2, flags);
    tern__put_le32(h + 4, src);
    tern__put_le32(h + 8, conn);
    tern__put_le32(h + 12, seq);
    tern__put_le32(h + 16, imm);
    tern__put_le32(h + 20, 0);
    tern__put_le64(h + 24, len);
}

/* Write the AM header of a message of type on ep; its sequence number is
 * ep's next one (am_post rewrites it as UCX accepts the message). */
static void hdr_write(uint8_t *h, const ucx_ep_t *ep, uint8_t type, uint16_t flags, uint32_t imm,
                      uint64_t len)
{
    hdr_fill(h, type, flags, ep->tp->base.self_id, ep->conn, ep->tx_seq, imm, len);
}

/* Post op's AM (header already filled, payload buf[0..len)). A message UCX
 * refuses at once takes no sequence number. Returns what UCX returned. */
static ucs_status_ptr_t am_post(ucx_op_t *op, const void *buf, size_t len, uint32_t am_flags,
                                ucs_memory_type_t mem_type)
{
    ucx_ep_t *ep = op->ep;
    ucp_request_param_t p = op_param(op);
    ucs_status_ptr_t sp;

    tern__put_le32(op->hdr + 12, ep->tx_seq);
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    p.memory_type = mem_type;
    if (am_flags != 0) {
        p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = am_flags;
    }
    /* A small host payload goes right after the header, in one buffer with
     * no AM header: UCX then sends it with a plain short AM rather than a
     * gathered one, and the receiver reads one run of bytes. On shared
     * memory that took a fifth off a small message's round trip. */
    if (len <= MSG_INLINE && mem_type == UCS_MEMORY_TYPE_HOST && am_flags == 0) {
        if (len > 0 && buf != op->hdr + MSG_HDR_LEN) /* a held op's copy is there already */
            memcpy(op->hdr + MSG_HDR_LEN, buf, len);
        sp = ucp_am_send_nbx(ep->uep, AM_ID, NULL, 0, op->hdr, MSG_HDR_LEN + len, &p);
    } else {
        sp = ucp_am_send_nbx(ep->uep, AM_ID, op->hdr, MSG_HDR_LEN, buf, len, &p);
    }
    if (!UCS_PTR_IS_ERR(sp)) {
        op->seq = ep->tx_seq++;
        op->has_seq = true;
    }
    return sp;
}

/* Why ops may not be posted on ep (ep_check failed). */
static tern_status_t ep_refusal(const ucx_ep_t *ep, const char *what)
{
    if (ep->destroying)
        return tern__error(TERN_ERR_CANCELED, "%s: the endpoint to peer %u is being destroyed",
                           what, ep->base.peer);
    if (ep->peer_closed)
        return tern__error(TERN_ERR_PEER_LOST, "%s: peer %u closed its endpoint", what,
                           ep->base.peer);
    return tern__error(TERN_ERR_PEER_LOST, "%s: peer %u is lost (%s)", what, ep->base.peer,
                       ucs_status_string(ep->lost_status));
}

/* Whether ops may be posted on ep now. Inline, the error out of line: it is
 * on every send's path. */
static inline tern_status_t ep_check(const ucx_ep_t *ep, const char *what)
{
    if (ep->destroying || ep->lost || ep->uep == NULL)
        return ep_refusal(ep, what);
    return TERN_OK;
}

/*
 * Puts with immediate and the AMs after them. RC delivers a write with
 * immediate in posting order with the sends around it; here its notify AM
 * can take its seq only once the flush after the put is done. So while a put
 * with immediate on an endpoint has not taken its seq (op->blocking, counted
 * in ep->nblock), later sends and refusal notices are held (ep_hold) instead
 * of posted, and a later put with immediate whose flush finishes first waits
 * with its notify (notify_ready); ep_release posts them in order once the
 * ops ahead have taken their seqs. An endpoint with no put with immediate in
 * flight (nblock 0, the common case) sends at once.
 */

/* Whether ep may still post AMs (not being torn down, not lost). */
static bool ep_live(const ucx_ep_t *ep)
{
    return ep != NULL && !ep->destroying && !ep->lost && ep->uep != NULL;
}

/* Whether a served put is still unacknowledged (its data not all in place). */
static bool op_unacked_put(const ucx_op_t *op)
{
    return op->kind == OP_PUT && op->awaiting;
}

/* Keep an AM of ep (header in op->hdr) to post once the blocking ops ahead
 * have taken their seqs. A small host payload is copied now, as a send that
 * goes at once copies it (attr.max_inline); a larger one stays the caller's
 * until completion, as for any send. */
static void ep_hold(ucx_ep_t *ep, ucx_op_t *op, const void *buf, size_t len, ucs_memory_type_t mt)
{
    if (len <= MSG_INLINE && mt == UCS_MEMORY_TYPE_HOST) {
        if (len > 0)
            memcpy(op->hdr + MSG_HDR_LEN, buf, len);
        buf = op->hdr + MSG_HDR_LEN;
    }
    op->held = true;
    op->hold_buf = buf;
    op->hold_len = len;
    op->hold_mt = mt;
    link_add_tail(&ep->ops, &op->link);
}

/* Post op's notify AM: it takes its seq. Returns true when op is finished
 * (the AM done at once, or refused). The caller releases what waited behind it. */
static bool op_notify(ucx_op_t *op)
{
    op->blocking = false;
    op->notify_ready = false;
    op->ep->nblock--;
    op->stage = 1;
    op->pending = 1;
    hdr_write(op->hdr, op->ep, MSG_PUT_IMM, 0, op->imm, op->len);
    op_track(op, am_post(op, NULL, 0, 0, UCS_MEMORY_TYPE_HOST));
    return --op->pending == 0;
}

/* Post, in order, the ops of ep that waited behind puts with immediate, up to
 * the first put with immediate whose flush still runs. Runs no callback:
 * what finishes at once is queued for progress. */
static void ep_release(ucx_ep_t *ep)
{
    bool unacked = false;

    if (!ep_live(ep))
        return; /* teardown or the loss fails them */
    for (link_t *l = ep->ops.next; l != &ep->ops; l = l->next) {
        ucx_op_t *op = link_entry(l, ucx_op_t, link);
        unacked = unacked || op_unacked_put(op);
        if (op->blocking) {
            if (!op->notify_ready || unacked)
                return; /* its flush (or a served put before it) still runs: everything
                           after it waits */
            if (op_notify(op))
                op_settle(op);
        } else if (op->held) {
            op->held = false;
            op->pending = 1;
            op_track(op, am_post(op, op->hold_buf, op->hold_len, 0, op->hold_mt));
            if (--op->pending == 0)
                op_settle(op); /* done at once (or refused): progress completes it */
        }
    }
}

/* op, a put with immediate, will never send its notify (failed, canceled):
 * it no longer holds back what follows it. */
static void op_unblock(ucx_op_t *op)
{
    if (!op->blocking)
        return;
    op->blocking = false;
    op->notify_ready = false;
    if (op->ep != NULL) {
        op->ep->nblock--;
        ep_release(op->ep);
    }
}

/* Whether a put with immediate posted before op on its endpoint has not
 * taken its seq yet, or a served put before it is not all in place. */
static bool op_blocked(const ucx_op_t *op)
{
    for (const link_t *l = op->ep->ops.next; l != &op->link; l = l->next) {
        const ucx_op_t *o = link_entry(l, const ucx_op_t, link);
        if (o->blocking || op_unacked_put(o))
            return true;
    }
    return false;
}

/* op has no UCX request outstanding: start its next stage if it has one.
 * Returns true when op is finished (its completion is due). */
static bool op_advance(ucx_op_t *op)
{
    if (op->kind != OP_PUT_IMM || op->stage != 0)
        return true;
    if (op->canceled || op->fail != TERN_OK || op->ustatus != UCS_OK) {
        op_unblock(op);
        return true;
    }
    if (!ep_live(op->ep)) {
        op->fail = TERN_ERR_PEER_LOST;
        op_unblock(op);
        return true;
    }
    /* The data is in place (the flush finished): tell the target, in turn. */
    if (op_blocked(op)) {
        op->notify_ready = true; /* ep_release posts it */
        return false;
    }
    const bool done = op_notify(op);
    ep_release(op->ep);
    return done;
}

/* The posting is over (op->pending held 1 during it): TERN_OK when op is
 * already complete (no callback will run), else TERN_INPROGRESS. */
static tern_status_t op_launched(ucx_op_t *op)
{
    link_add_tail(&op->ep->ops, &op->link);
    if (--op->pending > 0 || op->awaiting)
        return TERN_INPROGRESS;
    if (!op_advance(op))
        return TERN_INPROGRESS;
    if (op_status(op) == TERN_OK) {
        op_free(op);
        return TERN_OK;
    }
    /* Part of it started, then it failed: the callback says so. */
    op_settle(op);
    return TERN_INPROGRESS;
}

/* Take ops off ep onto list, deciding the status each completes with:
 * canceled ops TERN_ERR_CANCELED, ops UCX had finished their own status,
 * the others st. With keep_rma, puts and gets UCX is still running stay on
 * ep, to complete with st when UCX is done with their buffers. The ops taken
 * no longer refer to ep. Returns whether any stayed. */
static bool ops_take(ucx_ep_t *ep, link_t *list, tern_status_t st, bool keep_rma)
{
    bool kept = false;

    for (link_t *l = ep->ops.next; l != &ep->ops;) {
        ucx_op_t *op = link_entry(l, ucx_op_t, link);

        l = l->next;
        if (keep_rma && !op->in_done && op->pending > 0 &&
            (op->kind == OP_PUT || op->kind == OP_PUT_IMM || op->kind == OP_GET)) {
            op->fail = st;
            kept = true;
            continue;
        }
        if (op->sent)
            op->fail = TERN_OK; /* the peer has it: teardown canceled it too late */
        else if (op->canceled)
            op->fail = TERN_ERR_CANCELED;
        else if (op->in_done &&
                 !(op->kind == OP_PUT_IMM && op->stage == 0 && op_status(op) == TERN_OK))
            op->fail = op_status(op); /* finished in UCX before this */
        else
            op->fail = st;
        op->ep = NULL;
        link_del(&op->link);
        link_add_tail(list, &op->link);
    }
    return kept;
}

/* Complete the ops ops_take gathered. Ops whose requests UCX still holds are
 * detached. The callbacks run on a list no endpoint owns, so that they may
 * destroy endpoints. */
static void ops_complete(link_t *list)
{
    while (!link_empty(list)) {
        ucx_op_t *op = link_entry(list->next, ucx_op_t, link);
        tern__comp_t comp = op->comp;
        tern_status_t s = op->fail;

        if (op->pending > 0)
            op_detach(op);
        else
            op_free(op);
        tern__comp_call(&comp, s);
    }
}

/* ---- control messages ---- */

/* Send an internal AM (no user completion). Failure is only logged: these
 * are courtesy notices to the peer. */
static ucx_op_t *ctrl_post(ucx_ep_t *ep, uint8_t type, uint16_t flags, uint32_t imm, uint64_t len,
                           void *payload, size_t plen, uint32_t am_flags)
{
    ucx_op_t *op = op_new(ep->tp, ep, OP_CTRL, NULL);
    ucs_status_ptr_t sp;

    if (op == NULL) {
        free(payload);
        tern_warn("ucx: no memory for a control message to peer %u", ep->base.peer);
        return NULL;
    }
    op->payload = payload;
    hdr_write(op->hdr, ep, type, flags, imm, len);
    if (ep->nblock > 0 && type != MSG_BYE) { /* in turn behind a put with immediate */
        ep_hold(ep, op, payload, plen, UCS_MEMORY_TYPE_HOST);
        return op;
    }
    op->pending = 1;
    sp = am_post(op, payload, plen, am_flags, UCS_MEMORY_TYPE_HOST);
    if (UCS_PTR_IS_ERR(sp)) {
        tern_debug("ucx: control message %u to peer %u not sent: %s", type, ep->base.peer,
                   ucs_status_string(UCS_PTR_STATUS(sp)));
        op_free(op);
        return NULL;
    }
    op_track(op, sp);
    link_add_tail(&ep->ops, &op->link);
    if (--op->pending == 0) {
        op_free(op);
        return NULL;
    }
    return op;
}

/* ---- receiving: streams ---- */

static size_t stream_hash(const ucx_tp_t *tp, uint32_t src, uint32_t conn)
{
    uint64_t k = ((uint64_t)src << 32 | conn) * 0x9e3779b97f4a7c15ull;
    return (size_t)(k >> 32) & (tp->nbuckets - 1);
}

static ucx_stream_t *stream_find(ucx_tp_t *tp, uint32_t src, uint32_t conn)
{
    ucx_stream_t *s = tp->last_stream;
    if (s != NULL && s->src == src && s->conn == conn)
        return s;
    for (s = tp->buckets[stream_hash(tp, src, conn)]; s != NULL; s = s->hnext)
        if (s->src == src && s->conn == conn)
            return tp->last_stream = s;
    return NULL;
}

static void stream_rehash(ucx_tp_t *tp)
{
    size_t n = tp->nbuckets * 2, old = tp->nbuckets;
    ucx_stream_t **b = calloc(n, sizeof(*b)), **ob = tp->buckets;

    if (b == NULL)
        return; /* keep the longer chains */
    tp->buckets = b;
    tp->nbuckets = n;
    for (size_t i = 0; i < old; i++) {
        while (ob[i] != NULL) {
            ucx_stream_t *s = ob[i];
            size_t h = stream_hash(tp, s->src, s->conn);
            ob[i] = s->hnext;
            s->hnext = b[h];
            b[h] = s;
        }
    }
    free(ob);
}

static ucx_stream_t *stream_get_slow(ucx_tp_t *tp, uint32_t src, uint32_t conn)
{
    ucx_stream_t *s = stream_find(tp, src, conn);
    size_t h;

    if (s != NULL)
        return s;
    if ((s = calloc(1, sizeof(*s))) == NULL)
        return NULL;
    s->src = src;
    s->conn = conn;
    link_init(&s->entries);
    link_init(&s->dirty_link);
    h = stream_hash(tp, src, conn);
    s->hnext = tp->buckets[h];
    tp->buckets[h] = s;
    if (++tp->nstreams > 2 * tp->nbuckets)
        stream_rehash(tp);
    return s;
}

/* The stream of (src, conn), made on its first message. Inline for the
 * common case, the stream the last message came on. */
static inline ucx_stream_t *stream_get(ucx_tp_t *tp, uint32_t src, uint32_t conn)
{
    ucx_stream_t *s = tp->last_stream;
    if (s != NULL && s->src == src && s->conn == conn)
        return s;
    return stream_get_slow(tp, src, conn);
}

static void stream_dirty(ucx_tp_t *tp, ucx_stream_t *s)
{
    if (link_empty(&s->dirty_link))
        link_add_tail(&tp->dirty, &s->dirty_link);
}

static bool stream_canceled(const ucx_stream_t *s, uint32_t seq)
{
    for (size_t i = 0; i < s->ncanceled; i++)
        if (seq - s->canceled[2 * i] < s->canceled[2 * i + 1])
            return true;
    return false;
}

static ucx_entry_t *stream_lookup(ucx_stream_t *s, uint32_t seq)
{
    for (link_t *l = s->entries.next; l != &s->entries; l = l->next) {
        ucx_entry_t *e = link_entry(l, ucx_entry_t, link);
        if (e->seq == seq)
            return e;
    }
    return NULL;
}

/* Insert in seq order: arrivals are nearly always in order, so search from the tail. */
static void stream_insert(ucx_stream_t *s, ucx_entry_t *e)
{
    link_t *l = s->entries.prev;

    while (l != &s->entries && seq_before(e->seq, link_entry(l, ucx_entry_t, link)->seq))
        l = l->prev;
    link_add_before(l->next, &e->link);
    e->stream = s;
    e->in_stream = true;
}

/* Release what an entry holds. Not while a rendezvous receive still writes
 * into it (see entry_release). */
static void entry_free(ucx_tp_t *tp, ucx_entry_t *e)
{
    link_del(&e->link);
    if (e->desc != NULL)
        ucp_am_data_release(tp->worker, e->desc);
    free(e->buf);
    if (tp->nentry_cache < ENTRY_CACHE_MAX) {
        e->cache_next = tp->entry_cache;
        tp->entry_cache = e;
        tp->nentry_cache++;
    } else {
        free(e);
    }
}

/* A zeroed entry (all but its inline buffer), linked to nothing. */
static ucx_entry_t *entry_new(ucx_tp_t *tp)
{
    ucx_entry_t *e = tp->entry_cache;
    if (e != NULL) {
        tp->entry_cache = e->cache_next;
        tp->nentry_cache--;
    } else if ((e = malloc(sizeof(*e))) == NULL) {
        return NULL;
    }
    memset(e, 0, offsetof(ucx_entry_t, small));
    link_init(&e->link);
    e->tp = tp;
    return e;
}

/* An entry leaves its stream: free it, or keep it as an orphan until UCX
 * finishes the rendezvous receive that writes into its buffer. */
static void entry_release(ucx_tp_t *tp, ucx_entry_t *e)
{
    link_del(&e->link);
    e->in_stream = false;
    if (e->req != NULL) {
        e->dropped = true;
        link_add_tail(&tp->orphan_entries, &e->link);
        return;
    }
    entry_free(tp, e);
}

/* The sender canceled e: deliver nothing for it, and if it is still being
 * received, stop waiting for it. */
static void entry_abandon(ucx_entry_t *e)
{
    e->dropped = true;
    e->ready = true;
}

static void stream_free(ucx_tp_t *tp, ucx_stream_t *s)
{
    ucx_stream_t **pp = &tp->buckets[stream_hash(tp, s->src, s->conn)];

    while (!link_empty(&s->entries))
        entry_release(tp, link_entry(s->entries.next, ucx_entry_t, link));
    link_del(&s->dirty_link);
    while (*pp != s)
        pp = &(*pp)->hnext;
    *pp = s->hnext;
    tp->nstreams--;
    if (tp->last_stream == s)
        tp->last_stream = NULL;
    free(s->canceled);
    free(s);
}

/* A rendezvous receive finished (inside UCX progress or teardown). */
static void rndv_done_cb(void *request, ucs_status_t status, size_t length, void *arg)
{
    ucx_entry_t *e = arg;
    ucx_tp_t *tp = e->tp;

    ucp_request_free(request);
    e->req = NULL;
    if (!e->in_stream) { /* given up on: only the buffer was waiting for UCX */
        entry_free(tp, e);
        return;
    }
    if (e->ready) /* abandoned (the sender canceled it) but still in its stream */
        return;
    e->ready = true;
    if (status != UCS_OK || length != e->len) {
        tern_debug("ucx: rendezvous receive of %llu bytes from peer %u failed: %s",
                   (unsigned long long)e->len, e->src, ucs_status_string(status));
        e->dropped = true;
    }
    stream_dirty(tp, e->stream);
}

/* Start receiving a rendezvous message into a buffer of our own. Returns the
 * status the AM callback returns to UCX. */
static ucs_status_t rndv_start(ucx_tp_t *tp, ucx_entry_t *e, void *desc)
{
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.recv_am = rndv_done_cb,
        .user_data = e,
    };
    ucs_status_ptr_t sp;

    if (e->len > MAX_SEND) {
        tern_warn("ucx: peer %u sent %llu bytes, over the %zu-byte send limit: refused", e->src,
                  (unsigned long long)e->len, MAX_SEND);
        e->status = TERN_ERR_PROTOCOL;
        e->ready = true;
        return UCS_ERR_MESSAGE_TRUNCATED; /* the sender's send fails with it */
    }
    if ((e->buf = malloc(e->len ? e->len : 1)) == NULL) {
        tern_warn("ucx: no memory for a %llu-byte message from peer %u", (unsigned long long)e->len,
                  e->src);
        e->status = TERN_ERR_NO_MEMORY;
        e->ready = true;
        return UCS_ERR_NO_MEMORY;
    }
    e->data = e->buf;
    tp->rndv_recvs++;
    sp = ucp_am_recv_data_nbx(tp->worker, desc, e->buf, e->len, &p);
    if (sp == NULL) {
        e->ready = true;
    } else if (UCS_PTR_IS_ERR(sp)) {
        tern_debug("ucx: rendezvous receive from peer %u not started: %s", e->src,
                   ucs_status_string(UCS_PTR_STATUS(sp)));
        e->ready = true;
        e->dropped = true;
    } else if (!e->ready) {
        e->req = sp;
    }
    /* else (e is ready on its way in only through rndv_done_cb) UCX 1.13
     * finished the receive inside the call (the sender's endpoint is already
     * closed here: ucp_rndv_receive completes it CANCELED), ran rndv_done_cb,
     * which released it, and returned it all the same: keeping it would free
     * it twice, corrupting UCX's request pool (a segfault at worker destroy,
     * or two owners of one request). */
    return UCS_OK; /* UCX owns the descriptor now */
}

/* Apply n canceled seq ranges (wire form) of a BYE to its stream: those
 * messages are dropped, and later arrivals of them too. Where the list came
 * by AM (keep_ready) it travelled behind the messages it names, so one that
 * has arrived whole went out before the sender closed, and the sender
 * completes it as sent (eps_shutdown): only those still being received by
 * rendezvous are dropped. Where it came by the notice channel, everything
 * not yet delivered is dropped, and the ACK tells the sender where that
 * began. */
static void bye_apply(ucx_stream_t *s, const uint8_t *list, size_t n, bool keep_ready)
{
    const size_t first = s->ncanceled;
    uint32_t *c;

    if (n == 0)
        return;
    if ((c = realloc(s->canceled, (s->ncanceled + n) * 2 * sizeof(*c))) == NULL) {
        tern_warn("ucx: no memory for peer %u's list of canceled messages: some may be "
                  "delivered",
                  s->src);
        return;
    }
    s->canceled = c;
    for (size_t i = 0; i < n; i++) {
        c[2 * s->ncanceled] = tern__get_le32(list + RANGE_LEN * i);
        c[2 * s->ncanceled + 1] = tern__get_le32(list + RANGE_LEN * i + 4);
        s->ncanceled++;
    }
    for (link_t *l = s->entries.next; l != &s->entries; l = l->next) {
        ucx_entry_t *e = link_entry(l, ucx_entry_t, link);
        if (e->type == MSG_BYE || (keep_ready && e->ready && !e->dropped))
            continue;
        for (size_t i = first; i < s->ncanceled; i++)
            if (e->seq - c[2 * i] < c[2 * i + 1]) {
                entry_abandon(e);
                break;
            }
    }
}

/* ---- served gets ----
 *
 * Where UCX has no RMA transport of its own for a peer, ucp_get_nbx is
 * emulated with AMs that the target's UCX answers, out of tern's sight: it
 * reads the raw address, whatever the key's region has become, and the reply
 * requests it queues are ones UCX 1.13 cannot purge without crashing
 * (docs/transport-ucx.md, "Known UCX 1.13 faults"). Where UCX would emulate
 * them (tcp, shared memory below cma_copy's threshold) tern serves gets
 * itself, with the same two messages:
 * MSG_GET names the registration by id, and the target checks it (live, in
 * bounds, readable) before it answers with MSG_GET_REPLY, an ordinary AM
 * whose payload is the region's bytes. A refusal fails the get with
 * TERN_ERR_ACCESS and raises TERN_EVENT_ERROR at the target. The reply goes
 * back on the UCP endpoint the request came on (UCP_AM_SEND_FLAG_REPLY), from
 * inside the AM callback, the only place UCX promises that endpoint. On
 * shared memory a get of up to SHM_PIECES_MAX is answered in pieces
 * (serve_pieces).
 *
 * UCX reads a reply's payload as the socket takes it, long after the
 * callback, and its owner may free the region once tern_mr_dereg returns.
 * So the payload is a generic datatype (reply_pack) that tern copies into
 * UCX's send segments itself, in order, and stops reading at the dereg
 * (replies_revoke): the rest goes as zeros, and the status trailer after the
 * bytes, packed last, tells the getter whether all of them were read while
 * the region was there. That is an RC read racing ibv_dereg_mr: it either
 * completes or fails with TERN_ERR_ACCESS, and reads nothing after. */

/* Replies up to this size go eagerly: UCX's rendezvous (RTS, the getter's
 * fetch, ATS) halved a 64 KiB get's bandwidth when served gets were tried on
 * shared memory too. Larger ones are left to UCX, so that the getter's UCX
 * does not assemble a whole copy of a large reply before tern copies it into
 * place. */
#define REPLY_EAGER_MAX ((size_t)1 << 20)

/* Over shared memory a get's reply (and a put) goes in pieces of at most
 * this many bytes, each within one segment of UCX's FIFO, so that the
 * receiver copies each straight into place: UCX_MM_SEG_SIZE's 8256 bytes by
 * default hold UCP's 8-byte AM header, tern's 32, the piece and its 4-byte
 * trailer, with 20 to spare. A message that spans segments UCX first
 * assembles in a buffer of its own: one copy more, 10 % of a 32 KiB
 * rendezvous round trip (docs/transport-ucx.md). With a smaller
 * UCX_MM_SEG_SIZE the pieces still arrive whole, assembled. */
#define SHM_FRAG ((size_t)8192)
/* Gets up to this size are answered in pieces; a larger one whole (eagerly
 * up to REPLY_EAGER_MAX): a piece is a UCX request of its own, and a 4 MiB
 * get's 512 of them were slower than one whole reply (TERN_UCX_CMA=0). */
#define SHM_PIECES_MAX ((size_t)256 << 10)

/* Each chunk of a served put is at most this long (or a 256th of the put,
 * whichever is more, to bound the headers a put keeps): sent eagerly, so
 * that the target checks and places it inside its AM callback and answers
 * there, while the reply endpoint is valid. */
#define PUT_CHUNK ((size_t)1 << 20)
#define PUT_CHUNKS_MAX 256u
/* A MSG_PUT's header: GET_HDR_LEN's, then u64 the whole put's length (for
 * the target's error event). */
#define PUT_HDR_LEN 56u

/* A get or put we refused, raised by drain as TERN_EVENT_ERROR. */
typedef struct refusal {
    link_t link; /* tp->refusals */
    uint32_t src;
    uint32_t imm; /* a put's immediate, when it had one (MSGF_IMM) */
    uint16_t flags;
    uint64_t len;
} refusal_t;

/* A get reply's status trailer: u32 tern status. */
#define REPLY_TRAILER_LEN 4u

/* A reply on its way: its header must outlive the send, and a get's
 * payload is read through it (reply_pack). */
typedef struct get_reply {
    link_t link;        /* its region's replies while it may read the region */
    const uint8_t *src; /* the region's bytes; NULL once the region is gone */
    uint64_t len;       /* bytes of the region, then the trailer */
    bool trailer_set;
    uint8_t trailer[REPLY_TRAILER_LEN];
    uint8_t hdr[MSG_HDR_LEN];
} get_reply_t;

/* The reply's send finished (or the worker's destroy purged it, before the
 * registrations go): free it only, since this may run inside
 * ucp_worker_destroy. */
static void reply_sent_cb(void *request, ucs_status_t status, void *arg)
{
    get_reply_t *r = arg;

    (void)status;
    ucp_request_free(request);
    link_del(&r->link);
    free(r);
}

/* The region of mr goes: its replies under way read no more of it. */
static void replies_revoke(ucx_mr_t *mr)
{
    while (!link_empty(&mr->replies)) {
        get_reply_t *r = link_entry(mr->replies.next, get_reply_t, link);
        tern_debug("ucx: a reply of %llu bytes from registration %u is under way as it is "
                   "unregistered: the rest goes as zeros, and the get fails",
                   (unsigned long long)r->len, mr->id);
        r->src = NULL;
        link_del(&r->link);
    }
}

/* reply_dt's operations. UCX calls them with the buffer and count given to
 * ucp_am_send_nbx (the get_reply_t, 1), packs a message's fragments in order
 * of offset, and calls finish as the send completes or is purged. */
static void *reply_start_pack(void *context, const void *buffer, size_t count)
{
    (void)context;
    (void)count;
    return (void *)(uintptr_t)buffer;
}

static size_t reply_packed_size(void *state)
{
    const get_reply_t *r = state;

    return r->len + REPLY_TRAILER_LEN;
}

static size_t reply_pack(void *state, size_t offset, void *dest, size_t max_length)
{
    get_reply_t *r = state;
    const uint64_t total = r->len + REPLY_TRAILER_LEN;
    uint8_t *d = dest;
    size_t n, k = 0;

    if (offset >= total)
        return 0;
    n = max_length < total - offset ? max_length : (size_t)(total - offset);
    if (offset < r->len) {
        k = n < r->len - offset ? n : (size_t)(r->len - offset);
        if (r->src != NULL)
            memcpy(d, r->src + offset, k);
        else
            memset(d, 0, k);
    }
    if (k < n) {
        /* The bytes before it were all packed: set once, so that a region
         * that goes while the trailer straddles two fragments cannot
         * change it half way. */
        if (!r->trailer_set) {
            tern__put_le32(r->trailer, (uint32_t)(int32_t)(r->src != NULL ? TERN_OK
                                                                          : TERN_ERR_ACCESS));
            r->trailer_set = true;
        }
        memcpy(d + k, r->trailer + (offset + k - r->len), n - k);
    }
    return n;
}

static void reply_finish(void *state)
{
    (void)state; /* reply_sent_cb (or the post's own failure) frees it */
}

/* Never used to receive: only the sending half of a datatype's work. */
static void *reply_start_unpack(void *context, void *buffer, size_t count)
{
    (void)context;
    (void)count;
    return buffer;
}

static ucs_status_t reply_unpack(void *state, size_t offset, const void *src, size_t length)
{
    (void)state;
    (void)offset;
    (void)src;
    (void)length;
    return UCS_ERR_UNSUPPORTED;
}

static const ucp_generic_dt_ops_t reply_dt_ops = {
    .start_pack = reply_start_pack,
    .start_unpack = reply_start_unpack,
    .packed_size = reply_packed_size,
    .pack = reply_pack,
    .unpack = reply_unpack,
    .finish = reply_finish,
};

/* Whether a peer may read (or write) len bytes at raddr of our registration
 * reg: NULL, or why not; *mr_out (if not NULL) the registration. */
static const char *served_check(ucx_tp_t *tp, uint32_t reg, uint64_t raddr, uint64_t len,
                                bool write, ucx_mr_t **mr_out)
{
    ucx_mr_t *mr = NULL;

    HASH_FIND(hh, tp->mr_by_id, &reg, sizeof(reg), mr);
    if (mr_out != NULL)
        *mr_out = mr;
    if (mr == NULL)
        return "no such registration here (unregistered?)";
    if (!(mr->base.access & (write ? TERN_ACCESS_REMOTE_WRITE : TERN_ACCESS_REMOTE_READ)))
        return write ? "the region does not allow remote write"
                     : "the region does not allow remote read";
    if (mr->base.mem_type != TERN_MEM_HOST)
        return "the region is not host memory";
    if (!tern__range_within((uintptr_t)mr->base.addr, mr->base.len, raddr, len))
        return "out of the region's bounds";
    return NULL;
}

/* Send r (its header filled) on ep with p; when mr is not NULL its payload
 * is len bytes at src of that registration, read through reply_dt, and the
 * status trailer. Returns what ucp_am_send_nbx did: unless it is a request
 * (UCX keeps r until reply_sent_cb), r is the caller's again. */
static ucs_status_ptr_t reply_send(ucx_tp_t *tp, ucp_ep_h ep, get_reply_t *r, ucx_mr_t *mr,
                                   const uint8_t *src, uint64_t len, ucp_request_param_t *p)
{
    link_init(&r->link);
    p->user_data = r;
    if (mr != NULL) {
        r->src = src;
        r->len = len;
        r->trailer_set = false;
        link_add_tail(&mr->replies, &r->link);
        p->op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
        p->datatype = tp->reply_dt;
    }
    ucs_status_ptr_t sp =
        ucp_am_send_nbx(ep, AM_ID, r->hdr, MSG_HDR_LEN, mr != NULL ? r : NULL, mr != NULL, p);
    if (!UCS_PTR_IS_PTR(sp))
        link_del(&r->link);
    return sp;
}

/* Answer on the endpoint a served request came on (from am_cb: UCX promises
 * that endpoint only there): a reply of type, its token, its status, and,
 * when mr is not NULL, data[0..len) of that registration and the status
 * trailer as its payload. A header-only reply UCX takes at once needs no
 * memory of ours; anything else keeps its header until sent. */
static void serve_reply(ucx_tp_t *tp, const ucp_am_recv_param_t *param, uint8_t type,
                        uint32_t token, tern_status_t st, uint64_t hlen, ucx_mr_t *mr,
                        const void *data, size_t len)
{
    uint8_t h[MSG_HDR_LEN];
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE | UCP_OP_ATTR_FIELD_FLAGS,
        .memory_type = UCS_MEMORY_TYPE_HOST,
        .flags = len <= REPLY_EAGER_MAX ? UCP_AM_SEND_FLAG_EAGER : 0,
    };
    ucs_status_ptr_t sp;

    hdr_fill(h, type, 0, tp->base.self_id, 0, 0, token, hlen);
    tern__put_le32(h + 20, (uint32_t)(int32_t)st);
    if (mr == NULL) {
        p.op_attr_mask |= UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL;
        sp = ucp_am_send_nbx(param->reply_ep, AM_ID, h, MSG_HDR_LEN, NULL, 0, &p);
        if (sp == NULL)
            return;
        if (UCS_PTR_IS_ERR(sp) && UCS_PTR_STATUS(sp) != UCS_ERR_NO_RESOURCE) {
            tern_debug("ucx: a reply (type %u) not sent: %s", type,
                       ucs_status_string(UCS_PTR_STATUS(sp)));
            return;
        }
        p.op_attr_mask &= ~(uint32_t)UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL;
    }
    get_reply_t *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        /* The requester waits until its endpoint goes: as if the reply were lost. */
        tern_warn("ucx: no memory to answer a peer's %s of %llu bytes",
                  type == MSG_PUT_ACK ? "put" : "get", (unsigned long long)hlen);
        return;
    }
    memcpy(r->hdr, h, MSG_HDR_LEN);
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = reply_sent_cb;
    sp = reply_send(tp, param->reply_ep, r, mr, data, len, &p);
    if (!UCS_PTR_IS_PTR(sp)) {
        if (UCS_PTR_IS_ERR(sp))
            tern_debug("ucx: a reply (type %u) not sent: %s", type,
                       ucs_status_string(UCS_PTR_STATUS(sp)));
        free(r);
    }
}

/* Queue a refused get or put for drain to raise as TERN_EVENT_ERROR. */
static void refusal_add(ucx_tp_t *tp, uint32_t src, uint16_t flags, uint32_t imm, uint64_t len)
{
    refusal_t *f = malloc(sizeof(*f));

    if (f == NULL)
        return; /* the requester hears it all the same */
    f->src = src;
    f->flags = flags;
    f->imm = imm;
    f->len = len;
    link_add_tail(&tp->refusals, &f->link);
}

/* Whether a served request (h: its header) came with an endpoint to answer on. */
static bool served_reply_ep(const ucp_am_recv_param_t *param, const uint8_t *h)
{
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) && param->reply_ep != NULL)
        return true;
    tern_warn("ucx: a %s from peer %u came without a reply endpoint: dropped",
              h[1] == MSG_PUT ? "put" : "get", tern__get_le32(h + 4));
    return false;
}

/* Answer a get of len bytes at src (of mr) in pieces of SHM_FRAG, each its
 * own AM with its offset and its own trailer (from am_cb, as serve_reply). A
 * piece's get_reply_t is reused while UCX sends at once; one UCX queues
 * keeps it until sent. */
static void serve_pieces(ucx_tp_t *tp, const ucp_am_recv_param_t *param, uint32_t token,
                         ucx_mr_t *mr, const uint8_t *src, uint64_t len)
{
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE | UCP_OP_ATTR_FIELD_FLAGS |
                        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .memory_type = UCS_MEMORY_TYPE_HOST,
        .flags = UCP_AM_SEND_FLAG_EAGER,
        .cb.send = reply_sent_cb,
    };
    get_reply_t *r = NULL;

    for (uint64_t off = 0; off < len; off += SHM_FRAG) {
        const uint64_t n = len - off < SHM_FRAG ? len - off : SHM_FRAG;
        if (r == NULL && (r = malloc(sizeof(*r))) == NULL) {
            /* The getter waits until its endpoint goes: as if the rest were lost. */
            tern_warn("ucx: no memory to answer a peer's get of %llu bytes",
                      (unsigned long long)len);
            return;
        }
        hdr_fill(r->hdr, MSG_GET_REPLY, MSGF_FRAG, tp->base.self_id, 0, 0, token, n);
        tern__put_le64(r->hdr + 8, off);
        ucs_status_ptr_t sp = reply_send(tp, param->reply_ep, r, mr, src + off, n, &p);
        if (UCS_PTR_IS_PTR(sp)) {
            r = NULL; /* UCX's until reply_sent_cb */
            continue;
        }
        if (UCS_PTR_IS_ERR(sp)) {
            tern_debug("ucx: a piece of a get's reply not sent: %s",
                       ucs_status_string(UCS_PTR_STATUS(sp)));
            break; /* the getter's endpoint is failing: it fails the get */
        }
    }
    free(r);
}

/* Answer a peer's MSG_GET (from am_cb). */
static void serve_get(ucx_tp_t *tp, const uint8_t *h, const ucp_am_recv_param_t *param)
{
    const uint32_t src = tern__get_le32(h + 4), token = tern__get_le32(h + 16);
    const uint32_t reg = tern__get_le32(h + 40);
    const uint64_t len = tern__get_le64(h + 24), raddr = tern__get_le64(h + 32);
    ucx_mr_t *mr = NULL;
    const char *why = len == 0 ? "a get of no bytes is never sent"
                               : served_check(tp, reg, raddr, len, false, &mr);

    if (!served_reply_ep(param, h))
        return;
    if (why == NULL && (tern__get_le16(h + 2) & MSGF_FRAG)) {
        serve_pieces(tp, param, token, mr, (const uint8_t *)(uintptr_t)raddr, len);
        return;
    }
    serve_reply(tp, param, MSG_GET_REPLY, token, why == NULL ? TERN_OK : TERN_ERR_ACCESS,
                why == NULL ? len : 0, why == NULL ? mr : NULL, (const void *)(uintptr_t)raddr,
                why == NULL ? len : 0);
    if (why != NULL) {
        tern_debug("ucx: refused peer %u's get of %llu bytes at %#llx (registration %u): %s", src,
                   (unsigned long long)len, (unsigned long long)raddr, reg, why);
        refusal_add(tp, src, MSGF_GET, 0, len);
    }
}

/* Place a chunk of a peer's put (MSG_PUT, from am_cb) and acknowledge it.
 * Each chunk is checked as it arrives, so none lands once its region is
 * unregistered; the refused chunks of one put raise one error event. */
static void serve_put(ucx_tp_t *tp, const uint8_t *h, const void *data, size_t length,
                      const ucp_am_recv_param_t *param)
{
    const uint32_t src = tern__get_le32(h + 4), token = tern__get_le32(h + 16);
    const uint32_t reg = tern__get_le32(h + 40), imm = tern__get_le32(h + 44);
    const uint16_t flags = tern__get_le16(h + 2);
    const uint64_t len = tern__get_le64(h + 24), raddr = tern__get_le64(h + 32);
    const uint64_t total = tern__get_le64(h + 48);
    const char *why = len != length ? "its length is not its header's"
                                    : served_check(tp, reg, raddr, len, true, NULL);

    if (!served_reply_ep(param, h))
        return;
    if (why == NULL && len > 0)
        memcpy((void *)(uintptr_t)raddr, data, len);
    serve_reply(tp, param, MSG_PUT_ACK, token, why == NULL ? TERN_OK : TERN_ERR_ACCESS, len,
                NULL, NULL, 0);
    if (why == NULL)
        return;
    if (tp->refused_any && tp->refused_src == src && tp->refused_token == token)
        return; /* another chunk of a put refused already */
    tern_debug("ucx: refused peer %u's put of %llu bytes at %#llx (registration %u): %s", src,
               (unsigned long long)total, (unsigned long long)raddr, reg, why);
    tp->refused_any = true;
    tp->refused_src = src;
    tp->refused_token = token;
    refusal_add(tp, src, flags & MSGF_IMM, imm, total);
}

/* A get reply's trailer (trailer: its REPLY_TRAILER_LEN bytes) says
 * whether its bytes are the region's: the get fails if not. */
static void reply_trailer(ucx_op_t *op, const uint8_t *trailer)
{
    const tern_status_t st = (tern_status_t)(int32_t)tern__get_le32(trailer);

    if (st != TERN_OK && op->fail == TERN_OK) {
        tern_debug("ucx: peer %u unregistered the region of a get while answering it: failed",
                   op->ep != NULL ? op->ep->base.peer : 0u);
        op->fail = st == TERN_ERR_ACCESS ? TERN_ERR_ACCESS : TERN_ERR_PROTOCOL;
    }
}

/* The rendezvous receive of a reply finished. */
static void get_recv_cb(void *request, ucs_status_t status, size_t length, void *arg)
{
    ucx_op_t *op = arg;

    op->recv_cb_ran = true;
    if (status == UCS_OK && length != op->len + REPLY_TRAILER_LEN)
        status = UCS_ERR_MESSAGE_TRUNCATED;
    if (status == UCS_OK)
        reply_trailer(op, op->rtrailer);
    op_request_done(op, request, status);
}

/* A piece of a get's reply (MSGF_FRAG; h its header, data its payload): its
 * bytes go into place; the get is answered once all of them are in. A piece
 * that does not fit the get fails it, as does one whose trailer says the
 * region went. */
static void get_piece(ucx_op_t *op, const uint8_t *h, const void *data, size_t length)
{
    const uint64_t off = tern__get_le64(h + 8), n = tern__get_le64(h + 24);
    const uint8_t *d = data;

    if (n == 0 || length != n + REPLY_TRAILER_LEN || off > op->len || n > op->len - off ||
        n > op->len - op->got) {
        tern_warn("ucx: peer %u answered a get of %llu bytes with a piece of %llu at %llu "
                  "(%zu bytes with its trailer): failed",
                  op->ep->base.peer, (unsigned long long)op->len, (unsigned long long)n,
                  (unsigned long long)off, length);
        op->fail = TERN_ERR_PROTOCOL;
        get_unlist(op); /* the rest, if any comes, is dropped */
        op_maybe_settle(op);
        return;
    }
    reply_trailer(op, d + n);
    if (op->fail == TERN_OK)
        memcpy((uint8_t *)op->lbuf + off, d, n);
    op->got += n;
    if (op->got < op->len)
        return;
    get_unlist(op);
    op_maybe_settle(op);
}

/* A MSG_GET_REPLY (from am_cb): the bytes go into the get's buffer. */
static void get_reply(ucx_tp_t *tp, const uint8_t *h, void *data, size_t length, bool rndv)
{
    const uint32_t src = tern__get_le32(h + 4), token = tern__get_le32(h + 16);
    const tern_status_t st = (tern_status_t)(int32_t)tern__get_le32(h + 20);
    ucx_op_t *op = NULL;

    HASH_FIND(hh, tp->awaited, &token, sizeof(token), op);
    if (op == NULL || op->ep == NULL || op->ep->base.peer != src || op->kind != OP_GET) {
        /* Its get was given up on (canceled, failed), or the token names
         * a put: a rendezvous descriptor not taken is dropped by UCX. */
        tern_debug("ucx: a reply from peer %u to a get no longer awaited: dropped", src);
        return;
    }
    if (st == TERN_OK && (tern__get_le16(h + 2) & MSGF_FRAG)) {
        get_piece(op, h, rndv ? NULL : data, rndv ? 0 : length); /* a piece is sent eagerly */
        return;
    }
    get_unlist(op);
    if (st != TERN_OK) {
        op->fail = st == TERN_ERR_ACCESS ? TERN_ERR_ACCESS : TERN_ERR_PROTOCOL;
    } else if (length != op->len + REPLY_TRAILER_LEN) {
        tern_warn("ucx: peer %u answered a get of %llu bytes with %zu (%u of them its "
                  "trailer's due): failed",
                  src, (unsigned long long)op->len, length, REPLY_TRAILER_LEN);
        op->fail = TERN_ERR_PROTOCOL;
    } else if (rndv) {
        /* The bytes go into place, the trailer beside them. */
        ucp_request_param_t p = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                            UCP_OP_ATTR_FIELD_DATATYPE,
            .cb.recv_am = get_recv_cb,
            .user_data = op,
            .datatype = ucp_dt_make_iov(),
        };
        op->riov[0] = (ucp_dt_iov_t){.buffer = op->lbuf, .length = op->len};
        op->riov[1] = (ucp_dt_iov_t){.buffer = op->rtrailer, .length = REPLY_TRAILER_LEN};
        op->pending++;
        op->recv_cb_ran = false;
        ucs_status_ptr_t sp = ucp_am_recv_data_nbx(tp->worker, data, op->riov, 2, &p);
        if (sp == NULL) {
            op->pending--;
            reply_trailer(op, op->rtrailer);
        } else if (UCS_PTR_IS_ERR(sp)) {
            op->pending--;
            if (op->ustatus == UCS_OK)
                op->ustatus = UCS_PTR_STATUS(sp);
        } else if (!op->recv_cb_ran) {
            /* (UCX 1.13 may finish it inside the call and return it all
             * the same: see rndv_start.) */
            op->reqs[op->reqs[0] == NULL ? 0 : 1] = sp;
        }
    } else {
        const uint8_t *d = data;
        reply_trailer(op, d + op->len);
        if (op->fail == TERN_OK)
            memcpy(op->lbuf, d, op->len);
    }
    op_maybe_settle(op);
}

/* A MSG_PUT_ACK (from am_cb): one chunk of a served put is placed (or refused). */
static void put_ack(ucx_tp_t *tp, const uint8_t *h)
{
    const uint32_t src = tern__get_le32(h + 4), token = tern__get_le32(h + 16);
    const tern_status_t st = (tern_status_t)(int32_t)tern__get_le32(h + 20);
    ucx_op_t *op = NULL;

    HASH_FIND(hh, tp->awaited, &token, sizeof(token), op);
    if (op == NULL || op->ep == NULL || op->ep->base.peer != src ||
        (op->kind != OP_PUT && op->kind != OP_PUT_IMM)) {
        tern_debug("ucx: an acknowledgement from peer %u of a put no longer awaited: dropped",
                   src);
        return;
    }
    if (st != TERN_OK && op->fail == TERN_OK)
        op->fail = st == TERN_ERR_ACCESS ? TERN_ERR_ACCESS : TERN_ERR_PROTOCOL;
    if (--op->acks_due > 0)
        return;
    get_unlist(op);
    op_maybe_settle(op);
}

/* UCX's AM callback: every tern message arrives here, inside
 * ucp_worker_progress. It files the message into its stream; ucx_progress
 * delivers it.
 *
 * The fast lane: a small send that is next in a stream with nothing waiting
 * (no entry, no canceled seq) needs none of the stream's machinery. It is
 * copied into a slot of tp->fast and its seq is consumed at once; drain
 * delivers the lane before any stream, so a later message of the same stream
 * (filed as an entry because the lane was full, or arriving by rendezvous)
 * still comes after it. This is most of what separated a shared-memory round
 * trip from a raw UCP one (docs/perf.md). */
static ucs_status_t am_cb(void *arg, const void *header, size_t header_length, void *data,
                          size_t length, const ucp_am_recv_param_t *param)
{
    ucx_tp_t *tp = arg;
    const uint8_t *h = header;
    const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    const bool held = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA) != 0;
    void *const desc = data; /* what UCX knows a held or rendezvous payload by */
    ucs_status_t ret = UCS_OK;
    ucx_stream_t *s;
    ucx_entry_t *e;

    uint8_t type = MSG_SEND;
    uint16_t flags = 0;
    uint32_t src, conn, seq, imm;
    uint64_t hlen = 0;
    const bool is_short = header_length == 0 && !rndv && length >= SHORT_HDR_LEN &&
                          *(const uint8_t *)data == WIRE_SHORT &&
                          length - SHORT_HDR_LEN <= MSG_INLINE;
    if (tp->closing)
        return UCS_OK; /* its streams are freed: a stream made now would be lost */
    if (header_length == GET_HDR_LEN && h[0] == WIRE_VERSION && h[1] == MSG_GET) {
        if (!rndv && length == 0)
            serve_get(tp, h, param);
        return UCS_OK;
    }
    if (header_length == MSG_HDR_LEN && h[0] == WIRE_VERSION && h[1] == MSG_GET_REPLY) {
        get_reply(tp, h, data, length, rndv);
        return UCS_OK;
    }
    if (header_length == PUT_HDR_LEN && h[0] == WIRE_VERSION && h[1] == MSG_PUT) {
        if (!rndv) /* sent eagerly: a rendezvous one is no tern's */
            serve_put(tp, h, data, length, param);
        return UCS_OK;
    }
    if (header_length == MSG_HDR_LEN && h[0] == WIRE_VERSION && h[1] == MSG_PUT_ACK) {
        put_ack(tp, h);
        return UCS_OK;
    }
    if (is_short) {
        /* The short header (ucx_send_inline). */
        h = data;
        seq = tern__get_le32(h) >> 8; /* 24 bits: extended below */
        imm = tern__get_le32(h + 12);
        data = (uint8_t *)data + SHORT_HDR_LEN;
        length -= SHORT_HDR_LEN;
    } else {
        /* The header inside the payload (a small message, am_post). */
        if (header_length == 0 && !rndv && length >= MSG_HDR_LEN &&
            length - MSG_HDR_LEN <= MSG_INLINE) {
            h = data;
            header_length = MSG_HDR_LEN;
            data = (uint8_t *)data + MSG_HDR_LEN;
            length -= MSG_HDR_LEN;
        }
        if (header_length != MSG_HDR_LEN || h[0] != WIRE_VERSION) {
            tern_warn("ucx: dropped a message with a malformed header (%zu bytes, version %u)",
                      header_length, header_length > 0 ? h[0] : 0);
            return UCS_OK;
        }
        type = h[1];
        flags = tern__get_le16(h + 2);
        seq = tern__get_le32(h + 12);
        imm = tern__get_le32(h + 16);
        hlen = tern__get_le64(h + 24);
    }
    src = tern__get_le32(h + 4);
    conn = tern__get_le32(h + 8);
    if ((s = stream_get(tp, src, conn)) == NULL) {
        tern_warn("ucx: no memory for a stream from peer %u: message dropped", src);
        return UCS_OK;
    }
    if (is_short)
        seq = tern__ucx_seq_near(s->expected, seq);
    if (s->closed || seq_before(seq, s->expected) ||
        (!link_empty(&s->entries) &&
         !seq_before(link_entry(s->entries.prev, ucx_entry_t, link)->seq, seq) &&
         stream_lookup(s, seq) != NULL)) {
        tern_debug("ucx: stale message %u from peer %u dropped", seq, src);
        return UCS_OK;
    }
    /* One slot stays free: drain may be delivering from it (see drain). */
    if (type == MSG_SEND && !rndv && length <= FAST_INLINE && seq == s->expected &&
        link_empty(&s->entries) && s->ncanceled == 0 && !s->dead && tp->nfast < FAST_SLOTS - 1) {
        fast_msg_t *f = &tp->fast[(tp->fast_head + tp->nfast++) % FAST_SLOTS];
        f->src = src;
        f->imm = imm;
        f->len = (uint32_t)length;
        memcpy(f->data, data, length);
        s->expected++;
        return UCS_OK;
    }
    if ((e = entry_new(tp)) == NULL) {
        /* Cannot even keep its place in the stream: later ones wait for the
         * sender's teardown. Should not happen short of exhaustion. */
        tern_warn("ucx: no memory for a message from peer %u: dropped", src);
        return UCS_OK;
    }
    e->type = type;
    e->flags = flags;
    e->src = src;
    e->seq = seq;
    e->imm = imm;
    e->len = hlen;
    stream_insert(s, e);

    if (stream_canceled(s, seq)) {
        entry_abandon(e); /* a rendezvous descriptor not taken: UCX drops it */
    } else if (rndv && e->type != MSG_SEND) {
        tern_warn("ucx: control message %u from peer %u came by rendezvous: dropped", e->type, src);
        entry_abandon(e);
    } else {
        switch (e->type) {
        case MSG_SEND:
            e->len = length;
            if (rndv) {
                ret = rndv_start(tp, e, desc);
            } else if (held) {
                e->desc = desc; /* kept until delivered (ucp_am_data_release) */
                e->data = data;
                e->ready = true;
                ret = UCS_INPROGRESS;
            } else if (length <= ENTRY_INLINE) {
                memcpy(e->small, data, length);
                e->data = e->small;
                e->ready = true;
            } else {
                if ((e->buf = malloc(length)) == NULL) {
                    tern_warn("ucx: no memory for a %zu-byte message from peer %u", length, src);
                    e->status = TERN_ERR_NO_MEMORY;
                } else {
                    memcpy(e->buf, data, length);
                }
                e->data = e->buf;
                e->ready = true;
            }
            break;
        case MSG_PUT_IMM:
        case MSG_ACCESS:
            e->ready = true;
            break;
        case MSG_BYE:
            bye_apply(s, data, length / RANGE_LEN, true);
            s->bye = true;
            e->ready = true;
            break;
        default:
            tern_warn("ucx: dropped a message of unknown type %u from peer %u", e->type, src);
            entry_abandon(e);
            break;
        }
    }
    stream_dirty(tp, s);
    return ret;
}

/* ---- peer loss ---- */

static void ep_notice_close(ucx_ep_t *ep);

/* Record that ep's peer is gone; ucx_progress handles it (closes the UCP
 * endpoint, fails its ops, raises the event) outside UCX's callbacks. */
static void ep_mark_lost(ucx_ep_t *ep, ucs_status_t why)
{
    if (ep->lost || ep->destroying)
        return;
    ep->lost = true;
    ep->lost_status = why;
    link_add_tail(&ep->tp->lost, &ep->lost_link);
}

/* UCX's error callback (UCP_ERR_HANDLING_MODE_PEER): the peer failed. */
static void ep_err_cb(void *arg, ucp_ep_h uep, ucs_status_t status)
{
    ucx_ep_t *ep = arg;

    (void)uep;
    tern_debug("ucx: endpoint to peer %u failed: %s", ep->base.peer, ucs_status_string(status));
    ep_mark_lost(ep, status);
}

/* The user hears that peer is gone: TERN_ERR_CLOSED when it closed its
 * endpoint on purpose (its tern_finalize: nothing to warn about), else
 * TERN_ERR_PEER_LOST. As the tcp provider says it. */
static void event_peer_lost(ucx_tp_t *tp, uint32_t peer, bool closed)
{
    tern_event_t ev = {.type = TERN_EVENT_ERROR,
                       .src = peer,
                       .status = closed ? TERN_ERR_CLOSED : TERN_ERR_PEER_LOST};
    tern__tp_event(&tp->base, &ev);
}

/* Whether a BYE from peer has arrived and not yet been delivered. A peer
 * that closes says BYE before its endpoint goes (by AM, ahead of the close,
 * or on the notice channel, before the hang-up), but the hang-up or UCX's
 * error callback may be seen first. A stream whose BYE was delivered is
 * closed, and its loss was handled then: an earlier endpoint's goodbye does
 * not excuse a later one's loss. */
static bool peer_bye_pending(const ucx_tp_t *tp, uint32_t peer)
{
    for (size_t i = 0; i < tp->nbuckets; i++)
        for (const ucx_stream_t *s = tp->buckets[i]; s != NULL; s = s->hnext)
            if (s->src == peer && s->bye && !s->closed)
                return true;
    return false;
}

/* Start closing ep's UCP endpoint: force (purging its requests) where
 * allowed, else flush. */
static void ep_close_uep(ucx_ep_t *ep)
{
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                             .flags = ep->peer_mode ? UCP_EP_CLOSE_FLAG_FORCE : 0};
    ucs_status_ptr_t sp;

    if (ep->uep == NULL)
        return;
    sp = ucp_ep_close_nbx(ep->uep, &p);
    ep->uep = NULL;
    if (UCS_PTR_IS_PTR(sp))
        ep->close_req = sp;
    else if (UCS_PTR_IS_ERR(sp))
        tern_debug("ucx: closing the endpoint to peer %u: %s", ep->base.peer,
                   ucs_status_string(UCS_PTR_STATUS(sp)));
}

/* The close request finished (or there is none). */
static bool ep_closed(ucx_ep_t *ep)
{
    if (ep->close_req == NULL)
        return true;
    if (ucp_request_check_status(ep->close_req) == UCS_INPROGRESS)
        return false;
    ucp_request_free(ep->close_req);
    ep->close_req = NULL;
    return true;
}

/* Handle a lost peer (from progress): its ops fail with TERN_ERR_PEER_LOST,
 * and the user hears TERN_EVENT_ERROR. With peer error handling the UCP
 * endpoint is force-closed first, so that UCX has let go of the buffers.
 * Without it (shared memory) the UCP endpoint stays until the user destroys
 * ours: sends can complete at once (only the gone peer would read their
 * buffers), but puts and gets run on our side (cma) and may still be writing
 * or reading: they complete when UCX is done with them, or after
 * CLOSE_WAIT_NS at the latest (ep_linger_check; ucx_arm sets the fd's timer
 * for that moment). */
static void ep_handle_lost(ucx_tp_t *tp, ucx_ep_t *ep)
{
    link_t ops;
    const uint32_t peer = ep->base.peer;

    link_del(&ep->lost_link);
    if (!ep->peer_closed)
        ep->peer_closed = peer_bye_pending(tp, peer);
    const bool closed = ep->peer_closed;
    tern_debug("ucx: peer %u %s (%s)", peer, closed ? "closed its endpoint" : "lost",
               ucs_status_string(ep->lost_status));
    ep_notice_close(ep);
    if (ep->peer_mode)
        ep_close_uep(ep);
    link_init(&ops);
    if (ops_take(ep, &ops, TERN_ERR_PEER_LOST, !ep->peer_mode)) {
        ep->linger_until = tern_clock_ns() + CLOSE_WAIT_NS;
        link_add_tail(&tp->linger, &ep->lost_link);
    }
    /* From here the callbacks may destroy ep. */
    ops_complete(&ops);
    event_peer_lost(tp, peer, closed);
}

/* A lost endpoint's puts and gets that UCX has still not finished after
 * CLOSE_WAIT_NS complete anyway. Returns whether it completed any. */
static bool ep_linger_check(ucx_ep_t *ep, uint64_t now)
{
    link_t ops;

    if (link_empty(&ep->ops)) {
        link_del(&ep->lost_link); /* all finished */
        return false;
    }
    if (now < ep->linger_until)
        return false;
    link_del(&ep->lost_link);
    tern_warn("ucx: puts/gets to lost peer %u still unfinished after %llu ms: completed as "
              "TERN_ERR_PEER_LOST, UCX may still touch their buffers",
              ep->base.peer, (unsigned long long)(CLOSE_WAIT_NS / 1000000));
    link_init(&ops);
    ops_take(ep, &ops, TERN_ERR_PEER_LOST, false);
    ops_complete(&ops); /* may destroy ep */
    return true;
}

/* A peer's BYE was delivered: it destroyed its endpoint to us. */
static void peer_left(ucx_tp_t *tp, uint32_t src, bool closed)
{
    bool found = false;

    for (link_t *l = tp->eps.next; l != &tp->eps; l = l->next) {
        ucx_ep_t *ep = link_entry(l, ucx_ep_t, link);
        if (ep->base.peer == src && !ep->destroying) {
            found = true;
            if (!ep->lost) {
                ep_mark_lost(ep, UCS_ERR_CONNECTION_RESET);
                ep->peer_closed = closed;
            }
        }
    }
    if (!found)
        event_peer_lost(tp, src, closed); /* we only received from it: still worth knowing */
}

/* ---- delivery (from progress only) ---- */

/* The peer endpoint behind s is gone (its BYE was delivered, or its notice
 * channel died): nothing more is delivered from it, and our endpoints to that
 * peer are lost. */
static void stream_end(ucx_tp_t *tp, ucx_stream_t *s)
{
    if (s->closed)
        return;
    s->closed = true;
    peer_left(tp, s->src, s->bye);
}

static void entry_deliver(ucx_tp_t *tp, ucx_entry_t *e)
{
    tern_event_t ev = {.src = e->src, .imm = e->imm};

    if (e->status != TERN_OK) {
        ev.type = TERN_EVENT_ERROR;
        ev.status = e->status;
        tern__tp_event(&tp->base, &ev);
        return;
    }
    switch (e->type) {
    case MSG_SEND:
        ev.type = TERN_EVENT_RECV;
        ev.data = e->data;
        ev.len = (size_t)e->len;
        break;
    case MSG_PUT_IMM:
        ev.type = TERN_EVENT_PUT_IMM;
        ev.len = (size_t)e->len;
        break;
    case MSG_ACCESS:
        ev.type = TERN_EVENT_ERROR;
        ev.status = TERN_ERR_ACCESS;
        ev.imm = (e->flags & MSGF_IMM) ? e->imm : 0;
        ev.len = (size_t)e->len;
        tern_debug("ucx: peer %u's %s of %llu bytes on a region here was refused", e->src,
                   (e->flags & MSGF_GET) ? "get" : "put", (unsigned long long)e->len);
        break;
    case MSG_BYE:
        stream_end(tp, e->stream);
        return;
    default:
        return;
    }
    tern__tp_event(&tp->base, &ev);
}

/* Deliver what is in order in s (all that arrived whole, in order, once the
 * stream is dead). Returns the number of entries consumed. */
static int stream_deliver(ucx_tp_t *tp, ucx_stream_t *s)
{
    int n = 0;

    while (!s->closed) {
        ucx_entry_t *e =
            link_empty(&s->entries) ? NULL : link_entry(s->entries.next, ucx_entry_t, link);
        if (s->dead) {
            if (e == NULL) {
                stream_end(tp, s);
                break;
            }
            s->expected = e->seq; /* gaps will not be filled */
            if (!e->ready)
                entry_abandon(e);
        }
        if ((e == NULL || e->seq != s->expected) && stream_canceled(s, s->expected)) {
            s->expected++; /* canceled by the sender and not arrived: skip it */
            continue;
        }
        if (e == NULL || e->seq != s->expected || !e->ready)
            break;
        s->expected++;
        n++;
        link_del(&e->link);
        e->in_stream = false;
        if (e->req != NULL) { /* abandoned while UCX still writes into it */
            link_add_tail(&tp->orphan_entries, &e->link);
            continue;
        }
        if (!e->dropped)
            entry_deliver(tp, e); /* user callbacks: may destroy endpoints */
        entry_free(tp, e);
    }
    return n;
}

/* ---- the notice channel ----
 *
 * Shared-memory transports in UCX 1.13 cannot detect a peer's failure, and an
 * AM sent to a peer that is not progressing can wait behind a full FIFO until
 * the sender's worker is gone. So endpoints without UCX peer error handling
 * (only ever to peers on this host) also connect to the peer's notice
 * listener, an abstract unix SOCK_SEQPACKET socket named in its address: the
 * BYE goes there (it cannot be held up), and a channel that hangs up without
 * a BYE means the peer's process or transport is gone.
 */

static socklen_t notice_name(struct sockaddr_un *sa, uint32_t pid, uint64_t key)
{
    int n;

    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    n = snprintf(sa->sun_path + 1, sizeof(sa->sun_path) - 1, "tern-ucx-%u-%016llx", pid,
                 (unsigned long long)key);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static int watch_add(ucx_tp_t *tp, int fd, watch_t *w)
{
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = w};
    return epoll_ctl(tp->epfd, EPOLL_CTL_ADD, fd, &ev);
}

static void watch_close(ucx_tp_t *tp, int fd)
{
    epoll_ctl(tp->epfd, EPOLL_CTL_DEL, fd, NULL);
    close(fd);
}

/* Open the listener peers' NONE-mode endpoints connect to. Without it (no
 * AF_UNIX, a name clash) those peers only get the BYE by AM. */
static void notice_listen(ucx_tp_t *tp)
{
    struct sockaddr_un sa;
    socklen_t len = notice_name(&sa, (uint32_t)getpid(), tp->notice_key);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

    tp->lwatch.kind = WATCH_LISTENER;
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, len) != 0 || listen(fd, 128) != 0 ||
        watch_add(tp, fd, &tp->lwatch) != 0) {
        tern_debug("ucx: no notice listener (%s): shared-memory peers learn of our close by AM "
                   "only",
                   strerror(errno));
        if (fd >= 0)
            close(fd);
        return;
    }
    tp->lfd = fd;
}

static void notice_fill(uint8_t *d, uint8_t type, uint32_t src, uint32_t conn, uint32_t seq,
                        uint32_t n)
{
    d[0] = type;
    d[1] = WIRE_VERSION;
    tern__put_le16(d + 2, 0);
    tern__put_le32(d + 4, src);
    tern__put_le32(d + 8, conn);
    tern__put_le32(d + 12, seq);
    tern__put_le32(d + 16, n);
}

/* One datagram from a notice socket into d[0..cap): its length; 0 when
 * nothing waits; -1 once the socket has hung up or broken. */
static ssize_t notice_recv(int fd, uint8_t *d, size_t cap)
{
    for (;;) {
        ssize_t r = recv(fd, d, cap, MSG_DONTWAIT);
        if (r > 0)
            return r;
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        return -1;
    }
}

/* ---- puts and gets to a peer on this host ----
 *
 * UCX 1.13 runs ucp_put_nbx and ucp_get_nbx between processes on one host as
 * AMs (its cma transport offers only zero-copy RMA, and UCP's RMA lanes need
 * the buffered kind): two copies through the shared-memory FIFO, the target's
 * CPU making one of them in its own progress. A 2-rank all_reduce spent half
 * its time there (docs/perf.md). An endpoint whose notice channel is up knows
 * its peer's process, as the kernel names it to us (SO_PEERCRED, so another
 * pid namespace cannot mislead it), and copies the bytes itself with
 * process_vm_readv/writev: one copy, made by the initiator, as an RC NIC's
 * read or write would. It is synchronous: the data is in place when the
 * call returns. From TERN_UCX_CMA bytes (256 KiB by default; Open MPI's
 * vader copies by cma too); on some hosts the kernel's walk of the peer's
 * pages costs more than UCX's two copies from cache, and TERN_UCX_CMA=0
 * leaves everything to UCX there (docs/transport-ucx.md). */

/* Use cma_copy on ep if the peer process behind its notice channel fd is
 * known and ours to reach. */
static void cma_attach(ucx_ep_t *ep, int fd)
{
    struct ucred cr;
    socklen_t len = sizeof(cr);

    if (ep->tp->cma_min == 0)
        return;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0 || cr.pid <= 0 ||
        cr.uid != geteuid()) {
        tern_debug("ucx: peer %u's process is not known: its puts and gets go through UCX",
                   ep->base.peer);
        return;
    }
    ep->cma_pid = cr.pid;
}

/* Copy len bytes between our buf and raddr in the peer's memory. Returns
 * TERN_OK, TERN_ERR_UNSUPPORTED where the kernel refuses cross-process access
 * (the caller goes through UCX from then on), or the failure. */
static tern_status_t cma_copy(ucx_ep_t *ep, void *buf, size_t len, uint64_t raddr, bool write)
{
    const char *what = write ? "tern_ep_put" : "tern_ep_get";
    const char *call = write ? "process_vm_writev" : "process_vm_readv";
    size_t done = 0;

    while (done < len) {
        struct iovec l = {(uint8_t *)buf + done, len - done};
        struct iovec r = {(void *)(uintptr_t)(raddr + done), len - done};
        ssize_t n = write ? process_vm_writev(ep->cma_pid, &l, 1, &r, 1, 0)
                          : process_vm_readv(ep->cma_pid, &l, 1, &r, 1, 0);
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        if (n == 0)
            errno = EFAULT; /* nothing moved and no error: the range ends in a hole */
        if (errno == EINTR)
            continue;
        switch (errno) {
        case EPERM:
        case ENOSYS:
            tern_info("ucx: %s to peer %u (pid %d) refused (%s): its puts and gets go through UCX",
                      call, ep->base.peer, (int)ep->cma_pid, strerror(errno));
            ep->cma_pid = 0;
            return TERN_ERR_UNSUPPORTED;
        case ESRCH:
            return tern__error(TERN_ERR_PEER_LOST, "%s: peer %u's process (pid %d) is gone", what,
                               ep->base.peer, (int)ep->cma_pid);
        case ENOMEM:
            return tern__error(TERN_ERR_NO_MEMORY, "%s: %s of %zu bytes: %s", what, call, len,
                               strerror(errno));
        default:
            return tern__error(TERN_ERR_ACCESS,
                               "%s: %zu bytes at %#llx on peer %u: %zu copied, then %s (a region "
                               "its owner has unregistered, or a bad local buffer)",
                               what, len, (unsigned long long)raddr, ep->base.peer, done,
                               strerror(errno));
        }
    }
    return TERN_OK;
}

/* Whether a put or get of len bytes on ep goes by cma_copy: TERN_UCX_CMA
 * bytes or more (0: never). Small ones are served through the FIFO where it
 * is on: two copies on two CPUs, asynchronous, beat one on the initiator's
 * when the target has a CPU to spare (docs/transport-ucx.md). */
static bool cma_usable(const ucx_ep_t *ep, const ucx_rkey_t *rk, size_t len,
                       const tern_op_params_t *params)
{
    return cma_takes(ep, len) && rk->host && mem_type_of(params) == UCS_MEMORY_TYPE_HOST;
}

/* Whether a host-memory put or get that cma_copy did not take goes as tern
 * AMs the target answers (serve_get, serve_put). Shared memory too: UCX's
 * own answers there read a raw address with no check, whatever its region
 * has become, and crash its purge at close (docs/transport-ucx.md). */
static bool served_takes(const ucx_ep_t *ep, const ucx_rkey_t *rk,
                         const tern_op_params_t *params)
{
    return ep->tp->served_rma && rk->host && mem_type_of(params) == UCS_MEMORY_TYPE_HOST;
}

/* Whether err, from the connect or the HELLO of a notice channel, says the
 * peer's transport is gone. Its listener's name goes with its process
 * (refused, no such name); and a connect only queues the channel in the
 * listener's backlog, so a peer that goes right after it resets the queued
 * channel and the HELLO fails (a broken pipe, or a reset). The peer is then
 * lost, not merely unreachable this way: with no channel, a peer on shared
 * memory that is gone would never be heard of again (p2p_ucx_lost_noconn
 * under the sanitizer once waited its 30 s for a receive from such a rank). */
static bool notice_peer_gone(int err)
{
    return err == ECONNREFUSED || err == ENOENT || err == EPIPE || err == ECONNRESET ||
           err == ENOTCONN;
}

/* The HELLO of a new channel; tests may make the next one fail with an errno
 * of their choosing (tern__ucx_fail_next_hello). */
static int notice_hello(ucx_tp_t *tp, int fd, const uint8_t *hello, size_t len)
{
    if (tp->hello_errno != 0) {
        errno = tp->hello_errno;
        tp->hello_errno = 0;
        return -1;
    }
    ssize_t n = send(fd, hello, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n == (ssize_t)len)
        return 0;
    if (n >= 0)
        errno = EMSGSIZE; /* a datagram goes whole or not at all */
    return -1;
}

/* Connect ep's notice channel to the peer's listener and say which endpoint it is. */
static void ep_notice_connect(ucx_ep_t *ep, uint32_t pid, uint64_t key)
{
    ucx_tp_t *tp = ep->tp;
    struct sockaddr_un sa;
    socklen_t len = notice_name(&sa, pid, key);
    uint8_t hello[NOTICE_HDR_LEN];
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

    notice_fill(hello, NOTICE_HELLO, tp->base.self_id, ep->conn, 0, 0);
    ep->nwatch.kind = WATCH_EP;
    int rc = fd >= 0 ? connect(fd, (struct sockaddr *)&sa, len) : -1;
    if (rc == 0)
        rc = notice_hello(tp, fd, hello, sizeof(hello));
    if (fd >= 0 && rc != 0 && notice_peer_gone(errno)) {
        tern_debug("ucx: peer %u's notice listener is gone (%s): it is lost", ep->base.peer,
                   strerror(errno));
        close(fd);
        ep_mark_lost(ep, UCS_ERR_UNREACHABLE);
        return;
    }
    if (fd < 0 || rc != 0 || watch_add(tp, fd, &ep->nwatch) != 0) {
        tern_debug("ucx: no notice channel to peer %u (%s): its failure goes undetected",
                   ep->base.peer, strerror(errno));
        if (fd >= 0)
            close(fd);
        return;
    }
    ep->nfd = fd;
    cma_attach(ep, fd);
}

/* Send one datagram on ep's notice channel, waiting (poll) until deadline
 * for room: a peer that has not read its channel yet must still get every
 * canceled range. */
static bool notice_send(ucx_ep_t *ep, const uint8_t *d, size_t len, uint64_t deadline)
{
    for (;;) {
        ssize_t r = send(ep->nfd, d, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r == (ssize_t)len)
            return true;
        if (r < 0 && errno == EINTR)
            continue;
        const uint64_t now = tern_clock_ns();
        if (r >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK) || now >= deadline)
            return false;
        struct pollfd pfd = {.fd = ep->nfd, .events = POLLOUT};
        const uint64_t ms = (deadline - now + 999999) / 1000000;
        if (poll(&pfd, 1, ms > 1000 ? 1000 : (int)ms) < 0 && errno != EINTR)
            return false;
    }
}

/* Send ep's BYE on its notice channel: the next seq, and the n ranges of seqs
 * it cancels (wire form), NOTICE_MAX_RANGES to a datagram, those before the
 * last as NOTICE_CANCEL. Returns whether all went: then the peer answers with
 * NOTICE_ACK once it has applied them (ep_notice_read). */
static bool ep_notice_bye(ucx_ep_t *ep, const uint8_t *ranges, size_t n, uint64_t deadline)
{
    uint8_t *d =
        malloc(NOTICE_HDR_LEN + RANGE_LEN * (n < NOTICE_MAX_RANGES ? n : NOTICE_MAX_RANGES));
    size_t at = 0;
    bool ok = true;

    if (d == NULL) {
        tern_warn("ucx: no memory for the BYE to peer %u: its hang-up alone tells it",
                  ep->base.peer);
        return false;
    }
    do {
        const size_t k = n - at < NOTICE_MAX_RANGES ? n - at : NOTICE_MAX_RANGES;
        const bool last = at + k == n;
        notice_fill(d, last ? NOTICE_BYE : NOTICE_CANCEL, ep->tp->base.self_id, ep->conn,
                    ep->tx_seq, (uint32_t)k);
        if (k > 0)
            memcpy(d + NOTICE_HDR_LEN, ranges + RANGE_LEN * at, RANGE_LEN * k);
        ok = notice_send(ep, d, NOTICE_HDR_LEN + RANGE_LEN * k, deadline);
        at += k;
    } while (ok && at < n);
    if (!ok && n > 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        tern_warn("ucx: peer %u does not read its notice channel: the BYE did not fit in "
                  "%llu ms, and it may deliver sends completed here as canceled",
                  ep->base.peer, (unsigned long long)(BYE_WAIT_NS / 1000000));
    else if (!ok) /* the peer is gone (EPIPE): it delivers nothing more anyway */
        tern_debug("ucx: BYE to peer %u not sent on its notice channel: %s", ep->base.peer,
                   strerror(errno));
    free(d);
    return ok;
}

/* Read what the peer's listener end says on ep's notice channel: the answer
 * to our BYE (NOTICE_ACK: sets ep->ack_seq, clears ep->ack_wait) and
 * NOTICE_GONE as its transport closes on purpose (sets ep->peer_closed: it
 * may never have had an endpoint to us to say BYE on; and tp->peer_unread
 * if it left its worker in place). Returns false once the channel has hung
 * up or broken, which ends an ACK wait too. */
static bool ep_notice_read(ucx_ep_t *ep)
{
    uint8_t d[NOTICE_HDR_LEN];

    for (;;) {
        ssize_t r = notice_recv(ep->nfd, d, sizeof(d));
        if (r == 0)
            return true;
        if (r < 0) {
            ep->ack_wait = false; /* no answer will come */
            return false;
        }
        if (r != (ssize_t)NOTICE_HDR_LEN || d[1] != WIRE_VERSION ||
            tern__get_le32(d + 8) != ep->conn)
            continue;
        if (d[0] == NOTICE_ACK && ep->ack_wait) {
            ep->ack_wait = false;
            ep->acked = true;
            ep->ack_seq = tern__get_le32(d + 12);
        } else if (d[0] == NOTICE_GONE && tern__get_le32(d + 4) == ep->base.peer) {
            ep->peer_closed = true;
            if (tern__get_le32(d + 12) == GONE_PARKED && !ep->tp->peer_unread) {
                tern_debug("ucx: peer %u closed leaving its UCX worker in place", ep->base.peer);
                ep->tp->peer_unread = true;
            }
        }
    }
}

static void ep_notice_close(ucx_ep_t *ep)
{
    if (ep->nfd >= 0) {
        ep_notice_read(ep); /* a GONE there still counts (tp->peer_unread) */
        watch_close(ep->tp, ep->nfd);
    }
    ep->nfd = -1;
}

/* A BYE (or its CANCEL ahead of it) that came by the notice channel: apply
 * its ranges to the stream and, for the BYE, file it like the AM. Returns
 * the stream, NULL without memory. */
static ucx_stream_t *notice_bye(ucx_tp_t *tp, bool bye, uint32_t src, uint32_t conn, uint32_t seq,
                                const uint8_t *list, size_t n)
{
    ucx_stream_t *s = stream_get(tp, src, conn);
    ucx_entry_t *e;

    if (s == NULL || s->closed || seq_before(seq, s->expected) || stream_lookup(s, seq) != NULL)
        return s;
    bye_apply(s, list, n, false);
    if (!bye)
        return s;
    s->bye = true;
    if ((e = entry_new(tp)) == NULL) {
        s->dead = true; /* cannot keep the BYE's place: end the stream with what it has */
        stream_dirty(tp, s);
        return s;
    }
    e->type = MSG_BYE;
    e->src = src;
    e->seq = seq;
    e->ready = true;
    stream_insert(s, e);
    stream_dirty(tp, s);
    return s;
}

/* A channel's HELLO (d, a checked notice) names the peer endpoint it is from. */
static void notice_take_hello(notice_conn_t *c, const uint8_t *d)
{
    c->hello = true;
    c->src = tern__get_le32(d + 4);
    c->conn = tern__get_le32(d + 8);
}

/* A peer on this host died (its notice channel hung up unannounced). What our
 * UCX still queues for it (answers to its gets waiting for room in its FIFO)
 * will never be read, and UCX 1.13 cannot purge those answers at our close
 * without crashing (docs/transport-ucx.md, "Known UCX 1.13 faults"): our
 * worker is parked at close instead, as when a peer says it parked. */
static void peer_died(ucx_tp_t *tp, uint32_t peer)
{
    if (tp->peer_unread)
        return;
    tern_debug("ucx: peer %u died: this transport's UCX worker will be parked at close", peer);
    tp->peer_unread = true;
}

/* Read what a peer endpoint's channel carries; on hang-up close it, and if
 * no BYE came, the peer died: its stream is dead. Returns what it handled. */
static int notice_conn_read(ucx_tp_t *tp, notice_conn_t *c)
{
    uint8_t d[NOTICE_HDR_LEN + RANGE_LEN * NOTICE_MAX_RANGES];
    int n = 0;

    for (;;) {
        ssize_t r = notice_recv(c->fd, d, sizeof(d));
        if (r == 0)
            return n;
        if (r < 0)
            break; /* hung up */
        n++;
        if ((size_t)r < NOTICE_HDR_LEN || d[1] != WIRE_VERSION ||
            tern__get_le32(d + 16) > NOTICE_MAX_RANGES ||
            (size_t)r != NOTICE_HDR_LEN + RANGE_LEN * (size_t)tern__get_le32(d + 16)) {
            tern_warn("ucx: malformed notice (%zd bytes) dropped", r);
            continue;
        }
        if (d[0] == NOTICE_HELLO && !c->hello) {
            notice_take_hello(c, d);
        } else if ((d[0] == NOTICE_BYE || d[0] == NOTICE_CANCEL) && c->hello && !c->bye &&
                   tern__get_le32(d + 4) == c->src && tern__get_le32(d + 8) == c->conn) {
            const bool bye = d[0] == NOTICE_BYE;
            ucx_stream_t *s = notice_bye(tp, bye, c->src, c->conn, tern__get_le32(d + 12),
                                         d + NOTICE_HDR_LEN, tern__get_le32(d + 16));
            if (!bye)
                continue;
            c->bye = true;
            /* Tell the sender where delivery stopped: what it listed before
             * that was delivered (it completes those as sent), nothing from
             * there on will be. Messages in the fast lane have their seqs
             * consumed already and are delivered by the next drain. */
            uint8_t ack[NOTICE_HDR_LEN];
            notice_fill(ack, NOTICE_ACK, tp->base.self_id, c->conn, s != NULL ? s->expected : 0, 0);
            if (s != NULL &&
                send(c->fd, ack, sizeof(ack), MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof(ack))
                tern_debug("ucx: answer to peer %u's BYE not sent: %s", c->src, strerror(errno));
        } else {
            tern_warn("ucx: unexpected notice %u dropped", d[0]);
        }
    }
    if (c->hello && !c->bye) {
        ucx_stream_t *s = stream_get(tp, c->src, c->conn);
        tern_debug("ucx: peer %u's endpoint hung up without a BYE: it is gone", c->src);
        peer_died(tp, c->src);
        if (s != NULL) {
            s->dead = true;
            stream_dirty(tp, s);
        }
    }
    link_del(&c->link);
    watch_close(tp, c->fd);
    free(c);
    return n + 1;
}

static int notice_accept(ucx_tp_t *tp)
{
    int n = 0;

    for (;;) {
        int fd = accept4(tp->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        notice_conn_t *c;
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                tern_warn("ucx: accept on the notice listener: %s", strerror(errno));
            return n;
        }
        /* Abstract sockets have no permissions: only our own user may say a peer left. */
        struct ucred cred;
        socklen_t clen = sizeof(cred);
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0 || cred.uid != getuid()) {
            tern_warn("ucx: notice connection from another user refused");
            close(fd);
            continue;
        }
        if ((c = calloc(1, sizeof(*c))) == NULL) {
            close(fd);
            continue;
        }
        c->watch.kind = WATCH_CONN;
        c->fd = fd;
        if (watch_add(tp, fd, &c->watch) != 0) {
            close(fd);
            free(c);
            continue;
        }
        link_add_tail(&tp->notice_conns, &c->link);
        /* Read it now: a peer that closes connects, says BYE and hangs up
         * ours in a moment, and notice_poll reads its BYE before our loss. */
        n += 1 + notice_conn_read(tp, c);
    }
}

/* Look at the notice sockets. Runs no user callback: what it finds is
 * delivered by drain(). */
static int notice_poll(ucx_tp_t *tp)
{
    struct epoll_event evs[32];
    int n, handled = 0;

    tp->notice_due = false;
    tp->notice_next = tern__clock_coarse_ns() + NOTICE_POLL_NS;
    n = epoll_wait(tp->epfd, evs, 32, 0);
    /* Two passes: a peer that closes says BYE on its channel to us before
     * its end of ours hangs up, so what the peer's channels carry is read
     * first (the loss of ours then knows it was on purpose). */
    for (int i = 0; i < n; i++) {
        watch_t *w = evs[i].data.ptr;
        if (w->kind != WATCH_EP)
            evs[i].data.ptr = NULL; /* handled now (a hung-up channel is freed) */
        switch (w->kind) {
        case WATCH_EP:
            break; /* the second pass */
        case WATCH_UCX:
            break; /* ucp_worker_progress is called anyway */
        case WATCH_TIMER: {
            uint64_t ticks;
            if (read(tp->tfd, &ticks, sizeof(ticks)) < 0 && errno != EAGAIN)
                tern_debug("ucx: read of the linger timer: %s", strerror(errno));
            break; /* drain looks at tp->linger */
        }
        case WATCH_LISTENER:
            handled += notice_accept(tp);
            break;
        case WATCH_CONN:
            handled += notice_conn_read(tp, link_entry(w, notice_conn_t, watch));
            break;
        }
    }
    for (int i = 0; i < n; i++) {
        watch_t *w = evs[i].data.ptr;
        /* The listener end writes only the answer to our BYE, which
         * teardown reads itself, and NOTICE_GONE as it closes: any event
         * is the peer going away, on purpose if it said so. */
        ucx_ep_t *ep = w != NULL ? link_entry(w, ucx_ep_t, nwatch) : NULL;
        if (ep == NULL || ep->destroying)
            continue;
        ep_notice_read(ep); /* a NOTICE_GONE says it was on purpose */
        tern_debug("ucx: the notice channel to peer %u %s", ep->base.peer,
                   ep->peer_closed ? "says it closes" : "hung up");
        if (!ep->peer_closed)
            peer_died(tp, ep->base.peer);
        ep_notice_close(ep);
        ep_mark_lost(ep, UCS_ERR_CONNECTION_RESET);
        handled++;
    }
    if (n == (int)(sizeof(evs) / sizeof(evs[0])))
        tp->notice_due = true;
    return handled;
}

/* ---- progress ---- */

/* Free what was kept of an endpoint whose UCP close has finished. */
static void zombie_free(ucx_ep_t *ep)
{
    link_del(&ep->link);
    for (size_t i = 0; i < ep->nzukeys; i++)
        ucp_rkey_destroy(ep->zukeys[i]);
    free(ep->zukeys);
    free(ep);
}

/* Free the zombies whose UCP close has finished; whether none is left. */
static bool zombies_reap(ucx_tp_t *tp)
{
    for (link_t *l = tp->zombie_eps.next; l != &tp->zombie_eps;) {
        ucx_ep_t *ep = link_entry(l, ucx_ep_t, link);
        l = l->next;
        if (ep_closed(ep))
            zombie_free(ep);
    }
    return link_empty(&tp->zombie_eps);
}

/* Deliver what the UCX callbacks recorded: lost peers, finished operations,
 * arrived messages. Returns how much it handled. */
static int drain(ucx_tp_t *tp)
{
    int n = 0;

    zombies_reap(tp);
    while (!link_empty(&tp->lost)) {
        ep_handle_lost(tp, link_entry(tp->lost.next, ucx_ep_t, lost_link));
        n++;
    }
    if (!link_empty(&tp->linger)) {
        const uint64_t now = tern_clock_ns();
        for (link_t *l = tp->linger.next; l != &tp->linger;) {
            ucx_ep_t *ep = link_entry(l, ucx_ep_t, lost_link);
            l = l->next;
            if (ep_linger_check(ep, now)) {
                n++;
                break; /* callbacks ran: the list may have changed; the rest next time */
            }
        }
    }
    while (!link_empty(&tp->refusals)) {
        refusal_t *f = link_entry(tp->refusals.next, refusal_t, link);
        tern_event_t ev = {.type = TERN_EVENT_ERROR,
                           .src = f->src,
                           .status = TERN_ERR_ACCESS,
                           .imm = (f->flags & MSGF_IMM) ? f->imm : 0,
                           .len = (size_t)f->len};
        link_del(&f->link);
        free(f);
        n++;
        tern__tp_event(&tp->base, &ev);
    }
    while (!link_empty(&tp->done)) {
        ucx_op_t *op = link_entry(tp->done.next, ucx_op_t, dlink);
        tern__comp_t comp;
        tern_status_t st;

        link_del(&op->dlink);
        op->in_done = false;
        n++;
        if (!op_advance(op))
            continue; /* its next stage is posted */
        st = op_status(op);
        comp = op->comp;
        ucx_ep_t *ep = op->kind == OP_PUT && op->nx > 0 ? op->ep : NULL;
        op_free(op);
        if (ep != NULL && ep->nblock > 0)
            ep_release(ep); /* a put with immediate may have waited for this one's data */
        tern__comp_call(&comp, st);
    }
    /* The lane before the streams (am_cb). The slot being delivered is not
     * reused while its callback runs: a teardown inside it may progress UCX
     * and so fill the lane, but never past FAST_SLOTS - 1. */
    while (tp->nfast > 0) {
        const fast_msg_t *f = &tp->fast[tp->fast_head];
        tern_event_t ev = {
            .type = TERN_EVENT_RECV, .src = f->src, .imm = f->imm, .data = f->data, .len = f->len};
        tp->fast_head = (tp->fast_head + 1) % FAST_SLOTS;
        tp->nfast--;
        n++;
        tern__tp_event(&tp->base, &ev);
    }
    while (!link_empty(&tp->dirty)) {
        ucx_stream_t *s = link_entry(tp->dirty.next, ucx_stream_t, dirty_link);
        link_del(&s->dirty_link);
        n += stream_deliver(tp, s);
    }
    return n;
}

static int ucx_progress(tern_transport_t *btp)
{
    ucx_tp_t *tp = to_ucx_tp(btp);
    int total = 0;

    if (tp->in_progress)
        return 0; /* called from a callback: the contract forbids it; do no harm */
    tp->in_progress = true;
    if (tp->notice_due || tern__clock_coarse_ns() >= tp->notice_next)
        total += notice_poll(tp);
    /* Once something was delivered or completed, return: the caller's wait
     * may be over, and another round of UCX's polling would delay it. */
    for (int round = 0; round < PROGRESS_ROUNDS; round++) {
        int polled = (int)ucp_worker_progress(tp->worker), handled = drain(tp);
        total += polled + handled;
        if (polled == 0 || handled > 0)
            break;
    }
    tp->in_progress = false;
    return total;
}

static int ucx_fd(const tern_transport_t *btp)
{
    const ucx_tp_t *tp = to_ucx_tp(btp);
    return tp->efd >= 0 ? tp->epfd : -1;
}

static bool has_pending_work(const ucx_tp_t *tp)
{
    return !link_empty(&tp->lost) || !link_empty(&tp->done) || !link_empty(&tp->dirty) ||
           tp->nfast > 0;
}

/* Set the timer in the transport's fd for the earliest end of a lost
 * peer's linger (none: disarmed). Returns false when one has ended already:
 * there is work for progress now. */
static bool linger_timer_arm(ucx_tp_t *tp)
{
    struct itimerspec its;
    uint64_t first = UINT64_MAX;

    for (const link_t *l = tp->linger.next; l != &tp->linger; l = l->next) {
        const ucx_ep_t *ep = link_entry(l, const ucx_ep_t, lost_link);
        if (ep->linger_until < first)
            first = ep->linger_until;
    }
    if (first != UINT64_MAX && first <= tern_clock_ns())
        return false;
    if (first == UINT64_MAX && !tp->timer_set)
        return true;              /* the common case: no syscall */
    memset(&its, 0, sizeof(its)); /* zero: disarmed */
    if (first != UINT64_MAX) {
        /* tern_clock_ns is CLOCK_MONOTONIC, as the timer's clock. */
        its.it_value.tv_sec = (time_t)(first / 1000000000u);
        its.it_value.tv_nsec = (long)(first % 1000000000u);
    }
    if (timerfd_settime(tp->tfd, TFD_TIMER_ABSTIME, &its, NULL) != 0) {
        tern_warn("ucx: timerfd_settime: %s: a sleeper may wake late for a lost peer",
                  strerror(errno));
        return first == UINT64_MAX; /* rather no sleep than a sleep with no end */
    }
    tp->timer_set = first != UINT64_MAX;
    return true;
}

static tern_status_t ucx_arm(tern_transport_t *btp)
{
    ucx_tp_t *tp = to_ucx_tp(btp);
    ucs_status_t st;

    if (tp->efd < 0)
        return tern__error(TERN_ERR_UNSUPPORTED, "ucx: busy-poll mode has no fd to arm");
    if (has_pending_work(tp) || !linger_timer_arm(tp))
        return TERN_ERR_NO_RESOURCE;
    st = ucp_worker_arm(tp->worker);
    if (st == UCS_ERR_BUSY)
        return TERN_ERR_NO_RESOURCE;
    if (st != UCS_OK)
        return tern__error(status_of(st), "ucp_worker_arm: %s", ucs_status_string(st));
    tp->notice_due = true; /* after the sleep, look at the notice sockets first */
    {
        struct epoll_event ev;
        if (epoll_wait(tp->epfd, &ev, 1, 0) > 0)
            return TERN_ERR_NO_RESOURCE; /* a notice socket (or UCX) has something already */
    }
    return TERN_OK;
}

/* ---- teardown of endpoints ---- */

/* UCX's complaints where tern expects them go to tern's debug log instead of
 * stderr: while ep_create probes for peer failure support (an ERROR line per
 * attempt where transports lack it), while endpoints are torn down (a BYE to
 * a peer already gone: "connection refused"), and while a worker with
 * requests tern gave up on is destroyed. UCX's handler stack is process-wide;
 * tern pushes and pops around calls on the thread that owns the transport. */
static ucs_log_func_rc_t quiet_log(const char *file, unsigned line, const char *function,
                                   ucs_log_level_t level,
                                   const ucs_log_component_config_t *comp_conf, const char *message,
                                   va_list ap)
{
    char text[256];

    (void)file;
    (void)line;
    (void)function;
    (void)comp_conf;
    if (level > UCS_LOG_LEVEL_WARN)
        return UCS_LOG_FUNC_RC_CONTINUE; /* UCX's own handler filters by its level */
    vsnprintf(text, sizeof(text), message, ap);
    tern_debug("ucx: UCX says: %s", text);
    return UCS_LOG_FUNC_RC_STOP;
}

/* UCX's remote keys live in the worker and are unpacked for one UCP
 * endpoint: destroy them with it. The tern keys stay until the user releases
 * them (that needs no live endpoint), now without a UCX key. */
static void rkeys_detach(ucx_ep_t *ep)
{
    while (!link_empty(&ep->rkeys)) {
        ucx_rkey_t *rk = link_entry(ep->rkeys.next, ucx_rkey_t, link);
        link_del(&rk->link);
        if (rk->ukey == NULL)
            continue;
        if (ep->zombie) {
            /* Requests still running may use it: destroyed with the zombie. */
            ucp_rkey_h *z = realloc(ep->zukeys, (ep->nzukeys + 1) * sizeof(*z));
            if (z != NULL) {
                ep->zukeys = z;
                ep->zukeys[ep->nzukeys++] = rk->ukey;
                rk->ukey = NULL;
                continue;
            }
        }
        ucp_rkey_destroy(rk->ukey);
        rk->ukey = NULL;
    }
}

static bool ep_ops_settled(const ucx_ep_t *ep)
{
    for (const link_t *l = ep->ops.next; l != &ep->ops; l = l->next) {
        const ucx_op_t *op = link_entry(l, const ucx_op_t, link);
        if (op->pending > 0 || op->awaiting)
            return false;
    }
    return true;
}

/* Teardown may stop waiting for ep: UCX has let go of its ops (and, with
 * peer error handling, closed it), and the peer has answered our BYE or
 * cannot. */
static bool ep_quiet(ucx_ep_t *ep)
{
    if (ep->ack_wait)
        ep_notice_read(ep);
    return ep_ops_settled(ep) && (!ep->peer_mode || ep_closed(ep)) && !ep->ack_wait;
}

/* Which of ep's canceled ops the peer has (or will have) all the same, so
 * that they complete as sent, not as canceled: with a BYE by the notice
 * channel, those before where the peer's answer says delivery stopped (none
 * without an answer: the peer drops all it had not delivered when it reads
 * the BYE, which its progress does before anything else once a millisecond
 * has passed); with a BYE by AM, which travels behind them, those UCX has
 * finished sending. */
static void ep_sent_mark(ucx_ep_t *ep)
{
    for (link_t *l = ep->ops.next; l != &ep->ops; l = l->next) {
        ucx_op_t *op = link_entry(l, ucx_op_t, link);
        if (!op->listed)
            continue;
        if (ep->bye_notice)
            op->sent = ep->acked && seq_before(op->seq, ep->ack_seq);
        else
            op->sent = op->in_done && op->ustatus == UCS_OK;
    }
}

/*
 * Destroy n endpoints together (one for tern_ep_destroy, all for close):
 *  1. every op still in flight is canceled; a BYE listing the canceled
 *     messages goes to each peer still there; wait (bounded) for the BYEs;
 *  2. close the UCP endpoints; wait (bounded) for the closes and for UCX to
 *     let go of the ops' requests;
 *  3. complete the ops (TERN_ERR_CANCELED for the canceled, but as sent
 *     those the peer has: ep_sent_mark), then free the endpoints (one whose
 *     close has not finished is kept as a zombie until it has, or until the
 *     worker goes).
 * Internal progress only records; no user callback runs before step 3.
 */
static void eps_shutdown(ucx_tp_t *tp, ucx_ep_t **eps, size_t n)
{
    uint64_t deadline;
    link_t ops;

    ucs_log_push_handler(quiet_log);
    deadline = tern_clock_ns() + BYE_WAIT_NS;
    for (size_t i = 0; i < n; i++) {
        ucx_ep_t *ep = eps[i];
        uint8_t *ranges = NULL; /* wire form: u32 first, u32 count */
        size_t nr = 0, cap = 0;
        bool listing = true;

        ep->destroying = true;
        link_del(&ep->lost_link);
        for (link_t *l = ep->ops.next; l != &ep->ops; l = l->next) {
            ucx_op_t *op = link_entry(l, ucx_op_t, link);
            if (op->in_done && !(op->kind == OP_PUT_IMM && op->stage == 0))
                continue; /* finished in UCX: completes with its own status */
            op->canceled = true;
            get_unlist(op); /* its replies, if any come, are dropped */
            if (!listing || !op->has_seq || op->pending == 0)
                continue;
            op->listed = true;
            if (nr > 0 && op->seq == tern__get_le32(ranges + RANGE_LEN * (nr - 1)) +
                                         tern__get_le32(ranges + RANGE_LEN * (nr - 1) + 4)) {
                uint8_t *count = ranges + RANGE_LEN * (nr - 1) + 4;
                tern__put_le32(count, tern__get_le32(count) + 1);
                continue;
            }
            if (nr == cap) {
                size_t ncap = cap ? 2 * cap : 8;
                uint8_t *nl = realloc(ranges, ncap * RANGE_LEN);
                if (nl == NULL) {
                    tern_warn("ucx: no memory for the list of canceled sends to peer %u: it may "
                              "deliver some completed here as canceled",
                              ep->base.peer);
                    listing = false;
                    op->listed = false;
                    continue;
                }
                ranges = nl;
                cap = ncap;
            }
            tern__put_le32(ranges + RANGE_LEN * nr, op->seq);
            tern__put_le32(ranges + RANGE_LEN * nr + 4, 1);
            nr++;
        }
        if (ep->uep != NULL && !ep->lost) {
            if (ep->nfd >= 0) {
                ep->bye_notice = true;
                /* An answer is worth waiting for only if there are cancels. */
                ep->ack_wait = ep_notice_bye(ep, ranges, nr, deadline) && nr > 0;
            } else {
                ep->bye =
                    ctrl_post(ep, MSG_BYE, 0, 0, 0, ranges, RANGE_LEN * nr, UCP_AM_SEND_FLAG_EAGER);
                ranges = NULL; /* ctrl_post's now */
            }
        }
        if (!ep->ack_wait)
            ep_notice_close(ep);
        free(ranges);
    }

    /* Nothing frees ops until the end of this function, so the BYE pointers stay valid. */
    for (size_t i = 0; i < n; i++)
        while (eps[i]->bye != NULL && eps[i]->bye->pending > 0 && tern_clock_ns() < deadline)
            ucp_worker_progress(tp->worker);

    /* Wait until UCX lets go of the ops' buffers: a force close purges them at
     * once; a flush close (no peer error handling) finishes them, which may need
     * the peer's progress. A close that finishes later, with no op left in it,
     * holds no buffer of the user's: the endpoint waits as a zombie. The
     * peer's answer to a BYE by the notice channel is waited for in the same
     * time. */
    for (size_t i = 0; i < n; i++)
        ep_close_uep(eps[i]);
    deadline = tern_clock_ns() + CLOSE_WAIT_NS;
    for (size_t i = 0; i < n; i++) {
        ucx_ep_t *ep = eps[i];
        /* A flush close to a peer that is gone would only run out the clock. */
        const bool wait = ep->peer_mode || !ep->lost;
        while (wait && !ep_quiet(ep) && tern_clock_ns() < deadline)
            ucp_worker_progress(tp->worker);
        if (wait && !ep_ops_settled(ep))
            tern_warn("ucx: UCX still holds operations to peer %u after %llu ms (the peer is "
                      "not progressing?): they complete as canceled, UCX may still touch the "
                      "buffers of the larger ones until it finishes them",
                      ep->base.peer, (unsigned long long)(CLOSE_WAIT_NS / 1000000));
        ep_sent_mark(ep);
        ep_notice_close(ep);
        if (!ep_closed(ep))
            ep->zombie = true;
    }
    ucs_log_pop_handler();

    link_init(&ops);
    for (size_t i = 0; i < n; i++) {
        ops_take(eps[i], &ops, TERN_ERR_CANCELED, false);
        rkeys_detach(eps[i]);
    }
    /* The callbacks run while the endpoints still exist: one may destroy its
     * endpoint (a no-op, it is being destroyed: ucx_ep_destroy), or another. */
    ops_complete(&ops);
    for (size_t i = 0; i < n; i++) {
        ucx_ep_t *ep = eps[i];
        link_del(&ep->link);
        if (ep->zombie) /* UCX still uses it (close, error callback, keys): reaped by drain */
            link_add_tail(&tp->zombie_eps, &ep->link);
        else
            free(ep);
    }
}

/* ---- endpoints ---- */

static tern_status_t ucx_ep_create(tern_transport_t *btp, uint32_t peer, const void *addr,
                                   size_t len, tern_ep_t **ep_out)
{
    ucx_tp_t *tp = to_ucx_tp(btp);
    const uint8_t *a = addr;
    ucp_ep_params_t p;
    ucx_ep_t *ep = NULL;
    void *uaddr = NULL;
    uint32_t ulen;
    ucs_status_t st;
    tern_status_t ret = TERN_OK;

    if (len < ADDR_HDR_LEN)
        return tern__error(TERN_ERR_INVALID_PARAM,
                           "ucx: address of %zu bytes is shorter than its %u-byte header", len,
                           ADDR_HDR_LEN);
    if (tern__get_le32(a) != ADDR_MAGIC)
        return tern__error(TERN_ERR_INVALID_PARAM,
                           "ucx: not a ucx address (magic %#x; from another provider?)",
                           tern__get_le32(a));
    if (tern__get_le16(a + 4) != WIRE_VERSION || tern__get_le16(a + 6) != ADDR_HDR_LEN)
        return tern__error(TERN_ERR_INVALID_PARAM,
                           "ucx: address version %u (header %u bytes); this tern speaks %u",
                           tern__get_le16(a + 4), tern__get_le16(a + 6), WIRE_VERSION);
    ulen = tern__get_le32(a + 12);
    if (ulen == 0 || ulen != len - ADDR_HDR_LEN)
        return tern__error(TERN_ERR_INVALID_PARAM,
                           "ucx: address says %u bytes of UCX address, %zu follow (truncated?)",
                           ulen, len - ADDR_HDR_LEN);
    if (addr_checksum(a, ulen) != tern__get_le32(a + 16))
        return tern__error(TERN_ERR_INVALID_PARAM, "ucx: address checksum mismatch (damaged)");
    if (tern__get_le32(a + 8) != peer)
        return tern__error(TERN_ERR_INVALID_PARAM,
                           "ucx: the address belongs to peer %u, not peer %u", tern__get_le32(a + 8),
                           peer);

    if ((ep = calloc(1, sizeof(*ep))) == NULL || (uaddr = malloc(ulen)) == NULL) {
        ret = tern__error(TERN_ERR_NO_MEMORY, "ucx: no memory for an endpoint");
        goto out;
    }
    memcpy(uaddr, a + ADDR_HDR_LEN, ulen); /* aligned for UCX */
    ep->tp = tp;
    ep->base.tp = btp;
    ep->base.peer = peer;
    link_init(&ep->link);
    link_init(&ep->lost_link);
    link_init(&ep->ops);
    link_init(&ep->rkeys);
    ep->nfd = -1;
    ep->conn = (uint32_t)((tp->conn_nonce + tp->next_conn++) * 2654435761u);
    ep->lost_status = UCS_OK;

    memset(&p, 0, sizeof(p));
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                   UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.address = uaddr;
    p.err_handler.cb = ep_err_cb;
    p.err_handler.arg = ep;
    st = UCS_ERR_UNREACHABLE;
    bool none = !tp->peer_mode;
    if (tp->peer_mode) {
        p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
        ucs_log_push_handler(quiet_log);
        st = ucp_ep_create(tp->worker, &p, &ep->uep);
        ucs_log_pop_handler();
        if (st == UCS_OK) {
            ep->peer_mode = true;
        } else if (st == UCS_ERR_UNREACHABLE) {
            tp->peer_mode = false;
            none = true;
            tern_info("ucx: the transports in use cannot detect peer failure "
                      "(UCP_ERR_HANDLING_MODE_PEER unreachable, as with shared memory in UCX "
                      "1.13); endpoints use mode NONE, and tern's notice channel (a unix "
                      "socket to each peer on this host) reports a peer that closes or dies");
        } else if (st == UCS_ERR_UNSUPPORTED) {
            /* UCX 1.13 over shared memory says this, not "unreachable", for an
             * endpoint to a peer that has already connected to us (the
             * first endpoint a rank makes to answer). Only this endpoint
             * falls back: others may still get mode PEER. */
            none = true;
            tern_debug("ucx: endpoint to peer %u: mode PEER unsupported (%s); mode NONE and "
                       "the notice channel", peer, ucs_status_string(st));
        }
    }
    if (none) {
        p.err_mode = UCP_ERR_HANDLING_MODE_NONE;
        p.field_mask &= ~(uint64_t)UCP_EP_PARAM_FIELD_ERR_HANDLER;
        st = ucp_ep_create(tp->worker, &p, &ep->uep);
    }
    if (st != UCS_OK) {
        ret = tern__error(status_of(st) == TERN_ERR_INVALID_PARAM ? TERN_ERR_INVALID_PARAM
                                                                  : TERN_ERR_UNREACHABLE,
                          "ucx: ucp_ep_create to peer %u: %s", peer, ucs_status_string(st));
        goto out;
    }
    if (!ep->peer_mode && (tern__get_le32(a + 20) & ADDR_F_NOTICE))
        ep_notice_connect(ep, tern__get_le32(a + 24), tern__get_le64(a + 32));
    link_add_tail(&tp->eps, &ep->link);
    *ep_out = &ep->base;
    tern_debug("ucx: endpoint to peer %u (%s error handling)", peer, ep->peer_mode ? "peer" : "no");
    ep = NULL;
out:
    free(uaddr);
    free(ep);
    return ret;
}

/* A destroy of an endpoint already being destroyed (from one of the
 * CANCELED completions its own destroy, or the transport's close, runs) does
 * nothing: the destroy under way frees it once its callbacks have run. */
static void ucx_ep_destroy(tern_ep_t *bep)
{
    ucx_ep_t *ep = to_ucx_ep(bep);

    if (ep->destroying)
        return;
    eps_shutdown(ep->tp, &ep, 1);
}

/* ---- sends ---- */

/*
 * Most sends complete inside ucp_am_send_nbx (a small one goes into the
 * peer's FIFO, a large one may be copied out at once). For those the op that
 * holds the header (and a small payload, am_post) is only borrowed from the
 * cache: no initialization, no listing, no completion. Only a send UCX keeps
 * (a full FIFO, an endpoint still wiring up, a zero-copy protocol) is set up
 * as a tracked op, after the call, which is safe because UCX calls back only
 * from progress. UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL with a stack buffer cannot
 * replace this: UCX 1.13's ucp_am_send_nbx ignores the flag and queues the
 * send, keeping a pointer to the buffer.
 */
static tern_status_t ucx_send(tern_ep_t *bep, uint32_t imm, const void *buf, size_t len,
                              const tern_op_params_t *params)
{
    ucx_ep_t *ep = to_ucx_ep(bep);
    ucx_op_t *op;
    ucs_status_ptr_t sp;
    tern_status_t st;
    uint32_t seq;

    if ((st = ep_check(ep, "tern_ep_send")) != TERN_OK)
        return st;
    if (ep->nblock > 0) { /* behind a put with immediate (ep_release) */
        if ((op = op_new(ep->tp, ep, OP_SEND, params)) == NULL)
            return tern__error(TERN_ERR_NO_MEMORY, "tern_ep_send: no memory for the operation");
        hdr_write(op->hdr, ep, MSG_SEND, 0, imm, len);
        ep_hold(ep, op, buf, len, mem_type_of(params));
        return TERN_INPROGRESS;
    }
    if ((op = op_alloc(ep->tp)) == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "tern_ep_send: no memory for the operation");
    op->ep = ep; /* all am_post reads of op besides its header */
    hdr_write(op->hdr, ep, MSG_SEND, 0, imm, len);
    sp = am_post(op, buf, len, 0, mem_type_of(params));
    if (sp == NULL || UCS_PTR_IS_ERR(sp)) {
        op_recycle(ep->tp, op);
        if (sp == NULL)
            return TERN_OK;
        return tern__error(status_of(UCS_PTR_STATUS(sp)), "ucp_am_send_nbx of %zu bytes: %s", len,
                           ucs_status_string(UCS_PTR_STATUS(sp)));
    }
    seq = op->seq; /* taken by am_post */
    op_init(op, ep->tp, ep, OP_SEND, params);
    op->seq = seq;
    op->has_seq = true;
    op->pending = 1;
    op_track(op, sp);
    return op_launched(op);
}

/*
 * A small send whose header goes into the room the caller left for it
 * (attr.inline_prefix), handed to UCX with FORCE_IMM_CMPL: UCX either sends
 * it before returning or refuses it (UCS_ERR_NO_RESOURCE), so no op, no
 * request parameters and no completion are needed. Refused, or behind ops of
 * the endpoint still in flight (which it must not overtake on the wire), it
 * goes the way of any send, copied into an op.
 */
static tern_status_t ucx_send_inline(tern_ep_t *bep, uint32_t imm, void *buf, size_t len)
{
    ucx_ep_t *ep = to_ucx_ep(bep);
    uint8_t *m = buf;
    tern_status_t st;

    if ((st = ep_check(ep, "tern_ep_send_inline")) != TERN_OK)
        return st;
    if (link_empty(&ep->ops)) {
        static const ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL};
        tern__put_le32(m, WIRE_SHORT | (ep->tx_seq & 0xffffffu) << 8);
        tern__put_le32(m + 4, ep->tp->base.self_id);
        tern__put_le32(m + 8, ep->conn);
        tern__put_le32(m + 12, imm);
        ucs_status_ptr_t sp = ucp_am_send_nbx(ep->uep, AM_ID, NULL, 0, m, SHORT_HDR_LEN + len, &p);
        if (UCS_PTR_IS_PTR(sp)) {
            /* FORCE_IMM_CMPL promises no request; should UCX return one all
             * the same, it may still read buf, which is the caller's again
             * once this returns: wait for it here. */
            while (ucp_request_check_status(sp) == UCS_INPROGRESS)
                ucp_worker_progress(ep->tp->worker);
            ucp_request_free(sp);
        }
        if (!UCS_PTR_IS_ERR(sp)) {
            ep->tx_seq++;
            return TERN_OK;
        }
        if (UCS_PTR_STATUS(sp) != UCS_ERR_NO_RESOURCE)
            return tern__error(status_of(UCS_PTR_STATUS(sp)), "ucp_am_send_nbx of %zu bytes: %s",
                               len, ucs_status_string(UCS_PTR_STATUS(sp)));
    }
    return ucx_send(bep, imm, m + SHORT_HDR_LEN, len, NULL);
}

/* ---- one-sided ---- */

/* Bounds and access of a remote key, checked here because UCP checks
 * neither. A refusal tells the target (MSG_ACCESS) and fails the operation. */
static tern_status_t rma_check(ucx_ep_t *ep, const ucx_rkey_t *rk, uint64_t raddr, size_t len,
                               bool get, const tern_op_params_t *params)
{
    const unsigned need = get ? TERN_ACCESS_REMOTE_READ : TERN_ACCESS_REMOTE_WRITE;
    const uint64_t base = rk->base.addr, rlen = rk->base.len;
    const bool has_imm = !get && (params->field_mask & TERN_OP_PARAM_IMM);
    const char *why;

    if (!(rk->access & need))
        why = get ? "the region does not allow remote read"
                  : "the region does not allow remote write";
    else if (!tern__range_within(base, rlen, raddr, len))
        why = "out of the region's bounds";
    else
        return TERN_OK;
    ctrl_post(ep, MSG_ACCESS, (uint16_t)((has_imm ? MSGF_IMM : 0) | (get ? MSGF_GET : 0)),
              has_imm ? params->imm : 0, len, NULL, 0, 0);
    return tern__error(
        TERN_ERR_ACCESS, "%s: %zu bytes at %#llx on peer %u: %s [%#llx, +%llu) (registration %u)",
        get ? "tern_ep_get" : "tern_ep_put", len, (unsigned long long)raddr, ep->base.peer, why,
        (unsigned long long)base, (unsigned long long)rlen, rk->reg_id);
}

/* Give a served op a token not in use (a get or put may wait long on a peer
 * that does not progress) and list it as awaiting replies. */
static bool token_list(ucx_tp_t *tp, ucx_op_t *op)
{
    ucx_op_t *other;

    do {
        op->token = ++tp->next_token;
        HASH_FIND(hh, tp->awaited, &op->token, sizeof(op->token), other);
    } while (other != NULL);
    tern__hash_oom = false;
    HASH_ADD(hh, tp->awaited, token, sizeof(op->token), op);
    if (tern__hash_oom)
        return false;
    op->awaiting = true;
    return true;
}

/*
 * Ask the target to serve a put (serve_put): the data goes in chunks, each an
 * eager AM the target checks, places and acknowledges; the put completes on
 * the last acknowledgement. With an immediate it then goes on as any put with
 * immediate (op_advance): the flush posted here covers puts UCX made on this
 * endpoint before (of device memory), and op_blocked the served ones.
 */
static tern_status_t put_request(ucx_ep_t *ep, const void *buf, size_t len, uint64_t raddr,
                                 const ucx_rkey_t *rk, const tern_op_params_t *params,
                                 bool has_imm)
{
    ucx_tp_t *tp = ep->tp;
    /* On shared memory, pieces whose AM is as long as a get reply's piece. */
    const size_t least = ep->peer_mode ? PUT_CHUNK
                                       : SHM_FRAG + REPLY_TRAILER_LEN - (PUT_HDR_LEN - MSG_HDR_LEN);
    const size_t chunk = len / PUT_CHUNKS_MAX >= least ? len / PUT_CHUNKS_MAX + 1 : least;
    const unsigned n = (unsigned)((len + chunk - 1) / chunk);
    ucx_op_t *op = op_new(tp, ep, has_imm ? OP_PUT_IMM : OP_PUT, params);
    ucp_request_param_t p;
    ucs_status_ptr_t sp;

    if (op == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "tern_ep_put: no memory for the operation");
    op->imm = has_imm ? params->imm : 0;
    op->len = len;
    op->pending = 1;
    if (n > 0) {
        op->xreqs = calloc(n, sizeof(void *) + PUT_HDR_LEN);
        if (op->xreqs == NULL || !token_list(tp, op)) {
            op_free(op);
            return tern__error(TERN_ERR_NO_MEMORY, "tern_ep_put: no memory for the operation");
        }
        op->xhdrs = (uint8_t *)(op->xreqs + n);
        op->nx = n;
        op->acks_due = n;
    }
    p = op_param(op);
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    p.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
    p.memory_type = UCS_MEMORY_TYPE_HOST;
    for (unsigned i = 0; i < n; i++) {
        const size_t off = (size_t)i * chunk, clen = len - off < chunk ? len - off : chunk;
        uint8_t *h = op->xhdrs + (size_t)i * PUT_HDR_LEN;

        hdr_fill(h, MSG_PUT, has_imm ? MSGF_IMM : 0, tp->base.self_id, ep->conn,
                 0 /* outside the streams */, op->token, clen);
        tern__put_le64(h + 32, raddr + off);
        tern__put_le32(h + 40, rk->reg_id);
        tern__put_le32(h + 44, op->imm);
        tern__put_le64(h + 48, len);
        sp = ucp_am_send_nbx(ep->uep, AM_ID, h, PUT_HDR_LEN, (const uint8_t *)buf + off, clen, &p);
        if (UCS_PTR_IS_ERR(sp)) {
            if (i == 0) {
                op_free(op);
                return tern__error(status_of(UCS_PTR_STATUS(sp)),
                                   "tern_ep_put: ucp_am_send_nbx: %s",
                                   ucs_status_string(UCS_PTR_STATUS(sp)));
            }
            /* The chunks sent are acknowledged; the op fails when they are. */
            op->ustatus = UCS_PTR_STATUS(sp);
            op->acks_due = i;
            break;
        }
        if (sp != NULL) {
            op->xreqs[i] = sp;
            op->pending++;
        }
    }
    if (has_imm) {
        p = op_param(op);
        op_track(op, ucp_ep_flush_nbx(ep->uep, &p));
        op->blocking = true; /* what is posted after it waits until its notify has a seq */
        ep->nblock++;
    }
    return op_launched(op);
}

/*
 * A put completes when its data is at the target: ucp_put_nbx only promises
 * that the source buffer may be reused, so a flush of the endpoint follows it.
 * With an immediate, the notify AM goes out after that flush, so the target's
 * TERN_EVENT_PUT_IMM comes after the data (and after every earlier put on this
 * endpoint) is in place.
 *
 * Revoked keys: the initiator cannot tell a key whose region its owner has
 * since unregistered, and one-sided RMA never asks the target. Where UCX
 * would emulate RMA with AMs that its target applies by memcpy to the raw
 * address (tcp, shared memory), tern serves host puts itself (put_request),
 * and the target refuses a chunk whose region is gone. With cma
 * (process_vm_writev) and device memory, the put lands wherever that address
 * now points, or fails if the range is unmapped. With InfiniBand the
 * target's NIC refuses the stale rkey and the endpoint fails
 * (TERN_ERR_PEER_LOST, not TERN_ERR_ACCESS). Do not use a key after its
 * owner may have unregistered it.
 */
static tern_status_t ucx_put(tern_ep_t *bep, const void *buf, size_t len, uint64_t raddr,
                             tern_rkey_t *brk, const tern_op_params_t *params)
{
    ucx_ep_t *ep = to_ucx_ep(bep);
    ucx_rkey_t *rk = to_ucx_rkey(brk);
    const bool has_imm = (params->field_mask & TERN_OP_PARAM_IMM) != 0;
    bool moved = false;
    ucp_request_param_t p;
    ucs_status_ptr_t sp;
    ucx_op_t *op;
    tern_status_t st;

    if ((st = ep_check(ep, "tern_ep_put")) != TERN_OK)
        return st;
    if ((st = rma_check(ep, rk, raddr, len, false, params)) != TERN_OK)
        return st;
    if (len == 0 && !has_imm)
        return TERN_OK;
    if (len > 0 && cma_usable(ep, rk, len, params)) {
        st = cma_copy(ep, (void *)buf, len, raddr, true);
        if (st == TERN_OK && !has_imm)
            return TERN_OK;
        if (st == TERN_OK)
            moved = true; /* the flush (earlier puts through UCX) and the notify follow */
        else if (st != TERN_ERR_UNSUPPORTED)
            return st;
    }
    if (!moved && served_takes(ep, rk, params))
        return put_request(ep, buf, len, raddr, rk, params, has_imm);
    if ((op = op_new(ep->tp, ep, has_imm ? OP_PUT_IMM : OP_PUT, params)) == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "tern_ep_put: no memory for the operation");
    op->imm = has_imm ? params->imm : 0;
    op->len = len;
    op->pending = 1;
    p = op_param(op);
    if (len > 0 && !moved) {
        ucp_request_param_t pp = p;
        pp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
        pp.memory_type = mem_type_of(params);
        sp = ucp_put_nbx(ep->uep, buf, len, raddr, rk->ukey, &pp);
        if (UCS_PTR_IS_ERR(sp)) {
            op_free(op);
            return tern__error(status_of(UCS_PTR_STATUS(sp)), "ucp_put_nbx of %zu bytes: %s", len,
                               ucs_status_string(UCS_PTR_STATUS(sp)));
        }
        op_track(op, sp);
    }
    sp = ucp_ep_flush_nbx(ep->uep, &p);
    if (UCS_PTR_IS_ERR(sp) && (len == 0 || moved)) {
        op_free(op);
        return tern__error(status_of(UCS_PTR_STATUS(sp)), "ucp_ep_flush_nbx: %s",
                           ucs_status_string(UCS_PTR_STATUS(sp)));
    }
    op_track(op, sp);
    if (has_imm) { /* what is posted after it waits until its notify has a seq */
        op->blocking = true;
        ep->nblock++;
    }
    return op_launched(op);
}

/* Ask the target to serve a get (serve_get); it completes on the reply. */
static tern_status_t get_request(ucx_ep_t *ep, const ucx_rkey_t *rk, void *buf, size_t len,
                                 uint64_t raddr, const tern_op_params_t *params)
{
    ucx_tp_t *tp = ep->tp;
    ucx_op_t *op = op_new(tp, ep, OP_GET, params);

    if (op == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "tern_ep_get: no memory for the operation");
    if (!token_list(tp, op)) {
        op_free(op);
        return tern__error(TERN_ERR_NO_MEMORY, "tern_ep_get: no memory for the operation");
    }
    op->len = len;
    op->lbuf = buf;
    op->pending = 1;
    /* On shared memory the answer comes in pieces, each copied straight into place. */
    hdr_fill(op->hdr, MSG_GET, !ep->peer_mode && len <= SHM_PIECES_MAX ? MSGF_FRAG : 0,
             tp->base.self_id, ep->conn, 0 /* outside the streams */, op->token, len);
    tern__put_le64(op->hdr + 32, raddr);
    tern__put_le32(op->hdr + 40, rk->reg_id);
    tern__put_le32(op->hdr + 44, 0);
    ucp_request_param_t p = op_param(op);
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
    ucs_status_ptr_t sp = ucp_am_send_nbx(ep->uep, AM_ID, op->hdr, GET_HDR_LEN, NULL, 0, &p);
    if (UCS_PTR_IS_ERR(sp)) {
        op_free(op);
        return tern__error(status_of(UCS_PTR_STATUS(sp)), "tern_ep_get: ucp_am_send_nbx: %s",
                           ucs_status_string(UCS_PTR_STATUS(sp)));
    }
    op_track(op, sp);
    return op_launched(op);
}

static tern_status_t ucx_get(tern_ep_t *bep, void *buf, size_t len, uint64_t raddr,
                             tern_rkey_t *brk, const tern_op_params_t *params)
{
    ucx_ep_t *ep = to_ucx_ep(bep);
    ucx_rkey_t *rk = to_ucx_rkey(brk);
    ucp_request_param_t p;
    ucs_status_ptr_t sp;
    ucx_op_t *op;
    tern_status_t st;

    if ((st = ep_check(ep, "tern_ep_get")) != TERN_OK)
        return st;
    if ((st = rma_check(ep, rk, raddr, len, true, params)) != TERN_OK)
        return st;
    if (len == 0)
        return TERN_OK;
    if (cma_usable(ep, rk, len, params) &&
        (st = cma_copy(ep, buf, len, raddr, false)) != TERN_ERR_UNSUPPORTED)
        return st;
    if (served_takes(ep, rk, params))
        return get_request(ep, rk, buf, len, raddr, params);
    if ((op = op_new(ep->tp, ep, OP_GET, params)) == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "tern_ep_get: no memory for the operation");
    op->len = len;
    op->pending = 1;
    p = op_param(op);
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    p.memory_type = mem_type_of(params);
    sp = ucp_get_nbx(ep->uep, buf, len, raddr, rk->ukey, &p);
    if (UCS_PTR_IS_ERR(sp)) {
        op_free(op);
        return tern__error(status_of(UCS_PTR_STATUS(sp)), "ucp_get_nbx of %zu bytes: %s", len,
                           ucs_status_string(UCS_PTR_STATUS(sp)));
    }
    op_track(op, sp);
    return op_launched(op);
}

/* ---- registration ----
 *
 * Keeping maps. ucp_mem_unmap drops UCX's cache entry for the region (UCX
 * must assume the memory goes with it), so a buffer registered for every
 * rendezvous send was mapped anew each time: ucp_mem_map, ucp_rkey_pack and
 * ucp_mem_unmap took about 8 % of a rank's CPU in a 4-rank 1 MiB all_reduce
 * on shared memory (docs/transport-ucx.md). Where UCX would only emulate RMA
 * (served_rma) and neither knem nor xpmem is among its transports, a map of
 * host memory holds no pages: it is bookkeeping for a UCX key that tern's
 * own gets and puts (cma_copy, served) never read, so one kept past its
 * registration cannot leave a peer reading memory that has gone. The
 * registration itself (its id, which served gets and puts check) is made
 * and dropped as before. */

/* The kept map of exactly this range and protection, or NULL. */
static memh_slot_t *memh_find(ucx_tp_t *tp, const void *addr, size_t len, unsigned prot)
{
    for (unsigned i = 0; i < MEMH_SLOTS; i++) {
        memh_slot_t *s = &tp->memh_slots[i];
        if (s->memh != NULL && s->addr == addr && s->len == len && s->prot == prot)
            return s;
    }
    return NULL;
}

static void memh_slot_empty(ucx_tp_t *tp, memh_slot_t *s)
{
    ucp_rkey_buffer_release(s->rkey_buf);
    ucp_mem_unmap(tp->ctx, s->memh);
    memset(s, 0, sizeof(*s));
}

/* A slot for a new map: a free one, else the one idle longest, emptied;
 * NULL when every one is in use (the map then goes with its registration). */
static memh_slot_t *memh_slot_take(ucx_tp_t *tp)
{
    memh_slot_t *idle = NULL;
    for (unsigned i = 0; i < MEMH_SLOTS; i++) {
        memh_slot_t *s = &tp->memh_slots[i];
        if (s->memh == NULL)
            return s;
        if (s->refs == 0 && (idle == NULL || s->used < idle->used))
            idle = s;
    }
    if (idle != NULL)
        memh_slot_empty(tp, idle);
    return idle;
}

/* A registration's UCX map goes with it, unless it is kept (above). */
static void mr_release_map(ucx_mr_t *mr)
{
    if (mr->slot != NULL) {
        mr->slot->refs--;
        mr->slot->used = ++mr->tp->memh_tick;
        return;
    }
    if (mr->rkey_buf != NULL)
        ucp_rkey_buffer_release(mr->rkey_buf);
    if (mr->memh != NULL)
        ucp_mem_unmap(mr->tp->ctx, mr->memh);
}

static tern_status_t ucx_mr_reg(tern_transport_t *btp, void *addr, size_t len,
                                const tern_mr_params_t *params, tern_mr_t **mr_out)
{
    ucx_tp_t *tp = to_ucx_tp(btp);
    ucx_mr_t *mr = calloc(1, sizeof(*mr));
    ucp_mem_map_params_t mp;
    ucs_status_t st;
    tern_status_t ret = TERN_OK;

    if (mr == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "ucx: no memory for a registration");
    mr->tp = tp;
    mr->id = ++tp->next_reg_id;
    link_init(&mr->replies);
    if (len == 0)
        goto done; /* an empty region: nothing for UCX to map */
    /* Host memory no peer may reach needs no UCX map: its only use would be
     * the packed key, which grants nothing, and UCX's own operations take
     * unregistered local buffers. Every rendezvous read registers its
     * destination like this, and ucp_mem_map and ucp_mem_unmap (which
     * drops the cache entry) cost about 4 % of a 4-rank 1 MiB all_reduce's
     * CPU on shared memory (docs/transport-ucx.md). */
    if (params->mem_type == TERN_MEM_HOST && !(params->access & TERN__ACCESS_REMOTE))
        goto done;

    memset(&mp, 0, sizeof(mp));
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_PROT | UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    mp.address = addr;
    mp.length = len;
    /* Where the hardware enforces protection (IB) it then agrees with the key's header. */
    mp.prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_LOCAL_WRITE |
              ((params->access & TERN_ACCESS_REMOTE_READ) ? UCP_MEM_MAP_PROT_REMOTE_READ : 0) |
              ((params->access & TERN_ACCESS_REMOTE_WRITE) ? UCP_MEM_MAP_PROT_REMOTE_WRITE : 0);
    mp.memory_type =
        params->mem_type == TERN_MEM_CUDA ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
    const bool keep = tp->memh_keep && params->mem_type == TERN_MEM_HOST;
    if (keep && (mr->slot = memh_find(tp, addr, len, mp.prot)) != NULL) {
        mr->slot->refs++;
        mr->memh = mr->slot->memh;
        mr->rkey_buf = mr->slot->rkey_buf;
        mr->rkey_len = mr->slot->rkey_len;
        goto done;
    }
    st = ucp_mem_map(tp->ctx, &mp, &mr->memh);
    if (st != UCS_OK) {
        mr->memh = NULL;
        ret = tern__error(
            params->mem_type == TERN_MEM_CUDA && st == UCS_ERR_UNSUPPORTED ? TERN_ERR_UNSUPPORTED
                                                                           : status_of(st),
            "ucp_mem_map of %zu bytes at %p (%s memory): %s", len, addr,
            params->mem_type == TERN_MEM_CUDA ? "CUDA" : "host", ucs_status_string(st));
        goto out;
    }
    st = ucp_rkey_pack(tp->ctx, mr->memh, &mr->rkey_buf, &mr->rkey_len);
    if (st != UCS_OK) {
        mr->rkey_buf = NULL;
        ret = tern__error(status_of(st), "ucp_rkey_pack: %s", ucs_status_string(st));
        goto out;
    }
    if (RKEY_HDR_LEN + mr->rkey_len > TERN_RKEY_MAX) {
        ret = tern__error(TERN_ERR_UNSUPPORTED,
                          "ucx: UCX's packed key is %zu bytes; with tern's header it exceeds "
                          "TERN_RKEY_MAX (%u)",
                          mr->rkey_len, TERN_RKEY_MAX);
        goto out;
    }
    if (keep && (mr->slot = memh_slot_take(tp)) != NULL)
        *mr->slot = (memh_slot_t){.addr = addr, .len = len, .prot = mp.prot, .memh = mr->memh,
                                  .rkey_buf = mr->rkey_buf, .rkey_len = mr->rkey_len, .refs = 1};
done:
    tern__hash_oom = false;
    HASH_ADD(hh, tp->mr_by_id, id, sizeof(mr->id), mr);
    if (tern__hash_oom) {
        ret = tern__error(TERN_ERR_NO_MEMORY, "ucx: no memory for a registration");
        goto out;
    }
    *mr_out = &mr->base;
    return TERN_OK;
out:
    mr_release_map(mr);
    free(mr);
    return ret;
}

static void ucx_mr_dereg(tern_mr_t *bmr)
{
    ucx_mr_t *mr = to_ucx_mr(bmr);

    HASH_DEL(mr->tp->mr_by_id, mr); /* gets that name it from now on are refused */
    replies_revoke(mr);             /* and those under way read no more of it */
    mr_release_map(mr);
    free(mr);
}

/* The packed key's checksum (FNV-1a) covers its first 36 bytes and the
 * ulen bytes of UCX key after the header. */
static uint32_t rkey_checksum(const uint8_t *b, size_t ulen)
{
    return tern__fnv1a(tern__fnv1a(TERN__FNV_SEED, b, 36), b + RKEY_HDR_LEN, ulen);
}

/* The packed key: a 40-byte tern header, then UCX's packed rkey.
 *   0 u32 magic  4 u16 version  6 u16 header length  8 u64 base  16 u64 length
 *  24 u32 access (| RKEY_F_HOST)  28 u32 registration id  32 u32 UCX rkey length  36 u32 checksum */
static tern_status_t ucx_mr_pack(const tern_mr_t *bmr, void *buf, size_t *len)
{
    const ucx_mr_t *mr = to_ucx_mr(bmr);
    const size_t need = RKEY_HDR_LEN + mr->rkey_len;
    uint8_t *b = buf;

    if (*len < need) {
        size_t have = *len;
        *len = need;
        return tern__error(TERN_ERR_TRUNCATED,
                           "tern_mr_pack: the key needs %zu bytes, buffer has %zu", need, have);
    }
    tern__put_le32(b, RKEY_MAGIC);
    tern__put_le16(b + 4, WIRE_VERSION);
    tern__put_le16(b + 6, RKEY_HDR_LEN);
    tern__put_le64(b + 8, (uint64_t)(uintptr_t)mr->base.addr);
    tern__put_le64(b + 16, mr->base.len);
    tern__put_le32(b + 24,
                   mr->base.access | (mr->base.mem_type == TERN_MEM_HOST ? RKEY_F_HOST : 0));
    tern__put_le32(b + 28, mr->id);
    tern__put_le32(b + 32, (uint32_t)mr->rkey_len);
    if (mr->rkey_len > 0)
        memcpy(b + RKEY_HDR_LEN, mr->rkey_buf, mr->rkey_len);
    tern__put_le32(b + 36, rkey_checksum(b, mr->rkey_len));
    *len = need;
    return TERN_OK;
}

static tern_status_t ucx_rkey_unpack(tern_ep_t *bep, const void *buf, size_t len,
                                     tern_rkey_t **rkey_out)
{
    ucx_ep_t *ep = to_ucx_ep(bep);
    const uint8_t *b = buf;
    const unsigned all = TERN__ACCESS_ALL;
    uint64_t base, rlen;
    uint32_t ulen, access;
    ucx_rkey_t *rk;
    tern_status_t st;

    if (len < RKEY_HDR_LEN)
        return tern__error(TERN_ERR_INVALID_PARAM,
                           "ucx: remote key of %zu bytes is shorter than its %u-byte header", len,
                           RKEY_HDR_LEN);
    if (tern__get_le32(b) != RKEY_MAGIC)
        return tern__error(TERN_ERR_INVALID_PARAM,
                           "ucx: not a ucx remote key (magic %#x; from another provider?)",
                           tern__get_le32(b));
    if (tern__get_le16(b + 4) != WIRE_VERSION || tern__get_le16(b + 6) != RKEY_HDR_LEN)
        return tern__error(TERN_ERR_INVALID_PARAM,
                           "ucx: remote key version %u; this tern speaks %u", tern__get_le16(b + 4),
                           WIRE_VERSION);
    base = tern__get_le64(b + 8);
    rlen = tern__get_le64(b + 16);
    access = tern__get_le32(b + 24);
    ulen = tern__get_le32(b + 32);
    if (ulen != len - RKEY_HDR_LEN)
        return tern__error(TERN_ERR_INVALID_PARAM,
                           "ucx: remote key says %u bytes of UCX key, %zu follow (truncated?)",
                           ulen, len - RKEY_HDR_LEN);
    if (rkey_checksum(b, ulen) != tern__get_le32(b + 36))
        return tern__error(TERN_ERR_INVALID_PARAM, "ucx: remote key checksum mismatch (damaged)");
    if ((access & ~(all | RKEY_F_HOST)) != 0 || (access & all) == 0 || base > UINT64_MAX - rlen ||
        (uint64_t)(size_t)rlen != rlen || (rlen == 0 && ulen != 0) ||
        /* Only a region no peer may reach has no UCX key (ucx_mr_reg). */
        (rlen > 0 && ulen == 0 && (access & TERN__ACCESS_REMOTE) != 0))
        return tern__error(TERN_ERR_INVALID_PARAM,
                           "ucx: remote key describes no valid region (base %#llx, %llu bytes, "
                           "access %#x, %u key bytes)",
                           (unsigned long long)base, (unsigned long long)rlen, access, ulen);
    if ((st = ep_check(ep, "tern_rkey_unpack")) != TERN_OK)
        return st;
    if ((rk = calloc(1, sizeof(*rk))) == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "ucx: no memory for a remote key");
    if (ulen > 0) {
        ucs_status_t us = ucp_ep_rkey_unpack(ep->uep, b + RKEY_HDR_LEN, &rk->ukey);
        if (us != UCS_OK) {
            free(rk);
            return tern__error(status_of(us) == TERN_ERR_NO_MEMORY ? TERN_ERR_NO_MEMORY
                                                                   : TERN_ERR_INVALID_PARAM,
                               "ucp_ep_rkey_unpack: %s", ucs_status_string(us));
        }
    }
    rk->base.ep = bep;
    rk->base.addr = base;
    rk->base.len = (size_t)rlen;
    rk->access = access & all;
    rk->host = (access & RKEY_F_HOST) != 0;
    rk->reg_id = tern__get_le32(b + 28);
    link_add_tail(&ep->rkeys, &rk->link);
    *rkey_out = &rk->base;
    return TERN_OK;
}

static void ucx_rkey_release(tern_rkey_t *brk)
{
    ucx_rkey_t *rk = to_ucx_rkey(brk);

    link_del(&rk->link);
    if (rk->ukey != NULL)
        ucp_rkey_destroy(rk->ukey);
    free(rk);
}

/* ---- the transport ---- */

/* Set what UCX's variable var sets, unless the user set it. key is its name
 * in UCX's table: a transport's key goes without the transport's prefix
 * (UCX matches it against every transport's fields). */
static void ucx_config_default(ucp_config_t *config, const char *var, const char *key,
                               const char *value)
{
    ucs_status_t st;

    if (getenv(var) != NULL)
        return;
    if ((st = ucp_config_modify(config, key, value)) != UCS_OK)
        tern_warn("ucx: %s=%s not taken (%s)", var, value, ucs_status_string(st));
}

static tern_status_t ucx_address(const tern_transport_t *btp, void *buf, size_t *len)
{
    const ucx_tp_t *tp = to_ucx_tp(btp);

    if (*len < tp->addr_len) {
        size_t have = *len;
        *len = tp->addr_len;
        return tern__error(TERN_ERR_TRUNCATED,
                           "tern_transport_address: the address needs %zu bytes, buffer has %zu",
                           tp->addr_len, have);
    }
    memcpy(buf, tp->addr, tp->addr_len);
    *len = tp->addr_len;
    return TERN_OK;
}

/* Print a UCX object's report into a string (open_memstream); NULL on failure. */
static char *ucx_report(const ucp_config_t *config, ucp_context_h ctx)
{
    char *text = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);

    if (f == NULL)
        return NULL;
    if (config != NULL)
        ucp_config_print(config, f, NULL, UCS_CONFIG_PRINT_CONFIG);
    else
        ucp_context_print_info(ctx, f);
    if (fclose(f) != 0) {
        free(text);
        return NULL;
    }
    return text;
}

/*
 * attr.device: "UCX 1.13.1 (UCX_TLS=sm: sysv/memory,posix/memory,cma/memory)":
 * the UCX_TLS value UCX parsed (from the environment or its config file) and
 * the transport/device resources the context opened with it; and
 * attr.host_shm, whether one of those is a shared-memory transport.
 */
static void describe_device(ucx_tp_t *tp, const ucp_config_t *config)
{
    char *cfg = ucx_report(config, NULL), *info = ucx_report(NULL, tp->ctx);
    char tls[64] = "?", res[128] = "";
    const char *line;
    size_t n = 0;
    bool full = false;

    if (cfg != NULL && (line = strstr(cfg, "UCX_TLS=")) != NULL) {
        line += strlen("UCX_TLS=");
        snprintf(tls, sizeof(tls), "%.*s", (int)strcspn(line, "\n"), line);
    }
    /* UCX has RMA of its own only on RDMA and GPU transports: on these it
     * emulates gets with AMs, and tern serves them (serve_get). */
    static const char *const emulated[] = {"tcp/",  "sysv/", "posix/", "cma/",
                                           "knem/", "xpmem/", "self/"};
    bool pins = false;
    tp->served_rma = info != NULL;
    for (line = info; line != NULL && (line = strstr(line, "resource")) != NULL; line++) {
        const char *r = strstr(line, "-- ");
        const char *eol = strchr(line, '\n');
        if (r == NULL || (eol != NULL && r > eol))
            continue;
        r += 3;
        bool known = false;
        for (size_t i = 0; i < sizeof(emulated) / sizeof(emulated[0]); i++)
            known = known || strncmp(r, emulated[i], strlen(emulated[i])) == 0;
        if (!known)
            tp->served_rma = false;
        /* knem and xpmem are the emulated ones whose maps hold the memory. */
        if (strncmp(r, "knem/", 5) == 0 || strncmp(r, "xpmem/", 6) == 0)
            pins = true;
        /* UCX names the device of its shared-memory transports (sysv, posix,
         * cma, knem, xpmem) "memory"; "self" (a process to itself, device
         * "memory0") reaches no other process. */
        if (strncmp(r, "self/", 5) != 0 && strncmp(r + strcspn(r, "/ \n"), "/memory", 7) == 0)
            tp->base.attr.host_shm = 1;
        if (full)
            continue; /* the rest still counts for host_shm */
        int w =
            snprintf(res + n, sizeof(res) - n, "%s%.*s", n ? "," : "", (int)strcspn(r, " \n"), r);
        if (w < 0 || (size_t)w >= sizeof(res) - n) {
            res[n] = '\0';
            full = true;
            continue;
        }
        n += (size_t)w;
    }
    tp->memh_keep = tp->served_rma && !pins;
    /* A description for people: cut short if it must be, never an error. */
    if (snprintf(tp->base.attr.device, sizeof(tp->base.attr.device), "UCX %s (UCX_TLS=%s: %s)",
                 ucp_get_version_string(), tls, res[0] ? res : "?") >=
        (int)sizeof(tp->base.attr.device))
        tern_debug("ucx: device description cut to %zu bytes", sizeof(tp->base.attr.device) - 1);
    free(cfg);
    free(info);
}

/* Workers (with their contexts) that ucx_close left in place: never
 * progressed or destroyed again, and held here for the life of the process
 * so that they are owned, not lost (a leak checker reports lost memory). */
typedef struct parked {
    struct parked *next;
    ucp_worker_h worker;
    ucp_context_h ctx;
} parked_t;

static _Atomic(parked_t *) parked_workers;

static void park(ucp_worker_h worker, ucp_context_h ctx)
{
    parked_t *p = malloc(sizeof(*p));
    if (p == NULL)
        return; /* lost to a leak checker, but still never touched again */
    p->worker = worker;
    p->ctx = ctx;
    p->next = atomic_load(&parked_workers);
    while (!atomic_compare_exchange_weak(&parked_workers, &p->next, p))
        ;
}

/* Tell the peer endpoint on channel c that this transport closes on purpose
 * (it may have no BYE from us: we never had an endpoint to it), not that it
 * died, and whether its UCX worker is parked. */
static void notice_gone(ucx_tp_t *tp, notice_conn_t *c, bool parked)
{
    uint8_t gone[NOTICE_HDR_LEN];
    ssize_t r;

    /* The peer sends its HELLO right after connecting: a channel accepted
     * in between gets a moment for it. */
    const uint64_t deadline = tern_clock_ns() + HELLO_WAIT_NS;
    while (!c->hello && (r = notice_recv(c->fd, gone, sizeof(gone))) >= 0) {
        if (r == (ssize_t)NOTICE_HDR_LEN && gone[0] == NOTICE_HELLO && gone[1] == WIRE_VERSION)
            notice_take_hello(c, gone); /* a channel not read yet: it names the endpoint */
        struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
        if (r == 0 && (tern_clock_ns() >= deadline || poll(&pfd, 1, 1) < 0))
            break;
    }
    notice_fill(gone, NOTICE_GONE, tp->base.self_id, c->conn, parked ? GONE_PARKED : 0, 0);
    if (c->hello && send(c->fd, gone, sizeof(gone), MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
        tern_debug("ucx: goodbye to peer %u's endpoint not sent: %s", c->src, strerror(errno));
}

/* Free a transport built up to any point (fields zeroed where not built).
 * With keep_worker (UCX still busy or still holding queued sends: ucx_close)
 * the worker and its context are parked, never progressed again, so UCX
 * touches nothing of ours freed here. */
static void tp_fini(ucx_tp_t *tp, bool keep_worker)
{
    if (keep_worker)
        park(tp->worker, tp->ctx);
    /* A request not released when the worker goes is a UCX assertion. */
    for (link_t *l = tp->orphan_entries.next; l != &tp->orphan_entries; l = l->next) {
        ucx_entry_t *e = link_entry(l, ucx_entry_t, link);
        if (e->req != NULL)
            ucp_request_free(e->req);
        e->req = NULL;
    }
    for (link_t *l = tp->detached.next; l != &tp->detached; l = l->next) {
        ucx_op_t *op = link_entry(l, ucx_op_t, link);
        for (int i = 0; i < 2; i++)
            if (op->reqs[i] != NULL)
                ucp_request_free(op->reqs[i]); /* no callback from here on */
        op->reqs[0] = op->reqs[1] = NULL;
        for (unsigned i = 0; i < op->nx; i++)
            if (op->xreqs[i] != NULL)
                ucp_request_free(op->xreqs[i]);
        op->nx = 0;
    }
    for (link_t *l = tp->zombie_eps.next; l != &tp->zombie_eps; l = l->next) {
        ucx_ep_t *ep = link_entry(l, ucx_ep_t, link);
        if (ep->close_req != NULL)
            ucp_request_free(ep->close_req); /* UCX finishes it with the worker */
        ep->close_req = NULL;
        for (size_t i = 0; i < ep->nzukeys; i++)
            ucp_rkey_destroy(ep->zukeys[i]);
        ep->nzukeys = 0;
    }
    if (tp->worker != NULL && !keep_worker) {
        /* It reports the requests and endpoints tern gave up on: known already. */
        ucs_log_push_handler(quiet_log);
        ucp_worker_destroy(tp->worker);
        ucs_log_pop_handler();
        tp->worker = NULL;
    }
    /* Registrations the user left: only now, with the worker gone, can no
     * request name them (a purge at worker destroy dereferences them). */
    if (tp->base.ops != NULL)
        tern__tp_release_mrs(&tp->base);
    /* What UCX may have still held went with the worker (or is parked,
     * never to be progressed again). */
    while (!link_empty(&tp->detached)) {
        ucx_op_t *op = link_entry(tp->detached.next, ucx_op_t, link);
        link_del(&op->link);
        free(op->payload);
        free(op->xreqs);
        free(op);
    }
    while (!link_empty(&tp->orphan_entries)) {
        ucx_entry_t *e = link_entry(tp->orphan_entries.next, ucx_entry_t, link);
        link_del(&e->link);
        free(e->buf);
        free(e);
    }
    while (tp->entry_cache != NULL) {
        ucx_entry_t *e = tp->entry_cache;
        tp->entry_cache = e->cache_next;
        free(e);
    }
    while (!link_empty(&tp->zombie_eps))
        zombie_free(link_entry(tp->zombie_eps.next, ucx_ep_t, link));
    while (!link_empty(&tp->notice_conns)) {
        notice_conn_t *c = link_entry(tp->notice_conns.next, notice_conn_t, link);
        notice_gone(tp, c, keep_worker);
        link_del(&c->link);
        close(c->fd);
        free(c);
    }
    if (tp->lfd >= 0) {
        /* Channels still in the listener's backlog: a peer that connected
         * since we last looked would otherwise take our hang-up for a death
         * and park its worker at its own close (a short run under load). */
        for (;;) {
            int fd = accept4(tp->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd < 0 && (errno == EINTR || errno == ECONNABORTED))
                continue;
            if (fd < 0)
                break;
            notice_conn_t c = {.fd = fd};
            notice_gone(tp, &c, keep_worker);
            close(fd);
        }
        close(tp->lfd);
    }
    if (tp->tfd >= 0)
        close(tp->tfd);
    if (tp->epfd >= 0)
        close(tp->epfd);
    while (tp->op_cache != NULL) {
        ucx_op_t *op = tp->op_cache;
        tp->op_cache = op->cache_next;
        free(op);
    }
    while (!link_empty(&tp->refusals)) {
        refusal_t *f = link_entry(tp->refusals.next, refusal_t, link);
        link_del(&f->link);
        free(f);
    }
    HASH_CLEAR(hh, tp->awaited);     /* every op left it as it completed: the table's own memory */
    HASH_CLEAR(hh, tp->mr_by_id); /* likewise with tern__tp_release_mrs */
    for (unsigned i = 0; i < MEMH_SLOTS; i++) /* idle now: their registrations are gone */
        if (tp->memh_slots[i].memh != NULL)
            memh_slot_empty(tp, &tp->memh_slots[i]);
    if (tp->has_reply_dt && !keep_worker)
        ucp_dt_destroy(tp->reply_dt); /* after the worker: its purge finishes our replies */
    if (tp->ctx != NULL && !keep_worker)
        ucp_cleanup(tp->ctx);
    free(tp->buckets);
    free(tp->addr);
    free(tp);
}

static tern_status_t ucx_open(const tern__tp_config_t *cfg, tern_transport_t **tp_out)
{
    ucx_tp_t *tp = calloc(1, sizeof(*tp));
    ucp_config_t *config = NULL;
    ucp_params_t params;
    ucp_worker_params_t wparams;
    ucp_worker_attr_t wattr;
    ucp_am_handler_param_t am;
    ucs_status_t st;
    tern_status_t ret = TERN_OK;

    if (tp == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "ucx: no memory for the transport");
    tp->efd = -1;
    tp->epfd = -1;
    tp->lfd = -1;
    tp->tfd = -1;
    tp->peer_mode = true;
    tp->cma_min = cfg->ucx_cma;
    link_init(&tp->notice_conns);
    link_init(&tp->eps);
    link_init(&tp->zombie_eps);
    link_init(&tp->lost);
    link_init(&tp->linger);
    link_init(&tp->done);
    link_init(&tp->detached);
    link_init(&tp->orphan_entries);
    link_init(&tp->dirty);
    link_init(&tp->refusals);
    tp->nbuckets = 64;
    if ((tp->buckets = calloc(tp->nbuckets, sizeof(*tp->buckets))) == NULL) {
        ret = tern__error(TERN_ERR_NO_MEMORY, "ucx: no memory for the transport");
        goto out;
    }
    tp->conn_nonce = (uint32_t)(tern_clock_ns() ^ ((uint64_t)getpid() << 16) ^ (uintptr_t)tp);

    if ((st = ucp_config_read(NULL, NULL, &config)) != UCS_OK) {
        ret = tern__error(TERN_ERR_CONFIG, "ucx: ucp_config_read (UCX_* variables): %s",
                          ucs_status_string(st));
        goto out;
    }
    if (cfg->device != NULL &&
        (st = ucp_config_modify(config, "NET_DEVICES", cfg->device)) != UCS_OK) {
        ret = tern__error(TERN_ERR_CONFIG, "ucx: device '%s' (UCX_NET_DEVICES): %s", cfg->device,
                          ucs_status_string(st));
        goto out;
    }
    /* UCX 1.13's tcp completes a zero-copy AM twice when its socket fails
     * mid-send (uct_tcp_ep_sendv purges the op, then completes it again): a
     * peer that dies while an eager message of some KiB is on its way aborts
     * this process on UCX's assertion. So eager AMs go by copy; rendezvous
     * (a put, whose completion is not the send's) is not affected. Copied in
     * UCX's 8 KiB segments, a served get or put ran at a third of the
     * zero-copy speed; in 64 KiB ones (a memcpy, then a send per 64 KiB) at
     * about the same (docs/transport-ucx.md). */
    ucx_config_default(config, "UCX_ZCOPY_THRESH", "ZCOPY_THRESH", "inf");
    const char *tls = getenv("UCX_TLS"), *zt = getenv("UCX_ZCOPY_THRESH");
    const bool tcp_in = tls == NULL || (tls[0] == '^' ? strstr(tls, "tcp") == NULL
                                                      : strstr(tls, "tcp") != NULL ||
                                                            strstr(tls, "all") != NULL);
    unsigned umajor, uminor, urelease;
    ucp_get_version(&umajor, &uminor, &urelease);
    /* The user's setting stands, with its risk said once per transport. */
    if (tcp_in && zt != NULL && strcmp(zt, "inf") != 0 &&
        (umajor < 1 || (umajor == 1 && uminor <= 13)))
        tern_warn("ucx: UCX_ZCOPY_THRESH=%s (yours): UCX %u.%u's tcp may abort this process "
                  "when a peer dies while a zero-copy message is on its way to it; tern sets "
                  "it to inf when it is not set (docs/transport-ucx.md, \"Known UCX 1.13 "
                  "faults\")",
                  zt, umajor, uminor);
    /* Only where tcp may be in: UCX warns of a key no transport took. */
    if (tcp_in)
        ucx_config_default(config, "UCX_TCP_TX_SEG_SIZE", "TX_SEG_SIZE", "64k");

    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
    params.features = UCP_FEATURE_AM | UCP_FEATURE_RMA | (cfg->busy_poll ? 0 : UCP_FEATURE_WAKEUP);
    params.name = "tern";
    if ((st = ucp_init(&params, config, &tp->ctx)) != UCS_OK) {
        tp->ctx = NULL;
        ret = tern__error(st == UCS_ERR_NO_MEMORY ? TERN_ERR_NO_MEMORY : TERN_ERR_NO_DEVICE,
                          "ucx: ucp_init: %s (check UCX_TLS / UCX_NET_DEVICES)",
                          ucs_status_string(st));
        goto out;
    }

    memset(&wparams, 0, sizeof(wparams));
    wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    /* One thread at a time, not always the same one: SERIALIZED (no locks in
     * UCX either; SINGLE means only the opening thread may call). */
    wparams.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    if ((st = ucp_worker_create(tp->ctx, &wparams, &tp->worker)) != UCS_OK) {
        tp->worker = NULL;
        ret = tern__error(st == UCS_ERR_NO_MEMORY ? TERN_ERR_NO_MEMORY : TERN_ERR_NO_DEVICE,
                          "ucx: ucp_worker_create: %s", ucs_status_string(st));
        goto out;
    }
    if ((st = ucp_dt_create_generic(&reply_dt_ops, NULL, &tp->reply_dt)) != UCS_OK) {
        ret = tern__error(status_of(st), "ucx: ucp_dt_create_generic: %s", ucs_status_string(st));
        goto out;
    }
    tp->has_reply_dt = true;

    memset(&am, 0, sizeof(am));
    am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    am.id = AM_ID;
    am.cb = am_cb;
    am.arg = tp;
    am.flags = UCP_AM_FLAG_WHOLE_MSG | UCP_AM_FLAG_PERSISTENT_DATA;
    if ((st = ucp_worker_set_am_recv_handler(tp->worker, &am)) != UCS_OK) {
        ret = tern__error(TERN_ERR_NO_DEVICE, "ucx: ucp_worker_set_am_recv_handler: %s",
                          ucs_status_string(st));
        goto out;
    }

    memset(&wattr, 0, sizeof(wattr));
    wattr.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS | UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
    if ((st = ucp_worker_query(tp->worker, &wattr)) != UCS_OK) {
        ret = tern__error(TERN_ERR_NO_DEVICE, "ucx: ucp_worker_query (address): %s",
                          ucs_status_string(st));
        goto out;
    }
    if (wattr.max_am_header < MSG_HDR_LEN) {
        ret = tern__error(TERN_ERR_UNSUPPORTED,
                          "ucx: the transports allow an AM header of %zu bytes, tern needs %u",
                          wattr.max_am_header, MSG_HDR_LEN);
        ucp_worker_release_address(tp->worker, wattr.address);
        goto out;
    }
    tp->addr_len = ADDR_HDR_LEN + wattr.address_length;
    if (tp->addr_len > TERN_ADDR_MAX || (tp->addr = malloc(tp->addr_len)) == NULL) {
        ret = tern__error(tp->addr_len > TERN_ADDR_MAX ? TERN_ERR_UNSUPPORTED : TERN_ERR_NO_MEMORY,
                          "ucx: worker address of %zu bytes (limit %u)", wattr.address_length,
                          TERN_ADDR_MAX - ADDR_HDR_LEN);
        ucp_worker_release_address(tp->worker, wattr.address);
        goto out;
    }
    if (!cfg->busy_poll && (st = ucp_worker_get_efd(tp->worker, &tp->efd)) != UCS_OK) {
        tp->efd = -1;
        ret = tern__error(TERN_ERR_NO_DEVICE,
                          "ucx: ucp_worker_get_efd: %s (the transports cannot sleep; set "
                          "TERN_POLL=busy)",
                          ucs_status_string(st));
        ucp_worker_release_address(tp->worker, wattr.address);
        goto out;
    }
    tp->ucx_watch.kind = WATCH_UCX;
    if ((tp->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0 ||
        (tp->efd >= 0 && watch_add(tp, tp->efd, &tp->ucx_watch) != 0)) {
        ret = tern__error_errno(TERN_ERR_NO_RESOURCE, errno, "ucx: epoll for the transport's fd");
        ucp_worker_release_address(tp->worker, wattr.address);
        goto out;
    }
    /* The fd must also wake a sleeper when a lost peer's puts and gets are
     * due to be given up on (ep_linger_check): nothing else happens then. */
    tp->twatch.kind = WATCH_TIMER;
    if (tp->efd >= 0 &&
        ((tp->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)) < 0 ||
         watch_add(tp, tp->tfd, &tp->twatch) != 0)) {
        ret = tern__error_errno(TERN_ERR_NO_RESOURCE, errno, "ucx: timerfd for the transport's fd");
        ucp_worker_release_address(tp->worker, wattr.address);
        goto out;
    }
    tp->notice_key = ((uint64_t)tp->conn_nonce << 32) ^ (tern_clock_ns() * 0x9e3779b97f4a7c15ull);
    notice_listen(tp);

    tern__put_le32(tp->addr, ADDR_MAGIC);
    tern__put_le16(tp->addr + 4, WIRE_VERSION);
    tern__put_le16(tp->addr + 6, ADDR_HDR_LEN);
    tern__put_le32(tp->addr + 8, cfg->self_id);
    tern__put_le32(tp->addr + 12, (uint32_t)wattr.address_length);
    tern__put_le32(tp->addr + 20, tp->lfd >= 0 ? ADDR_F_NOTICE : 0);
    tern__put_le32(tp->addr + 24, (uint32_t)getpid());
    tern__put_le32(tp->addr + 28, 0);
    tern__put_le64(tp->addr + 32, tp->notice_key);
    memcpy(tp->addr + ADDR_HDR_LEN, wattr.address, wattr.address_length);
    tern__put_le32(tp->addr + 16, addr_checksum(tp->addr, wattr.address_length));
    ucp_worker_release_address(tp->worker, wattr.address);

    describe_device(tp, config);
    tp->base.attr.max_send = MAX_SEND;
    tp->base.attr.max_inline = MSG_INLINE; /* copied into the op (am_post) */
    tp->base.attr.inline_prefix = SHORT_HDR_LEN;
    tp->base.attr.max_put = MAX_PUT;
    tp->base.attr.eager_size = UCX_EAGER_SIZE;
    tp->base.attr.addr_len = tp->addr_len;
    tern_debug("ucx: open on %s, address %zu bytes", tp->base.attr.device, tp->addr_len);
    *tp_out = &tp->base;
    tp = NULL;
out:
    if (config != NULL)
        ucp_config_release(config);
    if (tp != NULL)
        tp_fini(tp, false);
    return ret;
}

static void ucx_close(tern_transport_t *btp)
{
    ucx_tp_t *tp = to_ucx_tp(btp);
    size_t n = 0;
    ucx_ep_t **eps;
    uint64_t deadline;

    /* Again while the CANCELED callbacks of a round made endpoints (they
     * should not; this keeps such an endpoint from outliving the worker). */
    while (!link_empty(&tp->eps)) {
        n = 0;
        for (link_t *l = tp->eps.next; l != &tp->eps; l = l->next)
            n++;
        if ((eps = malloc(n * sizeof(*eps))) != NULL) {
            size_t i = 0;
            for (link_t *l = tp->eps.next; l != &tp->eps; l = l->next)
                eps[i++] = link_entry(l, ucx_ep_t, link);
            eps_shutdown(tp, eps, n);
            free(eps);
        } else {
            ucx_ep_t *ep = link_entry(tp->eps.next, ucx_ep_t, link);
            eps_shutdown(tp, &ep, 1);
        }
    }
    /* Nothing more is delivered: drop what waits, give UCX a moment to finish
     * the rendezvous receives still writing into our buffers. */
    tp->closing = true;
    for (size_t i = 0; i < tp->nbuckets; i++)
        while (tp->buckets[i] != NULL)
            stream_free(tp, tp->buckets[i]);
    while (!link_empty(&tp->done)) /* internal ops only: user ops went with their eps */
        op_free(link_entry(tp->done.next, ucx_op_t, dlink));
    deadline = tern_clock_ns() + ORPHAN_WAIT_NS;
    while (!link_empty(&tp->orphan_entries) && tern_clock_ns() < deadline)
        ucp_worker_progress(tp->worker);
    /* Endpoint closes that eps_shutdown left running (flush closes without
     * peer error handling, as on shared memory). UCX 1.13 aborts in
     * ucp_worker_destroy while such a close still has work queued on a cma
     * lane (the lane's queue must be empty). That work is ours to progress,
     * and usually done within a call. */
    bool busy = false;
    deadline = tern_clock_ns() + CLOSE_WAIT_NS;
    for (unsigned idle = 0; idle < CLOSE_IDLE_POLLS && !zombies_reap(tp);) {
        if ((busy = tern_clock_ns() >= deadline))
            break;
        idle = ucp_worker_progress(tp->worker) != 0 ? 0 : idle + 1;
    }
    /* Any close still running keeps the worker. One still waiting once the
     * worker is idle waits on its peer: sends queued for a peer whose FIFO is
     * full (one that is not progressing). Destroying the worker purges them,
     * and UCX 1.13's purge crashes on some of them (ucp_request_memory_dereg
     * -> ucp_mem_rereg_mds: 4 of 30 runs of the sm peer-close conformance
     * case). */
    /* A peer that parked its worker, or died, never reads its FIFO again. What UCX
     * itself queued for it, out of tern's sight (replies to the peer's
     * emulated gets), would be purged by our destroy: the purge that crashes
     * (docs/transport-ucx.md, "Known UCX 1.13 faults"). */
    const bool keep_worker = !link_empty(&tp->zombie_eps) || tp->peer_unread;
    if (busy)
        tern_warn("ucx: UCX was still busy closing this transport's endpoints after %llu ms: "
                  "its UCX worker is left in place, not destroyed, since destroying it "
                  "now would abort inside UCX",
                  (unsigned long long)(CLOSE_WAIT_NS / 1000000));
    else if (!link_empty(&tp->zombie_eps))
        tern_info("ucx: closing with endpoint closes that wait on a peer that is not "
                  "progressing: the UCX worker is left in place, not destroyed, since "
                  "UCX may crash purging what it queued for that peer");
    else if (keep_worker)
        tern_info("ucx: a peer closed leaving its UCX worker in place, or died: this one is "
                  "left in place too, not destroyed, since UCX may crash purging what it "
                  "queued for that peer");
    tp_fini(tp, keep_worker);
}

const tern__tp_ops_t tern__ucx_ops = {
    .name = "ucx",
    .open = ucx_open,
    .close = ucx_close,
    .address = ucx_address,
    .progress = ucx_progress,
    .fd = ucx_fd,
    .arm = ucx_arm,
    .ep_create = ucx_ep_create,
    .ep_destroy = ucx_ep_destroy,
    .send = ucx_send,
    .send_inline = ucx_send_inline,
    .put = ucx_put,
    .get = ucx_get,
    .mr_reg = ucx_mr_reg,
    .mr_dereg = ucx_mr_dereg,
    .mr_pack = ucx_mr_pack,
    .rkey_unpack = ucx_rkey_unpack,
    .rkey_release = ucx_rkey_release,
};
