/*
 * What record.c (the recording side) shares with session.c (start, stop,
 * results): the record, the per-thread buffer, the session's settings and
 * the clock ping slot.
 */
#ifndef TERN_PROF_RECORD_H
#define TERN_PROF_RECORD_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <tern/imm.h>

#include "prof/prof.h"

enum {
    TERN__REC_NAME_HEAP = 1u << 0, /* name.heap is malloc'ed */
    TERN__REC_ASYNC = 1u << 1,     /* ends on another thread: nests nothing */
    TERN__REC_REMOTE = 1u << 2,    /* came back with a reply */
    TERN__REC_SEND = 1u << 3,      /* a message's sending end (peer, seq) */
    TERN__REC_RECV = 1u << 4,      /* a message's receiving end */
};

/* In a session buffer, start and end are ticks (tern__prof_calibrate)
 * unless the record is TERN__REC_REMOTE; elsewhere they are ns. range_begin
 * sets every field itself (buf_append does not zero). */
typedef struct tern__prof_rec {
    int64_t start;
    _Atomic int64_t end; /* 0 while open */
    uint64_t bytes;
    int64_t mem; /* tern's allocations inside (at begin: the counter then) */
    uint64_t tid;
    uint64_t id, parent;
    uint64_t seq; /* a message's number */
    char *shapes; /* malloc'ed or NULL */
    int32_t node; /* -1: this process */
    int32_t peer; /* a message's other rank, an RPC's target */
    uint16_t kind, flags;
    union {
        char inl[48];
        char *heap;
    } name;
} tern__prof_rec_t;

#define TERN__PROF_CHUNK 1024
#define TERN__PROF_CHUNKS 4096 /* 4M events per thread and session */

typedef struct tern__prof_buf {
    struct tern__prof_buf *next;
    tern__prof_rec_t *chunks[TERN__PROF_CHUNKS];
    atomic_size_t count;
    atomic_uint_fast64_t dropped;
    uint64_t tid;
    unsigned gen;
    bool orphan; /* its thread has exited */
    int64_t last_tick; /* the owner's latest time: its times never go back */
} tern__prof_buf_t;

typedef void (*tern__prof_contact_fn)(struct tern__comm *comm, int peer);

typedef struct tern__prof_session {
    atomic_uint gen;   /* bumped by every start */
    atomic_uint flags; /* tern_prof_flag bits */
    atomic_int rank;   /* this process's node id */
    /* The first profiled call to a peer in this session (session.c). */
    _Atomic(tern__prof_contact_fn) first_contact;
} tern__prof_session_t;

extern tern__prof_session_t tern__prof_session;

static inline int tern__prof_session_node(void)
{
    return atomic_load_explicit(&tern__prof_session.rank, memory_order_relaxed);
}

/* The one ping in flight in this process (session.c sends, p2p delivers). */
typedef struct tern__prof_ping {
    atomic_int peer;
    atomic_uint_fast64_t seq;
    atomic_int done; /* 1 answered, -1 peer lost */
    int64_t t_recv, t_remote;
} tern__prof_ping_t;

extern tern__prof_ping_t tern__prof_ping;

void tern__prof_load_skew(void);

/* A calibration point of the ticks in session buffers: the counter's value
 * (the middle of two reads) when tern_prof_clock_ns() read ns, and the ticks
 * the reads were apart (how far off ticks may be). Where there is no counter,
 * ticks are ns and equal. */
typedef struct tern__prof_cal {
    int64_t ticks, ns, span;
} tern__prof_cal_t;

void tern__prof_calibrate(tern__prof_cal_t *c);

/* The line through a session's two points: time t is ns + (t - ticks) * ns_per_tick. */
typedef struct tern__prof_line {
    int64_t ticks, ns;
    double ns_per_tick;
} tern__prof_line_t;

void tern__prof_line(tern__prof_line_t *l, const tern__prof_cal_t *a, const tern__prof_cal_t *b);
/* Never reverses the order of two times (equal ticks stay equal). */
int64_t tern__prof_line_ns(const tern__prof_line_t *l, int64_t ticks);
uint64_t tern__prof_tid(void);
uint64_t tern__prof_new_id(void);
void tern__prof_rec_set_name(tern__prof_rec_t *r, const char *name);
const char *tern__prof_rec_name(const tern__prof_rec_t *r);
void tern__prof_rec_clear(tern__prof_rec_t *r);
tern__prof_rec_t *tern__prof_buf_at(tern__prof_buf_t *b, size_t i);
void tern__prof_buf_reset(tern__prof_buf_t *b);
/* Visit every thread's buffer (the list locked); frees exited threads' empty ones. */
void tern__prof_each_buf(void (*fn)(tern__prof_buf_t *b, void *arg), void *arg);
/* Parse events in wire form; fn takes ownership of each record's strings. */
tern_status_t tern__prof_decode(const uint8_t *p, size_t len, uint32_t *dropped,
                                tern_status_t (*fn)(tern__prof_rec_t *r, void *arg), void *arg);

#endif
