/*
 * p2p_lost: point-to-point with a peer that is gone (tern-run; the mode is
 * argv[1]). Each case once waited for ever or refused what had arrived:
 *
 *   --queued  2 ranks. Rank 1 sends a message and broadcasts, then exits
 *             without tern_finalize. Once rank 0 knows rank 1 is lost, a
 *             receive of the message that already arrived, and the
 *             broadcast whose data arrived, still succeed.
 *   --bye     2 ranks. Rank 1 calls tern_finalize early (its barrier times
 *             out) and leaves in good order. Rank 0's receive from it and
 *             its rendezvous send to it fail with TERN_ERR_PEER_LOST within
 *             seconds, naming rank 1 and the tag.
 *   --noconn  2 ranks. Rank 1 exits right after tern_init, never having
 *             connected. Rank 0's receive from it fails (PEER_LOST).
 *   --anysrc  3 ranks. An any-source receive fails when a rank is lost
 *             while it waits (naming that rank); posted again it is served
 *             by the rank left; once every other rank is lost, posting one
 *             fails at once.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <tern/tern.h>

static int rank;
static atomic_ulong checks;

#include "rank_check.h"

#define SEC ((int64_t)1000000000)

static tern_ctx_t *ctx;

static double secs_since(uint64_t t0)
{
    return (double)(tern_clock_ns() - t0) / 1e9;
}

static void leave(void)
{
    printf("rank %d: %lu checks passed\n", rank, atomic_load(&checks));
    fflush(stdout);
    _exit(0);
}

/* Wait until this rank has seen r go: a receive nobody will send fails
 * (posted, or when a first connection cannot be made, at its post). */
static void wait_lost(int r, int tag)
{
    char b[8];
    tern_request_t *req;
    tern_msg_info_t info = {-9, -9, 0};
    uint64_t t0 = tern_clock_ns();
    tern_status_t st = tern_irecv(ctx, b, sizeof(b), r, tag, &req);
    if (st != TERN_OK) {
        CHECK(st == TERN_ERR_PEER_LOST || st == TERN_ERR_UNREACHABLE,
              "a receive from rank %d, gone, at its post: %s", r, tern_status_name(st));
        CHECK(strstr(tern_last_error(), "rank 1") != NULL, "error text: %s", tern_last_error());
        return;
    }
    st = tern_request_wait(req, 30 * SEC, &info);
    CHECK(st == TERN_ERR_PEER_LOST, "a receive from rank %d, gone: %s after %.1f s", r,
          tern_status_name(st), secs_since(t0));
    CHECK(info.source == r && info.tag == tag && info.len == 0,
          "its info names rank %d tag %d: source %d tag %d len %zu", r, tag, info.source, info.tag,
          info.len);
    CHECK(strstr(tern_last_error(), "rank") != NULL, "error text: %s", tern_last_error());
}

static void queued(void)
{
    tern_group_t *g = tern_group_world(ctx);
    uint32_t v[256];
    const char msg[] = "sent before it went";
    char sync[4];
    /* An eager send completes when the transport has it, not the peer: each
     * part is followed by a message rank 0 receives and answers, so the part
     * has arrived before rank 1 goes (one ordered stream per pair). */
    if (rank == 1) {
        OK(tern_send(ctx, msg, sizeof(msg), 0, 1));
        OK(tern_send(ctx, "s1", 3, 0, 4));
        OK(tern_recv(ctx, sync, sizeof(sync), 0, 3, NULL));
        for (int i = 0; i < 256; i++)
            v[i] = (uint32_t)i * 3;
        OK(tern_broadcast(g, v, 256, TERN_DTYPE_I32, 1, NULL));
        OK(tern_send(ctx, "s2", 3, 0, 5));
        OK(tern_recv(ctx, sync, sizeof(sync), 0, 6, NULL));
        leave();
    }
    OK(tern_recv(ctx, sync, sizeof(sync), 1, 4, NULL));
    OK(tern_send(ctx, "ok", 3, 1, 3));
    OK(tern_recv(ctx, sync, sizeof(sync), 1, 5, NULL));
    OK(tern_send(ctx, "ok", 3, 1, 6));
    wait_lost(1, 2);
    char got[64] = {0};
    tern_request_t *req;
    tern_msg_info_t info = {-9, -9, 0};
    OK(tern_irecv(ctx, got, sizeof(got), 1, 1, &req));
    tern_status_t st = tern_request_wait(req, 10 * SEC, &info);
    CHECK(st == TERN_OK && info.len == sizeof(msg) && strcmp(got, msg) == 0,
          "the message that arrived before rank 1 went: %s, '%s'", tern_status_name(st), got);
    memset(v, 0, sizeof(v));
    st = tern_broadcast(g, v, 256, TERN_DTYPE_I32, 1, NULL);
    CHECK(st == TERN_OK, "a broadcast whose data arrived before its root went: %s",
          tern_status_name(st));
    for (int i = 0; i < 256; i++)
        CHECK(v[i] == (uint32_t)i * 3, "broadcast [%d] = %u", i, v[i]);
    printf("rank 0: what arrived before rank 1 went is delivered\n");
}

static void bye(void)
{
    static char big[1 << 20];
    if (rank == 1) {
        uint64_t t0 = tern_clock_ns();
        tern_status_t st = tern_finalize(ctx); /* rank 0 never comes: its barrier times out */
        CHECK(st == TERN_ERR_TIMEOUT, "finalize without rank 0: %s", tern_status_name(st));
        printf("rank 1: finalized alone after %.1f s\n", secs_since(t0));
        leave();
    }
    char b[8];
    tern_request_t *rx, *tx;
    tern_msg_info_t info = {-9, -9, 0};
    OK(tern_irecv(ctx, b, sizeof(b), 1, 7, &rx));
    OK(tern_isend(ctx, big, sizeof(big), 1, 8, &tx));
    uint64_t t0 = tern_clock_ns();
    tern_status_t st = tern_request_wait(rx, 60 * SEC, &info);
    CHECK(st == TERN_ERR_PEER_LOST && info.source == 1 && info.tag == 7,
          "a receive from a rank that finalized: %s (source %d tag %d)", tern_status_name(st),
          info.source, info.tag);
    st = tern_request_wait(tx, 60 * SEC, &info);
    CHECK(st == TERN_ERR_PEER_LOST && info.source == 1 && info.tag == 8 && info.len == sizeof(big),
          "a rendezvous send to a rank that finalized: %s (source %d tag %d len %zu)",
          tern_status_name(st), info.source, info.tag, info.len);
    /* Rank 1's finalize waits TERN_TIMEOUT (5 s here) before it leaves. */
    CHECK(secs_since(t0) < 20, "they ended after %.1f s", secs_since(t0));
    printf("rank 0: requests on a rank that finalized ended after %.1f s\n", secs_since(t0));
}

static void noconn(void)
{
    if (rank == 1)
        leave();
    wait_lost(1, 3);
    printf("rank 0: a rank gone before it connected is noticed\n");
}

static void anysrc(void)
{
    char b[8] = {0};
    tern_request_t *req;
    tern_msg_info_t info = {-9, -9, 0};
    if (rank > 0) {
        /* Connect (one message to rank 0), then wait to be told to go; rank
         * 1 sends once more before it goes. */
        OK(tern_send(ctx, "hi", 3, 0, 1));
        OK(tern_recv(ctx, b, sizeof(b), 0, 2, NULL));
        if (rank == 1) {
            OK(tern_send(ctx, "one", 4, 0, 8));
            OK(tern_recv(ctx, b, sizeof(b), 0, 2, NULL));
        }
        leave();
    }
    for (int r = 1; r <= 2; r++)
        OK(tern_recv(ctx, b, sizeof(b), r, 1, NULL));
    OK(tern_irecv(ctx, b, sizeof(b), TERN_ANY_SOURCE, 8, &req));
    OK(tern_send(ctx, "go", 3, 2, 2));
    tern_status_t st = tern_request_wait(req, 30 * SEC, &info);
    CHECK(st == TERN_ERR_PEER_LOST && info.source == 2 && info.tag == 8,
          "an any-source receive when rank 2 went: %s (source %d tag %d)", tern_status_name(st),
          info.source, info.tag);
    /* Posted again, it waits on rank 1, which sends. */
    OK(tern_irecv(ctx, b, sizeof(b), TERN_ANY_SOURCE, 8, &req));
    OK(tern_send(ctx, "go", 3, 1, 2));
    st = tern_request_wait(req, 30 * SEC, &info);
    CHECK(st == TERN_OK && info.source == 1 && strcmp(b, "one") == 0,
          "the any-source receive posted again: %s from %d '%s'", tern_status_name(st), info.source,
          b);
    OK(tern_send(ctx, "go", 3, 1, 2));
    wait_lost(1, 9);
    st = tern_irecv(ctx, b, sizeof(b), TERN_ANY_SOURCE, 8, &req);
    CHECK(st == TERN_ERR_PEER_LOST && strstr(tern_last_error(), "every other rank"),
          "an any-source receive with nobody left: %s (%s)", tern_status_name(st),
          tern_last_error());
    printf("rank 0: any-source receives end when their senders go\n");
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (tern_init(NULL, &ctx) != TERN_OK) {
        fprintf(stderr, "tern_init: %s\n", tern_last_error());
        return 1;
    }
    rank = (int)tern_ctx_rank(ctx);
    int world = (int)tern_ctx_world_size(ctx);
    if (strcmp(mode, "--queued") == 0 && world == 2)
        queued();
    else if (strcmp(mode, "--bye") == 0 && world == 2)
        bye();
    else if (strcmp(mode, "--noconn") == 0 && world == 2)
        noconn();
    else if (strcmp(mode, "--anysrc") == 0 && world == 3)
        anysrc();
    else
        CHECK(0, "mode '%s' on %d ranks", mode, world);
    /* The others are gone: no finalize (its barrier would wait for them). */
    leave();
}
