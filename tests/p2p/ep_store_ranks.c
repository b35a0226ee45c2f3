/*
 * A rank's progress thread must be able to answer a peer it never contacted
 * while the rank's own thread is inside a long store call (tern-run -n N,
 * N >= 2). Answering makes the endpoint to that peer, which reads the peer's
 * address from the store: that lookup must not queue behind the user's call.
 *
 * Every pair of ranks {T, S} is one scenario, run while the other ranks wait
 * at a barrier (an endpoint is made once per pair, so a pair serves once).
 * The target T sits in a store call (a wait, a get with a timeout, or a
 * barrier with S, in turn) on a key that S sets only once its own work with
 * T is done; S's work needs an answer from T's progress thread:
 *   ping    S estimates T's clock (tern_prof_clock_estimate): T answers PONG;
 *   credit  S sends 64 eager 4 KiB messages to receives T posted before its
 *           store call; T's first message back is the CREDIT for those it
 *           consumed, and with TERN_UNEXPECTED_MAX small S runs out of credit,
 *           so its later sends (rendezvous) need T's progress too;
 *   rndv    S sends 1 MiB to a receive T posted: T's progress thread reads
 *           it (an endpoint to S) and answers FIN.
 * S gives its work 10 s (a ping 2 s), then sets the key whatever happened
 * (and only then waits for sends still out), so a stuck T costs seconds,
 * not the job's timeout. The scenarios pick T
 * and S so that T is rank 0 (whose store calls also serve the store), and,
 * with 3+ ranks, T and S both other than 0.
 *
 * And one more mode:
 *   store-lost  rank 0 (the store) dies right after tern_init; once the
 *           others see their store connection closed, each sends to the
 *           next rank, a first contact: the send fails at once with
 *           TERN_ERR_PEER_LOST saying the address could not be read, no
 *           hang (3+ ranks).
 *
 *   ep_store_ranks ping|credit|rndv|store-lost
 *
 * Exits 0 when every check on this rank held; each failure is printed.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <tern/tern.h>

#define MS ((int64_t)1000000)
#define SEC ((int64_t)1000000000)
/* How long S's work may take: far above what it needs, far below the
 * target's store call (60 s). */
#define WORK_NS (10 * SEC)
#define TARGET_NS (60 * SEC)
#define CREDIT_MSGS 64
#define CREDIT_SIZE 4096
#define RNDV_SIZE ((size_t)1 << 20)

typedef enum { WORK_PING, WORK_CREDIT, WORK_RNDV, WORK_STORE_LOST } work_t;
typedef enum { CALL_WAIT, CALL_GET, CALL_BARRIER } call_t;
static const char *const call_name[] = {"tern_store_wait", "tern_store_get", "tern_store_barrier"};

static unsigned rank, world;
static tern_ctx_t *ctx;
static tern_store_t *store;
static int failures;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "rank %u: FAIL %s:%d: ", rank, __func__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                       \
            fprintf(stderr, " [%s]\n", tern_last_error());                      \
            failures++;                                                         \
        }                                                                       \
    } while (0)

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * SEC + ts.tv_nsec;
}

static void nap_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

static uint8_t pat(unsigned from, unsigned i, size_t j)
{
    return (uint8_t)(from * 31 + i * 7 + j * 13 + (j >> 8));
}

static void fill(uint8_t *p, size_t n, unsigned from, unsigned i)
{
    for (size_t j = 0; j < n; j++)
        p[j] = pat(from, i, j);
}

static bool same(const uint8_t *p, size_t n, unsigned from, unsigned i)
{
    for (size_t j = 0; j < n; j++)
        if (p[j] != pat(from, i, j))
            return false;
    return true;
}

/* ---- the sender S ---- */

/* Sends still out when S's time ran out: waited for once T is released.
 * Their buffers live as long as the process. */
static tern_request_t *late[CREDIT_MSGS];
static unsigned nlate;
static uint8_t small_out[CREDIT_MSGS][CREDIT_SIZE], big_out[RNDV_SIZE];
static uint8_t small_in[CREDIT_MSGS][CREDIT_SIZE], big_in[RNDV_SIZE];

/* Wait for reqs[0..n) until deadline; those still out then go to late[].
 * Returns how many did. */
static unsigned wait_all(tern_request_t **reqs, unsigned n, int64_t deadline, const char *what)
{
    unsigned before = nlate;
    for (unsigned i = 0; i < n; i++) {
        int64_t left = deadline - now_ns();
        tern_status_t st = tern_request_wait(reqs[i], left > 0 ? left : 0, NULL);
        if (st == TERN_ERR_TIMEOUT) {
            late[nlate++] = reqs[i];
            continue;
        }
        CHECK(st == TERN_OK, "%s %u of %u: %s", what, i, n, tern_strerror(st));
    }
    return nlate - before;
}

static void sender_work(work_t mode, unsigned t)
{
    int64_t t0 = now_ns();
    switch (mode) {
    case WORK_PING: {
        tern_prof_clock_t c;
        tern_status_t st = tern_prof_clock_estimate(ctx, (int)t, 8, &c);
        CHECK(st == TERN_OK, "clock estimate of rank %u while it sits in a store call: %s", t,
              tern_strerror(st));
        CHECK(st != TERN_OK || c.samples > 0, "clock estimate of rank %u made no round trip", t);
        break;
    }
    case WORK_CREDIT: {
        tern_request_t *reqs[CREDIT_MSGS];
        unsigned n = 0;
        for (unsigned i = 0; i < CREDIT_MSGS; i++) {
            fill(small_out[i], CREDIT_SIZE, rank, i);
            tern_status_t st = tern_isend(ctx, small_out[i], CREDIT_SIZE, (int)t, (int)i, &reqs[n]);
            CHECK(st == TERN_OK, "isend %u to rank %u: %s", i, t, tern_strerror(st));
            if (st == TERN_OK)
                n++;
        }
        unsigned slow = wait_all(reqs, n, t0 + WORK_NS, "credit send");
        CHECK(slow == 0, "%u of %u sends to rank %u (which owed us credit) took over %" PRId64
              " s", slow, n, t, WORK_NS / SEC);
        break;
    }
    case WORK_RNDV: {
        tern_request_t *req;
        fill(big_out, RNDV_SIZE, rank, 0);
        tern_status_t st = tern_isend(ctx, big_out, RNDV_SIZE, (int)t, 0, &req);
        CHECK(st == TERN_OK, "isend of 1 MiB to rank %u: %s", t, tern_strerror(st));
        if (st == TERN_OK) {
            unsigned slow = wait_all(&req, 1, t0 + WORK_NS, "rendezvous send");
            CHECK(slow == 0, "a 1 MiB send to rank %u took over %" PRId64 " s", t, WORK_NS / SEC);
        }
        break;
    }
    case WORK_STORE_LOST: /* no pairs: store_lost() */
        break;
    }
    fprintf(stderr, "rank %u: %s work with rank %u took %.1f ms\n", rank,
            mode == WORK_PING ? "ping" : mode == WORK_CREDIT ? "credit" : "rndv", t,
            (double)(now_ns() - t0) / (double)MS);
}

static void sender(work_t mode, unsigned s_idx, unsigned t, call_t call)
{
    char ready[64], done[64], pair[64];
    const char *keys[1] = {ready};
    snprintf(ready, sizeof(ready), "ep/%u/ready", s_idx);
    snprintf(done, sizeof(done), "ep/%u/done", s_idx);
    snprintf(pair, sizeof(pair), "ep/%u/pair", s_idx);
    tern_status_t st = tern_store_wait(store, keys, 1, TARGET_NS);
    CHECK(st == TERN_OK, "waiting for rank %u to be ready: %s", t, tern_strerror(st));
    /* T says ready just before its call: give it time to be inside. */
    nap_ms(300);
    sender_work(mode, t);
    /* Whatever happened, let T out of its call. */
    if (call == CALL_BARRIER)
        st = tern_store_barrier(store, pair, 2, TARGET_NS);
    else
        st = tern_store_set(store, done, "1", 1);
    CHECK(st == TERN_OK, "releasing rank %u: %s", t, tern_strerror(st));
    /* Out of its call, T answers: nothing outlives the scenario. */
    for (unsigned i = 0; i < nlate; i++) {
        st = tern_request_wait(late[i], TARGET_NS, NULL);
        CHECK(st == TERN_OK, "a late send to rank %u: %s", t, tern_strerror(st));
    }
    nlate = 0;
}

/* ---- the target T ---- */

static void target(work_t mode, unsigned s_idx, unsigned s, call_t call)
{
    char ready[64], done[64], pair[64];
    tern_request_t *reqs[CREDIT_MSGS];
    unsigned n = 0;
    tern_status_t st;
    snprintf(ready, sizeof(ready), "ep/%u/ready", s_idx);
    snprintf(done, sizeof(done), "ep/%u/done", s_idx);
    snprintf(pair, sizeof(pair), "ep/%u/pair", s_idx);

    /* Receives posted now match on T's progress thread while T's own
     * thread is in the store call. Posting one makes no endpoint. */
    if (mode == WORK_CREDIT) {
        for (unsigned i = 0; i < CREDIT_MSGS; i++) {
            st = tern_irecv(ctx, small_in[i], CREDIT_SIZE, (int)s, (int)i, &reqs[n]);
            CHECK(st == TERN_OK, "irecv %u: %s", i, tern_strerror(st));
            if (st == TERN_OK)
                n++;
        }
    } else if (mode == WORK_RNDV) {
        st = tern_irecv(ctx, big_in, RNDV_SIZE, (int)s, 0, &reqs[0]);
        CHECK(st == TERN_OK, "irecv of 1 MiB: %s", tern_strerror(st));
        n = st == TERN_OK;
    }
    st = tern_store_set(store, ready, "1", 1);
    CHECK(st == TERN_OK, "set %s: %s", ready, tern_strerror(st));

    int64_t t0 = now_ns();
    if (call == CALL_WAIT) {
        const char *keys[1] = {done};
        st = tern_store_wait(store, keys, 1, TARGET_NS);
    } else if (call == CALL_GET) {
        void *v = NULL;
        size_t len = 0;
        st = tern_store_get(store, done, &v, &len, TARGET_NS);
        free(v);
    } else {
        st = tern_store_barrier(store, pair, 2, TARGET_NS);
    }
    CHECK(st == TERN_OK, "%s while rank %u works with us: %s", call_name[call], s,
          tern_strerror(st));
    fprintf(stderr, "rank %u: %s returned after %.1f ms\n", rank, call_name[call],
            (double)(now_ns() - t0) / (double)MS);

    for (unsigned i = 0; i < n; i++) {
        tern_msg_info_t info;
        st = tern_request_wait(reqs[i], TARGET_NS, &info);
        CHECK(st == TERN_OK, "receive %u from rank %u: %s", i, s, tern_strerror(st));
        if (st != TERN_OK)
            continue;
        if (mode == WORK_CREDIT)
            CHECK(info.len == CREDIT_SIZE && same(small_in[i], CREDIT_SIZE, s, i),
                  "message %u from rank %u: %zu bytes, or corrupted", i, s, info.len);
        else
            CHECK(info.len == RNDV_SIZE && same(big_in, RNDV_SIZE, s, 0),
                  "1 MiB from rank %u: %zu bytes, or corrupted", s, info.len);
    }
}

/* Rank 0 dies; the others' first sends fail at once, saying why. */
static void store_lost(void)
{
    char key[64];
    tern_status_t st;
    /* Rank 0 dies once every other rank is out of tern_init and has read
     * the answer to its last store call. */
    if (rank == 0) {
        for (unsigned r = 1; r < world; r++) {
            const char *keys[1] = {key};
            snprintf(key, sizeof(key), "ep/lost/%u", r);
            st = tern_store_wait(store, keys, 1, TARGET_NS);
            CHECK(st == TERN_OK, "waiting for rank %u: %s", r, tern_strerror(st));
        }
        _exit(failures == 0 ? 0 : 1); /* no finalize: the store goes with the process */
    }
    snprintf(key, sizeof(key), "ep/lost/%u", rank);
    st = tern_store_set(store, key, "1", 1);
    CHECK(st == TERN_OK, "set %s: %s", key, tern_strerror(st));
    int64_t t0 = now_ns();
    int exists;
    while ((st = tern_store_check(store, "ep/nothing", &exists)) == TERN_OK &&
           now_ns() - t0 < 30 * SEC)
        nap_ms(10);
    CHECK(st == TERN_ERR_PEER_LOST, "the store's loss, seen on this rank's connection: %s",
          tern_strerror(st));
    unsigned to = rank + 1 < world ? rank + 1 : 1;
    uint64_t v = 42;
    t0 = now_ns();
    st = tern_send(ctx, &v, sizeof(v), (int)to, 0);
    double ms = (double)(now_ns() - t0) / (double)MS;
    CHECK(st == TERN_ERR_PEER_LOST && strstr(tern_last_error(), "address") != NULL,
          "a first send to rank %u with the store gone: %s", to, tern_strerror(st));
    CHECK(ms < 2000, "a first send to rank %u with the store gone took %.0f ms", to, ms);
    fprintf(stderr, "rank %u: send to rank %u without a store: %s in %.1f ms [%s]\n", rank, to,
            tern_strerror(st), ms, tern_last_error());
}

int main(int argc, char **argv)
{
    work_t mode;
    if (argc == 2 && strcmp(argv[1], "ping") == 0) {
        mode = WORK_PING;
    } else if (argc == 2 && strcmp(argv[1], "credit") == 0) {
        mode = WORK_CREDIT;
    } else if (argc == 2 && strcmp(argv[1], "rndv") == 0) {
        mode = WORK_RNDV;
    } else if (argc == 2 && strcmp(argv[1], "store-lost") == 0) {
        mode = WORK_STORE_LOST;
    } else {
        fprintf(stderr, "usage: %s ping|credit|rndv|store-lost\n", argv[0]);
        return 2;
    }
    if (tern_init(NULL, &ctx) != TERN_OK) {
        fprintf(stderr, "tern_init: %s\n", tern_last_error());
        return 1;
    }
    rank = tern_ctx_rank(ctx);
    world = tern_ctx_world_size(ctx);
    store = tern_ctx_store(ctx);
    if (world < 2) {
        fprintf(stderr, "needs 2 or more ranks\n");
        tern_finalize(ctx);
        return 77;
    }
    if (mode == WORK_STORE_LOST) {
        if (world < 3) {
            fprintf(stderr, "store-lost needs 3 or more ranks\n");
            return 2;
        }
        store_lost();
        /* Without a store the finalize barrier fails; it frees all the same. */
        tern_finalize(ctx);
        if (failures == 0)
            fprintf(stderr, "rank %u: ok\n", rank);
        return failures == 0 ? 0 : 1;
    }

    /* Every pair once. T is the higher rank of the pair except for the
     * first pair with rank 0, where T is rank 0 (so rank 0's own store call
     * is tested as a target, and rank 0 as a sender too with 3+ ranks). */
    unsigned idx = 0;
    for (unsigned a = 0; a < world; a++) {
        for (unsigned b = a + 1; b < world; b++, idx++) {
            unsigned t = (a == 0 && b == 1) ? 0 : b, s = t == a ? b : a;
            call_t call = (call_t)(idx % 3);
            char name[64];
            snprintf(name, sizeof(name), "ep/%u/start", idx);
            tern_status_t st = tern_store_barrier(store, name, world, TARGET_NS);
            CHECK(st == TERN_OK, "barrier %s: %s", name, tern_strerror(st));
            if (rank == t)
                target(mode, idx, s, call);
            else if (rank == s)
                sender(mode, idx, t, call);
        }
    }
    tern_status_t st = tern_finalize(ctx);
    CHECK(st == TERN_OK, "tern_finalize: %s", tern_strerror(st));
    if (failures == 0)
        fprintf(stderr, "rank %u: ok (%u pairs)\n", rank, idx);
    return failures == 0 ? 0 : 1;
}
