/* Small helpers shared by the core tests. */
#ifndef TERN_TEST_UTIL_H
#define TERN_TEST_UTIL_H

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#define NS_PER_MS 1000000ll

/* A port nothing listens on right now (bound, read back, closed). */
static inline unsigned test_free_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    unsigned port = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

#endif
