/*
 * CHECK and OK for the test programs that tern-run starts as ranks. A failed
 * check prints the rank, the function and line, the message and
 * tern_last_error(), then exits 1, which fails the whole job; a passed one
 * is counted, from any thread. The program declares `rank` (an integer) and
 * `static atomic_ulong checks` before it includes this.
 */
#ifndef TERN_TESTS_RANK_CHECK_H
#define TERN_TESTS_RANK_CHECK_H

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include <tern/status.h>

#define CHECK(cond, ...)                                                             \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "rank %d: FAIL %s:%d: ", (int)rank, __func__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                            \
            fprintf(stderr, " [%s]\n", tern_last_error());                           \
            fflush(stderr);                                                          \
            exit(1);                                                                 \
        }                                                                            \
        atomic_fetch_add_explicit(&checks, 1, memory_order_relaxed);                 \
    } while (0)

#define OK(call) CHECK((call) == TERN_OK, "%s", #call)

#endif
