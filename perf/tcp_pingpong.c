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

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int xfer(int fd, void *buf, size_t n, int out)
{
    char *p = buf;
    while (n > 0) {
        ssize_t r = out ? write(fd, p, n) : read(fd, p, n);
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static int cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

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
                if (xfer(fd, buf, size, 0) || xfer(fd, buf, size, 1))
                    _exit(1);
            } else {
                for (unsigned w = 0; w < window; w++)
                    if (xfer(fd, buf, size, 0))
                        _exit(1);
                if (xfer(fd, &ack, 1, 1))
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
    for (unsigned i = 0; i < warm + iters; i++) {
        if (i == warm)
            t0 = now_ns();
        uint64_t t = now_ns();
        if (lat) {
            if (xfer(fd, buf, size, 1) || xfer(fd, buf, size, 0))
                return 1;
        } else {
            for (unsigned w = 0; w < window; w++)
                if (xfer(fd, buf, size, 1))
                    return 1;
            if (xfer(fd, &ack, 1, 0))
                return 1;
        }
        if (i >= warm)
            s[i - warm] = now_ns() - t;
    }
    double secs = (double)(now_ns() - t0) / 1e9;
    if (lat) {
        double sum = 0;
        for (unsigned i = 0; i < iters; i++)
            sum += (double)s[i];
        qsort(s, iters, sizeof(*s), cmp);
        printf("lat,%zu,%.3f,%.3f\n", size, sum / iters / 2000.0, (double)s[iters / 2] / 2000.0);
    } else {
        printf("bw,%zu,%.3f\n", size, (double)size * window * iters / secs / 1e9);
    }
    waitpid(child, NULL, 0);
    return 0;
}
