/*
 * Groups. A group is a list of world ranks and a communicator id that keeps
 * its messages apart from every other group's. Ids are handed out by counting
 * calls to tern_group_create(), which every world rank makes in the same order
 * (torch.distributed.new_group's rule), so all ranks agree on them without
 * exchanging a message: the world is 1, then 2, 3, ...
 */
#include <stdlib.h>
#include <string.h>

#include "collectives/coll.h"
#include "core/error.h"

#define WORLD_CID 1u

static void group_free(tern_group_t *g)
{
    free(g->world);
    free(g);
}

static void fini_hook(tern__comm_t *comm)
{
    coll_state_t *cs = comm->coll_state;
    if (cs == NULL)
        return;
    /* Collectives nobody waited on stay with the requests their callers hold
     * (p2p's teardown cancels what they posted). */
    if (cs->world != NULL)
        group_free(cs->world);
    /* The user's groups outlive the context: destroying one then only frees it. */
    for (tern_group_t *g = cs->groups; g != NULL; g = g->next_live)
        g->comm = NULL;
    tern__coll_free_spare(cs);
    free(cs);
    comm->coll_state = NULL;
}

static tern_group_t *group_new(tern__comm_t *comm, uint32_t cid, const int *ranks, size_t n)
{
    tern_group_t *g = calloc(1, sizeof(*g));
    int *w = malloc(n * sizeof(*w));
    if (g == NULL || w == NULL) {
        free(g);
        free(w);
        tern__error(TERN_ERR_NO_MEMORY, "group: no memory");
        return NULL;
    }
    g->ctx = comm->ctx;
    g->comm = comm;
    g->cid = cid;
    g->size = (int)n;
    g->rank = -1;
    g->world = w;
    for (size_t i = 0; i < n; i++) {
        w[i] = ranks ? ranks[i] : (int)i;
        if (w[i] == (int)comm->rank)
            g->rank = (int)i;
    }
    return g;
}

coll_state_t *tern__coll_state(tern__comm_t *comm)
{
    coll_state_t *cs;
    tern__comm_lock(comm);
    cs = comm->coll_state;
    if (cs == NULL && (cs = calloc(1, sizeof(*cs))) != NULL) {
        cs->world = group_new(comm, WORLD_CID, NULL, comm->world);
        if (cs->world == NULL) {
            free(cs);
            cs = NULL;
        } else {
            cs->world->is_world = true;
            cs->next_cid = WORLD_CID + 1;
            tern__coll_install_hooks(comm);
            tern__comm_set_handler(comm, TERN_IMM_COLL, tern__coll_on_message, cs);
            comm->coll_fini = fini_hook;
            comm->coll_state = cs;
        }
    }
    tern__comm_unlock(comm);
    if (cs == NULL)
        tern__error(TERN_ERR_NO_MEMORY, "collectives: no memory");
    return cs;
}

tern_group_t *tern_group_world(tern_ctx_t *ctx)
{
    tern__comm_t *comm = tern__comm(ctx);
    if (comm == NULL) {
        tern__error(TERN_ERR_INVALID_PARAM, "tern_group_world: the context is not initialized");
        return NULL;
    }
    coll_state_t *cs = tern__coll_state(comm);
    return cs ? cs->world : NULL;
}

tern_status_t tern_group_create(tern_ctx_t *ctx, const int *ranks, size_t n, tern_group_t **out)
{
    tern__comm_t *comm = tern__comm(ctx);
    coll_state_t *cs;

    if (out != NULL)
        *out = NULL;
    if (comm == NULL || ranks == NULL || out == NULL || n == 0)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_group_create: %s",
                           comm == NULL ? "the context is not initialized"
                           : n == 0     ? "a group needs at least one rank"
                                        : "NULL argument");
    if (n > comm->world)
        return tern__error(TERN_ERR_INVALID_PARAM,
                           "tern_group_create: %zu ranks, but the world has %u", n, comm->world);
    for (size_t i = 0; i < n; i++) {
        if (ranks[i] < 0 || (unsigned)ranks[i] >= comm->world)
            return tern__error(TERN_ERR_INVALID_PARAM,
                               "tern_group_create: rank %d is not in the world of %u", ranks[i],
                               comm->world);
        for (size_t j = 0; j < i; j++)
            if (ranks[j] == ranks[i])
                return tern__error(TERN_ERR_INVALID_PARAM,
                                   "tern_group_create: rank %d is listed twice", ranks[i]);
    }
    if ((cs = tern__coll_state(comm)) == NULL)
        return TERN_ERR_NO_MEMORY;
    tern__comm_lock(comm);
    uint32_t cid = cs->next_cid++;
    tern__comm_unlock(comm);
    if ((*out = group_new(comm, cid, ranks, n)) == NULL)
        return TERN_ERR_NO_MEMORY;
    tern__comm_lock(comm);
    (*out)->next_live = cs->groups;
    cs->groups = *out;
    tern__comm_unlock(comm);
    return TERN_OK;
}

void tern_group_destroy(tern_group_t *g)
{
    if (g == NULL || g->is_world)
        return;
    tern__comm_t *comm = g->comm;
    if (comm != NULL) {
        /* Its context is alive, so the state that listed it at creation is. */
        tern__comm_lock(comm);
        coll_state_t *cs = comm->coll_state;
        tern_group_t **pp = &cs->groups;
        while (*pp != g)
            pp = &(*pp)->next_live;
        *pp = g->next_live;
        tern__comm_unlock(comm);
        /* A failed call may have left messages for it, or have more coming. */
        tern__p2p_drop_cid(comm, g->cid);
    }
    group_free(g);
}

int tern_group_rank(const tern_group_t *g)
{
    return g ? g->rank : -1;
}

int tern_group_size(const tern_group_t *g)
{
    return g ? g->size : 0;
}

int tern_group_world_rank(const tern_group_t *g, int r)
{
    return g && r >= 0 && r < g->size ? g->world[r] : -1;
}

int tern_group_rank_of(const tern_group_t *g, int w)
{
    for (int r = 0; g != NULL && r < g->size; r++)
        if (g->world[r] == w)
            return r;
    return -1;
}
