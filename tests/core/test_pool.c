/* The worker pool: queueing, draining, closing, limits, placement and binding,
 * and the topology report. No test depends on how long anything takes: where
 * one must wait for a moment (a task running, destroy begun) it polls a flag. */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <hwloc.h>

#include <tern/build_config.h>
#include <tern/pool.h>

#include "core/log.h"
#include "core/topology.h"

static void nap(void)
{
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
}

static void wait_flag(atomic_int *flag)
{
    while (!atomic_load(flag))
        nap();
}

static tern_pool_t *make_pool(const tern_pool_params_t *params)
{
    tern_pool_t *pool = NULL;
    tern_status_t st = tern_pool_create(params, &pool);
    if (st != TERN_OK)
        fail_msg("tern_pool_create: %s: %s", tern_strerror(st), tern_last_error());
    assert_non_null(pool);
    return pool;
}

/* ---- many tasks ---- */

static atomic_long counter;

static void count_task(void *arg)
{
    (void)arg;
    atomic_fetch_add(&counter, 1);
}

static void test_many_tasks(void **state)
{
    const long n = 100000;
    tern_pool_t *pool = make_pool(NULL);
    (void)state;
    atomic_store(&counter, 0);
    for (long i = 0; i < n; i++)
        assert_int_equal(tern_pool_submit(pool, count_task, NULL), TERN_OK);
    assert_int_equal(tern_pool_destroy(pool), TERN_OK);
    assert_int_equal(atomic_load(&counter), n);
}

/* ---- nested submit: a binary tree of tasks ---- */

#define TREE_DEPTH 12
#define TREE_NODES ((1 << TREE_DEPTH) - 1)

typedef struct tree {
    tern_pool_t *pool;
    atomic_int ran[TREE_NODES];
    atomic_int errors;
    struct tree_node {
        struct tree *tree;
        int index;
    } nodes[TREE_NODES];
} tree_t;

static void tree_task(void *arg)
{
    struct tree_node *node = arg;
    tree_t *t = node->tree;

    atomic_fetch_add(&t->ran[node->index], 1);
    if (!tern_pool_in_worker(t->pool))
        atomic_fetch_add(&t->errors, 1);
    for (int c = 2 * node->index + 1; c <= 2 * node->index + 2 && c < TREE_NODES; c++)
        if (tern_pool_submit(t->pool, tree_task, &t->nodes[c]) != TERN_OK)
            atomic_fetch_add(&t->errors, 1);
}

static void test_nested_submit(void **state)
{
    tree_t *t = calloc(1, sizeof(*t));
    (void)state;
    assert_non_null(t);
    for (int i = 0; i < TREE_NODES; i++)
        t->nodes[i] = (struct tree_node){t, i};
    t->pool = make_pool(NULL);
    assert_false(tern_pool_in_worker(t->pool));
    assert_int_equal(tern_pool_submit(t->pool, tree_task, &t->nodes[0]), TERN_OK);
    /* destroy may begin while the tree is still growing: its submits must land. */
    assert_int_equal(tern_pool_destroy(t->pool), TERN_OK);
    for (int i = 0; i < TREE_NODES; i++)
        assert_int_equal(atomic_load(&t->ran[i]), 1);
    assert_int_equal(atomic_load(&t->errors), 0);
    free(t);
}

/* ---- destroy drains, including tasks submitted during the drain ---- */

typedef struct drain {
    tern_pool_t *pool;
    atomic_int done, children, errors;
} drain_t;

static void drain_child(void *arg)
{
    drain_t *d = arg;
    nap();
    atomic_fetch_add(&d->children, 1);
}

static void drain_task(void *arg)
{
    drain_t *d = arg;

    /* Wait until destroy has begun, so the child below is submitted mid-drain. */
    while (!tern__pool_closing(d->pool))
        nap();
    nap();
    if (tern_pool_submit(d->pool, drain_child, d) != TERN_OK)
        atomic_fetch_add(&d->errors, 1);
    atomic_fetch_add(&d->done, 1);
}

static void test_destroy_drains(void **state)
{
    const int n = 64;
    tern_pool_params_t params = {.field_mask = TERN_POOL_PARAM_THREADS, .threads = 2};
    drain_t d = {0};
    (void)state;
    d.pool = make_pool(&params);
    for (int i = 0; i < n; i++)
        assert_int_equal(tern_pool_submit(d.pool, drain_task, &d), TERN_OK);
    assert_int_equal(tern_pool_destroy(d.pool), TERN_OK);
    assert_int_equal(atomic_load(&d.done), n);
    assert_int_equal(atomic_load(&d.children), n);
    assert_int_equal(atomic_load(&d.errors), 0);
}

/* ---- a blocker task: holds a worker until released ---- */

typedef struct blocker {
    tern_pool_t *pool;
    atomic_int started, release, child_status, child_ran, never_ran, queued_ran;
} blocker_t;

static void never_task(void *arg)
{
    blocker_t *b = arg;
    atomic_store(&b->never_ran, 1);
}

static void child_task(void *arg)
{
    blocker_t *b = arg;
    atomic_store(&b->child_ran, 1);
}

static void queued_task(void *arg)
{
    blocker_t *b = arg;
    atomic_fetch_add(&b->queued_ran, 1);
}

static void blocker_task(void *arg)
{
    blocker_t *b = arg;
    atomic_store(&b->started, 1);
    wait_flag(&b->release);
    atomic_store(&b->child_status, tern_pool_submit(b->pool, child_task, b));
}

typedef struct destroyer {
    tern_pool_t *pool;
    tern_status_t status;
} destroyer_t;

static void *destroy_thread(void *arg)
{
    destroyer_t *d = arg;
    d->status = tern_pool_destroy(d->pool);
    return NULL;
}

static void test_submit_after_destroy_began(void **state)
{
    tern_pool_params_t params = {.field_mask = TERN_POOL_PARAM_THREADS, .threads = 1};
    blocker_t b = {0};
    destroyer_t d = {0};
    pthread_t t;
    (void)state;
    b.pool = make_pool(&params);
    atomic_store(&b.child_status, 1);
    assert_int_equal(tern_pool_submit(b.pool, blocker_task, &b), TERN_OK);
    wait_flag(&b.started);

    /* The blocker keeps destroy from finishing, so the window stays open. */
    d.pool = b.pool;
    assert_int_equal(pthread_create(&t, NULL, destroy_thread, &d), 0);
    while (!tern__pool_closing(b.pool))
        nap();
    assert_int_equal(tern_pool_submit(b.pool, never_task, &b), TERN_ERR_CLOSED);
    assert_non_null(strstr(tern_last_error(), "destroyed"));

    atomic_store(&b.release, 1);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(d.status, TERN_OK);
    assert_int_equal(atomic_load(&b.child_status), TERN_OK);
    assert_int_equal(atomic_load(&b.child_ran), 1);
    assert_int_equal(atomic_load(&b.never_ran), 0);
}

static void test_queue_limit(void **state)
{
    tern_pool_params_t params = {.field_mask =
                                     TERN_POOL_PARAM_THREADS | TERN_POOL_PARAM_QUEUE_LIMIT,
                                 .threads = 1,
                                 .queue_limit = 2};
    blocker_t b = {0};
    (void)state;
    b.pool = make_pool(&params);
    assert_int_equal(tern_pool_submit(b.pool, blocker_task, &b), TERN_OK);
    /* Once it runs it no longer counts as waiting; two more fill the queue. */
    wait_flag(&b.started);
    assert_int_equal(tern_pool_submit(b.pool, queued_task, &b), TERN_OK);
    assert_int_equal(tern_pool_submit(b.pool, queued_task, &b), TERN_OK);
    assert_int_equal(tern_pool_submit(b.pool, never_task, &b), TERN_ERR_NO_RESOURCE);
    assert_non_null(strstr(tern_last_error(), "queue_limit"));
    atomic_store(&b.release, 1);
    assert_int_equal(tern_pool_destroy(b.pool), TERN_OK);
    assert_int_equal(atomic_load(&b.queued_ran), 2);
    assert_int_equal(atomic_load(&b.never_ran), 0);
    /* The blocker submitted while its single worker was busy with it and the
     * queue still held two: the limit binds a pool's own tasks too. */
    assert_int_equal(atomic_load(&b.child_status), TERN_ERR_NO_RESOURCE);
    assert_int_equal(atomic_load(&b.child_ran), 0);
}

/* ---- binding: every worker's real affinity lies in the reported set ---- */

#define MAX_WORKERS 64

typedef struct affinity {
    pthread_barrier_t barrier;
    atomic_int next, not_in_worker, wrong_rank;
    tern_pool_t *pool;
    cpu_set_t sets[MAX_WORKERS];
    int got[MAX_WORKERS];
} affinity_t;

static void affinity_task(void *arg)
{
    affinity_t *a = arg;
    int i;

    /* Every task waits for all the others, so each runs on a different worker. */
    pthread_barrier_wait(&a->barrier);
    i = atomic_fetch_add(&a->next, 1);
    a->got[i] = sched_getaffinity(0, sizeof(a->sets[i]), &a->sets[i]) == 0;
    if (!tern_pool_in_worker(a->pool))
        atomic_fetch_add(&a->not_in_worker, 1);
    if (tern__log_rank() != 7)
        atomic_fetch_add(&a->wrong_rank, 1);
}

static void test_binding(void **state)
{
    tern_pool_t *pool = make_pool(NULL);
    tern_pool_binding_t b;
    tern_pool_params_t params = {.field_mask = TERN_POOL_PARAM_THREADS | TERN_POOL_PARAM_LOG_RANK,
                                 .log_rank = 7};
    affinity_t *a = calloc(1, sizeof(*a));
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    unsigned n;
    (void)state;
    assert_non_null(a);
    assert_non_null(set);

    tern_pool_binding(pool, &b);
    assert_true(b.threads >= 1);
    assert_int_equal(b.threads, tern_pool_size(pool));
    assert_true(b.cores >= 1);
    assert_int_equal(b.threads, b.cores); /* the default: one thread per core */
    assert_true(b.cpus[0] != '\0');
    assert_true(b.summary[0] != '\0');
    assert_string_equal(b.device, "");
    assert_non_null(strstr(b.summary, "all cores"));
    print_message("binding: %s\n", b.summary);
    assert_int_equal(tern_pool_destroy(pool), TERN_OK);

    /* More threads than cores wrap round-robin over the cores. */
    n = b.cores * 2 + 1;
    if (n > MAX_WORKERS)
        n = MAX_WORKERS;
    params.threads = n;
    pool = make_pool(&params);
    a->pool = pool;
    assert_int_equal(tern_pool_size(pool), n);
    tern_pool_binding(pool, &b);
    assert_int_equal(b.threads, n);
    assert_true(b.cores >= 1);
    assert_int_equal(hwloc_bitmap_list_sscanf(set, b.cpus), 0);
    assert_false(hwloc_bitmap_iszero(set));
    if (!b.bound)
        print_message("note: binding failed here (%s); checking the process mask instead\n",
                      b.summary);
    else
        assert_non_null(strstr(b.summary, "bound to"));

    assert_int_equal(pthread_barrier_init(&a->barrier, NULL, n), 0);
    for (unsigned i = 0; i < n; i++)
        assert_int_equal(tern_pool_submit(pool, affinity_task, a), TERN_OK);
    assert_int_equal(tern_pool_destroy(pool), TERN_OK);
    pthread_barrier_destroy(&a->barrier);

    assert_int_equal(atomic_load(&a->next), (int)n);
    assert_int_equal(atomic_load(&a->not_in_worker), 0);
    assert_int_equal(atomic_load(&a->wrong_rank), 0);
    for (unsigned i = 0; i < n; i++) {
        int count = 0;
        assert_true(a->got[i]);
        for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
            if (!CPU_ISSET(cpu, &a->sets[i]))
                continue;
            count++;
            if (!hwloc_bitmap_isset(set, (unsigned)cpu))
                fail_msg("worker affinity includes PU %d, outside the reported set %s", cpu,
                         b.cpus);
        }
        assert_true(count >= 1);
    }
    hwloc_bitmap_free(set);
    free(a);
}

static void test_unbound(void **state)
{
    tern_pool_params_t params = {
        .field_mask = TERN_POOL_PARAM_BIND | TERN_POOL_PARAM_THREADS, .bind = 0, .threads = 3};
    tern_pool_t *pool = make_pool(&params);
    tern_pool_binding_t b;
    (void)state;
    tern_pool_binding(pool, &b);
    assert_int_equal(b.bound, 0);
    assert_int_equal(b.threads, 3);
    assert_int_equal(tern_pool_size(pool), 3);
    assert_non_null(strstr(b.summary, "unbound"));
    assert_int_equal(tern_pool_destroy(pool), TERN_OK);
}

/* ---- local ranks ---- */

static void binding_for(unsigned rank, unsigned size, tern_pool_binding_t *b)
{
    tern_pool_params_t params = {.field_mask = TERN_POOL_PARAM_LOCAL | TERN_POOL_PARAM_BIND,
                                 .local_rank = rank,
                                 .local_world_size = size,
                                 .bind = 0};
    tern_pool_t *pool = make_pool(&params);
    tern_pool_binding(pool, b);
    assert_int_equal(tern_pool_destroy(pool), TERN_OK);
}

static void test_local_slices(void **state)
{
    tern_pool_binding_t all, r0, r1, shared;
    hwloc_bitmap_t s0 = hwloc_bitmap_alloc(), s1 = hwloc_bitmap_alloc();
    tern_pool_params_t bad = {
        .field_mask = TERN_POOL_PARAM_LOCAL, .local_rank = 2, .local_world_size = 2};
    tern_pool_t *pool = NULL;
    (void)state;

    assert_int_equal(tern_pool_create(&bad, &pool), TERN_ERR_INVALID_PARAM);
    assert_null(pool);
    bad.local_rank = 0;
    bad.local_world_size = 0;
    assert_int_equal(tern_pool_create(&bad, &pool), TERN_ERR_INVALID_PARAM);

    binding_for(0, 1, &all);
    if (all.cores < 2) {
        print_message("skipped the disjoint-slice check: this process can use %u core\n",
                      all.cores);
    } else {
        binding_for(0, 2, &r0);
        binding_for(1, 2, &r1);
        print_message("rank 0: %s\nrank 1: %s\n", r0.summary, r1.summary);
        assert_int_equal(hwloc_bitmap_list_sscanf(s0, r0.cpus), 0);
        assert_int_equal(hwloc_bitmap_list_sscanf(s1, r1.cpus), 0);
        assert_false(hwloc_bitmap_iszero(s0));
        assert_false(hwloc_bitmap_iszero(s1));
        assert_false(hwloc_bitmap_intersects(s0, s1));
        assert_int_equal(r0.cores + r1.cores, all.cores);
        assert_int_equal(r0.threads, r0.cores);
        assert_non_null(strstr(r1.summary, "local rank 1 of 2"));
    }
    /* More ranks than cores: every rank shares the whole set. */
    binding_for(all.cores, all.cores + 1, &shared);
    assert_string_equal(shared.cpus, all.cpus);
    assert_non_null(strstr(shared.summary, "shared by"));
    assert_int_equal(shared.threads, 1); /* not a full pool per rank */
    hwloc_bitmap_free(s0);
    hwloc_bitmap_free(s1);
}

/* A process pinned by taskset or its launcher keeps its pool inside that pin. */
static void test_caller_affinity(void **state)
{
    cpu_set_t saved, one;
    tern_pool_binding_t b;
    tern_pool_t *pool = NULL;
    tern_status_t st;
    int last = -1;
    char want[16];
    (void)state;

    assert_int_equal(sched_getaffinity(0, sizeof(saved), &saved), 0);
    if (CPU_COUNT(&saved) < 2) {
        print_message("skipped: this thread may run on only one PU already\n");
        skip();
    }
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
        if (CPU_ISSET(cpu, &saved))
            last = cpu;
    CPU_ZERO(&one);
    CPU_SET(last, &one);
    assert_int_equal(sched_setaffinity(0, sizeof(one), &one), 0);
    st = tern_pool_create(NULL, &pool);
    if (st == TERN_OK) {
        tern_pool_binding(pool, &b);
        st = tern_pool_destroy(pool);
    }
    /* Pinned by its launcher, a local rank keeps the launcher's cores rather
     * than slicing them again. */
    tern_pool_params_t local = {.field_mask = TERN_POOL_PARAM_LOCAL, .local_rank = 1,
                                .local_world_size = 2};
    tern_pool_binding_t lb = {0};
    tern_status_t lst = tern_pool_create(&local, &pool);
    if (lst == TERN_OK) {
        tern_pool_binding(pool, &lb);
        lst = tern_pool_destroy(pool);
    }
    /* Unless another rank is pinned to the same cores (ranks bound to one
     * socket): then they share them, as unpinned local ranks share all. */
    tern_pool_params_t shared = {.field_mask = TERN_POOL_PARAM_LOCAL | TERN_POOL_PARAM_SHARE,
                                 .local_rank = 1,
                                 .local_world_size = 4,
                                 .share_rank = 1,
                                 .share_size = 2};
    tern_pool_binding_t sb = {0};
    tern_status_t sst = tern_pool_create(&shared, &pool);
    if (sst == TERN_OK) {
        tern_pool_binding(pool, &sb);
        sst = tern_pool_destroy(pool);
    }
    /* Restore before asserting, so a failure does not pin the tests after it. */
    assert_int_equal(sched_setaffinity(0, sizeof(saved), &saved), 0);
    assert_int_equal(st, TERN_OK);
    print_message("pinned to PU %d: %s\n", last, b.summary);
    snprintf(want, sizeof(want), "%d", last);
    assert_string_equal(b.cpus, want);
    assert_int_equal(b.threads, 1);
    assert_non_null(strstr(b.summary, "caller's affinity"));
    assert_int_equal(lst, TERN_OK);
    assert_string_equal(lb.cpus, want);
    assert_non_null(strstr(lb.summary, "cores given by the launcher"));
    assert_int_equal(sst, TERN_OK);
    print_message("pinned with another rank: %s\n", sb.summary);
    assert_string_equal(sb.cpus, want);
    assert_int_equal(sb.threads, 1);
    assert_non_null(strstr(sb.summary, "shared by 2 ranks on the launcher's cores"));
}

/* ---- devices ---- */

static void expect_no_device(const char *name)
{
    tern_pool_params_t params = {.field_mask = TERN_POOL_PARAM_DEVICE, .device = name};
    tern_pool_t *pool = NULL;
    assert_int_equal(tern_pool_create(&params, &pool), TERN_ERR_NO_DEVICE);
    assert_null(pool);
    assert_non_null(strstr(tern_last_error(), name));
}

static void test_unknown_device(void **state)
{
    (void)state;
    expect_no_device("nosuchdev0");
    expect_no_device("0000:fe:1f.7");
}

static void test_cuda_device(void **state)
{
    tern_pool_params_t params = {.field_mask = TERN_POOL_PARAM_DEVICE, .device = "cuda:0"};
    tern_pool_t *pool = NULL;
    tern_status_t st;
    (void)state;
    st = tern_pool_create(&params, &pool);
#if TERN_HAVE_CUDA
    /* A machine with a GPU finds it; one without (CI) says why not. */
    if (st == TERN_OK) {
        print_message("cuda:0 found\n");
        assert_int_equal(tern_pool_destroy(pool), TERN_OK);
        return;
    }
    assert_int_equal(st, TERN_ERR_NO_DEVICE);
#else
    assert_int_equal(st, TERN_ERR_UNSUPPORTED);
#endif
    assert_null(pool);
    assert_non_null(strstr(tern_last_error(), "cuda:0"));
    print_message("cuda:0: %s\n", tern_last_error());
    params.device = "cuda:x";
    st = tern_pool_create(&params, &pool);
    assert_true(st == TERN_ERR_INVALID_PARAM || st == TERN_ERR_UNSUPPORTED);
}

/* A device hwloc sees here, by OS name and by PCI bus id, when there is one. */
static void test_real_device(void **state)
{
    hwloc_topology_t topo;
    hwloc_obj_t obj = NULL, pci = NULL;
    char name[64] = "", busid[32], shortid[32];
    (void)state;

    assert_int_equal(tern__topology_load(&topo), TERN_OK);
    while ((obj = hwloc_get_next_osdev(topo, obj)) != NULL) {
        hwloc_obj_osdev_type_t t = obj->attr->osdev.type;
        if (t != HWLOC_OBJ_OSDEV_NETWORK && t != HWLOC_OBJ_OSDEV_OPENFABRICS &&
            t != HWLOC_OBJ_OSDEV_GPU)
            continue;
        if (obj->parent != NULL && obj->parent->type == HWLOC_OBJ_PCI_DEVICE) {
            pci = obj->parent;
            snprintf(name, sizeof(name), "%s", obj->name);
            snprintf(busid, sizeof(busid), "%04x:%02x:%02x.%x", (unsigned)pci->attr->pcidev.domain,
                     (unsigned)pci->attr->pcidev.bus, (unsigned)pci->attr->pcidev.dev,
                     (unsigned)pci->attr->pcidev.func);
            snprintf(shortid, sizeof(shortid), "%02x:%02x.%x", (unsigned)pci->attr->pcidev.bus,
                     (unsigned)pci->attr->pcidev.dev, (unsigned)pci->attr->pcidev.func);
            break;
        }
    }
    if (pci == NULL) {
        hwloc_topology_destroy(topo);
        print_message("skipped: hwloc sees no network or GPU device on a PCI bus here\n");
        skip();
    }
    const char *ids[] = {name, busid, pci->attr->pcidev.domain == 0 ? shortid : busid};
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        tern_pool_params_t params = {.field_mask = TERN_POOL_PARAM_DEVICE, .device = ids[i]};
        tern_pool_t *pool = make_pool(&params);
        tern_pool_binding_t b;
        char near[96];
        tern_pool_binding(pool, &b);
        print_message("%s: %s\n", ids[i], b.summary);
        assert_string_equal(b.device, ids[i]);
        snprintf(near, sizeof(near), "near %s", ids[i]);
        assert_non_null(strstr(b.summary, near));
        assert_true(b.cpus[0] != '\0');
        assert_int_equal(tern_pool_destroy(pool), TERN_OK);
    }
    hwloc_topology_destroy(topo);
}

/* ---- placement on a two-socket machine described in XML ----
 *
 * This machine has one NUMA node and no RDMA NIC or GPU, so the device and
 * NUMA logic is checked on a topology hwloc reads from XML instead:
 *   package 0 = NUMA 0: cores/PUs 0-3, GPU PCI 0000:18:00.0 ("card1")
 *   package 1 = NUMA 1: two L3s (PUs 4-5, 6-7); under the second one the NIC
 *     PCI 0000:3b:00.0 ("mlx5_0", "ib0")
 */

/* One element per line with every set spelled out: hwloc's minimal XML parser
 * (used when hwloc has no libxml2) reads only what hwloc itself writes. */
static void xml_obj(FILE *f, const char *type, int os_index, unsigned cpus, unsigned nodes,
                    const char *extra, int leaf)
{
    fprintf(f, "<object type=\"%s\"", type);
    if (os_index >= 0)
        fprintf(f, " os_index=\"%d\"", os_index);
    fprintf(f, " cpuset=\"0x%08x\" complete_cpuset=\"0x%08x\"", cpus, cpus);
    fprintf(f, " nodeset=\"0x%08x\" complete_nodeset=\"0x%08x\"%s%s>\n", nodes, nodes, extra,
            leaf ? "/" : "");
}

static void xml_core(FILE *f, int i, unsigned nodes)
{
    xml_obj(f, "Core", i, 1u << i, nodes, "", 0);
    xml_obj(f, "PU", i, 1u << i, nodes, "", 1);
    fputs("</object>\n", f);
}

static void xml_pci(FILE *f, const char *buses, const char *busid, const char *type,
                    const char *osdevs)
{
    fprintf(f, "<object type=\"Bridge\" bridge_type=\"0-1\" depth=\"0\" bridge_pci=\"%s\">\n",
            buses);
    fprintf(f,
            "<object type=\"PCIDev\" pci_busid=\"%s\" pci_type=\"%s\">\n%s</object>\n</object>\n",
            busid, type, osdevs);
}

static hwloc_topology_t two_socket_machine(unsigned allowed)
{
    static const char l3[] = " cache_size=\"33554432\" depth=\"3\" cache_linesize=\"64\""
                             " cache_associativity=\"16\" cache_type=\"0\"";
    static const char mem[] = " local_memory=\"1073741824\"";
    char *xml = NULL, extra[128];
    size_t len = 0;
    FILE *f = open_memstream(&xml, &len);
    hwloc_topology_t topo;

    assert_non_null(f);
    fputs("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
          "<!DOCTYPE topology SYSTEM \"hwloc2.dtd\">\n<topology version=\"2.0\">\n",
          f);
    snprintf(extra, sizeof(extra), " allowed_cpuset=\"0x%08x\" allowed_nodeset=\"0x00000003\"",
             allowed);
    xml_obj(f, "Machine", 0, 0xff, 0x3, extra, 0);
    xml_obj(f, "Package", 0, 0x0f, 0x1, "", 0);
    xml_obj(f, "NUMANode", 0, 0x0f, 0x1, mem, 1);
    for (int i = 0; i < 4; i++)
        xml_core(f, i, 0x1);
    xml_pci(f, "0000:[17-18]", "0000:18:00.0", "0302 [10de:2330] [10de:16c1] a1",
            "<object type=\"OSDev\" name=\"card1\" osdev_type=\"1\"/>\n");
    fputs("</object>\n", f);
    xml_obj(f, "Package", 1, 0xf0, 0x2, "", 0);
    xml_obj(f, "NUMANode", 1, 0xf0, 0x2, mem, 1);
    xml_obj(f, "L3Cache", -1, 0x30, 0x2, l3, 0);
    xml_core(f, 4, 0x2);
    xml_core(f, 5, 0x2);
    fputs("</object>\n", f);
    xml_obj(f, "L3Cache", -1, 0xc0, 0x2, l3, 0);
    xml_core(f, 6, 0x2);
    xml_core(f, 7, 0x2);
    xml_pci(f, "0000:[3a-3b]", "0000:3b:00.0", "0207 [15b3:1021] [15b3:0041] 00",
            "<object type=\"OSDev\" name=\"mlx5_0\" osdev_type=\"3\"/>\n"
            "<object type=\"OSDev\" name=\"ib0\" osdev_type=\"2\"/>\n");
    fputs("</object>\n</object>\n</object>\n</topology>\n", f);
    assert_int_equal(fclose(f), 0);

    assert_int_equal(hwloc_topology_init(&topo), 0);
    assert_int_equal(hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_ALL), 0);
    assert_int_equal(hwloc_topology_set_xmlbuffer(topo, xml, (int)len + 1), 0);
    assert_int_equal(hwloc_topology_load(topo), 0);
    free(xml);
    return topo;
}

/* The binding a pool with these settings would get on topo. */
static tern_status_t place_shared(hwloc_topology_t topo, const char *device, unsigned rank,
                                  unsigned size, unsigned share_rank, unsigned share_size,
                                  unsigned threads, tern__placement_t *pl)
{
    tern__pool_config_t cfg = {.threads = threads,
                               .device = device,
                               .bind = true,
                               .local_rank = rank,
                               .local_world_size = size,
                               .share_rank = share_rank,
                               .share_size = share_size,
                               .log_rank = -1};
    tern_status_t st = tern__placement_init(pl, topo, &cfg);
    if (st == TERN_OK)
        print_message("%s rank %u/%u: %s\n", device ? device : "-", rank, size,
                      pl->binding.summary);
    return st;
}

static tern_status_t place(hwloc_topology_t topo, const char *device, unsigned rank, unsigned size,
                           unsigned threads, tern__placement_t *pl)
{
    return place_shared(topo, device, rank, size, 0, 0, threads, pl);
}

static void expect_cpus(hwloc_topology_t topo, const char *device, unsigned rank, unsigned size,
                        const char *cpus, const char *numa)
{
    tern__placement_t pl;
    assert_int_equal(place(topo, device, rank, size, 0, &pl), TERN_OK);
    assert_string_equal(pl.binding.cpus, cpus);
    assert_string_equal(pl.binding.numa, numa);
    assert_int_equal(pl.binding.threads, pl.binding.cores);
    tern__placement_fini(&pl);
}

static void test_placement_two_sockets(void **state)
{
    hwloc_topology_t topo = two_socket_machine(0xff);
    tern__placement_t pl;
    char buf[32];
    (void)state;

    assert_int_equal(place(topo, NULL, 0, 1, 0, &pl), TERN_OK);
    assert_string_equal(pl.binding.cpus, "0-7");
    assert_string_equal(pl.binding.numa, "0-1");
    assert_int_equal(pl.binding.cores, 8);
    assert_int_equal(pl.binding.threads, 8);
    assert_string_equal(pl.binding.summary,
                        "8 threads bound to cores 0-7 (PUs 0-7, NUMA 0-1, all cores)");
    tern__placement_fini(&pl);

    /* The NIC hangs off the L3 of PUs 6-7; it gets all of its NUMA node. */
    assert_int_equal(place(topo, "mlx5_0", 0, 1, 0, &pl), TERN_OK);
    assert_string_equal(pl.binding.cpus, "4-7");
    assert_string_equal(pl.binding.numa, "1");
    assert_string_equal(pl.binding.device, "mlx5_0");
    assert_string_equal(pl.binding.summary,
                        "4 threads bound to cores 4-7 (PUs 4-7, NUMA 1, near mlx5_0)");
    tern__placement_fini(&pl);
    expect_cpus(topo, "ib0", 0, 1, "4-7", "1");
    expect_cpus(topo, "3b:00.0", 0, 1, "4-7", "1");
    expect_cpus(topo, "0000:3B:00.0", 0, 1, "4-7", "1");
    expect_cpus(topo, "0000:18:00.0", 0, 1, "0-3", "0");
    expect_cpus(topo, "card1", 0, 1, "0-3", "0");

    /* Local ranks slice the set into contiguous runs of cores. */
    expect_cpus(topo, "mlx5_0", 0, 2, "4-5", "1");
    expect_cpus(topo, "mlx5_0", 1, 2, "6-7", "1");
    expect_cpus(topo, NULL, 0, 3, "0-1", "0");
    expect_cpus(topo, NULL, 1, 3, "2-4", "0-1");
    expect_cpus(topo, NULL, 2, 3, "5-7", "1");
    expect_cpus(topo, NULL, 3, 4, "6-7", "1");
    assert_int_equal(place(topo, "mlx5_0", 5, 8, 0, &pl), TERN_OK);
    assert_string_equal(pl.binding.cpus, "4-7");
    assert_non_null(strstr(pl.binding.summary, "shared by 8 local ranks"));
    assert_int_equal(pl.binding.threads, 1);
    /* Sharing ranks start on different cores: rank 5 of 8 on 4 cores -> the 2nd. */
    hwloc_bitmap_list_snprintf(buf, sizeof(buf), tern__placement_thread_set(&pl, 0));
    assert_string_equal(buf, "5");
    tern__placement_fini(&pl);

    /* Three threads on a two-core slice wrap round-robin. */
    assert_int_equal(place(topo, "mlx5_0", 1, 2, 3, &pl), TERN_OK);
    assert_int_equal(pl.binding.threads, 3);
    assert_int_equal(pl.binding.cores, 2);
    for (unsigned i = 0; i < 3; i++) {
        hwloc_bitmap_list_snprintf(buf, sizeof(buf), tern__placement_thread_set(&pl, i));
        assert_string_equal(buf, i % 2 == 0 ? "6" : "7");
    }
    assert_non_null(strstr(pl.binding.summary, "local rank 1 of 2"));
    tern__placement_fini(&pl);

    /* Counted sharers replace the local ranks: the 3rd of the 4 ranks on
     * these cores takes the 3rd quarter, whatever its local rank. */
    assert_int_equal(place_shared(topo, NULL, 5, 8, 2, 4, 0, &pl), TERN_OK);
    assert_string_equal(pl.binding.cpus, "4-5");
    assert_non_null(strstr(pl.binding.summary, "local rank 2 of 4"));
    tern__placement_fini(&pl);
    assert_int_equal(place_shared(topo, NULL, 5, 8, 0, 1, 0, &pl), TERN_OK);
    assert_string_equal(pl.binding.cpus, "0-7");
    tern__placement_fini(&pl);

    assert_int_equal(place(topo, "0000:3b:00.1", 0, 1, 0, &pl), TERN_ERR_NO_DEVICE);
    assert_non_null(strstr(tern_last_error(), "0000:3b:00.1"));
    tern__placement_fini(&pl);
    assert_int_equal(place(topo, "3b:00.0x", 0, 1, 0, &pl), TERN_ERR_NO_DEVICE);
    assert_non_null(strstr(tern_last_error(), "3b:00.0x"));
    tern__placement_fini(&pl);
    hwloc_topology_destroy(topo);

    /* A launcher pinned this process away from the NIC: run anyway, say so. */
    topo = two_socket_machine(0x0f);
    assert_int_equal(place(topo, "mlx5_0", 0, 1, 0, &pl), TERN_OK);
    assert_string_equal(pl.binding.cpus, "0-3");
    assert_non_null(strstr(pl.binding.summary, "none near mlx5_0 allowed"));
    tern__placement_fini(&pl);
    hwloc_topology_destroy(topo);
}

static void test_report_two_sockets(void **state)
{
    hwloc_topology_t topo = two_socket_machine(0xff);
    tern__pool_config_t cfg = {.device = "mlx5_0", .bind = true, .local_world_size = 1};
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    (void)state;
    assert_non_null(f);
    assert_int_equal(tern__topology_report(f, topo, &cfg, 2), TERN_OK);
    fclose(f);
    print_message("%s", buf);
    assert_non_null(strstr(buf, "  2 packages, 2 NUMA nodes, 8 cores, 8 PUs;"));
    assert_non_null(strstr(buf, "  NUMA node 1: PUs 4-7, 1.0 GiB\n"));
    assert_non_null(strstr(buf, "    ib0, PCI 0000:3b:00.0, NUMA 1, local PUs 6-7\n"));
    assert_non_null(strstr(buf, "  OpenFabrics (RDMA) devices:\n"
                                "    mlx5_0, PCI 0000:3b:00.0, NUMA 1, local PUs 6-7\n"));
    assert_non_null(strstr(buf, "    PCI 0000:18:00.0 (class 0302, id 10de:2330, card1), NUMA 0, "
                                "local PUs 0-3\n"));
    assert_non_null(strstr(buf, "  rank 0: 2 threads bound to cores 4-5 (PUs 4-5, NUMA 1, "
                                "near mlx5_0, local rank 0 of 2)\n"));
    assert_non_null(strstr(buf, "  rank 1: 2 threads bound to cores 6-7 (PUs 6-7, NUMA 1, "
                                "near mlx5_0, local rank 1 of 2)\n"));
    free(buf);
    hwloc_topology_destroy(topo);
}

/* ---- destroy from a worker, NULLs and bad params ---- */

typedef struct self_destroy {
    tern_pool_t *pool;
    atomic_int status;
    atomic_int detail_ok;
} self_destroy_t;

static void self_destroy_task(void *arg)
{
    self_destroy_t *s = arg;
    atomic_store(&s->status, tern_pool_destroy(s->pool));
    atomic_store(&s->detail_ok, strstr(tern_last_error(), "own threads") != NULL);
}

static void test_destroy_from_worker(void **state)
{
    self_destroy_t s = {0};
    (void)state;
    s.pool = make_pool(NULL);
    atomic_store(&s.status, 1);
    assert_int_equal(tern_pool_submit(s.pool, self_destroy_task, &s), TERN_OK);
    assert_int_equal(tern_pool_destroy(s.pool), TERN_OK);
    assert_int_equal(atomic_load(&s.status), TERN_ERR_INVALID_PARAM);
    assert_true(atomic_load(&s.detail_ok));
}

static void test_null_and_bad_params(void **state)
{
    tern_pool_params_t params = {.field_mask = 1u << 20};
    tern_pool_t *pool = NULL;
    tern_pool_binding_t b;
    (void)state;
    assert_int_equal(tern_pool_destroy(NULL), TERN_OK);
    assert_int_equal(tern_pool_size(NULL), 0);
    assert_false(tern_pool_in_worker(NULL));
    memset(&b, 0xff, sizeof(b));
    tern_pool_binding(NULL, &b);
    assert_int_equal(b.threads, 0);
    assert_int_equal(tern_pool_submit(NULL, count_task, NULL), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_pool_create(NULL, NULL), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_pool_create(&params, &pool), TERN_ERR_INVALID_PARAM);
    assert_null(pool);
    params = (tern_pool_params_t){.field_mask = TERN_POOL_PARAM_THREADS, .threads = 100000};
    assert_int_equal(tern_pool_create(&params, &pool), TERN_ERR_INVALID_PARAM);
    params = (tern_pool_params_t){.field_mask = TERN_POOL_PARAM_SHARE, .share_rank = 2,
                                  .share_size = 2};
    assert_int_equal(tern_pool_create(&params, &pool), TERN_ERR_INVALID_PARAM);
    assert_non_null(strstr(tern_last_error(), "share_rank 2 of share_size 2"));
    params.share_rank = params.share_size = 0;
    assert_int_equal(tern_pool_create(&params, &pool), TERN_ERR_INVALID_PARAM);
    pool = make_pool(NULL);
    assert_int_equal(tern_pool_submit(pool, NULL, NULL), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_pool_destroy(pool), TERN_OK);
}

/* ---- the topology report ---- */

static void test_topology_print(void **state)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    tern_pool_params_t params = {.field_mask = TERN_POOL_PARAM_DEVICE, .device = "nosuchdev0"};
    (void)state;
    assert_non_null(f);
    assert_int_equal(tern_topology_print(f, NULL, 3), TERN_OK);
    fclose(f);
    print_message("%s", buf);
    assert_non_null(strstr(buf, "NUMA"));
    assert_non_null(strstr(buf, "hwloc"));
    assert_non_null(strstr(buf, "\n  rank 0: "));
    assert_non_null(strstr(buf, "\n  rank 1: "));
    assert_non_null(strstr(buf, "\n  rank 2: "));
    assert_null(strstr(buf, "\n  rank 3: "));
    free(buf);

    buf = NULL;
    f = open_memstream(&buf, &len);
    assert_non_null(f);
    assert_int_equal(tern_topology_print(f, &params, 1), TERN_ERR_NO_DEVICE);
    fclose(f);
    assert_non_null(strstr(buf, "nosuchdev0"));
    free(buf);
    assert_int_equal(tern_topology_print(NULL, NULL, 1), TERN_ERR_INVALID_PARAM);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_many_tasks),
        cmocka_unit_test(test_nested_submit),
        cmocka_unit_test(test_destroy_drains),
        cmocka_unit_test(test_submit_after_destroy_began),
        cmocka_unit_test(test_queue_limit),
        cmocka_unit_test(test_binding),
        cmocka_unit_test(test_unbound),
        cmocka_unit_test(test_local_slices),
        cmocka_unit_test(test_caller_affinity),
        cmocka_unit_test(test_unknown_device),
        cmocka_unit_test(test_cuda_device),
        cmocka_unit_test(test_real_device),
        cmocka_unit_test(test_placement_two_sockets),
        cmocka_unit_test(test_report_two_sockets),
        cmocka_unit_test(test_destroy_from_worker),
        cmocka_unit_test(test_null_and_bad_params),
        cmocka_unit_test(test_topology_print),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
