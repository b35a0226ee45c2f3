/*
 * The profiler: what torch.autograd.profiler is to RPC programs, in C
 * (docs/profiler.md).
 *
 * tern_prof_start() turns recording on for the process. From then on every
 * thread records the ranges it opens (tern_prof_range_begin/end,
 * TERN_PROF_SCOPE) and tern records its own operations: each RPC (from issue
 * to completion), each handler it runs, each point-to-point transfer and
 * collective, with the bytes moved. Each thread writes its own buffer; the
 * recording path takes no lock.
 *
 * An RPC issued while the profiler is on carries the prof bit (and the
 * config) in its 32-bit immediate. The target profiles that request's handler,
 * whatever its own profiler's state, and returns the events with the reply;
 * the caller files them under the call, named as PyTorch does:
 *
 *   rpc_async#add(worker0 -> worker1)                    node 0, the call
 *   rpc_async#add(worker0 -> worker1)#remote_op: add     node 1, what ran there
 *
 * Nested RPCs a profiled handler issues are profiled the same way, and their
 * events travel back with it.
 *
 * Remote times are moved onto this process's clock by an offset estimated by
 * ping-pong (tern_prof_clock_estimate): many round trips, keep the one with
 * the smallest round-trip time, offset = remote - (t_send + t_recv) / 2,
 * error bound = that round trip / 2. Each peer is measured when first talked
 * to, again every refresh interval while the profiler runs (so drift is
 * followed: times are interpolated between estimates), and at stop.
 *
 * tern_prof_stop() ends recording and builds the results, which
 * tern_prof_events(), tern_prof_key_averages() and the exports read until the
 * next tern_prof_start().
 *
 * Threading: start, stop and the result functions from one thread at a time;
 * ranges from any thread.
 */
#ifndef TERN_PROF_H
#define TERN_PROF_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <tern/context.h>
#include <tern/defs.h>
#include <tern/status.h>

TERN_BEGIN_DECLS

/* ---- recording ---- */

/* What to record besides times; the same bits ride in the immediate (imm.h). */
enum tern_prof_flag {
    TERN_PROF_MEMORY = 1u << 0, /* bytes tern allocates inside each range */
    TERN_PROF_SHAPES = 1u << 1, /* tensor shapes of RPC arguments */
    TERN_PROF_CUDA = 1u << 2,   /* GPU time of tern's CUDA copies (builds with CUDA) */
};

enum tern_prof_config_field {
    TERN_PROF_CFG_FLAGS = 1u << 0,
    TERN_PROF_CFG_CLOCK_REFRESH = 1u << 1,
    TERN_PROF_CFG_CLOCK_SAMPLES = 1u << 2,
};

/* Fields are read only where their bit is set; the others take the
 * environment, then the default in brackets. */
typedef struct tern_prof_config {
    uint64_t field_mask;
    unsigned flags;           /* tern_prof_flag bits [0] */
    int64_t clock_refresh_ns; /* re-estimate each peer's offset this often
                                 [TERN_PROF_CLOCK_REFRESH, 10 s]; 0: only at
                                 first contact and at stop */
    unsigned clock_samples;   /* round trips per estimate [TERN_PROF_CLOCK_SAMPLES, 100] */
} tern_prof_config_t;

/*
 * Start recording (config may be NULL). Events of an earlier session are
 * dropped. TERN_ERR_NO_RESOURCE if a session is already running.
 */
TERN_API tern_status_t tern_prof_start(tern_ctx_t *ctx, const tern_prof_config_t *config);

/*
 * Stop recording and build the results: remote events filed under their
 * calls, every node's times aligned to this process's clock (estimating the
 * offsets it still lacks), self times computed. A node that cannot be reached
 * leaves its events unaligned (their clock_error_ns is -1) and a warning.
 * TERN_ERR_CLOSED if no session is running.
 */
TERN_API tern_status_t tern_prof_stop(void);

/* Whether a session is running. */
TERN_API int tern_prof_enabled(void);

/* A range handle; 0 when nothing is recorded. */
typedef uint64_t tern_prof_range_t;

/*
 * Open a range on this thread (name is copied). Ranges nest; each is closed
 * by tern_prof_range_end, on the same thread (a handle ended on another
 * thread, or twice, is ignored with a warning). Costs one clock read and a few
 * stores when on, a load and a branch when off.
 */
TERN_API tern_prof_range_t tern_prof_range_begin(const char *name);
TERN_API void tern_prof_range_end(tern_prof_range_t range);
/* Bytes the range moved (shown in traces and events). */
TERN_API void tern_prof_range_bytes(tern_prof_range_t range, uint64_t bytes);

static inline void tern__prof_scope_end(tern_prof_range_t *r)
{
    tern_prof_range_end(*r);
}
#define TERN__PROF_CAT2(a, b) a##b
#define TERN__PROF_CAT(a, b) TERN__PROF_CAT2(a, b)
/* A range open until the end of the enclosing block (GCC and Clang). */
#define TERN_PROF_SCOPE(name)                                                                   \
    tern_prof_range_t TERN__PROF_CAT(tern__prof_scope_, __LINE__)                               \
        __attribute__((cleanup(tern__prof_scope_end), unused)) = tern_prof_range_begin(name)

/* The profiler's clock: tern_clock_ns() plus TERN_CLOCK_SKEW_NS (for tests).
 * Events' times are on it; this process's are recorded on the CPU's counter
 * where it has a usable one and put on this clock at tern_prof_stop. */
TERN_API int64_t tern_prof_clock_ns(void);

/* ---- clocks ---- */

typedef struct tern_prof_clock {
    int peer;
    int64_t offset_ns;      /* peer's profiler clock minus ours */
    int64_t error_bound_ns; /* |true offset - offset_ns| <= this: min_rtt / 2 */
    int64_t min_rtt_ns;     /* the smallest round trip seen */
    unsigned samples;       /* round trips made */
    int64_t at_ns;          /* when (our clock, middle of the best round trip) */
} tern_prof_clock_t;

/*
 * Estimate peer's clock offset now by samples ping-pongs (0: the default).
 * Works with or without a session; peer may be this rank (offset 0). Answers
 * come from the peer's progress, so no call is needed there.
 */
TERN_API tern_status_t tern_prof_clock_estimate(tern_ctx_t *ctx, int peer, unsigned samples,
                                                tern_prof_clock_t *out);

/* ---- results ---- */

enum tern_prof_kind {
    TERN_PROF_KIND_RANGE = 0, /* a user range */
    TERN_PROF_KIND_RPC,       /* an RPC issued here, issue to completion */
    TERN_PROF_KIND_HANDLER,   /* an RPC handler (a function or method ran) */
    TERN_PROF_KIND_P2P,       /* a point-to-point send or receive */
    TERN_PROF_KIND_COLL,      /* a collective */
    TERN_PROF_KIND_CLOCK,     /* a clock estimate */
};

/* Which end of a message an event is. */
enum tern_prof_dir {
    TERN_PROF_DIR_NONE = 0,
    TERN_PROF_DIR_SEND, /* posted a message to peer */
    TERN_PROF_DIR_RECV, /* received a message from peer */
};

typedef struct tern_prof_event {
    const char *name;       /* remote ones prefixed "<call>#remote_op: " */
    int node;               /* the rank it ran on */
    unsigned kind;          /* tern_prof_kind */
    uint64_t thread;        /* a thread id, unique within its node */
    int64_t start_ns;       /* on this process's profiler clock */
    int64_t end_ns;         /* (remote ones shifted by the offset estimate) */
    int64_t self_ns;        /* minus the ranges nested in it on its thread */
    uint64_t bytes;         /* moved, when the operation moves bytes */
    int64_t mem;            /* allocated by tern inside it (TERN_PROF_MEMORY) */
    int64_t self_mem;
    const char *shapes;     /* "[[3, 3], [3, 3]]" (TERN_PROF_SHAPES), else "" */
    int64_t clock_error_ns; /* the alignment's bound; 0 local, -1 unaligned */
    uint64_t id;            /* unique in the results */
    uint64_t parent;        /* remote events: their RPC's id; a collective's
                               messages: the collective's */
    int depth;              /* nesting on its thread */
    int peer;               /* a message's other rank, an RPC's target; else -1 */
    unsigned dir;           /* tern_prof_dir */
    uint64_t seq;           /* a message's number from its sender to its receiver
                               (from 1): a send and its receive share (sender,
                               receiver, seq), which links them in job traces */
} tern_prof_event_t;

/* The last session's events, ordered by start. Valid until the next start. */
TERN_API tern_status_t tern_prof_events(const tern_prof_event_t **events, size_t *count);

/* The offsets the last session used, one per remote node seen. */
TERN_API tern_status_t tern_prof_clocks(const tern_prof_clock_t **clocks, size_t *count);

/* One row of key_averages: events of one name on one node. */
typedef struct tern_prof_stat {
    const char *name;
    int node;
    unsigned kind;      /* tern_prof_kind of its events */
    const char *shapes; /* with TERN_PROF_BY_SHAPES */
    uint64_t calls;
    int64_t self_ns, total_ns;
    int64_t self_mem, total_mem;
    uint64_t bytes;
} tern_prof_stat_t;

enum tern_prof_group {
    TERN_PROF_BY_SHAPES = 1u << 0, /* one row per name, node and shapes */
};

typedef struct tern_prof_table tern_prof_table_t;

/* Group the last session's events by name and node (PyTorch's key_averages).
 * The table's names point into the session's results: free it before the
 * next tern_prof_start. */
TERN_API tern_status_t tern_prof_key_averages(unsigned group, tern_prof_table_t **table);
TERN_API void tern_prof_table_free(tern_prof_table_t *table);
TERN_API size_t tern_prof_table_rows(const tern_prof_table_t *table);
TERN_API const tern_prof_stat_t *tern_prof_table_row(const tern_prof_table_t *table, size_t i);
/* The sum of every row's self time: the footer's "Self CPU time total". */
TERN_API int64_t tern_prof_table_self_total(const tern_prof_table_t *table);

enum tern_prof_sort {
    TERN_PROF_SORT_NONE = 0,  /* first seen first */
    TERN_PROF_SORT_SELF_CPU,  /* descending */
    TERN_PROF_SORT_CPU_TOTAL, /* descending */
    TERN_PROF_SORT_CPU_AVG,   /* descending */
    TERN_PROF_SORT_CALLS,     /* descending */
    TERN_PROF_SORT_NAME,      /* ascending */
};

enum tern_prof_print_field {
    TERN_PROF_PRINT_SORT = 1u << 0,
    TERN_PROF_PRINT_LIMIT = 1u << 1,
    TERN_PROF_PRINT_NODE = 1u << 2,
};

typedef struct tern_prof_print {
    uint64_t field_mask;
    unsigned sort; /* tern_prof_sort [NONE] */
    size_t limit;  /* at most this many rows [all] */
    int node;      /* only this node's rows, and its own footer [all] */
} tern_prof_print_t;

/*
 * Print the table as PyTorch does: Name, Self CPU total %, Self CPU total,
 * CPU total %, CPU total, CPU time avg, Number of Calls, Node ID (then Self
 * CPU Mem and CPU Mem when memory was profiled, Input Shapes when grouped by
 * shapes), and the "Self CPU time total" footer.
 */
TERN_API tern_status_t tern_prof_table_print(const tern_prof_table_t *table, FILE *out,
                                             const tern_prof_print_t *options);

/*
 * Write the last session's events as a Trace Event Format file (chrome://tracing,
 * Perfetto): one process row per node, one thread row per thread, remote
 * events on this process's clock; the clock offsets used are in its metadata.
 * Flow arrows link each RPC to the handler that ran for it (request, reply)
 * and, where the results hold both ends (after tern_prof_gather), each
 * message's send to its receive.
 */
TERN_API tern_status_t tern_prof_export_chrome_trace(const char *path);

/* ---- one trace for the whole job ---- */

/*
 * Gather every rank's results onto root: a collective over the world, which
 * every rank calls after its own tern_prof_stop (a rank that never profiled
 * adds nothing). Root estimates each rank's clock by ping-pong, moves that
 * rank's events onto its own clock (their clock_error_ns adds the bounds;
 * -1 where a rank could not be measured) and makes the union its results:
 * tern_prof_events, key_averages (rows per node; print one node's with
 * TERN_PROF_PRINT_NODE), tern_prof_clocks (one per rank) and
 * tern_prof_export_chrome_trace then show the whole job, on root's clock,
 * with every message's send linked to its receive. Root's earlier event
 * pointers and tables are invalid afterwards; other ranks keep their own
 * results. Every rank returns root's outcome (TERN_ERR_NO_RESOURCE when a
 * rank's session still runs).
 */
TERN_API tern_status_t tern_prof_gather(tern_ctx_t *ctx, int root);

/* tern_prof_gather, then tern_prof_export_chrome_trace(path) on root; every
 * rank returns root's outcome. */
TERN_API tern_status_t tern_prof_export_job_trace(tern_ctx_t *ctx, int root, const char *path);

TERN_END_DECLS

#endif
