/*
 * Recording: the session flag, per-thread event buffers, ranges, operations
 * that end on another thread, the captures of profiled RPC handlers and their
 * wire form, and the receiving end of the clock ping-pong. This part sits
 * below p2p (which records into it); session.c, above rpc, starts and stops
 * sessions and builds the results.
 *
 * A thread's buffer is a table of fixed chunks: the owner appends and then
 * publishes the count (release); the reader at stop reads up to the count
 * (acquire). Chunks never move, so no lock is taken on the recording path.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <cpuid.h>
#include <x86intrin.h>
#endif

#include <tern/clock.h>
#include <tern/tensor.h>

#include "core/bytes.h"
#include "core/config.h"
#include "core/log.h"
#include "prof/record.h"

atomic_int tern__prof_on;
_Thread_local tern__prof_capture_t *tern__prof_tl_capture;

/* The running session's settings, written by start before it sets the flag. */
tern__prof_session_t tern__prof_session;

static _Thread_local tern__prof_buf_t *tl_buf;
static _Thread_local uint64_t tl_tid;
static _Thread_local int64_t tl_mem; /* bytes tern allocated on this thread */

static pthread_mutex_t bufs_lock = PTHREAD_MUTEX_INITIALIZER;
static tern__prof_buf_t *bufs; /* every thread's, guarded by bufs_lock */
static pthread_key_t buf_key;
static pthread_once_t buf_once = PTHREAD_ONCE_INIT;

static atomic_uint_fast64_t next_id = 1;

/* ---- clock ---- */

static pthread_once_t skew_once = PTHREAD_ONCE_INIT;
static int64_t skew_ns;
/* Session buffers hold counter ticks (below); false: they hold ns. */
static bool use_counter;

static bool counter_usable(void);

static void load_skew(void)
{
    tern__config_t cfg;
    /* A bad environment fails tern_init with the detail; here it means no skew. */
    if (tern__config_load(&cfg) == TERN_OK)
        skew_ns = cfg.clock_skew_ns;
    use_counter = counter_usable();
}

int64_t tern_prof_clock_ns(void)
{
    pthread_once(&skew_once, load_skew);
    return (int64_t)tern_clock_ns() + skew_ns;
}

/* The profiler clock in ns, for what leaves a session buffer as it is
 * (captures, replies): the skew is loaded by tern_prof_start and
 * tern__prof_capture_new. */
static inline int64_t now(void)
{
    return (int64_t)tern_clock_ns() + skew_ns;
}

/*
 * Records in session buffers hold ticks of the CPU's counter instead:
 * clock_gettime costs more than the rest of a range (docs/perf.md, Profiler),
 * reading the counter about half of it. Stop turns ticks into ns along the line
 * through the calibration points of start and stop (tern__prof_calibrate); a
 * slew of CLOCK_MONOTONIC in between is not followed (docs/profiler.md, Costs).
 * The counter must tick at one rate whatever the core's frequency or sleep
 * state, and agree across cores: on x86-64 an invariant TSC that the kernel
 * also keeps time with, on aarch64 the generic timer (so by the architecture).
 * Elsewhere ticks are ns. The read is not ordered with the code around it
 * (no fence: that costs as much as it saves), so a thread's reads may come
 * out of order by a few ticks, or differ by the cores' skew after a
 * migration; buf_tick makes each thread's sequence monotonic, which is what
 * nesting needs.
 */
#if defined(__x86_64__)
static inline int64_t counter(void)
{
    return (int64_t)__rdtsc();
}

static bool counter_usable(void)
{
    unsigned a, b, c, d;
    /* CPUID 0x80000007 EDX bit 8: invariant TSC (constant rate, runs in
     * every sleep state). __get_cpuid_max is unsigned in GCC's cpuid.h, int
     * in clang's. */
    if ((unsigned)__get_cpuid_max(0x80000000u, NULL) < 0x80000007u)
        return false;
    __cpuid(0x80000007u, a, b, c, d);
    if (!(d & (1u << 8)))
        return false;
    /* The kernel stops keeping time with the TSC when it finds the cores'
     * counters apart or unstable; then so do we. Without sysfs, trust CPUID. */
    FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
    if (f == NULL)
        return true;
    char src[32] = "";
    bool tsc = fgets(src, sizeof(src), f) != NULL && strncmp(src, "tsc", 3) == 0 &&
               (src[3] == '\n' || src[3] == '\0');
    fclose(f);
    return tsc;
}
#elif defined(__aarch64__)
static inline int64_t counter(void)
{
    uint64_t v;
    __asm__ volatile("mrs %0, cntvct_el0" : "=r"(v));
    return (int64_t)v;
}

static bool counter_usable(void)
{
    return true;
}
#else
static inline int64_t counter(void)
{
    return 0;
}

static bool counter_usable(void)
{
    return false;
}
#endif

/* A time for a record in a session buffer: ticks, or ns without a counter. */
static inline int64_t ticks(void)
{
    return use_counter ? counter() : now();
}

/* t, made no earlier than b's last time: each thread's times are monotonic
 * (b is the calling thread's own). */
static inline int64_t buf_tick(tern__prof_buf_t *b, int64_t t)
{
    if (t < b->last_tick)
        return b->last_tick;
    b->last_tick = t;
    return t;
}

/* Tries per calibration point: the one read fastest is kept. */
#define CAL_TRIES 8

void tern__prof_calibrate(tern__prof_cal_t *c)
{
    pthread_once(&skew_once, load_skew);
    if (!use_counter) {
        c->ticks = c->ns = now();
        c->span = 0;
        return;
    }
    c->span = INT64_MAX;
    for (int i = 0; i < CAL_TRIES; i++) {
        int64_t t0 = counter(), ns = now(), t1 = counter();
        /* A negative span is a migration between cores out of step: skip it. */
        if (t1 >= t0 && t1 - t0 < c->span) {
            c->ticks = t0 + (t1 - t0) / 2;
            c->ns = ns;
            c->span = t1 - t0;
        }
    }
    if (c->span == INT64_MAX) {
        c->ticks = counter();
        c->ns = now();
        c->span = 0;
    }
}

void tern__prof_line(tern__prof_line_t *l, const tern__prof_cal_t *a, const tern__prof_cal_t *b)
{
    l->ticks = a->ticks;
    l->ns = a->ns;
    if (!use_counter)
        l->ns_per_tick = 1.0; /* ticks are ns: exact */
    else if (b->ticks > a->ticks && b->ns >= a->ns)
        l->ns_per_tick = (double)(b->ns - a->ns) / (double)(b->ticks - a->ticks);
    else
        l->ns_per_tick = 0; /* a counter that did not advance: every time at a */
}

int64_t tern__prof_line_ns(const tern__prof_line_t *l, int64_t t)
{
    /* Rounded half away from zero, which keeps the order of ticks (equal
     * ticks may become equal ns, never reversed ones). */
    double x = (double)(t - l->ticks) * l->ns_per_tick;
    return l->ns + (int64_t)(x < 0 ? x - 0.5 : x + 0.5);
}

void tern__prof_load_skew(void)
{
    pthread_once(&skew_once, load_skew);
}

uint64_t tern__prof_tid(void)
{
    if (tl_tid == 0)
        tl_tid = (uint64_t)syscall(SYS_gettid);
    return tl_tid;
}

/* Unique across the job: events of several nodes meet in one result, and
 * a remote event names its parent by id. */
uint64_t tern__prof_new_id(void)
{
    uint64_t node = (uint64_t)(tern__prof_session_node() + 1);
    return node << 40 | atomic_fetch_add_explicit(&next_id, 1, memory_order_relaxed);
}

/* ---- records ---- */

void tern__prof_rec_set_name(tern__prof_rec_t *r, const char *name)
{
    size_t n = strlen(name);
    if (n < sizeof(r->name.inl)) {
        memcpy(r->name.inl, name, n + 1);
        r->flags &= ~(uint16_t)TERN__REC_NAME_HEAP;
        return;
    }
    char *h = malloc(n + 1);
    if (h == NULL) {
        /* Keep what fits, and say so in the name itself. */
        memcpy(r->name.inl, name, sizeof(r->name.inl) - 4);
        memcpy(r->name.inl + sizeof(r->name.inl) - 4, "...", 4);
        r->flags &= ~(uint16_t)TERN__REC_NAME_HEAP;
        return;
    }
    memcpy(h, name, n + 1);
    r->name.heap = h;
    r->flags |= TERN__REC_NAME_HEAP;
}

const char *tern__prof_rec_name(const tern__prof_rec_t *r)
{
    return (r->flags & TERN__REC_NAME_HEAP) ? r->name.heap : r->name.inl;
}

void tern__prof_rec_clear(tern__prof_rec_t *r)
{
    if (r->flags & TERN__REC_NAME_HEAP)
        free(r->name.heap);
    free(r->shapes);
    r->flags = 0;
    r->shapes = NULL;
}

/* ---- per-thread buffers ---- */

static void buf_release(void *arg)
{
    tern__prof_buf_t *b = arg;
    /* The thread is gone; its events stay for the reader, which frees the
     * buffer at the next start. */
    pthread_mutex_lock(&bufs_lock);
    b->orphan = true;
    pthread_mutex_unlock(&bufs_lock);
}

static void buf_key_init(void)
{
    pthread_key_create(&buf_key, buf_release);
}

/* buf_get's first time on a thread, or in a session. */
static __attribute__((noinline)) tern__prof_buf_t *buf_get_slow(tern__prof_buf_t *b, unsigned gen)
{
    if (b == NULL) {
        pthread_once(&buf_once, buf_key_init);
        b = calloc(1, sizeof(*b));
        if (b == NULL)
            return NULL;
        b->tid = tern__prof_tid();
        pthread_mutex_lock(&bufs_lock);
        b->next = bufs;
        bufs = b;
        pthread_mutex_unlock(&bufs_lock);
        pthread_setspecific(buf_key, b);
        tl_buf = b;
    }
    /* A new session: what this thread recorded before was read at stop (or
     * dropped at start). */
    pthread_mutex_lock(&bufs_lock);
    tern__prof_buf_reset(b);
    b->gen = gen;
    pthread_mutex_unlock(&bufs_lock);
    return b;
}

/* This thread's buffer for the running session, or NULL (no memory). */
static inline tern__prof_buf_t *buf_get(void)
{
    tern__prof_buf_t *b = tl_buf;
    unsigned gen = atomic_load_explicit(&tern__prof_session.gen, memory_order_relaxed);
    if (b != NULL && b->gen == gen)
        return b;
    return buf_get_slow(b, gen);
}

void tern__prof_buf_reset(tern__prof_buf_t *b)
{
    size_t n = atomic_load_explicit(&b->count, memory_order_acquire);
    for (size_t i = 0; i < n; i++)
        tern__prof_rec_clear(tern__prof_buf_at(b, i));
    atomic_store_explicit(&b->count, 0, memory_order_release);
    atomic_store_explicit(&b->dropped, 0, memory_order_relaxed);
}

tern__prof_rec_t *tern__prof_buf_at(tern__prof_buf_t *b, size_t i)
{
    return &b->chunks[i / TERN__PROF_CHUNK][i % TERN__PROF_CHUNK];
}

/* buf_append where chunk c is not there yet. */
static __attribute__((noinline)) tern__prof_rec_t *buf_append_slow(tern__prof_buf_t *b, size_t c)
{
    if (c >= TERN__PROF_CHUNKS) {
        atomic_fetch_add_explicit(&b->dropped, 1, memory_order_relaxed);
        return NULL;
    }
    tern__prof_rec_t *chunk = calloc(TERN__PROF_CHUNK, sizeof(*chunk));
    if (chunk == NULL) {
        atomic_fetch_add_explicit(&b->dropped, 1, memory_order_relaxed);
        return NULL;
    }
    b->chunks[c] = chunk;
    return chunk;
}

/* A new record on this thread's buffer, or NULL (counted as dropped). Not
 * zeroed: a slot reused from an earlier session holds its old fields (its
 * strings freed), and the caller sets every one. */
static inline tern__prof_rec_t *buf_append(tern__prof_buf_t *b, size_t *index)
{
    size_t n = atomic_load_explicit(&b->count, memory_order_relaxed);
    size_t c = n / TERN__PROF_CHUNK;
    tern__prof_rec_t *chunk = c < TERN__PROF_CHUNKS ? b->chunks[c] : NULL;
    if (chunk == NULL && (chunk = buf_append_slow(b, c)) == NULL)
        return NULL;
    *index = n;
    return &chunk[n % TERN__PROF_CHUNK];
}

static void buf_publish(tern__prof_buf_t *b, size_t index)
{
    atomic_store_explicit(&b->count, index + 1, memory_order_release);
}

void tern__prof_each_buf(void (*fn)(tern__prof_buf_t *b, void *arg), void *arg)
{
    pthread_mutex_lock(&bufs_lock);
    tern__prof_buf_t **pp = &bufs;
    while (*pp != NULL) {
        tern__prof_buf_t *b = *pp;
        fn(b, arg);
        if (b->orphan && atomic_load(&b->count) == 0) {
            *pp = b->next;
            for (size_t c = 0; c < TERN__PROF_CHUNKS && b->chunks[c] != NULL; c++)
                free(b->chunks[c]);
            free(b);
            continue;
        }
        pp = &b->next;
    }
    pthread_mutex_unlock(&bufs_lock);
}

/* ---- captures (a profiled handler's events, on the target) ---- */

struct tern__prof_capture {
    pthread_mutex_t lock;
    atomic_int refs;
    unsigned cfg;
    tern__prof_rec_t *recs;
    size_t n, cap;
    uint32_t dropped;
};

/* Most events a capture keeps: the reply must stay a sendable message. */
#define CAPTURE_MAX 4096

tern__prof_capture_t *tern__prof_capture_new(unsigned cfg)
{
    tern__prof_capture_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    pthread_mutex_init(&c->lock, NULL);
    atomic_init(&c->refs, 1);
    c->cfg = cfg;
    tern__prof_load_skew();
    return c;
}

static void capture_get(tern__prof_capture_t *c)
{
    atomic_fetch_add(&c->refs, 1);
}

void tern__prof_capture_put(tern__prof_capture_t *c)
{
    if (c == NULL || atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    for (size_t i = 0; i < c->n; i++)
        tern__prof_rec_clear(&c->recs[i]);
    free(c->recs);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

tern__prof_capture_t *tern__prof_capture_enter(tern__prof_capture_t *c)
{
    tern__prof_capture_t *old = tern__prof_tl_capture;
    tern__prof_tl_capture = c;
    return old;
}

/* Append a copy of r (lock held); the copy owns r's strings. */
static tern__prof_rec_t *capture_add(tern__prof_capture_t *c)
{
    if (c->n == CAPTURE_MAX) {
        c->dropped++;
        return NULL;
    }
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 16;
        tern__prof_rec_t *p = realloc(c->recs, cap * sizeof(*p));
        if (p == NULL) {
            c->dropped++;
            return NULL;
        }
        c->recs = p;
        c->cap = cap;
    }
    tern__prof_rec_t *r = &c->recs[c->n++];
    memset(r, 0, sizeof(*r));
    return r;
}

void tern__prof_capture_handler(tern__prof_capture_t *c, const char *name, int64_t start,
                                int64_t end, int64_t mem, const char *shapes)
{
    if (c == NULL)
        return;
    pthread_mutex_lock(&c->lock);
    tern__prof_rec_t *r = capture_add(c);
    if (r != NULL) {
        tern__prof_rec_set_name(r, name);
        r->start = start;
        atomic_store_explicit(&r->end, end, memory_order_relaxed);
        r->kind = TERN_PROF_KIND_HANDLER;
        r->mem = mem;
        r->tid = tern__prof_tid();
        r->node = tern__prof_session_node();
        r->id = tern__prof_new_id();
        if (shapes != NULL && shapes[0] != '\0')
            r->shapes = strdup(shapes);
    }
    pthread_mutex_unlock(&c->lock);
}

/* ---- ranges ---- */

/* Handles: the owning thread's number, the session generation's low bits
 * and the record's index + 1; in a capture, the top bit is set, no
 * generation, and the index is the capture's. The owner makes a handle
 * ended on another thread than its begin one that names nothing there (the
 * index alone named that thread's record at the same place). */
#define H_CAPTURE (1ull << 63)
#define H_OWNER_SHIFT 40
#define H_OWNER_MASK 0x7fffffull
#define H_GEN_SHIFT 24
#define H_GEN_MASK 0xffffull
#define H_INDEX_MASK 0xffffffull
_Static_assert((uint64_t)TERN__PROF_CHUNK * TERN__PROF_CHUNKS < H_INDEX_MASK &&
                   CAPTURE_MAX < H_INDEX_MASK,
               "a record's index + 1 fits its field");

static atomic_uint next_owner;
static _Thread_local uint64_t tl_owner; /* this thread's number, 1..H_OWNER_MASK; 0 unset */

/* This thread's number, in place in a handle. Numbers wrap past 8M threads. */
static inline uint64_t owner_bits(void)
{
    if (tl_owner == 0)
        tl_owner = atomic_fetch_add_explicit(&next_owner, 1, memory_order_relaxed) % H_OWNER_MASK + 1;
    return tl_owner << H_OWNER_SHIFT;
}

static inline bool handle_foreign(tern_prof_range_t h)
{
    return (h & (H_OWNER_MASK << H_OWNER_SHIFT)) != owner_bits();
}

/* range_begin sets each field of a record itself, as buf_append does not
 * zero it (GCC's inline memset of it costs a third of the range): a field
 * added to the record must be set there too, and the size below updated. */
_Static_assert(sizeof(tern__prof_rec_t) == 136 || sizeof(void *) != 8,
               "a field added to tern__prof_rec_t: set it in range_begin");

static tern_prof_range_t range_begin(const char *name, unsigned kind)
{
    tern__prof_capture_t *c = tern__prof_tl_capture;
    if (c != NULL) {
        pthread_mutex_lock(&c->lock);
        tern__prof_rec_t *r = capture_add(c);
        size_t i = c->n - 1;
        if (r != NULL) {
            tern__prof_rec_set_name(r, name);
            r->kind = (uint16_t)kind;
            r->tid = tern__prof_tid();
            r->node = tern__prof_session_node();
            r->id = tern__prof_new_id();
            r->mem = tl_mem;
            r->start = now();
        }
        pthread_mutex_unlock(&c->lock);
        return r != NULL ? (H_CAPTURE | owner_bits() | ((uint64_t)i + 1)) : 0;
    }
    if (!atomic_load_explicit(&tern__prof_on, memory_order_acquire))
        return 0;
    tern__prof_buf_t *b = buf_get();
    size_t i;
    tern__prof_rec_t *r = b != NULL ? buf_append(b, &i) : NULL;
    if (r == NULL)
        return 0;
    /* Every field (see above): the slot may hold an earlier session's record. */
    r->flags = 0;
    tern__prof_rec_set_name(r, name);
    r->kind = (uint16_t)kind;
    r->tid = b->tid;
    r->node = -1; /* this process: filled in at stop */
    r->mem = tl_mem;
    atomic_store_explicit(&r->end, 0, memory_order_relaxed);
    r->bytes = 0;
    r->id = 0; /* given at stop */
    r->parent = 0;
    r->seq = 0;
    r->peer = -1;
    r->shapes = NULL;
    r->start = buf_tick(b, ticks());
    buf_publish(b, i);
    return owner_bits() | ((uint64_t)b->gen & H_GEN_MASK) << H_GEN_SHIFT | (uint64_t)(i + 1);
}

static tern__prof_rec_t *range_rec(tern_prof_range_t h, tern__prof_capture_t **locked)
{
    *locked = NULL;
    if (h == 0 || handle_foreign(h))
        return NULL;
    if (h & H_CAPTURE) {
        tern__prof_capture_t *c = tern__prof_tl_capture;
        size_t i = (size_t)(h & H_INDEX_MASK) - 1;
        if (c == NULL)
            return NULL;
        pthread_mutex_lock(&c->lock);
        if (i >= c->n) {
            pthread_mutex_unlock(&c->lock);
            return NULL;
        }
        *locked = c;
        return &c->recs[i];
    }
    tern__prof_buf_t *b = tl_buf;
    size_t i = (size_t)(h & H_INDEX_MASK) - 1;
    if (b == NULL || (b->gen & H_GEN_MASK) != ((h >> H_GEN_SHIFT) & H_GEN_MASK) ||
        i >= atomic_load_explicit(&b->count, memory_order_relaxed))
        return NULL;
    return tern__prof_buf_at(b, i);
}

tern_prof_range_t tern_prof_range_begin(const char *name)
{
    if (!tern__prof_recording() || name == NULL)
        return 0;
    return range_begin(name, TERN_PROF_KIND_RANGE);
}

tern_prof_range_t tern__prof_begin_on(const char *name, unsigned kind)
{
    return range_begin(name, kind);
}

void tern_prof_range_end(tern_prof_range_t h)
{
    if (h == 0)
        return;
    if (handle_foreign(h)) {
        static atomic_bool said;
        if (!atomic_exchange(&said, true))
            tern_warn("tern_prof_range_end: the range was begun on another thread; ignored "
                      "(a range ends on the thread that began it; said once)");
        return;
    }
    int64_t t = (h & H_CAPTURE) ? now() : ticks();
    tern__prof_capture_t *locked;
    tern__prof_rec_t *r = range_rec(h, &locked);
    if (r != NULL && atomic_load_explicit(&r->end, memory_order_relaxed) != 0) {
        /* Ended twice: rewriting an end gave it a made-up length (a 10 ms
         * range recorded as 210 ms). */
        static atomic_bool said;
        if (!atomic_exchange(&said, true))
            tern_warn("tern_prof_range_end: the range had ended already; ignored (said once)");
        r = NULL;
    }
    if (r != NULL) {
        if (locked == NULL)
            t = buf_tick(tl_buf, t);
        r->mem = tl_mem - r->mem;
        atomic_store_explicit(&r->end, t, memory_order_release);
    }
    if (locked != NULL)
        pthread_mutex_unlock(&locked->lock);
}

void tern_prof_range_bytes(tern_prof_range_t h, uint64_t bytes)
{
    tern__prof_capture_t *locked;
    tern__prof_rec_t *r = range_rec(h, &locked);
    if (r != NULL)
        r->bytes += bytes;
    if (locked != NULL)
        pthread_mutex_unlock(&locked->lock);
}

static uint16_t dir_flag(unsigned dir)
{
    return dir == TERN_PROF_DIR_SEND ? TERN__REC_SEND : dir == TERN_PROF_DIR_RECV ? TERN__REC_RECV : 0;
}

void tern__prof_range_msg(tern_prof_range_t h, int peer, unsigned dir, uint64_t seq)
{
    tern__prof_capture_t *locked;
    tern__prof_rec_t *r = range_rec(h, &locked);
    if (r != NULL) {
        r->peer = peer;
        r->seq = seq;
        r->flags |= dir_flag(dir);
    }
    if (locked != NULL)
        pthread_mutex_unlock(&locked->lock);
}

void tern__prof_alloc(int64_t bytes)
{
    if (tern__prof_flags() & TERN_PROF_MEMORY)
        tl_mem += bytes;
}

int64_t tern__prof_mem_now(void)
{
    return tl_mem;
}

unsigned tern__prof_flags(void)
{
    tern__prof_capture_t *c = tern__prof_tl_capture;
    if (c != NULL)
        return c->cfg;
    if (atomic_load_explicit(&tern__prof_on, memory_order_acquire))
        return atomic_load_explicit(&tern__prof_session.flags, memory_order_relaxed);
    return 0;
}

uint32_t tern__prof_imm_bits(void)
{
    if (!tern__prof_recording())
        return 0;
    return TERN_IMM_PROF | (tern__prof_flags() & TERN_IMM_PROF_CFG_MASK) << TERN_IMM_PROF_CFG_SHIFT;
}

/* ---- operations that end elsewhere ---- */

char *tern__prof_concat(const char *const *parts, size_t n)
{
    size_t len[16], total = 1;
    if (n > 16)
        return NULL;
    for (size_t i = 0; i < n; i++)
        total += len[i] = strlen(parts[i]);
    char *s = malloc(total), *p = s;
    if (s == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        memcpy(p, parts[i], len[i]);
        p += len[i];
    }
    *p = '\0';
    return s;
}

void tern__prof_op_begin(tern__prof_op_t *op, struct tern__comm *comm, int peer, unsigned kind,
                         const char *fmt, ...)
{
    if (!tern__prof_recording()) {
        memset(op, 0, sizeof(*op));
        return;
    }
    char name[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(name, sizeof(name), fmt, ap);
    va_end(ap);
    char *owned = NULL;
    if (n >= 0 && (size_t)n < sizeof(name)) {
        owned = strdup(name);
    } else if (n > 0 && (owned = malloc((size_t)n + 1)) != NULL) {
        va_start(ap, fmt);
        vsnprintf(owned, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    tern__prof_op_begin_named(op, comm, peer, kind, owned);
}

void tern__prof_op_begin_named(tern__prof_op_t *op, struct tern__comm *comm, int peer,
                               unsigned kind, char *name)
{
    memset(op, 0, sizeof(*op));
    if (name == NULL)
        return;
    if (!tern__prof_recording()) {
        free(name);
        return;
    }
    op->capture = tern__prof_tl_capture;
    tern__prof_contact_fn contact = atomic_load(&tern__prof_session.first_contact);
    /* Only RPCs bring remote events back, and need the peer's clock. */
    if (kind == TERN_PROF_KIND_RPC && op->capture == NULL && contact != NULL)
        contact(comm, peer);
    op->name = name;
    if (op->capture != NULL)
        capture_get(op->capture);
    op->peer = peer;
    op->kind = kind;
    op->tid = tern__prof_tid();
    op->id = tern__prof_new_id();
    op->gen = atomic_load(&tern__prof_session.gen);
    /* Its events go where the capture's are, in ns, or to a session buffer:
     * in ticks, after the ranges this thread opened before it. */
    tern__prof_buf_t *b = tl_buf;
    if (op->capture != NULL)
        op->start = now();
    else
        op->start = b != NULL ? buf_tick(b, ticks()) : ticks();
}

void tern__prof_op_drop(tern__prof_op_t *op)
{
    free(op->name);
    op->name = NULL;
    tern__prof_capture_put(op->capture);
    op->capture = NULL;
}

/* Wire form of events (little-endian), after a 8-byte head (count, dropped):
 *  0 i64 start   8 i64 end   16 u64 bytes   24 i64 mem   32 u64 tid
 * 40 u64 id     48 u64 parent 56 i32 node   60 u16 kind  62 u16 name length
 * 64 u16 shapes length  66 u16 flags (TERN__REC_ASYNC, _SEND, _RECV)
 * 68 u64 seq    76 i32 peer, then name and shapes. */
#define EV_FIXED 80
#define EV_WIRE_FLAGS (TERN__REC_ASYNC | TERN__REC_SEND | TERN__REC_RECV)

static size_t rec_wire_size(const tern__prof_rec_t *r)
{
    return EV_FIXED + strlen(tern__prof_rec_name(r)) + (r->shapes ? strlen(r->shapes) : 0);
}

static uint8_t *put_rec(uint8_t *p, const tern__prof_rec_t *r)
{
    const char *name = tern__prof_rec_name(r);
    size_t nl = strlen(name), sl = r->shapes ? strlen(r->shapes) : 0;
    tern__put_le64(p, (uint64_t)r->start);
    tern__put_le64(p + 8, (uint64_t)atomic_load_explicit(&r->end, memory_order_relaxed));
    tern__put_le64(p + 16, r->bytes);
    tern__put_le64(p + 24, (uint64_t)r->mem);
    tern__put_le64(p + 32, r->tid);
    tern__put_le64(p + 40, r->id);
    tern__put_le64(p + 48, r->parent);
    tern__put_le32(p + 56, (uint32_t)r->node);
    tern__put_le16(p + 60, r->kind);
    tern__put_le16(p + 62, (uint16_t)nl);
    tern__put_le16(p + 64, (uint16_t)sl);
    tern__put_le16(p + 66, (uint16_t)(r->flags & EV_WIRE_FLAGS));
    tern__put_le64(p + 68, r->seq);
    tern__put_le32(p + 76, (uint32_t)r->peer);
    memcpy(p + EV_FIXED, name, nl);
    if (sl)
        memcpy(p + EV_FIXED + nl, r->shapes, sl);
    return p + EV_FIXED + nl + sl;
}

size_t tern__prof_capture_size(tern__prof_capture_t *c)
{
    size_t size = 8;
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; i < c->n; i++)
        size += rec_wire_size(&c->recs[i]);
    pthread_mutex_unlock(&c->lock);
    return size;
}

size_t tern__prof_capture_encode(tern__prof_capture_t *c, uint8_t *buf, size_t room)
{
    if (room < 8)
        return 0;
    uint8_t *p = buf + 8;
    uint32_t n = 0, dropped;
    int64_t t = now();
    pthread_mutex_lock(&c->lock);
    dropped = c->dropped;
    for (size_t i = 0; i < c->n; i++) {
        tern__prof_rec_t *r = &c->recs[i];
        /* A range the handler left open ends with the reply. */
        if (atomic_load_explicit(&r->end, memory_order_relaxed) == 0)
            atomic_store_explicit(&r->end, t, memory_order_relaxed);
        size_t need = rec_wire_size(r);
        if ((size_t)(p - buf) + need > room) {
            dropped++;
            continue;
        }
        p = put_rec(p, r);
        n++;
    }
    pthread_mutex_unlock(&c->lock);
    tern__put_le32(buf, n);
    tern__put_le32(buf + 4, dropped);
    return (size_t)(p - buf);
}

tern_status_t tern__prof_decode(const uint8_t *p, size_t len, uint32_t *dropped,
                                tern_status_t (*fn)(tern__prof_rec_t *r, void *arg), void *arg)
{
    if (len < 8)
        return TERN_ERR_PROTOCOL;
    uint32_t n = tern__get_le32(p);
    *dropped = tern__get_le32(p + 4);
    const uint8_t *end = p + len;
    p += 8;
    for (uint32_t i = 0; i < n; i++) {
        if ((size_t)(end - p) < EV_FIXED)
            return TERN_ERR_PROTOCOL;
        size_t nl = tern__get_le16(p + 62), sl = tern__get_le16(p + 64);
        if ((size_t)(end - p) < EV_FIXED + nl + sl)
            return TERN_ERR_PROTOCOL;
        tern__prof_rec_t r;
        memset(&r, 0, sizeof(r));
        r.start = (int64_t)tern__get_le64(p);
        atomic_store_explicit(&r.end, (int64_t)tern__get_le64(p + 8), memory_order_relaxed);
        r.bytes = tern__get_le64(p + 16);
        r.mem = (int64_t)tern__get_le64(p + 24);
        r.tid = tern__get_le64(p + 32);
        r.id = tern__get_le64(p + 40);
        r.parent = tern__get_le64(p + 48);
        r.node = (int32_t)tern__get_le32(p + 56);
        r.kind = tern__get_le16(p + 60);
        uint16_t wflags = tern__get_le16(p + 66) & EV_WIRE_FLAGS;
        r.seq = tern__get_le64(p + 68);
        r.peer = (int32_t)tern__get_le32(p + 76);
        char name[1024];
        size_t cut = nl < sizeof(name) ? nl : sizeof(name) - 1;
        memcpy(name, p + EV_FIXED, cut);
        name[cut] = '\0';
        tern__prof_rec_set_name(&r, name);
        r.flags |= wflags;
        if (sl > 0 && (r.shapes = malloc(sl + 1)) != NULL) {
            memcpy(r.shapes, p + EV_FIXED + nl, sl);
            r.shapes[sl] = '\0';
        }
        tern_status_t st = fn(&r, arg);
        if (st != TERN_OK) {
            tern__prof_rec_clear(&r);
            return st;
        }
        p += EV_FIXED + nl + sl;
    }
    return TERN_OK;
}

/* Where op's event and its remote ones go: into the capture it was issued
 * under (a nested call), else this thread's session buffer. */
typedef struct file_ctx {
    tern__prof_op_t *op;
    tern__prof_buf_t *buf;
} file_ctx_t;

static tern_status_t file_rec(tern__prof_rec_t *r, void *arg)
{
    file_ctx_t *f = arg;
    tern__prof_rec_t *dst;
    size_t i = 0;
    if (f->op->capture != NULL) {
        dst = capture_add(f->op->capture);
    } else {
        dst = f->buf != NULL ? buf_append(f->buf, &i) : NULL;
    }
    if (dst == NULL) {
        tern__prof_rec_clear(r);
        return TERN_OK;
    }
    *dst = *r; /* moves the strings */
    atomic_store_explicit(&dst->end, atomic_load_explicit(&r->end, memory_order_relaxed),
                          memory_order_relaxed);
    if (f->op->capture == NULL)
        buf_publish(f->buf, i);
    return TERN_OK;
}

typedef struct remote_ctx {
    file_ctx_t file;
    uint64_t op_id;
} remote_ctx_t;

/* A remote event: prefixed with its call's name, and a child of it unless it
 * has a parent there already (a nested call's own remote events). */
static tern_status_t file_remote(tern__prof_rec_t *r, void *arg)
{
    remote_ctx_t *rc = arg;
    const char *parts[] = {rc->file.op->name, "#remote_op: ", tern__prof_rec_name(r)};
    char *name = tern__prof_concat(parts, 3);
    uint16_t keep = r->flags & EV_WIRE_FLAGS;
    if (name == NULL) {
        tern__prof_rec_clear(r); /* counted nowhere else: say so */
        tern_warn("prof: no memory to name a remote event of %s; dropped", rc->file.op->name);
        return TERN_OK;
    }
    if (r->flags & TERN__REC_NAME_HEAP)
        free(r->name.heap);
    r->flags = 0;
    if (strlen(name) < sizeof(r->name.inl)) {
        tern__prof_rec_set_name(r, name);
        free(name);
    } else {
        r->name.heap = name; /* made for it: no second copy */
        r->flags |= TERN__REC_NAME_HEAP;
    }
    r->flags |= TERN__REC_REMOTE | keep;
    if (r->parent == 0)
        r->parent = rc->op_id;
    return file_rec(r, &rc->file);
}

void tern__prof_op_end(tern__prof_op_t *op, uint64_t bytes, const uint8_t *events, size_t len)
{
    if (op->name == NULL)
        return;
    int64_t t = op->capture != NULL ? now() : ticks();
    tern__prof_rec_t r;
    memset(&r, 0, sizeof(r));
    tern__prof_rec_set_name(&r, op->name);
    r.start = op->start;
    atomic_store_explicit(&r.end, t, memory_order_relaxed);
    r.bytes = bytes;
    r.kind = (uint16_t)op->kind;
    r.flags |= TERN__REC_ASYNC;
    r.tid = op->tid;
    r.id = op->id;
    r.parent = op->parent;
    r.seq = op->seq;
    r.peer = op->peer;
    r.flags |= dir_flag(op->dir);
    r.node = op->capture != NULL ? tern__prof_session_node() : -1;
    file_ctx_t f = {.op = op};
    if (op->capture != NULL) {
        pthread_mutex_lock(&op->capture->lock);
    } else if (!atomic_load_explicit(&tern__prof_on, memory_order_acquire) ||
               op->gen != atomic_load(&tern__prof_session.gen) || (f.buf = buf_get()) == NULL) {
        /* The session it started in ended while the call was out. */
        tern__prof_rec_clear(&r);
        tern__prof_op_drop(op);
        return;
    }
    if (f.buf != NULL) /* before the ends of the ranges this thread has open */
        atomic_store_explicit(&r.end, buf_tick(f.buf, t), memory_order_relaxed);
    file_rec(&r, &f);
    if (events != NULL && len > 0) {
        uint32_t dropped = 0;
        remote_ctx_t rc = {.file = f, .op_id = op->id};
        if (tern__prof_decode(events, len, &dropped, file_remote, &rc) != TERN_OK)
            tern_warn("prof: malformed events in the reply to %s", op->name);
        if (dropped > 0)
            tern_warn("prof: %s: the target dropped %u events (more than a reply holds)", op->name,
                      dropped);
    }
    if (op->capture != NULL)
        pthread_mutex_unlock(&op->capture->lock);
    tern__prof_op_drop(op);
}

/* ---- shapes ---- */

void tern__prof_shapes(char *buf, size_t size, const void *tensors, size_t n)
{
    const tern_tensor_t *t = tensors;
    size_t off = 0;
#define PUT(...)                                                                \
    do {                                                                        \
        int k = snprintf(buf + off, off < size ? size - off : 0, __VA_ARGS__); \
        if (k > 0)                                                              \
            off += (size_t)k;                                                   \
    } while (0)
    if (size == 0)
        return;
    buf[0] = '\0';
    PUT("[");
    for (size_t i = 0; i < n; i++) {
        PUT("%s[", i ? ", " : "");
        for (int d = 0; d < t[i].ndim; d++)
            PUT("%s%" PRId64, d ? ", " : "", t[i].shape[d]);
        PUT("]");
    }
    PUT("]");
#undef PUT
}

/* ---- the receiving end of the clock ping-pong ---- */

tern__prof_ping_t tern__prof_ping;

void tern__prof_clock_pong(struct tern__comm *comm, int src, uint64_t seq, int64_t t_remote)
{
    (void)comm;
    int64_t t = tern_prof_clock_ns();
    if (src != atomic_load_explicit(&tern__prof_ping.peer, memory_order_acquire) ||
        seq != atomic_load_explicit(&tern__prof_ping.seq, memory_order_acquire))
        return; /* an answer to a ping that was given up on */
    tern__prof_ping.t_recv = t;
    tern__prof_ping.t_remote = t_remote;
    atomic_store_explicit(&tern__prof_ping.done, 1, memory_order_release);
}

void tern__prof_set_rank(int rank)
{
    atomic_store(&tern__prof_session.rank, rank);
}

static _Atomic(void (*)(tern_ctx_t *)) fini_hook;

void tern__prof_set_fini_hook(void (*fn)(tern_ctx_t *ctx))
{
    atomic_store(&fini_hook, fn);
}

void tern__prof_ctx_finalize(tern_ctx_t *ctx)
{
    void (*fn)(tern_ctx_t *) = atomic_load(&fini_hook);
    if (fn != NULL)
        fn(ctx);
}

void tern__prof_peer_lost(int peer)
{
    if (peer == atomic_load_explicit(&tern__prof_ping.peer, memory_order_acquire))
        atomic_store_explicit(&tern__prof_ping.done, -1, memory_order_release);
}
