/*
 * libFuzzer target for the profiler's two decoders of what other processes
 * send: a profiled handler's events in an RPC reply (tern__prof_decode,
 * prof/record.c) and a rank's blob in the job gather (tern__prof_job_check
 * and tern__prof_job_decode, prof/job_blob.c). Whatever the bytes, they must
 * return cleanly (ASan and UBSan watch every read) and leak nothing
 * (LeakSanitizer); what they accept must be within the limits they check.
 *
 * The first byte picks the decoder, the rest is its input:
 *   bit 0 clear: reply events. Bits 1-7, if not 0, make the callback refuse
 *                that record (1-based), so the decoder releases it itself.
 *   bit 0 set:   a job blob from a world of 1 + (byte >> 1) ranks.
 * The callback releases every record it takes with tern__prof_rec_clear, as
 * the real one (record.c's file_remote, by moving it on) does.
 *
 * Built with clang -fsanitize=fuzzer,address,undefined by tests/prof/CMakeLists.txt
 * and run for a bounded time as the CTest test fuzz_prof_decode.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/bytes.h"
#include "core/error.h"
#include "prof/job.h"
#include "prof/record.h"

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond))                                                                               \
            __builtin_trap();                                                                      \
    } while (0)

#define REPLY_EV 80 /* record.c's EV_FIXED: the fixed part of an event */

typedef struct take {
    uint32_t seen;   /* records handed to the callback */
    uint32_t refuse; /* refuse the record with this number (from 1); 0: none */
} take_t;

static tern_status_t take(tern__prof_rec_t *r, void *arg)
{
    take_t *t = arg;
    if (++t->seen == t->refuse)
        return TERN_ERR_CANCELED; /* not taken: the decoder releases it */
    const char *name = tern__prof_rec_name(r);
    CHECK(name != NULL && strlen(name) < 1024);
    CHECK((r->flags & ~(TERN__REC_NAME_HEAP | TERN__REC_ASYNC | TERN__REC_SEND |
                        TERN__REC_RECV)) == 0);
    CHECK(r->shapes == NULL || strlen(r->shapes) <= UINT16_MAX);
    tern__prof_rec_clear(r);
    CHECK(r->shapes == NULL && r->flags == 0);
    return TERN_OK;
}

static void fuzz_reply(const uint8_t *data, size_t size, unsigned refuse)
{
    take_t t = {.refuse = refuse};
    uint32_t dropped = 0;
    tern_status_t st = tern__prof_decode(data, size, &dropped, take, &t);
    if (size < 8) {
        CHECK(st == TERN_ERR_PROTOCOL && t.seen == 0);
        return;
    }
    uint32_t n = tern__get_le32(data);
    CHECK(dropped == tern__get_le32(data + 4));
    CHECK(t.seen <= n && t.seen <= (size - 8) / REPLY_EV);
    if (st == TERN_OK)
        CHECK(t.seen == n && (refuse == 0 || refuse > n));
    else if (st == TERN_ERR_CANCELED)
        CHECK(t.seen == refuse);
    else
        CHECK(st == TERN_ERR_PROTOCOL && t.seen < n);
}

static void fuzz_blob(const uint8_t *data, size_t size, int world)
{
    size_t n = 0, strbytes = 0;
    tern_status_t st = tern__prof_job_check(data, size, 1, world, &n, &strbytes);
    if (st != TERN_OK) {
        CHECK(tern__status_is_error(st)); /* what tern_prof_gather may return */
        return;
    }
    CHECK(size >= TERN__PROF_JOB_HEAD);
    CHECK(n <= (size - TERN__PROF_JOB_HEAD) / TERN__PROF_JOB_EV);
    CHECK(strbytes >= 2 * n && strbytes <= size + 2 * n);
    tern_prof_event_t *ev = calloc(n ? n : 1, sizeof(*ev));
    char *strings = malloc(strbytes ? strbytes : 1), *s = strings;
    if (ev == NULL || strings == NULL) {
        free(ev);
        free(strings);
        return;
    }
    CHECK(tern__prof_job_decode(data, ev, &s) == n);
    CHECK((size_t)(s - strings) == strbytes);
    for (size_t i = 0; i < n; i++) {
        const tern_prof_event_t *e = &ev[i];
        CHECK(e->node >= 0 && e->node < world);
        CHECK(e->kind <= TERN_PROF_KIND_CLOCK && e->dir <= TERN_PROF_DIR_RECV);
        CHECK(e->name >= strings && e->name + strlen(e->name) < strings + strbytes);
        CHECK(e->shapes > e->name && e->shapes + strlen(e->shapes) < strings + strbytes);
    }
    free(ev);
    free(strings);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    unsigned pick = data[0];
    /* A copy of exactly the rest, so that ASan sees a read past its end. */
    uint8_t *copy = malloc(size - 1 ? size - 1 : 1);
    if (copy == NULL)
        return 0;
    memcpy(copy, data + 1, size - 1);
    if (pick & 1)
        fuzz_blob(copy, size - 1, 1 + (int)(pick >> 1));
    else
        fuzz_reply(copy, size - 1, pick >> 1);
    free(copy);
    return 0;
}
