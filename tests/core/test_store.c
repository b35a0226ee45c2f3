/* The store: TCP server and clients in one process, and the memory store. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include <tern/log.h>

#include <cmocka.h>

#include <tern/clock.h>
#include <tern/store.h>

#include "core/store.h"
#include "core/store_proto.h"
#include "test_util.h"

#define WORLD 4
#define SEC (1000 * NS_PER_MS)

typedef struct rank_arg {
    unsigned rank;
    unsigned port;       /* 0: use mem */
    tern_store_t *mem;
    int ok;
    char why[256];
} rank_arg_t;

#define CHECK(cond, ...)                                          \
    do {                                                          \
        if (!(cond)) {                                            \
            snprintf(a->why, sizeof(a->why), __VA_ARGS__);        \
            goto out;                                             \
        }                                                         \
    } while (0)

/* What every rank does: publish, read everyone, count, wait, meet twice. */
static void *rank_main(void *arg)
{
    rank_arg_t *a = arg;
    tern_store_t *s = a->mem;
    char key[64], val[64];
    int64_t n;

    if (s == NULL)
        CHECK(tern_store_connect("127.0.0.1", a->port, a->rank, WORLD, 5 * SEC, 10 * SEC, &s) ==
                  TERN_OK, "connect: %s", tern_last_error());
    snprintf(key, sizeof(key), "addr/%u", a->rank);
    snprintf(val, sizeof(val), "rank-%u-address", a->rank);
    CHECK(tern_store_set(s, key, val, strlen(val)) == TERN_OK, "set: %s", tern_last_error());
    for (unsigned r = 0; r < WORLD; r++) {
        void *v = NULL;
        size_t len = 0;
        snprintf(key, sizeof(key), "addr/%u", r);
        snprintf(val, sizeof(val), "rank-%u-address", r);
        CHECK(tern_store_get(s, key, &v, &len, 10 * SEC) == TERN_OK, "get: %s", tern_last_error());
        int same = len == strlen(val) && memcmp(v, val, len) == 0 && ((char *)v)[len] == '\0';
        free(v);
        CHECK(same, "get(%s) returned the wrong value", key);
    }
    CHECK(tern_store_add(s, "counter", 10, &n) == TERN_OK, "add: %s", tern_last_error());
    CHECK(n % 10 == 0 && n >= 10 && n <= 10 * WORLD, "add returned %lld", (long long)n);
    const char *keys[WORLD] = {"addr/0", "addr/1", "addr/2", "addr/3"};
    CHECK(tern_store_wait(s, keys, WORLD, 10 * SEC) == TERN_OK, "wait: %s", tern_last_error());
    for (int round = 0; round < 3; round++)
        CHECK(tern_store_barrier(s, "b", WORLD, 10 * SEC) == TERN_OK, "barrier: %s",
              tern_last_error());
    /* After the barrier every add has happened. */
    CHECK(tern_store_add(s, "counter", 0, &n) == TERN_OK && n == 10 * WORLD, "counter is %lld",
          (long long)n);
    a->ok = 1;
out:
    if (a->mem == NULL)
        tern_store_close(s);
    return NULL;
}

static void run_ranks(unsigned port, tern_store_t *mem)
{
    pthread_t t[WORLD];
    rank_arg_t args[WORLD];
    for (unsigned r = 0; r < WORLD; r++) {
        args[r] = (rank_arg_t){.rank = r, .port = port, .mem = mem};
        assert_int_equal(pthread_create(&t[r], NULL, rank_main, &args[r]), 0);
    }
    for (unsigned r = 0; r < WORLD; r++) {
        pthread_join(t[r], NULL);
        if (!args[r].ok)
            fail_msg("rank %u: %s", r, args[r].why);
    }
}

static void test_tcp_four_ranks(void **state)
{
    tern_store_server_t *srv;
    (void)state;
    assert_int_equal(tern_store_server_start("127.0.0.1", 0, WORLD, &srv), TERN_OK);
    assert_true(tern_store_server_port(srv) > 0);
    run_ranks(tern_store_server_port(srv), NULL);
    /* Every client closed: stop must not wait. */
    assert_int_equal(tern_store_server_stop(srv, 5 * SEC), TERN_OK);
}

static void test_memory_four_ranks(void **state)
{
    tern_store_t *mem;
    (void)state;
    assert_int_equal(tern_store_memory_create(WORLD, 10 * SEC, &mem), TERN_OK);
    run_ranks(0, mem);
    tern_store_close(mem);
}

/* Runs the same single-client checks against either backend. */
static void check_timeouts_and_errors(tern_store_t *s)
{
    void *v = NULL;
    size_t len;
    int exists = -1;
    int64_t n;

    uint64_t t0 = tern_clock_ns();
    assert_int_equal(tern_store_get(s, "never", &v, &len, 200 * NS_PER_MS), TERN_ERR_TIMEOUT);
    uint64_t dt = tern_clock_ns() - t0;
    assert_true(dt >= 200 * NS_PER_MS);
    assert_true(dt < 5 * SEC);
    assert_non_null(strstr(tern_last_error(), "never"));
    const char *keys[] = {"k1", "missing"};
    assert_int_equal(tern_store_set(s, "k1", "x", 1), TERN_OK);
    assert_int_equal(tern_store_wait(s, keys, 2, 100 * NS_PER_MS), TERN_ERR_TIMEOUT);
    assert_non_null(strstr(tern_last_error(), "missing"));

    /* Still usable after timeouts. */
    assert_int_equal(tern_store_check(s, "k1", &exists), TERN_OK);
    assert_int_equal(exists, 1);
    assert_int_equal(tern_store_check(s, "missing", &exists), TERN_OK);
    assert_int_equal(exists, 0);

    /* Empty values are values. */
    assert_int_equal(tern_store_set(s, "empty", NULL, 0), TERN_OK);
    assert_int_equal(tern_store_get(s, "empty", &v, &len, SEC), TERN_OK);
    assert_int_equal(len, 0);
    free(v);

    /* add: on a non-integer is an error, and loses nothing. */
    assert_int_equal(tern_store_add(s, "k1", 1, &n), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_store_get(s, "k1", &v, &len, SEC), TERN_OK);
    assert_memory_equal(v, "x", 1);
    free(v);
    assert_int_equal(tern_store_add(s, "num", -5, &n), TERN_OK);
    assert_int_equal(n, -5);
    assert_int_equal(tern_store_get(s, "num", &v, &len, SEC), TERN_OK);
    assert_string_equal(v, "-5");
    free(v);
    assert_int_equal(tern_store_add(s, "num", INT64_MAX, &n), TERN_OK);
    assert_int_equal(tern_store_add(s, "num", INT64_MAX, &n), TERN_ERR_OUT_OF_RANGE);

    /* Bad arguments. */
    char big[TERN_STORE_KEY_MAX + 2];
    memset(big, 'k', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    assert_int_equal(tern_store_set(s, NULL, "x", 1), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_store_set(s, "", "x", 1), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_store_set(s, big, "x", 1), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_store_set(s, "k", NULL, 3), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_store_set(s, "k", "x", (size_t)TERN_STORE_VALUE_MAX + 1),
                     TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_store_get(s, "k1", &v, &len, -7), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_store_wait(s, keys, 0, SEC), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_store_barrier(s, "x", 0, SEC), TERN_ERR_INVALID_PARAM);

    /* A large value round-trips intact. */
    size_t blen = 3u << 20;
    char *blob = malloc(blen);
    assert_non_null(blob);
    for (size_t i = 0; i < blen; i++)
        blob[i] = (char)(i * 131 + 7);
    assert_int_equal(tern_store_set(s, "blob", blob, blen), TERN_OK);
    assert_int_equal(tern_store_get(s, "blob", &v, &len, SEC), TERN_OK);
    assert_int_equal(len, blen);
    assert_memory_equal(v, blob, blen);
    free(v);
    free(blob);
}

static void test_tcp_timeouts_and_errors(void **state)
{
    tern_store_server_t *srv;
    tern_store_t *s;
    (void)state;
    assert_int_equal(tern_store_server_start("127.0.0.1", 0, 1, &srv), TERN_OK);
    assert_int_equal(tern_store_connect("127.0.0.1", tern_store_server_port(srv), 0, 1, SEC,
                                        10 * SEC, &s),
                     TERN_OK);
    check_timeouts_and_errors(s);
    tern_store_close(s);
    assert_int_equal(tern_store_server_stop(srv, 5 * SEC), TERN_OK);
}

static void test_memory_timeouts_and_errors(void **state)
{
    tern_store_t *s;
    (void)state;
    assert_int_equal(tern_store_memory_create(1, 10 * SEC, &s), TERN_OK);
    check_timeouts_and_errors(s);
    /* A key of the longest kind and a value too big: the reason comes first
     * and the key is cut (it filled the detail, hiding the reason). */
    static char key[TERN_STORE_KEY_MAX + 1];
    memset(key, 'k', TERN_STORE_KEY_MAX);
    assert_int_equal(tern_store_set(s, key, "x", (size_t)TERN_STORE_VALUE_MAX + 1),
                     TERN_ERR_INVALID_PARAM);
    if (strstr(tern_last_error(), "exceeds") == NULL ||
        strstr(tern_last_error(), "(4096 bytes)") == NULL)
        fail_msg("the detail hides the reason: %s", tern_last_error());
    assert_int_equal(tern_store_get(s, key, NULL, NULL, 1000000), TERN_ERR_INVALID_PARAM);
    tern_store_close(s);
}

static void test_unreachable(void **state)
{
    tern_store_t *s = NULL;
    unsigned port = test_free_port();
    (void)state;
    assert_true(port > 0);
    uint64_t t0 = tern_clock_ns();
    assert_int_equal(tern_store_connect("127.0.0.1", port, 1, 2, 500 * NS_PER_MS, SEC, &s),
                     TERN_ERR_UNREACHABLE);
    uint64_t dt = tern_clock_ns() - t0;
    assert_null(s);
    assert_true(dt >= 500 * NS_PER_MS);
    assert_true(dt < 5 * SEC); /* an error within the timeout, not a hang */
    assert_non_null(strstr(tern_last_error(), "unreachable"));
    assert_non_null(strstr(tern_last_error(), "refused"));
    /* A name that does not resolve is unreachable too, and says so. */
    assert_int_equal(tern_store_connect("no-such-host.invalid", port, 1, 2, 200 * NS_PER_MS, SEC, &s),
                     TERN_ERR_UNREACHABLE);
}

static void test_mismatch_and_duplicate(void **state)
{
    tern_store_server_t *srv;
    tern_store_t *a = NULL, *b = NULL;
    unsigned port;
    (void)state;
    assert_int_equal(tern_store_server_start("127.0.0.1", 0, 2, &srv), TERN_OK);
    port = tern_store_server_port(srv);
    assert_int_equal(tern_store_connect("127.0.0.1", port, 1, 3, SEC, SEC, &b), TERN_ERR_MISMATCH);
    assert_non_null(strstr(tern_last_error(), "world size mismatch"));
    assert_int_equal(tern_store_connect("127.0.0.1", port, 1, 2, SEC, SEC, &a), TERN_OK);
    assert_int_equal(tern_store_connect("127.0.0.1", port, 1, 2, SEC, SEC, &b), TERN_ERR_MISMATCH);
    assert_non_null(strstr(tern_last_error(), "duplicate rank"));
    assert_null(b);
    /* Rank 1's slot frees when it disconnects. */
    tern_store_close(a);
    uint64_t deadline = tern_clock_ns() + 5 * SEC;
    tern_status_t st;
    while ((st = tern_store_connect("127.0.0.1", port, 1, 2, SEC, SEC, &b)) == TERN_ERR_MISMATCH &&
           tern_clock_ns() < deadline)
        usleep(10000);
    assert_int_equal(st, TERN_OK);
    /* Stop with a client still connected: reports it, stops anyway. */
    assert_int_equal(tern_store_server_stop(srv, 100 * NS_PER_MS), TERN_ERR_TIMEOUT);
    /* The client sees the server gone rather than hanging. */
    assert_int_equal(tern_store_set(b, "k", "v", 1), TERN_ERR_PEER_LOST);
    assert_int_equal(tern_store_set(b, "k", "v", 1), TERN_ERR_PEER_LOST); /* sticky */
    tern_store_close(b);

    /* Memory store performs the same checks. */
    tern_store_t *mem;
    assert_int_equal(tern_store_memory_create(2, SEC, &mem), TERN_OK);
    assert_int_equal(tern__store_join(mem, 0, 2), TERN_OK);
    assert_int_equal(tern__store_join(mem, 0, 2), TERN_ERR_MISMATCH);
    assert_int_equal(tern__store_join(mem, 1, 5), TERN_ERR_MISMATCH);
    assert_int_equal(tern__store_join(mem, 2, 2), TERN_ERR_INVALID_PARAM); /* out of range */
    tern_store_close(mem);
}

static void test_port_in_use(void **state)
{
    tern_store_server_t *a, *b = NULL;
    char want[32];
    (void)state;
    assert_int_equal(tern_store_server_start("127.0.0.1", 0, 2, &a), TERN_OK);
    unsigned port = tern_store_server_port(a);
    assert_int_equal(tern_store_server_start("127.0.0.1", port, 2, &b), TERN_ERR_ADDR_IN_USE);
    assert_null(b);
    snprintf(want, sizeof(want), ":%u", port);
    assert_non_null(strstr(tern_last_error(), want));
    assert_non_null(strstr(tern_last_error(), "in use"));
    assert_int_equal(tern_store_server_stop(a, SEC), TERN_OK);
}

/* Garbage from the network drops that connection only. */
static void send_raw(unsigned port, const void *buf, size_t len, int expect_reply)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    char reply[256];
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(send(fd, buf, len, MSG_NOSIGNAL), (ssize_t)len);
    /* The server either answers with a protocol error or just closes: read to EOF. */
    ssize_t total = 0, n;
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    while ((n = recv(fd, reply, sizeof(reply), 0)) > 0)
        total += n;
    assert_int_equal(n, 0); /* closed, not timed out */
    if (expect_reply)
        assert_true(total >= TERN__STORE_HDR_SIZE);
    close(fd);
}

/* Out of descriptors, the server warns once and takes the waiting clients
 * off the listener (closing them): it used to spin on the readable listener,
 * warning each time (2 million lines in 8 s). In a child process, whose
 * descriptor limit is cut to a few past the server's own. */
static atomic_int fd_warnings;

static void count_fd_warnings(tern_log_level_t level, int rank, const char *msg, void *arg)
{
    (void)rank, (void)arg;
    if (level == TERN_LOG_WARN && (strstr(msg, "accept") || strstr(msg, "file descriptors")))
        atomic_fetch_add(&fd_warnings, 1);
}

static void test_out_of_fds(void **state)
{
    int ready[2];
    (void)state;
    assert_int_equal(pipe(ready), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        tern_store_server_t *srv;
        tern_log_set_sink(count_fd_warnings, NULL);
        if (tern_store_server_start("127.0.0.1", 0, 64, &srv) != TERN_OK)
            _exit(2);
        int probe = open("/dev/null", O_RDONLY);
        close(probe);
        struct rlimit rl = {(rlim_t)probe + 2, (rlim_t)probe + 2};
        setrlimit(RLIMIT_NOFILE, &rl);
        unsigned port = tern_store_server_port(srv);
        if (write(ready[1], &port, sizeof(port)) != (ssize_t)sizeof(port))
            _exit(3);
        struct timespec nap = {2, 0};
        nanosleep(&nap, NULL);
        int n = atomic_load(&fd_warnings);
        fprintf(stderr, "out of descriptors: %d warnings\n", n);
        _exit(n >= 1 && n <= 2 ? 0 : 1);
    }
    unsigned port = 0;
    assert_int_equal(read(ready[0], &port, sizeof(port)), (ssize_t)sizeof(port));
    int fds[40];
    for (int i = 0; i < 40; i++) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        assert_true(fds[i] >= 0);
        connect(fds[i], (struct sockaddr *)&a, sizeof(a)); /* queued, or refused: either */
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    for (int i = 0; i < 40; i++)
        close(fds[i]);
    close(ready[0]);
    close(ready[1]);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static void test_malformed_input(void **state)
{
    tern_store_server_t *srv;
    tern_store_t *s;
    uint8_t hdr[TERN__STORE_HDR_SIZE + 8] = {0};
    (void)state;
    assert_int_equal(tern_store_server_start("127.0.0.1", 0, 1, &srv), TERN_OK);
    unsigned port = tern_store_server_port(srv);

    send_raw(port, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27, 1); /* bad magic */
    tern__put_be32(hdr, TERN__STORE_MAGIC);
    hdr[4] = TERN__STORE_SET;
    hdr[5] = TERN__STORE_VERSION;
    hdr[7] = 1;
    send_raw(port, hdr, TERN__STORE_HDR_SIZE, 1); /* SET before HELLO */
    hdr[4] = TERN__STORE_HELLO;
    hdr[7] = 0;
    tern__put_be32(hdr + 8, 0xffffffffu); /* 4 GiB body */
    send_raw(port, hdr, TERN__STORE_HDR_SIZE, 1);
    hdr[5] = 99; /* another protocol version */
    tern__put_be32(hdr + 8, 0);
    send_raw(port, hdr, TERN__STORE_HDR_SIZE, 1);
    /* HELLO, then a SET whose key length runs past the body. */
    {
        uint8_t msg[2 * TERN__STORE_HDR_SIZE + 6] = {0};
        tern__put_be32(msg, TERN__STORE_MAGIC);
        msg[4] = TERN__STORE_HELLO;
        msg[5] = TERN__STORE_VERSION;
        tern__put_be64(msg + 16, 1); /* rank 0, world 1 */
        uint8_t *m2 = msg + TERN__STORE_HDR_SIZE;
        tern__put_be32(m2, TERN__STORE_MAGIC);
        m2[4] = TERN__STORE_SET;
        m2[5] = TERN__STORE_VERSION;
        m2[7] = 1;
        tern__put_be32(m2 + 8, 6);
        tern__put_be32(m2 + TERN__STORE_HDR_SIZE, 1000); /* key of 1000 bytes in a 6-byte body */
        send_raw(port, msg, sizeof(msg), 1);
    }

    /* The server still serves well-behaved clients. */
    assert_int_equal(tern_store_connect("127.0.0.1", port, 0, 1, SEC, SEC, &s), TERN_OK);
    assert_int_equal(tern_store_set(s, "still", "ok", 2), TERN_OK);
    tern_store_close(s);
    assert_int_equal(tern_store_server_stop(srv, 5 * SEC), TERN_OK);
}

/* A server that goes away while a client is blocked in get: an error, not a hang. */
typedef struct blocked {
    tern_store_t *s;
    tern_status_t st;
} blocked_t;

static void *blocked_get(void *arg)
{
    blocked_t *b = arg;
    void *v;
    size_t len;
    b->st = tern_store_get(b->s, "never", &v, &len, 60 * SEC);
    if (b->st == TERN_OK)
        free(v);
    return NULL;
}

static void test_server_lost_during_get(void **state)
{
    tern_store_server_t *srv;
    blocked_t b = {0};
    pthread_t t;
    (void)state;
    assert_int_equal(tern_store_server_start("127.0.0.1", 0, 1, &srv), TERN_OK);
    assert_int_equal(tern_store_connect("127.0.0.1", tern_store_server_port(srv), 0, 1, SEC, SEC,
                                        &b.s),
                     TERN_OK);
    uint64_t t0 = tern_clock_ns();
    assert_int_equal(pthread_create(&t, NULL, blocked_get, &b), 0);
    usleep(100000);
    tern_store_server_stop(srv, 0);
    pthread_join(t, NULL);
    assert_int_equal(b.st, TERN_ERR_PEER_LOST);
    assert_true(tern_clock_ns() - t0 < 30 * SEC);
    tern_store_close(b.s);
}

/*
 * A further connection of a rank (tern__store_connect_aux, what endpoint
 * lookups use): it answers while the rank's first handle is held by a long
 * get; it is admitted only for a connected rank of the right world; the
 * server does not count it as a member, so a stop waits only for the real
 * ones. A memory store needs none.
 */
static void test_aux_connection(void **state)
{
    tern_store_server_t *srv;
    tern_store_t *a = NULL, *aa = NULL, *z = NULL, *za = NULL, *x = NULL;
    blocked_t b = {0};
    pthread_t t;
    void *v = NULL;
    size_t len = 0;
    (void)state;
    assert_int_equal(tern_store_server_start("127.0.0.1", 0, 2, &srv), TERN_OK);
    unsigned port = tern_store_server_port(srv);
    assert_int_equal(tern_store_connect("127.0.0.1", port, 1, 2, SEC, 10 * SEC, &a), TERN_OK);
    assert_int_equal(tern__store_connect_aux(a, &aa), TERN_OK);
    assert_non_null(aa);
    assert_int_equal(tern_store_set(a, "addr", "x", 1), TERN_OK);

    /* a's only request is parked on a key nobody has set: aa still answers,
     * at once, and its set releases a. */
    b.s = a;
    assert_int_equal(pthread_create(&t, NULL, blocked_get, &b), 0);
    usleep(100000);
    uint64_t t0 = tern_clock_ns();
    assert_int_equal(tern_store_get(aa, "addr", &v, &len, 0), TERN_OK);
    assert_true(len == 1 && memcmp(v, "x", 1) == 0);
    free(v);
    assert_true(tern_clock_ns() - t0 < SEC);
    assert_int_equal(tern_store_set(aa, "never", "", 0), TERN_OK);
    pthread_join(t, NULL);
    assert_int_equal(b.st, TERN_OK);

    /* Admitted only beside a connected rank: once rank 0 leaves, its
     * further connection stays, but no new one is let in. */
    assert_int_equal(tern_store_connect("127.0.0.1", port, 0, 2, SEC, SEC, &z), TERN_OK);
    assert_int_equal(tern__store_connect_aux(z, &za), TERN_OK);
    tern_store_close(z);
    uint64_t deadline = tern_clock_ns() + 5 * SEC;
    tern_status_t st;
    while ((st = tern__store_connect_aux(za, &x)) == TERN_OK && tern_clock_ns() < deadline) {
        tern_store_close(x);
        x = NULL;
        usleep(10000);
    }
    assert_int_equal(st, TERN_ERR_MISMATCH);
    assert_non_null(strstr(tern_last_error(), "not connected"));
    assert_null(x);
    assert_int_equal(tern_store_set(za, "k", "v", 1), TERN_OK);

    /* The stop waits for a, not for the further connections. */
    tern_store_close(a);
    assert_int_equal(tern_store_server_stop(srv, 5 * SEC), TERN_OK);
    assert_int_equal(tern_store_get(aa, "addr", &v, &len, 0), TERN_ERR_PEER_LOST);
    tern_store_close(aa);
    tern_store_close(za);

    tern_store_t *mem;
    assert_int_equal(tern_store_memory_create(2, SEC, &mem), TERN_OK);
    x = mem;
    assert_int_equal(tern__store_connect_aux(mem, &x), TERN_OK);
    assert_null(x);
    assert_int_equal(tern__store_connect_aux(NULL, &x), TERN_ERR_INVALID_PARAM);
    tern_store_close(mem);
}

/* Rank 1 of the adopted-server test: served only while rank 0's own calls wait. */
static void *adopted_peer(void *arg)
{
    rank_arg_t *a = arg;
    tern_store_t *s = NULL;
    void *v = NULL;
    size_t len;
    CHECK(tern_store_connect("127.0.0.1", a->port, 1, 2, 5 * SEC, 10 * SEC, &s) == TERN_OK,
          "connect: %s", tern_last_error());
    CHECK(tern_store_set(s, "from-b", "b", 1) == TERN_OK, "set: %s", tern_last_error());
    CHECK(tern_store_get(s, "from-a", &v, &len, 10 * SEC) == TERN_OK, "get: %s",
          tern_last_error());
    CHECK(len == 1 && memcmp(v, "a", 1) == 0, "get returned the wrong value");
    CHECK(tern_store_set(s, "b-done", "", 0) == TERN_OK, "set: %s", tern_last_error());
    a->ok = 1;
out:
    free(v);
    tern_store_close(s);
    return NULL;
}

/*
 * A context hands rank 0's store server to its progress thread; rank 0's own
 * store calls, which that very thread may make, serve it while they wait.
 * Here nothing else serves it: without that, every call below hangs.
 */
static void test_adopted_server(void **state)
{
    tern_store_server_t *srv;
    tern_store_t *s;
    rank_arg_t b = {.rank = 1};
    pthread_t t;
    void *v = NULL;
    size_t len;
    int fd = -1;
    (void)state;
    assert_int_equal(tern_store_server_start("127.0.0.1", 0, 2, &srv), TERN_OK);
    b.port = tern_store_server_port(srv);
    assert_int_equal(tern_store_connect("127.0.0.1", b.port, 0, 2, SEC, 10 * SEC, &s), TERN_OK);
    tern__store_assist(s, srv);
    assert_int_equal(tern__store_server_adopt(srv, &fd), TERN_OK);
    assert_true(fd >= 0);

    int64_t n = 0;
    assert_int_equal(tern_store_add(s, "count", 5, &n), TERN_OK);
    assert_int_equal(n, 5);
    /* A parked request's deadline passes with no traffic at all. */
    uint64_t t0 = tern_clock_ns();
    assert_int_equal(tern_store_get(s, "never", &v, &len, 200 * NS_PER_MS), TERN_ERR_TIMEOUT);
    uint64_t dt = tern_clock_ns() - t0;
    assert_true(dt >= 190 * NS_PER_MS && dt < 3 * SEC);

    /* Another rank connects and talks while only rank 0's waits serve. */
    assert_int_equal(pthread_create(&t, NULL, adopted_peer, &b), 0);
    assert_int_equal(tern_store_get(s, "from-b", &v, &len, 10 * SEC), TERN_OK);
    assert_true(len == 1 && memcmp(v, "b", 1) == 0);
    free(v);
    assert_int_equal(tern_store_set(s, "from-a", "a", 1), TERN_OK);
    const char *keys[1] = {"b-done"};
    assert_int_equal(tern_store_wait(s, keys, 1, 10 * SEC), TERN_OK);
    tern_store_close(s);
    /* Stopping serves by itself until rank 1 has gone. */
    assert_int_equal(tern_store_server_stop(srv, 10 * SEC), TERN_OK);
    pthread_join(t, NULL);
    if (!b.ok)
        print_error("rank 1: %s\n", b.why);
    assert_true(b.ok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tcp_four_ranks),
        cmocka_unit_test(test_memory_four_ranks),
        cmocka_unit_test(test_tcp_timeouts_and_errors),
        cmocka_unit_test(test_memory_timeouts_and_errors),
        cmocka_unit_test(test_unreachable),
        cmocka_unit_test(test_mismatch_and_duplicate),
        cmocka_unit_test(test_port_in_use),
        cmocka_unit_test(test_malformed_input),
        cmocka_unit_test(test_out_of_fds),
        cmocka_unit_test(test_server_lost_during_get),
        cmocka_unit_test(test_adopted_server),
        cmocka_unit_test(test_aux_connection),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
