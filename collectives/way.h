/*
 * How a collective's puts go (copied or by reference), chosen by the wall
 * clock of whole calls. The transport's own choice times its socket calls
 * only, and splicing's other costs (the segments it adds, the reduction that
 * reads the buffer after) fall outside them (docs/transport.md, "Splice or
 * copy, as measured"); and one rank trying the other way alone cannot find
 * the hours in which every rank should switch. So the calls of one signature
 * on one group take the ways in turns that every member derives from the
 * call's number alone, and every member times the same calls; but only the
 * group's rank 0 chooses. Members timing their own calls parted where the two
 * ways were close (a 2-rank 4 MiB all_reduce: by reference 7.5 % faster on
 * one rank, 5.5 % on the other, across a threshold of a sixteenth), and a
 * pair that parts runs slower than either way. So rank 0 sends each choice
 * as a plan that takes effect TERN__WAY_LAG calls on, and every member,
 * rank 0 too, switches at that call.
 */
#ifndef TERN_COLL_WAY_H
#define TERN_COLL_WAY_H

#include <stdbool.h>
#include <stdint.h>

#include <tern/transport.h>

#define TERN__WAY_BLOCK 4u      /* calls a way runs at once, to be timed */
#define TERN__WAY_GAP_MIN 32u   /* calls between tries of the other way, at first */
#define TERN__WAY_GAP_MAX 4096u /* ... doubling up to this while the choice holds */
#define TERN__WAY_LAG 4u        /* calls from a choice to the call it takes effect at */

/* A choice: the way from call `from` on, the call the other is next tried
 * at (for a block), and the gap that put it there. */
typedef struct tern__way_plan {
    uint64_t from;
    uint64_t try_at;
    uint64_t gap;
    tern_op_way_t best;
} tern__way_plan_t;

typedef struct tern__way {
    uint32_t shape;  /* the signature of the calls it times (0: unused) */
    uint64_t calls;  /* calls of that signature started on the group */
    uint64_t used;   /* the group's call number when last used (replacement) */
    tern__way_plan_t now; /* the choice in effect (best TERN_WAY_AUTO until the first) */
    /* each way's last TERN__WAY_BLOCK call times, ns, as a ring: [way - 1] */
    uint64_t ns[2][TERN__WAY_BLOCK];
    unsigned n[2];   /* times in the ring (at most TERN__WAY_BLOCK) */
    unsigned at[2];  /* the ring's next slot */
    tern__way_plan_t plan; /* the latest choice, to be `now` at its call (from 0: none yet) */
    bool planned;          /* plan is still to take effect */
} tern__way_t;

/* The way call number i (0, 1, ... in the order the group starts them) of
 * w's signature goes; each number is picked once. With lead (the group's rank
 * 0) it chooses when a block of tries has ended and returns true in *chose:
 * w->plan is then the choice, for the caller to send to the other members. */
tern_op_way_t tern__way_pick(tern__way_t *w, uint64_t i, bool lead, bool *chose);

/* A plan from the group's rank 0, for a member. False (and nothing changed)
 * for one that cannot be a plan rank 0 made; one not newer than w's latest is
 * ignored (true). One that comes late takes effect at the next call. */
bool tern__way_follow(tern__way_t *w, const tern__way_plan_t *p);

/* Call number i, which went way, took ns from its start to its end. The
 * first call is left out: it carries the job's start (connections,
 * registrations). */
void tern__way_took(tern__way_t *w, uint64_t i, tern_op_way_t way, uint64_t ns);

/* The median of a way's last block, ns a call (0: none timed). */
double tern__way_median(const tern__way_t *w, tern_op_way_t way);

#endif
