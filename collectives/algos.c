/*
 * The algorithms, as schedule builders (coll.h). Each one appends steps to a
 * collective; the engine runs them. docs/collectives.md describes each and the
 * order in which it combines contributions.
 *
 * Determinism. Every reduction step is written dst = op(a, b) with the
 * operands in a fixed order that depends only on ranks, never on timing, and
 * every element of a result is computed by exactly one chain of steps (other
 * ranks receive copies of it), or by identical expressions on every rank
 * (recursive doubling combines the lower rank's half first on both sides).
 * So results are bit-identical across ranks and runs, for MAX/MIN with NaN
 * and signed zeros too.
 *
 * Hazards. A rendezvous send lets the peer read the buffer until it
 * completes, so no step writes a region until the sends reading it are done:
 * those waits are the second dependency of several steps below.
 */
#include <stdlib.h>
#include <string.h>

#include "collectives/coll.h"

/* Segments per pipelined transfer at most: bounds the schedule's length. */
#define SEG_MAX 256
/* A ring chunk may be cut in at least PIPE_MIN segments of at least
 * SEG_FLOOR bytes, whatever TERN_COLL_SEGMENT says, so that the reduction of
 * one overlaps the transfer of the next. Off (1) until a quiet machine shows
 * it pays. */
#define PIPE_MIN 1
#define SEG_FLOOR (64u * 1024)

static size_t es_of(const tern__coll_t *c)
{
    return c->es;
}

static int mod(int a, int n)
{
    return ((a % n) + n) % n;
}

static char *at(const void *base, size_t elems, size_t es)
{
    return (char *)base + elems * es;
}

/* Segments for bytes: at least 1, each about seg bytes, at most SEG_MAX. */
static size_t nseg(size_t bytes, size_t seg)
{
    size_t s = seg ? (bytes + seg - 1) / seg : 1;
    return s < 1 ? 1 : s > SEG_MAX ? SEG_MAX : s;
}

static int *idx_array(tern__coll_t *c, size_t n)
{
    int *a = malloc((n ? n : 1) * sizeof(*a));
    if (a == NULL)
        c->oom = true;
    return a;
}

/* ---- all_reduce and reduce_scatter: the ring ---- */

typedef struct ring {
    int n, r;
    size_t es;
    const size_t *off, *len; /* chunk i: elements [off[i], off[i] + len[i]) */
    size_t segE, S;          /* elements per segment, segments per chunk */
} ring_t;

static size_t seg_len(const ring_t *R, int chunk, size_t s)
{
    size_t lo = s * R->segE;
    return lo >= R->len[chunk] ? 0 : R->len[chunk] - lo < R->segE ? R->len[chunk] - lo : R->segE;
}

static size_t seg_off(const ring_t *R, int chunk, size_t s)
{
    return R->off[chunk] + s * R->segE;
}

/* Receive slots of a ring reduce-scatter: enough to keep RING_WINDOW
 * segments in flight (and at least 2, as one step's receive may arrive while
 * the previous step's is being reduced). A few segments' worth of scratch,
 * whatever the message size, stays in the allocator's heap from call to
 * call; a scratch the size of the message would be fresh pages (page faults)
 * on every call. */
#define RING_WINDOW 8

static size_t ring_slots(const ring_t *R)
{
    size_t total = R->S * (size_t)(R->n - 1);
    return total < RING_WINDOW ? (total < 2 ? 2 : total) : RING_WINDOW;
}

/*
 * Reduce-scatter around the ring, ending with rank r holding chunk r fully
 * reduced in final. At step k rank r sends chunk r-k-1 to r+1 and receives
 * chunk r-k-2 from r-1, which it folds into its own contribution:
 * acc = op(received, own). Chunk j's sum therefore starts at rank j+1 and
 * travels once around the ring, always combined in the same order.
 * Partial sums live in acc (indexed like own); fin[s] gets the last step of
 * segment s; rsend[k * S + s] the send of step k, segment s.
 */
static void ring_rs(tern__coll_t *c, const ring_t *R, const void *own, void *acc, void *final,
                    int *fin, int *rsend)
{
    int n = R->n, r = R->r;
    size_t S = R->S, es = R->es, slot = R->segE * es, nslot = ring_slots(R);
    char *tmp = tern__coll_scratch(c, nslot * slot);
    int *red = idx_array(c, (size_t)(n - 1) * S);
    if (c->oom || tmp == NULL || red == NULL) {
        c->oom = true;
        free(red);
        return;
    }
    for (int k = 0; k < n - 1; k++) {
        int sc = mod(r - k - 1, n), rc = mod(r - k - 2, n);
        for (size_t s = 0; s < S; s++) {
            const void *src = at(k == 0 ? own : acc, seg_off(R, sc, s), es);
            int snd = tern__coll_send(c, mod(r + 1, n), (uint32_t)(k * S + s), src,
                                      seg_len(R, sc, s) * es,
                                      k == 0 ? -1 : red[(k - 1) * S + s], -1);
            /* Receive slots go round; a slot is free again once the reduce
             * that read it last is done. */
            size_t j = (size_t)k * S + s;
            char *t = tmp + (j % nslot) * slot;
            int rcv = tern__coll_recv(c, mod(r - 1, n), (uint32_t)j, t, seg_len(R, rc, s) * es,
                                      j >= nslot ? red[j - nslot] : -1, -1);
            void *dst = k == n - 2 ? at(final, s * R->segE, es) : at(acc, seg_off(R, rc, s), es);
            red[k * S + s] = tern__coll_reduce(c, dst, t, at(own, seg_off(R, rc, s), es),
                                               seg_len(R, rc, s), rcv, -1);
            if (rsend != NULL)
                rsend[k * S + s] = snd;
        }
    }
    for (size_t s = 0; s < S; s++) {
        fin[s] = red[(size_t)(n - 2) * S + s];
        if (c->op == TERN_AVG)
            fin[s] = tern__coll_scale(c, at(final, s * R->segE, es), seg_len(R, r, s), fin[s], -1);
    }
    free(red);
}

static void allreduce_ring(tern__coll_t *c, const void *sbuf, void *rbuf, size_t count, size_t seg)
{
    int n = c->g->size, r = c->g->rank;
    size_t es = es_of(c), q = count / (size_t)n, rem = count % (size_t)n;
    size_t *off = malloc((size_t)n * sizeof(*off)), *len = malloc((size_t)n * sizeof(*len));
    int *fin = NULL, *rsend = NULL, *agr = NULL;
    if (off == NULL || len == NULL)
        goto oom;
    for (int i = 0; i < n; i++) {
        len[i] = q + ((size_t)i < rem);
        off[i] = (size_t)i * q + ((size_t)i < rem ? (size_t)i : rem);
    }
    size_t maxc = q + (rem > 0);
    ring_t R = {.n = n, .r = r, .es = es, .off = off, .len = len};
    R.S = nseg(maxc * es, seg);
    if (PIPE_MIN > 1 && R.S < PIPE_MIN && maxc * es / SEG_FLOOR > R.S)
        R.S = maxc * es / SEG_FLOOR < PIPE_MIN ? maxc * es / SEG_FLOOR : PIPE_MIN;
    /* 2(n-1)S tags per call must stay distinct in 15 bits. */
    if (R.S > (size_t)(16384 / (n - 1)))
        R.S = (size_t)(16384 / (n - 1)) ? (size_t)(16384 / (n - 1)) : 1;
    R.segE = maxc ? (maxc + R.S - 1) / R.S : 1;
    size_t S = R.S;
    fin = idx_array(c, S);
    rsend = idx_array(c, (size_t)(n - 1) * S);
    agr = idx_array(c, (size_t)(n - 1) * S);
    if (fin == NULL || rsend == NULL || agr == NULL)
        goto oom;
    ring_rs(c, &R, sbuf, rbuf, at(rbuf, off[r], es), fin, rsend);
    if (c->oom)
        goto oom;
    /* All-gather: at step k send chunk r-k (own result first), receive chunk
     * r-k-1 straight into place, once the reduce-scatter's send of that
     * region (step k) is done. */
    uint32_t base = (uint32_t)((size_t)(n - 1) * S);
    for (int k = 0; k < n - 1; k++) {
        int sc = mod(r - k, n), rc = mod(r - k - 1, n);
        for (size_t s = 0; s < S; s++) {
            tern__coll_send(c, mod(r + 1, n), base + (uint32_t)(k * S + s),
                            at(rbuf, seg_off(&R, sc, s), es), seg_len(&R, sc, s) * es,
                            k == 0 ? fin[s] : agr[(k - 1) * S + s], -1);
            agr[k * S + s] = tern__coll_recv(c, mod(r - 1, n), base + (uint32_t)(k * S + s),
                                             at(rbuf, seg_off(&R, rc, s), es),
                                             seg_len(&R, rc, s) * es, rsend[k * S + s], -1);
        }
    }
    free(off);
    free(len);
    free(fin);
    free(rsend);
    free(agr);
    return;
oom:
    c->oom = true;
    free(off);
    free(len);
    free(fin);
    free(rsend);
    free(agr);
}

/* A rank's part in fold_in's fold: *gives when it hands its data to a
 * folding partner (and receives only the result, into the output); a rank
 * that takes one in needs a slot of the buffer's size for it, returned (0
 * for the others). */
static size_t fold_slot(int r, int rem, size_t bytes, bool *gives)
{
    *gives = r < 2 * rem && r % 2 == 0;
    return r < 2 * rem && !*gives ? bytes : 0;
}

/* The largest power of two <= n, with its log2 in *steps: the ranks that go
 * on after fold_in's fold, and the levels they exchange in. */
static int pow2_floor(int n, int *steps)
{
    int p2 = 1;
    *steps = 0;
    while (p2 * 2 <= n) {
        p2 *= 2;
        (*steps)++;
    }
    return p2;
}

/*
 * The fold of rd and Rabenseifner for a non-power of two: with rem extra
 * ranks, ranks below 2*rem pair up; the even one sends its data to the odd
 * one (which computes op(even's, own) into rbuf) and waits for the result
 * (tag fin_tag). Returns the rank's number among the p2 that go on, or -1 for
 * a rank that sat out; *src is where its data is now (rbuf after a fold,
 * else sbuf: the first step reads it there and writes rbuf, which saves
 * copying the whole input) and *last the step that put it there.
 */
static int fold_in(tern__coll_t *c, const void *sbuf, void *rbuf, size_t count, int rem, char *tmp,
                   uint32_t fin_tag, const void **src, int *last)
{
    int r = c->g->rank;
    size_t bytes = count * es_of(c);
    if (r < 2 * rem && r % 2 == 0) {
        int snd = tern__coll_send(c, r + 1, 0, sbuf, bytes, -1, -1);
        tern__coll_recv(c, r + 1, fin_tag, rbuf, bytes, snd, -1);
        return -1;
    }
    if (r < 2 * rem) {
        int rcv = tern__coll_recv(c, r - 1, 0, tmp, bytes, -1, -1);
        *last = tern__coll_reduce(c, rbuf, tmp, sbuf, count, rcv, -1);
        *src = rbuf;
        return r / 2;
    }
    *last = -1;
    *src = sbuf;
    return r - rem;
}

/*
 * Recursive doubling. With p2 the largest power of two <= n and rem = n - p2,
 * ranks below 2*rem pair up first (the even one hands its data to the odd one
 * and waits for the result), leaving p2 ranks that exchange whole buffers
 * with partners at distance 1, 2, 4... Both partners compute op(lower rank's
 * value, higher rank's value), so they hold identical bits.
 */
static void allreduce_rd(tern__coll_t *c, const void *sbuf, void *rbuf, size_t count)
{
    int n = c->g->size, r = c->g->rank;
    size_t bytes = count * es_of(c);
    int steps, p2 = pow2_floor(n, &steps);
    int rem = n - p2;
    /* Receive slots: a whole buffer per level, after the fold's on a rank
     * that takes one in, as allreduce_rab's (a power of two has no fold: a
     * pair's scratch is the buffer, not twice it). A rank that hands its data
     * to a folding partner receives only the result, into the output. */
    bool gives;
    const size_t fold = fold_slot(r, rem, bytes, &gives);
    const size_t need = gives ? 0 : fold + bytes * (size_t)steps;
    char *tmp = need > 0 ? tern__coll_scratch(c, need) : NULL;
    if (need > 0 && tmp == NULL)
        return;
    const void *src;
    int last,
        newrank = fold_in(c, sbuf, rbuf, count, rem, tmp, (uint32_t)steps + 1, &src, &last);
    if (newrank < 0)
        return;
    for (int i = 1, mask = 1; mask < p2; mask <<= 1, i++) { /* i: the level's tag (fold 0) */
        int pn = newrank ^ mask;
        int peer = pn < rem ? pn * 2 + 1 : pn + rem;
        char *t = tmp + fold + (size_t)(i - 1) * bytes;
        int snd = tern__coll_send(c, peer, (uint32_t)i, src, bytes, last, -1);
        int rcv = tern__coll_recv(c, peer, (uint32_t)i, t, bytes, -1, -1);
        last = peer < r ? tern__coll_reduce(c, rbuf, t, src, count, rcv, snd)
                        : tern__coll_reduce(c, rbuf, src, t, count, rcv, snd);
        src = rbuf;
    }
    if (c->op == TERN_AVG)
        last = tern__coll_scale(c, rbuf, count, last, -1);
    if (r < 2 * rem)
        tern__coll_send(c, r - 1, (uint32_t)steps + 1, rbuf, bytes, last, -1);
}

/*
 * Rabenseifner: reduce-scatter by recursive halving, then all-gather by
 * recursive doubling, on the same power-of-two set as rd (extra ranks folded
 * in first). At the level of partner distance m both partners hold the same
 * window; the lower keeps its first half, the higher its second, each sends
 * the other half and folds in what it receives as op(lower rank's, higher
 * rank's). Every element ends up reduced on exactly one rank, and is copied
 * from there: log2(p) steps like rd, but each moves half the data of the
 * one before.
 */
static void allreduce_rab(tern__coll_t *c, const void *sbuf, void *rbuf, size_t count)
{
    int n = c->g->size, r = c->g->rank;
    size_t es = es_of(c), bytes = count * es;
    int steps, p2 = pow2_floor(n, &steps);
    int rem = n - p2;
    /* Receive slots: the fold's whole buffer on a rank that takes one in (a
     * power of two has none: the scratch is then half the size, and a large
     * call's fresh pages half as many), then halves, quarters... */
    bool gives;
    size_t fold = fold_slot(r, rem, bytes, &gives);
    /* Out of place and not folded, the first level receives straight into
     * the output, whose kept half holds nothing yet, and reduces there: no
     * slot, and one pass less over the largest half. */
    bool direct = sbuf != rbuf && r >= 2 * rem;
    /* Each level keeps at most the larger half of the window before it and
     * receives that much into its slot, so the slots need that sum and no
     * more: a pair in place half the buffer (kept between calls up to 8 MiB
     * of buffer), a pair out of place none. A rank that hands its data to a
     * folding partner receives only the result, into the output. */
    size_t slots = 0;
    for (size_t w = count, i = 0; !gives && i < (size_t)steps; i++) {
        w -= w / 2;
        if (!(direct && i == 0))
            slots += w;
    }
    size_t need = fold + slots * es;
    char *tmp = need > 0 ? tern__coll_scratch(c, need) : NULL;
    if (need > 0 && tmp == NULL)
        return;
    uint32_t fin_tag = 2u * (uint32_t)steps + 1;
    const void *src;
    int last, newrank = fold_in(c, sbuf, rbuf, count, rem, tmp, fin_tag, &src, &last);
    if (newrank < 0)
        return;
    size_t lo = 0, hi = count;
    size_t wlo[32], whi[32];
    int rs_send[32];
    char *slot = tmp != NULL ? tmp + fold : NULL;
    for (int i = 0, mask = p2 >> 1; mask > 0; mask >>= 1, i++) {
        int pn = newrank ^ mask, peer = pn < rem ? pn * 2 + 1 : pn + rem;
        size_t mid = lo + (hi - lo) / 2;
        bool lower = (newrank & mask) == 0;
        size_t klo = lower ? lo : mid, khi = lower ? mid : hi; /* kept */
        size_t slo = lower ? mid : lo, shi = lower ? hi : mid; /* sent */
        wlo[i] = lo;
        whi[i] = hi;
        rs_send[i] = tern__coll_send(c, peer, 1u + (uint32_t)i, at(src, slo, es), (shi - slo) * es,
                                     last, -1);
        /* Each level's slot follows the last (within slots, above). */
        void *kept = at(rbuf, klo, es);
        char *in = direct && i == 0 ? (char *)kept : slot;
        int rcv = tern__coll_recv(c, peer, 1u + (uint32_t)i, in, (khi - klo) * es, -1, -1);
        const void *own = at(src, klo, es);
        last = peer < r ? tern__coll_reduce(c, kept, in, own, khi - klo, rcv, last)
                        : tern__coll_reduce(c, kept, own, in, khi - klo, rcv, last);
        src = rbuf;
        if (in == slot)
            slot += (khi - klo) * es;
        lo = klo;
        hi = khi;
    }
    if (c->op == TERN_AVG)
        last = tern__coll_scale(c, at(rbuf, lo, es), hi - lo, last, -1);
    /* All-gather: undo the levels in reverse, receiving straight into place
     * once the reduce-scatter's send of that region is done. */
    for (int i = steps - 1, mask = 1; i >= 0; mask <<= 1, i--) {
        int pn = newrank ^ mask, peer = pn < rem ? pn * 2 + 1 : pn + rem;
        size_t olo = lo == wlo[i] ? hi : wlo[i], ohi = lo == wlo[i] ? whi[i] : lo; /* the partner's */
        tern__coll_send(c, peer, (uint32_t)steps + 1u + (uint32_t)i, at(rbuf, lo, es),
                        (hi - lo) * es, last, -1);
        int rcv = tern__coll_recv(c, peer, (uint32_t)steps + 1u + (uint32_t)i, at(rbuf, olo, es),
                                  (ohi - olo) * es, rs_send[i], -1);
        /* The next level sends the union: both halves must be in place, but
         * this level's send need not be over, as two sends may read one
         * region. Waiting for it (the peer's fetch and its FIN) made each
         * level wait on the last one's partner being scheduled: on 4 ranks
         * over 2 cores, 10-20 % of a 1 MiB call (docs/perf.md). */
        last = tern__coll_copy(c, NULL, NULL, 0, last, rcv);
        lo = wlo[i];
        hi = whi[i];
    }
    if (r < 2 * rem)
        tern__coll_send(c, r - 1, fin_tag, rbuf, bytes, last, -1);
}

void tern__build_allreduce(tern__coll_t *c, const void *sbuf, void *rbuf, size_t count, int algo,
                           size_t seg)
{
    if (c->g->size == 1) {
        if (rbuf != sbuf)
            tern__coll_copy(c, rbuf, sbuf, count * es_of(c), -1, -1);
        return; /* AVG over one rank is the value itself */
    }
    if (algo == AR_RING)
        allreduce_ring(c, sbuf, rbuf, count, seg);
    else if (algo == AR_RAB)
        allreduce_rab(c, sbuf, rbuf, count);
    else
        allreduce_rd(c, sbuf, rbuf, count);
}

void tern__build_reduce_scatter(tern__coll_t *c, const void *sbuf, void *rbuf, size_t count,
                                size_t seg)
{
    int n = c->g->size, r = c->g->rank;
    size_t es = es_of(c);
    if (n == 1) {
        if (rbuf != sbuf)
            tern__coll_copy(c, rbuf, sbuf, count * es, -1, -1);
        return;
    }
    size_t *off = malloc((size_t)n * sizeof(*off)), *len = malloc((size_t)n * sizeof(*len));
    ring_t R = {.n = n, .r = r, .es = es, .off = off, .len = len};
    R.S = nseg(count * es, seg);
    R.segE = count ? (count + R.S - 1) / R.S : 1;
    int *fin = idx_array(c, R.S);
    /* Partial sums need a place of their own: the input is the caller's. */
    void *acc = NULL;
    if (off != NULL && len != NULL && fin != NULL) {
        for (int i = 0; i < n; i++) {
            off[i] = (size_t)i * count;
            len[i] = count;
        }
        /* ring_rs takes the first scratch block for its slots; the partial
         * sums go in a block of their own, freed with the schedule. */
        size_t slots = ring_slots(&R) * R.segE * es;
        char *s = tern__coll_scratch(c, slots + (size_t)n * count * es);
        acc = s ? s + slots : NULL;
        if (s != NULL)
            ring_rs(c, &R, sbuf, acc, rbuf, fin, NULL);
    } else {
        c->oom = true;
    }
    free(off);
    free(len);
    free(fin);
}

/* ---- broadcast ---- */

/* Binomial tree rooted at root: log2(n) rounds, each rank receives once. */
static void bcast_binomial(tern__coll_t *c, void *buf, size_t bytes, int root)
{
    int n = c->g->size, vr = mod(c->g->rank - root, n), rcv = -1, mask = 1;
    while (mask < n) {
        if (vr & mask) {
            rcv = tern__coll_recv(c, mod(vr - mask + root, n), 0, buf, bytes, -1, -1);
            break;
        }
        mask <<= 1;
    }
    for (mask >>= 1; mask > 0; mask >>= 1)
        if (vr + mask < n)
            tern__coll_send(c, mod(vr + mask + root, n), 0, buf, bytes, rcv, -1);
}

/* A chain root -> root+1 -> ..., in segments so every link is busy at once. */
static void bcast_chain(tern__coll_t *c, void *buf, size_t bytes, int root, size_t seg)
{
    int n = c->g->size, vr = mod(c->g->rank - root, n);
    size_t S = nseg(bytes, seg), segB = bytes ? (bytes + S - 1) / S : 0;
    for (size_t s = 0; s < S; s++) {
        size_t lo = s * segB, len = lo >= bytes ? 0 : bytes - lo < segB ? bytes - lo : segB;
        int rcv = -1;
        if (vr > 0)
            rcv = tern__coll_recv(c, mod(vr - 1 + root, n), (uint32_t)s, (char *)buf + lo, len, -1,
                                  -1);
        if (vr < n - 1)
            tern__coll_send(c, mod(vr + 1 + root, n), (uint32_t)s, (char *)buf + lo, len, rcv, -1);
    }
}

void tern__build_bcast(tern__coll_t *c, void *buf, size_t bytes, int root, int algo, size_t seg)
{
    if (c->g->size == 1)
        return;
    if (algo == BC_CHAIN)
        bcast_chain(c, buf, bytes, root, seg);
    else
        bcast_binomial(c, buf, bytes, root);
}

/* ---- reduce ---- */

/*
 * Binomial tree: in the numbering rotated so root is 0, rank v takes the
 * partial results of v+1, v+2, v+4... (those below its lowest set bit) and
 * folds each in as op(own so far, child's), then hands its result to v minus
 * that bit. The order depends only on n and root.
 */
static void reduce_binomial(tern__coll_t *c, const void *sbuf, void *rbuf, size_t count, int root)
{
    int n = c->g->size, vr = mod(c->g->rank - root, n), last = -1, nchild = 0;
    size_t bytes = count * es_of(c);
    for (int mask = 1; mask < n && !(vr & mask); mask <<= 1)
        nchild += vr + mask < n;
    /* A block per child to receive into, and (off the root) one to sum in. */
    char *tmp = tern__coll_scratch(c, bytes * (size_t)(nchild + 1));
    if (bytes > 0 && nchild > 0 && tmp == NULL)
        return;
    char *acc = vr == 0 ? rbuf : tmp + (size_t)nchild * bytes;
    const void *cur = sbuf;
    int child = 0;
    for (int mask = 1; mask < n; mask <<= 1) {
        if (vr & mask) {
            tern__coll_send(c, mod(vr - mask + root, n), 0, cur, bytes, last, -1);
            return;
        }
        if (vr + mask >= n)
            continue;
        char *t = tmp + (size_t)child++ * bytes;
        int rcv = tern__coll_recv(c, mod(vr + mask + root, n), 0, t, bytes, -1, -1);
        last = tern__coll_reduce(c, acc, cur, t, count, rcv, last);
        cur = acc;
    }
    /* The root. */
    if (cur == sbuf && rbuf != sbuf)
        last = tern__coll_copy(c, rbuf, sbuf, bytes, -1, -1);
    if (c->op == TERN_AVG)
        tern__coll_scale(c, rbuf, count, last, -1);
}

/* A chain from the last rank (rotated numbering) to the root, in segments:
 * each rank folds in the sum of the ranks after it as op(own, received). */
static void reduce_chain(tern__coll_t *c, const void *sbuf, void *rbuf, size_t count, int root,
                         size_t seg)
{
    int n = c->g->size, vr = mod(c->g->rank - root, n);
    size_t es = es_of(c), S = nseg(count * es, seg), segE = count ? (count + S - 1) / S : 1;
    char *tmp = vr < n - 1 ? tern__coll_scratch(c, count * es) : NULL;
    if (vr < n - 1 && count > 0 && tmp == NULL)
        return;
    for (size_t s = 0; s < S; s++) {
        size_t lo = s * segE, len = lo >= count ? 0 : count - lo < segE ? count - lo : segE;
        const void *mine = at(sbuf, lo, es);
        if (vr == n - 1) {
            tern__coll_send(c, mod(vr - 1 + root, n), (uint32_t)s, mine, len * es, -1, -1);
            continue;
        }
        char *t = at(tmp, lo, es);
        int rcv = tern__coll_recv(c, mod(vr + 1 + root, n), (uint32_t)s, t, len * es, -1, -1);
        void *dst = vr == 0 ? at(rbuf, lo, es) : t;
        int red = tern__coll_reduce(c, dst, mine, t, len, rcv, -1);
        if (vr > 0)
            tern__coll_send(c, mod(vr - 1 + root, n), (uint32_t)s, t, len * es, red, -1);
        else if (c->op == TERN_AVG)
            tern__coll_scale(c, dst, len, red, -1);
    }
}

void tern__build_reduce(tern__coll_t *c, const void *sbuf, void *rbuf, size_t count, int root,
                        int algo, size_t seg)
{
    if (c->g->size == 1) {
        if (rbuf != sbuf)
            tern__coll_copy(c, rbuf, sbuf, count * es_of(c), -1, -1);
        return;
    }
    if (algo == BC_CHAIN)
        reduce_chain(c, sbuf, rbuf, count, root, seg);
    else
        reduce_binomial(c, sbuf, rbuf, count, root);
}

/* ---- all_gather ---- */

/* Ring: at step k pass on the block received at step k-1 (own block first). */
static void allgather_ring(tern__coll_t *c, const void *sbuf, void *rbuf, const size_t *counts,
                           const size_t *displs)
{
    int n = c->g->size, r = c->g->rank, last;
    size_t es = es_of(c);
    void *mine = at(rbuf, displs[r], es);
    last = mine != sbuf ? tern__coll_copy(c, mine, sbuf, counts[r] * es, -1, -1) : -1;
    for (int k = 0; k < n - 1; k++) {
        int sb = mod(r - k, n), rb = mod(r - k - 1, n);
        tern__coll_send(c, mod(r + 1, n), (uint32_t)k, at(rbuf, displs[sb], es), counts[sb] * es,
                        last, -1);
        last = tern__coll_recv(c, mod(r - 1, n), (uint32_t)k, at(rbuf, displs[rb], es),
                               counts[rb] * es, -1, -1);
    }
}

/*
 * Bruck: ceil(log2 n) rounds. A scratch array holds blocks in the order
 * r, r+1, ...; in the round at distance d a rank sends its first min(d, n-d)
 * blocks to r-d and appends what r+d sends. The blocks are rotated into place
 * at the end.
 */
static void allgather_bruck(tern__coll_t *c, const void *sbuf, void *rbuf, size_t count)
{
    int n = c->g->size, r = c->g->rank;
    size_t B = count * es_of(c);
    char *tmp = tern__coll_scratch(c, B * (size_t)n);
    if (B > 0 && tmp == NULL)
        return;
    /* have: every block received so far is in tmp. Sends only read tmp, so
     * nothing waits for one to be over (as allreduce_rab's all-gather). */
    int have = tern__coll_copy(c, tmp, sbuf, B, -1, -1);
    for (int d = 1, k = 0; d < n; d <<= 1, k++) {
        int nb = d < n - d ? d : n - d;
        tern__coll_send(c, mod(r - d, n), (uint32_t)k, tmp, (size_t)nb * B, have, -1);
        /* Lands past every block sent so far: no wait for those sends. */
        int rcv = tern__coll_recv(c, mod(r + d, n), (uint32_t)k, tmp + (size_t)d * B,
                                  (size_t)nb * B, -1, -1);
        have = tern__coll_copy(c, NULL, NULL, 0, have, rcv);
    }
    for (int j = 0; j < n; j++)
        tern__coll_copy(c, (char *)rbuf + (size_t)mod(r + j, n) * B, tmp + (size_t)j * B, B, have,
                        -1);
}

void tern__build_allgatherv(tern__coll_t *c, const void *sbuf, void *rbuf, const size_t *counts,
                            const size_t *displs, int algo)
{
    if (algo == AG_BRUCK)
        allgather_bruck(c, sbuf, rbuf, counts[0]);
    else
        allgather_ring(c, sbuf, rbuf, counts, displs);
}

/* ---- gather, scatter: the root talks to every rank directly ---- */

void tern__build_gatherv(tern__coll_t *c, const void *sbuf, size_t scount, void *rbuf,
                         const size_t *counts, const size_t *displs, int root)
{
    int n = c->g->size, r = c->g->rank;
    size_t es = es_of(c);
    if (r != root) {
        tern__coll_send(c, root, 0, sbuf, scount * es, -1, -1);
        return;
    }
    for (int i = 0; i < n; i++) {
        void *dst = at(rbuf, displs[i], es);
        if (i != root)
            tern__coll_recv(c, i, 0, dst, counts[i] * es, -1, -1);
        else if (dst != sbuf)
            tern__coll_copy(c, dst, sbuf, counts[i] * es, -1, -1);
    }
}

void tern__build_scatterv(tern__coll_t *c, const void *sbuf, const size_t *counts,
                          const size_t *displs, void *rbuf, size_t rcount, int root)
{
    int n = c->g->size, r = c->g->rank;
    size_t es = es_of(c);
    if (r != root) {
        tern__coll_recv(c, root, 0, rbuf, rcount * es, -1, -1);
        return;
    }
    for (int i = 0; i < n; i++) {
        const void *src = at(sbuf, displs[i], es);
        if (i != root)
            tern__coll_send(c, i, 0, src, counts[i] * es, -1, -1);
        else if (src != rbuf)
            tern__coll_copy(c, rbuf, src, counts[i] * es, -1, -1);
    }
}

/* ---- all_to_all ---- */

/* Pairwise exchange: at step i send to r+i and receive from r-i, one pair at
 * a time (no incast); linear posts every pair at once (lowest latency). */
void tern__build_alltoallv(tern__coll_t *c, const void *sbuf, const size_t *scounts,
                           const size_t *sdispls, void *rbuf, const size_t *rcounts,
                           const size_t *rdispls, int algo)
{
    int n = c->g->size, r = c->g->rank, snd = -1, rcv = -1;
    size_t es = es_of(c);
    tern__coll_copy(c, at(rbuf, rdispls[r], es), at(sbuf, sdispls[r], es), rcounts[r] * es, -1, -1);
    for (int i = 1; i < n; i++) {
        int dst = mod(r + i, n), src = mod(r - i, n);
        bool chain = algo == A2A_PAIRWISE;
        int s2 = tern__coll_send(c, dst, 0, at(sbuf, sdispls[dst], es), scounts[dst] * es,
                                 chain ? snd : -1, chain ? rcv : -1);
        rcv = tern__coll_recv(c, src, 0, at(rbuf, rdispls[src], es), rcounts[src] * es,
                              chain ? snd : -1, chain ? rcv : -1);
        snd = s2;
    }
}

/* ---- barrier: dissemination, ceil(log2 n) rounds of empty messages ---- */

void tern__build_barrier(tern__coll_t *c)
{
    int n = c->g->size, r = c->g->rank, rcv = -1;
    for (int d = 1, k = 0; d < n; d <<= 1, k++) {
        tern__coll_send(c, mod(r + d, n), (uint32_t)k, NULL, 0, rcv, -1);
        rcv = tern__coll_recv(c, mod(r - d, n), (uint32_t)k, NULL, 0, -1, -1);
    }
}
