/*
 * tern-remote-objects: PyTorch's "Distributed Pipeline Parallelism Using RPC"
 * in C, with a two-layer model in place of ResNet50. Three ranks: "master"
 * (rank 0), "worker1" and "worker2". The model's two shards are remote
 * objects: Shard1 (y = relu(x W1)) lives on worker1, Shard2 (z = y W2) on
 * worker2. The master splits each batch into micro-batches and pipelines them
 * through the shards as DistResNet50.forward does:
 *
 *   for x in xs.split(split_size):
 *       x_rref = RRef(x)
 *       y_rref = self.p1_rref.remote().forward(x_rref)
 *       z_fut = self.p2_rref.rpc_async().forward(y_rref)
 *       out_futures.append(z_fut)
 *   return torch.cat(torch.futures.wait_all(out_futures))
 *
 * Each shard's forward fetches its input with to_here() (an RPC made from a
 * handler), so shard 2 works on micro-batch i while shard 1 works on i + 1.
 * DistResNet50.parameter_rrefs() is here too: each shard's parameter_rrefs
 * method returns an RRef per parameter (RRefs in a result), and the master
 * collects them from both shards, as it would for a DistributedOptimizer,
 * and reads each one back (tern has no autograd, so no optimizer steps).
 * The master checks the output against the same model computed locally
 * (weights are a deterministic function of a seed, on every rank), releases
 * everything, waits until no worker owns anything any more (every object's
 * destructor ran), and all shut down gracefully.
 *
 *   tern-run -n 3 tern-remote-objects
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tern/tern.h>

#define BATCH 8 /* rows of a batch */
#define MICRO 2 /* rows of a micro-batch */
#define NSPLIT (BATCH / MICRO)
#define IN 16
#define HIDDEN 32
#define OUT 8
#define NUM_BATCHES 3
#define SEED1 1u
#define SEED2 2u
#define TOLERANCE 1e-4f

/* ---- the model, the same on every rank ---- */

/* Element (i, j) of the weights seeded with seed: uniform in [-0.25, 0.25). */
static float weight(uint32_t seed, int32_t i, int32_t j)
{
    uint32_t h = seed * 0x9e3779b9u ^ (uint32_t)i * 0x85ebca6bu ^ (uint32_t)j * 0xc2b2ae35u;
    h ^= h >> 16, h *= 0x7feb352du, h ^= h >> 15, h *= 0x846ca68bu, h ^= h >> 16;
    return ((float)(h >> 8) / 16777216.0f - 0.5f) * 0.5f;
}

/* out[rows x n] = a[rows x k] * w[k x n], then relu if asked. */
static void linear(const float *a, const float *w, float *out, int64_t rows, int32_t k, int32_t n,
                   int relu)
{
    for (int64_t r = 0; r < rows; r++)
        for (int32_t j = 0; j < n; j++) {
            float acc = 0;
            for (int32_t i = 0; i < k; i++)
                acc += a[r * k + i] * w[(int64_t)i * n + j];
            out[r * n + j] = relu && acc < 0 ? 0 : acc;
        }
}

/* What a shard's constructor is given: the blob of tern_remote's arguments. */
typedef struct shard_spec {
    int32_t in, out;
    uint32_t seed;
} shard_spec_t;

/* ---- the shards: remote objects on worker1 and worker2 ---- */

typedef struct shard {
    int32_t in, out;
    int relu; /* Shard1: relu(x W1); Shard2: x W2 */
    float *w; /* [in x out], read-only once built: forward needs no lock */
} shard_t;

static tern_status_t shard_new(tern_rpc_call_t *call, void **obj, int relu)
{
    const tern_rpc_value_t *a = tern_rpc_call_args(call);
    shard_spec_t spec;
    if (a->blob_len != sizeof(spec))
        return tern_rpc_call_fail(call, TERN_ERR_INVALID_PARAM, "expected a %zu-byte spec, got %zu",
                                  sizeof(spec), a->blob_len);
    memcpy(&spec, a->blob, sizeof(spec));
    if (spec.in < 1 || spec.in > 4096 || spec.out < 1 || spec.out > 4096)
        return tern_rpc_call_fail(call, TERN_ERR_INVALID_PARAM, "bad shape %d x %d", spec.in,
                                  spec.out);
    shard_t *s = calloc(1, sizeof(*s));
    float *w = malloc((size_t)spec.in * (size_t)spec.out * sizeof(float));
    if (s == NULL || w == NULL) {
        free(s);
        free(w);
        return tern_rpc_call_fail(call, TERN_ERR_NO_MEMORY, "out of memory");
    }
    for (int32_t i = 0; i < spec.in; i++)
        for (int32_t j = 0; j < spec.out; j++)
            w[(int64_t)i * spec.out + j] = weight(spec.seed, i, j);
    *s = (shard_t){spec.in, spec.out, relu, w};
    *obj = s;
    char me[TERN_RPC_NAME_MAX + 1];
    tern_rpc_worker_name(tern_rpc_call_ctx(call), -1, me, sizeof(me));
    printf("%s: %s built, weights %d x %d\n", me, relu ? "Shard1" : "Shard2", spec.in, spec.out);
    fflush(stdout);
    return TERN_OK;
}

static tern_status_t shard1_new(tern_rpc_call_t *call, void **obj)
{
    return shard_new(call, obj, 1);
}

static tern_status_t shard2_new(tern_rpc_call_t *call, void **obj)
{
    return shard_new(call, obj, 0);
}

/* Runs when no worker holds an RRef to the shard any more. */
static void shard_free(void *obj)
{
    shard_t *s = obj;
    free(s->w);
    free(s);
}

/* Shard1.forward and Shard2.forward: the one argument is an RRef to the input
 * (a value on another worker); fetch it, apply the layer, return the output. */
static tern_status_t shard_forward(tern_rpc_call_t *call)
{
    shard_t *s = tern_rpc_call_self(call);
    tern_rref_t *x_rref = tern_rpc_call_rref(call, 0);
    tern_future_t *x_value;
    tern_tensor_t *out;
    tern_status_t st;
    if (s == NULL || x_rref == NULL || tern_rpc_call_nrrefs(call) != 1)
        return tern_rpc_call_fail(call, TERN_ERR_INVALID_PARAM, "takes one RRef to the input");
    /* x = x_rref.to_here(): a blocking RPC from a handler. While it waits,
     * this pool thread runs other queued pool work. */
    if ((st = tern_rref_to_here(x_rref, TERN_RPC_TIMEOUT_DEFAULT, &x_value)) != TERN_OK)
        return tern_rpc_call_fail(call, st, "fetching the input: %s", tern_last_error());
    const tern_rpc_value_t *v = tern_future_value(x_value);
    const tern_tensor_t *x = v->ntensors == 1 ? &v->tensors[0] : NULL;
    if (x == NULL || x->dtype != TERN_DTYPE_F32 || x->ndim != 2 || x->shape[1] != s->in) {
        tern_future_free(x_value);
        return tern_rpc_call_fail(call, TERN_ERR_INVALID_PARAM, "input must be one f32 [rows, %d]",
                                  s->in);
    }
    int64_t shape[2] = {x->shape[0], s->out};
    if ((st = tern_rpc_call_alloc_tensor(call, TERN_DTYPE_F32, 2, shape, &out)) == TERN_OK)
        linear(x->data, s->w, out->data, x->shape[0], s->in, s->out, s->relu);
    tern_future_free(x_value);
    return st;
}

/* Shard1.parameter_rrefs and Shard2.parameter_rrefs: [RRef(p) for p in
 * self.parameters()], one parameter here (the weights). tern_rref_local
 * keeps a copy, so the RRef is a snapshot of the weights; in PyTorch RRef(p)
 * names p itself. The call holds its own handle of each RRef it returns. */
static tern_status_t shard_parameter_rrefs(tern_rpc_call_t *call)
{
    shard_t *s = tern_rpc_call_self(call);
    if (s == NULL)
        return tern_rpc_call_fail(call, TERN_ERR_INVALID_PARAM, "not called on a shard");
    int64_t shape[2] = {s->in, s->out};
    tern_tensor_t w;
    tern_rref_t *p_rref;
    tern_status_t st = tern_tensor_init(&w, s->w, TERN_DTYPE_F32, 2, shape, tern_device_cpu());
    tern_rpc_args_t value = {.tensors = &w, .ntensors = 1};
    if (st == TERN_OK &&
        (st = tern_rref_local(tern_rpc_call_ctx(call), &value, &p_rref)) == TERN_OK) {
        st = tern_rpc_call_return_rref(call, p_rref);
        tern_rref_release(p_rref);
    }
    return st;
}

/* How many objects and values this worker owns: the master's leak check. */
static tern_status_t owned(tern_rpc_call_t *call)
{
    uint64_t n = tern_rpc_owned_count(tern_rpc_call_ctx(call));
    return tern_rpc_call_return_blob(call, &n, sizeof(n));
}

/* ---- the master ---- */

static const char *const WORKERS[2] = {"worker1", "worker2"};

/* One batch through the pipeline: out[BATCH x OUT]. 0, or 1 after saying why. */
static int forward(tern_ctx_t *ctx, tern_rref_t *p1_rref, tern_rref_t *p2_rref, const float *xs,
                   float *out)
{
    tern_future_t *z_futs[NSPLIT] = {0};
    tern_status_t st = TERN_OK;
    int rc = 0;
    for (size_t m = 0; m < NSPLIT && st == TERN_OK; m++) {
        tern_tensor_t x;
        int64_t shape[2] = {MICRO, IN};
        tern_rref_t *x_rref = NULL, *y_rref = NULL;
        tern_tensor_init(&x, (void *)(xs + m * MICRO * IN), TERN_DTYPE_F32, 2, shape,
                         tern_device_cpu());
        tern_rpc_args_t value = {.tensors = &x, .ntensors = 1};
        /* x_rref = RRef(x): the master owns a copy of the micro-batch. */
        if ((st = tern_rref_local(ctx, &value, &x_rref)) != TERN_OK)
            break;
        /* y_rref = p1_rref.remote().forward(x_rref): y stays on worker1. */
        tern_rpc_args_t a1 = {.rrefs = &x_rref, .nrrefs = 1};
        st = tern_rref_remote(p1_rref, "forward", &a1, TERN_RPC_TIMEOUT_DEFAULT, &y_rref);
        /* z_fut = p2_rref.rpc_async().forward(y_rref): worker2 fetches y
         * from worker1 itself. */
        tern_rpc_args_t a2 = {.rrefs = &y_rref, .nrrefs = 1};
        if (st == TERN_OK)
            st = tern_rref_rpc_async(p2_rref, "forward", &a2, TERN_RPC_TIMEOUT_DEFAULT, &z_futs[m]);
        /* The calls hold references of their own: the master's go now. */
        tern_rref_release(x_rref);
        tern_rref_release(y_rref);
    }
    /* torch.futures.wait_all(out_futures) */
    if (st == TERN_OK)
        st = tern_future_wait_all(z_futs, NSPLIT, -1);
    if (st != TERN_OK) {
        fprintf(stderr, "master: forward: %s\n", tern_last_error());
        rc = 1;
    }
    /* torch.cat(...) */
    for (size_t m = 0; m < NSPLIT && rc == 0; m++) {
        const tern_rpc_value_t *v = tern_future_value(z_futs[m]);
        const tern_tensor_t *z = &v->tensors[0];
        if (v->ntensors != 1 || z->dtype != TERN_DTYPE_F32 || z->ndim != 2 ||
            z->shape[0] != MICRO || z->shape[1] != OUT) {
            fprintf(stderr, "master: micro-batch %zu: expected one f32 [%d, %d] output\n", m, MICRO,
                    OUT);
            rc = 1;
        } else {
            memcpy(out + m * MICRO * OUT, z->data, sizeof(float) * MICRO * OUT);
        }
    }
    for (size_t m = 0; m < NSPLIT; m++)
        tern_future_free(z_futs[m]);
    return rc;
}

/*
 * After the master's last release, nothing may stay owned anywhere: the shards'
 * destructors must run and every micro-batch's x and y must be freed. The
 * DELETE messages that free them come from several workers, so poll each
 * worker's count for a while. 0, or 1 after printing what is left.
 */
static int wait_released(tern_ctx_t *ctx)
{
    uint64_t deadline = tern_clock_ns() + 5000000000ull;
    for (;;) {
        uint64_t left[3] = {tern_rpc_owned_count(ctx), 0, 0};
        for (int w = 0; w < 2; w++) {
            tern_future_t *f;
            if (tern_rpc_sync(ctx, WORKERS[w], "owned_count", NULL, TERN_RPC_TIMEOUT_DEFAULT, &f) !=
                TERN_OK) {
                fprintf(stderr, "master: owned_count on %s: %s\n", WORKERS[w], tern_last_error());
                return 1;
            }
            const tern_rpc_value_t *v = tern_future_value(f);
            if (v->blob_len == sizeof(uint64_t))
                memcpy(&left[w + 1], v->blob, sizeof(uint64_t));
            tern_future_free(f);
        }
        if (left[0] + left[1] + left[2] == 0) {
            printf("master: every RRef released: nothing owned on master, worker1, worker2\n");
            return 0;
        }
        if (tern_clock_ns() > deadline) {
            fprintf(stderr,
                    "master: still owned after 5 s: master %llu, worker1 %llu, worker2 "
                    "%llu\n",
                    (unsigned long long)left[0], (unsigned long long)left[1],
                    (unsigned long long)left[2]);
            return 1;
        }
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
}

/*
 * DistResNet50.parameter_rrefs(): the parameter RRefs of both shards, which
 * the seed hands to DistributedOptimizer, asked of each shard as the seed
 * does: p_rref.remote().parameter_rrefs().to_here() (the remote value holds
 * the RRefs; p_rref.rpc_sync().parameter_rrefs() gets the same in one round
 * trip). Each parameter is read back through its RRef and compared with the
 * weights w1 and w2. 0, or 1 after saying why.
 */
static int check_parameter_rrefs(tern_rref_t *p1_rref, tern_rref_t *p2_rref, const float *w1,
                                 const float *w2)
{
    tern_rref_t *const shards[2] = {p1_rref, p2_rref};
    const float *want[2] = {w1, w2};
    const int64_t shape[2][2] = {{IN, HIDDEN}, {HIDDEN, OUT}};
    size_t nparams = 0;
    int rc = 0;
    for (int k = 0; k < 2 && rc == 0; k++) {
        tern_future_t *f;
        tern_rref_t *v_rref;
        tern_status_t st =
            tern_rref_remote(shards[k], "parameter_rrefs", NULL, TERN_RPC_TIMEOUT_DEFAULT, &v_rref);
        if (st == TERN_OK) {
            st = tern_rref_to_here(v_rref, TERN_RPC_TIMEOUT_DEFAULT, &f);
            tern_rref_release(v_rref); /* the future holds RRefs of its own */
        }
        if (st != TERN_OK) {
            fprintf(stderr, "master: parameter_rrefs of shard %d: %s\n", k + 1, tern_last_error());
            return 1;
        }
        const tern_rpc_value_t *v = tern_future_value(f);
        for (size_t i = 0; i < v->nrrefs && rc == 0; i++) {
            tern_future_t *p;
            if (tern_rref_to_here(v->rrefs[i], TERN_RPC_TIMEOUT_DEFAULT, &p) != TERN_OK) {
                fprintf(stderr, "master: to_here of a parameter: %s\n", tern_last_error());
                rc = 1;
                break;
            }
            const tern_rpc_value_t *pv = tern_future_value(p);
            const tern_tensor_t *t = pv->ntensors == 1 ? &pv->tensors[0] : NULL;
            if (t == NULL || t->ndim != 2 || t->shape[0] != shape[k][0] ||
                t->shape[1] != shape[k][1] ||
                memcmp(t->data, want[k], sizeof(float) * (size_t)(shape[k][0] * shape[k][1]))) {
                fprintf(stderr, "master: parameter %zu of shard %d is not its weights\n", i, k + 1);
                rc = 1;
            } else {
                printf("master: shard %d parameter %zu: [%lld, %lld] on %s, as built\n", k + 1, i,
                       (long long)t->shape[0], (long long)t->shape[1],
                       WORKERS[tern_rref_owner(v->rrefs[i]) - 1]);
            }
            nparams++;
            tern_future_free(p);
        }
        /* Freeing the future releases its RRefs: the owners free the copies. */
        tern_future_free(f);
    }
    if (rc == 0 && nparams != 2) {
        fprintf(stderr, "master: %zu parameter RRefs, want 2\n", nparams);
        rc = 1;
    }
    return rc;
}

static int run_master(tern_ctx_t *ctx)
{
    shard_spec_t s1 = {IN, HIDDEN, SEED1}, s2 = {HIDDEN, OUT, SEED2};
    tern_rpc_args_t a1 = {.blob = &s1, .blob_len = sizeof(s1)};
    tern_rpc_args_t a2 = {.blob = &s2, .blob_len = sizeof(s2)};
    tern_rref_t *p1_rref = NULL, *p2_rref = NULL;
    static float w1[IN * HIDDEN], w2[HIDDEN * OUT];
    float xs[BATCH * IN], out[BATCH * OUT], hidden[BATCH * HIDDEN], ref[BATCH * OUT];
    int rc = 0;

    /* Put the first shard on worker1, the second on worker2. */
    if (tern_remote(ctx, WORKERS[0], "Shard1", &a1, TERN_RPC_TIMEOUT_DEFAULT, &p1_rref) !=
            TERN_OK ||
        tern_remote(ctx, WORKERS[1], "Shard2", &a2, TERN_RPC_TIMEOUT_DEFAULT, &p2_rref) !=
            TERN_OK) {
        fprintf(stderr, "master: creating the shards: %s\n", tern_last_error());
        tern_rref_release(p1_rref);
        return 1;
    }
    /* The same model, here, for the check. */
    for (int32_t i = 0; i < IN; i++)
        for (int32_t j = 0; j < HIDDEN; j++)
            w1[i * HIDDEN + j] = weight(SEED1, i, j);
    for (int32_t i = 0; i < HIDDEN; i++)
        for (int32_t j = 0; j < OUT; j++)
            w2[i * OUT + j] = weight(SEED2, i, j);

    for (int b = 0; b < NUM_BATCHES && rc == 0; b++) {
        printf("Processing batch %d\n", b);
        for (int32_t r = 0; r < BATCH; r++)
            for (int32_t c = 0; c < IN; c++)
                xs[r * IN + c] = 4 * weight(100u + (uint32_t)b, r, c); /* in [-1, 1) */
        uint64_t t0 = tern_clock_ns();
        if ((rc = forward(ctx, p1_rref, p2_rref, xs, out)) != 0)
            break;
        double ms = (double)(tern_clock_ns() - t0) / 1e6;
        linear(xs, w1, hidden, BATCH, IN, HIDDEN, 1);
        linear(hidden, w2, ref, BATCH, HIDDEN, OUT, 0);
        float err = 0;
        for (int i = 0; i < BATCH * OUT; i++)
            err = fmaxf(err, fabsf(out[i] - ref[i]));
        printf("output [%d, %d] from %d micro-batches of %d rows in %.2f ms, max error %.3g "
               "against the local model\n",
               BATCH, OUT, NSPLIT, MICRO, ms, err);
        if (!(err <= TOLERANCE)) {
            fprintf(stderr, "master: batch %d: error %g above %g\n", b, err, TOLERANCE);
            rc = 1;
        }
    }
    if (rc == 0)
        rc = check_parameter_rrefs(p1_rref, p2_rref, w1, w2);
    fflush(stdout);
    tern_rref_release(p1_rref);
    tern_rref_release(p2_rref);
    if (rc == 0)
        rc = wait_released(ctx);
    return rc;
}

int main(void)
{
    tern_ctx_t *ctx;
    tern_status_t st;
    int rc = 0;

    /* Every worker has the same classes and functions, registered first. */
    if (tern_rpc_register_class("Shard1", shard1_new, shard_free) != TERN_OK ||
        tern_rpc_register_class("Shard2", shard2_new, shard_free) != TERN_OK ||
        tern_rpc_register("Shard1.forward", shard_forward) != TERN_OK ||
        tern_rpc_register("Shard2.forward", shard_forward) != TERN_OK ||
        tern_rpc_register("Shard1.parameter_rrefs", shard_parameter_rrefs) != TERN_OK ||
        tern_rpc_register("Shard2.parameter_rrefs", shard_parameter_rrefs) != TERN_OK ||
        tern_rpc_register("owned_count", owned) != TERN_OK) {
        fprintf(stderr, "tern_rpc_register: %s\n", tern_last_error());
        return 1;
    }
    if ((st = tern_init(NULL, &ctx)) != TERN_OK) {
        fprintf(stderr, "tern_init: %s: %s\n", tern_strerror(st), tern_last_error());
        return 1;
    }
    unsigned rank = tern_ctx_rank(ctx), world = tern_ctx_world_size(ctx);
    if (world != 3) {
        if (rank == 0)
            fprintf(stderr, "tern-remote-objects: needs 3 ranks (tern-run -n 3 "
                            "tern-remote-objects)\n");
        tern_finalize(ctx);
        return 1;
    }
    char name[TERN_RPC_NAME_MAX + 1];
    if (rank == 0)
        snprintf(name, sizeof(name), "master");
    else
        snprintf(name, sizeof(name), "worker%u", rank);
    if ((st = tern_rpc_init(ctx, name, NULL)) != TERN_OK) {
        fprintf(stderr, "rank %u: tern_rpc_init: %s\n", rank, tern_last_error());
        tern_finalize(ctx);
        return 1;
    }
    if (rank == 0 && (rc = run_master(ctx)) != 0) {
        /* A graceful shutdown could wait for ever on what failed, and the
         * workers wait in theirs for the master: exit, and the launcher
         * stops them (tern-run stops a job when a rank fails). */
        fprintf(stderr, "master: failed; exiting without shutting down\n");
        return 1;
    }
    /* The workers only serve, until every worker is idle: rpc.shutdown(). */
    if ((st = tern_rpc_shutdown(ctx, 1)) != TERN_OK) {
        fprintf(stderr, "%s: tern_rpc_shutdown: %s\n", name, tern_last_error());
        rc = 1;
    }
    size_t left = tern_rpc_owned_count(ctx);
    printf("%s: owns %zu objects after shutdown\n", name, left);
    if (left != 0)
        rc = 1;
    if ((st = tern_finalize(ctx)) != TERN_OK) {
        fprintf(stderr, "%s: tern_finalize: %s\n", name, tern_last_error());
        rc = 1;
    }
    return rc;
}
