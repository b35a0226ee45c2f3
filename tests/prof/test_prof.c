/*
 * The profiler in one process (a context of world size 1): sessions (start
 * twice, stop without start), ranges (nesting, depth and self time on one
 * thread, two threads kept apart, handle 0, a range open at stop, a stale
 * handle from the last session, TERN_PROF_SCOPE, bytes, long names),
 * key_averages (calls, totals) and the printed table (columns, footer, sort,
 * limit, one node, memory and shape columns), results replaced by the next
 * session, the result functions' errors, and ranges and an operation timed
 * on the CPU's counter against tern_prof_clock_ns(). Times are only compared
 * with each other: nothing here assumes a speed.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <tern/tern.h>

#include "one_rank.h"

/* ---- helpers ---- */

static void start(unsigned flags)
{
    tern_prof_config_t c = {.field_mask = TERN_PROF_CFG_FLAGS, .flags = flags};
    assert_int_equal(tern_prof_start(ctx, &c), TERN_OK);
    assert_true(tern_prof_enabled());
}

static void stop(void)
{
    assert_int_equal(tern_prof_stop(), TERN_OK);
    assert_false(tern_prof_enabled());
}

static void events(const tern_prof_event_t **ev, size_t *n)
{
    assert_int_equal(tern_prof_events(ev, n), TERN_OK);
    /* Every result: ordered by start, ends after it starts, on this node's
     * clock, self time within the total, unique ids, no parent. */
    for (size_t i = 0; i < *n; i++) {
        const tern_prof_event_t *e = &(*ev)[i];
        assert_non_null(e->name);
        assert_non_null(e->shapes);
        assert_int_equal(e->node, 0);
        assert_int_equal(e->clock_error_ns, 0);
        assert_true(e->end_ns >= e->start_ns);
        assert_true(e->self_ns >= 0 && e->self_ns <= e->end_ns - e->start_ns);
        assert_true(e->depth >= 0);
        assert_int_equal(e->parent, 0);
        if (i > 0)
            assert_true((*ev)[i - 1].start_ns <= e->start_ns);
        for (size_t j = 0; j < i; j++)
            assert_true((*ev)[j].id != e->id);
    }
}

/* The only event named name (fails if there are none or several). */
static const tern_prof_event_t *the(const char *name)
{
    const tern_prof_event_t *ev, *found = NULL;
    size_t n;
    assert_int_equal(tern_prof_events(&ev, &n), TERN_OK);
    for (size_t i = 0; i < n; i++)
        if (strcmp(ev[i].name, name) == 0) {
            if (found != NULL)
                fail_msg("two events named '%s'", name);
            found = &ev[i];
        }
    if (found == NULL)
        fail_msg("no event named '%s'", name);
    return found;
}

static size_t count_named(const char *name)
{
    const tern_prof_event_t *ev;
    size_t n, k = 0;
    assert_int_equal(tern_prof_events(&ev, &n), TERN_OK);
    for (size_t i = 0; i < n; i++)
        k += strcmp(ev[i].name, name) == 0;
    return k;
}

static int64_t dur(const tern_prof_event_t *e)
{
    return e->end_ns - e->start_ns;
}

/* a lies inside b (times). */
static bool inside(const tern_prof_event_t *a, const tern_prof_event_t *b)
{
    return a->start_ns >= b->start_ns && a->end_ns <= b->end_ns;
}

/* The table printed with options (through a tmpfile), as a malloc'ed string. */
static char *print(const tern_prof_table_t *t, const tern_prof_print_t *o)
{
    FILE *f = tmpfile();
    assert_non_null(f);
    assert_int_equal(tern_prof_table_print(t, f, o), TERN_OK);
    long len = ftell(f);
    assert_true(len > 0);
    char *buf = malloc((size_t)len + 1);
    assert_non_null(buf);
    rewind(f);
    assert_int_equal(fread(buf, 1, (size_t)len, f), (size_t)len);
    buf[len] = '\0';
    assert_int_equal(fclose(f), 0);
    return buf;
}

/* The row of name (node 0), or NULL. */
static const tern_prof_stat_t *row(const tern_prof_table_t *t, const char *name)
{
    for (size_t i = 0; i < tern_prof_table_rows(t); i++) {
        const tern_prof_stat_t *r = tern_prof_table_row(t, i);
        if (strcmp(r->name, name) == 0 && r->node == 0)
            return r;
    }
    return NULL;
}

/* The order the names appear in text, as a string "a b c" (of those listed). */
static void order_of(const char *text, const char *const *names, size_t n, char *out, size_t cap)
{
    const char *pos[16];
    assert_true(n <= 16);
    for (size_t i = 0; i < n; i++) {
        /* A row starts a line: "\n<name> ". */
        char needle[64];
        snprintf(needle, sizeof(needle), "\n%s ", names[i]);
        pos[i] = strstr(text, needle);
    }
    out[0] = '\0';
    for (size_t k = 0; k < n; k++) {
        size_t best = n;
        for (size_t i = 0; i < n; i++)
            if (pos[i] != NULL && (best == n || pos[i] < pos[best]))
                best = i;
        if (best == n)
            break;
        snprintf(out + strlen(out), cap - strlen(out), "%s%s", out[0] ? " " : "", names[best]);
        pos[best] = NULL;
    }
}

/* ---- sessions ---- */

static void test_session_errors(void **state)
{
    (void)state;
    const tern_prof_event_t *ev;
    const tern_prof_clock_t *cl;
    tern_prof_table_t *t;
    size_t n;
    assert_false(tern_prof_enabled());
    assert_int_equal(tern_prof_stop(), TERN_ERR_CLOSED);
    assert_int_equal(tern_prof_start(NULL, NULL), TERN_ERR_INVALID_PARAM);
    tern_prof_config_t bad = {.field_mask = TERN_PROF_CFG_FLAGS, .flags = 1u << 20};
    assert_int_equal(tern_prof_start(ctx, &bad), TERN_ERR_INVALID_PARAM);
    bad = (tern_prof_config_t){.field_mask = TERN_PROF_CFG_CLOCK_SAMPLES, .clock_samples = 0};
    assert_int_equal(tern_prof_start(ctx, &bad), TERN_ERR_INVALID_PARAM);
    bad = (tern_prof_config_t){.field_mask = TERN_PROF_CFG_CLOCK_REFRESH, .clock_refresh_ns = -1};
    assert_int_equal(tern_prof_start(ctx, &bad), TERN_ERR_INVALID_PARAM);
    assert_false(tern_prof_enabled());

    assert_int_equal(tern_prof_start(ctx, NULL), TERN_OK);
    assert_true(tern_prof_enabled());
    assert_int_equal(tern_prof_start(ctx, NULL), TERN_ERR_NO_RESOURCE);
    assert_true(tern_prof_enabled());
    /* Results are read after stop. */
    assert_int_equal(tern_prof_events(&ev, &n), TERN_ERR_NO_RESOURCE);
    assert_int_equal(tern_prof_clocks(&cl, &n), TERN_ERR_NO_RESOURCE);
    assert_int_equal(tern_prof_key_averages(0, &t), TERN_ERR_NO_RESOURCE);
    assert_int_equal(tern_prof_export_chrome_trace("/dev/null"), TERN_ERR_NO_RESOURCE);
    stop();
    assert_int_equal(tern_prof_stop(), TERN_ERR_CLOSED);

    assert_int_equal(tern_prof_events(NULL, &n), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_prof_events(&ev, NULL), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_prof_clocks(NULL, &n), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_prof_key_averages(0, NULL), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_prof_export_chrome_trace(NULL), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_prof_export_chrome_trace("/nonexistent-dir/trace.json"), TERN_ERR_IO);
    assert_int_equal(tern_prof_table_print(NULL, stdout, NULL), TERN_ERR_INVALID_PARAM);
    /* An empty session: no events, no clocks, an empty table. */
    assert_int_equal(tern_prof_events(&ev, &n), TERN_OK);
    assert_int_equal(n, 0);
    assert_int_equal(tern_prof_clocks(&cl, &n), TERN_OK);
    assert_int_equal(n, 0);
    assert_int_equal(tern_prof_key_averages(0, &t), TERN_OK);
    assert_int_equal(tern_prof_table_rows(t), 0);
    assert_null(tern_prof_table_row(t, 0));
    assert_int_equal(tern_prof_table_self_total(t), 0);
    tern_prof_print_t o = {.field_mask = TERN_PROF_PRINT_SORT, .sort = 99};
    assert_int_equal(tern_prof_table_print(t, stdout, &o), TERN_ERR_INVALID_PARAM);
    char *s = print(t, NULL);
    assert_non_null(strstr(s, "Self CPU time total: "));
    free(s);
    tern_prof_table_free(t);
    tern_prof_table_free(NULL);
}

static void test_off(void **state)
{
    (void)state;
    assert_false(tern_prof_enabled());
    tern_prof_range_t r = tern_prof_range_begin("off");
    assert_true(r == 0);
    tern_prof_range_bytes(r, 10);
    tern_prof_range_end(r);
    tern_prof_range_end(0);
    {
        TERN_PROF_SCOPE("off scope");
    }
    /* Ranges from before the session are not in it. */
    start(0);
    tern_prof_range_t on = tern_prof_range_begin("on");
    assert_true(on != 0);
    assert_true(tern_prof_range_begin(NULL) == 0);
    tern_prof_range_end(0); /* a no-op: "on" stays open until its own end */
    tern_prof_range_bytes(0, 5);
    int64_t before_end = tern_prof_clock_ns();
    tern_prof_range_end(on);
    stop();
    const tern_prof_event_t *ev;
    size_t n;
    events(&ev, &n);
    assert_int_equal(n, 1);
    assert_string_equal(ev[0].name, "on");
    assert_true(ev[0].end_ns >= before_end);
    assert_int_equal(ev[0].kind, TERN_PROF_KIND_RANGE);
    assert_int_equal(ev[0].depth, 0);
    assert_int_equal(ev[0].bytes, 0);
    /* Off again. */
    assert_true(tern_prof_range_begin("after") == 0);
}

/* ---- ranges ---- */

static void test_nesting(void **state)
{
    (void)state;
    start(0);
    tern_prof_range_t outer = tern_prof_range_begin("outer");
    tern_prof_range_t a = tern_prof_range_begin("a");
    tern_prof_range_t a1 = tern_prof_range_begin("a1");
    tern_prof_range_end(a1);
    tern_prof_range_t a2 = tern_prof_range_begin("a2");
    tern_prof_range_bytes(a2, 1000);
    tern_prof_range_bytes(a2, 24);
    tern_prof_range_end(a2);
    tern_prof_range_end(a);
    tern_prof_range_t b = tern_prof_range_begin("b");
    tern_prof_range_end(b);
    tern_prof_range_end(outer);
    tern_prof_range_t after = tern_prof_range_begin("after");
    tern_prof_range_end(after);
    stop();

    const tern_prof_event_t *ev;
    size_t n;
    events(&ev, &n);
    assert_int_equal(n, 6);
    const tern_prof_event_t *eo = the("outer"), *ea = the("a"), *ea1 = the("a1"), *ea2 = the("a2"),
                            *eb = the("b"), *eaf = the("after");
    /* One thread; ordered by start; children inside their parents. */
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(ev[i].thread, eo->thread);
        assert_int_equal(ev[i].kind, TERN_PROF_KIND_RANGE);
    }
    assert_string_equal(ev[0].name, "outer");
    assert_string_equal(ev[1].name, "a");
    assert_string_equal(ev[2].name, "a1");
    assert_string_equal(ev[3].name, "a2");
    assert_string_equal(ev[4].name, "b");
    assert_string_equal(ev[5].name, "after");
    assert_true(inside(ea, eo) && inside(eb, eo) && inside(ea1, ea) && inside(ea2, ea));
    assert_true(ea->end_ns <= eb->start_ns && ea1->end_ns <= ea2->start_ns);
    assert_true(eo->end_ns <= eaf->start_ns);
    assert_int_equal(eo->depth, 0);
    assert_int_equal(ea->depth, 1);
    assert_int_equal(ea1->depth, 2);
    assert_int_equal(ea2->depth, 2);
    assert_int_equal(eb->depth, 1);
    assert_int_equal(eaf->depth, 0);
    /* Self time: the total minus the direct children's totals. */
    assert_int_equal(eo->self_ns, dur(eo) - dur(ea) - dur(eb));
    assert_int_equal(ea->self_ns, dur(ea) - dur(ea1) - dur(ea2));
    assert_int_equal(ea1->self_ns, dur(ea1));
    assert_int_equal(ea2->self_ns, dur(ea2));
    assert_int_equal(eb->self_ns, dur(eb));
    assert_int_equal(eaf->self_ns, dur(eaf));
    assert_int_equal(ea2->bytes, 1024);
    assert_int_equal(ea->bytes, 0);

    /* key_averages: one row each; the footer's total is the sum of self times. */
    tern_prof_table_t *t;
    assert_int_equal(tern_prof_key_averages(0, &t), TERN_OK);
    assert_int_equal(tern_prof_table_rows(t), 6);
    int64_t self = 0;
    for (size_t i = 0; i < n; i++)
        self += ev[i].self_ns;
    assert_int_equal(tern_prof_table_self_total(t), self);
    const tern_prof_stat_t *r = row(t, "outer");
    assert_non_null(r);
    assert_int_equal(r->calls, 1);
    assert_int_equal(r->total_ns, dur(eo));
    assert_int_equal(r->self_ns, eo->self_ns);
    assert_int_equal(r->kind, TERN_PROF_KIND_RANGE);
    assert_int_equal(row(t, "a2")->bytes, 1024);
    tern_prof_table_free(t);
}

static void nest_scopes(int k)
{
    TERN_PROF_SCOPE("scope");
    if (k > 0)
        nest_scopes(k - 1);
}

static void test_scope(void **state)
{
    (void)state;
    start(0);
    {
        TERN_PROF_SCOPE("block");
        TERN_PROF_SCOPE("second in block");
        nest_scopes(2);
    }
    tern_prof_range_t r = tern_prof_range_begin("after block");
    tern_prof_range_end(r);
    stop();
    const tern_prof_event_t *ev;
    size_t n;
    events(&ev, &n);
    assert_int_equal(n, 6);
    const tern_prof_event_t *blk = the("block"), *sec = the("second in block"),
                            *aft = the("after block");
    assert_int_equal(blk->depth, 0);
    assert_int_equal(sec->depth, 1);
    assert_true(inside(sec, blk));
    /* The scopes closed at the end of their blocks, in reverse order. */
    assert_true(blk->end_ns <= aft->start_ns);
    assert_int_equal(aft->depth, 0);
    assert_int_equal(count_named("scope"), 3);
    int depths = 0;
    for (size_t i = 0; i < n; i++)
        if (strcmp(ev[i].name, "scope") == 0) {
            assert_true(inside(&ev[i], sec));
            depths |= 1 << ev[i].depth;
        }
    assert_int_equal(depths, (1 << 2) | (1 << 3) | (1 << 4));
}

/* Names are copied at begin; long ones too. */
static void test_names(void **state)
{
    (void)state;
    char buf[300];
    memset(buf, 'x', sizeof(buf) - 1);
    buf[sizeof(buf) - 1] = '\0';
    memcpy(buf, "long:", 5);
    char want[300];
    memcpy(want, buf, sizeof(buf));
    char shortname[16] = "short";
    start(0);
    tern_prof_range_t a = tern_prof_range_begin(buf);
    tern_prof_range_t b = tern_prof_range_begin(shortname);
    memset(buf, 'y', 20);
    strcpy(shortname, "changed");
    tern_prof_range_end(b);
    tern_prof_range_end(a);
    stop();
    assert_int_equal(strlen(the(want)->name), sizeof(buf) - 1);
    assert_int_equal(the("short")->depth, 1);
    assert_int_equal(count_named("changed"), 0);
}

typedef struct two {
    pthread_barrier_t bar;
    tern_prof_range_t outer, inner;
} two_t;

/* Thread B opens and closes its ranges while A's outer range is open; then exits. */
static void *thread_b(void *arg)
{
    two_t *t = arg;
    pthread_barrier_wait(&t->bar); /* A's outer is open */
    tern_prof_range_t o = tern_prof_range_begin("b outer");
    tern_prof_range_t i = tern_prof_range_begin("b inner");
    tern_prof_range_end(i);
    tern_prof_range_end(o);
    /* One left open by a thread that exits: it ends at stop. */
    (void)tern_prof_range_begin("b left open");
    pthread_barrier_wait(&t->bar);
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    two_t t;
    pthread_t th;
    pthread_barrier_init(&t.bar, NULL, 2);
    start(0);
    assert_int_equal(pthread_create(&th, NULL, thread_b, &t), 0);
    tern_prof_range_t o = tern_prof_range_begin("a outer");
    pthread_barrier_wait(&t.bar);
    pthread_barrier_wait(&t.bar); /* B is done */
    tern_prof_range_t i = tern_prof_range_begin("a inner");
    tern_prof_range_end(i);
    tern_prof_range_end(o);
    assert_int_equal(pthread_join(th, NULL), 0); /* B has exited: its events stay */
    int64_t before_stop = tern_prof_clock_ns();
    stop();
    int64_t after_stop = tern_prof_clock_ns();
    pthread_barrier_destroy(&t.bar);

    const tern_prof_event_t *ev;
    size_t n;
    events(&ev, &n);
    assert_int_equal(n, 5);
    const tern_prof_event_t *ao = the("a outer"), *ai = the("a inner"), *bo = the("b outer"),
                            *bi = the("b inner"), *bl = the("b left open");
    assert_int_equal(ao->thread, ai->thread);
    assert_int_equal(bo->thread, bi->thread);
    assert_int_equal(bo->thread, bl->thread);
    assert_true(ao->thread != bo->thread);
    /* B's ranges lie inside A's outer in time, but on another thread: not
     * its children. */
    assert_true(inside(bo, ao));
    assert_int_equal(ao->depth, 0);
    assert_int_equal(ai->depth, 1);
    assert_int_equal(bo->depth, 0);
    assert_int_equal(bi->depth, 1);
    assert_int_equal(bl->depth, 0);
    assert_int_equal(ao->self_ns, dur(ao) - dur(ai));
    assert_int_equal(bo->self_ns, dur(bo) - dur(bi));
    /* The one left open ended at stop. */
    assert_true(bl->end_ns >= before_stop && bl->end_ns <= after_stop);
}

static void test_open_at_stop(void **state)
{
    (void)state;
    start(0);
    tern_prof_range_t open1 = tern_prof_range_begin("open");
    tern_prof_range_t in = tern_prof_range_begin("closed inside");
    tern_prof_range_end(in);
    int64_t before_stop = tern_prof_clock_ns();
    stop();
    int64_t after_stop = tern_prof_clock_ns();
    const tern_prof_event_t *ev;
    size_t n;
    events(&ev, &n);
    assert_int_equal(n, 2);
    const tern_prof_event_t *o = the("open");
    assert_true(o->end_ns >= before_stop && o->end_ns <= after_stop);
    assert_int_equal(the("closed inside")->depth, 1);
    int64_t end = o->end_ns;
    /* Ending it now changes nothing. */
    tern_prof_range_end(open1);
    assert_int_equal(the("open")->end_ns, end);

    /* The old handle must not end a range of the next session that sits at
     * the same place in this thread's buffer. */
    start(0);
    tern_prof_range_t fresh = tern_prof_range_begin("fresh");
    assert_true(fresh != open1);
    tern_prof_range_end(open1);
    tern_prof_range_t inner = tern_prof_range_begin("fresh inner");
    tern_prof_range_end(inner);
    before_stop = tern_prof_clock_ns();
    stop();
    const tern_prof_event_t *f = the("fresh");
    assert_true(f->end_ns >= before_stop);
    assert_true(inside(the("fresh inner"), f));
    assert_int_equal(the("fresh inner")->depth, 1);
    tern_prof_range_end(fresh);
}

/* ---- results ---- */

static void repeat(const char *name, int k)
{
    for (int i = 0; i < k; i++) {
        tern_prof_range_t r = tern_prof_range_begin(name);
        tern_prof_range_end(r);
    }
}

static const char *const COLUMNS[] = {
    "Name",      "Self CPU total %", "Self CPU total",  "CPU total %",
    "CPU total", "CPU time avg",     "Number of Calls", "Node ID"};

static void test_key_averages(void **state)
{
    (void)state;
    start(0);
    /* First seen: gamma, beta, alpha; calls: alpha 5, beta 3, gamma 1. */
    repeat("gamma", 1);
    repeat("beta", 2);
    repeat("alpha", 5);
    repeat("beta", 1);
    stop();
    tern_prof_table_t *t;
    assert_int_equal(tern_prof_key_averages(0, &t), TERN_OK);
    assert_int_equal(tern_prof_table_rows(t), 3);
    /* Rows in the order first seen. */
    assert_string_equal(tern_prof_table_row(t, 0)->name, "gamma");
    assert_string_equal(tern_prof_table_row(t, 1)->name, "beta");
    assert_string_equal(tern_prof_table_row(t, 2)->name, "alpha");
    assert_null(tern_prof_table_row(t, 3));
    assert_int_equal(row(t, "alpha")->calls, 5);
    assert_int_equal(row(t, "beta")->calls, 3);
    assert_int_equal(row(t, "gamma")->calls, 1);
    /* Totals are the sums over the events. */
    const tern_prof_event_t *ev;
    size_t n;
    events(&ev, &n);
    assert_int_equal(n, 9);
    int64_t total = 0, self = 0;
    for (size_t i = 0; i < n; i++)
        if (strcmp(ev[i].name, "alpha") == 0) {
            total += dur(&ev[i]);
            self += ev[i].self_ns;
        }
    assert_int_equal(row(t, "alpha")->total_ns, total);
    assert_int_equal(row(t, "alpha")->self_ns, self);
    assert_int_equal(row(t, "alpha")->node, 0);
    assert_string_equal(row(t, "alpha")->shapes, "");

    /* The table: a rule, the header with every column, the rows, the footer. */
    char *s = print(t, NULL);
    for (size_t i = 0; i < sizeof(COLUMNS) / sizeof(COLUMNS[0]); i++)
        if (strstr(s, COLUMNS[i]) == NULL)
            fail_msg("no column '%s' in:\n%s", COLUMNS[i], s);
    assert_null(strstr(s, "Self CPU Mem"));
    assert_null(strstr(s, "Input Shapes"));
    assert_true(strncmp(s, "----", 4) == 0);
    const char *hdr = strstr(s, "Name");
    assert_true(hdr < strstr(s, "Self CPU total %") &&
                strstr(s, "Number of Calls") < strstr(s, "Node ID"));
    const char *foot = strstr(s, "\nSelf CPU time total: ");
    assert_non_null(foot);
    assert_int_equal(foot[strlen(foot) - 1], '\n');
    assert_true(strchr(foot + 1, '\n') == foot + strlen(foot) - 1); /* the last line */
    /* The rows carry their call counts. */
    assert_non_null(strstr(s, "\nalpha "));
    char order[64];
    const char *names[3] = {"alpha", "beta", "gamma"};
    order_of(s, names, 3, order, sizeof(order));
    assert_string_equal(order, "gamma beta alpha");
    free(s);

    tern_prof_print_t o = {.field_mask = TERN_PROF_PRINT_SORT, .sort = TERN_PROF_SORT_CALLS};
    s = print(t, &o);
    order_of(s, names, 3, order, sizeof(order));
    assert_string_equal(order, "alpha beta gamma");
    free(s);
    o.sort = TERN_PROF_SORT_NAME;
    s = print(t, &o);
    order_of(s, names, 3, order, sizeof(order));
    assert_string_equal(order, "alpha beta gamma");
    free(s);
    o.sort = TERN_PROF_SORT_NONE;
    s = print(t, &o);
    order_of(s, names, 3, order, sizeof(order));
    assert_string_equal(order, "gamma beta alpha");
    free(s);
    /* Sorting the print leaves the table's own order alone. */
    assert_string_equal(tern_prof_table_row(t, 0)->name, "gamma");

    o = (tern_prof_print_t){.field_mask = TERN_PROF_PRINT_SORT | TERN_PROF_PRINT_LIMIT,
                            .sort = TERN_PROF_SORT_CALLS,
                            .limit = 2};
    s = print(t, &o);
    order_of(s, names, 3, order, sizeof(order));
    assert_string_equal(order, "alpha beta");
    free(s);

    /* One node: this one has every row; another has none, and its footer
     * says 0. */
    o = (tern_prof_print_t){.field_mask = TERN_PROF_PRINT_NODE, .node = 0};
    s = print(t, &o);
    order_of(s, names, 3, order, sizeof(order));
    assert_string_equal(order, "gamma beta alpha");
    assert_non_null(strstr(s, "Self CPU time total (node 0): "));
    free(s);
    o.node = 1;
    s = print(t, &o);
    order_of(s, names, 3, order, sizeof(order));
    assert_string_equal(order, "");
    assert_non_null(strstr(s, "Self CPU time total (node 1): 0.000us\n"));
    free(s);
    tern_prof_table_free(t);

    /* By shapes: the Input Shapes column (ranges have none). */
    assert_int_equal(tern_prof_key_averages(TERN_PROF_BY_SHAPES, &t), TERN_OK);
    assert_int_equal(tern_prof_table_rows(t), 3);
    s = print(t, NULL);
    assert_non_null(strstr(s, "Input Shapes"));
    free(s);
    tern_prof_table_free(t);
}

static void test_memory_columns(void **state)
{
    (void)state;
    start(TERN_PROF_MEMORY);
    repeat("m", 2);
    stop();
    tern_prof_table_t *t;
    assert_int_equal(tern_prof_key_averages(0, &t), TERN_OK);
    char *s = print(t, NULL);
    const char *a = strstr(s, "Self CPU Mem"), *b = strstr(s, "  CPU Mem");
    if (a == NULL || b == NULL || strstr(s, "Node ID") > a)
        fail_msg("no memory columns after Node ID in:\n%s", s);
    /* The row carries a value under each: "<n> b". */
    assert_non_null(strstr(s, " b  "));
    free(s);
    tern_prof_table_free(t);
    /* The next session without the flag has no memory columns. */
    start(0);
    repeat("m", 1);
    stop();
    assert_int_equal(tern_prof_key_averages(0, &t), TERN_OK);
    s = print(t, NULL);
    assert_null(strstr(s, "CPU Mem"));
    free(s);
    tern_prof_table_free(t);
}

static void test_replaced(void **state)
{
    (void)state;
    start(0);
    repeat("first", 3);
    stop();
    assert_int_equal(count_named("first"), 3);
    /* Reading results does not consume them. */
    assert_int_equal(count_named("first"), 3);
    start(0);
    repeat("second", 2);
    stop();
    const tern_prof_event_t *ev;
    size_t n;
    events(&ev, &n);
    assert_int_equal(n, 2);
    assert_int_equal(count_named("first"), 0);
    assert_int_equal(count_named("second"), 2);
    tern_prof_table_t *t;
    assert_int_equal(tern_prof_key_averages(0, &t), TERN_OK);
    assert_int_equal(tern_prof_table_rows(t), 1);
    assert_string_equal(tern_prof_table_row(t, 0)->name, "second");
    assert_int_equal(tern_prof_table_row(t, 0)->calls, 2);
    tern_prof_table_free(t);
    /* Starting drops the last results even before the next stop. */
    start(0);
    repeat("third", 1);
    stop();
    assert_int_equal(count_named("second"), 0);
    assert_int_equal(count_named("third"), 1);
}

/* The clock: with world size 1 the only peer is this rank (offset 0). */
static void test_clock(void **state)
{
    (void)state;
    int64_t a = tern_prof_clock_ns(), b = tern_prof_clock_ns();
    assert_true(b >= a);
    tern_prof_clock_t c;
    assert_int_equal(tern_prof_clock_estimate(ctx, 0, 0, &c), TERN_OK);
    assert_int_equal(c.peer, 0);
    assert_int_equal(c.offset_ns, 0);
    assert_int_equal(c.error_bound_ns, 0);
    assert_int_equal(tern_prof_clock_estimate(ctx, 1, 0, &c), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_prof_clock_estimate(ctx, -1, 0, &c), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_prof_clock_estimate(NULL, 0, 0, &c), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_prof_clock_estimate(ctx, 0, 0, NULL), TERN_ERR_INVALID_PARAM);
}

/*
 * Records are timed on the CPU's counter where there is a usable one, and
 * put on the profiler clock at stop through a point taken at start and one at
 * stop. Each range must lie between tern_prof_clock_ns() read just before
 * and just after it, but for the error of those points (tens of ns); a
 * conversion on the wrong line, or ticks left as ticks, is off by far more.
 * Nesting stays exact: with a collective (an operation, filed on this
 * thread's buffer at its end) inside ranges, and over a session of some
 * milliseconds and one of a few microseconds.
 */
#define CLOCK_SLACK_NS 1000

static void between(const tern_prof_event_t *e, int64_t before, int64_t after)
{
    if (e->start_ns < before - CLOCK_SLACK_NS || e->end_ns > after + CLOCK_SLACK_NS)
        fail_msg("'%s' at [%lld, %lld] ns, read around it [%lld, %lld]", e->name,
                 (long long)e->start_ns, (long long)e->end_ns, (long long)before, (long long)after);
}

static void test_counter_clock(void **state)
{
    (void)state;
    enum { K = 40 };
    int64_t before[K], after[K];
    tern_group_t *world = tern_group_world(ctx);
    assert_non_null(world);
    int32_t x = 1, y = 0;
    start(0);
    for (int k = 0; k < K; k++) {
        char name[32], inner[32];
        snprintf(name, sizeof(name), "tick %d", k);
        snprintf(inner, sizeof(inner), "tick %d inner", k);
        before[k] = tern_prof_clock_ns();
        tern_prof_range_t o = tern_prof_range_begin(name);
        tern_prof_range_t i = tern_prof_range_begin(inner);
        if (k == K / 2)
            assert_int_equal(tern_all_reduce(world, &x, &y, 1, TERN_DTYPE_I32, TERN_SUM, NULL),
                             TERN_OK);
        tern_prof_range_end(i);
        tern_prof_range_end(o);
        after[k] = tern_prof_clock_ns();
        if (k % 10 == 9)
            usleep(2000);
    }
    stop();
    assert_int_equal(y, 1);
    for (int k = 0; k < K; k++) {
        char name[32], inner[32];
        snprintf(name, sizeof(name), "tick %d", k);
        snprintf(inner, sizeof(inner), "tick %d inner", k);
        const tern_prof_event_t *o = the(name), *i = the(inner);
        between(o, before[k], after[k]);
        between(i, before[k], after[k]);
        assert_true(inside(i, o));
        assert_int_equal(o->depth, 0);
        assert_int_equal(i->depth, 1);
        assert_int_equal(o->self_ns, dur(o) - dur(i));
    }
    /* The collective: an operation (no depth, nests nothing), inside the
     * ranges it ran in, on the same clock. */
    const tern_prof_event_t *ev, *coll = NULL;
    size_t n;
    events(&ev, &n);
    for (size_t j = 0; j < n; j++)
        if (ev[j].kind == TERN_PROF_KIND_COLL)
            coll = &ev[j];
    assert_non_null(coll);
    char mid[32];
    snprintf(mid, sizeof(mid), "tick %d inner", K / 2);
    assert_true(inside(coll, the(mid)));
    between(coll, before[K / 2], after[K / 2]);

    /* A session of a few microseconds: its two points are close together. */
    start(0);
    int64_t b0 = tern_prof_clock_ns();
    tern_prof_range_t o = tern_prof_range_begin("short");
    tern_prof_range_t i = tern_prof_range_begin("short inner");
    tern_prof_range_end(i);
    tern_prof_range_end(o);
    int64_t a0 = tern_prof_clock_ns();
    stop();
    between(the("short"), b0, a0);
    assert_true(inside(the("short inner"), the("short")));
    assert_int_equal(the("short inner")->depth, 1);
}

/* A range ended twice keeps its first end (the second rewrote it: a 10 ms
 * range became 210 ms), and the range after it is untouched. */
static void test_end_twice(void **state)
{
    (void)state;
    start(0);
    int64_t before = tern_prof_clock_ns();
    tern_prof_range_t r = tern_prof_range_begin("ended twice");
    tern_prof_range_end(r);
    int64_t after = tern_prof_clock_ns();
    tern_prof_range_t next = tern_prof_range_begin("next");
    struct timespec nap = {0, 20 * 1000 * 1000};
    nanosleep(&nap, NULL);
    tern_prof_range_end(r);
    tern_prof_range_end(next);
    stop();
    between(the("ended twice"), before, after);
    assert_true(the("next")->end_ns - the("next")->start_ns >= 20 * 1000 * 1000);
}

/* A range begun on another thread (other_range) and ended on this one: its
 * handle names a record of that thread's buffer, and the record at the same
 * index in this thread's was ended in its place (a range open 20 ms recorded
 * as a few us). It is ignored now, with a warning. */
static void *other_range(void *arg)
{
    tern_prof_range_t *h = arg;
    *h = tern_prof_range_begin("other thread's");
    tern_prof_range_end(*h);
    return NULL;
}

static void test_end_on_other_thread(void **state)
{
    (void)state;
    start(0);
    /* This thread's first range of the session, at the index the other
     * thread's first one has in its buffer. */
    tern_prof_range_t mine = tern_prof_range_begin("mine");
    tern_prof_range_t theirs = 0;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, other_range, &theirs), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_true(theirs != 0);
    tern_prof_range_end(theirs); /* the wrong thread */
    struct timespec nap = {0, 20 * 1000 * 1000};
    nanosleep(&nap, NULL);
    tern_prof_range_end(mine);
    stop();
    assert_true(the("mine")->end_ns - the("mine")->start_ns >= 20 * 1000 * 1000);
    assert_non_null(the("other thread's"));
}

/* tern_finalize with a session running on its context stops the session
 * (which kept the freed context: tern_prof_stop afterwards read it); the
 * results stay readable, and a later stop says no session runs. */
static void test_finalize_running(void **state)
{
    (void)state;
    tern_store_t *st2;
    tern_ctx_t *c2;
    assert_int_equal(tern_store_memory_create(1, 10 * SEC, &st2), TERN_OK);
    assert_int_equal(one_rank_init(st2, &c2), TERN_OK);
    assert_int_equal(tern_prof_start(c2, NULL), TERN_OK);
    tern_prof_range_end(tern_prof_range_begin("before finalize"));
    assert_int_equal(tern_finalize(c2), TERN_OK);
    assert_false(tern_prof_enabled());
    assert_int_equal(tern_prof_stop(), TERN_ERR_CLOSED);
    const tern_prof_event_t *ev;
    size_t n;
    assert_int_equal(tern_prof_events(&ev, &n), TERN_OK);
    bool found = false;
    for (size_t i = 0; i < n; i++)
        found |= strcmp(ev[i].name, "before finalize") == 0;
    assert_true(found);
    tern_store_close(st2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_finalize_running),
        cmocka_unit_test(test_end_twice),
        cmocka_unit_test(test_end_on_other_thread),
        cmocka_unit_test(test_session_errors),
        cmocka_unit_test(test_off),
        cmocka_unit_test(test_nesting),
        cmocka_unit_test(test_scope),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_open_at_stop),
        cmocka_unit_test(test_key_averages),
        cmocka_unit_test(test_memory_columns),
        cmocka_unit_test(test_replaced),
        cmocka_unit_test(test_clock),
        cmocka_unit_test(test_counter_clock),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
