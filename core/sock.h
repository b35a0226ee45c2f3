/*
 * Blocking-with-deadline TCP helpers for the store (client side) and listening
 * sockets. Deadlines are absolute tern_clock_ns() values; 0 means none.
 * Every helper records its own error detail.
 */
#ifndef TERN_CORE_SOCK_H
#define TERN_CORE_SOCK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include <tern/status.h>

/*
 * Listen on host:port (host NULL/"" = every interface; port 0 = any free port),
 * non-blocking, close-on-exec. *port_out gets the bound port.
 * TERN_ERR_ADDR_IN_USE when taken, TERN_ERR_UNREACHABLE when host does not resolve.
 */
tern_status_t tern__sock_listen(const char *host, unsigned port, int *fd_out, unsigned *port_out);

/*
 * Connect to host:port, retrying refused/unreachable attempts with back-off until
 * deadline. Returns a blocking, close-on-exec socket with TCP_NODELAY.
 * TERN_ERR_UNREACHABLE with the last cause when the deadline passes.
 */
tern_status_t tern__sock_connect(const char *host, unsigned port, uint64_t deadline, int *fd_out);

/*
 * Work a waiting helper does meanwhile: run(arg) whenever fd is readable and
 * at least every 100 ms. Rank 0's store client serves its own store this way.
 */
typedef struct {
    int fd;
    void (*run)(void *arg);
    void *arg;
} tern__sock_assist_t;

/* Write all of iov (modified) or fail: TERN_ERR_PEER_LOST, TERN_ERR_TIMEOUT.
 * assist may be NULL. */
tern_status_t tern__sock_writev_all(int fd, struct iovec *iov, int iovcnt, uint64_t deadline,
                                   const tern__sock_assist_t *assist);

/* Read exactly len bytes: TERN_ERR_PEER_LOST on EOF, TERN_ERR_TIMEOUT at deadline.
 * assist may be NULL. */
tern_status_t tern__sock_read_all(int fd, void *buf, size_t len, uint64_t deadline,
                                 const tern__sock_assist_t *assist);

/* Deadline helper: now + timeout_ns, saturating. */
uint64_t tern__deadline(int64_t timeout_ns);

#endif
