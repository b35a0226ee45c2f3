/*
 * One trace for the whole job: every rank's results gathered onto a root, on
 * the root's clock.
 *
 * Every rank calls tern_prof_gather after its own stop. Root first estimates
 * each other rank's clock by ping-pong (their progress threads answer while
 * they wait in the gather), then the ranks' results travel to it as one blob
 * each (a gather of sizes, then a gatherv), and root's outcome is broadcast so
 * that every rank returns the same status. Root moves each rank's events onto
 * its own clock, interpolating between the estimates it holds of that rank (its
 * session's and this one), and makes the union its results.
 *
 * A rank's remote events (those of RPCs it issued, which ran elsewhere) are on
 * that rank's clock already; moving them again adds the two bounds. Events
 * are unique by id across the job, so one that two ranks both hold is kept
 * once.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tern/coll.h>
#include <tern/prof.h>

#include "core/bytes.h"
#include "core/error.h"
#include "core/log.h"
#include "p2p/comm.h"
#include "prof/job.h"
#include "prof/session.h"

#define MAGIC TERN__PROF_JOB_MAGIC
#define HEAD TERN__PROF_JOB_HEAD
#define EV TERN__PROF_JOB_EV

static size_t blob_size(const tern_prof_event_t *ev, size_t n, size_t msg_len)
{
    size_t size = HEAD + msg_len;
    for (size_t i = 0; i < n; i++)
        size += EV + strlen(ev[i].name) + strlen(ev[i].shapes);
    return size;
}

uint8_t *tern__prof_job_encode(uint8_t *head, size_t *len)
{
    const tern_prof_event_t *ev = NULL;
    size_t n = 0;
    unsigned flags = 0;
    int64_t t_start;
    uint64_t dropped = 0;
    tern_status_t st = tern__prof_results(&ev, &n, &flags, &t_start, &dropped);
    const char *msg = st == TERN_OK ? "" : tern_last_error();
    size_t ml = strlen(msg);
    if (st != TERN_OK)
        n = 0;
    uint8_t *b = malloc(blob_size(ev, n, ml));
    if (b == NULL) {
        memset(head, 0, HEAD);
        tern__put_le32(head, MAGIC);
        tern__put_le32(head + 4, (uint32_t)TERN_ERR_NO_MEMORY);
        *len = HEAD;
        return head;
    }
    tern__put_le32(b, MAGIC);
    tern__put_le32(b + 4, (uint32_t)st);
    tern__put_le64(b + 8, n);
    tern__put_le64(b + 16, dropped);
    tern__put_le32(b + 24, flags);
    tern__put_le32(b + 28, (uint32_t)ml);
    memcpy(b + HEAD, msg, ml);
    uint8_t *p = b + HEAD + ml;
    for (size_t i = 0; i < n; i++) {
        const tern_prof_event_t *e = &ev[i];
        size_t nl = strlen(e->name), sl = strlen(e->shapes);
        tern__put_le64(p, (uint64_t)e->start_ns);
        tern__put_le64(p + 8, (uint64_t)e->end_ns);
        tern__put_le64(p + 16, (uint64_t)e->self_ns);
        tern__put_le64(p + 24, e->bytes);
        tern__put_le64(p + 32, (uint64_t)e->mem);
        tern__put_le64(p + 40, (uint64_t)e->self_mem);
        tern__put_le64(p + 48, (uint64_t)e->clock_error_ns);
        tern__put_le64(p + 56, e->id);
        tern__put_le64(p + 64, e->parent);
        tern__put_le64(p + 72, e->seq);
        tern__put_le64(p + 80, e->thread);
        tern__put_le32(p + 88, (uint32_t)e->node);
        tern__put_le32(p + 92, (uint32_t)e->peer);
        tern__put_le32(p + 96, (uint32_t)e->depth);
        tern__put_le16(p + 100, (uint16_t)e->kind);
        tern__put_le16(p + 102, (uint16_t)e->dir);
        tern__put_le32(p + 104, (uint32_t)nl);
        tern__put_le32(p + 108, (uint32_t)sl);
        memcpy(p + EV, e->name, nl);
        memcpy(p + EV + nl, e->shapes, sl);
        p += EV + nl + sl;
    }
    *len = (size_t)(p - b);
    return b;
}

enum move { KEEP, SHIFT, UNALIGNED };

/* Rank r's n events, decoded from its blob, moved onto our clock. */
static void move_events(tern_prof_event_t *ev, size_t n, int r, enum move how)
{
    if (how == KEEP)
        return;
    for (size_t i = 0; i < n; i++) {
        tern_prof_event_t *e = &ev[i];
        int64_t off, bound;
        /* Our time is about theirs minus the offset; the interpolation
         * needs only that precision. */
        if (how == UNALIGNED || e->clock_error_ns < 0 ||
            !tern__prof_offset_of(r, e->start_ns, &off, &bound) ||
            !tern__prof_offset_of(r, e->start_ns - off, &off, &bound)) {
            e->clock_error_ns = -1;
            continue;
        }
        e->start_ns -= off;
        e->end_ns -= off;
        e->clock_error_ns += bound;
    }
}

static int by_id(const void *a, const void *b)
{
    const tern_prof_event_t *x = a, *y = b;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Root: the blobs of every rank (ours included) become our results. */
static tern_status_t merge(const uint8_t *all, const size_t *lens, const size_t *displs, int world,
                           int me, const bool *aligned, const tern_prof_clock_t *est)
{
    size_t total = 0, strbytes = 0, nused = 0;
    unsigned flags = 0;
    uint64_t dropped = 0;
    tern_status_t st;
    for (int r = 0; r < world; r++) {
        size_t n = 0, sb = 0;
        if ((st = tern__prof_job_check(all + displs[r], lens[r], r, world, &n, &sb)) != TERN_OK)
            return st;
        total += n;
        strbytes += sb;
        flags |= tern__get_le32(all + displs[r] + 24);
        dropped += tern__get_le64(all + displs[r] + 16);
        nused += aligned[r];
    }
    tern_prof_event_t *ev = calloc(total ? total : 1, sizeof(*ev));
    char *strings = malloc(strbytes ? strbytes : 1), *s = strings;
    tern_prof_clock_t *used = calloc(nused ? nused : 1, sizeof(*used));
    if (ev == NULL || strings == NULL || used == NULL) {
        free(ev);
        free(strings);
        free(used);
        return tern__error(TERN_ERR_NO_MEMORY, "tern_prof_gather: no memory for %zu events",
                           total);
    }
    size_t at = 0;
    nused = 0;
    for (int r = 0; r < world; r++) {
        const uint8_t *b = all + displs[r];
        size_t n = tern__prof_job_decode(b, ev + at, &s);
        move_events(ev + at, n, r, r == me ? KEEP : aligned[r] ? SHIFT : UNALIGNED);
        at += n;
        if (aligned[r])
            used[nused++] = est[r];
    }
    /* One of each id: an event two ranks hold is the same event. */
    qsort(ev, total, sizeof(*ev), by_id);
    size_t m = 0;
    for (size_t i = 0; i < total; i++)
        if (m == 0 || ev[m - 1].id != ev[i].id)
            ev[m++] = ev[i];
    qsort(ev, m, sizeof(*ev), tern__prof_by_start);
    tern__prof_install(ev, m, strings, used, nused, flags, dropped);
    return TERN_OK;
}

tern_status_t tern_prof_gather(tern_ctx_t *ctx, int root)
{
    if (ctx == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_prof_gather: ctx is NULL");
    tern__comm_t *comm = tern__comm(ctx);
    tern_group_t *world = tern_group_world(ctx);
    if (comm == NULL || world == NULL)
        return tern__error(TERN_ERR_CLOSED, "tern_prof_gather: the context is not initialized");
    int n = (int)comm->world, me = (int)comm->rank;
    if (root < 0 || root >= n)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_prof_gather: root %d is not in the world "
                                                   "of %d", root, n);
    tern_status_t st = TERN_OK;
    bool *aligned = NULL;
    tern_prof_clock_t *est = NULL;
    int64_t *sizes = NULL;
    size_t *lens = NULL, *displs = NULL;
    uint8_t *all = NULL;

    /* Root measures every clock first: the others answer from their progress
     * threads while they wait below. */
    if (me == root) {
        aligned = calloc((size_t)n, sizeof(*aligned));
        est = calloc((size_t)n, sizeof(*est));
        sizes = calloc((size_t)n, sizeof(*sizes));
        lens = calloc((size_t)n, sizeof(*lens));
        displs = calloc((size_t)n, sizeof(*displs));
        if (aligned == NULL || est == NULL || sizes == NULL || lens == NULL || displs == NULL)
            st = tern__error(TERN_ERR_NO_MEMORY, "tern_prof_gather: no memory");
        for (int r = 0; st == TERN_OK && r < n; r++) {
            if (r == me) {
                aligned[r] = false; /* our own events stay as they are */
                continue;
            }
            aligned[r] = tern__prof_estimate_kept(comm, r, &est[r]) == TERN_OK;
            if (!aligned[r])
                tern_warn("prof: rank %d's events stay on its own clock: %s", r, tern_last_error());
        }
    }
    size_t len = 0;
    uint8_t head[TERN__PROF_JOB_HEAD], *blob = tern__prof_job_encode(head, &len);
    int64_t size = (int64_t)len;
    /* Every rank takes part whatever went wrong on it, so none waits for
     * another: root says first whether it could make its tables (without
     * them it could not even take the sizes, and the others would wait out
     * TERN_TIMEOUT), then whether the blobs may come (it has room for
     * them), and at the end its outcome, which is what all return. A
     * collective that fails (a lost rank) breaks the world group: that
     * status wins. */
    int32_t go = (int32_t)st, out;
    tern_status_t cst = tern_broadcast(world, &go, 1, TERN_DTYPE_I32, root, NULL);
    if (cst == TERN_OK && go == TERN_OK)
        cst = tern_gather(world, &size, sizes, 1, TERN_DTYPE_I64, root, NULL);
    if (cst == TERN_OK && go == TERN_OK && me == root) {
        size_t total = 0;
        for (int r = 0; r < n; r++) {
            lens[r] = (size_t)sizes[r];
            displs[r] = total;
            total += lens[r];
        }
        if ((all = malloc(total ? total : 1)) == NULL)
            st = tern__error(TERN_ERR_NO_MEMORY, "tern_prof_gather: no memory for %zu bytes",
                             total);
    }
    if (cst == TERN_OK && go == TERN_OK) {
        go = (int32_t)st;
        cst = tern_broadcast(world, &go, 1, TERN_DTYPE_I32, root, NULL);
    }
    if (cst == TERN_OK && go == TERN_OK)
        cst = tern_gatherv(world, blob, len, all, lens, displs, TERN_DTYPE_U8, root, NULL);
    if (cst == TERN_OK && me == root && st == TERN_OK)
        st = merge(all, lens, displs, n, me, aligned, est);
    out = (int32_t)st;
    if (cst == TERN_OK)
        cst = tern_broadcast(world, &out, 1, TERN_DTYPE_I32, root, NULL);
    if (blob != head)
        free(blob);
    free(aligned);
    free(est);
    free(sizes);
    free(lens);
    free(displs);
    free(all);
    if (cst != TERN_OK)
        return cst;
    if (me != root && out != TERN_OK)
        return tern__error((tern_status_t)out, "tern_prof_gather: failed on root (rank %d): %s",
                           root, tern_status_name((tern_status_t)out));
    return (tern_status_t)out;
}

tern_status_t tern_prof_export_job_trace(tern_ctx_t *ctx, int root, const char *path)
{
    tern__comm_t *comm = ctx != NULL ? tern__comm(ctx) : NULL;
    tern_status_t st = tern_prof_gather(ctx, root);
    if (st != TERN_OK || comm == NULL)
        return st;
    int32_t out = TERN_OK;
    if ((int)comm->rank == root)
        out = (int32_t)tern_prof_export_chrome_trace(path);
    tern_status_t bst = tern_broadcast(tern_group_world(ctx), &out, 1, TERN_DTYPE_I32, root, NULL);
    if (bst != TERN_OK)
        return bst;
    if ((int)comm->rank != root && out != TERN_OK)
        return tern__error((tern_status_t)out, "tern_prof_export_job_trace: writing %s on root "
                                               "(rank %d) failed: %s", path ? path : "(null)", root,
                           tern_status_name((tern_status_t)out));
    return (tern_status_t)out;
}
