/*
 * Point-to-point messaging between the ranks of a context, as
 * torch.distributed's send/recv/isend/irecv and MPI's: tagged, matched on
 * (source, tag) with TERN_ANY_SOURCE and TERN_ANY_TAG, and non-overtaking:
 * two messages from one source that both match a receive are received in the
 * order they were sent.
 *
 * Small messages go eagerly (one copy at the receiver); above TERN_EAGER_LIMIT
 * the sender registers its buffer and the receiver reads it straight into its
 * own (rendezvous, no copy). Messages that arrive before their receive is
 * posted wait in a queue whose memory is bounded by TERN_UNEXPECTED_MAX: past
 * it senders switch to rendezvous, which queues only a small header; past as
 * many bytes of those, further sends to that receiver fail with
 * TERN_ERR_NO_RESOURCE until it receives some (docs/p2p.md).
 *
 * Threading: any thread may call these; a request is waited on by one thread.
 */
#ifndef TERN_P2P_H
#define TERN_P2P_H

#include <stddef.h>
#include <stdint.h>

#include <tern/context.h>
#include <tern/defs.h>
#include <tern/status.h>
#include <tern/tensor.h>

TERN_BEGIN_DECLS

typedef struct tern_request tern_request_t;

#define TERN_ANY_SOURCE (-1)
#define TERN_ANY_TAG (-1)
#define TERN_TAG_MAX 0x7fffffff

/* What a completed receive got. */
typedef struct tern_msg_info {
    int source;
    int tag;
    size_t len; /* bytes the sender sent (more than the buffer on TERN_ERR_TRUNCATED) */
} tern_msg_info_t;

/*
 * Start sending buf[0..len) to rank dst with tag (0..TERN_TAG_MAX). The buffer
 * must stay untouched until the request completes. *req is set on TERN_OK;
 * on error no request exists. A send to oneself is allowed.
 */
TERN_API tern_status_t tern_isend(tern_ctx_t *ctx, const void *buf, size_t len, int dst, int tag,
                                  tern_request_t **req);

/* Start receiving at most cap bytes into buf from src (or TERN_ANY_SOURCE) with
 * tag (or TERN_ANY_TAG). A message longer than cap completes the request with
 * TERN_ERR_TRUNCATED (the first cap bytes are delivered) and, for a rendezvous
 * message, fails the sender's request with TERN_ERR_TRUNCATED too. */
TERN_API tern_status_t tern_irecv(tern_ctx_t *ctx, void *buf, size_t cap, int src, int tag,
                                  tern_request_t **req);

/* Wait for the request, free it, and return its status (info may be NULL).
 * timeout_ns < 0 waits for ever; on TERN_ERR_TIMEOUT the request stays valid. */
TERN_API tern_status_t tern_request_wait(tern_request_t *req, int64_t timeout_ns,
                                         tern_msg_info_t *info);

/* Non-blocking: *done = 1 and the request freed (status returned) when it has
 * completed; *done = 0 and TERN_OK otherwise. */
TERN_API tern_status_t tern_request_test(tern_request_t *req, int *done, tern_msg_info_t *info);

/* Blocking forms. */
TERN_API tern_status_t tern_send(tern_ctx_t *ctx, const void *buf, size_t len, int dst, int tag);
TERN_API tern_status_t tern_recv(tern_ctx_t *ctx, void *buf, size_t cap, int src, int tag,
                                 tern_msg_info_t *info);

/*
 * Tensors, as torch.distributed.send/recv/isend/irecv: the tensor's bytes go
 * as one message, by the same rules as a buffer's (matching, ordering, eager
 * or rendezvous). The tensor must be valid, contiguous and on the CPU
 * (TERN_ERR_UNSUPPORTED otherwise: CUDA tensors come with the GPU transport)
 * and stay untouched until a request completes. Only the bytes travel, as in
 * torch: the receiving tensor gives them their dtype and shape, and must hold
 * exactly what was sent. A longer message is TERN_ERR_TRUNCATED (as for a
 * buffer: the tensor gets its first bytes; a rendezvous sender fails too), a
 * shorter one TERN_ERR_MISMATCH at the receiver (the tensor gets the bytes
 * that came; info says how many and from whom). A tensor may be received
 * into a buffer and a buffer into a tensor.
 */
TERN_API tern_status_t tern_send_tensor(tern_ctx_t *ctx, const tern_tensor_t *t, int dst, int tag);
TERN_API tern_status_t tern_recv_tensor(tern_ctx_t *ctx, tern_tensor_t *t, int src, int tag,
                                        tern_msg_info_t *info);
TERN_API tern_status_t tern_isend_tensor(tern_ctx_t *ctx, const tern_tensor_t *t, int dst, int tag,
                                         tern_request_t **req);
TERN_API tern_status_t tern_irecv_tensor(tern_ctx_t *ctx, tern_tensor_t *t, int src, int tag,
                                         tern_request_t **req);

/*
 * A send's error that reached its rank after the send had completed. A send of
 * TERN_EAGER_LIMIT bytes or less completes as the transport takes it, so when
 * the receive that matches it has a smaller buffer, the receiver's
 * TERN_ERR_TRUNCATED is the first error, and the sender hears of it later, in
 * a message from the receiver. (A larger send waits for its receiver and fails
 * its own request with TERN_ERR_TRUNCATED instead.) Each such report is logged
 * at warn level as it arrives and kept until tern_p2p_error takes it: the
 * oldest TERN_P2P_ERRORS_KEPT of them; reports past those are counted, not
 * kept.
 */
#define TERN_P2P_ERRORS_KEPT 64

typedef struct tern_p2p_error {
    tern_status_t status; /* TERN_ERR_TRUNCATED */
    int peer;             /* the rank whose receive was too small */
    int tag;              /* the send's tag */
    size_t len;           /* bytes sent */
    size_t cap;           /* bytes the receive buffer had */
    uint64_t dropped;     /* reports not kept so far on this context (the queue was full) */
} tern_p2p_error_t;

/*
 * Take the oldest kept report into *err: TERN_OK, or TERN_ERR_NOT_FOUND when
 * none is kept. Progresses the transport once first (unless another thread
 * is), so a loop that polls for a report sees it arrive.
 */
TERN_API tern_status_t tern_p2p_error(tern_ctx_t *ctx, tern_p2p_error_t *err);

/* The transport the context runs on: provider name and device, for reports. */
TERN_API tern_status_t tern_ctx_transport(const tern_ctx_t *ctx, char *provider, size_t plen,
                                          char *device, size_t dlen);

TERN_END_DECLS

#endif
