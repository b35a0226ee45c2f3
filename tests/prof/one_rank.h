/*
 * The fixture of the one-process profiler tests (test_prof, test_prof_wire):
 * a context of world size 1 over an in-memory store, made before the group
 * and finalized after it (cmocka group setup and teardown).
 */
#ifndef TERN_TESTS_PROF_ONE_RANK_H
#define TERN_TESTS_PROF_ONE_RANK_H

#include <stdio.h>

#include <tern/tern.h>

#define SEC 1000000000ll

static tern_ctx_t *ctx;
static tern_store_t *store;

/* A context of world size 1 over in-memory store s. */
static tern_status_t one_rank_init(tern_store_t *s, tern_ctx_t **out)
{
    tern_init_params_t p = {
        .field_mask = TERN_INIT_PARAM_RANK | TERN_INIT_PARAM_WORLD_SIZE | TERN_INIT_PARAM_THREADS |
                      TERN_INIT_PARAM_STORE | TERN_INIT_PARAM_TIMEOUT,
        .rank = 0,
        .world_size = 1,
        .threads = 1,
        .store = s,
        .timeout_ns = 10 * SEC,
    };
    return tern_init(&p, out);
}

static int setup(void **state)
{
    (void)state;
    if (tern_store_memory_create(1, 10 * SEC, &store) != TERN_OK)
        return -1;
    if (one_rank_init(store, &ctx) != TERN_OK) {
        fprintf(stderr, "tern_init: %s\n", tern_last_error());
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (tern_prof_enabled())
        tern_prof_stop();
    tern_status_t st = tern_finalize(ctx);
    tern_store_close(store);
    return st == TERN_OK ? 0 : -1;
}

#endif
