/*
 * tern-smoke: what `make demo` runs under `tern-run -n 4`. Each rank joins the
 * job, splits a sum over its worker pool, publishes its part in the store, and
 * rank 0 checks the total against the closed form. It exercises bootstrap, the
 * store and the pool end to end, and prints the binding each rank got.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tern/tern.h>

#define N 40000000ull /* sum of i*i for i in [0, N) */
#define CHUNKS 64

typedef struct job {
    uint64_t lo, hi;
    _Atomic uint64_t sum;    /* wraps mod 2^64, as does the reference */
    _Atomic unsigned left;
    pthread_mutex_t lock;
    pthread_cond_t done;
} job_t;

typedef struct chunk {
    job_t *job;
    uint64_t lo, hi;
} chunk_t;

static void sum_chunk(void *arg)
{
    chunk_t *c = arg;
    uint64_t s = 0;
    for (uint64_t i = c->lo; i < c->hi; i++)
        s += i * i;
    atomic_fetch_add(&c->job->sum, s);
    if (atomic_fetch_sub(&c->job->left, 1) == 1) {
        pthread_mutex_lock(&c->job->lock);
        pthread_cond_signal(&c->job->done);
        pthread_mutex_unlock(&c->job->lock);
    }
}

/* Sum of i*i over [0, n) mod 2^64, by the closed form n(n-1)(2n-1)/6 done in
 * 128-bit arithmetic. */
static uint64_t reference(uint64_t n)
{
    unsigned __int128 v = (unsigned __int128)n * (n - 1) * (2 * n - 1) / 6;
    return (uint64_t)v;
}

int main(void)
{
    tern_ctx_t *ctx;
    tern_status_t st;
    chunk_t chunks[CHUNKS];
    job_t job = {.lock = PTHREAD_MUTEX_INITIALIZER, .done = PTHREAD_COND_INITIALIZER};
    int rc = 1;

    if ((st = tern_init(NULL, &ctx)) != TERN_OK) {
        fprintf(stderr, "tern_init: %s: %s\n", tern_strerror(st), tern_last_error());
        return 1;
    }
    unsigned rank = tern_ctx_rank(ctx), world = tern_ctx_world_size(ctx);
    tern_pool_binding_t b;
    tern_pool_binding(tern_ctx_pool(ctx), &b);
    printf("rank %u/%u (local %u/%u, via %s): pool %s\n", rank, world, tern_ctx_local_rank(ctx),
           tern_ctx_local_world_size(ctx), tern_ctx_launcher(ctx), b.summary);

    uint64_t t0 = tern_clock_ns();
    job.lo = N / world * rank;
    job.hi = rank == world - 1 ? N : N / world * (rank + 1);
    atomic_store(&job.left, CHUNKS);
    for (unsigned i = 0; i < CHUNKS; i++) {
        uint64_t span = job.hi - job.lo;
        chunks[i] = (chunk_t){&job, job.lo + span * i / CHUNKS, job.lo + span * (i + 1) / CHUNKS};
        if ((st = tern_pool_submit(tern_ctx_pool(ctx), sum_chunk, &chunks[i])) != TERN_OK) {
            fprintf(stderr, "submit: %s\n", tern_last_error());
            /* The chunks never submitted will never count down. */
            atomic_fetch_sub(&job.left, CHUNKS - i);
            goto out;
        }
    }
    pthread_mutex_lock(&job.lock);
    while (atomic_load(&job.left) != 0)
        pthread_cond_wait(&job.done, &job.lock);
    pthread_mutex_unlock(&job.lock);
    uint64_t dt = tern_clock_ns() - t0;

    char key[32], val[32];
    snprintf(key, sizeof(key), "part/%u", rank);
    snprintf(val, sizeof(val), "%" PRIu64, atomic_load(&job.sum));
    if (tern_store_set(tern_ctx_store(ctx), key, val, strlen(val)) != TERN_OK) {
        fprintf(stderr, "store set: %s\n", tern_last_error());
        goto out;
    }
    printf("rank %u: summed [%" PRIu64 ", %" PRIu64 ") on %u threads in %.1f ms\n", rank, job.lo,
           job.hi, tern_pool_size(tern_ctx_pool(ctx)), dt / 1e6);
    if (rank == 0) {
        uint64_t total = 0;
        for (unsigned r = 0; r < world; r++) {
            void *v;
            snprintf(key, sizeof(key), "part/%u", r);
            if (tern_store_get(tern_ctx_store(ctx), key, &v, NULL, TERN_TIMEOUT_DEFAULT) != TERN_OK) {
                fprintf(stderr, "store get: %s\n", tern_last_error());
                goto out;
            }
            total += strtoull(v, NULL, 10);
            free(v);
        }
        int ok = total == reference(N);
        printf("rank 0: total %" PRIu64 " from %u ranks: %s\n", total, world,
               ok ? "matches the closed form" : "WRONG");
        if (!ok)
            goto out;
    }
    rc = 0;
out:
    pthread_mutex_lock(&job.lock);
    while (atomic_load(&job.left) != 0)
        pthread_cond_wait(&job.done, &job.lock);
    pthread_mutex_unlock(&job.lock);
    if (tern_finalize(ctx) != TERN_OK) {
        fprintf(stderr, "tern_finalize: %s\n", tern_last_error());
        rc = 1;
    }
    return rc;
}
