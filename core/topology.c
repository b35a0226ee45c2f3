/* Where the worker pool runs: parameters, device lookup, core sets, and the
 * topology report that tern-run --topology prints. */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tern/build_config.h>
#if TERN_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "core/error.h"
#include "core/log.h"
#include "core/topology.h"

#define KNOWN_FIELDS                                                                               \
    (TERN_POOL_PARAM_THREADS | TERN_POOL_PARAM_DEVICE | TERN_POOL_PARAM_BIND |                     \
     TERN_POOL_PARAM_LOCAL | TERN_POOL_PARAM_QUEUE_LIMIT | TERN_POOL_PARAM_LOG_RANK |             \
     TERN_POOL_PARAM_SHARE)

tern_status_t tern__pool_config_resolve(const tern_pool_params_t *params, tern__pool_config_t *cfg)
{
    uint64_t mask = params != NULL ? params->field_mask : 0;

    *cfg = (tern__pool_config_t){.bind = true, .local_world_size = 1, .log_rank = -1};
    /* A bit we do not know is a field this build cannot honour; silently
     * ignoring it would place the pool somewhere the caller did not ask for. */
    if (mask & ~(uint64_t)KNOWN_FIELDS)
        return tern__error(TERN_ERR_INVALID_PARAM, "pool params: unknown field_mask bits 0x%llx",
                           (unsigned long long)(mask & ~(uint64_t)KNOWN_FIELDS));
    if (mask & TERN_POOL_PARAM_THREADS) {
        if (params->threads > TERN__POOL_MAX_THREADS)
            return tern__error(TERN_ERR_INVALID_PARAM, "pool params: %u threads is more than %u",
                               params->threads, TERN__POOL_MAX_THREADS);
        cfg->threads = params->threads;
    }
    if ((mask & TERN_POOL_PARAM_DEVICE) && params->device != NULL && params->device[0] != '\0')
        cfg->device = params->device;
    if (mask & TERN_POOL_PARAM_BIND)
        cfg->bind = params->bind != 0;
    if (mask & TERN_POOL_PARAM_LOCAL) {
        if (params->local_world_size == 0)
            return tern__error(TERN_ERR_INVALID_PARAM, "pool params: local_world_size is 0");
        if (params->local_rank >= params->local_world_size)
            return tern__error(TERN_ERR_INVALID_PARAM,
                               "pool params: local_rank %u is not below local_world_size %u",
                               params->local_rank, params->local_world_size);
        cfg->local_rank = params->local_rank;
        cfg->local_world_size = params->local_world_size;
    }
    if (mask & TERN_POOL_PARAM_QUEUE_LIMIT)
        cfg->queue_limit = params->queue_limit;
    if (mask & TERN_POOL_PARAM_LOG_RANK)
        cfg->log_rank = params->log_rank;
    if (mask & TERN_POOL_PARAM_SHARE) {
        if (params->share_size == 0 || params->share_rank >= params->share_size)
            return tern__error(TERN_ERR_INVALID_PARAM,
                               "pool params: share_rank %u of share_size %u", params->share_rank,
                               params->share_size);
        cfg->share_rank = params->share_rank;
        cfg->share_size = params->share_size;
    }
    return TERN_OK;
}

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;

tern_status_t tern__topology_load(hwloc_topology_t *topo)
{
    static const char *const excluded[] = {"pci", "gl", "opencl"};
    hwloc_topology_t t = NULL;
    tern_status_t st = TERN_OK;

    *topo = NULL;
    if (hwloc_topology_init(&t) != 0)
        return tern__error_errno(TERN_ERR_IO, errno, "hwloc_topology_init");
    /* Without I/O objects hwloc cannot say which NUMA node a NIC or GPU is on. */
    if (hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT) != 0) {
        st = tern__error_errno(TERN_ERR_IO, errno, "hwloc_topology_set_io_types_filter");
        goto out_destroy;
    }
    /* Optional plugins we do without: "pci" (libpciaccess) leaks on every load,
     * and on Linux hwloc reads the same PCI tree from sysfs; "gl" connects to
     * the X server and "opencl" initializes the GPU drivers inside every process
     * that starts a pool. A build without one of them refuses its name (EINVAL),
     * which leaves nothing to exclude. */
    for (size_t i = 0; i < sizeof(excluded) / sizeof(excluded[0]); i++)
        if (hwloc_topology_set_components(t, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST,
                                          excluded[i]) != 0)
            tern_debug("hwloc: component %s not excluded: %m", excluded[i]);
    /* hwloc's discovery backends (libudev among them) keep unguarded globals:
     * contexts created on several threads at once must take turns. */
    pthread_mutex_lock(&load_lock);
    int rc = hwloc_topology_load(t), err = errno;
    pthread_mutex_unlock(&load_lock);
    if (rc != 0) {
        st = tern__error_errno(TERN_ERR_IO, err, "hwloc_topology_load");
        goto out_destroy;
    }
    *topo = t;
    return TERN_OK;

out_destroy:
    hwloc_topology_destroy(t);
    return st;
}

/* ---- device lookup ---- */

/* Reads 1..max_digits hex digits at p; NULL when there are none. */
static const char *hex_field(const char *p, unsigned max_digits, unsigned *v)
{
    unsigned n = 0;

    *v = 0;
    while (n < max_digits && isxdigit((unsigned char)p[n])) {
        int c = tolower((unsigned char)p[n]);
        *v = *v * 16 + (unsigned)(isdigit(c) ? c - '0' : c - 'a' + 10);
        n++;
    }
    return n == 0 ? NULL : p + n;
}

/* Strict "dddd:bb:dd.f" or "bb:dd.f" (hex, any case, nothing after); hwloc's
 * own parser accepts trailing junk, which would turn typos into lookups. */
static bool parse_busid(const char *s, unsigned *dom, unsigned *bus, unsigned *dev, unsigned *fn)
{
    unsigned a, b, c, d;
    const char *p = hex_field(s, 8, &a);

    if (p == NULL || *p != ':')
        return false;
    p = hex_field(p + 1, 2, &b);
    if (p == NULL)
        return false;
    if (*p == ':') {
        p = hex_field(p + 1, 2, &c);
        if (p == NULL || *p != '.')
            return false;
        p = hex_field(p + 1, 1, &d);
        *dom = a, *bus = b, *dev = c, *fn = d;
    } else if (*p == '.') {
        p = hex_field(p + 1, 1, &c);
        if (a > 0xff)
            return false;
        *dom = 0, *bus = a, *dev = b, *fn = c;
    } else {
        return false;
    }
    return p != NULL && *p == '\0' && *dev <= 0x1f && *fn <= 7;
}

static void format_busid(hwloc_obj_t pci, char *buf, size_t size)
{
    snprintf(buf, size, "%04x:%02x:%02x.%x", (unsigned)pci->attr->pcidev.domain,
             (unsigned)pci->attr->pcidev.bus, (unsigned)pci->attr->pcidev.dev,
             (unsigned)pci->attr->pcidev.func);
}

/* The PCI device an I/O object sits on (itself for a PCI device); NULL for
 * none, e.g. a virtual network interface. */
static hwloc_obj_t pci_of(hwloc_obj_t obj)
{
    for (; obj != NULL && obj->cpuset == NULL; obj = obj->parent)
        if (obj->type == HWLOC_OBJ_PCI_DEVICE)
            return obj;
    return NULL;
}

static tern_status_t find_pci(hwloc_topology_t topo, const char *name, const char *busid,
                              hwloc_obj_t *out)
{
    unsigned dom, bus, dev, fn;

    if (!parse_busid(busid, &dom, &bus, &dev, &fn))
        return tern__error(TERN_ERR_NO_DEVICE, "device '%s': '%s' is not a PCI bus id", name,
                           busid);
    *out = hwloc_get_pcidev_by_busid(topo, dom, bus, dev, fn);
    if (*out == NULL)
        return tern__error(TERN_ERR_NO_DEVICE,
                           "device '%s': no PCI device %04x:%02x:%02x.%x in the hwloc topology",
                           name, dom, bus, dev, fn);
    return TERN_OK;
}

static tern_status_t find_cuda(hwloc_topology_t topo, const char *name, hwloc_obj_t *out)
{
#if TERN_HAVE_CUDA
    const char *p = name + strlen("cuda:");
    char *end;
    char busid[64];
    long n;
    cudaError_t err;

    errno = 0;
    n = strtol(p, &end, 10);
    if (!isdigit((unsigned char)*p) || *end != '\0' || errno != 0 || n > INT_MAX)
        return tern__error(TERN_ERR_INVALID_PARAM, "device '%s': expected cuda:N, N a device index",
                           name);
    err = cudaDeviceGetPCIBusId(busid, (int)sizeof(busid), (int)n);
    if (err != cudaSuccess) {
        /* Clear the runtime's last error so the application's next
         * cudaGetLastError() does not report our probe. */
        (void)cudaGetLastError();
        return tern__error(TERN_ERR_NO_DEVICE, "device '%s': cudaDeviceGetPCIBusId: %s", name,
                           cudaGetErrorString(err));
    }
    return find_pci(topo, name, busid, out);
#else
    (void)topo;
    (void)out;
    return tern__error(TERN_ERR_UNSUPPORTED, "device '%s': tern was built without CUDA", name);
#endif
}

/* Resolves a PCI bus id, an OS device name or cuda:N to an hwloc I/O object. */
static tern_status_t find_device(hwloc_topology_t topo, const char *name, hwloc_obj_t *out)
{
    unsigned dom, bus, dev, fn;
    hwloc_obj_t obj = NULL;

    if (strncmp(name, "cuda:", strlen("cuda:")) == 0)
        return find_cuda(topo, name, out);
    if (parse_busid(name, &dom, &bus, &dev, &fn))
        return find_pci(topo, name, name, out);
    while ((obj = hwloc_get_next_osdev(topo, obj)) != NULL) {
        if (obj->name != NULL && strcmp(obj->name, name) == 0) {
            *out = obj;
            return TERN_OK;
        }
    }
    return tern__error(TERN_ERR_NO_DEVICE,
                       "device '%s' not found: not a PCI bus id, cuda:N, or an OS device hwloc "
                       "knows (tern-run --topology lists them)",
                       name);
}

/* The cores of the NUMA node(s) closest to an I/O object, into set. */
static void near_cpuset(hwloc_topology_t topo, hwloc_obj_t io, hwloc_bitmap_t set)
{
    hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(topo, io);
    hwloc_obj_t node = NULL;

    hwloc_bitmap_zero(set);
    if (anc == NULL)
        return;
    /* A device below a cache or a package sub-group is closest to every core of
     * the NUMA nodes there, not only to the cores under that object. */
    while (anc->nodeset != NULL &&
           (node = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, node)) != NULL) {
        if (hwloc_bitmap_isset(anc->nodeset, node->os_index) && node->cpuset != NULL)
            hwloc_bitmap_or(set, set, node->cpuset);
    }
    if (hwloc_bitmap_iszero(set) && anc->cpuset != NULL)
        hwloc_bitmap_copy(set, anc->cpuset);
}

/* ---- placement ---- */

static int list_snprintf(char *buf, size_t size, hwloc_const_bitmap_t set)
{
    int n = hwloc_bitmap_list_snprintf(buf, size, set);
    if (n < 0 && size > 0)
        buf[0] = '\0';
    return n;
}

/*
 * The PUs this process may use, into set: hwloc's allowed set (cgroups),
 * narrowed to the calling thread's affinity (taskset, numactl, a launcher's
 * --cpu-bind) as OpenMP runtimes do, so the pool never widens what the process
 * was given. Returns whether the affinity narrowed it. tmp is scratch.
 */
static bool usable_cpuset(hwloc_topology_t topo, hwloc_bitmap_t set, hwloc_bitmap_t tmp)
{
    hwloc_bitmap_copy(set, hwloc_topology_get_allowed_cpuset(topo));
    /* A topology read from XML describes another machine: our affinity means nothing there. */
    if (!hwloc_topology_is_thissystem(topo))
        return false;
    if (hwloc_get_cpubind(topo, tmp, HWLOC_CPUBIND_THREAD) != 0) {
        tern_debug("hwloc_get_cpubind: %m; using every allowed core");
        return false;
    }
    hwloc_bitmap_and(tmp, tmp, set);
    if (hwloc_bitmap_iszero(tmp) || hwloc_bitmap_isequal(tmp, set))
        return false;
    hwloc_bitmap_copy(set, tmp);
    return true;
}

tern_status_t tern__placement_init(tern__placement_t *pl, hwloc_topology_t topo,
                                   const tern__pool_config_t *cfg)
{
    hwloc_bitmap_t usable = NULL, base = NULL, near = NULL, nodes = NULL, core_ids = NULL;
    hwloc_obj_t *cores = NULL;
    hwloc_obj_type_t unit = HWLOC_OBJ_CORE;
    hwloc_obj_t obj = NULL;
    unsigned total = 0, lo, hi;
    bool pinned;
    tern_status_t st = TERN_OK;

    memset(pl, 0, sizeof(*pl));
    pl->topo = topo;
    pl->bind = cfg->bind;
    usable = hwloc_bitmap_alloc();
    base = hwloc_bitmap_alloc();
    near = hwloc_bitmap_alloc();
    pl->cpuset = hwloc_bitmap_alloc();
    nodes = hwloc_bitmap_alloc();
    core_ids = hwloc_bitmap_alloc();
    if (usable == NULL || base == NULL || near == NULL || pl->cpuset == NULL || nodes == NULL ||
        core_ids == NULL) {
        st = tern__error(TERN_ERR_NO_MEMORY, "placement: cannot allocate hwloc bitmaps");
        goto out;
    }
    pinned = usable_cpuset(topo, usable, near);
    snprintf(pl->where, sizeof(pl->where), "%s",
             pinned ? "all cores of the caller's affinity" : "all cores");
    hwloc_bitmap_copy(base, usable);

    if (cfg->device != NULL) {
        hwloc_obj_t dev = NULL;

        st = find_device(topo, cfg->device, &dev);
        if (st != TERN_OK)
            goto out;
        near_cpuset(topo, dev, near);
        hwloc_bitmap_and(near, near, usable);
        snprintf(pl->binding.device, sizeof(pl->binding.device), "%s", cfg->device);
        if (hwloc_bitmap_iszero(near)) {
            /* Running somewhere is better than refusing to start: the job may
             * have been pinned away from the device by its launcher. */
            tern_warn("no core near %s is allowed to this process; using %s", cfg->device,
                      pl->where);
            snprintf(pl->where + strlen(pl->where), sizeof(pl->where) - strlen(pl->where),
                     ", none near %s allowed", cfg->device);
        } else {
            hwloc_bitmap_copy(base, near);
            snprintf(pl->where, sizeof(pl->where), "near %s", cfg->device);
        }
    }

    /* Some virtual machines report PUs without cores; treat each PU as a core. */
    if (hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE) <= 0)
        unit = HWLOC_OBJ_PU;
    while ((obj = hwloc_get_next_obj_by_type(topo, unit, obj)) != NULL)
        total += hwloc_bitmap_intersects(obj->cpuset, base) ? 1 : 0;
    if (total == 0) {
        st = tern__error(TERN_ERR_IO, "placement: hwloc found no core in the chosen set");
        goto out;
    }
    cores = calloc(total, sizeof(*cores));
    if (cores == NULL) {
        st = tern__error(TERN_ERR_NO_MEMORY, "placement: cannot allocate %u cores", total);
        goto out;
    }
    total = 0;
    while ((obj = hwloc_get_next_obj_by_type(topo, unit, obj)) != NULL)
        if (hwloc_bitmap_intersects(obj->cpuset, base))
            cores[total++] = obj;

    lo = 0;
    hi = total;
    pl->threads = 0;
    /* The ranks that run on these same cores, and which of them this is.
     * Unpinned, every local rank does. A launcher that pinned the process
     * either gave each rank its own cores (srun --cpu-bind=cores, mpirun
     * --bind-to core: nobody else), or bound several to one socket or NUMA
     * node (mpirun's default past two ranks, srun --cpu-bind=sockets, numactl
     * --cpunodebind), whose full pools would all bind to the same cores.
     * share_size says which (tern_init counts through the store); without it
     * a pinned rank keeps its launcher's cores whole, since slicing a
     * core-per-rank binding again would leave cores idle. */
    unsigned nshare = cfg->share_size ? cfg->share_size : cfg->local_world_size;
    unsigned me = cfg->share_size ? cfg->share_rank : cfg->local_rank;
    const char *peers = pinned ? "ranks on the launcher's cores" : "local ranks";

    if (pinned && cfg->local_world_size > 1 && (cfg->share_size == 0 || nshare == 1)) {
        snprintf(pl->local, sizeof(pl->local), "cores given by the launcher");
    } else if (nshare > 1 && total >= nshare) {
        lo = (unsigned)((uint64_t)me * total / nshare);
        hi = (unsigned)(((uint64_t)me + 1) * total / nshare);
        if (pinned)
            snprintf(pl->local, sizeof(pl->local), "rank %u of %u on the launcher's cores", me,
                     nshare);
        else
            snprintf(pl->local, sizeof(pl->local), "local rank %u of %u", me, nshare);
    } else if (nshare > 1) {
        /* One thread each: a full pool per rank would oversubscribe the cores
         * nshare times over. Ranks start on different cores so they spread
         * over the set instead of piling onto its first core. */
        pl->threads = 1;
        pl->first = me % total;
        snprintf(pl->local, sizeof(pl->local), "shared by %u %s, first thread on its core %u",
                 nshare, peers, pl->first);
    }

    pl->core_sets = calloc(hi - lo, sizeof(*pl->core_sets));
    if (pl->core_sets == NULL) {
        st = tern__error(TERN_ERR_NO_MEMORY, "placement: cannot allocate %u core sets", hi - lo);
        goto out;
    }
    for (unsigned i = lo; i < hi; i++) {
        hwloc_bitmap_t s = hwloc_bitmap_alloc();
        if (s == NULL) {
            st = tern__error(TERN_ERR_NO_MEMORY, "placement: cannot allocate hwloc bitmaps");
            goto out;
        }
        hwloc_bitmap_and(s, cores[i]->cpuset, base);
        pl->core_sets[pl->ncores++] = s;
        hwloc_bitmap_or(pl->cpuset, pl->cpuset, s);
        hwloc_bitmap_set(core_ids, cores[i]->logical_index);
    }

    if (cfg->threads != 0)
        pl->threads = cfg->threads;
    else if (pl->threads == 0)
        pl->threads = pl->ncores;
    pl->binding.threads = pl->threads;
    pl->binding.cores = pl->ncores;
    list_snprintf(pl->binding.cpus, sizeof(pl->binding.cpus), pl->cpuset);
    list_snprintf(pl->core_list, sizeof(pl->core_list), core_ids);
    hwloc_cpuset_to_nodeset(topo, pl->cpuset, nodes);
    if (!hwloc_bitmap_iszero(nodes))
        list_snprintf(pl->binding.numa, sizeof(pl->binding.numa), nodes);
    tern__placement_summarize(pl, pl->bind);

out:
    free(cores);
    hwloc_bitmap_free(core_ids);
    hwloc_bitmap_free(nodes);
    hwloc_bitmap_free(near);
    hwloc_bitmap_free(base);
    hwloc_bitmap_free(usable);
    return st;
}

void tern__placement_fini(tern__placement_t *pl)
{
    for (unsigned i = 0; pl->core_sets != NULL && i < pl->ncores; i++)
        hwloc_bitmap_free(pl->core_sets[i]);
    free(pl->core_sets);
    pl->core_sets = NULL;
    pl->ncores = 0;
    hwloc_bitmap_free(pl->cpuset);
    pl->cpuset = NULL;
}

hwloc_const_cpuset_t tern__placement_thread_set(const tern__placement_t *pl, unsigned i)
{
    return pl->core_sets[(pl->first + i) % pl->ncores];
}

void tern__placement_summarize(tern__placement_t *pl, int bound)
{
    tern_pool_binding_t *b = &pl->binding;
    const char *how = bound ? "bound to" : pl->bind ? "on (binding failed)" : "unbound, on";
    int one_pu = hwloc_bitmap_weight(pl->cpuset) == 1;

    int n;

    b->bound = bound ? 1 : 0;
    n = snprintf(b->summary, sizeof(b->summary),
                 "%u thread%s %s core%s %s (PU%s %s, NUMA %s, %s%s%s)", b->threads,
                 b->threads == 1 ? "" : "s", how, b->cores == 1 ? "" : "s", pl->core_list,
                 one_pu ? "" : "s", b->cpus, b->numa[0] != '\0' ? b->numa : "unknown", pl->where,
                 pl->local[0] != '\0' ? ", " : "", pl->local);
    /* Only a very fragmented set overflows; show that the line was cut. */
    if (n >= (int)sizeof(b->summary))
        memcpy(b->summary + sizeof(b->summary) - 4, "...", 4);
}

/* ---- the report ---- */

static void print_size(FILE *out, uint64_t bytes)
{
    if (bytes >= (1ull << 30))
        fprintf(out, "%.1f GiB", (double)bytes / (double)(1ull << 30));
    else
        fprintf(out, "%llu MiB", (unsigned long long)(bytes >> 20));
}

/* ", NUMA <nodes>, local PUs <list>" of an I/O object. */
static void print_locality(FILE *out, hwloc_topology_t topo, hwloc_obj_t io)
{
    hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(topo, io);
    char buf[256];

    if (anc == NULL || anc->nodeset == NULL || anc->cpuset == NULL)
        return;
    list_snprintf(buf, sizeof(buf), anc->nodeset);
    fprintf(out, ", NUMA %s", buf);
    list_snprintf(buf, sizeof(buf), anc->cpuset);
    fprintf(out, ", local PUs %s", buf);
}

static bool is_gpu_class(hwloc_obj_t pci)
{
    unsigned cls = pci->attr->pcidev.class_id >> 8;
    return cls == 0x03 || cls == 0x12; /* display controller, processing accelerator */
}

/* One line per OS device of type t1 or t2 ("<name> (<subtype>), PCI <busid>,
 * NUMA <nodes>, local PUs <list>"); skip_gpu_pci leaves out those already
 * listed under their GPU's PCI device. Returns how many it printed. */
static int print_osdevs(FILE *out, hwloc_topology_t topo, hwloc_obj_osdev_type_t t1,
                        hwloc_obj_osdev_type_t t2, bool skip_gpu_pci)
{
    hwloc_obj_t obj = NULL;
    int found = 0;
    char buf[32];

    while ((obj = hwloc_get_next_osdev(topo, obj)) != NULL) {
        hwloc_obj_t pci = pci_of(obj);

        if (obj->attr->osdev.type != t1 && obj->attr->osdev.type != t2)
            continue;
        if (skip_gpu_pci && pci != NULL && is_gpu_class(pci))
            continue;
        found++;
        fprintf(out, "    %s", obj->name != NULL ? obj->name : "?");
        if (obj->subtype != NULL)
            fprintf(out, " (%s)", obj->subtype);
        if (pci != NULL) {
            format_busid(pci, buf, sizeof(buf));
            fprintf(out, ", PCI %s", buf);
        }
        print_locality(out, topo, obj);
        fprintf(out, "\n");
    }
    return found;
}

/* GPUs by their PCI device, which is there even when no GPU plugin named an OS
 * device for them (cuda:N resolves through the PCI bus id), then any other GPU
 * or coprocessor OS device. */
static int print_gpus(FILE *out, hwloc_topology_t topo)
{
    hwloc_obj_t pci = NULL;
    int found = 0;
    char buf[32];

    while ((pci = hwloc_get_next_pcidev(topo, pci)) != NULL) {
        if (!is_gpu_class(pci))
            continue;
        found++;
        format_busid(pci, buf, sizeof(buf));
        fprintf(out, "    PCI %s (class %04x, id %04x:%04x", buf,
                (unsigned)pci->attr->pcidev.class_id, (unsigned)pci->attr->pcidev.vendor_id,
                (unsigned)pci->attr->pcidev.device_id);
        for (hwloc_obj_t c = pci->io_first_child; c != NULL; c = c->next_sibling)
            if (c->type == HWLOC_OBJ_OS_DEVICE && c->name != NULL)
                fprintf(out, ", %s", c->name);
        fprintf(out, ")");
        print_locality(out, topo, pci);
        fprintf(out, "\n");
    }
    return found + print_osdevs(out, topo, HWLOC_OBJ_OSDEV_GPU, HWLOC_OBJ_OSDEV_COPROC, true);
}

static void print_machine(FILE *out, hwloc_topology_t topo)
{
    hwloc_obj_t root = hwloc_get_root_obj(topo), obj = NULL;
    const char *ver = hwloc_obj_get_info_by_name(root, "hwlocVersion");
    const char *host = hwloc_obj_get_info_by_name(root, "HostName");
    const char *os = hwloc_obj_get_info_by_name(root, "OSName");
    const char *arch = hwloc_obj_get_info_by_name(root, "Architecture");
    int npkg = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
    int nnuma = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
    char buf[256];

    unsigned api = hwloc_get_api_version();

    /* Infos are absent from topologies read from XML; print only what is known. */
    fprintf(out, "machine%s%s%s%s%s%s, hwloc %s%s(API %u.%u.%u)\n", host ? " " : "",
            host ? host : "", os ? ", " : "", os ? os : "", arch ? " " : "", arch ? arch : "",
            ver ? ver : "", ver ? " " : "", api >> 16, (api >> 8) & 0xff, api & 0xff);
    list_snprintf(buf, sizeof(buf), hwloc_topology_get_allowed_cpuset(topo));
    fprintf(out,
            "  %d package%s, %d NUMA node%s, %d cores, %d PUs; PUs allowed to this process: %s\n",
            npkg, npkg == 1 ? "" : "s", nnuma, nnuma == 1 ? "" : "s",
            hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE),
            hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU), buf);
    while ((obj = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_PACKAGE, obj)) != NULL) {
        list_snprintf(buf, sizeof(buf), obj->cpuset);
        fprintf(out, "  package %u: %d cores, PUs %s\n", obj->os_index,
                hwloc_get_nbobjs_inside_cpuset_by_type(topo, obj->cpuset, HWLOC_OBJ_CORE), buf);
    }
    while ((obj = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, obj)) != NULL) {
        list_snprintf(buf, sizeof(buf), obj->cpuset);
        fprintf(out, "  NUMA node %u: PUs %s, ", obj->os_index, buf[0] != '\0' ? buf : "none");
        print_size(out, obj->attr->numanode.local_memory);
        fprintf(out, "\n");
    }
    fprintf(out, "  network devices:\n");
    if (print_osdevs(out, topo, HWLOC_OBJ_OSDEV_NETWORK, HWLOC_OBJ_OSDEV_NETWORK, false) == 0)
        fprintf(out, "    none found\n");
    fprintf(out, "  OpenFabrics (RDMA) devices:\n");
    if (print_osdevs(out, topo, HWLOC_OBJ_OSDEV_OPENFABRICS, HWLOC_OBJ_OSDEV_OPENFABRICS, false) ==
        0)
        fprintf(out, "    none found\n");
    fprintf(out, "  GPUs and coprocessors:\n");
    if (print_gpus(out, topo) == 0)
        fprintf(out, "    none found\n");
}

tern_status_t tern__topology_report(FILE *out, hwloc_topology_t topo,
                                    const tern__pool_config_t *cfg, unsigned local_world_size)
{
    tern__pool_config_t rank_cfg = *cfg;
    tern_status_t st = TERN_OK;

    print_machine(out, topo);
    fprintf(out, "worker pool placement for %u local rank%s%s%s:\n", local_world_size,
            local_world_size == 1 ? "" : "s", cfg->device != NULL ? ", device " : "",
            cfg->device != NULL ? cfg->device : "");
    rank_cfg.local_world_size = local_world_size;
    for (unsigned r = 0; r < local_world_size; r++) {
        tern__placement_t pl;

        rank_cfg.local_rank = r;
        st = tern__placement_init(&pl, topo, &rank_cfg);
        fprintf(out, "  rank %u: %s\n", r, st == TERN_OK ? pl.binding.summary : tern_last_error());
        tern__placement_fini(&pl);
        if (st != TERN_OK)
            break;
    }
    return st;
}

tern_status_t tern_topology_print(FILE *out, const tern_pool_params_t *params,
                                  unsigned local_world_size)
{
    hwloc_topology_t topo = NULL;
    tern__pool_config_t cfg;
    tern_status_t st;

    if (out == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_topology_print: out is NULL");
    st = tern__pool_config_resolve(params, &cfg);
    if (st != TERN_OK)
        return st;
    /* 0 ranks would print no placement at all; show the one a lone process gets. */
    if (local_world_size == 0)
        local_world_size = 1;
    st = tern__topology_load(&topo);
    if (st != TERN_OK)
        return st;
    st = tern__topology_report(out, topo, &cfg, local_world_size);
    hwloc_topology_destroy(topo);
    return st;
}
