/*
 * The prof fuzzer's seed corpus (tests/prof/corpus/): inputs of fuzz_prof.c,
 * a selector byte (tests/prof/fuzz_prof.c) and then a wire form.
 *   test_prof_corpus [DIR]        check every seed still decodes as it did
 *                                 (run by CTest; DIR defaults to the source
 *                                 tree's corpus)
 *   test_prof_corpus --write DIR  (re)write the seeds from real encoders, after
 *                                 a wire format change (a session in a world
 *                                 of one makes the job blobs)
 * reply_* hold a profiled handler's events as a reply carries them; blob_* a
 * rank's blob in the job gather; regress_* inputs the fuzzer found, kept as
 * they are (not rewritten) and checked to fail as they should.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <tern/tern.h>

#include "prof/job.h"
#include "prof/record.h"

#include "corpus_check.h"
#include "one_rank.h"


typedef enum form { REPLY, BLOB } form_t;

struct seed {
    const char *name;
    form_t form;
    tern_status_t status; /* what the decoder returns */
    size_t events;        /* with TERN_OK: how many */
    const char *first;    /* and the first one's name */
};

static const struct seed seeds[] = {
    {"reply_empty", REPLY, TERN_OK, 0, NULL},
    {"reply_range_handler", REPLY, TERN_OK, 2, "inner range"},
    {"reply_nested_long_name", REPLY, TERN_OK, 4, "outer"},
    {"blob_two_ranges", BLOB, TERN_OK, 2, "outer"},
    {"blob_no_events", BLOB, TERN_OK, 0, NULL},
    {"blob_no_results", BLOB, TERN_ERR_NO_RESOURCE, 0, NULL},
    /* Found by the fuzzer: a blob whose status was no error (29184), which
     * tern_prof_gather returned as its own. */
    {"regress_blob_status_positive", BLOB, TERN_ERR_PROTOCOL, 0, NULL},
};

#define NSEEDS (sizeof(seeds) / sizeof(seeds[0]))

static void put_file(const char *dir, const char *name, uint8_t pick, const uint8_t *b, size_t len)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(&pick, 1, 1, f) != 1 || fwrite(b, 1, len, f) != len ||
        fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

/* A capture's events as a reply carries them, into name. */
static void put_capture(const char *dir, const char *name, tern__prof_capture_t *c)
{
    size_t size = tern__prof_capture_size(c);
    uint8_t *buf = malloc(size);
    if (buf == NULL || tern__prof_capture_encode(c, buf, size) != size) {
        fprintf(stderr, "%s: encoding failed\n", name);
        exit(1);
    }
    put_file(dir, name, 0, buf, size);
    free(buf);
    tern__prof_capture_put(c);
}

/* This rank's blob now (selector 1: a world of one), into name. */
static void put_blob(const char *dir, const char *name)
{
    uint8_t head[TERN__PROF_JOB_HEAD];
    size_t len;
    uint8_t *b = tern__prof_job_encode(head, &len);
    put_file(dir, name, 1, b, len);
    if (b != head)
        free(b);
}

static void write_seeds(const char *dir)
{
    tern__prof_capture_t *c = tern__prof_capture_new(0), *old;
    if (c == NULL)
        exit(1);
    put_capture(dir, "reply_empty", c);

    if ((c = tern__prof_capture_new(0)) == NULL)
        exit(1);
    old = tern__prof_capture_enter(c);
    tern_prof_range_t r = tern_prof_range_begin("inner range");
    tern__prof_range_msg(r, 3, TERN_PROF_DIR_SEND, 77);
    tern_prof_range_end(r);
    tern__prof_capture_enter(old);
    tern__prof_capture_handler(c, "the handler", 10, 20, 0, "[[3, 3]]");
    put_capture(dir, "reply_range_handler", c);

    /* Nested ranges, a receive, a name longer than a record holds inline
     * and one left open (it ends with the reply). */
    if ((c = tern__prof_capture_new(TERN_PROF_SHAPES)) == NULL)
        exit(1);
    old = tern__prof_capture_enter(c);
    tern_prof_range_t outer = tern_prof_range_begin("outer");
    r = tern_prof_range_begin("a range whose name is longer than the 48 bytes kept inline");
    tern__prof_range_msg(r, 1, TERN_PROF_DIR_RECV, 5);
    tern_prof_range_bytes(r, 4096);
    tern_prof_range_end(r);
    tern_prof_range_begin("left open");
    tern_prof_range_end(outer);
    tern__prof_capture_enter(old);
    tern__prof_capture_handler(c, "handler", 1, 99, 64, "[[2, 3], [4]]");
    put_capture(dir, "reply_nested_long_name", c);

    if (setup(NULL) != 0)
        exit(1);
    if (tern_prof_start(ctx, NULL) != TERN_OK)
        exit(1);
    tern_prof_range_t a = tern_prof_range_begin("outer");
    tern_prof_range_end(tern_prof_range_begin("inner"));
    tern_prof_range_end(a);
    if (tern_prof_stop() != TERN_OK)
        exit(1);
    put_blob(dir, "blob_two_ranges");
    if (tern_prof_start(ctx, NULL) != TERN_OK || tern_prof_stop() != TERN_OK)
        exit(1);
    put_blob(dir, "blob_no_events");
    if (tern_prof_start(ctx, NULL) != TERN_OK)
        exit(1);
    put_blob(dir, "blob_no_results"); /* still running: says why */
    if (tern_prof_stop() != TERN_OK || teardown(NULL) != 0)
        exit(1);
}

typedef struct got {
    size_t n;
    char first[64];
} got_t;

static tern_status_t take(tern__prof_rec_t *r, void *arg)
{
    got_t *g = arg;
    if (g->n++ == 0)
        snprintf(g->first, sizeof(g->first), "%s", tern__prof_rec_name(r));
    tern__prof_rec_clear(r);
    return TERN_OK;
}

static void check_seed(const struct seed *s, const uint8_t *in, size_t len)
{
    /* As the fuzzer: the selector, then exactly the rest. */
    uint8_t pick = in[0], *b = malloc(len - 1 ? len - 1 : 1);
    assert_non_null(b);
    memcpy(b, in + 1, len - 1);
    len--;
    if (s->form == REPLY) {
        assert_int_equal(pick, 0);
        got_t g = {0};
        uint32_t dropped = 1;
        assert_int_equal(tern__prof_decode(b, len, &dropped, take, &g), s->status);
        if (s->status == TERN_OK) {
            assert_int_equal(dropped, 0);
            assert_int_equal(g.n, s->events);
            if (s->first != NULL)
                assert_string_equal(g.first, s->first);
        }
    } else {
        assert_int_equal(pick & 1, 1);
        size_t n = 0, strbytes = 0;
        assert_int_equal(tern__prof_job_check(b, len, 1, 1 + (pick >> 1), &n, &strbytes),
                         s->status);
        if (s->status == TERN_OK) {
            assert_int_equal(n, s->events);
            tern_prof_event_t *ev = calloc(n ? n : 1, sizeof(*ev));
            char *strings = malloc(strbytes ? strbytes : 1), *at = strings;
            assert_non_null(ev);
            assert_non_null(strings);
            assert_int_equal(tern__prof_job_decode(b, ev, &at), n);
            assert_int_equal(at - strings, strbytes);
            if (s->first != NULL)
                assert_string_equal(ev[0].name, s->first);
            free(ev);
            free(strings);
        }
    }
    free(b);
}

static void test_every_seed_decodes(void **state)
{
    (void)state;
    for (size_t i = 0; i < NSEEDS; i++) {
        size_t len;
        uint8_t *in = corpus_read(seeds[i].name, &len);
        assert_true(len >= 1); /* the byte that picks the decoder */
        check_seed(&seeds[i], in, len);
        free(in);
    }
    /* Nothing else in the folder but seeds we know. */
    assert_int_equal(corpus_files(), NSEEDS);
}

int main(int argc, char **argv)
{
    return corpus_main(argc, argv, write_seeds, test_every_seed_decodes);
}
