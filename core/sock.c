/* TCP helpers with deadlines. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <tern/clock.h>

#include "core/error.h"
#include "core/log.h"
#include "core/sock.h"

uint64_t tern__deadline(int64_t timeout_ns)
{
    uint64_t now = tern_clock_ns();
    if (timeout_ns < 0)
        return 0;
    if ((uint64_t)timeout_ns > UINT64_MAX - now)
        return UINT64_MAX;
    return now + (uint64_t)timeout_ns;
}

/* Milliseconds left before deadline for poll(): -1 for none, 0 when passed. */
static int poll_ms(uint64_t deadline)
{
    uint64_t now;
    if (deadline == 0)
        return -1;
    now = tern_clock_ns();
    if (now >= deadline)
        return 0;
    uint64_t ms = (deadline - now + 999999) / 1000000;
    return ms > 60000 ? 60000 : (int)ms; /* re-check long waits periodically */
}

static tern_status_t resolve(const char *host, unsigned port, int passive, struct addrinfo **res)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    char portstr[16];
    int rc;

    if (passive)
        hints.ai_flags = AI_PASSIVE;
    snprintf(portstr, sizeof(portstr), "%u", port);
    rc = getaddrinfo(host && *host ? host : NULL, portstr, &hints, res);
    if (rc != 0)
        return tern__error(TERN_ERR_UNREACHABLE, "cannot resolve '%s': %s", host ? host : "",
                           gai_strerror(rc));
    return TERN_OK;
}

tern_status_t tern__sock_listen(const char *host, unsigned port, int *fd_out, unsigned *port_out)
{
    struct addrinfo *res = NULL, *ai;
    int fd = -1, err = 0, one = 1;
    tern_status_t st;
    struct sockaddr_storage ss;
    socklen_t sslen = sizeof(ss);

    if (port > 65535)
        return tern__error(TERN_ERR_INVALID_PARAM, "port %u is out of range", port);
    st = resolve(host, port, 1, &res);
    if (st != TERN_OK)
        return st;
    for (ai = res; ai != NULL; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        /* Lets a restarted job reuse a port still in TIME_WAIT; a live listener
         * on the port still makes bind fail with EADDRINUSE. */
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 1024) == 0)
            break;
        err = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        if (err == EADDRINUSE)
            return tern__error(TERN_ERR_ADDR_IN_USE,
                               "cannot listen on %s:%u: port in use (another job? set MASTER_PORT)",
                               host && *host ? host : "*", port);
        return tern__error_errno(tern__status_from_errno(err), err, "cannot listen on %s:%u",
                                 host && *host ? host : "*", port);
    }
    if (getsockname(fd, (struct sockaddr *)&ss, &sslen) != 0) {
        err = errno;
        close(fd);
        return tern__error_errno(TERN_ERR_IO, err, "getsockname");
    }
    *port_out = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    *fd_out = fd;
    return TERN_OK;
}

/* One non-blocking connect attempt bounded by deadline; returns errno or 0. */
static int try_connect(const struct addrinfo *ai, uint64_t deadline, int *fd_out)
{
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    int err = 0;
    socklen_t len = sizeof(err);

    if (fd < 0)
        return errno;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        if (errno != EINPROGRESS) {
            err = errno;
            goto fail;
        }
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int rc;
        do {
            rc = poll(&p, 1, poll_ms(deadline));
        } while ((rc < 0 && errno == EINTR) || (rc == 0 && poll_ms(deadline) != 0));
        if (rc <= 0) {
            err = rc == 0 ? ETIMEDOUT : errno;
            goto fail;
        }
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
            err = errno;
        if (err != 0)
            goto fail;
    }
    int flags = fcntl(fd, F_GETFL);
    int one = 1;
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        err = errno;
        goto fail;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    *fd_out = fd;
    return 0;
fail:
    close(fd);
    return err;
}

tern_status_t tern__sock_connect(const char *host, unsigned port, uint64_t deadline, int *fd_out)
{
    uint64_t backoff_ns = 10 * 1000 * 1000;
    char last[256] = "no attempt made";
    unsigned attempts = 0;
    uint64_t start = tern_clock_ns();

    for (;;) {
        struct addrinfo *res = NULL;
        if (resolve(host, port, 0, &res) == TERN_OK) {
            for (const struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
                int err = try_connect(ai, deadline, fd_out);
                if (err == 0) {
                    freeaddrinfo(res);
                    return TERN_OK;
                }
                snprintf(last, sizeof(last), "%s", strerror(err));
            }
            freeaddrinfo(res);
        } else {
            /* Name service may come up late on a booting node: keep trying. */
            snprintf(last, sizeof(last), "%s", tern_last_error());
        }
        attempts++;
        uint64_t now = tern_clock_ns();
        if (deadline != 0 && now >= deadline)
            break;
        uint64_t nap = backoff_ns;
        if (deadline != 0 && now + nap > deadline)
            nap = deadline - now;
        struct timespec ts = {(time_t)(nap / 1000000000u), (long)(nap % 1000000000u)};
        nanosleep(&ts, NULL);
        if (backoff_ns < 500 * 1000 * 1000)
            backoff_ns *= 2;
    }
    return tern__error(TERN_ERR_UNREACHABLE,
                       "store at %s:%u unreachable after %llu ms (%u attempts): %s", host, port,
                       (unsigned long long)((tern_clock_ns() - start) / 1000000), attempts, last);
}

/* Wait until fd is ready for events or the deadline passes. */
static tern_status_t wait_fd(int fd, short events, uint64_t deadline,
                             const tern__sock_assist_t *assist, const char *what)
{
    struct pollfd p[2] = {{.fd = fd, .events = events}};
    nfds_t n = 1;
    if (assist != NULL) {
        p[1] = (struct pollfd){.fd = assist->fd, .events = POLLIN};
        n = 2;
    }
    for (;;) {
        int ms = poll_ms(deadline);
        if (ms == 0)
            return tern__error(TERN_ERR_TIMEOUT, "store: %s timed out", what);
        if (assist != NULL && (ms < 0 || ms > 100))
            ms = 100;
        int rc = poll(p, n, ms);
        if (rc < 0 && errno != EINTR)
            return tern__error_errno(TERN_ERR_IO, errno, "store: poll while %s", what);
        if (assist != NULL && rc >= 0)
            assist->run(assist->arg);
        if (rc > 0 && p[0].revents != 0)
            return TERN_OK;
    }
}

tern_status_t tern__sock_writev_all(int fd, struct iovec *iov, int iovcnt, uint64_t deadline,
                                   const tern__sock_assist_t *assist)
{
    while (iovcnt > 0) {
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)iovcnt};
        ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                tern_status_t st = wait_fd(fd, POLLOUT, deadline, assist, "sending");
                if (st != TERN_OK)
                    return st;
                continue;
            }
            return tern__error_errno(errno == EPIPE || errno == ECONNRESET ? TERN_ERR_PEER_LOST
                                                                           : TERN_ERR_IO,
                                     errno, "store: send");
        }
        while (iovcnt > 0 && (size_t)n >= iov->iov_len) {
            n -= (ssize_t)iov->iov_len;
            iov++;
            iovcnt--;
        }
        if (iovcnt > 0) {
            iov->iov_base = (char *)iov->iov_base + n;
            iov->iov_len -= (size_t)n;
        }
    }
    return TERN_OK;
}

tern_status_t tern__sock_read_all(int fd, void *buf, size_t len, uint64_t deadline,
                                 const tern__sock_assist_t *assist)
{
    char *p = buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0)
            return tern__error(TERN_ERR_PEER_LOST, "store: connection closed by the server");
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            tern_status_t st = wait_fd(fd, POLLIN, deadline, assist, "waiting for a reply");
            if (st != TERN_OK)
                return st;
            continue;
        }
        return tern__error_errno(errno == ECONNRESET ? TERN_ERR_PEER_LOST : TERN_ERR_IO, errno,
                                 "store: receive");
    }
    return TERN_OK;
}
