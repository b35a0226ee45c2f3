/*
 * A rank of a real multi-process job: joins through tern_init() from whatever
 * launcher started it, exchanges through the store, checks what it sees, and
 * exits 0 only if all of it was right. Run by launch_test.sh under tern-run,
 * mpirun, and torchrun/Slurm/PMI-style environments.
 *   store_ranks [--expect-world N] [--expect-launcher NAME]
 *   store_ranks --free-port     print a free TCP port and exit
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tern/tern.h>

#include "test_util.h"

#define FAIL(...)                                                   \
    do {                                                            \
        fprintf(stderr, "rank %u: ", rank);                         \
        fprintf(stderr, __VA_ARGS__);                               \
        fprintf(stderr, " (%s)\n", tern_last_error());              \
        goto out;                                                   \
    } while (0)

int main(int argc, char **argv)
{
    unsigned expect_world = 0, rank = 0, world;
    const char *expect_launcher = NULL;
    tern_ctx_t *ctx = NULL;
    int rc = 1;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--free-port") == 0) {
            printf("%u\n", test_free_port());
            return 0;
        } else if (strcmp(argv[i], "--expect-world") == 0 && i + 1 < argc) {
            expect_world = (unsigned)atoi(argv[++i]);
        } else if (strcmp(argv[i], "--expect-launcher") == 0 && i + 1 < argc) {
            expect_launcher = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [--expect-world N] [--expect-launcher NAME] | --free-port\n",
                    argv[0]);
            return 2;
        }
    }
    if (tern_init(NULL, &ctx) != TERN_OK) {
        fprintf(stderr, "tern_init: %s\n", tern_last_error());
        return 1;
    }
    rank = tern_ctx_rank(ctx);
    world = tern_ctx_world_size(ctx);
    tern_store_t *s = tern_ctx_store(ctx);
    if (expect_world && world != expect_world)
        FAIL("world size %u, expected %u", world, expect_world);
    if (expect_launcher && strcmp(tern_ctx_launcher(ctx), expect_launcher) != 0)
        FAIL("launcher %s, expected %s", tern_ctx_launcher(ctx), expect_launcher);
    if (tern_ctx_local_rank(ctx) >= tern_ctx_local_world_size(ctx))
        FAIL("local rank %u of %u", tern_ctx_local_rank(ctx), tern_ctx_local_world_size(ctx));

    char key[64], val[64];
    snprintf(key, sizeof(key), "addr/%u", rank);
    snprintf(val, sizeof(val), "%u:%u", rank, tern_ctx_local_rank(ctx));
    if (tern_store_set(s, key, val, strlen(val)) != TERN_OK)
        FAIL("set");
    unsigned local_seen = 0;
    for (unsigned r = 0; r < world; r++) {
        void *v;
        size_t len;
        unsigned rr, lr;
        snprintf(key, sizeof(key), "addr/%u", r);
        if (tern_store_get(s, key, &v, &len, TERN_TIMEOUT_DEFAULT) != TERN_OK)
            FAIL("get %s", key);
        int n = sscanf(v, "%u:%u", &rr, &lr);
        free(v);
        if (n != 2 || rr != r || lr >= 32)
            FAIL("bad value for %s", key);
        local_seen |= 1u << lr;
    }
    /* One machine: local ranks are exactly 0..local_world_size-1. */
    if (tern_ctx_local_world_size(ctx) == world && local_seen != (1u << world) - 1)
        FAIL("local ranks are not a permutation (mask %#x)", local_seen);
    int64_t total;
    if (tern_store_add(s, "count", (int64_t)rank + 1, NULL) != TERN_OK ||
        tern_store_barrier(s, "counted", world, TERN_TIMEOUT_DEFAULT) != TERN_OK ||
        tern_store_add(s, "count", 0, &total) != TERN_OK)
        FAIL("add/barrier");
    if (total != (int64_t)world * (world + 1) / 2)
        FAIL("count is %lld", (long long)total);
    printf("rank %u/%u ok launcher=%s local=%u/%u\n", rank, world, tern_ctx_launcher(ctx),
           tern_ctx_local_rank(ctx), tern_ctx_local_world_size(ctx));
    rc = 0;
out:
    if (tern_finalize(ctx) != TERN_OK) {
        fprintf(stderr, "rank %u: finalize: %s\n", rank, tern_last_error());
        rc = 1;
    }
    return rc;
}
