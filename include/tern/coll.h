/*
 * Collectives over groups of ranks, as torch.distributed's and MPI's.
 *
 * Groups. tern_group_world() is every rank of the context. tern_group_create()
 * makes a sub-group from a list of world ranks; as torch.distributed.new_group,
 * every rank of the world calls it, in the same order, with the same list, even
 * ranks that are not in it: a non-member gets a handle whose every collective
 * fails with TERN_ERR_INVALID_PARAM naming the group. Ranks inside a group are
 * numbered 0..size-1 in the order of the list; every root below is such a group
 * rank (tern_group_rank_of() translates from a world rank).
 *
 * Ordering. The members of a group call its collectives in the same order (as
 * in MPI and NCCL); each call gets the next sequence number on the group, which
 * keeps the messages of overlapping calls apart. Calls on different groups are
 * independent and may run concurrently, from different threads too.
 *
 * Blocking and non-blocking. Every operation takes `tern_request_t **req`: NULL
 * makes the call blocking (it returns the outcome); otherwise the call returns
 * at once with *req set, and tern_request_wait()/tern_request_test() give the
 * outcome (torch's async_op=True and work.wait()). The buffers must stay
 * untouched until then. Non-blocking collectives progress in the background
 * (the progress thread), not only inside wait.
 *
 * In place. Passing the same pointer as send and receive buffer is in-place
 * where torch.distributed is: all_reduce and reduce (recvbuf == sendbuf),
 * all_gather (sendbuf == recvbuf + rank * count elements), reduce_scatter
 * (recvbuf == sendbuf + rank * count elements). Other overlap is an error.
 *
 * Failures. A peer that is lost, or no progress for TERN_TIMEOUT, fails the
 * call with TERN_ERR_PEER_LOST / TERN_ERR_TIMEOUT; tern_last_error() names the
 * operation, its sequence number on the group and the ranks it was still
 * waiting for. The group is then broken: every later call on it fails with the
 * same status (as an aborted NCCL communicator), since its members no longer
 * agree on where they are.
 *
 * Results are deterministic: the same inputs give bit-identical outputs on
 * every rank and in every run (docs/collectives.md gives the order in which
 * each algorithm combines contributions).
 */
#ifndef TERN_COLL_H
#define TERN_COLL_H

#include <stddef.h>

#include <tern/context.h>
#include <tern/defs.h>
#include <tern/p2p.h>
#include <tern/status.h>
#include <tern/tensor.h>

TERN_BEGIN_DECLS

typedef struct tern_group tern_group_t;

/* ---- groups ---- */

/* The group of all ranks; owned by the context (never destroy it). NULL only
 * if ctx is NULL or out of memory (tern_last_error() says). */
TERN_API tern_group_t *tern_group_world(tern_ctx_t *ctx);

/* A group of the world ranks ranks[0..n) (distinct, in range, n >= 1). Called
 * by every rank of the world in the same order with the same list; members and
 * non-members alike get *out. No messages are exchanged. */
TERN_API tern_status_t tern_group_create(tern_ctx_t *ctx, const int *ranks, size_t n,
                                         tern_group_t **out);

/* Free a group made by tern_group_create(). Its operations must be complete.
 * What a failed call left for it (messages that came after the failure) is
 * dropped with it. NULL and the world group are ignored; a group may be
 * destroyed after its context is finalized (calls on it then fail). */
TERN_API void tern_group_destroy(tern_group_t *group);

/* This rank's number in the group, or -1 if it is not a member. */
TERN_API int tern_group_rank(const tern_group_t *group);
TERN_API int tern_group_size(const tern_group_t *group);
/* World rank of group rank r, or -1 if r is out of range. */
TERN_API int tern_group_world_rank(const tern_group_t *group, int r);
/* Group rank of world rank w, or -1 if w is not a member. */
TERN_API int tern_group_rank_of(const tern_group_t *group, int w);

/* ---- operations on raw buffers (counts are in elements of dtype) ---- */

/* recvbuf[i] = op over ranks of sendbuf[i], on every rank. */
TERN_API tern_status_t tern_all_reduce(tern_group_t *group, const void *sendbuf, void *recvbuf,
                                       size_t count, tern_dtype_t dtype, tern_reduce_op_t op,
                                       tern_request_t **req);

/* buf on root is copied to buf on every rank. */
TERN_API tern_status_t tern_broadcast(tern_group_t *group, void *buf, size_t count,
                                      tern_dtype_t dtype, int root, tern_request_t **req);

/* recvbuf on root = op over ranks of sendbuf; recvbuf is ignored elsewhere. */
TERN_API tern_status_t tern_reduce(tern_group_t *group, const void *sendbuf, void *recvbuf,
                                   size_t count, tern_dtype_t dtype, tern_reduce_op_t op,
                                   int root, tern_request_t **req);

/* recvbuf[r * count ..] = sendbuf of rank r, on every rank. */
TERN_API tern_status_t tern_all_gather(tern_group_t *group, const void *sendbuf, void *recvbuf,
                                       size_t count, tern_dtype_t dtype, tern_request_t **req);

/* recvbuf[displs[r] ..] = the counts[r] elements rank r sends (sendcount on
 * rank r must equal counts[r]). */
TERN_API tern_status_t tern_all_gatherv(tern_group_t *group, const void *sendbuf, size_t sendcount,
                                        void *recvbuf, const size_t *counts, const size_t *displs,
                                        tern_dtype_t dtype, tern_request_t **req);

/* On root, recvbuf[r * count ..] = sendbuf of rank r; recvbuf ignored elsewhere. */
TERN_API tern_status_t tern_gather(tern_group_t *group, const void *sendbuf, void *recvbuf,
                                   size_t count, tern_dtype_t dtype, int root, tern_request_t **req);

/* On root, recvbuf[displs[r] ..] = the counts[r] elements of rank r (counts and
 * displs are read on root only). */
TERN_API tern_status_t tern_gatherv(tern_group_t *group, const void *sendbuf, size_t sendcount,
                                    void *recvbuf, const size_t *counts, const size_t *displs,
                                    tern_dtype_t dtype, int root, tern_request_t **req);

/* recvbuf on rank r = sendbuf[r * count ..] of root; sendbuf read on root only. */
TERN_API tern_status_t tern_scatter(tern_group_t *group, const void *sendbuf, void *recvbuf,
                                    size_t count, tern_dtype_t dtype, int root,
                                    tern_request_t **req);

/* recvbuf on rank r = counts[r] elements at sendbuf[displs[r]] of root (counts
 * and displs read on root only; recvcount must equal counts[r]). */
TERN_API tern_status_t tern_scatterv(tern_group_t *group, const void *sendbuf, const size_t *counts,
                                     const size_t *displs, void *recvbuf, size_t recvcount,
                                     tern_dtype_t dtype, int root, tern_request_t **req);

/* recvbuf (count elements) on rank r = op over ranks of sendbuf[r * count ..]. */
TERN_API tern_status_t tern_reduce_scatter(tern_group_t *group, const void *sendbuf, void *recvbuf,
                                           size_t count, tern_dtype_t dtype, tern_reduce_op_t op,
                                           tern_request_t **req);

/* recvbuf[s * count ..] on rank r = sendbuf[r * count ..] of rank s. */
TERN_API tern_status_t tern_all_to_all(tern_group_t *group, const void *sendbuf, void *recvbuf,
                                       size_t count, tern_dtype_t dtype, tern_request_t **req);

/* recvbuf[rdispls[s] ..] (rcounts[s] elements) on rank r = the scounts[r]
 * elements at sendbuf[sdispls[r]] of rank s. */
TERN_API tern_status_t tern_all_to_allv(tern_group_t *group, const void *sendbuf,
                                        const size_t *scounts, const size_t *sdispls, void *recvbuf,
                                        const size_t *rcounts, const size_t *rdispls,
                                        tern_dtype_t dtype, tern_request_t **req);

/* Returns (or completes) once every member has entered it. */
TERN_API tern_status_t tern_barrier(tern_group_t *group, tern_request_t **req);

/* ---- operations on tensors ----
 * Tensors must be contiguous and on the CPU (TERN_ERR_UNSUPPORTED otherwise:
 * CUDA tensors come with the GPU transport); shapes and dtypes are checked
 * against each other as torch.distributed does. */

/* In place on every rank (torch.distributed.all_reduce). */
TERN_API tern_status_t tern_all_reduce_tensor(tern_group_t *group, tern_tensor_t *t,
                                              tern_reduce_op_t op, tern_request_t **req);
TERN_API tern_status_t tern_broadcast_tensor(tern_group_t *group, tern_tensor_t *t, int root,
                                             tern_request_t **req);
/* In place; the result is in t on root only (torch.distributed.reduce). */
TERN_API tern_status_t tern_reduce_tensor(tern_group_t *group, tern_tensor_t *t,
                                          tern_reduce_op_t op, int root, tern_request_t **req);
/* out has size * numel(in) elements (all_gather_into_tensor). */
TERN_API tern_status_t tern_all_gather_tensor(tern_group_t *group, tern_tensor_t *out,
                                              const tern_tensor_t *in, tern_request_t **req);
/* in has size * numel(out) elements (reduce_scatter_tensor). */
TERN_API tern_status_t tern_reduce_scatter_tensor(tern_group_t *group, tern_tensor_t *out,
                                                  const tern_tensor_t *in, tern_reduce_op_t op,
                                                  tern_request_t **req);
/* Equal splits along the flattened tensor (all_to_all_single). */
TERN_API tern_status_t tern_all_to_all_tensor(tern_group_t *group, tern_tensor_t *out,
                                              const tern_tensor_t *in, tern_request_t **req);
/* out (size * numel(in) elements) is used on root only; it may be NULL elsewhere. */
TERN_API tern_status_t tern_gather_tensor(tern_group_t *group, tern_tensor_t *out,
                                          const tern_tensor_t *in, int root, tern_request_t **req);
/* in (size * numel(out) elements) is used on root only; it may be NULL elsewhere. */
TERN_API tern_status_t tern_scatter_tensor(tern_group_t *group, tern_tensor_t *out,
                                           const tern_tensor_t *in, int root, tern_request_t **req);

TERN_END_DECLS

#endif
