/* collectives/way.h: the puts' way by the wall clock of whole calls. */
#include "way.h"

#include "core/log.h"

/* The first 2 x 2 blocks: copied, by reference, copied, by reference. */
#define SEED_CALLS (4u * TERN__WAY_BLOCK)

double tern__way_median(const tern__way_t *w, tern_op_way_t way)
{
    const int k = way == TERN_WAY_REF;
    const unsigned n = w->n[k];
    if (n == 0)
        return 0.0;
    /* the middle of the block: one call the core was taken from must not
     * decide (a mean of 4 calls moved by a fifth with one such call) */
    uint64_t v[TERN__WAY_BLOCK];
    for (unsigned j = 0; j < n; j++) {
        uint64_t x = w->ns[k][j];
        unsigned at = j;
        for (; at > 0 && v[at - 1] > x; at--)
            v[at] = v[at - 1];
        v[at] = x;
    }
    return n % 2 == 1 ? (double)v[n / 2] : ((double)v[n / 2 - 1] + (double)v[n / 2]) / 2;
}

static const char *way_name(tern_op_way_t way)
{
    return way == TERN_WAY_REF ? "by reference" : "copied";
}

/* Take the other way once it is faster by a sixteenth: two ways that cost
 * the same would otherwise swap at every wobble. The first choice is copying
 * unless by reference is faster by as much, so that an even seed stays
 * copying. The choice takes effect TERN__WAY_LAG calls on (w->plan). */
static void choose(tern__way_t *w, uint64_t i)
{
    const double copy = tern__way_median(w, TERN_WAY_COPY), ref = tern__way_median(w, TERN_WAY_REF);
    tern_op_way_t best = w->now.best;
    if (copy > 0 && ref > 0) {
        if (best == TERN_WAY_AUTO)
            best = ref * 17 < copy * 16 ? TERN_WAY_REF : TERN_WAY_COPY;
        else if (best == TERN_WAY_COPY && ref * 17 < copy * 16)
            best = TERN_WAY_REF;
        else if (best == TERN_WAY_REF && copy * 17 < ref * 16)
            best = TERN_WAY_COPY;
    } else if (best == TERN_WAY_AUTO) {
        best = TERN_WAY_COPY; /* nothing timed (calls still in flight): the usual way */
    }
    uint64_t gap = w->now.gap;
    if (best != w->now.best) {
        tern_debug("coll: calls of signature %08x: %.1f us a call copied, %.1f by reference at "
                   "call %llu",
                   (unsigned)w->shape, copy / 1e3, ref / 1e3, (unsigned long long)i);
        gap = TERN__WAY_GAP_MIN;
    } else if (gap < TERN__WAY_GAP_MAX) {
        gap *= 2;
    }
    w->plan = (tern__way_plan_t){
        .from = i + TERN__WAY_LAG, .try_at = i + gap, .gap = gap, .best = best};
    w->planned = true;
}

/* w->plan from call i on. */
static void take_plan(tern__way_t *w, uint64_t i)
{
    if (w->plan.best != w->now.best)
        tern_debug("coll: calls of signature %08x now put %s from call %llu",
                   (unsigned)w->shape, way_name(w->plan.best), (unsigned long long)w->plan.from);
    if (i > w->plan.from)
        tern_debug("coll: the choice for calls of signature %08x from call %llu came at call %llu",
                   (unsigned)w->shape, (unsigned long long)w->plan.from, (unsigned long long)i);
    w->now = w->plan;
    w->planned = false;
}

tern_op_way_t tern__way_pick(tern__way_t *w, uint64_t i, bool lead, bool *chose)
{
    *chose = false;
    if (i < SEED_CALLS)
        return (i / TERN__WAY_BLOCK) % 2 == 0 ? TERN_WAY_COPY : TERN_WAY_REF;
    if (w->planned && i >= w->plan.from)
        take_plan(w, i);
    const tern__way_plan_t *n = &w->now;
    if (lead && !w->planned &&
        (i == SEED_CALLS || (n->best != TERN_WAY_AUTO && i == n->try_at + TERN__WAY_BLOCK))) {
        choose(w, i);
        *chose = true;
    }
    if (n->best != TERN_WAY_AUTO && i >= n->try_at && i < n->try_at + TERN__WAY_BLOCK)
        return n->best == TERN_WAY_REF ? TERN_WAY_COPY : TERN_WAY_REF;
    return n->best == TERN_WAY_REF ? TERN_WAY_REF : TERN_WAY_COPY;
}

bool tern__way_follow(tern__way_t *w, const tern__way_plan_t *p)
{
    if ((p->best != TERN_WAY_COPY && p->best != TERN_WAY_REF) || p->gap < TERN__WAY_GAP_MIN ||
        p->gap > TERN__WAY_GAP_MAX || p->from < SEED_CALLS + TERN__WAY_LAG ||
        p->from > UINT64_MAX - TERN__WAY_GAP_MAX || p->try_at != p->from - TERN__WAY_LAG + p->gap)
        return false;
    if (p->from <= w->plan.from)
        return true; /* not newer than what this member has */
    w->plan = *p;
    w->planned = true;
    return true;
}

void tern__way_took(tern__way_t *w, uint64_t i, tern_op_way_t way, uint64_t ns)
{
    if (i == 0 || (way != TERN_WAY_COPY && way != TERN_WAY_REF))
        return;
    const int k = way == TERN_WAY_REF;
    w->ns[k][w->at[k]] = ns;
    w->at[k] = (w->at[k] + 1) % TERN__WAY_BLOCK;
    if (w->n[k] < TERN__WAY_BLOCK)
        w->n[k]++;
}
