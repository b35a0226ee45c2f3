/*
 * The plainest TCP peer for compare.sh: blocking sockets over loopback,
 * TCP_NODELAY, one process per side (fork). What tern's tcp provider is
 * measured against.
 *   tcp-pingpong lat SIZE ITERS          one-way latency (RTT/2): avg and p50 in us
 *   tcp-pingpong bw SIZE ITERS WINDOW    unidirectional bandwidth in GB/s
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
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

int main(int argc, char **argv)
{
    if (argc < 4 || (strcmp(argv[1], "lat") && strcmp(argv[1], "bw"))) {
        fprintf(stderr, "usage: %s lat SIZE ITERS | bw SIZE ITERS WINDOW\n", argv[0]);
        return 2;
    }
    int lat = strcmp(argv[1], "lat") == 0;
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
    memset(buf, 1, size ? size : 1);
    pid_t child = fork();
    if (child == 0) { /* server: echo or sink */
        int fd = accept(lfd, NULL, NULL);
        tune(fd);
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
    if (connect(fd, (struct sockaddr *)&a, sizeof(a))) {
        perror("tcp-pingpong: connect");
        return 1;
    }
    uint64_t *s = calloc(iters, sizeof(*s)), t0 = 0;
    /* One clock read per iteration, where tern-perf takes it: a ping-pong's
     * right after the send, so it overlaps the reply's flight (a sample runs
     * from one send to the next); a window's after the ack. */
    uint64_t t = peer_now_ns();
    for (unsigned i = 0; i < warm + iters; i++) {
        if (i == warm)
            t0 = t;
        if (lat) {
            if (peer_xfer(fd, buf, size, 1))
                return 1;
        } else {
            for (unsigned w = 0; w < window; w++)
                if (peer_xfer(fd, buf, size, 1))
                    return 1;
            if (peer_xfer(fd, &ack, 1, 0))
                return 1;
        }
        uint64_t t1 = peer_now_ns();
        if (i >= warm)
            s[i - warm] = t1 - t;
        t = t1;
        if (lat && peer_xfer(fd, buf, size, 0))
            return 1;
    }
    double secs = (double)(peer_now_ns() - t0) / 1e9;
    if (lat) {
        peer_print_lat(size, s, iters);
    } else {
        printf("bw,%zu,%.3f\n", size, (double)size * window * iters / secs / 1e9);
    }
    waitpid(child, NULL, 0);
    return 0;
}
