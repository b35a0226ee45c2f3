/*
 * The transport: one interface with the semantics of RDMA reliable-connected
 * queue pairs, implemented by the providers "verbs" (libibverbs), "ucx" (UCP)
 * and "tcp" (an emulation over sockets). Everything above it (p2p, collectives,
 * RPC) uses only this header, so a provider can be swapped without them
 * noticing.
 *
 * How it maps onto verbs, call by call:
 *   tern_transport_open     device context, PD, CQ, SRQ with posted receive buffers
 *   tern_ep_create          an RC QP connected to the peer's address (rdmacm)
 *   tern_mr_reg / pack      ibv_reg_mr (or dma-buf for CUDA); rkey, address, length
 *   tern_ep_send            IBV_WR_SEND_WITH_IMM (inline when small) into the peer's SRQ
 *   tern_ep_send_inline     the same, IBV_SEND_INLINE, unsignaled
 *   tern_ep_put             IBV_WR_RDMA_WRITE, or _WITH_IMM with TERN_OP_PARAM_IMM
 *   tern_ep_get             IBV_WR_RDMA_READ
 *   tern_transport_progress ibv_poll_cq; tern_transport_arm + _fd: ibv_req_notify_cq
 *                           and the completion channel's fd
 *
 * Threading: a transport and everything made from it are used by one thread at
 * a time, not necessarily always the same one; the caller serializes. Callbacks
 * run inside tern_transport_progress() on the calling thread (never inside a
 * post) and must not block. They may post, and destroy endpoints, their own
 * included; tern_ep_destroy and tern_transport_close run the CANCELED
 * completions before they return, and destroying from one of those an endpoint
 * already being destroyed is a no-op.
 *
 * Completion rule for send/put/get (as UCX's nbx calls): TERN_OK means the
 * operation is complete and the buffer reusable, and the callback is not
 * called; TERN_INPROGRESS means the callback will be called exactly once, from
 * progress; an error means the operation was not started and the callback
 * never runs. TERN_ERR_NO_RESOURCE means the send queue is full: progress, then
 * post again.
 */
#ifndef TERN_TRANSPORT_H
#define TERN_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include <tern/defs.h>
#include <tern/status.h>

TERN_BEGIN_DECLS

typedef struct tern_transport tern_transport_t;
typedef struct tern_ep tern_ep_t;
typedef struct tern_mr tern_mr_t;
typedef struct tern_rkey tern_rkey_t;

#define TERN_ADDR_MAX 4096u /* bytes of an address blob, any provider */
#define TERN_RKEY_MAX 512u  /* bytes of a packed remote key, any provider */

typedef enum tern_mem_type {
    TERN_MEM_HOST = 0,
    TERN_MEM_CUDA = 1, /* device memory: GPUDirect where the provider can, staged otherwise */
} tern_mem_type_t;

enum tern_access {
    TERN_ACCESS_LOCAL = 1u << 0,        /* source or destination of local operations */
    TERN_ACCESS_REMOTE_READ = 1u << 1,  /* peers may get from it */
    TERN_ACCESS_REMOTE_WRITE = 1u << 2, /* peers may put into it */
    /* With REMOTE_READ: a promise that the owner leaves the memory as it is,
     * and registered, until every peer that reads it has said it is done (as
     * p2p's rendezvous does with its FIN). A provider may then answer reads
     * with the pages themselves instead of a copy (tcp: vmsplice, under
     * TERN_TCP_ZCOPY_MODE=auto). Never shared with a registration made
     * without it. An owner that unregisters early anyway leaves a reader
     * with whatever the pages hold when its kernel copies them out. */
    TERN_ACCESS_REMOTE_READ_HELD = 1u << 3,
};

/* ---- events at the target ---- */

typedef enum tern_event_type {
    TERN_EVENT_RECV = 1,    /* a send arrived: data[0..len) is valid during the callback only */
    TERN_EVENT_PUT_IMM = 2, /* a put with immediate finished landing len bytes in a local region */
    TERN_EVENT_ERROR = 3,   /* a peer's operation on this side failed (status), or the peer is
                               lost (TERN_ERR_PEER_LOST) or closed its endpoint to us on purpose
                               (TERN_ERR_CLOSED); imm names the failed put's immediate */
} tern_event_type_t;

typedef struct tern_event {
    tern_event_type_t type;
    uint32_t src;         /* the sending peer's id (its tern_transport_params_t.self_id) */
    uint32_t imm;         /* the immediate (RECV, PUT_IMM; ERROR of a put with immediate) */
    const void *data;     /* RECV: the payload; otherwise NULL */
    size_t len;           /* RECV, PUT_IMM: bytes */
    tern_status_t status; /* ERROR: why */
} tern_event_t;

/* Called from tern_transport_progress(). Must not call tern_transport_progress(). */
typedef void (*tern_event_fn)(const tern_event_t *event, void *arg);

/* ---- the transport ---- */

enum tern_transport_param_field {
    TERN_TRANSPORT_PARAM_PROVIDER = 1u << 0,
    TERN_TRANSPORT_PARAM_SELF_ID = 1u << 1,
    TERN_TRANSPORT_PARAM_EVENT = 1u << 2,
    TERN_TRANSPORT_PARAM_BUSY_POLL = 1u << 3,
    TERN_TRANSPORT_PARAM_DEVICE = 1u << 4,
    TERN_TRANSPORT_PARAM_PEER_HINT = 1u << 5,
};

/* Unset fields fall back to the environment (TERN_TRANSPORT, TERN_POLL, ...),
 * then the defaults in brackets. */
typedef struct tern_transport_params {
    uint64_t field_mask;
    const char *provider; /* ["auto"] "verbs", "ucx", "tcp" or "auto" */
    uint32_t self_id;     /* [0] how peers' events name this process: its rank */
    tern_event_fn on_event; /* [none: events are dropped] */
    void *event_arg;
    int busy_poll;        /* [TERN_POLL=blocking: 0] spin in progress rather than sleep */
    const char *device;   /* [provider's choice] e.g. "mlx5_0:1", an interface "eth0" */
    const char *peer_hint; /* [none] a host the peers are reached through (MASTER_ADDR):
                              the tcp provider advertises the local address routing to it */
} tern_transport_params_t;

typedef struct tern_transport_attr {
    char provider[16];    /* "tcp", "ucx", "verbs" */
    char device[128];     /* what it runs on, for reports: "lo 127.0.0.1", "tcp,sm (UCX 1.13)" */
    size_t max_send;      /* largest tern_ep_send payload */
    size_t max_inline;    /* host sends up to this many bytes copy the payload as they are
                             posted (verbs: inline sends): the buffer is free at once */
    size_t inline_prefix; /* bytes a tern_ep_send_inline buffer leaves in front of its
                             payload for the provider's header (at most TERN_INLINE_PREFIX_MAX) */
    size_t max_put;       /* largest single put or get */
    size_t eager_size;    /* the largest message the provider delivers for less than a
                             rendezvous's extra trips cost: the default of the p2p layer's
                             eager limit (TERN_EAGER_LIMIT=auto); 0: no preference */
    size_t addr_len;      /* bytes of this transport's address */
    int busy_poll;
    int host_shm;         /* peers on this host are reached through shared memory, where a
                             get is the initiator's own copy (ucx with an sm transport), not
                             through a network path (tcp, verbs) */
    size_t rx_window;     /* bytes of puts and read replies one peer may have on their way
                             to this process at once without loss (tcp: its socket buffer,
                             past which the kernel prunes and drops); 0: no bound */
    int revokes_keys;     /* the target takes part in every put and get, so one naming a
                             region its owner has unregistered is refused, even one whose
                             data is still arriving (tcp, verbs); ucx's one-sided RMA
                             writes to whatever the address holds then (but not the puts
                             and gets it serves, over UCX's tcp and on shared memory below
                             TERN_UCX_CMA, whose get replies also stop reading at the
                             dereg: docs/transport-ucx.md) */
    size_t put_way_min;   /* puts of this many bytes and up go the way their caller names
                             (TERN_OP_PARAM_WAY; tcp in its auto mode: TERN_TCP_ZCOPY);
                             0: the provider picks alone */
} tern_transport_attr_t;

/*
 * Open a transport. With provider "auto" the first of verbs, ucx, tcp that can
 * start is taken, and the choice and the reasons the others were passed over
 * are logged at info level. A named provider that cannot start is an error with
 * the reason (TERN_ERR_NO_DEVICE, TERN_ERR_UNSUPPORTED when not built in), never
 * a fall back to another.
 */
TERN_API tern_status_t tern_transport_open(const tern_transport_params_t *params,
                                           tern_transport_t **tp_out);

/* Destroy every endpoint and registration still open, then the transport.
 * Operations in flight complete with TERN_ERR_CANCELED. Their callbacks run
 * inside this call, before any endpoint is freed: one may call
 * tern_ep_destroy() on an endpoint of this transport (a no-op, the close
 * destroys it), but must not create endpoints or close the transport again
 * (posts fail with TERN_ERR_CANCELED). NULL is a no-op. */
TERN_API void tern_transport_close(tern_transport_t *tp);

TERN_API void tern_transport_query(const tern_transport_t *tp, tern_transport_attr_t *attr);

/* Copy this transport's address (what a peer passes to tern_ep_create) into
 * buf; *len holds buf's size on entry and the address length on return.
 * TERN_ERR_TRUNCATED when buf is too small (*len then says how much is needed). */
TERN_API tern_status_t tern_transport_address(const tern_transport_t *tp, void *buf, size_t *len);

/* Handle what has happened: completions, arrivals, connection changes. Returns
 * the number of events handled (0 when idle). Never blocks. */
TERN_API int tern_transport_progress(tern_transport_t *tp);

/* An fd that polls readable when there may be something to progress, once the
 * transport is armed; -1 when the provider cannot sleep (then busy-poll). */
TERN_API int tern_transport_fd(const tern_transport_t *tp);

/* Prepare to sleep on the fd: TERN_OK, or TERN_ERR_NO_RESOURCE when events are
 * already pending (progress first, then arm again). */
TERN_API tern_status_t tern_transport_arm(tern_transport_t *tp);

/* ---- endpoints ---- */

/*
 * A reliable, ordered connection to the peer whose address is addr (from its
 * tern_transport_address, exchanged through the store). Does not block:
 * operations may be posted at once and go out when the connection is up.
 * peer_id is the peer's self_id. One endpoint per peer.
 * Errors: TERN_ERR_INVALID_PARAM (malformed address), TERN_ERR_UNREACHABLE.
 */
TERN_API tern_status_t tern_ep_create(tern_transport_t *tp, uint32_t peer_id, const void *addr,
                                      size_t len, tern_ep_t **ep_out);

/* Close: operations still in flight complete with TERN_ERR_CANCELED, their
 * callbacks inside this call (a send the peer turns out to have delivered
 * completes TERN_OK instead: one completed CANCELED is never delivered).
 * A callback may destroy this endpoint again: a
 * no-op while its destroy (or tern_transport_close) is under way; the
 * endpoint is freed once the callbacks have run. NULL is a no-op. */
TERN_API void tern_ep_destroy(tern_ep_t *ep);

/* The peer id given at creation. */
TERN_API uint32_t tern_ep_peer(const tern_ep_t *ep);

/* ---- memory registration ---- */

enum tern_mr_param_field {
    TERN_MR_PARAM_MEM_TYPE = 1u << 0,
    TERN_MR_PARAM_ACCESS = 1u << 1,
    TERN_MR_PARAM_NO_CACHE = 1u << 2,
};

typedef struct tern_mr_params {
    uint64_t field_mask;
    tern_mem_type_t mem_type; /* [TERN_MEM_HOST] */
    unsigned access;          /* [LOCAL | REMOTE_READ | REMOTE_WRITE] tern_access bits */
    int cuda_device;          /* with TERN_MEM_CUDA: the device the memory is on */
} tern_mr_params_t;

/*
 * Register [addr, addr+len) for use with this transport. Registrations are
 * cached: registering a range already covered by a live registration with at
 * least the same access returns it again (counted), so repeated buffers are not
 * re-registered. The memory must stay allocated until the last tern_mr_dereg()
 * of it and until every operation naming it has completed.
 * len 0 is allowed (an empty region: only zero-byte operations fit in it).
 */
TERN_API tern_status_t tern_mr_reg(tern_transport_t *tp, void *addr, size_t len,
                                   const tern_mr_params_t *params, tern_mr_t **mr_out);

/* Drop one reference; the last one unregisters. Peers' operations on it fail
 * afterwards (TERN_ERR_ACCESS at both ends). NULL is a no-op. */
TERN_API void tern_mr_dereg(tern_mr_t *mr);

TERN_API void *tern_mr_addr(const tern_mr_t *mr);
TERN_API size_t tern_mr_len(const tern_mr_t *mr);

/* Pack the remote key peers need to address this region into buf (at most
 * TERN_RKEY_MAX bytes); *len: buf's size on entry, the key's length on return. */
TERN_API tern_status_t tern_mr_pack(const tern_mr_t *mr, void *buf, size_t *len);

/* Unpack a peer's packed key for use on ep. TERN_ERR_INVALID_PARAM when malformed.
 * The caller releases it with tern_rkey_release(), which is safe even after ep
 * or the transport is gone; it must not be used on ep after ep is destroyed. */
TERN_API tern_status_t tern_rkey_unpack(tern_ep_t *ep, const void *buf, size_t len,
                                        tern_rkey_t **rkey_out);
TERN_API void tern_rkey_release(tern_rkey_t *rkey);

/* The remote region's base address and length, as the owner registered it. */
TERN_API uint64_t tern_rkey_addr(const tern_rkey_t *rkey);
TERN_API size_t tern_rkey_len(const tern_rkey_t *rkey);

/* ---- operations ---- */

typedef void (*tern_comp_fn)(void *arg, tern_status_t status);

enum tern_op_param_field {
    TERN_OP_PARAM_CB = 1u << 0,  /* call cb(cb_arg, status) on completion */
    TERN_OP_PARAM_IMM = 1u << 1, /* put: raise TERN_EVENT_PUT_IMM with imm at the target */
    TERN_OP_PARAM_MR = 1u << 2,  /* the local buffer lies in mr (required by put/get, and by a
                                    send from device memory: without it the buffer is host memory) */
    TERN_OP_PARAM_WAY = 1u << 3, /* put: how its payload leaves (way), where the provider can
                                    do either */
};

/*
 * How a put's payload leaves this side, for a caller that times what the
 * provider cannot: a provider picks for itself by the costs of its own calls,
 * and the work that follows a transfer (a collective's sum reading the buffer
 * again, the segments' delivery outside the calls) is not among them
 * (docs/transport.md, "Splice or copy, as measured"). Honoured by tcp in its
 * auto mode for payloads of TERN_TCP_ZCOPY and up; everywhere else, and for
 * smaller payloads, the provider's own way stands. Puts only: a get's reply
 * is sent the way its target chooses.
 */
typedef enum tern_op_way {
    TERN_WAY_AUTO = 0, /* the provider's choice */
    TERN_WAY_COPY = 1, /* copied on this side (tcp: into the socket) */
    TERN_WAY_REF = 2,  /* by reference to its pages (tcp: vmsplice and splice) */
} tern_op_way_t;

#define TERN_INLINE_PREFIX_MAX 64

typedef struct tern_op_params {
    uint64_t field_mask;
    tern_comp_fn cb;
    void *cb_arg;
    uint32_t imm;
    tern_mr_t *mr;
    tern_op_way_t way;
} tern_op_params_t;

/*
 * Send buf[0..len) (len <= attr.max_send) with a 32-bit immediate; the peer gets
 * TERN_EVENT_RECV. Sends on one endpoint arrive in order. The buffer must stay
 * untouched until completion (see the completion rule above), except that a
 * host buffer of up to attr.max_inline bytes is copied before this returns and
 * may be reused at once, even when the send completes later. The buffer is host
 * memory unless TERN_OP_PARAM_MR names a TERN_MEM_CUDA registration holding it:
 * providers do not probe pointers, so device memory sent without its
 * registration is read as host memory (a fault, or wrong bytes).
 */
TERN_API tern_status_t tern_ep_send(tern_ep_t *ep, uint32_t imm, const void *buf, size_t len,
                                    const tern_op_params_t *params);

/*
 * A small send whose buffer has room in front for the provider's own header,
 * as libfabric's FI_MSG_PREFIX: buf starts with attr.inline_prefix bytes the
 * provider may overwrite (their contents are ignored), then len payload bytes
 * (len <= attr.max_inline, host memory). The peer gets one TERN_EVENT_RECV of
 * the payload, as from tern_ep_send, in order with the endpoint's other
 * sends. Everything is copied before this returns and there is no completion
 * to wait for (verbs: an unsignaled inline send). The caller builds header
 * and payload in one buffer with nothing for the provider to gather, and the
 * provider needs none of its operation state: on shared memory that is a
 * third of what tern adds to a small message's turnaround (docs/perf.md).
 */
TERN_API tern_status_t tern_ep_send_inline(tern_ep_t *ep, uint32_t imm, void *buf, size_t len);

/*
 * RDMA write: copy buf[0..len) (in params->mr) to remote address raddr inside the
 * region of rkey. With TERN_OP_PARAM_IMM the peer gets TERN_EVENT_PUT_IMM once
 * the data is in place, in posting order with the endpoint's sends and other
 * puts with immediate (as a write with immediate on an RC QP); the put
 * completes once its data is at the target. A key
 * that is out of bounds or without remote write access fails the operation with
 * TERN_ERR_ACCESS here and raises TERN_EVENT_ERROR at the peer; the endpoint
 * stays usable. A revoked key (its region unregistered) is refused the same way
 * by providers whose target takes part in the access (tcp, verbs, and ucx over
 * UCX's tcp); one-sided UCX RMA cannot check it (docs/transport-ucx.md).
 */
TERN_API tern_status_t tern_ep_put(tern_ep_t *ep, const void *buf, size_t len, uint64_t raddr,
                                   tern_rkey_t *rkey, const tern_op_params_t *params);

/* RDMA read: copy len bytes at remote address raddr (region of rkey, which needs
 * remote read access) into buf (in params->mr). Errors as for put. */
TERN_API tern_status_t tern_ep_get(tern_ep_t *ep, void *buf, size_t len, uint64_t raddr,
                                   tern_rkey_t *rkey, const tern_op_params_t *params);

TERN_END_DECLS

#endif
