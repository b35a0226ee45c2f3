/*
 * A tern rank for the two-jobs test (two_jobs.sh): ranks other than 0 sleep
 * DELAY seconds before tern_init, rank 0 DELAY0; then rank 0 broadcasts its
 * job's letter (JOB) and each rank prints whose job it joined.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <tern/tern.h>

int main(void)
{
    const char *r = getenv("TERN_RANK"), *d = getenv("DELAY"), *d0 = getenv("DELAY0");
    const char *job = getenv("JOB");
    int rank = r ? atoi(r) : 0;
    if (d != NULL && rank != 0)
        sleep((unsigned)atoi(d));
    if (d0 != NULL && rank == 0)
        sleep((unsigned)atoi(d0));
    tern_ctx_t *ctx;
    if (tern_init(NULL, &ctx) != TERN_OK) {
        fprintf(stderr, "init failed: %s\n", tern_last_error());
        return 3;
    }
    int32_t label = job ? job[0] : '?';
    if (tern_broadcast(tern_group_world(ctx), &label, 1, TERN_DTYPE_I32, 0, NULL) != TERN_OK) {
        fprintf(stderr, "broadcast: %s\n", tern_last_error());
        return 4;
    }
    printf("rank %u of job %s joined job %c\n", tern_ctx_rank(ctx), job ? job : "?", (char)label);
    fflush(stdout);
    return tern_finalize(ctx) == TERN_OK ? 0 : 5;
}
