/*
 * A rank's blob in the job gather (tern_prof_gather): its wire form, encoded
 * by job.c from this rank's results, checked and decoded by job_blob.c. The
 * blob comes from another process, so it is checked like any network input;
 * job_blob.c needs no session and no collectives, so tests and the fuzzer
 * (tests/prof/fuzz_prof.c) call it alone.
 *
 * The blob (little-endian): a head, its error message, its events.
 * head: 0 u32 magic  4 i32 status (not TERN_OK: no results, message says why)
 *       8 u64 events  16 u64 dropped  24 u32 flags  28 u32 message length
 * event: 0 i64 start  8 i64 end  16 i64 self  24 u64 bytes  32 i64 mem
 *       40 i64 self_mem  48 i64 clock_error  56 u64 id  64 u64 parent
 *       72 u64 seq  80 u64 thread  88 i32 node  92 i32 peer  96 i32 depth
 *       100 u16 kind  102 u16 dir  104 u32 name length  108 u32 shapes length,
 *       then name and shapes.
 */
#ifndef TERN_PROF_JOB_H
#define TERN_PROF_JOB_H

#include <stddef.h>
#include <stdint.h>

#include <tern/prof.h>

#define TERN__PROF_JOB_MAGIC 0x314a5054u /* "TPJ1" */
#define TERN__PROF_JOB_HEAD 32
#define TERN__PROF_JOB_EV 112

/* This rank's blob (job.c): its results, or why it has none (into head, of
 * TERN__PROF_JOB_HEAD bytes, when there is no memory for more). Free it
 * unless it is head. */
uint8_t *tern__prof_job_encode(uint8_t *head, size_t *len);

/* Check the blob b of len bytes that rank sent, in a world of world ranks
 * (every event's node must lie in it): on TERN_OK, *n is its event count and
 * *strbytes the bytes their names and shapes take with their NULs. Otherwise
 * a tern__error naming rank: the status the rank sent, or TERN_ERR_PROTOCOL.
 * Reads nothing outside b; allocates nothing. */
tern_status_t tern__prof_job_check(const uint8_t *b, size_t len, int rank, int world, size_t *n,
                                   size_t *strbytes);

/* The events of blob b, which tern__prof_job_check accepted, into out (room
 * for its n) as they were sent (on the sender's clock), their names and
 * shapes copied to *strings (room for its strbytes), which is moved past
 * them. Returns n. The events point into the strings: the caller owns both. */
size_t tern__prof_job_decode(const uint8_t *b, tern_prof_event_t *out, char **strings);

#endif
