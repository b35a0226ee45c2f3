/*
 * The plainest TCP peer for compare.sh: blocking sockets over loopback,
 * TCP_NODELAY, one process per side (fork). What tern's tcp provider is
 * measured against.
 *   tcp-pingpong lat SIZE ITERS          one-way latency (RTT/2): avg and p50 in us
 *   tcp-pingpong bw SIZE ITERS WINDOW    unidirectional bandwidth in GB/s
 *   tcp-pingpong xchg SIZE ITERS         both sides send SIZE and receive SIZE
 *                                        at once: avg and p50 of one exchange in us
 * xchg is the floor under a 2-rank all_reduce of 2 x SIZE over loopback: by
 * any algorithm each rank sends half the buffer and receives half, twice
 * (reduce-scatter, all-gather), so it takes at least two exchanges of SIZE.
 * Each side drives its socket non-blocking from one thread with poll(), as
 * Open MPI's tcp transport does.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "peer.h"

static void tune(int fd)
{
    int one = 1, buf = 4 << 20;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
}

/* Send sbuf[0..n) and receive rbuf[0..n) on the non-blocking fd at once. */
static int exchange(int fd, const char *sbuf, char *rbuf, size_t n)
{
    size_t out = 0, in = 0;
    while (out < n || in < n) {
        struct pollfd p = {.fd = fd,
                           .events = (short)((out < n ? POLLOUT : 0) | (in < n ? POLLIN : 0))};
        if (poll(&p, 1, -1) < 0 && errno != EINTR)
            return -1;
        if (in < n) {
            ssize_t r = read(fd, rbuf + in, n - in);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
                return -1;
            in += r > 0 ? (size_t)r : 0;
        }
        if (out < n) {
            ssize_t r = write(fd, sbuf + out, n - out);
            if (r < 0 && errno != EAGAIN && errno != EINTR)
                return -1;
            out += r > 0 ? (size_t)r : 0;
        }
    }
    return 0;
}

/* xchg: ITERS timed exchanges after a tenth as many untimed, each started by
 * a 1-byte exchange so the two sides begin together. */
static int run_xchg(int fd, int timed, size_t size, unsigned warm, unsigned iters)
{
    char *sbuf = malloc(size ? size : 1), *rbuf = malloc(size ? size : 1), b = 0;
    uint64_t *s = calloc(iters, sizeof(*s));
    int rc = 1;
    if (sbuf == NULL || rbuf == NULL || s == NULL || fcntl(fd, F_SETFL, O_NONBLOCK) != 0)
        goto out;
    memset(sbuf, 1, size ? size : 1);
    for (unsigned i = 0; i < warm + iters; i++) {
        if (exchange(fd, &b, &b, 1))
            goto out;
        uint64_t t = peer_now_ns();
        if (exchange(fd, sbuf, rbuf, size))
            goto out;
        if (i >= warm)
            s[i - warm] = peer_now_ns() - t;
    }
    if (timed)
        peer_print_us("xchg", size, s, iters, 1.0);
    rc = 0;
out:
    free(s);
    free(sbuf);
    free(rbuf);
    return rc;
}

/* The client's side of lat and bw, timed. */
static int run_client(int fd, int lat, char *buf, size_t size, unsigned warm, unsigned iters,
                      unsigned window)
{
    char ack = 0;
    uint64_t *s = calloc(iters ? iters : 1, sizeof(*s)), t0 = 0;
    if (s == NULL)
        return 1;
    /* One clock read per iteration, where tern-perf takes it: a ping-pong's
     * right after the send, so it overlaps the reply's flight (a sample runs
     * from one send to the next); a window's after the ack. */
    uint64_t t = peer_now_ns();
    for (unsigned i = 0; i < warm + iters; i++) {
        if (i == warm)
            t0 = t;
        if (lat) {
            if (peer_xfer(fd, buf, size, 1))
                goto fail;
        } else {
            for (unsigned w = 0; w < window; w++)
                if (peer_xfer(fd, buf, size, 1))
                    goto fail;
            if (peer_xfer(fd, &ack, 1, 0))
                goto fail;
        }
        uint64_t t1 = peer_now_ns();
        if (i >= warm)
            s[i - warm] = t1 - t;
        t = t1;
        if (lat && peer_xfer(fd, buf, size, 0))
            goto fail;
    }
    double secs = (double)(peer_now_ns() - t0) / 1e9;
    if (lat)
        peer_print_lat(size, s, iters);
    else
        printf("bw,%zu,%.3f\n", size, (double)size * window * iters / secs / 1e9);
    free(s);
    return 0;
fail:
    free(s);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 4 || (strcmp(argv[1], "lat") && strcmp(argv[1], "bw") && strcmp(argv[1], "xchg"))) {
        fprintf(stderr, "usage: %s lat SIZE ITERS | bw SIZE ITERS WINDOW | xchg SIZE ITERS\n",
                argv[0]);
        return 2;
    }
    int lat = strcmp(argv[1], "lat") == 0, xchg = strcmp(argv[1], "xchg") == 0;
    size_t size = strtoull(argv[2], NULL, 10);
    unsigned iters = (unsigned)strtoul(argv[3], NULL, 10);
    unsigned window = argc > 4 ? (unsigned)strtoul(argv[4], NULL, 10) : 64;
    unsigned warm = iters / 10 + 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof(a);
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(a)) || listen(lfd, 1) ||
        getsockname(lfd, (struct sockaddr *)&a, &alen)) {
        perror("tcp-pingpong: listen");
        return 1;
    }
    char *buf = malloc(size ? size : 1);
    char ack = 0;
    if (buf == NULL) {
        perror("tcp-pingpong: malloc");
        return 1;
    }
    memset(buf, 1, size ? size : 1);
    pid_t child = fork();
    if (child >= 0)
        peer_bind(child == 0);
    if (child == 0) { /* server: echo or sink */
        int fd = accept(lfd, NULL, NULL);
        tune(fd);
        if (xchg)
            _exit(run_xchg(fd, 0, size, warm, iters));
        for (unsigned i = 0; i < warm + iters; i++) {
            if (lat) {
                if (peer_xfer(fd, buf, size, 0) || peer_xfer(fd, buf, size, 1))
                    _exit(1);
            } else {
                for (unsigned w = 0; w < window; w++)
                    if (peer_xfer(fd, buf, size, 0))
                        _exit(1);
                if (peer_xfer(fd, &ack, 1, 1))
                    _exit(1);
            }
        }
        _exit(0);
    }
    close(lfd);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    tune(fd);
    int rc;
    if (connect(fd, (struct sockaddr *)&a, sizeof(a))) {
        perror("tcp-pingpong: connect");
        if (child > 0)
            kill(child, SIGTERM); /* it waits in accept */
        rc = 1;
    } else if (xchg) {
        rc = run_xchg(fd, 1, size, warm, iters);
    } else {
        rc = run_client(fd, lat, buf, size, warm, iters, window);
    }
    close(fd);
    waitpid(child, NULL, 0);
    free(buf);
    return rc;
}
