/*
 * How a collective's puts go (copied or by reference), chosen by the wall
 * clock of whole calls. The transport's own choice times its socket calls
 * only, and splicing's other costs (the segments it adds, the reduction that
 * reads the buffer after) fall outside them (docs/transport.md, "Splice or
 * copy, as measured"); and one rank trying the other way alone cannot find
 * the hours in which every rank should switch. So the calls of one signature
 * on one group take the ways in turns that every member derives from the
 * call's number alone, and each member times the same calls.
 */
#ifndef TERN_COLL_WAY_H
#define TERN_COLL_WAY_H

#include <stdint.h>

#include <tern/transport.h>

#define TERN__WAY_BLOCK 4u      /* calls a way runs at once, to be timed */
#define TERN__WAY_GAP_MIN 32u   /* calls between tries of the other way, at first */
#define TERN__WAY_GAP_MAX 4096u /* ... doubling up to this while the choice holds */

typedef struct tern__way {
    uint32_t shape;  /* the signature of the calls it times (0: unused) */
    uint64_t calls;  /* calls of that signature started on the group */
    uint64_t used;   /* the group's call number when last used (replacement) */
    tern_op_way_t best; /* TERN_WAY_AUTO until the first choice */
    uint64_t try_at; /* the call number the next try of the other way starts at */
    uint64_t gap;
    /* each way's last TERN__WAY_BLOCK call times, ns, as a ring: [way - 1] */
    uint64_t ns[2][TERN__WAY_BLOCK];
    unsigned n[2];   /* times in the ring (at most TERN__WAY_BLOCK) */
    unsigned at[2];  /* the ring's next slot */
} tern__way_t;

/* The way call number i (0, 1, ... in the order the group starts them) of
 * w's signature goes; chooses when a block of tries has ended, so each
 * number is picked once. */
tern_op_way_t tern__way_pick(tern__way_t *w, uint64_t i);

/* Call number i, which went way, took ns from its start to its end. The
 * first call is left out: it carries the job's start (connections,
 * registrations). */
void tern__way_took(tern__way_t *w, uint64_t i, tern_op_way_t way, uint64_t ns);

/* The median of a way's last block, ns a call (0: none timed). */
double tern__way_median(const tern__way_t *w, tern_op_way_t way);

#endif
