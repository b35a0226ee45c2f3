/*
 * The public collectives: argument checks, the choice of algorithm, and the
 * tensor forms. Every check that can be made locally is made before anything
 * is sent, so a bad call on one rank fails there at once (its peers then see
 * the call missing and time out, as with any rank that does not call).
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/coll.h"
#include "core/bytes.h"
#include "core/config.h"
#include "core/context.h"
#include "core/error.h"
#include "core/log.h"
#include "tensor/host.h"
#include "tensor/reduce.h"

/* Sizes below which latency-bound algorithms win (docs/collectives.md has
 * the measurements behind them). */
#define AR_RD_MAX (16u * 1024)       /* all_reduce: recursive doubling up to this */
/* On 2 ranks recursive doubling moves the same bytes as Rabenseifner (the
 * whole buffer each way) in one exchange instead of two: one rendezvous
 * instead of two, both directions busy the whole call, for a second
 * reduction of half the buffer. That wins up to here (docs/collectives.md). */
#define AR_RD_MAX_PAIR (1u << 20)
/* all_reduce: then Rabenseifner up to these (docs/collectives.md has the
 * measurements), then the ring: on 4, 8, 16... ranks over shared memory, and
 * over a network path; on 2, where above it the ring's overlap of reduction
 * and transfer wins; on any other size, where Rabenseifner first folds whole
 * buffers in. */
#define AR_RAB_MAX (32u << 20)
#define AR_RAB_MAX_NET (8u << 20)
#define AR_RAB_MAX_PAIR (8u << 20)
#define AR_RAB_MAX_FOLD (1u << 20)
#define TREE_MAX (256u * 1024)       /* broadcast/reduce: binomial tree up to this */
#define AG_BRUCK_MAX (64u * 1024)    /* all_gather: Bruck up to this total */
#define A2A_LINEAR_MAX (256u * 1024) /* all_to_all: everything at once up to this per pair */
#define SEG_MIN (4u * 1024)

typedef struct call {
    tern_group_t *g;
    const char *name;
    size_t es;
} call_t;

/* The checks every call starts with. */
static tern_status_t call_begin(call_t *k, tern_group_t *g, const char *name, tern_dtype_t dtype)
{
    k->g = g;
    k->name = name;
    k->es = tern_dtype_size(dtype);
    if (g == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "%s: NULL group", name);
    if (g->comm == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "%s: group %u's context is finalized", name,
                           g->cid);
    if (g->rank < 0)
        return tern__error(TERN_ERR_INVALID_PARAM,
                           "%s: world rank %u is not a member of group %u (%d ranks)", name,
                           g->comm->rank, g->cid, g->size);
    if (g->broken != TERN_OK)
        return tern__error(g->broken, "%s: group %u is unusable after an earlier failure: %s",
                           name, g->cid, g->broken_detail);
    if (k->es == 0)
        return tern__error(TERN_ERR_INVALID_PARAM, "%s: unknown dtype %d", name, (int)dtype);
    return TERN_OK;
}

static tern_status_t check_root(const call_t *k, int root)
{
    if (root < 0 || root >= k->g->size)
        return tern__error(TERN_ERR_INVALID_PARAM, "%s: root %d is not a rank of the group (0..%d)",
                           k->name, root, k->g->size - 1);
    return TERN_OK;
}

static tern_status_t check_op(const call_t *k, tern_reduce_op_t op, tern_dtype_t dtype)
{
    tern_status_t st = tern__reduce_check(op, dtype);
    if (st != TERN_OK)
        return tern__error(st, "%s: %s", k->name, tern_last_error());
    return TERN_OK;
}

/* count * es * mult in bytes, failing rather than wrapping. */
static tern_status_t bytes_of(const call_t *k, size_t count, size_t mult, size_t *out)
{
    size_t n;
    if (count != 0 && (mult == 0 || __builtin_mul_overflow(count, k->es, &n) ||
                       __builtin_mul_overflow(n, mult, &n)))
        return tern__error(TERN_ERR_OUT_OF_RANGE, "%s: %zu elements are too many", k->name, count);
    *out = count * k->es * mult;
    return TERN_OK;
}

static tern_status_t check_buf(const call_t *k, const void *p, size_t bytes, const char *what)
{
    if (p == NULL && bytes > 0)
        return tern__error(TERN_ERR_INVALID_PARAM, "%s: %s is NULL", k->name, what);
    return TERN_OK;
}

/* The reduction kernels read whole elements: C's alignment for the dtype. */
static tern_status_t check_align(const call_t *k, const void *p, const char *what)
{
    if (((uintptr_t)p & (k->es - 1)) != 0) /* element sizes are powers of two */
        return tern__error(TERN_ERR_INVALID_PARAM, "%s: %s is not aligned to its %zu-byte elements",
                           k->name, what, k->es);
    return TERN_OK;
}

static bool overlap(const void *a, size_t alen, const void *b, size_t blen)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return alen > 0 && blen > 0 && x < y + blen && y < x + alen;
}

static const tern__config_t *cfg_of(const tern_group_t *g)
{
    return tern__ctx_config(g->ctx);
}

static size_t segment(const tern_group_t *g)
{
    size_t s = (size_t)cfg_of(g)->coll_segment;
    return s < SEG_MIN ? SEG_MIN : s;
}

/* The algorithms' names, in the order of their enums and of the
 * TERN_COLL_ALGO_* values (core/config.c). */
static const char *const AR_NAMES[] = {"auto", "ring", "rd", "rabenseifner"};
static const char *const BC_NAMES[] = {"auto", "binomial", "chain"};
static const char *const AG_NAMES[] = {"auto", "ring", "bruck"};
static const char *const A2A_NAMES[] = {"auto", "pairwise", "linear"};

/*
 * The signature's hash: FNV-1a taken a 64-bit word at a time (FNV's 64-bit
 * prime, each product folded onto itself so high bits reach the low ones),
 * then folded to 32 bits. Byte at a time it was a tenth of a small
 * all_reduce. Words are the values, and the name's bytes little-endian, so
 * every host computes the same.
 */
#define SIG_PRIME 0x100000001b3ull

static uint64_t sig_mix(uint64_t h, uint64_t w)
{
    h = (h ^ w) * SIG_PRIME;
    return h ^ (h >> 29);
}

static uint64_t sig_name(const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a's 64-bit offset basis */
    size_t len = strlen(name);
    for (size_t i = 0; i < len; i += 8) {
        uint8_t w[8] = {0};
        memcpy(w, name + i, len - i < 8 ? len - i : 8);
        h = sig_mix(h, tern__get_le64(w));
    }
    return sig_mix(h, len);
}

static uint32_t sig_words(uint64_t h, const uint64_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = sig_mix(h, v[i]);
    return (uint32_t)(h ^ (h >> 32));
}

/* A new call with its signature (tern__coll_t.shape): what every member
 * must pass alike, hashed (FNV-1a). count is SIZE_MAX where ranks pass counts
 * of their own (the v-variants), root -1 where there is none. how: the
 * algorithm's name, which a debug line per call gives (as NCCL_DEBUG=INFO
 * does), so a run shows what the size, the group and TERN_COLL_ALGO_* chose. */
static tern__coll_t *coll_new(const call_t *k, tern_dtype_t dtype, tern_reduce_op_t op,
                              size_t count, int root, int algo, const char *how)
{
    tern__coll_t *c = tern__coll_new(k->g, k->name, dtype, op);
    if (c == NULL)
        return NULL;
    if (count != SIZE_MAX)
        tern_debug("%s #%" PRIu32 " on group %" PRIu32 ": %d ranks, %zu x %s, by %s", k->name,
                   c->seq, k->g->cid, k->g->size, count, tern_dtype_name(dtype), how);
    else
        tern_debug("%s #%" PRIu32 " on group %" PRIu32 ": %d ranks, counts per rank, %s, by %s",
                   k->name, c->seq, k->g->cid, k->g->size, tern_dtype_name(dtype), how);
    uint64_t v[] = {(uint64_t)dtype, (uint64_t)op, (uint64_t)count, (uint64_t)(int64_t)root,
                    (uint64_t)(int64_t)algo};
    uint32_t h = sig_words(sig_name(k->name), v, sizeof(v) / sizeof(v[0]));
    c->shape = h != 0 ? h : 1;
    const size_t way_min = k->g->comm->attr.put_way_min;
    c->way_on = way_min > 0 && count != SIZE_MAX && count >= way_min / c->es;
    return c;
}

/* ---- all_reduce ---- */

/* Whether the members reach each other through shared memory: the whole job
 * on one host, over a transport that has it there. */
static bool host_shm(const tern_group_t *g)
{
    return g->comm->attr.host_shm && tern_ctx_local_world_size(g->ctx) == g->comm->world;
}

static size_t rab_max(const tern_group_t *g, bool in_place)
{
    int n = g->size;
    /* The ring's segments overlap one segment's reduction with the next one's
     * transfer, which pays over a network path above 8 MiB. Over shared
     * memory the receiver makes the copy itself, so there is nothing to
     * overlap, and a pair out of place (its first level received straight
     * into the output) stays faster with Rabenseifner at every size. In
     * place it receives into a scratch half of the buffer, allocated anew
     * each call above what a context keeps, and the ring is faster there. */
    if (n == 2)
        return host_shm(g) && !in_place ? SIZE_MAX : AR_RAB_MAX_PAIR;
    if ((n & (n - 1)) != 0)
        return AR_RAB_MAX_FOLD;
    return host_shm(g) ? AR_RAB_MAX : AR_RAB_MAX_NET;
}

tern_status_t tern_all_reduce(tern_group_t *g, const void *sbuf, void *rbuf, size_t count,
                              tern_dtype_t dtype, tern_reduce_op_t op, tern_request_t **req)
{
    call_t k;
    size_t bytes = 0;
    tern_status_t st;
    if ((st = call_begin(&k, g, "all_reduce", dtype)) != TERN_OK ||
        (st = check_op(&k, op, dtype)) != TERN_OK || (st = bytes_of(&k, count, 1, &bytes)) != TERN_OK ||
        (st = check_buf(&k, sbuf, bytes, "sendbuf")) != TERN_OK ||
        (st = check_buf(&k, rbuf, bytes, "recvbuf")) != TERN_OK ||
        (st = check_align(&k, sbuf, "sendbuf")) != TERN_OK ||
        (st = check_align(&k, rbuf, "recvbuf")) != TERN_OK)
        return st;
    if (sbuf != rbuf && overlap(sbuf, bytes, rbuf, bytes))
        return tern__error(TERN_ERR_INVALID_PARAM, "all_reduce: buffers overlap without being the "
                           "same (pass one pointer twice for in place)");
    int algo = (int)cfg_of(g)->coll_algo_allreduce;
    if (algo == AR_AUTO)
        algo = bytes <= AR_RD_MAX || count < (size_t)g->size ||
                       (g->size == 2 && bytes <= AR_RD_MAX_PAIR)
                   ? AR_RD
               : bytes <= rab_max(g, sbuf == rbuf) ? AR_RAB
                                                   : AR_RING;
    tern__coll_t *c = coll_new(&k, dtype, op, count, -1, algo, AR_NAMES[algo]);
    if (c == NULL)
        return TERN_ERR_NO_MEMORY;
    tern__build_allreduce(c, sbuf, rbuf, count, algo, segment(g));
    return tern__coll_start(c, req);
}

/* ---- broadcast ---- */

tern_status_t tern_broadcast(tern_group_t *g, void *buf, size_t count, tern_dtype_t dtype, int root,
                             tern_request_t **req)
{
    call_t k;
    size_t bytes = 0;
    tern_status_t st;
    if ((st = call_begin(&k, g, "broadcast", dtype)) != TERN_OK ||
        (st = check_root(&k, root)) != TERN_OK || (st = bytes_of(&k, count, 1, &bytes)) != TERN_OK ||
        (st = check_buf(&k, buf, bytes, "buf")) != TERN_OK)
        return st;
    int algo = (int)cfg_of(g)->coll_algo_broadcast;
    if (algo == BC_AUTO)
        algo = bytes <= TREE_MAX || g->size <= 2 ? BC_BINOMIAL : BC_CHAIN;
    tern__coll_t *c = coll_new(&k, dtype, TERN_SUM, count, root, algo, BC_NAMES[algo]);
    if (c == NULL)
        return TERN_ERR_NO_MEMORY;
    tern__build_bcast(c, buf, bytes, root, algo, segment(g));
    return tern__coll_start(c, req);
}

/* ---- reduce ---- */

tern_status_t tern_reduce(tern_group_t *g, const void *sbuf, void *rbuf, size_t count,
                          tern_dtype_t dtype, tern_reduce_op_t op, int root, tern_request_t **req)
{
    call_t k;
    size_t bytes = 0;
    tern_status_t st;
    if ((st = call_begin(&k, g, "reduce", dtype)) != TERN_OK ||
        (st = check_root(&k, root)) != TERN_OK || (st = check_op(&k, op, dtype)) != TERN_OK ||
        (st = bytes_of(&k, count, 1, &bytes)) != TERN_OK ||
        (st = check_buf(&k, sbuf, bytes, "sendbuf")) != TERN_OK ||
        (st = check_align(&k, sbuf, "sendbuf")) != TERN_OK)
        return st;
    if (g->rank == root) {
        if ((st = check_buf(&k, rbuf, bytes, "recvbuf")) != TERN_OK ||
            (st = check_align(&k, rbuf, "recvbuf")) != TERN_OK)
            return st;
        if (sbuf != rbuf && overlap(sbuf, bytes, rbuf, bytes))
            return tern__error(TERN_ERR_INVALID_PARAM, "reduce: buffers overlap without being the "
                               "same (pass one pointer twice for in place)");
    }
    int algo = (int)cfg_of(g)->coll_algo_reduce;
    if (algo == BC_AUTO)
        algo = bytes <= TREE_MAX ? BC_BINOMIAL : BC_CHAIN;
    tern__coll_t *c = coll_new(&k, dtype, op, count, root, algo, BC_NAMES[algo]);
    if (c == NULL)
        return TERN_ERR_NO_MEMORY;
    tern__build_reduce(c, sbuf, g->rank == root ? rbuf : NULL, count, root, algo, segment(g));
    return tern__coll_start(c, req);
}

/* ---- all_gather ---- */

/* Every block of a v-call in range; *total = bytes up to the end of the last. */
static tern_status_t check_blocks(const call_t *k, const size_t *counts, const size_t *displs,
                                  size_t *total)
{
    *total = 0;
    if (counts == NULL || displs == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "%s: NULL counts or displs", k->name);
    for (int r = 0; r < k->g->size; r++) {
        size_t end;
        if (__builtin_add_overflow(displs[r], counts[r], &end) || bytes_of(k, end, 1, &end) != TERN_OK)
            return tern__error(TERN_ERR_OUT_OF_RANGE, "%s: block %d is out of range", k->name, r);
        *total = end > *total ? end : *total;
    }
    return TERN_OK;
}

static tern_status_t all_gather_common(call_t *k, const void *sbuf, size_t scount, void *rbuf,
                                       const size_t *counts, const size_t *displs,
                                       tern_dtype_t dtype, bool equal, tern_request_t **req)
{
    tern_group_t *g = k->g;
    size_t sbytes = 0, total = 0;
    tern_status_t st;
    if ((st = bytes_of(k, scount, 1, &sbytes)) != TERN_OK ||
        (st = check_buf(k, sbuf, sbytes, "sendbuf")) != TERN_OK)
        return st;
    if (scount != counts[g->rank])
        return tern__error(TERN_ERR_INVALID_PARAM, "%s: sendcount %zu but counts[%d] = %zu",
                           k->name, scount, g->rank, counts[g->rank]);
    if ((st = check_blocks(k, counts, displs, &total)) != TERN_OK ||
        (st = check_buf(k, rbuf, total, "recvbuf")) != TERN_OK)
        return st;
    const void *mine = (const char *)rbuf + displs[g->rank] * k->es;
    if (sbuf != mine && overlap(sbuf, sbytes, rbuf, total))
        return tern__error(TERN_ERR_INVALID_PARAM, "%s: sendbuf overlaps recvbuf without being "
                           "this rank's block (in place)", k->name);
    int algo = (int)cfg_of(g)->coll_algo_allgather;
    if (!equal)
        algo = AG_RING;
    else if (algo == AG_AUTO)
        algo = total <= AG_BRUCK_MAX ? AG_BRUCK : AG_RING;
    tern__coll_t *c = coll_new(k, dtype, TERN_SUM, SIZE_MAX, -1, algo, AG_NAMES[algo]);
    if (c == NULL)
        return TERN_ERR_NO_MEMORY;
    tern__build_allgatherv(c, sbuf, rbuf, counts, displs, algo);
    return tern__coll_start(c, req);
}

/* counts and displs for equal blocks of count elements. */
static tern_status_t equal_blocks(const call_t *k, size_t count, size_t **counts, size_t **displs)
{
    size_t n = (size_t)k->g->size, dummy = 0;
    tern_status_t st = bytes_of(k, count, n, &dummy);
    if (st != TERN_OK)
        return st;
    *counts = malloc(n * sizeof(**counts));
    *displs = malloc(n * sizeof(**displs));
    if (*counts == NULL || *displs == NULL) {
        free(*counts);
        free(*displs);
        return tern__error(TERN_ERR_NO_MEMORY, "%s: no memory", k->name);
    }
    for (size_t r = 0; r < n; r++) {
        (*counts)[r] = count;
        (*displs)[r] = r * count;
    }
    return TERN_OK;
}

tern_status_t tern_all_gather(tern_group_t *g, const void *sbuf, void *rbuf, size_t count,
                              tern_dtype_t dtype, tern_request_t **req)
{
    call_t k;
    size_t *counts = NULL, *displs = NULL;
    tern_status_t st;
    if ((st = call_begin(&k, g, "all_gather", dtype)) != TERN_OK ||
        (st = equal_blocks(&k, count, &counts, &displs)) != TERN_OK)
        return st;
    /* The schedule keeps pointers into counts/displs only while building. */
    st = all_gather_common(&k, sbuf, count, rbuf, counts, displs, dtype, true, req);
    free(counts);
    free(displs);
    return st;
}

tern_status_t tern_all_gatherv(tern_group_t *g, const void *sbuf, size_t scount, void *rbuf,
                               const size_t *counts, const size_t *displs, tern_dtype_t dtype,
                               tern_request_t **req)
{
    call_t k;
    tern_status_t st;
    if ((st = call_begin(&k, g, "all_gatherv", dtype)) != TERN_OK)
        return st;
    if (counts == NULL || displs == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "all_gatherv: NULL counts or displs");
    return all_gather_common(&k, sbuf, scount, rbuf, counts, displs, dtype, false, req);
}

/* ---- gather / scatter ---- */

static tern_status_t gatherv_common(call_t *k, const void *sbuf, size_t scount, void *rbuf,
                                    const size_t *counts, const size_t *displs, tern_dtype_t dtype,
                                    int root, tern_request_t **req)
{
    tern_group_t *g = k->g;
    size_t sbytes = 0, total = 0;
    tern_status_t st;
    if ((st = check_root(k, root)) != TERN_OK || (st = bytes_of(k, scount, 1, &sbytes)) != TERN_OK ||
        (st = check_buf(k, sbuf, sbytes, "sendbuf")) != TERN_OK)
        return st;
    if (g->rank == root) {
        if ((st = check_blocks(k, counts, displs, &total)) != TERN_OK ||
            (st = check_buf(k, rbuf, total, "recvbuf")) != TERN_OK)
            return st;
        if (scount != counts[root])
            return tern__error(TERN_ERR_INVALID_PARAM, "%s: sendcount %zu but counts[%d] = %zu",
                               k->name, scount, root, counts[root]);
    }
    tern__coll_t *c = coll_new(k, dtype, TERN_SUM, SIZE_MAX, root, 0, "linear");
    if (c == NULL)
        return TERN_ERR_NO_MEMORY;
    tern__build_gatherv(c, sbuf, scount, rbuf, counts, displs, root);
    return tern__coll_start(c, req);
}

tern_status_t tern_gather(tern_group_t *g, const void *sbuf, void *rbuf, size_t count,
                          tern_dtype_t dtype, int root, tern_request_t **req)
{
    call_t k;
    size_t *counts = NULL, *displs = NULL;
    tern_status_t st;
    if ((st = call_begin(&k, g, "gather", dtype)) != TERN_OK ||
        (st = equal_blocks(&k, count, &counts, &displs)) != TERN_OK)
        return st;
    st = gatherv_common(&k, sbuf, count, rbuf, counts, displs, dtype, root, req);
    free(counts);
    free(displs);
    return st;
}

tern_status_t tern_gatherv(tern_group_t *g, const void *sbuf, size_t scount, void *rbuf,
                           const size_t *counts, const size_t *displs, tern_dtype_t dtype, int root,
                           tern_request_t **req)
{
    call_t k;
    tern_status_t st;
    if ((st = call_begin(&k, g, "gatherv", dtype)) != TERN_OK)
        return st;
    return gatherv_common(&k, sbuf, scount, rbuf, counts, displs, dtype, root, req);
}

static tern_status_t scatterv_common(call_t *k, const void *sbuf, const size_t *counts,
                                     const size_t *displs, void *rbuf, size_t rcount,
                                     tern_dtype_t dtype, int root, tern_request_t **req)
{
    tern_group_t *g = k->g;
    size_t rbytes = 0, total = 0;
    tern_status_t st;
    if ((st = check_root(k, root)) != TERN_OK || (st = bytes_of(k, rcount, 1, &rbytes)) != TERN_OK ||
        (st = check_buf(k, rbuf, rbytes, "recvbuf")) != TERN_OK)
        return st;
    if (g->rank == root) {
        if ((st = check_blocks(k, counts, displs, &total)) != TERN_OK ||
            (st = check_buf(k, sbuf, total, "sendbuf")) != TERN_OK)
            return st;
        if (rcount != counts[root])
            return tern__error(TERN_ERR_INVALID_PARAM, "%s: recvcount %zu but counts[%d] = %zu",
                               k->name, rcount, root, counts[root]);
    }
    tern__coll_t *c = coll_new(k, dtype, TERN_SUM, SIZE_MAX, root, 0, "linear");
    if (c == NULL)
        return TERN_ERR_NO_MEMORY;
    tern__build_scatterv(c, sbuf, counts, displs, rbuf, rcount, root);
    return tern__coll_start(c, req);
}

tern_status_t tern_scatter(tern_group_t *g, const void *sbuf, void *rbuf, size_t count,
                           tern_dtype_t dtype, int root, tern_request_t **req)
{
    call_t k;
    size_t *counts = NULL, *displs = NULL;
    tern_status_t st;
    if ((st = call_begin(&k, g, "scatter", dtype)) != TERN_OK ||
        (st = equal_blocks(&k, count, &counts, &displs)) != TERN_OK)
        return st;
    st = scatterv_common(&k, sbuf, counts, displs, rbuf, count, dtype, root, req);
    free(counts);
    free(displs);
    return st;
}

tern_status_t tern_scatterv(tern_group_t *g, const void *sbuf, const size_t *counts,
                            const size_t *displs, void *rbuf, size_t rcount, tern_dtype_t dtype,
                            int root, tern_request_t **req)
{
    call_t k;
    tern_status_t st;
    if ((st = call_begin(&k, g, "scatterv", dtype)) != TERN_OK)
        return st;
    return scatterv_common(&k, sbuf, counts, displs, rbuf, rcount, dtype, root, req);
}

/* ---- reduce_scatter ---- */

tern_status_t tern_reduce_scatter(tern_group_t *g, const void *sbuf, void *rbuf, size_t count,
                                  tern_dtype_t dtype, tern_reduce_op_t op, tern_request_t **req)
{
    call_t k;
    size_t rbytes = 0, sbytes = 0;
    tern_status_t st;
    if ((st = call_begin(&k, g, "reduce_scatter", dtype)) != TERN_OK ||
        (st = check_op(&k, op, dtype)) != TERN_OK || (st = bytes_of(&k, count, 1, &rbytes)) != TERN_OK ||
        (st = bytes_of(&k, count, (size_t)g->size, &sbytes)) != TERN_OK ||
        (st = check_buf(&k, sbuf, sbytes, "sendbuf")) != TERN_OK ||
        (st = check_buf(&k, rbuf, rbytes, "recvbuf")) != TERN_OK ||
        (st = check_align(&k, sbuf, "sendbuf")) != TERN_OK ||
        (st = check_align(&k, rbuf, "recvbuf")) != TERN_OK)
        return st;
    const void *mine = (const char *)sbuf + (size_t)g->rank * rbytes;
    if (rbuf != mine && overlap(sbuf, sbytes, rbuf, rbytes))
        return tern__error(TERN_ERR_INVALID_PARAM, "reduce_scatter: recvbuf overlaps sendbuf "
                           "without being this rank's block (in place)");
    tern__coll_t *c = coll_new(&k, dtype, op, count, -1, 0, "ring");
    if (c == NULL)
        return TERN_ERR_NO_MEMORY;
    tern__build_reduce_scatter(c, sbuf, rbuf, count, segment(g));
    return tern__coll_start(c, req);
}

/* ---- all_to_all ---- */

static tern_status_t all_to_all_common(call_t *k, const void *sbuf, const size_t *scounts,
                                       const size_t *sdispls, void *rbuf, const size_t *rcounts,
                                       const size_t *rdispls, tern_dtype_t dtype, size_t pair_bytes,
                                       tern_request_t **req)
{
    tern_group_t *g = k->g;
    size_t stotal = 0, rtotal = 0;
    tern_status_t st;
    if ((st = check_blocks(k, scounts, sdispls, &stotal)) != TERN_OK ||
        (st = check_blocks(k, rcounts, rdispls, &rtotal)) != TERN_OK ||
        (st = check_buf(k, sbuf, stotal, "sendbuf")) != TERN_OK ||
        (st = check_buf(k, rbuf, rtotal, "recvbuf")) != TERN_OK)
        return st;
    if (overlap(sbuf, stotal, rbuf, rtotal))
        return tern__error(TERN_ERR_INVALID_PARAM, "%s: sendbuf and recvbuf overlap", k->name);
    if (scounts[g->rank] != rcounts[g->rank])
        return tern__error(TERN_ERR_INVALID_PARAM, "%s: this rank sends itself %zu elements but "
                           "expects %zu", k->name, scounts[g->rank], rcounts[g->rank]);
    int algo = (int)cfg_of(g)->coll_algo_alltoall;
    if (algo == A2A_AUTO)
        algo = pair_bytes <= A2A_LINEAR_MAX ? A2A_LINEAR : A2A_PAIRWISE;
    /* Its two schedules exchange the same messages (they differ only in what
     * waits for what), and all_to_allv ranks choose by their own counts. */
    tern__coll_t *c = coll_new(k, dtype, TERN_SUM, SIZE_MAX, -1, 0, A2A_NAMES[algo]);
    if (c == NULL)
        return TERN_ERR_NO_MEMORY;
    tern__build_alltoallv(c, sbuf, scounts, sdispls, rbuf, rcounts, rdispls, algo);
    return tern__coll_start(c, req);
}

tern_status_t tern_all_to_all(tern_group_t *g, const void *sbuf, void *rbuf, size_t count,
                              tern_dtype_t dtype, tern_request_t **req)
{
    call_t k;
    size_t *counts = NULL, *displs = NULL;
    tern_status_t st;
    if ((st = call_begin(&k, g, "all_to_all", dtype)) != TERN_OK ||
        (st = equal_blocks(&k, count, &counts, &displs)) != TERN_OK)
        return st;
    st = all_to_all_common(&k, sbuf, counts, displs, rbuf, counts, displs, dtype, count * k.es, req);
    free(counts);
    free(displs);
    return st;
}

tern_status_t tern_all_to_allv(tern_group_t *g, const void *sbuf, const size_t *scounts,
                               const size_t *sdispls, void *rbuf, const size_t *rcounts,
                               const size_t *rdispls, tern_dtype_t dtype, tern_request_t **req)
{
    call_t k;
    tern_status_t st;
    if ((st = call_begin(&k, g, "all_to_allv", dtype)) != TERN_OK)
        return st;
    size_t most = 0;
    for (int r = 0; scounts != NULL && r < g->size; r++)
        most = scounts[r] > most ? scounts[r] : most;
    return all_to_all_common(&k, sbuf, scounts, sdispls, rbuf, rcounts, rdispls, dtype,
                             most * k.es, req);
}

/* ---- barrier ---- */

tern_status_t tern_barrier(tern_group_t *g, tern_request_t **req)
{
    call_t k;
    tern_status_t st;
    if ((st = call_begin(&k, g, "barrier", TERN_DTYPE_U8)) != TERN_OK)
        return st;
    tern__coll_t *c = coll_new(&k, TERN_DTYPE_U8, TERN_SUM, 0, -1, 0, "dissemination");
    if (c == NULL)
        return TERN_ERR_NO_MEMORY;
    tern__build_barrier(c);
    return tern__coll_start(c, req);
}

/* ---- tensors ---- */

/* out and in of one call: same dtype, out's numel = in's * mult (or the reverse). */
static tern_status_t flat_pair(const char *name, const tern_tensor_t *out, const tern_tensor_t *in,
                               size_t out_mult, size_t in_mult, void **od, void **id, size_t *count)
{
    size_t on = 0, in_n = 0;
    tern_status_t st;
    if ((st = tern__tensor_host(name, "output", out, od, &on)) != TERN_OK ||
        (st = tern__tensor_host(name, "input", in, id, &in_n)) != TERN_OK)
        return st;
    if (out->dtype != in->dtype)
        return tern__error(TERN_ERR_INVALID_PARAM, "%s: output is %s but input is %s", name,
                           tern_dtype_name(out->dtype), tern_dtype_name(in->dtype));
    if (on / out_mult * out_mult != on || on / out_mult * in_mult != in_n)
        return tern__error(TERN_ERR_INVALID_PARAM, "%s: output has %zu elements and input %zu; "
                           "expected a ratio of %zu:%zu", name, on, in_n, out_mult, in_mult);
    *count = on / out_mult;
    return TERN_OK;
}

tern_status_t tern_all_reduce_tensor(tern_group_t *g, tern_tensor_t *t, tern_reduce_op_t op,
                                     tern_request_t **req)
{
    void *d = NULL;
    size_t n = 0;
    tern_status_t st = tern__tensor_host("all_reduce", "tensor", t, &d, &n);
    return st != TERN_OK ? st : tern_all_reduce(g, d, d, n, t->dtype, op, req);
}

tern_status_t tern_broadcast_tensor(tern_group_t *g, tern_tensor_t *t, int root,
                                    tern_request_t **req)
{
    void *d = NULL;
    size_t n = 0;
    tern_status_t st = tern__tensor_host("broadcast", "tensor", t, &d, &n);
    return st != TERN_OK ? st : tern_broadcast(g, d, n, t->dtype, root, req);
}

tern_status_t tern_reduce_tensor(tern_group_t *g, tern_tensor_t *t, tern_reduce_op_t op, int root,
                                 tern_request_t **req)
{
    void *d = NULL;
    size_t n = 0;
    tern_status_t st = tern__tensor_host("reduce", "tensor", t, &d, &n);
    return st != TERN_OK ? st : tern_reduce(g, d, d, n, t->dtype, op, root, req);
}

tern_status_t tern_all_gather_tensor(tern_group_t *g, tern_tensor_t *out, const tern_tensor_t *in,
                                     tern_request_t **req)
{
    void *od = NULL, *id = NULL;
    size_t n = 0;
    tern_status_t st;
    if (g == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "all_gather: NULL group");
    if ((st = flat_pair("all_gather", out, in, (size_t)g->size, 1, &od, &id, &n)) != TERN_OK)
        return st;
    return tern_all_gather(g, id, od, n, in->dtype, req);
}

tern_status_t tern_reduce_scatter_tensor(tern_group_t *g, tern_tensor_t *out,
                                         const tern_tensor_t *in, tern_reduce_op_t op,
                                         tern_request_t **req)
{
    void *od = NULL, *id = NULL;
    size_t n = 0;
    tern_status_t st;
    if (g == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "reduce_scatter: NULL group");
    if ((st = flat_pair("reduce_scatter", out, in, 1, (size_t)g->size, &od, &id, &n)) != TERN_OK)
        return st;
    return tern_reduce_scatter(g, id, od, n, in->dtype, op, req);
}

tern_status_t tern_all_to_all_tensor(tern_group_t *g, tern_tensor_t *out, const tern_tensor_t *in,
                                     tern_request_t **req)
{
    void *od = NULL, *id = NULL;
    size_t n = 0;
    tern_status_t st;
    if (g == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "all_to_all: NULL group");
    if ((st = flat_pair("all_to_all", out, in, 1, 1, &od, &id, &n)) != TERN_OK)
        return st;
    if (n % (size_t)g->size != 0)
        return tern__error(TERN_ERR_INVALID_PARAM, "all_to_all: %zu elements do not split "
                           "evenly over %d ranks", n, g->size);
    return tern_all_to_all(g, id, od, n / (size_t)g->size, in->dtype, req);
}

tern_status_t tern_gather_tensor(tern_group_t *g, tern_tensor_t *out, const tern_tensor_t *in,
                                 int root, tern_request_t **req)
{
    void *od = NULL, *id = NULL;
    size_t n = 0, on = 0;
    tern_status_t st;
    if (g == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "gather: NULL group");
    if (g->rank != root)
        st = tern__tensor_host("gather", "input", in, &id, &n);
    else if ((st = flat_pair("gather", out, in, (size_t)g->size, 1, &od, &id, &on)) == TERN_OK)
        n = on;
    return st != TERN_OK ? st : tern_gather(g, id, od, n, in->dtype, root, req);
}

tern_status_t tern_scatter_tensor(tern_group_t *g, tern_tensor_t *out, const tern_tensor_t *in,
                                  int root, tern_request_t **req)
{
    void *od = NULL, *id = NULL;
    size_t n = 0, on = 0;
    tern_status_t st;
    if (g == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "scatter: NULL group");
    if (g->rank != root)
        st = tern__tensor_host("scatter", "output", out, &od, &n);
    else if ((st = flat_pair("scatter", out, in, 1, (size_t)g->size, &od, &id, &on)) == TERN_OK)
        n = on;
    return st != TERN_OK ? st : tern_scatter(g, id, od, n, out->dtype, root, req);
}
