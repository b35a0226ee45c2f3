/* Uses the installed tern: joins a job of one and prints what it got. */
#include <stdio.h>

#include <tern/tern.h>

int main(void)
{
    tern_ctx_t *ctx;
    if (tern_init(NULL, &ctx) != TERN_OK) {
        fprintf(stderr, "tern_init: %s\n", tern_last_error());
        return 1;
    }
    printf("consumer: tern %s, rank %u of %u, %u pool threads\n", TERN_VERSION_STRING,
           tern_ctx_rank(ctx), tern_ctx_world_size(ctx), tern_pool_size(tern_ctx_pool(ctx)));
    return tern_finalize(ctx) == TERN_OK ? 0 : 1;
}
