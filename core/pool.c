/* The worker pool: a ring-buffer queue under one mutex, and threads placed by
 * core/topology.c. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tern/clock.h>

#include "core/error.h"
#include "core/log.h"
#include "core/topology.h"

#define INITIAL_CAPACITY 64
#define SPIN_NS (50 * 1000)

typedef struct task {
    tern_task_fn fn;
    void *arg;
} task_t;

typedef struct worker {
    tern_pool_t *pool;
    unsigned index;
    pthread_t thread;
} worker_t;

struct tern_pool {
    /* Set at create, read-only after, so read without the lock. */
    tern__pool_config_t cfg;
    hwloc_topology_t topo;
    tern__placement_t placement;
    worker_t *workers;
    unsigned nthreads;

    pthread_mutex_t lock;
    pthread_cond_t work_cv;    /* a task was queued, or the drain may be over */
    pthread_cond_t started_cv; /* a worker has started (create waits for all) */
    bool lock_inited, work_cv_inited, started_cv_inited;

    /* Under lock. */
    task_t *ring;
    size_t capacity, head, count;
    atomic_size_t queued; /* count, for workers that spin without the lock */
    unsigned running;     /* tasks executing now */
    unsigned started;     /* workers that have tried to bind and are serving */
    unsigned bind_failed; /* of those, how many could not bind */
    unsigned spawned;     /* threads created, so joined at teardown */
    bool closing;
};

/* Which pool's worker this thread is, if any: lets submit accept tasks from
 * draining tasks and lets destroy refuse to join its own thread. */
static _Thread_local const tern_pool_t *current_pool;

/* Doubles the ring when full, unwrapping it; called with the lock held. Only
 * the first time the queue reaches a new depth allocates. */
static tern_status_t ring_grow(tern_pool_t *pool, size_t *new_capacity)
{
    size_t cap = pool->capacity * 2;
    task_t *ring;

    if (pool->capacity > SIZE_MAX / 2 / sizeof(task_t))
        return TERN_ERR_NO_MEMORY;
    ring = malloc(cap * sizeof(task_t));
    if (ring == NULL)
        return TERN_ERR_NO_MEMORY;
    for (size_t i = 0; i < pool->count; i++)
        ring[i] = pool->ring[(pool->head + i) % pool->capacity];
    free(pool->ring);
    pool->ring = ring;
    pool->capacity = cap;
    pool->head = 0;
    *new_capacity = cap;
    return TERN_OK;
}

/* The drain is over when nothing is queued and no running task can queue more. */
static bool drained(const tern_pool_t *pool)
{
    return pool->closing && pool->count == 0 && pool->running == 0;
}

/* Run the task at the head of the queue (lock held, count > 0) outside the
 * lock; returns with the lock held again. */
static void run_front(tern_pool_t *pool)
{
    task_t t = pool->ring[pool->head];
    pool->head = (pool->head + 1) % pool->capacity;
    pool->count--;
    atomic_store_explicit(&pool->queued, pool->count, memory_order_relaxed);
    pool->running++;
    pthread_mutex_unlock(&pool->lock);

    t.fn(t.arg);

    pthread_mutex_lock(&pool->lock);
    pool->running--;
    /* The last task of a drain wakes the idle workers so they can exit. */
    if (drained(pool))
        pthread_cond_broadcast(&pool->work_cv);
}

/*
 * Before it sleeps, an idle worker watches the queue for SPIN_NS (lock
 * dropped, yielding the core to anyone else who wants it): a task that
 * follows the last one within that time (the next RPC of a caller in a loop)
 * starts without the 5-20 us of a futex wake-up.
 */
static void spin(tern_pool_t *pool)
{
    pthread_mutex_unlock(&pool->lock);
    uint64_t end = tern_clock_ns() + SPIN_NS;
    for (unsigned i = 1; atomic_load_explicit(&pool->queued, memory_order_relaxed) == 0; i++) {
        if (i % 16 == 0 && tern_clock_ns() > end)
            break;
        sched_yield();
    }
    pthread_mutex_lock(&pool->lock);
}

/*
 * A worker: binds itself before it takes any task, reports to pool_start(),
 * then runs tasks outside the lock until the drain is over.
 */
static void *worker_main(void *arg)
{
    worker_t *w = arg;
    tern_pool_t *pool = w->pool;
    bool bind_failed = false;
    char name[16];

    tern__log_set_rank(pool->cfg.log_rank);
    current_pool = pool;
    /* Names show in top -H, gdb and perf; a failure costs only that. */
    snprintf(name, sizeof(name), "tern-pool-%u", w->index);
    pthread_setname_np(pthread_self(), name);
    if (pool->cfg.bind) {
        hwloc_const_cpuset_t set = tern__placement_thread_set(&pool->placement, w->index);
        if (hwloc_set_cpubind(pool->topo, set, HWLOC_CPUBIND_THREAD) != 0) {
            int err = errno;
            char list[256];
            hwloc_bitmap_list_snprintf(list, sizeof(list), set);
            errno = err;
            tern_warn("pool thread %u: cannot bind to PUs %s: %m; it runs unbound", w->index, list);
            bind_failed = true;
        }
    }

    pthread_mutex_lock(&pool->lock);
    pool->started++;
    pool->bind_failed += bind_failed ? 1 : 0;
    pthread_cond_broadcast(&pool->started_cv);
    for (;;) {
        if (pool->count == 0 && !drained(pool))
            spin(pool);
        while (pool->count == 0 && !drained(pool))
            pthread_cond_wait(&pool->work_cv, &pool->lock);
        if (pool->count == 0)
            break;
        run_front(pool);
    }
    pthread_mutex_unlock(&pool->lock);
    return NULL;
}

/* Starts the drain and joins every spawned thread; blocks until the queue is
 * empty. Safe when no thread was spawned. Not from a worker. */
static void pool_stop(tern_pool_t *pool)
{
    unsigned spawned;

    if (!pool->lock_inited)
        return;
    pthread_mutex_lock(&pool->lock);
    pool->closing = true;
    pthread_cond_broadcast(&pool->work_cv);
    spawned = pool->spawned;
    pthread_mutex_unlock(&pool->lock);
    for (unsigned i = 0; i < spawned; i++)
        pthread_join(pool->workers[i].thread, NULL);
}

/* Frees everything; safe on a zeroed or half-built pool whose threads are
 * joined. */
static void pool_free(tern_pool_t *pool)
{
    if (pool == NULL)
        return;
    free(pool->ring);
    free(pool->workers);
    tern__placement_fini(&pool->placement);
    if (pool->topo != NULL)
        hwloc_topology_destroy(pool->topo);
    if (pool->started_cv_inited)
        pthread_cond_destroy(&pool->started_cv);
    if (pool->work_cv_inited)
        pthread_cond_destroy(&pool->work_cv);
    if (pool->lock_inited)
        pthread_mutex_destroy(&pool->lock);
    free(pool);
}

/* Creates the threads with asynchronous signals blocked, so the application's
 * handlers for them run on its own threads, and waits until each has tried to
 * bind. Faults stay unblocked: a blocked SIGSEGV kills the process without
 * running the handler (a crash reporter, ASan's) that would explain it. */
static tern_status_t pool_start(tern_pool_t *pool)
{
    static const int faults[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS};
    sigset_t blocked, old;
    tern_status_t st = TERN_OK;
    int err;

    sigfillset(&blocked);
    for (size_t i = 0; i < sizeof(faults) / sizeof(faults[0]); i++)
        sigdelset(&blocked, faults[i]);
    pthread_sigmask(SIG_SETMASK, &blocked, &old);
    for (unsigned i = 0; i < pool->nthreads; i++) {
        pool->workers[i] = (worker_t){.pool = pool, .index = i};
        err = pthread_create(&pool->workers[i].thread, NULL, worker_main, &pool->workers[i]);
        if (err != 0) {
            st = tern__error_errno(tern__status_from_errno(err), err,
                                   "pool: pthread_create for thread %u of %u", i, pool->nthreads);
            break;
        }
        pthread_mutex_lock(&pool->lock);
        pool->spawned++;
        pthread_mutex_unlock(&pool->lock);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (st != TERN_OK)
        return st;

    pthread_mutex_lock(&pool->lock);
    while (pool->started < pool->nthreads)
        pthread_cond_wait(&pool->started_cv, &pool->lock);
    tern__placement_summarize(&pool->placement, pool->cfg.bind && pool->bind_failed == 0);
    pthread_mutex_unlock(&pool->lock);
    return TERN_OK;
}

tern_status_t tern_pool_create(const tern_pool_params_t *params, tern_pool_t **pool_out)
{
    tern_pool_t *pool = NULL;
    tern_status_t st;
    int err;

    if (pool_out == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_pool_create: pool_out is NULL");
    *pool_out = NULL;
    pool = calloc(1, sizeof(*pool));
    if (pool == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "pool: cannot allocate the pool");
    st = tern__pool_config_resolve(params, &pool->cfg);
    if (st != TERN_OK)
        goto out_free;

    if ((err = pthread_mutex_init(&pool->lock, NULL)) != 0) {
        st = tern__error_errno(tern__status_from_errno(err), err, "pool: pthread_mutex_init");
        goto out_free;
    }
    pool->lock_inited = true;
    if ((err = pthread_cond_init(&pool->work_cv, NULL)) != 0) {
        st = tern__error_errno(tern__status_from_errno(err), err, "pool: pthread_cond_init");
        goto out_free;
    }
    pool->work_cv_inited = true;
    if ((err = pthread_cond_init(&pool->started_cv, NULL)) != 0) {
        st = tern__error_errno(tern__status_from_errno(err), err, "pool: pthread_cond_init");
        goto out_free;
    }
    pool->started_cv_inited = true;

    st = tern__topology_load(&pool->topo);
    if (st != TERN_OK)
        goto out_free;
    st = tern__placement_init(&pool->placement, pool->topo, &pool->cfg);
    if (st != TERN_OK)
        goto out_free;
    pool->nthreads = pool->placement.threads;
    /* The caller's string may not outlive this call; the binding keeps a copy. */
    pool->cfg.device = NULL;

    pool->capacity = INITIAL_CAPACITY;
    pool->ring = malloc(pool->capacity * sizeof(task_t));
    pool->workers = calloc(pool->nthreads, sizeof(worker_t));
    if (pool->ring == NULL || pool->workers == NULL) {
        st = tern__error(TERN_ERR_NO_MEMORY, "pool: cannot allocate the queue and %u workers",
                         pool->nthreads);
        goto out_free;
    }

    st = pool_start(pool);
    if (st != TERN_OK)
        goto out_stop;
    tern_info("pool: %s", pool->placement.binding.summary);
    *pool_out = pool;
    return TERN_OK;

out_stop:
    pool_stop(pool);
out_free:
    pool_free(pool);
    return st;
}

tern_status_t tern_pool_submit(tern_pool_t *pool, tern_task_fn fn, void *arg)
{
    size_t grown = 0;
    tern_status_t st = TERN_OK;

    if (pool == NULL || fn == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_pool_submit: %s is NULL",
                           pool == NULL ? "pool" : "fn");
    pthread_mutex_lock(&pool->lock);
    if (pool->closing && current_pool != pool) {
        st = TERN_ERR_CLOSED;
    } else if (pool->cfg.queue_limit != 0 && pool->count >= pool->cfg.queue_limit) {
        st = TERN_ERR_NO_RESOURCE;
    } else if (pool->count == pool->capacity) {
        st = ring_grow(pool, &grown);
    }
    if (st == TERN_OK) {
        pool->ring[(pool->head + pool->count) % pool->capacity] = (task_t){fn, arg};
        pool->count++;
        atomic_store_explicit(&pool->queued, pool->count, memory_order_relaxed);
        pthread_cond_signal(&pool->work_cv);
    }
    pthread_mutex_unlock(&pool->lock);

    /* Recorded outside the lock: a log sink may itself submit to this pool. */
    switch (st) {
    case TERN_OK:
        if (grown != 0)
            tern_debug("pool: queue grown to %zu tasks", grown);
        return TERN_OK;
    case TERN_ERR_CLOSED:
        return tern__error(st, "tern_pool_submit: the pool is being destroyed");
    case TERN_ERR_NO_RESOURCE:
        return tern__error(st, "tern_pool_submit: %zu tasks already queued (queue_limit)",
                           pool->cfg.queue_limit);
    default:
        return tern__error(st, "tern_pool_submit: cannot grow the queue");
    }
}

unsigned tern_pool_size(const tern_pool_t *pool)
{
    return pool != NULL ? pool->nthreads : 0;
}

int tern_pool_in_worker(const tern_pool_t *pool)
{
    return pool != NULL && current_pool == pool;
}

void tern_pool_binding(const tern_pool_t *pool, tern_pool_binding_t *binding)
{
    if (binding == NULL)
        return;
    if (pool == NULL) {
        memset(binding, 0, sizeof(*binding));
        return;
    }
    *binding = pool->placement.binding;
}

tern_status_t tern_pool_destroy(tern_pool_t *pool)
{
    if (pool == NULL)
        return TERN_OK;
    if (current_pool == pool)
        return tern__error(TERN_ERR_INVALID_PARAM,
                           "tern_pool_destroy: called from one of the pool's own threads, "
                           "which it would have to join");
    pool_stop(pool);
    pool_free(pool);
    return TERN_OK;
}

int tern__pool_closing(tern_pool_t *pool)
{
    int closing;

    pthread_mutex_lock(&pool->lock);
    closing = pool->closing;
    pthread_mutex_unlock(&pool->lock);
    return closing;
}

int tern__pool_run_one(tern_pool_t *pool)
{
    int ran = 0;

    if (pool == NULL || current_pool != pool)
        return 0;
    pthread_mutex_lock(&pool->lock);
    if (pool->count != 0) {
        run_front(pool);
        ran = 1;
    }
    pthread_mutex_unlock(&pool->lock);
    return ran;
}
