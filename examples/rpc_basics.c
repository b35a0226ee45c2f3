/*
 * tern-rpc-basics: the worker of PyTorch's "Profiling PyTorch RPC-Based
 * Workloads" recipe, without the profiler, in C. Two ranks become the workers
 * "worker0" and "worker1"; worker0 makes two random 3x3 f32 tensors, calls the
 * built-in functions add and mul on worker1 with tern_rpc_async, waits for
 * both futures at once, prints the tensors as torch prints them, and checks
 * the results against the same arithmetic done here (exit 1 if they differ).
 * worker1 only serves. Both shut down gracefully, as rpc.shutdown() does.
 *
 *   tern-run -n 2 tern-rpc-basics [seed]
 *
 * The Python it mirrors:
 *
 *   rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world_size)
 *   if rank == 0:
 *       t1, t2 = random_tensor(), random_tensor()
 *       fut1 = rpc.rpc_async("worker1", torch.add, args=(t1, t2))
 *       fut2 = rpc.rpc_async("worker1", torch.mul, args=(t1, t2))
 *       fut1.wait(); fut2.wait()
 *   rpc.shutdown()
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tern/tern.h>

#define N 3

/* splitmix64: the seed's stream of uniform floats in [0, 1), as torch.rand. */
static uint64_t rng_state;

static float rand01(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f); /* 24 bits: exact in f32 */
}

/* A 2-d f32 tensor printed as torch prints one: four decimals, one width. */
static void print_tensor(const char *label, const tern_tensor_t *t)
{
    const float *v = t->data;
    int64_t rows = t->shape[0], cols = t->shape[1];
    int width = 0;
    char cell[64];
    for (int64_t i = 0; i < rows * cols; i++) {
        int w = snprintf(cell, sizeof(cell), "%.4f", v[i]);
        width = w > width ? w : width;
    }
    printf("%s\ntensor([", label);
    for (int64_t r = 0; r < rows; r++) {
        printf("%s[", r == 0 ? "" : ",\n        ");
        for (int64_t c = 0; c < cols; c++)
            printf("%s%*.4f", c == 0 ? "" : ", ", width, v[r * cols + c]);
        printf("]");
    }
    printf("])\n");
}

/* The future's one result: a 3x3 f32 tensor equal to want, element for
 * element (add and mul of f32 are exact IEEE operations on both sides). */
static int check(const char *fn, tern_future_t *f, const float *want)
{
    const tern_rpc_value_t *v = tern_future_value(f);
    if (v == NULL || v->ntensors != 1 || v->tensors[0].dtype != TERN_DTYPE_F32 ||
        v->tensors[0].ndim != 2 || v->tensors[0].shape[0] != N || v->tensors[0].shape[1] != N) {
        fprintf(stderr, "worker0: %s: expected one 3x3 f32 tensor\n", fn);
        return 1;
    }
    const float *got = v->tensors[0].data;
    for (int i = 0; i < N * N; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0) {
            fprintf(stderr, "worker0: %s: element %d is %.9g, expected %.9g\n", fn, i, got[i],
                    want[i]);
            return 1;
        }
    return 0;
}

int main(int argc, char **argv)
{
    tern_ctx_t *ctx;
    tern_status_t st;
    int rc = 0;

    if ((st = tern_init(NULL, &ctx)) != TERN_OK) {
        fprintf(stderr, "tern_init: %s: %s\n", tern_strerror(st), tern_last_error());
        return 1;
    }
    unsigned rank = tern_ctx_rank(ctx), world = tern_ctx_world_size(ctx);
    if (world < 2) {
        fprintf(stderr, "tern-rpc-basics: needs 2 ranks (tern-run -n 2 tern-rpc-basics)\n");
        tern_finalize(ctx);
        return 1;
    }
    /* NULL: the worker is named "worker<rank>", as the recipe names them. */
    if ((st = tern_rpc_init(ctx, NULL, NULL)) != TERN_OK) {
        fprintf(stderr, "rank %u: tern_rpc_init: %s\n", rank, tern_last_error());
        tern_finalize(ctx);
        return 1;
    }
    char name[TERN_RPC_NAME_MAX + 1];
    tern_rpc_worker_name(ctx, -1, name, sizeof(name));
    printf("%s successfully initialized RPC.\n", name);
    fflush(stdout);

    if (rank == 0) {
        uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : tern_clock_ns();
        rng_state = seed;
        float a[N * N], b[N * N], sum[N * N], prod[N * N];
        for (int i = 0; i < N * N; i++)
            a[i] = rand01();
        for (int i = 0; i < N * N; i++)
            b[i] = rand01();
        int64_t shape[2] = {N, N};
        tern_tensor_t t[2];
        tern_tensor_init(&t[0], a, TERN_DTYPE_F32, 2, shape, tern_device_cpu());
        tern_tensor_init(&t[1], b, TERN_DTYPE_F32, 2, shape, tern_device_cpu());
        printf("worker0: seed %" PRIu64 "\n", seed);
        print_tensor("t1 =", &t[0]);
        print_tensor("t2 =", &t[1]);

        /* Both calls in flight at once; a and b stay untouched until both
         * futures complete. */
        tern_rpc_args_t args = {.tensors = t, .ntensors = 2};
        tern_future_t *futs[2] = {NULL, NULL};
        if ((st = tern_rpc_async(ctx, "worker1", "add", &args, TERN_RPC_TIMEOUT_DEFAULT,
                                 &futs[0])) != TERN_OK ||
            (st = tern_rpc_async(ctx, "worker1", "mul", &args, TERN_RPC_TIMEOUT_DEFAULT,
                                 &futs[1])) != TERN_OK ||
            (st = tern_future_wait_all(futs, 2, -1)) != TERN_OK) {
            fprintf(stderr, "worker0: %s\n", tern_last_error());
            rc = 1;
        } else {
            const tern_rpc_value_t *vs = tern_future_value(futs[0]),
                                   *vp = tern_future_value(futs[1]);
            print_tensor("add on worker1 =", &vs->tensors[0]);
            print_tensor("mul on worker1 =", &vp->tensors[0]);
            for (int i = 0; i < N * N; i++) {
                sum[i] = a[i] + b[i];
                prod[i] = a[i] * b[i];
            }
            rc = check("add", futs[0], sum) | check("mul", futs[1], prod);
            if (rc == 0)
                printf("worker0: add and mul on worker1 match the local computation\n");
        }
        tern_future_free(futs[0]);
        tern_future_free(futs[1]);
    }

    printf("Rank %u waiting for workers to shut down\n", rank);
    fflush(stdout);
    /* Graceful: returns once no worker has anything left in flight. */
    if ((st = tern_rpc_shutdown(ctx, 1)) != TERN_OK) {
        fprintf(stderr, "rank %u: tern_rpc_shutdown: %s\n", rank, tern_last_error());
        rc = 1;
    }
    if ((st = tern_finalize(ctx)) != TERN_OK) {
        fprintf(stderr, "rank %u: tern_finalize: %s\n", rank, tern_last_error());
        rc = 1;
    }
    return rc;
}
