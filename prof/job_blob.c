/*
 * A rank's blob in the job gather, on root: checked field by field, then
 * decoded into events (prof/job.h has the format). job.c makes the blobs and
 * moves the decoded events onto root's clock.
 */
#include <inttypes.h>
#include <string.h>

#include "core/bytes.h"
#include "core/error.h"
#include "prof/job.h"

#define MAGIC TERN__PROF_JOB_MAGIC
#define HEAD TERN__PROF_JOB_HEAD
#define EV TERN__PROF_JOB_EV

tern_status_t tern__prof_job_check(const uint8_t *b, size_t len, int rank, int world, size_t *n,
                                   size_t *strbytes)
{
    if (len < HEAD || tern__get_le32(b) != MAGIC)
        return tern__error(TERN_ERR_PROTOCOL, "tern_prof_gather: rank %d sent a malformed blob "
                                              "(%zu bytes)", rank, len);
    tern_status_t st = (tern_status_t)(int32_t)tern__get_le32(b + 4);
    size_t ml = tern__get_le32(b + 28);
    if (ml > len - HEAD)
        return tern__error(TERN_ERR_PROTOCOL, "tern_prof_gather: rank %d's blob is cut short",
                           rank);
    /* Only one of tern's errors says why there are no results: anything
     * else (TERN_INPROGRESS, a number the map lacks) would be what
     * tern_prof_gather returns. */
    if (st != TERN_OK && !tern__status_is_error((int32_t)st))
        return tern__error(TERN_ERR_PROTOCOL, "tern_prof_gather: rank %d sent a malformed blob "
                                              "(status %d)", rank, (int)st);
    if (st != TERN_OK)
        return tern__error(st, "tern_prof_gather: rank %d has no results: %.*s", rank,
                           ml < TERN__ERROR_MAX ? (int)ml : TERN__ERROR_MAX,
                           (const char *)b + HEAD);
    uint64_t count = tern__get_le64(b + 8);
    const uint8_t *p = b + HEAD + ml, *end = b + len;
    size_t strs = 0;
    for (uint64_t i = 0; i < count; i++) {
        if ((size_t)(end - p) < EV)
            return tern__error(TERN_ERR_PROTOCOL, "tern_prof_gather: rank %d's blob holds fewer "
                                                  "than its %" PRIu64 " events", rank, count);
        size_t nl = tern__get_le32(p + 104), sl = tern__get_le32(p + 108);
        int node = (int32_t)tern__get_le32(p + 88);
        unsigned kind = tern__get_le16(p + 100), dir = tern__get_le16(p + 102);
        if (nl > (size_t)(end - p) - EV || sl > (size_t)(end - p) - EV - nl || node < 0 ||
            node >= world || kind > TERN_PROF_KIND_CLOCK || dir > TERN_PROF_DIR_RECV)
            return tern__error(TERN_ERR_PROTOCOL, "tern_prof_gather: rank %d's event %" PRIu64
                                                  " is malformed", rank, i);
        strs += nl + 1 + sl + 1;
        p += EV + nl + sl;
    }
    if (p != end)
        return tern__error(TERN_ERR_PROTOCOL, "tern_prof_gather: rank %d's blob has %zu bytes "
                                              "past its events", rank, (size_t)(end - p));
    *n = (size_t)count;
    *strbytes = strs;
    return TERN_OK;
}

static char *put_str(char **s, const char *src, size_t len)
{
    char *at = *s;
    memcpy(at, src, len);
    at[len] = '\0';
    *s += len + 1;
    return at;
}

size_t tern__prof_job_decode(const uint8_t *b, tern_prof_event_t *out, char **strings)
{
    const uint8_t *p = b + HEAD + tern__get_le32(b + 28);
    size_t n = (size_t)tern__get_le64(b + 8);
    for (size_t i = 0; i < n; i++) {
        tern_prof_event_t *e = &out[i];
        size_t nl = tern__get_le32(p + 104), sl = tern__get_le32(p + 108);
        e->start_ns = (int64_t)tern__get_le64(p);
        e->end_ns = (int64_t)tern__get_le64(p + 8);
        e->self_ns = (int64_t)tern__get_le64(p + 16);
        e->bytes = tern__get_le64(p + 24);
        e->mem = (int64_t)tern__get_le64(p + 32);
        e->self_mem = (int64_t)tern__get_le64(p + 40);
        e->clock_error_ns = (int64_t)tern__get_le64(p + 48);
        e->id = tern__get_le64(p + 56);
        e->parent = tern__get_le64(p + 64);
        e->seq = tern__get_le64(p + 72);
        e->thread = tern__get_le64(p + 80);
        e->node = (int32_t)tern__get_le32(p + 88);
        e->peer = (int32_t)tern__get_le32(p + 92);
        e->depth = (int32_t)tern__get_le32(p + 96);
        e->kind = tern__get_le16(p + 100);
        e->dir = tern__get_le16(p + 102);
        e->name = put_str(strings, (const char *)p + EV, nl);
        e->shapes = put_str(strings, (const char *)p + EV + nl, sl);
        p += EV + nl + sl;
    }
    return n;
}
