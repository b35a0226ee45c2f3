/*
 * The store server: epoll over the listening socket and every client
 * connection. A blocking get or wait parks its connection until the keys
 * appear or its deadline passes; serving never blocks.
 *
 * It starts on a thread of its own. A context hands it to its progress thread
 * (tern__store_server_adopt) so that rank 0 runs no thread beyond the pool,
 * the progress thread and its own; from then on whoever holds serve_lock
 * serves, which also lets rank 0's own store calls serve while they wait
 * (they may be made on the progress thread itself).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <time.h>
#include <unistd.h>

#include <tern/clock.h>

#include "core/clock.h"
#include "core/error.h"
#include "core/kv.h"
#include "core/log.h"
#include "core/sock.h"
#include "core/store.h"
#include "core/store_proto.h"

typedef struct conn {
    struct conn *next;
    int fd;
    int rank; /* -1 until HELLO */
    bool aux; /* said HELLO_AUX: a further connection of rank, not a member */
    uint8_t hdr[TERN__STORE_HDR_SIZE];
    size_t hdr_got;
    uint8_t *body;
    uint32_t body_len;
    size_t body_got;
    /* pending output */
    uint8_t *out;
    size_t out_len, out_off, out_cap;
    bool want_out;
    bool closing; /* close once the output is flushed */
    bool dead;    /* closed by sweep() at the end of the event batch */
    /* a parked GET or WAIT */
    bool parked;
    uint8_t op;
    char **keys;
    unsigned nkeys;
    uint64_t deadline;
    int64_t timeout_ns;
} conn_t;

struct tern_store_server {
    int lfd, epfd, wakefd;
    int spare_fd;    /* held back for EMFILE: freed to accept and close one client */
    bool fds_warned; /* out of descriptors, said once until an accept works again */
    unsigned port;
    pthread_t thread;
    bool thread_started;
    bool adopted;               /* served by tern__store_server_serve callers */
    pthread_mutex_t serve_lock; /* held by whoever serves an adopted server */
    tern__kv_t *kv;
    conn_t *conns;
    int log_rank;
    pthread_mutex_t lock; /* guards stop and members below */
    pthread_cond_t cond;
    bool stop;
    unsigned members; /* connections that said HELLO */
};

/* Sentinel epoll data for the listening socket and the wake eventfd. */
static conn_t listen_tag, wake_tag;

static void free_keys(conn_t *c)
{
    for (unsigned i = 0; i < c->nkeys; i++)
        free(c->keys[i]);
    free(c->keys);
    c->keys = NULL;
    c->nkeys = 0;
    c->parked = false;
}

static void conn_close(tern_store_server_t *s, conn_t *c)
{
    conn_t **pp;
    for (pp = &s->conns; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    }
    epoll_ctl(s->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    if (c->closing) {
        /* Closing with unread input makes the kernel send a reset, which can
         * destroy the error reply still in flight: drain what has arrived. */
        char sink[4096];
        for (int i = 0; i < 16 && recv(c->fd, sink, sizeof(sink), MSG_DONTWAIT) > 0; i++)
            ;
        shutdown(c->fd, SHUT_WR);
    }
    close(c->fd);
    if (c->rank >= 0 && !c->aux) {
        tern__kv_leave(s->kv, (unsigned)c->rank);
        pthread_mutex_lock(&s->lock);
        s->members--;
        pthread_cond_broadcast(&s->cond);
        pthread_mutex_unlock(&s->lock);
        tern_debug("store: rank %d disconnected", c->rank);
    }
    free_keys(c);
    free(c->body);
    free(c->out);
    free(c);
}

static void update_events(tern_store_server_t *s, conn_t *c)
{
    struct epoll_event ev = {.events = EPOLLIN | (c->want_out ? EPOLLOUT : 0), .data.ptr = c};
    epoll_ctl(s->epfd, EPOLL_CTL_MOD, c->fd, &ev);
}

/* Write what can be written now. Returns false if the connection is dead. */
static bool flush_out(tern_store_server_t *s, conn_t *c)
{
    while (c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            return false;
        }
        c->out_off += (size_t)n;
    }
    bool want = c->out_off < c->out_len;
    if (!want) {
        c->out_off = c->out_len = 0;
        if (c->closing)
            return false;
    }
    if (want != c->want_out) {
        c->want_out = want;
        update_events(s, c);
    }
    return true;
}

/* Queue a response. Returns false if the connection must be closed. */
static bool reply(tern_store_server_t *s, conn_t *c, tern_status_t st, int64_t value,
                  const void *body, size_t len)
{
    size_t need = c->out_len + TERN__STORE_HDR_SIZE + len;
    if (need > c->out_cap) {
        uint8_t *p = realloc(c->out, need);
        if (p == NULL) {
            tern_warn("store: no memory for a %zu-byte reply to rank %d", len, c->rank);
            return false;
        }
        c->out = p;
        c->out_cap = need;
    }
    uint8_t *h = c->out + c->out_len;
    tern__put_be32(h, TERN__STORE_MAGIC);
    tern__put_be32(h + 4, (uint32_t)(int32_t)st);
    tern__put_be32(h + 8, (uint32_t)len);
    tern__put_be32(h + 12, 0);
    tern__put_be64(h + 16, (uint64_t)value);
    if (len > 0)
        memcpy(h + TERN__STORE_HDR_SIZE, body, len);
    c->out_len = need;
    return flush_out(s, c);
}

static bool reply_error(tern_store_server_t *s, conn_t *c, tern_status_t st, const char *detail)
{
    return reply(s, c, st, 0, detail, strlen(detail));
}

/* A malformed request: tell the client why, then drop it. */
static bool protocol_error(tern_store_server_t *s, conn_t *c, const char *why)
{
    tern_warn("store: dropping connection (rank %d): %s", c->rank, why);
    c->closing = true;
    return reply_error(s, c, TERN_ERR_PROTOCOL, why) && false;
}

/* Split the body into nkeys NUL-terminated keys; *rest is what follows them. */
static const char *parse_keys(conn_t *c, unsigned nkeys, size_t *rest)
{
    size_t off = 0;
    c->keys = calloc(nkeys ? nkeys : 1, sizeof(char *));
    if (c->keys == NULL)
        return "no memory for keys";
    for (unsigned i = 0; i < nkeys; i++) {
        if (c->body_len - off < 4)
            return "key length runs past the message";
        uint32_t klen = tern__get_be32(c->body + off);
        off += 4;
        if (klen == 0 || klen > TERN_STORE_KEY_MAX || klen > c->body_len - off)
            return "bad key length";
        if (memchr(c->body + off, '\0', klen) != NULL)
            return "key contains a NUL byte";
        c->keys[i] = strndup((const char *)c->body + off, klen);
        if (c->keys[i] == NULL)
            return "no memory for a key";
        c->nkeys = i + 1;
        off += klen;
    }
    *rest = off;
    return NULL;
}

/* If the parked request on c can complete, answer it. Returns false if c died. */
static bool try_complete(tern_store_server_t *s, conn_t *c, bool expired)
{
    bool ok = true;
    if (c->op == TERN__STORE_GET) {
        size_t len;
        const void *v = tern__kv_peek(s->kv, c->keys[0], &len);
        if (v != NULL) {
            ok = reply(s, c, TERN_OK, 0, v, len);
        } else if (expired) {
            char msg[TERN_STORE_KEY_MAX + 128];
            snprintf(msg, sizeof(msg), "store: get('%s') timed out after %" PRId64 " ms",
                     c->keys[0], c->timeout_ns / 1000000);
            ok = reply_error(s, c, TERN_ERR_TIMEOUT, msg);
        } else {
            return true;
        }
    } else {
        unsigned i;
        for (i = 0; i < c->nkeys; i++)
            if (tern__kv_peek(s->kv, c->keys[i], NULL) == NULL)
                break;
        if (i == c->nkeys) {
            ok = reply(s, c, TERN_OK, 0, NULL, 0);
        } else if (expired) {
            char msg[TERN_STORE_KEY_MAX + 128];
            snprintf(msg, sizeof(msg), "store: wait timed out after %" PRId64 " ms; '%s' never set",
                     c->timeout_ns / 1000000, c->keys[i]);
            ok = reply_error(s, c, TERN_ERR_TIMEOUT, msg);
        } else {
            return true;
        }
    }
    free_keys(c);
    return ok;
}

/* After a write to the table, answer every parked request it satisfies. */
static void wake_parked(tern_store_server_t *s)
{
    conn_t *c = s->conns, *next;
    for (; c != NULL; c = next) {
        next = c->next;
        if (c->parked && !c->dead && !try_complete(s, c, false))
            c->dead = true;
    }
}

/* Handle one complete request. Returns false if c must be closed. */
static bool handle(tern_store_server_t *s, conn_t *c)
{
    uint8_t op = c->hdr[4], version = c->hdr[5];
    unsigned nkeys = (unsigned)c->hdr[6] << 8 | c->hdr[7];
    int64_t arg = (int64_t)tern__get_be64(c->hdr + 16);
    size_t rest = 0;
    const char *why;
    tern_status_t st;

    if (version != TERN__STORE_VERSION)
        return protocol_error(s, c, "protocol version mismatch (is every rank the same tern build?)");
    bool hello = op == TERN__STORE_HELLO || op == TERN__STORE_HELLO_AUX;
    if (c->rank < 0 && !hello)
        return protocol_error(s, c, "first request is not HELLO");
    if (hello) {
        if (c->rank >= 0 || nkeys != 1)
            return protocol_error(s, c, "unexpected HELLO");
        if ((why = parse_keys(c, nkeys, &rest)) != NULL)
            return protocol_error(s, c, why);
        if (rest != c->body_len)
            return protocol_error(s, c, "trailing bytes after the job token");
        unsigned rank = (unsigned)((uint64_t)arg >> 32), world = (unsigned)(arg & 0xffffffff);
        bool aux = op == TERN__STORE_HELLO_AUX;
        const char *mine = tern__store_job();
        if (strcmp(c->keys[0], mine) != 0) {
            /* Another job's rank, on this port: two jobs started at once
             * with one MASTER_PORT would otherwise trade members. */
            st = tern__error(TERN_ERR_MISMATCH,
                             "store: a rank %u of another job (%s) reached this job's store "
                             "(%s): two jobs on one MASTER_PORT?",
                             rank, c->keys[0] + 4, mine + 4);
            free_keys(c);
            tern_warn("%s", tern_last_error());
            c->closing = true;
            reply_error(s, c, st, tern_last_error());
            return false;
        }
        free_keys(c);
        st = aux ? tern__kv_check_member(s->kv, rank, world) : tern__kv_join(s->kv, rank, world);
        if (st != TERN_OK) {
            tern_warn("store: refusing a client: %s", tern_last_error());
            c->closing = true;
            reply_error(s, c, st, tern_last_error());
            return false;
        }
        c->rank = (int)rank;
        c->aux = aux;
        if (!aux) {
            pthread_mutex_lock(&s->lock);
            s->members++;
            pthread_mutex_unlock(&s->lock);
        }
        tern_debug("store: rank %u connected%s", rank, aux ? " (a further connection)" : "");
        return reply(s, c, TERN_OK, 0, NULL, 0);
    }
    if (op == TERN__STORE_WAIT ? (nkeys == 0 || nkeys > TERN__STORE_MAX_KEYS) : nkeys != 1)
        return protocol_error(s, c, "wrong number of keys for the request");
    if ((why = parse_keys(c, nkeys, &rest)) != NULL)
        return protocol_error(s, c, why);
    if (op != TERN__STORE_SET && rest != c->body_len)
        return protocol_error(s, c, "trailing bytes after the keys");

    switch (op) {
    case TERN__STORE_SET:
        st = tern__kv_set(s->kv, c->keys[0], c->body + rest, c->body_len - rest);
        free_keys(c);
        if (st != TERN_OK)
            return reply_error(s, c, st, tern_last_error());
        if (!reply(s, c, TERN_OK, 0, NULL, 0))
            return false;
        wake_parked(s);
        return true;
    case TERN__STORE_ADD: {
        int64_t result = 0;
        st = tern__kv_add(s->kv, c->keys[0], arg, &result);
        free_keys(c);
        if (st != TERN_OK)
            return reply_error(s, c, st, tern_last_error());
        if (!reply(s, c, TERN_OK, result, NULL, 0))
            return false;
        wake_parked(s);
        return true;
    }
    case TERN__STORE_CHECK: {
        int exists = tern__kv_peek(s->kv, c->keys[0], NULL) != NULL;
        free_keys(c);
        return reply(s, c, TERN_OK, exists, NULL, 0);
    }
    case TERN__STORE_GET:
    case TERN__STORE_WAIT:
        if (arg < 0)
            return protocol_error(s, c, "negative timeout");
        c->op = op;
        c->parked = true;
        c->timeout_ns = arg;
        c->deadline = tern__deadline(arg);
        return try_complete(s, c, false);
    default:
        return protocol_error(s, c, "unknown request");
    }
}

/* Read what is available; handle each complete request. */
static bool on_readable(tern_store_server_t *s, conn_t *c)
{
    for (;;) {
        ssize_t n;
        if (c->parked) {
            /* A client has one request outstanding, so while parked the only
             * thing it may do is hang up (its own timeout, or it died). */
            uint8_t b;
            n = recv(c->fd, &b, 1, MSG_DONTWAIT | MSG_PEEK);
            if (n == 0)
                return false;
            if (n > 0)
                return protocol_error(s, c, "request sent while another is outstanding");
            return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
        }
        if (c->hdr_got < TERN__STORE_HDR_SIZE) {
            n = recv(c->fd, c->hdr + c->hdr_got, TERN__STORE_HDR_SIZE - c->hdr_got, MSG_DONTWAIT);
        } else {
            n = recv(c->fd, c->body + c->body_got, c->body_len - c->body_got, MSG_DONTWAIT);
        }
        if (n == 0)
            return false;
        if (n < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
        if (c->hdr_got < TERN__STORE_HDR_SIZE) {
            c->hdr_got += (size_t)n;
            if (c->hdr_got < TERN__STORE_HDR_SIZE)
                continue;
            if (tern__get_be32(c->hdr) != TERN__STORE_MAGIC)
                return protocol_error(s, c, "bad magic (not a tern store client?)");
            c->body_len = tern__get_be32(c->hdr + 8);
            if (c->body_len > TERN__STORE_BODY_MAX)
                return protocol_error(s, c, "message too large");
            c->body_got = 0;
            c->body = malloc(c->body_len ? c->body_len : 1);
            if (c->body == NULL)
                return protocol_error(s, c, "no memory for the message");
        } else {
            c->body_got += (size_t)n;
        }
        if (c->body_got == c->body_len) {
            bool ok = handle(s, c);
            free(c->body);
            c->body = NULL;
            c->hdr_got = 0;
            if (!ok)
                return false;
        }
    }
}

static void on_accept(tern_store_server_t *s)
{
    for (;;) {
        int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        int one = 1;
        if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
            /* The client stays queued and the listener readable: without
             * taking it off, epoll woke us at once, for ever (2 million
             * warnings in 8 s). The spare descriptor makes room to accept
             * and close it; it retries until its connect timeout. */
            struct rlimit rl = {0};
            getrlimit(RLIMIT_NOFILE, &rl);
            if (!s->fds_warned)
                tern_warn("store: out of file descriptors (%llu allowed: raise ulimit -n); "
                          "closing new clients until some go",
                          (unsigned long long)rl.rlim_cur);
            s->fds_warned = true;
            if (s->spare_fd < 0)
                return; /* nothing to make room with: the next poll tries again */
            close(s->spare_fd);
            fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC);
            if (fd >= 0)
                close(fd);
            s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
            continue;
        }
        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                tern_warn("store: accept: %m");
            return;
        }
        s->fds_warned = false;
        conn_t *c = calloc(1, sizeof(*c));
        if (c == NULL) {
            tern_warn("store: no memory for a connection");
            close(fd);
            continue;
        }
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        c->fd = fd;
        c->rank = -1;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
            tern_warn("store: epoll_ctl: %m");
            close(fd);
            free(c);
            continue;
        }
        c->next = s->conns;
        s->conns = c;
    }
}

/* Expire parked requests; return the epoll timeout until the next deadline. */
static int expire(tern_store_server_t *s)
{
    uint64_t now = tern_clock_ns(), next = UINT64_MAX;
    conn_t *c, *n;
    for (c = s->conns; c != NULL; c = n) {
        n = c->next;
        if (!c->parked || c->dead)
            continue;
        if (c->deadline != 0 && c->deadline <= now) {
            if (!try_complete(s, c, true))
                c->dead = true;
        } else if (c->deadline != 0 && c->deadline < next) {
            next = c->deadline;
        }
    }
    if (next == UINT64_MAX)
        return -1;
    return (int)((next - now) / 1000000 + 1);
}

/* Close the connections marked dead. Deferred to the end of an event batch
 * because later events in the batch may still name them. */
static void sweep(tern_store_server_t *s)
{
    conn_t *c = s->conns, *next;
    for (; c != NULL; c = next) {
        next = c->next;
        if (c->dead)
            conn_close(s, c);
    }
}

/* One batch of events, waiting at most max_ms (-1: until the next parked
 * deadline). False when epoll fails. */
static bool serve_batch(tern_store_server_t *s, int max_ms)
{
    struct epoll_event evs[64];
    int timeout = expire(s);
    sweep(s);
    if (max_ms >= 0 && (timeout < 0 || timeout > max_ms))
        timeout = max_ms;
    int n = epoll_wait(s->epfd, evs, 64, timeout);
    if (n < 0 && errno != EINTR) {
        tern_error("store: epoll_wait failed, the store stops serving: %m");
        return false;
    }
    for (int i = 0; i < n; i++) {
        conn_t *c = evs[i].data.ptr;
        if (c == &listen_tag) {
            on_accept(s);
            continue;
        }
        if (c == &wake_tag) {
            uint64_t v;
            if (read(s->wakefd, &v, sizeof(v)) < 0 && errno != EAGAIN)
                tern_warn("store: wake read: %m");
            continue;
        }
        if (c->dead)
            continue;
        bool alive = true;
        if (evs[i].events & EPOLLOUT)
            alive = flush_out(s, c);
        if (alive && (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
            alive = on_readable(s, c);
        if (!alive)
            c->dead = true;
    }
    sweep(s);
    return true;
}

static void *server_main(void *arg)
{
    tern_store_server_t *s = arg;

    tern__log_set_rank(s->log_rank);
    for (;;) {
        if (!serve_batch(s, -1))
            break;
        pthread_mutex_lock(&s->lock);
        bool stop = s->stop;
        pthread_mutex_unlock(&s->lock);
        if (stop)
            break;
    }
    return NULL;
}

/* Stop the serving thread (s->lock held; released here): it sees stop on its
 * next wake-up, which the eventfd makes now. */
static void thread_stop_locked(tern_store_server_t *s)
{
    s->stop = true;
    pthread_mutex_unlock(&s->lock);
    uint64_t one = 1;
    if (write(s->wakefd, &one, sizeof(one)) < 0)
        tern_warn("store server: wake write: %m");
    pthread_join(s->thread, NULL);
}

tern_status_t tern__store_server_adopt(tern_store_server_t *s, int *fd_out)
{
    if (s == NULL || fd_out == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "store server: adopt: NULL argument");
    if (s->adopted) {
        *fd_out = s->epfd;
        return TERN_OK;
    }
    if (s->thread_started) {
        pthread_mutex_lock(&s->lock);
        thread_stop_locked(s);
        s->thread_started = false;
        s->stop = false;
    }
    /* Connections and parked requests stay as they are: epoll is
     * level-triggered, so whatever arrived meanwhile is served next batch. */
    s->adopted = true;
    *fd_out = s->epfd;
    return TERN_OK;
}

void tern__store_server_serve(tern_store_server_t *s)
{
    if (s == NULL || !s->adopted || pthread_mutex_trylock(&s->serve_lock) != 0)
        return;
    serve_batch(s, 0);
    pthread_mutex_unlock(&s->serve_lock);
}

tern_status_t tern_store_server_start(const char *host, unsigned port, unsigned world_size,
                                      tern_store_server_t **server_out)
{
    tern_store_server_t *s;
    tern_status_t st;
    struct epoll_event ev = {.events = EPOLLIN};

    if (server_out == NULL || world_size == 0)
        return tern__error(TERN_ERR_INVALID_PARAM, "store server: %s",
                           server_out == NULL ? "server_out is NULL" : "world size is 0");
    s = calloc(1, sizeof(*s));
    if (s == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "store server: no memory");
    s->lfd = s->epfd = s->wakefd = -1;
    s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    s->log_rank = tern__log_rank();
    pthread_mutex_init(&s->lock, NULL);
    pthread_mutex_init(&s->serve_lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    s->kv = tern__kv_create(world_size);
    if (s->kv == NULL) {
        st = tern__error(TERN_ERR_NO_MEMORY, "store server: no memory for the table");
        goto fail;
    }
    st = tern__sock_listen(host, port, &s->lfd, &s->port);
    if (st != TERN_OK)
        goto fail;
    s->epfd = epoll_create1(EPOLL_CLOEXEC);
    s->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->epfd < 0 || s->wakefd < 0) {
        st = tern__error_errno(TERN_ERR_IO, errno, "store server: epoll/eventfd");
        goto fail;
    }
    ev.data.ptr = &listen_tag;
    if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->lfd, &ev) != 0) {
        st = tern__error_errno(TERN_ERR_IO, errno, "store server: epoll_ctl");
        goto fail;
    }
    ev.data.ptr = &wake_tag;
    if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->wakefd, &ev) != 0) {
        st = tern__error_errno(TERN_ERR_IO, errno, "store server: epoll_ctl");
        goto fail;
    }
    int rc = pthread_create(&s->thread, NULL, server_main, s);
    if (rc != 0) {
        st = tern__error_errno(TERN_ERR_NO_RESOURCE, rc, "store server: cannot start its thread");
        goto fail;
    }
    s->thread_started = true;
    tern_info("store: serving %u ranks on %s:%u", world_size, host && *host ? host : "*", s->port);
    *server_out = s;
    return TERN_OK;
fail:
    tern_store_server_stop(s, 0);
    return st;
}

unsigned tern_store_server_port(const tern_store_server_t *server)
{
    return server ? server->port : 0;
}

/* How long stop may still wait for the ranks to leave, at most 100 ms at a
 * time; 0 once they have, or when the deadline passed (*st then says so). */
static uint64_t stop_wait(const tern_store_server_t *s, uint64_t deadline, tern_status_t *st)
{
    if (s->members == 0)
        return 0;
    uint64_t now = tern_clock_ns();
    if (deadline == 0 || now >= deadline) {
        *st = tern__error(TERN_ERR_TIMEOUT, "store server: %u rank(s) still connected at shutdown",
                          s->members);
        return 0;
    }
    return deadline - now < 100000000 ? deadline - now : 100000000;
}

tern_status_t tern_store_server_stop(tern_store_server_t *s, int64_t timeout_ns)
{
    tern_status_t st = TERN_OK;
    if (s == NULL)
        return TERN_OK;
    uint64_t deadline = tern__deadline(timeout_ns), wait;
    if (s->thread_started) {
        pthread_mutex_lock(&s->lock);
        while ((wait = stop_wait(s, deadline, &st)) > 0) {
            struct timespec ts = tern__clock_realtime_after(wait);
            pthread_cond_timedwait(&s->cond, &s->lock, &ts);
        }
        thread_stop_locked(s);
    } else if (s->adopted) {
        /* Nobody else serves now: serve here until the others have left. */
        pthread_mutex_lock(&s->serve_lock);
        while ((wait = stop_wait(s, deadline, &st)) > 0) {
            int ms = (int)(wait / 1000000) + 1;
            if (!serve_batch(s, ms > 100 ? 100 : ms))
                break;
        }
        pthread_mutex_unlock(&s->serve_lock);
    }
    while (s->conns != NULL)
        conn_close(s, s->conns);
    if (s->lfd >= 0)
        close(s->lfd);
    if (s->epfd >= 0)
        close(s->epfd);
    if (s->wakefd >= 0)
        close(s->wakefd);
    if (s->spare_fd >= 0)
        close(s->spare_fd);
    tern__kv_destroy(s->kv);
    pthread_cond_destroy(&s->cond);
    pthread_mutex_destroy(&s->serve_lock);
    pthread_mutex_destroy(&s->lock);
    free(s);
    return st;
}
