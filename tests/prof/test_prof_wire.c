/*
 * The profiler's two wire forms, which come from other processes and so are
 * checked like any network input: a profiled handler's events in an RPC
 * reply (prof/record.c) and a rank's results in the job gather (prof/job.c).
 * A valid form decodes to what was encoded; every truncation and each
 * corrupted field is an error, never a crash or an over-read (run under
 * AddressSanitizer in CI). Also the job gather in a world of one.
 */
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

#include "core/bytes.h"
#include "prof/job.h"
#include "prof/record.h"
#include "prof/session.h"

#include "one_rank.h"

/* ---- a handler's events in a reply ---- */

typedef struct got {
    size_t n;
    char names[4][64];
    uint64_t seq[4];
    int peer[4];
    uint16_t flags[4];
} got_t;

static tern_status_t take(tern__prof_rec_t *r, void *arg)
{
    got_t *g = arg;
    if (g->n < 4) {
        snprintf(g->names[g->n], sizeof(g->names[0]), "%s", tern__prof_rec_name(r));
        g->seq[g->n] = r->seq;
        g->peer[g->n] = r->peer;
        g->flags[g->n] = r->flags;
    }
    g->n++;
    tern__prof_rec_clear(r);
    return TERN_OK;
}

/* A capture with a handler and a range marked as a message, encoded. */
static uint8_t *captured(size_t *len)
{
    tern__prof_capture_t *c = tern__prof_capture_new(0);
    assert_non_null(c);
    tern__prof_capture_t *old = tern__prof_capture_enter(c);
    tern_prof_range_t r = tern_prof_range_begin("inner range");
    assert_int_not_equal(r, 0);
    tern__prof_range_msg(r, 3, TERN_PROF_DIR_SEND, 77);
    tern_prof_range_end(r);
    tern__prof_capture_enter(old);
    tern__prof_capture_handler(c, "the handler", 10, 20, 0, "[[3, 3]]");
    size_t size = tern__prof_capture_size(c);
    uint8_t *buf = malloc(size);
    assert_non_null(buf);
    *len = tern__prof_capture_encode(c, buf, size);
    assert_int_equal(*len, size);
    tern__prof_capture_put(c);
    return buf;
}

static void test_reply_events(void **state)
{
    (void)state;
    size_t len;
    uint8_t *buf = captured(&len);
    got_t g = {0};
    uint32_t dropped = 1;
    assert_int_equal(tern__prof_decode(buf, len, &dropped, take, &g), TERN_OK);
    assert_int_equal(dropped, 0);
    assert_int_equal(g.n, 2);
    assert_string_equal(g.names[0], "inner range");
    assert_int_equal(g.seq[0], 77);
    assert_int_equal(g.peer[0], 3);
    assert_true(g.flags[0] & TERN__REC_SEND);
    assert_string_equal(g.names[1], "the handler");

    /* Every cut short of the whole is an error: the head says two events. */
    for (size_t cut = 0; cut < len; cut++) {
        uint8_t *copy = malloc(cut ? cut : 1); /* exactly cut bytes: ASan sees over-reads */
        assert_non_null(copy);
        memcpy(copy, buf, cut);
        got_t h = {0};
        assert_int_equal(tern__prof_decode(copy, cut, &dropped, take, &h), TERN_ERR_PROTOCOL);
        free(copy);
    }
    /* A name length past the end. */
    uint8_t *bad = malloc(len);
    assert_non_null(bad);
    memcpy(bad, buf, len);
    tern__put_le16(bad + 8 + 62, 0xffff);
    got_t h = {0};
    assert_int_equal(tern__prof_decode(bad, len, &dropped, take, &h), TERN_ERR_PROTOCOL);
    /* A count larger than what follows. */
    memcpy(bad, buf, len);
    tern__put_le32(bad, 1000);
    h.n = 0;
    assert_int_equal(tern__prof_decode(bad, len, &dropped, take, &h), TERN_ERR_PROTOCOL);
    assert_int_equal(h.n, 2); /* the two whole ones were handed over (and freed) */
    free(bad);
    free(buf);
}

/* ---- a rank's blob in the job gather ---- */

static uint8_t *blob_of_session(size_t *len, size_t *nevents)
{
    assert_int_equal(tern_prof_start(ctx, NULL), TERN_OK);
    tern_prof_range_t a = tern_prof_range_begin("outer");
    tern_prof_range_end(tern_prof_range_begin("inner"));
    tern_prof_range_end(a);
    assert_int_equal(tern_prof_stop(), TERN_OK);
    const tern_prof_event_t *ev;
    assert_int_equal(tern_prof_events(&ev, nevents), TERN_OK);
    assert_int_equal(*nevents, 2);
    uint8_t head[TERN__PROF_JOB_HEAD];
    uint8_t *b = tern__prof_job_encode(head, len);
    assert_ptr_not_equal(b, head);
    return b;
}

static tern_status_t check(const uint8_t *b, size_t len)
{
    /* Exactly len bytes of heap, so an over-read is caught. */
    uint8_t *copy = malloc(len ? len : 1);
    assert_non_null(copy);
    memcpy(copy, b, len);
    size_t n = 0, strs = 0;
    tern_status_t st = tern__prof_job_check(copy, len, 1, 2, &n, &strs);
    free(copy);
    return st;
}

static void test_job_blob(void **state)
{
    (void)state;
    size_t len, nev, n = 0, strs = 0;
    uint8_t *b = blob_of_session(&len, &nev);
    assert_int_equal(tern__prof_job_check(b, len, 0, 1, &n, &strs), TERN_OK);
    assert_int_equal(n, nev);
    assert_int_equal(strs, strlen("outer") + 1 + 1 + strlen("inner") + 1 + 1);

    for (size_t cut = 0; cut < len; cut++)
        assert_int_equal(check(b, cut), TERN_ERR_PROTOCOL);

    uint8_t *bad = malloc(len + 1);
    assert_non_null(bad);
    const size_t ev0 = TERN__PROF_JOB_HEAD; /* no message: the first event */
    struct {
        size_t at, width;
        uint64_t value;
    } corrupt[] = {
        {0, 4, 0x12345678},      /* magic */
        {4, 4, TERN_INPROGRESS}, /* a status that is not an error */
        {4, 4, (uint32_t)-1000}, /* nor one of tern's */
        {8, 8, 3},               /* more events than there are */
        {28, 4, 1u << 30},       /* a message longer than the blob */
        {ev0 + 88, 4, 2},        /* node outside the world of 2 */
        {ev0 + 88, 4, (uint32_t)-1},
        {ev0 + 100, 2, 99},      /* kind */
        {ev0 + 102, 2, 7},       /* dir */
        {ev0 + 104, 4, 1u << 31}, /* name length */
        {ev0 + 108, 4, 0xffffffffu}, /* shapes length */
    };
    for (size_t i = 0; i < sizeof(corrupt) / sizeof(corrupt[0]); i++) {
        memcpy(bad, b, len);
        if (corrupt[i].width == 2)
            tern__put_le16(bad + corrupt[i].at, (uint16_t)corrupt[i].value);
        else if (corrupt[i].width == 4)
            tern__put_le32(bad + corrupt[i].at, (uint32_t)corrupt[i].value);
        else
            tern__put_le64(bad + corrupt[i].at, corrupt[i].value);
        assert_int_equal(check(bad, len), TERN_ERR_PROTOCOL);
    }
    /* A byte past the last event. */
    memcpy(bad, b, len);
    bad[len] = 0;
    assert_int_equal(check(bad, len + 1), TERN_ERR_PROTOCOL);
    free(bad);
    free(b);

    /* A rank without results says why, and that is the error. */
    assert_int_equal(tern_prof_start(ctx, NULL), TERN_OK);
    uint8_t head[TERN__PROF_JOB_HEAD];
    b = tern__prof_job_encode(head, &len);
    assert_int_equal(tern_prof_stop(), TERN_OK);
    assert_int_equal(tern__prof_job_check(b, len, 1, 2, &n, &strs), TERN_ERR_NO_RESOURCE);
    assert_non_null(strstr(tern_last_error(), "rank 1"));
    assert_non_null(strstr(tern_last_error(), "still running"));
    if (b != head)
        free(b);
}

/* ---- the gather in a world of one ---- */

static void test_gather_alone(void **state)
{
    (void)state;
    size_t len, nev;
    free(blob_of_session(&len, &nev));
    assert_int_equal(tern_prof_gather(ctx, 1), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_prof_gather(NULL, 0), TERN_ERR_INVALID_PARAM);

    char path[] = "/tmp/tern-prof-job-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(tern_prof_export_job_trace(ctx, 0, path), TERN_OK);
    const tern_prof_event_t *ev;
    size_t n;
    assert_int_equal(tern_prof_events(&ev, &n), TERN_OK);
    assert_int_equal(n, nev);
    assert_string_equal(ev[0].name, "outer");
    assert_int_equal(ev[0].depth, 0);
    assert_int_equal(ev[1].depth, 1);
    assert_int_equal(ev[0].clock_error_ns, 0);
    const tern_prof_clock_t *c;
    assert_int_equal(tern_prof_clocks(&c, &n), TERN_OK);
    assert_int_equal(n, 0);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char text[4096];
    size_t got = fread(text, 1, sizeof(text) - 1, f);
    text[got] = '\0';
    fclose(f);
    unlink(path);
    assert_non_null(strstr(text, "\"job\": true"));
    assert_non_null(strstr(text, "(root, this process)"));

    /* While a session runs, nothing is gathered and nothing is lost. */
    assert_int_equal(tern_prof_start(ctx, NULL), TERN_OK);
    assert_int_equal(tern_prof_gather(ctx, 0), TERN_ERR_NO_RESOURCE);
    assert_true(tern_prof_enabled());
    tern_prof_range_end(tern_prof_range_begin("kept"));
    assert_int_equal(tern_prof_stop(), TERN_OK);
    assert_int_equal(tern_prof_events(&ev, &n), TERN_OK);
    /* The session also holds the gather's own collectives, which ran in it. */
    size_t kept = 0, colls = 0;
    for (size_t i = 0; i < n; i++) {
        kept += strcmp(ev[i].name, "kept") == 0;
        colls += ev[i].kind == TERN_PROF_KIND_COLL;
    }
    assert_int_equal(kept, 1);
    assert_int_equal(colls + kept, n);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reply_events),
        cmocka_unit_test(test_job_blob),
        cmocka_unit_test(test_gather_alone),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
