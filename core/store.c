/*
 * Store clients: a TCP connection to the rank-0 server, or an in-process table
 * shared by threads. Both serve the same API; tern_store_barrier() is built on
 * add and wait and works over either.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <tern/clock.h>

#include "core/error.h"
#include "core/kv.h"
#include "core/log.h"
#include "core/sock.h"
#include "core/store.h"
#include "core/store_proto.h"

/* How long past a server-side timeout the client waits for the server to say so,
 * before deciding the server itself is gone. */
#define REPLY_GRACE_NS (10ll * 1000 * 1000 * 1000)

struct tern_store {
    pthread_mutex_t lock; /* serializes requests (TCP) or guards kv (memory) */
    int64_t timeout_ns;
    /* TCP client */
    int fd;
    tern_status_t failed; /* sticky: the stream is unusable after an I/O error */
    char failed_detail[TERN__ERROR_MAX];
    char where[300];
    /* what a further connection (tern__store_connect_aux) needs */
    char host[256];
    unsigned port, rank, world_size;
    int64_t connect_timeout_ns;
    /* memory store */
    tern__kv_t *kv;
    pthread_cond_t cond;
    /* this process serves the store it is a client of (rank 0) */
    tern__sock_assist_t assist;
    bool assisted;
};

static tern_status_t check_key(const char *key)
{
    size_t len;
    if (key == NULL || (len = strlen(key)) == 0)
        return tern__error(TERN_ERR_INVALID_PARAM, "store: key is NULL or empty");
    if (len > TERN_STORE_KEY_MAX)
        return tern__error(TERN_ERR_INVALID_PARAM, "store: key of %zu bytes exceeds %u", len,
                           TERN_STORE_KEY_MAX);
    return TERN_OK;
}

static tern_status_t resolve_timeout(const tern_store_t *store, int64_t timeout_ns, int64_t *out)
{
    if (timeout_ns == TERN_TIMEOUT_DEFAULT)
        timeout_ns = store->timeout_ns;
    if (timeout_ns < 0)
        return tern__error(TERN_ERR_INVALID_PARAM, "store: negative timeout %" PRId64, timeout_ns);
    *out = timeout_ns;
    return TERN_OK;
}

static tern_store_t *store_alloc(int64_t timeout_ns)
{
    tern_store_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->fd = -1;
    s->timeout_ns = timeout_ns < 0 ? 300ll * 1000 * 1000 * 1000 : timeout_ns;
    pthread_mutex_init(&s->lock, NULL);
    return s;
}

/* ---- TCP client ---- */

/*
 * One request/response exchange. Takes the lock. On a server-side error the
 * server's detail becomes this thread's tern_last_error(). *body_out (if not
 * NULL) receives a malloc'ed, NUL-terminated copy of the response body.
 */
/* A key as an error shows it: keys run to 4096 bytes, the error's detail to
 * 511, and a long key in front left no room for the reason. */
#define KEY_SHOWN 96
static const char *key_shown(const char *key, char buf[KEY_SHOWN])
{
    size_t len = strlen(key);
    if (len <= 64)
        return key;
    snprintf(buf, KEY_SHOWN, "%.48s... (%zu bytes)", key, len);
    return buf;
}

static pthread_once_t job_once = PTHREAD_ONCE_INIT;
static char job_key[160];

static void job_init(void)
{
    const char *id = getenv("TERN_JOB_ID");
    const char *slurm = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
    if (id == NULL || *id == '\0')
        id = getenv("TORCHELASTIC_RUN_ID");
    if (id == NULL || *id == '\0')
        id = getenv("PMIX_NAMESPACE");
    if ((id == NULL || *id == '\0') && slurm != NULL && *slurm != '\0') {
        snprintf(job_key, sizeof(job_key), "job:slurm %.64s.%.32s", slurm, step ? step : "");
        return;
    }
    snprintf(job_key, sizeof(job_key), "job:%.150s", id ? id : "");
}

const char *tern__store_job(void)
{
    pthread_once(&job_once, job_init);
    return job_key;
}

static tern_status_t tcp_request(tern_store_t *s, uint8_t op, const char *const *keys,
                                 unsigned nkeys, const void *value, size_t vlen, int64_t arg,
                                 uint64_t deadline, int64_t *value_out, void **body_out,
                                 size_t *body_len)
{
    uint8_t hdr[TERN__STORE_HDR_SIZE], rhdr[TERN__STORE_HDR_SIZE];
    uint8_t lens[TERN__STORE_MAX_KEYS][4];
    struct iovec iov[2 + 2 * TERN__STORE_MAX_KEYS];
    int iovcnt = 0;
    size_t body = vlen;
    char *rbody = NULL;
    tern_status_t st;

    iov[iovcnt++] = (struct iovec){hdr, sizeof(hdr)};
    for (unsigned i = 0; i < nkeys; i++) {
        size_t klen = strlen(keys[i]);
        tern__put_be32(lens[i], (uint32_t)klen);
        iov[iovcnt++] = (struct iovec){lens[i], 4};
        iov[iovcnt++] = (struct iovec){(void *)keys[i], klen};
        body += 4 + klen;
    }
    if (vlen > 0)
        iov[iovcnt++] = (struct iovec){(void *)value, vlen};
    tern__put_be32(hdr, TERN__STORE_MAGIC);
    hdr[4] = op;
    hdr[5] = TERN__STORE_VERSION;
    hdr[6] = (uint8_t)(nkeys >> 8);
    hdr[7] = (uint8_t)nkeys;
    tern__put_be32(hdr + 8, (uint32_t)body);
    tern__put_be32(hdr + 12, 0);
    tern__put_be64(hdr + 16, (uint64_t)arg);

    pthread_mutex_lock(&s->lock);
    if (s->failed != TERN_OK) {
        st = tern__error(s->failed, "store connection to %s failed earlier: %s", s->where,
                         s->failed_detail);
        goto out;
    }
    const tern__sock_assist_t *assist = s->assisted ? &s->assist : NULL;
    st = tern__sock_writev_all(s->fd, iov, iovcnt, deadline, assist);
    if (st == TERN_OK)
        st = tern__sock_read_all(s->fd, rhdr, sizeof(rhdr), deadline, assist);
    if (st != TERN_OK)
        goto broken;
    uint32_t rlen = tern__get_be32(rhdr + 8);
    if (tern__get_be32(rhdr) != TERN__STORE_MAGIC || rlen > TERN__STORE_BODY_MAX) {
        st = tern__error(TERN_ERR_PROTOCOL, "store: malformed reply from %s", s->where);
        goto broken;
    }
    rbody = malloc((size_t)rlen + 1);
    if (rbody == NULL) {
        st = tern__error(TERN_ERR_NO_MEMORY, "store: no memory for a %u-byte reply", rlen);
        goto broken;
    }
    st = tern__sock_read_all(s->fd, rbody, rlen, deadline, assist);
    if (st != TERN_OK)
        goto broken;
    rbody[rlen] = '\0';
    st = tern__status_from_wire((int32_t)tern__get_be32(rhdr + 4));
    if (st != TERN_OK) {
        tern__error(st, "%s", rbody);
        goto out;
    }
    if (value_out != NULL)
        *value_out = (int64_t)tern__get_be64(rhdr + 16);
    if (body_out != NULL) {
        *body_out = rbody;
        *body_len = rlen;
        rbody = NULL;
    }
    goto out;
broken:
    /* A half-read reply leaves the stream out of step: refuse further use. */
    s->failed = st;
    snprintf(s->failed_detail, sizeof(s->failed_detail), "%s", tern_last_error());
out:
    pthread_mutex_unlock(&s->lock);
    free(rbody);
    return st;
}

/* Connect and say hello (op: HELLO, or HELLO_AUX for a further connection). */
static tern_status_t store_connect(const char *host, unsigned port, unsigned rank,
                                   unsigned world_size, uint8_t op, int64_t connect_timeout_ns,
                                   int64_t timeout_ns, tern_store_t **store_out)
{
    tern_store_t *s;
    tern_status_t st;
    uint64_t deadline;

    if (host == NULL || store_out == NULL || port == 0 || port > 65535 || world_size == 0 ||
        rank >= world_size || connect_timeout_ns < 0 || strlen(host) >= sizeof(s->host))
        return tern__error(TERN_ERR_INVALID_PARAM,
                           "store connect: bad arguments (host %s, port %u, rank %u of %u)",
                           host ? host : "NULL", port, rank, world_size);
    s = store_alloc(timeout_ns);
    if (s == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "store: no memory");
    snprintf(s->where, sizeof(s->where), "%s:%u", host, port);
    snprintf(s->host, sizeof(s->host), "%s", host);
    s->port = port;
    s->rank = rank;
    s->world_size = world_size;
    s->connect_timeout_ns = connect_timeout_ns;
    deadline = tern__deadline(connect_timeout_ns);
    st = tern__sock_connect(host, port, deadline, &s->fd);
    if (st != TERN_OK)
        goto fail;
    /* HELLO gets the whole connect timeout: rank 0 may still be starting. */
    const char *job[1] = {tern__store_job()};
    st = tcp_request(s, op, job, 1, NULL, 0, (int64_t)((uint64_t)rank << 32 | world_size), deadline,
                     NULL, NULL, NULL);
    if (st != TERN_OK)
        goto fail;
    *store_out = s;
    return TERN_OK;
fail:
    tern_store_close(s);
    return st;
}

tern_status_t tern_store_connect(const char *host, unsigned port, unsigned rank,
                                 unsigned world_size, int64_t connect_timeout_ns,
                                 int64_t timeout_ns, tern_store_t **store_out)
{
    return store_connect(host, port, rank, world_size, TERN__STORE_HELLO, connect_timeout_ns,
                         timeout_ns, store_out);
}

tern_status_t tern__store_connect_aux(tern_store_t *store, tern_store_t **aux_out)
{
    if (store == NULL || aux_out == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "store: connect_aux: NULL argument");
    *aux_out = NULL;
    if (store->kv != NULL)
        return TERN_OK;
    return store_connect(store->host, store->port, store->rank, store->world_size,
                         TERN__STORE_HELLO_AUX, store->connect_timeout_ns, store->timeout_ns,
                         aux_out);
}

/* ---- memory store ---- */

static void assist_serve(void *arg)
{
    tern__store_server_serve(arg);
}

void tern__store_assist(tern_store_t *store, tern_store_server_t *server)
{
    int fd;
    if (store == NULL || server == NULL || store->fd < 0 ||
        tern__store_server_adopt(server, &fd) != TERN_OK)
        return;
    pthread_mutex_lock(&store->lock);
    store->assist = (tern__sock_assist_t){.fd = fd, .run = assist_serve, .arg = server};
    store->assisted = true;
    pthread_mutex_unlock(&store->lock);
}

tern_status_t tern_store_memory_create(unsigned world_size, int64_t timeout_ns,
                                       tern_store_t **store_out)
{
    tern_store_t *s;
    pthread_condattr_t attr;

    if (store_out == NULL || world_size == 0)
        return tern__error(TERN_ERR_INVALID_PARAM, "memory store: bad arguments");
    s = store_alloc(timeout_ns);
    if (s == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "store: no memory");
    s->kv = tern__kv_create(world_size);
    if (s->kv == NULL) {
        free(s);
        return tern__error(TERN_ERR_NO_MEMORY, "store: no memory");
    }
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cond, &attr);
    pthread_condattr_destroy(&attr);
    snprintf(s->where, sizeof(s->where), "memory");
    *store_out = s;
    return TERN_OK;
}

/*
 * With the memory store's lock held, wait until every key exists or timeout_ns
 * passes (TERN_ERR_TIMEOUT naming the first missing key, in the words the TCP
 * server uses). The lock is released while waiting.
 */
static tern_status_t mem_wait_keys(tern_store_t *s, const char *const *keys, size_t nkeys,
                                   int64_t timeout_ns, const char *what)
{
    uint64_t deadline = tern__deadline(timeout_ns);
    struct timespec ts = {(time_t)(deadline / 1000000000u), (long)(deadline % 1000000000u)};

    for (;;) {
        size_t i;
        for (i = 0; i < nkeys; i++)
            if (tern__kv_peek(s->kv, keys[i], NULL) == NULL)
                break;
        if (i == nkeys)
            return TERN_OK;
        if (tern_clock_ns() >= deadline) {
            char shown[KEY_SHOWN];
            if (nkeys == 1)
                return tern__error(TERN_ERR_TIMEOUT,
                                   "store: %s('%s') timed out after %" PRId64 " ms", what,
                                   key_shown(keys[i], shown), timeout_ns / 1000000);
            return tern__error(TERN_ERR_TIMEOUT,
                               "store: %s timed out after %" PRId64 " ms; '%s' never set", what,
                               timeout_ns / 1000000, key_shown(keys[i], shown));
        }
        pthread_cond_timedwait(&s->cond, &s->lock, &ts);
    }
}

tern_status_t tern__store_join(tern_store_t *store, unsigned rank, unsigned world_size)
{
    tern_status_t st = TERN_OK;
    if (store->kv != NULL) {
        pthread_mutex_lock(&store->lock);
        st = tern__kv_join(store->kv, rank, world_size);
        pthread_mutex_unlock(&store->lock);
    }
    return st;
}

void tern__store_leave(tern_store_t *store, unsigned rank)
{
    if (store->kv != NULL) {
        pthread_mutex_lock(&store->lock);
        tern__kv_leave(store->kv, rank);
        pthread_mutex_unlock(&store->lock);
    }
}

/* ---- the API ---- */

void tern_store_close(tern_store_t *store)
{
    if (store == NULL)
        return;
    if (store->fd >= 0)
        close(store->fd);
    if (store->kv != NULL) {
        tern__kv_destroy(store->kv);
        pthread_cond_destroy(&store->cond);
    }
    pthread_mutex_destroy(&store->lock);
    free(store);
}

tern_status_t tern_store_set(tern_store_t *store, const char *key, const void *value, size_t len)
{
    tern_status_t st;
    if (store == NULL || (value == NULL && len > 0))
        return tern__error(TERN_ERR_INVALID_PARAM, "store set: NULL store or value");
    if ((st = check_key(key)) != TERN_OK)
        return st;
    char shown[KEY_SHOWN];
    if (len > TERN_STORE_VALUE_MAX)
        return tern__error(TERN_ERR_INVALID_PARAM,
                           "store set: a value of %zu bytes exceeds %u (key '%s')", len,
                           TERN_STORE_VALUE_MAX, key_shown(key, shown));
    if (store->kv == NULL)
        return tcp_request(store, TERN__STORE_SET, &key, 1, value, len, 0,
                           tern__deadline(store->timeout_ns), NULL, NULL, NULL);
    pthread_mutex_lock(&store->lock);
    st = tern__kv_set(store->kv, key, value, len);
    pthread_cond_broadcast(&store->cond);
    pthread_mutex_unlock(&store->lock);
    return st;
}

tern_status_t tern_store_get(tern_store_t *store, const char *key, void **value, size_t *len,
                             int64_t timeout_ns)
{
    tern_status_t st;
    int64_t t = 0;
    if (store == NULL || value == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "store get: NULL store or value");
    if ((st = check_key(key)) != TERN_OK || (st = resolve_timeout(store, timeout_ns, &t)) != TERN_OK)
        return st;
    if (store->kv == NULL) {
        size_t n;
        st = tcp_request(store, TERN__STORE_GET, &key, 1, NULL, 0, t,
                         tern__deadline(t + REPLY_GRACE_NS), NULL, value, &n);
        if (st == TERN_OK && len != NULL)
            *len = n;
        return st;
    }
    const char *keys[1] = {key};
    pthread_mutex_lock(&store->lock);
    st = mem_wait_keys(store, keys, 1, t, "get");
    if (st == TERN_OK) {
        size_t n;
        const void *v = tern__kv_peek(store->kv, key, &n);
        st = tern__kv_copy(v, n, value, len);
    }
    pthread_mutex_unlock(&store->lock);
    return st;
}

tern_status_t tern_store_add(tern_store_t *store, const char *key, int64_t delta, int64_t *result)
{
    tern_status_t st;
    if (store == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "store add: NULL store");
    if ((st = check_key(key)) != TERN_OK)
        return st;
    if (store->kv == NULL)
        return tcp_request(store, TERN__STORE_ADD, &key, 1, NULL, 0, delta,
                           tern__deadline(store->timeout_ns), result, NULL, NULL);
    pthread_mutex_lock(&store->lock);
    st = tern__kv_add(store->kv, key, delta, result);
    pthread_cond_broadcast(&store->cond);
    pthread_mutex_unlock(&store->lock);
    return st;
}

tern_status_t tern_store_wait(tern_store_t *store, const char *const *keys, size_t nkeys,
                              int64_t timeout_ns)
{
    tern_status_t st;
    int64_t t = 0;
    if (store == NULL || keys == NULL || nkeys == 0 || nkeys > TERN__STORE_MAX_KEYS)
        return tern__error(TERN_ERR_INVALID_PARAM, "store wait: need 1 to %u keys, got %zu",
                           TERN__STORE_MAX_KEYS, nkeys);
    for (size_t i = 0; i < nkeys; i++)
        if ((st = check_key(keys[i])) != TERN_OK)
            return st;
    if ((st = resolve_timeout(store, timeout_ns, &t)) != TERN_OK)
        return st;
    if (store->kv == NULL)
        return tcp_request(store, TERN__STORE_WAIT, keys, (unsigned)nkeys, NULL, 0, t,
                           tern__deadline(t + REPLY_GRACE_NS), NULL, NULL, NULL);
    pthread_mutex_lock(&store->lock);
    st = mem_wait_keys(store, keys, nkeys, t, "wait");
    pthread_mutex_unlock(&store->lock);
    return st;
}

tern_status_t tern_store_check(tern_store_t *store, const char *key, int *exists)
{
    tern_status_t st;
    int64_t v = 0;
    if (store == NULL || exists == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "store check: NULL argument");
    if ((st = check_key(key)) != TERN_OK)
        return st;
    if (store->kv == NULL) {
        st = tcp_request(store, TERN__STORE_CHECK, &key, 1, NULL, 0, 0,
                         tern__deadline(store->timeout_ns), &v, NULL, NULL);
        if (st == TERN_OK)
            *exists = v != 0;
        return st;
    }
    pthread_mutex_lock(&store->lock);
    *exists = tern__kv_peek(store->kv, key, NULL) != NULL;
    pthread_mutex_unlock(&store->lock);
    return TERN_OK;
}

tern_status_t tern_store_barrier(tern_store_t *store, const char *name, unsigned nranks,
                                 int64_t timeout_ns)
{
    char arrive[TERN_STORE_KEY_MAX + 1], done[TERN_STORE_KEY_MAX + 1];
    const char *keys[1] = {done};
    int64_t n = 0, t = 0;
    tern_status_t st;

    if (store == NULL || name == NULL || nranks == 0)
        return tern__error(TERN_ERR_INVALID_PARAM, "store barrier: bad arguments");
    if ((st = resolve_timeout(store, timeout_ns, &t)) != TERN_OK)
        return st;
    if (snprintf(arrive, sizeof(arrive), "barrier/%s/arrived", name) >= (int)sizeof(arrive))
        return tern__error(TERN_ERR_INVALID_PARAM, "store barrier: name too long");
    /* The arrival count numbers the barrier's generations, so the same name can
     * be reused: arrivals nranks*g+1 .. nranks*(g+1) belong to generation g. */
    if ((st = tern_store_add(store, arrive, 1, &n)) != TERN_OK)
        return st;
    int64_t gen = (n - 1) / nranks;
    if (snprintf(done, sizeof(done), "barrier/%s/done/%" PRId64, name, gen) >= (int)sizeof(done))
        return tern__error(TERN_ERR_INVALID_PARAM, "store barrier: name too long");
    if (n % nranks == 0 && (st = tern_store_set(store, done, "1", 1)) != TERN_OK)
        return st;
    st = tern_store_wait(store, keys, 1, t);
    if (st == TERN_ERR_TIMEOUT)
        return tern__error(st, "store barrier '%s' timed out after %" PRId64
                           " ms: %" PRId64 " of %u ranks had arrived when this rank did",
                           name, t / 1000000, n - gen * nranks, nranks);
    return st;
}
