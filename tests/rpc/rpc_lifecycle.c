/*
 * rpc_lifecycle: RPC around the end of a worker's life, where each case below
 * once hung, leaked or crashed (tern-run; the mode is argv[1]):
 *
 *   --teardown  2 ranks. Worker 1 shuts down (not gracefully) while calls
 *               wait there on objects not yet built (a constructor that
 *               deferred, an RRef made from it, a method on each). Those
 *               calls end at once with TERN_ERR_CLOSED, not at their
 *               timeout; the teardown that answers them must not touch an
 *               object freed under it (it did: a double free); the deferred
 *               constructor completes afterwards.
 *   --dead-owner 3 ranks. Rank 0 passes an RRef owned by worker 2 to worker
 *               1, whose FORK to the owner is lost on the way (a send hook
 *               makes it unreadable), and worker 2 dies. Rank 0's child of
 *               that RRef must be let go when worker 2 is lost, or rank 0's
 *               graceful shutdown waits for it for ever; passing the RRef
 *               after that fails at once with TERN_ERR_PEER_LOST.
 *   --closed    2 ranks. Rank 0 shuts down (not gracefully) with a call in
 *               flight whose reply carries an RRef owned by worker 1, then
 *               releases an RRef to an object on worker 1. Worker 1, which
 *               goes on, must free both: the closed worker still sends
 *               DELETE to others.
 *   --window    2 ranks, TERN_RPC_WINDOW=1. A call that waits for room in
 *               the window counts the wait in its timeout: alone (a slot
 *               held by a long call), and nested calls that come back to a
 *               worker whose window their own ancestor fills, which waited
 *               for each other for ever when they had no deadline.
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <tern/tern.h>

#include "rpc/rpc_int.h"

static int rank, world;
static tern_ctx_t *ctx;
static atomic_ulong checks;

#include "rank_check.h"

#define MS ((int64_t)1000000)
#define SEC ((int64_t)1000000000)
#define M_FORK 5 /* rpc.c's message type */

static double secs_since(uint64_t t0)
{
    return (double)(tern_clock_ns() - t0) / 1e9;
}

static void nap_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static const char *wname(int r)
{
    static char names[8][24];
    snprintf(names[r], sizeof(names[r]), "worker%d", r);
    return names[r];
}

/* ---- what the workers serve ---- */

static atomic_int armed, made, destroyed, mk_done;
static _Atomic(tern_rpc_call_t *) deferred_ctor;

static tern_status_t counter_ctor(tern_rpc_call_t *call, void **obj)
{
    (void)call;
    *obj = malloc(1);
    atomic_fetch_add(&made, 1);
    return *obj != NULL ? TERN_OK : TERN_ERR_NO_MEMORY;
}

static void counter_dtor(void *obj)
{
    free(obj);
    atomic_fetch_add(&destroyed, 1);
}

static tern_status_t counter_get(tern_rpc_call_t *call)
{
    (void)call;
    return TERN_OK;
}

/* Slow: a constructor that defers; the test completes it later. */
static tern_status_t slow_ctor(tern_rpc_call_t *call, void **obj)
{
    *obj = malloc(1);
    if (*obj == NULL)
        return TERN_ERR_NO_MEMORY;
    tern_rpc_call_defer(call);
    atomic_store(&deferred_ctor, call);
    return TERN_OK;
}

static tern_status_t h_arm(tern_rpc_call_t *call)
{
    (void)call;
    atomic_store(&armed, 1);
    return TERN_OK;
}

/* take: accepts anything (RRefs to keep for the call's run). */
static tern_status_t h_take(tern_rpc_call_t *call)
{
    (void)call;
    return TERN_OK;
}

/* mk: sleep the blob's milliseconds, then return a new local RRef. */
static tern_status_t h_mk(tern_rpc_call_t *call)
{
    const tern_rpc_value_t *v = tern_rpc_call_args(call);
    char b[16] = {0};
    memcpy(b, v->blob, v->blob_len < sizeof(b) - 1 ? v->blob_len : sizeof(b) - 1);
    nap_ms(atol(b));
    int64_t x = 42, shape[1] = {1};
    tern_tensor_t t;
    tern_status_t st = tern_tensor_init(&t, &x, TERN_DTYPE_I64, 1, shape, tern_device_cpu());
    tern_rpc_args_t a = {.tensors = &t, .ntensors = 1};
    tern_rref_t *r;
    if (st == TERN_OK)
        st = tern_rref_local(tern_rpc_call_ctx(call), &a, &r);
    if (st != TERN_OK)
        return st;
    st = tern_rpc_call_return_rref(call, r);
    tern_rref_release(r);
    atomic_fetch_add(&mk_done, 1);
    return st;
}

/* ping(n): ping(n - 1) on the other of ranks 0 and 1, with n s to run: an
 * inner call's timeout ends before its caller's. */
static tern_status_t h_ping(tern_rpc_call_t *call)
{
    const tern_rpc_value_t *v = tern_rpc_call_args(call);
    char b[16] = {0};
    memcpy(b, v->blob, v->blob_len < 8 ? v->blob_len : 8);
    int n = atoi(b);
    if (n <= 0)
        return TERN_OK;
    snprintf(b, sizeof(b), "%d", n - 1);
    tern_rpc_args_t a = {.blob = b, .blob_len = strlen(b)};
    tern_future_t *f;
    tern_status_t st = tern_rpc_sync(ctx, wname(1 - rank), "ping", &a, n * SEC, &f);
    if (st != TERN_OK)
        return tern_rpc_call_fail(call, st, "ping(%d): %s", n - 1, tern_last_error());
    tern_future_free(f);
    return TERN_OK;
}

static void call_sync(int r, const char *fn, const tern_rpc_args_t *a)
{
    tern_future_t *f;
    tern_status_t st = tern_rpc_sync(ctx, wname(r), fn, a, 10 * SEC, &f);
    CHECK(st == TERN_OK, "%s on %s: %s", fn, wname(r), tern_status_name(st));
    tern_future_free(f);
}

static void wait_armed(void)
{
    uint64_t t0 = tern_clock_ns();
    while (!atomic_load(&armed)) {
        CHECK(secs_since(t0) < 60, "never armed");
        nap_ms(1);
    }
}

/* ---- --teardown ---- */

static void teardown(void)
{
    if (rank == 1) {
        wait_armed();
        CHECK(atomic_load(&deferred_ctor) != NULL, "the constructor deferred");
        OK(tern_rpc_shutdown(ctx, 0));
        /* The deferred call outlives the teardown: completing it now must
         * neither crash nor reply. */
        tern_rpc_call_complete(atomic_load(&deferred_ctor), TERN_OK);
        OK(tern_barrier(tern_group_world(ctx), NULL)); /* rank 0 is done with it */
        return;
    }
    tern_rref_t *slow, *made_from;
    tern_future_t *on_slow, *on_made;
    OK(tern_remote(ctx, wname(1), "Slow", NULL, 60 * SEC, &slow));
    OK(tern_rref_remote(slow, "get", NULL, 60 * SEC, &made_from));
    OK(tern_rref_rpc_async(slow, "get", NULL, 30 * SEC, &on_slow));
    OK(tern_rref_rpc_async(made_from, "get", NULL, 30 * SEC, &on_made));
    uint64_t t0 = tern_clock_ns();
    call_sync(1, "arm", NULL); /* after the calls above: one connection, in order */
    tern_future_t *fs[2] = {on_slow, on_made};
    for (int i = 0; i < 2; i++) {
        tern_status_t st = tern_future_wait(fs[i], -1);
        CHECK(st == TERN_ERR_CLOSED && strstr(tern_future_error(fs[i]), "worker1 is shut down"),
              "call %d waiting on an unbuilt object: %s (%s), want TERN_ERR_CLOSED", i,
              tern_status_name(st), tern_future_error(fs[i]));
        tern_future_free(fs[i]);
    }
    CHECK(secs_since(t0) < 20, "the waiting calls ended after %.1f s, not at once", secs_since(t0));
    tern_future_t *f;
    CHECK(tern_rref_to_here(made_from, 10 * SEC, &f) == TERN_ERR_CLOSED, "to_here after: %s",
          tern_last_error());
    tern_rref_release(made_from);
    tern_rref_release(slow);
    printf("rank 0: calls waiting at a worker that shut down ended in %.2f s\n", secs_since(t0));
    OK(tern_rpc_shutdown(ctx, 0));
    OK(tern_barrier(tern_group_world(ctx), NULL));
}

/* ---- --dead-owner ---- */

/* Worker 1 loses its FORKs to worker 2 on the way: an unknown type, which
 * worker 2 drops. */
static uint8_t *lose_forks(void *arg, int dst, uint8_t *buf, size_t *len)
{
    (void)arg, (void)len;
    if (dst == 2 && buf[0] == M_FORK)
        buf[0] = 0x7f;
    return buf;
}

/* Passing an RRef whose owner is lost fails at once. */
static void pass_dead(tern_rref_t *r)
{
    tern_rref_t *const rs[1] = {r};
    tern_rpc_args_t a = {.rrefs = rs, .nrrefs = 1};
    tern_future_t *f = NULL;
    tern_status_t st = tern_rpc_sync(ctx, wname(1), "take", &a, 10 * SEC, &f);
    CHECK(st == TERN_ERR_PEER_LOST && f == NULL &&
              strstr(tern_last_error(), "its owner worker2 (rank 2) was lost"),
          "passing an RRef of the dead worker2: %s (%s)", tern_status_name(st), tern_last_error());
}

static void dead_owner(void)
{
    if (rank == 1)
        tern__rpc_set_send_hook(lose_forks, NULL);
    OK(tern_barrier(tern_group_world(ctx), NULL));
    if (rank == 2) {
        wait_armed();
        nap_ms(100); /* the reply to "arm" goes out */
        _exit(0);
    }
    if (rank == 0) {
        tern_rref_t *r;
        tern_future_t *f;
        OK(tern_remote(ctx, wname(2), "Counter", NULL, 10 * SEC, &r));
        OK(tern_rref_rpc_sync(r, "get", NULL, 10 * SEC, &f));
        tern_future_free(f);
        tern_rref_t *const rs[1] = {r};
        tern_rpc_args_t a = {.rrefs = rs, .nrrefs = 1};
        call_sync(1, "take", &a); /* rank 0 now has a child no owner will accept */
        call_sync(2, "arm", NULL);
        uint64_t t0 = tern_clock_ns();
        tern_status_t st;
        while ((st = tern_rpc_sync(ctx, wname(2), "take", NULL, 1 * SEC, &f)) == TERN_OK) {
            tern_future_free(f);
            CHECK(secs_since(t0) < 30, "worker2 never went");
            nap_ms(20);
        }
        CHECK(st == TERN_ERR_PEER_LOST || st == TERN_ERR_TIMEOUT, "a call to the dead worker2: %s",
              tern_status_name(st));
        pass_dead(r);
        tern_rref_release(r); /* its DELETE waited for the child: now nowhere to go */
    }
    /* Ranks 0 and 1: worker 2 is lost, so the shutdown cannot agree; it must
     * end all the same. */
    uint64_t t0 = tern_clock_ns();
    tern_status_t st = tern_rpc_shutdown(ctx, 1);
    CHECK(st == TERN_ERR_PEER_LOST, "graceful shutdown with worker2 lost: %s",
          tern_status_name(st));
    CHECK(secs_since(t0) < 20, "graceful shutdown took %.1f s", secs_since(t0));
    printf("rank %d: shutdown ended in %.2f s with worker2 lost\n", rank, secs_since(t0));
    tern__rpc_set_send_hook(NULL, NULL);
    /* Rank 1 stays until rank 0's shutdown ended: its going would let rank
     * 0's child (passed to rank 1) go too. */
    tern_store_t *store = tern_ctx_store(ctx);
    const char *done[1] = {"rpc_lifecycle/rank0-done"}, *seen[1] = {"rpc_lifecycle/rank1-seen"};
    if (rank == 0) {
        OK(tern_store_set(store, done[0], "1", 1));
        OK(tern_store_wait(store, seen, 1, 30 * SEC)); /* rank 0 serves the store */
    } else {
        OK(tern_store_wait(store, done, 1, 30 * SEC));
        OK(tern_store_set(store, seen[0], "1", 1));
    }
    /* No finalize: its barrier would wait for the dead rank. */
    printf("rank %d: %lu checks passed\n", rank, atomic_load(&checks));
    fflush(stdout);
    _exit(0);
}

/* ---- --closed ---- */

static void closed(void)
{
    if (rank == 1) {
        /* Two objects made for rank 0 (an RRef it holds, a reply's RRef
         * that reaches it after it shut down); both go. */
        uint64_t t0 = tern_clock_ns();
        while (atomic_load(&made) != 1 || atomic_load(&mk_done) != 1 ||
               tern_rpc_owned_count(ctx) != 0 || atomic_load(&destroyed) != 1) {
            CHECK(secs_since(t0) < 30,
                  "worker1 owns %zu (made %d, destroyed %d) after rank 0 let them go",
                  tern_rpc_owned_count(ctx), atomic_load(&made), atomic_load(&destroyed));
            nap_ms(5);
        }
        printf("rank 1: what the closed worker held is freed\n");
        OK(tern_rpc_shutdown(ctx, 0));
        OK(tern_barrier(tern_group_world(ctx), NULL));
        return;
    }
    tern_rref_t *r;
    tern_future_t *f, *late;
    OK(tern_remote(ctx, wname(1), "Counter", NULL, 10 * SEC, &r));
    OK(tern_rref_rpc_sync(r, "get", NULL, 10 * SEC, &f));
    tern_future_free(f);
    tern_rpc_args_t a = {.blob = "300", .blob_len = 3};
    OK(tern_rpc_async(ctx, wname(1), "mk", &a, 10 * SEC, &late));
    OK(tern_rpc_shutdown(ctx, 0));
    CHECK(tern_future_wait(late, -1) == TERN_ERR_CLOSED, "the call in flight: %s",
          tern_status_name(tern_future_status(late)));
    tern_future_free(late);
    tern_rref_release(r); /* after the shutdown, as rpc.h allows */
    /* Until worker 1 saw both go (the late reply comes meanwhile). */
    OK(tern_barrier(tern_group_world(ctx), NULL));
}

/* ---- --window ---- */

static void window(void)
{
    if (rank == 1) {
        wait_armed();
        return;
    }
    /* A slot held by a 1.5 s call: a second call's 200 ms run out waiting. */
    tern_future_t *slow, *f = NULL;
    tern_rpc_args_t ms = {.blob = "1500", .blob_len = 4};
    OK(tern_rpc_async(ctx, wname(1), "sleep_ms", &ms, 10 * SEC, &slow));
    uint64_t t0 = tern_clock_ns();
    tern_status_t st = tern_rpc_async(ctx, wname(1), "take", NULL, 200 * MS, &f);
    double waited = secs_since(t0);
    CHECK(st == TERN_ERR_TIMEOUT && f == NULL && strstr(tern_last_error(), "TERN_RPC_WINDOW"),
          "a call with no room: %s (%s)", tern_status_name(st), tern_last_error());
    CHECK(waited >= 0.19 && waited < 1.2, "it waited %.2f s for room, want about 0.2", waited);
    OK(tern_future_wait(slow, -1));
    tern_future_free(slow);
    /* Nested calls: rank 0 -> 1 -> 0 -> 1, the last with no room. */
    tern_rpc_args_t three = {.blob = "3", .blob_len = 1};
    t0 = tern_clock_ns();
    st = tern_rpc_sync(ctx, wname(1), "ping", &three, 30 * SEC, &f);
    CHECK(st == TERN_ERR_TIMEOUT && strstr(tern_last_error(), "no room"),
          "nested calls into a full window: %s (%s)", tern_status_name(st), tern_last_error());
    CHECK(secs_since(t0) < 10, "nested calls ended after %.1f s", secs_since(t0));
    printf("rank 0: nested calls into a full window ended in %.2f s: %s\n", secs_since(t0),
           tern_last_error());
    /* Room again: the same chain one level shorter goes through. */
    tern_rpc_args_t one = {.blob = "1", .blob_len = 1};
    OK(tern_rpc_sync(ctx, wname(1), "ping", &one, 10 * SEC, &f));
    tern_future_free(f);
    call_sync(1, "arm", NULL);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    OK(tern_rpc_register_class("Counter", counter_ctor, counter_dtor));
    OK(tern_rpc_register("Counter.get", counter_get));
    OK(tern_rpc_register_class("Slow", slow_ctor, counter_dtor));
    OK(tern_rpc_register("Slow.get", counter_get));
    OK(tern_rpc_register("arm", h_arm));
    OK(tern_rpc_register("take", h_take));
    OK(tern_rpc_register("mk", h_mk));
    OK(tern_rpc_register("ping", h_ping));
    if (tern_init(NULL, &ctx) != TERN_OK) {
        fprintf(stderr, "tern_init: %s\n", tern_last_error());
        return 1;
    }
    rank = (int)tern_ctx_rank(ctx);
    world = (int)tern_ctx_world_size(ctx);
    OK(tern_rpc_init(ctx, NULL, NULL));
    if (strcmp(mode, "--teardown") == 0) {
        CHECK(world == 2, "--teardown wants 2 ranks");
        teardown();
    } else if (strcmp(mode, "--dead-owner") == 0) {
        CHECK(world == 3, "--dead-owner wants 3 ranks");
        dead_owner();
    } else if (strcmp(mode, "--closed") == 0) {
        CHECK(world == 2, "--closed wants 2 ranks");
        closed();
    } else if (strcmp(mode, "--window") == 0) {
        CHECK(world == 2, "--window wants 2 ranks");
        window();
        OK(tern_rpc_shutdown(ctx, 1));
    } else {
        CHECK(false, "unknown mode '%s'", mode);
    }
    OK(tern_finalize(ctx));
    printf("rank %d: %lu checks passed\n", rank, atomic_load(&checks));
    return 0;
}
