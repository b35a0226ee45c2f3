/*
 * p2p_forged: control messages a peer should never send, sent through the
 * real transport (tern-run -n 2). Rank 1 hands rank 0 back more eager credit
 * than rank 0 ever charged it, in amounts that would overflow the count or
 * wrap it negative; then a FIN and an RTR_FAIL naming sends nobody posted,
 * with statuses that are not tern's. Rank 0 must log them and take no more
 * credit than it had charged (its credit ends where it started, not past
 * it), drop the others, and eager traffic past the credit must still flow
 * (flow control holds).
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tern/tern.h>

#include "core/bytes.h"
#include "p2p/comm.h"

#include "rank_check.h"

/* p2p.c's control kinds. */
#define CTRL_FIN 1
#define CTRL_CREDIT 2
#define CTRL_RTR_FAIL 8

#define TAG_DONE 7
#define TAG_DATA 8

static int rank;
static atomic_ulong checks;

/* Send one control message to rank 0 as p2p itself would, under the lock. */
static void forge(tern__comm_t *comm, unsigned kind, const uint8_t *payload, size_t len)
{
    uint8_t buf[32];
    tern_ep_t *ep;
    memcpy(buf, payload, len);
    tern__comm_lock(comm);
    tern_status_t st = tern__comm_ep(comm, 0, &ep);
    if (st == TERN_OK)
        st = tern_ep_send(ep, tern_imm_make(TERN_IMM_CONTROL, 0, 0, kind), buf, len, NULL);
    if (st == TERN_INPROGRESS) /* copied already: len <= attr.max_inline */
        st = TERN_OK;
    tern__comm_unlock(comm);
    CHECK(st == TERN_OK, "forging control %u", kind);
}

int main(void)
{
    tern_ctx_t *ctx;
    if (tern_init(NULL, &ctx) != TERN_OK) {
        fprintf(stderr, "tern_init: %s\n", tern_last_error());
        return 1;
    }
    rank = (int)tern_ctx_rank(ctx);
    CHECK(tern_ctx_world_size(ctx) == 2, "run on 2 ranks");
    tern__comm_t *comm = tern__comm(ctx);
    char byte = 0;

    /* Both endpoints open (and their terms taken) before anything is forged. */
    if (rank == 0) {
        OK(tern_send(ctx, &byte, 1, 1, TAG_DONE));
        OK(tern_recv(ctx, &byte, 1, 1, TAG_DONE, NULL));
    } else {
        OK(tern_recv(ctx, &byte, 1, 0, TAG_DONE, NULL));
        OK(tern_send(ctx, &byte, 1, 0, TAG_DONE));
    }

    if (rank == 1) {
        static const uint64_t credit[] = {UINT64_MAX, (uint64_t)INT64_MAX, (uint64_t)1 << 62,
                                          (uint64_t)1 << 62, (uint64_t)1 << 40};
        uint8_t m[20];
        for (size_t i = 0; i < sizeof(credit) / sizeof(credit[0]); i++) {
            tern__put_le64(m, credit[i]);
            forge(comm, CTRL_CREDIT, m, 8);
        }
        /* A FIN and a refusal for sends rank 0 never posted, statuses 5 and
         * TERN_INPROGRESS: dropped, whatever the status says. */
        tern__put_le64(m, 0xdeadbeef);
        tern__put_le32(m + 8, 5);
        forge(comm, CTRL_FIN, m, 12);
        tern__put_le64(m + 8, 64);
        tern__put_le32(m + 16, (uint32_t)TERN_INPROGRESS);
        forge(comm, CTRL_RTR_FAIL, m, 20);
        /* After them on the same endpoint: rank 0 has handled them all
         * when this arrives. */
        OK(tern_send(ctx, &byte, 1, 0, TAG_DONE));
    } else {
        tern__comm_lock(comm);
        int64_t before = comm->credits[1], most = comm->pair[1].credit;
        tern__comm_unlock(comm);
        OK(tern_recv(ctx, &byte, 1, 1, TAG_DONE, NULL));
        tern__comm_lock(comm);
        int64_t after = comm->credits[1];
        tern__comm_unlock(comm);
        printf("rank 0: credit for rank 1 %" PRId64 " of %" PRId64 " before the forged returns, "
               "%" PRId64 " after\n",
               before, most, after);
        /* Each return was more than rank 0 had charged (the handshake's
         * byte at most): each counts for what was owed, no more, so the
         * credit is back where it started and not a byte past it. */
        CHECK(after == most, "credit for rank 1 went from %" PRId64 " to %" PRId64
              " (it started at %" PRId64 ")", before, after, most);
    }

    /* Eager traffic worth four times the credit, rank 1 receiving late:
     * rank 0 must stop at the credit and go on as it comes back. */
    size_t n = 4 * (size_t)comm->credit_per_peer / 1024 + 1;
    char buf[1024];
    if (rank == 0) {
        for (size_t i = 0; i < n; i++) {
            memset(buf, (int)(i & 0xff), sizeof(buf));
            OK(tern_send(ctx, buf, sizeof(buf), 1, TAG_DATA));
        }
        tern__comm_lock(comm);
        int64_t left = comm->credits[1], most = comm->pair[1].credit;
        tern__comm_unlock(comm);
        CHECK(left >= 0 && left <= most, "credit for rank 1 at %" PRId64 " (at most %" PRId64 ")",
              left, most);
    } else {
        for (size_t i = 0; i < n; i++) {
            OK(tern_recv(ctx, buf, sizeof(buf), 0, TAG_DATA, NULL));
            for (size_t j = 0; j < sizeof(buf); j++)
                CHECK(buf[j] == (char)(i & 0xff), "message %zu byte %zu", i, j);
        }
    }
    /* Neither leaves before the other is done with the data. */
    if (rank == 0)
        OK(tern_recv(ctx, &byte, 1, 1, TAG_DONE, NULL));
    else
        OK(tern_send(ctx, &byte, 1, 0, TAG_DONE));
    printf("rank %d: done, %zu messages of 1 KiB\n", rank, n);
    tern_finalize(ctx);
    return 0;
}
