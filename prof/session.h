/*
 * What job.c (one trace for the whole job) needs of session.c: the last
 * session's results, the clock estimates, and a way to replace the results
 * with the job's.
 */
#ifndef TERN_PROF_SESSION_H
#define TERN_PROF_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tern/prof.h>

struct tern__comm;

/* The results of this process's last session (NULL, 0 if none), its flags
 * and the clock reading at its start. TERN_ERR_NO_RESOURCE while running. */
tern_status_t tern__prof_results(const tern_prof_event_t **events, size_t *n, unsigned *flags,
                                 int64_t *t_start, uint64_t *dropped);

/* Estimate peer's clock now and keep the estimate with the earlier ones of
 * that peer (they bracket its events for interpolation). */
tern_status_t tern__prof_estimate_kept(struct tern__comm *comm, int peer, tern_prof_clock_t *out);

/* peer's offset at our time x, interpolated between its kept estimates;
 * false if there are none. */
bool tern__prof_offset_of(int peer, int64_t x, int64_t *offset, int64_t *bound);

/* The order of results (qsort of tern_prof_event_t): by start, the enclosing
 * first at equal starts, then by id. */
int tern__prof_by_start(const void *a, const void *b);

/* Make events (sorted by start; names and shapes in strings, taken over
 * with used) the results, as the job's gathered on this rank. */
void tern__prof_install(tern_prof_event_t *events, size_t n, char *strings,
                        tern_prof_clock_t *used, size_t nused, unsigned flags, uint64_t dropped);

#endif
